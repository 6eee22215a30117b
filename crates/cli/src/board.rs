//! The live stats of `--stats` (and the demo) on stderr. On a terminal: one table, redrawn in
//! place every tick, a heading per side with its link state and a row per stream; log lines
//! are printed above it (the table is erased, the line written, the table drawn again), so the
//! table stays at the bottom and nothing scrolls away. Otherwise (a file, a pipe, journald):
//! plain aligned lines, only for streams that moved (an idle stream gets a line now and then,
//! see [`crate::stats::IDLE_LINE_EVERY`]).
//!
//! Both sides of the demo run in one process and share the one table.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::sync::{Mutex, OnceLock};

/// What one side shows: a heading (side, link state, peer) and its streams' rows.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Panel {
    pub heading: String,
    pub rows: Vec<String>,
}

/// The table's state: the panels by side, and how many lines of it are on the screen.
#[derive(Debug, Default)]
pub struct Board {
    panels: BTreeMap<String, Panel>,
    drawn: usize,
}

/// Erase the `n` lines above the cursor (the table as last drawn) and everything below.
fn erase(out: &mut Vec<u8>, n: usize) {
    if n > 0 {
        let _ = write!(out, "\r\x1b[{n}A\x1b[J");
    }
}

impl Board {
    /// On a terminal: set `side`'s panel and redraw the table in place.
    pub fn show(&mut self, side: &str, panel: Panel) -> Vec<u8> {
        self.panels.insert(side.to_string(), panel);
        let mut out = Vec::new();
        erase(&mut out, self.drawn);
        self.draw(&mut out);
        out
    }

    /// A log line (or several) printed above the table, which is drawn again below it.
    pub fn above(&mut self, text: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        if self.drawn == 0 {
            out.extend_from_slice(text);
            return out;
        }
        erase(&mut out, self.drawn);
        out.extend_from_slice(text);
        if !text.ends_with(b"\n") {
            out.push(b'\n');
        }
        self.draw(&mut out);
        out
    }

    /// The side stopped: its last panel stays on the screen; later output goes below the table
    /// once no side is left.
    pub fn leave(&mut self, side: &str) {
        self.panels.remove(side);
        if self.panels.is_empty() {
            self.drawn = 0;
        }
    }

    /// Rows are not wrapped (auto-wrap off while drawing: a long row is cut at the terminal's
    /// edge) so the line count to erase next time is exact.
    fn draw(&mut self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"\x1b[?7l");
        let mut lines = 0;
        for p in self.panels.values() {
            let _ = writeln!(out, "\x1b[1m{}\x1b[0m", p.heading);
            lines += 1;
            for r in &p.rows {
                let _ = writeln!(out, "  {r}");
                lines += 1;
            }
        }
        out.extend_from_slice(b"\x1b[?7h");
        self.drawn = lines;
    }
}

fn board() -> &'static Mutex<Board> {
    static BOARD: OnceLock<Mutex<Board>> = OnceLock::new();
    BOARD.get_or_init(Default::default)
}

/// Is stderr a terminal (the table is drawn in place)?
pub fn live_table() -> bool {
    static TTY: OnceLock<bool> = OnceLock::new();
    *TTY.get_or_init(|| std::io::stderr().is_terminal())
}

fn emit(bytes: &[u8]) {
    let mut e = std::io::stderr().lock();
    let _ = e.write_all(bytes);
    let _ = e.flush();
}

/// Show one side's panel: redrawn in place on a terminal; otherwise its rows as plain lines
/// (the caller passes only the rows of streams that are due a line).
pub fn show(side: &str, panel: Panel) {
    if live_table() {
        let out = board()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .show(side, panel);
        emit(&out);
    } else {
        let mut out = String::new();
        for r in panel.rows {
            out.push_str(&r);
            out.push('\n');
        }
        emit(out.as_bytes());
    }
}

/// The side's run is over: its table stays as it was last drawn.
pub fn leave(side: &str) {
    board()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .leave(side);
}

/// Where log lines go: stderr, above the live table when there is one.
#[derive(Debug, Clone, Copy, Default)]
pub struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if live_table() {
            let out = board().lock().unwrap_or_else(|p| p.into_inner()).above(buf);
            emit(&out);
        } else {
            emit(buf);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogWriter {
    type Writer = LogWriter;
    fn make_writer(&'a self) -> LogWriter {
        LogWriter
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn panel(h: &str, rows: &[&str]) -> Panel {
        Panel {
            heading: h.into(),
            rows: rows.iter().map(|r| r.to_string()).collect(),
        }
    }

    fn text(b: &[u8]) -> String {
        String::from_utf8(b.to_vec()).expect("utf-8")
    }

    #[test]
    fn the_table_is_redrawn_over_itself() {
        let mut b = Board::default();
        let first = text(&b.show("app", panel("[app] link up", &["a", "b"])));
        assert!(
            !first.contains("\x1b[3A"),
            "nothing to erase yet: {first:?}"
        );
        assert!(
            first.contains("[app] link up\x1b[0m\n  a\n  b\n"),
            "{first:?}"
        );
        // Three lines on screen: the next draw goes up three and clears below first.
        let second = text(&b.show("device", panel("[device] link up", &["c"])));
        assert!(second.starts_with("\r\x1b[3A\x1b[J"), "{second:?}");
        // Both sides, in side order, five lines now.
        let a = second.find("[app]").expect("app panel");
        let d = second.find("[device]").expect("device panel");
        assert!(a < d, "{second:?}");
        let third = text(&b.show("app", panel("[app] link down", &["a", "b"])));
        assert!(third.starts_with("\r\x1b[5A\x1b[J"), "{third:?}");
        assert!(
            !third.contains("link up\x1b[0m\n  a"),
            "replaced: {third:?}"
        );
    }

    #[test]
    fn log_lines_go_above_the_table() {
        let mut b = Board::default();
        // No table yet: the line as it is.
        assert_eq!(text(&b.above(b"ndd: hello\n")), "ndd: hello\n");
        b.show("app", panel("[app] link up", &["a"]));
        let out = text(&b.above(b"ndd [app]: link lost"));
        // Erase the two table lines, the log line (newline added), the table again.
        assert!(
            out.starts_with("\r\x1b[2A\x1b[Jndd [app]: link lost\n"),
            "{out:?}"
        );
        assert!(out.ends_with("  a\n\x1b[?7h"), "{out:?}");
        // After the last side leaves, output goes below the table it left.
        b.leave("app");
        assert_eq!(text(&b.above(b"bye\n")), "bye\n");
    }
}

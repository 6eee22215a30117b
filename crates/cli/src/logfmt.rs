//! How `ndd` writes its log lines: `ndd [side]: message key=value`, plain text unless stderr
//! is a terminal (no colour escapes in files), the level named only when it is not a plain
//! note or warning. Messages come from `tracing` events anywhere in the workspace; a `side`
//! field becomes the bracketed prefix, so both sides of the demo stay apart; inside a `peer`
//! span (a listener serving several peers) the peer's name follows the side.

use std::fmt::{self, Write as _};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::FormattedFields;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

thread_local! {
    /// The driver this thread runs, under `ndd serve` (its lines say it).
    static DRIVER: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Names the driver the calling thread runs (`ndd serve` runs each on threads of its own):
/// its log lines start `ndd [NAME side]:`.
pub fn set_thread_driver(name: Option<&str>) {
    DRIVER.with(|d| *d.borrow_mut() = name.map(str::to_string));
}

/// The event formatter.
#[derive(Debug, Default)]
pub struct Compact;

#[derive(Default)]
struct Fields {
    side: Option<String>,
    message: String,
    rest: String,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "side" => self.side = Some(value.to_string()),
            "message" => self.message.push_str(value),
            name => {
                let _ = write!(self.rest, " {name}={value}");
            }
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        match field.name() {
            "side" => self.side = Some(format!("{value:?}")),
            "message" => {
                let _ = write!(self.message, "{value:?}");
            }
            name => {
                let _ = write!(self.rest, " {name}={value:?}");
            }
        }
    }
}

impl<S, N> FormatEvent<S, N> for Compact
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut f = Fields::default();
        event.record(&mut f);
        let meta = event.metadata();
        write!(writer, "ndd")?;
        // `ndd serve` runs each driver on threads of its own: its name goes first.
        let driver = DRIVER.with(|d| d.borrow().clone());
        // A listener serving several peers runs each peer's side in a `peer` span.
        let peer = ctx.event_scope().and_then(|scope| {
            scope
                .from_root()
                .find(|s| s.name() == "peer")
                .and_then(|s| {
                    let ext = s.extensions();
                    let fields = ext.get::<FormattedFields<N>>()?;
                    let v = fields.fields.split_once("name=")?.1;
                    Some(v.split_whitespace().next().unwrap_or(v).to_string())
                })
        });
        if let (Some(p), Some(side)) = (&peer, f.side.as_mut()) {
            side.push(' ');
            side.push_str(p);
        }
        match (&driver, &f.side) {
            (Some(d), Some(side)) => write!(writer, " [{d} {side}]")?,
            (Some(d), None) => write!(writer, " [{d}]")?,
            (None, Some(side)) => write!(writer, " [{side}]")?,
            (None, None) => {}
        }
        write!(writer, ": ")?;
        match *meta.level() {
            Level::ERROR => write!(writer, "error: ")?,
            Level::INFO | Level::WARN => {}
            l => write!(writer, "{l} {}: ", meta.target())?,
        }
        writeln!(writer, "{}{}", f.message, f.rest)
    }
}

/// An error and its causes on one line, each cause once: a cause already in the text is
/// left out, and a cause that repeats the one before it and adds to it replaces it (a typed
/// error often shows its source in its own message too).
pub fn error_text(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in e.chain() {
        let t = cause.to_string();
        if t.is_empty() || parts.iter().any(|p| p.contains(&t)) {
            continue;
        }
        match parts.last_mut() {
            Some(last) if t.contains(last.as_str()) => *last = t,
            _ => parts.push(t),
        }
    }
    // A cause may carry a server's or a peer's words (a JetStream error's description):
    // nothing that steers the terminal gets through.
    ndd_wire::text::terminal_safe(&parts.join(": "))
}

#[cfg(test)]
mod error_text_tests {
    use super::error_text;
    use anyhow::Context;

    /// Shows its source in its own message, and gives it as its source too.
    #[derive(Debug)]
    struct Bind {
        addr: &'static str,
        source: std::io::Error,
    }

    impl std::fmt::Display for Bind {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "cannot listen on {}: {}", self.addr, self.source)
        }
    }

    impl std::error::Error for Bind {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.source)
        }
    }

    #[test]
    fn a_cause_carrying_escape_codes_is_shown_escaped_its_lines_kept() {
        let e = anyhow::anyhow!("stream not found\x1b[2J\x1b[31m\u{202e}")
            .context("JetStream stream NDD_x\ttwo\nlines");
        assert_eq!(
            error_text(&e),
            "JetStream stream NDD_x\ttwo\nlines: stream not found\\u{1b}[2J\\u{1b}[31m\\u{202e}"
        );
    }

    #[test]
    fn each_cause_appears_once() {
        let io = || std::io::Error::new(std::io::ErrorKind::AddrNotAvailable, "no such address");
        let e = Err::<(), _>(Bind {
            addr: "1.2.3.4:99",
            source: io(),
        })
        .context("cannot listen on 1.2.3.4:99")
        .unwrap_err();
        assert_eq!(
            format!("{e:#}"),
            "cannot listen on 1.2.3.4:99: cannot listen on 1.2.3.4:99: no such address: no such address"
        );
        assert_eq!(
            error_text(&e),
            "cannot listen on 1.2.3.4:99: no such address"
        );
        let e = Err::<(), _>(io())
            .context("reading x")
            .context("loading y")
            .unwrap_err();
        assert_eq!(error_text(&e), "loading y: reading x: no such address");
    }
}

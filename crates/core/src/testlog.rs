//! [`Captured`]: the log lines a piece of code writes, kept for a test to count (built with
//! the `test-log` feature, which the crates' dev-dependencies turn on; never in the binary).
//!
//! A test that floods a half, a listener or a sink with bad input must show that the log
//! stays bounded and that what was held back is counted: it runs that code under a
//! [`Captured`] and counts the lines. A line is `LEVEL message key=value…`, INFO and above
//! (what `ndd` prints by default). Capture is per thread ([`Captured::start`]): tests running
//! beside each other do not see each other's lines; [`Captured::global`] takes every thread's.

use std::fmt::{self, Write as _};
use std::sync::{Arc, Mutex, PoisonError};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// The lines logged on one thread while its guard lives.
#[derive(Debug, Clone, Default)]
pub struct Captured {
    lines: Arc<Mutex<Vec<String>>>,
}

impl Captured {
    /// Captures what this thread logs until the guard is dropped (async code run by a
    /// current-thread runtime on this thread is captured too).
    pub fn start() -> (Captured, tracing::subscriber::DefaultGuard) {
        let c = Captured::default();
        let guard = tracing::subscriber::set_default(Capture(c.lines.clone()));
        (c, guard)
    }

    /// Captures what every thread logs from now on, for the rest of the process (a test
    /// binary whose code under test logs from threads it starts); every call returns the same
    /// capture. Lines of other tests of the binary come in too: look for your own.
    pub fn global() -> Captured {
        static GLOBAL: std::sync::OnceLock<Captured> = std::sync::OnceLock::new();
        GLOBAL
            .get_or_init(|| {
                let c = Captured::default();
                tracing::subscriber::set_global_default(Capture(c.lines.clone()))
                    .expect("no other global subscriber in this test binary");
                c
            })
            .clone()
    }

    /// Runs `f` with its lines captured.
    pub fn run<R>(f: impl FnOnce() -> R) -> (R, Captured) {
        let (c, guard) = Captured::start();
        let r = f();
        drop(guard);
        (r, c)
    }

    /// Every line so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The lines that contain `needle`.
    pub fn matching(&self, needle: &str) -> Vec<String> {
        self.lines()
            .into_iter()
            .filter(|l| l.contains(needle))
            .collect()
    }

    /// The sum of the `suppressed=N` fields of the lines that contain `needle`.
    pub fn suppressed(&self, needle: &str) -> u64 {
        self.matching(needle)
            .iter()
            .filter_map(|l| count_of(l))
            .sum()
    }

    /// Whether a line that contains `needle` says it held others back (`suppressed=N`, N > 0):
    /// what a flood test waits for.
    pub fn counted(&self, needle: &str) -> bool {
        self.matching(needle)
            .iter()
            .any(|l| count_of(l).is_some_and(|n| n > 0))
    }
}

/// The `suppressed=N` field of a line.
fn count_of(line: &str) -> Option<u64> {
    let (_, rest) = line.split_once("suppressed=")?;
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse::<u64>()
        .ok()
}

struct Capture(Arc<Mutex<Vec<String>>>);

struct Line(String);

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, " {value:?}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            let _ = write!(self.0, " {value}");
        } else {
            let _ = write!(self.0, " {}={value}", field.name());
        }
    }
}

impl Subscriber for Capture {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        *m.level() <= Level::INFO
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, e: &Event<'_>) {
        let mut line = Line(e.metadata().level().to_string());
        e.record(&mut line);
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(line.0);
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_of_this_thread_are_kept_with_their_fields() {
        let ((), c) = Captured::run(|| {
            tracing::warn!(suppressed = 7u64, seq = 3, "dropped {}", "a frame");
            tracing::debug!("not kept");
            tracing::info!(who = "x", "hello");
        });
        assert_eq!(
            c.lines(),
            vec![
                "WARN dropped a frame suppressed=7 seq=3".to_string(),
                "INFO hello who=x".to_string()
            ]
        );
        assert_eq!(c.suppressed("dropped"), 7);
        assert_eq!(c.matching("hello").len(), 1);
        // Another thread's lines are not this capture's.
        let ((), c) = Captured::run(|| {
            std::thread::spawn(|| tracing::warn!("elsewhere"))
                .join()
                .unwrap();
        });
        assert!(c.lines().is_empty());
    }
}

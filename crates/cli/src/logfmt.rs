//! How `ndd` writes its log lines: `ndd [side]: message key=value`, plain text unless stderr
//! is a terminal (no colour escapes in files), the level named only when it is not a plain
//! note or warning. Messages come from `tracing` events anywhere in the workspace; a `side`
//! field becomes the bracketed prefix, so both sides of the demo stay apart.

use std::fmt::{self, Write as _};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

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
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut f = Fields::default();
        event.record(&mut f);
        let meta = event.metadata();
        write!(writer, "ndd")?;
        if let Some(side) = &f.side {
            write!(writer, " [{side}]")?;
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

//! The `check` class: sinks that verify or count a stream instead of delivering it.
//!
//! - `check` sink: the [`Checker`] verifies a stream's order, completeness and (optionally)
//!   content, and the sink reports its [`CheckReport`];
//! - `null` sink: counts frames and discards them.
//!
//! Rules of the checker, relative to the sequence numbers seen so far:
//! - the next frame is expected to carry the highest seq seen + 1;
//! - a higher seq opens a *gap* (the skipped range counts as missing);
//! - a seq inside an open gap is *reordered* (late): it leaves the missing count;
//! - a seq below the lowest seen is *reordered* too, and the range up to the lowest becomes a
//!   gap;
//! - any other lower seq was already received: a *duplicate*;
//! - with a `seed`, a payload that is not `synthetic::payload(seed, seq, size)` (size defaults
//!   to the payload's own length) is *corrupt*; with only a `size`, a payload of another length
//!   is corrupt. Corrupt frames still count for order.
//!
//! Files: `config.rs` ([`CheckConfig`], [`NullConfig`]), `checker.rs` (the sans-IO
//! [`Checker`]; [`CheckReport`] itself is in `common`, since every [`SinkReport`](crate::SinkReport)
//! can carry one), `sink.rs` (the two sink tasks).

mod checker;
mod config;
mod sink;

pub use checker::*;
pub use config::{CheckConfig, NullConfig};
pub(crate) use sink::{spawn_check_sink, spawn_null_sink};

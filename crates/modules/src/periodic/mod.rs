//! `periodic`: the latest frame every T ms (dissertation §4.8.2 "Periodic Updates"); the
//! inverse is a no-op.
//!
//! Synopsis: `{ type = "periodic", interval_ms = 16, repeat = false }`
//!
//! - forward half: keeps only the most recent frame (a frame replaced before it was emitted
//!   is counted as `superseded`) and emits it on a fixed grid of ticks `t0 + k·interval_ms`,
//!   k ≥ 1, where `t0` is the arrival of the first frame: no drift, whatever the arrival
//!   times. A tick emits the newest frame that arrived at or before it. With
//!   `repeat = false` a tick with no new frame emits nothing (and the half asks for no timer
//!   while it holds nothing); with `repeat = true` it emits the last frame again, so the sink
//!   sees a steady rate. A tick serviced late (the runtime called in after several intervals)
//!   emits once and the grid skips the missed ticks: no burst. Flushing emits the frame held,
//!   if any, and stops the grid (and the repeats).
//! - **Sequence rule.** An emitted frame keeps its stream, timestamp, flags and payload. Its
//!   seq is its own, unless that is not above the seq emitted last; then it is last + 1. So a
//!   fresh frame keeps its seq (the source numbers frames in order and `periodic` emits a
//!   subsequence of them), and a repeat always gets last + 1: seq strictly grows within the
//!   stream (docs/protocol.md §4.1) and nothing downstream can mistake a repeat for a
//!   duplicate. A repeat is recognisable by its timestamp, equal to the frame it repeats (its
//!   data is that old). When repeats outnumber fresh frames (a source slower than
//!   `interval_ms`), later fresh frames may be renumbered too (last + 1), since the seqs in
//!   between were used by repeats; their timestamps still identify them. Frame flags cannot
//!   mark repeats: the link carries only `RETRANSMIT`.
//! - inverse half: passes frames on untouched (periodic changes content, not form).
//!
//! No control messages (one received is `MalformedControl`). Stats: forward `drops` =
//! `superseded`, `emitted`, `repeats`, queue depth (0 or 1 frame held).

mod forward;
mod inverse;
#[cfg(test)]
mod tests;

pub use forward::PeriodicForward;
pub use inverse::PeriodicInverse;

use crate::registry::{ModuleInfo, ParamInfo, IDS};
use ndd_core::{ControlError, Half, ModuleError, Pair, ParamError};
use serde::Deserialize;
use std::time::Duration;

/// Parameters of `periodic`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PeriodicConfig {
    /// Time between emissions, in ms.
    pub interval_ms: u64,
    /// Re-emit the last frame at ticks with no new frame.
    pub repeat: bool,
}

impl Default for PeriodicConfig {
    fn default() -> Self {
        PeriodicConfig {
            interval_ms: 16,
            repeat: false,
        }
    }
}

/// The pair's name, first in its error texts.
const PAIR: &str = "periodic";

/// Catalogue entry.
pub const INFO: ModuleInfo = ModuleInfo {
    name: PAIR,
    id: IDS.periodic,
    summary: "the latest frame every T ms on a fixed grid; older frames are dropped",
    params: &[
        ParamInfo {
            name: "interval_ms",
            ty: "integer 1..=60000",
            default: "16",
            doc: "time between emissions",
        },
        ParamInfo {
            name: "repeat",
            ty: "boolean",
            default: "false",
            doc: "re-emit the last frame when no new one arrived (with a new seq)",
        },
    ],
};

/// The error for a control message to a pair that defines none.
fn no_control(len: usize) -> ModuleError {
    ModuleError::from(ControlError::NoControl {
        pair: Some(PAIR),
        len: Some(len),
    })
}

impl PeriodicConfig {
    /// Checks ranges.
    pub fn validate(&self) -> Result<(), ParamError> {
        ParamError::check_range(PAIR, "interval_ms", self.interval_ms, 1..=60_000)
    }
}

impl Pair for PeriodicConfig {
    fn name(&self) -> &'static str {
        INFO.name
    }
    fn id(&self) -> u16 {
        INFO.id
    }
    fn describe(&self) -> String {
        format!(
            "periodic(interval_ms={}, repeat={})",
            self.interval_ms, self.repeat
        )
    }
    fn forward(&self) -> Result<Box<dyn Half>, ModuleError> {
        self.validate()?;
        Ok(Box::new(PeriodicForward::new(
            Duration::from_millis(self.interval_ms),
            self.repeat,
        )))
    }
    fn inverse(&self) -> Result<Box<dyn Half>, ModuleError> {
        self.validate()?;
        Ok(Box::new(PeriodicInverse))
    }
}

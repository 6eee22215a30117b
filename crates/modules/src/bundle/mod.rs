//! `bundle`: several small frames travel as one wire frame; the sink re-releases them with
//! their original spacing (dissertation §4.8.2 and §6.7.2).
//!
//! Synopsis: `{ type = "bundle", count = 10, max_delay_ms = 100, max_bytes = 1048576, playout_ms = 0 }`
//!
//! - forward half: collects frames until it holds `count` of them, or the oldest has waited
//!   `max_delay_ms`, or the next one would push the bundle past `max_bytes`; then emits one
//!   frame carrying them all (format in [`format`]). The bundle takes the meta of its first frame.
//! - inverse half: unpacks a bundle and releases each frame at
//!   `anchor + (timestamp − anchor timestamp)`, so the application sees the spacing the
//!   device produced, not the network's. The anchor is set by the first bundle (plus
//!   `playout_ms`) and moved later only when a bundle arrives too late to keep the schedule
//!   (counted as `late`), so the added delay settles at the worst jitter seen.
//!
//! No control messages. Stats: `late`, `reanchors`, queue depth (frames held by the inverse).

pub mod format;
mod forward;
mod inverse;
#[cfg(test)]
mod tests;

pub use forward::BundleForward;
pub use inverse::BundleInverse;

use crate::registry::{ModuleInfo, ParamInfo, IDS};
use ndd_core::{Half, ModuleError, Pair, ParamError};
use serde::Deserialize;
use std::time::Duration;

/// Parameters of `bundle`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BundleConfig {
    /// Frames per bundle.
    pub count: u32,
    /// Longest time the first frame of a bundle waits for the others, in ms.
    pub max_delay_ms: u64,
    /// Largest bundle payload in bytes (a frame that would exceed it starts a new bundle).
    pub max_bytes: u32,
    /// Extra delay the sink adds before the first release, in ms, to absorb jitter from the
    /// start rather than after the first late bundle.
    pub playout_ms: u64,
}

impl Default for BundleConfig {
    fn default() -> Self {
        BundleConfig {
            count: 10,
            max_delay_ms: 100,
            max_bytes: 1 << 20,
            playout_ms: 0,
        }
    }
}

/// The pair's name, first in its error texts.
const PAIR: &str = "bundle";

/// Catalogue entry.
pub const INFO: ModuleInfo = ModuleInfo {
    name: PAIR,
    id: IDS.bundle,
    summary:
        "N frames or T ms per wire frame; the sink re-releases them with their original spacing",
    params: &[
        ParamInfo {
            name: "count",
            ty: "integer 1..=65535",
            default: "10",
            doc: "frames per bundle",
        },
        ParamInfo {
            name: "max_delay_ms",
            ty: "integer 0..=60000",
            default: "100",
            doc: "longest wait of the first frame of a bundle",
        },
        ParamInfo {
            name: "max_bytes",
            ty: "integer 64..=67108864",
            default: "1048576",
            doc: "largest bundle payload",
        },
        ParamInfo {
            name: "playout_ms",
            ty: "integer 0..=60000",
            default: "0",
            doc: "delay the sink adds before the first release",
        },
    ],
};

impl BundleConfig {
    /// Checks ranges.
    pub fn validate(&self) -> Result<(), ParamError> {
        ParamError::check_range(PAIR, "count", self.count, 1..=65535)?;
        ParamError::check_range(PAIR, "max_delay_ms", self.max_delay_ms, 0..=60_000)?;
        ParamError::check_range(PAIR, "max_bytes", self.max_bytes, 64..=64 << 20)?;
        ParamError::check_range(PAIR, "playout_ms", self.playout_ms, 0..=60_000)
    }
}

impl Pair for BundleConfig {
    fn name(&self) -> &'static str {
        INFO.name
    }
    fn id(&self) -> u16 {
        INFO.id
    }
    fn describe(&self) -> String {
        format!(
            "bundle(count={}, max_delay_ms={}, max_bytes={}, playout_ms={})",
            self.count, self.max_delay_ms, self.max_bytes, self.playout_ms
        )
    }
    fn forward(&self) -> Result<Box<dyn Half>, ModuleError> {
        self.validate()?;
        Ok(Box::new(BundleForward::new(
            self.count as usize,
            Duration::from_millis(self.max_delay_ms),
            self.max_bytes as usize,
        )))
    }
    fn inverse(&self) -> Result<Box<dyn Half>, ModuleError> {
        self.validate()?;
        Ok(Box::new(BundleInverse::new(Duration::from_millis(
            self.playout_ms,
        ))))
    }
}

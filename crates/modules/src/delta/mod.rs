//! `delta`: sends a frame as its XOR difference against the previous frame of the same size,
//! so slowly changing frames (a screen, a sensor array) become mostly zeros, which a `compress`
//! layer below it then shrinks to almost nothing (DESIGN.md §6).
//!
//! Synopsis: `{ type = "delta", keyframe_interval = 100 }`
//!
//! - forward half: the first frame, a frame whose size differs from the previous one, every
//!   `keyframe_interval`-th frame and the frame after a key request from the inverse are *key
//!   frames* (sent as they are behind a 1-byte header pushed in the headroom); every other
//!   frame is XORed in place with the previous frame and sent behind a 9-byte header naming the
//!   sequence number of that reference frame. One copy of each frame is kept as the next
//!   reference.
//! - inverse half: keeps the last frame it rebuilt. A key frame passes on (and becomes the
//!   reference if it is newer than the one held); a delta whose reference is the frame held, of
//!   the same size, is XORed back in place. Any other delta (its reference was lost or
//!   reordered on a lossy link) can not be rebuilt: it is dropped and counted
//!   (`missing_reference`), never delivered wrong; if it is newer than the frame held, the
//!   inverse asks its twin for a key frame (control message, rate-limited: one request when it
//!   gets stuck, repeated only while still stuck after [`RETRY_AFTER_DROPS`] further drops or
//!   after twice the time the previous request took to be answered, in case the key frame was
//!   lost too).
//!
//! Formats in [`format`]. Stats: forward `key_frames`, `delta_frames`, `key_requests`
//! (requests received); inverse `key_frames`, `delta_frames`, `missing_reference` (= drops),
//! `key_requests` (requests sent).

pub mod format;
mod forward;
mod inverse;
#[cfg(test)]
mod tests;

pub use forward::DeltaForward;
pub use inverse::{DeltaInverse, RETRY_AFTER_DROPS};

use crate::registry::{ModuleInfo, ParamInfo, IDS};
use ndd_core::{Half, ModuleError, Pair, ParamError};
use serde::Deserialize;

/// Largest `keyframe_interval`.
pub const MAX_KEYFRAME_INTERVAL: u32 = 1_000_000;

/// Parameters of `delta`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DeltaConfig {
    /// At most this many frames per key frame (a key frame and `keyframe_interval − 1` deltas);
    /// 0: key frames only at the start, on a size change and on request.
    pub keyframe_interval: u32,
}

impl Default for DeltaConfig {
    fn default() -> Self {
        DeltaConfig {
            keyframe_interval: 100,
        }
    }
}

/// The pair's name, first in its error texts.
const PAIR: &str = "delta";

/// Catalogue entry.
pub const INFO: ModuleInfo = ModuleInfo {
    name: PAIR,
    id: IDS.delta,
    summary: "XOR against the previous frame of the same size; key frames on size change, \
              every N frames and on the sink's request after a loss",
    params: &[ParamInfo {
        name: "keyframe_interval",
        ty: "integer 0..=1000000",
        default: "100",
        doc: "a key frame every N frames (0: only at start, size change and on request)",
    }],
};

impl DeltaConfig {
    /// Checks ranges.
    pub fn validate(&self) -> Result<(), ParamError> {
        ParamError::check_range(
            PAIR,
            "keyframe_interval",
            self.keyframe_interval,
            0..=MAX_KEYFRAME_INTERVAL,
        )
    }
}

impl Pair for DeltaConfig {
    fn name(&self) -> &'static str {
        INFO.name
    }
    fn id(&self) -> u16 {
        INFO.id
    }
    fn describe(&self) -> String {
        format!("delta(keyframe_interval={})", self.keyframe_interval)
    }
    fn forward(&self) -> Result<Box<dyn Half>, ModuleError> {
        self.validate()?;
        Ok(Box::new(DeltaForward::new(self.keyframe_interval)))
    }
    fn inverse(&self) -> Result<Box<dyn Half>, ModuleError> {
        self.validate()?;
        Ok(Box::new(DeltaInverse::default()))
    }
}

//! `buffer`: the dissertation's jitter buffer (§4.8.2 "Buffering", §6.7.1): the sink half holds
//! frames and releases them with their original spacing; when it runs low it asks the source
//! half, out of band, for a refill.
//!
//! Synopsis: `{ type = "buffer", min = 5, max = 10, source_max = 400, playout_ms = 0 }`
//!
//! - sink (inverse) half: keeps the frames it receives in timestamp order and releases each at
//!   `anchor + (timestamp − anchor timestamp)`, like `bundle`'s inverse. Playout starts when it
//!   holds `min` frames or `playout_ms` after the first arrival, whichever comes first; the
//!   anchor is then (now, timestamp of the oldest frame held). A frame that arrives after its
//!   due time moves the anchor to its arrival (counted `late`), so the added delay settles at
//!   the worst jitter seen and the spacing is exact from then on. Every time it releases frames
//!   and holds fewer than `min` afterwards, it sends `refill(max − held)` to the source half;
//!   also when the queue runs empty at the time the next frame was expected (`underruns`).
//! - source (forward) half: releases frames while it has credit (one frame per unit). It
//!   starts with a credit of `max` (the sink cannot ask before it has frames), adds the count
//!   of every refill (capped at `max`), and holds what it cannot release, dropping
//!   the oldest above `source_max`. If it has held frames without credit for
//!   [`SOURCE_STALL`] (a refill lost, or a sink that stopped asking), it grants itself `max`
//!   credit (`self_refills`), so a lost control message can never stall the stream for good.
//!
//! `max` is the level the sink refills to, not a drop limit: the sink never drops a frame it
//! received in time, so it may briefly hold more than `max` (frames that were already in
//! flight when it asked). A frame that arrives after a *newer* one was released (reordering on
//! a datagram link beyond what the schedule absorbed) is dropped and counted `stale`.
//!
//! Control message (sink → source), 5 bytes: `0x01` "refill", then the count as u32 BE.
//!
//! Sizing: `min × period` should cover a refill's round trip (up to 2 × (delay + jitter)) and
//! `playout_ms` the jitter; a smaller `min` makes frames wait at the source for refills and
//! arrive late (see docs/modules.md, "buffer", for the measurements).

mod forward;
mod inverse;
#[cfg(test)]
mod tests;

pub use forward::BufferForward;
pub use inverse::BufferInverse;

use crate::registry::{ModuleInfo, ParamInfo, IDS};
use ndd_core::{ControlError, Half, ModuleError, Pair, ParamError};
use serde::Deserialize;
use std::time::Duration;

/// Type byte of the refill control message.
pub const REFILL: u8 = 0x01;
/// Length of the refill control message.
pub const REFILL_LEN: usize = 5;
/// How long the source half holds frames without credit before it grants itself `max`.
pub const SOURCE_STALL: Duration = Duration::from_secs(1);
/// A frame due more than this (plus `playout_ms`) from now, or this far behind the last
/// release, means the source clock jumped or restarted: the schedule starts again.
pub const MAX_SKEW: Duration = Duration::from_secs(2);

/// Parameters of `buffer`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BufferConfig {
    /// The sink asks for a refill when it holds fewer frames than this.
    pub min: u32,
    /// The sink asks for enough frames to hold this many; also the source's initial credit.
    pub max: u32,
    /// Frames the source half holds at most; it drops the oldest above this.
    pub source_max: u32,
    /// Longest wait, in ms after the first arrival, before the sink starts releasing even if
    /// it holds fewer than `min` frames (0: start at the first arrival).
    pub playout_ms: u64,
}

impl Default for BufferConfig {
    fn default() -> Self {
        BufferConfig {
            min: 5,
            max: 10,
            source_max: 400,
            playout_ms: 0,
        }
    }
}

/// The pair's name, first in its error texts.
const PAIR: &str = "buffer";

/// Catalogue entry.
pub const INFO: ModuleInfo = ModuleInfo {
    name: PAIR,
    id: IDS.buffer,
    summary: "jitter buffer: the sink releases frames with their original spacing and asks the source for refills",
    params: &[
        ParamInfo {
            name: "min",
            ty: "integer 1..=max",
            default: "5",
            doc: "the sink asks for a refill when it holds fewer frames",
        },
        ParamInfo {
            name: "max",
            ty: "integer 1..=65535",
            default: "10",
            doc: "the sink refills to this many frames; the source's initial credit",
        },
        ParamInfo {
            name: "source_max",
            ty: "integer 1..=1000000",
            default: "400",
            doc: "frames the source holds at most; it drops the oldest above",
        },
        ParamInfo {
            name: "playout_ms",
            ty: "integer 0..=60000",
            default: "0",
            doc: "longest wait after the first arrival before playout starts",
        },
    ],
};

impl BufferConfig {
    /// Checks ranges.
    pub fn validate(&self) -> Result<(), ParamError> {
        ParamError::check_range(PAIR, "max", self.max, 1..=65535)?;
        if !(1..=self.max).contains(&self.min) {
            return Err(ParamError::OutOfRange {
                pair: PAIR,
                param: "min",
                value: self.min.into(),
                min: 1,
                max: self.max.into(),
                max_param: Some("max"),
            });
        }
        ParamError::check_range(PAIR, "source_max", self.source_max, 1..=1_000_000)?;
        ParamError::check_range(PAIR, "playout_ms", self.playout_ms, 0..=60_000)
    }
}

impl Pair for BufferConfig {
    fn name(&self) -> &'static str {
        INFO.name
    }
    fn id(&self) -> u16 {
        INFO.id
    }
    fn describe(&self) -> String {
        format!(
            "buffer(min={}, max={}, source_max={}, playout_ms={})",
            self.min, self.max, self.source_max, self.playout_ms
        )
    }
    fn forward(&self) -> Result<Box<dyn Half>, ModuleError> {
        self.validate()?;
        Ok(Box::new(BufferForward::new(self.max, self.source_max)))
    }
    fn inverse(&self) -> Result<Box<dyn Half>, ModuleError> {
        self.validate()?;
        Ok(Box::new(BufferInverse::new(
            self.min,
            self.max,
            Duration::from_millis(self.playout_ms),
        )))
    }
}

/// Encodes `refill(count)`.
pub fn encode_refill(count: u32) -> [u8; REFILL_LEN] {
    let c = count.to_be_bytes();
    [REFILL, c[0], c[1], c[2], c[3]]
}

/// Decodes a control message from the sink half; the error names what is wrong.
pub fn decode_refill(msg: &[u8]) -> Result<u32, ControlError> {
    match msg {
        [] => Err(ControlError::Empty { pair: PAIR }),
        [REFILL, a, b, c, d] => Ok(u32::from_be_bytes([*a, *b, *c, *d])),
        [REFILL, ..] => Err(ControlError::WrongLength {
            pair: PAIR,
            what: "refill message",
            len: msg.len(),
            expected: REFILL_LEN,
        }),
        [t, ..] => Err(ControlError::UnknownType { pair: PAIR, ty: *t }),
    }
}

//! `latest`: frame spoiling (VirtualGL): when the link or the sink is busy, keep only the newest
//! frame instead of queueing stale ones.
//!
//! Synopsis: `{ type = "latest", in_flight = 1, ack_timeout_ms = 1000 }`
//!
//! - forward half: may have at most `in_flight` frames unacknowledged. While it has no credit
//!   it holds only the newest frame: a new frame replaces (spoils) the one it held, counted as
//!   `spoiled`. An ack restores credit and the held frame goes out at once. A frame not
//!   acknowledged within `ack_timeout_ms` is taken as lost (`timeouts`) and its credit returns,
//!   so a lost frame or ack cannot stall the stream.
//! - inverse half: passes every frame on, unchanged, and acks each one it receives to the
//!   forward half. A frame older than (or the same as) one it already passed on, by sequence
//!   number, is acked but dropped (`stale`): on a reordering link the sink never goes back in
//!   time.
//!
//! No header: frames travel unchanged. The sink sees a subsequence of the frames, in order,
//! each the newest that was available when the link had room for it.
//!
//! Control message (inverse → forward), 9 bytes: `0x01` "ack", then the frame's sequence
//! number as u64 BE.

mod forward;
mod inverse;
#[cfg(test)]
mod tests;

pub use forward::LatestForward;
pub use inverse::LatestInverse;

use crate::registry::{ModuleInfo, ParamInfo, IDS};
use ndd_core::{ControlError, Half, ModuleError, Pair, ParamError};
use serde::Deserialize;
use std::time::Duration;

/// Type byte of the ack control message.
pub const ACK: u8 = 0x01;
/// Length of the ack control message.
pub const ACK_LEN: usize = 9;

/// Parameters of `latest`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LatestConfig {
    /// Frames that may be on their way (sent, not yet acknowledged) at once.
    pub in_flight: u32,
    /// A frame not acknowledged within this many ms is taken as lost and its credit returns.
    pub ack_timeout_ms: u64,
}

impl Default for LatestConfig {
    fn default() -> Self {
        LatestConfig {
            in_flight: 1,
            ack_timeout_ms: 1000,
        }
    }
}

/// The pair's name, first in its error texts.
const PAIR: &str = "latest";

/// Catalogue entry.
pub const INFO: ModuleInfo = ModuleInfo {
    name: PAIR,
    id: IDS.latest,
    summary: "frame spoiling: while the link or sink is busy, only the newest frame waits",
    params: &[
        ParamInfo {
            name: "in_flight",
            ty: "integer 1..=1024",
            default: "1",
            doc: "frames sent and not yet acknowledged, at most",
        },
        ParamInfo {
            name: "ack_timeout_ms",
            ty: "integer 1..=60000",
            default: "1000",
            doc: "an unacknowledged frame counts as lost after this long",
        },
    ],
};

impl LatestConfig {
    /// Checks ranges.
    pub fn validate(&self) -> Result<(), ParamError> {
        ParamError::check_range(PAIR, "in_flight", self.in_flight, 1..=1024)?;
        ParamError::check_range(PAIR, "ack_timeout_ms", self.ack_timeout_ms, 1..=60_000)
    }
}

impl Pair for LatestConfig {
    fn name(&self) -> &'static str {
        INFO.name
    }
    fn id(&self) -> u16 {
        INFO.id
    }
    fn describe(&self) -> String {
        format!(
            "latest(in_flight={}, ack_timeout_ms={})",
            self.in_flight, self.ack_timeout_ms
        )
    }
    fn forward(&self) -> Result<Box<dyn Half>, ModuleError> {
        self.validate()?;
        Ok(Box::new(LatestForward::new(
            self.in_flight,
            Duration::from_millis(self.ack_timeout_ms),
        )))
    }
    fn inverse(&self) -> Result<Box<dyn Half>, ModuleError> {
        self.validate()?;
        Ok(Box::new(LatestInverse::default()))
    }
}

/// Encodes `ack(seq)`.
pub fn encode_ack(seq: u64) -> [u8; ACK_LEN] {
    let mut m = [0u8; ACK_LEN];
    m[0] = ACK;
    m[1..].copy_from_slice(&seq.to_be_bytes());
    m
}

/// Decodes a control message from the inverse half; the error names what is wrong.
pub fn decode_ack(msg: &[u8]) -> Result<u64, ControlError> {
    match msg {
        [] => Err(ControlError::Empty { pair: PAIR }),
        [ACK, rest @ ..] => match <[u8; 8]>::try_from(rest) {
            Ok(b) => Ok(u64::from_be_bytes(b)),
            Err(_) => Err(ControlError::WrongLength {
                pair: PAIR,
                what: "ack message",
                len: msg.len(),
                expected: ACK_LEN,
            }),
        },
        [t, ..] => Err(ControlError::UnknownType { pair: PAIR, ty: *t }),
    }
}

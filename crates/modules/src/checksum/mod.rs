//! `checksum`: detects corrupted frames.
//!
//! Synopsis: `{ type = "checksum" }`. No parameters.
//!
//! The forward half prepends a 4-byte header: CRC32C (Castagnoli), big-endian, over
//! `stream id (u16 BE) ‖ sequence (u64 BE) ‖ source timestamp (u64 BE) ‖ payload`, where the
//! payload is the frame as this pair received it (headers of pairs below are included).
//! The inverse half recomputes it, strips the header and passes the frame on; a frame whose
//! checksum does not match (or that is shorter than the header) is dropped, counted as
//! `corrupted` and reported with a WARN event naming the stream and sequence number.
//! No control messages.

mod forward;
mod inverse;
#[cfg(test)]
mod tests;

pub use forward::ChecksumForward;
pub use inverse::ChecksumInverse;

use crate::registry::{ModuleInfo, IDS};
use ndd_core::{Half, Meta, ModuleError, Pair};
use serde::Deserialize;

/// Length of the pair header.
pub const HEADER_LEN: usize = 4;

/// Parameters of `checksum` (none).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChecksumConfig {}

/// Catalogue entry.
pub const INFO: ModuleInfo = ModuleInfo {
    name: "checksum",
    id: IDS.checksum,
    summary: "CRC32C over meta and payload; the inverse drops and counts corrupted frames",
    params: &[],
};

/// The checksum a frame with this meta and payload carries.
pub fn crc(meta: &Meta, payload: &[u8]) -> u32 {
    let mut pre = [0u8; 18];
    pre[0..2].copy_from_slice(&meta.stream.to_be_bytes());
    pre[2..10].copy_from_slice(&meta.seq.to_be_bytes());
    pre[10..18].copy_from_slice(&meta.timestamp_ns.to_be_bytes());
    crc32c::crc32c_append(crc32c::crc32c(&pre), payload)
}

impl Pair for ChecksumConfig {
    fn name(&self) -> &'static str {
        INFO.name
    }
    fn id(&self) -> u16 {
        INFO.id
    }
    fn describe(&self) -> String {
        INFO.name.to_string()
    }
    fn forward(&self) -> Result<Box<dyn Half>, ModuleError> {
        Ok(Box::new(ChecksumForward))
    }
    fn inverse(&self) -> Result<Box<dyn Half>, ModuleError> {
        Ok(Box::new(ChecksumInverse::default()))
    }
}

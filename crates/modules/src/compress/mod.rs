//! `compress`: shrinks frames on the wire with LZ4 (fast) or zstd (ratio) (dissertation §4.8.2,
//! "Compressing"; DESIGN.md §6 and §9).
//!
//! Synopsis: `{ type = "compress", codec = "lz4", level = 3, min_size = 64, max_size = 67108864 }`
//!
//! - forward half: compresses each frame with the configured codec (LZ4 block format of
//!   `lz4_flex`, or a zstd frame at `level`). A frame shorter than `min_size`, longer than
//!   `max_size`, or that does not shrink is sent *stored*: as it is, behind a 1-byte header
//!   pushed in its headroom (no copy). A compressed frame is a new buffer: a 5-byte header
//!   (method, original length) then the compressed bytes. Meta passes unchanged.
//! - inverse half: pops the header; a stored frame passes on without a copy; a compressed one is
//!   decompressed into a buffer of exactly the announced length, after checking that length
//!   against `max_size` (the decompression-bomb guard, checked before anything is allocated).
//!
//! Header format in [`format`]. Any header or data the inverse cannot use (unknown method,
//! truncated header, length above `max_size`, corrupt data, a decompressed length different from
//! the announced one) fails the stream with `malformed frame: compress: …`: the pair does not
//! tolerate damage; put `checksum` below it on a link that may corrupt.
//!
//! No control messages (a control message for this pair is refused as malformed).
//! Stats: forward `stored`, `compressed`, `bytes_saved`; inverse `stored`, `decompressed`.
//! The ratio is the forward layer's `bytes_out / bytes_in` in the stack statistics.

pub mod format;
mod forward;
mod inverse;
#[cfg(test)]
mod tests;

pub use forward::CompressForward;
pub use inverse::CompressInverse;

use crate::registry::{ModuleInfo, ParamInfo, IDS};
use ndd_core::{Half, ModuleError, Pair, ParamError};
use serde::Deserialize;
use std::fmt;

/// Compression algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Codec {
    /// LZ4 block format (`lz4_flex`): fast, moderate ratio. Ignores `level`.
    Lz4,
    /// zstd (`zstd` crate) at `level`: slower, better ratio.
    Zstd,
}

impl Codec {
    /// Name as written in config files: `lz4` or `zstd`.
    pub fn name(self) -> &'static str {
        match self {
            Codec::Lz4 => "lz4",
            Codec::Zstd => "zstd",
        }
    }
}

impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Largest allowed `max_size` (and `min_size`): 1 GiB.
pub const MAX_SIZE_LIMIT: u32 = 1 << 30;

/// Parameters of `compress`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CompressConfig {
    /// `lz4` or `zstd`.
    pub codec: Codec,
    /// zstd level, 1..=19 (validated always, used only by zstd).
    pub level: i32,
    /// Frames shorter than this many bytes are sent stored, without trying to compress them.
    pub min_size: u32,
    /// Largest original length the inverse accepts (decompression-bomb guard); the forward half
    /// sends longer frames stored.
    pub max_size: u32,
}

impl Default for CompressConfig {
    fn default() -> Self {
        CompressConfig {
            codec: Codec::Lz4,
            level: 3,
            min_size: 64,
            max_size: 64 << 20,
        }
    }
}

/// The pair's name, first in its error texts.
const PAIR: &str = "compress";

/// Catalogue entry.
pub const INFO: ModuleInfo = ModuleInfo {
    name: PAIR,
    id: IDS.compress,
    summary: "LZ4 or zstd per frame; small or incompressible frames travel stored (no copy)",
    params: &[
        ParamInfo {
            name: "codec",
            ty: "\"lz4\" | \"zstd\"",
            default: "\"lz4\"",
            doc: "compression algorithm",
        },
        ParamInfo {
            name: "level",
            ty: "integer 1..=19",
            default: "3",
            doc: "zstd level (ignored by lz4)",
        },
        ParamInfo {
            name: "min_size",
            ty: "integer 0..=1073741824",
            default: "64",
            doc: "frames shorter than this are sent stored",
        },
        ParamInfo {
            name: "max_size",
            ty: "integer 64..=1073741824",
            default: "67108864",
            doc: "largest original length the inverse accepts (longer frames are sent stored)",
        },
    ],
};

impl CompressConfig {
    /// Checks ranges.
    pub fn validate(&self) -> Result<(), ParamError> {
        ParamError::check_range(PAIR, "level", self.level, 1..=19)?;
        ParamError::check_range(PAIR, "min_size", self.min_size, 0..=MAX_SIZE_LIMIT)?;
        ParamError::check_range(PAIR, "max_size", self.max_size, 64..=MAX_SIZE_LIMIT)
    }
}

impl Pair for CompressConfig {
    fn name(&self) -> &'static str {
        INFO.name
    }
    fn id(&self) -> u16 {
        INFO.id
    }
    fn describe(&self) -> String {
        format!(
            "compress(codec={}, level={}, min_size={}, max_size={})",
            self.codec, self.level, self.min_size, self.max_size
        )
    }
    fn forward(&self) -> Result<Box<dyn Half>, ModuleError> {
        self.validate()?;
        Ok(Box::new(CompressForward::new(
            self.codec,
            self.level,
            self.min_size as usize,
            self.max_size as usize,
        )?))
    }
    fn inverse(&self) -> Result<Box<dyn Half>, ModuleError> {
        self.validate()?;
        Ok(Box::new(CompressInverse::new(self.max_size as usize)))
    }
}

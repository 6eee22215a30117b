//! The `compress` pair header (also in docs/modules.md), pushed by the forward half in
//! front of the payload:
//!
//! ```text
//! u8      method            0 = stored, 1 = lz4, 2 = zstd
//! u32 BE  original length   only when method ≠ 0: payload bytes before compression
//! ```
//!
//! A stored frame's payload follows as it is. A compressed frame's payload is one LZ4 block
//! (`lz4_flex::block` format, no size prefix) or one zstd frame, which must decompress to
//! exactly the original length.

use super::{Codec, PAIR};
use ndd_core::FrameError;

/// Method byte of a frame sent as it is.
pub const METHOD_STORED: u8 = 0;
/// Method byte of an LZ4 block.
pub const METHOD_LZ4: u8 = 1;
/// Method byte of a zstd frame.
pub const METHOD_ZSTD: u8 = 2;

/// Header length of a stored frame.
pub const STORED_LEN: usize = 1;
/// Header length of a compressed frame.
pub const COMPRESSED_LEN: usize = 5;

/// A parsed `compress` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Header {
    /// The payload follows as it is.
    Stored,
    /// The payload is compressed with `codec` and decompresses to `original_len` bytes.
    Compressed {
        /// Codec used.
        codec: Codec,
        /// Length before compression.
        original_len: u32,
    },
}

impl Header {
    /// Parses the header at the start of `buf` (the frame payload as received).
    pub fn parse(buf: &[u8]) -> Result<Header, FrameError> {
        let Some(&method) = buf.first() else {
            return Err(FrameError::Empty {
                pair: PAIR,
                missing: "method byte",
            });
        };
        let codec = match method {
            METHOD_STORED => return Ok(Header::Stored),
            METHOD_LZ4 => Codec::Lz4,
            METHOD_ZSTD => Codec::Zstd,
            m => {
                return Err(FrameError::UnknownValue {
                    pair: PAIR,
                    field: "method",
                    value: m.into(),
                })
            }
        };
        match buf.get(1..COMPRESSED_LEN) {
            Some(&[a, b, c, d]) => Ok(Header::Compressed {
                codec,
                original_len: u32::from_be_bytes([a, b, c, d]),
            }),
            _ => Err(FrameError::ShortHeader {
                pair: PAIR,
                len: buf.len(),
                need: COMPRESSED_LEN,
                header: codec.name(),
            }),
        }
    }

    /// Bytes the header takes.
    pub fn buffer_len(&self) -> usize {
        match self {
            Header::Stored => STORED_LEN,
            Header::Compressed { .. } => COMPRESSED_LEN,
        }
    }

    /// Writes the header into `buf`, which must be [`Header::buffer_len`] bytes long.
    pub fn emit(&self, buf: &mut [u8]) {
        match *self {
            Header::Stored => buf[0] = METHOD_STORED,
            Header::Compressed {
                codec,
                original_len,
            } => {
                buf[0] = match codec {
                    Codec::Lz4 => METHOD_LZ4,
                    Codec::Zstd => METHOD_ZSTD,
                };
                buf[1..COMPRESSED_LEN].copy_from_slice(&original_len.to_be_bytes());
            }
        }
    }
}

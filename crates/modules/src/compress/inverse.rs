//! Sink half of `compress`: pops the header and decompresses, after checking the announced
//! length against `max_size`.

use super::format::{Header, COMPRESSED_LEN, STORED_LEN};
use super::{Codec, PAIR};
use bytes::Bytes;
use ndd_core::frame::DEFAULT_HEADROOM;
use ndd_core::{
    ControlError, ForeignError, Frame, FrameError, Half, HalfStats, ModuleError, Output, SetupError,
};
use std::fmt;
use std::time::Instant;

/// Undoes [`CompressForward`](super::CompressForward). Decodes either codec, whatever its own
/// `codec` parameter says.
pub struct CompressInverse {
    max_size: usize,
    /// Created at the first zstd frame, then reused.
    zstd: Option<zstd::bulk::Decompressor<'static>>,
    stored: u64,
    decompressed: u64,
}

impl fmt::Debug for CompressInverse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompressInverse")
            .field("max_size", &self.max_size)
            .field("stored", &self.stored)
            .field("decompressed", &self.decompressed)
            .finish_non_exhaustive()
    }
}

impl CompressInverse {
    /// An inverse half that refuses original lengths above `max_size`.
    pub fn new(max_size: usize) -> CompressInverse {
        CompressInverse {
            max_size,
            zstd: None,
            stored: 0,
            decompressed: 0,
        }
    }

    fn zstd(&mut self) -> Result<&mut zstd::bulk::Decompressor<'static>, ModuleError> {
        let d = match self.zstd.take() {
            Some(d) => d,
            None => zstd::bulk::Decompressor::new().map_err(|e| SetupError::Library {
                pair: PAIR,
                context: "zstd decompressor".into(),
                source: ForeignError::new(e),
            })?,
        };
        Ok(self.zstd.insert(d))
    }
}

impl Half for CompressInverse {
    fn handle_frame(
        &mut self,
        _now: Instant,
        mut frame: Frame,
        out: &mut Output,
    ) -> Result<(), ModuleError> {
        let (codec, original_len) = match Header::parse(frame.payload())? {
            Header::Stored => {
                frame.pop_header(STORED_LEN);
                self.stored += 1;
                out.push(frame);
                return Ok(());
            }
            Header::Compressed {
                codec,
                original_len,
            } => (codec, original_len as usize),
        };
        // The decompression-bomb guard: before anything is allocated.
        if original_len > self.max_size {
            return Err(ModuleError::from(FrameError::OverLimit {
                pair: PAIR,
                field: "original length",
                value: original_len as u64,
                limit: "max_size",
                max: self.max_size as u64,
            }));
        }
        let mut restored = Frame::zeroed(frame.meta, DEFAULT_HEADROOM, original_len);
        let data = frame.payload().get(COMPRESSED_LEN..).unwrap_or_default();
        let corrupt = |e: ForeignError| FrameError::Corrupt {
            pair: PAIR,
            codec: codec.name(),
            source: e,
        };
        let n = match codec {
            Codec::Lz4 => lz4_flex::block::decompress_into(data, restored.payload_mut())
                .map_err(|e| corrupt(ForeignError::new(e)))?,
            Codec::Zstd => self
                .zstd()?
                .decompress_to_buffer(data, restored.payload_mut())
                .map_err(|e| corrupt(ForeignError::new(e)))?,
        };
        if n != original_len {
            return Err(ModuleError::from(FrameError::Decompressed {
                pair: PAIR,
                codec: codec.name(),
                len: n,
                announced: original_len,
            }));
        }
        self.decompressed += 1;
        out.push(restored);
        Ok(())
    }

    fn handle_control(
        &mut self,
        _now: Instant,
        _msg: Bytes,
        _out: &mut Output,
    ) -> Result<(), ModuleError> {
        Err(ModuleError::from(ControlError::NoControl {
            pair: Some(PAIR),
            len: None,
        }))
    }

    fn stats(&self) -> HalfStats {
        HalfStats {
            drops: 0,
            queue_depth: 0,
            counters: vec![("stored", self.stored), ("decompressed", self.decompressed)],
        }
    }
}

//! Source half of `compress`: compresses each frame, or sends it stored (no copy).

use super::format::{Header, COMPRESSED_LEN, STORED_LEN};
use super::{Codec, PAIR};
use bytes::Bytes;
use ndd_core::frame::DEFAULT_HEADROOM;
use ndd_core::{
    ControlError, ForeignError, Frame, Half, HalfStats, ModuleError, Output, SetupError,
};
use std::fmt;
use std::time::Instant;

/// Compresses frames with LZ4 or zstd; small or incompressible ones are sent stored.
pub struct CompressForward {
    codec: Codec,
    min_size: usize,
    max_size: usize,
    /// The zstd context, reused across frames (zstd only).
    zstd: Option<zstd::bulk::Compressor<'static>>,
    /// Compression output, sized to the codec's bound of the largest frame seen.
    scratch: Vec<u8>,
    stored: u64,
    compressed: u64,
    bytes_saved: u64,
}

impl fmt::Debug for CompressForward {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompressForward")
            .field("codec", &self.codec)
            .field("min_size", &self.min_size)
            .field("max_size", &self.max_size)
            .field("stored", &self.stored)
            .field("compressed", &self.compressed)
            .field("bytes_saved", &self.bytes_saved)
            .finish_non_exhaustive()
    }
}

impl CompressForward {
    /// A forward half. `level` is used by zstd only; frames shorter than `min_size` or longer
    /// than `max_size` are sent stored.
    pub fn new(
        codec: Codec,
        level: i32,
        min_size: usize,
        max_size: usize,
    ) -> Result<CompressForward, ModuleError> {
        let zstd = match codec {
            Codec::Lz4 => None,
            Codec::Zstd => {
                Some(
                    zstd::bulk::Compressor::new(level).map_err(|e| SetupError::Library {
                        pair: PAIR,
                        context: format!("zstd level {level}"),
                        source: ForeignError::new(e),
                    })?,
                )
            }
        };
        Ok(CompressForward {
            codec,
            min_size,
            max_size,
            zstd,
            scratch: Vec::new(),
            stored: 0,
            compressed: 0,
            bytes_saved: 0,
        })
    }

    /// Compresses `input` into `scratch`; the compressed length if the frame shrinks.
    fn try_compress(&mut self, input: &[u8]) -> Option<usize> {
        let bound = match self.codec {
            Codec::Lz4 => lz4_flex::block::get_maximum_output_size(input.len()),
            Codec::Zstd => zstd::zstd_safe::compress_bound(input.len()),
        };
        if self.scratch.len() < bound {
            self.scratch.resize(bound, 0);
        }
        let dst = self.scratch.get_mut(..bound)?;
        let n = match (self.codec, self.zstd.as_mut()) {
            (Codec::Lz4, _) => lz4_flex::block::compress_into(input, dst).ok()?,
            (Codec::Zstd, Some(z)) => z.compress_to_buffer(input, dst).ok()?,
            (Codec::Zstd, None) => return None,
        };
        // Worth it only if the compressed frame is smaller than the stored one.
        (COMPRESSED_LEN + n < STORED_LEN + input.len()).then_some(n)
    }
}

impl Half for CompressForward {
    fn handle_frame(
        &mut self,
        _now: Instant,
        mut frame: Frame,
        out: &mut Output,
    ) -> Result<(), ModuleError> {
        let len = frame.len();
        if (self.min_size..=self.max_size).contains(&len) {
            if let Some(n) = self.try_compress(frame.payload()) {
                let header = Header::Compressed {
                    codec: self.codec,
                    // len ≤ max_size ≤ 1 GiB: fits.
                    original_len: len as u32,
                };
                let mut c = Frame::zeroed(frame.meta, DEFAULT_HEADROOM, COMPRESSED_LEN + n);
                let buf = c.payload_mut();
                header.emit(&mut buf[..COMPRESSED_LEN]);
                buf[COMPRESSED_LEN..].copy_from_slice(&self.scratch[..n]);
                self.compressed += 1;
                self.bytes_saved += (len - COMPRESSED_LEN - n) as u64;
                out.push(c);
                return Ok(());
            }
        }
        frame.push_header_with(STORED_LEN, |h| Header::Stored.emit(h));
        self.stored += 1;
        out.push(frame);
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
            counters: vec![
                ("stored", self.stored),
                ("compressed", self.compressed),
                ("bytes_saved", self.bytes_saved),
            ],
        }
    }
}

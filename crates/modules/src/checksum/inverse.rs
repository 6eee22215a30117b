//! Sink half of `checksum`: verifies and strips the header; drops corrupted frames.

use super::{crc, HEADER_LEN};
use ndd_core::{Frame, Half, HalfStats, ModuleError, Output, RateLimit};
use std::time::Instant;

/// Verifies and strips the checksum header.
#[derive(Debug, Default)]
pub struct ChecksumInverse {
    corrupted: u64,
    /// One warning a second, however many corrupted frames arrive.
    pub(super) noisy: RateLimit,
}

impl Half for ChecksumInverse {
    fn handle_frame(
        &mut self,
        now: Instant,
        mut frame: Frame,
        out: &mut Output,
    ) -> Result<(), ModuleError> {
        let meta = frame.meta;
        let Some(h) = frame.pop_header(HEADER_LEN) else {
            self.corrupted += 1;
            let Some(suppressed) = self.noisy.admit(now) else {
                return Ok(());
            };
            tracing::warn!(
                suppressed,
                stream = meta.stream,
                seq = meta.seq,
                len = frame.len(),
                "checksum: frame shorter than its checksum header; dropped"
            );
            return Ok(());
        };
        let carried = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
        let actual = crc(&meta, frame.payload());
        if carried != actual {
            self.corrupted += 1;
            let Some(suppressed) = self.noisy.admit(now) else {
                return Ok(());
            };
            tracing::warn!(
                suppressed,
                stream = meta.stream,
                seq = meta.seq,
                carried = format_args!("{carried:08x}"),
                actual = format_args!("{actual:08x}"),
                "checksum: corrupted frame dropped"
            );
            return Ok(());
        }
        out.push(frame);
        Ok(())
    }

    fn stats(&self) -> HalfStats {
        HalfStats {
            drops: self.corrupted,
            queue_depth: 0,
            counters: vec![("corrupted", self.corrupted)],
        }
    }
}

//! Source half of `checksum`: prepends the CRC32C header in the frame's headroom.

use super::{crc, HEADER_LEN};
use ndd_core::{Frame, Half, ModuleError, Output};
use std::time::Instant;

/// Prepends the checksum header.
#[derive(Debug, Default)]
pub struct ChecksumForward;

impl Half for ChecksumForward {
    fn handle_frame(
        &mut self,
        _now: Instant,
        mut frame: Frame,
        out: &mut Output,
    ) -> Result<(), ModuleError> {
        let sum = crc(&frame.meta, frame.payload());
        frame.push_header_with(HEADER_LEN, |h| h.copy_from_slice(&sum.to_be_bytes()));
        out.push(frame);
        Ok(())
    }
}

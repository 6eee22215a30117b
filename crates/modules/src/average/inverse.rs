//! Sink half of `average`: the no-op twin. Averaging changes content, not form, so there is
//! nothing to undo; frames pass on untouched (a pointer move).

use ndd_core::{Frame, Half, ModuleError, Output};
use std::time::Instant;

/// Passes every frame on.
#[derive(Debug, Default)]
pub struct AverageInverse;

impl Half for AverageInverse {
    fn handle_frame(
        &mut self,
        _now: Instant,
        frame: Frame,
        out: &mut Output,
    ) -> Result<(), ModuleError> {
        out.push(frame);
        Ok(())
    }

    fn handle_control(
        &mut self,
        _now: Instant,
        msg: bytes::Bytes,
        _out: &mut Output,
    ) -> Result<(), ModuleError> {
        Err(super::no_control(msg.len()))
    }
}

//! Sink half of `periodic`: the no-op twin. Frames pass on untouched (a pointer move).

use ndd_core::{Frame, Half, ModuleError, Output};
use std::time::Instant;

/// Passes every frame on.
#[derive(Debug, Default)]
pub struct PeriodicInverse;

impl Half for PeriodicInverse {
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

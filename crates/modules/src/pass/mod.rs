//! `pass`: a pass-through pair. Both halves hand every frame on untouched (a pointer move).
//! Used to measure the cost of a layer and to test stacks.
//!
//! Synopsis: `{ type = "pass" }`. No parameters, no header, no control messages.

use crate::registry::{ModuleInfo, IDS};
use ndd_core::{Frame, Half, ModuleError, Output, Pair};
use serde::Deserialize;
use std::time::Instant;

/// Parameters of `pass` (none).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PassConfig {}

/// Catalogue entry.
pub const INFO: ModuleInfo = ModuleInfo {
    name: "pass",
    id: IDS.pass,
    summary: "pass-through: hands every frame on untouched (measures the cost of a layer)",
    params: &[],
};

/// The identity half (used on both sides).
#[derive(Debug, Default)]
pub struct PassHalf;

impl Half for PassHalf {
    fn handle_frame(
        &mut self,
        _now: Instant,
        frame: Frame,
        out: &mut Output,
    ) -> Result<(), ModuleError> {
        out.push(frame);
        Ok(())
    }
}

impl Pair for PassConfig {
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
        Ok(Box::new(PassHalf))
    }
    fn inverse(&self) -> Result<Box<dyn Half>, ModuleError> {
        Ok(Box::new(PassHalf))
    }
}

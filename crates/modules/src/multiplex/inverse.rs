//! Sink half of `multiplex`: checks the route header against its parameters and pops it.

use super::{Header, Mode, HEADER_LEN, PAIR};
use ndd_core::{Frame, FrameError, Half, HalfStats, ModuleError, Output};
use std::time::Instant;

/// Pops the header of every frame (or piece) that matches this side's parameters.
#[derive(Debug)]
pub struct MultiplexInverse {
    mode: Mode,
    parts: u16,
    frames: u64,
    last_part: u64,
}

impl MultiplexInverse {
    /// An inverse half expecting frames of `mode` (and `parts` pieces with `split`).
    pub fn new(mode: Mode, parts: u16) -> MultiplexInverse {
        MultiplexInverse {
            mode,
            parts: parts.max(1),
            frames: 0,
            last_part: 0,
        }
    }
}

impl Half for MultiplexInverse {
    fn handle_frame(
        &mut self,
        _now: Instant,
        mut frame: Frame,
        out: &mut Output,
    ) -> Result<(), ModuleError> {
        let h = Header::parse(frame.payload())?;
        if h.mode != self.mode {
            return Err(FrameError::UnknownValue {
                pair: PAIR,
                field: "mode (the sink was set up for another)",
                value: u64::from(h.encode()[0]),
            }
            .into());
        }
        if h.mode == Mode::Split && h.parts != self.parts {
            return Err(FrameError::UnknownValue {
                pair: PAIR,
                field: "part count (the sink was set up for another)",
                value: u64::from(h.parts),
            }
            .into());
        }
        frame.pop_header(HEADER_LEN);
        self.frames += 1;
        self.last_part = u64::from(h.part);
        out.push(frame);
        Ok(())
    }

    fn stats(&self) -> HalfStats {
        HalfStats {
            drops: 0,
            queue_depth: 0,
            counters: vec![("frames", self.frames), ("part", self.last_part)],
        }
    }
}

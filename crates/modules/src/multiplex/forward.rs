//! Source half of `multiplex`: marks every frame with its route; `split` cuts it in pieces.

use super::{Header, Mode};
use ndd_core::{Frame, Half, HalfStats, ModuleError, Output};
use std::time::Instant;

/// Marks (and for `split` cuts) every frame.
#[derive(Debug)]
pub struct MultiplexForward {
    mode: Mode,
    parts: u16,
    frames: u64,
    pieces: u64,
}

impl MultiplexForward {
    /// A forward half for `mode`, cutting frames in `parts` pieces when it is `split`.
    pub fn new(mode: Mode, parts: u16) -> MultiplexForward {
        MultiplexForward {
            mode,
            parts: parts.max(1),
            frames: 0,
            pieces: 0,
        }
    }
}

/// The byte range of piece `i` of `n` in a payload of `len` bytes: the first `len % n`
/// pieces are one byte longer than the others.
pub fn piece_range(len: usize, i: usize, n: usize) -> std::ops::Range<usize> {
    let n = n.max(1);
    let (base, extra) = (len / n, len % n);
    let start = i * base + i.min(extra);
    let end = start + base + usize::from(i < extra);
    start.min(len)..end.min(len)
}

impl Half for MultiplexForward {
    fn handle_frame(
        &mut self,
        _now: Instant,
        mut frame: Frame,
        out: &mut Output,
    ) -> Result<(), ModuleError> {
        self.frames += 1;
        match self.mode {
            Mode::All | Mode::RoundRobin => {
                let h = Header {
                    mode: self.mode,
                    part: 0,
                    parts: 1,
                };
                frame.push_header(&h.encode());
                self.pieces += 1;
                out.push(frame);
            }
            Mode::Split => {
                let n = usize::from(self.parts);
                let len = frame.len();
                for i in 0..n {
                    let r = piece_range(len, i, n);
                    let mut piece = Frame::new(frame.meta, &frame.payload()[r]);
                    let h = Header {
                        mode: Mode::Split,
                        part: i as u16,
                        parts: self.parts,
                    };
                    piece.push_header(&h.encode());
                    self.pieces += 1;
                    out.push(piece);
                }
            }
        }
        Ok(())
    }

    fn stats(&self) -> HalfStats {
        HalfStats {
            drops: 0,
            queue_depth: 0,
            counters: vec![("frames", self.frames), ("pieces", self.pieces)],
        }
    }
}

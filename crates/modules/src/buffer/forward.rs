//! Source half of `buffer`: releases frames against the sink's credit, holds the rest.

use super::{decode_refill, SOURCE_STALL};
use bytes::Bytes;
use ndd_core::{Frame, Half, HalfStats, ModuleError, Output};
use std::collections::VecDeque;
use std::time::Instant;

/// Releases one frame per unit of credit; holds at most `source_max` frames. Full, it is not
/// [`ready`](Half::ready) (a reliable stream's session stops feeding it); fed anyway (a lossy
/// stream), it drops the oldest.
#[derive(Debug)]
pub struct BufferForward {
    max: u64,
    source_max: usize,
    queue: VecDeque<Frame>,
    credit: u64,
    /// Since when frames have been held with no credit.
    held_since: Option<Instant>,
    released: u64,
    dropped_oldest: u64,
    refills: u64,
    self_refills: u64,
}

impl BufferForward {
    /// A source half with an initial credit of `max`, holding at most `source_max` frames.
    pub fn new(max: u32, source_max: u32) -> BufferForward {
        let max = u64::from(max.max(1));
        let source_max = source_max.max(1) as usize;
        BufferForward {
            max,
            source_max,
            queue: VecDeque::new(),
            credit: max,
            held_since: None,
            released: 0,
            dropped_oldest: 0,
            refills: 0,
            self_refills: 0,
        }
    }

    /// Releases what the credit allows and notes whether frames are now held without credit.
    fn release(&mut self, now: Instant, out: &mut Output) {
        while self.credit > 0 {
            let Some(f) = self.queue.pop_front() else {
                break;
            };
            self.credit -= 1;
            self.released += 1;
            out.push(f);
        }
        if self.queue.is_empty() {
            self.held_since = None;
        } else if self.held_since.is_none() {
            self.held_since = Some(now);
        }
    }
}

impl Half for BufferForward {
    fn handle_frame(
        &mut self,
        now: Instant,
        frame: Frame,
        out: &mut Output,
    ) -> Result<(), ModuleError> {
        self.queue.push_back(frame);
        self.release(now, out);
        while self.queue.len() > self.source_max {
            if let Some(old) = self.queue.pop_front() {
                self.dropped_oldest += 1;
                tracing::trace!(
                    stream = old.meta.stream,
                    seq = old.meta.seq,
                    "buffer: source full; oldest frame dropped"
                );
            }
        }
        Ok(())
    }

    fn handle_control(
        &mut self,
        now: Instant,
        msg: Bytes,
        out: &mut Output,
    ) -> Result<(), ModuleError> {
        let n = decode_refill(&msg)?;
        self.refills += 1;
        // Never more than the sink could ask for at once.
        self.credit = self.credit.saturating_add(u64::from(n)).min(self.max);
        self.release(now, out);
        Ok(())
    }

    fn handle_timeout(&mut self, now: Instant, out: &mut Output) {
        if self
            .held_since
            .is_some_and(|t| t + SOURCE_STALL <= now && self.credit == 0)
        {
            self.self_refills += 1;
            tracing::debug!(
                held = self.queue.len(),
                "buffer: no refill for {SOURCE_STALL:?}; source grants itself credit"
            );
            self.credit = self.max;
            self.held_since = None;
            self.release(now, out);
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.held_since.map(|t| t + SOURCE_STALL)
    }

    fn ready(&self) -> bool {
        self.queue.len() < self.source_max
    }

    fn flush(&mut self, out: &mut Output) {
        self.released += self.queue.len() as u64;
        for f in self.queue.drain(..) {
            out.push(f);
        }
        self.held_since = None;
    }

    fn stats(&self) -> HalfStats {
        HalfStats {
            drops: self.dropped_oldest,
            queue_depth: self.queue.len() as u64,
            counters: vec![
                ("released", self.released),
                ("credit", self.credit),
                ("dropped_oldest", self.dropped_oldest),
                ("refills", self.refills),
                ("self_refills", self.self_refills),
            ],
        }
    }
}

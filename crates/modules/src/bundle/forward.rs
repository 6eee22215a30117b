//! Source half of `bundle`: collects frames and emits them as one.

use super::format;
use ndd_core::frame::DEFAULT_HEADROOM;
use ndd_core::{Frame, Half, HalfStats, ModuleError, Output};
use std::time::{Duration, Instant};

/// Collects up to `count` frames (or `max_delay`, or `max_bytes`) into one frame.
#[derive(Debug)]
pub struct BundleForward {
    count: usize,
    max_delay: Duration,
    max_bytes: usize,
    pending: Vec<Frame>,
    pending_bytes: usize,
    deadline: Option<Instant>,
    bundles: u64,
}

impl BundleForward {
    /// A forward half with these limits (`count` ≥ 1).
    pub fn new(count: usize, max_delay: Duration, max_bytes: usize) -> BundleForward {
        BundleForward {
            count: count.max(1),
            max_delay,
            max_bytes,
            pending: Vec::with_capacity(count.max(1)),
            pending_bytes: 0,
            deadline: None,
            bundles: 0,
        }
    }

    fn emit(&mut self, out: &mut Output) {
        let Some(first) = self.pending.first() else {
            return;
        };
        let base = first.meta;
        let mut header = Vec::with_capacity(4 + 12 * self.pending.len());
        format::encode_header(
            &mut header,
            &base,
            self.pending.iter().map(|f| (f.meta, f.len())),
            self.pending.len(),
        );
        let mut frame = Frame::zeroed(base, DEFAULT_HEADROOM, header.len() + self.pending_bytes);
        let buf = frame.payload_mut();
        buf[..header.len()].copy_from_slice(&header);
        let mut off = header.len();
        for f in self.pending.drain(..) {
            buf[off..off + f.len()].copy_from_slice(f.payload());
            off += f.len();
        }
        self.pending_bytes = 0;
        self.deadline = None;
        self.bundles += 1;
        out.push(frame);
    }
}

impl Half for BundleForward {
    fn handle_frame(
        &mut self,
        now: Instant,
        frame: Frame,
        out: &mut Output,
    ) -> Result<(), ModuleError> {
        if !self.pending.is_empty() && self.pending_bytes + frame.len() > self.max_bytes {
            self.emit(out);
        }
        if self.pending.is_empty() {
            self.deadline = Some(now + self.max_delay);
        }
        self.pending_bytes += frame.len();
        self.pending.push(frame);
        if self.pending.len() >= self.count || self.deadline.is_some_and(|d| d <= now) {
            self.emit(out);
        }
        Ok(())
    }

    fn handle_timeout(&mut self, now: Instant, out: &mut Output) {
        if self.deadline.is_some_and(|d| d <= now) {
            self.emit(out);
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.deadline
    }

    fn flush(&mut self, out: &mut Output) {
        self.emit(out);
    }

    fn stats(&self) -> HalfStats {
        HalfStats {
            drops: 0,
            queue_depth: self.pending.len() as u64,
            counters: vec![("bundles", self.bundles)],
        }
    }
}

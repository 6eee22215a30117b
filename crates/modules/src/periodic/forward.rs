//! Source half of `periodic`: holds the newest frame and emits it on a fixed grid of ticks.

use crate::seq::RisingSeq;
use bytes::Bytes;
use ndd_core::{Frame, Half, HalfStats, Meta, ModuleError, Output};
use std::time::{Duration, Instant};

/// Emits the newest frame every `interval` (see the pair's docs for the grid and seq rules).
#[derive(Debug)]
pub struct PeriodicForward {
    interval: Duration,
    repeat: bool,
    /// The next tick of the grid; `None` before the first frame and after a flush.
    next_tick: Option<Instant>,
    /// The newest frame not yet emitted.
    pending: Option<Frame>,
    /// The frame emitted last, kept for repeats (only with `repeat`).
    last: Option<(Meta, Bytes)>,
    seq: RisingSeq,
    superseded: u64,
    emitted: u64,
    repeats: u64,
}

impl PeriodicForward {
    /// A forward half emitting every `interval` (at least 1 ns is used), re-emitting the last
    /// frame at empty ticks if `repeat`.
    pub fn new(interval: Duration, repeat: bool) -> PeriodicForward {
        PeriodicForward {
            interval: interval.max(Duration::from_nanos(1)),
            repeat,
            next_tick: None,
            pending: None,
            last: None,
            seq: RisingSeq::default(),
            superseded: 0,
            emitted: 0,
            repeats: 0,
        }
    }

    fn emit_fresh(&mut self, mut frame: Frame, out: &mut Output) {
        frame.meta.seq = self.seq.take(frame.meta.seq);
        self.emitted += 1;
        if self.repeat {
            let meta = frame.meta;
            let bytes = frame.into_bytes();
            out.push(Frame::from_bytes(meta, bytes.clone()));
            self.last = Some((meta, bytes));
        } else {
            out.push(frame);
        }
    }

    fn emit_repeat(&mut self, out: &mut Output) {
        let Some((meta, _)) = self.last else {
            return;
        };
        let seq = self.seq.take(meta.seq);
        if let Some((meta, bytes)) = &mut self.last {
            meta.seq = seq;
            out.push(Frame::from_bytes(*meta, bytes.clone()));
            self.emitted += 1;
            self.repeats += 1;
        }
    }

    /// Services the tick if it is due: before `now` (`inclusive` = false: a frame arriving at
    /// `now` belongs to the tick at `now`), or at or before `now` (`inclusive` = true). Emits
    /// at most once, then moves the grid past the ticks missed.
    fn tick(&mut self, now: Instant, inclusive: bool, out: &mut Output) {
        let Some(t) = self.next_tick else {
            return;
        };
        if !(t < now || (inclusive && t == now)) {
            return;
        }
        if let Some(f) = self.pending.take() {
            self.emit_fresh(f, out);
        } else if self.repeat {
            self.emit_repeat(out);
        }
        let iv = self.interval.as_nanos();
        let late = now.saturating_duration_since(t).as_nanos();
        // inclusive: the first tick after `now`; otherwise the first at or after `now`.
        let k = if inclusive {
            late / iv + 1
        } else {
            late.div_ceil(iv)
        };
        self.next_tick = u64::try_from(k.saturating_mul(iv))
            .ok()
            .and_then(|ns| t.checked_add(Duration::from_nanos(ns)));
    }
}

impl Half for PeriodicForward {
    fn handle_frame(
        &mut self,
        now: Instant,
        frame: Frame,
        out: &mut Output,
    ) -> Result<(), ModuleError> {
        // A tick overdue (the runtime is late) goes out before this frame replaces its frame.
        self.tick(now, false, out);
        if self.pending.replace(frame).is_some() {
            self.superseded += 1;
        }
        if self.next_tick.is_none() {
            self.next_tick = now.checked_add(self.interval);
        }
        Ok(())
    }

    fn handle_control(
        &mut self,
        _now: Instant,
        msg: Bytes,
        _out: &mut Output,
    ) -> Result<(), ModuleError> {
        Err(super::no_control(msg.len()))
    }

    fn handle_timeout(&mut self, now: Instant, out: &mut Output) {
        self.tick(now, true, out);
    }

    fn poll_timeout(&self) -> Option<Instant> {
        if self.pending.is_some() || (self.repeat && self.last.is_some()) {
            self.next_tick
        } else {
            None
        }
    }

    fn flush(&mut self, out: &mut Output) {
        if let Some(f) = self.pending.take() {
            self.emit_fresh(f, out);
        }
        self.next_tick = None;
        self.last = None;
    }

    fn stats(&self) -> HalfStats {
        HalfStats {
            drops: self.superseded,
            queue_depth: u64::from(self.pending.is_some()),
            counters: vec![
                ("superseded", self.superseded),
                ("emitted", self.emitted),
                ("repeats", self.repeats),
            ],
        }
    }
}

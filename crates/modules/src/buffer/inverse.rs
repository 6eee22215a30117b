//! Sink half of `buffer`: holds frames, releases them with their original spacing, asks the
//! source half for refills.

use super::{encode_refill, MAX_SKEW};
use ndd_core::{Frame, Half, HalfStats, ModuleError, Output};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Signed `a − b` in ns.
fn signed_ns(a: Instant, b: Instant) -> i128 {
    if a >= b {
        (a - b).as_nanos() as i128
    } else {
        -((b - a).as_nanos() as i128)
    }
}

/// Releases frames at `anchor + (timestamp − anchor timestamp)`; sends `refill` when it holds
/// fewer than `min` frames.
#[derive(Debug)]
pub struct BufferInverse {
    min: usize,
    max: usize,
    playout: Duration,
    /// Frames held, in timestamp order.
    queue: VecDeque<Frame>,
    /// Arrival of the first frame (of the current schedule), until playout starts.
    first_arrival: Option<Instant>,
    started: bool,
    /// (local instant, source timestamp) the schedule is measured from.
    anchor: Option<(Instant, u64)>,
    /// Due time, timestamp and sequence number of the last frame released.
    last: Option<(Instant, u64, u64)>,
    /// Timestamp gap between the last two frames released (the expected period).
    gap: Option<Duration>,
    /// The queue ran empty and the underrun has been counted.
    in_underrun: bool,
    /// (arrival, timestamp) that transit times are measured from, and the smallest transit
    /// (arrival − timestamp, relative to it) seen, in ns.
    reference: Option<(Instant, u64)>,
    min_transit: i128,
    underruns: u64,
    late: u64,
    stale: u64,
    restarts: u64,
    reanchors: u64,
    requests: u64,
}

impl BufferInverse {
    /// A sink half that refills below `min` up to `max` and waits at most `playout` after the
    /// first arrival before it starts releasing.
    pub fn new(min: u32, max: u32, playout: Duration) -> BufferInverse {
        let max = max.max(1) as usize;
        BufferInverse {
            min: (min as usize).clamp(1, max),
            max,
            playout,
            queue: VecDeque::new(),
            first_arrival: None,
            started: false,
            anchor: None,
            last: None,
            gap: None,
            in_underrun: false,
            reference: None,
            min_transit: 0,
            underruns: 0,
            late: 0,
            stale: 0,
            restarts: 0,
            reanchors: 0,
            requests: 0,
        }
    }

    /// When a frame with timestamp `ts` is due under the current anchor (`None` before playout
    /// starts; the anchor instant for timestamps before the anchor's).
    fn due(&self, ts: u64) -> Option<Instant> {
        let (at, ats) = self.anchor?;
        let ahead = ts.saturating_sub(ats);
        Some(at.checked_add(Duration::from_nanos(ahead)).unwrap_or(at))
    }

    /// Current delay the schedule adds on top of the fastest transit seen, in µs.
    fn delay_us(&self) -> u64 {
        let (Some((at, ats)), Some((rt, rts))) = (self.anchor, self.reference) else {
            return 0;
        };
        let offset = signed_ns(at, rt) - (ats as i128 - rts as i128);
        ((offset - self.min_transit).max(0) / 1000) as u64
    }

    fn note_transit(&mut self, now: Instant, ts: u64) {
        match self.reference {
            None => {
                self.reference = Some((now, ts));
                self.min_transit = 0;
            }
            Some((rt, rts)) => {
                let transit = signed_ns(now, rt) - (ts as i128 - rts as i128);
                self.min_transit = self.min_transit.min(transit);
            }
        }
    }

    fn request(&mut self, out: &mut Output) {
        let want = self.max.saturating_sub(self.queue.len());
        if want > 0 {
            self.requests += 1;
            out.control(encode_refill(u32::try_from(want).unwrap_or(u32::MAX)).to_vec());
        }
    }

    fn start(&mut self, now: Instant) {
        if let Some(head) = self.queue.front() {
            self.started = true;
            self.anchor = Some((now, head.meta.timestamp_ns));
        }
    }

    /// The schedule starts again at `ts` (source clock jumped): what is held goes out now.
    fn restart(&mut self, now: Instant, ts: u64, out: &mut Output) {
        self.restarts += 1;
        tracing::debug!("buffer: source clock moved; schedule restarted");
        for f in self.queue.drain(..) {
            out.push(f);
        }
        self.anchor = Some((now, ts));
        self.last = None;
        self.gap = None;
        self.reference = Some((now, ts));
        self.min_transit = 0;
    }

    /// Releases every frame that is due; asks for a refill if that leaves fewer than `min`.
    fn release_due(&mut self, now: Instant, out: &mut Output) {
        if !self.started {
            return;
        }
        let mut released = false;
        while let Some(ts) = self.queue.front().map(|f| f.meta.timestamp_ns) {
            let Some(due) = self.due(ts) else { break };
            if due > now {
                if due > now + self.playout + MAX_SKEW {
                    // Far ahead of the schedule: the source clock jumped forward.
                    self.restarts += 1;
                    self.anchor = Some((now, ts));
                    self.reference = Some((now, ts));
                    self.min_transit = 0;
                    continue;
                }
                break;
            }
            let Some(f) = self.queue.pop_front() else {
                break;
            };
            if let Some((_, lts, _)) = self.last {
                if ts > lts {
                    self.gap = Some(Duration::from_nanos(ts - lts));
                }
            }
            self.last = Some((due, ts, f.meta.seq));
            out.push(f);
            released = true;
        }
        if released {
            self.in_underrun = false;
            if self.queue.len() < self.min {
                self.request(out);
            }
        }
        self.catch_up(now, out);
    }

    /// More than twice `max` frames held is a backlog, not the refill overshoot of frames
    /// already in flight (at most one refill, `max`): frames resent after a stall or an
    /// outage. Played with their original spacing they would add the stall's length to every
    /// later frame, for good. So the excess above `max` goes out now and the schedule is
    /// anchored again at the head: the added delay is back to at most `max` frames.
    fn catch_up(&mut self, now: Instant, out: &mut Output) {
        if !self.started || self.queue.len() <= 2 * self.max {
            return;
        }
        while self.queue.len() > self.max {
            let Some(f) = self.queue.pop_front() else {
                break;
            };
            let ts = f.meta.timestamp_ns;
            if let Some((_, lts, _)) = self.last {
                if ts > lts {
                    self.gap = Some(Duration::from_nanos(ts - lts));
                }
            }
            self.last = Some((now, ts, f.meta.seq));
            out.push(f);
        }
        if let Some(head) = self.queue.front() {
            self.anchor = Some((now, head.meta.timestamp_ns));
        }
        self.reanchors += 1;
        self.in_underrun = false;
    }

    /// When the queue is empty: the instant the next frame was expected.
    fn underrun_at(&self) -> Option<Instant> {
        if !self.started || !self.queue.is_empty() || self.in_underrun {
            return None;
        }
        let (due, _, _) = self.last?;
        Some(due + self.gap?)
    }
}

impl Half for BufferInverse {
    fn handle_frame(
        &mut self,
        now: Instant,
        frame: Frame,
        out: &mut Output,
    ) -> Result<(), ModuleError> {
        // Frames due at this very instant go first.
        self.release_due(now, out);
        let ts = frame.meta.timestamp_ns;
        if self.started {
            if let Some((_, lts, lseq)) = self.last {
                if lts.saturating_sub(ts) > MAX_SKEW.as_nanos() as u64 {
                    self.restart(now, ts, out);
                } else if ts < lts || (ts == lts && frame.meta.seq <= lseq) {
                    // A newer frame is already out (or this very one, resent after a
                    // reconnect): this one can only be stale.
                    self.stale += 1;
                    tracing::trace!(
                        stream = frame.meta.stream,
                        seq = frame.meta.seq,
                        "buffer: frame arrived after a newer one was released; dropped"
                    );
                    return Ok(());
                }
            }
            if self.due(ts).is_some_and(|due| due < now) {
                // Too late for the schedule: start it again from this frame.
                self.late += 1;
                self.anchor = Some((now, ts));
            }
        }
        self.note_transit(now, ts);
        let pos = self.queue.partition_point(|f| f.meta.timestamp_ns <= ts);
        self.queue.insert(pos, frame);
        if !self.started {
            let first = *self.first_arrival.get_or_insert(now);
            if self.queue.len() >= self.min || now >= first + self.playout {
                self.start(now);
            }
        }
        self.release_due(now, out);
        Ok(())
    }

    fn handle_timeout(&mut self, now: Instant, out: &mut Output) {
        if !self.started && self.first_arrival.is_some_and(|t| t + self.playout <= now) {
            self.start(now);
        }
        self.release_due(now, out);
        if self.underrun_at().is_some_and(|t| t <= now) {
            self.underruns += 1;
            self.in_underrun = true;
            self.request(out);
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        if !self.started {
            if self.queue.is_empty() {
                return None;
            }
            return self.first_arrival.map(|t| t + self.playout);
        }
        match self.queue.front() {
            Some(f) => self.due(f.meta.timestamp_ns),
            None => self.underrun_at(),
        }
    }

    fn flush(&mut self, out: &mut Output) {
        for f in self.queue.drain(..) {
            out.push(f);
        }
        if !self.started {
            self.first_arrival = None;
        }
    }

    fn stats(&self) -> HalfStats {
        HalfStats {
            drops: self.stale,
            queue_depth: self.queue.len() as u64,
            counters: vec![
                ("underruns", self.underruns),
                ("late", self.late),
                ("requests", self.requests),
                ("delay_us", self.delay_us()),
                ("stale", self.stale),
                ("restarts", self.restarts),
                ("reanchors", self.reanchors),
            ],
        }
    }
}

//! Source half of `latest`: sends while it has credit, otherwise keeps only the newest frame.

use super::decode_ack;
use bytes::Bytes;
use ndd_core::{Frame, Half, HalfStats, ModuleError, Output};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// At most `in_flight` frames unacknowledged; while none may go, only the newest waits.
#[derive(Debug)]
pub struct LatestForward {
    in_flight: usize,
    timeout: Duration,
    /// (sequence, sent at) of frames not yet acknowledged, in the order sent.
    unacked: VecDeque<(u64, Instant)>,
    held: Option<Frame>,
    sent: u64,
    spoiled: u64,
    acks: u64,
    timeouts: u64,
}

impl LatestForward {
    /// A forward half allowing `in_flight` (≥ 1) unacknowledged frames; one unacknowledged
    /// for `timeout` counts as lost.
    pub fn new(in_flight: u32, timeout: Duration) -> LatestForward {
        LatestForward {
            in_flight: in_flight.max(1) as usize,
            timeout,
            unacked: VecDeque::new(),
            held: None,
            sent: 0,
            spoiled: 0,
            acks: 0,
            timeouts: 0,
        }
    }

    fn send(&mut self, now: Instant, frame: Frame, out: &mut Output) {
        self.unacked.push_back((frame.meta.seq, now));
        self.sent += 1;
        out.push(frame);
    }

    fn send_held(&mut self, now: Instant, out: &mut Output) {
        if self.unacked.len() < self.in_flight {
            if let Some(f) = self.held.take() {
                self.send(now, f, out);
            }
        }
    }
}

impl Half for LatestForward {
    fn handle_frame(
        &mut self,
        now: Instant,
        frame: Frame,
        out: &mut Output,
    ) -> Result<(), ModuleError> {
        if self.unacked.len() < self.in_flight {
            // Credit (and so nothing held): straight out.
            self.send(now, frame, out);
        } else if let Some(old) = self.held.replace(frame) {
            self.spoiled += 1;
            tracing::trace!(
                stream = old.meta.stream,
                seq = old.meta.seq,
                "latest: frame spoiled by a newer one"
            );
        }
        Ok(())
    }

    fn handle_control(
        &mut self,
        now: Instant,
        msg: Bytes,
        out: &mut Output,
    ) -> Result<(), ModuleError> {
        let seq = decode_ack(&msg)?;
        self.acks += 1;
        // Everything sent up to the acknowledged frame is settled: delivered, or lost on the
        // way (the sink never waits for an older frame once a newer one is through).
        if let Some(pos) = self.unacked.iter().position(|(s, _)| *s == seq) {
            self.unacked.drain(..=pos);
        }
        self.send_held(now, out);
        Ok(())
    }

    fn handle_timeout(&mut self, now: Instant, out: &mut Output) {
        while self
            .unacked
            .front()
            .is_some_and(|(_, t)| *t + self.timeout <= now)
        {
            if let Some((seq, _)) = self.unacked.pop_front() {
                self.timeouts += 1;
                tracing::debug!(seq, "latest: no ack in time; frame taken as lost");
            }
        }
        self.send_held(now, out);
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.unacked.front().map(|(_, t)| *t + self.timeout)
    }

    fn flush(&mut self, out: &mut Output) {
        if let Some(f) = self.held.take() {
            self.sent += 1;
            out.push(f);
        }
    }

    fn stats(&self) -> HalfStats {
        HalfStats {
            drops: self.spoiled,
            queue_depth: u64::from(self.held.is_some()),
            counters: vec![
                ("spoiled", self.spoiled),
                ("sent", self.sent),
                ("in_flight", self.unacked.len() as u64),
                ("acks", self.acks),
                ("timeouts", self.timeouts),
            ],
        }
    }
}

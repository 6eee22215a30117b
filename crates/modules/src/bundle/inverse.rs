//! Sink half of `bundle`: unpacks bundles and releases their frames with the original spacing.

use super::format;
use ndd_core::{Frame, FrameError, Half, HalfStats, ModuleError, Output};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// A bundle whose first frame would be due more than this far in the future means the source
/// clock jumped (or restarted): the schedule starts again instead of holding frames.
const MAX_AHEAD: Duration = Duration::from_secs(2);

/// How long every bundle must have come well ahead of the schedule before it moves earlier
/// (at 16 ms a record and 4 records a bundle, 8 bundles)…
const CATCH_UP_WINDOW: Duration = Duration::from_millis(500);
/// …and what "well ahead" is, beyond `playout`: more than jitter usually moves a bundle.
const CATCH_UP_SLACK: Duration = Duration::from_millis(100);

/// Unpacks bundles; releases frames at `anchor + (timestamp − anchor timestamp)`.
#[derive(Debug)]
pub struct BundleInverse {
    playout: Duration,
    /// (local instant, source timestamp) the schedule is measured from.
    anchor: Option<(Instant, u64)>,
    queue: VecDeque<(Instant, Frame)>,
    late: u64,
    reanchors: u64,
    /// Since when, and by how little at least, every bundle came ahead of its schedule.
    lead: Option<(Instant, Duration)>,
    catch_ups: u64,
}

impl BundleInverse {
    /// An inverse half that adds `playout` before its first release.
    pub fn new(playout: Duration) -> BundleInverse {
        BundleInverse {
            playout,
            anchor: None,
            queue: VecDeque::new(),
            late: 0,
            reanchors: 0,
            lead: None,
            catch_ups: 0,
        }
    }

    /// A bundle came `lead` ahead of its schedule. When every bundle of the last
    /// [`CATCH_UP_WINDOW`] came more than `playout` + [`CATCH_UP_SLACK`] ahead, the schedule
    /// runs behind the live stream (a burst after a link outage re-anchored it on old frames,
    /// and every later bundle keeps that delay): it moves earlier by the smallest of those
    /// leads less `playout`, and what is queued is released that much earlier (at once if
    /// that is now). A bundle closer to its schedule starts the window again.
    fn catch_up(&mut self, now: Instant, lead: Duration) {
        if lead <= self.playout + CATCH_UP_SLACK {
            self.lead = None;
            return;
        }
        let Some((since, least)) = self.lead else {
            self.lead = Some((now, lead));
            return;
        };
        let least = least.min(lead);
        if now.saturating_duration_since(since) < CATCH_UP_WINDOW {
            self.lead = Some((since, least));
            return;
        }
        self.lead = None;
        let excess = least - self.playout;
        let Some((at, ts)) = self.anchor else { return };
        self.anchor = Some((at.checked_sub(excess).unwrap_or(at), ts));
        for (due, _) in self.queue.iter_mut() {
            *due = due.checked_sub(excess).unwrap_or(now).max(now);
        }
        self.catch_ups += 1;
        tracing::debug!(
            ms = excess.as_millis() as u64,
            "bundle: schedule behind the live stream; moved earlier"
        );
    }

    fn due(anchor: (Instant, u64), ts: u64) -> Option<Instant> {
        let ahead = ts.checked_sub(anchor.1)?;
        anchor.0.checked_add(Duration::from_nanos(ahead))
    }

    fn release_due(&mut self, now: Instant, out: &mut Output) {
        while self.queue.front().is_some_and(|(due, _)| *due <= now) {
            if let Some((_, f)) = self.queue.pop_front() {
                out.push(f);
            }
        }
    }
}

impl Half for BundleInverse {
    fn handle_frame(
        &mut self,
        now: Instant,
        mut frame: Frame,
        out: &mut Output,
    ) -> Result<(), ModuleError> {
        let entries = format::decode(&frame.meta, frame.payload())?;
        let first_ts = entries[0].meta.timestamp_ns;
        let anchor = match self.anchor {
            None => (now + self.playout, first_ts),
            Some(a) => match Self::due(a, first_ts) {
                Some(due) if due < now => {
                    // Too late to keep the schedule: start it again from this bundle.
                    self.late += 1;
                    self.reanchors += 1;
                    (now, first_ts)
                }
                Some(due) if due <= now + self.playout + MAX_AHEAD => a,
                _ => {
                    self.reanchors += 1;
                    tracing::debug!(
                        seq = frame.meta.seq,
                        "bundle: source clock moved; schedule restarted"
                    );
                    (now + self.playout, first_ts)
                }
            },
        };
        self.anchor = Some(anchor);
        if let Some(due) = Self::due(anchor, first_ts) {
            self.catch_up(now, due.saturating_duration_since(now));
        }
        let anchor = self.anchor.unwrap_or(anchor);
        let mut last_due = self.queue.back().map(|(d, _)| *d).unwrap_or(now);
        for e in &entries {
            let Some(bytes) = frame.slice_payload(e.offset..e.offset + e.len) else {
                return Err(ModuleError::from(FrameError::Invalid {
                    pair: super::PAIR,
                    rule: "entry outside payload",
                }));
            };
            // Keep release order even if timestamps step back.
            let due = Self::due(anchor, e.meta.timestamp_ns)
                .unwrap_or(last_due)
                .max(last_due);
            last_due = due;
            self.queue
                .push_back((due, Frame::from_bytes(e.meta, bytes)));
        }
        self.release_due(now, out);
        Ok(())
    }

    fn handle_timeout(&mut self, now: Instant, out: &mut Output) {
        self.release_due(now, out);
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.queue.front().map(|(d, _)| *d)
    }

    fn flush(&mut self, out: &mut Output) {
        for (_, f) in self.queue.drain(..) {
            out.push(f);
        }
    }

    fn stats(&self) -> HalfStats {
        HalfStats {
            drops: 0,
            queue_depth: self.queue.len() as u64,
            counters: vec![
                ("late", self.late),
                ("reanchors", self.reanchors),
                ("catch_ups", self.catch_ups),
            ],
        }
    }
}

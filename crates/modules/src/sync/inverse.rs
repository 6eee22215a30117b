//! Sink half of `sync`: holds frames until the other members of the group have caught up,
//! or the delay bound expires.

use super::SyncGroup;
use ndd_core::{Frame, Half, HalfStats, ModuleError, Output};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Holds frames of one member of a sync group.
#[derive(Debug)]
pub struct SyncInverse {
    group: Arc<Mutex<SyncGroup>>,
    member: usize,
    max_delay: Duration,
    held: VecDeque<(Instant, Frame)>,
    /// The last `now` this half was given: a deadline already reached is reported as this
    /// instant (halves read no clock).
    last_now: Option<Instant>,
    in_order: u64,
    timed_out: u64,
}

impl SyncInverse {
    /// A new member of `group`.
    pub fn new(group: Arc<Mutex<SyncGroup>>, max_delay: Duration) -> SyncInverse {
        let member = lock(&group).join();
        SyncInverse {
            group,
            member,
            max_delay,
            held: VecDeque::new(),
            last_now: None,
            in_order: 0,
            timed_out: 0,
        }
    }

    fn release(&mut self, now: Instant, out: &mut Output) {
        self.last_now = Some(now);
        loop {
            let Some((arrived, f)) = self.held.front() else {
                return;
            };
            let ready = lock(&self.group).others_reached(self.member, f.meta.timestamp_ns);
            let expired = now >= *arrived + self.max_delay;
            if !ready && !expired {
                return;
            }
            if ready {
                self.in_order += 1;
            } else {
                self.timed_out += 1;
            }
            if let Some((_, f)) = self.held.pop_front() {
                out.push(f);
            }
        }
    }
}

fn lock(g: &Mutex<SyncGroup>) -> std::sync::MutexGuard<'_, SyncGroup> {
    // A poisoned lock only means another member panicked mid-update of plain integers.
    g.lock().unwrap_or_else(|e| e.into_inner())
}

impl Half for SyncInverse {
    fn handle_frame(
        &mut self,
        now: Instant,
        frame: Frame,
        out: &mut Output,
    ) -> Result<(), ModuleError> {
        lock(&self.group).advance(self.member, frame.meta.timestamp_ns);
        self.held.push_back((now, frame));
        self.release(now, out);
        Ok(())
    }

    fn handle_timeout(&mut self, now: Instant, out: &mut Output) {
        self.release(now, out);
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let (arrived, f) = self.held.front()?;
        // Another member may have caught up since our last call: then we are due at once.
        if lock(&self.group).others_reached(self.member, f.meta.timestamp_ns) {
            return self.last_now.or(Some(*arrived));
        }
        Some(*arrived + self.max_delay)
    }

    fn flush(&mut self, out: &mut Output) {
        for (_, f) in self.held.drain(..) {
            out.push(f);
        }
    }

    fn stats(&self) -> HalfStats {
        HalfStats {
            drops: 0,
            queue_depth: self.held.len() as u64,
            counters: vec![("in_order", self.in_order), ("timed_out", self.timed_out)],
        }
    }
}

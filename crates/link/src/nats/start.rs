//! A device side's start (sans-IO): what it does before its run begins, in the order each
//! step's reason needs. The driver's `drive/device.rs` and `testkit/tests/nats_ending.rs`
//! do what [`DeviceStart::poll_io`] asks and hand the outcomes back; before 2026-12-02 each
//! wrote the order out for itself, and the simulation marked its run and read where the stream
//! stood before its claim of the driver, where the driver does both after.
//!
//! 1. **Joins are heard from first** ([`StartIo::SubscribeJoins`]): an app side's reliable
//!    stream asks for the keys once its END is stored (confirming the device's run), and that
//!    question must either reach this side, to be answered with the new run, or find nobody
//!    and come before the run began — never fall between. (Found under load: a device side
//!    that read where the stream stood, then spent its claim's 500 ms deaf to joins, refused
//!    the last frames an app side sealed for the run before, and waited for them for good.)
//! 2. **The run's id is reserved** in the home ([`StartIo::ReserveRun`]): a process that dies
//!    before its run begins leaves it taken, so the next run's id is higher than any marked.
//! 3. **The driver is claimed** with it ([`StartIo::Claim`]): a second device side stops
//!    here, before it marks anything.
//! 4. **The run is marked** in the JetStream stream ([`StartIo::Mark`], signed): an app side
//!    that confirms the device's run while no device side serves finds the mark of any run
//!    that may refuse its last frames (`follow::Follower::behind`). Then, beside the run and
//!    not waited for, the marks of earlier runs stored before it are purged
//!    ([`StartIo::PurgeEarlierMarks`]; not when the mark is the stream's first message: a
//!    purge "below" sequence 1 is nats-server's purge of the whole subject).
//! 5. **Where the stream stands is read** ([`StartIo::ReadEnd`]) after the mark: the run
//!    begins after it (earlier runs' frames stored later are replays, `super::runs`).
//! 6. **The run begins** ([`StartIo::Begin`]): noted in the home; the keys name it, and the
//!    join service answers from then on.
//!
//! Without JetStream (lossy streams only) there is no mark and the run begins after 0.
//!
//! A JetStream step that fails ([`DeviceStart::handle_failed`]: the mark, where the stream
//! stands) is tried again, [`STEP_RETRY`] later and doubling up to 2 s, for
//! [`STEP_RETRY_FOR`] from its first failure: a cluster electing the stream's leader after a
//! node went answers "no stream found for given subject" for a few seconds. (Found by a test
//! that kills the stream's leader as a device side starts: the side exited with those words.)
//! The mark is published with a message id naming its run, so a retry of one that was stored
//! is not stored twice.

use std::time::{Duration, Instant};

/// The first wait before a failed JetStream step is tried again (doubling up to 2 s).
pub const STEP_RETRY: Duration = Duration::from_millis(250);
/// How long a failed JetStream step is tried again before the start gives up.
pub const STEP_RETRY_FOR: Duration = Duration::from_secs(20);

/// What a [`DeviceStart`] asks its driver for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartIo {
    /// Subscribe to the join subject (answered once the run began):
    /// [`DeviceStart::handle_subscribed`].
    SubscribeJoins,
    /// Reserve the run's id in the home: [`DeviceStart::handle_reserved`].
    ReserveRun,
    /// Claim the driver with run `run` (a second device side stops here):
    /// [`DeviceStart::handle_claimed`].
    Claim {
        /// The run's id.
        run: u64,
    },
    /// Store run `run`'s signed mark on its subject: [`DeviceStart::handle_marked`] with the
    /// stream sequence it was stored at.
    Mark {
        /// The run's id.
        run: u64,
    },
    /// Purge, beside the run and without waiting, the marks of runs below `run` stored
    /// before stream sequence `before` (nothing to hand back).
    PurgeEarlierMarks {
        /// The run's id.
        run: u64,
        /// Its mark's stream sequence.
        before: u64,
    },
    /// Read the stream's last sequence: [`DeviceStart::handle_end`].
    ReadEnd,
    /// Begin run `run` after stream sequence `began` (noted in the home, the keys naming it):
    /// [`DeviceStart::handle_begun`].
    Begin {
        /// The run's id.
        run: u64,
        /// The stream sequence it begins after.
        began: u64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Subscribe,
    Reserve,
    Claim(u64),
    Mark(u64),
    Purge(u64, u64),
    ReadEnd(u64),
    Begin(u64, u64),
    Done,
}

/// A start that gave up on a failed step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GaveUp;

/// One device process's start (see the module's documentation).
#[derive(Debug, Clone)]
pub struct DeviceStart {
    stored: bool,
    step: Step,
    /// The step's I/O went to the driver; its outcome is awaited.
    asked: bool,
    /// A failed step: when it failed first, when it is tried again, the wait after the next
    /// failure.
    retry: Option<(Instant, Instant, Duration)>,
}

impl DeviceStart {
    /// A start; `stored`: the driver's streams use JetStream (the run is marked in it).
    pub fn new(stored: bool) -> DeviceStart {
        DeviceStart {
            stored,
            step: Step::Subscribe,
            asked: false,
            retry: None,
        }
    }

    /// The next I/O, once the one before was handed back (and, after a failure, once
    /// [`DeviceStart::poll_timeout`] passed).
    pub fn poll_io(&mut self, now: Instant) -> Option<StartIo> {
        if self.asked || self.retry.is_some_and(|(_, at, _)| now < at) {
            return None;
        }
        let io = match self.step {
            Step::Subscribe => StartIo::SubscribeJoins,
            Step::Reserve => StartIo::ReserveRun,
            Step::Claim(run) => StartIo::Claim { run },
            Step::Mark(run) => StartIo::Mark { run },
            Step::Purge(run, before) => {
                // Not waited for: the run goes on at once.
                self.step = Step::ReadEnd(run);
                return Some(StartIo::PurgeEarlierMarks { run, before });
            }
            Step::ReadEnd(_) => StartIo::ReadEnd,
            Step::Begin(run, began) => StartIo::Begin { run, began },
            Step::Done => return None,
        };
        self.asked = true;
        Some(io)
    }

    fn next(&mut self, from: Step, to: Step) {
        if self.asked && self.step == from {
            self.asked = false;
            self.retry = None;
            self.step = to;
        }
    }

    /// The step asked for failed at `now`; `passing`: with an error that passes by itself
    /// (`super::store::passes`). `Ok`: it is asked again once [`DeviceStart::poll_timeout`]
    /// passed; `Err`: the start gives up (an error that does not pass, a step that is not
    /// JetStream's, or one that failed for [`STEP_RETRY_FOR`]).
    pub fn handle_failed(&mut self, now: Instant, passing: bool) -> Result<Duration, GaveUp> {
        if !passing || !self.asked || !matches!(self.step, Step::Mark(_) | Step::ReadEnd(_)) {
            return Err(GaveUp);
        }
        let (first, _, wait) = self.retry.unwrap_or((now, now, STEP_RETRY));
        if now.saturating_duration_since(first) >= STEP_RETRY_FOR {
            return Err(GaveUp);
        }
        self.asked = false;
        self.retry = Some((first, now + wait, (wait * 2).min(Duration::from_secs(2))));
        Ok(wait)
    }

    /// When a failed step is asked again.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.retry.map(|(_, at, _)| at)
    }

    /// Subscribed to the join subject.
    pub fn handle_subscribed(&mut self) {
        self.next(Step::Subscribe, Step::Reserve);
    }

    /// The run's id, reserved.
    pub fn handle_reserved(&mut self, run: u64) {
        self.next(Step::Reserve, Step::Claim(run));
    }

    /// The driver is this side's.
    pub fn handle_claimed(&mut self) {
        if let Step::Claim(run) = self.step {
            let to = if self.stored {
                Step::Mark(run)
            } else {
                Step::Begin(run, 0)
            };
            self.next(Step::Claim(run), to);
        }
    }

    /// The run's mark is stored at stream sequence `seq`.
    pub fn handle_marked(&mut self, seq: u64) {
        if let Step::Mark(run) = self.step {
            // (Nothing is stored before the first message: no purge.)
            let to = if seq > 1 {
                Step::Purge(run, seq)
            } else {
                Step::ReadEnd(run)
            };
            self.next(Step::Mark(run), to);
        }
    }

    /// The stream's last sequence.
    pub fn handle_end(&mut self, last: u64) {
        if let Step::ReadEnd(run) = self.step {
            self.next(Step::ReadEnd(run), Step::Begin(run, last));
        }
    }

    /// The run began: the join service answers, the keeper and the streams start.
    pub fn handle_begun(&mut self) {
        if let Step::Begin(run, began) = self.step {
            self.next(Step::Begin(run, began), Step::Done);
        }
    }

    /// The run began.
    pub fn is_done(&self) -> bool {
        self.step == Step::Done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drives a start, answering each step; the steps asked for, in order.
    fn steps(stored: bool, mark_at: u64) -> Vec<StartIo> {
        let now = Instant::now();
        let mut s = DeviceStart::new(stored);
        let mut seen = Vec::new();
        while let Some(io) = s.poll_io(now) {
            if !matches!(io, StartIo::PurgeEarlierMarks { .. }) {
                assert_eq!(s.poll_io(now), None, "one step at a time");
            }
            seen.push(io);
            match io {
                StartIo::SubscribeJoins => s.handle_subscribed(),
                StartIo::ReserveRun => s.handle_reserved(7),
                StartIo::Claim { .. } => s.handle_claimed(),
                StartIo::Mark { .. } => s.handle_marked(mark_at),
                StartIo::PurgeEarlierMarks { .. } => {}
                StartIo::ReadEnd => s.handle_end(mark_at + 3),
                StartIo::Begin { .. } => s.handle_begun(),
            }
        }
        assert!(s.is_done());
        seen
    }

    #[test]
    fn joins_are_heard_before_the_claim_and_the_mark_comes_before_where_the_run_begins() {
        use StartIo::*;
        assert_eq!(
            steps(true, 40),
            [
                SubscribeJoins,
                ReserveRun,
                Claim { run: 7 },
                Mark { run: 7 },
                PurgeEarlierMarks { run: 7, before: 40 },
                ReadEnd,
                Begin { run: 7, began: 43 }
            ]
        );
        // The stream's first message: nothing to purge.
        assert!(!steps(true, 1)
            .iter()
            .any(|io| matches!(io, PurgeEarlierMarks { .. })));
        // No JetStream: no mark, the run begins after 0.
        assert_eq!(
            steps(false, 0),
            [
                SubscribeJoins,
                ReserveRun,
                Claim { run: 7 },
                Begin { run: 7, began: 0 }
            ]
        );
    }

    #[test]
    fn outcomes_not_asked_for_change_nothing() {
        let now = Instant::now();
        let mut s = DeviceStart::new(true);
        s.handle_reserved(9);
        s.handle_claimed();
        s.handle_end(5);
        assert_eq!(s.poll_io(now), Some(StartIo::SubscribeJoins));
        s.handle_marked(3);
        s.handle_subscribed();
        assert_eq!(s.poll_io(now), Some(StartIo::ReserveRun));
        s.handle_claimed();
        assert_eq!(s.poll_io(now), None, "still waiting for the reservation");
        s.handle_reserved(9);
        assert_eq!(s.poll_io(now), Some(StartIo::Claim { run: 9 }));
    }

    #[test]
    fn a_failed_jetstream_step_is_asked_again_for_a_while_and_others_give_up() {
        let t0 = Instant::now();
        let mut s = DeviceStart::new(true);
        assert_eq!(s.poll_io(t0), Some(StartIo::SubscribeJoins));
        assert_eq!(s.handle_failed(t0, true), Err(GaveUp), "not JetStream's");
        let mut s = DeviceStart::new(true);
        for io in [StartIo::SubscribeJoins, StartIo::ReserveRun] {
            assert_eq!(s.poll_io(t0), Some(io));
            match io {
                StartIo::SubscribeJoins => s.handle_subscribed(),
                _ => s.handle_reserved(4),
            }
        }
        assert_eq!(s.poll_io(t0), Some(StartIo::Claim { run: 4 }));
        s.handle_claimed();
        let mut hard = s.clone();
        assert_eq!(hard.poll_io(t0), Some(StartIo::Mark { run: 4 }));
        assert_eq!(
            hard.handle_failed(t0, false),
            Err(GaveUp),
            "an error that does not pass"
        );
        // The mark fails (a cluster electing the stream's leader): asked again later,
        // waits doubling.
        let mut now = t0;
        let mut waits = Vec::new();
        loop {
            assert_eq!(s.poll_io(now), Some(StartIo::Mark { run: 4 }));
            match s.handle_failed(now, true) {
                Ok(w) => {
                    assert_eq!(s.poll_io(now), None, "not before the wait");
                    assert_eq!(s.poll_timeout(), Some(now + w));
                    waits.push(w.as_millis());
                    now += w;
                }
                Err(GaveUp) => break,
            }
        }
        assert_eq!(waits[..5], [250, 500, 1000, 2000, 2000]);
        assert!(now - t0 >= STEP_RETRY_FOR && now - t0 < STEP_RETRY_FOR + Duration::from_secs(2));
        // One that comes through goes on, its failures forgotten.
        let mut s = DeviceStart::new(true);
        s.poll_io(t0);
        s.handle_subscribed();
        s.poll_io(t0);
        s.handle_reserved(4);
        s.poll_io(t0);
        s.handle_claimed();
        assert_eq!(s.poll_io(t0), Some(StartIo::Mark { run: 4 }));
        assert!(s.handle_failed(t0, true).is_ok());
        let later = t0 + STEP_RETRY;
        assert_eq!(s.poll_io(later), Some(StartIo::Mark { run: 4 }));
        s.handle_marked(1);
        assert_eq!(s.poll_timeout(), None);
        assert_eq!(s.poll_io(later), Some(StartIo::ReadEnd));
    }
}

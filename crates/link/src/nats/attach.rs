//! A sink's JetStream consumer, attached and attached again (sans-IO). The driver's
//! `drive/sink.rs` and `testkit/tests/nats_ending.rs` do what [`Attach::poll_io`] asks and
//! hand the outcomes back, and both ask [`Reattach`] when to attach again; before 2026-12-02
//! the binary wrote these steps out for itself and the simulation kept its consumer across
//! process restarts, so the start a consumer is made again at was never explored.
//!
//! - **Where a consumer starts.** A consumer this side left behind (a restart, a crash) is
//!   looked up first ([`AttachIo::Look`]): with `resume`, the new one starts where it stood,
//!   after its ack floor or at the first record acknowledged and kept aside for a key
//!   ([`Kept::resume_at`]), whichever is first; what it had delivered and not acknowledged
//!   comes again (dropped by its stream sequence or by the opened windows). Without one, it
//!   starts at the start given: for a device side [`device_start`], after where the oldest
//!   run its keys name began or after what the process before noted as through its sink,
//!   whichever is later; for an app side, the first message stored after it asked to join.
//! - **The one left behind is deleted** ([`AttachIo::Delete`]) before the new one is made
//!   ([`AttachIo::Make`]), or it would go on from its own position, not the start decided.
//!   nats-server's file store can fail a delete that races its own writes ("directory not
//!   empty"): the consumer is looked up again and, while it is still there, the delete is tried
//!   again [`DELETE_RETRY`] later, [`DELETE_TRIES`] times at most.
//! - **A shared consumer** (a round-robin stream's members) is never looked up nor deleted.
//! - **Attached again** ([`Reattach`]) when the connection came back (what was on its way
//!   comes again at once, not after the ack wait) or the consumer stopped delivering. One
//!   still there resumes after its ack floor as above; one lost is made after what this process
//!   acknowledged and what went through the sink, and never before where it started as
//!   attached last ([`Reattach::from`]); a failed attach is tried again [`ATTACH_RETRY`] later,
//!   the wait doubling up to [`ATTACH_RETRY_MAX`].
//! - **A sink's start** ([`StartRetry`]): the stream looked up and the first attach are tried
//!   again as reattaches are spaced, for [`FIRST_ATTACH_FOR`], before the stream fails.

use super::intake::Kept;
use std::time::{Duration, Instant};

/// How long a failed delete of a consumer that is still there waits before it is tried again.
pub const DELETE_RETRY: Duration = Duration::from_millis(100);
/// Deletes tried at most before the consumer is made anyway.
pub const DELETE_TRIES: u32 = 5;
/// The first wait before a failed attach is tried again; it doubles up to
/// [`ATTACH_RETRY_MAX`].
pub const ATTACH_RETRY: Duration = Duration::from_millis(100);
/// The longest wait between attaches that fail.
pub const ATTACH_RETRY_MAX: Duration = Duration::from_secs(5);
/// How long a sink's start tries its JetStream steps (the stream looked up, the first attach)
/// again while they fail, before the stream fails.
pub const FIRST_ATTACH_FOR: Duration = Duration::from_secs(20);

/// Where a device side's consumer made afresh starts: after stream sequence `oldest_began`
/// (where the oldest run its keys name began: frames of older runs are refused anyway) or
/// after `through` (what the process before noted as through its sink, `OpenedWindows::through`:
/// a consumer lost between a delete and a make does not read those again), whichever is later.
pub fn device_start(oldest_began: u64, through: u64) -> u64 {
    oldest_began.max(through) + 1
}

/// What an [`Attach`] asks its driver for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachIo {
    /// Look the durable consumer up: [`Attach::handle_looked`] with its ack floor, or `None`
    /// when there is none.
    Look,
    /// Delete the durable consumer: [`Attach::handle_deleted`].
    Delete,
    /// Make the durable consumer delivering from stream sequence `start` and pull from it:
    /// [`Attach::handle_made`].
    Make {
        /// The first stream sequence it delivers.
        start: u64,
    },
}

/// A consumer attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attached {
    /// The stream sequence it delivers from.
    pub start: u64,
    /// It took up a consumer this side left behind: where the process before stood (its
    /// position file) still holds; otherwise that file is cleared.
    pub resumed: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Look,
    Delete,
    /// The delete failed: is it still there?
    Check,
    /// Waiting to delete again.
    Wait(Instant),
    Make,
    /// A first attach's make failed: made again then.
    WaitMake(Instant),
    /// A first attach's look failed (not "not found"): looked again then.
    WaitLook(Instant),
    /// Asked, the outcome not handed back yet.
    Asked,
    Done(bool),
}

/// One attach of a sink's consumer. See the module docs.
#[derive(Debug, Clone)]
pub struct Attach {
    resume: bool,
    start: u64,
    resumed: bool,
    deletes: u32,
    /// The look under way asks whether a consumer whose delete failed is still there.
    checking: bool,
    /// A stream's first attach: a failed make is made again, at the start decided, as this
    /// says.
    retry: Option<StartRetry>,
    step: Step,
}

impl Attach {
    /// Attaches the consumer, made at `start` unless one left behind resumes (`resume`);
    /// `shared`: a round-robin stream's, never looked up nor deleted.
    pub fn new(start: u64, resume: bool, shared: bool) -> Attach {
        Attach {
            resume,
            start,
            resumed: false,
            deletes: 0,
            checking: false,
            retry: None,
            step: if shared { Step::Make } else { Step::Look },
        }
    }

    /// A stream's first attach, from `now`: a make that fails with an error that passes by
    /// itself is made again at the start decided (a consumer left behind and deleted is not
    /// there to be found again: looking again would start the new one where a fresh one
    /// starts, past what the one left behind had not acknowledged), as [`StartRetry`] says.
    pub fn retrying(mut self, now: Instant) -> Attach {
        self.retry = Some(StartRetry::new(now));
        self
    }

    /// The next step to do, if one is due (`None` while one is under way, while a delete
    /// waits to be tried again, and once done).
    pub fn poll_io(&mut self, now: Instant) -> Option<AttachIo> {
        let io = match self.step {
            Step::Look | Step::Check => AttachIo::Look,
            Step::Delete => AttachIo::Delete,
            Step::Wait(at) if now >= at => AttachIo::Delete,
            Step::Make => AttachIo::Make { start: self.start },
            Step::WaitMake(at) if now >= at => AttachIo::Make { start: self.start },
            Step::WaitLook(at) if now >= at => AttachIo::Look,
            Step::Wait(_) | Step::WaitMake(_) | Step::WaitLook(_) | Step::Asked | Step::Done(_) => {
                return None
            }
        };
        self.checking = self.step == Step::Check;
        self.step = Step::Asked;
        Some(io)
    }

    /// When a delete waits to be tried again.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.step {
            Step::Wait(at) | Step::WaitMake(at) | Step::WaitLook(at) => Some(at),
            _ => None,
        }
    }

    /// The consumer left behind, with its ack floor, or none (`None`). `kept`: what the
    /// process before wrote of the records it acknowledged and kept aside for a key.
    pub fn handle_looked(&mut self, ack_floor: Option<u64>, kept: Option<&Kept>, now: Instant) {
        self.step = match (self.checking, ack_floor) {
            // Gone after all: made at the start decided.
            (true, None) => Step::Make,
            (true, Some(_)) if self.deletes >= DELETE_TRIES => Step::Make,
            (true, Some(_)) => Step::Wait(now + DELETE_RETRY),
            (false, None) => Step::Make,
            (false, Some(floor)) => {
                if self.resume {
                    self.start = Kept::resume_at(floor, kept);
                    self.resumed = true;
                }
                Step::Delete
            }
        };
    }

    /// The delete's outcome: a failed one is looked at again (it may be gone all the same).
    pub fn handle_deleted(&mut self, ok: bool) {
        self.deletes += 1;
        self.step = if ok || self.deletes >= DELETE_TRIES {
            Step::Make
        } else {
            Step::Check
        };
    }

    /// Whether the consumer was made and pulled from.
    pub fn handle_made(&mut self, ok: bool) {
        self.step = Step::Done(ok);
    }

    /// The look failed at `now` with an error other than "not found" (`passing`: one that
    /// passes by itself): whether a consumer is left behind is not known, so nothing is made
    /// (made afresh, it would start past what that one had not acknowledged). A first
    /// attach's is looked again after the wait given; otherwise (`None`) the attach ends
    /// failed. (Before, any failed look counted as none left behind.)
    pub fn handle_look_failed(&mut self, now: Instant, passing: bool) -> Option<Duration> {
        self.checking = false;
        self.failed(now, passing, Step::WaitLook)
    }

    /// The make failed at `now` (`passing`: with an error that passes by itself). A first
    /// attach's is made again after the wait given; otherwise (`None`) the attach ends failed.
    pub fn handle_make_failed(&mut self, now: Instant, passing: bool) -> Option<Duration> {
        self.failed(now, passing, Step::WaitMake)
    }

    /// A step failed: a first attach waits (`again` at the end of the wait), any other ends.
    fn failed(
        &mut self,
        now: Instant,
        passing: bool,
        again: fn(Instant) -> Step,
    ) -> Option<Duration> {
        let wait = self
            .retry
            .as_mut()
            .and_then(|r| r.handle_failed(now, passing));
        self.step = wait.map_or(Step::Done(false), |w| again(now + w));
        wait
    }

    /// The attach's end: `Some(Ok)` attached, `Some(Err(()))` the make failed; `None` while
    /// it goes on.
    pub fn poll_end(&self) -> Option<Result<Attached, ()>> {
        match self.step {
            Step::Done(true) => Some(Ok(Attached {
                start: self.start,
                resumed: self.resumed,
            })),
            Step::Done(false) => Some(Err(())),
            _ => None,
        }
    }
}

/// When a sink's consumer is attached again. See the module docs.
#[derive(Debug, Clone, Default)]
pub struct Reattach {
    /// The connection came back, or the consumer stopped delivering, since it attached last.
    pending: bool,
    /// After a failed attach: when to try again, and the wait after the next failure.
    retry: Option<(Instant, Duration)>,
}

impl Reattach {
    /// The connection to the server was made again, or the consumer's messages ended.
    pub fn handle_lost(&mut self) {
        self.pending = true;
    }

    /// Whether to attach again now.
    pub fn due(&self, now: Instant) -> bool {
        self.pending && self.retry.is_none_or(|(at, _)| now >= at)
    }

    /// Where the consumer is made again: after what this process acknowledged (`acked_to`)
    /// and after what went through the sink (`through`, a device side's
    /// `OpenedWindows::through`, the process before's included), never before where it started
    /// as attached last (`started`). (Before, a reconnect ahead of the first acknowledgement
    /// made it at stream sequence 1, and frames of runs older than the device's keys name came
    /// again: found by a review. And a device side's consumer lost at a reconnect was made
    /// again after what that process acknowledged, reading again what the process before had
    /// taken: found by `nats_ending` seed 54 once it drove this.)
    pub fn from(acked_to: u64, through: u64, started: u64) -> u64 {
        (acked_to.max(through) + 1).max(started)
    }

    /// The attach's outcome; a failure's wait before the next try.
    pub fn handle_attached(&mut self, now: Instant, ok: bool) -> Option<Duration> {
        if ok {
            self.pending = false;
            self.retry = None;
            return None;
        }
        let wait = self.retry.map_or(ATTACH_RETRY, |(_, w)| w);
        self.retry = Some((now + wait, (wait * 2).min(ATTACH_RETRY_MAX)));
        Some(wait)
    }
}

/// A sink's start's JetStream steps (the stream looked up, the first attach), tried again
/// while they fail, spaced as [`Reattach`] spaces attaches, for [`FIRST_ATTACH_FOR`]: a
/// cluster electing the stream's leader after a node went fails them for a few seconds. (Before
/// 2026-12-02 the first failure failed the stream, and with it the side.)
#[derive(Debug, Clone)]
pub struct StartRetry {
    since: Instant,
    again: Reattach,
}

impl StartRetry {
    /// Steps that start at `now`.
    pub fn new(now: Instant) -> StartRetry {
        StartRetry {
            since: now,
            again: Reattach::default(),
        }
    }

    /// A step failed at `now` (`passing`: with an error that passes by itself,
    /// `super::store::passes`): the wait before it is tried again, or `None`: the stream gives
    /// up (an error that does not pass, or the next try would begin after
    /// [`FIRST_ATTACH_FOR`]).
    pub fn handle_failed(&mut self, now: Instant, passing: bool) -> Option<Duration> {
        if !passing {
            return None;
        }
        let wait = self
            .again
            .handle_attached(now, false)
            .unwrap_or(ATTACH_RETRY);
        (now.saturating_duration_since(self.since) + wait <= FIRST_ATTACH_FOR).then_some(wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `a` to its end: `look` answers each look (in turn), `delete` each delete.
    fn run(a: &mut Attach, looks: &[Option<u64>], deletes: &[bool]) -> (Vec<AttachIo>, Instant) {
        let mut now = Instant::now();
        let (mut looks, mut deletes) = (looks.iter(), deletes.iter());
        let mut asked = Vec::new();
        while a.poll_end().is_none() {
            let Some(io) = a.poll_io(now) else {
                now = a.poll_timeout().expect("a wait when nothing is asked");
                continue;
            };
            asked.push(io);
            match io {
                AttachIo::Look => a.handle_looked(*looks.next().expect("a look"), None, now),
                AttachIo::Delete => a.handle_deleted(*deletes.next().expect("a delete")),
                AttachIo::Make { .. } => a.handle_made(true),
            }
        }
        (asked, now)
    }

    #[test]
    fn a_consumer_left_behind_resumes_after_its_ack_floor_and_is_made_again() {
        let mut a = Attach::new(40, true, false);
        let (asked, _) = run(&mut a, &[Some(17)], &[true]);
        assert_eq!(
            asked,
            [
                AttachIo::Look,
                AttachIo::Delete,
                AttachIo::Make { start: 18 }
            ]
        );
        assert_eq!(
            a.poll_end(),
            Some(Ok(Attached {
                start: 18,
                resumed: true
            }))
        );
        // Kept aside for a key before the floor: from there.
        let kept = Kept {
            start: 1,
            position: None,
            again_from: Some(9),
        };
        let mut a = Attach::new(40, true, false);
        assert_eq!(a.poll_io(Instant::now()), Some(AttachIo::Look));
        a.handle_looked(Some(17), Some(&kept), Instant::now());
        assert_eq!(a.poll_io(Instant::now()), Some(AttachIo::Delete));
        a.handle_deleted(true);
        assert_eq!(a.poll_io(Instant::now()), Some(AttachIo::Make { start: 9 }));
    }

    #[test]
    fn without_resume_or_with_none_left_it_starts_at_the_start_given() {
        let mut a = Attach::new(40, false, false);
        let (asked, _) = run(&mut a, &[Some(17)], &[true]);
        assert_eq!(
            asked,
            [
                AttachIo::Look,
                AttachIo::Delete,
                AttachIo::Make { start: 40 }
            ]
        );
        assert_eq!(
            a.poll_end(),
            Some(Ok(Attached {
                start: 40,
                resumed: false
            }))
        );
        let mut a = Attach::new(40, true, false);
        let (asked, _) = run(&mut a, &[None], &[]);
        assert_eq!(asked, [AttachIo::Look, AttachIo::Make { start: 40 }]);
        let mut a = Attach::new(40, true, true);
        let (asked, _) = run(&mut a, &[], &[]);
        assert_eq!(asked, [AttachIo::Make { start: 40 }], "shared");
    }

    #[test]
    fn a_failed_delete_is_looked_at_and_tried_again_a_while_later() {
        // Fails twice while still there, then goes.
        let mut a = Attach::new(40, true, false);
        let t0 = Instant::now();
        let (asked, end) = run(&mut a, &[Some(5), Some(5), Some(5)], &[false, false, true]);
        assert_eq!(
            asked,
            [
                AttachIo::Look,
                AttachIo::Delete,
                AttachIo::Look,
                AttachIo::Delete,
                AttachIo::Look,
                AttachIo::Delete,
                AttachIo::Make { start: 6 }
            ]
        );
        assert!(end >= t0 + 2 * DELETE_RETRY);
        // Failed, but gone: made at once.
        let mut a = Attach::new(40, true, false);
        let (asked, _) = run(&mut a, &[Some(5), None], &[false]);
        assert_eq!(
            asked,
            [
                AttachIo::Look,
                AttachIo::Delete,
                AttachIo::Look,
                AttachIo::Make { start: 6 }
            ]
        );
        // Never goes: made anyway after the last try.
        let mut a = Attach::new(40, true, false);
        let (asked, _) = run(&mut a, &[Some(5); 5], &[false; DELETE_TRIES as usize]);
        assert_eq!(
            asked.iter().filter(|io| **io == AttachIo::Delete).count(),
            DELETE_TRIES as usize
        );
        assert_eq!(asked.last(), Some(&AttachIo::Make { start: 6 }));
        // A failed make ends it.
        let mut a = Attach::new(40, true, false);
        assert_eq!(a.poll_io(t0), Some(AttachIo::Look));
        a.handle_looked(None, None, t0);
        assert_eq!(a.poll_io(t0), Some(AttachIo::Make { start: 40 }));
        assert_eq!(a.poll_io(t0), None, "under way");
        a.handle_made(false);
        assert_eq!(a.poll_end(), Some(Err(())));
    }

    #[test]
    fn it_is_attached_again_when_lost_and_backs_off_while_that_fails() {
        let t0 = Instant::now();
        let mut r = Reattach::default();
        assert!(!r.due(t0), "nothing lost");
        r.handle_lost();
        assert!(r.due(t0));
        assert_eq!(r.handle_attached(t0, false), Some(ATTACH_RETRY));
        assert!(!r.due(t0 + ATTACH_RETRY / 2));
        assert!(r.due(t0 + ATTACH_RETRY));
        let mut waits = Vec::new();
        let mut now = t0 + ATTACH_RETRY;
        for _ in 0..8 {
            let w = r.handle_attached(now, false).expect("a wait");
            waits.push(w.as_millis());
            now += w;
        }
        assert_eq!(waits, [200, 400, 800, 1600, 3200, 5000, 5000, 5000]);
        assert_eq!(r.handle_attached(now, true), None);
        assert!(!r.due(now), "attached");
        assert_eq!(Reattach::from(0, 0, 12), 12, "before any acknowledgement");
        assert_eq!(Reattach::from(30, 0, 12), 31);
        assert_eq!(
            Reattach::from(30, 45, 12),
            46,
            "the process before took up to 45"
        );
        assert_eq!(device_start(7, 0), 8);
        assert_eq!(device_start(7, 20), 21);
    }

    #[test]
    fn a_start_tries_its_steps_again_for_a_while() {
        let t0 = Instant::now();
        let mut r = StartRetry::new(t0);
        let mut now = t0;
        let mut waits = Vec::new();
        assert_eq!(r.clone().handle_failed(now, false), None, "does not pass");
        while let Some(w) = r.handle_failed(now, true) {
            waits.push(w.as_millis());
            now += w;
        }
        assert_eq!(waits[..4], [100, 200, 400, 800]);
        assert!(now - t0 <= FIRST_ATTACH_FOR && now - t0 > FIRST_ATTACH_FOR - ATTACH_RETRY_MAX);
    }

    #[test]
    fn a_first_attach_whose_make_fails_makes_it_again_where_it_resumed() {
        let t0 = Instant::now();
        let mut a = Attach::new(40, true, false).retrying(t0);
        assert_eq!(a.poll_io(t0), Some(AttachIo::Look));
        a.handle_looked(Some(17), None, t0);
        assert_eq!(a.poll_io(t0), Some(AttachIo::Delete));
        a.handle_deleted(true);
        assert_eq!(a.poll_io(t0), Some(AttachIo::Make { start: 18 }));
        let w = a.handle_make_failed(t0, true).expect("made again");
        assert_eq!(a.poll_io(t0), None, "not before the wait");
        assert_eq!(a.poll_timeout(), Some(t0 + w));
        // Made again where it resumed, not looked up again (the one left behind is gone: a
        // look would start afresh at 40 and skip 18..40).
        assert_eq!(a.poll_io(t0 + w), Some(AttachIo::Make { start: 18 }));
        a.handle_made(true);
        assert_eq!(
            a.poll_end(),
            Some(Ok(Attached {
                start: 18,
                resumed: true
            }))
        );
        // An error that does not pass, or a reattach's: the attach ends failed.
        let mut a = Attach::new(40, true, false).retrying(t0);
        a.poll_io(t0);
        a.handle_looked(None, None, t0);
        a.poll_io(t0);
        assert_eq!(a.handle_make_failed(t0, false), None);
        assert_eq!(a.poll_end(), Some(Err(())));
        let mut a = Attach::new(40, true, false);
        a.poll_io(t0);
        a.handle_looked(None, None, t0);
        a.poll_io(t0);
        assert_eq!(a.handle_make_failed(t0, true), None);
        assert_eq!(a.poll_end(), Some(Err(())));
    }

    #[test]
    fn a_look_that_fails_makes_nothing() {
        let t0 = Instant::now();
        let mut a = Attach::new(40, true, false).retrying(t0);
        assert_eq!(a.poll_io(t0), Some(AttachIo::Look));
        let w = a.handle_look_failed(t0, true).expect("looked again");
        assert_eq!(a.poll_io(t0), None);
        assert_eq!(a.poll_io(t0 + w), Some(AttachIo::Look));
        a.handle_looked(Some(17), None, t0 + w);
        assert_eq!(a.poll_io(t0 + w), Some(AttachIo::Delete));
        let mut a = Attach::new(40, true, false);
        a.poll_io(t0);
        assert_eq!(a.handle_look_failed(t0, true), None);
        assert_eq!(
            a.poll_end(),
            Some(Err(())),
            "a reattach's: tried again by Reattach"
        );
    }
}

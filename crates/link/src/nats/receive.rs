//! One fan-out stream's receiving half (sans-IO): its [`Intake`] (copies, order, what may be
//! acknowledged), its [`Opener`] (runs, the group key and the keys before the last rotations)
//! and the rules between them, which the binary's sinks and the simulations once each wrote
//! out for themselves:
//!
//! - a stored record that holds no place in its subject's order (forged, a copy, a run named
//!   with another start) gives its place back ([`Intake::give_back`]); one that opened, or
//!   that opened under the key before a rotation and was dropped for being stored after it,
//!   takes its place ([`Intake::authentic`]);
//! - a record that opens under the key before a rotation while where the rotation began is
//!   not known waits for it ([`Wait::Rotation`]); one that opens under no key this side has
//!   makes an app side ask for the key ([`Wait::Key`]); nothing else is opened meanwhile, so
//!   the order holds;
//! - records set aside while an app side did not ask go again once a new key came;
//! - each opened frame is reported to the intake, which says whether it is the stream's END
//!   (once per run) or a frame of a newer device run (the stack starts afresh).
//!
//! The driver feeds messages, keys and time in and takes [`Event`]s out; it acknowledges
//! what [`Receiver::acks`] gives once its sink completed everything handed to it, having
//! written first what the [`Acks`] name for the next process.

use super::intake::{Intake, Opened, Taken};
use super::keys::{GroupKey, Opener, RunHalf, Verdict};
use super::record::{FrameRecord, END_SEQ};
use super::runs::Run;
use bytes::Bytes;
use ndd_core::{Frame, ModuleError, Output};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Stored messages to acknowledge, in order, once what they name is written
/// ([`Receiver::acks`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acks<M> {
    /// The messages, in order.
    pub msgs: Vec<M>,
    /// Where the stream stands, to write first (an ordered stream's: `home::PositionFile`).
    pub kept: Option<super::intake::Kept>,
    /// What was opened, encoded, to write first (a device side's:
    /// `super::opened::OpenedWindows`, `home::WindowsFile`).
    pub windows: Option<Vec<u8>>,
}

/// What the receiver has for its driver.
#[derive(Debug)]
pub enum Event {
    /// A frame for the stack. `restarted`: the (run, seq) taken last when this frame is of
    /// another device run (the device side restarted: what the stack holds goes out first,
    /// then it starts afresh).
    Frame {
        /// The frame, opened.
        frame: Frame,
        /// The device run it is of.
        run: Run,
        /// Its JetStream stream sequence, if it was stored.
        stored: Option<u64>,
        /// The last (run, seq) of the run before, if the run changed.
        restarted: Option<(u64, u64)>,
    },
    /// The stream's END; `first`: the first one of its run (a lossy END comes three times).
    End {
        /// The device run it ends.
        run: Run,
        /// Whether this run's END was not seen before.
        first: bool,
    },
    /// An app side: a frame of a newer device run opened; join again to learn it (what this
    /// side sends follows), without waiting.
    NewerRun,
    /// A device side: a genuine frame of an earlier run came (an app side that did not hear of
    /// this run), or one under the key before a rotation stored after it (an app side that
    /// did not hear of the rotation): tell the app sides to join again.
    TellRun,
}

/// What the receiver waits for before it opens anything more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// A record opened under no key this side has: ask the device for the key (join again),
    /// hand what comes to [`Receiver::handle_keys`], then call [`Receiver::asked`] (also when
    /// nothing came).
    Key,
    /// A record opened under the key before a rotation whose start is not known yet: hand
    /// keys to [`Receiver::handle_keys`] until they say where it began.
    Rotation,
}

/// What [`Receiver::poll`] gives.
#[derive(Debug)]
pub enum Poll {
    /// Something for the driver.
    Event(Event),
    /// Nothing until the driver brings what it waits for.
    Wait(Wait),
    /// Nothing until more messages (or time) come.
    Idle,
}

/// The record opening is waiting on.
#[derive(Debug)]
enum Pending {
    Held(FrameRecord, Option<u64>),
    Asked(FrameRecord, Option<u64>),
}

/// What the driver is told next: a signal, or an opened frame (an END or a frame), which the
/// intake classifies as it is handed over (so a device restart is told in the order the
/// frames go to the stack).
#[derive(Debug)]
enum Due {
    Said(Event),
    Opened {
        frame: Frame,
        run: Run,
        seq: u64,
        stored: Option<u64>,
    },
}

/// One sink stream's receiving half (see the module's documentation); `M` is the broker's
/// handle of a stored message, `H` the half that opens one run's frames.
pub struct Receiver<H, M> {
    intake: Intake<M>,
    opener: Opener<H>,
    pending: Option<Pending>,
    out: Output,
    events: VecDeque<Due>,
    /// Frames of a newer run held back, by run, while records of an earlier one, released
    /// when it opened (its gaps given up: [`super::record::Reorder::genuine`]), are opened
    /// first, so that the earlier run's last frames go to the stack before the newer run's
    /// first (found by `testkit/tests/nats_keys.rs` with device restarts).
    deferred: std::collections::BTreeMap<u64, VecDeque<Due>>,
    /// Records handed to the opener, and their bytes.
    pub records: u64,
    /// Their payload bytes.
    pub record_bytes: u64,
}

impl<H, M> std::fmt::Debug for Receiver<H, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver")
            .field("pending", &self.pending)
            .field("events", &self.events.len())
            .field("records", &self.records)
            .finish_non_exhaustive()
    }
}

impl<H: RunHalf, M> Receiver<H, M> {
    /// The receiving half of stream `stream` under `keys`: a device side's (`app` false:
    /// refuses any run but its own) or an app side's (follows the device to a newer run, asks
    /// for the key). `ordered` and `wait` as [`Intake::new`].
    pub fn new(stream: u16, app: bool, keys: GroupKey, ordered: bool, wait: Duration) -> Self {
        Receiver {
            intake: if app {
                Intake::new(stream, ordered, wait)
            } else {
                // Every app side's frames, each numbering its own.
                Intake::new(stream, ordered, wait).with_many_senders()
            },
            opener: if app {
                Opener::app(keys)
            } else {
                Opener::device(keys)
            },
            pending: None,
            out: Output::new(),
            events: VecDeque::new(),
            deferred: std::collections::BTreeMap::new(),
            records: 0,
            record_bytes: 0,
        }
    }

    /// The intake (counters, acknowledgements confirmed, where the consumer starts).
    pub fn intake(&mut self) -> &mut Intake<M> {
        &mut self.intake
    }

    /// Whether nothing taken waits here: behind a gap, to be opened, or for the driver.
    pub fn holds_nothing(&self) -> bool {
        self.intake.holds_nothing()
            && self.pending.is_none()
            && self.events.is_empty()
            && self.deferred.is_empty()
    }

    /// The opener (its counters, the keys as it holds them).
    pub fn opener(&self) -> &Opener<H> {
        &self.opener
    }

    /// Frames dropped by the opener: refused runs and frames that open under no key.
    pub fn dropped(&self) -> u64 {
        self.opener.dropped
    }

    /// Takes a message (see [`Intake::handle_message`]).
    pub fn handle_message(
        &mut self,
        now: Instant,
        body: &Bytes,
        stored: Option<(Option<u64>, M)>,
    ) -> Taken {
        self.intake.handle_message(now, body, stored)
    }

    /// Takes `keys` as the keys as they stand (a rotation, a join's answer, where a rotation
    /// began); what was set aside for want of a key goes again. Whether the opener's halves
    /// changed.
    pub fn handle_keys(&mut self, now: Instant, keys: GroupKey) -> bool {
        let changed = self.opener.handle_keys(keys);
        for (rec, stored) in self.opener.take_unopened() {
            self.intake.retake(now, rec, stored);
        }
        changed
    }

    /// After [`Wait::Key`]: the record tried once more under what the ask brought.
    pub fn asked(&mut self, now: Instant) -> Result<(), ModuleError> {
        let Some(Pending::Asked(rec, stored)) = self.pending.take() else {
            return Ok(());
        };
        let v = self.opener.retry(now, &mut self.out);
        self.settle(now, &rec, stored, v)
    }

    /// The next thing for the driver. An error names a record that was dropped (it does not
    /// open: counted as forged); polling goes on after it.
    pub fn poll(&mut self, now: Instant) -> Result<Poll, ModuleError> {
        loop {
            if let Some(due) = self.events.pop_front() {
                return Ok(Poll::Event(self.hand_over(due)));
            }
            match self.pending.take() {
                Some(Pending::Held(rec, stored)) => {
                    if !self.opener.release(&mut self.out) {
                        self.pending = Some(Pending::Held(rec, stored));
                        return Ok(Poll::Wait(Wait::Rotation));
                    }
                    self.settle(now, &rec, stored, Ok(Verdict::Held))?;
                    continue;
                }
                Some(p @ Pending::Asked(..)) => {
                    self.pending = Some(p);
                    return Ok(Poll::Wait(Wait::Key));
                }
                None => {}
            }
            // Frames set aside during a pause after a fruitless ask: asked for again once it
            // is over (a rotation's notice may have been lost meanwhile).
            if let Some((rec, stored)) = self.opener.ask_again(now) {
                self.pending = Some(Pending::Asked(rec, stored));
                return Ok(Poll::Wait(Wait::Key));
            }
            if let Some(run) = self.deferred.keys().next().copied() {
                if !self.intake.readies_earlier_than(run) {
                    if let Some(mut q) = self.deferred.remove(&run) {
                        self.events.append(&mut q);
                    }
                    continue;
                }
            }
            let Some((rec, stored)) = self.intake.poll_record() else {
                return Ok(Poll::Idle);
            };
            self.records += 1;
            self.record_bytes += rec.payload.len() as u64;
            let v = self.opener.handle_frame(now, &rec, stored, &mut self.out);
            match v {
                Ok(Verdict::Held) => self.pending = Some(Pending::Held(rec, stored)),
                Ok(Verdict::AskKey) => self.pending = Some(Pending::Asked(rec, stored)),
                v => self.settle(now, &rec, stored, v)?,
            }
        }
    }

    /// What became of `rec`: its place in the order, its frames reported.
    fn settle(
        &mut self,
        now: Instant,
        rec: &FrameRecord,
        stored: Option<u64>,
        verdict: Result<Verdict, ModuleError>,
    ) -> Result<(), ModuleError> {
        let (v, err) = match verdict {
            Ok(v) => (v, None),
            Err(e) => (Verdict::Forged, Some(e)),
        };
        let frames = self.out.take_frames();
        let no_place = v.holds_no_place();
        if stored.is_some()
            && !no_place
            && (v.takes_place() || !frames.is_empty())
            && self.intake.known_copy(rec)
        {
            // A copy of a frame that opened after this one was taken: at its place (its seal
            // is bound to it), which is taken already. Found by `testkit/tests/nats_keys.rs`:
            // a device frame and its copy held behind one gap, a rotation's keys in between,
            // both delivered.
            return Ok(());
        }
        if stored.is_some() {
            if no_place {
                // Forged, or a copy: the one it stood in for in the order is awaited again.
                self.intake.give_back(rec, now);
            } else if v == Verdict::Dropped {
                // Under the key before a rotation, stored after it: its place is taken, but
                // its copies are not dropped as copies — the genuine frame, stored before the
                // rotation and read after this copy, still opens (found by
                // `testkit/tests/nats_keys.rs`: after a device restart an adversary's copy
                // stored after the rotation came first, and the genuine frame was lost).
                self.intake.passed(rec, now);
            } else if v.takes_place() || !frames.is_empty() {
                // Genuine: its copies are dropped from now on (not before: an altered copy
                // stored first must not make this one a copy), and its place is taken.
                self.intake.authentic(rec, now);
            }
        }
        match v {
            Verdict::Opened { newer_run: true } => {
                self.events.push_back(Due::Said(Event::NewerRun))
            }
            Verdict::Refused { tell: true, .. } => self.events.push_back(Due::Said(Event::TellRun)),
            _ if self.opener.take_tell(now) => self.events.push_back(Due::Said(Event::TellRun)),
            _ => {}
        }
        if let Some(e) = err {
            return Err(e);
        }
        if no_place {
            return Ok(());
        }
        // A newer run's frames wait while an earlier run's records go first; a run's frames
        // keep their order among themselves.
        let defer = self.deferred.keys().next().is_some_and(|&r| r <= rec.run)
            || (stored.is_some() && self.intake.readies_earlier_than(rec.run));
        for frame in frames {
            let end = frame.meta.seq == END_SEQ && frame.is_empty();
            let due = Due::Opened {
                frame,
                run: rec.device_run(),
                seq: if end { END_SEQ } else { rec.seq },
                stored,
            };
            if defer {
                self.deferred.entry(rec.run).or_default().push_back(due);
            } else {
                self.events.push_back(due);
            }
        }
        Ok(())
    }

    /// What `due` tells the driver, classified by the intake as it goes to the stack.
    fn hand_over(&mut self, due: Due) -> Event {
        match due {
            Due::Said(e) => e,
            Due::Opened {
                frame,
                run,
                seq,
                stored,
            } => match self.intake.opened(run.id, seq) {
                Opened::End { first } => Event::End { run, first },
                Opened::Frame { restarted } => Event::Frame {
                    frame,
                    run,
                    stored,
                    restarted,
                },
            },
        }
    }

    /// When a gap is given up ([`Intake::poll_timeout`]).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.intake.poll_timeout()
    }

    /// Gives up the gaps held too long; whether any was.
    pub fn handle_timeout(&mut self, now: Instant) -> bool {
        self.intake.handle_timeout(now)
    }

    /// What the next process of this stream needs ([`super::intake::Kept`]), read when
    /// acknowledging: the intake's, and where the records kept aside for a key begin.
    pub fn kept(&self, now: Instant) -> Option<super::intake::Kept> {
        let mut k = self.intake.kept()?;
        k.again_from = self.opener.aside_from(now);
        Some(k)
    }

    /// The messages to acknowledge now ([`Receiver::acks_due`]), and what to write to the
    /// home first, at `now`, for the next process: where the stream stands (an ordered
    /// stream's [`Receiver::kept`]) and what was opened (a device side's windows,
    /// [`super::opened`]): a message acknowledged before they are written comes to no process
    /// again while the next one lacks what tells it a copy from a frame (the driver and the
    /// simulations each wrote this order out before). `None`: nothing to acknowledge.
    pub fn acks(&mut self, now: Instant, through: bool) -> Option<Acks<M>> {
        let msgs = self.acks_due(through);
        if msgs.is_empty() {
            return None;
        }
        Some(Acks {
            msgs,
            kept: self.kept(now),
            windows: self.intake.opened_windows().map(|w| w.encode()),
        })
    }

    /// The messages to acknowledge now, in order: all of them once `through` (everything
    /// handed to the sink is complete) and nothing is held here (behind a gap, waiting to be
    /// opened, or its events not yet taken); else none.
    pub fn acks_due(&mut self, through: bool) -> Vec<M> {
        let idle = self.pending.is_none() && self.events.is_empty() && self.deferred.is_empty();
        // (The intake adds that nothing waits behind a gap.)
        self.intake.acks_due(through && idle)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nats::runs::run_key;
    use crate::nats::toy::{toy_record, Toy};

    const STREAM: u16 = 3;
    const RUN: Run = Run { id: 10, began: 5 };

    /// The message of frame `seq` of `run` at subject sequence `seq`, under group key `k`.
    fn message(k: u8, run: Run, seq: u64, data: &[u8]) -> Bytes {
        message_at(k, run, seq, seq, data)
    }

    /// As [`message`], at subject sequence `wseq`.
    fn message_at(k: u8, run: Run, seq: u64, wseq: u64, data: &[u8]) -> Bytes {
        toy_record(STREAM, k, run, seq, wseq, data)
    }

    fn app() -> Receiver<Toy, u64> {
        let mut rx = Receiver::new(
            STREAM,
            true,
            GroupKey::first([1; 32], RUN),
            true,
            Duration::from_secs(30),
        );
        rx.intake().consumer_start(1);
        rx
    }

    fn next(rx: &mut Receiver<Toy, u64>, now: Instant) -> Poll {
        rx.poll(now).unwrap()
    }

    #[test]
    fn a_frame_under_a_key_not_yet_given_waits_for_it_and_holds_the_acknowledgements_back() {
        let now = Instant::now();
        let mut rx = app();
        rx.handle_message(now, &message(1, RUN, 0, b"a"), Some((Some(1), 1)));
        rx.handle_message(now, &message(2, RUN, 1, b"b"), Some((Some(2), 2)));
        assert!(
            matches!(next(&mut rx, now), Poll::Event(Event::Frame { ref frame, .. }) if frame.payload() == b"a")
        );
        // Under key 2, which this side was not given: it asks, and nothing is acknowledged
        // meanwhile (the message would not come again).
        assert!(matches!(next(&mut rx, now), Poll::Wait(Wait::Key)));
        assert!(matches!(next(&mut rx, now), Poll::Wait(Wait::Key)));
        assert!(rx.acks_due(true).is_empty());
        assert!(!rx.holds_nothing());
        let mut k = GroupKey::first([2; 32], RUN);
        k.previous = Some([1; 32]);
        k.since = 1;
        assert!(rx.handle_keys(now, k));
        rx.asked(now).unwrap();
        match next(&mut rx, now) {
            Poll::Event(Event::Frame {
                frame,
                stored,
                restarted,
                ..
            }) => {
                assert_eq!(frame.payload(), b"b");
                assert_eq!((stored, restarted), (Some(2), None));
            }
            p => panic!("{p:?}"),
        }
        assert!(matches!(next(&mut rx, now), Poll::Idle));
        assert!(rx.holds_nothing());
        assert_eq!(rx.acks_due(true), vec![1, 2]);
        assert_eq!((rx.records, rx.dropped()), (2, 0));
    }

    #[test]
    fn a_copy_taken_before_its_frame_opened_is_dropped_when_it_opens_too() {
        let now = Instant::now();
        let mut rx = app();
        let newer = Run { id: 11, began: 2 };
        // Run 10: frame 0, then frame 2 behind a gap.
        rx.handle_message(now, &message_at(1, RUN, 0, 0, b"a0"), Some((Some(1), 1)));
        rx.handle_message(now, &message_at(1, RUN, 2, 2, b"a2"), Some((Some(2), 2)));
        assert!(matches!(
            next(&mut rx, now),
            Poll::Event(Event::Frame { .. })
        ));
        // Run 11's first frame and a copy of it (stored again by someone who saw it go by),
        // both taken before either opened. The first opens: its hand-over waits for run 10's
        // frame 2, and the copy, next in line, opens too (the toy half keeps no replay window,
        // as the real one's after a key change): it is a copy all the same.
        let first = message_at(1, newer, 3, 0, b"sixteen bytes b3");
        rx.handle_message(now, &first, Some((Some(3), 3)));
        rx.handle_message(now, &first, Some((Some(4), 4)));
        let mut got = Vec::new();
        while let Poll::Event(e) = next(&mut rx, now) {
            if let Event::Frame { frame, .. } = e {
                got.push(frame.payload().to_vec());
            }
        }
        assert_eq!(
            got,
            vec![b"a2".to_vec(), b"sixteen bytes b3".to_vec()],
            "the copy is not delivered"
        );
        assert_eq!(rx.intake().copies, 1);
        assert_eq!(rx.acks_due(true), vec![1, 2, 3, 4]);
    }

    /// A [`Toy`] half with a replay window, as the real one: a payload that opened once is
    /// a replay, dropped before it is authenticated.
    struct Windowed(Toy, std::collections::HashSet<Vec<u8>>);

    impl RunHalf for Windowed {
        fn under(key: [u8; 32]) -> Windowed {
            Windowed(Toy::under(key), std::collections::HashSet::new())
        }
        fn open(
            &mut self,
            now: Instant,
            frame: Frame,
            wseq: u64,
            out: &mut Output,
        ) -> Result<super::super::keys::Outcome, ModuleError> {
            use super::super::keys::Outcome;
            let p = frame.payload().to_vec();
            if self.1.contains(&p) {
                return Ok(Outcome::Replayed);
            }
            let o = self.0.open(now, frame, wseq, out)?;
            if o == Outcome::Opened {
                self.1.insert(p);
            }
            Ok(o)
        }
    }

    #[test]
    fn a_copy_stored_after_a_rotation_read_before_the_genuine_frame_does_not_make_it_a_copy() {
        let now = Instant::now();
        // A device side in run 11, its earlier run 10 began at 0; the key rotated (1 → 2) at
        // stream sequence 10, before run 11 began at 20.
        let run = Run { id: 11, began: 20 };
        let mut keys = GroupKey::first([2; 32], RUN).next_run(run);
        keys.previous = Some([1; 32]);
        keys.since = 10;
        let mut rx: Receiver<Windowed, u64> =
            Receiver::new(STREAM, false, keys, false, Duration::from_secs(30));
        // An app frame of run 10 under the old key, stored at 8, and a copy of it stored at
        // 15 by someone who saw it go by. The new process's consumer delivers the copy first
        // (the genuine one again from its ack floor).
        let frame = message(1, RUN, 4, b"sixteen bytes a4");
        rx.handle_message(now, &frame, Some((Some(15), 15)));
        // (Dropped: it tells the app sides to join, as one an app side that missed the
        // rotation sealed.)
        assert!(matches!(next_of(&mut rx, now), Poll::Event(Event::TellRun)));
        assert!(matches!(next_of(&mut rx, now), Poll::Idle));
        assert_eq!((rx.dropped(), rx.opener().after_rotation), (1, 1));
        rx.handle_message(now, &frame, Some((Some(8), 8)));
        match next_of(&mut rx, now) {
            Poll::Event(Event::Frame { frame, stored, .. }) => {
                assert_eq!(
                    (frame.payload(), stored),
                    (&b"sixteen bytes a4"[..], Some(8))
                );
            }
            p => panic!("the genuine frame stored before the rotation is lost: {p:?}"),
        }
        // Copies of it from now on are dropped.
        rx.handle_message(now, &frame, Some((Some(9), 9)));
        rx.handle_message(now, &frame, Some((Some(16), 16)));
        while let Poll::Event(e) = next_of(&mut rx, now) {
            assert!(!matches!(e, Event::Frame { .. }), "{e:?}");
        }
        assert_eq!(rx.intake().copies, 2);
    }

    fn next_of(rx: &mut Receiver<Windowed, u64>, now: Instant) -> Poll {
        rx.poll(now).unwrap()
    }

    #[test]
    fn asking_in_vain_drops_the_record_and_gives_its_place_back() {
        let now = Instant::now();
        let mut rx = app();
        // A forged record at the place frame 0 should take.
        rx.handle_message(now, &message(9, RUN, 0, b"x"), Some((Some(1), 1)));
        assert!(matches!(next(&mut rx, now), Poll::Wait(Wait::Key)));
        rx.asked(now).unwrap();
        assert!(matches!(next(&mut rx, now), Poll::Idle));
        assert_eq!((rx.opener().forged, rx.dropped()), (1, 1));
        // The genuine frame 0, stored after it, still takes its place and opens.
        rx.handle_message(now, &message(1, RUN, 0, b"a"), Some((Some(2), 2)));
        assert!(
            matches!(next(&mut rx, now), Poll::Event(Event::Frame { ref frame, .. }) if frame.payload() == b"a")
        );
    }

    #[test]
    fn a_newer_run_says_join_again_and_restarts_and_an_end_is_said_once_per_run() {
        let now = Instant::now();
        let mut rx = app();
        let newer = Run { id: 11, began: 20 };
        rx.handle_message(now, &message(1, RUN, 0, b"a"), None);
        rx.handle_message(now, &message(1, newer, 0, b"b"), None);
        let end = |run: Run| {
            let mut p = run_key(&[1; 32], run)[..8].to_vec();
            p.extend_from_slice(&1u64.to_be_bytes());
            FrameRecord {
                stream: STREAM,
                flags: 0,
                run: run.id,
                began: run.began,
                seq: END_SEQ,
                timestamp_ns: 0,
                wseq: 1,
                payload: Bytes::from(p),
            }
            .encode()
        };
        rx.handle_message(now, &end(newer), None);
        rx.handle_message(now, &end(newer), None);
        assert!(matches!(
            next(&mut rx, now),
            Poll::Event(Event::Frame {
                restarted: None,
                ..
            })
        ));
        assert!(matches!(next(&mut rx, now), Poll::Event(Event::NewerRun)));
        assert!(matches!(
            next(&mut rx, now),
            Poll::Event(Event::Frame { restarted: Some((10, 0)), run, .. }) if run == newer
        ));
        assert!(
            matches!(next(&mut rx, now), Poll::Event(Event::End { first: true, run }) if run == newer)
        );
        // A lossy END goes three times (each sealed anew): the others are not the first.
        assert!(matches!(
            next(&mut rx, now),
            Poll::Event(Event::End { first: false, .. })
        ));
        assert!(matches!(next(&mut rx, now), Poll::Idle));
    }

    #[test]
    fn after_a_device_restart_the_old_runs_last_frames_go_to_the_stack_before_the_new_runs() {
        let now = Instant::now();
        let mut rx = app();
        let newer = Run { id: 11, began: 2 };
        // Run 10: frame 0, then frame 2 behind a gap (frame 1 died with the process).
        rx.handle_message(now, &message_at(1, RUN, 0, 0, b"a0"), Some((Some(1), 1)));
        rx.handle_message(now, &message_at(1, RUN, 2, 2, b"a2"), Some((Some(2), 2)));
        let payload = |p: Poll| match p {
            Poll::Event(Event::Frame {
                frame, restarted, ..
            }) => (frame.payload().to_vec(), restarted),
            p => panic!("{p:?}"),
        };
        assert_eq!(payload(next(&mut rx, now)), (b"a0".to_vec(), None));
        assert!(matches!(next(&mut rx, now), Poll::Idle));
        // Run 11's first two frames: the first opens, run 10's gap is given up at once, and
        // run 10's frame 2 goes first.
        rx.handle_message(now, &message_at(1, newer, 3, 0, b"b3"), Some((Some(3), 3)));
        rx.handle_message(now, &message_at(1, newer, 4, 1, b"b4"), Some((Some(4), 4)));
        assert!(matches!(next(&mut rx, now), Poll::Event(Event::NewerRun)));
        assert_eq!(payload(next(&mut rx, now)), (b"a2".to_vec(), None));
        assert_eq!(payload(next(&mut rx, now)), (b"b3".to_vec(), Some((10, 2))));
        assert_eq!(payload(next(&mut rx, now)), (b"b4".to_vec(), None));
        assert!(matches!(next(&mut rx, now), Poll::Idle));
        assert_eq!(rx.intake().skipped(), 1);
    }
}

//! One fan-out stream's sink side (sans-IO): its [`Receiver`], the stack of inverse halves
//! the opened frames go through, what the sink endpoint has completed, and the rules around
//! them that the binary's sink pump once held in an async loop no simulation reached:
//!
//! - **backpressure**: a reliable stream takes no more messages while frames wait for the
//!   sink ([`SinkFlow::wants_input`]); a lossy one keeps only the newest waiting frame, the
//!   older ones counted `stale`;
//! - **acknowledgements**: stored messages are acknowledged only once everything taken is
//!   through: handed to the sink and completed there, nothing held in the stack or behind a
//!   gap ([`SinkFlow::handle_tick`]);
//! - **a device restart**: what the stack holds of the old run goes to the sink, then the
//!   stack starts afresh ([`Notice::Restarted`]);
//! - **the END** of a side that runs once: stored frames still on their way come first (the
//!   driver is asked whether the consumer is drained, [`Action::CheckDrained`], for at most
//!   [`ENDING_WAIT`]); then the stack is flushed, the sink given up to [`FINISH_WAIT`] to
//!   complete, everything acknowledged, and the stream is over ([`Action::Done`]). A side that
//!   runs on waits for the source to start again;
//! - **stopping** ([`SinkFlow::handle_finish`]): what the stack holds goes to the sink, then
//!   the stream is over.
//!
//! The driver feeds messages, keys, the sink's completions and time in; takes frames for the
//! sink out of [`SinkFlow::poll_frame`] when the sink has room, and [`Action`]s out of
//! [`SinkFlow::poll`].

use super::intake::Taken;
use super::keys::{GroupKey, RunHalf};
use super::receive::{Acks, Event, Poll, Receiver, Wait};
use bytes::Bytes;
use ndd_core::{Frame, ModuleError, Stack, StackError};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How long a side that got a stream's END waits for stored frames still on their way.
pub const ENDING_WAIT: Duration = Duration::from_secs(15);
/// How long a side that got a stream's END waits for its sink to complete what it was
/// handed, before it stops without acknowledging the rest (it comes again to the next
/// process).
pub const FINISH_WAIT: Duration = Duration::from_secs(10);

/// Builds the stream's stack afresh (after a device restart).
pub type Rebuild = Box<dyn FnMut() -> Result<Stack, StackError> + Send>;

/// How the stream is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mode {
    /// The side ends with the stream's END (`--once`); otherwise it waits for the source to
    /// start again.
    pub once: bool,
    /// Lossy: only the newest frame waits for a busy sink.
    pub lossy: bool,
    /// Messages come from a JetStream consumer (they are acknowledged; an END may overtake
    /// stored frames still on their way).
    pub stored: bool,
}

/// Something for the log.
#[derive(Debug)]
pub enum Notice {
    /// A record that does not open under the group key was dropped.
    Unopened(ModuleError),
    /// The stack refused a frame (dropped).
    Refused(StackError),
    /// Stored frames that never came were given up; `skipped` so far.
    GaveUp {
        /// Frames given up, in all.
        skipped: u64,
    },
    /// The device side restarted: the stack starts afresh.
    Restarted {
        /// The run before, and the last sequence number taken of it.
        old: (u64, u64),
        /// The new run, and the sequence number of its first frame taken.
        new: (u64, u64),
    },
    /// The source ended this stream (first END of its run); a side that runs on waits for
    /// it to start again.
    SourceEnded,
    /// The END came but stored frames stayed unacknowledged for [`ENDING_WAIT`]: stopping
    /// anyway.
    EndingTimedOut,
    /// The sink did not complete what it was handed within [`FINISH_WAIT`]: stopping without
    /// acknowledging the rest.
    SinkUnfinished {
        /// Frames handed to the sink.
        handed: u64,
        /// Frames it completed.
        completed: u64,
    },
}

/// What the driver does next.
#[derive(Debug)]
pub enum Action<M> {
    /// Frames wait for the sink ([`SinkFlow::poll_frame`]): a reliable stream's as the sink
    /// takes them, a lossy one's if it has room now (else the next newer frame replaces it).
    Frames,
    /// Bring what the receiver waits for, then [`SinkFlow::handle_keys`] (and, after
    /// [`Wait::Key`], [`SinkFlow::asked`]).
    Wait(Wait),
    /// The receiver's signal ([`Event::NewerRun`]: join again; [`Event::TellRun`]: tell the
    /// app sides).
    Said(Event),
    /// For the log.
    Notice(Notice),
    /// Acknowledge these stored messages, in order, once what they name for the next
    /// process (where the stream stands, what was opened) is written.
    Ack(Acks<M>),
    /// Ask the broker whether every stored message of the stream reached this side, and say
    /// with [`SinkFlow::handle_drained`].
    CheckDrained,
    /// The END is final and the sink has every frame: close its channel, so it finishes
    /// (and completes what it holds).
    EndSink,
    /// The stream is over for this side.
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Running,
    /// The END came (a side that runs once) while stored frames may still be on their way.
    Draining {
        since: Instant,
        asking: bool,
    },
    /// Flushed: the sink completes what it was handed, until then.
    Finishing {
        until: Instant,
        told: bool,
    },
    /// Stopping: the last frames go to the sink, until then.
    Stopping {
        until: Instant,
    },
    Done,
}

/// Counters of the flow (the receiver keeps its own).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FlowCounters {
    /// Frames handed to the sink.
    pub handed: u64,
    /// Lossy frames replaced by a newer one while the sink was busy.
    pub stale: u64,
    /// Device restarts followed.
    pub restarts: u64,
    /// ENDs of a run older than one this stream took a frame of, ignored.
    pub old_ends: u64,
}

/// One sink stream's side (see the module's documentation).
pub struct SinkFlow<H, M> {
    rx: Receiver<H, M>,
    stack: Stack,
    rebuild: Rebuild,
    mode: Mode,
    completed: u64,
    ready: VecDeque<Frame>,
    phase: Phase,
    actions: VecDeque<Action<M>>,
    counters: FlowCounters,
    /// The newest device run this stream took a frame of.
    newest_run: Option<u64>,
}

impl<H, M> std::fmt::Debug for SinkFlow<H, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SinkFlow")
            .field("mode", &self.mode)
            .field("phase", &self.phase)
            .field("ready", &self.ready.len())
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

impl<H: RunHalf, M> SinkFlow<H, M> {
    /// The flow of `rx` into `stack` (built again by `rebuild` after a device restart).
    pub fn new(rx: Receiver<H, M>, stack: Stack, rebuild: Rebuild, mode: Mode) -> Self {
        SinkFlow {
            rx,
            stack,
            rebuild,
            mode,
            completed: 0,
            ready: VecDeque::new(),
            phase: Phase::Running,
            actions: VecDeque::new(),
            counters: FlowCounters::default(),
            newest_run: None,
        }
    }

    /// The receiving half (its intake, counters).
    pub fn receiver(&mut self) -> &mut Receiver<H, M> {
        &mut self.rx
    }

    /// The stack (its layers' stats).
    pub fn stack(&self) -> &Stack {
        &self.stack
    }

    /// How the stream is read.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The flow's counters.
    pub fn counters(&self) -> FlowCounters {
        self.counters
    }

    /// Whether the stream is over for this side.
    pub fn is_done(&self) -> bool {
        self.phase == Phase::Done && self.ready.is_empty() && self.actions.is_empty()
    }

    /// Whether the driver should read the next message: not while a reliable stream's frames
    /// wait for the sink (backpressure), nor once the stream is finishing.
    pub fn wants_input(&self) -> bool {
        matches!(self.phase, Phase::Running | Phase::Draining { .. })
            && (self.mode.lossy || self.ready.is_empty())
    }

    /// A message from the broker (`stored`: its stream sequence and handle, from JetStream).
    pub fn handle_message(
        &mut self,
        now: Instant,
        body: &Bytes,
        stored: Option<(Option<u64>, M)>,
    ) -> Taken {
        self.rx.handle_message(now, body, stored)
    }

    /// The keys as they stand now.
    pub fn handle_keys(&mut self, now: Instant, keys: GroupKey) -> bool {
        self.rx.handle_keys(now, keys)
    }

    /// After [`Wait::Key`]: what the ask brought has been handed in.
    pub fn asked(&mut self, now: Instant) {
        if let Err(e) = self.rx.asked(now) {
            self.actions.push_back(Action::Notice(Notice::Unopened(e)));
        }
    }

    /// The sink completed `total` frames so far (a running count).
    pub fn handle_completed(&mut self, now: Instant, total: u64) {
        self.completed = self.completed.max(total);
        self.finish_if_through(now);
    }

    /// The answer to [`Action::CheckDrained`].
    pub fn handle_drained(&mut self, now: Instant, drained: bool) {
        if let Phase::Draining { since, .. } = self.phase {
            self.phase = Phase::Draining {
                since,
                asking: false,
            };
            if drained && !self.rx.intake().has_unacked() {
                self.finish(now);
            }
        }
    }

    /// The side stops: what the stack holds goes to the sink, then the stream is over.
    pub fn handle_finish(&mut self, now: Instant) -> Result<(), StackError> {
        if self.phase == Phase::Done {
            return Ok(());
        }
        self.stack.flush(now)?;
        self.pull();
        self.phase = Phase::Stopping {
            until: now + FINISH_WAIT,
        };
        Ok(())
    }

    /// When the stack wants [`SinkFlow::handle_timeout`].
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.stack.poll_timeout()
    }

    /// The stack's timers.
    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), StackError> {
        self.stack.handle_timeout(now)?;
        self.pull();
        Ok(())
    }

    /// The driver's periodic check (every few tens of milliseconds): stored frames that never
    /// came are given up after the receiver's wait, what is through is acknowledged, an END's
    /// wait for stored frames goes on or ends.
    pub fn handle_tick(&mut self, now: Instant) {
        if self.rx.handle_timeout(now) {
            let skipped = self.rx.intake().skipped();
            self.actions
                .push_back(Action::Notice(Notice::GaveUp { skipped }));
        }
        if matches!(self.phase, Phase::Running | Phase::Draining { .. }) && self.through() {
            self.ack(now, true);
        }
        if let Phase::Draining { since, asking } = self.phase {
            if now.saturating_duration_since(since) > ENDING_WAIT {
                self.actions
                    .push_back(Action::Notice(Notice::EndingTimedOut));
                self.finish(now);
            } else if !asking && !self.rx.intake().has_unacked() {
                // Everything taken so far is acknowledged: is anything still on its way?
                self.phase = Phase::Draining {
                    since,
                    asking: true,
                };
                self.actions.push_back(Action::CheckDrained);
            }
        }
        if let Phase::Stopping { until } = self.phase {
            if now >= until && !self.ready.is_empty() {
                // A sink that takes nothing more does not keep a stopping side.
                self.actions
                    .push_back(Action::Notice(Notice::SinkUnfinished {
                        handed: self.counters.handed,
                        completed: self.completed,
                    }));
                self.ready.clear();
            }
        }
        if let Phase::Finishing { until, .. } = self.phase {
            if now >= until {
                // A sink that stopped taking frames, or completing them: what it did not take
                // is dropped, what it did not complete stays unacknowledged (it comes again).
                self.ready.clear();
                self.actions
                    .push_back(Action::Notice(Notice::SinkUnfinished {
                        handed: self.counters.handed,
                        completed: self.completed,
                    }));
                self.phase = Phase::Done;
            }
        }
    }

    /// Whether a frame waits for the sink.
    pub fn has_frame(&self) -> bool {
        !self.ready.is_empty()
    }

    /// The next frame for the sink; call when the sink has room for it.
    pub fn poll_frame(&mut self) -> Option<Frame> {
        let f = self.ready.pop_front()?;
        self.counters.handed += 1;
        Some(f)
    }

    /// The next thing for the driver; `None`: wait for messages, keys, completions or time.
    /// An error is the stack failing to start afresh after a device restart.
    pub fn poll(&mut self, now: Instant) -> Result<Option<Action<M>>, StackError> {
        loop {
            if let Some(a) = self.actions.pop_front() {
                return Ok(Some(a));
            }
            match self.phase {
                Phase::Stopping { .. } if self.ready.is_empty() => {
                    self.phase = Phase::Done;
                    return Ok(Some(Action::Done));
                }
                Phase::Finishing { until, told: false } if self.ready.is_empty() => {
                    self.phase = Phase::Finishing { until, told: true };
                    return Ok(Some(Action::EndSink));
                }
                Phase::Finishing { .. } => {
                    self.finish_if_through(now);
                    if self.phase == Phase::Done {
                        continue;
                    }
                    return Ok(None);
                }
                Phase::Done if self.ready.is_empty() => return Ok(Some(Action::Done)),
                _ => {}
            }
            if !self.wants_input() {
                return Ok(None);
            }
            let event = match self.rx.poll(now) {
                Ok(Poll::Event(e)) => e,
                Ok(Poll::Wait(w)) => return Ok(Some(Action::Wait(w))),
                Ok(Poll::Idle) => return Ok(None),
                Err(e) => return Ok(Some(Action::Notice(Notice::Unopened(e)))),
            };
            match event {
                Event::Frame {
                    frame,
                    run,
                    restarted,
                    ..
                } => {
                    self.newest_run = self.newest_run.max(Some(run.id));
                    if let Some(old) = restarted {
                        // The device side restarted: its forward halves start from nothing.
                        // What ours hold of its last run goes to the sink, then they start
                        // afresh too, as on a direct link.
                        self.stack.flush(now)?;
                        self.pull();
                        self.stack = (self.rebuild)()?;
                        self.counters.restarts += 1;
                        self.actions.push_back(Action::Notice(Notice::Restarted {
                            old,
                            new: (run.id, frame.meta.seq),
                        }));
                    }
                    if let Err(e) = self.stack.handle_frame(now, frame) {
                        self.actions.push_back(Action::Notice(Notice::Refused(e)));
                    }
                    self.pull();
                    if !self.ready.is_empty() {
                        self.actions.push_back(Action::Frames);
                    }
                }
                Event::End { run, .. } if self.newest_run.is_some_and(|n| run.id < n) => {
                    // A run this stream has moved on from ended long ago (a stored END played
                    // late, or again): it ends nothing now.
                    self.counters.old_ends += 1;
                }
                Event::End { first, .. } => {
                    if self.mode.once {
                        if self.mode.stored {
                            if !matches!(self.phase, Phase::Draining { .. }) {
                                self.phase = Phase::Draining {
                                    since: now,
                                    asking: false,
                                };
                            }
                        } else {
                            self.finish(now);
                        }
                    } else if first {
                        self.actions.push_back(Action::Notice(Notice::SourceEnded));
                    }
                }
                e @ (Event::NewerRun | Event::TellRun) => return Ok(Some(Action::Said(e))),
            }
        }
    }

    /// Everything taken is through: handed to the sink and completed, nothing in the stack.
    fn through(&self) -> bool {
        self.ready.is_empty()
            && self.completed >= self.counters.handed
            && self.stack.poll_timeout().is_none()
    }

    fn ack(&mut self, now: Instant, through: bool) {
        if let Some(a) = self.rx.acks(now, through) {
            self.actions.push_back(Action::Ack(a));
        }
    }

    /// The END is final: the stack's last frames to the sink, which gets [`FINISH_WAIT`].
    fn finish(&mut self, now: Instant) {
        if let Err(e) = self.stack.flush(now) {
            self.actions.push_back(Action::Notice(Notice::Refused(e)));
        }
        self.pull();
        self.phase = Phase::Finishing {
            until: now + FINISH_WAIT,
            told: false,
        };
    }

    /// Finishing, once the sink completed everything: every message taken acknowledged (one
    /// the receiver still holds unopened, of a later run, is not: it comes to the next
    /// process), done.
    fn finish_if_through(&mut self, now: Instant) {
        if matches!(self.phase, Phase::Finishing { .. })
            && self.ready.is_empty()
            && self.completed >= self.counters.handed
        {
            let through = self.stack.poll_timeout().is_none();
            self.ack(now, through);
            self.phase = Phase::Done;
        }
    }

    /// The stack's frames, ready for the sink; lossy: only the newest waits.
    fn pull(&mut self) {
        while let Some(f) = self.stack.poll_frame() {
            if self.mode.lossy
                && !matches!(self.phase, Phase::Stopping { .. } | Phase::Finishing { .. })
            {
                self.counters.stale += self.ready.len() as u64;
                self.ready.clear();
            }
            self.ready.push_back(f);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nats::record::END_SEQ;
    use crate::nats::runs::Run;
    use crate::nats::toy::{toy_record, Rng, Toy};
    use ndd_core::Role;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    const STREAM: u16 = 3;
    const RUN: Run = Run { id: 10, began: 5 };
    const KEY: u8 = 1;

    /// Frame `seq` of `run` (subject sequence `seq`; `END_SEQ`: the END, at `wseq`).
    fn message(run: Run, seq: u64, wseq: u64, data: &[u8]) -> Bytes {
        toy_record(STREAM, KEY, run, seq, wseq, data)
    }

    fn frame_msg(seq: u64) -> Bytes {
        message(RUN, seq, seq, &seq.to_be_bytes())
    }

    fn end_msg(wseq: u64) -> Bytes {
        message(RUN, END_SEQ, wseq, b"")
    }

    fn stack() -> Stack {
        Stack::build(Role::Sink, "s", &[]).unwrap()
    }

    fn flow(mode: Mode) -> (SinkFlow<Toy, u64>, Arc<AtomicU32>) {
        flow_of(mode, true)
    }

    /// `ordered`: one publisher's stored frames, put back in their order.
    fn flow_of(mode: Mode, ordered: bool) -> (SinkFlow<Toy, u64>, Arc<AtomicU32>) {
        let mut rx = Receiver::new(
            STREAM,
            true,
            GroupKey::first([KEY; 32], RUN),
            ordered,
            // Long: these schedules hold a message back for seconds, and a gap given up
            // would skip its frame (the intake's tests cover that).
            Duration::from_secs(600),
        );
        rx.intake().consumer_start(1);
        let built = Arc::new(AtomicU32::new(0));
        let b = built.clone();
        let rebuild: Rebuild = Box::new(move || {
            b.fetch_add(1, Ordering::Relaxed);
            Ok(stack())
        });
        (SinkFlow::new(rx, stack(), rebuild, mode), built)
    }

    const STORED_ONCE: Mode = Mode {
        once: true,
        lossy: false,
        stored: true,
    };

    /// Polls until idle: the actions, and the frames taken for the sink (as many as `room`).
    fn drive(
        f: &mut SinkFlow<Toy, u64>,
        now: Instant,
        room: usize,
    ) -> (Vec<Action<u64>>, Vec<u64>) {
        let mut actions = Vec::new();
        let mut frames = Vec::new();
        loop {
            while frames.len() < room {
                match f.poll_frame() {
                    Some(fr) => {
                        frames.push(u64::from_be_bytes(fr.payload()[..8].try_into().unwrap()))
                    }
                    None => break,
                }
            }
            match f.poll(now).unwrap() {
                Some(Action::Frames) => {}
                Some(Action::Done) => {
                    actions.push(Action::Done);
                    break;
                }
                Some(a) => actions.push(a),
                None => {
                    if frames.len() >= room || f.ready.is_empty() {
                        break;
                    }
                }
            }
        }
        (actions, frames)
    }

    /// Ticks every 20 ms from `from`, the sink taking nothing, until the stream is over or
    /// `limit` passed: when it stopped, and the actions seen.
    fn tick_until_done(
        f: &mut SinkFlow<Toy, u64>,
        from: Instant,
        limit: Duration,
    ) -> (Instant, Vec<Action<u64>>) {
        let mut t = from;
        let mut seen = Vec::new();
        while !f.is_done() && t < from + limit {
            t += Duration::from_millis(20);
            f.handle_tick(t);
            seen.extend(drive(f, t, 0).0);
        }
        (t, seen)
    }

    fn acks(actions: &[Action<u64>]) -> Vec<u64> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Ack(a) => Some(a.msgs.clone()),
                _ => None,
            })
            .flatten()
            .collect()
    }

    #[test]
    fn stored_frames_are_acknowledged_only_once_the_sink_completed_them() {
        let now = Instant::now();
        let (mut f, _) = flow(STORED_ONCE);
        for s in 0..3 {
            f.handle_message(now, &frame_msg(s), Some((Some(s + 1), s + 1)));
        }
        let (_, got) = drive(&mut f, now, usize::MAX);
        assert_eq!(got, [0, 1, 2]);
        f.handle_tick(now);
        let (a, _) = drive(&mut f, now, 0);
        assert!(
            acks(&a).is_empty(),
            "nothing acknowledged before the sink completed: {a:?}"
        );
        f.handle_completed(now, 2);
        f.handle_tick(now);
        assert!(
            acks(&drive(&mut f, now, 0).0).is_empty(),
            "two of three completed"
        );
        f.handle_completed(now, 3);
        f.handle_tick(now);
        assert_eq!(acks(&drive(&mut f, now, 0).0), [1, 2, 3]);
    }

    #[test]
    fn a_reliable_stream_reads_no_more_while_frames_wait_for_the_sink() {
        let now = Instant::now();
        let (mut f, _) = flow(STORED_ONCE);
        f.handle_message(now, &frame_msg(0), Some((Some(1), 1)));
        f.handle_message(now, &frame_msg(1), Some((Some(2), 2)));
        assert!(f.wants_input());
        let (_, got) = drive(&mut f, now, 0);
        assert!(got.is_empty());
        assert!(!f.wants_input(), "a frame waits for the sink");
        assert_eq!(
            f.ready.len(),
            1,
            "the second message is not opened meanwhile"
        );
        let (_, got) = drive(&mut f, now, usize::MAX);
        assert_eq!(got, [0, 1]);
        assert!(f.wants_input());
    }

    #[test]
    fn a_lossy_stream_keeps_only_the_newest_frame_for_a_busy_sink() {
        let now = Instant::now();
        let (mut f, _) = flow(Mode {
            once: false,
            lossy: true,
            stored: false,
        });
        for s in 0..5 {
            f.handle_message(now, &frame_msg(s), None);
        }
        let (_, got) = drive(&mut f, now, 0);
        assert!(got.is_empty());
        assert!(f.wants_input(), "a lossy stream reads on");
        let (_, got) = drive(&mut f, now, usize::MAX);
        assert_eq!(got, [4]);
        assert_eq!(f.counters().stale, 4);
    }

    #[test]
    fn the_end_waits_for_stored_frames_then_for_the_sink_then_acknowledges_everything() {
        let t0 = Instant::now();
        let (mut f, _) = flow(STORED_ONCE);
        f.handle_message(t0, &frame_msg(0), Some((Some(1), 1)));
        f.handle_message(t0, &end_msg(2), Some((Some(3), 3)));
        let (a, got) = drive(&mut f, t0, usize::MAX);
        assert_eq!(got, [0]);
        assert!(a.is_empty(), "{a:?}");
        // Stored frame 1 (stream sequence 2) is still on its way: nothing more before it.
        f.handle_completed(t0, 1);
        f.handle_tick(t0);
        let (a, _) = drive(&mut f, t0, usize::MAX);
        assert!(
            !a.iter()
                .any(|a| matches!(a, Action::CheckDrained | Action::Done)),
            "{a:?}"
        );
        f.handle_message(t0, &frame_msg(1), Some((Some(2), 2)));
        let (_, got) = drive(&mut f, t0, usize::MAX);
        assert_eq!(got, [1]);
        // The sink has not completed frame 1 yet: nothing acknowledged, nothing asked.
        f.handle_tick(t0);
        let (a, _) = drive(&mut f, t0, usize::MAX);
        assert!(a.is_empty(), "{a:?}");
        f.handle_completed(t0, 2);
        f.handle_tick(t0);
        let (a, _) = drive(&mut f, t0, usize::MAX);
        let mut acked = acks(&a);
        acked.sort_unstable();
        assert_eq!(acked, [1, 2, 3]);
        assert!(a.iter().any(|a| matches!(a, Action::CheckDrained)), "{a:?}");
        // The consumer says more is on its way: the flow asks again at the next tick.
        f.handle_drained(t0, false);
        f.handle_tick(t0);
        assert!(drive(&mut f, t0, 0)
            .0
            .iter()
            .any(|a| matches!(a, Action::CheckDrained)));
        f.handle_drained(t0, true);
        let (a, _) = drive(&mut f, t0, usize::MAX);
        assert!(matches!(a[..], [Action::EndSink, Action::Done]), "{a:?}");
        assert!(f.is_done());
        assert!(!f.wants_input());
    }

    #[test]
    fn the_end_stops_waiting_for_stored_frames_and_for_the_sink_after_a_while() {
        let t0 = Instant::now();
        let (mut f, _) = flow(STORED_ONCE);
        f.handle_message(t0, &frame_msg(0), Some((Some(1), 1)));
        f.handle_message(t0, &end_msg(1), Some((Some(2), 2)));
        let (_, got) = drive(&mut f, t0, usize::MAX);
        assert_eq!(got, [0]);
        // The consumer never says it is drained; the sink never completes.
        let mut t = t0;
        let mut seen = Vec::new();
        while !f.is_done() && t < t0 + ENDING_WAIT + FINISH_WAIT + Duration::from_secs(1) {
            t += Duration::from_millis(20);
            f.handle_tick(t);
            let (a, _) = drive(&mut f, t, usize::MAX);
            for a in a {
                if let Action::CheckDrained = a {
                    f.handle_drained(t, false);
                }
                seen.push(a);
            }
        }
        assert!(f.is_done(), "{seen:?}");
        assert!(t >= t0 + ENDING_WAIT + FINISH_WAIT, "{:?}", t - t0);
        assert!(seen
            .iter()
            .any(|a| matches!(a, Action::Notice(Notice::EndingTimedOut))));
        assert!(seen.iter().any(|a| matches!(
            a,
            Action::Notice(Notice::SinkUnfinished {
                handed: 1,
                completed: 0
            })
        )));
        assert!(
            acks(&seen).is_empty(),
            "what the sink did not complete is not acknowledged"
        );
    }

    #[test]
    fn a_sink_that_takes_nothing_does_not_keep_the_end_waiting_for_ever() {
        let t0 = Instant::now();
        let (mut f, _) = flow(Mode {
            once: true,
            lossy: false,
            stored: false,
        });
        f.handle_message(t0, &frame_msg(0), None);
        f.handle_message(t0, &end_msg(1), None);
        // The sink never has room: frame 0 waits, the END is not read behind it.
        let (a, got) = drive(&mut f, t0, 0);
        assert!(got.is_empty() && a.is_empty(), "{a:?}");
        let (t, mut seen) = tick_until_done(&mut f, t0, Duration::from_secs(60));
        assert!(
            !f.is_done(),
            "the END was never read: the stream is not over by itself"
        );
        // Stopping then ends it within FINISH_WAIT, though the sink still takes nothing.
        let stopped = t;
        f.handle_finish(t).unwrap();
        let (t, more) = tick_until_done(&mut f, t, FINISH_WAIT + Duration::from_secs(1));
        seen.extend(more);
        assert!(f.is_done(), "{seen:?}");
        assert!(t >= stopped + FINISH_WAIT);
        assert!(seen
            .iter()
            .any(|a| matches!(a, Action::Notice(Notice::SinkUnfinished { .. }))));
    }

    #[test]
    fn the_finish_wait_ends_even_while_frames_wait_for_a_full_sink() {
        let t0 = Instant::now();
        let (mut f, _) = flow(Mode {
            once: true,
            lossy: false,
            stored: false,
        });
        f.handle_message(t0, &frame_msg(0), None);
        f.handle_message(t0, &end_msg(1), None);
        // Frame 0 is taken, then the END is read; the stack's flush leaves nothing, but a
        // frame handed over is never completed and a second one never taken.
        let (_, got) = drive(&mut f, t0, 1);
        assert_eq!(got, [0]);
        let _ = drive(&mut f, t0, 0);
        let (_, seen) = tick_until_done(&mut f, t0, FINISH_WAIT + Duration::from_secs(1));
        assert!(f.is_done(), "{seen:?}");
        assert!(seen
            .iter()
            .any(|a| matches!(a, Action::Notice(Notice::SinkUnfinished { .. }))));
    }

    #[test]
    fn a_side_that_runs_on_waits_for_the_source_after_its_end() {
        let now = Instant::now();
        let (mut f, _) = flow(Mode {
            once: false,
            lossy: false,
            stored: false,
        });
        f.handle_message(now, &frame_msg(0), None);
        f.handle_message(now, &end_msg(1), None);
        let (a, got) = drive(&mut f, now, usize::MAX);
        assert_eq!(got, [0]);
        assert!(
            matches!(a[..], [Action::Notice(Notice::SourceEnded)]),
            "{a:?}"
        );
        assert!(f.wants_input() && !f.is_done());
    }

    #[test]
    fn an_end_of_a_run_the_stream_moved_on_from_ends_nothing() {
        let now = Instant::now();
        // Stored frames taken as they come (a round-robin member's): in one publisher's
        // order, a late END is below the order and dropped already.
        let (mut f, _) = flow_of(STORED_ONCE, false);
        let newer = Run { id: 11, began: 2 };
        f.handle_message(now, &frame_msg(0), Some((Some(1), 1)));
        f.handle_message(
            now,
            &message(newer, 0, 3, &7u64.to_be_bytes()),
            Some((Some(3), 3)),
        );
        let (_, got) = drive(&mut f, now, usize::MAX);
        assert_eq!(got, [0, 7]);
        // Run 10's END, stored before run 11 began, comes late (delivered again, or played
        // by someone who names its place): it ends nothing now.
        f.handle_message(now, &end_msg(1), Some((Some(2), 2)));
        drive(&mut f, now, usize::MAX);
        assert!(!f.is_done() && f.wants_input());
        assert_eq!(f.counters().old_ends, 1);
    }

    #[test]
    fn a_device_restart_starts_the_stack_afresh_and_stopping_ends_the_stream() {
        let now = Instant::now();
        let (mut f, built) = flow(Mode {
            once: false,
            lossy: false,
            stored: false,
        });
        let newer = Run { id: 11, began: 2 };
        f.handle_message(now, &frame_msg(0), None);
        f.handle_message(now, &message(newer, 2, 0, &7u64.to_be_bytes()), None);
        let (a, got) = drive(&mut f, now, usize::MAX);
        assert_eq!(got, [0, 7]);
        assert_eq!(built.load(Ordering::Relaxed), 1);
        assert!(
            a.iter().any(|a| matches!(
                a,
                Action::Notice(Notice::Restarted {
                    old: (10, 0),
                    new: (11, 2)
                })
            )),
            "{a:?}"
        );
        f.handle_finish(now).unwrap();
        assert!(matches!(
            drive(&mut f, now, usize::MAX).0[..],
            [Action::Done]
        ));
        assert!(f.is_done());
    }

    #[test]
    fn random_schedules_deliver_every_stored_frame_once_and_acknowledge_only_what_the_sink_completed(
    ) {
        // JetStream delivers a stored stream's messages late, out of order, and again (an
        // ack that did not arrive in time); the sink completes at its own pace; the END may
        // overtake frames. Over random schedules: every frame reaches the sink once and in
        // order, no message is acknowledged before the sink completed its frame, and the
        // stream ends with everything acknowledged.
        for seed in 1..=2000u64 {
            let mut rng = Rng::seeded(seed);
            let n = 1 + rng.below(40);
            let t0 = Instant::now();
            let (mut f, _) = flow(STORED_ONCE);
            // Stream sequence s + 1 holds frame s; the END is last.
            let mut queue: Vec<(u64, Bytes)> = (0..n).map(|s| (s + 1, frame_msg(s))).collect();
            queue.push((n + 1, end_msg(n)));
            let mut sent: Vec<(u64, Bytes)> = Vec::new();
            let mut got = Vec::new();
            let mut completed = 0u64;
            let mut acked: Vec<u64> = Vec::new();
            let mut t = t0;
            let mut steps = 0;
            while !f.is_done() {
                steps += 1;
                assert!(
                    steps < 100_000,
                    "seed {seed}: never done ({f:?}, got {got:?})"
                );
                t += Duration::from_millis(1 + rng.below(30));
                match rng.below(6) {
                    0 | 1 if !queue.is_empty() && f.wants_input() => {
                        // Out of order: any of the next three.
                        let i = rng.below(queue.len().min(3) as u64) as usize;
                        let (sseq, m) = queue.remove(i);
                        f.handle_message(t, &m, Some((Some(sseq), sseq)));
                        sent.push((sseq, m));
                    }
                    2 if !sent.is_empty() && f.wants_input() => {
                        // Redelivered.
                        let (sseq, m) = sent[rng.below(sent.len() as u64) as usize].clone();
                        f.handle_message(t, &m, Some((Some(sseq), sseq)));
                    }
                    3 => {
                        completed = (completed + rng.below(3)).min(got.len() as u64);
                        f.handle_completed(t, completed);
                    }
                    _ => f.handle_tick(t),
                }
                if queue.is_empty() && rng.below(4) == 0 {
                    completed = got.len() as u64;
                    f.handle_completed(t, completed);
                }
                let room = rng.below(3) as usize;
                let (actions, frames) = drive(&mut f, t, room);
                got.extend(frames);
                for a in actions {
                    match a {
                        Action::Ack(a) => {
                            for m in a.msgs {
                                // Message s + 1 holds frame s; the END's frame is all of them.
                                let needs = m.min(n);
                                assert!(
                                    completed >= needs,
                                    "seed {seed}: message {m} acknowledged with {completed} completed, n {n}, {f:?}"
                                );
                                acked.push(m);
                            }
                        }
                        // As JetStream says: nothing pending, nothing waiting for its ack.
                        Action::CheckDrained => {
                            let mut all = acked.clone();
                            all.sort_unstable();
                            all.dedup();
                            f.handle_drained(t, queue.is_empty() && all.len() as u64 == n + 1)
                        }
                        Action::Wait(w) => panic!("seed {seed}: waits for {w:?}"),
                        _ => {}
                    }
                }
            }
            assert_eq!(got, (0..n).collect::<Vec<_>>(), "seed {seed}");
            acked.sort_unstable();
            acked.dedup();
            assert_eq!(acked, (1..=n + 1).collect::<Vec<_>>(), "seed {seed}");
        }
    }
}

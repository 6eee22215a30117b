//! A fan-out source stream from its stack to the broker (sans-IO): the [`Sender`] (sealing,
//! the outbox, following the keys) and the rules around it that the binary's publisher once
//! held in `await`s:
//!
//! - **room:** no new frame while more than [`IN_FLIGHT`] stored publishes wait for their
//!   acknowledgement, while frames kept from before new keys are still to be sealed again, or
//!   while following new keys waits for acknowledgements ([`Follow::Settle`]);
//! - **the rotation's gate** (a device side's reliable stream): when the device's rotation
//!   begins ([`SINCE_PENDING`]) nothing new is sealed; once everything sealed under the old key
//!   is stored the stream says so once ([`SourceFlow::poll_gate`]: the rotation then reads
//!   where the stream stands) and waits for the rotation's keys;
//! - **the END:** once the source ended and everything before it is stored and the keys are
//!   followed, a sealed empty frame numbered [`END_SEQ`] goes on every subject of the stream
//!   (and to every round-robin member), waits for room rather than being dropped, is stored
//!   (JetStream) and flushed; on core NATS it goes again after each of [`END_REPEATS`] (a
//!   message may be lost there; app sides take the first and pass over the others). Then the
//!   stream is done — except an app side's reliable stream, which first **confirms the
//!   device's run** ([`SourceFlow::poll_confirm`]): the device may have restarted while the
//!   last frames went, and a new run refuses what was sealed for the old one and stored after
//!   it began (`super::runs`); only this side can seal them again, so before it is done it asks
//!   the device for the keys once more ([`SourceFlow::handle_confirmed`]) and, under a new run,
//!   seals again what the device no longer opens, and the END after it.
//!
//! The driver hands in frames (while [`SourceFlow::ready`]), keys, acknowledgements,
//! reconnects and time, hands [`SourceFlow::poll_transmit`]'s messages to the client, flushes
//! the client when [`SourceFlow::poll_flush`] asks and says so with
//! [`SourceFlow::handle_flushed`].

use super::keys::{GroupKey, SINCE_PENDING};
use super::outbox::Publish;
use super::record::END_SEQ;
use super::send::{Follow, RunSeal, Sender};
use ndd_core::{Frame, Meta, ModuleError};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Stored publishes awaiting their acknowledgement, per stream, at most.
pub const IN_FLIGHT: usize = 256;

/// How long an app side's reliable stream asks the device for its keys, once its END is
/// stored, while no answer comes (a device side that is there but does not answer: frozen, or
/// still starting under load); past it the stream is done unconfirmed.
pub const CONFIRM_WAIT: Duration = Duration::from_secs(20);

/// After a lossy stream's END, the pauses before it goes again (core NATS may lose one).
pub const END_REPEATS: [Duration; 2] = [Duration::from_millis(20), Duration::from_millis(100)];

/// Why a frame could not be published.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// Sealing failed.
    #[error("encrypt: {0}")]
    Seal(#[from] ModuleError),
    /// The sealed record exceeds what the server takes.
    #[error("a frame of {len} bytes exceeds the NATS server's max_payload ({max} bytes); raise max_payload in the server's configuration, or cut frames with multiplex split")]
    TooLarge {
        /// The record's length.
        len: usize,
        /// The server's `max_payload`.
        max: usize,
    },
}

/// Where a stream's END goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndPlan {
    /// Every subject the stream's frames use, with its part of a split stream.
    pub subjects: Vec<(String, Option<u16>)>,
    /// A round-robin stream: the subject every member hears (core NATS, outside the outbox).
    pub broadcast: Option<String>,
}

/// Where the END stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// The source goes on.
    No,
    /// The source ended: the END goes once everything before it is stored.
    Due,
    /// END number `sent` (1-based) went; it is stored, then the client is flushed.
    Sent { sent: usize },
    /// The client is being flushed after END number `sent`.
    Flushing { sent: usize },
    /// The next END goes at `at`.
    Pause { sent: usize, at: Instant },
    /// Stored and flushed; the device's run is being confirmed (asked: the driver was told;
    /// `until`: unanswered questions are asked again until then).
    Confirm { asked: bool, until: Instant },
    /// Done.
    Done,
}

/// One fan-out source stream (see the module's documentation); `K` is a frame as it was
/// before sealing, kept to be sealed again after a rotation.
#[derive(Debug)]
pub struct SourceFlow<S, K> {
    /// The sealing half and its outbox.
    pub sender: Sender<S, K>,
    stream: u16,
    /// Whether frames go to JetStream (no END repeats: it is stored).
    stored: bool,
    /// A device side's reliable stream: it takes part in the rotation's gate.
    gated: bool,
    /// An app side's reliable stream: it confirms the device's run before it is done.
    confirms: bool,
    max_payload: usize,
    end: EndPlan,
    /// Keys to follow once the outbox is settled (or the rotation's final ones).
    want: Option<GroupKey>,
    /// The rotation began: settled under the old key, told (`true`) or not yet.
    gate: Option<bool>,
    /// The gate's settled notice, for the driver.
    gate_notice: bool,
    /// Kept frames to be sealed again before anything new.
    again: VecDeque<K>,
    /// Messages outside the outbox (a round-robin END).
    records: VecDeque<Publish>,
    ending: Ending,
    /// The END's timestamp (each time it goes).
    end_wall_ns: u64,
    /// ENDs sent in the current series (each time on every subject).
    pub ends_sent: usize,
    /// ENDs sent in all (a series starts again when new keys came after one).
    pub end_rounds: usize,
}

/// What a [`SourceFlow`] asks its driver for ([`SourceFlow::poll_io`]).
#[derive(Debug)]
pub enum SourceIo<K> {
    /// Hand this message to the client (a stored one's acknowledgement, or its failure, to
    /// [`SourceFlow::handle_ack`]).
    Transmit(Publish),
    /// Tell the rotation's gate this stream settled (once per rotation).
    GateSettled,
    /// Flush the client, then [`SourceFlow::handle_flushed`].
    Flush,
    /// Ask the device for its keys (the key follower), then [`SourceFlow::handle_confirmed`]
    /// or [`SourceFlow::handle_unconfirmed`].
    Confirm,
    /// Seal this kept frame again under the new keys: [`SourceFlow::handle_frame`] with it,
    /// kept again.
    Again(K),
}

impl<S: RunSeal, K> SourceFlow<S, K> {
    /// A stream over `sender`; `stored`: on JetStream; `gated`: a device side's reliable
    /// stream (the rotation's gate); `max_payload`: the server's; `end`: where its END goes.
    pub fn new(
        sender: Sender<S, K>,
        stream: u16,
        stored: bool,
        gated: bool,
        max_payload: usize,
        end: EndPlan,
    ) -> Self {
        // A gated stream that starts mid-rotation (the device's sources start once enough app
        // sides joined, while its keeper may be rotating) has nothing under the old key: it
        // is settled at once and says so, and waits for the rotation's keys like the others.
        // Before, it never said so (no new keys came for that rotation) and the gate waited
        // its whole GATE_WAIT (found by a review).
        let mid_rotation = gated && sender.keys().since == SINCE_PENDING;
        let confirms = stored && !gated && sender.outbox.keeps();
        SourceFlow {
            sender,
            stream,
            stored,
            gated,
            confirms,
            max_payload,
            end,
            want: None,
            gate: mid_rotation.then_some(true),
            gate_notice: mid_rotation,
            again: VecDeque::new(),
            records: VecDeque::new(),
            ending: Ending::No,
            end_wall_ns: 0,
            ends_sent: 0,
            end_rounds: 0,
        }
    }

    /// Whether a new frame may be handed in: room in flight, no keys to follow, nothing to
    /// seal again, no rotation's gate closed, the source not ended.
    pub fn ready(&self) -> bool {
        self.ending == Ending::No && self.following_done()
    }

    fn following_done(&self) -> bool {
        self.want.is_none()
            && self.gate.is_none()
            && self.again.is_empty()
            && self.sender.outbox.in_flight() <= IN_FLIGHT
    }

    /// Whether the END is on its way (its messages wait for room, never dropped).
    pub fn is_ending(&self) -> bool {
        !matches!(self.ending, Ending::No)
    }

    /// Whether the END went (every time it goes) and is stored and flushed.
    pub fn is_done(&self) -> bool {
        self.ending == Ending::Done
    }

    /// Seals `frame` for `subject` (`part`: its part of a split stream) and publishes it,
    /// kept with `keep` to be sealed again after a rotation; the sealed frame's length. Also
    /// for a kept frame from [`SourceFlow::poll_again`], which goes before anything new.
    pub fn handle_frame(
        &mut self,
        now: Instant,
        subject: &str,
        part: Option<u16>,
        frame: Frame,
        keep: Option<(usize, K)>,
    ) -> Result<usize, SendError> {
        let (_, len) = self.sender.send(now, subject, part, frame, keep)?;
        let wire = len + super::record::HEADER_LEN;
        if wire > self.max_payload {
            return Err(SendError::TooLarge {
                len: wire,
                max: self.max_payload,
            });
        }
        Ok(len)
    }

    /// New keys (the watch of the side's keys changed): followed now, once the outbox is
    /// settled, or, for the rotation's gate, once its final keys come.
    pub fn handle_keys(&mut self, now: Instant, keys: GroupKey) -> Result<(), SendError> {
        if self.gated && keys.since == SINCE_PENDING {
            if self.gate.is_none() {
                self.gate = Some(false);
            }
            self.want = None;
        } else {
            self.gate = None;
            self.gate_notice = false;
            // Once done, nothing is sealed again. Between the END and done, new keys are
            // followed all the same: what the device no longer opens goes again, and the END
            // after it (see `advance`).
            if self.ending != Ending::Done {
                self.want = Some(keys);
            }
        }
        self.advance(now)
    }

    /// The side's keys are gone (it is stopping): nothing is kept for a rotation any more and
    /// no rotation's keys will come (a closed gate opens).
    pub fn handle_keys_gone(&mut self, now: Instant) -> Result<(), SendError> {
        self.sender.outbox.stop_keeping();
        self.gate = None;
        self.gate_notice = false;
        self.want = None;
        self.advance(now)
    }

    /// The server's answer to publish `token` ([`super::outbox::Outbox::handle_ack`]).
    pub fn handle_ack(
        &mut self,
        now: Instant,
        token: u64,
        r: Result<u64, ()>,
    ) -> Result<(), SendError> {
        if token != 0 {
            self.sender.outbox.handle_ack(now, token, r);
        }
        self.advance(now)
    }

    /// The connection to the server was made again.
    pub fn handle_reconnect(&mut self) {
        self.sender.outbox.handle_reconnect();
    }

    /// The source ended (its stack flushed and every frame handed in); `wall_ns`: the END's
    /// timestamp.
    pub fn handle_end(&mut self, now: Instant, wall_ns: u64) -> Result<(), SendError> {
        if self.ending == Ending::No {
            self.ending = Ending::Due;
            self.end_wall_ns = wall_ns;
        }
        self.advance(now)
    }

    /// The client was flushed (after [`SourceFlow::poll_flush`]).
    pub fn handle_flushed(&mut self, now: Instant) -> Result<(), SendError> {
        if let Ending::Flushing { sent } = self.ending {
            self.ending = match END_REPEATS.get(sent - 1) {
                Some(pause) if !self.stored => Ending::Pause {
                    sent,
                    at: now + *pause,
                },
                _ if self.confirms => Ending::Confirm {
                    asked: false,
                    until: now + CONFIRM_WAIT,
                },
                _ => Ending::Done,
            };
        }
        self.advance(now)
    }

    /// When [`SourceFlow::handle_timeout`] is due: a retry, or the next END.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let end = match self.ending {
            Ending::Pause { at, .. } => Some(at),
            _ => None,
        };
        match (self.sender.outbox.poll_timeout(), end) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Retries whose backoff is over; the next END when its pause is over.
    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), SendError> {
        self.sender.outbox.handle_timeout(now);
        if let Ending::Pause { sent, at } = self.ending {
            if now >= at {
                self.send_end(now, sent + 1)?;
            }
        }
        self.advance(now)
    }

    /// What the driver does next for this stream, in the order the flow needs it: messages
    /// for the client first, then the gate told, the client flushed (until
    /// [`SourceFlow::handle_flushed`]), the device asked to confirm its run, kept frames
    /// sealed again. The driver's publisher and `testkit/tests/nats_ending.rs` do what it says
    /// (before 2026-12-02 each wrote out this order for itself); `None`: nothing until a frame,
    /// an acknowledgement, new keys or time.
    pub fn poll_io(&mut self) -> Option<SourceIo<K>> {
        if let Some(p) = self.poll_transmit() {
            return Some(SourceIo::Transmit(p));
        }
        if self.poll_gate() {
            return Some(SourceIo::GateSettled);
        }
        if self.poll_flush() {
            return Some(SourceIo::Flush);
        }
        if self.poll_confirm() {
            return Some(SourceIo::Confirm);
        }
        self.poll_again().map(SourceIo::Again)
    }

    /// The next message for the client.
    pub fn poll_transmit(&mut self) -> Option<Publish> {
        // The broadcast END after the frames queued before it.
        let p = self
            .sender
            .outbox
            .poll_transmit()
            .or_else(|| self.records.pop_front());
        if p.is_none() {
            // Everything handed out: an END that went is flushed next.
            self.advance_end();
        }
        p
    }

    /// A kept frame to seal again under the new keys (hand it back with
    /// [`SourceFlow::handle_frame`], kept again), before anything new.
    pub fn poll_again(&mut self) -> Option<K> {
        self.again.pop_front()
    }

    /// Whether the rotation's gate may be told this stream settled (once per rotation).
    pub fn poll_gate(&mut self) -> bool {
        std::mem::take(&mut self.gate_notice)
    }

    /// Whether the driver is to ask the device for its keys now (once per confirmation; then
    /// [`SourceFlow::handle_confirmed`]).
    pub fn poll_confirm(&mut self) -> bool {
        if let Ending::Confirm {
            asked: false,
            until,
        } = self.ending
        {
            self.ending = Ending::Confirm { asked: true, until };
            return true;
        }
        false
    }

    /// The question got no answer within its try: asked again, unless [`CONFIRM_WAIT`] is
    /// over — then the stream is done unconfirmed, and `true` says so.
    pub fn handle_unconfirmed(&mut self, now: Instant) -> bool {
        let Ending::Confirm { asked: true, until } = self.ending else {
            return false;
        };
        if now >= until {
            self.ending = Ending::Done;
            return true;
        }
        self.ending = Ending::Confirm {
            asked: false,
            until,
        };
        false
    }

    /// The device was asked for its keys (answered or not): `keys` are the side's keys now.
    /// The run the stream sealed for stands: done. A newer one: what it no longer opens is
    /// sealed again, then the END, then the run is confirmed again.
    pub fn handle_confirmed(&mut self, now: Instant, keys: GroupKey) -> Result<(), SendError> {
        // Only the answer to the question asked (one that comes after new keys sent the END
        // again is stale: the next confirmation asks anew).
        if !matches!(self.ending, Ending::Confirm { asked: true, .. }) {
            return Ok(());
        }
        self.want = Some(keys);
        self.advance(now)?;
        // Keys that change nothing the device opens (followed at once): the run stands.
        if matches!(self.ending, Ending::Confirm { asked: true, .. }) && self.want.is_none() {
            self.ending = Ending::Done;
        }
        Ok(())
    }

    /// Whether the client is to be flushed now (then [`SourceFlow::handle_flushed`]).
    pub fn poll_flush(&self) -> bool {
        matches!(self.ending, Ending::Flushing { .. })
    }

    fn advance(&mut self, now: Instant) -> Result<(), SendError> {
        if self.gate == Some(false) && self.sender.outbox.is_settled() {
            self.gate = Some(true);
            self.gate_notice = true;
        }
        if let Some(keys) = self.want {
            match self.sender.follow(keys)? {
                Follow::Settle => {}
                Follow::Same => self.want = None,
                Follow::Again(again) => {
                    self.want = None;
                    self.again.extend(again);
                    if matches!(
                        self.ending,
                        Ending::Sent { .. }
                            | Ending::Flushing { .. }
                            | Ending::Pause { .. }
                            | Ending::Confirm { .. }
                    ) {
                        // The END went under the old keys, maybe before frames now sealed
                        // again: it goes again behind them, under the new ones.
                        self.ending = Ending::Due;
                    }
                }
            }
        }
        match self.ending {
            // After everything before it is stored (JetStream); on core NATS it is queued
            // behind the frames before it.
            Ending::Due if self.following_done() && self.sender.outbox.in_flight() == 0 => {
                self.send_end(now, 1)?;
                self.advance_end();
            }
            Ending::Sent { .. } => self.advance_end(),
            _ => {}
        }
        Ok(())
    }

    fn advance_end(&mut self) {
        if let Ending::Sent { sent } = self.ending {
            if self.sender.outbox.is_settled() && self.records.is_empty() {
                self.ending = Ending::Flushing { sent };
            }
        }
    }

    /// END number `n` on every subject of the stream.
    fn send_end(&mut self, now: Instant, n: usize) -> Result<(), SendError> {
        let meta = Meta {
            stream: self.stream,
            seq: END_SEQ,
            timestamp_ns: self.end_wall_ns,
            flags: 0,
        };
        for (subject, part) in self.end.subjects.clone() {
            if let Some(all) = self.end.broadcast.clone() {
                if let Some(body) = self.sender.record(&all, Frame::new(meta, &[]))? {
                    self.records.push_back(Publish {
                        token: 0,
                        subject: all,
                        id: None,
                        body,
                    });
                }
            }
            // An END is empty: it always fits.
            self.sender
                .send(now, &subject, part, Frame::new(meta, &[]), None)?;
        }
        self.ends_sent = n;
        self.end_rounds += 1;
        self.ending = Ending::Sent { sent: n };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nats::record::FrameRecord;
    use crate::nats::runs::Run;
    use crate::nats::toy::{Rng, ToySeal};
    use std::collections::BTreeMap;

    const RUN: Run = Run { id: 7, began: 0 };
    const MAX: usize = 1 << 20;

    type Flow = SourceFlow<ToySeal, u64>;

    fn flow(stored: bool, gated: bool, parts: Option<u16>, broadcast: bool) -> Flow {
        flow_keeping(stored, gated, parts, broadcast, false)
    }

    /// `keep`: an app side's reliable stream, keeping its frames to seal them again after a
    /// rotation.
    fn flow_keeping(
        stored: bool,
        gated: bool,
        parts: Option<u16>,
        broadcast: bool,
        keep: bool,
    ) -> Flow {
        let keys = GroupKey::first([1; 32], RUN);
        let subjects = match parts {
            Some(n) => (0..n).map(|p| (format!("d.{p}"), Some(p))).collect(),
            None => vec![("d".to_string(), None)],
        };
        let end = EndPlan {
            subjects,
            broadcast: broadcast.then(|| "all".to_string()),
        };
        let sender = Sender::new(2, keys, stored, keep.then_some(9), keep).unwrap();
        SourceFlow::new(sender, 2, stored, gated, MAX, end)
    }

    fn frame(seq: u64) -> Frame {
        Frame::new(
            Meta {
                stream: 2,
                seq,
                timestamp_ns: 0,
                flags: 0,
            },
            b"x",
        )
    }

    fn seq_of(p: &Publish) -> u64 {
        FrameRecord::parse(&p.body).unwrap().seq
    }

    fn drain(f: &mut Flow) -> Vec<Publish> {
        std::iter::from_fn(|| f.poll_transmit()).collect()
    }

    #[test]
    fn a_lossy_stream_sends_its_end_three_times_after_its_pauses_then_is_done() {
        let t = Instant::now();
        let mut f = flow(false, false, Some(2), true);
        f.handle_frame(t, "d.0", Some(0), frame(0), None).unwrap();
        f.handle_end(t, 5).unwrap();
        assert!(!f.ready());
        let sent = drain(&mut f);
        // The frame, then the END on both parts, the broadcast (once per part) after them.
        let seqs: Vec<(String, u64)> = sent
            .iter()
            .map(|p| (p.subject.clone(), seq_of(p)))
            .collect();
        assert_eq!(seqs[0], ("d.0".to_string(), 0));
        assert_eq!(sent.len(), 5);
        assert!(sent[1..].iter().all(|p| seq_of(p) == END_SEQ));
        assert!(f.poll_flush());
        f.handle_flushed(t).unwrap();
        assert!(!f.poll_flush());
        assert_eq!(f.poll_timeout(), Some(t + END_REPEATS[0]));
        f.handle_timeout(t + Duration::from_millis(19)).unwrap();
        assert!(drain(&mut f).is_empty(), "not before its pause");
        let t1 = t + END_REPEATS[0];
        f.handle_timeout(t1).unwrap();
        assert_eq!(drain(&mut f).len(), 4);
        f.handle_flushed(t1).unwrap();
        assert_eq!(f.poll_timeout(), Some(t1 + END_REPEATS[1]));
        let t2 = t1 + END_REPEATS[1];
        f.handle_timeout(t2).unwrap();
        assert_eq!(drain(&mut f).len(), 4);
        assert!(!f.is_done());
        f.handle_flushed(t2).unwrap();
        assert!(f.is_done());
        assert_eq!(f.ends_sent, 3);
        assert_eq!(f.poll_timeout(), None);
    }

    #[test]
    fn a_stored_stream_sends_its_end_once_everything_before_it_is_stored() {
        let t = Instant::now();
        let mut f = flow(true, false, None, false);
        for n in 0..3 {
            f.handle_frame(t, "d", None, frame(n), None).unwrap();
        }
        let sent = drain(&mut f);
        f.handle_end(t, 5).unwrap();
        assert!(
            drain(&mut f).is_empty(),
            "the END waits for the acknowledgements"
        );
        f.handle_ack(t, sent[0].token, Ok(1)).unwrap();
        f.handle_ack(t, sent[1].token, Err(())).unwrap();
        f.handle_ack(t, sent[2].token, Ok(3)).unwrap();
        assert!(drain(&mut f).is_empty());
        // The failed one goes again after its backoff, then the END.
        let at = f.poll_timeout().unwrap();
        f.handle_timeout(at).unwrap();
        let again = drain(&mut f);
        assert_eq!(again.iter().map(seq_of).collect::<Vec<_>>(), vec![1]);
        f.handle_ack(at, again[0].token, Ok(4)).unwrap();
        let end = drain(&mut f);
        assert_eq!(end.iter().map(seq_of).collect::<Vec<_>>(), vec![END_SEQ]);
        assert!(!f.poll_flush(), "flushed once the END is stored");
        f.handle_ack(at, end[0].token, Ok(5)).unwrap();
        assert!(f.poll_flush());
        f.handle_flushed(at).unwrap();
        assert!(f.is_done(), "stored: no repeats");
        assert_eq!(f.ends_sent, 1);
    }

    /// An app side's reliable stream is not done once its END is stored: it asks the
    /// device for its keys first. The device restarted while the last frames went (its new
    /// run began after stream sequence 5, so it refuses what was sealed for the old run and
    /// stored later): those frames are sealed again for the new run, the END after them, and
    /// the run is confirmed again before the stream is done. (Found under load: the app side
    /// ended before it heard of the new run, and the device waited for those frames for good.)
    #[test]
    fn an_app_sides_reliable_stream_confirms_the_devices_run_before_it_is_done() {
        let t = Instant::now();
        let mut f = flow_keeping(true, false, None, false, true);
        for n in 0..10u64 {
            f.handle_frame(t, "d", None, frame(n), Some((1, n)))
                .unwrap();
        }
        let sent = drain(&mut f);
        for (i, p) in sent.iter().enumerate() {
            f.handle_ack(t, p.token, Ok(i as u64 + 1)).unwrap();
        }
        f.handle_end(t, 5).unwrap();
        let end = drain(&mut f);
        assert_eq!(end.iter().map(seq_of).collect::<Vec<_>>(), vec![END_SEQ]);
        f.handle_ack(t, end[0].token, Ok(11)).unwrap();
        assert!(f.poll_flush());
        f.handle_flushed(t).unwrap();
        assert!(!f.is_done(), "the device's run is confirmed first");
        assert!(f.is_ending());
        assert!(f.poll_confirm());
        assert!(!f.poll_confirm(), "asked once");
        let restarted = f.sender.keys().next_run(Run { id: 8, began: 5 });
        // The device restarted: frames stored at 6..=10 (numbers 5..=9) go again, then END.
        f.handle_confirmed(t, restarted).unwrap();
        assert!(!f.is_done());
        let again: Vec<u64> = std::iter::from_fn(|| f.poll_again()).collect();
        assert_eq!(again, vec![5, 6, 7, 8, 9]);
        for n in again {
            f.handle_frame(t, "d", None, frame(n), Some((1, n)))
                .unwrap();
        }
        let resent = drain(&mut f);
        assert!(resent
            .iter()
            .all(|p| FrameRecord::parse(&p.body).unwrap().run == 8));
        for (i, p) in resent.iter().enumerate() {
            f.handle_ack(t, p.token, Ok(12 + i as u64)).unwrap();
        }
        let end = drain(&mut f);
        assert_eq!(end.iter().map(seq_of).collect::<Vec<_>>(), vec![END_SEQ]);
        assert_eq!(FrameRecord::parse(&end[0].body).unwrap().run, 8);
        f.handle_ack(t, end[0].token, Ok(17)).unwrap();
        f.handle_flushed(t).unwrap();
        assert!(!f.is_done(), "confirmed again");
        assert!(f.poll_confirm());
        // No answer within the try: asked again, until the wait is over.
        assert!(!f.handle_unconfirmed(t + CONFIRM_WAIT / 2));
        assert!(!f.is_done());
        assert!(f.poll_confirm(), "asked again");
        f.handle_confirmed(t, restarted).unwrap();
        assert!(f.is_done(), "the same run: done");
    }

    /// The same stream driven through [`SourceFlow::poll_io`] alone, as the driver's
    /// publisher and the simulation drive it: each step comes when its turn is there.
    #[test]
    fn poll_io_asks_for_each_step_in_the_flows_order() {
        let t = Instant::now();
        let mut f = flow_keeping(true, false, None, false, true);
        let kind = |io: &SourceIo<u64>| match io {
            SourceIo::Transmit(p) => format!("transmit {}", seq_of(p)),
            SourceIo::GateSettled => "gate".into(),
            SourceIo::Flush => "flush".into(),
            SourceIo::Confirm => "confirm".into(),
            SourceIo::Again(n) => format!("again {n}"),
        };
        let mut seen = Vec::new();
        let mut stored = 0u64;
        let restarted = f.sender.keys().next_run(Run { id: 8, began: 2 });
        for n in 0..3u64 {
            f.handle_frame(t, "d", None, frame(n), Some((1, n)))
                .unwrap();
        }
        let mut ended = false;
        let mut confirmed = 0;
        while !f.is_done() {
            let Some(io) = f.poll_io() else {
                assert!(!ended, "stuck: {seen:?}");
                f.handle_end(t, 5).unwrap();
                ended = true;
                continue;
            };
            seen.push(kind(&io));
            match io {
                SourceIo::Transmit(p) => {
                    stored += 1;
                    f.handle_ack(t, p.token, Ok(stored)).unwrap();
                }
                SourceIo::Flush => f.handle_flushed(t).unwrap(),
                // The first answer names the device's new run (it began after sequence 2).
                SourceIo::Confirm => {
                    confirmed += 1;
                    f.handle_confirmed(t, restarted).unwrap();
                }
                SourceIo::Again(n) => {
                    f.handle_frame(t, "d", None, frame(n), Some((1, n)))
                        .unwrap();
                }
                SourceIo::GateSettled => panic!("no gate on an app side"),
            }
        }
        let end = format!("transmit {END_SEQ}");
        assert_eq!(
            seen,
            [
                "transmit 0",
                "transmit 1",
                "transmit 2",
                &end,
                "flush",
                "confirm",
                "again 2",
                "transmit 2",
                &end,
                "flush",
                "confirm"
            ]
        );
        assert_eq!(confirmed, 2);
        assert!(f.poll_io().is_none());
    }

    /// A device side that never answers (frozen, its subscription still there): the stream is
    /// done unconfirmed once [`CONFIRM_WAIT`] is over, and says so.
    #[test]
    fn an_unanswered_confirmation_ends_after_its_wait() {
        let t = Instant::now();
        let mut f = flow_keeping(true, false, None, false, true);
        f.handle_end(t, 5).unwrap();
        let end = drain(&mut f);
        f.handle_ack(t, end[0].token, Ok(1)).unwrap();
        f.handle_flushed(t).unwrap();
        let mut now = t;
        let mut asked = 0;
        while !f.is_done() {
            assert!(f.poll_confirm());
            asked += 1;
            now += Duration::from_secs(3);
            let gave_up = f.handle_unconfirmed(now);
            assert_eq!(gave_up, f.is_done());
        }
        assert!(now >= t + CONFIRM_WAIT && now < t + CONFIRM_WAIT + Duration::from_secs(3));
        assert_eq!(asked, 7);
    }

    /// A device side's reliable stream and a lossy one never ask.
    #[test]
    fn only_an_app_sides_reliable_stream_confirms() {
        let t = Instant::now();
        for (stored, gated, keep) in [
            (true, true, true),
            (false, false, true),
            (true, false, false),
        ] {
            let mut f = flow_keeping(stored, gated, None, false, keep);
            f.handle_end(t, 5).unwrap();
            let mut now = t;
            for _ in 0..8 {
                for p in drain(&mut f) {
                    f.handle_ack(now, p.token, Ok(1)).unwrap();
                }
                if f.poll_flush() {
                    f.handle_flushed(now).unwrap();
                }
                if let Some(at) = f.poll_timeout() {
                    now = at;
                    f.handle_timeout(now).unwrap();
                }
            }
            assert!(!f.poll_confirm());
            assert!(f.is_done(), "{stored} {gated} {keep}");
        }
    }

    #[test]
    fn the_rotations_gate_closes_until_everything_under_the_old_key_is_stored() {
        let t = Instant::now();
        let mut f = flow(true, true, None, false);
        f.handle_frame(t, "d", None, frame(0), None).unwrap();
        let sent = drain(&mut f);
        let k1 = f.sender.keys();
        let mut pending = GroupKey::first([2; 32], RUN);
        pending.previous = Some(k1.key);
        pending.since = SINCE_PENDING;
        f.handle_keys(t, pending).unwrap();
        assert!(!f.ready(), "nothing new is sealed once the rotation began");
        assert!(!f.poll_gate(), "not settled yet");
        f.handle_ack(t, sent[0].token, Ok(1)).unwrap();
        assert!(f.poll_gate());
        assert!(!f.poll_gate(), "told once");
        assert!(!f.ready(), "the rotation's keys are still to come");
        let mut done = pending;
        done.since = 1;
        f.handle_keys(t, done).unwrap();
        assert!(f.ready());
        assert_eq!(f.sender.keys(), done);
        // A lossy stream (not gated) goes on under the pending keys at once.
        let mut g = flow(false, false, None, false);
        g.handle_keys(t, pending).unwrap();
        assert!(g.ready());
    }

    #[test]
    fn a_gated_stream_starting_mid_rotation_is_settled_at_once_and_waits_for_the_keys() {
        let t = Instant::now();
        let mut pending = GroupKey::first([2; 32], RUN);
        pending.previous = Some([1; 32]);
        pending.since = SINCE_PENDING;
        let end = || EndPlan {
            subjects: vec![("d".to_string(), None)],
            broadcast: None,
        };
        let flow = |gated| -> Flow {
            SourceFlow::new(
                Sender::new(2, pending, true, None, false).unwrap(),
                2,
                true,
                gated,
                MAX,
                end(),
            )
        };
        let mut f = flow(true);
        assert!(f.poll_gate(), "settled: nothing under the old key");
        assert!(!f.poll_gate(), "told once");
        assert!(
            !f.ready(),
            "nothing new is sealed before the rotation's keys"
        );
        let mut done = pending;
        done.since = 1;
        f.handle_keys(t, done).unwrap();
        assert!(f.ready());
        // Not gated (an app side's, a lossy one): nothing to say, ready at once.
        let mut g = flow(false);
        assert!(!g.poll_gate());
        assert!(g.ready());
    }

    #[test]
    fn a_frame_larger_than_the_server_takes_is_refused_with_what_to_do() {
        let t = Instant::now();
        let keys = GroupKey::first([1; 32], RUN);
        let sender = Sender::new(2, keys, false, None, false).unwrap();
        let end = EndPlan {
            subjects: vec![("d".into(), None)],
            broadcast: None,
        };
        let mut f: Flow = SourceFlow::new(sender, 2, false, false, 100, end);
        let big = Frame::new(frame(0).meta, &[0; 100]);
        let e = f.handle_frame(t, "d", None, big, None).unwrap_err();
        assert!(
            e.to_string()
                .contains("exceeds the NATS server's max_payload (100 bytes)"),
            "{e}"
        );
    }

    /// One random schedule: a source handing frames in while the flow is ready, a broker that
    /// acknowledges stored publishes late, out of order or not at all (then they go again),
    /// reconnects, rotations (through the gate for a gated stream) and device restarts, the
    /// source ending at a random point. Checks: the first END goes only once every frame
    /// before it was stored (JetStream) or handed out (core NATS), on every subject, and no
    /// frame goes for the first time after it; a gate is told settled only when nothing
    /// sealed under the old key waits; the END goes three times on core NATS, each after its
    /// pause, once on JetStream; the flow is done within bounded time once the broker answers.
    fn schedule(seed: u64) {
        let mut rng = Rng::seeded(seed);
        let stored = rng.chance(60);
        let gated = stored && rng.chance(60);
        let parts = rng.chance(30).then(|| 2 + rng.below(2) as u16);
        let broadcast = !stored && rng.chance(30);
        let keep = stored && !gated && rng.chance(50);
        let mut f = flow_keeping(stored, gated, parts, broadcast, keep);
        let subjects: Vec<(String, Option<u16>)> = f.end.subjects.clone();
        let t0 = Instant::now();
        let mut now = t0;
        let total = rng.below(60);
        let end_after = rng.below(total + 1);
        let (mut next, mut ended) = (0u64, false);
        // Publishes handed out and not yet answered (token → frame number).
        let mut waiting: BTreeMap<u64, u64> = BTreeMap::new();
        let mut stored_seq = 0u64;
        // Frames handed out at least once / stored, by number.
        let mut out: std::collections::HashSet<u64> = Default::default();
        let mut acked: std::collections::HashSet<u64> = Default::default();
        let mut ends: Vec<(Instant, usize)> = Vec::new();
        let mut flushed_at: Vec<Instant> = Vec::new();
        let mut keys = f.sender.keys();
        let mut key_byte = 1u8;
        let mut rotating = false;
        let mut end_owed = false;
        // A confirmation of the device's run asked for and not yet answered; answers given.
        let (mut confirming, mut confirms) = (false, 0u32);
        for step in 0..20_000 {
            if f.is_done() {
                break;
            }
            let calm = step > 5_000;
            match rng.below(10) {
                0..=3 if !ended => {
                    if next >= end_after {
                        f.handle_end(now, 9).unwrap();
                        ended = true;
                    } else if f.ready() {
                        let (s, p) = subjects[(next as usize) % subjects.len()].clone();
                        let kept = keep.then_some((1, next));
                        f.handle_frame(now, &s, p, frame(next), kept).unwrap();
                        next += 1;
                    }
                }
                4 if keep && !calm && rng.chance(30) => {
                    // An app side follows a rotation (or a device restart named by a join):
                    // what the device received under the old key after it began comes back.
                    key_byte += 1;
                    let mut k = GroupKey::first([key_byte; 32], RUN);
                    k.previous = Some(keys.key);
                    k.since = rng.below(stored_seq + 1);
                    f.handle_keys(now, k).unwrap();
                    keys = k;
                }
                4 if gated && !rotating && !calm => {
                    key_byte += 1;
                    let mut k = GroupKey::first([key_byte; 32], RUN);
                    k.previous = Some(keys.key);
                    k.since = SINCE_PENDING;
                    f.handle_keys(now, k).unwrap();
                    rotating = true;
                    keys = k;
                }
                4 if rotating && rng.chance(50) => {
                    // The rotation's keys come once every stream told it settled (or its
                    // wait ran out).
                    keys.since = stored_seq;
                    f.handle_keys(now, keys).unwrap();
                    rotating = false;
                }
                5 if !calm && rng.chance(10) => f.handle_reconnect(),
                6 if confirming && !calm && rng.chance(20) => {
                    // No answer within the try: asked again (or, past the wait, done).
                    confirming = false;
                    f.handle_unconfirmed(now);
                    confirms += 1;
                }
                6 if confirming => {
                    // The join that confirms the device's run is through: sometimes the
                    // device restarted (or rotated) meanwhile.
                    confirming = false;
                    if !calm && rng.chance(40) {
                        key_byte += 1;
                        let mut k = GroupKey::first([key_byte; 32], RUN);
                        k.previous = Some(keys.key);
                        k.since = rng.below(stored_seq + 1);
                        keys = k;
                    }
                    f.handle_confirmed(now, keys).unwrap();
                    confirms += 1;
                }
                _ => {
                    // The broker answers some, or time passes.
                    if let Some((&tok, &n)) = waiting
                        .iter()
                        .nth(rng.below(waiting.len().max(1) as u64) as usize)
                    {
                        waiting.remove(&tok);
                        let ok = calm || rng.chance(80);
                        if ok {
                            stored_seq += 1;
                            acked.insert(n);
                        }
                        f.handle_ack(now, tok, if ok { Ok(stored_seq) } else { Err(()) })
                            .unwrap();
                    } else {
                        now += Duration::from_millis(1 + rng.below(49));
                        f.handle_timeout(now).unwrap();
                    }
                }
            }
            while let Some(n) = f.poll_again() {
                // Sealed again after an END: an END must follow it.
                if !ends.is_empty() {
                    end_owed = true;
                }
                let (s, p) = subjects[(n as usize) % subjects.len()].clone();
                f.handle_frame(now, &s, p, frame(n), Some((1, n))).unwrap();
            }
            if rotating && f.poll_gate() {
                assert!(
                    (0..next).all(|m| acked.contains(&m)) && f.sender.outbox.is_settled(),
                    "seed {seed}: gate told settled with publishes waiting"
                );
            }
            while let Some(p) = f.poll_transmit() {
                let n = seq_of(&p);
                if n == END_SEQ {
                    end_owed = false;
                    if ends.last().is_none_or(|(_, k)| *k != f.end_rounds) {
                        ends.push((now, f.end_rounds));
                        for m in 0..next {
                            assert!(out.contains(&m), "seed {seed}: END before frame {m} went");
                            if stored {
                                assert!(
                                    acked.contains(&m),
                                    "seed {seed}: END before frame {m} was stored"
                                );
                            }
                        }
                    }
                } else {
                    assert!(
                        ends.is_empty() || out.contains(&n),
                        "seed {seed}: frame {n} first went after the END"
                    );
                    out.insert(n);
                }
                if p.id.is_some() {
                    waiting.insert(p.token, n);
                }
            }
            if f.poll_flush() {
                flushed_at.push(now);
                f.handle_flushed(now).unwrap();
            }
            if f.poll_confirm() {
                assert!(
                    keep,
                    "seed {seed}: only an app side's reliable stream confirms"
                );
                confirming = true;
            }
        }
        if !ended {
            // The source ends later than the schedule let it: done within bounded time.
            panic!("seed {seed}: the source never ended ({next} of {end_after} frames)");
        }
        assert!(
            f.is_done(),
            "seed {seed}: not done (ends {ends:?}, waiting {})",
            waiting.len()
        );
        let rounds = if stored { 1 } else { 1 + END_REPEATS.len() };
        assert_eq!(f.ends_sent, rounds, "seed {seed}");
        assert_eq!(confirms > 0, keep, "seed {seed}: confirmed before done");
        assert!(
            !end_owed,
            "seed {seed}: frames sealed again after the last END"
        );
        if stored {
            // Once, or again after new keys sealed frames again behind it.
            assert!(!ends.is_empty(), "seed {seed}");
        } else {
            assert_eq!(ends.len(), rounds, "seed {seed}: {ends:?}");
        }
        for (i, pause) in END_REPEATS.iter().enumerate().take(rounds - 1) {
            assert!(
                ends[i + 1].0 >= flushed_at[i] + *pause,
                "seed {seed}: END {} before its pause",
                i + 2
            );
        }
    }

    #[test]
    fn random_schedules_end_after_everything_and_respect_the_gate() {
        for seed in 0..2000 {
            schedule(seed);
        }
    }
}

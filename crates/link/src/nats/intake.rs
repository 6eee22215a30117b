//! The receiving half of one fan-out stream before its frames open (sans-IO): which records
//! go on to be opened, in which order, and when the broker's messages may be acknowledged.
//!
//! In the order the app side's sink takes a message:
//!
//! 1. a body shorter than a record is dropped ([`Taken::Malformed`]);
//! 2. a record naming another stream than its subject's is dropped ([`Taken::Foreign`]):
//!    someone who may publish moved a genuine frame of another stream here;
//! 3. a copy is dropped ([`Taken::Copy`]): a stored message is known by its sealed header
//!    (the sending half's epoch and frame counter, the same in every copy, whatever stream
//!    sequence the server gave it) once a message with that header opened
//!    ([`Intake::authentic`]: an altered copy stored first, which does not open, must not make
//!    the genuine one a copy — found by `testkit/tests/nats_keys.rs`), a core NATS one by a
//!    number at or below the last one taken of its run;
//! 4. stored frames of the side's own consumer go back in their subject order ([`Reorder`]):
//!    a frame stored late waits for nothing, the ones after it wait for it, at most the wait
//!    given (then the gap is given up, counted: [`Intake::skipped`]);
//! 5. what comes out ([`Intake::poll_record`]) is opened by the driver
//!    ([`super::keys::Opener`]); a stored frame behind a place a genuine record took and
//!    numbered at or below the last one taken of its run is dropped first (a copy, or one
//!    stored after its gap was given up); the driver says which opened
//!    ([`Intake::authentic`]) and which hold no place ([`Intake::give_back`]); a stored
//!    message handed on is never handed on again when the broker delivers it again (known by
//!    its stream sequence and sealed header);
//! 6. the driver reports each opened frame ([`Intake::opened`]): an END (said once per run),
//!    a frame of a newer run (the device restarted: the stack starts afresh), or a frame.
//!
//! Stored messages are acknowledged only once everything taken is through the sink: nothing
//! held behind a gap, nothing waiting to be opened ([`Intake::acks_due`]).

use super::opened::OpenedWindows;
use super::record::{FrameRecord, Reorder, Stored, END_SEQ};
use bytes::Bytes;
use std::collections::{HashSet, VecDeque};
use std::time::{Duration, Instant};

/// Where an ordered stored stream stands: the device run of the last frame opened, the next
/// subject sequence its order expects, and the frame's number ([`Intake::position`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// The device run of the last frame opened.
    pub run: u64,
    /// The next subject sequence the run's order expects.
    pub next: u64,
    /// The last frame's number.
    pub seq: u64,
}

/// What an app side keeps in its home for the next process of its ordered stored stream,
/// written before each acknowledgement ([`Intake::kept`]): the stream sequence its consumer
/// first delivered from (a run that began after it is seen whole) and where the stream
/// stood. The next process takes its consumer up at the first message not acknowledged and
/// its order from here ([`Intake::take_up`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kept {
    /// The stream sequence the consumer first delivered from.
    pub start: u64,
    /// Where the stream stood (none before its first frame opened).
    pub position: Option<Position>,
    /// The lowest stream sequence of a record acknowledged but not yet opened (kept aside
    /// until a key comes: [`super::keys::Opener::aside_from`]): the next consumer starts
    /// there at the latest, or that frame would be lost with this process.
    pub again_from: Option<u64>,
}

impl Kept {
    /// Where a consumer this side left behind starts again: after JetStream's ack floor
    /// `ack_floor`, or at the first record acknowledged and kept aside for a key (`kept`,
    /// what the process before wrote), whichever is first.
    pub fn resume_at(ack_floor: u64, kept: Option<&Kept>) -> u64 {
        let after_floor = ack_floor + 1;
        match kept.and_then(|k| k.again_from) {
            Some(a) => after_floor.min(a),
            None => after_floor,
        }
    }

    /// Its encoding: start, run, next, seq, which of position (1) and `again_from` (2) there
    /// are, `again_from`, and a check (u64 BE each).
    pub const LEN: usize = 56;

    fn words(&self) -> [u64; 6] {
        let p = self.position.unwrap_or(Position {
            run: 0,
            next: 0,
            seq: 0,
        });
        [
            self.start,
            p.run,
            p.next,
            p.seq,
            u64::from(self.position.is_some()) | u64::from(self.again_from.is_some()) << 1,
            self.again_from.unwrap_or(0),
        ]
    }

    fn check(words: &[u64; 6]) -> u64 {
        words.iter().fold(0x6e64_6420_6b65_7074u64, |h, w| {
            (h ^ w).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(23)
        })
    }

    /// The bytes kept in the home.
    pub fn encode(&self) -> [u8; Kept::LEN] {
        let w = self.words();
        let mut b = [0u8; Kept::LEN];
        for (i, v) in w.iter().chain([Kept::check(&w)].iter()).enumerate() {
            b[i * 8..i * 8 + 8].copy_from_slice(&v.to_be_bytes());
        }
        b
    }

    /// `None` unless `b` is one whole encoding (a torn or foreign file keeps nothing).
    pub fn parse(b: &[u8]) -> Option<Kept> {
        if b.len() != Kept::LEN {
            return None;
        }
        let n = |i: usize| u64::from_be_bytes(b[i * 8..i * 8 + 8].try_into().unwrap_or_default());
        let w = [n(0), n(1), n(2), n(3), n(4), n(5)];
        if Kept::check(&w) != n(6) || w[4] > 3 {
            return None;
        }
        Some(Kept {
            start: w[0],
            position: (w[4] & 1 == 1).then_some(Position {
                run: w[1],
                next: w[2],
                seq: w[3],
            }),
            again_from: (w[4] & 2 == 2).then_some(w[5]),
        })
    }
}

/// Stored frames remembered for dropping copies.
pub const SEEN: usize = 16_384;

/// How long stored frames wait behind a gap before it is given up. A publish that fails is
/// stored late: the device learns of it when its acknowledgement fails (at once, or after
/// the client's 5 s timeout), publishes it again after 50 ms–2 s, and a cluster that lost a
/// node takes seconds to elect a leader; the wait covers two timeouts, an outage of about
/// 10 s and the backoff (`testkit/tests/nats_publish.rs` shows it over 1000 schedules). It
/// was 10 s: the three-node cluster test lost a frame stored 10 s late to it. Only a frame
/// JetStream itself lost waits this long for nothing.
pub const REORDER_WAIT: Duration = Duration::from_secs(30);

/// What became of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    /// On its way to be opened (maybe after the ones before it).
    Queued,
    /// A copy of a frame taken already.
    Copy,
    /// Shorter than a record.
    Malformed,
    /// A record of another stream.
    Foreign,
}

/// What an opened frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opened {
    /// The stream's END; `first`: the first one of its run (a lossy END comes three times).
    End {
        /// Whether this run's END was not seen before.
        first: bool,
    },
    /// A frame; `restarted`: the (run, seq) taken last when this frame is of another run (the
    /// device side restarted: what the stack holds goes out, then it starts afresh).
    Frame {
        /// The last (run, seq) of the run before.
        restarted: Option<(u64, u64)>,
    },
}

/// A set that remembers its last [`SEEN`] keys (the oldest goes first).
#[derive(Debug)]
struct Recent<K> {
    set: HashSet<K>,
    order: VecDeque<K>,
}

impl<K> Default for Recent<K> {
    fn default() -> Self {
        Recent {
            set: HashSet::new(),
            order: VecDeque::new(),
        }
    }
}

impl<K: std::hash::Hash + Eq + Copy> Recent<K> {
    fn contains(&self, k: &K) -> bool {
        self.set.contains(k)
    }

    /// Whether `k` is new (and remembers it).
    fn insert(&mut self, k: K) -> bool {
        if !self.set.insert(k) {
            return false;
        }
        self.order.push_back(k);
        if self.order.len() > SEEN {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
        true
    }
}

/// The sealed headers (epoch ‖ counter) of the last [`SEEN`] stored frames taken.
#[derive(Debug, Default)]
struct Seen(Recent<[u8; 24]>);

impl Seen {
    fn key(sealed: &[u8]) -> Option<[u8; 24]> {
        sealed.get(..24).and_then(|k| <[u8; 24]>::try_from(k).ok())
    }

    /// Whether a frame with `sealed`'s header opened already.
    fn contains(&self, sealed: &[u8]) -> bool {
        Self::key(sealed).is_some_and(|k| self.0.contains(&k))
    }

    /// Whether `sealed` is new (and remembers it); a frame too short to carry the header
    /// counts as new (the encrypt inverse refuses it).
    fn insert(&mut self, sealed: &[u8]) -> bool {
        Self::key(sealed).is_none_or(|k| self.0.insert(k))
    }
}

/// The stored messages handed on already, by JetStream stream sequence and a keyed hash of
/// the whole message (the last [`SEEN`]): the broker delivers a message again while its
/// acknowledgement waits (every 5 s while a gap holds acknowledgements back), and one handed
/// on is not handed on twice — not even one that proved forged, so that it cannot give its
/// place back again and again. The whole message with it: a server that lost its last writes
/// in a restart numbers new messages with the same sequences, and someone who could deliver a
/// message with a predicted sequence and a genuine sealed header ahead of the genuine one must
/// not make the genuine one a copy (the hash's key is this process's own, so a body that
/// collides cannot be made). The hash costs about 15 µs per 100 KB message on this machine.
#[derive(Debug, Default)]
struct Handed {
    keys: std::collections::hash_map::RandomState,
    recent: Recent<(u64, u64)>,
}

impl Handed {
    /// Whether stored message `seq` with `body` is new (and remembers it).
    fn insert(&mut self, seq: u64, body: &[u8]) -> bool {
        use std::hash::BuildHasher;
        self.recent.insert((seq, self.keys.hash_one(body)))
    }
}

/// One sink stream's intake; `M` is the broker's handle of a stored message (to acknowledge
/// it).
#[derive(Debug)]
pub struct Intake<M> {
    stream: u16,
    reorder: Option<Reorder>,
    seen: Seen,
    handed: Handed,
    /// The (run, seq) taken last.
    last: Option<(u64, u64)>,
    /// Frames of many senders, each numbering its own (a device side taking its app sides'
    /// frames): a lossy frame is not told from a copy by its number (the `encrypt` pair's
    /// replay window, one per sender, drops copies).
    many_senders: bool,
    /// A device side's stored frames: the sealed headers opened, taken up from the process
    /// before and kept for the next ([`super::opened`]).
    opened: Option<OpenedWindows>,
    /// The stream sequence the consumer first delivered from ([`Intake::kept`]).
    first_start: Option<u64>,
    /// The run whose END was taken last.
    ended: Option<u64>,
    ready: VecDeque<Stored>,
    unacked: VecDeque<M>,
    /// The highest stream sequence delivered to this side.
    read_to: u64,
    acked_to: u64,
    /// Copies dropped.
    pub copies: u64,
    /// Records of another stream dropped.
    pub foreign: u64,
    /// Messages shorter than a record dropped.
    pub malformed: u64,
}

impl<M> Intake<M> {
    /// The intake of stream `stream`; `ordered`: stored frames of one publisher, put back in
    /// their subject order, waiting at most `wait` behind a gap (not a round-robin member,
    /// nor a device taking many app sides' frames).
    pub fn new(stream: u16, ordered: bool, wait: Duration) -> Intake<M> {
        Intake {
            stream,
            reorder: ordered.then(|| Reorder::new(wait, 65_536)),
            seen: Seen::default(),
            handed: Handed::default(),
            last: None,
            many_senders: false,
            opened: None,
            first_start: None,
            ended: None,
            ready: VecDeque::new(),
            unacked: VecDeque::new(),
            read_to: 0,
            acked_to: 0,
            copies: 0,
            foreign: 0,
            malformed: 0,
        }
    }

    /// Frames come from many senders, each numbering its own (a device side's sink: every app
    /// side's frames). Before, a second app side's lossy frames numbered below the first
    /// one's last were dropped as copies.
    pub fn with_many_senders(mut self) -> Intake<M> {
        self.many_senders = true;
        self.opened = Some(OpenedWindows::default());
        self
    }

    /// Takes up what the process before opened (a device side's stored frames: its copies
    /// are dropped, [`super::opened`]).
    pub fn carry(&mut self, opened: OpenedWindows) {
        if self.opened.is_some() {
            self.opened = Some(opened);
        }
    }

    /// What a device side's stored frames opened under, for its next process (written
    /// before each acknowledgement).
    pub fn opened_windows(&self) -> Option<&OpenedWindows> {
        self.opened.as_ref()
    }

    /// Up to which stream sequence everything stored went through the sink (a device side's
    /// [`OpenedWindows::through`], the process before's included; 0 for an app side).
    pub fn through(&self) -> u64 {
        self.opened.as_ref().map_or(0, OpenedWindows::through)
    }

    /// The consumer delivers everything stored from stream sequence `start` on (a run that
    /// began after it is seen whole: [`Reorder::whole_runs_from`]).
    pub fn consumer_start(&mut self, start: u64) {
        self.first_start.get_or_insert(start);
        if let Some(r) = self.reorder.as_mut() {
            r.whole_runs_from(start);
        }
    }

    /// Takes a message: `stored` is JetStream's (its stream sequence, if known, and its
    /// handle), `None` for core NATS.
    pub fn handle_message(
        &mut self,
        now: Instant,
        body: &Bytes,
        stored: Option<(Option<u64>, M)>,
    ) -> Taken {
        let rec = FrameRecord::parse(body);
        let (stream_seq, is_stored) = match stored {
            Some((seq, m)) => {
                // A copy is acknowledged with the others (its first copy is among them).
                self.unacked.push_back(m);
                self.read_to = self.read_to.max(seq.unwrap_or(0));
                (seq, true)
            }
            None => (None, false),
        };
        let Some(rec) = rec else {
            self.malformed += 1;
            return Taken::Malformed;
        };
        if is_stored && stream_seq.is_none() {
            // Not a delivery of the stream: JetStream's name a sequence.
            self.malformed += 1;
            return Taken::Malformed;
        }
        if rec.stream != self.stream {
            self.foreign += 1;
            return Taken::Foreign;
        }
        let fresh = if is_stored {
            !self.seen.contains(&rec.payload)
                && !self.opened.as_ref().is_some_and(|o| o.covers(&rec.payload))
                && stream_seq.is_none_or(|s| self.handed.insert(s, body))
        } else {
            match self.last {
                Some((run, seq)) if run == rec.run && !self.many_senders => rec.seq > seq,
                _ => true,
            }
        };
        if !fresh {
            self.copies += 1;
            return Taken::Copy;
        }
        match self.reorder.as_mut().filter(|_| is_stored) {
            Some(r) => self.ready.extend(r.push((rec, stream_seq), now)),
            None => self.ready.push_back((rec, stream_seq)),
        }
        Taken::Queued
    }

    /// Takes again a stored record that was handed out and did not open then (under a key
    /// this side was given only since: [`super::keys::Opener::take_unopened`]); its message
    /// was taken (and is acknowledged) already.
    ///
    /// It goes before the records of its run with a later place that wait here to be opened:
    /// its gap may have been given up meanwhile (a key that comes late), the records after it
    /// handed on, not yet opened (found by `testkit/tests/nats_keys.rs` with rekey notices
    /// lost: an app side in its fruitless pause set a run's first frame aside, gave up the gap,
    /// and delivered the frame after the rest of the run once the key came).
    pub fn retake(&mut self, now: Instant, rec: FrameRecord, stored: Option<u64>) {
        if self.seen.contains(&rec.payload) {
            self.copies += 1;
            return;
        }
        let out = match self.reorder.as_mut() {
            Some(r) => r.push((rec, stored), now),
            None => vec![(rec, stored)],
        };
        for item in out {
            let at = self
                .ready
                .iter()
                .position(|(x, _)| x.run == item.0.run && x.wseq > item.0.wseq);
            match at {
                Some(i) => self.ready.insert(i, item),
                None => self.ready.push_back(item),
            }
        }
    }

    /// The next record to open, with its stream sequence.
    pub fn poll_record(&mut self) -> Option<Stored> {
        while let Some((rec, stored)) = self.ready.pop_front() {
            // Behind a place a genuine record took already (a copy, or one stored after its
            // gap was given up): the order is past it. One that took a place no genuine record
            // did is opened, so that a forged one gives its place back ([`Intake::give_back`]).
            let behind = self
                .reorder
                .as_ref()
                .and_then(|r| r.confirmed(rec.run))
                .is_some_and(|c| rec.wseq <= c);
            if behind
                && rec.seq != END_SEQ
                && self.last.is_some_and(|(r, s)| r == rec.run && rec.seq <= s)
            {
                self.copies += 1;
                continue;
            }
            return Some((rec, stored));
        }
        None
    }

    /// Whether a stored record with `rec`'s sealed header opened already: `rec`, opened too,
    /// is a copy taken before that one opened (both held behind the same gap, say); a key
    /// change in between gives the opener fresh replay windows, so it opened again. Counted
    /// as a copy.
    pub fn known_copy(&mut self, rec: &FrameRecord) -> bool {
        let known = self.seen.contains(&rec.payload);
        if known {
            self.copies += 1;
        }
        known
    }

    /// Stored record `rec` opened (it is genuine, at its subject sequence): its copies are
    /// dropped from now on, and the order is past it for good.
    pub fn authentic(&mut self, rec: &FrameRecord, now: Instant) {
        self.seen.insert(&rec.payload);
        if let Some(o) = self.opened.as_mut() {
            o.mark(&rec.payload);
        }
        if let Some(r) = self.reorder.as_mut() {
            let behind = r.genuine(rec.run, rec.wseq, now);
            self.ready.extend(behind);
        }
    }

    /// Stored record `rec` opened under the key before a rotation and was dropped for being
    /// stored after it: the order is past its place, as after [`Intake::authentic`], but its
    /// sealed header is not remembered — a copy of it stored before the rotation (the genuine
    /// frame, delivered after this one) is not a copy to drop.
    pub fn passed(&mut self, rec: &FrameRecord, now: Instant) {
        if let Some(r) = self.reorder.as_mut() {
            let behind = r.genuine(rec.run, rec.wseq, now);
            self.ready.extend(behind);
        }
    }

    /// Whether a record of a run earlier than `run` waits to be opened (released by
    /// [`Intake::authentic`] when a record of `run` opened: see [`Reorder::genuine`]).
    pub fn readies_earlier_than(&self, run: u64) -> bool {
        self.ready.iter().any(|(r, _)| r.run < run)
    }

    /// Stored record `rec`, the last [`Intake::poll_record`] gave, holds no place in the
    /// order: it did not open bound to its record's subject sequence (an altered copy of a
    /// frame the server did not store, garbage with a genuine header), or it is a copy of a
    /// frame opened already. Where it took the place of one still to come, the order waits
    /// for that one again (see [`Reorder::unrelease`]).
    pub fn give_back(&mut self, rec: &FrameRecord, now: Instant) {
        let Some(r) = self.reorder.as_mut() else {
            return;
        };
        let (after, rest): (VecDeque<Stored>, VecDeque<Stored>) = std::mem::take(&mut self.ready)
            .into_iter()
            .partition(|(x, _)| x.run == rec.run && x.wseq >= rec.wseq);
        let again = r.unrelease(rec.run, rec.wseq, after.into(), now);
        self.ready = again.into_iter().chain(rest).collect();
    }

    /// Reports an opened frame of `run` numbered `seq`.
    pub fn opened(&mut self, run: u64, seq: u64) -> Opened {
        if seq == END_SEQ {
            let first = self.ended != Some(run);
            self.ended = Some(run);
            return Opened::End { first };
        }
        let restarted = self.last.filter(|(r, _)| *r != run);
        self.last = Some((run, seq));
        Opened::Frame { restarted }
    }

    /// Where this ordered stream stands (`None` before its first frame, or unordered).
    pub fn position(&self) -> Option<Position> {
        let (run, seq) = self.last?;
        let next = self.reorder.as_ref()?.next_of(run)?;
        Some(Position { run, next, seq })
    }

    /// What the next process of this stream needs, read when acknowledging (everything
    /// taken is through then); `None` unordered or before the consumer started.
    pub fn kept(&self) -> Option<Kept> {
        self.reorder.as_ref()?;
        Some(Kept {
            start: self.first_start?,
            position: self.position(),
            again_from: None,
        })
    }

    /// Takes the stream up where a process before this one stood when it acknowledged last
    /// (its durable consumer delivers again from the first message it had not
    /// acknowledged): runs that began after its consumer's first start are seen whole, what
    /// it handed on is behind the order, and frames numbered at or below its last are copies.
    pub fn take_up(&mut self, k: Kept) {
        let Some(r) = self.reorder.as_mut() else {
            return;
        };
        self.first_start = Some(k.start);
        r.whole_runs_from(k.start);
        if let Some(p) = k.position {
            r.resume(p.run, p.next);
            self.last = Some((p.run, p.seq));
        }
    }

    /// When a gap is given up.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.reorder.as_ref().and_then(Reorder::poll_timeout)
    }

    /// Gives up the gaps held too long; whether any was.
    pub fn handle_timeout(&mut self, now: Instant) -> bool {
        let Some(r) = self.reorder.as_mut() else {
            return false;
        };
        let late = r.poll(now);
        let any = !late.is_empty();
        self.ready.extend(late);
        any
    }

    /// Frames given up behind gaps.
    pub fn skipped(&self) -> u64 {
        self.reorder.as_ref().map_or(0, |r| r.skipped)
    }

    /// Whether nothing taken waits here (behind a gap or to be opened).
    pub fn holds_nothing(&self) -> bool {
        self.ready.is_empty() && self.reorder.as_ref().is_none_or(Reorder::is_empty)
    }

    /// Whether messages wait for their acknowledgement.
    pub fn has_unacked(&self) -> bool {
        !self.unacked.is_empty()
    }

    /// The messages to acknowledge now, in order: all of them once `through` (everything
    /// handed to the sink is complete) and nothing is held here; else none.
    pub fn acks_due(&mut self, through: bool) -> Vec<M> {
        if through && self.holds_nothing() {
            // Everything delivered went through: the windows say so for the next process.
            if let Some(o) = self.opened.as_mut() {
                o.handle_through(self.read_to);
            }
            self.unacked.drain(..).collect()
        } else {
            Vec::new()
        }
    }

    /// Every message waiting for its acknowledgement (the stream ends).
    pub fn take_acks(&mut self) -> Vec<M> {
        self.unacked.drain(..).collect()
    }

    /// The server confirmed an acknowledgement up to stream sequence `seq`.
    pub fn acked(&mut self, seq: u64) {
        self.acked_to = self.acked_to.max(seq);
    }

    /// The stream sequence up to which everything was acknowledged (a consumer made again
    /// after a reconnect starts after it).
    pub fn acked_to(&self) -> u64 {
        self.acked_to
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(stream: u16, run: u64, seq: u64, wseq: u64, sealed: u8) -> Bytes {
        FrameRecord {
            stream,
            flags: 0,
            run,
            began: 0,
            seq,
            timestamp_ns: 0,
            wseq,
            payload: Bytes::from(vec![sealed; 30]),
        }
        .encode()
    }

    fn seqs(i: &mut Intake<u64>, t: Instant) -> Vec<u64> {
        let mut v = Vec::new();
        while let Some((r, _)) = i.poll_record() {
            // As the driver does once the frame opened.
            i.authentic(&r, t);
            i.opened(r.run, r.seq);
            v.push(r.seq);
        }
        v
    }

    #[test]
    fn stored_copies_and_late_frames_come_out_once_in_order_and_acks_wait_for_gaps() {
        let t = Instant::now();
        let mut i: Intake<u64> = Intake::new(1, true, Duration::from_secs(10));
        assert_eq!(
            i.handle_message(t, &rec(1, 7, 0, 0, 0), Some((Some(1), 1))),
            Taken::Queued
        );
        assert_eq!(
            i.handle_message(t, &rec(1, 7, 2, 2, 2), Some((Some(2), 2))),
            Taken::Queued
        );
        assert_eq!(seqs(&mut i, t), vec![0], "2 waits for 1");
        assert!(
            i.acks_due(true).is_empty(),
            "nothing acknowledged behind a gap"
        );
        assert_eq!(i.poll_timeout(), Some(t + Duration::from_secs(10)));
        // A redelivered copy: known by its sealed header.
        assert_eq!(
            i.handle_message(t, &rec(1, 7, 0, 0, 0), Some((Some(1), 3))),
            Taken::Copy
        );
        assert_eq!(
            i.handle_message(t, &rec(1, 7, 1, 1, 1), Some((Some(3), 4))),
            Taken::Queued
        );
        assert_eq!(seqs(&mut i, t), vec![1, 2]);
        assert_eq!(
            i.acks_due(false),
            Vec::<u64>::new(),
            "the sink is not through"
        );
        assert_eq!(i.acks_due(true), vec![1, 2, 3, 4], "in order, the copy too");
        assert_eq!(i.copies, 1);
        // Another stream's record, and garbage.
        assert_eq!(
            i.handle_message(t, &rec(2, 7, 3, 3, 3), None),
            Taken::Foreign
        );
        assert_eq!(
            i.handle_message(t, &Bytes::from_static(b"x"), None),
            Taken::Malformed
        );
    }

    #[test]
    fn a_next_process_takes_up_where_the_last_one_acknowledged() {
        let t = Instant::now();
        // The first process: frames 0..=3 stored in order at 1..=4, frame 5 stored at 5
        // (before frame 4: its first publish failed), delivered, 4 at 6: acknowledged up to 4.
        let mut a: Intake<u64> = Intake::new(1, true, Duration::from_secs(10));
        a.consumer_start(1);
        for s in 0..4u64 {
            a.handle_message(t, &rec(1, 7, s, s, s as u8), Some((Some(s + 1), s + 1)));
        }
        assert_eq!(seqs(&mut a, t), vec![0, 1, 2, 3]);
        assert_eq!(a.acks_due(true), vec![1, 2, 3, 4]);
        let p = a.position().expect("a position once frames opened");
        assert_eq!(
            p,
            Position {
                run: 7,
                next: 4,
                seq: 3
            }
        );
        let k = a.kept().expect("kept once the consumer started");
        assert_eq!(
            k,
            Kept {
                start: 1,
                position: Some(p),
                again_from: None,
            }
        );
        assert_eq!(Kept::parse(&k.encode()), Some(k));
        let none = Kept {
            start: 9,
            position: None,
            again_from: Some(4),
        };
        assert_eq!(Kept::parse(&none.encode()), Some(none));
        let mut torn = k.encode();
        torn[9] ^= 1;
        assert_eq!(Kept::parse(&torn), None, "a torn file keeps nothing");
        assert_eq!(Kept::parse(&k.encode()[..55]), None);
        // It ends; its consumer goes on from its ack floor: frame 5 (at 5), then 4 (at 6),
        // then a copy of frame 3 stored again (at 7).
        let next = |resume: bool| {
            let mut b: Intake<u64> = Intake::new(1, true, Duration::from_secs(10));
            b.consumer_start(5);
            if resume {
                b.take_up(k);
            }
            b.handle_message(t, &rec(1, 7, 5, 5, 5), Some((Some(5), 5)));
            b.handle_message(t, &rec(1, 7, 4, 4, 4), Some((Some(6), 6)));
            b.handle_message(t, &rec(1, 7, 3, 3, 3), Some((Some(7), 7)));
            seqs(&mut b, t)
        };
        assert_eq!(
            next(true),
            vec![4, 5],
            "frame 4 waited for, the copy dropped"
        );
        // Without the position, the first record started the order and frame 4 was lost.
        assert!(!next(false).contains(&4));
    }

    #[test]
    fn a_gap_is_given_up_in_time_and_a_newer_run_and_its_end_are_reported() {
        let t = Instant::now();
        let mut i: Intake<u64> = Intake::new(1, true, Duration::from_secs(10));
        i.handle_message(t, &rec(1, 7, 0, 0, 0), Some((Some(1), 1)));
        i.handle_message(t, &rec(1, 7, 5, 5, 5), Some((Some(2), 2)));
        assert_eq!(seqs(&mut i, t), vec![0]);
        assert!(!i.handle_timeout(t + Duration::from_secs(9)));
        assert!(i.handle_timeout(t + Duration::from_secs(10)));
        assert_eq!(i.skipped(), 4);
        assert_eq!(seqs(&mut i, t), vec![5]);
        i.handle_message(t, &rec(1, 9, 0, 0, 9), Some((Some(3), 3)));
        let (r, _) = i.poll_record().unwrap();
        assert_eq!(
            i.opened(r.run, r.seq),
            Opened::Frame {
                restarted: Some((7, 5))
            }
        );
        assert_eq!(i.opened(9, END_SEQ), Opened::End { first: true });
        assert_eq!(i.opened(9, END_SEQ), Opened::End { first: false });
    }

    #[test]
    fn a_record_taken_again_goes_before_later_ones_of_its_run_still_waiting() {
        let t = Instant::now();
        let mut i: Intake<u64> = Intake::new(1, true, Duration::from_secs(10));
        // The run's first record does not open (no key yet): set aside, its place given back.
        let first = rec(1, 7, 0, 0, 0);
        i.handle_message(t, &first, Some((Some(1), 1)));
        let (r0, s0) = i.poll_record().unwrap();
        i.give_back(&r0, t);
        // The next ones wait behind its place, which is given up in time; the receiver does
        // not poll them yet (it waits for the key).
        i.handle_message(t, &rec(1, 7, 1, 1, 1), Some((Some(2), 2)));
        i.handle_message(t, &rec(1, 7, 2, 2, 2), Some((Some(3), 3)));
        assert!(i.handle_timeout(t + Duration::from_secs(10)));
        // The key comes: the record set aside is taken again, and goes first.
        i.retake(t, r0, s0);
        assert_eq!(seqs(&mut i, t), vec![0, 1, 2]);
    }

    #[test]
    fn an_altered_copy_that_does_not_open_does_not_make_the_genuine_frame_a_copy() {
        let t = Instant::now();
        let mut i: Intake<u64> = Intake::new(1, false, Duration::from_secs(10));
        // Someone saw a publish JetStream did not store and stored it first, its frame number
        // changed (it will not open): the driver does not call it authentic.
        let mut altered = rec(1, 7, 5, 0, 4).to_vec();
        altered[20..28].copy_from_slice(&9u64.to_be_bytes());
        let altered = Bytes::from(altered);
        assert_eq!(
            i.handle_message(t, &altered, Some((Some(1), 1))),
            Taken::Queued
        );
        assert!(i.poll_record().is_some());
        // The genuine publish, stored again: taken.
        assert_eq!(
            i.handle_message(t, &rec(1, 7, 5, 0, 4), Some((Some(2), 2))),
            Taken::Queued
        );
        assert_eq!(seqs(&mut i, t), vec![5]);
        assert_eq!(
            i.handle_message(t, &rec(1, 7, 5, 0, 4), Some((Some(3), 3))),
            Taken::Copy
        );
    }

    #[test]
    fn seen_drops_copies_by_their_sealed_header() {
        let mut s = Seen::default();
        assert!(s.insert(&[1u8; 40]));
        assert!(s.insert(&[2u8; 40]));
        assert!(!s.insert(&[1u8; 40]));
        assert!(
            s.insert(&[9u8; 3]),
            "too short to tell: the encrypt inverse decides"
        );
    }

    #[test]
    fn core_frames_at_or_below_the_last_one_of_their_run_are_copies() {
        let t = Instant::now();
        let mut i: Intake<u64> = Intake::new(2, false, Duration::from_secs(10));
        assert_eq!(
            i.handle_message(t, &rec(2, 7, 4, 0, 0), None),
            Taken::Queued
        );
        assert_eq!(seqs(&mut i, t), vec![4]);
        assert_eq!(i.handle_message(t, &rec(2, 7, 4, 1, 1), None), Taken::Copy);
        assert_eq!(i.handle_message(t, &rec(2, 7, 3, 1, 1), None), Taken::Copy);
        assert_eq!(
            i.handle_message(t, &rec(2, 8, 0, 0, 1), None),
            Taken::Queued
        );
        assert_eq!(
            i.handle_message(t, &rec(2, 7, END_SEQ, 0, 2), None),
            Taken::Queued
        );
    }

    #[test]
    fn a_consumer_left_behind_starts_after_its_ack_floor_or_at_what_was_kept_aside() {
        assert_eq!(Kept::resume_at(10, None), 11);
        let kept = |again_from| Kept {
            start: 1,
            position: None,
            again_from,
        };
        assert_eq!(Kept::resume_at(10, Some(&kept(None))), 11);
        assert_eq!(
            Kept::resume_at(10, Some(&kept(Some(7)))),
            7,
            "kept aside: comes again"
        );
        assert_eq!(Kept::resume_at(10, Some(&kept(Some(15)))), 11);
    }

    #[test]
    fn a_device_side_takes_every_app_sides_lossy_frames_each_numbered_its_own() {
        let t = Instant::now();
        let mut i: Intake<u64> = Intake::new(2, false, Duration::from_secs(10)).with_many_senders();
        // One app side is at frame 40, another starts at 0: both go on (copies are the
        // encrypt pair's to drop, by each sender's window).
        assert_eq!(
            i.handle_message(t, &rec(2, 7, 40, 0, 0), None),
            Taken::Queued
        );
        assert_eq!(
            i.handle_message(t, &rec(2, 7, 0, 0, 1), None),
            Taken::Queued
        );
        assert_eq!(
            i.handle_message(t, &rec(2, 7, 1, 0, 2), None),
            Taken::Queued
        );
        assert_eq!(seqs(&mut i, t), vec![40, 0, 1]);
    }
}

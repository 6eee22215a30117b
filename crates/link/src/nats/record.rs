//! The frame record of the NATS link: every data message carries one frame (packet/repr).
//!
//! ```text
//! off size (big-endian)
//!  0   2   stream id
//!  2   2   flags
//!  4   8   run id of the device side (a restarted device numbers its frames afresh)
//! 12   8   the JetStream stream sequence that run began after (0 without stored streams)
//! 20   8   sequence number
//! 28   8   timestamp, ns since the Unix epoch (source clock)
//! 36   8   subject sequence: 0, 1, 2 … per run on each subject (a receiver of stored frames
//!          puts them back in this order: [`Reorder`])
//! 44   …   payload: the sealed frame (the `encrypt` pair's format under the run's key: the
//!          group key and the two run fields, [`super::runs::run_key`]), sealed bound to the
//!          subject sequence (it is in the AEAD's associated data)
//! ```
//!
//! The subject sequence travels in the clear, so a receiver can order records before opening
//! them, and is bound into the seal, so the order a receiver keeps is the sender's. Someone who
//! may publish can store an altered copy of a frame the server did not store (its publish
//! failed and goes again) at the place in the order where the genuine one is awaited; it does
//! not open, and the receiver takes it back out of the order ([`Reorder::unrelease`]) and waits
//! for the genuine one (found by `testkit/tests/nats_keys.rs`: the genuine frame, stored after
//! the altered copy and the frames after it, was dropped as a copy).

use bytes::{BufMut, Bytes, BytesMut};

/// The sequence number of a stream's END: an empty frame sealed like any other (so nobody
/// without the group key can forge one), after the stream's last frame.
pub const END_SEQ: u64 = u64::MAX;

/// Header length.
pub const HEADER_LEN: usize = 44;

/// A parsed record; the payload is a slice of the message (no copy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameRecord {
    /// Stream id.
    pub stream: u16,
    /// The sending run.
    pub run: u64,
    /// The JetStream stream sequence the run began after.
    pub began: u64,
    /// Sequence number.
    pub seq: u64,
    /// Source timestamp.
    pub timestamp_ns: u64,
    /// Flags.
    pub flags: u16,
    /// Position on its subject in this run.
    pub wseq: u64,
    /// The frame's bytes.
    pub payload: Bytes,
}

impl FrameRecord {
    /// Parses a message body; `None` when it is shorter than the header.
    pub fn parse(b: &Bytes) -> Option<FrameRecord> {
        let h = b.get(..HEADER_LEN)?;
        let u64_at = |o: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&h[o..o + 8]);
            u64::from_be_bytes(a)
        };
        Some(FrameRecord {
            stream: u16::from_be_bytes([h[0], h[1]]),
            flags: u16::from_be_bytes([h[2], h[3]]),
            run: u64_at(4),
            began: u64_at(12),
            seq: u64_at(20),
            timestamp_ns: u64_at(28),
            wseq: u64_at(36),
            payload: b.slice(HEADER_LEN..),
        })
    }

    /// The header alone, for a sender that puts it in front of a payload it already holds
    /// (in a frame's headroom: no copy of the payload).
    pub fn header(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        let mut b = &mut h[..];
        b.put_u16(self.stream);
        b.put_u16(self.flags);
        b.put_u64(self.run);
        b.put_u64(self.began);
        b.put_u64(self.seq);
        b.put_u64(self.timestamp_ns);
        b.put_u64(self.wseq);
        h
    }

    /// The device run the record names.
    pub fn device_run(&self) -> super::runs::Run {
        super::runs::Run {
            id: self.run,
            began: self.began,
        }
    }

    /// The frame's metadata as the record carries it.
    pub fn meta(&self) -> ndd_core::Meta {
        ndd_core::Meta {
            stream: self.stream,
            seq: self.seq,
            timestamp_ns: self.timestamp_ns,
            flags: self.flags,
        }
    }

    /// The message body.
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(HEADER_LEN + self.payload.len());
        b.put_slice(&self.header());
        b.put_slice(&self.payload);
        b.freeze()
    }
}

/// Puts the records of one subject back in their subject sequence (sans-IO): a frame the
/// server stored late (published again after a server restart, behind newer ones) waits for
/// nothing; the newer ones wait for it, at most `wait` (then the gap is given up, counted).
/// Each record travels with its JetStream stream sequence (which run rules and key rotations
/// read: [`super::runs::RunGuard`]).
///
/// A record behind the order (a copy, or one the subject sequence of which someone who may
/// publish changed) is handed on at once, never dropped here: only the frame's own checks (its
/// sealed header, its key, the subject sequence its seal is bound to) may drop it, and a record
/// that took a place and proved forged gives it back ([`Reorder::unrelease`]). Every device run has an order of its own: a record naming another run (the next run after
/// a restart, or one anyone who may publish played in: it is refused later, once its run is
/// checked) neither releases nor disturbs what the current run holds behind a gap (found by
/// the simulation in `testkit/tests/nats_runs.rs`: one replayed record of an earlier run let
/// the held frames out ahead of the one they waited for, which was then dropped as a copy).
#[derive(Debug)]
pub struct Reorder {
    /// The runs seen last, the most recent last.
    runs: Vec<RunOrder>,
    wait: std::time::Duration,
    max: usize,
    /// Records never seen: gaps given up.
    pub skipped: u64,
    /// The consumer's first stream sequence: a run that began at or after it is delivered
    /// whole, so its order starts at subject sequence 0 (see [`Reorder::whole_runs_from`]).
    start: Option<u64>,
    /// The newest run a record of which opened.
    newest_genuine: Option<u64>,
}

#[derive(Debug)]
struct RunOrder {
    run: u64,
    /// Next subject sequence expected.
    next: u64,
    /// Records waiting, by subject sequence (more than one for a sequence: the clear header
    /// may be altered, so one of them may be forged; all go on, and the frames' own checks
    /// keep the genuine one).
    held: std::collections::BTreeMap<u64, Vec<Stored>>,
    /// Since when the order waits without progress: set when a record is first held, and
    /// again only when a record opens (genuine progress) while others are held; a record that
    /// fills a gap and proves forged does not restart the wait (one forged record published
    /// every < 30 s would hold the order at its gap for good). Ignored while nothing is held.
    since: Option<std::time::Instant>,
    /// Whether a record of this run opened (anyone may publish a header naming any run: an
    /// order no genuine record came in for goes first when there are too many).
    genuine: bool,
    /// The highest subject sequence a record of which opened.
    confirmed: Option<u64>,
    /// Where the order stood after the last gap it gave up: a forged record never takes it
    /// back behind that.
    floor: u64,
    /// A record of a newer run opened: nothing of this run waits any more (see
    /// [`Reorder::genuine`]).
    superseded: bool,
}

/// A record and where JetStream stored it.
pub type Stored = (FrameRecord, Option<u64>);

/// Runs whose order is kept at once: the newest genuine one and the device's runs after it,
/// several restarts in a row before this side hears of them (the keys name eight earlier
/// runs: `keys::EARLIER_RUNS`), and room for played-in ones. (Four were kept: seven restarts
/// in a row, each new run's first record late, made genuine runs' orders give way to each
/// other — found by `testkit/tests/nats_keys.rs`, seed 2611.)
const RUNS: usize = 12;

impl Reorder {
    /// Holds at most `max` records per run for at most `wait` behind a gap.
    pub fn new(wait: std::time::Duration, max: usize) -> Reorder {
        Reorder {
            runs: Vec::new(),
            wait,
            max: max.max(1),
            skipped: 0,
            start: None,
            newest_genuine: None,
        }
    }

    /// The consumer delivers everything stored from stream sequence `start` on: a run that
    /// began at or after it (its `began` + 1 ≥ `start`) is seen whole, so its first record
    /// to come may be a late one, and its order waits for subject sequence 0 (found by the
    /// simulation in `testkit/tests/nats_publish.rs`: a device whose first publishes failed
    /// and were stored after later ones had those dropped as copies by every app side).
    /// A run that began before `start` is seen from the middle: its first record to come
    /// starts its order.
    pub fn whole_runs_from(&mut self, start: u64) {
        self.start = Some(start);
    }

    /// Takes a record; gives the records now in order (none while a gap is open). The first
    /// record of a run starts its order.
    pub fn push(&mut self, item: Stored, now: std::time::Instant) -> Vec<Stored> {
        let (run, wseq) = (item.0.run, item.0.wseq);
        let Some(i) = self.runs.iter().position(|r| r.run == run) else {
            // A run before one a genuine record of which opened waits for nothing: what of it
            // is still taken was stored before the newer run began (`RunGuard`), so before
            // that record, and what never came never will (as [`Reorder::genuine`] gives up
            // such gaps). Its records (late copies, replays: their checks drop them) go on at
            // once and take no order's place (they made a new run whose first record came
            // late, its later ones held, give its place up and let those out ahead of it —
            // found by `testkit/tests/nats_keys.rs` with six device restarts in a row).
            if self.newest_genuine.is_some_and(|g| run < g) {
                return vec![item];
            }
            let mut out = Vec::new();
            if self.runs.len() >= RUNS {
                // One a newer run's genuine record superseded goes first (it waits for
                // nothing), then one no genuine record came in for and that holds nothing,
                // then, of those no genuine record came in for, the one whose run is farthest
                // above the newest genuine run (the one holding fewest among equals), else the
                // one seen longest ago; what it held comes out as it is (forged runs, holding
                // many or few, must not push a genuine new run's order out: found by review).
                let i = self
                    .runs
                    .iter()
                    .position(|r| r.superseded)
                    .or_else(|| {
                        self.runs
                            .iter()
                            .position(|r| !r.genuine && r.held.is_empty())
                    })
                    .or_else(|| {
                        // The farthest above the newest genuine run first (a device's next
                        // run is just above it; a forged header names any run), then the
                        // one holding fewest.
                        let g = self.newest_genuine;
                        (0..self.runs.len())
                            .filter(|&i| !self.runs[i].genuine)
                            .max_by_key(|&i| {
                                let r = &self.runs[i];
                                (
                                    g.map_or(0, |g| r.run.saturating_sub(g)),
                                    std::cmp::Reverse(r.held.len()),
                                )
                            })
                    })
                    .unwrap_or(0);
                let old = self.runs.remove(i);
                out.extend(old.held.into_values().flatten());
            }
            let whole = self
                .start
                .is_some_and(|s| item.0.began.saturating_add(1) >= s);
            if whole && wseq > 0 {
                let mut held = std::collections::BTreeMap::new();
                held.insert(wseq, vec![item]);
                self.runs.push(RunOrder {
                    run,
                    next: 0,
                    held,
                    since: Some(now),
                    genuine: false,
                    confirmed: None,
                    floor: 0,
                    superseded: false,
                });
                return out;
            }
            self.runs.push(RunOrder {
                run,
                next: wseq.saturating_add(1),
                held: Default::default(),
                since: None,
                genuine: false,
                confirmed: None,
                floor: 0,
                superseded: false,
            });
            out.push(item);
            return out;
        };
        let order = &mut self.runs[i];
        let n = order.next;
        if wseq < n || order.superseded {
            return vec![item];
        }
        if wseq > n {
            order.held.entry(wseq).or_default().push(item);
            if order.held.len() == 1 || order.since.is_none() {
                order.since.get_or_insert(now);
            }
            if order.held.len() > self.max {
                return Self::skip(order, &mut self.skipped, now);
            }
            return Vec::new();
        }
        order.next = n.saturating_add(1);
        let mut out = vec![item];
        Self::drain(order, &mut out);
        out
    }

    /// The record of `run` at subject sequence `wseq` opened: its run is a genuine one, and
    /// the order is past `wseq` for good. Gives what that lets out (records held at or before
    /// `wseq`: their places are behind the order now).
    ///
    /// Every earlier run's gaps are given up at once, what they held coming out too: the
    /// device restarted, and a record of an earlier run is taken only if it was stored before
    /// this run began (`RunGuard`), so before this record; the consumer delivers in stream
    /// order, so what such a gap waits for was never stored in time and never will be (a
    /// publish the old process had not seen stored when it died). Found by
    /// `testkit/tests/nats_keys.rs` with device restarts: the old run's last frames waited
    /// the whole `REORDER_WAIT` behind it and came after the new run's first ones.
    pub fn genuine(&mut self, run: u64, wseq: u64, now: std::time::Instant) -> Vec<Stored> {
        self.newest_genuine = Some(self.newest_genuine.map_or(run, |g| g.max(run)));
        let mut earlier = Vec::new();
        for o in self.runs.iter_mut().filter(|r| r.run < run) {
            o.superseded = true;
            while !o.held.is_empty() {
                earlier.extend(Self::skip(o, &mut self.skipped, now));
            }
        }
        let Some(o) = self.runs.iter_mut().find(|r| r.run == run) else {
            return earlier;
        };
        o.genuine = true;
        let progress = o.confirmed.is_none_or(|c| wseq > c);
        o.confirmed = Some(o.confirmed.map_or(wseq, |c| c.max(wseq)));
        if progress {
            // Genuine progress: what is held now waits from here.
            o.since = (!o.held.is_empty()).then_some(now);
        }
        let past = wseq.saturating_add(1);
        if o.next >= past {
            return earlier;
        }
        // A record that opened out of its turn (handed on at once, behind a place given
        // back): the order goes on after it, not waiting for a place already taken.
        o.next = past;
        let mut out: Vec<Stored> = earlier;
        while let Some((&k, _)) = o.held.first_key_value() {
            if k >= past {
                break;
            }
            if let Some(v) = o.held.remove(&k) {
                out.extend(v);
            }
        }
        Self::drain(o, &mut out);
        out
    }

    /// The next subject sequence the order of `run` expects.
    pub fn next_of(&self, run: u64) -> Option<u64> {
        self.runs.iter().find(|r| r.run == run).map(|r| r.next)
    }

    /// Takes up the order of `run` at subject sequence `next`, where the process before this
    /// one left it with everything before it handed on and opened (see
    /// [`super::intake::Position`]): a record of `run` before `next` is behind the order (a
    /// copy); one after it waits for the ones between. Without it, the first record of a run
    /// seen from the middle starts its order, and a record stored before it but numbered
    /// earlier, never handed on before, was dropped as a copy (found by
    /// `testkit/tests/nats_keys.rs` with app side restarts).
    pub fn resume(&mut self, run: u64, next: u64) {
        self.runs.retain(|r| r.run != run);
        if self.runs.len() >= RUNS {
            self.runs.remove(0);
        }
        self.runs.push(RunOrder {
            run,
            next,
            held: Default::default(),
            since: None,
            genuine: true,
            confirmed: next.checked_sub(1),
            floor: next,
            superseded: false,
        });
    }

    /// The highest subject sequence of `run` a record of which opened.
    pub fn confirmed(&self, run: u64) -> Option<u64> {
        self.runs
            .iter()
            .find(|r| r.run == run)
            .and_then(|r| r.confirmed)
    }

    /// The record of `run` at subject sequence `wseq`, released and handed on, proved forged
    /// (it did not open, or opened as another subject sequence). Unless a record at or after
    /// `wseq` opened already (then it held no place), it took the place of one still to
    /// come: the order waits for `wseq` again and `after` (the records of `run` at or after
    /// `wseq` released with or after it, not yet opened) wait behind it. Gives what is in
    /// order again at once (another record for `wseq` among `after`).
    pub fn unrelease(
        &mut self,
        run: u64,
        wseq: u64,
        after: Vec<Stored>,
        now: std::time::Instant,
    ) -> Vec<Stored> {
        let Some(order) = self.runs.iter_mut().find(|r| r.run == run) else {
            return after;
        };
        // A superseded run waits for nothing (found by `nats_keys` with device restarts: a
        // forged copy of the old run's frame giving its place back made the old run's last
        // frame wait behind the gap again, and come after the new run's).
        if order.confirmed.is_some_and(|c| c >= wseq) || order.superseded {
            return after;
        }
        // Nothing between the last genuine record and this one opened: what follows the last
        // genuine one is awaited (a forged record far ahead, released when its gap was given
        // up, must not leave the order there) — but never behind a gap given up already, or
        // one forged record would hold the order at a gap for good.
        let mut next = order.next.min(wseq);
        if let Some(c) = order.confirmed {
            next = next.min(c.saturating_add(1));
        }
        order.next = next.max(order.floor);
        // Records behind the order as it now stands go on at once, the others wait their turn.
        let mut out = Vec::new();
        for item in after {
            if item.0.wseq < order.next {
                out.push(item);
            } else {
                order.held.entry(item.0.wseq).or_default().push(item);
            }
        }
        // A wait begun before goes on: giving places back does not restart it.
        if !order.held.is_empty() {
            order.since.get_or_insert(now);
        }
        Self::drain(order, &mut out);
        out
    }

    /// Gives up the gaps held longer than `wait`.
    pub fn poll(&mut self, now: std::time::Instant) -> Vec<Stored> {
        let mut out = Vec::new();
        for order in &mut self.runs {
            if !order.held.is_empty()
                && order
                    .since
                    .is_some_and(|t| now.saturating_duration_since(t) >= self.wait)
            {
                out.extend(Self::skip(order, &mut self.skipped, now));
            }
        }
        out
    }

    /// When the oldest open gap is given up ([`Reorder::poll`]).
    pub fn poll_timeout(&self) -> Option<std::time::Instant> {
        self.runs
            .iter()
            .filter(|r| !r.held.is_empty())
            .filter_map(|r| r.since)
            .min()
            .map(|t| t + self.wait)
    }

    /// Whether no record waits behind a gap.
    pub fn is_empty(&self) -> bool {
        self.runs.iter().all(|r| r.held.is_empty())
    }

    fn skip(order: &mut RunOrder, skipped: &mut u64, now: std::time::Instant) -> Vec<Stored> {
        let Some(&first) = order.held.keys().next() else {
            return Vec::new();
        };
        *skipped = skipped.saturating_add(first.saturating_sub(order.next));
        // The place waited for is given up for good; the ones after it up to `first` only
        // because nothing came for them before `first` did (a forged record far ahead may be
        // `first`: they are awaited again if it gives its place back).
        order.floor = first.min(order.next.saturating_add(1));
        order.next = first;
        order.since = Some(now);
        let mut out = Vec::new();
        Self::drain(order, &mut out);
        out
    }

    fn drain(order: &mut RunOrder, out: &mut Vec<Stored>) {
        while let Some(r) = order.held.remove(&order.next) {
            out.extend(r);
            order.next = order.next.saturating_add(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixture() {
        let r = FrameRecord {
            stream: 1,
            run: 5,
            began: 9,
            seq: 2,
            timestamp_ns: 3,
            flags: 4,
            wseq: 6,
            payload: Bytes::from_static(b"hi"),
        };
        let b = r.encode();
        assert_eq!(
            &b[..],
            &[
                0, 1, 0, 4, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 2,
                0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 6, b'h', b'i'
            ]
        );
        assert_eq!(FrameRecord::parse(&b), Some(r));
        assert_eq!(FrameRecord::parse(&b.slice(..43)), None);
    }

    fn rec(run: u64, wseq: u64) -> Stored {
        let r = FrameRecord {
            stream: 1,
            run,
            began: 0,
            seq: wseq,
            timestamp_ns: 0,
            flags: 0,
            wseq,
            payload: Bytes::new(),
        };
        (r, Some(1000 + wseq))
    }

    fn w(v: Vec<Stored>) -> Vec<u64> {
        v.into_iter()
            .map(|(r, stored)| {
                assert_eq!(
                    stored,
                    Some(1000 + r.wseq),
                    "each record keeps its sequence"
                );
                r.wseq
            })
            .collect()
    }

    #[test]
    fn a_late_record_is_put_back_in_its_place_and_a_gap_is_given_up_in_time() {
        let t = std::time::Instant::now();
        let mut r = Reorder::new(std::time::Duration::from_secs(1), 100);
        assert_eq!(w(r.push(rec(1, 5), t)), vec![5]);
        assert_eq!(w(r.push(rec(1, 7), t)), Vec::<u64>::new());
        assert_eq!(w(r.push(rec(1, 8), t)), Vec::<u64>::new());
        assert_eq!(w(r.push(rec(1, 6), t)), vec![6, 7, 8]);
        assert_eq!(
            w(r.push(rec(1, 6), t)),
            vec![6],
            "a copy goes on (its checks drop it)"
        );
        assert_eq!(w(r.push(rec(1, 10), t)), Vec::<u64>::new());
        assert!(r.poll(t + std::time::Duration::from_millis(10)).is_empty());
        assert_eq!(
            r.poll_timeout(),
            Some(t + std::time::Duration::from_secs(1))
        );
        assert_eq!(w(r.poll(t + std::time::Duration::from_secs(2))), vec![10]);
        assert_eq!(r.poll_timeout(), None);
        assert_eq!(r.skipped, 1);
        // A new run starts afresh.
        assert_eq!(w(r.push(rec(2, 0), t)), vec![0]);
    }

    #[test]
    fn a_newer_runs_genuine_record_gives_up_the_earlier_runs_gaps_at_once() {
        let t = std::time::Instant::now();
        let mut r = Reorder::new(std::time::Duration::from_secs(30), 100);
        assert_eq!(w(r.push(rec(1, 0), t)), vec![0]);
        // Frames 1 and 2 of run 1 died with its process; 3 and 4 wait behind them.
        assert_eq!(w(r.push(rec(1, 3), t)), Vec::<u64>::new());
        assert_eq!(w(r.push(rec(1, 4), t)), Vec::<u64>::new());
        // Run 2's first record goes on (its order starts with it); a forged one naming a
        // later run does nothing to run 1 until a record of its run opens.
        assert_eq!(w(r.push(rec(2, 0), t)), vec![0]);
        assert!(!r.is_empty());
        // It opened: run 1's gap never fills (anything of it still to come was stored before
        // run 2 began, so before this record): given up now, not after 30 s.
        assert_eq!(w(r.genuine(2, 0, t)), vec![3, 4]);
        assert!(r.is_empty());
        assert_eq!(r.skipped, 2);
        // Run 1 waits for nothing any more: a late record goes on, and one that gives its
        // place back leaves nothing held.
        assert_eq!(w(r.push(rec(1, 9), t)), vec![9]);
        assert_eq!(w(r.unrelease(1, 3, vec![rec(1, 4)], t)), vec![4]);
        assert!(r.is_empty());
        // A record of run 1 opening gives up nothing of run 2.
        assert_eq!(w(r.push(rec(2, 2), t)), Vec::<u64>::new());
        assert!(w(r.genuine(1, 4, t)).is_empty());
        assert!(!r.is_empty());
    }

    #[test]
    fn a_run_that_began_after_the_consumer_started_waits_for_its_first_record() {
        let t = std::time::Instant::now();
        let mut r = Reorder::new(std::time::Duration::from_secs(1), 100);
        r.whole_runs_from(1000);
        // Run 5 began at 999 (rec() sets began 0: build them by hand).
        let rec_b = |run: u64, began: u64, wseq: u64| {
            let (mut x, s) = rec(run, wseq);
            x.began = began;
            (x, s)
        };
        assert_eq!(w(r.push(rec_b(5, 999, 2), t)), Vec::<u64>::new());
        assert_eq!(w(r.push(rec_b(5, 999, 0), t)), vec![0]);
        assert_eq!(w(r.push(rec_b(5, 999, 1), t)), vec![1, 2]);
        // A run that began before the consumer's start is seen from its middle.
        assert_eq!(w(r.push(rec_b(4, 998, 7), t)), vec![7]);
    }

    #[test]
    fn after_many_restarts_a_new_runs_late_first_record_keeps_its_place() {
        let t = std::time::Instant::now();
        let mut r = Reorder::new(std::time::Duration::from_secs(30), 100);
        r.whole_runs_from(0);
        // Runs 1, 2, 3 each open a record (each supersedes the one before).
        for run in 1..=3 {
            assert_eq!(w(r.push(rec(run, 0), t)), vec![0]);
            r.genuine(run, 0, t);
        }
        // Run 4's second record comes before its first: it waits.
        assert_eq!(w(r.push(rec(4, 1), t)), Vec::<u64>::new());
        // A record of run 5 (a fifth order): a superseded run makes way, not run 4.
        assert_eq!(w(r.push(rec(5, 0), t)), vec![0]);
        // Late copies and replays of earlier runs, whole ones too: they go on at once and
        // take no order's place.
        for (run, wseq) in [(1, 9), (2, 3), (1, 4), (2, 7), (2, 8)] {
            assert_eq!(w(r.push(rec(run, wseq), t)), vec![wseq]);
        }
        // Forged runs far ahead (whole: each waits for its 0), more than there are orders,
        // some holding more than run 4: the ones farthest above the newest genuine run make
        // way (what they held comes out), run 4 keeps its place.
        assert_eq!(w(r.push(rec(4, 2), t)), Vec::<u64>::new());
        let mut released = 0;
        for forged in 90..90 + 2 * RUNS as u64 {
            for wseq in 5..8 + forged % 2 {
                released += r.push(rec(forged, wseq), t).len();
            }
        }
        assert!(released > 0, "forged orders made way");
        assert_eq!(w(r.push(rec(4, 0), t)), vec![0, 1, 2]);
        assert_eq!(r.skipped, 0);
    }

    #[test]
    fn a_record_of_another_run_neither_releases_nor_disturbs_what_waits() {
        let t = std::time::Instant::now();
        let mut r = Reorder::new(std::time::Duration::from_secs(1), 100);
        assert_eq!(w(r.push(rec(5, 0), t)), vec![0]);
        assert_eq!(w(r.push(rec(5, 2), t)), Vec::<u64>::new());
        // A played-in record of run 3, then of run 9: each passes, 2 still waits for 1.
        assert_eq!(w(r.push(rec(3, 40), t)), vec![40]);
        assert_eq!(w(r.push(rec(9, 7), t)), vec![7]);
        assert!(!r.is_empty());
        assert_eq!(w(r.push(rec(5, 1), t)), vec![1, 2]);
        assert!(r.is_empty());
        assert_eq!(r.skipped, 0);
    }

    fn wseqs(v: &[Stored]) -> Vec<u64> {
        v.iter().map(|(r, _)| r.wseq).collect()
    }

    #[test]
    fn a_forged_record_filling_a_gap_and_giving_it_back_does_not_restart_its_wait() {
        let t0 = std::time::Instant::now();
        let secs = std::time::Duration::from_secs;
        let mut o = Reorder::new(secs(30), 100);
        assert_eq!(wseqs(&o.push(rec(7, 0), t0)), vec![0]);
        assert!(o.genuine(7, 0, t0).is_empty());
        assert!(o.push(rec(7, 2), t0).is_empty(), "2 waits for 1");
        // A forged 1, 20 s later: 1 and 2 come out; 1 proves forged, 2 goes back to wait.
        let out = o.push(rec(7, 1), t0 + secs(20));
        assert_eq!(wseqs(&out), vec![1, 2]);
        let back = o.unrelease(7, 1, vec![out[1].clone()], t0 + secs(20));
        assert!(back.is_empty());
        // The wait is the one begun at t0: given up at t0 + 30 s, not t0 + 50 s.
        assert_eq!(o.poll_timeout(), Some(t0 + secs(30)));
        assert_eq!(wseqs(&o.poll(t0 + secs(30))), vec![2]);
        assert_eq!(o.skipped, 1);
    }

    #[test]
    fn a_forged_record_far_ahead_given_up_to_does_not_end_the_order() {
        let t0 = std::time::Instant::now();
        let secs = std::time::Duration::from_secs;
        let mut o = Reorder::new(secs(30), 100);
        assert_eq!(wseqs(&o.push(rec(7, 0), t0)), vec![0]);
        assert!(o.genuine(7, 0, t0).is_empty());
        assert!(o.push(rec(7, 100), t0).is_empty());
        // Nothing else comes for 30 s: the gap is given up, to the forged 100 …
        let out = o.poll(t0 + secs(30));
        assert_eq!(wseqs(&out), vec![100]);
        // … which gives its place back: the order goes on after the one place given up.
        assert!(o.unrelease(7, 100, Vec::new(), t0 + secs(30)).is_empty());
        assert!(o.push(rec(7, 3), t0 + secs(31)).is_empty(), "3 waits for 2");
        assert_eq!(wseqs(&o.push(rec(7, 2), t0 + secs(31))), vec![2, 3]);
    }
}

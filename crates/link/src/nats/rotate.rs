//! The device side's keeper of the group key (sans-IO): when it checks who holds the key, the
//! rotation once a holder is no longer trusted, the gate the rotation waits at, where the
//! stream stood when it did, and the signed rekey notices that send app sides joining again.
//!
//! A rotation goes in three steps. [`Action::Rotate`]: a fresh key is written and every
//! stream seals under it from its next frame (its `since` still [`SINCE_PENDING`], so no
//! app side is told yet and joins wait). Then the gate: every reliable publisher of this side
//! says once everything it sealed under the old key is stored (the streams' `SourceFlow`
//! tells it), or [`GATE_WAIT`] passes. [`Action::ReadPosition`]: the JetStream stream's last
//! sequence is read — every device frame under the old key is stored at or before it, so an
//! app side drops one under the old key stored later (the revoked side holds that key) and
//! nothing genuine is lost. [`Action::Complete`]: the keys with that `since`, and the file of
//! retired keys a restarted device side reads ([`encode_retired`]); the notice goes out.
//! Until then that file says a rotation is under way and where the stream stood when it
//! began ([`encode_pending`], written at [`Action::Rotate`] before the key file): a device side
//! that stops mid-rotation completes it there when it starts again.
//!
//! No new check while a rotation is under way; the notice goes at once when a run begins,
//! every [`NOTICE_EVERY`] (core NATS may lose one), when a rotation completes and when frames
//! of an earlier run or key come in ([`Keeper::handle_stale`]), never while `since` is
//! pending. `drive/keeper.rs` drives it on the client and the files; `testkit/tests/nats_keys.rs`
//! drives it through revocations, restarts and a failing broker.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::follow::NOTICE_EVERY;
use super::keys::{rotation, GroupKey, RETIRED_KEYS, SINCE_PENDING};

/// How long a rotation waits for the reliable publishers to settle before it reads where the
/// stream stands anyway (a publisher whose acknowledgements do not come: the server is gone).
pub const GATE_WAIT: Duration = Duration::from_secs(10);

/// What the keeper asks its driver to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Read `known_peers` and who holds the key, and answer with [`Keeper::handle_check`].
    Check,
    /// A rotation began: start the gate's count over and hand `keys` to the streams (the
    /// revoked side is cut off now), say so (`revoked` held the key and are no longer
    /// trusted); then read where the JetStream stream stands (`began`; the run's start when
    /// it cannot be read) and write the files: first the retired keys with the rotation under
    /// way ([`encode_pending`]), then `keys.key` as the group key (private), then an empty
    /// holders file. A device side that stops before [`Action::Complete`] completes the
    /// rotation as of `began` when it starts again ([`Retired::under`]).
    Rotate {
        /// The keys from now on, `since` pending.
        keys: GroupKey,
        /// Who held the key and is no longer trusted.
        revoked: Vec<String>,
    },
    /// Read where the JetStream stream stands and answer with [`Keeper::handle_position`].
    /// `settled`: every reliable publisher settled under the old key; `false` when
    /// [`GATE_WAIT`] passed first (device frames published just before the rotation may not
    /// reach the app sides: say so).
    ReadPosition {
        /// Whether the publishers settled (else the wait ran out).
        settled: bool,
    },
    /// The rotation is complete: write `retired` (the file of retired keys, see
    /// [`encode_retired`]) and hand `keys` to the streams.
    Complete {
        /// The keys with the rotation's `since`.
        keys: GroupKey,
        /// The file of retired keys.
        retired: Vec<u8>,
    },
    /// Publish the signed rekey notice naming these keys.
    Announce(GroupKey),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Idle,
    /// The rotation waits for the publishers, at most until then.
    Gate {
        until: Instant,
    },
    /// Where the stream stands is being read.
    Position,
}

/// The device side's keeper (see the module's text).
#[derive(Debug)]
pub struct Keeper {
    keys: GroupKey,
    state: State,
    every: Duration,
    next_check: Instant,
    next_notice: Instant,
    /// Reliable publishers of this side, and how many of them settled since the rotation
    /// began.
    publishers: usize,
    settled: usize,
    actions: VecDeque<Action>,
}

impl Keeper {
    /// A run under `keys` begins: the first check is due at once (an app side revoked while
    /// the side was away never sees a frame under its key), then every `every`; the notice at
    /// once.
    pub fn new(now: Instant, keys: GroupKey, every: Duration) -> Keeper {
        Keeper {
            keys,
            state: State::Idle,
            every,
            next_check: now,
            next_notice: now,
            publishers: 0,
            settled: 0,
            actions: VecDeque::new(),
        }
    }

    /// The keys as they stand.
    pub fn keys(&self) -> GroupKey {
        self.keys
    }

    /// Whether a rotation is under way.
    pub fn rotating(&self) -> bool {
        self.state != State::Idle
    }

    /// The answer to [`Action::Check`]: `holders` were handed the key; `trusted` says who is
    /// still in `known_peers`; `fresh` is the key a rotation would draw.
    pub fn handle_check(
        &mut self,
        now: Instant,
        holders: &[String],
        trusted: impl Fn(&str) -> bool,
        fresh: [u8; 32],
    ) {
        if self.state != State::Idle {
            return;
        }
        let Some(r) = rotation(self.keys, holders, trusted, fresh) else {
            return;
        };
        self.keys = r.keys;
        self.settled = 0;
        self.state = State::Gate {
            until: now + GATE_WAIT,
        };
        self.actions.push_back(Action::Rotate {
            keys: r.keys,
            revoked: r.revoked,
        });
    }

    /// The gate's count as it stands: `publishers` reliable publishers on this side, of which
    /// `settled` told, since the rotation's [`Action::Rotate`], that everything they sealed
    /// under the old key is stored.
    pub fn handle_gate(&mut self, publishers: usize, settled: usize) {
        self.publishers = publishers;
        self.settled = settled;
    }

    /// The answer to [`Action::ReadPosition`]: the stream's last sequence (`0`: it could not
    /// be read, or there is no JetStream stream; app → device frames under the old key not yet
    /// read are then dropped).
    pub fn handle_position(&mut self, now: Instant, since: u64) {
        if self.state != State::Position {
            return;
        }
        self.keys = self.keys.since_at(since);
        self.state = State::Idle;
        self.next_check = now + self.every;
        self.actions.push_back(Action::Complete {
            keys: self.keys,
            retired: encode_retired(&self.keys),
        });
        self.next_notice = now;
    }

    /// Frames sealed for an earlier run or under a rotated key came in: the notice goes again
    /// now (the streams space these out).
    pub fn handle_stale(&mut self, now: Instant) {
        self.next_notice = self.next_notice.min(now);
    }

    /// The next thing to do, if any is due.
    pub fn poll(&mut self, now: Instant) -> Option<Action> {
        if let Some(a) = self.actions.pop_front() {
            return Some(a);
        }
        match self.state {
            State::Gate { until } => {
                let settled = self.settled >= self.publishers;
                if settled || now >= until {
                    self.state = State::Position;
                    return Some(Action::ReadPosition { settled });
                }
            }
            State::Idle if now >= self.next_check => {
                self.next_check = now + self.every;
                return Some(Action::Check);
            }
            _ => {}
        }
        if self.keys.since != SINCE_PENDING && now >= self.next_notice {
            self.next_notice = now + NOTICE_EVERY;
            return Some(Action::Announce(self.keys));
        }
        None
    }

    /// When [`Keeper::poll`] has something next, unless an answer or the gate's count comes
    /// first (asked once `poll` gave nothing: what was queued is out by then).
    pub fn poll_timeout(&self) -> Option<Instant> {
        let notice = (self.keys.since != SINCE_PENDING).then_some(self.next_notice);
        let own = match self.state {
            State::Idle => Some(self.next_check),
            State::Gate { until } => Some(until),
            State::Position => None,
        };
        match (own, notice) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// One retired key and the sequence of the rotation that retired it, as the file holds it.
const RETIRED_LEN: usize = 32 + 8;

/// What ends the file of retired keys while a rotation is under way ([`encode_pending`]).
const PENDING_MARK: [u8; 8] = [0xff; 8];

/// The file of retired keys a completed rotation leaves: the previous key and `since`, then
/// (since join version 5) the older one with its sequence, then the keys retired before it,
/// newest first: 40 bytes each (`key ‖ sequence u64 BE`). A restarted device side reads it
/// back with [`parse_retired`].
pub fn encode_retired(keys: &GroupKey) -> Vec<u8> {
    let mut b = Vec::with_capacity(RETIRED_LEN * (2 + RETIRED_KEYS) + PENDING_MARK.len());
    let Some(previous) = keys.previous else {
        return b;
    };
    b.extend_from_slice(&previous);
    b.extend_from_slice(&keys.since.to_be_bytes());
    if let Some((k, s)) = keys.older {
        b.extend_from_slice(&k);
        b.extend_from_slice(&s.to_be_bytes());
        for (k, s) in keys.retired.iter().flatten() {
            b.extend_from_slice(k);
            b.extend_from_slice(&s.to_be_bytes());
        }
    }
    b
}

/// The file of retired keys while a rotation is under way ([`Action::Rotate`]; written before
/// the key file is replaced): the rotation's `keys` as [`encode_retired`] writes them, with
/// `began` (where the JetStream stream stood when the rotation began) for the `since` still
/// pending, then 8 bytes `0xff`. [`Action::Complete`] replaces it.
///
/// A device side that stops before its rotation completes (killed, crashed, restarted) reads
/// it back ([`parse_retired`], [`Retired::under`]) and the rotation is complete as of `began`:
/// whatever the revoked side stored after the rotation began stays out however long this side
/// was away; what trusted app sides sealed under the old key and stored after `began` they
/// publish again under the new one (as after any rotation); device frames published just
/// before the rotation and stored after `began` (what the gate would have waited for) may not
/// reach the app sides. Before, the key file was replaced at once and the retired keys were
/// written only on completion: a device side killed in between came back with the new key and
/// the retired keys of the rotation before, the key just retired forgotten, and app sides that
/// had not yet read device frames sealed under it dropped them (found by
/// `testkit/tests/nats_keys.rs` with restarts mid-rotation).
pub fn encode_pending(keys: &GroupKey, began: u64) -> Vec<u8> {
    let mut b = encode_retired(&keys.since_at(began));
    if !b.is_empty() {
        b.extend_from_slice(&PENDING_MARK);
    }
    b
}

/// What [`parse_retired`] read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Retired {
    /// The previous key and the sequence of the rotation that retired it.
    pub previous: Option<([u8; 32], u64)>,
    /// The key before it, with its sequence.
    pub older: Option<([u8; 32], u64)>,
    /// The keys retired before that, newest first, with their sequences.
    pub retired: [Option<([u8; 32], u64)>; RETIRED_KEYS],
    /// The rotation that retired `previous` was under way when the file was written
    /// ([`encode_pending`]): its sequence is where the stream stood when it began.
    pub pending: bool,
}

impl Retired {
    /// These retired keys under `keys` (its key and run stay). A rotation under way when the
    /// file was written is complete as of where the stream stood when it began; one that had
    /// not replaced the key file yet (`previous` is the key: the side stopped in between)
    /// never happened, and the keys it retired are the ones before it (its next check rotates
    /// again: the holders file still names the revoked side).
    pub fn under(self, keys: GroupKey) -> GroupKey {
        let mut r = self;
        if r.pending && r.previous.is_some_and(|(k, _)| k == keys.key) {
            r.previous = r.older;
            r.older = r.retired[0];
            r.retired.rotate_left(1);
            r.retired[RETIRED_KEYS - 1] = None;
        }
        GroupKey {
            since: r.previous.map_or(0, |p| p.1),
            previous: r.previous.map(|p| p.0),
            older: r.older,
            retired: r.retired,
            ..keys
        }
    }
}

/// Reads the file [`encode_retired`] or [`encode_pending`] wrote; `Err(len)` when its length
/// is not that of keys with their sequences (and the mark of a rotation under way).
pub fn parse_retired(b: &[u8]) -> Result<Retired, usize> {
    if let Some(keys) = b.strip_suffix(&PENDING_MARK) {
        if keys.len() % RETIRED_LEN == 0 && !keys.is_empty() {
            let r = parse_retired(keys).map_err(|_| b.len())?;
            return Ok(Retired { pending: true, ..r });
        }
    }
    let one = |b: &[u8]| {
        let mut k = [0u8; 32];
        k.copy_from_slice(&b[..32]);
        let mut n = [0u8; 8];
        n.copy_from_slice(&b[32..RETIRED_LEN]);
        (k, u64::from_be_bytes(n))
    };
    let mut r = Retired::default();
    match b.len() {
        0 => {}
        RETIRED_LEN => r.previous = Some(one(b)),
        n if n >= 2 * RETIRED_LEN
            && n % RETIRED_LEN == 0
            && n <= RETIRED_LEN * (2 + RETIRED_KEYS) =>
        {
            r.previous = Some(one(&b[..RETIRED_LEN]));
            r.older = Some(one(&b[RETIRED_LEN..2 * RETIRED_LEN]));
            for (h, c) in r
                .retired
                .iter_mut()
                .zip(b[2 * RETIRED_LEN..].chunks_exact(RETIRED_LEN))
            {
                *h = Some(one(c));
            }
        }
        n => return Err(n),
    }
    Ok(r)
}

/// The count a rotation's gate reads ([`Keeper::handle_gate`]): the reliable publishers of
/// this side, and which of them settled under the old key since the rotation began. A
/// publisher settles once per rotation however often it says so, and one that ends takes its
/// settling with it (before, one that settled and then ended left its count behind, and the
/// gate opened while another still had publishes under the old key in flight; found by a
/// review). `drive/keeper.rs` keeps it under a lock beside a wake-up for the keeper;
/// `testkit/tests/nats_keys.rs` drives it with publishers ending mid-rotation.
#[derive(Debug, Default)]
pub struct Gate {
    /// Each publisher, by its number: the rotation it last settled in.
    publishers: std::collections::HashMap<u64, Option<u64>>,
    next: u64,
    /// The rotation under way (or the last one).
    rotation: u64,
}

impl Gate {
    /// A publisher starts: its number, for [`Gate::settled`] and [`Gate::leave`].
    pub fn join(&mut self) -> u64 {
        self.next += 1;
        self.publishers.insert(self.next, None);
        self.next
    }

    /// A rotation begins: nobody has settled in it.
    pub fn begin(&mut self) {
        self.rotation += 1;
    }

    /// Publisher `id` stored everything it sealed under the old key.
    pub fn settled(&mut self, id: u64) {
        if let Some(s) = self.publishers.get_mut(&id) {
            *s = Some(self.rotation);
        }
    }

    /// Publisher `id` ended.
    pub fn leave(&mut self, id: u64) {
        self.publishers.remove(&id);
    }

    /// (Publishers, those settled in this rotation): what [`Keeper::handle_gate`] takes.
    pub fn counts(&self) -> (usize, usize) {
        let settled = self
            .publishers
            .values()
            .filter(|s| **s == Some(self.rotation))
            .count();
        (self.publishers.len(), settled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nats::runs::Run;

    /// A publisher that settled and then ended takes its settling with it: the gate counts
    /// only the ones still there (before, the gate opened while another still had publishes
    /// under the old key in flight).
    #[test]
    fn the_gate_forgets_a_publisher_that_settled_and_ended() {
        let mut g = Gate::default();
        let a = g.join();
        let b = g.join();
        g.begin();
        g.settled(a);
        g.settled(a);
        assert_eq!(g.counts(), (2, 1), "once per rotation");
        g.leave(a);
        assert_eq!(g.counts(), (1, 0), "b has not settled");
        // A settling of an earlier rotation does not count in the next.
        let c = g.join();
        g.settled(c);
        g.begin();
        assert_eq!(g.counts(), (2, 0));
        g.leave(c);
        g.settled(b);
        assert_eq!(g.counts(), (1, 1));
        // An unknown or departed number changes nothing.
        g.settled(c);
        g.leave(99);
        assert_eq!(g.counts(), (1, 1));
    }

    fn keys() -> GroupKey {
        GroupKey::first([1; 32], Run { id: 7, began: 0 })
    }

    fn fp(s: &str) -> Vec<String> {
        vec![s.to_string()]
    }

    /// Polls everything due at `now`.
    fn due(k: &mut Keeper, now: Instant) -> Vec<Action> {
        std::iter::from_fn(|| k.poll(now)).collect()
    }

    #[test]
    fn a_revoked_holder_rotates_the_key_through_the_gate_then_the_notice_goes() {
        let t0 = Instant::now();
        let every = Duration::from_secs(1);
        let mut k = Keeper::new(t0, keys(), every);
        // A run begins: the check and the notice at once.
        assert_eq!(
            due(&mut k, t0),
            vec![Action::Check, Action::Announce(keys())]
        );
        k.handle_check(t0, &fp("a"), |_| true, [2; 32]);
        assert_eq!(due(&mut k, t0), vec![]);
        assert_eq!(k.poll_timeout(), Some(t0 + every));
        // A second later: `a` was untrusted. The rotation begins: no notice while `since` is
        // pending, no check, and the gate waits for the two reliable publishers.
        let t1 = t0 + every;
        assert_eq!(due(&mut k, t1), vec![Action::Check]);
        k.handle_gate(2, 0);
        k.handle_check(t1, &fp("a"), |_| false, [2; 32]);
        let [Action::Rotate { keys: new, revoked }] = &due(&mut k, t1)[..] else {
            panic!("a rotation");
        };
        assert_eq!(revoked, &fp("a"));
        assert_eq!(
            (new.key, new.since, new.previous),
            ([2; 32], SINCE_PENDING, Some([1; 32]))
        );
        assert!(k.rotating());
        k.handle_gate(2, 1);
        assert_eq!(due(&mut k, t1 + Duration::from_secs(5)), vec![]);
        assert_eq!(k.poll_timeout(), Some(t1 + GATE_WAIT));
        // The second settles: where the stream stands is read, then the keys are complete.
        k.handle_gate(2, 2);
        let t2 = t1 + Duration::from_secs(6);
        assert_eq!(
            due(&mut k, t2),
            vec![Action::ReadPosition { settled: true }]
        );
        assert_eq!(
            due(&mut k, t2),
            vec![],
            "nothing until the position is read"
        );
        k.handle_position(t2, 42);
        let done = k.keys();
        assert_eq!((done.since, done.previous), (42, Some([1; 32])));
        assert_eq!(
            due(&mut k, t2),
            vec![
                Action::Complete {
                    keys: done,
                    retired: encode_retired(&done)
                },
                Action::Announce(done)
            ]
        );
        assert!(!k.rotating());
        // Checks go on, and the notice every NOTICE_EVERY.
        assert_eq!(k.poll_timeout(), Some(t2 + every));
        assert_eq!(due(&mut k, t2 + every), vec![Action::Check]);
        assert_eq!(
            due(&mut k, t2 + NOTICE_EVERY),
            vec![Action::Check, Action::Announce(done)]
        );
    }

    #[test]
    fn a_gate_whose_publishers_never_settle_opens_after_the_wait_and_says_so() {
        let t0 = Instant::now();
        let mut k = Keeper::new(t0, keys(), Duration::from_secs(1));
        due(&mut k, t0);
        k.handle_gate(1, 0);
        k.handle_check(t0, &fp("a"), |_| false, [2; 32]);
        assert!(matches!(k.poll(t0), Some(Action::Rotate { .. })));
        // No check while rotating, however long it takes.
        assert_eq!(
            due(&mut k, t0 + GATE_WAIT - Duration::from_millis(1)),
            vec![]
        );
        assert_eq!(
            due(&mut k, t0 + GATE_WAIT),
            vec![Action::ReadPosition { settled: false }]
        );
        // A publisher that ended meanwhile counts no more: with none, the gate is open.
        let mut k = Keeper::new(t0, keys(), Duration::from_secs(1));
        due(&mut k, t0);
        k.handle_gate(1, 0);
        k.handle_check(t0, &fp("a"), |_| false, [2; 32]);
        k.poll(t0);
        k.handle_gate(0, 0);
        assert_eq!(
            due(&mut k, t0),
            vec![Action::ReadPosition { settled: true }]
        );
    }

    #[test]
    fn a_check_while_rotating_and_a_position_unasked_change_nothing() {
        let t0 = Instant::now();
        let mut k = Keeper::new(t0, keys(), Duration::from_secs(1));
        due(&mut k, t0);
        k.handle_position(t0, 9);
        assert_eq!(k.keys(), keys(), "no rotation under way");
        k.handle_check(t0, &fp("a"), |_| false, [2; 32]);
        k.poll(t0);
        let rotating = k.keys();
        k.handle_check(t0, &fp("b"), |_| false, [3; 32]);
        assert_eq!(k.keys(), rotating, "one rotation at a time");
    }

    #[test]
    fn stale_frames_bring_the_notice_forward_but_not_while_since_is_pending() {
        let t0 = Instant::now();
        let mut k = Keeper::new(t0, keys(), Duration::from_secs(60));
        due(&mut k, t0);
        let t1 = t0 + Duration::from_millis(300);
        k.handle_stale(t1);
        assert_eq!(due(&mut k, t1), vec![Action::Announce(keys())]);
        k.handle_gate(1, 0);
        k.handle_check(t1, &fp("a"), |_| false, [2; 32]);
        k.poll(t1);
        k.handle_stale(t1);
        assert_eq!(due(&mut k, t1 + NOTICE_EVERY), vec![]);
    }

    #[test]
    fn the_retired_keys_file_reads_back_as_written_and_a_wrong_length_is_refused() {
        let mut k = keys();
        assert_eq!(encode_retired(&k), Vec::<u8>::new());
        assert_eq!(parse_retired(&[]).unwrap().under(k), k);
        // Four rotations: previous, older and two retired.
        let trusted = |_: &str| false;
        for (i, since) in [(2u8, 10u64), (3, 20), (4, 30), (5, 40)] {
            k = rotation(k, &fp("a"), trusted, [i; 32])
                .unwrap()
                .keys
                .since_at(since);
            let b = encode_retired(&k);
            assert_eq!(parse_retired(&b).unwrap().under(k), k, "after key {i}");
        }
        assert_eq!(k.retired.iter().flatten().count(), 2);
        assert_eq!(parse_retired(&[0; 41]), Err(41));
        assert_eq!(parse_retired(&[0; 40 * (3 + RETIRED_KEYS)]), Err(360));
        // The first format: the previous key alone.
        let one = parse_retired(&[7; 40]).unwrap();
        assert_eq!(one.previous, Some(([7; 32], u64::from_be_bytes([7; 8]))));
        assert_eq!(one.older, None);
        assert!(!one.pending);
        // A sequence of all ones last is a sequence, not the mark of a rotation under way.
        let r = parse_retired(&[0xff; 80]).unwrap();
        assert_eq!((r.older.map(|o| o.1), r.pending), (Some(u64::MAX), false));
    }

    /// A device side that stops between a rotation's `Rotate` and its `Complete` comes back
    /// with the rotation complete as of where the stream stood when it began, the key it
    /// retired named (before, the key file held the new key and the file of retired keys the
    /// rotation before: the retired key was forgotten and app sides dropped device frames
    /// sealed under it that they had not read yet).
    #[test]
    fn a_rotation_under_way_reads_back_complete_as_of_where_it_began() {
        let trusted = |_: &str| false;
        // Two complete rotations, then a third under way.
        let mut k = keys();
        for (i, since) in [(2u8, 10u64), (3, 20)] {
            k = rotation(k, &fp("a"), trusted, [i; 32])
                .unwrap()
                .keys
                .since_at(since);
        }
        let pending = rotation(k, &fp("b"), trusted, [4; 32]).unwrap().keys;
        assert_eq!(pending.since, SINCE_PENDING);
        let b = encode_pending(&pending, 25);
        assert_eq!(
            b.len(),
            3 * 40 + 8,
            "previous, older, one retired, the mark"
        );
        let r = parse_retired(&b).unwrap();
        assert!(r.pending);
        // The key file was replaced: the rotation is complete as of 25.
        let back = r.under(GroupKey::first([4; 32], keys().run));
        assert_eq!(back, pending.since_at(25));
        assert_eq!(back.retired_after(&[3; 32]), 25);
        assert_eq!(back.retired_after(&[2; 32]), 20);
        assert_eq!(back.retired_after(&[1; 32]), 10);
        // Written complete, it reads back the same and no longer under way.
        let done = parse_retired(&encode_retired(&back)).unwrap();
        assert!(!done.pending);
        assert_eq!(done.under(GroupKey::first([4; 32], keys().run)), back);
        // The side stopped before the key file was replaced: the rotation never happened, the
        // keys are the ones before it.
        assert_eq!(r.under(GroupKey::first([3; 32], keys().run)), k);
        // With all the history kept, the oldest retired key is the one a rotation that never
        // happened leaves out.
        let mut full = k;
        for (i, since) in (5u8..=10).zip((30u64..).step_by(10)) {
            full = rotation(full, &fp("a"), trusted, [i; 32])
                .unwrap()
                .keys
                .since_at(since);
        }
        assert_eq!(full.retired.iter().flatten().count(), RETIRED_KEYS);
        let pending = rotation(full, &fp("a"), trusted, [11; 32]).unwrap().keys;
        let b = encode_pending(&pending, 99);
        assert_eq!(b.len(), 40 * (2 + RETIRED_KEYS) + 8);
        let r = parse_retired(&b).unwrap();
        let before = r.under(GroupKey::first([10; 32], keys().run));
        assert_eq!(
            (before.since, before.previous, before.older),
            (full.since, full.previous, full.older)
        );
        assert_eq!(
            before.retired[..RETIRED_KEYS - 1],
            full.retired[..RETIRED_KEYS - 1]
        );
        assert_eq!(before.retired[RETIRED_KEYS - 1], None);
        // Wrong lengths: the mark alone, after a torn key, after too many keys.
        assert_eq!(parse_retired(&PENDING_MARK), Err(8));
        let mut torn = vec![0u8; 41];
        torn.extend_from_slice(&PENDING_MARK);
        assert_eq!(parse_retired(&torn), Err(49));
        let mut many = vec![0u8; 40 * (3 + RETIRED_KEYS)];
        many.extend_from_slice(&PENDING_MARK);
        assert_eq!(parse_retired(&many), Err(40 * (3 + RETIRED_KEYS) + 8));
    }
}

//! The group key as it stands, its rotation, and the opening of frames under it (sans-IO).
//!
//! Every frame on the server is sealed under the run key ([`super::runs::run_key`]) of the
//! driver's *group key*, which only admitted app sides hold. Two rules keep a side that is no
//! longer trusted out:
//!
//! - **Rotation** ([`rotation`]): when an app side that was handed the key is no longer in
//!   `known_peers` (`ndd untrust`), the device draws a new key. Until it has read where its
//!   JetStream stream stands ([`GroupKey::since`] is [`SINCE_PENDING`]), its sinks already open
//!   under the new key and hold what opens only under the old one; then app → device frames
//!   under the old key are taken if they were stored at or before that sequence (nobody had been
//!   revoked then) and dropped if stored later (the revoked side still holds the old key; a
//!   trusted sender publishes its frame again under the new one, see
//!   [`super::outbox::Outbox::rotate`]).
//! - **Opening** ([`Opener`]): a frame's run is checked first ([`RunGuard`]: an earlier run's
//!   frame is a replay unless JetStream stored it before the current run began), then it opens
//!   under that run's key. On an app side a frame that opens under no key asks for the key
//!   again (the device may have rotated it: [`Verdict::AskKey`]) and is tried once more
//!   ([`Opener::retry`]), so no stored frame is lost to a rotation; when asking brought no new
//!   key (garbage: anyone may publish on the server), frames that do not open are dropped
//!   without asking for [`FRUITLESS_PAUSE`], but the stored ones are kept aside (at most
//!   [`UNOPENED_BYTES`]) and taken again once a new key comes ([`Opener::take_unopened`]): a
//!   frame under a rotated key that arrives before the rotation's notice, just after someone
//!   published garbage, is not lost (found by `testkit/tests/nats_keys.rs`). On a device side, a genuine frame of an earlier
//!   run (an app side that did not hear of the restart) asks the caller to tell the app sides
//!   to join again ([`Verdict::Refused`]'s `tell`), at most every [`RUN_NOTICE_SPACING`].
//!
//! The opener does no I/O and reads no clock: the caller passes `now`, asks the device for the
//! key, and hands keys in with [`Opener::handle_keys`]. The real halves are the `encrypt`
//! pair's inverse ([`RunHalf`] is how the opener makes and uses them).

use super::record::FrameRecord;
use super::runs::{run_key, Admit, Refusal, Run, RunGuard};
use ndd_core::{Frame, Meta, ModuleError, Output, RateLimit};
use std::time::{Duration, Instant};

/// [`GroupKey::since`] while a rotation reads where the JetStream stream stands: the device's
/// sinks already open under the new key and hold what is under the old one; joins wait.
pub const SINCE_PENDING: u64 = u64::MAX;

/// How long after a fruitless ask for the key a frame that does not open is dropped without
/// asking again (a rotation announced meanwhile is still followed).
pub const FRUITLESS_PAUSE: Duration = Duration::from_secs(5);

/// How often at most a device side that gets frames of its earlier run (app sides that did
/// not hear it restart, or replays) tells the app sides again to join.
pub const RUN_NOTICE_SPACING: Duration = Duration::from_secs(1);

/// Runs an opener keeps halves for (the current one and frames stored before it).
pub const RUNS_KEPT: usize = 3;

/// Bytes of stored records an app side's opener keeps aside while it does not ask for the key
/// ([`FRUITLESS_PAUSE`]), to take them again once a new key comes.
pub const UNOPENED_BYTES: usize = 4 << 20;

/// How recently a record must have been set aside for a process that takes the stream up
/// after this one to have it delivered again ([`Opener::aside_from`]).
pub const ASIDE_RECENT: std::time::Duration = std::time::Duration::from_secs(10);

/// The group key as it stands, and what its last rotation left behind.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct GroupKey {
    /// The key.
    pub key: [u8; 32],
    /// The device's JetStream stream sequence when a rotation drew this key (0: none did;
    /// [`SINCE_PENDING`] while the rotation reads it).
    pub since: u64,
    /// The key before that rotation: frames under it stored up to `since` still open; one
    /// under it stored later is refused. A device side keeps it from its own rotation; an
    /// app side's opener takes the key it held when a join brings a new one.
    pub previous: Option<[u8; 32]>,
    /// The key before `previous`, with the sequence of the rotation that retired it: frames
    /// under it stored up to that sequence still open. Two rotations close together (a
    /// device's sink, or an app side that missed one, sees them as one change of keys) leave
    /// nothing sealed before them unopened.
    pub older: Option<([u8; 32], u64)>,
    /// The keys retired before `older`, newest first, each with the sequence of the rotation
    /// that retired it (at most [`RETIRED_KEYS`]; join version 7), kept as `older` is: frames
    /// under them stored up to there still open, and a sender that sealed under one (three or
    /// more rotations close together, all missed) seals again only what was stored after
    /// (found by `testkit/tests/nats_keys.rs`: with two keys kept, a sender three rotations
    /// behind sealed again everything it kept and the device took a frame twice, and a frame
    /// under the key three rotations back that the device had not read yet was lost).
    pub retired: [Option<([u8; 32], u64)>; RETIRED_KEYS],
    /// The device run frames are sealed under: the device's own; on an app side the newest
    /// its joins named.
    pub run: Run,
    /// The device's runs before `run`, newest first (at most [`EARLIER_RUNS`]; join version
    /// 6): an app side that missed a restart, or several, seals again what it sealed under
    /// its old run and was stored after the first run it missed began
    /// ([`GroupKey::began_after`]), and a device side refuses exactly those (its `RunGuard`
    /// knows the runs: a frame of an earlier run must have been stored before the first run
    /// after it began).
    pub earlier: [Option<Run>; EARLIER_RUNS],
}

/// Device runs before the current one a [`GroupKey`] names.
pub const EARLIER_RUNS: usize = 8;

/// Keys retired before the previous and the older one that a [`GroupKey`] keeps.
pub const RETIRED_KEYS: usize = 6;

impl GroupKey {
    /// The first key of a run (no rotation behind it).
    pub fn first(key: [u8; 32], run: Run) -> GroupKey {
        GroupKey {
            key,
            since: 0,
            previous: None,
            older: None,
            retired: [None; RETIRED_KEYS],
            run,
            earlier: [None; EARLIER_RUNS],
        }
    }

    /// Where the oldest run these keys name began (a stream sequence): a device side's new
    /// durable consumer of what app sides send starts after it. Frames of the earlier runs
    /// stored before this run began still count, so a consumer made at this run's own start
    /// (or, as before, at the stream's end when the sink started, after the join service
    /// admitted app sides that sent at once) missed them: a device process that died before
    /// its sink made the consumer left the next one blind to what was sent meanwhile (found by
    /// `testkit/tests/nats_ending.rs`; a clean CI run lost an app side's frame 0 so).
    /// What is stored before belongs to runs the keys no longer name: their frames were taken
    /// by the processes of those runs, and the start is what keeps them out (the `RunGuard`
    /// takes a frame of a run older than any it knows, stored before the oldest one began, as
    /// one of an earlier run).
    pub fn oldest_began(&self) -> u64 {
        self.earlier
            .iter()
            .flatten()
            .map(|r| r.began)
            .fold(self.run.began, u64::min)
    }

    /// `run` as the run, the run it replaces first among the earlier ones (a device side that
    /// restarted).
    pub fn next_run(self, run: Run) -> GroupKey {
        let mut earlier = [None; EARLIER_RUNS];
        earlier[0] = Some(self.run);
        earlier[1..].copy_from_slice(&self.earlier[..EARLIER_RUNS - 1]);
        GroupKey {
            run,
            earlier,
            ..self
        }
    }

    /// Where the first run after run `id` began, of the runs these keys name: a sender whose
    /// frames were sealed under run `id` sends again those stored after it (the device
    /// refuses them: they cannot be told from replays). `u64::MAX` when no named run is newer;
    /// the oldest named run's start when `id` is older than every named one (more restarts
    /// than [`EARLIER_RUNS`] went by unseen: what was stored between the first of them and
    /// that start is lost).
    pub fn began_after(&self, id: u64) -> u64 {
        std::iter::once(self.run)
            .chain(self.earlier.iter().flatten().copied())
            .filter(|r| r.id > id)
            .map(|r| r.began)
            .min()
            .unwrap_or(u64::MAX)
    }

    /// The stream sequence after which frames sealed under `key` no longer open: never
    /// (`u64::MAX`) for the key as it stands, the rotation's for the keys before it, 0 for a
    /// key these keys do not name (nothing under it opens). A sender that followed keys to
    /// these sends again what it sealed under `key` and was stored after it.
    pub fn retired_after(&self, key: &[u8; 32]) -> u64 {
        if *key == self.key {
            u64::MAX
        } else if self.previous.as_ref() == Some(key) {
            self.since
        } else {
            match self.older {
                Some((k, since)) if k == *key => since,
                _ => self
                    .retired
                    .iter()
                    .flatten()
                    .find(|(k, _)| k == key)
                    .map_or(0, |(_, since)| *since),
            }
        }
    }

    /// A sender that sealed under `old` and now holds these keys: `Some(after)` when the run
    /// key changed, `after` the JetStream stream sequence after which the device no longer
    /// opens what was sealed under the old one, so the sender seals it again and publishes it
    /// once more — the first rotation since the key it sealed under (two may have come as
    /// one: [`GroupKey::retired_after`]), or the start of the first device run after the one it
    /// sealed for (the device restarted, maybe more than once: [`GroupKey::began_after`]),
    /// whichever is earlier. The driver's publishers and the simulations' senders follow this
    /// one rule.
    pub fn resend_after(&self, old: &GroupKey) -> Option<u64> {
        let mut after = None::<u64>;
        if self.key != old.key {
            after = Some(self.retired_after(&old.key));
        }
        if self.run != old.run {
            let began = self.began_after(old.run.id).min(self.run.began);
            after = Some(after.map_or(began, |a| a.min(began)));
        }
        after
    }

    /// The key frames of the run as it stands are sealed under.
    pub fn run_key(&self) -> [u8; 32] {
        run_key(&self.key, self.run)
    }
}

impl std::fmt::Debug for GroupKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupKey")
            .field("since", &self.since)
            .field("previous", &self.previous.is_some())
            .field("older", &self.older.map(|(_, s)| s))
            .field("retired", &self.retired.iter().flatten().count())
            .field("run", &self.run)
            .field("earlier", &self.earlier)
            .finish_non_exhaustive()
    }
}

/// A rotation decided by [`rotation`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rotation {
    /// The holders no longer trusted.
    pub revoked: Vec<String>,
    /// The keys from now on: `fresh`, the old key as `previous`, `since` pending (set it with
    /// [`GroupKey::since_at`] once the stream's last sequence is read).
    pub keys: GroupKey,
}

impl GroupKey {
    /// The keys of a rotation once the JetStream stream's last sequence is known (`0`: it
    /// could not be read; every app → device frame under the old key is then dropped).
    pub fn since_at(self, since: u64) -> GroupKey {
        GroupKey { since, ..self }
    }
}

/// The device's rule: if any of `holders` (the fingerprints the current key was handed to)
/// is no longer `trusted`, the key rotates to `fresh`; otherwise nothing changes.
pub fn rotation(
    current: GroupKey,
    holders: &[String],
    trusted: impl Fn(&str) -> bool,
    fresh: [u8; 32],
) -> Option<Rotation> {
    let revoked: Vec<String> = holders.iter().filter(|h| !trusted(h)).cloned().collect();
    if revoked.is_empty() {
        return None;
    }
    // Only a complete rotation's keys are kept (the device rotates again only then).
    let complete = current.since != SINCE_PENDING;
    let mut retired = current.retired;
    if let Some((k, since)) = current.older.filter(|_| complete) {
        retired.rotate_right(1);
        retired[0] = Some((k, since));
    }
    Some(Rotation {
        revoked,
        keys: GroupKey {
            key: fresh,
            since: SINCE_PENDING,
            previous: Some(current.key),
            older: current
                .previous
                .filter(|_| complete)
                .map(|p| (p, current.since)),
            retired,
            run: current.run,
            earlier: current.earlier,
        },
    })
}

/// What a [`RunHalf`] made of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// It authenticated; its frame is in the output.
    Opened,
    /// Its epoch and counter were taken already (the half's replay window): dropped before
    /// authentication, so its body may be anything.
    Replayed,
    /// It did not authenticate (another key, another subject sequence, altered, too short).
    Rejected,
}

/// A receiving half under one run key (the `encrypt` pair's inverse in [`crate::nats::drive`]).
pub trait RunHalf: Sized {
    /// The half under `key` (a run key).
    fn under(key: [u8; 32]) -> Self;
    /// Opens `frame`, sealed bound to its record's subject sequence `wseq` (the `encrypt`
    /// pair's `open_bound`), into `out` (one bound to another sequence does not authenticate
    /// and spends nothing of the window).
    fn open(
        &mut self,
        now: Instant,
        frame: Frame,
        wseq: u64,
        out: &mut Output,
    ) -> Result<Outcome, ModuleError>;
}

/// What became of a frame handed to [`Opener::handle_frame`] or [`Opener::retry`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// It opened; its frames are in `out`. `newer_run`: it made a newer device run the
    /// current one (an app side: join again to learn the run, without waiting).
    Opened {
        /// A newer run became the current one.
        newer_run: bool,
    },
    /// Its run was refused (dropped and counted). `tell`: a device side got a genuine frame
    /// of an earlier run: tell the app sides to join again.
    Refused {
        /// Why.
        why: Refusal,
        /// Tell the app sides to join again.
        tell: bool,
    },
    /// It opened under the key before the rotation while where the rotation began is not yet
    /// known: held until [`Opener::handle_keys`] brings it; then [`Opener::release`].
    Held,
    /// It opened under no key this side has: ask the device for the key, hand what comes to
    /// [`Opener::handle_keys`], then call [`Opener::retry`].
    AskKey,
    /// Dropped and counted: under the key before a rotation, stored after it (the revoked
    /// side holds that key too).
    Dropped,
    /// Dropped and counted: it opens under no key this side has (garbage, a copy whose
    /// record someone who may publish changed — its subject sequence, its number — or a frame
    /// under a key this side was not given).
    Forged,
    /// Dropped: its sealed header (epoch and counter) was taken already or is too old for the
    /// half's replay window — a copy, or anyone's record carrying a copied header: it is
    /// dropped unread, so its body may be anything.
    Replayed,
}

impl Verdict {
    /// Whether the record took its place in its subject's order (the receiver notes it:
    /// `Intake::authentic`): it opened, or it opened under the key before a rotation and
    /// was dropped for being stored after it (giving that place back would make the order
    /// wait 30 s for a place the device fills elsewhere, sealing it again).
    pub fn takes_place(self) -> bool {
        matches!(self, Verdict::Opened { .. } | Verdict::Dropped)
    }

    /// Whether the record holds no place in its subject's order (the receiver gives the place
    /// back: `Intake::give_back`): it opened under no key (nor bound to its record's subject
    /// sequence), its sealed header was taken already, or it named the current run with
    /// another start.
    pub fn holds_no_place(self) -> bool {
        matches!(
            self,
            Verdict::Forged
                | Verdict::Replayed
                | Verdict::Refused {
                    why: Refusal::OtherStart,
                    ..
                }
        )
    }
}

/// A frame that opened under the key before the rotation, waiting for where the rotation
/// began.
struct Held {
    /// The key before the rotation it opened under.
    under: [u8; 32],
    stored: Option<u64>,
    seq: u64,
    frames: Vec<Frame>,
}

/// A frame waiting for an answer to [`Verdict::AskKey`].
struct Parked {
    rec: FrameRecord,
    stored: Option<u64>,
    /// Whether the keys changed since it was parked.
    changed: bool,
    /// When it was first set aside, if it was ([`Opener::ask_again`]).
    aside: Option<Instant>,
}

/// The receiving halves under the group key as it stands, one per device run (see the
/// module's documentation).
pub struct Opener<H> {
    keys: GroupKey,
    guard: RunGuard,
    /// An app side asks for the key again; a device side tells app sides of its run.
    app: bool,
    /// Halves under `keys.key`, by run (the current one and a few earlier ones).
    open: Vec<(Run, H)>,
    /// After a rotation: halves under the key before it, and the one before that.
    previous: Vec<(Run, H)>,
    older: Vec<(Run, H)>,
    /// … and the keys retired before those ([`GroupKey::retired`]), in their order.
    retired: Vec<Vec<(Run, H)>>,
    held: Option<Held>,
    parked: Option<Parked>,
    /// Stored records dropped without asking (the pause), with where they were stored, and
    /// their bytes; taken again after a new key.
    unopened: std::collections::VecDeque<(FrameRecord, Option<u64>, Instant)>,
    unopened_bytes: usize,
    /// Whether the key changed since they were set aside.
    unopened_due: bool,
    /// When asking last brought no new key.
    fruitless: Option<Instant>,
    /// When app sides were last told to join again.
    told: Option<Instant>,
    /// A device side dropped a genuine frame under the key before a rotation, stored after
    /// it ([`Opener::take_tell`]).
    stale_key: bool,
    noisy: RateLimit,
    replays: RateLimit,
    /// Frames dropped: refused runs and frames that open under no key.
    pub dropped: u64,
    /// Frames under the key before a rotation stored after it (the revoked side's, or a
    /// trusted one's that it publishes again).
    pub after_rotation: u64,
    /// Records that proved forged ([`Verdict::Forged`]).
    pub forged: u64,
    /// Records whose sealed header (epoch and counter) was taken already
    /// ([`Verdict::Replayed`]).
    pub replayed: u64,
}

impl<H> std::fmt::Debug for Opener<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opener")
            .field("keys", &self.keys)
            .field("run", &self.guard.current())
            .field("app", &self.app)
            .field("held", &self.held.is_some())
            .field("parked", &self.parked.is_some())
            .field("dropped", &self.dropped)
            .finish_non_exhaustive()
    }
}

impl<H: RunHalf> Opener<H> {
    /// A device side's: refuses any run but its own and earlier ones stored before it began.
    pub fn device(keys: GroupKey) -> Opener<H> {
        let mut guard = RunGuard::device(keys.run);
        guard.know(keys.earlier.iter().flatten().copied());
        Opener::new(keys, guard, false)
    }

    /// An app side's: follows the device to a newer run, asks for the key again.
    pub fn app(keys: GroupKey) -> Opener<H> {
        let mut guard = RunGuard::app(keys.run);
        guard.know(keys.earlier.iter().flatten().copied());
        Opener::new(keys, guard, true)
    }

    fn new(keys: GroupKey, guard: RunGuard, app: bool) -> Opener<H> {
        Opener {
            keys,
            guard,
            app,
            open: Vec::new(),
            previous: Vec::new(),
            older: Vec::new(),
            retired: (0..RETIRED_KEYS).map(|_| Vec::new()).collect(),
            held: None,
            parked: None,
            unopened: std::collections::VecDeque::new(),
            unopened_bytes: 0,
            unopened_due: false,
            fruitless: None,
            stale_key: false,
            told: None,
            noisy: RateLimit::default(),
            replays: RateLimit::default(),
            dropped: 0,
            after_rotation: 0,
            forged: 0,
            replayed: 0,
        }
    }

    /// The keys as they stand.
    pub fn keys(&self) -> GroupKey {
        self.keys
    }

    /// The device run as it stands.
    pub fn run(&self) -> Run {
        self.guard.current()
    }

    /// Takes `k` as the keys as they stand (a rotation, a join's answer, where a rotation
    /// began); whether the halves changed (only `since` coming in, or a run learnt, keeps
    /// them).
    pub fn handle_keys(&mut self, mut k: GroupKey) -> bool {
        if self.app && k.previous.is_none() {
            // A join's answer names no previous key (the device knows of no rotation, e.g.
            // its record of it is gone): the one this side held is taken for it (and stays it
            // when a later join brings the same key again). Device frames under it stored up
            // to the rotation still open (this side may not have read them yet); later ones
            // are dropped (the revoked side holds that key too).
            k.previous = if k.key != self.keys.key {
                Some(self.keys.key)
            } else {
                self.keys.previous
            };
        }
        let same = k.key == self.keys.key
            && k.previous == self.keys.previous
            && k.older == self.keys.older
            && k.retired == self.keys.retired;
        self.keys = k;
        self.guard.learn(k.run);
        self.guard.know(k.earlier.iter().flatten().copied());
        if same {
            return false;
        }
        self.open.clear();
        self.previous.clear();
        self.older.clear();
        self.retired.iter_mut().for_each(Vec::clear);
        if let Some(p) = &mut self.parked {
            p.changed = true;
        }
        self.unopened_due = !self.unopened.is_empty();
        true
    }

    /// After a new key ([`Opener::handle_keys`]): the stored records dropped without asking
    /// meanwhile, to be taken again (`Intake::retake`) and opened under it. Empty until then.
    pub fn take_unopened(&mut self) -> Vec<(FrameRecord, Option<u64>)> {
        if !self.unopened_due {
            return Vec::new();
        }
        self.unopened_due = false;
        self.unopened_bytes = 0;
        self.unopened.drain(..).map(|(r, s, _)| (r, s)).collect()
    }

    /// Opens record `rec` (`stored`: its JetStream stream sequence, if it was stored) into
    /// `out`, or says what the caller must do first. The frame is sealed bound to the
    /// record's subject sequence.
    pub fn handle_frame(
        &mut self,
        now: Instant,
        rec: &FrameRecord,
        stored: Option<u64>,
        out: &mut Output,
    ) -> Result<Verdict, ModuleError> {
        let (meta, run) = (rec.meta(), rec.device_run());
        if let Admit::Refused(why) = self.guard.check(run, stored) {
            self.dropped += 1;
            let tell = !self.app
                && why == Refusal::EarlierRun
                && self
                    .told
                    .is_none_or(|t| now.saturating_duration_since(t) >= RUN_NOTICE_SPACING)
                && {
                    // Only a genuine frame of an earlier run (it opens under that run's key)
                    // tells the app sides to join again: anyone may publish a header.
                    let mut probe = H::under(run_key(&self.keys.key, run));
                    let frame = Frame::from_bytes(meta, rec.payload.clone());
                    probe.open(now, frame, rec.wseq, &mut Output::new())? == Outcome::Opened
                };
            if tell {
                self.told = Some(now);
            }
            if let Some(suppressed) = self.replays.admit(now) {
                tracing::warn!(
                    suppressed,
                    stream = meta.stream,
                    seq = meta.seq,
                    run = format_args!("{:016x}", run.id),
                    current = format_args!("{:016x}", self.guard.current().id),
                    stored,
                    "dropped {why}"
                );
            }
            return Ok(Verdict::Refused { why, tell });
        }
        if let Some(v) = self.try_all(now, rec, stored, out)? {
            return Ok(v);
        }
        let paused = self
            .fruitless
            .is_some_and(|t| now.saturating_duration_since(t) < FRUITLESS_PAUSE);
        if self.app && !paused {
            self.parked = Some(Parked {
                rec: rec.clone(),
                stored,
                changed: false,
                aside: None,
            });
            return Ok(Verdict::AskKey);
        }
        self.set_aside(now, rec, stored);
        self.unopened(now, &meta);
        Ok(Verdict::Forged)
    }

    /// The record under the key as it stands, then under the keys before the last two
    /// rotations: `None` when none opens it.
    fn try_all(
        &mut self,
        now: Instant,
        rec: &FrameRecord,
        stored: Option<u64>,
        out: &mut Output,
    ) -> Result<Option<Verdict>, ModuleError> {
        if let Some(v) = self.try_open(now, rec, out)? {
            return Ok(Some(v));
        }
        let earlier = [
            self.keys.previous.map(|k| (k, self.keys.since)),
            self.keys.older,
        ]
        .into_iter()
        .chain(self.keys.retired);
        for (i, (key, since)) in earlier.enumerate().filter_map(|(i, k)| k.map(|k| (i, k))) {
            let (current, run) = (self.guard.current(), rec.device_run());
            let mut old = Output::new();
            let frame = Frame::from_bytes(rec.meta(), rec.payload.clone());
            let halves = match i {
                0 => &mut self.previous,
                1 => &mut self.older,
                i => &mut self.retired[i - 2],
            };
            let outcome = if since != SINCE_PENDING && stored.is_none_or(|s| s > since) {
                // Dropped whether it opens or not (stored after the rotation, or not stored):
                // opened by a half of its own, so that it spends nothing of the kept half's
                // replay window. A copy stored after the rotation can come before the genuine
                // frame stored before it (a new device process's consumer delivers again from
                // its ack floor), and the genuine one must still open (found by
                // `testkit/tests/nats_keys.rs`: an adversary's copy of an app frame, read
                // first, made the genuine one a replay, and it was lost).
                H::under(run_key(&key, run)).open(now, frame, rec.wseq, &mut old)?
            } else {
                open_in(halves, key, run, current, now, frame, rec.wseq, &mut old)?
            };
            if outcome == Outcome::Replayed {
                self.replayed += 1;
                return Ok(Some(Verdict::Replayed));
            }
            if outcome == Outcome::Opened {
                let held = Held {
                    under: key,
                    stored,
                    seq: rec.seq,
                    frames: old.take_frames(),
                };
                if since == SINCE_PENDING {
                    self.held = Some(held);
                    return Ok(Some(Verdict::Held));
                }
                return Ok(Some(if self.decide(held, since, out) {
                    Verdict::Opened { newer_run: false }
                } else {
                    Verdict::Dropped
                }));
            }
        }
        Ok(None)
    }

    /// The lowest stream sequence of the stored records kept aside (their messages are
    /// acknowledged: a process that takes the stream up after this one must have them
    /// delivered again, see [`super::intake::Kept::again_from`]).
    ///
    /// Only records set aside within [`ASIDE_RECENT`] count: a key that comes comes within
    /// seconds of its frames, and garbage set aside (anyone may publish) must not pin the next
    /// process's start far back for good.
    pub fn aside_from(&self, now: Instant) -> Option<u64> {
        self.unopened
            .iter()
            .filter(|(_, _, at)| now.saturating_duration_since(*at) < ASIDE_RECENT)
            .filter_map(|(_, s, _)| *s)
            .min()
    }

    /// Whether to tell the app sides to join again (at most every [`RUN_NOTICE_SPACING`],
    /// shared with [`Verdict::Refused`]'s `tell`) because a device side dropped a genuine
    /// frame under the key before a rotation, stored after it: an app side that missed the
    /// rotation's notice (core NATS may lose it) still seals under the old key, and without
    /// a word its frames were dropped for good once it had nothing to receive that would
    /// make it ask (found by `testkit/tests/nats_keys.rs` with notices lost). The revoked
    /// side's frames tell too; its join is refused.
    pub fn take_tell(&mut self, now: Instant) -> bool {
        if !std::mem::take(&mut self.stale_key)
            || self
                .told
                .is_some_and(|t| now.saturating_duration_since(t) < RUN_NOTICE_SPACING)
        {
            return false;
        }
        self.told = Some(now);
        true
    }

    /// Once the pause after a fruitless ask is over, with stored records set aside within
    /// [`ASIDE_RECENT`]: the first of them, parked to ask for the key with (the caller treats
    /// it as [`Verdict::AskKey`] and goes on with [`Opener::retry`]).
    ///
    /// Without it a side that missed a rotation's notice (core NATS may lose it) while it
    /// paused held the frames under the new key for good once no more came: the pause ended,
    /// but only a frame that does not open made it ask (found by `testkit/tests/nats_keys.rs`
    /// with notices lost). Garbage set aside (anyone may publish) makes it ask at most
    /// twice: a record counts only while it was set aside recently.
    pub fn ask_again(&mut self, now: Instant) -> Option<(FrameRecord, Option<u64>)> {
        let paused_at = self.fruitless?;
        if !self.app
            || self.parked.is_some()
            || now.saturating_duration_since(paused_at) < FRUITLESS_PAUSE
        {
            return None;
        }
        let recent = self
            .unopened
            .iter()
            .position(|(_, _, at)| now.saturating_duration_since(*at) < ASIDE_RECENT);
        let Some(i) = recent else {
            // The pause is over and nothing recent is aside: no pause any more (the receiver
            // calls this at every poll; without it, every poll scanned what is aside).
            self.fruitless = None;
            return None;
        };
        let (rec, stored, at) = self.unopened.remove(i)?;
        self.unopened_bytes -= rec.payload.len();
        self.parked = Some(Parked {
            rec: rec.clone(),
            stored,
            changed: false,
            aside: Some(at),
        });
        Some((rec, stored))
    }

    /// An app side's stored record that opens under no key while it does not ask (or asked
    /// for nothing): kept aside in case a new key comes soon ([`Opener::take_unopened`]).
    fn set_aside(&mut self, now: Instant, rec: &FrameRecord, stored: Option<u64>) {
        if !self.app || stored.is_none() {
            return;
        }
        self.unopened_bytes += rec.payload.len();
        self.unopened.push_back((rec.clone(), stored, now));
        while self.unopened_bytes > UNOPENED_BYTES {
            match self.unopened.pop_front() {
                Some((r, _, _)) => self.unopened_bytes -= r.payload.len(),
                None => break,
            }
        }
    }

    /// After [`Verdict::AskKey`] (and whatever keys the ask brought, handed to
    /// [`Opener::handle_keys`]): the parked frame tried once more.
    pub fn retry(&mut self, now: Instant, out: &mut Output) -> Result<Verdict, ModuleError> {
        let Some(p) = self.parked.take() else {
            return Ok(Verdict::Forged);
        };
        if !p.changed {
            // Asking brought nothing (or no answer yet): not asked again for a while, and the
            // record is kept aside for the next key, as the ones that follow.
            self.fruitless = Some(now);
            self.set_aside(p.aside.unwrap_or(now), &p.rec, p.stored);
            self.unopened(now, &p.rec.meta());
            return Ok(Verdict::Forged);
        }
        if let Some(v) = self.try_all(now, &p.rec, p.stored, out)? {
            return Ok(v);
        }
        self.set_aside(p.aside.unwrap_or(now), &p.rec, p.stored);
        self.unopened(now, &p.rec.meta());
        Ok(Verdict::Forged)
    }

    /// After [`Verdict::Held`]: once the keys say where the rotation began, the held frame's
    /// frames go into `out` (stored at or before it) or are dropped; `false` while it is
    /// still pending.
    pub fn release(&mut self, out: &mut Output) -> bool {
        if self.keys.since == SINCE_PENDING {
            return self.held.is_none();
        }
        if let Some(h) = self.held.take() {
            // Another rotation may have come meanwhile (seen as one change of keys): the key
            // it opened under is then the older one, with where its rotation began.
            match self.keys.retired_after(&h.under) {
                0 => {
                    // Not among the keys any more: where its rotation began is not known;
                    // it may be the side that rotation revoked.
                    self.after_rotation += 1;
                    self.dropped += 1;
                }
                since => {
                    self.decide(h, since, out);
                }
            }
        }
        true
    }

    /// A frame under a key before a rotation: taken if stored at or before that rotation
    /// began (`since`). Whether it was.
    fn decide(&mut self, h: Held, since: u64, out: &mut Output) -> bool {
        if h.stored.is_some_and(|s| s <= since) {
            for f in h.frames {
                out.push(f);
            }
            true
        } else {
            self.after_rotation += 1;
            self.dropped += 1;
            self.stale_key |= !self.app;
            tracing::trace!(
                seq = h.seq,
                stored = h.stored,
                since,
                "a frame under the group key before a rotation, stored after it: dropped"
            );
            false
        }
    }

    /// Tries `run`'s half under the key as it stands: `Some` verdict when it opened.
    fn try_open(
        &mut self,
        now: Instant,
        rec: &FrameRecord,
        out: &mut Output,
    ) -> Result<Option<Verdict>, ModuleError> {
        let (current, run) = (self.guard.current(), rec.device_run());
        let frame = Frame::from_bytes(rec.meta(), rec.payload.clone());
        let (halves, key) = (&mut self.open, self.keys.key);
        match open_in(halves, key, run, current, now, frame, rec.wseq, out)? {
            Outcome::Rejected => return Ok(None),
            Outcome::Replayed => {
                self.replayed += 1;
                return Ok(Some(Verdict::Replayed));
            }
            Outcome::Opened => {}
        }
        let newer_run = self.guard.opened(run);
        Ok(Some(Verdict::Opened { newer_run }))
    }

    /// A frame that opened under no key: dropped, said at most once a second.
    fn unopened(&mut self, now: Instant, meta: &Meta) {
        self.dropped += 1;
        self.forged += 1;
        if let Some(suppressed) = self.noisy.admit(now) {
            tracing::warn!(
                suppressed,
                stream = meta.stream,
                seq = meta.seq,
                "dropped a frame that opens under no group key this side has (forged, or sealed under a key older than the last rotation)"
            );
        }
    }
}

/// Opens a frame of `run` with its half under `key` in `halves`, made on first use and kept
/// only if the frame opened (forged runs make no halves); beyond [`RUNS_KEPT`] the oldest
/// half of a run other than `current` goes. What the half made of it (bound to `wseq`).
#[allow(clippy::too_many_arguments)]
fn open_in<H: RunHalf>(
    halves: &mut Vec<(Run, H)>,
    key: [u8; 32],
    run: Run,
    current: Run,
    now: Instant,
    frame: Frame,
    wseq: u64,
    out: &mut Output,
) -> Result<Outcome, ModuleError> {
    let made = !halves.iter().any(|(r, _)| *r == run);
    if made {
        halves.push((run, H::under(run_key(&key, run))));
    }
    let Some(i) = halves.iter().position(|(r, _)| *r == run) else {
        return Ok(Outcome::Rejected);
    };
    let opened = halves[i].1.open(now, frame, wseq, out)?;
    if made && opened != Outcome::Opened {
        halves.remove(i);
    } else if made && halves.len() > RUNS_KEPT {
        if let Some(j) = halves.iter().position(|(r, _)| *r != current && *r != run) {
            halves.remove(j);
        }
    }
    Ok(opened)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    use crate::nats::toy::Toy;

    const RUN: Run = Run { id: 10, began: 5 };

    fn keys(k: u8, run: Run) -> GroupKey {
        GroupKey::first([k; 32], run)
    }

    /// The record of frame `seq` of `run`, at subject sequence `wseq`, sealing `payload`.
    fn record(seq: u64, run: Run, wseq: u64, payload: Bytes) -> FrameRecord {
        FrameRecord {
            stream: 3,
            flags: 0,
            run: run.id,
            began: run.began,
            seq,
            timestamp_ns: 0,
            wseq,
            payload,
        }
    }

    /// A payload that opens under group key `k` in `run`, sealed at subject sequence `wseq`.
    fn sealed(k: u8, run: Run, wseq: u64) -> Bytes {
        let mut p = run_key(&[k; 32], run)[..8].to_vec();
        p.extend_from_slice(&wseq.to_be_bytes());
        p.extend_from_slice(b"data");
        Bytes::from(p)
    }

    fn feed(
        o: &mut Opener<Toy>,
        now: Instant,
        seq: u64,
        k: u8,
        run: Run,
        stored: Option<u64>,
    ) -> (Verdict, usize) {
        let mut out = Output::new();
        let rec = record(seq, run, seq, sealed(k, run, seq));
        let v = o.handle_frame(now, &rec, stored, &mut out).unwrap();
        let frames = out.take_frames();
        assert!(frames.iter().all(|f| f.payload() == b"data"));
        (v, frames.len())
    }

    #[test]
    fn a_frame_whose_record_names_another_subject_sequence_is_forged() {
        let now = Instant::now();
        let mut o = Opener::<Toy>::app(keys(1, RUN));
        let mut out = Output::new();
        let moved = record(4, RUN, 2, sealed(1, RUN, 4));
        // It opens under no key: an app side asks whether the key rotated; it did not.
        let v = o.handle_frame(now, &moved, Some(9), &mut out).unwrap();
        assert_eq!(v, Verdict::AskKey);
        let v = o.retry(now, &mut out).unwrap();
        assert_eq!(v, Verdict::Forged);
        assert!(v.holds_no_place());
        assert!(out.take_frames().is_empty());
        assert_eq!((o.forged, o.dropped), (1, 1));
        assert_eq!(
            feed(&mut o, now, 4, 1, RUN, Some(10)),
            (Verdict::Opened { newer_run: false }, 1)
        );
    }

    #[test]
    fn an_app_side_opens_its_run_follows_a_newer_one_and_refuses_a_replayed_earlier_one() {
        let now = Instant::now();
        let mut o = Opener::<Toy>::app(keys(1, RUN));
        assert_eq!(
            feed(&mut o, now, 0, 1, RUN, Some(6)),
            (Verdict::Opened { newer_run: false }, 1)
        );
        let next = Run { id: 11, began: 20 };
        assert_eq!(
            feed(&mut o, now, 0, 1, next, Some(21)),
            (Verdict::Opened { newer_run: true }, 1)
        );
        assert_eq!(o.run(), next);
        // RUN's frame stored at 15, before `next` began (20): it waited for this side.
        assert_eq!(feed(&mut o, now, 1, 1, RUN, Some(15)).1, 1);
        // Stored after `next` began: a replay.
        assert_eq!(
            feed(&mut o, now, 2, 1, RUN, Some(25)),
            (
                Verdict::Refused {
                    why: Refusal::EarlierRun,
                    tell: false
                },
                0
            )
        );
        // Over core NATS (not stored): a replay too.
        assert_eq!(feed(&mut o, now, 3, 1, RUN, None).1, 0);
        assert_eq!(o.dropped, 2);
    }

    #[test]
    fn a_frame_under_an_unknown_key_asks_once_then_waits_out_the_pause() {
        let t0 = Instant::now();
        let mut o = Opener::<Toy>::app(keys(1, RUN));
        assert_eq!(feed(&mut o, t0, 0, 9, RUN, None).0, Verdict::AskKey);
        // Asking brought nothing new: dropped, and the next ones are dropped without asking.
        assert_eq!(o.retry(t0, &mut Output::new()).unwrap(), Verdict::Forged);
        assert_eq!(
            feed(&mut o, t0 + Duration::from_secs(1), 1, 9, RUN, None).0,
            Verdict::Forged
        );
        assert_eq!(o.dropped, 2);
        assert_eq!(
            feed(&mut o, t0 + FRUITLESS_PAUSE, 2, 9, RUN, None).0,
            Verdict::AskKey
        );
    }

    #[test]
    fn a_frame_under_a_rotated_key_opens_once_the_ask_brings_the_key() {
        let now = Instant::now();
        let mut o = Opener::<Toy>::app(keys(1, RUN));
        assert_eq!(feed(&mut o, now, 0, 2, RUN, Some(7)).0, Verdict::AskKey);
        assert!(o.handle_keys(keys(2, RUN)));
        let mut out = Output::new();
        assert_eq!(
            o.retry(now, &mut out).unwrap(),
            Verdict::Opened { newer_run: false }
        );
        assert_eq!(out.take_frames().len(), 1);
        // The key it held is the previous one now: stored after the rotation (its `since`
        // is 0 here), a frame under it is dropped (the revoked side holds it too).
        assert_eq!(feed(&mut o, now, 1, 1, RUN, Some(8)), (Verdict::Dropped, 0));
        assert_eq!(o.after_rotation, 1);
    }

    #[test]
    fn the_keys_name_the_runs_before_and_where_the_first_one_missed_began() {
        let r = |id, began| Run { id, began };
        let k = keys(1, r(1, 0)).next_run(r(2, 100)).next_run(r(3, 200));
        assert_eq!(k.run, r(3, 200));
        assert_eq!(k.earlier[..3], [Some(r(2, 100)), Some(r(1, 0)), None]);
        // A sender of run 1 missed runs 2 and 3: from run 2's start.
        assert_eq!(k.began_after(1), 100);
        assert_eq!(k.began_after(2), 200);
        assert_eq!(k.began_after(3), u64::MAX);
        // Only EARLIER_RUNS are named: a sender older than all of them gets the oldest's.
        let mut k = k;
        for id in 4..=(EARLIER_RUNS as u64 + 2) {
            k = k.next_run(r(id, id * 100 - 100));
        }
        assert_eq!(
            k.earlier[0],
            Some(r(EARLIER_RUNS as u64 + 1, EARLIER_RUNS as u64 * 100))
        );
        assert_eq!(k.earlier[EARLIER_RUNS - 1], Some(r(2, 100)));
        assert_eq!(k.began_after(1), 100);
        assert_eq!(k.began_after(0), 100);
        assert_eq!(k.began_after(3), 300);
        let k = k.next_run(r(99, 9900));
        assert_eq!(
            k.began_after(1),
            200,
            "run 2 is no longer named: its start is lost"
        );
        // A rotation keeps them.
        let rot = rotation(k, &["x".into()], |_| false, [9; 32]).unwrap();
        assert_eq!(rot.keys.earlier, k.earlier);
        // What a sender seals again: nothing under the same keys; after a restart from the
        // first run it missed; after a rotation from where it began; both: the earlier.
        let first = keys(1, r(1, 0));
        assert_eq!(k.resend_after(&k), None);
        assert_eq!(k.resend_after(&first), Some(200));
        let rotated = rot.keys.since_at(450);
        assert_eq!(rotated.resend_after(&k), Some(450));
        assert_eq!(rotated.resend_after(&first), Some(200));
        assert_eq!(rotated.resend_after(&keys(1, r(99, 9900))), Some(450));
        assert_eq!(
            rotated.resend_after(&keys(7, r(99, 9900))),
            Some(0),
            "key 7 is none of these keys': everything again"
        );
    }

    #[test]
    fn an_app_side_still_opens_device_frames_under_its_old_key_stored_before_the_rotation() {
        let now = Instant::now();
        let mut o = Opener::<Toy>::app(keys(1, RUN));
        let rotated = GroupKey {
            since: 20,
            ..keys(2, RUN)
        };
        assert!(o.handle_keys(rotated));
        assert_eq!(o.keys().previous, Some([1; 32]));
        // A second join brings the same key: the previous one stays.
        assert!(!o.handle_keys(rotated));
        assert_eq!(o.keys().previous, Some([1; 32]));
        assert_eq!(
            feed(&mut o, now, 0, 1, RUN, Some(19)).1,
            1,
            "stored before: taken"
        );
        assert_eq!(feed(&mut o, now, 1, 1, RUN, Some(21)).0, Verdict::Dropped);
        assert_eq!(feed(&mut o, now, 2, 2, RUN, Some(22)).1, 1);
    }

    #[test]
    fn a_device_rotation_takes_old_key_frames_stored_before_it_and_drops_later_ones() {
        let now = Instant::now();
        let holders = ["trusted".to_owned(), "revoked".to_owned()];
        let start = keys(1, RUN);
        assert_eq!(rotation(start, &holders, |_| true, [2; 32]), None);
        let r = rotation(start, &holders, |h| h == "trusted", [2; 32]).unwrap();
        assert_eq!(r.revoked, vec!["revoked".to_owned()]);
        assert_eq!(
            (r.keys.since, r.keys.previous),
            (SINCE_PENDING, Some([1; 32]))
        );
        let mut o = Opener::<Toy>::device(start);
        assert!(o.handle_keys(r.keys));
        // Under the new key: taken at once.
        assert_eq!(feed(&mut o, now, 0, 2, RUN, Some(40)).1, 1);
        // Under the old key while where the rotation began is unknown: held.
        assert_eq!(feed(&mut o, now, 1, 1, RUN, Some(9)), (Verdict::Held, 0));
        let mut out = Output::new();
        assert!(!o.release(&mut out));
        assert!(!o.handle_keys(r.keys.since_at(10)));
        assert!(o.release(&mut out));
        assert_eq!(
            out.take_frames().len(),
            1,
            "stored at 9, before the rotation at 10"
        );
        assert_eq!(feed(&mut o, now, 2, 1, RUN, Some(10)).1, 1);
        assert_eq!(
            feed(&mut o, now, 3, 1, RUN, Some(11)),
            (Verdict::Dropped, 0)
        );
        assert_eq!((o.after_rotation, o.dropped), (1, 1));
        // A device side never asks: garbage is dropped.
        assert_eq!(feed(&mut o, now, 4, 7, RUN, Some(12)).0, Verdict::Forged);
    }

    #[test]
    fn a_device_side_that_drops_old_key_frames_after_a_rotation_tells_app_sides_once_a_second() {
        let t0 = Instant::now();
        let r = rotation(keys(1, RUN), &["gone".to_owned()], |_| false, [2; 32]).unwrap();
        let mut o = Opener::<Toy>::device(keys(1, RUN));
        o.handle_keys(r.keys.since_at(10));
        // Nothing dropped yet: nobody to tell.
        assert!(!o.take_tell(t0));
        // Taken (stored before the rotation): no word either.
        assert_eq!(feed(&mut o, t0, 1, 1, RUN, Some(9)).1, 1);
        assert!(!o.take_tell(t0));
        // Stored after it: dropped, and the app sides are told (one that missed the notice
        // seals under the old key still), at most once a second.
        assert_eq!(feed(&mut o, t0, 2, 1, RUN, Some(11)), (Verdict::Dropped, 0));
        assert!(o.take_tell(t0));
        assert!(!o.take_tell(t0), "said once");
        let soon = t0 + Duration::from_millis(300);
        assert_eq!(
            feed(&mut o, soon, 3, 1, RUN, Some(12)),
            (Verdict::Dropped, 0)
        );
        assert!(!o.take_tell(soon), "not again within a second");
        let later = t0 + RUN_NOTICE_SPACING;
        assert_eq!(
            feed(&mut o, later, 4, 1, RUN, Some(13)),
            (Verdict::Dropped, 0)
        );
        assert!(o.take_tell(later));
        // An app side never tells.
        let mut a = Opener::<Toy>::app(keys(1, RUN));
        a.handle_keys(r.keys.since_at(10));
        assert_eq!(feed(&mut a, t0, 2, 1, RUN, Some(11)), (Verdict::Dropped, 0));
        assert!(!a.take_tell(t0));
    }

    #[test]
    fn frames_set_aside_in_a_pause_are_asked_for_again_once_it_is_over_and_garbage_not_for_long() {
        let t0 = Instant::now();
        let mut o = Opener::<Toy>::app(keys(1, RUN));
        let mut out = Output::new();
        // Garbage makes it ask; the ask brings nothing: the pause begins.
        let junk = record(0, RUN, 0, Bytes::from_static(b"junk junk junk!!"));
        assert_eq!(
            o.handle_frame(t0, &junk, Some(1), &mut out).unwrap(),
            Verdict::AskKey
        );
        assert_eq!(o.retry(t0, &mut out).unwrap(), Verdict::Forged);
        // The device rotates; this side misses the notice. A frame under the new key comes in
        // the pause: set aside without asking.
        let at = t0 + Duration::from_secs(1);
        let rec = record(1, RUN, 1, sealed(2, RUN, 1));
        assert_eq!(
            o.handle_frame(at, &rec, Some(2), &mut out).unwrap(),
            Verdict::Forged
        );
        assert_eq!(
            o.ask_again(t0 + Duration::from_secs(4)),
            None,
            "still paused"
        );
        // The pause is over: it asks with the first record set aside recently (the junk one
        // too was set aside, at t0; both are recent).
        let over = t0 + FRUITLESS_PAUSE;
        let (first, stored) = o.ask_again(over).expect("asks again");
        assert_eq!((first.seq, stored), (0, Some(1)));
        assert_eq!(o.ask_again(over), None, "one ask at a time");
        // Nothing new: the junk goes back aside (with its first time) and a pause begins.
        assert_eq!(o.retry(over, &mut out).unwrap(), Verdict::Forged);
        // The next pause is over: the junk is no longer recent, the frame is.
        let next = over + FRUITLESS_PAUSE + Duration::from_millis(1);
        assert!(next.saturating_duration_since(t0) >= ASIDE_RECENT);
        let (again, _) = o.ask_again(next).expect("asks for the recent frame");
        assert_eq!(again.seq, 1);
        // This time the join brings the rotated key: the frame opens.
        let k = rotation(keys(1, RUN), &["gone".to_owned()], |_| false, [2; 32]).unwrap();
        o.handle_keys(k.keys.since_at(0));
        assert_eq!(
            o.retry(next, &mut out).unwrap(),
            Verdict::Opened { newer_run: false }
        );
        assert_eq!(out.take_frames().len(), 1);
        // Only junk left aside, long ago: no more asking.
        assert_eq!(o.ask_again(next + FRUITLESS_PAUSE * 3), None);
    }

    #[test]
    fn keys_many_rotations_back_are_named_with_where_they_were_retired() {
        let holders = ["a".to_owned(), "b".to_owned()];
        let mut k = keys(1, RUN);
        // Nine rotations, each complete (rotation n retires key n at 10 n).
        for n in 1..=9u8 {
            k = rotation(k, &holders, |h| h != "a", [n + 1; 32])
                .unwrap()
                .keys
                .since_at(10 * u64::from(n));
        }
        assert_eq!(k.retired_after(&[10; 32]), u64::MAX);
        assert_eq!(k.retired_after(&[9; 32]), 90, "previous");
        assert_eq!(k.retired_after(&[8; 32]), 80, "older");
        // A sender that sealed under key 2 and missed seven rotations: only what was stored
        // after 20 goes again (it sent everything it kept, and the device took some twice).
        for n in 2..=7u8 {
            assert_eq!(k.retired_after(&[n; 32]), 10 * u64::from(n), "key {n}");
        }
        // Past the history: nothing of it is known to have opened.
        assert_eq!(k.retired_after(&[1; 32]), 0);
        // The tenth retires key 8 to the history; one on top of a rotation still reading
        // where it began keeps the history as it stands.
        let pending = rotation(k, &holders, |h| h != "a", [11; 32]).unwrap().keys;
        assert_eq!(pending.retired[0], Some(([8; 32], 80)));
        let again = rotation(pending, &holders, |h| h != "a", [12; 32])
            .unwrap()
            .keys;
        assert_eq!(again.retired, pending.retired);
    }

    #[test]
    fn two_rotations_seen_as_one_still_sort_frames_under_the_first_key_by_its_own_rotation() {
        let now = Instant::now();
        let holders = ["a".to_owned(), "b".to_owned(), "c".to_owned()];
        let start = keys(1, RUN);
        let first = rotation(start, &holders, |h| h != "a", [2; 32]).unwrap();
        // A second rotation only once the first is complete (where it began, 10, known).
        let done = first.keys.since_at(10);
        let second = rotation(done, &holders[1..], |h| h == "c", [3; 32]).unwrap();
        assert_eq!(second.keys.older, Some(([1; 32], 10)));
        assert_eq!(second.keys.retired_after(&[1; 32]), 10);
        assert_eq!(second.keys.retired_after(&[3; 32]), u64::MAX);
        assert_eq!(second.keys.retired_after(&[9; 32]), 0);
        // A rotation still reading where it began leaves no older key behind.
        let pending = rotation(first.keys, &holders[1..], |h| h == "c", [3; 32]).unwrap();
        assert_eq!(pending.keys.older, None);

        // The device's sink: a frame under the first key held during the first rotation,
        // and the keys it reads next are the second rotation's, complete.
        let mut o = Opener::<Toy>::device(start);
        o.handle_keys(first.keys);
        assert_eq!(feed(&mut o, now, 0, 1, RUN, Some(9)), (Verdict::Held, 0));
        o.handle_keys(second.keys.since_at(20));
        let mut out = Output::new();
        assert!(o.release(&mut out));
        assert_eq!(
            out.take_frames().len(),
            1,
            "stored at 9, before the first rotation at 10"
        );
        // Under the first key: by the first rotation (10); under the second: by 20.
        assert_eq!(feed(&mut o, now, 1, 1, RUN, Some(10)).1, 1);
        assert_eq!(
            feed(&mut o, now, 2, 1, RUN, Some(11)),
            (Verdict::Dropped, 0)
        );
        assert_eq!(feed(&mut o, now, 3, 2, RUN, Some(20)).1, 1);
        assert_eq!(
            feed(&mut o, now, 4, 2, RUN, Some(21)),
            (Verdict::Dropped, 0)
        );
        assert_eq!(feed(&mut o, now, 5, 3, RUN, Some(22)).1, 1);

        // An app side that missed the first rotation: the join hands it both earlier keys.
        let mut a = Opener::<Toy>::app(start);
        a.handle_keys(second.keys.since_at(20));
        assert_eq!(feed(&mut a, now, 0, 1, RUN, Some(10)).1, 1);
        assert_eq!(
            feed(&mut a, now, 1, 1, RUN, Some(11)),
            (Verdict::Dropped, 0)
        );
    }

    #[test]
    fn a_device_side_tells_app_sides_of_its_run_only_for_genuine_earlier_frames_once_a_second() {
        let t0 = Instant::now();
        let old = Run { id: 9, began: 1 };
        let mut o = Opener::<Toy>::device(keys(1, RUN));
        let mut out = Output::new();
        // A forged header naming the earlier run: refused, nobody told.
        let garbage = record(0, old, 0, Bytes::from_static(b"garbage!"));
        let v = o.handle_frame(t0, &garbage, Some(8), &mut out).unwrap();
        assert_eq!(
            v,
            Verdict::Refused {
                why: Refusal::EarlierRun,
                tell: false
            }
        );
        let refused = |tell| {
            (
                Verdict::Refused {
                    why: Refusal::EarlierRun,
                    tell,
                },
                0,
            )
        };
        assert_eq!(feed(&mut o, t0, 1, 1, old, Some(8)), refused(true));
        assert_eq!(
            feed(&mut o, t0 + Duration::from_millis(500), 2, 1, old, Some(8)),
            refused(false)
        );
        assert_eq!(
            feed(&mut o, t0 + RUN_NOTICE_SPACING, 3, 1, old, Some(8)),
            refused(true)
        );
        // A newer run than the device's own is refused too.
        let newer = Run { id: 11, began: 5 };
        assert_eq!(
            feed(&mut o, t0, 4, 1, newer, Some(8)).0,
            Verdict::Refused {
                why: Refusal::NewerThanDevice,
                tell: false
            }
        );
        assert_eq!(o.dropped, 5);
    }

    #[test]
    fn a_new_device_consumer_starts_where_the_oldest_run_named_began() {
        let first = GroupKey::first([1; 32], Run { id: 5, began: 40 });
        assert_eq!(first.oldest_began(), 40);
        let keys = first
            .next_run(Run { id: 6, began: 90 })
            .next_run(Run { id: 7, began: 120 });
        assert_eq!(keys.oldest_began(), 40);
        let mut far = keys;
        for i in 0..EARLIER_RUNS as u64 {
            far = far.next_run(Run {
                id: 8 + i,
                began: 200 + i,
            });
        }
        // Runs older than the keys name no longer count: their start neither.
        assert_eq!(
            far.oldest_began(),
            120,
            "run 7 is the oldest of the eight earlier runs named"
        );
    }
}

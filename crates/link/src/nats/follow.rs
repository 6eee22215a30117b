//! An app side's following of the device's group key (sans-IO): which rekey notices send it
//! joining again, how far apart its joins are, and what a join's answer changes.
//!
//! - The device signs a notice on `P.D.rekey` when it rotates the key or starts a new run,
//!   and again every [`NOTICE_EVERY`] ([`notice_body`], signed with its identity under
//!   [`notice_label`]): it names the keys as they stand by a one-way id ([`key_id`]), so an
//!   app side that holds them does not join, and one that missed a notice (core NATS may lose
//!   it) hears within seconds that it must. A notice counts only if it is signed by a device
//!   side in `known_peers`, for this driver, and newer than the last one taken — by run first
//!   (run ids only grow, even when the clock is set back), then by the device's clock — so a
//!   recorded one replayed costs nothing ([`Follower::handle_notice`]).
//! - A stream that meets a frame under no key it has asks too ([`Follower::handle_ask`]).
//! - Joins go at most every [`REJOIN_SPACING`] (after failed ones further apart, up to
//!   [`REJOIN_SPACING_MAX`]); everyone who asked before a join went gets its answer.
//! - A join's answer ([`Follower::handle_admission`]) brings the keys; it never takes the side
//!   back to an earlier device run (an answer from before a restart, delivered late), and a
//!   split slot other than the one this side reads ends the side: it lost its slot while it
//!   was silent, and reading the new one would share it with another side.
//!
//! - One question at a time goes to the device ([`Follower::poll_io`]): a join; when the server
//!   says no device side serves and a stream asked, the stream's run marks are listed and the
//!   newest read ([`marks_to_read`]), and the question ends settled or not
//!   ([`FollowEvent::Answered`]).
//!
//! The driver verifies nothing itself and sequences nothing: it does the I/O
//! [`Follower::poll_io`] asks for (join, list the marks, read one), hands each outcome back,
//! hands in the notices' bytes and a way to ask `known_peers`, and does what
//! [`Follower::poll_event`] says (new keys; the askers' answer). The simulations
//! (`testkit/tests/nats_ending.rs`, `nats_keys.rs`) drive the same calls over their broker.

use super::keys::GroupKey;
use super::runs::{run_key, Run};
use super::subjects::Subjects;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Joins for a new group key come at least this far apart.
pub const REJOIN_SPACING: Duration = Duration::from_millis(250);

/// The longest spacing after joins that failed one after another (it doubles from
/// [`REJOIN_SPACING`]): a device side that is away is not asked four times a second.
pub const REJOIN_SPACING_MAX: Duration = Duration::from_secs(5);

/// How often a device side repeats its rekey notice: an app side that missed one learns
/// within about this long that it must join again (what it sealed meanwhile under a key the
/// device rotated goes again under the new one: [`super::outbox::KEPT_WINDOW`]).
pub const NOTICE_EVERY: Duration = Duration::from_secs(2);

/// A short one-way id of the run key of `keys` (the group key for the run as it stands): a
/// rekey notice names it so that app sides holding it need not join. It tells nobody
/// anything of the key.
pub fn key_id(keys: &GroupKey) -> [u8; 8] {
    let k = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &run_key(&keys.key, keys.run));
    let tag = ring::hmac::sign(&k, b"ndd nats rekey notice key id v1");
    let mut id = [0u8; 8];
    id.copy_from_slice(&tag.as_ref()[..8]);
    id
}

/// What a rekey notice says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Notice {
    /// The device run's id.
    pub run: u64,
    /// The device side's wall clock, ns.
    pub clock: u64,
    /// The keys as they stand ([`key_id`]).
    pub key: [u8; 8],
}

/// What a rekey notice that counted asks of this side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heard {
    /// The device holds keys this side does not: a join is due.
    Join,
    /// It names the keys this side holds: nothing to do.
    Current,
}

/// What a rekey notice's signature covers besides its body: the kind of note and the driver's
/// subjects (a notice for one driver is no use for another).
pub fn notice_label(subjects: &Subjects) -> Vec<u8> {
    format!("ndd nats rekey v1 {}", subjects.rekey()).into_bytes()
}

/// What a device run's mark in the JetStream stream is signed under
/// ([`super::subjects::Subjects::run_mark`]): a label of its own, so that a mark is never
/// taken for a rekey notice (a mark names a run that may never serve: one whose process died
/// before it began, or lost the driver to another).
pub fn mark_label(subjects: &Subjects) -> Vec<u8> {
    format!("ndd nats run mark v1 {}", subjects.run_marks()).into_bytes()
}

/// Run marks an app side checks at most when it confirms the device's run.
pub const MARKS_READ: usize = 16;

/// Run-mark subjects an app side lists at most (a device side purges its earlier runs' marks:
/// more is a flood, or a device user refused the purge).
pub const MARK_SUBJECTS: usize = 4096;

/// Which run marks to check ([`marks_to_read`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MarkPlan {
    /// The runs whose marks to read and check ([`Follower::handle_mark`]), newest first.
    pub read: Vec<u64>,
    /// Newer runs' subjects left unchecked: when none of those read proves a newer run, the
    /// question is not settled (anyone who may publish can add subjects; a flood costs a
    /// confirmation its wait, never the last frames).
    pub unchecked: usize,
}

/// Of the runs the stream's mark subjects name (`runs`), those newer than this side's (`mine`)
/// to check, the newest [`MARKS_READ`] first.
pub fn marks_to_read(mine: u64, runs: impl IntoIterator<Item = u64>) -> MarkPlan {
    let mut newer: Vec<u64> = runs.into_iter().filter(|&r| r > mine).collect();
    newer.sort_unstable_by(|a, b| b.cmp(a));
    newer.dedup();
    let unchecked = newer.len().saturating_sub(MARKS_READ);
    newer.truncate(MARKS_READ);
    MarkPlan {
        read: newer,
        unchecked,
    }
}

/// A rekey notice's body: `rekey`, the device run's id, the device side's wall clock in ns
/// and the id of its keys ([`key_id`]).
pub fn notice_body(n: &Notice) -> Vec<u8> {
    let mut b = b"rekey".to_vec();
    b.extend_from_slice(&n.run.to_be_bytes());
    b.extend_from_slice(&n.clock.to_be_bytes());
    b.extend_from_slice(&n.key);
    b
}

/// A rekey notice's body read; `None` if it is not one.
pub fn parse_notice_body(body: &[u8]) -> Option<Notice> {
    let t = <[u8; 24]>::try_from(body.strip_prefix(b"rekey")?).ok()?;
    let n = |b: &[u8]| u64::from_be_bytes(b.try_into().unwrap_or_default());
    let mut key = [0u8; 8];
    key.copy_from_slice(&t[16..]);
    Some(Notice {
        run: n(&t[..8]),
        clock: n(&t[8..16]),
        key,
    })
}

/// Why a rekey notice was ignored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Ignored {
    /// Not a note signed under this driver's label.
    #[error("not a signed notice of this driver ({0})")]
    NotSigned(String),
    /// Signed by someone this side does not trust.
    #[error("signed by {0}, which is not in known_peers")]
    Untrusted(String),
    /// Signed, but its body is not a rekey notice.
    #[error("its body is not a rekey notice")]
    NotANotice,
    /// Not newer than the last one taken.
    #[error("not newer than the last one (a replay)")]
    Replayed,
    /// A run mark whose signed run is not the one its subject names.
    #[error("its signed run is not the one its subject names")]
    OtherRun,
}

/// A join's answer, as it changed this side's keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Followed {
    /// The keys now.
    pub keys: GroupKey,
    /// The group key is a new one (the device rotated it).
    pub rotated: bool,
    /// The device run is a newer one (the device restarted).
    pub restarted: bool,
}

/// The device handed this side another split slot than the one it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the device side gave this side's split slot ({had:?}) to another app side while this one was silent and now hands it slot {now:?}; start this side again")]
pub struct SlotLost {
    /// The slot this side reads.
    pub had: Option<u16>,
    /// The one the answer names.
    pub now: Option<u16>,
}

/// The I/O a [`Follower`] asks its driver for, one at a time ([`Follower::poll_io`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FollowIo {
    /// Join again (ask the device side for its keys, within the join's try): the outcome to
    /// [`Follower::handle_join`].
    Join,
    /// List the runs the JetStream stream's run-mark subjects name (at most
    /// [`MARK_SUBJECTS`] subjects): to [`Follower::handle_listed`].
    ListMarks,
    /// Read the last message on this run's mark subject (`Subjects::run_mark`): to
    /// [`Follower::handle_mark_read`].
    ReadMark(u64),
}

/// How a join went, as the driver saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Joined {
    /// The device side admitted this side: its keys and the split slot it names.
    Admitted {
        /// The keys as the device holds them.
        keys: Box<GroupKey>,
        /// The split slot the answer names.
        slot: Option<u16>,
    },
    /// The device side refused this side (it is no longer trusted there): final.
    Refused(String),
    /// Only a device side this side does not trust answered within the try: final.
    Untrusted(String),
    /// No device side was subscribed when the question came (the server said so at once).
    NoDeviceServing,
    /// No answer within the try, or the server failed.
    Failed,
}

/// What a [`Follower`] tells its driver ([`Follower::poll_event`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FollowEvent {
    /// A join's answer: the keys now (to hand to the streams when they changed).
    Followed(Box<Followed>),
    /// The question is through; those who asked before it went get this answer. `settled`:
    /// the device answered, or no device side serves while nothing names a newer run than this
    /// side's (a reliable stream's END is confirmed); not settled, they ask again.
    Answered {
        /// Whether the question was settled.
        settled: bool,
    },
    /// No device side serves, and a run mark it signed names a newer run than the one this
    /// side seals for (said once per side): an ending stream waits for a device side.
    Behind {
        /// The newest run marked.
        run: u64,
    },
}

/// Why a [`Follower`] ends its side.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FollowEnd {
    /// The device side refused this side's join.
    #[error("the device side changed its group key and no longer admits this side: {0}")]
    Refused(String),
    /// Only a device side this side does not trust answers.
    #[error("this side no longer trusts the device side that answers: {0}")]
    Untrusted(String),
    /// The answer named another split slot.
    #[error(transparent)]
    SlotLost(#[from] SlotLost),
}

/// One app side's following of the group key.
#[derive(Debug)]
pub struct Follower {
    label: Vec<u8>,
    /// What run marks are signed under ([`mark_label`]).
    marks: Vec<u8>,
    keys: GroupKey,
    slot: Option<u16>,
    /// The newest notice taken: (run, device clock).
    newest: Option<(u64, u64)>,
    /// The newest run a mark in the stream named ([`Follower::handle_mark`]).
    marked: Option<u64>,
    /// The marks read after "no device side serving" leave the question open: more newer
    /// subjects than were read, too many to list, or one that could not be read
    /// ([`Follower::no_responders`]).
    unsure: bool,
    /// A join is due (a notice or an ask came since the last one went).
    due: bool,
    /// When the last join went.
    last: Option<Instant>,
    /// The spacing before the next join: doubles while joins fail.
    spacing: Duration,
    /// A stream asked since the last question went.
    asked: bool,
    /// A question is under way, and whether a stream had asked before it went.
    question: Option<bool>,
    /// Its next I/O, not yet handed to the driver.
    pending: Option<FollowIo>,
    /// The I/O handed out whose outcome is awaited.
    awaited: Option<FollowIo>,
    /// The marks left to read.
    to_read: VecDeque<u64>,
    /// Said [`FollowEvent::Behind`].
    said_behind: bool,
    events: VecDeque<FollowEvent>,
}

impl Follower {
    /// Follows the driver of `subjects` from a first join's keys and slot.
    pub fn new(subjects: &Subjects, keys: GroupKey, slot: Option<u16>) -> Follower {
        Follower {
            label: notice_label(subjects),
            marks: mark_label(subjects),
            keys,
            slot,
            newest: None,
            marked: None,
            unsure: false,
            due: false,
            last: None,
            spacing: REJOIN_SPACING,
            asked: false,
            question: None,
            pending: None,
            awaited: None,
            to_read: VecDeque::new(),
            said_behind: false,
            events: VecDeque::new(),
        }
    }

    /// The next I/O to do at `now`, if any: a question's next step, or a new question when a
    /// join is due and its spacing passed ([`Follower::poll_timeout`] says when).
    pub fn poll_io(&mut self, now: Instant) -> Option<FollowIo> {
        if let Some(io) = self.pending.take() {
            self.awaited = Some(io);
            return Some(io);
        }
        if self.question.is_some() || self.poll_join(now).is_none_or(|at| at > now) {
            return None;
        }
        self.joined(now);
        self.question = Some(std::mem::take(&mut self.asked));
        self.awaited = Some(FollowIo::Join);
        Some(FollowIo::Join)
    }

    /// When the next question may go (nothing while one is under way).
    pub fn poll_timeout(&self, now: Instant) -> Option<Instant> {
        if self.question.is_some() || self.pending.is_some() {
            return None;
        }
        self.poll_join(now)
    }

    /// Nothing due and no question under way.
    pub fn is_idle(&self) -> bool {
        !self.due && self.question.is_none()
    }

    /// What the driver must do next: new keys, the askers' answer.
    pub fn poll_event(&mut self) -> Option<FollowEvent> {
        self.events.pop_front()
    }

    /// Whether `io`'s outcome is the one awaited (anything else is ignored).
    fn take_awaited(&mut self, io: impl Fn(FollowIo) -> bool) -> bool {
        if self.awaited.is_some_and(io) {
            self.awaited = None;
            return true;
        }
        false
    }

    /// The question is through.
    fn finish(&mut self, settled: bool) {
        self.question = None;
        self.pending = None;
        self.to_read.clear();
        self.events.push_back(FollowEvent::Answered { settled });
    }

    /// How the join [`FollowIo::Join`] asked for went. A refusal, or an answer only from a
    /// device side this side does not trust, or another split slot, ends the side.
    pub fn handle_join(&mut self, joined: Joined) -> Result<(), FollowEnd> {
        if !self.take_awaited(|io| io == FollowIo::Join) {
            return Ok(());
        }
        let asked = self.question.unwrap_or(false);
        match joined {
            Joined::Admitted { keys, slot } => {
                let f = self.handle_admission(*keys, slot).inspect_err(|_| {
                    self.question = None;
                })?;
                self.events.push_back(FollowEvent::Followed(Box::new(f)));
                self.finish(true);
            }
            Joined::Refused(why) => {
                self.question = None;
                return Err(FollowEnd::Refused(why));
            }
            Joined::Untrusted(why) => {
                self.question = None;
                return Err(FollowEnd::Untrusted(why));
            }
            // Asked again, further apart each time: a notice's join that failed is not lost
            // (a side with idle sinks would go on sealing under the old key).
            Joined::Failed => {
                self.join_failed();
                self.finish(false);
            }
            // "No responders" settles a question only while no notice named a newer run than
            // this side's, nor a run's mark in the stream (read only when a stream asked).
            Joined::NoDeviceServing => {
                self.join_failed();
                if asked {
                    self.pending = Some(FollowIo::ListMarks);
                } else {
                    let settled = !self.behind();
                    self.finish(settled);
                }
            }
        }
        Ok(())
    }

    /// The runs the stream's mark subjects name, as [`FollowIo::ListMarks`] asked (`None`:
    /// more than [`MARK_SUBJECTS`], or they could not be listed).
    pub fn handle_listed(&mut self, listed: Option<Vec<u64>>) {
        if !self.take_awaited(|io| io == FollowIo::ListMarks) {
            return;
        }
        self.to_read = self.no_responders(listed).into();
        self.next_mark();
    }

    /// The last message on run `run`'s mark subject, as [`FollowIo::ReadMark`] asked (`None`:
    /// it could not be read); `trusted` says whether a fingerprint is in `known_peers`. What
    /// the mark's check said, if it was read.
    pub fn handle_mark_read(
        &mut self,
        run: u64,
        note: Option<&[u8]>,
        trusted: impl Fn(&str) -> bool,
    ) -> Option<Result<u64, Ignored>> {
        if !self.take_awaited(|io| io == FollowIo::ReadMark(run)) {
            return None;
        }
        let Some(note) = note else {
            self.mark_unread();
            self.finish(false);
            return None;
        };
        let taken = self.handle_mark(note, run, trusted);
        if self.behind() {
            if !std::mem::replace(&mut self.said_behind, true) {
                let run = self.marked.unwrap_or(run);
                self.events.push_back(FollowEvent::Behind { run });
            }
            self.finish(false);
        } else {
            self.next_mark();
        }
        Some(taken)
    }

    /// The next mark to read, or the question's end.
    fn next_mark(&mut self) {
        match self.to_read.pop_front() {
            Some(run) if !self.behind() => self.pending = Some(FollowIo::ReadMark(run)),
            _ => {
                let settled = self.settled();
                self.finish(settled);
            }
        }
    }

    /// The keys as they stand.
    pub fn keys(&self) -> GroupKey {
        self.keys
    }

    /// A message on `P.D.rekey`; `trusted` says whether a fingerprint is in `known_peers`.
    /// Taken, a join is due unless it names the keys this side holds.
    pub fn handle_notice(
        &mut self,
        note: &[u8],
        trusted: impl Fn(&str) -> bool,
    ) -> Result<Heard, Ignored> {
        let (body, fp) = crate::seal::open_note(note, &self.label)
            .map_err(|e| Ignored::NotSigned(e.to_string()))?;
        if !trusted(&fp) {
            return Err(Ignored::Untrusted(fp));
        }
        let n = parse_notice_body(body).ok_or(Ignored::NotANotice)?;
        let at = (n.run, n.clock);
        if self.newest.is_some_and(|newest| at <= newest) {
            return Err(Ignored::Replayed);
        }
        self.newest = Some(at);
        if n.run == self.keys.run.id && n.key == key_id(&self.keys) {
            return Ok(Heard::Current);
        }
        self.due = true;
        Ok(Heard::Join)
    }

    /// Whether a notice that counted named a newer device run than the keys this side holds
    /// (no join has brought its keys yet). A join that finds no device side serving (between
    /// two of its processes) then settles nothing: the run this side seals for is not the
    /// device's newest, and an app side's reliable stream that is ending must learn it before
    /// it is done (found by `testkit/tests/nats_ending.rs`: a device that restarted twice
    /// within half a second, its second run's joins unanswered, then away when the stream's
    /// END was confirmed; the app side took "no responders" for "the same run" and its last
    /// frames, refused by the newer runs, were never sealed again).
    pub fn behind(&self) -> bool {
        let run = self.keys.run.id;
        self.newest.is_some_and(|(r, _)| r > run) || self.marked.is_some_and(|m| m > run)
    }

    /// A device run's mark read from the JetStream stream (`note`, stored on the subject of
    /// run `subject_run`), signed under [`mark_label`] by a side `trusted` says is
    /// in `known_peers`: its run counts for [`Follower::behind`] (it never steers the notices'
    /// order, nor sends a join: the run it names may never serve). Its run: the one signed,
    /// which must be the subject's (a subject names anything anyone may publish).
    pub fn handle_mark(
        &mut self,
        note: &[u8],
        subject_run: u64,
        trusted: impl Fn(&str) -> bool,
    ) -> Result<u64, Ignored> {
        let (body, fp) = crate::seal::open_note(note, &self.marks)
            .map_err(|e| Ignored::NotSigned(e.to_string()))?;
        if !trusted(&fp) {
            return Err(Ignored::Untrusted(fp));
        }
        let n = parse_notice_body(body).ok_or(Ignored::NotANotice)?;
        if n.run != subject_run {
            return Err(Ignored::OtherRun);
        }
        self.marked = Some(self.marked.map_or(n.run, |m| m.max(n.run)));
        Ok(n.run)
    }

    /// A join asked for a stream found no device side serving (the server said so at once:
    /// between two device processes). Whether that settles the question (the run this side
    /// seals for is the device's newest) the stream's run marks decide: `listed` are the runs
    /// its mark subjects name (`None`: more than [`MARK_SUBJECTS`] of them, or they could not
    /// be listed). Returns the runs whose marks to read, newest first ([`marks_to_read`]):
    /// each goes to [`Follower::handle_mark`] (or [`Follower::mark_unread`]) until the side
    /// is [`Follower::behind`]; then [`Follower::settled`] answers. Anyone who may publish can
    /// add subjects: when more newer ones are there than were read and none proved a newer
    /// run, nothing is settled (a flood costs a confirmation its wait, never the last frames).
    fn no_responders(&mut self, listed: Option<Vec<u64>>) -> Vec<u64> {
        match listed {
            Some(runs) if runs.len() <= MARK_SUBJECTS => {
                let plan = marks_to_read(self.keys.run.id, runs);
                self.unsure = plan.unchecked > 0;
                plan.read
            }
            _ => {
                self.unsure = true;
                Vec::new()
            }
        }
    }

    /// A mark [`Follower::no_responders`] named could not be read: nothing is settled.
    fn mark_unread(&mut self) {
        self.unsure = true;
    }

    /// Whether "no device side serving" settled the question, once the marks
    /// [`Follower::no_responders`] named were read: no notice nor mark named a newer run, and
    /// none was left unread.
    fn settled(&self) -> bool {
        !self.behind() && !self.unsure
    }

    /// A stream asks for the key (a frame that opens under no key this side has).
    pub fn handle_ask(&mut self) {
        self.due = true;
        self.asked = true;
    }

    /// When the next join may go, if one is due (at or before `now`: go now).
    fn poll_join(&self, now: Instant) -> Option<Instant> {
        if !self.due {
            return None;
        }
        Some(self.last.map_or(now, |t| t + self.spacing))
    }

    /// The join went unanswered (or failed): another is due, after a longer spacing.
    fn join_failed(&mut self) {
        self.due = true;
        self.spacing = (self.spacing * 2).min(REJOIN_SPACING_MAX);
    }

    /// A join goes at `now`: what asks or notices come from here on need another.
    fn joined(&mut self, now: Instant) {
        self.due = false;
        self.last = Some(now);
    }

    /// A join's answer: `keys` as the device holds them, the slot it names.
    pub fn handle_admission(
        &mut self,
        keys: GroupKey,
        slot: Option<u16>,
    ) -> Result<Followed, SlotLost> {
        if slot != self.slot {
            return Err(SlotLost {
                had: self.slot,
                now: slot,
            });
        }
        self.spacing = REJOIN_SPACING;
        let rotated = keys.key != self.keys.key;
        // A join never takes an app side back to an earlier run.
        let restarted = keys.run.id > self.keys.run.id;
        let run: Run = if restarted { keys.run } else { self.keys.run };
        self.keys = GroupKey { run, ..keys };
        Ok(Followed {
            keys: self.keys,
            rotated,
            restarted,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seal::LocalIdentity;

    fn identity(name: &str) -> LocalIdentity {
        let d = std::env::temp_dir().join(format!("ndd-follow-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let (id, _) = crate::Identity::load_or_create(&d).unwrap();
        LocalIdentity::new(&id).unwrap()
    }

    const RUN: Run = Run { id: 7, began: 0 };

    fn follower(subjects: &Subjects) -> Follower {
        Follower::new(subjects, GroupKey::first([1; 32], RUN), Some(1))
    }

    #[test]
    fn only_newer_notices_signed_by_a_trusted_device_for_this_driver_send_a_join() {
        let subjects = Subjects::new("ndd", "serial").unwrap();
        let device = identity("device");
        let stranger = identity("stranger");
        let trusted = |fp: &str| fp == device.fingerprint();
        let mut f = follower(&subjects);
        let t0 = Instant::now();
        assert_eq!(f.poll_join(t0), None, "nothing due at first");
        let note = |who: &LocalIdentity, label: &[u8], run: u64, at: u64| {
            let n = Notice {
                run,
                clock: at,
                key: [0; 8],
            };
            who.sign_note(label, &notice_body(&n)).unwrap()
        };
        let label = notice_label(&subjects);
        let first = note(&device, &label, 7, 100);
        assert_eq!(f.handle_notice(&first, trusted), Ok(Heard::Join));
        assert_eq!(f.poll_join(t0), Some(t0), "the first join goes at once");
        f.joined(t0);
        assert_eq!(f.poll_join(t0), None);
        // The same notice again, an older one, one of another driver, one by a stranger,
        // garbage, a signed note that is not a notice: none sends a join.
        assert_eq!(f.handle_notice(&first, trusted), Err(Ignored::Replayed));
        assert_eq!(
            f.handle_notice(&note(&device, &label, 7, 99), trusted),
            Err(Ignored::Replayed)
        );
        let other = notice_label(&Subjects::new("ndd", "camera").unwrap());
        assert!(matches!(
            f.handle_notice(&note(&device, &other, 7, 200), trusted),
            Err(Ignored::NotSigned(_))
        ));
        assert_eq!(
            f.handle_notice(&note(&stranger, &label, 8, 200), trusted),
            Err(Ignored::Untrusted(stranger.fingerprint()))
        );
        assert!(matches!(
            f.handle_notice(b"garbage", trusted),
            Err(Ignored::NotSigned(_))
        ));
        let odd = device.sign_note(&label, b"rekey short").unwrap();
        assert_eq!(f.handle_notice(&odd, trusted), Err(Ignored::NotANotice));
        assert_eq!(f.poll_join(t0), None, "no join for any of them");
        // A newer run counts even with an earlier clock (a clock set back after a restart).
        assert_eq!(
            f.handle_notice(&note(&device, &label, 8, 5), trusted),
            Ok(Heard::Join)
        );
        // The next join waits for the spacing; an ask meanwhile rides on it.
        assert_eq!(f.poll_join(t0), Some(t0 + REJOIN_SPACING));
        f.handle_ask();
        f.joined(t0 + REJOIN_SPACING);
        assert_eq!(f.poll_join(t0 + REJOIN_SPACING), None);
        f.handle_ask();
        assert_eq!(
            f.poll_join(t0 + REJOIN_SPACING),
            Some(t0 + REJOIN_SPACING * 2)
        );
        // Joins that fail are tried again, further apart each time, up to 5 s.
        let mut at = t0 + REJOIN_SPACING * 2;
        let mut gaps = Vec::new();
        for _ in 0..7 {
            f.joined(at);
            f.join_failed();
            let next = f.poll_join(at).unwrap();
            gaps.push((next - at).as_millis());
            at = next;
        }
        assert_eq!(gaps, vec![500, 1000, 2000, 4000, 5000, 5000, 5000]);
        // An answer brings the spacing back.
        f.joined(at);
        f.handle_admission(f.keys(), Some(1)).unwrap();
        f.handle_ask();
        assert_eq!(f.poll_join(at), Some(at + REJOIN_SPACING));
    }

    #[test]
    fn a_notice_naming_the_keys_held_sends_no_join_and_one_naming_others_does() {
        let subjects = Subjects::new("ndd", "serial").unwrap();
        let device = identity("device-current");
        let trusted = |fp: &str| fp == device.fingerprint();
        let label = notice_label(&subjects);
        let mut f = follower(&subjects);
        let t0 = Instant::now();
        let note = |clock: u64, keys: &GroupKey| {
            let n = Notice {
                run: keys.run.id,
                clock,
                key: key_id(keys),
            };
            device.sign_note(&label, &notice_body(&n)).unwrap()
        };
        // The repeated notice of the keys this side holds: nothing to do.
        let held = f.keys();
        assert_eq!(
            f.handle_notice(&note(10, &held), trusted),
            Ok(Heard::Current)
        );
        assert_eq!(f.poll_join(t0), None);
        // The device rotated: the id names another key; a join is due.
        let rotated = GroupKey::first([9; 32], RUN);
        assert_ne!(key_id(&rotated), key_id(&held));
        assert_eq!(
            f.handle_notice(&note(11, &rotated), trusted),
            Ok(Heard::Join)
        );
        assert_eq!(f.poll_join(t0), Some(t0));
        f.joined(t0);
        f.handle_admission(rotated, Some(1)).unwrap();
        assert_eq!(
            f.handle_notice(&note(12, &rotated), trusted),
            Ok(Heard::Current)
        );
        // The same key in a new run (the device restarted) is other keys too.
        let restarted = GroupKey::first([9; 32], Run { id: 8, began: 50 });
        assert_ne!(key_id(&restarted), key_id(&rotated));
        assert!(!f.behind(), "a rotation of the run held is not a newer run");
        assert_eq!(
            f.handle_notice(&note(1, &restarted), trusted),
            Ok(Heard::Join)
        );
        // Until a join brings that run's keys, this side knows it seals for an earlier run
        // (a join that meets no device side settles nothing then).
        assert!(f.behind());
        f.joined(t0);
        f.join_failed();
        assert!(f.behind(), "a failed join brings nothing");
        f.handle_admission(restarted, Some(1)).unwrap();
        assert!(!f.behind());
        // The id is the same for the same keys wherever it is computed, and reveals
        // nothing of the key (a keyed one-way function of the run key).
        assert_eq!(key_id(&rotated), key_id(&GroupKey::first([9; 32], RUN)));
    }

    #[test]
    fn the_newest_marks_above_this_sides_run_are_read_and_the_rest_counted() {
        assert_eq!(
            marks_to_read(10, [3, 12, 11, 12, 40]),
            MarkPlan {
                read: vec![40, 12, 11],
                unchecked: 0
            }
        );
        let plan = marks_to_read(0, 1..=(MARKS_READ as u64 + 5));
        assert_eq!(plan.read.len(), MARKS_READ);
        assert_eq!(plan.read[0], MARKS_READ as u64 + 5);
        assert_eq!(plan.unchecked, 5);
        assert_eq!(marks_to_read(9, [1, 2, 9]).read, Vec::<u64>::new());
    }

    #[test]
    fn no_responders_settles_only_once_every_newer_mark_was_read_and_none_is_genuine() {
        let subjects = Subjects::new("ndd", "serial").unwrap();
        let device = identity("device-settle");
        let trusted = |fp: &str| fp == device.fingerprint();
        let marks = mark_label(&subjects);
        let mark = |run: u64| {
            let body = notice_body(&Notice {
                run,
                clock: 50,
                key: [0; 8],
            });
            device.sign_note(&marks, &body).unwrap()
        };
        // Only older runs' marks (and this side's own): nothing to read, settled.
        let mut f = follower(&subjects);
        assert_eq!(f.no_responders(Some(vec![3, RUN.id])), Vec::<u64>::new());
        assert!(f.settled());
        // A newer run's subject whose mark is a copy of another run's: read, not counted.
        assert_eq!(f.no_responders(Some(vec![3, 9])), vec![9]);
        assert!(f.handle_mark(&mark(8), 9, trusted).is_err());
        assert!(f.settled());
        // One that could not be read, too many subjects to list, more newer subjects than
        // are read: open.
        assert_eq!(f.no_responders(Some(vec![9])), vec![9]);
        f.mark_unread();
        assert!(!f.settled());
        assert_eq!(f.no_responders(None), Vec::<u64>::new());
        assert!(!f.settled());
        assert!(f.no_responders(Some(vec![1; MARK_SUBJECTS + 1])).is_empty());
        assert!(!f.settled());
        let flood: Vec<u64> = (100..100 + MARKS_READ as u64 + 1).collect();
        assert_eq!(f.no_responders(Some(flood)).len(), MARKS_READ);
        assert!(!f.settled(), "one newer subject left unread");
        // The next question starts afresh; a genuine newer mark leaves it open for good.
        assert_eq!(f.no_responders(Some(vec![9])), vec![9]);
        assert!(f.settled());
        assert_eq!(f.handle_mark(&mark(9), 9, trusted), Ok(9));
        assert!(f.behind() && !f.settled());
        assert!(f.no_responders(Some(Vec::new())).is_empty());
        assert!(!f.settled(), "still behind run 9");
    }

    #[test]
    fn a_run_mark_makes_a_side_behind_and_never_steers_its_notices() {
        let subjects = Subjects::new("ndd", "serial").unwrap();
        let device = identity("device-mark");
        let stranger = identity("stranger-mark");
        let trusted = |fp: &str| fp == device.fingerprint();
        let mut f = follower(&subjects);
        let body = |run: u64| {
            notice_body(&Notice {
                run,
                clock: 50,
                key: [0; 8],
            })
        };
        let marks = mark_label(&subjects);
        let notices = notice_label(&subjects);
        // A mark of this side's own run, or an older one: not behind.
        let own = device.sign_note(&marks, &body(RUN.id)).unwrap();
        assert_eq!(f.handle_mark(&own, RUN.id, trusted), Ok(RUN.id));
        assert!(!f.behind());
        // Refused: another run than its subject's, a rekey notice passed off as a mark (and a
        // mark as a notice), a stranger's.
        let newer = device.sign_note(&marks, &body(100)).unwrap();
        assert_eq!(f.handle_mark(&newer, 101, trusted), Err(Ignored::OtherRun));
        let notice = device.sign_note(&notices, &body(100)).unwrap();
        assert!(matches!(
            f.handle_mark(&notice, 100, trusted),
            Err(Ignored::NotSigned(_))
        ));
        assert!(matches!(
            f.handle_notice(&newer, trusted),
            Err(Ignored::NotSigned(_))
        ));
        let forged = stranger.sign_note(&marks, &body(100)).unwrap();
        assert_eq!(
            f.handle_mark(&forged, 100, trusted),
            Err(Ignored::Untrusted(stranger.fingerprint()))
        );
        assert!(!f.behind(), "nothing refused counts");
        // The device's mark of a newer run: behind, with no join due (the run may never
        // serve), and a notice of a run before it still counts (a mark never takes the
        // notices' order).
        assert_eq!(f.handle_mark(&newer, 100, trusted), Ok(100));
        assert!(f.behind());
        assert_eq!(f.poll_join(Instant::now()), None);
        let eight = device.sign_note(&notices, &body(8)).unwrap();
        assert_eq!(f.handle_notice(&eight, trusted), Ok(Heard::Join));
        // Keys of a run at or past the mark: no longer behind.
        f.handle_admission(GroupKey::first([1; 32], Run { id: 100, began: 9 }), Some(1))
            .unwrap();
        assert!(!f.behind());
    }

    /// Every event the follower has for its driver.
    fn events(f: &mut Follower) -> Vec<FollowEvent> {
        std::iter::from_fn(|| f.poll_event()).collect()
    }

    #[test]
    fn one_question_at_a_time_and_an_answer_settles_it_with_the_keys() {
        let subjects = Subjects::new("ndd", "serial").unwrap();
        let mut f = follower(&subjects);
        let t0 = Instant::now();
        assert_eq!(f.poll_io(t0), None, "nothing asked");
        assert!(f.is_idle());
        f.handle_ask();
        assert_eq!(f.poll_io(t0), Some(FollowIo::Join));
        assert_eq!(f.poll_io(t0), None, "one question at a time");
        assert_eq!(f.poll_timeout(t0), None);
        // Outcomes not asked for are ignored.
        f.handle_listed(Some(vec![99]));
        assert_eq!(f.handle_mark_read(99, Some(b"x"), |_| true), None);
        assert!(events(&mut f).is_empty());
        // A stream asks while the join is under way: its answer is the next question's.
        f.handle_ask();
        let newer = GroupKey::first([1; 32], Run { id: 8, began: 3 });
        f.handle_join(Joined::Admitted {
            keys: Box::new(newer),
            slot: Some(1),
        })
        .unwrap();
        let got = events(&mut f);
        assert!(
            matches!(&got[..], [FollowEvent::Followed(f), FollowEvent::Answered { settled: true }] if f.restarted && f.keys == newer),
            "{got:?}"
        );
        // A second answer to the same join changes nothing.
        f.handle_join(Joined::Refused("late".into())).unwrap();
        assert!(events(&mut f).is_empty());
        assert_eq!(f.poll_io(t0), None, "the spacing first");
        assert_eq!(f.poll_timeout(t0), Some(t0 + REJOIN_SPACING));
        assert_eq!(f.poll_io(t0 + REJOIN_SPACING), Some(FollowIo::Join));
        // No answer within the try: not settled, and the next join goes further apart.
        f.handle_join(Joined::Failed).unwrap();
        assert_eq!(
            events(&mut f),
            vec![FollowEvent::Answered { settled: false }]
        );
        assert!(!f.is_idle(), "a failed join is due again");
        assert_eq!(
            f.poll_timeout(t0),
            Some(t0 + REJOIN_SPACING + REJOIN_SPACING * 2)
        );
    }

    #[test]
    fn a_refusal_an_untrusted_answer_or_another_slot_ends_the_side() {
        let subjects = Subjects::new("ndd", "serial").unwrap();
        let t0 = Instant::now();
        let ends = [
            (
                Joined::Refused("revoked".into()),
                FollowEnd::Refused("revoked".into()),
            ),
            (
                Joined::Untrusted("fp".into()),
                FollowEnd::Untrusted("fp".into()),
            ),
            (
                Joined::Admitted {
                    keys: Box::new(GroupKey::first([1; 32], RUN)),
                    slot: Some(2),
                },
                FollowEnd::SlotLost(SlotLost {
                    had: Some(1),
                    now: Some(2),
                }),
            ),
        ];
        for (joined, end) in ends {
            let mut f = follower(&subjects);
            f.handle_ask();
            assert_eq!(f.poll_io(t0), Some(FollowIo::Join));
            assert_eq!(f.handle_join(joined), Err(end));
            assert!(f.is_idle(), "the question is over");
            assert!(
                events(&mut f).is_empty(),
                "no answer to give: the side ends"
            );
        }
    }

    #[test]
    fn no_device_serving_reads_the_newest_marks_only_when_a_stream_asked() {
        let subjects = Subjects::new("ndd", "serial").unwrap();
        let device = identity("device-question");
        let stranger = identity("stranger-question");
        let trusted = |fp: &str| fp == device.fingerprint();
        let mark = |who: &LocalIdentity, run: u64| {
            let body = notice_body(&Notice {
                run,
                clock: 50,
                key: [0; 8],
            });
            who.sign_note(&mark_label(&subjects), &body).unwrap()
        };
        let mut t = Instant::now();
        let mut f = follower(&subjects);
        let ask = |f: &mut Follower, asked: bool, t: &mut Instant| {
            if asked {
                f.handle_ask();
            } else {
                f.due = true;
            }
            *t += REJOIN_SPACING_MAX;
            assert_eq!(f.poll_io(*t), Some(FollowIo::Join));
            f.handle_join(Joined::NoDeviceServing).unwrap();
        };
        // A notice's join (no stream asked): no marks read, settled while nothing is newer.
        ask(&mut f, false, &mut t);
        assert_eq!(f.poll_io(t), None);
        assert_eq!(
            events(&mut f),
            vec![FollowEvent::Answered { settled: true }]
        );
        // A stream asked: the mark subjects are listed, the newest above this side's run read
        // (a stranger's mark does not count), until one proves a newer run.
        ask(&mut f, true, &mut t);
        assert_eq!(f.poll_io(t), Some(FollowIo::ListMarks));
        assert_eq!(f.poll_io(t), None);
        f.handle_listed(Some(vec![3, RUN.id, 9, 12]));
        assert_eq!(f.poll_io(t), Some(FollowIo::ReadMark(12)));
        let forged = mark(&stranger, 12);
        assert_eq!(
            f.handle_mark_read(12, Some(&forged), trusted),
            Some(Err(Ignored::Untrusted(stranger.fingerprint())))
        );
        assert_eq!(f.poll_io(t), Some(FollowIo::ReadMark(9)));
        assert!(events(&mut f).is_empty());
        assert_eq!(
            f.handle_mark_read(9, Some(&mark(&device, 9)), trusted),
            Some(Ok(9))
        );
        assert_eq!(
            events(&mut f),
            vec![
                FollowEvent::Behind { run: 9 },
                FollowEvent::Answered { settled: false }
            ]
        );
        // Behind already: the next question reads nothing and says it once only.
        ask(&mut f, true, &mut t);
        assert_eq!(f.poll_io(t), Some(FollowIo::ListMarks));
        f.handle_listed(Some(vec![9, 12]));
        assert_eq!(f.poll_io(t), None);
        assert_eq!(
            events(&mut f),
            vec![FollowEvent::Answered { settled: false }]
        );
        // A mark that cannot be read, or subjects that cannot be listed: not settled.
        let mut f = follower(&subjects);
        ask(&mut f, true, &mut t);
        assert_eq!(f.poll_io(t), Some(FollowIo::ListMarks));
        f.handle_listed(Some(vec![9]));
        assert_eq!(f.poll_io(t), Some(FollowIo::ReadMark(9)));
        assert_eq!(f.handle_mark_read(9, None, trusted), None);
        assert_eq!(
            events(&mut f),
            vec![FollowEvent::Answered { settled: false }]
        );
        ask(&mut f, true, &mut t);
        assert_eq!(f.poll_io(t), Some(FollowIo::ListMarks));
        f.handle_listed(None);
        assert_eq!(
            events(&mut f),
            vec![FollowEvent::Answered { settled: false }]
        );
        // Only older marks: settled.
        ask(&mut f, true, &mut t);
        assert_eq!(f.poll_io(t), Some(FollowIo::ListMarks));
        f.handle_listed(Some(vec![2, 3]));
        assert_eq!(
            events(&mut f),
            vec![FollowEvent::Answered { settled: true }]
        );
    }

    #[test]
    fn an_answer_brings_new_keys_never_an_earlier_run_and_a_lost_slot_ends_the_side() {
        let subjects = Subjects::new("ndd", "serial").unwrap();
        let mut f = follower(&subjects);
        let newer = Run { id: 9, began: 40 };
        // A rotation and a restart in one answer.
        let mut k = GroupKey::first([2; 32], newer);
        k.previous = Some([1; 32]);
        k.since = 30;
        let got = f.handle_admission(k, Some(1)).unwrap();
        assert!(got.rotated && got.restarted);
        assert_eq!(got.keys, k);
        // An answer from before the restart, delivered late: its keys, the newer run kept.
        let late = GroupKey::first([2; 32], RUN);
        let got = f.handle_admission(late, Some(1)).unwrap();
        assert!(!got.rotated && !got.restarted);
        assert_eq!(got.keys.run, newer);
        assert_eq!(f.keys().run, newer);
        // Another slot: the side ends, its keys unchanged.
        assert_eq!(
            f.handle_admission(k, Some(2)),
            Err(SlotLost {
                had: Some(1),
                now: Some(2)
            })
        );
        assert_eq!(f.keys().run, newer);
    }
}

//! The NATS fan-out's group key under revocation, over 1000 random schedules (issue 31,
//! item 2): a device side and 2–5 app sides on one JetStream stream (one sequence for every
//! subject, message ids deduplicated as the server does), each app side publishing a reliable
//! app → device stream and taking the device's reliable device → app stream. Mid-stream the
//! device stops trusting one app side (`ndd untrust`) and rotates the key; in some schedules
//! it then stops trusting a second one, often right after the first rotation is complete, so
//! that its sinks (which follow the keys as a watch: two changes between two reads are one)
//! and app sides that missed the first notice see both rotations as one change of keys; with
//! four app sides or more, a third often follows at once (an app side that missed the
//! notices meets keys three rotations on). In 40 % of schedules the device side also
//! restarts once or twice mid-stream, in some of those three to five times more within a
//! few hundred steps, and in 30 % it dies in some of its rotations, 1–90 steps after one
//! begins (at the gate, while it reads where the stream stands, while its sink holds a frame
//! under the old key, or just after the rotation completes), up to seven runs after the first
//! in all. A restart is a new run under the keys as the device's files hold them, read back
//! as `Home::group_key` reads them: the key file (the new key from the rotation's `Rotate`
//! on), the file of retired keys (from `Rotate` on the rotation under way with where the
//! stream stood as it began, `rotate::encode_pending`, completed there when read back;
//! `encode_retired` from `Complete` on) and the holders file (emptied at `Rotate`); the run
//! before it is named in the keys; its durable consumer goes on from what it acknowledged;
//! what it had handed the client and not seen acknowledged is stored or not. The app sides
//! hear of the run (the announcement, a newer run's frame, a refused frame of theirs), join
//! again and seal again what the device refused. In 30 % of schedules an app side's process
//! also ends between two publishes and a new one starts (a new sender id and frame numbers
//! from 0; it joins again; its durable consumer starts over at JetStream's ack floor; its
//! receiver takes up what the one before kept when it last acknowledged: `intake::Kept`).
//!
//! Every part that decides is the binary's own, sans-IO: each app side's
//! `ndd_link::nats::follow::Follower` (which rekey notices send it joining, how far apart its
//! joins go, what an answer changes), the device's and each app side's
//! `ndd_link::nats::keys::Opener` (runs, the key as it stands, the key before the rotation,
//! asking for the key, holding a frame while the rotation reads where the stream stands), the
//! device's `ndd_link::nats::rotate::Keeper` (checking who holds the key every 1–20 ms, the
//! rotation, its gate (`ndd_link::nats::rotate::Gate`, as `drive/keeper.rs` keeps it) — the
//! device's reliable publisher and, in some schedules, a second one that settles up to 200 ms
//! later and in some of those ends mid-rotation, a new one taking its place (a gate that kept
//! a departed publisher's settling opened early: seed 51, a frame delivered twice) —, where
//! the stream stood, the file of retired keys read
//! back, and every rekey notice: at each run's start, every `NOTICE_EVERY`, on a frame of an
//! earlier run, never while `since` is pending), each stream's `Intake` (copies, order) and `Outbox` (message ids,
//! acknowledgements, retries, and what goes again under the new key), and the real `encrypt`
//! pair. The simulation plays the broker and the drivers:
//!
//! - the broker stores a publish, loses it, stores it and loses the acknowledgement (the
//!   outbox publishes again, JetStream drops the copy by its id), delays it (stored out of
//!   order), in some schedules acknowledges it and then loses it for good (a gap that never
//!   fills), redelivers now and then what a consumer read, and every 5 s (`ACK_WAIT`)
//!   everything not acknowledged (a gap holds an app side's acknowledgements back);
//! - time runs a millisecond a step while the sources publish (600 steps), then a second a
//!   step once everything stored was read, so gaps are given up after fanout's 30 s;
//! - the rotation reads where the stream stands some steps after it drew the key, once the
//!   device's publisher has every publish under the old key acknowledged (the `Gate`; app frames stored meanwhile are held by the device), then tells the app
//!   sides: a rekey notice signed by the device naming its keys, also sent at a restart, when
//!   a frame of an earlier run or under a rotated key comes in, and every 2 s
//!   (`NOTICE_EVERY`); on core NATS, so in half the schedules each app side loses one in
//!   five, and the others come 0–40 steps later; a frame under a key an app side does not
//!   have makes it ask; its `Follower` joins (answered 1–20 steps later, once the rotation is
//!   complete, by the device's `join::HandOut`: the keys taken then, the side's trust decided
//!   and the side noted as a holder, in half the schedules up to 30 steps later, then the keys
//!   taken sent; a rotation writes its holders file as late after its keys change); the
//!   revoked side's joins are refused;
//! - the revoked app side goes on publishing under the old key, and an adversary records every
//!   message (publishes the server did not store too, of the device) and publishes copies,
//!   copies with another place in the order or frame number, flipped bytes, genuine sealed
//!   headers with junk bodies or bodies too short for a sealed frame, and garbage, on both
//!   subjects; replays recorded notices to any app side and forges them (signed by a
//!   stranger, signed by the device for another driver, a byte changed: none may count); and
//!   keeps storing records naming the run at the place the app sides wait for
//!   next (or one JetStream lost) for 100 s after the sources stop.
//!
//! Properties: each device process delivers each app frame at most once (a new process
//! delivers again what the one before took and did not acknowledge, and a copy stored
//! before the restart: counted), only genuine ones, none of the revoked side's stored after
//! the rotation (after it began, for a rotation the device died in), and every frame of every
//! trusted app side; each trusted app side delivers every device frame exactly once per
//! process and at least once across its processes (of a run before a restart, those stored
//! before the next run began: the others died with the process or are replays; of a key
//! retired by a rotation the device died in, those stored before the rotation began: the
//! others were in flight as it began, and only its gate, gone with the process, could tell
//! them from the revoked side's); the
//! revoked side delivers no device frame sealed after the rotation (frames whose last stored
//! copy JetStream lost are not owed); each trusted app side takes the device's frames in order; and everything
//! settles (no order held at a gap for good). Not covered: more than eight rotations close
//! together (`GroupKey::retired` keeps six keys behind the previous and the older one), the
//! gate's timeout (frames published just before it may be lost: the binary warns), a forger active for long after the sources stop, more than eight
//! device restarts before an app side joins again (`EARLIER_RUNS`), an app side's process
//! ending with publishes in flight (their frames are not owed; the ones its Sender would seal again after a rotation
//! would not be either).
//!
//! `SEED=n cargo test -p ndd-testkit --test nats_keys` replays one schedule.

mod common;

use bytes::Bytes;
use common::{RunInverse, RunSealer, IDS};
use ndd_core::{Frame, Meta};
use ndd_link::nats::attach::{Attach, AttachIo};
use ndd_link::nats::follow::{
    key_id, notice_body, notice_label, FollowEnd, FollowEvent, FollowIo, Follower, Ignored, Joined,
    Notice,
};
use ndd_link::nats::intake::{Kept, REORDER_WAIT};
use ndd_link::nats::join::{HandOut, Welcome};
use ndd_link::nats::keys::{GroupKey, SINCE_PENDING};
use ndd_link::nats::outbox::Publish;
use ndd_link::nats::receive::{Event, Poll, Receiver, Wait};
use ndd_link::nats::record::FrameRecord;
use ndd_link::nats::rotate::{
    encode_pending, encode_retired, parse_retired, Action as KeeperAction, Gate, Keeper,
};
use ndd_link::nats::runs::Run;
use ndd_link::nats::send::{Follow, Sender};
use ndd_link::nats::subjects::Subjects;
use ndd_testkit::SimRng;
use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

const UP: u16 = 5;
const DOWN: u16 = 6;
const RUN: Run = Run { id: 0x77, began: 0 };
/// How long stored frames wait behind a gap: fanout's.
const WAIT: Duration = REORDER_WAIT;
/// JetStream's acknowledgement wait (fanout's consumers): what is not acknowledged by then
/// comes again.
const ACK_WAIT: Duration = Duration::from_secs(5);
/// Frames each app side publishes, and the device.
const FRAMES: u64 = 60;

/// Frame `seq` of `stream`, before sealing (the binary's `Sender` seals it bound to the
/// subject sequence its record will carry).
fn plain(stream: u16, seq: u64, body: &[u8]) -> Frame {
    let meta = Meta {
        stream,
        seq,
        timestamp_ns: seq,
        flags: 0,
    };
    Frame::new(meta, body)
}

/// Frame `n` of app side process `app` ([`App::id`]).
fn up_payload(app: u8, n: u64) -> Vec<u8> {
    let mut p = b"up".to_vec();
    p.push(app);
    p.extend_from_slice(&n.to_be_bytes());
    p
}

/// The device's frame `n`, sealed under key generation `gen`.
fn down_payload(gen: u8, n: u64) -> Vec<u8> {
    let mut p = b"dn".to_vec();
    p.push(gen);
    p.extend_from_slice(&n.to_be_bytes());
    p
}

/// What a join hands an app side: the key, where its rotation began, the key before it and
/// the run (the WELCOME's fields).
/// What the rekey notices of the simulated driver are signed under.
fn subjects() -> Subjects {
    Subjects::new("ndd", "keys").expect("valid subjects")
}

fn label() -> Vec<u8> {
    notice_label(&subjects())
}

/// `P.D.rekey` on core NATS: notices on their way to app sides, and every one sent (the
/// adversary's recording).
struct Rekeys {
    /// How likely an app side misses a notice.
    loss: f64,
    n_apps: usize,
    /// (app side, step due, note).
    on_way: Vec<(usize, u64, Vec<u8>)>,
    sent: Vec<Vec<u8>>,
}

impl Rekeys {
    /// The device's signed notice naming `keys` at its clock `clock` (fanout's
    /// `rekey_notice`): each app side gets it some steps after `step`, or never.
    fn announce(&mut self, rng: &mut SimRng, keys: &GroupKey, clock: u64, step: u64) {
        let notice = Notice {
            run: keys.run.id,
            clock,
            key: key_id(keys),
        };
        let note = IDS.with(|(device, _)| device.sign_note(&label(), &notice_body(&notice)));
        let note = note.expect("sign a notice");
        for i in 0..self.n_apps {
            if !rng.chance(self.loss) {
                self.on_way.push((i, step + rng.range(0, 40), note.clone()));
            }
        }
        self.sent.push(note);
    }
}

/// The JetStream stream: one sequence for every subject.
#[derive(Default)]
struct Js {
    log: Vec<(u16, Bytes)>,
    ids: HashMap<String, u64>,
    /// Messages it acknowledged and then lost (a restart before they were written): nobody
    /// ever gets them, and the gap they leave never fills.
    lost: HashSet<u64>,
}

impl Js {
    /// Stores `body` on `subject` (a message id it holds: the first one's sequence).
    fn store(&mut self, subject: u16, id: Option<&str>, body: Bytes) -> u64 {
        if let Some(&s) = id.and_then(|id| self.ids.get(id)) {
            return s;
        }
        self.log.push((subject, body));
        let s = self.log.len() as u64;
        if let Some(id) = id {
            self.ids.insert(id.to_string(), s);
        }
        s
    }

    fn last(&self) -> u64 {
        self.log.len() as u64
    }
}

/// A consumer of one subject: where it stands, what it will deliver again, and what it
/// delivered and is not acknowledged (delivered again after the acknowledgement wait, as
/// JetStream does: every 5 s while a gap holds an app side's acknowledgements back).
struct Consumer {
    subject: u16,
    next: usize,
    again: VecDeque<u64>,
    unacked: std::collections::BTreeSet<u64>,
    acked: std::collections::BTreeSet<u64>,
}

impl Consumer {
    fn new(subject: u16) -> Consumer {
        Consumer {
            subject,
            next: 0,
            again: VecDeque::new(),
            unacked: std::collections::BTreeSet::new(),
            acked: std::collections::BTreeSet::new(),
        }
    }

    /// JetStream's ack floor: the last message acknowledged with every one delivered before
    /// it acknowledged too (0: none).
    fn ack_floor(&self) -> u64 {
        let below = self.unacked.first().copied().unwrap_or(u64::MAX);
        self.acked.range(..below).next_back().copied().unwrap_or(0)
    }

    fn poll(&mut self, js: &Js, rng: &mut SimRng) -> Option<(u64, Bytes)> {
        if !self.again.is_empty() && rng.chance(0.2) {
            let s = self.again.pop_front()?;
            return Some((s, js.log[s as usize - 1].1.clone()));
        }
        while self.next < js.log.len() {
            let i = self.next;
            self.next += 1;
            let s = i as u64 + 1;
            if js.log[i].0 == self.subject && !js.lost.contains(&s) {
                if rng.chance(0.05) {
                    self.again.push_back(s);
                }
                self.unacked.insert(s);
                return Some((s, js.log[i].1.clone()));
            }
        }
        let s = self.again.pop_front()?;
        Some((s, js.log[s as usize - 1].1.clone()))
    }

    fn ack(&mut self, seq: u64) {
        if self.unacked.remove(&seq) {
            self.acked.insert(seq);
        }
    }

    /// The acknowledgement wait ran out: everything unacknowledged comes again.
    fn redeliver(&mut self) {
        for &s in &self.unacked {
            if !self.again.contains(&s) {
                self.again.push_back(s);
            }
        }
    }

    fn caught_up(&self, js: &Js) -> bool {
        self.next >= js.log.len() && self.again.is_empty()
    }
}

struct App {
    /// Its process: the app side's index, and how many times it restarted (<< 4); the
    /// frames it publishes say it.
    id: u8,
    /// Its processes before this one: (id, frames published).
    before: Vec<(u8, u64)>,
    /// How likely it reads at a step (a slow one lags behind the stream).
    pace: f64,
    /// Its sending half of the app → device stream (the binary's: sealing, outbox, keys).
    tx: Sender<RunSealer, u64>,
    next: u64,
    /// Keys learnt, applied to sealing once every publish is acknowledged.
    learning: Option<GroupKey>,
    /// Its receiver of the device's stream (the binary's: intake and opener).
    rx: Receiver<RunInverse, u64>,
    consumer: Consumer,
    /// What its receiver kept when it last acknowledged (the binary's file in the home).
    kept: Option<Kept>,
    /// Waiting for a join's answer before its receiver tries a record again ([`Wait::Key`]).
    asking: bool,
    /// It asked before the question under way went: its answer is that question's.
    answering: bool,
    /// Its following of the key (the binary's: which notices send it joining, how far apart
    /// its joins go, what an answer changes).
    follower: Follower,
    /// The step its join's answer comes (once the device's rotation is complete).
    join: Option<u64>,
    /// The device took the keys for its answer (`HandOut::take`) and notes it as a holder at
    /// this step (its admission decided then too), then answers with the keys taken.
    handout: Option<(HandOut, u64)>,
    /// Its join was refused (no longer trusted): the binary ends the side; here it goes on
    /// publishing under the key it has, as an attacker would.
    refused: bool,
    /// Device frames any of its processes delivered, and this one.
    got: HashSet<u64>,
    got_now: HashSet<u64>,
    /// Device frames a process delivered that an earlier one had delivered (its durable
    /// consumer starts over at the first message the one before had not acknowledged).
    again: u64,
    /// The device frame this process delivered last, and how many came after a later one.
    last: Option<u64>,
    out_of_order: u64,
}

impl App {
    fn new(id: u8, keys: GroupKey, pace: f64) -> App {
        // Its consumer was made before anything was stored: the device's run is seen whole.
        let mut rx = Receiver::new(DOWN, true, keys, true, WAIT);
        rx.intake().consumer_start(0);
        App {
            id,
            before: Vec::new(),
            pace,
            // Each process has a sender id of its own (the binary draws one): the message
            // ids of its frames are not the ones before's.
            tx: Sender::new(UP, keys, true, Some(u64::from(id)), true).unwrap(),
            next: 0,
            learning: None,
            rx,
            consumer: Consumer::new(DOWN),
            kept: None,
            asking: false,
            answering: false,
            follower: Follower::new(&subjects(), keys, None),
            join: None,
            handout: None,
            refused: false,
            got: HashSet::new(),
            got_now: HashSet::new(),
            again: 0,
            last: None,
            out_of_order: 0,
        }
    }

    /// The app side's process ends and a new one starts: it joined (`keys`), its stack starts
    /// from frame 0, its durable consumer starts over at the first message the one before had
    /// not acknowledged (JetStream's ack floor: what was acknowledged after it comes again
    /// too), and nothing of the process before is kept but what the server stored.
    /// Its consumer is attached as the driver's `drive/sink.rs` does
    /// (`ndd_link::nats::attach::Attach`): the one left behind is found, with its ack floor and
    /// what the process before kept (at the latest at the first record its receiver kept
    /// aside for a key: acknowledged, not yet opened), deleted, and made again there; a new
    /// one would start after `stood`, where the stream stood when this process joined.
    fn restart(&mut self, keys: GroupKey, stood: u64) {
        let now = Instant::now();
        let mut attach = Attach::new(stood + 1, true, false);
        let attached = loop {
            if let Some(end) = attach.poll_end() {
                break end.expect("made");
            }
            match attach.poll_io(now).expect("no waits: deletes go") {
                AttachIo::Look => {
                    attach.handle_looked(Some(self.consumer.ack_floor()), self.kept.as_ref(), now)
                }
                AttachIo::Delete => attach.handle_deleted(true),
                AttachIo::Make { .. } => attach.handle_made(true),
            }
        };
        assert!(attached.resumed, "its consumer was left behind");
        let mut next = App::new(self.id + 0x10, keys, self.pace);
        next.before = std::mem::take(&mut self.before);
        next.before.push((self.id, self.next));
        next.consumer.next = (attached.start - 1) as usize;
        next.rx.intake().consumer_start(attached.start);
        if let Some(k) = self.kept {
            next.rx.intake().take_up(k);
        }
        next.kept = self.kept;
        next.got = std::mem::take(&mut self.got);
        next.again = self.again;
        *self = next;
    }

    /// The answer to a join: the keys as the device holds them.
    fn learn(&mut self, keys: GroupKey, now: Instant) {
        // What did not open meanwhile goes again.
        self.rx.handle_keys(now, keys);
        if keys.resend_after(&self.tx.keys()).is_some() {
            self.learning = Some(keys);
        }
    }

    fn publish(&mut self, now: Instant, n: u64) {
        let frame = plain(UP, n, &up_payload(self.id, n));
        self.tx.send(now, "up", None, frame, Some((16, n))).unwrap();
    }
}

struct Device {
    keys: GroupKey,
    /// Its keeper of the key (the binary's): checks, the rotation and its gate, notices.
    keeper: Keeper,
    holders: Vec<String>,
    trusted: Vec<bool>,
    /// Its receiver of the app sides' stream (the binary's: intake and opener).
    rx: Receiver<RunInverse, u64>,
    consumer: Consumer,
    /// Its receiver waits for where the rotation began ([`Wait::Rotation`]).
    held: bool,
    /// Its sending half of the device → app stream (the binary's).
    tx: Sender<RunSealer, u64>,
    next: u64,
    gen: u8,
    /// A rotation its publisher has not followed yet (it publishes nothing meanwhile).
    rotating: bool,
    /// Rotations so far (the key's generation).
    rotations: u8,
    /// Every (key generation, frame) it sealed.
    sealed: HashSet<(u8, u64)>,
    /// The key generation of each message id it published.
    ids: HashMap<String, u8>,
    /// Every app frame delivered (by app process, [`App::id`]), with where it was stored.
    got: HashMap<(u8, u64), Option<u64>>,
    /// Its runs: each with the first frame it published in it.
    runs: Vec<(Run, u64)>,
    /// App frames this process delivered.
    got_now: HashSet<(u8, u64)>,
    /// App frames a process delivered that an earlier one had delivered: its durable
    /// consumer delivers again what the one before had not acknowledged, and a process
    /// starts with no memory of what the one before took (a copy stored before the restart
    /// and read after it opens again: docs/security.md, "Limits").
    again: u64,
}

impl Device {
    fn publish(&mut self, now: Instant, n: u64) {
        let frame = plain(DOWN, n, &down_payload(self.gen, n));
        self.sealed.insert((self.gen, n));
        let (id, _) = self
            .tx
            .send(now, "down", None, frame, Some((16, n)))
            .unwrap();
        self.ids.insert(id.expect("a stored frame's id"), self.gen);
    }
}

/// Fails unless `payload` is a genuine app frame delivered as it may be.
fn device_took(
    d: &mut Device,
    f: &Frame,
    stored: Option<u64>,
    revoked: &[(usize, u64, u8)],
    published: &HashMap<u8, u64>,
) -> Result<(), String> {
    let p = f.payload();
    if p.len() != 11 || &p[..2] != b"up" {
        return Err(format!(
            "the device delivered a payload no app side sealed: {p:?}"
        ));
    }
    let (process, app) = (p[2], usize::from(p[2] & 0x0f));
    let n = u64::from_be_bytes(p[3..].try_into().unwrap());
    if published.get(&process).is_none_or(|&m| n >= m) || f.meta.seq != n {
        return Err(format!(
            "the device delivered a frame never published: app {app} frame {n}"
        ));
    }
    for &(r, since, _) in revoked {
        if app == r && since != SINCE_PENDING && stored.is_none_or(|s| s > since) {
            return Err(format!(
                "the device delivered the revoked app side's frame {n} stored at {stored:?}, after the rotation at {since}"
            ));
        }
    }
    if !d.got_now.insert((process, n)) {
        return Err(format!(
            "the device delivered app {app}'s frame {n} twice (stored at {:?}, then at {stored:?})",
            d.got.get(&(process, n))
        ));
    }
    if d.got.insert((process, n), stored).is_some() {
        d.again += 1;
    }
    Ok(())
}

fn app_took(
    a: &mut App,
    f: &Frame,
    sealed: &HashSet<(u8, u64)>,
    revoked_after: Option<u8>,
) -> Result<(), String> {
    let p = f.payload();
    if p.len() != 11 || &p[..2] != b"dn" {
        return Err(format!(
            "an app side delivered a payload the device never sealed: {p:?}"
        ));
    }
    let gen = p[2];
    let n = u64::from_be_bytes(p[3..].try_into().unwrap());
    if !sealed.contains(&(gen, n)) || f.meta.seq != n {
        return Err(format!(
            "an app side delivered a device frame never published: {n} gen {gen}"
        ));
    }
    if revoked_after.is_some_and(|g| gen > g) {
        return Err(format!(
            "the revoked app side delivered device frame {n}, sealed after the rotation"
        ));
    }
    if !a.got_now.insert(n) {
        return Err(format!("an app side delivered device frame {n} twice"));
    }
    if !a.got.insert(n) {
        a.again += 1;
    }
    // In order, but for frames JetStream lost (their places are given up).
    if a.last.is_some_and(|l| n < l) {
        a.out_of_order += 1;
    }
    a.last = Some(n);
    Ok(())
}

/// The adversary's version of a recorded message.
fn tamper(rng: &mut SimRng, body: &Bytes) -> Bytes {
    let mut b = body.to_vec();
    if b.len() < 44 + 40 {
        return body.clone();
    }
    match rng.range(0, 5) {
        // Another place in the subject's order (bound into the seal: does not open).
        0 => {
            let w = rng.range(0, FRAMES * 2);
            b[36..44].copy_from_slice(&w.to_be_bytes());
        }
        // Another frame number (in the associated data: does not open).
        1 => {
            let s = rng.range(0, FRAMES);
            b[20..28].copy_from_slice(&s.to_be_bytes());
        }
        // A flipped byte of the ciphertext.
        2 => {
            let i = rng.range(44, b.len() as u64 - 1) as usize;
            b[i] ^= 0x40;
        }
        // A genuine sealed header (epoch and counter) with a junk body, at a place near the
        // order: the half's replay window drops it unread once the genuine one opened.
        3 => {
            let w = rng.range(0, FRAMES + 10);
            b[36..44].copy_from_slice(&w.to_be_bytes());
            for x in &mut b[44 + 24..] {
                *x = rng.range(0, 255) as u8;
            }
        }
        // A header naming the run with a body too short for a sealed frame.
        4 => {
            let w = rng.range(0, FRAMES + 10);
            b[36..44].copy_from_slice(&w.to_be_bytes());
            b.truncate(44 + rng.range(0, 39) as usize);
        }
        // As recorded.
        _ => {}
    }
    Bytes::from(b)
}

fn run(seed: u64) -> Result<String, String> {
    let mut rng = SimRng::new(seed);
    let t0 = Instant::now();
    let n_apps = rng.range(2, 5) as usize;
    let fps: Vec<String> = (0..n_apps).map(|i| format!("app{i}")).collect();
    let first = GroupKey::first([0x11; 32], RUN);
    // Which app side is revoked, and when (none in some schedules).
    let mut revokes: VecDeque<(usize, u64)> = VecDeque::new();
    if rng.chance(0.85) {
        let first = rng.range(0, n_apps as u64 - 1) as usize;
        revokes.push_back((first, rng.range(20, 400)));
        // A second one in some schedules, often right after the first is complete (the
        // device's sinks may see both rotations as one change of keys).
        if n_apps >= 3 && rng.chance(0.4) {
            let second = (first + 1 + rng.range(0, n_apps as u64 - 2) as usize) % n_apps;
            let gap = if rng.chance(0.5) {
                rng.range(0, 5)
            } else {
                rng.range(0, 300)
            };
            revokes.push_back((second, gap));
            // A third one close behind in some schedules: an app side that missed the
            // notices meets keys two rotations on.
            if n_apps >= 4 && rng.chance(0.4) {
                let third = (0..n_apps)
                    .find(|&i| i != first && i != second)
                    .expect("four app sides");
                revokes.push_back((third, rng.range(0, 5)));
            }
        }
    }
    let since_delay = rng.range(0, 60);
    // How often the keeper checks who holds the key (the binary's every 0.5–2 s, here
    // sooner so that rotations come while the streams are busy).
    let every = Duration::from_millis(rng.range(1, 20));
    // In some schedules a second reliable publisher counts at the gate (a stream with
    // nothing to send), settling up to 200 ms after a rotation begins; in some of those it
    // ends up to 150 ms into a rotation and a new one takes its place (a stream starting
    // again), which settles that long after it joined.
    let other_publisher = rng.chance(0.3).then(|| rng.range(0, 200));
    let other_restarts = other_publisher.and_then(|_| rng.chance(0.5).then(|| rng.range(0, 150)));
    // When the device side restarts (a new run under the same group key), in some schedules.
    let mut restarts: VecDeque<u64> = VecDeque::new();
    if rng.chance(0.4) {
        let mut at = vec![rng.range(30, 560)];
        if rng.chance(0.3) {
            at.push(rng.range(30, 560));
        }
        // Several in a row in some schedules (up to seven restarts, each run short, before a
        // slow app side joins again).
        if rng.chance(0.2) {
            let base = rng.range(30, 400);
            at.extend((0..rng.range(3, 5)).map(|i| base + i * rng.range(1, 30)));
        }
        at.sort_unstable();
        restarts.extend(at);
    }
    // In some schedules the device side also dies while a rotation is under way: a restart
    // some steps after a rotation begins (at its gate, while it reads where the stream
    // stands, while its sink holds a frame under the old key, or just after it completes).
    let crash_in_rotation = rng.chance(0.3);
    // How many steps the device's join answer may take between taking the keys and noting
    // the holder, and its rotation between the keys' change and the holders file (none in
    // half the schedules).
    let note_gap = if rng.chance(0.5) { 30 } else { 0 };
    let mut holders_cleared_at: Option<u64> = None;
    // When an app side's process ends and a new one starts, in some schedules: (side, step).
    let mut app_restarts: VecDeque<(usize, u64)> = VecDeque::new();
    if rng.chance(0.3) {
        let mut at: Vec<(usize, u64)> = (0..rng.range(1, 2))
            .map(|_| (rng.range(0, n_apps as u64 - 1) as usize, rng.range(30, 560)))
            .collect();
        at.sort_by_key(|r| r.1);
        app_restarts.extend(at);
    }
    let mut app_processes = 0u32;
    // How often JetStream loses what it acknowledged (none in most schedules).
    let lose = if rng.chance(0.3) { 0.01 } else { 0.0 };
    // Where each genuine frame was stored: (publisher, frame) → stream sequences.
    let mut stores: HashMap<(Option<u8>, u64), Vec<u64>> = HashMap::new();
    // The key generation each device message stored was sealed under, by stream sequence.
    let mut down_gens: HashMap<u64, u8> = HashMap::new();
    // The rotations the device died in, completed by the next process where the stream stood
    // as they began: (the new key's generation, that sequence).
    let mut crashed: Vec<(u8, u64)> = Vec::new();
    // Restarts mid-rotation, and those with the device's sink holding a frame.
    let (mut mid_rotation, mut held_at_restart) = (0u32, 0u32);
    // When the consumers last delivered their unacknowledged messages again.
    let mut redelivered = t0;
    let adversary = rng.range(0, 3) as f64 * 0.02;
    // Rekey notices go on core NATS: in some schedules it loses some. On their way: (side,
    // step due, note); every one sent, for the adversary to replay.
    let mut rekeys = Rekeys {
        loss: if rng.chance(0.5) { 0.2 } else { 0.0 },
        n_apps,
        on_way: Vec::new(),
        sent: Vec::new(),
    };
    // The device's wall clock (ns) at step 0: set back at some restarts (notices count by run
    // first, then by clock).
    let mut clock0: u64 = 1 << 40;
    let clock = |c0: u64, step: u64| c0 + step * 1_000_000;
    let device_fp = IDS.with(|(device, _)| device.fingerprint());
    let mut js = Js::default();
    let mut recorded: Vec<(u16, Bytes)> = Vec::new();
    // Some app sides read slowly: they take frames under the old key after the new one.
    let mut apps: Vec<App> = (0..n_apps)
        .map(|i| {
            let pace = if rng.chance(0.3) { 0.15 } else { 1.0 };
            App::new(i as u8, first, pace)
        })
        .collect();
    let mut d = Device {
        keys: first,
        keeper: Keeper::new(t0, first, every),
        holders: fps.clone(),
        trusted: vec![true; n_apps],
        rx: Receiver::new(UP, false, first, false, WAIT),
        consumer: Consumer::new(UP),
        held: false,
        tx: Sender::new(DOWN, first, true, None, true).unwrap(),
        next: 0,
        gen: 0,
        rotating: false,
        rotations: 0,
        sealed: HashSet::new(),
        ids: HashMap::new(),
        got: HashMap::new(),
        runs: vec![(RUN, 0)],
        got_now: HashSet::new(),
        again: 0,
    };
    // The revoked sides and their rotations' sequences; when the rotation under way began.
    // (side, sequence, the last key generation it may hold)
    let mut revoked: Vec<(usize, u64, u8)> = Vec::new();
    let mut rotating_since: Option<u64> = None;
    // Where the stream stood when the rotation under way began (a rotation the device did
    // not complete keeps out what the revoked side stored after that).
    let mut rotation_began: Option<u64> = None;
    // The device's files in its home, as fanout's KeyKeeper writes them: the key file and
    // the file of retired keys (the holders file is `d.holders`). A restarted device side
    // reads its keys back from them (`Home::group_key`).
    let mut key_file = first.key;
    let mut previous_file: Vec<u8> = Vec::new();
    // When the keeper's read of where the stream stands answers.
    let mut reading_at: Option<u64> = None;
    // When the rotation under way began (the other publisher's clock).
    let mut rotated_at: Option<Instant> = None;
    // The gate's count, as `drive/keeper.rs`'s `RotationGate` keeps it: the device's
    // reliable publisher, and the other one (its number, since when it counts, the rotation
    // it last started again in).
    let mut gate = Gate::default();
    let mut device_publisher = gate.join();
    let mut other = other_publisher.map(|after| (gate.join(), after, None::<Instant>, 0u8));
    // The next rotation's step (the second one's counts from the first's completion).
    let mut next_at = revokes.front().map(|r| r.1);
    // Publishes on their way: (subject, publisher: an app or the device).
    let mut flight: Vec<(u16, Option<usize>, Publish)> = Vec::new();
    let mut step = 0u64;
    let limit = 20_000u64;
    // Time the quiet phase jumped.
    let mut skew = Duration::ZERO;
    loop {
        step += 1;
        let now = t0 + Duration::from_millis(step) + skew;
        let busy = step < 600;
        if step > limit {
            let waiting: Vec<String> = apps
                .iter()
                .map(|a| {
                    format!(
                        "(through {}, holds nothing {}, asking {}, learning {}, settled {})",
                        a.consumer.caught_up(&js),
                        a.rx.holds_nothing(),
                        a.asking,
                        a.learning.is_some(),
                        a.tx.outbox.is_settled()
                    )
                })
                .collect();
            eprintln!(
                "device: through {}, holds nothing {}, held {}, rotating {}, settled {}; app sides {waiting:?}",
                d.consumer.caught_up(&js),
                d.rx.holds_nothing(),
                d.held,
                d.rotating,
                d.tx.outbox.is_settled()
            );
            return Err(format!(
                "did not settle (revoked {revoked:?}, adversary {adversary}): device got {} frames, apps got {:?} of {}, in flight {}",
                d.got.len(),
                apps.iter().map(|a| a.got.len()).collect::<Vec<_>>(),
                d.next,
                flight.len()
            ));
        }
        // The device side restarts, also while a rotation is under way: a new run, the group
        // key as its files keep it; its durable consumer delivers what the process before did
        // not acknowledge again; what it had handed the client and not seen acknowledged was
        // stored or not; every app side hears of the run (fanout's announcement) and joins
        // again.
        if busy && restarts.front().is_some_and(|&at| step >= at) {
            restarts.pop_front();
            let last = d.runs.last().map_or(RUN, |r| r.0);
            let run = Run {
                id: last.id + 1,
                began: js.last(),
            };
            let mut i = 0;
            while i < flight.len() {
                if flight[i].1.is_some() {
                    i += 1;
                    continue;
                }
                let (subject, _, p) = flight.swap_remove(i);
                if rng.chance(0.5) {
                    let s = js.store(subject, p.id.as_deref(), p.body.clone());
                    recorded.push((subject, p.body.clone()));
                    if let Some(r) = FrameRecord::parse(&p.body) {
                        stores.entry((None, r.seq)).or_default().push(s);
                    }
                    if let Some(g) = p.id.as_deref().and_then(|id| d.ids.get(id)) {
                        down_gens.insert(s, *g);
                    }
                }
            }
            d.got_now.clear();
            // The keys as the files hold them (`Home::group_key`): the key file, the retired
            // keys, the runs.
            let earlier = d.keys.next_run(run).earlier;
            let back = parse_retired(&previous_file)
                .map_err(|n| format!("the retired keys file has {n} bytes"))?;
            d.keys = back.under(GroupKey {
                earlier,
                ..GroupKey::first(key_file, run)
            });
            if back.pending {
                // A rotation under way, complete as of where the stream stood when it began,
                // and written so.
                previous_file = encode_retired(&d.keys);
            }
            if rotating_since.take().is_some() {
                // It died mid-rotation: what the revoked side stored after the rotation began
                // is out; the next revocation counts from now.
                let began = rotation_began.expect("a rotation began");
                for r in revoked.iter_mut().filter(|r| r.1 == SINCE_PENDING) {
                    r.1 = began;
                }
                crashed.push((d.rotations, began));
                mid_rotation += 1;
                held_at_restart += u32::from(d.held);
                next_at = revokes.front().map(|r| step + r.1);
            }
            // A new process: its publisher seals under the keys it read, and nothing of a
            // rotation is under way; a new gate.
            d.gen = d.rotations;
            d.rotating = false;
            // A rotation whose holders file was not written yet: it still names the revoked
            // side, whose next check rotates once more.
            holders_cleared_at = None;
            // Answers under way die with the process (their joins are answered by the next).
            for a in apps.iter_mut() {
                a.handout = None;
            }
            reading_at = None;
            rotated_at = None;
            gate = Gate::default();
            device_publisher = gate.join();
            if let Some((id, _, joined, _)) = other.as_mut() {
                *id = gate.join();
                *joined = None;
            }
            d.rx = Receiver::new(UP, false, d.keys, false, WAIT);
            d.held = false;
            d.consumer.redeliver();
            d.tx = Sender::new(DOWN, d.keys, true, None, true).unwrap();
            d.runs.push((run, d.next));
            if rng.chance(0.3) {
                clock0 -= rng.range(1, 5_000) * 1_000_000;
            }
            // A new process, a new keeper: it checks at once, and its notice tells the app
            // sides of the run.
            d.keeper = Keeper::new(now, d.keys, every);
        }
        // The revocation (`ndd untrust`): the keeper's next check rotates the key. (It
        // checks again only once a rotation is complete.)
        if !d.keeper.rotating() && next_at.is_some_and(|at| step >= at) {
            let (r, _) = revokes.pop_front().expect("a revocation is due");
            d.trusted[r] = false;
            next_at = None;
            if !d.holders.contains(&fps[r]) {
                // It had not joined since the last rotation: it holds no key it could use,
                // and no rotation comes.
                revoked.push((r, js.last(), d.rotations));
                next_at = revokes.front().map(|r| step + r.1);
            }
        }
        // The keeper, driven as fanout's KeyKeeper drives it: the gate counts the device's
        // reliable publisher settled once every publish under the old key is acknowledged
        // (its SourceFlow says so), and the other one, if any, some steps after the rotation
        // began (or after it joined, when it started again mid-rotation); where the stream
        // stands is read a little after the gate opens.
        if let Some(t) = rotated_at.filter(|_| d.rotating) {
            if d.tx.outbox.is_settled() {
                gate.settled(device_publisher);
            }
            if let Some((id, after, joined, restarted_in)) = other.as_mut() {
                let ms = Duration::from_millis;
                if other_restarts.is_some_and(|r| *restarted_in != d.rotations && now >= t + ms(r))
                {
                    gate.leave(*id);
                    *id = gate.join();
                    *joined = Some(now);
                    *restarted_in = d.rotations;
                }
                if now >= joined.map_or(t, |j| j.max(t)) + ms(*after) {
                    gate.settled(*id);
                }
            }
        }
        if holders_cleared_at.is_some_and(|at| step >= at) {
            holders_cleared_at = None;
            d.holders.clear();
        }
        let (publishers, settled) = gate.counts();
        d.keeper.handle_gate(publishers, settled);
        // (Its next action once the rotation's files are written.)
        while let Some(a) = holders_cleared_at
            .is_none()
            .then(|| d.keeper.poll(now))
            .flatten()
        {
            match a {
                KeeperAction::Check => {
                    let trusted = |h: &str| {
                        fps.iter()
                            .position(|f| f == h)
                            .is_some_and(|i| d.trusted[i])
                    };
                    let fresh = [0x22 + 0x11 * d.rotations; 32];
                    d.keeper.handle_check(now, &d.holders, trusted, fresh);
                }
                KeeperAction::Rotate { keys, revoked: who } => {
                    for fp in &who {
                        let r = fps.iter().position(|f| f == fp).expect("a known side");
                        if d.trusted[r] {
                            return Err(format!("rotated away from {fp}, still trusted"));
                        }
                        revoked.push((r, SINCE_PENDING, d.rotations));
                    }
                    d.keys = keys;
                    // Its files: the retired keys with the rotation under way (where the
                    // stream stands as it begins), the key file, the holders file emptied.
                    previous_file = encode_pending(&keys, js.last());
                    key_file = keys.key;
                    // (The holders file last, after where the stream stands is read: fanout's
                    // KeyKeeper awaits it between the keys' change and the files.)
                    holders_cleared_at = Some(step + rng.range(0, note_gap));
                    d.rotating = true;
                    d.rotations += 1;
                    rotating_since = Some(step);
                    rotation_began = Some(js.last());
                    rotated_at = Some(now);
                    gate.begin();
                    // Up to eight runs in all (`EARLIER_RUNS`).
                    if crash_in_rotation
                        && busy
                        && d.runs.len() + restarts.len() < 8
                        && rng.chance(0.6)
                    {
                        let at = step + rng.range(1, 30 + since_delay);
                        let i = restarts.partition_point(|&x| x <= at);
                        restarts.insert(i, at);
                    }
                }
                KeeperAction::ReadPosition { settled } => {
                    if !settled {
                        return Err("the rotation's gate ran out of time".into());
                    }
                    reading_at = Some(step + since_delay);
                }
                KeeperAction::Complete { keys, retired } => {
                    // What a restarted device side would read back.
                    let back = parse_retired(&retired)
                        .map_err(|n| format!("the retired keys file has {n} bytes"))?
                        .under(GroupKey::first(keys.key, keys.run));
                    if (back.since, back.previous, back.older, back.retired)
                        != (keys.since, keys.previous, keys.older, keys.retired)
                    {
                        return Err(format!("retired keys read back as {back:?}, not {keys:?}"));
                    }
                    d.keys = keys;
                    previous_file = retired;
                    for r in revoked.iter_mut().filter(|r| r.1 == SINCE_PENDING) {
                        r.1 = keys.since;
                    }
                    rotating_since = None;
                    next_at = revokes.front().map(|r| step + r.1);
                }
                KeeperAction::Announce(keys) => {
                    rekeys.announce(&mut rng, &keys, clock(clock0, step), step)
                }
            }
        }
        if reading_at.is_some_and(|at| step >= at) {
            reading_at = None;
            d.keeper.handle_position(now, js.last());
        }
        // The device publishes its frames; after a rotation, once it knows where the
        // rotation began and every publish is acknowledged, what it sealed under the old key
        // and was stored after goes again under the new one first.
        if d.rotating {
            if d.keys.since != SINCE_PENDING {
                // What it sealed under the key it held and was stored after that key's
                // rotation (the first it had not followed) goes again, once every publish is
                // acknowledged (the binary's Sender).
                match d.tx.follow(d.keys).map_err(|e| e.to_string())? {
                    Follow::Settle => {}
                    Follow::Same => d.rotating = false,
                    Follow::Again(again) => {
                        // Both rotations at once when it follows late: generation = key.
                        d.gen = d.rotations;
                        d.rotating = false;
                        for n in again {
                            d.publish(now, n);
                        }
                    }
                }
            }
        } else if d.next < FRAMES && busy && rng.chance(0.15) {
            let n = d.next;
            d.publish(now, n);
            d.next += 1;
        }
        d.tx.outbox.handle_timeout(now);
        while let Some(p) = d.tx.outbox.poll_transmit() {
            flight.push((DOWN, None, p));
        }
        // An app side's process ends between two publishes (each one before acknowledged, all
        // sealed under the device's keys as they stand: frames a newer run or key refused
        // would be sealed again by it, and die with it) and a new one starts: it joins again (answered once a rotation is complete; a side no
        // longer trusted is refused and stays down) and takes the device's stream from its
        // durable consumer's ack floor on.
        if let Some(&(i, at)) = app_restarts.front() {
            let a = &mut apps[i];
            let complete = d.keys.since != SINCE_PENDING;
            if !busy || !d.trusted[i] {
                app_restarts.pop_front();
            } else if step >= at
                && complete
                && a.tx.outbox.is_settled()
                && a.learning.is_none()
                && !a.asking
                && a.join.is_none()
                && a.follower.is_idle()
                && a.tx.keys() == d.keys
            {
                app_restarts.pop_front();
                a.restart(d.keys, js.log.len() as u64);
                app_processes += 1;
                if !d.holders.contains(&fps[i]) {
                    d.holders.push(fps[i].clone());
                }
            }
        }
        // Rekey notices reach the app sides; the adversary replays recorded ones to any of
        // them, and forges: signed by a stranger, signed by the device for another driver,
        // bytes changed. No forged one may send a side joining.
        let mut k = 0;
        while k < rekeys.on_way.len() {
            if rekeys.on_way[k].1 > step {
                k += 1;
                continue;
            }
            let (i, _, note) = rekeys.on_way.swap_remove(k);
            let _ = apps[i].follower.handle_notice(&note, |fp| fp == device_fp);
        }
        if rng.chance(adversary) {
            let i = rng.range(0, n_apps as u64 - 1) as usize;
            let f = &mut apps[i].follower;
            match rng.range(0, 3) {
                0 if !rekeys.sent.is_empty() => {
                    let sent = &rekeys.sent;
                    let note = &sent[rng.range(0, sent.len() as u64 - 1) as usize];
                    let _ = f.handle_notice(note, |fp| fp == device_fp);
                }
                1 => {
                    let note = IDS.with(|(_, stranger)| {
                        let n = Notice {
                            run: u64::MAX,
                            clock: u64::MAX,
                            key: [7; 8],
                        };
                        stranger.sign_note(&label(), &notice_body(&n))
                    });
                    let got = f.handle_notice(&note.expect("sign"), |fp| fp == device_fp);
                    if !matches!(got, Err(Ignored::Untrusted(_))) {
                        return Err(format!("a stranger's notice was taken: {got:?}"));
                    }
                }
                2 => {
                    let other = notice_label(&Subjects::new("ndd", "other").expect("subjects"));
                    let note = IDS.with(|(device, _)| {
                        let n = Notice {
                            run: u64::MAX,
                            clock: u64::MAX,
                            key: [7; 8],
                        };
                        device.sign_note(&other, &notice_body(&n))
                    });
                    let got = f.handle_notice(&note.expect("sign"), |fp| fp == device_fp);
                    if !matches!(got, Err(Ignored::NotSigned(_))) {
                        return Err(format!("another driver's notice was taken: {got:?}"));
                    }
                }
                _ if !rekeys.sent.is_empty() => {
                    let sent = &rekeys.sent;
                    let mut note = sent[rng.range(0, sent.len() as u64 - 1) as usize].clone();
                    let at = rng.range(0, note.len() as u64 - 1) as usize;
                    note[at] ^= 1 << rng.range(0, 7);
                    let got = f.handle_notice(&note, |fp| fp == device_fp);
                    if got.is_ok() {
                        return Err(format!("a notice with byte {at} changed was taken"));
                    }
                }
                _ => {}
            }
        }
        // The app sides: join when their follower says (answered once a rotation is complete;
        // a side no longer trusted is refused), follow a rotation, publish.
        for (i, a) in apps.iter_mut().enumerate() {
            let complete = d.keys.since != SINCE_PENDING;
            // The device's answer: the keys taken once no rotation is under way, then, some
            // steps later in some schedules (fanout's JoinService between its wait for the
            // rotation and its admission: another thread's keeper may begin a rotation there),
            // the admission decided, the side noted as a holder, and the keys taken sent.
            if a.join.is_some_and(|at| step >= at) && complete && a.handout.is_none() {
                let out = HandOut::take(d.keys, None).ok_or("keys taken mid-rotation")?;
                a.handout = Some((out, step + rng.range(0, note_gap)));
            }
            if let Some((out, _)) = a.handout.take_if(|h| step >= h.1) {
                a.join = None;
                let joined = if d.trusted[i] {
                    if !d.holders.contains(&fps[i]) {
                        d.holders.push(fps[i].clone());
                    }
                    match out.noted(Ok(())) {
                        Welcome::Admitted(adm) => Joined::Admitted {
                            keys: Box::new(adm.keys()),
                            slot: adm.slot,
                        },
                        w => return Err(format!("noted and refused: {w:?}")),
                    }
                } else {
                    Joined::Refused("no longer trusted".into())
                };
                match a.follower.handle_join(joined) {
                    Ok(()) => {}
                    Err(FollowEnd::Refused(_)) => a.refused = true,
                    Err(e) => return Err(e.to_string()),
                }
                // What the follower says (fanout's KeyFollower): new keys, and the answer to
                // whoever asked before the join went.
                while let Some(e) = a.follower.poll_event() {
                    match e {
                        FollowEvent::Followed(f) => a.learn(f.keys, now),
                        FollowEvent::Answered { .. } if std::mem::take(&mut a.answering) => {
                            a.asking = false;
                            a.rx.asked(now).map_err(|e| format!("app receiver: {e}"))?;
                        }
                        FollowEvent::Answered { .. } | FollowEvent::Behind { .. } => {}
                    }
                }
            }
            if a.join.is_none() && !a.refused {
                match a.follower.poll_io(now) {
                    Some(FollowIo::Join) => {
                        a.answering = a.asking;
                        a.join = Some(step + rng.range(1, 20));
                    }
                    Some(io) => {
                        return Err(format!(
                            "{io:?} asked, with a device side that always answers"
                        ))
                    }
                    None => {}
                }
            }
            if a.refused && a.asking {
                a.asking = false;
                a.rx.asked(now).map_err(|e| format!("app receiver: {e}"))?;
            }
            if let Some(k) = a.learning {
                // What was stored after the rotation of the key it sealed under, or after the
                // first device run it missed began, goes again, once every publish is
                // acknowledged (the binary's Sender).
                match a.tx.follow(k).map_err(|e| e.to_string())? {
                    Follow::Settle => {}
                    Follow::Same => a.learning = None,
                    Follow::Again(again) => {
                        a.learning = None;
                        for n in again {
                            a.publish(now, n);
                        }
                    }
                }
            } else if a.next < FRAMES && busy && rng.chance(0.1) {
                let n = a.next;
                a.publish(now, n);
                a.next += 1;
            }
            a.tx.outbox.handle_timeout(now);
            while let Some(p) = a.tx.outbox.poll_transmit() {
                flight.push((UP, Some(i), p));
            }
        }
        // The broker: each publish stored, lost, stored with its acknowledgement lost, or
        // left for later (stored out of order).
        let mut i = 0;
        while i < flight.len() {
            let settle = if busy {
                rng.chance(0.3)
            } else {
                rng.chance(0.8)
            };
            if !settle {
                i += 1;
                continue;
            }
            let (subject, who, p) = flight.swap_remove(i);
            let roll = if busy { rng.range(0, 9) } else { 0 };
            let result = match roll {
                0..=6 | 9 => {
                    let s = js.store(subject, p.id.as_deref(), p.body.clone());
                    recorded.push((subject, p.body.clone()));
                    if let Some(r) = FrameRecord::parse(&p.body) {
                        let who = who.map(|a| apps[a].id);
                        stores.entry((who, r.seq)).or_default().push(s);
                    }
                    if let Some(g) = p.id.as_deref().filter(|_| who.is_none()) {
                        if let Some(g) = d.ids.get(g) {
                            down_gens.insert(s, *g);
                        }
                    }
                    // Acknowledged, then lost in a restart before it was written.
                    if s == js.last() && busy && rng.chance(lose) {
                        js.lost.insert(s);
                    }
                    if roll == 9 {
                        Err(())
                    } else {
                        Ok(s)
                    }
                }
                _ => {
                    // Not stored, but a subscriber of the subject saw it go by. (Not an app
                    // side's: stored by someone else before the app side publishes it again,
                    // with a rotation between the two, the device would take that frame twice
                    // — once as the copy, once sealed again under the new key; a known limit,
                    // docs/security.md.)
                    if subject == DOWN {
                        recorded.push((subject, p.body.clone()));
                    }
                    Err(())
                }
            };
            match who {
                Some(a) => apps[a].tx.outbox.handle_ack(now, p.token, result),
                None => d.tx.outbox.handle_ack(now, p.token, result),
            }
        }
        // The adversary.
        if busy && !recorded.is_empty() && rng.chance(adversary) {
            let (subject, body) =
                recorded[rng.range(0, recorded.len() as u64 - 1) as usize].clone();
            let body = tamper(&mut rng, &body);
            js.store(subject, None, body);
        }
        // At the place the app sides wait for next (the one after the last device record
        // stored), or at one JetStream lost: a record naming the run, with a genuine sealed
        // header and a junk body, stored also for a while after the device went quiet (100 s).
        if step < 700 && rng.chance(adversary) {
            let last = js
                .log
                .iter()
                .rev()
                .find(|(subj, _)| *subj == DOWN)
                .and_then(|(_, b)| FrameRecord::parse(b));
            if let Some(mut r) = last {
                let lost = js
                    .lost
                    .iter()
                    .filter_map(|s| FrameRecord::parse(&js.log[*s as usize - 1].1))
                    .filter(|x| x.stream == DOWN)
                    .map(|x| x.wseq)
                    .min();
                r.wseq = match lost {
                    Some(w) if rng.chance(0.5) => w,
                    _ => r.wseq + 1,
                };
                let mut p = r.payload.to_vec();
                for x in p.iter_mut().skip(24) {
                    *x = rng.range(0, 255) as u8;
                }
                if rng.chance(0.3) {
                    p.truncate(rng.range(0, 39) as usize);
                }
                r.payload = Bytes::from(p);
                js.store(DOWN, None, r.encode());
            }
        }
        if busy && rng.chance(adversary / 4.0) {
            let mut b = vec![0u8; rng.range(0, 80) as usize];
            rng.fill(&mut b);
            js.store(
                if rng.chance(0.5) { UP } else { DOWN },
                None,
                Bytes::from(b),
            );
        }
        // The device's sink: what its intake lets through, then one more message.
        let published: HashMap<u8, u64> = apps
            .iter()
            .flat_map(|a| a.before.iter().copied().chain([(a.id, a.next)]))
            .collect();
        for _ in 0..rng.range(0, 4) {
            // The keys as they stand when it reads (fanout's sinks follow a watch: two
            // changes between two reads are seen as one).
            if d.rx.opener().keys() != d.keys {
                d.rx.handle_keys(now, d.keys);
            }
            loop {
                match d
                    .rx
                    .poll(now)
                    .map_err(|e| format!("device receiver: {e}"))?
                {
                    Poll::Event(Event::Frame { frame, stored, .. }) => {
                        device_took(&mut d, &frame, stored, &revoked, &published)?
                    }
                    // A genuine frame of its earlier run: the app sides are told to join.
                    Poll::Event(Event::TellRun) => d.keeper.handle_stale(now),
                    Poll::Event(_) => {}
                    Poll::Wait(Wait::Key) => return Err("a device side asked for the key".into()),
                    Poll::Wait(Wait::Rotation) => {
                        d.held = true;
                        break;
                    }
                    Poll::Idle => {
                        d.held = false;
                        break;
                    }
                }
            }
            if d.held {
                continue;
            }
            let Some((seq, body)) = d.consumer.poll(&js, &mut rng) else {
                break;
            };
            d.rx.handle_message(now, &body, Some((Some(seq), seq)));
        }
        // The app sides' sinks, the same way; a frame that asks waits for a join's answer.
        for (i, a) in apps.iter_mut().enumerate() {
            // The revoked side: nothing sealed after the rotation (a later generation).
            let revoked_after = revoked.iter().find(|(r, ..)| *r == i).map(|r| r.2);
            // (Once time goes a second a step, every side reads: a 30 s stall of a sink is
            // not what this explores.)
            let reads = if !busy {
                rng.range(1, 4)
            } else if rng.chance(a.pace) {
                rng.range(0, 4)
            } else {
                0
            };
            for _ in 0..reads {
                if a.asking {
                    // Waiting for its join's answer.
                    break;
                }
                loop {
                    match a.rx.poll(now).map_err(|e| format!("app receiver: {e}"))? {
                        Poll::Event(Event::Frame { frame, .. }) => {
                            app_took(a, &frame, &d.sealed, revoked_after)?
                        }
                        // The device restarted: join again to learn its run.
                        Poll::Event(Event::NewerRun) => a.follower.handle_ask(),
                        Poll::Event(_) => {}
                        Poll::Wait(Wait::Key) => {
                            a.asking = true;
                            a.follower.handle_ask();
                            break;
                        }
                        Poll::Wait(Wait::Rotation) => {
                            return Err("an app side waits for where a rotation began".into())
                        }
                        Poll::Idle => break,
                    }
                }
                if a.asking {
                    continue;
                }
                let Some((seq, body)) = a.consumer.poll(&js, &mut rng) else {
                    break;
                };
                a.rx.handle_message(now, &body, Some((Some(seq), seq)));
            }
        }
        // Acknowledgements (once nothing is held behind a gap), and JetStream's wait for
        // them: every 5 s what is not acknowledged comes again.
        // (The device's windows are not kept here: a copy it takes again after a restart is
        // counted, `nats_ending` keeps them.)
        for s in d.rx.acks(now, true).map(|a| a.msgs).unwrap_or_default() {
            d.consumer.ack(s);
        }
        for a in apps.iter_mut() {
            // What the acknowledgements name is written first (the binary's position file).
            let Some(acks) = a.rx.acks(now, true) else {
                continue;
            };
            a.kept = acks.kept.or(a.kept);
            for s in acks.msgs {
                a.consumer.ack(s);
            }
        }
        if now.saturating_duration_since(redelivered) >= ACK_WAIT {
            redelivered = now;
            d.consumer.redeliver();
            for a in apps.iter_mut() {
                a.consumer.redeliver();
            }
        }
        // Once the sources are done and everything stored was read, time goes faster: a
        // second a step (for everything from then on), so gaps are given up (fanout's
        // REORDER_WAIT) and forged records far ahead of the order come out (and prove
        // forged). (Reading is not slowed by it: a side reads a few messages a step, thousands
        // a second in truth.)
        let read_all = |c: &Consumer| c.next >= js.log.len();
        if !busy
            && flight.is_empty()
            && d.tx.outbox.is_settled()
            && read_all(&d.consumer)
            && apps
                .iter()
                .all(|a| a.tx.outbox.is_settled() && read_all(&a.consumer))
        {
            skew += Duration::from_secs(1);
        }
        d.rx.handle_timeout(now);
        for a in apps.iter_mut() {
            a.rx.handle_timeout(now);
        }
        // Done: nothing on its way, every consumer through, every app side settled.
        if !busy
            && flight.is_empty()
            && !d.held
            && d.consumer.caught_up(&js)
            && d.rx.holds_nothing()
            && d.keys.since != SINCE_PENDING
            && !d.rotating
            && d.tx.outbox.is_settled()
            && apps.iter().enumerate().all(|(i, a)| {
                // The revoked side's order waits for good at the first frame it cannot open
                // (to it, a forgery): it takes nothing more.
                let through = a.consumer.caught_up(&js) && a.rx.holds_nothing();
                (through || !d.trusted[i])
                    && !a.asking
                    && (!d.trusted[i]
                        || (a.learning.is_none()
                            && a.tx.keys() == d.keys
                            && a.join.is_none()
                            && a.follower.is_idle()))
                    && a.tx.outbox.is_settled()
            })
        {
            break;
        }
    }
    // Exact for the trusted: every frame of every app side never revoked, every device frame
    // at every trusted app side.
    for (i, a) in apps.iter().enumerate() {
        if !d.trusted[i] {
            continue;
        }
        // What JetStream lost for good is not owed: a frame whose last copy stored (the one
        // published last, after a rotation the one sealed again) it lost.
        let lost = |who: Option<u8>, n: u64| {
            stores
                .get(&(who, n))
                .and_then(|v| v.iter().max())
                .is_some_and(|s| js.lost.contains(s))
        };
        // Every process's frames: the one that ended had each publish acknowledged.
        for (id, next) in a.before.iter().copied().chain([(a.id, a.next)]) {
            if let Some(n) =
                (0..next).find(|n| !d.got.contains_key(&(id, *n)) && !lost(Some(id), *n))
            {
                return Err(format!(
                    "app {i} (process {}) frame {n} never reached the device (of {next}; revoked {revoked:?}; stored at {:?}, lost {:?}; {:?})",
                    id >> 4,
                    stores.get(&(Some(id), n)),
                    stores.get(&(Some(id), n)).map(|v| v.iter().map(|s| js.lost.contains(s)).collect::<Vec<_>>()),
                    d.rx.opener()
                ));
            }
        }
        if a.out_of_order > 0 {
            return Err(format!(
                "trusted app {i} delivered {} device frame(s) after a later one (revoked {revoked:?}, device runs {:?})",
                a.out_of_order,
                d.runs
            ));
        }
        // A device frame of a run that was not the last is owed only if it was stored before
        // the next run began (one stored later is refused as a replay; one never stored died
        // with its process). One sealed under a key a rotation retired that the device died
        // in is owed only if stored before that rotation began: after it, only the gate, gone
        // with the process, could tell it from one the revoked side stored.
        let owed = |n: u64| {
            let last = stores.get(&(None, n)).and_then(|v| v.iter().max());
            if crashed.iter().any(|&(gen, since)| {
                last.is_some_and(|s| *s > since && down_gens.get(s).is_some_and(|g| *g < gen))
            }) {
                return false;
            }
            let r = d
                .runs
                .iter()
                .rposition(|(_, first)| *first <= n)
                .unwrap_or(0);
            match d.runs.get(r + 1) {
                None => !lost(None, n),
                Some((next, _)) => stores
                    .get(&(None, n))
                    .and_then(|v| v.iter().max())
                    .is_some_and(|s| !js.lost.contains(s) && *s <= next.began),
            }
        };
        if let Some(n) = (0..d.next).find(|n| !a.got.contains(n) && owed(*n)) {
            let stored: Vec<(usize, u64)> = (js.log.iter().enumerate())
                .filter_map(|(k, (subj, b))| {
                    let r = FrameRecord::parse(b).filter(|r| *subj == DOWN && r.seq == n)?;
                    Some((k + 1, r.wseq))
                })
                .collect();
            return Err(format!(
                "device frame {n} never reached trusted app {i} (revoked {revoked:?}; stored at, subject sequence: {stored:?}; {:?})",
                a.rx.opener()
            ));
        }
    }
    Ok(format!(
        "{n_apps} app sides ({app_processes} restarted, {} device frames delivered again), {} device run(s) ({mid_rotation} begun mid-rotation, {held_at_restart} with a frame held), revoked (side, since, generation) {revoked:?}, {} messages stored, device took {} frames ({} again after a restart), dropped {} ({} under the old key after the rotation)",
        apps.iter().map(|a| a.again).sum::<u64>(),
        d.runs.len(),
        js.last(),
        d.got.len(),
        d.again,
        d.rx.opener().dropped,
        d.rx.opener().after_rotation
    ))
}

#[test]
fn revoking_an_app_side_mid_stream_keeps_it_out_and_every_trusted_stream_exact() {
    ndd_testkit::explore("nats_keys", 1000, run);
}

//! The NATS fan-out's replay rules over 1000 random schedules (issue 31, item 2): a device
//! side that runs 2–4 times (its clock jumping back and forth between runs), one reliable
//! stream (stored, JetStream's order, copies from redelivery and from republishing after a
//! server restart) and one lossy stream (core NATS: loss, duplication, neighbours swapped), an
//! app side that joins in some run and may restart mid-run (its durable consumer goes on from
//! what it acknowledged), and an adversary who records every message and, at any moment, plays
//! recorded ones back on either path, rewrites their headers to name the current run (or a
//! newer one, or another start) and publishes garbage.
//!
//! The receiver is the app side's sink path of `crates/link/src/nats/drive/sink.rs`: each stream's
//! `ndd_link::nats::receive::Receiver`, the binary's own, made of its `Intake` (the record
//! parsed, one naming
//! another stream than its subject's refused, a stored copy known by its sealed header, a
//! lossy frame numbered at or below the last one taken of its run dropped, stored frames put
//! back in their subject order, a stored frame numbered at or below the last one taken of its
//! run dropped), the run checked by `ndd_link::nats::runs::RunGuard`, the frame opened under
//! its run's key (`run_key`) by the real `encrypt` inverse, a newer run taken once it opened,
//! the END and restarts told by the intake. Properties, per app side process:
//!
//! - everything delivered is a genuine frame (its payload is what the device sealed), each
//!   (run, stream, sequence) at most once, each run's frames of a stream in rising order;
//! - nothing of a run earlier than the one the process joined in is delivered unless it was
//!   stored before that run began;
//! - the reliable stream is exact: every frame the device published after the app side's
//!   consumer began is delivered, by one process or the next, before the run's END is taken;
//!   an END is taken only for a run whose device side ended it, and, taken when nothing
//!   stored waits behind a gap or for redelivery, only after every frame of its run.
//!
//! `SEED=n cargo test -p ndd-testkit --test nats_runs` replays one schedule.

mod common;

use bytes::Bytes;
use common::RunInverse;
use ndd_core::{Frame, Meta, Output};
use ndd_link::nats::keys::GroupKey;
use ndd_link::nats::receive::{Event, Poll, Receiver, Wait};
use ndd_link::nats::record::{FrameRecord, END_SEQ};
use ndd_link::nats::runs::{next_run_id, run_key, Run};
use ndd_modules::encrypt::key::Key;
use ndd_modules::encrypt::{Cipher, EncryptForward};
use ndd_testkit::SimRng;
use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Instant;

const REL: u16 = 1;
const LOSSY: u16 = 2;
const GROUP: [u8; 32] = [0x42; 32];
/// How long stored frames wait behind a gap (the sim gives gaps up by moving time past it).
const WAIT: std::time::Duration = std::time::Duration::from_secs(3600);

/// A message on the server (the device's, a copy the broker made, or the adversary's: the
/// properties judge what is delivered, not where it came from).
#[derive(Clone)]
struct Msg {
    body: Bytes,
}

/// The genuine payload of frame `seq` of `stream` in run `run`.
fn payload(run: u64, stream: u16, seq: u64) -> Vec<u8> {
    let mut p = run.to_be_bytes().to_vec();
    p.extend_from_slice(&stream.to_be_bytes());
    p.extend_from_slice(&seq.to_be_bytes());
    p
}

/// The device side of one run: seals under the run's key.
struct Device {
    run: Run,
    seal: EncryptForward,
    wseq: [u64; 3],
}

impl Device {
    fn new(run: Run) -> Device {
        Device {
            run,
            seal: EncryptForward::new(&Key::given(run_key(&GROUP, run)), Cipher::Aes256Gcm)
                .unwrap(),
            wseq: [0; 3],
        }
    }

    fn frame(&mut self, stream: u16, seq: u64) -> Bytes {
        let meta = Meta {
            stream,
            seq,
            timestamp_ns: seq,
            flags: 0,
        };
        let body = if seq == END_SEQ {
            Vec::new()
        } else {
            payload(self.run.id, stream, seq)
        };
        let mut out = Output::new();
        // As fanout's Publisher: bound to the subject sequence of its record.
        let wseq = self.wseq[stream as usize];
        self.seal
            .seal_bound(Frame::new(meta, &body), wseq, &mut out)
            .unwrap();
        let f = out.take_frames().pop().unwrap();
        let w = &mut self.wseq[stream as usize];
        let rec = FrameRecord {
            stream,
            flags: 0,
            run: self.run.id,
            began: self.run.began,
            seq,
            timestamp_ns: seq,
            wseq: *w,
            payload: Bytes::copy_from_slice(f.payload()),
        };
        *w += 1;
        rec.encode()
    }
}

/// One app side process: the sink path of fanout — each stream's real
/// `ndd_link::nats::receive::Receiver` (its `Intake`: copies, order, END, restarts; its
/// `Opener`: the run checked by its `RunGuard`, the frame opened under its run's key by the
/// `encrypt` inverse, the sealed subject sequence checked), as the binary's sinks drive it.
struct App {
    joined: Run,
    /// The stored stream's receiver (its handle: the stream sequence) and the lossy one's.
    rel: Receiver<RunInverse, u64>,
    lossy: Receiver<RunInverse, ()>,
    delivered: HashSet<(u64, u16, u64)>,
    last: HashMap<u16, (u64, u64)>,
    /// Runs whose reliable END this process took, and whether nothing stored was held behind
    /// a gap then.
    ended: Vec<(u64, bool)>,
}

impl App {
    fn new(joined: Run) -> App {
        let keys = GroupKey::first(GROUP, joined);
        App {
            joined,
            rel: Receiver::new(REL, true, keys, true, WAIT),
            lossy: Receiver::new(LOSSY, true, keys, false, WAIT),
            delivered: HashSet::new(),
            last: HashMap::new(),
            ended: Vec::new(),
        }
    }

    /// Takes a message (`stored`: its stream sequence); returns what it delivered, as
    /// (run, stream, seq), or why it failed a property.
    fn take(&mut self, body: &Bytes, stored: Option<u64>) -> Result<Vec<(u64, u16, u64)>, String> {
        match stored {
            Some(seq) => {
                self.rel
                    .handle_message(Instant::now(), body, Some((Some(seq), seq)));
            }
            None => {
                self.lossy.handle_message(Instant::now(), body, None);
            }
        }
        self.drain()
    }

    /// Opens what the receivers let through.
    fn drain(&mut self) -> Result<Vec<(u64, u16, u64)>, String> {
        let mut out = Vec::new();
        for rel in [true, false] {
            loop {
                let polled = if rel {
                    self.rel.poll(Instant::now())
                } else {
                    self.lossy.poll(Instant::now())
                };
                let event = match polled {
                    // A record that does not open: dropped (the binary warns).
                    Err(_) => continue,
                    Ok(Poll::Idle) => break,
                    Ok(Poll::Wait(Wait::Key)) => {
                        // The device has no other key: asking brings nothing.
                        let r = if rel {
                            self.rel.asked(Instant::now())
                        } else {
                            self.lossy.asked(Instant::now())
                        };
                        let _ = r;
                        continue;
                    }
                    Ok(Poll::Wait(Wait::Rotation)) => {
                        return Err("held for a rotation where there is none".into())
                    }
                    Ok(Poll::Event(e)) => e,
                };
                out.extend(self.event(event, rel)?);
            }
        }
        Ok(out)
    }

    /// Everything held behind gaps, each gap given up after its wait (as time passes).
    fn give_up_gaps(&mut self) -> Result<Vec<(u64, u16, u64)>, String> {
        let mut t = Instant::now();
        let mut out = self.drain()?;
        while !self.rel.holds_nothing() {
            t += WAIT * 2;
            self.rel.handle_timeout(t);
            out.extend(self.drain()?);
        }
        Ok(out)
    }

    /// What a restarting process leaves unacknowledged behind its gaps: JetStream delivers it
    /// again (the sequence is the handle).
    fn unacked_behind_gaps(&mut self) -> Vec<u64> {
        let mut t = Instant::now();
        let mut held = Vec::new();
        while !self.rel.holds_nothing() {
            t += WAIT * 2;
            self.rel.handle_timeout(t);
            while let Some((_, seq)) = self.rel.intake().poll_record() {
                held.extend(seq);
            }
        }
        held
    }

    /// What the receiver of the stored stream (`rel`) or the lossy one said.
    fn event(&mut self, e: Event, rel: bool) -> Result<Option<(u64, u16, u64)>, String> {
        let (f, run, stored) = match e {
            Event::NewerRun | Event::TellRun => return Ok(None),
            Event::End { run, .. } => {
                if rel {
                    let settled = self.rel.holds_nothing();
                    self.ended.push((run.id, settled));
                }
                return Ok(None);
            }
            Event::Frame {
                frame, run, stored, ..
            } => (frame, run, stored),
        };
        if run.id < self.joined.id && stored.is_none_or(|s| s > self.joined.began) {
            return Err(format!(
                "delivered a frame of run {:x} (stored {stored:?}) in a process that joined run {:x} began {}",
                run.id, self.joined.id, self.joined.began
            ));
        }
        if f.meta.seq == END_SEQ {
            return Err("an END was taken for a frame".into());
        }
        if f.meta.stream != if rel { REL } else { LOSSY } {
            return Err("a frame of another stream came out of a stream's receiver".into());
        }
        if f.payload() != payload(run.id, f.meta.stream, f.meta.seq).as_slice() {
            return Err(format!(
                "delivered a payload the device never sealed: {:?}",
                f.payload()
            ));
        }
        let key = (run.id, f.meta.stream, f.meta.seq);
        if !self.delivered.insert(key) {
            return Err(format!("delivered {key:?} twice"));
        }
        if let Some(&(r, s)) = self.last.get(&f.meta.stream) {
            if r == run.id && f.meta.seq <= s {
                return Err(format!("delivered {key:?} after seq {s} of the same run"));
            }
        }
        self.last.insert(f.meta.stream, (run.id, f.meta.seq));
        Ok(Some(key))
    }
}

/// The adversary's tampering with a recorded message.
fn tamper(rng: &mut SimRng, body: &Bytes, current: Run) -> Bytes {
    let mut b = body.to_vec();
    if b.len() < 44 {
        return Bytes::from(b);
    }
    match rng.range(0, 4) {
        0 => {
            b[4..12].copy_from_slice(&current.id.to_be_bytes());
            b[12..20].copy_from_slice(&current.began.to_be_bytes());
        }
        1 => b[4..12].copy_from_slice(&(current.id + rng.range(1, 1000)).to_be_bytes()),
        2 => b[12..20].copy_from_slice(&rng.next_u64().to_be_bytes()),
        3 => b[20..28].copy_from_slice(&rng.range(0, 50).to_be_bytes()),
        _ => {
            let i = rng.range(44, b.len() as u64 - 1) as usize;
            b[i] ^= 1 << rng.range(0, 7);
        }
    }
    Bytes::from(b)
}

fn run(seed: u64) -> Result<String, String> {
    let mut rng = SimRng::new(seed);
    let runs = rng.range(2, 4);
    let n_rel = rng.range(5, 40);
    let n_lossy = rng.range(5, 40);
    let loss = rng.unit() * 0.3;
    let copies = rng.unit() * 0.2;
    let attack = rng.unit() * 0.3;
    let restarts = rng.unit() * 0.05;
    let join_in = rng.range(1, runs);
    // The stored log and the app side's consumer position in it (1-based sequences).
    let mut log: Vec<Msg> = Vec::new();
    let mut cursor = 0usize;
    // Messages JetStream delivers again (not acknowledged in time), with their sequence.
    let mut again: VecDeque<(Msg, u64)> = VecDeque::new();
    let mut core: VecDeque<Msg> = VecDeque::new();
    let mut recorded: Vec<(Msg, bool)> = Vec::new();
    let mut app: Option<App> = None;
    let mut processes = 0;
    let mut wall = 1_800_000_000_000_000_000u64;
    let mut last_id = None;
    // Every reliable frame the app side must get: (run, seq), from its consumer's start.
    let mut owed: Vec<(u64, u64)> = Vec::new();
    let mut got: HashSet<(u64, u64)> = HashSet::new();
    let mut ended_runs: HashSet<u64> = HashSet::new();
    let mut refused = 0u64;
    for r in 1..=runs {
        // The clock jumps (back, too) between runs.
        wall = wall
            .saturating_add(rng.range(0, 7_200_000_000_000))
            .saturating_sub(3_600_000_000_000);
        let id = next_run_id(last_id, wall, rng.next_u64() as u16);
        last_id = Some(id);
        let current = Run {
            id,
            began: log.len() as u64,
        };
        let mut dev = Device::new(current);
        if r == join_in {
            app = Some(App::new(current));
            processes += 1;
            cursor = log.len();
        }
        let mut next = [0u64; 3];
        let mut ended = false;
        loop {
            let pending = cursor < log.len() || !core.is_empty() || !again.is_empty();
            if ended && !pending {
                break;
            }
            let roll = rng.unit();
            if rng.chance(attack * 0.5) && !recorded.is_empty() {
                // The adversary plays back (or tampers with) anything recorded so far.
                let (m, stored) =
                    recorded[rng.range(0, recorded.len() as u64 - 1) as usize].clone();
                let body = match rng.range(0, 5) {
                    0 => tamper(&mut rng, &m.body, current),
                    1 => {
                        let mut junk = vec![0u8; rng.range(0, 80) as usize];
                        rng.fill(&mut junk);
                        Bytes::from(junk)
                    }
                    _ => m.body,
                };
                if stored || rng.chance(0.3) {
                    log.push(Msg { body });
                } else {
                    core.push_back(Msg { body });
                }
            } else if roll < 0.35 && !ended {
                // The device publishes its next frame (or the END once both are through).
                let stream = if next[REL as usize] < n_rel
                    && (next[LOSSY as usize] >= n_lossy || rng.chance(0.5))
                {
                    REL
                } else if next[LOSSY as usize] < n_lossy {
                    LOSSY
                } else {
                    ended = true;
                    let end_rel = Msg {
                        body: dev.frame(REL, END_SEQ),
                    };
                    log.push(end_rel.clone());
                    recorded.push((end_rel, true));
                    for _ in 0..3 {
                        let end_lossy = Msg {
                            body: dev.frame(LOSSY, END_SEQ),
                        };
                        core.push_back(end_lossy.clone());
                        recorded.push((end_lossy, false));
                    }
                    ended_runs.insert(id);
                    continue;
                };
                let seq = next[stream as usize];
                next[stream as usize] += 1;
                let m = Msg {
                    body: dev.frame(stream, seq),
                };
                if stream == REL {
                    log.push(m.clone());
                    if app.is_some() {
                        owed.push((id, seq));
                    }
                    // A server restart: the device publishes its recent frames again.
                    if rng.chance(copies / 4.0) {
                        let from = log.len().saturating_sub(rng.range(1, 5) as usize);
                        let again: Vec<Msg> = log[from..].to_vec();
                        log.extend(again);
                    }
                    recorded.push((m, true));
                } else {
                    if !rng.chance(loss) {
                        core.push_back(m.clone());
                        if rng.chance(copies) {
                            core.push_back(m.clone());
                        }
                    }
                    recorded.push((m, false));
                }
            } else if let Some(a) = app.as_mut() {
                // (Not while stored frames wait behind a gap: a process that dies then leaves
                // them to be delivered again after newer ones, which its successor drops as
                // copies; see docs/security.md, "Limits".)
                if rng.chance(restarts) && a.rel.intake().holds_nothing() {
                    // The app side restarts; its durable consumer goes on where it acknowledged:
                    // what the old process still held behind a gap was never acknowledged, and
                    // JetStream delivers it again.
                    for seq in a.unacked_behind_gaps() {
                        again.push_back((log[seq as usize - 1].clone(), seq));
                    }
                    *a = App::new(current);
                    processes += 1;
                    continue;
                }
                // Time passes: a gap held longer than the wait is given up (REORDER_WAIT).
                if !a.rel.intake().holds_nothing() && rng.chance(0.05) {
                    for (run, stream, s) in a.give_up_gaps()? {
                        if stream == REL {
                            got.insert((run, s));
                        }
                    }
                }
                // The broker delivers: stored (in order; sometimes a copy of an unacknowledged
                // one) or core (sometimes two neighbours swapped).
                let redeliver = !again.is_empty() && rng.chance(0.3);
                if redeliver || (cursor < log.len() && (core.is_empty() || rng.chance(0.5))) {
                    let (m, seq) = match again.pop_front().filter(|_| redeliver) {
                        Some(x) => x,
                        None => {
                            cursor += 1;
                            (log[cursor - 1].clone(), cursor as u64)
                        }
                    };
                    if rng.chance(copies) {
                        again.push_back((m.clone(), seq));
                    }
                    let taken = a.take(&m.body, Some(seq))?;
                    if taken.is_empty() {
                        refused += 1;
                    }
                    for (run, stream, seq) in taken {
                        if stream != REL {
                            return Err("a stored frame delivered on the lossy stream".into());
                        }
                        got.insert((run, seq));
                    }
                } else if let Some(m) = core.pop_front() {
                    if core.len() > 1 && rng.chance(copies) {
                        core.swap(0, 1);
                    }
                    if a.take(&m.body, None)?.is_empty() {
                        refused += 1;
                    }
                }
                // (An app side under --once acts on an END once everything stored is through:
                // nothing behind a gap, nothing to be delivered again.)
                let settled_now = again.is_empty();
                for &(r, settled) in &a.ended {
                    if !ended_runs.contains(&r) {
                        return Err(format!("took an END of run {r:x}, which did not end"));
                    }
                    if !(settled && settled_now) {
                        continue;
                    }
                    if let Some(missing) = owed
                        .iter()
                        .find(|(o, s)| *o == r && !got.contains(&(*o, *s)))
                    {
                        return Err(format!("took run {r:x}'s END before its frame {missing:?}"));
                    }
                }
            } else {
                // Nobody is subscribed yet: what is on core NATS is gone.
                core.clear();
                again.clear();
                cursor = log.len();
            }
        }
    }
    // The wait for a gap ends (fanout gives it up after REORDER_WAIT): what was held goes on.
    if let Some(a) = app.as_mut() {
        for (run, stream, s) in a.give_up_gaps()? {
            if stream == REL {
                got.insert((run, s));
            }
        }
    }
    if let Some(missing) = owed.iter().find(|o| !got.contains(o)) {
        return Err(format!(
            "reliable frame {missing:?} never delivered ({} owed, {} got)",
            owed.len(),
            got.len()
        ));
    }
    Ok(format!(
        "{runs} runs, joined in {join_in}, {processes} processes, {} reliable frames exact, {refused} messages not delivered",
        owed.len()
    ))
}

#[test]
fn nothing_replayed_forged_or_of_an_earlier_run_is_delivered_and_reliable_frames_are_exact() {
    ndd_testkit::explore("nats_runs", 1000, run);
}

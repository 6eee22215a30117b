//! The NATS fan-out's reliable path end to end over 1000 random schedules (issue 31, items 2
//! and 3): the device side's real `ndd_link::nats::send::Sender` (its `Outbox`) publishing
//! sealed frames into a model of JetStream, an app side's real `ndd_link::nats::receive::Receiver` taking
//! them from its consumer (its `Intake`) and opening them (its `Opener`: the `encrypt` inverse
//! under the run's key, the subject sequence sealed in each frame checked).
//!
//! The broker fails as a cluster does: publishes lost on the way (their acknowledgement times
//! out), stored but their acknowledgement lost, refused at once while a stream has no leader
//! (an outage: a node killed, a leader election), and a server restart that loses what it
//! acknowledged in its last moments and comes back after a pause (the client reconnects).
//! JetStream drops a publish whose message id it holds and acknowledges it with the first
//! one's sequence, as the real server does within its duplicate window.
//!
//! The driver does what fanout's `Publisher` does: hands every [`Publish`] to the broker, feeds
//! each acknowledgement back as it comes, the reconnect and the time, and publishes no new
//! frame while more than 256 wait for their acknowledgement.
//!
//! Properties: every frame reaches the app side once and in order, END last; no frame is
//! given up behind a gap (a publish that failed goes again long before the app side's 10 s
//! wait ends: the cluster test once lost a frame that way); the outbox settles.
//!
//! `SEED=n cargo test -p ndd-testkit --test nats_publish` replays one schedule.

mod common;

use bytes::Bytes;
use common::{RunInverse, RunSealer};
use ndd_core::{Frame, Meta};
use ndd_link::nats::intake::REORDER_WAIT;
use ndd_link::nats::keys::GroupKey;
use ndd_link::nats::outbox::Publish;
use ndd_link::nats::receive::{Event as ReceiverEvent, Poll as ReceiverPoll, Receiver};
use ndd_link::nats::record::END_SEQ;
use ndd_link::nats::runs::Run;
use ndd_link::nats::send::Sender;
use ndd_testkit::SimRng;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::{Duration, Instant};

const STREAM: u16 = 1;
const GROUP: [u8; 32] = [0x17; 32];
const RUN: Run = Run {
    id: 0x5eed,
    began: 0,
};
/// The publishers' room (`source::IN_FLIGHT`).
const IN_FLIGHT: usize = ndd_link::nats::source::IN_FLIGHT;
const WAIT: Duration = REORDER_WAIT;
/// async-nats' acknowledgement timeout.
const ACK_TIMEOUT: u64 = 5_000;

enum Event {
    /// A publish reaches the server.
    Arrive(Publish),
    /// Its acknowledgement (or failure) reaches the client.
    Ack(u64, Result<u64, ()>),
    /// The client is connected again after a restart.
    Reconnect,
}

struct Sim {
    now: u64,
    order: u64,
    events: BinaryHeap<Reverse<(u64, u64)>>,
    payloads: HashMap<u64, Event>,
}

impl Sim {
    fn at(&mut self, t: u64, e: Event) {
        self.order += 1;
        self.events.push(Reverse((t, self.order)));
        self.payloads.insert(self.order, e);
    }

    fn due(&mut self) -> Option<Event> {
        let Reverse((t, o)) = *self.events.peek()?;
        if t > self.now {
            return None;
        }
        self.events.pop();
        self.payloads.remove(&o)
    }
}

/// The JetStream model: one stream, its log and the message ids it holds.
#[derive(Debug)]
struct Broker {
    log: Vec<(String, Bytes)>,
    /// When each entry was stored (a restart loses the last moments' ones).
    stored_at: Vec<u64>,
    ids: HashMap<String, u64>,
    /// Down (refusing or silent) until then.
    down_until: u64,
    latency: u64,
    lost: f64,
    ack_lost: f64,
}

fn payload(seq: u64) -> Vec<u8> {
    let mut p = seq.to_be_bytes().to_vec();
    p.extend(std::iter::repeat_n(seq as u8, (seq % 97) as usize));
    p
}

fn run(seed: u64) -> Result<String, String> {
    let mut rng = SimRng::new(seed);
    let base = Instant::now();
    let at = |ms: u64| base + Duration::from_millis(ms);
    let n = rng.range(20, 1500);
    let spacing = rng.range(0, 10);
    let outages = rng.range(0, 4);
    let restarts = rng.range(0, 2);
    let mut broker = Broker {
        log: Vec::new(),
        stored_at: Vec::new(),
        ids: HashMap::new(),
        down_until: 0,
        latency: rng.range(0, 50),
        lost: rng.unit() * 0.02,
        ack_lost: rng.unit() * 0.02,
    };
    let mut sim = Sim {
        now: 0,
        order: 0,
        events: BinaryHeap::new(),
        payloads: HashMap::new(),
    };
    // Outages and restarts at random moments within the stream's span.
    let span = n * spacing.max(1) + 1000;
    let mut faults: Vec<(u64, bool, u64)> = Vec::new();
    for i in 0..outages + restarts {
        let t = rng.range(0, span);
        let restart = i >= outages;
        let pause = if restart {
            rng.range(200, 3000)
        } else {
            rng.range(100, 4000)
        };
        faults.push((t, restart, pause));
    }
    faults.sort();
    let mut faults = std::collections::VecDeque::from(faults);

    // The binary's sending half: sealing bound to the subject sequence, the tx.outbox.
    let mut tx: Sender<RunSealer, ()> =
        Sender::new(STREAM, GroupKey::first(GROUP, RUN), true, None, false)
            .map_err(|e| e.to_string())?;
    let mut rx: Receiver<RunInverse, u64> =
        Receiver::new(STREAM, true, GroupKey::first(GROUP, RUN), true, WAIT);
    rx.intake().consumer_start(1);
    let mut cursor = 0usize;
    let mut next = 0u64;
    let mut next_at = 0u64;
    let mut delivered: Vec<u64> = Vec::new();
    let mut ended = false;
    let subject = "ndd.d.down.1.s".to_string();
    let limit = span + 600_000;
    // TRACE=-13- prints what happens to the publishes whose id contains it.
    let trace = std::env::var("TRACE").ok();
    if trace.is_some() {
        println!("faults (at, restart, pause): {faults:?}; {broker:?}");
    }
    // Until the stream is settled and its END reached the app side.
    while !(ended && tx.outbox.is_settled() && delivered.last() == Some(&END_SEQ)) {
        if sim.now > limit {
            return Err(format!(
                "stalled: {} of {n} frames delivered, ended {ended}, {} in flight, {} queued events",
                delivered.len(),
                tx.outbox.in_flight(),
                sim.events.len()
            ));
        }
        // Faults.
        while faults.front().is_some_and(|f| f.0 <= sim.now) {
            let Some((_, restart, pause)) = faults.pop_front() else {
                break;
            };
            broker.down_until = broker.down_until.max(sim.now + pause);
            if restart {
                // What it acknowledged in its last 300 ms was not written yet.
                let keep = broker
                    .stored_at
                    .iter()
                    .position(|&t| t + 300 > sim.now)
                    .unwrap_or(broker.log.len());
                let keep = keep.max(broker.log.len().saturating_sub(rng.range(0, 20) as usize));
                for (id, _) in broker.log.drain(keep..) {
                    broker.ids.remove(&id);
                }
                broker.stored_at.truncate(keep);
                cursor = cursor.min(keep);
                sim.at(sim.now + pause, Event::Reconnect);
            }
        }
        // The source: a frame every `spacing` ms while the outbox has room, then the END.
        if !ended && sim.now >= next_at && tx.outbox.in_flight() <= IN_FLIGHT {
            let seq = if next < n { next } else { END_SEQ };
            let body = if seq == END_SEQ {
                Vec::new()
            } else {
                payload(seq)
            };
            let meta = Meta {
                stream: STREAM,
                seq,
                timestamp_ns: sim.now,
                flags: 0,
            };
            tx.send(at(sim.now), &subject, None, Frame::new(meta, &body), None)
                .map_err(|e| e.to_string())?;
            if seq == END_SEQ {
                ended = true;
            }
            next += 1;
            next_at = sim.now + spacing;
        }
        // The client.
        tx.outbox.handle_timeout(at(sim.now));
        while let Some(p) = tx.outbox.poll_transmit() {
            let t = sim.now;
            if trace
                .as_deref()
                .is_some_and(|w| p.id.as_deref().is_some_and(|i| i.contains(w)))
            {
                println!(
                    "{t} ms: send {:?} token {} (down until {})",
                    p.id, p.token, broker.down_until
                );
            }
            if t < broker.down_until {
                if rng.chance(0.5) {
                    sim.at(t + 1, Event::Ack(p.token, Err(())));
                } else {
                    sim.at(t + ACK_TIMEOUT, Event::Ack(p.token, Err(())));
                }
            } else if rng.chance(broker.lost) {
                sim.at(t + ACK_TIMEOUT, Event::Ack(p.token, Err(())));
            } else {
                sim.at(t + broker.latency, Event::Arrive(p));
            }
        }
        while let Some(e) = sim.due() {
            match e {
                Event::Arrive(p) => {
                    let t = sim.now;
                    if t < broker.down_until {
                        sim.at(t + ACK_TIMEOUT, Event::Ack(p.token, Err(())));
                        continue;
                    }
                    let id =
                        p.id.clone()
                            .ok_or("a stored publish without a message id")?;
                    let seq = match broker.ids.get(&id) {
                        Some(&s) => s,
                        None => {
                            broker.log.push((id.clone(), p.body));
                            broker.stored_at.push(t);
                            let s = broker.log.len() as u64;
                            broker.ids.insert(id, s);
                            s
                        }
                    };
                    if rng.chance(broker.ack_lost) {
                        sim.at(t + ACK_TIMEOUT, Event::Ack(p.token, Err(())));
                    } else {
                        sim.at(t + broker.latency, Event::Ack(p.token, Ok(seq)));
                    }
                }
                Event::Ack(token, r) => {
                    if trace.is_some() {
                        println!("{} ms: ack {token} {r:?}", sim.now);
                    }
                    tx.outbox.handle_ack(at(sim.now), token, r)
                }
                Event::Reconnect => tx.outbox.handle_reconnect(),
            }
        }
        // The app side's consumer.
        if sim.now >= broker.down_until {
            for _ in 0..8 {
                let Some((_, body)) = broker.log.get(cursor) else {
                    break;
                };
                cursor += 1;
                let s = cursor as u64;
                rx.handle_message(at(sim.now), body, Some((Some(s), s)));
            }
        }
        rx.handle_timeout(at(sim.now));
        loop {
            let e = match rx.poll(at(sim.now)).map_err(|e| e.to_string())? {
                ReceiverPoll::Idle => break,
                ReceiverPoll::Wait(w) => return Err(format!("the receiver waits for {w:?}")),
                ReceiverPoll::Event(e) => e,
            };
            // A copy taken with its first (both were on their way) is dropped unread; nothing
            // else may fail to open.
            let o = rx.opener();
            if o.dropped + o.forged > 0 {
                return Err(format!(
                    "a frame did not open: {} dropped, {} forged",
                    o.dropped, o.forged
                ));
            }
            match e {
                ReceiverEvent::End { .. } => {
                    if delivered.len() as u64 != n {
                        return Err(format!(
                            "the END came after {} of {n} frames",
                            delivered.len()
                        ));
                    }
                    delivered.push(END_SEQ);
                }
                ReceiverEvent::Frame { frame: f, .. } => {
                    let want = delivered.len() as u64;
                    if f.meta.seq != want || f.payload() != payload(want).as_slice() {
                        return Err(format!(
                            "frame {} delivered where {want} was due ({} given up behind gaps)",
                            f.meta.seq,
                            rx.intake().skipped()
                        ));
                    }
                    delivered.push(f.meta.seq);
                }
                ReceiverEvent::NewerRun | ReceiverEvent::TellRun => {}
            }
        }
        rx.acks_due(true);
        let skipped = rx.intake().skipped();
        if skipped > 0 {
            return Err(format!(
                "{skipped} frames given up behind a gap at {} ms",
                sim.now
            ));
        }
        sim.now += 1;
    }
    Ok(format!(
        "{n} frames exact in {} ms; {} retried, {} republished after a reconnect, {} copies dropped",
        sim.now, tx.outbox.retried, tx.outbox.republished, rx.intake().copies
    ))
}

#[test]
fn every_frame_reaches_the_app_side_once_in_order_through_a_failing_cluster() {
    ndd_testkit::explore("nats_publish", 1000, run);
}

//! Two real [`Session`]s over a simulated link, in virtual time, with faults.
//!
//! The harness plays what the `ndd` binary and the network do around two sessions: sources
//! that produce numbered frames on a schedule (and wait when the session applies
//! backpressure), sinks that record and complete what they get, a link that delays,
//! jitters, loses, reorders or duplicates messages, and a fault schedule: connection cuts,
//! blackholes (silence the keepalive has to notice), and restarts of the app side's process
//! (a new session with a new run id; what it had not completed is gone). Reconnection
//! happens, after a delay, once both sides have given up on the old link, as with real
//! listeners and connectors.
//!
//! Frames carry their endpoint number in `meta.seq` and in the first 8 payload bytes, so
//! every delivery is checked against what was produced.

use crate::{LinkConfig, SimClock, SimLink, SimRng, EPOCH_NS};
use ndd_core::session::{Event, Incoming, Session, SessionConfig, State, StreamPlan, Transmit};
use ndd_core::{Frame, Meta, Role};
use std::time::{Duration, Instant};

/// A fault at a virtual time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The connection breaks; both sides learn it after one link delay.
    Cut,
    /// Nothing gets through, either way, for this long; nobody is told.
    Blackhole(Duration),
    /// The app side's process dies and starts again (new session, new run id).
    RestartApp,
    /// Both sides cut frames into chunks of this size from now on (0: whole), as when the
    /// path's measured rate changes in the middle of a frame.
    Rechunk(usize),
}

/// A source endpoint: `count` frames of `size` bytes, one every `interval`.
#[derive(Debug, Clone, Copy)]
pub struct SourceSpec {
    /// Frames to produce.
    pub count: u64,
    /// Payload size (≥ 8).
    pub size: usize,
    /// Spacing.
    pub interval: Duration,
}

/// The scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Streams, the same on both sides; `Role::Source` means the device sources it.
    pub streams: Vec<(StreamPlan, SourceSpec)>,
    /// Session settings, both sides.
    pub session: SessionConfig,
    /// Link behaviour, each direction.
    pub link: LinkConfig,
    /// When the faults happen (from the start).
    pub faults: Vec<(Duration, Fault)>,
    /// Time from both sides giving up to a new connection.
    pub reconnect_delay: Duration,
    /// Give up after this much virtual time.
    pub limit: Duration,
    /// Seed of the link's randomness.
    pub seed: u64,
    /// The driver hands each endpoint frame to its session up to this long after the
    /// endpoint made (and stamped) it, a random lag, in order per stream: a loaded machine,
    /// or a driver that took a new link before the frames waiting in a source's channel.
    pub handoff: Duration,
}

/// What one stream's sink saw.
#[derive(Debug, Clone, Default)]
pub struct SinkLog {
    /// Endpoint numbers in delivery order, per app process run (device-side sinks have one).
    pub runs: Vec<Vec<u64>>,
    /// Frames whose payload did not match their number.
    pub corrupt: u64,
    /// Release-inputs requests.
    pub releases: u64,
    /// When each frame was delivered (virtual time since the start), in delivery order.
    pub at: Vec<Duration>,
}

/// What happened.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Per stream: what its sink saw.
    pub sinks: Vec<SinkLog>,
    /// Per stream: frames its source produced.
    pub produced: Vec<u64>,
    /// Both sessions closed (rather than hitting the time limit).
    pub closed: bool,
    /// Virtual time at the end.
    pub elapsed: Duration,
    /// An error either session returned, if any.
    pub error: Option<String>,
    /// Link losses the sides reported.
    pub losses: u64,
    /// Each side's session counters per stream (device, app).
    pub counters: Vec<[ndd_core::session::StreamCounters; 2]>,
    /// Where each side's session stood at the end (device, app).
    pub states: [State; 2],
    /// Most bytes a reliable source held unacknowledged at once (backpressure bound).
    pub max_unacked_bytes: u64,
    /// Per stream: when its endpoint made each frame (index: endpoint number), in the
    /// source's current process run.
    pub made_at: Vec<Vec<Duration>>,
    /// Per side (device, app): the spans during which its session had no link up.
    pub outages: [Vec<(Duration, Duration)>; 2],
}

impl Outcome {
    /// Whether a frame stream `i`'s source made at `t` was made while the source's side had
    /// no link.
    pub fn made_in_outage(&self, source_side: usize, t: Duration) -> bool {
        self.outages[source_side]
            .iter()
            .any(|&(from, to)| from <= t && t < to)
    }
}

/// Link-down spans of one side, sampled as the harness goes.
#[derive(Default)]
struct Outages {
    since: Option<Duration>,
    spans: Vec<(Duration, Duration)>,
}

fn watch(sides: &[Side; 2], at: Duration, outages: &mut [Outages; 2]) {
    for (s, o) in sides.iter().zip(outages.iter_mut()) {
        match (s.sess.link_up(), o.since) {
            (false, None) => o.since = Some(at),
            (true, Some(from)) => {
                o.spans.push((from, at));
                o.since = None;
            }
            _ => {}
        }
    }
}

struct Side {
    sess: Session,
    /// Which role this side plays per stream (device: the plan's role; app: the opposite).
    roles: Vec<Role>,
    completed: Vec<u64>,
    /// The link as this side sees it: connection number it is attached to.
    conn: Option<u64>,
}

fn other(r: Role) -> Role {
    match r {
        Role::Source => Role::Sink,
        Role::Sink => Role::Source,
    }
}

fn new_side(sc: &Scenario, device: bool, run_id: u64) -> Side {
    let plans: Vec<StreamPlan> = sc
        .streams
        .iter()
        .map(|(p, _)| {
            let mut p = p.clone();
            if !device {
                p.role = other(p.role);
            }
            p
        })
        .collect();
    let roles = plans.iter().map(|p| p.role).collect();
    let n = plans.len();
    Side {
        sess: Session::new(sc.session.clone(), plans, run_id).expect("plans build"),
        roles,
        completed: vec![0; n],
        conn: None,
    }
}

/// Frames a source's channel holds between its endpoint and the driver.
const HANDOFF_QUEUE: usize = 64;

/// A message on the simulated wire: the connection it belongs to and the message.
type Wire = (u64, Incoming);

/// Runs the scenario to its end (both sessions closed) or its time limit.
pub fn run(sc: &Scenario) -> Outcome {
    let mut clock = SimClock::new();
    let mut sides = [new_side(sc, true, 1), new_side(sc, false, 2)];
    let mut links = [
        SimLink::<Wire>::new(sc.link.clone(), sc.seed),
        SimLink::<Wire>::new(sc.link.clone(), sc.seed.wrapping_add(1)),
    ];
    let n = sc.streams.len();
    let mut produced = vec![0u64; n];
    let mut next_frame: Vec<Instant> = vec![clock.now(); n];
    let mut logs = vec![SinkLog::default(); n];
    for l in logs.iter_mut() {
        l.runs.push(Vec::new());
    }
    let mut conn: u64 = 0;
    let mut faults = sc.faults.clone();
    faults.sort_by_key(|f| f.0);
    let mut faults: std::collections::VecDeque<_> = faults.into();
    let mut blackhole_until: Option<Instant> = None;
    // Notices of a broken connection: (when, side, connection).
    let mut notices: Vec<(Instant, usize, u64)> = Vec::new();
    let mut reconnect_at: Option<Instant> = None;
    let mut error: Option<String> = None;
    let mut losses = 0;
    let mut max_unacked = 0;
    let mut restarts = 2u64;
    // A writer busy with a chunk: the rest of a cut frame is taken a moment later, so other
    // streams' frames, timers and faults (a new chunk size) come between its chunks.
    let mut writer = SimRng::new(sc.seed ^ 0x5eed_c4a2);
    let mut busy = [false; 2];
    // Frames made and not yet handed to their session: (when handed, frame).
    let mut lag = SimRng::new(sc.seed ^ 0x4a9d_0ff5);
    let mut handoff: Vec<std::collections::VecDeque<(Instant, Frame)>> =
        (0..n).map(|_| Default::default()).collect();
    let mut end_due = vec![false; n];
    let mut made_at: Vec<Vec<Duration>> = vec![Vec::new(); n];
    let mut outages: [Outages; 2] = Default::default();

    // The first connection.
    conn += 1;
    for s in sides.iter_mut() {
        s.conn = Some(conn);
        s.sess.handle_link_up(
            clock.now(),
            EPOCH_NS + clock.since_start(clock.now()).as_nanos() as u64,
        );
    }

    let delay = sc.link.delay;
    let mut steps: u64 = 0;
    loop {
        steps += 1;
        let now = clock.now();
        if clock.elapsed() >= sc.limit || steps > 50_000_000 {
            break;
        }
        // Faults due.
        while faults.front().is_some_and(|f| clock.at(f.0) <= now) {
            let (_, f) = faults.pop_front().expect("checked");
            if sides.iter().any(|s| s.sess.state() == State::Closed) {
                continue; // a side has exited: there is no session left to hurt
            }
            match f {
                Fault::Cut => {
                    for (k, s) in sides.iter().enumerate() {
                        if let Some(c) = s.conn {
                            notices.push((now + delay, k, c));
                        }
                    }
                }
                Fault::Blackhole(d) => blackhole_until = Some(now + d),
                Fault::Rechunk(n) => {
                    for side in sides.iter_mut() {
                        side.sess.set_chunking(n, usize::MAX);
                    }
                }
                Fault::RestartApp => {
                    restarts += 1;
                    let dev_conn = sides[0].conn;
                    sides[1] = new_side(sc, false, restarts);
                    for l in logs.iter_mut() {
                        l.runs.push(Vec::new());
                    }
                    if let Some(c) = dev_conn {
                        notices.push((now + delay, 0, c));
                    }
                    // App-sourced streams start again from the beginning in a new process.
                    for (i, (p, _)) in sc.streams.iter().enumerate() {
                        if p.role == Role::Sink {
                            produced[i] = 0;
                            handoff[i].clear();
                            end_due[i] = false;
                            made_at[i].clear();
                        }
                    }
                }
            }
        }
        if blackhole_until.is_some_and(|b| now >= b) {
            blackhole_until = None;
        }
        // Broken connections noticed.
        notices.retain(|&(at, k, c)| {
            if at > now {
                return true;
            }
            if sides[k].conn == Some(c) {
                sides[k].conn = None;
                if let Err(e) = sides[k].sess.handle_link_lost(now, "cut") {
                    error.get_or_insert(e.to_string());
                }
            }
            false
        });
        watch(&sides, clock.since_start(now), &mut outages);
        // Arrivals.
        // A blackhole holds a stream link's bytes (TCP retransmits them once the path is back)
        // and loses datagrams.
        let holding = blackhole_until.is_some() && sc.link.in_order;
        #[allow(clippy::needless_range_loop)] // the link index is also the sender's index
        for k in 0..2 {
            while let Some((c, m)) = if holding { None } else { links[k].recv(now) } {
                let to = 1 - k;
                if sides[to].conn != Some(c) || blackhole_until.is_some() {
                    continue;
                }
                let wall = EPOCH_NS + clock.since_start(now).as_nanos() as u64;
                if let Err(e) = sides[to].sess.handle_message(now, wall, m) {
                    error.get_or_insert(e.to_string());
                }
            }
        }
        watch(&sides, clock.since_start(now), &mut outages);
        // Sources.
        for i in 0..n {
            let (_, spec) = &sc.streams[i];
            let src = if sc.streams[i].0.role == Role::Source {
                0
            } else {
                1
            };
            loop {
                // Due frames first: the session's readiness counts them.
                while handoff[i].front().is_some_and(|f| f.0 <= now) {
                    let (_, frame) = handoff[i].pop_front().expect("checked");
                    if let Err(e) = sides[src].sess.handle_source_frame(now, i, frame) {
                        error.get_or_insert(e.to_string());
                    }
                }
                if !(produced[i] < spec.count
                    && next_frame[i] <= now
                    && sides[src].sess.source_ready(i)
                    && handoff[i].len() < HANDOFF_QUEUE)
                {
                    break;
                }
                let seq = produced[i];
                let mut payload = vec![(seq % 251) as u8; spec.size.max(8)];
                payload[..8].copy_from_slice(&seq.to_be_bytes());
                let meta = Meta {
                    stream: sc.streams[i].0.id,
                    seq,
                    timestamp_ns: EPOCH_NS + clock.since_start(now).as_nanos() as u64,
                    flags: 0,
                };
                produced[i] += 1;
                next_frame[i] += spec.interval;
                made_at[i].push(clock.since_start(now));
                let due = if sc.handoff.is_zero() {
                    now
                } else {
                    now + Duration::from_nanos(lag.range(0, sc.handoff.as_nanos() as u64))
                };
                // In order: never before the frame ahead of it.
                let due = handoff[i].back().map_or(due, |b| b.0.max(due));
                handoff[i].push_back((due, Frame::new(meta, &payload)));
                end_due[i] = produced[i] == spec.count;
            }
            if end_due[i] && handoff[i].is_empty() {
                end_due[i] = false;
                if let Err(e) = sides[src].sess.handle_source_end(now, i) {
                    error.get_or_insert(e.to_string());
                }
            }
        }
        // Timeouts.
        for s in sides.iter_mut() {
            if s.sess.poll_timeout().is_some_and(|t| t <= now) {
                if let Err(e) = s.sess.handle_timeout(now) {
                    error.get_or_insert(e.to_string());
                }
            }
        }
        watch(&sides, clock.since_start(now), &mut outages);
        // Events, completions, transmits.
        for k in 0..2 {
            let s = &mut sides[k];
            while let Some(ev) = s.sess.poll_event() {
                match ev {
                    Event::Deliver { stream, frame } => {
                        let seq = frame
                            .payload()
                            .get(..8)
                            .map(|b| u64::from_be_bytes(b.try_into().expect("8 bytes")))
                            .unwrap_or(u64::MAX);
                        let expect_len = sc.streams[stream].1.size.max(8);
                        let want = (seq % 251) as u8;
                        if frame.len() != expect_len
                            || seq != frame.meta.seq
                            || frame.payload()[8..].iter().any(|&b| b != want)
                        {
                            logs[stream].corrupt += 1;
                        }
                        logs[stream].runs.last_mut().expect("one run").push(seq);
                        logs[stream].at.push(clock.since_start(now));
                        s.completed[stream] += 1;
                    }
                    Event::ReleaseInputs { stream } => logs[stream].releases += 1,
                    Event::LinkLost { .. } => {
                        losses += 1;
                        if let Some(c) = s.conn.take() {
                            // The peer notices our end closing, unless the path is dead.
                            if blackhole_until.is_none() {
                                notices.push((now + delay, 1 - k, c));
                            }
                        }
                    }
                    Event::Closed(_) => {
                        if let Some(c) = s.conn {
                            notices.push((now + delay, 1 - k, c));
                        }
                    }
                    _ => {}
                }
            }
            for i in 0..n {
                if s.roles[i] == Role::Sink {
                    s.sess.handle_sink_completed(i, s.completed[i]);
                }
            }
            let c = s.conn;
            let wall = EPOCH_NS + clock.since_start(now).as_nanos() as u64;
            busy[k] = false;
            while let Some(t) = s.sess.poll_transmit(now, wall) {
                let chunk = matches!(t, Transmit::Data { more: true, .. });
                let size = match &t {
                    Transmit::Data { payload, .. } => payload.len() + 26,
                    Transmit::Message(_) => 32,
                };
                match c {
                    Some(c) if blackhole_until.is_none() || sc.link.in_order => {
                        links[k].send(now, (c, t.into_incoming()), size)
                    }
                    _ => {}
                }
                if chunk && writer.chance(0.5) {
                    busy[k] = true;
                    break;
                }
            }
            for i in 0..n {
                if s.roles[i] == Role::Source && sc.streams[i].0.reliable {
                    max_unacked = max_unacked.max(s.sess.counters(i).unacked_bytes);
                }
            }
        }
        // Reconnect once both have given up.
        let down = sides
            .iter()
            .all(|s| s.conn.is_none() && s.sess.state() != State::Closed);
        if down {
            if reconnect_at.is_none() {
                reconnect_at = Some(now + sc.reconnect_delay);
            }
            if reconnect_at.is_some_and(|t| t <= now) && blackhole_until.is_none() {
                reconnect_at = None;
                conn += 1;
                let wall = EPOCH_NS + clock.since_start(now).as_nanos() as u64;
                for s in sides.iter_mut() {
                    s.conn = Some(conn);
                    s.sess.handle_link_up(now, wall);
                }
            }
        } else {
            reconnect_at = None;
        }
        watch(&sides, clock.since_start(now), &mut outages);
        // Over when both sessions are; or when the device side has finished and a restarted
        // app side that never met it waits for a peer that has exited.
        let closed = sides.iter().all(|s| s.sess.state() == State::Closed)
            || (sides[0].sess.state() == State::Closed
                && sides[1].sess.state() == State::Connecting);
        if closed || error.is_some() {
            break;
        }
        // Next instant something happens.
        let mut next: Vec<Option<Instant>> = vec![
            links[0].next_arrival().filter(|_| !holding),
            links[1].next_arrival().filter(|_| !holding),
            faults.front().map(|f| clock.at(f.0)),
            blackhole_until,
            reconnect_at.map(|t| blackhole_until.map_or(t, |b| b.max(t))),
            notices.iter().map(|n| n.0).min(),
        ];
        for b in busy {
            if b {
                next.push(Some(now + Duration::from_micros(50)));
            }
        }
        for s in sides.iter() {
            next.push(s.sess.poll_timeout());
        }
        for i in 0..n {
            let src = if sc.streams[i].0.role == Role::Source {
                0
            } else {
                1
            };
            if produced[i] < sc.streams[i].1.count && sides[src].sess.source_ready(i) {
                next.push(Some(next_frame[i]));
            }
            next.push(handoff[i].front().map(|f| f.0));
        }
        let next = next.into_iter().flatten().min();
        match next {
            Some(t) if t > now => clock.advance_to(t),
            Some(_) => clock.advance(Duration::from_micros(1)),
            None => clock.advance(Duration::from_millis(1)),
        }
    }
    Outcome {
        sinks: logs,
        produced,
        closed: sides[0].sess.state() == State::Closed
            && matches!(sides[1].sess.state(), State::Closed | State::Connecting),
        states: [sides[0].sess.state(), sides[1].sess.state()],
        counters: (0..n)
            .map(|i| [sides[0].sess.counters(i), sides[1].sess.counters(i)])
            .collect(),
        elapsed: clock.elapsed(),
        error,
        losses,
        max_unacked_bytes: max_unacked,
        made_at,
        outages: outages.map(|o| {
            let mut spans = o.spans;
            if let Some(from) = o.since {
                spans.push((from, clock.elapsed()));
            }
            spans
        }),
    }
}

//! One side of a driver at run time: establishes the link, checks trust, runs the handshake,
//! then moves frames between endpoints, stacks and the link until every stream has ended or
//! the user stops it; survives link drops by reconnecting and resuming.
//!
//! All stacks of a side run on one task as plain function calls; endpoints and the link
//! reader are separate tasks that talk to it through bounded channels (backpressure, nothing
//! dropped). Control messages are written as soon as a half produces them, ahead of frames
//! still inside the stacks.
//!
//! Reliability (docs/protocol.md §6): the source keeps every DATA message of a reliable
//! stream until the peer ACKs it (bounded by `link.resume_buffer_bytes`); the sink ACKs what
//! it has taken in and drops anything at or below that sequence, so a resent frame is never
//! delivered twice. After a reconnect each side sends its ACKs and a RESUME carrying its
//! process-run id; the source then resends what was not acknowledged, in order, flagged
//! RETRANSMIT. Lossy streams keep only their newest frame while the link is down.
//!
//! A crash of the peer's process loses what it had taken in but not finished, so a reliable
//! source also keeps its endpoint's frames from *before* its stack until the peer's sink
//! endpoint has completed them (DELIVERED, endpoint sequence). When the peer's RESUME shows a
//! new process, the source builds its stack afresh (new pair state for the new peer: a key
//! frame first, a new encryption epoch) and encodes those frames again: across a peer restart
//! delivery is at least once, the duplicates being what the dead sink completed in its last
//! ~20 ms.

mod handshake;
mod linkio;
mod transport;

pub use transport::TransportKind;

use crate::config::{Config, SideName};
use crate::stats::{StreamStats, StreamSummary};
use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use handshake::{Connector, Ctx, Established};
use linkio::LinkIo;
use ndd_core::{Frame, Meta, Pair, Role, Stack};
use ndd_endpoint::delivered::INJECTED_SEQ;
use ndd_endpoint::{CheckReport, Delivered, SinkReport, SourceReport};
use ndd_link::{Identity, Incoming, Listener};
use ndd_modules::ModuleConfig;
use ndd_wire::{CloseCode, Message, OwnedMessage};
use std::collections::VecDeque;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

/// Where this side's link comes from.
#[derive(Debug)]
pub enum Endpoint {
    /// Bind this address and wait for the peer.
    Listen(String),
    /// Wait for the peer on a listener already bound (demo, tests).
    ListenOn(Listener),
    /// Connect to this address (retrying until the connect timeout).
    Connect(String),
}

/// How to run one side.
#[derive(Debug)]
pub struct RunOptions {
    /// Which side this is.
    pub side: SideName,
    /// Identity and known_peers directory.
    pub home: PathBuf,
    /// Listen or connect.
    pub endpoint: Endpoint,
    /// Plain TCP.
    pub insecure: bool,
    /// Print a live stats line per stream at this interval.
    pub live_stats: Option<Duration>,
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// No informational lines on stderr (benchmarks); errors still surface as `Err`.
    pub quiet: bool,
}

/// What a side did.
#[derive(Debug)]
pub struct RunReport {
    /// Per-stream stats.
    pub streams: Vec<StreamSummary>,
    /// Reports of `check` sinks.
    pub checks: Vec<(String, CheckReport)>,
    /// The peer's fingerprint (TLS) or address.
    pub peer: String,
    /// Clock offset estimate to the peer (peer − local), ns, and the RTT it came with.
    pub clock_offset: Option<(i64, u64)>,
    /// Time from each link loss to the resumed session, in order.
    pub recoveries: Vec<Duration>,
}

/// Nanoseconds since the Unix epoch, our clock.
pub fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

pub(crate) fn close_msg(code: CloseCode, reason: &str) -> OwnedMessage {
    OwnedMessage::Close {
        code,
        reason: reason.to_string(),
    }
}

/// Sets up TLS material for a side (creating the identity on first use).
pub fn load_identity(home: &std::path::Path) -> Result<Identity> {
    let (id, created) = Identity::load_or_create(home)
        .with_context(|| format!("cannot load or create the identity in {}", home.display()))?;
    if created {
        eprintln!(
            "ndd: created a new identity in {} (fingerprint {})",
            home.display(),
            id.fingerprint()
        );
    }
    Ok(id)
}

/// TLS material of a side.
pub(crate) struct Tls {
    identity: Identity,
    server: Arc<ndd_link::ServerConfig>,
    client: Arc<ndd_link::ClientConfig>,
}

/// A random id for this process run (RESUME).
fn instance_id() -> u64 {
    use std::io::Read;
    let mut b = [0u8; 8];
    match std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)) {
        Ok(()) => u64::from_be_bytes(b),
        Err(_) => wall_ns() ^ u64::from(std::process::id()).rotate_left(32),
    }
}

/// A DATA message kept by the source until the peer acknowledges it.
struct Pending {
    seq: u64,
    timestamp_ns: u64,
    payload: Bytes,
    /// Written on some connection already: a resend carries RETRANSMIT.
    written: bool,
}

struct StreamRt {
    id: u16,
    name: String,
    reliable: bool,
    stack: Stack,
    stats: StreamStats,
    /// Local end: a source's endpoint finished (END queued), a sink got END.
    ended: bool,
    // Source role.
    out: VecDeque<Pending>,
    out_bytes: usize,
    next_write: usize,
    sent: u64,
    end_written: bool,
    retransmits: u64,
    overflow: u64,
    /// Source, reliable: the endpoint's frames from before the stack, until the peer's sink
    /// has completed them (DELIVERED); encoded again for a restarted peer.
    kept: VecDeque<(Meta, Bytes)>,
    kept_bytes: usize,
    /// Kept frames dropped over the budget (a restarted peer would miss them).
    kept_overflow: u64,
    /// Source: the pairs, to build the stack afresh for a restarted peer.
    pairs: Vec<ModuleConfig>,
    // Sink role.
    sink_tx: Option<mpsc::Sender<Frame>>,
    /// Frames handed to the sink endpoint, oldest first: the peer generation they came from
    /// and their endpoint sequence. (Release-all records the session injects are not in it:
    /// sinks do not count them.)
    handed: VecDeque<(u64, u64)>,
    /// How many handed frames the endpoint has completed.
    completed: Delivered,
    completed_seen: u64,
    /// Highest endpoint sequence of the current peer generation completed, and last told.
    delivered: Option<u64>,
    delivered_sent: Option<u64>,
    /// An input device sink (xtest, uinput): told to release every held key and button
    /// when the link drops.
    input_sink: bool,
    last_seq: Option<u64>,
    acked_sent: Option<u64>,
    duplicates: u64,
}

impl StreamRt {
    fn is_source(&self) -> bool {
        self.stack.role() == Role::Source
    }

    /// Sink: takes the frames the endpoint completed since last time off `handed`; the last
    /// one of the current peer generation is what DELIVERED reports.
    fn note_completed(&mut self, peer_gen: u64) {
        let done = self.completed.count();
        while self.completed_seen < done {
            let Some((gen, seq)) = self.handed.pop_front() else {
                break;
            };
            self.completed_seen += 1;
            if gen == peer_gen {
                self.delivered = Some(seq);
            }
        }
    }

    /// Source, reliable: keeps an endpoint frame until the peer completes it, and returns the
    /// frame for the stack. Both share the bytes: no copy here; a pair that changes the
    /// payload in place copies it then (counted), one that does not never does.
    fn keep(&mut self, f: Frame, budget: usize) -> Frame {
        let meta = f.meta;
        let bytes = f.into_bytes();
        self.kept_bytes += bytes.len();
        self.kept.push_back((meta, bytes.clone()));
        while self.kept_bytes > budget && self.kept.len() > 1 {
            if let Some((_, old)) = self.kept.pop_front() {
                self.kept_bytes -= old.len();
                self.kept_overflow += 1;
            }
        }
        Frame::from_bytes(meta, bytes)
    }

    /// Source: the peer process restarted. Its sink state is gone, so the stack starts
    /// afresh and every frame it has not completed is encoded again, ahead of new ones.
    fn restart_for_new_peer(&mut self) -> Result<()> {
        self.stack = build_stack(Role::Source, &self.name, &self.pairs)?;
        self.out.clear();
        self.out_bytes = 0;
        self.next_write = 0;
        self.end_written = false;
        let t = now();
        for (meta, bytes) in &self.kept {
            self.stack
                .handle_frame(t, Frame::from_bytes(*meta, bytes.clone()))?;
        }
        if self.ended {
            self.stack.flush(t)?;
        }
        Ok(())
    }
}

/// A stream's stack of `pairs`, for `role`.
fn build_stack(role: Role, name: &str, pairs: &[ModuleConfig]) -> Result<Stack> {
    let pairs: Vec<&dyn Pair> = pairs.iter().map(|m| m as &dyn Pair).collect();
    Ok(Stack::build(role, name, &pairs)?)
}

/// Clock offset to the peer from PING/PONG: the sample with the smallest RTT wins.
#[derive(Debug, Default)]
struct ClockEstimate {
    best: Option<(i64, u64)>,
}

impl ClockEstimate {
    fn sample(&mut self, t1: u64, t2: u64, t3: u64, t4: u64) {
        let (offset, rtt) = ndd_wire::clock_offset_ns(t1, t2, t3, t4);
        if self.best.is_none_or(|(_, r)| rtt <= r) {
            self.best = Some((offset, rtt));
        }
    }

    /// Converts a peer timestamp to our clock.
    fn to_local(&self, peer_ns: u64) -> u64 {
        match self.best {
            Some((off, _)) => (peer_ns as i128 - off as i128).max(0) as u64,
            None => peer_ns,
        }
    }
}

fn now() -> Instant {
    Instant::now()
}

type Reconnect<'a> = Pin<Box<dyn Future<Output = Result<Established>> + Send + 'a>>;

/// The mutable state of a running side.
struct Session {
    side: SideName,
    quiet: bool,
    streams: Vec<StreamRt>,
    link: Option<LinkIo>,
    clock: ClockEstimate,
    ctl_out: VecDeque<(u16, usize, Bytes)>,
    /// Waiting for the peer's RESUME: no DATA goes out until it arrives.
    resuming: bool,
    instance: u64,
    peer_instance: Option<u64>,
    last_rx: Instant,
    lost_at: Option<Instant>,
    recoveries: Vec<Duration>,
    close_queued: Option<&'static str>,
    close_sent: bool,
    peer_closed: bool,
    budget: usize,
    warned_overflow: bool,
    /// Bumped each time the peer's process restarts.
    peer_gen: u64,
    /// When ACK and DELIVERED may next go out (at most every [`ACK_EVERY`], not per frame).
    next_ack: Instant,
}

/// Longest wait before a sink tells its source what it took in (ACK) and completed
/// (DELIVERED).
const ACK_EVERY: Duration = Duration::from_millis(20);

/// Why the link is gone.
struct LinkLost(anyhow::Error);

impl Session {
    fn log(&self, msg: std::fmt::Arguments<'_>) {
        if !self.quiet {
            eprintln!("ndd [{}]: {msg}", self.side);
        }
    }

    /// A new connection: start reading, tell the peer where our sinks are, and wait for its
    /// RESUME before sending data.
    async fn attach(&mut self, e: Established) -> Result<(), LinkLost> {
        let mut link = LinkIo::new(e.rx, e.tx);
        self.resuming = true;
        self.last_rx = now();
        for s in self.streams.iter_mut().filter(|s| s.is_source()) {
            s.next_write = 0;
            s.end_written = false;
        }
        let hello = async {
            for s in self.streams.iter().filter(|s| !s.is_source()) {
                if let Some(seq) = s.last_seq {
                    link.write_message(&Message::Ack { stream: s.id, seq })
                        .await?;
                }
            }
            link.write_message(&Message::Resume {
                instance: self.instance,
            })
            .await?;
            link.flush().await
        };
        hello
            .await
            .map_err(|e| LinkLost(anyhow!(e).context("resuming")))?;
        for s in self.streams.iter_mut().filter(|s| !s.is_source()) {
            s.acked_sent = s.last_seq;
            s.delivered_sent = None;
        }
        self.link = Some(link);
        Ok(())
    }

    /// Moves what a stack produced: a source's frames into its outbox, a sink's frames to its
    /// endpoint; control messages into the control queue.
    async fn pump(&mut self, i: usize) -> Result<()> {
        let clock = &self.clock;
        let budget = self.budget;
        let peer_gen = self.peer_gen;
        let link_up = self.link.is_some();
        let s = &mut self.streams[i];
        while let Some((layer, msg)) = s.stack.poll_control() {
            if link_up {
                self.ctl_out.push_back((s.id, layer, msg));
            }
        }
        if s.is_source() {
            while let Some(f) = s.stack.poll_frame() {
                s.stats.wire(f.len());
                s.sent += 1;
                let p = Pending {
                    seq: f.meta.seq,
                    timestamp_ns: f.meta.timestamp_ns,
                    payload: f.into_bytes(),
                    written: false,
                };
                if !s.reliable && !link_up {
                    // Lossy: while the link is down only the newest frame is worth sending.
                    let unwritten = s.out.len() - s.next_write.min(s.out.len());
                    for _ in 0..unwritten {
                        if let Some(old) = s.out.pop_back() {
                            s.out_bytes -= old.payload.len();
                            s.overflow += 1;
                        }
                    }
                }
                s.out_bytes += p.payload.len();
                s.out.push_back(p);
                while s.out_bytes > budget && s.out.len() > 1 {
                    let Some(old) = s.out.pop_front() else { break };
                    s.out_bytes -= old.payload.len();
                    s.next_write = s.next_write.saturating_sub(1);
                    s.overflow += 1;
                    if !self.warned_overflow {
                        self.warned_overflow = true;
                        eprintln!(
                            "ndd [{}]: stream \"{}\": resume buffer over {} bytes: dropping the oldest \
                             unacknowledged frames (counted as overflow)",
                            self.side, s.name, budget
                        );
                    }
                }
            }
        } else {
            while let Some(f) = s.stack.poll_frame() {
                // Latency on our clock: the source timestamp moved by the offset estimate.
                s.stats
                    .delivered(f.len(), clock.to_local(f.meta.timestamp_ns), wall_ns());
                if let Some(tx) = &s.sink_tx {
                    if f.meta.seq != INJECTED_SEQ {
                        s.handed.push_back((peer_gen, f.meta.seq));
                    }
                    if tx.send(f).await.is_err() {
                        bail!(
                            "stream \"{}\": the sink endpoint stopped accepting frames",
                            s.name
                        );
                    }
                }
            }
        }
        Ok(())
    }

    /// Writes everything that can go out now: control, ACKs, DATA in order (unless resuming),
    /// ENDs after a stream's last frame, CLOSE last.
    async fn flush_out(&mut self) -> Result<(), LinkLost> {
        let Some(link) = self.link.as_mut() else {
            return Ok(());
        };
        let lost = |e: ndd_link::LinkError| LinkLost(anyhow!(e));
        while let Some((stream, layer, msg)) = self.ctl_out.pop_front() {
            link.write_message(&Message::Control {
                stream,
                layer: layer as u8,
                msg: &msg,
            })
            .await
            .map_err(lost)?;
        }
        let t = now();
        let acks_due = t >= self.next_ack;
        if acks_due {
            self.next_ack = t + ACK_EVERY;
        }
        for s in self
            .streams
            .iter_mut()
            .filter(|s| acks_due && !s.is_source())
        {
            if s.last_seq != s.acked_sent {
                if let Some(seq) = s.last_seq {
                    link.write_message(&Message::Ack { stream: s.id, seq })
                        .await
                        .map_err(lost)?;
                }
                s.acked_sent = s.last_seq;
            }
            s.note_completed(self.peer_gen);
            if s.delivered != s.delivered_sent {
                if let Some(seq) = s.delivered {
                    link.write_message(&Message::Delivered { stream: s.id, seq })
                        .await
                        .map_err(lost)?;
                }
                s.delivered_sent = s.delivered;
            }
        }
        if !self.resuming {
            for s in self.streams.iter_mut().filter(|s| s.is_source()) {
                while s.next_write < s.out.len() {
                    let p = &mut s.out[s.next_write];
                    if p.written {
                        s.retransmits += 1;
                    }
                    link.write_data(
                        s.id,
                        p.written,
                        p.seq,
                        p.timestamp_ns,
                        &p.payload,
                        s.reliable,
                    )
                    .await
                    .map_err(lost)?;
                    p.written = true;
                    if s.reliable {
                        s.next_write += 1;
                    } else if let Some(done) = s.out.remove(s.next_write) {
                        s.out_bytes -= done.payload.len();
                    }
                }
                if s.ended && !s.end_written && s.next_write >= s.out.len() {
                    link.write_message(&Message::End {
                        stream: s.id,
                        frames: s.sent,
                    })
                    .await
                    .map_err(lost)?;
                    s.end_written = true;
                }
            }
            let all_ends = self
                .streams
                .iter()
                .filter(|s| s.is_source())
                .all(|s| s.end_written);
            if let Some(reason) = self.close_queued {
                if !self.close_sent && (all_ends || self.peer_closed) {
                    link.write_message(&close_msg(CloseCode::Normal, reason).as_message())
                        .await
                        .map_err(lost)?;
                    self.close_sent = true;
                }
            }
        }
        link.flush().await.map_err(lost)
    }

    /// Ends a stream on this side: a source flushes its stack (END follows its last frame);
    /// a sink flushes its stack into the endpoint and closes it.
    async fn end_stream(&mut self, i: usize) -> Result<()> {
        if self.streams[i].ended {
            return Ok(());
        }
        self.streams[i].stack.flush(now())?;
        self.pump(i).await?;
        let s = &mut self.streams[i];
        if !s.is_source() {
            s.sink_tx = None;
        }
        s.ended = true;
        Ok(())
    }

    /// The link is gone. Returns true when the session is over anyway (we or the peer had
    /// closed it), an error when reconnecting is off; otherwise the caller reconnects.
    /// `graceful` says goodbye (close_notify) on a connection that may still carry it.
    async fn link_lost(
        &mut self,
        e: anyhow::Error,
        reconnect: bool,
        graceful: bool,
    ) -> Result<bool> {
        if self.close_sent || self.peer_closed {
            return Ok(true);
        }
        if !reconnect {
            return Err(e.context("link to the peer failed"));
        }
        if let Some(link) = self.link.take() {
            if graceful {
                link.shutdown().await;
            }
        }
        self.release_inputs().await;
        self.lost_at = Some(now());
        self.log(format_args!("link lost: {e:#}; reconnecting"));
        Ok(false)
    }

    /// The link is gone: an application must not be left with a key or button held down.
    async fn release_inputs(&mut self) {
        for s in self.streams.iter().filter(|s| s.input_sink) {
            if let Some(tx) = &s.sink_tx {
                let meta = Meta {
                    stream: s.id,
                    seq: INJECTED_SEQ,
                    timestamp_ns: wall_ns(),
                    flags: 0,
                };
                let _ = tx
                    .send(Frame::new(
                        meta,
                        &ndd_endpoint::InputMessage::release_all_payload(),
                    ))
                    .await;
            }
        }
    }

    fn find(&self, id: u16) -> Result<usize> {
        self.streams.iter().position(|s| s.id == id).ok_or_else(|| {
            anyhow!("the peer sent a message for stream id {id}, which is not configured")
        })
    }

    /// Handles one message from the peer.
    async fn incoming(&mut self, m: Incoming, at: u64) -> Result<()> {
        self.last_rx = now();
        match m {
            Incoming::Data { header, payload } => {
                let i = self.find(header.stream_id)?;
                let s = &mut self.streams[i];
                if s.is_source() {
                    bail!(
                        "the peer sent a frame on stream \"{}\", which it does not source",
                        s.name
                    );
                }
                if s.ended || s.last_seq.is_some_and(|l| header.seq <= l) {
                    // Already taken in before a reconnect: never deliver twice.
                    s.duplicates += 1;
                    return Ok(());
                }
                s.last_seq = Some(header.seq);
                s.stats.wire(payload.len());
                let meta = Meta {
                    stream: header.stream_id,
                    seq: header.seq,
                    // Kept as the source wrote it: pairs (checksum, encrypt) cover it.
                    timestamp_ns: header.timestamp_ns,
                    flags: 0,
                };
                s.stack
                    .handle_frame(now(), Frame::from_bytes(meta, payload))?;
                self.pump(i).await?;
            }
            Incoming::Other(msg) => match msg {
                OwnedMessage::Control { stream, layer, msg } => {
                    let i = self.find(stream)?;
                    self.streams[i].stack.handle_control(
                        now(),
                        layer as usize,
                        Bytes::from(msg),
                    )?;
                    self.pump(i).await?;
                }
                OwnedMessage::End { stream, .. } => {
                    let i = self.find(stream)?;
                    if self.streams[i].is_source() {
                        bail!(
                            "the peer ended stream \"{}\", which it does not source",
                            self.streams[i].name
                        );
                    }
                    self.end_stream(i).await?;
                }
                OwnedMessage::Ack { stream, seq } => {
                    let i = self.find(stream)?;
                    let s = &mut self.streams[i];
                    while s.out.front().is_some_and(|p| p.seq <= seq) {
                        if let Some(p) = s.out.pop_front() {
                            s.out_bytes -= p.payload.len();
                            s.next_write = s.next_write.saturating_sub(1);
                        }
                    }
                }
                OwnedMessage::Delivered { stream, seq } => {
                    let i = self.find(stream)?;
                    let s = &mut self.streams[i];
                    if !s.is_source() {
                        bail!(
                            "the peer reported deliveries on stream \"{}\", which it does not sink",
                            s.name
                        );
                    }
                    while s.kept.front().is_some_and(|(m, _)| m.seq <= seq) {
                        if let Some((_, b)) = s.kept.pop_front() {
                            s.kept_bytes -= b.len();
                        }
                    }
                }
                OwnedMessage::Resume { instance } => {
                    if self.peer_instance.is_some_and(|p| p != instance) {
                        // The peer restarted: its numbering starts again, and what it had
                        // not completed is encoded again for it.
                        self.peer_gen += 1;
                        let mut again = 0;
                        for i in 0..self.streams.len() {
                            let s = &mut self.streams[i];
                            if !s.is_source() {
                                s.last_seq = None;
                                s.acked_sent = None;
                                s.delivered = None;
                                s.delivered_sent = None;
                            } else if s.reliable {
                                again += s.kept.len();
                                s.restart_for_new_peer()?;
                                if s.kept_overflow > 0 {
                                    let (name, n) = (s.name.clone(), s.kept_overflow);
                                    self.log(format_args!(
                                        "stream \"{name}\": {n} frame(s) the peer had not completed were \
                                         dropped over the resume budget and cannot be sent again"
                                    ));
                                }
                                self.pump(i).await?;
                            }
                        }
                        self.log(format_args!(
                            "the peer restarted; its streams start again ({again} frame(s) it had not completed are sent again)"
                        ));
                    }
                    self.peer_instance = Some(instance);
                    self.resuming = false;
                    if let Some(t) = self.lost_at.take() {
                        let d = t.elapsed();
                        self.recoveries.push(d);
                        let pending: usize = self
                            .streams
                            .iter()
                            .map(|s| s.out.len() - s.next_write.min(s.out.len()))
                            .sum();
                        self.log(format_args!(
                            "link restored after {:.0} ms; resending {pending} unacknowledged frame(s)",
                            d.as_secs_f64() * 1e3
                        ));
                    }
                }
                OwnedMessage::Ping { t1 } => {
                    // t2 is when the reader took the PING off the socket, not when we got to it.
                    if let Some(link) = self.link.as_mut() {
                        let _ = link
                            .write_message(&Message::Pong {
                                t1,
                                t2: at,
                                t3: wall_ns(),
                            })
                            .await;
                    }
                }
                OwnedMessage::Pong { t1, t2, t3 } => self.clock.sample(t1, t2, t3, at),
                OwnedMessage::Close {
                    code: CloseCode::Normal,
                    ..
                } => {
                    // No more frames will come: deliver what our sinks hold. Our own sources
                    // are ended when we send our CLOSE.
                    self.peer_closed = true;
                    for i in 0..self.streams.len() {
                        if !self.streams[i].is_source() {
                            self.end_stream(i).await?;
                        }
                    }
                }
                OwnedMessage::Close { code, reason } => {
                    bail!("the peer closed the session ({code}): {reason}")
                }
                OwnedMessage::Data { .. } => bail!("the link delivered a frame as a plain message"),
                OwnedMessage::Hello(_) | OwnedMessage::Ready => {
                    bail!("the peer sent a handshake message in the middle of the session")
                }
            },
        }
        Ok(())
    }
}

/// Runs one side until all streams end, the peer closes, or `stop` turns true.
pub async fn run_side(
    cfg: &Config,
    opts: RunOptions,
    mut stop: watch::Receiver<bool>,
) -> Result<RunReport> {
    let side = opts.side;
    let insecure = opts.insecure || cfg.link.insecure;
    if insecure && !opts.quiet {
        eprintln!(
            "ndd [{side}]: WARNING: --insecure: the link is plain TCP, neither authenticated nor \
             encrypted; anyone on the path can read and inject frames"
        );
    }
    let tls = if insecure {
        None
    } else {
        let identity = load_identity(&opts.home)?;
        Some(Arc::new(Tls {
            server: ndd_link::server_config(&identity).context("TLS server setup")?,
            client: ndd_link::client_config(&identity).context("TLS client setup")?,
            identity,
        }))
    };
    let timeout = Duration::from_millis(cfg.link.connect_timeout_ms);
    let ctx = Ctx {
        hello: cfg.hello(side),
        max_body: cfg.link.max_frame_bytes,
        tls,
        home: opts.home.clone(),
        timeout,
        side,
        max_backoff: Duration::from_millis(cfg.link.max_backoff_ms),
    };
    let transport = cfg.link.transport;
    if transport == TransportKind::Quic && insecure {
        bail!("QUIC always encrypts and authenticates: drop --insecure / link.insecure, or use transport = \"tcp\"");
    }
    if transport == TransportKind::Udp {
        let bare: Vec<&str> = cfg
            .streams
            .iter()
            .filter(|s| !s.pairs().iter().any(|m| m.name() == "encrypt"))
            .map(|s| s.name())
            .collect();
        if !bare.is_empty() && !opts.quiet {
            eprintln!(
                "ndd [{side}]: WARNING: the UDP link neither encrypts nor authenticates; stream(s) {} \
                 carry no `encrypt` pair, so anyone on the path can read and inject their frames",
                bare.join(", ")
            );
        }
    }
    let connector = match (transport, opts.endpoint) {
        (TransportKind::Tcp, Endpoint::Connect(addr)) => Connector::Connect(addr),
        (TransportKind::Tcp, Endpoint::Listen(addr)) => Connector::Listen(
            ndd_link::listen(&addr)
                .await
                .with_context(|| format!("cannot listen on {addr}"))?,
        ),
        (TransportKind::Tcp, Endpoint::ListenOn(l)) => Connector::Listen(l),
        (TransportKind::Quic, Endpoint::Connect(addr)) => Connector::QuicConnect(addr),
        (TransportKind::Quic, Endpoint::Listen(addr)) => {
            let id = &ctx.tls.as_ref().context("QUIC needs an identity")?.identity;
            Connector::QuicListen(
                ndd_link::quic_listen(&addr, id)
                    .await
                    .with_context(|| format!("cannot listen (QUIC) on {addr}"))?,
            )
        }
        (TransportKind::Udp, Endpoint::Connect(addr)) => Connector::UdpConnect(addr),
        (TransportKind::Udp, Endpoint::Listen(addr)) => Connector::UdpListen(addr),
        (_, Endpoint::ListenOn(_)) => bail!("a pre-bound listener is TCP only"),
    };
    if !opts.quiet {
        let addr = match &connector {
            Connector::Listen(l) => l.local_addr().map(|a| a.to_string()).ok(),
            Connector::QuicListen(l) => l.local_addr().map(|a| format!("{a} (QUIC)")).ok(),
            Connector::UdpListen(a) => Some(format!("{a} (UDP)")),
            _ => None,
        };
        if let Some(a) = addr {
            eprintln!("ndd [{side}]: listening on {a}");
        }
    }

    // The first link: any failure here ends the run (mismatch, untrusted, nobody there).
    let first = tokio::select! {
        e = connector.establish(&ctx, true) => e?,
        _ = stop.changed() => bail!("stopped before a peer connected"),
    };
    let peer = first.peer.clone();
    if !opts.quiet {
        eprintln!("ndd [{side}]: connected to {peer}; streams agreed");
    }

    // Per-stream runtime.
    let (src_tx, mut src_rx) = mpsc::channel::<(usize, Option<Frame>)>(256);
    let mut streams = Vec::new();
    let mut source_tasks: Vec<JoinHandle<()>> = Vec::new();
    type SrcTask = JoinHandle<std::result::Result<SourceReport, ndd_endpoint::EndpointError>>;
    type SinkTask = JoinHandle<std::result::Result<SinkReport, ndd_endpoint::EndpointError>>;
    let mut endpoint_tasks: Vec<(usize, SrcTask)> = Vec::new();
    let mut sink_tasks: Vec<(usize, SinkTask)> = Vec::new();
    for (i, s) in cfg.streams.iter().enumerate() {
        let id = Config::stream_id(i);
        let role = if s.direction.source_side() == side {
            Role::Source
        } else {
            Role::Sink
        };
        let pairs: Vec<ModuleConfig> = s.pairs().into_iter().cloned().collect();
        let stack = build_stack(role, s.name(), &pairs)?;
        let dir = s.direction.wire().to_string();
        let mut rt = StreamRt {
            id,
            name: s.name().to_string(),
            reliable: s.reliability == crate::config::Reliability::Reliable,
            stack,
            stats: StreamStats::new(
                s.name(),
                if role == Role::Source {
                    "source"
                } else {
                    "sink"
                },
                dir,
            ),
            ended: false,
            out: VecDeque::new(),
            out_bytes: 0,
            next_write: 0,
            sent: 0,
            end_written: false,
            retransmits: 0,
            overflow: 0,
            kept: VecDeque::new(),
            kept_bytes: 0,
            kept_overflow: 0,
            pairs,
            sink_tx: None,
            handed: VecDeque::new(),
            completed: Delivered::default(),
            completed_seen: 0,
            delivered: None,
            delivered_sent: None,
            input_sink: matches!(
                s.sink,
                ndd_endpoint::SinkConfig::Xtest(_) | ndd_endpoint::SinkConfig::Uinput(_)
            ),
            last_seq: None,
            acked_sent: None,
            duplicates: 0,
        };
        match role {
            Role::Source => {
                let (tx, mut rx) = mpsc::channel::<Frame>(64);
                let h = s.source.spawn(id, tx).with_context(|| {
                    format!(
                        "stream \"{}\": cannot start source {}",
                        s.name(),
                        s.source.describe()
                    )
                })?;
                endpoint_tasks.push((i, h));
                let fwd = src_tx.clone();
                source_tasks.push(tokio::spawn(async move {
                    while let Some(f) = rx.recv().await {
                        if fwd.send((i, Some(f))).await.is_err() {
                            return;
                        }
                    }
                    let _ = fwd.send((i, None)).await;
                }));
            }
            Role::Sink => {
                let (tx, rx) = mpsc::channel::<Frame>(64);
                let h = s
                    .sink
                    .spawn_tracked(rx, rt.completed.clone())
                    .with_context(|| {
                        format!(
                            "stream \"{}\": cannot start sink {}",
                            s.name(),
                            s.sink.describe()
                        )
                    })?;
                sink_tasks.push((i, h));
                rt.sink_tx = Some(tx);
            }
        }
        streams.push(rt);
    }
    drop(src_tx);

    let mut sess = Session {
        side,
        quiet: opts.quiet,
        streams,
        link: None,
        clock: ClockEstimate::default(),
        ctl_out: VecDeque::new(),
        resuming: true,
        instance: instance_id(),
        peer_instance: None,
        last_rx: now(),
        lost_at: None,
        recoveries: Vec::new(),
        close_queued: None,
        close_sent: false,
        peer_closed: false,
        budget: cfg.link.resume_buffer_bytes as usize,
        warned_overflow: false,
        peer_gen: 0,
        next_ack: now(),
    };
    if let Err(LinkLost(e)) = sess.attach(first).await {
        bail!(e.context("the link failed right after the handshake"));
    }

    let ping_every = Duration::from_millis(cfg.link.ping_interval_ms.max(10));
    let keepalive = Duration::from_millis(cfg.link.keepalive_timeout_ms);
    let mut next_ping = now();
    let mut next_stats = opts.live_stats.map(|d| now() + d);
    let deadline = opts.duration.map(|d| now() + d);
    let mut sources_open = sess.streams.iter().filter(|s| s.is_source()).count();
    let mut stopping = false;
    let mut linger_until: Option<Instant> = None;
    let mut reconnect: Option<Reconnect<'_>> = None;

    let result: Result<()> = async {
        loop {
            // Finished when every stream ended (ours flushed, theirs got END), or the peer
            // closed, or the user stopped us: say CLOSE once (after all ENDs), then wait a
            // little for the peer's.
            let all_done = sess.streams.iter().all(|s| s.ended);
            if (all_done || sess.peer_closed || stopping) && sess.close_queued.is_none() {
                for i in 0..sess.streams.len() {
                    if sess.streams[i].is_source() && !sess.streams[i].ended {
                        sess.end_stream(i).await?;
                    }
                }
                sess.close_queued = Some(if stopping { "stopped" } else { "all streams ended" });
            }
            if sess.close_queued.is_some() && sess.link.is_none() && (stopping || sess.peer_closed) {
                break; // nobody to tell
            }
            let lost = match sess.flush_out().await {
                Ok(()) => None,
                Err(LinkLost(e)) => Some(e),
            };
            if sess.close_sent && linger_until.is_none() {
                linger_until = Some(now() + Duration::from_secs(3));
            }
            if sess.close_sent && sess.peer_closed {
                break;
            }
            if let Some(e) = lost {
                if sess.link_lost(e, cfg.link.reconnect, false).await? {
                    break;
                }
                reconnect = Some(Box::pin(connector.establish(&ctx, false)));
                continue;
            }
            let wake = [
                sess.streams.iter().filter_map(|s| s.stack.poll_timeout()).min(),
                Some(next_ping),
                Some(sess.next_ack),
                next_stats,
                deadline,
                linger_until,
                sess.link.as_ref().map(|_| sess.last_rx + keepalive),
            ]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or_else(|| now() + Duration::from_secs(3600));
            let mut lost: Option<anyhow::Error> = None;
            tokio::select! {
                biased;
                _ = stop.changed(), if !stopping => { stopping = true; }
                est = async { reconnect.as_mut().expect("guarded").await }, if reconnect.is_some() => {
                    reconnect = None;
                    match est {
                        Ok(e) => {
                            sess.log(format_args!("reconnected to {}", e.peer));
                            if let Err(LinkLost(e)) = sess.attach(e).await {
                                lost = Some(e);
                            }
                        }
                        Err(e) => return Err(e.context("cannot reconnect")),
                    }
                }
                msg = async { sess.link.as_mut().expect("guarded").recv().await }, if sess.link.is_some() => {
                    match msg {
                        None | Some((_, Ok(None))) => {
                            if sess.close_sent || sess.peer_closed {
                                break;
                            }
                            lost = Some(anyhow!("the peer disconnected without closing the session"));
                        }
                        Some((_, Err(e))) => {
                            if sess.close_sent {
                                break;
                            }
                            lost = Some(anyhow!(e));
                        }
                        Some((at, Ok(Some(m)))) => sess.incoming(m, at).await?,
                    }
                }
                f = src_rx.recv(), if sources_open > 0 => {
                    match f {
                        Some((i, Some(frame))) => {
                            if !sess.streams[i].ended {
                                sess.streams[i].stats.produced(frame.len());
                                let frame = if sess.streams[i].reliable {
                                    let budget = sess.budget;
                                    sess.streams[i].keep(frame, budget)
                                } else {
                                    frame
                                };
                                sess.streams[i].stack.handle_frame(now(), frame)?;
                                sess.pump(i).await?;
                            }
                        }
                        Some((i, None)) => {
                            sources_open -= 1;
                            sess.end_stream(i).await?;
                        }
                        None => sources_open = 0,
                    }
                }
                _ = tokio::time::sleep_until(wake.into()) => {
                    let t = now();
                    if linger_until.is_some_and(|l| t >= l) {
                        tracing::debug!("the peer did not confirm the close; leaving");
                        break;
                    }
                    for i in 0..sess.streams.len() {
                        if sess.streams[i].stack.poll_timeout().is_some_and(|d| d <= t) {
                            sess.streams[i].stack.handle_timeout(t)?;
                            sess.pump(i).await?;
                        }
                    }
                    if let Some(link) = sess.link.as_mut() {
                        if t >= sess.last_rx + keepalive {
                            lost = Some(anyhow!("no message from the peer for {} ms", keepalive.as_millis()));
                        } else if t >= next_ping && !sess.close_sent {
                            if let Err(e) = link.write_message(&Message::Ping { t1: wall_ns() }).await {
                                lost = Some(anyhow!(e));
                            }
                            next_ping = t + ping_every;
                        }
                    } else {
                        next_ping = t + ping_every;
                    }
                    if let Some(n) = next_stats {
                        if t >= n {
                            for s in sess.streams.iter_mut() {
                                s.stats.layers = s.stack.stats();
                                eprintln!("{}", s.stats.live_line(&side.to_string()));
                            }
                            next_stats = opts.live_stats.map(|d| t + d);
                        }
                    }
                    if deadline.is_some_and(|d| t >= d) {
                        stopping = true;
                    }
                }
            }
            if let Some(e) = lost {
                if sess.link_lost(e, cfg.link.reconnect, true).await? {
                    break;
                }
                reconnect = Some(Box::pin(connector.establish(&ctx, false)));
            }
        }
        Ok(())
    }
    .await;

    // Wind down: no more frames for sinks; stop sources.
    drop(reconnect);
    for s in sess.streams.iter_mut() {
        s.sink_tx = None;
    }
    for t in &source_tasks {
        t.abort();
    }
    if let Err(e) = result {
        for (_, h) in &endpoint_tasks {
            h.abort();
        }
        if let Some(mut link) = sess.link.take() {
            let _ = link
                .write_message(&close_msg(CloseCode::InternalError, &format!("{e:#}")).as_message())
                .await;
            let _ = link.flush().await;
            link.shutdown().await;
        }
        return Err(e);
    }
    if let Some(link) = sess.link.take() {
        link.shutdown().await;
    }
    for (_, h) in endpoint_tasks {
        h.abort();
    }
    let mut checks = Vec::new();
    for (i, h) in sink_tasks {
        let name = cfg.streams[i].name().to_string();
        match h.await {
            Ok(Ok(rep)) => {
                if let Some(c) = rep.check {
                    checks.push((name, c));
                }
            }
            Ok(Err(e)) => return Err(anyhow!(e).context(format!("stream \"{name}\": sink failed"))),
            Err(e) => return Err(anyhow!("stream \"{name}\": sink task failed: {e}")),
        }
    }
    let summaries = sess
        .streams
        .iter_mut()
        .map(|s| {
            s.stats.layers = s.stack.stats();
            s.stats.retransmits = s.retransmits;
            s.stats.duplicates = s.duplicates;
            s.stats.overflow = s.overflow;
            s.stats.summary()
        })
        .collect();
    Ok(RunReport {
        streams: summaries,
        checks,
        peer,
        clock_offset: sess.clock.best,
        recoveries: sess.recoveries,
    })
}

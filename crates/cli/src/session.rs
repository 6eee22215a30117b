//! One side of a driver at run time: establishes the link, checks trust, runs the handshake,
//! then moves frames between endpoints, stacks and the link until every stream has ended or
//! the user stops it.
//!
//! All stacks of a side run on one task as plain function calls; endpoints and the link
//! reader are separate tasks that talk to it through bounded channels (backpressure, nothing
//! dropped). Control messages are written as soon as a half produces them, ahead of frames
//! still inside the stacks.

use crate::config::{Config, SideName};
use crate::stats::{StreamStats, StreamSummary};
use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use ndd_core::{Frame, Meta, Pair, Role, Stack};
use ndd_endpoint::{CheckReport, SinkReport, SourceReport};
use ndd_link::{
    Conn, Identity, Incoming, KnownPeers, Listener, MessageReader, MessageWriter, PeerInfo,
};
use ndd_wire::{CloseCode, Message, OwnedMessage, WireError};
use std::path::PathBuf;
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
}

/// Nanoseconds since the Unix epoch, our clock.
pub fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

fn close_msg(code: CloseCode, reason: &str) -> OwnedMessage {
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

struct Tls {
    identity: Identity,
    server: Arc<ndd_link::ServerConfig>,
    client: Arc<ndd_link::ClientConfig>,
}

/// Connection errors worth retrying while the peer may still be starting.
fn retryable(e: &ndd_link::LinkError) -> bool {
    matches!(
        e,
        ndd_link::LinkError::Connect { .. } | ndd_link::LinkError::ConnectTimeout { .. }
    )
}

/// Runs one side until all streams end, the peer closes, or `stop` turns true.
pub async fn run_side(
    cfg: &Config,
    opts: RunOptions,
    mut stop: watch::Receiver<bool>,
) -> Result<RunReport> {
    let side = opts.side;
    if (opts.insecure || cfg.link.insecure) && !opts.quiet {
        eprintln!(
            "ndd [{side}]: WARNING: --insecure: the link is plain TCP, neither authenticated nor \
             encrypted; anyone on the path can read and inject frames"
        );
    }
    let insecure = opts.insecure || cfg.link.insecure;
    let tls = if insecure {
        None
    } else {
        let identity = load_identity(&opts.home)?;
        Some(Tls {
            server: ndd_link::server_config(&identity).context("TLS server setup")?,
            client: ndd_link::client_config(&identity).context("TLS client setup")?,
            identity,
        })
    };
    let known = if insecure {
        None
    } else {
        Some(
            KnownPeers::load(&opts.home)
                .with_context(|| format!("cannot read known_peers in {}", opts.home.display()))?,
        )
    };
    let timeout = Duration::from_millis(cfg.link.connect_timeout_ms);
    let hello = cfg.hello(side);

    // Establish the link and agree on the plan.
    let (reader, writer, peer) = match opts.endpoint {
        Endpoint::Connect(ref addr) => {
            let deadline = Instant::now() + timeout;
            let mut backoff = Duration::from_millis(20);
            let (conn, info) = loop {
                match ndd_link::connect(addr, tls.as_ref().map(|t| &t.client), timeout).await {
                    Ok(c) => break c,
                    Err(e) if Instant::now() + backoff < deadline && retryable(&e) => {
                        tracing::debug!(%addr, error = %e, "connect failed; retrying");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(1));
                    }
                    Err(e) => {
                        return Err(anyhow!(e)).with_context(|| format!("cannot connect to {addr}"))
                    }
                }
            };
            handshake(
                conn,
                info,
                cfg,
                &hello,
                tls.as_ref(),
                known.as_ref(),
                &opts.home,
                timeout,
            )
            .await
            .map_err(|e| e.into_inner())?
        }
        Endpoint::Listen(_) | Endpoint::ListenOn(_) => {
            let listener = match opts.endpoint {
                Endpoint::Listen(ref addr) => ndd_link::listen(addr)
                    .await
                    .with_context(|| format!("cannot listen on {addr}"))?,
                Endpoint::ListenOn(l) => l,
                Endpoint::Connect(_) => unreachable!("matched above"),
            };
            if !opts.quiet {
                match listener.local_addr() {
                    Ok(a) => eprintln!("ndd [{side}]: listening on {a}"),
                    Err(e) => eprintln!("ndd [{side}]: listening (address unknown: {e})"),
                }
            }
            loop {
                let accepted = tokio::select! {
                    a = listener.accept(tls.as_ref().map(|t| &t.server), timeout) => a,
                    _ = stop.changed() => bail!("stopped before a peer connected"),
                };
                let (conn, info) = match accepted {
                    Ok(c) => c,
                    Err(e) => {
                        eprintln!("ndd [{side}]: rejected a connection: {e}");
                        continue;
                    }
                };
                match handshake(
                    conn,
                    info,
                    cfg,
                    &hello,
                    tls.as_ref(),
                    known.as_ref(),
                    &opts.home,
                    timeout,
                )
                .await
                {
                    Ok(x) => break x,
                    Err(HandshakeError::Garbage(e)) => {
                        eprintln!("ndd [{side}]: rejected a connection: {e:#}");
                        continue;
                    }
                    Err(HandshakeError::Fatal(e)) => return Err(e),
                }
            }
        }
    };
    if !opts.quiet {
        eprintln!("ndd [{side}]: connected to {peer}; streams agreed");
    }

    // Per-stream runtime.
    let (src_tx, mut src_rx) = mpsc::channel::<(usize, Option<Frame>)>(256);
    let mut streams = Vec::new();
    let mut source_tasks: Vec<JoinHandle<()>> = Vec::new();
    let mut endpoint_tasks: Vec<(
        usize,
        JoinHandle<std::result::Result<SourceReport, ndd_endpoint::EndpointError>>,
    )> = Vec::new();
    let mut sink_tasks: Vec<(
        usize,
        JoinHandle<std::result::Result<SinkReport, ndd_endpoint::EndpointError>>,
    )> = Vec::new();
    for (i, s) in cfg.streams.iter().enumerate() {
        let id = Config::stream_id(i);
        let role = if s.direction.source_side() == side {
            Role::Source
        } else {
            Role::Sink
        };
        let pairs: Vec<&dyn Pair> = s.pairs().into_iter().map(|m| m as &dyn Pair).collect();
        let stack = Stack::build(role, s.name(), &pairs)?;
        let dir = s.direction.wire().to_string();
        let mut rt = StreamRt {
            id,
            name: s.name().to_string(),
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
            sink_tx: None,
            ended: false,
            sent: 0,
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
                let h = s.sink.spawn(rx).with_context(|| {
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

    let (in_tx, in_rx) = mpsc::channel::<Inbound>(64);
    let reader_task = tokio::spawn(read_loop(reader, in_tx));
    let mut link = LinkIo::new(writer, in_rx);

    let ping_every = Duration::from_millis(cfg.link.ping_interval_ms.max(10));
    let mut next_ping = Instant::now();
    let mut next_stats = opts.live_stats.map(|d| Instant::now() + d);
    let deadline = opts.duration.map(|d| Instant::now() + d);
    let mut clock = ClockEstimate::default();
    let mut sources_open = streams
        .iter()
        .filter(|s| s.stack.role() == Role::Source)
        .count();
    let mut peer_closed = false;
    let mut close_sent = false;
    let mut stopping = false;

    let result: Result<()> = async {
        let mut linger_until: Option<Instant> = None;
        loop {
            // Finished: all our sources ended and all our sinks got their END; or the peer
            // closed; or the user stopped us. Say so once, then wait for the peer's CLOSE.
            let all_done = streams.iter().all(|s| s.ended);
            if (all_done || peer_closed || stopping) && !close_sent {
                let reason = if stopping {
                    "stopped"
                } else {
                    "all streams ended"
                };
                let said = async {
                    for s in streams.iter_mut().filter(|s| !s.ended) {
                        end_stream(s, &mut link, &clock).await?;
                    }
                    link.write_message(&close_msg(CloseCode::Normal, reason).as_message())
                        .await?;
                    link.flush().await?;
                    anyhow::Ok(())
                }
                .await;
                match said {
                    Ok(()) => {}
                    // The peer closed first and may be gone already: nothing more to tell it.
                    Err(_) if peer_closed => {}
                    Err(e) => return Err(e),
                }
                close_sent = true;
                linger_until = Some(Instant::now() + Duration::from_secs(3));
            }
            if close_sent && peer_closed {
                break;
            }
            let wake = [
                streams.iter().filter_map(|s| s.stack.poll_timeout()).min(),
                Some(next_ping),
                next_stats,
                deadline,
                linger_until,
            ]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
            tokio::select! {
                biased;
                _ = stop.changed(), if !stopping => { stopping = true; }
                msg = link.recv() => {
                    match msg {
                        None | Some((_, Ok(None))) => {
                            if close_sent || peer_closed {
                                break;
                            }
                            bail!("the peer disconnected without closing the session");
                        }
                        Some((_, Err(e))) => {
                            if close_sent {
                                break;
                            }
                            return Err(anyhow!(e).context("link to the peer failed"));
                        }
                        Some((at, Ok(Some(m)))) => {
                            if handle_incoming(m, at, &mut streams, &mut link, &mut clock).await? {
                                peer_closed = true;
                            }
                        }
                    }
                }
                f = src_rx.recv(), if sources_open > 0 => {
                    match f {
                        Some((i, Some(frame))) => {
                            let s = &mut streams[i];
                            if !s.ended {
                                s.stats.produced(frame.len());
                                s.stack.handle_frame(now(), frame)?;
                                pump(s, &mut link, &clock).await?;
                            }
                        }
                        Some((i, None)) => {
                            sources_open -= 1;
                            end_stream(&mut streams[i], &mut link, &clock).await?;
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
                    for s in streams.iter_mut() {
                        if s.stack.poll_timeout().is_some_and(|d| d <= t) {
                            s.stack.handle_timeout(t)?;
                            pump(s, &mut link, &clock).await?;
                        }
                    }
                    if t >= next_ping && !close_sent {
                        link.write_message(&Message::Ping { t1: wall_ns() }).await?;
                        link.flush().await?;
                        next_ping = t + ping_every;
                    }
                    if let Some(n) = next_stats {
                        if t >= n {
                            for s in streams.iter_mut() {
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
        }
        Ok(())
    }
    .await;

    // Wind down: no more frames for sinks; stop sources.
    for s in streams.iter_mut() {
        s.sink_tx = None;
    }
    for t in &source_tasks {
        t.abort();
    }
    reader_task.abort();
    let _ = link.shutdown().await;
    if let Err(e) = result {
        for (_, h) in &endpoint_tasks {
            h.abort();
        }
        let _ = link
            .write_message(&close_msg(CloseCode::InternalError, &format!("{e:#}")).as_message())
            .await;
        return Err(e);
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
    let summaries = streams
        .iter_mut()
        .map(|s| {
            s.stats.layers = s.stack.stats();
            s.stats.summary()
        })
        .collect();
    Ok(RunReport {
        streams: summaries,
        checks,
        peer,
        clock_offset: clock.best,
    })
}

fn now() -> Instant {
    Instant::now()
}

struct StreamRt {
    id: u16,
    name: String,
    stack: Stack,
    stats: StreamStats,
    sink_tx: Option<mpsc::Sender<Frame>>,
    ended: bool,
    sent: u64,
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

/// Writes what a stack produced: control first, then frames.
async fn pump(s: &mut StreamRt, writer: &mut LinkIo, clock: &ClockEstimate) -> Result<()> {
    while let Some((layer, msg)) = s.stack.poll_control() {
        writer
            .write_message(&Message::Control {
                stream: s.id,
                layer: layer as u8,
                msg: &msg,
            })
            .await?;
    }
    match s.stack.role() {
        Role::Source => {
            while let Some(mut f) = s.stack.poll_frame() {
                f.meta.stream = s.id;
                s.stats.wire(f.len());
                s.sent += 1;
                writer.write_frame(f, 0).await?;
            }
        }
        Role::Sink => {
            while let Some(f) = s.stack.poll_frame() {
                // Latency on our clock: the source timestamp moved by the offset estimate.
                s.stats
                    .delivered(f.len(), clock.to_local(f.meta.timestamp_ns), wall_ns());
                if let Some(tx) = &s.sink_tx {
                    if tx.send(f).await.is_err() {
                        bail!(
                            "stream \"{}\": the sink endpoint stopped accepting frames",
                            s.name
                        );
                    }
                }
            }
        }
    }
    writer.flush().await?;
    Ok(())
}

/// Ends a stream on this side: a source flushes its stack and tells the peer; a sink flushes
/// its stack into the endpoint and closes it.
async fn end_stream(s: &mut StreamRt, writer: &mut LinkIo, clock: &ClockEstimate) -> Result<()> {
    if s.ended {
        return Ok(());
    }
    s.stack.flush(now())?;
    pump(s, writer, clock).await?;
    if s.stack.role() == Role::Source {
        writer
            .write_message(&Message::End {
                stream: s.id,
                frames: s.sent,
            })
            .await?;
        writer.flush().await?;
    } else {
        s.sink_tx = None;
    }
    s.ended = true;
    Ok(())
}

/// Handles one message from the peer. Returns true when the peer closed the session normally.
async fn handle_incoming(
    m: Incoming,
    at: u64,
    streams: &mut [StreamRt],
    writer: &mut LinkIo,
    clock: &mut ClockEstimate,
) -> Result<bool> {
    let find = |streams: &mut [StreamRt], id: u16| -> Result<usize> {
        streams.iter().position(|s| s.id == id).ok_or_else(|| {
            anyhow!("the peer sent a message for stream id {id}, which is not configured")
        })
    };
    match m {
        Incoming::Data { header, payload } => {
            let i = find(streams, header.stream_id)?;
            let s = &mut streams[i];
            if s.stack.role() != Role::Sink || s.ended {
                bail!(
                    "the peer sent a frame on stream \"{}\", which it does not source",
                    s.name
                );
            }
            s.stats.wire(payload.len());
            let meta = Meta {
                stream: header.stream_id,
                seq: header.seq,
                // Kept as the source wrote it: pairs (checksum) cover it.
                timestamp_ns: header.timestamp_ns,
                flags: header.flags(),
            };
            s.stack
                .handle_frame(now(), Frame::from_bytes(meta, payload))?;
            pump(s, writer, clock).await?;
        }
        Incoming::Other(msg) => match msg {
            OwnedMessage::Control { stream, layer, msg } => {
                let i = find(streams, stream)?;
                let s = &mut streams[i];
                s.stack
                    .handle_control(now(), layer as usize, Bytes::from(msg))?;
                pump(s, writer, clock).await?;
            }
            OwnedMessage::End { stream, .. } => {
                let i = find(streams, stream)?;
                let s = &mut streams[i];
                if s.stack.role() != Role::Sink {
                    bail!(
                        "the peer ended stream \"{}\", which it does not source",
                        s.name
                    );
                }
                end_stream(s, writer, clock).await?;
            }
            OwnedMessage::Ping { t1 } => {
                let t2 = wall_ns();
                writer
                    .write_message(&Message::Pong {
                        t1,
                        t2,
                        t3: wall_ns(),
                    })
                    .await?;
                writer.flush().await?;
            }
            OwnedMessage::Pong { t1, t2, t3 } => clock.sample(t1, t2, t3, at),
            OwnedMessage::Ack { .. } => {}
            OwnedMessage::Close {
                code: CloseCode::Normal,
                ..
            } => {
                // No more frames will come: deliver what our sinks hold. Our own sources
                // are ended (and told) when we send our CLOSE.
                for s in streams.iter_mut().filter(|s| s.stack.role() == Role::Sink) {
                    end_stream(s, writer, clock).await?;
                }
                return Ok(true);
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
    Ok(false)
}

/// What the reader task hands over: when the message came off the socket (our clock, ns),
/// and the message, `None` at a clean end, or the link error.
type Inbound = (
    u64,
    std::result::Result<Option<Incoming>, ndd_link::LinkError>,
);

async fn read_loop(mut reader: MessageReader, tx: mpsc::Sender<Inbound>) {
    loop {
        let r = reader.read().await;
        let end = !matches!(r, Ok(Some(_)));
        if tx.send((wall_ns(), r)).await.is_err() || end {
            return;
        }
    }
}

/// The session's side of the link: writes, and the inbound queue from the reader task.
///
/// While a write waits for the socket, inbound messages keep being taken off the reader's
/// channel into `overflow`, so two sides that both write bulk data at each other cannot
/// deadlock (each blocked on a write the other no longer reads). The overflow only grows
/// while our write is blocked, i.e. while the peer is not reading, and the peer resumes
/// reading as soon as its own write, which we are draining, completes.
struct LinkIo {
    writer: MessageWriter,
    in_rx: mpsc::Receiver<Inbound>,
    overflow: std::collections::VecDeque<Inbound>,
    in_closed: bool,
}

/// Runs a write on the writer while draining inbound messages into the overflow queue.
macro_rules! draining {
    ($link:expr, $w:ident => $fut:expr) => {{
        let LinkIo {
            writer: $w,
            in_rx,
            overflow,
            in_closed,
        } = $link;
        let fut = $fut;
        tokio::pin!(fut);
        loop {
            tokio::select! {
                biased;
                r = &mut fut => break r,
                m = in_rx.recv(), if !*in_closed => match m {
                    Some(m) => overflow.push_back(m),
                    None => *in_closed = true,
                },
            }
        }
    }};
}

impl LinkIo {
    fn new(writer: MessageWriter, in_rx: mpsc::Receiver<Inbound>) -> LinkIo {
        LinkIo {
            writer,
            in_rx,
            overflow: Default::default(),
            in_closed: false,
        }
    }

    async fn recv(&mut self) -> Option<Inbound> {
        match self.overflow.pop_front() {
            Some(m) => Some(m),
            None if self.in_closed => None,
            None => self.in_rx.recv().await,
        }
    }

    async fn write_frame(&mut self, f: Frame, flags: u16) -> Result<(), ndd_link::LinkError> {
        draining!(self, w => w.write_frame(f, flags))
    }

    async fn write_message(&mut self, m: &Message<'_>) -> Result<(), ndd_link::LinkError> {
        draining!(self, w => w.write_message(m))
    }

    async fn flush(&mut self) -> Result<(), ndd_link::LinkError> {
        draining!(self, w => w.flush())
    }

    async fn shutdown(&mut self) -> Result<(), ndd_link::LinkError> {
        self.writer.shutdown().await
    }
}

/// Why a handshake failed: garbage from something that is not an ndd peer (the listener
/// goes on serving), or a real peer we cannot work with (fatal, reported on both sides).
enum HandshakeError {
    Garbage(anyhow::Error),
    Fatal(anyhow::Error),
}

impl HandshakeError {
    fn into_inner(self) -> anyhow::Error {
        match self {
            HandshakeError::Garbage(e) | HandshakeError::Fatal(e) => e,
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn handshake(
    conn: Conn,
    info: PeerInfo,
    cfg: &Config,
    hello: &ndd_wire::HelloRepr,
    tls: Option<&Tls>,
    known: Option<&KnownPeers>,
    home: &std::path::Path,
    timeout: Duration,
) -> std::result::Result<(MessageReader, MessageWriter, String), HandshakeError> {
    use HandshakeError::{Fatal, Garbage};
    let (mut reader, mut writer) = conn.split();
    reader.set_max_body(cfg.link.max_frame_bytes);
    let home_arg = format!(" --home {}", home.display());
    // Trust: pinned fingerprints.
    let peer_name = match (tls, known, &info.fingerprint) {
        (Some(tls), Some(known), Some(fp)) => match known.lookup(fp) {
            Some(t) => t.name.clone().unwrap_or_else(|| fp.clone()),
            None => {
                // Told to the refused peer, about itself: its own fingerprint and how we would
                // come to trust it.
                let reason = format!(
                    "this install ({fp}) is not trusted by the peer ({}); on the peer's machine run: ndd trust {fp}",
                    tls.identity.fingerprint()
                );
                let _ = writer
                    .write_message(&close_msg(CloseCode::UntrustedPeer, &reason).as_message())
                    .await;
                let _ = writer.flush().await;
                let _ = writer.shutdown().await;
                return Err(Fatal(anyhow!(
                    "refused untrusted peer {} with fingerprint {fp}; if you trust it, run: ndd trust {fp}{home_arg}",
                    info.addr
                )));
            }
        },
        _ => info.addr.to_string(),
    };
    let send = async {
        writer.write_message(&Message::Hello(hello.clone())).await?;
        writer.flush().await
    };
    send.await
        .map_err(|e| Garbage(anyhow!(e).context("sending HELLO")))?;
    let first = tokio::time::timeout(timeout, reader.read())
        .await
        .map_err(|_| {
            Garbage(anyhow!(
                "{}: no HELLO within {} ms",
                info.addr,
                timeout.as_millis()
            ))
        })?;
    let theirs = match first {
        Ok(Some(Incoming::Other(OwnedMessage::Hello(h)))) => h,
        Ok(Some(Incoming::Other(OwnedMessage::Close { code, reason }))) => {
            return Err(Fatal(anyhow!(
                "the peer refused the session ({code}): {reason}"
            )));
        }
        Ok(Some(_)) => {
            return Err(Garbage(anyhow!(
                "{}: the first message was not a HELLO",
                info.addr
            )))
        }
        Ok(None) => {
            return Err(Garbage(anyhow!(
                "{}: closed the connection before its HELLO",
                info.addr
            )))
        }
        Err(e) => {
            // A first byte that could be a future version of ours is a version mismatch;
            // anything else (an HTTP request, random bytes) is just not an ndd.
            if let ndd_link::LinkError::Wire(WireError::UnknownVersion {
                got: got @ 2..=15,
                expected,
            }) = &e
            {
                let reason = format!(
                    "peer speaks protocol version {got}, this side speaks version {expected}"
                );
                let _ = writer
                    .write_message(&close_msg(CloseCode::VersionMismatch, &reason).as_message())
                    .await;
                let _ = writer.flush().await;
                return Err(Fatal(anyhow!(reason)));
            }
            return Err(Garbage(
                anyhow!(e).context(format!("{}: bad handshake", info.addr)),
            ));
        }
    };
    if let Err(m) = ndd_wire::compare_hello(hello, &theirs) {
        let reason = m.to_string();
        let _ = writer
            .write_message(&close_msg(CloseCode::StackMismatch, &reason).as_message())
            .await;
        let _ = writer.flush().await;
        let _ = writer.shutdown().await;
        return Err(Fatal(anyhow!(reason)));
    }
    let ready = async {
        writer.write_message(&Message::Ready).await?;
        writer.flush().await
    };
    ready
        .await
        .map_err(|e| Fatal(anyhow!(e).context("sending READY")))?;
    match tokio::time::timeout(timeout, reader.read()).await {
        Ok(Ok(Some(Incoming::Other(OwnedMessage::Ready)))) => Ok((reader, writer, peer_name)),
        Ok(Ok(Some(Incoming::Other(OwnedMessage::Close { code, reason })))) => Err(Fatal(anyhow!(
            "the peer refused the session ({code}): {reason}"
        ))),
        Ok(Ok(Some(_))) => Err(Fatal(anyhow!(
            "the peer sent something else than READY after HELLO"
        ))),
        Ok(Ok(None)) => Err(Fatal(anyhow!(
            "the peer closed the connection during the handshake"
        ))),
        Ok(Err(e)) => Err(Fatal(anyhow!(e).context("handshake"))),
        Err(_) => Err(Fatal(anyhow!(
            "the peer did not confirm the handshake within {} ms",
            timeout.as_millis()
        ))),
    }
}

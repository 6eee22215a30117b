//! Runs one side of a driver: the tokio driver of the sans-IO [`ndd_core::Session`].
//!
//! It gets a link from an [`ndd_link::Connector`] (listen or connect, trust, handshake),
//! starts the endpoints, and then loops: it selects over the link's messages, the sources'
//! frames (only from sources the session is ready for: backpressure), the write in flight,
//! the user's stop and the session's next deadline; it feeds each to the session, hands the
//! session's events to the endpoints and writes what `poll_transmit` yields. The protocol
//! (ACK, DELIVERED, RESUME, resend, dedupe, peer restart, keepalive, close) lives in the
//! session, not here.
//!
//! Writes run as one future at a time that owns the writer, so reading goes on while a
//! write waits for the socket: two sides writing bulk data at each other cannot deadlock.

use crate::config::{Config, SideName};
use crate::stats::{StreamStats, StreamSummary};
use anyhow::{anyhow, bail, Context, Result};
use ndd_core::session::{Event, Incoming, Session, SessionConfig, StreamPlan, Transmit};
use ndd_core::{Frame, Meta, Pair, Role};
use ndd_endpoint::delivered::INJECTED_SEQ;
use ndd_endpoint::display::LinkState;
use ndd_endpoint::{CheckReport, Delivered, Demand, SinkReport, SourceReport};
use ndd_link::udp::{DropCounts, LinkDrops};
use ndd_link::{Connector, EstablishError, Established, HandshakeCtx, Identity, Listener, Rx, Tx};
use ndd_wire::{CloseCode, OwnedMessage};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

pub use ndd_link::TransportKind;

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
    /// Stop after this long (counted from the start, connected or not).
    pub duration: Option<Duration>,
    /// No informational lines on stderr (benchmarks); errors still surface as `Err`.
    pub quiet: bool,
    /// One session (`--once`): the first connect gives up after `connect_timeout_ms`, the
    /// peer's stop ends this side, and this side's stop ends the peer's streams (END). Without
    /// it a side outlives its peer: it keeps its endpoints and waits for the peer forever.
    pub once: bool,
    /// Serve the counters in Prometheus' text format at `http://ADDR/metrics`.
    pub metrics: Option<String>,
}

/// What `--metrics` serves, refreshed every second.
type Metrics = Arc<std::sync::Mutex<String>>;

/// Binds `addr` and serves the latest snapshot at `GET /metrics` (404 elsewhere, 405 for
/// another method) with hyper's HTTP/1.1 server; a client gets 5 s to send its request
/// head and 10 s in all.
async fn serve_metrics(addr: &str) -> Result<(Metrics, JoinHandle<()>)> {
    use http_body_util::Full;
    use hyper::{Method, Request, Response, StatusCode};
    let l = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("--metrics: cannot listen on {addr}"))?;
    let snapshot: Metrics = Arc::default();
    let s = snapshot.clone();
    let task = tokio::spawn(async move {
        loop {
            let c = match l.accept().await {
                Ok((c, _)) => c,
                // Out of file descriptors and the like: try again shortly.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let s = s.clone();
            tokio::spawn(async move {
                let answer = move |req: Request<hyper::body::Incoming>| {
                    let s = s.clone();
                    async move {
                        let (status, kind, body) = if req.uri().path() != "/metrics" {
                            (
                                StatusCode::NOT_FOUND,
                                "text/plain; charset=utf-8",
                                "not found: the counters are at /metrics\n".to_string(),
                            )
                        } else if req.method() != Method::GET && req.method() != Method::HEAD {
                            (
                                StatusCode::METHOD_NOT_ALLOWED,
                                "text/plain; charset=utf-8",
                                "only GET /metrics\n".to_string(),
                            )
                        } else {
                            (
                                StatusCode::OK,
                                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                                s.lock().unwrap_or_else(|p| p.into_inner()).clone(),
                            )
                        };
                        Response::builder()
                            .status(status)
                            .header(hyper::header::CONTENT_TYPE, kind)
                            .body(Full::new(bytes::Bytes::from(body)))
                    }
                };
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(Duration::from_secs(5))
                    .keep_alive(false)
                    .serve_connection(
                        hyper_util::rt::TokioIo::new(c),
                        hyper::service::service_fn(answer),
                    );
                let _ = tokio::time::timeout(Duration::from_secs(10), conn).await;
            });
        }
    });
    Ok((snapshot, task))
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
    /// Datagrams a UDP link dropped, over all its connections (`None`: not a UDP link).
    pub link_drops: Option<DropCounts>,
}

/// A side that ended with an error, with what it had counted until then (`--stats-json` is
/// written on an error exit too). Shows as the error it carries.
#[derive(Debug)]
pub struct SideFailed {
    /// The counters at the end.
    pub report: RunReport,
    /// What went wrong.
    pub error: anyhow::Error,
}

impl std::fmt::Display for SideFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&crate::logfmt::error_text(&self.error))
    }
}

impl std::error::Error for SideFailed {}

/// The drop counts of every UDP connection a side had, added (`None` if it had none).
fn drop_counts(links: &[Arc<LinkDrops>]) -> Option<DropCounts> {
    links.iter().map(|d| d.counts()).reduce(DropCounts::plus)
}

/// Nanoseconds since the Unix epoch, our clock.
pub fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Sets up TLS material for a side (creating the identity on first use).
pub fn load_identity(home: &std::path::Path) -> Result<Identity> {
    let (id, created) = Identity::load_or_create(home)
        .with_context(|| format!("cannot load or create the identity in {}", home.display()))?;
    if created {
        tracing::warn!(
            "created a new identity in {} (fingerprint {})",
            home.display(),
            id.fingerprint()
        );
    }
    Ok(id)
}

/// A random id for this process run (RESUME).
fn run_id() -> u64 {
    use std::io::Read;
    let mut b = [0u8; 8];
    match std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)) {
        Ok(()) => u64::from_be_bytes(b),
        Err(_) => wall_ns() ^ u64::from(std::process::id()).rotate_left(32),
    }
}

/// What a link's reader task hands over: when the message came off the socket (our wall
/// clock, ns) and the message, `None` at a clean end, or the link error.
type Inbound = (u64, Result<Option<Incoming>, ndd_link::LinkError>);

async fn read_loop(mut reader: Rx, tx: mpsc::Sender<Inbound>) {
    loop {
        let r = reader.read().await;
        let end = !matches!(r, Ok(Some(_)));
        if tx.send((wall_ns(), r)).await.is_err() || end {
            return;
        }
    }
}

/// What a finished write hands back: the writer, the emptied batch (its allocation is used
/// again), and how it went.
type Written = (Tx, Vec<Transmit>, Result<(), ndd_link::LinkError>);

/// Writes a batch of transmits and flushes.
async fn write_batch(mut tx: Tx, mut batch: Vec<Transmit>) -> Written {
    let mut r = Ok(());
    for t in &batch {
        r = tx.write_transmit(t).await;
        if r.is_err() {
            break;
        }
    }
    if r.is_ok() {
        r = tx.flush().await;
    }
    batch.clear();
    (tx, batch, r)
}

type Writing = Pin<Box<dyn Future<Output = Written> + Send>>;
type Reconnect<'a> = Pin<Box<dyn Future<Output = Result<Established, EstablishError>> + Send + 'a>>;
type Busy<'a> = Pin<Box<dyn Future<Output = EstablishError> + Send + 'a>>;

/// The reason a revoked peer is given when its live link is closed.
const UNTRUSTED_NOW: &str = "its fingerprint was removed from known_peers (ndd untrust)";

/// How often a side with a link up checks that its peer is still in `known_peers`.
const TRUST_CHECK: Duration = Duration::from_secs(2);

/// Most transmits or bytes written in one go before the driver looks around again.
const BATCH_FRAMES: usize = 64;
const BATCH_BYTES: usize = 1 << 20;

/// One live connection: its reader task's channel and the writer (or the write in flight).
struct Link {
    inbound: mpsc::Receiver<Inbound>,
    reader: JoinHandle<()>,
    idle: Option<Tx>,
    writing: Option<Writing>,
    /// The batch vector between writes.
    spare: Vec<Transmit>,
}

impl Link {
    fn new(mut e: Established, sess: &mut Session, chunk_bytes: usize) -> Link {
        let (cuts, peer_max_body) = e.tx.chunking();
        sess.set_chunking(if cuts { chunk_bytes } else { 0 }, peer_max_body);
        for p in (0..sess.stream_count()).map(|i| sess.plan(i)) {
            if p.role == Role::Source {
                e.tx.set_stream_priority(p.id, p.priority);
            }
        }
        let (tx, inbound) = mpsc::channel(64);
        Link {
            inbound,
            reader: tokio::spawn(read_loop(e.rx, tx)),
            idle: Some(e.tx),
            writing: None,
            spare: Vec::with_capacity(BATCH_FRAMES),
        }
    }

    /// Starts writing what the session has to send, if the writer is free.
    fn start_write(&mut self, sess: &mut Session) {
        let Some(mut tx) = self.idle.take() else {
            return;
        };
        if let Some(limit) = sess.unsent_limit() {
            tx.set_unsent_limit(limit);
        }
        let mut batch = std::mem::take(&mut self.spare);
        let mut bytes = 0;
        let (now, wall) = (Instant::now(), wall_ns());
        while batch.len() < BATCH_FRAMES && bytes < BATCH_BYTES {
            let Some(t) = sess.poll_transmit(now, wall) else {
                break;
            };
            let chunk = matches!(t, Transmit::Data { more: true, .. });
            if let Transmit::Data { payload, .. } = &t {
                bytes += payload.len();
            }
            batch.push(t);
            if chunk {
                // The rest of a cut frame waits for the next batch, which a more urgent
                // stream's frame that came meanwhile goes ahead of (a batch is written whole).
                break;
            }
        }
        if batch.is_empty() {
            self.idle = Some(tx);
            self.spare = batch;
        } else {
            self.writing = Some(Box::pin(write_batch(tx, batch)));
        }
    }

    /// A write finished: the writer and the batch vector are free again.
    fn done_writing(&mut self, tx: Tx, spare: Vec<Transmit>) {
        self.writing = None;
        self.idle = Some(tx);
        self.spare = spare;
    }

    /// Tells the peer it is no longer trusted (a CLOSE with code 4, after the write in flight),
    /// closes our direction and reads on until the peer closes too (within a second), before
    /// the link is dropped. Dropped with the peer's frames unread, a TCP socket resets the
    /// connection, and the peer lost the CLOSE to the reset about one time in three
    /// (`link lost: connection: Connection reset by peer` instead of the reason).
    async fn say_untrusted(&mut self) {
        let say = async {
            if let Some(w) = self.writing.take() {
                let (tx, spare, r) = w.await;
                self.done_writing(tx, spare);
                r.ok()?;
            }
            let tx = self.idle.as_mut()?;
            let close = Transmit::Message(OwnedMessage::Close {
                code: CloseCode::UntrustedPeer,
                reason: UNTRUSTED_NOW.to_string(),
            });
            tx.write_transmit(&close).await.ok()?;
            tx.flush().await.ok()?;
            close_and_drain(tx, &mut self.inbound).await;
            Some(())
        };
        let _ = tokio::time::timeout(Duration::from_secs(1), say).await;
    }

    /// Finishes the write in flight and anything left, then closes our direction (within a
    /// second; the reader task stops when the link is dropped).
    async fn goodbye(mut self, sess: &mut Session) {
        let finish = async {
            loop {
                if self.writing.is_none() {
                    self.start_write(sess);
                }
                let Some(w) = self.writing.take() else { break };
                let (tx, spare, r) = w.await;
                if r.is_err() {
                    return;
                }
                self.done_writing(tx, spare);
            }
            let Some(mut tx) = self.idle.take() else {
                return;
            };
            close_and_drain(&mut tx, &mut self.inbound).await;
        };
        let _ = tokio::time::timeout(Duration::from_secs(1), finish).await;
    }
}

/// Closes our direction of the link and, on TCP, reads on until the peer closes too: closing
/// a socket with unread bytes (the peer's last frames, PINGs and ACKs) resets the connection,
/// and the peer could lose what we said last (our CLOSE) to the reset. Datagram links have no
/// reset and no end.
async fn close_and_drain(tx: &mut Tx, inbound: &mut mpsc::Receiver<Inbound>) {
    let tcp = matches!(tx, Tx::Tcp(_));
    let _ = tx.shutdown().await;
    if tcp {
        while let Some((_, Ok(Some(_)))) = inbound.recv().await {}
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// One stream's endpoint end on this side: its task, the channel to or from it, and its stats.
struct StreamIo {
    stats: StreamStats,
    /// Source: frames from the endpoint (`None` once it ended).
    source: Option<mpsc::Receiver<Frame>>,
    source_task: Option<SourceTask>,
    /// Sink: frames for the endpoint (`None` once the stream ended and all were handed on).
    sink: Option<mpsc::Sender<Frame>>,
    /// Sink: frames the endpoint's channel had no room for yet. The driver never waits on one
    /// sink: a sink that does not drain holds back its own stream alone (reliable: the peer's
    /// resume buffer fills, unconfirmed, and its source stops; lossy: the oldest are dropped
    /// beyond [`LOSSY_BEHIND`]), while the link, the other streams, pings and ACKs go on.
    pending: std::collections::VecDeque<Frame>,
    /// Sink: the stream ended; the sender goes once `pending` is empty.
    sink_ended: bool,
    sink_task: Option<SinkTask>,
    /// Sink: what the endpoint has completed.
    completed: Option<Delivered>,
    /// Sink of an input device: the record that releases every held key and button.
    release: Option<Vec<u8>>,
    /// Sink that shows the link's state (a viewer window).
    shows_link: bool,
    /// Source that captures on demand: when the session wants its next frame.
    demand: Option<Demand>,
}

type SourceTask = JoinHandle<std::result::Result<SourceReport, ndd_endpoint::EndpointError>>;
type SinkTask = JoinHandle<std::result::Result<SinkReport, ndd_endpoint::EndpointError>>;

fn role_name(role: Role) -> &'static str {
    match role {
        Role::Source => "source",
        Role::Sink => "sink",
    }
}

/// Prints informational lines unless the side runs quietly.
macro_rules! note {
    ($quiet:expr, $side:expr, $($arg:tt)*) => {
        if !$quiet {
            tracing::info!(side = %$side, $($arg)*);
        }
    };
}

/// [`run_side`] as a task of the runtime (what `ndd run`, the demo and the benches call).
/// Run by `block_on` instead, the session would live on the thread that called it, outside
/// the runtime's workers: every frame a reader or source task hands it would wake that thread
/// across threads (a futex wake-up), and both sides of a loopback run would share it. Measured
/// on two `ndd run` processes, 100 B every 2 ms over TLS: one-way p50 88 µs in `block_on`,
/// 27 µs as a task.
pub async fn run_side_task(
    cfg: std::sync::Arc<Config>,
    opts: RunOptions,
    stop: watch::Receiver<bool>,
) -> Result<RunReport> {
    tokio::spawn(async move { run_side(&cfg, opts, stop).await })
        .await
        .map_err(|e| anyhow!("the session task failed: {e}"))?
}

/// Runs one side until all streams end, the peer closes, or `stop` turns true.
pub async fn run_side(
    cfg: &Config,
    opts: RunOptions,
    mut stop: watch::Receiver<bool>,
) -> Result<RunReport> {
    if cfg.link.transport == TransportKind::Nats {
        return crate::fanout::run_side(cfg, opts, stop).await;
    }
    let side = opts.side;
    let quiet = opts.quiet;
    let started = Instant::now();
    let deadline = opts.duration.map(|d| started + d);
    let insecure = opts.insecure || cfg.link.insecure;
    // This side's endpoints, before anything connects: a wrong path or display is reported
    // here, not after the peer came.
    cfg.probe_side(side)?;
    let transport = cfg.link.transport;
    if insecure && !quiet && transport != TransportKind::Udp {
        tracing::warn!(
            side = %side,
            "WARNING: --insecure: the link is plain TCP, neither authenticated nor encrypted; \
             anyone on the path can read and inject frames"
        );
    }
    if transport == TransportKind::Quic && insecure {
        bail!("QUIC always encrypts and authenticates: drop --insecure / link.insecure, or use transport = \"tcp\"");
    }
    let tls = if insecure {
        None
    } else {
        let identity = load_identity(&opts.home)?;
        // Read now, so a broken trust file is reported before any peer connects (it is read
        // again on every connection: a peer trusted meanwhile is admitted).
        ndd_link::KnownPeers::load(&opts.home)?;
        Some(Arc::new(ndd_link::Tls::new(identity).context("TLS setup")?))
    };
    if transport == TransportKind::Udp && insecure && !quiet {
        let bare: Vec<&str> = cfg
            .streams
            .iter()
            .filter(|s| !s.pairs().iter().any(|m| m.name() == "encrypt"))
            .map(|s| s.name())
            .collect();
        if !bare.is_empty() {
            tracing::warn!(
                side = %side,
                "WARNING: --insecure: the UDP link neither encrypts nor authenticates; stream(s) {} \
                 carry no `encrypt` pair, so anyone on the path can read and inject their frames",
                bare.join(", ")
            );
        }
    }
    let ctx = HandshakeCtx {
        hello: cfg.hello(side),
        max_body: cfg.link.max_frame_bytes,
        tls: tls.clone(),
        home: opts.home.clone(),
        timeout: Duration::from_millis(cfg.link.connect_timeout_ms),
        keep_trying: !opts.once,
        handshake_timeout: Duration::from_millis(cfg.link.handshake_timeout_ms),
        max_backoff: Duration::from_millis(cfg.link.max_backoff_ms),
        side: side.as_str(),
        busy_with: None,
    };
    let metrics = match &opts.metrics {
        Some(addr) => {
            let (m, task) = serve_metrics(addr).await?;
            // Before the first peer: the link is down, no stream has moved.
            *m.lock().unwrap_or_else(|p| p.into_inner()) =
                crate::stats::prometheus(side.as_str(), false, 0, None, &[]);
            note!(quiet, side, "metrics at http://{addr}/metrics");
            Some((m, AbortOnDrop(task)))
        }
        None => None,
    };
    let connector = match opts.endpoint {
        Endpoint::ListenOn(l) if transport == TransportKind::Tcp => Connector::Listen(l),
        Endpoint::ListenOn(_) => bail!("a pre-bound listener is TCP only"),
        Endpoint::Listen(addr) => Connector::new(transport, true, &addr, tls.as_deref()).await?,
        Endpoint::Connect(addr) => Connector::new(transport, false, &addr, tls.as_deref()).await?,
    };
    if let Some(a) = connector.local_addr() {
        note!(quiet, side, "listening on {a}");
    }

    // The first link: any failure here ends the run (mismatch, untrusted, nobody there).
    let first = tokio::select! {
        e = connector.establish(&ctx, true) => e?,
        _ = stop.changed() => {
            if opts.once {
                bail!("stopped before a peer connected");
            }
            // A side that outlives its peers stopped cleanly: nothing to report.
            note!(quiet, side, "stopped before a peer connected");
            return Ok(RunReport {
                streams: Vec::new(),
                checks: Vec::new(),
                peer: String::new(),
                clock_offset: None,
                recoveries: Vec::new(),
                link_drops: None,
            });
        }
        _ = sleep_until_opt(deadline) => bail!(
            "no peer connected within --duration ({:.1} s)",
            opts.duration.unwrap_or_default().as_secs_f64()
        ),
    };
    let peer = first.peer.clone();
    // Checked against known_peers while the link is up: `ndd untrust` ends a live link.
    let mut peer_fp = first.fingerprint.clone();
    // A peer on this host stamps its frames with this host's clock: its timestamps are ours
    // as they are. The PING/PONG estimate of the offset is right only to within half a round
    // trip (on loopback ±20 µs, as large as the one-way time itself there).
    let mut same_clock = first.addr.ip().is_loopback();
    let mut next_trust_check = Instant::now() + TRUST_CHECK;
    note!(quiet, side, "connected to {peer}; streams agreed");

    // Streams: plans for the session, endpoints as tasks.
    let mut plans = Vec::with_capacity(cfg.streams.len());
    let mut io: Vec<StreamIo> = Vec::with_capacity(cfg.streams.len());
    for (i, s) in cfg.streams.iter().enumerate() {
        let id = Config::stream_id(i);
        let role = if s.direction.source_side() == side {
            Role::Source
        } else {
            Role::Sink
        };
        let release = match role {
            Role::Sink => s.sink.release_record(),
            Role::Source => None,
        };
        plans.push(StreamPlan {
            id,
            name: s.name().to_string(),
            role,
            reliable: s.reliability == crate::config::Reliability::Reliable,
            release_on_loss: release.is_some(),
            replay_outage: role == Role::Sink || s.source.replays_outage(),
            priority: s.priority(),
            pairs: s
                .pairs()
                .into_iter()
                .map(|m| Arc::new(m.clone()) as Arc<dyn Pair + Send + Sync>)
                .collect(),
        });
        let mut e = StreamIo {
            stats: StreamStats::new(s.name(), role_name(role), s.direction.wire().to_string()),
            source: None,
            source_task: None,
            sink: None,
            pending: Default::default(),
            sink_ended: false,
            sink_task: None,
            completed: None,
            release,
            shows_link: role == Role::Sink && s.sink.shows_link_state(),
            demand: None,
        };
        let (tx, rx) = mpsc::channel::<Frame>(64);
        match role {
            Role::Source => {
                e.demand = s.source.captures_on_demand().then(Demand::new);
                let demand = e.demand.clone();
                e.source_task =
                    Some(s.source.spawn_on_demand(id, tx, demand).with_context(|| {
                        format!(
                            "stream \"{}\": cannot start source {}",
                            s.name(),
                            s.source.describe()
                        )
                    })?);
                e.source = Some(rx);
            }
            Role::Sink => {
                let done = Delivered::default();
                e.sink_task = Some(s.sink.spawn_tracked(rx, done.clone()).with_context(|| {
                    format!(
                        "stream \"{}\": cannot start sink {}",
                        s.name(),
                        s.sink.describe()
                    )
                })?);
                e.sink = Some(tx);
                e.completed = Some(done);
            }
        }
        io.push(e);
    }
    let n = io.len();

    let scfg = SessionConfig {
        resume_buffer_bytes: cfg.link.resume_buffer_bytes as usize,
        flight_min_bytes: cfg.link.flight_min_bytes as usize,
        ping_interval: Duration::from_millis(cfg.link.ping_interval_ms.max(10)),
        keepalive_timeout: Duration::from_millis(cfg.link.keepalive_timeout_ms),
        reconnect: cfg.link.reconnect,
        outlive_peer: !opts.once,
        max_frame_bytes: cfg.link.max_frame_bytes as usize,
        chunk_bytes: cfg.link.chunk_bytes as usize,
        ..SessionConfig::default()
    };
    let mut sess = Session::new(scfg, plans, run_id())?;
    sess.handle_link_up(Instant::now());
    // Every UDP connection's drop counters (read live and at the end).
    let mut udp_drops: Vec<Arc<LinkDrops>> = first.rx.drops().into_iter().collect();
    let mut link = Some(Link::new(first, &mut sess, cfg.link.chunk_bytes as usize));
    let mut reconnect: Option<Reconnect<'_>> = None;
    // While a link is up, a listener tells any other peer that connects that it is busy.
    let mut busy: Option<Busy<'_>> =
        Some(Box::pin(connector.refuse_while_busy(&ctx, peer.clone())));
    // Live lines and the metrics snapshot are refreshed on the same tick.
    let tick = opts
        .live_stats
        .or(metrics.as_ref().map(|_| Duration::from_secs(1)));
    let mut next_stats = tick.map(|d| Instant::now() + d);
    let mut cursor = 0usize;
    let mut ready: Vec<bool> = Vec::with_capacity(n);
    let mut stopping = false;
    let mut link_state = "up";

    let result: Result<()> = async {
        loop {
            // What the session has for the endpoints and the user.
            while let Some(ev) = sess.poll_event() {
                match ev {
                    Event::Deliver { stream, frame } => {
                        let ts = frame.meta.timestamp_ns;
                        let created = if same_clock { ts } else { sess.peer_to_local(ts) };
                        io[stream].stats.delivered(frame.len(), created, wall_ns());
                        let e = &mut io[stream];
                        if e.sink.is_some() {
                            e.pending.push_back(frame);
                            if !sess.plan(stream).reliable && e.pending.len() > LOSSY_BEHIND {
                                e.pending.pop_front();
                                e.stats.sink_behind += 1;
                            }
                        }
                    }
                    Event::ReleaseInputs { stream } => {
                        let e = &mut io[stream];
                        if let (Some(_), Some(rec)) = (&e.sink, &e.release) {
                            let meta = Meta {
                                stream: sess.plan(stream).id,
                                seq: INJECTED_SEQ,
                                timestamp_ns: wall_ns(),
                                flags: 0,
                            };
                            e.pending.push_back(Frame::new(meta, rec));
                        }
                    }
                    Event::StreamEnded { stream } => io[stream].sink_ended = true,
                    Event::LinkLost { reason } => {
                        note!(quiet, side, "link lost: {reason}; reconnecting");
                        show_link(&mut io, LinkState::Down);
                        link_state = "down, reconnecting";
                        link = None;
                        busy = None;
                        reconnect = Some(Box::pin(connector.establish(&ctx, false)));
                    }
                    Event::PeerStopped { reason } => {
                        note!(
                            quiet,
                            side,
                            "{reason}; this side keeps its endpoints and waits for it to come back"
                        );
                        show_link(&mut io, LinkState::PeerStopped);
                        link_state = "down: the peer stopped; waiting for it";
                        link = None;
                        busy = None;
                        reconnect = Some(Box::pin(connector.establish(&ctx, false)));
                    }
                    Event::Resumed { after, resending } => {
                        note!(
                            quiet,
                            side,
                            "link restored after {:.0} ms; resending {resending} unacknowledged frame(s)",
                            after.as_secs_f64() * 1e3
                        );
                        show_link(&mut io, LinkState::Up);
                    }
                    Event::PeerRestarted { resending } => {
                        note!(
                            quiet,
                            side,
                            "the peer restarted; its streams start again ({resending} frame(s) it had not completed are sent again)"
                        );
                        show_link(&mut io, LinkState::Up);
                        // A restarted viewer has none of the screen: send all of it.
                        for d in io.iter().filter_map(|e| e.demand.as_ref()) {
                            d.request_keyframe();
                        }
                    }
                    Event::Warning(w) => tracing::warn!(side = %side, "{w}"),
                    Event::Closed(how) => tracing::debug!(side = %side, ?how, "session closed"),
                }
            }
            // Hand on what each sink's channel has room for; never wait on one.
            for (i, e) in io.iter_mut().enumerate() {
                if !hand_on(e) {
                    bail!(
                        "stream \"{}\": the sink endpoint stopped accepting frames",
                        sess.plan(i).name
                    );
                }
            }
            if sess.state() == ndd_core::State::Closed {
                break;
            }
            // What our sinks completed, then what goes out.
            for (i, e) in io.iter().enumerate() {
                if let Some(c) = &e.completed {
                    sess.handle_sink_completed(i, c.count());
                }
            }
            if let Some(l) = link.as_mut() {
                if l.writing.is_none() {
                    l.start_write(&mut sess);
                }
            }
            let sinks_busy = sess.awaiting_completion();
            let wake = [
                sess.poll_timeout(),
                next_stats,
                deadline.filter(|_| !stopping),
                sinks_busy.then(|| Instant::now() + sess.ack_every()),
                // A sink whose channel was full: look again soon.
                io.iter()
                    .any(|e| !e.pending.is_empty())
                    .then(|| Instant::now() + SINK_RETRY),
                peer_fp.as_ref().filter(|_| link.is_some()).map(|_| next_trust_check),
            ]
            .into_iter()
            .flatten()
            .min();
            // Which sources the session takes frames from now (backpressure). Looked at here,
            // not in the wait below: the session is not borrowed across it (this future runs
            // as a task, which must be `Send`).
            ready.clear();
            ready.extend((0..n).map(|i| sess.source_ready(i)));
            for (e, &r) in io.iter().zip(&ready) {
                if let (Some(d), Some(rx)) = (&e.demand, &e.source) {
                    d.set(rx.is_empty() && r);
                }
            }
            let ready_ref = &ready;
            let source_next = std::future::poll_fn(|cx| {
                for k in 0..n {
                    let i = (cursor + k) % n;
                    if let Some(rx) = io[i].source.as_mut().filter(|_| ready_ref[i]) {
                        if let Poll::Ready(f) = rx.poll_recv(cx) {
                            return Poll::Ready((i, f));
                        }
                    }
                }
                Poll::Pending
            });
            let (inbound_rx, in_flight) = match link.as_mut() {
                Some(l) => (Some(&mut l.inbound), l.writing.as_mut()),
                None => (None, None),
            };
            let writing = async {
                match in_flight {
                    Some(w) => w.await,
                    None => std::future::pending().await,
                }
            };
            let inbound = async {
                match inbound_rx {
                    Some(rx) => rx.recv().await,
                    None => std::future::pending().await,
                }
            };
            let reconnected = async {
                match reconnect.as_mut() {
                    Some(r) => r.await,
                    None => std::future::pending().await,
                }
            };
            let refusing = async {
                match busy.as_mut() {
                    Some(b) => b.await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                _ = stop.changed(), if !stopping => {
                    stopping = true;
                    sess.close(Instant::now())?;
                }
                (tx, spare, r) = writing => {
                    let now = Instant::now();
                    if let Some(l) = link.as_mut() {
                        l.done_writing(tx, spare);
                    }
                    if let Err(e) = r {
                        // What the peer said before the link broke counts first (its CLOSE
                        // explains the break).
                        if let Some(l) = link.as_mut() {
                            while let Ok((at, Ok(Some(m)))) = l.inbound.try_recv() {
                                sess.handle_message(now, at, m)?;
                            }
                        }
                        sess.handle_link_lost(now, &e.to_string())?;
                    }
                }
                m = inbound => {
                    let now = Instant::now();
                    match m {
                        Some((at, Ok(Some(m)))) => sess.handle_message(now, at, m)?,
                        None | Some((_, Ok(None))) => {
                            sess.handle_link_lost(now, "the peer disconnected without closing the session")?
                        }
                        Some((_, Err(e))) => sess.handle_link_lost(now, &e.to_string())?,
                    }
                }
                est = reconnected => {
                    reconnect = None;
                    match est {
                        Ok(e) => {
                            note!(quiet, side, "reconnected to {}", e.peer);
                            busy = Some(Box::pin(connector.refuse_while_busy(&ctx, e.peer.clone())));
                            peer_fp = e.fingerprint.clone();
                            same_clock = e.addr.ip().is_loopback();
                            udp_drops.extend(e.rx.drops());
                            link = Some(Link::new(e, &mut sess, cfg.link.chunk_bytes as usize));
                            link_state = "up";
                            sess.handle_link_up(Instant::now());
                        }
                        Err(e) => return Err(anyhow!(e).context("cannot reconnect")),
                    }
                }
                e = refusing => {
                    busy = None;
                    return Err(anyhow!(e).context("the listener failed"));
                }
                (i, f) = source_next => {
                    cursor = (i + 1) % n;
                    let now = Instant::now();
                    match f {
                        Some(frame) => {
                            io[i].stats.produced(frame.len());
                            sess.handle_source_frame(now, i, frame)?;
                        }
                        None => {
                            io[i].source = None;
                            sess.handle_source_end(now, i)?;
                        }
                    }
                }
                _ = sleep_until_opt(wake) => {
                    let now = Instant::now();
                    sess.handle_timeout(now)?;
                    if now >= next_trust_check {
                        next_trust_check = now + TRUST_CHECK;
                        if let (Some(fp), true) = (&peer_fp, link.is_some()) {
                            match ndd_link::KnownPeers::load(&opts.home) {
                                Ok(k) if k.lookup(fp).is_none() => {
                                    tracing::warn!(side = %side, "the peer {fp} is no longer trusted (not in known_peers): closing the link; it is refused until trusted again");
                                    if let Some(l) = link.as_mut() {
                                        l.say_untrusted().await;
                                    }
                                    sess.handle_link_lost(Instant::now(), "the peer is no longer trusted")?;
                                }
                                Ok(_) => {}
                                Err(e) => tracing::debug!(side = %side, "cannot read known_peers: {e}"),
                            }
                        }
                    }
                    if next_stats.is_some_and(|t| now >= t) {
                        // On a terminal a table redrawn in place, every stream every tick;
                        // otherwise lines for the streams that moved.
                        let table = crate::board::live_table();
                        let mut rows = Vec::new();
                        for (i, e) in io.iter_mut().enumerate() {
                            refresh(&mut e.stats, &sess, i);
                            if opts.live_stats.is_some() && table {
                                rows.push(e.stats.live_row());
                            } else if opts.live_stats.is_some() && e.stats.due(now) {
                                rows.push(e.stats.live_line(side.as_str()));
                            }
                        }
                        if opts.live_stats.is_some() {
                            let rtt = sess
                                .clock()
                                .filter(|_| link.is_some())
                                .map(|c| format!(" · rtt {:.2} ms", c.rtt_ns as f64 / 1e6))
                                .unwrap_or_default();
                            let dropped = drop_counts(&udp_drops)
                                .filter(|d| d.total() > 0)
                                .map(|d| {
                                    format!(
                                        " · dropped {} unauthenticated, {} replayed, {} garbage",
                                        d.unauthenticated, d.replayed, d.garbage
                                    )
                                })
                                .unwrap_or_default();
                            let heading = format!(
                                "[{side}] link {link_state} · peer {peer}{rtt} · {} recoveries{dropped}",
                                sess.recoveries().len()
                            );
                            crate::board::show(side.as_str(), crate::board::Panel { heading, rows });
                        }
                        if let Some((m, _)) = &metrics {
                            let streams: Vec<StreamSummary> =
                                io.iter().map(|e| e.stats.summary()).collect();
                            let text = crate::stats::prometheus(
                                side.as_str(),
                                link.is_some(),
                                sess.recoveries().len(),
                                drop_counts(&udp_drops),
                                &streams,
                            );
                            *m.lock().unwrap_or_else(|p| p.into_inner()) = text;
                        }
                        next_stats = tick.map(|d| now + d);
                    }
                    if !stopping && deadline.is_some_and(|d| now >= d) {
                        stopping = true;
                        sess.close(now)?;
                    }
                }
            }
        }
        Ok(())
    }
    .await;

    // Wind down: say what is left to say, stop the sources, let the sinks finish.
    drop(reconnect);
    drop(busy);
    crate::board::leave(side.as_str());
    if let Err(e) = &result {
        sess.abort(&crate::logfmt::error_text(e));
    }
    if let Some(l) = link.take() {
        l.goodbye(&mut sess).await;
    }
    for e in io.iter_mut() {
        // What the sinks were still to get goes to them now (waiting for them here, as the
        // side ends, is what a sink that finishes its work needs).
        if let Some(tx) = &e.sink {
            while let Some(f) = e.pending.pop_front() {
                if tx.send(f).await.is_err() {
                    break;
                }
            }
        }
        e.sink = None;
        e.source = None;
        if let Some(t) = &e.source_task {
            t.abort();
        }
    }
    let mut checks = Vec::new();
    let mut result = result;
    if result.is_ok() {
        for (i, e) in io.iter_mut().enumerate() {
            let Some(h) = e.sink_task.take() else {
                continue;
            };
            let name = cfg.streams[i].name().to_string();
            match h.await {
                Ok(Ok(rep)) => {
                    if let Some(c) = rep.check {
                        checks.push((name, c));
                    }
                }
                Ok(Err(e)) => {
                    result = Err(anyhow!(e).context(format!("stream \"{name}\": sink failed")));
                    break;
                }
                Err(e) => {
                    result = Err(anyhow!("stream \"{name}\": sink task failed: {e}"));
                    break;
                }
            }
        }
    }
    let summaries = io
        .iter_mut()
        .enumerate()
        .map(|(i, e)| {
            refresh(&mut e.stats, &sess, i);
            e.stats.summary()
        })
        .collect();
    let report = RunReport {
        streams: summaries,
        checks,
        peer,
        clock_offset: sess.clock().map(|c| (c.offset_ns, c.rtt_ns)),
        recoveries: sess.recoveries().to_vec(),
        link_drops: drop_counts(&udp_drops),
    };
    match result {
        Ok(()) => Ok(report),
        Err(error) => Err(anyhow::Error::new(SideFailed { report, error })),
    }
}

/// Most frames of a lossy stream kept for a sink endpoint that is not taking them (beyond its
/// channel's 64): the oldest go first.
const LOSSY_BEHIND: usize = 8;
/// How soon a sink whose channel was full is looked at again.
const SINK_RETRY: Duration = Duration::from_millis(2);

/// Hands stream `e`'s pending frames to its sink endpoint as far as its channel has room, and
/// lets the channel go once the stream ended and all were handed on. `false`: the endpoint
/// is gone.
fn hand_on(e: &mut StreamIo) -> bool {
    let Some(tx) = &e.sink else {
        e.pending.clear();
        return true;
    };
    while let Some(f) = e.pending.pop_front() {
        match tx.try_send(f) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(f)) => {
                e.pending.push_front(f);
                return true;
            }
            Err(mpsc::error::TrySendError::Closed(_)) => return false,
        }
    }
    if e.sink_ended {
        e.sink = None;
    }
    true
}

/// Copies the session's counters of stream `i` into its stats.
fn refresh(s: &mut StreamStats, sess: &Session, i: usize) {
    let c = sess.counters(i);
    s.layers = sess.layer_stats(i);
    s.wire_frames = c.wire_frames;
    s.wire_bytes = c.wire_bytes;
    s.retransmits = c.retransmits;
    s.duplicates = c.duplicates;
    s.overflow = c.overflow;
    s.stale = c.stale;
}

/// Tells the sinks that show the link's state (viewer windows) what it is now.
/// (Queued behind the frames they wait for, as every frame for a sink is.)
fn show_link(io: &mut [StreamIo], state: LinkState) {
    for e in io.iter_mut().filter(|e| e.shows_link) {
        if e.sink.is_some() {
            let meta = Meta {
                stream: 0,
                seq: INJECTED_SEQ,
                timestamp_ns: wall_ns(),
                flags: 0,
            };
            e.pending.push_back(Frame::new(meta, &state.payload()));
        }
    }
}

/// Aborts its task when dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn sleep_until_opt(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => std::future::pending().await,
    }
}

//! Runs one side of a driver: the tokio driver of the sans-IO [`ndd_core::Session`].
//!
//! [`run_side`] sets the side up: its endpoints are probed, its identity and trust loaded,
//! the `--metrics` server started, and the first link got from an [`ndd_link::Connector`]
//! (listen or connect, trust, handshake). Then [`driver::Driver`] runs the session: one
//! handler per kind of event (the link's messages, the sources' frames, the write in flight,
//! a reconnect, the user's stop, the next deadline). The protocol (ACK, DELIVERED, RESUME,
//! resend, dedupe, peer restart, keepalive, close) lives in the session, not here.
//!
//! - `link.rs`: one live connection, its reader task and its writer.
//! - `streams.rs`: the streams' endpoints and the frames a sink has not taken yet.
//! - `driver.rs`: the loop and its handlers, and the wind-down that reports.

mod driver;
mod link;
mod many;
mod streams;

use crate::config::{Config, SideName};
use crate::stats::StreamSummary;
use anyhow::{anyhow, bail, Context, Result};
use driver::{Driver, Wiring};
use ndd_core::session::{Session, SessionConfig};
use ndd_core::Pair;
use ndd_endpoint::CheckReport;
use ndd_link::udp::{DropCounts, LinkDrops};
use ndd_link::{Connector, HandshakeCtx, Identity, Listener};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;
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
    /// How the peer is started, for a listener left alone to say (`THIS_HOST` stands for
    /// this machine); `None`: `ndd run CONFIG --side … --connect …`.
    pub peer_hint: Option<String>,
    /// The live lines' tag, instead of the side's own (`[app@DEVICE]` on NATS): for a process
    /// running several app sides at once (`ndd demo --fanout`).
    pub label: Option<String>,
}

/// What `--metrics` serves, refreshed every second.
type Metrics = Arc<std::sync::Mutex<String>>;

/// A side serving several peers: each peer's latest snapshot, by name (`--metrics` serves them
/// together, each labelled with its `peer`).
type PeerMetrics =
    Arc<std::sync::Mutex<std::collections::BTreeMap<String, crate::stats::Snapshot>>>;

fn lock_metrics<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

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
#[derive(Debug, Default)]
pub struct RunReport {
    /// Per-stream stats.
    pub streams: Vec<StreamSummary>,
    /// Reports of `check` sinks.
    pub checks: Vec<(String, CheckReport)>,
    /// The checks were said in the log already, each as its peer's session ended (a
    /// listener serving several peers): count them, do not say them again.
    pub checks_said: bool,
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

impl std::error::Error for SideFailed {
    /// What went wrong and its causes, for whoever looks down the chain (the exit code looks
    /// for an endpoint's refusal at the desktop there).
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.error.as_ref())
    }
}

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

/// Prints informational lines unless the side runs quietly.
macro_rules! note {
    ($quiet:expr, $side:expr, $($arg:tt)*) => {
        if !$quiet {
            tracing::info!(side = %$side, $($arg)*);
        }
    };
}
pub(crate) use note;
pub(crate) use streams::source_failure;

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
    mut opts: RunOptions,
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
        gate: None,
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
    let target = match &opts.endpoint {
        Endpoint::Connect(a) => Some(a.clone()),
        _ => None,
    };
    // (Taken out: the options go on to the drivers.)
    let endpoint = std::mem::replace(&mut opts.endpoint, Endpoint::Connect(String::new()));
    let connector = match endpoint {
        Endpoint::ListenOn(l) if transport == TransportKind::Tcp => Connector::Listen(l),
        Endpoint::ListenOn(_) => bail!("a pre-bound listener is TCP only"),
        Endpoint::Listen(addr) => Connector::new(transport, true, &addr, tls.as_deref()).await?,
        Endpoint::Connect(addr) => Connector::new(transport, false, &addr, tls.as_deref()).await?,
    };
    if let Some(a) = connector.local_addr() {
        note!(quiet, side, "listening on {a}");
    }
    let _announced = if cfg.link.announce {
        announce(cfg, side, &connector, tls.as_deref(), quiet)
    } else {
        None
    };
    if cfg.link.peers > 1 && matches!(connector, Connector::Listen(_) | Connector::QuicListen(_)) {
        return many::run_many(cfg, &opts, stop, ctx, connector, deadline, metrics).await;
    }
    if cfg.link.peers > 1 && matches!(connector, Connector::UdpListen(_)) {
        tracing::warn!(side = %side, "link.peers = {}: a UDP listener serves one peer at a time (several peers need transport = \"tcp\" or \"quic\")", cfg.link.peers);
    }
    // `ndd status` asks this side over a socket (not for benchmarks' quiet sides).
    let status = if quiet {
        None
    } else {
        let address = match (connector.local_addr(), &target) {
            (Some(a), _) => format!("listening on {a}"),
            (None, Some(t)) => format!("connecting to {t}"),
            (None, None) => String::new(),
        };
        crate::status::serve_or_say(crate::status::SideStatus::starting(
            &cfg.driver,
            side.as_str(),
            address,
            "waiting for the peer",
        ))
    };

    // The first link: any failure here ends the run (mismatch, untrusted, nobody there).
    // A listener left alone says once, after a few seconds, what the other side needs.
    let lonely = connector
        .local_addr()
        .map(|a| lonely_hint(side, &a, opts.peer_hint.as_deref()));
    let alone = tokio::time::sleep(LONELY_AFTER);
    tokio::pin!(alone);
    let establish = connector.establish(&ctx, true);
    tokio::pin!(establish);
    let mut told = lonely.is_none();
    let first = loop {
        tokio::select! {
            e = &mut establish => break e?,
            _ = &mut alone, if !told => {
                told = true;
                if let Some(h) = &lonely {
                    note!(quiet, side, "{h}");
                }
            }
            _ = stop.changed() => {
                if opts.once {
                    bail!("stopped before a peer connected");
                }
                // A side that outlives its peers stopped cleanly: nothing to report.
                note!(quiet, side, "stopped before a peer connected");
                return Ok(RunReport::default());
            }
            _ = sleep_until_opt(deadline) => bail!(
                "no peer connected within --duration ({:.1} s)",
                opts.duration.unwrap_or_default().as_secs_f64()
            ),
        }
    };
    note!(quiet, side, "connected to {}; streams agreed", first.peer);
    let (plans, io) = streams::start(cfg, side)?;
    let mut sess = Session::new(session_config(cfg, opts.once), plans, run_id())?;
    sess.handle_link_up(Instant::now(), wall_ns());
    let mut driver = Driver::new(
        Wiring {
            cfg,
            side,
            quiet,
            home: &opts.home,
            live_stats: opts.live_stats,
            panel: side.as_str().to_string(),
            ctx: &ctx,
            connector: &connector,
            metrics,
            peer_metrics: None,
            status,
            deadline,
            inbox: None,
        },
        sess,
        io,
        first,
    );
    let result = driver.run(&mut stop).await;
    driver.finish(result).await
}

/// Announces a TCP or QUIC listener on the local network (`announce = true`); says why not
/// where it cannot.
fn announce(
    cfg: &Config,
    side: SideName,
    connector: &Connector,
    tls: Option<&ndd_link::Tls>,
    quiet: bool,
) -> Option<crate::discover::Announcement> {
    let transport = match connector {
        Connector::Listen(_) => "tcp",
        Connector::QuicListen(_) => "quic",
        _ => {
            tracing::warn!(side = %side, "announce = true: only a TCP or QUIC listener is announced (this side connects, or listens on UDP)");
            return None;
        }
    };
    let addr: std::net::SocketAddr = connector.local_addr()?.split(' ').next()?.parse().ok()?;
    if addr.ip().is_loopback() {
        tracing::warn!(side = %side, "announce = true: {addr} is this machine only, not announced (listen on 0.0.0.0 or a LAN address)");
        return None;
    }
    let me = crate::discover::this_side(
        &cfg.driver,
        side.as_str(),
        transport,
        tls.map(|t| t.identity.fingerprint()),
    );
    match crate::discover::announce(&me, addr.ip(), addr.port()) {
        Ok(a) => {
            note!(
                quiet,
                side,
                "announced on the local network (mDNS) as \"{} {} on {}\"",
                me.driver,
                me.side,
                me.host
            );
            Some(a)
        }
        Err(e) => {
            tracing::warn!(side = %side, "cannot announce this side on the local network: {e:#}");
            None
        }
    }
}

/// The session's settings from the config's `[link]` and the run's options.
fn session_config(cfg: &Config, once: bool) -> SessionConfig {
    SessionConfig {
        resume_buffer_bytes: cfg.link.resume_buffer_bytes as usize,
        flight_min_bytes: cfg.link.flight_min_bytes as usize,
        ping_interval: Duration::from_millis(cfg.link.ping_interval_ms.max(10)),
        keepalive_timeout: Duration::from_millis(cfg.link.keepalive_timeout_ms),
        reconnect: cfg.link.reconnect,
        outlive_peer: !once,
        max_frame_bytes: cfg.link.max_frame_bytes as usize,
        chunk_bytes: cfg.link.chunk_bytes as usize,
        ..SessionConfig::default()
    }
}

/// How long a listening side waits for its peer before it says what the peer needs.
const LONELY_AFTER: Duration = Duration::from_secs(5);

/// What a side listening on `addr` with no peer yet says: how to start the other side, and
/// that a loopback address is this machine's only.
fn lonely_hint(side: SideName, addr: &str, peer: Option<&str>) -> String {
    let other = match side {
        SideName::App => "device",
        SideName::Device => "app",
    };
    let sock: Option<std::net::SocketAddr> = addr.split(' ').next().and_then(|a| a.parse().ok());
    if let Some(peer) = peer {
        // A one-line share: the peer's one line, with this machine's address.
        let here = match sock {
            Some(a) if a.ip().is_loopback() => a.ip().to_string(),
            _ => "THIS_HOST".to_string(),
        };
        return format!(
            "no {other} side has connected to {addr} yet: on the {other}'s machine run `{}`",
            peer.replace("THIS_HOST", &here)
        );
    }
    match sock {
        Some(a) if a.ip().is_loopback() => format!(
            "no {other} side has connected to {addr} yet: start it on this machine with `ndd run CONFIG --side {other} --connect {a}`; {} is this machine only: for a peer on another machine, listen with --listen 0.0.0.0:{}",
            a.ip(),
            a.port()
        ),
        Some(a) => format!(
            "no {other} side has connected to {addr} yet: start it with `ndd run CONFIG --side {other} --connect THIS_HOST:{}` (and check that a firewall lets port {} in)",
            a.port(),
            a.port()
        ),
        None => format!(
            "no {other} side has connected to {addr} yet: start it with `ndd run CONFIG --side {other} --connect` to this address"
        ),
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

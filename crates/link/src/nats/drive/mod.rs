//! The NATS link's driver (`[link] transport = "nats"`): one device side, any number of app
//! sides, all talking to a NATS server instead of to each other (docs/links.md "NATS"). This
//! is the I/O half: the rules are the sans-IO machines of [`crate::nats`], and this runs them
//! on async-nats. The binary gives it a [`Setup`] and a [`Run`] (its endpoints, stacks and
//! tasks) and reads its streams' counters through [`Tally`].
//!
//! - The device side answers joins on `P.D.join` ([`crate::nats::join`]): it checks the
//!   app side's pinned identity and HELLO exactly as a direct link does, then hands it the
//!   group key (and a split slot) sealed for it alone.
//! - Every frame leaves its stack encrypted under the group key (the `encrypt` pair's format,
//!   [`ndd_modules::encrypt`]), so the server and any subscriber that was not admitted see
//!   ciphertext only. The key is kept in the ndd home (`nats-group-PREFIX-DRIVER.key`, mode
//!   0600) so a restarted device side keeps the app sides it had. Once an app side that
//!   was handed it is no longer trusted, the device rotates it (`keeper.rs`) and the app sides
//!   still trusted follow by joining again (`join.rs`).
//! - Device → app frames of lossy streams go over core NATS (the newest frame wins; a slow
//!   app side loses frames, never stalls the device); those of reliable streams are stored by
//!   JetStream (a durable consumer per app side, acknowledged once its sink completed them),
//!   so an app side that goes away and comes back resumes where it stopped, no loss, no
//!   duplicates.
//! - A `multiplex` layer at the end of a device → app stack says where each frame goes: to
//!   every app side, to one of them (queue group / shared consumer), or piece `i` to slot `i`.
//! - App → device frames go to `P.D.u.S` on core NATS: the device receives every app side's.
//!
//! A file per concern: `device.rs` and `app.rs` start each side, `join.rs` admits and follows
//! the key, `claim.rs` keeps one device side per driver and hears the app sides' ready
//! heartbeats, `keeper.rs` rotates the key, `store.rs` the JetStream stream, `source.rs` and
//! `sink.rs` are a stream's two halves.

use crate::nats::admit::{Admitter, Decision, Heard, Level, Line as AdmitLine, Ready, Trust};
use crate::nats::follow::{key_id, mark_label, notice_body, notice_label, Follower, Notice};
use crate::nats::home::{draw_key, write_private, Home, PositionFile, WindowsFile};
use crate::nats::input::{app_consumer, SinkShape};
use crate::nats::intake::{Intake, Taken, REORDER_WAIT};
use crate::nats::join::{Admission, Host, JoinRetry, Joiner, Retry, Say, Welcome};
use crate::nats::keys::{GroupKey, Outcome, RunHalf, SINCE_PENDING};
use crate::nats::receive::{Event, Receiver, Wait};
use crate::nats::record::FrameRecord;
use crate::nats::send::{RunSeal, Sender};
use crate::nats::subjects::Subjects;
use crate::nats::NatsConfig;
use crate::seal::LocalIdentity;
use crate::KnownPeers;
use async_nats::jetstream;
use bytes::Bytes;
use futures_util::StreamExt;
use ndd_core::{Frame, Half, Meta, Output, Stack};
use ndd_modules::encrypt::key::Key;
use ndd_modules::encrypt::{Cipher, EncryptForward, EncryptInverse, Opening};
use ndd_modules::multiplex::{route_of, Route};
use ndd_wire::text::{printable, MAX_REASON};
use ndd_wire::{CloseCode, HelloRepr, OwnedMessage, Side};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

mod app;
mod claim;
mod device;
mod error;
mod join;
mod keeper;
mod sink;
mod source;
mod store;
#[cfg(test)]
mod tests;

use claim::*;
use error::Context;
use error::{bail, fail};
pub use error::{DriveError, Result};
use join::*;
use keeper::*;
pub use sink::SinkHalf;
use sink::*;
pub use source::SourceHalf;
use source::*;
use store::*;

type Shared<T> = Arc<Mutex<T>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Asks the key follower to join again; the answer says whether the question was settled (a
/// device side answered, or none was serving) rather than left without an answer.
type Refresh = mpsc::Sender<tokio::sync::oneshot::Sender<bool>>;

/// Nanoseconds since the Unix epoch (0 if the clock is before it).
fn wall_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// A random u64 (run ids).
fn random_u64() -> u64 {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 8];
    if ring::rand::SystemRandom::new().fill(&mut b).is_err() {
        return wall_ns() ^ u64::from(std::process::id()).rotate_left(32);
    }
    u64::from_be_bytes(b)
}

/// A short, subject-safe id of an identity (durable consumer names).
fn short_id(fingerprint: &str) -> String {
    crate::nats::subjects::who(fingerprint)
}

/// What a stream is on the NATS link.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Its place in the config.
    pub index: usize,
    /// Its stream id.
    pub id: u16,
    /// Its name.
    pub name: String,
    /// A reliable stream (stored by JetStream).
    pub reliable: bool,
    /// This side runs the stream's source.
    pub source: bool,
    /// `split` pieces per frame, if the stream splits.
    pub split: Option<u16>,
    /// The stream goes round-robin.
    pub round_robin: bool,
    /// A picture in broadcast (`image` with `keyframe_ms`): an app side that comes back
    /// starts at what is stored after it joined (from its next keyframe: the screen now), not
    /// where it stopped (a replay of everything it missed, older runs of the device included).
    pub now_only: bool,
}

impl Plan {
    /// The stream as a sink sees it ([`crate::nats::input::sink_input`]).
    pub fn shape(&self) -> SinkShape {
        SinkShape {
            id: self.id,
            reliable: self.reliable,
            split: self.split,
            round_robin: self.round_robin,
            now_only: self.now_only,
        }
    }
}

/// The JetStream consumers one side reads through (`ndd nats-permissions` grants those and no
/// other): the device's `device_S` of each reliable app → device stream; an app side's
/// (`fingerprint` its identity) own durable consumers of the reliable device → app streams,
/// every split slot it may be given, and the round-robin groups' shared ones.
pub fn consumers(
    subjects: &Subjects,
    side: Side,
    plans: &[Plan],
    fingerprint: &str,
) -> Vec<String> {
    let me = short_id(fingerprint);
    let mut names = Vec::new();
    for p in plans.iter().filter(|p| p.reliable && !p.source) {
        if side == Side::Device {
            names.push(subjects.device_durable(p.id));
        } else if let (false, Some(parts)) = (p.round_robin, p.split) {
            names.extend((0..parts).map(|i| app_consumer(subjects, &p.shape(), &me, Some(i))));
        } else {
            names.push(app_consumer(subjects, &p.shape(), &me, None));
        }
    }
    names
}

/// The `[link]` times the driver keeps to.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// To connect to the server (and, with `once`, for an app side to be admitted).
    pub connect: Duration,
    /// One join's try.
    pub handshake: Duration,
    /// The longest wait between joins tried again.
    pub max_backoff: Duration,
    /// Between an app side's ready heartbeats (the device's key checks follow it).
    pub ping_interval: Duration,
    /// A split slot's holder silent this long may lose it (at least 5 s).
    pub keepalive: Duration,
}

/// What a side runs: everything the driver reads of the config and the command line.
#[derive(Debug, Clone)]
pub struct Setup {
    /// This side.
    pub side: Side,
    /// The driver's name.
    pub driver: String,
    /// This side's HELLO (an app side's is compared by the device as on a direct link).
    pub hello: HelloRepr,
    /// The server and subjects.
    pub nats: NatsConfig,
    /// The times kept to.
    pub timing: Timing,
    /// The side ends with its streams (`--once`).
    pub once: bool,
    /// Says nothing but warnings (benchmarks).
    pub quiet: bool,
    /// The ndd home (identity, known_peers, the group key and run files).
    pub home: PathBuf,
    /// When the side stops (`--duration`).
    pub deadline: Option<Instant>,
    /// Its streams.
    pub plans: Vec<Plan>,
}

/// A future run as a task of the side.
pub type Task = std::pin::Pin<Box<dyn std::future::Future<Output = Result<()>> + Send>>;

/// A stream's counters, as the binary keeps them (live stats, `--stats-json`, metrics).
pub trait Tally: Send + Sync + 'static {
    /// A frame of `len` bytes from the source endpoint.
    fn produced(&self, len: usize);
    /// `frames` records of `bytes` sealed bytes from the server.
    fn wire(&self, frames: u64, bytes: u64);
    /// One record of `bytes` sealed bytes published from `stack` (its layers' counters taken
    /// when due): one look at the stats per frame.
    fn sent(&self, bytes: u64, stack: &Stack);
    /// A frame of `len` bytes handed to the sink, made at `created_ns` (wall clock), from
    /// `stack` (its layers' counters taken when due).
    fn delivered(&self, len: usize, created_ns: u64, stack: &Stack);
    /// Dropped: `refused` records that did not open or were not this stream's, `stale` ones of
    /// an earlier device run, `duplicates` copies.
    fn dropped(&self, refused: u64, stale: u64, duplicates: u64);
    /// Totals so far: lossy frames dropped for want of room in the client's queue, and
    /// publishes sent again.
    fn sending(&self, overflow: u64, retransmits: u64);
    /// Stored frames that never came, given up so far.
    fn given_up(&self, skipped: u64);
    /// The stack's per-layer counters, as the stream ends.
    fn layers(&self, stack: &Stack);
}

/// A stream's NATS half, for the binary to join to its endpoint and stack
/// ([`SourceHalf::run`], [`SinkHalf::run`]).
pub enum StreamHalf {
    /// This side runs the stream's source.
    Source(Box<SourceHalf>),
    /// This side runs its sink.
    Sink(SinkHalf),
}

/// What the binary does for the driver: starts the side's tasks.
pub trait Run {
    /// Runs `task`, a service of the side (`what`), for as long as the side runs: its ending
    /// is an error naming it.
    fn service(&mut self, what: &'static str, task: Task);
    /// Starts a stream: its endpoint and stack, and a task running `half` between them.
    fn stream(&mut self, half: StreamHalf) -> Result<()>;
}

/// Who a side serves, as `ndd status` shows it: an app side's device (its name in
/// `known_peers`); a device side's server and how many app sides are there now.
pub struct PeerView {
    /// The device's name, or the servers.
    pub name: String,
    admitter: Option<Shared<Admitter>>,
}

impl PeerView {
    /// As it stands now.
    pub fn now(&self) -> String {
        match &self.admitter {
            Some(a) => {
                let n = lock(a).ready_present(Instant::now());
                let s = if n == 1 { "" } else { "s" };
                format!("{n} app side{s}, {}", self.name)
            }
            None => self.name.clone(),
        }
    }
}

/// A side's connection to the server.
#[derive(Clone)]
pub struct Connection {
    client: async_nats::Client,
    /// Connections made to the server so far (a reconnect adds one).
    connects: Arc<std::sync::atomic::AtomicU64>,
}

impl Connection {
    /// Connects as `setup` says, saying so (and whether the connection is plain TCP).
    pub async fn open(setup: &Setup) -> Result<Connection> {
        let nats = &setup.nats;
        if !nats.tls_required() && !setup.quiet {
            // Off loopback only because the config says so: say that, not "loopback" (found
            // by hand across two network namespaces).
            let why = if nats.all_loopback() {
                "allowed on loopback"
            } else {
                "link.nats.require_tls = false"
            };
            tracing::warn!(side = %setup.side, "the connection to the NATS server is plain TCP ({why}); frames are still encrypted end to end");
        }
        let connects = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let client = crate::nats::connect(
            nats,
            &format!("ndd {} {}", setup.side, setup.driver),
            setup.timing.connect,
            connects.clone(),
        )
        .await?;
        if !setup.quiet {
            tracing::info!(side = %setup.side, servers = %nats.servers.join(","), "connected to NATS");
        }
        Ok(Connection { client, connects })
    }

    /// The connection as `ndd status` says it.
    pub fn state(&self) -> &'static str {
        match self.client.connection_state() {
            async_nats::connection::State::Connected => "up (NATS)",
            async_nats::connection::State::Disconnected => "down, reconnecting (NATS)",
            async_nats::connection::State::Pending => "connecting (NATS)",
        }
    }

    /// Connections made again since the first.
    pub fn reconnects(&self) -> usize {
        self.connects
            .load(std::sync::atomic::Ordering::Acquire)
            .saturating_sub(1) as usize
    }

    /// Hands the server what the client holds ([`flushed`]), saying so when it could not.
    pub async fn flush(&self) {
        if let Err(e) = flushed(&self.client).await {
            tracing::warn!("what this side last sent may not have reached the NATS server: {e}");
        }
    }

    /// Closes the connection for every clone (no reconnect attempts after this side ended).
    pub async fn close(&self) {
        let _ = tokio::time::timeout(Duration::from_secs(1), self.client.drain()).await;
    }
}

/// Starts a side on `conn`: the device side's JetStream stream, run, key keeper, claim, join
/// service and streams; an app side's join, key follower, streams and ready heartbeat; each
/// task handed to `run`. `finish` turns true when the side stops (sink streams hand over
/// what they hold and end); `stop` ends the start itself. Returns who the peer is.
pub async fn start(
    setup: &Setup,
    conn: &Connection,
    local: &LocalIdentity,
    finish: &watch::Receiver<bool>,
    run: &mut (dyn Run + Send),
    stop: &mut watch::Receiver<bool>,
) -> Result<PeerView> {
    let client = conn.client.clone();
    let ctx = Ctx {
        subjects: Subjects::new(&setup.nats.subject_prefix, &setup.driver)
            .map_err(|e| fail!("{e}"))?,
        side: setup.side,
        quiet: setup.quiet,
        connects: conn.connects.clone(),
        // The server's INFO may not be in yet right after connecting; 1 MiB is its default.
        max_payload: match client.server_info().max_payload {
            0 => 1 << 20,
            n => n,
        },
        client,
        run_stale: Arc::default(),
        gate: Arc::default(),
        home: setup.home.clone(),
    };
    let s = Start {
        setup,
        local,
        finish,
    };
    match setup.side {
        Side::Device => device::start(&s, &ctx, run, stop).await,
        Side::App => app::start(&s, &ctx, run, stop).await,
    }
}

/// The longest a flush of the client is waited for.
const FLUSH_WAIT: Duration = Duration::from_secs(2);

/// Hands the server what `client` holds, waiting at most [`FLUSH_WAIT`]: the client waits for
/// a server that is away until it is back, and a side told to stop then never stopped (found
/// by hand: SIGTERM did nothing).
async fn flushed(client: &async_nats::Client) -> Result<(), String> {
    match tokio::time::timeout(FLUSH_WAIT, client.flush()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(printable(&e.to_string(), MAX_REASON)),
        Err(_) => Err(format!(
            "the server did not take it within {} s (away or slow)",
            FLUSH_WAIT.as_secs()
        )),
    }
}

/// What starting a side reads.
struct Start<'a> {
    setup: &'a Setup,
    local: &'a LocalIdentity,
    /// Turns true when the side stops.
    finish: &'a watch::Receiver<bool>,
}

/// Whether the JetStream error `e` passes by itself (a cluster electing a leader):
/// [`crate::nats::store::passes`] on its whole text.
fn passes(e: &DriveError) -> bool {
    crate::nats::store::passes(&e.to_string())
}

async fn sleep_until_opt(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => std::future::pending().await,
    }
}

/// What every task needs.
#[derive(Clone)]
struct Ctx {
    client: async_nats::Client,
    subjects: Subjects,
    side: Side,
    quiet: bool,
    /// Connections made to the server so far (a reconnect adds one).
    connects: Arc<std::sync::atomic::AtomicU64>,
    max_payload: usize,
    /// Device side: rung when a frame sealed for an earlier run or under a rotated key comes
    /// in (the [`KeyKeeper`]'s notice goes again).
    run_stale: Arc<tokio::sync::Notify>,
    /// Device side: a rotation waits for the reliable publishers ([`RotationGate`]).
    gate: Arc<RotationGate>,
    /// The ndd home (an app side keeps where its stored streams stand there).
    home: PathBuf,
}

impl Ctx {
    /// A subscription to `subject`, or an error naming it.
    async fn subscribe(&self, subject: &str) -> Result<async_nats::Subscriber> {
        self.client
            .subscribe(subject.to_string())
            .await
            .map_err(|e| fail!("cannot subscribe to {subject}: {e}"))
    }
}

/// `plan`'s NATS half: its publisher (a source), or its subscription or consumer and keys (a
/// sink: `app` is an app side's admission, name and where the stored streams stood when it
/// joined).
async fn stream_half(
    s: &Start<'_>,
    ctx: &Ctx,
    plan: &Plan,
    key: &watch::Receiver<GroupKey>,
    refresh: Option<&Refresh>,
    js: Option<jetstream::Context>,
    app: Option<(&Admission, &str, u64)>,
) -> Result<StreamHalf> {
    if plan.source {
        let mut keys = key.clone();
        let out = Publisher::new(ctx, plan, *keys.borrow_and_update(), js, refresh.cloned())?;
        return Ok(StreamHalf::Source(Box::new(SourceHalf {
            keys,
            out,
            finish: s.finish.clone(),
        })));
    }
    let stale = (ctx.side == Side::Device).then(|| ctx.run_stale.clone());
    let keys = KeyWatch {
        key: key.clone(),
        refresh: refresh.cloned(),
        stale,
    };
    let began = key.borrow().oldest_began();
    let input = subscribe(ctx, plan, js, app, began, s.finish).await?;
    let end_sub = if plan.round_robin && app.is_some() {
        Some(ctx.subscribe(&ctx.subjects.end(plan.id)).await?)
    } else {
        None
    };
    Ok(StreamHalf::Sink(SinkHalf {
        plan: plan.clone(),
        input,
        end_sub,
        once: s.setup.once,
        finish: s.finish.clone(),
        keys,
        side: ctx.side,
        peer: if app.is_some() {
            "the device side's"
        } else {
            "an app side's"
        },
    }))
}

impl std::fmt::Debug for StreamHalf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (kind, plan) = match self {
            StreamHalf::Source(h) => ("Source", h.plan()),
            StreamHalf::Sink(h) => ("Sink", h.plan()),
        };
        f.debug_tuple(kind).field(&plan.name).finish()
    }
}

impl std::fmt::Debug for SourceHalf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceHalf")
            .field("stream", &self.plan().name)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for SinkHalf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SinkHalf")
            .field("stream", &self.plan().name)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for PeerView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerView")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("state", &self.state())
            .finish_non_exhaustive()
    }
}

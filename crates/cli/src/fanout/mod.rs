//! The NATS link's driver (`[link] transport = "nats"`): one device side, any number of app
//! sides, all talking to a NATS server instead of to each other (docs/links.md "NATS").
//!
//! - The device side answers joins on `P.D.join` ([`ndd_link::nats::join`]): it checks the
//!   app side's pinned identity and HELLO exactly as a direct link does, then hands it the
//!   group key (and a split slot) sealed for it alone.
//! - Every frame leaves its stack encrypted under the group key (the `encrypt` pair's format,
//!   [`ndd_modules::encrypt`]), so the server and any subscriber that was not admitted see
//!   ciphertext only. The key is kept in the ndd home (`nats-group-PREFIX-DRIVER.key`, mode
//!   0600) so a restarted device side keeps the app sides it had. Once an app side that
//!   was handed it is no longer trusted, the device rotates it ([`KeyKeeper`]) and the app
//!   sides still trusted follow by joining again ([`KeyFollower`]).
//! - Device → app frames of lossy streams go over core NATS (the newest frame wins; a slow
//!   app side loses frames, never stalls the device); those of reliable streams are stored by
//!   JetStream (a durable consumer per app side, acknowledged once its sink completed them),
//!   so an app side that goes away and comes back resumes where it stopped, no loss, no
//!   duplicates.
//! - A `multiplex` layer at the end of a device → app stack says where each frame goes: to
//!   every app side, to one of them (queue group / shared consumer), or piece `i` to slot `i`.
//! - App → device frames go to `P.D.u.S` on core NATS: the device receives every app side's.
//!
//! The rules are the sans-IO machines of [`ndd_link::nats`]; this driver runs them on async-nats,
//! a file per concern: [`device`] and [`app`] start each side, [`join`] admits and follows the
//! key, [`claim`] keeps one device side per driver and hears the app sides' ready heartbeats,
//! [`keeper`] rotates the key, [`home`] keeps the key and run files, [`store`] the JetStream
//! stream, [`source`] and [`sink`] are a stream's two halves, [`streams`] starts them.

use crate::config::{Config, Reliability, SideName};
use crate::session::{load_identity, wall_ns, RunOptions, RunReport};
use crate::stats::StreamStats;
use anyhow::{anyhow, bail, Context, Result};
use async_nats::jetstream;
use bytes::Bytes;
use futures_util::StreamExt;
use ndd_core::{Frame, Half, Meta, Output, Pair, Role, Stack};
use ndd_endpoint::Delivered;
use ndd_link::nats::admit::{Admitter, Decision, Heard, Level, Line as AdmitLine, Ready, Trust};
use ndd_link::nats::async_nats;
use ndd_link::nats::follow::{key_id, mark_label, notice_body, notice_label, Follower, Notice};
use ndd_link::nats::input::app_consumer;
use ndd_link::nats::intake::{Intake, Taken, REORDER_WAIT};
use ndd_link::nats::join::{Admission, Host, JoinRetry, Joiner, Retry, Say, Welcome};
use ndd_link::nats::keys::{GroupKey, Outcome, RunHalf, SINCE_PENDING};
use ndd_link::nats::receive::{Event, Receiver, Wait};
use ndd_link::nats::record::FrameRecord;
use ndd_link::nats::send::{RunSeal, Sender};
use ndd_link::nats::subjects::Subjects;
use ndd_link::nats::NatsConfig;
use ndd_link::seal::LocalIdentity;
use ndd_link::KnownPeers;
use ndd_modules::encrypt::key::Key;
use ndd_modules::encrypt::{Cipher, EncryptForward, EncryptInverse, Opening};
use ndd_modules::multiplex::{route_of, Route};
use ndd_modules::ModuleConfig;
use ndd_wire::text::{printable, MAX_REASON};
use ndd_wire::{CloseCode, OwnedMessage};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

mod app;
mod claim;
mod device;
mod join;
mod keeper;
mod sink;
mod source;
mod store;
mod streams;
#[cfg(test)]
mod tests;

use claim::*;
use join::*;
use keeper::*;
use ndd_link::nats::home::{draw_key, write_private, Home, PositionFile, WindowsFile};
use sink::*;
use source::*;
use store::*;
use streams::*;

type Shared<T> = Arc<Mutex<T>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// An app side's way to ask for the group key again (after a frame that does not open):
/// answered once it has asked the device.
/// Asks the key follower to join again; the answer says whether the question was settled (a
/// device side answered, or none was serving) rather than left without an answer.
type Refresh = mpsc::Sender<tokio::sync::oneshot::Sender<bool>>;

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
    ndd_link::nats::subjects::who(fingerprint)
}

/// The JetStream consumers one side of `cfg` reads through (`ndd nats-permissions` grants
/// those and no other): the device's `device_S` of each reliable app → device stream; an app
/// side's (`fingerprint` its identity) own durable consumers of the reliable device → app
/// streams, every split slot it may be given, and the round-robin groups' shared ones.
pub fn consumers(cfg: &Config, side: SideName, fingerprint: &str) -> Result<Vec<String>> {
    let subjects =
        Subjects::new(&cfg.link.nats.subject_prefix, &cfg.driver).map_err(|e| anyhow!(e))?;
    let me = short_id(fingerprint);
    let mut names = Vec::new();
    for p in streams::plans(cfg, side)
        .iter()
        .filter(|p| p.reliable && !p.source)
    {
        if side == SideName::Device {
            names.push(subjects.device_durable(p.id));
        } else if let (false, Some(parts)) = (p.round_robin, p.split) {
            names.extend((0..parts).map(|i| app_consumer(&subjects, &p.shape(), &me, Some(i))));
        } else {
            names.push(app_consumer(&subjects, &p.shape(), &me, None));
        }
    }
    Ok(names)
}

/// Runs one side over NATS until stopped, the duration ends, or (with `--once`) the
/// sources end.
pub async fn run_side(
    cfg: &Config,
    opts: RunOptions,
    mut stop: watch::Receiver<bool>,
) -> Result<RunReport> {
    let side = opts.side;
    let quiet = opts.quiet;
    if opts.insecure || cfg.link.insecure {
        bail!("the NATS link always authenticates both sides and encrypts every frame: drop --insecure / link.insecure");
    }
    cfg.probe_side(side)?;
    let nats = &cfg.link.nats;
    let subjects = Subjects::new(&nats.subject_prefix, &cfg.driver).map_err(|e| anyhow!(e))?;
    let identity = load_identity(&opts.home)?;
    KnownPeers::load(&opts.home)?;
    let local = LocalIdentity::new(&identity).context("identity")?;
    if !nats.tls_required() && !quiet {
        // Off loopback only because the config says so: say that, not "loopback" (found by
        // hand across two network namespaces).
        let why = if nats.all_loopback() {
            "allowed on loopback"
        } else {
            "link.nats.require_tls = false"
        };
        tracing::warn!(side = %side, "the connection to the NATS server is plain TCP ({why}); frames are still encrypted end to end");
    }
    let connects = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let client = ndd_link::nats::connect(
        nats,
        &format!("ndd {side} {}", cfg.driver),
        Duration::from_millis(cfg.link.connect_timeout_ms),
        connects.clone(),
    )
    .await?;
    if !quiet {
        tracing::info!(side = %side, servers = %nats.servers.join(","), "connected to NATS");
    }
    let deadline = opts.duration.map(|d| Instant::now() + d);
    let plans = plans(cfg, side);
    let stats: Vec<Shared<StreamStats>> = plans
        .iter()
        .map(|p| {
            Arc::new(Mutex::new(StreamStats::new(
                &p.name,
                if p.source { "source" } else { "sink" },
                cfg.streams[p.index].direction.wire().to_string(),
            )))
        })
        .collect();
    let ctx = Ctx {
        client: client.clone(),
        subjects,
        side,
        quiet,
        connects,
        // The server's INFO may not be in yet right after connecting; 1 MiB is its default.
        max_payload: match client.server_info().max_payload {
            0 => 1 << 20,
            n => n,
        },
        run_stale: Arc::default(),
        gate: Arc::default(),
        home: opts.home.clone(),
    };
    let mut t = Tasks {
        set: JoinSet::new(),
        endpoints: Vec::new(),
        services: 0,
    };
    // Turns true when this side stops: sink streams hand over what they hold and end, so
    // their sinks finish (and `check` sinks report).
    let (finish_tx, finish_rx) = watch::channel(false);
    let start = Start {
        cfg,
        opts: &opts,
        local: &local,
        plans: &plans,
        stats: &stats,
        finish: &finish_rx,
        deadline,
    };
    // `ndd status` asks this side over a socket (not for benchmarks' quiet sides).
    let mut status = (!quiet)
        .then(|| {
            crate::status::serve_or_say(crate::status::SideStatus::starting(
                &cfg.driver,
                side.as_str(),
                format!("NATS {}", nats.servers.join(",")),
                match side {
                    SideName::Device => "starting (NATS)",
                    SideName::App => "joining (NATS)",
                },
            ))
        })
        .flatten();
    let peer = match side {
        SideName::Device => device::start(&start, &ctx, &mut t, &mut stop).await?,
        SideName::App => app::start(&start, &ctx, &mut t, &mut stop).await?,
    };
    // Live lines name an app side's device as `known_peers` does, as a listener serving
    // several peers names each (`[app@board]`); before, a fragment of this side's own
    // fingerprint (`[app Qasd0rM/]`), which told a user nothing.
    let label = match (&opts.label, side) {
        (Some(l), _) => l.clone(),
        (None, SideName::Device) => "device".to_string(),
        (None, SideName::App) => format!("app@{}", peer.name),
    };
    let Tasks {
        set: mut tasks,
        endpoints,
        services,
    } = t;

    // Live stats and the stop conditions.
    let mut checks = Vec::new();
    let tick = opts.live_stats.unwrap_or(if status.is_some() {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(3600)
    });
    let mut next = tokio::time::Instant::now() + tick;
    let mut result = Ok(());
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            _ = sleep_until_opt(deadline) => break,
            _ = tokio::time::sleep_until(next) => {
                next += tick;
                if opts.live_stats.is_some() {
                    for s in &stats {
                        let mut s = lock(s);
                        if s.due(Instant::now()) {
                            eprintln!("{}", s.live_line(&label));
                        }
                    }
                }
                if let Some(st) = &mut status {
                    let sums: Vec<_> = stats.iter().map(|s| lock(s).summary()).collect();
                    st.streams(Instant::now(), &sums);
                    let link = match client.connection_state() {
                        async_nats::connection::State::Connected => "up (NATS)",
                        async_nats::connection::State::Disconnected => "down, reconnecting (NATS)",
                        async_nats::connection::State::Pending => "connecting (NATS)",
                    };
                    let reconnects = ctx.connects.load(std::sync::atomic::Ordering::Acquire);
                    st.update(|s| {
                        s.link = link.to_string();
                        s.peer = Some(peer.now());
                        s.recoveries = reconnects.saturating_sub(1) as usize;
                    });
                }
            }
            done = tasks.join_next() => match done {
                None => break,
                Some(Ok(Ok(c))) => {
                    checks.extend(c);
                    // A stream ended; with --once the side ends with its last stream.
                    if opts.once && tasks.len() <= services {
                        break;
                    }
                }
                Some(Ok(Err(e))) => { result = Err(e); break; }
                Some(Err(e)) => { result = Err(anyhow!("stream task failed: {e}")); break; }
            },
        }
    }
    // Sources stop first: their streams flush and say END; sink streams hand over what
    // they hold; then what is left stops.
    for e in &endpoints {
        e.abort();
    }
    let _ = finish_tx.send(true);
    // (A service that ends meanwhile is one fewer to leave running, and its error the
    // side's: before, it counted as a stream and the drain ended early. Found by a review.)
    let mut services = services;
    let mut late = None;
    let drain = async {
        while tasks.len() > services {
            match tasks.join_next().await {
                Some(Ok(Ok(Some(c)))) => checks.push(c),
                Some(Ok(Err(e))) if e.is::<ServiceEnded>() => {
                    services -= 1;
                    late.get_or_insert(e);
                }
                Some(_) => {}
                None => break,
            }
        }
    };
    if result.is_ok() {
        let _ = tokio::time::timeout(Duration::from_secs(2), drain).await;
    } else {
        drop(drain);
    }
    let _ = client.flush().await;
    tasks.abort_all();
    // Closes the connection for every clone (no reconnect attempts after this side ended).
    let _ = tokio::time::timeout(Duration::from_secs(1), client.drain()).await;
    while let Some(r) = tasks.join_next().await {
        if let Ok(Ok(Some(c))) = r {
            checks.push(c);
        }
    }
    result?;
    if let Some(e) = late {
        return Err(e);
    }
    Ok(RunReport {
        streams: stats.iter().map(|s| lock(s).summary()).collect(),
        checks,
        // Who it served (`--stats-json`): the device's name, or the servers; how many app
        // sides are there is for the live status only.
        peer: peer.name.clone(),
        clock_offset: None,
        recoveries: Vec::new(),
        link_drops: None,
        checks_said: false,
    })
}

/// Who a side serves, as `ndd status` shows it: an app side's device (its name in
/// `known_peers`); a device side's server and how many app sides are there now.
pub(super) struct PeerView {
    name: String,
    admitter: Option<Shared<Admitter>>,
}

impl PeerView {
    fn now(&self) -> String {
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

/// A side's tasks: its streams' and the services that run beside them.
struct Tasks {
    set: JoinSet<Result<Option<(String, ndd_endpoint::CheckReport)>>>,
    /// The source endpoints' tasks: stopping them ends their streams cleanly (flushed, END).
    endpoints: Vec<tokio::task::AbortHandle>,
    /// How many of `set` serve as long as the side runs (the device's join service and key
    /// keeper, the app side's key follower and ready heartbeat).
    services: usize,
}

impl Tasks {
    /// Runs `f` beside the streams for as long as the side runs (counted in `services`). A
    /// service that ends before the side is an error naming it (`what`): counted as a stream
    /// that ended, it ended a `--once` side, or its drain, while streams still ran (found by a
    /// review).
    fn service(
        &mut self,
        what: &'static str,
        f: impl std::future::Future<Output = Result<()>> + Send + 'static,
    ) {
        self.services += 1;
        self.set.spawn(async move {
            f.await?;
            Err(ServiceEnded(what).into())
        });
    }
}

/// A service of the side ([`Tasks::service`]) ended before the side did.
#[derive(Debug)]
struct ServiceEnded(&'static str);

impl std::fmt::Display for ServiceEnded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the {} stopped while the side ran (its subscription or the NATS connection closed)",
            self.0
        )
    }
}

impl std::error::Error for ServiceEnded {}

/// What starting a side reads.
struct Start<'a> {
    cfg: &'a Config,
    opts: &'a RunOptions,
    local: &'a LocalIdentity,
    plans: &'a [Plan],
    stats: &'a [Shared<StreamStats>],
    /// Turns true when the side stops.
    finish: &'a watch::Receiver<bool>,
    deadline: Option<Instant>,
}

/// Whether the JetStream error `e` passes by itself (a cluster electing a leader):
/// [`ndd_link::nats::store::passes`] on its whole text.
fn passes(e: &anyhow::Error) -> bool {
    ndd_link::nats::store::passes(&format!("{e:#}"))
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
    side: SideName,
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
    home: std::path::PathBuf,
}

impl Ctx {
    /// A subscription to `subject`, or an error naming it.
    async fn subscribe(&self, subject: &str) -> Result<async_nats::Subscriber> {
        self.client
            .subscribe(subject.to_string())
            .await
            .map_err(|e| anyhow!("cannot subscribe to {subject}: {e}"))
    }
}

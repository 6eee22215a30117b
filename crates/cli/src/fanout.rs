//! The NATS link's wiring (`[link] transport = "nats"`): the config read into the driver's
//! [`Setup`], each stream's endpoint and stack joined to its NATS half, the live stats, `ndd
//! status` and the stop. The driver (joins, keys, the claim, JetStream, the streams' halves)
//! is [`ndd_link::nats::drive`]; its rules are the sans-IO machines of [`ndd_link::nats`].

use crate::config::{Config, Reliability, SideName};
use crate::session::{load_identity, wall_ns, RunOptions, RunReport};
use crate::stats::StreamStats;
use anyhow::{anyhow, bail, Context, Result};
use ndd_core::{Frame, Pair, Role, Stack};
use ndd_endpoint::{CheckReport, Delivered};
use ndd_link::nats::drive::{self, DriveError, Plan, Setup, StreamHalf, Tally, Timing};
use ndd_link::nats::subjects::Subjects;
use ndd_link::seal::LocalIdentity;
use ndd_link::KnownPeers;
use ndd_modules::ModuleConfig;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

type Shared<T> = Arc<Mutex<T>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The JetStream consumers one side of `cfg` reads through (`ndd nats-permissions` grants
/// those and no other): [`drive::consumers`].
pub fn consumers(cfg: &Config, side: SideName, fingerprint: &str) -> Result<Vec<String>> {
    let subjects =
        Subjects::new(&cfg.link.nats.subject_prefix, &cfg.driver).map_err(|e| anyhow!(e))?;
    Ok(drive::consumers(
        &subjects,
        side.wire(),
        &plans(cfg, side),
        fingerprint,
    ))
}

/// What each stream of `cfg` is on the NATS link, seen from `side`.
fn plans(cfg: &Config, side: SideName) -> Vec<Plan> {
    cfg.streams
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mux = s.pairs().into_iter().find_map(|m| match m {
                ModuleConfig::Multiplex(c) => Some(c.clone()),
                _ => None,
            });
            Plan {
                index: i,
                id: Config::stream_id(i),
                name: s.name().to_string(),
                reliable: s.reliability == Reliability::Reliable,
                source: s.direction.source_side() == side,
                split: mux
                    .as_ref()
                    .filter(|m| m.mode == ndd_modules::multiplex::Mode::Split)
                    .map(|m| m.parts),
                round_robin: mux
                    .as_ref()
                    .is_some_and(|m| m.mode == ndd_modules::multiplex::Mode::RoundRobin),
                now_only: s
                    .pairs()
                    .into_iter()
                    .any(|m| matches!(m, ModuleConfig::Image(c) if c.keyframe_ms > 0)),
            }
        })
        .collect()
}

/// A stream's stack as the config builds it.
fn user_stack(cfg: &Config, plan: &Plan, role: Role) -> Result<Stack> {
    let pairs: Vec<&dyn Pair> = cfg.streams[plan.index]
        .pairs()
        .into_iter()
        .map(|m| m as &dyn Pair)
        .collect();
    Stack::build(role, &plan.name, &pairs).map_err(|e| anyhow!("{e}"))
}

/// A driver's error as the binary says it (an endpoint's with its own chain of causes).
fn said(e: DriveError) -> anyhow::Error {
    match e {
        DriveError::Endpoint(b) => anyhow::Error::from_boxed(b),
        e => anyhow::Error::new(e),
    }
}

/// Runs one side over NATS until stopped, the duration ends, or (with `--once`) the
/// sources end.
pub async fn run_side(
    cfg: &Config,
    opts: RunOptions,
    mut stop: watch::Receiver<bool>,
) -> Result<RunReport> {
    let side = opts.side;
    if opts.insecure || cfg.link.insecure {
        bail!("the NATS link always authenticates both sides and encrypts every frame: drop --insecure / link.insecure");
    }
    cfg.probe_side(side)?;
    let nats = &cfg.link.nats;
    Subjects::new(&nats.subject_prefix, &cfg.driver).map_err(|e| anyhow!(e))?;
    let identity = load_identity(&opts.home)?;
    KnownPeers::load(&opts.home)?;
    let local = LocalIdentity::new(&identity).context("identity")?;
    let ms = Duration::from_millis;
    let mut setup = Setup {
        side: side.wire(),
        driver: cfg.driver.clone(),
        hello: cfg.hello(side),
        nats: nats.clone(),
        timing: Timing {
            connect: ms(cfg.link.connect_timeout_ms),
            handshake: ms(cfg.link.handshake_timeout_ms),
            max_backoff: ms(cfg.link.max_backoff_ms),
            ping_interval: ms(cfg.link.ping_interval_ms),
            keepalive: ms(cfg.link.keepalive_timeout_ms),
        },
        once: opts.once,
        quiet: opts.quiet,
        home: opts.home.clone(),
        deadline: None,
        plans: plans(cfg, side),
    };
    let conn = drive::Connection::open(&setup).await.map_err(said)?;
    // `--duration` counts from the connection made.
    setup.deadline = opts.duration.map(|d| Instant::now() + d);
    let stats: Vec<Shared<StreamStats>> = setup
        .plans
        .iter()
        .map(|p| {
            Arc::new(Mutex::new(StreamStats::new(
                &p.name,
                if p.source { "source" } else { "sink" },
                cfg.streams[p.index].direction.wire().to_string(),
            )))
        })
        .collect();
    let mut t = Tasks {
        cfg,
        stats: &stats,
        set: JoinSet::new(),
        endpoints: Vec::new(),
        services: 0,
    };
    // Turns true when this side stops: sink streams hand over what they hold and end, so
    // their sinks finish (and `check` sinks report).
    let (finish_tx, finish_rx) = watch::channel(false);
    // `ndd status` asks this side over a socket (not for benchmarks' quiet sides).
    let mut status = (!opts.quiet)
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
    // The start's every step ends at a stop (a JetStream step tried again while the server is
    // away went on for tens of seconds, past systemd's TimeoutStopSec: found by a review).
    let mut told = stop.clone();
    let started = tokio::select! {
        // (The start first: where it waits on the stop itself, it says what it was doing.)
        biased;
        r = drive::start(&setup, &conn, &local, &finish_rx, &mut t, &mut told) => r.map_err(said),
        _ = stop.changed() => Err(anyhow!("stopped while the side started")),
    };
    let peer = match started {
        Ok(p) => p,
        Err(e) => {
            // (Its streams' tasks go with the set; their endpoints are stopped here.)
            for e in &t.endpoints {
                e.abort();
            }
            return Err(e);
        }
    };
    // Live lines name an app side's device as `known_peers` does, as a listener serving
    // several peers names each (`[app@board]`).
    let label = match (&opts.label, side) {
        (Some(l), _) => l.clone(),
        (None, SideName::Device) => "device".to_string(),
        (None, SideName::App) => format!("app@{}", peer.name),
    };
    let Tasks {
        set: mut tasks,
        endpoints,
        services,
        ..
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
            _ = sleep_until_opt(setup.deadline) => break,
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
                    st.update(|s| {
                        s.link = conn.state().to_string();
                        s.peer = Some(peer.now());
                        s.recoveries = conn.reconnects();
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
    conn.flush().await;
    tasks.abort_all();
    conn.close().await;
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

async fn sleep_until_opt(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => std::future::pending().await,
    }
}

/// A side's tasks: its streams' and the services that run beside them (the driver's
/// [`drive::Run`]).
struct Tasks<'a> {
    cfg: &'a Config,
    stats: &'a [Shared<StreamStats>],
    set: JoinSet<Result<Option<(String, CheckReport)>>>,
    /// The source endpoints' tasks: stopping them ends their streams cleanly (flushed, END).
    endpoints: Vec<tokio::task::AbortHandle>,
    /// How many of `set` serve as long as the side runs (the device's join service and key
    /// keeper, the app side's key follower and ready heartbeat).
    services: usize,
}

impl drive::Run for Tasks<'_> {
    /// Counted in `services`. A service that ends before the side is an error naming it
    /// (`what`): counted as a stream that ended, it ended a `--once` side, or its drain, while
    /// streams still ran (found by a review).
    fn service(&mut self, what: &'static str, task: drive::Task) {
        self.services += 1;
        self.set.spawn(async move {
            task.await.map_err(said)?;
            Err(ServiceEnded(what).into())
        });
    }

    fn stream(&mut self, half: StreamHalf) -> drive::Result<()> {
        self.start_stream(half)
            .map_err(|e| DriveError::Endpoint(e.into()))
    }
}

impl Tasks<'_> {
    /// Starts a stream's endpoint and stack, and its task running `half` between them.
    fn start_stream(&mut self, half: StreamHalf) -> Result<()> {
        let cfg = self.cfg;
        let (tx, rx) = mpsc::channel::<Frame>(64);
        match half {
            StreamHalf::Source(h) => {
                let plan = h.plan().clone();
                let s = &cfg.streams[plan.index];
                let mut stack = user_stack(cfg, &plan, Role::Source)?;
                let source = s
                    .source
                    .spawn_on_demand(plan.id, tx, None)
                    .with_context(|| {
                        format!(
                            "stream \"{}\": cannot start source {}",
                            plan.name,
                            s.source.describe()
                        )
                    })?;
                let tally = Tallied::of(&self.stats[plan.index]);
                self.endpoints.push(source.abort_handle());
                let described = s.source.describe();
                self.set.spawn(async move {
                    let mut source = source;
                    let r = h.run(rx, &mut stack, tally).await.map_err(said);
                    // A source that failed fails the side with its words (its stream's END
                    // went).
                    let failed = match r {
                        Ok(()) => {
                            crate::session::source_failure(&mut source, &plan.name, &described)
                                .await
                        }
                        Err(_) => None,
                    };
                    source.abort();
                    match failed {
                        Some(e) => Err(e),
                        None => r.map(|()| None),
                    }
                });
            }
            StreamHalf::Sink(h) => {
                let plan = h.plan().clone();
                let s = &cfg.streams[plan.index];
                let stack = user_stack(cfg, &plan, Role::Sink)?;
                let done = Delivered::default();
                let sink = s.sink.spawn_tracked(rx, done.clone()).with_context(|| {
                    format!(
                        "stream \"{}\": cannot start sink {}",
                        plan.name,
                        s.sink.describe()
                    )
                })?;
                // For a restarted device side: the same pairs, afresh.
                let pairs: Vec<ModuleConfig> = s.pairs().into_iter().cloned().collect();
                let name = plan.name.clone();
                let rebuild: ndd_link::nats::deliver::Rebuild = Box::new(move || {
                    let pairs: Vec<&dyn Pair> = pairs.iter().map(|m| m as &dyn Pair).collect();
                    Stack::build(Role::Sink, &name, &pairs)
                });
                let tally = Tallied::of(&self.stats[plan.index]);
                let completed = Box::new(move || done.count());
                self.set.spawn(async move {
                    let r = h.run(tx, stack, rebuild, completed, tally).await;
                    let name = plan.name;
                    let report = match sink.await {
                        Ok(Ok(rep)) => rep.check.map(|c| (name, c)),
                        Ok(Err(e)) => {
                            return Err(
                                anyhow!(e).context(format!("stream \"{name}\": sink failed"))
                            )
                        }
                        Err(_) => None,
                    };
                    r.map_err(said)?;
                    Ok(report)
                });
            }
        }
        Ok(())
    }
}

/// A stream's [`StreamStats`] as the driver counts into them.
struct Tallied(Shared<StreamStats>);

impl Tallied {
    fn of(stats: &Shared<StreamStats>) -> Arc<dyn Tally> {
        Arc::new(Tallied(stats.clone()))
    }
}

impl Tally for Tallied {
    fn produced(&self, len: usize) {
        lock(&self.0).produced(len);
    }

    fn wire(&self, frames: u64, bytes: u64) {
        let mut s = lock(&self.0);
        s.wire_frames += frames;
        s.wire_bytes += bytes;
    }

    fn sent(&self, bytes: u64, stack: &Stack) {
        let mut s = lock(&self.0);
        s.wire_frames += 1;
        s.wire_bytes += bytes;
        if s.layers_due(Instant::now()) {
            s.layers = stack.stats();
        }
    }

    fn delivered(&self, len: usize, created_ns: u64, stack: &Stack) {
        let mut s = lock(&self.0);
        s.delivered(len, created_ns, wall_ns());
        if s.layers_due(Instant::now()) {
            s.layers = stack.stats();
        }
    }

    fn dropped(&self, refused: u64, stale: u64, duplicates: u64) {
        let mut s = lock(&self.0);
        s.refused += refused;
        s.stale += stale;
        s.duplicates += duplicates;
    }

    fn sending(&self, overflow: u64, retransmits: u64) {
        let mut s = lock(&self.0);
        s.overflow = overflow;
        s.retransmits = retransmits;
    }

    fn given_up(&self, skipped: u64) {
        lock(&self.0).given_up = skipped;
    }

    fn layers(&self, stack: &Stack) {
        lock(&self.0).layers = stack.stats();
    }
}

/// A service of the side ([`drive::Run::service`]) ended before the side did.
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

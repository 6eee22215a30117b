//! A listener serving several peers at once (`link.peers` > 1, TCP or QUIC): one accept loop
//! hands every link that passed its handshake to the driver of its peer (by fingerprint, or
//! address without TLS), starting one for a new peer while there is room. Each driver is a
//! whole side of its own (session, streams, endpoints from the config read again with
//! `{peer}` replaced), so one peer's streams, stalls or failure never touch another's; its
//! reconnects come through the same loop. A new peer beyond the limit takes the place of one
//! whose link is down, else it is told the side is busy (CLOSE code 7) and retries.

use super::driver::{Driver, Inbox, Wiring};
use super::{
    lock_metrics, note, run_id, session_config, sleep_until_opt, wall_ns, AbortOnDrop, Metrics,
    PeerMetrics, RunOptions, RunReport,
};
use crate::config::{peer_file_name, Config};
use anyhow::{anyhow, Result};
use ndd_core::session::Session;
use ndd_link::{Connector, Established, HandshakeCtx, PeerGate};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::{mpsc, watch};

/// Who holds a place: a peer's key → (its driver's number, whether its link is up, where its
/// link comes from).
type Slots = Arc<Mutex<HashMap<String, (u64, Arc<AtomicBool>, std::net::SocketAddr)>>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The reason a listener turns `key` away, if it does: full of live peers, or `key`'s own
/// link up (a second machine with the same identity: served one at a time, never taking the
/// link from the first; a peer coming back gets in once its old link is found down).
fn turned_away(slots: &Slots, limit: usize, key: &str) -> Option<String> {
    let s = lock(slots);
    if let Some((_, up, from)) = s.get(key) {
        if !up.load(Ordering::Acquire) {
            return None;
        }
        return Some(format!(
            "is connected already to a side with this identity (from {from}); two machines sharing one identity are served one at a time: give the copy its own (`ndd keygen --force` there, then `ndd pair` with this side)"
        ));
    }
    if s.len() < limit || s.values().any(|(_, up, _)| !up.load(Ordering::Acquire)) {
        return None;
    }
    Some(format!(
        "serves {} peers already, its limit (link.peers = {limit}), every one of them connected",
        s.len()
    ))
}

/// What a peer's side needs of the run's options.
#[derive(Clone)]
struct PeerRun {
    side: crate::config::SideName,
    quiet: bool,
    once: bool,
    home: std::path::PathBuf,
    deadline: Option<Instant>,
    /// `--metrics`: where each peer's snapshot goes.
    metrics: Option<PeerMetrics>,
    /// `--stats`: each peer's panel on the live board.
    live_stats: Option<std::time::Duration>,
}

/// Runs a listening side that serves up to `cfg.link.peers` peers, until `stop` (or, with
/// `--once`, until every session it started has ended).
pub(super) async fn run_many(
    cfg: &Config,
    opts: &RunOptions,
    mut stop: watch::Receiver<bool>,
    ctx: HandshakeCtx,
    connector: Connector,
    deadline: Option<Instant>,
    metrics: Option<(Metrics, AbortOnDrop)>,
) -> Result<RunReport> {
    let (side, quiet) = (opts.side, opts.quiet);
    let limit = cfg.link.peers as usize;
    // `--metrics`: every peer's snapshot, served together (each labelled with its peer),
    // encoded again every second.
    let peer_metrics: PeerMetrics = Arc::default();
    let _metrics_refresh = metrics.map(|(served, server)| {
        let snaps = peer_metrics.clone();
        let side_name = side.as_str().to_string();
        let task = tokio::spawn(async move {
            let _server = server;
            loop {
                let all: Vec<crate::stats::Snapshot> =
                    lock_metrics(&snaps).values().cloned().collect();
                let text = if all.is_empty() {
                    // No peer yet: the side, its link down.
                    crate::stats::prometheus(&side_name, false, 0, None, &[])
                } else {
                    crate::stats::prometheus_all(all)
                };
                *lock_metrics(&served) = text;
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        });
        AbortOnDrop(task)
    });
    note!(
        quiet,
        side,
        "serving up to {limit} peers at once, each with its own streams"
    );
    let slots: Slots = Arc::default();
    let gate = {
        let slots = slots.clone();
        PeerGate(Arc::new(move |key| turned_away(&slots, limit, key)))
    };
    let ctx = HandshakeCtx {
        gate: Some(gate),
        ..ctx
    };
    let (tx, mut links) = mpsc::channel::<Established>(16);
    let connector = Arc::new(connector);
    let serving = connector.serve_each(&ctx, tx);
    tokio::pin!(serving);
    let run = PeerRun {
        side,
        quiet,
        once: opts.once,
        home: opts.home.clone(),
        deadline,
        metrics: _metrics_refresh.as_ref().map(|_| peer_metrics.clone()),
        live_stats: opts.live_stats.filter(|_| !quiet),
    };
    // Each peer's side is a task of its own: the runtime's workers share them out, and one
    // peer's burst of work never holds another's frames. Dropped (a listener that failed),
    // the set aborts them.
    let mut running: tokio::task::JoinSet<Result<RunReport>> = tokio::task::JoinSet::new();
    // Which peer each task serves: its driver's number, its key, its name.
    let mut tasks: HashMap<tokio::task::Id, (u64, String, String)> = HashMap::new();
    // Each driver's way in and its own stop.
    let mut doors: HashMap<String, (u64, mpsc::Sender<Established>, watch::Sender<bool>)> =
        HashMap::new();
    let mut next_id = 0u64;
    let mut served = 0usize;
    let mut reports: Vec<(String, RunReport)> = Vec::new();
    let mut failed: Option<anyhow::Error> = None;
    let mut stopping = false;
    loop {
        tokio::select! {
            e = &mut serving => return Err(anyhow!(e).context("the listener failed")),
            Some(est) = links.recv(), if !stopping => {
                let key = est.peer_key();
                if let Some((_, door, _)) = doors.get(&key) {
                    {
                        let mut s = lock(&slots);
                        let Some(slot) = s.get_mut(&key) else { continue };
                        if slot.1.load(Ordering::Acquire) {
                            // Its link came up while this one's handshake ran (a second
                            // machine with the same identity): dropped, it connects again and
                            // the handshake then says why it waits.
                            tracing::debug!(side = %side, "{} connected while its peer's link is up; dropped", est.peer);
                            continue;
                        }
                    }
                    // Its driver takes it when its link is down (a reconnect). Never waited
                    // for: a driver busy elsewhere must not hold every other peer back.
                    let from = est.addr;
                    if door.try_send(est).is_ok() {
                        if let Some(slot) = lock(&slots).get_mut(&key) {
                            slot.2 = from;
                        }
                    } else {
                        tracing::debug!(side = %side, "a link of a peer whose session has one already was dropped");
                    }
                    continue;
                }
                if doors.len() >= limit {
                    // The place of a peer whose link is down goes to the newcomer.
                    let down = lock(&slots)
                        .iter()
                        .find(|(_, (_, up, _))| !up.load(Ordering::Acquire))
                        .map(|(k, _)| k.clone());
                    let Some(down) = down else {
                        // The last place went while this one's handshake ran: the link is
                        // dropped (a CLOSE on a session would end the peer; a lost link makes it
                        // connect again, and the handshake then says the side is busy).
                        tracing::debug!(side = %side, "{} connected as the last place went; dropped, it connects again", est.peer);
                        drop(est);
                        continue;
                    };
                    if let Some((_, _, stop_it)) = doors.remove(&down) {
                        note!(quiet, side, "{} takes the place of a peer whose link is down ({down}); that peer's session ends", est.peer);
                        let _ = stop_it.send(true);
                    }
                    lock(&slots).remove(&down);
                }
                next_id += 1;
                let id = next_id;
                let up = Arc::new(AtomicBool::new(true));
                let (door, inbox) = mpsc::channel::<Established>(2);
                let (stop_one, stop_rx) = watch::channel(false);
                lock(&slots).insert(key.clone(), (id, up.clone(), est.addr));
                doors.insert(key.clone(), (id, door, stop_one));
                let inbox: Inbox = Arc::new(tokio::sync::Mutex::new(inbox));
                // Named as known_peers has it, or by fingerprint; by IP without TLS.
                let name = if est.fingerprint.is_some() {
                    peer_file_name(&est.peer)
                } else {
                    peer_file_name(&key)
                };
                note!(quiet, side, "peer {} connected as \"{name}\"; streams agreed", est.peer);
                let peer_cfg = cfg.for_peer(&name);
                let (run, ctx, connector) = (run.clone(), ctx.clone(), connector.clone());
                // Its lines say whose they are: `ndd [app lab3]: …`.
                let span = tracing::error_span!("peer", name = %name);
                let peer_name = name.clone();
                let task = running.spawn(tracing::Instrument::instrument(async move {
                    match peer_cfg {
                        Ok(c) => serve_peer(c, run, ctx, connector, est, peer_name, (inbox, up), stop_rx).await,
                        Err(e) => Err(e),
                    }
                }, span));
                tasks.insert(task.id(), (id, key, name));
                served += 1;
            }
            Some(joined) = running.join_next_with_id(), if !running.is_empty() => {
                let (task, r) = match joined {
                    Ok((task, r)) => (task, r),
                    Err(e) => (e.id(), Err(anyhow!("a peer's task failed: {e}"))),
                };
                let (id, key, name) = tasks.remove(&task).unwrap_or_default();
                if doors.get(&key).is_some_and(|d| d.0 == id) {
                    doors.remove(&key);
                    lock(&slots).remove(&key);
                    // Its session ended: no longer in `--metrics`.
                    lock_metrics(&peer_metrics).remove(&name);
                }
                match r {
                    Ok(rep) => {
                        note!(quiet, side, "peer \"{name}\": session ended");
                        // Its checks now, not when the listener ends (a daemon's may never).
                        for (stream, c) in &rep.checks {
                            if c.is_ok() {
                                tracing::info!(side = %side, "stream \"{stream}@{name}\": {c}");
                            } else {
                                tracing::warn!(side = %side, "stream \"{stream}@{name}\": {c}");
                            }
                        }
                        reports.push((name, rep));
                    }
                    Err(e) => {
                        tracing::warn!(side = %side, "peer \"{name}\": {}", crate::logfmt::error_text(&e));
                        failed.get_or_insert(e);
                    }
                }
                let past_deadline = deadline.is_some_and(|d| Instant::now() >= d);
                if running.is_empty() && (opts.once || stopping || past_deadline) {
                    break;
                }
            }
            _ = stop.changed(), if !stopping => {
                stopping = true;
                for (_, _, s) in doors.values() {
                    let _ = s.send(true);
                }
                if running.is_empty() {
                    break;
                }
            }
            _ = sleep_until_opt(deadline), if running.is_empty() && !stopping => {
                if served == 0 {
                    anyhow::bail!(
                        "no peer connected within --duration ({:.1} s)",
                        opts.duration.unwrap_or_default().as_secs_f64()
                    );
                }
                break;
            }
        }
    }
    if let Some(e) = failed.filter(|_| opts.once) {
        return Err(e);
    }
    Ok(merge(reports))
}

/// One peer's side: its config, streams, session and driver, until its session ends.
#[allow(clippy::too_many_arguments)]
async fn serve_peer(
    cfg: Config,
    run: PeerRun,
    ctx: HandshakeCtx,
    connector: Arc<Connector>,
    first: Established,
    name: String,
    inbox: (Inbox, Arc<AtomicBool>),
    mut stop: watch::Receiver<bool>,
) -> Result<RunReport> {
    let side = run.side;
    cfg.probe_side(side)?;
    let (plans, io) = super::streams::start(&cfg, side)?;
    let mut sess = Session::new(session_config(&cfg, run.once), plans, run_id())?;
    sess.handle_link_up(Instant::now(), wall_ns());
    let status = if run.quiet {
        None
    } else {
        crate::status::serve_or_say(crate::status::SideStatus::starting(
            &format!("{} ({name})", cfg.driver),
            side.as_str(),
            connector.local_addr().unwrap_or_default(),
            "up",
        ))
    };
    let mut driver = Driver::new(
        Wiring {
            cfg: &cfg,
            side,
            quiet: run.quiet,
            home: &run.home,
            live_stats: run.live_stats,
            panel: format!("{}@{name}", side.as_str()),
            ctx: &ctx,
            connector: &connector,
            metrics: None,
            peer_metrics: run.metrics.clone().map(|m| (m, name.clone())),
            status,
            deadline: run.deadline,
            inbox: Some(inbox),
        },
        sess,
        io,
        first,
    );
    let result = driver.run(&mut stop).await;
    driver.finish(result).await
}

/// The reports of every peer's session as one: streams and checks named `stream@peer`.
fn merge(reports: Vec<(String, RunReport)>) -> RunReport {
    let mut all = RunReport::default();
    let mut peers = Vec::new();
    for (name, r) in reports {
        for mut s in r.streams {
            s.name = format!("{}@{name}", s.name);
            all.streams.push(s);
        }
        for (stream, c) in r.checks {
            all.checks.push((format!("{stream}@{name}"), c));
        }
        all.recoveries.extend(r.recoveries);
        peers.push(r.peer);
    }
    all.peer = peers.join(", ");
    all.checks_said = true;
    all
}

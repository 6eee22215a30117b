//! `ndd serve [DIR]`: one process runs every driver in DIR (`NAME.toml`, each naming its
//! `side`), each isolated: a driver whose file does not parse, or that fails, never stops
//! another. A changed file restarts only its driver, a new one starts, a removed one stops;
//! the directory is read again every [`SCAN_EVERY`] and at SIGHUP.
//!
//! The rules are the sans-IO [`Supervisor`]: the directory as it stands and the drivers'
//! exits in, what to start and stop out, with restarts spaced (1 s doubling to a minute; back
//! to 1 s once a driver ran a minute, and at once 1 s after a session of 5 s or more that its
//! peer ended cleanly: a listener is back for the next peer). [`serve`] runs it: it reads the directory, runs each
//! driver on a runtime of its own (two worker threads, named `ndd-NAME`: a driver that
//! blocks or spins cannot starve another; its name prefixes its log lines,
//! [`crate::logfmt::set_thread_driver`]), and stops them all on SIGTERM or Ctrl-C.

use crate::config::{Config, SideName};
use crate::session::{self, Endpoint, RunOptions, TransportKind};
use anyhow::{anyhow, Result};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

/// How often the directory is read again (a changed file is seen within this long; SIGHUP
/// at once).
pub const SCAN_EVERY: Duration = Duration::from_secs(2);

/// The first wait before a failed driver starts again; it doubles up to [`RESTART_MAX`].
pub const RESTART_FIRST: Duration = Duration::from_secs(1);

/// The longest wait before a failed driver starts again.
pub const RESTART_MAX: Duration = Duration::from_secs(60);

/// A driver that ran this long before it failed starts again after [`RESTART_FIRST`].
pub const RAN_LONG: Duration = Duration::from_secs(60);

/// A driver that ran this long before it ended cleanly (its peer ended its streams) starts
/// again after [`RESTART_FIRST`]: a listener is back for the next peer at once. One that
/// ends sooner, again and again, is spaced as a failing one.
pub const RAN_SOME: Duration = Duration::from_secs(5);

/// How long the drivers get to stop when the daemon stops.
pub const STOP_WAIT: Duration = Duration::from_secs(10);

/// The most a driver file may hold.
const MAX_FILE: u64 = 1 << 20;

/// A driver file's content, as far as the supervisor cares: whether it changed.
pub type Digest = u64;

/// What the caller must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Start the driver of this file (read it now).
    Start(String),
    /// Ask the driver to stop; report its exit with [`Supervisor::handle_exit`].
    Stop(String),
}

/// How a driver ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exit {
    /// It ended without an error (asked to stop, or its streams ended).
    Clean,
    /// It failed at run time (started again, spaced).
    Failed(String),
    /// Its file cannot be run as it is (does not parse, names no side): not started again
    /// until the file changes.
    BadFile(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// To start at this instant.
    Due(Instant),
    /// Running since.
    Running(Instant),
    /// Asked to stop; `again`: start it once it has (its file changed).
    Stopping { again: bool },
    /// Its file cannot be run; waits for a change.
    Broken,
}

#[derive(Debug)]
struct Slot {
    digest: Digest,
    state: State,
    /// The wait before the next start after a failure.
    backoff: Duration,
    /// Its file is gone: forgotten once stopped.
    removed: bool,
}

/// The daemon's drivers, by file name (without `.toml`).
#[derive(Debug, Default)]
pub struct Supervisor {
    slots: BTreeMap<String, Slot>,
    stopping_all: bool,
    /// Actions decided, not yet polled.
    due: Vec<Action>,
}

impl Supervisor {
    /// No drivers yet.
    pub fn new() -> Supervisor {
        Supervisor::default()
    }

    /// The directory as it stands: each driver file and its digest.
    pub fn handle_scan(&mut self, now: Instant, files: &BTreeMap<String, Digest>) {
        if self.stopping_all {
            return;
        }
        for (name, &digest) in files {
            match self.slots.get_mut(name) {
                None => {
                    self.slots.insert(
                        name.clone(),
                        Slot {
                            digest,
                            state: State::Due(now),
                            backoff: RESTART_FIRST,
                            removed: false,
                        },
                    );
                }
                Some(slot) => {
                    slot.removed = false;
                    if slot.digest == digest {
                        continue;
                    }
                    slot.digest = digest;
                    slot.backoff = RESTART_FIRST;
                    slot.state = match slot.state {
                        State::Running(_) => {
                            self.due.push(Action::Stop(name.clone()));
                            State::Stopping { again: true }
                        }
                        State::Stopping { .. } => State::Stopping { again: true },
                        State::Due(_) | State::Broken => State::Due(now),
                    };
                }
            }
        }
        for (name, slot) in self.slots.iter_mut() {
            if files.contains_key(name) || slot.removed {
                continue;
            }
            slot.removed = true;
            if let State::Running(_) = slot.state {
                self.due.push(Action::Stop(name.clone()));
                slot.state = State::Stopping { again: false };
            } else if let State::Stopping { .. } = slot.state {
                slot.state = State::Stopping { again: false };
            }
        }
        self.slots
            .retain(|_, s| !(s.removed && matches!(s.state, State::Due(_) | State::Broken)));
    }

    /// The driver `name` ended.
    pub fn handle_exit(&mut self, now: Instant, name: &str, exit: Exit) {
        let Some(slot) = self.slots.get_mut(name) else {
            return;
        };
        let ran = match slot.state {
            State::Running(since) => Some(now.saturating_duration_since(since)),
            _ => None,
        };
        let asked = matches!(slot.state, State::Stopping { .. });
        let again = matches!(slot.state, State::Stopping { again: true });
        if slot.removed || self.stopping_all {
            self.slots.remove(name);
            return;
        }
        slot.state = match exit {
            Exit::BadFile(_) => State::Broken,
            _ if again => State::Due(now),
            _ if asked => State::Due(now),
            Exit::Clean | Exit::Failed(_) => {
                let settled = match exit {
                    Exit::Clean => RAN_SOME,
                    _ => RAN_LONG,
                };
                if ran.is_some_and(|r| r >= settled) {
                    // It had settled: back at once, the spacing starting over.
                    slot.backoff = RESTART_FIRST;
                    State::Due(now + RESTART_FIRST)
                } else {
                    let at = now + slot.backoff;
                    slot.backoff = (slot.backoff * 2).min(RESTART_MAX);
                    State::Due(at)
                }
            }
        };
    }

    /// The daemon stops: every running driver is asked to, none starts again.
    pub fn handle_stop_all(&mut self) {
        self.stopping_all = true;
        for (name, slot) in self.slots.iter_mut() {
            if let State::Running(_) = slot.state {
                self.due.push(Action::Stop(name.clone()));
                slot.state = State::Stopping { again: false };
            }
        }
        self.slots
            .retain(|_, s| matches!(s.state, State::Stopping { .. }));
    }

    /// The next thing to do at `now`. A start the caller makes is running from `now` on.
    pub fn poll_action(&mut self, now: Instant) -> Option<Action> {
        if !self.due.is_empty() {
            return Some(self.due.remove(0));
        }
        if self.stopping_all {
            return None;
        }
        let (name, slot) = self
            .slots
            .iter_mut()
            .find(|(_, s)| matches!(s.state, State::Due(at) if at <= now))?;
        slot.state = State::Running(now);
        Some(Action::Start(name.clone()))
    }

    /// When a start is due next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.stopping_all {
            return None;
        }
        self.slots
            .values()
            .filter_map(|s| match s.state {
                State::Due(at) => Some(at),
                _ => None,
            })
            .min()
    }

    /// Whether no driver runs or is stopping.
    pub fn is_idle(&self) -> bool {
        !self
            .slots
            .values()
            .any(|s| matches!(s.state, State::Running(_) | State::Stopping { .. }))
    }

    /// How many drivers run now.
    pub fn running(&self) -> usize {
        self.slots
            .values()
            .filter(|s| matches!(s.state, State::Running(_)))
            .count()
    }
}

/// The driver files of `dir`: `NAME.toml` → digest of its content. Files that cannot be read
/// count with a digest of the error, so that they are reported (and again once it changes).
pub fn scan(dir: &Path) -> Result<BTreeMap<String, Digest>> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| anyhow!("cannot read the driver directory {}: {e}", dir.display()))?;
    let mut out = BTreeMap::new();
    for e in entries.flatten() {
        let path = e.path();
        if path.extension().and_then(|x| x.to_str()) != Some("toml") {
            continue;
        }
        let Some(name) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        if name.starts_with('.') {
            continue;
        }
        let digest = match read_file(&path) {
            Ok(text) => digest_of(text.as_bytes()),
            Err(e) => digest_of(e.to_string().as_bytes()) ^ 1,
        };
        out.insert(name.to_string(), digest);
    }
    Ok(out)
}

fn digest_of(b: &[u8]) -> Digest {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    b.hash(&mut h);
    h.finish()
}

fn read_file(path: &Path) -> Result<String> {
    use std::io::Read;
    let f = std::fs::File::open(path)?;
    let mut text = String::new();
    f.take(MAX_FILE + 1).read_to_string(&mut text)?;
    if text.len() as u64 > MAX_FILE {
        return Err(anyhow!("larger than {MAX_FILE} bytes"));
    }
    Ok(text)
}

/// What a driver file asks for: its config, side and endpoint; or why it cannot run.
pub fn load(path: &Path) -> Result<(Config, SideName, Endpoint)> {
    let text = read_file(path).map_err(|e| anyhow!("cannot read {}: {e:#}", path.display()))?;
    let cfg = Config::parse(&text, path)?;
    let side = cfg.side.ok_or_else(|| {
        anyhow!(
            "{} names no side: add side = \"device\" or side = \"app\" (which side this machine runs)",
            path.display()
        )
    })?;
    cfg.build_pairs()?;
    let endpoint = if cfg.link.listener == side {
        Endpoint::Listen(cfg.link.address.clone())
    } else {
        Endpoint::Connect(cfg.link.address.clone())
    };
    if let (Endpoint::Connect(a), false) = (&endpoint, cfg.link.transport == TransportKind::Nats) {
        crate::config::check_connect_target(a, "link.address")?;
    }
    Ok((cfg, side, endpoint))
}

/// Runs the drivers of `dir` with the identity in `home` until `stop` turns true, reading
/// the directory again every [`SCAN_EVERY`] and when `reload` is notified.
pub async fn serve(
    dir: PathBuf,
    home: PathBuf,
    mut stop: watch::Receiver<bool>,
    reload: std::sync::Arc<tokio::sync::Notify>,
) -> Result<()> {
    // The directory must be there at start (a typo is an error); later it may come and go.
    scan(&dir)?;
    tracing::info!(
        "serving the drivers in {} (a changed file restarts its driver; SIGHUP reads the directory at once)",
        dir.display()
    );
    let mut sup = Supervisor::new();
    let (exits, mut exited) = mpsc::unbounded_channel::<(String, Exit)>();
    let mut stops: HashMap<String, watch::Sender<bool>> = HashMap::new();
    let mut said_dir = false;
    let mut scan_at = Instant::now();
    loop {
        let now = Instant::now();
        if now >= scan_at {
            scan_at = now + SCAN_EVERY;
            match scan(&dir) {
                Ok(files) => {
                    said_dir = false;
                    sup.handle_scan(now, &files);
                }
                Err(e) if !said_dir => {
                    said_dir = true;
                    tracing::warn!("{e:#}; the drivers running go on");
                }
                Err(_) => {}
            }
        }
        while let Some(a) = sup.poll_action(Instant::now()) {
            match a {
                Action::Start(name) => {
                    let path = dir.join(format!("{name}.toml"));
                    match load(&path) {
                        Ok((cfg, side, endpoint)) => {
                            let (tx, rx) = watch::channel(false);
                            stops.insert(name.clone(), tx);
                            start(name, cfg, side, endpoint, home.clone(), rx, exits.clone());
                        }
                        Err(e) => {
                            tracing::warn!(
                                "driver {name} not started: {}; it starts once the file changes",
                                crate::logfmt::error_text(&e)
                            );
                            sup.handle_exit(Instant::now(), &name, Exit::BadFile(e.to_string()));
                        }
                    }
                }
                Action::Stop(name) => {
                    tracing::info!("stopping driver {name}");
                    if let Some(tx) = stops.get(&name) {
                        let _ = tx.send(true);
                    }
                }
            }
        }
        if *stop.borrow() {
            break;
        }
        let wake = sup.poll_timeout().map_or(scan_at, |t| t.min(scan_at));
        tokio::select! {
            Some((name, exit)) = exited.recv() => {
                stops.remove(&name);
                match &exit {
                    Exit::Clean => tracing::info!("driver {name} ended"),
                    Exit::Failed(e) => tracing::warn!("driver {name} failed: {e}; it starts again"),
                    Exit::BadFile(e) => tracing::warn!("driver {name}: {e}"),
                }
                sup.handle_exit(Instant::now(), &name, exit);
            }
            _ = tokio::time::sleep_until(wake.into()) => {}
            _ = reload.notified() => {
                tracing::info!("reading {} again", dir.display());
                scan_at = Instant::now();
            }
            _ = stop.changed() => {}
        }
    }
    // Stopping: every driver is told, and given STOP_WAIT to end.
    sup.handle_stop_all();
    while let Some(a) = sup.poll_action(Instant::now()) {
        if let Action::Stop(name) = a {
            if let Some(tx) = stops.get(&name) {
                let _ = tx.send(true);
            }
        }
    }
    let until = tokio::time::Instant::now() + STOP_WAIT;
    while !sup.is_idle() {
        match tokio::time::timeout_at(until, exited.recv()).await {
            Ok(Some((name, _))) => {
                stops.remove(&name);
                sup.handle_exit(Instant::now(), &name, Exit::Clean);
            }
            _ => {
                tracing::warn!(
                    "{} driver(s) did not stop within {STOP_WAIT:?}; leaving them",
                    stops.len()
                );
                break;
            }
        }
    }
    Ok(())
}

/// Starts driver `name` as a task; its exit goes to `exits`.
fn start(
    name: String,
    cfg: Config,
    side: SideName,
    endpoint: Endpoint,
    home: PathBuf,
    stop: watch::Receiver<bool>,
    exits: mpsc::UnboundedSender<(String, Exit)>,
) {
    let opts = RunOptions {
        side,
        home,
        endpoint,
        insecure: false,
        live_stats: None,
        duration: None,
        quiet: false,
        once: false,
        metrics: None,
        peer_hint: None,
        label: None,
    };
    tracing::info!("starting driver {name} ({side} side of \"{}\")", cfg.driver);
    let thread_name = format!("ndd-{name}");
    let spawned = std::thread::Builder::new()
        .name(thread_name.clone())
        .spawn(move || {
            crate::logfmt::set_thread_driver(Some(&name));
            let tagged = name.clone();
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name(thread_name)
                .on_thread_start(move || crate::logfmt::set_thread_driver(Some(&tagged)))
                .enable_all()
                .build();
            let exit = match rt {
                Err(e) => Exit::Failed(format!("cannot start its runtime: {e}")),
                Ok(rt) => {
                    let r =
                        rt.block_on(session::run_side_task(std::sync::Arc::new(cfg), opts, stop));
                    // An endpoint's thread still in a system call is not waited for.
                    rt.shutdown_timeout(Duration::from_secs(1));
                    match r {
                        Ok(report) => said(side, &report),
                        Err(e) => Exit::Failed(crate::logfmt::error_text(&e)),
                    }
                }
            };
            let _ = exits.send((name, exit));
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot start a thread for a driver: {e}");
    }
}

/// What a driver's side reported as it ended, in the log (as `ndd run` prints it); a check
/// that failed makes the exit a failure.
fn said(side: SideName, report: &session::RunReport) -> Exit {
    let mut failed = Vec::new();
    for (stream, c) in &report.checks {
        if c.is_ok() {
            if !report.checks_said {
                tracing::info!(side = %side, "stream \"{stream}\": {c}");
            }
        } else {
            if !report.checks_said {
                tracing::warn!(side = %side, "stream \"{stream}\": {c}");
            }
            failed.push(stream.as_str());
        }
    }
    if failed.is_empty() {
        Exit::Clean
    } else {
        Exit::Failed(format!(
            "the check of stream(s) {} failed",
            failed.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(v: &[(&str, Digest)]) -> BTreeMap<String, Digest> {
        v.iter().map(|(n, d)| (n.to_string(), *d)).collect()
    }

    fn drain(s: &mut Supervisor, now: Instant) -> Vec<Action> {
        std::iter::from_fn(|| s.poll_action(now)).collect()
    }

    fn start(n: &str) -> Action {
        Action::Start(n.to_string())
    }

    fn stop(n: &str) -> Action {
        Action::Stop(n.to_string())
    }

    #[test]
    fn new_files_start_changed_ones_restart_alone_and_removed_ones_stop() {
        let t = Instant::now();
        let mut s = Supervisor::new();
        s.handle_scan(t, &files(&[("serial", 1), ("desktop", 2)]));
        assert_eq!(drain(&mut s, t), vec![start("desktop"), start("serial")]);
        assert_eq!(s.running(), 2);
        // The same directory again: nothing to do.
        s.handle_scan(t, &files(&[("serial", 1), ("desktop", 2)]));
        assert_eq!(drain(&mut s, t), vec![]);
        // serial.toml changed: only serial stops, and starts once it has.
        s.handle_scan(t, &files(&[("serial", 9), ("desktop", 2)]));
        assert_eq!(drain(&mut s, t), vec![stop("serial")]);
        s.handle_exit(t, "serial", Exit::Clean);
        assert_eq!(drain(&mut s, t), vec![start("serial")]);
        // A new file starts; a removed one stops and is forgotten.
        s.handle_scan(t, &files(&[("serial", 9), ("audio", 3)]));
        assert_eq!(drain(&mut s, t), vec![stop("desktop"), start("audio")]);
        s.handle_exit(t, "desktop", Exit::Clean);
        assert_eq!(drain(&mut s, t), vec![]);
        assert_eq!(s.running(), 2);
        // Back again: it starts.
        s.handle_scan(t, &files(&[("serial", 9), ("audio", 3), ("desktop", 2)]));
        assert_eq!(drain(&mut s, t), vec![start("desktop")]);
    }

    #[test]
    fn a_failing_driver_starts_again_further_apart_and_never_stops_another() {
        let t = Instant::now();
        let mut s = Supervisor::new();
        s.handle_scan(t, &files(&[("a", 1), ("b", 2)]));
        drain(&mut s, t);
        let mut at = t;
        let mut gaps = Vec::new();
        for _ in 0..8 {
            s.handle_exit(at, "a", Exit::Failed("the port is gone".into()));
            let next = s.poll_timeout().unwrap();
            assert_eq!(drain(&mut s, next - Duration::from_millis(1)), vec![]);
            gaps.push((next - at).as_secs());
            assert_eq!(drain(&mut s, next), vec![start("a")]);
            at = next;
        }
        assert_eq!(gaps, vec![1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(s.running(), 2, "b ran all along");
        // Once it ran a minute, a failure is followed by a start after a second again.
        let later = at + RAN_LONG;
        s.handle_exit(later, "a", Exit::Failed("peer gone".into()));
        assert_eq!(s.poll_timeout(), Some(later + RESTART_FIRST));
        // A file that cannot run waits for a change, whatever the time.
        drain(&mut s, later + RESTART_FIRST);
        s.handle_exit(later, "a", Exit::BadFile("names no side".into()));
        assert_eq!(s.poll_timeout(), None);
        assert_eq!(drain(&mut s, later + Duration::from_secs(3600)), vec![]);
        s.handle_scan(later, &files(&[("a", 5), ("b", 2)]));
        assert_eq!(drain(&mut s, later), vec![start("a")]);
        // A change resets the spacing.
        s.handle_exit(later, "a", Exit::Failed("x".into()));
        assert_eq!(s.poll_timeout(), Some(later + RESTART_FIRST));
    }

    #[test]
    fn a_driver_whose_peer_ended_is_back_after_a_second_unless_it_ends_at_once_again() {
        let t = Instant::now();
        let mut s = Supervisor::new();
        s.handle_scan(t, &files(&[("a", 1)]));
        drain(&mut s, t);
        // Sessions of a minute, each ended cleanly by the peer: back after 1 s every time.
        let mut at = t;
        for _ in 0..5 {
            let end = at + RAN_LONG;
            s.handle_exit(end, "a", Exit::Clean);
            assert_eq!(s.poll_timeout(), Some(end + RESTART_FIRST));
            at = end + RESTART_FIRST;
            assert_eq!(drain(&mut s, at), vec![start("a")]);
        }
        // Ending at once, again and again: spaced as failures are.
        let mut gaps = Vec::new();
        for _ in 0..4 {
            s.handle_exit(at, "a", Exit::Clean);
            let next = s.poll_timeout().unwrap();
            gaps.push((next - at).as_secs());
            drain(&mut s, next);
            at = next;
        }
        assert_eq!(gaps, vec![1, 2, 4, 8]);
    }

    #[test]
    fn a_file_changed_while_its_driver_stops_starts_once_and_stop_all_starts_nothing() {
        let t = Instant::now();
        let mut s = Supervisor::new();
        s.handle_scan(t, &files(&[("a", 1)]));
        drain(&mut s, t);
        s.handle_scan(t, &files(&[("a", 2)]));
        s.handle_scan(t, &files(&[("a", 3)]));
        assert_eq!(drain(&mut s, t), vec![stop("a")], "asked once");
        s.handle_exit(t, "a", Exit::Clean);
        assert_eq!(drain(&mut s, t), vec![start("a")]);
        // Removed while stopping for a change: not started again.
        s.handle_scan(t, &files(&[("a", 4)]));
        assert_eq!(drain(&mut s, t), vec![stop("a")]);
        s.handle_scan(t, &files(&[]));
        s.handle_exit(t, "a", Exit::Clean);
        assert_eq!(drain(&mut s, t), vec![]);
        assert!(s.is_idle());
        // Stopping all: the running ones are told, nothing starts after, and a file that
        // comes meanwhile is not started.
        s.handle_scan(t, &files(&[("x", 1), ("y", 2)]));
        drain(&mut s, t);
        s.handle_exit(t, "y", Exit::Failed("boom".into()));
        s.handle_stop_all();
        assert_eq!(drain(&mut s, t), vec![stop("x")]);
        s.handle_scan(t, &files(&[("x", 1), ("y", 2), ("z", 3)]));
        assert_eq!(drain(&mut s, t + Duration::from_secs(60)), vec![]);
        assert!(!s.is_idle());
        s.handle_exit(t, "x", Exit::Clean);
        assert!(s.is_idle());
    }
}

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

use crate::config::{Config, Reliability, SideName};
use crate::session::{load_identity, wall_ns, RunOptions, RunReport};
use crate::stats::StreamStats;
use anyhow::{anyhow, bail, Context, Result};
use async_nats::jetstream;
use bytes::Bytes;
use futures_util::StreamExt;
use ndd_core::{Frame, Half, Meta, Output, Pair, Role, Stack};
use ndd_endpoint::Delivered;
use ndd_link::nats::admit::{Admitter, Decision, Level, Line as AdmitLine, Trust};
use ndd_link::nats::async_nats;
use ndd_link::nats::intake::{Intake, Taken, REORDER_WAIT};
use ndd_link::nats::join::{Admission, Host, Joiner, Welcome};
use ndd_link::nats::keys::{
    rotation, GroupKey, Outcome, RunHalf, EARLIER_RUNS, RUN_NOTICE_SPACING, SINCE_PENDING,
};
use ndd_link::nats::receive::{Event, Poll, Receiver, Wait};
use ndd_link::nats::record::{FrameRecord, END_SEQ, HEADER_LEN};
use ndd_link::nats::runs::{next_run_id, Run};
use ndd_link::nats::send::{Follow, RunSeal, Sender};
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

/// Replay window of the group key's inverse halves, in frames.
const SEAL_WINDOW: u32 = 4096;
/// Sending halves (epochs) a group key's inverse keeps at once: one per app side feeding an
/// app → device stream, and one more for each rotation it follows. With the `encrypt`
/// pair's default of two, a third app side's frames retired the first one's epoch and the
/// device refused the rest of them as replays (found by a four-app-side test).
const SENDERS: usize = 128;
/// JetStream publishes awaiting their acknowledgement, per stream, at most.
const JS_IN_FLIGHT: usize = 256;
/// How long a device side waits for JetStream to elect its leaders (a cluster starting, or
/// one that lost a node) before it gives up on the driver's stream.
const JS_READY_WAIT: Duration = Duration::from_secs(15);
/// How long JetStream keeps a message id to drop a republished duplicate.
const JS_DUPLICATE_WINDOW: Duration = Duration::from_secs(120);
/// How long an app side that got a stream's END waits for stored frames still on their way.
const ENDING_WAIT: Duration = Duration::from_secs(15);

/// After a lossy stream's END, the pauses before it goes again (core NATS may lose one).
const END_REPEATS: [Duration; 2] = [Duration::from_millis(20), Duration::from_millis(100)];

type Shared<T> = Arc<Mutex<T>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Where the group key of `driver` lives in the ndd home.
fn key_path(home: &Path, prefix: &str, driver: &str) -> std::path::PathBuf {
    home.join(format!("nats-group-{prefix}-{driver}.key"))
}

/// Who was handed the group key now in `key_path` (one fingerprint a line): if one of them
/// is no longer trusted, the key is rotated.
fn holders_path(home: &Path, prefix: &str, driver: &str) -> std::path::PathBuf {
    home.join(format!("nats-group-{prefix}-{driver}.holders"))
}

/// 32 fresh random bytes.
fn draw_key() -> Result<[u8; 32]> {
    use ring::rand::SecureRandom;
    let mut k = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut k)
        .map_err(|_| anyhow!("the system random number generator failed"))?;
    Ok(k)
}

/// Replaces `path` with `bytes` atomically, readable by its owner only.
fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let tmp = path.with_extension("new");
    let _ = std::fs::remove_file(&tmp);
    (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })()
    .with_context(|| format!("cannot write {}", path.display()))
}

/// Where the key before the last rotation of `driver` lives, with the JetStream sequence of
/// the rotation: `key (32) ‖ since (u64 BE)`, mode 0600.
fn previous_path(home: &Path, prefix: &str, driver: &str) -> std::path::PathBuf {
    home.join(format!("nats-group-{prefix}-{driver}.previous"))
}

/// The group key of `driver` and what its last rotation left (see [`GroupKey`]), for the
/// device run `run`.
fn group_key(
    home: &Path,
    prefix: &str,
    driver: &str,
    run: Run,
    earlier: [Option<Run>; EARLIER_RUNS],
) -> Result<GroupKey> {
    let key = current_key(home, prefix, driver)?;
    let path = previous_path(home, prefix, driver);
    // A key and the sequence of the rotation that retired it: the previous key, then (since
    // join version 5) the one before it.
    let retired = |b: &[u8]| {
        let mut k = [0u8; 32];
        k.copy_from_slice(&b[..32]);
        let mut n = [0u8; 8];
        n.copy_from_slice(&b[32..40]);
        (k, u64::from_be_bytes(n))
    };
    let (previous, older) = match std::fs::read(&path) {
        Ok(b) if b.len() == 40 => (Some(retired(&b)), None),
        Ok(b) if b.len() == 80 => (Some(retired(&b[..40])), Some(retired(&b[40..]))),
        Ok(b) => {
            tracing::warn!(
                side = "device",
                "{} holds {} bytes, not keys with their sequences (40 or 80); ignored: app → device frames sealed before the last rotation and not yet read will not open",
                path.display(),
                b.len()
            );
            (None, None)
        }
        Err(_) => (None, None),
    };
    Ok(GroupKey {
        key,
        since: previous.map_or(0, |p| p.1),
        previous: previous.map(|p| p.0),
        older,
        run,
        earlier,
    })
}

/// Where the device side notes its last runs, oldest first: `id (u64 BE) ‖ began (u64 BE)`
/// each, at most [`EARLIER_RUNS`] + 1 (before 2026-11-29: the last id alone, 8 bytes). The
/// next run's id is higher (a recording of an earlier run never passes for a later one, see
/// [`next_run_id`]); the earlier runs go to the app sides in the keys (`GroupKey::earlier`).
fn run_path(home: &Path, prefix: &str, driver: &str) -> std::path::PathBuf {
    home.join(format!("nats-group-{prefix}-{driver}.run"))
}

/// A device side's new run, beginning after JetStream stream sequence `began`, and its runs
/// before it (newest first); the run is noted in the home before any frame of it is sealed.
fn new_run(
    home: &Path,
    prefix: &str,
    driver: &str,
    began: u64,
) -> Result<(Run, [Option<Run>; EARLIER_RUNS])> {
    let path = run_path(home, prefix, driver);
    let u64_at = |b: &[u8], at: usize| {
        let mut n = [0u8; 8];
        n.copy_from_slice(&b[at..at + 8]);
        u64::from_be_bytes(n)
    };
    let (last, mut runs): (Option<u64>, Vec<Run>) = match std::fs::read(&path) {
        Ok(b) if b.len() == 8 => (Some(u64_at(&b, 0)), Vec::new()),
        Ok(b) if !b.is_empty() && b.len() % 16 == 0 => {
            let runs: Vec<Run> = b
                .chunks_exact(16)
                .map(|c| Run {
                    id: u64_at(c, 0),
                    began: u64_at(c, 8),
                })
                .collect();
            (runs.last().map(|r| r.id), runs)
        }
        Ok(b) => {
            return Err(anyhow!(
                "{} holds {} bytes, not run ids (8, or 16 per run); delete it if no earlier run of this driver can be replayed into the next (app sides then refuse nothing of earlier runs that a clock set back would number higher)",
                path.display(),
                b.len()
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (None, Vec::new()),
        Err(e) => return Err(anyhow!(e).context(format!("cannot read {}", path.display()))),
    };
    let id = next_run_id(last, wall_ns(), random_u64() as u16);
    let run = Run { id, began };
    let mut earlier = [None; EARLIER_RUNS];
    for (e, r) in earlier.iter_mut().zip(runs.iter().rev()) {
        *e = Some(*r);
    }
    runs.push(run);
    let keep = runs.len().saturating_sub(EARLIER_RUNS + 1);
    let bytes: Vec<u8> = runs[keep..]
        .iter()
        .flat_map(|r| r.id.to_be_bytes().into_iter().chain(r.began.to_be_bytes()))
        .collect();
    write_private(&path, &bytes)
        .with_context(|| format!("cannot note the run in {}", path.display()))?;
    Ok((run, earlier))
}

/// The group key of `driver`: read from the ndd home, or drawn and written there (0600).
fn current_key(home: &Path, prefix: &str, driver: &str) -> Result<[u8; 32]> {
    use std::os::unix::fs::PermissionsExt;
    let path = key_path(home, prefix, driver);
    match std::fs::read(&path) {
        Ok(b) => {
            let mode = std::fs::metadata(&path)?.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                bail!(
                    "{} has permissions {mode:04o}, but it must be readable by its owner only; fix it with: chmod 600 {}",
                    path.display(),
                    path.display()
                );
            }
            <[u8; 32]>::try_from(b.as_slice()).map_err(|_| {
                anyhow!(
                    "{} holds {} bytes, not a 32-byte group key; delete it to draw a new one (app sides then join again)",
                    path.display(),
                    b.len()
                )
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let k = draw_key()?;
            write_private(&path, &k)
                .with_context(|| format!("cannot write the group key {}", path.display()))?;
            let _ = std::fs::remove_file(holders_path(home, prefix, driver));
            let _ = std::fs::remove_file(previous_path(home, prefix, driver));
            Ok(k)
        }
        Err(e) => Err(anyhow!(e).context(format!("cannot read {}", path.display()))),
    }
}

/// The fingerprints in a holders file (missing: none).
fn holders(path: &Path) -> Result<Vec<String>> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(t
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(anyhow!(e).context(format!("cannot read {}", path.display()))),
    }
}

/// Notes that `fp` holds the current group key.
fn add_holder(path: &Path, fp: &str) -> Result<()> {
    let mut all = holders(path)?;
    if all.iter().any(|h| h == fp) {
        return Ok(());
    }
    all.push(fp.to_owned());
    write_private(path, (all.join("\n") + "\n").as_bytes())
}

/// The device side's group key and who holds it. When a holder is no longer in
/// `known_peers` (`ndd untrust`), the key is rotated: a new one is drawn and written, every
/// stream seals under it from its next frame, nobody holds it until they join again (the
/// trusted app sides do so by themselves; the untrusted one is refused), and `P.D.rekey`
/// tells the app sides.
struct KeyKeeper {
    home: std::path::PathBuf,
    prefix: String,
    driver: String,
    tx: watch::Sender<GroupKey>,
    /// Signs the rekey notice.
    local: LocalIdentity,
    /// Where app → device reliable frames are stored: a rotation notes its sequence.
    js: Option<jetstream::Context>,
}

/// What a rekey notice's signature covers besides its body: the kind of note and the
/// driver's subjects (a notice for one driver is no use for another).
fn rekey_label(subjects: &Subjects) -> Vec<u8> {
    format!("ndd nats rekey v1 {}", subjects.rekey()).into_bytes()
}

/// A rekey notice's body: `rekey`, the device run's id and the device side's wall clock in ns.
/// App sides take only notices newer than the last they took, by run first (run ids only
/// grow, even when the clock is set back), then by clock: a replayed one costs nothing.
fn rekey_body(run: u64, wall_ns: u64) -> Vec<u8> {
    let mut b = b"rekey".to_vec();
    b.extend_from_slice(&run.to_be_bytes());
    b.extend_from_slice(&wall_ns.to_be_bytes());
    b
}

/// Tells the app sides to join again (`P.D.rekey`): the group key rotated, or this device
/// side started a new run. Signed by this side: only a device side the app sides trust can
/// send them joining again (the notice still carries nothing secret).
async fn rekey_notice(ctx: &Ctx, local: &LocalIdentity, run: u64) {
    match local.sign_note(&rekey_label(&ctx.subjects), &rekey_body(run, wall_ns())) {
        Ok(note) => {
            let _ = ctx
                .client
                .publish(ctx.subjects.rekey(), Bytes::from(note))
                .await;
        }
        Err(e) => tracing::warn!(side = "device", "cannot sign the rekey notice: {e}"),
    }
}

/// A device side's new run: the app sides that ran on join again to learn it, at once and
/// whenever frames sealed for an earlier run come in (`stale`), at most every
/// [`RUN_NOTICE_SPACING`].
async fn announce_run(ctx: Ctx, local: LocalIdentity, run: u64, stale: Arc<tokio::sync::Notify>) {
    loop {
        rekey_notice(&ctx, &local, run).await;
        tokio::time::sleep(RUN_NOTICE_SPACING).await;
        stale.notified().await;
    }
}

impl KeyKeeper {
    fn holders_path(&self) -> std::path::PathBuf {
        holders_path(&self.home, &self.prefix, &self.driver)
    }

    /// Rotates the key if one of its holders is no longer trusted; returns who was revoked.
    /// The old key stays for the app → device frames stored before the rotation, in memory
    /// and in the `.previous` file: up to the JetStream stream's last sequence once this side's
    /// sinks open under the new key (any frame they took under the old one is at or below it,
    /// so nothing they took is published again by its sender, and nothing stored later under
    /// the old key opens).
    async fn rotate_if_revoked(&self, ctx: &Ctx) -> Result<Vec<String>> {
        let known = KnownPeers::load(&self.home)?;
        let current = *self.tx.borrow();
        let holders = holders(&self.holders_path())?;
        let Some(r) = rotation(
            current,
            &holders,
            |h| known.lookup(h).is_some(),
            draw_key()?,
        ) else {
            return Ok(Vec::new());
        };
        let (old, k) = (current.key, r.keys.key);
        let path = key_path(&self.home, &self.prefix, &self.driver);
        write_private(&path, &k)
            .with_context(|| format!("cannot write the rotated group key {}", path.display()))?;
        write_private(&self.holders_path(), b"")?;
        ctx.gate.begin();
        self.tx.send_replace(r.keys);
        if !ctx.gate.wait().await {
            tracing::warn!(
                side = "device",
                "the reliable streams did not settle within {} s of the rotation: device frames published just before it may not reach the app sides",
                GATE_WAIT.as_secs()
            );
        }
        let since = match &self.js {
            None => Ok(0),
            Some(js) => stored_up_to(ctx, js).await.map(|(_, n)| n),
        };
        let since = since.unwrap_or_else(|e| {
            tracing::warn!(
                side = "device",
                "cannot read where the JetStream stream stands ({e:#}): app → device frames sealed under the old group key and not yet read are dropped"
            );
            0
        });
        let mut previous = old.to_vec();
        previous.extend_from_slice(&since.to_be_bytes());
        if let Some((k, s)) = r.keys.older {
            previous.extend_from_slice(&k);
            previous.extend_from_slice(&s.to_be_bytes());
        }
        if let Err(e) = write_private(
            &previous_path(&self.home, &self.prefix, &self.driver),
            &previous,
        ) {
            tracing::warn!(side = "device", "{e:#}: app → device frames sealed under the old group key and not yet read are dropped if this side restarts");
        }
        self.tx.send_replace(r.keys.since_at(since));
        Ok(r.revoked)
    }

    /// Rotates the key if a holder was revoked, and says so: in the log and, for the app
    /// sides, on `P.D.rekey`.
    async fn check(&self, ctx: &Ctx) -> Result<()> {
        let revoked = self.rotate_if_revoked(ctx).await?;
        if !revoked.is_empty() {
            tracing::warn!(
                side = "device",
                "rotated the group key: {} held it and is no longer trusted; trusted app sides get the new key by joining again",
                revoked.join(", ")
            );
            let run = self.tx.borrow().run.id;
            rekey_notice(ctx, &self.local, run).await;
        }
        Ok(())
    }

    /// Checks every `every` (the first check is the caller's, at start).
    async fn watch(self, ctx: Ctx, every: Duration) -> Result<()> {
        loop {
            tokio::time::sleep(every).await;
            if let Err(e) = self.check(&ctx).await {
                tracing::warn!(
                    side = "device",
                    "cannot check who holds the group key: {e:#}"
                );
            }
        }
    }
}

/// An app side's way to ask for the group key again (after a frame that does not open):
/// answered once it has asked the device.
type Refresh = mpsc::Sender<tokio::sync::oneshot::Sender<()>>;

/// The `encrypt` pair's forward half as one run's sealing half ([`Sender`]).
struct RunSealer(EncryptForward);

impl RunSeal for RunSealer {
    fn under(key: [u8; 32]) -> Result<RunSealer, ndd_core::ModuleError> {
        EncryptForward::new(&Key::given(key), Cipher::Aes256Gcm).map(RunSealer)
    }

    fn seal(
        &mut self,
        frame: Frame,
        wseq: u64,
        out: &mut Output,
    ) -> Result<(), ndd_core::ModuleError> {
        self.0.seal_bound(frame, wseq, out)
    }
}

/// The `encrypt` pair's inverse as one run's receiving half. This side warns about a frame
/// that opens under no key it has (not the half). Every app side feeding an app → device
/// stream seals under its own epoch: the device keeps [`SENDERS`] of them live.
struct RunInverse(EncryptInverse);

impl RunHalf for RunInverse {
    fn under(key: [u8; 32]) -> RunInverse {
        RunInverse(
            EncryptInverse::new(Arc::new(Key::given(key)), Cipher::Aes256Gcm, SEAL_WINDOW)
                .without_auth_warnings()
                .with_live_epochs(SENDERS),
        )
    }

    fn open(
        &mut self,
        now: Instant,
        frame: Frame,
        wseq: u64,
        out: &mut Output,
    ) -> Result<Outcome, ndd_core::ModuleError> {
        Ok(match self.0.open_bound(now, frame, wseq, out)? {
            Opening::Opened => Outcome::Opened,
            Opening::Replayed => Outcome::Replayed,
            Opening::Rejected => Outcome::Rejected,
        })
    }
}

/// The key side of a sink's [`Receiver`] (the rules live there, sans-IO): it hands in the
/// keys as they change, asks the device for the key when the receiver waits for it (an app
/// side), waits for where a rotation began, joins again on a newer run (an app side) and
/// tells the app sides of this run (a device side) when the receiver says so.
struct KeyWatch {
    key: watch::Receiver<GroupKey>,
    refresh: Option<Refresh>,
    /// Device side: rung when a genuine frame of an earlier run is refused (app sides that did
    /// not hear of this run are told to join again).
    stale: Option<Arc<tokio::sync::Notify>>,
}

/// A sink's receiving half.
type SinkReceiver = Receiver<RunInverse, jetstream::Message>;

impl KeyWatch {
    /// The receiver of stream `id` under the keys as they stand.
    fn receiver(&mut self, side: SideName, id: u16, ordered: bool) -> SinkReceiver {
        let k = *self.key.borrow_and_update();
        Receiver::new(id, side == SideName::App, k, ordered, REORDER_WAIT)
    }

    /// Hands the keys to `rx` if they changed.
    fn follow(&mut self, rx: &mut SinkReceiver) {
        if self.key.has_changed().unwrap_or(false) {
            let k = *self.key.borrow_and_update();
            rx.handle_keys(Instant::now(), k);
        }
    }

    /// Brings what `rx` waits for; `false` once the keys are gone (the side stops). An error
    /// names a record that did not open (dropped).
    async fn bring(
        &mut self,
        rx: &mut SinkReceiver,
        wait: Wait,
    ) -> Result<bool, ndd_core::ModuleError> {
        match wait {
            Wait::Rotation => {
                // Mid-rotation: where it began decides; it comes in a moment.
                let Ok(k) = self.key.wait_for(|k| k.since != SINCE_PENDING).await else {
                    return Ok(false);
                };
                let k = *k;
                rx.handle_keys(Instant::now(), k);
            }
            Wait::Key => {
                if let Some(r) = &self.refresh {
                    let (tx, rx) = tokio::sync::oneshot::channel();
                    if r.send(tx).await.is_ok() {
                        let _ = rx.await;
                    }
                }
                self.follow(rx);
                rx.asked(Instant::now())?;
            }
        }
        Ok(true)
    }

    /// A newer run opened (an app side joins again to learn it, so what it sends follows,
    /// without waiting), or a genuine frame of an earlier run came (a device side tells the
    /// app sides).
    fn said(&self, e: &Event) {
        match e {
            Event::NewerRun => {
                if let Some(r) = &self.refresh {
                    let (tx, _) = tokio::sync::oneshot::channel();
                    let _ = r.try_send(tx);
                }
            }
            Event::TellRun => {
                if let Some(n) = &self.stale {
                    n.notify_one();
                }
            }
            _ => {}
        }
    }
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
    let h = ndd_wire::param_hash(fingerprint);
    format!("a{h:016x}")
}

/// What a stream is on the NATS link.
#[derive(Debug, Clone)]
struct Plan {
    index: usize,
    id: u16,
    name: String,
    reliable: bool,
    /// This side runs the stream's source.
    source: bool,
    /// `split` pieces per frame, if the stream splits.
    split: Option<u16>,
    /// The stream goes round-robin.
    round_robin: bool,
    /// A picture in broadcast (`image` with `keyframe_ms`): an app side that comes back
    /// starts at what is stored after it joined (from its next keyframe: the screen now), not
    /// where it stopped (a replay of everything it missed, older runs of the device included).
    now_only: bool,
}

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

fn user_stack(cfg: &Config, plan: &Plan, role: Role) -> Result<Stack> {
    let pairs: Vec<&dyn Pair> = cfg.streams[plan.index]
        .pairs()
        .into_iter()
        .map(|m| m as &dyn Pair)
        .collect();
    Stack::build(role, &plan.name, &pairs).map_err(|e| anyhow!("{e}"))
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
    // Live lines name the app side (many run at once): `[app 7M2Xq3J5]`.
    let label = match side {
        SideName::Device => "device".to_string(),
        SideName::App => format!(
            "app {}",
            local
                .fingerprint()
                .trim_start_matches("SHA256:")
                .chars()
                .take(8)
                .collect::<String>()
        ),
    };
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
    };
    let mut tasks: JoinSet<Result<Option<(String, ndd_endpoint::CheckReport)>>> = JoinSet::new();
    // The source endpoints' tasks: stopping them ends their streams cleanly (flushed, END).
    let mut endpoints: Vec<tokio::task::AbortHandle> = Vec::new();
    // Tasks that serve as long as the side runs (the device's join service and key keeper,
    // the app side's key follower and ready heartbeat) run among the stream tasks.
    let mut services = 0usize;
    // Turns true when this side stops: sink streams hand over what they hold and end, so
    // their sinks finish (and `check` sinks report).
    let (finish_tx, finish_rx) = watch::channel(false);
    let peer;
    match side {
        SideName::Device => {
            // The JetStream stream exists before any app side can join (they read where it
            // stands when they join), and before a rotation notes where it stands.
            let js = if plans.iter().any(|p| p.reliable) {
                Some(ensure_jetstream(&ctx, nats).await?)
            } else {
                None
            };
            // This run begins after what the stream holds now: earlier runs' frames stored
            // later are replays (`ndd_link::nats::runs`).
            let began = match &js {
                Some(js) => stored_up_to(&ctx, js).await?.1,
                None => 0,
            };
            let (run, earlier) = new_run(&opts.home, &nats.subject_prefix, &cfg.driver, began)?;
            let (key_tx, key) = watch::channel(group_key(
                &opts.home,
                &nats.subject_prefix,
                &cfg.driver,
                run,
                earlier,
            )?);
            let keeper = KeyKeeper {
                local: local.clone(),
                home: opts.home.clone(),
                prefix: nats.subject_prefix.clone(),
                driver: cfg.driver.clone(),
                tx: key_tx,
                js: js.clone(),
            };
            // An app side revoked while this side was away never sees a frame under its key.
            keeper.check(&ctx).await?;
            let holders = keeper.holders_path();
            let every = Duration::from_millis(cfg.link.ping_interval_ms.clamp(100, 2000));
            let kctx = ctx.clone();
            tasks.spawn(async move {
                keeper.watch(kctx, every).await?;
                Ok(None)
            });
            claim_device(&ctx, &cfg.driver, run.id, &local, &opts.home).await?;
            let slots = plans.iter().filter_map(|p| p.split).max().unwrap_or(0);
            let (joined, mut joined_rx) = watch::channel(std::collections::HashSet::new());
            let admitter: Shared<Admitter> = Arc::new(Mutex::new(Admitter::new(
                cfg.hello(side),
                &local.fingerprint(),
                &opts.home.display().to_string(),
                slots,
                Duration::from_millis(cfg.link.keepalive_timeout_ms),
                ctx.quiet,
            )));
            serve_ready(&ctx, key.clone(), joined, admitter.clone()).await?;
            let host = JoinService {
                admitter,
                ctx: ctx.clone(),
                local: local.clone(),
                home: opts.home.clone(),
                key: key.clone(),
                holders,
                expiry: Duration::from_millis(cfg.link.handshake_timeout_ms.max(1000) * 2),
            };
            let joins = host.serve().await?;
            tasks.spawn(async move {
                joins.await.map_err(|e| anyhow!("join service: {e}"))??;
                Ok(None)
            });
            let (actx, stale) = (ctx.clone(), ctx.run_stale.clone());
            tasks.spawn(async move {
                announce_run(actx, local, run.id, stale).await;
                Ok(None)
            });
            services += 3;
            // Sinks at once (what app sides send, and sent while this side was away, comes
            // in now); sources once enough app sides are there to get their frames.
            let want = nats.min_app_sides as usize;
            for sources in [false, true] {
                if sources && want > 0 && plans.iter().any(|p| p.source) {
                    if !quiet {
                        tracing::info!(side = %side, "waiting for {want} app side(s) to join before starting the sources");
                    }
                    let enough = joined_rx.wait_for(|j| j.len() >= want);
                    tokio::select! {
                        r = enough => { r.map_err(|_| anyhow!("the join service stopped"))?; }
                        _ = stop.changed() => bail!("stopped while waiting for {want} app side(s) to join"),
                        _ = sleep_until_opt(deadline) => bail!("fewer than {want} app side(s) joined within --duration"),
                    }
                }
                for p in plans.iter().filter(|p| p.source == sources) {
                    endpoints.extend(
                        spawn_stream(
                            cfg,
                            &ctx,
                            p,
                            &key,
                            None,
                            js.clone(),
                            None,
                            opts.once,
                            &finish_rx,
                            &stats,
                            &mut tasks,
                        )
                        .await?,
                    );
                }
            }
            peer = format!("NATS {}", nats.servers.join(","));
            if !quiet {
                tracing::info!(side = %side, join = %ctx.subjects.join(), "serving app sides through NATS");
            }
        }
        SideName::App => {
            let hello = OwnedMessage::Hello(cfg.hello(side))
                .as_message()
                .emit_to_vec()
                .context("encoding HELLO")?;
            let js = if plans.iter().any(|p| p.reliable) {
                Some(jetstream::new(client.clone()))
            } else {
                None
            };
            let (admission, device, start) = tokio::select! {
                a = join(&ctx, &local, &hello, &opts, cfg, js.as_ref()) => a?,
                _ = stop.changed() => bail!("stopped before the device side admitted this side"),
            };
            if !quiet {
                let slot = admission
                    .slot
                    .map(|s| format!(", split slot {s}"))
                    .unwrap_or_default();
                tracing::info!(side = %side, "joined device {device} through NATS{slot}; streams agreed");
            }
            let me = short_id(&local.fingerprint());
            // The device may rotate the group key: follow it (joining again when told, or
            // when a frame does not open).
            let (key_tx, key) = watch::channel(admission.keys());
            let (refresh, asks) = mpsc::channel(16);
            let follower = KeyFollower {
                ctx: ctx.clone(),
                local: local.clone(),
                hello: hello.clone(),
                home: opts.home.clone(),
                per_try: Duration::from_millis(cfg.link.handshake_timeout_ms),
                key: key_tx,
                slot: admission.slot,
            };
            let notices = follower.subscribe().await?;
            tasks.spawn(async move {
                follower.serve(notices, asks).await?;
                Ok(None)
            });
            for p in &plans {
                endpoints.extend(
                    spawn_stream(
                        cfg,
                        &ctx,
                        p,
                        &key,
                        Some(&refresh),
                        js.clone(),
                        Some((&admission, me.as_str(), start)),
                        opts.once,
                        &finish_rx,
                        &stats,
                        &mut tasks,
                    )
                    .await?,
                );
            }
            // Every subscription is in place at the server: tell the device, and keep telling
            // it (a device that restarts learns who is there).
            client.flush().await.map_err(|e| anyhow!("NATS: {e}"))?;
            let fp = local.fingerprint();
            let ready = ready_message(&key.borrow(), &fp)?;
            client
                .publish(ctx.subjects.ready(), ready)
                .await
                .map_err(|e| anyhow!("NATS: {e}"))?;
            let (c, subject) = (client.clone(), ctx.subjects.ready());
            let every = Duration::from_millis(cfg.link.ping_interval_ms.max(100));
            tasks.spawn(async move {
                let mut tick = tokio::time::interval(every);
                tick.tick().await;
                loop {
                    tick.tick().await;
                    // Sealed under the key as it stands (the device may have rotated it).
                    let ready = ready_message(&key.borrow(), &fp)?;
                    let _ = c.publish(subject.clone(), ready).await;
                }
            });
            services += 2;
            peer = device;
        }
    }

    // Live stats and the stop conditions.
    let mut checks = Vec::new();
    let tick = opts.live_stats.unwrap_or(Duration::from_secs(3600));
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
    let drain = async {
        while tasks.len() > services {
            match tasks.join_next().await {
                Some(Ok(Ok(Some(c)))) => checks.push(c),
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
    Ok(RunReport {
        streams: stats.iter().map(|s| lock(s).summary()).collect(),
        checks,
        peer,
        clock_offset: None,
        recoveries: Vec::new(),
        link_drops: None,
    })
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
    /// Device side: rung when a frame sealed for an earlier run comes in ([`announce_run`]).
    run_stale: Arc<tokio::sync::Notify>,
    /// Device side: a rotation waits for the reliable publishers ([`RotationGate`]).
    gate: Arc<RotationGate>,
}

/// Device side: how a rotation knows that nothing this side sealed under the old key is still
/// on its way to JetStream. It reads where the stream stands (the rotation's `since`) only
/// once every publisher of a reliable stream has had each publish under the old key
/// acknowledged, so every device frame under the old key is stored at or before `since`. An
/// app side drops a frame under the old key stored later (the revoked side holds that key):
/// before this, a frame the device published just before a rotation and stored just after it
/// was dropped by every app side, and an ordered stream could not take its copy sealed again
/// (its later frames were through already). Found by `testkit/tests/nats_keys.rs`.
#[derive(Default)]
struct RotationGate {
    /// Publishers of reliable streams on this side.
    publishers: std::sync::atomic::AtomicUsize,
    /// Of them, those settled under the old key since the rotation began.
    settled: std::sync::atomic::AtomicUsize,
    changed: tokio::sync::Notify,
}

/// How long a rotation waits for the reliable publishers to settle before it reads where the
/// stream stands anyway (a publisher whose acknowledgements do not come: the server is gone).
const GATE_WAIT: Duration = Duration::from_secs(10);

impl RotationGate {
    fn join(self: &Arc<Self>) -> GateTicket {
        self.publishers
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        GateTicket(self.clone())
    }

    fn settled(&self) {
        self.settled
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    /// A rotation begins: the count starts over.
    fn begin(&self) {
        self.settled.store(0, std::sync::atomic::Ordering::SeqCst);
    }

    /// Waits until every reliable publisher settled, at most [`GATE_WAIT`]; whether they did.
    async fn wait(&self) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        let deadline = tokio::time::Instant::now() + GATE_WAIT;
        loop {
            let changed = self.changed.notified();
            if self.settled.load(SeqCst) >= self.publishers.load(SeqCst) {
                return true;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return false;
            }
        }
    }
}

/// A reliable publisher's place in the [`RotationGate`], given back when it ends.
struct GateTicket(Arc<RotationGate>);

impl Drop for GateTicket {
    fn drop(&mut self) {
        self.0
            .publishers
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        self.0.changed.notify_waiters();
    }
}

/// The JetStream stream of the driver's reliable streams, with the copies and room the
/// config asks for (an existing stream is changed to them). In a cluster that has just
/// started or lost a node, JetStream answers "temporarily unavailable" (or not at all) until
/// its leaders are elected: that is waited out for up to `JS_READY_WAIT`.
async fn ensure_jetstream(ctx: &Ctx, nats: &NatsConfig) -> Result<jetstream::Context> {
    let js = jetstream::new(ctx.client.clone());
    let name = ctx.subjects.jetstream();
    let config = jetstream::stream::Config {
        name: name.clone(),
        subjects: vec![ctx.subjects.jetstream_subjects()],
        storage: jetstream::stream::StorageType::File,
        max_bytes: i64::try_from(nats.store_mib.saturating_mul(1 << 20)).unwrap_or(i64::MAX),
        discard: jetstream::stream::DiscardPolicy::Old,
        duplicate_window: JS_DUPLICATE_WINDOW,
        num_replicas: usize::from(nats.replicas),
        ..Default::default()
    };
    let give_up = Instant::now() + JS_READY_WAIT;
    loop {
        let attempt = async {
            match js.get_stream(&name).await {
                Ok(mut s) => {
                    let have = s.info().await.map_err(|e| e.to_string())?.config.clone();
                    if have.num_replicas != config.num_replicas
                        || have.max_bytes != config.max_bytes
                    {
                        tracing::info!(
                            stream = %name,
                            replicas = config.num_replicas,
                            was = have.num_replicas,
                            "changing the JetStream stream's replicas and room to the config's"
                        );
                        js.update_stream(&config).await.map_err(|e| e.to_string())?;
                    }
                    Ok(())
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        jetstream::context::GetStreamErrorKind::JetStream(_)
                    ) && e.to_string().contains("not found") =>
                {
                    js.create_stream(config.clone())
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                }
                Err(e) => Err(e.to_string()),
            }
        }
        .await;
        let e = match attempt {
            Ok(()) => return Ok(js),
            Err(e) => e,
        };
        // A cluster electing its leaders; anything else does not fix itself.
        let passing = e.contains("temporarily unavailable")
            || e.contains("timed out")
            || e.contains("no responders")
            || e.contains("insufficient resources") && nats.replicas > 1;
        if !passing || Instant::now() >= give_up {
            let replicas = e.contains("insufficient resources") || e.contains("replicas");
            let hint = if e.contains("insufficient storage") {
                format!(
                    "the server has less JetStream room left than link.nats.store_mib = {} reserves (its other streams hold the rest, and it offers at most 75% of its free disk by default): lower store_mib, delete streams no driver uses (nats stream rm), or raise the server's jetstream max_file_store",
                    nats.store_mib
                )
            } else if replicas && nats.replicas > 1 {
                format!(
                    "link.nats.replicas = {} needs a JetStream cluster of at least that many servers; one server keeps one copy: replicas = 1",
                    nats.replicas
                )
            } else {
                "reliable streams need JetStream: start nats-server with -js, or set reliability = \"lossy\"".into()
            };
            return Err(anyhow!("JetStream stream {name}: {e} ({hint})"));
        }
        tracing::debug!(stream = %name, error = %e, "JetStream not ready yet");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// An app side's READY: its fingerprint in a frame sealed under the run key (a READY
/// recorded in an earlier device run does not open in a later one).
fn ready_message(key: &GroupKey, fingerprint: &str) -> Result<Bytes> {
    let mut seal = EncryptForward::new(&Key::given(key.run_key()), Cipher::Aes256Gcm)?;
    let mut out = Output::new();
    let meta = Meta {
        stream: 0,
        seq: 0,
        timestamp_ns: wall_ns(),
        flags: 0,
    };
    seal.handle_frame(
        Instant::now(),
        Frame::new(meta, fingerprint.as_bytes()),
        &mut out,
    )?;
    out.take_frames()
        .pop()
        .map(|f| ndd_link::nats::outbox::record(f, key.run, 0))
        .ok_or_else(|| anyhow!("encrypt made no frame"))
}

/// Counts the app sides that said they are ready (a frame sealed under the group key
/// carrying their fingerprint: nobody else can make one).
/// The driver's JetStream stream and the sequence of the last message it holds.
async fn stored_up_to(
    ctx: &Ctx,
    js: &jetstream::Context,
) -> Result<(jetstream::stream::Stream, u64)> {
    let name = ctx.subjects.jetstream();
    let stream = js
        .get_stream(&name)
        .await
        .map_err(|e| anyhow!("JetStream stream {name}: {e}"))?;
    let last = stream
        .get_info()
        .await
        .map_err(|e| anyhow!("JetStream stream {name}: {e}"))?
        .state
        .last_sequence;
    Ok((stream, last))
}

/// Makes sure no other device side serves the driver on this server, then answers for this
/// one (run `run`) as long as the side runs. Two device sides on one driver would both
/// publish on its subjects: every app side would get two interleaved runs (found by hand: a
/// device side started twice went unnoticed, and the app sides' pairs restarted at every
/// frame). Two that start within the same few milliseconds are not caught.
///
/// Answers are signed notes (`device_claim_label`): only one signed by this install or by a
/// peer in `known_peers` counts. Anyone who may publish on the server could answer otherwise
/// and keep every device side from starting (found by hostile testing: a fake answer stopped a
/// device side, its text, escape codes included, printed raw). Every answer within the wait
/// is read, so a fast forged one cannot hide a real one.
async fn claim_device(
    ctx: &Ctx,
    driver: &str,
    run: u64,
    local: &LocalIdentity,
    home: &std::path::Path,
) -> Result<()> {
    let subject = ctx.subjects.device();
    let label = device_claim_label(&ctx.subjects);
    let mut ignored = ndd_core::RateLimit::with_burst(Duration::from_secs(10), 1);
    // One that was just told to stop answers until it is gone: it gets a few seconds.
    let give_up = Instant::now() + Duration::from_secs(5);
    loop {
        let inbox = ctx.client.new_inbox();
        let mut answers = ctx
            .client
            .subscribe(inbox.clone())
            .await
            .map_err(|e| anyhow!("cannot subscribe to {inbox}: {e}"))?;
        ctx.client
            .publish_with_reply(subject.clone(), inbox, Bytes::new())
            .await
            .map_err(|e| anyhow!("cannot ask on {subject}: {e}"))?;
        let _ = ctx.client.flush().await;
        let until = tokio::time::Instant::now() + Duration::from_millis(500);
        let mut serving = None;
        while let Ok(Some(m)) = tokio::time::timeout_at(until, answers.next()).await {
            // The server's own status (503, no responders: nobody serves the driver yet) is
            // no answer; warned about as a malformed claim before, by a cluster's servers.
            if m.status.is_some() {
                continue;
            }
            match check_claim(&m.payload, &label, local, home) {
                Ok(who) => serving = Some(who),
                Err(why) => {
                    if let Some(suppressed) = ignored.admit(Instant::now()) {
                        tracing::warn!(
                            side = "device",
                            suppressed,
                            "ignored an answer on {subject}: {why}"
                        );
                    }
                }
            }
        }
        match serving {
            Some(who) if Instant::now() >= give_up => bail!(
                "another device side is already serving driver \"{driver}\" through this \
                 NATS server ({who}); stop it first, or give this one another driver name \
                 or link.nats.subject_prefix"
            ),
            Some(_) => tokio::time::sleep(Duration::from_millis(250)).await,
            // Nobody trusted answers: this side is the only one.
            None => break,
        }
    }
    let mut sub = ctx
        .client
        .subscribe(subject.clone())
        .await
        .map_err(|e| anyhow!("cannot subscribe to {subject}: {e}"))?;
    let client = ctx.client.clone();
    let me = format!(
        "run {run:016x}, process {} on {}",
        std::process::id(),
        hostname()
    );
    let note = local
        .sign_note(&label, me.as_bytes())
        .map_err(|e| anyhow!("cannot sign this side's claim on {subject}: {e}"))?;
    tokio::spawn(async move {
        while let Some(m) = sub.next().await {
            if let Some(reply) = m.reply {
                let _ = client.publish(reply, Bytes::from(note.clone())).await;
            }
        }
    });
    Ok(())
}

/// What a device side's claim on `P.D.device` is signed over besides its body: the kind of
/// note and the driver's subjects.
fn device_claim_label(subjects: &Subjects) -> Vec<u8> {
    format!("ndd nats device claim v1 {}", subjects.device()).into_bytes()
}

/// Who serves the driver, from a signed claim by this install or a known peer (its text
/// escaped and bounded); or why the answer does not count.
fn check_claim(
    note: &[u8],
    label: &[u8],
    local: &LocalIdentity,
    home: &std::path::Path,
) -> std::result::Result<String, String> {
    let shown = |b: &[u8]| ndd_wire::text::printable_bytes(b, 80);
    let (body, fp) = ndd_link::seal::open_note(note, label)
        .map_err(|e| format!("not a signed claim of a device side ({e}): {}", shown(note)))?;
    let known =
        fp == local.fingerprint() || KnownPeers::load(home).is_ok_and(|k| k.lookup(&fp).is_some());
    if !known {
        return Err(format!(
            "signed by {fp}, which is neither this install nor in known_peers"
        ));
    }
    Ok(ndd_wire::text::printable_bytes(
        body,
        ndd_wire::text::MAX_SHOWN,
    ))
}

/// This machine's name, for messages (`?` if unknown).
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

async fn serve_ready(
    ctx: &Ctx,
    mut key: watch::Receiver<GroupKey>,
    joined: watch::Sender<std::collections::HashSet<String>>,
    admitter: Shared<Admitter>,
) -> Result<()> {
    let subject = ctx.subjects.ready();
    let mut sub = ctx
        .client
        .subscribe(subject.clone())
        .await
        .map_err(|e| anyhow!("cannot subscribe to {subject}: {e}"))?;
    // A ready that does not open (an app side still under the key before a rotation or of an
    // earlier run, or anyone publishing there) is ignored without a word.
    let inverse = |k: &GroupKey| {
        EncryptInverse::new(
            Arc::new(Key::given(k.run_key())),
            Cipher::Aes256Gcm,
            SEAL_WINDOW,
        )
        .without_auth_warnings()
    };
    let mut open = inverse(&key.borrow_and_update());
    tokio::spawn(async move {
        let mut out = Output::new();
        while let Some(m) = sub.next().await {
            if key.has_changed().unwrap_or(false) {
                open = inverse(&key.borrow_and_update());
            }
            let Some(rec) = FrameRecord::parse(&m.payload) else {
                continue;
            };
            let meta = Meta {
                stream: rec.stream,
                seq: rec.seq,
                timestamp_ns: rec.timestamp_ns,
                flags: rec.flags,
            };
            if open
                .handle_frame(
                    Instant::now(),
                    Frame::from_bytes(meta, rec.payload),
                    &mut out,
                )
                .is_err()
            {
                continue;
            }
            for f in out.take_frames() {
                let fp = String::from_utf8_lossy(f.payload()).into_owned();
                lock(&admitter).handle_ready(Instant::now(), &fp);
                joined.send_if_modified(|j| j.insert(fp));
            }
        }
    });
    Ok(())
}

/// The device's join service: the key exchange ([`Host`]) and the admission rules
/// ([`Admitter`]) driven on `P.D.join`; who is handed the key is written to `holders`.
struct JoinService {
    ctx: Ctx,
    local: LocalIdentity,
    home: std::path::PathBuf,
    /// The group key as it stands (rotated by [`KeyKeeper`]).
    key: watch::Receiver<GroupKey>,
    /// Who was handed it.
    holders: std::path::PathBuf,
    /// Shared with the ready heartbeats ([`serve_ready`]).
    admitter: Shared<Admitter>,
    expiry: Duration,
}

impl JoinService {
    async fn serve(mut self) -> Result<tokio::task::JoinHandle<Result<()>>> {
        let subject = self.ctx.subjects.join();
        let mut sub = self
            .ctx
            .client
            .subscribe(subject.clone())
            .await
            .map_err(|e| anyhow!("cannot subscribe to {subject}: {e}"))?;
        Ok(tokio::spawn(async move {
            let mut host = Host::new(self.expiry);
            let mut logs = ndd_core::RateLimit::with_burst(Duration::from_secs(1), 5);
            while let Some(m) = sub.next().await {
                let Some(reply) = m.reply.clone() else {
                    continue;
                };
                // Mid-rotation: an app side learns the new key with where it began.
                let _ = self.key.wait_for(|k| k.since != SINCE_PENDING).await;
                let answer = self.answer(&mut host, &m.payload, Instant::now());
                match answer {
                    Ok(a) => {
                        let _ = self.ctx.client.publish(reply, a.into()).await;
                    }
                    Err(e) => {
                        if let Some(n) = logs.admit(Instant::now()) {
                            let more = if n > 0 {
                                format!(" ({n} more like it not shown)")
                            } else {
                                String::new()
                            };
                            tracing::warn!(side = "device", "rejected a join request: {e}{more}");
                        }
                    }
                }
            }
            Ok(())
        }))
    }

    /// The answer to the join message `msg`, taken at `now`.
    fn answer(&mut self, host: &mut Host, msg: &[u8], now: Instant) -> Result<Vec<u8>> {
        match ndd_link::nats::join::message_type(msg) {
            Some(1) => Ok(host.handle_init(now, &self.local, msg)?),
            Some(3) => {
                let f = host.handle_finish(now, msg)?;
                let welcome = self.decide(&f.peer_fingerprint, &f.hello, now);
                Ok(f.welcome(&welcome)?)
            }
            _ => bail!("not a join message"),
        }
    }

    fn decide(&mut self, fp: &str, hello: &[u8], now: Instant) -> Welcome {
        let trust = match KnownPeers::load(&self.home) {
            Ok(k) => match k.lookup(fp) {
                Some(t) => Trust::Trusted(t.name.clone().unwrap_or_else(|| fp.to_string())),
                None => Trust::Untrusted,
            },
            Err(e) => Trust::Unreadable(format!("{e:#}")),
        };
        let decision = {
            let mut a = lock(&self.admitter);
            let d = a.decide(now, fp, trust, hello);
            while let Some(l) = a.poll_line() {
                log_admission(&l);
            }
            d
        };
        let slot = match decision {
            Decision::Admitted { slot } => slot,
            Decision::Refused { code, reason } => {
                return Welcome::Refused {
                    code: code.to_u16(),
                    reason,
                }
            }
        };
        if let Err(e) = add_holder(&self.holders, fp) {
            tracing::warn!(
                side = "device",
                "refused app side {fp}: cannot note who holds the group key: {e:#}"
            );
            return Welcome::Refused {
                code: CloseCode::InternalError.to_u16(),
                reason: format!("the device side cannot note who holds its group key: {e:#}"),
            };
        }
        Welcome::Admitted(Admission::of(&self.key.borrow(), slot))
    }
}

/// A line of the admission rules in the device's log.
fn log_admission(l: &AdmitLine) {
    let s = l.suppressed;
    match l.level {
        Level::Warn if s > 0 => tracing::warn!(side = "device", suppressed = s, "{}", l.text),
        Level::Warn => tracing::warn!(side = "device", "{}", l.text),
        Level::Info => tracing::info!(side = "device", "{}", l.text),
        Level::Debug => tracing::debug!(side = "device", "{}", l.text),
    }
}

/// The app side's join: retried while no device answers (unless `--once` and the connect
/// timeout passed); a refusal or an untrusted device ends it.
async fn join(
    ctx: &Ctx,
    local: &LocalIdentity,
    hello: &[u8],
    opts: &RunOptions,
    cfg: &Config,
    js: Option<&jetstream::Context>,
) -> Result<(Admission, String, u64)> {
    let started = Instant::now();
    let give_up = Duration::from_millis(cfg.link.connect_timeout_ms);
    let per_try = Duration::from_millis(cfg.link.handshake_timeout_ms);
    let subject = ctx.subjects.join();
    let mut backoff = Duration::from_millis(100);
    let mut said = false;
    loop {
        let attempt = join_once(ctx, local, hello, &opts.home, js, per_try);
        match attempt.await {
            Ok(final_answer) => return final_answer,
            Err(e) => {
                if opts.once && started.elapsed() >= give_up {
                    return Err(e.context(format!(
                        "no device side answered on {subject} within {:.1} s",
                        give_up.as_secs_f64()
                    )));
                }
                if !said && !ctx.quiet {
                    tracing::info!(
                        side = "app",
                        "waiting for the device side on {subject}: {e:#}"
                    );
                    said = true;
                }
                tokio::time::sleep(backoff).await;
                backoff =
                    (backoff * 2).min(Duration::from_millis(cfg.link.max_backoff_ms.max(100)));
            }
        }
    }
}

/// One join: `Err` when it could not be done (nobody answered, the server), `Ok(Err)` when
/// the device side refused this side or is not trusted here (final), `Ok(Ok)` admitted:
/// the admission, the device's name, and (with `js`) where its stored streams stood.
async fn join_once(
    ctx: &Ctx,
    local: &LocalIdentity,
    hello: &[u8],
    home: &Path,
    js: Option<&jetstream::Context>,
    per_try: Duration,
) -> Result<Result<(Admission, String, u64)>> {
    let subject = ctx.subjects.join();
    let mut j = Joiner::new()?;
    let reply = request(ctx, &subject, j.init(), per_try).await?;
    let (fp, finish) = j.handle_reply(local, &reply, hello)?;
    let known = KnownPeers::load(home)?;
    let Some(t) = known.lookup(&fp) else {
        return Ok(Err(anyhow!(
            "refused untrusted device side with fingerprint {fp} (answering on {subject}); if you trust it, run: ndd trust {fp} --home {}",
            home.display()
        )));
    };
    let name = t.name.clone().unwrap_or(fp);
    // Where the device's stored streams stand before it admits us: everything after this
    // is ours.
    let start = match js {
        Some(js) => stored_up_to(ctx, js).await?.1 + 1,
        None => 1,
    };
    let welcome = request(ctx, &subject, finish, per_try).await?;
    Ok(match j.handle_welcome(&welcome)? {
        Welcome::Admitted(a) => Ok((a, name, start)),
        Welcome::Refused { reason, .. } => {
            Err(anyhow!("the device side refused this side: {reason}"))
        }
    })
}

/// An app side's follower of the group key: joins again when the device says it rotated
/// the key (`P.D.rekey`) or a stream asks (a frame that does not open), at most every
/// [`REJOIN_SPACING`]. A refusal (this side is no longer trusted) ends the app side.
struct KeyFollower {
    ctx: Ctx,
    local: LocalIdentity,
    hello: Vec<u8>,
    home: std::path::PathBuf,
    per_try: Duration,
    key: watch::Sender<GroupKey>,
    /// The split slot this side reads (its first join's).
    slot: Option<u16>,
}

/// Joins for a new group key come at least this far apart.
const REJOIN_SPACING: Duration = Duration::from_millis(250);

impl KeyFollower {
    /// A rekey notice worth a join: signed by a device side in `known_peers`, for this
    /// driver, newer than the last one taken. Its time, or why not.
    fn check_notice(
        &self,
        note: &[u8],
        label: &[u8],
        newest: Option<(u64, u64)>,
    ) -> Result<(u64, u64), String> {
        let (body, fp) = ndd_link::seal::open_note(note, label)
            .map_err(|e| format!("not a signed notice of this driver ({e})"))?;
        let known = KnownPeers::load(&self.home).map_err(|e| format!("{e:#}"))?;
        if known.lookup(&fp).is_none() {
            return Err(format!("signed by {fp}, which is not in known_peers"));
        }
        let at = body
            .strip_prefix(b"rekey")
            .and_then(|t| <[u8; 16]>::try_from(t).ok())
            .map(|t| {
                let (run, at) = t.split_at(8);
                let n = |b: &[u8]| u64::from_be_bytes(b.try_into().unwrap_or_default());
                (n(run), n(at))
            })
            .ok_or_else(|| "its body is not a rekey notice".to_string())?;
        if newest.is_some_and(|n| at <= n) {
            return Err("not newer than the last one (a replay)".into());
        }
        Ok(at)
    }

    async fn subscribe(&self) -> Result<async_nats::Subscriber> {
        let subject = self.ctx.subjects.rekey();
        self.ctx
            .client
            .subscribe(subject.clone())
            .await
            .map_err(|e| anyhow!("cannot subscribe to {subject}: {e}"))
    }

    async fn serve(
        self,
        mut notices: async_nats::Subscriber,
        mut asks: mpsc::Receiver<tokio::sync::oneshot::Sender<()>>,
    ) -> Result<()> {
        let mut last: Option<Instant> = None;
        // No stream may ask (a side without sink streams): then notices alone.
        let mut asking = true;
        // The newest rekey notice taken (the device run, then its clock).
        let mut newest: Option<(u64, u64)> = None;
        let label = rekey_label(&self.ctx.subjects);
        let mut ignored = ndd_core::RateLimit::with_burst(Duration::from_secs(10), 1);
        loop {
            let mut waiting = Vec::new();
            tokio::select! {
                a = asks.recv(), if asking => match a {
                    Some(a) => waiting.push(a),
                    None => {
                        asking = false;
                        continue;
                    }
                },
                n = notices.next() => match n {
                    None => return Ok(()),
                    Some(m) => match self.check_notice(&m.payload, &label, newest) {
                        Ok(at) => newest = Some(at),
                        Err(why) => {
                            if let Some(more) = ignored.admit(Instant::now()) {
                                let more = match more {
                                    0 => String::new(),
                                    n => format!(" ({n} more since the last warning)"),
                                };
                                tracing::warn!(side = "app", "ignored a rekey notice: {why}{more}");
                            }
                            continue;
                        }
                    },
                },
            }
            if let Some(t) = last {
                tokio::time::sleep_until((t + REJOIN_SPACING).into()).await;
            }
            // Everyone who asked meanwhile gets this join's answer.
            while let Ok(a) = asks.try_recv() {
                waiting.push(a);
            }
            last = Some(Instant::now());
            match join_once(
                &self.ctx,
                &self.local,
                &self.hello,
                &self.home,
                None,
                self.per_try,
            )
            .await
            {
                Ok(Ok((a, _, _))) => {
                    if a.slot != self.slot {
                        // Silent for longer than the device's keepalive timeout, it lost its
                        // slot to another side; reading the old one would share it.
                        bail!(
                            "the device side gave this side's split slot ({:?}) to another app side while this one was silent and now hands it slot {:?}; start this side again",
                            self.slot,
                            a.slot
                        );
                    }
                    let mut said = (false, false);
                    self.key.send_if_modified(|k| {
                        let rotated = k.key != a.group_key;
                        // A join never takes an app side back to an earlier run.
                        let restarted = a.run > k.run.id;
                        *k = GroupKey {
                            run: if restarted { a.device_run() } else { k.run },
                            ..a.keys()
                        };
                        said = (rotated, restarted);
                        rotated || restarted
                    });
                    if said.0 && !self.ctx.quiet {
                        tracing::info!(
                            side = "app",
                            "the device side rotated its group key; this side has the new one"
                        );
                    }
                    if said.1 && !self.ctx.quiet {
                        tracing::info!(
                            side = "app",
                            run = format_args!("{:016x}", a.run),
                            "the device side restarted; this side seals for its new run"
                        );
                    }
                }
                Ok(Err(refused)) => {
                    return Err(refused.context(
                        "the device side changed its group key and no longer admits this side",
                    ))
                }
                Err(e) => tracing::debug!(
                    side = "app",
                    "asking the device side for its group key: {e:#}"
                ),
            }
            for a in waiting {
                let _ = a.send(());
            }
        }
    }
}

async fn request(ctx: &Ctx, subject: &str, body: Vec<u8>, limit: Duration) -> Result<Bytes> {
    let r = tokio::time::timeout(limit, ctx.client.request(subject.to_string(), body.into()))
        .await
        .map_err(|_| anyhow!("no answer within {:.1} s", limit.as_secs_f64()))?;
    match r {
        Ok(m) => Ok(m.payload),
        Err(e) if e.kind() == async_nats::client::RequestErrorKind::NoResponders => {
            bail!("no device side is serving {subject}")
        }
        Err(e) => bail!("join request on {subject}: {e}"),
    }
}

/// Starts one stream's endpoint and its task.
#[allow(clippy::too_many_arguments)]
async fn spawn_stream(
    cfg: &Config,
    ctx: &Ctx,
    plan: &Plan,
    key: &watch::Receiver<GroupKey>,
    refresh: Option<&Refresh>,
    js: Option<jetstream::Context>,
    app: Option<(&Admission, &str, u64)>,
    once: bool,
    finish: &watch::Receiver<bool>,
    stats: &[Shared<StreamStats>],
    tasks: &mut JoinSet<Result<Option<(String, ndd_endpoint::CheckReport)>>>,
) -> Result<Option<tokio::task::AbortHandle>> {
    let s = &cfg.streams[plan.index];
    let stats = stats[plan.index].clone();
    let name = plan.name.clone();
    let (tx, rx) = mpsc::channel::<Frame>(64);
    if plan.source {
        let source = s
            .source
            .spawn_on_demand(plan.id, tx, None)
            .with_context(|| {
                format!(
                    "stream \"{name}\": cannot start source {}",
                    s.source.describe()
                )
            })?;
        let stack = user_stack(cfg, plan, Role::Source)?;
        let mut keys = key.clone();
        let out = Publisher::new(ctx, plan, *keys.borrow_and_update(), js)?;
        let endpoint = source.abort_handle();
        let finish = finish.clone();
        tasks.spawn(async move {
            let mut stack = stack;
            let r = pump_source(rx, finish, &mut stack, keys, out, stats.clone()).await;
            lock(&stats).layers = stack.stats();
            source.abort();
            r.map(|()| None)
        });
        return Ok(Some(endpoint));
    } else {
        let done = Delivered::default();
        let sink = s.sink.spawn_tracked(rx, done.clone()).with_context(|| {
            format!("stream \"{name}\": cannot start sink {}", s.sink.describe())
        })?;
        let stack = user_stack(cfg, plan, Role::Sink)?;
        // For a restarted device side: the same pairs, afresh.
        let rebuild: Rebuild = {
            let pairs: Vec<ModuleConfig> = cfg.streams[plan.index]
                .pairs()
                .into_iter()
                .cloned()
                .collect();
            let name = plan.name.clone();
            Box::new(move || {
                let pairs: Vec<&dyn Pair> = pairs.iter().map(|m| m as &dyn Pair).collect();
                Stack::build(Role::Sink, &name, &pairs).map_err(|e| anyhow!("{e}"))
            })
        };
        let stale = (ctx.side == SideName::Device).then(|| ctx.run_stale.clone());
        let keys = KeyWatch {
            key: key.clone(),
            refresh: refresh.cloned(),
            stale,
        };
        let input = subscribe(ctx, plan, js, app).await?;
        let lossy = !plan.reliable;
        let end_sub = if plan.round_robin && app.is_some() {
            let subject = ctx.subjects.end(plan.id);
            Some(
                ctx.client
                    .subscribe(subject.clone())
                    .await
                    .map_err(|e| anyhow!("cannot subscribe to {subject}: {e}"))?,
            )
        } else {
            None
        };
        let finish = finish.clone();
        let id = plan.id;
        let side = ctx.side;
        let peer = if app.is_some() {
            "the device side's"
        } else {
            "an app side's"
        };
        tasks.spawn(async move {
            let mut stack = stack;
            let r = pump_sink(
                id,
                input,
                end_sub,
                once,
                finish,
                lossy,
                &mut stack,
                rebuild,
                keys,
                side,
                tx,
                done,
                stats.clone(),
                peer,
            )
            .await;
            lock(&stats).layers = stack.stats();
            let report = match sink.await {
                Ok(Ok(rep)) => rep.check.map(|c| (name.clone(), c)),
                Ok(Err(e)) => {
                    return Err(anyhow!(e).context(format!("stream \"{name}\": sink failed")))
                }
                Err(_) => None,
            };
            r?;
            Ok(report)
        });
    }
    Ok(None)
}

/// Bytes of one stream's frames in the NATS client's queue (handed to it, not yet written to
/// its socket), at most. The client queues whatever it is given (8192 messages: 800 MB of
/// 100 KB frames, found by a fan-out run whose device side grew to 1.2 GB and whose frames
/// came 0.1–0.4 s late); past this a reliable stream waits and a lossy one drops the frame.
const QUEUED_BYTES: usize = 4 << 20;

/// One stream's share of the NATS client's queue ([`QUEUED_BYTES`]): a message handed to the
/// client holds permits for its bytes until the client has written it and let it go.
#[derive(Clone)]
struct Budget(Arc<tokio::sync::Semaphore>);

/// A message's bytes and the permits they hold (given back when the client drops them).
struct Held {
    bytes: Bytes,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Held {
    /// `bytes` as shared bytes that hold `permit` until the last copy goes.
    fn wrap(bytes: Bytes, permit: tokio::sync::OwnedSemaphorePermit) -> Bytes {
        Bytes::from_owner(Held {
            bytes,
            _permit: permit,
        })
    }
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Budget {
    fn new() -> Budget {
        Budget(Arc::new(tokio::sync::Semaphore::new(QUEUED_BYTES)))
    }

    fn permits(rec: &Bytes) -> u32 {
        rec.len().clamp(1, QUEUED_BYTES) as u32
    }

    /// `rec` for the client, once there is room for it.
    async fn wrap(&self, rec: Bytes) -> Bytes {
        match self.0.clone().acquire_many_owned(Self::permits(&rec)).await {
            Ok(p) => Held::wrap(rec, p),
            Err(_) => rec,
        }
    }

    /// `rec` for the client if there is room for it now.
    fn try_wrap(&self, rec: Bytes) -> Option<Bytes> {
        self.0
            .clone()
            .try_acquire_many_owned(Self::permits(&rec))
            .ok()
            .map(|p| Held::wrap(rec, p))
    }
}

/// What a stream's [`Outbox`] keeps of an app side's reliable frame before sealing.
type Plain = (Meta, Bytes, Route);

/// A stored publish's outcome: its token and the stream sequence it was stored at.
type AckResult = (u64, Result<u64, ()>);

/// Where a source's frames go: the stream's [`Outbox`] (records, message ids, retries) and
/// the client.
struct Publisher {
    /// This stream's room in the client's queue.
    budget: Budget,
    /// Lossy frames dropped for want of it (the connection to the server is behind).
    dropped: u64,
    /// The stream's END is on its way: it waits for room, never dropped.
    ending: bool,
    ctx: Ctx,
    plan: Plan,
    js: Option<jetstream::Context>,
    /// The sans-IO sending half: sealing, the outbox, following the keys.
    sender: Sender<RunSealer, Plain>,
    /// Acknowledgements as they come (each ack waited for by a task of its own, so a failed
    /// one goes again at once, not after the ones published before it).
    acks_tx: mpsc::UnboundedSender<AckResult>,
    acks_rx: mpsc::UnboundedReceiver<AckResult>,
    /// The connection count when this publisher last looked.
    connects: u64,
    /// Device side, a reliable stream: its place in the rotation's gate.
    gate: Option<GateTicket>,
}

impl Publisher {
    fn new(
        ctx: &Ctx,
        plan: &Plan,
        keys: GroupKey,
        js: Option<jetstream::Context>,
    ) -> Result<Publisher> {
        let js = js.filter(|_| plan.reliable);
        let app = ctx.side == SideName::App;
        // Many app sides publish on one up subject with the device's run id and their own
        // frame numbers: their message ids must differ, or JetStream drops all but the first
        // app side's frame of each number as a duplicate (found by the rotation test: a second
        // app side's frames never reached the device). Both sides keep their reliable frames
        // a while, to seal them again after a rotation (a device side's are all stored before
        // its rotation reads where the stream stands: [`RotationGate`]).
        let sender = Sender::new(
            plan.id,
            keys,
            js.is_some(),
            app.then(random_u64),
            plan.reliable,
        )?;
        let gate = (!app && js.is_some()).then(|| ctx.gate.join());
        let (acks_tx, acks_rx) = mpsc::unbounded_channel();
        Ok(Publisher {
            gate,
            budget: Budget::new(),
            dropped: 0,
            ending: false,
            ctx: ctx.clone(),
            plan: plan.clone(),
            js,
            sender,
            acks_tx,
            acks_rx,
            connects: ctx.connects.load(std::sync::atomic::Ordering::Acquire),
        })
    }

    fn subject(&self, route: Route) -> (String, Option<u16>) {
        let part = match route {
            Route::Part { part, .. } => Some(part),
            Route::All | Route::Any => None,
        };
        let s = if self.plan.source && self.ctx.side == SideName::App {
            if self.js.is_some() {
                self.ctx.subjects.up_stored(self.plan.id)
            } else {
                self.ctx.subjects.up(self.plan.id)
            }
        } else {
            self.ctx
                .subjects
                .down(self.plan.id, self.js.is_some(), part)
        };
        (s, part)
    }

    /// Seals `frame` for `subject` (`part`: its part of a split stream; both from
    /// [`Publisher::subject`], worked out once per frame) and publishes it, kept with `keep`
    /// to be sealed again after a rotation (app side, reliable streams); waits while too many
    /// publishes wait for their acknowledgement. The sealed frame's length.
    async fn publish(
        &mut self,
        frame: Frame,
        subject: &str,
        part: Option<u16>,
        keep: Option<(usize, Plain)>,
    ) -> Result<usize> {
        self.catch_up();
        let (_, len) = self
            .sender
            .send(Instant::now(), subject, part, frame, keep)
            .map_err(|e| anyhow!("stream \"{}\": encrypt: {e}", self.plan.name))?;
        if len + HEADER_LEN > self.ctx.max_payload {
            bail!(
                "stream \"{}\": a frame of {} bytes exceeds the NATS server's max_payload ({} bytes); raise max_payload in the server's configuration, or cut frames with multiplex split",
                self.plan.name,
                len + HEADER_LEN,
                self.ctx.max_payload
            );
        }
        self.transmit().await?;
        while self.sender.outbox.in_flight() > JS_IN_FLIGHT {
            let ev = self.next_event().await;
            self.on_event(ev).await?;
        }
        Ok(len)
    }

    /// Takes what happened meanwhile: a reconnect, acknowledgements, retries now due.
    fn catch_up(&mut self) {
        let now = self.ctx.connects.load(std::sync::atomic::Ordering::Acquire);
        if now != self.connects {
            self.connects = now;
            tracing::debug!(
                stream = %self.plan.name,
                "reconnected to NATS: publishing the recent frames again"
            );
            self.sender.outbox.handle_reconnect();
        }
        while let Ok((token, r)) = self.acks_rx.try_recv() {
            self.sender.outbox.handle_ack(Instant::now(), token, r);
        }
        self.sender.outbox.handle_timeout(Instant::now());
    }

    /// Its counters into the stream's stats: lossy frames dropped for want of room, and
    /// publishes sent again (failed, or after a reconnect).
    fn report(&self, stats: &Shared<StreamStats>) {
        let mut s = lock(stats);
        s.overflow = self.dropped;
        s.retransmits = self.sender.outbox.retried + self.sender.outbox.republished;
    }

    /// Whether stored publishes wait for their acknowledgement.
    fn busy(&self) -> bool {
        self.sender.outbox.in_flight() > 0
    }

    /// The next acknowledgement, or `None` when a retry is due (cancel-safe).
    async fn next_event(&mut self) -> Option<AckResult> {
        let wake = self.sender.outbox.poll_timeout();
        tokio::select! {
            r = self.acks_rx.recv() => r,
            _ = sleep_until_opt(wake) => None,
        }
    }

    async fn on_event(&mut self, ev: Option<AckResult>) -> Result<()> {
        if let Some((token, r)) = ev {
            self.sender.outbox.handle_ack(Instant::now(), token, r);
        }
        self.catch_up();
        self.transmit().await
    }

    /// Hands the outbox's messages to the client; a stored one's acknowledgement is waited
    /// for by a task of its own.
    async fn transmit(&mut self) -> Result<()> {
        while let Some(p) = self.sender.outbox.poll_transmit() {
            let (Some(js), Some(id)) = (self.js.as_ref(), p.id) else {
                let rec = if self.ending {
                    self.budget.wrap(p.body).await
                } else {
                    match self.budget.try_wrap(p.body) {
                        Some(r) => r,
                        None => {
                            // The newest frames go; this one would only wait behind others.
                            self.dropped += 1;
                            continue;
                        }
                    }
                };
                self.ctx
                    .client
                    .publish(p.subject, rec)
                    .await
                    .map_err(|e| anyhow!("stream \"{}\": publish: {e}", self.plan.name))?;
                continue;
            };
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(async_nats::header::NATS_MESSAGE_ID, id.as_str());
            let held = self.budget.wrap(p.body).await;
            match js
                .publish_with_headers(p.subject.clone(), headers, held)
                .await
            {
                Ok(fut) => {
                    let tx = self.acks_tx.clone();
                    let subject = p.subject;
                    tokio::spawn(async move {
                        let r = fut.await.map(|a| a.sequence).map_err(|e| {
                            tracing::debug!(%subject, error = %e, "JetStream publish not acknowledged; again");
                        });
                        let _ = tx.send((p.token, r));
                    });
                }
                Err(e) => {
                    tracing::debug!(subject = %p.subject, error = %e, "JetStream publish failed; again");
                    self.sender
                        .outbox
                        .handle_ack(Instant::now(), p.token, Err(()));
                }
            }
        }
        Ok(())
    }

    /// Follows the keys to a rotated group key or a new device run: what the device no longer
    /// opens goes again under the new run key (the frames this side sealed under the old key
    /// that were stored after the rotation began, or after the first run it missed began).
    async fn follow(&mut self, key: &mut watch::Receiver<GroupKey>) -> Result<()> {
        if !key.has_changed().unwrap_or(false) {
            return Ok(());
        }
        if self.gate.is_some() && key.borrow().since == SINCE_PENDING {
            // The device's rotation, a reliable stream: everything sealed under the old key is
            // stored before it reads where the stream stands ([`RotationGate`]); nothing new
            // is sealed meanwhile. (A lossy stream goes on under the new key at once.)
            self.settle_all().await?;
            if let Some(g) = &self.gate {
                g.0.settled();
            }
            let _ = key.wait_for(|k| k.since != SINCE_PENDING).await;
        }
        let keys = *key.borrow_and_update();
        let again = loop {
            match self.sender.follow(keys).map_err(|e| anyhow!("{e}"))? {
                Follow::Same => return Ok(()),
                // Every publish acknowledged first: the stream sequence of each kept frame is
                // known.
                Follow::Settle => self.settle_all().await?,
                Follow::Again(again) => break again,
            }
        };
        let n = again.len();
        for (meta, payload, route) in again {
            let (subject, part) = self.subject(route);
            let frame = Frame::from_bytes(meta, payload.clone());
            let keep = Some((payload.len(), (meta, payload, route)));
            self.publish(frame, &subject, part, keep).await?;
        }
        if n > 0 {
            tracing::info!(
                stream = %self.plan.name,
                frames = n,
                "published again under the new group key what the device received under the old one after its rotation"
            );
        }
        Ok(())
    }

    /// Tells the app sides the stream ended: a sealed empty frame numbered [`END_SEQ`] on
    /// every subject the stream uses, after everything else. On core NATS (a lossy stream)
    /// a message may be lost (a slow consumer's, or one the server drops): the END goes
    /// [`END_REPEATS`] more times, so an app side under `--once` does not wait for it for
    /// good; app sides take the first and pass over the others.
    async fn end(&mut self) -> Result<()> {
        self.ending = true;
        self.send_end().await?;
        self.flush().await?;
        if self.js.is_none() {
            for pause in END_REPEATS {
                tokio::time::sleep(pause).await;
                self.send_end().await?;
                self.flush().await?;
            }
        }
        Ok(())
    }

    /// One END on every subject of the stream.
    async fn send_end(&mut self) -> Result<()> {
        let routes: Vec<Route> = match self.plan.split {
            Some(parts) => (0..parts).map(|part| Route::Part { part, parts }).collect(),
            None => vec![Route::All],
        };
        for route in routes {
            let meta = Meta {
                stream: self.plan.id,
                seq: END_SEQ,
                timestamp_ns: wall_ns(),
                flags: 0,
            };
            if self.plan.round_robin {
                // Every member hears it (on core NATS), sealed with that subject's sequence.
                let subject = self.ctx.subjects.end(self.plan.id);
                let rec = self
                    .sender
                    .record(&subject, Frame::new(meta, &[]))
                    .map_err(|e| anyhow!("stream \"{}\": encrypt: {e}", self.plan.name))?;
                if let Some(rec) = rec {
                    let _ = self.ctx.client.publish(subject.clone(), rec).await;
                }
            }
            let (subject, part) = self.subject(route);
            self.publish(Frame::new(meta, &[]), &subject, part, None)
                .await?;
        }
        Ok(())
    }

    /// Waits until JetStream acknowledged everything published.
    async fn settle_all(&mut self) -> Result<()> {
        loop {
            self.catch_up();
            self.transmit().await?;
            if self.sender.outbox.is_settled() {
                return Ok(());
            }
            let ev = self.next_event().await;
            self.on_event(ev).await?;
        }
    }

    async fn flush(&mut self) -> Result<()> {
        self.settle_all().await?;
        let _ = self.ctx.client.flush().await;
        Ok(())
    }
}

/// Source endpoint → stack → route → group key → NATS. When this side stops (`finish`) the
/// channel closes: the source sees it and ends (a blocking one, such as `x11-screen`, too:
/// aborting its task does not stop it), what it sent goes out, then the stream's END.
async fn pump_source(
    mut rx: mpsc::Receiver<Frame>,
    mut finish: watch::Receiver<bool>,
    stack: &mut Stack,
    mut keys: watch::Receiver<GroupKey>,
    mut out: Publisher,
    stats: Shared<StreamStats>,
) -> Result<()> {
    let name = out.plan.name.clone();
    let mut closed = false;
    // A rotation also reaches a stream with nothing to send (its kept frames go again).
    let mut rotation = keys.clone();
    loop {
        let wake = stack.poll_timeout();
        let frame = tokio::select! {
            f = rx.recv() => f,
            r = finish.changed(), if !closed => {
                if r.is_err() || *finish.borrow() {
                    closed = true;
                    rx.close();
                }
                continue;
            }
            ev = out.next_event(), if out.busy() => {
                // Acknowledgements and retries go on while the source is quiet.
                out.on_event(ev).await?;
                out.report(&stats);
                continue;
            }
            r = rotation.changed(), if out.sender.outbox.keeps() => {
                if r.is_err() {
                    out.sender.outbox.stop_keeping();
                } else {
                    out.follow(&mut keys).await?;
                }
                continue;
            }
            _ = sleep_until_opt(wake) => {
                stack.handle_timeout(Instant::now()).map_err(|e| anyhow!("{e}"))?;
                drain(stack, &mut keys, &mut out, &stats, &name).await?;
                continue;
            }
        };
        let Some(frame) = frame else {
            stack.flush(Instant::now()).map_err(|e| anyhow!("{e}"))?;
            drain(stack, &mut keys, &mut out, &stats, &name).await?;
            out.flush().await?;
            out.follow(&mut keys).await?;
            out.end().await?;
            return Ok(());
        };
        lock(&stats).produced(frame.len());
        stack
            .handle_frame(Instant::now(), frame)
            .map_err(|e| anyhow!("{e}"))?;
        drain(stack, &mut keys, &mut out, &stats, &name).await?;
    }
}

async fn drain(
    stack: &mut Stack,
    keys: &mut watch::Receiver<GroupKey>,
    out: &mut Publisher,
    stats: &Shared<StreamStats>,
    name: &str,
) -> Result<()> {
    while let Some(f) = stack.poll_frame() {
        let route = if out.plan.split.is_some() || out.plan.round_robin || has_mux(stack) {
            route_of(f.payload()).map_err(|e| anyhow!("stream \"{name}\": {e}"))?
        } else {
            Route::All
        };
        out.follow(keys).await?;
        // Kept as it is before sealing (the seal then copies it: app → device frames only).
        let (f, keep) = if out.sender.outbox.keeps() {
            let meta = f.meta;
            let b = f.into_bytes();
            (
                Frame::from_bytes(meta, b.clone()),
                Some((b.len(), (meta, b, route))),
            )
        } else {
            (f, None)
        };
        let (subject, part) = out.subject(route);
        let len = out.publish(f, &subject, part, keep).await?;
        {
            let mut s = lock(stats);
            s.wire_frames += 1;
            s.wire_bytes += len as u64;
            if s.layers_due(Instant::now()) {
                s.layers = stack.stats();
            }
        }
        out.report(stats);
    }
    Ok(())
}

fn has_mux(stack: &Stack) -> bool {
    stack.modules().last() == Some(&"multiplex")
}

/// Where a sink's records come from.
enum Input {
    Core(async_nats::Subscriber),
    Stored(Box<Stored>),
}

async fn subscribe(
    ctx: &Ctx,
    plan: &Plan,
    js: Option<jetstream::Context>,
    app: Option<(&Admission, &str, u64)>,
) -> Result<Input> {
    let Some((adm, me, start)) = app else {
        // The device side's sinks: every app side's frames on the stream's up subject;
        // reliable ones through the device's own durable consumer (what app sides sent
        // while the device was away waits there).
        if let Some(js) = js.filter(|_| plan.reliable) {
            let (stream, last) = stored_up_to(ctx, &js).await?;
            let start = last + 1;
            let mut stored = Stored {
                stream,
                durable: ctx.subjects.device_durable(plan.id),
                filter: ctx.subjects.up_stored(plan.id),
                shared: false,
                resume: true,
                ordered: false,
                messages: None,
                connects: ctx.connects.clone(),
                seen: ctx.connects.load(std::sync::atomic::Ordering::Acquire),
                start: 0,
            };
            stored.attach(start).await?;
            return Ok(Input::Stored(Box::new(stored)));
        }
        let subject = ctx.subjects.up(plan.id);
        let sub = ctx
            .client
            .subscribe(subject.clone())
            .await
            .map_err(|e| anyhow!("cannot subscribe to {subject}: {e}"))?;
        return Ok(Input::Core(sub));
    };
    let part = match plan.split {
        Some(parts) => match adm.slot {
            Some(s) if s < parts => Some(s),
            _ => bail!(
                "stream \"{}\": the device side split it in {parts} parts but gave this side no slot below {parts}",
                plan.name
            ),
        },
        None => None,
    };
    match js.filter(|_| plan.reliable) {
        None => {
            let subject = ctx.subjects.down(plan.id, false, part);
            let sub = if plan.round_robin {
                ctx.client
                    .queue_subscribe(subject.clone(), ctx.subjects.group(plan.id))
                    .await
            } else {
                ctx.client.subscribe(subject.clone()).await
            }
            .map_err(|e| anyhow!("cannot subscribe to {subject}: {e}"))?;
            Ok(Input::Core(sub))
        }
        Some(js) => {
            let stream = js.get_stream(ctx.subjects.jetstream()).await.map_err(|e| {
                anyhow!(
                    "JetStream stream {}: {e} (the device side creates it when it starts)",
                    ctx.subjects.jetstream()
                )
            })?;
            let durable = if plan.round_robin {
                ctx.subjects.group(plan.id)
            } else {
                ctx.subjects.durable(me, plan.id, part)
            };
            let mut stored = Stored {
                stream,
                durable,
                filter: ctx.subjects.down(plan.id, true, part),
                shared: plan.round_robin,
                resume: !plan.now_only,
                ordered: !plan.round_robin,
                messages: None,
                connects: ctx.connects.clone(),
                seen: ctx.connects.load(std::sync::atomic::Ordering::Acquire),
                start: 0,
            };
            stored.attach(start).await?;
            Ok(Input::Stored(Box::new(stored)))
        }
    }
}

/// A JetStream consumer of one app side (or the shared one of a round-robin stream).
struct Stored {
    stream: jetstream::stream::Stream,
    durable: String,
    filter: String,
    /// Round-robin: shared with the other members, never deleted.
    shared: bool,
    /// A consumer this side left behind resumes where it stopped (else it starts afresh at
    /// the start given: see [`Plan::now_only`]).
    resume: bool,
    /// One publisher whose subject sequence orders the frames (not round-robin members, not
    /// the many app sides of an app → device stream).
    ordered: bool,
    messages: Option<jetstream::consumer::pull::Stream>,
    connects: Arc<std::sync::atomic::AtomicU64>,
    seen: u64,
    /// The stream sequence the consumer delivers from (as attached last).
    start: u64,
}

impl Stored {
    /// (Re)attaches: this side's own consumer, if it exists (a restart, a crash, a server
    /// that came back), starts over at the first message it had not acknowledged, so frames
    /// come in order and none is lost; what it had delivered but not yet acknowledged comes
    /// again and is dropped by its stream sequence. A new consumer starts at `start` (the
    /// first message stored after this side asked to join).
    async fn attach(&mut self, start: u64) -> Result<()> {
        let durable = self.durable.clone();
        let mut start = start;
        if !self.shared {
            if let Ok(c) = self
                .stream
                .get_consumer::<jetstream::consumer::pull::Config>(&durable)
                .await
            {
                if self.resume {
                    start = c.cached_info().ack_floor.stream_sequence + 1;
                }
                let _ = self.stream.delete_consumer(&durable).await;
            }
        }
        self.start = start;
        let config = jetstream::consumer::pull::Config {
            durable_name: Some(durable.clone()),
            filter_subject: self.filter.clone(),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            deliver_policy: jetstream::consumer::DeliverPolicy::ByStartSequence {
                start_sequence: start,
            },
            ack_wait: Duration::from_secs(5),
            max_ack_pending: 4096,
            ..Default::default()
        };
        let consumer = self
            .stream
            .get_or_create_consumer(&durable, config)
            .await
            .map_err(|e| anyhow!("JetStream consumer {durable}: {e}"))?;
        self.messages = Some(
            consumer
                .messages()
                .await
                .map_err(|e| anyhow!("JetStream consumer {durable}: {e}"))?,
        );
        Ok(())
    }

    /// Whether nothing is left for this consumer: every stored frame delivered and
    /// acknowledged (by this side or, round-robin, by another member).
    async fn drained(&mut self) -> bool {
        match self.stream.consumer_info(&self.durable).await {
            Ok(i) => i.num_pending == 0 && i.num_ack_pending == 0,
            Err(_) => false,
        }
    }

    /// Whether the connection to the server was made again since the last look.
    fn reconnected(&mut self) -> bool {
        let now = self.connects.load(std::sync::atomic::Ordering::Acquire);
        std::mem::replace(&mut self.seen, now) != now
    }

    async fn next(&mut self) -> Option<Result<jetstream::Message>> {
        match self.messages.as_mut() {
            Some(m) => m
                .next()
                .await
                .map(|r| r.map_err(|e| anyhow!("JetStream: {e}"))),
            None => std::future::pending().await,
        }
    }
}

/// Builds a stream's sink stack afresh.
type Rebuild = Box<dyn Fn() -> Result<Stack> + Send>;

/// NATS → group key → stack → sink endpoint; JetStream messages are acknowledged once the
/// sink completed everything handed to it.
#[allow(clippy::too_many_arguments)]
async fn pump_sink(
    stream: u16,
    mut input: Input,
    mut end_sub: Option<async_nats::Subscriber>,
    once: bool,
    mut finish: watch::Receiver<bool>,
    lossy: bool,
    stack: &mut Stack,
    rebuild: Rebuild,
    mut keys: KeyWatch,
    side: SideName,
    tx: mpsc::Sender<Frame>,
    done: Delivered,
    stats: Shared<StreamStats>,
    peer: &'static str,
) -> Result<()> {
    let mut handed = 0u64;
    // Stored frames of this side's own consumer come back in their order after a server
    // restart (round-robin members each see only some of a subject's frames: no order).
    let ordered = matches!(&input, Input::Stored(s) if s.ordered);
    let mut rx = keys.receiver(side, stream, ordered);
    if let Input::Stored(s) = &input {
        rx.intake().consumer_start(s.start);
    }
    // What the counters said when the stats were last told.
    let (mut records, mut bytes, mut dropped) = (0u64, 0u64, 0u64);
    // When the END came, if this side waits for stored frames still on their way.
    let mut ending: Option<Instant> = None;
    let mut bad = ndd_core::RateLimit::with_burst(Duration::from_secs(1), 5);
    // What the server says goes wrong may come with every message, or every 20 ms tick.
    let (mut gaps, mut attach_failed, mut server_errors) = (
        ndd_core::RateLimit::default(),
        ndd_core::RateLimit::default(),
        ndd_core::RateLimit::default(),
    );
    let mut check = tokio::time::interval(Duration::from_millis(20));
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Lossy: while the sink is busy only the newest frame waits (older ones are stale).
    let mut newest: Option<Frame> = None;
    let mut spare = lossy.then_some(&mut newest);
    loop {
        keys.follow(&mut rx);
        let polled = rx.poll(Instant::now());
        if rx.records != records || rx.dropped() != dropped {
            let mut s = lock(&stats);
            s.wire_frames += rx.records - records;
            s.wire_bytes += rx.record_bytes - bytes;
            s.refused += rx.dropped() - dropped;
            (records, bytes, dropped) = (rx.records, rx.record_bytes, rx.dropped());
        }
        let polled = match polled {
            Ok(p) => p,
            Err(e) => {
                unopened(&mut bad, &e);
                continue;
            }
        };
        let event = match polled {
            Poll::Event(e) => e,
            Poll::Wait(w) => {
                match keys.bring(&mut rx, w).await {
                    Ok(true) => {}
                    Ok(false) => return Ok(()),
                    Err(e) => unopened(&mut bad, &e),
                }
                continue;
            }
            Poll::Idle => {
                let wake = stack.poll_timeout();
                let waiting = spare.as_ref().is_some_and(|n| n.is_some());
                let next = tokio::select! {
                    _ = finish.changed() => {
                        // This side stops: what the stack holds goes to the sink, and the
                        // stream ends (its sink finishes and reports).
                        stack.flush(Instant::now()).map_err(|e| anyhow!("{e}"))?;
                        deliver(stack, &tx, &stats, None).await?;
                        if let Some(f) = spare.as_mut().and_then(|n| n.take()) {
                            let _ = tx.send(f).await;
                        }
                        return Ok(());
                    }
                    // Lossy: the frame that waited for a busy sink goes as soon as it has room.
                    permit = tx.reserve(), if waiting => {
                        if let (Ok(p), Some(f)) = (permit, spare.as_mut().and_then(|n| n.take())) {
                            p.send(f);
                            handed += 1;
                        }
                        continue;
                    }
                    m = async {
                        match &mut input {
                            Input::Core(s) => s.next().await.map(|m| Ok((m.payload, None))),
                            Input::Stored(s) => s.next().await.map(|r| r.map(|m| (m.payload.clone(), Some(m)))),
                        }
                    } => m,
                    Some(m) = async {
                        match end_sub.as_mut() {
                            Some(s) => s.next().await,
                            None => std::future::pending().await,
                        }
                    } => Some(Ok((m.payload, None))),
                    _ = sleep_until_opt(wake) => {
                        stack.handle_timeout(Instant::now()).map_err(|e| anyhow!("{e}"))?;
                        handed += deliver(stack, &tx, &stats, spare.as_deref_mut()).await?;
                        continue;
                    }
                    _ = check.tick() => {
                        if rx.handle_timeout(Instant::now()) {
                            let skipped = rx.intake().skipped();
                            lock(&stats).given_up = skipped;
                            if let Some(suppressed) = gaps.admit(Instant::now()) {
                                tracing::warn!(
                                    skipped,
                                    suppressed,
                                    "stored frames that never came were given up after {REORDER_WAIT:?}"
                                );
                            }
                        }
                        // Acknowledged only once everything taken is through the sink
                        // (nothing held behind a gap, nothing in the stack).
                        let through = done.count() >= handed && stack.poll_timeout().is_none();
                        let due = rx.acks_due(through);
                        ack_in_order(rx.intake(), due).await;
                        if let (Some(t), Input::Stored(st)) = (ending, &mut input) {
                            if !rx.intake().has_unacked() && (st.drained().await || t.elapsed() > ENDING_WAIT) {
                                if t.elapsed() > ENDING_WAIT {
                                    tracing::warn!("the stream ended with stored frames still unacknowledged after {ENDING_WAIT:?}; stopping anyway");
                                }
                                stack.flush(Instant::now()).map_err(|e| anyhow!("{e}"))?;
                                deliver(stack, &tx, &stats, spare.as_deref_mut()).await?;
                                return Ok(());
                            }
                        }
                        // Back from a server restart: what was on its way to this side when
                        // the server went comes again at once and in order (not after the
                        // ack wait).
                        if let Input::Stored(s) = &mut input {
                            if s.reconnected() {
                                let r = s.attach(rx.intake().acked_to() + 1).await;
                                rx.intake().consumer_start(s.start);
                                if let Err(e) = r {
                                    // The server's words in it: escaped.
                                    if let Some(suppressed) = attach_failed.admit(Instant::now()) {
                                        tracing::warn!(
                                            suppressed,
                                            "{}; trying again",
                                            printable(&e.to_string(), MAX_REASON)
                                        );
                                    }
                                    s.seen = s.seen.wrapping_sub(1);
                                }
                            }
                        }
                        continue;
                    }
                };
                let (payload, stored) = match next {
                    None => return Ok(()),
                    Some(Ok(x)) => x,
                    Some(Err(e)) => {
                        // The server's words in it: escaped.
                        if let Some(suppressed) = server_errors.admit(Instant::now()) {
                            tracing::warn!(
                                suppressed,
                                "JetStream: {}; going on",
                                printable(&e.to_string(), MAX_REASON)
                            );
                        }
                        continue;
                    }
                };
                let stored = stored.map(|m| {
                    let seq = m.info().ok().map(|i| i.stream_sequence);
                    tracing::trace!(stream_seq = seq, "stored frame");
                    (seq, m)
                });
                match rx.handle_message(Instant::now(), &payload, stored) {
                    Taken::Queued => {}
                    Taken::Copy => lock(&stats).duplicates += 1,
                    Taken::Malformed => {
                        if let Some(suppressed) = bad.admit(Instant::now()) {
                            tracing::warn!(
                                suppressed,
                                "dropped a NATS message shorter than a frame record"
                            );
                        }
                    }
                    Taken::Foreign => {
                        // Every stream has subjects of its own: a record naming another
                        // stream was moved here by someone who may publish.
                        lock(&stats).refused += 1;
                        if let Some(suppressed) = bad.admit(Instant::now()) {
                            tracing::warn!(
                                subject_stream = stream,
                                suppressed,
                                "dropped a frame of another stream published on this stream's subject"
                            );
                        }
                    }
                }
                continue;
            }
        };
        keys.said(&event);
        match event {
            Event::NewerRun | Event::TellRun => {}
            Event::End { first, .. } => {
                if once {
                    // Stored frames still on their way to this side (delivered before a
                    // server restart, or to a round-robin member that left) come first.
                    if let Input::Stored(st) = &mut input {
                        if ending.is_none() {
                            ending = Some(Instant::now());
                        }
                        if !st.drained().await {
                            continue;
                        }
                    }
                    stack.flush(Instant::now()).map_err(|e| anyhow!("{e}"))?;
                    handed += deliver(stack, &tx, &stats, spare.as_deref_mut()).await?;
                    if let Some(f) = spare.as_mut().and_then(|n| n.take()) {
                        if tx.send(f).await.is_ok() {
                            handed += 1;
                        }
                    }
                    // Everything before the end is acknowledged once the sink completed it.
                    drop(tx);
                    let t0 = Instant::now();
                    while done.count() < handed && t0.elapsed() < Duration::from_secs(10) {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    if done.count() >= handed {
                        let all = rx.intake().take_acks();
                        ack_in_order(rx.intake(), all).await;
                    }
                    return Ok(());
                }
                if first {
                    tracing::info!(
                        "{peer} source of this stream ended; waiting for it to start again"
                    );
                }
            }
            Event::Frame {
                frame,
                run,
                restarted,
                ..
            } => {
                if let Some((old, old_seq)) = restarted {
                    // The device side restarted: its forward halves start from nothing (an
                    // `image` zstd stream and credit numbers, a `delta` reference). What ours
                    // still hold of its last run goes to the sink, then they start afresh too,
                    // as on a direct link (found by hand: after a device restart every app
                    // side's `image` inverse refused the new run's frames, `credit number did
                    // not increase`).
                    stack.flush(Instant::now()).map_err(|e| anyhow!("{e}"))?;
                    handed += deliver(stack, &tx, &stats, spare.as_deref_mut()).await?;
                    *stack = rebuild()?;
                    tracing::info!(
                        old = format_args!("{old:016x}"),
                        old_seq,
                        new = format_args!("{:016x}", run.id),
                        seq = frame.meta.seq,
                        "the device side restarted; this stream's pairs start afresh"
                    );
                }
                if let Err(e) = stack.handle_frame(Instant::now(), frame) {
                    if let Some(suppressed) = bad.admit(Instant::now()) {
                        tracing::warn!(
                            suppressed,
                            "{}; frame dropped",
                            printable(&e.to_string(), MAX_REASON)
                        );
                    }
                }
                handed += deliver(stack, &tx, &stats, spare.as_deref_mut()).await?;
            }
        }
    }
}

/// Says (a few times a second at most) that a record did not open under the group key.
fn unopened(bad: &mut ndd_core::RateLimit, e: &ndd_core::ModuleError) {
    if let Some(suppressed) = bad.admit(Instant::now()) {
        tracing::warn!(
            suppressed,
            "dropped a frame that does not open under the group key: {}",
            printable(&e.to_string(), MAX_REASON)
        );
    }
}

/// Acknowledges `msgs` in order; the last one waits for the server's confirmation, which
/// covers the others.
async fn ack_in_order(intake: &mut Intake<jetstream::Message>, msgs: Vec<jetstream::Message>) {
    let n = msgs.len();
    for (i, m) in msgs.into_iter().enumerate() {
        let r = if i + 1 == n {
            m.double_ack().await
        } else {
            m.ack().await
        };
        if r.is_ok() {
            if let Ok(info) = m.info() {
                intake.acked(info.stream_sequence);
            }
        }
    }
}

/// Hands the stack's frames to the sink. With `newest` (a lossy stream), a frame the sink
/// has no room for waits there, replacing (and counting as stale) the one that waited.
async fn deliver(
    stack: &mut Stack,
    tx: &mpsc::Sender<Frame>,
    stats: &Shared<StreamStats>,
    mut newest: Option<&mut Option<Frame>>,
) -> Result<u64> {
    let mut n = 0;
    while let Some(f) = stack.poll_frame() {
        {
            let mut s = lock(stats);
            s.delivered(f.len(), f.meta.timestamp_ns, wall_ns());
            if s.layers_due(Instant::now()) {
                s.layers = stack.stats();
            }
        }
        match newest.as_deref_mut() {
            Some(slot) => {
                let f = match slot.take() {
                    // Order: what waited goes first when there is room.
                    Some(old) => match tx.try_send(old) {
                        Ok(()) => {
                            n += 1;
                            f
                        }
                        Err(mpsc::error::TrySendError::Full(_)) => {
                            lock(stats).stale += 1;
                            f
                        }
                        Err(mpsc::error::TrySendError::Closed(_)) => {
                            bail!("the sink endpoint stopped accepting frames")
                        }
                    },
                    None => f,
                };
                match tx.try_send(f) {
                    Ok(()) => n += 1,
                    Err(mpsc::error::TrySendError::Full(f)) => *slot = Some(f),
                    Err(mpsc::error::TrySendError::Closed(_)) => {
                        bail!("the sink endpoint stopped accepting frames")
                    }
                }
            }
            None => {
                if tx.send(f).await.is_err() {
                    bail!("the sink endpoint stopped accepting frames");
                }
                n += 1;
            }
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_notes_its_runs_and_names_the_ones_before() {
        let home = std::env::temp_dir().join(format!("ndd-runs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&home);
        std::fs::create_dir_all(&home).unwrap();
        let path = run_path(&home, "P", "d");
        // The file of an earlier version: the last id alone (its start unknown).
        std::fs::write(&path, 7u64.to_be_bytes()).unwrap();
        let (a, earlier) = new_run(&home, "P", "d", 10).unwrap();
        assert!(a.id > 7);
        assert_eq!(earlier, [None; EARLIER_RUNS]);
        let (b, earlier) = new_run(&home, "P", "d", 20).unwrap();
        assert!(b.id > a.id);
        assert_eq!(earlier, [Some(a), None, None]);
        let mut runs = vec![a, b];
        for began in [30, 40, 50] {
            let (r, earlier) = new_run(&home, "P", "d", began).unwrap();
            let mut want = [None; EARLIER_RUNS];
            for (w, r) in want.iter_mut().zip(runs.iter().rev()) {
                *w = Some(*r);
            }
            assert_eq!(earlier, want);
            runs.push(r);
        }
        // Four runs kept, 16 bytes each.
        assert_eq!(std::fs::read(&path).unwrap().len(), 16 * (EARLIER_RUNS + 1));
        std::fs::write(&path, [1u8; 5]).unwrap();
        let e = new_run(&home, "P", "d", 60).unwrap_err().to_string();
        assert!(
            e.contains("holds 5 bytes, not run ids (8, or 16 per run)"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&home);
    }
    use ndd_core::testlog::Captured;

    /// Strangers (fresh identities nobody trusts) ask to join a thousand times in a second,
    /// each finishing the key exchange: a few lines of each kind, then one with the count held
    /// back; every one is refused.
    #[tokio::test]
    async fn a_thousand_strangers_asking_to_join_in_a_second_are_a_few_lines() {
        let dir = std::env::temp_dir().join(format!("ndd-joins-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let local = |name: &str| {
            let (id, _) = ndd_link::Identity::load_or_create(&dir.join(name)).unwrap();
            LocalIdentity::new(&id).unwrap()
        };
        let (device, stranger) = (local("device"), local("stranger"));
        // No server is needed to answer joins: a client that would connect in the background.
        let client = async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .connect("127.0.0.1:1")
            .await
            .unwrap();
        let hello = |side| ndd_wire::HelloRepr {
            side,
            max_body: 1 << 20,
            driver: "joins".into(),
            streams: vec![],
        };
        let (_keys, key) = watch::channel(GroupKey::first([1; 32], Run { id: 1, began: 0 }));
        let mut svc = JoinService {
            admitter: Arc::new(Mutex::new(Admitter::new(
                hello(ndd_wire::Side::Device),
                &device.fingerprint(),
                "home",
                0,
                Duration::from_secs(5),
                false,
            ))),
            ctx: Ctx {
                client,
                subjects: Subjects::new("ndd", "joins").unwrap(),
                side: SideName::Device,
                quiet: false,
                connects: Arc::default(),
                max_payload: 1 << 20,
                run_stale: Arc::default(),
                gate: Arc::default(),
            },
            local: device,
            home: dir.join("device"),
            key,
            holders: dir.join("holders"),
            expiry: Duration::from_secs(10),
        };
        let theirs = OwnedMessage::Hello(hello(ndd_wire::Side::App))
            .as_message()
            .emit_to_vec()
            .unwrap();
        let mut host = Host::new(Duration::from_secs(10));
        let t0 = Instant::now();
        let ((), log) = Captured::run(|| {
            for i in 0..=1000u64 {
                let now = t0 + Duration::from_millis(if i == 1000 { 2000 } else { i });
                let mut j = Joiner::new().unwrap();
                let reply = svc.answer(&mut host, &j.init(), now).unwrap();
                let (_, finish) = j.handle_reply(&stranger, &reply, &theirs).unwrap();
                let welcome = svc.answer(&mut host, &finish, now).unwrap();
                assert!(matches!(
                    j.handle_welcome(&welcome).unwrap(),
                    Welcome::Refused { .. }
                ));
            }
        });
        let lines = log.matching("refused untrusted app side");
        assert_eq!(lines.len(), 6, "{lines:#?}");
        assert!(lines[5].contains("suppressed=995"), "{lines:#?}");
        // One line per refusal, not a second one in other words.
        assert_eq!(log.matching("refused an app side").len(), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A stream's room in the client's queue: taken by what it hands the client, given back
    /// when the client lets the bytes go (written), never before; a lossy frame finds no room
    /// while it is full, a reliable one waits for it.
    #[tokio::test]
    async fn the_client_queue_budget_is_given_back_when_the_bytes_are_gone() {
        let b = Budget::new();
        let big = Bytes::from(vec![7u8; QUEUED_BYTES / 2]);
        let one = b.try_wrap(big.clone()).expect("room for half");
        let two = b.try_wrap(big.clone()).expect("room for the other half");
        assert_eq!(&one[..], &big[..], "the bytes are the frame's");
        assert!(b.try_wrap(Bytes::from_static(b"x")).is_none(), "full");
        // A clone the client keeps (its write queue) holds the room as well.
        let kept = two.clone();
        drop(two);
        assert!(b.try_wrap(Bytes::from_static(b"x")).is_none(), "still held");
        let waiter = {
            let b = b.clone();
            let big = big.clone();
            tokio::spawn(async move { b.wrap(big).await.len() })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "a reliable frame waits for room");
        drop(kept);
        assert_eq!(
            waiter.await.unwrap(),
            QUEUED_BYTES / 2,
            "and gets it once written"
        );
        drop(one);
        // A frame larger than the whole budget takes all of it, not forever.
        let huge = Bytes::from(vec![1u8; QUEUED_BYTES * 2]);
        assert_eq!(b.wrap(huge).await.len(), QUEUED_BYTES * 2);
    }

    fn frame(seq: u64) -> Frame {
        Frame::new(
            Meta {
                stream: 1,
                seq,
                timestamp_ns: 0,
                flags: 0,
            },
            &[seq as u8],
        )
    }

    #[tokio::test]
    async fn a_lossy_stream_keeps_only_the_newest_frame_while_the_sink_is_busy() {
        let mut stack = Stack::build(Role::Sink, "s", &[]).unwrap();
        let (tx, mut rx) = mpsc::channel(1);
        let stats = Arc::new(Mutex::new(StreamStats::new("s", "sink", "d".into())));
        let mut newest = None;
        for seq in 0..5 {
            stack.handle_frame(Instant::now(), frame(seq)).unwrap();
        }
        let n = deliver(&mut stack, &tx, &stats, Some(&mut newest))
            .await
            .unwrap();
        assert_eq!(n, 1, "the sink had room for one");
        assert_eq!(rx.recv().await.unwrap().meta.seq, 0);
        assert_eq!(
            newest.as_ref().map(|f| f.meta.seq),
            Some(4),
            "the newest waits"
        );
        assert_eq!(lock(&stats).stale, 3, "1, 2 and 3 were stale");
        // The next frame: what waited goes first, then this one waits.
        stack.handle_frame(Instant::now(), frame(5)).unwrap();
        deliver(&mut stack, &tx, &stats, Some(&mut newest))
            .await
            .unwrap();
        assert_eq!(rx.recv().await.unwrap().meta.seq, 4);
        assert_eq!(newest.as_ref().map(|f| f.meta.seq), Some(5));
        // A reliable stream waits for room instead: nothing dropped.
        let (tx, mut rx) = mpsc::channel(8);
        for seq in 0..5 {
            stack.handle_frame(Instant::now(), frame(seq)).unwrap();
        }
        assert_eq!(deliver(&mut stack, &tx, &stats, None).await.unwrap(), 5);
        for seq in 0..5 {
            assert_eq!(rx.recv().await.unwrap().meta.seq, seq);
        }
    }
}

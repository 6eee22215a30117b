//! The PulseAudio tasks and virtual devices. See the module docs in `mod.rs`.

use super::config::{PulseCaptureConfig, PulsePlaybackConfig};
use crate::common::delivered::Delivered;
use crate::common::emitter::Emitter;
use crate::common::error::EndpointError;
use crate::common::report::{SinkReport, SinkTask, SourceReport, SourceTask};
use libpulse_binding::def::BufferAttr;
use libpulse_binding::sample::{Format, Spec};
use libpulse_binding::stream::Direction;
use libpulse_simple_binding::Simple;
use ndd_core::ratelimit::RateLimit;
use ndd_core::Frame;
use ndd_wire::audio::{Block, Codec, HEADER_LEN};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};
use tokio::runtime::Handle;
use tokio::sync::mpsc::{Receiver, Sender};

/// A sample clock for block timestamps: each block one block length after the previous,
/// anchored at the first block's recording time and again whenever the wall clock and the
/// sample clock part by more than [`RESYNC_NS`]. Sans-IO: the recording time comes in.
#[derive(Debug, Default)]
struct SampleClock {
    next: Option<u64>,
}

/// How far the sample clock may part from the recording times before it is anchored again.
const RESYNC_NS: u64 = 30_000_000;

impl SampleClock {
    /// The timestamp of a block of `len_ns` recorded at about `recorded`.
    fn stamp(&mut self, recorded: u64, len_ns: u64) -> u64 {
        let ts = match self.next {
            Some(n) if n.abs_diff(recorded) <= RESYNC_NS => n,
            _ => recorded,
        };
        self.next = Some(ts + len_ns);
        ts
    }
}

/// Queued sound beyond the target latency that the playback tolerates before dropping at
/// once: a playback stream's write blocks while the server plays out what it holds, in
/// chunks, so a few blocks queue behind it in the normal course. A smaller backlog that
/// lasts is found by [`Standing`].
const LATE_SLACK_MS: u64 = 200;

/// How long [`Standing`] watches the queue before it calls its lowest level standing delay.
const STANDING_WINDOW_US: u64 = 500_000;

/// How long standing delay waits for quiet before it is taken out of sound anyway.
const STANDING_GRACE_US: u64 = 5_000_000;

/// A block whose samples all stay under this is quiet: dropping it is not heard (-48 dBFS).
const QUIET_PEAK: u16 = 128;

/// What a virtual source's FIFO holds beyond what may wait in it, so a block never finds it
/// full (the gate drops whole blocks; a full pipe cuts one short).
const FIFO_MARGIN_US: u64 = 100_000;

/// Standing delay in a playback sink's queue. Sound arrives at the rate it plays, so blocks
/// that queued up once (the burst a capture delivers as it starts, a stall of the link that
/// ended, a sink that took its time to start) never drain by themselves: below the burst
/// limit they would stay as delay for the whole session (the speaker direction measured
/// ~110 ms of it from a cold start). Jitter makes the queue rise and fall; what it never
/// falls under over a window is not jitter. The delay is taken out of quiet blocks, so a tone
/// or a word is not cut; sound that never pauses loses it after [`STANDING_GRACE_US`].
/// Sans-IO: the queue's level and whether the block is quiet come in, whether to drop it
/// goes out.
#[derive(Debug, Default)]
struct Standing {
    /// Sound seen in this window, and the lowest queue behind a block in it.
    seen_us: u64,
    low_us: Option<u64>,
    /// Blocks still to drop to take the standing delay out, and the sound played since that
    /// was found, waiting for quiet.
    to_drop: u64,
    waited_us: u64,
}

impl Standing {
    /// A block of `block_us` about to be played with `queued_us` of sound queued behind it:
    /// whether to drop it instead. Once a window, the lowest level seen is taken out, a block
    /// at a time, from the blocks that follow that are `quiet` (asked only then: it reads the
    /// block's samples).
    fn drop_this(&mut self, queued_us: u64, block_us: u64, quiet: impl FnOnce() -> bool) -> bool {
        if self.to_drop > 0 {
            if self.waited_us >= STANDING_GRACE_US || quiet() {
                self.to_drop -= 1;
                return true;
            }
            self.waited_us += block_us;
            return false;
        }
        let low = self.low_us.map_or(queued_us, |l| l.min(queued_us));
        self.low_us = Some(low);
        self.seen_us += block_us;
        if self.seen_us >= STANDING_WINDOW_US {
            *self = Standing {
                to_drop: low / block_us.max(1),
                ..Standing::default()
            };
        }
        false
    }
}

/// Which blocks go into a virtual source's FIFO. PipeWire's pipe source reads the FIFO only
/// while a program records, and then a period at a time (256 to 2048 samples, as the graph
/// runs), exactly as fast as it plays: the level the FIFO had when a program started
/// recording stays there as delay for the whole recording, every block written above a bound
/// is lost, and a period that finds less than itself is played out with silence. (PulseAudio's
/// pipe source reads at once: the level stays near zero.) So the sink keeps a cushion of
/// `cushion_us` in the FIFO (it writes the first that much at once, a prebuffer) and the bound
/// depends on whether a reader is seen: while none drained the FIFO lately, the cushion and two
/// blocks wait (the most stale sound a program hears first when it starts recording; a block
/// early before the reader's first period is not dropped); while one
/// does, the cushion, the largest period seen taken and a block (the level just before a read
/// is the cushion and a period, and blocks come late or early), or `max_wait_us` if more. The
/// cushion must hold a reader's period, so each period finds its sound however the blocks fall
/// between them: a period that finds less empties the FIFO, and the next ones run short again.
/// Sans-IO: the FIFO's level and the time come in, whether to write the block goes out.
#[derive(Debug)]
struct FifoGate {
    cushion_us: u64,
    max_wait_us: u64,
    /// The most that may wait at all (what the FIFO holds, less a margin).
    cap_us: u64,
    /// The level just after the last block (the level when it was dropped): a lower level
    /// at the next block means the reader took some.
    after_us: Option<u64>,
    /// When a reader was last seen taking sound, and the most it was seen to take between
    /// two blocks that came on time (its period).
    drained_at_us: Option<u64>,
    period_us: u64,
    /// When the last block came.
    last_us: Option<u64>,
}

/// The least cushion a virtual source's FIFO keeps ([`FifoGate`]): a reader's period must
/// find itself there whenever it comes, so the cushion covers PipeWire's default period (1024
/// samples, 21 ms at 48 kHz), a block and its lateness; a graph at 2048 needs `latency_ms =
/// 60`. (With 30 ms, a 1024-sample period found a millisecond or two missing now and then,
/// heard as a click; with 60, the microphone through PipeWire took 95 ms in `ndd bench
/// audio`, 69 with 40.)
const MIN_CUSHION_US: u64 = 40_000;

/// The longest reader's period [`FifoGate`] makes room for (PipeWire's default longest
/// period is 2048 samples, 43 ms at 48 kHz).
const MAX_PERIOD_US: u64 = 100_000;

impl FifoGate {
    fn new(cushion_us: u64, max_wait_us: u64, cap_us: u64) -> FifoGate {
        FifoGate {
            cushion_us,
            max_wait_us,
            cap_us,
            after_us: None,
            drained_at_us: None,
            period_us: 0,
            last_us: None,
        }
    }

    /// A block of `block_us` arrives at `now_us` with `level_us` of sound in the FIFO:
    /// whether to write it (else it is dropped).
    fn admit(&mut self, now_us: u64, level_us: u64, block_us: u64) -> bool {
        // (A block late by more than half its length leaves room for more than one period
        // taken meanwhile: that is a stall, not the reader's period, which would otherwise
        // raise the bound, and the delay, for good.)
        let on_time = self
            .last_us
            .is_some_and(|l| now_us.saturating_sub(l) <= block_us * 3 / 2);
        self.last_us = Some(now_us);
        if let Some(taken) = self.after_us.and_then(|a| a.checked_sub(level_us)) {
            if taken > 0 {
                self.drained_at_us = Some(now_us);
                if on_time {
                    self.period_us = self.period_us.max(taken.min(MAX_PERIOD_US));
                }
            }
        }
        let limit = if self.reading(now_us) {
            // (Never less than while nobody read: the period is not known at first.)
            self.max_wait_us
                .max(self.cushion_us + self.period_us.max(block_us) + block_us)
        } else {
            self.cushion_us + 2 * block_us
        };
        let admit = level_us < limit.max(block_us).min(self.cap_us.max(block_us));
        self.after_us = Some(level_us + if admit { block_us } else { 0 });
        admit
    }

    /// What a write (the prebuffer, or a block that did not all fit), or old sound taken out
    /// ([`FifoGate::stale_us`]), left in the FIFO: `level_us`, as read back.
    fn wrote(&mut self, level_us: u64) {
        self.after_us = Some(level_us);
    }

    /// Old sound to take out of the FIFO before the next block, µs: once no reader took any
    /// for its wait (a program that stopped recording, or one stalled longer than
    /// `max_wait_us`), what stands above the cushion, so the next program to record hears no
    /// more than the cushion of old sound (PipeWire's reader never takes more than it plays).
    fn stale_us(&self, now_us: u64, level_us: u64, block_us: u64) -> u64 {
        // (Above what admission while nobody reads lets in, so the FIFO is read from only
        // once a reader left more behind, not every few blocks.)
        if self.reading(now_us) || level_us <= self.cushion_us + 3 * block_us {
            return 0;
        }
        level_us - self.cushion_us
    }

    /// Whether a reader took sound lately: within `max_wait_us` of `now_us`, or four of its
    /// periods, or 200 ms (a reader's period apart, a writer's blocks are late or early).
    fn reading(&self, now_us: u64) -> bool {
        let within = self.max_wait_us.max(4 * self.period_us).max(200_000);
        self.drained_at_us
            .is_some_and(|t| now_us.saturating_sub(t) <= within)
    }
}

/// Whether every sample of a block of s16le PCM stays under [`QUIET_PEAK`].
fn quiet(pcm: &[u8]) -> bool {
    pcm.chunks_exact(2)
        .all(|c| i16::from_le_bytes([c[0], c[1]]).unsigned_abs() < QUIET_PEAK)
}

const HINT: &str = "start PulseAudio (or PipeWire's pipewire-pulse) for this user, e.g. \
                    `pulseaudio --start`, or give `server` (or PULSE_SERVER); `pactl info` \
                    shows what a program reaches";

fn unavailable(endpoint: &'static str, what: String) -> EndpointError {
    EndpointError::Unavailable {
        endpoint,
        what,
        hint: HINT.to_string(),
    }
}

/// Runs `pactl` (against `server` when given); its stdout, or why it failed.
fn pactl(server: &Option<String>, args: &[&str]) -> Result<String, String> {
    let mut c = Command::new("pactl");
    if let Some(s) = server {
        c.arg(format!("--server={s}"));
    }
    let out = c
        .args(args)
        .output()
        .map_err(|e| format!("cannot run pactl ({e}; Debian: apt-get install pulseaudio-utils)"))?;
    if !out.status.success() {
        return Err(format!(
            "pactl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A PulseAudio module this endpoint loaded (or took up from its last run): unloaded when
/// dropped, or, kept (`keep_s`), left loaded for that long so programs that use it keep it
/// across a restart of the side; the next run takes it back by its claim file.
#[derive(Debug, Clone)]
struct ModuleData {
    index: String,
    server: Option<String>,
    what: String,
    /// How long it stays, and the claim file that names its owner (`PID.N`: this process,
    /// and which of its claims).
    keep: Option<(Duration, PathBuf, String)>,
    /// The argument that names the device (`sink_name=NAME`): the delayed unload checks that
    /// the module at its index is still this one (a restarted server reuses indices).
    arg: String,
    /// A claim file this process wrote for a module it does not keep: removed with it.
    claimed: Option<PathBuf>,
    /// Loaded by this run (not taken up from the last).
    fresh: bool,
}

/// Claim files of the kept devices this process's endpoints hold now (`ndd serve` starts a
/// driver again in the same process: its new run takes up what its last one kept).
static HELD: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

fn held() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    HELD.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether a kept device whose claim names `pid` may be taken up by this process: its owner
/// is gone, or it is this process and none of its endpoints holds the device now.
fn free_to_take(pid: u32, claim_file: &std::path::Path) -> bool {
    if pid == std::process::id() {
        return !held().iter().any(|c| c == claim_file);
    }
    !alive(pid)
}

/// A loaded module, settled (unloaded or kept) when dropped, or by [`settle_modules`] as the
/// process ends, whichever comes first.
#[derive(Debug)]
struct Module {
    id: u64,
    /// Loaded by this run (not taken up from the last).
    fresh: bool,
}

/// The modules of this process not settled yet.
static LIVE: std::sync::Mutex<Vec<(u64, ModuleData)>> = std::sync::Mutex::new(Vec::new());

fn live() -> std::sync::MutexGuard<'static, Vec<(u64, ModuleData)>> {
    LIVE.lock().unwrap_or_else(|p| p.into_inner())
}

impl Module {
    fn live(data: ModuleData) -> Module {
        static IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let id = IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let fresh = data.fresh;
        live().push((id, data));
        Module { id, fresh }
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        let data = {
            let mut l = live();
            let at = l.iter().position(|(id, _)| *id == self.id);
            at.map(|i| l.remove(i).1)
        };
        if let Some(d) = data {
            d.settle();
        }
    }
}

/// Settles every PulseAudio module this process's endpoints still hold (unloaded, or kept for
/// `keep_s`): the side calls it as it ends, since an endpoint's thread still recording then
/// would not drop its modules before the process exits.
pub fn settle_modules() {
    let all: Vec<ModuleData> = live().drain(..).map(|(_, d)| d).collect();
    for d in all {
        d.settle();
    }
    // One an endpoint thread is settling right now is finished first.
    drop(SETTLING.lock().unwrap_or_else(|p| p.into_inner()));
}

/// Held while a module is settled: the process does not end in the middle of one
/// ([`settle_modules`] waits for it).
static SETTLING: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl ModuleData {
    fn settle(&self) {
        let _settling = SETTLING.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, claim, _)) = &self.keep {
            held().retain(|c| c != claim);
        }
        if let Some((keep, claim, token)) = &self.keep {
            match keep_loaded(&self.server, &self.index, &self.arg, claim, token, *keep) {
                Ok(()) => {
                    tracing::info!(what = %self.what, keep_s = keep.as_secs(), "PulseAudio {} kept for the side's next run", self.what);
                    return;
                }
                Err(e) => {
                    tracing::debug!(what = %self.what, "cannot keep the module: {e}; unloading it")
                }
            }
        }
        match pactl(&self.server, &["unload-module", &self.index]) {
            Ok(_) => {
                tracing::debug!(module = %self.index, what = %self.what, "PulseAudio module unloaded")
            }
            Err(e) => tracing::warn!(what = %self.what, "cannot unload PulseAudio module: {e}"),
        }
        if let Some(claim) = self.keep.as_ref().map(|k| &k.1).or(self.claimed.as_ref()) {
            let _ = std::fs::remove_file(claim);
        }
    }
}

/// Leaves module `index` loaded and starts a detached `sh` that unloads it after `keep`
/// unless a later run claimed it meanwhile (its claim file then names another process).
fn keep_loaded(
    server: &Option<String>,
    index: &str,
    arg: &str,
    claim: &std::path::Path,
    token: &str,
    keep: Duration,
) -> Result<(), String> {
    let quote_ok = |t: &str| !t.contains('\'');
    let claim_s = claim.display().to_string();
    let server_arg = match server {
        Some(s) if quote_ok(s) => format!("'--server={s}'"),
        Some(_) => return Err("a server string with a quote".into()),
        None => String::new(),
    };
    if !quote_ok(&claim_s)
        || !index.bytes().all(|b| b.is_ascii_digit())
        || !arg
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-:=".contains(&b))
    {
        return Err("an unexpected module index, name or claim path".into());
    }
    let script = format!(
        "sleep {secs}; [ \"$(cat '{claim_s}' 2>/dev/null)\" = {token} ] || exit 0; \
         pactl {server_arg} list short modules | grep -qE \"^{index}[[:space:]].*[[:space:]]{arg}( |\\$)\" \\
         && pactl {server_arg} unload-module {index}; rm -f '{claim_s}'",
        secs = keep.as_secs()
    );
    Command::new("setsid")
        .args(["-f", "sh", "-c", &script])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("cannot start setsid: {e}"))
        .and_then(|s| {
            if s.success() {
                Ok(())
            } else {
                Err(format!("setsid: {s}"))
            }
        })
}

/// The claim file of a kept device `name` of `kind` (`sink`, `source`) on `server`: it holds
/// the pid of the ndd process that owns it.
fn claim_path(server: &Option<String>, kind: &str, name: &str) -> PathBuf {
    // FNV-1a of the server string: one file per server and name.
    let h = server
        .as_deref()
        .unwrap_or("")
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    std::env::temp_dir().join(format!("ndd-pulse-{kind}-{:08x}-{name}.owner", h as u32))
}

/// The pid a claim file names, if it names one.
fn claimed_by(claim: &std::path::Path) -> Option<u32> {
    let text = std::fs::read_to_string(claim).ok()?;
    text.trim().split('.').next()?.parse().ok()
}

fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Writes this claim's token (`PID.N`) into a claim file; the token.
fn claim(claim: &std::path::Path) -> Result<String, String> {
    static CLAIMS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = CLAIMS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let token = format!("{}.{n}", std::process::id());
    std::fs::write(claim, &token).map_err(|e| format!("cannot write {}: {e}", claim.display()))?;
    Ok(token)
}

/// Loads a module and puts the server's default sink and source back as they were: a new
/// null sink or virtual source may otherwise become the default (PulseAudio prefers any real
/// source to a monitor), and streams that follow the default, this process's among them,
/// would move into it.
fn load(server: &Option<String>, what: &str, args: &[&str]) -> Result<ModuleData, String> {
    let defaults: Vec<(&str, Option<String>)> = ["sink", "source"]
        .into_iter()
        .map(|kind| {
            let d = pactl(server, &[&format!("get-default-{kind}")])
                .ok()
                .map(|d| d.trim().to_string())
                .filter(|d| !d.is_empty() && d != "@DEFAULT_SINK@");
            (kind, d)
        })
        .collect();
    let index = pactl(server, &[&["load-module"], args].concat())?
        .trim()
        .to_string();
    for (kind, old) in defaults {
        if let Some(old) = old {
            let now = pactl(server, &[&format!("get-default-{kind}")]).unwrap_or_default();
            if now.trim() != old {
                let _ = pactl(server, &[&format!("set-default-{kind}"), &old]);
            }
        }
    }
    tracing::debug!(module = %index, what, "PulseAudio module loaded");
    Ok(ModuleData {
        index,
        server: server.clone(),
        what: what.to_string(),
        keep: None,
        arg: String::new(),
        claimed: None,
        fresh: true,
    })
}

/// Whether `pactl list short KIND` names `name`.
fn exists(server: &Option<String>, kind: &str, name: &str) -> Result<bool, String> {
    Ok(pactl(server, &["list", "short", kind])?
        .lines()
        .any(|l| l.split('\t').nth(1) == Some(name)))
}

/// The loaded `module` whose arguments say `key=name`: its index and arguments.
fn module_named(
    server: &Option<String>,
    module: &str,
    key: &str,
    name: &str,
) -> Result<Option<(String, String)>, String> {
    let want = format!("{key}={name}");
    Ok(pactl(server, &["list", "short", "modules"])?
        .lines()
        .find_map(|line| {
            let mut f = line.split('\t');
            let (Some(index), Some(m), Some(args)) = (f.next(), f.next(), f.next()) else {
                return None;
            };
            (m == module && args.split(' ').any(|a| a == want))
                .then(|| (index.to_string(), args.to_string()))
        }))
}

/// A kept device's module, taken up by this run: `what` it is, `keep` for when this run ends.
fn take_up(
    server: &Option<String>,
    index: String,
    what: String,
    arg: String,
    claim_file: PathBuf,
    keep: Duration,
) -> Result<Module, String> {
    let token = claim(&claim_file)?;
    tracing::info!(module = %index, "took up the PulseAudio {what} kept since this side's last run");
    if !keep.is_zero() {
        held().push(claim_file.clone());
    }
    Ok(Module::live(ModuleData {
        index,
        server: server.clone(),
        what,
        arg,
        claimed: keep.is_zero().then(|| claim_file.clone()),
        keep: (!keep.is_zero()).then_some((keep, claim_file, token)),
        fresh: false,
    }))
}

/// A null sink `name` (programs play into it; its monitor is what they played): one this
/// side's last run kept is taken up; one that exists otherwise is used as it is.
fn null_sink(
    server: &Option<String>,
    name: &str,
    rate: u32,
    keep: Duration,
) -> Result<Option<Module>, String> {
    let claim_file = claim_path(server, "sink", name);
    let what = format!("null sink {name}");
    if exists(server, "sinks", name)? {
        let owner = claimed_by(&claim_file);
        if let (Some(pid), Some((index, _))) = (
            owner,
            module_named(server, "module-null-sink", "sink_name", name)?,
        ) {
            if free_to_take(pid, &claim_file) {
                let arg = format!("sink_name={name}");
                return take_up(server, index, what, arg, claim_file, keep).map(Some);
            }
        }
        tracing::info!(sink = name, "PulseAudio sink exists already; used as it is");
        return Ok(None);
    }
    let desc = format!("sink_properties=device.description=ndd:{name}");
    let mut m = load(
        server,
        &what,
        &[
            "module-null-sink",
            &format!("sink_name={name}"),
            // At the capture's rate: no resampling, no rate switch of the sink.
            &format!("rate={rate}"),
            &desc,
        ],
    )?;
    if !keep.is_zero() {
        let token = claim(&claim_file)?;
        held().push(claim_file.clone());
        m.keep = Some((keep, claim_file, token));
        m.arg = format!("sink_name={name}");
    }
    Ok(Some(Module::live(m)))
}

/// The pid of the ndd process whose FIFO (`file=…/ndd-pulse-PID[.N]{suffix}`) a
/// `module-pipe-source`'s arguments name.
fn fifo_owner(args: &str, suffix: &str) -> Option<u32> {
    args.split(' ')
        .find_map(|a| a.strip_prefix("file="))
        .and_then(|file| file.strip_suffix(suffix))
        .and_then(|f| f.rsplit("ndd-pulse-").next())
        .and_then(|pid_n| pid_n.split('.').next())
        .and_then(|pid| pid.parse::<u32>().ok())
}

/// A source `name` programs record from, fed through a FIFO this process writes
/// (`module-pipe-source`: what is written is recorded at once, at the writer's pace, with no
/// sink clock in between): the one an ndd that is no longer running left (this side's last
/// run, which kept it: programs recording from it go on) is taken up with its FIFO; else a
/// new one, unless a source of that name exists. The FIFO's path, the module.
fn virtual_source(
    server: &Option<String>,
    name: &str,
    rate: u32,
    channels: u8,
    keep: Duration,
) -> Result<(PathBuf, Option<Module>), String> {
    // Numbered per sink: two sinks of one process (on two servers) may name the same source.
    static SINKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let claim_file = claim_path(server, "source", name);
    let what = format!("source {name}");
    if let Some((index, args)) = module_named(server, "module-pipe-source", "source_name", name)? {
        let owner = claimed_by(&claim_file).or_else(|| fifo_owner(&args, &format!("-{name}.fifo")));
        let fifo = args
            .split(' ')
            .find_map(|a| a.strip_prefix("file="))
            .map(PathBuf::from);
        if let (Some(pid), Some(fifo)) = (owner, fifo) {
            if free_to_take(pid, &claim_file) && fifo.exists() {
                let arg = format!("source_name={name}");
                let m = take_up(server, index, what, arg, claim_file, keep)?;
                return Ok((fifo, Some(m)));
            }
        }
    }
    if exists(server, "sources", name)? {
        return Err(format!(
            "a PulseAudio source named {name} exists already (another ndd, or a leftover: \
             `pactl list short modules | grep {name}` and `pactl unload-module N`)"
        ));
    }
    let n = SINKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let fifo =
        std::env::temp_dir().join(format!("ndd-pulse-{}.{n}-{name}.fifo", std::process::id()));
    let _ = std::fs::remove_file(&fifo);
    let mut module = load(
        server,
        &what,
        &[
            "module-pipe-source",
            &format!("source_name={name}"),
            &format!("file={}", fifo.display()),
            "format=s16le",
            &format!("rate={rate}"),
            &format!("channels={channels}"),
            &format!("source_properties=device.description=ndd:{name}"),
        ],
    )?;
    if !keep.is_zero() {
        let token = claim(&claim_file)?;
        held().push(claim_file.clone());
        module.keep = Some((keep, claim_file, token));
        module.arg = format!("source_name={name}");
    }
    Ok((fifo, Some(Module::live(module))))
}

fn spec(rate: u32, channels: u8) -> Spec {
    Spec {
        format: Format::S16le,
        rate,
        channels,
    }
}

/// Starts a `pulse-capture` source: creates its virtual sink if asked, connects now (a
/// missing server or device fails here, at start).
pub(crate) fn spawn_pulse_capture(
    rt: &Handle,
    endpoint: &'static str,
    c: &PulseCaptureConfig,
    stream: u16,
    tx: Sender<Frame>,
) -> Result<SourceTask, EndpointError> {
    let mut modules = Vec::new();
    let device = match &c.virtual_sink {
        Some(name) => {
            modules.extend(
                null_sink(
                    &c.server,
                    name,
                    c.rate,
                    Duration::from_secs(u64::from(c.keep_s)),
                )
                .map_err(|e| unavailable(endpoint, e))?,
            );
            Some(format!("{name}.monitor"))
        }
        None => c.device.clone(),
    };
    let samples = c.block_samples() as usize;
    let block = samples * usize::from(c.channels) * 2;
    let attr = BufferAttr {
        maxlength: u32::MAX,
        tlength: u32::MAX,
        prebuf: u32::MAX,
        minreq: u32::MAX,
        fragsize: block as u32,
    };
    let pa = Simple::new(
        c.server.as_deref(),
        "ndd",
        Direction::Record,
        device.as_deref(),
        "ndd capture",
        &spec(c.rate, c.channels),
        None,
        Some(&attr),
    )
    .map_err(|e| {
        unavailable(
            endpoint,
            format!(
                "cannot record from PulseAudio source {}: {e}",
                device.as_deref().unwrap_or("(default)")
            ),
        )
    })?;
    // (Not a sink taken up from the last run: programs play into it.)
    if let (Some(name), true) = (&c.virtual_sink, modules.iter().any(|m| m.fresh)) {
        // A new null sink starts rendering in blocks of its longest latency (2 s) before any
        // stream asked for less; restarted now that this recording asks for short blocks, it
        // renders in those at once instead of stuttering for its first seconds.
        for on in ["1", "0"] {
            let _ = pactl(&c.server, &["suspend-sink", name, on]);
        }
    }
    tracing::info!(
        endpoint,
        source = device.as_deref().unwrap_or("(default)"),
        rate = c.rate,
        channels = c.channels,
        frame_ms = c.frame_ms,
        "recording"
    );
    let (rate, channels, max_wait_ms) = (c.rate, c.channels, c.max_wait_ms);
    Ok(rt.spawn_blocking(move || {
        let _modules = modules;
        let _priority = raise_priority(endpoint);
        let mut em = Emitter::new(stream, tx);
        let head = Block {
            codec: Codec::Pcm,
            rate,
            channels,
            samples: samples as u16,
            data: &[],
        };
        let block_ns = samples as u64 * 1_000_000_000 / u64::from(rate);
        // Sound older than this waiting in PulseAudio's buffer is flushed: a stall here, or
        // the burst an idle source delivers when it wakes, must not become a lasting delay.
        let stale_us = (3 * block_ns / 1000).max(u64::from(max_wait_ms) * 1000);
        let (mut flushed, mut flush_log) = (0u64, RateLimit::new(Duration::from_secs(5)));
        let mut clock = SampleClock::default();
        loop {
            if em.tx.is_closed() {
                break;
            }
            let mut frame = Frame::zeroed(
                em.next_meta(),
                ndd_core::frame::DEFAULT_HEADROOM,
                HEADER_LEN + block,
            );
            let p = frame.payload_mut();
            head.emit_header(p);
            pa.read(&mut p[HEADER_LEN..])
                .map_err(|e| EndpointError::Read {
                    endpoint,
                    what: "the PulseAudio recording".into(),
                    source: std::io::Error::other(format!("{e}")),
                })?;
            // Stamped with when its first sample was recorded: on the sample clock (blocks
            // exactly their length apart, as the sound was), anchored at the wall clock less
            // what still waits behind the block in PulseAudio's buffers, and anchored again
            // when the two part by more than `RESYNC` (a skip, a drifting sound card).
            let waiting_us = pa.get_latency().map_or(0, |l| l.0);
            let recorded = crate::clock::now_ns()
                .saturating_sub(waiting_us.saturating_mul(1000))
                .saturating_sub(block_ns);
            frame.meta.timestamp_ns = clock.stamp(recorded, block_ns);
            if waiting_us > stale_us {
                // This block and what waits behind it are old: neither is sent (a stale
                // timestamp would also make a jitter buffer hold everything after it that
                // much later).
                let _ = pa.flush();
                clock = SampleClock::default();
                flushed += 1;
                if let Some(suppressed) = flush_log.admit(Instant::now()) {
                    tracing::info!(
                        endpoint,
                        waited_ms = waiting_us / 1000,
                        flushed,
                        suppressed,
                        "recorded sound waited too long to be read; skipped to the present"
                    );
                }
                continue;
            }
            if !em.send_blocking(frame) {
                break;
            }
        }
        tracing::debug!(endpoint, stream, frames = em.report.frames, "source ended");
        Ok::<SourceReport, EndpointError>(em.report)
    }))
}

/// The sound waiting in a virtual source's FIFO `file`, µs at `rate` and `channels`.
fn fifo_level_us(file: &std::fs::File, rate: u32, channels: u8) -> u64 {
    pcm_us(
        rustix::io::ioctl_fionread(file).unwrap_or(0),
        rate,
        channels,
    )
}

/// How long `bytes` of s16le PCM at `rate` and `channels` play, µs.
fn pcm_us(bytes: u64, rate: u32, channels: u8) -> u64 {
    bytes * 1_000_000 / (u64::from(rate) * u64::from(channels) * 2).max(1)
}

/// Writes what fits of `data` into the non-blocking FIFO `file`; whether all of it did (the
/// rest is dropped: nobody reads the source).
fn write_fitting(file: &mut std::fs::File, data: &[u8]) -> std::io::Result<bool> {
    let mut rest = data;
    while !rest.is_empty() {
        match std::io::Write::write(file, rest) {
            Ok(n) => rest = &rest[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Where a `pulse-playback` sink's sound goes.
enum Out {
    /// A playback stream into a sink, opened with the first block's format.
    Stream(Option<(u32, u8, Simple)>),
    /// The FIFO of its virtual source (`rate`, `channels` fixed when it was made).
    Fifo(std::fs::File, u32, u8),
}

/// Starts a `pulse-playback` sink: creates its virtual source, or checks that the server
/// answers and has the sink (the playback stream opens with the first block's format).
pub(crate) fn spawn_pulse_playback(
    rt: &Handle,
    endpoint: &'static str,
    c: &PulsePlaybackConfig,
    rx: Receiver<Frame>,
    delivered: Delivered,
) -> Result<SinkTask, EndpointError> {
    let mut modules = Vec::new();
    let server = c.server.clone();
    let device = c.device.clone();
    let latency_ms = c.latency_ms;
    let max_wait_us = c.max_wait_ms.map(|ms| u64::from(ms) * 1000);
    let open = move |rate: u32, channels: u8| {
        let bytes_per_ms = u64::from(rate) * u64::from(channels) * 2 / 1000;
        let target = (bytes_per_ms * u64::from(latency_ms)).min(u64::from(u32::MAX)) as u32;
        let attr = BufferAttr {
            maxlength: u32::MAX,
            // Twice the target: the server asks for more once it holds under `target`, so a
            // writer held off the core for up to `latency_ms` is not heard. With `tlength` at
            // the target itself a tone came 0–5 ms sooner, but a loaded machine cut gaps into
            // the sound (a 660 Hz tone measured 664–668 Hz in 2 of 4 loaded runs).
            tlength: target.saturating_mul(2),
            prebuf: target,
            minreq: (bytes_per_ms * 5) as u32,
            fragsize: u32::MAX,
        };
        Simple::new(
            server.as_deref(),
            "ndd",
            Direction::Playback,
            device.as_deref(),
            "ndd playback",
            &spec(rate, channels),
            None,
            Some(&attr),
        )
    };
    // A virtual source's FIFO (`FifoGate`): `latency_ms` of cushion (at least
    // `MIN_CUSHION_US`), and up to `max_wait_ms` while a program records.
    let cushion_us = (u64::from(latency_ms) * 1000).max(MIN_CUSHION_US);
    let mut gate_cap_us = u64::MAX;
    // The FIFO's read end, to take old sound out of it (`FifoGate::stale_us`).
    let mut drain: Option<std::fs::File> = None;
    let (mut out, what) = match &c.virtual_source {
        Some(name) => {
            let (fifo, module) = virtual_source(
                &c.server,
                name,
                c.rate,
                c.channels,
                Duration::from_secs(u64::from(c.keep_s)),
            )
            .map_err(|e| unavailable(endpoint, e))?;
            modules.extend(module);
            // Non-blocking: when no program records from the source, the server does not read
            // the FIFO; sound is then dropped here (it is live) instead of blocking this sink
            // (a block is written only while less than one waits: see below, which also bounds
            // the old sound a program hears when it starts recording). The pipe holds 100 ms so
            // a block is never cut short: PipeWire's pipe source reads in chunks of its own
            // period, and with one page (42 ms of mono) every other 10 ms block lost its tail.
            // With `max_wait_ms` it holds that much more, so the gate, not a full pipe, is what
            // drops (a block cut short where the FIFO was full lost 5–10 ms of a tone).
            let file = std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&fifo)
                .map_err(|e| {
                    unavailable(endpoint, format!("cannot open {}: {e}", fifo.display()))
                })?;
            let bytes_per_s = u64::from(c.rate) * u64::from(c.channels) * 2;
            let want_us = max_wait_us
                .unwrap_or(0)
                .max(cushion_us + MAX_PERIOD_US + 50_000)
                + FIFO_MARGIN_US;
            let want = usize::try_from(bytes_per_s * want_us / 1_000_000).unwrap_or(usize::MAX);
            if rustix::pipe::fcntl_setpipe_size(&file, want.max(4096)).is_err() {
                // Over the system's limit (for a process without CAP_SYS_RESOURCE): its most.
                if let Some(most) = std::fs::read_to_string("/proc/sys/fs/pipe-max-size")
                    .ok()
                    .and_then(|m| m.trim().parse::<usize>().ok())
                {
                    let _ = rustix::pipe::fcntl_setpipe_size(&file, most.min(want));
                }
            }
            let holds_us = rustix::pipe::fcntl_getpipe_size(&file)
                .map_or(0, |b| b as u64 * 1_000_000 / bytes_per_s.max(1));
            if holds_us < want_us {
                let room = holds_us.saturating_sub(FIFO_MARGIN_US);
                tracing::warn!(endpoint, source = %name, holds_ms = holds_us / 1000,
                    "the virtual source's FIFO holds less than this sink asks; at most {} ms \
                     of sound waits in it (raise /proc/sys/fs/pipe-max-size, or lower \
                     max_wait_ms or latency_ms)", room / 1000);
                gate_cap_us = room;
            }
            drain = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&fifo)
                .ok();
            tracing::info!(endpoint, source = %name, rate = c.rate, channels = c.channels,
                "programs record from PulseAudio source {name}");
            (
                Out::Fifo(file, c.rate, c.channels),
                format!("virtual source {name}"),
            )
        }
        None => {
            // Fails here, at start, when there is no server or no such sink.
            let what = c.device.clone().unwrap_or_else(|| "(default)".into());
            drop(open(48_000, 2).map_err(|e| {
                unavailable(
                    endpoint,
                    format!("cannot play into PulseAudio sink {what}: {e}"),
                )
            })?);
            (Out::Stream(None), format!("sink {what}"))
        }
    };
    Ok(rt.spawn_blocking(move || {
        let _modules = modules;
        let _priority = raise_priority(endpoint);
        let mut rx = rx;
        let mut report = SinkReport::default();
        let mut bad = ndd_core::ratelimit::RateLimit::default();
        let mut late_log = ndd_core::ratelimit::RateLimit::new(std::time::Duration::from_secs(5));
        // The peer may change the format with every block (each reopens the stream).
        let mut reopened = ndd_core::ratelimit::RateLimit::with_burst(Duration::from_secs(1), 5);
        let mut late = 0u64;
        let mut catching_up = false;
        let mut standing = Standing::default();
        let mut standing_log = ndd_core::ratelimit::RateLimit::new(std::time::Duration::from_secs(5));
        let mut unheard = 0u64;
        let mut priming: Option<Vec<u8>> = Some(Vec::new());
        let mut gate = FifoGate::new(cushion_us, max_wait_us.unwrap_or(0), gate_cap_us);
        let started = std::time::Instant::now();
        while let Some(frame) = rx.blocking_recv() {
            report.frames += 1;
            report.bytes += frame.len() as u64;
            let block = match Block::parse(frame.payload()) {
                Ok(b) if b.codec == Codec::Pcm => b,
                Ok(b) => {
                    delivered.mark(frame.meta.seq);
                    return Err(EndpointError::Unavailable {
                        endpoint,
                        what: format!("an {} record reached the sink, which plays PCM", b.codec),
                        hint: "put the `opus` pair in the stream's stack (it decodes before \
                               the sink)"
                            .into(),
                    });
                }
                Err(e) => {
                    if let Some(suppressed) = bad.admit(std::time::Instant::now()) {
                        tracing::warn!(endpoint, seq = frame.meta.seq, suppressed, "bad audio record dropped: {e}");
                    }
                    delivered.mark(frame.meta.seq);
                    continue;
                }
            };
            // Live sound: never fall behind. Blocks that queued up (a burst from the other
            // side, a stall here) beyond the target latency are dropped, oldest first.
            let block_us = u64::from(block.samples) * 1_000_000 / u64::from(block.rate);
            let queued_us = rx.len() as u64 * block_us;
            if queued_us > (u64::from(latency_ms) + LATE_SLACK_MS) * 1000 {
                catching_up = true;
            }
            // Once behind, catch up all the way down to the target, not just under the limit.
            if catching_up && queued_us <= u64::from(latency_ms) * 1000 {
                catching_up = false;
            }
            // Sound standing in the queue (into a playback stream, whose write waits for
            // the server; a virtual source's FIFO has its own bound below).
            let pending = standing.to_drop;
            let stale = matches!(out, Out::Stream(_))
                && standing.drop_this(queued_us, block_us, || quiet(block.data));
            if pending == 0 && standing.to_drop > 0 {
                if let Some(suppressed) = standing_log.admit(std::time::Instant::now()) {
                    tracing::info!(endpoint, blocks = standing.to_drop, suppressed,
                        "sound stood in the queue for half a second; taking it out of the next quiet blocks");
                }
            }
            if catching_up || stale {
                late += 1;
                if let Some(suppressed) = late_log.admit(std::time::Instant::now()) {
                    tracing::info!(endpoint, dropped = late, suppressed, queued = rx.len(),
                        "sound blocks arrived faster than they play; dropping the oldest to keep the latency");
                }
                delivered.mark(frame.meta.seq);
                continue;
            }
            let write_err = |e: String| EndpointError::Write {
                endpoint,
                what: format!("PulseAudio {what}"),
                source: std::io::Error::other(e),
            };
            match &mut out {
                Out::Fifo(file, rate, channels) => {
                    if (block.rate, block.channels) != (*rate, *channels) {
                        delivered.mark(frame.meta.seq);
                        return Err(EndpointError::Config {
                            endpoint,
                            param: "rate",
                            reason: format!(
                                "the sound arrives as {} Hz, {} channel(s); the virtual source \
                                 was made for {rate} Hz, {channels}: give `rate` and `channels` \
                                 the capture's values",
                                block.rate, block.channels
                            ),
                        });
                    }
                    // The gate (`FifoGate`) says whether this block may wait behind what the
                    // FIFO holds: PipeWire's pipe source reads it only as fast as it plays, so
                    // what waits there stays as delay.
                    let fifo_us = fifo_level_us(file, *rate, *channels);
                    // The first `latency_ms` of sound go into the FIFO at once, as a playback
                    // stream's prebuffer: the cushion that lets a reader's periods find their
                    // sound however the blocks fall between them, and a writer held off the
                    // core for less than that never leave the reader without sound.
                    if let Some(p) = priming.as_mut() {
                        p.extend_from_slice(block.data);
                        let have_us = pcm_us(p.len() as u64, *rate, *channels);
                        delivered.mark(frame.meta.seq);
                        if have_us < cushion_us.min(gate_cap_us) {
                            continue;
                        }
                        if !write_fitting(file, p).map_err(|e| write_err(e.to_string()))? {
                            unheard += 1;
                        }
                        gate.wrote(fifo_level_us(file, *rate, *channels));
                        priming = None;
                        continue;
                    }
                    let now_us = started.elapsed().as_micros() as u64;
                    let mut fifo_us = fifo_us;
                    let stale_us = gate.stale_us(now_us, fifo_us, block_us);
                    if let (true, Some(d)) = (stale_us > 0, drain.as_mut()) {
                        let frame_bytes = u64::from(*channels) * 2;
                        let bytes = stale_us * u64::from(*rate) / 1_000_000 * frame_bytes;
                        let mut buf = vec![0u8; usize::try_from(bytes).unwrap_or(0)];
                        let _ = std::io::Read::read(d, &mut buf);
                        fifo_us = fifo_level_us(file, *rate, *channels);
                        gate.wrote(fifo_us);
                        tracing::debug!(endpoint, stale_ms = stale_us / 1000,
                            "nobody recorded from the virtual source for a while; took its old sound out");
                    }
                    if !gate.admit(now_us, fifo_us, block_us) {
                        if !gate.reading(now_us) {
                            // Nobody records: live sound is dropped (see `FifoGate`).
                            unheard += 1;
                            delivered.mark(frame.meta.seq);
                            continue;
                        }
                        late += 1;
                        if let Some(suppressed) = late_log.admit(std::time::Instant::now()) {
                            tracing::info!(endpoint, dropped = late, suppressed, fifo_us,
                                "the virtual source's FIFO holds as much as may wait; dropping this block");
                        }
                        delivered.mark(frame.meta.seq);
                        continue;
                    }
                    // What fits; the rest is dropped when no program reads (see above).
                    if !write_fitting(file, block.data).map_err(|e| write_err(e.to_string()))? {
                        unheard += 1;
                        gate.wrote(fifo_level_us(file, *rate, *channels));
                    }
                }
                Out::Stream(pa) => {
                    if pa.as_ref().is_none_or(|(r, ch, _)| (*r, *ch) != (block.rate, block.channels)) {
                        if let Some((_, _, old)) = pa.take() {
                            let _ = old.drain();
                        }
                        let s = open(block.rate, block.channels).map_err(|e| {
                            unavailable(endpoint, format!("cannot play into PulseAudio {what}: {e}"))
                        })?;
                        if let Some(suppressed) = reopened.admit(std::time::Instant::now()) {
                            tracing::info!(endpoint, sink = %what, rate = block.rate, channels = block.channels, suppressed, "playing");
                        }
                        *pa = Some((block.rate, block.channels, s));
                    }
                    if let Some((_, _, s)) = pa {
                        s.write(block.data).map_err(|e| write_err(format!("{e}")))?;
                    }
                }
            }
            delivered.mark(frame.meta.seq);
        }
        if let Out::Stream(Some((_, _, s))) = out {
            let _ = s.drain();
        }
        tracing::debug!(endpoint, frames = report.frames, dropped_late = late, unheard, "sink ended");
        Ok::<SinkReport, EndpointError>(report)
    }))
}

/// This sound thread at a sound server's priority while it runs, if the system allows it
/// ([`crate::common::priority`]).
fn raise_priority(endpoint: &str) -> Option<crate::common::priority::Raised> {
    use crate::common::priority::{raise, SOUND_NICE};
    let raised = raise(SOUND_NICE);
    match &raised {
        Some(_) => tracing::debug!(endpoint, nice = SOUND_NICE, "sound thread at a raised priority"),
        None => tracing::debug!(
            endpoint,
            "sound thread at the normal priority (raising it needs root, CAP_SYS_NICE or an RLIMIT_NICE of at least 31)"
        ),
    }
    raised
}

#[cfg(test)]
mod tests {
    use super::{fifo_owner, FifoGate, SampleClock, Standing, STANDING_WINDOW_US};

    /// Plays `blocks` 10 ms blocks through `Standing` with the queue behind each at
    /// `level(i, dropped so far)` blocks; the indices it drops.
    fn dropped(blocks: usize, level: impl Fn(usize, usize) -> u64) -> Vec<usize> {
        dropped_in(blocks, |_| true, level)
    }

    /// As `dropped`, with `quiet(i)` saying whether block `i` is quiet.
    fn dropped_in(
        blocks: usize,
        quiet: impl Fn(usize) -> bool,
        level: impl Fn(usize, usize) -> u64,
    ) -> Vec<usize> {
        let mut st = Standing::default();
        let mut out = Vec::new();
        for i in 0..blocks {
            if st.drop_this(level(i, out.len()) * 10_000, 10_000, || quiet(i)) {
                out.push(i);
            }
        }
        out
    }

    #[test]
    fn a_queue_that_stands_is_taken_out_after_one_window_and_then_left_alone() {
        // Ten blocks queued once (a start's burst), at the rate they play from then on: each
        // dropped block lowers the level by one.
        let got = dropped(300, |_, d| 10u64.saturating_sub(d as u64));
        let window = (STANDING_WINDOW_US / 10_000) as usize;
        assert_eq!(got, (window..window + 10).collect::<Vec<_>>());
    }

    #[test]
    fn jitter_that_empties_the_queue_now_and_then_costs_nothing() {
        // Up to 8 blocks queued by a jittery link, but the queue runs dry once a window.
        let got = dropped(1000, |i, _| if i % 37 == 0 { 0 } else { (i % 9) as u64 });
        assert_eq!(got, Vec::<usize>::new());
        // Two blocks that never leave: taken out once, and only them.
        let got = dropped(1000, |i, d| {
            2u64.saturating_sub(d as u64) + (i % 5 != 0) as u64 * 3
        });
        assert_eq!(got.len(), 2, "{got:?}");
    }

    #[test]
    fn standing_delay_waits_for_quiet_and_not_forever() {
        let stands = |_, d: usize| 10u64.saturating_sub(d as u64);
        // A tone from block 40 to 200: the ten blocks go once it ends, none of the tone.
        let got = dropped_in(400, |i| !(40..200).contains(&i), stands);
        assert_eq!(got, (200..210).collect::<Vec<_>>());
        // Sound that never pauses: after the grace, from the sound itself.
        let got = dropped_in(1200, |_| false, stands);
        let grace = (super::STANDING_GRACE_US / 10_000) as usize;
        assert_eq!(got, (50 + grace..60 + grace).collect::<Vec<_>>());
    }

    #[test]
    fn a_block_is_quiet_when_every_sample_is_under_the_threshold() {
        let pcm = |v: &[i16]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        assert!(super::quiet(&pcm(&[0, 5, -127, 100])));
        assert!(!super::quiet(&pcm(&[0, 5, -128, 100])));
        assert!(!super::quiet(&pcm(&[i16::MIN])));
        assert!(super::quiet(&[]));
    }

    #[test]
    fn a_leftover_fifo_names_its_process_in_either_form() {
        let args = |file: &str| {
            format!("source_name=ndd_mic file={file} format=s16le rate=48000 channels=1")
        };
        let suffix = "-ndd_mic.fifo";
        assert_eq!(
            fifo_owner(&args("/tmp/ndd-pulse-4242.3-ndd_mic.fifo"), suffix),
            Some(4242)
        );
        assert_eq!(
            fifo_owner(&args("/tmp/ndd-pulse-4242-ndd_mic.fifo"), suffix),
            Some(4242)
        );
        assert_eq!(
            fifo_owner(&args("/tmp/ndd-pulse-4242.3-other.fifo"), suffix),
            None
        );
        assert_eq!(fifo_owner(&args("/tmp/something-else.fifo"), suffix), None);
        assert_eq!(fifo_owner("source_name=ndd_mic", suffix), None);
    }

    #[test]
    fn the_sample_clock_keeps_blocks_their_length_apart_and_follows_real_jumps() {
        let mut c = SampleClock::default();
        let ms = 1_000_000;
        // Recording times that wobble by a few ms: the stamps do not.
        let got: Vec<u64> = [1000, 1013, 1018, 1031, 1040]
            .iter()
            .map(|t| c.stamp(t * ms, 10 * ms))
            .collect();
        assert_eq!(got, [1000 * ms, 1010 * ms, 1020 * ms, 1030 * ms, 1040 * ms]);
        // Half a second of sound skipped: anchored again.
        assert_eq!(c.stamp(1550 * ms, 10 * ms), 1550 * ms);
        assert_eq!(c.stamp(1561 * ms, 10 * ms), 1560 * ms);
    }

    /// What a virtual source's FIFO did under a [`FifoGate`].
    #[derive(Debug)]
    struct FifoRun {
        /// Blocks dropped (indices), and those among them that arrived once a reader read.
        dropped: Vec<usize>,
        dropped_reading: Vec<usize>,
        /// Sound a read found missing after the reader's first read and the prebuffer, µs (a
        /// gap it hears; before the prebuffer it hears the silence before the sound).
        missing_us: u64,
        /// The level when the reader started, and the highest level.
        at_start_us: u64,
        highest_us: u64,
        /// The level after each block (its arrival, µs), and old sound taken out
        /// ([`FifoGate::stale_us`]), µs.
        levels: Vec<(u64, u64)>,
        trimmed_us: u64,
    }

    impl FifoRun {
        /// The highest level after a block that came from `from` µs on.
        fn highest_from(&self, from: u64) -> u64 {
            self.levels
                .iter()
                .filter(|(t, _)| *t >= from)
                .map(|(_, l)| *l)
                .max()
                .unwrap_or(0)
        }
    }

    const BLOCK_US: u64 = 10_000;
    /// PipeWire's period at 1024 samples of 48 kHz.
    const PERIOD_US: u64 = 21_333;

    /// 10 ms blocks arriving at `arrive(i)` µs go through `gate` into a FIFO that, from
    /// `reads_from` to `reads_until` µs, a reader takes a period at a time, as fast as it
    /// plays, as PipeWire's pipe source does (nothing during `stall`: those periods are gone,
    /// as a stalled graph's are). The first `prime_us` of sound go in at once, as the sink's
    /// prebuffer does.
    fn fifo_run(
        gate: &mut FifoGate,
        arrive: &[u64],
        prime_us: u64,
        (reads_from, reads_until): (u64, u64),
        stall: (u64, u64),
    ) -> FifoRun {
        let mut run = FifoRun {
            dropped: Vec::new(),
            dropped_reading: Vec::new(),
            missing_us: 0,
            at_start_us: 0,
            highest_us: 0,
            levels: Vec::new(),
            trimmed_us: 0,
        };
        let (mut level, mut primed, mut next_read, mut first_read) = (0u64, 0u64, reads_from, true);
        for (i, &t) in arrive.iter().enumerate() {
            while next_read <= t && next_read < reads_until {
                if !(stall.0..stall.1).contains(&next_read) {
                    if first_read {
                        run.at_start_us = level;
                        first_read = false;
                    } else if primed >= prime_us {
                        run.missing_us += PERIOD_US.saturating_sub(level);
                    }
                    level = level.saturating_sub(PERIOD_US);
                }
                next_read += PERIOD_US;
            }
            if primed < prime_us {
                primed += BLOCK_US;
                if primed >= prime_us {
                    level += primed;
                    gate.wrote(level);
                }
                continue;
            }
            // Old sound taken out, as the sink does through the FIFO's read end.
            let stale = gate.stale_us(t, level, BLOCK_US);
            if stale > 0 {
                level -= stale;
                gate.wrote(level);
                run.trimmed_us += stale;
            }
            let admitted = gate.admit(t, level, BLOCK_US);
            if admitted {
                level += BLOCK_US;
                run.highest_us = run.highest_us.max(level);
            }
            run.levels.push((t, level));
            if !admitted {
                run.dropped.push(i);
                if !first_read && t < reads_until {
                    run.dropped_reading.push(i);
                }
            }
        }
        run
    }

    /// `n` blocks 10 ms apart on average, arriving late by up to `jitter_us` (so some in
    /// bursts), in order; deterministic for a `seed`.
    fn arrivals(n: usize, jitter_us: u64, seed: u64) -> Vec<u64> {
        let mut x = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let mut last = 0;
        (0..n as u64)
            .map(|i| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let t = (i * BLOCK_US + (x >> 33) % (jitter_us + 1)).max(last);
                last = t;
                t
            })
            .collect()
    }

    #[test]
    fn a_virtual_source_nobody_records_keeps_its_cushion_and_a_late_reader_loses_nothing() {
        // `max_wait_ms = 1000`, `latency_ms = 100`: six seconds of sound with up to 30 ms of
        // jitter, a program recording from 2 s on, and one stalled for 500 ms at 4 s.
        for seed in 0..50 {
            let mut gate = FifoGate::new(100_000, 1_000_000, u64::MAX);
            let arrive = arrivals(600, 30_000, seed);
            let run = fifo_run(
                &mut gate,
                &arrive,
                100_000,
                (2_000_000, u64::MAX),
                (4_000_000, 4_500_000),
            );
            // While nobody read, the FIFO kept the cushion (what the reader hears first),
            // not a second of stale sound; with the reader, nothing dropped, no gap after
            // the first read, and the stall held in the FIFO.
            assert!(run.at_start_us <= 130_000, "seed {seed}: {run:?}");
            assert!(run.at_start_us >= 90_000, "seed {seed}: {run:?}");
            assert!(!run.dropped.is_empty(), "seed {seed}: {run:?}");
            assert_eq!(
                run.dropped_reading,
                Vec::<usize>::new(),
                "seed {seed}: {run:?}"
            );
            assert_eq!(run.missing_us, 0, "seed {seed}: {run:?}");
            assert!(run.highest_us >= 500_000, "seed {seed}: {run:?}");
        }
    }

    #[test]
    fn a_reader_that_goes_away_leaves_the_cushion_for_the_next_one() {
        // A program records from 0.5 s to 2 s and stops: up to `max_wait_ms` (1 s) waits
        // for it, then what stands above the cushion is taken out, so a program that starts
        // later hears no more than the cushion of old sound (not a second of it, for good).
        let mut gate = FifoGate::new(100_000, 1_000_000, u64::MAX);
        let arrive = arrivals(800, 0, 1);
        let run = fifo_run(&mut gate, &arrive, 100_000, (500_000, 2_000_000), (0, 0));
        assert!(run.highest_us <= 1_010_000, "{run:?}");
        assert!(run.highest_from(2_000_000) >= 900_000, "{run:?}");
        assert!(run.highest_from(3_300_000) <= 130_000, "{run:?}");
        assert!(run.trimmed_us >= 800_000, "{run:?}");
        assert!(
            run.dropped
                .iter()
                .all(|&i| arrive[i] < 500_000 || arrive[i] >= 2_000_000),
            "{run:?}"
        );
    }

    #[test]
    fn a_stalled_writer_does_not_pass_for_a_longer_period() {
        // Blocks held up 100 ms (the link, the machine), then all at once: the reader took
        // five periods meanwhile, which is not its period; the bound, and so the delay the
        // burst may leave, stays at the cushion, a period and a block.
        let mut gate = FifoGate::new(40_000, 0, u64::MAX);
        let mut arrive = arrivals(300, 0, 5);
        for t in arrive.iter_mut().skip(150) {
            *t = (*t).max(1_600_000);
        }
        let run = fifo_run(&mut gate, &arrive, 40_000, (0, u64::MAX), (0, 0));
        assert!(gate.period_us <= PERIOD_US + 1_000, "{gate:?}");
        let most = 40_000 + PERIOD_US + 2 * BLOCK_US;
        assert!(run.highest_from(1_600_000) <= most, "{run:?}");
    }

    #[test]
    fn by_default_a_reader_finds_its_periods_and_little_else_waits() {
        // No `max_wait_ms` (the cushion `MIN_CUSHION_US`, written at once): a reader that
        // takes everything at once (PulseAudio's) loses nothing; PipeWire's, a 1024-sample
        // period at a time, from the start or from later, with blocks up to 15 ms late, finds
        // each period whole, with at most the cushion, a period and three blocks waiting. (A bound of one block and no
        // cushion, as before, lost half the sound to it: a 440 Hz tone came through as
        // 240 Hz; a 30 ms cushion left a period 1–3 ms short now and then.)
        let cushion = super::MIN_CUSHION_US;
        let mut gate = FifoGate::new(cushion, 0, u64::MAX);
        gate.wrote(cushion);
        for i in 0..300u64 {
            assert!(gate.admit(i * BLOCK_US, 0, BLOCK_US));
        }
        for seed in 0..20 {
            for reads_from in [0, 500_000] {
                let mut gate = FifoGate::new(cushion, 0, u64::MAX);
                let arrive = arrivals(300, 15_000, seed);
                let run = fifo_run(&mut gate, &arrive, cushion, (reads_from, u64::MAX), (0, 0));
                assert_eq!(run.missing_us, 0, "seed {seed}: {run:?}");
                assert_eq!(
                    run.dropped_reading,
                    Vec::<usize>::new(),
                    "seed {seed}: {run:?}"
                );
                assert!(
                    run.at_start_us <= cushion + 3 * BLOCK_US,
                    "seed {seed}: {run:?}"
                );
                let most = cushion + PERIOD_US + 3 * BLOCK_US;
                assert!(run.highest_us <= most, "seed {seed}: {run:?}");
            }
        }
    }

    #[test]
    fn the_fifo_never_waits_past_what_it_holds() {
        let mut gate = FifoGate::new(100_000, 1_000_000, 300_000);
        let arrive = arrivals(300, 0, 3);
        let run = fifo_run(&mut gate, &arrive, 100_000, (u64::MAX, u64::MAX), (0, 0));
        assert!(run.highest_us <= 130_000, "{run:?}");
        let mut gate = FifoGate::new(100_000, 1_000_000, 300_000);
        let run = fifo_run(&mut gate, &arrive, 100_000, (200_000, 400_000), (0, 0));
        assert!(run.highest_us <= 310_000, "{run:?}");
    }
}

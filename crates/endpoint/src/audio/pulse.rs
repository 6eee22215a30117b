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
            let file = std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&fifo)
                .map_err(|e| {
                    unavailable(endpoint, format!("cannot open {}: {e}", fifo.display()))
                })?;
            let pipe_bytes = c.rate as usize * usize::from(c.channels) * 2 / 10;
            let _ = rustix::pipe::fcntl_setpipe_size(&file, pipe_bytes.max(4096));
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
        let mut priming: Option<Vec<u8>> = max_wait_us.map(|_| Vec::new());
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
                    // A server that reads the FIFO at its own pace (PipeWire's pipe source
                    // takes what each period needs, no more) keeps whatever queued there, and
                    // the level it had when a program started recording stays as delay: a
                    // block is dropped while a whole block or more still waits in the FIFO,
                    // so the level settles under one block (PulseAudio reads eagerly: it
                    // never comes to this). `max_wait_ms` lets more wait, for whole sound
                    // through a reader that stalls.
                    let fifo_us = rustix::io::ioctl_fionread(&*file).unwrap_or(0) * 1_000_000
                        / (u64::from(*rate) * u64::from(*channels) * 2).max(1);
                    let bound_us = max_wait_us.map_or(block_us, |m| m.max(block_us));
                    // Whole sound (`max_wait_ms`): the first `latency_ms` of it go into the
                    // FIFO at once, as a playback stream's prebuffer, so a writer held off the
                    // core for less than that never leaves the reader without sound.
                    if let Some(p) = priming.as_mut() {
                        p.extend_from_slice(block.data);
                        let have_us = p.len() as u64 * 1_000_000
                            / (u64::from(*rate) * u64::from(*channels) * 2).max(1);
                        delivered.mark(frame.meta.seq);
                        if have_us < u64::from(latency_ms) * 1000 {
                            continue;
                        }
                        if !write_fitting(file, p).map_err(|e| write_err(e.to_string()))? {
                            unheard += 1;
                        }
                        priming = None;
                        continue;
                    }
                    if fifo_us >= bound_us {
                        late += 1;
                        if let Some(suppressed) = late_log.admit(std::time::Instant::now()) {
                            tracing::info!(endpoint, dropped = late, suppressed, fifo_us,
                                "a block of sound still waits in the virtual source's FIFO; dropping this one");
                        }
                        delivered.mark(frame.meta.seq);
                        continue;
                    }
                    // What fits; the rest is dropped when no program reads (see above).
                    if !write_fitting(file, block.data).map_err(|e| write_err(e.to_string()))? {
                        unheard += 1;
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
    use super::{fifo_owner, SampleClock, Standing, STANDING_WINDOW_US};

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
}

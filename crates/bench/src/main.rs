//! `ndd-bench` (what `ndd bench …` runs): the dissertation's Chapter 6 measurements, each next
//! to a raw baseline measured in the same run. Results go to `docs/bench/` as markdown (and
//! SVG where a plot helps). A program of its own, so the production `ndd` binary carries no
//! benchmark or test-support crate (`ndd-testkit`, `ndd-procs`); it runs the `ndd` binary
//! beside it for the benchmarks that need real processes.

mod audio;
mod display;
mod e2e;
mod fanout;
mod frames;
mod jitter;
mod links;
mod mixed;
mod pairs;
mod peers;
mod placement;
mod player;
mod raw_link;
mod soak;
mod vnc;

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use hdrhistogram::Histogram;
use std::path::{Path, PathBuf};

/// Which benchmark.
#[derive(Debug, Subcommand)]
pub enum BenchCmd {
    /// Mouth-to-ear latency of the audio stream on a private PulseAudio daemon: a click train
    /// played into the device side's microphone, heard by `pacat --record` on both ends, next
    /// to PulseAudio's own module-loopback; writes audio.md.
    Audio {
        /// A short run (CI smoke test): 4 clicks per row.
        #[arg(long)]
        quick: bool,
        /// Directory for audio.md.
        #[arg(long, value_name = "DIR", default_value = "docs/bench")]
        out: PathBuf,
    },
    /// One listener, many peers: 32 device sides with a 1 kHz input stream each into one app
    /// side (`link.peers = 32`), beside one device side and beside 32 app side processes in
    /// the same run: one-way p50/p99 and CPU; writes peers.md.
    Peers {
        /// A short run (CI smoke test): 4 device sides, 2 s.
        #[arg(long)]
        quick: bool,
        /// Directory for peers.md.
        #[arg(long, value_name = "DIR", default_value = "docs/bench")]
        out: PathBuf,
    },
    /// One device side to 1, 4 and 16 app sides through a private nats-server: an input-like
    /// stream (64 B at 1 kHz, lossy) and a bulk one (100 KB at 30/s, reliable on JetStream),
    /// one-way p50/p99 per app side and aggregate throughput, next to raw async-nats
    /// publish/subscribe and the direct TLS link; then a shared screen (camera-sim through
    /// `image` in broadcast) to 1 and 4 viewers; writes fanout.md and fanout.svg.
    Fanout {
        /// A short run (CI smoke test): 1 and 4 app sides, 1.5 s per row.
        #[arg(long)]
        quick: bool,
        /// On a cluster of three nats-servers (routes, JetStream keeping three replicas),
        /// raw async-nats and raw JetStream on the same cluster; writes fanout-cluster.md.
        #[arg(long)]
        cluster: bool,
        /// Directory for fanout.md.
        #[arg(long, value_name = "DIR", default_value = "docs/bench")]
        out: PathBuf,
    },
    /// The display stream (x11-screen → x11-window on a second Xvfb) with ffplay playing a
    /// test pattern at 320x240, 640x480 and 1280x720: fps, MB/s and rects per update next to
    /// full-screen ShmGetImage/GetImage and memcpy, and compress on the wire; writes display.md.
    ///
    /// With --vs-vnc: seed 000's metrics against TigerVNC (Xtigervnc + vncviewer) on real
    /// peers: fps at the viewer (DAMAGE), CPU-limited fps, Mbit per frame, quality on still
    /// content and key-to-echo time, over 0 ms, 50 ms and 50 ms + 20 Mbit/s; writes
    /// display-vnc.md and display-vnc.svg.
    Display {
        /// A short run (CI smoke test): 320x240 only, about 2 s; with --vs-vnc one workload
        /// and one network.
        #[arg(long)]
        quick: bool,
        /// Compare ndd's remote desktop with TigerVNC instead.
        #[arg(long)]
        vs_vnc: bool,
        /// With --vs-vnc: shape the rate in the proxy, not with `tc tbf` on a veth pair to a
        /// network namespace (which needs root, ip and tc; used when available).
        #[arg(long)]
        no_netns: bool,
        /// With --vs-vnc: measure only the key → echo rows, with this many keys per row
        /// (the full run types 12; the typing race is close, more keys settle it).
        #[arg(long, value_name = "N")]
        typing_only: Option<usize>,
        /// With --vs-vnc: measure only this workload's frame-rate rows (the three networks),
        /// 20 s per row, into display-vnc-WORKLOAD.md (the full report is left as it is).
        #[arg(long, value_name = "WORKLOAD", conflicts_with = "typing_only")]
        workload: Option<vnc::Workload>,
        /// With --vs-vnc: the screen size of both peers, WxH (e.g. 1920x1080).
        #[arg(long, value_name = "WxH", default_value = "800x600", value_parser = parse_size)]
        size: (u16, u16),
        /// With --vs-vnc: the peers to measure, in order (xpra needs `xpra python3-gi-cairo
        /// python3-pil`, FreeRDP `freerdp2-shadow-x11 freerdp2-x11`).
        #[arg(
            long,
            value_name = "LIST",
            value_delimiter = ',',
            default_value = "tigervnc,ndd"
        )]
        peers: Vec<vnc::PeerName>,
        /// With --vs-vnc: measure each frame-rate row N times in a row (ndd's tiles and Q92
        /// variants are left out), and report the worst and the median of each.
        #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
        repeat: u32,
        /// Directory for display.md.
        #[arg(long, value_name = "DIR", default_value = "docs/bench")]
        out: PathBuf,
    },
    /// Tables 6.1/6.2: one-way time across the loopback link (TLS and --insecure) and
    /// source-to-network-ready time on one machine, by message size; next to raw TCP
    /// ping-pong and a raw memcpy.
    E2e {
        /// A short run (CI smoke test): fewer frames per size.
        #[arg(long)]
        quick: bool,
        /// Directory for e2e.md.
        #[arg(long, value_name = "DIR", default_value = "docs/bench")]
        out: PathBuf,
        /// Links to measure in (a), comma-separated (all four: tcp,tls,quic,udp).
        #[arg(long, value_enum, value_delimiter = ',', default_value = "tcp,tls")]
        link: Vec<e2e::LinkChoice>,
    },
    /// Figures 6.12/6.14: spacing error under 5–200 ms of jitter for a bare stack, buffer
    /// and bundle, in virtual time; writes jitter.md and jitter.svg.
    Jitter {
        /// A short run (CI smoke test): 200 frames per level instead of 1000.
        #[arg(long)]
        quick: bool,
        /// Directory for jitter.md and jitter.svg.
        #[arg(long, value_name = "DIR", default_value = "docs/bench")]
        out: PathBuf,
    },
    /// One-way time and 1 MB throughput by link (TCP, TLS, QUIC, UDP) next to raw TCP/UDP;
    /// writes links.md.
    Links {
        /// A short run (CI smoke test).
        #[arg(long)]
        quick: bool,
        /// Instead: a small stream's one-way time alone and beside a saturating bulk stream,
        /// ndd (in-flight window as shipped, and unbounded) next to raw TCP; writes
        /// links-mixed.md.
        #[arg(long)]
        mixed: bool,
        /// Directory for links.md.
        #[arg(long, value_name = "DIR", default_value = "docs/bench")]
        out: PathBuf,
    },
    /// Tables 6.2, 6.8/6.9, 6.12–6.14: module placement (in process, pipe, shared memory)
    /// by message size and module count, and the shm slot-count experiment; writes
    /// placement.md and placement.svg. Process rows need `ndd-ipc-upper` beside `ndd`.
    Placement {
        /// A short run (CI smoke test).
        #[arg(long)]
        quick: bool,
        /// Directory for placement.md.
        #[arg(long, value_name = "DIR", default_value = "docs/bench")]
        out: PathBuf,
    },
    /// Seed 001 Table 1: time per VNC update vs one-way latency (0–300 ms), unmodified vs
    /// through the RFB Message Accelerator, with a real Xvnc server; writes rfb.md and rfb.svg.
    Rfb {
        /// A short run (CI smoke test): 0, 100 and 300 ms, fewer updates.
        #[arg(long)]
        quick: bool,
        /// Directory for rfb.md and rfb.svg.
        #[arg(long, value_name = "DIR", default_value = "docs/bench")]
        out: PathBuf,
    },
    /// Two real `ndd run` processes for N minutes with a device-rate mix (1 kHz × 64 B
    /// input, 30 fps × 100 KB display-like, a serial-like stream back) through a proxy that
    /// cuts the link every minute: RSS, open fds and frames delivered per minute, the check
    /// sinks' verdicts at the end; writes soak.md.
    Soak {
        /// A short run (CI smoke test): one minute, a cut every 20 s.
        #[arg(long)]
        quick: bool,
        /// How long the sources run.
        #[arg(long, default_value_t = 10)]
        minutes: u64,
        /// Directory for soak.md.
        #[arg(long, value_name = "DIR", default_value = "docs/bench")]
        out: PathBuf,
    },
    /// Throughput (GB/s) of each pair's forward and inverse half on 1 KB, 64 KB and 1 MB
    /// frames, next to memcpy.
    Pairs {
        /// A short run (CI smoke test).
        #[arg(long)]
        quick: bool,
        /// Directory for pairs.md.
        #[arg(long, value_name = "DIR", default_value = "docs/bench")]
        out: PathBuf,
    },
}

pub(crate) const SIZES: [usize; 5] = [100, 1_000, 10_000, 100_000, 1_000_000];

pub(crate) fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("static bounds")
}

/// p50 and p99 of a histogram of ns, in µs.
pub(crate) fn p50_p99(h: &Histogram<u64>) -> (f64, f64) {
    (
        h.value_at_quantile(0.5) as f64 / 1e3,
        h.value_at_quantile(0.99) as f64 / 1e3,
    )
}

/// `ndd bench`'s command line.
#[derive(Debug, clap::Parser)]
#[command(
    name = "ndd bench",
    bin_name = "ndd bench",
    about = "Benchmarks; each prints figures next to a raw baseline measured in the same run."
)]
struct Cli {
    #[command(subcommand)]
    which: BenchCmd,
}

/// `WxH` (e.g. `1920x1080`), each side 16..=8192.
fn parse_size(s: &str) -> Result<(u16, u16), String> {
    let bad = || format!("{s:?} is not a screen size: give WxH, e.g. 1920x1080");
    let (w, h) = s.split_once('x').ok_or_else(bad)?;
    let (w, h): (u16, u16) = (w.parse().map_err(|_| bad())?, h.parse().map_err(|_| bad())?);
    if !(16..=8192).contains(&w) || !(16..=8192).contains(&h) {
        return Err(format!("{s}: each side must be 16 to 8192 pixels"));
    }
    Ok((w, h))
}

fn main() {
    use clap::Parser;
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("NDD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
    let result = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the runtime")
        .and_then(|rt| rt.block_on(run(cli.which)));
    if let Err(e) = result {
        eprintln!("ndd bench: error: {e:#}");
        std::process::exit(1);
    }
}

/// The `ndd` binary the benchmarks run as real processes: the one beside this program
/// (`target/release/ndd` beside `target/release/ndd-bench`).
pub(crate) fn ndd_exe() -> Result<PathBuf> {
    let me = std::env::current_exe().context("cannot find the ndd-bench executable")?;
    let ndd = me
        .parent()
        .map(|d| d.join("ndd"))
        .filter(|p| p.is_file())
        .with_context(|| {
            format!(
                "no ndd binary beside {}: build both (cargo build --release -p ndd-cli -p ndd-bench)",
                me.display()
            )
        })?;
    Ok(ndd)
}

/// Where a `--quick` run writes when `--out` is left at `docs/bench` (whose pages record full
/// runs: a smoke run must not overwrite them).
const QUICK_OUT: &str = "target/bench-quick";

impl BenchCmd {
    /// The run's `--quick` and `--out`.
    fn quick_out(&mut self) -> (bool, &mut PathBuf) {
        match self {
            BenchCmd::Audio { quick, out }
            | BenchCmd::Peers { quick, out }
            | BenchCmd::Fanout { quick, out, .. }
            | BenchCmd::Display { quick, out, .. }
            | BenchCmd::E2e { quick, out, .. }
            | BenchCmd::Jitter { quick, out }
            | BenchCmd::Links { quick, out, .. }
            | BenchCmd::Placement { quick, out }
            | BenchCmd::Rfb { quick, out }
            | BenchCmd::Soak { quick, out, .. }
            | BenchCmd::Pairs { quick, out } => (*quick, out),
        }
    }
}

/// Dispatches.
pub async fn run(mut cmd: BenchCmd) -> Result<()> {
    let (quick, out) = cmd.quick_out();
    if quick && out.as_path() == Path::new("docs/bench") {
        eprintln!(
            "bench: --quick writes into {QUICK_OUT} (docs/bench records full runs; give --out to write elsewhere)"
        );
        *out = PathBuf::from(QUICK_OUT);
    }
    match cmd {
        BenchCmd::Audio { quick, out } => {
            tokio::task::spawn_blocking(move || audio::run(quick, &out))
                .await
                .context("bench audio task")?
        }
        BenchCmd::Fanout {
            quick,
            cluster,
            out,
        } => fanout::run(quick, cluster, &out).await,
        BenchCmd::Display {
            quick,
            vs_vnc: true,
            no_netns,
            typing_only,
            workload,
            size,
            peers,
            repeat,
            out,
        } => {
            vnc::run(vnc::Options {
                quick,
                no_netns,
                typing_only,
                workload,
                screen: size,
                peers,
                repeat,
                out,
            })
            .await
        }
        BenchCmd::Display { quick, out, .. } => display::run(quick, &out).await,
        BenchCmd::E2e { quick, out, link } => e2e::run(quick, &out, &link).await,
        BenchCmd::Pairs { quick, out } => pairs::run(quick, &out),
        BenchCmd::Peers { quick, out } => {
            tokio::task::spawn_blocking(move || peers::run(quick, &out))
                .await
                .context("bench peers task")?
        }
        BenchCmd::Soak {
            quick,
            minutes,
            out,
        } => soak::run(quick, minutes, &out).await,
        BenchCmd::Jitter { quick, out } => jitter::run(quick, &out),
        BenchCmd::Links { quick, out, mixed } => {
            if mixed {
                mixed::run(quick, &out).await
            } else {
                links::run(quick, &out).await
            }
        }
        BenchCmd::Placement { quick, out } => {
            std::fs::create_dir_all(&out)
                .with_context(|| format!("cannot create {}", out.display()))?;
            let md = out.join("placement.md");
            tokio::task::spawn_blocking(move || crate::placement::bench_placement(quick, &md))
                .await
                .context("bench placement task")?
                .with_context(|| format!("bench placement into {}", out.display()))
        }
        BenchCmd::Rfb { quick, out } => {
            let opts = ndd_rfb::BenchOptions {
                quick,
                out_dir: out,
                command: format!("ndd bench rfb{}", if quick { " --quick" } else { "" }),
                ..ndd_rfb::BenchOptions::default()
            };
            let report = ndd_rfb::bench(opts).await.context("bench rfb")?;
            eprintln!(
                "wrote {} and {}",
                report.markdown.display(),
                report.svg.display()
            );
            Ok(())
        }
    }
}

/// Runs `ndd ARGS` (the binary at `exe`) to completion: its stdout, trimmed, or its stderr as
/// the error.
pub(crate) fn ndd_ok(exe: &Path, args: &[&str]) -> Result<String> {
    let out = std::process::Command::new(exe)
        .args(args)
        .output()
        .context("cannot run ndd")?;
    if !out.status.success() {
        bail!(
            "ndd {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

pub(crate) fn size_name(s: usize) -> String {
    match s {
        s if s >= 1_000_000 => format!("{} MB", s / 1_000_000),
        s if s >= 1_000 => format!("{} KB", s / 1_000),
        s => format!("{s} B"),
    }
}

pub(crate) fn hardware() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    format!(
        "{cpu}, {cores} cores, {} {}",
        std::env::consts::OS,
        std::env::consts::ARCH
    )
}

pub(crate) fn today() -> String {
    let secs = ndd::session::wall_ns() / 1_000_000_000;
    // Civil date from days since the epoch (Howard Hinnant's algorithm).
    let z = (secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

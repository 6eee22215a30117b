//! `ndd bench audio`: mouth-to-ear latency of the audio stream, measured from outside both
//! `ndd` processes on a private PulseAudio daemon. A click train (a 4 ms 1 kHz burst every
//! 400 ms, made with `sox`) plays with `paplay` into the device side's "microphone" (a null
//! sink kept running, as a real microphone is); two `pacat --record` processes read, in 5 ms
//! fragments, what the microphone hears (its monitor) and what programs on the app side hear
//! (ndd's virtual source `ndd_mic`), and the time between each click's onset in the two is
//! the latency. Rows: PulseAudio's own `module-loopback` between the same two points (the
//! mechanism a local program would use; same run), ndd with PCM, with the `opus` pair, and
//! with `opus` and the `buffer` pair as `examples/audio.toml` has them; then the same three
//! the other way, clicks played into the app side's `ndd_speaker` (idle until then: a cold
//! start) and heard at the device side's speakers. The first click's latency, after seconds
//! of silence, is its own column. Writes audio.md.

use super::{hardware, ndd_ok, today};
use anyhow::{bail, Context, Result};
use ndd_procs::{missing, Killed, Pulse};
use std::fmt::Write as _;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const RATE: f64 = 48_000.0;
/// A click starts where the level first exceeds this after at least `QUIET` of quiet.
const LOUD: i16 = 8000;
const QUIET: Duration = Duration::from_millis(150);
/// Clicks are this far apart.
const PERIOD_MS: u64 = 400;

/// Samples as they arrived: (arrival time of the chunk, its samples).
type Chunks = Arc<Mutex<Vec<(Instant, Vec<i16>)>>>;

/// `pacat --record` of `source`, mono s16le 48 kHz in 5 ms fragments; each chunk it
/// delivers is kept with its arrival time.
fn record(pa: &Pulse, source: &str) -> Result<(Killed, Chunks)> {
    let mut child = Command::new("pacat")
        .arg(format!("--server={}", pa.server))
        .args([
            "--record",
            "-d",
            source,
            "--raw",
            "--format=s16le",
            "--rate=48000",
        ])
        .args(["--channels=1", "--latency-msec=5"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot run pacat (Debian: pulseaudio-utils)")?;
    let mut out = child.stdout.take().context("pacat stdout")?;
    let chunks: Chunks = Arc::default();
    let c = chunks.clone();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 4096];
        let mut carry: Option<u8> = None;
        while let Ok(n) = out.read(&mut buf) {
            if n == 0 {
                break;
            }
            let at = Instant::now();
            let mut bytes: Vec<u8> = carry.take().into_iter().collect();
            bytes.extend_from_slice(&buf[..n]);
            if bytes.len() % 2 == 1 {
                carry = bytes.pop();
            }
            let s = bytes
                .chunks_exact(2)
                .map(|b| i16::from_le_bytes([b[0], b[1]]))
                .collect();
            c.lock().unwrap_or_else(|p| p.into_inner()).push((at, s));
        }
    });
    Ok((Killed(child), chunks))
}

/// The onset times of the clicks in a recording. At the mouth a sample's time is when it was
/// sounded: its chunk's arrival less the samples after it in the chunk; at the ear it is when
/// a program gets it: its chunk's arrival (`heard`).
fn onsets(chunks: &[(Instant, Vec<i16>)], heard: bool) -> Vec<Instant> {
    let mut out = Vec::new();
    let mut quiet_since: Option<Instant> = None;
    for (at, s) in chunks {
        let n = s.len();
        for (i, &x) in s.iter().enumerate() {
            let t = if heard {
                *at
            } else {
                *at - Duration::from_secs_f64((n - 1 - i) as f64 / RATE)
            };
            if x.unsigned_abs() > LOUD.unsigned_abs() {
                if quiet_since.is_some_and(|q| t.duration_since(q) >= QUIET) {
                    out.push(t);
                }
                quiet_since = None;
            } else if x.unsigned_abs() < 2000 && quiet_since.is_none() {
                quiet_since = Some(t);
            }
        }
    }
    out
}

/// Latencies (ms) between each mouth click and the first ear click after it, within a
/// period.
fn latencies(mouth: &[Instant], ear: &[Instant]) -> Vec<f64> {
    mouth
        .iter()
        .filter_map(|m| {
            ear.iter()
                .find(|e| **e >= *m && e.duration_since(*m) < Duration::from_millis(PERIOD_MS))
                .map(|e| e.duration_since(*m).as_secs_f64() * 1e3)
        })
        .collect()
}

struct Row {
    what: String,
    clicks: usize,
    heard: usize,
    /// The first click's latency, after seconds of silence.
    first: Option<f64>,
    ms: Vec<f64>,
    /// ndd rows: what the app side counted over the whole run (its `--stats-json`).
    counts: Option<Counts>,
}

/// Underruns and overruns of an ndd row, from the app side's final stats.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    /// The `buffer` pair found its queue empty when the next block was due.
    underruns: u64,
    /// Blocks that came after their playout time (the schedule started again from them).
    late: u64,
    /// Blocks dropped: stale ones in `buffer`, blocks the sink had no room for (overruns).
    dropped: u64,
    /// The delay `buffer`'s schedule added above the fastest transit it saw, at the end (µs).
    delay_us: u64,
}

/// The counts in the app side's `--stats-json` file (`None` if it is missing or unreadable).
fn counts(path: &Path) -> Option<Counts> {
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()?;
    let s = v.get("streams")?.as_array()?.first()?;
    let n = |v: &serde_json::Value, k: &str| v.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
    let mut c = Counts {
        dropped: n(s, "drops") + n(s, "overflow"),
        ..Counts::default()
    };
    for m in s.get("modules")?.as_array()? {
        if m.get("module").and_then(|x| x.as_str()) != Some("buffer") {
            continue;
        }
        for pair in m.get("counters")?.as_array()? {
            match (
                pair.get(0).and_then(|x| x.as_str()),
                pair.get(1).and_then(|x| x.as_u64()),
            ) {
                (Some("underruns"), Some(v)) => c.underruns += v,
                (Some("late"), Some(v)) => c.late += v,
                (Some("delay_us"), Some(v)) => c.delay_us += v,
                _ => {}
            }
        }
    }
    Some(c)
}

/// Plays the clicks into the sink `mouth` (the microphone, or `ndd_speaker` for the speaker
/// direction) while recording its monitor and `ear`.
fn measure(
    pa: &Pulse,
    clicks_wav: &Path,
    clicks: usize,
    (mouth_sink, ear): (&str, &str),
    what: &str,
) -> Result<Row> {
    let (m_rec, mouth) = record(pa, &format!("{mouth_sink}.monitor"))?;
    let (e_rec, heard) = record(pa, ear)?;
    std::thread::sleep(Duration::from_millis(300));
    let ok = Command::new("paplay")
        .arg(format!("--server={}", pa.server))
        .args(["-d", mouth_sink, "--latency-msec=10"])
        .arg(clicks_wav)
        .status()
        .context("cannot run paplay")?;
    if !ok.success() {
        bail!("paplay failed");
    }
    std::thread::sleep(Duration::from_millis(600));
    drop((m_rec, e_rec));
    let m = onsets(&mouth.lock().unwrap_or_else(|p| p.into_inner()), false);
    let e = onsets(&heard.lock().unwrap_or_else(|p| p.into_inner()), true);
    let ms = latencies(&m, &e);
    // The first click comes after seconds of silence: what a cold start costs.
    let first = latencies(&m[..m.len().min(1)], &e).first().copied();
    eprintln!(
        "bench audio: {what}: {} of {clicks} clicks heard, first {}, median {:.1} ms",
        ms.len(),
        first.map_or("not heard".into(), |f| format!("{f:.1} ms")),
        median(&ms)
    );
    Ok(Row {
        what: what.to_string(),
        clicks,
        heard: ms.len().min(m.len()),
        first,
        ms,
        counts: None,
    })
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Which way the sound goes in a row.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Way {
    /// The device side's microphone (`dev_mic`) to programs on the app side (`ndd_mic`).
    Mic,
    /// Programs on the app side playing into `ndd_speaker` to the device side's speakers
    /// (`dev_spk`), which idle until the clicks start: a cold start.
    Speaker,
}

impl Way {
    /// Where the clicks are played and where they are heard.
    fn points(self) -> (&'static str, &'static str) {
        match self {
            Way::Mic => ("dev_mic", "ndd_mic"),
            Way::Speaker => ("ndd_speaker", "dev_spk.monitor"),
        }
    }

    /// The device made on the app side, once it exists (`pactl list short KIND`).
    fn made(self) -> (&'static str, &'static str) {
        match self {
            Way::Mic => ("sources", "ndd_mic\t"),
            Way::Speaker => ("sinks", "ndd_speaker\t"),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Way::Mic => "microphone",
            Way::Speaker => "speaker",
        }
    }
}

fn config(server: &str, stack: &str, way: Way) -> String {
    let (direction, source, sink) = match way {
        Way::Mic => (
            "device-to-app",
            r#"device = "dev_mic.monitor""#,
            r#"virtual_source = "ndd_mic", rate = 48000, channels = 1"#,
        ),
        Way::Speaker => (
            "app-to-device",
            r#"virtual_sink = "ndd_speaker""#,
            r#"device = "dev_spk""#,
        ),
    };
    format!(
        r#"
driver = "bench-audio"
[[stream]]
name = "{name}"
direction = "{direction}"
reliability = "lossy"
source = {{ type = "pulse-capture", {source}, rate = 48000, channels = 1, frame_ms = 10, server = "{server}" }}
stack = [{stack}]
sink = {{ type = "pulse-playback", {sink}, server = "{server}" }}
"#,
        name = way.name()
    )
}

/// Runs the benchmark (4 clicks per row when `quick`, 25 otherwise) and writes audio.md.
/// The ndd stacks of the rows: `(stack, description)`.
const STACKS: &[(&str, &str)] = &[
    ("", "ndd over TLS, PCM, no jitter buffer"),
    (
        r#"{ type = "opus", bitrate = 32000, application = "voip" }"#,
        "ndd over TLS, opus(bitrate=32000, application=voip), no jitter buffer",
    ),
    (
        r#"{ type = "opus", bitrate = 32000, application = "voip" }, { type = "buffer", min = 3, max = 6, playout_ms = 30 }"#,
        "ndd over TLS, opus + buffer(min=3, max=6, playout_ms=30) as in examples/audio.toml",
    ),
];

/// The rows of one sound server (`server`: its name in the rows): its own loopback, then ndd
/// with each of `stacks`.
fn server_rows(
    pa: &Pulse,
    server: &str,
    clicks: usize,
    stacks: &[(&str, &str)],
) -> Result<Vec<Row>> {
    for sink in ["dev_mic", "dev_spk", "loop_out"] {
        pa.pactl(&[
            "load-module",
            "module-null-sink",
            &format!("sink_name={sink}"),
            "rate=48000",
        ])
        .with_context(|| format!("cannot make the null sink {sink}"))?;
    }
    let silence = pa
        .sox("silence.wav", &["trim", "0", "600"])
        .context("cannot run sox")?;
    let repeat = (clicks - 1).to_string();
    let clicks_wav = pa
        .sox(
            "clicks.wav",
            &[
                "synth", "0.004", "sine", "1000", "pad", "0", "0.396", "repeat", &repeat,
            ],
        )
        .context("cannot run sox")?;
    // The microphone runs steadily, as a real one does.
    let _mic = pa
        .paplay("dev_mic", &silence)
        .map(Killed)
        .context("cannot run paplay")?;
    // And the speakers play, as a sound card does.
    let _spk = pa
        .paplay("dev_spk", &silence)
        .map(Killed)
        .context("cannot run paplay")?;
    let mut rows = Vec::new();

    // Baseline: PulseAudio's own loopback between the same two points.
    let module = pa
        .pactl(&[
            "load-module",
            "module-loopback",
            "source=dev_mic.monitor",
            "sink=loop_out",
            "latency_msec=20",
        ])
        .context("cannot load module-loopback")?;
    std::thread::sleep(Duration::from_millis(2500));
    rows.push(measure(
        pa,
        &clicks_wav,
        clicks,
        ("dev_mic", "loop_out.monitor"),
        &format!("{server} module-loopback (latency_msec=20), no network"),
    )?);
    let _ = pa.pactl(&["unload-module", module.trim()]);

    // ndd: two processes over TLS on loopback.
    let exe = super::ndd_exe()?;
    let dir = pa.dir.join("ndd");
    let (ha, hd) = (dir.join("app"), dir.join("device"));
    let (ha_s, hd_s) = (ha.display().to_string(), hd.display().to_string());
    let fa = ndd_ok(&exe, &["id", "--home", &ha_s])?;
    let fd = ndd_ok(&exe, &["id", "--home", &hd_s])?;
    ndd_ok(&exe, &["trust", &fd, "--home", &ha_s])?;
    ndd_ok(&exe, &["trust", &fa, "--home", &hd_s])?;
    for (way, &(stack, what)) in [Way::Mic, Way::Speaker]
        .into_iter()
        .flat_map(|w| stacks.iter().map(move |s| (w, s)))
    {
        let what = &format!("{}: {what} ({server})", way.name());
        let cfg = dir.join("audio.toml");
        std::fs::write(&cfg, config(&pa.server, stack, way))?;
        let cfg_s = cfg.display().to_string();
        let listen = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .to_string();
        let side_cmd = |args: &[&str]| -> Result<Killed> {
            Command::new(&exe)
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map(Killed)
                .context("cannot start ndd")
        };
        // The counts of the side that plays the sound.
        let stats = dir.join("sink-stats.json");
        let _ = std::fs::remove_file(&stats);
        let stats_s = stats.display().to_string();
        let stats_arg = |side| (side == "app") == (way == Way::Mic);
        let run = |side: &'static str, link: [&str; 2], home: &str| -> Result<Killed> {
            let mut args = vec![
                "run", &cfg_s, "--side", side, link[0], link[1], "--home", home,
            ];
            if stats_arg(side) {
                args.extend(["--stats-json", &stats_s]);
            }
            side_cmd(&args)
        };
        let app = run("app", ["--listen", &listen], &ha_s)?;
        let dev = run("device", ["--connect", &listen], &hd_s)?;
        let (kind, made) = way.made();
        let t0 = Instant::now();
        while !pa
            .pactl(&["list", "short", kind])
            .unwrap_or_default()
            .contains(made)
        {
            if t0.elapsed() > Duration::from_secs(20) {
                bail!("the app side did not make its {} within 20 s", made.trim());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(2500));
        let mut row = measure(pa, &clicks_wav, clicks, way.points(), what)?;
        // A clean stop: the app side unloads its virtual source.
        for mut side in [dev, app] {
            let _ = Command::new("kill")
                .args(["-TERM", &side.0.id().to_string()])
                .status();
            let t0 = Instant::now();
            while matches!(side.0.try_wait(), Ok(None)) && t0.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        row.counts = counts(&stats);
        if let Some(c) = row.counts {
            eprintln!(
                "bench audio: {what}: {} underruns, {} late, {} dropped, buffer delay {:.1} ms",
                c.underruns,
                c.late,
                c.dropped,
                c.delay_us as f64 / 1000.0
            );
        }
        rows.push(row);
    }

    Ok(rows)
}

pub fn run(quick: bool, out: &Path) -> Result<()> {
    if let Some(m) = missing(&["pulseaudio", "pactl", "paplay", "pacat", "sox"]) {
        bail!("bench audio needs {m} (Debian: apt-get install pulseaudio pulseaudio-utils sox)");
    }
    let clicks = if quick { 4 } else { 25 };
    // The smoke (--quick) runs the examples' stack only, through each server: the other
    // stacks' code is the same (CI time: 53 s -> about 25 s).
    let stacks = if quick {
        &STACKS[STACKS.len() - 1..]
    } else {
        STACKS
    };
    let mut rows = server_rows(&Pulse::start("bench-audio"), "PulseAudio", clicks, stacks)?;
    // The same through PipeWire, as current desktops run it (every row: the PCM row shows
    // what the server's path adds by itself).
    let pipewire = match Pulse::start_pipewire("bench-audio") {
        Ok(pw) => {
            rows.extend(server_rows(&pw, "PipeWire", clicks, stacks)?);
            None
        }
        Err(e) => {
            eprintln!("bench audio: no PipeWire rows: {e}");
            Some(e)
        }
    };
    let mut md = String::new();
    let _ = writeln!(md, "# Audio: mouth-to-ear latency\n");
    let _ = writeln!(
        md,
        "Hardware: {}. Date: {}. Command: `ndd bench audio{}`.\n",
        hardware(),
        today(),
        if quick { " --quick" } else { "" }
    );
    let _ = writeln!(
        md,
        "A click train ({clicks} clicks of 4 ms, 1 kHz, every {PERIOD_MS} ms, made with `sox`) \
         plays with `paplay` into the device side's microphone (a PulseAudio null sink kept \
         running with silence, 48 kHz mono); `pacat --record` in 5 ms fragments reads what the \
         microphone hears (its monitor) and what a program on the app side hears; the time \
         between a click's onset sounding at the microphone (its sample's time in the chunk that \
         brought it) and its reaching the program (the arrival of that chunk) is the latency. 10 ms blocks, lossy streams, both `ndd` processes on this machine \
         over TLS on loopback, one private PulseAudio daemon (or PipeWire). The microphone's own recording \
         is delivered in 5 ms fragments, so every row reads up to ~5 ms low alike. `speaker:` rows \
         go the other way: the clicks play into the app side's `ndd_speaker` (a null sink nothing \
         played into before: a cold start) and are heard at the device side's speakers (a null \
         sink kept running, as a sound card is; the sink's `latency_ms` at its default, 30). \
         `first` is the first click, after ~3 s of silence. Issue \
         target: ≤ 40 ms with the jitter buffer on, and the speaker as prompt as the microphone.\n"
    );
    let _ = writeln!(
        md,
        "| path | clicks heard | first ms | median ms | min ms | max ms | underruns | late | dropped | buffer delay ms |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for r in &rows {
        let (lo, hi) =
            r.ms.iter()
                .fold((f64::INFINITY, 0f64), |(a, b), &x| (a.min(x), b.max(x)));
        let (u, l, d, b) = match r.counts {
            Some(c) => (
                c.underruns.to_string(),
                c.late.to_string(),
                c.dropped.to_string(),
                format!("{:.1}", c.delay_us as f64 / 1000.0),
            ),
            None => Default::default(),
        };
        let _ = writeln!(
            md,
            "| {} | {} of {} | {} | {:.1} | {:.1} | {:.1} | {u} | {l} | {d} | {b} |",
            r.what,
            r.heard,
            r.clicks,
            r.first.map_or("–".into(), |f| format!("{f:.1}")),
            median(&r.ms),
            lo,
            hi
        );
    }
    let _ = writeln!(
        md,
        "\nndd without a jitter buffer is the capture's block (10 ms; a click lands at the same \
         place in it every time in one run, so runs differ by a few ms) plus the link, and \
         with Opus its coding delay; the `buffer` pair adds its playout (40 ms here, which \
         absorbs that much jitter). PulseAudio's loopback keeps its configured 20 ms. \
         Underruns, late and dropped blocks are what ndd's side that plays the sound counted over the whole \
         row (its `--stats-json`, written when it stops): `underruns`, the `buffer` pair found \
         its queue empty when the next block was due; `late`, a block came after its playout \
         time; `dropped`, stale blocks and blocks the sink had no room for (overruns); `buffer delay`, \
         what the `buffer` pair's schedule added above the fastest transit it saw, at the end. \
         Without the `buffer` pair there is no schedule, so no underrun is counted."
    );
    let _ = writeln!(
        md,
        "\nThe `(PipeWire)` rows run the same through PipeWire 0.3 as current desktops run it \
         (`pipewire`, `wireplumber`, `pipewire-pulse`, at its default quantum), the endpoints \
         speaking PulseAudio's protocol to `pipewire-pulse`{}.",
        match &pipewire {
            None => String::new(),
            Some(e) => format!(" — not in this run: {e}"),
        }
    );
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let path = out.join("audio.md");
    std::fs::write(&path, md).with_context(|| format!("cannot write {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn counts_come_from_the_buffer_layer_and_the_streams_drops() {
        // The shape `ndd run --stats-json` writes (a real file's stream, trimmed).
        let json = r#"{"side": "app", "streams": [{"name": "mic", "drops": 1, "overflow": 4,
            "modules": [
              {"layer": 0, "module": "opus", "counters": [["underruns", 99]]},
              {"layer": 1, "module": "buffer", "counters": [["underruns", 3], ["late", 2],
               ["requests", 49], ["stale", 1]], "drops": 1}]}]}"#;
        let dir = std::env::temp_dir().join(format!("ndd-audio-counts-{}", std::process::id()));
        std::fs::write(&dir, json).unwrap();
        let c = super::counts(&dir).unwrap();
        let _ = std::fs::remove_file(&dir);
        assert_eq!((c.underruns, c.late, c.dropped), (3, 2, 5));
        assert!(super::counts(std::path::Path::new("/nonexistent/stats.json")).is_none());
    }
}

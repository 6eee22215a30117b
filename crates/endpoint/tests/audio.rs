//! Audio endpoints against a real PulseAudio daemon (a private one, with null sinks, as
//! Debian's `pulseaudio` runs for a user), and against PipeWire through `pipewire-pulse`: a tone made with `sox` and played with the
//! unmodified `paplay` into a sink on the "device side" is recorded by `pulse-capture`, played
//! by `pulse-playback` into the virtual source it creates, and recorded there by the
//! unmodified `parecord`: its frequency, length and continuity are checked.

use ndd_core::Frame;
use ndd_endpoint::audio::{PulseCaptureConfig, PulsePlaybackConfig};
use ndd_endpoint::{SinkConfig, SourceConfig};
use ndd_procs::{missing, read_s16le, wait_for, Killed, Pulse, Tone};
use std::time::Duration;
use tokio::sync::mpsc;

/// One tone at a time: the two daemons, two `sox`es and four real-time streams at once were
/// what a loaded suite run (two busy loops, four test threads) could not keep whole.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_tone_played_on_one_side_is_recorded_whole_on_the_other() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(m) = missing(&["pulseaudio", "pactl", "paplay", "parecord", "sox"]) {
        println!("SKIPPED: audio test needs {m} (apt-get install pulseaudio pulseaudio-utils sox)");
        return;
    }
    tone_recorded_whole(&Pulse::start("tone"));
}

/// The same through PipeWire (`pipewire` + `wireplumber` + `pipewire-pulse`, as current
/// desktops run it): the endpoints speak PulseAudio's protocol to `pipewire-pulse`. Its graph
/// runs in periods of 1024 samples, as on a virtual machine: at the default (256 here, asked
/// by the test's `paplay`; 480 by ndd's capture) PipeWire itself glitched on this kind of
/// machine (`Pulse::start_pipewire_with`), and this test failed 4 of 21 runs with the same
/// 256-sample holes of silence, found both in what ndd's capture recorded and after its sink.
#[test]
fn the_tone_goes_through_pipewire_too() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(pw) = pipewire("tone") {
        tone_recorded_whole(&pw);
    }
}

/// PipeWire at 1024-sample periods for a test named `name`, or `None` when what it needs is
/// missing (said as SKIPPED).
fn pipewire(name: &str) -> Option<Pulse> {
    if let Some(m) = missing(&["pactl", "paplay", "parecord", "sox"]) {
        println!("SKIPPED: audio test needs {m} (apt-get install pulseaudio-utils sox)");
        return None;
    }
    Pulse::start_pipewire_with(name, Some(1024))
        .map_err(|e| println!("SKIPPED: PipeWire test: {e}"))
        .ok()
}

/// The virtual source as `examples/audio.toml` has it (no `max_wait_ms`, the default
/// `latency_ms`), through PipeWire: the tone keeps its pitch and has no gap. PipeWire's pipe
/// source takes a period (1024 samples here) at a time; when the FIFO held under one block,
/// as it did, every period found half its sound missing and a 440 Hz tone came through as
/// 234–240 Hz (4 of 4 runs; 3 of 4 broken at the default period too). At the default a block
/// may still be dropped when sound comes in a burst (the freshest sound): one, in 1 of 14
/// runs.
#[test]
fn the_example_virtual_source_through_pipewire_keeps_the_tone() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(pw) = pipewire("example") {
        tone_through(&pw, PulsePlaybackConfig::default(), 2);
    }
}

fn tone_recorded_whole(pa: &Pulse) {
    let playback = PulsePlaybackConfig {
        // What the FIFO is primed with, so a writer held off the core for less never
        // leaves the reader without sound: 30 (the default) left PipeWire's reader a 5 ms
        // dip (weakest 0.45) in a loaded suite run, two busy loops and four test threads.
        // (What still glitched with three busy loops, 2 runs in 8, was the test's own
        // `paplay`, `parecord` and PipeWire daemons starved: they now run at the level a
        // desktop gives them, `ndd_procs::Pulse`, and 8 of 8 pass.)
        latency_ms: 100,
        // Whole, as for the capture above: PipeWire's pipe source stalled by a loaded host
        // must not cost a block (at the default a block is dropped while the cushion, a
        // period and a block wait: the freshest sound).
        max_wait_ms: Some(1000),
        ..Default::default()
    };
    tone_through(pa, playback, 0);
}

/// A tone through `pulse-capture` and `pulse-playback` (`playback` with its virtual source,
/// rate and server set here): whole, or with at most `lost` blocks dropped.
fn tone_through(pa: &Pulse, playback: PulsePlaybackConfig, lost: i64) {
    // The device side's "microphone": a null sink the test plays into.
    pa.pactl(&[
        "load-module",
        "module-null-sink",
        "sink_name=dev_mic",
        "rate=48000",
    ])
    .expect("null sink");
    // The microphone runs steadily, as a real one does (an idle null sink wakes with a 2 s
    // block, which the capture skips as stale): silence playing into it throughout.
    let silence = pa.sox("silence.wav", &["trim", "0", "30"]).expect("sox");
    let _mic_running = pa.paplay("dev_mic", &silence).map(Killed).expect("paplay");
    let tone = pa
        .sox("tone.wav", &["synth", "2", "sine", "440", "vol", "0.5"])
        .expect("sox");

    // First, so it is dropped last (the blocking tasks end when the daemon goes).
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = Some(pa.server.clone());
    let (source, sink, network) = rt.block_on(async {
        let (tx, mut mid) = mpsc::channel::<Frame>(64);
        let (fwd, rx) = mpsc::channel::<Frame>(64);
        // The "network" between the halves; aborting it ends both.
        let network = tokio::spawn(async move {
            while let Some(f) = mid.recv().await {
                if fwd.send(f).await.is_err() {
                    break;
                }
            }
        });
        let source = SourceConfig::PulseCapture(PulseCaptureConfig {
            device: Some("dev_mic.monitor".into()),
            rate: 48_000,
            channels: 1,
            frame_ms: 10,
            // Whole, not fresh, is what this test checks: a capture thread held off the core
            // for over 60 ms by a loaded CI host must not skip a block (by design at the
            // default); the null sink's first 2 s block is still skipped.
            max_wait_ms: 1000,
            server: server.clone(),
            ..Default::default()
        })
        .spawn(1, tx)
        .expect("pulse-capture source");
        let sink = SinkConfig::PulsePlayback(PulsePlaybackConfig {
            virtual_source: Some("ndd_mic".into()),
            rate: 48_000,
            channels: 1,
            server: server.clone(),
            // Removed as the sink ends (checked below; keeping it is cli/tests/audio.rs's).
            keep_s: 0,
            ..playback
        })
        .spawn(rx)
        .expect("pulse-playback sink");
        (source, sink, network)
    });
    // The app side's programs see a new source.
    let sources = pa.pactl(&["list", "short", "sources"]).unwrap();
    assert!(sources.contains("ndd_mic\t"), "{sources}");

    // The null sink's first 2 s block (from before anything asked it for short ones) is
    // recorded late and skipped as stale; past it the capture runs as on a real microphone.
    std::thread::sleep(Duration::from_millis(2500));
    let rec = pa.dir.join("rec.raw");
    let recording = pa.parecord("ndd_mic", &rec).expect("parecord");
    std::thread::sleep(Duration::from_millis(300));
    let played = pa.paplay("dev_mic", &tone).expect("paplay").wait().unwrap();
    assert!(played.success());
    std::thread::sleep(Duration::from_millis(500));
    drop(recording);

    let t = Tone::of(&read_s16le(&rec)).expect("the tone reached parecord");
    assert!((t.hz - 440.0).abs() < 2.0, "{t:?}");
    // 2 s of tone, whole: no block lost (but `lost`), none twice.
    assert!((t.len as i64 - 96_000).abs() < 480 * (1 + lost), "{t:?}");
    assert!(t.weakest > 0.5, "a gap in the tone: {t:?}");

    network.abort();
    let report = rt.block_on(source).unwrap().expect("source report");
    assert!(report.frames > 200, "{report:?}");
    rt.block_on(sink).unwrap().expect("sink report");
    // The virtual source goes with the sink: its module is unloaded.
    wait_for("the virtual source to go", Duration::from_secs(10), || {
        !pa.pactl(&["list", "short", "sources"])
            .unwrap_or_default()
            .contains("ndd_mic\t")
    });
}

#[test]
fn no_server_is_one_clear_line_at_start() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (tx, _rx) = mpsc::channel::<Frame>(1);
    let e = rt
        .block_on(async {
            SourceConfig::PulseCapture(PulseCaptureConfig {
                server: Some("unix:/nonexistent/pulse/native".into()),
                ..Default::default()
            })
            .spawn(1, tx)
        })
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("pulse-capture source: cannot record from PulseAudio source (default): "),
        "{e}"
    );
    assert!(e.contains("pulseaudio --start"), "{e}");
}

/// The peer changes the sound's rate with every block (each one reopens the playback
/// stream), for over a second: the "playing" line at most five times a second, and a later
/// one says how many were not shown.
#[test]
fn a_rate_change_with_every_block_is_a_few_lines_a_second() {
    if let Some(m) = missing(&["pulseaudio", "pactl", "paplay", "sox"]) {
        println!("SKIPPED: audio test needs {m} (apt-get install pulseaudio pulseaudio-utils sox)");
        return;
    }
    let log = ndd_core::testlog::Captured::global();
    let pa = Pulse::start("rates");
    pa.pactl(&["load-module", "module-null-sink", "sink_name=spk"])
        .expect("null sink");
    // Something else plays all along, as on a desktop: the sink runs in short blocks, and a
    // stream drains in a few ms (an idle null sink renders 2 s at once).
    let silence = pa.sox("silence.wav", &["trim", "0", "30"]).expect("sox");
    let _other = pa.paplay("spk", &silence).map(Killed).expect("paplay");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (tx, rx) = mpsc::channel::<Frame>(4);
    let sink = rt
        .block_on(async {
            SinkConfig::PulsePlayback(PulsePlaybackConfig {
                device: Some("spk".into()),
                latency_ms: 20,
                server: Some(pa.server.clone()),
                ..Default::default()
            })
            .spawn(rx)
        })
        .expect("pulse-playback sink");
    let silence = vec![0u8; 480 * 2];
    let blocks: Vec<Vec<u8>> = [48_000u32, 44_100]
        .iter()
        .map(|&rate| {
            ndd_wire::audio::Block {
                codec: ndd_wire::audio::Codec::Pcm,
                rate,
                channels: 1,
                samples: 480,
                data: &silence,
            }
            .emit()
            .unwrap()
        })
        .collect();
    let playing = || {
        log.matching("playing")
            .into_iter()
            .filter(|l| l.contains("sink=sink spk"))
            .collect::<Vec<_>>()
    };
    let started = std::time::Instant::now();
    let mut n = 0u64;
    while !playing().iter().any(|l| !l.contains("suppressed=0")) {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no count after {n} blocks"
        );
        let meta = ndd_core::Meta {
            seq: n,
            ..Default::default()
        };
        tx.blocking_send(Frame::new(meta, &blocks[n as usize % 2]))
            .unwrap();
        n += 1;
    }
    drop(tx);
    let report = rt.block_on(sink).unwrap().expect("sink report");
    assert_eq!(report.frames, n);
    let secs = started.elapsed().as_secs_f64().ceil() as usize;
    let lines = playing();
    assert!(lines.len() <= 5 * (secs + 1), "{n} blocks: {lines:#?}");
}

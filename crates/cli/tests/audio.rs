//! Sound both ways between two real `ndd` processes over TLS, on one private PulseAudio
//! daemon (the two sides' sound devices are null sinks on it): a 440 Hz tone played with
//! `paplay` into the device side's "microphone" is recorded with `parecord` from the app
//! side's virtual source `ndd_mic`, and a 660 Hz tone played into the app side's virtual
//! sink `ndd_speaker` is recorded from the device side's "speakers", at the same time. The
//! streams are lossy, coded with the `opus` pair and played out by the `buffer` pair, as
//! `examples/audio.toml` has them.

mod common;

use common::*;
use std::time::Duration;

/// The two tests measure sound in real time (a block lost shows): one at a time, so that on a
/// loaded machine they do not take each other's time as well (seen once with two busy loops:
/// 28 ms of the microphone tone missing while the other test ran beside it).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_microphone_and_speakers_work_both_ways_between_two_processes() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(m) = missing(&["pulseaudio", "pactl", "paplay", "parecord", "sox"]) {
        println!("SKIPPED: audio test needs {m} (apt-get install pulseaudio pulseaudio-utils sox)");
        return;
    }
    let pa = Pulse::start("cli-audio");
    for sink in ["dev_mic", "dev_speakers"] {
        pa.pactl(&[
            "load-module",
            "module-null-sink",
            &format!("sink_name={sink}"),
            "rate=48000",
        ])
        .expect("null sink");
    }
    let dir = Dir::new("audio");
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let cfg = dir.0.join("audio.toml");
    let server = &pa.server;
    std::fs::write(
        &cfg,
        format!(
            r#"
driver = "audio"
[[stream]]
name = "mic"
direction = "device-to-app"
reliability = "lossy"
source = {{ type = "pulse-capture", device = "dev_mic.monitor", rate = 48000, channels = 1, server = "{server}" }}
stack = [{{ type = "opus", bitrate = 32000, application = "voip" }}, {{ type = "buffer", min = 3, max = 6, playout_ms = 30 }}]
sink = {{ type = "pulse-playback", virtual_source = "ndd_mic", rate = 48000, channels = 1, server = "{server}" }}
[[stream]]
name = "speaker"
direction = "app-to-device"
reliability = "lossy"
source = {{ type = "pulse-capture", virtual_sink = "ndd_speaker", rate = 48000, channels = 2, server = "{server}" }}
stack = [{{ type = "opus", bitrate = 64000 }}, {{ type = "buffer", min = 3, max = 6, playout_ms = 30 }}]
sink = {{ type = "pulse-playback", device = "dev_speakers", server = "{server}" }}
"#
        ),
    )
    .unwrap();
    let tones: Vec<_> = ["440", "660"]
        .map(|hz| {
            pa.sox(
                &format!("tone{hz}.wav"),
                &["synth", "2", "sine", hz, "vol", "0.5"],
            )
        })
        .into_iter()
        .collect::<Result<_, _>>()
        .expect("sox");
    // The device side's microphone runs steadily, as a real one does (an idle null sink wakes
    // with a 2 s block, which the capture skips and a playback waits behind): 30 s of silence
    // playing into it.
    let silence = pa.sox("silence.wav", &["trim", "0", "30"]).expect("sox");
    let _mic_running = pa.paplay("dev_mic", &silence).map(Killed).expect("paplay");
    // And its speakers are a running sink, as a sound card is.
    let _speakers_running = pa
        .paplay("dev_speakers", &silence)
        .map(Killed)
        .expect("paplay");
    let link = free_addr();
    let mut app = run_cmd(&cfg, "app", &app_home, &["--listen", &link]);
    let mut dev = run_cmd(&cfg, "device", &dev_home, &["--connect", &link]);
    // The endpoints' own reports too (a dropped or late sound block).
    for side in [&mut app, &mut dev] {
        side.env("NDD_LOG", "info");
    }
    let (app, dev) = (Side::spawn(app), Side::spawn(dev));
    wait_for("the app side's virtual devices", WAIT, || {
        let s = pa.pactl(&["list", "short", "sources"]).unwrap_or_default();
        s.contains("ndd_mic\t") && s.contains("ndd_speaker.monitor\t")
    });
    // PulseAudio's null sinks, the test's stand-ins for sound cards, start with a 2 s block
    // (the playback's first write waits it out); real devices do not. Past it, the streams run
    // as they would on real ones.
    std::thread::sleep(Duration::from_millis(2500));

    let (mic_rec, spk_rec) = (pa.dir.join("mic.raw"), pa.dir.join("spk.raw"));
    let r1 = pa.parecord("ndd_mic", &mic_rec).expect("parecord");
    let r2 = pa
        .parecord("dev_speakers.monitor", &spk_rec)
        .expect("parecord");
    std::thread::sleep(Duration::from_millis(300));
    let mut p1 = pa.paplay("dev_mic", &tones[0]).expect("paplay");
    let mut p2 = pa.paplay("ndd_speaker", &tones[1]).expect("paplay");
    assert!(p1.wait().unwrap().success() && p2.wait().unwrap().success());
    std::thread::sleep(Duration::from_millis(1500));
    drop((r1, r2));

    for (rec, hz, what) in [
        (&mic_rec, 440.0, "microphone"),
        (&spk_rec, 660.0, "speakers"),
    ] {
        let Some(Tone { len, hz: f, .. }) = Tone::of(&read_s16le(rec)) else {
            panic!(
                "no {what} tone arrived; app: {}\ndevice: {}",
                app.stderr_now(),
                dev.stderr_now()
            );
        };
        assert!(
            (f - hz).abs() < 3.0,
            "{what}: {f} Hz, not {hz}; app: {}\ndevice: {}",
            app.stderr_now(),
            dev.stderr_now()
        );
        // 2 s of it, whole (a block lost or doubled is 480 samples).
        assert!(
            (len as i64 - 96_000).abs() < 480,
            "{what}: {len} samples of tone; app: {}\ndevice: {}",
            app.stderr_now(),
            dev.stderr_now()
        );
    }
    drop(app.kill());
    drop(dev.kill());
}

/// A TCP proxy that holds each chunk for a random 0..`jitter_ms` (in order, as TCP delivers):
/// the link's delay varies by up to that much.
fn jittery_proxy(upstream: String, jitter_ms: u64) -> String {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for client in l.incoming() {
            let Ok(client) = client else { return };
            let Ok(server) = std::net::TcpStream::connect(&upstream) else {
                continue;
            };
            for (mut from, mut to, seed) in [
                (
                    client.try_clone().unwrap(),
                    server.try_clone().unwrap(),
                    7u64,
                ),
                (server, client, 11),
            ] {
                std::thread::spawn(move || {
                    let mut x = seed;
                    let mut due = std::time::Instant::now();
                    let mut buf = [0u8; 4096];
                    loop {
                        let n = match from.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let hold = Duration::from_micros(x % (jitter_ms * 1000));
                        due = due.max(std::time::Instant::now() + hold);
                        std::thread::sleep(
                            due.saturating_duration_since(std::time::Instant::now()),
                        );
                        if to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = to.shutdown(std::net::Shutdown::Both);
                });
            }
        }
    });
    addr
}

#[test]
fn sound_stays_whole_through_50_ms_of_jitter_with_the_buffer_sized_for_it() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(m) = missing(&["pulseaudio", "pactl", "paplay", "parecord", "sox"]) {
        println!("SKIPPED: audio test needs {m} (apt-get install pulseaudio pulseaudio-utils sox)");
        return;
    }
    let pa = Pulse::start("cli-audio-jitter");
    pa.pactl(&[
        "load-module",
        "module-null-sink",
        "sink_name=dev_mic",
        "rate=48000",
    ])
    .expect("null sink");
    let dir = Dir::new("audio-jitter");
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let cfg = dir.0.join("audio.toml");
    let server = &pa.server;
    // playout_ms above the jitter: the buffer absorbs it. Whole, not fresh, is what this test
    // checks, so the virtual source keeps sound that waits for a stalled reader
    // (`max_wait_ms`): on one core (`taskset -c 0`) the tone once had a gap (weakest 0.23),
    // the FIFO's freshness rule, not the network's jitter. (With the capture's `max_wait_ms`
    // raised too, 4 of 4 one-core runs lost ~90 ms of the tone's end: the capture then keeps
    // a stall as delay, and the recording stops 1.5 s after the tone.) The margins above the
    // network's 50 ms are for the machine: a clean CI run (two test binaries beside this one)
    // once cut a gap into the tone (weakest 0.245, the tone 343 samples = 7 ms long: the sound
    // was held up, not lost) with `playout_ms = 80` and the sink's default `latency_ms = 30`;
    // 16 runs here with three busy loops, or on one core, passed. With 120 and 60, a loaded
    // suite run (two busy loops, four test threads) had 5 frames come after their time
    // (buffer `late` 5, latency p99 288 ms: the machine, not the link) and the weakest 5 ms at
    // 0.497. 250 and 100, as one would size them for a busy machine behind a jittery link,
    // leave 200 ms for the machine's stalls before the buffer and 100 after it.
    // The buffer's `min` and `max` count blocks of the capture's `frame_ms` (10 ms): sized as
    // docs/modules.md says, `min` × 10 ms covers a refill's round trip (up to ~200 ms through
    // this proxy, which holds each read for its jitter before the next) and `max` × 10 ms the
    // delay plus that. With `min = 8, max = 16` (sized for 20 ms blocks) playout began after
    // 80 ms, below the proxy's ~100 ms; a clean CI run then had 5 frames late, the delay
    // ratcheted to 230 ms past the source's credit, and the tone had a gap (weakest 0.047).
    std::fs::write(
        &cfg,
        format!(
            r#"
driver = "audio"
[[stream]]
name = "mic"
direction = "device-to-app"
reliability = "lossy"
source = {{ type = "pulse-capture", device = "dev_mic.monitor", rate = 48000, channels = 1, server = "{server}" }}
stack = [{{ type = "opus", bitrate = 32000, application = "voip" }}, {{ type = "buffer", min = 20, max = 48, playout_ms = 250 }}]
sink = {{ type = "pulse-playback", virtual_source = "ndd_mic", rate = 48000, channels = 1, max_wait_ms = 1000, latency_ms = 100, server = "{server}" }}
"#
        ),
    )
    .unwrap();
    let silence = pa.sox("silence.wav", &["trim", "0", "30"]).expect("sox");
    let tone_wav = pa
        .sox("tone.wav", &["synth", "2", "sine", "440", "vol", "0.5"])
        .expect("sox");
    let _mic_running = pa.paplay("dev_mic", &silence).map(Killed).expect("paplay");
    let link = free_addr();
    let via = jittery_proxy(link.clone(), 50);
    let stats = dir.0.join("app-stats.json");
    let app = Side::spawn(run_cmd(
        &cfg,
        "app",
        &app_home,
        &["--listen", &link, "--stats-json", stats.to_str().unwrap()],
    ));
    let dev = Side::spawn(run_cmd(&cfg, "device", &dev_home, &["--connect", &via]));
    wait_for("the virtual source", WAIT, || {
        pa.pactl(&["list", "short", "sources"])
            .unwrap_or_default()
            .contains("ndd_mic\t")
    });
    std::thread::sleep(Duration::from_millis(2500));
    let rec = pa.dir.join("mic.raw");
    let r = pa.parecord("ndd_mic", &rec).expect("parecord");
    std::thread::sleep(Duration::from_millis(300));
    assert!(pa
        .paplay("dev_mic", &tone_wav)
        .expect("paplay")
        .wait()
        .unwrap()
        .success());
    std::thread::sleep(Duration::from_millis(1500));
    drop(r);
    // The app side's final stats (the buffer's `late`, the sink's drops) say, when the tone
    // has a gap, where the sound was held up.
    app.terminate();
    wait_for("the app side's stats", WAIT, || stats.exists());
    let said = format!(
        "app stats: {}\napp: {}\ndevice: {}",
        std::fs::read_to_string(&stats).unwrap_or_default(),
        app.kill(),
        dev.kill()
    );
    let t = Tone::of(&read_s16le(&rec)).unwrap_or_else(|| panic!("no tone arrived; {said}"));
    assert!((t.hz - 440.0).abs() < 3.0, "{t:?}; {said}");
    assert!((t.len as i64 - 96_000).abs() < 480, "{t:?}; {said}");
    // No gap: every 5 ms of the tone keeps at least half its level.
    assert!(t.weakest > 0.5, "a gap: {t:?}; {said}");
}

/// Issue 34 item 6: a program recording from the app side's virtual microphone, and one
/// playing into its virtual speaker, keep them across a restart of the app side (`keep_s`,
/// default 60): the devices stay loaded while the side is down, the next run takes them up,
/// and the recording program hears the sound played after the restart without having to
/// start again; the player's sound never moves to another sink.
#[test]
fn programs_keep_the_virtual_microphone_and_speaker_across_an_app_side_restart() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(m) = missing(&["pulseaudio", "pactl", "paplay", "parecord", "sox", "setsid"]) {
        println!("SKIPPED: audio test needs {m} (apt-get install pulseaudio pulseaudio-utils sox)");
        return;
    }
    let pa = Pulse::start("cli-audio-keep");
    pa.pactl(&[
        "load-module",
        "module-null-sink",
        "sink_name=dev_mic",
        "rate=48000",
    ])
    .expect("null sink");
    let dir = Dir::new("audio-keep");
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let cfg = dir.0.join("audio.toml");
    let server = &pa.server;
    std::fs::write(
        &cfg,
        format!(
            r#"
driver = "audio"
[link]
ping_interval_ms = 100
keepalive_timeout_ms = 600
max_backoff_ms = 200
[[stream]]
name = "mic"
direction = "device-to-app"
reliability = "lossy"
source = {{ type = "pulse-capture", device = "dev_mic.monitor", rate = 48000, channels = 1, server = "{server}" }}
stack = [{{ type = "buffer", min = 3, max = 6, playout_ms = 30 }}]
sink = {{ type = "pulse-playback", virtual_source = "ndd_mic", rate = 48000, channels = 1, max_wait_ms = 1000, server = "{server}" }}
[[stream]]
name = "speaker"
direction = "app-to-device"
reliability = "lossy"
source = {{ type = "pulse-capture", virtual_sink = "ndd_speaker", rate = 48000, channels = 1, server = "{server}" }}
sink = {{ type = "null" }}
"#
        ),
    )
    .unwrap();
    let tone = pa
        .sox("tone.wav", &["synth", "2", "sine", "440", "vol", "0.5"])
        .expect("sox");
    let silence = pa.sox("silence.wav", &["trim", "0", "60"]).expect("sox");
    let _mic_running = pa.paplay("dev_mic", &silence).map(Killed).expect("paplay");
    let link = free_addr();
    let app_cmd = || {
        let mut c = run_cmd(&cfg, "app", &app_home, &["--listen", &link]);
        c.env("NDD_LOG", "info");
        c
    };
    let app = Side::spawn(app_cmd());
    let dev = Side::spawn(run_cmd(&cfg, "device", &dev_home, &["--connect", &link]));
    let sources = || pa.pactl(&["list", "short", "sources"]).unwrap_or_default();
    wait_for("the app side's virtual devices", WAIT, || {
        let s = sources();
        s.contains("ndd_mic\t") && s.contains("ndd_speaker.monitor\t")
    });
    std::thread::sleep(Duration::from_millis(2500));
    // A program records the microphone; another plays into the speaker, for a minute.
    let rec = pa.dir.join("mic.raw");
    let mut recording = pa.parecord("ndd_mic", &rec).expect("parecord");
    let mut playing = pa
        .paplay("ndd_speaker", &silence)
        .map(Killed)
        .expect("paplay");
    std::thread::sleep(Duration::from_millis(300));
    // The app side stops (SIGTERM) and starts again.
    app.terminate();
    let (_, _, first_err) = app.finish();
    assert!(
        first_err.contains("kept for the side's next run"),
        "the devices are kept: {first_err}"
    );
    let s = sources();
    assert!(
        s.contains("ndd_mic\t") && s.contains("ndd_speaker.monitor\t"),
        "both devices stay while the side is down: {s}"
    );
    assert!(
        recording.0.try_wait().unwrap().is_none() && playing.0.try_wait().unwrap().is_none(),
        "the programs go on"
    );
    let app = Side::spawn(app_cmd());
    wait_for("the next run takes the devices up", WAIT, || {
        let e = app.stderr_now();
        e.contains("took up the PulseAudio source ndd_mic")
            && e.contains("took up the PulseAudio null sink ndd_speaker")
    });
    wait_for("the link back", WAIT, || {
        dev.stderr_now().contains("link restored after")
            || dev.stderr_now().matches("connected to").count() >= 2
    });
    std::thread::sleep(Duration::from_millis(500));
    let mut p = pa.paplay("dev_mic", &tone).expect("paplay");
    assert!(p.wait().unwrap().success());
    std::thread::sleep(Duration::from_millis(1000));
    assert!(
        recording.0.try_wait().unwrap().is_none(),
        "the recording program is still running"
    );
    // …on ndd_mic, not moved to another source (the default one might hear the tone too).
    let mic = sources()
        .lines()
        .find(|l| l.split('\t').nth(1) == Some("ndd_mic"))
        .and_then(|l| l.split('\t').next())
        .expect("ndd_mic")
        .to_string();
    let outputs = pa
        .pactl(&["list", "short", "source-outputs"])
        .unwrap_or_default();
    assert!(
        outputs
            .lines()
            .any(|l| l.split('\t').nth(1) == Some(mic.as_str())),
        "the recording is still on ndd_mic ({mic}): {outputs}"
    );
    drop(recording);
    let samples = read_s16le(&rec);
    let Some(Tone { len, hz, .. }) = Tone::of(&samples) else {
        panic!(
            "the tone played after the restart never reached the program recording since before it; app: {}",
            app.stderr_now()
        );
    };
    // (What this test is about is that the sound arrives at all, on the same program's
    // stream; the fidelity under load is the tests above's. A loaded machine that stalls the
    // recorder can still cut a block: a few hertz off.)
    assert!((hz - 440.0).abs() < 15.0, "{hz} Hz");
    assert!(len > 48_000, "{len} samples of tone");
    // The player's stream stayed on ndd_speaker all along.
    let inputs = pa
        .pactl(&["list", "short", "sink-inputs"])
        .unwrap_or_default();
    let sinks = pa.pactl(&["list", "short", "sinks"]).unwrap_or_default();
    let speaker = sinks
        .lines()
        .find(|l| l.split('\t').nth(1) == Some("ndd_speaker"))
        .and_then(|l| l.split('\t').next())
        .expect("ndd_speaker")
        .to_string();
    assert!(
        inputs
            .lines()
            .any(|l| l.split('\t').nth(1) == Some(speaker.as_str())),
        "the player still plays into ndd_speaker: {inputs}"
    );
    drop(playing);
    // With keep_s = 1 the next run takes the devices up, and once it stops they go a second
    // later (the detached unload checks the module is still the one it kept).
    app.terminate();
    let _ = app.finish();
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace(
            "virtual_source = \"ndd_mic\",",
            "virtual_source = \"ndd_mic\", keep_s = 1,",
        )
        .replace(
            "virtual_sink = \"ndd_speaker\",",
            "virtual_sink = \"ndd_speaker\", keep_s = 1,",
        );
    assert_eq!(text.matches("keep_s = 1").count(), 2);
    std::fs::write(&cfg, text).unwrap();
    let app = Side::spawn(app_cmd());
    wait_for("the last run's devices taken up", WAIT, || {
        app.stderr_now()
            .contains("took up the PulseAudio source ndd_mic")
    });
    app.terminate();
    let _ = app.finish();
    wait_for(
        "both devices gone after keep_s",
        Duration::from_secs(15),
        || {
            let s = sources();
            !s.contains("ndd_mic\t") && !s.contains("ndd_speaker.monitor\t")
        },
    );
    drop(dev.kill());
}

//! Streams cannot freeze each other (issue 31, item 4), with two real `ndd` processes over TLS:
//! one stream's sink is a named pipe nobody reads (its endpoint blocks opening it, so nothing
//! drains), and the other streams go on: a small reliable stream delivers every frame, the
//! link is never declared lost. Once a reader opens the pipe, the stuck stream delivers every
//! byte it held, in order: nothing lost.

mod common;

use common::*;
use std::io::Read;

/// A driver with a `stuck` stream into a named pipe nobody reads (`stuck`: the TOML of its
/// `reliability`, if any, and `source` lines) beside `events`, 600 checked frames of 100 bytes
/// every 2 ms: (the test's directory, device home, app home, the pipe, the config).
fn stuck_beside_events(
    name: &str,
    stuck: &str,
) -> (
    Dir,
    std::path::PathBuf,
    std::path::PathBuf,
    std::path::PathBuf,
    std::path::PathBuf,
) {
    let dir = Dir::new(name);
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let fifo = dir.0.join("stuck.out");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let cfg = dir.0.join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
driver = "isolation"
[[stream]]
name = "stuck"
direction = "device-to-app"
{stuck}
sink = {{ type = "file", path = "{}", framing = "length" }}
[[stream]]
name = "events"
direction = "device-to-app"
source = {{ type = "synthetic", size = 100, interval_ms = 2.0, count = 600, seed = 3 }}
sink = {{ type = "check", seed = 3, size = 100, expect = 600 }}
"#,
            fifo.display()
        ),
    )
    .unwrap();
    (dir, dev_home, app_home, fifo, cfg)
}

/// Waits (bounded by [`WAIT`]) until the app side's `--stats` says the `events` stream has all
/// its 600 frames.
fn all_events_arrive(app: &Side, dev: &Side) {
    let deadline = std::time::Instant::now() + WAIT;
    while !app
        .stderr_now()
        .lines()
        .any(|l| l.contains("events") && l.contains(" 600 frames"))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "not all 600 frames of the events stream: app: {}\ndevice: {}",
            app.stderr_now(),
            dev.stderr_now()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn a_sink_that_does_not_drain_holds_back_only_its_own_stream() {
    // The stuck stream: 20 000 frames of 1000 bytes (20 MB: more than the sink's channel, the
    // kernel's pipe and the peer's 16 MiB resume buffer hold, so its source stops until the
    // reader comes; the sides stay up meanwhile). The other: 600 frames of 100 bytes every
    // 2 ms, checked.
    let (dir, dev_home, app_home, fifo, cfg) = stuck_beside_events(
        "isolation",
        r#"source = { type = "synthetic", size = 1000, interval_ms = 0.1, count = 20000, seed = 5 }"#,
    );
    let link = free_addr();
    let app = Side::spawn(run_cmd(
        &cfg,
        "app",
        &app_home,
        &["--listen", &link, "--once", "--stats"],
    ));
    let dev = Side::spawn(run_cmd(
        &cfg,
        "device",
        &dev_home,
        &["--connect", &link, "--once"],
    ));
    // Every frame of the other stream arrives while the stuck one is stuck.
    all_events_arrive(&app, &dev);
    let (aerr, derr) = (app.stderr_now(), dev.stderr_now());
    assert!(
        !aerr.contains("link lost") && !derr.contains("link lost"),
        "app: {aerr}\ndevice: {derr}"
    );
    // The reader comes: every byte of the stuck stream, in order.
    let mut got = Vec::new();
    std::fs::File::open(&fifo)
        .unwrap()
        .read_to_end(&mut got)
        .unwrap();
    let (ds, _, derr) = dev.finish();
    let (as_, _, aerr) = app.finish();
    assert!(ds.success(), "device: {derr}");
    assert!(as_.success(), "app: {aerr}");
    assert!(aerr.contains(&check_ok("events", 600)), "{aerr}");
    assert_eq!(got.len(), 20000 * 1004, "bytes of the stuck stream");
    let copy = dir.0.join("stuck.copy");
    std::fs::write(&copy, &got).unwrap();
    assert_eq!(
        synthetic_seqs_in(&copy, 5, 20000),
        (0..20000).collect::<Vec<u64>>(),
        "the stuck stream's frames, in order"
    );
}

/// A side told to stop (Ctrl-C) while a sink takes nothing (a named pipe nobody ever reads)
/// still ends: it waits 5 s for the sink, says which stream's sink it left behind and how many
/// frames, writes its `--stats-json`, and exits. It used to wait for that sink forever, and
/// then for the endpoint's thread stuck opening the pipe, with SIGTERM and SIGINT alike.
#[test]
fn a_side_told_to_stop_leaves_a_sink_that_takes_nothing_behind_and_ends() {
    let (dir, dev_home, app_home, fifo, cfg) = stuck_beside_events(
        "isolation-stop",
        r#"reliability = "reliable"
source = { type = "synthetic", size = 1000, interval_ms = 1.0, count = 1000000, seed = 5 }"#,
    );
    let link = free_addr();
    let stats = dir.0.join("app.json");
    let stats_s = stats.display().to_string();
    let app = Side::spawn(run_cmd(
        &cfg,
        "app",
        &app_home,
        &[
            "--listen",
            &link,
            "--once",
            "--stats",
            "--stats-json",
            &stats_s,
        ],
    ));
    let dev = Side::spawn(run_cmd(&cfg, "device", &dev_home, &["--connect", &link]));
    all_events_arrive(&app, &dev);
    app.interrupt();
    let (status, _, err) = app.finish();
    assert!(status.success(), "app: {err}");
    let left = err
        .lines()
        .find(|l| l.contains("took no frame for 5 s as the side ended"))
        .unwrap_or_else(|| panic!("no word of the sink left behind: {err}"));
    assert!(
        left.contains("stream \"stuck\": its sink file(")
            && left.contains("frame(s) it had not taken are dropped"),
        "{left}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).expect("--stats-json written"))
            .unwrap();
    assert_eq!(v["streams"][1]["name"], "events", "{v}");
    assert_eq!(v["streams"][1]["frames"], 600, "{v}");
    drop(dev.kill());
    drop(fifo);
}

/// The same with the stuck stream lossy: the other stream still gets every frame, and the
/// stuck one's sink side drops the oldest frames it cannot hand on, counted as `sink_behind`
/// in `--stats-json`; once a reader comes, what it gets is in order, and every frame the
/// session handed on is either read or counted.
#[test]
fn a_lossy_sink_that_does_not_drain_drops_its_oldest_frames_and_counts_them() {
    let (dir, dev_home, app_home, fifo, cfg) = stuck_beside_events(
        "isolation-lossy",
        "reliability = \"lossy\"\nsource = { type = \"synthetic\", size = 1000, interval_ms = 0.2, count = 10000, seed = 5 }",
    );
    let link = free_addr();
    let stats = dir.0.join("app.json");
    let app = Side::spawn(run_cmd(
        &cfg,
        "app",
        &app_home,
        &[
            "--listen",
            &link,
            "--once",
            "--stats-json",
            stats.to_str().unwrap(),
        ],
    ));
    let dev = Side::spawn(run_cmd(
        &cfg,
        "device",
        &dev_home,
        &["--connect", &link, "--once"],
    ));
    // The device side's sources end (10 000 frames take 2 s); the app side's events stream
    // completes while the stuck one holds what it could not hand on.
    let (ds, _, derr) = dev.finish();
    assert!(ds.success(), "device: {derr}");
    assert!(!derr.contains("link lost"), "device: {derr}");
    // Now a reader: what the stuck stream kept comes out, in order.
    let mut got = Vec::new();
    std::fs::File::open(&fifo)
        .unwrap()
        .read_to_end(&mut got)
        .unwrap();
    let (as_, _, aerr) = app.finish();
    assert!(as_.success(), "app: {aerr}");
    assert!(aerr.contains(&check_ok("events", 600)), "{aerr}");
    let copy = dir.0.join("stuck.copy");
    std::fs::write(&copy, &got).unwrap();
    let seqs = synthetic_seqs_in(&copy, 5, 10000);
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "the stuck stream's frames out of order or twice"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    let stuck = v["streams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "stuck")
        .expect("the stuck stream's stats")
        .clone();
    let behind = stuck["sink_behind"].as_u64().unwrap();
    let handed = stuck["frames"].as_u64().unwrap();
    assert!(behind > 0, "nothing counted as sink behind: {stuck}");
    assert!(
        (seqs.len() as u64) < 10_000,
        "a sink nobody read took every frame"
    );
    assert_eq!(
        seqs.len() as u64 + behind,
        handed,
        "every frame handed on is read or counted: {stuck}"
    );
}

//! One listener, many peers (issue 34 item 2), with real processes: an app side with
//! `link.peers = 3` serves three device sides at once, each its own session and endpoints
//! (`{peer}` in a sink's path), a fourth trusted one is told the side is busy while the three
//! are connected, and a device side killed and started again gets its own session back.

mod common;

use common::*;
use std::path::{Path, PathBuf};

fn config(dir: &Path, count: u64) -> PathBuf {
    let cfg = dir.join("lab.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"driver = "lab"
[link]
peers = 3
ping_interval_ms = 100
keepalive_timeout_ms = 600
max_backoff_ms = 200

[[stream]]
name = "s"
direction = "device-to-app"
source = {{ type = "synthetic", size = 200, interval_ms = 2.0, count = {count}, seed = 7 }}
sink = {{ type = "check", seed = 7, size = 200, expect = {count} }}

[[stream]]
name = "log"
direction = "device-to-app"
source = {{ type = "synthetic", size = 64, interval_ms = 5.0, count = 100, seed = 8 }}
sink = {{ type = "file", path = "{}/out-{{peer}}.bin", framing = "length" }}
"#,
            dir.display()
        ),
    )
    .unwrap();
    cfg
}

#[test]
fn one_listener_serves_three_device_sides_each_with_its_own_session_and_endpoints() {
    let dir = Dir::new("many-peers");
    let (app_home, devs) = lab_homes(&dir.0, 4);
    // 3000 frames every 2 ms: the three sessions overlap for seconds.
    let cfg = config(&dir.0, 3000);
    let metrics = free_addr();
    let app = Side::spawn(run_cmd(
        &cfg,
        "app",
        &app_home,
        &[
            "--listen",
            "127.0.0.1:0",
            "--once",
            "--metrics",
            &metrics,
            "--stats",
        ],
    ));
    let addr = app.addr();
    let sides: Vec<Side> = devs[..3]
        .iter()
        .map(|d| Side::spawn(run_cmd(&cfg, "device", d, &["--connect", &addr, "--once"])))
        .collect();
    wait_for("three peers served", WAIT, || {
        app.stderr_now().matches("streams agreed").count() >= 3
    });
    // `--metrics` serves every peer's counters, each labelled with its peer.
    wait_for("each peer in the metrics", WAIT, || {
        let m = http_get(&metrics, "/metrics");
        (0..3).all(|i| {
            m.contains(&format!("ndd_link_up{{side=\"app\",peer=\"lab{i}\"}} 1"))
                && m.contains(&format!(
                    "ndd_stream_frames_total{{side=\"app\",peer=\"lab{i}\",stream=\"s\",role=\"sink\"}}"
                ))
        })
    });
    let m = http_get(&metrics, "/metrics");
    assert_eq!(
        m.matches("# TYPE ndd_link_up gauge").count(),
        1,
        "each family once: {m}"
    );
    assert!(m.trim_end().ends_with("# EOF"), "{m}");
    // A fourth trusted device while the three are connected: busy, and told so.
    let fourth = Side::spawn(run_cmd(&cfg, "device", &devs[3], &["--connect", &addr]));
    wait_for(
        "the fourth device side told the app side is busy",
        WAIT,
        || fourth.stderr_now().contains("serves 3 peers already"),
    );
    fourth.kill();
    for (i, s) in sides.into_iter().enumerate() {
        let (st, _, err) = s.finish();
        assert!(st.success(), "device {i}: {err}");
    }
    let (st, _, err) = app.finish();
    assert!(st.success(), "app: {err}");
    for i in 0..3 {
        assert!(
            err.contains(&check_ok(&format!("s@lab{i}"), 3000)),
            "lab{i}'s own check: {err}"
        );
        let out = std::fs::read(dir.0.join(format!("out-lab{i}.bin"))).unwrap();
        assert_eq!(out.len(), 100 * (4 + 64), "lab{i}'s own file");
        // `--stats`: each peer's streams on lines of their own (stderr is not a terminal).
        assert!(
            err.lines()
                .any(|l| l.starts_with(&format!("[app@lab{i}] s "))),
            "lab{i}'s live lines: {err}"
        );
    }
}

#[test]
fn a_device_side_that_comes_back_gets_its_session_back_and_a_stranger_nothing() {
    let dir = Dir::new("many-peers-back");
    let (app_home, devs) = lab_homes(&dir.0, 2);
    let cfg = config(&dir.0, 2000);
    let app = Side::spawn(run_cmd(
        &cfg,
        "app",
        &app_home,
        &["--listen", "127.0.0.1:0"],
    ));
    let addr = app.addr();
    let steady = Side::spawn(run_cmd(&cfg, "device", &devs[0], &["--connect", &addr]));
    let first = Side::spawn(run_cmd(&cfg, "device", &devs[1], &["--connect", &addr]));
    wait_for("two peers served", WAIT, || {
        app.stderr_now().matches("streams agreed").count() >= 2
    });
    // lab1 goes away and comes back (a new process: the session sees the peer restart).
    first.kill();
    let again = Side::spawn(run_cmd(&cfg, "device", &devs[1], &["--connect", &addr]));
    wait_for("lab1 back", WAIT, || {
        again.stderr_now().contains("connected to") || again.stderr_now().contains("reconnected")
    });
    // A stranger (not in known_peers) is refused as ever, and names its fingerprint.
    let stranger_home = dir.0.join("stranger");
    let mut stranger = run_cmd(
        &cfg,
        "device",
        &stranger_home,
        &["--connect", &addr, "--once"],
    );
    let out = stranger.output().unwrap();
    let serr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the stranger is refused: {serr}");
    assert!(
        serr.contains("known_peers") || serr.contains("trust"),
        "{serr}"
    );
    let log = app.stderr_now();
    assert!(!log.contains("panicked"), "the app side goes on: {log}");
    app.interrupt();
    let (_, _, aerr) = app.finish();
    assert!(aerr.matches("peer lab1").count() >= 1, "{aerr}");
    drop((steady, again));
}

#[test]
fn a_second_machine_with_the_same_identity_is_told_so_and_gets_in_when_the_first_goes() {
    let dir = Dir::new("many-peers-clone");
    let (app_home, devs) = lab_homes(&dir.0, 1);
    // The same home on a second machine: the same identity.
    let clone_home = dir.0.join("dev0-clone");
    std::fs::create_dir_all(&clone_home).unwrap();
    for e in std::fs::read_dir(&devs[0]).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), clone_home.join(e.file_name())).unwrap();
        }
    }
    let cfg = config(&dir.0, 100_000);
    let app = Side::spawn(run_cmd(
        &cfg,
        "app",
        &app_home,
        &["--listen", "127.0.0.1:0"],
    ));
    let addr = app.addr();
    let first = Side::spawn(run_cmd(&cfg, "device", &devs[0], &["--connect", &addr]));
    wait_for("lab0 served", WAIT, || {
        app.stderr_now().contains("streams agreed")
    });
    let clone = Side::spawn(run_cmd(&cfg, "device", &clone_home, &["--connect", &addr]));
    wait_for("the clone told why it waits", WAIT, || {
        clone
            .stderr_now()
            .contains("is connected already to a side with this identity")
    });
    // The first keeps its link: nothing fights over it.
    std::thread::sleep(std::time::Duration::from_secs(2));
    let ferr = first.stderr_now();
    assert!(
        !ferr.contains("link lost") && !ferr.contains("reconnect"),
        "the first side keeps its link: {ferr}"
    );
    assert_eq!(app.stderr_now().matches("streams agreed").count(), 1);
    // The first goes: the clone gets in (the same peer's session, taken back).
    first.kill();
    wait_for("the clone served", WAIT, || {
        let e = clone.stderr_now();
        e.contains("connected to") || e.contains("reconnected")
    });
    let log = app.stderr_now();
    assert!(!log.contains("panicked"), "{log}");
    app.interrupt();
    drop((app, clone));
}

#[test]
fn duration_ends_a_side_serving_several_peers_cleanly_and_insecure_peers_are_known_by_address() {
    let dir = Dir::new("many-peers-duration");
    let (app_home, devs) = lab_homes(&dir.0, 1);
    let cfg = config(&dir.0, 100_000);
    // Without TLS a peer is known by its IP: a device side that goes and comes back (from
    // another port) gets its own session back, not a second one.
    let app = Side::spawn(run_cmd(
        &cfg,
        "app",
        &app_home,
        &["--listen", "127.0.0.1:0", "--duration", "6", "--insecure"],
    ));
    let addr = app.addr();
    let first = Side::spawn(run_cmd(
        &cfg,
        "device",
        &devs[0],
        &["--connect", &addr, "--insecure"],
    ));
    wait_for("the peer served", WAIT, || {
        app.stderr_now().contains("streams agreed")
    });
    first.kill();
    let again = Side::spawn(run_cmd(
        &cfg,
        "device",
        &devs[0],
        &["--connect", &addr, "--insecure"],
    ));
    wait_for("the same session taking it back", WAIT, || {
        app.stderr_now().contains("reconnected to 127.0.0.1")
    });
    let (st, _, err) = app.finish();
    // Not an error (exit 1: it said no peer connected, before the fix); the check sink's
    // verdict on a source that restarted from its first frame is exit 3.
    assert!(
        !err.contains("no peer connected within") && st.code() == Some(3),
        "--duration ends it cleanly: {st:?} {err}"
    );
    assert_eq!(err.matches("connected as").count(), 1, "one session: {err}");
    drop(again);
}

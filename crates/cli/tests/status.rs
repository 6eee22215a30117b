//! `ndd status` against two real `ndd run` processes (issue 34 item 5): each side answers on
//! its socket in the status directory; a side killed with SIGKILL leaves a socket nobody
//! answers on, which `ndd status` clears.

mod common;

use common::*;
use std::process::Command;

const CFG: &str = r#"
driver = "stat"
[link]
ping_interval_ms = 100
keepalive_timeout_ms = 600
max_backoff_ms = 200
[[stream]]
name = "events"
direction = "device-to-app"
source = { type = "synthetic", size = 64, interval_ms = 5.0, count = 1000000, seed = 3 }
sink = { type = "null" }
"#;

fn status(dir: &std::path::Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ndd"))
        .arg("status")
        .args(args)
        .env("NDD_STATUS_DIR", dir)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
    )
}

#[test]
fn status_lists_each_running_side_its_link_and_streams_and_forgets_a_killed_one() {
    let dir = Dir::new("status");
    let sockets = dir.0.join("run");
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let cfg = dir.0.join("c.toml");
    std::fs::write(&cfg, CFG).unwrap();
    // Nothing runs yet: said, exit code 1.
    let (ok_, out) = status(&sockets, &[]);
    assert!(!ok_);
    assert!(out.contains("no ndd side is running here"), "{out}");
    let mut c = run_cmd(&cfg, "app", &app_home, &["--listen", "127.0.0.1:0"]);
    c.env("NDD_STATUS_DIR", &sockets);
    let app = Side::spawn(c);
    let addr = app.addr();
    // The listener alone: waiting.
    wait_for("the app side's status", WAIT, || {
        status(&sockets, &[]).1.contains("waiting for the peer")
    });
    let mut c = run_cmd(&cfg, "device", &dev_home, &["--connect", &addr]);
    c.env("NDD_STATUS_DIR", &sockets);
    let dev = Side::spawn(c);
    wait_for("both sides up with frames moving", WAIT, || {
        let (_, out) = status(&sockets, &["--json"]);
        let sides: Vec<serde_json::Value> = out
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        sides.len() == 2
            && sides.iter().all(|s| {
                s["link"] == "up"
                    && s["streams"][0]["name"] == "events"
                    && s["streams"][0]["frames"].as_u64().unwrap_or(0) > 20
                    && s["streams"][0]["rate_fps"].as_f64().unwrap_or(0.0) > 50.0
            })
    });
    let (ok_, table) = status(&sockets, &[]);
    assert!(ok_);
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("DRIVER  SIDE"), "{table}");
    assert!(
        lines.iter().any(|l| l.starts_with("stat    app ")
            && l.contains(" up ")
            && l.contains("events")
            && l.contains("device→app (sink)")),
        "{table}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("stat    device ") && l.contains("device→app (source)")),
        "{table}"
    );
    // The device side dies without a word: its socket stays, nobody answers; the app side
    // says the link is down and why.
    dev.kill();
    wait_for("the app side's loss", WAIT, || {
        let (_, t) = status(&sockets, &[]);
        !t.contains("stat    device") && t.contains("last error: link lost: ")
    });
    let left: Vec<String> = std::fs::read_dir(&sockets)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .collect();
    assert_eq!(left.len(), 1, "the dead side's socket is removed: {left:?}");
    assert!(left[0].starts_with("stat-app-"), "{left:?}");
    app.kill();
}

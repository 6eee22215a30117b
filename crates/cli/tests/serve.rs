//! `ndd serve DIR`: one process runs every driver file in DIR, each isolated; a changed file
//! restarts its driver alone, a new one starts, a removed one stops, SIGHUP reads the
//! directory at once, SIGTERM stops them all. Real processes: the daemon is the app side of
//! two drivers, each fed by its own `ndd run` device side.

mod common;

use common::*;
use std::path::Path;
use std::time::{Duration, Instant};

/// A driver whose device side sends `count` checked frames to the app side.
fn driver(name: &str, addr: &str, count: u64, side: Option<&str>) -> String {
    let side = side.map_or(String::new(), |s| format!("side = \"{s}\"\n"));
    format!(
        "driver = \"{name}\"\n{side}[link]\naddress = \"{addr}\"\nlistener = \"app\"\n\
         [[stream]]\nname = \"{name}-events\"\ndirection = \"device-to-app\"\n\
         source = {{ type = \"synthetic\", size = 32, interval_ms = 1.0, count = {count}, seed = 3 }}\n\
         sink = {{ type = \"check\", seed = 3, size = 32, expect = {count} }}\n"
    )
}

fn device(dir: &Path, name: &str, text: &str, home: &Path) -> Side {
    let cfg = dir.join(format!("{name}-device.toml"));
    std::fs::write(&cfg, text).unwrap();
    Side::spawn(run_cmd(&cfg, "device", home, &["--once"]))
}

fn count(text: &str, needle: &str) -> usize {
    text.matches(needle).count()
}

fn wait_until(what: &str, daemon: &Side, cond: impl Fn(&str) -> bool) {
    let t0 = Instant::now();
    while !cond(&daemon.stderr_now()) {
        assert!(
            t0.elapsed() < WAIT,
            "timed out waiting for {what}; the daemon said:\n{}",
            daemon.stderr_now()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn one_daemon_runs_every_driver_alone_and_follows_its_directory() {
    let dir = Dir::new("serve");
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let drivers = dir.0.join("drivers");
    std::fs::create_dir_all(&drivers).unwrap();
    let (a1, a2, a3) = (free_addr(), free_addr(), free_addr());
    std::fs::write(
        drivers.join("one.toml"),
        driver("one", &a1, 300, Some("app")),
    )
    .unwrap();
    std::fs::write(
        drivers.join("two.toml"),
        driver("two", &a2, 200, Some("app")),
    )
    .unwrap();
    // A file that names no side, and one that does not parse: said, skipped, no harm.
    std::fs::write(drivers.join("noside.toml"), driver("noside", &a3, 5, None)).unwrap();
    std::fs::write(drivers.join("broken.toml"), "driver = [").unwrap();
    // Not a driver file.
    std::fs::write(drivers.join("notes.txt"), "hello").unwrap();
    let mut serve = ndd();
    serve
        .arg("serve")
        .arg(&drivers)
        .arg("--home")
        .arg(&app_home)
        .env("NDD_LOG", "warn,ndd::session=info,ndd::serve=info")
        .env("NDD_STATUS_DIR", dir.0.join("status"));
    std::fs::create_dir_all(dir.0.join("status")).unwrap();
    let daemon = Side::spawn(serve);
    daemon.wait_says("starting driver one", &[]);
    daemon.wait_says("starting driver two", &[]);
    daemon.wait_says("noside.toml names no side: add side = \"device\"", &[]);
    daemon.wait_says("driver broken not started:", &[]);
    // `ndd status` asks the one process about each of its drivers.
    wait_until("both drivers in ndd status", &daemon, |_| {
        let out = ndd()
            .arg("status")
            .env("NDD_STATUS_DIR", dir.0.join("status"))
            .output()
            .unwrap();
        let table = String::from_utf8_lossy(&out.stdout);
        table.contains("one") && table.contains("two")
    });

    // Both drivers serve their device sides at once; each line says its driver.
    let d1 = device(&dir.0, "one", &driver("one", &a1, 300, None), &dev_home);
    let d2 = device(&dir.0, "two", &driver("two", &a2, 200, None), &dev_home);
    daemon.wait_says(&check_ok("one-events", 300), &[&d1, &d2]);
    daemon.wait_says(&check_ok("two-events", 200), &[&d1, &d2]);
    let text = daemon.stderr_now();
    assert!(
        text.lines()
            .any(|l| l.starts_with("ndd [one app]:") && l.contains("one-events")),
        "lines of driver one carry its name:\n{text}"
    );
    for d in [d1, d2] {
        let (status, _, err) = d.finish();
        assert!(status.success(), "device side failed: {err}");
    }

    // A new file, read at SIGHUP (well before the next scan would).
    let a4 = free_addr();
    std::fs::write(
        drivers.join("three.toml"),
        driver("three", &a4, 100, Some("app")),
    )
    .unwrap();
    daemon.hangup();
    daemon.wait_says("starting driver three", &[]);
    let d3 = device(&dir.0, "three", &driver("three", &a4, 100, None), &dev_home);
    daemon.wait_says(&check_ok("three-events", 100), &[&d3]);
    let _ = d3.finish();

    // one.toml changes: only driver one restarts, and serves the new count.
    std::fs::write(
        drivers.join("one.toml"),
        driver("one", &a1, 150, Some("app")),
    )
    .unwrap();
    daemon.wait_says("stopping driver one", &[]);
    wait_until("driver one to start again", &daemon, |t| {
        t.split("stopping driver one")
            .nth(1)
            .is_some_and(|after| after.contains("starting driver one"))
    });
    let d1 = device(&dir.0, "one", &driver("one", &a1, 150, None), &dev_home);
    daemon.wait_says(&check_ok("one-events", 150), &[&d1]);
    let _ = d1.finish();
    // two.toml goes: driver two stops. Only the changed and the removed file stopped a
    // driver (a driver whose peer ended its streams starts again by itself, to serve the
    // next one: that is no stop).
    std::fs::remove_file(drivers.join("two.toml")).unwrap();
    daemon.wait_says("stopping driver two", &[]);
    let text = daemon.stderr_now();
    assert_eq!(count(&text, "stopping driver"), 2, "{text}");
    assert_eq!(count(&text, "stopping driver one"), 1, "{text}");
    assert!(!text.contains("panicked"), "{text}");

    // SIGTERM: every driver stops and the daemon ends cleanly.
    daemon.terminate();
    let (status, _, err) = daemon.finish();
    assert!(status.success(), "the daemon failed to stop cleanly: {err}");
}

#[test]
fn a_missing_directory_is_one_clear_line() {
    let dir = Dir::new("serve-missing");
    let out = ndd()
        .arg("serve")
        .arg(dir.0.join("nope"))
        .arg("--home")
        .arg(dir.0.join("home"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot read the driver directory") && err.contains("nope"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

#[test]
fn check_probes_the_side_a_driver_file_names() {
    let dir = Dir::new("serve-check");
    let file = |side: &str| {
        format!(
            "driver = \"x\"\n{side}[[stream]]\nname = \"s\"\ndirection = \"device-to-app\"\n\
             source = {{ type = \"file\", path = \"/nonexistent/input\" }}\nsink = {{ type = \"null\" }}\n"
        )
    };
    let (named, shared) = (dir.0.join("named.toml"), dir.0.join("shared.toml"));
    std::fs::write(&named, file("side = \"device\"\n")).unwrap();
    std::fs::write(&shared, file("")).unwrap();
    // The file both sides share: only parsed. The one naming the device side: its file
    // source is opened, and fails.
    let ok_out = ndd().arg("check").arg(&shared).output().unwrap();
    assert!(ok_out.status.success(), "{ok_out:?}");
    let out = ndd().arg("check").arg(&named).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("cannot open /nonexistent/input"), "{err}");
}

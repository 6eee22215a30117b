//! Sides outlive their peers (real processes): a clean stop (SIGTERM) of the device side
//! leaves the app side running with its pty in place; what a program writes into the pty
//! meanwhile reaches the device side's next run; the device side may start before the app
//! side listens. `--once` keeps a one-session run: the peer's stop ends the side.

mod common;

use common::*;
use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A serial share between two ptys: the device side's pty stands in for the port (the test
/// plays the device on it), the app side's pty is what a program opens.
fn config(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let app_tty = dir.join("ttyREMOTE");
    let dev_tty = dir.join("ttyDEVICE");
    let cfg = dir.join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
driver = "outlive"
[link]
ping_interval_ms = 100
keepalive_timeout_ms = 1000
max_backoff_ms = 200
[[stream]]
name = "rx"
direction = "device-to-app"
source = {{ type = "pty", link = "{dev}" }}
sink = {{ type = "pty", link = "{app}" }}
[[stream]]
name = "tx"
direction = "app-to-device"
source = {{ type = "pty", link = "{app}" }}
sink = {{ type = "pty", link = "{dev}" }}
"#,
            app = app_tty.display(),
            dev = dev_tty.display()
        ),
    )
    .unwrap();
    (cfg, app_tty, dev_tty)
}

/// Opens a pty link and collects what can be read from it, in a thread.
fn open_collecting(path: &std::path::Path) -> (std::fs::File, Arc<Mutex<Vec<u8>>>) {
    // The side creates it as its endpoints start, just after the handshake.
    wait_for("the pty link", WAIT, || path.exists());
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let got = Arc::new(Mutex::new(Vec::new()));
    let (mut r, g) = (f.try_clone().unwrap(), got.clone());
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = r.read(&mut buf) {
            if n == 0 {
                break;
            }
            g.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    });
    (f, got)
}

fn has(got: &Arc<Mutex<Vec<u8>>>, what: &str) -> bool {
    String::from_utf8_lossy(&got.lock().unwrap()).contains(what)
}

#[test]
fn a_clean_stop_of_the_device_side_leaves_the_app_side_and_its_pty_in_place() {
    let dir = Dir::new("outlive");
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let (cfg, app_tty, dev_tty) = config(&dir.0);
    let addr = free_addr();
    // The device side first: it waits for the app side instead of giving up.
    let dev = Side::spawn(run_cmd(&cfg, "device", &dev_home, &["--connect", &addr]));
    std::thread::sleep(Duration::from_millis(1500));
    let mut app = Side::spawn(run_cmd(&cfg, "app", &app_home, &["--listen", &addr]));
    dev.wait_says("streams agreed", &[&app]);
    // A program opens the pty and keeps it open across the device side's restart.
    let (mut program, program_got) = open_collecting(&app_tty);
    let (mut port, port_got) = open_collecting(&dev_tty);
    program.write_all(b"before\n").unwrap();
    port.write_all(b"hello program\n").unwrap();
    wait_for("both ways", WAIT, || {
        has(&port_got, "before\n") && has(&program_got, "hello program\n")
    });

    dev.terminate();
    let (ds, _, derr) = dev.finish();
    assert!(ds.success(), "a clean stop: {derr}");
    let t = std::time::Instant::now();
    while !app
        .stderr_now()
        .contains("the peer stopped; this side keeps its endpoints and waits for it to come back")
    {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the app side did not say the peer stopped; app: {}\ndevice: {derr}",
            app.stderr_now()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(app.running(), "the app side outlives its peer");
    assert!(
        std::fs::symlink_metadata(&app_tty).is_ok(),
        "the pty link stays"
    );
    // Written while the device side is away: held, not lost.
    program.write_all(b"meanwhile\n").unwrap();
    std::thread::sleep(Duration::from_millis(500));

    let dev = Side::spawn(run_cmd(&cfg, "device", &dev_home, &["--connect", &addr]));
    wait_for("the device side's new pty", WAIT, || {
        dev.stderr_now().contains("streams agreed")
    });
    let (mut port, port_got) = open_collecting(&dev_tty);
    wait_for(
        "the line written meanwhile at the new device run",
        WAIT,
        || has(&port_got, "meanwhile\n"),
    );
    port.write_all(b"back again\n").unwrap();
    wait_for("the same program reads on", WAIT, || {
        has(&program_got, "back again\n")
    });
    let aerr = app.stderr_now();
    assert!(aerr.contains("the peer restarted"), "{aerr}");
    assert!(!aerr.contains("panicked"), "{aerr}");
    assert!(!aerr.contains("network failure"), "{aerr}");
    let derr = dev.kill();
    assert!(!derr.contains("panicked"), "{derr}");
    app.kill();
}

#[test]
fn with_once_the_peer_stopping_ends_the_side_as_before() {
    let dir = Dir::new("outlive-once");
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let (cfg, _, _) = config(&dir.0);
    let app = Side::spawn(run_cmd(
        &cfg,
        "app",
        &app_home,
        &["--listen", "127.0.0.1:0", "--once"],
    ));
    let addr = app.addr();
    let dev = Side::spawn(run_cmd(&cfg, "device", &dev_home, &["--connect", &addr]));
    wait_for("the session on both sides", WAIT, || {
        app.stderr_now().contains("streams agreed") && dev.stderr_now().contains("streams agreed")
    });
    std::thread::sleep(Duration::from_millis(300));
    dev.terminate();
    let (ds, _, derr) = dev.finish();
    assert!(ds.success(), "{derr}");
    // The device side outlives peers but was told to stop: it went away; the app side runs
    // one session only, so a going-away peer ends it.
    let (st, _, aerr) = app.finish();
    assert!(st.success(), "{aerr}");
    assert!(!aerr.contains("waits for it to come back"), "{aerr}");
}

#[test]
fn with_once_the_first_connect_gives_up_after_the_connect_timeout() {
    let dir = Dir::new("outlive-giveup");
    let (dev_home, _, _, _) = homes(&dir.0, true, true);
    let (cfg, _, _) = config(&dir.0);
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("[link]", "[link]\nconnect_timeout_ms = 700");
    std::fs::write(&cfg, text).unwrap();
    let addr = free_addr();
    let out = run_cmd(&cfg, "device", &dev_home, &["--connect", &addr, "--once"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains(&format!("cannot connect to {addr}")), "{err}");
    // Without --once it keeps trying and says so.
    let mut dev = Side::spawn(run_cmd(&cfg, "device", &dev_home, &["--connect", &addr]));
    wait_for("the waiting line", WAIT, || {
        let e = dev.stderr_now();
        e.contains(&format!("cannot connect to {addr}"))
            && e.contains("(nothing listens there yet: start the other side with --listen on that address); waiting for the peer, retrying every 0.2 s at most")
    });
    assert!(dev.running());
    dev.kill();
}

#[test]
fn a_side_listening_alone_says_what_its_peer_needs() {
    let dir = Dir::new("outlive-alone");
    let (_, app_home, _, _) = homes(&dir.0, true, true);
    let (cfg, _, _) = config(&dir.0);
    let addr = free_addr();
    let mut app = Side::spawn(run_cmd(&cfg, "app", &app_home, &["--listen", &addr]));
    // After five seconds alone, once: how to start the other side, and that a loopback
    // address is this machine's only.
    wait_for("the hint", Duration::from_secs(20), || {
        app.stderr_now().contains(&format!(
            "no device side has connected to {addr} yet: start it on this machine with `ndd run CONFIG --side device --connect {addr}`; 127.0.0.1 is this machine only: for a peer on another machine, listen with --listen 0.0.0.0:"
        ))
    });
    std::thread::sleep(Duration::from_millis(5500));
    assert_eq!(
        app.stderr_now()
            .matches("no device side has connected")
            .count(),
        1
    );
    assert!(app.running());
    app.kill();
}

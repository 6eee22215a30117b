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
source = {{ type = "pty", link = "{dev}", keep_s = 0 }}
sink = {{ type = "pty", link = "{app}" }}
[[stream]]
name = "tx"
direction = "app-to-device"
source = {{ type = "pty", link = "{app}" }}
sink = {{ type = "pty", link = "{dev}", keep_s = 0 }}
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

/// The app side, saying (as by default) when it takes up a kept pty.
fn app_cmd(cfg: &std::path::Path, home: &std::path::Path, addr: &str) -> std::process::Command {
    let mut c = run_cmd(cfg, "app", home, &["--listen", addr]);
    c.env(
        "NDD_LOG",
        "warn,ndd::session=info,ndd_endpoint::serial::tty=info",
    );
    c
}

/// Issue 34, item 6: a program holding the app side's pty keeps a working port across a crash
/// (SIGKILL) and a clean restart of the app side. It never sees an error, what it writes while
/// the side is away reaches the device's port, and it reads on from the same open file (it
/// got `Input/output error` for good, and had to open the port again).
#[test]
fn a_program_keeps_its_port_across_a_crash_and_a_restart_of_the_app_side() {
    let dir = Dir::new("outlive-pty");
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let (cfg, app_tty, dev_tty) = config(&dir.0);
    let addr = free_addr();
    let app = Side::spawn(app_cmd(&cfg, &app_home, &addr));
    let dev = Side::spawn(run_cmd(&cfg, "device", &dev_home, &["--connect", &addr]));
    dev.wait_says("streams agreed", &[&app]);
    let (mut program, program_got) = open_collecting(&app_tty);
    let (mut port, port_got) = open_collecting(&dev_tty);
    program.write_all(b"before\n").unwrap();
    port.write_all(b"hello program\n").unwrap();
    wait_for("both ways", WAIT, || {
        has(&port_got, "before\n") && has(&program_got, "hello program\n")
    });
    let slave = std::fs::read_link(&app_tty).unwrap();

    // A crash: no goodbye, no cleanup.
    let said = app.kill();
    assert!(!said.contains("pty will go with this side"), "{said}");
    std::thread::sleep(Duration::from_millis(300));
    program
        .write_all(b"while it was down\n")
        .expect("the port works with the side down");
    let app = Side::spawn(app_cmd(&cfg, &app_home, &addr));
    app.wait_says("took up the pty kept since this side's last run", &[&dev]);
    assert_eq!(std::fs::read_link(&app_tty).unwrap(), slave, "the same pty");
    wait_for("what it wrote meanwhile, at the device", WAIT, || {
        has(&port_got, "while it was down\n")
    });
    port.write_all(b"after the crash\n").unwrap();
    wait_for("the program reads on", WAIT, || {
        has(&program_got, "after the crash\n")
    });

    // A clean stop and start (a service restarted).
    app.terminate();
    let (status, _, err) = app.finish();
    assert!(status.success(), "{err}");
    assert_eq!(std::fs::read_link(&app_tty).unwrap(), slave, "kept");
    program.write_all(b"between runs\n").unwrap();
    let app = Side::spawn(app_cmd(&cfg, &app_home, &addr));
    app.wait_says("took up the pty kept since this side's last run", &[&dev]);
    wait_for("the line written between runs", WAIT, || {
        has(&port_got, "between runs\n")
    });
    port.write_all(b"after the restart\n").unwrap();
    wait_for("the program reads on again", WAIT, || {
        has(&program_got, "after the restart\n")
    });
    // A second app side on the same pty (with a device side of its own) is refused while this
    // one runs.
    let cfg2 = dir.0.join("second.toml");
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg2, text.replace("ttyDEVICE", "ttyDEVICE2")).unwrap();
    let addr2 = free_addr();
    let second = Side::spawn(app_cmd(&cfg2, &app_home, &addr2));
    let dev2 = Side::spawn(run_cmd(&cfg2, "device", &dev_home, &["--connect", &addr2]));
    let (status, _, err) = second.finish();
    assert!(!status.success(), "{err}");
    assert!(
        err.contains("another running ndd side uses this pty"),
        "{err}"
    );
    dev2.kill();
    wait_for("the first app side still serving", WAIT, || {
        port.write_all(b"still\n").unwrap();
        std::thread::sleep(Duration::from_millis(100));
        has(&program_got, "still\n")
    });
    app.kill();
    dev.kill();
}

/// With `keep_s` the holder lets go after that long without a side: the link goes, and a
/// program holding the port sees it hang up (as it would without a holder).
#[test]
fn a_kept_pty_is_let_go_after_keep_s() {
    let dir = Dir::new("outlive-keep");
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let (cfg, app_tty, _) = config(&dir.0);
    let text = std::fs::read_to_string(&cfg).unwrap().replace(
        &format!("link = \"{}\" }}", app_tty.display()),
        &format!("link = \"{}\", keep_s = 1 }}", app_tty.display()),
    );
    std::fs::write(&cfg, text).unwrap();
    let addr = free_addr();
    let app = Side::spawn(app_cmd(&cfg, &app_home, &addr));
    let dev = Side::spawn(run_cmd(&cfg, "device", &dev_home, &["--connect", &addr]));
    dev.wait_says("streams agreed", &[&app]);
    let (_program, _) = open_collecting(&app_tty);
    let said = app.kill();
    assert!(std::fs::symlink_metadata(&app_tty).is_ok(), "kept for now");
    let t0 = std::time::Instant::now();
    while std::fs::symlink_metadata(&app_tty).is_ok() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the link did not go after keep_s; the app side said: {said}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    dev.kill();
}

//! Two "machines" on one LAN (issue 34, items 4, 7 and 9): two network namespaces joined by a
//! veth pair, a one-line serial share from one to the other, and the wire pulled out for a
//! while as a cable would be — nothing passes, no connection is refused or reset. Both sides
//! must say the link is lost within the keepalive (1.5 s by default), reconnect on their own
//! once the wire is back, count the outage from the last message heard, and the bytes written
//! while it was down must arrive, once and in order. Skips, printing `SKIPPED: …`, where
//! network namespaces cannot be made (not root, no `ip`) or socat is missing.

mod common;

use common::*;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

#[test]
fn a_serial_share_between_two_machines_comes_back_after_the_wire_is_pulled() {
    if let Some(m) = missing(&["socat"]) {
        println!("SKIPPED: needs {m} (apt-get install socat)");
        return;
    }
    let Some(lan) = Lan::new() else {
        println!("SKIPPED: needs network namespaces (root and `ip`)");
        return;
    };
    let dir = Dir::new("lan-serial");
    let (_pair, port, device) = pty_pair(&dir.0);
    let remote = dir.0.join("ttyREMOTE");
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let addr = lan.b_addr(7904);
    let app = Side::spawn(Lan::ndd(
        &lan.b,
        &[
            "attach",
            "serial",
            "--link",
            remote.to_str().unwrap(),
            "--listen",
            &addr,
            "--baud",
            "9600",
            "--home",
            app_home.to_str().unwrap(),
        ],
    ));
    let dev = Side::spawn(Lan::ndd(
        &lan.a,
        &[
            "share",
            "serial",
            port.to_str().unwrap(),
            "--to",
            &addr,
            "--baud",
            "9600",
            "--home",
            dev_home.to_str().unwrap(),
        ],
    ));
    dev.wait_says("streams agreed", &[&app]);
    wait_for("the remote port", WAIT, || remote.exists());
    let open = |p: &std::path::Path| {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(p)
            .unwrap()
    };
    let (mut dev_end, mut prog_end) = (open(&device), open(&remote));
    let read_lines = |f: &mut std::fs::File, n: usize| {
        let mut got = Vec::new();
        let mut b = [0u8; 256];
        let t = Instant::now();
        while got.iter().filter(|&&c| c == b'\n').count() < n && t.elapsed() < WAIT {
            let k = f.read(&mut b).unwrap();
            got.extend_from_slice(&b[..k]);
        }
        String::from_utf8_lossy(&got).to_string()
    };
    dev_end.write_all(b"before the cut\n").unwrap();
    assert_eq!(read_lines(&mut prog_end, 1), "before the cut\n");

    // The cable is pulled: no FIN, no RST, nothing.
    lan.wire(false);
    let cut = Instant::now();
    dev_end
        .write_all(b"written while the wire was out\n")
        .unwrap();
    for side in [&dev, &app] {
        wait_for("the link lost", WAIT, || {
            side.stderr_now()
                .contains("link lost: no message from the peer for")
        });
    }
    let detected = cut.elapsed();
    std::thread::sleep(Duration::from_secs(3).saturating_sub(cut.elapsed()));
    lan.wire(true);
    for side in [&dev, &app] {
        wait_for("the link restored", WAIT, || {
            side.stderr_now().contains("link restored after")
        });
    }
    // What the device said while the wire was out arrives once, after what came before.
    assert_eq!(
        read_lines(&mut prog_end, 1),
        "written while the wire was out\n"
    );
    prog_end.write_all(b"after the cut\n").unwrap();
    assert_eq!(read_lines(&mut dev_end, 1), "after the cut\n");
    dev_end.write_all(b"and on\n").unwrap();
    assert_eq!(read_lines(&mut prog_end, 1), "and on\n");
    let (dev_log, app_log) = (dev.kill(), app.kill());
    // The outage is counted from the last message heard: at least the 3 s the wire was out.
    for log in [&dev_log, &app_log] {
        let ms: f64 = log
            .split("link restored after ")
            .nth(1)
            .and_then(|r| r.split(" ms").next())
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no outage length in:\n{log}"));
        assert!(ms >= 2500.0, "outage of {ms} ms for a 3 s cut:\n{log}");
        assert!(!log.contains("panicked"), "a side panicked:\n{log}");
    }
    println!(
        "detected by both sides {:.0} ms after the cut (keepalive 1500 ms)",
        detected.as_secs_f64() * 1e3
    );
}

/// A lab server and three machines (issue 34, items 1, 2, 5 and 9): `ndd serve` on one
/// namespace runs a driver whose app side takes three device sides at once, each `ndd run`
/// on the other namespace; `ndd status` there lists the three peers; each device side's
/// checked stream arrives whole in its own session.
#[test]
fn a_daemon_on_one_machine_serves_device_sides_from_another() {
    let Some(lan) = Lan::new() else {
        println!("SKIPPED: needs network namespaces (root and `ip`)");
        return;
    };
    let dir = Dir::new("lan-serve");
    let (app_home, devs) = lab_homes(&dir.0, 3);
    let addr = lan.b_addr(7905);
    let count = 3000;
    let driver = |side: &str| {
        format!(
            "driver = \"lab\"\nside = \"{side}\"\n[link]\naddress = \"{addr}\"\nlistener = \"app\"\n\
             peers = 3\n[[stream]]\nname = \"events\"\ndirection = \"device-to-app\"\n\
             source = {{ type = \"synthetic\", size = 64, interval_ms = 2.0, count = {count}, seed = 5 }}\n\
             sink = {{ type = \"check\", seed = 5, size = 64, expect = {count} }}\n"
        )
    };
    let drivers = dir.0.join("drivers");
    std::fs::create_dir_all(&drivers).unwrap();
    std::fs::write(drivers.join("lab.toml"), driver("app")).unwrap();
    let status_dir = dir.0.join("status");
    std::fs::create_dir_all(&status_dir).unwrap();
    let mut serve = Lan::ndd(
        &lan.b,
        &[
            "serve",
            drivers.to_str().unwrap(),
            "--home",
            app_home.to_str().unwrap(),
        ],
    );
    serve
        .env("NDD_LOG", "warn,ndd::session=info,ndd::serve=info")
        .env("NDD_STATUS_DIR", &status_dir);
    let daemon = Side::spawn(serve);
    daemon.wait_says("starting driver lab", &[]);
    let dev_cfg = dir.0.join("lab-device.toml");
    std::fs::write(&dev_cfg, driver("device")).unwrap();
    let sides: Vec<Side> = devs
        .iter()
        .map(|home| {
            Side::spawn(Lan::ndd(
                &lan.a,
                &[
                    "run",
                    dev_cfg.to_str().unwrap(),
                    "--home",
                    home.to_str().unwrap(),
                    "--once",
                ],
            ))
        })
        .collect();
    wait_for("three peers served", WAIT, || {
        daemon.stderr_now().matches("streams agreed").count() >= 3
    });
    // `ndd status` on the server's machine: the daemon's driver and its three peers.
    let status = || {
        let out = Lan::ndd(&lan.b, &["status"])
            .env("NDD_STATUS_DIR", &status_dir)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    wait_for("the three peers in ndd status", WAIT, || {
        let s = status();
        (0..3).all(|i| s.contains(&format!("lab{i}")))
    });
    // Each peer's stream, its rate and latency, in its own rows.
    wait_for("each peer's stream in ndd status", WAIT, || {
        let s = status();
        (0..3).all(|i| {
            s.lines()
                .any(|l| l.contains(&format!("(lab{i})")) && l.contains("events"))
        })
    });
    println!("ndd status:\n{}", status());
    for (i, s) in sides.into_iter().enumerate() {
        let (st, _, err) = s.finish();
        assert!(st.success(), "device {i}: {err}");
    }
    let t0 = std::time::Instant::now();
    while !(0..3).all(|i| {
        daemon
            .stderr_now()
            .contains(&check_ok(&format!("events@lab{i}"), count))
    }) {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "each peer's stream checked; the daemon said:\n{}",
            daemon.stderr_now()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    daemon.terminate();
    let (_, _, err) = daemon.finish();
    assert!(!err.contains("panicked"), "{err}");
}

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
use std::process::{Command, Stdio};
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
    let (port, device, remote) = (
        dir.0.join("port"),
        dir.0.join("device"),
        dir.0.join("ttyREMOTE"),
    );
    let _pair = Killed(
        Command::new("socat")
            .arg(format!("pty,raw,echo=0,link={}", port.display()))
            .arg(format!("pty,raw,echo=0,link={}", device.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("socat"),
    );
    wait_for("the pty pair", WAIT, || port.exists() && device.exists());
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

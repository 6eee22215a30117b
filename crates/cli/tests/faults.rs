//! Fault smoke tests with real processes over loopback: the connection is cut mid-frame
//! through a proxy the test controls, and the app side is killed with SIGKILL and started
//! again, over TCP+TLS and over the sealed UDP link (where the device side is restarted too). (Blackholes, stateful pairs, lossy streams and thousands of other fault schedules
//! run in virtual time: `crates/testkit/tests/session.rs`.) The `check` sink proves that no reliable frame is lost or duplicated; the time
//! to recover is printed (run with `--nocapture` to see it).

mod common;

use common::*;
use std::time::Duration;

const CFG: &str = r#"
driver = "faults"
[link]
ping_interval_ms = 100
keepalive_timeout_ms = 600
max_backoff_ms = 200
[[stream]]
name = "events"
direction = "device-to-app"
source = { type = "synthetic", size = 300, interval_ms = 1.0, count = 3000, seed = 9 }
sink = { type = "check", seed = 9, size = 300, expect = 3000 }
stack = [{ type = "checksum" }, { type = "bundle", count = 3, max_delay_ms = 5 }]
[[stream]]
name = "back"
direction = "app-to-device"
source = { type = "synthetic", size = 40, interval_ms = 2.0, count = 1500, seed = 4 }
sink = { type = "check", seed = 4, size = 40, expect = 1500 }
"#;

#[test]
fn cut_connections_mid_frame_lose_and_duplicate_nothing() {
    let dir = Dir::new("fault-cut");
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let cfg = dir.0.join("c.toml");
    std::fs::write(&cfg, CFG).unwrap();
    let (derr, aerr) = run_with_cuts(&cfg, &dev_home, &app_home, 3, Duration::from_millis(400));
    assert!(aerr.contains("stream \"events\": check: 3000 frames, seq 0..=2999, 0 missing, 0 duplicate, 0 reordered, 0 corrupt: OK"), "{aerr}");
    assert!(derr.contains("stream \"back\": check: 1500 frames, seq 0..=1499, 0 missing, 0 duplicate, 0 reordered, 0 corrupt: OK"), "{derr}");
    assert!(
        recoveries(&derr).len() >= 3,
        "three cuts, three recoveries: {derr}"
    );
}

#[test]
fn a_killed_and_restarted_app_side_gets_everything_the_first_did_not() {
    app_restart("tcp");
}

/// The same over the sealed UDP link: the device notices the silence (keepalive), runs a new
/// key exchange with the new app process and resumes exactly as on TCP (issue 17, D3).
#[test]
fn over_udp_a_killed_and_restarted_app_side_gets_everything_the_first_did_not() {
    app_restart("udp");
}

/// A config whose device side sends `count` synthetic frames (64 B, seed 12, 1 kHz) that the
/// app side appends, length-prefixed, to `out`.
fn write_restart_cfg(cfg: &std::path::Path, transport: &str, out: &std::path::Path, count: u64) {
    std::fs::write(
        cfg,
        format!(
            r#"
driver = "restart"
[link]
transport = "{transport}"
ping_interval_ms = 100
keepalive_timeout_ms = 600
max_backoff_ms = 100
[[stream]]
name = "events"
direction = "device-to-app"
source = {{ type = "synthetic", size = 64, interval_ms = 1.0, count = {count}, seed = 12 }}
sink = {{ type = "file", path = "{}", framing = "length", append = true }}
"#,
            out.display()
        ),
    )
    .unwrap();
}

fn app_restart(transport: &str) {
    let dir = Dir::new(&format!("fault-restart-{transport}"));
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let cfg = dir.0.join("c.toml");
    let out = dir.0.join("received.bin");
    // The app side appends every frame to one file (length-prefixed), across both of its lives.
    write_restart_cfg(&cfg, transport, &out, 2000);
    let (_, _, written1) = run_with_app_restart(
        &cfg,
        &dev_home,
        &app_home,
        || std::fs::metadata(&out).is_ok_and(|m| m.len() > 30_000),
        // What the first app wrote, to the byte: its life ends here.
        || std::fs::metadata(&out).map_or(0, |m| m.len()) as usize,
    );
    // Every frame, in order, none lost: the device keeps what the app's sink had not completed
    // and sends it again to the new app. A frame the first app completed in its last moments
    // (before its DELIVERED went out) may come twice: at least once across a process restart
    // (docs/protocol.md §5a).
    let seqs = synthetic_seqs_in(&out, 12, 2000);
    // Frames are 4 + 64 bytes in the file.
    let last1 = (written1 / 68).checked_sub(1).and_then(|k| seqs.get(k));
    let (expect, dups, lost) = order(seqs.iter().copied());
    assert_eq!(expect, 2000, "the stream went on to its end");
    assert!(
        lost.is_empty(),
        "lost {lost:?} across the restart (the first app wrote up to {last1:?})"
    );
    assert!(
        dups <= 100,
        "{dups} duplicates: more than the unacknowledged window"
    );
    println!(
        "frames: {} delivered, {dups} delivered twice across the restart",
        seqs.len()
    );
}

/// The device side killed (SIGKILL) and started again over the sealed UDP link: the app side
/// notices the silence, takes the new device's key exchange and gets its whole run (issue 17,
/// D3: a device restart used to end a UDP app side).
#[test]
fn over_udp_a_killed_and_restarted_device_side_is_taken_back() {
    let dir = Dir::new("fault-udp-device-restart");
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let cfg = dir.0.join("c.toml");
    let out = dir.0.join("received.bin");
    write_restart_cfg(&cfg, "udp", &out, 1500);
    let addr = free_addr();
    let app = Side::spawn(run_cmd(&cfg, "app", &app_home, &["--listen", &addr]));
    let _ = app.addr();
    let dev1 = Side::spawn(run_cmd(&cfg, "device", &dev_home, &["--connect", &addr]));
    wait_for("frames to flow", Duration::from_secs(30), || {
        std::fs::metadata(&out).is_ok_and(|m| m.len() > 20_000)
    });
    dev1.kill();
    let dev2 = Side::spawn(run_cmd(&cfg, "device", &dev_home, &["--connect", &addr]));
    let (ds, _, derr) = dev2.finish();
    let (as_, _, aerr) = app.finish();
    assert!(ds.success(), "device: {derr}");
    assert!(as_.success(), "app: {aerr}");
    assert!(aerr.contains("the peer restarted"), "{aerr}");
    // What the app wrote: the first device's frames from 0 on, then the second's, all 1500.
    let seqs = synthetic_seqs_in(&out, 12, 1500);
    let second = seqs
        .iter()
        .rposition(|&s| s == 0)
        .expect("the second device's first frame");
    assert!(second > 0, "the first device's frames came first");
    assert_eq!(
        seqs[second..].to_vec(),
        (0..1500).collect::<Vec<u64>>(),
        "the second device's run, whole and in order"
    );
}

/// A UDP relay between device and app that can drop everything the device sends for a
/// while (one-way loss): the sides' keepalives notice, the device runs a new key exchange
/// once datagrams pass again, and every frame arrives (issue 17, D3).
struct UdpRelay {
    addr: String,
    drop_up: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl UdpRelay {
    fn start(upstream: String) -> UdpRelay {
        use std::sync::atomic::Ordering;
        let front = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let back = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        back.connect(&upstream).unwrap();
        let addr = front.local_addr().unwrap().to_string();
        let drop_up = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let client = std::sync::Arc::new(std::sync::Mutex::new(None));
        let (f, b, d, c) = (
            front.try_clone().unwrap(),
            back.try_clone().unwrap(),
            drop_up.clone(),
            client.clone(),
        );
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 70_000];
            while let Ok((n, from)) = f.recv_from(&mut buf) {
                *c.lock().unwrap() = Some(from);
                if !d.load(Ordering::Relaxed) {
                    let _ = b.send(&buf[..n]);
                }
            }
        });
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 70_000];
            loop {
                match back.recv(&mut buf) {
                    Ok(n) => {
                        let to = *client.lock().unwrap();
                        if let Some(to) = to {
                            let _ = front.send_to(&buf[..n], to);
                        }
                    }
                    // The app side restarting its socket: ICMP errors come back here.
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        UdpRelay { addr, drop_up }
    }
}

/// Reliable streams over UDP across 2.5 s of one-way loss: an input-like stream
/// (200 Hz × 64 B) one way, and 1 kHz × 300 B bundled by three the other (the burst resent
/// after the reconnect is about a thousand messages, more than a socket buffer takes at once).
/// Both sides notice, reconnect with a new key exchange and resume, every frame exactly once:
/// the link retransmits what a datagram loss or an overflowing burst cost.
#[test]
fn over_udp_seconds_of_one_way_loss_lead_to_reconnect_and_resume() {
    let dir = Dir::new("fault-udp-oneway");
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let cfg = dir.0.join("c.toml");
    std::fs::write(
        &cfg,
        r#"
driver = "faults"
[link]
transport = "udp"
ping_interval_ms = 100
keepalive_timeout_ms = 600
max_backoff_ms = 200
[[stream]]
name = "events"
direction = "device-to-app"
stack = [{ type = "bundle", count = 3, max_delay_ms = 5 }]
source = { type = "synthetic", size = 300, interval_ms = 1.0, count = 8000, seed = 9 }
sink = { type = "check", seed = 9, size = 300, expect = 8000 }
[[stream]]
name = "back"
direction = "app-to-device"
source = { type = "synthetic", size = 64, interval_ms = 5.0, count = 1600, seed = 4 }
sink = { type = "check", seed = 4, size = 64, expect = 1600 }
"#,
    )
    .unwrap();
    let addr = free_addr();
    let app = Side::spawn(run_cmd(&cfg, "app", &app_home, &["--listen", &addr]));
    let _ = app.addr();
    let relay = UdpRelay::start(addr);
    let dev = Side::spawn(run_cmd(
        &cfg,
        "device",
        &dev_home,
        &["--connect", &relay.addr],
    ));
    wait_for("the session", Duration::from_secs(30), || {
        app.stderr_now().contains("streams agreed")
    });
    std::thread::sleep(Duration::from_millis(1500));
    relay
        .drop_up
        .store(true, std::sync::atomic::Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(2500));
    relay
        .drop_up
        .store(false, std::sync::atomic::Ordering::Relaxed);
    let (ds, _, derr) = dev.finish();
    let (as_, _, aerr) = app.finish();
    assert!(ds.success(), "device: {derr}");
    assert!(as_.success(), "app: {aerr}");
    assert!(aerr.contains("link lost"), "the app side noticed: {aerr}");
    assert!(
        derr.contains("link lost"),
        "the device side noticed: {derr}"
    );
    assert!(aerr.contains(&check_ok("events", 8000)), "{aerr}");
    assert!(derr.contains(&check_ok("back", 1600)), "{derr}");
    println!(
        "recoveries: app {:?}, device {:?}",
        recoveries(&aerr),
        recoveries(&derr)
    );
}

/// With the link's default settings (no `[link]` section): a path that goes silent (a
/// blackhole: nothing closed, nothing delivered) is declared dead by both sides after the
/// default 1.5 s without a message, they reconnect once it carries again, and nothing is lost
/// (issue 34 item 7: the defaults were 5 s, and up to 5 s of backoff).
#[test]
fn with_default_settings_a_silent_path_is_noticed_after_1_5_s_and_nothing_is_lost() {
    let dir = Dir::new("fault-defaults");
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let cfg = dir.0.join("c.toml");
    let text = CFG.replace(
        "[link]\nping_interval_ms = 100\nkeepalive_timeout_ms = 600\nmax_backoff_ms = 200\n",
        "",
    );
    assert!(!text.contains("[link]"));
    std::fs::write(&cfg, text).unwrap();
    let app = Side::spawn(run_cmd(
        &cfg,
        "app",
        &app_home,
        &["--listen", "127.0.0.1:0"],
    ));
    let proxy = Proxy::start(app.addr());
    let dev = Side::spawn(run_cmd(
        &cfg,
        "device",
        &dev_home,
        &["--connect", &proxy.addr],
    ));
    wait_for("a connection", WAIT, || proxy.accepted() >= 1);
    std::thread::sleep(Duration::from_millis(500));
    proxy.set(BLOCK);
    wait_for("the loss on both sides", WAIT, || {
        let said = |e: String| e.contains("no message from the peer for 1500 ms");
        said(dev.stderr_now()) && said(app.stderr_now())
    });
    proxy.set(PASS);
    let (ds, _, derr) = dev.finish();
    let (as_, _, aerr) = app.finish();
    assert!(ds.success(), "device: {derr}");
    assert!(as_.success(), "app: {aerr}");
    assert!(aerr.contains(&check_ok("events", 3000)), "{aerr}");
    assert!(derr.contains(&check_ok("back", 1500)), "{derr}");
    assert!(!recoveries(&derr).is_empty(), "{derr}");
    println!("recoveries (device side): {:?}", recoveries(&derr));
}

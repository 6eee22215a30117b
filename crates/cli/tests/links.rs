//! The same driver over every link: TCP+TLS, QUIC and UDP, both directions at once, with
//! `check` sinks proving every frame arrived intact and in order.

mod common;

use common::*;

const CFG: &str = r#"
driver = "links"
[link]
transport = "TRANSPORT"
[[stream]]
name = "events"
direction = "device-to-app"
source = { type = "synthetic", size = 3000, interval_ms = 1.0, count = 400, seed = 3 }
sink = { type = "check", seed = 3, size = 3000, expect = 400 }
stack = [{ type = "checksum" }]
[[stream]]
name = "back"
direction = "app-to-device"
source = { type = "synthetic", size = 20, interval_ms = 2.0, count = 150, seed = 4 }
sink = { type = "check", seed = 4, size = 20, expect = 150 }
"#;

fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn run(transport: &str) {
    let dir = Dir::new(&format!("link-{transport}"));
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let cfg = dir.0.join("c.toml");
    std::fs::write(&cfg, CFG.replace("TRANSPORT", transport)).unwrap();
    let addr = format!("127.0.0.1:{}", free_udp_port());
    let app = Side::spawn(run_cmd(&cfg, "app", &app_home, &["--listen", &addr]));
    let _ = app.addr(); // wait until it listens
    let dev = Side::spawn(run_cmd(&cfg, "device", &dev_home, &["--connect", &addr]));
    let (ds, _, derr) = dev.finish();
    let (as_, _, aerr) = app.finish();
    assert!(ds.success(), "{transport} device: {derr}");
    assert!(as_.success(), "{transport} app: {aerr}");
    assert!(aerr.contains("stream \"events\": check: 400 frames, seq 0..=399, 0 missing, 0 duplicate, 0 reordered, 0 corrupt: OK"), "{aerr}");
    assert!(derr.contains("stream \"back\": check: 150 frames, seq 0..=149, 0 missing, 0 duplicate, 0 reordered, 0 corrupt: OK"), "{derr}");
    if transport == "udp" {
        assert!(
            derr.contains("WARNING: the UDP link neither encrypts nor authenticates"),
            "{derr}"
        );
        // The listener names its peer, not its own address.
        assert!(aerr.contains("connected to 127.0.0.1:"), "{aerr}");
        assert!(!aerr.contains(&format!("connected to {addr}")), "{aerr}");
    }
}

#[test]
fn quic_carries_both_directions() {
    run("quic");
}

#[test]
fn udp_carries_both_directions_and_warns_without_encrypt() {
    run("udp");
}

#[test]
fn quic_refuses_insecure() {
    let dir = Dir::new("link-quic-insecure");
    let cfg = dir.0.join("c.toml");
    std::fs::write(&cfg, CFG.replace("TRANSPORT", "quic")).unwrap();
    let out = run_cmd(
        &cfg,
        "app",
        &dir.0,
        &["--listen", "127.0.0.1:0", "--insecure"],
    )
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("QUIC always encrypts and authenticates"),
        "{err}"
    );
}

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

fn run(transport: &str) {
    run_with(transport, &[]);
}

fn run_with(transport: &str, extra: &[&str]) {
    let insecure = extra.contains(&"--insecure");
    let dir = Dir::new(&format!(
        "link-{transport}{}",
        if insecure { "-insecure" } else { "" }
    ));
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let cfg = dir.0.join("c.toml");
    std::fs::write(&cfg, CFG.replace("TRANSPORT", transport)).unwrap();
    let addr = free_addr();
    let app = Side::spawn(run_cmd(
        &cfg,
        "app",
        &app_home,
        &[&["--listen", &addr][..], extra].concat(),
    ));
    let _ = app.addr(); // wait until it listens
    let dev = Side::spawn(run_cmd(
        &cfg,
        "device",
        &dev_home,
        &[&["--connect", &addr][..], extra].concat(),
    ));
    let (ds, _, derr) = dev.finish();
    let (as_, _, aerr) = app.finish();
    assert!(ds.success(), "{transport} device: {derr}");
    assert!(as_.success(), "{transport} app: {aerr}");
    assert!(aerr.contains("stream \"events\": check: 400 frames, seq 0..=399, 0 missing, 0 duplicate, 0 reordered, 0 corrupt: OK"), "{aerr}");
    assert!(derr.contains("stream \"back\": check: 150 frames, seq 0..=149, 0 missing, 0 duplicate, 0 reordered, 0 corrupt: OK"), "{derr}");
    if transport == "udp" {
        // Sealed unless --insecure: only then the warning about streams without `encrypt`.
        assert_eq!(
            derr.contains("WARNING: --insecure: the UDP link neither encrypts nor authenticates"),
            insecure,
            "{derr}"
        );
        // The listener names its peer (by its trusted name when sealed), not its own address.
        if insecure {
            assert!(aerr.contains("connected to 127.0.0.1:"), "{aerr}");
        } else {
            assert!(aerr.contains("connected to device"), "{aerr}");
            assert!(derr.contains("connected to app"), "{derr}");
        }
        assert!(!aerr.contains(&format!("connected to {addr}")), "{aerr}");
    }
}

#[test]
fn quic_carries_both_directions() {
    run("quic");
}

#[test]
fn udp_carries_both_directions_sealed() {
    run("udp");
}

#[test]
fn insecure_udp_carries_both_directions_and_warns_without_encrypt() {
    run_with("udp", &["--insecure"]);
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

/// One side with --insecure, the other sealed: neither hangs silently; each says what is
/// wrong (the sealed side names the mismatch, the plain device times out).
#[test]
fn udp_with_insecure_on_one_side_only_says_so() {
    let dir = Dir::new("link-udp-mismatch");
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let cfg = dir.0.join("c.toml");
    std::fs::write(
        &cfg,
        CFG.replace("TRANSPORT", "udp").replace(
            "[link]",
            "[link]\nconnect_timeout_ms = 1500\nhandshake_timeout_ms = 500",
        ),
    )
    .unwrap();
    let addr = free_addr();
    let app = Side::spawn(run_cmd(
        &cfg,
        "app",
        &app_home,
        &["--listen", &addr, "--duration", "3"],
    ));
    let _ = app.addr();
    let dev = run_cmd(
        &cfg,
        "device",
        &dev_home,
        &["--connect", &addr, "--insecure", "--once"],
    )
    .output()
    .unwrap();
    let derr = String::from_utf8_lossy(&dev.stderr);
    assert!(!dev.status.success());
    assert!(derr.contains("no HELLO within 500 ms"), "{derr}");
    let (as_, _, aerr) = app.finish();
    assert!(!as_.success());
    assert!(
        aerr.contains("the peer runs with --insecure and this side does not"),
        "{aerr}"
    );
}

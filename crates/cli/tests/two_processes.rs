//! Two real `ndd` processes over 127.0.0.1 (the app side listens on port 0 and says where),
//! TLS on unless a test is about `--insecure`.

mod common;

use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;

const STDIO: &str = r#"
driver = "stdio"
[[stream]]
name = "up"
direction = "device-to-app"
source = { type = "stdin" }
sink = { type = "stdout" }
stack = [{ type = "checksum" }, { type = "bundle", count = 8, max_delay_ms = 5 }]
[[stream]]
name = "down"
direction = "app-to-device"
source = { type = "stdin" }
sink = { type = "stdout" }
stack = [{ type = "checksum" }]
"#;

#[test]
fn one_megabyte_each_way_arrives_byte_identical_over_tls() {
    let dir = Dir::new("stdio");
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let cfg = dir.0.join("stdio.toml");
    std::fs::write(&cfg, STDIO).unwrap();
    let up = random(1 << 20, 1);
    let down = random(300_000, 2);

    let (mut app, mut dev) = start_pair(&cfg, &cfg, &app_home, &dev_home);
    // Both directions at the same time.
    let f1 = dev.feed(up.clone());
    let f2 = app.feed(down.clone());
    f1.join().unwrap();
    f2.join().unwrap();
    let (ds, dout, derr) = dev.finish();
    let (as_, aout, aerr) = app.finish();
    assert!(ds.success(), "device side failed: {derr}");
    assert!(as_.success(), "app side failed: {aerr}");
    assert!(
        aout == up,
        "app stdout differs from device stdin ({} vs {} bytes)",
        aout.len(),
        up.len()
    );
    assert!(
        dout == down,
        "device stdout differs from app stdin ({} vs {} bytes)",
        dout.len(),
        down.len()
    );
}

const SYNTH: &str = r#"
driver = "synth"
[[stream]]
name = "events"
direction = "device-to-app"
source = { type = "synthetic", size = 64, interval_ms = 1.0, count = 200, seed = 5 }
sink = { type = "check", seed = 5, size = 64, expect = 200 }
stack = [{ type = "checksum" }, { type = "bundle", count = COUNT }]
"#;

#[test]
fn stack_mismatch_is_reported_on_both_sides_naming_stream_and_layer() {
    let dir = Dir::new("mismatch");
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let (dcfg, acfg) = (dir.0.join("d.toml"), dir.0.join("a.toml"));
    std::fs::write(&dcfg, SYNTH.replace("COUNT", "4")).unwrap();
    std::fs::write(&acfg, SYNTH.replace("COUNT", "5")).unwrap();
    let mut app = Side::spawn(run_cmd(
        &acfg,
        "app",
        &app_home,
        &["--listen", "127.0.0.1:0"],
    ));
    let addr = app.addr();
    // With --once a refusal ends the connecting side with the error (what a script wants);
    // without, it waits for the peer as the listener does (the trust test below).
    let dev = Side::spawn(run_cmd(
        &dcfg,
        "device",
        &dev_home,
        &["--connect", &addr, "--once"],
    ));
    let (ds, _, derr) = dev.finish();
    assert!(!ds.success());
    let b = |n| format!("bundle(count={n}, max_delay_ms=100, max_bytes=1048576, playout_ms=0)");
    let want_dev = format!(
        "stream \"events\" layer 1: this side has {}, peer has {}",
        b(4),
        b(5)
    );
    let want_app = format!(
        "stream \"events\" layer 1: this side has {}, peer has {}",
        b(5),
        b(4)
    );
    assert!(derr.contains(&want_dev), "device stderr: {derr}");
    // The listener names the mismatch too, and waits on for a peer it can work with.
    wait_for("the app side's refusal", WAIT, || {
        app.stderr_now().contains(&want_app)
    });
    assert!(
        app.running(),
        "a disagreeing peer must not stop the listener"
    );
    app.kill();
    assert_eq!(
        derr.lines()
            .filter(|l| l.starts_with("ndd: error:"))
            .count(),
        1,
        "one error line: {derr}"
    );
}

#[test]
fn an_untrusted_connecting_side_waits_with_the_trust_command_and_connects_once_trusted() {
    let dir = Dir::new("untrusted");
    // The device trusts the app, the app does not know the device.
    let (dev_home, app_home, dfp, _) = homes(&dir.0, true, false);
    let cfg = dir.0.join("c.toml");
    std::fs::write(
        &cfg,
        SYNTH.replace("COUNT", "4") + "[link]\nmax_backoff_ms = 300\n",
    )
    .unwrap();
    let (mut app, mut dev) = start_pair(&cfg, &cfg, &app_home, &dev_home);
    // Both sides refuse, say what to run on the other machine, and wait on (the connecting
    // side exited before 2026-11-29; issue 34 item 7).
    wait_for("both sides' refusal lines", WAIT, || {
        let (aerr, derr) = (app.stderr_now(), dev.stderr_now());
        aerr.contains("refused untrusted peer")
            && aerr.contains(&format!("run: ndd trust {dfp} --home"))
            && derr.contains(&format!("on the peer's machine run: ndd trust {dfp}"))
            && derr
                .contains("waiting for the peer to accept this side, retrying every 0.3 s at most")
    });
    assert!(
        app.running(),
        "an untrusted peer must not stop the listener"
    );
    assert!(dev.running(), "a refused connecting side waits");
    // Trusted on the app side's machine: the next attempt connects, neither side restarted.
    let out = ndd()
        .args(["trust", &dfp, "--name", "device", "--home"])
        .arg(&app_home)
        .output()
        .unwrap();
    assert!(out.status.success());
    wait_for("the session on both sides", WAIT, || {
        app.stderr_now().contains("streams agreed") && dev.stderr_now().contains("streams agreed")
    });
    dev.terminate();
    let (ds, _, derr) = dev.finish();
    assert!(ds.success(), "{derr}");
    app.kill();
    // Said once while it waited, not at every attempt.
    assert_eq!(
        derr.matches("waiting for the peer to accept").count(),
        1,
        "{derr}"
    );
}

#[test]
fn garbage_to_the_listener_is_rejected_and_the_next_peer_is_served() {
    for insecure in [false, true] {
        let dir = Dir::new(if insecure {
            "garbage-plain"
        } else {
            "garbage-tls"
        });
        let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
        let cfg = dir.0.join("c.toml");
        std::fs::write(&cfg, SYNTH.replace("COUNT", "4")).unwrap();
        let mut extra = vec!["--listen", "127.0.0.1:0"];
        if insecure {
            extra.push("--insecure");
        }
        let app = Side::spawn(run_cmd(&cfg, "app", &app_home, &extra));
        let addr = app.addr();
        // Garbage: random bytes, then an HTTP request.
        for junk in [
            random(4096, 9),
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        ] {
            let mut s = TcpStream::connect(&addr).unwrap();
            let _ = s.write_all(&junk);
            let _ = s.shutdown(std::net::Shutdown::Write);
            let mut sink = Vec::new();
            let _ = s.read_to_end(&mut sink);
        }
        let mut dextra = vec!["--connect", addr.as_str()];
        if insecure {
            dextra.push("--insecure");
        }
        let dev = Side::spawn(run_cmd(&cfg, "device", &dev_home, &dextra));
        let (ds, _, derr) = dev.finish();
        let (as_, _, aerr) = app.finish();
        assert!(ds.success(), "device (insecure={insecure}): {derr}");
        assert!(as_.success(), "app (insecure={insecure}): {aerr}");
        assert!(
            aerr.matches("rejected a connection").count() >= 2,
            "app stderr: {aerr}"
        );
        assert!(
            aerr.contains("check: 200 frames") && aerr.contains("OK"),
            "app stderr: {aerr}"
        );
        if insecure {
            assert!(aerr.contains("WARNING: --insecure"), "{aerr}");
        }
    }
}

/// Connects to an insecure app side and completes the handshake by hand, echoing its own
/// HELLO back with the side flipped to `device`.
fn fake_device(addr: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    let mut buf = vec![0u8; 4096];
    let mut got = Vec::new();
    let hello_len = loop {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "app closed before its HELLO");
        got.extend_from_slice(&buf[..n]);
        if got.len() >= 10 {
            let len = 10 + u32::from_be_bytes(got[6..10].try_into().unwrap()) as usize;
            if got.len() >= len {
                break len;
            }
        }
    };
    let mut hello = got[..hello_len].to_vec();
    hello[10] = 0; // side: device
    s.write_all(&hello).unwrap();
    s.write_all(&[1, 4, 0, 0, 0, 0, 0, 0, 0, 0]).unwrap(); // READY
    s
}

/// Half-closes (FIN, not RST: unread bytes on a dropped socket would turn it into a reset)
/// and reads until the other side hangs up.
fn hang_up(mut s: TcpStream) -> Vec<u8> {
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    rest
}

#[test]
fn an_oversized_frame_is_refused_naming_its_size_and_the_limit_and_the_listener_waits_on() {
    let dir = Dir::new("oversize");
    let (_, app_home, _, _) = homes(&dir.0, true, true);
    let cfg = dir.0.join("c.toml");
    std::fs::write(&cfg, SYNTH.replace("COUNT", "4")).unwrap();
    let app = Side::spawn(run_cmd(
        &cfg,
        "app",
        &app_home,
        &["--listen", "127.0.0.1:0", "--insecure", "--duration", "3"],
    ));
    let mut s = fake_device(&app.addr());
    let mut data = vec![1, 1, 0, 0, 0, 1];
    data.extend_from_slice(&(100_000_000u32).to_be_bytes());
    s.write_all(&data).unwrap();
    hang_up(s);
    let (st, _, err) = app.finish();
    // The listener reports the broken link, keeps waiting for the peer to come back, and
    // stops cleanly at --duration, its check sink reporting that nothing arrived (exit 3).
    assert_eq!(st.code(), Some(3), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        err.contains("link lost: ") && err.contains("reconnecting"),
        "{err}"
    );
    assert!(
        err.contains("100000000") && err.contains("16777216"),
        "app stderr: {err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn a_peer_speaking_another_version_is_named_with_both_versions() {
    let dir = Dir::new("version");
    let (_, app_home, _, _) = homes(&dir.0, true, true);
    let cfg = dir.0.join("c.toml");
    std::fs::write(&cfg, SYNTH.replace("COUNT", "4")).unwrap();
    let mut app = Side::spawn(run_cmd(
        &cfg,
        "app",
        &app_home,
        &["--listen", "127.0.0.1:0", "--insecure"],
    ));
    let mut s = TcpStream::connect(app.addr()).unwrap();
    s.write_all(&[2, 3, 0, 0, 0, 0, 0, 0, 0, 0]).unwrap(); // a version-2 HELLO prefix
    let back = hang_up(s);
    let want = "peer speaks protocol version 2, this side speaks version 1";
    wait_for("the app side's refusal", WAIT, || {
        app.stderr_now().contains(want)
    });
    assert!(
        app.running(),
        "a peer of another version must not stop the listener"
    );
    app.kill();
    // The peer is told too, in a CLOSE (code 3) after the app's HELLO.
    let text = String::from_utf8_lossy(&back);
    assert!(text.contains(want), "sent back: {text:?}");
}

#[test]
fn the_device_side_may_listen_and_the_app_side_connect() {
    let dir = Dir::new("devlisten");
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let cfg = dir.0.join("c.toml");
    std::fs::write(
        &cfg,
        SYNTH.replace("COUNT", "4").replace(
            "driver = \"synth\"",
            "driver = \"synth\"\n[link]\nlistener = \"device\"\naddress = \"127.0.0.1:0\"",
        ),
    )
    .unwrap();
    let dev = Side::spawn(run_cmd(&cfg, "device", &dev_home, &[]));
    let addr = dev.addr();
    let app = Side::spawn(run_cmd(
        &cfg,
        "app",
        &app_home,
        &[
            "--connect",
            &addr,
            "--stats-json",
            dir.0.join("app.json").to_str().unwrap(),
        ],
    ));
    let (as_, _, aerr) = app.finish();
    let (ds, _, derr) = dev.finish();
    assert!(ds.success(), "{derr}");
    assert!(as_.success(), "{aerr}");
    assert!(
        aerr.contains("check: 200 frames") && aerr.contains(": OK"),
        "{aerr}"
    );
    let json = std::fs::read_to_string(dir.0.join("app.json")).unwrap();
    assert!(
        json.contains("\"frames\": 200") && json.contains("latency_p99_ms"),
        "{json}"
    );
}

#[test]
fn a_peer_that_disconnects_mid_frame_is_a_clear_error_and_the_listener_waits_on() {
    let dir = Dir::new("midframe");
    let (_, app_home, _, _) = homes(&dir.0, true, true);
    let cfg = dir.0.join("c.toml");
    std::fs::write(&cfg, SYNTH.replace("COUNT", "4")).unwrap();
    let app = Side::spawn(run_cmd(
        &cfg,
        "app",
        &app_home,
        &["--listen", "127.0.0.1:0", "--insecure", "--duration", "3"],
    ));
    let addr = app.addr();
    let mut s = fake_device(&addr);
    // A DATA header announcing 1000 bytes of payload, then only 10 of them.
    let mut data = vec![1, 1, 0, 0, 0, 1];
    data.extend_from_slice(&(16u32 + 1000).to_be_bytes());
    data.extend_from_slice(&[0; 16]);
    data.extend_from_slice(&[7; 10]);
    s.write_all(&data).unwrap();
    hang_up(s);
    let (st, _, err) = app.finish();
    // The listener reports the broken link, keeps waiting for the peer to come back, and
    // stops cleanly at --duration, its check sink reporting that nothing arrived (exit 3).
    assert_eq!(st.code(), Some(3), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        err.contains("link lost: ") && err.contains("reconnecting"),
        "{err}"
    );
    assert!(err.contains("middle of a message"), "app stderr: {err}");
}

#[test]
fn bad_config_and_missing_endpoint_file_give_one_clear_line() {
    let dir = Dir::new("badcfg");
    let cfg = dir.0.join("bad.toml");
    std::fs::write(
        &cfg,
        "driver = \"x\"\n[[stream]]\nname = \"s\"\ndirection = \"sideways\"\n",
    )
    .unwrap();
    let out = ndd()
        .arg("run")
        .arg(&cfg)
        .args(["--side", "app", "--home"])
        .arg(&dir.0)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        err.starts_with(&format!(
            "ndd: error: {}:4: unknown variant `sideways`",
            cfg.display()
        )),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");

    let missing = dir.0.join("missing.toml");
    let out = ndd()
        .arg("run")
        .arg(&missing)
        .args(["--side", "app"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot read config file") && err.contains("No such file"),
        "{err}"
    );

    // An endpoint file that does not exist: the device side fails before it connects.
    let cfg = dir.0.join("file.toml");
    std::fs::write(
        &cfg,
        "driver = \"f\"\n[[stream]]\nname = \"s\"\ndirection = \"device-to-app\"\n\
         source = { type = \"file\", path = \"/nonexistent/input\" }\nsink = { type = \"null\" }\n",
    )
    .unwrap();
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let app = Side::spawn(run_cmd(
        &cfg,
        "app",
        &app_home,
        &["--listen", "127.0.0.1:0", "--duration", "20"],
    ));
    let addr = app.addr();
    let out = run_cmd(&cfg, "device", &dev_home, &["--connect", &addr])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("/nonexistent/input") && err.contains("No such file"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    let (_, _, aerr) = app.finish();
    assert!(!aerr.contains("panicked"), "{aerr}");
}

/// `ndd demo`: the live lines and notes on stderr, the summary (every stream, every layer,
/// the checks) on stdout, so `ndd demo > result.txt` keeps the result.
#[test]
fn the_demo_prints_its_summary_on_stdout() {
    let out = ndd()
        .args(["demo", "--duration", "2"])
        .output()
        .expect("ndd demo runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.starts_with("summary\n"), "{stdout}");
    assert!(stdout.contains("[app] motion"), "{stdout}");
    assert!(stdout.contains("layer 0"), "{stdout}");
    assert!(!stderr.contains("\nsummary\n"), "{stderr}");
    assert!(
        stderr.contains("ndd demo: a simulated 3D mouse"),
        "{stderr}"
    );
    // stderr is a pipe here: plain aligned lines, no escape codes, no table.
    assert!(!stderr.contains('\x1b'), "{stderr}");
    assert!(
        stderr.contains("[device] motion     source device→app"),
        "{stderr}"
    );
}

/// On a terminal the live stats are a table redrawn in place: a heading per side with the
/// link's state and a row per stream, erased and drawn again every second.
#[test]
fn on_a_terminal_the_live_stats_are_a_table_redrawn_in_place() {
    if !std::path::Path::new("/usr/bin/script").exists() {
        println!("SKIPPED: needs script(1) for a pty (apt-get install bsdutils)");
        return;
    }
    let cmd = format!("{} demo --duration 3.5", env!("CARGO_BIN_EXE_ndd"));
    let out = std::process::Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .output()
        .expect("script runs");
    let tty = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{tty}");
    for want in [
        "[app] link up · peer demo-device · rtt ",
        "[device] link up · peer demo-app · rtt ",
        "  motion     sink   device→app ",
        "  leds       source app→device ",
        // Six lines (two headings, two rows each) erased before each redraw.
        "\x1b[6A\x1b[J",
    ] {
        assert!(tty.contains(want), "{want:?} missing from {tty:?}");
    }
    // The table is drawn some three times, not a line per stream per second scrolling.
    assert!(!tty.contains("[app] motion     sink"), "{tty:?}");
}

/// `--metrics ADDR`: the counters in Prometheus' text format, from before the peer comes
/// (link down) to frames moving.
#[test]
fn metrics_are_served_in_prometheus_text_format() {
    let dir = Dir::new("metrics");
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let cfg = dir.0.join("c.toml");
    // Three seconds of frames: the snapshot is refreshed every second.
    let text = SYNTH
        .replace("COUNT", "4")
        .replace("count = 200", "count = 3000")
        .replace("expect = 200", "expect = 3000");
    std::fs::write(&cfg, text).unwrap();
    let metrics = free_addr();
    let app = Side::spawn(run_cmd(
        &cfg,
        "app",
        &app_home,
        &["--listen", "127.0.0.1:0", "--metrics", &metrics],
    ));
    let addr = app.addr();
    let before = http_get(&metrics, "/metrics");
    assert!(before.starts_with("HTTP/1.1 200 OK"), "{before}");
    assert!(
        before
            .to_ascii_lowercase()
            .contains("content-type: application/openmetrics-text; version=1.0.0"),
        "{before}"
    );
    assert!(before.contains("ndd_link_up{side=\"app\"} 0"), "{before}");
    assert!(before.trim_end().ends_with("# EOF"), "{before}");
    assert!(http_get(&metrics, "/").starts_with("HTTP/1.1 404"));
    // Not HTTP at all, then a request that never ends its head: both let go, and the
    // counters are still served.
    for junk in [
        "\u{1b}[2J garbage\r\n\r\n",
        "GET /metrics HTTP/1.1\r\nHost: x\r\n",
    ] {
        let mut c = std::net::TcpStream::connect(&metrics).unwrap();
        std::io::Write::write_all(&mut c, junk.as_bytes()).unwrap();
    }
    assert!(http_get(&metrics, "/metrics").starts_with("HTTP/1.1 200 OK"));
    let dev = Side::spawn(run_cmd(&cfg, "device", &dev_home, &["--connect", &addr]));
    wait_for("frames in the metrics", WAIT, || {
        let m = http_get(&metrics, "/metrics");
        m.contains("ndd_link_up{side=\"app\"} 1")
            && m.lines().any(|l| {
                l.starts_with(
                    "ndd_stream_frames_total{side=\"app\",stream=\"events\",role=\"sink\"} ",
                ) && !l.ends_with(" 0")
            })
    });
    let m = http_get(&metrics, "/metrics");
    assert!(
        m.contains("# TYPE ndd_stream_latency_p99_seconds gauge"),
        "{m}"
    );
    let (ds, _, derr) = dev.finish();
    assert!(ds.success(), "{derr}");
    let (st, _, err) = app.finish();
    assert!(st.success(), "{err}");
}

/// `ndd check --home DIR` says whom the home trusts, and that trusting nobody is an error
/// (the peer would be refused) with what to run (issue 34 item 7).
#[test]
fn check_with_a_home_names_its_peers_and_refuses_one_that_trusts_nobody() {
    let dir = Dir::new("check-home");
    let (dev_home, app_home, dfp, afp) = homes(&dir.0, true, false);
    let cfg = dir.0.join("c.toml");
    std::fs::write(&cfg, SYNTH.replace("COUNT", "4")).unwrap();
    let out = ndd()
        .arg("check")
        .arg(&cfg)
        .arg("--home")
        .arg(&dev_home)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains(&format!("this install {dfp}")), "{text}");
    assert!(
        text.contains(&format!("trusts 1 peer(s): app ({afp})")),
        "{text}"
    );
    let out = ndd()
        .arg("check")
        .arg(&cfg)
        .arg("--home")
        .arg(&app_home)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("known_peers trusts nobody, so the peer would be refused: run `ndd id` on the other machine, then here `ndd trust FINGERPRINT"),
        "{err}"
    );
}

/// A listener whose accept queue is full: the kernel drops further connection attempts, so a
/// connect hangs as it does to a machine that is off (Python holds it for `secs`).
fn unanswering_listener(secs: u32) -> (std::process::Child, String) {
    let script = "import socket, time, sys\n\
        s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(0)\n\
        port = s.getsockname()[1]\n\
        held = []\n\
        for _ in range(3):\n    c = socket.socket(); c.setblocking(False)\n    try:\n        c.connect(('127.0.0.1', port))\n    except BlockingIOError:\n        pass\n    held.append(c)\n\
        time.sleep(0.2)\n\
        print(port, flush=True)\n\
        time.sleep(float(sys.argv[1]))\n";
    let mut child = std::process::Command::new("python3")
        .args(["-c", script, &secs.to_string()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    (child, format!("127.0.0.1:{}", line.trim()))
}

#[test]
fn a_peer_that_does_not_answer_is_said_within_seconds_not_after_the_connect_timeout() {
    let dir = Dir::new("unanswered");
    let (dev_home, _, _, _) = homes(&dir.0, false, false);
    let cfg = dir.0.join("stdio.toml");
    std::fs::write(&cfg, STDIO).unwrap();
    let (mut holder, addr) = unanswering_listener(60);
    let dev = Side::spawn(run_cmd(&cfg, "device", &dev_home, &["--connect", &addr]));
    dev.wait_says("no answer after 3 s", &[]);
    // Said while the first attempt still waits (it fails only at the 10 s connect timeout).
    let early = dev.stderr_now();
    let err = dev.kill();
    let _ = holder.kill();
    let _ = holder.wait();
    assert!(
        !early.contains("timed out") && !early.contains("cannot connect"),
        "said only after the attempt failed: {early}"
    );
    assert!(
        err.contains(&format!("connecting to {addr}: no answer after 3 s")),
        "{err}"
    );
}

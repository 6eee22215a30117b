//! Nothing one peer does stops a listener (issue 17, D1 to D3), with real `ndd` processes:
//! a stranger with its own (untrusted) identity connects first, over TLS, QUIC and UDP; 200
//! idle TCP connections and a few that drip one byte at a time, or 150 half-open and 50
//! silent QUIC connections, sit on the listener; a stranger's datagrams hit a live UDP
//! session. The listener refuses the stranger, keeps serving, and the trusted device connects
//! and delivers every frame. How long the trusted connect took is printed (`--nocapture`), not
//! asserted.

mod common;

use common::*;
use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

const CFG: &str = r#"
driver = "hardening"
[link]
transport = "TRANSPORT"
[[stream]]
name = "events"
direction = "device-to-app"
source = { type = "synthetic", size = 100, interval_ms = 1.0, count = 200, seed = 3 }
sink = { type = "check", seed = 3, size = 100, expect = 200 }
"#;

/// A stranger (an install nobody trusts) connects first; the listener must refuse it and go
/// on to serve the trusted device.
fn stranger_first(transport: &str) {
    let dir = Dir::new(&format!("stranger-{transport}"));
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let stranger_home = dir.0.join("stranger");
    let sfp = ok(ndd().args(["id", "--home"]).arg(&stranger_home))
        .trim()
        .to_string();
    // The stranger trusts the app (it has learnt its fingerprint); the app does not trust it.
    let afp = ok(ndd().args(["id", "--home"]).arg(&app_home))
        .trim()
        .to_string();
    ok(ndd().args(["trust", &afp, "--home"]).arg(&stranger_home));
    let cfg = dir.0.join("c.toml");
    std::fs::write(&cfg, CFG.replace("TRANSPORT", transport)).unwrap();
    let addr = free_addr();
    let mut app = Side::spawn(run_cmd(&cfg, "app", &app_home, &["--listen", &addr]));
    let _ = app.addr();
    // A one-off (`--once`): refused, it ends (without, it would wait to be trusted).
    let stranger = Side::spawn(run_cmd(
        &cfg,
        "device",
        &stranger_home,
        &["--connect", &addr, "--once"],
    ));
    let (ss, _, serr) = stranger.finish();
    assert!(!ss.success(), "the stranger is refused: {serr}");
    wait_for("the refusal on the app side", WAIT, || {
        app.stderr_now()
            .contains(&format!("with fingerprint {sfp}"))
    });
    assert!(
        app.running(),
        "{transport}: a stranger stopped the listener"
    );
    let dev = Side::spawn(run_cmd(&cfg, "device", &dev_home, &["--connect", &addr]));
    let (ds, _, derr) = dev.finish();
    let (as_, _, aerr) = app.finish();
    assert!(ds.success(), "{transport} device: {derr}");
    assert!(as_.success(), "{transport} app: {aerr}");
    assert!(aerr.contains(&check_ok("events", 200)), "{aerr}");
}

#[test]
fn a_stranger_connecting_first_over_tls_does_not_stop_the_listener() {
    stranger_first("tcp");
}

#[test]
fn a_stranger_connecting_first_over_quic_does_not_stop_the_listener() {
    stranger_first("quic");
}

#[test]
fn a_stranger_connecting_first_over_udp_does_not_stop_the_listener() {
    stranger_first("udp");
}

/// A listener for a flood test: (dir, device home, config, address, app side).
fn flood_listener(
    name: &str,
    transport: &str,
) -> (Dir, std::path::PathBuf, std::path::PathBuf, String, Side) {
    let dir = Dir::new(name);
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let cfg = dir.0.join("c.toml");
    std::fs::write(
        &cfg,
        CFG.replace("TRANSPORT", transport)
            .replace("[link]", "[link]\nhandshake_timeout_ms = 3000"),
    )
    .unwrap();
    let addr = free_addr();
    let app = Side::spawn(run_cmd(&cfg, "app", &app_home, &["--listen", &addr]));
    let _ = app.addr();
    (dir, dev_home, cfg, addr, app)
}

/// The trusted device connects through the flood (the time it took is printed) and delivers
/// everything.
fn trusted_device_gets_through(
    cfg: &std::path::Path,
    dev_home: &std::path::Path,
    addr: &str,
    flood: &str,
) {
    let t0 = Instant::now();
    let dev = Side::spawn(run_cmd(cfg, "device", dev_home, &["--connect", addr]));
    wait_for("the trusted device to connect", WAIT, || {
        dev.stderr_now().contains("streams agreed")
    });
    println!(
        "trusted connect with {flood}: {:.0} ms",
        t0.elapsed().as_secs_f64() * 1e3
    );
    let (ds, _, derr) = dev.finish();
    assert!(ds.success(), "device: {derr}");
}

/// Once the flood is gone the app side ends well, with everything, having evicted some.
fn flood_listener_ends_well(mut app: Side) {
    wait_for("the app side to finish", WAIT, || !app.running());
    let (as_, _, aerr) = app.finish();
    assert!(as_.success(), "app: {aerr}");
    assert!(aerr.contains(&check_ok("events", 200)), "{aerr}");
    assert!(
        aerr.contains("too many unfinished handshakes"),
        "the flood reached the listener and the eviction is logged: {aerr}"
    );
}

/// QUIC's D2: 150 half-open handshakes (real client Initial packets replayed from sockets
/// that never answer) and 50 connections that finish the QUIC handshake with the trusted
/// identity and then say nothing sit on the listener; the trusted device still connects and
/// delivers everything.
#[test]
fn two_hundred_half_open_and_silent_quic_connections_do_not_keep_the_real_peer_out() {
    let (_dir, dev_home, cfg, addr, mut app) = flood_listener("idle-quic", "quic");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let id = ndd_link::Identity::load(&dev_home).unwrap();
    let (half_open, silent) = rt.block_on(async {
        // Client Initials (each with its own connection id), caught on a socket of ours,
        // then sent to the listener from sockets that never answer.
        let catcher = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let target = catcher.local_addr().unwrap().to_string();
        let mut half_open = Vec::new();
        for _ in 0..150 {
            let (t, i) = (target.clone(), id.clone());
            let attempt = tokio::spawn(async move {
                let _ = ndd_link::quic_connect(&t, &i, Duration::from_millis(300)).await;
            });
            let mut initial = vec![0u8; 2000];
            let n = catcher.recv(&mut initial).await.unwrap();
            attempt.abort();
            let s = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
            s.send_to(&initial[..n], &addr).await.unwrap();
            half_open.push(s);
        }
        let mut silent = Vec::new();
        for _ in 0..50 {
            if let Ok(Ok((c, _))) = tokio::time::timeout(
                Duration::from_secs(2),
                ndd_link::quic_connect(&addr, &id, Duration::from_secs(2)),
            )
            .await
            {
                silent.push(c);
            }
        }
        (half_open, silent)
    });
    assert_eq!(silent.len(), 50, "silent QUIC connections made");
    assert!(app.running(), "the flood stopped the listener");
    trusted_device_gets_through(
        &cfg,
        &dev_home,
        &addr,
        "150 half-open and 50 silent QUIC connections",
    );
    drop(half_open);
    drop(silent);
    drop(rt);
    flood_listener_ends_well(app);
}

#[test]
fn two_hundred_idle_and_dripping_connections_do_not_keep_the_real_peer_out() {
    let (_dir, dev_home, cfg, addr, app) = flood_listener("idle-conns", "tcp");
    let idle: Vec<TcpStream> = (0..200)
        .map(|_| TcpStream::connect(&addr).expect("idle connection"))
        .collect();
    // A few that drip: one byte of a TLS ClientHello now and then.
    let mut drip: Vec<TcpStream> = (0..5)
        .map(|_| TcpStream::connect(&addr).expect("dripping connection"))
        .collect();
    for s in drip.iter_mut() {
        let _ = s.write_all(&[0x16]);
    }
    trusted_device_gets_through(
        &cfg,
        &dev_home,
        &addr,
        "200 idle and 5 dripping connections",
    );
    for s in drip.iter_mut() {
        let _ = s.write_all(&[0x03]);
    }
    drop(idle);
    drop(drip);
    flood_listener_ends_well(app);
}

/// `--duration` never panics and is honoured from the start (issue 17, D5 and D6).
#[test]
fn duration_is_bounded_and_honoured_before_a_peer_connects() {
    let dir = Dir::new("duration");
    let (_, app_home, _, _) = homes(&dir.0, true, true);
    let cfg = dir.0.join("c.toml");
    std::fs::write(&cfg, CFG.replace("TRANSPORT", "tcp")).unwrap();
    let huge = run_cmd(
        &cfg,
        "app",
        &app_home,
        &["--listen", "127.0.0.1:0", "--duration", "1e20"],
    )
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&huge.stderr);
    assert_eq!(huge.status.code(), Some(1), "{err}");
    assert!(
        err.contains("--duration must be a positive number of seconds up to one year"),
        "{err}"
    );
    let alone = run_cmd(
        &cfg,
        "app",
        &app_home,
        &["--listen", "127.0.0.1:0", "--duration", "0.3"],
    )
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&alone.stderr);
    assert_eq!(alone.status.code(), Some(1), "{err}");
    assert!(
        err.contains("no peer connected within --duration (0.3 s)"),
        "{err}"
    );
}

/// What would only fail after connecting, or after seconds of retries, or at exit, is one line
/// at start, before the side listens or connects (issue 32, item 2): each run is bounded
/// (`timeout`), so a side that waited or retried instead fails the test.
#[test]
fn mistakes_are_named_before_connecting() {
    let dir = Dir::new("before-connecting");
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let cfg = dir.0.join("c.toml");
    std::fs::write(&cfg, CFG.replace("TRANSPORT", "tcp")).unwrap();
    let enc = dir.0.join("enc.toml");
    std::fs::write(
        &enc,
        CFG.replace("TRANSPORT", "tcp").replace(
            "sink = ",
            "stack = [{ type = \"encrypt\", key_file = \"gone.key\" }]\nsink = ",
        ),
    )
    .unwrap();
    let fails = |cfg: &std::path::Path, side: &str, home: &std::path::Path, args: &[&str]| {
        let out = run_cmd(cfg, side, home, args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(!err.contains("listening on"), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
        err
    };
    // A missing key file: named with its stream and layer, by `ndd run` and by `ndd check`.
    let missing = format!(
        "enc.toml: stream \"events\" layer 0 (encrypt): cannot start: encrypt: cannot read key file {}",
        dir.0.join("gone.key").display()
    );
    let err = fails(&enc, "app", &app_home, &["--listen", "127.0.0.1:0"]);
    assert!(err.contains(&missing), "{err}");
    let out = ndd().arg("check").arg(&enc).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(&missing), "{err}");
    // Where to connect: port 0, a host that does not resolve.
    let err = fails(&cfg, "device", &dev_home, &["--connect", "127.0.0.1:0"]);
    assert!(
        err.contains("--connect: \"127.0.0.1:0\": port 0 is not a port one can connect to"),
        "{err}"
    );
    let err = fails(
        &cfg,
        "device",
        &dev_home,
        &["--connect", "no-such-host.invalid:7878"],
    );
    assert!(
        err.contains("--connect: \"no-such-host.invalid:7878\": the host does not resolve"),
        "{err}"
    );
    // A stats file that cannot be written, and a negative duration.
    let err = fails(
        &cfg,
        "app",
        &app_home,
        &[
            "--listen",
            "127.0.0.1:0",
            "--stats-json",
            "/nonexistent-dir/s.json",
        ],
    );
    assert!(
        err.contains("--stats-json /nonexistent-dir/s.json: cannot write there"),
        "{err}"
    );
    let err = fails(
        &cfg,
        "app",
        &app_home,
        &["--listen", "127.0.0.1:0", "--duration", "-1"],
    );
    assert!(
        err.contains(
            "--duration must be a positive number of seconds up to one year (31622400), not -1"
        ),
        "{err}"
    );
    // A config that is a device or a pipe (the pipe would block for good if opened).
    let err = fails(std::path::Path::new("/dev/zero"), "app", &app_home, &[]);
    assert!(
        err.contains("config file /dev/zero is a device, not a regular file"),
        "{err}"
    );
}

/// A UDP listener on port 0 is refused up front: it binds again for each peer, so the port it
/// printed would not be the one the next peer must use (found by hand: it said `listening on
/// 127.0.0.1:0 (UDP)`).
#[test]
fn a_udp_listener_on_port_0_is_refused_with_the_reason() {
    let dir = Dir::new("udp-port-0");
    let (_, app_home, _, _) = homes(&dir.0, true, true);
    let cfg = dir.0.join("c.toml");
    std::fs::write(&cfg, CFG.replace("TRANSPORT", "udp")).unwrap();
    let out = run_cmd(&cfg, "app", &app_home, &["--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(
            "cannot listen (UDP) on 127.0.0.1:0: port 0 picks a new port at each bind, and a UDP \
             listener binds again for every peer; name a fixed port"
        ),
        "{err}"
    );
    assert!(!err.contains("listening on"), "{err}");
}

/// On a sealed UDP link a stranger's datagrams in the middle of a session (a plain HELLO,
/// forged DATA, a whole key exchange of its own) are dropped with a warning: the session goes
/// on and every frame arrives (issue 17, D3).
#[test]
fn a_strangers_datagrams_do_not_touch_a_udp_session() {
    let dir = Dir::new("udp-stranger");
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let cfg = dir.0.join("c.toml");
    std::fs::write(
        &cfg,
        CFG.replace("TRANSPORT", "udp").replace("= 200", "= 1500"),
    )
    .unwrap();
    let addr = free_addr();
    let json = dir.0.join("app.json");
    let app = Side::spawn(run_cmd(
        &cfg,
        "app",
        &app_home,
        &["--listen", &addr, "--stats-json", json.to_str().unwrap()],
    ));
    let _ = app.addr();
    let dev = Side::spawn(run_cmd(&cfg, "device", &dev_home, &["--connect", &addr]));
    app.wait_says("streams agreed", &[&dev]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let stranger = ndd_link::udp_connect(&addr).await.unwrap();
        let hello = ndd_wire::OwnedMessage::Hello(ndd_wire::HelloRepr {
            side: ndd_wire::Side::Device,
            max_body: 1 << 20,
            driver: "someone-else".into(),
            streams: vec![],
        });
        let data = ndd_wire::OwnedMessage::Data {
            stream: 1,
            retransmit: false,
            more: false,
            seq: 5,
            timestamp_ns: 0,
            payload: vec![0; 100],
        };
        for _ in 0..3 {
            stranger.send_message(&hello.as_message()).await.unwrap();
        }
        for _ in 0..20 {
            stranger.send_message(&data.as_message()).await.unwrap();
        }
        // A key exchange of its own: the live link does not answer it.
        let id = ndd_link::Identity::load(&dev_home).unwrap();
        let me = ndd_link::seal::LocalIdentity::new(&id).unwrap();
        let e = ndd_link::udp_connect_secure(&addr, &me, Duration::from_millis(600))
            .await
            .unwrap_err();
        assert!(
            e.to_string().contains("no answer to the UDP key exchange"),
            "{e}"
        );
    });
    wait_for("the warning", WAIT, || {
        app.stderr_now()
            .contains("UDP link: dropped datagrams that did not authenticate")
    });
    let (ds, _, derr) = dev.finish();
    let (as_, _, aerr) = app.finish();
    assert!(ds.success(), "device: {derr}");
    assert!(as_.success(), "app: {aerr}");
    assert!(aerr.contains(&check_ok("events", 1500)), "{aerr}");
    // The final counts, which the warning every 5 s would not show: at least the stranger's
    // 23 datagrams and its key exchange's.
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let d = &v["link_dropped"];
    let total: u64 = ["unauthenticated", "replayed", "garbage"]
        .iter()
        .map(|k| d[k].as_u64().unwrap())
        .sum();
    assert!(total >= 24, "{v}");
    assert!(
        aerr.contains(&format!(
            "ndd [app]: the UDP link dropped {total} datagram(s): {} unauthenticated",
            d["unauthenticated"]
        )),
        "{aerr}"
    );
}

/// `c.toml` in `dir`: [`CFG`] over `transport` with `count` frames, `link` added to `[link]`.
fn long_config(
    dir: &std::path::Path,
    transport: &str,
    count: u64,
    link: &str,
) -> std::path::PathBuf {
    let cfg = dir.join("c.toml");
    std::fs::write(
        &cfg,
        CFG.replace("TRANSPORT", transport)
            .replace("[link]", &format!("[link]\n{link}"))
            .replace("count = 200", &format!("count = {count}"))
            .replace("expect = 200", &format!("expect = {count}")),
    )
    .unwrap();
    cfg
}

/// An app side listening on a free port and a device connected to it, both sides' streams
/// agreed: (address, app, device).
fn app_and_device(
    cfg: &std::path::Path,
    app_home: &std::path::Path,
    dev_home: &std::path::Path,
) -> (String, Side, Side) {
    // TCP and QUIC listeners bind port 0 and say which port they got (a port picked free
    // beforehand can be taken meanwhile: seen once in CI, "Address already in use"); a UDP
    // listener binds at each attempt, so it needs its port up front.
    let udp = std::fs::read_to_string(cfg).is_ok_and(|t| t.contains("transport = \"udp\""));
    let listen = if udp {
        free_addr()
    } else {
        "127.0.0.1:0".to_string()
    };
    let app = Side::spawn(run_cmd(cfg, "app", app_home, &["--listen", &listen]));
    let said = app.addr();
    let addr = said.split(' ').next().unwrap_or(&said).to_string();
    let dev = Side::spawn(run_cmd(cfg, "device", dev_home, &["--connect", &addr]));
    dev.wait_says("streams agreed", &[&app]);
    app.wait_says("streams agreed", &[&dev]);
    (addr, app, dev)
}

/// A second trusted device connecting while the app side serves one is told the app side is
/// busy, and by whom (not left to time out in the listen queue), and the first one's session
/// goes on untouched.
fn second_device_is_told_busy(transport: &str) {
    let dir = Dir::new(&format!("busy-{transport}"));
    let (dev_home, app_home, _, afp) = homes(&dir.0, true, true);
    let other_home = dir.0.join("other");
    let ofp = ok(ndd().args(["id", "--home"]).arg(&other_home))
        .trim()
        .to_string();
    ok(ndd().args(["trust", &afp, "--home"]).arg(&other_home));
    ok(ndd()
        .args(["trust", &ofp, "--name", "other", "--home"])
        .arg(&app_home));
    let cfg = long_config(&dir.0, transport, 3000, "connect_timeout_ms = 1500");
    let (addr, app, dev) = app_and_device(&cfg, &app_home, &dev_home);
    let t0 = Instant::now();
    // `--once`: give up at the connect timeout (without it a device waits for a busy app side
    // to be free, saying so).
    let other = Side::spawn(run_cmd(
        &cfg,
        "device",
        &other_home,
        &["--connect", &addr, "--once"],
    ));
    let (os, _, oerr) = other.finish();
    let took = t0.elapsed();
    assert!(
        !os.success(),
        "{transport}: the second device gets no session: {oerr}"
    );
    let why = if transport == "udp" {
        // The session owns the listener's socket: nobody answers the second key exchange.
        "no answer to the UDP key exchange"
    } else {
        "busy: the app side already serves device and takes one peer at a time"
    };
    assert!(
        oerr.contains(why),
        "{transport}: the second device is told why: {oerr}"
    );
    assert!(
        took < Duration::from_secs(10),
        "{transport}: refused within its connect timeout, not after a handshake timeout ({took:?})"
    );
    let (ds, _, derr) = dev.finish();
    let (as_, _, aerr) = app.finish();
    assert!(ds.success(), "{transport} device: {derr}");
    assert!(as_.success(), "{transport} app: {aerr}");
    assert!(aerr.contains(&check_ok("events", 3000)), "{aerr}");
    assert!(
        transport == "udp"
            || aerr.contains("refused a connection: other at 127.0.0.1:")
                && aerr.contains(": busy serving device"),
        "{transport}: the app side logs whom it refused and why: {aerr}"
    );
}

#[test]
fn a_second_device_is_told_the_app_side_is_busy_over_tls() {
    second_device_is_told_busy("tcp");
}

#[test]
fn a_second_device_is_told_the_app_side_is_busy_over_quic() {
    second_device_is_told_busy("quic");
}

#[test]
fn a_second_device_over_udp_gets_no_answer_and_the_session_goes_on() {
    second_device_is_told_busy("udp");
}

/// `ndd untrust` on a side whose link is up ends that link within a few seconds (it is not
/// left to run until it drops), and the peer's reconnects are refused as untrusted.
#[test]
fn untrusting_the_connected_peer_closes_the_link_and_its_reconnects_are_refused() {
    let dir = Dir::new("untrust-live");
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let cfg = long_config(&dir.0, "tcp", 100_000, "");
    let (_, app, dev) = app_and_device(&cfg, &app_home, &dev_home);
    let out = ok(ndd().args(["untrust", "device", "--home"]).arg(&app_home));
    assert!(out.starts_with("no longer trusted: SHA256:"), "{out}");
    let t0 = Instant::now();
    wait_for("the app side to close the link", WAIT, || {
        app.stderr_now()
            .contains("is no longer trusted (not in known_peers): closing the link")
    });
    println!(
        "link closed {:.1} s after ndd untrust",
        t0.elapsed().as_secs_f64()
    );
    wait_for("the device's reconnect to be refused", WAIT, || {
        app.stderr_now().contains("refused untrusted peer")
    });
    // The device says so when it has read the refusal, a moment after the app side logged it.
    wait_for(
        "the device to say why its reconnect was refused",
        WAIT,
        || dev.stderr_now().contains("not trusted by the peer"),
    );
    let derr = dev.kill();
    assert!(
        derr.contains(
            "link lost: the peer no longer trusts this side: its fingerprint was removed from \
             known_peers (ndd untrust); reconnecting"
        ),
        "the device is told at once why its link closed: {derr}"
    );
    assert!(
        !derr.contains("close_notify"),
        "not as if the app side had crashed: {derr}"
    );
    assert!(
        derr.contains("not trusted by the peer"),
        "and why its reconnects are refused: {derr}"
    );
    drop(app.kill());
}

/// `ndd check` says each stream's reliability and send priority, the defaults included: the
/// desktop's keyboard and mouse before its screen.
#[test]
fn check_shows_each_streams_reliability_and_priority() {
    let example =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/desktop.toml");
    let out = ok(ndd().arg("check").arg(&example));
    assert!(
        out.contains("stream 1 \"screen\" app→device, reliable, priority normal: x11-screen("),
        "{out}"
    );
    assert!(
        out.contains("stream 2 \"input\" device→app, reliable, priority high: x11-input("),
        "{out}"
    );
    let audio = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/audio.toml");
    let out = ok(ndd().arg("check").arg(&audio));
    assert!(
        out.contains("stream 1 \"mic\" device→app, lossy, priority high: pulse-capture("),
        "{out}"
    );
}

/// `--stats-json` is written when a side ends with an error too: what it counted until then,
/// and the error (here the link is lost for good: `reconnect = false`, the device killed).
#[test]
fn stats_json_is_written_on_an_error_exit() {
    let dir = Dir::new("stats-json-error");
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let cfg = long_config(&dir.0, "tcp", 1_000_000, "reconnect = false");
    let json = dir.0.join("app.json");
    let app = Side::spawn(run_cmd(
        &cfg,
        "app",
        &app_home,
        &[
            "--listen",
            "127.0.0.1:0",
            "--stats-json",
            json.to_str().unwrap(),
            "--stats",
        ],
    ));
    let addr = app.addr();
    let dev = Side::spawn(run_cmd(&cfg, "device", &dev_home, &["--connect", &addr]));
    app.wait_says("streams agreed", &[&dev]);
    // Frames have arrived (a live line counts them) before the device goes.
    wait_for("frames at the app side", WAIT, || {
        app.stderr_now().lines().any(|l| {
            l.strip_prefix("[app] events")
                .and_then(|r| r.split(" frames").next())
                .and_then(|r| r.split_whitespace().last())
                .and_then(|n| n.parse::<u64>().ok())
                .is_some_and(|n| n > 0)
        })
    });
    drop(dev.kill());
    let (status, _, err) = app.finish();
    assert_eq!(status.code(), Some(1), "{err}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let error = v["error"].as_str().unwrap_or_default();
    assert!(!error.is_empty() && err.contains(error), "{v}\n{err}");
    let frames = v["streams"][0]["frames"].as_u64().unwrap_or(0);
    assert!(frames > 0, "what came before the error is counted: {v}");
}

/// `ndd bench` is the `ndd-bench` program (the production binary carries no benchmark code):
/// without it beside `ndd` or on the PATH, one line says how to get it.
#[test]
fn ndd_bench_without_its_program_says_how_to_build_it() {
    let dir = Dir::new("no-bench");
    let alone = dir.0.join("ndd");
    std::fs::copy(env!("CARGO_BIN_EXE_ndd"), &alone).unwrap();
    // A child another test thread forks while the copy is open for writing inherits that
    // descriptor until it execs, and the kernel refuses to run a file open for writing
    // ("Text file busy", seen with the machine loaded): tried again for up to 2 s.
    let mut tries = 0;
    let out = loop {
        match std::process::Command::new(&alone)
            .args(["bench", "links", "--quick"])
            .env("PATH", &dir.0)
            .output()
        {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 100 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            r => break r.unwrap(),
        }
    };
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("ndd bench needs the ndd-bench program, beside ndd or on the PATH: build it with `cargo build --release -p ndd-bench`"),
        "{err}"
    );
}

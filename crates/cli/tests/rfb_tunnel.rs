//! `ndd rfb-accel` with its slow leg over a pinned TLS tunnel, as a user runs it: a real Xvnc
//! with a red xterm, `ndd rfb-accel --tls-listen … --server …` next to it, `ndd rfb-accel
//! --listen … --tls-connect …` on the viewer's side, and an unmodified TigerVNC viewer. A relay
//! between the two ndd processes records what crosses the "network": no RFB in plaintext.
//! Before the server side trusts the viewer side, a viewer is told why, with the command that
//! fixes it. Skips (saying why) when the X/VNC programs are missing.

mod common;

use std::sync::{Arc, Mutex};

use common::{free_addr, homes, ndd, Dir, Side};
use ndd_rfb::bench::harness::{
    missing_programs, red_xterm_writing_to, type_through_viewer, vncviewer, wait_for_red, XServer,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A TCP relay from `listen` to `upstream` that keeps every byte it carries (both ways).
async fn recording_relay(upstream: String) -> (String, Arc<Mutex<Vec<u8>>>) {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    tokio::spawn(async move {
        while let Ok((a, _)) = l.accept().await {
            let Ok(b) = TcpStream::connect(&upstream).await else {
                continue;
            };
            let (mut ar, mut aw) = a.into_split();
            let (mut br, mut bw) = b.into_split();
            let (s3, s4) = (s2.clone(), s2.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 << 10];
                while let Ok(n) = ar.read(&mut buf).await {
                    if n == 0 || bw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                    s3.lock().unwrap().extend_from_slice(&buf[..n]);
                }
                let _ = bw.shutdown().await;
            });
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 << 10];
                while let Ok(n) = br.read(&mut buf).await {
                    if n == 0 || aw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                    s4.lock().unwrap().extend_from_slice(&buf[..n]);
                }
                let _ = aw.shutdown().await;
            });
        }
    });
    (addr, seen)
}

/// What a raw client reads from the viewer-side listener before the server side trusts it:
/// an RFB 3.3 refusal with a reason.
async fn refusal_reason(addr: &str) -> String {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let mut v = [0u8; 12];
    s.read_exact(&mut v).await.expect("version");
    assert_eq!(&v, b"RFB 003.003\n");
    s.write_all(b"RFB 003.003\n").await.expect("version back");
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest).await;
    assert!(rest.len() >= 8 && rest[..4] == [0, 0, 0, 0], "{rest:?}");
    String::from_utf8_lossy(&rest[8..]).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_viewer_works_through_the_tunnel_and_nothing_crosses_in_plaintext() {
    let need = ["Xvnc", "Xvfb", "vncviewer", "xterm", "xdotool", "xwd"];
    let missing = missing_programs(&need);
    if !missing.is_empty() {
        println!(
            "SKIPPED: missing {missing:?} (apt-get install tigervnc-standalone-server \
             tigervnc-viewer xvfb xterm xdotool x11-apps)"
        );
        return;
    }
    let dir = Dir::new("rfb-tunnel");
    // "dev" is the VNC server's machine, "app" the viewer's; the viewer side trusts the server
    // side, not yet the other way round.
    let (server_home, viewer_home, _, viewer_fp) = homes(&dir.0, false, true);

    let vnc = XServer::xvnc("640x480").await.expect("Xvnc starts");
    let file = dir.0.join("typed.txt");
    let _xterm = red_xterm_writing_to(vnc.display, &file).expect("xterm starts");

    let tunnel_addr = free_addr();
    let mut server_side = ndd();
    server_side
        .args(["rfb-accel", "--tls-listen", &tunnel_addr, "--server"])
        .arg(vnc.rfb_addr().to_string())
        .arg("--home")
        .arg(&server_home);
    let server_side = Side::spawn(server_side);
    let (relay, seen) = recording_relay(tunnel_addr.clone()).await;
    let viewer_addr = free_addr();
    let mut viewer_side = ndd();
    viewer_side
        .args([
            "rfb-accel",
            "--listen",
            &viewer_addr,
            "--tls-connect",
            &relay,
            "--home",
        ])
        .arg(&viewer_home);
    let viewer_side = Side::spawn(viewer_side);

    // 1. Not trusted yet: the viewer is told why, with the command to run on the server's
    //    machine; the server side logs the refusal.
    let mut reason = String::new();
    for _ in 0..100 {
        if TcpStream::connect(&viewer_addr).await.is_ok() {
            reason = refusal_reason(&viewer_addr).await;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        reason.contains(&format!("ndd trust {viewer_fp}")),
        "refusal shown to the viewer: {reason:?}; viewer side: {}",
        viewer_side.stderr_now()
    );
    // The server side logs the refusal as it closes; under load the line can come a moment
    // after the viewer read the reason.
    let logged = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !server_side.stderr_now().contains("refused") {
        assert!(
            std::time::Instant::now() < logged,
            "{}",
            server_side.stderr_now()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }

    // 2. Trusted (no restart: known_peers is read for every tunnel): a real viewer shows the
    //    server's screen and its keys reach the xterm.
    common::ok(
        ndd()
            .args(["trust", &viewer_fp, "--name", "viewer", "--home"])
            .arg(&server_home),
    );
    let viewer_x = XServer::xvfb("800x600").await.expect("Xvfb starts");
    let port: u16 = viewer_addr
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("a port");
    let mut viewer = vncviewer(viewer_x.display, port).expect("vncviewer starts");
    let red = wait_for_red(viewer_x.display, 50_000).await;
    assert!(viewer.alive(), "vncviewer exited");
    assert!(
        red > 50_000,
        "the viewer did not show the server's screen ({red} red pixels); viewer side: {}; \
         server side: {}",
        viewer_side.stderr_now(),
        server_side.stderr_now()
    );
    let typed =
        type_through_viewer(vnc.display, viewer_x.display, &file, "through the tunnel").await;
    assert!(typed.is_ok(), "{typed:?}");

    // 3. What crossed between the two ndd processes: TLS records, no RFB greeting, no pixels
    //    of the red screen in the clear.
    let seen = seen.lock().unwrap().clone();
    assert!(seen.len() > 2_000, "{} bytes crossed", seen.len());
    assert!(
        !seen.windows(4).any(|w| w == b"RFB "),
        "an RFB greeting crossed in plaintext"
    );
    assert_eq!(seen[0], 0x16, "a TLS handshake record opens the tunnel");
    drop(viewer);
    drop(viewer_side.kill());
    drop(server_side.kill());
}

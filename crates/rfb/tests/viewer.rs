//! A real, unmodified TigerVNC `vncviewer` on Xvfb, through the accelerator, to a real Xvnc:
//! the viewer must show the server's screen, and keys typed into the viewer must reach an
//! `xterm` on the server. Skips (saying why) when the programs are missing; CI installs
//! tigervnc-standalone-server tigervnc-viewer xvfb xterm xdotool x11-apps.

use std::time::{Duration, Instant};

use ndd_rfb::bench::harness::{local_listener, missing_programs, Proc, XServer};
use ndd_rfb::{serve_accel, AccelOptions};

/// Count pure-red pixels in an `xwd -root` dump (32 bits per pixel, either byte order).
fn red_pixels(xwd: &[u8]) -> Option<usize> {
    let f = |i: usize| -> Option<u32> {
        let b = xwd.get(i * 4..i * 4 + 4)?;
        Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    };
    let (header, width, height, order, bpp, stride) = (f(0)?, f(4)?, f(5)?, f(7)?, f(11)?, f(12)?);
    let (rm, gm, bm, ncolours) = (f(14)?, f(15)?, f(16)?, f(19)?);
    if bpp != 32 {
        return None;
    }
    let data = xwd.get(header as usize + ncolours as usize * 12..)?;
    let mut n = 0;
    for y in 0..height as usize {
        for x in 0..width as usize {
            let at = y * stride as usize + x * 4;
            let p = data.get(at..at + 4)?;
            let v = if order == 0 {
                u32::from_le_bytes([p[0], p[1], p[2], p[3]])
            } else {
                u32::from_be_bytes([p[0], p[1], p[2], p[3]])
            };
            if v & rm == rm && v & gm == 0 && v & bm == 0 {
                n += 1;
            }
        }
    }
    Some(n)
}

async fn screenshot_red(display: u32) -> usize {
    let out = tokio::process::Command::new("xwd")
        .args(["-root", "-silent", "-display", &format!(":{display}")])
        .output()
        .await;
    out.ok().and_then(|o| red_pixels(&o.stdout)).unwrap_or(0)
}

async fn xdotool(display: u32, args: &[&str]) {
    let _ = tokio::process::Command::new("xdotool")
        .args(args)
        .env("DISPLAY", format!(":{display}"))
        .output()
        .await;
}

async fn window(display: u32, args: &[&str]) -> Option<String> {
    let out = tokio::process::Command::new("xdotool")
        .arg("search")
        .args(args)
        .env("DISPLAY", format!(":{display}"))
        .output()
        .await
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .map(str::to_string)
}

/// TigerVNC's viewer negotiates ContinuousUpdates (server push) when offered: that path runs
/// through the proxy unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_viewer_with_continuous_updates() {
    real_viewer_through_accelerator(AccelOptions::default()).await;
}

/// With ContinuousUpdates withheld the same viewer runs client-pull, so the accelerator's
/// pipelining (Algorithm 1) carries every update.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_viewer_pipelined() {
    real_viewer_through_accelerator(AccelOptions {
        continuous_updates: false,
        ..AccelOptions::default()
    })
    .await;
}

async fn real_viewer_through_accelerator(opts: AccelOptions) {
    let need = ["Xvnc", "Xvfb", "vncviewer", "xterm", "xdotool", "xwd"];
    let missing = missing_programs(&need);
    if !missing.is_empty() {
        eprintln!(
            "SKIPPED real-viewer test: missing {missing:?} \
             (apt-get install tigervnc-standalone-server tigervnc-viewer xvfb xterm xdotool x11-apps)"
        );
        return;
    }
    let started = Instant::now();
    let server = XServer::xvnc("640x480").await.expect("Xvnc starts");
    let file = std::env::temp_dir().join(format!(
        "ndd-rfb-viewer-{}-{}.txt",
        std::process::id(),
        server.display
    ));
    let _ = std::fs::remove_file(&file);
    let script = format!("cat > '{}'", file.display());
    // A red xterm filling the server screen: what the viewer must show, and where keys land.
    let _xterm = Proc::spawn(
        "xterm",
        &[
            "-geometry",
            "120x50+0+0",
            "-bg",
            "red",
            "-fg",
            "white",
            "-e",
            "sh",
            "-c",
            &script,
        ],
        Some(server.display),
    )
    .expect("xterm starts");

    let listener = local_listener().await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let accel = tokio::spawn(serve_accel(listener, server.rfb_addr().to_string(), opts));

    let viewer_x = XServer::xvfb("800x600").await.expect("Xvfb starts");
    let before = screenshot_red(viewer_x.display).await;
    let target = format!("127.0.0.1::{port}");
    let mut viewer = Proc::spawn(
        "vncviewer",
        &["-geometry", "+0+0", &target],
        Some(viewer_x.display),
    )
    .expect("vncviewer starts");

    // 1. The viewer receives updates: the red xterm appears on the viewer's display.
    let mut red = 0;
    let deadline = Instant::now() + Duration::from_secs(25);
    while Instant::now() < deadline {
        red = screenshot_red(viewer_x.display).await;
        if red > 50_000 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(viewer.alive(), "vncviewer exited");
    assert!(
        red > 50_000,
        "the viewer did not show the server's screen: {red} red pixels (before: {before})"
    );

    // 2. The viewer's input reaches the server: type into the viewer window, over the xterm.
    // Setup only (a window manager would do this): give the xterm the server's keyboard focus,
    // and the viewer window the viewer display's focus.
    if let Some(w) = window(server.display, &["--class", "xterm"]).await {
        xdotool(server.display, &["windowfocus", "--sync", &w]).await;
    }
    if let Some(w) = window(viewer_x.display, &["--name", "TigerVNC"]).await {
        xdotool(viewer_x.display, &["windowfocus", "--sync", &w]).await;
    }
    let want = "ndd rfb accel ok";
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut got = String::new();
    let mut attempt = 0;
    while Instant::now() < deadline && !got.contains(want) {
        if attempt % 10 == 0 {
            xdotool(viewer_x.display, &["mousemove", "200", "200"]).await;
            tokio::time::sleep(Duration::from_millis(300)).await;
            xdotool(viewer_x.display, &["type", "--delay", "30", want]).await;
            xdotool(viewer_x.display, &["key", "Return"]).await;
        }
        attempt += 1;
        tokio::time::sleep(Duration::from_millis(300)).await;
        got = std::fs::read_to_string(&file).unwrap_or_default();
    }
    accel.abort();
    let _ = std::fs::remove_file(&file);
    assert!(
        got.contains(want),
        "keys typed in the viewer did not reach the server's xterm; file holds {got:?}"
    );
    eprintln!(
        "viewer test passed in {:.1} s ({red} red pixels on the viewer's display)",
        started.elapsed().as_secs_f64()
    );
}

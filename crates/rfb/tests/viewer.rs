//! A real, unmodified TigerVNC `vncviewer` on Xvfb, through the accelerator, to a real Xvnc:
//! the viewer must show the server's screen, and keys typed into the viewer must reach an
//! `xterm` on the server. Skips (saying why) when the programs are missing; CI installs
//! tigervnc-standalone-server tigervnc-viewer xvfb xterm xdotool x11-apps.

use std::time::Instant;

use ndd_rfb::bench::harness::{
    local_listener, missing_programs, red_xterm_writing_to, screenshot_red, type_through_viewer,
    vncviewer, wait_for_red, XServer,
};
use ndd_rfb::{serve_accel, AccelOptions};

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
    // A red xterm filling the server screen: what the viewer must show, and where keys land.
    let _xterm = red_xterm_writing_to(server.display, &file).expect("xterm starts");

    let listener = local_listener().await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let accel = tokio::spawn(serve_accel(listener, server.rfb_addr().to_string(), opts));

    let viewer_x = XServer::xvfb("800x600").await.expect("Xvfb starts");
    let before = screenshot_red(viewer_x.display).await;
    let mut viewer = vncviewer(viewer_x.display, port).expect("vncviewer starts");

    // 1. The viewer receives updates: the red xterm appears on the viewer's display.
    let red = wait_for_red(viewer_x.display, 50_000).await;
    assert!(viewer.alive(), "vncviewer exited");
    assert!(
        red > 50_000,
        "the viewer did not show the server's screen: {red} red pixels (before: {before})"
    );

    // 2. The viewer's input reaches the server: type into the viewer window, over the xterm.
    let want = "ndd rfb accel ok";
    let typed = type_through_viewer(server.display, viewer_x.display, &file, want).await;
    accel.abort();
    let _ = std::fs::remove_file(&file);
    if let Err(e) = typed {
        panic!("{e}");
    }
    eprintln!(
        "viewer test passed in {:.1} s ({red} red pixels on the viewer's display)",
        started.elapsed().as_secs_f64()
    );
}

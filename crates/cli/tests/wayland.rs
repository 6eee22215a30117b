//! A Wayland screen through two ndd processes (issue 35): a headless sway's output captured
//! by the app side's `wayland-screen` source, sent over TLS to the device side's
//! `framebuffer` sink, must be pixel-identical to what `grim` captures, before and after the
//! screen changes. Skipped (printing why) where sway or grim is missing.

mod common;

use common::*;
use ndd_procs::Sway;
use std::time::{Duration, Instant};

#[test]
fn a_sway_output_reaches_the_other_side_pixel_identical_to_grim() {
    if let Some(m) = missing(&["sway", "grim", "swaymsg", "setpriv"]) {
        println!("SKIPPED: needs {m} (apt-get install sway grim)");
        return;
    }
    let sway = Sway::start("two-processes", 480, 320, "#204060").expect("headless sway");
    let dir = Dir::new("wayland-screen");
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let fb = dir.0.join("screen.bgrx");
    let cfg = dir.0.join("wayland.toml");
    std::fs::write(
        &cfg,
        format!(
            "driver = \"wayland-desktop\"\n[link]\naddress = \"{}\"\nlistener = \"app\"\n\
             [[stream]]\nname = \"screen\"\ndirection = \"app-to-device\"\n\
             source = {{ type = \"wayland-screen\", display = \"{}\", max_fps = 30 }}\n\
             sink = {{ type = \"framebuffer\", path = \"{}\" }}\n\
             stack = [{{ type = \"image\", quality = \"auto\" }}]\n",
            free_addr(),
            sway.socket.display(),
            fb.display()
        ),
    )
    .unwrap();
    // `ndd check --side app` probes the compositor.
    let out = ndd()
        .args(["check", "--side", "app"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let app = Side::spawn(run_cmd(&cfg, "app", &app_home, &[]));
    let dev = Side::spawn(run_cmd(&cfg, "device", &dev_home, &[]));
    app.wait_says("streams agreed", &[&dev]);
    let same = || -> Result<(), String> {
        let (w, h, rgb) = sway.grim().map_err(|e| e.to_string())?;
        let got = std::fs::read(&fb).map_err(|e| e.to_string())?;
        if got.len() != w * h * 4 {
            return Err(format!(
                "{} bytes in the file, {w}x{h} on screen",
                got.len()
            ));
        }
        let differ = got
            .chunks_exact(4)
            .zip(rgb.chunks_exact(3))
            .filter(|(b, r)| [b[2], b[1], b[0]] != [r[0], r[1], r[2]])
            .count();
        if differ == 0 {
            Ok(())
        } else {
            Err(format!("{differ} of {} pixels differ", w * h))
        }
    };
    let wait_same = |what: &str| {
        let t0 = Instant::now();
        loop {
            match same() {
                Ok(()) => return t0.elapsed(),
                Err(e) if t0.elapsed() > Duration::from_secs(20) => {
                    panic!(
                        "{what}: {e}\napp side: {}\ndevice side: {}",
                        app.stderr_now(),
                        dev.stderr_now()
                    )
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    };
    wait_same("the first picture");
    for color in ["#ff8800", "#0a0b0c"] {
        assert!(sway.msg(&["output", "HEADLESS-1", "bg", color, "solid_color"]));
        let took = wait_same(color);
        println!("{color}: identical after {took:?}");
    }
    app.kill();
    dev.kill();
}

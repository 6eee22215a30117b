//! The synthetic camera through the `image` pair (JPEG) between two real `ndd` processes
//! over TLS, into a `y4m` named pipe read by an unmodified `ffmpeg`: every frame arrives,
//! once, in order (the frame number written in each picture is read back from what ffmpeg
//! decoded), at the camera's size.

mod common;

use common::*;
use ndd_endpoint::camera::pattern::read_number;
use std::process::{Command, Stdio};

#[test]
fn every_camera_frame_reaches_ffmpeg_once_in_order() {
    if let Some(m) = missing(&["ffmpeg"]) {
        println!("SKIPPED: camera test needs {m} (apt-get install ffmpeg)");
        return;
    }
    let dir = Dir::new("camera");
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let fifo = dir.0.join("camera.y4m");
    let cfg = dir.0.join("camera.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
driver = "camera"
[[stream]]
name = "camera"
direction = "device-to-app"
source = {{ type = "camera-sim", width = 640, height = 480, fps = 30, count = 60 }}
stack = [{{ type = "image", quality = "high" }}]
sink = {{ type = "y4m", path = "{}", fps = 30 }}
"#,
            fifo.display()
        ),
    )
    .unwrap();
    let link = free_addr();
    let stats = dir.0.join("app-stats.json");
    let stats_s = stats.display().to_string();
    let app = Side::spawn(run_cmd(
        &cfg,
        "app",
        &app_home,
        &["--listen", &link, "--stats-json", &stats_s],
    ));
    let dev = Side::spawn(run_cmd(&cfg, "device", &dev_home, &["--connect", &link]));
    // The app side makes the pipe when its endpoints start, once the link is up; the sink
    // waits for a reader, the camera's frames wait for it (the stream is reliable).
    wait_for("the y4m pipe", WAIT, || fifo.exists());
    let strip = dir.0.join("strip.raw");
    let ffmpeg = Command::new("ffmpeg")
        .args(["-loglevel", "error", "-f", "yuv4mpegpipe", "-i"])
        .arg(&fifo)
        .args([
            "-vf",
            "crop=512:16:0:0",
            "-pix_fmt",
            "gray",
            "-f",
            "rawvideo",
            "-y",
        ])
        .arg(&strip)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ffmpeg");
    let out = ffmpeg
        .wait_with_output()
        .expect("ffmpeg ends with the stream");
    assert!(
        out.status.success(),
        "ffmpeg: {}\napp: {}\ndevice: {}",
        String::from_utf8_lossy(&out.stderr),
        app.stderr_now(),
        dev.stderr_now()
    );
    let raw = std::fs::read(&strip).unwrap();
    let numbers: Vec<u32> = raw
        .chunks_exact(512 * 16)
        .map(|f| read_number(f, 512).expect("a strip"))
        .collect();
    assert_eq!(
        numbers,
        (0..60).collect::<Vec<u32>>(),
        "frame numbers ffmpeg decoded"
    );
    // Timing: the frames reached the player at the camera's pace, 30 a second (the first
    // few wait for ffmpeg to open the pipe, so the span may be a little short; a camera
    // that ran unpaced, or a path that held frames back, would be far off).
    app.terminate();
    let (_, _, app_err) = app.finish();
    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&stats).unwrap_or_else(|e| panic!("{e}: app: {app_err}")),
    )
    .unwrap();
    let s = &json["streams"][0];
    assert_eq!(s["frames"].as_u64(), Some(60), "{s}");
    let span = s["delivery_span_s"].as_f64().unwrap();
    assert!(
        (1.6..=2.3).contains(&span),
        "60 frames at 30 fps span 1.97 s at the sink, got {span:.3} s"
    );
    drop(dev.kill());
}

/// A player that quits does not stop anything: the next one that opens the pipe gets the
/// stream again, from a new header, with the frames that follow.
#[test]
fn a_second_player_gets_the_stream_after_the_first_quits() {
    if let Some(m) = missing(&["ffmpeg"]) {
        println!("SKIPPED: camera test needs {m} (apt-get install ffmpeg)");
        return;
    }
    let dir = Dir::new("camera-replay");
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let fifo = dir.0.join("camera.y4m");
    let cfg = dir.0.join("camera.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
driver = "camera"
[[stream]]
name = "camera"
direction = "device-to-app"
source = {{ type = "camera-sim", width = 640, height = 480, fps = 30, count = 90 }}
sink = {{ type = "y4m", path = "{}", fps = 30 }}
"#,
            fifo.display()
        ),
    )
    .unwrap();
    let link = free_addr();
    let app = Side::spawn(run_cmd(&cfg, "app", &app_home, &["--listen", &link]));
    let dev = Side::spawn(run_cmd(&cfg, "device", &dev_home, &["--connect", &link]));
    wait_for("the y4m pipe", WAIT, || fifo.exists());
    let read = |frames: Option<&str>, name: &str| -> Vec<u32> {
        let out = dir.0.join(name);
        // Bounded: with no stream to read, ffmpeg would wait on the pipe for good.
        let mut c = Command::new("timeout");
        c.args([
            "20",
            "ffmpeg",
            "-loglevel",
            "error",
            "-f",
            "yuv4mpegpipe",
            "-i",
        ])
        .arg(&fifo);
        if let Some(n) = frames {
            c.args(["-frames:v", n]);
        }
        let ok = c
            .args([
                "-vf",
                "crop=512:16:0:0",
                "-pix_fmt",
                "gray",
                "-f",
                "rawvideo",
                "-y",
            ])
            .arg(&out)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("ffmpeg");
        assert!(
            ok.success(),
            "ffmpeg {name}: {ok}; app: {}",
            app.stderr_now()
        );
        std::fs::read(&out)
            .unwrap()
            .chunks_exact(512 * 16)
            .map(|f| read_number(f, 512).expect("a strip"))
            .collect()
    };
    let first = read(Some("30"), "first.raw");
    assert_eq!(first, (0..30).collect::<Vec<u32>>());
    let second = read(None, "second.raw");
    // The frame being written when the first player quit is lost with its pipe; the rest
    // follow in order to the camera's last.
    assert!(second.windows(2).all(|w| w[1] == w[0] + 1), "{second:?}");
    assert!(
        second.first().is_some_and(|&f| (30..=33).contains(&f)),
        "{second:?}"
    );
    assert_eq!(second.last(), Some(&89), "{second:?}");
    drop(app.kill());
    drop(dev.kill());
}

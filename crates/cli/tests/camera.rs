//! The synthetic camera through the `image` pair (JPEG) between two real `ndd` processes
//! over TLS, into a `y4m` named pipe read by an unmodified `ffmpeg`: every frame arrives,
//! once, in order (the frame number written in each picture is read back from what ffmpeg
//! decoded), at the camera's size.

mod common;

use common::*;
use ndd_endpoint::camera::pattern::read_number;
use std::process::{Command, Stdio};
use std::time::Duration;

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
    let app = Side::spawn(run_cmd(&cfg, "app", &app_home, &["--listen", &link]));
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
    std::thread::sleep(Duration::from_millis(100));
    drop(app.kill());
    drop(dev.kill());
}

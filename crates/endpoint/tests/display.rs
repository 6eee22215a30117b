//! Display endpoints against real programs: an Xvfb "app" display runs unmodified X programs
//! (`xsetroot`, `xlogo`, `xterm`, `xclock`, `ffplay`), the `x11-screen` source captures it,
//! and the `x11-window` sink on a second Xvfb (or the `framebuffer` sink in a file) must show
//! the same pixels once the content settles. Also: the viewer window as an `x11-input`
//! source, the non-SHM path, bad records, and the frame rate of an animation. Tests that need
//! a missing program print `SKIPPED: …` and pass.

use ndd_core::Frame;
use ndd_endpoint::display::{Update, FLAG_KEYFRAME, FLAG_MORE};
use ndd_endpoint::input::{InputMessage, ABS_X, ABS_Y, BTN_LEFT, EV_ABS, EV_KEY, KEY_A};
use ndd_endpoint::{
    FramebufferConfig, SinkConfig, SinkReport, SourceConfig, SourceReport, X11InputConfig,
    X11ScreenConfig, X11Window, X11WindowConfig,
};
use ndd_procs::{have, missing, wait_for, Killed, Xvfb};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use x11rb::connection::Connection;
use x11rb::protocol::xproto::{self, ConnectionExt as _};
use x11rb::rust_connection::RustConnection;

const APT: &str = "apt-get install xvfb x11-apps x11-xserver-utils xterm xdotool ffmpeg";

/// An Xvfb, or the test fails.
fn xvfb(screen: &str) -> Xvfb {
    Xvfb::start(screen).expect("start Xvfb")
}

/// What these tests do with a display besides starting programs on it.
trait XvfbExt {
    fn run(&self, program: &str, args: &[&str]) -> Killed;
    fn call(&self, program: &str, args: &[&str]);
    fn connect(&self) -> RustConnection;
}

impl XvfbExt for Xvfb {
    /// Starts `program` on this display; killed on drop.
    fn run(&self, program: &str, args: &[&str]) -> Killed {
        self.spawn(program, args)
            .unwrap_or_else(|e| panic!("start {program}: {e}"))
    }

    /// Runs `program` on this display to its end.
    fn call(&self, program: &str, args: &[&str]) {
        let status = Command::new(program)
            .env("DISPLAY", &self.display)
            .args(args)
            .status()
            .unwrap_or_else(|e| panic!("{program}: {e}"));
        assert!(status.success(), "{program} {args:?}: {status}");
    }

    fn connect(&self) -> RustConnection {
        RustConnection::connect(Some(&self.display))
            .expect("connect")
            .0
    }
}

fn root(conn: &RustConnection) -> xproto::Window {
    conn.setup().roots[0].root
}

/// The pixels of `w`×`h` at the origin of `drawable` (32 bpp ZPixmap), or `None` while they
/// cannot be read (a window not mapped yet).
fn grab(conn: &RustConnection, drawable: u32, w: u16, h: u16) -> Option<Vec<u8>> {
    conn.get_image(xproto::ImageFormat::Z_PIXMAP, drawable, 0, 0, w, h, !0)
        .ok()?
        .reply()
        .ok()
        .map(|r| r.data)
}

/// The pixels of an area of the root window.
fn grab_at(conn: &RustConnection, (x, y, w, h): (i16, i16, u16, u16)) -> Vec<u8> {
    conn.get_image(xproto::ImageFormat::Z_PIXMAP, root(conn), x, y, w, h, !0)
        .unwrap()
        .reply()
        .unwrap()
        .data
}

/// Pixels that differ in B, G or R (the fourth byte is unspecified); a length mismatch counts
/// every missing pixel.
fn differing(a: &[u8], b: &[u8]) -> usize {
    a.chunks(4)
        .zip(b.chunks(4))
        .filter(|(p, q)| p[..3] != q[..3])
        .count()
        + a.len().abs_diff(b.len()) / 4
}

/// The top-level window called `title`.
fn window_named(conn: &RustConnection, title: &str) -> Option<xproto::Window> {
    let tree = conn.query_tree(root(conn)).ok()?.reply().ok()?;
    tree.children.into_iter().find(|&w| {
        conn.get_property(
            false,
            w,
            xproto::AtomEnum::WM_NAME,
            xproto::AtomEnum::STRING,
            0,
            256,
        )
        .ok()
        .and_then(|c| c.reply().ok())
        .is_some_and(|p| p.value == title.as_bytes())
    })
}

/// What passed between source and sink.
#[derive(Debug, Default, Clone)]
struct Tap {
    frames: u64,
    bytes: u64,
    rects: u64,
    keyframes: u64,
    first: Option<Instant>,
    last: Option<Instant>,
}

/// A source → (tap) → sink pipeline on its own runtime.
struct Pipeline {
    rt: tokio::runtime::Runtime,
    source: Option<ndd_endpoint::SourceTask>,
    sink: Option<ndd_endpoint::SinkTask>,
    stop: Option<oneshot::Sender<()>>,
    tap: Arc<Mutex<Tap>>,
}

impl Pipeline {
    fn start(source: SourceConfig, sink: SinkConfig) -> Pipeline {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let tap = Arc::new(Mutex::new(Tap::default()));
        let (stop, stopped) = oneshot::channel::<()>();
        let (source, sink) = rt.block_on(async {
            let (tx, mut mid) = mpsc::channel::<Frame>(8);
            let (fwd, rx) = mpsc::channel::<Frame>(8);
            let source = source.spawn(3, tx).expect("source");
            let sink = sink.spawn(rx).expect("sink");
            let t = tap.clone();
            tokio::spawn(async move {
                let mut stopped = stopped;
                loop {
                    let f = tokio::select! {
                        f = mid.recv() => f,
                        _ = &mut stopped => None,
                    };
                    let Some(f) = f else { break };
                    {
                        let mut t = t.lock().unwrap();
                        let now = Instant::now();
                        t.first.get_or_insert(now);
                        t.last = Some(now);
                        t.frames += 1;
                        t.bytes += f.len() as u64;
                        if let Ok(u) = Update::parse(f.payload()) {
                            t.rects += u.rects.len() as u64;
                            if u.header.flags & FLAG_KEYFRAME != 0 {
                                t.keyframes += 1;
                            }
                        }
                    }
                    if fwd.send(f).await.is_err() {
                        break;
                    }
                }
            });
            (source, sink)
        });
        Pipeline {
            rt,
            source: Some(source),
            sink: Some(sink),
            stop: Some(stop),
            tap,
        }
    }

    fn tap(&self) -> Tap {
        self.tap.lock().unwrap().clone()
    }

    /// Stops the stream (the source sees its receiver gone, the sink its sender) and returns
    /// both reports.
    fn finish(&mut self) -> (SourceReport, SinkReport) {
        let _ = self.stop.take().unwrap().send(());
        let source = self.source.take().unwrap();
        let sink = self.sink.take().unwrap();
        let (a, b) = self.rt.block_on(async {
            let a = tokio::time::timeout(Duration::from_secs(10), source).await;
            let b = tokio::time::timeout(Duration::from_secs(10), sink).await;
            (a, b)
        });
        let a = a
            .expect("source stops within 10 s")
            .unwrap()
            .expect("source report");
        let b = b
            .expect("sink stops within 10 s")
            .unwrap()
            .expect("sink report");
        (a, b)
    }
}

fn screen_source(display: &str) -> SourceConfig {
    SourceConfig::X11Screen(X11ScreenConfig {
        display: display.to_string(),
        max_fps: 60.0,
        refresh_s: 0.0,
    })
}

fn window_sink(display: &str, title: &str) -> SinkConfig {
    SinkConfig::X11Window(X11WindowConfig {
        display: display.to_string(),
        title: title.to_string(),
        ..X11WindowConfig::default()
    })
}

/// Waits (up to 30 s) until the viewer shows exactly the app's screen; returns how long it
/// took. Panics with the number of differing pixels otherwise.
fn wait_identical(
    app: &RustConnection,
    viewer_conn: &RustConnection,
    viewer: u32,
    (w, h): (u16, u16),
) -> Duration {
    let t0 = Instant::now();
    let mut diff = usize::MAX;
    while t0.elapsed() < Duration::from_secs(30) {
        let want = grab(app, root(app), w, h);
        let got = grab(viewer_conn, viewer, w, h);
        if let (Some(want), Some(got)) = (want, got) {
            diff = differing(&want, &got);
            if diff == 0 {
                return t0.elapsed();
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!(
        "viewer differs from the app's screen in {diff} of {} pixels",
        u32::from(w) * u32::from(h)
    );
}

/// Waits until `area` of the app's screen shows its programs (at least `min_px` pixels
/// differ from the background `bg`, as B, G, R) and has not changed for half a second.
fn wait_settled(app: &RustConnection, area: (i16, i16, u16, u16), bg: [u8; 3], min_px: usize) {
    let (x, y, w, h) = area;
    let shot = || {
        app.get_image(xproto::ImageFormat::Z_PIXMAP, root(app), x, y, w, h, !0)
            .unwrap()
            .reply()
            .unwrap()
            .data
    };
    let t0 = Instant::now();
    let mut prev: Option<(Vec<u8>, Instant)> = None;
    loop {
        let img = shot();
        let drawn = img.chunks(4).filter(|p| p[..3] != bg).count();
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the app's programs did not draw and settle ({drawn} pixels drawn)"
        );
        match &prev {
            Some((p, since)) if *p == img && drawn >= min_px => {
                if since.elapsed() >= Duration::from_millis(500) {
                    return;
                }
            }
            _ => prev = Some((img, Instant::now())),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The app display with settled content: a background colour, `xlogo`, an `xterm` with text.
fn desktop(app: &Xvfb) -> Vec<Killed> {
    app.call("xsetroot", &["-solid", "#204060"]);
    vec![
        app.run("xlogo", &["-geometry", "200x150+400+300"]),
        app.run(
            "xterm",
            &[
                "-geometry",
                "50x8+10+10",
                "-e",
                "sh",
                "-c",
                "printf 'ndd display test\\nline two\\n'; sleep 600",
            ],
        ),
    ]
}

fn show_screen_in_a_window(label: &str) {
    if let Some(m) = missing(&["Xvfb", "xsetroot", "xlogo", "xterm", "xclock"]) {
        println!("SKIPPED: display test needs {m} ({APT})");
        return;
    }
    let app = xvfb("640x480x24");
    let dev = xvfb("800x600x24");
    let _programs = desktop(&app);
    let title = format!("ndd display test {label}");
    let mut p = Pipeline::start(
        screen_source(&app.display),
        window_sink(&dev.display, &title),
    );
    let a = app.connect();
    let d = dev.connect();
    let mut viewer = None;
    wait_for("the viewer window", Duration::from_secs(20), || {
        viewer = window_named(&d, &title);
        viewer.is_some()
    });
    let viewer = viewer.unwrap();
    // xlogo (200x150) and xterm have drawn, and nothing moves any more.
    wait_settled(&a, (0, 0, 640, 480), [0x60, 0x40, 0x20], 30_000);
    let t = wait_identical(&a, &d, viewer, (640, 480));
    println!(
        "display ({label}): viewer identical to the app's 640x480 screen {:.2} s after it settled: 0 differing pixels",
        t.as_secs_f64()
    );
    // Another window covers part of the viewer, then goes: the sink redraws the exposed part
    // from its image (Expose), without needing a new frame.
    let frames_before = p.tap().frames;
    {
        let _cover = dev.run("xlogo", &["-geometry", "200x150+100+100"]);
        wait_for(
            "a window over the viewer",
            Duration::from_secs(20),
            || match (grab(&a, root(&a), 640, 480), grab(&d, viewer, 640, 480)) {
                (Some(want), Some(got)) => differing(&want, &got) > 10_000,
                _ => false,
            },
        );
    }
    let t = wait_identical(&a, &d, viewer, (640, 480));
    println!(
        "display ({label}): exposed part redrawn {:.2} s after the covering window went ({} frames meanwhile)",
        t.as_secs_f64(),
        p.tap().frames - frames_before
    );
    // The content changes: a new background, a new program.
    app.call("xsetroot", &["-solid", "#a03010"]);
    let _clock = app.run("xclock", &["-geometry", "120x120+300+50", "-update", "1"]);
    wait_for(
        "xclock on the app's screen",
        Duration::from_secs(30),
        || {
            grab_at(&a, (300, 50, 120, 120))
                .chunks(4)
                .filter(|p| p[..3] != [0x10, 0x30, 0xa0])
                .count()
                > 5000
        },
    );
    let t = wait_identical(&a, &d, viewer, (640, 480));
    let corner = grab(&d, viewer, 1, 1).unwrap();
    assert_eq!(
        &corner[..3],
        &[0x10, 0x30, 0xa0],
        "new background in the viewer"
    );
    println!(
        "display ({label}): caught up with a new background and xclock after {:.2} s",
        t.as_secs_f64()
    );
    let tap = p.tap();
    assert!(tap.keyframes >= 1, "{tap:?}");
    let (src, sink) = p.finish();
    assert_eq!(src.frames, sink.frames);
    assert!(sink.frames >= 2, "{sink:?}");
}

#[test]
fn x11_screen_to_x11_window_shows_the_same_pixels() {
    show_screen_in_a_window("shm");
}

/// The same with MIT-SHM turned off (`NDD_X11_NO_SHM=1`): plain GetImage / PutImage. The
/// variable is process-wide, so the test runs in a child process of this test binary.
#[test]
fn without_mit_shm_the_pixels_are_the_same() {
    if std::env::var_os("NDD_DISPLAY_TEST_CHILD").is_some() {
        return;
    }
    if let Some(m) = missing(&["Xvfb", "xsetroot", "xlogo", "xterm", "xclock"]) {
        println!("SKIPPED: display test needs {m} ({APT})");
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "no_shm_child",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("NDD_DISPLAY_TEST_CHILD", "1")
        .env("NDD_X11_NO_SHM", "1")
        .output()
        .expect("run the child test");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child test failed:\n{text}");
    assert!(text.contains("0 differing pixels"), "{text}");
    assert!(
        text.contains("paths: capture=GetImage draw=PutImage"),
        "{text}"
    );
    for line in text
        .lines()
        .filter_map(|l| l.find("display (no-shm)").map(|i| &l[i..]))
    {
        println!("{line}");
    }
}

/// Runs only as the child of `without_mit_shm_the_pixels_are_the_same`.
#[test]
fn no_shm_child() {
    if std::env::var_os("NDD_DISPLAY_TEST_CHILD").is_none() {
        return;
    }
    let log = capture_logs();
    show_screen_in_a_window("no-shm");
    let log = log.lock().unwrap().join("\n");
    let field = |key: &str| {
        log.lines()
            .find_map(|l| {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix(&format!("{key}=")))
            })
            .unwrap_or("?")
            .trim_matches('"')
            .to_string()
    };
    println!("paths: capture={} draw={}", field("capture"), field("draw"));
}

/// Installs a global tracing subscriber that keeps every event's fields as `key=value` text.
fn capture_logs() -> Arc<Mutex<Vec<String>>> {
    use tracing::field::{Field, Visit};
    struct Fields(String);
    impl Visit for Fields {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            self.0 += &format!(" {}={:?}", field.name(), value);
        }
        fn record_str(&mut self, field: &Field, value: &str) {
            self.0 += &format!(" {}={}", field.name(), value);
        }
    }
    struct Capture(Arc<Mutex<Vec<String>>>);
    impl tracing::Subscriber for Capture {
        fn enabled(&self, m: &tracing::Metadata<'_>) -> bool {
            *m.level() <= tracing::Level::INFO
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, e: &tracing::Event<'_>) {
            let mut f = Fields(String::new());
            e.record(&mut f);
            self.0.lock().unwrap().push(f.0);
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }
    let log = Arc::new(Mutex::new(Vec::new()));
    tracing::subscriber::set_global_default(Capture(log.clone())).expect("one subscriber");
    log
}

#[test]
fn frame_rate_of_an_animation() {
    if let Some(m) = missing(&["Xvfb", "xsetroot"]) {
        println!("SKIPPED: display frame-rate test needs {m} ({APT})");
        return;
    }
    let app = xvfb("640x480x24");
    let dev = xvfb("640x480x24");
    app.call("xsetroot", &["-solid", "#000000"]);
    let (what, _anim) = if have("ffplay") {
        (
            "ffplay testsrc 320x240 at 30 fps",
            app.run(
                "ffplay",
                &[
                    "-loglevel",
                    "quiet",
                    "-an",
                    "-noborder",
                    "-left",
                    "0",
                    "-top",
                    "0",
                    "-f",
                    "lavfi",
                    "-i",
                    "testsrc=size=320x240:rate=30",
                ],
            ),
        )
    } else if have("xclock") {
        ("xclock -update 1", app.run("xclock", &["-update", "1"]))
    } else {
        println!("SKIPPED: display frame-rate test needs ffplay or xclock ({APT})");
        return;
    };
    let mut p = Pipeline::start(
        screen_source(&app.display),
        window_sink(&dev.display, "ndd display fps"),
    );
    // Wait for the animation to be running (frames beyond the first keyframe), then measure.
    wait_for("the first updates", Duration::from_secs(30), || {
        p.tap().frames >= 3
    });
    let before = p.tap();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    let after = p.tap();
    let secs = t0.elapsed().as_secs_f64();
    let frames = after.frames - before.frames;
    let bytes = after.bytes - before.bytes;
    let rects = after.rects - before.rects;
    println!(
        "display: {what}: {frames} frames in {secs:.2} s = {:.1} fps, {:.2} MB/s, mean {:.1} rects/frame, {:.0} KB/frame (raw)",
        frames as f64 / secs,
        bytes as f64 / secs / 1e6,
        rects as f64 / frames.max(1) as f64,
        bytes as f64 / frames.max(1) as f64 / 1e3
    );
    assert!(frames >= 2, "{after:?}");
    let (src, sink) = p.finish();
    assert_eq!(src.frames, sink.frames);
}

#[test]
fn framebuffer_sink_file_equals_the_app_screen() {
    if let Some(m) = missing(&["Xvfb", "xsetroot", "xlogo", "xterm"]) {
        println!("SKIPPED: framebuffer test needs {m} ({APT})");
        return;
    }
    let app = xvfb("640x480x24");
    let _programs = desktop(&app);
    let path = std::env::temp_dir().join(format!("ndd-fb-{}.raw", std::process::id()));
    std::fs::write(&path, b"old contents").unwrap();
    let mut p = Pipeline::start(
        screen_source(&app.display),
        SinkConfig::Framebuffer(FramebufferConfig { path: path.clone() }),
    );
    let a = app.connect();
    wait_settled(&a, (0, 0, 640, 480), [0x60, 0x40, 0x20], 30_000);
    let t0 = Instant::now();
    let mut diff = usize::MAX;
    while t0.elapsed() < Duration::from_secs(30) {
        let want = grab(&a, root(&a), 640, 480).unwrap();
        let got = std::fs::read(&path).unwrap();
        diff = differing(&want, &got);
        if diff == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        diff, 0,
        "framebuffer file differs from the screen in {diff} pixels"
    );
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 640 * 480 * 4);
    println!(
        "display: framebuffer file identical to the app's screen {:.2} s after it settled",
        t0.elapsed().as_secs_f64()
    );
    p.finish();
    std::fs::remove_file(&path).unwrap();
}

/// HiDPI on X11: a viewer display whose resources say `Xft.dpi: 192` (as a desktop sets it for
/// a HiDPI screen) shows the app's screen at twice its size, scaled, so its text is as large
/// as the person's own; `scale = 1` keeps it at its own size.
#[test]
fn a_hidpi_viewer_display_shows_the_screen_at_its_scale() {
    if let Some(m) = missing(&["Xvfb", "xsetroot", "xrdb"]) {
        println!("SKIPPED: needs {m} ({APT})");
        return;
    }
    let app = xvfb("320x240x24");
    let dev = xvfb("1024x768x24");
    app.call("xsetroot", &["-solid", "#336699"]);
    let dpi = std::env::temp_dir().join(format!("ndd-hidpi-{}.xrdb", std::process::id()));
    std::fs::write(&dpi, "Xft.dpi: 192\n").unwrap();
    dev.call("xrdb", &["-merge", dpi.to_str().unwrap()]);
    let _ = std::fs::remove_file(&dpi);
    let d = dev.connect();
    let size_of = |title: &str| {
        window_named(&d, title)
            .and_then(|w| d.get_geometry(w).ok()?.reply().ok())
            .map(|g| (g.width, g.height))
    };
    let p = Pipeline::start(
        screen_source(&app.display),
        window_sink(&dev.display, "hidpi auto"),
    );
    wait_for(
        "the window at twice the screen",
        Duration::from_secs(20),
        || size_of("hidpi auto") == Some((640, 480)),
    );
    drop(p);
    let one = SinkConfig::X11Window(X11WindowConfig {
        display: dev.display.clone(),
        title: "hidpi 1x".into(),
        scale: ndd_endpoint::display::ViewScale::Hundredths(100),
        ..X11WindowConfig::default()
    });
    let _p = Pipeline::start(screen_source(&app.display), one);
    wait_for(
        "the window at the screen's own size",
        Duration::from_secs(20),
        || size_of("hidpi 1x") == Some((320, 240)),
    );
}

#[test]
fn the_viewer_window_is_an_input_source() {
    if let Some(m) = missing(&["Xvfb", "xsetroot", "xdotool"]) {
        println!("SKIPPED: viewer input test needs {m} ({APT})");
        return;
    }
    // The app's screen is larger than the viewer's first size: the viewer grows, and the
    // input source announces the new ranges.
    let app = xvfb("800x600x24");
    let dev = xvfb("1024x768x24");
    app.call("xsetroot", &["-solid", "#336699"]);
    let title = "ndd viewer input test";
    let mut p = Pipeline::start(
        screen_source(&app.display),
        window_sink(&dev.display, title),
    );
    let (tx, mut rx) = mpsc::channel::<Frame>(64);
    let input = {
        let _rt = p.rt.enter();
        SourceConfig::X11Input(X11InputConfig {
            display: dev.display.clone(),
            window: X11Window::Viewer,
        })
        .spawn(4, tx)
        .expect("x11-input source")
    };
    let d = dev.connect();
    let mut viewer = None;
    wait_for("the viewer window", Duration::from_secs(20), || {
        viewer = window_named(&d, title);
        viewer.is_some()
    });
    let viewer = viewer.unwrap();
    wait_for(
        "the viewer at the app's size",
        Duration::from_secs(30),
        || {
            d.get_geometry(viewer)
                .ok()
                .and_then(|c| c.reply().ok())
                .is_some_and(|g| (g.width, g.height) == (800, 600))
        },
    );
    let mut msgs: Vec<InputMessage> = Vec::new();
    let mut recv = |msgs: &mut Vec<InputMessage>, until: &dyn Fn(&[InputMessage]) -> bool| {
        let t0 = Instant::now();
        while !until(msgs) {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "timed out; got {msgs:?}"
            );
            match rx.try_recv() {
                Ok(f) => msgs.push(InputMessage::parse(f.payload()).expect("input record")),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    };
    let caps_800 = |m: &[InputMessage]| {
        m.iter().any(|m| {
            matches!(m, InputMessage::Capabilities(c)
                if c.abs_axis(ABS_X).map(|a| a.max) == Some(799)
                    && c.abs_axis(ABS_Y).map(|a| a.max) == Some(599))
        })
    };
    recv(&mut msgs, &caps_800);

    let status = Command::new("xdotool")
        .env("DISPLAY", &dev.display)
        .args(["mousemove", "--window", &viewer.to_string(), "100", "120"])
        .args(["click", "1", "key", "a"])
        .status()
        .expect("xdotool");
    assert!(status.success());
    let events = |m: &[InputMessage]| -> Vec<(u16, u16, i32)> {
        m.iter()
            .flat_map(|m| match m {
                InputMessage::Events(e) => e.clone(),
                _ => vec![],
            })
            .map(|e| (e.ty, e.code, e.value))
            .collect()
    };
    recv(&mut msgs, &|m| events(m).contains(&(EV_KEY, KEY_A, 0)));
    let ev = events(&msgs);
    let pos = ev
        .iter()
        .position(|&e| e == (EV_ABS, ABS_X, 100))
        .expect("motion to x=100 in window coordinates");
    assert_eq!(ev[pos + 1], (EV_ABS, ABS_Y, 120), "{ev:?}");
    let keys: Vec<(u16, u16, i32)> = ev.iter().copied().filter(|e| e.0 == EV_KEY).collect();
    assert_eq!(
        keys,
        vec![
            (EV_KEY, BTN_LEFT, 1),
            (EV_KEY, BTN_LEFT, 0),
            (EV_KEY, KEY_A, 1),
            (EV_KEY, KEY_A, 0)
        ]
    );
    println!(
        "display: viewer window input: {} records, clicks and keys in window coordinates",
        msgs.len()
    );

    // The display stream ends: the viewer window goes, and the input source ends with it.
    p.finish();
    let r = p.rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(10), input)
            .await
            .expect("the input source stops when the viewer goes")
            .unwrap()
    });
    let r = r.expect("input source report");
    let mut rest = 0;
    while rx.try_recv().is_ok() {
        rest += 1;
    }
    assert_eq!(r.frames as usize, msgs.len() + rest);
}

#[test]
fn viewer_input_without_a_viewer_is_a_clear_error() {
    if let Some(m) = missing(&["Xvfb"]) {
        println!("SKIPPED: viewer error test needs {m} ({APT})");
        return;
    }
    let dev = xvfb("320x240x24");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (tx, _rx) = mpsc::channel::<Frame>(4);
    let task = {
        let _rt = rt.enter();
        SourceConfig::X11Input(X11InputConfig {
            display: dev.display.clone(),
            window: X11Window::Viewer,
        })
        .spawn(0, tx)
        .unwrap()
    };
    let e = rt.block_on(task).unwrap().unwrap_err().to_string();
    assert!(
        e.starts_with(&format!(
            "x11-input source: no x11-window sink showed a viewer window on X display {} within 10 s",
            dev.display
        )),
        "{e}"
    );
}

#[test]
fn bad_records_do_not_stop_the_display_sinks() {
    if let Some(m) = missing(&["Xvfb"]) {
        println!("SKIPPED: bad-record test needs {m} ({APT})");
        return;
    }
    let dev = xvfb("320x240x24");
    let path = std::env::temp_dir().join(format!("ndd-fb-bad-{}.raw", std::process::id()));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    // A valid 4x2 update: one red 2x1 rect at (1,1).
    let good = ndd_endpoint::display::Update {
        header: ndd_endpoint::display::UpdateHeader {
            width: 4,
            height: 2,
            format: ndd_endpoint::PixelFormat::Bgrx32,
            flags: 0,
        },
        rects: vec![ndd_endpoint::display::RectPixels {
            rect: ndd_endpoint::Rect::new(1, 1, 2, 1),
            encoding: ndd_endpoint::display::Encoding::Raw,
            pixels: &[0, 0, 0xff, 0, 0, 0, 0xff, 0],
        }],
    }
    .emit()
    .unwrap();
    let garbage: Vec<Vec<u8>> = vec![
        vec![],
        vec![1],
        vec![2, 0, 1, 2, 3],
        vec![1, 0, 0, 4, 0, 2, 0, 0, 0, 1, 0, 3, 0, 0, 0, 9, 0, 1, 0],
        good[..good.len() - 1].to_vec(),
        (0..1000u32).map(|i| (i * 7919 % 251) as u8).collect(),
    ];
    let frames = |garbage: &[Vec<u8>]| -> Vec<Frame> {
        garbage
            .iter()
            .chain(std::iter::once(&good))
            .enumerate()
            .map(|(i, p)| {
                Frame::new(
                    ndd_core::Meta {
                        seq: i as u64,
                        ..Default::default()
                    },
                    p,
                )
            })
            .collect()
    };
    let title = "ndd bad records";
    for sink in [
        window_sink(&dev.display, title),
        SinkConfig::Framebuffer(FramebufferConfig { path: path.clone() }),
    ] {
        let (tx, rx) = mpsc::channel::<Frame>(16);
        let task = {
            let _rt = rt.enter();
            sink.spawn(rx).expect("sink")
        };
        for f in frames(&garbage) {
            tx.blocking_send(f).unwrap();
        }
        if matches!(sink, SinkConfig::X11Window(_)) {
            let d = dev.connect();
            let mut viewer = None;
            wait_for("the viewer window", Duration::from_secs(20), || {
                viewer = window_named(&d, title);
                viewer.is_some()
            });
            let viewer = viewer.unwrap();
            wait_for("the good update drawn", Duration::from_secs(20), || {
                grab(&d, viewer, 4, 2)
                    .is_some_and(|p| p[20..23] == [0, 0, 0xff] && p[0..3] == [0, 0, 0])
            });
        }
        drop(tx);
        let r = rt.block_on(task).unwrap().expect("the sink keeps going");
        assert_eq!(r.frames, garbage.len() as u64 + 1);
        if matches!(sink, SinkConfig::Framebuffer(_)) {
            let got = std::fs::read(&path).unwrap();
            let mut want = vec![0u8; 4 * 2 * 4];
            want[20..28].copy_from_slice(&[0, 0, 0xff, 0, 0, 0, 0xff, 0]);
            assert_eq!(got, want);
        }
    }
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn unsupported_screens_and_unreachable_displays_fail_at_spawn() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _rt = rt.enter();
    let (tx, _rx) = mpsc::channel(1);
    let e = screen_source(":987").spawn(0, tx).unwrap_err().to_string();
    assert!(
        e.starts_with("x11-screen source: cannot connect to X display :987"),
        "{e}"
    );
    let (_tx, rx) = mpsc::channel(1);
    let e = window_sink(":987", "x").spawn(rx).unwrap_err().to_string();
    assert!(
        e.starts_with("x11-window sink: cannot connect to X display :987"),
        "{e}"
    );
    let (_tx, rx) = mpsc::channel(1);
    let e = SinkConfig::Framebuffer(FramebufferConfig {
        path: "/dev/null".into(),
    })
    .spawn(rx)
    .unwrap_err()
    .to_string();
    assert!(e.contains("not a framebuffer (major 29)"), "{e}");
    if missing(&["Xvfb"]).is_some() {
        println!("SKIPPED: depth-16 check needs Xvfb ({APT})");
        return;
    }
    let x = xvfb("320x240x16");
    let (tx, _rx) = mpsc::channel(1);
    let e = screen_source(&x.display)
        .spawn(0, tx)
        .unwrap_err()
        .to_string();
    assert!(e.contains("depth 16 (16 bits per pixel"), "{e}");
    assert!(e.contains("only 24- or 32-bit TrueColor"), "{e}");
}

/// While the link is down the viewer window is dimmed and its title says so; when frames
/// flow again the image and the title are as they were.
#[test]
fn the_viewer_dims_and_names_a_lost_link() {
    use ndd_endpoint::display::LinkState;
    if let Some(m) = missing(&["Xvfb"]) {
        println!("SKIPPED: link-state test needs {m} ({APT})");
        return;
    }
    let dev = xvfb("320x240x24");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    // A 4x2 screen, all of it grey 0xc8.
    let grey = [0xc8u8; 4 * 2 * 4];
    let update = ndd_endpoint::display::Update {
        header: ndd_endpoint::display::UpdateHeader {
            width: 4,
            height: 2,
            format: ndd_endpoint::PixelFormat::Bgrx32,
            flags: FLAG_KEYFRAME,
        },
        rects: vec![ndd_endpoint::display::RectPixels {
            rect: ndd_endpoint::Rect::new(0, 0, 4, 2),
            encoding: ndd_endpoint::display::Encoding::Raw,
            pixels: &grey,
        }],
    }
    .emit()
    .unwrap();
    let frame = |seq: u64, p: &[u8]| {
        Frame::new(
            ndd_core::Meta {
                seq,
                ..Default::default()
            },
            p,
        )
    };
    let title = "ndd link state";
    let (tx, rx) = mpsc::channel::<Frame>(16);
    let task = {
        let _rt = rt.enter();
        window_sink(&dev.display, title).spawn(rx).expect("sink")
    };
    tx.blocking_send(frame(0, &update)).unwrap();
    let d = dev.connect();
    let mut viewer = None;
    wait_for("the viewer window", Duration::from_secs(20), || {
        viewer = window_named(&d, title);
        viewer.is_some()
    });
    let viewer = viewer.unwrap();
    let d = &d;
    let shows = |v: u8| {
        move || grab(d, viewer, 4, 2).is_some_and(|p| p.chunks(4).all(|px| px[..3] == [v; 3]))
    };
    wait_for("the grey screen", Duration::from_secs(20), shows(0xc8));
    tx.blocking_send(frame(u64::MAX, &LinkState::Down.payload()))
        .unwrap();
    wait_for("the dimmed screen", Duration::from_secs(20), shows(0x64));
    let down = format!("{title} (link down, reconnecting)");
    wait_for(
        "the title naming the lost link",
        Duration::from_secs(20),
        || window_named(d, &down) == Some(viewer),
    );
    tx.blocking_send(frame(u64::MAX, &LinkState::Up.payload()))
        .unwrap();
    wait_for("the screen as it was", Duration::from_secs(20), shows(0xc8));
    wait_for("the title as it was", Duration::from_secs(20), || {
        window_named(d, title) == Some(viewer)
    });
    // Down again, then an update: the image as it was with the update on top.
    tx.blocking_send(frame(u64::MAX, &LinkState::PeerStopped.payload()))
        .unwrap();
    wait_for("dimmed again", Duration::from_secs(20), shows(0x64));
    tx.blocking_send(frame(1, &update)).unwrap();
    wait_for(
        "undimmed by the next update",
        Duration::from_secs(20),
        shows(0xc8),
    );
    drop(tx);
    let r = rt.block_on(task).unwrap().expect("the sink ends cleanly");
    assert_eq!(r.frames, 2, "link-state records are not frames");
}

/// A capture in several updates (`FLAG_MORE` on all but the last, as the source cuts a screen
/// over 4 MiB) is drawn once whole, in one request (issue 33, item 2): nothing of it shows
/// before its last update, and DAMAGE on the viewer's server sees the whole update as one
/// group of rectangles (the X server reports each request's damage as one run of events, all
/// but the last flagged "more"), not one per rect.
#[test]
fn a_capture_in_several_updates_is_drawn_whole_in_one_request() {
    use x11rb::protocol::damage::{self, ConnectionExt as _};
    use x11rb::protocol::Event;
    if let Some(m) = missing(&["Xvfb"]) {
        println!("SKIPPED: whole-update test needs {m} ({APT})");
        return;
    }
    let dev = xvfb("320x240x24");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (w, h) = (64u16, 48u16);
    let red = [0u8, 0, 0xff, 0];
    let update = |flags: u8, rects: &[(u16, u16, u16, u16)], px: &[u8; 4]| {
        let pixels: Vec<Vec<u8>> = rects
            .iter()
            .map(|r| px.repeat(usize::from(r.2) * usize::from(r.3)))
            .collect();
        ndd_endpoint::display::Update {
            header: ndd_endpoint::display::UpdateHeader {
                width: w,
                height: h,
                format: ndd_endpoint::PixelFormat::Bgrx32,
                flags,
            },
            rects: rects
                .iter()
                .zip(&pixels)
                .map(|(r, p)| ndd_endpoint::display::RectPixels {
                    rect: ndd_endpoint::Rect::new(r.0, r.1, r.2, r.3),
                    encoding: ndd_endpoint::display::Encoding::Raw,
                    pixels: p,
                })
                .collect(),
        }
        .emit()
        .unwrap()
    };
    let frame = |seq: u64, p: Vec<u8>| {
        Frame::new(
            ndd_core::Meta {
                seq,
                ..Default::default()
            },
            &p,
        )
    };
    let title = "ndd whole updates";
    let (tx, rx) = mpsc::channel::<Frame>(16);
    let task = {
        let _rt = rt.enter();
        window_sink(&dev.display, title).spawn(rx).expect("sink")
    };
    // The screen, blue, first: the window at its size. (Blue, not black: a new window is
    // black before the sink drew anything.)
    tx.blocking_send(frame(0, update(0, &[(0, 0, w, h)], &[0xff, 0, 0, 0])))
        .unwrap();
    let d = dev.connect();
    let mut viewer = None;
    wait_for("the viewer window", Duration::from_secs(20), || {
        viewer = window_named(&d, title);
        viewer.is_some()
    });
    let viewer = viewer.unwrap();
    wait_for("the blue screen drawn", Duration::from_secs(20), || {
        grab(&d, viewer, w, h).is_some_and(|p| p.chunks(4).all(|x| x[..3] == [0xff, 0, 0]))
    });
    // Then black, as the checks below expect.
    tx.blocking_send(frame(4, update(0, &[(0, 0, w, h)], &[0, 0, 0, 0])))
        .unwrap();
    wait_for("the black screen drawn", Duration::from_secs(20), || {
        grab(&d, viewer, w, h).is_some_and(|p| p.iter().all(|b| *b == 0))
    });
    // The window's first Expose (at its mapping) is behind us.
    std::thread::sleep(Duration::from_millis(200));
    d.damage_query_version(1, 1).unwrap().reply().unwrap();
    let dmg = d.generate_id().unwrap();
    d.damage_create(dmg, viewer, damage::ReportLevel::DELTA_RECTANGLES)
        .unwrap();
    // A new Damage holds the whole window (reported once): emptied, so the draws that follow
    // are reported as they come.
    d.damage_subtract(dmg, x11rb::NONE, x11rb::NONE).unwrap();
    d.get_input_focus().unwrap().reply().unwrap();
    while d.poll_for_event().unwrap().is_some() {}
    // Three parts of one capture: two bands with more to come, then the last.
    tx.blocking_send(frame(1, update(FLAG_MORE, &[(0, 0, 8, 8)], &red)))
        .unwrap();
    tx.blocking_send(frame(2, update(FLAG_MORE, &[(40, 10, 8, 8)], &red)))
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        grab(&d, viewer, w, h).is_some_and(|p| p.iter().all(|b| *b == 0)),
        "part of a capture was drawn before its last update"
    );
    tx.blocking_send(frame(3, update(0, &[(20, 30, 8, 8)], &red)))
        .unwrap();
    let at = |p: &[u8], x: usize, y: usize| p[(y * usize::from(w) + x) * 4..][..3].to_vec();
    wait_for("the whole capture drawn", Duration::from_secs(20), || {
        grab(&d, viewer, w, h).is_some_and(|p| {
            [(1, 1), (44, 14), (24, 34)]
                .iter()
                .all(|&(x, y)| at(&p, x, y) == [0, 0, 0xff])
                && at(&p, 30, 20) == [0, 0, 0]
        })
    });
    // Damage events of the draw: one run (one request).
    let mut runs = 0;
    let mut area = 0u32;
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        match d.poll_for_event().unwrap() {
            Some(Event::DamageNotify(e)) => {
                area += u32::from(e.area.width) * u32::from(e.area.height);
                if u8::from(e.level) & 0x80 == 0 {
                    runs += 1;
                }
            }
            Some(_) => {}
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    assert_eq!(runs, 1, "the capture took {runs} requests to draw");
    // The server reports the request's box (the rects' bounding box); the pixels between the
    // rects are untouched (checked above: the clip kept the draw to the rects).
    assert_eq!(area, 48 * 38, "one request over the rects' bounding box");
    drop(tx);
    let r = rt.block_on(task).unwrap().expect("sink report");
    assert_eq!(r.frames, 5);
}

/// A display update of a `w`×`h` screen: rect `r` filled by `px(x, y)` (bgrx).
fn update_of(w: u16, h: u16, r: (u16, u16, u16, u16), px: impl Fn(u16, u16) -> [u8; 4]) -> Vec<u8> {
    let mut pixels = Vec::new();
    for y in r.1..r.1 + r.3 {
        for x in r.0..r.0 + r.2 {
            pixels.extend_from_slice(&px(x, y));
        }
    }
    Update {
        header: ndd_endpoint::display::UpdateHeader {
            width: w,
            height: h,
            format: ndd_endpoint::PixelFormat::Bgrx32,
            flags: 0,
        },
        rects: vec![ndd_endpoint::display::RectPixels {
            rect: ndd_endpoint::Rect::new(r.0, r.1, r.2, r.3),
            encoding: ndd_endpoint::display::Encoding::Raw,
            pixels: &pixels,
        }],
    }
    .emit()
    .unwrap()
}

#[test]
fn a_screen_larger_than_the_viewers_is_scaled_to_fit_and_follows_a_resized_window() {
    if let Some(m) = missing(&["Xvfb"]) {
        println!("SKIPPED: scaling test needs {m} ({APT})");
        return;
    }
    let dev = xvfb("320x240x24");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    // The app's screen: 640×360, four quadrants (blue, green / red, white).
    let (w, h) = (640u16, 360u16);
    let quadrant = |x: u16, y: u16| match (x < w / 2, y < h / 2) {
        (true, true) => [0xff, 0, 0, 0],
        (false, true) => [0, 0xff, 0, 0],
        (true, false) => [0, 0, 0xff, 0],
        (false, false) => [0xff, 0xff, 0xff, 0],
    };
    let frame = |seq: u64, p: Vec<u8>| {
        Frame::new(
            ndd_core::Meta {
                seq,
                ..Default::default()
            },
            &p,
        )
    };
    let title = "ndd scaled viewer";
    let (tx, rx) = mpsc::channel::<Frame>(16);
    let task = {
        let _rt = rt.enter();
        window_sink(&dev.display, title).spawn(rx).expect("sink")
    };
    tx.blocking_send(frame(0, update_of(w, h, (0, 0, w, h), quadrant)))
        .unwrap();
    let d = dev.connect();
    let mut viewer = None;
    wait_for("the viewer window", Duration::from_secs(20), || {
        viewer = window_named(&d, title);
        viewer.is_some()
    });
    let viewer = viewer.unwrap();
    let size = |d: &RustConnection| {
        let g = d.get_geometry(viewer).unwrap().reply().unwrap();
        (g.width, g.height)
    };
    // Not cropped to the 320×240 screen: fitted into 95 % of it, 16:9 kept.
    wait_for(
        "the window fitted to the screen",
        Duration::from_secs(20),
        || size(&d) == (304, 171),
    );
    let at = |p: &[u8], ww: u16, x: u16, y: u16| {
        p[(usize::from(y) * usize::from(ww) + usize::from(x)) * 4..][..3].to_vec()
    };
    // Each quadrant where it belongs, at the window's size.
    let shows_quadrants = |d: &RustConnection, (ww, wh): (u16, u16)| {
        grab(d, viewer, ww, wh).is_some_and(|p| {
            at(&p, ww, ww / 4, wh / 4) == [0xff, 0, 0]
                && at(&p, ww, 3 * ww / 4, wh / 4) == [0, 0xff, 0]
                && at(&p, ww, ww / 4, 3 * wh / 4) == [0, 0, 0xff]
                && at(&p, ww, 3 * ww / 4, 3 * wh / 4) == [0xff, 0xff, 0xff]
        })
    };
    wait_for(
        "the screen scaled into the window",
        Duration::from_secs(20),
        || shows_quadrants(&d, (304, 171)),
    );
    // Someone (a window manager, the person) makes the window 200×100: the image follows.
    d.configure_window(
        viewer,
        &xproto::ConfigureWindowAux::new().width(200).height(100),
    )
    .unwrap();
    d.flush().unwrap();
    wait_for(
        "the screen scaled to the resized window",
        Duration::from_secs(20),
        || size(&d) == (200, 100) && shows_quadrants(&d, (200, 100)),
    );
    // An update of part of the screen lands where it belongs in the scaled window: the white
    // quadrant's middle turns black.
    tx.blocking_send(frame(
        1,
        update_of(w, h, (400, 220, 160, 100), |_, _| [0, 0, 0, 0]),
    ))
    .unwrap();
    wait_for("the update drawn scaled", Duration::from_secs(20), || {
        grab(&d, viewer, 200, 100).is_some_and(|p| {
            // Image (480, 270) → window (150, 75); the rest of the quadrant stays white.
            at(&p, 200, 150, 75) == [0, 0, 0] && at(&p, 200, 195, 95) == [0xff, 0xff, 0xff]
        })
    });
    // Back at the image's own size: drawn as it is, no scaling.
    d.configure_window(
        viewer,
        &xproto::ConfigureWindowAux::new()
            .width(u32::from(w))
            .height(u32::from(h)),
    )
    .unwrap();
    d.flush().unwrap();
    // (Only the part on the 320×240 screen can be read back.)
    wait_for(
        "the screen at its own size",
        Duration::from_secs(20),
        || {
            size(&d) == (w, h)
                && grab(&d, viewer, 320, 240).is_some_and(|p| {
                    at(&p, 320, 10, 10) == [0xff, 0, 0]
                        && at(&p, 320, 250, 200) == [0, 0, 0xff]
                        && at(&p, 320, 319, 179) == [0xff, 0, 0]
                })
        },
    );
    drop(tx);
    let r = rt.block_on(task).unwrap().expect("sink report");
    assert_eq!(r.frames, 2);
}

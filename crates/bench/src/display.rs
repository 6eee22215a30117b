//! `ndd bench display`: the display stream (`x11-screen` source → channel → `x11-window`
//! sink on a second Xvfb) with `ffplay` playing a test pattern on the app display, next to
//! what the X server itself can hand over (full-screen ShmGetImage and GetImage in a tight
//! loop) and memcpy of the same frame, all measured in the same run; then the same video on a
//! headless sway captured by the `wayland-screen` source (wlr-screencopy; and on the newer
//! root's sway 1.12 through ext-image-copy-capture and wlr-screencopy in turn), with what each
//! capture costs ndd's process per update. Also the bytes a `compress` pair would put on the
//! wire for this content.

use super::pairs::parse_case;
use super::{hardware, today};
use anyhow::{bail, Context, Result};
use ndd_core::{Frame, Meta, Pair, Role, Stack};
use ndd_endpoint::clock::now_ns;
use ndd_endpoint::display::{Update, FLAG_KEYFRAME};
use ndd_endpoint::{
    GnomeScreenConfig, SinkConfig, SourceConfig, WaylandProtocol, WaylandScreenConfig,
    X11ScreenConfig, X11WindowConfig,
};
use ndd_procs::{have, Killed, Mutter, Sway, Xvfb};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use x11rb::connection::{Connection, RequestConnection as _};
use x11rb::protocol::shm::ConnectionExt as _;
use x11rb::protocol::xproto::{self, ConnectionExt as _};
use x11rb::rust_connection::RustConnection;

const SKIPPED: &str = "bench display: SKIPPED: needs Xvfb and ffplay (apt-get install xvfb ffmpeg)";

/// Frames per second ffplay is asked to play: a usual video rate, and more than the stream
/// or ffplay can deliver (whatever paces first shows).
const RATES: [u32; 2] = [60, 240];

/// `max_fps` of the source: high enough not to limit.
const MAX_FPS: f64 = 240.0;

/// An Xvfb of `w`×`h` at depth 24.
fn xvfb(w: u32, h: u32) -> Result<Xvfb> {
    Xvfb::start(&format!("{w}x{h}x24")).context("cannot start Xvfb")
}

/// Which kind of app screen a row captures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Server {
    X11,
    Sway,
    /// The newer root's sway 1.12 (`ndd_procs::newer_wayland_root`), captured with this
    /// protocol.
    NewerSway(WaylandProtocol),
    Gnome,
}

impl Server {
    fn label(self) -> &'static str {
        match self {
            Server::X11 => "X11",
            Server::Sway => "Wayland",
            Server::NewerSway(WaylandProtocol::Wlr) => "Wayland 1.12 wlr",
            Server::NewerSway(_) => "Wayland 1.12 ext",
            Server::Gnome => "GNOME",
        }
    }
}

/// The app screen: an Xvfb, a headless sway (wlroots, the pixman renderer), or a headless
/// mutter (GNOME's compositor, software rendering).
enum AppScreen {
    X11(Xvfb),
    Wayland(Sway, Server),
    Gnome(Mutter),
}

impl AppScreen {
    fn start(server: Server, w: u32, h: u32) -> Result<AppScreen> {
        Ok(match server {
            Server::Sway => AppScreen::Wayland(
                Sway::start(&format!("bench-{w}x{h}"), w, h, "#000000")
                    .context("cannot start a headless sway")?,
                server,
            ),
            Server::NewerSway(_) => AppScreen::Wayland(
                Sway::start_newer(&format!("bench-new-{w}x{h}"), w, h, "#000000", "")
                    .context("cannot start the newer root's sway")?,
                server,
            ),
            Server::Gnome => AppScreen::Gnome(
                Mutter::start(&format!("bench-{w}x{h}"), w, h)
                    .context("cannot start a headless mutter")?,
            ),
            Server::X11 => AppScreen::X11(xvfb(w, h)?),
        })
    }

    /// `ffplay` playing `testsrc` over the whole screen, until dropped: borderless at the
    /// top left of the Xvfb, full screen on sway (SDL's Wayland driver).
    fn play(&self, w: u32, h: u32, rate: u32) -> Result<Killed> {
        let src = format!("testsrc=size={w}x{h}:rate={rate}");
        let common = ["-loglevel", "quiet", "-an", "-f", "lavfi", "-i", &src];
        let mut cmd = match self {
            AppScreen::X11(x) => {
                let mut args = vec!["-noborder", "-left", "0", "-top", "0"];
                args.extend(common);
                return x.spawn("ffplay", &args).context("cannot start ffplay");
            }
            AppScreen::Wayland(s, _) => {
                let mut c = std::process::Command::new("ffplay");
                c.env("WAYLAND_DISPLAY", &s.socket)
                    .env("XDG_RUNTIME_DIR", &s.dir)
                    .env("SDL_VIDEODRIVER", "wayland")
                    .env_remove("DISPLAY");
                c
            }
            AppScreen::Gnome(m) => m.client("ffplay"),
        };
        cmd.env("SDL_AUDIODRIVER", "dummy")
            .arg("-fs")
            .args(common)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map(Killed)
            .context("cannot start ffplay")
    }

    fn source(&self) -> SourceConfig {
        match self {
            AppScreen::X11(x) => SourceConfig::X11Screen(X11ScreenConfig {
                display: x.display.clone(),
                max_fps: MAX_FPS,
                refresh_s: 0.0,
            }),
            AppScreen::Wayland(s, server) => SourceConfig::WaylandScreen(WaylandScreenConfig {
                display: s.socket.display().to_string(),
                max_fps: MAX_FPS,
                protocol: match server {
                    Server::NewerSway(p) => *p,
                    _ => WaylandProtocol::Auto,
                },
                ..WaylandScreenConfig::default()
            }),
            AppScreen::Gnome(m) => SourceConfig::GnomeScreen(GnomeScreenConfig {
                bus: m.bus.clone(),
                pipewire: m.dir.join("pipewire-0").display().to_string(),
                max_fps: MAX_FPS,
                ..GnomeScreenConfig::default()
            }),
        }
    }

    fn label(&self) -> &'static str {
        match self {
            AppScreen::X11(_) => Server::X11.label(),
            AppScreen::Wayland(_, server) => server.label(),
            AppScreen::Gnome(_) => Server::Gnome.label(),
        }
    }
}

/// CPU time (user and system) of this process's `gst-launch-1.0` children so far: the
/// `gnome-screen` source reads PipeWire through one, and its work is the source's.
fn gst_cpu() -> Duration {
    let me = std::process::id().to_string();
    let mut ticks = 0u64;
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        if !head.ends_with("(gst-launch-1.0") {
            continue;
        }
        let f: Vec<&str> = rest.split_whitespace().collect();
        // After the name: state, ppid (field 4), … utime 14, stime 15.
        if f.get(1) != Some(&me.as_str()) {
            continue;
        }
        ticks += f.get(11).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0)
            + f.get(12).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
    }
    Duration::from_millis(ticks * 10)
}

/// CPU time this process used so far (every thread, user and system), from /proc.
fn cpu_now() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // After the command name's closing parenthesis: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
    // USER_HZ is 100 on Linux.
    Duration::from_millis(ticks * 10)
}

/// What passed between source and sink.
#[derive(Debug, Default, Clone)]
struct Tap {
    frames: u64,
    bytes: u64,
    rects: u64,
    keyframes: u64,
    /// Sum of (handed to the sink's channel − source timestamp), ns, and how many.
    lat_ns: u64,
    lat_n: u64,
}

#[derive(Debug, Default)]
struct Shared {
    tap: Tap,
    /// Every `SAMPLE_EVERY`-th frame's payload while sampling, for the compress rows.
    samples: Vec<Vec<u8>>,
    sampling: bool,
}

const SAMPLE_EVERY: u64 = 4;
const MAX_SAMPLES: usize = 30;

/// One measured size.
#[derive(Debug)]
struct Row {
    /// The app screen's server: "X11" (Xvfb), "Wayland" (headless sway) or "GNOME" (headless mutter).
    server: &'static str,
    /// This process's CPU time over the measured window (source, channel and sink).
    cpu: Duration,
    w: u32,
    h: u32,
    rate: u32,
    shm: Option<f64>,
    get: f64,
    memcpy_gbs: f64,
    secs: f64,
    tap: Tap,
    sink_frames: u64,
    source_frames: u64,
    /// (codec, payload bytes in, wire bytes out, compress MB/s).
    compress: Vec<(&'static str, u64, u64, f64)>,
    samples: usize,
}

impl Row {
    fn frame_bytes(&self) -> f64 {
        f64::from(self.w) * f64::from(self.h) * 4.0
    }
    fn fps(&self) -> f64 {
        self.tap.frames as f64 / self.secs
    }
    /// This process's CPU time per update delivered, ms.
    fn cpu_per_update_ms(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e3 / self.tap.frames.max(1) as f64
    }
}

/// Full-screen captures per second for `dur`: ShmGetImage into a server-made segment (MIT-SHM
/// 1.2, `None` if the server cannot), and plain GetImage.
fn capture_rates(display: &str, dur: Duration) -> Result<(Option<f64>, f64)> {
    let (conn, n) = RustConnection::connect(Some(display))
        .with_context(|| format!("cannot connect to X display {display}"))?;
    let screen = &conn.setup().roots[n];
    let (root, w, h) = (screen.root, screen.width_in_pixels, screen.height_in_pixels);
    let size = u32::from(w) * u32::from(h) * 4;
    let shm = (|| -> Result<f64> {
        conn.shm_query_version()?.reply()?;
        let seg = conn.generate_id()?;
        let _fd = conn.shm_create_segment(seg, size, false)?.reply()?;
        let t = Instant::now();
        let mut n = 0u64;
        while t.elapsed() < dur {
            let r = conn
                .shm_get_image(
                    root,
                    0,
                    0,
                    w,
                    h,
                    !0,
                    xproto::ImageFormat::Z_PIXMAP.into(),
                    seg,
                    0,
                )?
                .reply()?;
            if r.size != size {
                bail!("ShmGetImage returned {} bytes, expected {size}", r.size);
            }
            n += 1;
        }
        let rate = n as f64 / t.elapsed().as_secs_f64();
        conn.shm_detach(seg)?;
        Ok(rate)
    })();
    let shm = match shm {
        Ok(r) => Some(r),
        Err(e) => {
            eprintln!("bench display: no ShmGetImage baseline on {display}: {e:#}");
            None
        }
    };
    // GetImage: one request may be capped by the maximum request length; bands if so.
    let max = conn.maximum_request_bytes().saturating_sub(64).max(4096);
    let band_h = (max / (usize::from(w) * 4)).clamp(1, usize::from(h)) as u16;
    let t = Instant::now();
    let mut n = 0u64;
    while t.elapsed() < dur {
        let mut got = 0usize;
        let mut cookies = Vec::new();
        let mut y = 0u16;
        while y < h {
            let bh = band_h.min(h - y);
            cookies.push(conn.get_image(
                xproto::ImageFormat::Z_PIXMAP,
                root,
                0,
                y as i16,
                w,
                bh,
                !0,
            )?);
            y += bh;
        }
        for c in cookies {
            got += c.reply()?.data.len();
        }
        if got != size as usize {
            bail!("GetImage returned {got} bytes, expected {size}");
        }
        n += 1;
    }
    Ok((shm, n as f64 / t.elapsed().as_secs_f64()))
}

/// memcpy of `size` bytes, GB/s.
fn memcpy_gbs(size: usize, dur: Duration) -> f64 {
    let src = vec![0x5au8; size];
    let mut dst = vec![0u8; size];
    let t = Instant::now();
    let mut n = 0u64;
    while t.elapsed() < dur {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
        n += 1;
    }
    (n as f64 * size as f64) / t.elapsed().as_secs_f64() / 1e9
}

/// The source half of a one-pair stack over the sampled payloads: (in, out, MB/s).
fn compress(case: &str, samples: &[Vec<u8>]) -> Result<(u64, u64, f64)> {
    let cfg = parse_case(case, Path::new(""))?;
    let pairs: [&dyn Pair; 1] = [&cfg];
    let mut st = Stack::build(Role::Source, "bench", &pairs)?;
    let (mut bytes_in, mut bytes_out) = (0u64, 0u64);
    let mut busy = Duration::ZERO;
    for (i, p) in samples.iter().enumerate() {
        let meta = Meta {
            stream: 3,
            seq: i as u64,
            timestamp_ns: now_ns(),
            flags: 0,
        };
        let f = Frame::new(meta, p);
        bytes_in += f.len() as u64;
        let t = Instant::now();
        st.handle_frame(Instant::now(), f)?;
        while let Some(w) = st.poll_frame() {
            bytes_out += w.len() as u64;
        }
        busy += t.elapsed();
    }
    Ok((
        bytes_in,
        bytes_out,
        bytes_in as f64 / busy.as_secs_f64().max(1e-9) / 1e6,
    ))
}

/// One size: an app screen (an Xvfb, a headless sway or a headless mutter) of exactly the
/// video's size with ffplay on it, the stream into a window on `viewer`, then (X11) the
/// capture baselines on the same (still playing) display.
async fn one_size(
    w: u32,
    h: u32,
    rate: u32,
    viewer: &Xvfb,
    quick: bool,
    server: Server,
) -> Result<Row> {
    let app = AppScreen::start(server, w, h)?;
    let _ffplay = app.play(w, h, rate)?;
    let shared = Arc::new(Mutex::new(Shared::default()));
    let (stop, stopped) = oneshot::channel::<()>();
    let (tx, mut mid) = mpsc::channel::<Frame>(8);
    let (fwd, rx) = mpsc::channel::<Frame>(8);
    let source = app.source().spawn(3, tx).context("the screen source")?;
    let sink = SinkConfig::X11Window(X11WindowConfig {
        display: viewer.display.clone(),
        title: format!("ndd bench display {w}x{h}"),
        ..X11WindowConfig::default()
    })
    .spawn(rx)
    .context("x11-window sink")?;
    let sh = shared.clone();
    let tap = tokio::spawn(async move {
        let mut stopped = stopped;
        loop {
            let f = tokio::select! {
                f = mid.recv() => f,
                _ = &mut stopped => None,
            };
            let Some(f) = f else { break };
            {
                let mut s = sh.lock().unwrap_or_else(|p| p.into_inner());
                s.tap.frames += 1;
                s.tap.bytes += f.len() as u64;
                if let Ok(u) = Update::parse(f.payload()) {
                    s.tap.rects += u.rects.len() as u64;
                    if u.header.flags & FLAG_KEYFRAME != 0 {
                        s.tap.keyframes += 1;
                    }
                }
                if s.sampling && s.tap.frames % SAMPLE_EVERY == 0 && s.samples.len() < MAX_SAMPLES {
                    s.samples.push(f.payload().to_vec());
                }
            }
            let stamp = f.meta.timestamp_ns;
            if fwd.send(f).await.is_err() {
                break;
            }
            // After the send: the update is in the sink's queue (bounded: the sink keeps up).
            let lat = now_ns().saturating_sub(stamp);
            let mut s = sh.lock().unwrap_or_else(|p| p.into_inner());
            s.tap.lat_ns += lat;
            s.tap.lat_n += 1;
        }
    });
    let snap = |s: &Arc<Mutex<Shared>>| s.lock().unwrap_or_else(|p| p.into_inner()).tap.clone();
    // Wait for the video to be playing: updates beyond the first keyframe.
    let t0 = Instant::now();
    while snap(&shared).frames < 5 {
        if t0.elapsed() > Duration::from_secs(30) {
            bail!(
                "no display updates from ffplay on the {} screen within 30 s",
                app.label()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Let it settle a little (ffplay's first frames, the viewer window mapping).
    tokio::time::sleep(Duration::from_millis(if quick { 200 } else { 500 })).await;
    let before = snap(&shared);
    let cpu0 = cpu_now() + gst_cpu();
    shared.lock().unwrap_or_else(|p| p.into_inner()).sampling = true;
    let t = Instant::now();
    tokio::time::sleep(Duration::from_millis(if quick { 1500 } else { 3000 })).await;
    let after = snap(&shared);
    let cpu = (cpu_now() + gst_cpu()).saturating_sub(cpu0);
    let secs = t.elapsed().as_secs_f64();
    let samples = {
        let mut s = shared.lock().unwrap_or_else(|p| p.into_inner());
        s.sampling = false;
        std::mem::take(&mut s.samples)
    };
    let _ = stop.send(());
    let src = tokio::time::timeout(Duration::from_secs(10), source)
        .await
        .context("source stops within 10 s")?
        .context("source task")?
        .context("the screen source")?;
    let _ = tap.await;
    let snk = tokio::time::timeout(Duration::from_secs(10), sink)
        .await
        .context("sink stops within 10 s")?
        .context("sink task")?
        .context("x11-window sink")?;
    let tap = Tap {
        frames: after.frames - before.frames,
        bytes: after.bytes - before.bytes,
        rects: after.rects - before.rects,
        keyframes: after.keyframes - before.keyframes,
        lat_ns: after.lat_ns - before.lat_ns,
        lat_n: after.lat_n - before.lat_n,
    };
    // Baselines on the same display, ffplay still playing (the X server's own capture).
    let dur = Duration::from_millis(if quick { 300 } else { 600 });
    let (shm, get) = match &app {
        AppScreen::X11(x) => {
            let display = x.display.clone();
            tokio::task::spawn_blocking(move || capture_rates(&display, dur))
                .await
                .context("capture baseline task")??
        }
        AppScreen::Wayland(..) | AppScreen::Gnome(_) => (None, 0.0),
    };
    let size = (w * h * 4) as usize;
    let memcpy = tokio::task::spawn_blocking(move || memcpy_gbs(size, dur))
        .await
        .context("memcpy task")?;
    let mut comp = Vec::new();
    if !samples.is_empty() {
        for (name, case) in [
            ("lz4", r#"{ type = "compress", codec = "lz4" }"#),
            (
                "zstd 3",
                r#"{ type = "compress", codec = "zstd", level = 3 }"#,
            ),
        ] {
            let (a, b, mbs) =
                compress(case, &samples).with_context(|| format!("compress {name}"))?;
            comp.push((name, a, b, mbs));
        }
    }
    Ok(Row {
        server: app.label(),
        cpu,
        w,
        h,
        rate,
        shm,
        get,
        memcpy_gbs: memcpy,
        secs,
        tap,
        sink_frames: snk.frames,
        source_frames: src.frames,
        compress: comp,
        samples: samples.len(),
    })
}

/// Runs the benchmark and writes `display.md` into `out`.
pub async fn run(quick: bool, out: &Path) -> Result<()> {
    if !(have("Xvfb") && have("ffplay")) {
        if quick {
            println!("{SKIPPED}");
            return Ok(());
        }
        bail!("{SKIPPED}");
    }
    let sizes: &[(u32, u32)] = if quick {
        &[(320, 240)]
    } else {
        &[(320, 240), (640, 480), (1280, 720)]
    };
    let rates: &[u32] = if quick { &RATES[..1] } else { &RATES };
    let viewer = xvfb(1920, 1080)?;
    // The same video on a headless sway and a headless mutter too, where installed.
    let mut servers = vec![Server::X11];
    if have("sway") {
        servers.push(Server::Sway);
    } else {
        eprintln!("bench display: no Wayland rows (needs sway: apt-get install sway)");
    }
    // sway 1.12 of the newer root: ext-image-copy-capture, and wlr-screencopy on the same
    // compositor (the full run) for the two protocols' cost side by side.
    match ndd_procs::newer_wayland_root() {
        Ok(_) => {
            servers.push(Server::NewerSway(WaylandProtocol::Ext));
            if !quick {
                servers.push(Server::NewerSway(WaylandProtocol::Wlr));
            }
        }
        Err(e) => eprintln!("bench display: no sway 1.12 rows ({e})"),
    }
    if ["mutter", "pipewire", "wireplumber", "gst-launch-1.0"]
        .iter()
        .all(|p| have(p))
    {
        servers.push(Server::Gnome);
    } else {
        eprintln!("bench display: no GNOME rows (needs mutter, pipewire, wireplumber, gstreamer1.0-pipewire)");
    }
    let mut rows = Vec::new();
    for (&(w, h), &rate) in sizes.iter().flat_map(|s| rates.iter().map(move |r| (s, r))) {
        for &server in &servers {
            let row = one_size(w, h, rate, &viewer, quick, server)
                .await
                .with_context(|| {
                    format!("bench display at {w}x{h}, {rate} fps, {}", server.label())
                })?;
            eprintln!(
            "bench display {} {w}x{h} at {rate} fps: {:.1} fps delivered, {:.1} MB/s, {:.1} rects/frame, {:.2} ms CPU/update; ShmGetImage {} /s, GetImage {:.0} /s, memcpy {:.1} GB/s",
            row.server,
            row.fps(),
            row.tap.bytes as f64 / row.secs / 1e6,
            row.tap.rects as f64 / row.tap.frames.max(1) as f64,
            row.cpu_per_update_ms(),
            row.shm.map_or("-".into(), |r| format!("{r:.0}")),
            row.get,
            row.memcpy_gbs
        );
            rows.push(row);
        }
    }
    let mut md = report(quick, &rows);
    md += &scaling(quick);
    println!("{md}");
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let path = out.join("display.md");
    std::fs::write(&path, md).with_context(|| format!("cannot write {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

/// What the viewer's scaling costs a whole frame (`x11-window` shows an app screen larger than
/// the person's, or a resized window, scaled: `ndd_endpoint::display::scale`), on one core,
/// next to a memcpy of the same source frame in the same run. Only the part of the window an
/// update lands in is scaled again, so this is the cost of a frame that changes everywhere.
fn scaling(quick: bool) -> String {
    use ndd_endpoint::display::scale::scale_into;
    let cases: &[(u16, u16, u16, u16)] = if quick {
        &[(640, 360, 304, 171)]
    } else {
        &[
            (2560, 1440, 1824, 1026),
            (1920, 1080, 1824, 1026),
            (1920, 1080, 960, 540),
            (1280, 720, 1920, 1080),
        ]
    };
    let mut md = String::from(
        "\n## The viewer's scaling\n\nA whole frame scaled as the `x11-window` sink scales it (area average shrinking, bilinear growing), one core, against a memcpy of the source frame in the same run.\n\n| app screen | window | ms per frame | memcpy ms |\n|---|---|---:|---:|\n",
    );
    for &(sw, sh, dw, dh) in cases {
        let src: Vec<u8> = (0..usize::from(sw) * usize::from(sh) * 4)
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        let mut dst = vec![0u8; usize::from(dw) * usize::from(dh) * 4];
        let n = if quick { 3 } else { 20 };
        let t = Instant::now();
        for _ in 0..n {
            scale_into(
                &src,
                sw,
                sh,
                &mut dst,
                dw,
                dh,
                ndd_endpoint::Rect::new(0, 0, dw, dh),
            );
        }
        let per = t.elapsed().as_secs_f64() / f64::from(n) * 1e3;
        let mut copy = vec![0u8; src.len()];
        let t = Instant::now();
        for _ in 0..n {
            copy.copy_from_slice(&src);
            std::hint::black_box(&copy);
        }
        let mc = t.elapsed().as_secs_f64() / f64::from(n) * 1e3;
        eprintln!("bench display: scaling {sw}x{sh} to {dw}x{dh}: {per:.2} ms a frame (memcpy {mc:.3} ms)");
        md += &format!("| {sw}×{sh} | {dw}×{dh} | {per:.2} | {mc:.3} |\n");
    }
    md
}

fn report(quick: bool, rows: &[Row]) -> String {
    let mut md = String::from("# Display stream: frame rate and bandwidth vs the X server\n\n");
    md += &format!(
        "Hardware: {}. Date: {}. Command: `ndd bench display{}`. Load average (1 min) at the \
         end: {} (other work on the machine shares the cores with the two Xvfb servers, \
         ffplay and ndd; the 1280x720 rows vary most).\n\n",
        hardware(),
        today(),
        if quick { " --quick" } else { "" },
        std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|l| l.split_whitespace().next().map(str::to_string))
            .unwrap_or_else(|| "unknown".into())
    );
    md += &format!(
        "The app display is an Xvfb of exactly the video's size, running \
         `ffplay -f lavfi -i testsrc=size=WxH:rate=R` (R = 60, and 240: more than it \
         paints) borderless at the top left (the \
         whole screen changes every video frame). The stream: `x11-screen` source \
         (`max_fps = {MAX_FPS}`, no periodic keyframes) → tokio channel → `x11-window` sink \
         on a second Xvfb, in one process, no link. Figures are taken over the measured window \
         after the first updates. The `Wayland` rows play the same video full screen (`-fs`, \
         SDL's Wayland driver) on a headless sway of the same size (wlroots' headless backend, \
         the pixman renderer) captured by the `wayland-screen` source \
         (`wlr-screencopy-unstable-v1` with damage into a `wl_shm` buffer), into the same sink: \
         `Wayland` is Debian 12's sway 1.7, `Wayland 1.12 ext` and `Wayland 1.12 wlr` Debian \
         forky's sway 1.12 (the root `scripts/newer-wayland.sh` makes) captured through \
         `ext-image-copy-capture-v1` and through `wlr-screencopy-unstable-v1` in turn; \
         the `GNOME` rows on a headless mutter (`--headless --virtual-monitor WxH`, software \
         rendering) captured by the `gnome-screen` source (mutter's screen cast, its PipeWire \
         stream read by a `gst-launch-1.0` child, whose CPU time is counted in the row). \
         `ndd CPU ms/update` is this process's CPU time (every thread: capture, records, the \
         sink's drawing) over the measured window per update delivered, so the two capture \
         paths compare in the same run; the X server's or sway's own work (the copy it makes \
         for the capture, and drawing the video) is not in it.\n\n"
    );
    md += "## Baseline: what the X server hands over, and memcpy\n\n\
           Full-screen captures of the app display in a tight loop (one request, wait for the \
           reply, repeat), with ffplay still playing: ShmGetImage into a server-created \
           MIT-SHM segment (no copy to the client) and GetImage (pixels over the socket). \
           memcpy of one frame's bytes, same run.\n\n\
           | screen | frame | ShmGetImage /s | ShmGetImage MB/s | GetImage /s | GetImage MB/s | memcpy GB/s |\n\
           |---|---:|---:|---:|---:|---:|---:|\n";
    for r in rows
        .iter()
        .filter(|r| r.rate == RATES[0] && r.server == "X11")
    {
        let fb = r.frame_bytes();
        let (shm, shm_mb) = r.shm.map_or(("n/a".into(), "n/a".into()), |s| {
            (format!("{s:.0}"), format!("{:.0}", s * fb / 1e6))
        });
        md += &format!(
            "| {}x{} | {:.0} KB | {shm} | {shm_mb} | {:.0} | {:.0} | {:.1} |\n",
            r.w,
            r.h,
            fb / 1e3,
            r.get,
            r.get * fb / 1e6,
            r.memcpy_gbs
        );
    }
    md += "\n## ndd display stream, in process\n\n\
         Delivered = updates handed to the sink over the measured window (the channel is \
         bounded, so the sink keeps pace or the source waits). MB/s = display records \
         (header + rects + raw pixels). `fps / video` compares with the rate ffplay \
         offers; `MB/s / ShmGetImage` with the server's full-screen capture bandwidth above. \
         Every update here is the whole screen (the video covers it), so each is flagged a \
         keyframe. \
         `stamp → sink queue` = from the source's timestamp (taken when it starts an update) \
         to the update being in the sink's bounded queue: capture and record building, not \
         the draw. With 240 asked, ffplay itself paints about 60 fps at most (and all \
         processes share the machine's cores), so those rows show what the whole setup \
         reaches, not a ceiling of the stream alone; `MB/s / ShmGetImage` shows how far the \
         capture is from the server's limit.\n\n\
         | server | screen | video fps | seconds | updates | fps | fps / video | MB/s / ShmGetImage | MB/s | KB/update | rects/update | keyframes | stamp → sink queue, mean ms | ndd CPU ms/update | source / sink frames (whole run) |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for r in rows {
        let fps = r.fps();
        let n = r.tap.frames.max(1) as f64;
        md += &format!(
            "| {} | {}x{} | {} | {:.1} | {} | {:.1} | {:.0} % | {} | {:.1} | {:.0} | {:.1} | {} | {:.2} | {:.2} | {} / {} |\n",
            r.server,
            r.w,
            r.h,
            r.rate,
            r.secs,
            r.tap.frames,
            fps,
            fps / f64::from(r.rate) * 100.0,
            r.shm
                .or(Some(r.get).filter(|g| *g > 0.0))
                .map_or("n/a".into(), |s| format!("{:.1} %", r.tap.bytes as f64 / r.secs / (s * r.frame_bytes()) * 100.0)),
            r.tap.bytes as f64 / r.secs / 1e6,
            r.tap.bytes as f64 / n / 1e3,
            r.tap.rects as f64 / n,
            r.tap.keyframes,
            r.tap.lat_ns as f64 / r.tap.lat_n.max(1) as f64 / 1e6,
            r.cpu_per_update_ms(),
            r.source_frames,
            r.sink_frames
        );
    }
    if rows.iter().any(|r| !r.compress.is_empty()) {
        md += &format!(
            "\n## Through a `compress` pair: bytes on the wire\n\n\
             Up to {MAX_SAMPLES} updates of the measured window (every {SAMPLE_EVERY}th) \
             through the source half of a one-pair stack, as a link would carry them; \
             MB/s = payload compressed per second of compress time (one core). Wire MB/s = \
             the stream's MB/s above × ratio.\n\n\
             | server | screen | video fps | codec | updates | ratio (wire / raw) | saved | wire MB/s at the measured fps | compress MB/s |\n\
             |---|---|---:|---|---:|---:|---:|---:|---:|\n"
        );
        for r in rows {
            let mbs = r.tap.bytes as f64 / r.secs / 1e6;
            for &(name, a, b, speed) in &r.compress {
                let ratio = b as f64 / a.max(1) as f64;
                md += &format!(
                    "| {} | {}x{} | {} | {name} | {} | {:.3} | {:.1} % | {:.2} | {:.0} |\n",
                    r.server,
                    r.w,
                    r.h,
                    r.rate,
                    r.samples,
                    ratio,
                    (1.0 - ratio) * 100.0,
                    mbs * ratio,
                    speed
                );
            }
        }
    }
    md += "\ntestsrc is a synthetic pattern (colour bars, a moving gradient, a counter): it \
           compresses far better than camera video and about as well as a busy desktop. \
           Capture→draw latency is not measured (the sink does not expose when it drew).\n";
    md
}

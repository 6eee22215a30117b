//! `ndd bench display --vs-vnc`: seed 000's remote-display metrics and the dissertation's
//! ndd-vs-VNC comparison (Tables 6.4/6.5) in one run, on real peers.
//!
//! Per workload (a noisy 30 fps video, scrolling text in an xterm, glxgears) and network
//! (0 ms, 50 ms one way, 50 ms + 20 Mbit/s), the same 800x600 screen is shown on a viewer X
//! server by TigerVNC (Xtigervnc + vncviewer from Debian, defaults) and by ndd (`x11-screen`
//! → `image` → `x11-window`, two `ndd` processes over TLS). Everything is measured from
//! outside both programs:
//!
//! - **fps**: updates drawn on the viewer's X server, counted with DAMAGE (bursts of damage
//!   more than [`BURST_GAP`] apart);
//! - **Mbit per frame**: bytes the shaping proxy carried towards the viewer, per update;
//! - **CPU-limited fps**: updates per CPU-second of the app side (Xtigervnc, which is the X
//!   server and the encoder; for ndd the app's Xvfb plus the `ndd` app process);
//! - **quality** on still content: differing pixels and PSNR between the app screen and the
//!   viewer screen 1 s and 2.5 s after a still picture appears;
//! - **responsiveness** (seed 004): a key typed with XTEST into the viewer → the last damage
//!   its echo causes in the viewer's xterm area, alone and with the video playing below.
//!
//! The network: a proxy between viewer and server holds every chunk for the one-way latency in
//! each direction (netem is absent on this kernel). The rate is the kernel's: when run as root
//! with `ip` and `tc`, the viewer side (its viewer program, or ndd's device side) runs in a
//! network namespace joined to this one by a veth pair, and `tc tbf` on both ends of the pair
//! limits the rate with a queue of [`MAX_QUEUE`] ([`Netns`]). Without them (`--no-netns`, or not
//! root), the proxy also serialises each direction at the rate behind a queue of at most
//! [`MAX_QUEUE`] (a bottleneck router's buffer; the kernel's socket buffers before it fill as
//! they would behind a real one). The report says which.

use super::{frames, hardware, player, today};
use anyhow::{bail, Context, Result};
use ndd_procs::Killed;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use x11rb::connection::Connection;
use x11rb::protocol::damage::{self, ConnectionExt as _};
use x11rb::protocol::xfixes::ConnectionExt as _;
use x11rb::protocol::xproto::{self, ConnectionExt as _};
use x11rb::protocol::xtest::ConnectionExt as _;
use x11rb::protocol::Event;
use x11rb::wrapper::ConnectionExt as _;

/// Damage events closer than this belong to one update: a viewer draws an update's rects as
/// it decodes them (TigerVNC on several threads), so one update is several damage events a
/// few ms apart; distinct frames of a 30 fps source are 33 ms apart.
const BURST_GAP: Duration = Duration::from_millis(12);
/// Most the shaped link queues at its bottleneck, as time at its rate.
const MAX_QUEUE: Duration = Duration::from_millis(100);
/// The screen size of both peers (`--size`, 800x600 by default).
static SIZE: std::sync::OnceLock<(u16, u16)> = std::sync::OnceLock::new();

fn size() -> (u16, u16) {
    *SIZE.get().unwrap_or(&(800, 600))
}

/// An Xvfb with one screen of the bench's size on a free display.
fn start_xvfb() -> Result<(Killed, String)> {
    let screen = format!("{}x24", size_arg());
    start_x(
        "Xvfb",
        &["-screen", "0", &screen, "-nolisten", "tcp", "-noreset"],
    )
}

/// `WxH`.
fn size_arg() -> String {
    let (w, h) = size();
    format!("{w}x{h}")
}
/// The xterm of the typing test: 80x12 at the top left.
const XTERM_AREA: (u16, u16, u16, u16) = (0, 0, 500, 200);

/// The viewer side's network namespace, joined to this one by a veth pair whose two ends
/// carry `tc tbf` when a net has a rate. Deleted on drop.
#[derive(Debug)]
pub(crate) struct Netns;

impl Netns {
    const NAME: &'static str = "ndd-bench-view";
    const HOST_IF: &'static str = "nddb-host";
    const NS_IF: &'static str = "nddb-view";
    const HOST_IP: &'static str = "10.77.0.1";

    /// Creates the namespace and the veth pair (removing what a crashed run left behind).
    fn create() -> Result<Netns> {
        let _ = ip(&["netns", "del", Self::NAME]);
        let _ = ip(&["link", "del", Self::HOST_IF]);
        ip(&["netns", "add", Self::NAME])?;
        let ns = Netns;
        ip(&[
            "link",
            "add",
            Self::HOST_IF,
            "type",
            "veth",
            "peer",
            "name",
            Self::NS_IF,
        ])?;
        ip(&["link", "set", Self::NS_IF, "netns", Self::NAME])?;
        ip(&[
            "addr",
            "add",
            &format!("{}/30", Self::HOST_IP),
            "dev",
            Self::HOST_IF,
        ])?;
        ip(&["link", "set", Self::HOST_IF, "up"])?;
        for args in [
            vec!["addr", "add", "10.77.0.2/30", "dev", Self::NS_IF],
            vec!["link", "set", Self::NS_IF, "up"],
            vec!["link", "set", "lo", "up"],
        ] {
            ip(&[&["-n", Self::NAME][..], &args].concat())?;
        }
        Ok(ns)
    }

    /// `tc tbf` at `mbit` on both ends of the pair (none: no qdisc).
    fn shape(&self, mbit: Option<f64>) -> Result<()> {
        for ns in [None, Some(Self::NAME)] {
            let dev = if ns.is_some() {
                Self::NS_IF
            } else {
                Self::HOST_IF
            };
            let mut args: Vec<String> = Vec::new();
            if let Some(n) = ns {
                args.extend(["-n".into(), n.into()]);
            }
            match mbit {
                None => {
                    args.extend(["qdisc", "del", "dev", dev, "root"].map(String::from));
                    let _ = tc(&args);
                }
                Some(m) => {
                    args.extend(["qdisc", "replace", "dev", dev, "root", "tbf"].map(String::from));
                    args.extend([
                        "rate".into(),
                        format!("{}kbit", (m * 1000.0) as u64),
                        "burst".into(),
                        "32kbit".into(),
                        "latency".into(),
                        format!("{}ms", MAX_QUEUE.as_millis()),
                    ]);
                    tc(&args)?;
                }
            }
        }
        Ok(())
    }

    /// `program` run inside the namespace (`ip netns exec` execs it: same pid).
    fn command(&self, program: &Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", Self::NAME]).arg(program);
        c
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", Self::NAME]);
        let _ = ip(&["link", "del", Self::HOST_IF]);
    }
}

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("cannot run ip")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn tc(args: &[String]) -> Result<()> {
    let out = Command::new("tc")
        .args(args)
        .output()
        .context("cannot run tc")?;
    if !out.status.success() {
        bail!(
            "tc {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// The namespace of this run, when the kernel shapes the rate.
static NETNS: Mutex<Option<Netns>> = Mutex::new(None);

fn netns_active() -> bool {
    NETNS.lock().map(|g| g.is_some()).unwrap_or(false)
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Net {
    name: &'static str,
    one_way: Duration,
    mbit: Option<f64>,
}

const NETS: [Net; 4] = [
    Net {
        name: "0 ms",
        one_way: Duration::ZERO,
        mbit: None,
    },
    Net {
        name: "50 ms",
        one_way: Duration::from_millis(50),
        mbit: None,
    },
    Net {
        name: "50 ms + 20 Mbit/s",
        one_way: Duration::from_millis(50),
        mbit: Some(20.0),
    },
    Net {
        name: "100 ms + 10 Mbit/s",
        one_way: Duration::from_millis(100),
        mbit: Some(10.0),
    },
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Peer {
    Vnc,
    Ndd,
    /// ndd at JPEG Q92 4:4:4: the quality TigerVNC's automatic selection uses above
    /// 16 Mbit/s (Tight level 8), for a comparison at equal quality.
    NddHigh,
    /// ndd with its tile codec only (`codec = "tiles"`): what the H.264 video regions add.
    NddTiles,
    /// xpra 3.1 from Debian: `xpra shadow` of the app's Xvfb, `xpra attach` (both with
    /// `--mmap=no`, or the client reads the server's memory and bypasses the network).
    Xpra,
    /// FreeRDP 2.11 from Debian: `freerdp-shadow-cli` of the app's Xvfb, `xfreerdp` with the
    /// graphics pipeline in H.264 (`/gfx:AVC420`).
    Rdp,
}

impl Peer {
    fn name(self) -> &'static str {
        match self {
            Peer::Vnc => "TigerVNC",
            Peer::Ndd => "ndd",
            Peer::NddHigh => "ndd Q92",
            Peer::NddTiles => "ndd tiles",
            Peer::Xpra => "xpra",
            Peer::Rdp => "FreeRDP",
        }
    }

    /// Whether the viewer shows the screen exactly once it is still (the others code a
    /// still screen in H.264 too: near, not equal).
    fn lossless_when_still(self) -> bool {
        !matches!(self, Peer::Rdp | Peer::Xpra)
    }
}

/// The peers `--peers` may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PeerName {
    /// TigerVNC (Xtigervnc + vncviewer).
    Tigervnc,
    /// ndd (two processes over TLS).
    Ndd,
    /// xpra (shadow + attach).
    Xpra,
    /// FreeRDP (freerdp-shadow-cli + xfreerdp).
    Freerdp,
}

impl PeerName {
    fn peer(self) -> Peer {
        match self {
            PeerName::Tigervnc => Peer::Vnc,
            PeerName::Ndd => Peer::Ndd,
            PeerName::Xpra => Peer::Xpra,
            PeerName::Freerdp => Peer::Rdp,
        }
    }

    /// The programs it needs, and the Debian packages they come in.
    fn needs(self) -> &'static [(&'static str, &'static str)] {
        match self {
            PeerName::Tigervnc => &[
                ("Xtigervnc", "tigervnc-standalone-server"),
                ("vncviewer", "tigervnc-viewer"),
            ],
            PeerName::Ndd => &[],
            PeerName::Xpra => &[("xpra", "xpra python3-gi-cairo python3-pil")],
            PeerName::Freerdp => &[
                ("freerdp-shadow-cli", "freerdp2-shadow-x11"),
                ("xfreerdp", "freerdp2-x11"),
            ],
        }
    }
}

/// xpra's features a screen comparison does not use (and that would need a session bus,
/// PulseAudio, printers… here).
const XPRA_OFF: &[&str] = &[
    "--mmap=no",
    "--notifications=no",
    "--pulseaudio=no",
    "--speaker=no",
    "--microphone=no",
    "--webcam=no",
    "--printing=no",
    "--file-transfer=no",
    "--clipboard=no",
];

/// A workload of the frame-rate rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    /// A noisy 30 fps test video (noise of ±12 on every pixel: a stress case).
    Video,
    /// The same test video with light grain (±4), nearer filmed content.
    Film,
    /// Scrolling text in an xterm.
    Text,
    /// glxgears (Mesa llvmpipe).
    Gears,
    /// A web-page-like layout: text read on the left half (an xterm, a line every half
    /// second), the film-like video in a window a quarter of the screen's area on the right.
    Page,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Video => "video (testsrc + noise, 30 fps)",
            Workload::Film => "film-like video (testsrc + grain ±4, 30 fps)",
            Workload::Text => "scrolling text (xterm)",
            Workload::Gears => "3D (glxgears, llvmpipe)",
            Workload::Page => "page: text beside a video window (grain ±4)",
        }
    }

    /// Where the test video shows on the screen, `(left, top, width, height)`: the whole
    /// screen, or the page's window; `None` without a video.
    fn video_rect(self) -> Option<(u16, u16, u16, u16)> {
        let (w, h) = size();
        match self {
            Workload::Video | Workload::Film => Some((0, 0, w, h)),
            // Even sizes (the video is yuv420p).
            Workload::Page => Some((w / 2, h / 4, (w / 2) & !1, (h / 2) & !1)),
            Workload::Text | Workload::Gears => None,
        }
    }

    /// The noise of a test video ([`frames::video_graph`]); `None` for the other workloads.
    fn grain(self) -> Option<u8> {
        match self {
            Workload::Video => Some(12),
            Workload::Film | Workload::Page => Some(4),
            Workload::Text | Workload::Gears => None,
        }
    }

    /// Starts the workload's programs on `display`.
    fn start(self, display: &str) -> Result<Vec<Running>> {
        Ok(match self {
            Workload::Video | Workload::Film => {
                let (w, h) = size();
                vec![video(display, (0, 0, w, h), self.grain().unwrap_or(12))?]
            }
            Workload::Page => {
                let (left, top, vw, vh) = self.video_rect().unwrap_or_default();
                let (w, h) = size();
                // xterm's default font is 6x13: the left half, less a margin.
                let geometry = format!("{}x{}+0+0", (w / 2) / 6 - 2, h / 13 - 2);
                vec![
                    Running::Proc(spawn_on(
                        display,
                        "xterm",
                        &[
                            "-geometry",
                            &geometry,
                            "-e",
                            "sh",
                            "-c",
                            "while :; do cat /usr/share/common-licenses/GPL-3; done | \
                             while IFS= read -r l; do printf '%s\\n' \"$l\"; sleep 0.5; done",
                        ],
                    )?),
                    video(display, (left, top, vw, vh), 4)?,
                ]
            }
            Workload::Text => vec![Running::Proc(spawn_on(
                display,
                "xterm",
                &[
                    "-geometry",
                    "132x45+0+0",
                    "-e",
                    "sh",
                    "-c",
                    "while :; do ls -lR /usr/share/doc /usr/lib; done",
                ],
            )?)],
            Workload::Gears => vec![Running::Proc(spawn_on(
                display,
                "glxgears",
                &["-geometry", &format!("{}+0+0", size_arg())],
            )?)],
        })
    }
}

/// Renders the test video clips of `clips` (`(width, height, grain)`: ffmpeg, seconds at
/// 2560x1440) on a blocking thread, before the peers start (once a size, [`player::clip`]).
async fn render_clips(clips: Vec<(u16, u16, u8)>) -> Result<()> {
    tokio::task::spawn_blocking(move || {
        clips
            .into_iter()
            .try_for_each(|(w, h, grain)| player::clip(w, h, grain).map(drop))
    })
    .await
    .context("the clip renderer")?
}

/// A workload's program, stopped when dropped.
enum Running {
    Proc(#[allow(dead_code)] Killed),
    Video(#[allow(dead_code)] player::Player),
}

/// The test video with `grain` in the rectangle `(left, top, width, height)` of `display`
/// ([`player`]: ffplay rendering it live took most of the two cores at 2560x1440).
fn video(display: &str, (left, top, w, h): (u16, u16, u16, u16), grain: u8) -> Result<Running> {
    let at = |v: u16| i16::try_from(v).context("the video's place is beyond the X range");
    player::Player::start(display, w, h, at(left)?, at(top)?, grain).map(Running::Video)
}

/// ffplay showing lavfi `source` borderless at (0, `top`), without sound.
fn ffplay_args(source: &str, top: u16) -> Vec<String> {
    ffplay_args_at(source, 0, top)
}

/// ffplay showing lavfi `source` borderless at (`left`, `top`), without sound.
fn ffplay_args_at(source: &str, left: u16, top: u16) -> Vec<String> {
    let (left, top) = (left.to_string(), top.to_string());
    [
        "-loglevel",
        "error",
        "-noborder",
        "-an",
        "-left",
        &left,
        "-top",
        &top,
        "-f",
        "lavfi",
        "-i",
        source,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn spawn_on<S: AsRef<str>>(display: &str, program: &str, args: &[S]) -> Result<Killed> {
    Command::new(program)
        .env("DISPLAY", display)
        .env("SDL_AUDIODRIVER", "dummy")
        .args(args.iter().map(|a| a.as_ref()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(Killed)
        .with_context(|| format!("cannot start {program} (is it installed?)"))
}

/// Starts an X server on a free display (`ndd_procs::start_display`).
fn start_x(program: &str, args: &[&str]) -> Result<(Killed, String)> {
    ndd_procs::start_display(program, args).with_context(|| format!("cannot start {program}"))
}

fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// CPU seconds (user + system) a process has used.
fn cpu_secs(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command (which may hold spaces) start after the last ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after the ')'.
    (ticks(11) + ticks(12)) / 100.0
}

// ---- the network ----

/// Accepts connections on `listener` and joins each to a new connection to `upstream`
/// through the shaped link. Bytes towards the client are added to `down`.
async fn shaped_proxy(listener: TcpListener, upstream: SocketAddr, net: Net, down: Arc<AtomicU64>) {
    while let Ok((client, _)) = listener.accept().await {
        let down = down.clone();
        tokio::spawn(async move {
            let Ok(server) = TcpStream::connect(upstream).await else {
                return;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            let up = tokio::spawn(shaped_pipe(cr, sw, net, None));
            shaped_pipe(sr, cw, net, Some(down)).await;
            up.abort();
        });
    }
}

/// One direction of the shaped link: each chunk leaves `one_way` after it was read and, with
/// a rate, not before the chunks ahead of it have been serialised.
async fn shaped_pipe(
    mut r: tokio::net::tcp::OwnedReadHalf,
    mut w: tokio::net::tcp::OwnedWriteHalf,
    net: Net,
    count: Option<Arc<AtomicU64>>,
) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        while let Some((at, buf)) = rx.recv().await {
            tokio::time::sleep_until(at).await;
            if w.write_all(&buf).await.is_err() {
                return;
            }
        }
    });
    let rate = net.mbit.map(|m| m * 1e6 / 8.0);
    let mut free_at = tokio::time::Instant::now();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        // A full bottleneck queue: read no more until it drains (TCP backpressure).
        let now = tokio::time::Instant::now();
        if rate.is_some() && free_at > now + MAX_QUEUE {
            tokio::time::sleep_until(free_at - MAX_QUEUE).await;
        }
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(c) = &count {
            c.fetch_add(n as u64, Ordering::Relaxed);
        }
        let now = tokio::time::Instant::now();
        let leaves = match rate {
            Some(bps) => {
                free_at = free_at.max(now) + Duration::from_secs_f64(n as f64 / bps);
                free_at
            }
            None => now,
        };
        if tx.send((leaves + net.one_way, buf[..n].to_vec())).is_err() {
            break;
        }
    }
    drop(tx);
    let _ = writer.await;
}

// ---- watching the viewer ----

/// One damage notify: when, and the rects damaged.
type Damaged = (Instant, Vec<xproto::Rectangle>);

/// Damage on an X server (the viewer's, or the app's for the source's own rate): (when,
/// rects) per notify, recorded by a thread.
struct DamageLog {
    events: Arc<Mutex<Vec<Damaged>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl DamageLog {
    fn start(display: &str) -> Result<DamageLog> {
        let (conn, screen) = x11rb::connect(Some(display))
            .with_context(|| format!("cannot connect to the X display {display}"))?;
        let root = conn.setup().roots[screen].root;
        conn.damage_query_version(1, 1)?.reply()?;
        conn.xfixes_query_version(5, 0)?.reply()?;
        let dmg = conn.generate_id()?;
        let region = conn.generate_id()?;
        conn.damage_create(dmg, root, damage::ReportLevel::NON_EMPTY)?;
        conn.xfixes_create_region(region, &[])?;
        conn.flush()?;
        let events = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (e2, s2) = (events.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s2.load(Ordering::Relaxed) {
                match conn.poll_for_event() {
                    Ok(Some(Event::DamageNotify(_))) => {
                        let at = Instant::now();
                        let rects = conn
                            .damage_subtract(dmg, x11rb::NONE, region)
                            .ok()
                            .and_then(|_| conn.xfixes_fetch_region(region).ok())
                            .and_then(|c| c.reply().ok())
                            .map(|r| r.rectangles)
                            .unwrap_or_default();
                        if let Ok(mut e) = e2.lock() {
                            e.push((at, rects));
                        }
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => std::thread::sleep(Duration::from_micros(300)),
                    Err(_) => return,
                }
            }
        });
        Ok(DamageLog {
            events,
            stop,
            thread: Some(thread),
        })
    }

    fn snapshot(&self) -> Vec<Damaged> {
        self.events.lock().map(|e| e.clone()).unwrap_or_default()
    }

    /// Updates (damage bursts) between `from` and `to`.
    fn updates(&self, from: Instant, to: Instant) -> u64 {
        let mut n = 0;
        let mut last: Option<Instant> = None;
        for (at, _) in self.snapshot() {
            if at < from || at > to {
                continue;
            }
            if last.is_none_or(|l| at.duration_since(l) > BURST_GAP) {
                n += 1;
            }
            last = Some(at);
        }
        n
    }
}

impl Drop for DamageLog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn intersects(r: &xproto::Rectangle, (x, y, w, h): (u16, u16, u16, u16)) -> bool {
    let (rx, ry) = (i32::from(r.x), i32::from(r.y));
    rx < i32::from(x + w)
        && rx + i32::from(r.width) > i32::from(x)
        && ry < i32::from(y + h)
        && ry + i32::from(r.height) > i32::from(y)
}

/// The B, G, R of every pixel of a display's root window.
fn screenshot(display: &str) -> Result<Vec<u8>> {
    let (conn, screen) = x11rb::connect(Some(display))?;
    let root = conn.setup().roots[screen].root;
    let img = conn
        .get_image(
            xproto::ImageFormat::Z_PIXMAP,
            root,
            0,
            0,
            size().0,
            size().1,
            !0,
        )?
        .reply()?;
    Ok(img.data)
}

/// Differing pixels and PSNR (dB; infinite when identical) of two BGRX screenshots.
fn compare(a: &[u8], b: &[u8]) -> (u64, f64) {
    let mut diff = 0u64;
    let mut se = 0f64;
    for (p, q) in a.chunks_exact(4).zip(b.chunks_exact(4)) {
        if p[..3] != q[..3] {
            diff += 1;
        }
        for c in 0..3 {
            let d = f64::from(p[c]) - f64::from(q[c]);
            se += d * d;
        }
    }
    let mse = se / (a.len() / 4 * 3).max(1) as f64;
    let psnr = if mse == 0.0 {
        f64::INFINITY
    } else {
        10.0 * (255.0f64 * 255.0 / mse).log10()
    };
    (diff, psnr)
}

// ---- one peer's setup ----

/// The app side (server and its screen) and the viewer side, joined by the shaped link.
struct Setup {
    peer: Peer,
    app_display: String,
    viewer_display: String,
    /// Processes whose CPU counts as the app side's.
    app_pids: Vec<u32>,
    down: Arc<AtomicU64>,
    proxy: tokio::task::JoinHandle<()>,
    /// ndd's app side's stderr (its `--stats` lines).
    app_log: Option<PathBuf>,
    // Dropped last to first: viewer, then app side.
    _viewer: Vec<Killed>,
    _app: Vec<Killed>,
    _dir: Option<PathBuf>,
}

impl Drop for Setup {
    fn drop(&mut self) {
        self.proxy.abort();
        // The app side's --stats lines of the last row of each peer stay readable.
        if let Some(log) = &self.app_log {
            let keep = std::env::temp_dir().join(format!(
                "ndd-bench-app-{}.log",
                self.peer.name().replace(' ', "-")
            ));
            let _ = std::fs::copy(log, keep);
        }
        if let Some(d) = &self._dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

fn ndd_exe() -> Result<PathBuf> {
    super::ndd_exe()
}

fn ndd_ok(args: &[&str]) -> Result<String> {
    super::ndd_ok(&ndd_exe()?, args)
}

const NDD_DESKTOP: &str = r#"
driver = "bench-desktop"
[[stream]]
name = "screen"
direction = "app-to-device"
source = { type = "x11-screen", display = "APP", max_fps = 60 }
sink = { type = "x11-window", display = "VIEW", title = "ndd bench viewer" }
stack = [{ type = "image", quality = "auto" }]
[[stream]]
name = "input"
direction = "device-to-app"
source = { type = "x11-input", display = "VIEW", window = "viewer" }
sink = { type = "xtest", display = "APP" }
[[stream]]
name = "cursor"
direction = "app-to-device"
source = { type = "x11-cursor", display = "APP" }
sink = { type = "x11-cursor", display = "VIEW" }
"#;

impl Setup {
    async fn start(peer: Peer, net: Net) -> Result<Setup> {
        let down = Arc::new(AtomicU64::new(0));
        // With the kernel shaping, the viewer side reaches the proxy over the veth pair and
        // `tc tbf` is the rate; the proxy adds the latency only.
        let kernel = netns_active();
        let listener = if kernel {
            if let Ok(g) = NETNS.lock() {
                if let Some(ns) = g.as_ref() {
                    ns.shape(net.mbit)?;
                }
            }
            TcpListener::bind(format!("{}:0", Netns::HOST_IP)).await?
        } else {
            TcpListener::bind("127.0.0.1:0").await?
        };
        let front = listener.local_addr()?;
        let server_port = free_port()?;
        let upstream: SocketAddr = format!("127.0.0.1:{server_port}").parse()?;
        let proxied = if kernel {
            Net { mbit: None, ..net }
        } else {
            net
        };
        let proxy = tokio::spawn(shaped_proxy(listener, upstream, proxied, down.clone()));
        // The viewer side's programs: in the namespace when the kernel shapes.
        let viewer_cmd = |program: &Path| -> Command {
            match NETNS.lock().ok().as_ref().and_then(|g| g.as_ref()) {
                Some(ns) => ns.command(program),
                None => Command::new(program),
            }
        };
        let (vx, viewer_display) = start_xvfb()?;
        let mut viewer = vec![vx];
        let mut app = Vec::new();
        let mut app_pids = Vec::new();
        let mut dir = None;
        let mut app_log = None;
        let app_display;
        match peer {
            Peer::Vnc => {
                let port = server_port.to_string();
                let (x, d) = start_x(
                    "Xtigervnc",
                    &[
                        "-geometry",
                        &size_arg(),
                        "-depth",
                        "24",
                        "-SecurityTypes",
                        "None",
                        "-rfbport",
                        &port,
                        "-nolisten",
                        "tcp",
                        "-noreset",
                        "-AlwaysShared",
                    ],
                )?;
                app_pids.push(x.0.id());
                app.push(x);
                app_display = d;
                // The viewer gives up if the server is not listening yet.
                let t = Instant::now();
                while TcpStream::connect(upstream).await.is_err() {
                    if t.elapsed() > Duration::from_secs(10) {
                        bail!("Xtigervnc does not listen on {upstream}");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                let log = std::fs::File::create("/tmp/ndd-bench-vncviewer.log")?;
                viewer.push(
                    viewer_cmd(Path::new("vncviewer"))
                        .env("DISPLAY", &viewer_display)
                        .args(["-FullScreen", &format!("{}::{}", front.ip(), front.port())])
                        .stdin(Stdio::null())
                        .stdout(log.try_clone()?)
                        .stderr(log)
                        .spawn()
                        .map(Killed)
                        .context("cannot start vncviewer")?,
                );
            }
            Peer::Xpra | Peer::Rdp => {
                let (x, d) = start_xvfb()?;
                app.push(x);
                app_display = d;
                let name = if peer == Peer::Xpra {
                    "xpra"
                } else {
                    "freerdp"
                };
                let server_log =
                    std::fs::File::create(format!("/tmp/ndd-bench-{name}-server.log"))?;
                let mut server = if peer == Peer::Xpra {
                    let mut c = Command::new("xpra");
                    c.args(["shadow", &app_display, "--daemon=no", "--mdns=no"])
                        .arg(format!("--bind-tcp=127.0.0.1:{server_port}"))
                        .args(["--dbus-proxy=no", "--dbus-control=no", "--systemd-run=no"])
                        .args(XPRA_OFF);
                    c
                } else {
                    let mut c = Command::new("freerdp-shadow-cli");
                    c.arg(format!("/port:{server_port}"))
                        .arg("/bind-address:127.0.0.1")
                        .arg("-auth");
                    c
                };
                let server = server
                    .env("DISPLAY", &app_display)
                    .stdin(Stdio::null())
                    .stdout(server_log.try_clone()?)
                    .stderr(server_log)
                    .spawn()
                    .map(Killed)
                    .with_context(|| format!("cannot start the {} server", peer.name()))?;
                app_pids.push(server.0.id());
                app.push(server);
                // xpra takes a few seconds to start.
                let t = Instant::now();
                while TcpStream::connect(upstream).await.is_err() {
                    if t.elapsed() > Duration::from_secs(30) {
                        bail!(
                            "the {} server does not listen on {upstream} (see /tmp/ndd-bench-{name}-server.log)",
                            peer.name()
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                let log = std::fs::File::create(format!("/tmp/ndd-bench-{name}-viewer.log"))?;
                let mut client = if peer == Peer::Xpra {
                    let mut c = viewer_cmd(Path::new("xpra"));
                    c.arg("attach")
                        .arg(format!("tcp://{}:{}/", front.ip(), front.port()))
                        .args(["--tray=no", "--system-tray=no", "--opengl=no"])
                        .args(XPRA_OFF);
                    c
                } else {
                    let mut c = viewer_cmd(Path::new("xfreerdp"));
                    c.arg(format!("/v:{}:{}", front.ip(), front.port())).args([
                        "/cert:ignore",
                        "/f",
                        "/bpp:32",
                        "/gfx:AVC420",
                        "-grab-keyboard",
                    ]);
                    c
                };
                viewer.push(
                    client
                        .env("DISPLAY", &viewer_display)
                        .stdin(Stdio::null())
                        .stdout(log.try_clone()?)
                        .stderr(log)
                        .spawn()
                        .map(Killed)
                        .with_context(|| format!("cannot start the {} viewer", peer.name()))?,
                );
            }
            Peer::Ndd | Peer::NddHigh | Peer::NddTiles => {
                let (x, d) = start_xvfb()?;
                app_pids.push(x.0.id());
                app.push(x);
                app_display = d;
                let base = std::env::temp_dir().join(format!(
                    "ndd-bench-vnc-{}-{}",
                    std::process::id(),
                    server_port
                ));
                let (ah, vh) = (base.join("app"), base.join("view"));
                let (ahs, vhs) = (ah.display().to_string(), vh.display().to_string());
                let afp = ndd_ok(&["id", "--home", &ahs])?;
                let vfp = ndd_ok(&["id", "--home", &vhs])?;
                ndd_ok(&["trust", &vfp, "--name", "viewer", "--home", &ahs])?;
                ndd_ok(&["trust", &afp, "--name", "app", "--home", &vhs])?;
                let cfg = base.join("desktop.toml");
                std::fs::write(
                    &cfg,
                    NDD_DESKTOP
                        .replace("APP", &app_display)
                        .replace("VIEW", &viewer_display)
                        .replace(
                            "quality = \"auto\"",
                            match peer {
                                Peer::NddHigh => {
                                    "quality = \"high\", jpeg_quality = 92, codec = \"tiles\""
                                }
                                Peer::NddTiles => "quality = \"auto\", codec = \"tiles\"",
                                _ => "quality = \"auto\"",
                            },
                        ),
                )?;
                let log = base.join("app.log");
                let run = |side: &str, flag: &str, addr: String, home: &str| -> Result<Killed> {
                    let stderr = if side == "app" {
                        Stdio::from(std::fs::File::create(&log)?)
                    } else {
                        Stdio::null()
                    };
                    let exe = ndd_exe()?;
                    let mut cmd = if side == "device" {
                        viewer_cmd(&exe)
                    } else {
                        Command::new(&exe)
                    };
                    cmd.arg("run")
                        .arg(&cfg)
                        .args(["--side", side, flag, &addr, "--home", home, "--stats"])
                        .env("NDD_LOG", "error")
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .stderr(stderr)
                        .spawn()
                        .map(Killed)
                        .context("cannot start ndd")
                };
                app_log = Some(log.clone());
                let a = run("app", "--listen", upstream.to_string(), &ahs)?;
                app_pids.push(a.0.id());
                app.push(a);
                tokio::time::sleep(Duration::from_millis(300)).await;
                viewer.push(run("device", "--connect", front.to_string(), &vhs)?);
                dir = Some(base);
            }
        }
        let setup = Setup {
            peer,
            app_display,
            viewer_display,
            app_pids,
            down,
            proxy,
            app_log,
            _viewer: viewer,
            _app: app,
            _dir: dir,
        };
        setup.wait_mirrored().await?;
        Ok(setup)
    }

    /// Waits until the viewer shows the app's screen (a root background painted on the app
    /// side, identical on the viewer): a viewer that failed to connect would otherwise
    /// measure nothing.
    async fn wait_mirrored(&self) -> Result<()> {
        let _bg = spawn_on(&self.app_display, "xsetroot", &["-solid", "#336699"])?;
        let t = Instant::now();
        loop {
            let (a, v) = (
                screenshot(&self.app_display),
                screenshot(&self.viewer_display),
            );
            if let (Ok(a), Ok(v)) = (a, v) {
                let (differ, psnr) = compare(&a, &v);
                let shown = if self.peer.lossless_when_still() {
                    differ == 0
                } else {
                    psnr >= 30.0
                };
                if shown && a.get(..3) == Some(&[0x99, 0x66, 0x33][..]) {
                    return Ok(());
                }
            }
            if t.elapsed() > Duration::from_secs(30) {
                return Err(ViewerNeverShown(self.peer).into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn cpu(&self) -> f64 {
        self.app_pids.iter().map(|&p| cpu_secs(p)).sum()
    }
}

/// A peer's viewer did not show the app's screen within 30 s of starting.
#[derive(Debug)]
struct ViewerNeverShown(Peer);

impl std::fmt::Display for ViewerNeverShown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}'s viewer does not show the app's screen after 30 s (is it connected? see \
             /tmp/ndd-bench-*.log for the peers' output)",
            self.0.name()
        )
    }
}

impl std::error::Error for ViewerNeverShown {}

/// Measures a row with `measure`; another tool whose viewer never showed the screen is tried
/// once more, then its row is left out (said, and listed in `skipped`): xpra's and FreeRDP's
/// viewers now and then never connect on their second start of a run on this 2-core machine.
/// Any other failure, and every one of ndd's, stops the run.
async fn or_left_out<T, F, Fut>(
    peer: Peer,
    row: &str,
    skipped: &mut Vec<String>,
    mut measure: F,
) -> Result<Option<T>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let flaky =
        |e: &anyhow::Error| peer != Peer::Ndd && e.downcast_ref::<ViewerNeverShown>().is_some();
    match measure().await {
        Ok(r) => return Ok(Some(r)),
        Err(e) if !flaky(&e) => return Err(e),
        Err(e) => eprintln!("  {} {row}: {e:#}; trying once more", peer.name()),
    }
    match measure().await {
        Ok(r) => Ok(Some(r)),
        Err(e) if !flaky(&e) => Err(e),
        Err(e) => {
            eprintln!("  {} {row}: left out: {e:#}", peer.name());
            skipped.push(format!(
                "- {} on {row}: not measured, twice: {e:#}",
                peer.name()
            ));
            Ok(None)
        }
    }
}

// ---- the measurements ----

#[derive(Debug, Clone)]
struct RateRow {
    workload: Workload,
    net: Net,
    peer: Peer,
    fps: f64,
    /// Updates a second on the app's own screen, in the same window (the most a viewer can
    /// show).
    source_fps: f64,
    cpu_fps: f64,
    mbit_per_frame: f64,
    mbit_s: f64,
    /// ndd: the JPEG quality `auto` was at when the window ended.
    jpeg_q: Option<u32>,
    /// The video: the viewer's pictures against the frames they show, and the app screen's
    /// own (the baseline: equal to the frames unless the measurement is wrong).
    quality: Option<(frames::Quality, frames::Quality)>,
}

/// Pictures of both screens taken after the rate window for SSIM and PSNR (4 in a smoke run).
const QUALITY_PICTURES: usize = 12;

/// Takes `n` pictures of `display`'s screen, `every` apart.
async fn pictures(display: &str, n: usize, every: Duration) -> Result<Vec<Vec<u8>>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(screenshot(display)?);
        tokio::time::sleep(every).await;
    }
    Ok(out)
}

/// The moving picture's quality at the viewer and at the app screen (after the rate window,
/// so that taking pictures does not weigh on the frame rate measured).
async fn measure_quality(
    s: &Setup,
    n: usize,
    grain: u8,
    rect: (u16, u16, u16, u16),
) -> Result<(frames::Quality, frames::Quality)> {
    let (_, _, w, h) = rect;
    let every = Duration::from_millis(230);
    let crop = |p: Vec<Vec<u8>>| -> Vec<Vec<u8>> {
        p.iter().map(|s| crop_bgrx(s, size().0, rect)).collect()
    };
    let viewer = crop(pictures(&s.viewer_display, n, every).await?);
    let app = crop(pictures(&s.app_display, n, Duration::from_millis(50)).await?);
    let v = frames::score(w, h, grain, &viewer)?;
    let a = frames::score(w, h, grain, &app)?;
    Ok((v, a))
}

/// The rectangle `(left, top, width, height)` of a BGRX picture `stride` pixels wide.
fn crop_bgrx(picture: &[u8], stride: u16, rect: (u16, u16, u16, u16)) -> Vec<u8> {
    let (x, y, w, h) = (
        usize::from(rect.0),
        usize::from(rect.1),
        usize::from(rect.2),
        usize::from(rect.3),
    );
    let stride = usize::from(stride);
    let mut out = Vec::with_capacity(w * h * 4);
    for row in y..y + h {
        let from = (row * stride + x) * 4;
        match picture.get(from..from + w * 4) {
            Some(line) => out.extend_from_slice(line),
            None => out.resize(out.len() + w * 4, 0),
        }
    }
    out
}

/// The JPEG quality in the last `--stats` line of ndd's app side (`image low q45 …`).
fn last_jpeg_quality(log: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines().rev().find_map(|l| {
        let after = l.split("  image ").nth(1)?;
        after
            .split_whitespace()
            .find_map(|w| w.strip_prefix('q')?.parse().ok())
    })
}

async fn measure_rate(peer: Peer, workload: Workload, net: Net, secs: f64) -> Result<RateRow> {
    if let (Some((_, _, w, h)), Some(grain)) = (workload.video_rect(), workload.grain()) {
        render_clips(vec![(w, h, grain)]).await?;
    }
    let s = Setup::start(peer, net).await?;
    let _work = workload.start(&s.app_display)?;
    let log = DamageLog::start(&s.viewer_display)?;
    // The baseline: the updates on the app's own screen in the same window.
    let source = DamageLog::start(&s.app_display)?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (t0, b0, c0) = (Instant::now(), s.down.load(Ordering::Relaxed), s.cpu());
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    let (t1, b1, c1) = (Instant::now(), s.down.load(Ordering::Relaxed), s.cpu());
    let jpeg_q = s.app_log.as_deref().and_then(last_jpeg_quality);
    let updates = log.updates(t0, t1);
    let source_updates = source.updates(t0, t1);
    drop(source);
    let quality = if let (Some(grain), Some(rect)) = (workload.grain(), workload.video_rect()) {
        let n = if secs < 5.0 { 4 } else { QUALITY_PICTURES };
        Some(measure_quality(&s, n, grain, rect).await?)
    } else {
        None
    };
    if tracing::enabled!(tracing::Level::DEBUG) {
        // How far apart the viewer's damage events came (3 ms bins, the last one 33 ms and
        // more): bursts closer than BURST_GAP count as one update.
        let at: Vec<Instant> = log
            .snapshot()
            .into_iter()
            .map(|(a, _)| a)
            .filter(|a| (t0..=t1).contains(a))
            .collect();
        let mut bins = [0u32; 12];
        for w in at.windows(2) {
            let ms = w[1].duration_since(w[0]).as_secs_f64() * 1000.0;
            bins[((ms / 3.0) as usize).min(11)] += 1;
        }
        tracing::debug!(peer = ?peer, events = at.len(), ?bins, "viewer damage spacing");
    }
    let el = t1.duration_since(t0).as_secs_f64();
    let mbit = (b1 - b0) as f64 * 8.0 / 1e6;
    let row = RateRow {
        workload,
        net,
        peer: s.peer,
        fps: updates as f64 / el,
        source_fps: source_updates as f64 / el,
        cpu_fps: if c1 > c0 {
            updates as f64 / (c1 - c0)
        } else {
            0.0
        },
        mbit_per_frame: if updates > 0 {
            mbit / updates as f64
        } else {
            0.0
        },
        mbit_s: mbit / el,
        jpeg_q,
        quality,
    };
    eprintln!(
        "  {:<9} {:<34} {:<18} {:6.1} fps (source {:.1})  {:7.1} fps/CPU-s  {:6.3} Mbit/frame  {:6.2} Mbit/s{}{}",
        row.peer.name(),
        row.workload.name(),
        row.net.name,
        row.fps,
        row.source_fps,
        row.cpu_fps,
        row.mbit_per_frame,
        row.mbit_s,
        row.jpeg_q.map_or(String::new(), |q| format!("  JPEG q{q}")),
        row.quality.map_or(String::new(), |(v, a)| format!(
            "  SSIM {} PSNR {} (app screen: SSIM {})",
            ssim_cell(&v),
            psnr_cell(&v),
            ssim_cell(&a)
        ))
    );
    Ok(row)
}

#[derive(Debug, Clone)]
struct StillRow {
    net: Net,
    peer: Peer,
    at_1s: (u64, f64),
    at_2_5s: (u64, f64),
}

async fn measure_still(peer: Peer, net: Net) -> Result<StillRow> {
    let s = Setup::start(peer, net).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let _still = spawn_on(
        &s.app_display,
        "ffplay",
        &ffplay_args("testsrc2=size=800x600:rate=5:duration=0.4", 0),
    )?;
    // The picture is up once the app screen has changed and then stops changing. (Stable
    // alone is not enough: a slow ffplay start left the screen as it was for 300 ms, and the
    // first row then compared the viewer with the screen from before the picture.)
    let start = Instant::now();
    let mut prev = screenshot(&s.app_display)?;
    let mut stable_since = Instant::now();
    let mut changed = false;
    while start.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = screenshot(&s.app_display)?;
        if now != prev {
            stable_since = Instant::now();
            prev = now;
            changed = true;
        } else if changed && stable_since.elapsed() > Duration::from_millis(300) {
            break;
        }
    }
    let shown = stable_since;
    let at = |t: f64| shown + Duration::from_secs_f64(t);
    tokio::time::sleep_until(at(1.0).into()).await;
    let r1 = compare(&prev, &screenshot(&s.viewer_display)?);
    tokio::time::sleep_until(at(2.5).into()).await;
    let r2 = compare(&prev, &screenshot(&s.viewer_display)?);
    eprintln!(
        "  {:<9} still picture {:<18} after 1 s: {} px differ ({:.1} dB); after 2.5 s: {} px ({:.1} dB)",
        peer.name(),
        net.name,
        r1.0,
        r1.1,
        r2.0,
        r2.1
    );
    Ok(StillRow {
        net,
        peer,
        at_1s: r1,
        at_2_5s: r2,
    })
}

#[derive(Debug, Clone)]
struct TypingRow {
    net: Net,
    peer: Peer,
    video: bool,
    times_ms: Vec<f64>,
    keys: usize,
}

/// Where the typing rows' video plays: below the xterm.
fn typing_video_rect() -> (u16, u16, u16, u16) {
    let (w, h) = size();
    (0, 300, w, h.saturating_sub(300).max(16))
}

async fn measure_typing(peer: Peer, net: Net, video: bool, keys: usize) -> Result<TypingRow> {
    let (_, _, vw, vh) = typing_video_rect();
    if video {
        render_clips(vec![(vw, vh, 12)]).await?;
    }
    let s = Setup::start(peer, net).await?;
    let mut work = vec![Running::Proc(spawn_on(
        &s.app_display,
        "xterm",
        &["-geometry", "80x12+0+0", "-e", "sh"],
    )?)];
    if video {
        work.push(self::video(&s.app_display, typing_video_rect(), 12)?);
    }
    // The keyboard focus to the window under the pointer (the xterm), as a user clicking
    // there would with a window manager (ffplay, which played the video before, took it).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    {
        let (app, _) = x11rb::connect(Some(&s.app_display))?;
        app.set_input_focus(
            xproto::InputFocus::POINTER_ROOT,
            xproto::InputFocus::POINTER_ROOT,
            x11rb::CURRENT_TIME,
        )?
        .check()?;
    }
    let log = DamageLog::start(&s.viewer_display)?;
    let (conn, screen) = x11rb::connect(Some(&s.viewer_display))?;
    let root = conn.setup().roots[screen].root;
    tokio::time::sleep(Duration::from_secs(3)).await;
    // The pointer over the xterm (in the viewer, so on the app side too).
    conn.xtest_fake_input(xproto::MOTION_NOTIFY_EVENT, 0, 0, root, 100, 60, 0)?;
    conn.flush()?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let keycode = {
        let map = conn
            .get_keyboard_mapping(conn.setup().min_keycode, 200)?
            .reply()?;
        let per = usize::from(map.keysyms_per_keycode);
        map.keysyms
            .chunks(per.max(1))
            .position(|k| k.first() == Some(&0x78)) // 'x'
            .map(|i| conn.setup().min_keycode + i as u8)
            .context("no keycode for 'x' on the viewer display")?
    };
    let mut times = Vec::new();
    for _ in 0..keys {
        let t0 = Instant::now();
        conn.xtest_fake_input(xproto::KEY_PRESS_EVENT, keycode, 0, root, 0, 0, 0)?;
        conn.xtest_fake_input(xproto::KEY_RELEASE_EVENT, keycode, 0, root, 0, 0, 0)?;
        conn.sync()?;
        // The echo: damage in the xterm's area; the last of it once 400 ms pass quietly.
        let deadline = t0 + Duration::from_secs(3);
        let mut last = None;
        loop {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let now = Instant::now();
            last = log
                .snapshot()
                .into_iter()
                .filter(|(at, rects)| *at > t0 && rects.iter().any(|r| intersects(r, XTERM_AREA)))
                .map(|(at, _)| at)
                .next_back()
                .or(last);
            let quiet = last.is_some_and(|l| now.duration_since(l) > Duration::from_millis(400));
            if quiet || now > deadline {
                break;
            }
        }
        if let Some(l) = last {
            times.push(l.duration_since(t0).as_secs_f64() * 1e3);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let row = TypingRow {
        net,
        peer,
        video,
        times_ms: times,
        keys,
    };
    eprintln!(
        "  {:<9} typing {:<18} {:<12} echo median {:.0} ms, {} of {} echoed",
        peer.name(),
        net.name,
        if video { "with video" } else { "alone" },
        median(&row.times_ms),
        row.times_ms.len(),
        keys
    );
    Ok(row)
}

fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
}

// ---- the report ----

/// The programs missing here, with the Debian packages they come in.
fn missing_programs(peers: &[PeerName]) -> Vec<(&'static str, &'static str)> {
    [
        ("Xvfb", "xvfb"),
        ("xsetroot", "x11-xserver-utils"),
        ("ffplay", "ffmpeg"),
        ("xterm", "xterm"),
        ("glxgears", "mesa-utils"),
    ]
    .into_iter()
    .chain(peers.iter().flat_map(|p| p.needs().iter().copied()))
    .filter(|(p, _)| !ndd_procs::have(p))
    .collect()
}

/// What `ndd bench display --vs-vnc` was asked.
#[derive(Debug)]
pub struct Options {
    /// A smoke run.
    pub quick: bool,
    /// Shape in the proxy, not with `tc` in a network namespace.
    pub no_netns: bool,
    /// Only the typing rows, with this many keys.
    pub typing_only: Option<usize>,
    /// Only this workload's frame-rate rows.
    pub workload: Option<Workload>,
    /// Both screens' size.
    pub screen: (u16, u16),
    /// The peers, in order.
    pub peers: Vec<PeerName>,
    /// Each frame-rate row this many times.
    pub repeat: u32,
    /// Where the report goes.
    pub out: PathBuf,
}

/// Runs the comparison and writes `display-vnc.md` and `display-vnc.svg` into `out`.
pub async fn run(o: Options) -> Result<()> {
    let Options {
        quick,
        no_netns,
        typing_only,
        workload,
        screen,
        ref peers,
        repeat,
        ref out,
    } = o;
    let out = out.as_path();
    let _ = SIZE.set(screen);
    let missing = missing_programs(peers);
    if !missing.is_empty() {
        let programs: Vec<&str> = missing.iter().map(|(p, _)| *p).collect();
        let mut packages: Vec<&str> = missing.iter().map(|(_, d)| *d).collect();
        packages.dedup();
        bail!(
            "bench display --vs-vnc needs {} (apt-get install {}, or ./run bench display --vs-vnc)",
            programs.join(", "),
            packages.join(" ")
        );
    }
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    // The kernel shapes the rate when it can (root, ip, tc); otherwise the proxy does.
    if !no_netns {
        match Netns::create() {
            Ok(ns) => {
                eprintln!(
                    "rate: tc tbf on a veth pair, the viewer side in network namespace {}",
                    Netns::NAME
                );
                if let Ok(mut g) = NETNS.lock() {
                    *g = Some(ns);
                }
            }
            Err(e) => eprintln!(
                "rate: the in-process proxy (no network namespace: {e:#}; run as root with ip and tc)"
            ),
        }
    }
    let secs = match (quick, workload) {
        (true, _) => 2.0,
        (false, Some(_)) => 20.0,
        (false, None) => 6.0,
    };
    let keys = typing_only.unwrap_or(if quick { 3 } else { 12 });
    let (nets, workloads): (Vec<Net>, Vec<Workload>) = if typing_only.is_some() {
        (Vec::new(), Vec::new())
    } else if let Some(w) = workload {
        // NDD_BENCH_NETS=2 (indices into 0 ms, 50 ms, 50 ms + 20 Mbit/s): some networks only.
        let pick: Vec<Net> = std::env::var("NDD_BENCH_NETS")
            .ok()
            .map(|v| {
                v.split(',')
                    .filter_map(|i| NETS.get(i.trim().parse::<usize>().ok()?).copied())
                    .collect()
            })
            .filter(|v: &Vec<Net>| !v.is_empty())
            .unwrap_or_else(|| NETS.to_vec());
        (pick, vec![w])
    } else if quick {
        (vec![NETS[2]], vec![Workload::Video])
    } else {
        (
            NETS.to_vec(),
            vec![
                Workload::Video,
                Workload::Film,
                Workload::Text,
                Workload::Gears,
                Workload::Page,
            ],
        )
    };
    let peers: Vec<Peer> = peers.iter().map(|p| p.peer()).collect();
    eprintln!("frame rate and bytes per frame ({secs} s per row):");
    let mut rates = Vec::new();
    // Rows of other tools that could not be measured: said in the report, the run goes on.
    let mut skipped: Vec<String> = Vec::new();
    for &w in &workloads {
        for &n in &nets {
            for &p in &peers {
                for _ in 0..repeat {
                    let row = format!("{} at {}", w.name(), n.name);
                    let r = or_left_out(p, &row, &mut skipped, || measure_rate(p, w, n, secs));
                    rates.extend(r.await?);
                }
            }
            if w == Workload::Video && !quick && repeat == 1 && peers.contains(&Peer::Ndd) {
                rates.push(measure_rate(Peer::NddTiles, w, n, secs).await?);
                rates.push(measure_rate(Peer::NddHigh, w, n, secs).await?);
            }
        }
    }
    let partial = typing_only.is_some() || workload.is_some();
    eprintln!("quality on a still picture:");
    let mut stills = Vec::new();
    for &n in nets.iter().filter(|_| workload.is_none()) {
        for &p in &peers {
            let row = format!("the still picture at {}", n.name);
            stills.extend(or_left_out(p, &row, &mut skipped, || measure_still(p, n)).await?);
        }
    }
    eprintln!("typing: key → echo in the viewer ({keys} keys per row):");
    let mut typing = Vec::new();
    let typing_nets: Vec<Net> = if workload.is_some() {
        Vec::new()
    } else if quick || typing_only.is_some() {
        vec![NETS[2]]
    } else {
        NETS.to_vec()
    };
    for &n in &typing_nets {
        // --typing-only: the row the race is about (a video playing beside the xterm).
        let videos: &[bool] = if typing_only.is_some() {
            &[true]
        } else {
            &[false, true]
        };
        for &video in videos {
            for &p in &peers {
                let row = format!("typing at {}", n.name);
                let r = or_left_out(p, &row, &mut skipped, || measure_typing(p, n, video, keys));
                typing.extend(r.await?);
            }
        }
    }
    let kernel = netns_active();
    let mut md = report(quick, kernel, &rates, &stills, &typing);
    if !skipped.is_empty() {
        md.push_str("\n## Rows left out\n\n");
        md.push_str(&skipped.join("\n"));
        md.push('\n');
    }
    if repeat > 1 {
        md.push_str(&repeated(&rates, repeat));
    }
    if let Ok(mut g) = NETNS.lock() {
        g.take();
    }
    if partial {
        // A partial run does not overwrite the whole report.
        let name = match workload {
            Some(w) => format!(
                "display-vnc-{}.md",
                clap::ValueEnum::to_possible_value(&w)
                    .map_or("workload".to_string(), |v| v.get_name().to_string())
            ),
            None => "display-vnc-typing.md".to_string(),
        };
        let path = out.join(name);
        std::fs::write(&path, md).with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("wrote {}", path.display());
        return Ok(());
    }
    let path = out.join("display-vnc.md");
    std::fs::write(&path, md).with_context(|| format!("cannot write {}", path.display()))?;
    let svg = out.join("display-vnc.svg");
    std::fs::write(&svg, plot(&rates))
        .with_context(|| format!("cannot write {}", svg.display()))?;
    eprintln!("wrote {} and {}", path.display(), svg.display());
    Ok(())
}

fn report(
    quick: bool,
    kernel: bool,
    rates: &[RateRow],
    stills: &[StillRow],
    typing: &[TypingRow],
) -> String {
    let mut s = String::new();
    let present = |p: Peer| {
        rates.iter().any(|r| r.peer == p)
            || stills.iter().any(|r| r.peer == p)
            || typing.iter().any(|r| r.peer == p)
    };
    let others: Vec<&str> = [Peer::Vnc, Peer::Xpra, Peer::Rdp]
        .into_iter()
        .filter(|&p| present(p))
        .map(Peer::name)
        .collect();
    let _ = writeln!(s, "# Remote display: ndd vs {}\n", others.join(", "));
    let _ = writeln!(
        s,
        "Hardware: {}. Date: {}. Command: `ndd bench display --vs-vnc{}`.\n",
        hardware(),
        today(),
        if quick { " --quick" } else { "" }
    );
    let (w, h) = size();
    let _ = writeln!(
        s,
        "Every peer shows the same {w}x{h}x24 screen on a second X server (Xvfb, {w}x{h}): \
         **TigerVNC** 1.12 from Debian (`Xtigervnc -SecurityTypes None`, `vncviewer -FullScreen`, \
         default encoding: Tight with automatic quality) and **ndd** (two `ndd` processes over \
         TLS: `x11-screen` (max_fps 60) → `image` (quality auto) → `x11-window`, plus the input \
         stream). {} Everything is counted from \
         outside both programs: **fps** = updates drawn on the viewer's X server (DAMAGE \
         bursts more than 12 ms apart: a viewer draws one update's rects as it decodes them); **Mbit/frame** = bytes the proxy carried towards the \
         viewer per update; **source fps** = updates on the app's own screen in the same \
         window (the most a viewer can show); **CPU-limited fps** = updates per CPU-second of the app side \
         (Xtigervnc, which is both X server and encoder; for ndd the app's Xvfb plus the `ndd` \
         app process; for xpra and FreeRDP the app's Xvfb plus their shadow server). The test \
         videos are rendered once by ffmpeg and drawn 30 times a second with `ShmPutImage` \
         from the rendered file, looping every 3 s (less above 2560x1440; ffplay rendering \
         them live took most of the two cores at 2560x1440). 3 s of \
         warm-up, then the measured window.{}\n",
        if kernel {
            "The viewer side (vncviewer, or ndd's device side) runs in a network namespace \
             joined to the server side by a veth pair; the rate is the kernel's `tc tbf` on \
             both ends of the pair (queue 100 ms), and a proxy on the server side holds every \
             chunk for the one-way latency in each direction (netem is absent on this kernel)."
        } else {
            "Between viewer and server a proxy on loopback holds every chunk for the one-way \
             latency in each direction and, with a rate, serialises it at that rate behind a \
             queue of at most 100 ms (netem is absent on this kernel; run as root with `ip` and \
             `tc` for the kernel's `tc tbf` instead)."
        },
        if present(Peer::Xpra) || present(Peer::Rdp) {
            " **xpra** 3.1.3 from Debian: `xpra shadow` of the app's Xvfb (automatic \
             encoding: H.264 through x264 for what it takes for video, picture codecs \
             elsewhere) and `xpra attach`, both with `--mmap=no` (or the client reads the \
             server's memory and bypasses the network). **FreeRDP** 2.11 from Debian: \
             `freerdp-shadow-cli` of the app's Xvfb and `xfreerdp /f /gfx:AVC420` (the \
             graphics pipeline in H.264 through x264). Both code a still screen in H.264 \
             too, so their viewers come near the app's screen, not equal to it."
        } else {
            ""
        }
    );
    let _ = writeln!(s, "## Frame rate and bytes per frame\n");
    let _ = writeln!(
        s,
        "| workload | network | peer | fps | source fps | CPU-limited fps | Mbit/frame | Mbit/s | ndd JPEG quality at the end | SSIM (lowest) | PSNR | frames read |"
    );
    let _ = writeln!(
        s,
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for r in rates {
        let (ssim, psnr, read) = match &r.quality {
            Some((v, _)) => (
                ssim_cell(v),
                psnr_cell(v),
                format!("{} of {} ({} distinct)", v.read, v.pictures, v.distinct),
            ),
            None => Default::default(),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.1} | {:.1} | {:.0} | {:.3} | {:.2} | {} | {ssim} | {psnr} | {read} |",
            r.workload.name(),
            r.net.name,
            r.peer.name(),
            r.fps,
            r.source_fps,
            r.cpu_fps,
            r.mbit_per_frame,
            r.mbit_s,
            r.jpeg_q.map_or(String::new(), |q| format!("q{q}"))
        );
    }
    let baseline: Vec<String> = rates
        .iter()
        .filter_map(|r| r.quality.map(|(_, a)| ssim_cell(&a)))
        .collect();
    if !baseline.is_empty() {
        let _ = writeln!(
            s,
            "\n**SSIM and PSNR** of the moving picture: after each video row's window, {} \
             pictures of the viewer's screen are read off its X server (230 ms apart); each shows \
             the number of the frame it is of, burnt into the video as a stripe of 16x16 \
             black and white blocks along the top (the number, then its inverse: a torn or \
             smeared stripe reads as none), and ffmpeg renders that frame again from the same \
             filter graph (its noise has a fixed seed) to compare with. Luma SSIM (8x8 windows \
             every 4 pixels), PSNR over B, G, R, the stripe's rows left out. The baseline, taken \
             the same way from the app's own screen in the same rows: SSIM {} (1.0000 = the \
             app's screen equals the rendered frames bit for bit).",
            if quick { 4 } else { QUALITY_PICTURES },
            baseline.join(", ")
        );
    }
    let _ = writeln!(s, "\n![fps by workload and network](display-vnc.svg)\n");
    let _ = writeln!(s, "{}", targets(rates, stills, typing));
    s.push_str(PUBLISHED);
    let _ = writeln!(s, "## Quality on still content\n");
    let _ = writeln!(
        s,
        "A still `testsrc2` picture (gradients, many colours) fills the app screen; the viewer's \
         screen is compared with it 1 s and 2.5 s after the picture stopped changing. PSNR over \
         B, G, R; `inf` = identical.\n"
    );
    let _ = writeln!(
        s,
        "| network | peer | differing pixels at 1 s | PSNR at 1 s | differing pixels at 2.5 s | PSNR at 2.5 s |"
    );
    let _ = writeln!(s, "|---|---|---:|---:|---:|---:|");
    for r in stills {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.1} | {} | {:.1} |",
            r.net.name,
            r.peer.name(),
            r.at_1s.0,
            r.at_1s.1,
            r.at_2_5s.0,
            r.at_2_5s.1
        );
    }
    let _ = writeln!(s, "\n## Responsiveness (seed 004)\n");
    let _ = writeln!(
        s,
        "A key typed with XTEST into the viewer → the last damage its echo causes in the \
         viewer's xterm area (a shell in an 80x12 xterm at the top left; the next key 200 ms \
         after the echo settled). With video: the noisy test video plays in the 800x300 below \
         the xterm.\n"
    );
    let _ = writeln!(
        s,
        "| network | video beside it | peer | echo median ms | min | max | echoed |"
    );
    let _ = writeln!(s, "|---|---|---|---:|---:|---:|---:|");
    for r in typing {
        let min = r.times_ms.iter().copied().fold(f64::INFINITY, f64::min);
        let max = r.times_ms.iter().copied().fold(0.0, f64::max);
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.0} | {:.0} | {:.0} | {} of {} |",
            r.net.name,
            if r.video { "yes" } else { "no" },
            r.peer.name(),
            median(&r.times_ms),
            min,
            max,
            r.times_ms.len(),
            r.keys
        );
    }
    s
}

/// The published figures this comparison reproduces, for reading ours next to them.
const PUBLISHED: &str = "## Published figures, for comparison

**Dissertation (seed 003), Tables 6.4 and 6.5** (video card networked device driver vs Tight \
VNC, a 24 fps video, LAN, inter-frame times in µs; fps = 10^6 / time):

| pixels per frame | VNC µs (fps) | NDD µs (fps) | NDD with compression µs (fps) |
|---:|---:|---:|---:|
| 55 480 (VNC) / 66 000 (NDD) | 44 500 (22.5) | 18 040 (55.4) | 25 275 (39.6) |
| 297 620 (VNC) / 312 000 (NDD) | 127 290 (7.9) | 87 434 (11.4) | 105 541 (9.5) |
| 404 672 (VNC) / 420 000 (NDD) | 167 625 (6.0) | 132 071 (7.6) | 184 731 (5.4) |
| 627 935 (VNC) / 560 000 (NDD) | 246 812 (4.1) | 190 754 (5.2) | 285 813 (3.5) |

The dissertation's frames are 0.06–0.63 Mpixel; the rows above say their own size in the \
first paragraph (800x600 is 0.48 Mpixel, 1920x1080 2.07).

**Seed 000** (VirtualGL/TurboVNC study, GLXSpheres 1240x900 = 1.1 Mpixel, 100 Mbit/s LAN):

| proxy | actual fps | CPU-limited fps | Mbit/frame |
|---|---:|---:|---:|
| TurboVNC 0.4, JPEG 4:4:4 Q95 | 28.44 | 42.45 | 2.16 |
| TurboVNC 0.4, JPEG 4:2:2 Q80 | 36.42 | 50.09 | 1.00 |
| TightVNC 1.3.9, JPEG Q80 | 13.73 | 23.27 | 0.94 |
| RealVNC 4.1.2, ZRLE | 8.15 | 14.02 | 4.74 |
| TurboVNC 4:2:0 Q30 (frame size only) | | | 0.57 |

Per pixel, seed 000's Q95 frame is 1.9 bit/pixel, its Q80 frame 0.90 and its Q30 frame 0.51; \
divide the Mbit/frame above by the screen's Mpixel for ours (0.48 at 800x600) (noise costs JPEG far more than \
GLXSpheres' smooth shading).

";

/// Rows measured `repeat` times: worst and median frame rate of each, and the runs under
/// 80 % of the median (issue 33's "20 runs in a row").
fn repeated(rates: &[RateRow], repeat: u32) -> String {
    let mut s = format!(
        "\n## {repeat} runs of each row in a row\n\n| workload | network | peer | fps worst / median / best | runs under 80 % of the median | Mbit/frame worst / median | SSIM worst / median |\n|---|---|---|---:|---:|---:|---:|\n"
    );
    let mut seen: Vec<(Workload, &str, Peer)> = Vec::new();
    for r in rates {
        let key = (r.workload, r.net.name, r.peer);
        if seen.contains(&key) {
            continue;
        }
        seen.push(key);
        let rows: Vec<&RateRow> = rates
            .iter()
            .filter(|q| (q.workload, q.net.name, q.peer) == key)
            .collect();
        let fps: Vec<f64> = rows.iter().map(|q| q.fps).collect();
        let mid = median(&fps);
        let under = fps.iter().filter(|&&f| f < 0.8 * mid).count();
        let worst = fps.iter().copied().fold(f64::INFINITY, f64::min);
        let best = fps.iter().copied().fold(0.0, f64::max);
        let mbit: Vec<f64> = rows.iter().map(|q| q.mbit_per_frame).collect();
        let ssim: Vec<f64> = rows
            .iter()
            .filter_map(|q| {
                q.quality
                    .filter(|(v, _)| v.read > 0)
                    .map(|(v, _)| v.ssim_mean)
            })
            .collect();
        let ssim_cell = if ssim.is_empty() {
            String::new()
        } else {
            format!(
                "{:.4} / {:.4}",
                ssim.iter().copied().fold(f64::INFINITY, f64::min),
                median(&ssim)
            )
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {worst:.1} / {mid:.1} / {best:.1} | {under} of {} | {:.3} / {:.3} | {ssim_cell} |",
            r.workload.name(),
            r.net.name,
            r.peer.name(),
            rows.len(),
            mbit.iter().copied().fold(0.0, f64::max),
            median(&mbit)
        );
    }
    s
}

/// SSIM of a quality row: mean (lowest).
fn ssim_cell(q: &frames::Quality) -> String {
    if q.read == 0 {
        "no frame read".to_string()
    } else {
        format!("{:.4} ({:.4})", q.ssim_mean, q.ssim_min)
    }
}

/// Mean PSNR of a quality row.
fn psnr_cell(q: &frames::Quality) -> String {
    if q.read == 0 {
        String::new()
    } else {
        format!("{:.1} dB", q.psnr_mean)
    }
}

/// The issue's targets at 50 ms + 20 Mbit/s, each met or missed, with the figures.
fn targets(rates: &[RateRow], stills: &[StillRow], typing: &[TypingRow]) -> String {
    let slow = NETS[2];
    let mut s = String::from("## Targets at 50 ms + 20 Mbit/s\n\n");
    let verdict = |ok: bool| if ok { "met" } else { "**missed**" };
    let find = |w: Workload, p: Peer| {
        rates
            .iter()
            .find(|r| r.workload == w && r.net == slow && r.peer == p)
    };
    for w in [Workload::Video, Workload::Film, Workload::Page] {
        let Some((q, n)) = find(w, Peer::Ndd).and_then(|r| Some((r.quality?.0, r))) else {
            continue;
        };
        let _ = writeln!(
            s,
            "- {}: ≥ 30 frames/s {}, SSIM ≥ 0.95 {} ({:.1} fps at SSIM {}, {:.3} Mbit/frame)",
            w.name(),
            verdict(n.fps >= 29.5),
            if q.read == 0 {
                "n/a (no frame number read: a screen under 640 pixels wide)"
            } else {
                verdict(q.ssim_mean >= 0.95)
            },
            n.fps,
            ssim_cell(&q),
            n.mbit_per_frame
        );
        for p in [Peer::Vnc, Peer::Xpra, Peer::Rdp] {
            if let Some((o, r)) = find(w, p).and_then(|r| Some((r.quality?.0, r))) {
                let _ = writeln!(
                    s,
                    "  - against {}: {:.1} vs {:.1} fps, SSIM {} vs {}, {:.3} vs {:.3} Mbit/frame",
                    p.name(),
                    n.fps,
                    r.fps,
                    ssim_cell(&q),
                    ssim_cell(&o),
                    n.mbit_per_frame,
                    r.mbit_per_frame
                );
            }
        }
    }
    for w in [
        Workload::Video,
        Workload::Film,
        Workload::Text,
        Workload::Gears,
        Workload::Page,
    ] {
        if let (Some(n), Some(v)) = (find(w, Peer::Ndd), find(w, Peer::Vnc)) {
            let _ = writeln!(
                s,
                "- {}: fps ≥ TigerVNC's: {} ({:.1} vs {:.1}); Mbit/frame ≤ TigerVNC's: {} ({:.3} vs {:.3})",
                w.name(),
                verdict(n.fps >= v.fps),
                n.fps,
                v.fps,
                verdict(n.mbit_per_frame <= v.mbit_per_frame),
                n.mbit_per_frame,
                v.mbit_per_frame
            );
        }
    }
    let echo = |p: Peer| {
        typing
            .iter()
            .find(|t| t.net == slow && t.video && t.peer == p)
            .map(|t| median(&t.times_ms))
    };
    if let (Some(n), Some(v)) = (echo(Peer::Ndd), echo(Peer::Vnc)) {
        // One round trip plus two frame intervals of the 30 fps video.
        let bound = 2.0 * slow.one_way.as_secs_f64() * 1e3 + 2.0 * 1000.0 / 30.0;
        let _ = writeln!(
            s,
            "- typing echo with a video playing ≤ TigerVNC's: {} ({n:.0} vs {v:.0} ms); ≤ RTT + 2 frame intervals ({bound:.0} ms): {}",
            verdict(n <= v),
            verdict(n <= bound)
        );
    }
    if let (Some(h), Some(v)) = (
        find(Workload::Video, Peer::NddHigh),
        find(Workload::Video, Peer::Vnc),
    ) {
        let _ = writeln!(
            s,
            "- video at equal quality (ndd at JPEG Q92 4:4:4, the setting TigerVNC's automatic selection uses above 16 Mbit/s: Tight level 8): fps {:.1} vs {:.1}, Mbit/frame {:.3} vs {:.3}; ndd `auto` instead keeps the frame rate and lowers the quality",
            h.fps, v.fps, h.mbit_per_frame, v.mbit_per_frame
        );
    }
    if let Some(st) = stills.iter().find(|r| r.net == slow && r.peer == Peer::Ndd) {
        let _ = writeln!(
            s,
            "- still content pixel-identical in the viewer within 1 s: {} ({} pixels differ at 1 s)",
            verdict(st.at_1s.0 == 0),
            st.at_1s.0
        );
    }
    s
}

fn plot(rates: &[RateRow]) -> String {
    let bar_h = 14.0;
    let left = 330.0;
    let width = 760.0;
    let max_fps = rates.iter().map(|r| r.fps).fold(1.0, f64::max);
    let scale = (width - left - 60.0) / max_fps;
    let height = 30.0 + rates.len() as f64 * (bar_h + 4.0) + 20.0;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"11\">\n<text x=\"10\" y=\"18\" font-size=\"13\">Updates per second at the viewer (DAMAGE), ndd vs TigerVNC</text>\n"
    );
    for (i, r) in rates.iter().enumerate() {
        let y = 30.0 + i as f64 * (bar_h + 4.0);
        let colour = match r.peer {
            Peer::Ndd => "#2a7ab0",
            Peer::NddHigh => "#7ab0d8",
            Peer::NddTiles => "#5a9a6a",
            Peer::Vnc => "#b0702a",
            Peer::Xpra => "#8a4ab0",
            Peer::Rdp => "#b03a4a",
        };
        let label = format!(
            "{} · {} · {}",
            r.workload.name().split(' ').next().unwrap_or(""),
            r.net.name,
            r.peer.name()
        );
        let _ = writeln!(
            s,
            "<text x=\"10\" y=\"{:.0}\">{label}</text><rect x=\"{left}\" y=\"{y:.0}\" width=\"{:.1}\" height=\"{bar_h}\" fill=\"{colour}\"/><text x=\"{:.1}\" y=\"{:.0}\">{:.1}</text>",
            y + 11.0,
            r.fps * scale,
            left + r.fps * scale + 4.0,
            y + 11.0,
            r.fps
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The measurement's premise, with the real Xvfb and ffmpeg: what the player puts on the
    /// app's screen is the frame ffmpeg renders again, bit for bit, so whatever differs at a
    /// viewer is the remote display's doing.
    #[test]
    fn the_app_screen_equals_the_rendered_frame() {
        // One size for every test in this process (the page's test needs 1280 wide).
        let _ = SIZE.set(TEST_SIZE);
        let (_x, display) = start_xvfb().expect("Xvfb starts");
        let (w, h) = size();
        let _video = video(&display, (0, 0, w, h), 12).expect("the video plays");
        shows_the_rendered_frames(|| screenshot(&display).expect("screenshot"), w, h, 12);
    }

    /// The screen size of these tests (set once for the process: the size is global).
    const TEST_SIZE: (u16, u16) = (1280, 720);

    /// The page workload's premise: its video window, cut out of the app's screen beside the
    /// text, is the frame ffmpeg renders again, bit for bit (so the crop is where the player put
    /// the window). A 1280x720 screen at least: the frame number needs 640 pixels.
    #[test]
    fn the_page_video_window_cut_out_equals_the_rendered_frame() {
        let _ = SIZE.set(TEST_SIZE);
        let (w, _) = size();
        let (_x, display) = start_xvfb().expect("Xvfb starts");
        let _page = Workload::Page.start(&display).expect("the page starts");
        let rect = Workload::Page.video_rect().expect("a video");
        let shot = || crop_bgrx(&screenshot(&display).expect("screenshot"), w, rect);
        shows_the_rendered_frames(shot, rect.2, rect.3, 4);
    }

    /// Waits (20 s at most) until `shot`'s pictures (`w` x `h`) carry a frame number, then
    /// checks four of them, 70 ms apart, are the test video's frames with `grain`, bit for bit.
    fn shows_the_rendered_frames(shot: impl Fn() -> Vec<u8>, w: u16, h: u16, grain: u8) {
        let t0 = Instant::now();
        while frames::read_mark(&shot(), w.into()).is_none() {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "no frame number in the pictures"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let pictures: Vec<Vec<u8>> = (0..4)
            .map(|_| {
                std::thread::sleep(Duration::from_millis(70));
                shot()
            })
            .collect();
        let q = frames::score(w, h, grain, &pictures).expect("scored");
        assert_eq!(q.read, 4, "{q:?}");
        assert!(q.distinct >= 2, "the video moves: {q:?}");
        assert_eq!((q.ssim_min, q.psnr_mean), (1.0, 99.0), "{q:?}");
    }
}

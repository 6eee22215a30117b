//! Display endpoints, the I/O half: the `x11-screen` source and the `x11-window` and
//! `framebuffer` sinks. The record format and every decision that needs no X server live in
//! [`crate::display`].
//!
//! All three run as blocking tasks (`spawn_blocking`): X11 connections and file writes are
//! blocking APIs. The source waits for X events at most [`POLL`] at a time, so it notices
//! within that time that its receiver is gone.
//!
//! MIT-SHM images live in System V shared memory ([`crate::sys::ShmSegment`], the only unsafe
//! code); where the extension is missing or the server cannot attach the segment (a remote X
//! server over TCP), plain `GetImage` / `PutImage` requests, cut under the server's maximum
//! request length, do the same job. Setting the environment variable [`NO_SHM_ENV`]
//! (`NDD_X11_NO_SHM=1`) forces that path; it is read whenever an endpoint opens.
//!
//! The `x11-window` sink publishes its window in a process-wide registry keyed by the
//! `display` string, where an `x11-input` source with `window = "viewer"` finds it
//! ([`wait_for_viewer`]): the viewer of a remote desktop shows the app's screen and captures
//! the person's input.

use crate::config::{FramebufferConfig, X11ScreenConfig, X11WindowConfig};
use crate::delivered::Delivered;
use crate::display::{
    bands, coalesce, plan_frames, Framebuffer, PixelFormat, Rect, Update, UpdateHeader,
    UpdateLayout, FLAG_KEYFRAME, FLAG_MORE, MAX_UPDATE_PAYLOAD,
};
use crate::error::EndpointError;
use crate::inputdev::{wait_readable_for, x11_connect, x11_err};
use crate::sink::SinkReport;
use crate::source::{meta, SourceReport};
use crate::sys::ShmSegment;
use ndd_core::frame::DEFAULT_HEADROOM;
use ndd_core::{Frame, RateLimit};
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::{Receiver, Sender};
use x11rb::connection::{Connection, RequestConnection};
use x11rb::errors::{ConnectionError, ReplyError, ReplyOrIdError};
use x11rb::protocol::damage::{self, ConnectionExt as _};
use x11rb::protocol::shm::{self, ConnectionExt as _};
use x11rb::protocol::xfixes::{self, ConnectionExt as _};
use x11rb::protocol::xproto::{self, ConnectionExt as _};
use x11rb::protocol::Event as XEvent;
use x11rb::rust_connection::RustConnection;
use x11rb::wrapper::ConnectionExt as _;

/// Longest wait for X events before a loop checks whether it should stop.
pub const POLL: Duration = Duration::from_millis(100);
/// Environment variable that turns MIT-SHM off (any value but empty or `0`): images then go
/// through plain `GetImage` / `PutImage` requests, as with a remote X server.
pub const NO_SHM_ENV: &str = "NDD_X11_NO_SHM";
/// Most rects one capture sends after damage coalescing.
pub const MAX_RECTS: usize = 32;
/// Size of the `x11-window` sink's window until the first update says the screen's size.
pub const INITIAL_SIZE: (u16, u16) = (640, 480);
/// Bytes of a `PutImage` request before its data.
const PUT_IMAGE_HEADER: usize = 24;

fn shm_disabled() -> bool {
    std::env::var_os(NO_SHM_ENV).is_some_and(|v| !v.is_empty() && v != "0")
}

/// A failed X request: the connection is gone (fatal), or the server refused one request
/// (the stream can go on).
#[derive(Debug)]
enum XFail {
    Conn(String),
    Proto(String),
}

impl From<ConnectionError> for XFail {
    fn from(e: ConnectionError) -> Self {
        XFail::Conn(e.to_string())
    }
}

impl From<ReplyError> for XFail {
    fn from(e: ReplyError) -> Self {
        match e {
            ReplyError::ConnectionError(e) => XFail::Conn(e.to_string()),
            ReplyError::X11Error(e) => XFail::Proto(format!("{:?} error", e.error_kind)),
        }
    }
}

impl From<x11rb::errors::ReplyOrIdError> for XFail {
    fn from(e: x11rb::errors::ReplyOrIdError) -> Self {
        match e {
            x11rb::errors::ReplyOrIdError::X11Error(e) => {
                XFail::Proto(format!("{:?} error", e.error_kind))
            }
            other => XFail::Conn(other.to_string()),
        }
    }
}

/// What an X screen must be for [`PixelFormat::Bgrx32`]: depth 24 or 32, TrueColor with
/// masks 0xff0000 / 0xff00 / 0xff, 32 bits per pixel, LSBFirst images.
fn check_screen(
    endpoint: &'static str,
    display: &str,
    conn: &RustConnection,
    screen_num: usize,
) -> Result<xproto::Screen, EndpointError> {
    let setup = conn.setup();
    let screen = setup
        .roots
        .get(screen_num)
        .cloned()
        .ok_or_else(|| x11_err(endpoint, display, format!("no screen {screen_num}")))?;
    let depth = screen.root_depth;
    let bpp = setup
        .pixmap_formats
        .iter()
        .find(|f| f.depth == depth)
        .map_or(0, |f| f.bits_per_pixel);
    let visual = screen
        .allowed_depths
        .iter()
        .flat_map(|d| &d.visuals)
        .find(|v| v.visual_id == screen.root_visual);
    let truecolor = visual.is_some_and(|v| {
        v.class == xproto::VisualClass::TRUE_COLOR
            && (v.red_mask, v.green_mask, v.blue_mask) == (0xff_0000, 0xff00, 0xff)
    });
    let class = visual.map_or_else(|| "no visual".to_string(), |v| format!("{:?}", v.class));
    if !(matches!(depth, 24 | 32) && bpp == 32 && truecolor) {
        return Err(EndpointError::Unavailable {
            endpoint,
            what: format!(
                "X display {display}: depth {depth} ({bpp} bits per pixel, {class}) is not supported"
            ),
            hint: "only 24- or 32-bit TrueColor screens at 32 bits per pixel work (Xorg's \
                   default; `Xvfb -screen 0 1280x720x24`)"
                .to_string(),
        });
    }
    if setup.image_byte_order != xproto::ImageOrder::LSB_FIRST {
        return Err(EndpointError::Unavailable {
            endpoint,
            what: format!("X display {display}: images are MSBFirst (a big-endian X server)"),
            hint: "only LSBFirst (little-endian) X servers are supported".to_string(),
        });
    }
    Ok(screen)
}

/// A shared-memory segment attached by the X server too.
#[derive(Debug)]
struct Shm {
    seg: ShmSegment,
    xid: shm::Seg,
}

/// Why MIT-SHM cannot be used (the endpoint then captures with GetImage or draws with
/// PutImage).
#[derive(Debug, thiserror::Error)]
enum ShmError {
    #[error("the X server has no MIT-SHM extension")]
    NoExtension,
    #[error("{0}")]
    Connection(#[from] ConnectionError),
    #[error("MIT-SHM version query failed: {0}")]
    Version(ReplyError),
    #[error("cannot create a {len}-byte segment: {source}")]
    Segment { len: usize, source: std::io::Error },
    #[error("{0}")]
    Id(#[from] ReplyOrIdError),
    #[error("the X server cannot attach the segment (not on this host?): {0:?}")]
    Attach(ReplyError),
}

/// Creates a segment of `len` bytes and has the server attach it (read-only: the server only
/// reads it, for ShmPutImage).
fn attach_shm(conn: &RustConnection, len: usize, read_only: bool) -> Result<Shm, ShmError> {
    if conn
        .extension_information(shm::X11_EXTENSION_NAME)?
        .is_none()
    {
        return Err(ShmError::NoExtension);
    }
    conn.shm_query_version()?
        .reply()
        .map_err(ShmError::Version)?;
    let mut seg = ShmSegment::new(len).map_err(|source| ShmError::Segment { len, source })?;
    let xid = conn.generate_id()?;
    conn.shm_attach(xid, seg.id(), read_only)?
        .check()
        .map_err(ShmError::Attach)?;
    // Attached by both: the segment goes away when both detach, even if this process dies.
    seg.remove();
    Ok(Shm { seg, xid })
}

// ---------------------------------------------------------------------------------------
// Viewer registry

struct Viewers {
    map: Mutex<HashMap<String, u32>>,
    changed: Condvar,
}

fn viewers() -> &'static Viewers {
    static VIEWERS: OnceLock<Viewers> = OnceLock::new();
    VIEWERS.get_or_init(|| Viewers {
        map: Mutex::new(HashMap::new()),
        changed: Condvar::new(),
    })
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The `x11-window` sink's window, published for `x11-input` sources of the same display
/// until dropped.
#[derive(Debug)]
pub(crate) struct ViewerGuard {
    display: String,
    window: u32,
}

/// Publishes `window` as the viewer of `display`.
pub(crate) fn publish_viewer(display: &str, window: u32) -> ViewerGuard {
    let v = viewers();
    lock(&v.map).insert(display.to_string(), window);
    v.changed.notify_all();
    ViewerGuard {
        display: display.to_string(),
        window,
    }
}

impl Drop for ViewerGuard {
    fn drop(&mut self) {
        let mut map = lock(&viewers().map);
        if map.get(&self.display) == Some(&self.window) {
            map.remove(&self.display);
        }
    }
}

/// Waits up to `timeout` for the viewer window of `display`; `None` after it, or as soon as
/// `cancelled` says so (checked every 50 ms).
pub(crate) fn wait_for_viewer(
    display: &str,
    timeout: Duration,
    cancelled: impl Fn() -> bool,
) -> Option<u32> {
    let v = viewers();
    let deadline = Instant::now() + timeout;
    let mut map = lock(&v.map);
    loop {
        if let Some(&w) = map.get(display) {
            return Some(w);
        }
        let now = Instant::now();
        if cancelled() || now >= deadline {
            return None;
        }
        let wait = (deadline - now).min(Duration::from_millis(50));
        map = v
            .changed
            .wait_timeout(map, wait)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}

// ---------------------------------------------------------------------------------------
// x11-screen source

/// An `x11-screen` source, connected, with its Damage object.
pub(crate) struct X11Screen {
    conn: RustConnection,
    display: String,
    root: xproto::Window,
    width: u16,
    height: u16,
    damage: damage::Damage,
    region: xfixes::Region,
    shm: Option<Shm>,
    min_gap: Duration,
    refresh: Option<Duration>,
    max_get_bytes: usize,
}

impl std::fmt::Debug for X11Screen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "X11Screen({})", self.display)
    }
}

/// Connects, checks the screen format and the DAMAGE and XFIXES extensions, creates the
/// Damage object, and sets up MIT-SHM (or notes why not).
pub(crate) fn open_x11_screen(
    endpoint: &'static str,
    c: &X11ScreenConfig,
) -> Result<X11Screen, EndpointError> {
    let d = c.display.as_str();
    let (conn, screen_num) = x11_connect(endpoint, d)?;
    let screen = check_screen(endpoint, d, &conn, screen_num)?;
    let no_ext = |name: &str, e: String| EndpointError::Unavailable {
        endpoint,
        what: format!("X display {d}: no {name} extension ({e})"),
        hint: "the x11-screen source needs DAMAGE and XFIXES 2 or later (Xorg, Xvfb and \
               Xwayland have both by default)"
            .to_string(),
    };
    conn.xfixes_query_version(5, 0)
        .map_err(|e| no_ext("XFIXES", e.to_string()))?
        .reply()
        .map_err(|e| no_ext("XFIXES", e.to_string()))?;
    conn.damage_query_version(1, 1)
        .map_err(|e| no_ext("DAMAGE", e.to_string()))?
        .reply()
        .map_err(|e| no_ext("DAMAGE", e.to_string()))?;
    let err = |e: String| x11_err(endpoint, d, e);
    let damage = conn.generate_id().map_err(|e| err(e.to_string()))?;
    let region = conn.generate_id().map_err(|e| err(e.to_string()))?;
    conn.damage_create(damage, screen.root, damage::ReportLevel::NON_EMPTY)
        .map_err(|e| err(e.to_string()))?
        .check()
        .map_err(|e| err(format!("cannot create a Damage object: {e:?}")))?;
    conn.xfixes_create_region(region, &[])
        .map_err(|e| err(e.to_string()))?;
    // ConfigureNotify on the root: the screen changed size (RandR).
    conn.change_window_attributes(
        screen.root,
        &xproto::ChangeWindowAttributesAux::new().event_mask(xproto::EventMask::STRUCTURE_NOTIFY),
    )
    .map_err(|e| err(e.to_string()))?;
    conn.sync().map_err(|e| err(e.to_string()))?;
    let shm = if shm_disabled() {
        tracing::info!(
            endpoint,
            display = d,
            capture = "GetImage",
            "MIT-SHM turned off by {NO_SHM_ENV}"
        );
        None
    } else {
        match attach_shm(&conn, MAX_UPDATE_PAYLOAD, false) {
            Ok(s) => {
                tracing::info!(
                    endpoint,
                    display = d,
                    capture = "MIT-SHM ShmGetImage",
                    "capturing the screen"
                );
                Some(s)
            }
            Err(reason) => {
                tracing::info!(endpoint, display = d, capture = "GetImage", %reason, "no MIT-SHM, capturing with GetImage");
                None
            }
        }
    };
    let max_get_bytes = conn
        .maximum_request_bytes()
        .saturating_sub(64)
        .clamp(4096, MAX_UPDATE_PAYLOAD);
    Ok(X11Screen {
        conn,
        display: c.display.clone(),
        root: screen.root,
        width: screen.width_in_pixels,
        height: screen.height_in_pixels,
        damage,
        region,
        shm,
        min_gap: Duration::try_from_secs_f64(1.0 / c.max_fps).unwrap_or(Duration::ZERO),
        refresh: crate::config::pacing(c.refresh_s),
        max_get_bytes,
    })
}

fn coord(v: u16) -> Result<i16, XFail> {
    i16::try_from(v).map_err(|_| XFail::Proto(format!("coordinate {v} beyond the X range")))
}

impl X11Screen {
    /// The damaged rects since the last call (the Damage object is emptied), coalesced.
    fn take_damage(&self) -> Result<Vec<Rect>, XFail> {
        self.conn
            .damage_subtract(self.damage, x11rb::NONE, self.region)?;
        let reply = self.conn.xfixes_fetch_region(self.region)?.reply()?;
        let rects: Vec<Rect> = reply
            .rectangles
            .iter()
            .filter_map(|r| Rect::from_signed(r.x, r.y, r.width, r.height, self.width, self.height))
            .collect();
        Ok(coalesce(&rects, self.width, self.height, MAX_RECTS))
    }

    /// Forgets the damage so far (a keyframe captures everything anyway).
    fn clear_damage(&self) -> Result<(), XFail> {
        self.conn
            .damage_subtract(self.damage, x11rb::NONE, x11rb::NONE)?;
        Ok(())
    }

    /// Re-reads the screen size after a failed capture.
    fn refresh_size(&mut self) -> Result<(), XFail> {
        let g = self.conn.get_geometry(self.root)?.reply()?;
        self.width = g.width;
        self.height = g.height;
        Ok(())
    }

    /// Captures the pixels of every rect of `layout` into `payload`.
    fn capture_into(&mut self, layout: &UpdateLayout, payload: &mut [u8]) -> Result<(), XFail> {
        let rects = layout.rects();
        let conn = &self.conn;
        if let Some(shm) = self.shm.as_mut() {
            // All requests first (one round trip for the whole frame), each rect at its own
            // offset of the segment, then the copies once every reply is in.
            let mut pending = Vec::with_capacity(rects.len());
            let mut off = 0usize;
            for (i, r) in rects.iter().enumerate() {
                let len = layout.pixels(i).len();
                if off + len > shm.seg.len() {
                    return Err(XFail::Proto(format!("rect {r} does not fit the segment")));
                }
                let cookie = conn.shm_get_image(
                    self.root,
                    coord(r.x)?,
                    coord(r.y)?,
                    r.w,
                    r.h,
                    !0,
                    xproto::ImageFormat::Z_PIXMAP.into(),
                    shm.xid,
                    off as u32,
                )?;
                pending.push((cookie, off, len, *r));
                off += len;
            }
            let mut copies = Vec::with_capacity(pending.len());
            for (cookie, off, len, r) in pending {
                let reply = cookie.reply()?;
                if reply.size as usize != len {
                    return Err(XFail::Proto(format!(
                        "ShmGetImage of {r} returned {} bytes, expected {len}",
                        reply.size
                    )));
                }
                copies.push(off);
            }
            for (i, off) in copies.into_iter().enumerate() {
                let range = layout.pixels(i);
                let len = range.len();
                payload[range].copy_from_slice(&shm.seg.bytes()[off..off + len]);
            }
        } else {
            let mut pending = Vec::new();
            for (i, r) in rects.iter().enumerate() {
                let mut at = layout.pixels(i).start;
                for band in bands(*r, 4, self.max_get_bytes) {
                    let len = usize::from(band.w) * usize::from(band.h) * 4;
                    let cookie = conn.get_image(
                        xproto::ImageFormat::Z_PIXMAP,
                        self.root,
                        coord(band.x)?,
                        coord(band.y)?,
                        band.w,
                        band.h,
                        !0,
                    )?;
                    pending.push((cookie, at, len, band));
                    at += len;
                }
            }
            for (cookie, at, len, band) in pending {
                let reply = cookie.reply()?;
                if reply.data.len() != len {
                    return Err(XFail::Proto(format!(
                        "GetImage of {band} returned {} bytes, expected {len}",
                        reply.data.len()
                    )));
                }
                payload[at..at + len].copy_from_slice(&reply.data);
            }
        }
        Ok(())
    }
}

/// Numbers and sends the frames of a display stream.
struct Emitter {
    stream: u16,
    tx: Sender<Frame>,
    report: SourceReport,
}

/// The `x11-screen` source loop: a keyframe first, then the damaged rects at most `max_fps`
/// times a second, and a keyframe every `refresh_s`.
pub(crate) fn run_x11_screen(
    endpoint: &'static str,
    mut s: X11Screen,
    stream: u16,
    tx: Sender<Frame>,
) -> Result<SourceReport, EndpointError> {
    let display = s.display.clone();
    let fatal = |e: String| x11_err(endpoint, &display, e);
    let mut em = Emitter {
        stream,
        tx,
        report: SourceReport::default(),
    };
    let mut keyframe_due = true;
    let mut damaged = false;
    let mut next_capture = Instant::now();
    let mut last_keyframe = Instant::now();
    let mut captures = 0u64;
    let mut refused = RateLimit::default();
    let started = Instant::now();
    loop {
        while let Some(ev) = s.conn.poll_for_event().map_err(|e| fatal(e.to_string()))? {
            match ev {
                XEvent::DamageNotify(_) => damaged = true,
                XEvent::ConfigureNotify(c)
                    if c.window == s.root && (c.width, c.height) != (s.width, s.height) =>
                {
                    tracing::info!(
                        endpoint,
                        width = c.width,
                        height = c.height,
                        "screen size changed"
                    );
                    s.width = c.width;
                    s.height = c.height;
                    keyframe_due = true;
                }
                XEvent::Error(e) => {
                    if let Some(suppressed) = refused.admit(Instant::now()) {
                        tracing::warn!(endpoint, error = ?e.error_kind, suppressed, "X error");
                    }
                }
                _ => {}
            }
        }
        if em.tx.is_closed() {
            break;
        }
        let now = Instant::now();
        if s.refresh.is_some_and(|r| now >= last_keyframe + r) {
            keyframe_due = true;
        }
        if (keyframe_due || damaged) && now >= next_capture {
            let keyframe = keyframe_due;
            let rects = if keyframe {
                s.clear_damage()
                    .map(|()| vec![Rect::new(0, 0, s.width, s.height)])
            } else {
                s.take_damage()
            };
            keyframe_due = false;
            damaged = false;
            next_capture = now + s.min_gap;
            if keyframe {
                last_keyframe = now;
            }
            let sent = rects.and_then(|rects| send_capture(&mut s, &mut em, &rects, keyframe));
            match sent {
                Ok(true) => captures += 1,
                Ok(false) => break,
                Err(XFail::Conn(e)) => return Err(fatal(e)),
                Err(XFail::Proto(e)) => {
                    // The screen may have shrunk under the capture: re-read it, start over
                    // with a keyframe.
                    if let Some(suppressed) = refused.admit(Instant::now()) {
                        tracing::warn!(endpoint, error = %e, suppressed, "capture refused, sending a keyframe next");
                    }
                    match s.refresh_size() {
                        Ok(()) => {}
                        Err(XFail::Conn(e)) => return Err(fatal(e)),
                        Err(XFail::Proto(e)) => return Err(fatal(e)),
                    }
                    keyframe_due = true;
                }
            }
            continue;
        }
        let mut wait = POLL;
        if keyframe_due || damaged {
            wait = wait.min(next_capture.saturating_duration_since(now));
        }
        if let Some(r) = s.refresh {
            wait = wait.min((last_keyframe + r).saturating_duration_since(now));
        }
        wait_readable_for(s.conn.stream(), wait.max(Duration::from_millis(1)))
            .map_err(|e| fatal(e.to_string()))?;
    }
    let secs = started.elapsed().as_secs_f64();
    tracing::debug!(
        endpoint,
        stream,
        frames = em.report.frames,
        bytes = em.report.bytes,
        captures,
        fps = captures as f64 / secs.max(1e-9),
        "source ended"
    );
    Ok(em.report)
}

/// Captures `rects` (cut into frames under [`MAX_UPDATE_PAYLOAD`]) and sends the frames;
/// `Ok(false)` when the receiver is gone.
fn send_capture(
    s: &mut X11Screen,
    em: &mut Emitter,
    rects: &[Rect],
    keyframe: bool,
) -> Result<bool, XFail> {
    if rects.is_empty() {
        return Ok(true);
    }
    let whole = Rect::new(0, 0, s.width, s.height);
    let keyframe = keyframe || rects.contains(&whole);
    let frames = plan_frames(rects, PixelFormat::Bgrx32, MAX_UPDATE_PAYLOAD);
    let n = frames.len();
    for (i, rects) in frames.into_iter().enumerate() {
        let mut flags = 0;
        if keyframe {
            flags |= FLAG_KEYFRAME;
        }
        if i + 1 < n {
            flags |= FLAG_MORE;
        }
        let header = UpdateHeader {
            width: s.width,
            height: s.height,
            format: PixelFormat::Bgrx32,
            flags,
        };
        let layout = UpdateLayout::new(header, rects).map_err(|e| XFail::Proto(e.to_string()))?;
        let mut frame = Frame::zeroed(
            meta(em.stream, em.report.frames),
            DEFAULT_HEADROOM,
            layout.len(),
        );
        let payload = frame.payload_mut();
        layout
            .write_headers(payload)
            .map_err(|e| XFail::Proto(e.to_string()))?;
        s.capture_into(&layout, payload)?;
        let len = layout.len() as u64;
        if em.tx.blocking_send(frame).is_err() {
            return Ok(false);
        }
        em.report.frames += 1;
        em.report.bytes += len;
        tracing::trace!(
            seq = em.report.frames - 1,
            rects = layout.rects().len(),
            bytes = len,
            keyframe,
            "display update"
        );
    }
    Ok(true)
}

// ---------------------------------------------------------------------------------------
// x11-window sink

/// An `x11-window` sink, connected.
pub(crate) struct X11WindowSink {
    conn: Arc<RustConnection>,
    display: String,
    title: String,
    screen: xproto::Screen,
    shm: bool,
}

impl std::fmt::Debug for X11WindowSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "X11WindowSink({})", self.display)
    }
}

/// Connects and checks the screen format and whether MIT-SHM can be tried.
pub(crate) fn open_x11_window(
    endpoint: &'static str,
    c: &X11WindowConfig,
) -> Result<X11WindowSink, EndpointError> {
    let (conn, screen_num) = x11_connect(endpoint, &c.display)?;
    let screen = check_screen(endpoint, &c.display, &conn, screen_num)?;
    Ok(X11WindowSink {
        conn: Arc::new(conn),
        display: c.display.clone(),
        title: c.title.clone(),
        screen,
        shm: !shm_disabled(),
    })
}

/// Where the window's pixels are kept: in a segment the server reads (MIT-SHM), or in this
/// process only.
#[derive(Debug)]
enum Store {
    Shm(Shm),
    Local(Framebuffer),
}

/// The window and its pixels, shared by the frame loop and the Expose thread.
#[derive(Debug)]
struct View {
    conn: Arc<RustConnection>,
    win: xproto::Window,
    gc: xproto::Gcontext,
    depth: u8,
    width: u16,
    height: u16,
    store: Store,
    use_shm: bool,
    max_put_bytes: usize,
}

impl View {
    /// A black image of `width`×`height` in shared memory if possible.
    fn new_store(&mut self, width: u16, height: u16) -> Result<(), XFail> {
        if let Store::Shm(old) = &self.store {
            self.conn.shm_detach(old.xid)?;
        }
        let len = usize::from(width) * usize::from(height) * 4;
        self.store = Store::Local(Framebuffer::new(width, height, PixelFormat::Bgrx32));
        if self.use_shm {
            match attach_shm(&self.conn, len.max(4), true) {
                Ok(shm) => self.store = Store::Shm(shm),
                Err(reason) => {
                    tracing::info!(%reason, "no MIT-SHM, drawing with PutImage");
                    self.use_shm = false;
                }
            }
        }
        self.width = width;
        self.height = height;
        Ok(())
    }

    /// Resizes the window and its image (cleared to black).
    fn resize(&mut self, width: u16, height: u16) -> Result<(), XFail> {
        self.conn.configure_window(
            self.win,
            &xproto::ConfigureWindowAux::new()
                .width(u32::from(width))
                .height(u32::from(height)),
        )?;
        self.new_store(width, height)?;
        self.draw(Rect::new(0, 0, width, height), None)?;
        Ok(())
    }

    /// Draws `rect` of the image; `pixels` are its pixels when the caller has them
    /// contiguous (an update's rect), for the non-SHM path.
    fn draw(&self, rect: Rect, pixels: Option<&[u8]>) -> Result<(), XFail> {
        let Some(rect) = rect.clip(self.width, self.height) else {
            return Ok(());
        };
        match &self.store {
            Store::Shm(shm) => {
                self.conn.shm_put_image(
                    self.win,
                    self.gc,
                    self.width,
                    self.height,
                    rect.x,
                    rect.y,
                    rect.w,
                    rect.h,
                    coord(rect.x)?,
                    coord(rect.y)?,
                    self.depth,
                    xproto::ImageFormat::Z_PIXMAP.into(),
                    false,
                    shm.xid,
                    0,
                )?;
            }
            Store::Local(fb) => {
                let owned;
                let pixels = match pixels {
                    Some(p) => p,
                    None => {
                        owned = fb.rect_pixels(rect).unwrap_or_default();
                        &owned
                    }
                };
                let row = usize::from(rect.w) * 4;
                for band in bands(rect, 4, self.max_put_bytes) {
                    let start = usize::from(band.y - rect.y) * row;
                    let data = pixels
                        .get(start..start + usize::from(band.h) * row)
                        .ok_or_else(|| XFail::Proto(format!("no pixels for {band}")))?;
                    self.conn.put_image(
                        xproto::ImageFormat::Z_PIXMAP,
                        self.win,
                        self.gc,
                        band.w,
                        band.h,
                        coord(band.x)?,
                        coord(band.y)?,
                        0,
                        self.depth,
                        data,
                    )?;
                }
            }
        }
        Ok(())
    }

    /// Waits until the server has done everything asked so far (the segment may then be
    /// written again).
    fn finish(&self) -> Result<(), XFail> {
        match self.store {
            Store::Shm(_) => self.conn.sync().map_err(XFail::from),
            Store::Local(_) => self.conn.flush().map_err(XFail::from),
        }
    }

    /// Applies one update to the image and draws its rects. `Ok(Err(_))`: the update is bad
    /// (the window is unchanged); `Err(_)`: an X failure.
    fn apply(
        &mut self,
        u: &Update<'_>,
    ) -> Result<Result<(), crate::display::DisplayFrameError>, XFail> {
        let h = u.header;
        if (h.width, h.height) != (self.width, self.height) {
            tracing::info!(
                width = h.width,
                height = h.height,
                "viewer resized to the app's screen"
            );
            self.resize(h.width, h.height)?;
        }
        match &mut self.store {
            Store::Shm(shm) => {
                for r in &u.rects {
                    if let Err(e) = crate::display::blit(
                        shm.seg.bytes_mut(),
                        h.width,
                        h.height,
                        4,
                        r.rect,
                        r.pixels,
                    ) {
                        return Ok(Err(e));
                    }
                }
            }
            Store::Local(fb) => {
                if let Err(e) = fb.apply(u) {
                    return Ok(Err(e));
                }
            }
        }
        for r in &u.rects {
            self.draw(r.rect, Some(r.pixels))?;
        }
        self.finish()?;
        Ok(Ok(()))
    }
}

/// Creates, names and maps the window, and waits (up to 5 s) until it is mapped.
fn create_view(s: &X11WindowSink) -> Result<View, XFail> {
    let conn = &s.conn;
    let win = conn.generate_id()?;
    let gc = conn.generate_id()?;
    let (w, h) = INITIAL_SIZE;
    conn.create_window(
        x11rb::COPY_DEPTH_FROM_PARENT,
        win,
        s.screen.root,
        0,
        0,
        w,
        h,
        0,
        xproto::WindowClass::INPUT_OUTPUT,
        x11rb::COPY_FROM_PARENT,
        // Exposure and StructureNotify only: ButtonPress (one client per window) is left to
        // an `x11-input` source with `window = "viewer"`.
        &xproto::CreateWindowAux::new()
            .event_mask(xproto::EventMask::EXPOSURE | xproto::EventMask::STRUCTURE_NOTIFY),
    )?;
    conn.create_gc(gc, win, &xproto::CreateGCAux::new().graphics_exposures(0))?;
    conn.change_property8(
        xproto::PropMode::REPLACE,
        win,
        xproto::AtomEnum::WM_NAME,
        xproto::AtomEnum::STRING,
        s.title.as_bytes(),
    )?;
    conn.change_property8(
        xproto::PropMode::REPLACE,
        win,
        xproto::AtomEnum::WM_CLASS,
        xproto::AtomEnum::STRING,
        b"ndd\0ndd\0",
    )?;
    let net_wm_name = conn.intern_atom(false, b"_NET_WM_NAME")?.reply()?.atom;
    let utf8 = conn.intern_atom(false, b"UTF8_STRING")?.reply()?.atom;
    conn.change_property8(
        xproto::PropMode::REPLACE,
        win,
        net_wm_name,
        utf8,
        s.title.as_bytes(),
    )?;
    let max_put_bytes = conn
        .maximum_request_bytes()
        .saturating_sub(PUT_IMAGE_HEADER + 64)
        .clamp(4096, MAX_UPDATE_PAYLOAD);
    let mut view = View {
        conn: s.conn.clone(),
        win,
        gc,
        depth: s.screen.root_depth,
        width: w,
        height: h,
        store: Store::Local(Framebuffer::default()),
        use_shm: s.shm,
        max_put_bytes,
    };
    view.new_store(w, h)?;
    conn.map_window(win)?;
    conn.flush()?;
    let deadline = Instant::now() + Duration::from_secs(5);
    'mapped: while Instant::now() < deadline {
        while let Some(ev) = conn.poll_for_event()? {
            if matches!(ev, XEvent::MapNotify(m) if m.window == win) {
                break 'mapped;
            }
        }
        let _ = wait_readable_for(conn.stream(), Duration::from_millis(50));
    }
    view.draw(Rect::new(0, 0, w, h), None)?;
    view.finish()?;
    Ok(view)
}

/// Redraws exposed parts of the window from the image, until `stop`.
fn expose_loop(endpoint: &'static str, view: Arc<Mutex<View>>, stop: Arc<AtomicBool>) {
    let conn = lock(&view).conn.clone();
    let mut refused = RateLimit::default();
    loop {
        loop {
            let ev = match conn.poll_for_event() {
                Ok(Some(ev)) => ev,
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(endpoint, error = %e, "X connection closed");
                    return;
                }
            };
            match ev {
                XEvent::Expose(e) => {
                    let v = lock(&view);
                    let r = Rect::new(e.x, e.y, e.width, e.height);
                    if let Err(e) = v.draw(r, None).and_then(|()| v.finish()) {
                        tracing::debug!(endpoint, error = ?e, "redraw failed");
                    }
                }
                XEvent::Error(e) => {
                    if let Some(suppressed) = refused.admit(Instant::now()) {
                        tracing::warn!(endpoint, error = ?e.error_kind, request = e.major_opcode, suppressed, "X error");
                    }
                }
                _ => {}
            }
        }
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let _ = wait_readable_for(conn.stream(), POLL);
    }
}

/// Logs bad frames at most once a second, with a count.
struct BadFrames {
    endpoint: &'static str,
    limit: RateLimit,
    total: u64,
}

impl BadFrames {
    fn new(endpoint: &'static str) -> BadFrames {
        BadFrames {
            endpoint,
            limit: RateLimit::default(),
            total: 0,
        }
    }

    fn report(&mut self, seq: u64, error: &dyn std::fmt::Display) {
        self.total += 1;
        if let Some(suppressed) = self.limit.admit(Instant::now()) {
            tracing::warn!(
                endpoint = self.endpoint,
                seq,
                %error,
                suppressed,
                "bad display record dropped"
            );
        }
    }

    fn done(&self) {
        if self.total > 0 {
            tracing::warn!(
                endpoint = self.endpoint,
                dropped = self.total,
                "bad display records dropped in all"
            );
        }
    }
}

/// The `x11-window` sink loop: creates and publishes the window, draws every update, and
/// redraws exposed parts from a second thread.
pub(crate) fn run_x11_window_sink(
    endpoint: &'static str,
    s: X11WindowSink,
    mut rx: Receiver<Frame>,
    delivered: Delivered,
) -> Result<SinkReport, EndpointError> {
    let fatal = |e: String| x11_err(endpoint, &s.display, e);
    let view = match create_view(&s) {
        Ok(v) => v,
        Err(XFail::Conn(e) | XFail::Proto(e)) => {
            return Err(fatal(format!("cannot create the window: {e}")))
        }
    };
    tracing::info!(
        endpoint,
        display = %s.display,
        window = view.win,
        draw = if matches!(view.store, Store::Shm(_)) { "MIT-SHM ShmPutImage" } else { "PutImage" },
        "viewer window shown"
    );
    let _published = publish_viewer(&s.display, view.win);
    let view = Arc::new(Mutex::new(view));
    let stop = Arc::new(AtomicBool::new(false));
    let expose = {
        let (view, stop) = (view.clone(), stop.clone());
        std::thread::Builder::new()
            .name("ndd-x11-window".into())
            .spawn(move || expose_loop(endpoint, view, stop))
            .map_err(|e| fatal(format!("cannot start the expose thread: {e}")))?
    };
    let mut report = SinkReport::default();
    let mut bad = BadFrames::new(endpoint);
    let mut refused = RateLimit::default();
    let mut rects = 0u64;
    let started = Instant::now();
    let result = (|| {
        while let Some(frame) = rx.blocking_recv() {
            report.frames += 1;
            report.bytes += frame.len() as u64;
            let u = match Update::parse(frame.payload()) {
                Ok(u) => u,
                Err(e) => {
                    bad.report(frame.meta.seq, &e);
                    delivered.mark(frame.meta.seq);
                    continue;
                }
            };
            rects += u.rects.len() as u64;
            match lock(&view).apply(&u) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => bad.report(frame.meta.seq, &e),
                Err(XFail::Conn(e)) => return Err(fatal(e)),
                Err(XFail::Proto(e)) => {
                    if let Some(suppressed) = refused.admit(Instant::now()) {
                        tracing::warn!(endpoint, error = %e, suppressed, "X server refused a drawing request");
                    }
                }
            }
            // Drawn and flushed (synced with MIT-SHM) by `apply`, or dropped as bad or
            // refused by the server.
            delivered.mark(frame.meta.seq);
        }
        Ok(())
    })();
    stop.store(true, Ordering::Relaxed);
    let _ = expose.join();
    bad.done();
    let secs = started.elapsed().as_secs_f64();
    tracing::debug!(
        endpoint,
        frames = report.frames,
        bytes = report.bytes,
        rects,
        fps = report.frames as f64 / secs.max(1e-9),
        "sink ended"
    );
    result.map(|()| report)
}

// ---------------------------------------------------------------------------------------
// framebuffer sink

/// Geometry of a Linux framebuffer device, from sysfs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FbGeometry {
    width: u32,
    height: u32,
    bits_per_pixel: u32,
    stride: usize,
}

/// An open `framebuffer` sink target.
#[derive(Debug)]
pub(crate) struct FbSink {
    file: File,
    path: PathBuf,
    /// `Some` for a framebuffer device.
    device: Option<FbGeometry>,
}

/// Major number of Linux framebuffer devices.
const FB_MAJOR: u64 = 29;

fn dev_major_minor(rdev: u64) -> (u64, u64) {
    // glibc's encoding (gnu_dev_major / gnu_dev_minor).
    let major = ((rdev >> 8) & 0xfff) | ((rdev >> 32) & !0xfff);
    let minor = (rdev & 0xff) | ((rdev >> 12) & !0xff);
    (major, minor)
}

/// Reads `/sys/class/graphics/fbN/{virtual_size,bits_per_pixel,stride}`.
fn fb_geometry(sys: &Path) -> Result<FbGeometry, String> {
    let read = |name: &str| {
        std::fs::read_to_string(sys.join(name))
            .map(|s| s.trim().to_string())
            .map_err(|e| format!("cannot read {}: {e}", sys.join(name).display()))
    };
    let size = read("virtual_size")?;
    let (w, h) = size
        .split_once(',')
        .and_then(|(w, h)| Some((w.trim().parse().ok()?, h.trim().parse().ok()?)))
        .ok_or_else(|| format!("cannot parse virtual_size {size:?}"))?;
    let bpp: u32 = read("bits_per_pixel")?
        .parse()
        .map_err(|e| format!("cannot parse bits_per_pixel: {e}"))?;
    let stride = read("stride")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(w as usize * (bpp as usize).div_ceil(8));
    Ok(FbGeometry {
        width: w,
        height: h,
        bits_per_pixel: bpp,
        stride,
    })
}

/// Opens (creating it if needed) the file, or the framebuffer device after reading its
/// geometry.
pub(crate) fn open_framebuffer(
    endpoint: &'static str,
    c: &FramebufferConfig,
) -> Result<FbSink, EndpointError> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let open_err = |source| EndpointError::Open {
        endpoint,
        path: c.path.clone(),
        source,
    };
    let meta = std::fs::metadata(&c.path).ok();
    if meta.as_ref().is_some_and(|m| m.is_dir()) {
        return Err(open_err(std::io::Error::other("is a directory")));
    }
    let device = match meta {
        Some(m) if m.file_type().is_char_device() => {
            let (major, minor) = dev_major_minor(m.rdev());
            if major != FB_MAJOR {
                return Err(EndpointError::Unavailable {
                    endpoint,
                    what: format!(
                        "{} is a character device {major}:{minor}, not a framebuffer (major 29)",
                        c.path.display()
                    ),
                    hint: "give a /dev/fbN device or a regular file".to_string(),
                });
            }
            let sys = PathBuf::from(format!("/sys/class/graphics/fb{minor}"));
            let g = fb_geometry(&sys).map_err(|what| EndpointError::Unavailable {
                endpoint,
                what,
                hint: "the framebuffer's size and format come from sysfs".to_string(),
            })?;
            if g.bits_per_pixel != 32 {
                return Err(EndpointError::Unavailable {
                    endpoint,
                    what: format!(
                        "{} has {} bits per pixel; the display stream is 32-bit BGRX",
                        c.path.display(),
                        g.bits_per_pixel
                    ),
                    hint: "switch the framebuffer to 32 bpp (`fbset -depth 32`) or write to a \
                           regular file"
                        .to_string(),
                });
            }
            Some(g)
        }
        _ => None,
    };
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(device.is_none())
        .truncate(false)
        .open(&c.path)
        .map_err(open_err)?;
    Ok(FbSink {
        file,
        path: c.path.clone(),
        device,
    })
}

impl FbSink {
    /// Writes the rects of `u` at their offsets; sizes the file on the first update and on
    /// every change of screen size.
    fn write(
        &mut self,
        endpoint: &'static str,
        u: &Update<'_>,
        size: &mut Option<(u16, u16)>,
    ) -> Result<(), EndpointError> {
        let h = u.header;
        let what = || self.path.display().to_string();
        let stride = match self.device {
            Some(g) => {
                if (g.width, g.height) != (u32::from(h.width), u32::from(h.height)) {
                    return Err(EndpointError::Unavailable {
                        endpoint,
                        what: format!(
                            "{} is {}x{}, the app's screen is {}x{}",
                            self.path.display(),
                            g.width,
                            g.height,
                            h.width,
                            h.height
                        ),
                        hint: "give the app's X screen the framebuffer's size (e.g. \
                               `Xvfb -screen 0 WxHx24`, `xrandr -s WxH`), or write to a regular file"
                            .to_string(),
                    });
                }
                g.stride
            }
            None => {
                let stride = usize::from(h.width) * 4;
                if *size != Some((h.width, h.height)) {
                    let len = stride as u64 * u64::from(h.height);
                    self.file
                        .set_len(0)
                        .and_then(|()| self.file.set_len(len))
                        .map_err(|source| EndpointError::Write {
                            endpoint,
                            what: what(),
                            source,
                        })?;
                    *size = Some((h.width, h.height));
                }
                stride
            }
        };
        for r in &u.rects {
            let row = usize::from(r.rect.w) * 4;
            let at = |y: u16| (usize::from(y) * stride + usize::from(r.rect.x) * 4) as u64;
            let res = if row == stride {
                // Whole rows: one write.
                self.file.write_all_at(r.pixels, at(r.rect.y))
            } else {
                r.pixels
                    .chunks_exact(row)
                    .zip(r.rect.y..)
                    .try_for_each(|(line, y)| self.file.write_all_at(line, at(y)))
            };
            res.map_err(|source| EndpointError::Write {
                endpoint,
                what: what(),
                source,
            })?;
        }
        Ok(())
    }
}

/// The `framebuffer` sink loop.
pub(crate) fn run_framebuffer_sink(
    endpoint: &'static str,
    mut fb: FbSink,
    mut rx: Receiver<Frame>,
    delivered: Delivered,
) -> Result<SinkReport, EndpointError> {
    let mut report = SinkReport::default();
    let mut bad = BadFrames::new(endpoint);
    let mut size = None;
    while let Some(frame) = rx.blocking_recv() {
        report.frames += 1;
        report.bytes += frame.len() as u64;
        match Update::parse(frame.payload()) {
            Ok(u) => fb.write(endpoint, &u, &mut size)?,
            Err(e) => bad.report(frame.meta.seq, &e),
        }
        // Written to the file (`write_all_at`, no user-space buffer), or dropped as bad.
        delivered.mark(frame.meta.seq);
    }
    bad.done();
    tracing::debug!(endpoint, frames = report.frames, "sink ended");
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn viewer_registry_publishes_waits_and_unpublishes() {
        let d = format!(":test-{}", std::process::id());
        assert_eq!(
            wait_for_viewer(&d, Duration::from_millis(30), || false),
            None
        );
        assert_eq!(wait_for_viewer(&d, Duration::from_secs(60), || true), None);
        let waiter = {
            let d = d.clone();
            std::thread::spawn(move || wait_for_viewer(&d, Duration::from_secs(30), || false))
        };
        std::thread::sleep(Duration::from_millis(20));
        let g = publish_viewer(&d, 0x40_0001);
        assert_eq!(waiter.join().unwrap(), Some(0x40_0001));
        // A newer viewer of the same display replaces it; the old guard leaves it alone.
        let g2 = publish_viewer(&d, 0x40_0002);
        drop(g);
        assert_eq!(
            wait_for_viewer(&d, Duration::ZERO, || false),
            Some(0x40_0002)
        );
        drop(g2);
        assert_eq!(wait_for_viewer(&d, Duration::ZERO, || false), None);
    }

    #[test]
    fn device_numbers_decode() {
        // /dev/fb0 (29:0), /dev/tty0 (4:0), a large minor.
        assert_eq!(dev_major_minor(0x1d00), (29, 0));
        assert_eq!(dev_major_minor(0x0400), (4, 0));
        assert_eq!(
            dev_major_minor((29 << 8) | 0x12 | (0x34500 << 12)),
            (29, 0x34512)
        );
    }

    #[test]
    fn fb_geometry_reads_sysfs_files() {
        let dir = std::env::temp_dir().join(format!("ndd-fbsys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("virtual_size"), "1920,1080\n").unwrap();
        std::fs::write(dir.join("bits_per_pixel"), "32\n").unwrap();
        assert_eq!(
            fb_geometry(&dir),
            Ok(FbGeometry {
                width: 1920,
                height: 1080,
                bits_per_pixel: 32,
                stride: 7680
            })
        );
        std::fs::write(dir.join("stride"), "8192\n").unwrap();
        assert_eq!(fb_geometry(&dir).unwrap().stride, 8192);
        std::fs::write(dir.join("virtual_size"), "junk").unwrap();
        assert!(fb_geometry(&dir).unwrap_err().contains("virtual_size"));
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(fb_geometry(&dir).unwrap_err().contains("cannot read"));
    }
}

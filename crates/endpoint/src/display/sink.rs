//! The display sinks: `x11-window` shows display updates in a window of an X display
//! (MIT-SHM `ShmPutImage`, or `PutImage`), sized like the app's screen, redrawing exposed parts
//! from a second thread, and publishes it as the viewer of its display; `framebuffer` writes
//! them into a raw 32-bpp framebuffer file or a `/dev/fbN` of the same size.
//!
//! Both run as blocking tasks (`spawn_blocking`): X11 connections and file writes are
//! blocking APIs. A bad record is logged (at most once a second) and dropped.

use super::config::{FramebufferConfig, X11WindowConfig};
use super::scale;
use super::x11::{
    attach_shm, check_screen, coord, lock, publish_viewer_resizing, shm_disabled, Shm, XFail, POLL,
};
use crate::common::delivered::Delivered;
use crate::common::error::EndpointError;
use crate::common::report::{SinkReport, SinkTask};
use crate::common::x11::{wait_readable_for, x11_connect, x11_err};
use ndd_core::{Frame, RateLimit};
use ndd_wire::display::{
    bands, blit, DisplayFrameError, Framebuffer, LinkState, PixelFormat, Rect, Update,
    MAX_UPDATE_PAYLOAD,
};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::runtime::Handle;
use tokio::sync::mpsc::Receiver;
use x11rb::connection::{Connection, RequestConnection};
use x11rb::protocol::shm::ConnectionExt as _;
use x11rb::protocol::xproto::{self, ConnectionExt as _};
use x11rb::protocol::Event as XEvent;
use x11rb::rust_connection::RustConnection;
use x11rb::wrapper::ConnectionExt as _;

/// Size of the `x11-window` sink's window until the first update says the screen's size.
pub const INITIAL_SIZE: (u16, u16) = (640, 480);
/// Bytes of a `PutImage` request before its data.
const PUT_IMAGE_HEADER: usize = 24;

/// Captures further apart than this are drawn as they come (no pacing).
const PACE_MAX: Duration = Duration::from_millis(20);
/// Pacing draws a capture this much sooner than its capture spacing, so a backlog drains.
const PACE_SLACK: Duration = Duration::from_millis(1);
/// Pacing never holds a capture longer than this after the one before: enough to show it in a
/// refresh of its own (60–75 Hz), no more (a held frame is late).
const PACE_HOLD: Duration = Duration::from_millis(13);

/// Whether an update changes enough of the screen to be paced: a sixteenth of it or more. Two
/// large changes drawn in one refresh of the person's screen lose a step of the motion (text
/// scrolling, a 3D view); a small one (a key's echo, a cursor blink) drawn right behind another
/// update loses nothing, and holding it would only make it late.
fn worth_pacing(u: &Update<'_>) -> bool {
    let area: u64 = u
        .rects
        .iter()
        .map(|r| u64::from(r.rect.w) * u64::from(r.rect.h))
        .sum();
    area * 16 >= u64::from(u.header.width) * u64::from(u.header.height)
}

/// When to draw the first frame of a capture stamped `ts` (ns, the source's clock), given the
/// capture drawn before it (`last`: its stamp and when it was drawn): as far after that one as
/// the two were captured apart, less [`PACE_SLACK`], at most [`PACE_HOLD`], so two updates
/// that the path bunched together are not drawn a few ms apart (a viewer, and a person, see
/// them as one). Not when more frames wait (the viewer is behind: catch up), nor for captures
/// more than [`PACE_MAX`] apart (a pause, a slow source), nor for a frame of the same capture.
fn pace_until(last: Option<(u64, Instant)>, ts: u64, more_waiting: bool) -> Option<Instant> {
    let (last_ts, drawn) = last?;
    let spacing = Duration::from_nanos(ts.checked_sub(last_ts).filter(|&d| d > 0)?);
    if more_waiting || spacing > PACE_MAX {
        return None;
    }
    Some(drawn + spacing.saturating_sub(PACE_SLACK).min(PACE_HOLD))
}

/// Connects an `x11-window` sink to its display and starts it.
pub(crate) fn spawn_x11_window_sink(
    rt: &Handle,
    endpoint: &'static str,
    c: &X11WindowConfig,
    rx: Receiver<Frame>,
    delivered: Delivered,
) -> Result<SinkTask, EndpointError> {
    let x = open_x11_window(endpoint, c)?;
    Ok(rt.spawn_blocking(move || run_x11_window_sink(endpoint, x, rx, delivered)))
}

/// Opens the file or framebuffer device of a `framebuffer` sink and starts it.
pub(crate) fn spawn_framebuffer_sink(
    rt: &Handle,
    endpoint: &'static str,
    c: &FramebufferConfig,
    rx: Receiver<Frame>,
    delivered: Delivered,
) -> Result<SinkTask, EndpointError> {
    let f = open_framebuffer(endpoint, c)?;
    Ok(rt.spawn_blocking(move || run_framebuffer_sink(endpoint, f, rx, delivered)))
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
    /// `resize = "remote"`: resizing the window asks the app's screen to follow.
    remote: bool,
    /// HiDPI: this display's pixels per pixel of the app's screen, at first.
    hidpi: f64,
}

impl std::fmt::Debug for X11WindowSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "X11WindowSink({})", self.display)
    }
}

/// Connects and checks the screen format and whether MIT-SHM can be tried.
fn open_x11_window(
    endpoint: &'static str,
    c: &X11WindowConfig,
) -> Result<X11WindowSink, EndpointError> {
    let (conn, screen_num) = x11_connect(endpoint, &c.display)?;
    let screen = check_screen(endpoint, &c.display, &conn, screen_num)?;
    let remote = c.resize == super::config::Resize::Remote;
    // (With `resize = "remote"` the app's screen takes the window's size in pixels.)
    let hidpi = match (remote, c.scale.factor()) {
        (true, _) => 1.0,
        (false, Some(f)) => f,
        (false, None) => scale::dpi_scale(&x_resources(&conn, screen.root)),
    };
    if hidpi != 1.0 {
        tracing::info!(
            endpoint,
            display = %c.display,
            scale = hidpi,
            "HiDPI: each pixel of the app's screen is shown {hidpi} of this display's wide"
        );
    }
    Ok(X11WindowSink {
        conn: Arc::new(conn),
        display: c.display.clone(),
        title: c.title.clone(),
        screen,
        shm: !shm_disabled(),
        remote,
        hidpi,
    })
}

/// The display's X resources (`RESOURCE_MANAGER` on the root window, as `xrdb` sets them);
/// empty when there are none.
fn x_resources(conn: &RustConnection, root: u32) -> String {
    conn.get_property(
        false,
        root,
        xproto::AtomEnum::RESOURCE_MANAGER,
        xproto::AtomEnum::STRING,
        0,
        1 << 16,
    )
    .ok()
    .and_then(|c| c.reply().ok())
    .map(|r| String::from_utf8_lossy(&r.value).into_owned())
    .unwrap_or_default()
}

/// Where the window's pixels are kept: in a segment the server reads (MIT-SHM), or in this
/// process only.
#[derive(Debug)]
enum Store {
    Shm(Shm),
    Local(Framebuffer),
}

impl Store {
    fn bytes(&self) -> &[u8] {
        match self {
            Store::Shm(shm) => shm.seg.bytes(),
            Store::Local(fb) => fb.pixels(),
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Store::Shm(shm) => shm.seg.bytes_mut(),
            Store::Local(fb) => fb.pixels_mut(),
        }
    }
}

/// The image as the window shows it when the window is not the image's size: scaled to the
/// window (see [`super::scale`]), kept like the image.
#[derive(Debug)]
struct Scaled {
    store: Store,
    width: u16,
    height: u16,
}

/// The window and its pixels, shared by the frame loop and the Expose thread.
#[derive(Debug)]
struct View {
    conn: Arc<RustConnection>,
    win: xproto::Window,
    gc: xproto::Gcontext,
    depth: u8,
    /// The image's size (the app's screen).
    width: u16,
    height: u16,
    store: Store,
    /// The window's size, and the image scaled to it when it differs (someone resized the
    /// window, or the app's screen is larger than this one).
    win_width: u16,
    win_height: u16,
    scaled: Option<Scaled>,
    /// The size of this display's screen (an image larger than it is shown scaled to fit).
    screen: (u16, u16),
    /// `resize = "remote"`: the window keeps no shape of its own (the app's screen follows
    /// its size).
    remote: bool,
    /// The window was sized to the app's screen once (with `remote`, only the first time).
    sized: bool,
    /// HiDPI: the window's first size is the app's screen at this factor.
    hidpi: f64,
    use_shm: bool,
    max_put_bytes: usize,
    /// While the link is down: the image as it was (the store holds it dimmed).
    dimmed: Option<Vec<u8>>,
    /// The peer may change the size with every update: a few lines a second, with the count.
    resized: RateLimit,
    /// Rects in the image not drawn yet: a capture in several updates (all but the last with
    /// `FLAG_MORE`) is drawn once it is whole, in one request.
    pending: Vec<Rect>,
    /// Window rects exposed while a capture was half applied: redrawn with it once it is
    /// whole (redrawn at once they would show the half capture).
    exposed: Vec<Rect>,
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
        self.pending.clear();
        Ok(())
    }

    /// A new image size (the app's screen changed): the image cleared to black, the window
    /// at that size, or scaled to fit this display's screen when it is larger (never cropped),
    /// its shape kept by the window manager when someone resizes it.
    fn resize(&mut self, width: u16, height: u16) -> Result<(), XFail> {
        if self.remote && self.sized {
            // `resize = "remote"`: the window's size is the person's, and the app's screen
            // follows it; a new screen size (the one asked for, or one on its way before it)
            // is shown in the window as it is, scaled if it differs. Resizing the window to
            // it would undo a drag still going on.
            self.new_store(width, height)?;
            return self.window_size(self.win_width, self.win_height);
        }
        self.sized = true;
        let (ww, wh) = scale::fit(
            scale::scaled(width, self.hidpi),
            scale::scaled(height, self.hidpi),
            self.screen.0,
            self.screen.1,
        );
        self.conn.configure_window(
            self.win,
            &xproto::ConfigureWindowAux::new()
                .width(u32::from(ww))
                .height(u32::from(wh)),
        )?;
        let mut hints = x11rb::properties::WmSizeHints::new();
        if !self.remote {
            let shape = x11rb::properties::AspectRatio::new(i32::from(width), i32::from(height));
            hints.aspect = Some((shape, shape));
        }
        hints.size = Some((
            x11rb::properties::WmSizeHintsSpecification::ProgramSpecified,
            i32::from(ww),
            i32::from(wh),
        ));
        hints.set_normal_hints(&*self.conn, self.win)?;
        self.new_store(width, height)?;
        self.window_size(ww, wh)?;
        Ok(())
    }

    /// The window is `width`×`height` now (resized by this side, or by someone else: a window
    /// manager, the person): the image is shown scaled to it when the sizes differ, and the
    /// whole window drawn again.
    fn window_size(&mut self, width: u16, height: u16) -> Result<(), XFail> {
        self.win_width = width;
        self.win_height = height;
        if let Some(Scaled {
            store: Store::Shm(old),
            ..
        }) = &self.scaled
        {
            self.conn.shm_detach(old.xid)?;
        }
        self.scaled = None;
        if (width, height) != (self.width, self.height) && width > 0 && height > 0 {
            let len = usize::from(width) * usize::from(height) * 4;
            let mut store = Store::Local(Framebuffer::new(width, height, PixelFormat::Bgrx32));
            if self.use_shm {
                if let Ok(shm) = attach_shm(&self.conn, len.max(4), true) {
                    store = Store::Shm(shm);
                }
            }
            self.scaled = Some(Scaled {
                store,
                width,
                height,
            });
            tracing::info!(
                width = self.width,
                height = self.height,
                window_width = width,
                window_height = height,
                "the viewer shows the app's screen scaled to its window"
            );
        }
        self.draw(Rect::new(0, 0, self.width, self.height), None)
    }

    /// Shows `rect` of the image: draws it, or when the window is scaled, the part of the
    /// window it lands in, scaled anew. `pixels` are its pixels when the caller has them
    /// contiguous (an update's rect), for the non-SHM path.
    fn draw(&mut self, rect: Rect, pixels: Option<&[u8]>) -> Result<(), XFail> {
        let Some(rect) = rect.clip(self.width, self.height) else {
            return Ok(());
        };
        match self.scale_part(rect) {
            Some(r) => self.put(r, None),
            None => self.put(rect, pixels),
        }
    }

    /// When the window is scaled: the window rect `rect` of the image lands in, scaled anew
    /// into the window's pixels.
    fn scale_part(&mut self, rect: Rect) -> Option<Rect> {
        let sc = self.scaled.as_mut()?;
        let r = scale::window_rect(rect, self.width, self.height, sc.width, sc.height)?;
        scale::scale_into(
            self.store.bytes(),
            self.width,
            self.height,
            sc.store.bytes_mut(),
            sc.width,
            sc.height,
            r,
        );
        Some(r)
    }

    /// Puts window rect `rect` on the screen from what the window shows (the image, or the
    /// image scaled to the window); `pixels` as in [`View::draw`] (unscaled only).
    fn put(&self, rect: Rect, pixels: Option<&[u8]>) -> Result<(), XFail> {
        let (store, width, height, pixels) = match &self.scaled {
            Some(sc) => (&sc.store, sc.width, sc.height, None),
            None => (&self.store, self.width, self.height, pixels),
        };
        let Some(rect) = rect.clip(width, height) else {
            return Ok(());
        };
        match store {
            Store::Shm(shm) => {
                self.conn.shm_put_image(
                    self.win,
                    self.gc,
                    width,
                    height,
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
        let store = self.scaled.as_ref().map_or(&self.store, |sc| &sc.store);
        match store {
            Store::Shm(_) => self.conn.sync().map_err(XFail::from),
            Store::Local(_) => self.conn.flush().map_err(XFail::from),
        }
    }

    /// The image's bytes (bgrx32, rows top to bottom).
    fn pixels_mut(&mut self) -> &mut [u8] {
        self.store.bytes_mut()
    }

    /// The link went down (the image is dimmed to half brightness and the title says why)
    /// or came back (the image and title as they were).
    fn link_state(&mut self, state: LinkState, title: &str) -> Result<(), XFail> {
        let (name, dim) = match state {
            LinkState::Up => (title.to_string(), false),
            LinkState::Down => (format!("{title} (link down, reconnecting)"), true),
            LinkState::PeerStopped => (format!("{title} (the peer stopped, waiting for it)"), true),
        };
        let net_wm_name = self.conn.intern_atom(false, b"_NET_WM_NAME")?.reply()?.atom;
        let utf8 = self.conn.intern_atom(false, b"UTF8_STRING")?.reply()?.atom;
        self.conn.change_property8(
            xproto::PropMode::REPLACE,
            self.win,
            xproto::AtomEnum::WM_NAME,
            xproto::AtomEnum::STRING,
            name.as_bytes(),
        )?;
        self.conn.change_property8(
            xproto::PropMode::REPLACE,
            self.win,
            net_wm_name,
            utf8,
            name.as_bytes(),
        )?;
        match (dim, self.dimmed.is_some()) {
            (true, false) => {
                let px = self.pixels_mut();
                let saved = px.to_vec();
                for b in px.iter_mut() {
                    *b /= 2;
                }
                self.dimmed = Some(saved);
            }
            (false, true) => self.undim(),
            _ => {}
        }
        self.draw(Rect::new(0, 0, self.width, self.height), None)?;
        self.finish()
    }

    /// Puts the image back as it was before the link went down.
    fn undim(&mut self) {
        if let Some(saved) = self.dimmed.take() {
            let px = self.pixels_mut();
            if px.len() == saved.len() {
                px.copy_from_slice(&saved);
            }
        }
    }

    /// Applies one update to the image and draws its rects. `Ok(Err(_))`: the update is bad
    /// (the window is unchanged); `Err(_)`: an X failure.
    fn apply(&mut self, u: &Update<'_>) -> Result<Result<(), DisplayFrameError>, XFail> {
        if self.dimmed.is_some() {
            // Frames flow again: the image as it was, then the update on top.
            self.undim();
            self.draw(Rect::new(0, 0, self.width, self.height), None)?;
        }
        let h = u.header;
        if (h.width, h.height) != (self.width, self.height) {
            if let Some(suppressed) = self.resized.admit(Instant::now()) {
                tracing::info!(
                    width = h.width,
                    height = h.height,
                    suppressed,
                    "viewer resized to the app's screen"
                );
            }
            self.resize(h.width, h.height)?;
        }
        // The first update sized the window (or found it at the app's size already): with
        // `remote`, from now on its size is the person's.
        self.sized = true;
        match &mut self.store {
            Store::Shm(shm) => {
                for r in &u.rects {
                    if let Err(e) =
                        blit(shm.seg.bytes_mut(), h.width, h.height, 4, r.rect, r.pixels)
                    {
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
        self.pending.extend(u.rects.iter().map(|r| r.rect));
        if u.header.more() {
            return Ok(Ok(()));
        }
        self.draw_pending()?;
        self.finish()?;
        Ok(Ok(()))
    }

    /// Draws the rects changed since the last draw. With shared memory in one request: the
    /// image of their bounding box, clipped to them, so the window never shows part of an
    /// update (nobody sees tearing, and DAMAGE on the viewer's server counts one update).
    fn draw_pending(&mut self) -> Result<(), XFail> {
        let mut rects = std::mem::take(&mut self.pending);
        if self.scaled.is_some() {
            // Scaled: the window rects they land in, scaled anew.
            rects = rects
                .into_iter()
                .filter_map(|r| self.scale_part(r.clip(self.width, self.height)?))
                .collect();
        }
        // What was exposed while the capture was half applied goes with it, now that it is
        // whole (window rects, as the rects are now).
        rects.append(&mut self.exposed);
        let Some(bbox) = rects.iter().copied().reduce(|a, b| a.union(&b)) else {
            return Ok(());
        };
        let shm = match &self.scaled {
            Some(sc) => matches!(sc.store, Store::Shm(_)),
            None => matches!(self.store, Store::Shm(_)),
        };
        if !shm {
            // Requests of at most max_put_bytes each: one per rect (or band of it).
            for r in rects {
                self.put(r, None)?;
            }
            return Ok(());
        }
        // More rects than this cost the server more to clip than the bounding box does to
        // copy whole.
        const MAX_CLIP: usize = 64;
        let clipped = rects.len() > 1 && rects.len() <= MAX_CLIP;
        if clipped {
            let clip: Vec<xproto::Rectangle> = rects
                .iter()
                .map(|r| {
                    Ok(xproto::Rectangle {
                        x: coord(r.x)?,
                        y: coord(r.y)?,
                        width: r.w,
                        height: r.h,
                    })
                })
                .collect::<Result<_, XFail>>()?;
            self.conn
                .set_clip_rectangles(xproto::ClipOrdering::UNSORTED, self.gc, 0, 0, &clip)?;
        }
        self.put(bbox, None)?;
        if clipped {
            self.conn
                .change_gc(self.gc, &xproto::ChangeGCAux::new().clip_mask(x11rb::NONE))?;
        }
        Ok(())
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
        win_width: w,
        win_height: h,
        scaled: None,
        screen: (s.screen.width_in_pixels, s.screen.height_in_pixels),
        remote: s.remote,
        sized: false,
        hidpi: s.hidpi,
        use_shm: s.shm,
        max_put_bytes,
        dimmed: None,
        resized: RateLimit::with_burst(Duration::from_secs(1), 5),
        pending: Vec::new(),
        exposed: Vec::new(),
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
                    let mut v = lock(&view);
                    let r = Rect::new(e.x, e.y, e.width, e.height);
                    if !v.pending.is_empty() {
                        // Half a capture is in the image: redrawn with the rest of it.
                        v.exposed.push(r);
                        continue;
                    }
                    if let Err(e) = v.put(r, None).and_then(|()| v.finish()) {
                        tracing::debug!(endpoint, error = ?e, "redraw failed");
                    }
                }
                XEvent::ConfigureNotify(c) => {
                    let mut v = lock(&view);
                    if c.window == v.win && (c.width, c.height) != (v.win_width, v.win_height) {
                        if let Err(e) = v.window_size(c.width, c.height).and_then(|()| v.finish()) {
                            tracing::debug!(endpoint, error = ?e, "redraw at the new size failed");
                        }
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
fn run_x11_window_sink(
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
    let _published = publish_viewer_resizing(&s.display, view.win, s.remote);
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
    // Link-state records come from this side, but any 3-byte record of that form does.
    let mut state_refused = RateLimit::default();
    let mut rects = 0u64;
    let mut paced: Option<(u64, Instant)> = None;
    let started = Instant::now();
    let result = (|| {
        while let Some(frame) = rx.blocking_recv() {
            if let Some(state) = LinkState::parse(frame.payload()) {
                match lock(&view).link_state(state, &s.title) {
                    Ok(()) => {}
                    Err(XFail::Conn(e)) => return Err(fatal(e)),
                    Err(XFail::Proto(e)) => {
                        if let Some(suppressed) = state_refused.admit(Instant::now()) {
                            tracing::warn!(endpoint, error = %e, suppressed, "cannot show the link state")
                        }
                    }
                }
                continue;
            }
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
            let ts = frame.meta.timestamp_ns;
            let pace = worth_pacing(&u)
                .then(|| pace_until(paced, ts, !rx.is_empty()))
                .flatten();
            if let Some(at) = pace {
                let now = Instant::now();
                if at > now {
                    std::thread::sleep(at - now);
                }
            }
            if !matches!(paced, Some((t, _)) if t == ts) {
                paced = Some((ts, Instant::now()));
            }
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
fn open_framebuffer(
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
fn run_framebuffer_sink(
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
    use ndd_core::testlog::Captured;

    /// The peer changes the screen's size with every update, as fast as the window follows,
    /// for over a second: at most five lines a second, and a later one says how many were not
    /// shown; every update is drawn.
    #[test]
    fn a_size_change_with_every_update_is_five_lines_a_second() {
        if let Some(m) = ndd_procs::missing(&["Xvfb"]) {
            println!("SKIPPED: needs {m} (apt-get install xvfb)");
            return;
        }
        let x = ndd_procs::Xvfb::start("64x64x24").expect("Xvfb starts");
        let c = super::super::config::X11WindowConfig {
            display: x.display.clone(),
            ..Default::default()
        };
        let s = open_x11_window("x11-window", &c).expect("sink");
        let update = |w: u16| {
            Update {
                header: ndd_wire::display::UpdateHeader {
                    width: w,
                    height: 2,
                    format: PixelFormat::Bgrx32,
                    flags: 0,
                },
                rects: vec![ndd_wire::display::RectPixels {
                    rect: Rect::new(0, 0, 1, 1),
                    encoding: ndd_wire::display::Encoding::Raw,
                    pixels: &[0, 0, 0xff, 0],
                }],
            }
            .emit()
            .unwrap()
        };
        let sizes = [update(2), update(3)];
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let (log, guard) = Captured::start();
        let started = Instant::now();
        let feeder = {
            let log = log.clone();
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !log.counted("viewer resized") {
                    assert!(started.elapsed() < Duration::from_secs(10), "no count");
                    let meta = ndd_core::Meta {
                        seq: n,
                        ..Default::default()
                    };
                    tx.blocking_send(Frame::new(meta, &sizes[n as usize % 2]))
                        .unwrap();
                    n += 1;
                }
                n
            })
        };
        let delivered = Delivered::default();
        let report = run_x11_window_sink("x11-window", s, rx, delivered.clone()).expect("sink");
        drop(guard);
        let n = feeder.join().unwrap();
        assert_eq!((report.frames, delivered.count()), (n, n));
        let secs = started.elapsed().as_secs_f64().ceil() as usize;
        let lines = log.matching("viewer resized");
        assert!(lines.len() <= 5 * (secs + 1), "{n} updates: {lines:#?}");
    }

    #[test]
    fn only_updates_of_a_sixteenth_of_the_screen_or_more_are_paced() {
        let update = |rects: &[(u16, u16)]| Update {
            header: ndd_wire::display::UpdateHeader {
                width: 800,
                height: 600,
                format: PixelFormat::Bgrx32,
                flags: 0,
            },
            rects: rects
                .iter()
                .map(|&(w, h)| ndd_wire::display::RectPixels {
                    rect: Rect::new(0, 0, w, h),
                    encoding: ndd_wire::display::Encoding::Raw,
                    pixels: &[],
                })
                .collect(),
        };
        // A key's echo (one character cell), or a cursor: drawn at once.
        assert!(!worth_pacing(&update(&[(6, 13)])));
        // A sixteenth of 800x600 is 30 000 pixels: in one rect or several.
        assert!(worth_pacing(&update(&[(200, 150)])));
        assert!(!worth_pacing(&update(&[(200, 149)])));
        assert!(worth_pacing(&update(&[(200, 75), (200, 75)])));
        // Scrolling text, a video frame: paced.
        assert!(worth_pacing(&update(&[(800, 600)])));
    }

    #[test]
    fn bunched_captures_are_drawn_as_far_apart_as_they_were_taken() {
        let t0 = Instant::now();
        let ms = |n: u64| n * 1_000_000;
        let last = Some((ms(1000), t0));
        // Captured 16 ms apart, arrived at once: drawn 13 ms after the one before (as far
        // apart as captured, less 1 ms, at most 13 ms); 10 ms apart: 9 ms.
        assert_eq!(
            pace_until(last, ms(1016), false),
            Some(t0 + Duration::from_millis(13))
        );
        assert_eq!(
            pace_until(last, ms(1010), false),
            Some(t0 + Duration::from_millis(9))
        );
        // The first capture, another frame of the same capture, an older stamp: no wait.
        assert_eq!(pace_until(None, ms(1016), false), None);
        assert_eq!(pace_until(last, ms(1000), false), None);
        assert_eq!(pace_until(last, ms(990), false), None);
        // More frames waiting (the viewer is behind), or a pause between captures: no wait.
        assert_eq!(pace_until(last, ms(1016), true), None);
        assert_eq!(pace_until(last, ms(1021), false), None);
        assert_eq!(
            pace_until(last, ms(1020), false),
            Some(t0 + Duration::from_millis(13))
        );
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

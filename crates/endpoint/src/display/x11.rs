//! What the display source and sinks share: the X screen they can work with
//! ([`PixelFormat::Bgrx32`](ndd_wire::display::PixelFormat::Bgrx32) only), MIT-SHM segments the X server attaches too (or why not:
//! [`NO_SHM_ENV`]), failed requests ([`XFail`]), and the viewer registry.
//!
//! The `x11-window` sink publishes its window in a process-wide registry keyed by the
//! `display` string, where an `x11-input` source with `window = "viewer"` finds it
//! ([`wait_for_viewer`]): the viewer of a remote desktop shows the app's screen and captures
//! the person's input.

use crate::common::error::EndpointError;
use crate::common::x11::x11_err;
use crate::sys::ShmSegment;
use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};
use x11rb::connection::{Connection, RequestConnection};
use x11rb::errors::{ConnectionError, ReplyError, ReplyOrIdError};
use x11rb::protocol::shm::{self, ConnectionExt as _};
use x11rb::protocol::xproto;
use x11rb::rust_connection::RustConnection;

/// Longest wait for X events before a loop checks whether it should stop.
pub const POLL: Duration = Duration::from_millis(100);
/// Environment variable that turns MIT-SHM off (any value but empty or `0`): images then go
/// through plain `GetImage` / `PutImage` requests, as with a remote X server.
pub const NO_SHM_ENV: &str = "NDD_X11_NO_SHM";

pub(super) fn shm_disabled() -> bool {
    std::env::var_os(NO_SHM_ENV).is_some_and(|v| !v.is_empty() && v != "0")
}

/// A failed X request: the connection is gone (fatal), or the server refused one request
/// (the stream can go on).
#[derive(Debug)]
pub(super) enum XFail {
    Conn(String),
    Proto(String),
}

/// A display update that did not lay out (a protocol matter: the next capture is a keyframe).
impl From<String> for XFail {
    fn from(e: String) -> Self {
        XFail::Proto(e)
    }
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

/// What an X screen must be for [`PixelFormat::Bgrx32`](ndd_wire::display::PixelFormat::Bgrx32): depth 24 or 32, TrueColor with
/// masks 0xff0000 / 0xff00 / 0xff, 32 bits per pixel, LSBFirst images.
pub(super) fn check_screen(
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
pub(super) struct Shm {
    pub(super) seg: ShmSegment,
    pub(super) xid: shm::Seg,
}

/// Why MIT-SHM cannot be used (the endpoint then captures with GetImage or draws with
/// PutImage).
#[derive(Debug, thiserror::Error)]
pub(super) enum ShmError {
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
pub(super) fn attach_shm(
    conn: &RustConnection,
    len: usize,
    read_only: bool,
) -> Result<Shm, ShmError> {
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

pub(super) fn coord(v: u16) -> Result<i16, XFail> {
    i16::try_from(v).map_err(|_| XFail::Proto(format!("coordinate {v} beyond the X range")))
}

// ---------------------------------------------------------------------------------------
// Viewer registry

struct Viewers {
    /// Display → (window, whether a resize of it asks the app's screen to follow).
    map: Mutex<HashMap<String, (u32, bool)>>,
    changed: Condvar,
}

fn viewers() -> &'static Viewers {
    static VIEWERS: OnceLock<Viewers> = OnceLock::new();
    VIEWERS.get_or_init(|| Viewers {
        map: Mutex::new(HashMap::new()),
        changed: Condvar::new(),
    })
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
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
#[cfg(test)]
pub(super) fn publish_viewer(display: &str, window: u32) -> ViewerGuard {
    publish_viewer_resizing(display, window, false)
}

/// Publishes `window` as the viewer of `display`; `remote`: resizing it asks the app's screen
/// to take its size (`resize = "remote"`).
pub(super) fn publish_viewer_resizing(display: &str, window: u32, remote: bool) -> ViewerGuard {
    let v = viewers();
    lock(&v.map).insert(display.to_string(), (window, remote));
    v.changed.notify_all();
    ViewerGuard {
        display: display.to_string(),
        window,
    }
}

impl Drop for ViewerGuard {
    fn drop(&mut self) {
        let mut map = lock(&viewers().map);
        if map.get(&self.display).map(|v| v.0) == Some(self.window) {
            map.remove(&self.display);
        }
    }
}

/// Whether the viewer `window` of `display` asks the app's screen to follow its size.
pub(crate) fn viewer_resizes_remote(display: &str, window: u32) -> bool {
    lock(&viewers().map).get(display) == Some(&(window, true))
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
        if let Some(&(w, _)) = map.get(display) {
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
}

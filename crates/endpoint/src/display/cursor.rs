//! The `x11-cursor` source and sink: the app display's cursor image travels as its own small
//! stream and the viewer's X server draws it, so the pointer moves with no network delay and
//! its shape (arrow, text beam, hand) follows what the app shows (VNC's cursor
//! pseudo-encoding).
//!
//! - source (app side): XFIXES `SelectCursorInput` on the root window; the current image first,
//!   then a [`Cursor`] record each time the displayed cursor changes (`CursorNotify`,
//!   `GetCursorImage`).
//! - sink (device side): sets each image as the cursor of the viewer window (the window of an
//!   `x11-window` sink of the same `display` in the same process): a 32-bit pixmap, a RENDER
//!   picture, `RenderCreateCursor`, `ChangeWindowAttributes`.
//!
//! Both run as blocking tasks, like the other X endpoints.

use super::config::{X11CursorSinkConfig, X11CursorSourceConfig};
use super::x11::wait_for_viewer;
use crate::common::delivered::Delivered;
use crate::common::emitter::Emitter;
use crate::common::error::EndpointError;
use crate::common::report::{SinkReport, SinkTask, SourceReport, SourceTask};
use crate::common::x11::{wait_readable_for, x11_connect, x11_err};
use ndd_core::{Frame, RateLimit};
use ndd_wire::display::Cursor;
use std::time::{Duration, Instant};
use tokio::runtime::Handle;
use tokio::sync::mpsc::{Receiver, Sender};
use x11rb::connection::Connection;
use x11rb::protocol::render::{self, ConnectionExt as _};
use x11rb::protocol::xfixes::{self, ConnectionExt as _};
use x11rb::protocol::xproto::{self, ConnectionExt as _};
use x11rb::protocol::Event as XEvent;
use x11rb::rust_connection::RustConnection;

/// How long the sink waits for the viewer window.
const VIEWER_WAIT: Duration = Duration::from_secs(30);
/// How long the source waits for X events at a time (it notices a closed stream then).
const POLL: Duration = Duration::from_millis(100);

/// Connects an `x11-cursor` source and starts it.
pub(crate) fn spawn_x11_cursor_source(
    rt: &Handle,
    endpoint: &'static str,
    c: &X11CursorSourceConfig,
    stream: u16,
    tx: Sender<Frame>,
) -> Result<SourceTask, EndpointError> {
    let d = c.display.clone();
    let (conn, screen) = x11_connect(endpoint, &d)?;
    let root = conn.setup().roots[screen].root;
    let err = |e: String| x11_err(endpoint, &d, e);
    conn.xfixes_query_version(5, 0)
        .map_err(|e| err(e.to_string()))?
        .reply()
        .map_err(|e| EndpointError::Unavailable {
            endpoint,
            what: format!("X display {d}: no XFIXES extension ({e})"),
            hint: "the x11-cursor source needs XFIXES 2 or later (Xorg, Xvfb and Xwayland have it)"
                .into(),
        })?;
    conn.xfixes_select_cursor_input(root, xfixes::CursorNotifyMask::DISPLAY_CURSOR)
        .map_err(|e| err(e.to_string()))?
        .check()
        .map_err(|e| err(format!("cannot watch the cursor: {e:?}")))?;
    Ok(rt.spawn_blocking(move || run_source(endpoint, conn, d, stream, tx)))
}

/// The current cursor image as a record.
fn current(conn: &RustConnection) -> Result<Cursor, String> {
    let r = conn
        .xfixes_get_cursor_image()
        .map_err(|e| e.to_string())?
        .reply()
        .map_err(|e| e.to_string())?;
    let mut pixels = Vec::with_capacity(r.cursor_image.len() * 4);
    for p in &r.cursor_image {
        pixels.extend_from_slice(&p.to_le_bytes());
    }
    let c = Cursor {
        width: r.width,
        height: r.height,
        xhot: r.xhot.min(r.width.saturating_sub(1)),
        yhot: r.yhot.min(r.height.saturating_sub(1)),
        pixels,
    };
    Ok(c)
}

fn run_source(
    endpoint: &'static str,
    conn: RustConnection,
    display: String,
    stream: u16,
    tx: Sender<Frame>,
) -> Result<SourceReport, EndpointError> {
    let fatal = |e: String| x11_err(endpoint, &display, e);
    let mut em = Emitter::new(stream, tx);
    let mut last: Option<Cursor> = None;
    let mut changed = true;
    // Programs on the display change the cursor as often as they like.
    let mut unsent = RateLimit::default();
    loop {
        while let Some(ev) = conn.poll_for_event().map_err(|e| fatal(e.to_string()))? {
            if let XEvent::XfixesCursorNotify(_) = ev {
                changed = true;
            }
        }
        if em.tx.is_closed() {
            break;
        }
        if changed {
            changed = false;
            let c = current(&conn).map_err(fatal)?;
            if last.as_ref() != Some(&c) {
                match c.emit() {
                    Ok(bytes) => {
                        if !em.send_blocking(Frame::new(em.next_meta(), &bytes)) {
                            break;
                        }
                        tracing::trace!(
                            endpoint,
                            width = c.width,
                            height = c.height,
                            "cursor shape"
                        );
                        last = Some(c);
                    }
                    // A cursor larger than a record carries: keep the last one shown.
                    Err(e) => {
                        if let Some(suppressed) = unsent.admit(Instant::now()) {
                            tracing::warn!(endpoint, error = %e, suppressed, "cursor not sent")
                        }
                    }
                }
            }
        }
        wait_readable_for(conn.stream(), POLL).map_err(|e| fatal(e.to_string()))?;
    }
    Ok(em.report)
}

/// Connects an `x11-cursor` sink and starts it.
pub(crate) fn spawn_x11_cursor_sink(
    rt: &Handle,
    endpoint: &'static str,
    c: &X11CursorSinkConfig,
    rx: Receiver<Frame>,
    delivered: Delivered,
) -> Result<SinkTask, EndpointError> {
    let (conn, root, argb) = open_sink(endpoint, c)?;
    let d = c.display.clone();
    Ok(rt.spawn_blocking(move || run_sink(endpoint, conn, d, root, argb, rx, delivered)))
}

/// The sink's connection, root window and ARGB32 picture format.
fn open_sink(
    endpoint: &'static str,
    c: &X11CursorSinkConfig,
) -> Result<(RustConnection, xproto::Window, render::Pictformat), EndpointError> {
    let d = c.display.clone();
    let (conn, screen) = x11_connect(endpoint, &d)?;
    let root = conn.setup().roots[screen].root;
    let unavailable = |e: String| {
        EndpointError::Unavailable {
        endpoint,
        what: format!("X display {d}: no usable RENDER extension ({e})"),
        hint: "the x11-cursor sink needs RENDER 0.5 or later for colour cursors (every current X server has it)".into(),
    }
    };
    conn.render_query_version(0, 11)
        .map_err(|e| unavailable(e.to_string()))?
        .reply()
        .map_err(|e| unavailable(e.to_string()))?;
    let formats = conn
        .render_query_pict_formats()
        .map_err(|e| unavailable(e.to_string()))?
        .reply()
        .map_err(|e| unavailable(e.to_string()))?;
    let argb = formats
        .formats
        .iter()
        .find(|f| {
            f.type_ == render::PictType::DIRECT
                && f.depth == 32
                && f.direct.alpha_mask == 0xff
                && f.direct.alpha_shift == 24
                && f.direct.red_shift == 16
                && f.direct.green_shift == 8
                && f.direct.blue_shift == 0
        })
        .map(|f| f.id)
        .ok_or_else(|| unavailable("no ARGB32 picture format".into()))?;
    Ok((conn, root, argb))
}

/// Makes `c` an X cursor.
fn make_cursor(
    conn: &RustConnection,
    root: xproto::Window,
    argb: render::Pictformat,
    c: &Cursor,
) -> Result<xproto::Cursor, String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let pixmap = conn.generate_id().map_err(|x| e(&x))?;
    let gc = conn.generate_id().map_err(|x| e(&x))?;
    let picture = conn.generate_id().map_err(|x| e(&x))?;
    let cursor = conn.generate_id().map_err(|x| e(&x))?;
    conn.create_pixmap(32, pixmap, root, c.width, c.height)
        .map_err(|x| e(&x))?;
    conn.create_gc(gc, pixmap, &xproto::CreateGCAux::new())
        .map_err(|x| e(&x))?;
    conn.put_image(
        xproto::ImageFormat::Z_PIXMAP,
        pixmap,
        gc,
        c.width,
        c.height,
        0,
        0,
        0,
        32,
        &c.pixels,
    )
    .map_err(|x| e(&x))?;
    conn.render_create_picture(picture, pixmap, argb, &render::CreatePictureAux::new())
        .map_err(|x| e(&x))?;
    conn.render_create_cursor(cursor, picture, c.xhot, c.yhot)
        .map_err(|x| e(&x))?;
    conn.render_free_picture(picture).map_err(|x| e(&x))?;
    conn.free_gc(gc).map_err(|x| e(&x))?;
    conn.free_pixmap(pixmap).map_err(|x| e(&x))?;
    Ok(cursor)
}

fn run_sink(
    endpoint: &'static str,
    conn: RustConnection,
    display: String,
    root: xproto::Window,
    argb: render::Pictformat,
    mut rx: Receiver<Frame>,
    delivered: Delivered,
) -> Result<SinkReport, EndpointError> {
    let fatal = |e: String| x11_err(endpoint, &display, e);
    let Some(viewer) = wait_for_viewer(&display, VIEWER_WAIT, || rx.is_closed()) else {
        if rx.is_closed() {
            return Ok(SinkReport::default());
        }
        return Err(EndpointError::Unavailable {
            endpoint,
            what: format!(
                "no x11-window sink showed a viewer window on X display {display} within {} s",
                VIEWER_WAIT.as_secs()
            ),
            hint: "the x11-cursor sink sets the cursor of the viewer window of an x11-window sink \
                   with the same `display` in the same ndd process"
                .into(),
        });
    };
    let mut report = SinkReport::default();
    let mut shown: Option<xproto::Cursor> = None;
    // The peer sends as many bad records as it likes: one line a second, with the count.
    let mut bad = RateLimit::default();
    while let Some(frame) = rx.blocking_recv() {
        report.frames += 1;
        report.bytes += frame.len() as u64;
        let seq = frame.meta.seq;
        match Cursor::parse(frame.payload()) {
            Ok(c) => {
                let cursor = make_cursor(&conn, root, argb, &c).map_err(fatal)?;
                conn.change_window_attributes(
                    viewer,
                    &xproto::ChangeWindowAttributesAux::new().cursor(cursor),
                )
                .map_err(|e| fatal(e.to_string()))?;
                if let Some(old) = shown.replace(cursor) {
                    conn.free_cursor(old).map_err(|e| fatal(e.to_string()))?;
                }
                conn.flush().map_err(|e| fatal(e.to_string()))?;
            }
            Err(e) => {
                if let Some(suppressed) = bad.admit(Instant::now()) {
                    tracing::warn!(endpoint, error = %e, suppressed, "bad cursor record dropped");
                }
            }
        }
        delivered.mark(seq);
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndd_core::testlog::Captured;

    /// The peer sends bad cursor records as fast as it can for over a second: one line a
    /// second, a later one saying how many were not shown; every frame is counted.
    #[test]
    fn bad_cursor_records_at_line_rate_are_one_line_a_second() {
        if let Some(m) = ndd_procs::missing(&["Xvfb"]) {
            println!("SKIPPED: needs {m} (apt-get install xvfb)");
            return;
        }
        let x = ndd_procs::Xvfb::start("64x64x24").expect("Xvfb starts");
        let c = X11CursorSinkConfig {
            display: x.display.clone(),
        };
        let (conn, root, argb) = open_sink("x11-cursor", &c).expect("sink");
        let _viewer = super::super::x11::publish_viewer(&x.display, root);
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let (log, guard) = Captured::start();
        let started = Instant::now();
        let feeder = {
            let log = log.clone();
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !log.counted("bad cursor record dropped") {
                    assert!(started.elapsed() < Duration::from_secs(10), "no count");
                    let meta = ndd_core::Meta {
                        seq: n,
                        ..Default::default()
                    };
                    tx.blocking_send(Frame::new(meta, b"\x07 not a cursor"))
                        .unwrap();
                    n += 1;
                }
                n
            })
        };
        let delivered = Delivered::default();
        let report = run_sink(
            "x11-cursor",
            conn,
            x.display.clone(),
            root,
            argb,
            rx,
            delivered.clone(),
        )
        .expect("the sink goes on");
        drop(guard);
        let n = feeder.join().unwrap();
        assert_eq!((report.frames, delivered.count()), (n, n));
        let secs = started.elapsed().as_secs_f64().ceil() as usize;
        let lines = log.matching("bad cursor record dropped");
        assert!(lines.len() <= secs + 1, "{n} frames: {lines:#?}");
    }
}

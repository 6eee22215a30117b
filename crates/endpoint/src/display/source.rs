//! The `x11-screen` source: the screen of an X display as display updates, a keyframe of the
//! whole screen first, then the rectangles DAMAGE reports changed, at most `max_fps` times a
//! second, captured with MIT-SHM `ShmGetImage` (or `GetImage`) straight into the frames.
//!
//! It runs as a blocking task (`spawn_blocking`), and waits for X events at most [`POLL`] at a
//! time, so it notices within that time that its receiver is gone.
//!
//! Frame spoiling: it captures only when the path can take the update: when the driver's
//! [`Demand`] says the session wants a frame, or (without one) when its previous update has
//! left the channel. Damage reported in between is merged by the Damage object, so the next
//! capture covers all of it and no stale update ever waits in a queue. A keyframe request on
//! the demand (the peer restarted) makes the next capture the whole screen.

use super::config::X11ScreenConfig;
use super::x11::{attach_shm, check_screen, coord, shm_disabled, Shm, XFail, NO_SHM_ENV, POLL};
use crate::common::clock::pacing;
use crate::common::demand::Demand;
use crate::common::emitter::Emitter;
use crate::common::error::EndpointError;
use crate::common::report::{SourceReport, SourceTask};
use crate::common::x11::{wait_readable_for, x11_connect, x11_err};
use ndd_core::frame::DEFAULT_HEADROOM;
use ndd_core::{Frame, Meta, RateLimit};
use ndd_wire::display::{
    bands, coalesce, plan_frames, PixelFormat, Rect, UpdateHeader, UpdateLayout, FLAG_KEYFRAME,
    FLAG_MORE, MAX_UPDATE_PAYLOAD,
};
use std::time::{Duration, Instant};
use tokio::runtime::Handle;
use tokio::sync::mpsc::Sender;
use x11rb::connection::{Connection, RequestConnection};
use x11rb::protocol::damage::{self, ConnectionExt as _};
use x11rb::protocol::shm::ConnectionExt as _;
use x11rb::protocol::xfixes::{self, ConnectionExt as _};
use x11rb::protocol::xproto::{self, ConnectionExt as _};
use x11rb::protocol::Event as XEvent;
use x11rb::rust_connection::RustConnection;
use x11rb::wrapper::ConnectionExt as _;

/// How often a source with damage pending looks whether the path takes an update.
const SPOIL_POLL: Duration = Duration::from_millis(2);

/// How long after the first damage of an update the capture waits (when its slot has come):
/// a program draws one change as several requests (an xterm scrolls with a copy, then draws
/// the new line), and a capture right at the first of them shows half the change and spends
/// the slot on it. VNC servers defer the same way (Xvnc's `-DeferUpdate`, 1 ms).
const DEFER: Duration = Duration::from_millis(1);

/// Most rects one capture sends after damage coalescing.
pub const MAX_RECTS: usize = 32;

/// Connects an `x11-screen` source to its display and starts it.
pub(crate) fn spawn_x11_screen_source(
    rt: &Handle,
    endpoint: &'static str,
    c: &X11ScreenConfig,
    stream: u16,
    tx: Sender<Frame>,
    demand: Option<Demand>,
) -> Result<SourceTask, EndpointError> {
    let x = open_x11_screen(endpoint, c)?;
    Ok(rt.spawn_blocking(move || run_x11_screen(endpoint, x, stream, tx, demand)))
}

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
fn open_x11_screen(
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
        refresh: pacing(c.refresh_s),
        max_get_bytes,
    })
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

/// When the capture after one taken at `now` for the slot `slot` may be: a grid, not a gap.
/// A capture that came late (damage after its slot, a busy path) does not push the later ones
/// back, so content changing `max_fps` times a second is captured `max_fps` times a second;
/// at most one slot is caught up (a capture later than a whole gap starts a new grid). Two
/// captures are never closer than [`MIN_SPACING`] of a gap, though: a viewer shows two
/// updates drawn a few ms apart as one (and a person sees one), so catching up a slot at once
/// would spend a capture on nothing visible.
fn next_slot(slot: Instant, now: Instant, gap: Duration) -> Instant {
    let grid = now.checked_sub(gap).map_or(now, |t| slot.max(t)) + gap;
    grid.max(now + gap.mul_f64(MIN_SPACING))
}

/// The least spacing of two captures, as a fraction of `1 / max_fps` (13.3 ms at 60 fps).
const MIN_SPACING: f64 = 0.8;

/// The `x11-screen` source loop: a keyframe first, then the damaged rects at most `max_fps`
/// times a second, and a keyframe every `refresh_s`.
fn run_x11_screen(
    endpoint: &'static str,
    mut s: X11Screen,
    stream: u16,
    tx: Sender<Frame>,
    demand: Option<Demand>,
) -> Result<SourceReport, EndpointError> {
    let display = s.display.clone();
    let fatal = |e: String| x11_err(endpoint, &display, e);
    let mut em = Emitter::new(stream, tx);
    let mut keyframe_due = true;
    let mut damaged = false;
    // When the first damage since the last capture came in.
    let mut damaged_at = Instant::now();
    let mut next_capture = Instant::now();
    let mut last_keyframe = Instant::now();
    let mut captures = 0u64;
    let mut refused = RateLimit::default();
    // A program on the display may resize the screen as often as it likes.
    let mut resized = RateLimit::with_burst(Duration::from_secs(1), 5);
    let started = Instant::now();
    loop {
        while let Some(ev) = s.conn.poll_for_event().map_err(|e| fatal(e.to_string()))? {
            match ev {
                XEvent::DamageNotify(_) => {
                    if !damaged {
                        damaged_at = Instant::now();
                    }
                    damaged = true;
                }
                XEvent::ConfigureNotify(c)
                    if c.window == s.root && (c.width, c.height) != (s.width, s.height) =>
                {
                    if let Some(suppressed) = resized.admit(Instant::now()) {
                        tracing::info!(
                            endpoint,
                            width = c.width,
                            height = c.height,
                            suppressed,
                            "screen size changed"
                        );
                    }
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
        if demand.as_ref().is_some_and(Demand::take_keyframe) {
            keyframe_due = true;
        }
        let pending = keyframe_due || damaged;
        // Frame spoiling: capture only when the path takes the update now.
        let path_free = pending
            && match &demand {
                Some(d) => d.wanted(),
                None => em.tx.capacity() == em.tx.max_capacity(),
            };
        // The moment this update may be captured: its slot, and the deferral after its first
        // damage (a keyframe does not wait).
        let due = if keyframe_due {
            next_capture
        } else {
            next_capture.max(damaged_at + DEFER)
        };
        if pending && path_free && now >= due {
            if let Some(d) = &demand {
                d.take();
            }
            let keyframe = keyframe_due;
            let rects = if keyframe {
                s.clear_damage()
                    .map(|()| vec![Rect::new(0, 0, s.width, s.height)])
            } else {
                s.take_damage()
            };
            keyframe_due = false;
            damaged = false;
            next_capture = next_slot(next_capture, now, s.min_gap);
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
        if pending && !path_free {
            // Waiting for the path: look again soon (damage keeps merging meanwhile).
            wait = SPOIL_POLL;
        } else if pending {
            wait = wait.min(due.saturating_duration_since(now));
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
    let (width, height) = (s.width, s.height);
    send_update(em, (width, height), rects, keyframe, |layout, payload| {
        s.capture_into(layout, payload)
    })
}

/// Sends `rects` of a `width`x`height` Bgrx32 screen as display updates, cut into frames under
/// [`MAX_UPDATE_PAYLOAD`] (all but the last flagged `FLAG_MORE`), `fill` writing each frame's
/// pixels; `Ok(false)` when the receiver is gone. Every screen source sends through it.
pub(crate) fn send_update<E: From<String>>(
    em: &mut Emitter,
    (width, height): (u16, u16),
    rects: &[Rect],
    keyframe: bool,
    mut fill: impl FnMut(&UpdateLayout, &mut [u8]) -> Result<(), E>,
) -> Result<bool, E> {
    let frames = plan_frames(rects, PixelFormat::Bgrx32, MAX_UPDATE_PAYLOAD);
    let n = frames.len();
    // Every frame of one capture carries the capture's time: the session counts a capture's
    // frames as one when it bounds what the peer has not completed
    // (`ndd_core::session::stream::UNDELIVERED_CAPTURES`).
    let taken = em.next_meta().timestamp_ns;
    for (i, rects) in frames.into_iter().enumerate() {
        let mut flags = 0;
        if keyframe {
            flags |= FLAG_KEYFRAME;
        }
        if i + 1 < n {
            flags |= FLAG_MORE;
        }
        let header = UpdateHeader {
            width,
            height,
            format: PixelFormat::Bgrx32,
            flags,
        };
        let layout = UpdateLayout::new(header, rects).map_err(|e| E::from(e.to_string()))?;
        let meta = Meta {
            timestamp_ns: taken,
            ..em.next_meta()
        };
        let mut frame = Frame::zeroed(meta, DEFAULT_HEADROOM, layout.len());
        let payload = frame.payload_mut();
        layout
            .write_headers(payload)
            .map_err(|e| E::from(e.to_string()))?;
        fill(&layout, payload)?;
        let len = layout.len() as u64;
        if !em.send_blocking(frame) {
            return Ok(false);
        }
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

#[cfg(test)]
mod pacing_tests {
    use super::next_slot;
    use std::time::{Duration, Instant};

    #[test]
    fn late_captures_keep_the_grid_and_the_rate() {
        let gap = Duration::from_micros(16_667);
        let t0 = Instant::now() + Duration::from_secs(1);
        // On time: the next slot is one gap on.
        assert_eq!(next_slot(t0, t0, gap), t0 + gap);
        // 3 ms late: still on the grid (the next one comes 13.7 ms after this one).
        let late = t0 + Duration::from_millis(3);
        assert_eq!(next_slot(t0, late, gap), t0 + gap);
        // 5 ms late: the grid would put the next 11.7 ms after this one; it comes 13.3 ms on.
        let late = t0 + Duration::from_millis(5);
        assert_eq!(next_slot(t0, late, gap), late + gap.mul_f64(0.8));
        // More than a gap late: a new grid, the next capture 0.8 of a gap on (not at once:
        // two updates drawn a few ms apart look like one).
        let very = t0 + Duration::from_millis(40);
        assert_eq!(next_slot(t0, very, gap), very + gap.mul_f64(0.8));
        // 10 ms late: the grid would allow the next 6.7 ms on; it comes 13.3 ms on.
        let ten = t0 + Duration::from_millis(10);
        assert_eq!(next_slot(t0, ten, gap), ten + gap.mul_f64(0.8));

        // Damage always pending (a 3D program drawing as fast as it can), each capture taken
        // up to 3 ms after it is allowed (the loop's wake-up, a path busy for a moment): on
        // the grid 600 captures take 10 s (60 fps); with a gap after each capture the delays
        // add up.
        let (mut slot, mut last_grid, mut last_gapped) = (t0, t0, t0);
        for i in 0..600u32 {
            let late = Duration::from_micros(u64::from(i * 7919 % 3000));
            last_grid = slot + late;
            slot = next_slot(slot, last_grid, gap);
            if i > 0 {
                last_gapped += gap + late;
            }
        }
        let fps = |last: Instant| 599.0 / (last - t0).as_secs_f64();
        let (grid_fps, gap_fps) = (fps(last_grid), fps(last_gapped));
        assert!((59.5..=60.1).contains(&grid_fps), "{grid_fps}");
        assert!(gap_fps < 58.0, "{gap_fps}");
    }
}

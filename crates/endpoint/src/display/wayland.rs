//! The `wayland-screen` source: an output of a wlroots compositor (sway, Hyprland, river,
//! labwc…) as display updates, through `ext-image-copy-capture-v1` where the compositor
//! offers it (sway 1.11, wlroots 0.19 and later), else `wlr-screencopy-unstable-v1`: a
//! keyframe of the whole output first, then the rectangles the compositor reports changed
//! (the ext protocol's frame damage; wlr's `copy_with_damage`, version 2 or later), at most
//! `max_fps` times a second.
//!
//! The ext protocol keeps one capture session: the compositor says the buffer it takes
//! (size and shm formats) once and again when it changes, and answers a capture only once
//! the output changed, with what changed since the last one. A keyframe of a still output
//! (a viewer that joined, `refresh_s`) is sent from the buffer as the last capture left it,
//! which is the output as it stands: the ext protocol, unlike wlr's `copy`, has no capture
//! that does not wait for a change.
//!
//! The same updates as `x11-screen` (Bgrx32 rectangles, so every stack and sink that takes
//! one takes the other), the same frame spoiling: a capture is asked for only when the path
//! can take the update (the driver's [`Demand`], or the previous update having left the
//! channel), and `copy_with_damage` is answered only once something changed, so a still
//! screen costs nothing. The pixels come in a `wl_shm` buffer (a memfd shared with the
//! compositor), copied row by row into the frames (upside down when the compositor says so).
//!
//! It runs as a blocking task and waits for the compositor at most [`POLL`] at a time, so it
//! notices within that time that its receiver is gone, or that a keyframe is due.

use super::config::{WaylandProtocol, WaylandScreenConfig};
use super::pacer::{CapturePacer, Pace};
use crate::common::clock::pacing;
use crate::common::demand::Demand;
use crate::common::emitter::Emitter;
use crate::common::error::EndpointError;
use crate::common::report::{SourceReport, SourceTask};
use crate::common::wayland::{ignore_events, memfd, pump, unavailable, wayland_connect};
use ndd_core::Frame;
use ndd_wire::display::{coalesce, Rect, UpdateLayout};
use std::time::{Duration, Instant};
use tokio::runtime::Handle;
use tokio::sync::mpsc::Sender;
use wayland_client::globals::registry_queue_init;
use wayland_client::protocol::{wl_buffer, wl_callback, wl_output, wl_shm, wl_shm_pool};
use wayland_client::{Connection, Dispatch, EventQueue, Proxy, QueueHandle, WEnum};
use wayland_protocols::ext::image_capture_source::v1::client::{
    ext_image_capture_source_v1 as source_v1,
    ext_output_image_capture_source_manager_v1 as sources_v1,
};
use wayland_protocols::ext::image_copy_capture::v1::client::{
    ext_image_copy_capture_frame_v1 as ext_frame_v1,
    ext_image_copy_capture_manager_v1 as ext_manager_v1,
    ext_image_copy_capture_session_v1 as session_v1,
};
use wayland_protocols_wlr::screencopy::v1::client::{
    zwlr_screencopy_frame_v1 as frame_v1, zwlr_screencopy_manager_v1 as manager_v1,
};

/// Longest wait for the compositor in one go.
const POLL: Duration = Duration::from_millis(100);

/// Most rects one capture sends after damage coalescing.
const MAX_RECTS: usize = 32;

/// How long the compositor may take to describe the buffer a capture needs.
const DESCRIBE_WAIT: Duration = Duration::from_secs(5);

/// A compositor that captures into GPU buffers only.
const NO_SHM: &str = "the compositor offers no shared-memory buffer for this output (only dmabuf), which this source cannot take";

/// What the compositor said about the capture under way.
#[derive(Debug, Default)]
struct Capture {
    /// The shm buffer it needs: format, width, height, stride.
    buffer: Option<(WEnum<wl_shm::Format>, u32, u32, u32)>,
    /// Version 3: every buffer kind described.
    described: bool,
    y_invert: bool,
    damage: Vec<(u32, u32, u32, u32)>,
    ready: bool,
    failed: bool,
    /// Why an ext capture failed.
    reason: Option<WEnum<ext_frame_v1::FailureReason>>,
    /// The transform an ext capture says the compositor applied (normal: none).
    transform: Option<WEnum<wl_output::Transform>>,
}

/// A buffer size and the shm formats the session takes for it.
type Takes = ((u32, u32), Vec<WEnum<wl_shm::Format>>);

/// What an ext-image-copy-capture session said of the buffers it takes.
#[derive(Debug, Default)]
struct Constraints {
    /// The batch being said: size and shm formats.
    size: Option<(u32, u32)>,
    formats: Vec<WEnum<wl_shm::Format>>,
    /// The last whole batch (`done`).
    done: Option<Takes>,
    /// The compositor ended the session.
    stopped: bool,
}

struct State {
    /// Each output and its name (wl_output version 4).
    outputs: Vec<(wl_output::WlOutput, Option<String>)>,
    capture: Capture,
    session: Constraints,
    /// The last `wl_display.sync` was answered.
    synced: bool,
}

impl Dispatch<wl_callback::WlCallback, ()> for State {
    fn event(
        s: &mut State,
        _: &wl_callback::WlCallback,
        e: wl_callback::Event,
        _: &(),
        _: &Connection,
        _: &QueueHandle<State>,
    ) {
        if let wl_callback::Event::Done { .. } = e {
            s.synced = true;
        }
    }
}

impl Dispatch<wl_output::WlOutput, usize> for State {
    fn event(
        s: &mut State,
        _: &wl_output::WlOutput,
        e: wl_output::Event,
        i: &usize,
        _: &Connection,
        _: &QueueHandle<State>,
    ) {
        if let wl_output::Event::Name { name } = e {
            if let Some(o) = s.outputs.get_mut(*i) {
                o.1 = Some(name);
            }
        }
    }
}

ignore_events!(
    State;
    wl_shm::WlShm,
    wl_shm_pool::WlShmPool,
    wl_buffer::WlBuffer,
    manager_v1::ZwlrScreencopyManagerV1,
    ext_manager_v1::ExtImageCopyCaptureManagerV1,
    sources_v1::ExtOutputImageCaptureSourceManagerV1,
    source_v1::ExtImageCaptureSourceV1,
);

impl Dispatch<session_v1::ExtImageCopyCaptureSessionV1, ()> for State {
    fn event(
        s: &mut State,
        _: &session_v1::ExtImageCopyCaptureSessionV1,
        e: session_v1::Event,
        _: &(),
        _: &Connection,
        _: &QueueHandle<State>,
    ) {
        let c = &mut s.session;
        match e {
            session_v1::Event::BufferSize { width, height } => c.size = Some((width, height)),
            session_v1::Event::ShmFormat { format } => c.formats.push(format),
            session_v1::Event::Done => {
                // A batch without its size is the compositor's error: kept as 0x0, refused
                // when the buffer is made.
                c.done = Some((
                    c.size.take().unwrap_or((0, 0)),
                    std::mem::take(&mut c.formats),
                ));
            }
            session_v1::Event::Stopped => c.stopped = true,
            _ => {}
        }
    }
}

impl Dispatch<ext_frame_v1::ExtImageCopyCaptureFrameV1, ()> for State {
    fn event(
        s: &mut State,
        _: &ext_frame_v1::ExtImageCopyCaptureFrameV1,
        e: ext_frame_v1::Event,
        _: &(),
        _: &Connection,
        _: &QueueHandle<State>,
    ) {
        let c = &mut s.capture;
        match e {
            ext_frame_v1::Event::Damage {
                x,
                y,
                width,
                height,
            } => {
                // (Signed here: what lies left of or above the buffer is clipped off.)
                let (x0, y0) = (x.max(0), y.max(0));
                let (x1, y1) = (x.saturating_add(width), y.saturating_add(height));
                if x1 > x0 && y1 > y0 {
                    c.damage
                        .push((x0 as u32, y0 as u32, (x1 - x0) as u32, (y1 - y0) as u32));
                }
            }
            ext_frame_v1::Event::Transform { transform } => c.transform = Some(transform),
            ext_frame_v1::Event::Ready => c.ready = true,
            ext_frame_v1::Event::Failed { reason } => {
                c.failed = true;
                c.reason = Some(reason);
            }
            _ => {}
        }
    }
}

impl Dispatch<frame_v1::ZwlrScreencopyFrameV1, ()> for State {
    fn event(
        s: &mut State,
        _: &frame_v1::ZwlrScreencopyFrameV1,
        e: frame_v1::Event,
        _: &(),
        _: &Connection,
        _: &QueueHandle<State>,
    ) {
        let c = &mut s.capture;
        match e {
            frame_v1::Event::Buffer {
                format,
                width,
                height,
                stride,
            } => c.buffer = Some((format, width, height, stride)),
            frame_v1::Event::BufferDone => c.described = true,
            frame_v1::Event::Flags { flags } => {
                c.y_invert =
                    matches!(flags, WEnum::Value(f) if f.contains(frame_v1::Flags::YInvert));
            }
            frame_v1::Event::Damage {
                x,
                y,
                width,
                height,
            } => c.damage.push((x, y, width, height)),
            frame_v1::Event::Ready { .. } => c.ready = true,
            frame_v1::Event::Failed => c.failed = true,
            _ => {}
        }
    }
}

/// The shared-memory buffer the compositor copies into.
struct ShmBuffer {
    map: memmap2::MmapMut,
    buffer: wl_buffer::WlBuffer,
    pool: wl_shm_pool::WlShmPool,
    /// Format, width, height, stride.
    shape: (WEnum<wl_shm::Format>, u32, u32, u32),
}

impl Drop for ShmBuffer {
    fn drop(&mut self) {
        self.buffer.destroy();
        self.pool.destroy();
    }
}

/// The protocol a [`WaylandScreen`] captures with.
enum Via {
    /// `wlr-screencopy-unstable-v1`: a capture object per frame, on the output.
    Wlr(manager_v1::ZwlrScreencopyManagerV1),
    /// `ext-image-copy-capture-v1`: one session on the output's capture source.
    Ext(session_v1::ExtImageCopyCaptureSessionV1),
}

/// A capture asked for ([`WaylandScreen::start`]).
enum Started {
    /// wlr: the frame the compositor described its buffer for.
    Wlr(frame_v1::ZwlrScreencopyFrameV1),
    /// ext: the session's buffer is known; the frame is made at the copy.
    Ext,
}

/// A connected `wayland-screen` source.
pub(crate) struct WaylandScreen {
    display: String,
    queue: EventQueue<State>,
    conn: Connection,
    state: State,
    shm: wl_shm::WlShm,
    via: Via,
    output: wl_output::WlOutput,
    buffer: Option<ShmBuffer>,
    /// The buffer holds the output as the last capture into it left it (ext: a capture
    /// given up before its end may have left it half written).
    filled: bool,
    /// A transform other than normal was said (once).
    transform_said: bool,
    min_gap: Duration,
    refresh: Option<Duration>,
}

impl std::fmt::Debug for WaylandScreen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WaylandScreen({})", self.display)
    }
}

/// Connects a `wayland-screen` source to its compositor and starts it.
pub(crate) fn spawn_wayland_screen_source(
    rt: &Handle,
    endpoint: &'static str,
    c: &WaylandScreenConfig,
    stream: u16,
    tx: Sender<Frame>,
    demand: Option<Demand>,
) -> Result<SourceTask, EndpointError> {
    let s = open_wayland_screen(endpoint, c)?;
    Ok(rt.spawn_blocking(move || run_wayland_screen(endpoint, s, stream, tx, demand)))
}

/// Connects to the compositor, finds `wl_shm`, the screencopy manager and the output.
pub(crate) fn open_wayland_screen(
    endpoint: &'static str,
    c: &WaylandScreenConfig,
) -> Result<WaylandScreen, EndpointError> {
    let d = c.display.as_str();
    let conn = wayland_connect(endpoint, d)?;
    let (globals, mut queue) = registry_queue_init::<State>(&conn).map_err(|e| {
        unavailable(
            endpoint,
            d,
            e.to_string(),
            "not a Wayland compositor's socket",
        )
    })?;
    let qh = queue.handle();
    let shm: wl_shm::WlShm = globals.bind(&qh, 1..=1, ()).map_err(|e| {
        unavailable(
            endpoint,
            d,
            format!("no wl_shm ({e})"),
            "every compositor has it",
        )
    })?;
    // ext-image-copy-capture where offered (and wanted), else wlr-screencopy.
    let ext = match c.protocol {
        WaylandProtocol::Wlr => None,
        WaylandProtocol::Auto | WaylandProtocol::Ext => {
            let copy =
                globals.bind::<ext_manager_v1::ExtImageCopyCaptureManagerV1, _, _>(&qh, 1..=1, ());
            let sources = globals.bind::<sources_v1::ExtOutputImageCaptureSourceManagerV1, _, _>(
                &qh,
                1..=1,
                (),
            );
            match (copy, sources) {
                (Ok(copy), Ok(sources)) => Some((copy, sources)),
                (copy, sources) if c.protocol == WaylandProtocol::Ext => {
                    let missing = match (copy.is_err(), sources.is_err()) {
                        (true, true) => "ext_image_copy_capture_manager_v1 and ext_output_image_capture_source_manager_v1",
                        (true, false) => "ext_image_copy_capture_manager_v1",
                        _ => "ext_output_image_capture_source_manager_v1",
                    };
                    return Err(unavailable(
                        endpoint,
                        d,
                        format!("no {missing}"),
                        "protocol = \"ext\" needs a compositor offering ext-image-copy-capture-v1 (sway 1.11, wlroots 0.19 and later); leave protocol out (auto) to take wlr-screencopy where it is not",
                    ));
                }
                _ => None,
            }
        }
    };
    let wlr = if ext.is_none() {
        let manager: manager_v1::ZwlrScreencopyManagerV1 =
            globals.bind(&qh, 1..=3, ()).map_err(|e| {
                unavailable(
                    endpoint,
                    d,
                    format!("no zwlr_screencopy_manager_v1 ({e})"),
                    "the wayland-screen source needs a wlroots compositor (sway, Hyprland, river, labwc, wayfire); on GNOME use the gnome-screen source, on other desktops (KDE Plasma) the portal-screen source (the xdg-desktop-portal's ScreenCast)",
                )
            })?;
        Some(manager)
    } else {
        None
    };
    let mut state = State {
        outputs: Vec::new(),
        capture: Capture::default(),
        session: Constraints::default(),
        synced: false,
    };
    let registry = globals.registry();
    for g in globals.contents().clone_list() {
        if g.interface == wl_output::WlOutput::interface().name {
            let i = state.outputs.len();
            let o: wl_output::WlOutput = registry.bind(g.name, g.version.min(4), &qh, i);
            state.outputs.push((o, None));
        }
    }
    queue.roundtrip(&mut state).map_err(|e| {
        unavailable(
            endpoint,
            d,
            e.to_string(),
            "the compositor closed the connection",
        )
    })?;
    let names: Vec<String> = state
        .outputs
        .iter()
        .map(|(_, n)| n.clone().unwrap_or_else(|| "(unnamed)".into()))
        .collect();
    let output = match &c.output {
        Some(want) => state
            .outputs
            .iter()
            .find(|(_, n)| n.as_deref() == Some(want.as_str()))
            .map(|(o, _)| o.clone())
            .ok_or_else(|| {
                unavailable(
                    endpoint,
                    d,
                    format!("no output named {want:?} (outputs: {})", names.join(", ")),
                    "set output to one of them (`swaymsg -t get_outputs`), or leave it out for the first",
                )
            })?,
        None => state.outputs.first().map(|(o, _)| o.clone()).ok_or_else(|| {
            unavailable(endpoint, d, "no output".into(), "the compositor shows nothing yet")
        })?,
    };
    let via = match (ext, wlr) {
        (Some((copy, sources)), _) => {
            let source = sources.create_source(&output, &qh, ());
            // No cursor painted in, as wlr's `capture_output(0, …)`.
            let session = copy.create_session(&source, ext_manager_v1::Options::empty(), &qh, ());
            Via::Ext(session)
        }
        (None, Some(m)) => Via::Wlr(m),
        (None, None) => unreachable!("one of the two was bound above"),
    };
    tracing::info!(
        endpoint,
        display = d,
        outputs = %names.join(", "),
        protocol = match &via {
            Via::Ext(_) => "ext-image-copy-capture-v1".to_string(),
            Via::Wlr(m) => format!("wlr-screencopy-unstable-v1 version {}", m.version()),
        },
        "capturing the output"
    );
    Ok(WaylandScreen {
        display: d.to_string(),
        queue,
        conn,
        state,
        shm,
        via,
        output,
        buffer: None,
        filled: false,
        transform_said: false,
        min_gap: Duration::try_from_secs_f64(1.0 / c.max_fps).unwrap_or(Duration::ZERO),
        refresh: pacing(c.refresh_s),
    })
}

/// Why a capture did not come.
enum Fail {
    /// The compositor is gone or broke the protocol.
    Conn(String),
    /// This capture failed (the output went away, or changed): try again with a keyframe.
    Capture(String),
}

impl Fail {
    fn text(self) -> String {
        match self {
            Fail::Conn(e) | Fail::Capture(e) => e,
        }
    }
}

/// What a copy gave.
enum Copied {
    /// The rects that changed (the whole output for a keyframe).
    Rects(Vec<Rect>),
    /// Given up before the compositor answered: the receiver is gone, or a keyframe is due.
    Interrupted,
}

impl WaylandScreen {
    /// Dispatches what the compositor sent, waiting at most `wait` for it.
    fn pump(&mut self, wait: Duration) -> Result<(), Fail> {
        pump(&mut self.queue, &mut self.state, wait).map_err(Fail::Conn)
    }

    /// Asks for a capture and waits until the compositor describes its buffer (wlr: for
    /// this capture; ext: the session's, said once and again when it changes).
    fn start(&mut self) -> Result<Started, Fail> {
        self.state.capture = Capture::default();
        let t0 = Instant::now();
        let manager = match &self.via {
            Via::Wlr(m) => m.clone(),
            Via::Ext(_) => loop {
                let c = &self.state.session;
                if c.stopped {
                    return Err(Fail::Conn(
                        "the compositor stopped the capture session (the output went away?)".into(),
                    ));
                }
                if let Some(((w, h), formats)) = &c.done {
                    let preferred = [wl_shm::Format::Xrgb8888, wl_shm::Format::Argb8888]
                        .into_iter()
                        .map(WEnum::Value)
                        .find(|f| formats.contains(f));
                    // (Another one is refused with its name when the buffer is made.)
                    let Some(format) = preferred.or_else(|| formats.first().copied()) else {
                        return Err(Fail::Conn(NO_SHM.into()));
                    };
                    self.state.capture.buffer = Some((format, *w, *h, w.saturating_mul(4)));
                    return Ok(Started::Ext);
                }
                if t0.elapsed() > DESCRIBE_WAIT {
                    return Err(Fail::Conn(format!(
                        "the compositor did not say the capture session's buffer within {DESCRIBE_WAIT:?}"
                    )));
                }
                self.pump(POLL)?;
            },
        };
        let frame = manager.capture_output(0, &self.output, &self.queue.handle(), ());
        let v3 = manager.version() >= 3;
        loop {
            let c = &self.state.capture;
            if c.failed {
                frame.destroy();
                return Err(Fail::Capture("the compositor refused the capture".into()));
            }
            if v3 && c.described && c.buffer.is_none() {
                frame.destroy();
                return Err(Fail::Conn(NO_SHM.into()));
            }
            if c.buffer.is_some() && (!v3 || c.described) {
                return Ok(Started::Wlr(frame));
            }
            if t0.elapsed() > DESCRIBE_WAIT {
                frame.destroy();
                return Err(Fail::Conn(format!(
                    "the compositor did not describe the capture's buffer within {DESCRIBE_WAIT:?}"
                )));
            }
            self.pump(POLL)?;
        }
    }

    /// The buffer for `shape`, made anew when the shape changed; whether it is new.
    fn buffer_for(&mut self, shape: (WEnum<wl_shm::Format>, u32, u32, u32)) -> Result<bool, Fail> {
        if self.buffer.as_ref().is_some_and(|b| b.shape == shape) {
            return Ok(false);
        }
        self.buffer = None;
        self.filled = false;
        let (format, w, h, stride) = shape;
        let fmt = match format {
            WEnum::Value(f @ (wl_shm::Format::Xrgb8888 | wl_shm::Format::Argb8888)) => f,
            other => {
                return Err(Fail::Conn(format!(
                    "the compositor offers only a {other:?} buffer; this source takes XRGB8888 or ARGB8888"
                )))
            }
        };
        if w == 0 || h == 0 || w > u32::from(u16::MAX) || h > u32::from(u16::MAX) || stride < w * 4
        {
            return Err(Fail::Conn(format!(
                "the compositor asks for a {w}x{h} buffer of stride {stride}"
            )));
        }
        let len = stride as usize * h as usize;
        if len > i32::MAX as usize {
            return Err(Fail::Conn(format!(
                "the compositor asks for a {w}x{h} buffer of stride {stride}: {len} bytes, more than a wl_shm pool takes"
            )));
        }
        let file = memfd("ndd-wayland-screen", len)
            .map_err(|e| Fail::Conn(format!("the capture buffer (memfd): {e}")))?;
        // SAFETY: the memfd is this process's own, sized above and never truncated; the
        // compositor writes into it only between `copy` and `ready`, while this side does not
        // read it.
        let map = unsafe { memmap2::MmapMut::map_mut(&file) }
            .map_err(|e| Fail::Conn(format!("mapping the capture buffer: {e}")))?;
        let qh = self.queue.handle();
        let pool = self
            .shm
            .create_pool(std::os::fd::AsFd::as_fd(&file), len as i32, &qh, ());
        let buffer = pool.create_buffer(0, w as i32, h as i32, stride as i32, fmt, &qh, ());
        self.buffer = Some(ShmBuffer {
            map,
            buffer,
            pool,
            shape,
        });
        Ok(true)
    }

    /// Copies the capture `started` into the buffer (only once something changed, unless
    /// `whole` on wlr), and gives the rects that changed (the whole output for a keyframe);
    /// [`Copied::Interrupted`] when given up first. The capture's objects are gone after.
    fn copy(
        &mut self,
        started: Started,
        whole: bool,
        interrupt: &mut dyn FnMut() -> bool,
    ) -> Result<Copied, Fail> {
        let Some(b) = &self.buffer else {
            if let Started::Wlr(f) = started {
                f.destroy();
            }
            return Err(Fail::Conn("no capture buffer".into()));
        };
        let (_, w, h, _) = b.shape;
        let (damage_ok, ext_frame) = match (&started, &self.via) {
            (Started::Wlr(frame), Via::Wlr(m)) => {
                let damage_ok = m.version() >= 2;
                if damage_ok && !whole {
                    frame.copy_with_damage(&b.buffer);
                } else {
                    frame.copy(&b.buffer);
                }
                (damage_ok, None)
            }
            (_, Via::Ext(session)) => {
                let f = session.create_frame(&self.queue.handle(), ());
                f.attach_buffer(&b.buffer);
                // The compositor writes what changed since this buffer's last capture; one
                // never filled (new, or a capture given up) is written whole.
                if !self.filled {
                    f.damage_buffer(0, 0, w as i32, h as i32);
                }
                f.capture();
                (true, Some(f))
            }
            (Started::Ext, Via::Wlr(_)) => unreachable!("an ext capture on wlr"),
        };
        let r = self.copied((w as u16, h as u16), whole, damage_ok, interrupt);
        if let Started::Wlr(f) = started {
            f.destroy();
        }
        let ext = ext_frame.is_some();
        if let Some(f) = ext_frame {
            f.destroy();
        }
        if ext && matches!(r, Ok(Copied::Interrupted)) {
            // The compositor may have been copying into the buffer: once it has taken the
            // destroy, the buffer holds a whole frame, the last one said ready or one copied
            // after it whose ready and damage are dropped with the frame (the keyframe that
            // interrupted carries them). This rests on the compositor copying when it says
            // ready, not after (wlroots copies at once; the protocol does not say), and on it
            // not writing a buffer whose frame is gone.
            self.synced()?;
        } else {
            self.filled = matches!(r, Ok(Copied::Rects(_)));
        }
        r
    }

    /// Waits until the compositor has taken every request sent so far (a `wl_display.sync`),
    /// at most [`DESCRIBE_WAIT`], dispatching what comes meanwhile.
    fn synced(&mut self) -> Result<(), Fail> {
        self.state.synced = false;
        let _cb = self.conn.display().sync(&self.queue.handle(), ());
        let t0 = Instant::now();
        while !self.state.synced {
            if t0.elapsed() > DESCRIBE_WAIT {
                return Err(Fail::Conn(format!(
                    "the compositor did not answer within {DESCRIBE_WAIT:?}"
                )));
            }
            self.pump(POLL)?;
        }
        Ok(())
    }

    /// Waits for the copy under way, then gives its rects.
    fn copied(
        &mut self,
        (w, h): (u16, u16),
        whole: bool,
        damage_ok: bool,
        interrupt: &mut dyn FnMut() -> bool,
    ) -> Result<Copied, Fail> {
        loop {
            let c = &self.state.capture;
            if c.failed {
                use ext_frame_v1::FailureReason as Why;
                return Err(match c.reason {
                    Some(WEnum::Value(Why::Stopped)) => Fail::Conn(
                        "the compositor stopped the capture session (the output went away?)".into(),
                    ),
                    Some(WEnum::Value(Why::BufferConstraints)) => Fail::Capture(
                        "the compositor takes another buffer now (the output changed)".into(),
                    ),
                    _ => Fail::Capture("the copy failed (the output changed?)".into()),
                });
            }
            if c.ready {
                break;
            }
            if interrupt() {
                return Ok(Copied::Interrupted);
            }
            self.pump(POLL)?;
        }
        let c = &self.state.capture;
        if let Some(t) = c
            .transform
            .filter(|t| *t != WEnum::Value(wl_output::Transform::Normal))
        {
            if !self.transform_said {
                self.transform_said = true;
                tracing::warn!(
                    display = %self.display,
                    transform = ?t,
                    "the compositor says the capture is transformed; it is sent as it comes"
                );
            }
        }
        let c = &self.state.capture;
        if whole || !damage_ok || c.damage.is_empty() {
            return Ok(Copied::Rects(vec![Rect::new(0, 0, w, h)]));
        }
        let rects: Vec<Rect> = c
            .damage
            .iter()
            .filter_map(|&(x, y, rw, rh)| {
                // Clipped to the buffer first (a compositor may say anything: no overflow,
                // and a rect running past an edge keeps the part inside).
                let (bw, bh) = (u32::from(w), u32::from(h));
                let (x0, x1) = (x.min(bw), x.saturating_add(rw).min(bw));
                let (y0, y1) = (y.min(bh), y.saturating_add(rh).min(bh));
                let (y0, y1) = if c.y_invert {
                    (bh - y1, bh - y0)
                } else {
                    (y0, y1)
                };
                Rect::from_signed(
                    i16::try_from(x0).ok()?,
                    i16::try_from(y0).ok()?,
                    u16::try_from(x1 - x0).ok()?,
                    u16::try_from(y1 - y0).ok()?,
                    w,
                    h,
                )
            })
            .collect();
        Ok(Copied::Rects(coalesce(&rects, w, h, MAX_RECTS)))
    }

    /// The pixels of every rect of `layout`, from the buffer into `payload`.
    fn pixels_into(&self, layout: &UpdateLayout, payload: &mut [u8]) {
        let Some(b) = &self.buffer else {
            return;
        };
        let (_, _, h, stride) = b.shape;
        let stride = stride as usize;
        for (i, r) in layout.rects().iter().enumerate() {
            let out = &mut payload[layout.pixels(i)];
            let row = usize::from(r.w) * 4;
            for dy in 0..usize::from(r.h) {
                let y = usize::from(r.y) + dy;
                let y = if self.state.capture.y_invert {
                    h as usize - 1 - y
                } else {
                    y
                };
                let at = y * stride + usize::from(r.x) * 4;
                out[dy * row..(dy + 1) * row].copy_from_slice(&b.map[at..at + row]);
            }
        }
    }
}

/// The `wayland-screen` source loop.
fn run_wayland_screen(
    endpoint: &'static str,
    mut s: WaylandScreen,
    stream: u16,
    tx: Sender<Frame>,
    demand: Option<Demand>,
) -> Result<SourceReport, EndpointError> {
    let display = s.display.clone();
    let fatal = |e: String| {
        unavailable(
            endpoint,
            &display,
            e,
            "the compositor closed the connection or refused a request",
        )
    };
    let mut em = Emitter::new(stream, tx);
    let mut pace = CapturePacer::new(s.min_gap, s.refresh, Instant::now());
    let mut failures = 0u32;
    loop {
        if em.tx.is_closed() {
            break;
        }
        let now = Instant::now();
        if demand.as_ref().is_some_and(Demand::take_keyframe) {
            pace.keyframe();
        }
        let path_free = match &demand {
            Some(d) => d.wanted(),
            None => em.tx.capacity() == em.tx.max_capacity(),
        };
        let keyframe_due = match pace.poll(now, path_free) {
            Pace::Capture { whole } => whole,
            Pace::Wait(wait) => {
                // Keep the connection serviced (pings, output changes) while waiting.
                s.pump(wait.clamp(Duration::from_millis(1), POLL))
                    .map_err(|e| fatal(e.text()))?;
                continue;
            }
        };
        let started = match s.start() {
            Ok(f) => f,
            Err(Fail::Conn(e)) => return Err(fatal(e)),
            Err(Fail::Capture(e)) => {
                failures += 1;
                if failures > 50 {
                    return Err(fatal(e));
                }
                pace.keyframe();
                pace.retry_after(Instant::now(), Duration::from_millis(100));
                continue;
            }
        };
        let shape = s.state.capture.buffer.expect("described");
        let new_buffer = s.buffer_for(shape).map_err(|e| fatal(e.text()))?;
        if new_buffer && s.buffer.is_some() && em.report.frames > 0 {
            tracing::info!(
                endpoint,
                width = shape.1,
                height = shape.2,
                "output size changed"
            );
        }
        let whole = keyframe_due || new_buffer;
        if whole && s.filled && matches!(started, Started::Ext) {
            // The buffer is the output as it stands (what changed since comes with the next
            // capture): the keyframe goes from it, not waiting for a change.
            if let Some(d) = &demand {
                d.take();
            }
            pace.captured(Instant::now(), true);
            let all = [Rect::new(0, 0, shape.1 as u16, shape.2 as u16)];
            if !send_update(&s, &mut em, &all, true).map_err(fatal)? {
                break;
            }
            continue;
        }
        // While the compositor waits for damage: the receiver may go, the peer may ask for a
        // keyframe, the refresh may come due (the copy is given up, a keyframe taken next).
        let mut interrupt = || {
            if demand.as_ref().is_some_and(Demand::take_keyframe) {
                pace.keyframe();
            }
            em.tx.is_closed() || (!whole && pace.keyframe_due(Instant::now()))
        };
        let copied = s.copy(started, whole, &mut interrupt);
        let rects = match copied {
            Ok(Copied::Rects(r)) => r,
            Ok(Copied::Interrupted) => continue,
            Err(Fail::Conn(e)) => return Err(fatal(e)),
            Err(Fail::Capture(e)) => {
                failures += 1;
                if failures > 50 {
                    return Err(fatal(e));
                }
                tracing::debug!(endpoint, error = %e, "capture failed; a keyframe next");
                pace.keyframe();
                continue;
            }
        };
        failures = 0;
        if let Some(d) = &demand {
            d.take();
        }
        pace.captured(Instant::now(), whole);
        if !send_update(&s, &mut em, &rects, whole).map_err(fatal)? {
            break;
        }
    }
    let _ = s.conn.flush();
    Ok(em.report)
}

/// Sends `rects` of the buffer as display updates; `Ok(false)` when the receiver is gone.
fn send_update(
    s: &WaylandScreen,
    em: &mut Emitter,
    rects: &[Rect],
    keyframe: bool,
) -> Result<bool, String> {
    let Some(b) = &s.buffer else {
        return Ok(true);
    };
    let (_, w, h, _) = b.shape;
    super::source::send_update(
        em,
        (w as u16, h as u16),
        rects,
        keyframe,
        |layout, payload| {
            s.pixels_into(layout, payload);
            Ok::<(), String>(())
        },
    )
}

//! Input endpoints, the I/O half: `evdev` and `x11-input` sources, `uinput` and `xtest`
//! sinks. The record format and every decision that needs no device live in [`crate::input`].
//!
//! All four run as blocking tasks (`spawn_blocking`): evdev reads and X11 connections are
//! blocking APIs, and an input stream carries a few hundred small frames per second at most.
//! A source waits for its input at most [`POLL`] at a time, so it notices within that time
//! that its receiver is gone. An `x11-input` source with `window = "viewer"` captures the
//! window of the `x11-window` sink of its display (found through the registry in
//! `displaydev`), in window coordinates. Every sink releases the keys and buttons it still holds when
//! its channel closes, on a release-all record, and before it reports an error.

use crate::common::clock::meta;
use crate::common::delivered::Delivered;
use crate::common::error::EndpointError;
use crate::common::report::{SinkReport, SourceReport};
use crate::common::x11::{wait_readable_for, x11_connect, x11_err};
use crate::config::{EvdevConfig, UinputConfig, X11InputConfig, X11Window, XtestConfig};
use crate::input::{
    x_button_to_linux, x_keycode_to_linux, x_wheel, AbsAxis, Batcher, Capabilities, Event, Held,
    InputMessage, RawDecoder, RawEvent, XAction, XMapper, ABS_X, ABS_Y, BTN_EXTRA, BTN_LEFT,
    EV_ABS, EV_KEY, REL_HWHEEL, REL_WHEEL,
};
use ndd_core::Frame;
use std::io::Read;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};
use tokio::sync::mpsc::{Receiver, Sender};
use x11rb::connection::Connection;
use x11rb::protocol::xinput::{self, ConnectionExt as _};
use x11rb::protocol::xproto::{self, ConnectionExt as _};
use x11rb::protocol::xtest::ConnectionExt as _;
use x11rb::protocol::Event as XEvent;
use x11rb::rust_connection::RustConnection;
use x11rb::wrapper::ConnectionExt as _;

/// Longest wait for input before a source checks whether its receiver is still there.
pub const POLL: Duration = Duration::from_millis(100);

/// Waits until `fd` is readable or [`POLL`] passes.
fn wait_readable(fd: impl AsFd) -> std::io::Result<()> {
    wait_readable_for(fd, POLL)
}

/// Sends frames of one input stream: numbers them, encodes records, counts.
struct Emitter {
    endpoint: &'static str,
    stream: u16,
    tx: Sender<Frame>,
    report: SourceReport,
}

impl Emitter {
    /// Sends one record; `false` when the receiver is gone.
    fn send(&mut self, msg: &InputMessage) -> bool {
        let payload = match msg.emit() {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(endpoint = self.endpoint, error = %e, "input record dropped");
                return true;
            }
        };
        let frame = Frame::new(meta(self.stream, self.report.frames), &payload);
        if self.tx.blocking_send(frame).is_err() {
            return false;
        }
        self.report.frames += 1;
        self.report.bytes += payload.len() as u64;
        true
    }

    fn done(self) -> Result<SourceReport, EndpointError> {
        tracing::debug!(
            endpoint = self.endpoint,
            stream = self.stream,
            frames = self.report.frames,
            "source ended"
        );
        Ok(self.report)
    }
}

// ---------------------------------------------------------------------------------------
// evdev source

/// An opened `evdev` source input.
pub(crate) enum EvdevInput {
    /// A real event device, with its capabilities.
    Device(Box<evdev::raw_stream::RawDevice>, Capabilities),
    /// A file or pipe of recorded kernel `struct input_event`s.
    Recording(std::fs::File, PathBuf),
}

impl std::fmt::Debug for EvdevInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EvdevInput::Device(_, c) => write!(f, "Device({:?})", c.name),
            EvdevInput::Recording(_, p) => write!(f, "Recording({})", p.display()),
        }
    }
}

/// The capabilities of an open event device.
fn device_capabilities(dev: &evdev::raw_stream::RawDevice) -> Capabilities {
    let id = dev.input_id();
    let abs_state = dev.get_abs_state().ok();
    let abs = dev
        .supported_absolute_axes()
        .map(|axes| {
            axes.iter()
                .filter_map(|a| {
                    let info = abs_state.as_ref()?.get(usize::from(a.0))?;
                    Some(AbsAxis {
                        code: a.0,
                        value: info.value,
                        min: info.minimum,
                        max: info.maximum,
                        fuzz: info.fuzz,
                        flat: info.flat,
                        resolution: info.resolution,
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    Capabilities {
        name: dev.name().unwrap_or("evdev device").to_string(),
        bustype: id.bus_type().0,
        vendor: id.vendor(),
        product: id.product(),
        version: id.version(),
        keys: dev
            .supported_keys()
            .map(|k| k.iter().map(|c| c.0).collect())
            .unwrap_or_default(),
        rel: dev
            .supported_relative_axes()
            .map(|k| k.iter().map(|c| c.0).collect())
            .unwrap_or_default(),
        abs,
    }
}

/// Opens the device (reading its capabilities, grabbing it if asked) or the recording.
pub(crate) fn open_evdev(
    endpoint: &'static str,
    c: &EvdevConfig,
) -> Result<EvdevInput, EndpointError> {
    use std::os::unix::fs::FileTypeExt;
    let open_err = |source| EndpointError::Open {
        endpoint,
        path: c.path.clone(),
        source,
    };
    let kind = std::fs::metadata(&c.path).map_err(open_err)?.file_type();
    if kind.is_dir() {
        return Err(open_err(std::io::Error::other("is a directory")));
    }
    if !kind.is_char_device() {
        if c.grab {
            return Err(EndpointError::Config {
                endpoint,
                param: "grab",
                reason: format!(
                    "{} is a recording, not an event device: nothing to grab",
                    c.path.display()
                ),
            });
        }
        let f = std::fs::File::open(&c.path).map_err(open_err)?;
        return Ok(EvdevInput::Recording(f, c.path.clone()));
    }
    let mut dev = evdev::raw_stream::RawDevice::open(&c.path).map_err(open_err)?;
    let caps = device_capabilities(&dev);
    if c.grab {
        dev.grab().map_err(|e| {
            open_err(std::io::Error::new(
                e.kind(),
                format!("cannot grab (EVIOCGRAB; another program holds it?): {e}"),
            ))
        })?;
    }
    Ok(EvdevInput::Device(Box::new(dev), caps))
}

fn timestamp_us(t: std::time::SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_micros()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_micros()).unwrap_or(i64::MAX),
    }
}

/// The `evdev` source loop: a capabilities record, then a record per SYN_REPORT batch.
pub(crate) fn run_evdev_source(
    endpoint: &'static str,
    input: EvdevInput,
    stream: u16,
    tx: Sender<Frame>,
) -> Result<SourceReport, EndpointError> {
    let mut em = Emitter {
        endpoint,
        stream,
        tx,
        report: SourceReport::default(),
    };
    let mut batcher = Batcher::new();
    match input {
        EvdevInput::Device(mut dev, caps) => {
            let path = format!("{caps_name:?}", caps_name = caps.name);
            if !em.send(&InputMessage::Capabilities(caps)) {
                return em.done();
            }
            let read_err = |source| EndpointError::Read {
                endpoint,
                what: path.clone(),
                source,
            };
            loop {
                if em.tx.is_closed() {
                    break;
                }
                wait_readable(&*dev).map_err(read_err)?;
                let mut batches = Vec::new();
                match dev.fetch_events() {
                    Ok(events) => {
                        for e in events {
                            let raw = RawEvent {
                                time_us: timestamp_us(e.timestamp()),
                                ty: e.event_type().0,
                                code: e.code(),
                                value: e.value(),
                            };
                            batches.extend(batcher.push(raw));
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                    // ENODEV: the device was unplugged; end the stream.
                    Err(e) if e.raw_os_error() == Some(libc::ENODEV) => {
                        tracing::info!(endpoint, "input device gone, source ends");
                        break;
                    }
                    Err(e) => return Err(read_err(e)),
                }
                for b in batches {
                    if !em.send(&InputMessage::Events(b)) {
                        return em.done();
                    }
                }
            }
        }
        EvdevInput::Recording(mut f, path) => {
            if !em.send(&InputMessage::Capabilities(
                Capabilities::keyboard_and_mouse("ndd recorded input"),
            )) {
                return em.done();
            }
            let what = path.display().to_string();
            let mut dec = RawDecoder::new();
            let mut buf = vec![0u8; 64 * crate::input::RAW_EVENT_LEN];
            loop {
                let n = f.read(&mut buf).map_err(|source| EndpointError::Read {
                    endpoint,
                    what: what.clone(),
                    source,
                })?;
                if n == 0 {
                    break;
                }
                let mut batches = Vec::new();
                dec.push(&buf[..n], |e| batches.extend(batcher.push(e)));
                for b in batches {
                    if !em.send(&InputMessage::Events(b)) {
                        return em.done();
                    }
                }
            }
            if dec.pending() != 0 {
                return Err(EndpointError::Read {
                    endpoint,
                    what,
                    source: std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        format!(
                            "recording ends inside an input_event record ({} of 24 bytes)",
                            dec.pending()
                        ),
                    ),
                });
            }
        }
    }
    if batcher.dropped > 0 {
        tracing::warn!(
            endpoint,
            dropped = batcher.dropped,
            "kernel reported SYN_DROPPED"
        );
    }
    em.done()
}

// ---------------------------------------------------------------------------------------
// x11-input source

/// An `x11-input` source, connected.
pub(crate) struct X11Input {
    conn: RustConnection,
    root: xproto::Window,
    width: u16,
    height: u16,
    display: String,
    window: X11Window,
    /// `viewer`: the viewer window, once found.
    viewer: xproto::Window,
}

/// How long an `x11-input` source with `window = "viewer"` waits for the `x11-window` sink of
/// its display to show its window.
pub const VIEWER_WAIT: Duration = Duration::from_secs(10);

impl std::fmt::Debug for X11Input {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "X11Input({}, {})", self.display, self.window)
    }
}

/// Connects to the display and checks the extensions `window` needs.
pub(crate) fn open_x11_input(
    endpoint: &'static str,
    c: &X11InputConfig,
) -> Result<X11Input, EndpointError> {
    let (conn, screen_num) = x11_connect(endpoint, &c.display)?;
    let screen = conn
        .setup()
        .roots
        .get(screen_num)
        .cloned()
        .ok_or_else(|| x11_err(endpoint, &c.display, format!("no screen {screen_num}")))?;
    if c.window == X11Window::Root {
        let v = conn
            .xinput_xi_query_version(2, 2)
            .map_err(|e| x11_err(endpoint, &c.display, e))?
            .reply()
            .map_err(|e| EndpointError::Unavailable {
                endpoint,
                what: format!("X display {}: no XInput2 extension ({e})", c.display),
                hint: "use window = \"create\", or a server with XInput 2".to_string(),
            })?;
        tracing::debug!(
            endpoint,
            major = v.major_version,
            minor = v.minor_version,
            "XInput"
        );
    }
    Ok(X11Input {
        conn,
        root: screen.root,
        width: screen.width_in_pixels,
        height: screen.height_in_pixels,
        display: c.display.clone(),
        window: c.window,
        viewer: x11rb::NONE,
    })
}

impl X11Input {
    fn capabilities(&self) -> Capabilities {
        let axis = |code, size: u16| AbsAxis {
            code,
            max: i32::from(size.max(1)) - 1,
            ..Default::default()
        };
        Capabilities {
            name: format!("ndd x11-input {}", self.display),
            keys: (1..=247)
                .chain([
                    BTN_LEFT,
                    BTN_LEFT + 1,
                    BTN_LEFT + 2,
                    BTN_LEFT + 3,
                    BTN_EXTRA,
                ])
                .collect(),
            rel: vec![REL_HWHEEL, REL_WHEEL],
            abs: vec![axis(ABS_X, self.width), axis(ABS_Y, self.height)],
            ..Default::default()
        }
    }

    /// Selects the events to capture; for `create`, makes, maps and focuses the window; for
    /// `viewer`, selects input on the viewer window (already found) and focuses it.
    fn setup(&mut self) -> Result<(), String> {
        let c = &self.conn;
        match self.window {
            X11Window::Viewer => {
                let win = self.viewer;
                let mask = xproto::EventMask::KEY_PRESS
                    | xproto::EventMask::KEY_RELEASE
                    | xproto::EventMask::BUTTON_PRESS
                    | xproto::EventMask::BUTTON_RELEASE
                    | xproto::EventMask::POINTER_MOTION
                    | xproto::EventMask::STRUCTURE_NOTIFY;
                c.change_window_attributes(
                    win,
                    &xproto::ChangeWindowAttributesAux::new().event_mask(mask),
                )
                .map_err(|e| e.to_string())?
                .check()
                .map_err(|e| {
                    format!(
                        "cannot select key and button events on the viewer window {win:#x} \
                         (does another client take its button presses?): {e}"
                    )
                })?;
                // The size after the selection: a resize from now on comes as ConfigureNotify.
                let g = c
                    .get_geometry(win)
                    .map_err(|e| e.to_string())?
                    .reply()
                    .map_err(|e| format!("viewer window {win:#x}: {e}"))?;
                self.width = g.width;
                self.height = g.height;
                if let Err(e) = c
                    .set_input_focus(xproto::InputFocus::POINTER_ROOT, win, x11rb::CURRENT_TIME)
                    .map_err(|e| e.to_string())?
                    .check()
                {
                    tracing::warn!(display = %self.display, error = %e, "cannot focus the viewer window");
                }
            }
            X11Window::Create => {
                let win = c.generate_id().map_err(|e| e.to_string())?;
                let mask = xproto::EventMask::KEY_PRESS
                    | xproto::EventMask::KEY_RELEASE
                    | xproto::EventMask::BUTTON_PRESS
                    | xproto::EventMask::BUTTON_RELEASE
                    | xproto::EventMask::POINTER_MOTION
                    | xproto::EventMask::STRUCTURE_NOTIFY;
                c.create_window(
                    x11rb::COPY_DEPTH_FROM_PARENT,
                    win,
                    self.root,
                    0,
                    0,
                    self.width,
                    self.height,
                    0,
                    xproto::WindowClass::INPUT_OUTPUT,
                    x11rb::COPY_FROM_PARENT,
                    &xproto::CreateWindowAux::new()
                        .background_pixel(0)
                        .event_mask(mask),
                )
                .map_err(|e| e.to_string())?;
                let title = format!("ndd x11-input {}", self.display);
                c.change_property8(
                    xproto::PropMode::REPLACE,
                    win,
                    xproto::AtomEnum::WM_NAME,
                    xproto::AtomEnum::STRING,
                    title.as_bytes(),
                )
                .map_err(|e| e.to_string())?;
                c.map_window(win).map_err(|e| e.to_string())?;
                c.flush().map_err(|e| e.to_string())?;
                // Wait for the window to be viewable, then give it the keyboard focus.
                loop {
                    let ev = c.wait_for_event().map_err(|e| e.to_string())?;
                    if matches!(ev, XEvent::MapNotify(m) if m.window == win) {
                        break;
                    }
                }
                c.set_input_focus(xproto::InputFocus::POINTER_ROOT, win, x11rb::CURRENT_TIME)
                    .map_err(|e| e.to_string())?;
            }
            X11Window::Root => {
                let mask = xinput::XIEventMask::RAW_KEY_PRESS
                    | xinput::XIEventMask::RAW_KEY_RELEASE
                    | xinput::XIEventMask::RAW_BUTTON_PRESS
                    | xinput::XIEventMask::RAW_BUTTON_RELEASE
                    | xinput::XIEventMask::RAW_MOTION;
                c.xinput_xi_select_events(
                    self.root,
                    &[xinput::EventMask {
                        deviceid: 1, // XIAllMasterDevices
                        mask: vec![mask],
                    }],
                )
                .map_err(|e| e.to_string())?;
                // Pointer warps (XWarpPointer, `xdotool mousemove`) make no raw events: take
                // core motion that reaches the root window too.
                c.change_window_attributes(
                    self.root,
                    &xproto::ChangeWindowAttributesAux::new()
                        .event_mask(xproto::EventMask::POINTER_MOTION),
                )
                .map_err(|e| e.to_string())?;
            }
        }
        c.sync().map_err(|e| e.to_string())?;
        Ok(())
    }

    /// The records for one X event (usually one batch, empty when it maps to nothing).
    fn map_event(&self, ev: &XEvent) -> Result<Option<Vec<Event>>, String> {
        let key = |keycode: u32, press: bool| {
            u8::try_from(keycode)
                .ok()
                .and_then(x_keycode_to_linux)
                .map(|code| vec![Event::new(EV_KEY, code, i32::from(press))])
        };
        let button = |b: u32, press: bool| {
            let b = u8::try_from(b).ok()?;
            if let Some(code) = x_button_to_linux(b) {
                Some(vec![Event::new(EV_KEY, code, i32::from(press))])
            } else if press {
                x_wheel(b).map(|e| vec![e])
            } else {
                None
            }
        };
        let motion = |x: i16, y: i16| {
            Some(vec![
                Event::new(EV_ABS, ABS_X, i32::from(x)),
                Event::new(EV_ABS, ABS_Y, i32::from(y)),
            ])
        };
        Ok(match ev {
            XEvent::KeyPress(e) => key(e.detail.into(), true),
            XEvent::KeyRelease(e) => key(e.detail.into(), false),
            XEvent::ButtonPress(e) => button(e.detail.into(), true),
            XEvent::ButtonRelease(e) => button(e.detail.into(), false),
            XEvent::MotionNotify(e) if self.window == X11Window::Viewer => {
                // Window coordinates, inside the window (an implicit grab reports motion
                // beyond its edges).
                let clamp =
                    |v: i16, size: u16| v.clamp(0, (size.max(1) - 1).min(i16::MAX as u16) as i16);
                motion(clamp(e.event_x, self.width), clamp(e.event_y, self.height))
            }
            XEvent::MotionNotify(e) => motion(e.root_x, e.root_y),
            XEvent::XinputRawKeyPress(e) => key(e.detail, true),
            XEvent::XinputRawKeyRelease(e) => key(e.detail, false),
            XEvent::XinputRawButtonPress(e) => button(e.detail, true),
            XEvent::XinputRawButtonRelease(e) => button(e.detail, false),
            XEvent::XinputRawMotion(_) => {
                let p = self
                    .conn
                    .query_pointer(self.root)
                    .map_err(|e| e.to_string())?
                    .reply()
                    .map_err(|e| e.to_string())?;
                motion(p.root_x, p.root_y)
            }
            _ => None,
        })
    }
}

/// The `x11-input` source loop: a capabilities record once the capture is set up, then one
/// record per X input event.
pub(crate) fn run_x11_source(
    endpoint: &'static str,
    mut x: X11Input,
    stream: u16,
    tx: Sender<Frame>,
) -> Result<SourceReport, EndpointError> {
    if x.window == X11Window::Viewer {
        match crate::displaydev::wait_for_viewer(&x.display, VIEWER_WAIT, || tx.is_closed()) {
            Some(win) => x.viewer = win,
            None if tx.is_closed() => return Ok(SourceReport::default()),
            None => {
                return Err(EndpointError::Unavailable {
                    endpoint,
                    what: format!(
                        "no x11-window sink showed a viewer window on X display {} within {} s",
                        x.display,
                        VIEWER_WAIT.as_secs()
                    ),
                    hint: "window = \"viewer\" captures input in the window of an x11-window \
                           sink of the same `display` in the same ndd process (the display \
                           stream of a remote desktop); use window = \"create\" otherwise"
                        .to_string(),
                })
            }
        }
    }
    let display = x.display.clone();
    let err = |e: String| x11_err(endpoint, &display, e);
    x.setup().map_err(err)?;
    let mut em = Emitter {
        endpoint,
        stream,
        tx,
        report: SourceReport::default(),
    };
    if !em.send(&InputMessage::Capabilities(x.capabilities())) {
        return em.done();
    }
    let mut last_motion: Option<(i32, i32)> = None;
    let mut down = Held::default();
    loop {
        while let Some(ev) = x.conn.poll_for_event().map_err(|e| err(e.to_string()))? {
            if x.window == X11Window::Viewer {
                match &ev {
                    XEvent::ConfigureNotify(c)
                        if c.window == x.viewer && (c.width, c.height) != (x.width, x.height) =>
                    {
                        // The viewer was resized (the app's screen changed size): new ranges.
                        x.width = c.width;
                        x.height = c.height;
                        if !em.send(&InputMessage::Capabilities(x.capabilities())) {
                            return em.done();
                        }
                        continue;
                    }
                    XEvent::DestroyNotify(d) if d.window == x.viewer => {
                        tracing::info!(endpoint, display = %x.display, "viewer window closed, source ends");
                        return em.done();
                    }
                    _ => {}
                }
            }
            let Some(mut events) = x.map_event(&ev).map_err(err)? else {
                continue;
            };
            if let [e @ Event { ty: EV_KEY, .. }] = events.as_mut_slice() {
                // Raw events report a release of a key that is not down (a repeated
                // `keyup`), and presses of a key held down (autorepeat): send a release only
                // for a key that is down, and a repeated press as autorepeat (value 2).
                let is_down = down.held().any(|k| k == e.code);
                match (e.value, is_down) {
                    (0, false) => continue,
                    (1, true) => e.value = 2,
                    _ => down.observe(e),
                }
            }
            if events.first().is_some_and(|e| e.ty == EV_ABS) {
                // Raw motion can repeat the same position (sub-pixel moves): send changes only.
                let pos = (events[0].value, events[1].value);
                if last_motion == Some(pos) {
                    continue;
                }
                last_motion = Some(pos);
            }
            if !em.send(&InputMessage::Events(events)) {
                return em.done();
            }
        }
        if em.tx.is_closed() {
            return em.done();
        }
        wait_readable(x.conn.stream()).map_err(|e| err(e.to_string()))?;
    }
}

// ---------------------------------------------------------------------------------------
// Sinks: shared loop

/// What a sink endpoint does with decoded records.
trait Injector {
    fn capabilities(&mut self, caps: &Capabilities) -> Result<(), EndpointError>;
    /// Applies one batch (already observed by `held`).
    fn events(&mut self, events: &[Event]) -> Result<(), EndpointError>;
}

/// Decodes records and applies them; releases everything held at a release-all record, at
/// the end of the stream and before returning an error. Marks each frame in `delivered` once
/// applied (injected and flushed; a bad record, which stops the sink, once rejected).
fn run_injector(
    endpoint: &'static str,
    inj: &mut dyn Injector,
    mut rx: Receiver<Frame>,
    delivered: &Delivered,
) -> Result<SinkReport, EndpointError> {
    let mut held = Held::default();
    let mut report = SinkReport::default();
    let release = |inj: &mut dyn Injector, held: &mut Held| {
        let ev = held.release_all();
        if ev.is_empty() {
            return Ok(());
        }
        tracing::debug!(endpoint, keys = ev.len(), "releasing held keys and buttons");
        inj.events(&ev)
    };
    let result = (|| {
        while let Some(frame) = rx.blocking_recv() {
            report.frames += 1;
            report.bytes += frame.len() as u64;
            let msg = match InputMessage::parse(frame.payload()) {
                Ok(msg) => msg,
                Err(source) => {
                    // Rejected: nothing more will ever be done with it.
                    delivered.mark(frame.meta.seq);
                    return Err(EndpointError::BadInput {
                        endpoint,
                        seq: frame.meta.seq,
                        source,
                    });
                }
            };
            match msg {
                InputMessage::Capabilities(c) => {
                    release(inj, &mut held)?;
                    inj.capabilities(&c)?;
                }
                InputMessage::Events(ev) => {
                    for e in &ev {
                        held.observe(e);
                    }
                    inj.events(&ev)?;
                }
                InputMessage::ReleaseAll => release(inj, &mut held)?,
            }
            // Injected and flushed (xtest flushes, uinput writes, in `events`). The session's
            // own release-all records (seq `INJECTED_SEQ`) are not marked.
            delivered.mark(frame.meta.seq);
        }
        Ok(())
    })();
    let released = release(inj, &mut held);
    result?;
    released?;
    tracing::debug!(endpoint, frames = report.frames, "sink ended");
    Ok(report)
}

// ---------------------------------------------------------------------------------------
// xtest sink

pub(crate) struct Xtest {
    conn: RustConnection,
    root: xproto::Window,
    mapper: XMapper,
    display: String,
    endpoint: &'static str,
    actions: Vec<XAction>,
}

impl std::fmt::Debug for Xtest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Xtest({})", self.display)
    }
}

/// Connects and checks for the XTEST extension.
pub(crate) fn open_xtest(endpoint: &'static str, c: &XtestConfig) -> Result<Xtest, EndpointError> {
    let (conn, screen_num) = x11_connect(endpoint, &c.display)?;
    let screen = conn
        .setup()
        .roots
        .get(screen_num)
        .cloned()
        .ok_or_else(|| x11_err(endpoint, &c.display, format!("no screen {screen_num}")))?;
    conn.xtest_get_version(2, 2)
        .map_err(|e| x11_err(endpoint, &c.display, e))?
        .reply()
        .map_err(|e| EndpointError::Unavailable {
            endpoint,
            what: format!("X display {}: no XTEST extension ({e})", c.display),
            hint: "start the X server with XTEST enabled (Xorg and Xvfb have it by default)"
                .to_string(),
        })?;
    Ok(Xtest {
        conn,
        root: screen.root,
        mapper: XMapper::new(screen.width_in_pixels, screen.height_in_pixels),
        display: c.display.clone(),
        endpoint,
        actions: Vec::new(),
    })
}

impl Injector for Xtest {
    fn capabilities(&mut self, caps: &Capabilities) -> Result<(), EndpointError> {
        self.mapper.set_capabilities(caps);
        Ok(())
    }

    fn events(&mut self, events: &[Event]) -> Result<(), EndpointError> {
        self.actions.clear();
        self.mapper.map(events, &mut self.actions);
        for a in &self.actions {
            let (ty, detail, x, y) = match *a {
                XAction::Key { keycode, press } => (
                    if press {
                        xproto::KEY_PRESS_EVENT
                    } else {
                        xproto::KEY_RELEASE_EVENT
                    },
                    keycode,
                    0,
                    0,
                ),
                XAction::Button { button, press } => (
                    if press {
                        xproto::BUTTON_PRESS_EVENT
                    } else {
                        xproto::BUTTON_RELEASE_EVENT
                    },
                    button,
                    0,
                    0,
                ),
                XAction::MoveTo { x, y } => (xproto::MOTION_NOTIFY_EVENT, 0, x, y),
                XAction::MoveBy { dx, dy } => (xproto::MOTION_NOTIFY_EVENT, 1, dx, dy),
            };
            let root = if matches!(a, XAction::MoveTo { .. }) {
                self.root
            } else {
                x11rb::NONE
            };
            self.conn
                .xtest_fake_input(ty, detail, x11rb::CURRENT_TIME, root, x, y, 0)
                .map_err(|e| x11_err(self.endpoint, &self.display, e))?;
        }
        self.conn
            .flush()
            .map_err(|e| x11_err(self.endpoint, &self.display, e))?;
        Ok(())
    }
}

/// The `xtest` sink loop.
pub(crate) fn run_xtest_sink(
    endpoint: &'static str,
    mut x: Xtest,
    rx: Receiver<Frame>,
    delivered: Delivered,
) -> Result<SinkReport, EndpointError> {
    let r = run_injector(endpoint, &mut x, rx, &delivered);
    // Make sure the server has processed everything (the releases above all) before the
    // connection closes.
    let _ = x.conn.sync();
    if x.mapper.unmapped > 0 {
        tracing::info!(
            endpoint,
            unmapped = x.mapper.unmapped,
            "events XTEST cannot express"
        );
    }
    r
}

// ---------------------------------------------------------------------------------------
// uinput sink

/// Where uinput lives.
pub const UINPUT_PATH: &str = "/dev/uinput";

/// Checks that `/dev/uinput` can be opened read-write, with an error that says how to fix it.
pub(crate) fn check_uinput(endpoint: &'static str, path: &Path) -> Result<(), EndpointError> {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) => {
            let hint = match e.kind() {
                std::io::ErrorKind::NotFound => format!(
                    "this kernel has no uinput device: load the module (`sudo modprobe uinput`, \
                     and `uinput` in /etc/modules-load.d/ to keep it), or use the `xtest` sink \
                     on X11 (see docs/devices.md#input); {} is absent here",
                    path.display()
                ),
                std::io::ErrorKind::PermissionDenied => "add the user to group `input` and \
                     install the udev rule KERNEL==\"uinput\", GROUP=\"input\", MODE=\"0660\" \
                     (see docs/devices.md#input)"
                    .to_string(),
                _ => "see docs/devices.md#input".to_string(),
            };
            Err(EndpointError::Unavailable {
                endpoint,
                what: format!("cannot open {}: {e}", path.display()),
                hint,
            })
        }
    }
}

pub(crate) struct Uinput {
    name: String,
    endpoint: &'static str,
    dev: Option<evdev::uinput::VirtualDevice>,
    buf: Vec<evdev::InputEvent>,
}

impl std::fmt::Debug for Uinput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Uinput({})", self.name)
    }
}

fn build_virtual_device(
    name: &str,
    caps: &Capabilities,
) -> std::io::Result<evdev::uinput::VirtualDevice> {
    use evdev::{AbsInfo, AbsoluteAxisCode, AttributeSet, KeyCode, RelativeAxisCode};
    let keys: AttributeSet<KeyCode> = caps.keys.iter().map(|&k| KeyCode(k)).collect();
    let rel: AttributeSet<RelativeAxisCode> =
        caps.rel.iter().map(|&r| RelativeAxisCode(r)).collect();
    let mut b = evdev::uinput::VirtualDevice::builder()?
        .name(name)
        .input_id(evdev::InputId::new(
            evdev::BusType(caps.bustype),
            caps.vendor,
            caps.product,
            caps.version,
        ));
    if !caps.keys.is_empty() {
        b = b.with_keys(&keys)?;
    }
    if !caps.rel.is_empty() {
        b = b.with_relative_axes(&rel)?;
    }
    for a in &caps.abs {
        let info = AbsInfo::new(a.value, a.min, a.max, a.fuzz, a.flat, a.resolution);
        b = b.with_absolute_axis(&evdev::UinputAbsSetup::new(AbsoluteAxisCode(a.code), info))?;
    }
    b.build()
}

impl Injector for Uinput {
    fn capabilities(&mut self, caps: &Capabilities) -> Result<(), EndpointError> {
        // A new capabilities record (the source restarted, maybe another device): a new
        // virtual device, the old one is destroyed.
        self.dev = None;
        let dev =
            build_virtual_device(&self.name, caps).map_err(|e| EndpointError::Unavailable {
                endpoint: self.endpoint,
                what: format!("cannot create uinput device {:?}: {e}", self.name),
                hint: "see docs/devices.md#input".to_string(),
            })?;
        tracing::info!(endpoint = self.endpoint, name = %self.name, "uinput device created");
        self.dev = Some(dev);
        Ok(())
    }

    fn events(&mut self, events: &[Event]) -> Result<(), EndpointError> {
        if self.dev.is_none() {
            // Events before any capabilities record: a keyboard and wheel mouse.
            self.capabilities(&Capabilities::keyboard_and_mouse(""))?;
        }
        let Some(dev) = self.dev.as_mut() else {
            return Ok(());
        };
        self.buf.clear();
        self.buf.extend(
            events
                .iter()
                .map(|e| evdev::InputEvent::new(e.ty, e.code, e.value)),
        );
        // `emit` appends the SYN_REPORT that ends the batch.
        dev.emit(&self.buf).map_err(|source| EndpointError::Write {
            endpoint: self.endpoint,
            what: UINPUT_PATH.to_string(),
            source,
        })?;
        Ok(())
    }
}

pub(crate) fn open_uinput(
    endpoint: &'static str,
    c: &UinputConfig,
) -> Result<Uinput, EndpointError> {
    check_uinput(endpoint, Path::new(UINPUT_PATH))?;
    Ok(Uinput {
        name: c.name.clone(),
        endpoint,
        dev: None,
        buf: Vec::new(),
    })
}

/// The `uinput` sink loop.
pub(crate) fn run_uinput_sink(
    endpoint: &'static str,
    mut u: Uinput,
    rx: Receiver<Frame>,
    delivered: Delivered,
) -> Result<SinkReport, EndpointError> {
    run_injector(endpoint, &mut u, rx, &delivered)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_uinput_names_the_fix() {
        let e = check_uinput("uinput sink", Path::new("/nonexistent/uinput")).unwrap_err();
        let s = e.to_string();
        assert!(
            s.starts_with("uinput sink: cannot open /nonexistent/uinput: No such file"),
            "{s}"
        );
        assert!(s.contains("modprobe uinput"), "{s}");
    }

    /// Records what a sink would inject.
    #[derive(Default)]
    struct Log(Vec<Event>, u32);
    impl Injector for Log {
        fn capabilities(&mut self, _: &Capabilities) -> Result<(), EndpointError> {
            self.1 += 1;
            Ok(())
        }
        fn events(&mut self, events: &[Event]) -> Result<(), EndpointError> {
            self.0.extend_from_slice(events);
            Ok(())
        }
    }

    fn frame(seq: u64, m: &InputMessage) -> Frame {
        Frame::new(
            ndd_core::Meta {
                seq,
                ..Default::default()
            },
            &m.emit().unwrap(),
        )
    }

    #[test]
    fn injector_marks_applied_frames_but_not_injected_release_alls() {
        let press = |c| Event::new(EV_KEY, c, 1);
        let delivered = Delivered::default();
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        tx.try_send(frame(u64::MAX, &InputMessage::ReleaseAll))
            .unwrap();
        drop(tx);
        run_injector("test sink", &mut Log::default(), rx, &delivered).unwrap();
        assert_eq!(delivered.get(), None);

        let (tx, rx) = tokio::sync::mpsc::channel(8);
        tx.try_send(frame(
            0,
            &InputMessage::Capabilities(Capabilities::default()),
        ))
        .unwrap();
        tx.try_send(frame(1, &InputMessage::Events(vec![press(30)])))
            .unwrap();
        tx.try_send(frame(u64::MAX, &InputMessage::ReleaseAll))
            .unwrap();
        drop(tx);
        let mut log = Log::default();
        let r = run_injector("test sink", &mut log, rx, &delivered).unwrap();
        assert_eq!(r.frames, 3);
        assert_eq!(log.0, vec![press(30), Event::new(EV_KEY, 30, 0)]);
        assert_eq!(delivered.get(), Some(1));
    }

    #[test]
    fn injector_releases_at_release_all_end_and_error() {
        let press = |c| Event::new(EV_KEY, c, 1);
        let up = |c| Event::new(EV_KEY, c, 0);
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        tx.try_send(frame(
            0,
            &InputMessage::Capabilities(Capabilities::default()),
        ))
        .unwrap();
        tx.try_send(frame(
            1,
            &InputMessage::Events(vec![press(30), press(BTN_LEFT)]),
        ))
        .unwrap();
        tx.try_send(frame(2, &InputMessage::ReleaseAll)).unwrap();
        tx.try_send(frame(3, &InputMessage::Events(vec![press(31)])))
            .unwrap();
        drop(tx);
        let mut log = Log::default();
        let r = run_injector("test sink", &mut log, rx, &Delivered::default()).unwrap();
        assert_eq!(r.frames, 4);
        assert_eq!(log.1, 1);
        assert_eq!(
            log.0,
            vec![
                press(30),
                press(BTN_LEFT),
                up(30),
                up(BTN_LEFT),
                press(31),
                up(31)
            ]
        );

        let (tx, rx) = tokio::sync::mpsc::channel(8);
        tx.try_send(frame(0, &InputMessage::Events(vec![press(44)])))
            .unwrap();
        let mut bad = Frame::new(
            ndd_core::Meta {
                seq: 1,
                ..Default::default()
            },
            &[1, 9],
        );
        bad.meta.seq = 1;
        tx.try_send(bad).unwrap();
        drop(tx);
        let mut log = Log::default();
        let delivered = Delivered::default();
        let e = run_injector("test sink", &mut log, rx, &delivered).unwrap_err();
        // The bad record stopped the sink: rejected, it is done with too.
        assert_eq!(delivered.get(), Some(1));
        assert_eq!(
            e.to_string(),
            "test sink: bad input record (seq 1): input record: unknown kind 0x09 \
             (expected 0x00 events, 0x01 capabilities, 0x02 release-all)"
        );
        assert_eq!(log.0, vec![press(44), up(44)]);
    }
}

//! The input sources: `evdev` (a Linux input device, or a recording of one) and `x11-input`
//! (keyboard and pointer events of an X display). Each sends a capabilities record first,
//! then one input record per batch of events.
//!
//! Both run as blocking tasks (`spawn_blocking`): evdev reads and X11 connections are
//! blocking APIs, and an input stream carries a few hundred small frames per second at most.
//! A source waits for its input at most [`POLL`] at a time, so it notices within that time
//! that its receiver is gone. An `x11-input` source with `window = "viewer"` captures the
//! window of the `x11-window` sink of its display (found through the viewer registry of the
//! `display` class), in window coordinates.

use super::config::{EvdevConfig, X11InputConfig, X11Window};
use super::keymap::Keymap;
use super::record::{
    x_button_to_linux, x_keycode_to_linux, x_wheel, AbsAxis, Batcher, Capabilities, Event, Held,
    InputMessage, RawDecoder, RawEvent, ABS_X, ABS_Y, EV_ABS, EV_KEY, EV_KEYSYM, RAW_EVENT_LEN,
};
use super::sink::read_keymap;
use crate::common::emitter::Emitter;
use crate::common::error::EndpointError;
use crate::common::report::{SourceReport, SourceTask};
use crate::common::x11::{wait_readable_for, x11_connect, x11_err};
use ndd_core::{Frame, RateLimit};
use std::io::Read;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::time::{Duration, Instant, UNIX_EPOCH};
use tokio::runtime::Handle;
use tokio::sync::mpsc::Sender;
use x11rb::connection::Connection;
use x11rb::protocol::xinput::{self, ConnectionExt as _};
use x11rb::protocol::xproto::{self, ConnectionExt as _};
use x11rb::protocol::Event as XEvent;
use x11rb::rust_connection::RustConnection;
use x11rb::wrapper::ConnectionExt as _;

/// Opens the device (or recording) of an `evdev` source and starts it.
pub(crate) fn spawn_evdev_source(
    rt: &Handle,
    endpoint: &'static str,
    c: &EvdevConfig,
    stream: u16,
    tx: Sender<Frame>,
) -> Result<SourceTask, EndpointError> {
    let input = open_evdev(endpoint, c)?;
    Ok(rt.spawn_blocking(move || run_evdev_source(endpoint, input, stream, tx)))
}

/// Connects an `x11-input` source to its display and starts it.
pub(crate) fn spawn_x11_input_source(
    rt: &Handle,
    endpoint: &'static str,
    c: &X11InputConfig,
    stream: u16,
    tx: Sender<Frame>,
) -> Result<SourceTask, EndpointError> {
    let x = open_x11_input(endpoint, c)?;
    Ok(rt.spawn_blocking(move || run_x11_source(endpoint, x, stream, tx)))
}

/// Starts a `wayland-window-input` source: what the person does in the `wayland-window`
/// viewer of the same display in this process, as input records.
pub(crate) fn spawn_wayland_window_input_source(
    rt: &Handle,
    endpoint: &'static str,
    c: &super::WaylandWindowInputConfig,
    stream: u16,
    tx: Sender<Frame>,
) -> Result<SourceTask, EndpointError> {
    let display = c.display.clone();
    let rt2 = rt.clone();
    Ok(rt.spawn_blocking(move || {
        let Some(mut input) =
            crate::display::take_viewer_input(&display, VIEWER_WAIT, || tx.is_closed())
        else {
            if tx.is_closed() {
                return Ok(SourceReport::default());
            }
            return Err(EndpointError::Unavailable {
                endpoint,
                what: format!(
                    "no wayland-window sink showed a viewer on Wayland display {display:?} within {} s",
                    VIEWER_WAIT.as_secs()
                ),
                hint: "the wayland-window-input source takes the input of the window of a                        wayland-window sink of the same `display` in the same ndd process"
                    .to_string(),
            });
        };
        let mut em = InputOut::new(endpoint, stream, tx);
        loop {
            let next = rt2.block_on(async { tokio::time::timeout(POLL, input.recv()).await });
            match next {
                Ok(Some(m)) => {
                    if !em.send(&m) {
                        return em.done();
                    }
                }
                // The viewer ended (its window closed, or its stream ended).
                Ok(None) => return em.done(),
                Err(_) if em.is_closed() => return em.done(),
                Err(_) => {}
            }
        }
    }))
}

/// Longest wait for input before a source checks whether its receiver is still there.
pub const POLL: Duration = Duration::from_millis(100);

/// Waits until `fd` is readable or [`POLL`] passes.
fn wait_readable(fd: impl AsFd) -> std::io::Result<()> {
    wait_readable_for(fd, POLL)
}

/// An input stream's way out: the shared emitter, and the endpoint name for log lines.
struct InputOut {
    endpoint: &'static str,
    em: Emitter,
    /// The device makes events as fast as it likes: one line a second about dropped ones.
    dropped: RateLimit,
}

impl InputOut {
    fn new(endpoint: &'static str, stream: u16, tx: Sender<Frame>) -> InputOut {
        InputOut {
            endpoint,
            em: Emitter::new(stream, tx),
            dropped: RateLimit::default(),
        }
    }

    /// Sends one record; `false` when the receiver is gone.
    fn send(&mut self, msg: &InputMessage) -> bool {
        let payload = match msg.emit() {
            Ok(p) => p,
            Err(e) => {
                if let Some(suppressed) = self.dropped.admit(Instant::now()) {
                    tracing::warn!(endpoint = self.endpoint, error = %e, suppressed, "input record dropped");
                }
                return true;
            }
        };
        self.em
            .send_blocking(Frame::new(self.em.next_meta(), &payload))
    }

    fn is_closed(&self) -> bool {
        self.em.tx.is_closed()
    }

    fn done(self) -> Result<SourceReport, EndpointError> {
        tracing::debug!(
            endpoint = self.endpoint,
            stream = self.em.stream,
            frames = self.em.report.frames,
            "source ended"
        );
        Ok(self.em.report)
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
fn open_evdev(endpoint: &'static str, c: &EvdevConfig) -> Result<EvdevInput, EndpointError> {
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
fn run_evdev_source(
    endpoint: &'static str,
    input: EvdevInput,
    stream: u16,
    tx: Sender<Frame>,
) -> Result<SourceReport, EndpointError> {
    let mut em = InputOut::new(endpoint, stream, tx);
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
                if em.is_closed() {
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
            let mut buf = vec![0u8; 64 * RAW_EVENT_LEN];
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
    /// The display's layout: each key press is sent with the keysym it gives here.
    keymap: Keymap,
    /// `root`: the keys down (X keycodes, a bit each) as the raw events said so far, and the
    /// modifiers they held before the event taken last. Raw events carry no state; asking
    /// the server for it answers with its state *now*, which a Shift pressed right after a
    /// key has already changed (`a` then Shift+`b`, typed fast, gave `A`).
    raw_down: [u64; 4],
    raw_held_before: u16,
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
fn open_x11_input(endpoint: &'static str, c: &X11InputConfig) -> Result<X11Input, EndpointError> {
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
    let keymap = read_keymap(&conn).map_err(|e| x11_err(endpoint, &c.display, e))?;
    Ok(X11Input {
        keymap,
        conn,
        root: screen.root,
        width: screen.width_in_pixels,
        height: screen.height_in_pixels,
        display: c.display.clone(),
        window: c.window,
        viewer: x11rb::NONE,
        raw_down: [0; 4],
        raw_held_before: 0,
    })
}

impl X11Input {
    /// The keysym a key press event gives with this display's layout and modifier state
    /// (raw events carry no state: the pointer query's modifier mask stands in).
    fn keysym(&self, ev: &XEvent) -> Result<Option<u32>, String> {
        let (keycode, state) = match ev {
            XEvent::KeyPress(e) => (e.detail, u16::from(e.state)),
            XEvent::XinputRawKeyPress(e) => {
                // The modifiers held as the raw events before this one left them; the locks
                // (Caps Lock, Num Lock), modifiers no key holds and the group as the server
                // has them now (a Caps Lock or a layout switch pressed right after the key
                // still changes it; a Shift latched or locked by StickyKeys is not seen).
                let p = self
                    .conn
                    .query_pointer(self.root)
                    .map_err(|e| e.to_string())?
                    .reply()
                    .map_err(|e| e.to_string())?;
                let server = u16::from(p.mask) & !self.keymap.held_bits();
                (
                    u8::try_from(e.detail).unwrap_or(0),
                    server | self.raw_held_before,
                )
            }
            _ => return Ok(None),
        };
        Ok(self.keymap.keysym(keycode, state))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::viewer(
            format!("ndd x11-input {}", self.display),
            self.width,
            self.height,
        )
    }

    /// Selects the events to capture; for `create`, makes, maps and focuses the window; for
    /// `viewer`, selects input on the viewer window (already found) and focuses it.
    fn setup(&mut self) -> Result<(), String> {
        let c = &self.conn;
        let mut raw_down = [0u64; 4];
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
                // The keys down already (a Shift held while the side starts).
                let keys = c
                    .query_keymap()
                    .map_err(|e| e.to_string())?
                    .reply()
                    .map_err(|e| e.to_string())?
                    .keys;
                for (i, byte) in keys.iter().enumerate() {
                    for b in 0..8 {
                        if byte & (1 << b) != 0 {
                            let k = i * 8 + b;
                            raw_down[k / 64] |= 1 << (k % 64);
                        }
                    }
                }
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
        self.raw_down = raw_down;
        Ok(())
    }

    /// Follows the keys down through a raw key event (see `raw_down`).
    fn track_raw(&mut self, ev: &XEvent) {
        let (detail, press) = match ev {
            XEvent::XinputRawKeyPress(e) => (e.detail, true),
            XEvent::XinputRawKeyRelease(e) => (e.detail, false),
            _ => return,
        };
        let down = self.raw_down;
        self.raw_held_before = self
            .keymap
            .held_mask((0..=255u8).filter(|c| down[usize::from(c / 64)] & (1 << (c % 64)) != 0));
        let Ok(k) = u8::try_from(detail) else {
            return;
        };
        let (word, bit) = (usize::from(k / 64), 1u64 << (k % 64));
        if press {
            self.raw_down[word] |= bit;
        } else {
            self.raw_down[word] &= !bit;
        }
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
fn run_x11_source(
    endpoint: &'static str,
    mut x: X11Input,
    stream: u16,
    tx: Sender<Frame>,
) -> Result<SourceReport, EndpointError> {
    if x.window == X11Window::Viewer {
        match crate::display::wait_for_viewer(&x.display, VIEWER_WAIT, || tx.is_closed()) {
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
    let mut em = InputOut::new(endpoint, stream, tx);
    if !em.send(&InputMessage::Capabilities(x.capabilities())) {
        return em.done();
    }
    let mut last_motion: Option<(i32, i32)> = None;
    let mut down = Held::default();
    // `resize = "remote"`: the size the viewer was resized to, sent once it held still for
    // [`RESIZE_SETTLE`] (a drag resizes it many times a second), and the size sent last.
    let remote = x.window == X11Window::Viewer
        && crate::display::viewer_resizes_remote(&x.display, x.viewer);
    let mut resize_to: Option<((u16, u16), Instant)> = None;
    let mut asked = (x.width, x.height);
    loop {
        while let Some(ev) = x.conn.poll_for_event().map_err(|e| err(e.to_string()))? {
            if x.window == X11Window::Viewer {
                match &ev {
                    XEvent::ConfigureNotify(c)
                        if c.window == x.viewer && (c.width, c.height) != (x.width, x.height) =>
                    {
                        // The viewer was resized (the app's screen changed size, or the person
                        // resized it): new ranges.
                        x.width = c.width;
                        x.height = c.height;
                        if !em.send(&InputMessage::Capabilities(x.capabilities())) {
                            return em.done();
                        }
                        if remote {
                            resize_to = Some(((c.width, c.height), Instant::now()));
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
            if let XEvent::MappingNotify(_) = ev {
                // The layout changed (setxkbmap, xmodmap, a program remapping a key).
                x.keymap = read_keymap(&x.conn).map_err(err)?;
                continue;
            }
            x.track_raw(&ev);
            let Some(mut events) = x.map_event(&ev).map_err(err)? else {
                continue;
            };
            if let [e @ Event { ty: EV_KEY, .. }] = events.as_mut_slice() {
                // Raw events report a release of a key that is not down (a repeated
                // `keyup`), and presses of a key held down (autorepeat): send a release only
                // for a key that is down, and no autorepeat at all (the app side's X server
                // repeats by itself; repeats replayed after a stall would type stale text).
                let is_down = down.held().any(|k| k == e.code);
                match (e.value, is_down) {
                    (0, false) | (1, true) => continue,
                    _ => down.observe(e),
                }
                if e.value == 1 {
                    // With the keysym it gives here, for a sink with another layout.
                    if let Some(keysym) = x.keysym(&ev).map_err(err)? {
                        let code = e.code;
                        events.insert(0, Event::new(EV_KEYSYM, code, keysym as i32));
                    }
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
        if let Some((size, at)) = resize_to {
            if at.elapsed() >= RESIZE_SETTLE {
                resize_to = None;
                if size != asked && size.0 > 0 && size.1 > 0 {
                    asked = size;
                    tracing::debug!(
                        endpoint,
                        width = size.0,
                        height = size.1,
                        "asking the app's screen to take the viewer's size"
                    );
                    let msg = InputMessage::ScreenSize {
                        width: size.0.min(crate::input::record::MAX_SCREEN),
                        height: size.1.min(crate::input::record::MAX_SCREEN),
                    };
                    if !em.send(&msg) {
                        return em.done();
                    }
                }
            }
        }
        if em.is_closed() {
            return em.done();
        }
        wait_readable(x.conn.stream()).map_err(|e| err(e.to_string()))?;
    }
}

/// How long a viewer with `resize = "remote"` holds a new size before the app's screen is
/// asked to take it.
const RESIZE_SETTLE: Duration = Duration::from_millis(250);

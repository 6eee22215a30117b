//! The `wayland-window` sink: display updates in a window of a Wayland compositor, the viewer
//! for a person on a Wayland desktop without Xwayland (any compositor with xdg-shell: sway,
//! Hyprland, GNOME, KDE, weston).
//!
//! An xdg-shell toplevel whose surface shows `wl_shm` buffers (XRGB8888: the bytes of ndd's
//! Bgrx32 pixels). Updates are applied to a framebuffer of the app's screen as they come;
//! whenever one of two buffers is free again (the compositor released it), the framebuffer
//! goes into it and is committed with the damage of what changed since: updates that come
//! faster than the compositor shows them are drawn together, never queued up (frame
//! spoiling, as the X11 viewer does it). With `wp_viewporter` (most compositors) the
//! compositor scales the app's screen to the window the person or the tiling gives it, its
//! shape kept; without it the window shows the screen at its own size.
//!
//! What the person does in the window (keys, pointer, wheel) goes to the
//! `wayland-window-input` source of the same display in this process, if there is one
//! ([`take_input`], [`super::viewer_input`]); while it takes the input, the window asks the
//! compositor to pass its own shortcuts (Alt-Tab, Super…) to it while it has the keyboard
//! (`zwp_keyboard_shortcuts_inhibit_manager_v1`, where offered), as a remote desktop viewer
//! must.
//!
//! It runs as a blocking task and waits for the compositor at most [`POLL`] at a time between
//! updates. The window closed by the person ends the stream (said once).

use super::config::WaylandWindowConfig;
use super::viewer_input::ViewerInput;
use crate::common::delivered::Delivered;
use crate::common::error::EndpointError;
use crate::common::report::{SinkReport, SinkTask};
use crate::common::wayland::{memfd, pump, unavailable, wayland_connect};
use crate::input::InputMessage;
use ndd_core::{Frame, RateLimit};
use ndd_wire::display::{Framebuffer, LinkState, PixelFormat, Rect, Update};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::runtime::Handle;
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::mpsc::Receiver;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use wayland_client::globals::registry_queue_init;
use wayland_client::protocol::{
    wl_buffer, wl_compositor, wl_keyboard, wl_pointer, wl_seat, wl_shm, wl_shm_pool, wl_surface,
};
use wayland_client::{Connection, Dispatch, EventQueue, QueueHandle, WEnum};
use wayland_protocols::wp::keyboard_shortcuts_inhibit::zv1::client::{
    zwp_keyboard_shortcuts_inhibit_manager_v1 as inhibit_manager,
    zwp_keyboard_shortcuts_inhibitor_v1 as inhibitor,
};
use wayland_protocols::wp::pointer_constraints::zv1::client::{
    zwp_locked_pointer_v1 as locked_pointer, zwp_pointer_constraints_v1 as constraints,
};
use wayland_protocols::wp::relative_pointer::zv1::client::{
    zwp_relative_pointer_manager_v1 as relative_manager, zwp_relative_pointer_v1 as relative,
};
use wayland_protocols::wp::viewporter::client::{wp_viewport, wp_viewporter};
use wayland_protocols::xdg::shell::client::{xdg_surface, xdg_toplevel, xdg_wm_base};

/// How long the loop waits for the compositor when no update is waiting.
const POLL: Duration = Duration::from_millis(10);

/// The window's size until the first update says the screen's.
const INITIAL_SIZE: (u16, u16) = (640, 480);

/// A viewer's input waiting for its source, and whether a source took it.
type Waiting = (UnboundedReceiver<InputMessage>, Arc<AtomicBool>);

/// The viewers' input of this process, by display (their socket's path), waiting for a
/// `wayland-window-input` source to take it.
fn viewers() -> &'static Mutex<HashMap<String, Waiting>> {
    static V: OnceLock<Mutex<HashMap<String, Waiting>>> = OnceLock::new();
    V.get_or_init(Mutex::default)
}

/// The key of `display` in [`viewers`].
fn viewer_key(display: &str) -> String {
    crate::common::wayland::socket_path(display)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| display.to_string())
}

/// The input of the `wayland-window` viewer on `display` in this process, once it is there
/// (waiting up to `timeout`, checking `cancelled` every 50 ms); the viewer then sends what the
/// person does in its window.
pub(crate) fn take_input(
    display: &str,
    timeout: Duration,
    cancelled: impl Fn() -> bool,
) -> Option<UnboundedReceiver<InputMessage>> {
    let key = viewer_key(display);
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some((rx, taken)) = viewers()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key)
        {
            taken.store(true, Ordering::Release);
            return Some(rx);
        }
        if cancelled() || std::time::Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What the compositor told this client.
#[derive(Debug, Default)]
struct State {
    /// The size the compositor gives the window (0: this client chooses).
    size: (i32, i32),
    /// Whether the first configure came (nothing may be attached before).
    configured: bool,
    /// The person closed the window.
    closed: bool,
    /// Which of the two buffers the compositor let go of.
    free: [bool; 2],
    /// The seat (the person's keyboard and pointer), once listed.
    seat: Option<wl_seat::WlSeat>,
    keyboard: Option<wl_keyboard::WlKeyboard>,
    pointer: Option<wl_pointer::WlPointer>,
    /// What the person does in the window, as records.
    input: ViewerInput,
    /// The compositor let go of the pointer lock (the window lost focus): it is done with.
    lock_ended: bool,
    /// Whether the compositor ever let the viewer keep its shortcuts (said once, at info).
    inhibited_once: bool,
    /// The seat lost its pointer: the relative pointer and lock made from it are done with.
    pointer_lost: bool,
}

impl Dispatch<xdg_wm_base::XdgWmBase, ()> for State {
    fn event(
        _: &mut State,
        base: &xdg_wm_base::XdgWmBase,
        event: xdg_wm_base::Event,
        _: &(),
        _: &Connection,
        _: &QueueHandle<State>,
    ) {
        if let xdg_wm_base::Event::Ping { serial } = event {
            base.pong(serial);
        }
    }
}

impl Dispatch<xdg_surface::XdgSurface, ()> for State {
    fn event(
        state: &mut State,
        surface: &xdg_surface::XdgSurface,
        event: xdg_surface::Event,
        _: &(),
        _: &Connection,
        _: &QueueHandle<State>,
    ) {
        if let xdg_surface::Event::Configure { serial } = event {
            surface.ack_configure(serial);
            state.configured = true;
        }
    }
}

impl Dispatch<xdg_toplevel::XdgToplevel, ()> for State {
    fn event(
        state: &mut State,
        _: &xdg_toplevel::XdgToplevel,
        event: xdg_toplevel::Event,
        _: &(),
        _: &Connection,
        _: &QueueHandle<State>,
    ) {
        match event {
            xdg_toplevel::Event::Configure { width, height, .. } => state.size = (width, height),
            xdg_toplevel::Event::Close => state.closed = true,
            _ => {}
        }
    }
}

impl Dispatch<wl_seat::WlSeat, ()> for State {
    fn event(
        state: &mut State,
        seat: &wl_seat::WlSeat,
        event: wl_seat::Event,
        _: &(),
        _: &Connection,
        qh: &QueueHandle<State>,
    ) {
        if let wl_seat::Event::Capabilities {
            capabilities: WEnum::Value(caps),
        } = event
        {
            // A seat may lose its keyboard or pointer and get one back (the last one
            // unplugged; on GNOME, a remote-desktop session's virtual devices come and go
            // with it): the old object is let go and a new one asked for, else the window
            // never hears the new device (found on a headless mutter).
            let keyboard = caps.contains(wl_seat::Capability::Keyboard);
            match state.keyboard.take() {
                None if keyboard => state.keyboard = Some(seat.get_keyboard(qh, ())),
                Some(k) if !keyboard => {
                    if wayland_client::Proxy::version(&k) >= 3 {
                        k.release();
                    }
                    state.input.keyboard_left();
                }
                k => state.keyboard = k,
            }
            let pointer = caps.contains(wl_seat::Capability::Pointer);
            match state.pointer.take() {
                None if pointer => state.pointer = Some(seat.get_pointer(qh, ())),
                Some(p) if !pointer => {
                    if wayland_client::Proxy::version(&p) >= 3 {
                        p.release();
                    }
                    // Its relative pointer and lock go with it, and its held buttons.
                    state.pointer_lost = true;
                    state.input.pointer_left();
                    state.input.set_locked(false);
                }
                p => state.pointer = p,
            }
        }
    }
}

impl Dispatch<wl_keyboard::WlKeyboard, ()> for State {
    fn event(
        state: &mut State,
        _: &wl_keyboard::WlKeyboard,
        event: wl_keyboard::Event,
        _: &(),
        _: &Connection,
        _: &QueueHandle<State>,
    ) {
        match event {
            wl_keyboard::Event::Key {
                key,
                state: WEnum::Value(s),
                ..
            } => state.input.key(key, s == wl_keyboard::KeyState::Pressed),
            wl_keyboard::Event::Leave { .. } => state.input.keyboard_left(),
            wl_keyboard::Event::Keymap {
                format: WEnum::Value(wl_keyboard::KeymapFormat::XkbV1),
                fd,
                size,
            } => {
                if let Some(text) = crate::common::wayland::read_keymap(fd, size) {
                    state.input.set_keymap(&text);
                }
            }
            wl_keyboard::Event::Modifiers {
                mods_depressed,
                mods_latched,
                mods_locked,
                group,
                ..
            } => state
                .input
                .modifiers(mods_depressed, mods_latched, mods_locked, group),
            _ => {}
        }
    }
}

impl Dispatch<wl_pointer::WlPointer, ()> for State {
    fn event(
        state: &mut State,
        _: &wl_pointer::WlPointer,
        event: wl_pointer::Event,
        _: &(),
        _: &Connection,
        _: &QueueHandle<State>,
    ) {
        let vertical = |a: &WEnum<wl_pointer::Axis>| {
            matches!(a, WEnum::Value(wl_pointer::Axis::VerticalScroll))
        };
        match event {
            wl_pointer::Event::Enter {
                surface_x,
                surface_y,
                ..
            }
            | wl_pointer::Event::Motion {
                surface_x,
                surface_y,
                ..
            } => state.input.motion(surface_x, surface_y),
            wl_pointer::Event::Button {
                button,
                state: WEnum::Value(s),
                ..
            } => state
                .input
                .button(button, s == wl_pointer::ButtonState::Pressed),
            wl_pointer::Event::AxisDiscrete { axis, discrete } => {
                state.input.notches(vertical(&axis), discrete);
            }
            wl_pointer::Event::Axis { axis, value, .. } => {
                state.input.scroll(vertical(&axis), value);
            }
            wl_pointer::Event::Frame => state.input.frame(),
            _ => {}
        }
    }
}

impl Dispatch<relative::ZwpRelativePointerV1, ()> for State {
    fn event(
        state: &mut State,
        _: &relative::ZwpRelativePointerV1,
        event: relative::Event,
        _: &(),
        _: &Connection,
        _: &QueueHandle<State>,
    ) {
        // The accelerated motion, as the person's pointer moves here (the app side's X
        // server adds none to XTEST's relative moves once `xset m 1 1`; it adds its own
        // otherwise, as to a mouse).
        if let relative::Event::RelativeMotion { dx, dy, .. } = event {
            state.input.relative(dx, dy);
        }
    }
}

impl Dispatch<locked_pointer::ZwpLockedPointerV1, ()> for State {
    fn event(
        state: &mut State,
        _: &locked_pointer::ZwpLockedPointerV1,
        event: locked_pointer::Event,
        _: &(),
        _: &Connection,
        _: &QueueHandle<State>,
    ) {
        match event {
            locked_pointer::Event::Locked => state.input.set_locked(true),
            locked_pointer::Event::Unlocked => {
                state.input.set_locked(false);
                state.lock_ended = true;
            }
            _ => {}
        }
    }
}

/// The compositor says when the viewer holds its shortcuts (while it has the keyboard, once
/// allowed: GNOME Shell asks the person first) and when it takes them back (focus left, or
/// the person pressed the compositor's way out, such as Super+Escape on GNOME).
impl Dispatch<inhibitor::ZwpKeyboardShortcutsInhibitorV1, ()> for State {
    fn event(
        state: &mut State,
        _: &inhibitor::ZwpKeyboardShortcutsInhibitorV1,
        event: inhibitor::Event,
        _: &(),
        _: &Connection,
        _: &QueueHandle<State>,
    ) {
        match event {
            inhibitor::Event::Active if !state.inhibited_once => {
                state.inhibited_once = true;
                tracing::info!(
                    "the compositor's shortcuts (Alt-Tab, Super…) go to the remote desktop while the viewer has the keyboard"
                );
            }
            inhibitor::Event::Active => {
                tracing::debug!("the viewer holds the compositor's shortcuts again");
            }
            inhibitor::Event::Inactive => {
                tracing::debug!("the compositor took its shortcuts back");
            }
            _ => {}
        }
    }
}

impl Dispatch<wl_buffer::WlBuffer, usize> for State {
    fn event(
        state: &mut State,
        _: &wl_buffer::WlBuffer,
        event: wl_buffer::Event,
        which: &usize,
        _: &Connection,
        _: &QueueHandle<State>,
    ) {
        if let wl_buffer::Event::Release = event {
            state.free[*which] = true;
        }
    }
}

crate::common::wayland::ignore_events!(
    State;
    wl_compositor::WlCompositor,
    wl_surface::WlSurface,
    wl_shm::WlShm,
    wl_shm_pool::WlShmPool,
    wp_viewporter::WpViewporter,
    wp_viewport::WpViewport,
    inhibit_manager::ZwpKeyboardShortcutsInhibitManagerV1,
    constraints::ZwpPointerConstraintsV1,
    relative_manager::ZwpRelativePointerManagerV1,
);

/// Two buffers of one size in one pool.
struct Buffers {
    map: memmap2::MmapMut,
    pool: wl_shm_pool::WlShmPool,
    buffers: [wl_buffer::WlBuffer; 2],
    size: (u16, u16),
    /// What changed in the framebuffer since each buffer was last filled.
    stale: [Vec<Rect>; 2],
}

impl Drop for Buffers {
    fn drop(&mut self) {
        for b in &self.buffers {
            b.destroy();
        }
        self.pool.destroy();
    }
}

/// A connected `wayland-window` sink.
pub(crate) struct WaylandWindow {
    display: String,
    endpoint: &'static str,
    conn: Connection,
    queue: EventQueue<State>,
    state: State,
    shm: wl_shm::WlShm,
    surface: wl_surface::WlSurface,
    toplevel: xdg_toplevel::XdgToplevel,
    viewport: Option<wp_viewport::WpViewport>,
    buffers: Option<Buffers>,
    fb: Framebuffer,
    /// What changed since the last commit (nothing to draw when empty).
    dirty: Vec<Rect>,
    /// Frames applied since the last commit (completed once it is shown).
    applied: Vec<u64>,
    /// The destination size given to the viewport last.
    shown: Option<(i32, i32)>,
    /// Where the person's input goes, once a `wayland-window-input` source took it.
    input: (UnboundedSender<InputMessage>, Arc<AtomicBool>),
    /// The compositor's shortcut inhibitor manager, if it offers one, and the inhibitor made.
    inhibit: Option<inhibit_manager::ZwpKeyboardShortcutsInhibitManagerV1>,
    inhibitor: Option<inhibitor::ZwpKeyboardShortcutsInhibitorV1>,
    /// Pointer lock (Ctrl+Alt+G): the compositor's constraints and relative pointer
    /// managers, if it offers them; the relative pointer and the lock made.
    constraints: Option<constraints::ZwpPointerConstraintsV1>,
    relative_manager: Option<relative_manager::ZwpRelativePointerManagerV1>,
    relative: Option<relative::ZwpRelativePointerV1>,
    lock: Option<locked_pointer::ZwpLockedPointerV1>,
    /// Whether the title says the pointer is locked.
    titled_locked: bool,
    /// Seat version: `frame` events from 5 on (each pointer event is a frame before).
    seat_version: u32,
    /// The window's title as configured.
    title: String,
    /// What the title adds about the link (down, the peer stopped).
    link_note: String,
    /// The link is down: the picture is shown at half brightness.
    dimmed: bool,
    /// A source took the input (its first record, the capabilities, went).
    input_started: bool,
}

impl std::fmt::Debug for WaylandWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WaylandWindow({})", self.display)
    }
}

/// Connects and starts a `wayland-window` sink.
pub(crate) fn spawn_wayland_window_sink(
    rt: &Handle,
    endpoint: &'static str,
    c: &WaylandWindowConfig,
    rx: Receiver<Frame>,
    delivered: Delivered,
) -> Result<SinkTask, EndpointError> {
    let w = open_wayland_window(endpoint, c)?;
    Ok(rt.spawn_blocking(move || run_wayland_window(w, rx, &delivered)))
}

/// Whether the compositor of `c.display` can show the window (its globals, no window made):
/// for `ndd check` and the start of a side.
pub(crate) fn probe_wayland_window(
    endpoint: &'static str,
    c: &WaylandWindowConfig,
) -> Result<(), EndpointError> {
    let d = c.display.as_str();
    let conn = wayland_connect(endpoint, d)?;
    let (globals, _queue) = registry_queue_init::<State>(&conn).map_err(|e| {
        unavailable(
            endpoint,
            d,
            e.to_string(),
            "not a Wayland compositor's socket",
        )
    })?;
    let list = globals.contents().clone_list();
    for (need, version) in [("wl_compositor", 4), ("wl_shm", 1), ("xdg_wm_base", 1)] {
        if !list
            .iter()
            .any(|g| g.interface == need && g.version >= version)
        {
            return Err(unavailable(
                endpoint,
                d,
                format!("no {need} (version {version} or later)"),
                "the wayland-window sink needs a compositor with xdg-shell (every desktop compositor has it)",
            ));
        }
    }
    Ok(())
}

/// Connects, and maps the window (empty until the first update).
fn open_wayland_window(
    endpoint: &'static str,
    c: &WaylandWindowConfig,
) -> Result<WaylandWindow, EndpointError> {
    let d = c.display.as_str();
    let conn = wayland_connect(endpoint, d)?;
    let broken = |e: String| unavailable(endpoint, d, e, "the compositor closed the connection");
    let (globals, mut queue) =
        registry_queue_init::<State>(&conn).map_err(|e| broken(e.to_string()))?;
    let qh = queue.handle();
    let need = |what: &str, e: String| {
        unavailable(
            endpoint,
            d,
            format!("no {what} ({e})"),
            "the wayland-window sink needs a compositor with xdg-shell (every desktop compositor has it)",
        )
    };
    let compositor: wl_compositor::WlCompositor = globals
        .bind(&qh, 4..=5, ())
        .map_err(|e| need("wl_compositor 4", e.to_string()))?;
    let shm: wl_shm::WlShm = globals
        .bind(&qh, 1..=1, ())
        .map_err(|e| need("wl_shm", e.to_string()))?;
    let base: xdg_wm_base::XdgWmBase = globals
        .bind(&qh, 1..=2, ())
        .map_err(|e| need("xdg_wm_base", e.to_string()))?;
    let viewporter: Option<wp_viewporter::WpViewporter> = globals.bind(&qh, 1..=1, ()).ok();
    let inhibit: Option<inhibit_manager::ZwpKeyboardShortcutsInhibitManagerV1> =
        globals.bind(&qh, 1..=1, ()).ok();
    let constraints: Option<constraints::ZwpPointerConstraintsV1> =
        globals.bind(&qh, 1..=1, ()).ok();
    let relative_manager: Option<relative_manager::ZwpRelativePointerManagerV1> =
        globals.bind(&qh, 1..=1, ()).ok();
    // Version 5 to 7: pointer frames and wheel notches (`axis_discrete`).
    let seat: Option<wl_seat::WlSeat> = globals.bind(&qh, 5..=7, ()).ok();
    let seat_version = seat.as_ref().map_or(0, wayland_client::Proxy::version);
    let surface = compositor.create_surface(&qh, ());
    let xdg = base.get_xdg_surface(&surface, &qh, ());
    let toplevel = xdg.get_toplevel(&qh, ());
    toplevel.set_title(c.title.clone());
    toplevel.set_app_id("ndd".to_string());
    let viewport = viewporter
        .as_ref()
        .map(|v| v.get_viewport(&surface, &qh, ()));
    surface.commit();
    let mut state = State {
        free: [true; 2],
        seat,
        ..State::default()
    };
    // The first configure comes before anything may be shown.
    while !state.configured {
        queue
            .blocking_dispatch(&mut state)
            .map_err(|e| broken(format!("mapping the window: {e}")))?;
    }
    tracing::info!(
        endpoint,
        display = d,
        scaling = viewport.is_some(),
        shortcuts_inhibit = inhibit.is_some(),
        pointer_lock = constraints.is_some() && relative_manager.is_some(),
        "viewer window mapped"
    );
    // Its input, for a `wayland-window-input` source to take.
    let (tx, rx) = unbounded_channel();
    let taken = Arc::new(AtomicBool::new(false));
    viewers()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(viewer_key(d), (rx, taken.clone()));
    Ok(WaylandWindow {
        display: d.to_string(),
        endpoint,
        conn,
        queue,
        state,
        shm,
        surface,
        toplevel,
        viewport,
        buffers: None,
        fb: Framebuffer::new(INITIAL_SIZE.0, INITIAL_SIZE.1, PixelFormat::Bgrx32),
        dirty: Vec::new(),
        applied: Vec::new(),
        shown: None,
        input: (tx, taken),
        inhibit,
        inhibitor: None,
        constraints,
        relative_manager,
        relative: None,
        lock: None,
        titled_locked: false,
        seat_version,
        title: c.title.clone(),
        link_note: String::new(),
        dimmed: false,
        input_started: false,
    })
}

/// Rects kept to be copied, at most: past this the whole screen is copied once (a buffer
/// the compositor holds for long, or updates of many small rects, never pile up).
const MAX_RECTS: usize = 64;

/// `rects`, or the whole screen once they are more than [`MAX_RECTS`].
fn bound(rects: &mut Vec<Rect>, whole: Rect) {
    if rects.len() > MAX_RECTS {
        rects.clear();
        rects.push(whole);
    }
}

/// The largest size of `screen`'s shape inside `window` (at least 1×1).
fn fit(screen: (u16, u16), window: (i32, i32)) -> (i32, i32) {
    let (sw, sh) = (f64::from(screen.0), f64::from(screen.1));
    let (ww, wh) = (f64::from(window.0), f64::from(window.1));
    let k = (ww / sw).min(wh / sh);
    (
        ((sw * k).round() as i32).max(1),
        ((sh * k).round() as i32).max(1),
    )
}

impl WaylandWindow {
    /// The screen's size and the size it is shown at, for mapping positions (a new size
    /// queues a capabilities record before what comes next).
    fn screen_to_input(&mut self) {
        let screen = (self.fb.width(), self.fb.height());
        let shown = self
            .shown
            .unwrap_or((i32::from(screen.0), i32::from(screen.1)));
        self.state.input.set_screen(screen, shown);
    }

    /// Hands what the person did to the input source (once one took it): first the
    /// shortcut inhibitor, then the records.
    fn forward_input(&mut self) {
        if !self.input.1.load(Ordering::Acquire) {
            // Nobody takes it: nothing piles up.
            self.state.input.take();
            return;
        }
        if !self.input_started {
            // The source just took it: the screen's size first (said again even if known).
            self.input_started = true;
            self.state.input.forget_screen();
            self.screen_to_input();
        }
        if self.inhibitor.is_none() {
            if let (Some(m), Some(seat)) = (&self.inhibit, &self.state.seat) {
                let qh = self.queue.handle();
                self.inhibitor = Some(m.inhibit_shortcuts(&self.surface, seat, &qh, ()));
                tracing::debug!(
                    endpoint = self.endpoint,
                    "the compositor's shortcuts go to the viewer while it has the keyboard"
                );
            }
        }
        self.pointer_lock();
        if self.seat_version < 5 {
            self.state.input.frame();
        }
        self.screen_to_input();
        for m in self.state.input.take() {
            let _ = self.input.0.send(m);
        }
    }

    fn err(&self, e: impl std::fmt::Display) -> EndpointError {
        unavailable(
            self.endpoint,
            &self.display,
            e.to_string(),
            "the compositor closed the connection or refused a request",
        )
    }

    /// The whole screen, as one rect.
    fn whole(&self) -> Rect {
        Rect::new(0, 0, self.fb.width(), self.fb.height())
    }

    /// The link went down (the picture at half brightness, the title says why) or came back.
    fn link_state(&mut self, state: LinkState) {
        let (note, dim) = match state {
            LinkState::Up => ("", false),
            LinkState::Down => (" (link down, reconnecting)", true),
            LinkState::PeerStopped => (" (the peer stopped, waiting for it)", true),
        };
        self.link_note = note.to_string();
        self.retitle();
        self.set_dimmed(dim);
    }

    /// The title: as configured, what the link is doing, whether the pointer is locked.
    fn retitle(&mut self) {
        let lock = if self.titled_locked {
            " — pointer locked, Ctrl+Alt+G lets go"
        } else {
            ""
        };
        self.toplevel
            .set_title(format!("{}{}{lock}", self.title, self.link_note));
    }

    /// The pointer lock (Ctrl+Alt+G): made or let go of as the person asks, done with once
    /// the compositor let go of it, and said in the title.
    fn pointer_lock(&mut self) {
        let qh = self.queue.handle();
        if std::mem::take(&mut self.state.pointer_lost) {
            if let Some(r) = self.relative.take() {
                r.destroy();
            }
            self.state.lock_ended = true;
        }
        if self.relative.is_none() {
            if let (Some(m), Some(p)) = (&self.relative_manager, &self.state.pointer) {
                self.relative = Some(m.get_relative_pointer(p, &qh, ()));
            }
        }
        if std::mem::take(&mut self.state.lock_ended) {
            if let Some(l) = self.lock.take() {
                l.destroy();
            }
        }
        match self.state.input.take_lock_wanted() {
            Some(true) => {
                // (A lock asked for before and still waiting for the pointer to come in is
                // asked for afresh.)
                if let Some(l) = self.lock.take() {
                    l.destroy();
                }
                match (&self.constraints, &self.state.pointer, &self.relative) {
                    (Some(c), Some(p), Some(_)) => {
                        tracing::debug!(
                            endpoint = self.endpoint,
                            "Ctrl+Alt+G: the pointer locks once it is in the window"
                        );
                        self.lock = Some(c.lock_pointer(
                            &self.surface,
                            p,
                            None,
                            constraints::Lifetime::Oneshot,
                            &qh,
                            (),
                        ));
                    }
                    _ => tracing::warn!(
                        endpoint = self.endpoint,
                        "Ctrl+Alt+G: this compositor offers no pointer lock (zwp_pointer_constraints_v1 and zwp_relative_pointer_manager_v1)"
                    ),
                }
            }
            Some(false) => {
                if let Some(l) = self.lock.take() {
                    l.destroy();
                }
                self.state.input.set_locked(false);
            }
            _ => {}
        }
        if self.titled_locked != self.state.input.locked() {
            self.titled_locked = self.state.input.locked();
            self.retitle();
        }
    }

    /// Shows the picture dimmed or not (redrawn whole when it changes).
    fn set_dimmed(&mut self, dim: bool) {
        if dim != self.dimmed {
            self.dimmed = dim;
            self.dirty = vec![self.whole()];
        }
    }

    /// Applies an update to the framebuffer (a new screen size makes new buffers).
    fn apply(&mut self, u: &Update<'_>) -> Result<(), ndd_wire::display::DisplayFrameError> {
        // Frames flow again: the picture as it is, the update on top.
        self.set_dimmed(false);
        let resized = self.fb.apply(u)?;
        if resized {
            self.buffers = None;
            self.dirty = vec![self.whole()];
            tracing::info!(
                endpoint = self.endpoint,
                width = self.fb.width(),
                height = self.fb.height(),
                "viewer window takes the app's screen size"
            );
        } else {
            self.dirty.extend(u.rects.iter().map(|r| r.rect));
            let whole = self.whole();
            bound(&mut self.dirty, whole);
        }
        Ok(())
    }

    /// Two buffers of the framebuffer's size.
    fn buffers(&mut self) -> Result<(), EndpointError> {
        let size = (self.fb.width(), self.fb.height());
        if self.buffers.as_ref().is_some_and(|b| b.size == size) {
            return Ok(());
        }
        self.buffers = None;
        let stride = usize::from(size.0) * 4;
        let one = stride * usize::from(size.1);
        let len = one * 2;
        if len > i32::MAX as usize {
            return Err(self.err(format!(
                "a {}x{} screen needs {len} bytes of buffers, more than a wl_shm pool takes",
                size.0, size.1
            )));
        }
        let file = memfd("ndd-wayland-window", len).map_err(|e| self.err(e))?;
        // SAFETY: the memfd is this process's own, sized above and never truncated; the
        // compositor reads a buffer of it only between its commit and its release, while
        // this side writes only buffers it released.
        let map = unsafe { memmap2::MmapMut::map_mut(&file) }.map_err(|e| self.err(e))?;
        let qh = self.queue.handle();
        let pool = self
            .shm
            .create_pool(std::os::fd::AsFd::as_fd(&file), len as i32, &qh, ());
        let mk = |i: usize| {
            pool.create_buffer(
                (i * one) as i32,
                i32::from(size.0),
                i32::from(size.1),
                stride as i32,
                wl_shm::Format::Xrgb8888,
                &qh,
                i,
            )
        };
        let buffers = [mk(0), mk(1)];
        let whole = vec![Rect::new(0, 0, size.0, size.1)];
        self.state.free = [true; 2];
        self.buffers = Some(Buffers {
            map,
            pool,
            buffers,
            size,
            stale: [whole.clone(), whole],
        });
        Ok(())
    }

    /// Shows what changed, in a free buffer (nothing when both are still the compositor's).
    fn draw(&mut self) -> Result<bool, EndpointError> {
        if self.dirty.is_empty() || !self.state.configured {
            return Ok(false);
        }
        self.buffers()?;
        let Some(i) = (0..2).find(|&i| self.state.free[i]) else {
            return Ok(false);
        };
        let dirty = std::mem::take(&mut self.dirty);
        let Some(b) = self.buffers.as_mut() else {
            return Ok(false);
        };
        let whole = Rect::new(0, 0, b.size.0, b.size.1);
        for s in &mut b.stale {
            s.extend(dirty.iter().copied());
            bound(s, whole);
        }
        let stride = usize::from(b.size.0) * 4;
        let one = stride * usize::from(b.size.1);
        let px = self.fb.pixels();
        let dst = &mut b.map[i * one..(i + 1) * one];
        for r in std::mem::take(&mut b.stale[i]) {
            let (x, w) = (usize::from(r.x) * 4, usize::from(r.w) * 4);
            for y in usize::from(r.y)..usize::from(r.y) + usize::from(r.h) {
                let at = y * stride + x;
                if self.dimmed {
                    for (d, s) in dst[at..at + w].iter_mut().zip(&px[at..at + w]) {
                        *d = s / 2;
                    }
                } else {
                    dst[at..at + w].copy_from_slice(&px[at..at + w]);
                }
            }
        }
        self.surface.attach(Some(&b.buffers[i]), 0, 0);
        for r in &dirty {
            self.surface.damage_buffer(
                i32::from(r.x),
                i32::from(r.y),
                i32::from(r.w),
                i32::from(r.h),
            );
        }
        let screen = b.size;
        if let Some(v) = &self.viewport {
            let window = self.state.size;
            let dest = if window.0 > 0 && window.1 > 0 {
                fit(screen, window)
            } else {
                (i32::from(screen.0), i32::from(screen.1))
            };
            if self.shown != Some(dest) {
                v.set_destination(dest.0, dest.1);
                self.shown = Some(dest);
            }
        }
        self.surface.commit();
        self.state.free[i] = false;
        self.conn.flush().map_err(|e| self.err(e))?;
        Ok(true)
    }
}

/// The sink's loop: updates into the framebuffer as they come, drawn whenever a buffer is
/// free.
fn run_wayland_window(
    mut w: WaylandWindow,
    mut rx: Receiver<Frame>,
    delivered: &Delivered,
) -> Result<SinkReport, EndpointError> {
    let endpoint = w.endpoint;
    let mut report = SinkReport::default();
    let mut bad = RateLimit::new(Duration::from_secs(1));
    let mut window = (0, 0);
    // When the stream ended: what is left is shown within a second, or given up.
    let mut ended_at: Option<std::time::Instant> = None;
    loop {
        if w.state.closed {
            tracing::info!(endpoint, display = %w.display, "viewer window closed: the stream ends here");
            break;
        }
        // Everything waiting goes into the framebuffer before one draw.
        let mut ended = false;
        loop {
            match rx.try_recv() {
                Ok(frame) => {
                    if let Some(state) = LinkState::parse(frame.payload()) {
                        // The session's own record (any 3-byte record of that form is one).
                        w.link_state(state);
                        continue;
                    }
                    report.frames += 1;
                    report.bytes += frame.len() as u64;
                    match Update::parse(frame.payload()).map(|u| w.apply(&u)) {
                        Ok(Ok(())) => w.applied.push(frame.meta.seq),
                        Ok(Err(e)) | Err(e) => {
                            if let Some(n) = bad.admit(std::time::Instant::now()) {
                                tracing::warn!(endpoint, seq = frame.meta.seq, error = %e, suppressed = n, "bad display update dropped");
                            }
                            delivered.mark(frame.meta.seq);
                        }
                    }
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    ended = true;
                    break;
                }
            }
        }
        if w.state.size != window && w.state.size.0 > 0 {
            // The window was resized: scaled anew at the next draw.
            window = w.state.size;
            if w.dirty.is_empty() && w.buffers.is_some() {
                w.dirty.push(Rect::new(0, 0, w.fb.width(), w.fb.height()));
            }
        }
        if w.draw()? {
            for seq in w.applied.drain(..) {
                delivered.mark(seq);
            }
        }
        if ended {
            let at = *ended_at.get_or_insert_with(std::time::Instant::now);
            if w.dirty.is_empty() || at.elapsed() > Duration::from_secs(1) {
                break;
            }
        }
        // Positions dispatched next map onto the screen as it is now.
        if w.input_started {
            w.screen_to_input();
        }
        pump(&mut w.queue, &mut w.state, POLL).map_err(|e| w.err(e))?;
        w.forward_input();
    }
    // What was applied but never shown (the window closed, or the stream ended while both
    // buffers were the compositor's) is done with all the same.
    for seq in w.applied.drain(..) {
        delivered.mark(seq);
    }
    // Keys still held are released on the app side.
    w.state.input.keyboard_left();
    w.forward_input();
    {
        // Its own entry only (a newer viewer of the same display may have replaced it).
        let mut v = viewers().lock().unwrap_or_else(|p| p.into_inner());
        let key = viewer_key(&w.display);
        if v.get(&key).is_some_and(|(_, t)| Arc::ptr_eq(t, &w.input.1)) {
            v.remove(&key);
        }
    }
    w.toplevel.destroy();
    let _ = w.conn.flush();
    tracing::debug!(endpoint, frames = report.frames, "sink ended");
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::fit;

    #[test]
    fn the_screen_fits_the_window_with_its_shape() {
        assert_eq!(fit((640, 480), (640, 480)), (640, 480));
        assert_eq!(fit((1920, 1080), (960, 1000)), (960, 540));
        assert_eq!(fit((640, 480), (1280, 720)), (960, 720));
        assert_eq!(fit((100, 100), (1, 1)), (1, 1));
    }
}

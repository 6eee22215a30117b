//! The `gnome-input` sink: input records typed and moved into a GNOME Wayland session through
//! mutter's remote-desktop API on the session bus (`org.gnome.Mutter.RemoteDesktop`, what
//! GNOME's own remote desktop uses; mutter has none of the wlroots virtual-input protocols).
//! The same loop as `uinput`, `xtest` and `wayland-input` ([`super::sink`]): held keys and
//! buttons are released when the stream ends, on a release-all record and before an error.
//!
//! Keys an `x11-input` source annotated with their keysym go by that keysym
//! (`NotifyKeyboardKeysym`): mutter finds the key for it in the session's own layout, Shift or
//! AltGr included, so the person's layout travels; a keysym the session's layout lacks is not
//! typed (mutter's rule). Other keys (an `evdev` source) go by their Linux code
//! (`NotifyKeyboardKeycode`). Buttons, relative motion and the wheel go as themselves;
//! absolute positions are scaled from the source's axis ranges onto the monitor, through a
//! screen cast of it tied to the remote-desktop session (mutter places absolute motion on a
//! stream's monitor).

use super::config::GnomeInputConfig;
use super::record::{
    Capabilities, Event, ABS_X, ABS_Y, BTN_LEFT, EV_ABS, EV_KEY, EV_KEYSYM, EV_REL, REL_HWHEEL,
    REL_WHEEL, REL_X, REL_Y,
};
use super::sink::{run_injector, Injector};
use crate::common::delivered::Delivered;
use crate::common::error::EndpointError;
use crate::common::gnome::{
    check_monitor, closed_by_reconfiguration, closed_within, connect, create_remote_session,
    dbus_text, monitor_size, probe_remote_desktop, record_monitor, reopen, unavailable,
    watch_closed, watch_monitors, Reconfigured, Reopens, CALL, CAST, CLOSED_WAIT, REMOTE,
    REMOTE_SESSION,
};
use crate::common::portal::{PORTAL, PORTAL_PATH, PORTAL_SESSION, REMOTE_DESKTOP};
use crate::common::report::SinkTask;
use dbus::arg::{PropMap, RefArg, Variant};
use dbus::blocking::stdintf::org_freedesktop_dbus::Properties;
use dbus::blocking::Connection;
use ndd_core::Frame;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::runtime::Handle;
use tokio::sync::mpsc::Receiver;

const CAST_ROOT: &str = "/org/gnome/Mutter/ScreenCast";

/// A key pressed, as it was sent (its release goes the same way).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Sent {
    Keysym(u32),
    Keycode(u16),
}

/// Whose remote-desktop session a [`GnomeInput`] drives.
pub(super) enum Api {
    /// mutter's own: its session object, and the screen cast's stream absolute motion is
    /// placed on.
    Mutter {
        session: dbus::Path<'static>,
        stream: dbus::Path<'static>,
    },
    /// The xdg-desktop-portal's RemoteDesktop (`portal-input`): its session handle, and the
    /// stream (PipeWire node) it shared, absolute motion's place.
    Portal {
        session: dbus::Path<'static>,
        stream: u32,
    },
    /// The portal's RemoteDesktop over the EIS socket it handed out (`ConnectToEIS`): its
    /// session handle (closed at the end) and the link.
    Eis {
        session: dbus::Path<'static>,
        eis: Box<super::eis::Eis>,
    },
}

/// One call into the remote-desktop session.
#[derive(Debug, Clone, Copy)]
enum Notify {
    Keysym(u32, bool),
    Keycode(u32, bool),
    Button(i32, bool),
    Axis(u32, i32),
    Relative(f64, f64),
    Absolute(f64, f64),
}

/// An open `gnome-input` (or `portal-input`) sink: a remote-desktop session of mutter's (or
/// the portal's).
pub(crate) struct GnomeInput {
    pub(super) endpoint: &'static str,
    pub(super) bus: String,
    pub(super) conn: Connection,
    pub(super) api: Api,
    /// The monitor's size, in the stream's coordinates.
    pub(super) size: (f64, f64),
    /// The source's absolute axis ranges (x, y), once it said them.
    pub(super) abs: Option<((i32, i32), (i32, i32))>,
    pub(super) at: (i32, i32),
    /// Keys down, by the source's code: how each was pressed.
    pub(super) down: HashMap<u16, Sent>,
    /// mutter (the portal) closed the session.
    pub(super) closed: Arc<AtomicBool>,
    /// When mutter last said its monitors changed (a close then is theirs, not the person's).
    pub(super) reconfigured: Reconfigured,
    /// How far the last batch got ([`Reopening`] goes on from there).
    pub(super) progress: Progress,
    /// What to say when a call fails or the session closes.
    pub(super) ended: &'static str,
    /// `portal-input`: events stamped before this (wall clock, ns) are stale until the
    /// instant given (typed while the desktop's dialog was up), and how many were dropped.
    pub(super) stale_before: Option<(u64, std::time::Instant)>,
    pub(super) dropped: u64,
}

impl std::fmt::Debug for GnomeInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GnomeInput({})", self.bus)
    }
}

impl Drop for GnomeInput {
    fn drop(&mut self) {
        let _: Result<(), _> = match &self.api {
            Api::Mutter { session, .. } => {
                self.conn
                    .with_proxy(REMOTE, session, CALL)
                    .method_call(REMOTE_SESSION, "Stop", ())
            }
            Api::Portal { session, .. } | Api::Eis { session, .. } => self
                .conn
                .with_proxy(PORTAL, session, CALL)
                .method_call(PORTAL_SESSION, "Close", ()),
        };
    }
}

/// Opens and starts a `gnome-input` sink.
pub(crate) fn spawn_gnome_input_sink(
    rt: &Handle,
    endpoint: &'static str,
    c: &GnomeInputConfig,
    rx: Receiver<Frame>,
    delivered: Delivered,
) -> Result<SinkTask, EndpointError> {
    let c = c.clone();
    let mut g = Reopening::new(move || open_gnome_input(endpoint, &c), || true)?;
    Ok(rt.spawn_blocking(move || run_injector(endpoint, &mut g, rx, &delivered)))
}

/// A remote-desktop session opened again when mutter (the portal) closes it as the
/// monitors are reconfigured (turned, a new mode, one plugged in or out): before, the side
/// ended there (found by turning a headless mutter's monitor: `NotifyPointerMotionAbsolute:
/// Unknown stream`). A session the person stopped at the desktop is not opened again, nor a
/// portal's without a kept grant (it would ask again). What the failed batch had not done
/// goes to the new session, after the keys still held are pressed there again (mutter
/// released them with the old one).
pub(super) struct Reopening<F, R> {
    g: GnomeInput,
    open: F,
    reopenable: R,
    reopens: Reopens,
    /// A reopen failed: the session's errors are final from then on.
    gave_up: bool,
}

impl<F, R> Reopening<F, R>
where
    F: Fn() -> Result<GnomeInput, EndpointError>,
    R: Fn() -> bool,
{
    /// The first session `open` makes; `reopenable` says whether one may be made again
    /// without asking anyone.
    pub(super) fn new(open: F, reopenable: R) -> Result<Reopening<F, R>, EndpointError> {
        Ok(Reopening {
            g: open()?,
            open,
            reopenable,
            reopens: Reopens::default(),
            gave_up: false,
        })
    }

    /// A new session in place of the closed one, or `Err(None)` (said why), or the person's
    /// refusal at the desktop ([`reopen`]).
    fn reopened(&mut self) -> Result<GnomeInput, Option<EndpointError>> {
        let endpoint = self.g.endpoint;
        if !closed_by_reconfiguration(&self.g.conn, &self.g.reconfigured) {
            // The person stopped it at the desktop (or the session ended): final, as the
            // screen cast's (a service starting the side again would take the kept grant).
            let stopped = crate::common::STOPPED_AT_THE_DESKTOP;
            return Err(Some(unavailable(
                endpoint,
                &self.g.bus,
                format!("the remote-desktop session closed: {stopped}"),
                "start the side again to be remote-controlled again",
            )));
        }
        if !(self.reopenable)() {
            tracing::warn!(endpoint, "the remote-desktop session closed as the monitors were reconfigured; opening it again would ask at the desktop (no kept grant)");
            return Err(None);
        }
        if let Err(too_many) = self.reopens.admit(std::time::Instant::now()) {
            tracing::warn!(endpoint, "the remote-desktop session closed {too_many}");
            return Err(None);
        }
        tracing::info!(
            endpoint,
            "the remote-desktop session closed as the monitors were reconfigured: opening it again"
        );
        reopen(endpoint, "the remote-desktop session", &self.open)
    }
}

impl<F, R> Injector for Reopening<F, R>
where
    F: Fn() -> Result<GnomeInput, EndpointError>,
    R: Fn() -> bool,
{
    fn stale(&mut self, meta: &ndd_core::Meta) -> bool {
        self.g.stale(meta)
    }

    fn capabilities(&mut self, caps: &Capabilities) -> Result<(), EndpointError> {
        self.g.capabilities(caps)
    }

    fn events(&mut self, events: &[Event]) -> Result<(), EndpointError> {
        let e = match self.g.events(events) {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        // (mutter answers a call on a cast it closed with `Unknown stream`, often before its
        // Closed signal is read.)
        let gone = e.to_string().contains("Unknown stream")
            || closed_within(&self.g.conn, &self.g.closed, CLOSED_WAIT);
        if self.gave_up || !gone {
            return Err(e);
        }
        let mut g = match self.reopened() {
            Ok(g) => g,
            Err(declined) => {
                self.gave_up = true;
                // A refusal at the desktop is the error said (the side ends with its code).
                return Err(declined.unwrap_or(e));
            }
        };
        // The source's axis ranges and where its pointer was carry over; nothing typed now
        // is stale (no dialog was up).
        (g.abs, g.at, g.stale_before) = (self.g.abs, self.g.at, None);
        let old = std::mem::replace(&mut self.g, g);
        // The keys still held, pressed again as they were.
        for (&code, &sent) in &old.down {
            match sent {
                Sent::Keysym(k) => self.g.call(Notify::Keysym(k, true))?,
                Sent::Keycode(c) => self.g.call(Notify::Keycode(u32::from(c), true))?,
            }
            self.g.down.insert(code, sent);
        }
        // What the batch had not done: from the event that failed (with the keysym that
        // annotates it), then the motion summed or reached before it.
        let p = old.progress;
        let mut start = p.done.min(events.len());
        while start > 0 && events[start - 1].ty == EV_KEYSYM {
            start -= 1;
        }
        self.g.events(&events[start..])?;
        if p.rel != (0.0, 0.0) {
            self.g.call(Notify::Relative(p.rel.0, p.rel.1))?;
        }
        if p.abs {
            self.g.move_abs()?;
        }
        Ok(())
    }
}

/// How far [`GnomeInput::events`] got with its batch: the events done, the relative motion
/// summed and not yet sent, and whether an absolute position is still to go.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Progress {
    done: usize,
    rel: (f64, f64),
    abs: bool,
}

/// Checks mutter's remote-desktop API answers and has the monitor (for `ndd check`), without
/// opening a session.
pub(crate) fn probe_gnome_input(
    endpoint: &'static str,
    c: &GnomeInputConfig,
) -> Result<(), EndpointError> {
    let (bus, conn) = probe_remote_desktop(endpoint, &c.bus)?;
    check_monitor(&conn, endpoint, &bus, c.monitor.as_deref())
}

/// Opens a remote-desktop session with a screen cast of the monitor, and starts it.
fn open_gnome_input(
    endpoint: &'static str,
    c: &GnomeInputConfig,
) -> Result<GnomeInput, EndpointError> {
    let (bus, conn) = connect(endpoint, &c.bus)?;
    let fail = |what: String| {
        unavailable(
            endpoint,
            &bus,
            what,
            "mutter refused the remote-desktop session (is this GNOME 40 or later on Wayland?)",
        )
    };
    let session = create_remote_session(&conn, endpoint, &bus, &fail)?;
    let id: String = conn
        .with_proxy(REMOTE, &session, CALL)
        .get(REMOTE_SESSION, "SessionId")
        .map_err(|e| fail(format!("SessionId: {}", dbus_text(&e))))?;
    // A screen cast in the same session: absolute motion is placed on its monitor.
    let mut props = PropMap::new();
    props.insert(
        "remote-desktop-session-id".into(),
        Variant(Box::new(id) as Box<dyn RefArg>),
    );
    let (cast,): (dbus::Path<'static>,) = conn
        .with_proxy(CAST, CAST_ROOT, CALL)
        .method_call(CAST, "CreateSession", (props,))
        .map_err(|e| fail(format!("ScreenCast.CreateSession: {}", dbus_text(&e))))?;
    let stream = record_monitor(
        &conn,
        endpoint,
        &bus,
        &cast,
        c.monitor.as_deref(),
        PropMap::new(),
    )?;
    let closed = watch_closed(&conn, REMOTE_SESSION, &session).map_err(|e| fail(dbus_text(&e)))?;
    conn.with_proxy(REMOTE, &session, CALL)
        .method_call::<(), _, _, _>(REMOTE_SESSION, "Start", ())
        .map_err(|e| fail(format!("Start: {}", dbus_text(&e))))?;
    let size =
        monitor_size(&conn, &stream).map_err(|e| fail(format!("the monitor's size: {e}")))?;
    tracing::info!(endpoint, bus = %bus, width = size.0, height = size.1, "remote-desktop session ready");
    let reconfigured = watch_monitors(&conn).unwrap_or_default();
    Ok(GnomeInput {
        endpoint,
        bus,
        conn,
        api: Api::Mutter { session, stream },
        size: (size.0 as f64, size.1 as f64),
        abs: None,
        at: (0, 0),
        down: HashMap::new(),
        reconfigured,
        progress: Progress::default(),
        closed,
        ended: "the GNOME session ended, or mutter stopped the remote-desktop session",
        stale_before: None,
        dropped: 0,
    })
}

/// `v` in `[min, max]` onto `0..extent` (pixels of the monitor; the `kde-input` sink's
/// logical pixels of the output too).
pub(super) fn scale(v: i32, (min, max): (i32, i32), extent: f64) -> f64 {
    let span = f64::from(max) - f64::from(min);
    if span <= 0.0 {
        return 0.0;
    }
    let v = (f64::from(v) - f64::from(min)).clamp(0.0, span);
    (v / span * (extent - 1.0)).max(0.0)
}

impl GnomeInput {
    /// Makes the call `n` in the session, as its API spells it.
    fn call(&mut self, n: Notify) -> Result<(), EndpointError> {
        use super::eis::Sent;
        let size = self.size;
        if let Api::Eis { eis, .. } = &mut self.api {
            let sent = match n {
                Notify::Keysym(k, d) => Sent::Keysym(k, d),
                Notify::Keycode(k, d) => Sent::Keycode(k, d),
                Notify::Button(b, d) => Sent::Button(b as u32, d),
                Notify::Axis(0, v) => Sent::Wheel(v, 0),
                Notify::Axis(_, v) => Sent::Wheel(0, v),
                Notify::Relative(x, y) => Sent::Relative(x, y),
                Notify::Absolute(x, y) => Sent::Absolute(x, y, size),
            };
            return match eis.send(sent) {
                Ok(_) => Ok(()),
                Err(e) => Err(unavailable(
                    self.endpoint,
                    &self.bus,
                    format!("EIS: {e}"),
                    self.ended,
                )),
            };
        }
        let r = match &self.api {
            Api::Mutter { session, stream } => {
                let p = self.conn.with_proxy(REMOTE, session, CALL);
                let m = |method: &'static str| move |r: Result<(), dbus::Error>| (method, r);
                match n {
                    Notify::Keysym(k, d) => m("NotifyKeyboardKeysym")(p.method_call(
                        REMOTE_SESSION,
                        "NotifyKeyboardKeysym",
                        (k, d),
                    )),
                    Notify::Keycode(k, d) => m("NotifyKeyboardKeycode")(p.method_call(
                        REMOTE_SESSION,
                        "NotifyKeyboardKeycode",
                        (k, d),
                    )),
                    Notify::Button(b, d) => m("NotifyPointerButton")(p.method_call(
                        REMOTE_SESSION,
                        "NotifyPointerButton",
                        (b, d),
                    )),
                    Notify::Axis(a, v) => m("NotifyPointerAxisDiscrete")(p.method_call(
                        REMOTE_SESSION,
                        "NotifyPointerAxisDiscrete",
                        (a, v),
                    )),
                    Notify::Relative(x, y) => m("NotifyPointerMotionRelative")(p.method_call(
                        REMOTE_SESSION,
                        "NotifyPointerMotionRelative",
                        (x, y),
                    )),
                    Notify::Absolute(x, y) => {
                        let s = stream.to_string();
                        m("NotifyPointerMotionAbsolute")(p.method_call(
                            REMOTE_SESSION,
                            "NotifyPointerMotionAbsolute",
                            (s.as_str(), x, y),
                        ))
                    }
                }
            }
            Api::Portal { session, stream } => {
                let p = self.conn.with_proxy(PORTAL, PORTAL_PATH, CALL);
                let (s, o) = (session.clone(), PropMap::new());
                let m = |method: &'static str| move |r: Result<(), dbus::Error>| (method, r);
                match n {
                    Notify::Keysym(k, d) => m("NotifyKeyboardKeysym")(p.method_call(
                        REMOTE_DESKTOP,
                        "NotifyKeyboardKeysym",
                        (s, o, k as i32, u32::from(d)),
                    )),
                    Notify::Keycode(k, d) => m("NotifyKeyboardKeycode")(p.method_call(
                        REMOTE_DESKTOP,
                        "NotifyKeyboardKeycode",
                        (s, o, k as i32, u32::from(d)),
                    )),
                    Notify::Button(b, d) => m("NotifyPointerButton")(p.method_call(
                        REMOTE_DESKTOP,
                        "NotifyPointerButton",
                        (s, o, b, u32::from(d)),
                    )),
                    Notify::Axis(a, v) => m("NotifyPointerAxisDiscrete")(p.method_call(
                        REMOTE_DESKTOP,
                        "NotifyPointerAxisDiscrete",
                        (s, o, a, v),
                    )),
                    Notify::Relative(x, y) => m("NotifyPointerMotion")(p.method_call(
                        REMOTE_DESKTOP,
                        "NotifyPointerMotion",
                        (s, o, x, y),
                    )),
                    Notify::Absolute(x, y) => m("NotifyPointerMotionAbsolute")(p.method_call(
                        REMOTE_DESKTOP,
                        "NotifyPointerMotionAbsolute",
                        (s, o, *stream, x, y),
                    )),
                }
            }
            Api::Eis { .. } => unreachable!("taken above"),
        };
        let (method, r) = r;
        r.map_err(|e| {
            unavailable(
                self.endpoint,
                &self.bus,
                format!("{method}: {}", dbus_text(&e)),
                self.ended,
            )
        })
    }

    fn key(&mut self, code: u16, down: bool, sym: Option<u32>) -> Result<(), EndpointError> {
        let sent = if down {
            let s = match sym {
                Some(k) => Sent::Keysym(k),
                None => Sent::Keycode(code),
            };
            self.down.insert(code, s);
            s
        } else {
            self.down.remove(&code).unwrap_or(Sent::Keycode(code))
        };
        match sent {
            Sent::Keysym(k) => self.call(Notify::Keysym(k, down)),
            Sent::Keycode(c) => self.call(Notify::Keycode(u32::from(c), down)),
        }
    }
}

impl GnomeInput {
    /// The pointer to where the source's absolute axes put it, scaled onto the monitor.
    fn move_abs(&mut self) -> Result<(), EndpointError> {
        let Some((xr, yr)) = self.abs else {
            return Ok(());
        };
        let (x, y) = (
            scale(self.at.0, xr, self.size.0),
            scale(self.at.1, yr, self.size.1),
        );
        self.call(Notify::Absolute(x, y))
    }
}

impl Injector for GnomeInput {
    fn stale(&mut self, meta: &ndd_core::Meta) -> bool {
        let Some((before, until)) = self.stale_before else {
            return false;
        };
        if std::time::Instant::now() >= until {
            self.stale_before = None;
            return false;
        }
        if meta.timestamp_ns >= before {
            return false;
        }
        if self.dropped == 0 {
            // (Said as the portal sink's, shown by default as its other notes are.)
            tracing::info!(
                target: "ndd_endpoint::input::portal",
                endpoint = self.endpoint,
                "input that came while the desktop's dialog was up is dropped (stale by now)"
            );
        }
        self.dropped += 1;
        true
    }

    fn capabilities(&mut self, caps: &Capabilities) -> Result<(), EndpointError> {
        self.abs = match (caps.abs_axis(ABS_X), caps.abs_axis(ABS_Y)) {
            (Some(x), Some(y)) => Some(((x.min, x.max), (y.min, y.max))),
            _ => None,
        };
        Ok(())
    }

    fn events(&mut self, events: &[Event]) -> Result<(), EndpointError> {
        self.conn.process(Duration::ZERO).map_err(|e| {
            unavailable(
                self.endpoint,
                &self.bus,
                dbus_text(&e),
                "the session bus went away",
            )
        })?;
        if self.closed.load(Ordering::Acquire) {
            return Err(unavailable(
                self.endpoint,
                &self.bus,
                match self.api {
                    Api::Mutter { .. } => "mutter closed the remote-desktop session".into(),
                    Api::Portal { .. } | Api::Eis { .. } => {
                        "the xdg-desktop-portal closed the remote-desktop session".into()
                    }
                },
                self.ended,
            ));
        }
        let (mut dx, mut dy) = (0.0f64, 0.0f64);
        let mut moved_abs = false;
        self.progress = Progress::default();
        // The keysym the next press of a key types (an `x11-input` source's annotation).
        let mut sym: Option<(u16, u32)> = None;
        for (i, e) in events.iter().enumerate() {
            match (e.ty, e.code) {
                (EV_KEYSYM, code) => sym = Some((code, e.value as u32)),
                (EV_KEY, code) if (BTN_LEFT..BTN_LEFT + 0x10).contains(&code) => {
                    self.call(Notify::Button(i32::from(code), e.value != 0))?;
                }
                // Autorepeat (2) is the compositor's own business.
                (EV_KEY, code) if e.value != 2 => {
                    let down = e.value != 0;
                    let s = sym
                        .take()
                        .filter(|&(c, k)| c == code && k != 0 && down)
                        .map(|(_, k)| k);
                    self.key(code, down, s)?;
                }
                (EV_REL, REL_X) => dx += f64::from(e.value),
                (EV_REL, REL_Y) => dy += f64::from(e.value),
                // One notch a step; mutter's vertical axis runs down, the wheel's up.
                (EV_REL, REL_WHEEL) => {
                    self.call(Notify::Axis(0, -e.value))?;
                }
                (EV_REL, REL_HWHEEL) => {
                    self.call(Notify::Axis(1, e.value))?;
                }
                (EV_ABS, ABS_X) => {
                    self.at.0 = e.value;
                    moved_abs = true;
                }
                (EV_ABS, ABS_Y) => {
                    self.at.1 = e.value;
                    moved_abs = true;
                }
                _ => {}
            }
            self.progress = Progress {
                done: i + 1,
                rel: (dx, dy),
                abs: moved_abs,
            };
        }
        if dx != 0.0 || dy != 0.0 {
            self.call(Notify::Relative(dx, dy))?;
            self.progress.rel = (0.0, 0.0);
        }
        if moved_abs {
            self.move_abs()?;
            self.progress.abs = false;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::scale;

    #[test]
    fn absolute_positions_scale_onto_the_monitor() {
        assert_eq!(scale(0, (0, 1000), 1920.0), 0.0);
        assert_eq!(scale(1000, (0, 1000), 1920.0), 1919.0);
        assert_eq!(scale(500, (0, 1000), 1921.0), 960.0);
        // Out of range clamps; an empty range is the corner.
        assert_eq!(scale(-5, (0, 1000), 100.0), 0.0);
        assert_eq!(scale(2000, (0, 1000), 100.0), 99.0);
        assert_eq!(scale(3, (7, 7), 100.0), 0.0);
    }
}

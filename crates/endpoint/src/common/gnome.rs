//! What the GNOME endpoints share (`gnome-screen`, `gnome-input`, `gnome-clipboard`): the
//! session bus, and
//! errors that say what is wrong with it.

use crate::common::error::EndpointError;
use dbus::arg::PropMap;
use dbus::blocking::stdintf::org_freedesktop_dbus::Properties;
use dbus::blocking::Connection;
use dbus::message::MatchRule;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// mutter's screen-cast service, and its session's and stream's interfaces.
pub(crate) const CAST: &str = "org.gnome.Mutter.ScreenCast";
pub(crate) const CAST_SESSION: &str = "org.gnome.Mutter.ScreenCast.Session";
pub(crate) const CAST_STREAM: &str = "org.gnome.Mutter.ScreenCast.Stream";

/// mutter's remote-desktop service, its root object and its session's interface.
pub(crate) const REMOTE: &str = "org.gnome.Mutter.RemoteDesktop";
pub(crate) const REMOTE_ROOT: &str = "/org/gnome/Mutter/RemoteDesktop";
pub(crate) const REMOTE_SESSION: &str = "org.gnome.Mutter.RemoteDesktop.Session";

/// Longest wait for a D-Bus answer.
pub(crate) const CALL: Duration = Duration::from_secs(5);

/// An error about the session on bus `bus` (or about GStreamer, `bus` then naming it).
pub(crate) fn unavailable(
    endpoint: &'static str,
    bus: &str,
    what: String,
    hint: &str,
) -> EndpointError {
    EndpointError::Unavailable {
        endpoint,
        what: format!("{bus}: {what}"),
        hint: hint.to_string(),
    }
}

/// A connection to the session bus at `bus` (empty: `$DBUS_SESSION_BUS_ADDRESS`), and its
/// name for messages.
pub(crate) fn connect(
    endpoint: &'static str,
    bus: &str,
) -> Result<(String, Connection), EndpointError> {
    let (name, r) = if bus.is_empty() {
        let addr = std::env::var("DBUS_SESSION_BUS_ADDRESS").unwrap_or_default();
        if addr.is_empty() {
            return Err(unavailable(
                endpoint,
                "session bus",
                "no session bus: DBUS_SESSION_BUS_ADDRESS is not set".into(),
                "run ndd inside the GNOME session, or set `bus` (e.g. unix:path=/run/user/1000/bus)",
            ));
        }
        (format!("session bus {addr}"), Connection::new_session())
    } else {
        let r = dbus::channel::Channel::open_private(bus).and_then(|mut ch| {
            ch.register()?;
            Ok(Connection::from(ch))
        });
        (format!("session bus {bus}"), r)
    };
    let conn = r.map_err(|e| {
        unavailable(
            endpoint,
            &name,
            format!(
                "cannot connect to the session bus: {}",
                e.message().unwrap_or("no reason given")
            ),
            "ndd must run as the session's user, inside the session (or set `bus` to its address)",
        )
    })?;
    Ok((name, conn))
}

pub(crate) fn not_gnome(endpoint: &'static str, bus: &str, service: &str) -> EndpointError {
    unavailable(
        endpoint,
        bus,
        format!("nobody on this bus offers {service}: not a GNOME Wayland session"),
        "this endpoint needs GNOME on Wayland (mutter); on sway, Hyprland or river use wayland-screen and wayland-input, on X11 x11-screen and xtest",
    )
}

/// A new remote-desktop session of mutter's (not started); `fail` words a refusal.
pub(crate) fn create_remote_session(
    conn: &Connection,
    endpoint: &'static str,
    bus: &str,
    fail: &dyn Fn(String) -> EndpointError,
) -> Result<dbus::Path<'static>, EndpointError> {
    let (session,): (dbus::Path<'static>,) = conn
        .with_proxy(REMOTE, REMOTE_ROOT, CALL)
        .method_call(REMOTE, "CreateSession", ())
        .map_err(|e| {
            if e.name() == Some("org.freedesktop.DBus.Error.ServiceUnknown") {
                not_gnome(endpoint, bus, REMOTE)
            } else {
                fail(format!("CreateSession: {}", dbus_text(&e)))
            }
        })?;
    Ok(session)
}

/// Checks mutter's remote-desktop API answers on the bus at `bus` (for `ndd check`) without
/// opening a session (that would show the person GNOME's sharing indicator); the bus's name
/// and the connection.
pub(crate) fn probe_remote_desktop(
    endpoint: &'static str,
    bus: &str,
) -> Result<(String, Connection), EndpointError> {
    let (bus, conn) = connect(endpoint, bus)?;
    let r: Result<u32, _> = conn
        .with_proxy(REMOTE, REMOTE_ROOT, CALL)
        .get(REMOTE, "SupportedDeviceTypes");
    match r {
        Ok(_) => Ok((bus, conn)),
        Err(e) if e.name() == Some("org.freedesktop.DBus.Error.ServiceUnknown") => {
            Err(not_gnome(endpoint, &bus, REMOTE))
        }
        Err(e) => Err(unavailable(
            endpoint,
            &bus,
            format!("mutter's remote-desktop API: {}", dbus_text(&e)),
            "GNOME 40 or later on Wayland has it",
        )),
    }
}

/// A D-Bus error's name and words, escaped (they come from another program).
pub(crate) fn dbus_text(e: &dbus::Error) -> String {
    let text = format!(
        "{}: {}",
        e.name().unwrap_or("D-Bus error"),
        e.message().unwrap_or("no reason given")
    );
    escaped(&text, 300)
}

/// Text from another program, control characters blanked, at most `max` characters.
fn escaped(s: &str, max: usize) -> String {
    s.chars()
        .take(max)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// One display mode in mutter's `GetCurrentState`: id, size, refresh rate, preferred scale,
/// supported scales, properties.
type Mode = (String, i32, i32, f64, f64, Vec<f64>, PropMap);
/// One monitor: (connector, vendor, product, serial), its modes, properties.
type Monitor = ((String, String, String, String), Vec<Mode>, PropMap);
/// One logical monitor: position, scale, transform, primary, its monitors, properties.
type Logical = (
    i32,
    i32,
    f64,
    u32,
    bool,
    Vec<(String, String, String, String)>,
    PropMap,
);

/// The connectors of the session's monitors (`DP-1`, `eDP-1`), from mutter's display
/// configuration API.
pub(crate) fn monitors(conn: &Connection) -> Result<Vec<String>, dbus::Error> {
    let (_, list, _, _): (u32, Vec<Monitor>, Vec<Logical>, PropMap) = conn
        .with_proxy(
            "org.gnome.Mutter.DisplayConfig",
            "/org/gnome/Mutter/DisplayConfig",
            CALL,
        )
        .method_call("org.gnome.Mutter.DisplayConfig", "GetCurrentState", ())?;
    Ok(list.into_iter().map(|(spec, _, _)| spec.0).collect())
}

/// The hint for a monitor the session does not have: its monitors `list`, when mutter said
/// them.
fn monitor_hint(list: Result<Vec<String>, dbus::Error>) -> String {
    match list {
        Ok(list) if !list.is_empty() => format!(
            "set monitor to one of this session's: {} (or leave it out for the primary one)",
            list.iter()
                .map(|m| escaped(m, 64))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        _ => "set monitor to one of the session's connectors (`gnome-monitor-config list`), or leave it out for the primary one".into(),
    }
}

/// Checks the session has a monitor `monitor` (none: nothing to check), naming its monitors
/// when not; a session whose display configuration cannot be read is not refused here.
pub(crate) fn check_monitor(
    conn: &Connection,
    endpoint: &'static str,
    bus: &str,
    monitor: Option<&str>,
) -> Result<(), EndpointError> {
    let Some(m) = monitor else { return Ok(()) };
    match monitors(conn) {
        Ok(list) if !list.iter().any(|x| x == m) => Err(unavailable(
            endpoint,
            bus,
            format!("no monitor {} in this GNOME session", escaped(m, 64)),
            &monitor_hint(Ok(list)),
        )),
        _ => Ok(()),
    }
}

/// Asks screen-cast session `session` to record `monitor` (none: the primary one) with
/// `props`; the stream's path. A monitor mutter does not know is said with the session's.
pub(crate) fn record_monitor(
    conn: &Connection,
    endpoint: &'static str,
    bus: &str,
    session: &dbus::Path<'static>,
    monitor: Option<&str>,
    props: PropMap,
) -> Result<dbus::Path<'static>, EndpointError> {
    let monitor = monitor.unwrap_or_default();
    let (stream,): (dbus::Path<'static>,) = conn
        .with_proxy(CAST, session, CALL)
        .method_call(CAST_SESSION, "RecordMonitor", (monitor, props))
        .map_err(|e| {
            unavailable(
                endpoint,
                bus,
                format!(
                    "RecordMonitor({}): {}",
                    if monitor.is_empty() {
                        "the primary monitor"
                    } else {
                        monitor
                    },
                    dbus_text(&e)
                ),
                &monitor_hint(monitors(conn)),
            )
        })?;
    Ok(stream)
}

/// A flag set when mutter closes `session` (its `Closed` signal on `interface`), seen as the
/// connection is processed.
pub(crate) fn watch_closed(
    conn: &Connection,
    interface: &'static str,
    session: &dbus::Path<'static>,
) -> Result<Arc<AtomicBool>, dbus::Error> {
    let closed = Arc::new(AtomicBool::new(false));
    let cl = Arc::clone(&closed);
    conn.add_match(
        MatchRule::new_signal(interface, "Closed").with_path(session.clone()),
        move |(): (), _, _| {
            cl.store(true, Ordering::Release);
            true
        },
    )?;
    Ok(closed)
}

/// Whether a session watched by [`watch_closed`] (`closed`) was closed, its Closed signal
/// waited for on `conn` for `wait` at most (a call on it, or its stream, fails first).
pub(crate) fn closed_within(conn: &Connection, closed: &AtomicBool, wait: Duration) -> bool {
    let t0 = std::time::Instant::now();
    while !closed.load(Ordering::Acquire) && t0.elapsed() < wait {
        if conn.process(Duration::from_millis(50)).is_err() {
            break;
        }
    }
    closed.load(Ordering::Acquire)
}

/// When mutter last said on `conn`'s bus that its monitors changed (`MonitorsChanged` of its
/// display configuration API): a session it closes then was closed by the new configuration,
/// not by the person (who may stop a share at the desktop, and is not overridden).
pub(crate) fn watch_monitors(conn: &Connection) -> Result<Reconfigured, dbus::Error> {
    let seen: Reconfigured = Arc::default();
    let s = Arc::clone(&seen);
    conn.add_match(
        MatchRule::new_signal("org.gnome.Mutter.DisplayConfig", "MonitorsChanged")
            .with_path("/org/gnome/Mutter/DisplayConfig"),
        move |(): (), _, _| {
            *s.lock().unwrap_or_else(|p| p.into_inner()) = Some(std::time::Instant::now());
            true
        },
    )?;
    Ok(seen)
}

/// When mutter last said its monitors changed ([`watch_monitors`]).
pub(crate) type Reconfigured = Arc<std::sync::Mutex<Option<std::time::Instant>>>;

/// Whether a session that just closed went with a new monitor configuration: mutter's
/// `MonitorsChanged` seen within [`RECONFIGURED_NEAR`], waited for on `conn` that long (it
/// may come after the Closed signal).
pub(crate) fn closed_by_reconfiguration(conn: &Connection, seen: &Reconfigured) -> bool {
    let t0 = std::time::Instant::now();
    loop {
        let near = seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|t| t.elapsed() < RECONFIGURED_NEAR * 2);
        if near {
            return true;
        }
        if t0.elapsed() >= RECONFIGURED_NEAR || conn.process(Duration::from_millis(50)).is_err() {
            return false;
        }
    }
}

/// How near a monitor change and a session's closing come when one made the other.
const RECONFIGURED_NEAR: Duration = Duration::from_secs(2);

/// The size of screen-cast stream `stream`'s monitor, from its parameters.
pub(crate) fn monitor_size(
    conn: &Connection,
    stream: &dbus::Path<'static>,
) -> Result<(usize, usize), String> {
    let params: PropMap = conn
        .with_proxy(CAST, stream, CALL)
        .get(CAST_STREAM, "Parameters")
        .map_err(|e| dbus_text(&e))?;
    let size = params
        .get("size")
        .ok_or_else(|| "the stream's parameters have no size".to_string())?;
    let mut it = size
        .0
        .as_iter()
        .ok_or_else(|| "the stream's size is not a pair".to_string())?;
    let mut next = || it.next().and_then(|v| v.as_i64());
    match (next(), next()) {
        (Some(w), Some(h)) if (2..=8192).contains(&w) && (2..=8192).contains(&h) => {
            Ok((w as usize, h as usize))
        }
        (w, h) => Err(format!("the stream's size is {w:?}x{h:?}")),
    }
}

/// How long a session that mutter (or the portal) closed is asked for again before the
/// endpoint gives up: mutter closes its screen casts, and the remote-desktop sessions tied to
/// them, when the monitors are reconfigured (turned, a new mode, one plugged in or out), and
/// the new configuration takes a moment.
const REOPEN_WAIT: Duration = Duration::from_secs(10);

/// How long an endpoint whose call or pipeline failed waits for the session's Closed signal
/// (which says why) before it takes the failure as its own.
pub(crate) const CLOSED_WAIT: Duration = Duration::from_secs(1);

/// A session is opened again at most this many times in [`REOPEN_SPAN`]: one that keeps
/// closing is an error, not a loop.
const REOPENS: usize = 5;
const REOPEN_SPAN: Duration = Duration::from_secs(60);

/// When a session was opened again lately ([`REOPENS`] in [`REOPEN_SPAN`] at most).
#[derive(Debug, Default)]
pub(crate) struct Reopens(Vec<std::time::Instant>);

impl Reopens {
    /// One more at `now`, or `Err` saying how many came within how long.
    pub(crate) fn admit(&mut self, now: std::time::Instant) -> Result<(), String> {
        self.0.retain(|t| now.duration_since(*t) < REOPEN_SPAN);
        if self.0.len() >= REOPENS {
            return Err(format!(
                "again, after it was opened again {REOPENS} times within {} s",
                REOPEN_SPAN.as_secs()
            ));
        }
        self.0.push(now);
        Ok(())
    }
}

/// What `open` makes, asked for again for [`REOPEN_WAIT`] after mutter (the portal) closed
/// the last one (`what` names it in the log); `Err(None)` if none came, `Err(Some(e))` if the
/// person at the desktop declined its dialog (a kept grant the portal no longer honours):
/// final, never asked again.
pub(crate) fn reopen<T>(
    endpoint: &'static str,
    what: &str,
    open: &dyn Fn() -> Result<T, EndpointError>,
) -> Result<T, Option<EndpointError>> {
    let t0 = std::time::Instant::now();
    loop {
        match open() {
            Ok(s) => return Ok(s),
            Err(e) if e.to_string().contains(super::DECLINED_AT_THE_DESKTOP) => {
                tracing::warn!(endpoint, "{what} was not opened again: {e}");
                return Err(Some(e));
            }
            Err(e) if t0.elapsed() < REOPEN_WAIT => {
                tracing::debug!(endpoint, "{what} did not open again yet: {e}");
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => {
                tracing::warn!(endpoint, "{what} did not open again: {e}");
                return Err(None);
            }
        }
    }
}

#[cfg(test)]
mod reopen_tests {
    use super::*;

    /// A dialog declined while a session opens again is final: said at once, never asked
    /// again (before, it was asked again every 0.5 s for 10 s, then lost for "closed").
    #[test]
    fn a_reopen_declined_at_the_desktop_is_final() {
        let asked = std::cell::Cell::new(0);
        let r = reopen("portal-screen", "the screen cast", &|| -> Result<(), _> {
            asked.set(asked.get() + 1);
            Err(EndpointError::Unavailable {
                endpoint: "portal-screen",
                what: format!("Start: {}", crate::common::DECLINED_AT_THE_DESKTOP),
                hint: String::new(),
            })
        });
        let e = r.expect_err("declined").expect("the refusal itself");
        assert!(
            e.to_string().contains("Start: declined at the desktop"),
            "{e}"
        );
        assert_eq!(asked.get(), 1, "asked once, never again");
        // Anything else is asked again until `REOPEN_WAIT` passes.
        let r = reopen("gnome-input", "the session", &|| -> Result<(), _> {
            asked.set(asked.get() + 1);
            if asked.get() < 3 {
                Err(EndpointError::Unavailable {
                    endpoint: "gnome-input",
                    what: "Start: no such object".into(),
                    hint: String::new(),
                })
            } else {
                Ok(())
            }
        });
        assert!(r.is_ok());
        assert_eq!(asked.get(), 3);
    }

    #[test]
    fn a_session_is_opened_again_five_times_a_minute_at_most() {
        let t0 = std::time::Instant::now();
        let mut r = Reopens::default();
        for i in 0..5 {
            assert_eq!(r.admit(t0 + Duration::from_secs(i)), Ok(()));
        }
        assert_eq!(
            r.admit(t0 + Duration::from_secs(10)),
            Err("again, after it was opened again 5 times within 60 s".to_string())
        );
        // A minute after the first, one more may come.
        assert_eq!(r.admit(t0 + Duration::from_secs(61)), Ok(()));
    }
}

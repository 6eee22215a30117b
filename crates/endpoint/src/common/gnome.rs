//! What the GNOME endpoints share (`gnome-screen`, `gnome-input`): the session bus, and
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

/// A D-Bus error's name and words, escaped (they come from another program).
pub(crate) fn dbus_text(e: &dbus::Error) -> String {
    let text = format!(
        "{}: {}",
        e.name().unwrap_or("D-Bus error"),
        e.message().unwrap_or("no reason given")
    );
    text.chars()
        .take(300)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// Asks screen-cast session `session` to record `monitor` (none: the primary one) with
/// `props`; the stream's path. A monitor mutter does not know is said with what to do.
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
                    if monitor.is_empty() { "the primary monitor" } else { monitor },
                    dbus_text(&e)
                ),
                "set monitor to one of the session's connectors (`gnome-monitor-config list`), or leave it out for the primary one",
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

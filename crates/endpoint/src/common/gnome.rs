//! What the GNOME endpoints share (`gnome-screen`, `gnome-input`): the session bus, and
//! errors that say what is wrong with it.

use crate::common::error::EndpointError;
use dbus::blocking::Connection;
use std::time::Duration;

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

//! The `portal-input` sink: input records typed and moved into a desktop session through the
//! xdg-desktop-portal's RemoteDesktop interface (`org.freedesktop.portal.RemoteDesktop`), the
//! way desktops let a program drive them: GNOME (xdg-desktop-portal-gnome), KDE Plasma
//! (xdg-desktop-portal-kde). The same injector as `gnome-input` ([`super::gnome`]): keys by
//! keysym (the session's layout types them) or by Linux code, buttons, relative and absolute
//! motion, the wheel; held keys released at the end, on a release-all record and before an
//! error.
//!
//! Where the portal offers `ConnectToEIS` (RemoteDesktop version 2: xdg-desktop-portal 1.18
//! and later, GNOME 46 and later, KDE Plasma 6.1 and later), input goes over the EIS socket
//! it hands out ([`super::eis`]), not one D-Bus call per event; `via` picks.
//!
//! Each start shows the desktop's remote-desktop dialog (GNOME: "Allow remote interaction",
//! then Share), unless the portal keeps grants (RemoteDesktop version 2: its restore token is
//! kept in `token_file` as `portal-screen` keeps its own). A monitor is shared with the
//! session (a combined ScreenCast): the portal places absolute motion on its stream.

use super::config::{PortalInputConfig, PortalVia};
use super::eis::Eis;
use super::gnome::{Api, GnomeInput, Reopening};
use super::sink::run_injector;
use crate::common::delivered::Delivered;
use crate::common::error::EndpointError;
use crate::common::gnome::{connect, dbus_text, unavailable, CALL};
use crate::common::portal::{
    create_session, no_backend, options, read_token, request, variant, version, write_token,
    PORTAL, PORTAL_HINT, PORTAL_PATH, REMOTE_DESKTOP, SCREEN_CAST,
};
use crate::common::report::SinkTask;
use dbus::blocking::Connection;
use ndd_core::Frame;
use std::collections::HashMap;
use std::time::Duration;
use tokio::runtime::Handle;
use tokio::sync::mpsc::Receiver;

/// How long after the session starts events stamped before it are dropped (they were typed
/// while the desktop's dialog was up; input is never injected late). A device whose clock is
/// behind this machine's by more than the time since the start loses its first events within
/// this window, no more.
const STALE_FOR: Duration = Duration::from_secs(10);

/// The RemoteDesktop version that keeps a grant (`persist_mode`, restore tokens).
const PERSIST_VERSION: u32 = 2;

/// The RemoteDesktop version with `ConnectToEIS`.
const EIS_VERSION: u32 = 2;

/// Why EIS did not start.
enum EisFailed {
    /// The portal refused `ConnectToEIS` (the desktop's backend has no EIS): its Notify calls
    /// still serve.
    Call(String),
    /// The socket came but the link did not set up: the portal refuses Notify calls from
    /// then on.
    Setup(String),
}

/// The EIS socket of a started remote-desktop session, set up.
fn connect_eis(conn: &Connection, session: &dbus::Path<'static>) -> Result<Eis, EisFailed> {
    let (fd,): (std::os::fd::OwnedFd,) = conn
        .with_proxy(PORTAL, PORTAL_PATH, CALL)
        .method_call(
            REMOTE_DESKTOP,
            "ConnectToEIS",
            (session.clone(), dbus::arg::PropMap::new()),
        )
        .map_err(|e| EisFailed::Call(format!("ConnectToEIS: {}", dbus_text(&e))))?;
    Eis::connect(fd).map_err(|e| EisFailed::Setup(format!("EIS: {e}")))
}

/// The portal's RemoteDesktop version on this bus, or what is wrong.
fn check(endpoint: &'static str, bus: &str, conn: &Connection) -> Result<u32, EndpointError> {
    let v = version(conn, REMOTE_DESKTOP).map_err(|e| {
        unavailable(
            endpoint,
            bus,
            format!(
                "no xdg-desktop-portal RemoteDesktop on this bus ({})",
                dbus_text(&e)
            ),
            PORTAL_HINT,
        )
    })?;
    if v == 0 {
        return Err(no_backend(endpoint, bus, REMOTE_DESKTOP));
    }
    Ok(v)
}

/// Whether the session's portal offers RemoteDesktop (for `ndd check`), without asking
/// anything at the desktop.
pub(crate) fn probe_portal_input(
    endpoint: &'static str,
    c: &PortalInputConfig,
) -> Result<(), EndpointError> {
    let (bus, conn) = connect(endpoint, &c.bus)?;
    check(endpoint, &bus, &conn).map(drop)
}

/// Whether the portal on `bus` (empty: `$DBUS_SESSION_BUS_ADDRESS`) offers `ConnectToEIS`
/// (RemoteDesktop version 2), so a `portal-input` sink with `via = "auto"` tries EIS there
/// (`ndd check --side`).
pub fn portal_input_offers_eis(bus: &str) -> bool {
    connect("portal-input sink", bus)
        .ok()
        .and_then(|(_, conn)| version(&conn, REMOTE_DESKTOP).ok())
        .is_some_and(|v| v >= EIS_VERSION)
}

/// Starts a `portal-input` sink: it opens the session in its own thread (the person at the
/// desktop may take minutes to answer the dialog); events stamped before the session was
/// there are dropped for [`STALE_FOR`] after it (the device's capabilities still count).
pub(crate) fn spawn_portal_input_sink(
    rt: &Handle,
    endpoint: &'static str,
    c: &PortalInputConfig,
    rx: Receiver<Frame>,
    delivered: Delivered,
) -> Result<SinkTask, EndpointError> {
    let (c, kept) = (c.clone(), c.token_path());
    Ok(rt.spawn_blocking(move || {
        // (Opened again with the grant the last start kept, where mutter closes it.)
        let mut g = Reopening::new(
            move || open_portal_input(endpoint, &c),
            move || {
                kept.as_deref()
                    .and_then(crate::common::portal::read_token)
                    .is_some()
            },
        )?;
        run_injector(endpoint, &mut g, rx, &delivered)
    }))
}

/// Opens a remote-desktop session of the portal's, with a monitor shared for absolute motion,
/// and starts it (the dialog, unless a kept grant holds).
fn open_portal_input(
    endpoint: &'static str,
    c: &PortalInputConfig,
) -> Result<GnomeInput, EndpointError> {
    let (bus, conn) = connect(endpoint, &c.bus)?;
    let v = check(endpoint, &bus, &conn)?;
    let fail = |what: String| {
        unavailable(
            endpoint,
            &bus,
            what,
            "the desktop's portal did not start a remote-desktop session (see its log: journalctl --user -u xdg-desktop-portal)",
        )
    };
    let (session, closed) = create_session(&conn, REMOTE_DESKTOP).map_err(&fail)?;
    // Keyboard and pointer; the grant kept where the portal can keep it.
    let token_file = c.token_path();
    let persist = v >= PERSIST_VERSION && token_file.is_some();
    let kept = token_file
        .as_deref()
        .filter(|_| persist)
        .and_then(read_token);
    let (t, mut opts) = options("devices");
    opts.insert("types".into(), variant(3u32));
    if persist {
        opts.insert("persist_mode".into(), variant(2u32));
        if let Some(k) = &kept {
            opts.insert("restore_token".into(), variant(k.clone()));
        }
    }
    request(
        &conn,
        REMOTE_DESKTOP,
        "SelectDevices",
        (session.clone(), opts),
        &t,
        CALL,
    )
    .map_err(&fail)?;
    // A monitor in the same session: absolute motion is placed on its stream.
    let (t, mut opts) = options("sources");
    opts.insert("types".into(), variant(1u32));
    request(
        &conn,
        SCREEN_CAST,
        "SelectSources",
        (session.clone(), opts),
        &t,
        CALL,
    )
    .map_err(&fail)?;
    if kept.is_none() {
        tracing::info!(
            endpoint,
            bus = %bus,
            "asking at the desktop to allow remote interaction (its remote-desktop dialog{})",
            if persist { "; once: the grant is kept" } else { "; this portal keeps no grant: every start asks" }
        );
    }
    let (t, opts) = options("start");
    let wait = Duration::try_from_secs_f64(c.grant_wait_s).unwrap_or(CALL);
    let r = request(
        &conn,
        REMOTE_DESKTOP,
        "Start",
        (session.clone(), "", opts),
        &t,
        wait,
    )
    .map_err(&fail)?;
    if let (true, Some(path), Some(new)) = (
        persist,
        token_file.as_deref(),
        dbus::arg::prop_cast::<String>(&r.results, "restore_token"),
    ) {
        if let Err(e) = write_token(path, new) {
            tracing::warn!(
                endpoint,
                "cannot keep the portal's restore token in {}: {e}; the next start asks at the desktop again",
                path.display()
            );
        }
    }
    let devices = dbus::arg::prop_cast::<u32>(&r.results, "devices")
        .copied()
        .unwrap_or(0);
    if devices & 3 != 3 {
        return Err(fail(format!(
            "Start: the desktop allowed {} only (remote interaction switched off in its dialog?)",
            match devices & 3 {
                0 => "no keyboard and no pointer",
                1 => "the keyboard",
                _ => "the pointer",
            }
        )));
    }
    let (stream, props) = r
        .streams
        .first()
        .ok_or_else(|| fail("Start: the portal shared no monitor".into()))?;
    let stream = *stream;
    let size = crate::common::portal::size_of(props)
        .ok_or_else(|| fail("Start: the portal gave no size".into()))?;
    // (What pairs the stream with its region of the EIS pointer: ScreenCast version 5 on.)
    let mapping = dbus::arg::prop_cast::<String>(props, "mapping_id").cloned();
    // Over EIS where the portal offers it (and it is wanted), else the Notify calls.
    let eis = match (c.via, v >= EIS_VERSION) {
        (PortalVia::Notify, _) => None,
        (PortalVia::Eis, false) => {
            return Err(fail(format!(
                "via = \"eis\": this portal has no ConnectToEIS (RemoteDesktop version {v}; it came with version {EIS_VERSION}, xdg-desktop-portal 1.18)"
            )))
        }
        (via, true) => match connect_eis(&conn, &session) {
            Ok(mut e) => {
                e.mapping = mapping;
                Some(e)
            }
            Err(EisFailed::Call(e)) if via == PortalVia::Auto => {
                tracing::info!(endpoint, bus = %bus, "EIS did not start ({e}): the portal's Notify calls instead");
                None
            }
            Err(EisFailed::Call(e)) => return Err(fail(e)),
            // (The portal refuses Notify calls once EIS was connected.)
            Err(EisFailed::Setup(e)) => {
                return Err(fail(format!(
                    "{e} (set via = \"notify\" to use the portal's Notify calls instead)"
                )))
            }
        },
        (PortalVia::Auto, false) => None,
    };
    tracing::info!(
        endpoint,
        bus = %bus,
        width = size.0,
        height = size.1,
        restored = kept.is_some(),
        via = if eis.is_some() { "EIS" } else { "Notify calls" },
        "remote-desktop session ready (portal)"
    );
    let api = match eis {
        Some(eis) => Api::Eis {
            session,
            eis: Box::new(eis),
        },
        None => Api::Portal { session, stream },
    };
    let reconfigured = crate::common::gnome::watch_monitors(&conn).unwrap_or_default();
    Ok(GnomeInput {
        endpoint,
        bus,
        conn,
        api,
        size: (size.0 as f64, size.1 as f64),
        abs: None,
        at: (0, 0),
        down: HashMap::new(),
        reconfigured,
        progress: Default::default(),
        closed,
        ended: "the desktop session ended, or the remote desktop was stopped at the desktop",
        stale_before: Some((
            crate::common::clock::now_ns(),
            std::time::Instant::now() + STALE_FOR,
        )),
        dropped: 0,
    })
}

//! The `portal-screen` source: a monitor shared through the xdg-desktop-portal's ScreenCast
//! interface (`org.freedesktop.portal.ScreenCast`, version 4 or later), the way desktops let a
//! program see the screen: GNOME (xdg-desktop-portal-gnome), KDE Plasma
//! (xdg-desktop-portal-kde) and wlroots compositors (xdg-desktop-portal-wlr).
//!
//! The first start asks the person at the desktop (its screen-share dialog); the portal then
//! gives a **restore token**, kept in a file (`token_file`), and the next start hands it back:
//! the desktop shares the same monitor again without asking, so a service starts unattended
//! after a reboot. The token each start gives is written over the one before (the
//! specification makes a token serve once; xdg-desktop-portal 1.16 gives the same one again).
//!
//! The portal hands over a PipeWire stream and a connection to PipeWire opened for this
//! session (`OpenPipeWireRemote`); GStreamer's `pipewiresrc` reads the stream through that
//! connection, and the frames go as `gnome-screen`'s do (the tiles that changed,
//! [`super::gnome::run_gnome_screen`]).
//!
//! The portal's calls answer through a `Request` object's `Response` signal (the dialog may
//! take the person minutes): each call here names its request's token, listens on the
//! request's path before calling, and waits for the answer while it processes the bus.

use super::config::PortalScreenConfig;
use super::gnome::{gst_failed, gstreamer_here, spawn_cast, Cast, GnomeScreen, Pipeline, Via};
use crate::common::clock::pacing;
use crate::common::demand::Demand;
use crate::common::error::EndpointError;
use crate::common::gnome::{connect, dbus_text, unavailable, CALL};
use crate::common::portal::{
    check_portal, create_session, options, property, read_token, request, variant, write_token,
    PORTAL, PORTAL_PATH, SCREEN_CAST,
};
use crate::common::report::SourceTask;
use dbus::arg::PropMap;
use ndd_core::Frame;
use std::time::Duration;
use tokio::runtime::Handle;
use tokio::sync::mpsc::Sender;

/// Whether the session's portal offers a ScreenCast that keeps grants, and this machine
/// GStreamer's PipeWire source; without asking anything at the desktop (`ndd check`).
pub(crate) fn probe_portal_screen(
    endpoint: &'static str,
    c: &PortalScreenConfig,
) -> Result<(), EndpointError> {
    let (bus, conn) = connect(endpoint, &c.bus)?;
    check_portal(endpoint, &bus, &conn)?;
    let token_file = c.token_path().ok_or_else(|| no_token_file(endpoint))?;
    token_dir(endpoint, &token_file)?;
    gstreamer_here(endpoint)
}

/// The token file's directory made, or why it cannot be (said before the person is asked,
/// not after they granted what cannot be kept).
fn token_dir(endpoint: &'static str, path: &std::path::Path) -> Result<(), EndpointError> {
    match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) => std::fs::create_dir_all(dir).map_err(|e| EndpointError::Config {
            endpoint,
            param: "token_file",
            reason: format!(
                "cannot make {} to keep the portal's restore token in: {e}",
                dir.display()
            ),
        }),
        None => Ok(()),
    }
}

fn no_token_file(endpoint: &'static str) -> EndpointError {
    EndpointError::Config {
        endpoint,
        param: "token_file",
        reason: "no $XDG_STATE_HOME or $HOME to keep the portal's restore token in: set token_file"
            .into(),
    }
}

/// Opens a screen cast of a monitor through the portal (asking at the desktop unless the kept
/// token still holds) and starts reading it.
pub(crate) fn open_portal_screen(
    endpoint: &'static str,
    c: &PortalScreenConfig,
) -> Result<GnomeScreen, EndpointError> {
    gstreamer_here(endpoint)?;
    let token_file = c.token_path().ok_or_else(|| no_token_file(endpoint))?;
    token_dir(endpoint, &token_file)?;
    let (bus, conn) = connect(endpoint, &c.bus)?;
    check_portal(endpoint, &bus, &conn)?;
    let fail = |what: String| {
        unavailable(
            endpoint,
            &bus,
            what,
            "the desktop's portal did not share a monitor (see its log: journalctl --user -u xdg-desktop-portal)",
        )
    };
    // Session.
    let (session, closed) = create_session(&conn, SCREEN_CAST).map_err(&fail)?;
    // One monitor, the pointer drawn in where the portal can, the grant kept until revoked.
    let (t, mut opts) = options("select");
    opts.insert("types".into(), variant(1u32));
    opts.insert("multiple".into(), variant(false));
    opts.insert("persist_mode".into(), variant(2u32));
    if property(&conn, SCREEN_CAST, "AvailableCursorModes") & 2 != 0 {
        opts.insert("cursor_mode".into(), variant(2u32));
    }
    let kept = read_token(&token_file);
    if let Some(k) = &kept {
        opts.insert("restore_token".into(), variant(k.clone()));
    }
    request(
        &conn,
        SCREEN_CAST,
        "SelectSources",
        (session.clone(), opts),
        &t,
        CALL,
    )
    .map_err(&fail)?;
    // Start: the dialog, unless the kept token holds.
    let (t, opts) = options("start");
    if kept.is_some() {
        tracing::info!(
            endpoint,
            "starting with the grant kept in {}",
            token_file.display()
        );
    } else {
        tracing::info!(
            endpoint,
            bus = %bus,
            "asking at the desktop to share a monitor (its screen-share dialog; once: the grant is kept in {})",
            token_file.display()
        );
    }
    let wait = Duration::try_from_secs_f64(c.grant_wait_s).unwrap_or(CALL);
    let r = request(
        &conn,
        SCREEN_CAST,
        "Start",
        (session.clone(), "", opts),
        &t,
        wait,
    )
    .map_err(&fail)?;
    match dbus::arg::prop_cast::<String>(&r.results, "restore_token") {
        Some(new) => {
            if let Err(e) = write_token(&token_file, new) {
                tracing::warn!(
                    endpoint,
                    "cannot keep the portal's restore token in {}: {e}; the next start asks at the desktop again",
                    token_file.display()
                );
            }
        }
        None => {
            // (A kept token it did not renew is spent: not handed back again.)
            let _ = std::fs::remove_file(&token_file);
            tracing::warn!(
                endpoint,
                "the portal gave no restore token: the next start asks at the desktop again"
            );
        }
    }
    let (node, props) = r
        .streams
        .first()
        .ok_or_else(|| fail("Start: the portal shared no stream".into()))?;
    let node = *node;
    let size = crate::common::portal::size_of(props)
        .ok_or_else(|| fail("Start: the portal gave no size".into()))?;
    let (remote,): (std::os::fd::OwnedFd,) = conn
        .with_proxy(PORTAL, PORTAL_PATH, CALL)
        .method_call(
            SCREEN_CAST,
            "OpenPipeWireRemote",
            (session.clone(), PropMap::new()),
        )
        .map_err(|e| fail(format!("OpenPipeWireRemote: {}", dbus_text(&e))))?;
    let pipeline = Pipeline::start(node, size, "", Some(&remote)).map_err(gst_failed(endpoint))?;
    tracing::info!(
        endpoint,
        bus = %bus,
        node,
        width = size.0,
        height = size.1,
        restored = kept.is_some(),
        "capturing the monitor the portal shares"
    );
    Ok(GnomeScreen {
        bus,
        pipewire: String::new(),
        cast: Cast {
            reconfigured: crate::common::gnome::watch_monitors(&conn).unwrap_or_default(),
            conn,
            session,
            via: Via::Portal { _remote: remote },
            node,
            closed,
        },
        pipeline,
        min_gap: Duration::try_from_secs_f64(1.0 / c.max_fps).unwrap_or(Duration::ZERO),
        refresh: pacing(c.refresh_s),
        ended: "the desktop session ended, or the screen share was stopped at the desktop",
    })
}

/// Starts a `portal-screen` source: it opens the cast in its own thread (the person at the
/// desktop may take minutes to answer the dialog; nothing else of the side waits for that).
pub(crate) fn spawn_portal_screen_source(
    rt: &Handle,
    endpoint: &'static str,
    c: &PortalScreenConfig,
    stream: u16,
    tx: Sender<Frame>,
    demand: Option<Demand>,
) -> Result<SourceTask, EndpointError> {
    let (c, kept) = (c.clone(), c.token_path());
    spawn_cast(
        rt,
        endpoint,
        (stream, tx, demand),
        move || open_portal_screen(endpoint, &c),
        move || kept.as_deref().and_then(read_token).is_some(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_token_is_read_back_and_anything_else_is_not_handed_to_the_portal() {
        let dir = std::env::temp_dir().join(format!("ndd-portal-token-{}", std::process::id()));
        let path = dir.join("state/ndd/portal-screen.token");
        assert_eq!(read_token(&path), None);
        write_token(&path, "c1b7a066-710a-4387-b936-a4a52b7f5e2f").unwrap();
        assert_eq!(
            read_token(&path).as_deref(),
            Some("c1b7a066-710a-4387-b936-a4a52b7f5e2f")
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        for bad in ["", "\n", "two words", "esc\u{1b}[2J", &"x".repeat(300)] {
            std::fs::write(&path, bad).unwrap();
            assert_eq!(read_token(&path), None, "{bad:?}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_token_file_given_is_where_the_token_is_kept() {
        let c = PortalScreenConfig {
            token_file: Some("/x/t".into()),
            ..PortalScreenConfig::default()
        };
        assert_eq!(c.token_path(), Some("/x/t".into()));
    }
}

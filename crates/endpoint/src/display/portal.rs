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
use super::gnome::{gstreamer_here, run_gnome_screen, Cast, GnomeScreen, Pipeline, Via};
use crate::common::clock::pacing;
use crate::common::demand::Demand;
use crate::common::error::EndpointError;
use crate::common::gnome::{connect, dbus_text, unavailable, watch_closed, CALL};
use crate::common::report::SourceTask;
use dbus::arg::{ArgType, PropMap, RefArg, Variant};
use dbus::blocking::Connection;
use dbus::message::MatchRule;
use dbus::Message;
use ndd_core::Frame;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::runtime::Handle;
use tokio::sync::mpsc::Sender;

/// The portal's bus name and object.
pub(super) const PORTAL: &str = "org.freedesktop.portal.Desktop";
const PORTAL_PATH: &str = "/org/freedesktop/portal/desktop";
const SCREEN_CAST: &str = "org.freedesktop.portal.ScreenCast";
const REQUEST: &str = "org.freedesktop.portal.Request";
pub(super) const PORTAL_SESSION: &str = "org.freedesktop.portal.Session";

/// The ScreenCast version that keeps a grant (`persist_mode`, restore tokens).
const PERSIST_VERSION: u32 = 4;

/// What to do when the portal is missing.
const PORTAL_HINT: &str = "install the desktop's portal (GNOME: xdg-desktop-portal and xdg-desktop-portal-gnome; KDE: xdg-desktop-portal-kde; sway, Hyprland: xdg-desktop-portal-wlr) and run ndd inside the session";

/// An answer of the portal: its code (0 granted, 1 declined by the person, 2 otherwise
/// refused), its results, and the streams among them (`Start`'s).
struct Response {
    code: u32,
    results: PropMap,
    streams: Vec<(u32, PropMap)>,
}

/// The streams of a `Response` signal's results (`streams`: `a(ua{sv})`), read as their
/// types say (a `PropMap` holds them as untyped values).
fn streams_of(msg: &Message) -> Vec<(u32, PropMap)> {
    let mut it = msg.iter_init();
    if !it.next() || it.arg_type() != ArgType::Array {
        return Vec::new();
    }
    let Some(mut dict) = it.recurse(ArgType::Array) else {
        return Vec::new();
    };
    loop {
        if let Some(mut entry) = dict.recurse(ArgType::DictEntry) {
            if entry.read::<&str>().ok() == Some("streams") {
                return entry
                    .recurse(ArgType::Variant)
                    .and_then(|mut v| v.get::<Vec<(u32, PropMap)>>())
                    .unwrap_or_default();
            }
        }
        if !dict.next() {
            return Vec::new();
        }
    }
}

/// This connection's request path for `token` (the portal's rule: the sender's unique name
/// without its `:`, dots as underscores).
fn request_path(conn: &Connection, token: &str) -> String {
    let sender = conn.unique_name().trim_start_matches(':').replace('.', "_");
    format!("{PORTAL_PATH}/request/{sender}/{token}")
}

/// A token of this process for a request or session handle.
fn new_token(what: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("ndd_{what}_{}_{n}", std::process::id())
}

/// Calls ScreenCast `method` with `args` (whose options name `token` as their
/// `handle_token`) and waits up to `wait` for its answer.
fn request<A: dbus::arg::AppendAll>(
    conn: &Connection,
    method: &str,
    args: A,
    token: &str,
    wait: Duration,
) -> Result<Response, String> {
    let path = dbus::Path::new(request_path(conn, token)).map_err(|e| e.to_string())?;
    let got: Arc<Mutex<Option<Response>>> = Arc::default();
    let g = Arc::clone(&got);
    let id = conn
        .add_match(
            MatchRule::new_signal(REQUEST, "Response").with_path(path),
            move |(): (), _, msg: &Message| {
                let (code, results) = msg.read2::<u32, PropMap>().unwrap_or((2, PropMap::new()));
                let streams = streams_of(msg);
                *g.lock().unwrap_or_else(|p| p.into_inner()) = Some(Response {
                    code,
                    results,
                    streams,
                });
                true
            },
        )
        .map_err(|e| dbus_text(&e))?;
    let called = conn
        .with_proxy(PORTAL, PORTAL_PATH, CALL)
        .method_call::<(dbus::Path<'static>,), _, _, _>(SCREEN_CAST, method, args)
        .map_err(|e| format!("{method}: {}", dbus_text(&e)));
    let t0 = Instant::now();
    let r = called.and_then(|_| loop {
        if let Some(r) = got.lock().unwrap_or_else(|p| p.into_inner()).take() {
            break Ok(r);
        }
        if t0.elapsed() > wait {
            break Err(format!(
                "{method}: no answer from the portal within {} s",
                wait.as_secs()
            ));
        }
        if let Err(e) = conn.process(Duration::from_millis(100)) {
            break Err(format!("{method}: {}", dbus_text(&e)));
        }
    });
    let _ = conn.remove_match(id);
    let r = r?;
    match r.code {
        0 => Ok(r),
        1 => Err(format!(
            "{method}: the screen share was declined at the desktop"
        )),
        n => Err(format!("{method}: the portal refused it (response {n})")),
    }
}

fn variant<T: RefArg + 'static>(v: T) -> Variant<Box<dyn RefArg>> {
    Variant(Box::new(v))
}

/// The ScreenCast interface's version on this bus (`None`: no portal answers).
fn screen_cast_version(conn: &Connection) -> Result<u32, dbus::Error> {
    use dbus::blocking::stdintf::org_freedesktop_dbus::Properties;
    conn.with_proxy(PORTAL, PORTAL_PATH, CALL)
        .get::<u32>(SCREEN_CAST, "version")
}

/// Says what is wrong with the portal on `bus`, if anything: missing, or too old to keep a
/// grant.
fn check_portal(endpoint: &'static str, bus: &str, conn: &Connection) -> Result<(), EndpointError> {
    match screen_cast_version(conn) {
        Ok(v) if v >= PERSIST_VERSION => Ok(()),
        Ok(v) => Err(unavailable(
            endpoint,
            bus,
            format!("the xdg-desktop-portal's ScreenCast is version {v}: it keeps no grant (restore tokens came with version {PERSIST_VERSION}), so every start would ask at the desktop"),
            "update xdg-desktop-portal (1.12 or later) and the desktop's portal backend",
        )),
        Err(e) => Err(unavailable(
            endpoint,
            bus,
            format!(
                "no xdg-desktop-portal ScreenCast on this bus ({})",
                dbus_text(&e)
            ),
            PORTAL_HINT,
        )),
    }
}

/// Whether the session's portal offers a ScreenCast that keeps grants, and this machine
/// GStreamer's PipeWire source; without asking anything at the desktop (`ndd check`).
pub(crate) fn probe_portal_screen(
    endpoint: &'static str,
    c: &PortalScreenConfig,
) -> Result<(), EndpointError> {
    let (bus, conn) = connect(endpoint, &c.bus)?;
    check_portal(endpoint, &bus, &conn)?;
    if c.token_path().is_none() {
        return Err(no_token_file(endpoint));
    }
    gstreamer_here(endpoint)
}

fn no_token_file(endpoint: &'static str) -> EndpointError {
    EndpointError::Config {
        endpoint,
        param: "token_file",
        reason: "no $XDG_STATE_HOME or $HOME to keep the portal's restore token in: set token_file"
            .into(),
    }
}

/// The token kept at `path`, if there is one.
fn read_token(path: &Path) -> Option<String> {
    let t = std::fs::read_to_string(path).ok()?;
    let t = t.trim();
    // (A token is the portal's: printable, short. Anything else is not handed back.)
    (!t.is_empty() && t.len() <= 256 && t.chars().all(|c| c.is_ascii_graphic()))
        .then(|| t.to_string())
}

/// Keeps `token` at `path` (its directory made, readable by this user only; written aside
/// and renamed, so a crash leaves the old token or the new one).
fn write_token(path: &Path, token: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let aside = path.with_extension("token-new");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&aside)?;
    f.write_all(token.as_bytes())?;
    f.write_all(b"\n")?;
    f.sync_all()?;
    std::fs::rename(&aside, path)
}

/// The `size` of a stream's properties (`(ii)`).
fn size_of(props: &PropMap) -> Option<(usize, usize)> {
    let mut it = props.get("size")?.0.as_iter()?;
    let w = it.next()?.as_i64()?;
    let h = it.next()?.as_i64()?;
    (w > 0 && h > 0 && w <= 16384 && h <= 16384).then_some((w as usize, h as usize))
}

/// Opens a screen cast of a monitor through the portal (asking at the desktop unless the kept
/// token still holds) and starts reading it.
pub(crate) fn open_portal_screen(
    endpoint: &'static str,
    c: &PortalScreenConfig,
) -> Result<GnomeScreen, EndpointError> {
    gstreamer_here(endpoint)?;
    let token_file = c.token_path().ok_or_else(|| no_token_file(endpoint))?;
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
    let t = new_token("create");
    let mut opts = PropMap::new();
    opts.insert("handle_token".into(), variant(t.clone()));
    opts.insert("session_handle_token".into(), variant(new_token("session")));
    let r = request(&conn, "CreateSession", (opts,), &t, CALL).map_err(&fail)?;
    let session: String = dbus::arg::prop_cast::<String>(&r.results, "session_handle")
        .cloned()
        .ok_or_else(|| fail("CreateSession: the portal gave no session".into()))?;
    let session = dbus::Path::new(session).map_err(|e| fail(format!("CreateSession: {e}")))?;
    let closed = watch_closed(&conn, PORTAL_SESSION, &session).map_err(|e| fail(dbus_text(&e)))?;
    // One monitor, the pointer drawn in where the portal can, the grant kept until revoked.
    let t = new_token("select");
    let mut opts = PropMap::new();
    opts.insert("handle_token".into(), variant(t.clone()));
    opts.insert("types".into(), variant(1u32));
    opts.insert("multiple".into(), variant(false));
    opts.insert("persist_mode".into(), variant(2u32));
    let cursors = {
        use dbus::blocking::stdintf::org_freedesktop_dbus::Properties;
        conn.with_proxy(PORTAL, PORTAL_PATH, CALL)
            .get::<u32>(SCREEN_CAST, "AvailableCursorModes")
            .unwrap_or(0)
    };
    if cursors & 2 != 0 {
        opts.insert("cursor_mode".into(), variant(2u32));
    }
    let kept = read_token(&token_file);
    if let Some(k) = &kept {
        opts.insert("restore_token".into(), variant(k.clone()));
    }
    request(&conn, "SelectSources", (session.clone(), opts), &t, CALL).map_err(&fail)?;
    // Start: the dialog, unless the kept token holds.
    let t = new_token("start");
    let mut opts = PropMap::new();
    opts.insert("handle_token".into(), variant(t.clone()));
    if kept.is_none() {
        tracing::info!(
            endpoint,
            bus = %bus,
            "asking at the desktop to share a monitor (its screen-share dialog; once: the grant is kept in {})",
            token_file.display()
        );
    }
    let wait = Duration::try_from_secs_f64(c.grant_wait_s).unwrap_or(CALL);
    let r = request(&conn, "Start", (session.clone(), "", opts), &t, wait).map_err(&fail)?;
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
        None => tracing::warn!(
            endpoint,
            "the portal gave no restore token: the next start asks at the desktop again"
        ),
    }
    let (node, props) = r
        .streams
        .first()
        .ok_or_else(|| fail("Start: the portal shared no stream".into()))?;
    let node = *node;
    let size = size_of(props).ok_or_else(|| fail("Start: the portal gave no size".into()))?;
    let (remote,): (std::os::fd::OwnedFd,) = conn
        .with_proxy(PORTAL, PORTAL_PATH, CALL)
        .method_call(
            SCREEN_CAST,
            "OpenPipeWireRemote",
            (session.clone(), PropMap::new()),
        )
        .map_err(|e| fail(format!("OpenPipeWireRemote: {}", dbus_text(&e))))?;
    let pipeline = Pipeline::start(node, size, "", Some(&remote)).map_err(|e| {
        unavailable(
            endpoint,
            "GStreamer",
            format!("cannot start gst-launch-1.0: {e}"),
            "apt-get install gstreamer1.0-tools gstreamer1.0-pipewire gstreamer1.0-plugins-base",
        )
    })?;
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
    gstreamer_here(endpoint)?;
    let c = c.clone();
    Ok(rt.spawn_blocking(move || {
        let s = open_portal_screen(endpoint, &c)?;
        run_gnome_screen(endpoint, s, stream, tx, demand)
    }))
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

    #[test]
    fn a_size_is_two_positive_integers() {
        let mut p = PropMap::new();
        assert_eq!(size_of(&p), None);
        let pair: Box<dyn RefArg> = Box::new((800i32, 600i32));
        p.insert("size".into(), Variant(pair));
        assert_eq!(size_of(&p), Some((800, 600)));
        let pair: Box<dyn RefArg> = Box::new((0i32, 600i32));
        p.insert("size".into(), Variant(pair));
        assert_eq!(size_of(&p), None);
    }
}

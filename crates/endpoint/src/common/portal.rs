//! What the portal endpoints share (`portal-screen`, `portal-input`): calls to the
//! xdg-desktop-portal on the session bus, whose answers come through a `Request` object's
//! `Response` signal (a dialog may take the person minutes), and the restore token kept in a
//! file between starts.

use crate::common::error::EndpointError;
use crate::common::gnome::{dbus_text, unavailable, CALL};
use dbus::arg::{ArgType, PropMap, RefArg, Variant};
use dbus::blocking::Connection;
use dbus::message::MatchRule;
use dbus::Message;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The portal's bus name and object.
pub(crate) const PORTAL: &str = "org.freedesktop.portal.Desktop";
pub(crate) const PORTAL_PATH: &str = "/org/freedesktop/portal/desktop";
pub(crate) const SCREEN_CAST: &str = "org.freedesktop.portal.ScreenCast";
const REQUEST: &str = "org.freedesktop.portal.Request";
pub(crate) const PORTAL_SESSION: &str = "org.freedesktop.portal.Session";

/// The portal's RemoteDesktop interface.
pub(crate) const REMOTE_DESKTOP: &str = "org.freedesktop.portal.RemoteDesktop";

/// The ScreenCast version that keeps a grant (`persist_mode`, restore tokens).
pub(crate) const PERSIST_VERSION: u32 = 4;

/// What to do when the portal is missing.
pub(crate) const PORTAL_HINT: &str = "install the desktop's portal (GNOME: xdg-desktop-portal and xdg-desktop-portal-gnome; KDE: xdg-desktop-portal-kde; sway, Hyprland: xdg-desktop-portal-wlr) and run ndd inside the session";

/// An answer of the portal: its code (0 granted, 1 declined by the person, 2 otherwise
/// refused), its results, and the streams among them (`Start`'s).
pub(crate) struct Response {
    code: u32,
    pub(crate) results: PropMap,
    pub(crate) streams: Vec<(u32, PropMap)>,
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
pub(crate) fn new_token(what: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("ndd_{what}_{}_{n}", std::process::id())
}

/// How long a portal call waits before it says it waits for the desktop.
const SAY_WAITING: Duration = Duration::from_secs(3);

/// Calls `method` of the portal's interface `iface` with `args` (whose options name `token`
/// as their `handle_token`) and waits up to `wait` for its answer.
pub(crate) fn request<A: dbus::arg::AppendAll>(
    conn: &Connection,
    iface: &str,
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
            // (From the portal only: anyone on the bus may send a signal.)
            MatchRule::new_signal(REQUEST, "Response")
                .with_path(path)
                .with_sender(PORTAL),
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
        .method_call::<(dbus::Path<'static>,), _, _, _>(iface, method, args)
        .map_err(|e| format!("{method}: {}", dbus_text(&e)));
    let t0 = Instant::now();
    let mut said = false;
    let r = called.and_then(|_| loop {
        if let Some(r) = got.lock().unwrap_or_else(|p| p.into_inner()).take() {
            break Ok(r);
        }
        // A wait the person must end (a dialog; a kept grant the desktop no longer takes):
        // said, not silent.
        if !said && t0.elapsed() > SAY_WAITING {
            said = true;
            tracing::info!(
                "{method}: waiting for the desktop (its dialog may be up), at most {} s",
                wait.as_secs()
            );
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
        1 => Err(format!("{method}: {}", super::DECLINED_AT_THE_DESKTOP)),
        n => Err(format!("{method}: the portal refused it (response {n})")),
    }
}

/// A call's options naming a new request token (returned with them) as their
/// `handle_token`.
pub(crate) fn options(what: &str) -> (String, PropMap) {
    let t = new_token(what);
    let mut opts = PropMap::new();
    opts.insert("handle_token".into(), variant(t.clone()));
    (t, opts)
}

/// A new session of the portal's interface `iface` (ScreenCast, RemoteDesktop), and a flag
/// set when the portal closes it (seen as the connection is processed).
pub(crate) fn create_session(
    conn: &Connection,
    iface: &str,
) -> Result<
    (
        dbus::Path<'static>,
        std::sync::Arc<std::sync::atomic::AtomicBool>,
    ),
    String,
> {
    let (t, mut opts) = options("create");
    opts.insert("session_handle_token".into(), variant(new_token("session")));
    let r = request(conn, iface, "CreateSession", (opts,), &t, CALL)?;
    let session: String = dbus::arg::prop_cast::<String>(&r.results, "session_handle")
        .cloned()
        .ok_or("CreateSession: the portal gave no session")?;
    let session = dbus::Path::new(session)
        .map_err(|_| "CreateSession: the portal's session handle is no object path".to_string())?;
    let closed = crate::common::gnome::watch_closed(conn, PORTAL_SESSION, &session)
        .map_err(|e| dbus_text(&e))?;
    Ok((session, closed))
}

pub(crate) fn variant<T: RefArg + 'static>(v: T) -> Variant<Box<dyn RefArg>> {
    Variant(Box::new(v))
}

/// The version of the portal's interface `iface` on this bus.
pub(crate) fn version(conn: &Connection, iface: &str) -> Result<u32, dbus::Error> {
    use dbus::blocking::stdintf::org_freedesktop_dbus::Properties;
    conn.with_proxy(PORTAL, PORTAL_PATH, CALL)
        .get::<u32>(iface, "version")
}

/// A `u32` property of the portal's interface `iface` (0 when it has none).
pub(crate) fn property(conn: &Connection, iface: &str, name: &str) -> u32 {
    use dbus::blocking::stdintf::org_freedesktop_dbus::Properties;
    conn.with_proxy(PORTAL, PORTAL_PATH, CALL)
        .get::<u32>(iface, name)
        .unwrap_or(0)
}

/// The portal on `bus` says version 0 of `iface`: no backend of this desktop implements it
/// (not installed, or not started yet: right after login it may still be starting).
pub(crate) fn no_backend(endpoint: &'static str, bus: &str, iface: &str) -> EndpointError {
    unavailable(
        endpoint,
        bus,
        format!("the xdg-desktop-portal offers {iface} at version 0: no backend of this desktop implements it, or it has not started yet"),
        "install and start the desktop's portal backend (Debian: xdg-desktop-portal-gnome, -kde or -wlr); right after login, start ndd again once the desktop is up",
    )
}

/// Says what is wrong with the portal on `bus`, if anything: missing, without a backend, or
/// too old to keep a grant.
pub(crate) fn check_portal(
    endpoint: &'static str,
    bus: &str,
    conn: &Connection,
) -> Result<(), EndpointError> {
    match version(conn, SCREEN_CAST) {
        Ok(v) if v >= PERSIST_VERSION => Ok(()),
        Ok(0) => Err(no_backend(endpoint, bus, SCREEN_CAST)),
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

/// The token kept at `path`, if there is one.
pub(crate) fn read_token(path: &Path) -> Option<String> {
    let t = std::fs::read_to_string(path).ok()?;
    let t = t.trim();
    // (A token is the portal's: printable, short. Anything else is not handed back.)
    (!t.is_empty() && t.len() <= 256 && t.chars().all(|c| c.is_ascii_graphic()))
        .then(|| t.to_string())
}

/// Keeps `token` at `path` (its directory made, readable by this user only; written aside
/// and renamed, so a crash leaves the old token or the new one).
pub(crate) fn write_token(path: &Path, token: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    // (Aside under a name of this process's own, made afresh, never through a link.)
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let aside = path.with_file_name(format!(
        ".{}.{}",
        name.unwrap_or_default(),
        new_token("new")
    ));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .mode(0o600)
        .open(&aside)?;
    f.write_all(token.as_bytes())?;
    f.write_all(b"\n")?;
    f.sync_all()?;
    std::fs::rename(&aside, path)
}

/// The `size` of a stream's properties (`(ii)`).
pub(crate) fn size_of(props: &PropMap) -> Option<(usize, usize)> {
    let mut it = props.get("size")?.0.as_iter()?;
    let w = it.next()?.as_i64()?;
    let h = it.next()?.as_i64()?;
    (w > 0 && h > 0 && w <= 16384 && h <= 16384).then_some((w as usize, h as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

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

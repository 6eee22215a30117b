//! What the Wayland endpoints share: finding a compositor's socket ([`socket_path`]) and
//! connecting to it ([`wayland_connect`]) with errors that say what to do.

use super::error::EndpointError;
use super::report::Offered;
use std::path::PathBuf;
use std::time::Duration;
use wayland_client::Connection;

/// The socket of `display`: a path as given, else a name in `$XDG_RUNTIME_DIR` (or
/// `$WAYLAND_DISPLAY` when `display` is empty).
pub(crate) fn socket_path(display: &str) -> Result<PathBuf, String> {
    let name = if display.is_empty() {
        std::env::var("WAYLAND_DISPLAY")
            .map_err(|_| "no display given and WAYLAND_DISPLAY is not set".to_string())?
    } else {
        display.to_string()
    };
    let p = PathBuf::from(&name);
    if p.is_absolute() {
        return Ok(p);
    }
    let dir = std::env::var_os("XDG_RUNTIME_DIR").ok_or_else(|| {
        format!("XDG_RUNTIME_DIR is not set, so the Wayland display {name:?} cannot be found (give its socket's full path)")
    })?;
    Ok(PathBuf::from(dir).join(name))
}

/// An error about Wayland display `display`.
pub(crate) fn unavailable(
    endpoint: &'static str,
    display: &str,
    what: String,
    hint: &str,
) -> EndpointError {
    EndpointError::Unavailable {
        endpoint,
        what: format!("Wayland display {display:?}: {what}"),
        hint: hint.to_string(),
    }
}

/// Connects to the compositor of `display`.
pub(crate) fn wayland_connect(
    endpoint: &'static str,
    display: &str,
) -> Result<Connection, EndpointError> {
    let path = socket_path(display).map_err(|e| {
        unavailable(
            endpoint,
            display,
            e,
            "set display to the compositor's socket (wayland-1, or a full path)",
        )
    })?;
    let stream = std::os::unix::net::UnixStream::connect(&path).map_err(|e| {
        unavailable(
            endpoint,
            display,
            format!("cannot connect to {}: {e}", path.display()),
            "is the compositor running, and is this its socket? (`ls $XDG_RUNTIME_DIR`)",
        )
    })?;
    Connection::from_socket(stream).map_err(|e| {
        unavailable(
            endpoint,
            display,
            e.to_string(),
            "not a Wayland compositor's socket",
        )
    })
}

/// Whether `fd` becomes readable within `wait` (at most a second); an interrupted wait is
/// `false`.
pub(crate) fn readable(fd: std::os::fd::BorrowedFd<'_>, wait: Duration) -> std::io::Result<bool> {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    let t = Timespec {
        tv_sec: 0,
        tv_nsec: wait.min(Duration::from_millis(999)).as_nanos() as _,
    };
    match poll(&mut fds, Some(&t)) {
        Ok(n) => Ok(n > 0),
        Err(rustix::io::Errno::INTR) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Sends what is queued, reads what the compositor sent (waiting at most `wait` for it) and
/// dispatches it: the one loop step of every Wayland endpoint.
pub(crate) fn pump<D>(
    queue: &mut wayland_client::EventQueue<D>,
    state: &mut D,
    wait: Duration,
) -> Result<(), String> {
    queue.dispatch_pending(state).map_err(|e| e.to_string())?;
    queue.flush().map_err(|e| e.to_string())?;
    if let Some(guard) = queue.prepare_read() {
        // Nothing readable in time: dropping the guard cancels the read.
        if readable(guard.connection_fd(), wait).map_err(|e| e.to_string())? {
            match guard.read() {
                Ok(_) => {}
                Err(wayland_client::backend::WaylandError::Io(e))
                    if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e.to_string()),
            }
        }
    }
    queue.dispatch_pending(state).map_err(|e| e.to_string())?;
    Ok(())
}

/// Implements `Dispatch` for an endpoint's state: the registry (its globals listed once) and
/// each object type whose events the endpoint ignores.
macro_rules! ignore_events {
    ($state:ty; $($t:ty),* $(,)?) => {
        impl wayland_client::Dispatch<
            wayland_client::protocol::wl_registry::WlRegistry,
            wayland_client::globals::GlobalListContents,
        > for $state {
            fn event(
                _: &mut $state,
                _: &wayland_client::protocol::wl_registry::WlRegistry,
                _: wayland_client::protocol::wl_registry::Event,
                _: &wayland_client::globals::GlobalListContents,
                _: &wayland_client::Connection,
                _: &wayland_client::QueueHandle<$state>,
            ) {
            }
        }
        $(
            impl wayland_client::Dispatch<$t, ()> for $state {
                fn event(
                    _: &mut $state,
                    _: &$t,
                    _: <$t as wayland_client::Proxy>::Event,
                    _: &(),
                    _: &wayland_client::Connection,
                    _: &wayland_client::QueueHandle<$state>,
                ) {
                }
            }
        )*
    };
}
pub(crate) use ignore_events;

/// The xkb keymap in the file `fd` of `size` bytes a compositor handed over (Wayland's
/// `wl_keyboard.keymap`, EIS's `ei_keyboard.keymap`), read where it is: from its start, not
/// the fd's offset (a compositor may share one file among its clients), at most 4 MiB.
/// `None` when it cannot be read.
pub(crate) fn read_keymap(fd: std::os::fd::OwnedFd, size: u32) -> Option<String> {
    let file = std::fs::File::from(fd);
    let mut text = vec![0u8; (size as usize).min(4 << 20)];
    std::os::unix::fs::FileExt::read_exact_at(&file, &mut text, 0).ok()?;
    Some(
        String::from_utf8_lossy(&text)
            .trim_end_matches('\0')
            .to_string(),
    )
}

/// A memfd holding `bytes` (shared with the compositor: keymaps, pixel buffers).
pub(crate) fn memfd(name: &str, len: usize) -> std::io::Result<std::fs::File> {
    let fd = rustix::fs::memfd_create(name, rustix::fs::MemfdFlags::CLOEXEC)?;
    let file = std::fs::File::from(fd);
    file.set_len(len as u64)?;
    Ok(file)
}

/// KDE's protocols wlroots compositors offer too (sway 1.7 both, sway 1.12 the first): no
/// sign of KWin.
const KDE_ON_WLROOTS: [&str; 2] = [
    "org_kde_kwin_server_decoration_manager",
    "org_kde_kwin_idle",
];

/// What a session's compositor offers ndd, by the Wayland globals it lists: each endpoint
/// kind with the protocol it needs, whether the compositor has it and, for those that take
/// either of two, which they take here (`ndd check --side`).
pub fn wayland_session(display: &str) -> Result<Vec<Offered>, String> {
    use wayland_client::globals::registry_queue_init;
    struct S;
    ignore_events!(S;);
    // (Said without an endpoint's name: `ndd check` and the one-line shares say whose.)
    let conn = wayland_connect("ndd check", display).map_err(|e| match e {
        EndpointError::Unavailable { what, hint, .. } => format!("{what}; {hint}"),
        e => e.to_string(),
    })?;
    let (globals, _queue) = registry_queue_init::<S>(&conn).map_err(|e| e.to_string())?;
    let names: Vec<String> = globals
        .contents()
        .clone_list()
        .into_iter()
        .map(|g| g.interface)
        .collect();
    let has = |n: &str| names.iter().any(|g| g == n);
    let one = |what, needs: &str| Offered {
        what,
        needs: needs.to_string(),
        ok: has(needs),
        via: None,
    };
    // The ext protocol where all its globals are offered, else wlr's (as the endpoints
    // choose by default); with neither, the globals missing of both are named.
    let either = |what, ext: &[&'static str], ext_name, (wlr, wlr_name): (&str, _)| {
        if ext.iter().all(|n| has(n)) {
            Offered {
                what,
                needs: ext.join(" and "),
                ok: true,
                via: Some(ext_name),
            }
        } else if has(wlr) {
            Offered {
                via: Some(wlr_name),
                ..one(what, wlr)
            }
        } else {
            let missing: Vec<&str> = ext
                .iter()
                .copied()
                .filter(|n| !has(n))
                .chain([wlr])
                .collect();
            Offered {
                needs: missing.join(" and "),
                ..one(what, wlr)
            }
        }
    };
    let mut offer = vec![
        either(
            "wayland-screen",
            &[
                "ext_image_copy_capture_manager_v1",
                "ext_output_image_capture_source_manager_v1",
            ],
            "ext-image-copy-capture",
            ("zwlr_screencopy_manager_v1", "wlr-screencopy"),
        ),
        one("wayland-input (keys)", "zwp_virtual_keyboard_manager_v1"),
        one("wayland-input (pointer)", "zwlr_virtual_pointer_manager_v1"),
        either(
            "wayland-clipboard",
            &["ext_data_control_manager_v1"],
            "ext-data-control",
            ("zwlr_data_control_manager_v1", "wlr-data-control"),
        ),
        one("wayland-window", "xdg_wm_base"),
    ];
    // KDE Plasma's KWin: its own input protocol, offered only to programs a .desktop file
    // lists (docs/devices.md).
    if names
        .iter()
        .filter(|g| !KDE_ON_WLROOTS.contains(&g.as_str()))
        .any(|g| g.starts_with("org_kde_") || g.starts_with("kde_"))
    {
        offer.push(Offered {
            needs: "org_kde_kwin_fake_input, for this program,".into(),
            ..one("kde-input", "org_kde_kwin_fake_input")
        });
    }
    Ok(offer)
}

#[cfg(test)]
mod tests {
    use super::socket_path;

    #[test]
    fn a_display_is_a_socket_path_or_a_name_in_the_runtime_dir() {
        assert_eq!(
            socket_path("/run/user/5/wayland-9").unwrap(),
            std::path::PathBuf::from("/run/user/5/wayland-9")
        );
        if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR") {
            assert_eq!(
                socket_path("wayland-1").unwrap(),
                std::path::PathBuf::from(dir).join("wayland-1")
            );
        }
    }
}

//! What the X11 endpoints of the `input` and `display` classes share: connecting to a display
//! ([`x11_connect`]) and its errors ([`x11_err`]), the default `display` parameter, and
//! waiting (at most a second) for a blocking task's descriptor to become readable
//! ([`wait_readable_for`]).

use super::error::EndpointError;
use std::os::fd::AsFd;
use std::time::Duration;
use x11rb::rust_connection::RustConnection;

pub(crate) fn default_display() -> String {
    ":0".to_string()
}

/// Waits until `fd` is readable or `timeout` (at most one second) passes.
pub(crate) fn wait_readable_for(fd: impl AsFd, timeout: Duration) -> std::io::Result<()> {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    let timeout = Timespec {
        tv_sec: 0,
        tv_nsec: timeout.min(Duration::from_millis(999)).as_nanos() as _,
    };
    match poll(&mut fds, Some(&timeout)) {
        Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Connects to `display`. An X server whose last client just left resets (a bare `Xvfb`
/// started without `-noreset` does, after ndd's own start-up probe): a connection made during
/// the reset is cut before the setup completes. Such a cut is tried again for about 300 ms.
pub(crate) fn x11_connect(
    endpoint: &'static str,
    display: &str,
) -> Result<(RustConnection, usize), EndpointError> {
    use std::io::ErrorKind::{BrokenPipe, ConnectionReset, UnexpectedEof};
    use x11rb::errors::ConnectError;
    let mut wait = Duration::from_millis(10);
    loop {
        match RustConnection::connect(Some(display)) {
            Ok(c) => return Ok(c),
            Err(ConnectError::IoError(e))
                if wait <= Duration::from_millis(160)
                    && matches!(e.kind(), ConnectionReset | UnexpectedEof | BrokenPipe) =>
            {
                let server: &str = display;
                tracing::debug!(endpoint, server, error = %e, "X server resetting; connecting again");
                std::thread::sleep(wait);
                wait *= 2;
            }
            Err(e) => {
                return Err(EndpointError::Unavailable {
                    endpoint,
                    what: format!("cannot connect to X display {display}: {e}"),
                    hint: "is the X server running, and may this user connect (DISPLAY, XAUTHORITY, xhost)?"
                        .to_string(),
                })
            }
        }
    }
}

pub(crate) fn x11_err(
    endpoint: &'static str,
    display: &str,
    e: impl std::fmt::Display,
) -> EndpointError {
    EndpointError::Unavailable {
        endpoint,
        what: format!("X display {display}: {e}"),
        hint: "the X server closed the connection or refused a request".to_string(),
    }
}

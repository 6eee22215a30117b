//! The devices of the `serial` class: opening a tty raw with its line settings, creating a
//! pty and symlinking its slave, and sharing each between the source and the sink of one
//! path (or link); converting between termios and [`LineSettings`], and modem-line bits; and
//! the non-blocking reads and writes both tasks use.
//!
//! Both streams of a driver name the same path (or link): the two endpoints share one open
//! file through a process-wide registry keyed by path, reference-counted ([`Arc`]); the file
//! is closed (and the pty's symlink removed) when the last of them is done.
//!
//! Reads and writes are non-blocking through [`AsyncFd`]; after `EAGAIN` a task waits for
//! readiness for at most [`SETTINGS_POLL`] and then simply retries, so a missed wake-up costs
//! latency, never a hang.

use super::config::{PtyConfig, SerialConfig};
use super::hold;
use super::record::{Flow, LineSettings, ModemLines, Parity};
use crate::common::error::EndpointError;
use crate::sys;
use rustix::fs::OFlags;
use rustix::io::Errno;
use rustix::termios::{ControlModes, InputModes, OptionalActions, Termios};
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;
use tokio::io::unix::AsyncFd;

/// How often the pty's termios and the tty's modem lines are polled, and the longest wait
/// for readiness before a read or write is simply retried.
pub const SETTINGS_POLL: Duration = Duration::from_millis(50);

// ---------------------------------------------------------------------------------------
// termios <-> LineSettings

/// Puts `t` in raw mode (`cfmakeraw`) with `s`, receiver on, modem control lines ignored
/// for opening and reading (`CLOCAL`).
pub(crate) fn make_raw_with(t: &mut Termios, s: &LineSettings) -> io::Result<()> {
    t.make_raw();
    apply_settings(t, s)
}

/// Changes baud, size, parity, stop bits and flow control of `t`, leaving the rest.
pub(crate) fn apply_settings(t: &mut Termios, s: &LineSettings) -> io::Result<()> {
    t.set_speed(s.baud)?;
    let cm = &mut t.control_modes;
    cm.remove(
        ControlModes::CSIZE
            | ControlModes::PARENB
            | ControlModes::PARODD
            | ControlModes::CMSPAR
            | ControlModes::CSTOPB
            | ControlModes::CRTSCTS,
    );
    cm.insert(match s.data_bits {
        5 => ControlModes::CS5,
        6 => ControlModes::CS6,
        7 => ControlModes::CS7,
        _ => ControlModes::CS8,
    });
    cm.insert(match s.parity {
        Parity::None => ControlModes::empty(),
        Parity::Odd => ControlModes::PARENB | ControlModes::PARODD,
        Parity::Even => ControlModes::PARENB,
        Parity::Mark => ControlModes::PARENB | ControlModes::CMSPAR | ControlModes::PARODD,
        Parity::Space => ControlModes::PARENB | ControlModes::CMSPAR,
    });
    if s.stop_bits == 2 {
        cm.insert(ControlModes::CSTOPB);
    }
    cm.insert(ControlModes::CREAD | ControlModes::CLOCAL);
    t.input_modes
        .remove(InputModes::IXON | InputModes::IXOFF | InputModes::IXANY);
    match s.flow {
        Flow::None => {}
        Flow::Rtscts => t.control_modes.insert(ControlModes::CRTSCTS),
        Flow::Xonxoff => t.input_modes.insert(InputModes::IXON | InputModes::IXOFF),
    }
    Ok(())
}

/// The line settings `t` describes (baud is the output speed).
pub(crate) fn read_settings(t: &Termios) -> LineSettings {
    let cm = t.control_modes;
    let size = cm & ControlModes::CSIZE;
    let data_bits = if size == ControlModes::CS5 {
        5
    } else if size == ControlModes::CS6 {
        6
    } else if size == ControlModes::CS7 {
        7
    } else {
        8
    };
    let parity = if !cm.contains(ControlModes::PARENB) {
        Parity::None
    } else {
        match (
            cm.contains(ControlModes::CMSPAR),
            cm.contains(ControlModes::PARODD),
        ) {
            (false, true) => Parity::Odd,
            (false, false) => Parity::Even,
            (true, true) => Parity::Mark,
            (true, false) => Parity::Space,
        }
    };
    let flow = if cm.contains(ControlModes::CRTSCTS) {
        Flow::Rtscts
    } else if t
        .input_modes
        .intersects(InputModes::IXON | InputModes::IXOFF)
    {
        Flow::Xonxoff
    } else {
        Flow::None
    };
    LineSettings {
        baud: t.output_speed(),
        data_bits,
        parity,
        stop_bits: if cm.contains(ControlModes::CSTOPB) {
            2
        } else {
            1
        },
        flow,
    }
}

pub(super) fn tiocm_to_lines(bits: libc::c_int) -> ModemLines {
    let mut state = 0;
    for (tiocm, bit) in [
        (libc::TIOCM_CTS, ModemLines::CTS),
        (libc::TIOCM_DSR, ModemLines::DSR),
        (libc::TIOCM_CAR, ModemLines::DCD),
        (libc::TIOCM_RNG, ModemLines::RI),
    ] {
        if bits & tiocm != 0 {
            state |= bit;
        }
    }
    ModemLines {
        valid: ModemLines::CTS | ModemLines::DSR | ModemLines::DCD | ModemLines::RI,
        state,
    }
}

// ---------------------------------------------------------------------------------------
// The shared files

/// An open tty, shared by the `serial` source and sink of one path.
#[derive(Debug)]
pub(crate) struct Tty {
    pub(super) fd: AsyncFd<OwnedFd>,
    pub(super) path: PathBuf,
    opened_with: LineSettings,
}

impl Tty {
    /// A tty over any descriptor: a test's pipe, which refuses every terminal request.
    #[cfg(test)]
    pub(super) fn over(fd: OwnedFd, path: PathBuf) -> Tty {
        Tty {
            fd: sys::async_fd(fd).expect("a descriptor epoll takes"),
            path,
            opened_with: LineSettings::default(),
        }
    }
}

/// A pty master plus our own slave fd and the symlink at `link`, shared by the `pty` source
/// and sink of one link.
#[derive(Debug)]
pub(crate) struct Pty {
    pub(super) master: AsyncFd<OwnedFd>,
    pub(super) slave: OwnedFd,
    slave_path: PathBuf,
    pub(super) link: PathBuf,
    opened_with: LineSettings,
    /// [`Pty::seen`] right after creation: the device tty starts with these.
    pub(super) baseline: LineSettings,
    /// This side's claim on the holder that keeps the pty for its next run (`keep_s`); the
    /// holder removes the link when it lets go.
    claim: Option<hold::Claim>,
    /// A kept pty: the last device frame written into it, across runs of this side.
    pub(super) mark: Option<hold::Mark>,
}

impl Pty {
    /// A pty of `c.link` opened with `want`; its baseline is what its slave says now. A kept
    /// one (with a claim) has its mark: `fresh` for a new pty.
    fn new(
        master: AsyncFd<OwnedFd>,
        slave: OwnedFd,
        slave_path: PathBuf,
        c: &PtyConfig,
        want: LineSettings,
        claim: Option<hold::Claim>,
        fresh: bool,
    ) -> Pty {
        let mark = claim
            .as_ref()
            .and_then(|k| hold::Mark::open(&k.socket, fresh).ok());
        let mut pty = Pty {
            master,
            slave,
            slave_path,
            link: c.link.clone(),
            opened_with: want,
            baseline: want,
            claim,
            mark,
        };
        if let Ok(t) = rustix::termios::tcgetattr(&pty.slave) {
            pty.baseline = pty.seen(&t);
        }
        pty
    }

    /// The settings the app has set on the pty. A Linux pty forces `CS8` and clears `PARENB`
    /// on every `tcsetattr`, so data bits and parity cannot be seen there: they stay as
    /// configured; baud, stop bits and flow control come from the pty.
    pub(super) fn seen(&self, t: &Termios) -> LineSettings {
        LineSettings {
            data_bits: self.opened_with.data_bits,
            parity: self.opened_with.parity,
            ..read_settings(t)
        }
    }
}

impl Drop for Pty {
    fn drop(&mut self) {
        if self.claim.is_some() {
            // Kept for this side's next run: the holder removes the link when it lets go.
            return;
        }
        // Remove the link only while it still points at our slave: a newer pty for the same
        // link (created once our registry entry was dead) has another slave path.
        if std::fs::read_link(&self.link).is_ok_and(|t| t == self.slave_path) {
            if let Err(e) = std::fs::remove_file(&self.link) {
                tracing::warn!(link = %self.link.display(), error = %e, "cannot remove pty link");
            } else {
                tracing::debug!(link = %self.link.display(), "pty link removed");
            }
        }
    }
}

pub(super) type Registry<T> = Mutex<HashMap<PathBuf, Weak<T>>>;

fn ttys() -> &'static Registry<Tty> {
    static TTYS: OnceLock<Registry<Tty>> = OnceLock::new();
    TTYS.get_or_init(Default::default)
}

fn ptys() -> &'static Registry<Pty> {
    static PTYS: OnceLock<Registry<Pty>> = OnceLock::new();
    PTYS.get_or_init(Default::default)
}

/// Looks `key` up in `registry`, or opens it with `open` and registers it. The lock is held
/// while opening, so both endpoints of a driver get the same file.
pub(super) fn shared<T>(
    registry: &Registry<T>,
    key: &Path,
    open: impl FnOnce() -> Result<Arc<T>, EndpointError>,
    reuse: impl FnOnce(&T) -> Result<(), EndpointError>,
) -> Result<Arc<T>, EndpointError> {
    let mut map = registry.lock().unwrap_or_else(|p| p.into_inner());
    map.retain(|_, w| w.strong_count() > 0);
    if let Some(existing) = map.get(key).and_then(Weak::upgrade) {
        reuse(&existing)?;
        return Ok(existing);
    }
    let new = open()?;
    map.insert(key.to_path_buf(), Arc::downgrade(&new));
    Ok(new)
}

fn open_err<'a>(
    endpoint: &'static str,
    path: &'a Path,
) -> impl Fn(io::Error) -> EndpointError + 'a {
    move |source| EndpointError::Open {
        endpoint,
        path: path.to_path_buf(),
        source,
    }
}

fn mismatch(
    endpoint: &'static str,
    path: &Path,
    had: &LineSettings,
    want: &LineSettings,
) -> EndpointError {
    EndpointError::Open {
        endpoint,
        path: path.to_path_buf(),
        source: io::Error::other(format!(
            "already opened by the other stream with settings {had}, this one asks for {want}; \
             both endpoints of one port must use the same settings"
        )),
    }
}

/// Opens (or shares) the tty of a `serial` endpoint, raw, with its settings.
pub(crate) fn open_tty(
    endpoint: &'static str,
    c: &SerialConfig,
) -> Result<Arc<Tty>, EndpointError> {
    let want = c.settings();
    let key = std::fs::canonicalize(&c.path).unwrap_or_else(|_| c.path.clone());
    shared(
        ttys(),
        &key,
        || {
            let err = open_err(endpoint, &c.path);
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_NOCTTY | libc::O_NONBLOCK)
                .open(&c.path)
                .map_err(&err)?;
            let fd = OwnedFd::from(file);
            let mut t = rustix::termios::tcgetattr(&fd).map_err(|e| {
                err(if e == Errno::NOTTY {
                    io::Error::other("not a terminal (tty)")
                } else {
                    e.into()
                })
            })?;
            set_termios(endpoint, &c.path, &fd, &mut t, &want, true)?;
            let fd = sys::async_fd(fd).map_err(&err)?;
            tracing::debug!(endpoint, path = %c.path.display(), settings = %want, "tty opened");
            Ok(Arc::new(Tty {
                fd,
                path: c.path.clone(),
                opened_with: want,
            }))
        },
        |t| {
            if t.opened_with == want {
                Ok(())
            } else {
                Err(mismatch(endpoint, &c.path, &t.opened_with, &want))
            }
        },
    )
}

fn set_termios(
    endpoint: &'static str,
    path: &Path,
    fd: impl AsFd,
    t: &mut Termios,
    s: &LineSettings,
    raw: bool,
) -> Result<(), EndpointError> {
    let settings_err = |source: io::Error| EndpointError::Settings {
        endpoint,
        path: path.to_path_buf(),
        settings: s.to_string(),
        source,
    };
    if raw {
        make_raw_with(t, s).map_err(settings_err)?;
    } else {
        apply_settings(t, s).map_err(settings_err)?;
    }
    rustix::termios::tcsetattr(fd, OptionalActions::Now, t).map_err(|e| settings_err(e.into()))
}

/// Creates (or shares) the pty of a `pty` endpoint and links its slave at `link`.
pub(crate) fn open_pty(endpoint: &'static str, c: &PtyConfig) -> Result<Arc<Pty>, EndpointError> {
    let want = c.settings();
    shared(
        ptys(),
        &c.link,
        || {
            let link_err = open_err(endpoint, &c.link);
            // The pty a holder kept since this side's last run ended or died: a program that
            // holds the port goes on with it.
            match hold::take(&c.link) {
                Ok(hold::Taken::Master(fd, claim)) => {
                    if let Some(p) = adopt(endpoint, c, want, fd, claim)? {
                        return Ok(Arc::new(p));
                    }
                }
                Ok(hold::Taken::Busy) => {
                    return Err(link_err(io::Error::other(
                        "another running ndd side uses this pty (its holder gives it to one side at a time); stop that side first",
                    )))
                }
                Ok(hold::Taken::Nothing) => {}
                Err(e) => tracing::warn!(endpoint, link = %c.link.display(),
                    "cannot ask for a pty kept since the last run: {e}; making a new one"),
            }
            let replace = match std::fs::symlink_metadata(&c.link) {
                Ok(m) if m.file_type().is_symlink() => true,
                Ok(m) => {
                    let what = if m.is_dir() {
                        "a directory"
                    } else if m.is_file() {
                        "a regular file"
                    } else {
                        "not a symlink"
                    };
                    return Err(link_err(io::Error::other(format!(
                        "{what} is in the way; refusing to replace it (only a symlink is replaced)"
                    ))));
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => false,
                Err(e) => return Err(link_err(e)),
            };
            let pty_err = |e: Errno| EndpointError::Open {
                endpoint,
                path: PathBuf::from("/dev/ptmx"),
                source: e.into(),
            };
            use rustix::pty::OpenptFlags;
            let master =
                rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)
                    .map_err(pty_err)?;
            rustix::pty::grantpt(&master).map_err(pty_err)?;
            rustix::pty::unlockpt(&master).map_err(pty_err)?;
            let slave_path = slave_of(&master).map_err(pty_err)?;
            let slave = open_slave(endpoint, &master, &slave_path)?;
            let mut t = rustix::termios::tcgetattr(&slave).map_err(pty_err)?;
            set_termios(endpoint, &slave_path, &slave, &mut t, &want, true)?;
            let master = sys::async_fd(master).map_err(open_err(endpoint, &slave_path))?;
            if replace {
                match std::fs::remove_file(&c.link) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(link_err(e)),
                    _ => {}
                }
            }
            // The holder has the pty before the link shows it: a program that opens it, and
            // this side dying at once, still finds it kept.
            let keep = Duration::from_secs(u64::from(c.keep_s));
            let claim = match hold::hand_over(&c.link, master.get_ref(), keep) {
                Ok(claim) => claim,
                Err(e) => {
                    tracing::warn!(endpoint, link = %c.link.display(),
                        "the pty will go with this side (no holder keeps it for the next run): {e}");
                    None
                }
            };
            std::os::unix::fs::symlink(&slave_path, &c.link).map_err(&link_err)?;
            tracing::debug!(
                endpoint,
                link = %c.link.display(),
                slave = %slave_path.display(),
                settings = %want,
                "pty created"
            );
            Ok(Arc::new(Pty::new(
                master, slave, slave_path, c, want, claim, true,
            )))
        },
        |p| {
            if p.opened_with == want {
                Ok(())
            } else {
                Err(mismatch(endpoint, &c.link, &p.opened_with, &want))
            }
        },
    )
}

use std::os::unix::ffi::OsStrExt as _;

/// The slave path of pty master `master` (`/dev/pts/N`).
pub(super) fn slave_of(master: &OwnedFd) -> Result<PathBuf, Errno> {
    let name = rustix::pty::ptsname(master, Vec::new())?;
    Ok(PathBuf::from(std::ffi::OsStr::from_bytes(name.as_bytes())))
}

/// Makes `master` non-blocking and opens our own descriptor of its slave.
fn open_slave(
    endpoint: &'static str,
    master: &OwnedFd,
    slave_path: &Path,
) -> Result<OwnedFd, EndpointError> {
    let pty_err = |e: Errno| EndpointError::Open {
        endpoint,
        path: PathBuf::from("/dev/ptmx"),
        source: e.into(),
    };
    let flags = rustix::fs::fcntl_getfl(master).map_err(pty_err)?;
    rustix::fs::fcntl_setfl(master, flags | OFlags::NONBLOCK).map_err(pty_err)?;
    let slave = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY | libc::O_NONBLOCK)
        .open(slave_path)
        .map_err(open_err(endpoint, slave_path))?;
    Ok(OwnedFd::from(slave))
}

/// Takes up pty master `master` a holder kept for `c.link`: `None` if the link no longer
/// names its slave (a new pty is made then).
fn adopt(
    endpoint: &'static str,
    c: &PtyConfig,
    want: LineSettings,
    master: OwnedFd,
    claim: hold::Claim,
) -> Result<Option<Pty>, EndpointError> {
    let Ok(slave_path) = slave_of(&master) else {
        return Ok(None);
    };
    if std::fs::read_link(&c.link).ok().as_ref() != Some(&slave_path) {
        return Ok(None);
    }
    let slave = open_slave(endpoint, &master, &slave_path)?;
    let master = sys::async_fd(master).map_err(open_err(endpoint, &slave_path))?;
    // Its baseline: the program's settings, as it left them (the device's port takes them).
    let pty = Pty::new(master, slave, slave_path, c, want, Some(claim), false);
    tracing::info!(endpoint, link = %c.link.display(), slave = %pty.slave_path.display(),
        "took up the pty kept since this side's last run (a program holding it goes on)");
    Ok(Some(pty))
}

// ---------------------------------------------------------------------------------------
// Non-blocking I/O helpers

/// Reads into `buf`; `Ok(0)` is end of file (a hung-up tty).
pub(super) async fn read_some(fd: &AsyncFd<OwnedFd>, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match rustix::io::read(fd.get_ref(), &mut *buf) {
            Ok(n) => return Ok(n),
            Err(Errno::INTR) => {}
            Err(Errno::AGAIN) => {
                if let Ok(guard) = tokio::time::timeout(SETTINGS_POLL, fd.readable()).await {
                    guard?.clear_ready();
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
}

pub(super) async fn write_all(fd: &AsyncFd<OwnedFd>, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        match rustix::io::write(fd.get_ref(), data) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => data = &data[n..],
            Err(Errno::INTR) => {}
            Err(Errno::AGAIN) => {
                if let Ok(guard) = tokio::time::timeout(SETTINGS_POLL, fd.writable()).await {
                    guard?.clear_ready();
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;

    fn pty_pair() -> (OwnedFd, File) {
        use rustix::pty::OpenptFlags;
        let master = rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY).unwrap();
        rustix::pty::grantpt(&master).unwrap();
        rustix::pty::unlockpt(&master).unwrap();
        let name = rustix::pty::ptsname(&master, Vec::new()).unwrap();
        let slave = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOCTTY)
            .open(std::ffi::OsStr::from_bytes(name.as_bytes()))
            .unwrap();
        (master, slave)
    }

    fn samples() -> [LineSettings; 5] {
        [
            LineSettings::default(),
            LineSettings {
                baud: 9600,
                data_bits: 7,
                parity: Parity::Even,
                stop_bits: 2,
                flow: Flow::Rtscts,
            },
            LineSettings {
                baud: 250_000,
                data_bits: 5,
                parity: Parity::Odd,
                stop_bits: 1,
                flow: Flow::Xonxoff,
            },
            LineSettings {
                baud: 31_250,
                data_bits: 6,
                parity: Parity::Mark,
                stop_bits: 1,
                flow: Flow::None,
            },
            LineSettings {
                baud: 1200,
                data_bits: 8,
                parity: Parity::Space,
                stop_bits: 2,
                flow: Flow::None,
            },
        ]
    }

    #[test]
    fn settings_round_trip_through_a_termios() {
        let (_master, slave) = pty_pair();
        for s in samples() {
            let mut t = rustix::termios::tcgetattr(&slave).unwrap();
            make_raw_with(&mut t, &s).unwrap();
            assert_eq!(read_settings(&t), s, "{s}");
        }
    }

    #[test]
    fn a_pty_keeps_baud_stop_bits_and_flow_but_forces_8_bits_no_parity() {
        let (master, slave) = pty_pair();
        for s in samples() {
            let mut t = rustix::termios::tcgetattr(&slave).unwrap();
            make_raw_with(&mut t, &s).unwrap();
            rustix::termios::tcsetattr(&slave, OptionalActions::Now, &t).unwrap();
            let back = read_settings(&rustix::termios::tcgetattr(&master).unwrap());
            let want = LineSettings {
                data_bits: 8,
                parity: Parity::None,
                ..s
            };
            assert_eq!(back, want, "{s}");
        }
    }

    #[test]
    fn modem_bits_map_to_frame_bits() {
        let m = tiocm_to_lines(libc::TIOCM_CTS | libc::TIOCM_CAR | libc::TIOCM_DTR);
        assert_eq!(m.state, ModemLines::CTS | ModemLines::DCD);
        assert_eq!(m.valid, 0x3c);
    }
}

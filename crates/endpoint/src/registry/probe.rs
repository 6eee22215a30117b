//! Probing an endpoint before the link is up: the local things it needs (a file, a device
//! node, a directory, an X display) are there and usable, so a wrong path or display fails on
//! the machine that can fix it, at start, in one line naming the key, the value and the fix,
//! instead of after the peer connected (and there as a network failure).
//!
//! Probes have no lasting effect: files are opened for reading and closed, directories and
//! device nodes looked at, X displays connected to and left.

use super::{SinkConfig, SourceConfig};
use crate::common::error::EndpointError;
use std::path::Path;

fn unavailable(endpoint: &'static str, what: String, hint: &str) -> EndpointError {
    EndpointError::Unavailable {
        endpoint,
        what,
        hint: hint.to_string(),
    }
}

/// `key` names an existing file or device node this user may open for reading.
fn readable(endpoint: &'static str, key: &str, path: &Path) -> Result<(), EndpointError> {
    match std::fs::File::open(path) {
        Ok(_) => Ok(()),
        Err(e) => Err(unavailable(
            endpoint,
            format!("key `{key}`: cannot open {}: {e}", path.display()),
            "check the path (a relative one is relative to the config file's directory) and \
             this user's permissions",
        )),
    }
}

/// `key` names a device node or file that exists (not opened: opening a serial port can
/// change its modem lines).
/// `key` names an existing device node; `hint` says how to find the right one.
fn exists(endpoint: &'static str, key: &str, path: &Path, hint: &str) -> Result<(), EndpointError> {
    match std::fs::metadata(path) {
        Ok(_) => Ok(()),
        Err(e) => Err(unavailable(
            endpoint,
            format!("key `{key}`: {}: {e}", path.display()),
            hint,
        )),
    }
}

const SERIAL_HINT: &str =
    "check the path (is the device plugged in? `ls /dev/serial/by-id/` lists serial adapters)";
const CAMERA_HINT: &str = "check the path (is the camera plugged in? `v4l2-ctl --list-devices` \
     (package v4l-utils) lists the cameras; no /dev/video* at all: this kernel has no V4L2)";
const LOOPBACK_HINT: &str = "create the node: `modprobe v4l2loopback video_nr=10` (package \
     v4l2loopback-dkms) makes /dev/video10";

/// `key` names a file or link to be created: its directory must exist.
fn creatable(endpoint: &'static str, key: &str, path: &Path) -> Result<(), EndpointError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(unavailable(
            endpoint,
            format!("key `{key}`: {} is not a directory", dir.display()),
            "point the path into an existing directory",
        )),
        Err(e) => Err(unavailable(
            endpoint,
            format!("key `{key}`: directory {}: {e}", dir.display()),
            "create the directory or fix the path (a relative one is relative to the config \
             file's directory)",
        )),
    }
}

/// `listen` can be listened on now (bound and released; the RFC 2217 server of a client
/// endpoint may come later, so only the server is probed).
fn listenable(endpoint: &'static str, listen: &str) -> Result<(), EndpointError> {
    match std::net::TcpListener::bind(listen) {
        Ok(_) => Ok(()),
        Err(e) => Err(unavailable(
            endpoint,
            format!("key `listen`: cannot listen on {listen}: {e}"),
            "pick a free port (`ss -ltn` lists the ones in use) and an address of this machine",
        )),
    }
}

/// A PulseAudio server answers (`pactl info`).
fn pulse(endpoint: &'static str, server: &Option<String>) -> Result<(), EndpointError> {
    let mut c = std::process::Command::new("pactl");
    if let Some(s) = server {
        c.arg(format!("--server={s}"));
    }
    match c.arg("info").output() {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(unavailable(
            endpoint,
            format!(
                "no PulseAudio server answers: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ),
            "start PulseAudio (or PipeWire's pipewire-pulse) for this user, e.g. `pulseaudio \
             --start`, or give `server`",
        )),
        Err(e) => Err(unavailable(
            endpoint,
            format!("cannot run pactl: {e}"),
            "install PulseAudio's tools (Debian: apt-get install pulseaudio-utils)",
        )),
    }
}

fn display(endpoint: &'static str, display: &str) -> Result<(), EndpointError> {
    crate::common::x11::x11_connect(endpoint, display).map(drop)
}

impl SourceConfig {
    /// Checks, without side effects, that what this source needs on this machine is there.
    pub fn probe(&self) -> Result<(), EndpointError> {
        let endpoint = self.endpoint();
        match self {
            SourceConfig::File(c) => readable(endpoint, "path", &c.path),
            SourceConfig::Serial(c) => exists(endpoint, "path", &c.path, SERIAL_HINT),
            SourceConfig::Evdev(c) => readable(endpoint, "path", &c.path),
            SourceConfig::Pty(c) => creatable(endpoint, "link", &c.link),
            SourceConfig::X11Input(c) => display(endpoint, &c.display),
            SourceConfig::X11Screen(c) => display(endpoint, &c.display),
            SourceConfig::WaylandScreen(c) => {
                crate::display::open_wayland_screen(endpoint, c).map(drop)
            }
            SourceConfig::GnomeScreen(c) => crate::display::probe_gnome_screen(endpoint, c),
            SourceConfig::PortalScreen(c) => crate::display::probe_portal_screen(endpoint, c),
            SourceConfig::X11Cursor(c) => display(endpoint, &c.display),
            SourceConfig::X11Clipboard(c) => display(endpoint, &c.display),
            SourceConfig::WaylandClipboard(c) => crate::clipboard::probe_wayland(endpoint, c),
            SourceConfig::GnomeClipboard(c) => crate::clipboard::probe_gnome_clipboard(endpoint, c),
            // The viewer it reads is another endpoint of this process: nothing to probe.
            SourceConfig::WaylandWindowInput(_) => Ok(()),
            SourceConfig::Rfc2217Server(c) => listenable(endpoint, &c.listen),
            SourceConfig::Rfc2217Client(_) => Ok(()),
            SourceConfig::PulseCapture(c) => pulse(endpoint, &c.server),
            SourceConfig::CameraSim(_) => Ok(()),
            SourceConfig::V4l2(c) => exists(endpoint, "path", &c.path, CAMERA_HINT)
                .and_then(|()| crate::camera::v4l2::open_capture(endpoint, &c.path).map(|_| ())),
            SourceConfig::Synthetic(_) | SourceConfig::SpacenavSim(_) | SourceConfig::Stdin(_) => {
                Ok(())
            }
        }
    }
}

impl SinkConfig {
    /// Checks, without side effects, that what this sink needs on this machine is there.
    pub fn probe(&self) -> Result<(), EndpointError> {
        let endpoint = self.endpoint();
        match self {
            SinkConfig::File(c) => creatable(endpoint, "path", &c.path),
            SinkConfig::Serial(c) => exists(endpoint, "path", &c.path, SERIAL_HINT),
            SinkConfig::Pty(c) => creatable(endpoint, "link", &c.link),
            SinkConfig::Framebuffer(c) => creatable(endpoint, "path", &c.path),
            SinkConfig::Uinput(_) => {
                crate::input::check_uinput(endpoint, Path::new(crate::input::UINPUT_PATH))
            }
            SinkConfig::Xtest(c) => display(endpoint, &c.display),
            SinkConfig::WaylandInput(c) => crate::input::open_wayland_input(endpoint, c).map(drop),
            SinkConfig::GnomeInput(c) => crate::input::probe_gnome_input(endpoint, c),
            SinkConfig::PortalInput(c) => crate::input::probe_portal_input(endpoint, c),
            SinkConfig::KdeInput(c) => crate::input::probe_kde_input(endpoint, c),
            SinkConfig::X11Window(c) => display(endpoint, &c.display),
            SinkConfig::WaylandWindow(c) => crate::display::probe_wayland_window(endpoint, c),
            SinkConfig::X11Cursor(c) => display(endpoint, &c.display),
            SinkConfig::X11Clipboard(c) => display(endpoint, &c.display),
            SinkConfig::WaylandClipboard(c) => crate::clipboard::probe_wayland(endpoint, c),
            SinkConfig::GnomeClipboard(c) => crate::clipboard::probe_gnome_clipboard(endpoint, c),
            SinkConfig::Rfc2217Server(c) => listenable(endpoint, &c.listen),
            SinkConfig::Rfc2217Client(_) => Ok(()),
            SinkConfig::PulsePlayback(c) => pulse(endpoint, &c.server),
            SinkConfig::Y4m(c) => creatable(endpoint, "path", &c.path),
            SinkConfig::V4l2loopback(c) => exists(endpoint, "path", &c.path, LOOPBACK_HINT)
                .and_then(|()| crate::camera::v4l2::open_output(endpoint, &c.path).map(|_| ())),
            SinkConfig::Stdout(_) | SinkConfig::Check(_) | SinkConfig::Null(_) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file::{FileSinkConfig, FileSourceConfig};
    use crate::serial::SerialConfig;

    #[test]
    fn a_wrong_path_is_named_with_its_key_and_a_fix() {
        let src = SourceConfig::File(FileSourceConfig {
            path: "/nonexistent/input.bin".into(),
            ..toml::from_str("path = \"x\"").unwrap()
        });
        let e = src.probe().unwrap_err().to_string();
        assert!(
            e.starts_with("file source: key `path`: cannot open /nonexistent/input.bin: "),
            "{e}"
        );
        assert!(e.contains("relative to the config file's directory"), "{e}");
        let sink = SinkConfig::File(FileSinkConfig {
            path: "/nonexistent/dir/out.bin".into(),
            ..toml::from_str("path = \"x\"").unwrap()
        });
        let e = sink.probe().unwrap_err().to_string();
        assert!(
            e.starts_with("file sink: key `path`: directory /nonexistent/dir: "),
            "{e}"
        );
        let serial = SinkConfig::Serial(SerialConfig {
            path: "/dev/ttyNOPE9".into(),
            ..toml::from_str("path = \"x\"").unwrap()
        });
        let e = serial.probe().unwrap_err().to_string();
        assert!(e.contains("key `path`: /dev/ttyNOPE9: "), "{e}");
        assert!(e.contains("/dev/serial/by-id/"), "{e}");
        let camera = SourceConfig::V4l2(toml::from_str("path = \"/dev/videoNOPE\"").unwrap());
        let e = camera.probe().unwrap_err().to_string();
        assert!(
            e.starts_with("v4l2 source: key `path`: /dev/videoNOPE: "),
            "{e}"
        );
        assert!(e.contains("v4l2-ctl --list-devices"), "{e}");
        let out = SinkConfig::V4l2loopback(toml::from_str("path = \"/dev/videoNOPE\"").unwrap());
        let e = out.probe().unwrap_err().to_string();
        assert!(e.contains("modprobe v4l2loopback"), "{e}");
        // A node that is there but is not a camera is refused by the probe too, not only once
        // the link is up.
        let null = SourceConfig::V4l2(toml::from_str("path = \"/dev/null\"").unwrap());
        let e = null.probe().unwrap_err().to_string();
        assert!(
            e.contains("/dev/null is not a Video4Linux2 device (VIDIOC_QUERYCAP"),
            "{e}"
        );
    }

    #[test]
    fn what_is_there_passes() {
        let dir = std::env::temp_dir();
        let f = dir.join(format!("ndd-probe-{}", std::process::id()));
        std::fs::write(&f, b"x").unwrap();
        let src = SourceConfig::File(FileSourceConfig {
            path: f.clone(),
            ..toml::from_str("path = \"x\"").unwrap()
        });
        assert!(src.probe().is_ok());
        let sink = SinkConfig::File(FileSinkConfig {
            path: dir.join("a-new-file"),
            ..toml::from_str("path = \"x\"").unwrap()
        });
        assert!(sink.probe().is_ok());
        let _ = std::fs::remove_file(&f);
    }
}

//! The registry: the one place that knows every endpoint.
//!
//! - [`SourceConfig`] / [`SinkConfig`]: where a stream's frames come from and where they go,
//!   as written in a config file (`{ type = "synthetic", size = 100 }`): tagged by `type`, one
//!   variant per endpoint, holding the config struct of that endpoint's device folder (plain
//!   data, each rejecting unknown keys), separate from the tasks that run it;
//! - one `match` per operation over them: the catalogue entry and names (`info`, `name`,
//!   `endpoint`), `paths_mut`, `describe`, `validate`, `spawn` ([`SourceConfig::spawn`],
//!   [`SinkConfig::spawn_tracked`]: each arm calls the spawn function of the endpoint's
//!   folder) and [`SinkConfig::release_record`];
//! - the catalogue, [`SOURCES`] / [`SINKS`] (`catalogue.rs`): every endpoint with its
//!   parameters, for `ndd modules` and the docs.
//!
//! This module imports the device folders; none of them imports it.
//!
//! `spawn` checks the parameters and that it runs inside a tokio runtime, then has the folder
//! open its device: opening errors come back from `spawn` itself, before any task runs. Every
//! source numbers its frames 0, 1, 2, … and stamps them with the wall-clock time of their
//! creation; it ends (dropping the sender) at end of input or after `count` frames, and stops
//! quietly when the receiver goes away. A sink consumes its channel until it closes, and marks
//! the frames it has completed in a [`Delivered`] ([`SinkConfig::spawn_tracked`]).

mod catalogue;
mod probe;

pub use catalogue::{EndpointInfo, REQUIRED, SINKS, SOURCES};

use crate::audio::{PulseCaptureConfig, PulsePlaybackConfig};
use crate::camera::{CameraSimConfig, V4l2Config, V4l2LoopbackConfig, Y4mConfig};
use crate::check::{CheckConfig, NullConfig};
use crate::clipboard::{GnomeClipboardConfig, WaylandClipboardConfig, X11ClipboardConfig};
use crate::common::delivered::Delivered;
use crate::common::demand::Demand;
use crate::common::error::EndpointError;
use crate::common::framing::MAX_LENGTH_FRAME;
use crate::common::report::{SinkTask, SourceTask};
use crate::display::{
    FramebufferConfig, GnomeScreenConfig, PortalScreenConfig, WaylandScreenConfig,
    WaylandWindowConfig, X11CursorSinkConfig, X11CursorSourceConfig, X11ScreenConfig,
    X11WindowConfig,
};
use crate::file::{FileSinkConfig, FileSourceConfig};
use crate::input::{
    EvdevConfig, GnomeInputConfig, KdeInputConfig, PortalInputConfig, UinputConfig,
    WaylandInputConfig, WaylandWindowInputConfig, X11InputConfig, XtestConfig,
};
use crate::serial::rfc2217;
use crate::serial::{
    check_address, check_listen, LineSettings, PtyConfig, Rfc2217ClientConfig, Rfc2217ServerConfig,
    SerialConfig,
};
use crate::stdio::{StdinConfig, StdoutConfig};
use crate::synthetic::{SpacenavSimConfig, SyntheticConfig};
use crate::{audio, camera, check, clipboard, display, file, input, serial, stdio, synthetic};
use ndd_core::Frame;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::PathBuf;
use tokio::sync::mpsc::{Receiver, Sender};

fn check_settings(endpoint: &'static str, s: &LineSettings) -> Result<(), EndpointError> {
    s.check().map_err(|(param, reason)| EndpointError::Config {
        endpoint,
        param,
        reason: reason.to_string(),
    })
}

/// Where a stream's frames come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum SourceConfig {
    /// Seeded bytes at a fixed rate.
    Synthetic(SyntheticConfig),
    /// Simulated 3D mouse.
    SpacenavSim(SpacenavSimConfig),
    /// Standard input.
    Stdin(StdinConfig),
    /// A file.
    File(FileSourceConfig),
    /// A serial port (device side).
    Serial(SerialConfig),
    /// A pty the app writes to (app side).
    Pty(PtyConfig),
    /// A Linux input device (device side).
    Evdev(EvdevConfig),
    /// Input events of an X display (device side).
    #[serde(rename = "x11-input")]
    X11Input(X11InputConfig),
    /// The screen of an X display (app side).
    #[serde(rename = "x11-screen")]
    X11Screen(X11ScreenConfig),
    /// The cursor image of an X display (app side).
    #[serde(rename = "x11-cursor")]
    X11Cursor(X11CursorSourceConfig),
    /// The X selections of a display (either side).
    #[serde(rename = "x11-clipboard")]
    X11Clipboard(X11ClipboardConfig),
    /// An RFC 2217 server: RFC 2217 clients use the port through it (app side).
    #[serde(rename = "rfc2217-server")]
    Rfc2217Server(Rfc2217ServerConfig),
    /// An RFC 2217 client of ser2net & co., whose port is the device (device side).
    #[serde(rename = "rfc2217-client")]
    Rfc2217Client(Rfc2217ClientConfig),
    /// Sound recorded from PulseAudio (either side).
    #[serde(rename = "pulse-capture")]
    PulseCapture(PulseCaptureConfig),
    /// A synthetic camera (either side).
    #[serde(rename = "camera-sim")]
    CameraSim(CameraSimConfig),
    /// A Video4Linux2 camera (device side).
    V4l2(V4l2Config),
    /// An output of a wlroots Wayland compositor (app side).
    #[serde(rename = "wayland-screen")]
    WaylandScreen(WaylandScreenConfig),
    /// A monitor of a GNOME (mutter) Wayland session (app side).
    #[serde(rename = "gnome-screen")]
    GnomeScreen(GnomeScreenConfig),
    /// A monitor the desktop shares through the xdg-desktop-portal (app side).
    #[serde(rename = "portal-screen")]
    PortalScreen(PortalScreenConfig),
    /// What the person does in the `wayland-window` viewer (device side).
    #[serde(rename = "wayland-window-input")]
    WaylandWindowInput(WaylandWindowInputConfig),
    /// The clipboard of a wlroots Wayland session (either side).
    #[serde(rename = "wayland-clipboard")]
    WaylandClipboard(WaylandClipboardConfig),
    /// The clipboard of a GNOME (mutter) Wayland session (either side).
    #[serde(rename = "gnome-clipboard")]
    GnomeClipboard(GnomeClipboardConfig),
}

/// Where a stream's frames go.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum SinkConfig {
    /// Standard output.
    Stdout(StdoutConfig),
    /// A file.
    File(FileSinkConfig),
    /// The checker.
    Check(CheckConfig),
    /// Counts and discards.
    Null(NullConfig),
    /// A serial port (device side).
    Serial(SerialConfig),
    /// A pty the app reads from (app side).
    Pty(PtyConfig),
    /// A uinput virtual input device (app side).
    Uinput(UinputConfig),
    /// XTEST injection into an X display (app side).
    Xtest(XtestConfig),
    /// A window showing display updates (device side).
    #[serde(rename = "x11-window")]
    X11Window(X11WindowConfig),
    /// A raw framebuffer file or device (device side).
    Framebuffer(FramebufferConfig),
    /// The cursor of the viewer window (device side).
    #[serde(rename = "x11-cursor")]
    X11Cursor(X11CursorSinkConfig),
    /// The X selections of a display (either side).
    #[serde(rename = "x11-clipboard")]
    X11Clipboard(X11ClipboardConfig),
    /// An RFC 2217 server: RFC 2217 clients use the port through it (app side).
    #[serde(rename = "rfc2217-server")]
    Rfc2217Server(Rfc2217ServerConfig),
    /// An RFC 2217 client of ser2net & co., whose port is the device (device side).
    #[serde(rename = "rfc2217-client")]
    Rfc2217Client(Rfc2217ClientConfig),
    /// Sound played through PulseAudio (either side).
    #[serde(rename = "pulse-playback")]
    PulsePlayback(PulsePlaybackConfig),
    /// A YUV4MPEG2 stream for ffplay, ffmpeg, GStreamer (app side).
    Y4m(Y4mConfig),
    /// A v4l2loopback device: the remote camera as `/dev/videoN` (app side).
    V4l2loopback(V4l2LoopbackConfig),
    /// A virtual keyboard and pointer in a wlroots Wayland session (app side).
    #[serde(rename = "wayland-input")]
    WaylandInput(WaylandInputConfig),
    /// The clipboard of a wlroots Wayland session (either side).
    #[serde(rename = "wayland-clipboard")]
    WaylandClipboard(WaylandClipboardConfig),
    /// A window showing display updates on a Wayland desktop (device side).
    #[serde(rename = "wayland-window")]
    WaylandWindow(WaylandWindowConfig),
    /// Keys and pointer typed into a GNOME Wayland session (app side).
    #[serde(rename = "gnome-input")]
    GnomeInput(GnomeInputConfig),
    /// Keys and pointer into a desktop session through the xdg-desktop-portal (app side).
    #[serde(rename = "portal-input")]
    PortalInput(PortalInputConfig),
    /// The clipboard of a GNOME (mutter) Wayland session (either side).
    #[serde(rename = "gnome-clipboard")]
    GnomeClipboard(GnomeClipboardConfig),
    /// Input into a KDE Plasma (KWin) Wayland session (app side).
    #[serde(rename = "kde-input")]
    KdeInput(KdeInputConfig),
}

/// `x11-clipboard(display=:0, selections=CLIPBOARD+PRIMARY, max_bytes=8388608, images)`,
/// and the same for `wayland-clipboard`.
fn describe_clipboard(
    kind: &str,
    display: &str,
    selections: &[String],
    max_bytes: u64,
    images: bool,
) -> String {
    format!(
        "{kind}(display={display}, selections={}, max_bytes={max_bytes}{})",
        if selections.is_empty() {
            "none (off)".to_string()
        } else {
            selections.join("+")
        },
        if images { ", images" } else { "" }
    )
}

fn describe_x11_clipboard(c: &X11ClipboardConfig) -> String {
    describe_clipboard(
        "x11-clipboard",
        &c.display,
        &c.selections,
        c.max_bytes,
        c.images,
    )
}

fn describe_wayland_clipboard(c: &WaylandClipboardConfig) -> String {
    let display = if c.display.is_empty() {
        "$WAYLAND_DISPLAY"
    } else {
        c.display.as_str()
    };
    let mut s = describe_clipboard(
        "wayland-clipboard",
        display,
        &c.selections,
        c.max_bytes,
        c.images,
    );
    if let Some(p) = c.protocol.named() {
        // (Inside the closing parenthesis.)
        s.pop();
        let _ = write!(s, ", protocol={p})");
    }
    s
}

fn describe_gnome_clipboard(c: &GnomeClipboardConfig) -> String {
    format!(
        "gnome-clipboard(bus={}, max_bytes={}{})",
        if c.bus.is_empty() {
            "$DBUS_SESSION_BUS_ADDRESS"
        } else {
            c.bus.as_str()
        },
        c.max_bytes,
        if c.images { ", images" } else { "" }
    )
}

fn check_clipboard(
    endpoint: &'static str,
    selections: &[String],
    max_bytes: u64,
) -> Result<(), EndpointError> {
    crate::clipboard::parse_selections(selections).map_err(|reason| EndpointError::Config {
        endpoint,
        param: "selections",
        reason,
    })?;
    if max_bytes == 0 || max_bytes > MAX_LENGTH_FRAME as u64 {
        return Err(EndpointError::Config {
            endpoint,
            param: "max_bytes",
            reason: "must be 1 to 67108864 (64 MiB)".to_string(),
        });
    }
    Ok(())
}

fn fmt_opt<T: std::fmt::Display>(out: &mut String, key: &str, v: Option<T>) {
    if let Some(v) = v {
        let _ = write!(out, ", {key}={v}");
    }
}

/// `serial(path=/dev/ttyUSB0, 115200 8N1)` (flow control appended when on).
fn describe_serial(c: &SerialConfig) -> String {
    format!("serial(path={}, {})", c.path.display(), c.settings())
}

/// `pty(link=/tmp/ttyREMOTE)`, with the initial settings when they are not the default.
fn describe_pty(c: &PtyConfig) -> String {
    let s = c.settings();
    let keep = if c.keep_s == serial::hold::DEFAULT_KEEP_S {
        String::new()
    } else {
        format!(", keep_s={}", c.keep_s)
    };
    if s == LineSettings::default() {
        format!("pty(link={}{keep})", c.link.display())
    } else {
        format!("pty(link={}, {s}{keep})", c.link.display())
    }
}

/// A pty endpoint's line settings and `keep_s`.
fn check_pty(endpoint: &'static str, c: &PtyConfig) -> Result<(), EndpointError> {
    check_settings(endpoint, &c.settings())?;
    c.check_keep()
        .map_err(|(param, reason)| EndpointError::Config {
            endpoint,
            param,
            reason: reason.to_string(),
        })
}

/// `rfc2217-server(listen=127.0.0.1:2217)`, with the initial settings when not the default.
fn describe_rfc2217_server(c: &Rfc2217ServerConfig) -> String {
    let s = c.settings();
    if s == LineSettings::default() {
        format!("rfc2217-server(listen={})", c.listen)
    } else {
        format!("rfc2217-server(listen={}, {s})", c.listen)
    }
}

/// `rfc2217-client(address=host:2000, 115200 8N1)`.
fn describe_rfc2217_client(c: &Rfc2217ClientConfig) -> String {
    format!("rfc2217-client(address={}, {})", c.address, c.settings())
}

fn check_rfc2217_server(
    endpoint: &'static str,
    c: &Rfc2217ServerConfig,
) -> Result<(), EndpointError> {
    check_listen(&c.listen).map_err(|reason| EndpointError::Config {
        endpoint,
        param: "listen",
        reason,
    })?;
    check_settings(endpoint, &c.settings())
}

fn check_rfc2217_client(
    endpoint: &'static str,
    c: &Rfc2217ClientConfig,
) -> Result<(), EndpointError> {
    check_address(&c.address).map_err(|reason| EndpointError::Config {
        endpoint,
        param: "address",
        reason,
    })?;
    check_settings(endpoint, &c.settings())
}

impl SourceConfig {
    /// Whether someone waits on this source's frames as they happen (input devices, sound,
    /// serial lines, the clipboard, the cursor): its stream's frames then leave before those
    /// of screens, cameras and files by default.
    pub fn interactive(&self) -> bool {
        match self {
            SourceConfig::Evdev(_)
            | SourceConfig::X11Input(_)
            | SourceConfig::SpacenavSim(_)
            | SourceConfig::X11Cursor(_)
            | SourceConfig::X11Clipboard(_)
            | SourceConfig::WaylandClipboard(_)
            | SourceConfig::GnomeClipboard(_)
            | SourceConfig::WaylandWindowInput(_)
            | SourceConfig::Stdin(_)
            | SourceConfig::Serial(_)
            | SourceConfig::Pty(_)
            | SourceConfig::Rfc2217Server(_)
            | SourceConfig::Rfc2217Client(_)
            | SourceConfig::PulseCapture(_) => true,
            SourceConfig::Synthetic(_)
            | SourceConfig::File(_)
            | SourceConfig::X11Screen(_)
            | SourceConfig::WaylandScreen(_)
            | SourceConfig::GnomeScreen(_)
            | SourceConfig::PortalScreen(_)
            | SourceConfig::CameraSim(_)
            | SourceConfig::V4l2(_) => false,
        }
    }

    /// Whether what this source produced while the link was down is worth sending after the
    /// reconnect. Not for input devices: their state matters, not their history (the app side
    /// released every held key and button when the link went; a click or keys typed into a
    /// frozen viewer must not be replayed seconds later).
    pub fn replays_outage(&self) -> bool {
        match self {
            SourceConfig::Evdev(_)
            | SourceConfig::X11Input(_)
            | SourceConfig::WaylandWindowInput(_) => false,
            SourceConfig::Synthetic(_)
            | SourceConfig::SpacenavSim(_)
            | SourceConfig::Stdin(_)
            | SourceConfig::File(_)
            | SourceConfig::Serial(_)
            | SourceConfig::Pty(_)
            | SourceConfig::X11Screen(_)
            | SourceConfig::WaylandScreen(_)
            | SourceConfig::GnomeScreen(_)
            | SourceConfig::PortalScreen(_)
            | SourceConfig::X11Cursor(_)
            | SourceConfig::X11Clipboard(_)
            | SourceConfig::WaylandClipboard(_)
            | SourceConfig::GnomeClipboard(_)
            | SourceConfig::Rfc2217Server(_)
            | SourceConfig::Rfc2217Client(_) => true,
            // Sound is only worth hearing now.
            SourceConfig::PulseCapture(_) => false,
            SourceConfig::CameraSim(_) => true,
            // A live camera: what it saw while the link was down is stale.
            SourceConfig::V4l2(_) => false,
        }
    }

    /// The `type` key.
    pub fn name(&self) -> &'static str {
        self.info().name
    }

    /// Every file-system path among the parameters (so a config loader can resolve relative
    /// ones against the config file's directory).
    pub fn paths_mut(&mut self) -> Vec<&mut PathBuf> {
        match self {
            SourceConfig::File(c) => vec![&mut c.path],
            SourceConfig::Serial(c) => vec![&mut c.path],
            SourceConfig::Pty(c) => vec![&mut c.link],
            SourceConfig::Evdev(c) => vec![&mut c.path],
            SourceConfig::V4l2(c) => vec![&mut c.path],
            SourceConfig::PortalScreen(c) => c.token_file.iter_mut().collect(),
            SourceConfig::Synthetic(_)
            | SourceConfig::SpacenavSim(_)
            | SourceConfig::Stdin(_)
            | SourceConfig::X11Input(_)
            | SourceConfig::WaylandWindowInput(_)
            | SourceConfig::X11Screen(_)
            | SourceConfig::WaylandScreen(_)
            | SourceConfig::GnomeScreen(_)
            | SourceConfig::X11Cursor(_)
            | SourceConfig::X11Clipboard(_)
            | SourceConfig::WaylandClipboard(_)
            | SourceConfig::GnomeClipboard(_)
            | SourceConfig::Rfc2217Server(_)
            | SourceConfig::Rfc2217Client(_)
            | SourceConfig::PulseCapture(_)
            | SourceConfig::CameraSim(_) => vec![],
        }
    }

    /// The catalogue entry.
    pub fn info(&self) -> &'static EndpointInfo {
        match self {
            SourceConfig::Synthetic(_) => &SOURCES[0],
            SourceConfig::SpacenavSim(_) => &SOURCES[1],
            SourceConfig::Stdin(_) => &SOURCES[2],
            SourceConfig::File(_) => &SOURCES[3],
            SourceConfig::Serial(_) => &SOURCES[4],
            SourceConfig::Pty(_) => &SOURCES[5],
            SourceConfig::Evdev(_) => &SOURCES[6],
            SourceConfig::X11Input(_) => &SOURCES[7],
            SourceConfig::X11Screen(_) => &SOURCES[8],
            SourceConfig::X11Cursor(_) => &SOURCES[9],
            SourceConfig::X11Clipboard(_) => &SOURCES[10],
            SourceConfig::Rfc2217Server(_) => &SOURCES[11],
            SourceConfig::Rfc2217Client(_) => &SOURCES[12],
            SourceConfig::PulseCapture(_) => &SOURCES[13],
            SourceConfig::CameraSim(_) => &SOURCES[14],
            SourceConfig::V4l2(_) => &SOURCES[15],
            SourceConfig::WaylandScreen(_) => &SOURCES[16],
            SourceConfig::GnomeScreen(_) => &SOURCES[19],
            SourceConfig::PortalScreen(_) => &SOURCES[21],
            SourceConfig::WaylandClipboard(_) => &SOURCES[17],
            SourceConfig::WaylandWindowInput(_) => &SOURCES[18],
            SourceConfig::GnomeClipboard(_) => &SOURCES[20],
        }
    }

    /// The name used in error messages and logs, e.g. `file source`.
    pub fn endpoint(&self) -> &'static str {
        match self {
            SourceConfig::Synthetic(_) => "synthetic source",
            SourceConfig::SpacenavSim(_) => "spacenav-sim source",
            SourceConfig::Stdin(_) => "stdin source",
            SourceConfig::File(_) => "file source",
            SourceConfig::Serial(_) => "serial source",
            SourceConfig::Pty(_) => "pty source",
            SourceConfig::Evdev(_) => "evdev source",
            SourceConfig::X11Input(_) => "x11-input source",
            SourceConfig::X11Screen(_) => "x11-screen source",
            SourceConfig::X11Cursor(_) => "x11-cursor source",
            SourceConfig::X11Clipboard(_) => "x11-clipboard source",
            SourceConfig::Rfc2217Server(_) => "rfc2217-server source",
            SourceConfig::Rfc2217Client(_) => "rfc2217-client source",
            SourceConfig::PulseCapture(_) => "pulse-capture source",
            SourceConfig::CameraSim(_) => "camera-sim source",
            SourceConfig::V4l2(_) => "v4l2 source",
            SourceConfig::WaylandScreen(_) => "wayland-screen source",
            SourceConfig::GnomeScreen(_) => "gnome-screen source",
            SourceConfig::PortalScreen(_) => "portal-screen source",
            SourceConfig::WaylandClipboard(_) => "wayland-clipboard source",
            SourceConfig::GnomeClipboard(_) => "gnome-clipboard source",
            SourceConfig::WaylandWindowInput(_) => "wayland-window-input source",
        }
    }

    /// Short human text, e.g. `synthetic(size=100, interval_ms=16)`.
    pub fn describe(&self) -> String {
        match self {
            SourceConfig::Synthetic(c) => {
                let mut s = format!("synthetic(size={}, interval_ms={}", c.size, c.interval_ms);
                fmt_opt(&mut s, "count", c.count);
                fmt_opt(&mut s, "seed", Some(c.seed).filter(|&s| s != 1));
                if c.repeat {
                    s += ", repeat=true";
                }
                s + ")"
            }
            SourceConfig::SpacenavSim(c) => {
                let mut s = format!("spacenav-sim(rate_hz={}", c.rate_hz);
                fmt_opt(&mut s, "count", c.count);
                fmt_opt(&mut s, "seed", Some(c.seed).filter(|&s| s != 1));
                s + ")"
            }
            SourceConfig::Stdin(c) => format!("stdin(framing={})", c.framing),
            SourceConfig::File(c) => {
                format!("file(path={}, framing={})", c.path.display(), c.framing)
            }
            SourceConfig::Serial(c) => describe_serial(c),
            SourceConfig::Pty(c) => describe_pty(c),
            SourceConfig::Evdev(c) => format!(
                "evdev(path={}{})",
                c.path.display(),
                if c.grab { ", grab" } else { "" }
            ),
            SourceConfig::X11Input(c) => {
                format!("x11-input(display={}, window={})", c.display, c.window)
            }
            SourceConfig::X11Screen(c) => {
                let mut s = format!("x11-screen(display={}, max_fps={}", c.display, c.max_fps);
                fmt_opt(&mut s, "refresh_s", Some(c.refresh_s).filter(|&r| r != 0.0));
                s + ")"
            }
            SourceConfig::WaylandScreen(c) => {
                let mut s = format!(
                    "wayland-screen(display={}, max_fps={}",
                    if c.display.is_empty() {
                        "$WAYLAND_DISPLAY"
                    } else {
                        c.display.as_str()
                    },
                    c.max_fps
                );
                fmt_opt(&mut s, "output", c.output.as_deref());
                fmt_opt(&mut s, "refresh_s", Some(c.refresh_s).filter(|&r| r != 0.0));
                fmt_opt(&mut s, "protocol", c.protocol.named());
                s + ")"
            }
            SourceConfig::GnomeScreen(c) => {
                let mut s = format!(
                    "gnome-screen(bus={}, max_fps={}",
                    if c.bus.is_empty() {
                        "$DBUS_SESSION_BUS_ADDRESS"
                    } else {
                        c.bus.as_str()
                    },
                    c.max_fps
                );
                fmt_opt(&mut s, "monitor", c.monitor.as_deref());
                fmt_opt(
                    &mut s,
                    "pipewire",
                    Some(c.pipewire.as_str()).filter(|p| !p.is_empty()),
                );
                fmt_opt(&mut s, "refresh_s", Some(c.refresh_s).filter(|&r| r != 0.0));
                s + ")"
            }
            SourceConfig::PortalScreen(c) => {
                let mut s = format!(
                    "portal-screen(bus={}, max_fps={}",
                    if c.bus.is_empty() {
                        "$DBUS_SESSION_BUS_ADDRESS"
                    } else {
                        c.bus.as_str()
                    },
                    c.max_fps
                );
                let token = c.token_path().map(|p| p.display().to_string());
                fmt_opt(&mut s, "token_file", token.as_deref());
                fmt_opt(&mut s, "refresh_s", Some(c.refresh_s).filter(|&r| r != 0.0));
                s + ")"
            }
            SourceConfig::X11Cursor(c) => format!("x11-cursor(display={})", c.display),
            SourceConfig::X11Clipboard(c) => describe_x11_clipboard(c),
            SourceConfig::WaylandClipboard(c) => describe_wayland_clipboard(c),
            SourceConfig::GnomeClipboard(c) => describe_gnome_clipboard(c),
            SourceConfig::WaylandWindowInput(c) => format!(
                "wayland-window-input(display={})",
                if c.display.is_empty() {
                    "$WAYLAND_DISPLAY"
                } else {
                    c.display.as_str()
                }
            ),
            SourceConfig::Rfc2217Server(c) => describe_rfc2217_server(c),
            SourceConfig::Rfc2217Client(c) => describe_rfc2217_client(c),
            SourceConfig::PulseCapture(c) => {
                let what = match (&c.device, &c.virtual_sink) {
                    (_, Some(v)) => format!("virtual_sink={v}, "),
                    (Some(d), None) => format!("device={d}, "),
                    (None, None) => String::new(),
                };
                format!(
                    "pulse-capture({what}{} Hz, {} ch, {} ms)",
                    c.rate, c.channels, c.frame_ms
                )
            }
            SourceConfig::CameraSim(c) => {
                let mut s = format!("camera-sim({}x{}, fps={}", c.width, c.height, c.fps);
                fmt_opt(&mut s, "count", c.count);
                s + ")"
            }
            SourceConfig::V4l2(c) => {
                let mut s = format!(
                    "v4l2(path={}, {}x{}, fps={}, format={:?}",
                    c.path.display(),
                    c.width,
                    c.height,
                    c.fps,
                    c.format
                )
                .to_lowercase();
                fmt_opt(&mut s, "count", c.count);
                s + ")"
            }
        }
    }

    /// Checks parameter ranges; the error names the endpoint, the key and the allowed range.
    pub fn validate(&self) -> Result<(), EndpointError> {
        let endpoint = self.endpoint();
        let bad = |param, reason: &str| {
            Err(EndpointError::Config {
                endpoint,
                param,
                reason: reason.to_string(),
            })
        };
        match self {
            SourceConfig::Synthetic(c) => {
                if c.size > MAX_LENGTH_FRAME {
                    return bad("size", "must be at most 67108864 (64 MiB)");
                }
                if !(c.interval_ms.is_finite() && c.interval_ms >= 0.0) {
                    return bad("interval_ms", "must be a finite number >= 0");
                }
            }
            SourceConfig::SpacenavSim(c) => {
                if !(c.rate_hz.is_finite() && c.rate_hz > 0.0) {
                    return bad("rate_hz", "must be a finite number > 0");
                }
            }
            SourceConfig::X11Screen(X11ScreenConfig {
                max_fps, refresh_s, ..
            })
            | SourceConfig::WaylandScreen(WaylandScreenConfig {
                max_fps, refresh_s, ..
            })
            | SourceConfig::GnomeScreen(GnomeScreenConfig {
                max_fps, refresh_s, ..
            })
            | SourceConfig::PortalScreen(PortalScreenConfig {
                max_fps, refresh_s, ..
            }) => {
                if let SourceConfig::PortalScreen(c) = self {
                    if !(c.grant_wait_s > 0.0 && c.grant_wait_s <= 86400.0) {
                        return bad("grant_wait_s", "must be a number > 0 and <= 86400 (a day)");
                    }
                }
                if !(max_fps.is_finite() && *max_fps > 0.0) {
                    return bad("max_fps", "must be a finite number > 0");
                }
                if !(refresh_s.is_finite() && *refresh_s >= 0.0) {
                    return bad("refresh_s", "must be a finite number >= 0 (0 = off)");
                }
            }
            SourceConfig::Stdin(_)
            | SourceConfig::File(_)
            | SourceConfig::Evdev(_)
            | SourceConfig::X11Input(_)
            | SourceConfig::WaylandWindowInput(_)
            | SourceConfig::X11Cursor(_) => {}
            SourceConfig::X11Clipboard(c) => check_clipboard(endpoint, &c.selections, c.max_bytes)?,
            SourceConfig::WaylandClipboard(c) => {
                check_clipboard(endpoint, &c.selections, c.max_bytes)?
            }
            SourceConfig::GnomeClipboard(c) => check_clipboard(endpoint, &[], c.max_bytes)?,
            SourceConfig::Serial(c) => check_settings(endpoint, &c.settings())?,
            SourceConfig::Pty(c) => check_pty(endpoint, c)?,
            SourceConfig::Rfc2217Server(c) => check_rfc2217_server(endpoint, c)?,
            SourceConfig::Rfc2217Client(c) => check_rfc2217_client(endpoint, c)?,
            SourceConfig::PulseCapture(c) => {
                if let Err((param, reason)) = c.check() {
                    return Err(EndpointError::Config {
                        endpoint,
                        param,
                        reason,
                    });
                }
            }
            SourceConfig::CameraSim(c) => {
                if let Err((param, reason)) = c.check() {
                    return bad(param, reason);
                }
            }
            SourceConfig::V4l2(c) => {
                if let Err((param, reason)) = c.check() {
                    return bad(param, reason);
                }
            }
        }
        Ok(())
    }

    /// Starts the source on the current tokio runtime; its frames (stream `stream`) go to
    /// `tx`. Invalid parameters, a file that cannot be opened and a missing runtime are
    /// errors here, before anything is spawned.
    pub fn spawn(&self, stream: u16, tx: Sender<Frame>) -> Result<SourceTask, EndpointError> {
        self.spawn_on_demand(stream, tx, None)
    }

    /// Whether this source captures on [`Demand`] (see [`SourceConfig::spawn_on_demand`]).
    pub fn captures_on_demand(&self) -> bool {
        matches!(
            self,
            SourceConfig::X11Screen(_)
                | SourceConfig::WaylandScreen(_)
                | SourceConfig::GnomeScreen(_)
                | SourceConfig::PortalScreen(_)
        )
    }

    /// [`SourceConfig::spawn`], with the driver's [`Demand`] for a source that
    /// [captures on demand](SourceConfig::captures_on_demand): it then captures only when the
    /// session wants a frame. Without one (or for other sources) it captures when its
    /// previous frame has left the channel.
    pub fn spawn_on_demand(
        &self,
        stream: u16,
        tx: Sender<Frame>,
        demand: Option<Demand>,
    ) -> Result<SourceTask, EndpointError> {
        self.validate()?;
        let endpoint = self.endpoint();
        let rt = tokio::runtime::Handle::try_current()
            .map_err(|_| EndpointError::NoRuntime { endpoint })?;
        tracing::debug!(endpoint, stream, config = %self.describe(), "source starting");
        match self {
            SourceConfig::Synthetic(c) => {
                synthetic::spawn_synthetic_source(&rt, endpoint, c, stream, tx)
            }
            SourceConfig::SpacenavSim(c) => {
                synthetic::spawn_spacenav_sim_source(&rt, endpoint, c, stream, tx)
            }
            SourceConfig::Stdin(c) => stdio::spawn_stdin_source(&rt, endpoint, c, stream, tx),
            SourceConfig::File(c) => file::spawn_file_source(&rt, endpoint, c, stream, tx),
            SourceConfig::Serial(c) => serial::spawn_serial_source(&rt, endpoint, c, stream, tx),
            SourceConfig::Pty(c) => serial::spawn_pty_source(&rt, endpoint, c, stream, tx),
            SourceConfig::Evdev(c) => input::spawn_evdev_source(&rt, endpoint, c, stream, tx),
            SourceConfig::X11Input(c) => {
                input::spawn_x11_input_source(&rt, endpoint, c, stream, tx)
            }
            SourceConfig::X11Screen(c) => {
                display::spawn_x11_screen_source(&rt, endpoint, c, stream, tx, demand)
            }
            SourceConfig::WaylandScreen(c) => {
                display::spawn_wayland_screen_source(&rt, endpoint, c, stream, tx, demand)
            }
            SourceConfig::GnomeScreen(c) => {
                display::spawn_gnome_screen_source(&rt, endpoint, c, stream, tx, demand)
            }
            SourceConfig::PortalScreen(c) => {
                display::spawn_portal_screen_source(&rt, endpoint, c, stream, tx, demand)
            }
            SourceConfig::WaylandClipboard(c) => {
                clipboard::spawn_wayland_clipboard_source(&rt, endpoint, c, stream, tx)
            }
            SourceConfig::GnomeClipboard(c) => {
                clipboard::spawn_gnome_clipboard_source(&rt, endpoint, c, stream, tx)
            }
            SourceConfig::WaylandWindowInput(c) => {
                input::spawn_wayland_window_input_source(&rt, endpoint, c, stream, tx)
            }
            SourceConfig::X11Cursor(c) => {
                display::spawn_x11_cursor_source(&rt, endpoint, c, stream, tx)
            }
            SourceConfig::X11Clipboard(c) => {
                clipboard::spawn_x11_clipboard_source(&rt, endpoint, c, stream, tx)
            }
            SourceConfig::Rfc2217Server(c) => {
                let port = rfc2217::Rfc2217::server(&rt, endpoint, c)?;
                rfc2217::spawn_rfc2217_source(&rt, endpoint, port, stream, tx)
            }
            SourceConfig::Rfc2217Client(c) => {
                let port = rfc2217::Rfc2217::client(&rt, endpoint, c)?;
                rfc2217::spawn_rfc2217_source(&rt, endpoint, port, stream, tx)
            }
            SourceConfig::PulseCapture(c) => {
                audio::spawn_pulse_capture(&rt, endpoint, c, stream, tx)
            }
            SourceConfig::CameraSim(c) => camera::spawn_camera_sim(&rt, endpoint, c, stream, tx),
            SourceConfig::V4l2(c) => camera::v4l2::spawn_v4l2(&rt, endpoint, c, stream, tx),
        }
    }
}

impl SinkConfig {
    /// The `type` key.
    pub fn name(&self) -> &'static str {
        self.info().name
    }

    /// Every file-system path among the parameters (see [`SourceConfig::paths_mut`]).
    pub fn paths_mut(&mut self) -> Vec<&mut PathBuf> {
        match self {
            SinkConfig::File(c) => vec![&mut c.path],
            SinkConfig::Serial(c) => vec![&mut c.path],
            SinkConfig::Pty(c) => vec![&mut c.link],
            SinkConfig::Framebuffer(c) => vec![&mut c.path],
            SinkConfig::Stdout(_)
            | SinkConfig::Check(_)
            | SinkConfig::Null(_)
            | SinkConfig::Uinput(_)
            | SinkConfig::Xtest(_)
            | SinkConfig::X11Window(_)
            | SinkConfig::X11Cursor(_)
            | SinkConfig::X11Clipboard(_)
            | SinkConfig::WaylandClipboard(_)
            | SinkConfig::Rfc2217Server(_)
            | SinkConfig::Rfc2217Client(_)
            | SinkConfig::PulsePlayback(_)
            | SinkConfig::WaylandInput(_)
            | SinkConfig::GnomeInput(_)
            | SinkConfig::KdeInput(_)
            | SinkConfig::GnomeClipboard(_)
            | SinkConfig::WaylandWindow(_) => vec![],
            SinkConfig::PortalInput(c) => c.token_file.iter_mut().collect(),
            SinkConfig::Y4m(c) => vec![&mut c.path],
            SinkConfig::V4l2loopback(c) => vec![&mut c.path],
        }
    }

    /// The catalogue entry.
    pub fn info(&self) -> &'static EndpointInfo {
        match self {
            SinkConfig::Stdout(_) => &SINKS[0],
            SinkConfig::File(_) => &SINKS[1],
            SinkConfig::Check(_) => &SINKS[2],
            SinkConfig::Null(_) => &SINKS[3],
            SinkConfig::Serial(_) => &SINKS[4],
            SinkConfig::Pty(_) => &SINKS[5],
            SinkConfig::Uinput(_) => &SINKS[6],
            SinkConfig::Xtest(_) => &SINKS[7],
            SinkConfig::X11Window(_) => &SINKS[8],
            SinkConfig::X11Cursor(_) => &SINKS[10],
            SinkConfig::Framebuffer(_) => &SINKS[9],
            SinkConfig::X11Clipboard(_) => &SINKS[11],
            SinkConfig::Rfc2217Server(_) => &SINKS[12],
            SinkConfig::Rfc2217Client(_) => &SINKS[13],
            SinkConfig::PulsePlayback(_) => &SINKS[14],
            SinkConfig::Y4m(_) => &SINKS[15],
            SinkConfig::V4l2loopback(_) => &SINKS[16],
            SinkConfig::WaylandInput(_) => &SINKS[17],
            SinkConfig::WaylandClipboard(_) => &SINKS[18],
            SinkConfig::WaylandWindow(_) => &SINKS[19],
            SinkConfig::GnomeInput(_) => &SINKS[20],
            SinkConfig::GnomeClipboard(_) => &SINKS[21],
            SinkConfig::KdeInput(_) => &SINKS[22],
            SinkConfig::PortalInput(_) => &SINKS[23],
        }
    }

    /// The name used in error messages and logs, e.g. `file sink`.
    pub fn endpoint(&self) -> &'static str {
        match self {
            SinkConfig::Stdout(_) => "stdout sink",
            SinkConfig::File(_) => "file sink",
            SinkConfig::Check(_) => "check sink",
            SinkConfig::Null(_) => "null sink",
            SinkConfig::Serial(_) => "serial sink",
            SinkConfig::Pty(_) => "pty sink",
            SinkConfig::Uinput(_) => "uinput sink",
            SinkConfig::Xtest(_) => "xtest sink",
            SinkConfig::WaylandInput(_) => "wayland-input sink",
            SinkConfig::GnomeInput(_) => "gnome-input sink",
            SinkConfig::PortalInput(_) => "portal-input sink",
            SinkConfig::KdeInput(_) => "kde-input sink",
            SinkConfig::WaylandClipboard(_) => "wayland-clipboard sink",
            SinkConfig::GnomeClipboard(_) => "gnome-clipboard sink",
            SinkConfig::WaylandWindow(_) => "wayland-window sink",
            SinkConfig::X11Window(_) => "x11-window sink",
            SinkConfig::X11Cursor(_) => "x11-cursor sink",
            SinkConfig::X11Clipboard(_) => "x11-clipboard sink",
            SinkConfig::Rfc2217Server(_) => "rfc2217-server sink",
            SinkConfig::Rfc2217Client(_) => "rfc2217-client sink",
            SinkConfig::PulsePlayback(_) => "pulse-playback sink",
            SinkConfig::Y4m(_) => "y4m sink",
            SinkConfig::V4l2loopback(_) => "v4l2loopback sink",
            SinkConfig::Framebuffer(_) => "framebuffer sink",
        }
    }

    /// Short human text, e.g. `file(path=/tmp/out, framing=lines, append)`.
    pub fn describe(&self) -> String {
        match self {
            SinkConfig::Stdout(c) => format!("stdout(framing={})", c.framing),
            SinkConfig::File(c) => format!(
                "file(path={}, framing={}{})",
                c.path.display(),
                c.framing,
                if c.append { ", append" } else { "" }
            ),
            SinkConfig::Check(c) => {
                let mut s = String::new();
                fmt_opt(&mut s, "seed", c.seed);
                fmt_opt(&mut s, "size", c.size);
                fmt_opt(&mut s, "expect", c.expect);
                match s.strip_prefix(", ") {
                    Some(args) => format!("check({args})"),
                    None => "check".to_string(),
                }
            }
            SinkConfig::Null(_) => "null".to_string(),
            SinkConfig::Serial(c) => describe_serial(c),
            SinkConfig::Pty(c) => describe_pty(c),
            SinkConfig::Uinput(c) => format!("uinput(name={})", c.name),
            SinkConfig::Xtest(c) => format!("xtest(display={})", c.display),
            SinkConfig::KdeInput(c) => format!(
                "kde-input(display={})",
                if c.display.is_empty() {
                    "$WAYLAND_DISPLAY"
                } else {
                    c.display.as_str()
                }
            ),
            SinkConfig::WaylandInput(c) => format!(
                "wayland-input(display={})",
                if c.display.is_empty() {
                    "$WAYLAND_DISPLAY"
                } else {
                    c.display.as_str()
                }
            ),
            SinkConfig::GnomeInput(c) => {
                let mut s = format!(
                    "gnome-input(bus={}",
                    if c.bus.is_empty() {
                        "$DBUS_SESSION_BUS_ADDRESS"
                    } else {
                        c.bus.as_str()
                    }
                );
                fmt_opt(&mut s, "monitor", c.monitor.as_deref());
                s + ")"
            }
            SinkConfig::PortalInput(c) => {
                let mut s = format!(
                    "portal-input(bus={}",
                    if c.bus.is_empty() {
                        "$DBUS_SESSION_BUS_ADDRESS"
                    } else {
                        c.bus.as_str()
                    }
                );
                let token = c.token_path().map(|p| p.display().to_string());
                fmt_opt(&mut s, "token_file", token.as_deref());
                fmt_opt(&mut s, "via", c.via.named());
                s + ")"
            }
            SinkConfig::X11Window(c) => {
                format!("x11-window(display={}, title={})", c.display, c.title)
            }
            SinkConfig::WaylandWindow(c) => format!(
                "wayland-window(display={}, title={})",
                if c.display.is_empty() {
                    "$WAYLAND_DISPLAY"
                } else {
                    c.display.as_str()
                },
                c.title
            ),
            SinkConfig::Framebuffer(c) => format!("framebuffer(path={})", c.path.display()),
            SinkConfig::X11Cursor(c) => format!("x11-cursor(display={})", c.display),
            SinkConfig::X11Clipboard(c) => describe_x11_clipboard(c),
            SinkConfig::WaylandClipboard(c) => describe_wayland_clipboard(c),
            SinkConfig::GnomeClipboard(c) => describe_gnome_clipboard(c),
            SinkConfig::Rfc2217Server(c) => describe_rfc2217_server(c),
            SinkConfig::Rfc2217Client(c) => describe_rfc2217_client(c),
            SinkConfig::PulsePlayback(c) => {
                let what = match (&c.device, &c.virtual_source) {
                    (_, Some(v)) => format!("virtual_source={v}, "),
                    (Some(d), None) => format!("device={d}, "),
                    (None, None) => String::new(),
                };
                format!("pulse-playback({what}latency_ms={})", c.latency_ms)
            }
            SinkConfig::Y4m(c) => format!("y4m(path={}, fps={})", c.path.display(), c.fps),
            SinkConfig::V4l2loopback(c) => format!("v4l2loopback(path={})", c.path.display()),
        }
    }

    /// Checks parameter ranges; the error names the endpoint, the key and the allowed range.
    pub fn validate(&self) -> Result<(), EndpointError> {
        let endpoint = self.endpoint();
        match self {
            SinkConfig::Serial(c) => check_settings(endpoint, &c.settings()),
            SinkConfig::Pty(c) => check_pty(endpoint, c),
            SinkConfig::Uinput(c) => {
                if c.name.is_empty() || c.name.len() > 79 || c.name.contains('\0') {
                    Err(EndpointError::Config {
                        endpoint,
                        param: "name",
                        reason: "must be 1 to 79 bytes without NUL".to_string(),
                    })
                } else {
                    Ok(())
                }
            }
            SinkConfig::WaylandWindow(c) if c.title.contains('\0') => Err(EndpointError::Config {
                endpoint,
                param: "title",
                reason: "must not contain NUL".to_string(),
            }),
            SinkConfig::WaylandWindow(_) => Ok(()),
            SinkConfig::X11Window(c) => {
                if c.title.contains('\0') {
                    Err(EndpointError::Config {
                        endpoint,
                        param: "title",
                        reason: "must not contain NUL".to_string(),
                    })
                } else {
                    Ok(())
                }
            }
            SinkConfig::Stdout(_)
            | SinkConfig::File(_)
            | SinkConfig::Check(_)
            | SinkConfig::Null(_)
            | SinkConfig::Xtest(_)
            | SinkConfig::WaylandInput(_)
            | SinkConfig::GnomeInput(_)
            | SinkConfig::KdeInput(_)
            | SinkConfig::Framebuffer(_)
            | SinkConfig::X11Cursor(_) => Ok(()),
            SinkConfig::PortalInput(c) => {
                if c.grant_wait_s > 0.0 && c.grant_wait_s <= 86400.0 {
                    Ok(())
                } else {
                    Err(EndpointError::Config {
                        endpoint,
                        param: "grant_wait_s",
                        reason: "must be a number > 0 and <= 86400 (a day)".into(),
                    })
                }
            }
            SinkConfig::X11Clipboard(c) => check_clipboard(endpoint, &c.selections, c.max_bytes),
            SinkConfig::WaylandClipboard(c) => {
                check_clipboard(endpoint, &c.selections, c.max_bytes)
            }
            SinkConfig::GnomeClipboard(c) => check_clipboard(endpoint, &[], c.max_bytes),
            SinkConfig::Rfc2217Server(c) => check_rfc2217_server(endpoint, c),
            SinkConfig::Rfc2217Client(c) => check_rfc2217_client(endpoint, c),
            SinkConfig::PulsePlayback(c) => {
                c.check().map_err(|(param, reason)| EndpointError::Config {
                    endpoint,
                    param,
                    reason,
                })
            }
            SinkConfig::Y4m(c) => c.check().map_err(|(param, reason)| EndpointError::Config {
                endpoint,
                param,
                reason: reason.to_string(),
            }),
            SinkConfig::V4l2loopback(_) => Ok(()),
        }
    }

    /// For input-device sinks (uinput, XTEST): the record that releases every held key and
    /// button, injected when the link to the device is lost. `None` for other sinks.
    pub fn release_record(&self) -> Option<Vec<u8>> {
        match self {
            SinkConfig::Uinput(_)
            | SinkConfig::Xtest(_)
            | SinkConfig::WaylandInput(_)
            | SinkConfig::GnomeInput(_)
            | SinkConfig::PortalInput(_)
            | SinkConfig::KdeInput(_) => Some(input::InputMessage::release_all_payload().to_vec()),
            _ => None,
        }
    }

    /// Whether the sink shows the link's state (`x11-window`, `wayland-window`: a dimmed image
    /// and a title while the link is down): the session then puts display link-state records
    /// (`ndd_wire::display::LinkState`) in front of it.
    pub fn shows_link_state(&self) -> bool {
        matches!(
            self,
            SinkConfig::X11Window(_) | SinkConfig::WaylandWindow(_)
        )
    }

    /// Starts the sink on the current tokio runtime, consuming `rx` until every sender is gone.
    /// A file that cannot be created and a missing runtime are errors here, before anything
    /// is spawned.
    pub fn spawn(&self, rx: Receiver<Frame>) -> Result<SinkTask, EndpointError> {
        self.spawn_tracked(rx, Delivered::default())
    }

    /// [`spawn`](SinkConfig::spawn), marking in `delivered` every frame (by `meta.seq`) once
    /// the sink has completed it: its effect done as far as this process can tell (written
    /// and flushed, injected, drawn, checked, counted, or dropped as an invalid record).
    pub fn spawn_tracked(
        &self,
        rx: Receiver<Frame>,
        delivered: Delivered,
    ) -> Result<SinkTask, EndpointError> {
        self.validate()?;
        let endpoint = self.endpoint();
        let rt = tokio::runtime::Handle::try_current()
            .map_err(|_| EndpointError::NoRuntime { endpoint })?;
        tracing::debug!(endpoint, config = %self.describe(), "sink starting");
        match self {
            SinkConfig::Stdout(c) => stdio::spawn_stdout_sink(&rt, endpoint, c, rx, delivered),
            SinkConfig::File(c) => file::spawn_file_sink(&rt, endpoint, c, rx, delivered),
            SinkConfig::Check(c) => check::spawn_check_sink(&rt, endpoint, c, rx, delivered),
            SinkConfig::Null(_) => check::spawn_null_sink(&rt, endpoint, rx, delivered),
            SinkConfig::Serial(c) => serial::spawn_serial_sink(&rt, endpoint, c, rx, delivered),
            SinkConfig::Pty(c) => serial::spawn_pty_sink(&rt, endpoint, c, rx, delivered),
            SinkConfig::Uinput(c) => input::spawn_uinput_sink(&rt, endpoint, c, rx, delivered),
            SinkConfig::Xtest(c) => input::spawn_xtest_sink(&rt, endpoint, c, rx, delivered),
            SinkConfig::WaylandInput(c) => {
                input::spawn_wayland_input_sink(&rt, endpoint, c, rx, delivered)
            }
            SinkConfig::GnomeInput(c) => {
                input::spawn_gnome_input_sink(&rt, endpoint, c, rx, delivered)
            }
            SinkConfig::PortalInput(c) => {
                input::spawn_portal_input_sink(&rt, endpoint, c, rx, delivered)
            }
            SinkConfig::KdeInput(c) => input::spawn_kde_input_sink(&rt, endpoint, c, rx, delivered),
            SinkConfig::WaylandClipboard(c) => {
                clipboard::spawn_wayland_clipboard_sink(&rt, endpoint, c, rx, delivered)
            }
            SinkConfig::GnomeClipboard(c) => {
                clipboard::spawn_gnome_clipboard_sink(&rt, endpoint, c, rx, delivered)
            }
            SinkConfig::X11Window(c) => {
                display::spawn_x11_window_sink(&rt, endpoint, c, rx, delivered)
            }
            SinkConfig::WaylandWindow(c) => {
                display::spawn_wayland_window_sink(&rt, endpoint, c, rx, delivered)
            }
            SinkConfig::Framebuffer(c) => {
                display::spawn_framebuffer_sink(&rt, endpoint, c, rx, delivered)
            }
            SinkConfig::X11Cursor(c) => {
                display::spawn_x11_cursor_sink(&rt, endpoint, c, rx, delivered)
            }
            SinkConfig::X11Clipboard(c) => {
                clipboard::spawn_x11_clipboard_sink(&rt, endpoint, c, rx, delivered)
            }
            SinkConfig::Rfc2217Server(c) => {
                let port = rfc2217::Rfc2217::server(&rt, endpoint, c)?;
                rfc2217::spawn_rfc2217_sink(&rt, endpoint, port, rx, delivered)
            }
            SinkConfig::Rfc2217Client(c) => {
                let port = rfc2217::Rfc2217::client(&rt, endpoint, c)?;
                rfc2217::spawn_rfc2217_sink(&rt, endpoint, port, rx, delivered)
            }
            SinkConfig::PulsePlayback(c) => {
                audio::spawn_pulse_playback(&rt, endpoint, c, rx, delivered)
            }
            SinkConfig::Y4m(c) => camera::spawn_y4m(&rt, endpoint, c, rx, delivered),
            SinkConfig::V4l2loopback(c) => {
                camera::v4l2::spawn_v4l2loopback(&rt, endpoint, c, rx, delivered)
            }
        }
    }
}

#[cfg(test)]
mod config_tests;
#[cfg(test)]
mod sink_tests;
#[cfg(test)]
mod source_tests;

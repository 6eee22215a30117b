//! Parameters of the `x11-screen` source and the `x11-window` and `framebuffer` sinks, as
//! written in a config file.

use crate::common::x11::default_display;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

fn default_max_fps() -> f64 {
    30.0
}

/// `x11-screen` source parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct X11ScreenConfig {
    /// The X display.
    #[serde(default = "default_display")]
    pub display: String,
    /// At most this many updates per second.
    #[serde(default = "default_max_fps")]
    pub max_fps: f64,
    /// Seconds between keyframes of the whole screen; 0 = only the first.
    #[serde(default)]
    pub refresh_s: f64,
}

impl Default for X11ScreenConfig {
    fn default() -> Self {
        X11ScreenConfig {
            display: default_display(),
            max_fps: default_max_fps(),
            refresh_s: 0.0,
        }
    }
}

/// `wayland-screen` source parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaylandScreenConfig {
    /// The compositor's socket: a name in `$XDG_RUNTIME_DIR` (`wayland-1`) or a full path;
    /// empty: `$WAYLAND_DISPLAY`.
    #[serde(default)]
    pub display: String,
    /// The output captured, by name (`HEADLESS-1`, `DP-1`); none: the first.
    #[serde(default)]
    pub output: Option<String>,
    /// At most this many updates per second.
    #[serde(default = "default_max_fps")]
    pub max_fps: f64,
    /// Seconds between keyframes of the whole output; 0 = only the first.
    #[serde(default)]
    pub refresh_s: f64,
    /// The capture protocol: `auto` (the default) takes `ext-image-copy-capture-v1` where
    /// the compositor offers it, else `wlr-screencopy-unstable-v1`; `ext` or `wlr` only that
    /// one.
    #[serde(default)]
    pub protocol: WaylandProtocol,
}

/// The protocol family a Wayland endpoint speaks: `wayland-screen`'s capture
/// (ext-image-copy-capture or wlr-screencopy), `wayland-clipboard`'s data control
/// (ext-data-control or wlr-data-control).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WaylandProtocol {
    /// The ext protocol where offered (sway 1.11, wlroots 0.19 and later), else wlr's.
    #[default]
    Auto,
    /// The ext protocol only.
    Ext,
    /// The wlr protocol only.
    Wlr,
}

impl WaylandProtocol {
    /// Its name in a config, if not the default.
    pub fn named(self) -> Option<&'static str> {
        match self {
            WaylandProtocol::Auto => None,
            WaylandProtocol::Ext => Some("ext"),
            WaylandProtocol::Wlr => Some("wlr"),
        }
    }
}

impl Default for WaylandScreenConfig {
    fn default() -> Self {
        WaylandScreenConfig {
            display: String::new(),
            output: None,
            max_fps: default_max_fps(),
            refresh_s: 0.0,
            protocol: WaylandProtocol::Auto,
        }
    }
}

/// `gnome-screen` source parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GnomeScreenConfig {
    /// The session bus of the GNOME session (a D-Bus address, `unix:path=/run/user/1000/bus`);
    /// empty: `$DBUS_SESSION_BUS_ADDRESS`.
    #[serde(default)]
    pub bus: String,
    /// The monitor captured, by connector (`DP-1`, `eDP-1`, `Meta-0`); none: the primary one.
    #[serde(default)]
    pub monitor: Option<String>,
    /// The session's PipeWire socket (a full path, `/run/user/1000/pipewire-0`); empty: the
    /// session's own (`$PIPEWIRE_REMOTE`, or `pipewire-0` in `$XDG_RUNTIME_DIR`).
    #[serde(default)]
    pub pipewire: String,
    /// At most this many updates per second.
    #[serde(default = "default_max_fps")]
    pub max_fps: f64,
    /// Seconds between keyframes of the whole monitor; 0 = only the first.
    #[serde(default)]
    pub refresh_s: f64,
}

impl Default for GnomeScreenConfig {
    fn default() -> Self {
        GnomeScreenConfig {
            bus: String::new(),
            monitor: None,
            pipewire: String::new(),
            max_fps: default_max_fps(),
            refresh_s: 0.0,
        }
    }
}

/// `portal-screen` source parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortalScreenConfig {
    /// The desktop session's bus (a D-Bus address, `unix:path=/run/user/1000/bus`); empty:
    /// `$DBUS_SESSION_BUS_ADDRESS`.
    #[serde(default)]
    pub bus: String,
    /// Where the portal's restore token is kept between runs (the grant the person gave once
    /// in the desktop's screen-share dialog: with it the next start asks nobody); none:
    /// `portal-screen.token` in `$XDG_STATE_HOME/ndd` (`~/.local/state/ndd`).
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// How long a start waits for the person to answer the desktop's screen-share dialog.
    #[serde(default = "default_grant_wait_s")]
    pub grant_wait_s: f64,
    /// At most this many updates per second.
    #[serde(default = "default_max_fps")]
    pub max_fps: f64,
    /// Seconds between keyframes of the whole monitor; 0 = only the first.
    #[serde(default)]
    pub refresh_s: f64,
}

fn default_grant_wait_s() -> f64 {
    300.0
}

impl Default for PortalScreenConfig {
    fn default() -> Self {
        PortalScreenConfig {
            bus: String::new(),
            token_file: None,
            grant_wait_s: default_grant_wait_s(),
            max_fps: default_max_fps(),
            refresh_s: 0.0,
        }
    }
}

impl PortalScreenConfig {
    /// The restore token's file, as configured or by default (`None`: no `$XDG_STATE_HOME`
    /// or `$HOME` to put it in).
    pub fn token_path(&self) -> Option<PathBuf> {
        self.token_file
            .clone()
            .or_else(|| crate::common::state_file("portal-screen.token"))
    }
}

fn default_window_title() -> String {
    "ndd display".to_string()
}

/// `x11-window` sink parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct X11WindowConfig {
    /// The X display.
    #[serde(default = "default_display")]
    pub display: String,
    /// The window's title.
    #[serde(default = "default_window_title")]
    pub title: String,
    /// What resizing the window does: `scale` shows the app's screen scaled to it; `remote`
    /// asks the app side to give its screen the window's size (RandR), as RDP and xpra do.
    #[serde(default, skip_serializing_if = "Resize::is_scale")]
    pub resize: Resize,
    /// HiDPI: how many of this display's pixels one of the app's screen takes at first
    /// (`auto`: the display's `Xft.dpi` / 96, as desktops set it for a HiDPI screen; 1 when
    /// unset). The window still fits this display's screen.
    #[serde(default, skip_serializing_if = "ViewScale::is_auto")]
    pub scale: ViewScale,
}

/// `x11-window`'s `scale`: `"auto"` or a factor from 1 to 4.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "ViewScaleRepr", into = "ViewScaleRepr")]
pub enum ViewScale {
    /// From the display's `Xft.dpi`.
    #[default]
    Auto,
    /// This factor, in hundredths (100 to 400).
    Hundredths(u16),
}

impl ViewScale {
    fn is_auto(&self) -> bool {
        *self == ViewScale::Auto
    }

    /// The factor given, if any.
    pub fn factor(&self) -> Option<f64> {
        match self {
            ViewScale::Auto => None,
            ViewScale::Hundredths(h) => Some(f64::from(*h) / 100.0),
        }
    }
}

/// How `scale` is written: a word or a number.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ViewScaleRepr {
    /// `"auto"`.
    Word(String),
    /// A factor.
    Number(f64),
}

impl TryFrom<ViewScaleRepr> for ViewScale {
    type Error = String;

    fn try_from(r: ViewScaleRepr) -> Result<ViewScale, String> {
        match r {
            ViewScaleRepr::Word(w) if w == "auto" => Ok(ViewScale::Auto),
            ViewScaleRepr::Number(f) if (1.0..=4.0).contains(&f) => {
                Ok(ViewScale::Hundredths((f * 100.0).round() as u16))
            }
            ViewScaleRepr::Word(w) => Err(format!(
                "scale = {w:?}: give \"auto\" or a number from 1 to 4"
            )),
            ViewScaleRepr::Number(f) => Err(format!(
                "scale = {f}: give \"auto\" or a number from 1 to 4"
            )),
        }
    }
}

impl From<ViewScale> for ViewScaleRepr {
    fn from(s: ViewScale) -> ViewScaleRepr {
        match s {
            ViewScale::Auto => ViewScaleRepr::Word("auto".into()),
            ViewScale::Hundredths(h) => ViewScaleRepr::Number(f64::from(h) / 100.0),
        }
    }
}

/// `wayland-window` sink parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaylandWindowConfig {
    /// The compositor's socket: a name in `$XDG_RUNTIME_DIR` (`wayland-1`) or a full path;
    /// empty: `$WAYLAND_DISPLAY`.
    #[serde(default)]
    pub display: String,
    /// The window's title.
    #[serde(default = "default_window_title")]
    pub title: String,
}

impl Default for WaylandWindowConfig {
    fn default() -> Self {
        WaylandWindowConfig {
            display: String::new(),
            title: default_window_title(),
        }
    }
}

/// `x11-window`'s `resize`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Resize {
    /// The app's screen scaled to the window (aspect kept).
    #[default]
    Scale,
    /// The app's screen takes the window's size (through the `x11-input` source with
    /// `window = "viewer"` and the app side's `xtest` sink).
    Remote,
}

impl Resize {
    fn is_scale(&self) -> bool {
        *self == Resize::Scale
    }
}

impl Default for X11WindowConfig {
    fn default() -> Self {
        X11WindowConfig {
            display: default_display(),
            title: default_window_title(),
            resize: Resize::Scale,
            scale: ViewScale::Auto,
        }
    }
}

/// `x11-cursor` source parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct X11CursorSourceConfig {
    /// The X display whose cursor travels.
    #[serde(default = "default_display")]
    pub display: String,
}

impl Default for X11CursorSourceConfig {
    fn default() -> Self {
        X11CursorSourceConfig {
            display: default_display(),
        }
    }
}

/// `x11-cursor` sink parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct X11CursorSinkConfig {
    /// The X display of the viewer window (an `x11-window` sink of this display in the same
    /// process) whose cursor is set.
    #[serde(default = "default_display")]
    pub display: String,
}

impl Default for X11CursorSinkConfig {
    fn default() -> Self {
        X11CursorSinkConfig {
            display: default_display(),
        }
    }
}

/// `framebuffer` sink parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FramebufferConfig {
    /// The file or framebuffer device.
    pub path: PathBuf,
}

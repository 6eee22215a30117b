//! Parameters of the `evdev` and `x11-input` sources and the `uinput` and `xtest` sinks, as
//! written in a config file.

use crate::common::x11::default_display;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// `evdev` source parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvdevConfig {
    /// The event device (or a recording of one).
    pub path: PathBuf,
    /// Take the device exclusively (`EVIOCGRAB`).
    #[serde(default)]
    pub grab: bool,
}

/// Which events an `x11-input` source captures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum X11Window {
    /// XInput2 raw events of the whole display (every client's input).
    Root,
    /// A window of the screen's size, created and mapped by the source.
    #[default]
    Create,
    /// The window of the `x11-window` sink of the same display in this process: input typed
    /// into the remote desktop's viewer.
    Viewer,
}

impl std::fmt::Display for X11Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            X11Window::Root => "root",
            X11Window::Create => "create",
            X11Window::Viewer => "viewer",
        })
    }
}

/// `x11-input` source parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct X11InputConfig {
    /// The X display.
    #[serde(default = "default_display")]
    pub display: String,
    /// What to capture.
    #[serde(default)]
    pub window: X11Window,
}

impl Default for X11InputConfig {
    fn default() -> Self {
        X11InputConfig {
            display: default_display(),
            window: X11Window::default(),
        }
    }
}

fn default_uinput_name() -> String {
    "ndd remote input".to_string()
}

/// `uinput` sink parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UinputConfig {
    /// Device name the app sees.
    #[serde(default = "default_uinput_name")]
    pub name: String,
}

impl Default for UinputConfig {
    fn default() -> Self {
        UinputConfig {
            name: default_uinput_name(),
        }
    }
}

/// `wayland-input` sink parameters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaylandInputConfig {
    /// The compositor's socket: a name in `$XDG_RUNTIME_DIR` (`wayland-1`) or a full path;
    /// empty: `$WAYLAND_DISPLAY`.
    #[serde(default)]
    pub display: String,
}

/// `kde-input` sink parameters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KdeInputConfig {
    /// KWin's socket: a name in `$XDG_RUNTIME_DIR` (`wayland-0`) or a full path; empty:
    /// `$WAYLAND_DISPLAY`.
    #[serde(default)]
    pub display: String,
}

/// `gnome-input` sink parameters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GnomeInputConfig {
    /// The session bus of the GNOME session (a D-Bus address); empty:
    /// `$DBUS_SESSION_BUS_ADDRESS`.
    #[serde(default)]
    pub bus: String,
    /// The monitor absolute pointer positions are on, by connector; none: the primary one.
    #[serde(default)]
    pub monitor: Option<String>,
}

/// `portal-input` sink parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortalInputConfig {
    /// The desktop session's bus (a D-Bus address); empty: `$DBUS_SESSION_BUS_ADDRESS`.
    #[serde(default)]
    pub bus: String,
    /// Where the portal's restore token is kept between runs, where the portal keeps grants
    /// (RemoteDesktop version 2); none: `portal-input.token` in `$XDG_STATE_HOME/ndd`.
    #[serde(default)]
    pub token_file: Option<std::path::PathBuf>,
    /// How long a start waits for the person to answer the desktop's dialog.
    #[serde(default = "default_grant_wait_s")]
    pub grant_wait_s: f64,
    /// How input goes into the session: `auto` (the default) over EIS where the portal offers
    /// `ConnectToEIS`, else by the portal's Notify calls; `eis` or `notify` only that way.
    #[serde(default)]
    pub via: PortalVia,
}

/// How a `portal-input` sink hands input to the session.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PortalVia {
    /// EIS where the portal offers `ConnectToEIS` (xdg-desktop-portal 1.18 and later, on a
    /// desktop speaking libei's protocol), else the Notify calls.
    #[default]
    Auto,
    /// Over the EIS socket the portal hands out (`ConnectToEIS`) only.
    Eis,
    /// By the portal's Notify calls (one D-Bus call per event) only.
    Notify,
}

impl PortalVia {
    /// Its name in a config, if not the default.
    pub fn named(self) -> Option<&'static str> {
        match self {
            PortalVia::Auto => None,
            PortalVia::Eis => Some("eis"),
            PortalVia::Notify => Some("notify"),
        }
    }
}

fn default_grant_wait_s() -> f64 {
    300.0
}

impl Default for PortalInputConfig {
    fn default() -> Self {
        PortalInputConfig {
            bus: String::new(),
            token_file: None,
            grant_wait_s: default_grant_wait_s(),
            via: PortalVia::Auto,
        }
    }
}

impl PortalInputConfig {
    /// The restore token's file, as configured or by default (`None`: no `$XDG_STATE_HOME`
    /// or `$HOME` to put it in).
    pub fn token_path(&self) -> Option<std::path::PathBuf> {
        self.token_file
            .clone()
            .or_else(|| crate::common::state_file("portal-input.token"))
    }
}

/// `wayland-window-input` source parameters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaylandWindowInputConfig {
    /// The viewer's compositor, as its `wayland-window` sink names it (a name in
    /// `$XDG_RUNTIME_DIR` or a full path); empty: `$WAYLAND_DISPLAY`.
    #[serde(default)]
    pub display: String,
}

/// `xtest` sink parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct XtestConfig {
    /// The X display.
    #[serde(default = "default_display")]
    pub display: String,
}

impl Default for XtestConfig {
    fn default() -> Self {
        XtestConfig {
            display: default_display(),
        }
    }
}

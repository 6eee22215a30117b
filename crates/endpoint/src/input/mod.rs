//! The `input` class: keyboards, mice and other input devices.
//!
//! - `evdev` source: a Linux input device (`/dev/input/eventN`, optionally grabbed) or a
//!   recording of one; `x11-input` source: the keyboard and pointer events of an X display
//!   (XInput2 raw events of the whole display, a window of its own, or the viewer window of an
//!   `x11-window` sink);
//! - `uinput` sink: a virtual input device with the source's capabilities; `xtest` sink:
//!   injection into an X display.
//!
//! Every frame carries one versioned input record ([`InputMessage`]: an event batch, the
//! device's capabilities, or release-all). The record format and every decision that needs no
//! device (kernel `input_event` parsing and batching, held-key tracking, the X11 ↔ Linux code
//! mapping) are sans-IO, in `record.rs`, re-exported here.
//!
//! Files: `config.rs` ([`EvdevConfig`], [`X11InputConfig`], [`UinputConfig`],
//! [`XtestConfig`], [`WaylandInputConfig`]), `record.rs`, `source.rs` and `sink.rs` (the
//! tasks: blocking, over the `evdev` crate and `x11rb`, with no unsafe code), `wayland.rs`
//! (the `wayland-input` sink: virtual keyboard and pointer on wlroots compositors), `gnome.rs`
//! (the `gnome-input` sink: mutter's remote-desktop API), `kde.rs` (the `kde-input` sink:
//! KWin's fake input), `xkb.rs`
//! (its keymap: the source's keysyms on spare keys, sans-IO).

mod config;
#[cfg(feature = "wayland")]
mod eis;
#[cfg(feature = "wayland")]
mod gnome;
#[cfg(feature = "wayland")]
mod kde;
pub mod keymap;
mod keysyms;
#[cfg(feature = "wayland")]
mod portal;
mod record;
mod sink;
mod source;
#[cfg(feature = "wayland")]
mod wayland;
pub mod xkb;

#[cfg(not(feature = "wayland"))]
pub(crate) use crate::common::no_wayland::{
    open_wayland_input, probe_gnome_input, probe_kde_input, probe_portal_input,
    spawn_gnome_input_sink, spawn_kde_input_sink, spawn_portal_input_sink,
    spawn_wayland_input_sink,
};
pub use config::{
    EvdevConfig, GnomeInputConfig, KdeInputConfig, PortalInputConfig, PortalVia, UinputConfig,
    WaylandInputConfig, WaylandWindowInputConfig, X11InputConfig, X11Window, XtestConfig,
};
#[cfg(feature = "wayland")]
pub(crate) use gnome::{probe_gnome_input, spawn_gnome_input_sink};
#[cfg(feature = "wayland")]
pub(crate) use kde::{probe_kde_input, spawn_kde_input_sink};
#[cfg(feature = "wayland")]
pub use portal::portal_input_offers_eis;
#[cfg(feature = "wayland")]
pub(crate) use portal::{probe_portal_input, spawn_portal_input_sink};
pub use record::*;
pub(crate) use sink::{check_uinput, spawn_uinput_sink, spawn_xtest_sink, UINPUT_PATH};
pub(crate) use source::{
    spawn_evdev_source, spawn_wayland_window_input_source, spawn_x11_input_source,
};
#[cfg(feature = "wayland")]
pub(crate) use wayland::{open_wayland_input, spawn_wayland_input_sink};

//! The `display` class: screens and what shows them.
//!
//! - `x11-screen` source: the screen of an X display (DAMAGE for the changed rectangles,
//!   MIT-SHM `ShmGetImage` to capture them);
//! - `x11-window` sink: a window of an X display showing the updates (the viewer of a remote
//!   desktop, which an `x11-input` source can capture input from); `framebuffer` sink: a raw
//!   32-bpp framebuffer file or device;
//! - `x11-cursor` source and sink: the app display's cursor image, set as the viewer window's
//!   cursor (drawn locally by the viewer's X server).
//!
//! Every frame carries one versioned display record ([`Update`]: rectangles of BGRX pixels).
//! The record format and every decision that needs no X server (a client-side
//! [`Framebuffer`], damage [`coalesce`]-ing, cutting a capture into frames) are sans-IO, in
//! `ndd_wire::display` (shared with the `image` codec pair), re-exported here.
//!
//! All three endpoints run as blocking tasks (`spawn_blocking`). MIT-SHM images live in System
//! V shared memory (`sys::ShmSegment`, the only unsafe code); where the extension is missing or
//! the server cannot attach the segment (a remote X server over TCP), plain `GetImage` /
//! `PutImage` requests, cut under the server's maximum request length, do the same job.
//! Setting the environment variable `NDD_X11_NO_SHM=1` forces that path; it is read whenever
//! an endpoint opens.
//!
//! Files: `config.rs` ([`X11ScreenConfig`], [`X11WindowConfig`], [`FramebufferConfig`]),
//! `x11.rs` (what the source and sinks share: screen format, MIT-SHM, the viewer
//! registry), `source.rs` and `sink.rs` (the tasks), `scale.rs` (the viewer's scaling, pure),
//! `wayland.rs` (the `wayland-screen` source: wlr-screencopy on wlroots compositors),
//! `gnome.rs` (the `gnome-screen` source: mutter's screen-cast API and its PipeWire stream),
//! `pacer.rs` (when those two capture: sans-IO).

mod config;
mod cursor;
#[cfg(feature = "wayland")]
mod gnome;
#[cfg(feature = "wayland")]
mod pacer;
#[cfg(feature = "wayland")]
mod portal;
pub mod scale;
mod sink;
mod source;
#[cfg(feature = "wayland")]
mod viewer_input;
#[cfg(feature = "wayland")]
mod wayland;
#[cfg(feature = "wayland")]
mod wayland_window;
mod x11;

#[cfg(not(feature = "wayland"))]
pub(crate) use crate::common::no_wayland::{
    open_wayland_screen, probe_gnome_screen, probe_portal_screen, probe_wayland_window,
    spawn_gnome_screen_source, spawn_portal_screen_source, spawn_wayland_screen_source,
    spawn_wayland_window_sink, take_viewer_input,
};
pub use config::{
    FramebufferConfig, GnomeScreenConfig, PortalScreenConfig, Resize, ViewScale, WaylandProtocol,
    WaylandScreenConfig, WaylandWindowConfig, X11CursorSinkConfig, X11CursorSourceConfig,
    X11ScreenConfig, X11WindowConfig,
};
pub(crate) use cursor::{spawn_x11_cursor_sink, spawn_x11_cursor_source};
#[cfg(feature = "wayland")]
pub(crate) use gnome::{probe_gnome_screen, spawn_gnome_screen_source};
pub use ndd_wire::display::*;
#[cfg(feature = "wayland")]
pub(crate) use portal::{probe_portal_screen, spawn_portal_screen_source};
pub(crate) use sink::{spawn_framebuffer_sink, spawn_x11_window_sink};
pub(crate) use source::spawn_x11_screen_source;
#[cfg(feature = "wayland")]
pub(crate) use wayland::{open_wayland_screen, spawn_wayland_screen_source};
#[cfg(feature = "wayland")]
pub(crate) use wayland_window::{
    probe_wayland_window, spawn_wayland_window_sink, take_input as take_viewer_input,
};
pub(crate) use x11::{viewer_resizes_remote, wait_for_viewer};

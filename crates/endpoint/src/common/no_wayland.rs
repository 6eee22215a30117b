//! Built without the `wayland` feature (the fuzz targets are): the Wayland endpoints parse,
//! describe and check as always, and starting or probing one says it is not built in.

use super::delivered::Delivered;
use super::demand::Demand;
use super::error::EndpointError;
use super::report::{SinkTask, SourceTask};
use crate::clipboard::{GnomeClipboardConfig, WaylandClipboardConfig};
use crate::display::{
    GnomeScreenConfig, PortalScreenConfig, WaylandScreenConfig, WaylandWindowConfig,
};
use crate::input::{GnomeInputConfig, KdeInputConfig, PortalInputConfig, WaylandInputConfig};
use ndd_core::Frame;
use tokio::runtime::Handle;
use tokio::sync::mpsc::{Receiver, Sender};

fn off(endpoint: &'static str) -> EndpointError {
    EndpointError::Unavailable {
        endpoint,
        what: "this ndd was built without Wayland support".to_string(),
        hint: "build ndd-endpoint with its `wayland` feature (the default)".to_string(),
    }
}

pub(crate) fn open_wayland_screen(
    endpoint: &'static str,
    _: &WaylandScreenConfig,
) -> Result<(), EndpointError> {
    Err(off(endpoint))
}

pub(crate) fn spawn_wayland_screen_source(
    _: &Handle,
    endpoint: &'static str,
    _: &WaylandScreenConfig,
    _: u16,
    _: Sender<Frame>,
    _: Option<Demand>,
) -> Result<SourceTask, EndpointError> {
    Err(off(endpoint))
}

pub(crate) fn probe_gnome_screen(
    endpoint: &'static str,
    _: &GnomeScreenConfig,
) -> Result<(), EndpointError> {
    Err(off(endpoint))
}

pub(crate) fn spawn_gnome_screen_source(
    _: &Handle,
    endpoint: &'static str,
    _: &GnomeScreenConfig,
    _: u16,
    _: Sender<Frame>,
    _: Option<Demand>,
) -> Result<SourceTask, EndpointError> {
    Err(off(endpoint))
}

pub(crate) fn probe_wayland_window(
    endpoint: &'static str,
    _: &WaylandWindowConfig,
) -> Result<(), EndpointError> {
    Err(off(endpoint))
}

pub(crate) fn spawn_wayland_window_sink(
    _: &Handle,
    endpoint: &'static str,
    _: &WaylandWindowConfig,
    _: Receiver<Frame>,
    _: Delivered,
) -> Result<SinkTask, EndpointError> {
    Err(off(endpoint))
}

pub(crate) fn take_viewer_input(
    _: &str,
    _: std::time::Duration,
    _: impl Fn() -> bool,
) -> Option<tokio::sync::mpsc::UnboundedReceiver<crate::input::InputMessage>> {
    None
}

pub(crate) fn open_wayland_input(
    endpoint: &'static str,
    _: &WaylandInputConfig,
) -> Result<(), EndpointError> {
    Err(off(endpoint))
}

pub(crate) fn probe_gnome_input(
    endpoint: &'static str,
    _: &GnomeInputConfig,
) -> Result<(), EndpointError> {
    Err(off(endpoint))
}

pub(crate) fn spawn_gnome_input_sink(
    _: &Handle,
    endpoint: &'static str,
    _: &GnomeInputConfig,
    _: Receiver<Frame>,
    _: Delivered,
) -> Result<SinkTask, EndpointError> {
    Err(off(endpoint))
}

pub(crate) fn probe_kde_input(
    endpoint: &'static str,
    _: &KdeInputConfig,
) -> Result<(), EndpointError> {
    Err(off(endpoint))
}

pub(crate) fn spawn_kde_input_sink(
    _: &Handle,
    endpoint: &'static str,
    _: &KdeInputConfig,
    _: Receiver<Frame>,
    _: Delivered,
) -> Result<SinkTask, EndpointError> {
    Err(off(endpoint))
}

pub(crate) fn spawn_wayland_input_sink(
    _: &Handle,
    endpoint: &'static str,
    _: &WaylandInputConfig,
    _: Receiver<Frame>,
    _: Delivered,
) -> Result<SinkTask, EndpointError> {
    Err(off(endpoint))
}

pub(crate) fn probe_wayland(
    endpoint: &'static str,
    _: &WaylandClipboardConfig,
) -> Result<(), EndpointError> {
    Err(off(endpoint))
}

pub(crate) fn spawn_wayland_clipboard_source(
    _: &Handle,
    endpoint: &'static str,
    _: &WaylandClipboardConfig,
    _: u16,
    _: Sender<Frame>,
) -> Result<SourceTask, EndpointError> {
    Err(off(endpoint))
}

pub(crate) fn spawn_wayland_clipboard_sink(
    _: &Handle,
    endpoint: &'static str,
    _: &WaylandClipboardConfig,
    _: Receiver<Frame>,
    _: Delivered,
) -> Result<SinkTask, EndpointError> {
    Err(off(endpoint))
}

/// See the `wayland` feature's version: here, that it is not built in.
pub fn wayland_session(_: &str) -> Result<Vec<crate::common::report::Offered>, String> {
    Err("this ndd was built without Wayland support".into())
}

pub(crate) fn probe_gnome_clipboard(
    endpoint: &'static str,
    _: &GnomeClipboardConfig,
) -> Result<(), EndpointError> {
    Err(off(endpoint))
}

pub(crate) fn spawn_gnome_clipboard_source(
    _: &Handle,
    endpoint: &'static str,
    _: &GnomeClipboardConfig,
    _: u16,
    _: Sender<Frame>,
) -> Result<SourceTask, EndpointError> {
    Err(off(endpoint))
}

pub(crate) fn spawn_gnome_clipboard_sink(
    _: &Handle,
    endpoint: &'static str,
    _: &GnomeClipboardConfig,
    _: Receiver<Frame>,
    _: Delivered,
) -> Result<SinkTask, EndpointError> {
    Err(off(endpoint))
}

pub(crate) fn probe_portal_screen(
    endpoint: &'static str,
    _: &PortalScreenConfig,
) -> Result<(), EndpointError> {
    Err(off(endpoint))
}

pub(crate) fn spawn_portal_screen_source(
    _: &Handle,
    endpoint: &'static str,
    _: &PortalScreenConfig,
    _: u16,
    _: Sender<Frame>,
    _: Option<Demand>,
) -> Result<SourceTask, EndpointError> {
    Err(off(endpoint))
}

/// See the `wayland` feature's version: here, never.
pub fn portal_input_offers_eis(_: &str) -> bool {
    false
}

pub(crate) fn probe_portal_input(
    endpoint: &'static str,
    _: &PortalInputConfig,
) -> Result<(), EndpointError> {
    Err(off(endpoint))
}

pub(crate) fn spawn_portal_input_sink(
    _: &Handle,
    endpoint: &'static str,
    _: &PortalInputConfig,
    _: Receiver<Frame>,
    _: Delivered,
) -> Result<SinkTask, EndpointError> {
    Err(off(endpoint))
}

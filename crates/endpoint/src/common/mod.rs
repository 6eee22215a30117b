//! What every device class shares, in one place; no module here imports a device module.
//!
//! - [`error`]: [`EndpointError`](error::EndpointError), and the serial and input record
//!   errors it carries;
//! - [`report`]: what a source or sink task resolves to ([`SourceReport`](report::SourceReport),
//!   [`SinkReport`](report::SinkReport) with the `check` sink's
//!   [`CheckReport`](report::CheckReport)) and the task handles;
//! - [`delivered`]: [`Delivered`](delivered::Delivered), the frames a sink has completed;
//! - `emitter`: how every device source numbers, stamps and sends its frames and counts
//!   them in its report;
//! - [`clock`]: the source clock (`now_ns`), frame metadata (`meta`), and pacing of
//!   timer-driven sources;
//! - [`framing`]: how a byte stream is cut into frames and put back together (sans-IO);
//! - `byte_stream`: the reader and writer loops of the byte-stream classes (`stdio`, `file`);
//! - `x11`: connecting to an X display and waiting for it, for the `input` and `display`
//!   classes.

pub(crate) mod byte_stream;
pub mod clock;
pub mod delivered;
pub mod demand;
pub(crate) mod emitter;
pub mod error;
pub mod framing;
#[cfg(feature = "wayland")]
pub(crate) mod gnome;
#[cfg(not(feature = "wayland"))]
pub(crate) mod no_wayland;
#[cfg(feature = "wayland")]
pub(crate) mod portal;
#[cfg(feature = "media")]
pub(crate) mod priority;
pub mod report;
#[cfg(feature = "wayland")]
pub(crate) mod wayland;
pub(crate) mod x11;

/// What a desktop's portal request ends with when the person at the desktop declines it
/// (cancels the dialog): a final answer, unlike a portal that fails. The binary exits with a
/// code of its own on it, so a service does not ask again and again.
pub const DECLINED_AT_THE_DESKTOP: &str = "declined at the desktop";

/// What a share ends with when it was stopped at the desktop (GNOME's indicator, not a
/// reconfiguration of the monitors): as final as a dialog declined. (Worded so that no hint
/// of another failure says it: "… or the screen share was stopped at the desktop" is one.)
pub const STOPPED_AT_THE_DESKTOP: &str = "stopped at the desktop (not by a change of monitors)";

/// Whether `said` (an endpoint's error) is a person's answer at the desktop: a dialog
/// declined or a share stopped there, which nothing may undo by starting again.
pub fn refused_at_the_desktop(said: &str) -> bool {
    said.contains(DECLINED_AT_THE_DESKTOP) || said.contains(STOPPED_AT_THE_DESKTOP)
}

/// `name` in ndd's state directory: `$XDG_STATE_HOME/ndd`, else `~/.local/state/ndd` (`None`:
/// neither variable set).
pub fn state_file(name: &str) -> Option<std::path::PathBuf> {
    let state = std::env::var_os("XDG_STATE_HOME")
        .filter(|v| !v.is_empty())
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| std::path::PathBuf::from(h).join(".local/state"))
        })?;
    Some(state.join("ndd").join(name))
}

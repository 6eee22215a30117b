//! The `audio` class: sound through PulseAudio (or PipeWire's PulseAudio server), both ways.
//!
//! - `pulse-capture` source: records from a PulseAudio source — a microphone, or the monitor
//!   of a sink — in blocks of `frame_ms`, one [audio record](ndd_wire::audio) per frame. With
//!   `virtual_sink = "NAME"` it first creates a null sink `NAME` on this side: programs play
//!   into it (`paplay -d NAME`, a desktop's sound settings) and their sound is what it sends.
//! - `pulse-playback` sink: plays PCM records into a PulseAudio sink — the speakers, or with
//!   `virtual_source = "NAME"` a source `NAME` it creates on this side, that unmodified
//!   programs record from as from a microphone (`parecord -d NAME`, `arecord -D pulse`).
//!
//! Virtual devices are PulseAudio modules (`module-null-sink`, `module-remap-source`) loaded
//! with `pactl` and unloaded when the endpoint ends; a device of that name that exists already
//! (another run's) is used as it is. The sound itself goes through libpulse's simple API on a
//! blocking thread: the capture reads whole blocks, the playback writes them with a target
//! buffer of `latency_ms` (the `buffer` pair in front of it recreates the blocks' timing).
//!
//! Files: `config.rs` ([`PulseCaptureConfig`], [`PulsePlaybackConfig`]), `pulse.rs` (the
//! tasks and the `pactl` modules).

mod config;
#[cfg(not(feature = "media"))]
mod no_pulse;
#[cfg(feature = "media")]
mod pulse;

pub use config::{PulseCaptureConfig, PulsePlaybackConfig};
#[cfg(not(feature = "media"))]
pub use no_pulse::settle_modules;
#[cfg(not(feature = "media"))]
pub(crate) use no_pulse::{spawn_pulse_capture, spawn_pulse_playback};
#[cfg(feature = "media")]
pub use pulse::settle_modules;
#[cfg(feature = "media")]
pub(crate) use pulse::{spawn_pulse_capture, spawn_pulse_playback};

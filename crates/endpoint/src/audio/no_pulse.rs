//! Built without the `media` feature (`./run demo` is): the audio endpoints parse, describe
//! and check as always, and starting one says it is not built in.

use super::config::{PulseCaptureConfig, PulsePlaybackConfig};
use crate::common::delivered::Delivered;
use crate::common::error::EndpointError;
use crate::common::report::{SinkTask, SourceTask};
use ndd_core::Frame;
use tokio::runtime::Handle;
use tokio::sync::mpsc::{Receiver, Sender};

fn off(endpoint: &'static str) -> EndpointError {
    EndpointError::Unavailable {
        endpoint,
        what: "this ndd was built without the media libraries (libpulse)".to_string(),
        hint: "build it with its default features (`./run ndd`, or `cargo build --release -p ndd-cli`)"
            .to_string(),
    }
}

/// Nothing to settle: no audio endpoint ever started in this build.
pub fn settle_modules() {}

pub(crate) fn spawn_pulse_capture(
    _: &Handle,
    endpoint: &'static str,
    _: &PulseCaptureConfig,
    _: u16,
    _: Sender<Frame>,
) -> Result<SourceTask, EndpointError> {
    Err(off(endpoint))
}

pub(crate) fn spawn_pulse_playback(
    _: &Handle,
    endpoint: &'static str,
    _: &PulsePlaybackConfig,
    _: Receiver<Frame>,
    _: Delivered,
) -> Result<SinkTask, EndpointError> {
    Err(off(endpoint))
}

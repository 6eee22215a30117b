//! The module model: a [`Pair`] is a transformation with a forward [`Half`] on the source side
//! and an inverse [`Half`] on the sink side. Halves do no I/O and read no clock: time comes in
//! as `now`, deadlines go out through [`Half::poll_timeout`].

use crate::error::{ControlError, FrameError, ParamError, SetupError};
use crate::frame::Frame;
use bytes::Bytes;
use std::time::Instant;
use thiserror::Error;

/// What a half produces in one call: frames for the next layer and control messages for its
/// twin half on the peer.
#[derive(Debug, Default)]
pub struct Output {
    pub(crate) frames: Vec<Frame>,
    pub(crate) control: Vec<Bytes>,
}

impl Output {
    /// An empty output (for tests and harnesses that drive a half directly).
    pub fn new() -> Output {
        Output::default()
    }

    /// Hands a frame to the next layer.
    pub fn push(&mut self, frame: Frame) {
        self.frames.push(frame);
    }

    /// Sends a control message to this pair's other half, on the peer. It travels out of band:
    /// it never passes through other modules and never waits behind queued frames.
    pub fn control(&mut self, msg: impl Into<Bytes>) {
        self.control.push(msg.into());
    }

    /// Frames produced so far (drains them).
    pub fn take_frames(&mut self) -> Vec<Frame> {
        std::mem::take(&mut self.frames)
    }

    /// Control messages produced so far (drains them).
    pub fn take_control(&mut self) -> Vec<Bytes> {
        std::mem::take(&mut self.control)
    }
}

/// Why a half could not process its input. Fatal for the stream: the session reports it with
/// the stream and layer and closes. Recoverable conditions (a corrupted frame a checksum
/// catches) are counted in [`HalfStats`] instead.
///
/// The causes are boxed so that the `Result` every call of a half returns stays small; build
/// one with `ModuleError::from(cause)` or `?` on a cause.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ModuleError {
    /// A frame from the twin half does not have the shape this half expects.
    #[error("malformed frame: {0}")]
    MalformedFrame(Box<FrameError>),
    /// A control message from the twin half does not have the shape this half expects.
    #[error("malformed control message: {0}")]
    MalformedControl(Box<ControlError>),
    /// The half could not be built from its parameters (missing key file, ...).
    #[error("cannot start: {0}")]
    Setup(Box<SetupError>),
}

impl From<FrameError> for ModuleError {
    fn from(e: FrameError) -> ModuleError {
        ModuleError::MalformedFrame(Box::new(e))
    }
}

impl From<ControlError> for ModuleError {
    fn from(e: ControlError) -> ModuleError {
        ModuleError::MalformedControl(Box::new(e))
    }
}

impl From<SetupError> for ModuleError {
    fn from(e: SetupError) -> ModuleError {
        ModuleError::Setup(Box::new(e))
    }
}

impl From<ParamError> for ModuleError {
    fn from(e: ParamError) -> ModuleError {
        ModuleError::Setup(Box::new(SetupError::Param(e)))
    }
}

/// Module-specific statistics a half reports; the stack adds frame and byte counts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HalfStats {
    /// Frames this half dropped (corrupted, stale, over a limit).
    pub drops: u64,
    /// Frames this half currently holds.
    pub queue_depth: u64,
    /// Further named counters (e.g. `("reanchors", 3)`).
    pub counters: Vec<(&'static str, u64)>,
}

/// One half of a pair. No sockets, no clock, no threads.
pub trait Half: Send {
    /// A frame from the previous layer.
    fn handle_frame(
        &mut self,
        now: Instant,
        frame: Frame,
        out: &mut Output,
    ) -> Result<(), ModuleError>;

    /// A control message from this pair's other half, on the peer. Pairs that define no
    /// control messages keep this default, which refuses any: the peer is broken or hostile.
    fn handle_control(
        &mut self,
        _now: Instant,
        msg: Bytes,
        _out: &mut Output,
    ) -> Result<(), ModuleError> {
        Err(ModuleError::from(ControlError::NoControl {
            pair: None,
            len: Some(msg.len()),
        }))
    }

    /// Called when `now` has reached the deadline given by [`Half::poll_timeout`].
    fn handle_timeout(&mut self, _now: Instant, _out: &mut Output) {}

    /// The next instant this half wants [`Half::handle_timeout`] to be called.
    fn poll_timeout(&self) -> Option<Instant> {
        None
    }

    /// Whether this half takes another frame now without dropping one it holds. A source
    /// half that queues (`buffer`) says no while it is full: on a reliable stream the session
    /// then stops reading the endpoint (backpressure) instead of letting the half drop frames;
    /// on a lossy stream the half drops its oldest as before.
    fn ready(&self) -> bool {
        true
    }

    /// Releases everything held, at once (end of stream).
    fn flush(&mut self, _out: &mut Output) {}

    /// Module-specific statistics.
    fn stats(&self) -> HalfStats {
        HalfStats::default()
    }
}

/// A transformation pair: how to build its two halves, and how it is named and announced in
/// the handshake.
pub trait Pair {
    /// Name used as `type = "…"` in config files.
    fn name(&self) -> &'static str;
    /// Module id announced in the handshake.
    fn id(&self) -> u16;
    /// Canonical description of the parameters, `name(key=value, …)` in a fixed key order,
    /// or the bare name when there are none. Its FNV-1a hash is the parameter hash.
    fn describe(&self) -> String;
    /// The half that runs on the source side.
    fn forward(&self) -> Result<Box<dyn Half>, ModuleError>;
    /// The half that runs on the sink side.
    fn inverse(&self) -> Result<Box<dyn Half>, ModuleError>;
}

//! Typed errors. Every message names the endpoint (`file source`, `stdout sink`, …) and what
//! failed, so the binary can print it as is.

use crate::framing::FramingError;
use crate::input::InputFrameError;
use crate::serial::SerialFrameError;
use std::io;
use std::path::PathBuf;

/// An endpoint failed to open, read, write, or decode its input.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    /// A file could not be opened or created.
    #[error("{endpoint}: cannot open {}: {source}", path.display())]
    Open {
        /// Which endpoint, e.g. `file source`.
        endpoint: &'static str,
        /// The path as configured.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// Reading the input failed.
    #[error("{endpoint}: cannot read {what}: {source}")]
    Read {
        /// Which endpoint.
        endpoint: &'static str,
        /// What was being read (a path, `stdin`).
        what: String,
        /// The OS error.
        source: io::Error,
    },
    /// Writing the output failed.
    #[error("{endpoint}: cannot write {what}: {source}")]
    Write {
        /// Which endpoint.
        endpoint: &'static str,
        /// What was being written (a path, `stdout`).
        what: String,
        /// The OS error.
        source: io::Error,
    },
    /// The input (or a frame for the output) violates its framing.
    #[error("{endpoint}: {what}: {source}")]
    Framing {
        /// Which endpoint.
        endpoint: &'static str,
        /// What was being decoded or encoded (a path, `stdin`).
        what: String,
        /// What is wrong, with the byte offset.
        source: FramingError,
    },
    /// A parameter is out of range; the message names it and the allowed range.
    #[error("{endpoint}: invalid parameter {param}: {reason}")]
    Config {
        /// Which endpoint.
        endpoint: &'static str,
        /// The parameter key.
        param: &'static str,
        /// What is allowed.
        reason: String,
    },
    /// A serial-stream frame is malformed (unknown type byte, wrong body length, bad value).
    #[error("{endpoint}: bad serial frame (seq {seq}): {source}")]
    BadFrame {
        /// Which endpoint.
        endpoint: &'static str,
        /// The frame's sequence number.
        seq: u64,
        /// What is wrong.
        source: SerialFrameError,
    },
    /// Line settings could not be applied to a tty.
    #[error("{endpoint}: cannot apply line settings {settings} to {}: {source}", path.display())]
    Settings {
        /// Which endpoint.
        endpoint: &'static str,
        /// The tty.
        path: PathBuf,
        /// The settings, e.g. `9600 8N1`.
        settings: String,
        /// The OS error.
        source: io::Error,
    },
    /// `spawn` was called outside a tokio runtime.
    #[error("{endpoint}: must be started from within a tokio runtime")]
    NoRuntime {
        /// Which endpoint.
        endpoint: &'static str,
    },
    /// An input-stream frame is malformed.
    #[error("{endpoint}: bad input record (seq {seq}): {source}")]
    BadInput {
        /// Which endpoint.
        endpoint: &'static str,
        /// The frame's sequence number.
        seq: u64,
        /// What is wrong.
        source: InputFrameError,
    },
    /// A facility the endpoint needs is missing or refused (no `/dev/uinput`, no X display,
    /// no XTEST); the message says what and how to get it.
    #[error("{endpoint}: {what}; {hint}")]
    Unavailable {
        /// Which endpoint.
        endpoint: &'static str,
        /// What failed, with the OS or X error.
        what: String,
        /// What to do about it.
        hint: String,
    },
}

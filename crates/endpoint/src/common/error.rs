//! Typed errors. Every message names the endpoint (`file source`, `stdout sink`, …) and what
//! failed, so the binary can print it as is.
//!
//! [`EndpointError`] carries the record-format errors of the serial and input classes
//! ([`SerialFrameError`], [`InputFrameError`]), so they are defined here, where every class
//! can reach them without this module importing a device module; `serial` and `input`
//! re-export them with their record formats.

use super::framing::FramingError;
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

/// What is wrong with a serial-stream payload.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SerialFrameError {
    /// A payload must hold at least the type byte.
    #[error("empty payload (no type byte)")]
    Empty,
    /// Unknown type byte.
    #[error(
        "unknown type byte {0:#04x} (expected 0x00 data, 0x01 line settings, 0x02 modem lines, 0x03 break, 0x04 purge)"
    )]
    UnknownType(u8),
    /// Wrong body length for the type.
    #[error("{kind} body must be {want} bytes, got {got}")]
    BodyLength {
        /// Which frame type.
        kind: &'static str,
        /// Expected body length.
        want: usize,
        /// Actual body length.
        got: usize,
    },
    /// A field is out of range.
    #[error("line settings: invalid {field} {value}")]
    Value {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u32,
    },
    /// Undefined modem-line bits.
    #[error("modem lines: undefined bits in {0:#04x} (defined: 0x3f)")]
    ModemBits(u8),
    /// A break or purge value out of range.
    #[error("{kind}: invalid value {value:#04x} (expected {expected})")]
    Control {
        /// Which frame type.
        kind: &'static str,
        /// The value.
        value: u8,
        /// What it may be.
        expected: &'static str,
    },
}

/// What is wrong with an input-stream payload.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InputFrameError {
    /// Fewer than the two header bytes.
    #[error("input record: {0} bytes, shorter than the 2-byte header")]
    Short(usize),
    /// A version this build does not speak.
    #[error("input record: unsupported version {0} (this build speaks version 1)")]
    Version(u8),
    /// Unknown kind byte.
    #[error("input record: unknown kind {0:#04x} (expected 0x00 events, 0x01 capabilities, 0x02 release-all, 0x03 screen size)")]
    UnknownKind(u8),
    /// A screen size outside 1..=32767 in either dimension.
    #[error("input record: screen size {width}x{height} out of range (1..=32767 each)")]
    ScreenSize {
        /// Width asked for.
        width: u16,
        /// Height asked for.
        height: u16,
    },
    /// The body ends early or has bytes left over.
    #[error("input record: {kind} body must be {want} bytes, got {got}")]
    Length {
        /// Which kind.
        kind: &'static str,
        /// Bytes the counts call for (or at least that many, when the body ends early).
        want: usize,
        /// Bytes present.
        got: usize,
    },
    /// An event with a type or code outside the Linux ranges.
    #[error("input record: event {index}: invalid type {ty:#x} / code {code:#x}")]
    Event {
        /// Index of the event in the batch.
        index: usize,
        /// Its type.
        ty: u16,
        /// Its code.
        code: u16,
    },
    /// A capability code outside its range or out of order.
    #[error("input record: capabilities: {what} code {code:#x} out of range or not ascending")]
    Code {
        /// `key`, `rel` or `abs`.
        what: &'static str,
        /// The code.
        code: u16,
    },
    /// An absolute axis whose minimum exceeds its maximum.
    #[error("input record: capabilities: abs axis {code:#x} has min {min} > max {max}")]
    AbsRange {
        /// The axis.
        code: u16,
        /// Its minimum.
        min: i32,
        /// Its maximum.
        max: i32,
    },
    /// The name is not UTF-8.
    #[error("input record: capabilities: device name is not UTF-8")]
    Name,
    /// More events or codes than a u16 count holds.
    #[error("input record: too many {0} for one record (at most 65535)")]
    TooMany(&'static str),
}

//! `delta` formats (also in docs/modules.md).
//!
//! Frame header, pushed by the forward half in front of the payload:
//!
//! ```text
//! u8      kind        0 = key frame: the payload is the frame as it is
//!                     1 = delta: the payload is the frame XOR the reference frame (same size)
//! u64 BE  reference   delta only: sequence number (meta.seq) of the reference frame, the
//!                     frame the forward half sent just before this one
//! ```
//!
//! Control message, inverse → forward ("send a key frame"):
//!
//! ```text
//! u8      type        0x01 = key frame request
//! u64 BE  last        sequence number of the last frame the inverse rebuilt; all ones if none
//! ```

use super::PAIR;
use ndd_core::{ControlError, FrameError};

/// Kind byte of a key frame.
pub const KIND_KEY: u8 = 0;
/// Kind byte of a delta frame.
pub const KIND_DELTA: u8 = 1;
/// Header length of a key frame.
pub const KEY_LEN: usize = 1;
/// Header length of a delta frame.
pub const DELTA_LEN: usize = 9;

/// Type byte of a key frame request.
pub const CONTROL_KEY_REQUEST: u8 = 0x01;
/// Length of a key frame request.
pub const CONTROL_LEN: usize = 9;
/// `last` of a key frame request from an inverse that has rebuilt nothing yet.
pub const NO_FRAME: u64 = u64::MAX;

/// A parsed `delta` frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Header {
    /// The payload is the frame.
    Key,
    /// The payload is the frame XOR the frame with sequence number `reference`.
    Delta {
        /// meta.seq of the reference frame.
        reference: u64,
    },
}

impl Header {
    /// Parses the header at the start of `buf` (the frame payload as received).
    pub fn parse(buf: &[u8]) -> Result<Header, FrameError> {
        match buf.first() {
            None => Err(FrameError::Empty {
                pair: PAIR,
                missing: "kind byte",
            }),
            Some(&KIND_KEY) => Ok(Header::Key),
            Some(&KIND_DELTA) => match buf.get(1..DELTA_LEN) {
                Some(&[a, b, c, d, e, f, g, h]) => Ok(Header::Delta {
                    reference: u64::from_be_bytes([a, b, c, d, e, f, g, h]),
                }),
                _ => Err(FrameError::ShortHeader {
                    pair: PAIR,
                    len: buf.len(),
                    need: DELTA_LEN,
                    header: "delta",
                }),
            },
            Some(&k) => Err(FrameError::UnknownValue {
                pair: PAIR,
                field: "kind",
                value: k.into(),
            }),
        }
    }

    /// Bytes the header takes.
    pub fn buffer_len(&self) -> usize {
        match self {
            Header::Key => KEY_LEN,
            Header::Delta { .. } => DELTA_LEN,
        }
    }

    /// Writes the header into `buf`, which must be [`Header::buffer_len`] bytes long.
    pub fn emit(&self, buf: &mut [u8]) {
        match *self {
            Header::Key => buf[0] = KIND_KEY,
            Header::Delta { reference } => {
                buf[0] = KIND_DELTA;
                buf[1..DELTA_LEN].copy_from_slice(&reference.to_be_bytes());
            }
        }
    }
}

/// A key frame request: the inverse last rebuilt frame `last` (`None`: nothing yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyRequest {
    /// Sequence number of the last frame the inverse rebuilt.
    pub last: Option<u64>,
}

impl KeyRequest {
    /// Parses a control message.
    pub fn parse(msg: &[u8]) -> Result<KeyRequest, ControlError> {
        match msg {
            [CONTROL_KEY_REQUEST, a, b, c, d, e, f, g, h] => {
                let last = u64::from_be_bytes([*a, *b, *c, *d, *e, *f, *g, *h]);
                Ok(KeyRequest {
                    last: (last != NO_FRAME).then_some(last),
                })
            }
            [t, ..] if *t != CONTROL_KEY_REQUEST => Err(ControlError::UnknownValue {
                pair: PAIR,
                field: "control message type",
                value: (*t).into(),
            }),
            _ => Err(ControlError::WrongSize {
                pair: PAIR,
                what: "key request",
                len: msg.len(),
                expected: CONTROL_LEN,
            }),
        }
    }

    /// The control message bytes.
    pub fn emit(&self) -> [u8; CONTROL_LEN] {
        let mut b = [0u8; CONTROL_LEN];
        b[0] = CONTROL_KEY_REQUEST;
        b[1..].copy_from_slice(&self.last.unwrap_or(NO_FRAME).to_be_bytes());
        b
    }
}

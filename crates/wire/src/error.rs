//! The one error type of this crate.

use crate::Kind;

/// Everything that can be wrong with bytes handed to this crate, or with a `Repr` that cannot
/// be encoded.
///
/// Two variants matter to a stream reader and must not be confused:
/// [`WireError::Truncated`] means "the buffer does not hold the whole message yet, read more";
/// every other variant means the bytes are bad and the connection should be closed
/// (CLOSE code 1, protocol error, or code 3 for [`WireError::UnknownVersion`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The buffer ends before the message does. Not a protocol error on a stream: read at
    /// least `need` bytes in all and try again.
    #[error("message incomplete: need {need} bytes, have {have}; read more before parsing")]
    Truncated {
        /// Bytes needed from the start of the message.
        need: usize,
        /// Bytes available.
        have: usize,
    },

    /// The body length announced in the prefix exceeds the receiver's limit (or, when
    /// emitting, does not fit the 32-bit length field).
    #[error(
        "message body of {len} bytes exceeds the limit of {max} bytes; \
         raise max_body on the receiving side or send smaller messages"
    )]
    TooLong {
        /// Announced (or required) body length.
        len: u64,
        /// The limit in force.
        max: u32,
    },

    /// Byte 0 of a message is not [`crate::VERSION`].
    #[error(
        "peer speaks protocol version {got}, this side speaks version {expected}; \
         run the same ndd protocol version on both sides"
    )]
    UnknownVersion {
        /// Version byte received.
        got: u8,
        /// Version this side speaks.
        expected: u8,
    },

    /// The kind byte names no kind this side knows.
    #[error("unknown message kind 0x{0:02x}; the peer may run a newer ndd")]
    UnknownKind(u8),

    /// A valid message of another kind where a particular kind was required.
    #[error("expected a {expected} message, got {got}")]
    UnexpectedKind {
        /// Kind that was required.
        expected: Kind,
        /// Kind that was found.
        got: Kind,
    },

    /// The body (whose length the prefix announced) ends inside a field.
    #[error("{kind} body too short: field `{field}` needs {need} body bytes, body has {have}")]
    BodyTooShort {
        /// Kind of the message.
        kind: Kind,
        /// The field the body ends in.
        field: &'static str,
        /// Body bytes needed to hold that field.
        need: usize,
        /// Body length.
        have: usize,
    },

    /// A length-prefixed field or a count is out of its allowed range.
    #[error("field `{field}` has length {len}, allowed is {min}..={max}")]
    BadLength {
        /// Field name.
        field: &'static str,
        /// Length found (or requested when emitting).
        len: usize,
        /// Smallest allowed length.
        min: usize,
        /// Largest allowed length.
        max: usize,
    },

    /// A field holds a value outside its defined set.
    #[error("field `{field}` has invalid value {value}")]
    InvalidValue {
        /// Field name.
        field: &'static str,
        /// Value found.
        value: u64,
    },

    /// Any other structural rule is broken; the text says which.
    #[error("malformed message: {0}")]
    Malformed(&'static str),

    /// A text field is not valid UTF-8.
    #[error("field `{field}` is not valid UTF-8")]
    InvalidUtf8 {
        /// Field name.
        field: &'static str,
    },

    /// The body holds bytes after the last field its kind defines.
    #[error("{extra} unexpected bytes after the last field of the message body")]
    TrailingBytes {
        /// Number of extra bytes.
        extra: usize,
    },

    /// An output buffer handed to `emit` is too small.
    #[error("output buffer too small: need {need} bytes, have {have}")]
    BufferTooSmall {
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
}

/// Result with [`WireError`].
pub type Result<T, E = WireError> = core::result::Result<T, E>;

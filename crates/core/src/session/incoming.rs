//! One message as a link hands it to the session.

use crate::frame::{Frame, Meta};
use bytes::Bytes;
use ndd_wire::{DataHeader, OwnedMessage};

/// One message read from a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incoming {
    /// A DATA message: its header and its payload, a slice of the read buffer (not a copy).
    Data {
        /// Stream, retransmit flag, sequence number, source timestamp.
        header: DataHeader,
        /// The payload.
        payload: Bytes,
    },
    /// Any other message.
    Other(OwnedMessage),
}

impl Incoming {
    /// A DATA message as a [`Frame`] (zero copy); any other message back as `Err`.
    pub fn into_frame(self) -> std::result::Result<Frame, OwnedMessage> {
        match self {
            Incoming::Data { header, payload } => Ok(Frame::from_bytes(
                Meta {
                    stream: header.stream_id,
                    seq: header.seq,
                    timestamp_ns: header.timestamp_ns,
                    flags: header.flags(),
                },
                payload,
            )),
            Incoming::Other(msg) => Err(msg),
        }
    }
}

//! `DATA` (kind 0x01): one frame of a stream.
//!
//! Body:
//! ```text
//! off size field
//! 0   8    seq            sequence number on this stream
//! 8   8    timestamp_ns   source clock, ns since the Unix epoch
//! 16  …    payload        rest of the body (may be empty)
//! ```
//! Flags: bit 0 = [`FLAG_RETRANSMIT`], bit 1 = [`FLAG_MORE`]. Stream id ≠ 0.
//!
//! The hot path does not use [`Packet`]/[`Repr`] but [`DataHeader`], which writes or reads the
//! whole 26-byte header (prefix + seq + timestamp) so a link can write it into a frame's
//! headroom and hand out the payload without copying it.

use crate::cursor::{get, need, set};
use crate::header::{self, HEADER_LEN};
use crate::{Kind, Result, WireError};

/// Flag bit 0: this frame is a resend after a reconnect.
pub const FLAG_RETRANSMIT: u16 = 0x0001;

/// Flag bit 1: this message carries one chunk of a frame and the frame goes on in the
/// stream's next DATA message (same seq and timestamp); the chunk without it ends the frame.
pub const FLAG_MORE: u16 = 0x0002;

/// Smallest DATA body: seq + timestamp.
pub const BODY_MIN_LEN: usize = 16;

/// Bytes before the payload in a DATA message: prefix (10) + seq (8) + timestamp (8).
pub const DATA_HEADER_LEN: usize = HEADER_LEN + BODY_MIN_LEN;

/// Byte ranges of the DATA body fields.
pub mod field {
    use core::ops::{Range, RangeFrom};
    /// Sequence number.
    pub const SEQ: Range<usize> = 0..8;
    /// Source timestamp.
    pub const TIMESTAMP: Range<usize> = 8..16;
    /// Payload.
    pub const PAYLOAD: RangeFrom<usize> = 16..;
}

/// Checked view of a DATA body. After [`Packet::new_checked`] no getter panics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap a body without checking its length.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wrap a body, checking it holds seq and timestamp.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// `Err(BodyTooShort)` unless the body holds seq and timestamp.
    pub fn check_len(&self) -> Result<()> {
        let have = self.buffer.as_ref().len();
        let (field, need) = if have < field::SEQ.end {
            ("seq", field::SEQ.end)
        } else {
            ("timestamp_ns", field::TIMESTAMP.end)
        };
        if have < need {
            return Err(WireError::BodyTooShort {
                kind: Kind::Data,
                field,
                need,
                have,
            });
        }
        Ok(())
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Sequence number.
    #[inline]
    pub fn seq(&self) -> u64 {
        u64::from_be_bytes(get(self.buffer.as_ref(), field::SEQ.start))
    }

    /// Source timestamp, ns since the Unix epoch.
    #[inline]
    pub fn timestamp_ns(&self) -> u64 {
        u64::from_be_bytes(get(self.buffer.as_ref(), field::TIMESTAMP.start))
    }

    /// Payload (rest of the body).
    #[inline]
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[field::PAYLOAD]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the sequence number.
    #[inline]
    pub fn set_seq(&mut self, value: u64) {
        set(self.buffer.as_mut(), field::SEQ.start, &value.to_be_bytes());
    }

    /// Set the source timestamp.
    #[inline]
    pub fn set_timestamp_ns(&mut self, value: u64) {
        set(
            self.buffer.as_mut(),
            field::TIMESTAMP.start,
            &value.to_be_bytes(),
        );
    }

    /// Payload, mutable.
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::PAYLOAD]
    }
}

/// A DATA body as plain values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr<'a> {
    /// Sequence number.
    pub seq: u64,
    /// Source timestamp, ns since the Unix epoch.
    pub timestamp_ns: u64,
    /// Payload.
    pub payload: &'a [u8],
}

impl<'a> Repr<'a> {
    /// Parse a DATA body.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&'a T>) -> Result<Repr<'a>> {
        packet.check_len()?;
        let body: &'a [u8] = packet.buffer.as_ref();
        Ok(Repr {
            seq: packet.seq(),
            timestamp_ns: packet.timestamp_ns(),
            payload: body.get(field::PAYLOAD).unwrap_or_default(),
        })
    }

    /// Body length: 16 + payload length.
    pub const fn buffer_len(&self) -> usize {
        BODY_MIN_LEN + self.payload.len()
    }

    /// Write the body into the first [`Repr::buffer_len`] bytes of `packet`.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) -> Result<()> {
        let len = self.buffer_len();
        need(packet.buffer.as_ref(), len)?;
        packet.set_seq(self.seq);
        packet.set_timestamp_ns(self.timestamp_ns);
        packet.payload_mut()[..self.payload.len()].copy_from_slice(self.payload);
        Ok(())
    }
}

/// The whole 26-byte header of a DATA message (prefix + seq + timestamp), for the hot path.
///
/// ```
/// use ndd_wire::{DataHeader, DATA_HEADER_LEN, Message};
///
/// let payload = b"hello";
/// // A frame buffer with DATA_HEADER_LEN bytes of headroom before the payload.
/// let mut frame = vec![0u8; DATA_HEADER_LEN];
/// frame.extend_from_slice(payload);
/// let hdr = DataHeader { stream_id: 1, retransmit: false, more: false, seq: 7, timestamp_ns: 99 };
/// hdr.emit(payload.len(), &mut frame[..DATA_HEADER_LEN]).unwrap();
///
/// let (parsed, body) = DataHeader::parse(&frame, 1 << 20).unwrap();
/// assert_eq!(parsed, hdr);
/// assert_eq!(body, payload);
/// // The payload always starts at DATA_HEADER_LEN, so a `Bytes` holder can slice it out.
/// assert_eq!(&frame[DATA_HEADER_LEN..], payload);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DataHeader {
    /// Stream id (≠ 0).
    pub stream_id: u16,
    /// Flag bit 0: frame resent after a reconnect.
    pub retransmit: bool,
    /// Flag bit 1: a chunk of a frame that goes on in the stream's next DATA message.
    pub more: bool,
    /// Sequence number.
    pub seq: u64,
    /// Source timestamp, ns since the Unix epoch.
    pub timestamp_ns: u64,
}

impl DataHeader {
    /// Prefix flags for this header.
    pub const fn flags(&self) -> u16 {
        data_flags(self.retransmit, self.more)
    }

    /// Write the 26-byte header of a DATA message carrying `payload_len` payload bytes into
    /// `out[..DATA_HEADER_LEN]`. The payload itself is not touched.
    ///
    /// Errors: `BufferTooSmall` if `out` is shorter than [`DATA_HEADER_LEN`]; `TooLong` if the
    /// body would not fit the 32-bit length field; `InvalidValue` for stream id 0.
    pub fn emit(&self, payload_len: usize, out: &mut [u8]) -> Result<()> {
        need(out, DATA_HEADER_LEN)?;
        check_stream(Kind::Data, self.stream_id)?;
        let body_len = body_len_u32((BODY_MIN_LEN as u64).saturating_add(payload_len as u64))?;
        let mut prefix = header::Packet::new_unchecked(&mut out[..HEADER_LEN]);
        header::Repr {
            kind: Kind::Data,
            flags: self.flags(),
            stream_id: self.stream_id,
            body_len,
        }
        .emit(&mut prefix)?;
        let mut body = Packet::new_unchecked(&mut out[HEADER_LEN..DATA_HEADER_LEN]);
        body.set_seq(self.seq);
        body.set_timestamp_ns(self.timestamp_ns);
        Ok(())
    }

    /// Parse the DATA message at the start of `buf`: the header and the payload slice. The
    /// message occupies `DATA_HEADER_LEN + payload.len()` bytes; anything after it is not
    /// looked at. A message of another kind gives `UnexpectedKind`.
    pub fn parse(buf: &[u8], max_body: u32) -> Result<(DataHeader, &[u8])> {
        let (prefix, body, _) = header::split(buf, max_body)?;
        if prefix.kind != Kind::Data {
            return Err(WireError::UnexpectedKind {
                expected: Kind::Data,
                got: prefix.kind,
            });
        }
        Self::from_parts(&prefix, body)
    }

    pub(crate) fn from_parts<'a>(
        prefix: &header::Repr,
        body: &'a [u8],
    ) -> Result<(DataHeader, &'a [u8])> {
        check_stream(Kind::Data, prefix.stream_id)?;
        let repr = Repr::parse(&Packet::new_unchecked(body))?;
        Ok((
            DataHeader {
                stream_id: prefix.stream_id,
                retransmit: prefix.flags & FLAG_RETRANSMIT != 0,
                more: prefix.flags & FLAG_MORE != 0,
                seq: repr.seq,
                timestamp_ns: repr.timestamp_ns,
            },
            repr.payload,
        ))
    }
}

/// The prefix flags of a DATA message.
pub(crate) const fn data_flags(retransmit: bool, more: bool) -> u16 {
    (if retransmit { FLAG_RETRANSMIT } else { 0 }) | (if more { FLAG_MORE } else { 0 })
}

/// Stream-level kinds need a stream id ≠ 0.
pub(crate) fn check_stream(kind: Kind, stream_id: u16) -> Result<()> {
    if stream_id == 0 {
        Err(WireError::Malformed(match kind {
            Kind::Control => "CONTROL on stream 0, which is reserved for session-level messages",
            Kind::Ack => "ACK on stream 0, which is reserved for session-level messages",
            _ => "DATA on stream 0, which is reserved for session-level messages",
        }))
    } else {
        Ok(())
    }
}

/// A body length that must fit the 32-bit length field.
pub(crate) fn body_len_u32(len: u64) -> Result<u32> {
    u32::try_from(len).map_err(|_| WireError::TooLong { len, max: u32::MAX })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_bodies_name_the_field() {
        assert_eq!(
            Packet::new_checked(&[0u8; 3][..]),
            Err(WireError::BodyTooShort {
                kind: Kind::Data,
                field: "seq",
                need: 8,
                have: 3
            })
        );
        assert_eq!(
            Packet::new_checked(&[0u8; 12][..]),
            Err(WireError::BodyTooShort {
                kind: Kind::Data,
                field: "timestamp_ns",
                need: 16,
                have: 12
            })
        );
    }

    #[test]
    fn body_repr_round_trip() {
        let repr = Repr {
            seq: 1,
            timestamp_ns: 2,
            payload: b"xyz",
        };
        let mut buf = vec![0u8; repr.buffer_len()];
        repr.emit(&mut Packet::new_unchecked(&mut buf[..])).unwrap();
        let parsed = Repr::parse(&Packet::new_checked(&buf[..]).unwrap()).unwrap();
        assert_eq!(parsed, repr);
        let mut small = [0u8; 17];
        assert_eq!(
            repr.emit(&mut Packet::new_unchecked(&mut small[..])),
            Err(WireError::BufferTooSmall { need: 19, have: 17 })
        );
    }

    #[test]
    fn header_emit_checks() {
        let h = DataHeader {
            stream_id: 0,
            retransmit: true,
            more: false,
            seq: 0,
            timestamp_ns: 0,
        };
        let mut out = [0u8; DATA_HEADER_LEN];
        assert!(matches!(h.emit(0, &mut out), Err(WireError::Malformed(_))));
        let h = DataHeader { stream_id: 3, ..h };
        assert_eq!(
            h.emit(0, &mut out[..25]),
            Err(WireError::BufferTooSmall { need: 26, have: 25 })
        );
        assert_eq!(
            h.emit(u32::MAX as usize, &mut out),
            Err(WireError::TooLong {
                len: u32::MAX as u64 + 16,
                max: u32::MAX
            })
        );
        h.emit(0, &mut out).unwrap();
        assert_eq!(DataHeader::parse(&out, 16), Ok((h, &[][..])));
    }

    #[test]
    fn header_parse_rejects_other_kinds() {
        let ack = [1, 8, 0, 0, 0, 1, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 5];
        assert_eq!(
            DataHeader::parse(&ack, 100),
            Err(WireError::UnexpectedKind {
                expected: Kind::Data,
                got: Kind::Ack
            })
        );
    }
}

//! The 10-byte prefix every message on a link starts with.
//!
//! ```text
//! off size field
//! 0   1    version (= 1)
//! 1   1    kind
//! 2   2    flags (kind-specific)
//! 4   2    stream id (0 for session-level messages)
//! 6   4    body length: bytes following this prefix
//! ```

use core::fmt;

use crate::cursor::{get, set};
use crate::{Result, WireError, VERSION};

/// Length of the common prefix.
pub const HEADER_LEN: usize = 10;

/// Byte ranges of the prefix fields.
pub mod field {
    use core::ops::Range;
    /// Protocol version.
    pub const VERSION: usize = 0;
    /// Message kind.
    pub const KIND: usize = 1;
    /// Kind-specific flags.
    pub const FLAGS: Range<usize> = 2..4;
    /// Stream id.
    pub const STREAM: Range<usize> = 4..6;
    /// Body length.
    pub const LENGTH: Range<usize> = 6..10;
}

/// Message kinds (byte 1 of the prefix).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Kind {
    /// A frame of a stream.
    Data = 0x01,
    /// A control message between the two halves of one pair.
    Control = 0x02,
    /// Handshake: a side's plan.
    Hello = 0x03,
    /// Handshake: the sender agrees with the peer's HELLO.
    Ready = 0x04,
    /// The sender is closing the session.
    Close = 0x05,
    /// Clock/liveness probe.
    Ping = 0x06,
    /// Answer to a PING.
    Pong = 0x07,
    /// Highest sequence delivered in order on a stream.
    Ack = 0x08,
    /// The sender's source of a stream has ended.
    End = 0x09,
    /// After a (re)connect: the sender's process-run id; ends its resume ACKs.
    Resume = 0x0a,
    /// Highest endpoint sequence a stream's sink has completed.
    Delivered = 0x0b,
}

impl Kind {
    /// Every kind, in code order.
    pub const ALL: [Kind; 11] = [
        Kind::Data,
        Kind::Control,
        Kind::Hello,
        Kind::Ready,
        Kind::Close,
        Kind::Ping,
        Kind::Pong,
        Kind::Ack,
        Kind::End,
        Kind::Resume,
        Kind::Delivered,
    ];

    /// The kind with this code, if any.
    pub const fn from_u8(code: u8) -> Option<Kind> {
        Some(match code {
            0x01 => Kind::Data,
            0x02 => Kind::Control,
            0x03 => Kind::Hello,
            0x04 => Kind::Ready,
            0x05 => Kind::Close,
            0x06 => Kind::Ping,
            0x07 => Kind::Pong,
            0x08 => Kind::Ack,
            0x09 => Kind::End,
            0x0a => Kind::Resume,
            0x0b => Kind::Delivered,
            _ => return None,
        })
    }

    /// The name used in docs and error messages (`DATA`, `HELLO`, …).
    pub const fn name(self) -> &'static str {
        match self {
            Kind::Data => "DATA",
            Kind::Control => "CONTROL",
            Kind::Hello => "HELLO",
            Kind::Ready => "READY",
            Kind::Close => "CLOSE",
            Kind::Ping => "PING",
            Kind::Pong => "PONG",
            Kind::Ack => "ACK",
            Kind::End => "END",
            Kind::Resume => "RESUME",
            Kind::Delivered => "DELIVERED",
        }
    }

    /// Whether messages of this kind belong to a stream (stream id ≠ 0) rather than to the
    /// session (stream id = 0).
    pub const fn is_stream_level(self) -> bool {
        matches!(
            self,
            Kind::Data | Kind::Control | Kind::Ack | Kind::End | Kind::Delivered
        )
    }
}

impl From<Kind> for u8 {
    fn from(kind: Kind) -> u8 {
        kind as u8
    }
}

impl TryFrom<u8> for Kind {
    type Error = WireError;
    fn try_from(code: u8) -> Result<Kind> {
        Kind::from_u8(code).ok_or(WireError::UnknownKind(code))
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Checked view of one whole message (prefix + body).
///
/// After [`Packet::new_checked`] succeeds, no getter panics: the buffer holds the prefix and
/// the whole body the prefix announces. On a [`Packet::new_unchecked`] view the getters may
/// panic if the buffer is too short.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wrap a buffer, checking it holds the prefix and the whole body.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// `Err(Truncated)` unless the buffer holds the prefix and the whole announced body.
    /// Bytes after the body are allowed (they belong to the next message).
    pub fn check_len(&self) -> Result<()> {
        let have = self.buffer.as_ref().len();
        if have < HEADER_LEN {
            return Err(WireError::Truncated {
                need: HEADER_LEN,
                have,
            });
        }
        let need = self.total_len();
        if have < need {
            return Err(WireError::Truncated { need, have });
        }
        Ok(())
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Protocol version byte.
    #[inline]
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VERSION]
    }

    /// Raw kind byte (see [`Kind::from_u8`]).
    #[inline]
    pub fn kind(&self) -> u8 {
        self.buffer.as_ref()[field::KIND]
    }

    /// Flags.
    #[inline]
    pub fn flags(&self) -> u16 {
        u16::from_be_bytes(get(self.buffer.as_ref(), field::FLAGS.start))
    }

    /// Stream id.
    #[inline]
    pub fn stream_id(&self) -> u16 {
        u16::from_be_bytes(get(self.buffer.as_ref(), field::STREAM.start))
    }

    /// Body length field.
    #[inline]
    pub fn body_len(&self) -> u32 {
        u32::from_be_bytes(get(self.buffer.as_ref(), field::LENGTH.start))
    }

    /// Prefix plus body length, saturating on (theoretical) overflow.
    #[inline]
    pub fn total_len(&self) -> usize {
        total_len(self.body_len())
    }

    /// The body: the `body_len` bytes after the prefix.
    #[inline]
    pub fn body(&self) -> &[u8] {
        let end = self.total_len();
        &self.buffer.as_ref()[HEADER_LEN..end]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the version byte.
    #[inline]
    pub fn set_version(&mut self, value: u8) {
        self.buffer.as_mut()[field::VERSION] = value;
    }

    /// Set the kind byte.
    #[inline]
    pub fn set_kind(&mut self, value: u8) {
        self.buffer.as_mut()[field::KIND] = value;
    }

    /// Set the flags.
    #[inline]
    pub fn set_flags(&mut self, value: u16) {
        set(
            self.buffer.as_mut(),
            field::FLAGS.start,
            &value.to_be_bytes(),
        );
    }

    /// Set the stream id.
    #[inline]
    pub fn set_stream_id(&mut self, value: u16) {
        set(
            self.buffer.as_mut(),
            field::STREAM.start,
            &value.to_be_bytes(),
        );
    }

    /// Set the body length.
    #[inline]
    pub fn set_body_len(&mut self, value: u32) {
        set(
            self.buffer.as_mut(),
            field::LENGTH.start,
            &value.to_be_bytes(),
        );
    }

    /// The body, mutable.
    #[inline]
    pub fn body_mut(&mut self) -> &mut [u8] {
        let end = self.total_len();
        &mut self.buffer.as_mut()[HEADER_LEN..end]
    }
}

/// The prefix as plain values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Message kind.
    pub kind: Kind,
    /// Flags.
    pub flags: u16,
    /// Stream id (0 for session-level messages).
    pub stream_id: u16,
    /// Body length.
    pub body_len: u32,
}

impl Repr {
    /// Parse a checked prefix: version must be [`VERSION`] and the kind known.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        check_version(packet.version())?;
        Ok(Repr {
            kind: Kind::try_from(packet.kind())?,
            flags: packet.flags(),
            stream_id: packet.stream_id(),
            body_len: packet.body_len(),
        })
    }

    /// Length of the prefix: [`HEADER_LEN`].
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Write the prefix (version [`VERSION`]) into the first [`HEADER_LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) -> Result<()> {
        crate::cursor::need(packet.buffer.as_ref(), HEADER_LEN)?;
        packet.set_version(VERSION);
        packet.set_kind(self.kind.into());
        packet.set_flags(self.flags);
        packet.set_stream_id(self.stream_id);
        packet.set_body_len(self.body_len);
        Ok(())
    }
}

#[inline]
pub(crate) fn total_len(body_len: u32) -> usize {
    HEADER_LEN.saturating_add(usize::try_from(body_len).unwrap_or(usize::MAX))
}

#[inline]
pub(crate) fn check_version(got: u8) -> Result<()> {
    if got == VERSION {
        Ok(())
    } else {
        Err(WireError::UnknownVersion {
            got,
            expected: VERSION,
        })
    }
}

/// How many bytes the message at the start of `buf` occupies, for a stream reader.
///
/// - `Err(UnknownVersion)` as soon as byte 0 is available and is not [`VERSION`] (so a
///   version mismatch is reported even if the peer's message is shorter than a prefix);
/// - `Ok(None)` while fewer than [`HEADER_LEN`] bytes are available;
/// - `Err(TooLong)` if the announced body exceeds `max_body`;
/// - otherwise `Ok(Some(HEADER_LEN + body length))`.
///
/// An unknown kind is not an error here: framing does not depend on the kind.
pub fn peek_message_len(buf: &[u8], max_body: u32) -> Result<Option<usize>> {
    if let Some(&v) = buf.first() {
        check_version(v)?;
    }
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    let packet = Packet::new_unchecked(buf);
    let body_len = packet.body_len();
    if body_len > max_body {
        return Err(WireError::TooLong {
            len: body_len.into(),
            max: max_body,
        });
    }
    Ok(Some(total_len(body_len)))
}

/// Split the message at the start of `buf` into its prefix and body, checking version, body
/// limit, kind and completeness, in that order. Returns the prefix, the body and the total
/// length consumed.
pub(crate) fn split(buf: &[u8], max_body: u32) -> Result<(Repr, &[u8], usize)> {
    let Some(total) = peek_message_len(buf, max_body)? else {
        return Err(WireError::Truncated {
            need: HEADER_LEN,
            have: buf.len(),
        });
    };
    let packet = Packet::new_unchecked(buf);
    let kind = Kind::try_from(packet.kind())?;
    let body = buf.get(HEADER_LEN..total).ok_or(WireError::Truncated {
        need: total,
        have: buf.len(),
    })?;
    let repr = Repr {
        kind,
        flags: packet.flags(),
        stream_id: packet.stream_id(),
        body_len: packet.body_len(),
    };
    Ok((repr, body, total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peek_needs_ten_bytes() {
        assert_eq!(peek_message_len(&[], 100), Ok(None));
        assert_eq!(peek_message_len(&[1, 4, 0, 0], 100), Ok(None));
        assert_eq!(
            peek_message_len(&[1, 4, 0, 0, 0, 0, 0, 0, 0, 0], 100),
            Ok(Some(10))
        );
    }

    #[test]
    fn peek_reports_version_from_byte_zero() {
        assert_eq!(
            peek_message_len(&[2], 100),
            Err(WireError::UnknownVersion {
                got: 2,
                expected: 1
            })
        );
    }

    #[test]
    fn peek_ignores_unknown_kind_and_checks_limit() {
        let buf = [1, 0x7f, 0, 0, 0, 0, 0, 0, 0, 20];
        assert_eq!(peek_message_len(&buf, 20), Ok(Some(30)));
        assert_eq!(
            peek_message_len(&buf, 19),
            Err(WireError::TooLong { len: 20, max: 19 })
        );
    }

    #[test]
    fn packet_getters_and_setters() {
        let mut buf = [0u8; 12];
        let mut p = Packet::new_unchecked(&mut buf[..]);
        Repr {
            kind: Kind::Ack,
            flags: 0xbeef,
            stream_id: 0x1234,
            body_len: 2,
        }
        .emit(&mut p)
        .unwrap();
        p.body_mut().copy_from_slice(&[9, 9]);
        assert_eq!(buf, [1, 8, 0xbe, 0xef, 0x12, 0x34, 0, 0, 0, 2, 9, 9]);
        let p = Packet::new_checked(&buf[..]).unwrap();
        assert_eq!(p.body(), &[9, 9]);
        let r = Repr::parse(&p).unwrap();
        assert_eq!(r.kind, Kind::Ack);
        assert_eq!(r.flags, 0xbeef);
        assert_eq!(r.stream_id, 0x1234);
        assert_eq!(
            Packet::new_checked(&buf[..11]),
            Err(WireError::Truncated { need: 12, have: 11 })
        );
    }

    #[test]
    fn kind_codes_round_trip() {
        for k in Kind::ALL {
            assert_eq!(Kind::from_u8(k.into()), Some(k));
        }
        assert_eq!(Kind::try_from(0), Err(WireError::UnknownKind(0)));
        assert_eq!(Kind::try_from(12), Err(WireError::UnknownKind(12)));
    }
}

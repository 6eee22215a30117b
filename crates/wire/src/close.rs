//! `CLOSE` (kind 0x05): the sender is closing the session. Stream id 0, no flags.
//!
//! Body:
//! ```text
//! off size field
//! 0   2    code     see CloseCode
//! 2   …    reason   UTF-8 text for the user (rest; may be empty)
//! ```

use core::fmt;

use crate::cursor::{get, need, set};
use crate::{Kind, Result, WireError};

/// Smallest CLOSE body: the code.
pub const BODY_MIN_LEN: usize = 2;

/// Byte ranges of the CLOSE body fields.
pub mod field {
    use core::ops::{Range, RangeFrom};
    /// Close code.
    pub const CODE: Range<usize> = 0..2;
    /// Reason text.
    pub const REASON: RangeFrom<usize> = 2..;
}

/// Why a session is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CloseCode {
    /// 0: normal shutdown.
    Normal,
    /// 1: the peer sent bytes that break this protocol.
    ProtocolError,
    /// 2: the two sides' HELLOs disagree (driver, streams or stacks).
    StackMismatch,
    /// 3: the two sides speak different protocol versions.
    VersionMismatch,
    /// 4: the peer's identity is not trusted.
    UntrustedPeer,
    /// 5: the sender hit an internal error.
    InternalError,
    /// 6: the sender's process is stopping but its streams did not end: a receiver that
    /// outlives its peer keeps its endpoints and waits for the peer to come back.
    GoingAway,
    /// 7: the sender serves another peer and takes one at a time; worth trying again later
    /// (a listening side busy with its current peer refuses a second one with it).
    Busy,
    /// Any other code, kept as received.
    Unknown(u16),
}

impl CloseCode {
    /// The code for this value.
    pub const fn to_u16(self) -> u16 {
        match self {
            CloseCode::Normal => 0,
            CloseCode::ProtocolError => 1,
            CloseCode::StackMismatch => 2,
            CloseCode::VersionMismatch => 3,
            CloseCode::UntrustedPeer => 4,
            CloseCode::InternalError => 5,
            CloseCode::GoingAway => 6,
            CloseCode::Busy => 7,
            CloseCode::Unknown(code) => code,
        }
    }

    /// The value for a code; codes without a name become [`CloseCode::Unknown`].
    pub const fn from_u16(code: u16) -> CloseCode {
        match code {
            0 => CloseCode::Normal,
            1 => CloseCode::ProtocolError,
            2 => CloseCode::StackMismatch,
            3 => CloseCode::VersionMismatch,
            4 => CloseCode::UntrustedPeer,
            5 => CloseCode::InternalError,
            6 => CloseCode::GoingAway,
            7 => CloseCode::Busy,
            other => CloseCode::Unknown(other),
        }
    }
}

impl From<u16> for CloseCode {
    fn from(code: u16) -> CloseCode {
        CloseCode::from_u16(code)
    }
}

impl From<CloseCode> for u16 {
    fn from(code: CloseCode) -> u16 {
        code.to_u16()
    }
}

impl fmt::Display for CloseCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CloseCode::Normal => f.write_str("normal close"),
            CloseCode::ProtocolError => f.write_str("protocol error"),
            CloseCode::StackMismatch => f.write_str("stack mismatch"),
            CloseCode::VersionMismatch => f.write_str("protocol version mismatch"),
            CloseCode::UntrustedPeer => f.write_str("untrusted peer"),
            CloseCode::InternalError => f.write_str("internal error"),
            CloseCode::GoingAway => f.write_str("peer stopped"),
            CloseCode::Busy => f.write_str("busy with another peer"),
            CloseCode::Unknown(code) => write!(f, "unknown close code {code}"),
        }
    }
}

/// Checked view of a CLOSE body. After [`Packet::new_checked`] no getter panics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap a body without checking its length.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wrap a body, checking it holds the code.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// `Err(BodyTooShort)` unless the body holds the code.
    pub fn check_len(&self) -> Result<()> {
        let have = self.buffer.as_ref().len();
        if have < BODY_MIN_LEN {
            return Err(WireError::BodyTooShort {
                kind: Kind::Close,
                field: "code",
                need: BODY_MIN_LEN,
                have,
            });
        }
        Ok(())
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Raw close code.
    #[inline]
    pub fn code(&self) -> u16 {
        u16::from_be_bytes(get(self.buffer.as_ref(), field::CODE.start))
    }

    /// Raw reason bytes (UTF-8 is checked by [`Repr::parse`]).
    #[inline]
    pub fn reason(&self) -> &[u8] {
        &self.buffer.as_ref()[field::REASON]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the close code.
    #[inline]
    pub fn set_code(&mut self, value: u16) {
        set(
            self.buffer.as_mut(),
            field::CODE.start,
            &value.to_be_bytes(),
        );
    }

    /// Reason bytes, mutable.
    #[inline]
    pub fn reason_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::REASON]
    }
}

/// A CLOSE body as plain values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr<'a> {
    /// Close code.
    pub code: CloseCode,
    /// Reason for the user.
    pub reason: &'a str,
}

impl<'a> Repr<'a> {
    /// Parse a CLOSE body; the reason must be UTF-8.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&'a T>) -> Result<Repr<'a>> {
        packet.check_len()?;
        let body: &'a [u8] = packet.buffer.as_ref();
        let reason = body.get(field::REASON).unwrap_or_default();
        Ok(Repr {
            code: CloseCode::from_u16(packet.code()),
            reason: core::str::from_utf8(reason).map_err(|_| WireError::InvalidUtf8 {
                field: "close reason",
            })?,
        })
    }

    /// Body length: 2 + reason length.
    pub const fn buffer_len(&self) -> usize {
        BODY_MIN_LEN + self.reason.len()
    }

    /// Write the body into the first [`Repr::buffer_len`] bytes of `packet`.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) -> Result<()> {
        need(packet.buffer.as_ref(), self.buffer_len())?;
        packet.set_code(self.code.to_u16());
        packet.reason_mut()[..self.reason.len()].copy_from_slice(self.reason.as_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for code in 0..=8u16 {
            assert_eq!(CloseCode::from_u16(code).to_u16(), code);
        }
        assert_eq!(CloseCode::from_u16(2), CloseCode::StackMismatch);
        assert_eq!(CloseCode::from_u16(7), CloseCode::Busy);
        assert_eq!(CloseCode::Busy.to_string(), "busy with another peer");
        assert_eq!(CloseCode::from_u16(77), CloseCode::Unknown(77));
        assert_eq!(CloseCode::Unknown(77).to_string(), "unknown close code 77");
    }

    #[test]
    fn reason_must_be_utf8() {
        let body = [0, 1, 0xff];
        assert_eq!(
            Repr::parse(&Packet::new_checked(&body[..]).unwrap()),
            Err(WireError::InvalidUtf8 {
                field: "close reason"
            })
        );
    }

    #[test]
    fn one_byte_body_is_too_short() {
        assert_eq!(
            Packet::new_checked(&[0u8][..]),
            Err(WireError::BodyTooShort {
                kind: Kind::Close,
                field: "code",
                need: 2,
                have: 1
            })
        );
    }
}

//! `ACK` (kind 0x08): the receiver has delivered every frame up to `seq` in order on the
//! stream named by the prefix's stream id (≠ 0). No flags.
//!
//! Body (exactly 8 bytes):
//! ```text
//! off size field
//! 0   8    seq   highest sequence delivered in order on that stream
//! ```

use crate::cursor::{get, need, set};
use crate::ping::exact;
use crate::{Kind, Result, WireError};

/// Length of an ACK body.
pub const BODY_LEN: usize = 8;

/// Byte ranges of the ACK body fields.
pub mod field {
    use core::ops::Range;
    /// Highest in-order sequence.
    pub const SEQ: Range<usize> = 0..8;
}

/// Checked view of an ACK body. After [`Packet::new_checked`] no getter panics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap a body without checking its length.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wrap a body, checking it holds `seq`.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// `Err(BodyTooShort)` unless the body holds `seq`. Extra bytes are rejected by
    /// [`Repr::parse`], not here.
    pub fn check_len(&self) -> Result<()> {
        let have = self.buffer.as_ref().len();
        if have < BODY_LEN {
            return Err(WireError::BodyTooShort {
                kind: Kind::Ack,
                field: "seq",
                need: BODY_LEN,
                have,
            });
        }
        Ok(())
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Highest in-order sequence.
    #[inline]
    pub fn seq(&self) -> u64 {
        u64::from_be_bytes(get(self.buffer.as_ref(), field::SEQ.start))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the sequence.
    #[inline]
    pub fn set_seq(&mut self, value: u64) {
        set(self.buffer.as_mut(), field::SEQ.start, &value.to_be_bytes());
    }
}

/// An ACK body as plain values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Highest sequence delivered in order.
    pub seq: u64,
}

impl Repr {
    /// Parse an ACK body; extra bytes give `TrailingBytes`.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        exact(packet.buffer.as_ref().len(), BODY_LEN)?;
        Ok(Repr { seq: packet.seq() })
    }

    /// Body length: 8.
    pub const fn buffer_len(&self) -> usize {
        BODY_LEN
    }

    /// Write the body into the first 8 bytes of `packet`.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) -> Result<()> {
        need(packet.buffer.as_ref(), BODY_LEN)?;
        packet.set_seq(self.seq);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_length() {
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&[0u8; 10][..])),
            Err(WireError::TrailingBytes { extra: 2 })
        );
        assert_eq!(
            Packet::new_checked(&[0u8; 1][..]),
            Err(WireError::BodyTooShort {
                kind: Kind::Ack,
                field: "seq",
                need: 8,
                have: 1
            })
        );
    }
}

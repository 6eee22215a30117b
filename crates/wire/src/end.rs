//! `END` (kind 0x09): the sender's source of the stream named by the prefix's stream id (≠ 0)
//! has ended; after this message no DATA follows on that stream. `frames` is how many DATA
//! messages the sender sent on it, so the receiver can tell a clean end from a lost tail.
//! No flags.
//!
//! Body (exactly 8 bytes):
//! ```text
//! off size field
//! 0   8    frames   DATA messages sent on the stream
//! ```

use crate::cursor::{get, need, set};
use crate::ping::exact;
use crate::{Kind, Result, WireError};

/// Length of an END body.
pub const BODY_LEN: usize = 8;

/// Byte ranges of the END body fields.
pub mod field {
    use core::ops::Range;
    /// Highest in-order sequence.
    pub const FRAMES: Range<usize> = 0..8;
}

/// Checked view of an END body. After [`Packet::new_checked`] no getter panics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap a body without checking its length.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wrap a body, checking it holds `frames`.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// `Err(BodyTooShort)` unless the body holds `frames`. Extra bytes are rejected by
    /// [`Repr::parse`], not here.
    pub fn check_len(&self) -> Result<()> {
        let have = self.buffer.as_ref().len();
        if have < BODY_LEN {
            return Err(WireError::BodyTooShort {
                kind: Kind::End,
                field: "frames",
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
    pub fn frames(&self) -> u64 {
        u64::from_be_bytes(get(self.buffer.as_ref(), field::FRAMES.start))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the sequence.
    #[inline]
    pub fn set_frames(&mut self, value: u64) {
        set(
            self.buffer.as_mut(),
            field::FRAMES.start,
            &value.to_be_bytes(),
        );
    }
}

/// An END body as plain values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Highest sequence delivered in order.
    pub frames: u64,
}

impl Repr {
    /// Parse an END body; extra bytes give `TrailingBytes`.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        exact(packet.buffer.as_ref().len(), BODY_LEN)?;
        Ok(Repr {
            frames: packet.frames(),
        })
    }

    /// Body length: 8.
    pub const fn buffer_len(&self) -> usize {
        BODY_LEN
    }

    /// Write the body into the first 8 bytes of `packet`.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) -> Result<()> {
        need(packet.buffer.as_ref(), BODY_LEN)?;
        packet.set_frames(self.frames);
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
                kind: Kind::End,
                field: "frames",
                need: 8,
                have: 1
            })
        );
    }
}

//! `RESUME` (kind 0x0a): sent by each side once per connection, right after the handshake and
//! after the ACKs that tell the peer, for every stream this side sinks, the last sequence it
//! has delivered. `instance` identifies the sending process run (random, fixed for its
//! lifetime): a different value than on the previous connection means the peer restarted and
//! its sequence numbers start again. Stream id 0, no flags.
//!
//! Body (exactly 8 bytes):
//! ```text
//! off size field
//! 0   8    instance   random id of the sender's process run
//! ```

use crate::cursor::{get, need, set};
use crate::{Kind, Result, WireError};

/// Length of a RESUME body.
pub const BODY_LEN: usize = 8;

/// Byte ranges of the RESUME body fields.
pub mod field {
    use core::ops::Range;
    /// Sender's process-run id.
    pub const INSTANCE: Range<usize> = 0..8;
}

/// Checked view of a RESUME body. After [`Packet::new_checked`] no getter panics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap a body without checking its length.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wrap a body, checking it holds `instance`.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// `Err(BodyTooShort)` unless the body holds `instance`. Extra bytes are rejected by
    /// [`Repr::parse`], not here.
    pub fn check_len(&self) -> Result<()> {
        let have = self.buffer.as_ref().len();
        if have < BODY_LEN {
            return Err(WireError::BodyTooShort {
                kind: Kind::Resume,
                field: "instance",
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

    /// Sender's process-run id.
    #[inline]
    pub fn instance(&self) -> u64 {
        u64::from_be_bytes(get(self.buffer.as_ref(), field::INSTANCE.start))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the sender's clock.
    #[inline]
    pub fn set_t1(&mut self, value: u64) {
        set(
            self.buffer.as_mut(),
            field::INSTANCE.start,
            &value.to_be_bytes(),
        );
    }
}

/// A RESUME body as plain values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Sender's clock, ns since the Unix epoch.
    pub instance: u64,
}

impl Repr {
    /// Parse a RESUME body; extra bytes give `TrailingBytes`.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        exact(packet.buffer.as_ref().len(), BODY_LEN)?;
        Ok(Repr {
            instance: packet.instance(),
        })
    }

    /// Body length: 8.
    pub const fn buffer_len(&self) -> usize {
        BODY_LEN
    }

    /// Write the body into the first 8 bytes of `packet`.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) -> Result<()> {
        need(packet.buffer.as_ref(), BODY_LEN)?;
        packet.set_t1(self.instance);
        Ok(())
    }
}

/// `TrailingBytes` if a fixed-size body is longer than its layout.
pub(crate) fn exact(have: usize, len: usize) -> Result<()> {
    match have.saturating_sub(len) {
        0 => Ok(()),
        extra => Err(WireError::TrailingBytes { extra }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_length() {
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&[0u8; 9][..])),
            Err(WireError::TrailingBytes { extra: 1 })
        );
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&[0u8; 7][..])),
            Err(WireError::BodyTooShort {
                kind: Kind::Resume,
                field: "instance",
                need: 8,
                have: 7
            })
        );
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&[0, 0, 0, 0, 0, 0, 1, 2][..])),
            Ok(Repr { instance: 0x102 })
        );
    }
}

//! `CONTROL` (kind 0x02): a message between the two halves of one pair.
//!
//! The prefix's stream id names the target stream (≠ 0). Body:
//! ```text
//! off size field
//! 0   1    layer   index of the pair in the stack as the user wrote it (0 = first/top)
//! 1   …    msg     the control message bytes (rest; may be empty)
//! ```
//! It is addressed to the half of that pair on the receiving side. No flags are defined.

use crate::cursor::need;
use crate::{Kind, Result, WireError};

/// Smallest CONTROL body: the layer byte.
pub const BODY_MIN_LEN: usize = 1;

/// Byte ranges of the CONTROL body fields.
pub mod field {
    use core::ops::RangeFrom;
    /// Layer index.
    pub const LAYER: usize = 0;
    /// Control message.
    pub const MSG: RangeFrom<usize> = 1..;
}

/// Checked view of a CONTROL body. After [`Packet::new_checked`] no getter panics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap a body without checking its length.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wrap a body, checking it holds the layer byte.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// `Err(BodyTooShort)` unless the body holds the layer byte.
    pub fn check_len(&self) -> Result<()> {
        let have = self.buffer.as_ref().len();
        if have < BODY_MIN_LEN {
            return Err(WireError::BodyTooShort {
                kind: Kind::Control,
                field: "layer",
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

    /// Layer index.
    #[inline]
    pub fn layer(&self) -> u8 {
        self.buffer.as_ref()[field::LAYER]
    }

    /// Control message bytes.
    #[inline]
    pub fn msg(&self) -> &[u8] {
        &self.buffer.as_ref()[field::MSG]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the layer index.
    #[inline]
    pub fn set_layer(&mut self, value: u8) {
        self.buffer.as_mut()[field::LAYER] = value;
    }

    /// Control message bytes, mutable.
    #[inline]
    pub fn msg_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::MSG]
    }
}

/// A CONTROL body as plain values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr<'a> {
    /// Layer index (0 = first pair as written).
    pub layer: u8,
    /// Control message bytes.
    pub msg: &'a [u8],
}

impl<'a> Repr<'a> {
    /// Parse a CONTROL body.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&'a T>) -> Result<Repr<'a>> {
        packet.check_len()?;
        let body: &'a [u8] = packet.buffer.as_ref();
        Ok(Repr {
            layer: packet.layer(),
            msg: body.get(field::MSG).unwrap_or_default(),
        })
    }

    /// Body length: 1 + message length.
    pub const fn buffer_len(&self) -> usize {
        BODY_MIN_LEN + self.msg.len()
    }

    /// Write the body into the first [`Repr::buffer_len`] bytes of `packet`.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) -> Result<()> {
        need(packet.buffer.as_ref(), self.buffer_len())?;
        packet.set_layer(self.layer);
        packet.msg_mut()[..self.msg.len()].copy_from_slice(self.msg);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_body_is_too_short() {
        assert_eq!(
            Packet::new_checked(&[][..]),
            Err(WireError::BodyTooShort {
                kind: Kind::Control,
                field: "layer",
                need: 1,
                have: 0
            })
        );
    }

    #[test]
    fn round_trip_with_empty_msg() {
        let repr = Repr { layer: 4, msg: &[] };
        let mut buf = [0u8; 1];
        repr.emit(&mut Packet::new_unchecked(&mut buf[..])).unwrap();
        assert_eq!(buf, [4]);
        assert_eq!(
            Repr::parse(&Packet::new_checked(&buf[..]).unwrap()),
            Ok(repr)
        );
    }
}

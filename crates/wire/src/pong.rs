//! `PONG` (kind 0x07): answer to a PING. Stream id 0, no flags.
//!
//! Body (exactly 24 bytes):
//! ```text
//! off size field
//! 0   8    t1   echoed from the PING
//! 8   8    t2   receiver's clock when the PING arrived
//! 16  8    t3   receiver's clock when the PONG was sent
//! ```
//! All clocks are ns since the Unix epoch. With `t4` = the PING sender's clock when the PONG
//! arrives, [`clock_offset_ns`] gives the NTP-style offset and round-trip time.

use crate::cursor::exact;
use crate::cursor::{get, need, set};
use crate::{Kind, Result, WireError};

/// Length of a PONG body.
pub const BODY_LEN: usize = 24;

/// Byte ranges of the PONG body fields.
pub mod field {
    use core::ops::Range;
    /// Echoed PING time.
    pub const T1: Range<usize> = 0..8;
    /// PING arrival time.
    pub const T2: Range<usize> = 8..16;
    /// PONG send time.
    pub const T3: Range<usize> = 16..24;
}

/// Checked view of a PONG body. After [`Packet::new_checked`] no getter panics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap a body without checking its length.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wrap a body, checking it holds `t1`, `t2` and `t3`.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// `Err(BodyTooShort)` unless the body holds all three times. Extra bytes are rejected by
    /// [`Repr::parse`], not here.
    pub fn check_len(&self) -> Result<()> {
        let have = self.buffer.as_ref().len();
        let (field, need) = if have < field::T1.end {
            ("t1", field::T1.end)
        } else if have < field::T2.end {
            ("t2", field::T2.end)
        } else {
            ("t3", field::T3.end)
        };
        if have < need {
            return Err(WireError::BodyTooShort {
                kind: Kind::Pong,
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

    /// Echoed PING time.
    #[inline]
    pub fn t1(&self) -> u64 {
        u64::from_be_bytes(get(self.buffer.as_ref(), field::T1.start))
    }

    /// PING arrival time (receiver's clock).
    #[inline]
    pub fn t2(&self) -> u64 {
        u64::from_be_bytes(get(self.buffer.as_ref(), field::T2.start))
    }

    /// PONG send time (receiver's clock).
    #[inline]
    pub fn t3(&self) -> u64 {
        u64::from_be_bytes(get(self.buffer.as_ref(), field::T3.start))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the echoed PING time.
    #[inline]
    pub fn set_t1(&mut self, value: u64) {
        set(self.buffer.as_mut(), field::T1.start, &value.to_be_bytes());
    }

    /// Set the PING arrival time.
    #[inline]
    pub fn set_t2(&mut self, value: u64) {
        set(self.buffer.as_mut(), field::T2.start, &value.to_be_bytes());
    }

    /// Set the PONG send time.
    #[inline]
    pub fn set_t3(&mut self, value: u64) {
        set(self.buffer.as_mut(), field::T3.start, &value.to_be_bytes());
    }
}

/// A PONG body as plain values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Echoed PING time.
    pub t1: u64,
    /// PING arrival time (receiver's clock).
    pub t2: u64,
    /// PONG send time (receiver's clock).
    pub t3: u64,
}

impl Repr {
    /// Parse a PONG body; extra bytes give `TrailingBytes`.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        packet.check_len()?;
        exact(packet.buffer.as_ref().len(), BODY_LEN)?;
        Ok(Repr {
            t1: packet.t1(),
            t2: packet.t2(),
            t3: packet.t3(),
        })
    }

    /// Body length: 24.
    pub const fn buffer_len(&self) -> usize {
        BODY_LEN
    }

    /// Write the body into the first 24 bytes of `packet`.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) -> Result<()> {
        need(packet.buffer.as_ref(), BODY_LEN)?;
        packet.set_t1(self.t1);
        packet.set_t2(self.t2);
        packet.set_t3(self.t3);
        Ok(())
    }
}

/// NTP-style clock offset and round-trip time from one PING/PONG exchange.
///
/// `t1`: PING sent (local clock); `t2`: PING received (peer clock); `t3`: PONG sent (peer
/// clock); `t4`: PONG received (local clock); all ns.
///
/// Returns `(offset, rtt)`: `offset = ((t2 - t1) + (t3 - t4)) / 2` is how far the peer's
/// clock is ahead of the local one (peer ≈ local + offset), so a peer timestamp `ts` maps to
/// local time `ts - offset`; `rtt = (t4 - t1) - (t3 - t2)` is the network round trip without
/// the peer's processing time. Computed without overflow; results are saturated to the
/// output types (a negative round trip, possible only with clocks stepping mid-exchange, is
/// reported as 0).
///
/// ```
/// // Peer clock 1000 ns ahead, 100 ns each way, 50 ns processing on the peer.
/// let (offset, rtt) = ndd_wire::clock_offset_ns(0, 1100, 1150, 250);
/// assert_eq!((offset, rtt), (1000, 200));
/// ```
pub fn clock_offset_ns(t1: u64, t2: u64, t3: u64, t4: u64) -> (i64, u64) {
    let (t1, t2, t3, t4) = (
        i128::from(t1),
        i128::from(t2),
        i128::from(t3),
        i128::from(t4),
    );
    let offset = ((t2 - t1) + (t3 - t4)).div_euclid(2);
    let rtt = (t4 - t1) - (t3 - t2);
    let offset = offset.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64;
    let rtt = rtt.clamp(0, i128::from(u64::MAX)) as u64;
    (offset, rtt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_symmetric_path() {
        // Peer is 5 s behind; 2 ms each way; 1 ms on the peer.
        let t1 = 10_000_000_000u64;
        let t2 = t1 - 5_000_000_000 + 2_000_000;
        let t3 = t2 + 1_000_000;
        let t4 = t1 + 5_000_000;
        assert_eq!(clock_offset_ns(t1, t2, t3, t4), (-5_000_000_000, 4_000_000));
    }

    #[test]
    fn offset_extremes_do_not_overflow() {
        assert_eq!(clock_offset_ns(0, u64::MAX, u64::MAX, 0), (i64::MAX, 0));
        assert_eq!(clock_offset_ns(u64::MAX, 0, 0, u64::MAX), (i64::MIN, 0));
        assert_eq!(clock_offset_ns(0, 0, 0, u64::MAX), (i64::MIN, u64::MAX));
    }

    #[test]
    fn short_body_names_the_field() {
        assert_eq!(
            Packet::new_checked(&[0u8; 20][..]),
            Err(WireError::BodyTooShort {
                kind: Kind::Pong,
                field: "t3",
                need: 24,
                have: 20
            })
        );
    }
}

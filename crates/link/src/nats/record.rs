//! The frame record of the NATS link: every data message carries one frame (packet/repr).
//!
//! ```text
//! off size (big-endian)
//!  0   2   stream id
//!  2   2   flags
//!  4   8   run id of the device side (a restarted device numbers its frames afresh)
//! 12   8   sequence number
//! 20   8   timestamp, ns since the Unix epoch (source clock)
//! 28   …   payload (the frame after its stack, encrypted under the group key)
//! ```

use bytes::{BufMut, Bytes, BytesMut};

/// The sequence number of a stream's END: an empty frame sealed like any other (so nobody
/// without the group key can forge one), after the stream's last frame.
pub const END_SEQ: u64 = u64::MAX;

/// Header length.
pub const HEADER_LEN: usize = 28;

/// A parsed record; the payload is a slice of the message (no copy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameRecord {
    /// Stream id.
    pub stream: u16,
    /// The sending run.
    pub run: u64,
    /// Sequence number.
    pub seq: u64,
    /// Source timestamp.
    pub timestamp_ns: u64,
    /// Flags.
    pub flags: u16,
    /// The frame's bytes.
    pub payload: Bytes,
}

impl FrameRecord {
    /// Parses a message body; `None` when it is shorter than the header.
    pub fn parse(b: &Bytes) -> Option<FrameRecord> {
        let h = b.get(..HEADER_LEN)?;
        let u64_at = |o: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&h[o..o + 8]);
            u64::from_be_bytes(a)
        };
        Some(FrameRecord {
            stream: u16::from_be_bytes([h[0], h[1]]),
            flags: u16::from_be_bytes([h[2], h[3]]),
            run: u64_at(4),
            seq: u64_at(12),
            timestamp_ns: u64_at(20),
            payload: b.slice(HEADER_LEN..),
        })
    }

    /// The message body.
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(HEADER_LEN + self.payload.len());
        b.put_u16(self.stream);
        b.put_u16(self.flags);
        b.put_u64(self.run);
        b.put_u64(self.seq);
        b.put_u64(self.timestamp_ns);
        b.put_slice(&self.payload);
        b.freeze()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixture() {
        let r = FrameRecord {
            stream: 1,
            run: 5,
            seq: 2,
            timestamp_ns: 3,
            flags: 4,
            payload: Bytes::from_static(b"hi"),
        };
        let b = r.encode();
        assert_eq!(
            &b[..],
            &[
                0, 1, 0, 4, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 3,
                b'h', b'i'
            ]
        );
        assert_eq!(FrameRecord::parse(&b), Some(r));
        assert_eq!(FrameRecord::parse(&b.slice(..27)), None);
    }
}

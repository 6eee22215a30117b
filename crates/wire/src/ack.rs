//! `ACK` (kind 0x08): the receiver has delivered every frame up to `seq` in order on the
//! stream named by the prefix's stream id (≠ 0). No flags.
//!
//! Body (exactly 8 bytes):
//! ```text
//! off size field
//! 0   8    seq   highest sequence delivered in order on that stream
//! ```

u64_body!(
    Kind::Ack,
    "ACK",
    seq,
    set_seq,
    SEQ,
    "Highest in-order sequence."
);

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

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

u64_body!(
    Kind::End,
    "END",
    frames,
    set_frames,
    FRAMES,
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
                kind: Kind::End,
                field: "frames",
                need: 8,
                have: 1
            })
        );
    }
}

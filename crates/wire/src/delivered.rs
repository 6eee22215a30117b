//! `DELIVERED` (kind 0x0b): the receiver's sink endpoint has completed (written, injected,
//! drawn) every frame of the stream named by the prefix's stream id (≠ 0) up to the endpoint
//! sequence `seq`, as the sink's stack output numbers it. No flags.
//!
//! Where ACK (wire sequence numbers, sent on receipt) lets a source forget what crossed the
//! link, DELIVERED lets it forget what the peer *process* has finished with: the frames a
//! source keeps from before its stack, to encode again for a peer that restarted.
//!
//! Body (exactly 8 bytes):
//! ```text
//! off size field
//! 0   8    seq   highest endpoint sequence the sink has completed
//! ```

u64_body!(
    Kind::Delivered,
    "DELIVERED",
    seq,
    set_seq,
    SEQ,
    "Highest completed endpoint sequence."
);

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
            Packet::new_checked(&[0u8; 3][..]),
            Err(WireError::BodyTooShort {
                kind: Kind::Delivered,
                field: "seq",
                need: 8,
                have: 3
            })
        );
    }
}

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

u64_body!(
    Kind::Resume,
    "RESUME",
    instance,
    set_instance,
    INSTANCE,
    "Sender's process-run id."
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

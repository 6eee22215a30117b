//! `PING` (kind 0x06): clock and liveness probe. Stream id 0, no flags.
//!
//! Body (exactly 8 bytes):
//! ```text
//! off size field
//! 0   8    t1   sender's clock when sent, ns since the Unix epoch
//! ```

u64_body!(Kind::Ping, "PING", t1, set_t1, T1, "Sender's clock.");

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
                kind: Kind::Ping,
                field: "t1",
                need: 8,
                have: 7
            })
        );
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&[0, 0, 0, 0, 0, 0, 1, 2][..])),
            Ok(Repr { t1: 0x102 })
        );
    }
}

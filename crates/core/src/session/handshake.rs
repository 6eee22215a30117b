//! The handshake decision (docs/protocol.md §5), sans-IO: given our HELLO and what the peer
//! opened with, go on (send READY), refuse (send CLOSE with a code and a reason), report the
//! peer's refusal, or drop a connection that is no ndd peer at all.
//!
//! Trust (pinned fingerprints) is checked before this by the link, which owns the files.

use ndd_wire::text::printable;
pub(crate) use ndd_wire::text::MAX_REASON;
use ndd_wire::{CloseCode, HelloRepr, OwnedMessage};

/// The first thing that came from the peer after the link was up.
#[derive(Debug)]
pub enum PeerOpening<'a> {
    /// A whole message.
    Message(&'a OwnedMessage),
    /// The first bytes carry a protocol version other than ours.
    Version {
        /// What the peer speaks.
        got: u8,
        /// What we speak.
        expected: u8,
    },
    /// The connection closed before a whole message.
    Closed,
    /// Bytes that do not parse, a timeout: no ndd peer.
    Garbage(String),
}

/// What to do with a connection after its opening.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandshakeDecision {
    /// Both HELLOs agree: send READY, then the session runs.
    Agree(HelloRepr),
    /// A real peer we cannot work with: send it CLOSE with this code and reason, and report
    /// the reason here too.
    Refuse {
        /// Close code.
        code: CloseCode,
        /// Why, naming the stream and layer where that applies.
        reason: String,
    },
    /// The peer refused us with CLOSE.
    RefusedByPeer {
        /// Its code.
        code: CloseCode,
        /// Its reason.
        reason: String,
    },
    /// Not an ndd peer (an HTTP request, random bytes, a scanner): drop it, serve on.
    NotAPeer(String),
}

impl HandshakeDecision {
    /// A refusal a user can act on: a peer that exists but disagrees (or refused us).
    pub fn is_peer_problem(&self) -> bool {
        matches!(
            self,
            HandshakeDecision::Refuse { .. } | HandshakeDecision::RefusedByPeer { .. }
        )
    }
}

/// Decides on the peer's opening. Versions 2..=15 are taken as a future ndd (a version
/// mismatch worth naming); any other first byte is garbage.
pub fn decide(ours: &HelloRepr, opening: PeerOpening<'_>) -> HandshakeDecision {
    match opening {
        PeerOpening::Message(OwnedMessage::Hello(theirs)) => {
            match ndd_wire::compare_hello(ours, theirs) {
                Ok(()) => HandshakeDecision::Agree(theirs.clone()),
                // The message quotes the peer's names and descriptions: escaped.
                Err(m) => HandshakeDecision::Refuse {
                    code: CloseCode::StackMismatch,
                    reason: printable(&m.to_string(), MAX_REASON),
                },
            }
        }
        PeerOpening::Message(OwnedMessage::Close { code, reason }) => {
            HandshakeDecision::RefusedByPeer {
                code: *code,
                reason: printable(reason, MAX_REASON),
            }
        }
        PeerOpening::Message(_) => {
            HandshakeDecision::NotAPeer("the first message was not a HELLO".into())
        }
        PeerOpening::Version {
            got: got @ 2..=15,
            expected,
        } => HandshakeDecision::Refuse {
            code: CloseCode::VersionMismatch,
            reason: format!(
                "peer speaks protocol version {got}, this side speaks version {expected}"
            ),
        },
        PeerOpening::Version { got, .. } => {
            HandshakeDecision::NotAPeer(format!("unknown protocol version {got}"))
        }
        PeerOpening::Closed => {
            HandshakeDecision::NotAPeer("closed the connection before its HELLO".into())
        }
        PeerOpening::Garbage(why) => HandshakeDecision::NotAPeer(why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndd_wire::{Direction, LayerDecl, Side, StreamDecl};

    fn hello(side: Side, hash: u64) -> HelloRepr {
        HelloRepr {
            side,
            max_body: 1 << 20,
            driver: "d".into(),
            streams: vec![StreamDecl {
                id: 1,
                direction: Direction::DeviceToApp,
                name: "events".into(),
                layers: vec![LayerDecl {
                    module_id: 3,
                    param_hash: hash,
                    description: format!("checksum(h={hash})"),
                }],
            }],
        }
    }

    #[test]
    fn agreeing_hellos_go_on_and_disagreeing_ones_are_refused_naming_the_layer() {
        let ours = hello(Side::Device, 7);
        let theirs = OwnedMessage::Hello(hello(Side::App, 7));
        assert!(matches!(
            decide(&ours, PeerOpening::Message(&theirs)),
            HandshakeDecision::Agree(_)
        ));
        let other = OwnedMessage::Hello(hello(Side::App, 8));
        match decide(&ours, PeerOpening::Message(&other)) {
            HandshakeDecision::Refuse { code, reason } => {
                assert_eq!(code, CloseCode::StackMismatch);
                assert!(reason.contains("stream \"events\" layer 0"), "{reason}");
            }
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn future_versions_are_named_and_garbage_is_not_a_peer() {
        let ours = hello(Side::Device, 7);
        let d = decide(
            &ours,
            PeerOpening::Version {
                got: 2,
                expected: 1,
            },
        );
        assert_eq!(
            d,
            HandshakeDecision::Refuse {
                code: CloseCode::VersionMismatch,
                reason: "peer speaks protocol version 2, this side speaks version 1".into()
            }
        );
        assert!(!decide(
            &ours,
            PeerOpening::Version {
                got: b'G',
                expected: 1
            }
        )
        .is_peer_problem());
        assert!(!decide(&ours, PeerOpening::Message(&OwnedMessage::Ready)).is_peer_problem());
        let refused = OwnedMessage::Close {
            code: CloseCode::UntrustedPeer,
            reason: "no".into(),
        };
        assert!(decide(&ours, PeerOpening::Message(&refused)).is_peer_problem());
    }
}

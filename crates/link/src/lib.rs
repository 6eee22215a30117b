//! # ndd-link — links between the two sides of a driver
//!
//! **Layer:** I/O. This is the only crate that owns sockets. It carries the messages of
//! `ndd-wire` between the device side and the app side, and owns what a link needs besides
//! bytes: this machine's identity (a key pair and a self-signed certificate), the list of
//! pinned peers (`known_peers`) and mutual TLS 1.3. The session logic (`ndd-core`) decides
//! what to send and when; this crate moves it.
//!
//! - [`identity`]: `key.pem`/`cert.pem` in the ndd home directory, fingerprints;
//! - [`trust`]: the `known_peers` file;
//! - [`tls`]: rustls configurations (ring provider, TLS 1.3 only, client certificates
//!   required) with verifiers that check handshake signatures but leave trust to pinning;
//! - [`conn`]: TCP listen/accept/connect, with or without TLS, and message framing;
//! - [`quic`]: QUIC (quinn) with the same identities and verifiers: a stream per reliable
//!   stream, a session stream per direction, lossy streams as datagrams;
//! - [`udp`]: UDP datagrams for LANs, sealed unless `--insecure`, reliable messages
//!   retransmitted ([`arq`]);
//! - [`establish`]: one face for the three links ([`Rx`], [`Tx`]) and the [`Connector`]
//!   that listens or connects with backoff, checks trust and runs the handshake;
//! - [`frag`]: the sans-IO datagram fragment header and reassembler shared by both;
//! - [`arq`]: the sans-IO retransmission that makes reliable messages reliable over UDP;
//! - [`nats`]: the NATS link (one device, many app sides, through Debian's `nats-server`),
//!   with its join handshake and group key;
//! - [`tunnel`]: a pinned TLS byte tunnel for another protocol's TCP bytes (the RFB
//!   accelerator's slow leg);
//!
//! `docs/links.md` compares the links: guarantees, wire mapping, limits, when to use which.
//!
//! A typical server loop: `listen`, then repeatedly `accept` (a failed handshake costs that
//! connection only), [`KnownPeers::verify`] the peer's fingerprint, `split`, and read and
//! write messages. `docs/security.md` describes the trust model for users.
//!
//! **Invariants**
//! - Nothing read from a peer can panic this crate: every length is checked by `ndd-wire`
//!   before it is used, and every failure is a typed [`LinkError`] (the NATS driver's a
//!   [`nats::drive::DriveError`]) whose text a user can act on. After a read error the connection is to be closed.
//! - A reader never buffers more than one message past its `max_body` limit: the limit is
//!   checked as soon as a message's 10-byte prefix is in.
//! - DATA payloads are never copied: received ones are slices of the read buffer, sent ones
//!   get their header written into the frame's headroom.
//! - TLS is 1.3 only, with ring only; each side proves it holds the key of the certificate
//!   it shows. A TLS connection is authenticated only once the caller has checked the peer's
//!   fingerprint against `known_peers`. Plain TCP (`--insecure`) authenticates nothing.
//! - Private keys are written with mode 0600 and refused when others can read them.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod arq;
pub mod conn;
mod error;
pub mod establish;
pub mod frag;
pub mod identity;
pub mod nats;
pub mod pair;
pub mod quic;
pub mod seal;
pub mod tls;
pub mod trust;
pub mod tunnel;
pub mod udp;

pub use conn::{
    connect, listen, Conn, Incoming, Listener, MessageReader, MessageWriter, PeerInfo,
    DEFAULT_MAX_BODY,
};
pub use error::{LinkError, Result};
pub use establish::{
    Connector, EstablishError, Established, HandshakeCtx, PeerGate, Rx, Tls, TransportKind, Tx,
    CHUNK_BYTES,
};
pub use frag::{DatagramStats, ReassemblyConfig};
pub use identity::{default_home, fingerprint_of_cert, fingerprint_of_spki, Identity};
pub use quic::{
    quic_connect, quic_connect_with, quic_listen, quic_listen_with, QuicConn, QuicListener,
    QuicSender,
};
pub use rustls::{ClientConfig, ServerConfig};
pub use tls::{client_config, peer_fingerprint, server_config};
pub use trust::{validate_fingerprint, KnownPeers, Trusted, KNOWN_PEERS_FILE};
pub use udp::{
    udp_accept_secure, udp_bind, udp_connect, udp_connect_secure, Admission, UdpLink, UdpSender,
};

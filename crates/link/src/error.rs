//! The one error type of this crate.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Everything that can go wrong in a link: identity files, trust, TLS, sockets and framing.
///
/// Every text says what is wrong and, where the user can fix it, how.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LinkError {
    /// A file or directory operation failed.
    #[error("{action} {}: {source}", path.display())]
    File {
        /// What was being done ("reading", "creating", …).
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// No identity exists in the home directory.
    #[error(
        "no identity in {}: {} is missing; run `ndd keygen` (with `--home {}` if needed)",
        home.display(),
        missing.display(),
        home.display()
    )]
    NoIdentity {
        /// The home directory.
        home: PathBuf,
        /// The file that is missing.
        missing: PathBuf,
    },

    /// `create` without `force` found an existing key.
    #[error(
        "an identity already exists at {}; refusing to overwrite it. Pass `--force` to replace \
         it (every peer that pinned the old fingerprint will then refuse this machine)",
        path.display()
    )]
    KeyExists {
        /// The existing key file.
        path: PathBuf,
    },

    /// The private key file is readable or writable by others.
    #[error(
        "private key {} has permissions {mode:04o}, but it must be readable by its owner only \
         (0600); fix it with: chmod 600 {}",
        path.display(),
        path.display()
    )]
    KeyPermissions {
        /// The key file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },

    /// A file that others can write to would let them change whom this machine trusts.
    #[error(
        "{} has permissions {mode:04o}, writable by other users, who could add peers to it; \
         fix it with: chmod 600 {}",
        path.display(),
        path.display()
    )]
    TrustFilePermissions {
        /// The known_peers file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },

    /// An identity or trust file that is not a plain file of sensible size.
    #[error("{}: {reason}; it must be a regular file of at most {max} bytes", path.display())]
    FileShape {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
        /// The size limit.
        max: u64,
    },

    /// The ndd home directory is writable by others, who could replace the key or the list
    /// of trusted peers.
    #[error(
        "{} has permissions {mode:04o}, writable by other users, who could replace this \
         machine's key or the peers it trusts; fix it with: chmod 700 {}",
        path.display(),
        path.display()
    )]
    HomePermissions {
        /// The home directory.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },

    /// A PEM file could not be parsed.
    #[error("{}: not a valid PEM {what}: {reason}", path.display())]
    BadPem {
        /// The file.
        path: PathBuf,
        /// "certificate" or "private key".
        what: &'static str,
        /// What the PEM parser said.
        reason: String,
    },

    /// `key.pem` and `cert.pem` do not belong together.
    #[error(
        "{} does not hold the key of the certificate in {}; run `ndd keygen --force` to make a \
         new identity",
        key.display(),
        cert.display()
    )]
    KeyMismatch {
        /// The key file.
        key: PathBuf,
        /// The certificate file.
        cert: PathBuf,
    },

    /// The key in `key.pem` is of a type this build cannot use.
    #[error("{}: unusable private key: {reason}", path.display())]
    BadKey {
        /// The key file.
        path: PathBuf,
        /// Why.
        reason: String,
    },

    /// Generating a key or certificate failed.
    #[error("generating the key pair and certificate failed: {0}")]
    KeyGen(#[from] rcgen::Error),

    /// Certificate bytes that are not a well-formed X.509 certificate.
    #[error("malformed certificate: {0}")]
    BadCertificate(&'static str),

    /// A string that is not a fingerprint.
    #[error(
        "`{input}` is not a fingerprint: {reason}; a fingerprint looks like \
         SHA256:<43 base64 characters>, as printed by `ndd id`"
    )]
    BadFingerprint {
        /// What was given.
        input: String,
        /// Why it is rejected.
        reason: &'static str,
    },

    /// A peer name that cannot be stored in known_peers.
    #[error("peer name {name:?} is not allowed: {reason}")]
    BadPeerName {
        /// The name.
        name: String,
        /// Why.
        reason: &'static str,
    },

    /// A line of known_peers that does not parse.
    #[error("{}:{line}: {reason}", path.display())]
    KnownPeersLine {
        /// The known_peers file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },

    /// The peer presented a key that is not in known_peers.
    #[error(
        "refusing unknown peer {fingerprint}: it is not listed in {}. If you trust this peer \
         (compare with `ndd id` on the other machine), run: {trust_command} (or pair the two \
         machines by a code: `ndd pair` on one, `ndd pair CODE --connect HOST` on the other)",
        known_peers.display()
    )]
    UnknownPeer {
        /// The peer's fingerprint.
        fingerprint: String,
        /// The known_peers file that was consulted.
        known_peers: PathBuf,
        /// The command that trusts this peer (`ndd trust … --name NAME`, with `--home` when
        /// the home directory is not the default one).
        trust_command: String,
    },

    /// A TLS configuration or protocol error.
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),

    /// A TLS connection has no peer certificate (cannot happen with our verifiers).
    #[error("the peer presented no certificate")]
    NoPeerCertificate,

    /// Binding a listening socket failed.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// Accepting a TCP connection failed.
    #[error("accepting a connection failed: {0}")]
    Accept(#[source] io::Error),

    /// Connecting failed.
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        /// The address.
        addr: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// Connecting (TCP and TLS handshake) took too long.
    #[error("connecting to {addr} timed out after {timeout:?}")]
    ConnectTimeout {
        /// The address.
        addr: String,
        /// The limit.
        timeout: Duration,
    },

    /// The TLS handshake with a peer failed.
    #[error("TLS handshake with {addr} failed: {source}{}", handshake_hint(source))]
    Handshake {
        /// The peer's address.
        addr: SocketAddr,
        /// What went wrong.
        #[source]
        source: io::Error,
    },

    /// The TLS handshake with a peer did not finish in time.
    #[error("TLS handshake with {addr} did not finish within {timeout:?}")]
    HandshakeTimeout {
        /// The peer's address.
        addr: SocketAddr,
        /// The limit.
        timeout: Duration,
    },

    /// The peer closed the connection inside a message.
    #[error("peer closed the connection in the middle of a message (got {got} of {need} bytes)")]
    ClosedMidMessage {
        /// Bytes of the message received.
        got: usize,
        /// Bytes the message needs (at least the 10-byte prefix when the length is not known).
        need: usize,
    },

    /// The TLS stream ended without a close_notify alert.
    #[error(
        "the peer's TLS stream ended without close_notify: the connection was cut (peer \
         crashed, network failure, or someone truncated the stream)"
    )]
    TlsTruncated,

    /// A message larger than the peer accepts, refused before sending.
    #[error(
        "message body of {len} bytes exceeds the peer's limit of {max} bytes (its max_body); \
         send smaller frames or raise max_body on the peer"
    )]
    TooLargeForPeer {
        /// Body length of the message.
        len: u64,
        /// The peer's announced max_body.
        max: u32,
    },

    /// A plain-TCP (`--insecure`) side received a TLS handshake.
    #[error(
        "the peer speaks TLS but this side runs with --insecure; run both sides with \
         --insecure, or neither"
    )]
    PeerSpeaksTls,

    /// Bytes on the link are not a valid message.
    #[error(transparent)]
    Wire(#[from] ndd_wire::WireError),

    /// Reading from or writing to the connection failed.
    #[error("{}", io_text(.0))]
    Io(#[from] io::Error),

    /// Starting a QUIC connection failed before any packet was sent (bad address, bad
    /// configuration).
    #[error("cannot connect to {addr} over QUIC: {source}")]
    QuicConnect {
        /// The address.
        addr: String,
        /// What quinn said.
        #[source]
        source: quinn::ConnectError,
    },

    /// The QUIC handshake with a peer failed (wrong key, not an ndd, timeout…).
    #[error("QUIC handshake with {addr} failed: {}", quic_shown(.error))]
    QuicHandshake {
        /// The peer's address.
        addr: SocketAddr,
        /// What went wrong (shown escaped: it may quote the peer's close reason; not a
        /// `source`, so no error chain shows it raw).
        error: quinn::ConnectionError,
    },

    /// An established QUIC connection failed or was closed by the peer with an error (these
    /// four show quinn's words escaped: they quote the peer's close reason).
    #[error("QUIC connection: {}", quic_shown(.0))]
    QuicConnection(quinn::ConnectionError),

    /// Writing to a QUIC stream failed.
    #[error("QUIC stream write: {}", quic_shown(.0))]
    QuicWrite(quinn::WriteError),

    /// Reading a QUIC stream failed.
    #[error("QUIC stream read: {}", quic_shown(.0))]
    QuicRead(quinn::ReadError),

    /// The peer does not accept QUIC datagrams (or they are disabled), so lossy streams
    /// cannot be carried.
    #[error("QUIC datagram: {}", quic_shown(.0))]
    QuicDatagram(quinn::SendDatagramError),

    /// A rustls configuration cannot be used for QUIC.
    #[error("TLS configuration unusable for QUIC: {0}")]
    QuicConfig(String),

    /// The UDP link has no peer yet: a bound link learns its peer from the first valid
    /// datagram it receives.
    #[error("the UDP link has no peer yet: it learns it from the first datagram it receives")]
    NoPeer,

    /// A message too large to fragment into datagrams of the link's size.
    #[error(
        "message of {len} bytes cannot be sent as datagrams: at most {max} bytes fit in 65535 \
         fragments; send it on a reliable stream or raise the datagram size"
    )]
    DatagramTooLarge {
        /// Message length.
        len: usize,
        /// The most that fits.
        max: usize,
    },

    /// The link is closed.
    #[error("the link is closed")]
    Closed,

    /// The NATS link: the server, its credentials or the join handshake over it.
    #[error("{0}")]
    Nats(String),

    /// The accepting side of a tunnel said no (or hung up) after TLS.
    #[error("the tunnel peer {addr} refused this install: {reason}")]
    TunnelRefused {
        /// The peer's address.
        addr: SocketAddr,
        /// What it said.
        reason: String,
    },

    /// No answer to the UDP key exchange in time.
    #[error(
        "no answer to the UDP key exchange from {addr} in {} ms (is an ndd listening there with \
         transport = \"udp\", not with --insecure, and not busy with another device?)",
        timeout.as_millis()
    )]
    UdpKeyExchangeTimeout {
        /// The peer's address.
        addr: SocketAddr,
        /// The limit.
        timeout: Duration,
    },

    /// A key exchange started while the sealed UDP link was up, and the peer did not answer
    /// a probe on the live keys: it restarted (or its keys are gone).
    #[error(
        "a new UDP key exchange began and the peer did not answer on the current keys within {} ms: it restarted",
        waited.as_millis()
    )]
    PeerRekeyed {
        /// How long the probe waited.
        waited: Duration,
    },

    /// This side cannot take part in the UDP key exchange (its key cannot sign).
    #[error("UDP key exchange: {0}")]
    Seal(#[from] crate::seal::SealError),
}

/// Result with [`LinkError`].
pub type Result<T, E = LinkError> = std::result::Result<T, E>;

/// A guess at the cause of a failed handshake, for the error text.
fn handshake_hint(e: &io::Error) -> &'static str {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        return " (the peer closed the connection during the handshake: it may run with \
                 --insecure, or not be an ndd)";
    }
    match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        Some(rustls::Error::InvalidMessage(_)) => {
            " (the peer does not speak TLS: is it an ndd run with --insecure, or another program?)"
        }
        Some(rustls::Error::NoApplicationProtocol) => " (the peer is not an ndd)",
        Some(rustls::Error::InvalidCertificate(rustls::CertificateError::BadSignature)) => {
            " (the peer could not prove that it holds the key of the certificate it showed)"
        }
        _ => "",
    }
}

impl LinkError {
    pub(crate) fn file(action: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        LinkError::File {
            action,
            path: path.into(),
            source,
        }
    }
}

/// What a failed read or write on the connection says: the two ways a peer's connection
/// usually ends without a goodbye in words, anything else as the system put it.
fn io_text(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::ConnectionReset => format!(
            "the peer reset the connection: it was killed or crashed, or something on the \
             path (a firewall, a NAT) cut it ({e})"
        ),
        io::ErrorKind::BrokenPipe => format!("the peer had already closed the connection ({e})"),
        _ => format!("connection: {e}"),
    }
}

/// quinn's words about a connection: they quote the close reason the peer sent (anyone
/// who reaches a QUIC listener can send one), so escaped and bounded.
/// With the errors under it (a lost connection names its cause there), each said once.
fn quic_shown(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let t = c.to_string();
        if !text.contains(&t) {
            text = format!("{text}: {t}");
        }
        cause = c.source();
    }
    ndd_wire::text::printable(&text, ndd_wire::text::MAX_REASON)
}

impl From<quinn::ConnectionError> for LinkError {
    fn from(e: quinn::ConnectionError) -> Self {
        LinkError::QuicConnection(e)
    }
}

impl From<quinn::WriteError> for LinkError {
    fn from(e: quinn::WriteError) -> Self {
        LinkError::QuicWrite(e)
    }
}

impl From<quinn::ReadError> for LinkError {
    fn from(e: quinn::ReadError) -> Self {
        LinkError::QuicRead(e)
    }
}

impl From<quinn::SendDatagramError> for LinkError {
    fn from(e: quinn::SendDatagramError) -> Self {
        LinkError::QuicDatagram(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer's QUIC close reason comes out escaped, with nothing raw in the error chain.
    #[test]
    fn a_quic_close_reason_from_the_peer_is_escaped() {
        let close = quinn::ConnectionError::ApplicationClosed(quinn::ApplicationClose {
            error_code: quinn::VarInt::from_u32(9),
            reason: bytes::Bytes::from_static(b"bye\x1b[2J\nndd: error: forged\xe2\x80\xae"),
        });
        let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
        for e in [
            LinkError::QuicHandshake {
                addr,
                error: close.clone(),
            },
            LinkError::from(close.clone()),
            LinkError::from(quinn::ReadError::ConnectionLost(close.clone())),
            LinkError::from(quinn::WriteError::ConnectionLost(close.clone())),
            LinkError::from(quinn::SendDatagramError::ConnectionLost(close.clone())),
        ] {
            let text = e.to_string();
            assert!(
                text.contains("bye\\u{1b}[2J\\nndd: error: forged\\u{202e}"),
                "{text}"
            );
            assert!(!text.contains(['\x1b', '\n', '\u{202e}']), "{text}");
            assert!(std::error::Error::source(&e).is_none(), "{text}");
        }
    }

    #[test]
    fn a_reset_or_closed_connection_is_said_in_words() {
        let text = |kind| LinkError::Io(io::Error::from(kind)).to_string();
        let reset = text(io::ErrorKind::ConnectionReset);
        assert!(
            reset.starts_with("the peer reset the connection: it was killed or crashed"),
            "{reset}"
        );
        let pipe = text(io::ErrorKind::BrokenPipe);
        assert!(
            pipe.starts_with("the peer had already closed the connection"),
            "{pipe}"
        );
        let other = text(io::ErrorKind::TimedOut);
        assert!(other.starts_with("connection: "), "{other}");
    }
}

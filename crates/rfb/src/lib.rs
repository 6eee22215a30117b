//! ndd-rfb: the RFB Message Accelerator (seed 001) — a VNC proxy that runs next to the server and
//! keeps a client-pull viewer at its natural frame rate however high the network latency.
//!
//! Layers and invariants:
//! - [`proto`], [`server`], [`client`], [`handshake`]: sans-IO RFB parsing. No sockets, no clock.
//!   Bytes from a peer are never trusted: every bad input is a typed [`ParseError`], never a panic.
//!   The server-stream delimiter keeps at most a 16-byte header, never a whole update, so bytes
//!   are forwarded as they arrive.
//! - [`accel`]: the tokio proxy ([`run_accel`], [`serve_accel`]). One task per session; a bad
//!   session closes with one log line (at most five a second, with the count of those held
//!   back) and never affects the others. Client input is queued ahead
//!   of everything else towards the server, and the proxy holds at most one update.
//! - [`bench`]: `ndd bench rfb`, against a real Xvnc, with a delay proxy, writing
//!   `docs/bench/rfb.md` and `docs/bench/rfb.svg`.

pub mod accel;
pub mod bench;
pub mod client;
pub mod handshake;
pub mod proto;
pub mod server;

pub use accel::{accel_client, run_accel, serve_accel, AccelOptions, SessionStats};
pub use bench::{bench, BenchOptions, BenchReport};
pub use proto::{PixelFormat, UpdateRequest};

/// A protocol violation found by the parsers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("message truncated")]
    Truncated,
    #[error("not an RFB 3.x ProtocolVersion")]
    BadVersion,
    #[error("unsupported pixel format: {0} bits per pixel")]
    BadPixelFormat(u8),
    #[error("unknown server message type {0}")]
    UnknownServerMessage(u8),
    #[error("unknown client message type {0}")]
    UnknownClientMessage(u8),
    #[error("encoding {0} was not negotiated through the accelerator")]
    UnknownEncoding(i32),
    #[error("bad Tight compression control {0:#x}")]
    BadTightControl(u8),
    #[error("bad Tight filter {0}")]
    BadTightFilter(u8),
    #[error("fence payload of {0} bytes (at most 64)")]
    FenceTooLong(u8),
    #[error("message of {0} bytes exceeds the limit")]
    TooLong(u64),
}

/// Which peer sent the bad bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    Client,
    Server,
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Peer::Client => "client",
            Peer::Server => "server",
        })
    }
}

/// Errors of the accelerator and the benchmark.
#[derive(Debug, thiserror::Error)]
pub enum RfbError {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("malformed message from the {peer}: {error}")]
    Malformed { peer: Peer, error: ParseError },
    #[error("handshake: {0}")]
    Handshake(String),
    #[error("timed out: {0}")]
    Timeout(String),
    #[error("benchmark: {0}")]
    Bench(String),
}

//! # ndd-wire — the ndd wire format
//!
//! **Layer:** wire format only. This crate turns bytes into typed messages and back. It does
//! no I/O, reads no clock, spawns nothing and depends on nothing but `thiserror`; the session
//! state machine (`ndd-core`) and the links decide what to send and when. The byte-by-byte
//! specification, the handshake sequence and the test vectors are in `docs/protocol.md`.
//!
//! **Style** (after smoltcp's `wire/`): each format has a checked view over bytes,
//! `xxx::Packet<T: AsRef<[u8]>>` with `new_unchecked`, `new_checked` (length check), getters
//! and, for `T: AsMut<[u8]>`, setters; and a plain `xxx::Repr` with `parse(&Packet)`,
//! `buffer_len()` and `emit(&mut Packet)`. [`Message`] ties them together: one call parses
//! or emits any whole message. [`DataHeader`] is the zero-copy hot path for frames.
//!
//! **Invariants**
//! - Nothing here panics on any input. After a successful `new_checked` no getter panics;
//!   `parse` functions check lengths themselves; `emit` checks the output size and returns
//!   [`WireError::BufferTooSmall`] rather than panicking. (Getters on a view made with
//!   `new_unchecked` over a too-short buffer may panic, as in smoltcp; parsing never does
//!   that.) `#![forbid(unsafe_code)]`.
//! - Every error is typed ([`WireError`]) and its text says what is wrong in terms a user
//!   can act on. [`WireError::Truncated`] alone means "read more"; every other error means
//!   the bytes are bad.
//! - Whatever `emit` writes, `parse` accepts and gives back equal; whatever `parse` rejects,
//!   `emit` refuses to write.
//! - All integers are big-endian. Every message starts with the 10-byte prefix of
//!   [`header`]; its byte 0 is [`VERSION`].

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod cursor;
#[macro_use]
mod u64body;
mod error;
mod message;

pub mod ack;
pub mod audio;
pub mod clipboard;
pub mod close;
pub mod control;
pub mod data;
pub mod delivered;
pub mod display;
pub mod end;
pub mod header;
pub mod hello;
pub mod ping;
pub mod pong;
pub mod resume;
pub mod text;

pub use close::CloseCode;
pub use data::{DataHeader, DATA_HEADER_LEN, FLAG_MORE, FLAG_RETRANSMIT};
pub use error::{Result, WireError};
pub use header::{peek_message_len, Kind, HEADER_LEN};
pub use hello::{
    compare as compare_hello, param_hash, Direction, LayerDecl, Mismatch, Side, StreamDecl,
    MIN_MAX_BODY,
};
pub use message::{Message, OwnedMessage};
pub use pong::clock_offset_ns;

pub use ack::{Packet as AckPacket, Repr as AckRepr};
pub use close::{Packet as ClosePacket, Repr as CloseRepr};
pub use control::{Packet as ControlPacket, Repr as ControlRepr};
pub use data::{Packet as DataPacket, Repr as DataRepr};
pub use delivered::{Packet as DeliveredPacket, Repr as DeliveredRepr};
pub use end::{Packet as EndPacket, Repr as EndRepr};
pub use header::{Packet as HeaderPacket, Repr as HeaderRepr};
pub use hello::{Packet as HelloPacket, Repr as HelloRepr};
pub use ping::{Packet as PingPacket, Repr as PingRepr};
pub use pong::{Packet as PongPacket, Repr as PongRepr};
pub use resume::{Packet as ResumePacket, Repr as ResumeRepr};

/// The protocol version this crate speaks: byte 0 of every message.
pub const VERSION: u8 = 1;

#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod proptests;

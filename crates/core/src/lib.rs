//! ndd core: the sans-IO heart of the networked device driver.
//!
//! Layer: above the wire format, below links and endpoints. Nothing here does I/O, spawns a
//! thread or reads a clock: time comes in as `now` and deadlines go out via `poll_timeout`.
//!
//! - [`frame`]: [`Frame`], a message over reference-counted bytes with headroom, so pairs push
//!   and pop headers and pass frames on without copying payloads;
//! - [`half`]: the [`Half`]/[`Pair`] module model;
//! - [`error`]: the typed causes of a [`ModuleError`] and [`ParamError`], the error of a
//!   pair's parameter check;
//! - [`stack`]: [`Stack`], the ordered halves of one stream on one side;
//! - [`pathrate`]: [`PathRate`], a path's bottleneck rate, round trip and in-flight window
//!   from a sender's own sends and acknowledgements (BBR's model: Startup, then ProbeBw);
//! - [`ratelimit`]: [`RateLimit`], so a half that drops untrusted frames logs once a second,
//!   not once a frame;
//! - [`session`]: [`Session`], one side of a driver as a state machine: handshake decision,
//!   ACK/DELIVERED/RESUME, retransmission, dedupe, peer restarts, keepalive, close, and the
//!   clock offset to the peer. The `ndd` binary drives it over a real link; the testkit drives
//!   two of them over a simulated one;
//! - `testlog` (feature `test-log`, tests only): `Captured`, the log lines a test counts.
//!
//! Invariants: a frame handed to a stack comes out of it (transformed), is counted as dropped
//! by a half, or is held by a half that reports it in its queue depth; a module error is fatal
//! for the stream and names the stream, layer and module.

#![forbid(unsafe_code)]

pub mod error;
pub mod frame;
pub mod half;
pub mod pathrate;
pub mod ratelimit;
pub mod session;
pub mod stack;
#[cfg(any(test, feature = "test-log"))]
pub mod testlog;

pub use error::{ControlError, ForeignError, FrameError, ParamError, SetupError};
pub use frame::{Frame, Meta};
pub use half::{Half, HalfStats, ModuleError, Output, Pair};
pub use pathrate::{PathRate, SendState};
pub use ratelimit::RateLimit;
pub use session::{
    Event, Incoming, Session, SessionConfig, SessionError, State, StreamPlan, Transmit,
};
pub use stack::{LayerStats, Role, Stack, StackError};

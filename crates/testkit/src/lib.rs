//! ndd simulation testkit: everything needed to run a source stack and a sink stack against
//! each other in virtual time, reproducibly.
//!
//! Layer: test support on top of `ndd-core`; no sockets, no threads, no sleeps, no wall
//! clock. All randomness comes from a seeded [`SimRng`], so a failing run is replayed by its
//! seed.
//!
//! - [`SimRng`]: seeded SplitMix64, stable across platforms and versions;
//! - [`SimClock`]: virtual time, as `Instant`s and as source timestamps in ns;
//! - [`SimLink`]: a one-way simulated network (delay, uniform jitter, loss, reordering or
//!   TCP-like in-order delivery, bandwidth, bit corruption);
//! - [`Pipeline`]: a source stack, a data link, a sink stack and control links both ways,
//!   driven event by event; [`spacing_error`] is the dissertation's jitter metric;
//! - [`session`]: two real `ndd_core::Session`s over simulated links, with cuts, blackholes
//!   and peer restarts, for whole-session property tests.

#![forbid(unsafe_code)]

mod clock;
pub mod experiments;
mod link;
mod pipeline;
mod rng;
pub mod session;

pub use clock::{SimClock, EPOCH_NS};
pub use link::{LinkConfig, SimLink};
pub use pipeline::{spacing_error, Delivery, Pipeline, SpacingError};
pub use rng::SimRng;

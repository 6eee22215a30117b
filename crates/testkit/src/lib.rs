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

/// Runs `run` over seeds 0..`count` (`SCHEDULES=n` for more or fewer), or only `SEED` when
/// that is set (printing its summary): the first failing seed panics with its error and the
/// command that replays it (`SEED=n cargo test -p ndd-testkit --test <test>`).
pub fn explore(test: &str, count: u64, run: impl Fn(u64) -> Result<String, String>) {
    let only = std::env::var("SEED")
        .ok()
        .map(|s| s.parse::<u64>().expect("SEED is a number"));
    let count = std::env::var("SCHEDULES")
        .ok()
        .map_or(count, |s| s.parse::<u64>().expect("SCHEDULES is a number"));
    for seed in only.map_or(0..count, |s| s..s + 1) {
        match run(seed) {
            Ok(summary) if only.is_some() => println!("seed {seed}: {summary}"),
            Ok(_) => {}
            Err(e) => panic!(
                "seed {seed}: {e}\nreplay: SEED={seed} cargo test -p ndd-testkit --test {test}"
            ),
        }
    }
}

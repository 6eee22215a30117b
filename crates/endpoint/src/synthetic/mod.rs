//! The `synthetic` class: simulated devices that need no hardware, each frame a pure function
//! of its sequence number.
//!
//! - `synthetic` source: the dissertation's benchmark device, `size` seeded pseudo-random
//!   bytes every `interval_ms`; its payload format ([`payload`], [`fill`], [`verify`], the
//!   [`SplitMix64`] generator) is re-exported here, and the `check` sink verifies it;
//! - `spacenav-sim` source: a six-axis 3D mouse at 62.5 Hz ([`spacenav`]: its 14-byte record
//!   and seeded motion).
//!
//! Files: `config.rs` ([`SyntheticConfig`], [`SpacenavSimConfig`]), `record.rs` (the benchmark
//! payload), `spacenav.rs`, `source.rs` (the timer-driven source task both run on).

mod config;
mod record;
mod source;
pub mod spacenav;

pub use config::{SpacenavSimConfig, SyntheticConfig};
pub use record::*;
pub(crate) use source::{run_paced, spawn_spacenav_sim_source, spawn_synthetic_source};

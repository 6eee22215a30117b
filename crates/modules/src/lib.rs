//! ndd transformation pairs.
//!
//! Layer: on top of `ndd-core`'s [`Half`](ndd_core::Half)/[`Pair`](ndd_core::Pair) model; no
//! I/O, no clock. One folder per pair (`mod.rs` holds the config and docs, `forward.rs` the
//! source half, `inverse.rs` the sink half, `tests.rs` the tests). [`registry`] is the closed
//! list a config file chooses from.
//!
//! Invariants: whatever a forward half does to the form of a frame, its inverse undoes before
//! the sink sees it, meta (sequence, timestamp, flags) included; bytes from the peer are never
//! trusted: a malformed frame is a [`ModuleError`](ndd_core::ModuleError), never a panic.

// No unsafe code but two audited calls into OpenH264's raw API (the video bit rate and frame
// rate, `image::video`), allowed there alone.
#![deny(unsafe_code)]

pub mod average;
pub mod buffer;
pub mod bundle;
pub mod checksum;
pub mod compress;
pub mod delta;
pub mod encrypt;
pub mod image;
pub mod latest;
pub mod multiplex;
pub mod opus;
pub mod pass;
pub mod periodic;
pub mod registry;
mod seq;
pub mod sync;
mod varint;

pub use registry::{ModuleConfig, ModuleInfo, ParamInfo, CATALOGUE, IDS};

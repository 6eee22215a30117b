//! ndd-ipc: placements for external modules.
//!
//! Layer: beside `ndd-modules`, on top of `ndd-core`'s [`Half`](ndd_core::Half)/
//! [`Pair`](ndd_core::Pair) model. A pair whose halves are separate programs (any language)
//! runs here: [`ExternalConfig`] is the pair, [`ExternalHalf`] the host half that forwards each
//! call to its child over a [`Transport`] and blocks until the child says `DONE`, so to the
//! stack it behaves exactly like an in-process half.
//!
//! - [`proto`]: the message format (spec and test vectors in `docs/external-modules.md`);
//! - [`transport`]: the [`Transport`] trait, pipes and shared memory;
//! - [`shm`]: the shared-memory SPSC ring (the only module with `unsafe`);
//! - [`child`]: the runtime a Rust child (or an in-process thread child) runs;
//! - [`external`]: the config, the host half and child-process management;
//! - [`error`]: [`ExternalError`], how the host half reports a failing program;
//!
//! Invariants: nothing the child sends is trusted (bad bytes are a [`ModuleError`] naming the
//! module, never a panic); every request has a deadline; a child process is killed and
//! reaped when its half is dropped or fails, so no zombie outlives a half.
//!
//! [`ModuleError`]: ndd_core::ModuleError

#![deny(unsafe_code)]

pub mod child;
pub mod error;
pub mod external;
pub mod proto;
#[allow(unsafe_code)]
pub mod shm;
pub mod transport;

pub use error::ExternalError;
pub use external::{ExternalConfig, ExternalHalf, Placement, Restart, EXTERNAL_ID};
pub use proto::HalfRole;
pub use transport::{PipeTransport, ShmTransport, Transport, TransportError};

//! What the driver's steps fail with: said in full for the person running the side.

use std::fmt::Display;

/// Why a side's run on NATS, or one of its tasks, failed.
#[derive(Debug, thiserror::Error)]
pub enum DriveError {
    /// What went wrong, said in full (the server's words in it escaped where they came in).
    #[error("{0}")]
    Said(String),
    /// Only a device side this side does not trust answered a join (the `ndd trust` line).
    #[error("{0}")]
    UntrustedDevice(String),
    /// No device side was subscribed to the join subject when the question came (the server
    /// said so at once): a settled answer, unlike no answer within the try.
    #[error("no device side is serving {0}")]
    NoDeviceServing(String),
    /// A stream's endpoint (the binary's side of it) failed, in its own words.
    #[error(transparent)]
    Endpoint(Box<dyn std::error::Error + Send + Sync>),
}

impl DriveError {
    /// `self` said after `context` (as `context: self`).
    pub fn context(self, context: impl Display) -> DriveError {
        DriveError::Said(format!("{context}: {self}"))
    }
}

/// A result of the driver.
pub type Result<T, E = DriveError> = std::result::Result<T, E>;

/// A [`DriveError::Said`] from `format!` arguments.
macro_rules! fail {
    ($($t:tt)*) => {
        $crate::nats::drive::DriveError::Said(format!($($t)*))
    };
}

/// Returns a [`DriveError::Said`] from `format!` arguments.
macro_rules! bail {
    ($($t:tt)*) => {
        return Err(fail!($($t)*))
    };
}

pub(super) use {bail, fail};

/// Context on any error: `context: error`, as a [`DriveError`].
pub trait Context<T> {
    /// The error said after `context`.
    fn context(self, context: impl Display) -> Result<T>;
}

impl<T, E: Display> Context<T> for std::result::Result<T, E> {
    fn context(self, context: impl Display) -> Result<T> {
        self.map_err(|e| fail!("{context}: {e}"))
    }
}

macro_rules! said_from {
    ($($t:ty),* $(,)?) => {
        $(impl From<$t> for DriveError {
            fn from(e: $t) -> DriveError {
                DriveError::Said(e.to_string())
            }
        })*
    };
}

said_from!(
    crate::LinkError,
    std::io::Error,
    ndd_core::ModuleError,
    ndd_core::StackError,
    crate::nats::join::JoinError,
    crate::nats::home::HomeError,
    crate::nats::follow::FollowEnd,
);

//! What can go wrong with an external module's program, as the host half reports it. An
//! [`ExternalError`] travels inside a [`ModuleError`](ndd_core::ModuleError) as a
//! [`ForeignError`](ndd_core::ForeignError) (get it back with `downcast_ref`); its text names
//! the module, the half and the placement.

use crate::external::{Placement, Restart};
use crate::proto::{HalfRole, ProtoError};
use std::fmt;
use std::io;
use std::process::ExitStatus;
use thiserror::Error;

/// Which half of which module: `external module "upper" (forward half, pipe, pid 4242)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Who {
    /// The module name.
    pub name: String,
    /// The half.
    pub role: HalfRole,
    /// How frames reach the program.
    pub placement: Placement,
    /// The program's pid (none for an in-process child, or when none runs).
    pub pid: Option<u32>,
}

impl fmt::Display for Who {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "external module \"{}\" ({} half, {}",
            self.name,
            self.role.as_str(),
            self.placement.as_str()
        )?;
        if let Some(pid) = self.pid {
            write!(f, ", pid {pid}")?;
        }
        f.write_str(")")
    }
}

/// An external module's program failed.
#[derive(Debug, Error)]
pub enum ExternalError {
    /// The program could not be started.
    #[error("{who}: {source}")]
    Start {
        /// The half.
        who: Who,
        /// Why.
        source: StartError,
    },
    /// The program did not answer `HELLO` with `DONE`.
    #[error("{who}: refused HELLO: {failure}")]
    Hello {
        /// The half.
        who: Who,
        /// What it did instead.
        failure: Failure,
    },
    /// The program answered a request with `ERROR` (never retried: the request is bad, not
    /// the program).
    #[error("{who} failed on a {request}: {message}")]
    Reported {
        /// The half.
        who: Who,
        /// The request: `frame`, `control message`, `timeout` or `flush`.
        request: &'static str,
        /// The program's `ERROR` text.
        message: String,
    },
    /// The program died, hung or wrote garbage on a request, and was not (or no longer)
    /// restarted.
    #[error("{who} {fault} on a {request} ({})", policy(*.restart))]
    Broken {
        /// The half.
        who: Who,
        /// What happened.
        fault: ChildFault,
        /// The request: `frame`, `control message`, `timeout` or `flush`.
        request: &'static str,
        /// The restart policy in force.
        restart: Restart,
    },
}

fn policy(restart: Restart) -> &'static str {
    match restart {
        Restart::Never => "restart = \"never\"",
        Restart::OnFailure => "failed again after a restart",
    }
}

/// What a program did instead of answering `DONE`.
#[derive(Debug, Error)]
pub enum Failure {
    /// It died, hung or wrote garbage (restartable).
    #[error(transparent)]
    Broken(#[from] ChildFault),
    /// It answered `ERROR` with this text.
    #[error("{0}")]
    Reported(String),
}

/// How a program broke down: it died, hung or wrote garbage.
#[derive(Debug, Error)]
pub enum ChildFault {
    /// No answer by the deadline.
    #[error("did not answer within {ms} ms (hung?)")]
    Timeout {
        /// The timeout.
        ms: u128,
    },
    /// The channel closed and the process exited.
    #[error("exited ({0})")]
    Exited(ExitStatus),
    /// The channel closed and waiting for the process failed.
    #[error("closed its channel (wait failed: {0})")]
    WaitFailed(io::Error),
    /// The channel closed but the process did not exit within 200 ms.
    #[error("closed its channel but is still running")]
    StillRunning,
    /// The channel of an in-process child closed.
    #[error("ended (in-process thread)")]
    ThreadEnded,
    /// Bytes that are not a message (the transport's description of them).
    #[error("wrote garbage: {0}")]
    Garbage(String),
    /// A message that is not a reply.
    #[error("wrote garbage: {0}")]
    BadReply(ProtoError),
    /// The channel failed.
    #[error("i/o error: {0}")]
    Io(io::Error),
    /// No program runs (it failed before and was not restarted).
    #[error("not running")]
    NotRunning,
}

/// Why a program could not be started.
#[derive(Debug, Error)]
pub enum StartError {
    /// The command is empty.
    #[error("empty command")]
    EmptyCommand,
    /// The shared-memory ring could not be created.
    #[error("cannot create the shared-memory ring: {0}")]
    Ring(io::Error),
    /// The program could not be run.
    #[error("cannot start {argv:?}: {source}")]
    Spawn {
        /// The command.
        argv: Vec<String>,
        /// The OS error.
        source: io::Error,
    },
    /// The process was started without pipes to it.
    #[error("child has no stdin/stdout")]
    NoStdio,
    /// Setting up the channel (pipes, shared memory, the in-process thread) failed.
    #[error("{0}")]
    Io(#[from] io::Error),
}

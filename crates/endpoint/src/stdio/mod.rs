//! The `stdio` class: the standard streams of this process. The `stdin` source reads
//! standard input until end of file and cuts it into frames; the `stdout` sink writes frames to
//! standard output. Both use a [`Framing`] and the byte-stream loops of `common`.

use crate::common::byte_stream::{run_reader, run_writer};
use crate::common::delivered::Delivered;
use crate::common::error::EndpointError;
use crate::common::framing::Framing;
use crate::common::report::{SinkTask, SourceTask};
use ndd_core::Frame;
use serde::{Deserialize, Serialize};
use tokio::runtime::Handle;
use tokio::sync::mpsc::{Receiver, Sender};

/// `stdin` source parameters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StdinConfig {
    /// How input is cut into frames.
    pub framing: Framing,
}

/// `stdout` sink parameters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StdoutConfig {
    /// How frames are written.
    pub framing: Framing,
}

/// Starts a `stdin` source.
pub(crate) fn spawn_stdin_source(
    rt: &Handle,
    endpoint: &'static str,
    c: &StdinConfig,
    stream: u16,
    tx: Sender<Frame>,
) -> Result<SourceTask, EndpointError> {
    Ok(rt.spawn(run_reader(
        endpoint,
        "stdin".to_string(),
        tokio::io::stdin(),
        c.framing,
        stream,
        tx,
    )))
}

/// Starts a `stdout` sink.
pub(crate) fn spawn_stdout_sink(
    rt: &Handle,
    endpoint: &'static str,
    c: &StdoutConfig,
    rx: Receiver<Frame>,
    delivered: Delivered,
) -> Result<SinkTask, EndpointError> {
    Ok(rt.spawn(run_writer(
        endpoint,
        "stdout".to_string(),
        tokio::io::stdout(),
        c.framing,
        rx,
        delivered,
    )))
}

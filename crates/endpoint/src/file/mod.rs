//! The `file` class: a file (or named pipe) in the file system. The `file` source reads it to
//! its end and cuts it into frames; the `file` sink writes frames to it, created or truncated
//! unless `append`. Both use a [`Framing`] and the byte-stream loops of `common`. A file that
//! cannot be opened is an error of `spawn`, before any task starts.

use crate::common::byte_stream::{run_reader, run_writer};
use crate::common::delivered::Delivered;
use crate::common::error::EndpointError;
use crate::common::framing::Framing;
use crate::common::report::{SinkTask, SourceTask};
use ndd_core::Frame;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use tokio::runtime::Handle;
use tokio::sync::mpsc::{Receiver, Sender};

/// `file` source parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSourceConfig {
    /// File to read.
    pub path: PathBuf,
    /// How input is cut into frames.
    #[serde(default)]
    pub framing: Framing,
}

/// `file` sink parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSinkConfig {
    /// File to write.
    pub path: PathBuf,
    /// How frames are written.
    #[serde(default)]
    pub framing: Framing,
    /// Append instead of truncating.
    #[serde(default)]
    pub append: bool,
}

/// Opens the file of a `file` source and starts it.
pub(crate) fn spawn_file_source(
    rt: &Handle,
    endpoint: &'static str,
    c: &FileSourceConfig,
    stream: u16,
    tx: Sender<Frame>,
) -> Result<SourceTask, EndpointError> {
    let open_err = |source| EndpointError::Open {
        endpoint,
        path: c.path.clone(),
        source,
    };
    let file = std::fs::File::open(&c.path).map_err(open_err)?;
    if file.metadata().map_err(open_err)?.is_dir() {
        return Err(open_err(std::io::Error::other("is a directory")));
    }
    Ok(rt.spawn(run_reader(
        endpoint,
        c.path.display().to_string(),
        tokio::fs::File::from_std(file),
        c.framing,
        stream,
        tx,
    )))
}

/// Opens (creating, truncating or appending to) the file of a `file` sink and starts it.
pub(crate) fn spawn_file_sink(
    rt: &Handle,
    endpoint: &'static str,
    c: &FileSinkConfig,
    rx: Receiver<Frame>,
    delivered: Delivered,
) -> Result<SinkTask, EndpointError> {
    let mut opts = std::fs::OpenOptions::new();
    opts.create(true);
    if c.append {
        opts.append(true);
    } else {
        opts.write(true).truncate(true);
    }
    let open_err = |source| EndpointError::Open {
        endpoint,
        path: c.path.clone(),
        source,
    };
    // A named pipe: opening it for writing waits for a reader, which may come much later (a
    // player started by hand): opened in the task, so the side (its link, its other streams)
    // goes on meanwhile and this stream's frames wait. Anything else is opened now, so a
    // wrong directory or a permission fails the side at once.
    use std::os::unix::fs::FileTypeExt;
    let fifo = std::fs::metadata(&c.path).is_ok_and(|m| m.file_type().is_fifo());
    let what = c.path.display().to_string();
    let framing = c.framing;
    if fifo {
        let path = c.path.clone();
        return Ok(rt.spawn(async move {
            let file = tokio::fs::OpenOptions::from(opts)
                .open(&path)
                .await
                .map_err(|source| EndpointError::Open {
                    endpoint,
                    path: path.clone(),
                    source,
                })?;
            run_writer(endpoint, what, file, framing, rx, delivered).await
        }));
    }
    let file = opts.open(&c.path).map_err(open_err)?;
    Ok(rt.spawn(run_writer(
        endpoint,
        what,
        tokio::fs::File::from_std(file),
        framing,
        rx,
        delivered,
    )))
}

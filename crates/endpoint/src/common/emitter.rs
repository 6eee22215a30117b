//! The emitter every device source sends through: it numbers the source's frames (the
//! sequence number is the count sent so far), stamps them with the source clock, hands them
//! to the session (from a task or from a blocking thread) and keeps the source's report.

use super::clock::meta;
use super::report::SourceReport;
use ndd_core::{Frame, Meta};
use tokio::sync::mpsc::Sender;

/// A source's way out. See the module docs.
#[derive(Debug)]
pub(crate) struct Emitter {
    pub(crate) stream: u16,
    pub(crate) tx: Sender<Frame>,
    pub(crate) report: SourceReport,
}

impl Emitter {
    pub(crate) fn new(stream: u16, tx: Sender<Frame>) -> Emitter {
        Emitter {
            stream,
            tx,
            report: SourceReport::default(),
        }
    }

    /// The metadata of the next frame: its number and the source clock now.
    pub(crate) fn next_meta(&self) -> Meta {
        meta(self.stream, self.report.frames)
    }

    /// Sends a frame from a task; `false` when the session no longer takes frames.
    pub(crate) async fn send(&mut self, frame: Frame) -> bool {
        let len = frame.len() as u64;
        if self.tx.send(frame).await.is_err() {
            return false;
        }
        self.count(len);
        true
    }

    /// Sends a frame from a blocking thread; `false` when the session no longer takes frames.
    pub(crate) fn send_blocking(&mut self, frame: Frame) -> bool {
        let len = frame.len() as u64;
        if self.tx.blocking_send(frame).is_err() {
            return false;
        }
        self.count(len);
        true
    }

    fn count(&mut self, len: u64) {
        self.report.frames += 1;
        self.report.bytes += len;
    }
}

//! The session's side of one live connection: writes, and the inbound queue fed by a reader
//! task.

use super::transport::{Rx, Tx};
use anyhow::Result;
use bytes::Bytes;
use ndd_link::Incoming;
use ndd_wire::Message;
use std::collections::VecDeque;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// What the reader task hands over: when the message came off the socket (our clock, ns),
/// and the message, `None` at a clean end, or the link error.
pub(super) type Inbound = (
    u64,
    std::result::Result<Option<Incoming>, ndd_link::LinkError>,
);

async fn read_loop(mut reader: Rx, tx: mpsc::Sender<Inbound>) {
    loop {
        let r = reader.read().await;
        let end = !matches!(r, Ok(Some(_)));
        if tx.send((super::wall_ns(), r)).await.is_err() || end {
            return;
        }
    }
}

/// One live connection.
///
/// While a write waits for the socket, inbound messages keep being taken off the reader's
/// channel into `overflow`, so two sides that both write bulk data at each other cannot
/// deadlock (each blocked on a write the other no longer reads). The overflow only grows
/// while our write is blocked, i.e. while the peer is not reading, and the peer resumes
/// reading as soon as its own write, which we are draining, completes.
pub(super) struct LinkIo {
    writer: Tx,
    in_rx: mpsc::Receiver<Inbound>,
    overflow: VecDeque<Inbound>,
    in_closed: bool,
    reader_task: JoinHandle<()>,
}

/// Runs a write on the writer while draining inbound messages into the overflow queue.
macro_rules! draining {
    ($link:expr, $w:ident => $fut:expr) => {{
        let LinkIo {
            writer: $w,
            in_rx,
            overflow,
            in_closed,
            ..
        } = $link;
        let fut = $fut;
        tokio::pin!(fut);
        loop {
            tokio::select! {
                biased;
                r = &mut fut => break r,
                m = in_rx.recv(), if !*in_closed => match m {
                    Some(m) => overflow.push_back(m),
                    None => *in_closed = true,
                },
            }
        }
    }};
}

impl LinkIo {
    /// Starts the reader task.
    pub(super) fn new(reader: Rx, writer: Tx) -> LinkIo {
        let (tx, in_rx) = mpsc::channel::<Inbound>(64);
        let reader_task = tokio::spawn(read_loop(reader, tx));
        LinkIo {
            writer,
            in_rx,
            overflow: VecDeque::new(),
            in_closed: false,
            reader_task,
        }
    }

    /// The next inbound message (`None` once the reader has ended and everything was taken).
    pub(super) async fn recv(&mut self) -> Option<Inbound> {
        match self.overflow.pop_front() {
            Some(m) => Some(m),
            None if self.in_closed => None,
            None => self.in_rx.recv().await,
        }
    }

    pub(super) async fn write_message(
        &mut self,
        m: &Message<'_>,
    ) -> Result<(), ndd_link::LinkError> {
        draining!(self, w => w.write_message(m))
    }

    /// One DATA message (see [`Tx::write_data`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn write_data(
        &mut self,
        stream: u16,
        retransmit: bool,
        seq: u64,
        timestamp_ns: u64,
        payload: &Bytes,
        reliable: bool,
    ) -> Result<(), ndd_link::LinkError> {
        draining!(self, w => w.write_data(stream, retransmit, seq, timestamp_ns, payload, reliable))
    }

    pub(super) async fn flush(&mut self) -> Result<(), ndd_link::LinkError> {
        draining!(self, w => w.flush())
    }

    /// Closes our direction (TLS close_notify) and stops reading.
    pub(super) async fn shutdown(mut self) {
        let _ =
            tokio::time::timeout(std::time::Duration::from_secs(1), self.writer.shutdown()).await;
        self.reader_task.abort();
    }
}

impl Drop for LinkIo {
    fn drop(&mut self) {
        self.reader_task.abort();
    }
}

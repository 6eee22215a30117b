//! One live connection of a side: the reader task that feeds the driver the link's messages,
//! and the writer, which runs as one future at a time that owns it, so reading goes on while
//! a write waits for the socket (two sides writing bulk data at each other cannot deadlock).

use super::wall_ns;
use ndd_core::session::{Incoming, Session, Transmit};
use ndd_core::Role;
use ndd_link::{Established, Rx, Tx};
use ndd_wire::{CloseCode, OwnedMessage};
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// What a link's reader task hands over: when the message came off the socket (our wall
/// clock, ns) and the message, `None` at a clean end, or the link error.
pub(super) type Inbound = (u64, Result<Option<Incoming>, ndd_link::LinkError>);

async fn read_loop(mut reader: Rx, tx: mpsc::Sender<Inbound>) {
    loop {
        let r = reader.read().await;
        let end = !matches!(r, Ok(Some(_)));
        if tx.send((wall_ns(), r)).await.is_err() || end {
            return;
        }
    }
}

/// What a finished write hands back: the writer, the emptied batch (its allocation is used
/// again), and how it went.
pub(super) type Written = (Tx, Vec<Transmit>, Result<(), ndd_link::LinkError>);

/// Writes a batch of transmits and flushes.
async fn write_batch(mut tx: Tx, mut batch: Vec<Transmit>) -> Written {
    let mut r = Ok(());
    for t in &batch {
        r = tx.write_transmit(t).await;
        if r.is_err() {
            break;
        }
    }
    if r.is_ok() {
        r = tx.flush().await;
    }
    batch.clear();
    (tx, batch, r)
}

type Writing = Pin<Box<dyn Future<Output = Written> + Send>>;

/// The reason a revoked peer is given when its live link is closed.
const UNTRUSTED_NOW: &str = "its fingerprint was removed from known_peers (ndd untrust)";

/// Most transmits or bytes written in one go before the driver looks around again.
const BATCH_FRAMES: usize = 64;
const BATCH_BYTES: usize = 1 << 20;

/// One live connection: its reader task's channel and the writer (or the write in flight).
pub(super) struct Link {
    pub(super) inbound: mpsc::Receiver<Inbound>,
    reader: JoinHandle<()>,
    idle: Option<Tx>,
    pub(super) writing: Option<Writing>,
    /// The batch vector between writes.
    spare: Vec<Transmit>,
}

impl Link {
    pub(super) fn new(mut e: Established, sess: &mut Session, chunk_bytes: usize) -> Link {
        let (cuts, peer_max_body) = e.tx.chunking();
        sess.set_chunking(if cuts { chunk_bytes } else { 0 }, peer_max_body);
        for p in (0..sess.stream_count()).map(|i| sess.plan(i)) {
            if p.role == Role::Source {
                e.tx.set_stream_priority(p.id, p.priority);
            }
        }
        let (tx, inbound) = mpsc::channel(64);
        Link {
            inbound,
            reader: tokio::spawn(read_loop(e.rx, tx)),
            idle: Some(e.tx),
            writing: None,
            spare: Vec::with_capacity(BATCH_FRAMES),
        }
    }

    /// Starts writing what the session has to send, if the writer is free.
    pub(super) fn start_write(&mut self, sess: &mut Session) {
        let Some(mut tx) = self.idle.take() else {
            return;
        };
        if let Some(limit) = sess.unsent_limit() {
            tx.set_unsent_limit(limit);
        }
        let mut batch = std::mem::take(&mut self.spare);
        let mut bytes = 0;
        let (now, wall) = (Instant::now(), wall_ns());
        while batch.len() < BATCH_FRAMES && bytes < BATCH_BYTES {
            let Some(t) = sess.poll_transmit(now, wall) else {
                break;
            };
            let chunk = matches!(t, Transmit::Data { more: true, .. });
            if let Transmit::Data { payload, .. } = &t {
                bytes += payload.len();
            }
            batch.push(t);
            if chunk {
                // The rest of a cut frame waits for the next batch, which a more urgent
                // stream's frame that came meanwhile goes ahead of (a batch is written whole).
                break;
            }
        }
        if batch.is_empty() {
            self.idle = Some(tx);
            self.spare = batch;
        } else {
            self.writing = Some(Box::pin(write_batch(tx, batch)));
        }
    }

    /// A write finished: the writer and the batch vector are free again.
    pub(super) fn done_writing(&mut self, tx: Tx, spare: Vec<Transmit>) {
        self.writing = None;
        self.idle = Some(tx);
        self.spare = spare;
    }

    /// Tells the peer it is no longer trusted (a CLOSE with code 4, after the write in flight),
    /// closes our direction and reads on until the peer closes too (within a second), before
    /// the link is dropped. Dropped with the peer's frames unread, a TCP socket resets the
    /// connection, and the peer lost the CLOSE to the reset about one time in three
    /// (`link lost: connection: Connection reset by peer` instead of the reason).
    pub(super) async fn say_untrusted(&mut self) {
        let say = async {
            if let Some(w) = self.writing.take() {
                let (tx, spare, r) = w.await;
                self.done_writing(tx, spare);
                r.ok()?;
            }
            let tx = self.idle.as_mut()?;
            let close = Transmit::Message(OwnedMessage::Close {
                code: CloseCode::UntrustedPeer,
                reason: UNTRUSTED_NOW.to_string(),
            });
            tx.write_transmit(&close).await.ok()?;
            tx.flush().await.ok()?;
            close_and_drain(tx, &mut self.inbound).await;
            Some(())
        };
        let _ = tokio::time::timeout(Duration::from_secs(1), say).await;
    }

    /// Finishes the write in flight and anything left, then closes our direction (within a
    /// second; the reader task stops when the link is dropped).
    pub(super) async fn goodbye(mut self, sess: &mut Session) {
        let finish = async {
            loop {
                if self.writing.is_none() {
                    self.start_write(sess);
                }
                let Some(w) = self.writing.take() else { break };
                let (tx, spare, r) = w.await;
                if r.is_err() {
                    return;
                }
                self.done_writing(tx, spare);
            }
            let Some(mut tx) = self.idle.take() else {
                return;
            };
            close_and_drain(&mut tx, &mut self.inbound).await;
        };
        let _ = tokio::time::timeout(Duration::from_secs(1), finish).await;
    }
}

/// Closes our direction of the link and, on TCP, reads on until the peer closes too: closing
/// a socket with unread bytes (the peer's last frames, PINGs and ACKs) resets the connection,
/// and the peer could lose what we said last (our CLOSE) to the reset. Datagram links have no
/// reset and no end.
async fn close_and_drain(tx: &mut Tx, inbound: &mut mpsc::Receiver<Inbound>) {
    let tcp = matches!(tx, Tx::Tcp(_));
    let _ = tx.shutdown().await;
    if tcp {
        while let Some((_, Ok(Some(_)))) = inbound.recv().await {}
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

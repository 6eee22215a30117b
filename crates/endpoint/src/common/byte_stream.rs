//! The byte-stream loops that the `stdio` and `file` classes share: [`run_reader`] cuts what
//! it reads into frames with a [`Framing`]; [`run_writer`] writes frames with one, batching
//! whatever frames are already queued into one write (up to [`WRITE_BATCH`] bytes) and
//! flushing whenever the queue runs dry, so a lone frame is never held back waiting for
//! company. The writer marks a batch in its [`Delivered`] after the write and flush that
//! covered it.

use super::clock::meta;
use super::delivered::Delivered;
use super::emitter::Emitter;
use super::error::EndpointError;
use super::framing::{encode, length_prefix, FrameDecoder, Framing, RAW_CHUNK};
use super::report::{SinkReport, SourceReport};
use ndd_core::Frame;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc::{Receiver, Sender};

/// A byte-stream source: reads `input` in chunks of up to [`RAW_CHUNK`] bytes and cuts it into
/// frames with `framing` until end of input.
pub(crate) async fn run_reader(
    endpoint: &'static str,
    what: String,
    mut input: impl AsyncRead + Unpin,
    framing: Framing,
    stream: u16,
    tx: Sender<Frame>,
) -> Result<SourceReport, EndpointError> {
    let mut out = Emitter::new(stream, tx);
    let mut decoder = FrameDecoder::new(framing);
    let mut buf = vec![0u8; RAW_CHUNK];
    let mut frames: Vec<Frame> = Vec::new();
    let mut seq = 0u64;
    let framing_err = |source| EndpointError::Framing {
        endpoint,
        what: what.clone(),
        source,
    };
    loop {
        let n = tokio::select! {
            r = input.read(&mut buf) => r.map_err(|source| EndpointError::Read {
                endpoint,
                what: what.clone(),
                source,
            })?,
            _ = out.tx.closed() => break,
        };
        // Stamped when cut (when the bytes came in), numbered in order.
        let mut cut = |payload: &[u8]| {
            frames.push(Frame::new(meta(stream, seq), payload));
            seq += 1;
        };
        let eof = n == 0;
        if eof {
            decoder.finish_with(&mut cut).map_err(framing_err)?;
        } else {
            decoder
                .push_with(&buf[..n], &mut cut)
                .map_err(framing_err)?;
        }
        for frame in frames.drain(..) {
            if !out.send(frame).await {
                tracing::debug!(endpoint, stream, "receiver gone, source stops");
                return Ok(out.report);
            }
        }
        if eof {
            break;
        }
    }
    tracing::debug!(
        endpoint,
        stream,
        frames = out.report.frames,
        bytes = out.report.bytes,
        "source ended"
    );
    Ok(out.report)
}

/// Bytes gathered from queued frames before a write.
pub const WRITE_BATCH: usize = 256 * 1024;

pub(crate) async fn run_writer(
    endpoint: &'static str,
    what: String,
    mut out: impl AsyncWrite + Unpin,
    framing: Framing,
    mut rx: Receiver<Frame>,
    delivered: Delivered,
) -> Result<SinkReport, EndpointError> {
    let mut report = SinkReport::default();
    let mut buf: Vec<u8> = Vec::with_capacity(RAW_CHUNK);
    let write_err = |source| EndpointError::Write {
        endpoint,
        what: what.clone(),
        source,
    };
    let framing_err = |source| EndpointError::Framing {
        endpoint,
        what: what.clone(),
        source,
    };
    while let Some(mut frame) = rx.recv().await {
        // The highest seq of this batch and its size: marked once it is written and flushed.
        let mut last = frame.meta.seq;
        let mut batch = 0u64;
        loop {
            last = last.max(frame.meta.seq);
            batch += 1;
            let payload = frame.payload();
            report.frames += 1;
            report.bytes += payload.len() as u64;
            if payload.len() >= RAW_CHUNK {
                // Large frames go straight from the frame to the output.
                if framing == Framing::Length {
                    buf.extend_from_slice(&length_prefix(payload.len()).map_err(framing_err)?);
                }
                out.write_all(&buf).await.map_err(write_err)?;
                buf.clear();
                out.write_all(payload).await.map_err(write_err)?;
            } else {
                encode(framing, payload, &mut buf).map_err(framing_err)?;
            }
            if buf.len() >= WRITE_BATCH {
                break;
            }
            match rx.try_recv() {
                Ok(next) => frame = next,
                Err(_) => break,
            }
        }
        out.write_all(&buf).await.map_err(write_err)?;
        buf.clear();
        out.flush().await.map_err(write_err)?;
        delivered.mark_batch(last, batch);
    }
    out.flush().await.map_err(write_err)?;
    tracing::debug!(
        endpoint,
        frames = report.frames,
        bytes = report.bytes,
        "sink ended"
    );
    Ok(report)
}

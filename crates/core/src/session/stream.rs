//! Per-stream state of a session: what a source keeps until the peer acknowledges it, and
//! what a sink has taken in, handed over and seen completed.

use crate::frame::{Frame, Meta};
use crate::half::Pair;
use crate::stack::{Role, Stack, StackError};
use bytes::Bytes;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

/// A reliable source that does not keep its frames ([`StreamPlan::keeps_frames`]) has at
/// most this many captures not yet completed by the peer's endpoint: consecutive frames
/// stamped with the same time are one capture (a screen capture goes as one frame per 4 MiB:
/// 1920×1080 in two, 2560×1440 in four). Counting frames, 16 held 2560×1440 at 24 of 30
/// frames/s over a 120 ms round trip; a viewer slower than the path still holds the source
/// back by as many updates as before.
/// (The rest of the capture whose first frame reaches the bound waits for the peer.)
pub const UNDELIVERED_CAPTURES: usize = 16;
/// And at most this many frames, however they are stamped.
pub const UNDELIVERED_FRAMES: usize = 256;

/// One stream as the session runs it: what the config says about it.
#[derive(Clone)]
pub struct StreamPlan {
    /// Stream id on the wire (≠ 0).
    pub id: u16,
    /// Name from the config, for errors and stats.
    pub name: String,
    /// Whether this side sources or sinks the stream.
    pub role: Role,
    /// Reliable: kept until acknowledged and resent after a reconnect; otherwise lossy: only
    /// the newest frame is worth sending after an outage.
    pub reliable: bool,
    /// Sink of an input device: when the link is lost the session asks the endpoint (through
    /// [`Event::ReleaseInputs`](super::Event::ReleaseInputs)) to release every held key and
    /// button.
    pub release_on_loss: bool,
    /// Source: whether frames produced while the link is down are kept and sent after the
    /// reconnect (a byte stream's history matters). `false` for input devices, whose state,
    /// not their history, matters: what they produce while the link is down is dropped and
    /// counted (`stale`), and nothing unacknowledged is sent again after a reconnect (the
    /// app side released every held key and button when the link went).
    pub replay_outage: bool,
    /// Source, reliable: whether endpoint frames are kept until the peer completes them, to
    /// be encoded again for a restarted peer (and bounded by `resume_buffer_bytes`). `false`
    /// for a source that sends its whole state again when the peer restarts (the
    /// `x11-screen` source's keyframe): keeping its frames would only hold it back (a
    /// 1920×1080 capture is 8 MB: 16 MiB of them held a 100 ms path to about two captures a
    /// round trip, 12 frames/s); it is bounded by [`UNDELIVERED_CAPTURES`] instead.
    pub keeps_frames: bool,
    /// Which streams' frames go out first when several have frames ready: every `High`
    /// stream's before any `Normal` one's, and those before `Low` ones (round-robin within a
    /// class). Urgent and control messages go before all.
    pub priority: Priority,
    /// The pairs in the user's order; the session builds the stack from them, and builds it
    /// afresh for a restarted peer.
    pub pairs: Vec<Arc<dyn Pair + Send + Sync>>,
}

impl std::fmt::Debug for StreamPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamPlan")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("role", &self.role)
            .field("reliable", &self.reliable)
            .field("release_on_loss", &self.release_on_loss)
            .field("replay_outage", &self.replay_outage)
            .field("keeps_frames", &self.keeps_frames)
            .field("priority", &self.priority)
            .field(
                "pairs",
                &self.pairs.iter().map(|p| p.describe()).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// A stream's send priority (see [`StreamPlan::priority`]); ordered most urgent first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    /// Input devices, audio, serial lines: small frames someone waits for.
    High,
    /// The default.
    #[default]
    Normal,
    /// Bulk that may wait behind everything else.
    Low,
}

impl Priority {
    /// Every class, most urgent first.
    pub const ALL: [Priority; 3] = [Priority::High, Priority::Normal, Priority::Low];

    /// Its name in a config file: `high`, `normal`, `low`.
    pub fn name(self) -> &'static str {
        match self {
            Priority::High => "high",
            Priority::Normal => "normal",
            Priority::Low => "low",
        }
    }
}

impl StreamPlan {
    /// A fresh stack of this stream's pairs for its role.
    pub fn build_stack(&self) -> Result<Stack, StackError> {
        let pairs: Vec<&dyn Pair> = self.pairs.iter().map(|p| p.as_ref() as &dyn Pair).collect();
        Stack::build(self.role, &self.name, &pairs)
    }
}

/// Counters the session keeps per stream (the driver adds endpoint-side figures).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamCounters {
    /// Frames sent to (source) or received from (sink) the link.
    pub wire_frames: u64,
    /// Their payload bytes (module headers included).
    pub wire_bytes: u64,
    /// Frames sent again after a reconnect (source).
    pub retransmits: u64,
    /// Frames received again after a reconnect and dropped (sink).
    pub duplicates: u64,
    /// Lossy frames dropped because newer ones superseded them or the buffer was full.
    pub overflow: u64,
    /// Source that does not replay an outage: endpoint frames dropped while the link was
    /// down, and unacknowledged ones not sent again.
    pub stale: u64,
    /// Source: frames currently held until the peer acknowledges them.
    pub unacked: u64,
    /// Their bytes.
    pub unacked_bytes: u64,
    /// Reliable source: endpoint frames kept until the peer's sink completes them
    /// (DELIVERED), to encode again for a restarted peer.
    pub undelivered: u64,
}

/// A DATA message kept by the source until the peer acknowledges it.
#[derive(Debug)]
pub(crate) struct Pending {
    pub seq: u64,
    pub timestamp_ns: u64,
    pub payload: Bytes,
    /// Yielded on some connection already: a resend carries RETRANSMIT.
    pub written: bool,
    /// What the path estimator knew when its first byte was written on this connection
    /// (reliable frames; handed back with its ACK: `Flight::on_write`).
    pub send: Option<crate::pathrate::SendState>,
}

/// The source end of a stream.
#[derive(Debug)]
pub(crate) struct SourceState {
    /// What goes out, oldest first; `out[..next_write]` went out on this connection.
    pub out: VecDeque<Pending>,
    pub out_bytes: usize,
    /// Bytes of `out` begun on this connection and not yet acknowledged (the frames with a
    /// `send` state): what this stream has in flight for the path estimator.
    pub flight_bytes: usize,
    pub next_write: usize,
    /// Bytes of `out[next_write]` already written on this connection, in chunks (0: none;
    /// the frame is not started). A started frame is finished before any other of the
    /// stream's frames goes out, and it is never dropped half written.
    pub chunk_off: usize,
    /// DATA frames the stack produced (END announces it).
    pub sent: u64,
    pub end_written: bool,
    /// Reliable: the endpoint's frames from before the stack, until the peer's sink
    /// completed them (DELIVERED); encoded again for a restarted peer.
    pub kept: VecDeque<(Meta, Bytes)>,
    pub kept_bytes: usize,
}

/// The sink end of a stream.
#[derive(Debug)]
pub(crate) struct SinkState {
    /// Highest sequence taken in from the current peer run, and the last one ACKed.
    pub last_seq: Option<u64>,
    pub acked_sent: Option<u64>,
    /// Frames handed to the endpoint, oldest first: the peer generation they came from and
    /// their endpoint sequence.
    pub handed: VecDeque<(u64, u64)>,
    /// How many handed frames the endpoint reported complete.
    pub completed_seen: u64,
    /// Highest endpoint sequence of the current peer generation completed, and last told.
    pub delivered: Option<u64>,
    pub delivered_sent: Option<u64>,
    /// The chunks of a frame that came cut (DATA with MORE) and is not complete yet.
    pub partial: Option<Partial>,
}

impl SinkState {
    /// Takes a DATA message: the whole frame's payload when it completes one (a frame that
    /// came whole, or the last of its chunks), `None` while chunks are still to come, or what
    /// is wrong with the chunks. They come one after the other on this stream, all with the
    /// frame's seq and timestamp; the one without MORE ends the frame, which may not exceed
    /// `max` bytes.
    pub fn join_chunk(
        &mut self,
        header: &ndd_wire::DataHeader,
        payload: Bytes,
        max: usize,
    ) -> Result<Option<Bytes>, String> {
        if !header.more && self.partial.is_none() {
            return Ok(Some(payload));
        }
        let p = self.partial.get_or_insert_with(|| Partial {
            seq: header.seq,
            timestamp_ns: header.timestamp_ns,
            chunks: Vec::new(),
            len: 0,
        });
        if p.seq != header.seq {
            return Err(format!(
                "frame {} began in chunks and frame {} came before its last chunk",
                p.seq, header.seq
            ));
        }
        if p.timestamp_ns != header.timestamp_ns {
            return Err(format!(
                "the chunks of frame {} carry different timestamps",
                p.seq
            ));
        }
        p.len += payload.len();
        if p.len > max {
            return Err(format!(
                "frame {} in chunks is over {max} bytes, the largest frame this side takes \
                 (link.max_frame_bytes)",
                p.seq
            ));
        }
        p.chunks.push(payload);
        if header.more {
            return Ok(None);
        }
        Ok(self.partial.take().map(Partial::join))
    }
}

/// A frame arriving in chunks: its seq and timestamp, and the chunks so far (slices of the
/// link's read buffer; copied once, into the whole frame, when its last chunk is in).
#[derive(Debug)]
pub(crate) struct Partial {
    pub seq: u64,
    pub timestamp_ns: u64,
    pub chunks: Vec<Bytes>,
    pub len: usize,
}

impl Partial {
    /// The whole payload: the one chunk as it is, or all of them copied into one buffer.
    pub fn join(mut self) -> Bytes {
        if self.chunks.len() == 1 {
            return self.chunks.pop().unwrap_or_default();
        }
        let mut whole = bytes::BytesMut::with_capacity(self.len);
        for c in &self.chunks {
            whole.extend_from_slice(c);
        }
        whole.freeze()
    }
}

/// Source or sink.
#[derive(Debug)]
pub(crate) enum End {
    Source(SourceState),
    Sink(SinkState),
}

/// One stream at run time.
pub(crate) struct StreamRt {
    pub plan: StreamPlan,
    pub stack: Stack,
    /// A source's endpoint finished (END queued), or a sink got END.
    pub ended: bool,
    pub end: End,
    pub counters: StreamCounters,
}

impl StreamRt {
    pub fn new(plan: StreamPlan) -> Result<StreamRt, StackError> {
        let stack = plan.build_stack()?;
        let end = match plan.role {
            Role::Source => End::Source(SourceState {
                out: VecDeque::new(),
                out_bytes: 0,
                flight_bytes: 0,
                next_write: 0,
                chunk_off: 0,
                sent: 0,
                end_written: false,
                kept: VecDeque::new(),
                kept_bytes: 0,
            }),
            Role::Sink => End::Sink(SinkState {
                last_seq: None,
                acked_sent: None,
                handed: VecDeque::new(),
                completed_seen: 0,
                delivered: None,
                delivered_sent: None,
                partial: None,
            }),
        };
        Ok(StreamRt {
            plan,
            stack,
            ended: false,
            end,
            counters: StreamCounters::default(),
        })
    }

    pub fn id(&self) -> u16 {
        self.plan.id
    }

    pub fn is_source(&self) -> bool {
        self.plan.role == Role::Source
    }

    /// Source: frames not yet written on this connection.
    pub fn unwritten(&self) -> usize {
        match &self.end {
            End::Source(s) => s.out.len() - s.next_write.min(s.out.len()),
            End::Sink(_) => 0,
        }
    }

    /// Sink: an ACK or DELIVERED would say something new.
    pub fn ack_pending(&self) -> bool {
        match &self.end {
            End::Sink(k) => k.last_seq != k.acked_sent || k.delivered != k.delivered_sent,
            End::Source(_) => false,
        }
    }

    /// Source: the captures among the frames kept (consecutive frames stamped with the same
    /// time are one, [`UNDELIVERED_CAPTURES`]).
    pub fn kept_captures(&self) -> usize {
        let End::Source(s) = &self.end else {
            return 0;
        };
        let mut last = None;
        s.kept
            .iter()
            .filter(|(m, _)| last.replace(m.timestamp_ns) != Some(m.timestamp_ns))
            .count()
    }

    /// Source, reliable: keeps an endpoint frame until the peer completes it and returns it
    /// for the stack. Both share the bytes: no copy here. A stream that does not keep its
    /// frames ([`StreamPlan::keeps_frames`]) notes only that the frame is not completed yet
    /// (at most [`UNDELIVERED_CAPTURES`] of them, so a sink slower than the path still holds
    /// the source back).
    pub fn keep(&mut self, f: Frame) -> Frame {
        let keeps = self.plan.keeps_frames;
        let End::Source(s) = &mut self.end else {
            return f;
        };
        let meta = f.meta;
        let bytes = f.into_bytes();
        if keeps {
            s.kept_bytes += bytes.len();
            s.kept.push_back((meta, bytes.clone()));
        } else {
            s.kept.push_back((meta, Bytes::new()));
        }
        Frame::from_bytes(meta, bytes)
    }

    /// Source that does not replay an outage: the link went, so what the peer has not
    /// acknowledged (and not completed) will not be sent again.
    pub fn forget_unsent(&mut self) {
        if let End::Source(src) = &mut self.end {
            self.counters.stale += src.out.len() as u64;
            src.out.clear();
            src.out_bytes = 0;
            src.flight_bytes = 0;
            src.next_write = 0;
            src.chunk_off = 0;
            src.kept.clear();
            src.kept_bytes = 0;
        }
    }

    /// Source: the peer process restarted. Its sink state is gone, so the stack starts afresh
    /// and every frame it has not completed is encoded again, ahead of new ones.
    pub fn restart_for_new_peer(&mut self, now: Instant) -> Result<usize, StackError> {
        self.stack = self.plan.build_stack()?;
        let End::Source(s) = &mut self.end else {
            return Ok(0);
        };
        s.out.clear();
        s.out_bytes = 0;
        s.flight_bytes = 0;
        s.next_write = 0;
        s.chunk_off = 0;
        s.end_written = false;
        if !self.plan.keeps_frames {
            // Nothing kept to encode again: the source sends its whole state afresh.
            s.kept.clear();
            return Ok(0);
        }
        let again = s.kept.len();
        for (meta, bytes) in &s.kept {
            self.stack
                .handle_frame(now, Frame::from_bytes(*meta, bytes.clone()))?;
        }
        if self.ended {
            self.stack.flush(now)?;
        }
        Ok(again)
    }
}

//! The session: one side of a driver as a sans-IO state machine (docs/protocol.md §6,
//! docs/links.md), in the style of quinn-proto's `Connection`.
//!
//! Inputs are `handle_*` calls: a link came up ([`Session::handle_link_up`]), a message
//! arrived ([`Session::handle_message`]), a source endpoint produced a frame or ended, a sink
//! endpoint completed frames, the link was lost, a deadline passed. Outputs are polled:
//! [`Session::poll_transmit`] (what to write on the link, control first, data streams
//! interleaved), [`Session::poll_event`] (frames for sink endpoints, input release, stream
//! ends, link status, the end of the session) and [`Session::poll_timeout`]. The session
//! reads no clock (`now` and the wall clock come in), does no I/O, spawns nothing, prints
//! nothing, and draws no randomness: the run id comes in.
//!
//! Reliability: a source keeps every DATA message of a reliable stream until the peer ACKs
//! it, and every endpoint frame from before its stack until the peer's sink endpoint
//! completed it (DELIVERED). Both are bounded by `resume_buffer_bytes`: when either is full
//! [`Session::source_ready`] turns false and the driver stops reading that endpoint
//! (backpressure), so a reliable frame is never dropped. The sink ACKs what it took in (at
//! most every `ack_every`) and drops anything at or below that sequence, so a resend is never
//! delivered twice. After a reconnect each side sends a RESUME with its run id, answers the
//! peer's with its ACKs and a second RESUME, and once it has the peer's second RESUME resends
//! what was not acknowledged, flagged RETRANSMIT. A RESUME with a new run id means the peer
//! restarted: the sink forgets the old numbering (no stale ACK reaches the new process) and
//! the source builds its stack afresh and encodes the kept frames again. Lossy streams keep only their newest frame while the link is down.

mod clock;
mod flight;
mod handshake;
mod incoming;
mod stream;

pub use clock::{ClockFilter, ClockSample};
pub use handshake::{decide as decide_handshake, HandshakeDecision, PeerOpening};
pub use incoming::Incoming;
pub use stream::{Priority, StreamCounters, StreamPlan};

use crate::frame::Frame;
use crate::ratelimit::RateLimit;
use crate::stack::{LayerStats, StackError};
use bytes::Bytes;
use ndd_wire::text::printable;
use ndd_wire::{CloseCode, OwnedMessage};
use std::collections::VecDeque;
use std::time::{Duration, Instant};
use stream::{End, Pending, StreamRt};
use thiserror::Error;

/// How long a chunk of a cut frame occupies the path (at the rate the ACKs report): the
/// longest another stream's frame waits for one. On a 20 Mbit/s link that is the smallest
/// chunk (`link.chunk_bytes`, 4 KiB: 1.6 ms); on loopback (GB/s) a 1 MB frame is one chunk, not
/// cut at all, so the receiver does not pay for joining it.
pub const CHUNK_TIME: Duration = Duration::from_millis(1);

/// DATA body bytes before the payload: seq and timestamp.
const DATA_BODY_MIN: usize = ndd_wire::DATA_HEADER_LEN - ndd_wire::HEADER_LEN;

/// How a session behaves (from `[link]` in the config).
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// Bound on what a source keeps for resending, per stream, in bytes.
    pub resume_buffer_bytes: usize,
    /// PING period (keepalive and clock offset).
    pub ping_interval: Duration,
    /// No message for this long: the link is lost.
    pub keepalive_timeout: Duration,
    /// Reconnect after a loss; otherwise a loss ends the session with an error.
    pub reconnect: bool,
    /// Longest a sink waits before telling its source what it took in and completed.
    pub ack_every: Duration,
    /// A sink also tells as soon as this many bytes came in since it last told (so a source
    /// with a small in-flight window is not starved of ACKs). Must stay below the smallest
    /// window (`flight.rs` FLOOR_BYTES, 64 KiB): at 256 KiB, 100 KB frames between two
    /// processes went one per 20 ms tick (4.7 MB/s); at 32 KiB they go at 500 MB/s.
    pub ack_bytes: usize,
    /// Smallest in-flight window of a reliable source stream: bytes written and not yet
    /// acknowledged (see `flight.rs`; it grows to twice the path's bandwidth-delay product,
    /// at most `resume_buffer_bytes`).
    pub flight_min_bytes: usize,
    /// How long to wait for the peer's CLOSE after ours.
    pub close_linger: Duration,
    /// This side outlives its peer (`ndd run` without `--once`): told to stop, it sends its
    /// frames, no END, and a CLOSE "going away" (the peer keeps its endpoints and waits for
    /// it); the peer's "going away" is a lost link (reconnect and wait), not the end.
    pub outlive_peer: bool,
    /// Smallest chunk: frames longer than a chunk go out cut into DATA messages (flag MORE on
    /// all but the last), so that another stream's frame can go between them
    /// (docs/protocol.md §4.1). A chunk is what the path carries in [`CHUNK_TIME`] at the rate
    /// the ACKs report, at least this many bytes; 0: never cut. Set for links that deliver in
    /// order on one byte stream (TCP, TLS); QUIC has a stream per ndd stream and UDP
    /// fragments below.
    pub chunk_bytes: usize,
    /// Largest frame taken in from the peer once its chunks are joined (this side's
    /// `max_body`: a frame in chunks is no larger than one that comes whole).
    pub max_frame_bytes: usize,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            resume_buffer_bytes: 16 << 20,
            ping_interval: Duration::from_secs(1),
            keepalive_timeout: Duration::from_secs(5),
            reconnect: true,
            ack_every: Duration::from_millis(20),
            ack_bytes: 32 << 10,
            flight_min_bytes: 2 << 20,
            close_linger: Duration::from_secs(3),
            outlive_peer: false,
            chunk_bytes: 0,
            max_frame_bytes: 16 << 20,
        }
    }
}

/// Where the session stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// No link yet.
    Connecting,
    /// A link is up; no DATA goes out until the peer's RESUME.
    Resuming,
    /// Frames flow.
    Running,
    /// The link was lost; the driver is getting a new one.
    Disconnected,
    /// Over: nothing more will be transmitted after what `poll_transmit` still yields.
    Closed,
}

/// Why a session ended without error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Every stream ended on both sides.
    AllEnded,
    /// The peer closed the session normally.
    PeerClosed,
    /// This side was told to stop.
    Stopped,
    /// Our CLOSE went out and the peer did not answer within the linger time.
    NoAnswer,
}

/// Something for the driver to do or report.
#[derive(Debug)]
pub enum Event {
    /// Hand this frame to stream `stream`'s sink endpoint (index in the plans).
    Deliver {
        /// Stream index.
        stream: usize,
        /// The frame, after the stack.
        frame: Frame,
    },
    /// The link is lost: the sink endpoint of `stream` (an input device) must release every
    /// held key and button. Its own records, not counted as delivered frames.
    ReleaseInputs {
        /// Stream index.
        stream: usize,
    },
    /// Stream `stream`'s sink has got everything: close its endpoint.
    StreamEnded {
        /// Stream index.
        stream: usize,
    },
    /// The link is lost; get a new one and call [`Session::handle_link_up`].
    LinkLost {
        /// What happened.
        reason: String,
    },
    /// The peer confirmed the new link.
    Resumed {
        /// From the outage's start as this side saw it (the last message heard from the peer
        /// before the loss: a link cut in silence is noticed only at the keepalive timeout)
        /// to the peer's RESUME.
        after: Duration,
        /// Unacknowledged frames about to be sent again.
        resending: usize,
    },
    /// The peer stopped (CLOSE "going away") and this side outlives it: the link is lost;
    /// get a new one as after [`Event::LinkLost`] (the peer comes back as a restarted one).
    PeerStopped {
        /// What it said.
        reason: String,
    },
    /// The peer's process restarted: its streams start again.
    PeerRestarted {
        /// Frames it had not completed, encoded again for it.
        resending: usize,
    },
    /// Worth a line in the log; the session goes on.
    Warning(String),
    /// The session is over.
    Closed(Ending),
}

/// One message to write on the link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transmit {
    /// A DATA message, its payload shared with the resume buffer (no copy).
    Data {
        /// Stream id.
        stream: u16,
        /// Sent before on an earlier connection.
        retransmit: bool,
        /// One chunk of a frame that goes on in the stream's next DATA message.
        more: bool,
        /// Sequence number.
        seq: u64,
        /// Source timestamp.
        timestamp_ns: u64,
        /// Payload.
        payload: Bytes,
        /// The stream is reliable (QUIC puts lossy ones in datagrams).
        reliable: bool,
    },
    /// Any other message.
    Message(OwnedMessage),
}

impl Transmit {
    /// The message as the peer's link hands it over, with no bytes in between: how the
    /// whole-session simulation and unit tests connect two sessions.
    pub fn into_incoming(self) -> Incoming {
        match self {
            Transmit::Data {
                stream,
                retransmit,
                more,
                seq,
                timestamp_ns,
                payload,
                ..
            } => Incoming::Data {
                header: ndd_wire::DataHeader {
                    stream_id: stream,
                    retransmit,
                    more,
                    seq,
                    timestamp_ns,
                },
                payload,
            },
            Transmit::Message(m) => Incoming::Other(m),
        }
    }
}

/// Why a session cannot go on.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum SessionError {
    /// A pair failed.
    #[error(transparent)]
    Stack(#[from] StackError),
    /// The peer named a stream we do not have.
    #[error("the peer sent a message for stream id {0}, which is not configured")]
    UnknownStream(u16),
    /// DATA, END or DELIVERED that goes the wrong way.
    #[error("the peer {what} on stream \"{stream}\", which it does not {role}")]
    WrongDirection {
        /// What the peer did.
        what: &'static str,
        /// Stream name.
        stream: String,
        /// What it would have to be.
        role: &'static str,
    },
    /// The peer closed with an error code.
    #[error("the peer closed the session ({code}): {reason}")]
    PeerClosed {
        /// Its code.
        code: CloseCode,
        /// Its reason.
        reason: String,
    },
    /// The peer's chunks of a frame do not make a frame.
    #[error("the peer sent a broken frame on stream \"{stream}\": {what}")]
    BrokenFrame {
        /// Stream name.
        stream: String,
        /// What was wrong.
        what: String,
    },
    /// A link that hands DATA over as a plain message is broken.
    #[error("the link delivered a frame as a plain message")]
    PlainData,
    /// The link failed and reconnecting is off.
    #[error("link to the peer failed: {0}")]
    LinkFailed(String),
}

impl SessionError {
    /// The code our CLOSE carries for this error (`None`: the peer already knows).
    pub fn close_code(&self) -> Option<CloseCode> {
        match self {
            SessionError::PeerClosed { .. } | SessionError::LinkFailed(_) => None,
            SessionError::Stack(_) => Some(CloseCode::InternalError),
            _ => Some(CloseCode::ProtocolError),
        }
    }
}

/// A CLOSE this side has decided to send.
#[derive(Debug, Clone, Copy)]
struct Closing {
    reason: Ending,
    /// Yielded by `poll_transmit` on the current link.
    sent: bool,
    /// From the first time it went out: until when we wait for the peer's (reconnecting if
    /// the link breaks while reliable frames are outstanding).
    linger_until: Option<Instant>,
}

/// One side of a driver. See the module docs.
pub struct Session {
    cfg: SessionConfig,
    streams: Vec<StreamRt>,
    state: State,
    run_id: u64,
    peer_run_id: Option<u64>,
    /// Bumped each time the peer's process restarts.
    peer_gen: u64,
    clock: ClockFilter,
    /// The shortest PING/PONG round trip since the link came up: the path's own round trip,
    /// which the in-flight window is sized by (see [`Session::flight_window`]).
    base_rtt_ns: Option<u64>,
    /// RESUME, connection-start ACKs, PING/PONG: ahead of everything.
    urgent: VecDeque<Urgent>,
    /// Control messages between pair halves: ahead of data.
    control: VecDeque<OwnedMessage>,
    events: VecDeque<Event>,
    last_rx: Option<Instant>,
    next_ping: Option<Instant>,
    next_ack: Option<Instant>,
    /// DATA bytes taken in since the last ACK round.
    since_ack: usize,
    /// The in-flight window of reliable source streams.
    flight: flight::Flight,
    lost_at: Option<Instant>,
    /// When the current link came up, on both clocks: a frame of a stream that does not
    /// replay its outage, made before then and handed to us after (a driver that took the
    /// new link before the source's channel), is history too ([`HANDOFF_WINDOW`]).
    up_at: Option<(Instant, u64)>,
    /// A link came up before (the next one follows an outage).
    had_link: bool,
    recoveries: Vec<Duration>,
    close: Option<Closing>,
    peer_closed: bool,
    stopping: bool,
    /// Told to stop while outliving the peer: our frames go out, no END, CLOSE going away.
    going_away: bool,
    /// The peer said it is going away (handled once its message is processed).
    peer_gone: Option<String>,
    /// Where the data round-robin starts next.
    cursor: usize,
    /// RESUMEs the peer sent on this link (two: who it is, then its ACKs are in).
    peer_resumes: u32,
    /// Handshake messages mid-session: warned about at most once a second.
    ignored_handshakes: RateLimit,
    /// The peer's `max_body`: a longer frame is never cut (the link refuses it whole, as
    /// it would uncut).
    peer_max_body: usize,
    /// When a source stream of each priority class (indexed by `Priority as usize`, most
    /// urgent first) last took a frame: a class is live for [`URGENT_LIVE`] after it.
    class_seen: [Option<Instant>; 3],
    /// The latest time the driver gave us (what `source_ready`, which takes none, goes by).
    now_seen: Option<Instant>,
}

/// How long a priority class counts as live after its last frame: while it is, the reliable
/// streams of less urgent classes keep a smaller in-flight window (`Session::window_for`).
const URGENT_LIVE: Duration = Duration::from_millis(250);

/// How long after a link came up a source frame is checked against the time it came up (by
/// its endpoint's wall-clock stamp): a driver hands frames over late by milliseconds, and a
/// wall clock stepped back can only cost this much input.
pub const HANDOFF_WINDOW: Duration = Duration::from_secs(1);

/// Urgent messages; PING and PONG are stamped with the wall clock when they are polled.
#[derive(Debug)]
enum Urgent {
    Message(OwnedMessage),
    Ping,
    Pong { t1: u64, t2: u64 },
}

impl Urgent {
    /// The message, PING and PONG stamped with the wall clock now.
    fn stamp(self, wall_ns: u64) -> Transmit {
        Transmit::Message(match self {
            Urgent::Message(m) => m,
            Urgent::Ping => OwnedMessage::Ping { t1: wall_ns },
            Urgent::Pong { t1, t2 } => OwnedMessage::Pong {
                t1,
                t2,
                t3: wall_ns,
            },
        })
    }
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("state", &self.state)
            .field("streams", &self.streams.len())
            .field("run_id", &self.run_id)
            .field("peer_run_id", &self.peer_run_id)
            .finish()
    }
}

impl Session {
    /// A session for these streams (ids unique), with this process run's id.
    pub fn new(
        cfg: SessionConfig,
        plans: Vec<StreamPlan>,
        run_id: u64,
    ) -> Result<Session, StackError> {
        let streams = plans
            .into_iter()
            .map(StreamRt::new)
            .collect::<Result<Vec<_>, _>>()?;
        let flight =
            flight::Flight::new(cfg.flight_min_bytes, cfg.resume_buffer_bytes, cfg.ack_bytes);
        Ok(Session {
            cfg,
            streams,
            state: State::Connecting,
            run_id,
            peer_run_id: None,
            peer_gen: 0,
            clock: ClockFilter::default(),
            base_rtt_ns: None,
            urgent: VecDeque::new(),
            control: VecDeque::new(),
            events: VecDeque::new(),
            last_rx: None,
            next_ping: None,
            next_ack: None,
            since_ack: 0,
            flight,
            lost_at: None,
            up_at: None,
            had_link: false,
            recoveries: Vec::new(),
            close: None,
            peer_closed: false,
            stopping: false,
            going_away: false,
            peer_gone: None,
            cursor: 0,
            peer_resumes: 0,
            ignored_handshakes: RateLimit::default(),
            peer_max_body: usize::MAX,
            class_seen: [None; 3],
            now_seen: None,
        })
    }

    /// How many bytes a chunk of a cut frame has now (0: frames are not cut): what the path
    /// carries in [`CHUNK_TIME`] at the rate the ACKs report, at least
    /// [`SessionConfig::chunk_bytes`].
    pub fn chunk_size(&self) -> usize {
        match self.cfg.chunk_bytes {
            0 => 0,
            least => least.max((self.flight.rate() * CHUNK_TIME.as_secs_f64()) as usize),
        }
    }

    /// How many written bytes should wait unsent in the link's socket at most, once the path's
    /// rate is known and frames are cut: one chunk. Beyond that the rest of a cut frame waits
    /// in the session, where a more urgent stream's frame can go before it. (`None`: no
    /// limit. A fixed small limit would cost a third of loopback's throughput.)
    pub fn unsent_limit(&self) -> Option<usize> {
        (self.cfg.chunk_bytes > 0 && self.flight.rate() > 0.0).then(|| self.chunk_size())
    }

    /// How the current link wants frames cut (see [`SessionConfig::chunk_bytes`]; 0: never)
    /// and the peer's `max_body` from its HELLO: longer frames are not cut (they are the
    /// sender's error, refused whole by the link as they would be uncut).
    pub fn set_chunking(&mut self, chunk_bytes: usize, peer_max_body: usize) {
        self.cfg.chunk_bytes = chunk_bytes;
        self.peer_max_body = peer_max_body;
    }

    /// Where the session stands.
    pub fn state(&self) -> State {
        self.state
    }

    /// This process run's id (RESUME).
    pub fn run_id(&self) -> u64 {
        self.run_id
    }

    /// How many streams.
    pub fn stream_count(&self) -> usize {
        self.streams.len()
    }

    /// The plan of stream `i`.
    pub fn plan(&self, i: usize) -> &StreamPlan {
        &self.streams[i].plan
    }

    /// The session's counters of stream `i`.
    pub fn counters(&self, i: usize) -> StreamCounters {
        let s = &self.streams[i];
        let mut c = s.counters;
        if let End::Source(src) = &s.end {
            c.unacked = src.out.len() as u64;
            c.unacked_bytes = src.out_bytes as u64;
            c.undelivered = src.kept.len() as u64;
        }
        c
    }

    /// The per-layer stats of stream `i`'s stack.
    pub fn layer_stats(&self, i: usize) -> Vec<LayerStats> {
        self.streams[i].stack.stats()
    }

    /// The clock offset to the peer, from the best recent PING/PONG.
    pub fn clock(&self) -> Option<ClockSample> {
        self.clock.best()
    }

    /// How many bytes a reliable source stream may have written and not yet had acknowledged
    /// now: twice the delivery rate times the path's round trip (at least the floor; see
    /// `flight.rs`). The round trip is the shortest seen since the link came up, not the
    /// recent ones: while a bulk stream keeps the path's queue (a shaper's, a router's) full,
    /// every PONG waits in it, and a window sized by those round trips would keep that queue
    /// full, and every small frame waiting in it (a 20 Mbit/s link: input p50 105–150 ms
    /// instead of about 20).
    pub fn flight_window(&self) -> usize {
        self.flight
            .limit(self.base_rtt_ns.map(Duration::from_nanos))
    }

    /// The in-flight window of source stream `i`: [`Session::flight_window`], or, while a
    /// stream of a more urgent class has taken a frame in the last [`URGENT_LIVE`], the
    /// smaller one of `Flight::limit_beside_urgent`. A TCP-like link delivers in order, so
    /// an input frame waits behind every bulk byte in flight; on loopback or a LAN the window
    /// is its 2 MiB floor, 0.7 ms of queue at 3 GB/s and more on a slower path (measured, two
    /// `ndd run` processes over TLS, 64 B at 1 kHz beside 1 MB frames: p99 2.5–4.2 ms at
    /// 2 MiB, 0.8–1.1 ms at 512 KiB). An idle input stream costs the bulk stream nothing.
    pub fn window_for(&self, i: usize) -> usize {
        let rtt = self.base_rtt_ns.map(Duration::from_nanos);
        let more_urgent = &self.class_seen[..self.streams[i].plan.priority as usize];
        let urgent_live = self.now_seen.is_some_and(|now| {
            more_urgent
                .iter()
                .flatten()
                .any(|t| now.saturating_duration_since(*t) < URGENT_LIVE)
        });
        if urgent_live {
            self.flight.limit_beside_urgent(rtt)
        } else {
            self.flight.limit(rtt)
        }
    }

    /// A timestamp of the peer's moved to our wall clock.
    pub fn peer_to_local(&self, peer_ns: u64) -> u64 {
        self.clock.to_local(peer_ns)
    }

    /// Time from each link loss to the peer's RESUME, in order.
    pub fn recoveries(&self) -> &[Duration] {
        &self.recoveries
    }

    /// Whether some sink endpoint holds frames it has not reported complete (the driver then
    /// looks at its progress every `ack_every`).
    pub fn awaiting_completion(&self) -> bool {
        self.link_up()
            && self
                .streams
                .iter()
                .any(|s| matches!(&s.end, End::Sink(k) if !k.handed.is_empty()))
    }

    /// Gives up on a local error: a CLOSE naming it is the last thing `poll_transmit` yields.
    pub fn abort(&mut self, reason: &str) {
        self.close_now(Some(CloseCode::InternalError), reason);
    }

    /// The interval at which a sink's completions are worth reporting.
    pub fn ack_every(&self) -> Duration {
        self.cfg.ack_every
    }

    /// Whether a link is up (handshake done).
    pub fn link_up(&self) -> bool {
        matches!(self.state, State::Resuming | State::Running)
    }

    /// Whether source stream `i` takes another endpoint frame now. False for a reliable
    /// stream while its resume buffer is full or a half of its stack is (backpressure: the
    /// driver stops reading the endpoint), after it ended, and once the session closes.
    pub fn source_ready(&self, i: usize) -> bool {
        let s = &self.streams[i];
        let End::Source(src) = &s.end else {
            return false;
        };
        if s.ended || self.state == State::Closed || self.close.is_some() {
            return false;
        }
        let window = self.window_for(i);
        !s.plan.reliable
            || ((src.out.is_empty() || src.out_bytes < window)
                && (src.kept.is_empty() || src.kept_bytes < self.cfg.resume_buffer_bytes)
                && (s.plan.keeps_frames
                    // (Fewer frames are fewer captures: not counted on every turn.)
                    || src.kept.len() < stream::UNDELIVERED_CAPTURES
                    || (src.kept.len() < stream::UNDELIVERED_FRAMES
                        && s.kept_captures() < stream::UNDELIVERED_CAPTURES))
                && s.stack.ready())
    }

    // ---- inputs ----

    /// A new link passed the handshake: send our RESUME, and no data before the peer's second
    /// RESUME (see `resume`). `wall_ns` is our wall clock now, the clock endpoints stamp
    /// their frames with.
    pub fn handle_link_up(&mut self, now: Instant, wall_ns: u64) {
        if self.state == State::Closed {
            return;
        }
        self.state = State::Resuming;
        // Only a link after an outage: the first comes up as the sources start, and what
        // they make before it is no history (an input device's capabilities record).
        if self.had_link {
            self.up_at = Some((now, wall_ns));
        }
        self.had_link = true;
        self.last_rx = Some(now);
        // A new connection may take another path: its round trip is measured afresh.
        self.base_rtt_ns = None;
        self.next_ack = Some(now + self.cfg.ack_every);
        self.urgent.clear();
        self.control.clear();
        self.peer_resumes = 0;
        for s in self.streams.iter_mut() {
            match &mut s.end {
                End::Source(src) => {
                    src.next_write = 0;
                    src.chunk_off = 0;
                    src.end_written = false;
                    // Everything goes out again on the new connection: what was in flight on
                    // the old one says nothing about this path.
                    for p in src.out.iter_mut() {
                        p.send = None;
                    }
                    src.flight_bytes = 0;
                }
                End::Sink(k) => {
                    k.delivered_sent = None;
                    // The rest of a frame cut short by the old link comes again, whole.
                    k.partial = None;
                }
            }
        }
        self.urgent.push_back(Urgent::Message(OwnedMessage::Resume {
            instance: self.run_id,
        }));
        // A PING right behind the RESUME, before any DATA: its round trip is the path's own,
        // not one spent queueing behind our frames in the socket or a shaper; the in-flight
        // window is sized by the shortest one (`flight_window`). The first PING waited for
        // the first timer tick, often behind a bulk frame already written: on a 20 Mbit/s
        // link a 100 KB frame (40 ms) made the window hold 200 kB too many.
        self.urgent.push_back(Urgent::Ping);
        self.next_ping = Some(now + self.cfg.ping_interval);
    }

    /// A message from the peer: `now` on our monotonic clock, `wall_ns` when it came off the
    /// socket on our wall clock (clock offset). On error the session is closed and a CLOSE
    /// naming the error is the last thing `poll_transmit` yields.
    pub fn handle_message(
        &mut self,
        now: Instant,
        wall_ns: u64,
        msg: Incoming,
    ) -> Result<(), SessionError> {
        self.now_seen = Some(now);
        if !self.link_up() {
            return Ok(()); // a straggler from a link already given up
        }
        self.last_rx = Some(now);
        let r = self.message(now, wall_ns, msg);
        if r.is_ok() {
            if let Some(reason) = self.peer_gone.take() {
                return self.lose_link(now, &reason, true);
            }
        }
        self.after(now, r)
    }

    /// Source stream `i`'s endpoint produced a frame.
    pub fn handle_source_frame(
        &mut self,
        now: Instant,
        i: usize,
        frame: Frame,
    ) -> Result<(), SessionError> {
        let link_up = self.link_up();
        let going_away = self.going_away;
        self.now_seen = Some(now);
        let s = &mut self.streams[i];
        if s.ended || !s.is_source() || going_away {
            return Ok(());
        }
        self.class_seen[s.plan.priority as usize] = Some(now);
        // Made while the link was down, even if handed over after it came back.
        let made_before_up = self.up_at.is_some_and(|(at, wall)| {
            now.saturating_duration_since(at) < HANDOFF_WINDOW && frame.meta.timestamp_ns < wall
        });
        if (!link_up || made_before_up) && !s.plan.replay_outage {
            s.counters.stale += 1;
            return Ok(());
        }
        let frame = if s.plan.reliable {
            s.keep(frame)
        } else {
            frame
        };
        let r = s
            .stack
            .handle_frame(now, frame)
            .map_err(SessionError::from)
            .map(|()| self.pump(i));
        self.after(now, r)
    }

    /// Source stream `i`'s endpoint ended: flush the stack, END after the last frame.
    pub fn handle_source_end(&mut self, now: Instant, i: usize) -> Result<(), SessionError> {
        let r = self.end_stream(i, now);
        self.after(now, r)
    }

    /// Sink stream `i`'s endpoint has completed `total` frames so far (a running count).
    pub fn handle_sink_completed(&mut self, i: usize, total: u64) {
        let peer_gen = self.peer_gen;
        let End::Sink(k) = &mut self.streams[i].end else {
            return;
        };
        while k.completed_seen < total {
            let Some((gen, seq)) = k.handed.pop_front() else {
                break;
            };
            k.completed_seen += 1;
            if gen == peer_gen {
                k.delivered = Some(seq);
            }
        }
    }

    /// The link is gone (read or write failed, the peer hung up). Unless the session was
    /// closing anyway, held inputs are released and [`Event::LinkLost`] asks for a new link;
    /// with reconnecting off this is the end, as an error.
    pub fn handle_link_lost(&mut self, now: Instant, reason: &str) -> Result<(), SessionError> {
        self.lose_link(now, reason, false)
    }

    /// The link is gone (`peer_stopped`: the peer said it is going away).
    fn lose_link(
        &mut self,
        now: Instant,
        reason: &str,
        peer_stopped: bool,
    ) -> Result<(), SessionError> {
        if matches!(self.state, State::Closed | State::Disconnected) {
            return Ok(());
        }
        // The peer's CLOSE says it has everything (it closes only once our ENDs are in); told
        // to stop, we leave anyway. Otherwise our CLOSE (if it went out) may have been lost
        // with our last frames or ENDs: reconnect, resend and close again, within the close
        // linger.
        let sent = self.close.is_some_and(|c| c.sent);
        if self.peer_closed || (sent && self.stopping) {
            self.finish(self.close.map_or(Ending::PeerClosed, |c| c.reason));
            return Ok(());
        }
        if let Some(c) = self.close.as_mut() {
            c.sent = false;
        }
        if !self.cfg.reconnect {
            return self.after(now, Err(SessionError::LinkFailed(reason.to_string())));
        }
        self.state = State::Disconnected;
        // The outage began when the peer went silent, not when its silence was noticed.
        let since = self.last_rx.filter(|&r| r <= now).unwrap_or(now);
        self.lost_at.get_or_insert(since);
        for s in self.streams.iter_mut().filter(|s| !s.plan.replay_outage) {
            s.forget_unsent();
        }
        self.urgent.clear();
        self.control.clear();
        for (i, s) in self.streams.iter().enumerate() {
            if s.plan.release_on_loss && !s.is_source() && !s.ended {
                self.events.push_back(Event::ReleaseInputs { stream: i });
            }
        }
        let reason = reason.to_string();
        self.events.push_back(if peer_stopped {
            Event::PeerStopped { reason }
        } else {
            Event::LinkLost { reason }
        });
        self.after(now, Ok(()))
    }

    /// Deadlines: stacks' timers, keepalive, PING, ACK, the close linger.
    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), SessionError> {
        self.now_seen = Some(now);
        let mut r = Ok(());
        for i in 0..self.streams.len() {
            if self.streams[i]
                .stack
                .poll_timeout()
                .is_some_and(|d| d <= now)
            {
                r = self.streams[i]
                    .stack
                    .handle_timeout(now)
                    .map_err(SessionError::from);
                if r.is_err() {
                    break;
                }
                self.pump(i);
            }
        }
        if r.is_ok() && self.link_up() {
            let silent_since = self.last_rx.unwrap_or(now);
            if now >= silent_since + self.cfg.keepalive_timeout {
                let reason = format!(
                    "no message from the peer for {} ms",
                    self.cfg.keepalive_timeout.as_millis()
                );
                return self.handle_link_lost(now, &reason);
            }
            if self.next_ping.is_some_and(|p| now >= p) && !self.close_sent() {
                self.urgent.push_back(Urgent::Ping);
                self.next_ping = Some(now + self.cfg.ping_interval);
            }
            self.queue_acks(now);
        }
        if let Some(until) = self.close.and_then(|c| c.linger_until) {
            if now >= until && self.state != State::Closed {
                self.finish(Ending::NoAnswer);
            }
        }
        self.after(now, r)
    }

    /// Stop: end every source (flushing its stack), send END for each, then CLOSE.
    pub fn close(&mut self, now: Instant) -> Result<(), SessionError> {
        self.stopping = true;
        self.after(now, Ok(()))
    }

    // ---- outputs ----

    /// The next message to write, or `None` for now. Urgent messages first, then control
    /// messages of pairs, then DATA interleaved across streams one frame at a time, ENDs after
    /// a stream's last frame, CLOSE last. `wall_ns` stamps PING and PONG.
    pub fn poll_transmit(&mut self, now: Instant, wall_ns: u64) -> Option<Transmit> {
        if !self.link_up() {
            // Only a CLOSE for an error may still go out (queued by `close_now`).
            return self.urgent.pop_front().map(|u| u.stamp(wall_ns));
        }
        self.queue_acks(now);
        if let Some(u) = self.urgent.pop_front() {
            return Some(u.stamp(wall_ns));
        }
        if let Some(m) = self.control.pop_front() {
            return Some(Transmit::Message(m));
        }
        if self.state != State::Running {
            return None;
        }
        let n = self.streams.len();
        for class in Priority::ALL {
            for k in 0..n {
                let i = (self.cursor + k) % n;
                if self.streams[i].plan.priority != class {
                    continue;
                }
                if let Some(t) = self.next_data(i, now) {
                    self.cursor = (i + 1) % n;
                    return Some(t);
                }
            }
        }
        if let Some(c) = self.close.filter(|c| !c.sent && self.going_away) {
            // Everything we had went out above; the peer does not answer a going away.
            self.close = Some(Closing { sent: true, ..c });
            self.finish(Ending::Stopped);
            return Some(Transmit::Message(OwnedMessage::Close {
                code: CloseCode::GoingAway,
                reason: "stopped".to_string(),
            }));
        }
        if let Some(c) = self.close {
            let all_ends = self
                .streams
                .iter()
                .all(|s| matches!(&s.end, End::Source(src) if src.end_written) || !s.is_source());
            if !c.sent && (all_ends || self.peer_closed) {
                self.close = Some(Closing {
                    sent: true,
                    linger_until: Some(c.linger_until.unwrap_or(now + self.cfg.close_linger)),
                    ..c
                });
                if self.peer_closed {
                    self.finish(c.reason);
                }
                return Some(Transmit::Message(OwnedMessage::Close {
                    code: CloseCode::Normal,
                    reason: match c.reason {
                        Ending::Stopped => "stopped",
                        _ => "all streams ended",
                    }
                    .to_string(),
                }));
            }
        }
        None
    }

    /// The next thing for the driver to do.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When [`Session::handle_timeout`] wants to be called next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.state == State::Closed {
            return None;
        }
        let stacks = self
            .streams
            .iter()
            .filter_map(|s| s.stack.poll_timeout())
            .min();
        let t = [stacks, self.close.and_then(|c| c.linger_until)];
        if self.link_up() {
            let keepalive = self.last_rx.map(|r| r + self.cfg.keepalive_timeout);
            let ack = self.next_ack.filter(|_| self.acks_wanted());
            let ping = self.next_ping.filter(|_| !self.close_sent());
            return [keepalive, ack, ping].into_iter().chain(t).flatten().min();
        }
        t.into_iter().flatten().min()
    }

    // ---- internals ----

    /// Some sink has news for the peer, and the peer has said who it is on this link.
    fn acks_wanted(&self) -> bool {
        self.peer_resumes > 0 && self.streams.iter().any(|s| s.ack_pending())
    }

    fn acks_due(&self, now: Instant) -> bool {
        self.next_ack.is_some_and(|t| now >= t) && self.acks_wanted()
    }

    fn close_sent(&self) -> bool {
        self.close.is_some_and(|c| c.sent)
    }

    fn find(&self, id: u16) -> Result<usize, SessionError> {
        self.streams
            .iter()
            .position(|s| s.id() == id)
            .ok_or(SessionError::UnknownStream(id))
    }

    fn message(&mut self, now: Instant, wall_ns: u64, msg: Incoming) -> Result<(), SessionError> {
        match msg {
            Incoming::Data { header, payload } => {
                let i = self.find(header.stream_id)?;
                let s = &mut self.streams[i];
                let End::Sink(k) = &mut s.end else {
                    return Err(SessionError::WrongDirection {
                        what: "sent a frame",
                        stream: s.plan.name.clone(),
                        role: "source",
                    });
                };
                let Some(payload) = k
                    .join_chunk(&header, payload, self.cfg.max_frame_bytes)
                    .map_err(|what| SessionError::BrokenFrame {
                        stream: s.plan.name.clone(),
                        what,
                    })?
                else {
                    return Ok(()); // more chunks to come
                };
                if s.ended || k.last_seq.is_some_and(|l| header.seq <= l) {
                    // Taken in before a reconnect: never deliver twice.
                    s.counters.duplicates += 1;
                    return Ok(());
                }
                k.last_seq = Some(header.seq);
                self.since_ack += payload.len();
                if self.since_ack >= self.cfg.ack_bytes {
                    self.next_ack = Some(now);
                }
                s.counters.wire_frames += 1;
                s.counters.wire_bytes += payload.len() as u64;
                let meta = crate::frame::Meta {
                    stream: header.stream_id,
                    seq: header.seq,
                    // As the source wrote it: pairs (checksum, encrypt) cover it.
                    timestamp_ns: header.timestamp_ns,
                    flags: 0,
                };
                s.stack
                    .handle_frame(now, Frame::from_bytes(meta, payload))?;
                self.pump(i);
            }
            Incoming::Other(msg) => match msg {
                OwnedMessage::Control { stream, layer, msg } => {
                    let i = self.find(stream)?;
                    self.streams[i]
                        .stack
                        .handle_control(now, layer as usize, Bytes::from(msg))?;
                    self.pump(i);
                }
                OwnedMessage::End { stream, .. } => {
                    let i = self.find(stream)?;
                    let s = &self.streams[i];
                    match &s.end {
                        End::Source(_) => {
                            return Err(SessionError::WrongDirection {
                                what: "ended",
                                stream: s.plan.name.clone(),
                                role: "source",
                            })
                        }
                        End::Sink(k) => {
                            if let Some(p) = &k.partial {
                                return Err(SessionError::BrokenFrame {
                                    stream: s.plan.name.clone(),
                                    what: format!(
                                        "the stream ended before the last chunk of frame {}",
                                        p.seq
                                    ),
                                });
                            }
                        }
                    }
                    self.end_stream(i, now)?;
                }
                OwnedMessage::Ack { stream, seq } => {
                    let i = self.find(stream)?;
                    if let End::Source(src) = &mut self.streams[i].end {
                        // A frame half written in chunks is finished first (the peer is
                        // joining it), even if this ACK covers it: it is dropped at the next.
                        while src.out.front().is_some_and(|p| p.seq <= seq)
                            && !(src.next_write == 0 && src.chunk_off > 0)
                        {
                            if let Some(p) = src.out.pop_front() {
                                src.out_bytes -= p.payload.len();
                                src.next_write = src.next_write.saturating_sub(1);
                                // Each frame begun on this connection is a delivery-rate
                                // sample of the path (whether the stream kept its window
                                // full, the estimator knew when the frame went).
                                if let Some(sent) = &p.send {
                                    src.flight_bytes -= p.payload.len();
                                    self.flight.on_acked(now, p.payload.len(), sent);
                                }
                            }
                        }
                    }
                }
                OwnedMessage::Delivered { stream, seq } => {
                    let i = self.find(stream)?;
                    let s = &mut self.streams[i];
                    let End::Source(src) = &mut s.end else {
                        return Err(SessionError::WrongDirection {
                            what: "reported deliveries",
                            stream: s.plan.name.clone(),
                            role: "sink",
                        });
                    };
                    while src.kept.front().is_some_and(|(m, _)| m.seq <= seq) {
                        if let Some((_, b)) = src.kept.pop_front() {
                            src.kept_bytes -= b.len();
                        }
                    }
                }
                OwnedMessage::Resume { instance } => self.resume(now, instance)?,
                OwnedMessage::Ping { t1 } => {
                    self.urgent.push_back(Urgent::Pong { t1, t2: wall_ns })
                }
                OwnedMessage::Pong { t1, t2, t3 } => {
                    let rtt = self.clock.sample(t1, t2, t3, wall_ns).rtt_ns;
                    if rtt > 0 {
                        self.base_rtt_ns = Some(self.base_rtt_ns.map_or(rtt, |b| b.min(rtt)));
                    }
                }
                OwnedMessage::Close { code, reason } => {
                    // The peer's words go to a terminal and the log: escaped and bounded.
                    let reason = printable(&reason, handshake::MAX_REASON);
                    return self.handle_close(now, code, reason);
                }
                OwnedMessage::Data { .. } => return Err(SessionError::PlainData),
                OwnedMessage::Hello(_) | OwnedMessage::Ready => {
                    // Only a datagram link can bring these from a stranger mid-session; on an
                    // authenticated link it is a confused peer. Neither stops the session.
                    if let Some(suppressed) = self.ignored_handshakes.admit(now) {
                        let more = match suppressed {
                            0 => String::new(),
                            n => format!(" ({n} more since the last warning)"),
                        };
                        self.events.push_back(Event::Warning(format!(
                            "ignored a handshake message in the middle of the session{more}"
                        )));
                    }
                }
            },
        }
        Ok(())
    }

    /// The peer's CLOSE, its reason already escaped (`printable`).
    fn handle_close(
        &mut self,
        now: Instant,
        code: CloseCode,
        reason: String,
    ) -> Result<(), SessionError> {
        match (code, reason) {
            (CloseCode::GoingAway, reason)
                if self.cfg.outlive_peer && self.cfg.reconnect && !self.stopping =>
            {
                self.peer_gone = Some(match reason.as_str() {
                    "" | "stopped" => "the peer stopped".to_string(),
                    r => format!("the peer stopped ({r})"),
                });
            }
            (CloseCode::Normal | CloseCode::GoingAway, _) => {
                // No more frames will come: deliver what our sinks hold. Our sources end
                // when we send our CLOSE.
                self.peer_closed = true;
                for i in 0..self.streams.len() {
                    if !self.streams[i].is_source() {
                        self.end_stream(i, now)?;
                    }
                }
                if self.close_sent() {
                    self.finish(self.close.map_or(Ending::PeerClosed, |c| c.reason));
                }
            }
            (CloseCode::UntrustedPeer, reason) if self.cfg.reconnect && !self.stopping => {
                // The peer revoked us mid-session (`ndd untrust`): a lost link with the
                // reason, so its refusals of our reconnects say the rest (and a peer that
                // trusts us again takes us back).
                let reason = match reason.as_str() {
                    "" => "the peer no longer trusts this side".to_string(),
                    r => format!("the peer no longer trusts this side: {r}"),
                };
                return self.handle_link_lost(now, &reason);
            }
            (code, reason) => return Err(SessionError::PeerClosed { code, reason }),
        }
        Ok(())
    }

    /// RESUME, twice per link from each side (docs/protocol.md §6): the first says who the
    /// peer is (a new run id means it restarted); we answer it with our ACKs, which now refer
    /// to the right run of the peer, and our second RESUME. The peer's second RESUME says its
    /// ACKs are all in: resend what is still unacknowledged, then new frames.
    fn resume(&mut self, now: Instant, instance: u64) -> Result<(), SessionError> {
        self.peer_resumes += 1;
        if self.peer_resumes == 1 {
            if self.peer_run_id.is_some_and(|p| p != instance) {
                // The peer restarted: its numbering starts again, what it had not completed
                // is encoded again for it, and every stack starts afresh for it.
                for i in 0..self.streams.len() {
                    if !self.streams[i].is_source() {
                        // What the old run sent and a pair still holds goes to the endpoint
                        // (counted as the old run's); then the inverse halves start afresh,
                        // as the restarted peer's forward halves do (a codec's stream state,
                        // a delta's reference).
                        self.streams[i].stack.flush(now)?;
                        self.pump(i);
                        let s = &mut self.streams[i];
                        s.stack = s.plan.build_stack()?;
                    }
                }
                self.peer_gen += 1;
                let mut again = 0;
                for i in 0..self.streams.len() {
                    let s = &mut self.streams[i];
                    match &mut s.end {
                        End::Sink(k) => {
                            k.last_seq = None;
                            k.acked_sent = None;
                            k.delivered = None;
                            k.delivered_sent = None;
                        }
                        End::Source(_) if s.plan.reliable => {
                            again += s.restart_for_new_peer(now)?;
                            self.pump(i);
                        }
                        End::Source(_) => {}
                    }
                }
                self.events
                    .push_back(Event::PeerRestarted { resending: again });
            }
            self.peer_run_id = Some(instance);
            for s in self.streams.iter_mut() {
                if let End::Sink(k) = &mut s.end {
                    if let Some(seq) = k.last_seq {
                        self.urgent.push_back(Urgent::Message(OwnedMessage::Ack {
                            stream: s.plan.id,
                            seq,
                        }));
                    }
                    k.acked_sent = k.last_seq;
                }
            }
            self.urgent.push_back(Urgent::Message(OwnedMessage::Resume {
                instance: self.run_id,
            }));
            return Ok(());
        }
        if self.state == State::Resuming {
            self.state = State::Running;
        }
        if let Some(t) = self.lost_at.take() {
            let after = now.saturating_duration_since(t);
            self.recoveries.push(after);
            let resending = self.streams.iter().map(|s| s.unwritten()).sum();
            self.events.push_back(Event::Resumed { after, resending });
        }
        Ok(())
    }

    /// Moves what stack `i` produced: a source's frames into its outbox, a sink's to its
    /// endpoint (events); control messages into the control queue while a link is up.
    fn pump(&mut self, i: usize) {
        let link_up = self.link_up();
        let budget = self.cfg.resume_buffer_bytes;
        let s = &mut self.streams[i];
        while let Some((layer, msg)) = s.stack.poll_control() {
            if link_up {
                self.control.push_back(OwnedMessage::Control {
                    stream: s.plan.id,
                    layer: layer as u8,
                    msg: msg.to_vec(),
                });
            }
        }
        match &mut s.end {
            End::Source(src) => {
                while let Some(f) = s.stack.poll_frame() {
                    if !link_up && !s.plan.replay_outage {
                        // Held in a pair when the link went (a bundle's timer): history too.
                        s.counters.stale += 1;
                        continue;
                    }
                    s.counters.wire_frames += 1;
                    s.counters.wire_bytes += f.len() as u64;
                    src.sent += 1;
                    let p = Pending {
                        seq: f.meta.seq,
                        timestamp_ns: f.meta.timestamp_ns,
                        payload: f.into_bytes(),
                        written: false,
                        send: None,
                    };
                    if !s.plan.reliable {
                        // Lossy: while the link is down only the newest frame is worth
                        // sending; above the budget the oldest goes.
                        if !link_up {
                            while src.out.len() > src.next_write {
                                if let Some(old) = src.out.pop_back() {
                                    src.out_bytes -= old.payload.len();
                                    s.counters.overflow += 1;
                                }
                            }
                        }
                        // The oldest goes, but not a frame half written in chunks (the peer
                        // is joining it).
                        let oldest = usize::from(src.chunk_off > 0);
                        while src.out.len() > oldest && src.out_bytes + p.payload.len() > budget {
                            if let Some(old) = src.out.remove(oldest) {
                                src.out_bytes -= old.payload.len();
                                if oldest < src.next_write {
                                    src.next_write -= 1;
                                }
                                s.counters.overflow += 1;
                            }
                        }
                    }
                    src.out_bytes += p.payload.len();
                    src.out.push_back(p);
                }
            }
            End::Sink(k) => {
                while let Some(f) = s.stack.poll_frame() {
                    k.handed.push_back((self.peer_gen, f.meta.seq));
                    self.events.push_back(Event::Deliver {
                        stream: i,
                        frame: f,
                    });
                }
            }
        }
    }

    /// Bytes of the reliable streams' frames begun on this connection and not yet
    /// acknowledged (0: a frame written now goes alone, and its ACK measures the path).
    fn in_flight(&self) -> usize {
        self.streams
            .iter()
            .map(|s| match &s.end {
                End::Source(src) => src.flight_bytes,
                End::Sink(_) => 0,
            })
            .sum()
    }

    fn next_data(&mut self, i: usize, now: Instant) -> Option<Transmit> {
        let room = self.peer_max_body.saturating_sub(DATA_BODY_MIN);
        let chunk = self.chunk_size().min(room);
        // Whether a reliable frame's first byte goes now, alone on the path (looked at only
        // then: this runs for every stream on every poll).
        let first_write = self.streams[i].plan.reliable
            && matches!(&self.streams[i].end, End::Source(src) if src.chunk_off == 0
                && src.out.get(src.next_write).is_some_and(|p| p.send.is_none()));
        let in_flight = if first_write { self.in_flight() } else { 0 };
        let s = &mut self.streams[i];
        let End::Source(src) = &mut s.end else {
            return None;
        };
        if src.next_write < src.out.len() {
            let reliable = s.plan.reliable;
            let p = &mut src.out[src.next_write];
            let len = p.payload.len();
            // A chunk's body (seq, timestamp, bytes) fits the peer's max_body; a frame whose
            // whole body would not is not cut (the link refuses it, as it would uncut).
            // A frame begun in chunks goes on in chunks, whatever the chunk size became
            // meanwhile (the rate rose): sent whole with MORE still set, it went out again and
            // again (the CI's bench smoke run: `frame 21 in chunks is over 16777216 bytes`).
            let started = src.chunk_off > 0;
            if first_write {
                p.send = Some(self.flight.on_write(now, in_flight, len));
                src.flight_bytes += len;
            }
            let payload = if started || (chunk > 0 && len > chunk && len <= room) {
                // Cut: another stream's frame may go before the next chunk.
                let step = if chunk == 0 { len } else { chunk };
                let end = (src.chunk_off + step).min(len);
                let part = p.payload.slice(src.chunk_off..end);
                src.chunk_off = end;
                part
            } else {
                p.payload.clone()
            };
            let more = src.chunk_off > 0 && src.chunk_off < len;
            let t = Transmit::Data {
                stream: s.plan.id,
                retransmit: p.written,
                more,
                seq: p.seq,
                timestamp_ns: p.timestamp_ns,
                payload,
                reliable,
            };
            if more {
                return Some(t);
            }
            src.chunk_off = 0;
            if p.written {
                s.counters.retransmits += 1;
            }
            p.written = true;
            if reliable {
                src.next_write += 1;
            } else if let Some(done) = src.out.remove(src.next_write) {
                src.out_bytes -= done.payload.len();
            }
            return Some(t);
        }
        if s.ended && !src.end_written {
            src.end_written = true;
            return Some(Transmit::Message(OwnedMessage::End {
                stream: s.plan.id,
                frames: src.sent,
            }));
        }
        None
    }

    /// ACK and DELIVERED for every sink with news, at most every `ack_every`.
    /// Not before the peer's first RESUME on this link: until then we do not know which run
    /// of the peer is there, and an ACK about a dead run's frames would discard a restarted
    /// peer's first frames.
    fn queue_acks(&mut self, now: Instant) {
        if !self.acks_due(now) {
            return;
        }
        self.next_ack = Some(now + self.cfg.ack_every);
        self.since_ack = 0;
        for s in self.streams.iter_mut() {
            let End::Sink(k) = &mut s.end else { continue };
            if k.last_seq != k.acked_sent {
                if let Some(seq) = k.last_seq {
                    self.urgent.push_back(Urgent::Message(OwnedMessage::Ack {
                        stream: s.plan.id,
                        seq,
                    }));
                }
                k.acked_sent = k.last_seq;
            }
            if k.delivered != k.delivered_sent {
                if let Some(seq) = k.delivered {
                    self.urgent
                        .push_back(Urgent::Message(OwnedMessage::Delivered {
                            stream: s.plan.id,
                            seq,
                        }));
                }
                k.delivered_sent = k.delivered;
            }
        }
    }

    /// Ends stream `i` on this side: a source flushes its stack (END follows its last frame);
    /// a sink flushes its stack into the endpoint and closes it.
    fn end_stream(&mut self, i: usize, now: Instant) -> Result<(), SessionError> {
        if self.streams[i].ended {
            return Ok(());
        }
        self.streams[i].stack.flush(now)?;
        self.pump(i);
        let s = &mut self.streams[i];
        s.ended = true;
        if !s.is_source() {
            self.events.push_back(Event::StreamEnded { stream: i });
        }
        Ok(())
    }

    /// After every input: on error close with a CLOSE naming it; otherwise see whether the
    /// session is finishing.
    fn after(&mut self, now: Instant, r: Result<(), SessionError>) -> Result<(), SessionError> {
        match r.and_then(|()| self.check_close(now)) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.close_now(e.close_code(), &e.to_string());
                Err(e)
            }
        }
    }

    /// Closed at once: whatever was queued is dropped; a CLOSE with `code` (if any, and if a
    /// link is up) is the last thing `poll_transmit` yields.
    fn close_now(&mut self, code: Option<CloseCode>, reason: &str) {
        if self.state == State::Closed {
            return;
        }
        let was_up = self.link_up();
        self.urgent.clear();
        self.control.clear();
        if let (true, Some(code)) = (was_up, code) {
            self.urgent.push_back(Urgent::Message(OwnedMessage::Close {
                code,
                reason: reason.to_string(),
            }));
        }
        self.state = State::Closed;
    }

    /// Finished when every stream ended (ours flushed, theirs got END), the peer closed, or
    /// we were told to stop: ends our sources and queues CLOSE (it goes out after all ENDs).
    /// Without a link, stopping or a closed peer means nobody is left to tell: over.
    fn check_close(&mut self, now: Instant) -> Result<(), SessionError> {
        if self.state == State::Closed {
            return Ok(());
        }
        let all_done = self.streams.iter().all(|s| s.ended);
        if self.close.is_none() && (all_done || self.peer_closed || self.stopping) {
            // Outliving the peer, a stop is not the end of the streams: what the stacks
            // hold goes out, but no END (the peer keeps its endpoints).
            self.going_away =
                self.stopping && self.cfg.outlive_peer && !all_done && !self.peer_closed;
            for i in 0..self.streams.len() {
                if self.streams[i].is_source() {
                    if self.going_away {
                        if !self.streams[i].ended {
                            self.streams[i].stack.flush(now)?;
                            self.pump(i);
                        }
                    } else {
                        self.end_stream(i, now)?;
                    }
                }
            }
            self.close = Some(Closing {
                reason: if self.stopping {
                    Ending::Stopped
                } else if all_done {
                    Ending::AllEnded
                } else {
                    Ending::PeerClosed
                },
                sent: false,
                linger_until: None,
            });
        }
        if let Some(c) = self.close {
            if !self.link_up() && (self.stopping || self.peer_closed) {
                self.finish(c.reason);
            }
        }
        Ok(())
    }

    fn finish(&mut self, how: Ending) {
        if self.state != State::Closed {
            self.state = State::Closed;
            self.events.push_back(Event::Closed(how));
        }
    }
}

#[cfg(test)]
mod tests;

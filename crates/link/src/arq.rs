//! Retransmission for the UDP link, sans-IO: what makes a `reliable` message reliable over
//! datagrams (docs/links.md "UDP").
//!
//! Every message on a UDP link travels in an **envelope**, the first byte of the message
//! bytes that are fragmented (and sealed):
//!
//! ```text
//! 00  message                      unsequenced: PING, PONG, a lossy stream's DATA
//! 01  u64 seq, message             sequenced: everything else (1, 2, 3, … per link direction)
//! 02  u64 cumulative, u64 sack     acknowledgement of sequenced messages
//! ```
//!
//! Integers big-endian. `cumulative` is the highest sequence number taken in with none
//! missing below it (0: none yet); bit `i` of `sack` says `cumulative + 2 + i` is held too.
//!
//! [`ArqRx`] hands sequenced messages on in order, each exactly once: one that arrives ahead
//! of a gap is held (at most [`ArqConfig::max_held`] messages and
//! [`ArqConfig::max_held_bytes`]; past that it is dropped and will come again), a repeat is
//! dropped. It acknowledges at once when something is out of order or repeated, otherwise
//! every [`ArqConfig::ack_every`] messages or [`ArqConfig::ack_bytes`] bytes, or [`ArqConfig::ack_delay`] after the first
//! unacknowledged one.
//!
//! [`ArqTx`] keeps every sequenced message until it is acknowledged, within a window
//! ([`ArqConfig::window_bytes`], [`ArqConfig::window_messages`]; a message larger than the
//! window goes alone) and a congestion window (TCP's: slow start, halved on a loss, to its
//! floor on a timeout, so a burst does not overflow the path's queues and socket buffers):
//! the link waits for room (backpressure), it never drops. A message is lost when it was
//! sent before one that arrived and is still missing a round trip and a quarter after it
//! went (RACK, RFC 8985: younger, it may only be reordered), or when the retransmission
//! timer fires (RFC 6298: smoothed round trip plus four deviations, 20 ms to 2 s, doubled on
//! each expiry until something new is acknowledged); lost messages go again first, as the
//! congestion window allows. When nothing is acknowledged for two round trips, the newest
//! message goes again as a probe (RFC 8985's tail loss probe), so a loss with nothing after
//! it is found by its acknowledgement rather than by the timer.
//!
//! Nothing here reads a clock or a socket: `now` comes in, datagrams to send come out.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};

/// Envelope kinds (first byte of every UDP message).
pub const KIND_PLAIN: u8 = 0;
/// A sequenced message follows its 8-byte sequence number.
pub const KIND_SEQUENCED: u8 = 1;
/// An acknowledgement.
pub const KIND_ACK: u8 = 2;
/// Bytes before a sequenced message.
pub const SEQUENCED_HEADER_LEN: usize = 9;
/// Length of an acknowledgement envelope.
pub const ACK_LEN: usize = 17;

/// Limits and timers of the retransmission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArqConfig {
    /// Most bytes of sequenced messages kept (sent, not yet acknowledged).
    pub window_bytes: usize,
    /// Most sequenced messages kept.
    pub window_messages: usize,
    /// Most messages a receiver holds ahead of a gap.
    pub max_held: u64,
    /// Most bytes a receiver holds ahead of a gap.
    pub max_held_bytes: usize,
    /// An acknowledgement after this many in-order messages…
    pub ack_every: u32,
    /// …or this long after the first unacknowledged one…
    pub ack_delay: Duration,
    /// …or once this many bytes arrived unacknowledged (large messages are acknowledged at
    /// once: a window of two 1 MB messages waited `ack_delay` for every pair).
    pub ack_bytes: usize,
    /// Retransmission timeout before the first round trip is measured.
    pub initial_rto: Duration,
    /// Bounds of the retransmission timeout.
    pub min_rto: Duration,
    /// Bounds of the retransmission timeout.
    pub max_rto: Duration,
    /// Congestion window at the start (bytes on the wire, see [`ArqTx`]).
    pub initial_cwnd: usize,
    /// Congestion window after a retransmission timeout, and its floor.
    pub min_cwnd: usize,
}

impl Default for ArqConfig {
    /// 2 MiB and 4096 messages kept, the same held by a receiver (8 MiB), an
    /// acknowledgement every 8 messages, 64 KiB or 5 ms, timeout 200 ms at first, 20 ms to 2 s,
    /// congestion window 64 KiB at first, 4 KiB at least.
    fn default() -> Self {
        ArqConfig {
            window_bytes: 2 << 20,
            window_messages: 4096,
            max_held: 4096,
            max_held_bytes: 8 << 20,
            ack_every: 8,
            ack_delay: Duration::from_millis(5),
            ack_bytes: 64 << 10,
            initial_rto: Duration::from_millis(200),
            min_rto: Duration::from_millis(20),
            max_rto: Duration::from_secs(2),
            initial_cwnd: 64 << 10,
            min_cwnd: 4 << 10,
        }
    }
}

/// An acknowledgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ack {
    /// Highest sequence number taken in with none missing below it (0: none).
    pub cumulative: u64,
    /// Bit `i`: `cumulative + 2 + i` is held too.
    pub sack: u64,
}

impl Ack {
    /// The 17-byte envelope.
    pub fn emit(&self) -> [u8; ACK_LEN] {
        let mut b = [0u8; ACK_LEN];
        b[0] = KIND_ACK;
        b[1..9].copy_from_slice(&self.cumulative.to_be_bytes());
        b[9..17].copy_from_slice(&self.sack.to_be_bytes());
        b
    }
}

/// A received UDP message, opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Envelope {
    /// Delivered as it comes.
    Plain(Bytes),
    /// For [`ArqRx::handle`].
    Sequenced {
        /// Its number.
        seq: u64,
        /// The message.
        message: Bytes,
    },
    /// For [`ArqTx::handle_ack`].
    Ack(Ack),
}

/// Why a message is not an envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    /// Empty.
    #[error("empty UDP message")]
    Empty,
    /// Unknown first byte.
    #[error("unknown UDP envelope kind {0}")]
    Kind(u8),
    /// Too short for its kind.
    #[error("UDP envelope of kind {kind} is {len} bytes, too short")]
    Short {
        /// The kind.
        kind: u8,
        /// Its length.
        len: usize,
    },
    /// Sequence number 0 (they start at 1).
    #[error("UDP sequenced message numbered 0")]
    Zero,
}

impl Envelope {
    /// Opens the bytes of one reassembled UDP message. Never copies.
    pub fn parse(b: Bytes) -> Result<Envelope, EnvelopeError> {
        let kind = *b.first().ok_or(EnvelopeError::Empty)?;
        let short = EnvelopeError::Short { kind, len: b.len() };
        match kind {
            KIND_PLAIN => Ok(Envelope::Plain(b.slice(1..))),
            KIND_SEQUENCED => {
                let seq = b.get(1..9).ok_or(short)?;
                let seq = u64::from_be_bytes(seq.try_into().map_err(|_| short)?);
                if seq == 0 {
                    return Err(EnvelopeError::Zero);
                }
                Ok(Envelope::Sequenced {
                    seq,
                    message: b.slice(SEQUENCED_HEADER_LEN..),
                })
            }
            KIND_ACK => {
                let field = |r: std::ops::Range<usize>| -> Result<u64, EnvelopeError> {
                    let s = b.get(r).ok_or(short)?;
                    Ok(u64::from_be_bytes(s.try_into().map_err(|_| short)?))
                };
                Ok(Envelope::Ack(Ack {
                    cumulative: field(1..9)?,
                    sack: field(9..17)?,
                }))
            }
            k => Err(EnvelopeError::Kind(k)),
        }
    }
}

/// `message` in an unsequenced envelope.
pub fn plain(message: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(1 + message.len());
    v.push(KIND_PLAIN);
    v.extend_from_slice(message);
    v
}

/// Writes a sequenced envelope's header (`SEQUENCED_HEADER_LEN` bytes) into `h`.
pub fn write_sequenced_header(h: &mut [u8], seq: u64) {
    h[0] = KIND_SEQUENCED;
    h[1..9].copy_from_slice(&seq.to_be_bytes());
}

/// Counters of both directions. Only grow.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ArqStats {
    /// Sequenced messages sent again.
    pub retransmitted: u64,
    /// Retransmission timer expiries.
    pub timeouts: u64,
    /// Tail loss probes: the newest message sent again when no acknowledgement came for two
    /// round trips (counted in `retransmitted` too).
    pub probes: u64,
    /// Sequenced messages received again and dropped.
    pub duplicates: u64,
    /// Sequenced messages that arrived ahead of a gap (held or dropped).
    pub out_of_order: u64,
    /// Of those, dropped because the receiver held too much already.
    pub overflow: u64,
}

#[derive(Debug)]
struct Out {
    seq: u64,
    envelope: Bytes,
    /// When it last went.
    sent: Instant,
    retransmitted: bool,
    /// The peer said it holds it (beyond a gap).
    sacked: bool,
    /// Deemed lost, waiting in [`ArqTx::lost`] to go again.
    lost: bool,
}

/// What a message costs the congestion window: its bytes and a datagram's overhead.
fn cost(len: usize) -> usize {
    len + 64
}

/// Increment of the congestion window per window acknowledged (a datagram's worth).
const MSS: usize = 1200;

/// The sending half: keeps sequenced messages until acknowledged, sends them again when
/// lost, and paces new ones with a congestion window.
///
/// The congestion window (bytes on the wire not yet acknowledged) starts at
/// [`ArqConfig::initial_cwnd`], grows by what is acknowledged (slow start) up to the slow
/// start threshold and by about a datagram per round trip after it; a loss halves it (once
/// per window of messages, NewReno's recovery), a timeout drops it to
/// [`ArqConfig::min_cwnd`] (RFC 5681). Lost messages go again first, as the window allows.
#[derive(Debug)]
pub struct ArqTx {
    cfg: ArqConfig,
    next_seq: u64,
    /// Unacknowledged, consecutive from the front.
    out: VecDeque<Out>,
    /// Their bytes (the window).
    bytes: usize,
    /// Cost of those on the wire: sent, neither acknowledged, held by the peer nor lost.
    in_flight: usize,
    /// Deemed lost, in order: they go again as the congestion window allows.
    lost: BTreeSet<u64>,
    cwnd: usize,
    ssthresh: usize,
    /// Losses of messages up to this one belong to the congestion event already answered.
    recovery: u64,
    srtt: Option<Duration>,
    rttvar: Duration,
    min_rtt: Option<Duration>,
    rto: Duration,
    /// Expiries without progress since the last one (the timeout doubles each time).
    backoff: u32,
    timer: Option<Instant>,
    /// Highest message the peer said it holds beyond a gap.
    highest_sacked: u64,
    /// When the latest-sent message known to have arrived went (RACK).
    rack_sent: Option<Instant>,
    /// When the youngest gap below it counts as lost.
    loss_timer: Option<Instant>,
    /// When to send the newest message again as a probe (RFC 8985's tail loss probe).
    probe: Option<Instant>,
    stats: ArqStats,
}

impl ArqTx {
    /// Nothing sent yet; the first message is number 1.
    pub fn new(cfg: ArqConfig) -> ArqTx {
        ArqTx {
            cfg,
            next_seq: 1,
            out: VecDeque::new(),
            bytes: 0,
            in_flight: 0,
            lost: BTreeSet::new(),
            cwnd: cfg.initial_cwnd.max(cfg.min_cwnd),
            ssthresh: usize::MAX,
            recovery: 0,
            srtt: None,
            rttvar: Duration::ZERO,
            min_rtt: None,
            rto: cfg.initial_rto,
            backoff: 0,
            timer: None,
            highest_sacked: 0,
            rack_sent: None,
            loss_timer: None,
            probe: None,
            stats: ArqStats::default(),
        }
    }

    /// Whether a new message of `len` bytes may go now: nothing lost waits to go again,
    /// the congestion window has room (or nothing is on the wire), and the window has room
    /// (or nothing is kept: a message larger than the window goes alone).
    pub fn has_room(&self, len: usize) -> bool {
        if self.out.is_empty() {
            return true;
        }
        self.lost.is_empty()
            && (self.in_flight == 0 || self.in_flight + cost(len) <= self.cwnd)
            && self.bytes + len <= self.cfg.window_bytes
            && self.out.len() < self.cfg.window_messages
    }

    /// The number the next sequenced message gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Keeps a sequenced envelope built with [`ArqTx::next_seq`] (its header written by
    /// [`write_sequenced_header`]) until it is acknowledged. The caller sends it.
    pub fn sent(&mut self, now: Instant, envelope: Bytes) {
        self.bytes += envelope.len();
        self.in_flight += cost(envelope.len());
        self.out.push_back(Out {
            seq: self.next_seq,
            envelope,
            sent: now,
            retransmitted: false,
            sacked: false,
            lost: false,
        });
        self.next_seq += 1;
        if self.timer.is_none() {
            self.timer = Some(now + self.current_rto());
        }
        if self.probe.is_none() {
            self.arm_probe(now);
        }
    }

    /// A probe two round trips (and the peer's acknowledgement delay) from now, when the
    /// round trip is known and that is before the retransmission timer: a lost message with
    /// nothing after it to reveal the gap then costs a round trip or two, not a timeout.
    fn arm_probe(&mut self, now: Instant) {
        self.probe = self.srtt.and_then(|srtt| {
            let at = now + (srtt * 2 + self.cfg.ack_delay).max(Duration::from_millis(2));
            self.timer.is_some_and(|t| at < t).then_some(at)
        });
    }

    /// Messages kept (in flight, held by the peer beyond a gap, or lost).
    pub fn in_flight(&self) -> usize {
        self.out.len()
    }

    /// The congestion window, bytes.
    pub fn cwnd(&self) -> usize {
        self.cwnd
    }

    /// Counters.
    pub fn stats(&self) -> ArqStats {
        self.stats
    }

    /// The retransmission timeout in force (backoff included).
    pub fn current_rto(&self) -> Duration {
        self.rto
            .saturating_mul(1u32 << self.backoff.min(16))
            .min(self.cfg.max_rto)
    }

    /// The smoothed round trip, once measured.
    pub fn srtt(&self) -> Option<Duration> {
        self.srtt
    }

    /// The peer's acknowledgement; returns the envelopes to send again now (lost ones, as
    /// the congestion window allows).
    pub fn handle_ack(&mut self, now: Instant, ack: Ack) -> Vec<Bytes> {
        let mut sample = None;
        let mut newly = 0usize;
        let mut delivered_sent = None;
        // What arrived: its round trip, and the latest send time known delivered (a
        // retransmitted message counts only if its round trip is plausible for the copy
        // that went last).
        let min_rtt = self.min_rtt.unwrap_or(Duration::ZERO);
        let mut arrived = |o: &Out, sample: &mut Option<Duration>| {
            let rtt = now.saturating_duration_since(o.sent);
            if !o.retransmitted {
                *sample = Some(rtt);
            }
            if !o.retransmitted || rtt >= min_rtt {
                delivered_sent = delivered_sent.max(Some(o.sent));
            }
        };
        while self.out.front().is_some_and(|o| o.seq <= ack.cumulative) {
            let Some(o) = self.out.pop_front() else { break };
            self.bytes -= o.envelope.len();
            if o.lost {
                self.lost.remove(&o.seq);
            } else if !o.sacked {
                self.in_flight -= cost(o.envelope.len());
            }
            if !o.sacked {
                newly += cost(o.envelope.len());
                arrived(&o, &mut sample);
            }
        }
        if ack.sack != 0 {
            for o in self.out.iter_mut() {
                let Some(bit) = o.seq.checked_sub(ack.cumulative + 2) else {
                    continue;
                };
                if bit >= 64 {
                    break;
                }
                if ack.sack & (1 << bit) == 0 || o.sacked {
                    continue;
                }
                o.sacked = true;
                if o.lost {
                    o.lost = false;
                    self.lost.remove(&o.seq);
                } else {
                    self.in_flight -= cost(o.envelope.len());
                }
                newly += cost(o.envelope.len());
                arrived(o, &mut sample);
                self.highest_sacked = self.highest_sacked.max(o.seq);
            }
        }
        if let Some(rtt) = sample {
            self.measure(rtt);
        }
        if newly > 0 {
            self.backoff = 0;
            self.timer = (!self.out.is_empty()).then(|| now + self.current_rto());
            self.arm_probe(now);
            self.rack_sent = self.rack_sent.max(delivered_sent);
            if ack.cumulative >= self.recovery {
                self.grow(newly);
            }
        }
        self.detect_losses(now);
        self.poll_transmit(now)
    }

    fn grow(&mut self, acked: usize) {
        // Past twice the window it cannot matter (and would not come down quickly).
        let cap = self.cfg.window_bytes.saturating_mul(2).max(self.cwnd);
        if self.cwnd < self.ssthresh {
            self.cwnd = (self.cwnd + acked).min(cap);
        } else {
            let step = (MSS * acked / self.cwnd.max(1)).max(1);
            self.cwnd = (self.cwnd + step).min(cap);
        }
    }

    /// RACK (RFC 8985): a message sent before one that arrived and still missing a round
    /// trip and a quarter after it went is lost (younger, it may only be reordered). Arms the
    /// loss timer for the youngest of the rest.
    fn detect_losses(&mut self, now: Instant) {
        self.loss_timer = None;
        let (Some(rack), Some(front)) = (self.rack_sent, self.out.front()) else {
            return;
        };
        if self.highest_sacked < front.seq {
            return; // no gap known
        }
        let srtt = self.srtt.unwrap_or(self.cfg.min_rto);
        let age = srtt + (srtt / 4).max(Duration::from_millis(1));
        let mut first_lost = None;
        for o in self.out.iter_mut() {
            if o.seq > self.highest_sacked {
                break;
            }
            if o.sacked || o.lost || o.sent > rack {
                continue;
            }
            let due = o.sent + age;
            if now >= due {
                o.lost = true;
                self.in_flight -= cost(o.envelope.len());
                self.lost.insert(o.seq);
                first_lost.get_or_insert(o.seq);
            } else {
                self.loss_timer = Some(self.loss_timer.map_or(due, |t| t.min(due)));
            }
        }
        if first_lost.is_some_and(|seq| seq > self.recovery) {
            self.ssthresh = (self.cwnd / 2).max(self.cfg.min_cwnd);
            self.cwnd = self.ssthresh;
            self.recovery = self.next_seq - 1;
        }
    }

    /// Lost messages that the congestion window lets go again now, oldest first.
    fn poll_transmit(&mut self, now: Instant) -> Vec<Bytes> {
        let mut again = Vec::new();
        let Some(front) = self.out.front().map(|o| o.seq) else {
            return again;
        };
        while let Some(&seq) = self.lost.first() {
            let Some(o) = self.out.get_mut((seq - front) as usize) else {
                self.lost.pop_first();
                continue;
            };
            let c = cost(o.envelope.len());
            if self.in_flight > 0 && self.in_flight + c > self.cwnd {
                break;
            }
            self.lost.pop_first();
            o.lost = false;
            o.retransmitted = true;
            o.sent = now;
            self.in_flight += c;
            again.push(o.envelope.clone());
        }
        self.stats.retransmitted += again.len() as u64;
        again
    }

    fn measure(&mut self, rtt: Duration) {
        self.min_rtt = Some(self.min_rtt.map_or(rtt, |m| m.min(rtt)));
        match self.srtt {
            None => {
                self.srtt = Some(rtt);
                self.rttvar = rtt / 2;
            }
            Some(s) => {
                let diff = s.abs_diff(rtt);
                self.rttvar = (self.rttvar * 3 + diff) / 4;
                self.srtt = Some((s * 7 + rtt) / 8);
            }
        }
        let s = self.srtt.unwrap_or(rtt);
        self.rto = (s + (self.rttvar * 4).max(self.cfg.ack_delay) + self.cfg.ack_delay)
            .clamp(self.cfg.min_rto, self.cfg.max_rto);
    }

    /// When [`ArqTx::handle_timeout`] is due.
    pub fn poll_timeout(&self) -> Option<Instant> {
        [self.timer, self.loss_timer, self.probe]
            .into_iter()
            .flatten()
            .min()
    }

    /// The timers: a gap old enough is lost (see [`ArqTx::handle_ack`]); when the
    /// retransmission timer expires, every message the peer did not report is lost, the
    /// congestion window drops to its floor and the timeout doubles until something new is
    /// acknowledged. Returns the envelopes to send again now.
    pub fn handle_timeout(&mut self, now: Instant) -> Vec<Bytes> {
        if self.timer.is_none_or(|t| now < t) {
            let mut again = Vec::new();
            if self.loss_timer.is_some_and(|t| now >= t) {
                self.detect_losses(now);
                again = self.poll_transmit(now);
            }
            if self.probe.is_some_and(|t| now >= t) {
                self.probe = None;
                let newest = self.out.iter_mut().rev().find(|o| !o.sacked && !o.lost);
                if let Some(o) = newest.filter(|_| again.is_empty()) {
                    o.retransmitted = true;
                    o.sent = now;
                    self.stats.retransmitted += 1;
                    self.stats.probes += 1;
                    again.push(o.envelope.clone());
                }
            }
            return again;
        }
        if self.out.is_empty() {
            self.timer = None;
            return Vec::new();
        }
        self.stats.timeouts += 1;
        self.loss_timer = None;
        self.probe = None;
        if self.backoff == 0 {
            self.ssthresh = (self.cwnd / 2).max(self.cfg.min_cwnd);
        }
        self.backoff = self.backoff.saturating_add(1);
        self.cwnd = self.cfg.min_cwnd;
        self.recovery = self.next_seq - 1;
        for o in self.out.iter_mut() {
            if !o.sacked && !o.lost {
                o.lost = true;
                self.in_flight -= cost(o.envelope.len());
                self.lost.insert(o.seq);
            }
        }
        self.timer = Some(now + self.current_rto());
        self.poll_transmit(now)
    }
}

/// The receiving half: hands sequenced messages on in order, exactly once.
#[derive(Debug)]
pub struct ArqRx {
    cfg: ArqConfig,
    /// Highest number handed on (none missing below it).
    delivered: u64,
    held: BTreeMap<u64, Bytes>,
    held_bytes: usize,
    unacked: u32,
    unacked_bytes: usize,
    ack_at: Option<Instant>,
    ack_now: bool,
    stats: ArqStats,
}

impl ArqRx {
    /// Nothing received yet.
    pub fn new(cfg: ArqConfig) -> ArqRx {
        ArqRx {
            cfg,
            delivered: 0,
            held: BTreeMap::new(),
            held_bytes: 0,
            unacked: 0,
            unacked_bytes: 0,
            ack_at: None,
            ack_now: false,
            stats: ArqStats::default(),
        }
    }

    /// Forgets everything (the peer restarted: its numbering starts again).
    pub fn reset(&mut self) {
        let stats = self.stats;
        *self = ArqRx::new(self.cfg);
        self.stats = stats;
    }

    /// Counters.
    pub fn stats(&self) -> ArqStats {
        self.stats
    }

    /// Bytes held ahead of a gap.
    pub fn held_bytes(&self) -> usize {
        self.held_bytes
    }

    /// Sequenced message `seq`: appends to `out` what can be handed on now, in order.
    pub fn handle(&mut self, now: Instant, seq: u64, message: Bytes, out: &mut Vec<Bytes>) {
        if seq <= self.delivered || self.held.contains_key(&seq) {
            self.stats.duplicates += 1;
            self.ack_now = true;
            return;
        }
        if seq != self.delivered + 1 {
            self.stats.out_of_order += 1;
            self.ack_now = true;
            if seq - self.delivered > self.cfg.max_held
                || self.held_bytes + message.len() > self.cfg.max_held_bytes
            {
                self.stats.overflow += 1;
                return;
            }
            self.held_bytes += message.len();
            self.held.insert(seq, message);
            return;
        }
        self.unacked_bytes += message.len();
        out.push(message);
        self.delivered = seq;
        while let Some(m) = self.held.remove(&(self.delivered + 1)) {
            self.held_bytes -= m.len();
            self.unacked_bytes += m.len();
            out.push(m);
            self.delivered += 1;
        }
        self.unacked += 1;
        if self.unacked >= self.cfg.ack_every
            || self.unacked_bytes >= self.cfg.ack_bytes
            || !self.held.is_empty()
        {
            self.ack_now = true;
        } else if self.ack_at.is_none() {
            self.ack_at = Some(now + self.cfg.ack_delay);
        }
    }

    /// The acknowledgement to send now, if one is due.
    pub fn poll_ack(&mut self, now: Instant) -> Option<Ack> {
        if !self.ack_now && self.ack_at.is_none_or(|t| now < t) {
            return None;
        }
        self.ack_now = false;
        self.ack_at = None;
        self.unacked = 0;
        self.unacked_bytes = 0;
        Some(self.ack())
    }

    /// When an acknowledgement falls due.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.ack_at
    }

    /// What we have: the cumulative number and which of the next 64 after the gap are held.
    pub fn ack(&self) -> Ack {
        let base = self.delivered + 2;
        let mut sack = 0u64;
        for &seq in self.held.range(base..base + 64).map(|(s, _)| s) {
            sack |= 1 << (seq - base);
        }
        Ack {
            cumulative: self.delivered,
            sack,
        }
    }
}

/// A sequenced envelope around `message` (copies it), for messages that are not frames.
pub fn sequenced(seq: u64, message: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(SEQUENCED_HEADER_LEN + message.len());
    b.put_u8(KIND_SEQUENCED);
    b.put_u64(seq);
    b.put_slice(message);
    b.freeze()
}

#[cfg(test)]
mod tests;

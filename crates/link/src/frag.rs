//! Datagram fragmentation and reassembly, sans-IO: shared by the UDP link and by QUIC
//! datagrams (lossy streams).
//!
//! Every datagram carries a 20-byte fragment header followed by a slice of one ndd message
//! (in the wire format of `docs/protocol.md`):
//!
//! ```text
//! off size field
//!  0   2   magic        0x4E 0x44 ("ND")
//!  2   1   version      1
//!  3   1   flags        0 (reserved: the sender writes 0, the receiver ignores them)
//!  4   4   session id   chosen at random by the sender when its link starts (0 on QUIC)
//!  8   8   message id   per sender session: 1, 2, 3, … one per message (not per fragment)
//! 16   2   index        0..count
//! 18   2   count        1..=65535 fragments in this message
//! 20   …   fragment     bytes [index × chunk, …) of the message
//! ```
//!
//! All integers big-endian. A message that fits in one datagram is sent as fragment 0 of 1.
//!
//! [`Reassembler`] takes datagrams in any order, with losses and duplicates, and gives back
//! each complete message **at most once**:
//!
//! - a datagram that is not a valid fragment is counted as `garbage` and ignored;
//! - a message id already delivered (kept for the last [`DEDUP_WINDOW`] ids) is a `duplicate`;
//!   one older than that window is `stale`; a fragment index already held is a
//!   `duplicate_fragments`;
//! - an incomplete message older than [`ReassemblyConfig::timeout`] is dropped (`expired`);
//! - the bytes held in incomplete messages never exceed [`ReassemblyConfig::memory_cap`]: the
//!   oldest incomplete messages are dropped first (`evicted`);
//! - a message growing past [`ReassemblyConfig::max_message`] is dropped (`too_large`);
//! - a new session id from the peer (it restarted) resets the state (`session_changes`).
//!
//! Nothing here panics on any input (a proptest feeds it arbitrary bytes).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};

/// First two bytes of every fragment: "ND".
pub const MAGIC: [u8; 2] = *b"ND";
/// Fragment header version.
pub const FRAG_VERSION: u8 = 1;
/// Length of the fragment header.
pub const FRAG_HEADER_LEN: usize = 20;
/// How many delivered message ids are remembered to drop duplicates; ids older than the
/// newest delivered one minus this window are stale.
pub const DEDUP_WINDOW: u64 = 4096;
/// Bookkeeping charged per held fragment on top of its bytes, so that many tiny fragments
/// cannot exceed the memory cap unnoticed.
const FRAGMENT_OVERHEAD: usize = 64;

/// The header of one fragment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FragHeader {
    /// The sender's session id (random per link start; 0 on QUIC).
    pub session: u32,
    /// Message id, per sender session, from 1.
    pub message: u64,
    /// Fragment index, `< count`.
    pub index: u16,
    /// Fragments in the message, ≥ 1.
    pub count: u16,
}

/// Why a datagram is not a fragment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FragError {
    /// Shorter than the header.
    #[error("datagram of {0} bytes is shorter than the 20-byte fragment header")]
    Short(usize),
    /// Wrong magic bytes: not an ndd datagram.
    #[error("not an ndd datagram (bad magic)")]
    Magic,
    /// Unknown header version.
    #[error("unknown fragment header version {0}")]
    Version(u8),
    /// Count 0 or index ≥ count.
    #[error("fragment index {index} out of range for count {count}")]
    Index {
        /// The index.
        index: u16,
        /// The count.
        count: u16,
    },
}

impl FragHeader {
    /// Parse the header at the start of `datagram`; returns it and the fragment bytes.
    pub fn parse(datagram: &[u8]) -> Result<(FragHeader, &[u8]), FragError> {
        let Some((h, rest)) = datagram.split_first_chunk::<FRAG_HEADER_LEN>() else {
            return Err(FragError::Short(datagram.len()));
        };
        if h[0..2] != MAGIC {
            return Err(FragError::Magic);
        }
        if h[2] != FRAG_VERSION {
            return Err(FragError::Version(h[2]));
        }
        let header = FragHeader {
            session: u32::from_be_bytes([h[4], h[5], h[6], h[7]]),
            message: u64::from_be_bytes([h[8], h[9], h[10], h[11], h[12], h[13], h[14], h[15]]),
            index: u16::from_be_bytes([h[16], h[17]]),
            count: u16::from_be_bytes([h[18], h[19]]),
        };
        if header.count == 0 || header.index >= header.count {
            return Err(FragError::Index {
                index: header.index,
                count: header.count,
            });
        }
        Ok((header, rest))
    }

    /// Append the 20 header bytes to `out`.
    pub fn emit(&self, out: &mut BytesMut) {
        out.put_slice(&MAGIC);
        out.put_u8(FRAG_VERSION);
        out.put_u8(0);
        out.put_u32(self.session);
        out.put_u64(self.message);
        out.put_u16(self.index);
        out.put_u16(self.count);
    }
}

/// Largest message that [`fragment`] can split into datagrams of `max_datagram` bytes.
pub fn max_fragmented_len(max_datagram: usize) -> usize {
    max_datagram.saturating_sub(FRAG_HEADER_LEN) * usize::from(u16::MAX)
}

/// Split `message` into datagrams of at most `max_datagram` bytes each (header included).
///
/// Returns `None` when `max_datagram` leaves no room for data or the message would need more
/// than 65535 fragments.
pub fn fragment(
    session: u32,
    message_id: u64,
    message: &[u8],
    max_datagram: usize,
) -> Option<Vec<Bytes>> {
    let chunk = max_datagram
        .checked_sub(FRAG_HEADER_LEN)
        .filter(|&c| c > 0)?;
    let count = message.len().div_ceil(chunk).max(1);
    let count = u16::try_from(count).ok()?;
    let mut out = Vec::with_capacity(usize::from(count));
    let mut pieces = message.chunks(chunk);
    for index in 0..count {
        let piece = pieces.next().unwrap_or(&[]);
        let mut d = BytesMut::with_capacity(FRAG_HEADER_LEN + piece.len());
        FragHeader {
            session,
            message: message_id,
            index,
            count,
        }
        .emit(&mut d);
        d.put_slice(piece);
        out.push(d.freeze());
    }
    Some(out)
}

/// Limits of a [`Reassembler`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReassemblyConfig {
    /// An incomplete message is dropped this long after its first fragment arrived.
    pub timeout: Duration,
    /// Most bytes held in incomplete messages (fragment bytes plus 64 bytes of bookkeeping
    /// per fragment).
    pub memory_cap: usize,
    /// Largest message accepted (normally the receiver's `max_body` + 10).
    pub max_message: usize,
}

impl Default for ReassemblyConfig {
    /// 500 ms, 8 MiB, 16 MiB + 10.
    fn default() -> Self {
        ReassemblyConfig {
            timeout: Duration::from_millis(500),
            memory_cap: 8 * 1024 * 1024,
            max_message: crate::conn::DEFAULT_MAX_BODY as usize + ndd_wire::HEADER_LEN,
        }
    }
}

/// What a [`Reassembler`] (and the link around it) dropped and delivered. Counters only grow.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DatagramStats {
    /// Datagrams received.
    pub datagrams: u64,
    /// Datagrams that are not fragments (bad magic, version, index, too short).
    pub garbage: u64,
    /// Whole messages received again after delivery (dropped): the same message id, or on a
    /// UDP link the same number (a retransmission that crossed its acknowledgement).
    pub duplicates: u64,
    /// Fragments whose index was already held (dropped).
    pub duplicate_fragments: u64,
    /// Fragments of messages older than the dedup window (dropped).
    pub stale: u64,
    /// Incomplete messages dropped after the reassembly timeout.
    pub expired: u64,
    /// Incomplete messages dropped to stay under the memory cap.
    pub evicted: u64,
    /// Messages dropped for exceeding `max_message`.
    pub too_large: u64,
    /// Fragments that disagree with earlier fragments of the same message on its count.
    pub inconsistent: u64,
    /// Times the peer's session id changed (state reset).
    pub session_changes: u64,
    /// Complete messages that were not valid ndd messages (dropped by the link).
    pub bad_messages: u64,
    /// Datagrams from an address that is not the peer's (UDP link, dropped).
    pub foreign: u64,
    /// Sealed UDP link: datagrams that did not authenticate (forged, damaged, for another
    /// session, plain, or a stranger's key exchange), dropped.
    pub unauthenticated: u64,
    /// Sealed UDP link: datagrams whose counter was already seen or is too old, dropped.
    pub replayed: u64,
    /// UDP link: numbered messages sent again (lost, or not acknowledged in time).
    pub retransmitted: u64,
    /// UDP link: expiries of the retransmission timer.
    pub retransmit_timeouts: u64,
    /// UDP link: tail loss probes (the newest message sent again after two round trips
    /// without an acknowledgement).
    pub tail_probes: u64,
    /// UDP link: numbered messages that arrived ahead of a gap (held until it fills).
    pub out_of_order: u64,
    /// Messages delivered.
    pub delivered: u64,
    /// Messages sent.
    pub messages_sent: u64,
    /// Datagrams sent.
    pub datagrams_sent: u64,
}

#[derive(Debug)]
struct Partial {
    count: u16,
    parts: BTreeMap<u16, Bytes>,
    bytes: usize,
    charged: usize,
    first_seen: Instant,
}

/// Reassembles fragmented messages; see the module docs for the rules.
#[derive(Debug)]
pub struct Reassembler {
    config: ReassemblyConfig,
    session: Option<u32>,
    /// Newest message id delivered.
    high: u64,
    /// Delivered ids within the window below `high`.
    delivered: BTreeSet<u64>,
    partials: BTreeMap<u64, Partial>,
    /// Bytes charged for held fragments.
    held: usize,
    stats: DatagramStats,
}

impl Reassembler {
    /// An empty reassembler.
    pub fn new(config: ReassemblyConfig) -> Reassembler {
        Reassembler {
            config,
            session: None,
            high: 0,
            delivered: BTreeSet::new(),
            partials: BTreeMap::new(),
            held: 0,
            stats: DatagramStats::default(),
        }
    }

    /// The limits in force.
    pub fn config(&self) -> &ReassemblyConfig {
        &self.config
    }

    /// Change the largest message accepted.
    pub fn set_max_message(&mut self, max_message: usize) {
        self.config.max_message = max_message;
    }

    /// Counters so far.
    pub fn stats(&self) -> DatagramStats {
        self.stats
    }

    /// Mutable counters, for the link to count what it drops itself.
    pub fn stats_mut(&mut self) -> &mut DatagramStats {
        &mut self.stats
    }

    /// The peer's session id, once a fragment has arrived.
    pub fn session(&self) -> Option<u32> {
        self.session
    }

    /// Bytes currently charged against the memory cap.
    pub fn held_bytes(&self) -> usize {
        self.held
    }

    /// Incomplete messages currently held.
    pub fn pending(&self) -> usize {
        self.partials.len()
    }

    /// When the oldest incomplete message expires, if any.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.partials
            .values()
            .map(|p| p.first_seen + self.config.timeout)
            .min()
    }

    /// Drop incomplete messages older than the timeout.
    pub fn handle_timeout(&mut self, now: Instant) {
        let timeout = self.config.timeout;
        let expired: Vec<u64> = self
            .partials
            .iter()
            .filter(|(_, p)| now.saturating_duration_since(p.first_seen) >= timeout)
            .map(|(&id, _)| id)
            .collect();
        for id in expired {
            self.remove(id);
            self.stats.expired += 1;
        }
    }

    /// One received datagram. Returns the session id and the message it completes, if any.
    pub fn push(&mut self, now: Instant, datagram: Bytes) -> Option<(u32, Bytes)> {
        self.stats.datagrams += 1;
        self.handle_timeout(now);
        let (header, body_len) = match FragHeader::parse(&datagram) {
            Ok((h, body)) => (h, body.len()),
            Err(_) => {
                self.stats.garbage += 1;
                return None;
            }
        };
        let body = datagram.slice(FRAG_HEADER_LEN..FRAG_HEADER_LEN + body_len);
        match self.session {
            None => self.session = Some(header.session),
            Some(s) if s != header.session => {
                self.stats.session_changes += 1;
                self.reset(header.session);
            }
            Some(_) => {}
        }
        let id = header.message;
        if id <= self.high.saturating_sub(DEDUP_WINDOW) && self.high > 0 {
            self.stats.stale += 1;
            return None;
        }
        if self.delivered.contains(&id) {
            self.stats.duplicates += 1;
            return None;
        }
        if header.count == 1 {
            if body.len() > self.config.max_message {
                self.stats.too_large += 1;
                return None;
            }
            self.mark_delivered(id);
            return Some((header.session, body));
        }
        let charge = body.len() + FRAGMENT_OVERHEAD;
        let partial = self.partials.entry(id).or_insert_with(|| Partial {
            count: header.count,
            parts: BTreeMap::new(),
            bytes: 0,
            charged: 0,
            first_seen: now,
        });
        if partial.count != header.count {
            self.stats.inconsistent += 1;
            return None;
        }
        if partial.parts.contains_key(&header.index) {
            self.stats.duplicate_fragments += 1;
            return None;
        }
        partial.bytes += body.len();
        partial.charged += charge;
        partial.parts.insert(header.index, body);
        let complete = partial.parts.len() == usize::from(partial.count);
        let too_large = partial.bytes > self.config.max_message;
        self.held += charge;
        if too_large {
            self.remove(id);
            self.stats.too_large += 1;
            return None;
        }
        if complete {
            let partial = self.remove(id)?;
            let mut msg = BytesMut::with_capacity(partial.bytes);
            for part in partial.parts.values() {
                msg.put_slice(part);
            }
            self.mark_delivered(id);
            return Some((header.session, msg.freeze()));
        }
        // Stay under the cap: drop the oldest incomplete messages (possibly this one).
        while self.held > self.config.memory_cap {
            let Some(oldest) = self.oldest() else { break };
            self.remove(oldest);
            self.stats.evicted += 1;
        }
        None
    }

    fn oldest(&self) -> Option<u64> {
        self.partials
            .iter()
            .min_by_key(|(&id, p)| (p.first_seen, id))
            .map(|(&id, _)| id)
    }

    fn remove(&mut self, id: u64) -> Option<Partial> {
        let p = self.partials.remove(&id)?;
        self.held = self.held.saturating_sub(p.charged);
        Some(p)
    }

    fn reset(&mut self, session: u32) {
        self.session = Some(session);
        self.high = 0;
        self.delivered.clear();
        self.partials.clear();
        self.held = 0;
    }

    fn mark_delivered(&mut self, id: u64) {
        self.stats.delivered += 1;
        self.delivered.insert(id);
        if id > self.high {
            self.high = id;
            let floor = self.high.saturating_sub(DEDUP_WINDOW);
            // Everything at or below the floor is stale from now on: forget it.
            self.delivered = self.delivered.split_off(&(floor + 1));
            let stale: Vec<u64> = self.partials.range(..=floor).map(|(&k, _)| k).collect();
            for k in stale {
                self.remove(k);
                self.stats.stale += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cfg() -> ReassemblyConfig {
        ReassemblyConfig {
            timeout: Duration::from_millis(100),
            memory_cap: 1 << 20,
            max_message: 1 << 20,
        }
    }

    fn msg(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect()
    }

    #[test]
    fn header_parse_emit_fixture() {
        let h = FragHeader {
            session: 0x0102_0304,
            message: 0x1122_3344_5566_7788,
            index: 2,
            count: 3,
        };
        let mut b = BytesMut::new();
        h.emit(&mut b);
        assert_eq!(
            &b[..],
            &[
                0x4e, 0x44, 0x01, 0x00, 0x01, 0x02, 0x03, 0x04, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66,
                0x77, 0x88, 0x00, 0x02, 0x00, 0x03
            ]
        );
        b.put_slice(b"xy");
        assert_eq!(FragHeader::parse(&b).unwrap(), (h, &b"xy"[..]));
        assert_eq!(FragHeader::parse(&b[..19]), Err(FragError::Short(19)));
        let mut bad = b.clone();
        bad[18] = 0;
        bad[19] = 2;
        assert!(matches!(
            FragHeader::parse(&bad),
            Err(FragError::Index { .. })
        ));
    }

    #[test]
    fn reordered_and_duplicated_fragments_give_one_message() {
        let now = Instant::now();
        let m = msg(10_000, 7);
        let mut frags = fragment(9, 1, &m, 1000).unwrap();
        assert_eq!(frags.len(), 11);
        frags.reverse();
        let dup = frags[3].clone();
        frags.insert(5, dup);
        let mut r = Reassembler::new(cfg());
        let mut got = Vec::new();
        for f in frags.iter().chain(frags.iter()) {
            if let Some((s, out)) = r.push(now, f.clone()) {
                assert_eq!(s, 9);
                got.push(out);
            }
        }
        assert_eq!(got.len(), 1);
        assert_eq!(&got[0][..], &m[..]);
        assert_eq!(r.stats().duplicate_fragments, 1);
        // The second pass: the first fragment of it completes nothing, and every one is a
        // duplicate of a delivered message.
        assert_eq!(r.stats().duplicates, 12);
        assert_eq!(r.held_bytes(), 0);
    }

    #[test]
    fn stale_fragments_expire_after_the_timeout() {
        let t0 = Instant::now();
        let m = msg(3000, 1);
        let frags = fragment(1, 5, &m, 1020).unwrap();
        let mut r = Reassembler::new(cfg());
        assert!(r.push(t0, frags[0].clone()).is_none());
        assert_eq!(r.poll_timeout(), Some(t0 + Duration::from_millis(100)));
        r.handle_timeout(t0 + Duration::from_millis(99));
        assert_eq!(r.pending(), 1);
        r.handle_timeout(t0 + Duration::from_millis(100));
        assert_eq!(r.pending(), 0);
        assert_eq!(r.stats().expired, 1);
        assert_eq!(r.held_bytes(), 0);
        // The rest arrives late: a new partial, never completed (fragment 0 is gone).
        assert!(r
            .push(t0 + Duration::from_millis(150), frags[1].clone())
            .is_none());
        assert!(r
            .push(t0 + Duration::from_millis(150), frags[2].clone())
            .is_none());
        r.handle_timeout(t0 + Duration::from_millis(300));
        assert_eq!(r.stats().expired, 2);
        assert_eq!(r.stats().delivered, 0);
    }

    #[test]
    fn memory_cap_evicts_the_oldest() {
        let t0 = Instant::now();
        let mut r = Reassembler::new(ReassemblyConfig {
            memory_cap: 10_000,
            ..cfg()
        });
        // Three messages of 3 × 2000 bytes; send the first two fragments of each.
        for id in 1..=3u64 {
            let frags = fragment(1, id, &msg(6000, id as u8), 2020).unwrap();
            let t = t0 + Duration::from_millis(id);
            assert!(r.push(t, frags[0].clone()).is_none());
            assert!(r.push(t, frags[1].clone()).is_none());
            assert!(r.held_bytes() <= 10_000, "{}", r.held_bytes());
        }
        assert!(r.stats().evicted >= 1);
        assert_eq!(r.pending(), 2);
        // Message 3, the newest, is still there and completes.
        let frags = fragment(1, 3, &msg(6000, 3), 2020).unwrap();
        let (_, out) = r.push(t0, frags[2].clone()).unwrap();
        assert_eq!(&out[..], &msg(6000, 3)[..]);
    }

    #[test]
    fn too_large_and_inconsistent_are_dropped() {
        let t0 = Instant::now();
        let mut r = Reassembler::new(ReassemblyConfig {
            max_message: 1000,
            ..cfg()
        });
        for f in fragment(1, 1, &msg(1500, 0), 520).unwrap() {
            assert!(r.push(t0, f).is_none());
        }
        assert_eq!(r.stats().too_large, 1);
        assert_eq!(r.held_bytes(), 0);
        let a = fragment(1, 2, &msg(900, 0), 520).unwrap();
        let b = fragment(1, 2, &msg(900, 0), 320).unwrap();
        assert!(r.push(t0, a[0].clone()).is_none());
        assert!(r.push(t0, b[1].clone()).is_none());
        assert_eq!(r.stats().inconsistent, 1);
    }

    #[test]
    fn old_ids_are_stale_and_a_new_session_resets() {
        let t0 = Instant::now();
        let mut r = Reassembler::new(cfg());
        let one = |s, id| fragment(s, id, b"x", 100).unwrap().remove(0);
        assert!(r.push(t0, one(1, DEDUP_WINDOW + 10)).is_some());
        assert!(r.push(t0, one(1, 10)).is_none());
        assert_eq!(r.stats().stale, 1);
        assert!(r.push(t0, one(1, 11)).is_some());
        assert!(r.push(t0, one(1, 11)).is_none());
        assert_eq!(r.stats().duplicates, 1);
        // The peer restarted: its ids start again at 1.
        assert!(r.push(t0, one(2, 1)).is_some());
        assert_eq!(r.stats().session_changes, 1);
    }

    proptest! {
        #[test]
        fn arbitrary_datagrams_never_panic(
            datagrams in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..80), 0..64),
            magic in any::<bool>(),
        ) {
            let t0 = Instant::now();
            let mut r = Reassembler::new(ReassemblyConfig { memory_cap: 2000, max_message: 500, ..cfg() });
            for (i, mut d) in datagrams.into_iter().enumerate() {
                if magic && d.len() >= 3 {
                    // Make most of them look like fragments, to reach the deeper paths.
                    d[0] = b'N';
                    d[1] = b'D';
                    d[2] = FRAG_VERSION;
                }
                let _ = FragHeader::parse(&d);
                if let Some((_, m)) = r.push(t0 + Duration::from_millis(i as u64), Bytes::from(d)) {
                    prop_assert!(m.len() <= 500);
                }
                prop_assert!(r.held_bytes() <= 2000 + 80 + 64);
            }
        }

        #[test]
        fn fragment_then_reassemble_round_trips(len in 0usize..5000, mtu in 21usize..1500, seed in any::<u64>()) {
            let m: Vec<u8> = (0..len).map(|i| (i as u64 ^ seed) as u8).collect();
            let mut frags = fragment(3, 1, &m, mtu).unwrap();
            // A deterministic shuffle.
            let n = frags.len();
            for i in 0..n {
                let j = (seed as usize).wrapping_add(i * 7919) % n;
                frags.swap(i, j);
            }
            let mut r = Reassembler::new(ReassemblyConfig { memory_cap: 1 << 24, ..cfg() });
            let mut out = None;
            for f in frags {
                prop_assert!(f.len() <= mtu);
                if let Some((_, m)) = r.push(Instant::now(), f) {
                    prop_assert!(out.is_none());
                    out = Some(m);
                }
            }
            prop_assert_eq!(out.as_deref(), Some(&m[..]));
        }
    }
}

//! The frame record of the NATS link: every data message carries one frame (packet/repr).
//!
//! ```text
//! off size (big-endian)
//!  0   2   stream id
//!  2   2   flags
//!  4   8   run id of the device side (a restarted device numbers its frames afresh)
//! 12   8   the JetStream stream sequence that run began after (0 without stored streams)
//! 20   8   sequence number
//! 28   8   timestamp, ns since the Unix epoch (source clock)
//! 36   8   subject sequence: 0, 1, 2 … per run on each subject (a receiver of stored frames
//!          puts them back in this order: [`Reorder`])
//! 44   …   payload (the frame after its stack, encrypted under the run's key: the group key
//!          and the two run fields, [`super::runs::run_key`])
//! ```

use bytes::{BufMut, Bytes, BytesMut};

/// The sequence number of a stream's END: an empty frame sealed like any other (so nobody
/// without the group key can forge one), after the stream's last frame.
pub const END_SEQ: u64 = u64::MAX;

/// Header length.
pub const HEADER_LEN: usize = 44;

/// A parsed record; the payload is a slice of the message (no copy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameRecord {
    /// Stream id.
    pub stream: u16,
    /// The sending run.
    pub run: u64,
    /// The JetStream stream sequence the run began after.
    pub began: u64,
    /// Sequence number.
    pub seq: u64,
    /// Source timestamp.
    pub timestamp_ns: u64,
    /// Flags.
    pub flags: u16,
    /// Position on its subject in this run.
    pub wseq: u64,
    /// The frame's bytes.
    pub payload: Bytes,
}

impl FrameRecord {
    /// Parses a message body; `None` when it is shorter than the header.
    pub fn parse(b: &Bytes) -> Option<FrameRecord> {
        let h = b.get(..HEADER_LEN)?;
        let u64_at = |o: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&h[o..o + 8]);
            u64::from_be_bytes(a)
        };
        Some(FrameRecord {
            stream: u16::from_be_bytes([h[0], h[1]]),
            flags: u16::from_be_bytes([h[2], h[3]]),
            run: u64_at(4),
            began: u64_at(12),
            seq: u64_at(20),
            timestamp_ns: u64_at(28),
            wseq: u64_at(36),
            payload: b.slice(HEADER_LEN..),
        })
    }

    /// The header alone, for a sender that puts it in front of a payload it already holds
    /// (in a frame's headroom: no copy of the payload).
    pub fn header(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        let mut b = &mut h[..];
        b.put_u16(self.stream);
        b.put_u16(self.flags);
        b.put_u64(self.run);
        b.put_u64(self.began);
        b.put_u64(self.seq);
        b.put_u64(self.timestamp_ns);
        b.put_u64(self.wseq);
        h
    }

    /// The device run the record names.
    pub fn device_run(&self) -> super::runs::Run {
        super::runs::Run {
            id: self.run,
            began: self.began,
        }
    }

    /// The message body.
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(HEADER_LEN + self.payload.len());
        b.put_slice(&self.header());
        b.put_slice(&self.payload);
        b.freeze()
    }
}

/// Puts the records of one subject back in their subject sequence (sans-IO): a frame the
/// server stored late (published again after a server restart, behind newer ones) waits for
/// nothing; the newer ones wait for it, at most `wait` (then the gap is given up, counted).
#[derive(Debug)]
pub struct Reorder {
    /// (run, next subject sequence expected).
    next: Option<(u64, u64)>,
    held: std::collections::BTreeMap<u64, FrameRecord>,
    since: Option<std::time::Instant>,
    wait: std::time::Duration,
    max: usize,
    /// Records never seen: gaps given up.
    pub skipped: u64,
}

impl Reorder {
    /// Holds at most `max` records for at most `wait` behind a gap.
    pub fn new(wait: std::time::Duration, max: usize) -> Reorder {
        Reorder {
            next: None,
            held: Default::default(),
            since: None,
            wait,
            max: max.max(1),
            skipped: 0,
        }
    }

    /// Takes a record; gives the records now in order (none while a gap is open). The first
    /// record, and the first of a new run, start the order.
    pub fn push(&mut self, rec: FrameRecord, now: std::time::Instant) -> Vec<FrameRecord> {
        match self.next {
            Some((run, n)) if run == rec.run => {
                if rec.wseq < n || self.held.contains_key(&rec.wseq) {
                    return Vec::new();
                }
                if rec.wseq > n {
                    self.held.insert(rec.wseq, rec);
                    self.since.get_or_insert(now);
                    if self.held.len() > self.max {
                        return self.skip();
                    }
                    return Vec::new();
                }
                self.next = Some((run, n + 1));
                let mut out = vec![rec];
                self.drain(&mut out);
                out
            }
            _ => {
                // A new run's frames: what the old one left waiting goes first.
                let mut out: Vec<FrameRecord> =
                    std::mem::take(&mut self.held).into_values().collect();
                self.next = Some((rec.run, rec.wseq + 1));
                out.push(rec);
                self.since = None;
                out
            }
        }
    }

    /// Gives up a gap held longer than `wait`.
    pub fn poll(&mut self, now: std::time::Instant) -> Vec<FrameRecord> {
        match self.since {
            Some(t) if now.saturating_duration_since(t) >= self.wait => self.skip(),
            _ => Vec::new(),
        }
    }

    /// Whether no record waits behind a gap.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    fn skip(&mut self) -> Vec<FrameRecord> {
        let (Some((run, n)), Some(&first)) = (self.next, self.held.keys().next()) else {
            return Vec::new();
        };
        self.skipped += first - n;
        self.next = Some((run, first));
        let mut out = Vec::new();
        self.drain(&mut out);
        out
    }

    fn drain(&mut self, out: &mut Vec<FrameRecord>) {
        while let Some((run, n)) = self.next {
            match self.held.remove(&n) {
                Some(r) => {
                    out.push(r);
                    self.next = Some((run, n + 1));
                }
                None => break,
            }
        }
        self.since = (!self.held.is_empty()).then(std::time::Instant::now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixture() {
        let r = FrameRecord {
            stream: 1,
            run: 5,
            began: 9,
            seq: 2,
            timestamp_ns: 3,
            flags: 4,
            wseq: 6,
            payload: Bytes::from_static(b"hi"),
        };
        let b = r.encode();
        assert_eq!(
            &b[..],
            &[
                0, 1, 0, 4, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 2,
                0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 6, b'h', b'i'
            ]
        );
        assert_eq!(FrameRecord::parse(&b), Some(r));
        assert_eq!(FrameRecord::parse(&b.slice(..43)), None);
    }

    fn rec(run: u64, wseq: u64) -> FrameRecord {
        FrameRecord {
            stream: 1,
            run,
            began: 0,
            seq: wseq,
            timestamp_ns: 0,
            flags: 0,
            wseq,
            payload: Bytes::new(),
        }
    }

    fn w(v: Vec<FrameRecord>) -> Vec<u64> {
        v.into_iter().map(|r| r.wseq).collect()
    }

    #[test]
    fn a_late_record_is_put_back_in_its_place_and_a_gap_is_given_up_in_time() {
        let t = std::time::Instant::now();
        let mut r = Reorder::new(std::time::Duration::from_secs(1), 100);
        assert_eq!(w(r.push(rec(1, 5), t)), vec![5]);
        assert_eq!(w(r.push(rec(1, 7), t)), Vec::<u64>::new());
        assert_eq!(w(r.push(rec(1, 8), t)), Vec::<u64>::new());
        assert_eq!(w(r.push(rec(1, 6), t)), vec![6, 7, 8]);
        assert_eq!(w(r.push(rec(1, 6), t)), Vec::<u64>::new(), "a copy");
        assert_eq!(w(r.push(rec(1, 10), t)), Vec::<u64>::new());
        assert!(r.poll(t + std::time::Duration::from_millis(10)).is_empty());
        assert_eq!(w(r.poll(t + std::time::Duration::from_secs(2))), vec![10]);
        assert_eq!(r.skipped, 1);
        // A new run starts afresh.
        assert_eq!(w(r.push(rec(2, 0), t)), vec![0]);
    }
}

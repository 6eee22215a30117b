//! The [`Checker`]: verifies a stream's order, completeness and (optionally) content, by the
//! rules in the `check` module's docs. Sans-IO and deterministic: feed it `(seq, payload)`
//! pairs with [`Checker::observe`] and read [`Checker::report`].

pub use crate::common::report::{CheckReport, MAX_LISTED_GAPS};
use crate::synthetic;
use std::collections::BTreeMap;

/// Open gaps remembered for recognising late frames; beyond this the lowest gap is settled as
/// missing and a frame that later fills it counts as a duplicate.
pub const MAX_TRACKED_GAPS: usize = 65_536;

/// How a frame fitted the sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// The first frame seen.
    First,
    /// The expected next seq.
    InOrder,
    /// Ahead of the expected seq; the inclusive range `from..=to` was skipped.
    Gap {
        /// First skipped seq.
        from: u64,
        /// Last skipped seq.
        to: u64,
    },
    /// Filled a gap late (or came before the lowest seq seen).
    Reordered,
    /// Its seq was already received.
    Duplicate,
}

/// What [`Checker::observe`] found about one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    /// Order verdict.
    pub order: Order,
    /// Content verdict (false when content is not checked).
    pub corrupt: bool,
}

/// Verifies order, completeness and content of a stream. See the module docs.
#[derive(Debug, Clone)]
pub struct Checker {
    seed: Option<u64>,
    size: Option<usize>,
    expect: Option<u64>,
    received: u64,
    /// (lowest, highest) seq seen.
    span: Option<(u64, u64)>,
    /// Open gaps: start -> inclusive end.
    open: BTreeMap<u64, u64>,
    /// Gaps evicted from `open` (settled as missing): how many, and the first listed ones.
    settled: Vec<(u64, u64)>,
    settled_count: u64,
    settled_missing: u64,
    duplicates: u64,
    reordered: u64,
    corrupt: u64,
}

impl Checker {
    /// A checker. `seed`: verify synthetic content; `size`: expected payload length;
    /// `expect`: expected number of frames.
    pub fn new(seed: Option<u64>, size: Option<usize>, expect: Option<u64>) -> Checker {
        Checker {
            seed,
            size,
            expect,
            received: 0,
            span: None,
            open: BTreeMap::new(),
            settled: Vec::new(),
            settled_count: 0,
            settled_missing: 0,
            duplicates: 0,
            reordered: 0,
            corrupt: 0,
        }
    }

    /// Records one frame.
    pub fn observe(&mut self, seq: u64, payload: &[u8]) -> Observation {
        self.received += 1;
        let corrupt = self.is_corrupt(seq, payload);
        if corrupt {
            self.corrupt += 1;
        }
        let order = self.order(seq);
        match order {
            Order::Reordered => self.reordered += 1,
            Order::Duplicate => self.duplicates += 1,
            _ => {}
        }
        Observation { order, corrupt }
    }

    fn is_corrupt(&self, seq: u64, payload: &[u8]) -> bool {
        if self.size.is_some_and(|s| s != payload.len()) {
            return true;
        }
        self.seed
            .is_some_and(|seed| !synthetic::verify(seed, seq, payload))
    }

    fn order(&mut self, seq: u64) -> Order {
        let Some((low, high)) = self.span else {
            self.span = Some((seq, seq));
            return Order::First;
        };
        if seq > high {
            self.span = Some((low, seq));
            if seq == high + 1 {
                return Order::InOrder;
            }
            self.open_gap(high + 1, seq - 1);
            return Order::Gap {
                from: high + 1,
                to: seq - 1,
            };
        }
        if seq < low {
            self.span = Some((seq, high));
            if seq + 1 < low {
                self.open_gap(seq + 1, low - 1);
            }
            return Order::Reordered;
        }
        // low <= seq <= high: inside an open gap, or already seen.
        let Some((&start, &end)) = self.open.range(..=seq).next_back() else {
            return Order::Duplicate;
        };
        if seq > end {
            return Order::Duplicate;
        }
        self.open.remove(&start);
        if start < seq {
            self.open.insert(start, seq - 1);
        }
        if seq < end {
            self.open.insert(seq + 1, end);
        }
        Order::Reordered
    }

    fn open_gap(&mut self, from: u64, to: u64) {
        self.open.insert(from, to);
        if self.open.len() > MAX_TRACKED_GAPS {
            if let Some((a, b)) = self.open.pop_first() {
                self.settled_count += 1;
                self.settled_missing += b - a + 1;
                if self.settled.len() < MAX_LISTED_GAPS {
                    self.settled.push((a, b));
                }
            }
        }
    }

    /// The report so far.
    pub fn report(&self) -> CheckReport {
        let mut gaps = self.settled.clone();
        gaps.extend(
            self.open
                .iter()
                .map(|(&a, &b)| (a, b))
                .take(MAX_LISTED_GAPS - gaps.len()),
        );
        // Settled gaps are the lowest ones, but a gap below them may have opened later.
        gaps.sort_unstable();
        CheckReport {
            received: self.received,
            first_seq: self.span.map(|s| s.0),
            last_seq: self.span.map(|s| s.1),
            gaps,
            gap_count: self.settled_count + self.open.len() as u64,
            missing: self.settled_missing + self.open.iter().map(|(&a, &b)| b - a + 1).sum::<u64>(),
            duplicates: self.duplicates,
            reordered: self.reordered,
            corrupt: self.corrupt,
            expect: self.expect,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synthetic::payload;

    fn run(seqs: &[u64]) -> CheckReport {
        let mut c = Checker::new(None, None, None);
        for &s in seqs {
            c.observe(s, b"");
        }
        c.report()
    }

    #[test]
    fn in_order_stream_is_ok() {
        let mut c = Checker::new(Some(9), Some(32), Some(1000));
        for s in 0..1000 {
            let o = c.observe(s, &payload(9, s, 32));
            assert!(!o.corrupt);
        }
        let r = c.report();
        assert!(r.is_ok(), "{r}");
        assert_eq!(
            r.to_string(),
            "check: 1000 frames, seq 0..=999, 0 missing, 0 duplicate, 0 reordered, 0 corrupt: OK"
        );
    }

    #[test]
    fn stream_may_start_anywhere() {
        let r = run(&[500, 501, 502]);
        assert!(r.is_ok());
        assert_eq!((r.first_seq, r.last_seq), (Some(500), Some(502)));
    }

    #[test]
    fn gaps_are_reported_as_inclusive_ranges() {
        let mut c = Checker::new(None, None, None);
        assert_eq!(c.observe(9, b"").order, Order::First);
        assert_eq!(c.observe(10, b"").order, Order::InOrder);
        assert_eq!(c.observe(13, b"").order, Order::Gap { from: 11, to: 12 });
        c.observe(20, b"");
        let r = c.report();
        assert_eq!(r.gaps, vec![(11, 12), (14, 19)]);
        assert_eq!((r.missing, r.gap_count), (8, 2));
        assert!(!r.is_ok());
        assert_eq!(
            r.to_string(),
            "check: 4 frames, seq 9..=20, 8 missing, 0 duplicate, 0 reordered, 0 corrupt: \
             FAILED (missing 11..=12, 14..=19)"
        );
    }

    #[test]
    fn duplicates_are_counted() {
        let mut c = Checker::new(None, None, None);
        for s in [0, 1, 1, 2, 0] {
            c.observe(s, b"");
        }
        let r = c.report();
        assert_eq!((r.duplicates, r.missing, r.reordered), (2, 0, 0));
        assert!(r.to_string().ends_with("FAILED (2 duplicate)"), "{r}");
    }

    #[test]
    fn late_frames_are_reordered_and_fill_their_gap() {
        let mut c = Checker::new(None, None, None);
        for s in [0, 1, 4, 2, 5] {
            c.observe(s, b"");
        }
        assert_eq!(c.observe(3, b"").order, Order::Reordered);
        assert_eq!(c.observe(3, b"").order, Order::Duplicate);
        let r = c.report();
        assert_eq!((r.reordered, r.missing, r.duplicates), (2, 0, 1));
        assert!(r.gaps.is_empty());
    }

    #[test]
    fn frame_below_the_first_is_reordered_and_opens_a_gap() {
        let r = run(&[10, 11, 7]);
        assert_eq!((r.first_seq, r.last_seq), (Some(7), Some(11)));
        assert_eq!(r.reordered, 1);
        assert_eq!(r.gaps, vec![(8, 9)]);
        let r = run(&[10, 9]);
        assert_eq!((r.reordered, r.missing), (1, 0));
    }

    #[test]
    fn filling_the_middle_of_a_gap_splits_it() {
        let r = run(&[0, 10, 5]);
        assert_eq!(r.gaps, vec![(1, 4), (6, 9)]);
        assert_eq!(r.missing, 8);
    }

    #[test]
    fn corrupt_content_and_wrong_length_are_counted() {
        let mut c = Checker::new(Some(1), Some(8), None);
        let mut bad = payload(1, 1, 8);
        bad[0] ^= 1;
        assert!(!c.observe(0, &payload(1, 0, 8)).corrupt);
        assert!(c.observe(1, &bad).corrupt);
        assert!(c.observe(2, &payload(1, 2, 7)).corrupt, "short frame");
        assert!(c.observe(3, &payload(2, 3, 8)).corrupt, "other seed");
        let r = c.report();
        assert_eq!((r.corrupt, r.missing), (3, 0));
        assert!(r.to_string().ends_with("FAILED (3 corrupt)"), "{r}");

        // Without a size, the payload's own length is used.
        let mut c = Checker::new(Some(1), None, None);
        assert!(!c.observe(0, &payload(1, 0, 5)).corrupt);
        assert!(!c.observe(1, &payload(1, 1, 50)).corrupt);
        // Without a seed, only the length is checked.
        let mut c = Checker::new(None, Some(4), None);
        assert!(!c.observe(0, b"abcd").corrupt);
        assert!(c.observe(1, b"abc").corrupt);
    }

    #[test]
    fn expect_mismatch_fails() {
        let mut c = Checker::new(None, None, Some(5));
        for s in 0..4 {
            c.observe(s, b"");
        }
        let r = c.report();
        assert!(!r.is_ok());
        assert!(
            r.to_string().ends_with("FAILED (expected 5 frames, got 4)"),
            "{r}"
        );
        c.observe(4, b"");
        assert!(c.report().is_ok());
        let r = Checker::new(None, None, Some(1)).report();
        assert_eq!(
            r.to_string(),
            "check: 0 frames, no seq, 0 missing, 0 duplicate, 0 reordered, 0 corrupt: \
             FAILED (expected 1 frames, got 0)"
        );
        assert!(Checker::new(None, None, None).report().is_ok());
    }

    #[test]
    fn gap_list_is_capped_but_all_are_counted() {
        let seqs: Vec<u64> = (0..300).map(|i| i * 2).collect();
        let r = run(&seqs);
        assert_eq!(r.gaps.len(), MAX_LISTED_GAPS);
        assert_eq!((r.gap_count, r.missing), (299, 299));
        assert_eq!(r.gaps[0], (1, 1));
        assert!(r.to_string().contains("and 294 more ranges"), "{r}");
    }

    #[test]
    fn extreme_seqs_do_not_overflow() {
        let r = run(&[u64::MAX, 0, u64::MAX, 1, u64::MAX - 1]);
        assert_eq!((r.first_seq, r.last_seq), (Some(0), Some(u64::MAX)));
        assert_eq!(r.missing, u64::MAX - 3);
        assert_eq!(r.duplicates, 1);
    }
}

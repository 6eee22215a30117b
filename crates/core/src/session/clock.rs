//! The clock-offset estimate from PING/PONG: a minimum-RTT filter over recent samples.
//!
//! A PONG that waited behind bulk data in either direction has a long round trip and an
//! offset skewed by up to half of it; the sample with the shortest round trip is the one
//! least disturbed by queueing (NTP's clock filter does the same). Only the last
//! [`WINDOW`] samples compete, so the estimate follows a slowly drifting clock.

use std::collections::VecDeque;

/// How many recent samples the filter picks from.
pub const WINDOW: usize = 32;

/// One PING/PONG exchange: the peer's clock minus ours, and the round trip it came with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockSample {
    /// Offset, peer − local, in ns.
    pub offset_ns: i64,
    /// Round trip, in ns, without the peer's own turnaround time.
    pub rtt_ns: u64,
}

/// Recent samples and the best of them.
#[derive(Debug, Default, Clone)]
pub struct ClockFilter {
    recent: VecDeque<ClockSample>,
}

impl ClockFilter {
    /// Adds an exchange: PING sent at `t1` (ours), received at `t2` (theirs), PONG sent at
    /// `t3` (theirs), received at `t4` (ours); returns it.
    pub fn sample(&mut self, t1: u64, t2: u64, t3: u64, t4: u64) -> ClockSample {
        let (offset_ns, rtt_ns) = ndd_wire::clock_offset_ns(t1, t2, t3, t4);
        if self.recent.len() == WINDOW {
            self.recent.pop_front();
        }
        let s = ClockSample { offset_ns, rtt_ns };
        self.recent.push_back(s);
        s
    }

    /// The sample with the smallest round trip among the recent ones (the latest on a tie).
    pub fn best(&self) -> Option<ClockSample> {
        self.recent
            .iter()
            .copied()
            .reduce(|a, b| if b.rtt_ns <= a.rtt_ns { b } else { a })
    }

    /// A peer timestamp moved to our clock (unchanged before the first sample).
    pub fn to_local(&self, peer_ns: u64) -> u64 {
        match self.best() {
            Some(s) => (i128::from(peer_ns) - i128::from(s.offset_ns)).max(0) as u64,
            None => peer_ns,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shortest_round_trip_wins_over_queued_samples() {
        let mut f = ClockFilter::default();
        // True offset +1 ms. Clean exchange: 100 µs each way.
        f.sample(0, 1_100_000, 1_100_000, 200_000);
        // A PONG that waited 50 ms behind bulk data on the way back: offset off by 25 ms.
        f.sample(10_000_000, 11_100_000, 11_100_000, 60_200_000);
        let best = f.best().unwrap();
        assert_eq!(best.rtt_ns, 200_000);
        assert_eq!(best.offset_ns, 1_000_000);
        assert_eq!(f.to_local(5_000_000), 4_000_000);
    }

    #[test]
    fn old_samples_leave_the_window() {
        let mut f = ClockFilter::default();
        f.sample(0, 1_000_000, 1_000_000, 10); // rtt 10 ns, offset ~1 ms
        for i in 0..WINDOW as u64 {
            let t1 = 1_000_000_000 * (i + 1);
            // offset 2 ms, rtt 1 ms
            f.sample(t1, t1 + 2_500_000, t1 + 2_500_000, t1 + 1_000_000);
        }
        let best = f.best().unwrap();
        assert_eq!(best.rtt_ns, 1_000_000);
        assert_eq!(best.offset_ns, 2_000_000);
    }

    #[test]
    fn no_sample_leaves_timestamps_alone() {
        assert_eq!(ClockFilter::default().to_local(42), 42);
        assert_eq!(ClockFilter::default().best(), None);
    }
}

//! [`PathRate`]: what a path carries (bottleneck rate and round trip) and how much a sender may
//! have in flight on it, estimated from its own sends and acknowledgements, sans-IO.
//!
//! The model is BBR's (Cardwell et al., "BBR: Congestion-Based Congestion Control", 2016):
//!
//! - every acknowledgement gives a **delivery-rate sample**: the bytes acknowledged between
//!   the send of what is acknowledged now and now, over the longer of the send interval and the
//!   acknowledgement interval ([`PathRate::on_ack`]); the **bottleneck rate** is the largest
//!   sample of the last [`BW_ROUNDS`] round trips (at least [`BW_MIN_WINDOW`]); the **round
//!   trip** is the smallest send → acknowledgement time of the last [`RTT_WINDOW`];
//! - a sample taken while the sender had less than half its window in flight is
//!   **app-limited**: it measures the sender, not the path, so it may raise the rate, never
//!   lower it (a display at 5 fps says nothing about a 1 Gbit/s path);
//! - the **window** is `gain` × rate × round trip, plus one message (a sender of whole frames
//!   needs room for the next one). In **Startup** the gain is 2: the window doubles every
//!   round trip while the samples keep growing, so any path is found in about log2(path /
//!   start) round trips; once three rounds in a row grew the rate by less than 25 %, the path
//!   is full (or sooner, once a round trip shows a queue half the path's own round trip
//!   long), and the estimator moves to **ProbeBw**, which cycles the gain through 1.25 and
//!   three rounds of 1: every four round trips it puts a quarter more in flight, and if the
//!   path carries more (a link that got faster, a competing flow that left) the samples show
//!   it and the window follows. So the estimate never stays locked under what the path
//!   carries while the sender has data to send: the defect this replaces (the `image` pair's
//!   own estimate, which only measured what it had itself sent) held a 20 Mbit/s path at
//!   0.3 Mbit/s and a 1 Gbit/s, 240 ms path at 28 Mbit/s.
//!
//! The caller keeps, for every message in flight, the [`SendState`] that [`PathRate::on_send`]
//! returned, and hands it back with the acknowledgement. Time comes in as `now`; nothing here
//! reads a clock.

use std::time::{Duration, Instant};

/// The bottleneck rate is the largest sample of this many round trips…
pub const BW_ROUNDS: u32 = 10;
/// …and of at least this long (a ProbeBw cycle must fit in it).
pub const BW_MIN_WINDOW: Duration = Duration::from_secs(2);
/// How long a round-trip sample counts.
pub const RTT_WINDOW: Duration = Duration::from_secs(10);
/// The window's gain while the path is being found.
pub const STARTUP_GAIN: f64 = 2.0;
/// Startup ends after this many rounds in a row without [`FULL_BW_GROWTH`].
pub const FULL_BW_ROUNDS: u32 = 3;
/// Growth of the rate over a round that counts as "still growing".
pub const FULL_BW_GROWTH: f64 = 1.25;
/// Startup ends when a round trip exceeds the path's by half, and by at least this.
pub const STARTUP_QUEUE: Duration = Duration::from_millis(10);
/// A probe that finds this much more than the rate before it starts Startup again.
pub const PROBE_FOUND: f64 = 1.15;
/// ProbeBw's gain cycle, a phase a round trip long. (BBR has a 0.75 phase after the probe,
/// and a Drain phase after Startup, to drain the queue its pacing at gain 1 would keep; here
/// the window alone bounds what is in flight, queued bytes included, so back at gain 1 the
/// queue drains by itself, and a source that is slower than the path is never held back.)
pub const PROBE_GAINS: [f64; 4] = [1.25, 1.0, 1.0, 1.0];

/// Where the estimator is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Finding the path: the window doubles every round trip.
    Startup,
    /// The path is full: probing upward one round in four.
    ProbeBw,
}

/// What the estimator knew when a message was sent; handed back with its acknowledgement.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SendState {
    /// When the message went.
    pub sent_at: Instant,
    delivered: u64,
    delivered_at: Instant,
    first_sent_at: Instant,
    app_limited: bool,
}

/// See the module docs.
#[derive(Debug, Clone)]
pub struct PathRate {
    /// Bytes acknowledged so far, and when the last acknowledgement came.
    delivered: u64,
    delivered_at: Option<Instant>,
    /// Send time of the message acknowledged last.
    first_sent_at: Option<Instant>,
    /// Rate samples (when, bytes per second) within the window, each smaller than the one
    /// before it (a sliding-window maximum: the front is the largest).
    samples: std::collections::VecDeque<(Instant, f64)>,
    min_rtt: Option<(Duration, Instant)>,
    /// A round ends when a message sent after it began is acknowledged: when what was
    /// delivered at its send reaches this.
    round_ends_at_delivered: u64,
    /// The quickest path-limited round trip of the current round.
    round_min_rtt: Option<Duration>,
    phase: Phase,
    full_bw: f64,
    full_bw_rounds: u32,
    /// The rate when the last probe started.
    probe_base: f64,
    cycle: usize,
    cycle_start: Option<Instant>,
}

impl Default for PathRate {
    fn default() -> Self {
        PathRate::new()
    }
}

impl PathRate {
    /// Nothing known yet: the caller sends its first messages on a window of its own.
    pub fn new() -> PathRate {
        PathRate {
            delivered: 0,
            delivered_at: None,
            first_sent_at: None,
            samples: Default::default(),
            min_rtt: None,
            round_ends_at_delivered: 0,
            round_min_rtt: None,
            phase: Phase::Startup,
            full_bw: 0.0,
            full_bw_rounds: 0,
            probe_base: 0.0,
            cycle: 0,
            cycle_start: None,
        }
    }

    /// The bottleneck rate, bytes per second, once measured.
    pub fn rate(&self) -> Option<f64> {
        self.samples.front().map(|s| s.1)
    }

    /// The path's round trip (the smallest send → acknowledgement time lately), once measured.
    pub fn min_rtt(&self) -> Option<Duration> {
        self.min_rtt.map(|m| m.0)
    }

    /// Startup or ProbeBw.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The window's gain now.
    pub fn gain(&self) -> f64 {
        match self.phase {
            Phase::Startup => STARTUP_GAIN,
            Phase::ProbeBw => PROBE_GAINS[self.cycle],
        }
    }

    /// Bytes the sender may have in flight: gain × rate × round trip + `message` (the size of
    /// the message it would send next), or `None` before the first sample (the caller's
    /// initial window then applies).
    pub fn window(&self, message: u64) -> Option<u64> {
        let (rate, rtt) = (self.rate()?, self.min_rtt()?);
        Some((self.gain() * rate * rtt.as_secs_f64()) as u64 + message)
    }

    /// A message goes out with `in_flight` bytes already in flight (not counting it): what to
    /// keep for its acknowledgement. It is app-limited when less than half the window is in
    /// flight with it (`bytes` included): the sender, not the path, set the pace.
    pub fn on_send(&mut self, now: Instant, in_flight: u64, bytes: u64) -> SendState {
        if in_flight == 0 {
            // Nothing in flight: the intervals start now (BBR's reset on an idle restart).
            self.delivered_at = Some(now);
            self.first_sent_at = Some(now);
        }
        let app_limited = self
            .window(bytes)
            .is_some_and(|w| (in_flight + bytes) * 2 < w);
        SendState {
            sent_at: now,
            delivered: self.delivered,
            delivered_at: self.delivered_at.unwrap_or(now),
            first_sent_at: self.first_sent_at.unwrap_or(now),
            app_limited,
        }
    }

    /// `bytes` sent with `sent` were acknowledged.
    pub fn on_ack(&mut self, now: Instant, bytes: u64, sent: &SendState) {
        self.delivered += bytes;
        self.delivered_at = Some(now);
        self.first_sent_at = Some(sent.sent_at);
        let rtt = now.saturating_duration_since(sent.sent_at);
        self.min_rtt = match self.min_rtt {
            Some((m, at)) if m <= rtt && now < at + RTT_WINDOW => Some((m, at)),
            _ => Some((rtt, now)),
        };
        if !sent.app_limited {
            self.round_min_rtt = Some(self.round_min_rtt.map_or(rtt, |m| m.min(rtt)));
        }
        // A round ends when something sent after it began is acknowledged.
        if sent.delivered >= self.round_ends_at_delivered {
            self.round_ends_at_delivered = self.delivered;
            // Startup also ends when the queue it builds shows: even the quickest round trip
            // of a whole round is half again the path's own, and at least 10 ms more. (The
            // quickest, not each: a window that just grew goes out as a burst, and its last
            // messages queue behind its first on a path that is not yet full.) A display's
            // frames then do not wait behind a round trip of earlier ones before the rate's
            // plateau is seen.
            let queued = self
                .round_min_rtt
                .take()
                .zip(self.min_rtt())
                .is_some_and(|(quickest, min)| quickest > min + (min / 2).max(STARTUP_QUEUE));
            if self.phase == Phase::Startup && queued && self.rate().is_some() {
                self.start_probing(now);
            } else {
                self.on_round_end(now);
            }
        }
        let send_elapsed = sent.sent_at.saturating_duration_since(sent.first_sent_at);
        let ack_elapsed = now.saturating_duration_since(sent.delivered_at);
        let interval = send_elapsed.max(ack_elapsed);
        if !interval.is_zero() {
            let sample = (self.delivered - sent.delivered) as f64 / interval.as_secs_f64();
            // An app-limited sample shows the path only when it beats what is known.
            if !sent.app_limited || self.rate().is_none_or(|r| sample > r) {
                while self.samples.back().is_some_and(|s| s.1 <= sample) {
                    self.samples.pop_back();
                }
                self.samples.push_back((now, sample));
            }
        }
        let window = self
            .min_rtt()
            .map_or(BW_MIN_WINDOW, |r| (r * BW_ROUNDS).max(BW_MIN_WINDOW));
        // Keep the newest sample even when old: a sender that paused keeps its estimate.
        while self.samples.len() > 1 && self.samples.front().is_some_and(|s| s.0 + window < now) {
            self.samples.pop_front();
        }
        self.advance_cycle(now);
    }

    fn on_round_end(&mut self, now: Instant) {
        let Some(rate) = self.rate() else {
            return;
        };
        if self.phase == Phase::ProbeBw {
            // A probe found more than the rate before it: the path got faster (a link that
            // sped up, a flow that left). Find it as at the start, doubling per round, not a
            // quarter per cycle.
            if rate >= self.probe_base * PROBE_FOUND {
                self.phase = Phase::Startup;
                self.full_bw = rate;
                self.full_bw_rounds = 0;
            }
            return;
        }
        if rate >= self.full_bw * FULL_BW_GROWTH {
            self.full_bw = rate;
            self.full_bw_rounds = 0;
        } else {
            self.full_bw_rounds += 1;
            if self.full_bw_rounds >= FULL_BW_ROUNDS {
                self.start_probing(now);
            }
        }
    }

    fn advance_cycle(&mut self, now: Instant) {
        if self.phase == Phase::Startup {
            return;
        }
        let phase_len = self.min_rtt().unwrap_or(Duration::from_millis(10));
        let start = *self.cycle_start.get_or_insert(now);
        if now >= start + phase_len.max(Duration::from_millis(1)) {
            self.cycle = (self.cycle + 1) % PROBE_GAINS.len();
            self.cycle_start = Some(now);
            if self.cycle == 0 {
                // A probe starts: what it finds is measured against the rate now.
                self.probe_base = self.rate().unwrap_or(0.0);
            }
        }
    }

    /// Startup is over: ProbeBw, on a level phase first (the queue Startup built drains at
    /// gain 1).
    fn start_probing(&mut self, now: Instant) {
        self.full_bw = self.rate().unwrap_or(0.0);
        self.probe_base = self.full_bw;
        self.phase = Phase::ProbeBw;
        self.cycle = 1;
        self.cycle_start = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sender that keeps the window full of `size`-byte messages on a path of `bps` bytes a
    /// second and `rtt`; `every`: a message is offered at most this often (app-limited below
    /// the path). Returns the estimator and the bytes acknowledged in the last second.
    fn run(bps: f64, rtt: Duration, size: u64, every: Duration, secs: u64) -> (PathRate, f64) {
        let t0 = Instant::now();
        let mut p = PathRate::new();
        let mut flight: std::collections::VecDeque<(Instant, u64, SendState)> = Default::default();
        let (mut in_flight, mut link_free, mut next_offer) = (0u64, t0, t0);
        let mut last_second = 0.0;
        let end = t0 + Duration::from_secs(secs);
        let mut now = t0;
        while now < end {
            while flight.front().is_some_and(|f| f.0 <= now) {
                let Some((_, n, s)) = flight.pop_front() else {
                    break;
                };
                in_flight -= n;
                p.on_ack(now, n, &s);
                if now + Duration::from_secs(1) >= end {
                    last_second += n as f64;
                }
            }
            while now >= next_offer && in_flight < p.window(size).unwrap_or(2 * size) {
                let s = p.on_send(now, in_flight, size);
                let start = link_free.max(now);
                link_free = start + Duration::from_secs_f64(size as f64 / bps);
                flight.push_back((link_free + rtt, size, s));
                in_flight += size;
                next_offer = now + every;
            }
            now += Duration::from_micros(250);
        }
        (p, last_second)
    }

    #[test]
    fn startup_finds_a_long_fat_path_then_probes() {
        // 1 Gbit/s, 240 ms: the old image estimate sat at 28 Mbit/s here.
        let (p, got) = run(
            125e6,
            Duration::from_millis(240),
            64 << 10,
            Duration::ZERO,
            8,
        );
        let rate = p.rate().unwrap();
        assert!((0.9 * 125e6..=1.1 * 125e6).contains(&rate), "rate {rate}");
        assert!(got >= 0.8 * 125e6, "delivered {got} in the last second");
        assert_eq!(p.phase(), Phase::ProbeBw);
        let rtt = p.min_rtt().unwrap();
        assert!(
            rtt >= Duration::from_millis(240) && rtt < Duration::from_millis(245),
            "{rtt:?}"
        );
    }

    #[test]
    fn an_app_limited_sender_does_not_lower_the_rate() {
        // A path of 100 MB/s, learned by a bulk phase; then 1 kB every 10 ms: the rate stays.
        let (mut p, _) = run(
            100e6,
            Duration::from_millis(10),
            64 << 10,
            Duration::ZERO,
            2,
        );
        let before = p.rate().unwrap();
        let mut t = Instant::now() + Duration::from_secs(3);
        for _ in 0..300 {
            let s = p.on_send(t, 0, 1000);
            t += Duration::from_millis(10);
            p.on_ack(t, 1000, &s);
            t += Duration::from_millis(1);
        }
        let after = p.rate().unwrap();
        assert!(after >= 0.9 * before, "{before} -> {after}");
    }
}

//! How many bytes a reliable source stream may have written and not yet acknowledged: twice
//! what the path delivers in a round trip (its bandwidth-delay product), at least `min`, at
//! most the resume buffer. What the path delivers comes from the core's one path estimator,
//! [`PathRate`] (BBR's model: delivery-rate samples over each frame's send → ACK, a
//! sliding-window maximum, app-limited samples that only raise it, Startup and ProbeBw), the
//! same one the `image` pair paces a display by; the round trip is the session's PING/PONG
//! floor since the link came up (see `Session::flight_window`).
//!
//! Why: a TCP-like link delivers in order, so whatever a bulk stream has in the pipe (socket
//! buffers, the peer's read queue) is ahead of the next small frame of any other stream. With
//! the resume buffer (16 MiB) as the only bound, an input event waited behind up to 16 MiB of
//! display frames; bounded at about two round trips' worth, it waits at most that long, while
//! the bulk stream still fills the path. The gain of 2 (BBR's congestion-window gain) covers
//! the path's own variation and the peer's ACK timer; its ACK holding comes on top: it ACKs
//! every `ack_bytes` it takes in (or every `ack_every`), so up to `ack_bytes` more is in flight
//! than the path holds — on a short fast path a large part of the window.

use crate::pathrate::{PathRate, SendState};
use std::time::{Duration, Instant};

/// The floor of the window is at most what the path delivers in this time…
const FLOOR_TIME: Duration = Duration::from_millis(10);
/// …and at least this.
const FLOOR_BYTES: usize = 64 << 10;
/// While a more urgent stream is live (see `Session::window_for`), the floor is what the path
/// delivers in this time instead (at least [`FLOOR_BYTES`]): a small frame of that stream then
/// waits behind about this much of the bulk stream's bytes, not behind 2 MiB.
const BESIDE_URGENT_TIME: Duration = Duration::from_micros(200);
/// The window is this many times the bandwidth-delay product.
const GAIN: f64 = 2.0;

/// The window of the session's reliable source streams, from the path's estimate.
#[derive(Debug, Clone)]
pub(crate) struct Flight {
    min: usize,
    max: usize,
    /// What the peer may take in before it ACKs (its `ack_bytes`): in flight on top of the
    /// path's share, or a short path's window waits for ACKs the peer holds back.
    ack: usize,
    path: PathRate,
}

impl Flight {
    /// A window of at least `min` (less on a slow path) and at most `max` bytes, for a peer
    /// that ACKs every `ack` bytes it takes in (or every `ack_every`, fewer).
    pub(crate) fn new(min: usize, max: usize, ack: usize) -> Flight {
        Flight {
            min: min.min(max),
            max,
            ack,
            path: PathRate::new(),
        }
    }

    /// A reliable frame of `bytes` starts going out (its first byte is written now) with
    /// `in_flight` bytes of the session's reliable frames written and not yet acknowledged
    /// before it: what to keep for its ACK. A frame written while nothing is in flight
    /// measures the path on its own (bytes over its send → ACK time): how a paced stream, one
    /// frame at a time, learns what the path could carry, not its own pace (before the
    /// estimator kept this apart, a 1 MB frame every 20 ms on a path of GB/s was cut into
    /// chunks of 1 ms of 50 MB/s).
    pub(crate) fn on_write(&mut self, now: Instant, in_flight: usize, bytes: usize) -> SendState {
        self.path.on_send(now, in_flight as u64, bytes as u64)
    }

    /// The peer acknowledged a frame of `bytes` sent with `sent`.
    pub(crate) fn on_acked(&mut self, now: Instant, bytes: usize, sent: &SendState) {
        self.path.on_ack(now, bytes as u64, sent);
    }

    /// The delivery rate of the path, bytes per second (0 before any ACK).
    pub(crate) fn rate(&self) -> f64 {
        self.path.rate().unwrap_or(0.0)
    }

    /// The estimator itself (its phase and round trip, for stats and tests).
    #[cfg(test)]
    pub(crate) fn path(&self) -> &PathRate {
        &self.path
    }

    /// The window for a path with round trip `rtt` (the session's PING/PONG floor; none yet:
    /// the floor alone, as the estimator's own send → ACK times include the peer's ACK
    /// delay): twice the bandwidth-delay product, at least the floor, at most the
    /// resume buffer. The floor is `min`, or less on a slow path: what the path delivers in
    /// [`FLOOR_TIME`] (at least [`FLOOR_BYTES`]), so on a 20 Mbit/s link a small frame does
    /// not wait behind `min` bytes (0.8 s there) when the bandwidth-delay product is far
    /// smaller. Before any ACK the floor is [`FLOOR_BYTES`]; in Startup the samples double
    /// the rate every round trip while the ACKs keep up, and the window with it.
    pub(crate) fn limit(&self, rtt: Option<Duration>) -> usize {
        self.limit_with(rtt, FLOOR_TIME)
    }

    /// The window of a stream that a more urgent live stream shares the path with: the same
    /// twice the bandwidth-delay product, with a floor of [`BESIDE_URGENT_TIME`] of the path
    /// (on loopback or a LAN, where the floor is the window, 2 MiB is 0.7–17 ms of queue).
    pub(crate) fn limit_beside_urgent(&self, rtt: Option<Duration>) -> usize {
        self.limit_with(rtt, BESIDE_URGENT_TIME)
    }

    fn limit_with(&self, rtt: Option<Duration>, floor_time: Duration) -> usize {
        let rate = self.rate();
        let bdp = rtt.map_or(0.0, |r| rate * r.as_secs_f64());
        let floor = ((rate * floor_time.as_secs_f64()) as usize)
            .max(FLOOR_BYTES)
            .min(self.min);
        // The gain covers the path's own variation; the peer's ACK holding comes on top: it
        // ACKs every `ack` bytes (or on its timer, fewer), so up to that much more is in
        // flight than the path holds. Without it a short path (58 Mbit/s, 8 ms: 2 × BDP of
        // 116 KB beside 32 KB held) settled at 60 % (found by `testkit/tests/session_rate.rs`,
        // 1 schedule in 10 000).
        // (Before any estimate the floor alone.)
        let held = if bdp > 0.0 { self.ack } else { 0 };
        ((GAIN * bdp) as usize + held).clamp(floor, self.max.max(floor))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A path of `rate` bytes/s and round trip `rtt`, driven by a sender that keeps its
    /// window full: returns (the window at the end, the throughput over the last second).
    fn run(rate: f64, rtt: Duration, secs: u64) -> (usize, f64) {
        let mut f = Flight::new(2 << 20, 64 << 20, 32 << 10);
        let t0 = Instant::now();
        let step = Duration::from_micros(500);
        // Frames in flight, each with the time its ACK comes back and its send state.
        let mut flight: std::collections::VecDeque<(Instant, usize, SendState)> =
            Default::default();
        let (mut in_flight, mut link_free) = (0usize, t0);
        let mut delivered_last_second = 0usize;
        let end = t0 + Duration::from_secs(secs);
        let mut now = t0;
        while now < end {
            while flight.front().is_some_and(|(t, _, _)| *t <= now) {
                let Some((_, n, sent)) = flight.pop_front() else {
                    break;
                };
                in_flight -= n;
                f.on_acked(now, n, &sent);
                if now + Duration::from_secs(1) >= end {
                    delivered_last_second += n;
                }
            }
            // The sender writes 64 KiB frames while the window allows; the link serialises
            // them at `rate`, the ACK comes back half a round trip after the far end got it.
            while in_flight < f.limit(Some(rtt)) {
                let n = 64 << 10;
                let sent = f.on_write(now, in_flight, n);
                let start = link_free.max(now);
                let arrive = start + Duration::from_secs_f64(n as f64 / rate) + rtt / 2;
                link_free = start + Duration::from_secs_f64(n as f64 / rate);
                flight.push_back((arrive + rtt / 2, n, sent));
                in_flight += n;
            }
            now += step;
        }
        (f.limit(Some(rtt)), delivered_last_second as f64)
    }

    #[test]
    fn the_window_fills_a_long_fat_path_and_stays_small_on_a_short_one() {
        // 100 MB/s at 50 ms: the BDP is 5 MB; the path is kept full.
        let (w, got) = run(100e6, Duration::from_millis(50), 4);
        assert!((5_000_000..=13_000_000).contains(&w), "window {w}");
        assert!(got >= 0.9 * 100e6, "throughput {got}");
        // 1 GB/s at 0.1 ms (loopback): the BDP is 100 kB, the window stays at its 2 MiB
        // minimum, and that still fills the path.
        let (w, got) = run(1e9, Duration::from_micros(100), 2);
        assert_eq!(w, 2 << 20);
        assert!(got >= 0.9 * 1e9, "throughput {got}");
    }

    #[test]
    fn a_slow_path_gets_a_window_of_its_own_size_not_the_minimum() {
        // 2.5 MB/s (20 Mbit/s) at 50 ms: the BDP is 125 kB; the window stays near twice
        // that, far below the 2 MiB minimum (0.8 s of this link), and fills the path.
        let (w, got) = run(2.5e6, Duration::from_millis(50), 6);
        assert!((125_000..=600_000).contains(&w), "window {w}");
        assert!(got >= 0.9 * 2.5e6, "throughput {got}");
    }

    #[test]
    fn a_paced_stream_learns_the_path_not_its_own_pace() {
        // 1 MB every 20 ms (50 MB/s) on a path of 1 GB/s with a 0.1 ms round trip: each frame
        // goes alone and is acknowledged 1.1 ms after its first byte.
        let t0 = Instant::now();
        let mut f = Flight::new(2 << 20, 64 << 20, 32 << 10);
        for k in 0..50u32 {
            let at = t0 + Duration::from_millis(20) * k;
            let sent = f.on_write(at, 0, 1_000_000);
            f.on_acked(at + Duration::from_micros(1100), 1_000_000, &sent);
        }
        assert!((0.85e9..=0.95e9).contains(&f.rate()), "{}", f.rate());
        // A stream that keeps its window full measures the path: when that slows to 100 MB/s
        // (ten 1 MB frames in flight, one acknowledged every 10 ms), the rate follows once
        // the faster samples have aged out of the estimator's window (2 s).
        let t1 = t0 + Duration::from_secs(2);
        let mut sent = std::collections::VecDeque::new();
        for k in 0..310u32 {
            let at = t1 + Duration::from_millis(10) * k;
            if k >= 10 {
                if let Some(s) = sent.pop_front() {
                    f.on_acked(at, 1_000_000, &s);
                }
            }
            sent.push_back(f.on_write(at, 10_000_000, 1_000_000));
        }
        assert!((95e6..=110e6).contains(&f.rate()), "{}", f.rate());
    }

    #[test]
    fn without_acks_it_starts_small_and_never_exceeds_the_resume_buffer() {
        let f = Flight::new(2 << 20, 16 << 20, 32 << 10);
        assert_eq!(f.limit(None), FLOOR_BYTES);
        assert_eq!(f.limit(Some(Duration::from_millis(100))), FLOOR_BYTES);
        // Never above the resume buffer.
        let mut f = Flight::new(2 << 20, 4 << 20, 32 << 10);
        let t = Instant::now();
        let sent = f.on_write(t, 0, 100 << 20);
        f.on_acked(t + Duration::from_millis(20), 100 << 20, &sent);
        assert_eq!(f.limit(Some(Duration::from_secs(1))), 4 << 20);
        assert_eq!(f.path().min_rtt(), Some(Duration::from_millis(20)));
    }
}

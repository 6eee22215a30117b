//! A one-way simulated network link.

use crate::rng::SimRng;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

/// How a simulated link misbehaves. All randomness is drawn from the link's seeded RNG.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkConfig {
    /// Fixed one-way delay.
    pub delay: Duration,
    /// Extra delay drawn uniformly from `[0, jitter]` per item (as netem's jitter).
    pub jitter: Duration,
    /// Probability an item is lost.
    pub loss: f64,
    /// TCP-like: items arrive in the order sent (a late item holds back the ones behind it).
    /// Otherwise each item arrives when its own delay says (jitter reorders them).
    pub in_order: bool,
    /// Probability an item is duplicated (datagram links only).
    pub duplicate: f64,
    /// Probability one random bit of an item is flipped (needs a corruptor, see
    /// [`SimLink::send_with`]).
    pub corrupt: f64,
    /// Bits per second; `None` for infinite. Items queue behind each other at the sender.
    pub bandwidth_bps: Option<u64>,
}

impl Default for LinkConfig {
    fn default() -> Self {
        LinkConfig {
            delay: Duration::from_millis(1),
            jitter: Duration::ZERO,
            loss: 0.0,
            in_order: true,
            duplicate: 0.0,
            corrupt: 0.0,
            bandwidth_bps: None,
        }
    }
}

impl LinkConfig {
    /// A TCP-like link: in order, no loss.
    pub fn tcp(delay: Duration, jitter: Duration) -> LinkConfig {
        LinkConfig {
            delay,
            jitter,
            ..LinkConfig::default()
        }
    }

    /// A datagram link: reordering by jitter, loss.
    pub fn datagram(delay: Duration, jitter: Duration, loss: f64) -> LinkConfig {
        LinkConfig {
            delay,
            jitter,
            loss,
            in_order: false,
            ..LinkConfig::default()
        }
    }
}

/// A one-way link carrying items of type `T`.
#[derive(Debug)]
pub struct SimLink<T> {
    cfg: LinkConfig,
    rng: SimRng,
    /// (arrival, send order, item)
    in_flight: BinaryHeap<Reverse<(Instant, u64, Slot<T>)>>,
    order: u64,
    last_arrival: Option<Instant>,
    busy_until: Option<Instant>,
    /// Items sent, lost, duplicated, corrupted.
    pub sent: u64,
    /// Items lost.
    pub lost: u64,
    /// Items duplicated.
    pub duplicated: u64,
    /// Items corrupted.
    pub corrupted: u64,
}

/// Wrapper so the heap orders by (arrival, order) only.
#[derive(Debug)]
struct Slot<T>(T);
impl<T> PartialEq for Slot<T> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl<T> Eq for Slot<T> {}
impl<T> PartialOrd for Slot<T> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Slot<T> {
    fn cmp(&self, _: &Self) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}

impl<T: Clone> SimLink<T> {
    /// A link with this behaviour, seeded.
    pub fn new(cfg: LinkConfig, seed: u64) -> SimLink<T> {
        SimLink {
            cfg,
            rng: SimRng::new(seed),
            in_flight: BinaryHeap::new(),
            order: 0,
            last_arrival: None,
            busy_until: None,
            sent: 0,
            lost: 0,
            duplicated: 0,
            corrupted: 0,
        }
    }

    /// The link's behaviour.
    pub fn config(&self) -> &LinkConfig {
        &self.cfg
    }

    /// Sends `item` of `size` bytes at `now`.
    pub fn send(&mut self, now: Instant, item: T, size: usize) {
        self.send_with(now, item, size, |_, _| {});
    }

    /// Sends `item`; if the link decides to corrupt it, `corrupt(item, random)` is called
    /// to flip a bit of it.
    pub fn send_with(
        &mut self,
        now: Instant,
        mut item: T,
        size: usize,
        corrupt: impl FnOnce(&mut T, u64),
    ) {
        self.sent += 1;
        // Serialisation at the sender: items queue behind each other on a slow link.
        let mut depart = now;
        if let Some(bps) = self.cfg.bandwidth_bps {
            let start = self.busy_until.map_or(now, |b| b.max(now));
            let ser =
                Duration::from_nanos((size as u64 * 8).saturating_mul(1_000_000_000) / bps.max(1));
            depart = start + ser;
            self.busy_until = Some(depart);
        }
        if self.rng.chance(self.cfg.loss) {
            self.lost += 1;
            return;
        }
        if self.rng.chance(self.cfg.corrupt) {
            self.corrupted += 1;
            let r = self.rng.next_u64();
            corrupt(&mut item, r);
        }
        let copies = if !self.cfg.in_order && self.rng.chance(self.cfg.duplicate) {
            self.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let jitter = self.rng.range(0, self.cfg.jitter.as_nanos() as u64);
            let mut arrival = depart + self.cfg.delay + Duration::from_nanos(jitter);
            if self.cfg.in_order {
                if let Some(last) = self.last_arrival {
                    arrival = arrival.max(last);
                }
                self.last_arrival = Some(arrival);
            }
            self.order += 1;
            self.in_flight
                .push(Reverse((arrival, self.order, Slot(item.clone()))));
        }
    }

    /// When the next item arrives, if any is in flight.
    pub fn next_arrival(&self) -> Option<Instant> {
        self.in_flight.peek().map(|Reverse((t, _, _))| *t)
    }

    /// The next item that has arrived by `now`.
    pub fn recv(&mut self, now: Instant) -> Option<T> {
        if self.next_arrival()? <= now {
            self.in_flight.pop().map(|Reverse((_, _, Slot(item)))| item)
        } else {
            None
        }
    }

    /// Items still in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(link: &mut SimLink<u32>, until: Instant) -> Vec<(u32, Instant)> {
        let mut v = vec![];
        while let Some(t) = link.next_arrival() {
            if t > until {
                break;
            }
            v.push((link.recv(t).unwrap(), t));
        }
        v
    }

    #[test]
    fn fixed_delay_in_order() {
        let t0 = Instant::now();
        let mut l = SimLink::new(
            LinkConfig::tcp(Duration::from_millis(10), Duration::ZERO),
            1,
        );
        l.send(t0, 1, 10);
        l.send(t0 + Duration::from_millis(1), 2, 10);
        assert!(l.recv(t0 + Duration::from_millis(9)).is_none());
        let got = drain(&mut l, t0 + Duration::from_secs(1));
        assert_eq!(
            got,
            vec![
                (1, t0 + Duration::from_millis(10)),
                (2, t0 + Duration::from_millis(11))
            ]
        );
    }

    #[test]
    fn in_order_link_never_reorders_under_jitter_and_datagram_does() {
        let t0 = Instant::now();
        let mut tcp = SimLink::new(
            LinkConfig::tcp(Duration::ZERO, Duration::from_millis(50)),
            3,
        );
        let mut udp = SimLink::new(
            LinkConfig::datagram(Duration::ZERO, Duration::from_millis(50), 0.0),
            3,
        );
        for i in 0..200 {
            tcp.send(t0 + Duration::from_millis(i as u64), i, 1);
            udp.send(t0 + Duration::from_millis(i as u64), i, 1);
        }
        let a: Vec<u32> = drain(&mut tcp, t0 + Duration::from_secs(9))
            .into_iter()
            .map(|x| x.0)
            .collect();
        let b: Vec<u32> = drain(&mut udp, t0 + Duration::from_secs(9))
            .into_iter()
            .map(|x| x.0)
            .collect();
        assert_eq!(a, (0..200).collect::<Vec<_>>());
        assert_ne!(b, (0..200).collect::<Vec<_>>());
        let mut sorted = b.clone();
        sorted.sort();
        assert_eq!(
            sorted,
            (0..200).collect::<Vec<_>>(),
            "reordered, nothing lost"
        );
    }

    #[test]
    fn loss_and_duplication_rates_follow_config_and_seed() {
        let t0 = Instant::now();
        let cfg = LinkConfig {
            loss: 0.1,
            duplicate: 0.05,
            in_order: false,
            ..LinkConfig::default()
        };
        let run = |seed| {
            let mut l = SimLink::new(cfg.clone(), seed);
            for i in 0..10_000 {
                l.send(t0, i, 1);
            }
            (l.lost, l.duplicated, l.in_flight())
        };
        let (lost, dup, n) = run(42);
        assert!((800..1200).contains(&lost), "lost {lost}");
        assert!((300..650).contains(&dup), "dup {dup}");
        assert_eq!(n as u64, 10_000 - lost + dup);
        assert_eq!(run(42), (lost, dup, n), "same seed, same run");
    }

    #[test]
    fn bandwidth_queues_items_behind_each_other() {
        let t0 = Instant::now();
        let cfg = LinkConfig {
            delay: Duration::ZERO,
            bandwidth_bps: Some(8_000),
            ..LinkConfig::default()
        };
        let mut l = SimLink::new(cfg, 1);
        l.send(t0, 1, 100); // 100 bytes at 1000 B/s = 100 ms
        l.send(t0, 2, 100);
        let got = drain(&mut l, t0 + Duration::from_secs(1));
        assert_eq!(
            got,
            vec![
                (1, t0 + Duration::from_millis(100)),
                (2, t0 + Duration::from_millis(200))
            ]
        );
    }
}

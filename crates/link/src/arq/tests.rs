use super::*;

fn cfg() -> ArqConfig {
    ArqConfig::default()
}

fn send(tx: &mut ArqTx, now: Instant, body: &[u8]) -> Bytes {
    let env = sequenced(tx.next_seq(), body);
    tx.sent(now, env.clone());
    env
}

fn open(env: &Bytes) -> (u64, Bytes) {
    match Envelope::parse(env.clone()) {
        Ok(Envelope::Sequenced { seq, message }) => (seq, message),
        other => panic!("not sequenced: {other:?}"),
    }
}

#[test]
fn envelopes_round_trip_and_bad_ones_are_named() {
    let env = sequenced(7, b"hi");
    assert_eq!(open(&env), (7, Bytes::from_static(b"hi")));
    let ack = Ack {
        cumulative: 5,
        sack: 0b101,
    };
    assert_eq!(
        Envelope::parse(Bytes::copy_from_slice(&ack.emit())),
        Ok(Envelope::Ack(ack))
    );
    assert_eq!(
        Envelope::parse(Bytes::from(plain(b"x"))),
        Ok(Envelope::Plain(Bytes::from_static(b"x")))
    );
    assert_eq!(Envelope::parse(Bytes::new()), Err(EnvelopeError::Empty));
    assert_eq!(
        Envelope::parse(Bytes::from_static(&[9, 1])),
        Err(EnvelopeError::Kind(9))
    );
    assert_eq!(
        Envelope::parse(Bytes::from_static(&[1, 0, 0])),
        Err(EnvelopeError::Short { kind: 1, len: 3 })
    );
    assert_eq!(
        Envelope::parse(Bytes::from_static(&[2, 0, 0, 0, 0, 0, 0, 0, 1, 0])),
        Err(EnvelopeError::Short { kind: 2, len: 10 })
    );
    assert_eq!(Envelope::parse(sequenced(0, b"")), Err(EnvelopeError::Zero));
    assert_eq!(
        EnvelopeError::Kind(9).to_string(),
        "unknown UDP envelope kind 9"
    );
}

#[test]
fn in_order_messages_are_acknowledged_every_eighth_or_after_the_delay() {
    let t0 = Instant::now();
    let mut rx = ArqRx::new(cfg());
    let mut out = Vec::new();
    for seq in 1..=7 {
        rx.handle(t0, seq, Bytes::from(vec![seq as u8]), &mut out);
        assert_eq!(rx.poll_ack(t0), None, "no acknowledgement after {seq}");
    }
    assert_eq!(rx.poll_timeout(), Some(t0 + Duration::from_millis(5)));
    rx.handle(t0, 8, Bytes::from_static(b"8"), &mut out);
    assert_eq!(
        rx.poll_ack(t0),
        Some(Ack {
            cumulative: 8,
            sack: 0
        })
    );
    assert_eq!(out.len(), 8);
    rx.handle(t0, 9, Bytes::from_static(b"9"), &mut out);
    assert_eq!(rx.poll_ack(t0 + Duration::from_millis(4)), None);
    assert_eq!(
        rx.poll_ack(t0 + Duration::from_millis(5))
            .map(|a| a.cumulative),
        Some(9)
    );
}

#[test]
fn a_gap_is_held_acknowledged_at_once_and_filled_in_order_exactly_once() {
    let t0 = Instant::now();
    let mut rx = ArqRx::new(cfg());
    let mut out = Vec::new();
    rx.handle(t0, 1, Bytes::from_static(b"1"), &mut out);
    rx.handle(t0, 3, Bytes::from_static(b"3"), &mut out);
    rx.handle(t0, 5, Bytes::from_static(b"5"), &mut out);
    assert_eq!(out, vec![Bytes::from_static(b"1")]);
    // 3 is bit 0 (cumulative + 2), 5 is bit 2.
    assert_eq!(
        rx.poll_ack(t0),
        Some(Ack {
            cumulative: 1,
            sack: 0b101
        })
    );
    rx.handle(t0, 3, Bytes::from_static(b"3"), &mut out);
    assert_eq!(rx.stats().duplicates, 1);
    assert!(
        rx.poll_ack(t0).is_some(),
        "a repeat is acknowledged at once"
    );
    rx.handle(t0, 2, Bytes::from_static(b"2"), &mut out);
    assert_eq!(out.len(), 3, "2 releases 3, not 5");
    rx.handle(t0, 4, Bytes::from_static(b"4"), &mut out);
    let got: Vec<&[u8]> = out.iter().map(|b| &b[..]).collect();
    assert_eq!(got, vec![b"1", b"2", b"3", b"4", b"5"]);
    assert_eq!(rx.held_bytes(), 0);
    rx.handle(t0, 1, Bytes::from_static(b"1"), &mut out);
    assert_eq!(out.len(), 5, "never twice");
}

#[test]
fn a_receiver_holds_at_most_its_bound_ahead_of_a_gap() {
    let t0 = Instant::now();
    let mut rx = ArqRx::new(ArqConfig {
        max_held: 4,
        max_held_bytes: 3,
        ..cfg()
    });
    let mut out = Vec::new();
    rx.handle(t0, 2, Bytes::from_static(b"ab"), &mut out);
    rx.handle(t0, 3, Bytes::from_static(b"cd"), &mut out); // over the bytes
    rx.handle(t0, 9, Bytes::from_static(b""), &mut out); // too far ahead
    assert_eq!(rx.stats().overflow, 2);
    rx.handle(t0, 1, Bytes::from_static(b"z"), &mut out);
    assert_eq!(out.len(), 2, "1 and 2; 3 comes again later");
}

#[test]
fn the_window_holds_the_sender_back_but_a_large_message_goes_alone() {
    let t0 = Instant::now();
    let mut tx = ArqTx::new(ArqConfig {
        window_bytes: 100,
        window_messages: 3,
        ..cfg()
    });
    assert!(tx.has_room(1000), "nothing in flight: anything goes");
    send(&mut tx, t0, &[0; 60]);
    assert!(!tx.has_room(60));
    assert!(tx.has_room(20));
    send(&mut tx, t0, &[0; 10]);
    send(&mut tx, t0, &[0; 1]);
    assert!(!tx.has_room(1), "three messages in flight");
    tx.handle_ack(
        t0,
        Ack {
            cumulative: 1,
            sack: 0,
        },
    );
    assert!(tx.has_room(60));
    assert_eq!(tx.in_flight(), 2);
}

#[test]
fn a_gap_below_acknowledged_messages_is_sent_again_a_round_trip_and_a_quarter_after_it_went() {
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let ack = Ack {
        cumulative: 1,
        sack: 0b11,
    };
    let mut tx = ArqTx::new(cfg());
    for i in 1..=4u8 {
        send(&mut tx, t0, &[i]);
    }
    // 1 arrives, 2 is missing, 3 and 4 arrive: measured round trip 10 ms. 2 may only be
    // late (reordered) until 12.5 ms after it went.
    assert!(tx.handle_ack(t0 + ms(10), ack).is_empty());
    assert_eq!(tx.srtt(), Some(ms(10)));
    let due = t0 + ms(10) + ms(10) / 4;
    assert_eq!(
        tx.poll_timeout(),
        Some(due),
        "the loss timer, before the 200 ms one"
    );
    assert!(tx.handle_timeout(due - ms(1)).is_empty());
    let again = tx.handle_timeout(due);
    assert_eq!(again.len(), 1, "only 2");
    assert_eq!(open(&again[0]).0, 2);
    // The same news again: not again (nothing sent after the copy arrived yet).
    assert!(tx.handle_ack(due + ms(1), ack).is_empty());
    assert!(tx.handle_ack(due + ms(30), ack).is_empty());
    // 5 goes after the copy and arrives, 2 still missing a round trip and a quarter after
    // its copy went: lost again.
    send(&mut tx, due + ms(31), b"5");
    let again = tx.handle_ack(
        due + ms(45),
        Ack {
            cumulative: 1,
            sack: 0b111,
        },
    );
    assert_eq!(again.len(), 1);
    assert_eq!(open(&again[0]).0, 2);
    assert_eq!(tx.stats().retransmitted, 2);
    assert_eq!(
        tx.stats().timeouts,
        0,
        "recovered without the retransmission timer"
    );
    tx.handle_ack(
        t0 + ms(40),
        Ack {
            cumulative: 5,
            sack: 0,
        },
    );
    assert_eq!(tx.in_flight(), 0);
    assert_eq!(tx.poll_timeout(), None, "nothing in flight, no timer");
}

#[test]
fn the_timer_sends_the_oldest_again_and_doubles_until_progress() {
    let t0 = Instant::now();
    let mut tx = ArqTx::new(cfg());
    send(&mut tx, t0, b"a");
    send(&mut tx, t0, b"b");
    let first = tx.poll_timeout().expect("timer runs");
    assert_eq!(first, t0 + Duration::from_millis(200));
    assert!(tx
        .handle_timeout(first - Duration::from_millis(1))
        .is_empty());
    let again = tx.handle_timeout(first);
    assert_eq!(again.len(), 2, "everything unacknowledged, oldest first");
    assert_eq!(open(&again[0]).0, 1);
    assert_eq!(tx.poll_timeout(), Some(first + Duration::from_millis(400)));
    let second = tx.poll_timeout().unwrap();
    tx.handle_timeout(second);
    assert_eq!(tx.poll_timeout(), Some(second + Duration::from_millis(800)));
    assert_eq!(tx.stats().timeouts, 2);
    // Progress resets the backoff; a retransmitted message gives no round-trip sample.
    tx.handle_ack(
        second + Duration::from_millis(1),
        Ack {
            cumulative: 1,
            sack: 0,
        },
    );
    assert_eq!(tx.srtt(), None);
    assert_eq!(tx.current_rto(), Duration::from_millis(200));
}

/// A deterministic lossy, reordering channel: drives both halves in virtual time.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

fn run_lossy(loss: u64, messages: usize, seed: u64) -> (Vec<Bytes>, ArqStats, Duration) {
    let t0 = Instant::now();
    let one_way = Duration::from_millis(5);
    let mut rng = Lcg(seed);
    let mut tx = ArqTx::new(ArqConfig {
        window_messages: 64,
        ..cfg()
    });
    let mut rx = ArqRx::new(cfg());
    // (arrival, jitter tiebreak, to_rx?, envelope)
    let mut wire: Vec<(Instant, u64, bool, Bytes)> = Vec::new();
    let mut got = Vec::new();
    let mut next = 0usize;
    let mut now = t0;
    let put = |wire: &mut Vec<(Instant, u64, bool, Bytes)>,
               rng: &mut Lcg,
               now: Instant,
               to_rx: bool,
               b: Bytes| {
        if !rng.chance(loss) {
            let jitter = Duration::from_micros(rng.next() % 1000);
            wire.push((now + one_way + jitter, rng.next(), to_rx, b));
        }
    };
    for _ in 0..1_000_000 {
        while next < messages && tx.has_room(8) {
            let env = send(&mut tx, now, &(next as u64).to_be_bytes());
            put(&mut wire, &mut rng, now, true, env);
            next += 1;
        }
        for b in tx.handle_timeout(now) {
            put(&mut wire, &mut rng, now, true, b);
        }
        if let Some(a) = rx.poll_ack(now) {
            put(
                &mut wire,
                &mut rng,
                now,
                false,
                Bytes::copy_from_slice(&a.emit()),
            );
        }
        if got.len() == messages && tx.in_flight() == 0 {
            return (got, tx.stats(), now - t0);
        }
        // The next event: an arrival or a timer.
        wire.sort_by_key(|w| (w.0, w.1));
        let timers = [tx.poll_timeout(), rx.poll_timeout()];
        let at = wire
            .first()
            .map(|w| w.0)
            .into_iter()
            .chain(timers.into_iter().flatten())
            .min()
            .expect("something is pending");
        now = now.max(at);
        while wire.first().is_some_and(|w| w.0 <= now) {
            let (_, _, to_rx, b) = wire.remove(0);
            match Envelope::parse(b) {
                Ok(Envelope::Sequenced { seq, message }) if to_rx => {
                    rx.handle(now, seq, message, &mut got)
                }
                Ok(Envelope::Ack(a)) if !to_rx => {
                    for b in tx.handle_ack(now, a) {
                        put(&mut wire, &mut rng, now, true, b);
                    }
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }
    panic!(
        "did not finish: {} of {messages} delivered, {} in flight",
        got.len(),
        tx.in_flight()
    );
}

#[test]
fn through_loss_and_reordering_every_message_arrives_once_in_order() {
    for (loss, seed) in [(0, 1), (5, 2), (30, 3), (60, 4)] {
        let (got, stats, took) = run_lossy(loss, 2000, seed);
        let want: Vec<Bytes> = (0..2000u64)
            .map(|i| Bytes::copy_from_slice(&i.to_be_bytes()))
            .collect();
        assert!(got == want, "loss {loss}%: out of order or missing");
        println!("loss {loss}%: {stats:?}, {took:?}");
        if loss == 0 {
            assert_eq!(stats.timeouts, 0, "no loss, no timer expiry");
            assert!(stats.retransmitted < 50, "reordering alone: {stats:?}");
        } else {
            assert!(stats.retransmitted > 0);
        }
        if loss <= 30 {
            // 2000 messages, 64 in flight, 10–12 ms round trips: 0.3 s without loss.
            assert!(took < Duration::from_secs(3), "loss {loss}%: took {took:?}");
        }
    }
}

/// A path with a bottleneck: one datagram leaves every `service`, at most `queue` wait
/// (more are dropped, as a full socket buffer or router queue drops them), then 5 ms to the
/// receiver; acknowledgements come back in 5 ms. Returns the sender's counters and how long
/// `messages` of `len` bytes took.
fn run_bottleneck(
    cfg: ArqConfig,
    messages: usize,
    len: usize,
    queue: usize,
) -> (ArqStats, Duration) {
    let t0 = Instant::now();
    let one_way = Duration::from_millis(5);
    let service = Duration::from_micros(100);
    let mut tx = ArqTx::new(cfg);
    let mut rx = ArqRx::new(ArqConfig::default());
    let mut to_rx: VecDeque<(Instant, Bytes)> = VecDeque::new();
    let mut to_tx: VecDeque<(Instant, Ack)> = VecDeque::new();
    let mut last_departure = t0;
    let mut got = Vec::new();
    let mut next = 0usize;
    let mut now = t0;
    let mut dropped = 0;
    let mut enqueue = |to_rx: &mut VecDeque<(Instant, Bytes)>, now: Instant, b: Bytes| {
        // Datagrams still waiting at the bottleneck: those not yet departed.
        let waiting = to_rx.iter().filter(|(at, _)| *at - one_way > now).count();
        if waiting >= queue {
            dropped += 1;
            return;
        }
        last_departure = last_departure.max(now) + service;
        to_rx.push_back((last_departure + one_way, b));
    };
    for _ in 0..10_000_000 {
        while next < messages && tx.has_room(len) {
            let env = sequenced(tx.next_seq(), &vec![next as u8; len]);
            tx.sent(now, env.clone());
            enqueue(&mut to_rx, now, env);
            next += 1;
        }
        for b in tx.handle_timeout(now) {
            enqueue(&mut to_rx, now, b);
        }
        if let Some(a) = rx.poll_ack(now) {
            to_tx.push_back((now + one_way, a));
        }
        if got.len() == messages && tx.in_flight() == 0 {
            let mut stats = tx.stats();
            stats.overflow = dropped;
            return (stats, now - t0);
        }
        let timers = [tx.poll_timeout(), rx.poll_timeout()];
        let at = [to_rx.front().map(|w| w.0), to_tx.front().map(|w| w.0)]
            .into_iter()
            .chain(timers)
            .flatten()
            .min()
            .expect("something is pending");
        now = now.max(at);
        while to_rx.front().is_some_and(|w| w.0 <= now) {
            let (_, b) = to_rx.pop_front().unwrap();
            let (seq, m) = open(&b);
            rx.handle(now, seq, m, &mut got);
        }
        while to_tx.front().is_some_and(|w| w.0 <= now) {
            let (_, a) = to_tx.pop_front().unwrap();
            for b in tx.handle_ack(now, a) {
                enqueue(&mut to_rx, now, b);
            }
        }
    }
    panic!("did not finish: {} of {messages} delivered", got.len());
}

#[test]
fn the_congestion_window_keeps_a_burst_from_overflowing_a_small_queue() {
    // 5000 messages of 1000 bytes through a 10 000 datagram/s bottleneck with room for 50:
    // 0.5 s at the bottleneck's rate. Without a congestion window (a 2 MiB burst) most of the
    // first window is dropped at once.
    let blind = ArqConfig {
        initial_cwnd: 64 << 20,
        min_cwnd: 64 << 20,
        ..cfg()
    };
    let (blind_stats, blind_took) = run_bottleneck(blind, 5000, 1000, 50);
    let (stats, took) = run_bottleneck(cfg(), 5000, 1000, 50);
    println!(
        "with a congestion window: {stats:?} {took:?}; without: {blind_stats:?} {blind_took:?}"
    );
    assert!(
        stats.overflow * 4 < blind_stats.overflow,
        "drops: {} with, {} without",
        stats.overflow,
        blind_stats.overflow
    );
    assert!(stats.retransmitted < 500, "{stats:?}");
    assert!(took < Duration::from_millis(1000), "took {took:?}");
}

#[test]
fn a_large_message_is_acknowledged_at_once_small_ones_wait_for_the_batch() {
    let t0 = Instant::now();
    let mut rx = ArqRx::new(cfg());
    let mut out = Vec::new();
    // Small messages: no acknowledgement before 8 of them or 5 ms.
    rx.handle(t0, 1, Bytes::from(vec![0u8; 100]), &mut out);
    assert_eq!(rx.poll_ack(t0), None);
    assert_eq!(rx.poll_timeout(), Some(t0 + cfg().ack_delay));
    // 64 KiB arrived unacknowledged: one goes now, not after the delay (a sender whose window
    // holds two 1 MB messages would otherwise wait 5 ms for every pair).
    rx.handle(t0, 2, Bytes::from(vec![0u8; 64 << 10]), &mut out);
    let ack = rx.poll_ack(t0).expect("acknowledged at once");
    assert_eq!(ack.cumulative, 2);
    assert_eq!(rx.poll_ack(t0), None);
    // The count starts again after an acknowledgement.
    rx.handle(t0, 3, Bytes::from(vec![0u8; 100]), &mut out);
    assert_eq!(rx.poll_ack(t0), None);
    assert_eq!(out.len(), 3);
}

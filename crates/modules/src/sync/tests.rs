use super::*;
use ndd_core::{Frame, HalfStats, Meta, Output};
use std::time::{Duration, Instant};

const MS: u64 = 1_000_000;

/// Two members of one group; `arrivals` = (arrival ms, member, timestamp ms). Returns, per
/// released frame, (release ms, member, timestamp ms).
fn run(
    max_delay_ms: u64,
    mut arrivals: Vec<(u64, usize, u64)>,
) -> (Vec<(u64, usize, u64)>, [HalfStats; 2]) {
    let g = SyncGroup::new_shared();
    let mut cfg = SyncConfig {
        max_delay_ms,
        ..SyncConfig::default()
    };
    cfg.join(g.clone());
    let mut halves = [cfg.inverse().unwrap(), cfg.inverse().unwrap()];
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    arrivals.sort_by_key(|a| a.0);
    let mut out = Vec::new();
    let mut pending = arrivals.into_iter().peekable();
    let mut now_ms = 0;
    loop {
        // Everything due by `now_ms`, until nothing changes.
        loop {
            let mut progressed = false;
            for (m, h) in halves.iter_mut().enumerate() {
                if h.poll_timeout().is_some_and(|t| t <= at(now_ms)) {
                    let mut o = Output::new();
                    h.handle_timeout(at(now_ms), &mut o);
                    for f in o.take_frames() {
                        out.push((now_ms, m, f.meta.timestamp_ns / MS));
                        progressed = true;
                    }
                }
            }
            if !progressed {
                break;
            }
        }
        let next_timer = halves
            .iter()
            .filter_map(|h| h.poll_timeout())
            .map(|t| t.duration_since(t0).as_millis() as u64)
            .filter(|&t| t > now_ms)
            .min();
        let next_arrival = pending.peek().map(|a| a.0);
        let Some(next) = [next_timer, next_arrival].into_iter().flatten().min() else {
            break;
        };
        now_ms = next;
        while pending.peek().is_some_and(|a| a.0 == now_ms) {
            let (_, m, ts) = pending.next().unwrap();
            let mut o = Output::new();
            let meta = Meta {
                stream: m as u16 + 1,
                seq: ts,
                timestamp_ns: ts * MS,
                flags: 0,
            };
            halves[m]
                .handle_frame(at(now_ms), Frame::new(meta, b"e"), &mut o)
                .unwrap();
            for f in o.take_frames() {
                out.push((now_ms, m, f.meta.timestamp_ns / MS));
            }
        }
    }
    (out, [halves[0].stats(), halves[1].stats()])
}

/// For any two frames of different members, the older is released no later than the newer.
fn in_timestamp_order(out: &[(u64, usize, u64)]) -> bool {
    out.iter()
        .all(|a| out.iter().all(|b| a.1 == b.1 || a.2 >= b.2 || a.0 <= b.0))
}

#[test]
fn a_late_stream_is_put_back_in_order_with_the_other() {
    // Events alternate between two devices every 5 ms; member 1's stream arrives 30 ms late
    // (bundled, say), member 0's 2 ms late.
    let mut arrivals = Vec::new();
    for i in 0..40u64 {
        let ts = 5 * i;
        if i % 2 == 0 {
            arrivals.push((ts + 2, 0, ts));
        } else {
            arrivals.push((ts + 30, 1, ts));
        }
    }
    let (bare, _) = run(0, arrivals.clone());
    assert!(
        !in_timestamp_order(&bare),
        "without waiting, the late stream is out of order"
    );
    let (synced, stats) = run(50, arrivals);
    assert_eq!(synced.len(), 40);
    assert!(in_timestamp_order(&synced), "{synced:?}");
    // Member 0 waited for member 1 (except at the very end, when member 1 went quiet).
    assert!(stats[0].counters[0].1 >= 15, "{:?}", stats[0]);
    // Nobody waited longer than the bound.
    for &(rel, m, ts) in &synced {
        let arrived = if m == 0 { ts + 2 } else { ts + 30 };
        assert!(
            rel - arrived <= 50,
            "frame {ts} of member {m} held {} ms",
            rel - arrived
        );
    }
}

#[test]
fn an_idle_member_delays_the_others_by_at_most_max_delay() {
    let arrivals: Vec<_> = (0..10u64).map(|i| (10 * i + 1, 0, 10 * i)).collect();
    let (out, stats) = run(25, arrivals);
    assert_eq!(out.len(), 10);
    for &(rel, _, ts) in &out {
        assert_eq!(rel, ts + 1 + 25, "released exactly at the bound");
    }
    assert_eq!(stats[0].counters, vec![("in_order", 0), ("timed_out", 10)]);
}

#[test]
fn a_member_alone_releases_at_once_and_flush_releases_everything() {
    let cfg = SyncConfig::default();
    let mut h = cfg.inverse().unwrap();
    let now = Instant::now();
    let mut o = Output::new();
    h.handle_frame(now, Frame::new(Meta::default(), b"x"), &mut o)
        .unwrap();
    assert_eq!(o.take_frames().len(), 1);
    // Two members, one frame held, flush.
    let g = SyncGroup::new_shared();
    let mut c = SyncConfig::default();
    c.join(g);
    let mut a = c.inverse().unwrap();
    let _b = c.inverse().unwrap();
    a.handle_frame(now, Frame::new(Meta::default(), b"y"), &mut o)
        .unwrap();
    assert!(o.take_frames().is_empty());
    assert_eq!(a.stats().queue_depth, 1);
    a.flush(&mut o);
    assert_eq!(o.take_frames().len(), 1);
}

#[test]
fn parameters_are_checked_and_described() {
    let c = SyncConfig {
        group: "input".into(),
        max_delay_ms: 20,
        ..SyncConfig::default()
    };
    assert_eq!(c.describe(), "sync(group=input, max_delay_ms=20)");
    let e = SyncConfig {
        max_delay_ms: 20_000,
        ..SyncConfig::default()
    }
    .validate()
    .unwrap_err()
    .to_string();
    assert_eq!(e, "sync: max_delay_ms = 20000 is out of range 0..=10000");
    assert!(SyncConfig {
        group: String::new(),
        ..SyncConfig::default()
    }
    .validate()
    .is_err());
    // The forward half is a pass-through and refuses control messages.
    let mut f = c.forward().unwrap();
    assert!(f
        .handle_control(
            Instant::now(),
            bytes::Bytes::from_static(b"x"),
            &mut Output::new()
        )
        .is_err());
}

proptest::proptest! {
    /// Whatever the two streams' delays (each within the bound), every frame comes out once,
    /// each member's frames in their own order, and across members in timestamp order.
    #[test]
    fn any_skew_within_the_bound_gives_timestamp_order(
        delays in proptest::collection::vec((0u64..2, 0u64..30), 1..60),
        lag in 0u64..30,
    ) {
        // Member 1's stream is `lag` ms slower; each frame adds its own 0..30 ms of jitter,
        // but a stream delivers in order (as TCP does), so arrivals never go backwards.
        let mut last = [0u64; 2];
        let arrivals: Vec<(u64, usize, u64)> = delays
            .iter()
            .enumerate()
            .map(|(i, &(m, d))| {
                let m = m as usize;
                let ts = 3 * i as u64;
                let arrive = (ts + d + if m == 1 { lag } else { 0 }).max(last[m]);
                last[m] = arrive;
                (arrive, m, ts)
            })
            .collect();
        let (out, _) = run(100, arrivals.clone());
        proptest::prop_assert_eq!(out.len(), arrivals.len());
        for m in 0..2 {
            let mine: Vec<u64> = out.iter().filter(|o| o.1 == m).map(|o| o.2).collect();
            let mut sorted = mine.clone();
            sorted.sort();
            proptest::prop_assert_eq!(mine, sorted);
        }
        proptest::prop_assert!(in_timestamp_order(&out), "{:?}", out);
    }
}

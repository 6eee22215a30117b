use super::*;
use ndd_core::{Frame, Meta, Output, Role, Stack};
use proptest::prelude::*;
use std::time::{Duration, Instant};

const MS: u64 = 1_000_000;

fn meta(seq: u64, ts_ms: u64) -> Meta {
    Meta {
        stream: 2,
        seq,
        timestamp_ns: ts_ms * MS,
        flags: (seq % 3) as u16,
    }
}

fn cfg(count: u32, max_delay_ms: u64) -> BundleConfig {
    BundleConfig {
        count,
        max_delay_ms,
        ..BundleConfig::default()
    }
}

fn drain(s: &mut Stack) -> Vec<Frame> {
    std::iter::from_fn(|| s.poll_frame()).collect()
}

#[test]
fn format_round_trips_and_matches_vector() {
    let base = meta(5, 100);
    let metas = [(meta(5, 100), 2usize), (meta(6, 116), 0), (meta(8, 110), 1)];
    let mut buf = Vec::new();
    format::encode_header(&mut buf, &base, metas.iter().copied(), 3);
    // count 3 | (0,0,flags 2,len 2) | (+1,+16ms,0,0) | (+2,-6ms,2,1)
    let mut expect = vec![3, 0, 0, 2, 2, 2];
    crate::varint::put_i64(&mut expect, 16 * MS as i64);
    expect.extend_from_slice(&[0, 0, 4]);
    crate::varint::put_i64(&mut expect, -6 * MS as i64);
    expect.extend_from_slice(&[2, 1]);
    assert_eq!(buf, expect);
    buf.extend_from_slice(b"abz");
    // The test vector in docs/modules.md.
    let hex: String = buf.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex, "0300000202028090a10f000004ffb5dc05020161627a");
    let entries = format::decode(&base, &buf).unwrap();
    let got: Vec<(Meta, &[u8])> = entries
        .iter()
        .map(|e| (e.meta, &buf[e.offset..e.offset + e.len]))
        .collect();
    assert_eq!(
        got,
        vec![
            (meta(5, 100), &b"ab"[..]),
            (meta(6, 116), &b""[..]),
            (meta(8, 110), &b"z"[..])
        ]
    );
}

#[test]
fn malformed_bundles_give_clear_errors() {
    let base = meta(0, 0);
    let cases: &[(&[u8], &str)] = &[
        (&[], "bundle: truncated count"),
        (&[0], "bundle: count is 0"),
        (
            &[0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0],
            "does not fit in 8 bytes",
        ),
        (
            &[1, 0, 0, 0, 5, b'a'],
            "entry lengths add up to 5 bytes but 1 follow",
        ),
        (&[2, 0, 0, 0, 0, 0, 0, 0], "bundle: entry 1: bad length"),
        (
            &[1, 0, 0, 0xff, 0xff, 0x7f, 0],
            "flags 2097151 exceed 16 bits",
        ),
    ];
    for (bytes, want) in cases {
        let e = format::decode(&base, bytes).unwrap_err().to_string();
        assert!(e.contains(want), "{bytes:?}: got {e:?}, want {want:?}");
    }
    // Through the inverse half: a module error, not a panic.
    let mut inv = BundleInverse::new(Duration::ZERO);
    let err = inv
        .handle_frame(
            Instant::now(),
            Frame::new(base, &[1, 0, 0, 0, 5]),
            &mut Output::new(),
        )
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "malformed frame: bundle: entry lengths add up to 5 bytes but 0 follow"
    );
}

#[test]
fn forward_emits_at_count_deadline_size_and_flush() {
    let t0 = Instant::now();
    let mut fwd = BundleForward::new(3, Duration::from_millis(50), 100);
    let mut out = Output::new();
    for i in 0..3 {
        fwd.handle_frame(t0, Frame::new(meta(i, 0), b"xx"), &mut out)
            .unwrap();
    }
    assert_eq!(out.take_frames().len(), 1, "count reached");
    fwd.handle_frame(t0, Frame::new(meta(3, 0), b"xx"), &mut out)
        .unwrap();
    assert_eq!(fwd.poll_timeout(), Some(t0 + Duration::from_millis(50)));
    fwd.handle_timeout(t0 + Duration::from_millis(49), &mut out);
    assert!(out.take_frames().is_empty(), "not yet due");
    fwd.handle_timeout(t0 + Duration::from_millis(50), &mut out);
    assert_eq!(out.take_frames().len(), 1, "deadline");
    assert_eq!(fwd.poll_timeout(), None);
    fwd.handle_frame(t0, Frame::new(meta(4, 0), &[0; 60]), &mut out)
        .unwrap();
    fwd.handle_frame(t0, Frame::new(meta(5, 0), &[0; 60]), &mut out)
        .unwrap();
    assert_eq!(out.take_frames().len(), 1, "max_bytes starts a new bundle");
    fwd.flush(&mut out);
    assert_eq!(out.take_frames().len(), 1, "flush");
}

#[test]
fn inverse_recreates_spacing_and_reanchors_when_late() {
    let t0 = Instant::now();
    let mut src = Stack::build(Role::Source, "s", &[&cfg(4, 1000)]).unwrap();
    let mut sink = Stack::build(Role::Sink, "s", &[&cfg(4, 1000)]).unwrap();
    for i in 0..8 {
        src.handle_frame(t0, Frame::new(meta(i, 16 * i), b"m"))
            .unwrap();
    }
    let wire = drain(&mut src);
    assert_eq!(wire.len(), 2);
    let mut wire = wire.into_iter();
    // First bundle arrives at 100 ms: frames due at 100, 116, 132, 148.
    let arrive = t0 + Duration::from_millis(100);
    sink.handle_frame(arrive, wire.next().unwrap()).unwrap();
    let mut released = vec![];
    let mut now = arrive;
    let step = |sink: &mut Stack, now: Instant, released: &mut Vec<(u64, Duration)>| {
        for f in drain(sink) {
            released.push((f.meta.seq, now - t0));
        }
    };
    step(&mut sink, now, &mut released);
    while let Some(t) = sink.poll_timeout() {
        now = t;
        sink.handle_timeout(now).unwrap();
        step(&mut sink, now, &mut released);
    }
    // Second bundle (first frame ts 64 ms, due at 164 ms) arrives late, at 200 ms.
    now = t0 + Duration::from_millis(200);
    sink.handle_frame(now, wire.next().unwrap()).unwrap();
    step(&mut sink, now, &mut released);
    while let Some(t) = sink.poll_timeout() {
        now = t;
        sink.handle_timeout(now).unwrap();
        step(&mut sink, now, &mut released);
    }
    let ms = |v: u64| Duration::from_millis(v);
    assert_eq!(
        released,
        vec![
            (0, ms(100)),
            (1, ms(116)),
            (2, ms(132)),
            (3, ms(148)),
            (4, ms(200)),
            (5, ms(216)),
            (6, ms(232)),
            (7, ms(248))
        ]
    );
    let st = &sink.stats()[0].half;
    assert_eq!(
        st.counters,
        vec![("late", 1), ("reanchors", 1), ("catch_ups", 0)]
    );
}

#[test]
fn a_source_clock_jump_restarts_the_schedule_instead_of_holding_frames() {
    let t0 = Instant::now();
    let mut inv = BundleInverse::new(Duration::ZERO);
    let mut fwd = BundleForward::new(1, Duration::ZERO, 1 << 20);
    let mut out = Output::new();
    for (seq, ts_ms) in [(0u64, 0u64), (1, 3_600_000)] {
        fwd.handle_frame(t0, Frame::new(meta(seq, ts_ms), b"x"), &mut out)
            .unwrap();
    }
    let mut rel = Output::new();
    for f in out.take_frames() {
        inv.handle_frame(t0, f, &mut rel).unwrap();
    }
    assert_eq!(
        rel.take_frames().len(),
        2,
        "both released at once, not an hour later"
    );
    assert_eq!(
        inv.stats().counters,
        vec![("late", 0), ("reanchors", 1), ("catch_ups", 0)]
    );
}

#[test]
fn after_a_burst_from_a_link_outage_the_schedule_catches_up_with_the_live_stream() {
    // Records every 16 ms, 4 per bundle, each bundle on the wire 5 ms after its last record.
    // The link is down from 1 s to 2.2 s: the bundles of that time come at once when it is
    // back (replayed), then the stream goes on live. Before, the burst re-anchored the
    // schedule on its oldest bundle and every later record kept its 1.2 s of delay.
    let t0 = Instant::now();
    let ms = |v: u64| Duration::from_millis(v);
    let mut inv = BundleInverse::new(Duration::ZERO);
    let mut fwd = BundleForward::new(4, ms(1000), 1 << 20);
    let mut arrivals: Vec<(Instant, Frame)> = Vec::new();
    let mut out = Output::new();
    for seq in 0..400u64 {
        fwd.handle_frame(t0, Frame::new(meta(seq, 16 * seq), b"r"), &mut out)
            .unwrap();
        for f in out.take_frames() {
            let sent = ms(16 * seq + 5);
            let at = if (ms(1000)..ms(2200)).contains(&sent) {
                ms(2200)
            } else {
                sent
            };
            arrivals.push((t0 + at, f));
        }
    }
    let mut released: Vec<(u64, Duration)> = Vec::new();
    let mut rel = Output::new();
    let mut arrivals = arrivals.into_iter().peekable();
    let mut now = t0;
    loop {
        let next_arrival = arrivals.peek().map(|(t, _)| *t);
        let next = [next_arrival, inv.poll_timeout()]
            .into_iter()
            .flatten()
            .min();
        let Some(t) = next else { break };
        now = t.max(now);
        while arrivals.peek().is_some_and(|(t, _)| *t <= now) {
            let (_, f) = arrivals.next().unwrap();
            inv.handle_frame(now, f, &mut rel).unwrap();
        }
        inv.handle_timeout(now, &mut rel);
        for f in rel.take_frames() {
            released.push((f.meta.seq, now - t0));
        }
    }
    let seqs: Vec<u64> = released.iter().map(|r| r.0).collect();
    assert_eq!(
        seqs,
        (0..400).collect::<Vec<_>>(),
        "every record once, in order"
    );
    // The delay of each record: release time minus its creation (16 ms × seq).
    let delay = |seq: u64| released[seq as usize].1.saturating_sub(ms(16 * seq));
    assert!(delay(20) <= ms(60), "before the outage: {:?}", delay(20));
    assert!(
        delay(100) >= ms(600),
        "records of the outage are late: {:?}",
        delay(100)
    );
    // The schedule moves earlier in two steps (the burst's own bundles hold the first back),
    // 0.5 and 1.1 s after the link is back; what was queued goes out at once.
    for seq in 215..400 {
        assert!(
            delay(seq) <= ms(60),
            "from 1.2 s after the link is back the delay is the live one again: record {seq} {:?}",
            delay(seq)
        );
    }
    assert_eq!(inv.stats().counters[2], ("catch_ups", 2));
}

proptest! {
    #[test]
    fn round_trip_restores_every_frame_and_meta(
        sizes in proptest::collection::vec(0usize..200, 1..60),
        count in 1u32..8,
        max_bytes in 64u32..600,
    ) {
        let c = BundleConfig { count, max_delay_ms: 10, max_bytes, playout_ms: 0 };
        let mut src = Stack::build(Role::Source, "s", &[&c]).unwrap();
        let mut sink = Stack::build(Role::Sink, "s", &[&c]).unwrap();
        let t0 = Instant::now();
        let frames: Vec<(Meta, Vec<u8>)> = sizes.iter().enumerate()
            .map(|(i, &n)| (meta(i as u64, 4 * i as u64), (0..n).map(|b| (b + i) as u8).collect()))
            .collect();
        for (i, (m, p)) in frames.iter().enumerate() {
            let now = t0 + Duration::from_millis(4 * i as u64);
            src.handle_frame(now, Frame::new(*m, p)).unwrap();
            src.handle_timeout(now).unwrap();
        }
        src.flush(t0).unwrap();
        let far = t0 + Duration::from_secs(1);
        for f in drain(&mut src) {
            sink.handle_frame(far, Frame::from_bytes(f.meta, f.into_bytes())).unwrap();
        }
        sink.flush(far).unwrap();
        let got: Vec<(Meta, Vec<u8>)> = drain(&mut sink).into_iter().map(|f| (f.meta, f.payload().to_vec())).collect();
        prop_assert_eq!(got, frames);
    }

    #[test]
    fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        let _ = format::decode(&meta(1, 1), &bytes);
    }
}

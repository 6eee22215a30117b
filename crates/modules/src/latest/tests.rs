use super::*;
use bytes::Bytes;
use ndd_core::{Frame, Meta, Output, Role, Stack};
use ndd_testkit::{LinkConfig, Pipeline, EPOCH_NS};
use proptest::prelude::*;
use std::time::{Duration, Instant};

fn meta(seq: u64) -> Meta {
    Meta {
        stream: 4,
        seq,
        timestamp_ns: 1_000_000 * seq,
        flags: (seq % 2) as u16,
    }
}

fn counter(c: &[(&'static str, u64)], name: &str) -> u64 {
    c.iter().find(|(n, _)| *n == name).map_or(0, |(_, v)| *v)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

fn seqs(out: &mut Output) -> Vec<u64> {
    out.take_frames().iter().map(|f| f.meta.seq).collect()
}

#[test]
fn ack_format_matches_vector_and_rejects_garbage() {
    assert_eq!(
        hex(&encode_ack(0x0102_0304_0506_0708)),
        "010102030405060708"
    );
    assert_eq!(decode_ack(&encode_ack(42)), Ok(42));
    assert_eq!(
        decode_ack(&[]).map_err(|e| e.to_string()),
        Err("latest: empty control message".to_string())
    );
    assert_eq!(
        decode_ack(&[1, 0, 0]).map_err(|e| e.to_string()),
        Err("latest: ack message is 3 bytes, expected 9".to_string())
    );
    assert_eq!(
        decode_ack(&[7; 9]).map_err(|e| e.to_string()),
        Err("latest: unknown control message type 0x07".to_string())
    );
}

#[test]
fn config_validates_and_describes_every_parameter() {
    let c = LatestConfig::default();
    assert_eq!(c.describe(), "latest(in_flight=1, ack_timeout_ms=1000)");
    assert_eq!(c.id(), 9);
    let names: Vec<&str> = INFO.params.iter().map(|p| p.name).collect();
    assert_eq!(names, ["in_flight", "ack_timeout_ms"]);
    let bad = LatestConfig {
        in_flight: 0,
        ..c.clone()
    };
    assert_eq!(
        bad.validate().map_err(|e| e.to_string()),
        Err("latest: in_flight = 0 is out of range 1..=1024".to_string())
    );
    assert!(bad.forward().is_err());
    let bad = LatestConfig {
        ack_timeout_ms: 0,
        ..c
    };
    assert_eq!(
        bad.validate().map_err(|e| e.to_string()),
        Err("latest: ack_timeout_ms = 0 is out of range 1..=60000".to_string())
    );
}

#[test]
fn forward_keeps_only_the_newest_while_out_of_credit() {
    let t0 = Instant::now();
    let mut fwd = LatestForward::new(2, Duration::from_millis(100));
    let mut out = Output::new();
    for seq in 0..6 {
        fwd.handle_frame(t0, Frame::new(meta(seq), b"x"), &mut out)
            .unwrap();
    }
    assert_eq!(seqs(&mut out), vec![0, 1], "two may be in flight");
    assert_eq!(fwd.stats().drops, 3, "2, 3 and 4 spoiled by 5");
    assert_eq!(fwd.stats().queue_depth, 1);
    // Ack of 1 settles 0 too (0 was lost or is behind it): two credits, one frame waiting.
    fwd.handle_control(t0, Bytes::copy_from_slice(&encode_ack(1)), &mut out)
        .unwrap();
    assert_eq!(seqs(&mut out), vec![5]);
    fwd.handle_frame(t0, Frame::new(meta(6), b"x"), &mut out)
        .unwrap();
    assert_eq!(seqs(&mut out), vec![6], "second credit used at once");
    fwd.handle_frame(t0, Frame::new(meta(7), b"x"), &mut out)
        .unwrap();
    assert!(out.take_frames().is_empty());
    // An ack for a frame not in flight (duplicate) changes nothing.
    fwd.handle_control(t0, Bytes::copy_from_slice(&encode_ack(1)), &mut out)
        .unwrap();
    assert!(out.take_frames().is_empty());
    // No ack for 5 and 6 within the timeout: both taken as lost, 7 goes.
    assert_eq!(fwd.poll_timeout(), Some(t0 + Duration::from_millis(100)));
    fwd.handle_timeout(t0 + Duration::from_millis(100), &mut out);
    assert_eq!(seqs(&mut out), vec![7]);
    let st = fwd.stats();
    assert_eq!(counter(&st.counters, "timeouts"), 2);
    assert_eq!(counter(&st.counters, "acks"), 2);
    assert_eq!(counter(&st.counters, "spoiled"), 3);
    assert_eq!(counter(&st.counters, "in_flight"), 1);
    // End of stream: a held frame goes out without credit.
    fwd.handle_frame(t0, Frame::new(meta(8), b"x"), &mut out)
        .unwrap();
    fwd.handle_frame(t0, Frame::new(meta(9), b"x"), &mut out)
        .unwrap();
    assert_eq!(seqs(&mut out), vec![8]);
    fwd.flush(&mut out);
    assert_eq!(seqs(&mut out), vec![9]);
}

#[test]
fn inverse_acks_every_frame_and_drops_older_ones() {
    let mut inv = LatestInverse::default();
    let mut out = Output::new();
    for seq in [3, 5, 4, 5, 9] {
        inv.handle_frame(Instant::now(), Frame::new(meta(seq), b"y"), &mut out)
            .unwrap();
    }
    assert_eq!(seqs(&mut out), vec![3, 5, 9]);
    let acks: Vec<String> = out.take_control().iter().map(|m| hex(m)).collect();
    assert_eq!(
        acks,
        [3, 5, 4, 5, 9].map(|s| hex(&encode_ack(s))).to_vec(),
        "one ack per frame received, stale ones included"
    );
    assert_eq!(inv.stats().drops, 2);
    assert_eq!(inv.stats().counters, vec![("passed", 3), ("stale", 2)]);
}

#[test]
fn control_messages_cross_the_stack_by_layer_and_bad_ones_fail_the_stream() {
    let c = LatestConfig::default();
    let mut src = Stack::build(Role::Source, "video", &[&c]).unwrap();
    let mut sink = Stack::build(Role::Sink, "video", &[&c]).unwrap();
    let t0 = Instant::now();
    src.handle_frame(t0, Frame::new(meta(0), b"a")).unwrap();
    src.handle_frame(t0, Frame::new(meta(1), b"b")).unwrap();
    src.handle_frame(t0, Frame::new(meta(2), b"c")).unwrap();
    let f = src.poll_frame().unwrap();
    assert!(src.poll_frame().is_none(), "one in flight");
    sink.handle_frame(t0, f).unwrap();
    let (layer, ack) = sink.poll_control().unwrap();
    assert_eq!((layer, hex(&ack)), (0, hex(&encode_ack(0))));
    src.handle_control(t0, layer, ack).unwrap();
    let f = src.poll_frame().unwrap();
    assert_eq!((f.meta, f.payload()), (meta(2), &b"c"[..]), "1 was spoiled");
    let e = src
        .handle_control(t0, 0, Bytes::from_static(&[1, 2, 3]))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "stream \"video\" layer 0 (latest, source side): malformed control message: latest: ack message is 3 bytes, expected 9"
    );
    // The forward half sends none, so the inverse half refuses any.
    let e = sink
        .handle_control(t0, 0, Bytes::copy_from_slice(&encode_ack(1)))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "stream \"video\" layer 0 (latest, sink side): malformed control message: this pair defines no control messages (got one of 9 bytes)"
    );
}

/// A fast source (a 1000-byte frame every ms) over a 1 Mbit/s link (8.2 ms per frame) with
/// 5 ms of delay each way: the sink gets a subsequence, in order, each frame the newest the
/// source had when the previous one's ack arrived.
#[test]
fn slow_link_gets_the_newest_frames_in_order_and_the_rest_are_spoiled() {
    let frames = 400u64;
    let link = LinkConfig {
        delay: Duration::from_millis(5),
        bandwidth_bps: Some(1_000_000),
        ..LinkConfig::default()
    };
    let c = LatestConfig::default();
    let mut p = Pipeline::new(&[&c], link, 7).unwrap();
    for i in 0..frames {
        p.send_at(Duration::from_millis(i), vec![(i % 251) as u8; 1000]);
    }
    p.finish().unwrap();
    let d = p.deliveries();
    let created: Vec<Duration> = p.created().iter().map(|c| c.1).collect();
    assert!(d.len() > 10 && (d.len() as u64) < frames / 4, "{}", d.len());
    for (i, x) in d.iter().enumerate() {
        let s = x.meta.seq;
        assert_eq!(x.meta.timestamp_ns - d[0].meta.timestamp_ns, s * 1_000_000);
        assert_eq!(&x.payload[..], &vec![(s % 251) as u8; 1000][..]);
        if i == 0 {
            assert_eq!(s, 0);
            continue;
        }
        assert!(s > d[i - 1].meta.seq, "in order, no repeats");
        if i + 1 == d.len() {
            assert_eq!(s, frames - 1, "the flush sends the last frame");
            continue;
        }
        // The ack of the previous frame left the sink at its release and reached the source
        // 5 ms later; the frame sent then is the newest created by that instant.
        let ack_at = d[i - 1].released + Duration::from_millis(5);
        let newest = created.iter().rposition(|c| *c <= ack_at).unwrap() as u64;
        assert_eq!(s, newest, "frame {i}");
    }
    let st = &p.source_stats()[0].half;
    assert_eq!(
        st.drops,
        frames - d.len() as u64,
        "spoiled = produced − delivered"
    );
    assert_eq!(counter(&st.counters, "timeouts"), 0);
}

#[test]
fn fast_link_spoils_nothing() {
    let c = LatestConfig::default();
    let link = LinkConfig::tcp(Duration::from_millis(2), Duration::from_millis(3));
    let mut p = Pipeline::new(&[&c], link, 3).unwrap();
    for i in 0..200u64 {
        p.send_at(Duration::from_millis(16 * i), vec![i as u8; 64]);
    }
    p.finish().unwrap();
    assert_eq!(p.deliveries().len(), 200);
    assert_eq!(p.source_stats()[0].half.drops, 0);
}

proptest! {
    /// Over a lossy, reordering link: the sink sees a strictly increasing subsequence of the
    /// frames, each byte- and meta-exact, and every frame is accounted for (delivered,
    /// spoiled at the source, lost by the link, or dropped as stale at the sink).
    #[test]
    fn round_trip_delivers_exact_increasing_subsequence(
        sizes in proptest::collection::vec(0usize..300, 1..80),
        gap_ms in 0u64..20,
        loss in 0.0f64..0.3,
        jitter_ms in 0u64..30,
        in_flight in 1u32..4,
        seed in any::<u64>(),
    ) {
        let c = LatestConfig { in_flight, ack_timeout_ms: 200 };
        let link = LinkConfig::datagram(Duration::from_millis(3), Duration::from_millis(jitter_ms), loss);
        let mut p = Pipeline::new(&[&c], link, seed).unwrap();
        let payloads: Vec<Vec<u8>> = sizes.iter().enumerate()
            .map(|(i, &n)| (0..n).map(|b| (b * 7 + i) as u8).collect()).collect();
        for (i, pl) in payloads.iter().enumerate() {
            p.send_at(Duration::from_millis(gap_ms * i as u64), pl.clone());
        }
        p.finish().unwrap();
        let d = p.deliveries();
        let mut last = None;
        for x in d {
            let s = x.meta.seq;
            prop_assert!(last.is_none_or(|l| s > l));
            last = Some(s);
            prop_assert_eq!(&x.payload[..], &payloads[s as usize][..]);
            prop_assert_eq!(x.meta.flags, 0);
            prop_assert_eq!(x.meta.timestamp_ns, EPOCH_NS + x.created.as_nanos() as u64);
            prop_assert_eq!(x.meta.stream, 1);
        }
        let spoiled = p.source_stats()[0].half.drops;
        let stale = p.sink_stats()[0].half.drops;
        let lost = p.data_link().lost;
        prop_assert_eq!(d.len() as u64 + spoiled + stale + lost, sizes.len() as u64);
    }
}

use super::*;
use ndd_core::{Frame, Meta, Output, Role, Stack};
use proptest::prelude::*;
use std::time::Instant;

fn meta(seq: u64) -> Meta {
    Meta {
        stream: 3,
        seq,
        timestamp_ns: 1_000 + seq,
        flags: 0,
    }
}

fn stacks() -> (Stack, Stack) {
    let c = ChecksumConfig {};
    (
        Stack::build(Role::Source, "s", &[&c]).unwrap(),
        Stack::build(Role::Sink, "s", &[&c]).unwrap(),
    )
}

#[test]
fn header_is_crc32c_of_meta_and_payload() {
    // Test vector: stream 3, seq 1, timestamp 1001, payload "abc".
    let mut out = Output::new();
    ChecksumForward
        .handle_frame(Instant::now(), Frame::new(meta(1), b"abc"), &mut out)
        .unwrap();
    let f = out.take_frames().pop().unwrap();
    let mut pre = vec![0, 3];
    pre.extend_from_slice(&1u64.to_be_bytes());
    pre.extend_from_slice(&1001u64.to_be_bytes());
    pre.extend_from_slice(b"abc");
    assert_eq!(&f.payload()[..4], &crc32c::crc32c(&pre).to_be_bytes());
    assert_eq!(&f.payload()[4..], b"abc");
}

#[test]
fn corrupted_frame_is_counted_and_dropped() {
    let (mut src, mut sink) = stacks();
    let now = Instant::now();
    for seq in 0..3 {
        src.handle_frame(now, Frame::new(meta(seq), b"hello"))
            .unwrap();
    }
    let mut wire: Vec<Frame> = std::iter::from_fn(|| src.poll_frame()).collect();
    wire[1].payload_mut()[6] ^= 0x40; // flip one payload bit
    wire[2].meta.seq = 99; // meta is covered too
    for f in wire {
        sink.handle_frame(now, f).unwrap();
    }
    let got: Vec<Frame> = std::iter::from_fn(|| sink.poll_frame()).collect();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].payload(), b"hello");
    assert_eq!(got[0].meta, meta(0));
    let st = &sink.stats()[0];
    assert_eq!(st.half.drops, 2);
    assert_eq!(st.half.counters, vec![("corrupted", 2)]);
}

#[test]
fn frame_shorter_than_header_is_dropped_not_panicking() {
    let (_, mut sink) = stacks();
    sink.handle_frame(Instant::now(), Frame::new(meta(0), b"ab"))
        .unwrap();
    assert!(sink.poll_frame().is_none());
    assert_eq!(sink.stats()[0].half.drops, 1);
}

proptest! {
    #[test]
    fn round_trip_restores_frames(payloads in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 1..20)) {
        let (mut src, mut sink) = stacks();
        let now = Instant::now();
        for (i, p) in payloads.iter().enumerate() {
            src.handle_frame(now, Frame::new(meta(i as u64), p)).unwrap();
            while let Some(f) = src.poll_frame() {
                sink.handle_frame(now, Frame::from_bytes(f.meta, f.into_bytes())).unwrap();
            }
        }
        let got: Vec<Frame> = std::iter::from_fn(|| sink.poll_frame()).collect();
        prop_assert_eq!(got.len(), payloads.len());
        for (i, (f, p)) in got.iter().zip(&payloads).enumerate() {
            prop_assert_eq!(f.payload(), &p[..]);
            prop_assert_eq!(f.meta, meta(i as u64));
        }
    }

    #[test]
    fn any_single_bit_flip_is_caught(payload in proptest::collection::vec(any::<u8>(), 1..200), bit in any::<usize>()) {
        let (mut src, mut sink) = stacks();
        let now = Instant::now();
        src.handle_frame(now, Frame::new(meta(1), &payload)).unwrap();
        let mut f = src.poll_frame().unwrap();
        let len = f.len();
        let bit = bit % (len * 8);
        f.payload_mut()[bit / 8] ^= 1 << (bit % 8);
        sink.handle_frame(now, f).unwrap();
        prop_assert!(sink.poll_frame().is_none());
    }
}

#[test]
fn a_control_message_to_a_pair_without_any_is_refused() {
    let (mut src, _) = stacks();
    let e = src
        .handle_control(Instant::now(), 0, bytes::Bytes::from_static(b"xyz"))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "stream \"s\" layer 0 (checksum, source side): malformed control message: \
         this pair defines no control messages (got one of 3 bytes)"
    );
}

#[test]
fn a_flood_of_corrupted_frames_warns_once_a_second_and_counts_every_one() {
    let mut sink = inverse::ChecksumInverse::default();
    let mut out = Output::new();
    let t0 = Instant::now();
    for i in 0..1000u64 {
        // 1000 bad frames over 2.5 s: warnings at 0 s, 1 s and 2 s only.
        let now = t0 + std::time::Duration::from_micros(i * 2_500);
        sink.handle_frame(now, Frame::new(meta(i), b"xxxxhello"), &mut out)
            .unwrap();
    }
    assert!(out.take_frames().is_empty());
    assert_eq!(sink.stats().drops, 1000);
    // 3 admitted; the 199 after the last admission are pending.
    assert_eq!(sink.noisy.suppressed(), 199);
}

//! A 1 MB payload crosses a stack of 8 pass-through pairs on each side with zero copies:
//! the same pointer comes out of the sink stack that went into the source stack.

use bytes::Bytes;
use ndd_core::frame::copies_on_this_thread;
use ndd_core::{Frame, Meta, Pair, Role, Stack};
use ndd_modules::pass::PassConfig;
use std::time::Instant;

#[test]
fn one_megabyte_through_eight_pass_pairs_is_never_copied() {
    let pass = PassConfig {};
    let pairs: Vec<&dyn Pair> = vec![&pass; 8];
    let mut src = Stack::build(Role::Source, "video", &pairs).unwrap();
    let mut sink = Stack::build(Role::Sink, "video", &pairs).unwrap();
    let payload: Vec<u8> = (0..1 << 20).map(|i| (i * 7 % 251) as u8).collect();
    let frame = Frame::new(
        Meta {
            stream: 1,
            seq: 0,
            timestamp_ns: 5,
            flags: 0,
        },
        &payload,
    );
    let ptr_in = frame.payload().as_ptr();
    let copies = copies_on_this_thread();
    let now = Instant::now();

    src.handle_frame(now, frame).unwrap();
    let out = src.poll_frame().unwrap();
    assert_eq!(
        out.payload().as_ptr(),
        ptr_in,
        "source stack moved the pointer only"
    );
    // The link hands the sink shared bytes (here: the same buffer, as a loopback would).
    let meta = out.meta;
    let wire: Bytes = out.into_bytes();
    assert_eq!(wire.as_ptr(), ptr_in);
    sink.handle_frame(now, Frame::from_bytes(meta, wire))
        .unwrap();
    let got = sink.poll_frame().unwrap();

    assert_eq!(got.payload().as_ptr(), ptr_in, "the same pointer comes out");
    assert_eq!(got.payload(), &payload[..]);
    assert_eq!(
        copies_on_this_thread(),
        copies,
        "no payload copy on the way"
    );
    assert_eq!(
        src.stats().iter().map(|s| s.bytes_out).sum::<u64>(),
        8 << 20
    );
}

#[test]
fn checksum_pairs_push_and_pop_headers_in_place() {
    use ndd_modules::checksum::ChecksumConfig;
    let c = ChecksumConfig {};
    let pairs: Vec<&dyn Pair> = vec![&c; 8];
    let mut src = Stack::build(Role::Source, "s", &pairs).unwrap();
    let mut sink = Stack::build(Role::Sink, "s", &pairs).unwrap();
    let payload = vec![0xa5u8; 1 << 20];
    let frame = Frame::new(Meta::default(), &payload);
    let ptr_in = frame.payload().as_ptr();
    let copies = copies_on_this_thread();
    src.handle_frame(Instant::now(), frame).unwrap();
    let out = src.poll_frame().unwrap();
    assert_eq!(
        out.len(),
        payload.len() + 32,
        "eight 4-byte headers in the headroom"
    );
    sink.handle_frame(
        Instant::now(),
        Frame::from_bytes(out.meta, out.into_bytes()),
    )
    .unwrap();
    let got = sink.poll_frame().unwrap();
    assert_eq!(got.payload().as_ptr(), ptr_in);
    assert_eq!(copies_on_this_thread(), copies);
}

//! HELLO: the input read as a HELLO body and as a whole message. Nothing may panic; whatever
//! parses emits back to exactly the same bytes, and comparing a HELLO with itself behaves.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ndd_wire::{compare_hello, HelloPacket, HelloRepr, Message, Mismatch};

const MAX_BODY: u32 = 1 << 20;

fn check(hello: &HelloRepr, body: &[u8]) {
    assert_eq!(hello.buffer_len(), body.len());
    let mut out = vec![0u8; hello.buffer_len()];
    hello
        .emit(&mut HelloPacket::new_unchecked(&mut out[..]))
        .expect("a parsed HELLO emits");
    assert_eq!(out, body);
    // A plan agrees with the same plan from the other side, and not from the same side.
    let mut peer = hello.clone();
    peer.side = hello.side.peer();
    assert_eq!(compare_hello(hello, &peer), Ok(()));
    assert_eq!(
        compare_hello(hello, hello),
        Err(Mismatch::SameSide(hello.side))
    );
    let _ = compare_hello(
        hello,
        &HelloRepr {
            streams: vec![],
            ..peer
        },
    )
    .map_err(|e| e.to_string());
}

fuzz_target!(|data: &[u8]| {
    // 1. As a HELLO body.
    let view = HelloPacket::new_checked(data);
    match HelloRepr::parse(&HelloPacket::new_unchecked(data)) {
        Ok(hello) => {
            let view = view.expect("a parsed HELLO passes the length check");
            assert_eq!(view.driver(), hello.driver.as_bytes());
            check(&hello, data);
        }
        Err(e) => {
            assert!(!e.to_string().is_empty());
        }
    }

    // 2. As a whole message.
    if let Ok((Message::Hello(hello), used)) = Message::parse(data, MAX_BODY) {
        check(&hello, &data[ndd_wire::HEADER_LEN..used]);
    }
});

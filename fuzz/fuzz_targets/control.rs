//! CONTROL messages: the input read as a CONTROL body, as a whole message, and wrapped in a
//! CONTROL prefix. Nothing may panic; everything that parses round-trips byte for byte.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ndd_wire::{ControlPacket, ControlRepr, Message};

const MAX_BODY: u32 = 1 << 20;

fuzz_target!(|data: &[u8]| {
    // 1. As a CONTROL body, through the checked view and the Repr.
    if let Ok(packet) = ControlPacket::new_checked(data) {
        let repr = ControlRepr::parse(&packet).expect("a checked CONTROL body parses");
        assert_eq!(repr.layer, packet.layer());
        assert_eq!(repr.msg, packet.msg());
        let mut out = vec![0u8; repr.buffer_len()];
        repr.emit(&mut ControlPacket::new_unchecked(&mut out[..]))
            .expect("emits");
        assert_eq!(out, data);
    } else {
        assert!(data.is_empty());
    }

    // 2. As a whole message.
    if let Ok((msg @ Message::Control { .. }, used)) = Message::parse(data, MAX_BODY) {
        let bytes = msg.emit_to_vec().expect("emits");
        assert_eq!(bytes.len(), used);
        assert_eq!(Message::parse(&bytes, MAX_BODY), Ok((msg, used)));
    }

    // 3. First two bytes as a stream id, the rest as the body of a CONTROL message.
    if data.len() >= 2 {
        let stream = u16::from_be_bytes([data[0], data[1]]);
        let body = &data[2..];
        let mut framed = vec![ndd_wire::VERSION, 0x02, 0, 0];
        framed.extend_from_slice(&stream.to_be_bytes());
        framed.extend_from_slice(&(body.len() as u32).to_be_bytes());
        framed.extend_from_slice(body);
        match Message::parse(&framed, MAX_BODY) {
            Ok((msg, used)) => {
                assert_eq!(used, framed.len());
                assert_eq!(msg.emit_to_vec().expect("emits"), framed);
            }
            Err(_) => assert!(stream == 0 || body.is_empty()),
        }
    }
});

//! Any bytes as the start of a link's byte stream: `peek_message_len` and `Message::parse`
//! must never panic and must agree; whatever parses must emit to the same bytes (flags aside:
//! unknown flag bits are dropped) and re-parse to the same message.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ndd_wire::{peek_message_len, DataHeader, Message, WireError, HEADER_LEN};

const MAX_BODY: u32 = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let peek = peek_message_len(data, MAX_BODY);
    match Message::parse(data, MAX_BODY) {
        Ok((msg, used)) => {
            assert_eq!(peek, Ok(Some(used)));
            let bytes = msg.emit_to_vec().expect("a parsed message must emit");
            assert_eq!(bytes.len(), used);
            // Canonical encoding: only the flags field (bytes 2..4) may differ.
            assert_eq!(bytes[..2], data[..2]);
            assert_eq!(bytes[4..], data[4..used]);
            assert_eq!(Message::parse(&bytes, MAX_BODY), Ok((msg.clone(), used)));
            if let Message::Data { payload, .. } = msg {
                let (hdr, p) = DataHeader::parse(data, MAX_BODY).expect("DATA header parses");
                assert_eq!(p, payload);
                let mut out = [0u8; ndd_wire::DATA_HEADER_LEN];
                hdr.emit(payload.len(), &mut out).expect("header emits");
                assert_eq!(out[..], bytes[..ndd_wire::DATA_HEADER_LEN]);
            }
        }
        Err(WireError::Truncated { need, have }) => {
            assert!(need > have);
            assert_eq!(have, data.len());
            assert!(need == HEADER_LEN || peek == Ok(Some(need)));
        }
        Err(e) => {
            assert!(!e.to_string().is_empty());
        }
    }
    // Read the input as a stream of messages, as a link does.
    let mut rest = data;
    while let Ok((_, used)) = Message::parse(rest, MAX_BODY) {
        rest = &rest[used..];
    }
    let _ = DataHeader::parse(data, MAX_BODY);
});

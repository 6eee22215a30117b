//! Property tests: parsing never panics; emit → parse round-trips.

use proptest::collection::vec;
use proptest::prelude::*;

use crate::*;

fn close_code() -> impl Strategy<Value = CloseCode> {
    any::<u16>().prop_map(CloseCode::from_u16)
}

fn text(max: usize) -> impl Strategy<Value = String> {
    // Mix ASCII and multi-byte characters; trim to at most `max` bytes on a char boundary.
    proptest::string::string_regex(".{0,40}")
        .expect("regex")
        .prop_map(move |s| {
            let mut end = s.len().min(max);
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            s[..end].to_owned()
        })
}

fn name() -> impl Strategy<Value = String> {
    text(255).prop_map(|s| if s.is_empty() { "x".to_owned() } else { s })
}

fn layer() -> impl Strategy<Value = LayerDecl> {
    (any::<u16>(), any::<u64>(), text(300)).prop_map(|(module_id, param_hash, description)| {
        LayerDecl {
            module_id,
            param_hash,
            description,
        }
    })
}

fn hello() -> impl Strategy<Value = HelloRepr> {
    let stream = (
        1..=u16::MAX,
        prop_oneof![Just(Direction::DeviceToApp), Just(Direction::AppToDevice)],
        name(),
        vec(layer(), 0..5),
    );
    (
        prop_oneof![Just(Side::Device), Just(Side::App)],
        MIN_MAX_BODY..=u32::MAX,
        name(),
        vec(stream, 0..6),
    )
        .prop_map(|(side, max_body, driver, raw)| {
            let mut streams: Vec<StreamDecl> = Vec::new();
            for (id, direction, name, layers) in raw {
                if streams.iter().all(|s| s.id != id) {
                    streams.push(StreamDecl {
                        id,
                        direction,
                        name,
                        layers,
                    });
                }
            }
            HelloRepr {
                side,
                max_body,
                driver,
                streams,
            }
        })
}

fn message() -> impl Strategy<Value = OwnedMessage> {
    prop_oneof![
        (
            1..=u16::MAX,
            any::<bool>(),
            any::<bool>(),
            any::<u64>(),
            any::<u64>(),
            vec(any::<u8>(), 0..64)
        )
            .prop_map(|(stream, retransmit, more, seq, timestamp_ns, payload)| {
                OwnedMessage::Data {
                    stream,
                    retransmit,
                    more,
                    seq,
                    timestamp_ns,
                    payload,
                }
            }),
        (1..=u16::MAX, any::<u8>(), vec(any::<u8>(), 0..64))
            .prop_map(|(stream, layer, msg)| OwnedMessage::Control { stream, layer, msg }),
        hello().prop_map(OwnedMessage::Hello),
        Just(OwnedMessage::Ready),
        (close_code(), text(200)).prop_map(|(code, reason)| OwnedMessage::Close { code, reason }),
        any::<u64>().prop_map(|t1| OwnedMessage::Ping { t1 }),
        (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(t1, t2, t3)| OwnedMessage::Pong {
            t1,
            t2,
            t3
        }),
        (1..=u16::MAX, any::<u64>()).prop_map(|(stream, seq)| OwnedMessage::Ack { stream, seq }),
        (1..=u16::MAX, any::<u64>())
            .prop_map(|(stream, frames)| OwnedMessage::End { stream, frames }),
        (1..=u16::MAX, any::<u64>())
            .prop_map(|(stream, seq)| OwnedMessage::Delivered { stream, seq }),
    ]
}

/// Bytes that start with a plausible prefix (right version, a known or unknown kind, a body
/// length equal to what follows), so the body parsers see most of the fuzzing.
fn framed() -> impl Strategy<Value = Vec<u8>> {
    (
        0u8..=10,
        any::<u16>(),
        any::<u16>(),
        vec(any::<u8>(), 0..300),
    )
        .prop_map(|(kind, flags, stream, body)| {
            let mut out = vec![VERSION, kind];
            out.extend_from_slice(&flags.to_be_bytes());
            out.extend_from_slice(&stream.to_be_bytes());
            out.extend_from_slice(&(body.len() as u32).to_be_bytes());
            out.extend_from_slice(&body);
            out
        })
}

fn check_any_bytes(bytes: &[u8], max_body: u32) -> Result<(), TestCaseError> {
    let peek = peek_message_len(bytes, max_body);
    match Message::parse(bytes, max_body) {
        Ok((msg, used)) => {
            prop_assert!(used <= bytes.len());
            prop_assert_eq!(peek, Ok(Some(used)));
            let again = msg.emit_to_vec().expect("a parsed message emits");
            prop_assert_eq!(again.len(), used);
            // Canonical encoding: only the flags (bytes 2..4) may differ from the input.
            prop_assert_eq!(&again[..2], &bytes[..2]);
            prop_assert_eq!(&again[4..], &bytes[4..used]);
            prop_assert_eq!(Message::parse(&again, max_body), Ok((msg, used)));
        }
        Err(WireError::Truncated { need, have }) => {
            prop_assert!(need > have);
            prop_assert_eq!(have, bytes.len());
        }
        Err(e) => {
            // Display never panics and says something.
            prop_assert!(!e.to_string().is_empty());
        }
    }
    let _ = DataHeader::parse(bytes, max_body);
    Ok(())
}

proptest! {
    #[test]
    fn parse_never_panics_on_arbitrary_bytes(
        bytes in vec(any::<u8>(), 0..400),
        max_body in any::<u32>(),
    ) {
        check_any_bytes(&bytes, max_body)?;
    }

    #[test]
    fn parse_never_panics_on_framed_bytes(bytes in framed()) {
        check_any_bytes(&bytes, 1 << 20)?;
        // Each body parser alone, on the raw body.
        let body = bytes.get(HEADER_LEN..).unwrap_or_default();
        let _ = HelloRepr::parse(&HelloPacket::new_unchecked(body));
        let _ = ControlRepr::parse(&ControlPacket::new_unchecked(body));
        let _ = CloseRepr::parse(&ClosePacket::new_unchecked(body));
        let _ = DataRepr::parse(&DataPacket::new_unchecked(body));
        let _ = PongRepr::parse(&PongPacket::new_unchecked(body));
    }

    #[test]
    fn emit_parse_round_trips(owned in message()) {
        let msg = owned.as_message();
        let bytes = msg.emit_to_vec().expect("valid message emits");
        prop_assert_eq!(bytes.len(), msg.buffer_len());
        prop_assert_eq!(peek_message_len(&bytes, u32::MAX), Ok(Some(bytes.len())));
        let (parsed, used) = Message::parse(&bytes, u32::MAX).expect("emitted bytes parse");
        prop_assert_eq!(used, bytes.len());
        prop_assert_eq!(parsed.to_owned_message(), owned);
    }

    #[test]
    fn data_header_round_trips(
        stream_id in 1..=u16::MAX,
        retransmit in any::<bool>(),
        more in any::<bool>(),
        seq in any::<u64>(),
        timestamp_ns in any::<u64>(),
        payload in vec(any::<u8>(), 0..64),
    ) {
        let hdr = DataHeader { stream_id, retransmit, more, seq, timestamp_ns };
        let mut frame = vec![0u8; DATA_HEADER_LEN];
        frame.extend_from_slice(&payload);
        hdr.emit(payload.len(), &mut frame[..DATA_HEADER_LEN]).unwrap();
        prop_assert_eq!(DataHeader::parse(&frame, u32::MAX), Ok((hdr, &payload[..])));
        let msg = Message::Data { stream: stream_id, retransmit, more, seq, timestamp_ns, payload: &payload };
        prop_assert_eq!(msg.emit_to_vec().unwrap(), frame);
    }

    #[test]
    fn clock_offset_recovers_a_true_offset(
        offset in -1_000_000_000_000i64..1_000_000_000_000,
        there in 0u64..1_000_000_000,
        back in 0u64..1_000_000_000,
        proc_ns in 0u64..1_000_000,
    ) {
        // Symmetric path: the estimate is exact.
        let t1: u64 = 2_000_000_000_000;
        let t2 = (t1 as i64 + offset) as u64 + there;
        let t3 = t2 + proc_ns;
        let t4 = t1 + there + proc_ns + there;
        let (est, rtt) = clock_offset_ns(t1, t2, t3, t4);
        prop_assert_eq!(est, offset);
        prop_assert_eq!(rtt, 2 * there);
        // Asymmetric: error at most half the asymmetry.
        let t4 = t1 + there + proc_ns + back;
        let (est, rtt) = clock_offset_ns(t1, t2, t3, t4);
        prop_assert_eq!(rtt, there + back);
        prop_assert!((est - offset).unsigned_abs() <= (there.abs_diff(back)) / 2 + 1);
    }
}

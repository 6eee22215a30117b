//! Parse/emit tests over the hex fixtures in `crates/wire/fixtures/` (the test vectors of
//! `docs/protocol.md`). Fixture format: hex digits; whitespace is ignored; `#` starts a
//! comment to the end of the line.

use crate::*;

/// The `max_body` every fixture is parsed with (1 MiB).
const MAX: u32 = 1 << 20;

pub(crate) fn hex(text: &str) -> Vec<u8> {
    let digits: Vec<u8> = text
        .lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .flat_map(|l| l.bytes())
        .filter(|b| !b.is_ascii_whitespace())
        .collect();
    assert_eq!(digits.len() % 2, 0, "odd number of hex digits");
    digits
        .chunks(2)
        .map(|p| {
            let s = core::str::from_utf8(p).expect("ascii");
            u8::from_str_radix(s, 16).expect("hex digit")
        })
        .collect()
}

macro_rules! fixture {
    ($name:literal) => {
        hex(include_str!(concat!("../fixtures/", $name, ".hex")))
    };
}

/// A good fixture: parses to `expected`, consuming every byte; `expected` emits exactly the
/// fixture; peek agrees; every proper prefix is `Truncated`.
fn good(bytes: &[u8], expected: Message<'_>) {
    let (msg, used) = Message::parse(bytes, MAX).expect("fixture parses");
    assert_eq!(msg, expected);
    assert_eq!(used, bytes.len());
    assert_eq!(expected.buffer_len(), bytes.len());
    assert_eq!(expected.emit_to_vec().expect("emits"), bytes);
    assert_eq!(peek_message_len(bytes, MAX), Ok(Some(bytes.len())));
    for cut in 0..bytes.len() {
        let need = if cut < HEADER_LEN {
            HEADER_LEN
        } else {
            bytes.len()
        };
        assert_eq!(
            Message::parse(&bytes[..cut], MAX),
            Err(WireError::Truncated { need, have: cut }),
            "prefix of {cut} bytes"
        );
    }
    // Bytes after the message belong to the next one and are not looked at.
    let mut longer = bytes.to_vec();
    longer.extend_from_slice(&[0xff; 3]);
    assert_eq!(Message::parse(&longer, MAX), Ok((expected, bytes.len())));
}

fn bad(bytes: &[u8], expected: WireError) {
    assert_eq!(Message::parse(bytes, MAX), Err(expected));
}

#[test]
fn parse_emit_data() {
    let b = fixture!("data");
    good(
        &b,
        Message::Data {
            stream: 1,
            retransmit: false,
            more: false,
            seq: 42,
            timestamp_ns: 1_700_000_000_123_456_789,
            payload: b"hello",
        },
    );
    // The hot path agrees with Message.
    let hdr = DataHeader {
        stream_id: 1,
        retransmit: false,
        more: false,
        seq: 42,
        timestamp_ns: 1_700_000_000_123_456_789,
    };
    assert_eq!(DataHeader::parse(&b, MAX), Ok((hdr, &b"hello"[..])));
    let mut out = [0u8; DATA_HEADER_LEN];
    hdr.emit(5, &mut out).unwrap();
    assert_eq!(out[..], b[..DATA_HEADER_LEN]);
    // And the checked views.
    let p = HeaderPacket::new_checked(&b[..]).unwrap();
    let d = DataPacket::new_checked(p.body()).unwrap();
    assert_eq!((d.seq(), d.payload()), (42, &b"hello"[..]));
}

#[test]
fn parse_emit_data_chunk() {
    let b = fixture!("data_more");
    good(
        &b,
        Message::Data {
            stream: 2,
            retransmit: true,
            more: true,
            seq: 7,
            timestamp_ns: 1_700_000_000_123_456_789,
            payload: b"chunk",
        },
    );
    let hdr = DataHeader {
        stream_id: 2,
        retransmit: true,
        more: true,
        seq: 7,
        timestamp_ns: 1_700_000_000_123_456_789,
    };
    assert_eq!(DataHeader::parse(&b, MAX), Ok((hdr, &b"chunk"[..])));
    let mut out = [0u8; DATA_HEADER_LEN];
    hdr.emit(5, &mut out).unwrap();
    assert_eq!(out[..], b[..DATA_HEADER_LEN]);
}

#[test]
fn parse_emit_data_empty_payload() {
    let b = fixture!("data_empty");
    good(
        &b,
        Message::Data {
            stream: 3,
            retransmit: true,
            more: false,
            seq: 0,
            timestamp_ns: 1,
            payload: &[],
        },
    );
    let hdr = DataHeader {
        stream_id: 3,
        retransmit: true,
        more: false,
        seq: 0,
        timestamp_ns: 1,
    };
    let mut out = [0u8; DATA_HEADER_LEN];
    hdr.emit(0, &mut out).unwrap();
    assert_eq!(out[..], b[..]);
}

#[test]
fn parse_emit_control() {
    good(
        &fixture!("control"),
        Message::Control {
            stream: 1,
            layer: 2,
            msg: &[0x01, 0x00, 0x07],
        },
    );
    good(
        &fixture!("control_empty"),
        Message::Control {
            stream: 0x0102,
            layer: 0,
            msg: &[],
        },
    );
}

fn layer(module_id: u16, description: &str) -> LayerDecl {
    LayerDecl {
        module_id,
        param_hash: param_hash(description),
        description: description.to_owned(),
    }
}

#[test]
fn parse_emit_hello() {
    good(
        &fixture!("hello"),
        Message::Hello(HelloRepr {
            side: Side::Device,
            max_body: 1 << 20,
            driver: "spacemouse".into(),
            streams: vec![
                StreamDecl {
                    id: 1,
                    direction: Direction::DeviceToApp,
                    name: "events".into(),
                    layers: vec![
                        layer(5, "average(window=4)"),
                        layer(3, "compress(codec=lz4, level=3)"),
                        layer(2, "bundle(max_frames=8, max_delay_ms=2)"),
                    ],
                },
                StreamDecl {
                    id: 2,
                    direction: Direction::AppToDevice,
                    name: "leds".into(),
                    layers: vec![layer(7, "crc")],
                },
            ],
        }),
    );
    good(
        &fixture!("hello_no_streams"),
        Message::Hello(HelloRepr {
            side: Side::App,
            max_body: MIN_MAX_BODY,
            driver: "serial".into(),
            streams: vec![],
        }),
    );
}

#[test]
fn parse_emit_ready() {
    good(&fixture!("ready"), Message::Ready);
}

#[test]
fn parse_emit_close() {
    good(
        &fixture!("close"),
        Message::Close {
            code: CloseCode::StackMismatch,
            reason: "stream `events` (id 1) layer 1 differs",
        },
    );
    good(
        &fixture!("close_busy"),
        Message::Close {
            code: CloseCode::Busy,
            reason: "busy",
        },
    );
    good(
        &fixture!("close_unknown_code"),
        Message::Close {
            code: CloseCode::Unknown(257),
            reason: "",
        },
    );
}

#[test]
fn parse_emit_ping_pong() {
    good(
        &fixture!("ping"),
        Message::Ping {
            t1: 1_700_000_000_000_000_000,
        },
    );
    good(
        &fixture!("pong"),
        Message::Pong {
            t1: 1_700_000_000_000_000_000,
            t2: 1_700_000_000_001_000_500,
            t3: 1_700_000_000_001_001_000,
        },
    );
}

#[test]
fn parse_emit_resume() {
    good(
        &fixture!("resume"),
        Message::Resume {
            instance: 0x0123_4567_89ab_cdef,
        },
    );
}

#[test]
fn parse_emit_end() {
    good(
        &fixture!("end"),
        Message::End {
            stream: 2,
            frames: 1000,
        },
    );
}

#[test]
fn parse_emit_ack() {
    good(&fixture!("ack"), Message::Ack { stream: 1, seq: 41 });
}

#[test]
fn parse_emit_delivered() {
    good(
        &fixture!("delivered"),
        Message::Delivered {
            stream: 2,
            seq: 300,
        },
    );
}

#[test]
fn bad_truncated() {
    let b = fixture!("bad_truncated");
    bad(&b, WireError::Truncated { need: 18, have: 14 });
    assert_eq!(peek_message_len(&b, MAX), Ok(Some(18)));
}

#[test]
fn bad_version() {
    let b = fixture!("bad_version");
    let err = WireError::UnknownVersion {
        got: 2,
        expected: 1,
    };
    bad(&b, err.clone());
    // Byte 0 alone is enough to tell.
    bad(&b[..1], err.clone());
    assert_eq!(peek_message_len(&b[..1], MAX), Err(err.clone()));
    assert_eq!(
        err.to_string(),
        "peer speaks protocol version 2, this side speaks version 1; \
         run the same ndd protocol version on both sides"
    );
}

#[test]
fn bad_oversize() {
    let b = fixture!("bad_oversize");
    let err = WireError::TooLong {
        len: 1_048_577,
        max: 1_048_576,
    };
    bad(&b, err.clone());
    assert_eq!(peek_message_len(&b, MAX), Err(err));
    // With a larger limit it is merely incomplete.
    assert_eq!(
        Message::parse(&b, MAX + 1),
        Err(WireError::Truncated {
            need: 10 + 1_048_577,
            have: 10
        })
    );
}

#[test]
fn bad_unknown_kind() {
    let b = fixture!("bad_unknown_kind");
    bad(&b, WireError::UnknownKind(12));
    // Framing still works.
    assert_eq!(peek_message_len(&b, MAX), Ok(Some(10)));
}

#[test]
fn bad_utf8() {
    bad(
        &fixture!("bad_utf8"),
        WireError::InvalidUtf8 {
            field: "close reason",
        },
    );
    bad(
        &fixture!("bad_hello_utf8"),
        WireError::InvalidUtf8 {
            field: "stream name",
        },
    );
}

#[test]
fn bad_trailing_bytes() {
    bad(
        &fixture!("bad_trailing"),
        WireError::TrailingBytes { extra: 1 },
    );
    bad(
        &fixture!("bad_hello_trailing"),
        WireError::TrailingBytes { extra: 1 },
    );
}

#[test]
fn bad_hello_duplicate_stream() {
    bad(
        &fixture!("bad_hello_duplicate"),
        WireError::Malformed("HELLO declares the same stream id twice"),
    );
}

#[test]
fn bad_short_body() {
    let err = WireError::BodyTooShort {
        kind: Kind::Ack,
        field: "seq",
        need: 8,
        have: 4,
    };
    bad(&fixture!("bad_short_body"), err.clone());
    assert_eq!(
        err.to_string(),
        "ACK body too short: field `seq` needs 8 body bytes, body has 4"
    );
}

#[test]
fn bad_stream_ids() {
    bad(
        &fixture!("bad_data_stream0"),
        WireError::Malformed("DATA on stream 0, which is reserved for session-level messages"),
    );
    bad(
        &fixture!("bad_session_stream"),
        WireError::Malformed(
            "session-level message (HELLO, READY, CLOSE, PING, PONG) with a nonzero stream id",
        ),
    );
}

#[test]
fn a_stream_of_messages_parses_in_sequence() {
    let parts = [
        fixture!("hello"),
        fixture!("ready"),
        fixture!("data"),
        fixture!("control"),
        fixture!("ack"),
        fixture!("end"),
        fixture!("ping"),
        fixture!("pong"),
        fixture!("close"),
    ];
    let all: Vec<u8> = parts.concat();
    let mut at = 0;
    let mut kinds = Vec::new();
    while at < all.len() {
        let len = peek_message_len(&all[at..], MAX).unwrap().unwrap();
        let (msg, used) = Message::parse(&all[at..], MAX).unwrap();
        assert_eq!(used, len);
        kinds.push(msg.kind());
        at += used;
    }
    assert_eq!(
        kinds,
        [
            Kind::Hello,
            Kind::Ready,
            Kind::Data,
            Kind::Control,
            Kind::Ack,
            Kind::End,
            Kind::Ping,
            Kind::Pong,
            Kind::Close
        ]
    );
}

#[test]
fn unknown_flag_bits_are_ignored() {
    let mut b = fixture!("ready");
    b[2] = 0xff;
    b[3] = 0xfe;
    assert_eq!(Message::parse(&b, MAX), Ok((Message::Ready, 10)));
    let mut b = fixture!("data");
    b[2] = 0x80; // unknown bit; RETRANSMIT (bit 0) and MORE (bit 1) clear
    assert!(matches!(
        Message::parse(&b, MAX),
        Ok((
            Message::Data {
                retransmit: false,
                more: false,
                ..
            },
            _
        ))
    ));
}

#[test]
fn emit_refuses_what_parse_rejects() {
    let m = Message::Ack { stream: 0, seq: 1 };
    assert!(matches!(m.emit_to_vec(), Err(WireError::Malformed(_))));
    let m = Message::Ping { t1: 1 };
    let mut small = [0u8; 17];
    assert_eq!(
        m.emit(&mut small),
        Err(WireError::BufferTooSmall { need: 18, have: 17 })
    );
    let mut v = vec![7u8];
    m.emit_append(&mut v).unwrap();
    assert_eq!(v.len(), 19);
    assert_eq!(Message::parse(&v[1..], MAX), Ok((m, 18)));
}

//! HELLO: the input read as a HELLO body and as a whole message. Nothing may panic; whatever
//! parses emits back to exactly the same bytes, and comparing a HELLO with itself behaves.
//!
//! The UDP key exchange and sealed datagrams: input starting with "NS" is also read as a
//! sealed datagram, and a REPLY, FINISH or DATA (its indexes patched to match a live
//! exchange, so that the signature and AEAD checks run on it) is handed to that exchange.
//! Nothing may panic and nothing forged may be accepted.
//!
//! The UDP envelope: the input is also read as a reassembled UDP message; a numbered one is
//! handed to a receiver (what it hands on stays in order, each number once), an
//! acknowledgement to a sender with messages in flight (its window accounting holds).

#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use ndd_link::arq::{self, ArqConfig, ArqRx, ArqTx, Envelope};
use ndd_link::seal::{Initiator, Keys, LocalIdentity, Responder, Sealed};
use ndd_wire::{compare_hello, HelloPacket, HelloRepr, Message, Mismatch};
use std::sync::{Mutex, OnceLock};

/// One identity, one finished exchange and one exchange waiting for FINISH, made once.
struct Live {
    me: LocalIdentity,
    responder: Responder,
    keys: Mutex<Keys>,
}

fn live() -> &'static Live {
    static LIVE: OnceLock<Live> = OnceLock::new();
    LIVE.get_or_init(|| {
        let home = std::env::temp_dir().join(format!("ndd-fuzz-id-{}", std::process::id()));
        let id = ndd_link::Identity::create(&home, true).expect("an identity");
        let _ = std::fs::remove_dir_all(&home);
        let me = LocalIdentity::new(&id).expect("a signing key");
        let mut init = Initiator::new().expect("randomness");
        let done = Responder::new(&me, init.init()).expect("a reply");
        init.handle_reply(&me, done.reply()).expect("our own reply");
        let keys = done
            .handle_finish(init.finish().expect("a finish"))
            .expect("our own finish");
        let waiting = Initiator::new().expect("randomness");
        let responder = Responder::new(&me, waiting.init()).expect("a reply");
        Live {
            me,
            responder,
            keys: Mutex::new(keys),
        }
    })
}

fn sealed(data: &[u8]) {
    let parsed = Sealed::parse(data);
    let Ok(kind) = parsed else { return };
    let live = live();
    let mut d = data.to_vec();
    match kind {
        Sealed::Init { .. } => {
            let _ = Responder::new(&live.me, &d);
        }
        Sealed::Reply { .. } => {
            // A fresh initiator is needed per input; the index is patched to match it.
            let mut init = Initiator::new().expect("randomness");
            let index = u32::from_be_bytes(init.init()[4..8].try_into().unwrap());
            d[8..12].copy_from_slice(&index.to_be_bytes());
            assert!(
                init.handle_reply(&live.me, &d).is_err(),
                "a forged REPLY passed"
            );
        }
        Sealed::Finish { .. } => {
            let theirs = &live.responder.reply()[8..12];
            d[4..8].copy_from_slice(&live.responder.index().to_be_bytes());
            d[8..12].copy_from_slice(theirs);
            assert!(
                live.responder.handle_finish(&d).is_err(),
                "a forged FINISH passed"
            );
        }
        Sealed::Data { .. } => {
            let mut keys = live.keys.lock().unwrap_or_else(|p| p.into_inner());
            d[4..8].copy_from_slice(&keys.rx.index().to_be_bytes());
            assert!(keys.rx.open(&mut d).is_err(), "a forged DATA opened");
        }
    }
}

/// One reassembled UDP message into a receiver and a sender that live across inputs.
fn envelope(data: &[u8]) {
    static ENDS: OnceLock<Mutex<(ArqRx, ArqTx, u64)>> = OnceLock::new();
    let ends = ENDS.get_or_init(|| {
        let cfg = ArqConfig {
            max_held: 64,
            ..ArqConfig::default()
        };
        Mutex::new((ArqRx::new(cfg), ArqTx::new(cfg), 0))
    });
    let mut ends = ends.lock().unwrap_or_else(|p| p.into_inner());
    let (rx, tx, delivered) = &mut *ends;
    let now = std::time::Instant::now();
    match Envelope::parse(Bytes::copy_from_slice(data)) {
        Ok(Envelope::Sequenced { seq, message }) => {
            let mut out = Vec::new();
            let before = rx.ack().cumulative;
            rx.handle(now, seq, message, &mut out);
            let after = rx.ack().cumulative;
            assert_eq!(
                after - before,
                out.len() as u64,
                "handed on = cumulative moved"
            );
            *delivered += out.len() as u64;
            assert_eq!(*delivered, after);
        }
        Ok(Envelope::Ack(ack)) => {
            while tx.in_flight() < 8 {
                let env = arq::sequenced(tx.next_seq(), b"m");
                tx.sent(now, env);
            }
            for again in tx.handle_ack(now, ack) {
                assert!(matches!(
                    Envelope::parse(again),
                    Ok(Envelope::Sequenced { .. })
                ));
            }
            let _ = tx.handle_timeout(now + std::time::Duration::from_secs(3));
        }
        Ok(Envelope::Plain(_)) | Err(_) => {}
    }
}

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

    // 3. As a sealed UDP datagram.
    if data.starts_with(b"NS") {
        sealed(data);
    }

    // 4. As a reassembled UDP message in its envelope.
    envelope(data);
});

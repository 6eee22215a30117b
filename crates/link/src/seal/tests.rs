use super::*;

fn identity(dir: &str) -> (crate::Identity, LocalIdentity) {
    // Tests run in parallel: each call gets its own directory.
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let home = std::env::temp_dir().join(format!("ndd-seal-{dir}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    let id = crate::Identity::create(&home, true).unwrap();
    let local = LocalIdentity::new(&id).unwrap();
    let _ = std::fs::remove_dir_all(&home);
    (id, local)
}

/// A whole exchange in memory: keys agree both ways, each side learns the other's pin.
fn exchange() -> (Keys, Keys, String, String) {
    let (ia, a) = identity("a");
    let (ib, b) = identity("b");
    let mut init = Initiator::new().unwrap();
    let resp = Responder::new(&b, init.init()).unwrap();
    let ka = init.handle_reply(&a, resp.reply()).unwrap();
    let kb = resp.handle_finish(init.finish().unwrap()).unwrap();
    (ka, kb, ia.fingerprint(), ib.fingerprint())
}

fn open(rx: &mut SealRx, d: &[u8]) -> Result<Vec<u8>, SealError> {
    let mut d = d.to_vec();
    let r = rx.open(&mut d)?;
    Ok(d[r].to_vec())
}

#[test]
fn an_exchange_gives_matching_keys_and_the_peers_fingerprints() {
    let (mut a, mut b, fa, fb) = exchange();
    assert_eq!(a.peer_fingerprint, fb);
    assert_eq!(b.peer_fingerprint, fa);
    let d = a.tx.seal(b"hello from a").unwrap();
    assert_eq!(d.len(), 12 + SEAL_OVERHEAD);
    assert_eq!(open(&mut b.rx, &d).unwrap(), b"hello from a");
    let d = b.tx.seal(b"").unwrap();
    assert_eq!(open(&mut a.rx, &d).unwrap(), b"");
    // The plaintext is not in the datagram.
    let d = a.tx.seal(b"secret secret secret").unwrap();
    assert!(!d.windows(6).any(|w| w == b"secret"));
}

#[test]
fn forged_damaged_replayed_and_misdirected_datagrams_are_refused() {
    let (a, mut b, _, _) = exchange();
    let d = a.tx.seal(b"payload").unwrap();
    // Every single-bit flip anywhere fails (header is associated data).
    for i in 0..d.len() {
        let mut x = d.clone();
        x[i] ^= 0x01;
        assert!(open(&mut b.rx, &x).is_err(), "flip at {i} accepted");
    }
    assert_eq!(open(&mut b.rx, &d).unwrap(), b"payload");
    assert_eq!(open(&mut b.rx, &d), Err(SealError::Replay(0)));
    // Keys from another exchange do not open it.
    let (other, _, _, _) = exchange();
    for _ in 0..5 {
        other.tx.seal(b"").unwrap();
    }
    let mut forged = other.tx.seal(b"payload").unwrap();
    forged[4..8].copy_from_slice(&b.rx.index().to_be_bytes());
    assert_eq!(open(&mut b.rx, &forged), Err(SealError::Auth));
    // The forgery did not burn the real counter 1.
    let d1 = a.tx.seal(b"one").unwrap();
    assert_eq!(open(&mut b.rx, &d1).unwrap(), b"one");
    let mut wrong = a.tx.seal(b"x").unwrap();
    wrong[4] ^= 0xff;
    assert!(matches!(open(&mut b.rx, &wrong), Err(SealError::Index(_))));
}

#[test]
fn reordering_within_the_window_is_accepted_once_and_older_is_refused() {
    let (a, mut b, _, _) = exchange();
    let all: Vec<Vec<u8>> = (0..5000u32)
        .map(|i| a.tx.seal(&i.to_be_bytes()).unwrap())
        .collect();
    // Newest first inside a window, then everything again.
    assert!(open(&mut b.rx, &all[4999]).is_ok());
    for d in all[1000..4999].iter().rev() {
        assert!(open(&mut b.rx, d).is_ok());
    }
    // The window is the 4096 counters below the newest (904..=4999): what was seen in it is
    // a replay, what was not is still welcome once; anything older is refused.
    for (i, d) in all.iter().enumerate() {
        let r = open(&mut b.rx, d);
        if (904..1000).contains(&i) {
            assert!(r.is_ok(), "datagram {i}: {r:?}");
        } else {
            assert_eq!(r, Err(SealError::Replay(i as u64)), "datagram {i}");
        }
    }
    let (a, mut b, _, _) = exchange();
    let old = a.tx.seal(b"old").unwrap();
    for _ in 0..REPLAY_WINDOW + 1 {
        let d = a.tx.seal(b"").unwrap();
        open(&mut b.rx, &d).unwrap();
    }
    assert_eq!(open(&mut b.rx, &old), Err(SealError::Replay(0)));
}

#[test]
fn a_swapped_identity_or_a_reply_to_someone_else_is_refused() {
    let (_, a) = identity("c");
    let (_, b) = identity("d");
    let (_, mallory) = identity("e");
    let mut init = Initiator::new().unwrap();
    let resp = Responder::new(&b, init.init()).unwrap();
    // Mallory re-signs B's REPLY (B's ephemeral key) with her own identity. A accepts it as
    // Mallory's, which known_peers then refuses; and even a trusted Mallory holds no key:
    // B, whose transcript differs, refuses A's FINISH.
    let mut swapped = resp.reply()[..44].to_vec();
    mallory
        .append_signed(&mut swapped, LABEL_REPLY, &[init.init()])
        .unwrap();
    let mut fooled = Initiator::new().unwrap();
    let resp_f = Responder::new(&b, fooled.init()).unwrap();
    let mut swapped_f = resp_f.reply()[..44].to_vec();
    mallory
        .append_signed(&mut swapped_f, LABEL_REPLY, &[fooled.init()])
        .unwrap();
    let k = fooled.handle_reply(&a, &swapped_f).unwrap();
    assert_eq!(k.peer_fingerprint, mallory.fingerprint());
    assert_eq!(
        resp_f.handle_finish(fooled.finish().unwrap()).unwrap_err(),
        SealError::BadSignature
    );
    // Her signature with the INIT of another exchange does not verify.
    let mut other_init = Initiator::new().unwrap();
    let resp_o = Responder::new(&b, other_init.init()).unwrap();
    let mut spliced = resp_o.reply()[..44].to_vec();
    spliced.extend_from_slice(&swapped[44..]);
    assert_eq!(
        other_init.handle_reply(&a, &spliced).unwrap_err(),
        SealError::BadSignature
    );
    // A reply to another INIT.
    let other = Initiator::new().unwrap();
    let resp2 = Responder::new(&b, other.init()).unwrap();
    assert_eq!(
        init.handle_reply(&a, resp2.reply()).unwrap_err(),
        SealError::Unrelated("REPLY")
    );
    // A damaged signature.
    let mut bad = resp.reply().to_vec();
    let n = bad.len();
    bad[n - 3] ^= 1;
    assert!(init.handle_reply(&a, &bad).is_err());
    // The real reply still works after all that.
    let ka = init.handle_reply(&a, resp.reply()).unwrap();
    let mut finish = init.finish().unwrap().to_vec();
    let kb = resp.handle_finish(&finish).unwrap();
    let d = ka.tx.seal(b"ok").unwrap();
    let mut rx = kb.rx;
    assert_eq!(open(&mut rx, &d).unwrap(), b"ok");
    // A damaged FINISH is refused.
    let n = finish.len();
    finish[n - 5] ^= 1;
    assert!(resp.handle_finish(&finish).is_err());
}

#[test]
fn a_man_in_the_middle_who_signs_finish_himself_gets_keys_nobody_shares() {
    // Mallory relays A's exchange with B but replaces A's FINISH with her own identity:
    // B believes it talks to Mallory, yet A's data must not open under B's keys.
    let (_, a) = identity("f");
    let (_, b) = identity("g");
    let (_, mallory) = identity("h");
    let mut init = Initiator::new().unwrap();
    let resp = Responder::new(&b, init.init()).unwrap();
    let ka = init.handle_reply(&a, resp.reply()).unwrap();
    let mut finish = init.finish().unwrap()[..12].to_vec();
    mallory
        .append_signed(&mut finish, LABEL_FINISH, &[init.init(), resp.reply()])
        .unwrap();
    let mut kb = resp.handle_finish(&finish).unwrap();
    assert_eq!(kb.peer_fingerprint, mallory.fingerprint());
    let d = ka.tx.seal(b"from a").unwrap();
    assert_eq!(open(&mut kb.rx, &d), Err(SealError::Auth));
}

#[test]
fn a_retransmitted_init_is_recognised() {
    let (_, b) = identity("i");
    let init = Initiator::new().unwrap();
    let resp = Responder::new(&b, init.init()).unwrap();
    assert!(resp.answers(init.init()));
    assert!(!resp.answers(Initiator::new().unwrap().init()));
}

#[test]
fn garbage_never_panics_and_names_what_is_wrong() {
    assert_eq!(Sealed::parse(b"NS"), Err(SealError::Short(2)));
    assert_eq!(Sealed::parse(b"ND\x01\x01"), Err(SealError::Magic));
    assert_eq!(Sealed::parse(b"NS\x02\x01"), Err(SealError::Version(2)));
    assert_eq!(Sealed::parse(b"NS\x01\x09"), Err(SealError::Type(9)));
    assert_eq!(
        Sealed::parse(b"NS\x01\x01abcd"),
        Err(SealError::Malformed("INIT"))
    );
    let (_, b) = identity("j");
    let init = Initiator::new().unwrap();
    let resp = Responder::new(&b, init.init()).unwrap();
    for n in 0..resp.reply().len() {
        assert!(Sealed::parse(&resp.reply()[..n]).is_err(), "prefix {n}");
    }
    assert!(Sealed::parse(resp.reply()).is_ok());
}

proptest::proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(d in proptest::collection::vec(proptest::num::u8::ANY, 0..300)) {
        let _ = Sealed::parse(&d);
        let mut with_magic = b"NS\x01".to_vec();
        with_magic.extend_from_slice(&d);
        let _ = Sealed::parse(&with_magic);
    }
}

/// `crates/link/fixtures/sealed_*.hex`: one of each datagram from a real exchange, the fuzz
/// seeds of the `handshake` target. `NDD_WRITE_FIXTURES=1` writes them anew.
#[test]
fn fixtures_are_one_of_each_datagram() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    if std::env::var_os("NDD_WRITE_FIXTURES").is_some() {
        let (_, a) = identity("fa");
        let (_, b) = identity("fb");
        let mut init = Initiator::new().unwrap();
        let resp = Responder::new(&b, init.init()).unwrap();
        let ka = init.handle_reply(&a, resp.reply()).unwrap();
        let data = ka.tx.seal(b"\x4e\x44\x01\x00").unwrap();
        std::fs::create_dir_all(&dir).unwrap();
        for (name, d) in [
            ("init", init.init()),
            ("reply", resp.reply()),
            ("finish", init.finish().unwrap()),
            ("data", &data[..]),
        ] {
            let hex: String = d.iter().map(|b| format!("{b:02x}")).collect();
            let text = format!("# sealed UDP {name} datagram (docs/links.md)\n{hex}\n");
            std::fs::write(dir.join(format!("sealed_{name}.hex")), text).unwrap();
        }
    }
    let read = |name: &str| -> Vec<u8> {
        let text = std::fs::read_to_string(dir.join(format!("sealed_{name}.hex"))).unwrap();
        let hex: String = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .collect::<String>()
            .split_whitespace()
            .collect();
        (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect()
    };
    assert!(matches!(
        Sealed::parse(&read("init")),
        Ok(Sealed::Init { .. })
    ));
    assert!(matches!(
        Sealed::parse(&read("reply")),
        Ok(Sealed::Reply { .. })
    ));
    assert!(matches!(
        Sealed::parse(&read("finish")),
        Ok(Sealed::Finish { .. })
    ));
    assert!(matches!(
        Sealed::parse(&read("data")),
        Ok(Sealed::Data { counter: 0, .. })
    ));
}

#[test]
fn a_signed_note_opens_with_its_signer_and_nothing_altered_passes() {
    let (id, local) = identity("note");
    let note = local.sign_note(b"label one", b"rekey 123").unwrap();
    assert_eq!(
        open_note(&note, b"label one").unwrap(),
        (&b"rekey 123"[..], id.fingerprint())
    );
    // Another label (another kind of note, another driver): refused.
    assert!(matches!(
        open_note(&note, b"label two"),
        Err(SealError::BadSignature)
    ));
    // Any byte of body or signature changed: refused.
    for at in [3, note.len() - 1] {
        let mut bad = note.clone();
        bad[at] ^= 1;
        assert!(open_note(&bad, b"label one").is_err(), "byte {at}");
    }
    // Another key's signature over the same body does not pass for the first one's.
    let (_, other) = identity("note-other");
    let theirs = other.sign_note(b"label one", b"rekey 123").unwrap();
    assert_ne!(
        open_note(&theirs, b"label one").unwrap().1,
        id.fingerprint()
    );
    // Short, empty or trailing bytes: malformed, never a panic.
    assert!(open_note(&[], b"label one").is_err());
    assert!(open_note(&note[..note.len() - 3], b"label one").is_err());
    let mut long = note.clone();
    long.push(0);
    assert!(open_note(&long, b"label one").is_err());
}

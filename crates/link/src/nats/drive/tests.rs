use super::*;

use ndd_core::testlog::Captured;

/// Strangers (fresh identities nobody trusts) ask to join a thousand times in a second,
/// each finishing the key exchange: a few lines of each kind, then one with the count held
/// back; every one is refused.
#[tokio::test]
async fn a_thousand_strangers_asking_to_join_in_a_second_are_a_few_lines() {
    let dir = std::env::temp_dir().join(format!("ndd-joins-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let local = |name: &str| {
        let (id, _) = crate::Identity::load_or_create(&dir.join(name)).unwrap();
        LocalIdentity::new(&id).unwrap()
    };
    let (device, stranger) = (local("device"), local("stranger"));
    // No server is needed to answer joins: a client that would connect in the background.
    let client = async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .connect("127.0.0.1:1")
        .await
        .unwrap();
    let hello = |side| ndd_wire::HelloRepr {
        side,
        max_body: 1 << 20,
        driver: "joins".into(),
        streams: vec![],
    };
    let keys = GroupKey::first([1; 32], crate::nats::runs::Run { id: 1, began: 0 });
    let (_keys, key) = watch::channel(keys);
    let mut svc = JoinService {
        admitter: Arc::new(Mutex::new(Admitter::new(
            hello(ndd_wire::Side::Device),
            &device.fingerprint(),
            "home",
            0,
            Duration::from_secs(5),
            false,
        ))),
        slots: None,
        ctx: Ctx {
            client,
            subjects: Subjects::new("ndd", "joins").unwrap(),
            side: Side::Device,
            quiet: false,
            connects: Arc::default(),
            max_payload: 1 << 20,
            run_stale: Arc::default(),
            gate: Arc::default(),
            home: dir.join("device"),
        },
        local: device,
        home: dir.join("device"),
        key,
        files: Home::new(&dir, "P", "joins"),
        expiry: Duration::from_secs(10),
    };
    let theirs = OwnedMessage::Hello(hello(ndd_wire::Side::App))
        .as_message()
        .emit_to_vec()
        .unwrap();
    let mut host = Host::new(Duration::from_secs(10));
    let t0 = Instant::now();
    let ((), log) = Captured::run(|| {
        for i in 0..=1000u64 {
            let now = t0 + Duration::from_millis(if i == 1000 { 2000 } else { i });
            let mut j = Joiner::new().unwrap();
            let reply = svc.answer(&mut host, &j.init(), keys, now).unwrap();
            let (_, finish) = j.handle_reply(&stranger, &reply, &theirs).unwrap();
            let welcome = svc.answer(&mut host, &finish, keys, now).unwrap();
            assert!(matches!(
                j.handle_welcome(&welcome).unwrap(),
                Welcome::Refused { .. }
            ));
        }
    });
    let lines = log.matching("refused untrusted app side");
    assert_eq!(lines.len(), 6, "{lines:#?}");
    assert!(lines[5].contains("suppressed=995"), "{lines:#?}");
    // One line per refusal, not a second one in other words.
    assert_eq!(log.matching("refused an app side").len(), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A stream's room in the client's queue: taken by what it hands the client, given back
/// when the client lets the bytes go (written), never before; a lossy frame finds no room
/// while it is full, a reliable one waits for it.
#[tokio::test]
async fn the_client_queue_budget_is_given_back_when_the_bytes_are_gone() {
    let b = Budget::new();
    let big = Bytes::from(vec![7u8; QUEUED_BYTES / 2]);
    let one = b.try_wrap(big.clone()).expect("room for half");
    let two = b.try_wrap(big.clone()).expect("room for the other half");
    assert_eq!(&one[..], &big[..], "the bytes are the frame's");
    assert!(b.try_wrap(Bytes::from_static(b"x")).is_none(), "full");
    // A clone the client keeps (its write queue) holds the room as well.
    let kept = two.clone();
    drop(two);
    assert!(b.try_wrap(Bytes::from_static(b"x")).is_none(), "still held");
    let waiter = {
        let b = b.clone();
        let big = big.clone();
        tokio::spawn(async move { b.wrap(big).await.len() })
    };
    tokio::task::yield_now().await;
    assert!(!waiter.is_finished(), "a reliable frame waits for room");
    drop(kept);
    assert_eq!(
        waiter.await.unwrap(),
        QUEUED_BYTES / 2,
        "and gets it once written"
    );
    drop(one);
    // A frame larger than the whole budget takes all of it, not forever.
    let huge = Bytes::from(vec![1u8; QUEUED_BYTES * 2]);
    assert_eq!(b.wrap(huge).await.len(), QUEUED_BYTES * 2);
}

/// The driver's ticket gives its publisher's place back when dropped (the rules are
/// `crate::nats::rotate::Gate`'s).
#[test]
fn a_dropped_gate_ticket_leaves_the_gate() {
    let gate: Arc<RotationGate> = Arc::default();
    let mut a = gate.join();
    let _b = gate.join();
    gate.begin();
    a.settled();
    assert_eq!(gate.counts(), (2, 1));
    drop(a);
    assert_eq!(gate.counts(), (1, 0), "b has not settled");
}

//! The sealed UDP link over loopback: key exchange, per-datagram authentication, replays,
//! strangers, refusals and lost key-exchange messages (issue 17, D3).

use std::fs;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ndd_core::{Frame, Meta};
use ndd_link::frag::fragment;
use ndd_link::seal::LocalIdentity;
use ndd_link::{
    udp_accept_secure, udp_connect_secure, Admission, Identity, Incoming, LinkError, UdpLink,
};
use ndd_wire::{CloseCode, OwnedMessage};
use tokio::net::UdpSocket;

const T: Duration = Duration::from_secs(10);
const KX: Duration = Duration::from_secs(3);

struct Home(PathBuf);

impl Drop for Home {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn identity(name: &str) -> (Home, Identity, LocalIdentity) {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "ndd-udp-sealed-{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = fs::remove_dir_all(&dir);
    let (id, _) = Identity::load_or_create(&dir).unwrap();
    let local = LocalIdentity::new(&id).unwrap();
    (Home(dir), id, local)
}

fn frame(seq: u64, payload: &[u8]) -> Frame {
    Frame::new(
        Meta {
            stream: 1,
            seq,
            timestamp_ns: 1_700_000_000_000_000_000 + seq,
            flags: 0,
        },
        payload,
    )
}

fn free_addr() -> String {
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    s.local_addr().unwrap().to_string()
}

async fn recv(link: &mut UdpLink) -> Incoming {
    tokio::time::timeout(T, link.recv())
        .await
        .expect("a message in time")
        .unwrap()
        .unwrap()
}

/// No message arrives within `d`.
async fn quiet(link: &mut UdpLink, d: Duration) {
    if let Ok(m) = tokio::time::timeout(d, link.recv()).await {
        panic!("expected nothing, got {m:?}");
    }
}

fn payload_of(m: Incoming) -> (u64, Vec<u8>) {
    match m {
        Incoming::Data { header, payload } => (header.seq, payload.to_vec()),
        other => panic!("expected DATA, got {other:?}"),
    }
}

/// A listener admitting `trusted` only, and a connected initiator.
async fn pair(addr: &str) -> (UdpLink, UdpLink, String, String) {
    let (_ha, ida, a) = identity("a");
    let (_hb, idb, b) = identity("b");
    let trusted = ida.fingerprint();
    let listen_addr = addr.to_owned();
    let server = tokio::spawn(async move {
        udp_accept_secure(&listen_addr, &b, KX, |fp, _| {
            Ok(if fp == trusted {
                Admission::Admit
            } else {
                Admission::Refuse("no".into())
            })
        })
        .await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (client, fp_b) = udp_connect_secure(addr, &a, KX).await.unwrap();
    let (server, fp_a) = server.await.unwrap().unwrap();
    assert_eq!(fp_b, idb.fingerprint());
    assert_eq!(fp_a, ida.fingerprint());
    (client, server, fp_a, fp_b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_link_carries_small_and_fragmented_messages_both_ways() {
    let addr = free_addr();
    let (mut client, mut server, _, _) = pair(&addr).await;
    assert!(client.is_sealed() && server.is_sealed());
    let big: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
    client.send_frame(frame(1, b"tiny"), false).await.unwrap();
    client.send_frame(frame(2, &big), false).await.unwrap();
    assert_eq!(payload_of(recv(&mut server).await), (1, b"tiny".to_vec()));
    assert_eq!(payload_of(recv(&mut server).await), (2, big.clone()));
    server.send_frame(frame(9, &big), false).await.unwrap();
    assert_eq!(payload_of(recv(&mut client).await), (9, big));
    let s = server.stats();
    assert_eq!((s.unauthenticated, s.replayed), (0, 0), "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spoofed_datagrams_are_dropped_and_counted_never_delivered() {
    let addr = free_addr();
    let (client, mut server, _, _) = pair(&addr).await;
    let server_addr: SocketAddr = addr.parse().unwrap();
    let stranger = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    // (a) 20 plain DATA messages, as the old link took them.
    let data = OwnedMessage::Data {
        stream: 1,
        retransmit: false,
        more: false,
        seq: 77,
        timestamp_ns: 0,
        payload: b"forged".to_vec(),
    };
    let bytes = data.as_message().emit_to_vec().unwrap();
    for id in 0..20 {
        for d in fragment(0x1234, id + 1, &bytes, 1400).unwrap() {
            stranger.send_to(&d, server_addr).await.unwrap();
        }
    }
    // (b) 10 sealed-looking DATA datagrams for the server's index with random ciphertext,
    // (c) 5 key-exchange INITs and garbage.
    let mut sealed = b"NS\x01\x04".to_vec();
    sealed.extend_from_slice(&[0u8; 4]);
    sealed.extend_from_slice(&[0u8; 8]);
    sealed.extend_from_slice(&[0x5a; 40]);
    for _ in 0..10 {
        stranger.send_to(&sealed, server_addr).await.unwrap();
    }
    let mut init = b"NS\x01\x01".to_vec();
    init.extend_from_slice(&[7u8; 36]);
    for _ in 0..5 {
        stranger.send_to(&init, server_addr).await.unwrap();
        stranger.send_to(b"garbage", server_addr).await.unwrap();
    }
    quiet(&mut server, Duration::from_millis(300)).await;
    let s = server.stats();
    assert_eq!(s.unauthenticated, 20 + 10 + 10, "{s:?}");
    assert_eq!(s.delivered, 0, "{s:?}");
    // The real peer is unaffected.
    client.send_frame(frame(1, b"real"), false).await.unwrap();
    assert_eq!(payload_of(recv(&mut server).await), (1, b"real".to_vec()));
}

/// Forwards datagrams between a client and `to`, keeping what the client sent; `drop_first`
/// drops the first datagram of that type byte (index 3) from the client, `drop_back` the
/// first one of that type from the server.
async fn proxy(
    to: SocketAddr,
    drop_first: Option<u8>,
    drop_back: Option<u8>,
) -> (SocketAddr, Arc<Mutex<Vec<Vec<u8>>>>, Arc<UdpSocket>) {
    let front = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
    let back = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
    back.connect(to).await.unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let client: Arc<Mutex<Option<SocketAddr>>> = Arc::default();
    let (f, b, s, c) = (front.clone(), back.clone(), seen.clone(), client.clone());
    tokio::spawn(async move {
        let mut dropped = false;
        let mut buf = vec![0u8; 70_000];
        loop {
            let Ok((n, from)) = f.recv_from(&mut buf).await else {
                return;
            };
            *c.lock().unwrap() = Some(from);
            let d = buf[..n].to_vec();
            if !dropped && drop_first.is_some() && d.get(3).copied() == drop_first {
                dropped = true;
                continue;
            }
            s.lock().unwrap().push(d.clone());
            let _ = b.send(&d).await;
        }
    });
    let (f, b) = (front.clone(), back.clone());
    tokio::spawn(async move {
        let mut buf = vec![0u8; 70_000];
        let mut dropped = false;
        loop {
            let Ok(n) = b.recv(&mut buf).await else {
                return;
            };
            if !dropped && drop_back.is_some() && buf.get(3).copied() == drop_back {
                dropped = true;
                continue;
            }
            let to = *client.lock().unwrap();
            if let Some(to) = to {
                let _ = f.send_to(&buf[..n], to).await;
            }
        }
    });
    (front.local_addr().unwrap(), seen, back)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_datagrams_are_dropped_and_counted() {
    let addr = free_addr();
    let (_ha, ida, a) = identity("a");
    let (_hb, _, b) = identity("b");
    let server_addr: SocketAddr = addr.parse().unwrap();
    let trusted = ida.fingerprint();
    let server = tokio::spawn(async move {
        udp_accept_secure(&server_addr.to_string(), &b, KX, move |fp, _| {
            assert_eq!(fp, trusted);
            Ok(Admission::Admit)
        })
        .await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (front, seen, back) = proxy(server_addr, None, None).await;
    let (client, _) = udp_connect_secure(&front.to_string(), &a, KX)
        .await
        .unwrap();
    let (mut server, _) = server.await.unwrap().unwrap();
    for seq in 0..5 {
        client.send_frame(frame(seq, b"once"), false).await.unwrap();
    }
    for seq in 0..5 {
        assert_eq!(payload_of(recv(&mut server).await), (seq, b"once".to_vec()));
    }
    // Everything the client ever sent, again, from the proxy's address (the peer's).
    let captured: Vec<Vec<u8>> = seen.lock().unwrap().clone();
    let data: Vec<&Vec<u8>> = captured.iter().filter(|d| d[3] == 4).collect();
    assert!(data.len() >= 5);
    for d in &data {
        back.send(d).await.unwrap();
    }
    quiet(&mut server, Duration::from_millis(300)).await;
    let s = server.stats();
    assert_eq!(s.replayed, data.len() as u64, "{s:?}");
    assert_eq!(s.delivered, 5, "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_key_exchange_messages_are_sent_again() {
    // INIT, FINISH (client to server), REPLY and the confirmation (server to client).
    for (lost, back) in [
        (Some(1u8), None),
        (Some(3), None),
        (None, Some(2u8)),
        (None, Some(4)),
    ] {
        let addr = free_addr();
        let (_ha, _, a) = identity("a");
        let (_hb, _, b) = identity("b");
        let server_addr: SocketAddr = addr.parse().unwrap();
        // The server reads at once, as the handshake does: a FINISH sent again after a lost
        // confirmation is answered by the live link.
        let server = tokio::spawn(async move {
            let (mut link, _) = udp_accept_secure(&server_addr.to_string(), &b, KX, |_, _| {
                Ok(Admission::Admit)
            })
            .await
            .unwrap();
            let m = recv(&mut link).await;
            (link, m)
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (front, _, _) = proxy(server_addr, lost, back).await;
        let (client, _) = udp_connect_secure(&front.to_string(), &a, KX)
            .await
            .unwrap_or_else(|e| panic!("lost {lost:?}/{back:?}: {e}"));
        client.send_frame(frame(1, b"after"), false).await.unwrap();
        let (_, m) = server.await.unwrap();
        assert_eq!(payload_of(m), (1, b"after".to_vec()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_peer_is_told_why_and_the_listener_waits_for_the_next() {
    let addr = free_addr();
    let (_ha, ida, a) = identity("a");
    let (_hb, _, b) = identity("b");
    let (_hm, _, mallory) = identity("m");
    let trusted = ida.fingerprint();
    let refused = Arc::new(AtomicUsize::new(0));
    let r = refused.clone();
    let listen_addr = addr.clone();
    let server = tokio::spawn(async move {
        udp_accept_secure(&listen_addr, &b, KX, move |fp, _| {
            Ok(if fp == trusted {
                Admission::Admit
            } else {
                r.fetch_add(1, Ordering::Relaxed);
                Admission::Refuse("you are not trusted here".into())
            })
        })
        .await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Mallory finishes the exchange (her keys are real) and hears why she is refused.
    let (mut m, _) = udp_connect_secure(&addr, &mallory, KX).await.unwrap();
    match recv(&mut m).await {
        Incoming::Other(OwnedMessage::Close { code, reason }) => {
            assert_eq!(code, CloseCode::UntrustedPeer);
            assert_eq!(reason, "you are not trusted here");
        }
        other => panic!("expected CLOSE, got {other:?}"),
    }
    assert!(!server.is_finished());
    let (client, _) = udp_connect_secure(&addr, &a, KX).await.unwrap();
    let (mut server, _) = tokio::time::timeout(T, server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(refused.load(Ordering::Relaxed), 1);
    client
        .send_frame(frame(3, b"trusted"), false)
        .await
        .unwrap();
    assert_eq!(
        payload_of(recv(&mut server).await),
        (3, b"trusted".to_vec())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nobody_answering_is_a_clear_timeout() {
    // A socket that takes datagrams and never answers.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap().to_string();
    let (_h, _, a) = identity("a");
    let e = udp_connect_secure(&addr, &a, Duration::from_millis(500))
        .await
        .unwrap_err();
    assert!(matches!(e, LinkError::UdpKeyExchangeTimeout { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("no answer to the UDP key exchange from"),
        "{e}"
    );
    // Several INITs went out (sent again every 200 ms).
    silent.set_nonblocking(true).unwrap();
    let mut n = 0;
    let mut buf = [0u8; 100];
    while silent.recv(&mut buf).is_ok() {
        n += 1;
    }
    assert!((2..=4).contains(&n), "{n} INITs");
}

/// A restarted peer's key exchange reaches a live link: the link asks the peer on the
/// current keys (a PING) and, with no answer, reports that the peer restarted, instead of
/// waiting for the keepalive; a stranger's key exchange while the peer answers changes
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_exchange_on_a_live_link_is_a_restart_only_if_the_peer_stops_answering() {
    let addr = free_addr();
    let (_ha, ida, a) = identity("a");
    let (_hb, _, b) = identity("b");
    let trusted = ida.fingerprint();
    let listen_addr = addr.clone();
    let server = tokio::spawn(async move {
        udp_accept_secure(&listen_addr, &b, KX, move |fp, _| {
            Ok(if fp == trusted {
                Admission::Admit
            } else {
                Admission::Refuse("no".into())
            })
        })
        .await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (mut client, _) = udp_connect_secure(&addr, &a, KX).await.unwrap();
    let (mut server, _) = server.await.unwrap().unwrap();
    // The client answers PINGs as a session does.
    let answering = tokio::spawn(async move {
        loop {
            match client.recv().await {
                Ok(Some(Incoming::Other(OwnedMessage::Ping { t1 }))) => {
                    let pong = ndd_wire::Message::Pong { t1, t2: 0, t3: 0 };
                    client.send_message(&pong).await.unwrap();
                }
                Ok(_) => {}
                Err(_) => return,
            }
        }
    });
    // A stranger's INIT: the live peer answers the probe; nothing but its PONG arrives.
    let stranger = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mut init = b"NS\x01\x01".to_vec();
    init.extend_from_slice(&[7u8; 36]);
    stranger.send_to(&init, &addr).await.unwrap();
    let until = tokio::time::Instant::now() + Duration::from_millis(2500);
    let mut pongs = 0;
    while let Ok(m) = tokio::time::timeout_at(until, server.recv()).await {
        match m {
            Ok(Some(Incoming::Other(OwnedMessage::Pong { .. }))) => pongs += 1,
            other => panic!("expected only the probe's answer, got {other:?}"),
        }
    }
    assert_eq!(pongs, 1, "one probe, answered");
    // The peer restarts: the old process is gone, the new one starts a key exchange.
    answering.abort();
    let _ = answering.await;
    let restarted = tokio::spawn(async move { udp_connect_secure(&addr, &a, KX).await });
    let t = std::time::Instant::now();
    let err = tokio::time::timeout(T, server.recv())
        .await
        .expect("the live link notices")
        .expect_err("the restart is an error of the live link");
    assert!(matches!(err, LinkError::PeerRekeyed { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("a new UDP key exchange began and the peer did not answer on the current keys within 1000 ms: it restarted"),
        "{err}"
    );
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    restarted.abort();
}

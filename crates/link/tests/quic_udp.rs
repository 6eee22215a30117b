//! QUIC and UDP links over loopback (127.0.0.1, port 0), and the raw throughput baselines.

use std::fs;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ndd_core::{Frame, Meta};
use ndd_link::frag::{fragment, FragHeader};
use ndd_link::{
    client_config, quic_connect, quic_connect_with, quic_listen, udp_bind, udp_connect, Identity,
    Incoming, LinkError, QuicConn, ReassemblyConfig,
};
use ndd_wire::{CloseCode, Message, OwnedMessage};
use tokio::net::UdpSocket;

const T: Duration = Duration::from_secs(10);

struct Home(PathBuf);

impl Drop for Home {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn identity(name: &str) -> (Home, Identity) {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "ndd-quic-test-{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = fs::remove_dir_all(&dir);
    let (id, _) = Identity::load_or_create(&dir).unwrap();
    (Home(dir), id)
}

fn frame(stream: u16, seq: u64, payload: &[u8]) -> Frame {
    Frame::new(
        Meta {
            stream,
            seq,
            timestamp_ns: 1_700_000_000_000_000_000 + seq,
            flags: 0,
        },
        payload,
    )
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

async fn recv(conn: &mut QuicConn) -> Option<Incoming> {
    tokio::time::timeout(T, conn.recv())
        .await
        .expect("recv timed out")
        .unwrap()
}

async fn quic_pair() -> (QuicConn, QuicConn, [Home; 2]) {
    let (hs, server) = identity("server");
    let (hc, client) = identity("client");
    let listener = quic_listen("127.0.0.1:0", &server).await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (s, c) = tokio::join!(listener.accept(T), quic_connect(&addr, &client, T));
    let ((s, sp), (c, cp)) = (s.unwrap(), c.unwrap());
    // Each side sees the other's key fingerprint, as with TLS.
    assert_eq!(
        sp.fingerprint.as_deref(),
        Some(client.fingerprint().as_str())
    );
    assert_eq!(
        cp.fingerprint.as_deref(),
        Some(server.fingerprint().as_str())
    );
    // The listener can go: its endpoint lives on with the connection.
    std::mem::forget(listener);
    (s, c, [hs, hc])
}

// ---------------------------------------------------------------------------------------
// QUIC

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quic_handshake_shows_pinned_fingerprints_both_ways() {
    let (mut s, c, _homes) = quic_pair().await;
    c.send_message(&Message::Ready).await.unwrap();
    assert_eq!(
        recv(&mut s).await,
        Some(Incoming::Other(OwnedMessage::Ready))
    );
}

/// A client that shows someone else's certificate but cannot sign with its key is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quic_refuses_a_stolen_certificate_without_its_key() {
    #[derive(Debug)]
    struct Impostor(Arc<rustls::sign::CertifiedKey>);
    impl rustls::client::ResolvesClientCert for Impostor {
        fn resolve(
            &self,
            _hints: &[&[u8]],
            _schemes: &[rustls::SignatureScheme],
        ) -> Option<Arc<rustls::sign::CertifiedKey>> {
            Some(Arc::clone(&self.0))
        }
        fn has_certs(&self) -> bool {
            true
        }
    }
    let (_hs, server) = identity("stolen-server");
    let (_hv, victim) = identity("stolen-victim");
    let (_ha, attacker) = identity("stolen-attacker");
    let key = ndd_link::tls::provider()
        .key_provider
        .load_private_key(attacker.key_der().clone_key())
        .unwrap();
    let forged = rustls::sign::CertifiedKey::new(vec![victim.cert_der().clone()], key);
    let mut cc = (*client_config(&attacker).unwrap()).clone();
    cc.client_auth_cert_resolver = Arc::new(Impostor(Arc::new(forged)));

    let listener = quic_listen("127.0.0.1:0", &server).await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (s, c) = tokio::join!(
        listener.accept(T),
        quic_connect_with(&addr, Arc::new(cc), T)
    );
    let e = s.unwrap_err();
    assert!(matches!(e, LinkError::QuicHandshake { .. }), "{e}");
    // Whatever the client saw, it is not a usable connection with a verified server.
    if let Ok((mut c, _)) = c {
        assert!(tokio::time::timeout(T, c.recv()).await.unwrap().is_err());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quic_carries_session_reliable_and_lossy_traffic_in_order() {
    let (mut s, c, _homes) = quic_pair().await;
    let big = pattern(1 << 20, 3);
    let lossy_big = pattern(5000, 9);
    let max_dgram = c.max_datagram_size().unwrap();
    assert!(lossy_big.len() > max_dgram, "{max_dgram}");

    let sender = c.sender();
    let sending = {
        let (big, lossy_big) = (big.clone(), lossy_big.clone());
        tokio::spawn(async move {
            sender.send_message(&Message::Ready).await.unwrap();
            // Reliable stream 1: 1 MB, then a small frame, then END.
            sender.send_frame(frame(1, 0, &big), true).await.unwrap();
            sender.send_frame(frame(1, 1, b"tail"), true).await.unwrap();
            sender
                .send_message(&Message::Control {
                    stream: 1,
                    layer: 0,
                    msg: b"refill",
                })
                .await
                .unwrap();
            // Lossy stream 2: one small, one fragmented.
            sender.send_frame(frame(2, 0, b"m"), false).await.unwrap();
            sender
                .send_frame(frame(2, 1, &lossy_big), false)
                .await
                .unwrap();
            sender
                .send_message(&Message::End {
                    stream: 1,
                    frames: 2,
                })
                .await
                .unwrap();
            sender
                .send_message(&Message::Close {
                    code: CloseCode::Normal,
                    reason: "done",
                })
                .await
                .unwrap();
            sender.close().await;
        })
    };

    let mut got = Vec::new();
    while let Some(m) = recv(&mut s).await {
        got.push(m);
    }
    sending.await.unwrap();

    assert_eq!(got[0], Incoming::Other(OwnedMessage::Ready));
    let last = got.last().unwrap();
    assert!(
        matches!(last, Incoming::Other(OwnedMessage::Close { reason, .. }) if reason == "done"),
        "{last:?}"
    );
    let mut stream1 = Vec::new();
    let mut stream2 = Vec::new();
    let mut end_after = None;
    for m in &got {
        match m {
            Incoming::Data { header, payload } if header.stream_id == 1 => {
                stream1.push((header.seq, payload.clone()))
            }
            Incoming::Data { header, payload } => stream2.push((header.seq, payload.clone())),
            Incoming::Other(OwnedMessage::End { stream: 1, frames }) => {
                end_after = Some(stream1.len());
                assert_eq!(*frames, 2);
            }
            _ => {}
        }
    }
    assert_eq!(stream1.len(), 2);
    assert_eq!(stream1[0].0, 0);
    assert!(stream1[0].1[..] == big[..], "1 MB frame corrupted");
    assert_eq!(&stream1[1].1[..], b"tail");
    assert_eq!(end_after, Some(2), "END must follow its stream's DATA");
    assert!(got.iter().any(|m| matches!(m,
        Incoming::Other(OwnedMessage::Control { stream: 1, layer: 0, msg }) if msg == b"refill")));
    // Loopback does not lose datagrams at this rate.
    assert_eq!(stream2.len(), 2, "{:?}", s.stats());
    assert!(stream2.iter().any(|(_, p)| &p[..] == b"m"));
    assert!(stream2.iter().any(|(_, p)| p[..] == lossy_big[..]));
    assert_eq!(c.stats().messages_sent, 2);
    // Path MTU discovery may raise the datagram size while the test runs (seen under load:
    // one fragment fewer): the count lies between the fragments at the size read before
    // sending and at the size now.
    let fragments = |max: usize| (5000 + 26usize).div_ceil(max - 20) as u64;
    let max_now = c.max_datagram_size().unwrap();
    assert!(fragments(max_dgram) >= 2);
    let sent = c.stats().datagrams_sent;
    assert!(
        (1 + fragments(max_now)..=1 + fragments(max_dgram)).contains(&sent),
        "{sent} datagrams for a small frame and 5026 bytes in datagrams of {max_dgram}..={max_now} bytes"
    );
    assert_eq!(s.stats().delivered, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quic_data_waits_for_ready_and_works_both_ways() {
    let (mut s, mut c, _homes) = quic_pair().await;
    // The server sends DATA right after READY; the client must see READY first.
    s.send_message(&Message::Ready).await.unwrap();
    s.send_frame(frame(7, 0, b"from server"), true)
        .await
        .unwrap();
    assert_eq!(
        recv(&mut c).await,
        Some(Incoming::Other(OwnedMessage::Ready))
    );
    let (h, p) = match recv(&mut c).await {
        Some(Incoming::Data { header, payload }) => (header, payload),
        other => panic!("{other:?}"),
    };
    assert_eq!((h.stream_id, &p[..]), (7, &b"from server"[..]));
    c.send_message(&Message::Ping { t1: 5 }).await.unwrap();
    assert_eq!(
        recv(&mut s).await,
        Some(Incoming::Other(OwnedMessage::Ping { t1: 5 }))
    );
    // Closing one side ends the other's recv cleanly.
    c.close().await;
    assert_eq!(recv(&mut s).await, None);
}

// ---------------------------------------------------------------------------------------
// UDP

/// A message as a UDP link carries it unnumbered (PING, PONG, lossy DATA).
fn plain(message: &[u8]) -> Vec<u8> {
    ndd_link::arq::plain(message)
}

async fn udp_pair() -> (ndd_link::UdpLink, ndd_link::UdpLink) {
    let server = udp_bind("127.0.0.1:0").await.unwrap();
    let addr = server.local_addr().unwrap().to_string();
    let client = udp_connect(&addr).await.unwrap();
    (server, client)
}

async fn udp_recv(link: &mut ndd_link::UdpLink) -> Incoming {
    tokio::time::timeout(T, link.recv())
        .await
        .expect("recv timed out")
        .unwrap()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_fragments_and_reassembles_a_200_kb_message_both_ways() {
    let (mut server, mut client) = udp_pair().await;
    assert_eq!(
        server
            .send_message(&Message::Ready)
            .await
            .unwrap_err()
            .to_string(),
        LinkError::NoPeer.to_string()
    );
    let big = pattern(200_000, 1);
    let sender = client.sender();
    let b = big.clone();
    let send = tokio::spawn(async move { sender.send_frame(frame(1, 9, &b), false).await });
    let m = udp_recv(&mut server).await;
    send.await.unwrap().unwrap();
    match m {
        Incoming::Data { header, payload } => {
            assert_eq!((header.stream_id, header.seq), (1, 9));
            assert!(payload[..] == big[..]);
        }
        other => panic!("{other:?}"),
    }
    let frags = 200_026usize.div_ceil(1452 - 20) as u64;
    assert_eq!(client.stats().datagrams_sent, frags);
    assert_eq!(server.stats().delivered, 1);
    // The server learned its peer and can answer.
    assert_eq!(server.peer_addr(), Some(client.local_addr().unwrap()));
    server.send_message(&Message::Ping { t1: 1 }).await.unwrap();
    assert_eq!(
        udp_recv(&mut client).await,
        Incoming::Other(OwnedMessage::Ping { t1: 1 })
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_duplicates_and_reordering_deliver_each_message_once() {
    let mut server = udp_bind("127.0.0.1:0").await.unwrap();
    let addr = server.local_addr().unwrap();
    let raw = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    raw.connect(addr).await.unwrap();

    // Three messages, fragmented in 200-byte datagrams, sent reversed and twice over.
    let msgs: Vec<Vec<u8>> = (0..3u64)
        .map(|i| {
            Message::Data {
                stream: 4,
                retransmit: false,
                more: false,
                seq: i,
                timestamp_ns: 0,
                payload: &pattern(700 + i as usize * 100, i as u8),
            }
            .emit_to_vec()
            .unwrap()
        })
        .collect();
    let mut datagrams = Vec::new();
    for (i, m) in msgs.iter().enumerate() {
        datagrams.extend(fragment(77, i as u64 + 1, &plain(m), 200).unwrap());
    }
    datagrams.reverse();
    let copy = datagrams.clone();
    datagrams.extend(copy);
    // A garbage datagram and a lone duplicate of the first fragment at the end.
    datagrams.push(bytes::Bytes::from_static(b"garbage!"));
    datagrams.push(datagrams[0].clone());
    for d in &datagrams {
        raw.send(d).await.unwrap();
    }
    // A final marker message, so we know when everything before it has been processed.
    let marker = Message::Ping { t1: 42 }.emit_to_vec().unwrap();
    raw.send(&fragment(77, 100, &plain(&marker), 200).unwrap()[0])
        .await
        .unwrap();

    let mut seqs = Vec::new();
    loop {
        match udp_recv(&mut server).await {
            Incoming::Data { header, payload } => {
                assert!(
                    payload[..] == pattern(700 + header.seq as usize * 100, header.seq as u8)[..]
                );
                seqs.push(header.seq);
            }
            Incoming::Other(OwnedMessage::Ping { t1: 42 }) => break,
            other => panic!("{other:?}"),
        }
    }
    seqs.sort_unstable();
    assert_eq!(seqs, vec![0, 1, 2]);
    let st = server.stats();
    assert_eq!(st.delivered, 4);
    assert_eq!(st.garbage, 1);
    assert!(st.duplicates >= 1, "{st:?}");
    // Fragments of the second copy: duplicates of delivered messages or of held fragments.
    assert_eq!(
        st.duplicates + st.duplicate_fragments,
        datagrams.len() as u64 / 2,
        "{st:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_memory_cap_and_stale_fragments() {
    let mut server = udp_bind("127.0.0.1:0").await.unwrap();
    server.set_reassembly(ReassemblyConfig {
        timeout: Duration::from_millis(50),
        memory_cap: 4000,
        max_message: 0,
    });
    let addr = server.local_addr().unwrap();
    let raw = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    raw.connect(addr).await.unwrap();
    // Ten incomplete messages of 1000-byte fragments: only a few fit under the cap.
    for id in 1..=10u64 {
        let frags = fragment(5, id, &pattern(3000, 0), 1020).unwrap();
        raw.send(&frags[0]).await.unwrap();
    }
    let marker = Message::Ping { t1: 1 }.emit_to_vec().unwrap();
    raw.send(&fragment(5, 50, &plain(&marker), 1020).unwrap()[0])
        .await
        .unwrap();
    assert_eq!(
        udp_recv(&mut server).await,
        Incoming::Other(OwnedMessage::Ping { t1: 1 })
    );
    assert!(server.reassembly_held_bytes() <= 4000);
    assert!(server.stats().evicted >= 6, "{:?}", server.stats());
    // After the timeout, the held fragments are dropped on the next datagram.
    let started = Instant::now();
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert!(started.elapsed() >= Duration::from_millis(50));
    let marker = Message::Ping { t1: 2 }.emit_to_vec().unwrap();
    raw.send(&fragment(5, 51, &plain(&marker), 1020).unwrap()[0])
        .await
        .unwrap();
    assert_eq!(
        udp_recv(&mut server).await,
        Incoming::Other(OwnedMessage::Ping { t1: 2 })
    );
    assert_eq!(server.reassembly_held_bytes(), 0);
    assert!(server.stats().expired >= 1, "{:?}", server.stats());
    // Fragment header of a datagram we sent is what the docs say.
    let d = &fragment(5, 51, &marker, 1020).unwrap()[0];
    let (h, body) = FragHeader::parse(d).unwrap();
    assert_eq!((h.session, h.message, h.index, h.count), (5, 51, 0, 1));
    assert_eq!(body, &marker[..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_ignores_foreign_senders_and_follows_a_restarted_peer() {
    let (mut server, client) = udp_pair().await;
    client.send_message(&Message::Ping { t1: 1 }).await.unwrap();
    udp_recv(&mut server).await;
    // Another socket with the same session id: foreign, dropped.
    let raw = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    raw.connect(server.local_addr().unwrap()).await.unwrap();
    let ping = Message::Ping { t1: 2 }.emit_to_vec().unwrap();
    raw.send(&fragment(client.session_id(), 2, &plain(&ping), 1400).unwrap()[0])
        .await
        .unwrap();
    // A restarted peer: a new session id from a new address is followed.
    let ping3 = Message::Ping { t1: 3 }.emit_to_vec().unwrap();
    raw.send(&fragment(client.session_id() ^ 1, 1, &plain(&ping3), 1400).unwrap()[0])
        .await
        .unwrap();
    assert_eq!(
        udp_recv(&mut server).await,
        Incoming::Other(OwnedMessage::Ping { t1: 3 })
    );
    assert_eq!(server.stats().foreign, 1);
    assert_eq!(server.stats().session_changes, 1);
    assert_eq!(server.peer_addr(), Some(raw.local_addr().unwrap()));
}

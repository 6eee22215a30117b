//! QUIC connection migration over loopback: the connecting side moves to a new UDP socket
//! (a new local port, as after a network change or a NAT rebinding) in the middle of a
//! transfer; the same connection carries on in both directions, without a reconnect, and
//! every reliable frame arrives once, in order, intact. The time until the listening side
//! follows the new address is printed (`--nocapture`).

use std::fs;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ndd_core::{Frame, Meta};
use ndd_link::{quic_connect, quic_listen, Identity, Incoming, QuicConn};
use ndd_wire::{CloseCode, Message, OwnedMessage};

const T: Duration = Duration::from_secs(20);
const FRAMES: u64 = 3000;
const SIZE: usize = 1000;

struct Home(PathBuf);

impl Drop for Home {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn identity(name: &str) -> (Home, Identity) {
    let dir =
        std::env::temp_dir().join(format!("ndd-quic-migration-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let (id, _) = Identity::load_or_create(&dir).unwrap();
    (Home(dir), id)
}

/// The payload of frame `seq`: different for every frame, so a duplicate, a loss or a
/// reordering cannot hide.
fn payload(seq: u64) -> Vec<u8> {
    (0..SIZE)
        .map(|i| (seq.wrapping_mul(131) as usize + i * 7) as u8 ^ (seq >> 8) as u8)
        .collect()
}

fn frame(seq: u64) -> Frame {
    Frame::new(
        Meta {
            stream: 1,
            seq,
            timestamp_ns: 1_700_000_000_000_000_000 + seq,
            flags: 0,
        },
        &payload(seq),
    )
}

async fn recv(conn: &mut QuicConn) -> Option<Incoming> {
    tokio::time::timeout(T, conn.recv())
        .await
        .expect("recv timed out")
        .unwrap()
}

/// What the listening side saw.
struct Seen {
    seqs: Vec<u64>,
    corrupt: u64,
    /// The peer's address at the first message, and when (if) it changed.
    first_addr: SocketAddr,
    addr_changed: Option<(SocketAddr, Instant)>,
    last_addr: SocketAddr,
    closed_normally: bool,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quic_client_moves_to_a_new_address_mid_transfer_and_the_connection_goes_on() {
    let (_hs, server_id) = identity("server");
    let (_hc, client_id) = identity("client");
    let listener = quic_listen("127.0.0.1:0", &server_id).await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (s, c) = tokio::join!(listener.accept(T), quic_connect(&addr, &client_id, T));
    let ((mut s, _), (mut c, _)) = (s.unwrap(), c.unwrap());
    let stable_id = (s.connection().stable_id(), c.connection().stable_id());

    s.send_message(&Message::Ready).await.unwrap();
    c.send_message(&Message::Ready).await.unwrap();
    assert_eq!(
        recv(&mut c).await,
        Some(Incoming::Other(OwnedMessage::Ready))
    );
    assert_eq!(
        recv(&mut s).await,
        Some(Incoming::Other(OwnedMessage::Ready))
    );

    // The listening side: takes everything in, answers PINGs, notes the peer's address.
    let server = tokio::spawn(async move {
        let reply = s.sender();
        let mut seen = Seen {
            seqs: Vec::new(),
            corrupt: 0,
            first_addr: s.peer_addr(),
            addr_changed: None,
            last_addr: s.peer_addr(),
            closed_normally: false,
        };
        while let Some(m) = recv(&mut s).await {
            let now = s.peer_addr();
            if now != seen.first_addr && seen.addr_changed.is_none() {
                seen.addr_changed = Some((now, Instant::now()));
            }
            seen.last_addr = now;
            match m {
                Incoming::Data { header, payload: p } => {
                    if p[..] != payload(header.seq)[..] {
                        seen.corrupt += 1;
                    }
                    seen.seqs.push(header.seq);
                }
                Incoming::Other(OwnedMessage::Ping { t1 }) => {
                    reply
                        .send_message(&Message::Pong { t1, t2: 1, t3: 2 })
                        .await
                        .unwrap();
                }
                Incoming::Other(OwnedMessage::Close { code, .. }) => {
                    seen.closed_normally = code == CloseCode::Normal;
                }
                _ => {}
            }
        }
        (s, seen)
    });

    // The connecting side: the first third, then a new socket while those frames are still in
    // flight (send_frame returns once quinn has buffered them), then the rest.
    let sender = c.sender();
    for seq in 0..FRAMES / 3 {
        sender.send_frame(frame(seq), true).await.unwrap();
    }
    let new_socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let new_addr = new_socket.local_addr().unwrap();
    let t_rebind = Instant::now();
    c.rebind(new_socket).expect("rebind the client");
    for seq in FRAMES / 3..FRAMES {
        sender.send_frame(frame(seq), true).await.unwrap();
    }
    // The listening side answers on the new path.
    sender
        .send_message(&Message::Ping { t1: 77 })
        .await
        .unwrap();
    let pong = loop {
        match recv(&mut c).await {
            Some(Incoming::Other(OwnedMessage::Pong { t1, .. })) => break t1,
            Some(_) => continue,
            None => panic!("the connection ended before the PONG"),
        }
    };
    assert_eq!(pong, 77);
    assert!(
        c.connection().close_reason().is_none(),
        "the connection failed: {:?}",
        c.connection().close_reason()
    );
    sender
        .send_message(&Message::End {
            stream: 1,
            frames: FRAMES,
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
    c.close().await;
    let (s, seen) = server.await.unwrap();

    let (moved_to, at) = seen
        .addr_changed
        .expect("the listening side never saw the new address");
    println!(
        "migrated {} -> {} after {:.1} ms; {} frames of {SIZE} B delivered",
        seen.first_addr,
        moved_to,
        (at - t_rebind).as_secs_f64() * 1e3,
        seen.seqs.len()
    );
    assert_ne!(seen.first_addr.port(), new_addr.port());
    assert_eq!(moved_to.port(), new_addr.port(), "followed the new socket");
    assert_eq!(seen.last_addr.port(), new_addr.port());
    assert_eq!(
        (s.connection().stable_id(), c.connection().stable_id()),
        stable_id,
        "one connection throughout"
    );
    assert!(
        seen.closed_normally,
        "the session ended with a normal CLOSE"
    );
    assert_eq!(seen.corrupt, 0, "corrupt frames");
    assert_eq!(
        seen.seqs,
        (0..FRAMES).collect::<Vec<_>>(),
        "every frame once, in order"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_accepted_quic_connection_cannot_rebind() {
    let (_hs, server_id) = identity("server-rebind");
    let (_hc, client_id) = identity("client-rebind");
    let listener = quic_listen("127.0.0.1:0", &server_id).await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (s, c) = tokio::join!(listener.accept(T), quic_connect(&addr, &client_id, T));
    let ((s, _), (_c, _)) = (s.unwrap(), c.unwrap());
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let e = s.rebind(sock).unwrap_err().to_string();
    assert!(e.contains("only the connecting side can rebind"), "{e}");
}

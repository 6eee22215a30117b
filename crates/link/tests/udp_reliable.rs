//! Reliable messages over UDP through a relay that loses datagrams both ways: every reliable
//! frame and session message arrives once, in order, intact; lossy frames arrive at most
//! once. The relay is a real socket pair on loopback; its losses are a fixed pattern.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ndd_core::{Frame, Meta};
use ndd_link::{udp_bind, udp_connect, Incoming, UdpLink};
use ndd_wire::{Message, OwnedMessage};
use tokio::net::UdpSocket;

/// Forwards datagrams between a client (who sends to `addr`) and `server`, dropping every
/// `every`-th datagram in each direction.
struct LossyRelay {
    addr: String,
    dropped: Arc<AtomicU64>,
}

async fn lossy_relay(server: std::net::SocketAddr, every: u64) -> LossyRelay {
    let front = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
    let back = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
    back.connect(server).await.unwrap();
    let addr = front.local_addr().unwrap().to_string();
    let dropped = Arc::new(AtomicU64::new(0));
    let client = Arc::new(tokio::sync::Mutex::new(None));
    let (f, b, c, d) = (front.clone(), back.clone(), client.clone(), dropped.clone());
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65_536];
        let mut n = 0u64;
        while let Ok((len, from)) = f.recv_from(&mut buf).await {
            *c.lock().await = Some(from);
            n += 1;
            if n.is_multiple_of(every) {
                d.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let _ = b.send(&buf[..len]).await;
        }
    });
    let d = dropped.clone();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65_536];
        let mut n = 0u64;
        while let Ok(len) = back.recv(&mut buf).await {
            n += 1;
            if n.is_multiple_of(every) {
                d.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            if let Some(to) = *client.lock().await {
                let _ = front.send_to(&buf[..len], to).await;
            }
        }
    });
    LossyRelay { addr, dropped }
}

/// Polls `link`'s receiving half (it takes acknowledgements in and runs the timers) until
/// told to stop; gives the link back.
fn drive(
    mut link: UdpLink,
) -> (
    tokio::task::JoinHandle<UdpLink>,
    tokio::sync::oneshot::Sender<()>,
) {
    let (stop, mut stopped) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = &mut stopped => return link,
                r = link.recv() => if r.is_err() { return link },
            }
        }
    });
    (task, stop)
}

fn frame(stream: u16, seq: u64, len: usize) -> Frame {
    let payload: Vec<u8> = (0..len).map(|i| (i as u64 ^ seq) as u8).collect();
    Frame::new(
        Meta {
            stream,
            seq,
            timestamp_ns: seq,
            flags: 0,
        },
        &payload,
    )
}

/// Reads `link` until `want` reliable frames and the final END arrived; returns the reliable
/// sequence numbers in arrival order and how many lossy frames came.
async fn receive(link: &mut UdpLink, want: u64) -> (Vec<u64>, u64) {
    let mut reliable = Vec::new();
    let mut lossy = 0;
    loop {
        let m = tokio::time::timeout(Duration::from_secs(20), link.recv())
            .await
            .expect("recv timed out")
            .unwrap()
            .unwrap();
        match m {
            Incoming::Data { header, payload } => {
                let expect = frame(header.stream_id, header.seq, payload.len());
                assert!(
                    payload[..] == expect.payload()[..],
                    "frame {} intact",
                    header.seq
                );
                match header.stream_id {
                    1 => reliable.push(header.seq),
                    _ => lossy += 1,
                }
            }
            Incoming::Other(OwnedMessage::End { stream: 1, frames }) => {
                assert_eq!(frames, want);
                return (reliable, lossy);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reliable_frames_survive_a_tenth_of_datagrams_lost_each_way() {
    let mut server = udp_bind("127.0.0.1:0").await.unwrap();
    let relay = lossy_relay(server.local_addr().unwrap(), 10).await;
    let client = udp_connect(&relay.addr).await.unwrap();
    let sender = client.sender();
    // The client's receiving half takes the acknowledgements in and runs the timers.
    let (client_rx, stop) = drive(client);
    const N: u64 = 3000;
    let send = tokio::spawn(async move {
        for seq in 0..N {
            // Mostly small input-like frames; every 50th is 6 KB (five fragments).
            let len = if seq % 50 == 0 { 6000 } else { 64 };
            sender.send_frame(frame(1, seq, len), true).await.unwrap();
            sender.send_frame(frame(2, seq, 64), false).await.unwrap();
            if seq % 100 == 0 {
                tokio::task::yield_now().await;
            }
        }
        sender
            .send_message(&Message::End {
                stream: 1,
                frames: N,
            })
            .await
            .unwrap();
    });
    let (reliable, lossy) = receive(&mut server, N).await;
    send.await.unwrap();
    assert_eq!(
        reliable,
        (0..N).collect::<Vec<_>>(),
        "every reliable frame once, in order"
    );
    assert!(lossy < N, "lossy frames are not sent again: {lossy} of {N}");
    let dropped = relay.dropped.load(Ordering::Relaxed);
    assert!(dropped > 300, "the relay lost {dropped} datagrams");
    let st = server.stats();
    let _ = stop.send(());
    let cst = client_rx.await.unwrap().stats();
    println!("relay dropped {dropped}; lossy {lossy}/{N}; server {st:?}; client {cst:?}");
    assert!(st.out_of_order > 0, "gaps were seen and filled: {st:?}");
    assert!(cst.retransmitted > 0, "{cst:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_last_message_is_sent_again_by_the_timer() {
    // Every second datagram lost: the last message's first copy may be the lost one, and no
    // later message reveals the gap; only a timer (the tail loss probe or the retransmission
    // timer) brings it.
    let mut server = udp_bind("127.0.0.1:0").await.unwrap();
    let relay = lossy_relay(server.local_addr().unwrap(), 2).await;
    let client = udp_connect(&relay.addr).await.unwrap();
    let sender = client.sender();
    let (client_rx, stop) = drive(client);
    for seq in 0..20 {
        sender.send_frame(frame(1, seq, 100), true).await.unwrap();
    }
    sender
        .send_message(&Message::End {
            stream: 1,
            frames: 20,
        })
        .await
        .unwrap();
    let (reliable, _) = receive(&mut server, 20).await;
    assert_eq!(reliable, (0..20).collect::<Vec<_>>());
    let _ = stop.send(());
    let cst = client_rx.await.unwrap().stats();
    assert!(
        cst.retransmit_timeouts + cst.tail_probes > 0,
        "a timer sent something again: {cst:?}"
    );
}

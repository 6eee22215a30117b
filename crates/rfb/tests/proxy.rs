//! The accelerator against an in-process fake RFB server: encodings rewritten, requests
//! pipelined, input forwarded, a malformed session closed without disturbing the others.

use std::time::Duration;

use ndd_rfb::client::{emit_set_encodings, ClientMsg, ClientStream};
use ndd_rfb::{serve_accel, AccelOptions, PixelFormat, UpdateRequest};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

const T: Duration = Duration::from_secs(10);

/// A server that answers every FramebufferUpdateRequest at once with a 1x1 Raw update and
/// reports every client message it receives.
async fn fake_server(listener: TcpListener, seen: mpsc::UnboundedSender<ClientMsg>) {
    while let Ok((mut s, _)) = listener.accept().await {
        let seen = seen.clone();
        tokio::spawn(async move {
            let mut b = [0u8; 12];
            s.write_all(b"RFB 003.008\n").await?;
            s.read_exact(&mut b).await?;
            s.write_all(&[1, 1]).await?;
            s.read_exact(&mut b[..1]).await?;
            s.write_all(&[0, 0, 0, 0]).await?;
            s.read_exact(&mut b[..1]).await?;
            let mut init = vec![2, 128, 1, 224];
            init.extend_from_slice(&PixelFormat::default().emit());
            init.extend_from_slice(&4u32.to_be_bytes());
            init.extend_from_slice(b"fake");
            s.write_all(&init).await?;
            let mut cs = ClientStream::new(1 << 20);
            let mut buf = vec![0u8; 4096];
            loop {
                let n = s.read(&mut buf).await?;
                if n == 0 {
                    return Ok::<_, std::io::Error>(());
                }
                let mut msgs = Vec::new();
                if cs.feed(&buf[..n], &mut msgs).is_err() {
                    return Ok(());
                }
                for m in msgs {
                    if let ClientMsg::UpdateRequest(_) = m.msg {
                        s.write_all(&[0, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 9, 9, 9, 9])
                            .await?;
                    }
                    let _ = seen.send(m.msg);
                }
            }
        });
    }
}

async fn connect(addr: std::net::SocketAddr) -> TcpStream {
    let mut c = TcpStream::connect(addr).await.unwrap();
    let mut b = [0u8; 64];
    c.read_exact(&mut b[..12]).await.unwrap();
    assert_eq!(&b[..12], b"RFB 003.008\n");
    c.write_all(b"RFB 003.008\n").await.unwrap();
    c.read_exact(&mut b[..2]).await.unwrap();
    assert_eq!(&b[..2], &[1, 1]);
    c.write_all(&[1]).await.unwrap();
    c.read_exact(&mut b[..4]).await.unwrap();
    c.write_all(&[1]).await.unwrap();
    c.read_exact(&mut b[..28]).await.unwrap();
    assert_eq!(&b[24..28], b"fake");
    c
}

async fn read_update(c: &mut TcpStream) {
    let mut u = [0u8; 20];
    tokio::time::timeout(T, c.read_exact(&mut u))
        .await
        .expect("update in time")
        .unwrap();
    assert_eq!(u[0], 0);
}

async fn setup() -> (std::net::SocketAddr, mpsc::UnboundedReceiver<ClientMsg>) {
    let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server_addr = server.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(fake_server(server, tx));
    let accel = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = accel.local_addr().unwrap();
    tokio::spawn(serve_accel(
        accel,
        server_addr.to_string(),
        AccelOptions::default(),
    ));
    (addr, rx)
}

async fn next_msg(rx: &mut mpsc::UnboundedReceiver<ClientMsg>) -> ClientMsg {
    tokio::time::timeout(T, rx.recv())
        .await
        .expect("message in time")
        .unwrap()
}

#[tokio::test]
async fn rewrites_encodings_pipelines_requests_and_forwards_input() {
    let (addr, mut rx) = setup().await;
    let mut c = connect(addr).await;
    // Zlib (6) and an unknown encoding (99) cannot be delimited: dropped.
    c.write_all(&emit_set_encodings(&[6, 0, 99, -239, -313]))
        .await
        .unwrap();
    let full = UpdateRequest {
        incremental: false,
        x: 0,
        y: 0,
        w: 640,
        h: 480,
    };
    c.write_all(&full.emit()).await.unwrap();
    assert_eq!(
        next_msg(&mut rx).await,
        ClientMsg::SetEncodings(vec![0, -239, -313])
    );
    assert_eq!(next_msg(&mut rx).await, ClientMsg::UpdateRequest(full));
    read_update(&mut c).await;
    // The client sends no further request, yet updates keep coming: the accelerator re-sends
    // the client's request as an incremental one.
    for _ in 0..5 {
        read_update(&mut c).await;
        assert_eq!(
            next_msg(&mut rx).await,
            ClientMsg::UpdateRequest(UpdateRequest {
                incremental: true,
                ..full
            })
        );
    }
    // Input goes through at once, even while updates stream.
    c.write_all(&[4, 1, 0, 0, 0, 0, 0, 0x61]).await.unwrap();
    loop {
        match next_msg(&mut rx).await {
            ClientMsg::UpdateRequest(_) => continue,
            m => {
                assert_eq!(m, ClientMsg::KeyEvent);
                break;
            }
        }
    }
}

#[tokio::test]
async fn malformed_client_closes_only_its_session() {
    let (addr, _rx) = setup().await;
    let mut good = connect(addr).await;
    let mut bad = connect(addr).await;
    bad.write_all(&[77, 1, 2, 3]).await.unwrap();
    let mut b = [0u8; 16];
    let n = tokio::time::timeout(T, bad.read(&mut b))
        .await
        .expect("closed in time");
    assert!(matches!(n, Ok(0) | Err(_)), "the bad session is closed");
    let req = UpdateRequest {
        incremental: true,
        x: 0,
        y: 0,
        w: 640,
        h: 480,
    };
    good.write_all(&req.emit()).await.unwrap();
    read_update(&mut good).await;
    read_update(&mut good).await;
}

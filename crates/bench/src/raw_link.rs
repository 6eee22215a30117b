//! Raw throughput baselines over loopback, for `ndd bench`: what the plain sockets give on
//! this machine, measured in the same run as the links (DESIGN.md §7).
//!
//! No assertion on speed lives here or in tests; these only measure.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

use ndd_link::udp::MAX_UDP_PAYLOAD;
use ndd_link::{LinkError, Result};

/// How long the UDP receiver waits for one more datagram before it counts the rest as lost.
const UDP_IDLE: Duration = Duration::from_millis(200);

/// The result of one raw throughput run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Throughput {
    /// Frame (write or datagram) size.
    pub frame_size: usize,
    /// Frames sent.
    pub frames_sent: u64,
    /// Frames received (UDP may lose some; TCP receives all).
    pub frames_received: u64,
    /// Payload bytes received.
    pub bytes_received: u64,
    /// From the first send to the last byte received.
    pub elapsed: Duration,
}

impl Throughput {
    /// Received payload bytes per second.
    pub fn bytes_per_sec(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 {
            self.bytes_received as f64 / secs
        } else {
            0.0
        }
    }

    /// Fraction of frames lost (0 for TCP).
    pub fn loss(&self) -> f64 {
        if self.frames_sent == 0 {
            return 0.0;
        }
        1.0 - self.frames_received as f64 / self.frames_sent as f64
    }
}

impl Throughput {
    /// A byte-stream run: `got` bytes of `count` writes of `frame_size` in `elapsed`.
    fn stream(frame_size: usize, count: u64, got: u64, elapsed: Duration) -> Throughput {
        Throughput {
            frame_size,
            frames_sent: count,
            frames_received: if frame_size == 0 {
                count
            } else {
                got / frame_size as u64
            },
            bytes_received: got,
            elapsed,
        }
    }
}

/// Two throwaway identities (server, client) for a baseline run; nothing stays on disk.
fn throwaway_identities(tag: &str) -> Result<(ndd_link::Identity, ndd_link::Identity)> {
    let dir = std::env::temp_dir().join(format!(
        "ndd-bench-{tag}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    let ids = (
        ndd_link::Identity::create(&dir.join("server"), true),
        ndd_link::Identity::create(&dir.join("client"), true),
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok((ids.0?, ids.1?))
}

/// Send `count` writes of `frame_size` bytes over a loopback TLS 1.3 connection — rustls
/// with the same configuration ndd's TLS link uses (two throwaway identities, mutual
/// authentication, ring), but no ndd framing, session or tasks — and time until the receiver
/// has them all: the mechanism ndd's TLS link is built on.
pub async fn raw_tls_throughput(frame_size: usize, count: u64) -> Result<Throughput> {
    let (server, client) = throwaway_identities("tls")?;
    let (server, client) = (ndd_link::Tls::new(server)?, ndd_link::Tls::new(client)?);
    let listener = ndd_link::listen("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let total = frame_size as u64 * count;
    let reader = tokio::spawn(async move {
        let (mut s, _) = listener
            .accept(Some(&server.server), Duration::from_secs(10))
            .await?;
        let mut buf = vec![0u8; 256 * 1024];
        let mut got = 0u64;
        while got < total {
            let n = s.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            got += n as u64;
        }
        Ok::<_, LinkError>((got, Instant::now()))
    });
    let (mut s, _) = ndd_link::connect(
        &addr.to_string(),
        Some(&client.client),
        Duration::from_secs(10),
    )
    .await?;
    let frame = vec![0x5au8; frame_size];
    let start = Instant::now();
    for _ in 0..count {
        s.write_all(&frame).await?;
    }
    s.flush().await?;
    let (got, end) = reader
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))??;
    Ok(Throughput::stream(
        frame_size,
        count,
        got,
        end.saturating_duration_since(start),
    ))
}

/// Raw TLS 1.3 ping-pong over loopback (rustls with ndd's configuration and identities, no
/// ndd framing, session or tasks): `n` round trips of `size` bytes each way; each RTT / 2 in
/// nanoseconds, the baseline of the TLS link's one-way time.
pub async fn raw_tls_one_way_ns(size: usize, n: usize) -> Result<Vec<u64>> {
    let (server, client) = throwaway_identities("tls-rtt")?;
    let (server, client) = (ndd_link::Tls::new(server)?, ndd_link::Tls::new(client)?);
    let listener = ndd_link::listen("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let echo = tokio::spawn(async move {
        let (mut s, _) = listener
            .accept(Some(&server.server), Duration::from_secs(10))
            .await?;
        let mut buf = vec![0u8; size];
        for _ in 0..n {
            s.read_exact(&mut buf).await?;
            s.write_all(&buf).await?;
            s.flush().await?;
        }
        Ok::<_, LinkError>(())
    });
    let (mut s, _) = ndd_link::connect(
        &addr.to_string(),
        Some(&client.client),
        Duration::from_secs(10),
    )
    .await?;
    let mut buf = vec![7u8; size];
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        s.write_all(&buf).await?;
        s.flush().await?;
        s.read_exact(&mut buf).await?;
        out.push((t.elapsed().as_nanos() as u64 / 2).max(1));
    }
    echo.await
        .map_err(|e| std::io::Error::other(e.to_string()))??;
    Ok(out)
}

/// A TCP listener on a free loopback port.
async fn loopback_listener() -> Result<TcpListener> {
    TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|source| LinkError::Bind {
            addr: "127.0.0.1:0".to_owned(),
            source,
        })
}

/// A plain TCP connection to `addr`.
async fn connect_to(addr: SocketAddr) -> Result<TcpStream> {
    TcpStream::connect(addr)
        .await
        .map_err(|source| LinkError::Connect {
            addr: addr.to_string(),
            source,
        })
}

/// One message every `period` from a sender task to a receiver task over `w` → `r` (each
/// message `size` bytes, at least 8, its first 8 the send time in ns since `base`); the
/// receiver's arrival time minus the send time, per message, in ns. Both tasks run on the
/// caller's runtime, as ndd's source, session and sink tasks do: the like-for-like baseline of
/// a paced one-way time (threads idle between messages, as they are under ndd).
async fn paced_one_way_ns<W, R>(
    mut w: W,
    mut r: R,
    size: usize,
    n: usize,
    period: Duration,
) -> Result<Vec<u64>>
where
    W: tokio::io::AsyncWrite + Unpin + Send + 'static,
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
{
    let size = size.max(8);
    let base = Instant::now();
    let receiver = tokio::spawn(async move {
        let mut buf = vec![0u8; size];
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            r.read_exact(&mut buf).await?;
            let now = base.elapsed().as_nanos() as u64;
            let sent = u64::from_le_bytes(buf[..8].try_into().expect("8 bytes"));
            out.push(now.saturating_sub(sent).max(1));
        }
        Ok::<_, std::io::Error>(out)
    });
    let mut msg = vec![0x5au8; size];
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    for _ in 0..n {
        tick.tick().await;
        msg[..8].copy_from_slice(&(base.elapsed().as_nanos() as u64).to_le_bytes());
        w.write_all(&msg).await?;
        w.flush().await?;
    }
    let out = receiver
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))??;
    drop(w);
    Ok(out)
}

/// Raw TCP over loopback, paced: one `size`-byte write every `period` (`TCP_NODELAY`), one-way
/// time per message in ns (see [`paced_one_way_ns`]).
pub async fn raw_tcp_paced_one_way_ns(size: usize, n: usize, period: Duration) -> Result<Vec<u64>> {
    let listener = loopback_listener().await?;
    let addr = listener.local_addr()?;
    let accept = tokio::spawn(async move { listener.accept().await });
    let s = connect_to(addr).await?;
    s.set_nodelay(true)?;
    let (r, _) = accept
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))??;
    r.set_nodelay(true)?;
    paced_one_way_ns(s, r, size, n, period).await
}

/// Raw TLS 1.3 over loopback (rustls with ndd's configuration, as [`raw_tls_throughput`]),
/// paced: one `size`-byte write and flush every `period`, one-way time per message in ns.
pub async fn raw_tls_paced_one_way_ns(size: usize, n: usize, period: Duration) -> Result<Vec<u64>> {
    let (server, client) = throwaway_identities("tls-paced")?;
    let (server, client) = (ndd_link::Tls::new(server)?, ndd_link::Tls::new(client)?);
    let listener = ndd_link::listen("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let accept = tokio::spawn(async move {
        listener
            .accept(Some(&server.server), Duration::from_secs(10))
            .await
    });
    let (s, _) = ndd_link::connect(
        &addr.to_string(),
        Some(&client.client),
        Duration::from_secs(10),
    )
    .await?;
    let (r, _) = accept
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))??;
    paced_one_way_ns(s, r, size, n, period).await
}

/// Send `count` writes of `frame_size` bytes on one raw quinn stream over loopback — quinn
/// with ndd's QUIC configuration (same identities, rustls, transport settings) but no ndd
/// framing, session or tasks on the stream — and time until the receiver has them all.
pub async fn raw_quic_throughput(frame_size: usize, count: u64) -> Result<Throughput> {
    let (server_id, client_id) = throwaway_identities("quic")?;
    let listener = ndd_link::quic_listen("127.0.0.1:0", &server_id).await?;
    let addr = listener.local_addr()?;
    let total = frame_size as u64 * count;
    let reader = tokio::spawn(async move {
        let conn = listener
            .accept_incoming()
            .await?
            .await
            .map_err(|e| LinkError::QuicConfig(format!("raw QUIC accept: {e}")))?;
        // The connecting side is ndd's QUIC connection, which opens its session stream
        // first (stream ids come in order): skip it, read the raw stream after it.
        let mut rx = None;
        for _ in 0..2 {
            rx = Some(
                conn.accept_uni()
                    .await
                    .map_err(|e| LinkError::QuicConfig(format!("raw QUIC stream: {e}")))?,
            );
        }
        let mut rx = rx.ok_or(LinkError::Closed)?;
        let mut buf = vec![0u8; 256 * 1024];
        let mut got = 0u64;
        while got < total {
            match rx.read(&mut buf).await {
                Ok(Some(n)) => got += n as u64,
                Ok(None) => break,
                Err(e) => return Err(LinkError::QuicConfig(format!("raw QUIC read: {e}"))),
            }
        }
        Ok::<_, LinkError>((got, Instant::now(), conn))
    });
    let (client, _) =
        ndd_link::quic_connect(&addr.to_string(), &client_id, Duration::from_secs(10)).await?;
    let mut tx = client
        .connection()
        .open_uni()
        .await
        .map_err(|e| LinkError::QuicConfig(format!("raw QUIC open: {e}")))?;
    let frame = vec![0x5au8; frame_size];
    let start = Instant::now();
    for _ in 0..count {
        tx.write_all(&frame).await?;
    }
    let _ = tx.finish();
    let (got, end, _conn) = reader
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))??;
    Ok(Throughput::stream(
        frame_size,
        count,
        got,
        end.saturating_duration_since(start),
    ))
}

/// Send `count` writes of `frame_size` bytes over a plain loopback TCP connection and time
/// until the receiver has them all.
pub async fn raw_tcp_throughput(frame_size: usize, count: u64) -> Result<Throughput> {
    let listener = loopback_listener().await?;
    let addr = listener.local_addr()?;
    let total = frame_size as u64 * count;
    let reader = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await?;
        let mut buf = vec![0u8; 256 * 1024];
        let mut got = 0u64;
        while got < total {
            let n = s.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            got += n as u64;
        }
        Ok::<_, std::io::Error>((got, Instant::now()))
    });
    let mut s = connect_to(addr).await?;
    s.set_nodelay(true)?;
    let frame = vec![0x5au8; frame_size];
    let start = Instant::now();
    for _ in 0..count {
        s.write_all(&frame).await?;
    }
    s.shutdown().await?;
    let (got, end) = reader
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))??;
    Ok(Throughput::stream(
        frame_size,
        count,
        got,
        end.saturating_duration_since(start),
    ))
}

/// Send `count` datagrams of `frame_size` bytes (at most 65507) over loopback UDP, with no
/// pacing, and time until the last one arrives; losses are counted, not retried.
pub async fn raw_udp_throughput(frame_size: usize, count: u64) -> Result<Throughput> {
    let frame_size = frame_size.min(MAX_UDP_PAYLOAD);
    let rx = UdpSocket::bind("127.0.0.1:0")
        .await
        .map_err(|source| LinkError::Bind {
            addr: "127.0.0.1:0".to_owned(),
            source,
        })?;
    let _ = socket2::SockRef::from(&rx).set_recv_buffer_size(8 * 1024 * 1024);
    let addr: SocketAddr = rx.local_addr()?;
    let reader = tokio::spawn(async move {
        let mut buf = vec![0u8; MAX_UDP_PAYLOAD + 1];
        let (mut frames, mut bytes) = (0u64, 0u64);
        let mut last = Instant::now();
        while frames < count {
            match tokio::time::timeout(UDP_IDLE, rx.recv(&mut buf)).await {
                Ok(Ok(n)) => {
                    frames += 1;
                    bytes += n as u64;
                    last = Instant::now();
                }
                Ok(Err(e)) => return Err(e),
                Err(_) => break,
            }
        }
        Ok((frames, bytes, last))
    });
    let tx = UdpSocket::bind("127.0.0.1:0")
        .await
        .map_err(|source| LinkError::Bind {
            addr: "127.0.0.1:0".to_owned(),
            source,
        })?;
    tx.connect(addr).await?;
    let frame = vec![0xa5u8; frame_size];
    let start = Instant::now();
    for _ in 0..count {
        tx.send(&frame).await?;
    }
    let (frames, bytes, last) = reader
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))??;
    Ok(Throughput {
        frame_size,
        frames_sent: count,
        frames_received: frames,
        bytes_received: bytes,
        elapsed: last.saturating_duration_since(start),
    })
}

#[cfg(test)]
mod tests {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn raw_throughput_baselines_run() {
        let tcp = super::raw_tcp_throughput(64 * 1024, 64).await.unwrap();
        assert_eq!(tcp.frames_received, 64);
        assert_eq!(tcp.bytes_received, 64 * 64 * 1024);
        assert!(tcp.bytes_per_sec() > 0.0);
        let tls = super::raw_tls_throughput(64 * 1024, 64).await.unwrap();
        assert_eq!(tls.bytes_received, 64 * 64 * 1024, "every byte through TLS");
        let quic = super::raw_quic_throughput(64 * 1024, 64).await.unwrap();
        assert_eq!(
            quic.bytes_received,
            64 * 64 * 1024,
            "every byte through QUIC"
        );
        let udp = super::raw_udp_throughput(1400, 200).await.unwrap();
        assert!(udp.frames_received <= 200 && udp.frames_received > 0);
        assert!((0.0..=1.0).contains(&udp.loss()));
    }
}

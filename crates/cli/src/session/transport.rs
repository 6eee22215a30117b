//! The three links behind one face: TCP (plain or TLS) with a byte-stream reader and writer,
//! QUIC (a stream per reliable ndd stream, datagrams for lossy ones) and UDP (datagrams,
//! fragmented). The session reads with [`Rx`] on its reader task and writes with [`Tx`].

use bytes::Bytes;
use ndd_core::{Frame, Meta};
use ndd_link::{
    Incoming, LinkError, MessageReader, MessageWriter, QuicConn, QuicSender, UdpLink, UdpSender,
};
use ndd_wire::{DataHeader, Message, FLAG_RETRANSMIT};

/// Which link a side uses (`[link] transport`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum TransportKind {
    /// TCP, with TLS 1.3 unless `insecure`.
    #[default]
    Tcp,
    /// QUIC (always TLS 1.3, same identities).
    Quic,
    /// Plain UDP datagrams: no retransmission, no encryption (use the `encrypt` pair).
    Udp,
}

impl std::fmt::Display for TransportKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TransportKind::Tcp => "tcp",
            TransportKind::Quic => "quic",
            TransportKind::Udp => "udp",
        })
    }
}

/// The receiving half of a connection.
pub(super) enum Rx {
    Tcp(MessageReader),
    Quic(QuicConn),
    Udp(UdpLink),
}

impl Rx {
    pub(super) async fn read(&mut self) -> Result<Option<Incoming>, LinkError> {
        match self {
            Rx::Tcp(r) => r.read().await,
            Rx::Quic(c) => c.recv().await,
            Rx::Udp(u) => u.recv().await,
        }
    }

    pub(super) fn set_max_body(&mut self, max: u32) {
        match self {
            Rx::Tcp(r) => r.set_max_body(max),
            Rx::Quic(c) => c.set_max_body(max),
            Rx::Udp(u) => u.set_max_body(max),
        }
    }
}

/// The sending half of a connection.
pub(super) enum Tx {
    Tcp(MessageWriter),
    Quic(QuicSender),
    Udp(UdpSender),
}

impl Tx {
    pub(super) async fn write_message(&mut self, m: &Message<'_>) -> Result<(), LinkError> {
        match self {
            Tx::Tcp(w) => w.write_message(m).await,
            Tx::Quic(s) => s.send_message(m).await,
            Tx::Udp(s) => s.send_message(m).await,
        }
    }

    /// One DATA message. On TCP it goes in line with everything else; QUIC puts a reliable
    /// stream's frames on that stream's own QUIC stream and a lossy stream's in datagrams; UDP
    /// sends datagrams either way.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn write_data(
        &mut self,
        stream: u16,
        retransmit: bool,
        seq: u64,
        timestamp_ns: u64,
        payload: &Bytes,
        reliable: bool,
    ) -> Result<(), LinkError> {
        match self {
            Tx::Tcp(w) => {
                let header = DataHeader {
                    stream_id: stream,
                    retransmit,
                    seq,
                    timestamp_ns,
                };
                w.write_data(&header, payload).await
            }
            Tx::Quic(_) | Tx::Udp(_) => {
                let flags = if retransmit { FLAG_RETRANSMIT } else { 0 };
                let frame = Frame::from_bytes(
                    Meta {
                        stream,
                        seq,
                        timestamp_ns,
                        flags,
                    },
                    payload.clone(),
                );
                match self {
                    Tx::Quic(s) => s.send_frame(frame, reliable).await,
                    Tx::Udp(s) => s.send_frame(frame, reliable).await,
                    Tx::Tcp(_) => unreachable!("matched above"),
                }
            }
        }
    }

    pub(super) async fn flush(&mut self) -> Result<(), LinkError> {
        match self {
            Tx::Tcp(w) => w.flush().await,
            Tx::Quic(_) | Tx::Udp(_) => Ok(()),
        }
    }

    pub(super) async fn shutdown(&mut self) -> Result<(), LinkError> {
        match self {
            Tx::Tcp(w) => w.shutdown().await,
            Tx::Quic(s) => s.shutdown().await,
            Tx::Udp(_) => Ok(()),
        }
    }

    pub(super) fn set_peer_max_body(&mut self, max: u32) {
        match self {
            Tx::Tcp(w) => w.set_peer_max_body(max),
            Tx::Quic(s) => s.set_peer_max_body(max),
            Tx::Udp(s) => s.set_peer_max_body(max),
        }
    }
}

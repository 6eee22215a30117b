//! [`Message`]: any one message on a link, parsed or to be emitted.

use crate::data::{body_len_u32, check_stream, data_flags, DataHeader};
use crate::header::{self, HEADER_LEN};
use crate::hello::Repr as HelloRepr;
use crate::{
    ack, close, control, data, delivered, end, hello, ping, pong, resume, CloseCode, Kind, Result,
    WireError,
};

/// One message, borrowing its variable-length parts from the buffer it was parsed from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Message<'a> {
    /// A frame of a stream.
    Data {
        /// Stream id (≠ 0).
        stream: u16,
        /// Flag bit 0: resent after a reconnect.
        retransmit: bool,
        /// Flag bit 1: a chunk of a frame that goes on in the stream's next DATA message.
        more: bool,
        /// Sequence number.
        seq: u64,
        /// Source clock, ns since the Unix epoch.
        timestamp_ns: u64,
        /// Payload.
        payload: &'a [u8],
    },
    /// A control message for the half of pair `layer` of `stream` on the receiving side.
    Control {
        /// Target stream (≠ 0).
        stream: u16,
        /// Layer index (0 = first pair as written).
        layer: u8,
        /// Control message bytes.
        msg: &'a [u8],
    },
    /// Handshake: the sender's plan.
    Hello(HelloRepr),
    /// Handshake: the sender agrees with the peer's HELLO.
    Ready,
    /// The sender closes the session.
    Close {
        /// Why.
        code: CloseCode,
        /// Text for the user.
        reason: &'a str,
    },
    /// Clock/liveness probe.
    Ping {
        /// Sender's clock.
        t1: u64,
    },
    /// Answer to a PING.
    Pong {
        /// Echoed PING time.
        t1: u64,
        /// PING arrival (responder's clock).
        t2: u64,
        /// PONG send (responder's clock).
        t3: u64,
    },
    /// Highest sequence delivered in order on a stream.
    Ack {
        /// Stream id (≠ 0).
        stream: u16,
        /// Sequence.
        seq: u64,
    },
    /// The sender's source of a stream has ended.
    End {
        /// Stream id (≠ 0).
        stream: u16,
        /// DATA messages the sender sent on the stream.
        frames: u64,
    },
    /// Highest endpoint sequence the sender's sink has completed on a stream.
    Delivered {
        /// Stream id (≠ 0).
        stream: u16,
        /// Endpoint sequence.
        seq: u64,
    },
    /// After a (re)connect: the sender's process-run id.
    Resume {
        /// Random, fixed for the sender's process lifetime.
        instance: u64,
    },
}

const SESSION_STREAM: &str =
    "session-level message (HELLO, READY, CLOSE, PING, PONG) with a nonzero stream id";

impl<'a> Message<'a> {
    /// Parse exactly one message at the start of `buf`, returning it and the number of bytes
    /// it occupies. Bytes after it are not looked at.
    ///
    /// Checks, in order: version (`UnknownVersion`, from byte 0 alone), body length against
    /// `max_body` (`TooLong`), kind (`UnknownKind`), completeness (`Truncated`: read more),
    /// then the kind's body rules. Unknown flag bits are ignored.
    pub fn parse(buf: &'a [u8], max_body: u32) -> Result<(Message<'a>, usize)> {
        let (prefix, body, total) = header::split(buf, max_body)?;
        let msg = Self::from_parts(&prefix, body)?;
        Ok((msg, total))
    }

    fn from_parts(prefix: &header::Repr, body: &'a [u8]) -> Result<Message<'a>> {
        let stream = prefix.stream_id;
        if !prefix.kind.is_stream_level() && stream != 0 {
            return Err(WireError::Malformed(SESSION_STREAM));
        }
        Ok(match prefix.kind {
            Kind::Data => {
                let (h, payload) = DataHeader::from_parts(prefix, body)?;
                Message::Data {
                    stream: h.stream_id,
                    retransmit: h.retransmit,
                    more: h.more,
                    seq: h.seq,
                    timestamp_ns: h.timestamp_ns,
                    payload,
                }
            }
            Kind::Control => {
                check_stream(Kind::Control, stream)?;
                let r = control::Repr::parse(&control::Packet::new_unchecked(body))?;
                Message::Control {
                    stream,
                    layer: r.layer,
                    msg: r.msg,
                }
            }
            Kind::Hello => Message::Hello(HelloRepr::parse(&hello::Packet::new_unchecked(body))?),
            Kind::Ready => {
                crate::cursor::exact(body.len(), 0)?;
                Message::Ready
            }
            Kind::Close => {
                let r = close::Repr::parse(&close::Packet::new_unchecked(body))?;
                Message::Close {
                    code: r.code,
                    reason: r.reason,
                }
            }
            Kind::Ping => {
                let r = ping::Repr::parse(&ping::Packet::new_unchecked(body))?;
                Message::Ping { t1: r.t1 }
            }
            Kind::Pong => {
                let r = pong::Repr::parse(&pong::Packet::new_unchecked(body))?;
                Message::Pong {
                    t1: r.t1,
                    t2: r.t2,
                    t3: r.t3,
                }
            }
            Kind::Ack => {
                check_stream(Kind::Ack, stream)?;
                let r = ack::Repr::parse(&ack::Packet::new_unchecked(body))?;
                Message::Ack { stream, seq: r.seq }
            }
            Kind::End => {
                check_stream(Kind::End, stream)?;
                let r = end::Repr::parse(&end::Packet::new_unchecked(body))?;
                Message::End {
                    stream,
                    frames: r.frames,
                }
            }
            Kind::Delivered => {
                check_stream(Kind::Delivered, stream)?;
                let r = delivered::Repr::parse(&delivered::Packet::new_unchecked(body))?;
                Message::Delivered { stream, seq: r.seq }
            }
            Kind::Resume => {
                let r = resume::Repr::parse(&resume::Packet::new_unchecked(body))?;
                Message::Resume {
                    instance: r.instance,
                }
            }
        })
    }

    /// The message's kind.
    pub const fn kind(&self) -> Kind {
        match self {
            Message::Data { .. } => Kind::Data,
            Message::Control { .. } => Kind::Control,
            Message::Hello(_) => Kind::Hello,
            Message::Ready => Kind::Ready,
            Message::Close { .. } => Kind::Close,
            Message::Ping { .. } => Kind::Ping,
            Message::Pong { .. } => Kind::Pong,
            Message::Ack { .. } => Kind::Ack,
            Message::End { .. } => Kind::End,
            Message::Resume { .. } => Kind::Resume,
            Message::Delivered { .. } => Kind::Delivered,
        }
    }

    /// Stream id written in the prefix (0 for session-level messages).
    pub const fn stream_id(&self) -> u16 {
        match self {
            Message::Data { stream, .. }
            | Message::Control { stream, .. }
            | Message::Ack { stream, .. }
            | Message::End { stream, .. }
            | Message::Delivered { stream, .. } => *stream,
            _ => 0,
        }
    }

    /// Flags written in the prefix.
    pub const fn flags(&self) -> u16 {
        match self {
            Message::Data {
                retransmit, more, ..
            } => data_flags(*retransmit, *more),
            _ => 0,
        }
    }

    /// Body length (bytes after the prefix).
    pub fn body_len(&self) -> usize {
        match self {
            Message::Data { payload, .. } => data::BODY_MIN_LEN + payload.len(),
            Message::Control { msg, .. } => control::BODY_MIN_LEN + msg.len(),
            Message::Hello(h) => h.buffer_len(),
            Message::Ready => 0,
            Message::Close { reason, .. } => close::BODY_MIN_LEN + reason.len(),
            Message::Ping { .. } => ping::BODY_LEN,
            Message::Pong { .. } => pong::BODY_LEN,
            Message::Ack { .. } => ack::BODY_LEN,
            Message::End { .. } => end::BODY_LEN,
            Message::Resume { .. } => resume::BODY_LEN,
            Message::Delivered { .. } => delivered::BODY_LEN,
        }
    }

    /// Whole message length: prefix + body.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN.saturating_add(self.body_len())
    }

    /// Write the message into the start of `out`, returning the bytes written
    /// ([`Message::buffer_len`]).
    ///
    /// Errors: `BufferTooSmall`; `TooLong` if the body does not fit the 32-bit length field;
    /// for a message [`Message::parse`] would reject (stream id 0 on DATA/CONTROL/ACK, an
    /// invalid HELLO), the same error parsing would give.
    pub fn emit(&self, out: &mut [u8]) -> Result<usize> {
        let body_len = body_len_u32(self.body_len() as u64)?;
        let total = self.buffer_len();
        crate::cursor::need(out, total)?;
        if self.kind().is_stream_level() {
            check_stream(self.kind(), self.stream_id())?;
        }
        if let Message::Hello(h) = self {
            h.validate()?;
        }
        let (prefix, body) = out.split_at_mut(HEADER_LEN);
        header::Repr {
            kind: self.kind(),
            flags: self.flags(),
            stream_id: self.stream_id(),
            body_len,
        }
        .emit(&mut header::Packet::new_unchecked(prefix))?;
        let body = &mut body[..total - HEADER_LEN];
        match *self {
            Message::Data {
                seq,
                timestamp_ns,
                payload,
                ..
            } => data::Repr {
                seq,
                timestamp_ns,
                payload,
            }
            .emit(&mut data::Packet::new_unchecked(body)),
            Message::Control { layer, msg, .. } => {
                control::Repr { layer, msg }.emit(&mut control::Packet::new_unchecked(body))
            }
            Message::Hello(ref h) => h.emit(&mut hello::Packet::new_unchecked(body)),
            Message::Ready => Ok(()),
            Message::Close { code, reason } => {
                close::Repr { code, reason }.emit(&mut close::Packet::new_unchecked(body))
            }
            Message::Ping { t1 } => ping::Repr { t1 }.emit(&mut ping::Packet::new_unchecked(body)),
            Message::Pong { t1, t2, t3 } => {
                pong::Repr { t1, t2, t3 }.emit(&mut pong::Packet::new_unchecked(body))
            }
            Message::Ack { seq, .. } => {
                ack::Repr { seq }.emit(&mut ack::Packet::new_unchecked(body))
            }
            Message::End { frames, .. } => {
                end::Repr { frames }.emit(&mut end::Packet::new_unchecked(body))
            }
            Message::Resume { instance } => {
                resume::Repr { instance }.emit(&mut resume::Packet::new_unchecked(body))
            }
            Message::Delivered { seq, .. } => {
                delivered::Repr { seq }.emit(&mut delivered::Packet::new_unchecked(body))
            }
        }?;
        Ok(total)
    }

    /// [`Message::emit`] into a new `Vec` of exactly [`Message::buffer_len`] bytes.
    pub fn emit_to_vec(&self) -> Result<Vec<u8>> {
        body_len_u32(self.body_len() as u64)?;
        let mut out = vec![0u8; self.buffer_len()];
        self.emit(&mut out)?;
        Ok(out)
    }

    /// Append the emitted message to `out`.
    pub fn emit_append(&self, out: &mut Vec<u8>) -> Result<()> {
        body_len_u32(self.body_len() as u64)?;
        let start = out.len();
        out.resize(start + self.buffer_len(), 0);
        match self.emit(&mut out[start..]) {
            Ok(_) => Ok(()),
            Err(e) => {
                out.truncate(start);
                Err(e)
            }
        }
    }

    /// Copy borrowed parts into an owned message with no lifetime ties.
    pub fn to_owned_message(&self) -> OwnedMessage {
        match self {
            Message::Data {
                stream,
                retransmit,
                more,
                seq,
                timestamp_ns,
                payload,
            } => OwnedMessage::Data {
                stream: *stream,
                retransmit: *retransmit,
                more: *more,
                seq: *seq,
                timestamp_ns: *timestamp_ns,
                payload: payload.to_vec(),
            },
            Message::Control { stream, layer, msg } => OwnedMessage::Control {
                stream: *stream,
                layer: *layer,
                msg: msg.to_vec(),
            },
            Message::Hello(h) => OwnedMessage::Hello(h.clone()),
            Message::Ready => OwnedMessage::Ready,
            Message::Close { code, reason } => OwnedMessage::Close {
                code: *code,
                reason: (*reason).to_owned(),
            },
            Message::Ping { t1 } => OwnedMessage::Ping { t1: *t1 },
            Message::Pong { t1, t2, t3 } => OwnedMessage::Pong {
                t1: *t1,
                t2: *t2,
                t3: *t3,
            },
            Message::Ack { stream, seq } => OwnedMessage::Ack {
                stream: *stream,
                seq: *seq,
            },
            Message::End { stream, frames } => OwnedMessage::End {
                stream: *stream,
                frames: *frames,
            },
            Message::Resume { instance } => OwnedMessage::Resume {
                instance: *instance,
            },
            Message::Delivered { stream, seq } => OwnedMessage::Delivered {
                stream: *stream,
                seq: *seq,
            },
        }
    }
}

/// [`Message`] with owned parts, for queues and channels. Fields mean the same.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum OwnedMessage {
    Data {
        stream: u16,
        retransmit: bool,
        more: bool,
        seq: u64,
        timestamp_ns: u64,
        payload: Vec<u8>,
    },
    Control {
        stream: u16,
        layer: u8,
        msg: Vec<u8>,
    },
    Hello(HelloRepr),
    Ready,
    Close {
        code: CloseCode,
        reason: String,
    },
    Ping {
        t1: u64,
    },
    Pong {
        t1: u64,
        t2: u64,
        t3: u64,
    },
    Ack {
        stream: u16,
        seq: u64,
    },
    End {
        stream: u16,
        frames: u64,
    },
    Resume {
        instance: u64,
    },
    Delivered {
        stream: u16,
        seq: u64,
    },
}

impl OwnedMessage {
    /// Borrow as a [`Message`] (to emit it).
    pub fn as_message(&self) -> Message<'_> {
        match self {
            OwnedMessage::Data {
                stream,
                retransmit,
                more,
                seq,
                timestamp_ns,
                payload,
            } => Message::Data {
                stream: *stream,
                retransmit: *retransmit,
                more: *more,
                seq: *seq,
                timestamp_ns: *timestamp_ns,
                payload,
            },
            OwnedMessage::Control { stream, layer, msg } => Message::Control {
                stream: *stream,
                layer: *layer,
                msg,
            },
            OwnedMessage::Hello(h) => Message::Hello(h.clone()),
            OwnedMessage::Ready => Message::Ready,
            OwnedMessage::Close { code, reason } => Message::Close {
                code: *code,
                reason,
            },
            OwnedMessage::Ping { t1 } => Message::Ping { t1: *t1 },
            OwnedMessage::Pong { t1, t2, t3 } => Message::Pong {
                t1: *t1,
                t2: *t2,
                t3: *t3,
            },
            OwnedMessage::Ack { stream, seq } => Message::Ack {
                stream: *stream,
                seq: *seq,
            },
            OwnedMessage::End { stream, frames } => Message::End {
                stream: *stream,
                frames: *frames,
            },
            OwnedMessage::Resume { instance } => Message::Resume {
                instance: *instance,
            },
            OwnedMessage::Delivered { stream, seq } => Message::Delivered {
                stream: *stream,
                seq: *seq,
            },
        }
    }
}

impl From<Message<'_>> for OwnedMessage {
    fn from(m: Message<'_>) -> OwnedMessage {
        m.to_owned_message()
    }
}

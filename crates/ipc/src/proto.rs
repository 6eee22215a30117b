//! The external-module protocol: messages between the host half and its child, identical over
//! a pipe and over the shared-memory ring. See `docs/external-modules.md` for the spec and
//! test vectors; the tests at the bottom of this file check those vectors byte for byte.
//!
//! Every message is `len: u32 BE ‖ type: u8 ‖ body`, where `len` counts the type byte and the
//! body (so it is at least 1 and at most [`MAX_MESSAGE`]). All integers are big-endian.
//! For each request the host sends, the child answers with zero or more `FRAME`/`CONTROL`
//! replies and then exactly one `DONE` (or one `ERROR`).

use ndd_core::Meta;
use thiserror::Error;

/// Protocol version sent in `HELLO`.
pub const VERSION: u16 = 1;
/// Largest `len` accepted (type byte + body): 64 MiB of payload plus headers.
pub const MAX_MESSAGE: usize = (64 << 20) + 64;
/// `wake_ns` value in `DONE` meaning "no wake-up wanted".
pub const NO_WAKE: u64 = u64::MAX;

/// Message type bytes.
pub mod ty {
    /// host → child: protocol version, role, module name.
    pub const HELLO: u8 = 0x01;
    /// host → child: a frame to transform.
    pub const FRAME: u8 = 0x02;
    /// host → child: a control message from the twin half on the peer.
    pub const CONTROL: u8 = 0x03;
    /// host → child: the wake-up time the child asked for has come.
    pub const TIMEOUT: u8 = 0x04;
    /// host → child: end of stream, release everything held.
    pub const FLUSH: u8 = 0x05;
    /// host → child (shm, a child that transforms in place): a frame whose payload is at the
    /// start of the shared frame area.
    pub const FRAME_IN_ARENA: u8 = 0x06;
    /// child → host: a frame for the next layer.
    pub const OUT_FRAME: u8 = 0x81;
    /// child → host: a control message for the twin half on the peer.
    pub const OUT_CONTROL: u8 = 0x82;
    /// child → host: the request is fully handled; carries the next wake-up time.
    pub const DONE: u8 = 0x83;
    /// child → host: the request failed (fatal for the stream); carries a UTF-8 reason.
    pub const ERROR: u8 = 0x84;
    /// child → host: a frame for the next layer whose payload lies in the frame area.
    pub const OUT_FRAME_IN_ARENA: u8 = 0x85;
}

/// Which half of the pair a child implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HalfRole {
    /// Source side.
    Forward,
    /// Sink side.
    Inverse,
}

impl HalfRole {
    /// `forward` or `inverse`.
    pub fn as_str(self) -> &'static str {
        match self {
            HalfRole::Forward => "forward",
            HalfRole::Inverse => "inverse",
        }
    }
}

/// A message the child cannot have sent (or the host cannot have sent).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ProtoError {
    /// Unknown type byte.
    #[error("unknown message type 0x{0:02x}")]
    UnknownType(u8),
    /// Body shorter than the fixed fields of its type.
    #[error("message type 0x{ty:02x} needs at least {need} body bytes, got {got}")]
    Short {
        /// Type byte.
        ty: u8,
        /// Minimum body length.
        need: usize,
        /// Actual body length.
        got: usize,
    },
    /// Length prefix out of range.
    #[error("length prefix {0} out of range 1..={MAX_MESSAGE}")]
    BadLength(u64),
    /// A field that must be UTF-8 is not, or a role byte is not 0/1.
    #[error("invalid field: {0}")]
    Invalid(&'static str),
}

/// A host → child message, borrowing its variable part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request<'a> {
    /// First message after start.
    Hello {
        /// Protocol version ([`VERSION`]).
        version: u16,
        /// Half the child implements.
        role: HalfRole,
        /// Module name from the config.
        name: &'a str,
    },
    /// A frame from the previous layer.
    Frame {
        /// Host time, ns since the half started.
        now_ns: u64,
        /// Frame meta.
        meta: Meta,
        /// Payload.
        payload: &'a [u8],
    },
    /// A control message from the twin half.
    Control {
        /// Host time.
        now_ns: u64,
        /// Message bytes.
        msg: &'a [u8],
    },
    /// Wake-up time reached.
    Timeout {
        /// Host time.
        now_ns: u64,
    },
    /// End of stream.
    Flush {
        /// Host time.
        now_ns: u64,
    },
    /// A frame from the previous layer, its payload the first `len` bytes of the frame area.
    FrameInArena {
        /// Host time.
        now_ns: u64,
        /// Frame meta.
        meta: Meta,
        /// Payload length.
        len: u32,
    },
}

/// A child → host message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply<'a> {
    /// A frame for the next layer.
    Frame {
        /// Frame meta.
        meta: Meta,
        /// Payload.
        payload: &'a [u8],
    },
    /// A control message for the twin.
    Control {
        /// Message bytes.
        msg: &'a [u8],
    },
    /// Request handled.
    Done {
        /// Next wake-up, ns on the host's clock, or `None`.
        wake_ns: Option<u64>,
    },
    /// Request failed.
    Error {
        /// Reason.
        message: &'a str,
    },
    /// A frame for the next layer, its payload `len` bytes at offset `off` of the frame area.
    FrameInArena {
        /// Frame meta.
        meta: Meta,
        /// Offset in the frame area.
        off: u32,
        /// Payload length.
        len: u32,
    },
}

const META_LEN: usize = 2 + 8 + 8 + 2;

fn put_meta(v: &mut Vec<u8>, m: &Meta) {
    v.extend_from_slice(&m.stream.to_be_bytes());
    v.extend_from_slice(&m.seq.to_be_bytes());
    v.extend_from_slice(&m.timestamp_ns.to_be_bytes());
    v.extend_from_slice(&m.flags.to_be_bytes());
}

fn get_meta(b: &[u8]) -> Meta {
    Meta {
        stream: u16::from_be_bytes([b[0], b[1]]),
        seq: be64(&b[2..10]),
        timestamp_ns: be64(&b[10..18]),
        flags: u16::from_be_bytes([b[18], b[19]]),
    }
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

fn be64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

/// Starts a message: length prefix (for `fixed + tail` body bytes) and type byte.
fn start(ty: u8, fixed: usize, tail: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(5 + fixed);
    v.extend_from_slice(&((1 + fixed + tail) as u32).to_be_bytes());
    v.push(ty);
    v
}

fn need(ty: u8, body: &[u8], n: usize) -> Result<(), ProtoError> {
    if body.len() < n {
        Err(ProtoError::Short {
            ty,
            need: n,
            got: body.len(),
        })
    } else {
        Ok(())
    }
}

/// Checks a length prefix.
pub fn check_len(len: u32) -> Result<usize, ProtoError> {
    let l = len as usize;
    if l == 0 || l > MAX_MESSAGE {
        Err(ProtoError::BadLength(len as u64))
    } else {
        Ok(l)
    }
}

impl<'a> Request<'a> {
    /// Encodes as `(head, tail)`: the message is `head ‖ tail`, where `tail` is the variable
    /// part borrowed from `self` (so a payload is never copied to build a message).
    pub fn encode(&self) -> (Vec<u8>, &'a [u8]) {
        match *self {
            Request::Hello {
                version,
                role,
                name,
            } => {
                let mut v = start(ty::HELLO, 3, name.len());
                v.extend_from_slice(&version.to_be_bytes());
                v.push(match role {
                    HalfRole::Forward => 0,
                    HalfRole::Inverse => 1,
                });
                (v, name.as_bytes())
            }
            Request::Frame {
                now_ns,
                meta,
                payload,
            } => {
                let mut v = start(ty::FRAME, 8 + META_LEN, payload.len());
                v.extend_from_slice(&now_ns.to_be_bytes());
                put_meta(&mut v, &meta);
                (v, payload)
            }
            Request::Control { now_ns, msg } => {
                let mut v = start(ty::CONTROL, 8, msg.len());
                v.extend_from_slice(&now_ns.to_be_bytes());
                (v, msg)
            }
            Request::Timeout { now_ns } => {
                let mut v = start(ty::TIMEOUT, 8, 0);
                v.extend_from_slice(&now_ns.to_be_bytes());
                (v, &[])
            }
            Request::Flush { now_ns } => {
                let mut v = start(ty::FLUSH, 8, 0);
                v.extend_from_slice(&now_ns.to_be_bytes());
                (v, &[])
            }
            Request::FrameInArena { now_ns, meta, len } => {
                let mut v = start(ty::FRAME_IN_ARENA, 8 + META_LEN + 4, 0);
                v.extend_from_slice(&now_ns.to_be_bytes());
                put_meta(&mut v, &meta);
                v.extend_from_slice(&len.to_be_bytes());
                (v, &[])
            }
        }
    }

    /// Parses `type ‖ body` (the message without its length prefix).
    pub fn parse(msg: &'a [u8]) -> Result<Request<'a>, ProtoError> {
        let (&t, body) = msg.split_first().ok_or(ProtoError::BadLength(0))?;
        match t {
            ty::HELLO => {
                need(t, body, 3)?;
                let role = match body[2] {
                    0 => HalfRole::Forward,
                    1 => HalfRole::Inverse,
                    _ => return Err(ProtoError::Invalid("role must be 0 or 1")),
                };
                let name = std::str::from_utf8(&body[3..])
                    .map_err(|_| ProtoError::Invalid("module name is not UTF-8"))?;
                Ok(Request::Hello {
                    version: u16::from_be_bytes([body[0], body[1]]),
                    role,
                    name,
                })
            }
            ty::FRAME => {
                need(t, body, 8 + META_LEN)?;
                Ok(Request::Frame {
                    now_ns: be64(body),
                    meta: get_meta(&body[8..]),
                    payload: &body[8 + META_LEN..],
                })
            }
            ty::CONTROL => {
                need(t, body, 8)?;
                Ok(Request::Control {
                    now_ns: be64(body),
                    msg: &body[8..],
                })
            }
            ty::TIMEOUT | ty::FLUSH => {
                need(t, body, 8)?;
                let now_ns = be64(body);
                Ok(if t == ty::TIMEOUT {
                    Request::Timeout { now_ns }
                } else {
                    Request::Flush { now_ns }
                })
            }
            ty::FRAME_IN_ARENA => {
                need(t, body, 8 + META_LEN + 4)?;
                if body.len() != 8 + META_LEN + 4 {
                    return Err(ProtoError::Invalid("FRAME_IN_ARENA has a fixed length"));
                }
                Ok(Request::FrameInArena {
                    now_ns: be64(body),
                    meta: get_meta(&body[8..]),
                    len: be32(&body[8 + META_LEN..]),
                })
            }
            other => Err(ProtoError::UnknownType(other)),
        }
    }
}

impl<'a> Reply<'a> {
    /// Encodes as `(head, tail)` (see [`Request::encode`]).
    pub fn encode(&self) -> (Vec<u8>, &'a [u8]) {
        match *self {
            Reply::Frame { meta, payload } => {
                let mut v = start(ty::OUT_FRAME, META_LEN, payload.len());
                put_meta(&mut v, &meta);
                (v, payload)
            }
            Reply::Control { msg } => (start(ty::OUT_CONTROL, 0, msg.len()), msg),
            Reply::Done { wake_ns } => {
                let mut v = start(ty::DONE, 8, 0);
                v.extend_from_slice(&wake_ns.unwrap_or(NO_WAKE).to_be_bytes());
                (v, &[])
            }
            Reply::Error { message } => (start(ty::ERROR, 0, message.len()), message.as_bytes()),
            Reply::FrameInArena { meta, off, len } => {
                let mut v = start(ty::OUT_FRAME_IN_ARENA, META_LEN + 8, 0);
                put_meta(&mut v, &meta);
                v.extend_from_slice(&off.to_be_bytes());
                v.extend_from_slice(&len.to_be_bytes());
                (v, &[])
            }
        }
    }

    /// Parses `type ‖ body`.
    pub fn parse(msg: &'a [u8]) -> Result<Reply<'a>, ProtoError> {
        let (&t, body) = msg.split_first().ok_or(ProtoError::BadLength(0))?;
        match t {
            ty::OUT_FRAME => {
                need(t, body, META_LEN)?;
                Ok(Reply::Frame {
                    meta: get_meta(body),
                    payload: &body[META_LEN..],
                })
            }
            ty::OUT_CONTROL => Ok(Reply::Control { msg: body }),
            ty::DONE => {
                need(t, body, 8)?;
                let w = be64(body);
                Ok(Reply::Done {
                    wake_ns: (w != NO_WAKE).then_some(w),
                })
            }
            ty::ERROR => Ok(Reply::Error {
                message: std::str::from_utf8(body)
                    .map_err(|_| ProtoError::Invalid("error message is not UTF-8"))?,
            }),
            ty::OUT_FRAME_IN_ARENA => {
                need(t, body, META_LEN + 8)?;
                if body.len() != META_LEN + 8 {
                    return Err(ProtoError::Invalid("OUT_FRAME_IN_ARENA has a fixed length"));
                }
                Ok(Reply::FrameInArena {
                    meta: get_meta(body),
                    off: be32(&body[META_LEN..]),
                    len: be32(&body[META_LEN + 4..]),
                })
            }
            other => Err(ProtoError::UnknownType(other)),
        }
    }

    /// Offset of the payload of an encoded `OUT_FRAME` message within `type ‖ body`.
    pub const FRAME_PAYLOAD_OFFSET: usize = 1 + META_LEN;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    fn whole(p: (Vec<u8>, &[u8])) -> Vec<u8> {
        let mut v = p.0;
        v.extend_from_slice(p.1);
        v
    }

    const META: Meta = Meta {
        stream: 3,
        seq: 1,
        timestamp_ns: 1001,
        flags: 0,
    };

    /// The vectors in `docs/external-modules.md`, checked both ways.
    #[test]
    fn parse_emit_test_vectors() {
        let reqs: Vec<(Request, &str)> = vec![
            (
                Request::Hello {
                    version: 1,
                    role: HalfRole::Forward,
                    name: "upper",
                },
                "000000090100010075707065 72".replace(' ', "").leak(),
            ),
            (
                Request::Frame {
                    now_ns: 5000,
                    meta: META,
                    payload: b"abc",
                },
                "00000020 02 0000000000001388 0003 0000000000000001 00000000000003e9 0000 616263"
                    .replace(' ', "")
                    .leak(),
            ),
            (
                Request::Control {
                    now_ns: 7,
                    msg: b"hi",
                },
                "0000000b 03 0000000000000007 6869".replace(' ', "").leak(),
            ),
            (
                Request::Timeout { now_ns: 1_000_000 },
                "00000009 04 00000000000f4240".replace(' ', "").leak(),
            ),
            (
                Request::Flush { now_ns: 2 },
                "00000009 05 0000000000000002".replace(' ', "").leak(),
            ),
            (
                Request::FrameInArena {
                    now_ns: 5000,
                    meta: META,
                    len: 3,
                },
                "00000021 06 0000000000001388 0003 0000000000000001 00000000000003e9 0000 00000003"
                    .replace(' ', "")
                    .leak(),
            ),
        ];
        for (r, h) in reqs {
            let bytes = whole(r.encode());
            assert_eq!(hex(&bytes), h, "{r:?}");
            assert_eq!(Request::parse(&bytes[4..]).unwrap(), r);
        }
        let reps: Vec<(Reply, &str)> = vec![
            (
                Reply::Frame {
                    meta: META,
                    payload: b"ABC",
                },
                "00000018 81 0003 0000000000000001 00000000000003e9 0000 414243"
                    .replace(' ', "")
                    .leak(),
            ),
            (
                Reply::Control { msg: b"hi" },
                "00000003 82 6869".replace(' ', "").leak(),
            ),
            (
                Reply::Done { wake_ns: None },
                "00000009 83 ffffffffffffffff".replace(' ', "").leak(),
            ),
            (
                Reply::Done {
                    wake_ns: Some(2_000_000),
                },
                "00000009 83 00000000001e8480".replace(' ', "").leak(),
            ),
            (
                Reply::Error { message: "bad" },
                "00000004 84 626164".replace(' ', "").leak(),
            ),
            (
                Reply::FrameInArena {
                    meta: META,
                    off: 0,
                    len: 3,
                },
                "0000001d 85 0003 0000000000000001 00000000000003e9 0000 00000000 00000003"
                    .replace(' ', "")
                    .leak(),
            ),
        ];
        for (r, h) in reps {
            let bytes = whole(r.encode());
            assert_eq!(hex(&bytes), h, "{r:?}");
            assert_eq!(Reply::parse(&bytes[4..]).unwrap(), r);
        }
    }

    #[test]
    fn garbage_is_an_error_never_a_panic() {
        assert_eq!(Reply::parse(b"A"), Err(ProtoError::UnknownType(0x41)));
        assert!(matches!(
            Reply::parse(&[ty::OUT_FRAME, 0, 1]),
            Err(ProtoError::Short { .. })
        ));
        assert!(Reply::parse(&[ty::DONE]).is_err());
        assert!(Reply::parse(&[]).is_err());
        assert!(Reply::parse(&[ty::ERROR, 0xff]).is_err());
        assert!(Request::parse(&[ty::HELLO, 0, 1, 7]).is_err());
        let mut long = whole(
            Reply::FrameInArena {
                meta: META,
                off: 1,
                len: 2,
            }
            .encode(),
        );
        long.push(0);
        assert_eq!(
            Reply::parse(&long[4..]),
            Err(ProtoError::Invalid("OUT_FRAME_IN_ARENA has a fixed length"))
        );
        assert!(check_len(0).is_err());
        assert!(check_len(u32::MAX).is_err());
        for n in 0..64u8 {
            let v: Vec<u8> = (0..n).map(|i| i.wrapping_mul(37) ^ n).collect();
            let _ = Reply::parse(&v);
            let _ = Request::parse(&v);
        }
    }
}

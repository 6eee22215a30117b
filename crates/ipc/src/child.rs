//! The child side of the protocol, for modules written in Rust (and for in-process thread
//! children): implement [`Handler`] (or wrap a closure with [`from_fn`]) and call [`run`].
//!
//! [`run`] picks the transport the host chose: the shared-memory region whose descriptor is
//! in `NDD_SHM_FD` (placement `shm`), else stdin/stdout (placement `pipe`). It returns when
//! the host closes the channel.

use crate::proto::{HalfRole, Reply, Request};
use crate::shm::ChildArena;
use crate::transport::{Liveness, PipeTransport, ShmTransport, Transport, TransportError};
use ndd_core::Meta;
use std::time::{Duration, Instant};
use thiserror::Error;

/// One piece of a reply batch.
#[derive(Debug)]
enum Part<'a> {
    Owned(Vec<u8>),
    Borrowed(&'a [u8]),
}

/// What a handler answers to one request: frames, control messages and the wake-up time.
/// Everything is sent in one batch, followed by `DONE`.
#[derive(Debug, Default)]
pub struct Replies<'a> {
    parts: Vec<Part<'a>>,
    wake_ns: Option<u64>,
    /// Start and length of the shared frame area in this process, when there is one.
    arena: Option<(usize, usize)>,
}

impl<'a> Replies<'a> {
    /// A frame for the next layer; `payload` may borrow the request (no copy). A payload
    /// that lies in the shared frame area (a frame rewritten in place, or a part of it) is
    /// answered with its offset and length there: no copy at all.
    pub fn frame(&mut self, meta: Meta, payload: &'a [u8]) {
        if let Some((base, len)) = self.arena {
            let p = payload.as_ptr() as usize;
            if p >= base && p + payload.len() <= base + len {
                let (h, _) = Reply::FrameInArena {
                    meta,
                    off: (p - base) as u32,
                    len: payload.len() as u32,
                }
                .encode();
                self.parts.push(Part::Owned(h));
                return;
            }
        }
        let (h, t) = Reply::Frame { meta, payload }.encode();
        self.parts.push(Part::Owned(h));
        self.parts.push(Part::Borrowed(t));
    }

    /// A frame whose payload the handler built.
    pub fn frame_owned(&mut self, meta: Meta, payload: Vec<u8>) {
        let (h, _) = Reply::Frame {
            meta,
            payload: &payload,
        }
        .encode();
        self.parts.push(Part::Owned(h));
        self.parts.push(Part::Owned(payload));
    }

    /// A control message for the twin half on the peer.
    pub fn control(&mut self, msg: &[u8]) {
        let (mut h, t) = Reply::Control { msg }.encode();
        h.extend_from_slice(t);
        self.parts.push(Part::Owned(h));
    }

    /// Asks to be called with `TIMEOUT` at host time `ns` (or never, with `None`). Persists
    /// until changed; a `TIMEOUT` request clears it before the handler runs.
    pub fn wake_at(&mut self, ns: Option<u64>) {
        self.wake_ns = ns;
    }
}

/// Why a handler refuses a request. Sent to the host as the text of an `ERROR` reply (fatal
/// for the stream).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum HandlerError {
    /// A control message to a module that defines none (the default [`Handler::control`]).
    #[error("this module defines no control messages (got one of {len} bytes)")]
    NoControl {
        /// Length of the message.
        len: usize,
    },
    /// The host speaks a protocol version this runtime does not.
    #[error("unsupported protocol version {version} (this runtime speaks {supported})")]
    Version {
        /// The host's version.
        version: u16,
        /// This runtime's version.
        supported: u16,
    },
    /// The module's own error: any error value, or a message
    /// (`HandlerError::module("bad checksum")`).
    #[error(transparent)]
    Module(Box<dyn std::error::Error + Send + Sync + 'static>),
}

impl HandlerError {
    /// The module's own error (or message).
    pub fn module(e: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Self {
        HandlerError::Module(e.into())
    }
}

/// A module implemented in Rust. Errors are sent as `ERROR` (fatal for the stream).
pub trait Handler: Send {
    /// `HELLO`: the host's protocol version, the half to implement and the module name.
    fn hello(&mut self, _role: HalfRole, _name: &str) -> Result<(), HandlerError> {
        Ok(())
    }
    /// `FRAME`.
    fn frame<'a>(
        &mut self,
        now_ns: u64,
        meta: Meta,
        payload: &'a [u8],
        out: &mut Replies<'a>,
    ) -> Result<(), HandlerError>;
    /// A frame in the shared frame area (`FRAME_IN_ARENA`, shm placement): rewrite it in
    /// place and answer `out.frame(meta, &payload[..n])` (or any part of it) — neither side
    /// copies. Frames that grow answer with [`Replies::frame_owned`]. The default hands the
    /// payload to [`Handler::frame`], which is just as fast for a module that passes or cuts
    /// its input.
    fn frame_in_place<'a>(
        &mut self,
        now_ns: u64,
        meta: Meta,
        payload: &'a mut [u8],
        out: &mut Replies<'a>,
    ) -> Result<(), HandlerError> {
        self.frame(now_ns, meta, payload, out)
    }
    /// `CONTROL`; the default refuses (the pair defines none).
    fn control<'a>(
        &mut self,
        _now_ns: u64,
        msg: &'a [u8],
        _out: &mut Replies<'a>,
    ) -> Result<(), HandlerError> {
        Err(HandlerError::NoControl { len: msg.len() })
    }
    /// `TIMEOUT`.
    fn timeout(&mut self, _now_ns: u64, _out: &mut Replies<'_>) -> Result<(), HandlerError> {
        Ok(())
    }
    /// `FLUSH`.
    fn flush(&mut self, _now_ns: u64, _out: &mut Replies<'_>) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// A handler made of a closure over frames (no control messages, no timers).
pub struct FnHandler<F>(F);

impl<F> std::fmt::Debug for FnHandler<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FnHandler")
    }
}

/// Wraps `f(now_ns, meta, payload, out)` as a [`Handler`].
pub fn from_fn<F>(f: F) -> FnHandler<F>
where
    F: for<'a> FnMut(u64, Meta, &'a [u8], &mut Replies<'a>) -> Result<(), HandlerError> + Send,
{
    FnHandler(f)
}

impl<F> Handler for FnHandler<F>
where
    F: for<'a> FnMut(u64, Meta, &'a [u8], &mut Replies<'a>) -> Result<(), HandlerError> + Send,
{
    fn frame<'a>(
        &mut self,
        now_ns: u64,
        meta: Meta,
        payload: &'a [u8],
        out: &mut Replies<'a>,
    ) -> Result<(), HandlerError> {
        (self.0)(now_ns, meta, payload, out)
    }
}

fn far() -> Instant {
    Instant::now() + Duration::from_secs(365 * 86_400)
}

/// Serves requests from `t` with `h` until the host closes the channel.
pub fn serve(t: &mut dyn Transport, h: &mut dyn Handler) -> Result<(), TransportError> {
    serve_with_arena(t, None, h)
}

/// Like [`serve`], over shared memory with the region's frame area: the child tells the host
/// it takes frames in place, and `FRAME_IN_ARENA` requests reach
/// [`Handler::frame_in_place`].
pub fn serve_with_arena(
    t: &mut dyn Transport,
    mut arena: Option<ChildArena>,
    h: &mut dyn Handler,
) -> Result<(), TransportError> {
    let mut wake: Option<u64> = None;
    let mut msg = Vec::new();
    let span = arena.as_ref().map(|a| a.span());
    if let Some(a) = &arena {
        a.announce_in_place();
    }
    loop {
        match t.recv_into(&mut msg, far()) {
            Ok(()) => {}
            Err(TransportError::Closed) => return Ok(()),
            Err(e) => return Err(e),
        }
        let req = match Request::parse(&msg) {
            Ok(r) => r,
            Err(e) => {
                let text = format!("bad request: {e}");
                let (hd, tl) = Reply::Error { message: &text }.encode();
                t.send(&[&hd, tl], far())?;
                return Err(TransportError::Garbage(text));
            }
        };
        let mut out = Replies {
            parts: Vec::new(),
            wake_ns: wake,
            arena: span,
        };
        let res = match req {
            Request::Hello { version, .. } if version != crate::proto::VERSION => {
                Err(HandlerError::Version {
                    version,
                    supported: crate::proto::VERSION,
                })
            }
            Request::Hello { role, name, .. } => h.hello(role, name),
            Request::Frame {
                now_ns,
                meta,
                payload,
            } => h.frame(now_ns, meta, payload, &mut out),
            Request::Control { now_ns, msg } => h.control(now_ns, msg, &mut out),
            Request::Timeout { now_ns } => {
                out.wake_ns = None;
                h.timeout(now_ns, &mut out)
            }
            Request::Flush { now_ns } => h.flush(now_ns, &mut out),
            Request::FrameInArena { now_ns, meta, len } => {
                match arena.as_mut().and_then(|a| a.frame_mut(len as usize)) {
                    Some(payload) => h.frame_in_place(now_ns, meta, payload, &mut out),
                    None => {
                        let text = format!(
                            "bad request: a frame of {len} bytes in a frame area of {} bytes",
                            arena.as_ref().map_or(0, |a| a.len())
                        );
                        let (hd, tl) = Reply::Error { message: &text }.encode();
                        t.send(&[&hd, tl], far())?;
                        return Err(TransportError::Garbage(text));
                    }
                }
            }
        };
        match res {
            Ok(()) => {
                wake = out.wake_ns;
                let (done, _) = Reply::Done { wake_ns: wake }.encode();
                let mut parts: Vec<&[u8]> = out
                    .parts
                    .iter()
                    .map(|p| match p {
                        Part::Owned(v) => &v[..],
                        Part::Borrowed(b) => b,
                    })
                    .collect();
                parts.push(&done);
                // One message per reply, but the transport takes them as one gather write.
                t.send(&parts, far())?;
            }
            Err(e) => {
                let text = e.to_string();
                let (hd, tl) = Reply::Error { message: &text }.encode();
                t.send(&[&hd, tl], far())?;
            }
        }
    }
}

/// Runs a child module: serves the host over shared memory (`NDD_SHM_FD` set) or over
/// stdin/stdout, until the host closes the channel.
pub fn run(mut handler: impl Handler) -> std::io::Result<()> {
    let r = match std::env::var("NDD_SHM_FD") {
        Ok(v) => {
            let fd: i32 = v
                .parse()
                .map_err(|_| std::io::Error::other("NDD_SHM_FD is not a number"))?;
            let spin = std::env::var("NDD_SHM_SPIN")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(crate::external::DEFAULT_SPIN);
            let fd = crate::shm::take_inherited_fd(fd)?;
            let (p, c) = crate::shm::open(&fd, spin)?;
            drop(fd); // the mapping keeps the memory alive
            let parent = rustix::process::getppid();
            let live = match parent {
                Some(p) => Liveness::Parent(p),
                None => Liveness::None,
            };
            let arena = p.child_arena();
            serve_with_arena(&mut ShmTransport::new(p, c, live), arena, &mut handler)
        }
        Err(_) => {
            use std::os::fd::AsFd;
            let rx = std::io::stdin().as_fd().try_clone_to_owned()?;
            let tx = std::io::stdout().as_fd().try_clone_to_owned()?;
            serve(&mut PipeTransport::new(rx, tx)?, &mut handler)
        }
    };
    r.map_err(|e| match e {
        TransportError::Io(e) => e,
        other => std::io::Error::other(other.to_string()),
    })
}

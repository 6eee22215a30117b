//! How messages move between a host half and its child: the [`Transport`] trait and its two
//! implementations, [`PipeTransport`] (two pipes, e.g. the child's stdin/stdout) and
//! [`ShmTransport`] (the shared-memory rings of [`crate::shm`]). Both carry the same
//! length-prefixed messages of [`crate::proto`].

use crate::proto;
use crate::shm::{self, Waiter};
use rustix::event::{poll, PollFd, PollFlags};
use rustix::fs::{fcntl_getfl, fcntl_setfl, OFlags};
use rustix::io::Errno;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use thiserror::Error;

/// Why a message could not be sent or received.
#[derive(Debug, Error)]
pub enum TransportError {
    /// The deadline passed.
    #[error("timed out")]
    Timeout,
    /// The other side closed its end (or exited).
    #[error("the other side closed the channel")]
    Closed,
    /// The other side sent bytes that are not a message.
    #[error("garbage: {0}")]
    Garbage(String),
    /// An operating-system error.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

/// A bidirectional message channel. Messages are `len ‖ type ‖ body` on the wire; `send`
/// takes the message as parts (already length-prefixed), `recv` returns `type ‖ body`.
pub trait Transport: Send {
    /// Sends the concatenation of `parts` as one message, by `deadline`.
    fn send(&mut self, parts: &[&[u8]], deadline: Instant) -> Result<(), TransportError>;
    /// Receives one message (without its length prefix), by `deadline`.
    fn recv(&mut self, deadline: Instant) -> Result<Vec<u8>, TransportError>;
    /// Like [`Transport::recv`], into `buf` (its capacity may be reused: no allocation and
    /// no page faults per message for a child that keeps one buffer).
    fn recv_into(&mut self, buf: &mut Vec<u8>, deadline: Instant) -> Result<(), TransportError> {
        *buf = self.recv(deadline)?;
        Ok(())
    }
}

fn timespec(d: Duration) -> rustix::event::Timespec {
    rustix::event::Timespec {
        tv_sec: d.as_secs() as _,
        tv_nsec: d.subsec_nanos() as _,
    }
}

fn set_nonblocking(fd: &OwnedFd) -> std::io::Result<()> {
    let fl = fcntl_getfl(fd)?;
    fcntl_setfl(fd, fl | OFlags::NONBLOCK)?;
    Ok(())
}

/// Length-prefixed messages over two pipes. Both descriptors are non-blocking and every wait
/// is a `poll` with the remaining time, so a peer that stops reading or writing cannot block
/// us past the deadline. While sending, it also drains what the peer writes (into its receive
/// buffer), so a peer that answers before it has read the whole request cannot deadlock.
#[derive(Debug)]
pub struct PipeTransport {
    rx: OwnedFd,
    tx: OwnedFd,
    buf: Vec<u8>,
    rx_eof: bool,
}

impl PipeTransport {
    /// Over `rx` (we read) and `tx` (we write).
    pub fn new(rx: OwnedFd, tx: OwnedFd) -> std::io::Result<PipeTransport> {
        set_nonblocking(&rx)?;
        set_nonblocking(&tx)?;
        Ok(PipeTransport {
            rx,
            tx,
            buf: Vec::with_capacity(64 << 10),
            rx_eof: false,
        })
    }

    /// A connected pair of transports over two fresh pipes (for in-process children).
    pub fn pair() -> std::io::Result<(PipeTransport, PipeTransport)> {
        let (r1, w1) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        let (r2, w2) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        // Bigger pipe buffers cut system calls for large frames; failure is harmless.
        for fd in [&w1, &w2] {
            let _ = rustix::pipe::fcntl_setpipe_size(fd, 1 << 20);
        }
        Ok((PipeTransport::new(r1, w2)?, PipeTransport::new(r2, w1)?))
    }

    /// Reads what is available into the buffer; `Ok(false)` on would-block.
    fn fill(&mut self, want: usize) -> Result<bool, TransportError> {
        if self.rx_eof {
            return Err(TransportError::Closed);
        }
        let spare = want.max(64 << 10);
        self.buf.reserve(spare);
        match rustix::io::read(&self.rx, rustix::buffer::spare_capacity(&mut self.buf)) {
            Ok(0) => {
                self.rx_eof = true;
                Err(TransportError::Closed)
            }
            Ok(_) => Ok(true),
            Err(Errno::AGAIN) | Err(Errno::INTR) => Ok(false),
            Err(e) => Err(TransportError::Io(e.into())),
        }
    }

    /// A big message: read its body straight into its own buffer (no growth of ours, no
    /// memmove of a megabyte to strip the length prefix).
    fn recv_big(&mut self, n: usize, deadline: Instant) -> Result<Vec<u8>, TransportError> {
        let mut msg = Vec::with_capacity(n);
        msg.extend_from_slice(&self.buf[4..]);
        self.buf.clear();
        while msg.len() < n {
            match rustix::io::read(&self.rx, rustix::buffer::spare_capacity(&mut msg)) {
                Ok(0) => {
                    self.rx_eof = true;
                    return Err(TransportError::Closed);
                }
                Ok(_) => {}
                Err(Errno::AGAIN) | Err(Errno::INTR) => {
                    self.wait(deadline, false)?;
                }
                Err(e) => return Err(TransportError::Io(e.into())),
            }
        }
        // The allocator may have given more capacity than asked: bytes past this message
        // belong to the next one.
        self.buf.extend_from_slice(&msg[n..]);
        msg.truncate(n);
        Ok(msg)
    }

    fn wait(&self, deadline: Instant, write: bool) -> Result<(bool, bool), TransportError> {
        let now = Instant::now();
        if now >= deadline {
            return Err(TransportError::Timeout);
        }
        let ts = timespec(deadline - now);
        let mut fds = vec![];
        if write {
            fds.push(PollFd::new(&self.tx, PollFlags::OUT));
        }
        if !self.rx_eof {
            fds.push(PollFd::new(&self.rx, PollFlags::IN));
        }
        match poll(&mut fds, Some(&ts)) {
            Ok(_) | Err(Errno::INTR) => {}
            Err(e) => return Err(TransportError::Io(e.into())),
        }
        let ev = |i: usize| {
            fds.get(i)
                .map(|f| f.revents())
                .unwrap_or(PollFlags::empty())
        };
        let (w, r) = if write {
            (ev(0), ev(1))
        } else {
            (PollFlags::empty(), ev(0))
        };
        Ok((
            !w.is_empty(),
            r.intersects(PollFlags::IN | PollFlags::HUP | PollFlags::ERR),
        ))
    }
}

impl Transport for PipeTransport {
    fn send(&mut self, parts: &[&[u8]], deadline: Instant) -> Result<(), TransportError> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let mut done = 0usize;
        while done < total {
            // Build the iovecs of what is left.
            let mut skip = done;
            let mut iov = Vec::with_capacity(parts.len());
            for p in parts {
                if skip >= p.len() {
                    skip -= p.len();
                    continue;
                }
                iov.push(std::io::IoSlice::new(&p[skip..]));
                skip = 0;
            }
            match rustix::io::writev(&self.tx, &iov) {
                Ok(n) => done += n,
                Err(Errno::AGAIN) | Err(Errno::INTR) => {
                    let (_, readable) = self.wait(deadline, true)?;
                    if readable {
                        // Drain replies so the peer is never stuck writing to us.
                        match self.fill(0) {
                            Ok(_) | Err(TransportError::Closed) => {}
                            Err(e) => return Err(e),
                        }
                    }
                }
                Err(Errno::PIPE) => return Err(TransportError::Closed),
                Err(e) => return Err(TransportError::Io(e.into())),
            }
        }
        Ok(())
    }

    fn recv(&mut self, deadline: Instant) -> Result<Vec<u8>, TransportError> {
        loop {
            if self.buf.len() >= 4 {
                let n = proto::check_len(u32::from_be_bytes([
                    self.buf[0],
                    self.buf[1],
                    self.buf[2],
                    self.buf[3],
                ]))
                .map_err(|e| TransportError::Garbage(e.to_string()))?;
                if self.buf.len() >= 4 + n {
                    let v = self.buf[4..4 + n].to_vec();
                    self.buf.drain(..4 + n);
                    return Ok(v);
                }
                if n >= 64 << 10 {
                    return self.recv_big(n, deadline);
                }
                if !self.fill(4 + n - self.buf.len())? {
                    self.wait(deadline, false)?;
                }
                continue;
            }
            if !self.fill(0)? {
                self.wait(deadline, false)?;
            }
        }
    }
}

/// What tells a shared-memory transport that its peer is gone, besides the closed bits.
#[derive(Debug)]
pub enum Liveness {
    /// Nothing beyond the closed bits (they are set when the peer's endpoints drop).
    None,
    /// A pidfd of the child process: readable once it has exited.
    Pidfd(OwnedFd),
    /// The host process: gone when our parent changes (we were re-parented).
    Parent(rustix::process::Pid),
    /// A flag the peer thread clears when it ends.
    Flag(Arc<AtomicBool>),
}

impl Liveness {
    fn check(&self) -> Result<(), TransportError> {
        match self {
            Liveness::None => Ok(()),
            Liveness::Pidfd(fd) => {
                let mut fds = [PollFd::new(fd, PollFlags::IN)];
                match poll(&mut fds, Some(&timespec(Duration::ZERO))) {
                    Ok(n) if n > 0 => Err(TransportError::Closed),
                    _ => Ok(()),
                }
            }
            Liveness::Parent(p) => {
                if rustix::process::getppid() != Some(*p) {
                    Err(TransportError::Closed)
                } else {
                    Ok(())
                }
            }
            Liveness::Flag(f) => {
                if f.load(Ordering::SeqCst) {
                    Ok(())
                } else {
                    Err(TransportError::Closed)
                }
            }
        }
    }
}

/// Length-prefixed messages over the two rings of a shared-memory region.
#[derive(Debug)]
pub struct ShmTransport {
    tx: shm::Producer,
    rx: shm::Consumer,
    liveness: Liveness,
}

impl ShmTransport {
    /// Over the endpoints of one side of a region.
    pub fn new(tx: shm::Producer, rx: shm::Consumer, liveness: Liveness) -> ShmTransport {
        ShmTransport { tx, rx, liveness }
    }

    /// Ring capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.tx.capacity()
    }
}

impl Transport for ShmTransport {
    fn send(&mut self, parts: &[&[u8]], deadline: Instant) -> Result<(), TransportError> {
        let live = &self.liveness;
        let mut check = || live.check();
        let mut w = Waiter {
            deadline,
            check: &mut check,
        };
        self.tx.write(parts, &mut w)
    }

    fn recv(&mut self, deadline: Instant) -> Result<Vec<u8>, TransportError> {
        let live = &self.liveness;
        let mut check = || live.check();
        let mut w = Waiter {
            deadline,
            check: &mut check,
        };
        self.rx.read_message(&mut w)
    }

    fn recv_into(&mut self, buf: &mut Vec<u8>, deadline: Instant) -> Result<(), TransportError> {
        let live = &self.liveness;
        let mut check = || live.check();
        let mut w = Waiter {
            deadline,
            check: &mut check,
        };
        self.rx.read_message_into(buf, &mut w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pipe_pair_carries_big_and_small_messages_both_ways() {
        let (mut a, mut b) = PipeTransport::pair().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let big: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7) as u8).collect();
        let big2 = big.clone();
        let t = std::thread::spawn(move || {
            for _ in 0..3 {
                let m = b.recv(deadline).unwrap();
                let len = (m.len() as u32).to_be_bytes();
                b.send(&[&len, &m], deadline).unwrap();
            }
        });
        for m in [&big2[..], b"\x01small", &big2[..1000]] {
            let len = (m.len() as u32).to_be_bytes();
            a.send(&[&len, m], deadline).unwrap();
            assert_eq!(a.recv(deadline).unwrap(), m);
        }
        t.join().unwrap();
        assert_eq!(big.len(), 3_000_000);
    }

    #[test]
    fn pipe_recv_times_out_then_reports_close() {
        let (mut a, b) = PipeTransport::pair().unwrap();
        let r = a.recv(Instant::now() + Duration::from_millis(20));
        assert!(matches!(r, Err(TransportError::Timeout)), "{r:?}");
        drop(b);
        let r = a.recv(Instant::now() + Duration::from_secs(5));
        assert!(matches!(r, Err(TransportError::Closed)), "{r:?}");
    }

    #[test]
    fn pipe_garbage_length_is_reported() {
        let (mut a, mut b) = PipeTransport::pair().unwrap();
        let d = Instant::now() + Duration::from_secs(5);
        b.send(&[b"\x7f\xff\xff\xffxx"], d).unwrap();
        assert!(matches!(a.recv(d), Err(TransportError::Garbage(_))));
    }
}

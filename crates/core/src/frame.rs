//! Frames: one message of a stream, over reference-counted bytes with headroom.
//!
//! A [`Frame`] is a [`Meta`] (stream, sequence number, source timestamp, flags) plus a payload
//! that lives inside a larger buffer. The bytes in front of the payload are *headroom*: a pair
//! pushes its header there without moving the payload, and its twin pops it by moving an offset.
//! Moving a frame from one half to the next moves a pointer, never the payload.
//!
//! Two storages back a frame:
//! - unique ([`BytesMut`]): what a source endpoint allocates; headers are written in place;
//! - shared ([`Bytes`]): what arrives from a link or what a pair slices out of a bigger frame
//!   (an unbundled frame is a slice of its bundle). Popping is free; pushing into a shared
//!   buffer first tries to take unique ownership, and copies only when someone else still holds
//!   the bytes.
//!
//! Every copy a frame makes of its payload is counted per thread ([`copies_on_this_thread`]),
//! so tests can prove that a path is zero-copy.

use bytes::{Bytes, BytesMut};
use std::cell::Cell;
use std::fmt;

/// Headroom a new frame gets in front of its payload: room for the link header (26 bytes)
/// and a dozen small pair headers.
pub const DEFAULT_HEADROOM: usize = 128;

/// Frame flag: the frame is a retransmission after a reconnect.
pub const FLAG_RETRANSMIT: u16 = 0x0001;

thread_local! {
    static COPIES: Cell<u64> = const { Cell::new(0) };
}

/// How many times a frame payload was copied on this thread (headroom exhausted, shared
/// buffer made unique, ...). A zero-copy path leaves it unchanged.
pub fn copies_on_this_thread() -> u64 {
    COPIES.with(|c| c.get())
}

fn count_copy() {
    COPIES.with(|c| c.set(c.get() + 1));
}

/// What travels with a frame besides its payload. Set by the source endpoint; a pair that
/// merges or splits frames carries the originals' meta in its own header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Meta {
    /// Stream the frame belongs to.
    pub stream: u16,
    /// Sequence number, assigned by the source endpoint, one per frame.
    pub seq: u64,
    /// Creation time on the source, nanoseconds since the Unix epoch (source clock).
    pub timestamp_ns: u64,
    /// Frame flags (see `FLAG_*`).
    pub flags: u16,
}

enum Storage {
    Unique(BytesMut),
    Shared(Bytes),
}

/// One message of a stream. See the module docs.
pub struct Frame {
    /// Stream, sequence, timestamp, flags.
    pub meta: Meta,
    store: Storage,
    /// Offset of the payload inside `store`; everything before it is headroom.
    head: usize,
}

impl fmt::Debug for Frame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Frame")
            .field("meta", &self.meta)
            .field("len", &self.len())
            .field("headroom", &self.head)
            .finish()
    }
}

impl Frame {
    /// A frame whose payload is a copy of `payload`, with [`DEFAULT_HEADROOM`] in front.
    /// This is the one copy a source endpoint makes when it reads from a device.
    pub fn new(meta: Meta, payload: &[u8]) -> Frame {
        let mut f = Frame::zeroed(meta, DEFAULT_HEADROOM, payload.len());
        f.payload_mut().copy_from_slice(payload);
        f
    }

    /// A frame with a zero-filled payload of `len` bytes and `headroom` bytes in front, for
    /// endpoints and pairs that write the payload in place (see [`Frame::payload_mut`]).
    pub fn zeroed(meta: Meta, headroom: usize, len: usize) -> Frame {
        // calloc: fresh pages come zeroed from the kernel, with no second pass over them.
        let buf = BytesMut::zeroed(headroom + len);
        Frame {
            meta,
            store: Storage::Unique(buf),
            head: headroom,
        }
    }

    /// A frame over shared bytes, without copying them (frames from a link, slices of a
    /// bundle).
    pub fn from_bytes(meta: Meta, payload: Bytes) -> Frame {
        Frame {
            meta,
            store: Storage::Shared(payload),
            head: 0,
        }
    }

    /// The payload (everything after the headroom, pair headers included).
    pub fn payload(&self) -> &[u8] {
        match &self.store {
            Storage::Unique(b) => &b[self.head..],
            Storage::Shared(b) => &b[self.head..],
        }
    }

    /// Payload length in bytes.
    pub fn len(&self) -> usize {
        self.payload().len()
    }

    /// True when the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes available in front of the payload for headers without a copy.
    pub fn headroom(&self) -> usize {
        match &self.store {
            Storage::Unique(_) => self.head,
            Storage::Shared(_) => 0,
        }
    }

    /// Mutable payload. Copies (counted) only if the bytes are shared with someone else.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        self.make_unique(0);
        match &mut self.store {
            Storage::Unique(b) => &mut b[self.head..],
            Storage::Shared(_) => unreachable!("make_unique leaves a unique buffer"),
        }
    }

    /// Makes the storage unique with at least `need_headroom` bytes of headroom.
    fn make_unique(&mut self, need_headroom: usize) {
        if let Storage::Unique(_) = self.store {
            if self.head >= need_headroom {
                return;
            }
        }
        let store = std::mem::replace(&mut self.store, Storage::Shared(Bytes::new()));
        // A shared buffer that nobody else holds becomes unique without a copy.
        let store = match store {
            Storage::Shared(b) => match b.try_into_mut() {
                Ok(m) => Storage::Unique(m),
                Err(b) => Storage::Shared(b),
            },
            s => s,
        };
        match store {
            Storage::Unique(m) if self.head >= need_headroom => self.store = Storage::Unique(m),
            other => {
                let payload: &[u8] = match &other {
                    Storage::Unique(m) => &m[self.head..],
                    Storage::Shared(b) => &b[self.head..],
                };
                let headroom = DEFAULT_HEADROOM.max(need_headroom + DEFAULT_HEADROOM / 2);
                let mut buf = BytesMut::with_capacity(headroom + payload.len());
                buf.resize(headroom, 0);
                buf.extend_from_slice(payload);
                count_copy();
                tracing::trace!(len = payload.len(), "frame payload copied");
                self.store = Storage::Unique(buf);
                self.head = headroom;
            }
        }
    }

    /// Prepends `n` bytes of header and lets `write` fill them. In place when there is
    /// headroom; otherwise the payload moves once into a bigger buffer (counted).
    pub fn push_header_with(&mut self, n: usize, write: impl FnOnce(&mut [u8])) {
        self.make_unique(n);
        self.head -= n;
        match &mut self.store {
            Storage::Unique(b) => write(&mut b[self.head..self.head + n]),
            Storage::Shared(_) => unreachable!("make_unique leaves a unique buffer"),
        }
    }

    /// Prepends `header` to the payload (see [`Frame::push_header_with`]).
    pub fn push_header(&mut self, header: &[u8]) {
        self.push_header_with(header.len(), |h| h.copy_from_slice(header));
    }

    /// Removes the first `n` payload bytes and returns them, or `None` (frame unchanged) when
    /// the payload is shorter than `n`. Never copies.
    pub fn pop_header(&mut self, n: usize) -> Option<&[u8]> {
        if self.len() < n {
            return None;
        }
        let start = self.head;
        self.head += n;
        Some(match &self.store {
            Storage::Unique(b) => &b[start..start + n],
            Storage::Shared(b) => &b[start..start + n],
        })
    }

    /// Shortens the payload to `len` bytes (no-op if already shorter).
    pub fn truncate(&mut self, len: usize) {
        let end = self.head + len;
        match &mut self.store {
            Storage::Unique(b) => b.truncate(end.max(self.head)),
            Storage::Shared(b) => b.truncate(end.max(self.head)),
        }
    }

    /// The payload as shared bytes, without copying.
    pub fn into_bytes(self) -> Bytes {
        match self.store {
            Storage::Unique(b) => b.freeze().slice(self.head..),
            Storage::Shared(b) => b.slice(self.head..),
        }
    }

    /// A zero-copy view of part of the payload as shared bytes (for pairs that split a frame
    /// into several). Freezes a unique buffer; later pushes on this frame may then copy.
    pub fn slice_payload(&mut self, range: std::ops::Range<usize>) -> Option<Bytes> {
        if range.start > range.end || range.end > self.len() {
            return None;
        }
        let store = std::mem::replace(&mut self.store, Storage::Shared(Bytes::new()));
        let shared = match store {
            Storage::Unique(b) => b.freeze(),
            Storage::Shared(b) => b,
        };
        let out = shared.slice(self.head + range.start..self.head + range.end);
        self.store = Storage::Shared(shared);
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> Meta {
        Meta {
            stream: 1,
            seq: 7,
            timestamp_ns: 42,
            flags: 0,
        }
    }

    #[test]
    fn push_then_pop_restores_payload_in_place() {
        let mut f = Frame::new(meta(), b"payload");
        let ptr = f.payload().as_ptr();
        let before = copies_on_this_thread();
        f.push_header(b"HDR1");
        f.push_header(b"H2");
        assert_eq!(f.payload(), b"H2HDR1payload");
        assert_eq!(f.pop_header(2), Some(&b"H2"[..]));
        assert_eq!(f.pop_header(4), Some(&b"HDR1"[..]));
        assert_eq!(f.payload(), b"payload");
        assert_eq!(f.payload().as_ptr(), ptr);
        assert_eq!(copies_on_this_thread(), before);
    }

    #[test]
    fn pop_longer_than_payload_is_none_and_leaves_frame() {
        let mut f = Frame::new(meta(), b"abc");
        assert_eq!(f.pop_header(4), None);
        assert_eq!(f.payload(), b"abc");
    }

    #[test]
    fn exhausted_headroom_copies_once_and_keeps_content() {
        let mut f = Frame::zeroed(meta(), 2, 3);
        f.payload_mut().copy_from_slice(b"xyz");
        let before = copies_on_this_thread();
        f.push_header(b"1234");
        assert_eq!(copies_on_this_thread(), before + 1);
        assert_eq!(f.payload(), b"1234xyz");
        assert!(f.headroom() >= DEFAULT_HEADROOM / 2);
        f.push_header(b"5");
        assert_eq!(copies_on_this_thread(), before + 1);
    }

    #[test]
    fn shared_frame_pops_without_copy_and_converts_to_bytes() {
        let bytes = Bytes::from_static(b"HDRbody");
        let mut f = Frame::from_bytes(meta(), bytes.clone());
        let before = copies_on_this_thread();
        assert_eq!(f.pop_header(3), Some(&b"HDR"[..]));
        let out = f.into_bytes();
        assert_eq!(&out[..], b"body");
        assert_eq!(out.as_ptr(), bytes[3..].as_ptr());
        assert_eq!(copies_on_this_thread(), before);
    }

    #[test]
    fn push_onto_shared_bytes_held_elsewhere_copies() {
        let bytes = Bytes::from(b"body".to_vec());
        let mut f = Frame::from_bytes(meta(), bytes.clone());
        let before = copies_on_this_thread();
        f.push_header(b"H");
        assert_eq!(copies_on_this_thread(), before + 1);
        assert_eq!(f.payload(), b"Hbody");
        assert_eq!(
            &bytes[..],
            b"body",
            "the other holder's bytes are untouched"
        );
    }

    #[test]
    fn slice_payload_is_zero_copy_and_bounds_checked() {
        let mut f = Frame::new(meta(), b"0123456789");
        let p = f.payload().as_ptr();
        let s = f.slice_payload(2..5).expect("in range");
        assert_eq!(&s[..], b"234");
        // SAFETY-free pointer arithmetic check: same allocation, offset 2.
        assert_eq!(s.as_ptr(), p.wrapping_add(2));
        assert!(f.slice_payload(5..11).is_none());
        #[allow(clippy::reversed_empty_ranges)]
        let bad = f.slice_payload(6..5);
        assert!(bad.is_none());
    }

    #[test]
    fn truncate_shortens_payload() {
        let mut f = Frame::new(meta(), b"abcdef");
        f.truncate(2);
        assert_eq!(f.payload(), b"ab");
        f.truncate(10);
        assert_eq!(f.payload(), b"ab");
    }
}

//! The shared-memory SPSC ring: the one module of this crate with `unsafe` code.
//!
//! A memfd (anonymous: it has no name in any file system, so nothing needs unlinking, and no
//! other user can open it) holds a header page and two byte rings, one per direction. Layout
//! (offsets in bytes; atomics in native byte order; documented for C in
//! `docs/external-modules.md`):
//!
//! ```text
//! 0     u32 magic "NDDR" (bytes 4e 44 44 52)    4  u32 layout version (1)
//! 8     u32 ring_bytes (power of two >= 4096)   12 u32 closed bits: 1 = host gone, 2 = child gone
//! 64    ring 0 control (host -> child)          1024 ring 1 control (child -> host)
//!         +0   u64 write index (bytes ever written; only the producer stores it)
//!         +64  u64 read index  (bytes ever read; only the consumer stores it)
//!         +128 u32 reader_sleeping (futex word; 1 while the consumer sleeps or is about to)
//!         +192 u32 writer_sleeping (futex word; 1 while the producer waits for space)
//! 16    u32 arena_bytes (0 = no frame area)     20 u32 child features (bit 0: in place)
//! 4096              ring 0 data, ring_bytes
//! 4096 + ring_bytes ring 1 data, ring_bytes
//! 4096 + 2 * ring_bytes  frame area (arena), arena_bytes
//! ```
//!
//! The frame area ([`Arena`]) is where the host puts a frame for a child that transforms
//! frames in place (it says so by setting feature bit 0 before it answers `HELLO`): the
//! request then carries only the frame's meta and length, the child rewrites the bytes where
//! they are and answers with an offset and length in the area, and the host copies the result
//! out once. Two copies of the payload per round trip instead of four, and the module itself
//! copies nothing.
//!
//! Each ring carries the same byte stream as a pipe would (length-prefixed messages), so a
//! message larger than the ring simply goes through in chunks: the producer publishes what
//! fits, the consumer copies it out and frees the space, and so on.
//!
//! Waiting: spin `spin` times re-checking the index (yielding the CPU every 32 polls), then
//! set our sleep flag, re-check (all SeqCst, so either the sleeper sees the new index or the
//! other side sees the flag), and `futex_wait` on the flag in slices of at most 10 ms (to
//! notice a dead peer). The other side calls `futex_wake` only when it swaps a set flag back
//! to 0: no system call while the peer is awake. Spinning is adaptive: after a wait that
//! lasted over 50 µs the next wait sleeps at once; a short wait turns spinning back on (so
//! idle children in a long stack stop stealing the cores the busy one needs).
//!
//! Trust: the peer may be buggy or hostile. Indices are validated on every load (a producer
//! never runs ahead of the consumer by more than `ring_bytes`); message lengths are
//! validated by the caller; bytes are copied out of the shared mapping before anyone parses
//! them, so a peer scribbling on the ring can corrupt only its own messages.

use crate::transport::TransportError;
use memmap2::MmapRaw;
use rustix::fs::{ftruncate, memfd_create, MemfdFlags};
use rustix::thread::futex;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering::SeqCst;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Size of the header page.
pub const HEADER_BYTES: usize = 4096;
/// Layout version in the header.
pub const LAYOUT_VERSION: u32 = 1;
/// Smallest ring.
pub const MIN_RING_BYTES: usize = 4096;
/// Largest ring (1 GiB).
pub const MAX_RING_BYTES: usize = 1 << 30;
const MAGIC: [u8; 4] = *b"NDDR";
const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = 4;
const OFF_RING_BYTES: usize = 8;
const OFF_CLOSED: usize = 12;
const OFF_ARENA_BYTES: usize = 16;
const OFF_FEATURES: usize = 20;
/// Child feature bit: it handles `FRAME_IN_ARENA` (transforms frames in the frame area).
pub const FEATURE_IN_PLACE: u32 = 1;
/// Largest frame area (1 GiB).
pub const MAX_ARENA_BYTES: usize = 1 << 30;
const RING_CTL: [usize; 2] = [64, 1024];
const OFF_WRITE: usize = 0;
const OFF_READ: usize = 64;
const OFF_READER_SLEEP: usize = 128;
const OFF_WRITER_SLEEP: usize = 192;
/// A wait longer than this (after the spin) switches spinning off for the next wait.
const SPIN_WORTH: Duration = Duration::from_micros(50);
const PUBLISH_EVERY: u64 = 64 << 10;
const SLICE: Duration = Duration::from_millis(10);

/// Which end of the region this process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The host: writes ring 0, reads ring 1; closed bit 1.
    Host,
    /// The child: writes ring 1, reads ring 0; closed bit 2.
    Child,
}

impl Side {
    fn bit(self) -> u32 {
        match self {
            Side::Host => 1,
            Side::Child => 2,
        }
    }
    fn peer_bit(self) -> u32 {
        match self {
            Side::Host => 2,
            Side::Child => 1,
        }
    }
    fn tx_ring(self) -> usize {
        match self {
            Side::Host => 0,
            Side::Child => 1,
        }
    }
}

/// One mapping of the region (each side maps it once).
#[derive(Debug)]
struct Region {
    map: MmapRaw,
    ring_bytes: usize,
    arena_bytes: usize,
    /// A [`ChildArena`] was handed out for this mapping (there is only ever one).
    child_arena_taken: std::sync::atomic::AtomicBool,
}

impl Region {
    fn u32_at(&self, off: usize) -> &AtomicU32 {
        assert!(off + 4 <= HEADER_BYTES && off & 3 == 0);
        // SAFETY: `off` is inside the header page (checked above), which is inside the
        // mapping (its length was checked when mapping), and 4-aligned (the mapping is
        // page-aligned). The mapping lives as long as `self`, so the reference cannot dangle.
        // Both sides access these words only through atomics.
        unsafe { AtomicU32::from_ptr(self.map.as_mut_ptr().add(off).cast::<u32>()) }
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        assert!(off + 8 <= HEADER_BYTES && off & 7 == 0);
        // SAFETY: as in `u32_at`, with 8-byte alignment checked above.
        unsafe { AtomicU64::from_ptr(self.map.as_mut_ptr().add(off).cast::<u64>()) }
    }

    fn data(&self, ring: usize) -> *mut u8 {
        // SAFETY: the mapping is HEADER_BYTES + 2 * ring_bytes long (checked when mapping)
        // and ring is 0 or 1, so the offset stays inside it.
        unsafe {
            self.map
                .as_mut_ptr()
                .add(HEADER_BYTES + ring * self.ring_bytes)
        }
    }

    fn arena(&self) -> *mut u8 {
        // SAFETY: the mapping is HEADER_BYTES + 2 * ring_bytes + arena_bytes long (checked
        // when mapping), so the area's start is inside it (or one past its end when the area
        // is empty, which is never dereferenced).
        unsafe {
            self.map
                .as_mut_ptr()
                .add(HEADER_BYTES + 2 * self.ring_bytes)
        }
    }

    fn ctl(&self, ring: usize, off: usize) -> usize {
        RING_CTL[ring] + off
    }

    fn map(fd: &OwnedFd) -> std::io::Result<Region> {
        let map = MmapRaw::map_raw(fd)?;
        if map.len() < HEADER_BYTES {
            return Err(bad("shared-memory file shorter than its header"));
        }
        let mut r = Region {
            map,
            ring_bytes: 0,
            arena_bytes: 0,
            child_arena_taken: Default::default(),
        };
        let ring_bytes = r.u32_at(OFF_RING_BYTES).load(SeqCst) as usize;
        if !(MIN_RING_BYTES..=MAX_RING_BYTES).contains(&ring_bytes)
            || !ring_bytes.is_power_of_two()
            || r.map.len() < HEADER_BYTES + 2 * ring_bytes
        {
            return Err(bad("shared-memory header: bad ring size"));
        }
        let arena_bytes = r.u32_at(OFF_ARENA_BYTES).load(SeqCst) as usize;
        if arena_bytes > MAX_ARENA_BYTES
            || arena_bytes & 4095 != 0
            || r.map.len() < HEADER_BYTES + 2 * ring_bytes + arena_bytes
        {
            return Err(bad("shared-memory header: bad frame area size"));
        }
        r.ring_bytes = ring_bytes;
        r.arena_bytes = arena_bytes;
        Ok(r)
    }
}

fn bad(msg: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, msg.to_string())
}

/// Creates a region with two rings of `ring_bytes` each (rounded up to a power of two) and
/// returns its file descriptor (to pass to the child) and the host's endpoints.
pub fn create(ring_bytes: usize, spin: u32) -> std::io::Result<(OwnedFd, Producer, Consumer)> {
    create_with_arena(ring_bytes, 0, spin)
}

/// Like [`create`], with a frame area of `arena_bytes` (rounded up to whole pages; 0 = none)
/// after the rings: see [`Arena`]. The file is sparse: pages of the area cost memory only
/// once a frame has been put there.
pub fn create_with_arena(
    ring_bytes: usize,
    arena_bytes: usize,
    spin: u32,
) -> std::io::Result<(OwnedFd, Producer, Consumer)> {
    let ring_bytes = ring_bytes
        .clamp(MIN_RING_BYTES, MAX_RING_BYTES)
        .next_power_of_two();
    let arena_bytes = arena_bytes.min(MAX_ARENA_BYTES).div_ceil(4096) * 4096;
    let fd = memfd_create("ndd-ipc-ring", MemfdFlags::CLOEXEC)?;
    ftruncate(&fd, (HEADER_BYTES + 2 * ring_bytes + arena_bytes) as u64)?;
    let map = MmapRaw::map_raw(&fd)?;
    let r = Region {
        map,
        ring_bytes,
        arena_bytes,
        child_arena_taken: Default::default(),
    };
    // SAFETY: the file is HEADER_BYTES + 2 * ring_bytes long (ftruncate above) and mapped
    // whole; nobody else has it yet, so writing the magic bytes races with no one.
    unsafe { std::ptr::copy_nonoverlapping(MAGIC.as_ptr(), r.map.as_mut_ptr().add(OFF_MAGIC), 4) };
    r.u32_at(OFF_VERSION).store(LAYOUT_VERSION, SeqCst);
    r.u32_at(OFF_RING_BYTES).store(ring_bytes as u32, SeqCst);
    r.u32_at(OFF_ARENA_BYTES).store(arena_bytes as u32, SeqCst);
    let (p, c) = endpoints(Arc::new(r), Side::Host, spin);
    Ok((fd, p, c))
}

/// Maps a region made by [`create`] (received from the host) as the child.
pub fn open(fd: &OwnedFd, spin: u32) -> std::io::Result<(Producer, Consumer)> {
    let r = Region::map(fd)?;
    let mut magic = [0u8; 4];
    // SAFETY: the mapping is at least HEADER_BYTES long (checked in `Region::map`).
    unsafe {
        std::ptr::copy_nonoverlapping(r.map.as_mut_ptr().add(OFF_MAGIC), magic.as_mut_ptr(), 4)
    };
    if magic != MAGIC {
        return Err(bad("shared-memory header: bad magic"));
    }
    if r.u32_at(OFF_VERSION).load(SeqCst) != LAYOUT_VERSION {
        return Err(bad("shared-memory header: unsupported layout version"));
    }
    Ok(endpoints(Arc::new(r), Side::Child, spin))
}

/// Maps the host's region a second time as the child, in this process (for in-process
/// children that exercise the same code as a separate process).
pub fn open_in_process(fd: &OwnedFd, spin: u32) -> std::io::Result<(Producer, Consumer)> {
    open(fd, spin)
}

fn endpoints(r: Arc<Region>, side: Side, spin: u32) -> (Producer, Consumer) {
    let tx = side.tx_ring();
    let p = Producer {
        region: r.clone(),
        ring: tx,
        side,
        write: r.u64_at(r.ctl(tx, OFF_WRITE)).load(SeqCst),
        read_cache: r.u64_at(r.ctl(tx, OFF_READ)).load(SeqCst),
        spin,
        skip_spin: false,
    };
    let rx = 1 - tx;
    let c = Consumer {
        region: r.clone(),
        ring: rx,
        side,
        read: r.u64_at(r.ctl(rx, OFF_READ)).load(SeqCst),
        write_cache: r.u64_at(r.ctl(rx, OFF_READ)).load(SeqCst),
        spin,
        skip_spin: false,
    };
    (p, c)
}

/// How long to wait, and what else to check while waiting (peer process alive?).
pub struct Waiter<'a> {
    /// Give up with [`TransportError::Timeout`] at this instant.
    pub deadline: Instant,
    /// Called between sleeps; an error ends the wait.
    pub check: &'a mut dyn FnMut() -> Result<(), TransportError>,
}

impl std::fmt::Debug for Waiter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiter")
            .field("deadline", &self.deadline)
            .finish()
    }
}

/// Spins, then sleeps on `flag` until `cond` holds.
///
/// Adaptive: `skip` remembers that the last wait outlasted the spin by far (the peer was
/// busy elsewhere: a long stack pass, a loaded machine), and then the next wait goes straight
/// to sleep, leaving the core to threads that have work. A wait that ends within
/// [`SPIN_WORTH`] turns spinning back on.
fn wait_for(
    r: &Region,
    side: Side,
    flag: &AtomicU32,
    spin: u32,
    skip: &mut bool,
    w: &mut Waiter<'_>,
    cond: impl Fn() -> bool,
) -> Result<(), TransportError> {
    let spin = if *skip { 0 } else { spin };
    for i in 0..spin {
        if cond() {
            *skip = false;
            return Ok(());
        }
        // Let another runnable thread have the core now and then: when the thread we wait
        // for is queued on our own core (the kernel often wakes a thread on the waker's CPU,
        // and on a loaded 2-core host it often is), pure spinning would keep it off the CPU
        // for the whole spin. Measured here: yielding every 256 polls cost ~9 µs per hop,
        // every 32 polls ~1–2 µs.
        if i % 32 == 31 {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
    let closed = r.u32_at(OFF_CLOSED);
    let t0 = Instant::now();
    let res = sleep_until(side, flag, w, cond, closed);
    *skip = t0.elapsed() > SPIN_WORTH;
    res
}

fn sleep_until(
    side: Side,
    flag: &AtomicU32,
    w: &mut Waiter<'_>,
    cond: impl Fn() -> bool,
    closed: &AtomicU32,
) -> Result<(), TransportError> {
    loop {
        flag.store(1, SeqCst);
        if cond() {
            flag.store(0, SeqCst);
            return Ok(());
        }
        if closed.load(SeqCst) & side.peer_bit() != 0 {
            flag.store(0, SeqCst);
            return Err(TransportError::Closed);
        }
        let now = Instant::now();
        if now >= w.deadline {
            flag.store(0, SeqCst);
            return Err(TransportError::Timeout);
        }
        let d = (w.deadline - now).min(SLICE);
        let ts = futex::Timespec {
            tv_sec: d.as_secs() as _,
            tv_nsec: d.subsec_nanos() as _,
        };
        // EAGAIN (flag already cleared by the waker), EINTR and ETIMEDOUT all mean "look
        // again"; any other error is a bug worth reporting.
        match futex::wait(flag, futex::Flags::empty(), 1, Some(&ts)) {
            Ok(()) => {}
            Err(e)
                if e == rustix::io::Errno::AGAIN
                    || e == rustix::io::Errno::INTR
                    || e == rustix::io::Errno::TIMEDOUT => {}
            Err(e) => return Err(TransportError::Io(e.into())),
        }
        flag.store(0, SeqCst);
        if cond() {
            return Ok(());
        }
        (w.check)()?;
    }
}

/// Wakes the other side if it sleeps on `flag`.
fn wake(flag: &AtomicU32) {
    if flag.load(SeqCst) != 0 && flag.swap(0, SeqCst) != 0 {
        let _ = futex::wake(flag, futex::Flags::empty(), 1);
    }
}

/// Writing end of one ring. Only one exists per ring and side (SPSC by construction).
#[derive(Debug)]
pub struct Producer {
    region: Arc<Region>,
    ring: usize,
    side: Side,
    write: u64,
    read_cache: u64,
    spin: u32,
    skip_spin: bool,
}

impl Producer {
    /// Ring capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.region.ring_bytes
    }

    /// The host's handle on the region's frame area (`None` when it has none, or on the
    /// child's side: see [`Producer::child_arena`]).
    pub fn arena(&self) -> Option<Arena> {
        (self.side == Side::Host && self.region.arena_bytes > 0).then(|| Arena {
            region: self.region.clone(),
        })
    }

    /// The child's handle on the region's frame area: `None` when it has none, on the host's
    /// side, or when it was taken before (there is one per mapping).
    pub fn child_arena(&self) -> Option<ChildArena> {
        let r = &self.region;
        (self.side == Side::Child && r.arena_bytes > 0 && !r.child_arena_taken.swap(true, SeqCst))
            .then(|| ChildArena { region: r.clone() })
    }

    fn load_read(&mut self) -> Result<(), TransportError> {
        let r = &self.region;
        let read = r.u64_at(r.ctl(self.ring, OFF_READ)).load(SeqCst);
        if read > self.write || self.write - read > r.ring_bytes as u64 {
            return Err(TransportError::Garbage(format!(
                "shared-memory ring: read index {read} inconsistent with write index {}",
                self.write
            )));
        }
        self.read_cache = read;
        Ok(())
    }

    fn publish(&self) {
        let r = &self.region;
        r.u64_at(r.ctl(self.ring, OFF_WRITE))
            .store(self.write, SeqCst);
        wake(r.u32_at(r.ctl(self.ring, OFF_READER_SLEEP)));
    }

    /// Writes the concatenation of `parts`, in chunks when it is larger than the free space,
    /// and publishes it.
    pub fn write(&mut self, parts: &[&[u8]], w: &mut Waiter<'_>) -> Result<(), TransportError> {
        let cap = self.region.ring_bytes as u64;
        let mut published = self.write;
        for part in parts {
            let mut off = 0usize;
            while off < part.len() {
                let mut free = cap - (self.write - self.read_cache);
                if free == 0 {
                    self.load_read()?;
                    free = cap - (self.write - self.read_cache);
                }
                if free == 0 {
                    self.publish();
                    let r = self.region.clone();
                    let read_idx = r.u64_at(r.ctl(self.ring, OFF_READ));
                    let flag = r.u32_at(r.ctl(self.ring, OFF_WRITER_SLEEP));
                    let write = self.write;
                    wait_for(
                        &r,
                        self.side,
                        flag,
                        self.spin,
                        &mut self.skip_spin,
                        w,
                        || read_idx.load(SeqCst) != write - cap,
                    )?;
                    self.load_read()?;
                    continue;
                }
                let pos = (self.write % cap) as usize;
                let n = (free as usize)
                    .min(part.len() - off)
                    .min(self.region.ring_bytes - pos);
                // SAFETY: `pos + n <= ring_bytes`, so the destination lies inside this ring's
                // data area; `off + n <= part.len()`. Bytes [write, read + cap) of the ring
                // are free: the consumer has finished with them (its read index says so) and
                // will not touch them until we publish a larger write index, so no one else
                // accesses the destination while we copy. Source and destination cannot
                // overlap (one is in the shared mapping, the other is caller memory).
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        part.as_ptr().add(off),
                        self.region.data(self.ring).add(pos),
                        n,
                    );
                }
                self.write += n as u64;
                off += n;
                // Publish every 64 KiB of a big message: the consumer copies out on the
                // other core while we still copy in.
                if self.write - published >= PUBLISH_EVERY {
                    self.publish();
                    published = self.write;
                }
            }
        }
        self.publish();
        Ok(())
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        let r = &self.region;
        r.u32_at(OFF_CLOSED).fetch_or(self.side.bit(), SeqCst);
        wake(r.u32_at(r.ctl(self.ring, OFF_READER_SLEEP)));
    }
}

/// Reading end of one ring.
#[derive(Debug)]
pub struct Consumer {
    region: Arc<Region>,
    ring: usize,
    side: Side,
    read: u64,
    write_cache: u64,
    spin: u32,
    skip_spin: bool,
}

impl Consumer {
    fn load_write(&mut self) -> Result<(), TransportError> {
        let r = &self.region;
        let write = r.u64_at(r.ctl(self.ring, OFF_WRITE)).load(SeqCst);
        if write < self.read || write - self.read > r.ring_bytes as u64 {
            return Err(TransportError::Garbage(format!(
                "shared-memory ring: write index {write} inconsistent with read index {}",
                self.read
            )));
        }
        self.write_cache = write;
        Ok(())
    }

    fn release(&self) {
        let r = &self.region;
        r.u64_at(r.ctl(self.ring, OFF_READ))
            .store(self.read, SeqCst);
        wake(r.u32_at(r.ctl(self.ring, OFF_WRITER_SLEEP)));
    }

    /// Copies exactly `dst.len()` bytes out of the ring into `dst` (uninitialised allowed),
    /// waiting for the producer as needed.
    fn read_into(
        &mut self,
        dst: &mut [std::mem::MaybeUninit<u8>],
        w: &mut Waiter<'_>,
    ) -> Result<(), TransportError> {
        let cap = self.region.ring_bytes as u64;
        let mut off = 0usize;
        while off < dst.len() {
            let mut avail = self.write_cache - self.read;
            if avail == 0 {
                self.load_write()?;
                avail = self.write_cache - self.read;
            }
            if avail == 0 {
                self.release();
                let r = self.region.clone();
                let write_idx = r.u64_at(r.ctl(self.ring, OFF_WRITE));
                let flag = r.u32_at(r.ctl(self.ring, OFF_READER_SLEEP));
                let read = self.read;
                wait_for(
                    &r,
                    self.side,
                    flag,
                    self.spin,
                    &mut self.skip_spin,
                    w,
                    || write_idx.load(SeqCst) != read,
                )?;
                self.load_write()?;
                continue;
            }
            let pos = (self.read % cap) as usize;
            let n = (avail as usize)
                .min(dst.len() - off)
                .min(self.region.ring_bytes - pos);
            // SAFETY: `pos + n <= ring_bytes` keeps the source inside this ring's data area
            // and `off + n <= dst.len()` the destination inside `dst`. Bytes [read, write) were
            // published by the producer (SeqCst store of the write index, which we loaded),
            // and it will not reuse them until we publish a larger read index. A hostile
            // producer could still scribble on them: we copy them out before anyone reads
            // them, so the worst outcome is wrong bytes in its own message. The regions do
            // not overlap (shared mapping vs. our buffer).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.region.data(self.ring).add(pos),
                    dst.as_mut_ptr().add(off).cast::<u8>(),
                    n,
                );
            }
            self.read += n as u64;
            off += n;
        }
        Ok(())
    }

    /// Reads one length-prefixed message and returns `type ‖ body`.
    pub fn read_message(&mut self, w: &mut Waiter<'_>) -> Result<Vec<u8>, TransportError> {
        let mut v = Vec::new();
        self.read_message_into(&mut v, w)?;
        Ok(v)
    }

    /// Reads one message into `v` (replacing its contents, reusing its capacity).
    pub fn read_message_into(
        &mut self,
        v: &mut Vec<u8>,
        w: &mut Waiter<'_>,
    ) -> Result<(), TransportError> {
        v.clear();
        let mut len = [std::mem::MaybeUninit::new(0u8); 4];
        self.read_into(&mut len, w)?;
        let len = len.map(|b| {
            // SAFETY: the array was initialised with zeros and `read_into` only writes bytes.
            unsafe { b.assume_init() }
        });
        let n = crate::proto::check_len(u32::from_be_bytes(len))
            .map_err(|e| TransportError::Garbage(e.to_string()))?;
        v.reserve(n);
        self.read_into(&mut v.spare_capacity_mut()[..n], w)?;
        // SAFETY: capacity is at least `n` (reserved above, on an empty vector) and
        // `read_into` initialised the first `n` bytes (it returns an error otherwise).
        unsafe { v.set_len(n) };
        self.release();
        Ok(())
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        let r = &self.region;
        r.u32_at(OFF_CLOSED).fetch_or(self.side.bit(), SeqCst);
        wake(r.u32_at(r.ctl(self.ring, OFF_WRITER_SLEEP)));
    }
}

/// The host's side of the frame area: it puts a frame there between requests and copies
/// results out. It never forms a reference into the area (the child may scribble on it at any
/// time): every access is a copy, validated against the area's size.
#[derive(Debug, Clone)]
pub struct Arena {
    region: Arc<Region>,
}

impl Arena {
    /// Size of the area in bytes.
    pub fn len(&self) -> usize {
        self.region.arena_bytes
    }

    /// Whether the area is empty (never, for an area handed out).
    pub fn is_empty(&self) -> bool {
        self.region.arena_bytes == 0
    }

    /// Whether the child said it transforms frames in place (feature bit 0).
    pub fn child_in_place(&self) -> bool {
        self.region.u32_at(OFF_FEATURES).load(SeqCst) & FEATURE_IN_PLACE != 0
    }

    /// Copies `src` to the start of the area; `false` (nothing copied) when it does not fit.
    /// Only between requests: the protocol gives the area to the child from a `FRAME_IN_ARENA`
    /// until its `DONE`.
    pub fn put(&self, src: &[u8]) -> bool {
        if src.len() > self.len() {
            return false;
        }
        // SAFETY: `src.len() <= arena_bytes`, so the destination lies inside the area, which
        // lies inside the mapping. No request is outstanding (the caller's contract above), so
        // a well-behaved child does not touch the area; a misbehaving one can only spoil its
        // own input. Caller memory and the shared mapping do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.region.arena(), src.len()) };
        true
    }

    /// Whether `len` bytes at offset `off` lie inside the area.
    fn holds(&self, off: usize, len: usize) -> bool {
        matches!(off.checked_add(len), Some(end) if end <= self.len())
    }

    /// Copies `dst.len()` bytes from offset `off` of the area into `dst`; `false` (nothing
    /// copied) when that range is not inside the area.
    pub fn copy_out(&self, off: usize, dst: &mut [u8]) -> bool {
        if !self.holds(off, dst.len()) {
            return false;
        }
        // SAFETY: `off + dst.len() <= arena_bytes` (checked above) keeps the source inside the
        // area. The child may still be writing there (only a misbehaving one): the bytes are
        // copied with a raw copy, never through a reference, so the worst outcome is wrong
        // bytes in its own result. The regions do not overlap (shared mapping vs. our buffer).
        unsafe {
            std::ptr::copy_nonoverlapping(self.region.arena().add(off), dst.as_mut_ptr(), dst.len())
        };
        true
    }

    /// Copies `len` bytes from offset `off` of the area into a new vector (no zero-fill
    /// first: one pass over the bytes); `None` when that range is not inside the area.
    pub fn copy_out_vec(&self, off: usize, len: usize) -> Option<Vec<u8>> {
        if !self.holds(off, len) {
            return None;
        }
        let mut v = Vec::with_capacity(len);
        // SAFETY: `off + len <= arena_bytes` (checked above) keeps the source inside the area;
        // the vector has capacity for `len` bytes, all of which the copy initialises before
        // `set_len`. As in `copy_out`: a raw copy from the shared mapping (never a reference),
        // into memory that does not overlap it.
        unsafe {
            std::ptr::copy_nonoverlapping(self.region.arena().add(off), v.as_mut_ptr(), len);
            v.set_len(len);
        }
        Some(v)
    }
}

/// The child's side of the frame area: the frame the host put there, to rewrite in place.
#[derive(Debug)]
pub struct ChildArena {
    region: Arc<Region>,
}

impl ChildArena {
    /// Size of the area in bytes.
    pub fn len(&self) -> usize {
        self.region.arena_bytes
    }

    /// Whether the area is empty (never, for an area handed out).
    pub fn is_empty(&self) -> bool {
        self.region.arena_bytes == 0
    }

    /// Tells the host this child transforms frames in place (feature bit 0). Before the
    /// answer to `HELLO`: the host reads the bit once that answer is in.
    pub fn announce_in_place(&self) {
        self.region
            .u32_at(OFF_FEATURES)
            .fetch_or(FEATURE_IN_PLACE, SeqCst);
    }

    /// The start and length of the area in this process's address space (to recognise a
    /// reply payload that lies inside it).
    pub fn span(&self) -> (usize, usize) {
        (self.region.arena() as usize, self.region.arena_bytes)
    }

    /// The first `len` bytes of the area (`None` when `len` exceeds it), for the duration of
    /// one request.
    pub fn frame_mut(&mut self, len: usize) -> Option<&mut [u8]> {
        if len > self.len() {
            return None;
        }
        // SAFETY: `len <= arena_bytes`, so the slice lies inside the area, inside the mapping,
        // which lives as long as `self.region` (the slice borrows `self`). Exclusive access:
        // the protocol gives the area to the child from a `FRAME_IN_ARENA` request until the
        // child's `DONE`, and the host (the program that started this child, which it trusts
        // with its whole memory anyway) writes it only between requests; in this process
        // only this `ChildArena` hands out references to it (one per mapping: see
        // `Producer::child_arena`), one at a time (`&mut self`).
        Some(unsafe { std::slice::from_raw_parts_mut(self.region.arena(), len) })
    }
}

/// Arranges for `fd` to be open as descriptor `target` in the child spawned by `cmd` (and
/// only there: ours stays close-on-exec).
pub fn pass_fd(cmd: &mut std::process::Command, fd: &OwnedFd, target: RawFd) {
    use std::os::unix::process::CommandExt;
    let raw = fd.as_raw_fd();
    // SAFETY: the closure runs in the forked child before exec; it calls only dup2 and fcntl,
    // which are async-signal-safe, and allocates nothing (`last_os_error` reads errno). `raw`
    // stays open in the parent until spawn returns because the caller holds `fd` across it.
    unsafe {
        cmd.pre_exec(move || {
            if raw != target && libc::dup2(raw, target) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // dup2 clears FD_CLOEXEC on the new descriptor; when raw == target, clear it here.
            if libc::fcntl(target, libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

static INHERITED_TAKEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Takes ownership of the descriptor the host passed (see [`pass_fd`]); only once per process.
pub fn take_inherited_fd(fd: RawFd) -> std::io::Result<OwnedFd> {
    if fd < 3 {
        return Err(bad("inherited descriptor must be >= 3"));
    }
    if INHERITED_TAKEN.swap(true, SeqCst) {
        return Err(bad("inherited descriptor already taken"));
    }
    // SAFETY: F_GETFD only queries the descriptor table; it fails with EBADF when `fd` is not
    // open, in which case we do not take ownership.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is open (checked above), was dup2'd for us by the host and is owned by no
    // other object in this process (the static flag makes this function succeed only once).
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn never() -> Instant {
        Instant::now() + Duration::from_secs(30)
    }

    /// Two threads, random message sizes up to 3x the ring, every byte checked, small spin
    /// so both the spinning and the futex paths run.
    #[test]
    fn stress_two_threads_random_sizes_every_byte_checked() {
        for spin in [0u32, 200] {
            let (fd, mut hp, mut hc) = create(4096, spin).unwrap();
            let (mut cp, mut cc) = open_in_process(&fd, spin).unwrap();
            const N: u64 = 600;
            let child = std::thread::spawn(move || {
                // Echo every message back.
                let mut ok = || Ok(());
                for _ in 0..N {
                    let mut w = Waiter {
                        deadline: never(),
                        check: &mut ok,
                    };
                    let m = cc.read_message(&mut w).unwrap();
                    let len = (m.len() as u32).to_be_bytes();
                    cp.write(&[&len, &m], &mut w).unwrap();
                }
            });
            let mut rng = 0x2545_f491_4f6c_dd1du64;
            let mut next = || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng
            };
            let mut ok = || Ok(());
            for i in 0..N {
                let size = 1 + (next() % 12_000) as usize;
                let seed = next();
                let msg: Vec<u8> = (0..size)
                    .map(|j| (seed.wrapping_add(j as u64 * 31) >> 3) as u8)
                    .collect();
                let mut w = Waiter {
                    deadline: never(),
                    check: &mut ok,
                };
                // Send in two parts to exercise part boundaries.
                let len = (size as u32).to_be_bytes();
                let (a, b) = msg.split_at(size / 3);
                hp.write(&[&len, a, b], &mut w).unwrap();
                let back = hc.read_message(&mut w).unwrap();
                assert_eq!(back, msg, "message {i} of {size} bytes");
            }
            child.join().unwrap();
        }
    }

    #[test]
    fn the_frame_area_is_shared_bounded_and_handed_out_once() {
        let (fd, hp, _hc) = create_with_arena(4096, 5000, 0).unwrap();
        let host = hp.arena().expect("host side");
        assert_eq!(host.len(), 8192, "rounded up to whole pages");
        assert!(hp.child_arena().is_none(), "the host gets no child view");
        let (cp, _cc) = open_in_process(&fd, 0).unwrap();
        assert!(cp.arena().is_none(), "the child gets no host view");
        let mut child = cp.child_arena().expect("child side");
        assert!(cp.child_arena().is_none(), "one child view per mapping");
        assert!(!host.child_in_place());
        child.announce_in_place();
        assert!(host.child_in_place());

        assert!(host.put(b"hello"));
        assert!(!host.put(&[0u8; 8193]), "larger than the area");
        let f = child.frame_mut(5).unwrap();
        assert_eq!(f, b"hello");
        f.make_ascii_uppercase();
        assert!(child.frame_mut(8193).is_none());
        let mut out = [0u8; 4];
        assert!(host.copy_out(1, &mut out));
        assert_eq!(&out, b"ELLO");
        assert!(host.copy_out(8188, &mut out), "up to the last byte");
        assert!(!host.copy_out(8189, &mut out), "past the end");
        assert!(!host.copy_out(usize::MAX, &mut out), "overflowing offset");

        let (_fd, hp, _hc) = create(4096, 0).unwrap();
        assert!(hp.arena().is_none(), "no area unless asked for");
    }

    #[test]
    fn a_reader_without_a_writer_times_out_and_sees_close() {
        let (fd, hp, mut hc) = create(4096, 10).unwrap();
        let (cp, _cc) = open_in_process(&fd, 10).unwrap();
        let mut ok = || Ok(());
        let mut w = Waiter {
            deadline: Instant::now() + Duration::from_millis(20),
            check: &mut ok,
        };
        assert!(matches!(
            hc.read_message(&mut w),
            Err(TransportError::Timeout)
        ));
        drop(cp);
        let mut w = Waiter {
            deadline: never(),
            check: &mut ok,
        };
        assert!(matches!(
            hc.read_message(&mut w),
            Err(TransportError::Closed)
        ));
        drop(hp);
    }

    #[test]
    fn a_hostile_write_index_is_garbage() {
        let (fd, _hp, mut hc) = create(4096, 0).unwrap();
        let (cp, _cc) = open_in_process(&fd, 0).unwrap();
        let r = &cp.region;
        r.u64_at(r.ctl(1, OFF_WRITE)).store(1 << 40, SeqCst);
        let mut ok = || Ok(());
        let mut w = Waiter {
            deadline: never(),
            check: &mut ok,
        };
        assert!(matches!(
            hc.read_message(&mut w),
            Err(TransportError::Garbage(_))
        ));
    }

    #[test]
    fn a_bad_length_prefix_is_garbage() {
        let (fd, _hp, mut hc) = create(4096, 0).unwrap();
        let (mut cp, _cc) = open_in_process(&fd, 0).unwrap();
        let mut ok = || Ok(());
        let mut w = Waiter {
            deadline: never(),
            check: &mut ok,
        };
        cp.write(&[&[0xff, 0xff, 0xff, 0xff]], &mut w).unwrap();
        assert!(matches!(
            hc.read_message(&mut w),
            Err(TransportError::Garbage(_))
        ));
    }
}

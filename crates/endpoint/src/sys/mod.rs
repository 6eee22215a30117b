//! The only unsafe code of this crate: modem-line and break ioctls (`TIOCMGET`, `TIOCMBIS`,
//! `TIOCMBIC`, `TIOCSBRK`, `TIOCCBRK`) on a tty, which `rustix` has no safe wrapper for, registering an owned
//! descriptor with tokio's reactor (`AsyncFd::register`, unsafe since tokio 1.54), and the
//! System V shared-memory segments that MIT-SHM images live in ([`ShmSegment`]: `shmget`,
//! `shmat`, `shmdt`, `shmctl`), resetting SIGPIPE for the printing commands
//! ([`default_sigpipe`]) and setting glibc's allocator thresholds ([`tune_allocator`]);
//! Video4Linux2 ioctls and capture-buffer mappings in `v4l2.rs`.
//! Termios and pty calls go through `rustix`'s safe API elsewhere.

pub(crate) mod v4l2;

use rustix::ioctl::{ioctl, Getter, NoArg, Opcode, Setter};
use std::os::fd::AsFd;

const TIOCMGET: Opcode = libc::TIOCMGET as Opcode;
const TIOCMBIS: Opcode = libc::TIOCMBIS as Opcode;
const TIOCMBIC: Opcode = libc::TIOCMBIC as Opcode;
const TIOCSBRK: Opcode = libc::TIOCSBRK as Opcode;
const TIOCCBRK: Opcode = libc::TIOCCBRK as Opcode;

/// Holds the line at space (a break) until told otherwise (`on` false ends it).
pub(crate) fn set_break(fd: impl AsFd, on: bool) -> std::io::Result<()> {
    if on {
        // SAFETY: TIOCSBRK takes no argument; `NoArg` passes none.
        unsafe { ioctl(fd, NoArg::<TIOCSBRK>::new()) }?;
    } else {
        // SAFETY: as above, for TIOCCBRK.
        unsafe { ioctl(fd, NoArg::<TIOCCBRK>::new()) }?;
    }
    Ok(())
}

/// The modem-line bits of a tty (`TIOCM_*`).
pub(crate) fn tiocmget(fd: impl AsFd) -> std::io::Result<libc::c_int> {
    // SAFETY: TIOCMGET takes a pointer to an `int` that the kernel fills in; `Getter` passes a
    // pointer to its own `MaybeUninit<c_int>` and reads it only after the call succeeded.
    let bits = unsafe { ioctl(fd, Getter::<TIOCMGET, libc::c_int>::new()) }?;
    Ok(bits)
}

/// Sets (`on`) or clears (`!on`) the modem-line bits `bits` (`TIOCM_DTR`, `TIOCM_RTS`).
pub(crate) fn tiocm_set(fd: impl AsFd, bits: libc::c_int, on: bool) -> std::io::Result<()> {
    if on {
        // SAFETY: TIOCMBIS reads one `int` through the pointer `Setter` passes to its own copy
        // of `bits`, which outlives the call; the kernel does not keep the pointer.
        unsafe { ioctl(fd, Setter::<TIOCMBIS, libc::c_int>::new(bits)) }?;
    } else {
        // SAFETY: as above, for TIOCMBIC.
        unsafe { ioctl(fd, Setter::<TIOCMBIC, libc::c_int>::new(bits)) }?;
    }
    Ok(())
}

/// Registers `fd` with the current tokio runtime's reactor (must be called inside one).
pub(crate) fn async_fd(
    fd: std::os::fd::OwnedFd,
) -> std::io::Result<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>> {
    // SAFETY: an `OwnedFd` is a valid open descriptor that it owns; it moves into the
    // `AsyncFd`, which never replaces it, so `as_raw_fd()` returns that same descriptor, still
    // open and referring to the same file description, until the `AsyncFd` is dropped.
    unsafe { tokio::io::unix::AsyncFd::register(fd) }.map_err(|e| e.into_parts().1)
}

/// A System V shared-memory segment attached to this process, for MIT-SHM images: the X
/// server attaches the same segment (`ShmAttach` with [`ShmSegment::id`]) and reads or writes
/// image data in it.
///
/// The owner must only touch the bytes ([`ShmSegment::bytes`], [`ShmSegment::bytes_mut`])
/// while no request that uses the segment is pending at the X server: after the reply of a
/// `ShmGetImage`, and after a round trip following a `ShmPutImage`. Dropping it detaches it
/// and removes the segment (if [`ShmSegment::remove`] has not already marked it).
pub(crate) struct ShmSegment {
    id: libc::c_int,
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    removed: bool,
}

// SAFETY: the segment is plain memory mapped into the whole process; the pointer has no
// thread affinity, and `ShmSegment` hands out references only through `&self` / `&mut self`,
// so moving it to another thread is as safe as moving a `Vec<u8>`.
unsafe impl Send for ShmSegment {}

impl std::fmt::Debug for ShmSegment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ShmSegment(id {}, {} bytes)", self.id, self.len)
    }
}

impl ShmSegment {
    /// Creates a private segment of `len` bytes (mode 0600) and attaches it read-write.
    pub(crate) fn new(len: usize) -> std::io::Result<ShmSegment> {
        if len == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "empty shared-memory segment",
            ));
        }
        // SAFETY: shmget takes no pointers; IPC_PRIVATE always creates a new segment.
        let id = unsafe { libc::shmget(libc::IPC_PRIVATE, len, libc::IPC_CREAT | 0o600) };
        if id < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `id` is the segment just created; a null address lets the kernel choose
        // where to map it; flags 0 = read-write. The result is checked below.
        let addr = unsafe { libc::shmat(id, std::ptr::null(), 0) };
        if addr as isize == -1 {
            let e = std::io::Error::last_os_error();
            // SAFETY: IPC_RMID on our own segment with a null buffer, as shmctl(2) allows.
            unsafe { libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()) };
            return Err(e);
        }
        let Some(ptr) = std::ptr::NonNull::new(addr.cast::<u8>()) else {
            return Err(std::io::Error::other("shmat returned a null address"));
        };
        Ok(ShmSegment {
            id,
            ptr,
            len,
            removed: false,
        })
    }

    /// The segment id (`shmid`) to pass to `ShmAttach`.
    pub(crate) fn id(&self) -> u32 {
        // shmget never returns a negative id on success.
        self.id as u32
    }

    /// Size in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Marks the segment for removal: it disappears once every process (this one and the X
    /// server) has detached, even if this process dies. Call it once the server has attached.
    pub(crate) fn remove(&mut self) {
        if !self.removed {
            // SAFETY: IPC_RMID on our own segment with a null buffer, as shmctl(2) allows.
            unsafe { libc::shmctl(self.id, libc::IPC_RMID, std::ptr::null_mut()) };
            self.removed = true;
        }
    }

    /// The segment's bytes (see the type's rule on when they may be read).
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` is the start of a live mapping of `len` bytes (shmat succeeded and it
        // stays attached until drop); the owner reads only while the X server does not write
        // (no ShmGetImage pending), which the type's contract requires.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The segment's bytes, writable (see the type's rule on when they may be written).
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; `&mut self` makes this the only reference this process holds,
        // and the owner writes only while no request using the segment is pending.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for ShmSegment {
    fn drop(&mut self) {
        // SAFETY: `ptr` is the address shmat returned, still attached; no reference from
        // `bytes`/`bytes_mut` outlives `self`.
        unsafe { libc::shmdt(self.ptr.as_ptr().cast()) };
        self.remove();
    }
}

/// Restores the default action of SIGPIPE (end quietly), as Unix tools have, for commands
/// that only print: `ndd check FILE | head -1` must not panic on the closed pipe. (Rust
/// starts programs with SIGPIPE ignored; commands that stream frames to stdout keep that
/// and handle EPIPE themselves.)
pub fn default_sigpipe() {
    // SAFETY: signal(2) with SIG_DFL installs no handler code; it only resets the action of
    // one signal for the process and is called at start-up, before any other thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Keeps large frame buffers in the heap (glibc only; a no-op elsewhere, and when the user set
/// `MALLOC_MMAP_THRESHOLD_` or `MALLOC_TRIM_THRESHOLD_`).
///
/// glibc serves allocations above its mmap threshold (128 KiB, raised only as such blocks are
/// freed) with fresh mappings and gives freed heap memory back above its trim threshold
/// (128 KiB): a link receiving 1 MB frames then takes a page fault per 4 KiB of every frame as
/// the kernel copies it in (6 % of the receiving side's time in a perf profile). With blocks
/// up to 32 MiB served from the heap, and up to 64 MiB of freed memory kept for reuse, two
/// `ndd run` processes moved 1 MB frames 29 % faster over plain TCP (median 5.9 vs 4.6 GB/s,
/// 5 runs each) and ~30 % faster over TLS, at the same peak RSS (26–36 MB): docs/bench/links.md.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_some()
            || std::env::var_os("MALLOC_TRIM_THRESHOLD_").is_some()
        {
            return;
        }
        // SAFETY: mallopt(3) only sets two of the allocator's parameters (values in range:
        // the mmap threshold at most 32 MiB on 64-bit, as glibc requires); it is called first
        // thing in `main`, before any other thread exists or allocates.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
            libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
        }
    }
}

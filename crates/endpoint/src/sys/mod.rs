//! The only unsafe code of this crate: modem-line ioctls (`TIOCMGET`, `TIOCMBIS`,
//! `TIOCMBIC`) on a tty, which `rustix` has no safe wrapper for, and registering an owned
//! descriptor with tokio's reactor (`AsyncFd::register`, unsafe since tokio 1.54). Termios and
//! pty calls go through `rustix`'s safe API elsewhere.

use rustix::ioctl::{ioctl, Getter, Opcode, Setter};
use std::os::fd::AsFd;

const TIOCMGET: Opcode = libc::TIOCMGET as Opcode;
const TIOCMBIS: Opcode = libc::TIOCMBIS as Opcode;
const TIOCMBIC: Opcode = libc::TIOCMBIC as Opcode;

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

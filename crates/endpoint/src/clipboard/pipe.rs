//! What the Wayland clipboards (`wayland-clipboard`, `gnome-clipboard`) share: the text types
//! they read and offer, and the pipes pasted data goes through.

use super::{PNG, TEXT};
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

/// Text types, in the order a source prefers them.
pub(super) const TEXT_TYPES: [&str; 5] = [TEXT, "UTF8_STRING", "text/plain", "STRING", "TEXT"];

/// Pastes being written at once, at most.
pub(super) const WRITERS: usize = 8;
/// How long one paste may take to be read by the program that asked.
pub(super) const WRITE_WAIT: Duration = Duration::from_secs(10);

/// The formats a clipboard offering `types` is sent with: its text (the first of
/// [`TEXT_TYPES`] it offers, as UTF-8) and, with `images`, its PNG, each read by `read(type,
/// bytes left)` (`None`: not handed over in time, or past the bytes left), at most
/// `max_bytes` together.
pub(super) fn read_formats<E>(
    types: &[String],
    images: bool,
    max_bytes: u64,
    mut read: impl FnMut(&str, u64) -> Result<Option<Vec<u8>>, E>,
) -> Result<Vec<(String, Vec<u8>)>, E> {
    let mut formats = Vec::new();
    let mut room = max_bytes;
    if let Some(t) = TEXT_TYPES.iter().find(|t| types.iter().any(|x| x == *t)) {
        if let Some(d) = read(t, room)? {
            room = room.saturating_sub(d.len() as u64);
            formats.push((TEXT.to_string(), d));
        }
    }
    if images && types.iter().any(|t| t == PNG) {
        if let Some(d) = read(PNG, room)? {
            formats.push((PNG.to_string(), d));
        }
    }
    Ok(formats)
}

/// Waits up to `left` (at most 0.5 s) for `f` to be ready for `flags`; `None` when poll
/// fails (other than interrupted): the caller gives up rather than spin.
fn ready(f: &std::fs::File, flags: rustix::event::PollFlags, left: Duration) -> Option<bool> {
    use rustix::event::{poll, PollFd, Timespec};
    let t = Timespec {
        tv_sec: 0,
        tv_nsec: left.min(Duration::from_millis(500)).as_nanos() as _,
    };
    let mut fds = [PollFd::new(f, flags)];
    match poll(&mut fds, Some(&t)) {
        Ok(n) => Some(n > 0),
        Err(rustix::io::Errno::INTR) => Some(false),
        Err(_) => None,
    }
}

/// Writes `data` to `fd` (a pipe a program reads), giving up after `wait`; whether all of it
/// was written.
pub(super) fn write_within(fd: OwnedFd, data: &[u8], wait: Duration) -> bool {
    if rustix::fs::fcntl_setfl(&fd, rustix::fs::OFlags::NONBLOCK).is_err() {
        return false;
    }
    let mut f = std::fs::File::from(fd);
    let t0 = Instant::now();
    let mut at = 0;
    while at < data.len() {
        let left = wait.saturating_sub(t0.elapsed());
        if left.is_zero() {
            return false;
        }
        match ready(&f, rustix::event::PollFlags::OUT, left) {
            Some(true) => {}
            Some(false) => continue,
            None => return false,
        }
        match f.write(&data[at..]) {
            Ok(0) => return false,
            Ok(n) => at += n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                ) => {}
            Err(_) => return false,
        }
    }
    true
}

/// Reads `fd` to its end (at most `limit` bytes) within `wait`; `None` past either.
pub(super) fn read_within(fd: OwnedFd, limit: u64, wait: Duration) -> Option<Vec<u8>> {
    rustix::fs::fcntl_setfl(&fd, rustix::fs::OFlags::NONBLOCK).ok()?;
    let mut f = std::fs::File::from(fd);
    let t0 = Instant::now();
    let mut data = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let left = wait.saturating_sub(t0.elapsed());
        if left.is_zero() {
            return None;
        }
        if !ready(&f, rustix::event::PollFlags::IN, left)? {
            continue;
        }
        match f.read(&mut buf) {
            Ok(0) => return Some(data),
            Ok(n) => {
                data.extend_from_slice(&buf[..n]);
                if data.len() as u64 > limit {
                    return None;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                ) => {}
            Err(_) => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pipe() -> (OwnedFd, OwnedFd) {
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).expect("pipe")
    }

    #[test]
    fn what_is_written_is_read_whole_and_a_silent_writer_is_given_up() {
        let (r, w) = pipe();
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let d = data.clone();
        let t = std::thread::spawn(move || write_within(w, &d, Duration::from_secs(5)));
        assert_eq!(read_within(r, 1 << 20, Duration::from_secs(5)), Some(data));
        assert!(t.join().expect("writer"), "all of it written");
        // Too much: refused, not kept.
        let (r, w) = pipe();
        let t = std::thread::spawn(move || write_within(w, &[7; 5000], Duration::from_secs(5)));
        assert_eq!(read_within(r, 4096, Duration::from_secs(5)), None);
        let _ = t.join();
        // A writer that never closes: given up after the wait.
        let (r, _w) = pipe();
        let t0 = Instant::now();
        assert_eq!(read_within(r, 100, Duration::from_millis(200)), None);
        assert!(t0.elapsed() < Duration::from_secs(2));
        // A reader that never reads: the write gives up too.
        let (_r, w) = pipe();
        assert!(!write_within(
            w,
            &vec![1; 1 << 20],
            Duration::from_millis(200)
        ));
    }
}

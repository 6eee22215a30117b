//! Video4Linux2 calls for the `v4l2` camera source and the `v4l2loopback` sink: the structures
//! of `<linux/videodev2.h>` this crate uses (x86_64/aarch64 layout; a test compiles the kernel
//! header with the C compiler and compares sizes, offsets and ioctl numbers), the ioctls, and
//! the capture buffers the driver maps into our memory (`mmap`, streaming I/O).
//!
//! Safe wrappers only leave this file; each `unsafe` block says why it holds.

use rustix::ioctl::{ioctl, opcode, Getter, Opcode, Setter, Updater};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

/// `V4L2_BUF_TYPE_VIDEO_CAPTURE`.
pub(crate) const BUF_TYPE_CAPTURE: u32 = 1;
/// `V4L2_BUF_TYPE_VIDEO_OUTPUT`.
pub(crate) const BUF_TYPE_OUTPUT: u32 = 2;
/// `V4L2_MEMORY_MMAP`.
pub(crate) const MEMORY_MMAP: u32 = 1;
/// `V4L2_FIELD_NONE` (progressive).
pub(crate) const FIELD_NONE: u32 = 1;
/// `V4L2_CAP_VIDEO_CAPTURE`.
pub(crate) const CAP_VIDEO_CAPTURE: u32 = 0x0000_0001;
/// `V4L2_CAP_VIDEO_OUTPUT`.
pub(crate) const CAP_VIDEO_OUTPUT: u32 = 0x0000_0002;
/// `V4L2_CAP_STREAMING`.
pub(crate) const CAP_STREAMING: u32 = 0x0400_0000;
/// `V4L2_CAP_DEVICE_CAPS`: `device_caps` is valid.
pub(crate) const CAP_DEVICE_CAPS: u32 = 0x8000_0000;

/// A four-character code (`v4l2_fourcc`).
pub(crate) const fn fourcc(c: &[u8; 4]) -> u32 {
    (c[0] as u32) | (c[1] as u32) << 8 | (c[2] as u32) << 16 | (c[3] as u32) << 24
}

/// `struct v4l2_capability`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Capability {
    pub driver: [u8; 16],
    pub card: [u8; 32],
    pub bus_info: [u8; 32],
    pub version: u32,
    pub capabilities: u32,
    pub device_caps: u32,
    pub reserved: [u32; 3],
}

impl Capability {
    /// What this device node does (`device_caps` when the driver fills it).
    pub(crate) fn caps(&self) -> u32 {
        if self.capabilities & CAP_DEVICE_CAPS != 0 {
            self.device_caps
        } else {
            self.capabilities
        }
    }

    /// The card's name.
    pub(crate) fn card(&self) -> String {
        let end = self.card.iter().position(|&b| b == 0).unwrap_or(32);
        String::from_utf8_lossy(&self.card[..end]).into_owned()
    }
}

/// `struct v4l2_pix_format`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PixFormat {
    pub width: u32,
    pub height: u32,
    pub pixelformat: u32,
    pub field: u32,
    pub bytesperline: u32,
    pub sizeimage: u32,
    pub colorspace: u32,
    pub priv_: u32,
    pub flags: u32,
    pub ycbcr_enc: u32,
    pub quantization: u32,
    pub xfer_func: u32,
}

/// `struct v4l2_format` for the single-planar video types: the type, then the union (8-byte
/// aligned: other members hold pointers) of which only `pix` is used, 200 bytes in all.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Format {
    pub type_: u32,
    _pad: u32,
    pub pix: PixFormat,
    _rest: [u8; 200 - std::mem::size_of::<PixFormat>()],
    _align: [u64; 0],
}

impl Format {
    /// A format of `type_` holding `pix`.
    pub(crate) fn new(type_: u32, pix: PixFormat) -> Format {
        Format {
            type_,
            _pad: 0,
            pix,
            _rest: [0; 200 - std::mem::size_of::<PixFormat>()],
            _align: [],
        }
    }
}

/// `struct v4l2_requestbuffers`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RequestBuffers {
    pub count: u32,
    pub type_: u32,
    pub memory: u32,
    pub capabilities: u32,
    pub flags: u8,
    pub reserved: [u8; 3],
}

/// `struct timeval` as the kernel lays it out in `v4l2_buffer` (64-bit).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Timeval {
    pub sec: i64,
    pub usec: i64,
}

/// `struct v4l2_timecode`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Timecode {
    pub type_: u32,
    pub flags: u32,
    pub frames: u8,
    pub seconds: u8,
    pub minutes: u8,
    pub hours: u8,
    pub userbits: [u8; 4],
}

/// `struct v4l2_buffer` (single-planar; `m` as the mmap offset, 8 bytes wide).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Buffer {
    pub index: u32,
    pub type_: u32,
    pub bytesused: u32,
    pub flags: u32,
    pub field: u32,
    pub timestamp: Timeval,
    pub timecode: Timecode,
    pub sequence: u32,
    pub memory: u32,
    /// `m.offset` in its low 32 bits (the union is as wide as a pointer).
    pub m: u64,
    pub length: u32,
    pub reserved2: u32,
    pub request_fd: i32,
}

/// `struct v4l2_fract`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Fract {
    pub numerator: u32,
    pub denominator: u32,
}

/// `struct v4l2_captureparm`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CaptureParm {
    pub capability: u32,
    pub capturemode: u32,
    pub timeperframe: Fract,
    pub extendedmode: u32,
    pub readbuffers: u32,
    pub reserved: [u32; 4],
}

/// `struct v4l2_streamparm` for capture: the type, then the 200-byte union.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct StreamParm {
    pub type_: u32,
    pub capture: CaptureParm,
    _rest: [u8; 200 - std::mem::size_of::<CaptureParm>()],
}

impl StreamParm {
    /// Capture parameters asking for `fps` frames per second.
    pub(crate) fn capture_fps(fps: f64) -> StreamParm {
        let (numerator, denominator) = if fps.fract() == 0.0 {
            (1, fps as u32)
        } else {
            (1000, (fps * 1000.0).round() as u32)
        };
        StreamParm {
            type_: BUF_TYPE_CAPTURE,
            capture: CaptureParm {
                timeperframe: Fract {
                    numerator,
                    denominator,
                },
                ..CaptureParm::default()
            },
            _rest: [0; 200 - std::mem::size_of::<CaptureParm>()],
        }
    }
}

pub(crate) const VIDIOC_QUERYCAP: Opcode = opcode::read::<Capability>(b'V', 0);
pub(crate) const VIDIOC_S_FMT: Opcode = opcode::read_write::<Format>(b'V', 5);
pub(crate) const VIDIOC_REQBUFS: Opcode = opcode::read_write::<RequestBuffers>(b'V', 8);
pub(crate) const VIDIOC_QUERYBUF: Opcode = opcode::read_write::<Buffer>(b'V', 9);
pub(crate) const VIDIOC_QBUF: Opcode = opcode::read_write::<Buffer>(b'V', 15);
pub(crate) const VIDIOC_DQBUF: Opcode = opcode::read_write::<Buffer>(b'V', 17);
pub(crate) const VIDIOC_STREAMON: Opcode = opcode::write::<libc::c_int>(b'V', 18);
pub(crate) const VIDIOC_STREAMOFF: Opcode = opcode::write::<libc::c_int>(b'V', 19);
pub(crate) const VIDIOC_S_PARM: Opcode = opcode::read_write::<StreamParm>(b'V', 22);

/// `VIDIOC_QUERYCAP`.
pub(crate) fn querycap(fd: impl AsFd) -> std::io::Result<Capability> {
    // SAFETY: VIDIOC_QUERYCAP fills a `struct v4l2_capability`, which `Capability` lays out
    // exactly (checked against the kernel header in the tests); `Getter` passes a pointer to
    // its own uninitialised `Capability` and reads it only after the call succeeded.
    Ok(unsafe { ioctl(fd, Getter::<VIDIOC_QUERYCAP, Capability>::new()) }?)
}

/// `VIDIOC_S_FMT`: asks for `f`; the driver answers with what it will do, which is returned.
pub(crate) fn s_fmt(fd: impl AsFd, mut f: Format) -> std::io::Result<Format> {
    // SAFETY: VIDIOC_S_FMT reads and writes a `struct v4l2_format` through the pointer
    // `Updater` passes to `f`, which lays it out exactly (header test) and lives for the call.
    unsafe { ioctl(fd, Updater::<VIDIOC_S_FMT, Format>::new(&mut f)) }?;
    Ok(f)
}

/// `VIDIOC_S_PARM`; the driver's answer is returned (it may round the frame interval).
pub(crate) fn s_parm(fd: impl AsFd, mut p: StreamParm) -> std::io::Result<StreamParm> {
    // SAFETY: VIDIOC_S_PARM reads and writes a `struct v4l2_streamparm`, which `StreamParm`
    // lays out exactly (header test), through the pointer `Updater` passes for the call.
    unsafe { ioctl(fd, Updater::<VIDIOC_S_PARM, StreamParm>::new(&mut p)) }?;
    Ok(p)
}

/// `VIDIOC_REQBUFS` of `count` mmap buffers of `type_`; how many the driver gave.
pub(crate) fn reqbufs(fd: impl AsFd, type_: u32, count: u32) -> std::io::Result<u32> {
    let mut r = RequestBuffers {
        count,
        type_,
        memory: MEMORY_MMAP,
        ..RequestBuffers::default()
    };
    // SAFETY: VIDIOC_REQBUFS reads and writes a `struct v4l2_requestbuffers` (laid out by
    // `RequestBuffers`, header test) through the pointer `Updater` passes for the call.
    unsafe { ioctl(fd, Updater::<VIDIOC_REQBUFS, RequestBuffers>::new(&mut r)) }?;
    Ok(r.count)
}

/// A `v4l2_buffer` for mmap buffer `index` of `type_`.
pub(crate) fn buffer(type_: u32, index: u32) -> Buffer {
    Buffer {
        index,
        type_,
        memory: MEMORY_MMAP,
        ..Buffer::default()
    }
}

/// `VIDIOC_QUERYBUF`, `VIDIOC_QBUF` or `VIDIOC_DQBUF` on `b`.
fn buf_ioctl<const OP: Opcode>(fd: BorrowedFd<'_>, b: &mut Buffer) -> std::io::Result<()> {
    // SAFETY: the three buffer ioctls read and write a `struct v4l2_buffer` (laid out by
    // `Buffer`, header test; `memory` is MMAP so the union holds an offset, not a pointer)
    // through the pointer `Updater` passes to `b`, which lives for the call.
    unsafe { ioctl(fd, Updater::<OP, Buffer>::new(b)) }?;
    Ok(())
}

/// `VIDIOC_QUERYBUF`: the buffer's length and mmap offset.
pub(crate) fn querybuf(fd: impl AsFd, b: &mut Buffer) -> std::io::Result<()> {
    buf_ioctl::<VIDIOC_QUERYBUF>(fd.as_fd(), b)
}

/// `VIDIOC_QBUF`: hands the buffer to the driver.
pub(crate) fn qbuf(fd: impl AsFd, b: &mut Buffer) -> std::io::Result<()> {
    buf_ioctl::<VIDIOC_QBUF>(fd.as_fd(), b)
}

/// `VIDIOC_DQBUF`: takes a filled buffer back (blocks unless the file is non-blocking).
pub(crate) fn dqbuf(fd: impl AsFd, b: &mut Buffer) -> std::io::Result<()> {
    buf_ioctl::<VIDIOC_DQBUF>(fd.as_fd(), b)
}

/// `VIDIOC_STREAMON` (`on`) or `VIDIOC_STREAMOFF` for `type_`.
pub(crate) fn stream(fd: impl AsFd, type_: u32, on: bool) -> std::io::Result<()> {
    let t = type_ as libc::c_int;
    if on {
        // SAFETY: VIDIOC_STREAMON reads an `int` (the buffer type) through the pointer
        // `Setter` passes to its own copy of `t`.
        unsafe { ioctl(fd, Setter::<VIDIOC_STREAMON, libc::c_int>::new(t)) }?;
    } else {
        // SAFETY: as above, for VIDIOC_STREAMOFF.
        unsafe { ioctl(fd, Setter::<VIDIOC_STREAMOFF, libc::c_int>::new(t)) }?;
    }
    Ok(())
}

/// A capture buffer the driver mapped into this process (read-only), unmapped on drop.
#[derive(Debug)]
pub(crate) struct Mapped {
    ptr: *mut libc::c_void,
    len: usize,
}

// SAFETY: the mapping belongs to this value alone (no other handle to the pointer exists) and
// is only read through `&self`; moving it to another thread moves that sole ownership.
unsafe impl Send for Mapped {}

impl Mapped {
    /// Maps the buffer `b` (after `querybuf`) of the device `fd`.
    pub(crate) fn new(fd: impl AsFd, b: &Buffer) -> std::io::Result<Mapped> {
        let len = b.length as usize;
        // SAFETY: a fresh shared read-only mapping of `len` bytes of the device at the offset
        // the driver gave for this buffer; the kernel picks the address, nothing else is
        // touched, and failure is checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_fd().as_raw_fd(),
                (b.m & 0xffff_ffff) as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapped { ptr, len })
    }

    /// The first `n` bytes (at most the buffer's length).
    pub(crate) fn bytes(&self, n: usize) -> &[u8] {
        // SAFETY: `ptr` maps `len` readable bytes for as long as `self` lives (unmapped only
        // in `drop`); `n` is clamped to `len`. The driver writes the buffer only while it is
        // queued, and the caller reads it only between DQBUF and the next QBUF.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, n.min(self.len)) }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly the mapping made in `new`, unmapped only here, and
        // no slice from `bytes` outlives `self`.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// Compiles a C program against the kernel's `<linux/videodev2.h>` that prints the sizes,
    /// offsets and ioctl numbers used here, and compares them with this file's.
    #[test]
    fn the_structures_and_ioctl_numbers_match_the_kernel_header() {
        let header = std::path::Path::new("/usr/include/linux/videodev2.h");
        if !header.exists() {
            eprintln!("SKIPPED: no /usr/include/linux/videodev2.h (Debian's linux-libc-dev)");
            return;
        }
        let dir = std::env::temp_dir().join(format!("ndd-v4l2-abi-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let c = dir.join("abi.c");
        std::fs::write(
            &c,
            r#"#include <stdio.h>
#include <stddef.h>
#include <linux/videodev2.h>
#define S(t) printf(#t " %zu\n", sizeof(struct t));
#define O(t, f) printf(#t "." #f " %zu\n", offsetof(struct t, f));
#define I(n) printf(#n " %lu\n", (unsigned long)n);
int main(void) {
  S(v4l2_capability) O(v4l2_capability, capabilities) O(v4l2_capability, device_caps)
  S(v4l2_pix_format) O(v4l2_pix_format, pixelformat) O(v4l2_pix_format, xfer_func)
  S(v4l2_format) O(v4l2_format, fmt.pix) O(v4l2_format, fmt.pix.sizeimage)
  S(v4l2_requestbuffers) O(v4l2_requestbuffers, memory)
  S(v4l2_buffer) O(v4l2_buffer, timestamp) O(v4l2_buffer, sequence) O(v4l2_buffer, memory)
  O(v4l2_buffer, m.offset) O(v4l2_buffer, length) O(v4l2_buffer, request_fd)
  S(v4l2_streamparm) O(v4l2_streamparm, parm.capture.timeperframe)
  I(VIDIOC_QUERYCAP) I(VIDIOC_S_FMT) I(VIDIOC_REQBUFS) I(VIDIOC_QUERYBUF)
  I(VIDIOC_QBUF) I(VIDIOC_DQBUF) I(VIDIOC_STREAMON) I(VIDIOC_STREAMOFF) I(VIDIOC_S_PARM)
  I(V4L2_PIX_FMT_YUYV) I(V4L2_PIX_FMT_MJPEG)
  return 0;
}
"#,
        )
        .unwrap();
        let exe = dir.join("abi");
        let built = std::process::Command::new("cc")
            .arg(&c)
            .arg("-o")
            .arg(&exe)
            .output();
        let built = match built {
            Ok(o) if o.status.success() => o,
            Ok(o) => panic!(
                "cc could not build the header check: {}",
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => {
                eprintln!("SKIPPED: no C compiler (cc) to read the kernel header with: {e}");
                return;
            }
        };
        drop(built);
        let out = std::process::Command::new(&exe).output().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let text = String::from_utf8(out.stdout).unwrap();
        let got: std::collections::HashMap<&str, u64> = text
            .lines()
            .filter_map(|l| l.rsplit_once(' '))
            .map(|(k, v)| (k, v.parse().unwrap()))
            .collect();
        let ours: Vec<(&str, u64)> = vec![
            ("v4l2_capability", size_of::<Capability>() as u64),
            (
                "v4l2_capability.capabilities",
                offset_of!(Capability, capabilities) as u64,
            ),
            (
                "v4l2_capability.device_caps",
                offset_of!(Capability, device_caps) as u64,
            ),
            ("v4l2_pix_format", size_of::<PixFormat>() as u64),
            (
                "v4l2_pix_format.pixelformat",
                offset_of!(PixFormat, pixelformat) as u64,
            ),
            (
                "v4l2_pix_format.xfer_func",
                offset_of!(PixFormat, xfer_func) as u64,
            ),
            ("v4l2_format", size_of::<Format>() as u64),
            ("v4l2_format.fmt.pix", offset_of!(Format, pix) as u64),
            (
                "v4l2_format.fmt.pix.sizeimage",
                (offset_of!(Format, pix) + offset_of!(PixFormat, sizeimage)) as u64,
            ),
            ("v4l2_requestbuffers", size_of::<RequestBuffers>() as u64),
            (
                "v4l2_requestbuffers.memory",
                offset_of!(RequestBuffers, memory) as u64,
            ),
            ("v4l2_buffer", size_of::<Buffer>() as u64),
            (
                "v4l2_buffer.timestamp",
                offset_of!(Buffer, timestamp) as u64,
            ),
            ("v4l2_buffer.sequence", offset_of!(Buffer, sequence) as u64),
            ("v4l2_buffer.memory", offset_of!(Buffer, memory) as u64),
            ("v4l2_buffer.m.offset", offset_of!(Buffer, m) as u64),
            ("v4l2_buffer.length", offset_of!(Buffer, length) as u64),
            (
                "v4l2_buffer.request_fd",
                offset_of!(Buffer, request_fd) as u64,
            ),
            ("v4l2_streamparm", size_of::<StreamParm>() as u64),
            (
                "v4l2_streamparm.parm.capture.timeperframe",
                (offset_of!(StreamParm, capture) + offset_of!(CaptureParm, timeperframe)) as u64,
            ),
            ("VIDIOC_QUERYCAP", u64::from(VIDIOC_QUERYCAP)),
            ("VIDIOC_S_FMT", u64::from(VIDIOC_S_FMT)),
            ("VIDIOC_REQBUFS", u64::from(VIDIOC_REQBUFS)),
            ("VIDIOC_QUERYBUF", u64::from(VIDIOC_QUERYBUF)),
            ("VIDIOC_QBUF", u64::from(VIDIOC_QBUF)),
            ("VIDIOC_DQBUF", u64::from(VIDIOC_DQBUF)),
            ("VIDIOC_STREAMON", u64::from(VIDIOC_STREAMON)),
            ("VIDIOC_STREAMOFF", u64::from(VIDIOC_STREAMOFF)),
            ("VIDIOC_S_PARM", u64::from(VIDIOC_S_PARM)),
            ("V4L2_PIX_FMT_YUYV", u64::from(fourcc(b"YUYV"))),
            ("V4L2_PIX_FMT_MJPEG", u64::from(fourcc(b"MJPG"))),
        ];
        for (name, v) in ours {
            assert_eq!(got.get(name), Some(&v), "{name}: header says {text}");
        }
    }
}

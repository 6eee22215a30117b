//! A real camera through Video4Linux2: the `v4l2` source (a webcam's YUYV or MJPEG frames,
//! captured with streaming I/O, as display records: BGRX keyframes, like `camera-sim`), and the
//! `v4l2loopback` sink (the pictures written as YUYV to a v4l2loopback device, so browsers and
//! video-call programs on the app side open the remote camera as `/dev/videoN`).
//!
//! The ioctls and buffer mappings live in `sys/v4l2.rs`; this file holds the negotiation, the
//! loops and the pixel conversions (sans-IO, unit-tested: BT.601 limited range, as webcams and
//! v4l2loopback readers use for YUYV).

use super::pattern;
use crate::common::delivered::Delivered;
use crate::common::emitter::Emitter;
use crate::common::error::EndpointError;
use crate::common::report::{SinkReport, SinkTask, SourceTask};
use crate::display::{PixelFormat, Rect, UpdateHeader, UpdateLayout, FLAG_KEYFRAME};
use crate::sys::v4l2 as sys;
use ndd_core::frame::DEFAULT_HEADROOM;
use ndd_core::{Frame, RateLimit};
use serde::{Deserialize, Serialize};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::runtime::Handle;
use tokio::sync::mpsc::{Receiver, Sender};

/// Capture buffers asked of the driver.
const BUFFERS: u32 = 4;
/// How long the capture waits for a frame before it says the camera is silent.
const SILENT: Duration = Duration::from_secs(2);

/// The pixel format the `v4l2` source asks the camera for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CaptureFormat {
    /// YUYV if the camera gives it at the size asked, else MJPEG.
    #[default]
    Auto,
    /// Uncompressed YUYV 4:2:2.
    Yuyv,
    /// Motion JPEG (decoded on the device side; the `image` pair codes the pictures again).
    Mjpeg,
}

/// `v4l2` source parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct V4l2Config {
    /// The camera's device node, e.g. `/dev/video0` (or a stable `/dev/v4l/by-id/…` name).
    pub path: PathBuf,
    /// Width asked for (the driver may pick the nearest it has; the log says what it gave).
    #[serde(default = "super::default_width")]
    pub width: u16,
    /// Height asked for.
    #[serde(default = "super::default_height")]
    pub height: u16,
    /// Frame rate asked for.
    #[serde(default = "super::default_fps")]
    pub fps: f64,
    /// Pixel format asked for.
    #[serde(default)]
    pub format: CaptureFormat,
    /// Frames to send, then end; endless when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
}

impl V4l2Config {
    /// Checks the ranges; the error names the key.
    pub fn check(&self) -> Result<(), (&'static str, &'static str)> {
        if !(16..=8192).contains(&self.width) || !self.width.is_multiple_of(2) {
            return Err(("width", "must be even, 16..=8192"));
        }
        if !(16..=8192).contains(&self.height) || !self.height.is_multiple_of(2) {
            return Err(("height", "must be even, 16..=8192"));
        }
        super::check_fps(self.fps)
    }
}

/// `v4l2loopback` sink parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct V4l2LoopbackConfig {
    /// The v4l2loopback device node, e.g. `/dev/video10` (`modprobe v4l2loopback
    /// video_nr=10 exclusive_caps=1`).
    pub path: PathBuf,
}

/// Converts YUYV 4:2:2 (BT.601, limited range; rows `stride` bytes apart) to BGRX.
/// `w` is even; `dst` holds `w * h * 4` bytes; missing source bytes read as black.
pub fn yuyv_to_bgrx(src: &[u8], w: usize, h: usize, stride: usize, dst: &mut [u8]) {
    let clamp = |v: i32| v.clamp(0, 255) as u8;
    for y in 0..h {
        let row = src.get(y * stride..y * stride + w * 2).unwrap_or(&[]);
        let out = &mut dst[y * w * 4..(y + 1) * w * 4];
        for (x, o) in out.chunks_exact_mut(8).enumerate() {
            let (y0, u, y1, v) = match row.get(x * 4..x * 4 + 4) {
                Some(p) => (p[0], p[1], p[2], p[3]),
                None => (16, 128, 16, 128),
            };
            let (d, e) = (i32::from(u) - 128, i32::from(v) - 128);
            for (k, yy) in [y0, y1].into_iter().enumerate() {
                let c = 298 * (i32::from(yy) - 16);
                o[k * 4] = clamp((c + 516 * d + 128) >> 8);
                o[k * 4 + 1] = clamp((c - 100 * d - 208 * e + 128) >> 8);
                o[k * 4 + 2] = clamp((c + 409 * e + 128) >> 8);
                o[k * 4 + 3] = 0;
            }
        }
    }
}

/// Converts BGRX to YUYV 4:2:2 (BT.601, limited range), `w * h * 2` bytes into `out`; the
/// chroma of a pixel pair is their average. `w` is even.
pub fn bgrx_to_yuyv(src: &[u8], w: usize, h: usize, out: &mut Vec<u8>) {
    out.clear();
    out.resize(w * h * 2, 0);
    let luma = |b: i32, g: i32, r: i32| ((66 * r + 129 * g + 25 * b + 128) >> 8) + 16;
    for (o, p) in out
        .chunks_exact_mut(4)
        .zip(src.chunks_exact(8))
        .take(w * h / 2)
    {
        let (b0, g0, r0) = (i32::from(p[0]), i32::from(p[1]), i32::from(p[2]));
        let (b1, g1, r1) = (i32::from(p[4]), i32::from(p[5]), i32::from(p[6]));
        let (b, g, r) = ((b0 + b1) / 2, (g0 + g1) / 2, (r0 + r1) / 2);
        o[0] = luma(b0, g0, r0).clamp(0, 255) as u8;
        o[1] = (((-38 * r - 74 * g + 112 * b + 128) >> 8) + 128).clamp(0, 255) as u8;
        o[2] = luma(b1, g1, r1).clamp(0, 255) as u8;
        o[3] = (((112 * r - 94 * g - 18 * b + 128) >> 8) + 128).clamp(0, 255) as u8;
    }
}

/// The four characters of a V4L2 pixel format, for messages.
fn fourcc_name(f: u32) -> String {
    f.to_le_bytes()
        .iter()
        .map(|&b| if b.is_ascii_graphic() { b as char } else { '?' })
        .collect()
}

fn open_device(
    endpoint: &'static str,
    path: &Path,
) -> Result<(std::fs::File, sys::Capability), EndpointError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| {
            let hint = match e.kind() {
                std::io::ErrorKind::NotFound => {
                    "no such device node: `v4l2-ctl --list-devices` (package v4l-utils) lists the cameras; this kernel may have no V4L2 at all (no /dev/video*)"
                }
                std::io::ErrorKind::PermissionDenied => {
                    "add the user to the `video` group (sudo usermod -aG video $USER, then log in again)"
                }
                _ => "is it a camera's device node?",
            };
            EndpointError::Unavailable {
                endpoint,
                what: format!("cannot open {}: {e}", path.display()),
                hint: hint.to_string(),
            }
        })?;
    let cap = sys::querycap(file.as_fd()).map_err(|e| EndpointError::Unavailable {
        endpoint,
        what: format!(
            "{} is not a Video4Linux2 device (VIDIOC_QUERYCAP: {e})",
            path.display()
        ),
        hint: "name a /dev/videoN node".to_string(),
    })?;
    Ok((file, cap))
}

/// Opens a camera's capture node: a Video4Linux2 device that captures video with streaming
/// I/O (also `ndd check --side device`'s probe).
pub(crate) fn open_capture(
    endpoint: &'static str,
    path: &Path,
) -> Result<(std::fs::File, sys::Capability), EndpointError> {
    let (file, cap) = open_device(endpoint, path)?;
    let caps = cap.caps();
    if caps & sys::CAP_VIDEO_CAPTURE == 0 || caps & sys::CAP_STREAMING == 0 {
        return Err(EndpointError::Unavailable {
            endpoint,
            what: format!(
                "{} ({}) cannot capture video with streaming I/O (capabilities {caps:#010x})",
                path.display(),
                cap.card()
            ),
            hint: "name the camera's capture node (a camera may have several /dev/videoN; `v4l2-ctl --list-devices`)".to_string(),
        });
    }
    Ok((file, cap))
}

/// Opens a video output node, as v4l2loopback makes (also `ndd check --side app`'s probe).
pub(crate) fn open_output(
    endpoint: &'static str,
    path: &Path,
) -> Result<std::fs::File, EndpointError> {
    let (file, cap) = open_device(endpoint, path)?;
    if cap.caps() & sys::CAP_VIDEO_OUTPUT == 0 {
        return Err(EndpointError::Unavailable {
            endpoint,
            what: format!(
                "{} ({}) is not a video output device",
                path.display(),
                cap.card()
            ),
            hint: "create one with `modprobe v4l2loopback video_nr=10 exclusive_caps=1` (package v4l2loopback-dkms) and name /dev/video10".to_string(),
        });
    }
    Ok(file)
}

/// Negotiates a capture format: the formats to try in order, the size asked; the driver's
/// answer (its size may differ).
fn negotiate(
    endpoint: &'static str,
    path: &Path,
    fd: impl AsFd,
    c: &V4l2Config,
) -> Result<sys::PixFormat, EndpointError> {
    let yuyv = sys::fourcc(b"YUYV");
    let mjpg = sys::fourcc(b"MJPG");
    // Without the media libraries there is no JPEG decoder: MJPEG is not asked for (a camera
    // that gives only MJPEG is refused here, by name, not a stream that delivers nothing).
    let media = cfg!(feature = "media");
    let order: &[u32] = match c.format {
        CaptureFormat::Auto if media => &[yuyv, mjpg],
        CaptureFormat::Auto => &[yuyv],
        CaptureFormat::Yuyv => &[yuyv],
        CaptureFormat::Mjpeg if media => &[mjpg],
        CaptureFormat::Mjpeg => {
            return Err(EndpointError::Unavailable {
                endpoint,
                what: "this ndd was built without the media libraries, which decode an MJPEG camera".into(),
                hint: "build it with its default features (`./run ndd`, or `cargo build --release -p ndd-cli`), or use format = \"yuyv\"".into(),
            })
        }
    };
    let mut offered = Vec::new();
    for &want in order {
        let ask = sys::Format::new(
            sys::BUF_TYPE_CAPTURE,
            sys::PixFormat {
                width: u32::from(c.width),
                height: u32::from(c.height),
                pixelformat: want,
                field: sys::FIELD_NONE,
                ..sys::PixFormat::default()
            },
        );
        let got = sys::s_fmt(fd.as_fd(), ask).map_err(|e| EndpointError::Unavailable {
            endpoint,
            what: format!(
                "{}: the camera refused the format (VIDIOC_S_FMT: {e})",
                path.display()
            ),
            hint: "is another program using the camera? (fuser -v /dev/video*)".to_string(),
        })?;
        if got.pix.pixelformat == want {
            return Ok(got.pix);
        }
        offered.push(fourcc_name(got.pix.pixelformat));
    }
    Err(EndpointError::Unavailable {
        endpoint,
        what: format!(
            "{}: the camera gives {} where {} was asked",
            path.display(),
            offered.join(", "),
            order
                .iter()
                .map(|&f| fourcc_name(f))
                .collect::<Vec<_>>()
                .join(" or ")
        ),
        hint: "ndd captures YUYV or MJPEG; `v4l2-ctl --list-formats-ext` shows what the camera has"
            .to_string(),
    })
}

/// Starts a `v4l2` source: opens and sets up the camera now (a wrong path or a camera that
/// cannot capture fails here, with what to do), then captures on a blocking thread.
pub(crate) fn spawn_v4l2(
    rt: &Handle,
    endpoint: &'static str,
    c: &V4l2Config,
    stream: u16,
    tx: Sender<Frame>,
) -> Result<SourceTask, EndpointError> {
    let path = c.path.clone();
    let (file, cap) = open_capture(endpoint, &path)?;
    let pix = negotiate(endpoint, &path, file.as_fd(), c)?;
    let fps = match sys::s_parm(file.as_fd(), sys::StreamParm::capture_fps(c.fps)) {
        Ok(p) if p.capture.timeperframe.numerator > 0 => {
            f64::from(p.capture.timeperframe.denominator)
                / f64::from(p.capture.timeperframe.numerator)
        }
        Ok(_) => c.fps,
        Err(e) => {
            tracing::warn!(endpoint, path = %path.display(), "cannot set the frame rate (VIDIOC_S_PARM: {e}); the camera keeps its own");
            c.fps
        }
    };
    let (w, h) = (pix.width, pix.height);
    if w == 0 || h == 0 || w > 8192 || h > 8192 || w % 2 != 0 {
        return Err(EndpointError::Unavailable {
            endpoint,
            what: format!("{}: the camera gave a {w}x{h} picture", path.display()),
            hint: "ask for another width and height".to_string(),
        });
    }
    let unavailable = |what: String| EndpointError::Unavailable {
        endpoint,
        what,
        hint: "is another program using the camera? (fuser -v /dev/video*)".to_string(),
    };
    let n = sys::reqbufs(file.as_fd(), sys::BUF_TYPE_CAPTURE, BUFFERS)
        .map_err(|e| unavailable(format!("{}: VIDIOC_REQBUFS: {e}", path.display())))?;
    if n == 0 {
        return Err(unavailable(format!(
            "{}: the driver gave no capture buffers",
            path.display()
        )));
    }
    let mut maps = Vec::new();
    for i in 0..n {
        let mut b = sys::buffer(sys::BUF_TYPE_CAPTURE, i);
        sys::querybuf(file.as_fd(), &mut b)
            .map_err(|e| unavailable(format!("{}: VIDIOC_QUERYBUF: {e}", path.display())))?;
        maps.push(
            sys::Mapped::new(file.as_fd(), &b)
                .map_err(|e| unavailable(format!("{}: mmap: {e}", path.display())))?,
        );
        sys::qbuf(file.as_fd(), &mut b)
            .map_err(|e| unavailable(format!("{}: VIDIOC_QBUF: {e}", path.display())))?;
    }
    sys::stream(file.as_fd(), sys::BUF_TYPE_CAPTURE, true)
        .map_err(|e| unavailable(format!("{}: VIDIOC_STREAMON: {e}", path.display())))?;
    tracing::info!(endpoint, path = %path.display(), camera = %cap.card(), width = w, height = h,
        format = %fourcc_name(pix.pixelformat), fps, "camera capturing");
    let layout = UpdateLayout::new(
        UpdateHeader {
            width: w as u16,
            height: h as u16,
            format: PixelFormat::Bgrx32,
            flags: FLAG_KEYFRAME,
        },
        vec![Rect::new(0, 0, w as u16, h as u16)],
    )
    .map_err(|e| EndpointError::Config {
        endpoint,
        param: "width",
        reason: e.to_string(),
    })?;
    let count = c.count;
    Ok(rt.spawn_blocking(move || {
        let mut out = Emitter::new(stream, tx);
        let mut jpeg = None;
        let mut bad = ndd_core::ratelimit::RateLimit::default();
        let (w, h) = (w as usize, h as usize);
        let stride = (pix.bytesperline as usize).max(w * 2);
        let result = loop {
            if count.is_some_and(|n| out.report.frames >= n) || out.tx.is_closed() {
                break Ok(());
            }
            match rustix::event::poll(
                &mut [rustix::event::PollFd::new(
                    &file,
                    rustix::event::PollFlags::IN,
                )],
                Some(&rustix::event::Timespec {
                    tv_sec: SILENT.as_secs() as i64,
                    tv_nsec: 0,
                }),
            ) {
                Ok(0) => {
                    if let Some(suppressed) = bad.admit(Instant::now()) {
                        tracing::warn!(endpoint, path = %path.display(), suppressed,
                            "no frame from the camera for {} s", SILENT.as_secs());
                    }
                    continue;
                }
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => break Err(read_err(endpoint, &path, e.into())),
            }
            let mut b = sys::buffer(sys::BUF_TYPE_CAPTURE, 0);
            match sys::dqbuf(file.as_fd(), &mut b) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                // Unplugged: ENODEV.
                Err(e) => break Err(read_err(endpoint, &path, e)),
            }
            let Some(map) = maps.get(b.index as usize) else {
                break Err(read_err(
                    endpoint,
                    &path,
                    std::io::Error::other(format!("the driver returned buffer {}", b.index)),
                ));
            };
            let data = map.bytes(b.bytesused as usize);
            let mut f = Frame::zeroed(out.next_meta(), DEFAULT_HEADROOM, layout.len());
            let p = f.payload_mut();
            let _ = layout.write_headers(p);
            let px = &mut p[layout.pixels(0)];
            let ok = if pix.pixelformat == sys::fourcc(b"MJPG") {
                decode_mjpeg(&mut jpeg, data, w, h, px)
            } else {
                yuyv_to_bgrx(data, w, h, stride, px);
                Ok(())
            };
            // The buffer goes back to the driver before the frame leaves (it was copied).
            let requeued = sys::qbuf(file.as_fd(), &mut b);
            if let Err(e) = ok {
                if let Some(suppressed) = bad.admit(Instant::now()) {
                    tracing::warn!(
                        endpoint,
                        seq = f.meta.seq,
                        suppressed,
                        "camera frame dropped: {e}"
                    );
                }
            } else if !out.send_blocking(f) {
                break Ok(());
            }
            if let Err(e) = requeued {
                break Err(read_err(endpoint, &path, e));
            }
        };
        let _ = sys::stream(file.as_fd(), sys::BUF_TYPE_CAPTURE, false);
        drop(maps);
        tracing::debug!(endpoint, frames = out.report.frames, "source ended");
        result.map(|()| out.report)
    }))
}

fn read_err(endpoint: &'static str, path: &Path, source: std::io::Error) -> EndpointError {
    EndpointError::Read {
        endpoint,
        what: format!("camera {}", path.display()),
        source,
    }
}

/// The MJPEG decoder (libjpeg-turbo; none in a build without the `media` feature).
#[cfg(feature = "media")]
type Mjpeg = turbojpeg::Decompressor;
#[cfg(not(feature = "media"))]
type Mjpeg = ();

/// Without the `media` feature there is no JPEG decoder: an MJPEG camera says so.
#[cfg(not(feature = "media"))]
fn decode_mjpeg(
    _: &mut Option<Mjpeg>,
    _: &[u8],
    _: usize,
    _: usize,
    _: &mut [u8],
) -> Result<(), String> {
    Err("this ndd was built without the media libraries, which decode an MJPEG camera: build it with its default features (`./run ndd`, or `cargo build --release -p ndd-cli`)".into())
}

/// Decodes one MJPEG frame into `w`×`h` BGRX (a frame of another size is an error).
#[cfg(feature = "media")]
fn decode_mjpeg(
    jpeg: &mut Option<Mjpeg>,
    data: &[u8],
    w: usize,
    h: usize,
    px: &mut [u8],
) -> Result<(), String> {
    let d = match jpeg {
        Some(d) => d,
        None => jpeg.insert(turbojpeg::Decompressor::new().map_err(|e| e.to_string())?),
    };
    let hdr = d.read_header(data).map_err(|e| format!("bad JPEG: {e}"))?;
    if (hdr.width, hdr.height) != (w, h) {
        return Err(format!(
            "a {}x{} JPEG in a {w}x{h} stream",
            hdr.width, hdr.height
        ));
    }
    let img = turbojpeg::Image {
        pixels: px,
        width: w,
        pitch: w * 4,
        height: h,
        format: turbojpeg::PixelFormat::BGRX,
    };
    d.decompress(data, img)
        .map_err(|e| format!("bad JPEG: {e}"))
}

/// Starts a `v4l2loopback` sink: checks now that the node is a video output device, then
/// writes each complete picture to it as YUYV (the format set at the first picture and again
/// when the size changes).
pub(crate) fn spawn_v4l2loopback(
    rt: &Handle,
    endpoint: &'static str,
    c: &V4l2LoopbackConfig,
    mut rx: Receiver<Frame>,
    delivered: Delivered,
) -> Result<SinkTask, EndpointError> {
    let path = c.path.clone();
    let mut file = open_output(endpoint, &path)?;
    Ok(rt.spawn_blocking(move || {
        let mut report = SinkReport::default();
        let mut pictures = super::Pictures::new(endpoint, true, false);
        let mut size = None;
        // The peer may change the size with every picture (each one sets the format again).
        let mut resized = RateLimit::with_burst(Duration::from_secs(1), 5);
        let mut yuyv = Vec::new();
        let write_err = |e: std::io::Error| EndpointError::Write {
            endpoint,
            what: path.display().to_string(),
            source: e,
        };
        while let Some(frame) = rx.blocking_recv() {
            report.frames += 1;
            report.bytes += frame.len() as u64;
            if let Some(f) = pictures.apply(&frame) {
                let (w, h) = (usize::from(f.width()), usize::from(f.height()));
                if w % 2 != 0 {
                    pictures.dropped(format_args!(
                        "a {w}-pixel-wide picture cannot be YUYV (even widths only)"
                    ));
                } else {
                    if size != Some((w, h)) {
                        set_output_format(&file, w, h).map_err(|e| {
                            write_err(std::io::Error::other(format!(
                                "cannot set the output format {w}x{h} YUYV (VIDIOC_S_FMT: {e}); a v4l2loopback device takes a new format only while no program reads it"
                            )))
                        })?;
                        if let Some(suppressed) = resized.admit(Instant::now()) {
                            tracing::info!(endpoint, path = %path.display(), width = w, height = h, suppressed, "v4l2loopback output set to YUYV");
                        }
                        size = Some((w, h));
                    }
                    bgrx_to_yuyv(f.pixels(), w, h, &mut yuyv);
                    use std::io::Write;
                    file.write_all(&yuyv).map_err(write_err)?;
                }
            }
            delivered.mark(frame.meta.seq);
        }
        tracing::debug!(endpoint, frames = report.frames, "sink ended");
        Ok::<SinkReport, EndpointError>(report)
    }))
}

fn set_output_format(file: &std::fs::File, w: usize, h: usize) -> std::io::Result<()> {
    let f = sys::Format::new(
        sys::BUF_TYPE_OUTPUT,
        sys::PixFormat {
            width: w as u32,
            height: h as u32,
            pixelformat: sys::fourcc(b"YUYV"),
            field: sys::FIELD_NONE,
            bytesperline: (w * 2) as u32,
            sizeimage: (w * h * 2) as u32,
            // V4L2_COLORSPACE_SRGB.
            colorspace: 8,
            ..sys::PixFormat::default()
        },
    );
    sys::s_fmt(file.as_fd(), f).map(|_| ())
}

/// The frame number a `camera-sim` picture carries, read back from BGRX (tests, checks).
pub fn frame_number_of(bgrx: &[u8], w: usize, h: usize) -> Option<u32> {
    let mut i420 = Vec::new();
    pattern::bgrx_to_i420(bgrx, w, h, &mut i420);
    pattern::read_number(&i420[..w * h], w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yuyv_round_trips_the_test_pattern_and_keeps_its_frame_number() {
        let (w, h) = (640, 480);
        let mut bgrx = vec![0u8; w * h * 4];
        pattern::draw(1234, w, h, &mut bgrx);
        let mut yuyv = Vec::new();
        bgrx_to_yuyv(&bgrx, w, h, &mut yuyv);
        assert_eq!(yuyv.len(), w * h * 2);
        let mut back = vec![0u8; w * h * 4];
        yuyv_to_bgrx(&yuyv, w, h, w * 2, &mut back);
        assert_eq!(frame_number_of(&back, w, h), Some(1234));
        // Luma exact to rounding; chroma averaged over pixel pairs: within a few levels where
        // neighbours are alike.
        let worst = bgrx
            .chunks_exact(8)
            .zip(back.chunks_exact(8))
            .filter(|(a, _)| a[..3] == a[4..7])
            .flat_map(|(a, b)| (0..3).map(move |k| (i32::from(a[k]) - i32::from(b[k])).abs()))
            .max()
            .unwrap();
        assert!(worst <= 3, "largest channel error {worst}");
    }

    #[test]
    fn known_colours_convert_with_bt601_limited_range() {
        // White, black, pure red as a pixel pair each.
        let bgrx = [
            255, 255, 255, 0, 255, 255, 255, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 0, 0, 0, 255, 0,
        ];
        let mut yuyv = Vec::new();
        bgrx_to_yuyv(&bgrx, 6, 1, &mut yuyv);
        assert_eq!(
            yuyv,
            vec![235, 128, 235, 128, 16, 128, 16, 128, 82, 90, 82, 240]
        );
        let mut back = vec![0u8; 24];
        yuyv_to_bgrx(&yuyv, 6, 1, 12, &mut back);
        assert_eq!(&back[..8], &[255, 255, 255, 0, 255, 255, 255, 0]);
        assert_eq!(&back[8..16], &[0, 0, 0, 0, 0, 0, 0, 0]);
        let red = &back[16..19];
        assert!(red[0] < 4 && red[1] < 4 && red[2] > 250, "{red:?}");
    }

    #[test]
    fn a_short_or_padded_yuyv_buffer_is_read_by_its_stride_and_missing_rows_are_black() {
        let (w, h, stride) = (4, 2, 12);
        let mut src = vec![0u8; stride]; // only the first row, padded
        src[..8].copy_from_slice(&[235, 128, 235, 128, 235, 128, 235, 128]);
        let mut dst = vec![7u8; w * h * 4];
        yuyv_to_bgrx(&src, w, h, stride, &mut dst);
        assert!(dst[..16].chunks(4).all(|p| p == [255, 255, 255, 0]));
        assert!(dst[16..].chunks(4).all(|p| p == [0, 0, 0, 0]));
    }

    #[test]
    fn a_missing_device_node_says_what_to_do() {
        let e = open_device("v4l2", Path::new("/dev/video-nonexistent-ndd")).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("cannot open /dev/video-nonexistent-ndd")
                && text.contains("v4l2-ctl --list-devices"),
            "{text}"
        );
    }

    #[test]
    fn a_file_that_is_not_a_camera_is_refused_by_name() {
        let e = open_device("v4l2", Path::new("/dev/null")).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("/dev/null is not a Video4Linux2 device (VIDIOC_QUERYCAP"),
            "{text}"
        );
    }
}

//! The `camera` class: moving pictures from a device side to programs on the app side.
//!
//! - `camera-sim` source: a synthetic camera (a moving test pattern, 640x480 at 30 fps by
//!   default) whose frames are [display records](crate::display) (BGRX keyframes), so the
//!   `image` pair codes them with JPEG as it does a screen. Its frame number is written in the
//!   picture (32 black and white blocks along the top edge), so a test reads it back after
//!   lossy coding and counts frames exactly.
//! - `y4m` sink: writes the frames as a YUV4MPEG2 stream (`C420jpeg`) to a named pipe it
//!   creates (or a file), which unmodified programs read: `ffplay /tmp/camera.y4m`,
//!   `ffmpeg -i /tmp/camera.y4m …`, GStreamer's `filesrc ! y4mdec`. A frame is written once an
//!   update is complete (the last frame of a capture cut in several).
//!
//! - `v4l2` source: a real camera (a webcam's YUYV or MJPEG through Video4Linux2), as display
//!   records like `camera-sim`'s; `v4l2loopback` sink: the pictures as YUYV on a v4l2loopback
//!   device, the remote camera as `/dev/videoN` for any program (`v4l2.rs`).
//!
//! Files: `pattern.rs` (sans-IO: the test pattern, the frame-number strip, BGRX → I420),
//! `v4l2.rs` (the V4L2 source and sink; their ioctls in `sys/v4l2.rs`).

pub mod pattern;
pub mod v4l2;

pub use v4l2::{CaptureFormat, V4l2Config, V4l2LoopbackConfig};

use crate::common::delivered::Delivered;
use crate::common::error::EndpointError;
use crate::common::report::{SinkReport, SinkTask, SourceTask};
use crate::display::{
    Framebuffer, PixelFormat, Rect, Update, UpdateHeader, UpdateLayout, FLAG_KEYFRAME,
};
use ndd_core::frame::DEFAULT_HEADROOM;
use ndd_core::Frame;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::PathBuf;
use tokio::runtime::Handle;
use tokio::sync::mpsc::{Receiver, Sender};

fn default_width() -> u16 {
    640
}
fn default_height() -> u16 {
    480
}
fn default_fps() -> f64 {
    30.0
}

/// `camera-sim` source parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CameraSimConfig {
    /// Picture width, even, 32..=4096 (the frame-number strip needs 512 px to be readable).
    #[serde(default = "default_width")]
    pub width: u16,
    /// Picture height, even, 16..=4096.
    #[serde(default = "default_height")]
    pub height: u16,
    /// Frames per second.
    #[serde(default = "default_fps")]
    pub fps: f64,
    /// Frames to send, then end; endless when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
}

impl Default for CameraSimConfig {
    fn default() -> Self {
        CameraSimConfig {
            width: default_width(),
            height: default_height(),
            fps: default_fps(),
            count: None,
        }
    }
}

/// `y4m` sink parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Y4mConfig {
    /// Where the stream goes: a named pipe is made there if nothing is (a regular file is
    /// written as it is).
    pub path: PathBuf,
    /// The frame rate written in the stream's header (players pace by it).
    #[serde(default = "default_fps")]
    pub fps: f64,
}

/// The picture a camera sink builds from display records (`y4m`, `v4l2loopback`): made at
/// the first record's size, and made again at a new size when `follow_size`.
struct Pictures {
    endpoint: &'static str,
    follow_size: bool,
    fb: Option<Framebuffer>,
    bad: ndd_core::ratelimit::RateLimit,
    /// The capture time of the last picture made whole.
    shown: Option<u64>,
    /// An update of the capture shown last (the `image` pair's lossless refinement of a still
    /// picture) improves the picture but is not another video frame (`y4m`: a file or pipe
    /// of frames at a fixed rate); a live device (`v4l2loopback`) shows the better picture.
    one_per_capture: bool,
}

impl Pictures {
    fn new(endpoint: &'static str, follow_size: bool, one_per_capture: bool) -> Pictures {
        Pictures {
            endpoint,
            follow_size,
            fb: None,
            bad: ndd_core::ratelimit::RateLimit::default(),
            shown: None,
            one_per_capture,
        }
    }

    /// Applies `frame`'s record; the picture once an update is complete (the last record of a
    /// capture cut in several). With `one_per_capture`, an update of the capture shown last
    /// (the `image` pair refines a picture that stood still for `refine_ms`) is applied and
    /// not shown again: one video frame per capture (before, a camera stalled for 300 ms under
    /// load had its last picture written twice into the y4m stream). A record that does not
    /// parse or apply is dropped with a rate-limited warning.
    fn apply(&mut self, frame: &Frame) -> Option<&Framebuffer> {
        let endpoint = self.endpoint;
        let seq = frame.meta.seq;
        let u = match Update::parse(frame.payload()) {
            Ok(u) => u,
            Err(e) => {
                if let Some(suppressed) = self.bad.admit(std::time::Instant::now()) {
                    tracing::warn!(endpoint, seq, suppressed, "bad picture record dropped: {e}");
                }
                return None;
            }
        };
        let (w, h) = (u.header.width, u.header.height);
        let stale = self
            .fb
            .as_ref()
            .is_none_or(|f| self.follow_size && (f.width(), f.height()) != (w, h));
        if stale {
            self.fb = Some(Framebuffer::new(w, h, PixelFormat::Bgrx32));
        }
        let f = self.fb.as_mut()?;
        if let Err(e) = f.apply(&u) {
            if let Some(suppressed) = self.bad.admit(std::time::Instant::now()) {
                tracing::warn!(endpoint, seq, suppressed, "picture record not applied: {e}");
            }
            return None;
        }
        if u.header.more() {
            return None;
        }
        let ts = frame.meta.timestamp_ns;
        if self.shown.replace(ts) == Some(ts) && !stale && self.one_per_capture {
            return None;
        }
        Some(&*f)
    }

    /// Says (rate-limited) that a picture was dropped for `why`.
    fn dropped(&mut self, why: std::fmt::Arguments<'_>) {
        let endpoint = self.endpoint;
        if let Some(suppressed) = self.bad.admit(std::time::Instant::now()) {
            tracing::warn!(endpoint, suppressed, "{why}; dropped");
        }
    }
}

/// A frame rate key: a number in (0, 1000].
fn check_fps(fps: f64) -> Result<(), (&'static str, &'static str)> {
    if !(fps.is_finite() && fps > 0.0 && fps <= 1000.0) {
        return Err(("fps", "must be a number in (0, 1000]"));
    }
    Ok(())
}

impl CameraSimConfig {
    /// Checks the ranges; the error names the key.
    pub fn check(&self) -> Result<(), (&'static str, &'static str)> {
        if !(32..=4096).contains(&self.width) || !self.width.is_multiple_of(2) {
            return Err(("width", "must be even, 32..=4096"));
        }
        if !(16..=4096).contains(&self.height) || !self.height.is_multiple_of(2) {
            return Err(("height", "must be even, 16..=4096"));
        }
        check_fps(self.fps)
    }
}

impl Y4mConfig {
    /// Checks the ranges; the error names the key.
    pub fn check(&self) -> Result<(), (&'static str, &'static str)> {
        check_fps(self.fps)
    }
}

/// Starts a `camera-sim` source.
pub(crate) fn spawn_camera_sim(
    rt: &Handle,
    endpoint: &'static str,
    c: &CameraSimConfig,
    stream: u16,
    tx: Sender<Frame>,
) -> Result<SourceTask, EndpointError> {
    let (w, h) = (c.width, c.height);
    let layout = UpdateLayout::new(
        UpdateHeader {
            width: w,
            height: h,
            format: PixelFormat::Bgrx32,
            flags: FLAG_KEYFRAME,
        },
        vec![Rect::new(0, 0, w, h)],
    )
    .map_err(|e| EndpointError::Config {
        endpoint,
        param: "width",
        reason: e.to_string(),
    })?;
    let period = crate::clock::pacing(1.0 / c.fps);
    Ok(rt.spawn(crate::synthetic::run_paced(
        endpoint,
        period,
        c.count,
        stream,
        tx,
        move |m| {
            let mut f = Frame::zeroed(m, DEFAULT_HEADROOM, layout.len());
            let p = f.payload_mut();
            // The layout was checked when it was made, and the buffer is its length.
            let _ = layout.write_headers(p);
            let px = layout.pixels(0);
            pattern::draw(m.seq, usize::from(w), usize::from(h), &mut p[px]);
            f
        },
    )))
}

/// Starts a `y4m` sink: makes the named pipe now (a wrong directory fails here); the stream
/// is opened at the first frame (for a pipe: when a program opens it to read).
pub(crate) fn spawn_y4m(
    rt: &Handle,
    endpoint: &'static str,
    c: &Y4mConfig,
    mut rx: Receiver<Frame>,
    delivered: Delivered,
) -> Result<SinkTask, EndpointError> {
    let path = c.path.clone();
    if !path.exists() {
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            &path,
            rustix::fs::Mode::from_raw_mode(0o644),
        )
        .map_err(|e| EndpointError::Open {
            endpoint,
            path: path.clone(),
            source: e.into(),
        })?;
    }
    let fps = c.fps;
    Ok(rt.spawn_blocking(move || {
        let mut report = SinkReport::default();
        let mut pictures = Pictures::new(endpoint, false, true);
        let mut out: Option<std::io::BufWriter<std::fs::File>> = None;
        let mut yuv = Vec::new();
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
                if out.is_none() {
                    // For a pipe this waits for a reader.
                    let file = std::fs::OpenOptions::new()
                        .write(true)
                        .open(&path)
                        .map_err(write_err)?;
                    let mut o = std::io::BufWriter::with_capacity(1 << 20, file);
                    let (num, den) = if fps.fract() == 0.0 {
                        (fps as u64, 1)
                    } else {
                        ((fps * 1000.0).round() as u64, 1000)
                    };
                    writeln!(o, "YUV4MPEG2 W{w} H{h} F{num}:{den} Ip A1:1 C420jpeg")
                        .map_err(write_err)?;
                    tracing::info!(endpoint, path = %path.display(), width = w, height = h, "y4m stream opened");
                    out = Some(o);
                }
                pattern::bgrx_to_i420(f.pixels(), w, h, &mut yuv);
                if let Some(o) = &mut out {
                    let written = o
                        .write_all(b"FRAME\n")
                        .and_then(|()| o.write_all(&yuv))
                        .and_then(|()| o.flush());
                    match written {
                        Ok(()) => {}
                        // The player quit: the stream starts again, with a new header, for
                        // the next one that opens the pipe (meanwhile the frames wait).
                        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                            tracing::info!(endpoint, path = %path.display(),
                                "the reader closed the y4m stream; waiting for the next");
                            out = None;
                        }
                        Err(e) => return Err(write_err(e)),
                    }
                }
            }
            delivered.mark(frame.meta.seq);
        }
        tracing::debug!(endpoint, frames = report.frames, "sink ended");
        Ok::<SinkReport, EndpointError>(report)
    }))
}

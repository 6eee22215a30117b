//! The display benchmark's test video player (a thread of the bench drawing on the app's X
//! server): the frames of [`frames::video_graph`] rendered once by ffmpeg into a
//! file, then drawn 30 times a second into a borderless window with `ShmPutImage` straight
//! from that file (the X server maps it: MIT-SHM 1.2's `ShmAttachFd`), looping.
//!
//! ffplay rendering the same filter graph live took 1.1–1.6 of this machine's two cores at
//! 2560×1440 (the graph itself, then SDL's llvmpipe renderer), leaving the programs under test
//! less than a core between them; this player costs the X server one copy a frame and itself
//! next to nothing. Frame `k` of the loop is the graph's frame `k`, so the number burnt into
//! each picture still names the reference frame the quality is scored against.

use crate::frames;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use x11rb::connection::Connection;
use x11rb::protocol::shm::{self, ConnectionExt as _};
use x11rb::protocol::xproto::{self, ConnectionExt as _};
use x11rb::rust_connection::RustConnection;

/// The clip's frame rate.
const FPS: u32 = 30;
/// Frames in the loop (3 s): the quality's 12 pictures, 230 ms apart, show distinct frames.
const CLIP_FRAMES: u64 = 90;
/// The clip file stays under this many bytes (a shorter loop at very large sizes).
const CLIP_MAX_BYTES: u64 = 1_500_000_000;

/// The rendered clip for `w`x`h` and `grain`: its path and how many frames it holds. Rendered
/// once per size and grain (kept in the temporary directory for later rows and runs).
pub fn clip(w: u16, h: u16, grain: u8) -> Result<(PathBuf, u64)> {
    let frame = u64::from(w) * u64::from(h) * 4;
    let n = (CLIP_MAX_BYTES / frame).clamp(2, CLIP_FRAMES);
    let graph = frames::video_graph(w, h, grain);
    // Named by the graph too: a clip of an older graph is never taken for this one.
    let hash = graph.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    let prefix = format!("ndd-bench-clip-{w}x{h}-g{grain}-");
    let path = std::env::temp_dir().join(format!("{prefix}{n}-{hash:016x}.bgra"));
    if std::fs::metadata(&path).is_ok_and(|m| m.len() == n * frame) {
        return Ok((path, n));
    }
    // Clips of this size and grain from an older graph go (each is up to 1.5 GB).
    if let Ok(dir) = std::fs::read_dir(std::env::temp_dir()) {
        for e in dir.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if name.starts_with(&prefix) && name.ends_with(".bgra") && e.path() != path {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    static RENDERS: AtomicU64 = AtomicU64::new(0);
    let part = path.with_extension(format!(
        "part{}-{}",
        std::process::id(),
        RENDERS.fetch_add(1, Ordering::Relaxed)
    ));
    let out = Command::new("ffmpeg")
        .args(["-nostdin", "-loglevel", "error", "-y", "-f", "lavfi", "-i"])
        .arg(&graph)
        .args(["-fps_mode", "passthrough", "-frames:v"])
        .arg(n.to_string())
        .args(["-f", "rawvideo", "-pix_fmt", "bgra"])
        .arg(&part)
        .stdin(Stdio::null())
        .output()
        .context("cannot start ffmpeg (apt-get install ffmpeg)")?;
    let len = std::fs::metadata(&part).map(|m| m.len()).unwrap_or(0);
    if !out.status.success() || len != n * frame {
        let _ = std::fs::remove_file(&part);
        bail!(
            "ffmpeg rendered {len} of the clip's {} bytes: {}",
            n * frame,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    // Written out before it plays, not flushed during a row's window (a row right after its
    // clip was rendered once counted the source at 20 frames a second: likely that).
    std::fs::File::open(&part)
        .and_then(|f| f.sync_all())
        .context("cannot write the rendered clip out")?;
    std::fs::rename(&part, &path).context("cannot keep the rendered clip")?;
    Ok((path, n))
}

/// The test video playing in a window of an X server, on a thread of this process; stopped
/// when dropped.
pub struct Player {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl Player {
    /// Plays the clip of `w`x`h` and `grain` at (`left`, `top`) on `display` (rendering the
    /// clip first if it is not there yet); errors unless the window shows its first picture.
    pub fn start(display: &str, w: u16, h: u16, left: i16, top: i16, grain: u8) -> Result<Player> {
        let (path, n) = clip(w, h, grain)?;
        let screen = Screen::open(display, &path, w, h, left, top)?;
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("test-video".into())
            .spawn(move || screen.play(n, &s2))
            .context("cannot start the player's thread")?;
        Ok(Player {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Player {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            if let Ok(Err(e)) = t.join() {
                tracing::debug!("the test video stopped: {e:#}");
            }
        }
    }
}

/// The player's window and the clip mapped by the X server.
struct Screen {
    conn: RustConnection,
    window: xproto::Window,
    gc: xproto::Gcontext,
    seg: shm::Seg,
    size: (u16, u16),
    depth: u8,
}

impl Screen {
    fn open(display: &str, clip: &Path, w: u16, h: u16, left: i16, top: i16) -> Result<Screen> {
        let file = std::fs::File::open(clip).with_context(|| format!("{}", clip.display()))?;
        let (conn, screen) = x11rb::connect(Some(display))
            .with_context(|| format!("cannot connect to {display}"))?;
        let root = conn.setup().roots[screen].clone();
        if root.root_depth != 24 {
            bail!(
                "{display} is {} bits deep; the player draws 24",
                root.root_depth
            );
        }
        let version = conn
            .shm_query_version()?
            .reply()
            .with_context(|| format!("{display} has no MIT-SHM"))?;
        if (version.major_version, version.minor_version) < (1, 2) {
            bail!(
                "{display}'s MIT-SHM is {}.{}; the player needs 1.2 (ShmAttachFd)",
                version.major_version,
                version.minor_version
            );
        }
        let seg = conn.generate_id()?;
        conn.shm_attach_fd(seg, std::os::fd::OwnedFd::from(file), true)?
            .check()
            .with_context(|| format!("{display} cannot map the clip (ShmAttachFd)"))?;
        let window = conn.generate_id()?;
        conn.create_window(
            root.root_depth,
            window,
            root.root,
            left,
            top,
            w,
            h,
            0,
            xproto::WindowClass::INPUT_OUTPUT,
            root.root_visual,
            &xproto::CreateWindowAux::new()
                .override_redirect(1)
                .background_pixel(root.black_pixel),
        )?;
        let gc = conn.generate_id()?;
        conn.create_gc(gc, window, &xproto::CreateGCAux::new())?;
        conn.map_window(window)?;
        let screen = Screen {
            conn,
            window,
            gc,
            seg,
            size: (w, h),
            depth: root.root_depth,
        };
        // The first picture, checked here: a server that refuses it would leave the window
        // black for the whole row.
        screen
            .put(0)?
            .check()
            .with_context(|| format!("{display} refused the test video's first picture"))?;
        Ok(screen)
    }

    /// Draws the picture `offset` bytes into the clip.
    fn put(&self, offset: u32) -> Result<x11rb::cookie::VoidCookie<'_, RustConnection>> {
        let (w, h) = self.size;
        Ok(self.conn.shm_put_image(
            self.window,
            self.gc,
            w,
            h,
            0,
            0,
            w,
            h,
            0,
            0,
            self.depth,
            xproto::ImageFormat::Z_PIXMAP.into(),
            false,
            self.seg,
            offset,
        )?)
    }

    /// Draws the clip's `n` frames in a loop, [`FPS`] a second, until `stop`.
    fn play(&self, n: u64, stop: &AtomicBool) -> Result<()> {
        let (w, h) = self.size;
        let frame = u64::from(w) * u64::from(h) * 4;
        let start = Instant::now();
        let mut k = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let due = start + Duration::from_secs(k) / FPS;
            match due.checked_duration_since(Instant::now()) {
                Some(wait) => std::thread::sleep(wait),
                // Late (the server was busy): the frame due now, as a player keeping to its
                // clock drops the ones it missed.
                None => k = k.max((start.elapsed().as_secs_f64() * f64::from(FPS)) as u64),
            }
            let offset = u32::try_from((k % n) * frame).context("the clip is over 4 GB")?;
            self.put(offset)?.ignore_error();
            // A round trip a frame: a server that falls behind holds the player back instead
            // of queueing frames (as a player waiting for vsync is).
            self.conn
                .get_input_focus()?
                .reply()
                .context("the X server went")?;
            k += 1;
        }
        Ok(())
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let _ = self.conn.destroy_window(self.window);
        let _ = self.conn.shm_detach(self.seg);
        let _ = self.conn.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The clip's frame `k` is the graph's frame `k`: the number burnt into it reads `k`.
    #[test]
    fn the_clips_frames_carry_their_numbers() {
        let (w, h) = (640u16, 32u16);
        let (path, n) = clip(w, h, 4).unwrap();
        assert_eq!(n, CLIP_FRAMES);
        let bytes = std::fs::read(&path).unwrap();
        let frame = usize::from(w) * usize::from(h) * 4;
        assert_eq!(bytes.len(), n as usize * frame);
        for k in [0usize, 1, 37, 89] {
            let picture = &bytes[k * frame..(k + 1) * frame];
            assert_eq!(frames::read_mark(picture, usize::from(w)), Some(k as u32));
        }
    }
}

//! Source half of `image`: interframe comparison, per-part classification, JPEG / palette /
//! lossless encoding, lossless refinement, credit and the `auto` preset controller.

use super::format::{self, Header, Kind, CREDIT_LEN, CTRL_CREDIT};
use super::pacer::{Pacer, Step};
use super::tiles::{self, Class, Screen};
use super::video::{self, Detector, VideoEncoder};
use super::{corrupt, library, Codec, ImageConfig, Quality, Subsampling, PAIR};
use crate::seq::RisingSeq;
use bytes::Bytes;
use ndd_core::frame::Meta;
use ndd_core::{
    ControlError, ForeignError, Frame, FrameError, Half, HalfStats, ModuleError, Output,
};
use ndd_wire::display::{Encoding, Rect, Update, FLAG_KEYFRAME, FLAG_MORE};
use std::fmt;
use std::time::{Duration, Instant};
use zstd::stream::raw::{CParameter, InBuffer, Operation, OutBuffer};

/// zstd level of the lossless block.
const ZSTD_LEVEL: i32 = 3;
/// zstd window: 8 MiB, more than a 1920×1080 screen's palette indices, so a scrolled page
/// finds its text in the previous frame.
pub(crate) const WINDOW_LOG: u32 = 23;

#[derive(Debug, Clone, Copy)]
struct Tile {
    /// Last sent as JPEG (refinement pending).
    lossy: bool,
    /// Last time its pixels changed.
    changed: Instant,
}

/// A part's encoding, owning its data until the frame is written.
enum Owned {
    Lossless,
    Solid([u8; 3]),
    Palette(Vec<u8>),
    Jpeg(Vec<u8>),
    H264(Vec<u8>),
}

/// A video region with no capture changing it for this long is dropped (its tiles are then
/// refined): a still screen makes no captures for the detector to see.
const VIDEO_IDLE: Duration = Duration::from_millis(500);

/// Encodes display updates (see the pair's docs).
pub struct ImageForward {
    cfg: ImageConfig,
    /// Rung of `AUTO_LADDER` in use (`auto` only).
    level: usize,
    screen: Option<Screen>,
    grid_w: usize,
    tiles: Vec<Tile>,
    jpeg: turbojpeg::Compressor,
    jpeg_set: Option<(u8, Subsampling)>,
    zstd: zstd::stream::raw::Encoder<'static>,
    /// Credit number of the last frame sent.
    sent: u32,
    pacer: Pacer,
    last_meta: Option<Meta>,
    /// Every frame's seq must grow: a refinement takes last + 1, and a later update whose own
    /// seq is not above that is renumbered too.
    seq: RisingSeq,
    next_refine: Option<Instant>,
    /// Broadcast: when the next whole-screen keyframe is due.
    next_keyframe: Option<Instant>,
    scratch: Vec<u8>,
    block: Vec<u8>,
    /// First-seen palette indices of the part being classified.
    indices: Vec<u8>,
    blob: Vec<u8>,
    stats: Counters,
    /// The changed parts of a capture whose last frame has not come yet (a capture over
    /// `MAX_UPDATE_PAYLOAD` comes as several frames, all but the last with `FLAG_MORE`),
    /// and the flags its frames carried: the capture is coded as one frame once it is whole,
    /// so the viewer never shows half of it.
    held: Vec<(usize, Rect)>,
    held_flags: u8,
    /// Tiles whose pixels this capture really changed (a keyframe sends every tile; only
    /// these are movement to the video detector).
    moved: Vec<usize>,
    /// The screen copy was just reset: the next capture is no movement to the detector.
    fresh: bool,
    /// Where the screen moves in most captures (`codec = "auto"`).
    detector: Detector,
    /// The video region's encoder, and when a capture last changed the region.
    video: Option<VideoEncoder>,
    video_at: Option<Instant>,
    /// Access units sent, and their bytes, over the pair's life.
    video_frames: u64,
    video_bytes: u64,
    /// Times the encoder failed (the region then went as tiles), and their warnings.
    video_failed: u64,
    video_warned: ndd_core::RateLimit,
}

#[derive(Debug, Default, Clone, Copy)]
struct Counters {
    frames: u64,
    unchanged: u64,
    solid: u64,
    palette: u64,
    jpeg: u64,
    lossless: u64,
    refined: u64,
    preset_changes: u64,
    keyframes: u64,
}

impl fmt::Debug for ImageForward {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ImageForward")
            .field("preset", &self.preset())
            .field("sent", &self.sent)
            .field("in_flight", &self.pacer.frames())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl ImageForward {
    /// A forward half with validated parameters.
    pub fn new(cfg: ImageConfig) -> Result<ImageForward, ModuleError> {
        let jpeg = turbojpeg::Compressor::new().map_err(|e| library("libjpeg-turbo", e))?;
        let mut zstd =
            zstd::stream::raw::Encoder::new(ZSTD_LEVEL).map_err(|e| library("zstd stream", e))?;
        zstd.set_parameter(CParameter::WindowLog(WINDOW_LOG))
            .map_err(|e| library("zstd window", e))?;
        // Palette indices are bytes of a few values: zstd's short hashes find only local
        // matches in them; long-distance matching finds the rows seen in earlier frames.
        zstd.set_parameter(CParameter::EnableLongDistanceMatching(true))
            .map_err(|e| library("zstd long-distance matching", e))?;
        let window = cfg.window;
        Ok(ImageForward {
            cfg,
            level: super::AUTO_START,
            screen: None,
            grid_w: 0,
            tiles: Vec::new(),
            jpeg,
            jpeg_set: None,
            zstd,
            sent: 0,
            pacer: Pacer::new(window),
            last_meta: None,
            seq: RisingSeq::default(),
            next_refine: None,
            next_keyframe: None,
            scratch: Vec::new(),
            held: Vec::new(),
            held_flags: 0,
            moved: Vec::new(),
            fresh: false,
            detector: Detector::default(),
            video: None,
            video_at: None,
            video_frames: 0,
            video_bytes: 0,
            video_failed: 0,
            video_warned: ndd_core::RateLimit::with_burst(Duration::from_secs(10), 1),
            block: Vec::new(),
            indices: Vec::new(),
            blob: Vec::new(),
            stats: Counters::default(),
        })
    }

    /// The preset in use (for `auto`, the one its rung is, or is between).
    pub fn preset(&self) -> Quality {
        match self.cfg.quality {
            Quality::Auto => super::ladder_preset(self.level),
            q => q,
        }
    }

    /// JPEG quality and subsampling for photo parts now (`None`: lossless).
    fn jpeg_now(&self) -> Option<(u8, Subsampling)> {
        match self.cfg.quality {
            Quality::Auto => Some(self.cfg.jpeg_over(super::AUTO_LADDER[self.level])),
            q => self.cfg.jpeg(q),
        }
    }

    fn window_open(&self) -> bool {
        // Broadcast: no app side's credit holds the source back.
        self.cfg.broadcast() || self.pacer.open()
    }

    /// Broadcast: the zstd stream starts afresh (an app side that joins decodes from this
    /// frame on) and the next keyframe is due `keyframe_ms` from now. Every tile goes.
    fn start_keyframe(&mut self, now: Instant) -> Result<Vec<(usize, Rect)>, ModuleError> {
        self.zstd.reinit().map_err(|e| corrupt("zstd", e))?;
        self.next_keyframe = Some(now + Duration::from_millis(u64::from(self.cfg.keyframe_ms)));
        self.stats.keyframes += 1;
        Ok((0..self.tiles.len())
            .filter_map(|i| Some((i, self.tile_rect(i)?)))
            .collect())
    }

    fn tile_size(&self) -> u16 {
        self.cfg.tile
    }

    /// Starts over with a screen of a new size: every tile unknown.
    fn reset_screen(&mut self, width: u16, height: u16, now: Instant) {
        // Parts held of a capture of the old size name tiles of the old grid.
        self.held.clear();
        self.held_flags = 0;
        self.moved.clear();
        // The first capture of a new size changes every tile from black: no movement.
        self.fresh = true;
        self.video = None;
        self.video_at = None;
        let t = usize::from(self.tile_size());
        self.grid_w = usize::from(width).div_ceil(t);
        let grid_h = usize::from(height).div_ceil(t);
        self.tiles = vec![
            Tile {
                lossy: false,
                changed: now,
            };
            self.grid_w * grid_h
        ];
        self.screen = Some(Screen::new(width, height));
        self.next_refine = None;
        self.detector.reset(self.tiles.len());
    }

    /// The measured path in bits per second, if measured.
    fn path_bps(&self) -> Option<f64> {
        self.pacer.rate().map(|b| b * 8.0)
    }

    /// Where the video region is after this capture, which changed the pixels of tiles
    /// `moved`.
    fn video_region(&mut self, now: Instant, mut moved: Vec<usize>) -> Option<Rect> {
        let s = self.screen.as_ref()?;
        match self.cfg.codec {
            Codec::Tiles => None,
            Codec::H264 => {
                let r = Rect::new(0, 0, s.width & !1, s.height & !1);
                // A screen too large for the encoder stays on the tiles.
                video::codable(r).then_some(r)
            }
            Codec::Auto => {
                moved.sort_unstable();
                moved.dedup();
                // Which of them look like a picture (the detector wants a share of those),
                // judged once on the capture's final pixels.
                let photo: Vec<usize> = moved
                    .iter()
                    .copied()
                    .filter(|&i| self.tile_rect(i).is_some_and(|r| s.photo_like(r)))
                    .collect();
                let (t, w, h, grid_w) = (self.tile_size(), s.width, s.height, self.grid_w);
                self.detector
                    .handle_capture(now, &moved, &photo, grid_w, |i| {
                        let t = u32::from(t);
                        let (tx, ty) = ((i % grid_w) as u32, (i / grid_w) as u32);
                        Rect::new((tx * t) as u16, (ty * t) as u16, t as u16, t as u16).clip(w, h)
                    })
            }
        }
    }

    /// The region stops being video: its tiles, last sent as H.264, are refined.
    fn drop_video(&mut self, now: Instant) {
        self.video_at = None;
        let Some(v) = self.video.take() else {
            return;
        };
        for (i, _) in self.parts(v.region()) {
            self.tiles[i].lossy = true;
            self.tiles[i].changed = now;
        }
        if self.cfg.refine_ms > 0 {
            let due = now + Duration::from_millis(u64::from(self.cfg.refine_ms));
            self.next_refine = Some(self.next_refine.map_or(due, |d| d.min(due)));
        }
    }

    /// Codes the video region of this capture (`region`) as H.264 when it changed (or an IDR
    /// is due: a keyframe, a new region); the parts left for the tile codec, and the access
    /// units (one per stripe, with its rect).
    #[allow(clippy::type_complexity)]
    fn code_video(
        &mut self,
        region: Option<Rect>,
        parts: Vec<(usize, Rect)>,
        keyframe: bool,
        now: Instant,
    ) -> Result<(Vec<(usize, Rect)>, Vec<(Rect, Vec<u8>)>), ModuleError> {
        let Some(r) = region else {
            self.drop_video(now);
            return Ok((parts, Vec::new()));
        };
        let mut idr = keyframe;
        if self.video.as_ref().is_none_or(|v| v.region() != r) {
            self.drop_video(now);
            match VideoEncoder::new(r, self.path_bps(), now) {
                Ok(v) => self.video = Some(v),
                Err(e) => {
                    self.no_video(now, &e);
                    return Ok((parts, Vec::new()));
                }
            }
            idr = true;
        }
        let mut touched = idr;
        let mut rest = Vec::with_capacity(parts.len());
        for &(i, p) in &parts {
            touched |= p.intersection(&r).is_some();
            rest.extend(video::outside(p, r).into_iter().map(|q| (i, q)));
        }
        if !touched {
            return Ok((rest, Vec::new()));
        }
        let Some(s) = self.screen.as_ref() else {
            return Ok((parts, Vec::new()));
        };
        // A region as wide as the screen is rows of the screen copy as they are (a full-screen
        // video: copying it out cost 6 % of the app side at 1440p); any other is copied out.
        let pixels = if r.x == 0 && r.w == s.width && r.h > 0 {
            &s.px[s.row(0, r.y, r.w).start..s.row(0, r.y + r.h - 1, r.w).end]
        } else {
            s.copy_out(r, &mut self.scratch);
            &self.scratch[..]
        };
        let mut aus = Vec::new();
        let coded = match self.video.as_mut() {
            Some(v) => v.encode(pixels, idr, now, &mut aus),
            None => return Ok((parts, Vec::new())),
        };
        if let Err(e) = coded {
            // The tiles take the region this time; the encoder is set up afresh (with an
            // IDR) when the region is next video.
            self.no_video(now, &e);
            return Ok((parts, Vec::new()));
        }
        // (Its tiles are marked lossy, to be refined, when the region ends: `drop_video`.)
        self.video_at = Some(now);
        self.video_frames += 1;
        self.video_bytes += aus.iter().map(|(_, au)| au.len() as u64).sum::<u64>();
        Ok((rest, aus))
    }

    /// The encoder failed (`e`): the region goes back to the tiles, said a few times a
    /// minute at most.
    fn no_video(&mut self, now: Instant, e: &ModuleError) {
        self.drop_video(now);
        self.detector.forget_region();
        self.video_failed += 1;
        if let Some(suppressed) = self.video_warned.admit(now) {
            tracing::warn!(error = %e, suppressed, "image: H.264 failed; the region goes as tiles");
        }
    }

    /// The tile grid cells `r` touches, as (tile index, part of `r` inside the tile).
    fn parts(&self, r: Rect) -> Vec<(usize, Rect)> {
        let t = u32::from(self.tile_size());
        let mut out = Vec::new();
        let (x0, y0) = (u32::from(r.x) / t, u32::from(r.y) / t);
        let (x1, y1) = ((r.right() - 1) / t, (r.bottom() - 1) / t);
        for ty in y0..=y1 {
            for tx in x0..=x1 {
                // Inside the screen (r is), so every coordinate fits u16.
                let cell = Rect::new((tx * t) as u16, (ty * t) as u16, t as u16, t as u16);
                if let Some(p) = r.intersection(&cell) {
                    out.push((ty as usize * self.grid_w + tx as usize, p));
                }
            }
        }
        out
    }

    /// The whole tile `i`, clipped to the screen.
    fn tile_rect(&self, i: usize) -> Option<Rect> {
        let s = self.screen.as_ref()?;
        let t = u32::from(self.tile_size());
        let (tx, ty) = ((i % self.grid_w) as u32, (i / self.grid_w) as u32);
        Rect::new((tx * t) as u16, (ty * t) as u16, t as u16, t as u16).clip(s.width, s.height)
    }

    /// Copies an update into the screen copy; returns the parts that changed (all of them
    /// when `force`).
    ///
    /// Row by row across each band of tiles the rect crosses, not tile by tile: the screen
    /// copy and the update are read and written in address order (tile by tile, 64 short
    /// strided copies a tile, this copy was 14 % of the app side on a 1080p video), and a row
    /// whose parts all changed already is one copy.
    fn absorb(&mut self, u: &Update<'_>, force: bool, now: Instant) -> Vec<(usize, Rect)> {
        let mut changed = Vec::new();
        for rp in &u.rects {
            let r = rp.rect;
            let w = usize::from(r.w) * 4;
            let parts = self.parts(r);
            let Some(s) = self.screen.as_mut() else {
                return changed;
            };
            // `really`: a part's pixels differ (a forced part is sent whether or not, but only
            // a real difference is movement to the video detector).
            let mut really = Vec::new();
            for band in parts.chunk_by(|a, b| a.1.y == b.1.y) {
                let (y0, h) = (band[0].1.y, band[0].1.h);
                really.clear();
                really.resize(band.len(), false);
                let mut all = false;
                for y in y0..y0 + h {
                    let src = &rp.pixels[usize::from(y - r.y) * w..][..w];
                    let dst = s.row(r.x, y, r.w);
                    if all {
                        s.px[dst].copy_from_slice(src);
                        continue;
                    }
                    let dst = &mut s.px[dst];
                    for (k, (_, p)) in band.iter().enumerate() {
                        let seg = usize::from(p.x - r.x) * 4..usize::from(p.x - r.x + p.w) * 4;
                        if really[k] || dst[seg.clone()] != src[seg.clone()] {
                            dst[seg.clone()].copy_from_slice(&src[seg]);
                            really[k] = true;
                        }
                    }
                    all = really.iter().all(|&c| c);
                }
                for (&(i, p), &really) in band.iter().zip(&really) {
                    if really {
                        self.moved.push(i);
                    }
                    if really || force {
                        self.tiles[i].changed = now;
                        changed.push((i, p));
                    }
                }
            }
        }
        changed
    }

    /// Encodes `parts` (and the video region's access unit, if any) into one frame;
    /// `lossless` forces lossless encoding of photo parts.
    #[allow(clippy::too_many_arguments)]
    fn encode(
        &mut self,
        meta: Meta,
        flags: u8,
        parts: &[(usize, Rect)],
        video: Vec<(Rect, Vec<u8>)>,
        lossless: bool,
        now: Instant,
        out: &mut Output,
    ) -> Result<(), ModuleError> {
        let Some(s) = self.screen.take() else {
            return Ok(());
        };
        let r = self.encode_with(&s, meta, flags, parts, video, lossless, now, out);
        self.screen = Some(s);
        r
    }

    #[allow(clippy::too_many_arguments)]
    fn encode_with(
        &mut self,
        s: &Screen,
        meta: Meta,
        flags: u8,
        parts: &[(usize, Rect)],
        video: Vec<(Rect, Vec<u8>)>,
        lossless: bool,
        now: Instant,
        out: &mut Output,
    ) -> Result<(), ModuleError> {
        let palette_max = usize::from(self.cfg.palette_max);
        let jpeg = if lossless { None } else { self.jpeg_now() };
        let mut rects: Vec<(Rect, Owned)> = Vec::with_capacity(parts.len() + 1);
        for (r, au) in video {
            rects.push((r, Owned::H264(au)));
        }
        let mut photos = Vec::new();
        let mut photo_tiles = Vec::new();
        self.block.clear();
        for &(i, p) in parts {
            match tiles::classify_index(s, p, palette_max, &mut self.indices, &mut self.block) {
                Class::Solid(c) => {
                    self.stats.solid += 1;
                    rects.push((p, Owned::Solid(c)));
                }
                Class::Palette(pal) => {
                    self.stats.palette += 1;
                    rects.push((p, Owned::Palette(pal)));
                }
                Class::Photo => {
                    photos.push(p);
                    photo_tiles.push(i);
                }
            }
        }
        for p in tiles::merge(photos) {
            match jpeg {
                None => {
                    self.stats.lossless += 1;
                    tiles::bgr(s, p, &mut self.block);
                    rects.push((p, Owned::Lossless));
                }
                Some((q, sub)) => {
                    self.stats.jpeg += 1;
                    rects.push((p, Owned::Jpeg(self.jpeg_rect(s, p, q, sub)?)));
                }
            }
        }
        // Refinement: a tile sent whole and losslessly needs none any more; one with a JPEG
        // part does, `refine_ms` from now.
        for &(i, p) in parts {
            if self.tile_rect(i) == Some(p) {
                self.tiles[i].lossy = false;
            }
        }
        if jpeg.is_some() && !photo_tiles.is_empty() {
            for &i in &photo_tiles {
                self.tiles[i].lossy = true;
            }
            if self.cfg.refine_ms > 0 {
                let due = now + Duration::from_millis(u64::from(self.cfg.refine_ms));
                self.next_refine = Some(self.next_refine.map_or(due, |d| d.min(due)));
            }
        }
        self.compress_block()?;
        let kinds: Vec<(Rect, Kind<'_>)> = rects
            .iter()
            .map(|(r, o)| {
                let k = match o {
                    Owned::Lossless => Kind::Lossless,
                    Owned::Solid(c) => Kind::Solid(*c),
                    Owned::Palette(p) => Kind::Palette(p),
                    Owned::Jpeg(j) => Kind::Jpeg(j),
                    Owned::H264(a) => Kind::H264(a),
                };
                (*r, k)
            })
            .collect();
        self.sent = self.sent.wrapping_add(1);
        let mut meta = meta;
        meta.seq = self.seq.take(meta.seq);
        let header = Header {
            width: s.width,
            height: s.height,
            flags,
            credit: self.sent,
            raw_len: self.block.len() as u32,
            blob_len: self.blob.len() as u32,
        };
        let mut bytes = Vec::with_capacity(format::emitted_len(&kinds, self.blob.len()));
        format::emit(&header, &kinds, &self.blob, &mut bytes);
        if !self.cfg.broadcast() {
            // (Broadcast: no credit comes back to settle what the pacer would keep.)
            self.pacer.on_send(now, self.sent, bytes.len() as u64);
            // How long the link takes to carry this: the next capture may come that late
            // because of the link, not of the content (the video detector's pace).
            if let Some(bps) = self.path_bps().filter(|b| *b > 0.0) {
                let carry = Duration::from_secs_f64(bytes.len() as f64 * 8.0 / bps);
                let rtt = self.pacer.min_rtt().unwrap_or_default();
                self.detector.set_link_gap(carry * 2 + rtt * 2);
            }
        }
        self.stats.frames += 1;
        out.push(Frame::from_bytes(meta, Bytes::from(bytes)));
        Ok(())
    }

    fn jpeg_rect(
        &mut self,
        s: &Screen,
        r: Rect,
        q: u8,
        sub: Subsampling,
    ) -> Result<Vec<u8>, ModuleError> {
        if self.jpeg_set != Some((q, sub)) {
            self.jpeg
                .set_quality(i32::from(q))
                .map_err(|e| library("jpeg quality", e))?;
            self.jpeg
                .set_subsamp(sub.turbo())
                .map_err(|e| library("jpeg subsampling", e))?;
            self.jpeg_set = Some((q, sub));
        }
        s.copy_out(r, &mut self.scratch);
        let img = turbojpeg::Image {
            pixels: self.scratch.as_slice(),
            width: usize::from(r.w),
            pitch: usize::from(r.w) * 4,
            height: usize::from(r.h),
            format: turbojpeg::PixelFormat::BGRX,
        };
        self.jpeg
            .compress_to_vec(img)
            .map_err(|e| corrupt("jpeg", e))
    }

    /// Compresses `block` into `blob` as one flushed chunk of the zstd stream.
    fn compress_block(&mut self) -> Result<(), ModuleError> {
        self.blob.clear();
        if self.block.is_empty() {
            return Ok(());
        }
        self.blob
            .reserve(zstd::zstd_safe::compress_bound(self.block.len()) + 64);
        let mut input = InBuffer::around(&self.block);
        // Feed all of the block, then flush until zstd holds nothing back.
        loop {
            if self.blob.capacity() - self.blob.len() < 64 {
                self.blob.reserve(self.blob.capacity());
            }
            let pos = self.blob.len();
            let mut output = OutBuffer::around_pos(&mut self.blob, pos);
            if input.pos < self.block.len() {
                self.zstd
                    .run(&mut input, &mut output)
                    .map_err(|e| corrupt("zstd", e))?;
            } else if self
                .zstd
                .flush(&mut output)
                .map_err(|e| corrupt("zstd", e))?
                == 0
            {
                return Ok(());
            }
        }
    }

    /// Sends the tiles due for refinement, losslessly, if the window is open.
    fn refine(&mut self, now: Instant, out: &mut Output) -> Result<(), ModuleError> {
        let Some(meta) = self.last_meta else {
            return Ok(());
        };
        if !self.window_open() {
            // Picked up again when credit comes back.
            self.next_refine = None;
            return Ok(());
        }
        let after = Duration::from_millis(u64::from(self.cfg.refine_ms));
        let mut due = Vec::new();
        let mut next: Option<Instant> = None;
        // The video region's tiles wait until it ends ([`ImageForward::drop_video`]).
        let video = self.video.as_ref().map(|v| v.region());
        for (i, t) in self.tiles.iter().enumerate() {
            let in_video = video.is_some_and(|r| {
                self.tile_rect(i)
                    .is_some_and(|tr| tr.intersection(&r).is_some())
            });
            if !t.lossy || in_video {
                continue;
            }
            if t.changed + after <= now {
                due.push(i);
            } else {
                let at = t.changed + after;
                next = Some(next.map_or(at, |n| n.min(at)));
            }
        }
        self.next_refine = next;
        let parts: Vec<(usize, Rect)> = due
            .iter()
            .filter_map(|&i| Some((i, self.tile_rect(i)?)))
            .collect();
        if parts.is_empty() {
            return Ok(());
        }
        self.stats.refined += parts.len() as u64;
        for &(i, _) in &parts {
            self.tiles[i].lossy = false;
        }
        self.encode(meta, 0, &parts, Vec::new(), true, now, out)
    }

    /// Credit for everything up to `credit`: measure the path, maybe change the preset.
    fn credit(&mut self, now: Instant, credit: u32) -> Result<(), ModuleError> {
        if !self.pacer.on_credit(now, credit) {
            // Repeated credits (sent again every 500 ms) for frames already settled are
            // normal; one for a frame never sent is not.
            if credit.wrapping_sub(self.sent) as i32 > 0 {
                return Err(ModuleError::from(ControlError::UnknownValue {
                    pair: PAIR,
                    field: "credit for a frame not sent",
                    value: u64::from(credit),
                }));
            }
            return Ok(());
        }
        if self.next_refine.is_none()
            && self.tiles.iter().any(|t| t.lossy)
            && self.cfg.refine_ms > 0
        {
            self.next_refine = Some(now);
        }
        let step = self.pacer.decide(now);
        let path = self.path_bps();
        if let (Some(v), Some(s)) = (self.video.as_mut(), step) {
            v.step(s == Step::Up, path)?;
        }
        if self.cfg.quality != Quality::Auto {
            return Ok(());
        }
        let before = self.level;
        self.level = match step {
            Some(Step::Down) => self.level.saturating_sub(1),
            Some(Step::Up) => (self.level + 1).min(super::AUTO_LADDER.len() - 1),
            None => self.level,
        };
        if self.level != before {
            self.stats.preset_changes += 1;
            tracing::debug!(
                from = super::AUTO_LADDER[before].0,
                to = super::AUTO_LADDER[self.level].0,
                fps = self.pacer.fps,
                kbps = self.pacer.kbps,
                "image: preset changed"
            );
        }
        Ok(())
    }
}

impl Half for ImageForward {
    fn handle_frame(
        &mut self,
        now: Instant,
        frame: Frame,
        out: &mut Output,
    ) -> Result<(), ModuleError> {
        let u = Update::parse(frame.payload())
            .map_err(|e| ModuleError::from(FrameError::Foreign(ForeignError::new(e))))?;
        if let Some(rp) = u.rects.iter().find(|r| r.encoding != Encoding::Raw) {
            return Err(ModuleError::from(FrameError::UnknownValue {
                pair: PAIR,
                field: "display rect encoding",
                value: u64::from(rp.encoding as u8),
            }));
        }
        let (w, h) = (u.header.width, u.header.height);
        let mut force = u.header.flags & FLAG_KEYFRAME != 0;
        if self
            .screen
            .as_ref()
            .is_none_or(|s| (s.width, s.height) != (w, h))
        {
            self.reset_screen(w, h, now);
            force = true;
        }
        // A keyframe's parts are all forced, as its first frame says.
        force |= self.held_flags & FLAG_KEYFRAME != 0;
        let mut parts = self.absorb(&u, force, now);
        if u.header.flags & FLAG_MORE != 0 {
            self.held.append(&mut parts);
            self.held_flags |= u.header.flags;
            return Ok(());
        }
        // The capture is whole: refinements and keyframes sent from here on carry its meta
        // (before, the first piece of a capture cut in several set it, and a refinement sent
        // between its pieces went out with the next capture's time: a camera sink then took
        // the capture itself, when it came, for a refinement of one already shown).
        self.last_meta = Some(frame.meta);
        if !self.held.is_empty() {
            let mut whole = std::mem::take(&mut self.held);
            whole.append(&mut parts);
            parts = whole;
        }
        let mut flags = (u.header.flags | std::mem::take(&mut self.held_flags)) & !FLAG_MORE;
        if self.cfg.broadcast() && (force || self.next_keyframe.is_none_or(|t| t <= now)) {
            parts = self.start_keyframe(now)?;
            flags |= FLAG_KEYFRAME;
        }
        let keyframe = flags & FLAG_KEYFRAME != 0;
        let mut moved = std::mem::take(&mut self.moved);
        if std::mem::take(&mut self.fresh) {
            moved.clear();
        }
        let region = self.video_region(now, moved);
        // An IDR only where a decoder may start afresh: a broadcast keyframe (an app side
        // joining). On a direct link the pair's state is continuous (a restarted peer gets a
        // new pair, whose encoder starts with one); the source flags every capture of the
        // whole screen as a keyframe, and an IDR for each of those cost the video its quality.
        let idr = keyframe && self.cfg.broadcast();
        let (parts, au) = self.code_video(region, parts, idr, now)?;
        if parts.is_empty() && au.is_empty() {
            self.stats.unchanged += 1;
            return Ok(());
        }
        self.encode(
            frame.meta,
            flags,
            &parts,
            au,
            self.preset() == Quality::Lossless,
            now,
            out,
        )
    }

    fn handle_control(
        &mut self,
        now: Instant,
        msg: Bytes,
        _out: &mut Output,
    ) -> Result<(), ModuleError> {
        match msg.first() {
            None => Err(ModuleError::from(ControlError::Empty { pair: PAIR })),
            Some(&CTRL_CREDIT) if msg.len() == CREDIT_LEN => {
                self.credit(now, u32::from_be_bytes([msg[1], msg[2], msg[3], msg[4]]))
            }
            Some(&CTRL_CREDIT) => Err(ModuleError::from(ControlError::WrongLength {
                pair: PAIR,
                what: "credit message",
                len: msg.len(),
                expected: CREDIT_LEN,
            })),
            Some(&ty) => Err(ModuleError::from(ControlError::UnknownType {
                pair: PAIR,
                ty,
            })),
        }
    }

    fn handle_timeout(&mut self, now: Instant, out: &mut Output) {
        if self.video_at.is_some_and(|t| t + VIDEO_IDLE <= now) {
            // Still: the region's tiles are refined; the detector must find it moving again
            // (a cursor blinking in a paused video is no reason for a new encoder and an IDR).
            self.drop_video(now);
            self.detector.forget_region();
        }
        if self.next_keyframe.is_some_and(|t| t <= now) {
            // The keyframe is tiles: an app side that starts at it needs an IDR next.
            self.drop_video(now);
            // A still screen: the keyframe comes from the screen copy, for app sides that
            // joined since the last one.
            if let Some(meta) = self.last_meta {
                let r = self.start_keyframe(now).and_then(|parts| {
                    let lossless = self.preset() == Quality::Lossless;
                    let flags = FLAG_KEYFRAME | format::FLAG_REPEAT;
                    self.encode(meta, flags, &parts, Vec::new(), lossless, now, out)
                });
                if let Err(e) = r {
                    tracing::warn!(error = %e, "image: keyframe failed");
                }
            }
        }
        if self.next_refine.is_some_and(|t| t <= now) {
            if let Err(e) = self.refine(now, out) {
                // Encoding what the screen copy holds cannot meet bad input; a library
                // failure leaves the tile lossy, for the next update to cover.
                tracing::warn!(error = %e, "image: refinement failed");
                self.next_refine = None;
            }
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        [
            self.next_refine,
            self.next_keyframe,
            self.video_at.map(|t| t + VIDEO_IDLE),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    fn ready(&self) -> bool {
        self.window_open()
    }

    fn stats(&self) -> HalfStats {
        let c = self.stats;
        let region = self.video.as_ref().map(|v| v.region());
        let preset = match self.preset() {
            Quality::Low => 1,
            Quality::Medium => 2,
            Quality::High => 3,
            Quality::Lossless | Quality::Auto => 4,
        };
        HalfStats {
            drops: 0,
            queue_depth: u64::from(self.pacer.frames()),
            counters: vec![
                ("updates", c.frames),
                ("unchanged", c.unchanged),
                ("solid", c.solid),
                ("palette", c.palette),
                ("jpeg", c.jpeg),
                ("lossless", c.lossless),
                ("refined_tiles", c.refined),
                ("keyframes", c.keyframes),
                ("preset", preset),
                ("jpeg_q", self.jpeg_now().map_or(0, |(q, _)| u64::from(q))),
                ("preset_changes", c.preset_changes),
                (
                    "ack_ms",
                    self.pacer.avg_ack().map_or(0, |d| d.as_millis() as u64),
                ),
                (
                    "rtt_ms",
                    self.pacer.min_rtt().map_or(0, |d| d.as_millis() as u64),
                ),
                ("kbps", self.pacer.kbps),
                (
                    "bottleneck_kbps",
                    self.pacer.rate().map_or(0, |r| (r * 8.0 / 1000.0) as u64),
                ),
                ("video_frames", self.video_frames),
                ("video_failed", self.video_failed),
                ("video_bytes", self.video_bytes),
                ("video_x", region.map_or(0, |r| u64::from(r.x))),
                ("video_y", region.map_or(0, |r| u64::from(r.y))),
                ("video_w", region.map_or(0, |r| u64::from(r.w))),
                ("video_h", region.map_or(0, |r| u64::from(r.h))),
                (
                    "video_kbps",
                    self.video.as_ref().map_or(0, |v| u64::from(v.bps() / 1000)),
                ),
            ],
        }
    }
}

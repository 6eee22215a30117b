//! Sink half of `image`: decodes each frame into a display record of raw rectangles and
//! gives credit back to the forward half.

use super::format::{self, Kind, CREDIT_LEN, CTRL_CREDIT, FLAG_REPEAT};
use super::forward::WINDOW_LOG;
use super::video::VideoDecoder;
use super::{corrupt, library, tiles, PAIR};
use ndd_core::frame::DEFAULT_HEADROOM;
use ndd_core::{ForeignError, Frame, FrameError, Half, HalfStats, ModuleError, Output};
use ndd_wire::display::{
    PixelFormat, Rect, UpdateHeader, UpdateLayout, FLAG_KEYFRAME, KNOWN_FLAGS,
};
use std::fmt;
use std::time::{Duration, Instant};
use zstd::stream::raw::{DParameter, InBuffer, Operation, OutBuffer};

/// The credit is sent again this often, so a credit lost with a link never stalls the source.
const CREDIT_AGAIN: Duration = Duration::from_millis(500);

/// Decodes frames of the `image` pair.
pub struct ImageInverse {
    max_size: usize,
    zstd: zstd::stream::raw::Decoder<'static>,
    jpeg: turbojpeg::Decompressor,
    credit: Option<u32>,
    credit_again: Option<Instant>,
    block: Vec<u8>,
    /// One unpacked row of palette indices.
    row: Vec<u8>,
    decoded: u64,
    /// Broadcast: no credit is sent, and nothing is decoded before the first keyframe.
    broadcast: bool,
    /// Broadcast: a keyframe came (the zstd stream is in step with the forward half's).
    started: bool,
    /// Broadcast: frames dropped while waiting for the first keyframe.
    skipped: u64,
    /// The frame before was decoded whole (see [`format::FLAG_REPEAT`]).
    in_step: bool,
    /// Broadcast: repeated pictures not handed on again ([`format::FLAG_REPEAT`]).
    repeats: u64,
    /// The video region's decoders, one per stripe, each with its last picture (BGRX).
    video: Vec<(VideoDecoder, Vec<u8>)>,
    /// Access units that gave no picture (their region is left as it was).
    no_picture: u64,
}

impl fmt::Debug for ImageInverse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ImageInverse")
            .field("max_size", &self.max_size)
            .field("credit", &self.credit)
            .field("decoded", &self.decoded)
            .finish_non_exhaustive()
    }
}

fn invalid(rule: &'static str) -> ModuleError {
    ModuleError::from(FrameError::Invalid { pair: PAIR, rule })
}

impl ImageInverse {
    /// An inverse half that refuses decoded updates above `max_size` bytes; `broadcast`: see
    /// [`ImageConfig::keyframe_ms`](super::ImageConfig::keyframe_ms).
    pub fn new(max_size: usize, broadcast: bool) -> Result<ImageInverse, ModuleError> {
        let mut zstd = zstd::stream::raw::Decoder::new().map_err(|e| library("zstd stream", e))?;
        zstd.set_parameter(DParameter::WindowLogMax(WINDOW_LOG))
            .map_err(|e| library("zstd window", e))?;
        Ok(ImageInverse {
            max_size,
            zstd,
            jpeg: turbojpeg::Decompressor::new().map_err(|e| library("libjpeg-turbo", e))?,
            credit: None,
            credit_again: None,
            block: Vec::new(),
            row: Vec::new(),
            decoded: 0,
            broadcast,
            started: false,
            skipped: 0,
            in_step: false,
            repeats: 0,
            video: Vec::new(),
            no_picture: 0,
        })
    }

    /// Decompresses `blob` into exactly `raw_len` bytes of `self.block`.
    fn inflate(&mut self, blob: &[u8], raw_len: usize) -> Result<(), ModuleError> {
        self.block.clear();
        self.block.resize(raw_len, 0);
        if blob.is_empty() {
            return Ok(());
        }
        let mut input = InBuffer::around(blob);
        let mut output = OutBuffer::around(self.block.as_mut_slice());
        while input.pos < blob.len() {
            let before = (input.pos, output.pos());
            self.zstd
                .run(&mut input, &mut output)
                .map_err(|e| corrupt("zstd", e))?;
            if (input.pos, output.pos()) == before {
                return Err(invalid("zstd block decompresses to more than raw_len"));
            }
        }
        if output.pos() != raw_len {
            return Err(invalid("zstd block decompresses to less than raw_len"));
        }
        Ok(())
    }

    fn send_credit(&self, out: &mut Output) {
        if let Some(c) = self.credit {
            let mut m = [0u8; CREDIT_LEN];
            m[0] = CTRL_CREDIT;
            m[1..].copy_from_slice(&c.to_be_bytes());
            out.control(m.to_vec());
        }
    }
}

impl Half for ImageInverse {
    fn handle_frame(
        &mut self,
        now: Instant,
        frame: Frame,
        out: &mut Output,
    ) -> Result<(), ModuleError> {
        let p = format::parse(frame.payload())?;
        let h = p.header;
        // Whether the frame before this one was decoded whole (this one, a repeat of its
        // picture, then brings nothing new to show).
        let in_step = std::mem::replace(&mut self.in_step, false) && self.started;
        if self.broadcast {
            if h.flags & FLAG_KEYFRAME != 0 {
                // The forward half started a new zstd stream with this frame.
                self.zstd.reinit().map_err(|e| corrupt("zstd", e))?;
                self.started = true;
            } else if !self.started {
                self.skipped += 1;
                return Ok(());
            }
        }
        if let Some(c) = self.credit {
            if h.credit.wrapping_sub(c) as i32 <= 0 {
                return Err(invalid("credit number did not increase"));
            }
        }
        if h.raw_len as usize > self.max_size {
            return Err(ModuleError::from(FrameError::OverLimit {
                pair: PAIR,
                field: "zstd block length",
                value: u64::from(h.raw_len),
                limit: "max_size",
                max: self.max_size as u64,
            }));
        }
        // The video region first (its stripes): an access unit that gives no picture leaves
        // its rect out.
        let mut rects = p.rects;
        let video: Vec<(Rect, &[u8])> = rects
            .iter()
            .filter_map(|(r, k)| match k {
                Kind::H264(au) => Some((*r, *au)),
                _ => None,
            })
            .collect();
        if video.len() > super::video::MAX_STRIPES {
            return Err(invalid(
                "more video stripes in a frame than a region is coded as",
            ));
        }
        let mut pixels = 0u64;
        for (i, &(r, _)) in video.iter().enumerate() {
            if r.right() > u32::from(h.width) || r.bottom() > u32::from(h.height) {
                return Err(invalid("video region outside the screen"));
            }
            // Before a decoder or a picture is made for it.
            if !super::video::codable(r) {
                return Err(invalid("video region of a size H.264 does not code"));
            }
            if video[..i].iter().any(|(q, _)| q.intersection(&r).is_some()) {
                return Err(invalid("video stripes overlap"));
            }
            pixels += u64::from(r.w) * u64::from(r.h);
        }
        if pixels * 4 > self.max_size as u64 {
            return Err(ModuleError::from(FrameError::OverLimit {
                pair: PAIR,
                field: "video region",
                value: pixels * 4,
                limit: "max_size",
                max: self.max_size as u64,
            }));
        }
        if !video.is_empty() {
            // The stripes of this frame's region: a decoder kept for each one that stays, a
            // new one (from an IDR) for each that is new; those of an old region go.
            let mut kept = std::mem::take(&mut self.video);
            for &(r, _) in &video {
                let d = match kept.iter().position(|(d, _)| d.region() == r) {
                    Some(k) => kept.swap_remove(k),
                    None => (VideoDecoder::new(r)?, Vec::new()),
                };
                self.video.push(d);
            }
            let gave = decode_stripes(&mut self.video, &video)?;
            for (&(r, _), gave) in video.iter().zip(gave) {
                if !gave {
                    self.no_picture += 1;
                    rects.retain(|(q, k)| !(*q == r && matches!(k, Kind::H264(_))));
                }
            }
        }
        let layout = UpdateLayout::new(
            UpdateHeader {
                width: h.width,
                height: h.height,
                format: PixelFormat::Bgrx32,
                flags: h.flags & KNOWN_FLAGS,
            },
            rects.iter().map(|(r, _)| *r).collect(),
        )
        .map_err(|e| ModuleError::from(FrameError::Foreign(ForeignError::new(e))))?;
        if layout.len() > self.max_size {
            return Err(ModuleError::from(FrameError::OverLimit {
                pair: PAIR,
                field: "decoded update length",
                value: layout.len() as u64,
                limit: "max_size",
                max: self.max_size as u64,
            }));
        }
        self.inflate(p.blob, h.raw_len as usize)?;
        let mut f = Frame::zeroed(frame.meta, DEFAULT_HEADROOM, layout.len());
        let dst = f.payload_mut();
        layout
            .write_headers(dst)
            .map_err(|e| ModuleError::from(FrameError::Foreign(ForeignError::new(e))))?;
        let mut at = 0usize;
        for (i, (r, k)) in rects.iter().enumerate() {
            let px = &mut dst[layout.pixels(i)];
            let n = k.block_len(*r);
            let block = &self.block[at..at + n];
            at += n;
            match k {
                Kind::Solid(c) => {
                    for d in px.chunks_exact_mut(4) {
                        d[..3].copy_from_slice(c);
                    }
                }
                Kind::Lossless => {
                    for (d, s) in px.chunks_exact_mut(4).zip(block.chunks_exact(3)) {
                        d[..3].copy_from_slice(s);
                    }
                }
                Kind::Palette(pal) => {
                    let colours = pal.len() / 3;
                    let bits = tiles::index_bits(colours);
                    let (w, row_len) = (usize::from(r.w), tiles::index_row_len(r.w, bits));
                    if w > 0 {
                        for (drow, packed) in
                            px.chunks_exact_mut(w * 4).zip(block.chunks_exact(row_len))
                        {
                            tiles::unpack_row(packed, w, bits, &mut self.row);
                            for (d, &ix) in drow.chunks_exact_mut(4).zip(&self.row) {
                                let ix = usize::from(ix);
                                if ix >= colours {
                                    return Err(invalid("palette index past the palette"));
                                }
                                d[..3].copy_from_slice(&pal[ix * 3..ix * 3 + 3]);
                            }
                        }
                    }
                }
                Kind::Jpeg(j) => {
                    let hdr = self.jpeg.read_header(j).map_err(|e| corrupt("jpeg", e))?;
                    if (hdr.width, hdr.height) != (usize::from(r.w), usize::from(r.h)) {
                        return Err(invalid("jpeg size differs from its rect"));
                    }
                    let img = turbojpeg::Image {
                        pixels: px,
                        width: usize::from(r.w),
                        pitch: usize::from(r.w) * 4,
                        height: usize::from(r.h),
                        format: turbojpeg::PixelFormat::BGRX,
                    };
                    self.jpeg
                        .decompress(j, img)
                        .map_err(|e| corrupt("jpeg", e))?;
                }
                Kind::H264(_) => {
                    let picture = self
                        .video
                        .iter()
                        .find(|(d, _)| d.region() == *r)
                        .map(|(_, p)| p.as_slice())
                        .unwrap_or_default();
                    if picture.len() != px.len() {
                        return Err(invalid("video picture size differs from its rect"));
                    }
                    px.copy_from_slice(picture);
                }
            }
        }
        self.decoded += 1;
        self.credit = Some(h.credit);
        self.in_step = true;
        if !self.broadcast {
            self.send_credit(out);
            self.credit_again = Some(now + CREDIT_AGAIN);
        }
        if self.broadcast && in_step && h.flags & FLAG_REPEAT != 0 {
            self.repeats += 1;
            return Ok(());
        }
        out.push(f);
        Ok(())
    }

    fn handle_timeout(&mut self, now: Instant, out: &mut Output) {
        if self.credit_again.is_some_and(|t| t <= now) {
            self.send_credit(out);
            self.credit_again = Some(now + CREDIT_AGAIN);
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.credit_again
    }

    fn stats(&self) -> HalfStats {
        HalfStats {
            counters: vec![
                ("decoded", self.decoded),
                ("skipped", self.skipped),
                ("video_no_picture", self.no_picture),
                ("repeats", self.repeats),
            ],
            ..HalfStats::default()
        }
    }
}

/// Decodes each stripe's access unit (`video[i]` into `decoders[i]`, in the same order), two
/// at once as they were coded; whether each gave a picture.
fn decode_stripes(
    decoders: &mut [(VideoDecoder, Vec<u8>)],
    video: &[(Rect, &[u8])],
) -> Result<Vec<bool>, ModuleError> {
    match (decoders, video) {
        ([(d, pic)], [(_, au)]) => Ok(vec![d.decode(au, pic)?]),
        ([(da, pa), (db, pb)], [(_, aa), (_, ab)]) => {
            let (ra, rb) = super::video::both(|| da.decode(aa, pa), || db.decode(ab, pb));
            let rb = rb.unwrap_or_else(|| Err(corrupt("H.264", "the decoder thread panicked")));
            Ok(vec![ra?, rb?])
        }
        _ => Err(invalid(
            "more video stripes in a frame than a region is coded as",
        )),
    }
}

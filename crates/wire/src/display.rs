//! Display stream records, sans-IO: the versioned payloads that the `x11-screen` source and
//! the `x11-window` / `framebuffer` sinks exchange, plus the pure pieces of those endpoints
//! (a client-side [`Framebuffer`], damage [`coalesce`]-ing, cutting an update into frames).
//!
//! Every payload starts with two bytes, **version** (`1`) and **kind** (docs/endpoints.md,
//! "Display records"); all integers are big-endian:
//!
//! | kind | body |
//! |---|---|
//! | `0x00` update | width u16, height u16 (the whole screen), pixel format u8, flags u8, rect count u16, then per rect x u16, y u16, w u16, h u16, encoding u8, then its pixels |
//! | `0x01` cursor | width u16, height u16, hot spot x u16, y u16, then width × height pixels B, G, R, A ([`Cursor`]) |
//!
//! Pixel format `0` is [`PixelFormat::Bgrx32`]: 4 bytes per pixel, B, G, R and an unspecified
//! fourth byte, rows top to bottom without padding (the memory layout of a 24/32-bit
//! TrueColor X image on a little-endian machine, and of a 32-bpp Linux framebuffer).
//! Encoding `0` is raw: `w * h * 4` pixel bytes follow the rect's header.
//!
//! [`Update::parse`] checks the version, kind, format, flags, every rect's bounds and the exact
//! length, and borrows the pixels from the payload; nothing it is given makes it panic.
//! [`UpdateLayout`] writes the headers of an update into a frame's payload and says where each
//! rect's pixels go, so a source captures straight into the frame (no intermediate copy).

use std::fmt;
use std::ops::Range;

/// Version byte of every display record.
pub const VERSION: u8 = 1;
/// Kind byte: an update (a set of rectangles of pixels).
pub const KIND_UPDATE: u8 = 0x00;
/// Bytes of an update's header: version, kind, width, height, format, flags, rect count.
pub const HEADER_LEN: usize = 10;
/// Bytes of a rect's header: x, y, w, h, encoding.
pub const RECT_HEADER_LEN: usize = 9;
/// Flag bit: this update's rects cover the whole screen (a keyframe; with
/// [`FLAG_MORE`], the frames of this capture together cover it).
pub const FLAG_KEYFRAME: u8 = 0x01;
/// Flag bit: more frames of the same capture follow (a capture larger than
/// [`MAX_UPDATE_PAYLOAD`] is cut into several frames).
pub const FLAG_MORE: u8 = 0x02;
/// Every flag bit this version defines.
pub const KNOWN_FLAGS: u8 = FLAG_KEYFRAME | FLAG_MORE;
/// Largest payload a source puts in one frame: 4 MiB, well under the links' 16 MiB message
/// limit, so a 1920×1080 keyframe (8.3 MB) travels as two frames.
pub const MAX_UPDATE_PAYLOAD: usize = 4 * 1024 * 1024;

/// How pixels are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum PixelFormat {
    /// 32 bits per pixel, bytes B, G, R, X (X unspecified): a 24/32-bit TrueColor X image
    /// (red mask 0xff0000, green 0xff00, blue 0xff) in LSBFirst byte order.
    #[default]
    Bgrx32 = 0,
}

impl PixelFormat {
    /// The format byte's value.
    pub fn from_byte(b: u8) -> Option<PixelFormat> {
        match b {
            0 => Some(PixelFormat::Bgrx32),
            _ => None,
        }
    }

    /// Bytes per pixel.
    pub fn bytes_per_pixel(self) -> usize {
        match self {
            PixelFormat::Bgrx32 => 4,
        }
    }
}

impl fmt::Display for PixelFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PixelFormat::Bgrx32 => "bgrx32",
        })
    }
}

/// How a rect's pixels are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum Encoding {
    /// `w * h * bytes_per_pixel` bytes, rows top to bottom, no padding.
    #[default]
    Raw = 0,
}

impl Encoding {
    /// The encoding byte's value.
    pub fn from_byte(b: u8) -> Option<Encoding> {
        match b {
            0 => Some(Encoding::Raw),
            _ => None,
        }
    }
}

/// A rectangle of the screen (pixels).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Rect {
    /// Left column.
    pub x: u16,
    /// Top row.
    pub y: u16,
    /// Width.
    pub w: u16,
    /// Height.
    pub h: u16,
}

impl fmt::Display for Rect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}+{}+{}", self.w, self.h, self.x, self.y)
    }
}

impl Rect {
    /// A rect.
    pub const fn new(x: u16, y: u16, w: u16, h: u16) -> Rect {
        Rect { x, y, w, h }
    }

    /// Pixels covered.
    pub fn area(&self) -> u64 {
        u64::from(self.w) * u64::from(self.h)
    }

    /// No pixels.
    pub fn is_empty(&self) -> bool {
        self.w == 0 || self.h == 0
    }

    /// One past the right column.
    pub fn right(&self) -> u32 {
        u32::from(self.x) + u32::from(self.w)
    }

    /// One past the bottom row.
    pub fn bottom(&self) -> u32 {
        u32::from(self.y) + u32::from(self.h)
    }

    /// Whether the rect lies inside a `width`×`height` screen.
    pub fn fits(&self, width: u16, height: u16) -> bool {
        self.right() <= u32::from(width) && self.bottom() <= u32::from(height)
    }

    /// The smallest rect containing both (clamped to the u16 range).
    pub fn union(&self, o: &Rect) -> Rect {
        let x = self.x.min(o.x);
        let y = self.y.min(o.y);
        let r = self.right().max(o.right());
        let b = self.bottom().max(o.bottom());
        Rect {
            x,
            y,
            w: u16::try_from(r - u32::from(x)).unwrap_or(u16::MAX),
            h: u16::try_from(b - u32::from(y)).unwrap_or(u16::MAX),
        }
    }

    /// The common part, if any.
    pub fn intersection(&self, o: &Rect) -> Option<Rect> {
        let x = self.x.max(o.x);
        let y = self.y.max(o.y);
        let r = self.right().min(o.right());
        let b = self.bottom().min(o.bottom());
        (r > u32::from(x) && b > u32::from(y)).then(|| Rect {
            x,
            y,
            // Both fit: they are at most the smaller rect's size.
            w: (r - u32::from(x)) as u16,
            h: (b - u32::from(y)) as u16,
        })
    }

    /// The part inside a `width`×`height` screen, if any.
    pub fn clip(&self, width: u16, height: u16) -> Option<Rect> {
        self.intersection(&Rect::new(0, 0, width, height))
    }

    /// The same rect from signed X coordinates (an XFixes region's rectangles), clipped to
    /// a `width`×`height` screen.
    pub fn from_signed(x: i16, y: i16, w: u16, h: u16, width: u16, height: u16) -> Option<Rect> {
        let x0 = i32::from(x).max(0);
        let y0 = i32::from(y).max(0);
        let x1 = (i32::from(x) + i32::from(w)).min(i32::from(width));
        let y1 = (i32::from(y) + i32::from(h)).min(i32::from(height));
        (x1 > x0 && y1 > y0).then(|| Rect {
            x: x0 as u16,
            y: y0 as u16,
            w: (x1 - x0) as u16,
            h: (y1 - y0) as u16,
        })
    }
}

/// What is wrong with a display-stream payload (or an update to be emitted or applied).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DisplayFrameError {
    /// Fewer than the two header bytes.
    #[error("display record: {0} bytes, shorter than the 2-byte header")]
    Short(usize),
    /// A version this build does not speak.
    #[error("display record: unsupported version {0} (this build speaks version 1)")]
    Version(u8),
    /// Unknown kind byte.
    #[error(
        "display record: unknown kind {0:#04x} (known: 0x00 update, 0x01 cursor, 0x02 link state)"
    )]
    UnknownKind(u8),
    /// The payload ends inside a header.
    #[error("display record: update truncated: {what} needs bytes {start}..{end}, the payload has {got}")]
    Truncated {
        /// Which header (`update header`, `rect 3 header`).
        what: String,
        /// Where it starts.
        start: usize,
        /// Where it ends.
        end: usize,
        /// Payload length.
        got: usize,
    },
    /// Unknown pixel format byte.
    #[error("display record: unknown pixel format {0} (this build knows 0 = bgrx32)")]
    Format(u8),
    /// Flag bits this version does not define.
    #[error("display record: unknown flag bits {0:#04x} (known: 0x01 keyframe, 0x02 more)")]
    Flags(u8),
    /// A screen of zero width or height.
    #[error("display record: empty screen {width}x{height}")]
    EmptyScreen {
        /// Width.
        width: u16,
        /// Height.
        height: u16,
    },
    /// A rect with an unknown encoding byte.
    #[error(
        "display record: rect {index}: unknown encoding {encoding} (this build knows 0 = raw)"
    )]
    Encoding {
        /// Index of the rect.
        index: usize,
        /// Its encoding byte.
        encoding: u8,
    },
    /// A rect of zero width or height.
    #[error("display record: rect {index} ({rect}) is empty")]
    EmptyRect {
        /// Index of the rect.
        index: usize,
        /// The rect.
        rect: Rect,
    },
    /// A rect reaching past the screen's edge.
    #[error("display record: rect {index} ({rect}) lies outside the {width}x{height} screen")]
    OutOfBounds {
        /// Index of the rect.
        index: usize,
        /// The rect.
        rect: Rect,
        /// Screen width.
        width: u16,
        /// Screen height.
        height: u16,
    },
    /// A rect's pixels run past the end of the payload.
    #[error("display record: rect {index} ({rect}) needs {need} pixel bytes, only {got} left")]
    Pixels {
        /// Index of the rect.
        index: usize,
        /// The rect.
        rect: Rect,
        /// Bytes its size calls for.
        need: usize,
        /// Bytes left in the payload.
        got: usize,
    },
    /// Bytes after the last rect.
    #[error("display record: {0} bytes after the last rect")]
    Trailing(usize),
    /// More rects than a u16 count holds.
    #[error("display record: {0} rects, at most 65535 fit one update")]
    TooManyRects(usize),
    /// A cursor record that breaks a rule (size, hot spot, pixel bytes).
    #[error("display record: cursor: {0}")]
    Cursor(String),
    /// An emit buffer of the wrong size.
    #[error("display record: buffer of {got} bytes for an update of {want}")]
    Buffer {
        /// Bytes the update needs.
        want: usize,
        /// Bytes given.
        got: usize,
    },
}

/// The screen an update belongs to, and its flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct UpdateHeader {
    /// Screen width.
    pub width: u16,
    /// Screen height.
    pub height: u16,
    /// Pixel format.
    pub format: PixelFormat,
    /// [`FLAG_KEYFRAME`], [`FLAG_MORE`].
    pub flags: u8,
}

impl UpdateHeader {
    /// Whether [`FLAG_KEYFRAME`] is set.
    pub fn keyframe(&self) -> bool {
        self.flags & FLAG_KEYFRAME != 0
    }

    /// Whether [`FLAG_MORE`] is set.
    pub fn more(&self) -> bool {
        self.flags & FLAG_MORE != 0
    }

    fn check(&self) -> Result<(), DisplayFrameError> {
        if self.width == 0 || self.height == 0 {
            return Err(DisplayFrameError::EmptyScreen {
                width: self.width,
                height: self.height,
            });
        }
        if self.flags & !KNOWN_FLAGS != 0 {
            return Err(DisplayFrameError::Flags(self.flags & !KNOWN_FLAGS));
        }
        Ok(())
    }

    fn check_rect(&self, index: usize, rect: Rect) -> Result<(), DisplayFrameError> {
        if rect.is_empty() {
            return Err(DisplayFrameError::EmptyRect { index, rect });
        }
        if !rect.fits(self.width, self.height) {
            return Err(DisplayFrameError::OutOfBounds {
                index,
                rect,
                width: self.width,
                height: self.height,
            });
        }
        Ok(())
    }

    /// Pixel bytes of `rect` in this format.
    pub fn rect_bytes(&self, rect: Rect) -> usize {
        rect_bytes(self.format, rect)
    }
}

fn rect_bytes(format: PixelFormat, rect: Rect) -> usize {
    usize::from(rect.w) * usize::from(rect.h) * format.bytes_per_pixel()
}

/// One rect of a parsed update, its pixels borrowed from the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RectPixels<'a> {
    /// Where on the screen.
    pub rect: Rect,
    /// How the pixels are encoded.
    pub encoding: Encoding,
    /// The pixels: `w * h * 4` bytes for raw bgrx32.
    pub pixels: &'a [u8],
}

/// A parsed update record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Update<'a> {
    /// Screen size, format, flags.
    pub header: UpdateHeader,
    /// The rects, in payload order (a later rect overwrites an earlier one where they
    /// overlap).
    pub rects: Vec<RectPixels<'a>>,
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

impl<'a> Update<'a> {
    /// Parses a payload, borrowing the pixels.
    pub fn parse(payload: &'a [u8]) -> Result<Update<'a>, DisplayFrameError> {
        let [version, kind, ..] = payload else {
            return Err(DisplayFrameError::Short(payload.len()));
        };
        if *version != VERSION {
            return Err(DisplayFrameError::Version(*version));
        }
        if *kind != KIND_UPDATE {
            return Err(DisplayFrameError::UnknownKind(*kind));
        }
        let truncated = |what: String, start: usize, end: usize| DisplayFrameError::Truncated {
            what,
            start,
            end,
            got: payload.len(),
        };
        if payload.len() < HEADER_LEN {
            return Err(truncated("update header".into(), 0, HEADER_LEN));
        }
        let format =
            PixelFormat::from_byte(payload[6]).ok_or(DisplayFrameError::Format(payload[6]))?;
        let header = UpdateHeader {
            width: be16(payload, 2),
            height: be16(payload, 4),
            format,
            flags: payload[7],
        };
        header.check()?;
        let count = usize::from(be16(payload, 8));
        let mut rects = Vec::with_capacity(count.min(payload.len() / RECT_HEADER_LEN));
        let mut pos = HEADER_LEN;
        for index in 0..count {
            let end = pos + RECT_HEADER_LEN;
            if end > payload.len() {
                return Err(truncated(format!("rect {index} header"), pos, end));
            }
            let h = &payload[pos..end];
            let rect = Rect::new(be16(h, 0), be16(h, 2), be16(h, 4), be16(h, 6));
            let encoding = Encoding::from_byte(h[8]).ok_or(DisplayFrameError::Encoding {
                index,
                encoding: h[8],
            })?;
            header.check_rect(index, rect)?;
            let need = header.rect_bytes(rect);
            let left = payload.len() - end;
            if need > left {
                return Err(DisplayFrameError::Pixels {
                    index,
                    rect,
                    need,
                    got: left,
                });
            }
            rects.push(RectPixels {
                rect,
                encoding,
                pixels: &payload[end..end + need],
            });
            pos = end + need;
        }
        if pos != payload.len() {
            return Err(DisplayFrameError::Trailing(payload.len() - pos));
        }
        Ok(Update { header, rects })
    }

    /// Payload bytes of this update.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN
            + self
                .rects
                .iter()
                .map(|r| RECT_HEADER_LEN + r.pixels.len())
                .sum::<usize>()
    }

    /// Writes the update; checks the same rules as [`Update::parse`].
    pub fn emit(&self) -> Result<Vec<u8>, DisplayFrameError> {
        let layout = UpdateLayout::new(self.header, self.rects.iter().map(|r| r.rect).collect())?;
        let mut out = vec![0u8; layout.len()];
        layout.write_headers(&mut out)?;
        for (i, r) in self.rects.iter().enumerate() {
            let range = layout.pixels(i);
            if r.pixels.len() != range.len() {
                return Err(DisplayFrameError::Pixels {
                    index: i,
                    rect: r.rect,
                    need: range.len(),
                    got: r.pixels.len(),
                });
            }
            out[range].copy_from_slice(r.pixels);
        }
        Ok(out)
    }
}

/// Where everything of an update goes in its payload, so a source can write the headers and
/// then capture each rect's pixels straight into the frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpdateLayout {
    header: UpdateHeader,
    rects: Vec<Rect>,
    /// Start of each rect's pixels.
    starts: Vec<usize>,
    len: usize,
}

impl UpdateLayout {
    /// Checks the header and every rect (non-empty, inside the screen, at most 65535).
    pub fn new(header: UpdateHeader, rects: Vec<Rect>) -> Result<UpdateLayout, DisplayFrameError> {
        header.check()?;
        if rects.len() > usize::from(u16::MAX) {
            return Err(DisplayFrameError::TooManyRects(rects.len()));
        }
        let mut starts = Vec::with_capacity(rects.len());
        let mut pos = HEADER_LEN;
        for (i, r) in rects.iter().enumerate() {
            header.check_rect(i, *r)?;
            pos += RECT_HEADER_LEN;
            starts.push(pos);
            pos += header.rect_bytes(*r);
        }
        Ok(UpdateLayout {
            header,
            rects,
            starts,
            len: pos,
        })
    }

    /// Payload bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never: an update has at least its header.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The header.
    pub fn header(&self) -> UpdateHeader {
        self.header
    }

    /// The rects.
    pub fn rects(&self) -> &[Rect] {
        &self.rects
    }

    /// Where rect `i`'s pixels go in the payload.
    ///
    /// # Panics
    /// If `i` is not a rect index of this layout.
    pub fn pixels(&self, i: usize) -> Range<usize> {
        let start = self.starts[i];
        start..start + self.header.rect_bytes(self.rects[i])
    }

    /// Writes the update header and every rect header into `out` (exactly [`Self::len`]
    /// bytes), leaving the pixel ranges as they are.
    pub fn write_headers(&self, out: &mut [u8]) -> Result<(), DisplayFrameError> {
        if out.len() != self.len {
            return Err(DisplayFrameError::Buffer {
                want: self.len,
                got: out.len(),
            });
        }
        out[0] = VERSION;
        out[1] = KIND_UPDATE;
        out[2..4].copy_from_slice(&self.header.width.to_be_bytes());
        out[4..6].copy_from_slice(&self.header.height.to_be_bytes());
        out[6] = self.header.format as u8;
        out[7] = self.header.flags;
        // At most u16::MAX rects (checked in `new`).
        out[8..10].copy_from_slice(&(self.rects.len() as u16).to_be_bytes());
        for (r, &start) in self.rects.iter().zip(&self.starts) {
            let h = &mut out[start - RECT_HEADER_LEN..start];
            h[0..2].copy_from_slice(&r.x.to_be_bytes());
            h[2..4].copy_from_slice(&r.y.to_be_bytes());
            h[4..6].copy_from_slice(&r.w.to_be_bytes());
            h[6..8].copy_from_slice(&r.h.to_be_bytes());
            h[8] = Encoding::Raw as u8;
        }
        Ok(())
    }
}

/// Copies `src` (the rows of `rect`, no padding) into a `width`×`height` image `dst` of
/// `bpp` bytes per pixel, rows without padding.
pub fn blit(
    dst: &mut [u8],
    width: u16,
    height: u16,
    bpp: usize,
    rect: Rect,
    src: &[u8],
) -> Result<(), DisplayFrameError> {
    let oob = || DisplayFrameError::OutOfBounds {
        index: 0,
        rect,
        width,
        height,
    };
    if !rect.fits(width, height) {
        return Err(oob());
    }
    let stride = usize::from(width) * bpp;
    let row = usize::from(rect.w) * bpp;
    let need = row * usize::from(rect.h);
    if src.len() != need {
        return Err(DisplayFrameError::Pixels {
            index: 0,
            rect,
            need,
            got: src.len(),
        });
    }
    if dst.len() < stride * usize::from(height) {
        return Err(DisplayFrameError::Buffer {
            want: stride * usize::from(height),
            got: dst.len(),
        });
    }
    if row == 0 {
        return Ok(());
    }
    let x0 = usize::from(rect.x) * bpp;
    for (i, line) in src.chunks_exact(row).enumerate() {
        let at = (usize::from(rect.y) + i) * stride + x0;
        dst[at..at + row].copy_from_slice(line);
    }
    Ok(())
}

/// A screen's pixels, kept by a sink: updates are applied to it, and it redraws what an
/// update does not carry (an exposed window).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Framebuffer {
    width: u16,
    height: u16,
    format: PixelFormat,
    pixels: Vec<u8>,
}

impl Framebuffer {
    /// A black (zeroed) screen.
    pub fn new(width: u16, height: u16, format: PixelFormat) -> Framebuffer {
        Framebuffer {
            width,
            height,
            format,
            pixels: vec![0; usize::from(width) * usize::from(height) * format.bytes_per_pixel()],
        }
    }

    /// Width.
    pub fn width(&self) -> u16 {
        self.width
    }

    /// Height.
    pub fn height(&self) -> u16 {
        self.height
    }

    /// Pixel format.
    pub fn format(&self) -> PixelFormat {
        self.format
    }

    /// Bytes per row.
    pub fn stride(&self) -> usize {
        usize::from(self.width) * self.format.bytes_per_pixel()
    }

    /// All pixels, rows top to bottom.
    pub fn pixels(&self) -> &[u8] {
        &self.pixels
    }

    /// All pixels, writable (the size stays).
    pub fn pixels_mut(&mut self) -> &mut [u8] {
        &mut self.pixels
    }

    /// Applies an update: a different screen size or format first resizes the framebuffer
    /// and clears it to black (returns `true` then). Every rect is bounds-checked.
    pub fn apply(&mut self, u: &Update<'_>) -> Result<bool, DisplayFrameError> {
        u.header.check()?;
        for (i, r) in u.rects.iter().enumerate() {
            u.header.check_rect(i, r.rect)?;
            let need = u.header.rect_bytes(r.rect);
            if r.pixels.len() != need {
                return Err(DisplayFrameError::Pixels {
                    index: i,
                    rect: r.rect,
                    need,
                    got: r.pixels.len(),
                });
            }
        }
        let resized = (self.width, self.height, self.format)
            != (u.header.width, u.header.height, u.header.format);
        if resized {
            *self = Framebuffer::new(u.header.width, u.header.height, u.header.format);
        }
        let bpp = self.format.bytes_per_pixel();
        for r in &u.rects {
            blit(
                &mut self.pixels,
                self.width,
                self.height,
                bpp,
                r.rect,
                r.pixels,
            )?;
        }
        Ok(resized)
    }

    /// The pixels of `rect` (rows without padding), or `None` if it is not inside.
    pub fn rect_pixels(&self, rect: Rect) -> Option<Vec<u8>> {
        if !rect.fits(self.width, self.height) {
            return None;
        }
        let bpp = self.format.bytes_per_pixel();
        let row = usize::from(rect.w) * bpp;
        let mut out = Vec::with_capacity(row * usize::from(rect.h));
        for y in rect.y..rect.y + rect.h {
            let at = usize::from(y) * self.stride() + usize::from(rect.x) * bpp;
            out.extend_from_slice(&self.pixels[at..at + row]);
        }
        Some(out)
    }
}

/// Pixels two rects may waste when merged into their bounding box (a 64×64 tile): fewer,
/// larger rects cost fewer capture requests and headers.
pub const MERGE_SLACK: u64 = 64 * 64;
/// Above this many damaged rects, [`coalesce`] sends their bounding box at once.
pub const MAX_DAMAGE_INPUT: usize = 1024;

fn waste(a: &Rect, b: &Rect) -> u64 {
    let covered = a.area() + b.area() - a.intersection(b).map_or(0, |i| i.area());
    a.union(b).area().saturating_sub(covered)
}

/// Damage coalescing (pure): clips `damage` to the `width`×`height` screen, drops empty rects,
/// merges overlapping and nearby rects (whose bounding box wastes at most [`MERGE_SLACK`]
/// pixels) into their bounding box, then, while more than `max_rects` remain, merges the pair
/// that wastes the fewest pixels. More than [`MAX_DAMAGE_INPUT`] rects, or `max_rects` 1,
/// give the bounding box of all. The result covers every damaged pixel on the screen.
pub fn coalesce(damage: &[Rect], width: u16, height: u16, max_rects: usize) -> Vec<Rect> {
    let mut rects: Vec<Rect> = damage
        .iter()
        .filter_map(|r| r.clip(width, height))
        .collect();
    let max_rects = max_rects.max(1);
    if rects.len() > MAX_DAMAGE_INPUT || (max_rects == 1 && rects.len() > 1) {
        let all = rects.iter().skip(1).fold(rects[0], |acc, r| acc.union(r));
        return vec![all];
    }
    // Merge overlapping and nearby rects until none qualify.
    let mut changed = true;
    while changed {
        changed = false;
        let mut i = 0;
        while i < rects.len() {
            let mut j = i + 1;
            while j < rects.len() {
                let (a, b) = (rects[i], rects[j]);
                if a.intersection(&b).is_some() || waste(&a, &b) <= MERGE_SLACK {
                    rects[i] = a.union(&b);
                    rects.swap_remove(j);
                    changed = true;
                    j = i + 1;
                } else {
                    j += 1;
                }
            }
            i += 1;
        }
    }
    // Over the cap: merge the cheapest pairs.
    while rects.len() > max_rects {
        let mut best = (0, 1, u64::MAX);
        for i in 0..rects.len() {
            for j in i + 1..rects.len() {
                let w = waste(&rects[i], &rects[j]);
                if w < best.2 {
                    best = (i, j, w);
                }
            }
        }
        let (i, j, _) = best;
        rects[i] = rects[i].union(&rects[j]);
        rects.swap_remove(j);
    }
    rects.sort_by_key(|r| (r.y, r.x));
    rects
}

/// Cuts `rect` into bands of whole rows of at most `max_bytes` pixel bytes each (at least one
/// row per band).
pub fn bands(rect: Rect, bpp: usize, max_bytes: usize) -> impl Iterator<Item = Rect> {
    let row = (usize::from(rect.w) * bpp).max(1);
    let rows = u16::try_from((max_bytes / row).max(1)).unwrap_or(u16::MAX);
    let bottom = rect.bottom();
    (0..)
        .map(move |i: u32| u32::from(rect.y) + i * u32::from(rows))
        .take_while(move |&y| y < bottom && y <= u32::from(u16::MAX))
        .map(move |y| Rect {
            x: rect.x,
            // y ≤ u16::MAX (above), and a band is at most `rows` high.
            y: y as u16,
            w: rect.w,
            h: (bottom - y).min(u32::from(rows)) as u16,
        })
}

/// Groups `rects` into the frames of one capture so that no frame's payload exceeds
/// `max_payload` bytes: rects too large for one frame are cut into bands of rows. Every frame
/// has at least one rect; the union of all is exactly the union of `rects`.
pub fn plan_frames(rects: &[Rect], format: PixelFormat, max_payload: usize) -> Vec<Vec<Rect>> {
    let bpp = format.bytes_per_pixel();
    let budget = max_payload
        .saturating_sub(HEADER_LEN + RECT_HEADER_LEN)
        .max(1);
    let mut frames: Vec<Vec<Rect>> = Vec::new();
    let mut cur: Vec<Rect> = Vec::new();
    let mut cur_len = HEADER_LEN;
    for r in rects.iter().filter(|r| !r.is_empty()) {
        for band in bands(*r, bpp, budget) {
            let add = RECT_HEADER_LEN + usize::from(band.w) * usize::from(band.h) * bpp;
            if !cur.is_empty()
                && (cur_len + add > max_payload || cur.len() == usize::from(u16::MAX))
            {
                frames.push(std::mem::take(&mut cur));
                cur_len = HEADER_LEN;
            }
            cur.push(band);
            cur_len += add;
        }
    }
    if !cur.is_empty() {
        frames.push(cur);
    }
    frames
}

/// A link-state record: version, kind `0x02`, state. The side that runs a viewer puts it in
/// front of the viewer when the link goes down or comes back (it never crosses the link), so
/// the viewer can show it.
pub const KIND_LINK_STATE: u8 = 0x02;

/// What a link-state record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkState {
    /// `0`: frames flow.
    Up,
    /// `1`: the link is lost; reconnecting.
    Down,
    /// `2`: the peer stopped; waiting for it to come back.
    PeerStopped,
}

impl LinkState {
    /// The 3-byte record.
    pub fn payload(self) -> [u8; 3] {
        let state = match self {
            LinkState::Up => 0,
            LinkState::Down => 1,
            LinkState::PeerStopped => 2,
        };
        [VERSION, KIND_LINK_STATE, state]
    }

    /// The state, if `payload` is a link-state record (anything else: `None`).
    pub fn parse(payload: &[u8]) -> Option<LinkState> {
        match payload {
            [VERSION, KIND_LINK_STATE, 0] => Some(LinkState::Up),
            [VERSION, KIND_LINK_STATE, 1] => Some(LinkState::Down),
            [VERSION, KIND_LINK_STATE, 2] => Some(LinkState::PeerStopped),
            _ => None,
        }
    }
}

/// Kind byte: a cursor image (the `x11-cursor` endpoints).
pub const KIND_CURSOR: u8 = 0x01;
/// Bytes of a cursor record's header: version, kind, width, height, hot spot x and y.
pub const CURSOR_HEADER_LEN: usize = 10;
/// Largest cursor edge a record may carry (X servers use 64 or less).
pub const MAX_CURSOR_EDGE: u16 = 256;

/// A cursor image: what the pointer looks like, drawn by the viewer's X server itself so it
/// moves with no network delay (VNC's cursor pseudo-encoding).
///
/// Record: version `1`, kind `0x01`, width u16, height u16, hot spot x u16 and y u16, then
/// `width * height` pixels of 4 bytes B, G, R, A (premultiplied alpha, as XFIXES gives it:
/// an ARGB32 value in little-endian byte order), rows top to bottom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    /// Width in pixels, 1..=[`MAX_CURSOR_EDGE`].
    pub width: u16,
    /// Height in pixels, 1..=[`MAX_CURSOR_EDGE`].
    pub height: u16,
    /// Hot spot (the pointer's position inside the image), inside the image.
    pub xhot: u16,
    /// Hot spot.
    pub yhot: u16,
    /// `width * height * 4` bytes B, G, R, A.
    pub pixels: Vec<u8>,
}

impl Cursor {
    /// Parses a cursor record.
    pub fn parse(p: &[u8]) -> Result<Cursor, DisplayFrameError> {
        let [version, kind, ..] = p else {
            return Err(DisplayFrameError::Short(p.len()));
        };
        if *version != VERSION {
            return Err(DisplayFrameError::Version(*version));
        }
        if *kind != KIND_CURSOR {
            return Err(DisplayFrameError::Cursor(format!(
                "kind {kind:#04x} is not a cursor record (0x01)"
            )));
        }
        if p.len() < CURSOR_HEADER_LEN {
            return Err(DisplayFrameError::Cursor(format!(
                "{} bytes, shorter than the {CURSOR_HEADER_LEN}-byte header",
                p.len()
            )));
        }
        let c = Cursor {
            width: be16(p, 2),
            height: be16(p, 4),
            xhot: be16(p, 6),
            yhot: be16(p, 8),
            pixels: Vec::new(),
        };
        c.check()?;
        let need = usize::from(c.width) * usize::from(c.height) * 4;
        let got = p.len() - CURSOR_HEADER_LEN;
        if got != need {
            return Err(DisplayFrameError::Cursor(format!(
                "{}x{} needs {need} pixel bytes, the record has {got}",
                c.width, c.height
            )));
        }
        Ok(Cursor {
            pixels: p[CURSOR_HEADER_LEN..].to_vec(),
            ..c
        })
    }

    fn check(&self) -> Result<(), DisplayFrameError> {
        let edge = 1..=MAX_CURSOR_EDGE;
        if !edge.contains(&self.width) || !edge.contains(&self.height) {
            return Err(DisplayFrameError::Cursor(format!(
                "size {}x{} outside 1..={MAX_CURSOR_EDGE}",
                self.width, self.height
            )));
        }
        if self.xhot >= self.width || self.yhot >= self.height {
            return Err(DisplayFrameError::Cursor(format!(
                "hot spot ({}, {}) outside the {}x{} image",
                self.xhot, self.yhot, self.width, self.height
            )));
        }
        Ok(())
    }

    /// Writes the record; checks the same rules as [`Cursor::parse`].
    pub fn emit(&self) -> Result<Vec<u8>, DisplayFrameError> {
        self.check()?;
        let need = usize::from(self.width) * usize::from(self.height) * 4;
        if self.pixels.len() != need {
            return Err(DisplayFrameError::Cursor(format!(
                "{}x{} needs {need} pixel bytes, {} given",
                self.width,
                self.height,
                self.pixels.len()
            )));
        }
        let mut out = Vec::with_capacity(CURSOR_HEADER_LEN + need);
        out.extend_from_slice(&[VERSION, KIND_CURSOR]);
        for v in [self.width, self.height, self.xhot, self.yhot] {
            out.extend_from_slice(&v.to_be_bytes());
        }
        out.extend_from_slice(&self.pixels);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn header(width: u16, height: u16, flags: u8) -> UpdateHeader {
        UpdateHeader {
            width,
            height,
            format: PixelFormat::Bgrx32,
            flags,
        }
    }

    #[test]
    fn parse_emit_update() {
        // A 4x3 screen, one 2x1 rect at (1,2): two pixels.
        let p = hex("01 00 0004 0003 00 00 0001  0001 0002 0002 0001 00  11223300 44556600");
        let u = Update::parse(&p).unwrap();
        assert_eq!(u.header, header(4, 3, 0));
        assert_eq!(u.rects.len(), 1);
        assert_eq!(u.rects[0].rect, Rect::new(1, 2, 2, 1));
        assert_eq!(u.rects[0].encoding, Encoding::Raw);
        assert_eq!(u.rects[0].pixels, hex("11223300 44556600"));
        assert_eq!(u.buffer_len(), p.len());
        assert_eq!(u.emit().unwrap(), p);
        // An update without rects (nothing changed) is valid.
        let p = hex("01 00 0280 01e0 00 01 0000");
        let u = Update::parse(&p).unwrap();
        assert!(u.header.keyframe() && !u.header.more());
        assert_eq!(u.rects, vec![]);
        assert_eq!(u.emit().unwrap(), p);
    }

    #[test]
    fn bad_updates_are_named() {
        let err = |s: &str| Update::parse(&hex(s)).unwrap_err().to_string();
        assert_eq!(
            err("01"),
            "display record: 1 bytes, shorter than the 2-byte header"
        );
        assert_eq!(
            err("02 00"),
            "display record: unsupported version 2 (this build speaks version 1)"
        );
        assert_eq!(
            err("01 05"),
            "display record: unknown kind 0x05 (known: 0x00 update, 0x01 cursor, 0x02 link state)"
        );
        assert_eq!(
            err("01 00 0004 0003 00"),
            "display record: update truncated: update header needs bytes 0..10, the payload has 7"
        );
        assert_eq!(
            err("01 00 0004 0003 07 00 0000"),
            "display record: unknown pixel format 7 (this build knows 0 = bgrx32)"
        );
        assert_eq!(
            err("01 00 0004 0003 00 84 0000"),
            "display record: unknown flag bits 0x84 (known: 0x01 keyframe, 0x02 more)"
        );
        assert_eq!(
            err("01 00 0000 0003 00 00 0000"),
            "display record: empty screen 0x3"
        );
        assert_eq!(
            err("01 00 0004 0003 00 00 0001 0001 0002"),
            "display record: update truncated: rect 0 header needs bytes 10..19, the payload has 14"
        );
        assert_eq!(
            err("01 00 0004 0003 00 00 0001 0001 0002 0002 0001 03"),
            "display record: rect 0: unknown encoding 3 (this build knows 0 = raw)"
        );
        assert_eq!(
            err("01 00 0004 0003 00 00 0001 0001 0002 0000 0001 00"),
            "display record: rect 0 (0x1+1+2) is empty"
        );
        assert_eq!(
            err(
                "01 00 0004 0003 00 00 0002 0000 0000 0001 0001 00 00000000 0003 0002 0002 0001 00"
            ),
            "display record: rect 1 (2x1+3+2) lies outside the 4x3 screen"
        );
        assert_eq!(
            err("01 00 0004 0003 00 00 0001 0001 0002 0002 0001 00 11223300"),
            "display record: rect 0 (2x1+1+2) needs 8 pixel bytes, only 4 left"
        );
        assert_eq!(
            err("01 00 0004 0003 00 00 0000 ff"),
            "display record: 1 bytes after the last rect"
        );
        // A huge count with nothing behind it is an error, not a huge allocation.
        assert!(err("01 00 0004 0003 00 00 ffff").contains("rect 0 header"));
    }

    #[test]
    fn layout_writes_headers_and_places_pixels() {
        let rects = vec![Rect::new(0, 0, 2, 2), Rect::new(3, 1, 1, 2)];
        let l = UpdateLayout::new(header(4, 3, FLAG_KEYFRAME), rects.clone()).unwrap();
        assert_eq!(l.len(), HEADER_LEN + 2 * RECT_HEADER_LEN + 16 + 8);
        let mut buf = vec![0u8; l.len()];
        l.write_headers(&mut buf).unwrap();
        assert_eq!(l.pixels(0), 19..35);
        assert_eq!(l.pixels(1), 44..52);
        buf[l.pixels(0)].fill(7);
        buf[l.pixels(1)].fill(9);
        let u = Update::parse(&buf).unwrap();
        assert!(u.header.keyframe());
        assert_eq!(u.rects[0].rect, rects[0]);
        assert_eq!(u.rects[1].pixels, [9; 8]);
        assert_eq!(
            l.write_headers(&mut [0u8; 3]).unwrap_err().to_string(),
            "display record: buffer of 3 bytes for an update of 52"
        );
        let e = UpdateLayout::new(header(4, 3, 0), vec![Rect::new(4, 0, 1, 1)]).unwrap_err();
        assert!(matches!(e, DisplayFrameError::OutOfBounds { index: 0, .. }));
        let e = UpdateLayout::new(header(4, 3, 0x10), vec![]).unwrap_err();
        assert_eq!(e, DisplayFrameError::Flags(0x10));
    }

    #[test]
    fn framebuffer_applies_resizes_and_extracts() {
        let mut fb = Framebuffer::new(4, 3, PixelFormat::Bgrx32);
        let px: Vec<u8> = (0..16).collect();
        let u = Update {
            header: header(4, 3, 0),
            rects: vec![RectPixels {
                rect: Rect::new(2, 1, 2, 2),
                encoding: Encoding::Raw,
                pixels: &px,
            }],
        };
        assert_eq!(fb.apply(&u), Ok(false));
        assert_eq!(fb.rect_pixels(Rect::new(2, 1, 2, 2)).unwrap(), px);
        assert_eq!(fb.rect_pixels(Rect::new(0, 0, 1, 1)).unwrap(), [0; 4]);
        assert_eq!(&fb.pixels()[16 + 8..16 + 16], &px[..8]);
        assert_eq!(fb.rect_pixels(Rect::new(3, 0, 2, 1)), None);
        // A new size clears.
        let u2 = Update {
            header: header(2, 2, 0),
            rects: vec![],
        };
        assert_eq!(fb.apply(&u2), Ok(true));
        assert_eq!((fb.width(), fb.height(), fb.stride()), (2, 2, 8));
        assert_eq!(fb.pixels(), [0; 16]);
        // Out-of-bounds and short rects are refused, the framebuffer is unchanged.
        let bad = Update {
            header: header(2, 2, 0),
            rects: vec![RectPixels {
                rect: Rect::new(1, 1, 2, 1),
                encoding: Encoding::Raw,
                pixels: &px[..8],
            }],
        };
        assert!(matches!(
            fb.apply(&bad),
            Err(DisplayFrameError::OutOfBounds { .. })
        ));
        let short = Update {
            header: header(2, 2, 0),
            rects: vec![RectPixels {
                rect: Rect::new(0, 0, 2, 1),
                encoding: Encoding::Raw,
                pixels: &px[..4],
            }],
        };
        assert!(matches!(
            fb.apply(&short),
            Err(DisplayFrameError::Pixels {
                need: 8,
                got: 4,
                ..
            })
        ));
        assert_eq!(fb.pixels(), [0; 16]);
    }

    #[test]
    fn rect_geometry() {
        let a = Rect::new(10, 10, 10, 10);
        assert_eq!(a.union(&Rect::new(0, 30, 5, 5)), Rect::new(0, 10, 20, 25));
        assert_eq!(
            a.intersection(&Rect::new(15, 0, 100, 12)),
            Some(Rect::new(15, 10, 5, 2))
        );
        assert_eq!(a.intersection(&Rect::new(20, 10, 1, 1)), None);
        assert_eq!(
            Rect::new(600, 470, 100, 100).clip(640, 480),
            Some(Rect::new(600, 470, 40, 10))
        );
        assert_eq!(Rect::new(640, 0, 1, 1).clip(640, 480), None);
        assert_eq!(
            Rect::from_signed(-5, -5, 10, 10, 640, 480),
            Some(Rect::new(0, 0, 5, 5))
        );
        assert_eq!(Rect::from_signed(-50, 0, 10, 10, 640, 480), None);
        assert_eq!(
            Rect::new(u16::MAX, u16::MAX, u16::MAX, u16::MAX).union(&Rect::new(0, 0, 1, 1)),
            Rect::new(0, 0, u16::MAX, u16::MAX)
        );
        assert_eq!(a.to_string(), "10x10+10+10");
    }

    #[test]
    fn coalesce_merges_nearby_clips_and_caps() {
        // Overlapping and adjacent glyph-sized rects of one text line become one.
        let line: Vec<Rect> = (0..20).map(|i| Rect::new(10 + i * 8, 100, 8, 13)).collect();
        assert_eq!(
            coalesce(&line, 640, 480, 16),
            vec![Rect::new(10, 100, 160, 13)]
        );
        // Far apart rects stay apart.
        let far = [Rect::new(0, 0, 10, 10), Rect::new(500, 400, 10, 10)];
        assert_eq!(coalesce(&far, 640, 480, 16), far.to_vec());
        // Clipped to the screen; empty ones dropped.
        assert_eq!(
            coalesce(
                &[
                    Rect::new(630, 470, 50, 50),
                    Rect::new(700, 0, 5, 5),
                    Rect::new(0, 0, 0, 9)
                ],
                640,
                480,
                16
            ),
            vec![Rect::new(630, 470, 10, 10)]
        );
        // Over the cap: the cheapest pairs merge first.
        let four = [
            Rect::new(0, 0, 10, 10),
            Rect::new(0, 200, 10, 10),
            Rect::new(600, 0, 10, 10),
            Rect::new(600, 200, 10, 10),
        ];
        let two = coalesce(&four, 640, 480, 2);
        assert_eq!(
            two,
            vec![Rect::new(0, 0, 10, 210), Rect::new(600, 0, 10, 210)]
        );
        assert_eq!(
            coalesce(&four, 640, 480, 1),
            vec![Rect::new(0, 0, 610, 210)]
        );
        assert_eq!(
            coalesce(&four, 640, 480, 0),
            vec![Rect::new(0, 0, 610, 210)]
        );
        assert_eq!(coalesce(&[], 640, 480, 4), vec![]);
        // Very many rects: their bounding box.
        let many: Vec<Rect> = (0..2000)
            .map(|i| Rect::new((i % 40) * 16, (i / 40) * 9, 1, 1))
            .collect();
        assert_eq!(
            coalesce(&many, 640, 480, 16),
            vec![Rect::new(0, 0, 625, 442)]
        );
    }

    #[test]
    fn frames_are_planned_under_the_payload_limit() {
        let screen = Rect::new(0, 0, 1920, 1080);
        let frames = plan_frames(&[screen], PixelFormat::Bgrx32, MAX_UPDATE_PAYLOAD);
        assert_eq!(frames.len(), 2);
        let rows: u32 = frames.iter().flatten().map(|r| u32::from(r.h)).sum();
        assert_eq!(rows, 1080);
        for f in &frames {
            let l = UpdateLayout::new(header(1920, 1080, 0), f.clone()).unwrap();
            assert!(l.len() <= MAX_UPDATE_PAYLOAD, "{}", l.len());
        }
        // Small rects share a frame.
        let small = [Rect::new(0, 0, 10, 10), Rect::new(20, 20, 5, 5)];
        assert_eq!(
            plan_frames(&small, PixelFormat::Bgrx32, 1 << 20),
            vec![small.to_vec()]
        );
        // A tiny limit still makes progress: one row per band.
        let f = plan_frames(&[Rect::new(0, 0, 3, 2)], PixelFormat::Bgrx32, 1);
        assert_eq!(
            f,
            vec![vec![Rect::new(0, 0, 3, 1)], vec![Rect::new(0, 1, 3, 1)]]
        );
        assert_eq!(bands(Rect::new(5, 65530, 1, 5), 4, 8).count(), 3);
    }

    fn arb_update() -> impl Strategy<Value = (UpdateHeader, Vec<(Rect, Vec<u8>)>)> {
        (1u16..64, 1u16..64, 0u8..4).prop_flat_map(|(width, height, flags)| {
            let rect = (0..width, 0..height).prop_flat_map(move |(x, y)| {
                (1..=width - x, 1..=height - y).prop_flat_map(move |(w, h)| {
                    proptest::collection::vec(any::<u8>(), usize::from(w) * usize::from(h) * 4)
                        .prop_map(move |px| (Rect::new(x, y, w, h), px))
                })
            });
            proptest::collection::vec(rect, 0..4)
                .prop_map(move |rects| (header(width, height, flags), rects))
        })
    }

    proptest! {
        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Update::parse(&bytes);
        }

        #[test]
        fn parse_never_panics_on_plausible_headers(
            body in proptest::collection::vec(any::<u8>(), 0..200),
            count in 0u16..8,
            w in 0u16..16,
            h in 0u16..16,
        ) {
            let mut p = vec![VERSION, KIND_UPDATE];
            p.extend_from_slice(&w.to_be_bytes());
            p.extend_from_slice(&h.to_be_bytes());
            p.extend_from_slice(&[0, 0]);
            p.extend_from_slice(&count.to_be_bytes());
            p.extend_from_slice(&body);
            if let Ok(u) = Update::parse(&p) {
                let mut fb = Framebuffer::default();
                fb.apply(&u).unwrap();
                prop_assert_eq!(u.emit().unwrap(), p);
            }
        }

        #[test]
        fn emit_parse_round_trips((h, rects) in arb_update()) {
            let u = Update {
                header: h,
                rects: rects.iter().map(|(r, px)| RectPixels { rect: *r, encoding: Encoding::Raw, pixels: px }).collect(),
            };
            let bytes = u.emit().unwrap();
            prop_assert_eq!(bytes.len(), u.buffer_len());
            let back = Update::parse(&bytes).unwrap();
            prop_assert_eq!(&back, &u);
            // Applying it to a framebuffer shows each rect's pixels where nothing later
            // overwrote them (the last rect always).
            let mut fb = Framebuffer::default();
            fb.apply(&back).unwrap();
            if let Some((r, px)) = rects.last() {
                prop_assert_eq!(&fb.rect_pixels(*r).unwrap(), px);
            }
        }

        #[test]
        fn coalesce_covers_every_damaged_pixel(
            damage in proptest::collection::vec((0u16..80, 0u16..60, 0u16..40, 0u16..40), 0..12),
            max in 0usize..6,
        ) {
            let damage: Vec<Rect> = damage.into_iter().map(|(x, y, w, h)| Rect::new(x, y, w, h)).collect();
            let out = coalesce(&damage, 64, 48, max);
            prop_assert!(out.len() <= max.max(1));
            for r in &out {
                prop_assert!(r.fits(64, 48) && !r.is_empty());
            }
            for d in damage.iter().filter_map(|d| d.clip(64, 48)) {
                for y in d.y..d.y + d.h {
                    for x in d.x..d.x + d.w {
                        prop_assert!(out.iter().any(|r| r.x <= x && x < r.x + r.w && r.y <= y && y < r.y + r.h));
                    }
                }
            }
        }

        #[test]
        fn planned_frames_cover_the_rects(
            rects in proptest::collection::vec((0u16..100, 0u16..100, 1u16..100, 1u16..100), 0..6),
            max in 1usize..20_000,
        ) {
            let rects: Vec<Rect> = rects.into_iter().map(|(x, y, w, h)| Rect::new(x, y, w, h)).collect();
            let frames = plan_frames(&rects, PixelFormat::Bgrx32, max);
            let area: u64 = frames.iter().flatten().map(Rect::area).sum();
            prop_assert_eq!(area, rects.iter().map(Rect::area).sum::<u64>());
            for f in &frames {
                prop_assert!(!f.is_empty());
                let l = UpdateLayout::new(header(200, 200, 0), f.clone()).unwrap();
                // Over the limit only when a single row is larger than it.
                prop_assert!(l.len() <= max || f.len() == 1 && f[0].h == 1);
            }
        }
    }

    #[test]
    fn cursor_records_round_trip_and_refuse_bad_ones() {
        let c = Cursor {
            width: 2,
            height: 1,
            xhot: 1,
            yhot: 0,
            pixels: vec![1, 2, 3, 255, 0, 0, 0, 0],
        };
        let bytes = c.emit().unwrap();
        assert_eq!(
            bytes,
            [1, 1, 0, 2, 0, 1, 0, 1, 0, 0, 1, 2, 3, 255, 0, 0, 0, 0]
        );
        assert_eq!(Cursor::parse(&bytes).unwrap(), c);
        let err = |b: &[u8]| Cursor::parse(b).unwrap_err().to_string();
        assert_eq!(
            err(&bytes[..bytes.len() - 1]),
            "display record: cursor: 2x1 needs 8 pixel bytes, the record has 7"
        );
        assert_eq!(
            err(&[1, 1, 0, 0, 0, 1, 0, 0, 0, 0]),
            "display record: cursor: size 0x1 outside 1..=256"
        );
        assert_eq!(
            err(&[1, 1, 0, 1, 0, 1, 0, 9, 0, 0, 0, 0, 0, 0]),
            "display record: cursor: hot spot (9, 0) outside the 1x1 image"
        );
        assert_eq!(
            err(&[1, 1, 0, 1]),
            "display record: cursor: 4 bytes, shorter than the 10-byte header"
        );
        assert_eq!(
            err(&[1, 0, 0, 1]),
            "display record: cursor: kind 0x00 is not a cursor record (0x01)"
        );
        assert!(Update::parse(&bytes).is_err(), "a cursor is not an update");
    }
}

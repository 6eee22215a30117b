//! The `image` pair's frame and control formats. All integers big-endian.
//!
//! A frame:
//!
//! | bytes | field |
//! |---|---|
//! | 1 | version, `3` |
//! | 2, 2 | screen width, height |
//! | 1 | display flags (keyframe, more), as in the display record, and [`FLAG_REPEAT`] |
//! | 2 | rect count |
//! | 4 | credit number of this frame (counts up from 1) |
//! | 4 | `raw_len`: bytes the zstd block decompresses to |
//! | 4 | `blob_len`: bytes of the zstd block (after the rects) |
//!
//! then per rect: x, y, w, h (u16 each), kind (u8) and its fields:
//!
//! | kind | fields | in the zstd block |
//! |---|---|---|
//! | `0` lossless | — | `w*h*3` bytes B, G, R |
//! | `1` solid | B, G, R | — |
//! | `2` palette | colours − 1 (u8), then colours × B, G, R | `h` rows of packed indices |
//! | `3` jpeg | length u32, JPEG data | — |
//! | `4` h264 | length u32, one H.264 access unit (Annex B) of the video region | — |
//!
//! An `h264` rect is the video region, or one of its stripes: a region of 3 Mpixel or more
//! (1440p and up) comes as two `h264` rects, its top and bottom, at most two in a frame,
//! never overlapping. Each rect's access units form one H.264 stream for as long as it keeps
//! its place and size (a new region starts with an IDR in each).
//!
//! then the zstd block: one flushed chunk of a zstd stream that runs for the life of the pair
//! (its window spans earlier frames), holding the rects' block data in rect order.
//!
//! Palette indices are numbered in ascending colour order (B | G << 8 | R << 16) and packed
//! 1 bit for 2 colours, 2 bits for up to 4, 4 bits for up to 16, else a byte; most
//! significant bits first, each row starting on a byte (its last byte padded with zeros).
//!
//! Control, inverse → forward: `0x01` + u32, "decoded every frame up to this credit number".

use super::PAIR;
use ndd_core::FrameError;
use ndd_wire::display::Rect;

/// Frame flag beside the display flags (never in a display record): a broadcast keyframe made
/// from the forward half's screen copy when its keyframe was due and no capture came, the
/// picture of the frame before it. An app side that decoded that frame shows it already (its
/// inverse decodes this one, to stay in step, and hands on nothing); one that starts here
/// shows it. Without it, a source a little late for the keyframe's time made every app side
/// show the same picture twice (seen under load: a 30 fps screen's picture written twice to
/// a `y4m` sink).
pub const FLAG_REPEAT: u8 = 0x80;

/// Version byte (3: the `h264` kind).
pub const VERSION: u8 = 3;
/// Frame header bytes.
pub const HEADER_LEN: usize = 20;
/// Rect header bytes (x, y, w, h, kind).
pub const RECT_HEADER_LEN: usize = 9;
/// Control message type: credit.
pub const CTRL_CREDIT: u8 = 0x01;
/// Credit message length.
pub const CREDIT_LEN: usize = 5;

/// How a rect's pixels travel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind<'a> {
    /// BGR bytes in the zstd block.
    Lossless,
    /// One colour, B, G, R.
    Solid([u8; 3]),
    /// Colours (B, G, R each); index bytes in the zstd block.
    Palette(&'a [u8]),
    /// A JPEG image of the rect.
    Jpeg(&'a [u8]),
    /// An H.264 access unit of the video region.
    H264(&'a [u8]),
}

impl Kind<'_> {
    /// The kind byte.
    pub fn byte(&self) -> u8 {
        match self {
            Kind::Lossless => 0,
            Kind::Solid(_) => 1,
            Kind::Palette(_) => 2,
            Kind::Jpeg(_) => 3,
            Kind::H264(_) => 4,
        }
    }

    /// Bytes this rect takes in the zstd block.
    pub fn block_len(&self, r: Rect) -> usize {
        let px = usize::from(r.w) * usize::from(r.h);
        match self {
            Kind::Lossless => px * 3,
            Kind::Palette(p) => {
                let bits = index_bits(p.len() / 3);
                index_row_len(r.w, bits) * usize::from(r.h)
            }
            Kind::Solid(_) | Kind::Jpeg(_) | Kind::H264(_) => 0,
        }
    }

    /// Bytes of this rect's fields after its header.
    fn fields_len(&self) -> usize {
        match self {
            Kind::Lossless => 0,
            Kind::Solid(_) => 3,
            Kind::Palette(p) => 1 + p.len(),
            Kind::Jpeg(j) | Kind::H264(j) => 4 + j.len(),
        }
    }
}

/// A frame's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Screen size.
    pub width: u16,
    /// Screen size.
    pub height: u16,
    /// Display record flags.
    pub flags: u8,
    /// Credit number.
    pub credit: u32,
    /// Decompressed zstd block length.
    pub raw_len: u32,
    /// Compressed zstd block length.
    pub blob_len: u32,
}

/// A parsed frame, borrowing from the payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed<'a> {
    /// The header.
    pub header: Header,
    /// Rects with their kinds.
    pub rects: Vec<(Rect, Kind<'a>)>,
    /// The zstd block.
    pub blob: &'a [u8],
}

/// Writes a frame into `out` (cleared first).
pub fn emit(header: &Header, rects: &[(Rect, Kind<'_>)], blob: &[u8], out: &mut Vec<u8>) {
    out.clear();
    out.push(VERSION);
    out.extend_from_slice(&header.width.to_be_bytes());
    out.extend_from_slice(&header.height.to_be_bytes());
    out.push(header.flags);
    out.extend_from_slice(&(rects.len() as u16).to_be_bytes());
    out.extend_from_slice(&header.credit.to_be_bytes());
    out.extend_from_slice(&header.raw_len.to_be_bytes());
    out.extend_from_slice(&(blob.len() as u32).to_be_bytes());
    for (r, k) in rects {
        for v in [r.x, r.y, r.w, r.h] {
            out.extend_from_slice(&v.to_be_bytes());
        }
        out.push(k.byte());
        match k {
            Kind::Lossless => {}
            Kind::Solid(c) => out.extend_from_slice(c),
            Kind::Palette(p) => {
                out.push((p.len() / 3 - 1) as u8);
                out.extend_from_slice(p);
            }
            Kind::Jpeg(j) | Kind::H264(j) => {
                out.extend_from_slice(&(j.len() as u32).to_be_bytes());
                out.extend_from_slice(j);
            }
        }
    }
    out.extend_from_slice(blob);
}

/// Bytes [`emit`] writes.
pub fn emitted_len(rects: &[(Rect, Kind<'_>)], blob: usize) -> usize {
    HEADER_LEN
        + rects
            .iter()
            .map(|(_, k)| RECT_HEADER_LEN + k.fields_len())
            .sum::<usize>()
        + blob
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn invalid(rule: &'static str) -> FrameError {
    FrameError::Invalid { pair: PAIR, rule }
}

/// Parses a frame: the header, every rect inside the screen and non-empty, every field inside
/// the payload, `raw_len` equal to what the rects need, and nothing after the block.
pub fn parse(p: &[u8]) -> Result<Parsed<'_>, FrameError> {
    if p.is_empty() {
        return Err(FrameError::Empty {
            pair: PAIR,
            missing: "version byte",
        });
    }
    if p[0] != VERSION {
        return Err(FrameError::UnknownValue {
            pair: PAIR,
            field: "version",
            value: u64::from(p[0]),
        });
    }
    if p.len() < HEADER_LEN {
        return Err(FrameError::ShortHeader {
            pair: PAIR,
            len: p.len(),
            need: HEADER_LEN,
            header: "frame",
        });
    }
    let header = Header {
        width: be16(p, 1),
        height: be16(p, 3),
        flags: p[5],
        credit: be32(p, 8),
        raw_len: be32(p, 12),
        blob_len: be32(p, 16),
    };
    if header.width == 0 || header.height == 0 {
        return Err(invalid("empty screen"));
    }
    let count = usize::from(be16(p, 6));
    if count * RECT_HEADER_LEN > p.len() - HEADER_LEN {
        return Err(FrameError::DoesNotFit {
            pair: PAIR,
            field: "rect count",
            value: count as u64,
            len: p.len(),
        });
    }
    let mut rects = Vec::with_capacity(count);
    let mut pos = HEADER_LEN;
    let mut raw = 0usize;
    let trunc = |field| FrameError::Truncated { pair: PAIR, field };
    for _ in 0..count {
        if pos + RECT_HEADER_LEN > p.len() {
            return Err(trunc("rect header"));
        }
        let r = Rect::new(
            be16(p, pos),
            be16(p, pos + 2),
            be16(p, pos + 4),
            be16(p, pos + 6),
        );
        let kind = p[pos + 8];
        pos += RECT_HEADER_LEN;
        if r.is_empty() {
            return Err(invalid("empty rect"));
        }
        if !r.fits(header.width, header.height) {
            return Err(invalid("rect outside the screen"));
        }
        let k = match kind {
            0 => Kind::Lossless,
            1 => {
                let c = p.get(pos..pos + 3).ok_or(trunc("solid colour"))?;
                pos += 3;
                Kind::Solid([c[0], c[1], c[2]])
            }
            2 => {
                let n = usize::from(*p.get(pos).ok_or(trunc("palette size"))?) + 1;
                let pal = p.get(pos + 1..pos + 1 + n * 3).ok_or(trunc("palette"))?;
                pos += 1 + n * 3;
                Kind::Palette(pal)
            }
            3 => {
                let len = p.get(pos..pos + 4).ok_or(trunc("jpeg length"))?;
                let len = be32(len, 0) as usize;
                let j = p
                    .get(pos + 4..)
                    .and_then(|rest| rest.get(..len))
                    .ok_or(trunc("jpeg data"))?;
                pos += 4 + len;
                Kind::Jpeg(j)
            }
            4 => {
                let len = p.get(pos..pos + 4).ok_or(trunc("h264 length"))?;
                let len = be32(len, 0) as usize;
                let j = p
                    .get(pos + 4..)
                    .and_then(|rest| rest.get(..len))
                    .ok_or(trunc("h264 data"))?;
                pos += 4 + len;
                Kind::H264(j)
            }
            other => {
                return Err(FrameError::UnknownValue {
                    pair: PAIR,
                    field: "rect kind",
                    value: u64::from(other),
                })
            }
        };
        raw += k.block_len(r);
        rects.push((r, k));
    }
    if raw != header.raw_len as usize {
        return Err(invalid("raw_len differs from what the rects need"));
    }
    let blob = p
        .get(pos..)
        .and_then(|rest| rest.get(..header.blob_len as usize))
        .ok_or(trunc("zstd block"))?;
    if pos + blob.len() != p.len() {
        return Err(invalid("bytes after the zstd block"));
    }
    if (raw == 0) != blob.is_empty() {
        return Err(invalid("zstd block present without data, or missing"));
    }
    Ok(Parsed {
        header,
        rects,
        blob,
    })
}

/// Bits per palette index for `colours` colours: 1, 2, 4 or 8 (as Tight's mono and indexed
/// rects, with two steps between).
pub(crate) fn index_bits(colours: usize) -> u32 {
    match colours {
        0..=2 => 1,
        3..=4 => 2,
        5..=16 => 4,
        _ => 8,
    }
}

/// Bytes of one packed index row `w` pixels wide (each row starts on a byte).
pub(crate) fn index_row_len(w: u16, bits: u32) -> usize {
    (usize::from(w) * bits as usize).div_ceil(8)
}

//! RFB wire constants and small fixed-size records (pixel format, requests).
//! Pure functions over byte slices; no I/O. After a length check no getter panics.

use crate::ParseError;

/// Message types sent by the server.
pub mod server_msg {
    pub const FRAMEBUFFER_UPDATE: u8 = 0;
    pub const SET_COLOUR_MAP_ENTRIES: u8 = 1;
    pub const BELL: u8 = 2;
    pub const SERVER_CUT_TEXT: u8 = 3;
    pub const END_OF_CONTINUOUS_UPDATES: u8 = 150;
    pub const FENCE: u8 = 248;
}

/// Message types sent by the client.
pub mod client_msg {
    pub const SET_PIXEL_FORMAT: u8 = 0;
    pub const SET_ENCODINGS: u8 = 2;
    pub const FRAMEBUFFER_UPDATE_REQUEST: u8 = 3;
    pub const KEY_EVENT: u8 = 4;
    pub const POINTER_EVENT: u8 = 5;
    pub const CLIENT_CUT_TEXT: u8 = 6;
    pub const ENABLE_CONTINUOUS_UPDATES: u8 = 150;
    pub const FENCE: u8 = 248;
    pub const SET_DESKTOP_SIZE: u8 = 251;
    pub const QEMU: u8 = 255;
}

/// Encodings and pseudo-encodings the accelerator can delimit.
pub mod enc {
    pub const RAW: i32 = 0;
    pub const COPY_RECT: i32 = 1;
    pub const RRE: i32 = 2;
    pub const HEXTILE: i32 = 5;
    pub const TIGHT: i32 = 7;
    pub const ZRLE: i32 = 16;
    pub const DESKTOP_SIZE: i32 = -223;
    pub const LAST_RECT: i32 = -224;
    pub const POINTER_POS: i32 = -232;
    pub const CURSOR: i32 = -239;
    pub const X_CURSOR: i32 = -240;
    pub const QEMU_EXTENDED_KEY: i32 = -258;
    pub const LED_STATE: i32 = -261;
    pub const DESKTOP_NAME: i32 = -307;
    pub const EXTENDED_DESKTOP_SIZE: i32 = -308;
    pub const FENCE: i32 = -312;
    pub const CONTINUOUS_UPDATES: i32 = -313;
    /// Extended clipboard (cut text with a negative length carries a structured payload).
    pub const EXTENDED_CLIPBOARD: i32 = 0xC0A1_E5CE_u32 as i32;
}

/// True if the accelerator can delimit (or the encoding carries no rectangle data at all:
/// quality and compression hints), so it may stay in the client's SetEncodings.
pub fn encoding_supported(e: i32) -> bool {
    use enc::*;
    matches!(
        e,
        RAW | COPY_RECT
            | RRE
            | HEXTILE
            | TIGHT
            | ZRLE
            | DESKTOP_SIZE
            | LAST_RECT
            | POINTER_POS
            | CURSOR
            | X_CURSOR
            | QEMU_EXTENDED_KEY
            | LED_STATE
            | DESKTOP_NAME
            | EXTENDED_DESKTOP_SIZE
            | FENCE
            | CONTINUOUS_UPDATES
            | EXTENDED_CLIPBOARD
    ) || (-32..=-23).contains(&e)     // JPEG quality level
        || (-256..=-247).contains(&e) // compression level
        || (-512..=-412).contains(&e) // TigerVNC fine quality level
        || (-768..=-763).contains(&e) // TigerVNC JPEG subsampling
}

/// The 16-byte PIXEL_FORMAT record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PixelFormat {
    pub bits_per_pixel: u8,
    pub depth: u8,
    pub big_endian: bool,
    pub true_colour: bool,
    pub red_max: u16,
    pub green_max: u16,
    pub blue_max: u16,
    pub red_shift: u8,
    pub green_shift: u8,
    pub blue_shift: u8,
}

impl Default for PixelFormat {
    /// 32 bits per pixel, depth 24, little-endian, true colour (what TigerVNC uses).
    fn default() -> Self {
        PixelFormat {
            bits_per_pixel: 32,
            depth: 24,
            big_endian: false,
            true_colour: true,
            red_max: 255,
            green_max: 255,
            blue_max: 255,
            red_shift: 16,
            green_shift: 8,
            blue_shift: 0,
        }
    }
}

impl PixelFormat {
    pub const LEN: usize = 16;

    /// Parse and validate (bits per pixel must be 8, 16 or 32).
    pub fn parse(b: &[u8]) -> Result<PixelFormat, ParseError> {
        if b.len() < Self::LEN {
            return Err(ParseError::Truncated);
        }
        let pf = PixelFormat {
            bits_per_pixel: b[0],
            depth: b[1],
            big_endian: b[2] != 0,
            true_colour: b[3] != 0,
            red_max: u16::from_be_bytes([b[4], b[5]]),
            green_max: u16::from_be_bytes([b[6], b[7]]),
            blue_max: u16::from_be_bytes([b[8], b[9]]),
            red_shift: b[10],
            green_shift: b[11],
            blue_shift: b[12],
        };
        if !matches!(pf.bits_per_pixel, 8 | 16 | 32) {
            return Err(ParseError::BadPixelFormat(pf.bits_per_pixel));
        }
        Ok(pf)
    }

    pub fn emit(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0] = self.bits_per_pixel;
        b[1] = self.depth;
        b[2] = self.big_endian as u8;
        b[3] = self.true_colour as u8;
        b[4..6].copy_from_slice(&self.red_max.to_be_bytes());
        b[6..8].copy_from_slice(&self.green_max.to_be_bytes());
        b[8..10].copy_from_slice(&self.blue_max.to_be_bytes());
        b[10] = self.red_shift;
        b[11] = self.green_shift;
        b[12] = self.blue_shift;
        b
    }

    /// Bytes per pixel.
    pub fn bpp(&self) -> u64 {
        u64::from(self.bits_per_pixel / 8)
    }

    /// Bytes per Tight TPIXEL: 3 for 32-bit depth-24 true colour with 8-bit channels.
    pub fn tpixel(&self) -> u64 {
        if self.true_colour
            && self.bits_per_pixel == 32
            && self.depth == 24
            && self.red_max == 255
            && self.green_max == 255
            && self.blue_max == 255
        {
            3
        } else {
            self.bpp()
        }
    }
}

/// A FramebufferUpdateRequest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpdateRequest {
    pub incremental: bool,
    pub x: u16,
    pub y: u16,
    pub w: u16,
    pub h: u16,
}

impl UpdateRequest {
    pub const LEN: usize = 10;

    pub fn emit(&self) -> [u8; 10] {
        let mut b = [0u8; 10];
        b[0] = client_msg::FRAMEBUFFER_UPDATE_REQUEST;
        b[1] = self.incremental as u8;
        b[2..4].copy_from_slice(&self.x.to_be_bytes());
        b[4..6].copy_from_slice(&self.y.to_be_bytes());
        b[6..8].copy_from_slice(&self.w.to_be_bytes());
        b[8..10].copy_from_slice(&self.h.to_be_bytes());
        b
    }
}

pub(crate) fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

pub(crate) fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Length of a cut-text payload: a negative length is the extended-clipboard form,
/// whose payload is `-len` bytes.
pub(crate) fn cut_text_len(raw: u32) -> u64 {
    u64::from((raw as i32).unsigned_abs())
}

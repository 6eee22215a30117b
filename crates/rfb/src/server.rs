//! Sans-IO delimiter for the server-to-client message stream (after ServerInit).
//!
//! [`ServerStream::feed`] takes any slice of the stream and reports the absolute stream offset at
//! which each message (and each framebuffer update) starts and ends. It never buffers payload:
//! it keeps at most a small header (≤ 16 bytes) and a count of payload bytes still to skip, so
//! the proxy can forward bytes to the client as soon as they arrive. Splitting the input at any
//! point gives the same events. Bad input gives a [`ParseError`] and never panics.

use crate::proto::{be16, be32, cut_text_len, enc, server_msg, PixelFormat};
use crate::ParseError;

/// What ended (or started) at a given offset of the server stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerEvent {
    /// A FramebufferUpdate header was read; `rects` is the announced count
    /// (`None` for 0xFFFF, which means "until LastRect").
    UpdateStart {
        rects: Option<u16>,
    },
    /// A FramebufferUpdate is complete.
    UpdateEnd,
    ColourMap,
    Bell,
    CutText,
    EndOfContinuousUpdates,
    Fence,
}

/// An event and the absolute stream offset just after the byte that completed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Boundary {
    pub offset: u64,
    pub event: ServerEvent,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Between messages: want the type byte.
    MsgType,
    FbuHeader,
    RectHeader,
    /// A rectangle's data is done (zero-length state).
    RectDone,
    /// A non-update message is done (zero-length state).
    MsgDone(ServerEvent),
    ColourMapHeader,
    CutTextHeader,
    FenceHeader,
    RreHeader,
    ZrleLen,
    DesktopNameLen,
    ExtDesktopSizeHeader,
    HextileSubenc {
        tile: u32,
    },
    HextileTileHeader {
        tile: u32,
        subenc: u8,
    },
    /// Tight: the compression-control byte.
    TightCtl,
    TightFilter,
    TightPaletteSize,
    /// Tight: uncompressed size known; raw if < 12 bytes, otherwise a compact length follows.
    TightData {
        size: u64,
    },
    /// Tight compact length, `len` so far, `i` bytes read.
    TightLen {
        len: u64,
        i: u8,
    },
}

/// Rectangle in progress.
#[derive(Debug, Clone, Copy, Default)]
struct Rect {
    w: u64,
    h: u64,
}

/// The server-stream delimiter. See the module docs.
#[derive(Debug, Clone)]
pub struct ServerStream {
    pf: PixelFormat,
    state: State,
    hdr: [u8; 16],
    have: usize,
    skip: u64,
    offset: u64,
    rects_left: Option<u16>,
    rect: Rect,
    updates: u64,
    in_update: bool,
}

const TIGHT_MIN_TO_COMPRESS: u64 = 12;

impl ServerStream {
    pub fn new(pf: PixelFormat) -> Self {
        ServerStream {
            pf,
            state: State::MsgType,
            hdr: [0; 16],
            have: 0,
            skip: 0,
            offset: 0,
            rects_left: None,
            rect: Rect::default(),
            updates: 0,
            in_update: false,
        }
    }

    /// The pixel format used to delimit pixel data from now on.
    pub fn set_pixel_format(&mut self, pf: PixelFormat) {
        self.pf = pf;
    }

    pub fn pixel_format(&self) -> PixelFormat {
        self.pf
    }

    /// True between messages (no message, and no update, partially received).
    pub fn is_idle(&self) -> bool {
        self.state == State::MsgType && self.have == 0 && self.skip == 0
    }

    /// True while a FramebufferUpdate has started but not ended.
    pub fn in_update(&self) -> bool {
        self.in_update
    }

    /// Total bytes fed so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Complete framebuffer updates seen so far.
    pub fn updates(&self) -> u64 {
        self.updates
    }

    /// Header bytes the current state needs before it can decide.
    fn want(&self) -> usize {
        match self.state {
            State::MsgType => 1,
            State::FbuHeader => 3,
            State::RectHeader => 12,
            State::RectDone | State::MsgDone(_) | State::TightData { .. } => 0,
            State::ColourMapHeader => 5,
            State::CutTextHeader => 7,
            State::FenceHeader => 8,
            State::RreHeader => 4 + self.pf.bpp() as usize,
            State::ZrleLen | State::DesktopNameLen | State::ExtDesktopSizeHeader => 4,
            State::HextileSubenc { .. } => 1,
            State::HextileTileHeader { subenc, .. } => {
                let bpp = self.pf.bpp() as usize;
                (if subenc & 2 != 0 { bpp } else { 0 })
                    + (if subenc & 4 != 0 { bpp } else { 0 })
                    + (if subenc & 8 != 0 { 1 } else { 0 })
            }
            State::TightCtl | State::TightFilter | State::TightPaletteSize => 1,
            State::TightLen { .. } => 1,
        }
    }

    /// Feed the next bytes of the stream; events are appended to `out`.
    /// After an error the stream is unusable (the session must close).
    pub fn feed(&mut self, data: &[u8], out: &mut Vec<Boundary>) -> Result<(), ParseError> {
        let mut pos = 0usize;
        loop {
            if self.skip > 0 {
                if pos == data.len() {
                    break;
                }
                let n = (data.len() - pos).min(usize::try_from(self.skip).unwrap_or(usize::MAX));
                pos += n;
                self.offset += n as u64;
                self.skip -= n as u64;
                continue;
            }
            let want = self.want();
            if self.have < want {
                if pos == data.len() {
                    break;
                }
                let n = (want - self.have).min(data.len() - pos);
                self.hdr[self.have..self.have + n].copy_from_slice(&data[pos..pos + n]);
                self.have += n;
                pos += n;
                self.offset += n as u64;
                continue;
            }
            self.step(out)?;
            self.have = 0;
        }
        Ok(())
    }

    fn end_rect_data(&mut self, len: u64) {
        self.skip = len;
        self.state = State::RectDone;
    }

    fn step(&mut self, out: &mut Vec<Boundary>) -> Result<(), ParseError> {
        let h = self.hdr;
        let bpp = self.pf.bpp();
        match self.state {
            State::MsgType => {
                self.state = match h[0] {
                    server_msg::FRAMEBUFFER_UPDATE => State::FbuHeader,
                    server_msg::SET_COLOUR_MAP_ENTRIES => State::ColourMapHeader,
                    server_msg::BELL => State::MsgDone(ServerEvent::Bell),
                    server_msg::SERVER_CUT_TEXT => State::CutTextHeader,
                    server_msg::END_OF_CONTINUOUS_UPDATES => {
                        State::MsgDone(ServerEvent::EndOfContinuousUpdates)
                    }
                    server_msg::FENCE => State::FenceHeader,
                    t => return Err(ParseError::UnknownServerMessage(t)),
                }
            }
            State::MsgDone(ev) => {
                out.push(Boundary {
                    offset: self.offset,
                    event: ev,
                });
                self.state = State::MsgType;
            }
            State::ColourMapHeader => {
                self.skip = 6 * u64::from(be16(&h, 3));
                self.state = State::MsgDone(ServerEvent::ColourMap);
            }
            State::CutTextHeader => {
                self.skip = cut_text_len(be32(&h, 3));
                self.state = State::MsgDone(ServerEvent::CutText);
            }
            State::FenceHeader => {
                let len = h[7];
                if len > 64 {
                    return Err(ParseError::FenceTooLong(len));
                }
                self.skip = u64::from(len);
                self.state = State::MsgDone(ServerEvent::Fence);
            }
            State::FbuHeader => {
                let n = be16(&h, 1);
                let rects = if n == 0xFFFF { None } else { Some(n) };
                out.push(Boundary {
                    offset: self.offset,
                    event: ServerEvent::UpdateStart { rects },
                });
                self.rects_left = rects;
                self.in_update = true;
                // Count 0 ends at once (zero-length RectDone with nothing left).
                self.state = match rects {
                    Some(0) => {
                        self.rects_left = Some(1);
                        State::RectDone
                    }
                    _ => State::RectHeader,
                };
            }
            State::RectDone => match self.rects_left {
                Some(n) if n <= 1 => self.end_update(out),
                Some(n) => {
                    self.rects_left = Some(n - 1);
                    self.state = State::RectHeader;
                }
                None => self.state = State::RectHeader,
            },
            State::RectHeader => {
                let w = u64::from(be16(&h, 4));
                let hh = u64::from(be16(&h, 6));
                let e = be32(&h, 8) as i32;
                self.rect = Rect { w, h: hh };
                match e {
                    enc::RAW => self.end_rect_data(w * hh * bpp),
                    enc::COPY_RECT => self.end_rect_data(4),
                    enc::RRE => self.state = State::RreHeader,
                    enc::HEXTILE => {
                        self.state = State::HextileSubenc { tile: 0 };
                        if w == 0 || hh == 0 {
                            self.state = State::RectDone;
                        }
                    }
                    enc::ZRLE => self.state = State::ZrleLen,
                    enc::TIGHT => self.state = State::TightCtl,
                    enc::DESKTOP_SIZE | enc::POINTER_POS | enc::QEMU_EXTENDED_KEY => {
                        self.end_rect_data(0)
                    }
                    enc::LED_STATE => self.end_rect_data(1),
                    enc::CURSOR => self.end_rect_data(w * hh * bpp + hh * w.div_ceil(8)),
                    enc::X_CURSOR => {
                        let len = if w * hh > 0 {
                            6 + 2 * hh * w.div_ceil(8)
                        } else {
                            0
                        };
                        self.end_rect_data(len)
                    }
                    enc::DESKTOP_NAME => self.state = State::DesktopNameLen,
                    enc::EXTENDED_DESKTOP_SIZE => self.state = State::ExtDesktopSizeHeader,
                    enc::LAST_RECT => self.end_update(out),
                    other => return Err(ParseError::UnknownEncoding(other)),
                }
            }
            State::RreHeader => self.end_rect_data(u64::from(be32(&h, 0)) * (bpp + 8)),
            State::ZrleLen | State::DesktopNameLen => self.end_rect_data(u64::from(be32(&h, 0))),
            State::ExtDesktopSizeHeader => self.end_rect_data(16 * u64::from(h[0])),
            State::HextileSubenc { tile } => {
                let subenc = h[0];
                if subenc & 1 != 0 {
                    let (tw, th) = self.tile_size(tile);
                    self.skip = tw * th * bpp;
                    self.next_tile(tile);
                } else {
                    self.state = State::HextileTileHeader { tile, subenc };
                }
            }
            State::HextileTileHeader { tile, subenc } => {
                if subenc & 8 != 0 {
                    let n = u64::from(h[self.want() - 1]);
                    let per = if subenc & 16 != 0 { bpp + 2 } else { 2 };
                    self.skip = n * per;
                }
                self.next_tile(tile);
            }
            State::TightCtl => {
                let ctl = h[0] >> 4;
                match ctl {
                    0x8 => self.end_rect_data(self.pf.tpixel()),
                    0x9 => self.state = State::TightLen { len: 0, i: 0 },
                    c if c & 0x8 == 0 => {
                        if c & 0x4 != 0 {
                            self.state = State::TightFilter;
                        } else {
                            self.state = State::TightData {
                                size: self.rect.w * self.rect.h * self.pf.tpixel(),
                            };
                        }
                    }
                    c => return Err(ParseError::BadTightControl(c)),
                }
            }
            State::TightFilter => match h[0] {
                0 | 2 => {
                    self.state = State::TightData {
                        size: self.rect.w * self.rect.h * self.pf.tpixel(),
                    }
                }
                1 => self.state = State::TightPaletteSize,
                f => return Err(ParseError::BadTightFilter(f)),
            },
            State::TightPaletteSize => {
                let colours = u64::from(h[0]) + 1;
                self.skip = colours * self.pf.tpixel();
                let row = if colours <= 2 {
                    self.rect.w.div_ceil(8)
                } else {
                    self.rect.w
                };
                self.state = State::TightData {
                    size: row * self.rect.h,
                };
            }
            State::TightData { size } => {
                if size < TIGHT_MIN_TO_COMPRESS {
                    self.end_rect_data(size);
                } else {
                    self.state = State::TightLen { len: 0, i: 0 };
                }
            }
            State::TightLen { len, i } => {
                let b = u64::from(h[0]);
                let len = if i == 2 {
                    len | (b << 14)
                } else {
                    len | ((b & 0x7F) << (7 * i))
                };
                if i < 2 && b & 0x80 != 0 {
                    self.state = State::TightLen { len, i: i + 1 };
                } else {
                    self.end_rect_data(len);
                }
            }
        }
        Ok(())
    }

    fn end_update(&mut self, out: &mut Vec<Boundary>) {
        out.push(Boundary {
            offset: self.offset,
            event: ServerEvent::UpdateEnd,
        });
        self.updates += 1;
        self.in_update = false;
        self.rects_left = None;
        self.state = State::MsgType;
    }

    fn tiles(&self) -> (u64, u64) {
        (self.rect.w.div_ceil(16), self.rect.h.div_ceil(16))
    }

    fn tile_size(&self, tile: u32) -> (u64, u64) {
        let (cols, _) = self.tiles();
        let tx = u64::from(tile) % cols;
        let ty = u64::from(tile) / cols;
        let tw = (self.rect.w - tx * 16).min(16);
        let th = (self.rect.h - ty * 16).min(16);
        (tw, th)
    }

    fn next_tile(&mut self, tile: u32) {
        let (cols, rows) = self.tiles();
        let next = tile + 1;
        if u64::from(next) >= cols * rows {
            self.state = State::RectDone;
        } else {
            self.state = State::HextileSubenc { tile: next };
        }
    }
}

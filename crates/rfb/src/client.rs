//! Sans-IO parser for the client-to-server message stream (after ClientInit).
//!
//! Client messages are small (except cut text, capped by [`ClientStream::new`]'s limit), so the
//! parser returns whole messages with their raw bytes; the proxy forwards the raw bytes (input at
//! once) or rewrites them (SetEncodings).

use crate::proto::{be16, be32, client_msg, cut_text_len, PixelFormat, UpdateRequest};
use crate::ParseError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientMsg {
    SetPixelFormat(PixelFormat),
    SetEncodings(Vec<i32>),
    UpdateRequest(UpdateRequest),
    KeyEvent,
    PointerEvent,
    CutText,
    EnableContinuousUpdates { enable: bool },
    Fence,
    SetDesktopSize,
    QemuKeyEvent,
}

impl ClientMsg {
    /// Input goes to the server at once, ahead of anything held back.
    pub fn is_input(&self) -> bool {
        matches!(
            self,
            ClientMsg::KeyEvent
                | ClientMsg::PointerEvent
                | ClientMsg::CutText
                | ClientMsg::QemuKeyEvent
        )
    }
}

/// One parsed client message and its bytes on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientMessage {
    pub msg: ClientMsg,
    pub raw: Vec<u8>,
}

/// Parse one message from the front of `b`. `Ok(None)`: need more bytes.
pub fn parse_client_message(
    b: &[u8],
    max_cut_text: u64,
) -> Result<Option<(ClientMsg, usize)>, ParseError> {
    let Some(&t) = b.first() else {
        return Ok(None);
    };
    // Fixed header length, then the total length once the header is present.
    let hdr = match t {
        client_msg::SET_PIXEL_FORMAT => 20,
        client_msg::SET_ENCODINGS => 4,
        client_msg::FRAMEBUFFER_UPDATE_REQUEST => 10,
        client_msg::KEY_EVENT => 8,
        client_msg::POINTER_EVENT => 6,
        client_msg::CLIENT_CUT_TEXT => 8,
        client_msg::ENABLE_CONTINUOUS_UPDATES => 10,
        client_msg::FENCE => 9,
        client_msg::SET_DESKTOP_SIZE => 8,
        client_msg::QEMU => 2,
        other => return Err(ParseError::UnknownClientMessage(other)),
    };
    if b.len() < hdr {
        return Ok(None);
    }
    let total: u64 = match t {
        client_msg::SET_ENCODINGS => 4 + 4 * u64::from(be16(b, 2)),
        client_msg::CLIENT_CUT_TEXT => {
            let len = cut_text_len(be32(b, 4));
            if len > max_cut_text {
                return Err(ParseError::TooLong(len));
            }
            8 + len
        }
        client_msg::FENCE => {
            let len = b[8];
            if len > 64 {
                return Err(ParseError::FenceTooLong(len));
            }
            9 + u64::from(len)
        }
        client_msg::SET_DESKTOP_SIZE => 8 + 16 * u64::from(b[6]),
        client_msg::QEMU => {
            if b[1] != 0 {
                return Err(ParseError::UnknownClientMessage(255));
            }
            12
        }
        _ => hdr as u64,
    };
    let total = usize::try_from(total).map_err(|_| ParseError::TooLong(total))?;
    if b.len() < total {
        return Ok(None);
    }
    let m = &b[..total];
    let msg = match t {
        client_msg::SET_PIXEL_FORMAT => ClientMsg::SetPixelFormat(PixelFormat::parse(&m[4..])?),
        client_msg::SET_ENCODINGS => ClientMsg::SetEncodings(
            m[4..]
                .chunks_exact(4)
                .map(|c| i32::from_be_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        client_msg::FRAMEBUFFER_UPDATE_REQUEST => ClientMsg::UpdateRequest(UpdateRequest {
            incremental: m[1] != 0,
            x: be16(m, 2),
            y: be16(m, 4),
            w: be16(m, 6),
            h: be16(m, 8),
        }),
        client_msg::KEY_EVENT => ClientMsg::KeyEvent,
        client_msg::POINTER_EVENT => ClientMsg::PointerEvent,
        client_msg::CLIENT_CUT_TEXT => ClientMsg::CutText,
        client_msg::ENABLE_CONTINUOUS_UPDATES => {
            ClientMsg::EnableContinuousUpdates { enable: m[1] != 0 }
        }
        client_msg::FENCE => ClientMsg::Fence,
        client_msg::SET_DESKTOP_SIZE => ClientMsg::SetDesktopSize,
        _ => ClientMsg::QemuKeyEvent,
    };
    Ok(Some((msg, total)))
}

/// Encode a SetEncodings message.
pub fn emit_set_encodings(encodings: &[i32]) -> Vec<u8> {
    let n = encodings.len().min(usize::from(u16::MAX));
    let mut v = Vec::with_capacity(4 + 4 * n);
    v.extend_from_slice(&[client_msg::SET_ENCODINGS, 0]);
    v.extend_from_slice(&(n as u16).to_be_bytes());
    for e in &encodings[..n] {
        v.extend_from_slice(&e.to_be_bytes());
    }
    v
}

/// Encode a SetPixelFormat message.
pub fn emit_set_pixel_format(pf: &PixelFormat) -> Vec<u8> {
    let mut v = vec![client_msg::SET_PIXEL_FORMAT, 0, 0, 0];
    v.extend_from_slice(&pf.emit());
    v
}

/// Buffers client bytes and yields whole messages.
#[derive(Debug)]
pub struct ClientStream {
    buf: Vec<u8>,
    max_cut_text: u64,
}

impl ClientStream {
    pub fn new(max_cut_text: u64) -> Self {
        ClientStream {
            buf: Vec::new(),
            max_cut_text,
        }
    }

    /// Feed bytes; complete messages are appended to `out`.
    pub fn feed(&mut self, data: &[u8], out: &mut Vec<ClientMessage>) -> Result<(), ParseError> {
        self.buf.extend_from_slice(data);
        let mut start = 0;
        while let Some((msg, n)) = parse_client_message(&self.buf[start..], self.max_cut_text)? {
            out.push(ClientMessage {
                msg,
                raw: self.buf[start..start + n].to_vec(),
            });
            start += n;
        }
        self.buf.drain(..start);
        Ok(())
    }

    /// Bytes of an incomplete message held.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }
}

//! Serial stream messages, sans-IO: the one-byte-typed payloads that `serial` and `pty`
//! endpoints exchange, and the line settings they carry.
//!
//! Every frame of a serial stream (device→app: tty RX; app→device: tty TX) has a payload of
//! one type byte followed by a body (docs/endpoints.md, "Serial frames"):
//!
//! | type | body | meaning |
//! |---|---|---|
//! | `0x00` | the bytes | data |
//! | `0x01` | baud u32 BE, data bits u8, parity u8, stop bits u8, flow u8 (8 bytes) | line settings |
//! | `0x02` | valid mask u8, state u8 (2 bytes) | modem lines |
//! | `0x03` | u8: 1 on, 0 off | break condition (RFC 2217 SET-CONTROL 5/6) |
//! | `0x04` | u8: bit 0 received data, bit 1 data to send (1..=3) | purge the port's buffers (RFC 2217 PURGE-DATA) |
//!
//! [`SerialMessage::parse`] checks the type, the body length and every value; nothing it is
//! given makes it panic. [`SerialMessage::emit`] writes the same bytes back.

pub use crate::common::error::SerialFrameError;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Type byte of a data frame.
pub const TYPE_DATA: u8 = 0x00;
/// Type byte of a line-settings frame.
pub const TYPE_SETTINGS: u8 = 0x01;
/// Type byte of a modem-lines frame.
pub const TYPE_MODEM: u8 = 0x02;
/// Type byte of a break frame.
pub const TYPE_BREAK: u8 = 0x03;
/// Type byte of a purge frame.
pub const TYPE_PURGE: u8 = 0x04;
/// Purge: what the port received and has not handed on yet.
pub const PURGE_RECEIVED: u8 = 0x01;
/// Purge: what waits to be sent out of the port.
pub const PURGE_TO_SEND: u8 = 0x02;
/// Body length of a line-settings frame.
pub const SETTINGS_LEN: usize = 8;
/// Body length of a modem-lines frame.
pub const MODEM_LEN: usize = 2;

/// Parity of a serial line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Parity {
    /// No parity bit (`N`).
    #[default]
    None,
    /// Odd parity (`O`).
    Odd,
    /// Even parity (`E`).
    Even,
    /// Parity bit always 1 (`M`, Linux `CMSPAR|PARODD`).
    Mark,
    /// Parity bit always 0 (`S`, Linux `CMSPAR`).
    Space,
}

impl Parity {
    /// Wire code: 0 none, 1 odd, 2 even, 3 mark, 4 space.
    pub fn code(self) -> u8 {
        match self {
            Parity::None => 0,
            Parity::Odd => 1,
            Parity::Even => 2,
            Parity::Mark => 3,
            Parity::Space => 4,
        }
    }

    /// From the wire code.
    pub fn from_code(code: u8) -> Option<Parity> {
        Some(match code {
            0 => Parity::None,
            1 => Parity::Odd,
            2 => Parity::Even,
            3 => Parity::Mark,
            4 => Parity::Space,
            _ => return None,
        })
    }

    /// The letter in `8N1`.
    pub fn letter(self) -> char {
        match self {
            Parity::None => 'N',
            Parity::Odd => 'O',
            Parity::Even => 'E',
            Parity::Mark => 'M',
            Parity::Space => 'S',
        }
    }
}

/// Flow control of a serial line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Flow {
    /// None.
    #[default]
    None,
    /// Hardware, RTS/CTS (`CRTSCTS`).
    Rtscts,
    /// Software, XON/XOFF (`IXON|IXOFF`).
    Xonxoff,
}

impl Flow {
    /// Wire code: 0 none, 1 rtscts, 2 xonxoff.
    pub fn code(self) -> u8 {
        match self {
            Flow::None => 0,
            Flow::Rtscts => 1,
            Flow::Xonxoff => 2,
        }
    }

    /// From the wire code.
    pub fn from_code(code: u8) -> Option<Flow> {
        Some(match code {
            0 => Flow::None,
            1 => Flow::Rtscts,
            2 => Flow::Xonxoff,
            _ => return None,
        })
    }

    /// The config-file name.
    pub fn name(self) -> &'static str {
        match self {
            Flow::None => "none",
            Flow::Rtscts => "rtscts",
            Flow::Xonxoff => "xonxoff",
        }
    }
}

/// Baud, character size, parity, stop bits and flow control of a serial line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LineSettings {
    /// Bits per second, > 0.
    pub baud: u32,
    /// 5, 6, 7 or 8.
    pub data_bits: u8,
    /// Parity.
    pub parity: Parity,
    /// 1 or 2.
    pub stop_bits: u8,
    /// Flow control.
    pub flow: Flow,
}

impl Default for LineSettings {
    /// 115200 8N1, no flow control.
    fn default() -> Self {
        LineSettings {
            baud: 115_200,
            data_bits: 8,
            parity: Parity::None,
            stop_bits: 1,
            flow: Flow::None,
        }
    }
}

impl fmt::Display for LineSettings {
    /// `115200 8N1`, with ` rtscts` / ` xonxoff` appended when flow control is on.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}{}{}",
            self.baud,
            self.data_bits,
            self.parity.letter(),
            self.stop_bits
        )?;
        if self.flow != Flow::None {
            write!(f, " {}", self.flow.name())?;
        }
        Ok(())
    }
}

impl LineSettings {
    /// Checks the ranges; the error names the field and what is allowed.
    pub fn check(&self) -> Result<(), (&'static str, &'static str)> {
        if self.baud == 0 {
            return Err(("baud", "must be > 0"));
        }
        if !(5..=8).contains(&self.data_bits) {
            return Err(("data_bits", "must be 5, 6, 7 or 8"));
        }
        if !(1..=2).contains(&self.stop_bits) {
            return Err(("stop_bits", "must be 1 or 2"));
        }
        Ok(())
    }

    /// The 8-byte body of a settings frame.
    pub fn encode(&self) -> [u8; SETTINGS_LEN] {
        let b = self.baud.to_be_bytes();
        [
            b[0],
            b[1],
            b[2],
            b[3],
            self.data_bits,
            self.parity.code(),
            self.stop_bits,
            self.flow.code(),
        ]
    }

    /// Parses and checks an 8-byte settings body.
    pub fn decode(body: &[u8]) -> Result<LineSettings, SerialFrameError> {
        let b: [u8; SETTINGS_LEN] = body.try_into().map_err(|_| SerialFrameError::BodyLength {
            kind: "line settings",
            want: SETTINGS_LEN,
            got: body.len(),
        })?;
        let s = LineSettings {
            baud: u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
            data_bits: b[4],
            parity: Parity::from_code(b[5]).ok_or(SerialFrameError::Value {
                field: "parity",
                value: u32::from(b[5]),
            })?,
            stop_bits: b[6],
            flow: Flow::from_code(b[7]).ok_or(SerialFrameError::Value {
                field: "flow",
                value: u32::from(b[7]),
            })?,
        };
        s.check().map_err(|(field, _)| SerialFrameError::Value {
            field,
            value: match field {
                "baud" => s.baud,
                "data_bits" => u32::from(s.data_bits),
                _ => u32::from(s.stop_bits),
            },
        })?;
        Ok(s)
    }
}

/// Modem control lines: which ones a frame reports (`valid`) and their state (`state`), one
/// bit each ([`ModemLines::DTR`] …). DTR and RTS are outputs of the computer (app→device);
/// CTS, DSR, DCD and RI are inputs (device→app).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ModemLines {
    /// Bits this frame speaks for; the others are left as they are.
    pub valid: u8,
    /// Bit set = line asserted.
    pub state: u8,
}

impl ModemLines {
    /// Data Terminal Ready (output).
    pub const DTR: u8 = 0x01;
    /// Request To Send (output).
    pub const RTS: u8 = 0x02;
    /// Clear To Send (input).
    pub const CTS: u8 = 0x04;
    /// Data Set Ready (input).
    pub const DSR: u8 = 0x08;
    /// Data Carrier Detect (input).
    pub const DCD: u8 = 0x10;
    /// Ring Indicator (input).
    pub const RI: u8 = 0x20;
    /// Every defined bit.
    pub const ALL: u8 = 0x3f;
}

/// One decoded serial-stream payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SerialMessage<'a> {
    /// Bytes for (or from) the line.
    Data(&'a [u8]),
    /// New line settings.
    Settings(LineSettings),
    /// Modem-line states.
    Modem(ModemLines),
    /// The break condition on (`true`) or off: the line held at space.
    Break(bool),
    /// Drop what the port holds: [`PURGE_RECEIVED`] and/or [`PURGE_TO_SEND`].
    Purge(u8),
}

impl<'a> SerialMessage<'a> {
    /// Parses a payload: type byte, then body.
    pub fn parse(payload: &'a [u8]) -> Result<SerialMessage<'a>, SerialFrameError> {
        let (&ty, body) = payload.split_first().ok_or(SerialFrameError::Empty)?;
        match ty {
            TYPE_DATA => Ok(SerialMessage::Data(body)),
            TYPE_SETTINGS => LineSettings::decode(body).map(SerialMessage::Settings),
            TYPE_MODEM => {
                let &[valid, state] = body else {
                    return Err(SerialFrameError::BodyLength {
                        kind: "modem lines",
                        want: MODEM_LEN,
                        got: body.len(),
                    });
                };
                if (valid | state) & !ModemLines::ALL != 0 {
                    return Err(SerialFrameError::ModemBits(valid | state));
                }
                Ok(SerialMessage::Modem(ModemLines { valid, state }))
            }
            TYPE_BREAK | TYPE_PURGE => {
                let (kind, expected) = if ty == TYPE_BREAK {
                    ("break", "0 off or 1 on")
                } else {
                    ("purge", "1 received, 2 to send or 3 both")
                };
                let &[v] = body else {
                    return Err(SerialFrameError::BodyLength {
                        kind,
                        want: 1,
                        got: body.len(),
                    });
                };
                match (ty, v) {
                    (TYPE_BREAK, 0 | 1) => Ok(SerialMessage::Break(v == 1)),
                    (TYPE_PURGE, 1..=3) => Ok(SerialMessage::Purge(v)),
                    _ => Err(SerialFrameError::Control {
                        kind,
                        value: v,
                        expected,
                    }),
                }
            }
            other => Err(SerialFrameError::UnknownType(other)),
        }
    }

    /// Payload length of this message.
    pub fn len(&self) -> usize {
        1 + match self {
            SerialMessage::Data(d) => d.len(),
            SerialMessage::Settings(_) => SETTINGS_LEN,
            SerialMessage::Modem(_) => MODEM_LEN,
            SerialMessage::Break(_) | SerialMessage::Purge(_) => 1,
        }
    }

    /// Always false: a message has at least its type byte.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Writes the payload into `out` (which must be [`SerialMessage::len`] bytes long).
    pub fn emit_into(&self, out: &mut [u8]) {
        match self {
            SerialMessage::Data(d) => {
                out[0] = TYPE_DATA;
                out[1..].copy_from_slice(d);
            }
            SerialMessage::Settings(s) => {
                out[0] = TYPE_SETTINGS;
                out[1..].copy_from_slice(&s.encode());
            }
            SerialMessage::Modem(m) => {
                out.copy_from_slice(&[TYPE_MODEM, m.valid, m.state]);
            }
            SerialMessage::Break(on) => out.copy_from_slice(&[TYPE_BREAK, u8::from(*on)]),
            SerialMessage::Purge(what) => out.copy_from_slice(&[TYPE_PURGE, *what]),
        }
    }

    /// The payload as a new vector.
    pub fn emit(&self) -> Vec<u8> {
        let mut v = vec![0; self.len()];
        self.emit_into(&mut v);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn parse_emit_data() {
        let p = hex("00 6869");
        assert_eq!(SerialMessage::parse(&p), Ok(SerialMessage::Data(b"hi")));
        assert_eq!(SerialMessage::Data(b"hi").emit(), p);
        assert_eq!(SerialMessage::parse(&[0]), Ok(SerialMessage::Data(b"")));
    }

    #[test]
    fn parse_emit_settings() {
        // 9600 7E2 rtscts
        let p = hex("01 00002580 07 02 02 01");
        let s = LineSettings {
            baud: 9600,
            data_bits: 7,
            parity: Parity::Even,
            stop_bits: 2,
            flow: Flow::Rtscts,
        };
        assert_eq!(SerialMessage::parse(&p), Ok(SerialMessage::Settings(s)));
        assert_eq!(SerialMessage::Settings(s).emit(), p);
        assert_eq!(s.to_string(), "9600 7E2 rtscts");
        // Default: 115200 8N1.
        assert_eq!(
            SerialMessage::Settings(LineSettings::default()).emit(),
            hex("01 0001c200 08 00 01 00")
        );
        assert_eq!(LineSettings::default().to_string(), "115200 8N1");
    }

    #[test]
    fn parse_emit_modem() {
        let p = hex("02 1c 14");
        let m = ModemLines {
            valid: ModemLines::CTS | ModemLines::DSR | ModemLines::DCD,
            state: ModemLines::CTS | ModemLines::DCD,
        };
        assert_eq!(SerialMessage::parse(&p), Ok(SerialMessage::Modem(m)));
        assert_eq!(SerialMessage::Modem(m).emit(), p);
    }

    #[test]
    fn parse_emit_break_and_purge() {
        for (p, m) in [
            ("03 01", SerialMessage::Break(true)),
            ("03 00", SerialMessage::Break(false)),
            ("04 01", SerialMessage::Purge(PURGE_RECEIVED)),
            ("04 02", SerialMessage::Purge(PURGE_TO_SEND)),
            (
                "04 03",
                SerialMessage::Purge(PURGE_RECEIVED | PURGE_TO_SEND),
            ),
        ] {
            assert_eq!(SerialMessage::parse(&hex(p)), Ok(m), "{p}");
            assert_eq!(m.emit(), hex(p));
        }
    }

    #[test]
    fn malformed_payloads_are_errors() {
        let cases: &[(&str, &str)] = &[
            ("", "empty payload (no type byte)"),
            (
                "07",
                "unknown type byte 0x07 (expected 0x00 data, 0x01 line settings, 0x02 modem lines, 0x03 break, 0x04 purge)",
            ),
            ("03", "break body must be 1 bytes, got 0"),
            ("03 02", "break: invalid value 0x02 (expected 0 off or 1 on)"),
            ("04 01 02", "purge body must be 1 bytes, got 2"),
            (
                "04 00",
                "purge: invalid value 0x00 (expected 1 received, 2 to send or 3 both)",
            ),
            (
                "04 04",
                "purge: invalid value 0x04 (expected 1 received, 2 to send or 3 both)",
            ),
            (
                "01 00002580 08 00 01",
                "line settings body must be 8 bytes, got 7",
            ),
            ("01 00000000 08 00 01 00", "line settings: invalid baud 0"),
            (
                "01 00002580 09 00 01 00",
                "line settings: invalid data_bits 9",
            ),
            ("01 00002580 08 05 01 00", "line settings: invalid parity 5"),
            (
                "01 00002580 08 00 03 00",
                "line settings: invalid stop_bits 3",
            ),
            ("01 00002580 08 00 01 03", "line settings: invalid flow 3"),
            ("02 01", "modem lines body must be 2 bytes, got 1"),
            (
                "02 40 00",
                "modem lines: undefined bits in 0x40 (defined: 0x3f)",
            ),
        ];
        for (input, want) in cases {
            let e = SerialMessage::parse(&hex(input)).unwrap_err();
            assert_eq!(e.to_string(), *want, "{input}");
        }
    }

    #[test]
    fn parse_never_panics_on_short_garbage() {
        for len in 0..12 {
            for fill in [0u8, 1, 2, 0xff] {
                let mut p = vec![fill; len];
                if let Some(first) = p.first_mut() {
                    *first = fill % 4;
                }
                let _ = SerialMessage::parse(&p);
            }
        }
    }
}

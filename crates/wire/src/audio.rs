//! Audio records, the payload of an audio stream: one block of sound, a few milliseconds
//! long (packet/repr style, no I/O). The frame header's source timestamp dates the block's
//! first sample, so a `buffer` pair can play blocks at their original pace.
//!
//! | bytes | field |
//! |---|---|
//! | 1 | version `1` |
//! | 1 | codec: `0` PCM (signed 16-bit little-endian, channels interleaved), `1` Opus |
//! | 4 | sample rate, Hz, u32 BE, 8000..=192000 |
//! | 1 | channels, 1..=[`MAX_CHANNELS`] |
//! | 2 | samples per channel in this block, u16 BE, 1..=[`MAX_SAMPLES`] |
//! | rest | PCM: exactly samples × channels × 2 bytes; Opus: one packet (1..=1275 bytes) |

use std::fmt;

/// Version byte of every audio record.
pub const VERSION: u8 = 1;
/// Bytes before the samples.
pub const HEADER_LEN: usize = 9;
/// Most channels.
pub const MAX_CHANNELS: u8 = 8;
/// Most samples per channel in one block (a second at 48 kHz would be 48000: blocks are
/// short; 0.5 s at 96 kHz is the limit).
pub const MAX_SAMPLES: u16 = 48_000;
/// Longest Opus packet (RFC 6716).
pub const MAX_OPUS_PACKET: usize = 1275;

/// How the samples are coded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Codec {
    /// Signed 16-bit little-endian PCM, channels interleaved.
    Pcm,
    /// One Opus packet.
    Opus,
}

impl Codec {
    /// The wire byte.
    pub fn byte(self) -> u8 {
        match self {
            Codec::Pcm => 0,
            Codec::Opus => 1,
        }
    }
}

impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Codec::Pcm => "PCM s16le",
            Codec::Opus => "Opus",
        })
    }
}

/// What is wrong with an audio record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AudioFrameError {
    /// Shorter than the header.
    #[error("audio record: {0} bytes, shorter than the 9-byte header")]
    Short(usize),
    /// Another version.
    #[error("audio record: unsupported version {0} (this build speaks version 1)")]
    Version(u8),
    /// An unknown codec byte.
    #[error("audio record: unknown codec {0} (0 PCM, 1 Opus)")]
    Codec(u8),
    /// A value out of range.
    #[error("audio record: {field} {value} out of range ({range})")]
    Range {
        /// Which field.
        field: &'static str,
        /// Its value.
        value: u32,
        /// What is allowed.
        range: &'static str,
    },
    /// The samples do not fill the record as the header says.
    #[error("audio record: {codec} body of {got} bytes, expected {want}")]
    Body {
        /// The codec.
        codec: Codec,
        /// Bytes the header implies (PCM) or allows at most (Opus).
        want: String,
        /// Bytes there.
        got: usize,
    },
}

/// A parsed audio record (borrowing the samples).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block<'a> {
    /// The codec.
    pub codec: Codec,
    /// Hz.
    pub rate: u32,
    /// Channels.
    pub channels: u8,
    /// Samples per channel.
    pub samples: u16,
    /// PCM bytes or the Opus packet.
    pub data: &'a [u8],
}

impl<'a> Block<'a> {
    /// Parses and checks a record.
    pub fn parse(p: &'a [u8]) -> Result<Block<'a>, AudioFrameError> {
        let Some(head) = p.get(..HEADER_LEN) else {
            return Err(AudioFrameError::Short(p.len()));
        };
        if head[0] != VERSION {
            return Err(AudioFrameError::Version(head[0]));
        }
        let codec = match head[1] {
            0 => Codec::Pcm,
            1 => Codec::Opus,
            c => return Err(AudioFrameError::Codec(c)),
        };
        let b = Block {
            codec,
            rate: u32::from_be_bytes([head[2], head[3], head[4], head[5]]),
            channels: head[6],
            samples: u16::from_be_bytes([head[7], head[8]]),
            data: &p[HEADER_LEN..],
        };
        b.check()?;
        Ok(b)
    }

    /// Checks the ranges and the body length.
    pub fn check(&self) -> Result<(), AudioFrameError> {
        if !(8000..=192_000).contains(&self.rate) {
            return Err(AudioFrameError::Range {
                field: "sample rate",
                value: self.rate,
                range: "8000..=192000 Hz",
            });
        }
        if !(1..=MAX_CHANNELS).contains(&self.channels) {
            return Err(AudioFrameError::Range {
                field: "channels",
                value: u32::from(self.channels),
                range: "1..=8",
            });
        }
        if !(1..=MAX_SAMPLES).contains(&self.samples) {
            return Err(AudioFrameError::Range {
                field: "samples",
                value: u32::from(self.samples),
                range: "1..=48000",
            });
        }
        match self.codec {
            Codec::Pcm => {
                let want = self.pcm_len();
                if self.data.len() != want {
                    return Err(AudioFrameError::Body {
                        codec: self.codec,
                        want: want.to_string(),
                        got: self.data.len(),
                    });
                }
            }
            Codec::Opus => {
                if !(1..=MAX_OPUS_PACKET).contains(&self.data.len()) {
                    return Err(AudioFrameError::Body {
                        codec: self.codec,
                        want: "1..=1275".into(),
                        got: self.data.len(),
                    });
                }
            }
        }
        Ok(())
    }

    /// Bytes of this block as PCM.
    pub fn pcm_len(&self) -> usize {
        usize::from(self.samples) * usize::from(self.channels) * 2
    }

    /// Bytes of the record.
    pub fn len(&self) -> usize {
        HEADER_LEN + self.data.len()
    }

    /// Never: a record has a header.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Writes the header only (the caller writes [`Block::data`]'s bytes after it, e.g. a
    /// capture straight into the frame).
    pub fn emit_header(&self, out: &mut [u8]) {
        out[0] = VERSION;
        out[1] = self.codec.byte();
        out[2..6].copy_from_slice(&self.rate.to_be_bytes());
        out[6] = self.channels;
        out[7..9].copy_from_slice(&self.samples.to_be_bytes());
    }

    /// The whole record.
    pub fn emit(&self) -> Result<Vec<u8>, AudioFrameError> {
        self.check()?;
        let mut out = vec![0; self.len()];
        self.emit_header(&mut out);
        out[HEADER_LEN..].copy_from_slice(self.data);
        Ok(out)
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
    fn the_documented_vectors_parse_and_emit() {
        // 48 kHz mono PCM, two samples: 1, -2.
        let p = hex("01 00 0000bb80 01 0002 0100 feff");
        let b = Block::parse(&p).unwrap();
        assert_eq!(
            (b.codec, b.rate, b.channels, b.samples, b.data),
            (Codec::Pcm, 48_000, 1, 2, &[1, 0, 0xfe, 0xff][..])
        );
        assert_eq!(b.emit().unwrap(), p);
        // 48 kHz stereo Opus, 480 samples (10 ms), a 3-byte packet.
        let p = hex("01 01 0000bb80 02 01e0 f8fffe");
        let b = Block::parse(&p).unwrap();
        assert_eq!((b.codec, b.samples, b.data.len()), (Codec::Opus, 480, 3));
        assert_eq!(b.emit().unwrap(), p);
    }

    #[test]
    fn bad_records_say_what_is_wrong() {
        let cases = [
            (
                "01 00 0000bb",
                "audio record: 5 bytes, shorter than the 9-byte header",
            ),
            (
                "02 00 0000bb80 01 0001 0000",
                "audio record: unsupported version 2 (this build speaks version 1)",
            ),
            (
                "01 07 0000bb80 01 0001 0000",
                "audio record: unknown codec 7 (0 PCM, 1 Opus)",
            ),
            (
                "01 00 00000064 01 0001 0000",
                "audio record: sample rate 100 out of range (8000..=192000 Hz)",
            ),
            (
                "01 00 0000bb80 09 0001 0000",
                "audio record: channels 9 out of range (1..=8)",
            ),
            (
                "01 00 0000bb80 01 0000",
                "audio record: samples 0 out of range (1..=48000)",
            ),
            (
                "01 00 0000bb80 01 0002 0000",
                "audio record: PCM s16le body of 2 bytes, expected 4",
            ),
            (
                "01 01 0000bb80 01 01e0",
                "audio record: Opus body of 0 bytes, expected 1..=1275",
            ),
        ];
        for (input, want) in cases {
            assert_eq!(
                Block::parse(&hex(input)).unwrap_err().to_string(),
                want,
                "{input}"
            );
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut x = 0x9e37_79b9u32;
        for len in 0..300 {
            let p: Vec<u8> = (0..len)
                .map(|i| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    if i < 2 {
                        1
                    } else {
                        (x >> 7) as u8
                    }
                })
                .collect();
            if let Ok(b) = Block::parse(&p) {
                assert_eq!(b.emit().unwrap(), p);
            }
        }
    }
}

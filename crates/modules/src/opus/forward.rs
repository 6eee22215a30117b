//! The forward half of `opus`: PCM records in, Opus records out.

use super::{channels, Application, PAIR};
use ndd_core::frame::DEFAULT_HEADROOM;
use ndd_core::{ForeignError, Frame, FrameError, Half, HalfStats, ModuleError, Output, SetupError};
use ndd_wire::audio::{Block, Codec, HEADER_LEN, MAX_OPUS_PACKET};
use std::fmt;
use std::time::Instant;

/// See the module docs.
pub struct OpusForward {
    bitrate: u32,
    application: Application,
    encoder: Option<(u32, u8, opus::Encoder)>,
    samples: Vec<i16>,
    packet: Vec<u8>,
    coded: u64,
    bytes_out: u64,
}

impl fmt::Debug for OpusForward {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpusForward")
            .field("bitrate", &self.bitrate)
            .field("application", &self.application)
            .field("coded", &self.coded)
            .finish_non_exhaustive()
    }
}

fn refuse(why: String) -> ModuleError {
    ModuleError::from(FrameError::Foreign(ForeignError::new(format!(
        "{PAIR}: {why}"
    ))))
}

impl OpusForward {
    /// A forward half coding at `bitrate` for `application`.
    pub fn new(bitrate: u32, application: Application) -> OpusForward {
        OpusForward {
            bitrate,
            application,
            encoder: None,
            samples: Vec::new(),
            packet: vec![0; MAX_OPUS_PACKET],
            coded: 0,
            bytes_out: 0,
        }
    }

    fn encoder(&mut self, rate: u32, ch: u8) -> Result<&mut opus::Encoder, ModuleError> {
        let stale = match &self.encoder {
            Some((r, c, _)) => (*r, *c) != (rate, ch),
            None => true,
        };
        if stale {
            let lib = |e: opus::Error| {
                ModuleError::from(SetupError::Library {
                    pair: PAIR,
                    context: format!("encoder for {rate} Hz, {ch} channel(s)"),
                    source: ForeignError::new(e),
                })
            };
            let c = channels(ch)
                .ok_or_else(|| refuse(format!("{ch} channels: Opus codes 1 or 2 here")))?;
            let mut e = opus::Encoder::new(rate, c, self.application.opus()).map_err(lib)?;
            e.set_bitrate(opus::Bitrate::Bits(self.bitrate as i32))
                .map_err(lib)?;
            self.encoder = Some((rate, ch, e));
        }
        match &mut self.encoder {
            Some((_, _, e)) => Ok(e),
            None => unreachable!("set above"),
        }
    }
}

impl Half for OpusForward {
    fn handle_frame(
        &mut self,
        _now: Instant,
        frame: Frame,
        out: &mut Output,
    ) -> Result<(), ModuleError> {
        let b = Block::parse(frame.payload()).map_err(|e| refuse(e.to_string()))?;
        if b.codec != Codec::Pcm {
            return Err(refuse(format!(
                "{} record: the forward half codes PCM",
                b.codec
            )));
        }
        if ![8_000, 12_000, 16_000, 24_000, 48_000].contains(&b.rate) {
            return Err(refuse(format!(
                "{} Hz: Opus codes 8000, 12000, 16000, 24000 or 48000 Hz (set the capture's rate)",
                b.rate
            )));
        }
        // 2.5, 5, 10, 20, 40 or 60 ms.
        let per_2_5_ms = b.rate / 400;
        let s = u32::from(b.samples);
        if s % per_2_5_ms != 0 || ![1, 2, 4, 8, 16, 24].contains(&(s / per_2_5_ms)) {
            return Err(refuse(format!(
                "blocks of {} samples at {} Hz: Opus codes 2.5, 5, 10, 20, 40 or 60 ms (set the \
                 capture's frame_ms)",
                b.samples, b.rate
            )));
        }
        self.samples.clear();
        self.samples.extend(
            b.data
                .chunks_exact(2)
                .map(|x| i16::from_le_bytes([x[0], x[1]])),
        );
        let (rate, ch, samples) = (b.rate, b.channels, b.samples);
        let mut packet = std::mem::take(&mut self.packet);
        let input = std::mem::take(&mut self.samples);
        let n = self
            .encoder(rate, ch)?
            .encode(&input, &mut packet)
            .map_err(|e| {
                ModuleError::from(FrameError::Corrupt {
                    pair: PAIR,
                    codec: "opus",
                    source: ForeignError::new(e),
                })
            });
        self.samples = input;
        let n = match n {
            Ok(n) => n,
            Err(e) => {
                self.packet = packet;
                return Err(e);
            }
        };
        let head = Block {
            codec: Codec::Opus,
            rate,
            channels: ch,
            samples,
            data: &[],
        };
        let mut coded = Frame::zeroed(frame.meta, DEFAULT_HEADROOM, HEADER_LEN + n);
        let p = coded.payload_mut();
        head.emit_header(p);
        p[HEADER_LEN..].copy_from_slice(&packet[..n]);
        self.packet = packet;
        self.coded += 1;
        self.bytes_out += (HEADER_LEN + n) as u64;
        out.push(coded);
        Ok(())
    }

    fn stats(&self) -> HalfStats {
        HalfStats {
            drops: 0,
            queue_depth: 0,
            counters: vec![("coded", self.coded), ("bytes_out", self.bytes_out)],
        }
    }
}

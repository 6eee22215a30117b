//! The inverse half of `opus`: Opus records in, PCM records out, lost blocks concealed.

use super::{channels, MAX_CONCEALED, PAIR};
use ndd_core::frame::DEFAULT_HEADROOM;
use ndd_core::{ForeignError, Frame, FrameError, Half, HalfStats, ModuleError, Output, SetupError};
use ndd_wire::audio::{Block, Codec, HEADER_LEN, MAX_SAMPLES};
use std::fmt;
use std::time::Instant;

/// See the module docs.
pub struct OpusInverse {
    decoder: Option<(u32, u8, opus::Decoder)>,
    last_seq: Option<u64>,
    pcm: Vec<i16>,
    decoded: u64,
    concealed: u64,
}

impl fmt::Debug for OpusInverse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpusInverse")
            .field("decoded", &self.decoded)
            .field("concealed", &self.concealed)
            .finish_non_exhaustive()
    }
}

fn refuse(why: String) -> ModuleError {
    ModuleError::from(FrameError::Foreign(ForeignError::new(format!(
        "{PAIR}: {why}"
    ))))
}

impl Default for OpusInverse {
    fn default() -> Self {
        OpusInverse::new()
    }
}

impl OpusInverse {
    /// An inverse half.
    pub fn new() -> OpusInverse {
        OpusInverse {
            decoder: None,
            last_seq: None,
            pcm: Vec::new(),
            decoded: 0,
            concealed: 0,
        }
    }
}

impl Half for OpusInverse {
    fn handle_frame(
        &mut self,
        _now: Instant,
        frame: Frame,
        out: &mut Output,
    ) -> Result<(), ModuleError> {
        let b = Block::parse(frame.payload()).map_err(|e| refuse(e.to_string()))?;
        if b.codec == Codec::Pcm {
            self.last_seq = Some(frame.meta.seq);
            out.push(frame);
            return Ok(());
        }
        let (rate, ch, samples) = (b.rate, b.channels, b.samples);
        let c = channels(ch).ok_or_else(|| refuse(format!("an Opus record of {ch} channels")))?;
        let stale = match &self.decoder {
            Some((r, k, _)) => (*r, *k) != (rate, ch),
            None => true,
        };
        if stale {
            let d = opus::Decoder::new(rate, c).map_err(|e| {
                ModuleError::from(SetupError::Library {
                    pair: PAIR,
                    context: format!("decoder for {rate} Hz, {ch} channel(s)"),
                    source: ForeignError::new(e),
                })
            })?;
            self.decoder = Some((rate, ch, d));
        }
        let Some((_, _, dec)) = &mut self.decoder else {
            unreachable!("set above")
        };
        // Blocks lost in front of this one (a lossy stream's sequence jumped): concealed.
        let missing = self
            .last_seq
            .map_or(0, |l| frame.meta.seq.saturating_sub(l + 1))
            .min(MAX_CONCEALED)
            .min(u64::from(MAX_SAMPLES / samples.max(1)).saturating_sub(1));
        self.last_seq = Some(frame.meta.seq);
        let per = usize::from(samples) * usize::from(ch);
        let total = per * (missing as usize + 1);
        self.pcm.clear();
        self.pcm.resize(total, 0);
        let corrupt = |e: opus::Error| {
            ModuleError::from(FrameError::Corrupt {
                pair: PAIR,
                codec: "opus",
                source: ForeignError::new(e),
            })
        };
        for k in 0..missing as usize {
            dec.decode(&[], &mut self.pcm[k * per..(k + 1) * per], false)
                .map_err(corrupt)?;
        }
        let at = missing as usize * per;
        let n = dec
            .decode(b.data, &mut self.pcm[at..], false)
            .map_err(corrupt)?;
        if n != usize::from(samples) {
            return Err(refuse(format!(
                "a packet of {n} samples per channel, the record says {samples}"
            )));
        }
        self.concealed += missing;
        self.decoded += 1;
        let head = Block {
            codec: Codec::Pcm,
            rate,
            channels: ch,
            samples: samples * (missing as u16 + 1),
            data: &[],
        };
        let mut pcm = Frame::zeroed(frame.meta, DEFAULT_HEADROOM, HEADER_LEN + total * 2);
        let p = pcm.payload_mut();
        head.emit_header(p);
        for (d, s) in p[HEADER_LEN..].chunks_exact_mut(2).zip(&self.pcm) {
            d.copy_from_slice(&s.to_le_bytes());
        }
        out.push(pcm);
        Ok(())
    }

    fn stats(&self) -> HalfStats {
        HalfStats {
            drops: 0,
            queue_depth: 0,
            counters: vec![("decoded", self.decoded), ("concealed", self.concealed)],
        }
    }
}

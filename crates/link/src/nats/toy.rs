//! Test helpers of the NATS machines: toy run halves, and the records they open.

use super::keys::{Outcome, RunHalf};
use super::record::FrameRecord;
use super::runs::{run_key, Run};
use super::send::RunSeal;
use bytes::Bytes;
use ndd_core::{Frame, ModuleError, Output};
use std::time::Instant;

/// A toy half: a frame "opens" when its payload starts with the first 8 bytes of the key and
/// the subject sequence it is bound to (the rules, not the cipher, are under test; the
/// testkit's simulations run the real `encrypt` inverse).
pub(crate) struct Toy(pub(crate) [u8; 8]);

impl RunHalf for Toy {
    fn under(key: [u8; 32]) -> Toy {
        Toy(key[..8].try_into().unwrap())
    }
    fn open(
        &mut self,
        _: Instant,
        mut frame: Frame,
        wseq: u64,
        out: &mut Output,
    ) -> Result<Outcome, ModuleError> {
        let p = frame.payload();
        if p.starts_with(&self.0) && p.get(8..16) == Some(&wseq.to_be_bytes()[..]) {
            frame.pop_header(16);
            out.push(frame);
            return Ok(Outcome::Opened);
        }
        Ok(Outcome::Rejected)
    }
}

/// The record of frame `seq` of `run` on `stream` at subject sequence `wseq`, sealed for the
/// [`Toy`] half under group key `[k; 32]`.
pub(crate) fn toy_record(stream: u16, k: u8, run: Run, seq: u64, wseq: u64, data: &[u8]) -> Bytes {
    let mut p = run_key(&[k; 32], run)[..8].to_vec();
    p.extend_from_slice(&wseq.to_be_bytes());
    p.extend_from_slice(data);
    FrameRecord {
        stream,
        flags: 0,
        run: run.id,
        began: run.began,
        seq,
        timestamp_ns: 0,
        wseq,
        payload: Bytes::from(p),
    }
    .encode()
}

/// A toy sealing half: the sealed frame is the run key's first byte, the subject sequence it
/// is bound to and the payload.
pub(crate) struct ToySeal(pub(crate) u8);

impl RunSeal for ToySeal {
    fn under(key: [u8; 32]) -> Result<ToySeal, ModuleError> {
        Ok(ToySeal(key[0]))
    }
    fn seal(&mut self, frame: Frame, wseq: u64, out: &mut Output) -> Result<(), ModuleError> {
        let mut p = vec![self.0];
        p.extend_from_slice(&wseq.to_be_bytes());
        p.extend_from_slice(frame.payload());
        out.push(Frame::new(frame.meta, &p));
        Ok(())
    }
}

/// A tiny generator for the machines' random schedules (xorshift).
pub(crate) struct Rng(u64);

impl Rng {
    /// A generator for schedule `seed`.
    pub(crate) fn seeded(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// A number in `0..n` (`n` > 0).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// True `percent` times in 100.
    pub(crate) fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

//! Test helpers of the NATS machines: a toy run half, and the records it opens.

use super::keys::{Outcome, RunHalf};
use super::record::FrameRecord;
use super::runs::{run_key, Run};
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

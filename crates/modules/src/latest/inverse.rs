//! Sink half of `latest`: passes frames on and acknowledges each to the forward half.

use super::encode_ack;
use ndd_core::{Frame, Half, HalfStats, ModuleError, Output};
use std::time::Instant;

/// Acks every frame; passes on those newer than the last one passed.
#[derive(Debug, Default)]
pub struct LatestInverse {
    last: Option<u64>,
    passed: u64,
    stale: u64,
}

impl Half for LatestInverse {
    fn handle_frame(
        &mut self,
        _now: Instant,
        frame: Frame,
        out: &mut Output,
    ) -> Result<(), ModuleError> {
        let seq = frame.meta.seq;
        out.control(encode_ack(seq).to_vec());
        if self.last.is_some_and(|l| seq <= l) {
            self.stale += 1;
            tracing::trace!(
                stream = frame.meta.stream,
                seq,
                "latest: frame older than one already passed on; dropped"
            );
            return Ok(());
        }
        self.last = Some(seq);
        self.passed += 1;
        out.push(frame);
        Ok(())
    }

    fn stats(&self) -> HalfStats {
        HalfStats {
            drops: self.stale,
            queue_depth: 0,
            counters: vec![("passed", self.passed), ("stale", self.stale)],
        }
    }
}

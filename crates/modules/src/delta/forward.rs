//! Source half of `delta`: key frames and XOR deltas against the previous frame.

use super::format::{Header, KeyRequest};
use bytes::Bytes;
use ndd_core::{Frame, Half, HalfStats, ModuleError, Output};
use std::time::Instant;

/// Sends each frame as a key frame or as its XOR against the previous frame.
#[derive(Debug)]
pub struct DeltaForward {
    /// Key frame every this many frames (0: never on a schedule).
    interval: u64,
    /// Copy of the last frame sent (before its header), the next delta's reference.
    reference: Vec<u8>,
    /// meta.seq of `reference`; `None` before the first frame.
    reference_seq: Option<u64>,
    /// Delta frames sent since the last key frame.
    since_key: u64,
    /// The twin asked for a key frame.
    key_requested: bool,
    key_frames: u64,
    delta_frames: u64,
    key_requests: u64,
}

impl DeltaForward {
    /// A forward half sending a key frame at least every `keyframe_interval` frames (0: only
    /// at the start, on size changes and on request).
    pub fn new(keyframe_interval: u32) -> DeltaForward {
        DeltaForward {
            interval: u64::from(keyframe_interval),
            reference: Vec::new(),
            reference_seq: None,
            since_key: 0,
            key_requested: false,
            key_frames: 0,
            delta_frames: 0,
            key_requests: 0,
        }
    }
}

impl Half for DeltaForward {
    fn handle_frame(
        &mut self,
        _now: Instant,
        mut frame: Frame,
        out: &mut Output,
    ) -> Result<(), ModuleError> {
        let seq = frame.meta.seq;
        let delta_against = match self.reference_seq {
            Some(r)
                if !self.key_requested
                    && self.reference.len() == frame.len()
                    && (self.interval == 0 || self.since_key + 1 < self.interval) =>
            {
                Some(r)
            }
            _ => None,
        };
        let header = match delta_against {
            Some(reference) => {
                // In place: the payload becomes the difference, the reference becomes this frame.
                for (p, r) in frame
                    .payload_mut()
                    .iter_mut()
                    .zip(self.reference.iter_mut())
                {
                    let cur = *p;
                    *p = cur ^ *r;
                    *r = cur;
                }
                self.since_key += 1;
                self.delta_frames += 1;
                Header::Delta { reference }
            }
            None => {
                self.reference.clear();
                self.reference.extend_from_slice(frame.payload());
                self.since_key = 0;
                self.key_requested = false;
                self.key_frames += 1;
                Header::Key
            }
        };
        self.reference_seq = Some(seq);
        frame.push_header_with(header.buffer_len(), |h| header.emit(h));
        out.push(frame);
        Ok(())
    }

    fn handle_control(
        &mut self,
        _now: Instant,
        msg: Bytes,
        _out: &mut Output,
    ) -> Result<(), ModuleError> {
        let req = KeyRequest::parse(&msg)?;
        tracing::debug!(last = ?req.last, "delta: key frame requested");
        self.key_requested = true;
        self.key_requests += 1;
        Ok(())
    }

    fn stats(&self) -> HalfStats {
        HalfStats {
            drops: 0,
            queue_depth: 0,
            counters: vec![
                ("key_frames", self.key_frames),
                ("delta_frames", self.delta_frames),
                ("key_requests", self.key_requests),
            ],
        }
    }
}

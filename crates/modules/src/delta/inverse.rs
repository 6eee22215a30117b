//! Sink half of `delta`: rebuilds frames from key frames and deltas; drops deltas whose
//! reference it does not hold and asks its twin for a key frame.

use super::format::{Header, KeyRequest, DELTA_LEN, KEY_LEN};
use ndd_core::{Frame, Half, HalfStats, ModuleError, Output, RateLimit};
use std::time::{Duration, Instant};

/// While it cannot rebuild, the inverse asks again for a key frame after this many further
/// dropped frames (in case the key frame it asked for was lost too), or sooner: once twice the
/// time its last request took to be answered has passed.
pub const RETRY_AFTER_DROPS: u64 = 32;

/// Rebuilds frames; see the module docs.
#[derive(Debug, Default)]
pub struct DeltaInverse {
    /// Copy of the last frame rebuilt (the newest one).
    held: Vec<u8>,
    /// Its meta.seq; `None` before the first key frame.
    held_seq: Option<u64>,
    /// Newer deltas dropped since the last key request (rate-limits key requests).
    drops_since_request: u64,
    /// When the key request of the current stuck episode was (last) sent.
    requested_at: Option<Instant>,
    /// How long the last answered request took, from request to key frame.
    response: Option<Duration>,
    key_frames: u64,
    delta_frames: u64,
    missing_reference: u64,
    key_requests: u64,
    /// One warning a second about key requests, however many deltas a peer sends without
    /// their reference.
    noisy: RateLimit,
}

impl DeltaInverse {
    fn is_newer(&self, seq: u64) -> bool {
        self.held_seq.is_none_or(|h| seq > h)
    }

    /// Whether a newer delta dropped at `now` should ask (again) for a key frame.
    fn request_due(&self, now: Instant) -> bool {
        match self.requested_at {
            None => true,
            Some(t) => {
                self.drops_since_request >= RETRY_AFTER_DROPS
                    || self
                        .response
                        .is_some_and(|r| now.saturating_duration_since(t) > r.saturating_mul(2))
            }
        }
    }
}

impl Half for DeltaInverse {
    fn handle_frame(
        &mut self,
        now: Instant,
        mut frame: Frame,
        out: &mut Output,
    ) -> Result<(), ModuleError> {
        let header = Header::parse(frame.payload())?;
        let seq = frame.meta.seq;
        match header {
            Header::Key => {
                frame.pop_header(KEY_LEN);
                self.key_frames += 1;
                // A late (reordered) key frame is delivered, but the newer reference stays.
                if self.is_newer(seq) {
                    self.held.clear();
                    self.held.extend_from_slice(frame.payload());
                    self.held_seq = Some(seq);
                    self.drops_since_request = 0;
                    if let Some(t) = self.requested_at.take() {
                        self.response = Some(now.saturating_duration_since(t));
                    }
                }
                out.push(frame);
            }
            Header::Delta { reference } => {
                frame.pop_header(DELTA_LEN);
                if self.held_seq == Some(reference) && self.held.len() == frame.len() {
                    for (p, h) in frame.payload_mut().iter_mut().zip(self.held.iter_mut()) {
                        *p ^= *h;
                        *h = *p;
                    }
                    self.held_seq = Some(seq);
                    self.delta_frames += 1;
                    out.push(frame);
                    return Ok(());
                }
                self.missing_reference += 1;
                if !self.is_newer(seq) {
                    // Late or duplicated: the inverse has already moved past it.
                    tracing::debug!(
                        stream = frame.meta.stream,
                        seq,
                        reference,
                        held = ?self.held_seq,
                        "delta: stale delta dropped"
                    );
                    return Ok(());
                }
                self.drops_since_request += 1;
                if self.request_due(now) {
                    self.key_requests += 1;
                    self.drops_since_request = 0;
                    self.requested_at = Some(now);
                    if let Some(suppressed) = self.noisy.admit(now) {
                        tracing::warn!(
                                suppressed,
                                stream = frame.meta.stream,
                            seq,
                            reference,
                            held = ?self.held_seq,
                            len = frame.len(),
                            held_len = self.held.len(),
                            "delta: reference frame missing; frame dropped, key frame requested"
                        );
                    }
                    let req = KeyRequest {
                        last: self.held_seq,
                    };
                    out.control(req.emit().to_vec());
                } else {
                    tracing::debug!(
                        stream = frame.meta.stream,
                        seq,
                        reference,
                        "delta: waiting for a key frame; frame dropped"
                    );
                }
            }
        }
        Ok(())
    }

    fn stats(&self) -> HalfStats {
        HalfStats {
            drops: self.missing_reference,
            queue_depth: 0,
            counters: vec![
                ("key_frames", self.key_frames),
                ("delta_frames", self.delta_frames),
                ("missing_reference", self.missing_reference),
                ("key_requests", self.key_requests),
            ],
        }
    }
}

//! Source half of `average`: combines windows of records into one record.

use super::layout::{fields_text, Accumulator, Field};
use ndd_core::{Frame, FrameError, Half, HalfStats, ModuleError, Output};
use std::time::{Duration, Instant};

/// Collects records until the window is full (`count`) or old (`window`), then emits one
/// combined record carrying the meta of the window's last frame.
#[derive(Debug)]
pub struct AverageForward {
    acc: Accumulator,
    layout: String,
    count: u64,
    window: Option<Duration>,
    deadline: Option<Instant>,
    /// The newest frame of the window: its buffer and meta carry the emitted record.
    last: Option<Frame>,
    frames_held: u64,
    records_in: u64,
    records_out: u64,
}

impl AverageForward {
    /// A forward half for records of `fields`; `count` = 0 means no record limit, `window` =
    /// `None` no time limit (at least one must be set, see `AverageConfig::validate`).
    pub fn new(acc: Accumulator, fields: &[Field], count: u64, window: Option<Duration>) -> Self {
        AverageForward {
            acc,
            layout: fields_text(fields),
            count,
            window,
            deadline: None,
            last: None,
            frames_held: 0,
            records_in: 0,
            records_out: 0,
        }
    }

    fn emit(&mut self, out: &mut Output) {
        self.deadline = None;
        self.frames_held = 0;
        let Some(mut frame) = self.last.take() else {
            return;
        };
        let n = self.acc.record_len();
        frame.truncate(n);
        if self.acc.finish(frame.payload_mut()) {
            self.records_out += 1;
            out.push(frame);
        }
    }
}

impl Half for AverageForward {
    fn handle_frame(
        &mut self,
        now: Instant,
        frame: Frame,
        out: &mut Output,
    ) -> Result<(), ModuleError> {
        let len = frame.len();
        let rec = self.acc.record_len();
        if len == 0 || !len.is_multiple_of(rec) {
            return Err(ModuleError::from(FrameError::NotWholeRecords {
                pair: super::PAIR,
                len,
                record_len: rec,
                layout: self.layout.clone(),
            }));
        }
        // A window whose time is up closes before this frame opens the next one.
        if self.deadline.is_some_and(|d| d <= now) {
            self.emit(out);
        }
        if self.acc.is_empty() {
            self.deadline = self.window.map(|w| now + w);
        }
        for r in frame.payload().chunks_exact(rec) {
            self.acc.add(r);
        }
        self.records_in += (len / rec) as u64;
        self.frames_held += 1;
        self.last = Some(frame);
        if self.count > 0 && self.acc.len() >= self.count {
            self.emit(out);
        }
        Ok(())
    }

    fn handle_control(
        &mut self,
        _now: Instant,
        msg: bytes::Bytes,
        _out: &mut Output,
    ) -> Result<(), ModuleError> {
        Err(super::no_control(msg.len()))
    }

    fn handle_timeout(&mut self, now: Instant, out: &mut Output) {
        if self.deadline.is_some_and(|d| d <= now) {
            self.emit(out);
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.deadline
    }

    fn flush(&mut self, out: &mut Output) {
        self.emit(out);
    }

    fn stats(&self) -> HalfStats {
        HalfStats {
            drops: 0,
            queue_depth: self.frames_held,
            counters: vec![
                ("records_in", self.records_in),
                ("records_out", self.records_out),
            ],
        }
    }
}

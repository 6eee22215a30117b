//! A stack: the halves of one stream on one side, run in order as plain function calls.
//!
//! The user writes the list of pairs once, top to bottom. The source side runs the forward
//! halves in that order; the sink side runs the inverse halves in reverse order. Control
//! messages are addressed by the pair's index in the user's list (its *layer*), which is the
//! same number on both sides.

use crate::error::ControlError;
use crate::frame::Frame;
use crate::half::{Half, HalfStats, ModuleError, Output, Pair};
use bytes::Bytes;
use std::collections::VecDeque;
use std::fmt;
use std::time::Instant;
use thiserror::Error;

/// Which end of a stream a stack runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Produces the stream: runs forward halves, layer 0 first.
    Source,
    /// Consumes the stream: runs inverse halves, last layer first.
    Sink,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Source => "source",
            Role::Sink => "sink",
        })
    }
}

/// A module error, located.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("stream \"{stream}\" layer {layer} ({module}, {role} side): {error}")]
pub struct StackError {
    /// Stream name.
    pub stream: String,
    /// Layer index in the user's list.
    pub layer: usize,
    /// Pair name.
    pub module: &'static str,
    /// Side of the stream.
    pub role: Role,
    /// What went wrong.
    pub error: ModuleError,
}

/// Statistics of one layer of a stack.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LayerStats {
    /// Layer index in the user's list.
    pub layer: usize,
    /// Pair name.
    pub module: &'static str,
    /// Frames handed to this half.
    pub frames_in: u64,
    /// Bytes handed to this half.
    pub bytes_in: u64,
    /// Frames this half passed on.
    pub frames_out: u64,
    /// Bytes this half passed on.
    pub bytes_out: u64,
    /// Control messages received from the twin.
    pub control_in: u64,
    /// Control messages sent to the twin.
    pub control_out: u64,
    /// What the half itself reports.
    pub half: HalfStats,
}

struct Layer {
    index: usize,
    module: &'static str,
    half: Box<dyn Half>,
    stats: LayerStats,
}

/// The halves of one stream on one side. See the module docs.
pub struct Stack {
    role: Role,
    stream: String,
    /// In execution order: list order for a source, reversed for a sink.
    layers: Vec<Layer>,
    out_frames: VecDeque<Frame>,
    out_control: VecDeque<(usize, Bytes)>,
    cur: Vec<Frame>,
    next: Vec<Frame>,
    scratch: Output,
}

impl fmt::Debug for Stack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stack")
            .field("role", &self.role)
            .field("stream", &self.stream)
            .field(
                "layers",
                &self.layers.iter().map(|l| l.module).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Stack {
    /// Builds the stack of `role` for stream `stream` from the pairs in the user's order.
    pub fn build(role: Role, stream: &str, pairs: &[&dyn Pair]) -> Result<Stack, StackError> {
        let mut halves = Vec::with_capacity(pairs.len());
        for (index, pair) in pairs.iter().enumerate() {
            let half = match role {
                Role::Source => pair.forward(),
                Role::Sink => pair.inverse(),
            }
            .map_err(|error| StackError {
                stream: stream.to_string(),
                layer: index,
                module: pair.name(),
                role,
                error,
            })?;
            halves.push((pair.name(), half));
        }
        Ok(Stack::from_halves(role, stream, halves))
    }

    /// Builds a stack from halves already made, given in the user's list order (the sink
    /// reverses them itself).
    pub fn from_halves(
        role: Role,
        stream: &str,
        halves: Vec<(&'static str, Box<dyn Half>)>,
    ) -> Stack {
        let mut layers: Vec<Layer> = halves
            .into_iter()
            .enumerate()
            .map(|(index, (module, half))| Layer {
                index,
                module,
                half,
                stats: LayerStats {
                    layer: index,
                    module,
                    ..LayerStats::default()
                },
            })
            .collect();
        if role == Role::Sink {
            layers.reverse();
        }
        Stack {
            role,
            stream: stream.to_string(),
            layers,
            out_frames: VecDeque::new(),
            out_control: VecDeque::new(),
            cur: Vec::new(),
            next: Vec::new(),
            scratch: Output::default(),
        }
    }

    /// Source or sink.
    pub fn role(&self) -> Role {
        self.role
    }

    /// Number of layers.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// True for a stack without pairs (frames pass straight through).
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// Pair names in the user's list order.
    pub fn modules(&self) -> Vec<&'static str> {
        let mut v: Vec<_> = self.layers.iter().map(|l| l.module).collect();
        if self.role == Role::Sink {
            v.reverse();
        }
        v
    }

    fn position_of(&self, layer: usize) -> Option<usize> {
        match self.role {
            Role::Source if layer < self.layers.len() => Some(layer),
            Role::Sink if layer < self.layers.len() => Some(self.layers.len() - 1 - layer),
            _ => None,
        }
    }

    fn error(&self, pos: usize, error: ModuleError) -> StackError {
        StackError {
            stream: self.stream.clone(),
            layer: self.layers[pos].index,
            module: self.layers[pos].module,
            role: self.role,
            error,
        }
    }

    /// A frame enters the stack at the top (from the source endpoint, or from the link on
    /// the sink side).
    pub fn handle_frame(&mut self, now: Instant, frame: Frame) -> Result<(), StackError> {
        if self.layers.is_empty() {
            self.out_frames.push_back(frame);
            return Ok(());
        }
        self.cur.push(frame);
        self.run(now, 0)
    }

    /// A control message for layer `layer` (the user's index) from the peer.
    pub fn handle_control(
        &mut self,
        now: Instant,
        layer: usize,
        msg: Bytes,
    ) -> Result<(), StackError> {
        let pos = self.position_of(layer).ok_or_else(|| StackError {
            stream: self.stream.clone(),
            layer,
            module: "?",
            role: self.role,
            error: ModuleError::from(ControlError::NoLayer {
                layer,
                layers: self.layers.len(),
            }),
        })?;
        let l = &mut self.layers[pos];
        l.stats.control_in += 1;
        let res = l.half.handle_control(now, msg, &mut self.scratch);
        self.collect(pos);
        if let Err(e) = res {
            return Err(self.error(pos, e));
        }
        self.run(now, pos + 1)
    }

    /// Runs every half whose deadline has passed.
    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), StackError> {
        for pos in 0..self.layers.len() {
            let due = self.layers[pos]
                .half
                .poll_timeout()
                .is_some_and(|t| t <= now);
            if due {
                self.layers[pos].half.handle_timeout(now, &mut self.scratch);
                self.collect(pos);
            }
            // Frames released here continue through the layers below.
            self.run(now, pos + 1)?;
        }
        Ok(())
    }

    /// Whether every half takes another frame without dropping one ([`Half::ready`]).
    pub fn ready(&self) -> bool {
        self.layers.iter().all(|l| l.half.ready())
    }

    /// The earliest deadline of any half.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.layers
            .iter()
            .filter_map(|l| l.half.poll_timeout())
            .min()
    }

    /// Flushes every half in order, so everything held comes out of the bottom.
    pub fn flush(&mut self, now: Instant) -> Result<(), StackError> {
        for pos in 0..self.layers.len() {
            self.layers[pos].half.flush(&mut self.scratch);
            self.collect(pos);
            self.run(now, pos + 1)?;
        }
        Ok(())
    }

    /// The next frame out of the bottom of the stack (to the link, or to the sink endpoint).
    pub fn poll_frame(&mut self) -> Option<Frame> {
        self.out_frames.pop_front()
    }

    /// The next control message for the peer, with the layer it is addressed to.
    pub fn poll_control(&mut self) -> Option<(usize, Bytes)> {
        self.out_control.pop_front()
    }

    /// Per-layer statistics, in the user's list order.
    pub fn stats(&self) -> Vec<LayerStats> {
        let mut v: Vec<LayerStats> = self
            .layers
            .iter()
            .map(|l| LayerStats {
                half: l.half.stats(),
                ..l.stats.clone()
            })
            .collect();
        if self.role == Role::Sink {
            v.reverse();
        }
        v
    }

    /// Moves what the half at `pos` wrote into `scratch` to `cur` (frames for the next
    /// position) and to the control queue.
    fn collect(&mut self, pos: usize) {
        let l = &mut self.layers[pos];
        for msg in self.scratch.control.drain(..) {
            l.stats.control_out += 1;
            self.out_control.push_back((l.index, msg));
        }
        for f in self.scratch.frames.drain(..) {
            l.stats.frames_out += 1;
            l.stats.bytes_out += f.len() as u64;
            self.cur.push(f);
        }
    }

    /// Feeds the frames in `cur` through positions `from..`.
    fn run(&mut self, now: Instant, from: usize) -> Result<(), StackError> {
        for pos in from..self.layers.len() {
            if self.cur.is_empty() {
                return Ok(());
            }
            std::mem::swap(&mut self.cur, &mut self.next);
            let mut batch = std::mem::take(&mut self.next);
            let mut failed = None;
            for frame in batch.drain(..) {
                let l = &mut self.layers[pos];
                l.stats.frames_in += 1;
                l.stats.bytes_in += frame.len() as u64;
                if failed.is_some() {
                    continue;
                }
                if let Err(e) = l.half.handle_frame(now, frame, &mut self.scratch) {
                    failed = Some(e);
                }
                // Control goes out at once, ahead of any frame still in the stack.
                self.collect(pos);
            }
            self.next = batch;
            if let Some(e) = failed {
                self.cur.clear();
                return Err(self.error(pos, e));
            }
        }
        self.out_frames.extend(self.cur.drain(..));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{ForeignError, FrameError};
    use crate::frame::Meta;

    /// Forward appends its tag to the payload; inverse checks and removes it. Control "ping"
    /// is answered with "pong:<tag>" and counted.
    struct Tag {
        tag: u8,
        inverse: bool,
        controls: u64,
    }

    impl Half for Tag {
        fn handle_frame(
            &mut self,
            _now: Instant,
            mut f: Frame,
            out: &mut Output,
        ) -> Result<(), ModuleError> {
            if self.inverse {
                match f.pop_header(1) {
                    Some(&[t]) if t == self.tag => {}
                    other => {
                        return Err(ModuleError::from(FrameError::Foreign(ForeignError::new(
                            format!("expected tag {} got {other:?}", self.tag),
                        ))))
                    }
                }
                out.control(format!("seen:{}", self.tag as char).into_bytes());
            } else {
                f.push_header(&[self.tag]);
            }
            out.push(f);
            Ok(())
        }
        fn handle_control(
            &mut self,
            _now: Instant,
            msg: Bytes,
            out: &mut Output,
        ) -> Result<(), ModuleError> {
            self.controls += 1;
            if &msg[..] == b"bad" {
                return Err(ModuleError::from(ControlError::Foreign(ForeignError::new(
                    "bad",
                ))));
            }
            out.control(format!("pong:{}", self.tag as char).into_bytes());
            Ok(())
        }
        fn stats(&self) -> HalfStats {
            HalfStats {
                counters: vec![("controls", self.controls)],
                ..HalfStats::default()
            }
        }
    }

    struct TagPair(u8);
    impl Pair for TagPair {
        fn name(&self) -> &'static str {
            "tag"
        }
        fn id(&self) -> u16 {
            99
        }
        fn describe(&self) -> String {
            format!("tag(t={})", self.0)
        }
        fn forward(&self) -> Result<Box<dyn Half>, ModuleError> {
            Ok(Box::new(Tag {
                tag: self.0,
                inverse: false,
                controls: 0,
            }))
        }
        fn inverse(&self) -> Result<Box<dyn Half>, ModuleError> {
            Ok(Box::new(Tag {
                tag: self.0,
                inverse: true,
                controls: 0,
            }))
        }
    }

    fn pairs() -> Vec<TagPair> {
        vec![TagPair(b'a'), TagPair(b'b'), TagPair(b'c')]
    }

    fn build(role: Role) -> Stack {
        let p = pairs();
        let refs: Vec<&dyn Pair> = p.iter().map(|p| p as &dyn Pair).collect();
        Stack::build(role, "events", &refs).unwrap()
    }

    #[test]
    fn source_runs_list_order_and_sink_undoes_in_reverse() {
        let now = Instant::now();
        let (mut src, mut sink) = (build(Role::Source), build(Role::Sink));
        assert_eq!(sink.modules(), vec!["tag", "tag", "tag"]);
        src.handle_frame(now, Frame::new(Meta::default(), b"x"))
            .unwrap();
        let wire = src.poll_frame().unwrap();
        // a runs first, so c's header is outermost.
        assert_eq!(wire.payload(), b"cbax");
        sink.handle_frame(now, wire).unwrap();
        assert_eq!(sink.poll_frame().unwrap().payload(), b"x");
        // Inverse halves ran c, b, a: their control messages name their own layer.
        let ctl: Vec<(usize, Bytes)> = std::iter::from_fn(|| sink.poll_control()).collect();
        assert_eq!(
            ctl,
            vec![
                (2, Bytes::from_static(b"seen:c")),
                (1, Bytes::from_static(b"seen:b")),
                (0, Bytes::from_static(b"seen:a"))
            ]
        );
    }

    #[test]
    fn control_reaches_the_addressed_layer_only() {
        let now = Instant::now();
        let mut src = build(Role::Source);
        src.handle_control(now, 1, Bytes::from_static(b"ping"))
            .unwrap();
        assert_eq!(src.poll_control(), Some((1, Bytes::from_static(b"pong:b"))));
        let st = src.stats();
        assert_eq!(st[1].control_in, 1);
        assert_eq!(st[1].control_out, 1);
        assert_eq!(st[0].half.counters, vec![("controls", 0)]);
        assert_eq!(st[1].half.counters, vec![("controls", 1)]);
    }

    #[test]
    fn control_to_missing_layer_is_an_error_not_a_panic() {
        let mut src = build(Role::Source);
        let e = src
            .handle_control(Instant::now(), 7, Bytes::new())
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "stream \"events\" layer 7 (?, source side): malformed control message: no layer 7 in a stack of 3"
        );
    }

    #[test]
    fn module_error_names_stream_layer_and_module() {
        let now = Instant::now();
        let mut sink = build(Role::Sink);
        let e = sink
            .handle_frame(now, Frame::new(Meta::default(), b"cbZx"))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "stream \"events\" layer 0 (tag, sink side): malformed frame: expected tag 97 got Some([90])"
        );
        let e = sink
            .handle_control(now, 2, Bytes::from_static(b"bad"))
            .unwrap_err();
        assert_eq!(e.layer, 2);
    }

    #[test]
    fn empty_stack_passes_frames_and_counts_nothing() {
        let mut s = Stack::from_halves(Role::Sink, "x", vec![]);
        s.handle_frame(Instant::now(), Frame::new(Meta::default(), b"q"))
            .unwrap();
        assert_eq!(s.poll_frame().unwrap().payload(), b"q");
        assert!(s.stats().is_empty());
        assert_eq!(s.poll_timeout(), None);
    }

    #[test]
    fn stats_count_frames_and_bytes_per_layer() {
        let now = Instant::now();
        let mut src = build(Role::Source);
        for _ in 0..3 {
            src.handle_frame(now, Frame::new(Meta::default(), b"xy"))
                .unwrap();
        }
        let st = src.stats();
        assert_eq!(
            (st[0].frames_in, st[0].bytes_in, st[0].bytes_out),
            (3, 6, 9)
        );
        assert_eq!((st[2].frames_out, st[2].bytes_out), (3, 15));
    }
}

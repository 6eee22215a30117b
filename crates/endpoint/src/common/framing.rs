//! Framings: how a byte stream (a file, stdin, stdout) is cut into frames and put back together.
//!
//! Sans-IO: [`FrameDecoder`] takes bytes in whatever chunks they arrive and hands out frames;
//! [`encode`] appends one frame to an output buffer. For `lines` and `length` the frames decoded
//! do not depend on how the input was split into chunks (property-tested below); for `raw` a
//! frame *is* a chunk, so only the concatenation is preserved.
//!
//! | framing | input | output |
//! |---|---|---|
//! | `raw` | one frame per read chunk (at most [`RAW_CHUNK`] bytes) | the bytes as they are |
//! | `lines` | one frame per `\n`-terminated line, `\n` kept; a final unterminated line is a frame; lines longer than [`MAX_LINE`] are split | the bytes as they are |
//! | `length` | a u32 big-endian length, then that many bytes; at most [`MAX_LENGTH_FRAME`] | the same |

use serde::{Deserialize, Serialize};
use std::fmt;

/// Largest frame the `raw` decoder produces (and the read size of byte-stream sources).
pub const RAW_CHUNK: usize = 64 * 1024;
/// Longest frame the `lines` decoder produces; a longer line becomes several frames.
pub const MAX_LINE: usize = 1024 * 1024;
/// Largest frame `length` framing accepts or produces.
pub const MAX_LENGTH_FRAME: usize = 64 * 1024 * 1024;

/// How a byte stream is cut into frames.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Framing {
    /// A frame per read chunk on input; bytes as they are on output.
    #[default]
    Raw,
    /// A frame per `\n`-terminated line (the `\n` kept).
    Lines,
    /// Each frame prefixed by its length as a u32 big-endian.
    Length,
}

impl Framing {
    /// The name used in config files.
    pub fn as_str(self) -> &'static str {
        match self {
            Framing::Raw => "raw",
            Framing::Lines => "lines",
            Framing::Length => "length",
        }
    }
}

impl fmt::Display for Framing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Input or output that violates its framing. Offsets count bytes from the start of the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    /// The input ended inside a length prefix.
    #[error("length framing: truncated length prefix at byte offset {offset} ({have} of 4 bytes before end of input)")]
    TruncatedPrefix {
        /// Offset of the prefix.
        offset: u64,
        /// Prefix bytes present.
        have: usize,
    },
    /// The input ended inside a frame body.
    #[error("length framing: truncated frame at byte offset {offset}: prefix says {len} bytes, input ends after {have}")]
    TruncatedBody {
        /// Offset of the frame's length prefix.
        offset: u64,
        /// Length the prefix announced.
        len: usize,
        /// Body bytes present.
        have: usize,
    },
    /// A length prefix announces more than the limit.
    #[error("length framing: frame at byte offset {offset} announces {len} bytes, over the {max}-byte limit")]
    TooLong {
        /// Offset of the frame's length prefix.
        offset: u64,
        /// Length the prefix announced.
        len: u64,
        /// The limit.
        max: usize,
    },
    /// A frame to encode is larger than `length` framing allows.
    #[error("length framing: cannot encode a {len}-byte frame, over the {max}-byte limit")]
    EncodeTooLong {
        /// Payload length.
        len: usize,
        /// The limit.
        max: usize,
    },
}

#[derive(Debug)]
enum State {
    Raw,
    Lines,
    Prefix { buf: [u8; 4], have: usize },
    Body { len: usize },
    Failed(FramingError),
}

/// Cuts a byte stream into frames, whatever chunks it arrives in. See the module docs.
#[derive(Debug)]
pub struct FrameDecoder {
    framing: Framing,
    max: usize,
    state: State,
    /// Part of a frame that spans chunks.
    pending: Vec<u8>,
    /// Bytes consumed so far.
    offset: u64,
    /// Offset where the current `length` frame (its prefix) starts.
    frame_start: u64,
}

impl FrameDecoder {
    /// A decoder with the standard limits ([`RAW_CHUNK`], [`MAX_LINE`], [`MAX_LENGTH_FRAME`]).
    pub fn new(framing: Framing) -> FrameDecoder {
        let max = match framing {
            Framing::Raw => RAW_CHUNK,
            Framing::Lines => MAX_LINE,
            Framing::Length => MAX_LENGTH_FRAME,
        };
        FrameDecoder::with_max(framing, max)
    }

    /// A decoder whose largest frame is `max` bytes (at least 1 for `raw` and `lines`): the
    /// chunk size for `raw`, the split length for `lines`, the limit for `length`.
    pub fn with_max(framing: Framing, max: usize) -> FrameDecoder {
        let (state, max) = match framing {
            Framing::Raw => (State::Raw, max.max(1)),
            Framing::Lines => (State::Lines, max.max(1)),
            Framing::Length => (
                State::Prefix {
                    buf: [0; 4],
                    have: 0,
                },
                max,
            ),
        };
        FrameDecoder {
            framing,
            max,
            state,
            pending: Vec::new(),
            offset: 0,
            frame_start: 0,
        }
    }

    /// The framing this decoder implements.
    pub fn framing(&self) -> Framing {
        self.framing
    }

    /// Bytes consumed so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Feeds `input` and returns the frames it completes.
    pub fn push(&mut self, input: &[u8]) -> Result<Vec<Vec<u8>>, FramingError> {
        let mut out = Vec::new();
        self.push_with(input, |f| out.push(f.to_vec()))?;
        Ok(out)
    }

    /// Feeds `input` and calls `emit` with each frame it completes. Frames that lie wholly
    /// inside `input` are passed as slices of it, without a copy.
    ///
    /// After an error the decoder stays failed and returns the same error.
    pub fn push_with(
        &mut self,
        input: &[u8],
        mut emit: impl FnMut(&[u8]),
    ) -> Result<(), FramingError> {
        match &mut self.state {
            State::Failed(e) => Err(e.clone()),
            State::Raw => {
                for chunk in input.chunks(self.max) {
                    emit(chunk);
                }
                self.offset += input.len() as u64;
                Ok(())
            }
            State::Lines => {
                self.push_lines(input, &mut emit);
                Ok(())
            }
            State::Prefix { .. } | State::Body { .. } => self.push_length(input, &mut emit),
        }
    }

    fn push_lines(&mut self, input: &[u8], emit: &mut impl FnMut(&[u8])) {
        let mut pos = 0;
        while pos < input.len() {
            // `pending` never holds a full frame, so there is always room.
            let room = self.max - self.pending.len();
            let window = &input[pos..input.len().min(pos + room)];
            let end = match window.iter().position(|&b| b == b'\n') {
                Some(i) => i + 1,
                None if window.len() == room => room,
                None => {
                    self.pending.extend_from_slice(window);
                    break;
                }
            };
            if self.pending.is_empty() {
                emit(&window[..end]);
            } else {
                self.pending.extend_from_slice(&window[..end]);
                emit(&self.pending);
                self.pending.clear();
            }
            pos += end;
        }
        self.offset += input.len() as u64;
    }

    fn push_length(
        &mut self,
        input: &[u8],
        emit: &mut impl FnMut(&[u8]),
    ) -> Result<(), FramingError> {
        let mut pos = 0;
        loop {
            match &mut self.state {
                State::Prefix { buf, have } => {
                    if pos == input.len() {
                        return Ok(());
                    }
                    let take = (4 - *have).min(input.len() - pos);
                    buf[*have..*have + take].copy_from_slice(&input[pos..pos + take]);
                    *have += take;
                    pos += take;
                    self.offset += take as u64;
                    if *have < 4 {
                        continue;
                    }
                    let len = u64::from(u32::from_be_bytes(*buf));
                    if len > self.max as u64 {
                        let e = FramingError::TooLong {
                            offset: self.frame_start,
                            len,
                            max: self.max,
                        };
                        self.state = State::Failed(e.clone());
                        return Err(e);
                    }
                    // len <= max, so it fits in usize.
                    self.state = State::Body { len: len as usize };
                }
                State::Body { len } => {
                    let len = *len;
                    let avail = input.len() - pos;
                    if self.pending.is_empty() && avail >= len {
                        emit(&input[pos..pos + len]);
                        pos += len;
                        self.offset += len as u64;
                    } else {
                        if avail == 0 {
                            return Ok(());
                        }
                        let take = (len - self.pending.len()).min(avail);
                        self.pending.extend_from_slice(&input[pos..pos + take]);
                        pos += take;
                        self.offset += take as u64;
                        if self.pending.len() < len {
                            continue;
                        }
                        emit(&self.pending);
                        self.pending.clear();
                    }
                    self.frame_start = self.offset;
                    self.state = State::Prefix {
                        buf: [0; 4],
                        have: 0,
                    };
                }
                State::Failed(e) => return Err(e.clone()),
                State::Raw | State::Lines => return Ok(()),
            }
        }
    }

    /// Signals the end of input and returns the last frames (a final unterminated line).
    /// For `length`, input that ends inside a frame is an error naming its offset.
    pub fn finish(&mut self) -> Result<Vec<Vec<u8>>, FramingError> {
        let mut out = Vec::new();
        self.finish_with(|f| out.push(f.to_vec()))?;
        Ok(out)
    }

    /// [`FrameDecoder::finish`], calling `emit` with each last frame. The decoder is then
    /// ready for a new stream (unless it failed).
    pub fn finish_with(&mut self, mut emit: impl FnMut(&[u8])) -> Result<(), FramingError> {
        let result = match &self.state {
            State::Failed(e) => return Err(e.clone()),
            State::Raw => Ok(()),
            State::Lines => {
                if !self.pending.is_empty() {
                    emit(&self.pending);
                }
                Ok(())
            }
            State::Prefix { have: 0, .. } => Ok(()),
            State::Prefix { have, .. } => Err(FramingError::TruncatedPrefix {
                offset: self.frame_start,
                have: *have,
            }),
            State::Body { len } => Err(FramingError::TruncatedBody {
                offset: self.frame_start,
                len: *len,
                have: self.pending.len(),
            }),
        };
        if let Err(e) = &result {
            self.state = State::Failed(e.clone());
            return result;
        }
        let max = self.max;
        *self = FrameDecoder::with_max(self.framing, max);
        result
    }
}

/// Appends `payload` to `out` in `framing`. Only `length` can fail: a payload over
/// [`MAX_LENGTH_FRAME`] could not be read back.
pub fn encode(framing: Framing, payload: &[u8], out: &mut Vec<u8>) -> Result<(), FramingError> {
    if framing == Framing::Length {
        out.extend_from_slice(&length_prefix(payload.len())?);
    }
    out.extend_from_slice(payload);
    Ok(())
}

/// The `length` framing prefix of a `len`-byte frame.
pub(crate) fn length_prefix(len: usize) -> Result<[u8; 4], FramingError> {
    match u32::try_from(len) {
        Ok(n) if len <= MAX_LENGTH_FRAME => Ok(n.to_be_bytes()),
        _ => Err(FramingError::EncodeTooLong {
            len,
            max: MAX_LENGTH_FRAME,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn decode_all(mut d: FrameDecoder, chunks: &[&[u8]]) -> Result<Vec<Vec<u8>>, FramingError> {
        let mut out = Vec::new();
        for c in chunks {
            out.extend(d.push(c)?);
        }
        out.extend(d.finish()?);
        Ok(out)
    }

    fn v(s: &[&str]) -> Vec<Vec<u8>> {
        s.iter().map(|s| s.as_bytes().to_vec()).collect()
    }

    fn split_at_points<'a>(data: &'a [u8], points: &[usize]) -> Vec<&'a [u8]> {
        let mut cuts: Vec<usize> = points.iter().map(|p| p % (data.len() + 1)).collect();
        cuts.sort_unstable();
        let mut out = Vec::new();
        let mut prev = 0;
        for c in cuts {
            out.push(&data[prev..c]);
            prev = c;
        }
        out.push(&data[prev..]);
        out
    }

    #[test]
    fn raw_is_a_frame_per_chunk_split_at_max() {
        let d = FrameDecoder::with_max(Framing::Raw, 4);
        let out = decode_all(d, &[b"abcdefghij", b"", b"kl"]).unwrap();
        assert_eq!(out, v(&["abcd", "efgh", "ij", "kl"]));
    }

    #[test]
    fn lines_keep_newline_and_final_unterminated_line() {
        let d = FrameDecoder::new(Framing::Lines);
        let out = decode_all(d, &[b"one\ntw", b"o\n\nthr", b"ee"]).unwrap();
        assert_eq!(out, v(&["one\n", "two\n", "\n", "three"]));
    }

    #[test]
    fn lines_longer_than_max_are_split() {
        let d = FrameDecoder::with_max(Framing::Lines, 4);
        let out = decode_all(d, &[b"abcdefghij\nabc\nabcd\n"]).unwrap();
        assert_eq!(
            out,
            v(&["abcd", "efgh", "ij\n", "abc\n", "abcd", "\n"]),
            "a line of exactly max bytes including its newline stays whole"
        );
    }

    #[test]
    fn length_round_trips_including_empty_frames() {
        let frames = v(&["", "a", "hello", ""]);
        let mut wire = Vec::new();
        for f in &frames {
            encode(Framing::Length, f, &mut wire).unwrap();
        }
        assert_eq!(&wire[..4], &[0, 0, 0, 0]);
        assert_eq!(&wire[4..9], &[0, 0, 0, 1, b'a']);
        let out = decode_all(FrameDecoder::new(Framing::Length), &[&wire]).unwrap();
        assert_eq!(out, frames);
    }

    #[test]
    fn length_truncated_prefix_names_offset() {
        let mut wire = Vec::new();
        encode(Framing::Length, b"abc", &mut wire).unwrap();
        wire.extend_from_slice(&[0, 0]);
        let e = decode_all(FrameDecoder::new(Framing::Length), &[&wire]).unwrap_err();
        assert_eq!(e, FramingError::TruncatedPrefix { offset: 7, have: 2 });
        assert_eq!(
            e.to_string(),
            "length framing: truncated length prefix at byte offset 7 (2 of 4 bytes before end of input)"
        );
    }

    #[test]
    fn length_truncated_body_names_offset() {
        let mut wire = Vec::new();
        encode(Framing::Length, b"abc", &mut wire).unwrap();
        encode(Framing::Length, b"defgh", &mut wire).unwrap();
        wire.truncate(wire.len() - 2);
        let e = decode_all(
            FrameDecoder::new(Framing::Length),
            &[&wire[..9], &wire[9..]],
        )
        .unwrap_err();
        assert_eq!(
            e,
            FramingError::TruncatedBody {
                offset: 7,
                len: 5,
                have: 3
            }
        );
        assert!(e.to_string().contains("byte offset 7"), "{e}");
    }

    #[test]
    fn length_over_limit_is_an_error_and_sticks() {
        let mut d = FrameDecoder::new(Framing::Length);
        let mut wire = Vec::new();
        encode(Framing::Length, b"ok", &mut wire).unwrap();
        wire.extend_from_slice(&(64u32 * 1024 * 1024 + 1).to_be_bytes());
        let e = d.push(&wire).unwrap_err();
        assert_eq!(
            e,
            FramingError::TooLong {
                offset: 6,
                len: 64 * 1024 * 1024 + 1,
                max: MAX_LENGTH_FRAME
            }
        );
        assert_eq!(d.push(b"more").unwrap_err(), e);
        assert_eq!(d.finish().unwrap_err(), e);
    }

    #[test]
    fn length_all_ones_prefix_is_rejected_not_allocated() {
        let e = decode_all(FrameDecoder::new(Framing::Length), &[&[0xff; 8]]).unwrap_err();
        assert!(matches!(e, FramingError::TooLong { offset: 0, .. }), "{e}");
    }

    #[test]
    fn encode_refuses_frames_over_the_length_limit() {
        assert_eq!(
            length_prefix(MAX_LENGTH_FRAME + 1),
            Err(FramingError::EncodeTooLong {
                len: MAX_LENGTH_FRAME + 1,
                max: MAX_LENGTH_FRAME
            })
        );
        assert_eq!(length_prefix(MAX_LENGTH_FRAME), Ok([4, 0, 0, 0]));
    }

    #[test]
    fn encode_raw_and_lines_write_bytes_as_is() {
        let mut out = Vec::new();
        encode(Framing::Raw, b"ab", &mut out).unwrap();
        encode(Framing::Lines, b"c\n", &mut out).unwrap();
        assert_eq!(out, b"abc\n");
    }

    #[test]
    fn finish_resets_for_a_new_stream() {
        let mut d = FrameDecoder::new(Framing::Lines);
        assert_eq!(d.push(b"a\nb").unwrap(), v(&["a\n"]));
        assert_eq!(d.finish().unwrap(), v(&["b"]));
        assert_eq!(d.push(b"c\n").unwrap(), v(&["c\n"]));
        assert_eq!(d.offset(), 2);
    }

    #[test]
    fn framing_names_parse_lowercase() {
        #[derive(Deserialize)]
        struct T {
            f: Framing,
        }
        for f in [Framing::Raw, Framing::Lines, Framing::Length] {
            let t: T = toml::from_str(&format!("f = \"{f}\"")).unwrap();
            assert_eq!(t.f, f);
        }
        assert!(toml::from_str::<T>("f = \"Lines\"").is_err());
    }

    proptest! {
        #[test]
        fn length_frames_do_not_depend_on_chunking(
            frames in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 0..12),
            points in prop::collection::vec(any::<usize>(), 0..10),
        ) {
            let mut wire = Vec::new();
            for f in &frames {
                encode(Framing::Length, f, &mut wire).unwrap();
            }
            let chunks = split_at_points(&wire, &points);
            let out = decode_all(FrameDecoder::new(Framing::Length), &chunks).unwrap();
            prop_assert_eq!(out, frames);
        }

        #[test]
        fn lines_frames_do_not_depend_on_chunking(
            data in prop::collection::vec(prop::sample::select(vec![b'a', b'b', b'\n']), 0..80),
            points in prop::collection::vec(any::<usize>(), 0..10),
            max in 1usize..8,
        ) {
            let whole = decode_all(FrameDecoder::with_max(Framing::Lines, max), &[&data]).unwrap();
            let chunks = split_at_points(&data, &points);
            let split = decode_all(FrameDecoder::with_max(Framing::Lines, max), &chunks).unwrap();
            prop_assert_eq!(&split, &whole);
            prop_assert_eq!(whole.concat(), data);
            for f in &whole {
                prop_assert!(!f.is_empty() && f.len() <= max);
                let nl = f.iter().filter(|&&b| b == b'\n').count();
                prop_assert!(nl == 0 || (nl == 1 && f.ends_with(b"\n")));
            }
        }

        #[test]
        fn raw_preserves_bytes_however_split(
            data in prop::collection::vec(any::<u8>(), 0..200),
            points in prop::collection::vec(any::<usize>(), 0..10),
        ) {
            let chunks = split_at_points(&data, &points);
            let out = decode_all(FrameDecoder::with_max(Framing::Raw, 16), &chunks).unwrap();
            prop_assert!(out.iter().all(|f| !f.is_empty() && f.len() <= 16));
            prop_assert_eq!(out.concat(), data);
        }

        #[test]
        fn length_decoder_never_panics_on_garbage(
            data in prop::collection::vec(any::<u8>(), 0..200),
            points in prop::collection::vec(any::<usize>(), 0..10),
        ) {
            let chunks = split_at_points(&data, &points);
            let _ = decode_all(FrameDecoder::with_max(Framing::Length, 64), &chunks);
        }
    }
}

//! Bundle payload format (also in docs/modules.md):
//!
//! ```text
//! varint  count                      number of frames, ≥ 1
//! count × entry:
//!   zigzag varint  seq delta          from the previous entry (the first: from the bundle's meta)
//!   zigzag varint  timestamp delta    ns, likewise
//!   varint         flags              the frame's flags
//!   varint         length             payload bytes of this frame
//! payloads, concatenated in entry order
//! ```
//! The bundle frame itself carries the meta (seq, timestamp) of its first frame, so the first
//! entry's deltas are normally 0. The lengths must add up exactly to the bytes that follow.

use super::PAIR;
use crate::varint::{self, unzigzag};
use ndd_core::{FrameError, Meta};

/// One frame's entry in a bundle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// The frame's meta (stream is the bundle's).
    pub meta: Meta,
    /// Offset of its payload in the bundle payload.
    pub offset: usize,
    /// Payload length.
    pub len: usize,
}

/// Appends the bundle header for frames with these metas and lengths.
pub fn encode_header(
    out: &mut Vec<u8>,
    base: &Meta,
    frames: impl Iterator<Item = (Meta, usize)>,
    count: usize,
) {
    varint::put_u64(out, count as u64);
    let (mut seq, mut ts) = (base.seq, base.timestamp_ns);
    for (m, len) in frames {
        varint::put_i64(out, m.seq.wrapping_sub(seq) as i64);
        varint::put_i64(out, m.timestamp_ns.wrapping_sub(ts) as i64);
        varint::put_u64(out, u64::from(m.flags));
        varint::put_u64(out, len as u64);
        seq = m.seq;
        ts = m.timestamp_ns;
    }
}

/// Parses a bundle payload carried by a frame with meta `base`.
pub fn decode(base: &Meta, buf: &[u8]) -> Result<Vec<Entry>, FrameError> {
    let (count, mut pos) = varint::get_u64(buf).ok_or(FrameError::Truncated {
        pair: PAIR,
        field: "count",
    })?;
    if count == 0 {
        return Err(FrameError::Invalid {
            pair: PAIR,
            rule: "count is 0",
        });
    }
    // Each entry takes at least 4 bytes: a count beyond that is a lie, refuse before allocating.
    if count > (buf.len() as u64) / 4 {
        return Err(FrameError::DoesNotFit {
            pair: PAIR,
            field: "count",
            value: count,
            len: buf.len(),
        });
    }
    let mut entries = Vec::with_capacity(count as usize);
    let (mut seq, mut ts) = (base.seq, base.timestamp_ns);
    let mut total: u64 = 0;
    for i in 0..count {
        let mut next_u = |field: &'static str| -> Result<u64, FrameError> {
            let (v, n) = varint::get_u64(&buf[pos..]).ok_or(FrameError::BadEntry {
                pair: PAIR,
                entry: i,
                field,
            })?;
            pos += n;
            Ok(v)
        };
        let dseq = unzigzag(next_u("seq delta")?);
        let dts = unzigzag(next_u("timestamp delta")?);
        let flags = next_u("flags")?;
        let len = next_u("length")?;
        seq = seq.wrapping_add(dseq as u64);
        ts = ts.wrapping_add(dts as u64);
        let flags = u16::try_from(flags).map_err(|_| FrameError::EntryTooWide {
            pair: PAIR,
            entry: i,
            field: "flags",
            value: flags,
            bits: 16,
        })?;
        total = total.saturating_add(len);
        entries.push(Entry {
            meta: Meta {
                stream: base.stream,
                seq,
                timestamp_ns: ts,
                flags,
            },
            offset: 0,
            len: len as usize,
        });
    }
    let rest = (buf.len() - pos) as u64;
    if total != rest {
        return Err(FrameError::LengthMismatch {
            pair: PAIR,
            what: "entry lengths",
            total,
            rest,
        });
    }
    let mut off = pos;
    for e in &mut entries {
        e.offset = off;
        off += e.len;
    }
    Ok(entries)
}

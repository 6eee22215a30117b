//! Clipboard records, the payload of an `x11-clipboard` stream: what one selection holds, in
//! each format the source could read (packet/repr style, no I/O).
//!
//! | bytes | field |
//! |---|---|
//! | 1 | version `1` |
//! | 1 | kind `0x00` (contents) |
//! | 1 | selection: `0` CLIPBOARD, `1` PRIMARY |
//! | 1 | count of formats, 0..=[`MAX_FORMATS`]; `0`: the selection was cleared |
//! | per format | name length u8 (1..=[`MAX_NAME`]), the name (printable ASCII: an X target such as `UTF8_STRING` or a MIME type such as `image/png`), data length u32 BE, the data |
//!
//! Nothing else may follow the last format. Names are unique within a record.

use std::fmt;

/// Version byte of every clipboard record.
pub const VERSION: u8 = 1;
/// Kind byte: a selection's contents.
pub const KIND_CONTENTS: u8 = 0x00;
/// Most formats in one record.
pub const MAX_FORMATS: usize = 8;
/// Longest format name.
pub const MAX_NAME: usize = 64;

/// Which X selection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Selection {
    /// `CLIPBOARD`: what Ctrl-C / Ctrl-V use.
    Clipboard,
    /// `PRIMARY`: the text last selected, pasted with the middle button.
    Primary,
}

impl Selection {
    /// Both, in wire order.
    pub const ALL: [Selection; 2] = [Selection::Clipboard, Selection::Primary];

    /// The wire byte.
    pub fn byte(self) -> u8 {
        match self {
            Selection::Clipboard => 0,
            Selection::Primary => 1,
        }
    }

    /// The X atom name.
    pub fn atom_name(self) -> &'static str {
        match self {
            Selection::Clipboard => "CLIPBOARD",
            Selection::Primary => "PRIMARY",
        }
    }
}

impl fmt::Display for Selection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.atom_name())
    }
}

/// What is wrong with a clipboard record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClipboardFrameError {
    /// The record ends early.
    #[error("clipboard record: {what} needs bytes {start}..{end}, the record has {got}")]
    Truncated {
        /// Which field.
        what: String,
        /// Where it starts.
        start: usize,
        /// Where it ends.
        end: usize,
        /// Record length.
        got: usize,
    },
    /// A version this build does not speak.
    #[error("clipboard record: unsupported version {0} (this build speaks version 1)")]
    Version(u8),
    /// Unknown kind byte.
    #[error("clipboard record: unknown kind {0:#04x} (known: 0x00 contents)")]
    UnknownKind(u8),
    /// Unknown selection byte.
    #[error("clipboard record: unknown selection {0} (0 = CLIPBOARD, 1 = PRIMARY)")]
    Selection(u8),
    /// Too many formats.
    #[error("clipboard record: {0} formats, more than {MAX_FORMATS}")]
    TooManyFormats(usize),
    /// A name that is empty, too long, not printable ASCII or given twice.
    #[error("clipboard record: format {index}: {reason}")]
    Name {
        /// Which format.
        index: usize,
        /// What is wrong.
        reason: String,
    },
    /// Bytes after the last format.
    #[error("clipboard record: {0} bytes after the last format")]
    Trailing(usize),
}

/// A selection's contents: `(format name, data)` pairs, none when the selection was cleared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contents {
    /// Which selection.
    pub selection: Selection,
    /// The formats, in the source's order of preference.
    pub formats: Vec<(String, Vec<u8>)>,
}

fn check_name(index: usize, name: &str, seen: &[&str]) -> Result<(), ClipboardFrameError> {
    let bad = |reason: String| ClipboardFrameError::Name { index, reason };
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(bad(format!(
            "name of {} bytes, not 1..={MAX_NAME}",
            name.len()
        )));
    }
    if !name.bytes().all(|b| (0x21..0x7f).contains(&b)) {
        return Err(bad(format!("name {name:?} is not printable ASCII")));
    }
    if seen.contains(&name) {
        return Err(bad(format!("name {name:?} given twice")));
    }
    Ok(())
}

impl Contents {
    /// The data of format `name`, if present.
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.formats
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, d)| d.as_slice())
    }

    /// Data bytes over all formats.
    pub fn data_len(&self) -> usize {
        self.formats.iter().map(|(_, d)| d.len()).sum()
    }

    /// Parses a record; checks every length, name and the end.
    pub fn parse(p: &[u8]) -> Result<Contents, ClipboardFrameError> {
        let field = |what: &str, start: usize, len: usize| -> Result<&[u8], ClipboardFrameError> {
            p.get(start..start + len)
                .ok_or_else(|| ClipboardFrameError::Truncated {
                    what: what.to_string(),
                    start,
                    end: start + len,
                    got: p.len(),
                })
        };
        let head = field("the 4-byte header", 0, 4)?;
        if head[0] != VERSION {
            return Err(ClipboardFrameError::Version(head[0]));
        }
        if head[1] != KIND_CONTENTS {
            return Err(ClipboardFrameError::UnknownKind(head[1]));
        }
        let selection = match head[2] {
            0 => Selection::Clipboard,
            1 => Selection::Primary,
            s => return Err(ClipboardFrameError::Selection(s)),
        };
        let count = usize::from(head[3]);
        if count > MAX_FORMATS {
            return Err(ClipboardFrameError::TooManyFormats(count));
        }
        let mut at = 4;
        let mut formats: Vec<(String, Vec<u8>)> = Vec::with_capacity(count);
        for index in 0..count {
            let n = usize::from(field(&format!("format {index} name length"), at, 1)?[0]);
            at += 1;
            let name = field(&format!("format {index} name"), at, n)?;
            let name = String::from_utf8_lossy(name).into_owned();
            let seen: Vec<&str> = formats.iter().map(|(n, _)| n.as_str()).collect();
            check_name(index, &name, &seen)?;
            at += n;
            let len = field(&format!("format {index} data length"), at, 4)?;
            let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
            at += 4;
            let data = field(&format!("format {index} ({name}) data"), at, len)?.to_vec();
            at += len;
            formats.push((name, data));
        }
        if at != p.len() {
            return Err(ClipboardFrameError::Trailing(p.len() - at));
        }
        Ok(Contents { selection, formats })
    }

    /// The record's bytes; checks what [`Contents::parse`] checks.
    pub fn emit(&self) -> Result<Vec<u8>, ClipboardFrameError> {
        if self.formats.len() > MAX_FORMATS {
            return Err(ClipboardFrameError::TooManyFormats(self.formats.len()));
        }
        let mut out = Vec::with_capacity(4 + self.data_len() + self.formats.len() * 70);
        out.extend_from_slice(&[
            VERSION,
            KIND_CONTENTS,
            self.selection.byte(),
            self.formats.len() as u8,
        ]);
        for (index, (name, data)) in self.formats.iter().enumerate() {
            let seen: Vec<&str> = self.formats[..index]
                .iter()
                .map(|(n, _)| n.as_str())
                .collect();
            check_name(index, name, &seen)?;
            let len = u32::try_from(data.len()).map_err(|_| ClipboardFrameError::Name {
                index,
                reason: format!("{} data bytes do not fit a u32 length", data.len()),
            })?;
            out.push(name.len() as u8);
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(&len.to_be_bytes());
            out.extend_from_slice(data);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fixture of docs/endpoints.md: CLIPBOARD holding "hi" as UTF8_STRING.
    const HI: &[u8] = &[
        0x01, 0x00, 0x00, 0x01, 0x0b, b'U', b'T', b'F', b'8', b'_', b'S', b'T', b'R', b'I', b'N',
        b'G', 0x00, 0x00, 0x00, 0x02, b'h', b'i',
    ];

    #[test]
    fn the_documented_fixture_round_trips() {
        let c = Contents::parse(HI).expect("parses");
        assert_eq!(c.selection, Selection::Clipboard);
        assert_eq!(c.get("UTF8_STRING"), Some(&b"hi"[..]));
        assert_eq!(c.emit().expect("emits"), HI);
        // A cleared PRIMARY.
        let cleared = Contents {
            selection: Selection::Primary,
            formats: vec![],
        };
        assert_eq!(cleared.emit().expect("emits"), [1, 0, 1, 0]);
        assert_eq!(Contents::parse(&[1, 0, 1, 0]), Ok(cleared));
    }

    #[test]
    fn every_truncation_and_bad_field_is_named() {
        for n in 0..HI.len() {
            let e = Contents::parse(&HI[..n]).expect_err("truncated");
            assert!(
                matches!(e, ClipboardFrameError::Truncated { .. }),
                "{n}: {e}"
            );
        }
        let mut p = HI.to_vec();
        p.push(0);
        assert_eq!(Contents::parse(&p), Err(ClipboardFrameError::Trailing(1)));
        let with = |i: usize, v: u8| {
            let mut p = HI.to_vec();
            p[i] = v;
            Contents::parse(&p).expect_err("bad").to_string()
        };
        assert!(with(0, 2).contains("unsupported version 2"));
        assert!(with(1, 7).contains("unknown kind 0x07"));
        assert!(with(2, 9).contains("unknown selection 9"));
        assert!(with(3, 9).contains("9 formats, more than 8"));
        assert!(with(4, 0).contains("format 0: name of 0 bytes"));
        assert!(with(5, b' ').contains("not printable ASCII"));
        let twice = Contents {
            selection: Selection::Clipboard,
            formats: vec![("a".into(), vec![]), ("a".into(), vec![1])],
        };
        assert!(twice
            .emit()
            .expect_err("dup")
            .to_string()
            .contains("given twice"));
    }

    #[test]
    fn arbitrary_bytes_never_panic_and_what_parses_emits_the_same() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 40) as usize;
            let mut p: Vec<u8> = (0..len).map(|i| (x >> (i % 8 * 8)) as u8).collect();
            if p.len() >= 4 {
                p[0] = 1;
                p[1] = 0;
                p[2] &= 1;
                p[3] %= 3;
            }
            if let Ok(c) = Contents::parse(&p) {
                assert_eq!(c.emit().expect("emits"), p);
            }
        }
    }
}

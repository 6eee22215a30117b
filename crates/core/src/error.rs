//! The causes a [`ModuleError`](crate::ModuleError) carries, and [`ParamError`], the error of
//! a pair's parameter check.
//!
//! Every cause a pair finds itself is a variant with the facts as fields; `pair` is the pair's
//! name and is printed first (`compress: unknown method 3`), so the text reads the same
//! wherever it ends up. A cause from outside ndd's own pairs (a foreign library, the program
//! of an external module, a pair written elsewhere) is a [`ForeignError`], which keeps the
//! foreign error value itself.

use std::error::Error as StdError;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use thiserror::Error;

/// Why a frame from the twin half (or from the layer before) cannot be processed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FrameError {
    /// The frame is empty: not even the first byte of the pair's header is there.
    #[error("{pair}: empty frame (no {missing})")]
    Empty {
        /// The pair.
        pair: &'static str,
        /// What the first byte would have been, e.g. `method byte`.
        missing: &'static str,
    },
    /// The frame is shorter than the header its first byte announces.
    #[error("{pair}: frame of {len} bytes is shorter than the {need}-byte {header} header")]
    ShortHeader {
        /// The pair.
        pair: &'static str,
        /// Frame length.
        len: usize,
        /// Header length.
        need: usize,
        /// Which header, e.g. `lz4`.
        header: &'static str,
    },
    /// A header field holds a value this side does not know (a codec id, a kind).
    #[error("{pair}: unknown {field} {value}")]
    UnknownValue {
        /// The pair.
        pair: &'static str,
        /// The field, e.g. `method`.
        field: &'static str,
        /// The value received.
        value: u64,
    },
    /// A field runs past the end of the frame.
    #[error("{pair}: truncated {field}")]
    Truncated {
        /// The pair.
        pair: &'static str,
        /// The field, e.g. `count`.
        field: &'static str,
    },
    /// A count announces more entries than the frame can hold (refused before allocating).
    #[error("{pair}: {field} {value} does not fit in {len} bytes")]
    DoesNotFit {
        /// The pair.
        pair: &'static str,
        /// The field, e.g. `count`.
        field: &'static str,
        /// The count announced.
        value: u64,
        /// Frame length.
        len: usize,
    },
    /// A field of one entry of a frame that carries several cannot be read.
    #[error("{pair}: entry {entry}: bad {field}")]
    BadEntry {
        /// The pair.
        pair: &'static str,
        /// Index of the entry.
        entry: u64,
        /// The field, e.g. `length`.
        field: &'static str,
    },
    /// A field of one entry holds a value wider than the field it decodes into.
    #[error("{pair}: entry {entry}: {field} {value} exceed {bits} bits")]
    EntryTooWide {
        /// The pair.
        pair: &'static str,
        /// Index of the entry.
        entry: u64,
        /// The field, e.g. `flags`.
        field: &'static str,
        /// The value received.
        value: u64,
        /// Width of the field.
        bits: u32,
    },
    /// The lengths the header announces do not add up to the bytes that follow it.
    #[error("{pair}: {what} add up to {total} bytes but {rest} follow")]
    LengthMismatch {
        /// The pair.
        pair: &'static str,
        /// Which lengths, e.g. `entry lengths`.
        what: &'static str,
        /// Their sum.
        total: u64,
        /// Bytes after the header.
        rest: u64,
    },
    /// A length the header announces exceeds a configured limit (refused before allocating).
    #[error("{pair}: {field} {value} exceeds {limit} {max}")]
    OverLimit {
        /// The pair.
        pair: &'static str,
        /// The field, e.g. `original length`.
        field: &'static str,
        /// The value received.
        value: u64,
        /// The parameter that sets the limit, e.g. `max_size`.
        limit: &'static str,
        /// The limit.
        max: u64,
    },
    /// The codec refuses the compressed data.
    #[error("{pair}: corrupt {codec} data: {source}")]
    Corrupt {
        /// The pair.
        pair: &'static str,
        /// The codec, e.g. `zstd`.
        codec: &'static str,
        /// The codec library's error.
        source: ForeignError,
    },
    /// The compressed data decompressed to another length than the header announces.
    #[error("{pair}: {codec} data decompressed to {len} bytes, {announced} announced")]
    Decompressed {
        /// The pair.
        pair: &'static str,
        /// The codec, e.g. `lz4`.
        codec: &'static str,
        /// Bytes produced.
        len: usize,
        /// Bytes announced.
        announced: usize,
    },
    /// The frame is not a whole number of fixed-size records.
    #[error(
        "{pair}: frame of {len} bytes is not a whole number of {record_len}-byte records \
         (expected {record_len}, {}, … bytes for layout [{layout}])",
        .record_len * 2
    )]
    NotWholeRecords {
        /// The pair.
        pair: &'static str,
        /// Frame length.
        len: usize,
        /// Record length.
        record_len: usize,
        /// The record layout as configured, e.g. `i16:avg, u16:or`.
        layout: String,
    },
    /// The cipher refuses to seal a frame this long.
    #[error("{pair}: a frame of {len} bytes is too large to seal")]
    TooLargeToSeal {
        /// The pair.
        pair: &'static str,
        /// Frame length.
        len: usize,
    },
    /// Any other rule of the pair's format is broken (or an internal step that cannot fail
    /// did); the text says which.
    #[error("{pair}: {rule}")]
    Invalid {
        /// The pair.
        pair: &'static str,
        /// The rule, e.g. `count is 0`.
        rule: &'static str,
    },
    /// A cause from outside ndd's pairs: an external module's program, a pair written
    /// elsewhere.
    #[error(transparent)]
    Foreign(ForeignError),
}

/// Why a control message from the twin half on the peer cannot be processed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ControlError {
    /// The pair defines no control messages: only a broken or hostile peer sends one.
    /// Refused by the default [`Half::handle_control`](crate::Half::handle_control) (`pair`
    /// is `None`) or by a pair that names itself; `len` is the message length, `None` when
    /// the half does not report it.
    #[error("{}", no_control(*.pair, *.len))]
    NoControl {
        /// The pair, when it refuses the message itself.
        pair: Option<&'static str>,
        /// Length of the refused message.
        len: Option<usize>,
    },
    /// The message is empty: not even a type byte.
    #[error("{pair}: empty control message")]
    Empty {
        /// The pair.
        pair: &'static str,
    },
    /// The type byte names no message this pair defines.
    #[error("{pair}: unknown control message type 0x{ty:02x}")]
    UnknownType {
        /// The pair.
        pair: &'static str,
        /// The type byte.
        ty: u8,
    },
    /// A field holds a value this side does not know (shown in decimal).
    #[error("{pair}: unknown {field} {value}")]
    UnknownValue {
        /// The pair.
        pair: &'static str,
        /// The field, e.g. `control message type`.
        field: &'static str,
        /// The value received.
        value: u64,
    },
    /// A message of a known type has the wrong length.
    #[error("{pair}: {what} is {len} bytes, expected {expected}")]
    WrongLength {
        /// The pair.
        pair: &'static str,
        /// The message, e.g. `ack message`.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The length its type has.
        expected: usize,
    },
    /// The same as [`ControlError::WrongLength`], worded as `delta` words it
    /// (`key request of 2 bytes, expected 9`).
    #[error("{pair}: {what} of {len} bytes, expected {expected}")]
    WrongSize {
        /// The pair.
        pair: &'static str,
        /// The message, e.g. `key request`.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The length its type has.
        expected: usize,
    },
    /// The message is addressed to a layer the stack does not have.
    #[error("no layer {layer} in a stack of {layers}")]
    NoLayer {
        /// The layer addressed.
        layer: usize,
        /// Layers in the stack.
        layers: usize,
    },
    /// A cause from outside ndd's pairs: an external module's program, a pair written
    /// elsewhere.
    #[error(transparent)]
    Foreign(ForeignError),
}

fn no_control(pair: Option<&str>, len: Option<usize>) -> String {
    match (pair, len) {
        (None, Some(n)) => format!("this pair defines no control messages (got one of {n} bytes)"),
        (None, None) => "this pair defines no control messages".to_string(),
        (Some(p), Some(n)) => format!("{p}: defines no control messages, got one of {n} bytes"),
        (Some(p), None) => format!("{p}: this pair has no control messages"),
    }
}

/// Why a half could not be built (or can no longer go on: a resource it was built with is
/// used up).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SetupError {
    /// A parameter is out of range or inconsistent.
    #[error(transparent)]
    Param(#[from] ParamError),
    /// A file the pair reads (a key, a passphrase) cannot be opened or read.
    #[error("{pair}: cannot read {what} {}: {source}", .path.display())]
    Read {
        /// The pair.
        pair: &'static str,
        /// Which file, e.g. `key file`.
        what: &'static str,
        /// The path as configured.
        path: PathBuf,
        /// The [`std::io::Error`].
        source: ForeignError,
    },
    /// A file the pair reads is not a regular file.
    #[error("{pair}: {what} {} is not a regular file", .path.display())]
    NotAFile {
        /// The pair.
        pair: &'static str,
        /// Which file, e.g. `key file`.
        what: &'static str,
        /// The path as configured.
        path: PathBuf,
    },
    /// A secret file others than its owner may read or write.
    #[error(
        "{pair}: {what} {} has permissions {mode:04o}, but it must be readable by its owner \
         only (0600); fix it with: chmod 600 {}",
        .path.display(),
        .path.display()
    )]
    Permissions {
        /// The pair.
        pair: &'static str,
        /// Which file, e.g. `key file`.
        what: &'static str,
        /// The path as configured.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// A key file whose length fits neither key form.
    #[error(
        "{pair}: key file {} holds {len} bytes, but a key is exactly {key_len} raw bytes or {} \
         hex digits (plus an optional newline)",
        .path.display(),
        .key_len * 2
    )]
    KeySize {
        /// The pair.
        pair: &'static str,
        /// The path as configured.
        path: PathBuf,
        /// File length.
        len: u64,
        /// Key length in bytes.
        key_len: usize,
    },
    /// A key file of `key_len` hex digits: half a key, written in hex.
    #[error(
        "{pair}: key file {} holds {key_len} hex digits (a {}-byte key), but a key is \
         {key_len} raw bytes or {} hex digits",
        .path.display(),
        .key_len / 2,
        .key_len * 2
    )]
    HalfKey {
        /// The pair.
        pair: &'static str,
        /// The path as configured.
        path: PathBuf,
        /// Key length in bytes.
        key_len: usize,
    },
    /// A key file of the hex length whose characters are not all hex digits.
    #[error(
        "{pair}: key file {} holds {} characters that are not all hex digits",
        .path.display(),
        .key_len * 2
    )]
    NotHex {
        /// The pair.
        pair: &'static str,
        /// The path as configured.
        path: PathBuf,
        /// Key length in bytes.
        key_len: usize,
    },
    /// A passphrase file longer than any passphrase.
    #[error(
        "{pair}: passphrase file {} holds {len} bytes; a passphrase is at most {max} bytes",
        .path.display()
    )]
    PassphraseTooLong {
        /// The pair.
        pair: &'static str,
        /// The path as configured.
        path: PathBuf,
        /// File length.
        len: u64,
        /// Longest passphrase.
        max: usize,
    },
    /// A passphrase too short to derive a key from.
    #[error(
        "{pair}: passphrase file {} holds a passphrase of {len} bytes; use at least {min}",
        .path.display()
    )]
    PassphraseTooShort {
        /// The pair.
        pair: &'static str,
        /// The path as configured.
        path: PathBuf,
        /// Passphrase length.
        len: usize,
        /// Shortest passphrase.
        min: usize,
    },
    /// A library the pair uses failed; `context` says at what (e.g. `zstd level 3`).
    #[error("{pair}: {context}: {source}")]
    Library {
        /// The pair.
        pair: &'static str,
        /// What the library was asked to do.
        context: String,
        /// The library's error.
        source: ForeignError,
    },
    /// A step failed that carries no further detail; the text says which (the system random
    /// number generator failed, a counter is used up).
    #[error("{pair}: {what}")]
    Failed {
        /// The pair.
        pair: &'static str,
        /// What failed.
        what: &'static str,
    },
    /// A cause from outside ndd's pairs: an external module's program that cannot be
    /// started, a pair written elsewhere.
    #[error(transparent)]
    Foreign(ForeignError),
}

/// A pair parameter (from a config file or built in code) that the pair refuses. The text
/// names the pair and the parameter, and says what is allowed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ParamError {
    /// A number outside its allowed range `min..=max`. When the upper bound is another
    /// parameter, `max_param` names it (and `max` is its value).
    #[error(
        "{pair}: {param} = {value} is out of range {min}..={max}{}",
        bound_note(*.min, *.max_param)
    )]
    OutOfRange {
        /// The pair.
        pair: &'static str,
        /// The parameter.
        param: &'static str,
        /// Its value (`i128` holds every integer parameter type exactly).
        value: i128,
        /// Smallest allowed value.
        min: i128,
        /// Largest allowed value.
        max: i128,
        /// The parameter whose value is the upper bound, if any.
        max_param: Option<&'static str>,
    },
    /// A number that must be a power of two.
    #[error("{pair}: {param} = {value} is not a power of two")]
    NotPowerOfTwo {
        /// The pair.
        pair: &'static str,
        /// The parameter.
        param: &'static str,
        /// Its value.
        value: u64,
    },
    /// A text value the pair refuses, with the reason.
    #[error("{pair}: {param} {value:?}: {reason}")]
    Invalid {
        /// The pair.
        pair: &'static str,
        /// The parameter (or the element of a list parameter, e.g. `field`).
        param: &'static str,
        /// Its value.
        value: String,
        /// What is wrong, e.g. `mode "or" needs an integer type`.
        reason: &'static str,
    },
    /// A list parameter that is empty where it must name something.
    #[error("{pair}: {param} must name {what}")]
    Missing {
        /// The pair.
        pair: &'static str,
        /// The parameter.
        param: &'static str,
        /// What it must name, e.g. `a program`.
        what: &'static str,
    },
    /// A list parameter with too few or too many elements.
    #[error("{pair}: {param} lists {len} {param}; allowed {min}..={max}")]
    Count {
        /// The pair.
        pair: &'static str,
        /// The parameter.
        param: &'static str,
        /// Elements given.
        len: usize,
        /// Fewest allowed.
        min: usize,
        /// Most allowed.
        max: usize,
    },
    /// Two parameters that cannot both be given.
    #[error("{pair}: {param} = {value:?} and {other} are mutually exclusive; give one")]
    Exclusive {
        /// The pair.
        pair: &'static str,
        /// The first parameter.
        param: &'static str,
        /// Its value.
        value: String,
        /// The other parameter.
        other: &'static str,
    },
    /// Two parameters of which exactly one must be set.
    #[error(
        "{pair}: set exactly one of {first} and {second} ({})",
        if *.both { "both are set" } else { "neither is set" }
    )]
    ExactlyOne {
        /// The pair.
        pair: &'static str,
        /// The first parameter.
        first: &'static str,
        /// The second parameter.
        second: &'static str,
        /// Both are set (else neither is).
        both: bool,
    },
    /// Two numbers of which at least one must be above 0, both 0.
    #[error(
        "{pair}: {first} and {second} are both 0; set {first} (1..={first_max}) or {second} \
         (1..={second_max})"
    )]
    BothZero {
        /// The pair.
        pair: &'static str,
        /// The first parameter.
        first: &'static str,
        /// Its largest value.
        first_max: u64,
        /// The second parameter.
        second: &'static str,
        /// Its largest value.
        second_max: u64,
    },
}

fn bound_note(min: i128, max_param: Option<&str>) -> String {
    match max_param {
        Some(p) => format!(" ({min}..={p})"),
        None => String::new(),
    }
}

impl ParamError {
    /// `Ok` when `value` is in `range`, else [`ParamError::OutOfRange`].
    pub fn check_range<T: Into<i128> + Copy>(
        pair: &'static str,
        param: &'static str,
        value: T,
        range: std::ops::RangeInclusive<T>,
    ) -> Result<(), ParamError> {
        let (value, min, max) = (value.into(), (*range.start()).into(), (*range.end()).into());
        if (min..=max).contains(&value) {
            return Ok(());
        }
        Err(ParamError::OutOfRange {
            pair,
            param,
            value,
            min,
            max,
            max_param: None,
        })
    }
}

/// An error from outside ndd's own vocabulary (a foreign library, the program of an external
/// module, a pair written elsewhere), kept as its own value behind an [`Arc`] so that the
/// errors holding it stay `Clone`. It displays as that error does; [`ForeignError::downcast_ref`]
/// gets the value back. Two compare equal when they display the same text (the foreign type
/// need not be comparable).
#[derive(Clone)]
pub struct ForeignError(Arc<dyn StdError + Send + Sync + 'static>);

impl ForeignError {
    /// Wraps `error` (any error type, or a message: `ForeignError::new("bad checksum")`).
    pub fn new(error: impl Into<Box<dyn StdError + Send + Sync + 'static>>) -> ForeignError {
        ForeignError(Arc::from(error.into()))
    }

    /// The wrapped error, if it is an `E`.
    pub fn downcast_ref<E: StdError + 'static>(&self) -> Option<&E> {
        self.0.downcast_ref::<E>()
    }
}

impl fmt::Debug for ForeignError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for ForeignError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}

impl StdError for ForeignError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.0.source()
    }
}

impl PartialEq for ForeignError {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.to_string() == other.0.to_string()
    }
}

impl Eq for ForeignError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_name_the_pair_and_the_facts() {
        let e = ParamError::check_range("bundle", "count", 0u32, 1..=65535).unwrap_err();
        assert_eq!(e.to_string(), "bundle: count = 0 is out of range 1..=65535");
        let e = ParamError::OutOfRange {
            pair: "buffer",
            param: "min",
            value: 11,
            min: 1,
            max: 10,
            max_param: Some("max"),
        };
        assert_eq!(
            e.to_string(),
            "buffer: min = 11 is out of range 1..=10 (1..=max)"
        );
        assert_eq!(
            ParamError::check_range("compress", "level", -3i32, 1..=19)
                .unwrap_err()
                .to_string(),
            "compress: level = -3 is out of range 1..=19"
        );
        let none = ControlError::NoControl {
            pair: None,
            len: Some(3),
        };
        assert_eq!(
            none.to_string(),
            "this pair defines no control messages (got one of 3 bytes)"
        );
        let e = FrameError::NotWholeRecords {
            pair: "average",
            len: 13,
            record_len: 14,
            layout: "i16:avg".into(),
        };
        assert_eq!(
            e.to_string(),
            "average: frame of 13 bytes is not a whole number of 14-byte records (expected 14, \
             28, … bytes for layout [i16:avg])"
        );
    }

    #[test]
    fn foreign_errors_compare_by_text_and_downcast() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "gone");
        let a = ForeignError::new(io);
        assert_eq!(a, ForeignError::new("gone"));
        assert_ne!(a, ForeignError::new("here"));
        assert_eq!(
            a.downcast_ref::<std::io::Error>().map(|e| e.kind()),
            Some(std::io::ErrorKind::NotFound)
        );
        let b = a.clone();
        assert_eq!(a, b);
    }
}

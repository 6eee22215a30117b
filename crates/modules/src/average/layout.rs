//! Record layouts of `average`: typed fields, how a window of records combines into one, and
//! the named presets.
//!
//! A record is the concatenation of its fields, without padding, all in one byte order. A
//! field is `TYPE:MODE`:
//!
//! | TYPE | bytes | | MODE | result over the window |
//! |---|---:|---|---|---|
//! | `u8` `i8` | 1 | | `avg` | arithmetic mean; integers rounded to nearest, ties away from zero |
//! | `u16` `i16` | 2 | | `sum` | exact sum, clamped to the type's range (relative deltas) |
//! | `u32` `i32` | 4 | | `last` | the newest record's bytes, unchanged |
//! | `f32` | 4 | | `or` | bitwise OR (integers only): a bit set in any record stays set |
//! | `f64` | 8 | | `max` / `min` | largest / smallest value |
//!
//! Integers are combined exactly (in `i128`), so nothing overflows before the final clamp.
//! Floats are combined in `f64` (IEEE: a sum that overflows an `f32` becomes ±infinity, a NaN
//! in a sum stays NaN, `max`/`min` skip NaN) and rounded to the field's type at the end.

use super::PAIR;
use ndd_core::ParamError;
use serde::Deserialize;
use std::fmt;
use std::str::FromStr;
use thiserror::Error;

/// The type of a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldType {
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 16-bit integer.
    U16,
    /// Signed 16-bit integer.
    I16,
    /// Unsigned 32-bit integer.
    U32,
    /// Signed 32-bit integer.
    I32,
    /// IEEE 754 single precision.
    F32,
    /// IEEE 754 double precision.
    F64,
}

/// How a field combines over a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Arithmetic mean (integers: rounded to nearest, ties away from zero).
    Avg,
    /// Sum, clamped to the type's range (relative deltas such as mouse motion).
    Sum,
    /// The newest value.
    Last,
    /// Bitwise OR (integers only).
    Or,
    /// Largest value.
    Max,
    /// Smallest value.
    Min,
}

const TYPES: [(&str, FieldType); 8] = [
    ("u8", FieldType::U8),
    ("i8", FieldType::I8),
    ("u16", FieldType::U16),
    ("i16", FieldType::I16),
    ("u32", FieldType::U32),
    ("i32", FieldType::I32),
    ("f32", FieldType::F32),
    ("f64", FieldType::F64),
];

const MODES: [(&str, Mode); 6] = [
    ("avg", Mode::Avg),
    ("sum", Mode::Sum),
    ("last", Mode::Last),
    ("or", Mode::Or),
    ("max", Mode::Max),
    ("min", Mode::Min),
];

impl FieldType {
    /// Size in bytes.
    pub const fn size(self) -> usize {
        match self {
            FieldType::U8 | FieldType::I8 => 1,
            FieldType::U16 | FieldType::I16 => 2,
            FieldType::U32 | FieldType::I32 | FieldType::F32 => 4,
            FieldType::F64 => 8,
        }
    }

    /// True for `f32` and `f64`.
    pub const fn is_float(self) -> bool {
        matches!(self, FieldType::F32 | FieldType::F64)
    }

    /// Name as written in a config file.
    pub fn name(self) -> &'static str {
        TYPES
            .iter()
            .find(|(_, t)| *t == self)
            .map_or("?", |(n, _)| n)
    }

    /// Range of an integer type (floats: the range of `i128`, never used).
    const fn range(self) -> (i128, i128) {
        match self {
            FieldType::U8 => (0, u8::MAX as i128),
            FieldType::I8 => (i8::MIN as i128, i8::MAX as i128),
            FieldType::U16 => (0, u16::MAX as i128),
            FieldType::I16 => (i16::MIN as i128, i16::MAX as i128),
            FieldType::U32 => (0, u32::MAX as i128),
            FieldType::I32 => (i32::MIN as i128, i32::MAX as i128),
            FieldType::F32 | FieldType::F64 => (i128::MIN, i128::MAX),
        }
    }

    /// The integer value of raw bits (sign-extended for signed types).
    fn to_int(self, bits: u64) -> i128 {
        let width = 8 * self.size() as u32;
        match self {
            FieldType::I8 | FieldType::I16 | FieldType::I32 => {
                let shift = 64 - width;
                i128::from(((bits << shift) as i64) >> shift)
            }
            _ => i128::from(bits),
        }
    }

    /// Raw bits of an integer value, clamped to the type's range first.
    fn encode_int(self, v: i128) -> u64 {
        let (lo, hi) = self.range();
        // In range, every integer type fits in i64; the low bytes are its two's complement.
        v.clamp(lo, hi) as i64 as u64
    }

    fn to_float(self, bits: u64) -> f64 {
        match self {
            FieldType::F32 => f64::from(f32::from_bits(bits as u32)),
            _ => f64::from_bits(bits),
        }
    }

    fn encode_float(self, v: f64) -> u64 {
        match self {
            FieldType::F32 => u64::from((v as f32).to_bits()),
            _ => v.to_bits(),
        }
    }
}

impl Mode {
    /// Name as written in a config file.
    pub fn name(self) -> &'static str {
        MODES
            .iter()
            .find(|(_, m)| *m == self)
            .map_or("?", |(n, _)| n)
    }
}

/// One field of a record: `TYPE:MODE`, e.g. `i16:avg`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct Field {
    /// Type and size.
    pub ty: FieldType,
    /// How it combines over a window.
    pub mode: Mode,
}

impl Field {
    /// A field.
    pub const fn new(ty: FieldType, mode: Mode) -> Field {
        Field { ty, mode }
    }

    /// Checks the combination (`or` needs an integer type).
    pub fn check(&self) -> Result<(), ParamError> {
        if self.mode == Mode::Or && self.ty.is_float() {
            return Err(ParamError::Invalid {
                pair: PAIR,
                param: "field",
                value: self.to_string(),
                reason: "mode \"or\" needs an integer type",
            });
        }
        Ok(())
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.ty.name(), self.mode.name())
    }
}

/// Why the text of a field (`TYPE:MODE`) is refused.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum FieldError {
    /// Not two words around a colon.
    #[error("average: field \"{text}\" must be TYPE:MODE, e.g. \"i16:avg\"")]
    Syntax {
        /// The text.
        text: String,
    },
    /// The type is none of [`FieldType`]'s.
    #[error(
        "average: field \"{text}\": unknown type \"{ty}\" (allowed: u8, i8, u16, i16, u32, i32, \
         f32, f64)"
    )]
    UnknownType {
        /// The text.
        text: String,
        /// The type given.
        ty: String,
    },
    /// The mode is none of [`Mode`]'s.
    #[error(
        "average: field \"{text}\": unknown mode \"{mode}\" (allowed: avg, sum, last, or, max, \
         min)"
    )]
    UnknownMode {
        /// The text.
        text: String,
        /// The mode given.
        mode: String,
    },
    /// A type and a mode that do not combine ([`Field::check`]).
    #[error(transparent)]
    Combination(#[from] ParamError),
}

impl FromStr for Field {
    type Err = FieldError;

    fn from_str(s: &str) -> Result<Field, FieldError> {
        let Some((ty, mode)) = s.split_once(':') else {
            return Err(FieldError::Syntax { text: s.into() });
        };
        let Some(&(_, ty)) = TYPES.iter().find(|(n, _)| *n == ty) else {
            return Err(FieldError::UnknownType {
                text: s.into(),
                ty: ty.into(),
            });
        };
        let Some(&(_, mode)) = MODES.iter().find(|(n, _)| *n == mode) else {
            return Err(FieldError::UnknownMode {
                text: s.into(),
                mode: mode.into(),
            });
        };
        let f = Field { ty, mode };
        f.check()?;
        Ok(f)
    }
}

impl TryFrom<String> for Field {
    type Error = FieldError;

    fn try_from(s: String) -> Result<Field, FieldError> {
        s.parse()
    }
}

/// Byte order of every multi-byte field of a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Endian {
    /// Most significant byte first (network order; the `spacenav-sim` record).
    #[default]
    Big,
    /// Least significant byte first.
    Little,
}

impl Endian {
    /// Name as written in a config file.
    pub fn name(self) -> &'static str {
        match self {
            Endian::Big => "big",
            Endian::Little => "little",
        }
    }
}

/// Named layouts, so users need not spell them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Preset {
    /// The 14-byte six-axis 3D-mouse record of the `spacenav-sim` endpoint:
    /// `tx ty tz rx ry rz` as `i16:avg`, then the button mask as `u16:or`.
    Spacenav,
    /// A relative mouse report, 6 bytes: `dx`, `dy` as `i16:sum`, wheel as `i8:sum`, buttons
    /// as `u8:or`.
    RelMouse,
}

impl Preset {
    /// Name as written in a config file.
    pub fn name(self) -> &'static str {
        match self {
            Preset::Spacenav => "spacenav",
            Preset::RelMouse => "rel-mouse",
        }
    }

    /// The fields of the preset.
    pub fn fields(self) -> Vec<Field> {
        use FieldType::*;
        use Mode::*;
        match self {
            Preset::Spacenav => {
                let mut v = vec![Field::new(I16, Avg); 6];
                v.push(Field::new(U16, Or));
                v
            }
            Preset::RelMouse => vec![
                Field::new(I16, Sum),
                Field::new(I16, Sum),
                Field::new(I8, Sum),
                Field::new(U8, Or),
            ],
        }
    }
}

/// `i16:avg, i16:avg, u16:or`.
pub fn fields_text(fields: &[Field]) -> String {
    fields
        .iter()
        .map(Field::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Reads `bytes` (1..=8 of them) as an unsigned integer in `endian` order.
fn read_bits(bytes: &[u8], endian: Endian) -> u64 {
    let push = |a: u64, b: &u8| (a << 8) | u64::from(*b);
    match endian {
        Endian::Big => bytes.iter().fold(0, push),
        Endian::Little => bytes.iter().rev().fold(0, push),
    }
}

/// Writes the low `out.len()` (1..=8) bytes of `bits` in `endian` order.
fn write_bits(out: &mut [u8], bits: u64, endian: Endian) {
    let n = out.len();
    for (i, b) in out.iter_mut().enumerate() {
        let shift = match endian {
            Endian::Big => 8 * (n - 1 - i),
            Endian::Little => 8 * i,
        };
        *b = (bits >> shift) as u8;
    }
}

/// The running state of one field.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Acc {
    /// `last`, `or`: raw bits.
    Bits(u64),
    /// Integer `avg` (sum), `sum`, `max`, `min`.
    Int(i128),
    /// Float `avg` (sum), `sum`, `max`, `min`.
    Float(f64),
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    field: Field,
    offset: usize,
}

impl Slot {
    fn value(&self, bits: u64) -> Acc {
        match self.field.mode {
            Mode::Last | Mode::Or => Acc::Bits(bits),
            _ if self.field.ty.is_float() => Acc::Float(self.field.ty.to_float(bits)),
            _ => Acc::Int(self.field.ty.to_int(bits)),
        }
    }

    fn combine(&self, acc: Acc, v: Acc) -> Acc {
        match (self.field.mode, acc, v) {
            (Mode::Last, _, v) => v,
            (Mode::Or, Acc::Bits(a), Acc::Bits(b)) => Acc::Bits(a | b),
            (Mode::Avg | Mode::Sum, Acc::Int(a), Acc::Int(b)) => Acc::Int(a.saturating_add(b)),
            (Mode::Avg | Mode::Sum, Acc::Float(a), Acc::Float(b)) => Acc::Float(a + b),
            (Mode::Max, Acc::Int(a), Acc::Int(b)) => Acc::Int(a.max(b)),
            (Mode::Max, Acc::Float(a), Acc::Float(b)) => Acc::Float(a.max(b)),
            (Mode::Min, Acc::Int(a), Acc::Int(b)) => Acc::Int(a.min(b)),
            (Mode::Min, Acc::Float(a), Acc::Float(b)) => Acc::Float(a.min(b)),
            // `value` gives every record of a slot the same variant.
            (_, acc, _) => acc,
        }
    }

    fn result(&self, acc: Acc, n: u64) -> u64 {
        let ty = self.field.ty;
        match (self.field.mode, acc) {
            (_, Acc::Bits(b)) => b,
            (Mode::Avg, Acc::Int(sum)) => ty.encode_int(div_round(sum, i128::from(n.max(1)))),
            (_, Acc::Int(v)) => ty.encode_int(v),
            (Mode::Avg, Acc::Float(sum)) => ty.encode_float(sum / n.max(1) as f64),
            (_, Acc::Float(v)) => ty.encode_float(v),
        }
    }
}

/// `sum / n` rounded to nearest, ties away from zero (`n` > 0).
fn div_round(sum: i128, n: i128) -> i128 {
    let q = sum / n;
    let r = sum % n;
    if 2 * r.abs() >= n {
        q + sum.signum()
    } else {
        q
    }
}

/// Combines records of one layout, one window at a time.
#[derive(Debug, Clone)]
pub struct Accumulator {
    slots: Vec<Slot>,
    endian: Endian,
    record_len: usize,
    acc: Vec<Acc>,
    n: u64,
}

impl Accumulator {
    /// An empty accumulator for records of `fields` in `endian` order.
    pub fn new(fields: &[Field], endian: Endian) -> Accumulator {
        let mut offset = 0;
        let slots: Vec<Slot> = fields
            .iter()
            .map(|&field| {
                let s = Slot { field, offset };
                offset += field.ty.size();
                s
            })
            .collect();
        Accumulator {
            acc: vec![Acc::Bits(0); slots.len()],
            slots,
            endian,
            record_len: offset,
            n: 0,
        }
    }

    /// Bytes per record (the sum of the field sizes).
    pub fn record_len(&self) -> usize {
        self.record_len
    }

    /// Records in the current window.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// True when the current window holds no record.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Adds one record to the window. `record` must be [`Accumulator::record_len`] bytes long;
    /// a shorter one contributes only the fields it holds entirely (never panics).
    pub fn add(&mut self, record: &[u8]) {
        for (slot, acc) in self.slots.iter().zip(self.acc.iter_mut()) {
            let Some(bytes) = record.get(slot.offset..slot.offset + slot.field.ty.size()) else {
                continue;
            };
            let v = slot.value(read_bits(bytes, self.endian));
            *acc = if self.n == 0 {
                v
            } else {
                slot.combine(*acc, v)
            };
        }
        self.n += 1;
    }

    /// Writes the combined record of the window into `out` (the first
    /// [`Accumulator::record_len`] bytes) and starts a new window. Returns false, writing
    /// nothing, when the window is empty.
    pub fn finish(&mut self, out: &mut [u8]) -> bool {
        if self.n == 0 {
            return false;
        }
        for (slot, acc) in self.slots.iter().zip(&self.acc) {
            let bits = slot.result(*acc, self.n);
            if let Some(o) = out.get_mut(slot.offset..slot.offset + slot.field.ty.size()) {
                write_bits(o, bits, self.endian);
            }
        }
        self.n = 0;
        true
    }
}

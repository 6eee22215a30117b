//! `HELLO` (kind 0x03): a side's plan, sent by both sides first thing. Stream id 0, no flags.
//!
//! Body:
//! ```text
//! u8  side (0 = device, 1 = app)
//! u32 max_body (largest body this side accepts; at least MIN_MAX_BODY)
//! u8  driver name length (1..=255), then UTF-8 bytes
//! u8  stream count (0..=255)
//! per stream:
//!   u16 stream id (≠ 0, unique within the HELLO)
//!   u8  direction (0 = device→app, 1 = app→device)
//!   u8  name length (1..=255), UTF-8 name
//!   u8  layer count
//!   per layer:
//!     u16 module id
//!     u64 parameter hash
//!     u16 description length, UTF-8 description
//! ```
//! Trailing bytes after the last stream are an error.
//!
//! [`compare`] checks two HELLOs against each other and names the first disagreement.

use core::fmt;

use crate::cursor::{need, set, Reader, Writer};
use crate::{Kind, Result, WireError};

/// Every side must accept bodies of at least this many bytes (64 KiB), so that HELLO, CLOSE
/// and control messages of ordinary size always fit. A HELLO announcing less is rejected.
pub const MIN_MAX_BODY: u32 = 64 * 1024;

/// Fixed part of a HELLO body before the driver name: side, max_body, name length.
pub const FIXED_LEN: usize = 6;

/// Byte ranges of the fixed HELLO body fields.
pub mod field {
    use core::ops::Range;
    /// Side.
    pub const SIDE: usize = 0;
    /// Largest body the sender accepts.
    pub const MAX_BODY: Range<usize> = 1..5;
    /// Driver name length.
    pub const DRIVER_LEN: usize = 5;
    /// Driver name starts here.
    pub const DRIVER: usize = 6;
}

/// FNV-1a 64-bit hash of a layer's canonical parameter text (offset basis
/// `0xcbf29ce484222325`, prime `0x100000001b3`, over the UTF-8 bytes).
///
/// The canonical text is `name(key=value, key=value)`: the module's config name, then its
/// parameters in the module's documented fixed order, each `key=value`, separated by `", "`
/// (comma and one space), in parentheses; just `name` when the module has no parameters.
/// Values are written in their plain config form (numbers in decimal, strings unquoted).
///
/// ```
/// assert_eq!(ndd_wire::param_hash(""), 0xcbf29ce484222325);
/// assert_eq!(ndd_wire::param_hash("a"), 0xaf63dc4c8601ec8c);
/// ```
pub const fn param_hash(canonical: &str) -> u64 {
    let bytes = canonical.as_bytes();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    hash
}

/// Which side of a driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Side {
    /// Where the physical device is (code 0).
    Device,
    /// Where the application runs (code 1).
    App,
}

impl Side {
    /// Wire code.
    pub const fn to_u8(self) -> u8 {
        match self {
            Side::Device => 0,
            Side::App => 1,
        }
    }

    /// Side for a wire code.
    pub const fn from_u8(code: u8) -> Option<Side> {
        match code {
            0 => Some(Side::Device),
            1 => Some(Side::App),
            _ => None,
        }
    }

    /// The other side.
    pub const fn peer(self) -> Side {
        match self {
            Side::Device => Side::App,
            Side::App => Side::Device,
        }
    }
}

impl fmt::Display for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Side::Device => "device",
            Side::App => "app",
        })
    }
}

/// Which way a stream flows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    /// Sourced on the device side, sinked on the app side (code 0).
    DeviceToApp,
    /// Sourced on the app side, sinked on the device side (code 1).
    AppToDevice,
}

impl Direction {
    /// Wire code.
    pub const fn to_u8(self) -> u8 {
        match self {
            Direction::DeviceToApp => 0,
            Direction::AppToDevice => 1,
        }
    }

    /// Direction for a wire code.
    pub const fn from_u8(code: u8) -> Option<Direction> {
        match code {
            0 => Some(Direction::DeviceToApp),
            1 => Some(Direction::AppToDevice),
            _ => None,
        }
    }

    /// The side that runs the forward halves.
    pub const fn source(self) -> Side {
        match self {
            Direction::DeviceToApp => Side::Device,
            Direction::AppToDevice => Side::App,
        }
    }

    /// The side that runs the inverse halves.
    pub const fn sink(self) -> Side {
        self.source().peer()
    }
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Direction::DeviceToApp => "device→app",
            Direction::AppToDevice => "app→device",
        })
    }
}

/// One pair of a stream's stack, as announced.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LayerDecl {
    /// The module's registered id.
    pub module_id: u16,
    /// [`param_hash`] of the layer's canonical parameter text.
    pub param_hash: u64,
    /// Canonical text for people, e.g. `compress(codec=lz4, level=3)` (0..=65535 bytes).
    pub description: String,
}

/// One stream, as announced.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StreamDecl {
    /// Stream id (≠ 0).
    pub id: u16,
    /// Which way it flows.
    pub direction: Direction,
    /// Name from the config (1..=255 bytes).
    pub name: String,
    /// Its stack, top (layer 0) first.
    pub layers: Vec<LayerDecl>,
}

/// A HELLO body as plain values.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Which side the sender is.
    pub side: Side,
    /// Largest body the sender accepts (≥ [`MIN_MAX_BODY`]).
    pub max_body: u32,
    /// Driver name (1..=255 bytes).
    pub driver: String,
    /// Streams (0..=255, unique ids).
    pub streams: Vec<StreamDecl>,
}

/// Checked view of a HELLO body's fixed part (side, max_body, driver name). The variable part
/// (streams) is read by [`Repr::parse`]. After [`Packet::new_checked`] no getter panics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap a body without checking its length.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wrap a body, checking it holds the fixed part and the driver name.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// `Err(BodyTooShort)` unless the body holds side, max_body, the driver name length and
    /// the driver name.
    pub fn check_len(&self) -> Result<()> {
        let buf = self.buffer.as_ref();
        let have = buf.len();
        let short = |field, need| WireError::BodyTooShort {
            kind: Kind::Hello,
            field,
            need,
            have,
        };
        if have < field::SIDE + 1 {
            return Err(short("side", field::SIDE + 1));
        }
        if have < field::MAX_BODY.end {
            return Err(short("max_body", field::MAX_BODY.end));
        }
        if have <= field::DRIVER_LEN {
            return Err(short("driver name length", field::DRIVER_LEN + 1));
        }
        let need = self.streams_offset();
        if have < need {
            return Err(short("driver name", need));
        }
        Ok(())
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Raw side code (see [`Side::from_u8`]).
    #[inline]
    pub fn side(&self) -> u8 {
        self.buffer.as_ref()[field::SIDE]
    }

    /// Largest body the sender accepts.
    #[inline]
    pub fn max_body(&self) -> u32 {
        u32::from_be_bytes(crate::cursor::get(
            self.buffer.as_ref(),
            field::MAX_BODY.start,
        ))
    }

    /// Driver name length byte.
    #[inline]
    pub fn driver_len(&self) -> u8 {
        self.buffer.as_ref()[field::DRIVER_LEN]
    }

    /// Raw driver name bytes (UTF-8 is checked by [`Repr::parse`]).
    #[inline]
    pub fn driver(&self) -> &[u8] {
        &self.buffer.as_ref()[field::DRIVER..self.streams_offset()]
    }

    /// The rest of the body after the driver name: stream count and streams.
    #[inline]
    pub fn streams(&self) -> &[u8] {
        &self.buffer.as_ref()[self.streams_offset()..]
    }

    #[inline]
    fn streams_offset(&self) -> usize {
        field::DRIVER + usize::from(self.driver_len())
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the side code.
    #[inline]
    pub fn set_side(&mut self, value: u8) {
        self.buffer.as_mut()[field::SIDE] = value;
    }

    /// Set max_body.
    #[inline]
    pub fn set_max_body(&mut self, value: u32) {
        set(
            self.buffer.as_mut(),
            field::MAX_BODY.start,
            &value.to_be_bytes(),
        );
    }
}

fn bad_len(field: &'static str, len: usize, min: usize, max: usize) -> Result<()> {
    if len < min || len > max {
        Err(WireError::BadLength {
            field,
            len,
            min,
            max,
        })
    } else {
        Ok(())
    }
}

const DUPLICATE: &str = "HELLO declares the same stream id twice";

fn check_max_body(max_body: u32) -> Result<()> {
    if max_body < MIN_MAX_BODY {
        Err(WireError::InvalidValue {
            field: "max_body",
            value: max_body.into(),
        })
    } else {
        Ok(())
    }
}

fn check_stream_id(id: u16) -> Result<()> {
    if id == 0 {
        Err(WireError::InvalidValue {
            field: "stream id",
            value: 0,
        })
    } else {
        Ok(())
    }
}

impl Repr {
    /// Parse a HELLO body.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr> {
        let mut r = Reader::new(packet.buffer.as_ref(), Kind::Hello);
        let side = r.u8("side")?;
        let side = Side::from_u8(side).ok_or(WireError::InvalidValue {
            field: "side",
            value: side.into(),
        })?;
        let max_body = r.u32("max_body")?;
        check_max_body(max_body)?;
        let len = r.u8("driver name length")?;
        let driver = r.str(len.into(), 1, 255, "driver name")?.to_owned();
        let count = r.u8("stream count")?;
        let mut streams: Vec<StreamDecl> = Vec::with_capacity(count.into());
        for _ in 0..count {
            let id = r.u16("stream id")?;
            check_stream_id(id)?;
            if streams.iter().any(|s| s.id == id) {
                return Err(WireError::Malformed(DUPLICATE));
            }
            let dir = r.u8("direction")?;
            let direction = Direction::from_u8(dir).ok_or(WireError::InvalidValue {
                field: "direction",
                value: dir.into(),
            })?;
            let len = r.u8("stream name length")?;
            let name = r.str(len.into(), 1, 255, "stream name")?.to_owned();
            let nlayers = r.u8("layer count")?;
            let mut layers = Vec::with_capacity(nlayers.into());
            for _ in 0..nlayers {
                let module_id = r.u16("module id")?;
                let param_hash = r.u64("parameter hash")?;
                let len = r.u16("layer description length")?;
                let description = r
                    .str(len.into(), 0, u16::MAX.into(), "layer description")?
                    .to_owned();
                layers.push(LayerDecl {
                    module_id,
                    param_hash,
                    description,
                });
            }
            streams.push(StreamDecl {
                id,
                direction,
                name,
                layers,
            });
        }
        r.finish()?;
        Ok(Repr {
            side,
            max_body,
            driver,
            streams,
        })
    }

    /// Check everything [`Repr::emit`] needs: name lengths, counts, stream ids, max_body.
    pub fn validate(&self) -> Result<()> {
        check_max_body(self.max_body)?;
        bad_len("driver name", self.driver.len(), 1, 255)?;
        bad_len("stream count", self.streams.len(), 0, 255)?;
        for (i, s) in self.streams.iter().enumerate() {
            check_stream_id(s.id)?;
            if self.streams[..i].iter().any(|t| t.id == s.id) {
                return Err(WireError::Malformed(DUPLICATE));
            }
            bad_len("stream name", s.name.len(), 1, 255)?;
            bad_len("layer count", s.layers.len(), 0, 255)?;
            for l in &s.layers {
                bad_len("layer description", l.description.len(), 0, u16::MAX.into())?;
            }
        }
        let len = self.buffer_len();
        u32::try_from(len).map_err(|_| WireError::TooLong {
            len: len as u64,
            max: u32::MAX,
        })?;
        Ok(())
    }

    /// Body length.
    pub fn buffer_len(&self) -> usize {
        let streams: usize = self
            .streams
            .iter()
            .map(|s| {
                let layers: usize = s
                    .layers
                    .iter()
                    .map(|l| 2 + 8 + 2 + l.description.len())
                    .sum();
                2 + 1 + 1 + s.name.len() + 1 + layers
            })
            .sum();
        FIXED_LEN + self.driver.len() + 1 + streams
    }

    /// Write the body into the first [`Repr::buffer_len`] bytes of `packet`, after
    /// [`Repr::validate`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) -> Result<()> {
        self.validate()?;
        need(packet.buffer.as_ref(), self.buffer_len())?;
        // Lengths and counts were validated above, so the narrowing below cannot truncate;
        // `try_from(..).unwrap_or(MAX)` keeps that true without a panic path.
        let mut w = Writer::new(packet.buffer.as_mut());
        w.u8(self.side.to_u8())?;
        w.u32(self.max_body)?;
        w.u8(u8::try_from(self.driver.len()).unwrap_or(u8::MAX))?;
        w.put(self.driver.as_bytes())?;
        w.u8(u8::try_from(self.streams.len()).unwrap_or(u8::MAX))?;
        for s in &self.streams {
            w.u16(s.id)?;
            w.u8(s.direction.to_u8())?;
            w.u8(u8::try_from(s.name.len()).unwrap_or(u8::MAX))?;
            w.put(s.name.as_bytes())?;
            w.u8(u8::try_from(s.layers.len()).unwrap_or(u8::MAX))?;
            for l in &s.layers {
                w.u16(l.module_id)?;
                w.u64(l.param_hash)?;
                w.u16(u16::try_from(l.description.len()).unwrap_or(u16::MAX))?;
                w.put(l.description.as_bytes())?;
            }
        }
        Ok(())
    }

    /// The stream with this id, if declared.
    pub fn stream(&self, id: u16) -> Option<&StreamDecl> {
        self.streams.iter().find(|s| s.id == id)
    }
}

/// The first way in which two HELLOs disagree, from this side's point of view.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Mismatch {
    /// Both HELLOs claim the same side.
    #[error("both sides are configured as the {0} side; one must be `device`, the other `app`")]
    SameSide(Side),
    /// Different driver names.
    #[error("driver mismatch: this side runs driver `{ours}`, the peer runs `{theirs}`")]
    Driver {
        /// Ours.
        ours: String,
        /// The peer's.
        theirs: String,
    },
    /// A stream only this side declares.
    #[error("stream `{name}` (id {id}) is configured on this side but not on the peer")]
    StreamOnlyHere {
        /// Stream id.
        id: u16,
        /// Stream name.
        name: String,
    },
    /// A stream only the peer declares.
    #[error("stream `{name}` (id {id}) is configured on the peer but not on this side")]
    StreamOnlyOnPeer {
        /// Stream id.
        id: u16,
        /// Stream name.
        name: String,
    },
    /// Same id, different names.
    #[error("stream id {id} is `{ours}` on this side but `{theirs}` on the peer")]
    StreamName {
        /// Stream id.
        id: u16,
        /// Our name.
        ours: String,
        /// The peer's name.
        theirs: String,
    },
    /// Same stream, different directions.
    #[error("stream `{stream}` (id {id}) flows {ours} on this side but {theirs} on the peer")]
    Direction {
        /// Stream name.
        stream: String,
        /// Stream id.
        id: u16,
        /// Our direction.
        ours: Direction,
        /// The peer's direction.
        theirs: Direction,
    },
    /// The stacks differ at `layer` (a missing layer is `None`).
    #[error(
        "stream \"{stream}\" layer {layer}: this side has {}, peer has {}",
        describe(.ours, .theirs),
        describe(.theirs, .ours)
    )]
    Layer {
        /// Stream name.
        stream: String,
        /// Stream id.
        id: u16,
        /// Layer index (0 = first as written).
        layer: usize,
        /// Our layer there.
        ours: Option<LayerDecl>,
        /// The peer's layer there.
        theirs: Option<LayerDecl>,
    },
}

/// A layer as people read it: its canonical description; the module id and parameter hash
/// are added only when both descriptions read the same (a peer built differently).
fn describe(layer: &Option<LayerDecl>, other: &Option<LayerDecl>) -> String {
    match (layer, other) {
        (None, _) => "no such layer".to_owned(),
        (Some(l), Some(o)) if l.description == o.description => format!(
            "{} (module {}, parameter hash {:016x})",
            l.description, l.module_id, l.param_hash
        ),
        (Some(l), _) => l.description.clone(),
    }
}

/// Compare our HELLO with the peer's. Agreement means: opposite sides, the same driver name,
/// and the same set of streams (matched by id) with equal names, directions and stacks
/// (layer by layer, equal module id and parameter hash; descriptions and `max_body` are not
/// compared). Returns the first disagreement, in our stream order, then the peer's.
pub fn compare(ours: &Repr, theirs: &Repr) -> core::result::Result<(), Mismatch> {
    if ours.side == theirs.side {
        return Err(Mismatch::SameSide(ours.side));
    }
    if ours.driver != theirs.driver {
        return Err(Mismatch::Driver {
            ours: ours.driver.clone(),
            theirs: theirs.driver.clone(),
        });
    }
    for s in &ours.streams {
        let Some(t) = theirs.stream(s.id) else {
            return Err(Mismatch::StreamOnlyHere {
                id: s.id,
                name: s.name.clone(),
            });
        };
        if s.name != t.name {
            return Err(Mismatch::StreamName {
                id: s.id,
                ours: s.name.clone(),
                theirs: t.name.clone(),
            });
        }
        if s.direction != t.direction {
            return Err(Mismatch::Direction {
                stream: s.name.clone(),
                id: s.id,
                ours: s.direction,
                theirs: t.direction,
            });
        }
        let n = s.layers.len().max(t.layers.len());
        for layer in 0..n {
            let (a, b) = (s.layers.get(layer), t.layers.get(layer));
            let same = matches!((a, b), (Some(a), Some(b))
                if a.module_id == b.module_id && a.param_hash == b.param_hash);
            if !same {
                return Err(Mismatch::Layer {
                    stream: s.name.clone(),
                    id: s.id,
                    layer,
                    ours: a.cloned(),
                    theirs: b.cloned(),
                });
            }
        }
    }
    if let Some(t) = theirs.streams.iter().find(|t| ours.stream(t.id).is_none()) {
        return Err(Mismatch::StreamOnlyOnPeer {
            id: t.id,
            name: t.name.clone(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(desc: &str, id: u16) -> LayerDecl {
        LayerDecl {
            module_id: id,
            param_hash: param_hash(desc),
            description: desc.to_owned(),
        }
    }

    fn plan(side: Side) -> Repr {
        Repr {
            side,
            max_body: MIN_MAX_BODY,
            driver: "mouse".into(),
            streams: vec![
                StreamDecl {
                    id: 1,
                    direction: Direction::DeviceToApp,
                    name: "events".into(),
                    layers: vec![layer("bundle(max=8)", 2), layer("compress(codec=lz4)", 3)],
                },
                StreamDecl {
                    id: 2,
                    direction: Direction::AppToDevice,
                    name: "leds".into(),
                    layers: vec![],
                },
            ],
        }
    }

    #[test]
    fn fnv1a_vectors() {
        assert_eq!(param_hash(""), 0xcbf29ce484222325);
        assert_eq!(param_hash("a"), 0xaf63dc4c8601ec8c);
        assert_eq!(param_hash("foobar"), 0x85944171f73967e8);
    }

    #[test]
    fn side_and_direction_display() {
        assert_eq!(Side::Device.to_string(), "device");
        assert_eq!(Side::App.to_string(), "app");
        assert_eq!(Direction::DeviceToApp.to_string(), "device→app");
        assert_eq!(Direction::AppToDevice.to_string(), "app→device");
        assert_eq!(Direction::AppToDevice.source(), Side::App);
        assert_eq!(Direction::AppToDevice.sink(), Side::Device);
    }

    #[test]
    fn compare_agrees_and_names_layer() {
        let ours = plan(Side::Device);
        let mut theirs = plan(Side::App);
        assert_eq!(compare(&ours, &theirs), Ok(()));
        assert_eq!(
            compare(&ours, &plan(Side::Device)),
            Err(Mismatch::SameSide(Side::Device))
        );
        theirs.streams[0].layers[1] = layer("compress(codec=zstd)", 3);
        let err = compare(&ours, &theirs).unwrap_err();
        assert_eq!(
            err.to_string(),
            "stream \"events\" layer 1: this side has compress(codec=lz4), \
             peer has compress(codec=zstd)"
        );
        theirs.streams[0].layers.pop();
        assert!(matches!(
            compare(&ours, &theirs),
            Err(Mismatch::Layer {
                layer: 1,
                theirs: None,
                ..
            })
        ));
        let mut theirs = plan(Side::App);
        theirs.streams.remove(1);
        assert_eq!(
            compare(&ours, &theirs).unwrap_err().to_string(),
            "stream `leds` (id 2) is configured on this side but not on the peer"
        );
        assert_eq!(
            compare(&theirs, &ours).unwrap_err().to_string(),
            "stream `leds` (id 2) is configured on the peer but not on this side"
        );
    }

    #[test]
    fn validate_rejects_unencodable() {
        let mut p = plan(Side::App);
        p.driver.clear();
        assert_eq!(
            p.validate(),
            Err(WireError::BadLength {
                field: "driver name",
                len: 0,
                min: 1,
                max: 255
            })
        );
        let mut p = plan(Side::App);
        p.streams[1].id = 1;
        assert_eq!(p.validate(), Err(WireError::Malformed(DUPLICATE)));
        let mut p = plan(Side::App);
        p.streams[1].id = 0;
        assert_eq!(
            p.validate(),
            Err(WireError::InvalidValue {
                field: "stream id",
                value: 0
            })
        );
        let mut p = plan(Side::App);
        p.max_body = 100;
        assert_eq!(
            p.validate(),
            Err(WireError::InvalidValue {
                field: "max_body",
                value: 100
            })
        );
        let mut p = plan(Side::App);
        p.streams[0].name = "x".repeat(256);
        assert!(matches!(
            p.validate(),
            Err(WireError::BadLength { len: 256, .. })
        ));
    }

    #[test]
    fn round_trip_and_fixed_view() {
        let p = plan(Side::Device);
        let mut buf = vec![0u8; p.buffer_len()];
        p.emit(&mut Packet::new_unchecked(&mut buf[..])).unwrap();
        let view = Packet::new_checked(&buf[..]).unwrap();
        assert_eq!(view.side(), 0);
        assert_eq!(view.max_body(), MIN_MAX_BODY);
        assert_eq!(view.driver(), b"mouse");
        assert_eq!(view.streams().first(), Some(&2));
        assert_eq!(Repr::parse(&view), Ok(p));
        assert_eq!(
            Packet::new_checked(&buf[..8]),
            Err(WireError::BodyTooShort {
                kind: Kind::Hello,
                field: "driver name",
                need: 11,
                have: 8
            })
        );
    }
}

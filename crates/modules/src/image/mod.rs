//! `image`: a content-adaptive codec for display records (`x11-screen` → `x11-window`), after
//! TurboVNC's Tight encoder (seed 000; DESIGN.md §6), with interframe comparison, lossless
//! refinement, frame spoiling credit and bandwidth adaptation.
//!
//! Synopsis: `{ type = "image", quality = "auto", tile = 64, palette_max = 64, refine_ms = 300,
//! window = 64 }`
//!
//! - **forward half** (source side): keeps a copy of the screen as it last saw it, cut into a
//!   grid of `tile`×`tile` tiles. Of every incoming display update it sends only the parts of
//!   tiles whose pixels changed (a keyframe travels whole). Each changed part is classified by
//!   its content: one colour → *solid* (3 bytes); at most `palette_max` colours → *palette*
//!   (the colours, then one index byte per pixel); more → *photo*. Photo parts next to each
//!   other are merged into larger rectangles and sent as JPEG (libjpeg-turbo) at the preset's
//!   quality and chroma subsampling, or losslessly (BGR bytes) with `quality = "lossless"`.
//!   Palette indices and lossless pixels of a frame travel in one zstd block of a stream whose
//!   window spans earlier frames, so text that scrolled or was drawn before costs little.
//! - **lossless refinement**: a tile last sent as JPEG that has not changed for `refine_ms`
//!   is sent again losslessly (TurboVNC's automatic lossless refresh), so still content ends
//!   pixel-identical in the viewer whatever the preset.
//!   A refinement frame carries the seq of the update before it plus one (seqs must grow);
//!   a later update whose own seq is not above that is renumbered, as `periodic` does.
//! - **credit** (frame spoiling): the inverse tells the forward half, out of band, which frame
//!   it has decoded; the forward half says it is not [`ready`](ndd_core::Half::ready) while
//!   the path holds what it can carry without a queue (`pacer.rs`: bottleneck rate × round
//!   trip + one frame, at most `window` frames), so the session stops reading the source, the
//!   `x11-screen` source stops capturing and merges damage until the path takes another
//!   update (VirtualGL's frame spoiling, VNC's deferred updates). No deep queue builds up.
//! - **`quality = "auto"`**: every 0.5 s, when the window held the source back more than half
//!   the time while frames queued in the path, the preset steps down (`high` → `medium` →
//!   `low`); after four periods in which it rarely did (and, within 10 s of a congestion, only with measured room for about twice
//!   the bytes), it steps up. Counters `preset`, `ack_ms`, `rtt_ms`, `kbps`,
//!   `bottleneck_kbps`; the `--stats` line shows the preset, fps, Mbit per frame, path rate and
//!   round trip.
//! - **inverse half** (sink side): decodes each frame into a plain display record with raw
//!   rectangles, which every display sink understands; unchanged tiles are simply not in it.
//!
//! Presets (seed 000): `lossless`; `high` = JPEG Q95 4:4:4 (perceptually lossless); `medium`
//! = Q80 4:2:2; `low` = Q30 4:2:0. `jpeg_quality` (1..=100) and `subsampling` (`"444"`,
//! `"422"`, `"420"`, `"gray"`) override the preset's.
//!
//! - **broadcast** (`keyframe_ms` > 0, for one screen to many app sides over NATS, where no
//!   single app side's credit can pace the source): the forward half is always ready (the
//!   source runs at its own rate; `auto` stays at `medium`, having no acknowledgements to
//!   adapt by), and every `keyframe_ms` — on the next update, or from its screen copy if the
//!   screen is still — it sends the whole screen as a keyframe that starts a new zstd stream.
//!   The inverse sends no credit and drops frames until its first keyframe, so an app side
//!   that joins late starts within `keyframe_ms` (counter `skipped`).
//!
//! The pair needs a reliable stream (its frames reference earlier ones). Frame format and
//! control messages in [`format`]; every length and count the inverse reads is checked
//! before anything is allocated, and a decoded update may not exceed `max_size` bytes.
//! Errors read `image: …`.

pub mod format;
#[cfg(feature = "media")]
mod forward;
#[cfg(feature = "media")]
mod inverse;
#[cfg(feature = "media")]
mod pacer;
#[cfg(all(test, feature = "media"))]
mod tests;
#[cfg(feature = "media")]
mod tiles;
#[cfg(feature = "media")]
mod video;

#[cfg(feature = "media")]
pub use forward::ImageForward;
#[cfg(feature = "media")]
pub use inverse::ImageInverse;

use crate::registry::{ModuleInfo, ParamInfo, IDS};
use ndd_core::{Half, ModuleError, Pair, ParamError};
use serde::Deserialize;
use std::fmt;

/// The pair's name, first in its error texts.
pub(crate) const PAIR: &str = "image";

/// A library (libjpeg-turbo, zstd) could not be set up.
#[cfg_attr(not(feature = "media"), allow(dead_code))]
pub(crate) fn library(
    context: &str,
    e: impl std::error::Error + Send + Sync + 'static,
) -> ModuleError {
    ModuleError::from(ndd_core::SetupError::Library {
        pair: PAIR,
        context: context.to_string(),
        source: ndd_core::ForeignError::new(e),
    })
}

/// A codec refused the data of a frame.
#[cfg_attr(not(feature = "media"), allow(dead_code))]
pub(crate) fn corrupt(
    codec: &'static str,
    e: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> ModuleError {
    ModuleError::from(ndd_core::FrameError::Corrupt {
        pair: PAIR,
        codec,
        source: ndd_core::ForeignError::new(e),
    })
}

/// Seed 000's quality presets, plus `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Quality {
    /// JPEG Q30 4:2:0.
    Low,
    /// JPEG Q80 4:2:2.
    Medium,
    /// JPEG Q95 4:4:4, perceptually lossless.
    High,
    /// No JPEG: photo parts travel as zstd-compressed pixels.
    Lossless,
    /// Moves along [`AUTO_LADDER`] (from `low` through `medium` to `high`, with steps
    /// between) with the measured path.
    Auto,
}

/// The JPEG settings `auto` moves between, one rung at a time: `low`, two steps, `medium`,
/// one step, `high`. The steps let it fill a path that carries more than `low` but less than
/// `medium` (seed 000's presets are far apart: 0.51 → 0.90 → 1.9 bit/pixel).
pub const AUTO_LADDER: [(u8, Subsampling); 6] = [
    (30, Subsampling::S420),
    (45, Subsampling::S420),
    (60, Subsampling::S420),
    (80, Subsampling::S422),
    (90, Subsampling::S444),
    (95, Subsampling::S444),
];
/// Where `auto` starts: `medium`.
pub const AUTO_START: usize = 3;

/// The preset a rung of [`AUTO_LADDER`] is, or is between (for the stats line).
pub fn ladder_preset(level: usize) -> Quality {
    match level {
        0..=2 => Quality::Low,
        3..=4 => Quality::Medium,
        _ => Quality::High,
    }
}

impl Quality {
    /// Name as written in config files.
    pub fn name(self) -> &'static str {
        match self {
            Quality::Low => "low",
            Quality::Medium => "medium",
            Quality::High => "high",
            Quality::Lossless => "lossless",
            Quality::Auto => "auto",
        }
    }

    /// JPEG quality and subsampling of a preset (`None` for lossless; `auto` starts at
    /// `medium`).
    pub fn jpeg(self) -> Option<(u8, Subsampling)> {
        match self {
            Quality::Low => Some((30, Subsampling::S420)),
            Quality::Medium | Quality::Auto => Some((80, Subsampling::S422)),
            Quality::High => Some((95, Subsampling::S444)),
            Quality::Lossless => None,
        }
    }
}

impl fmt::Display for Quality {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// JPEG chroma subsampling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Subsampling {
    /// Full chroma.
    #[serde(rename = "444")]
    S444,
    /// Half horizontal chroma.
    #[serde(rename = "422")]
    S422,
    /// Half horizontal and vertical chroma.
    #[serde(rename = "420")]
    S420,
    /// Luminance only.
    #[serde(rename = "gray")]
    Gray,
}

impl Subsampling {
    /// Name as written in config files.
    pub fn name(self) -> &'static str {
        match self {
            Subsampling::S444 => "444",
            Subsampling::S422 => "422",
            Subsampling::S420 => "420",
            Subsampling::Gray => "gray",
        }
    }

    #[cfg(feature = "media")]
    pub(crate) fn turbo(self) -> turbojpeg::Subsamp {
        match self {
            Subsampling::S444 => turbojpeg::Subsamp::None,
            Subsampling::S422 => turbojpeg::Subsamp::Sub2x1,
            Subsampling::S420 => turbojpeg::Subsamp::Sub2x2,
            Subsampling::Gray => turbojpeg::Subsamp::Gray,
        }
    }
}

/// How moving content travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Codec {
    /// A region that changes in most captures (a video, a game) as H.264, the rest as tiles.
    Auto,
    /// Tiles only.
    Tiles,
    /// The whole screen as H.264.
    H264,
}

impl Codec {
    /// Name as written in config files.
    pub fn name(self) -> &'static str {
        match self {
            Codec::Auto => "auto",
            Codec::Tiles => "tiles",
            Codec::H264 => "h264",
        }
    }
}

/// Parameters of `image`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ImageConfig {
    /// Preset.
    pub quality: Quality,
    /// How moving content travels (H.264 video regions or tiles).
    pub codec: Codec,
    /// JPEG quality 1..=100 overriding the preset's; 0 = the preset's.
    pub jpeg_quality: u8,
    /// Chroma subsampling overriding the preset's.
    pub subsampling: Option<Subsampling>,
    /// Tile edge in pixels (interframe comparison and refinement granularity).
    pub tile: u16,
    /// Most colours a part may have to travel as a palette.
    pub palette_max: u16,
    /// A tile sent as JPEG and unchanged this long is sent again losslessly; 0 = never.
    pub refine_ms: u32,
    /// Most frames sent but not yet decoded by the inverse before the source waits (the
    /// window is sized to the path below that).
    pub window: u32,
    /// Largest decoded update the inverse accepts, bytes (decompression-bomb guard).
    pub max_size: u32,
    /// 0: paced by one sink's credit (a direct link). Above 0, *broadcast* for many app
    /// sides (NATS): no credit, a keyframe of the whole screen every `keyframe_ms` that
    /// restarts the compression stream, and an inverse that starts at a keyframe.
    pub keyframe_ms: u32,
}

impl Default for ImageConfig {
    fn default() -> Self {
        ImageConfig {
            quality: Quality::Auto,
            codec: Codec::Auto,
            jpeg_quality: 0,
            subsampling: None,
            tile: 64,
            palette_max: 64,
            refine_ms: 300,
            window: 64,
            max_size: 64 << 20,
            keyframe_ms: 0,
        }
    }
}

/// Catalogue entry.
pub const INFO: ModuleInfo = ModuleInfo {
    name: PAIR,
    id: IDS.image,
    summary: "display records: solid / palette / JPEG per changed tile, H.264 video regions, lossless refinement, frame spoiling credit",
    params: &[
        ParamInfo {
            name: "quality",
            ty: "\"auto\" | \"lossless\" | \"high\" | \"medium\" | \"low\"",
            default: "\"auto\"",
            doc: "preset (high = Q95 4:4:4, medium = Q80 4:2:2, low = Q30 4:2:0); auto follows the path",
        },
        ParamInfo {
            name: "codec",
            ty: "\"auto\" | \"tiles\" | \"h264\"",
            default: "\"auto\"",
            doc: "auto: a region that changes in most captures (a video) as H.264, the rest as tiles; tiles: never H.264; h264: the whole screen as H.264",
        },
        ParamInfo {
            name: "jpeg_quality",
            ty: "integer 0..=100",
            default: "0",
            doc: "JPEG quality overriding the preset's (0 = the preset's)",
        },
        ParamInfo {
            name: "subsampling",
            ty: "\"444\" | \"422\" | \"420\" | \"gray\"",
            default: "(the preset's)",
            doc: "JPEG chroma subsampling overriding the preset's",
        },
        ParamInfo {
            name: "tile",
            ty: "integer 16..=256",
            default: "64",
            doc: "tile edge in pixels: what is compared between updates and refined",
        },
        ParamInfo {
            name: "palette_max",
            ty: "integer 2..=256",
            default: "64",
            doc: "most colours a tile may have to travel as a lossless palette",
        },
        ParamInfo {
            name: "refine_ms",
            ty: "integer 0..=60000",
            default: "300",
            doc: "a JPEG tile unchanged this long is sent again losslessly (0 = never)",
        },
        ParamInfo {
            name: "window",
            ty: "integer 1..=64",
            default: "64",
            doc: "most frames in flight; fewer when the path holds fewer (frame spoiling)",
        },
        ParamInfo {
            name: "max_size",
            ty: "integer 1024..=1073741824",
            default: "67108864",
            doc: "largest decoded update the inverse accepts",
        },
        ParamInfo {
            name: "keyframe_ms",
            ty: "integer 0 or 100..=60000",
            default: "0",
            doc: "0: paced by the app side's credit; above 0: broadcast to many app sides (NATS), no credit, a whole-screen keyframe this often, an app side starts at one",
        },
    ],
};

impl ImageConfig {
    /// Checks ranges.
    pub fn validate(&self) -> Result<(), ParamError> {
        ParamError::check_range(PAIR, "jpeg_quality", self.jpeg_quality, 0..=100)?;
        ParamError::check_range(PAIR, "tile", self.tile, 16..=256)?;
        ParamError::check_range(PAIR, "palette_max", self.palette_max, 2..=256)?;
        ParamError::check_range(PAIR, "refine_ms", self.refine_ms, 0..=60_000)?;
        ParamError::check_range(PAIR, "window", self.window, 1..=64)?;
        ParamError::check_range(PAIR, "max_size", self.max_size, 1024..=1 << 30)?;
        if self.keyframe_ms != 0 {
            ParamError::check_range(PAIR, "keyframe_ms", self.keyframe_ms, 100..=60_000)?;
        }
        Ok(())
    }

    /// Broadcast: no credit, periodic keyframes (see [`ImageConfig::keyframe_ms`]).
    pub fn broadcast(&self) -> bool {
        self.keyframe_ms > 0
    }

    /// The fixed JPEG settings, `None` for lossless; `auto` gives its starting preset.
    #[cfg_attr(not(feature = "media"), allow(dead_code))]
    pub(crate) fn jpeg(&self, preset: Quality) -> Option<(u8, Subsampling)> {
        preset.jpeg().map(|base| self.jpeg_over(base))
    }

    /// `base` with the explicit `jpeg_quality` and `subsampling` put over it.
    #[cfg_attr(not(feature = "media"), allow(dead_code))]
    pub(crate) fn jpeg_over(&self, (q, s): (u8, Subsampling)) -> (u8, Subsampling) {
        let q = if self.jpeg_quality > 0 {
            self.jpeg_quality
        } else {
            q
        };
        (q, self.subsampling.unwrap_or(s))
    }
}

impl Pair for ImageConfig {
    fn name(&self) -> &'static str {
        INFO.name
    }
    fn id(&self) -> u16 {
        INFO.id
    }
    fn describe(&self) -> String {
        format!(
            "image(quality={}, codec={}, jpeg_quality={}, subsampling={}, tile={}, palette_max={}, refine_ms={}, window={}, max_size={}, keyframe_ms={})",
            self.quality,
            self.codec.name(),
            self.jpeg_quality,
            self.subsampling.map_or("preset", Subsampling::name),
            self.tile,
            self.palette_max,
            self.refine_ms,
            self.window,
            self.max_size,
            self.keyframe_ms
        )
    }
    fn forward(&self) -> Result<Box<dyn Half>, ModuleError> {
        self.validate()?;
        #[cfg(not(feature = "media"))]
        return Err(crate::registry::not_built_in(PAIR));
        #[cfg(feature = "media")]
        Ok(Box::new(ImageForward::new(self.clone())?))
    }
    fn inverse(&self) -> Result<Box<dyn Half>, ModuleError> {
        self.validate()?;
        #[cfg(not(feature = "media"))]
        return Err(crate::registry::not_built_in(PAIR));
        #[cfg(feature = "media")]
        Ok(Box::new(ImageInverse::new(
            self.max_size as usize,
            self.broadcast(),
        )?))
    }
}

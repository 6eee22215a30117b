//! Parameters of the `pulse-capture` source and the `pulse-playback` sink.

use serde::{Deserialize, Serialize};

fn default_rate() -> u32 {
    48_000
}
fn default_channels() -> u8 {
    2
}
fn default_frame_ms() -> u32 {
    10
}
fn default_max_wait_ms() -> u32 {
    60
}
fn default_keep_s() -> u32 {
    60
}

fn is_default_keep(k: &u32) -> bool {
    *k == default_keep_s()
}

fn default_latency_ms() -> u32 {
    30
}

/// `pulse-capture` source parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PulseCaptureConfig {
    /// The PulseAudio source to record (`pactl list short sources`); the server's default
    /// source when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// Create a null sink of this name and record its monitor: what programs play into it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_sink: Option<String>,
    /// With `virtual_sink`: how long it stays after this side stops, s, so programs playing
    /// into it keep it (and their sound never moves to the speakers) across a restart of the
    /// side, whose next run takes it back; 0: removed as the side stops.
    #[serde(default = "default_keep_s", skip_serializing_if = "is_default_keep")]
    pub keep_s: u32,
    /// Samples per second.
    #[serde(default = "default_rate")]
    pub rate: u32,
    /// 1 (mono) ..= 8.
    #[serde(default = "default_channels")]
    pub channels: u8,
    /// Length of one block (one frame), ms.
    #[serde(default = "default_frame_ms")]
    pub frame_ms: u32,
    /// Recorded sound that waited longer than this (ms, or three blocks when longer) before it
    /// was read is skipped: after a stall the stream jumps to the present instead of keeping
    /// the delay. Larger keeps every block through longer stalls, at the cost of latency.
    #[serde(default = "default_max_wait_ms")]
    pub max_wait_ms: u32,
    /// The PulseAudio server (`unix:/run/user/1000/pulse/native`, `tcp:host`); the usual one
    /// (`PULSE_SERVER`, the user's session) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
}

impl Default for PulseCaptureConfig {
    fn default() -> Self {
        PulseCaptureConfig {
            device: None,
            virtual_sink: None,
            keep_s: default_keep_s(),
            rate: default_rate(),
            channels: default_channels(),
            frame_ms: default_frame_ms(),
            max_wait_ms: default_max_wait_ms(),
            server: None,
        }
    }
}

/// `pulse-playback` sink parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PulsePlaybackConfig {
    /// The PulseAudio sink to play into (`pactl list short sinks`); the server's default sink
    /// when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// Create a source of this name that programs record from, and play into it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_source: Option<String>,
    /// With `virtual_source`: how long it stays after this side stops, s, so programs
    /// recording from it keep it across a restart of the side, whose next run takes it back;
    /// 0: removed as the side stops.
    #[serde(default = "default_keep_s", skip_serializing_if = "is_default_keep")]
    pub keep_s: u32,
    /// Sound the server keeps buffered ahead of the speaker, ms; with `virtual_source`, the
    /// cushion its FIFO keeps (at least 40).
    #[serde(default = "default_latency_ms")]
    pub latency_ms: u32,
    /// With `virtual_source`: its sample rate (the blocks must have it).
    #[serde(default = "default_rate")]
    pub rate: u32,
    /// With `virtual_source`: its channels (the blocks must have as many).
    #[serde(default = "default_channels")]
    pub channels: u8,
    /// With `virtual_source`: how much sound may wait in its FIFO while a program records
    /// before a block is dropped, ms. Absent: the cushion (`latency_ms`, at least 40), the
    /// reader's period and a block (the freshest sound that a reader taking a period at a
    /// time, as PipeWire's, finds whole). More: whole sound through a reader that stalls (a
    /// loaded machine), at up to this much delay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_wait_ms: Option<u32>,
    /// The PulseAudio server, as for `pulse-capture`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
}

impl Default for PulsePlaybackConfig {
    fn default() -> Self {
        PulsePlaybackConfig {
            device: None,
            virtual_source: None,
            keep_s: default_keep_s(),
            latency_ms: default_latency_ms(),
            rate: default_rate(),
            channels: default_channels(),
            max_wait_ms: None,
            server: None,
        }
    }
}

/// Longest `keep_s` of a virtual device: a day.
pub const MAX_KEEP_S: u32 = 86_400;

/// Why `name` cannot be a PulseAudio device name given in a config, if it cannot.
pub(crate) fn check_device_name(name: &str) -> Result<(), String> {
    if name.is_empty()
        || name.len() > 128
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-:".contains(&b))
    {
        return Err(format!(
            "{name:?}: a PulseAudio device name is 1 to 128 of A-Z a-z 0-9 . _ - :"
        ));
    }
    Ok(())
}

impl PulseCaptureConfig {
    /// Samples per channel in one block.
    pub fn block_samples(&self) -> u64 {
        u64::from(self.rate) * u64::from(self.frame_ms) / 1000
    }

    /// Checks the ranges; the error names the key.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if !(8000..=192_000).contains(&self.rate) {
            return Err(("rate", "must be 8000..=192000 (Hz)".into()));
        }
        if !(1..=ndd_wire::audio::MAX_CHANNELS).contains(&self.channels) {
            return Err(("channels", "must be 1..=8".into()));
        }
        if !(1..=100).contains(&self.frame_ms) {
            return Err(("frame_ms", "must be 1..=100".into()));
        }
        if !(10..=10_000).contains(&self.max_wait_ms) {
            return Err(("max_wait_ms", "must be 10..=10000".into()));
        }
        if self.keep_s > MAX_KEEP_S {
            return Err(("keep_s", format!("must be 0..={MAX_KEEP_S} (s)")));
        }
        if self.device.is_some() && self.virtual_sink.is_some() {
            return Err((
                "virtual_sink",
                "give `device` (record an existing source) or `virtual_sink` (create one), not both"
                    .into(),
            ));
        }
        for (key, v) in [
            ("device", &self.device),
            ("virtual_sink", &self.virtual_sink),
        ] {
            if let Some(v) = v {
                check_device_name(v).map_err(|e| (key, e))?;
            }
        }
        check_server(&self.server)
    }
}

fn check_server(server: &Option<String>) -> Result<(), (&'static str, String)> {
    match server {
        Some(s) if s.is_empty() || s.contains('\0') => Err((
            "server",
            "must be a PulseAudio server string without NUL".into(),
        )),
        _ => Ok(()),
    }
}

impl PulsePlaybackConfig {
    /// Checks the ranges; the error names the key.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if !(1..=2000).contains(&self.latency_ms) {
            return Err(("latency_ms", "must be 1..=2000".into()));
        }
        if self.keep_s > MAX_KEEP_S {
            return Err(("keep_s", format!("must be 0..={MAX_KEEP_S} (s)")));
        }
        if !(8000..=192_000).contains(&self.rate) {
            return Err(("rate", "must be 8000..=192000 (Hz)".into()));
        }
        if !(1..=ndd_wire::audio::MAX_CHANNELS).contains(&self.channels) {
            return Err(("channels", "must be 1..=8".into()));
        }
        if self.device.is_some() && self.virtual_source.is_some() {
            return Err((
                "virtual_source",
                "give `device` (play into an existing sink) or `virtual_source` (create a source \
                 programs record from), not both"
                    .into(),
            ));
        }
        match self.max_wait_ms {
            Some(ms) if !(10..=10_000).contains(&ms) => {
                return Err(("max_wait_ms", "must be 10..=10000".into()));
            }
            Some(_) if self.virtual_source.is_none() => {
                return Err((
                    "max_wait_ms",
                    "applies to a `virtual_source` (its FIFO); a sink's buffer is `latency_ms`"
                        .into(),
                ));
            }
            _ => {}
        }
        for (key, v) in [
            ("device", &self.device),
            ("virtual_source", &self.virtual_source),
        ] {
            if let Some(v) = v {
                check_device_name(v).map_err(|e| (key, e))?;
            }
        }
        check_server(&self.server)
    }
}

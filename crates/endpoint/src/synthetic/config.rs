//! Parameters of the `synthetic` and `spacenav-sim` sources, as written in a config file.

use serde::{Deserialize, Serialize};

/// `synthetic` source parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SyntheticConfig {
    /// Payload bytes per frame.
    pub size: usize,
    /// Milliseconds between frames; 0 = unpaced.
    pub interval_ms: f64,
    /// Frames to send; unlimited when `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// Content seed.
    pub seed: u64,
    /// Every frame carries frame 0's payload, made once before the first frame and shared
    /// (no per-frame cost: for throughput benchmarks, where making 1 MB of pseudo-random bytes
    /// per frame would be measured too). A `check` sink verifies frame 0 only.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub repeat: bool,
}

impl Default for SyntheticConfig {
    fn default() -> Self {
        SyntheticConfig {
            size: 100,
            interval_ms: 16.0,
            count: None,
            seed: 1,
            repeat: false,
        }
    }
}

/// `spacenav-sim` source parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SpacenavSimConfig {
    /// Records per second.
    pub rate_hz: f64,
    /// Records to send; unlimited when `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// Motion seed.
    pub seed: u64,
}

impl Default for SpacenavSimConfig {
    fn default() -> Self {
        SpacenavSimConfig {
            rate_hz: 62.5,
            count: None,
            seed: 1,
        }
    }
}

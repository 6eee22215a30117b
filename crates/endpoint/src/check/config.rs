//! Parameters of the `check` and `null` sinks, as written in a config file.

use serde::{Deserialize, Serialize};

/// `check` sink parameters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CheckConfig {
    /// Verify synthetic content made with this seed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Expected payload length (default: each frame's own).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<usize>,
    /// Expected number of frames.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expect: Option<u64>,
}

/// `null` sink: no parameters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NullConfig {}

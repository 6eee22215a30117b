//! The explicit, closed registry of pairs: [`ModuleConfig`] is the one enum a config file's
//! `type = "…"` selects from, and every dispatch over it is an exhaustive `match`. Adding a
//! pair means adding a variant here and a folder beside this file; the compiler then points
//! at every place that must learn about it.

use crate::{bundle, checksum, pass};
use ndd_core::{Half, ModuleError, Pair};
use serde::Deserialize;

/// Module ids announced in the handshake. Never reuse or renumber one: peers compare them.
#[derive(Debug)]
pub struct Ids {
    /// `pass`
    pub pass: u16,
    /// `checksum`
    pub checksum: u16,
    /// `bundle`
    pub bundle: u16,
}

/// The ids in use.
pub const IDS: Ids = Ids {
    pass: 1,
    checksum: 2,
    bundle: 3,
};

/// One parameter of a pair, for `ndd modules` and the docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamInfo {
    /// Key in the config file.
    pub name: &'static str,
    /// Type and allowed range.
    pub ty: &'static str,
    /// Default, as written in a config file.
    pub default: &'static str,
    /// What it does.
    pub doc: &'static str,
}

/// Catalogue entry of a pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModuleInfo {
    /// `type = "…"` in config files.
    pub name: &'static str,
    /// Id in the handshake.
    pub id: u16,
    /// One line.
    pub summary: &'static str,
    /// Parameters in canonical order.
    pub params: &'static [ParamInfo],
}

/// Every pair, in id order.
pub const CATALOGUE: &[ModuleInfo] = &[pass::INFO, checksum::INFO, bundle::INFO];

/// A pair with its parameters, as written in a stack: `{ type = "bundle", count = 10 }`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ModuleConfig {
    /// See [`pass`].
    Pass(pass::PassConfig),
    /// See [`checksum`].
    Checksum(checksum::ChecksumConfig),
    /// See [`bundle`].
    Bundle(bundle::BundleConfig),
}

impl ModuleConfig {
    fn pair(&self) -> &dyn Pair {
        match self {
            ModuleConfig::Pass(c) => c,
            ModuleConfig::Checksum(c) => c,
            ModuleConfig::Bundle(c) => c,
        }
    }

    /// The catalogue entry of this pair.
    pub fn info(&self) -> &'static ModuleInfo {
        match self {
            ModuleConfig::Pass(_) => &pass::INFO,
            ModuleConfig::Checksum(_) => &checksum::INFO,
            ModuleConfig::Bundle(_) => &bundle::INFO,
        }
    }

    /// Checks parameter ranges; the message names the parameter and the allowed range.
    pub fn validate(&self) -> Result<(), String> {
        match self {
            ModuleConfig::Pass(_) | ModuleConfig::Checksum(_) => Ok(()),
            ModuleConfig::Bundle(c) => c.validate(),
        }
    }

    /// The parameter hash announced in the handshake: FNV-1a 64 of [`Pair::describe`].
    pub fn param_hash(&self) -> u64 {
        ndd_wire::param_hash(&self.describe())
    }
}

impl Pair for ModuleConfig {
    fn name(&self) -> &'static str {
        self.pair().name()
    }
    fn id(&self) -> u16 {
        self.pair().id()
    }
    fn describe(&self) -> String {
        self.pair().describe()
    }
    fn forward(&self) -> Result<Box<dyn Half>, ModuleError> {
        self.pair().forward()
    }
    fn inverse(&self) -> Result<Box<dyn Half>, ModuleError> {
        self.pair().inverse()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Doc {
        stack: Vec<ModuleConfig>,
    }

    fn parse(s: &str) -> Result<Vec<ModuleConfig>, String> {
        toml::from_str::<Doc>(s)
            .map(|d| d.stack)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn stack_parses_with_defaults() {
        let s = parse(
            r#"stack = [{ type = "checksum" }, { type = "bundle", count = 4 }, { type = "pass" }]"#,
        )
        .expect("valid");
        assert_eq!(s.len(), 3);
        assert_eq!(
            s[1].describe(),
            "bundle(count=4, max_delay_ms=100, max_bytes=1048576, playout_ms=0)"
        );
        assert_eq!(s[0].describe(), "checksum");
        assert_eq!(s[0].id(), 2);
    }

    #[test]
    fn unknown_type_is_an_error_that_names_it() {
        let e = parse(r#"stack = [{ type = "frobnicate" }]"#).unwrap_err();
        assert!(e.contains("unknown variant `frobnicate`"), "{e}");
    }

    #[test]
    fn unknown_key_is_an_error_that_names_it() {
        let e = parse(r#"stack = [{ type = "bundle", cuont = 4 }]"#).unwrap_err();
        assert!(e.contains("unknown field `cuont`"), "{e}");
        let e = parse(r#"stack = [{ type = "checksum", level = 4 }]"#).unwrap_err();
        assert!(e.contains("unknown field `level`"), "{e}");
    }

    #[test]
    fn catalogue_is_complete_and_ids_unique() {
        let all = [
            ModuleConfig::Pass(Default::default()),
            ModuleConfig::Checksum(Default::default()),
            ModuleConfig::Bundle(Default::default()),
        ];
        assert_eq!(all.len(), CATALOGUE.len());
        for (m, info) in all.iter().zip(CATALOGUE) {
            assert_eq!(m.info(), info);
            assert_eq!(m.id(), info.id);
            assert_eq!(m.name(), info.name);
            m.validate().expect("defaults are valid");
            m.forward().expect("forward builds");
            m.inverse().expect("inverse builds");
        }
        let mut ids: Vec<u16> = CATALOGUE.iter().map(|i| i.id).collect();
        ids.dedup();
        assert_eq!(ids.len(), CATALOGUE.len());
    }

    #[test]
    fn param_hash_differs_with_params() {
        let a = parse(r#"stack = [{ type = "bundle", count = 4 }]"#).unwrap();
        let b = parse(r#"stack = [{ type = "bundle", count = 5 }]"#).unwrap();
        assert_ne!(a[0].param_hash(), b[0].param_hash());
        assert_eq!(a[0].param_hash(), ndd_wire::param_hash(&a[0].describe()));
    }
}

//! The explicit, closed registry of pairs: [`ModuleConfig`] is the one enum a config file's
//! `type = "…"` selects from, and every dispatch over it is an exhaustive `match`. Adding a
//! pair means adding a variant here and a folder beside this file; the compiler then points
//! at every place that must learn about it.

use crate::{
    average, buffer, bundle, checksum, compress, delta, encrypt, image, latest, multiplex, opus,
    pass, periodic, sync,
};
use ndd_core::{Half, ModuleError, Pair, ParamError};
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
    /// `compress`
    pub compress: u16,
    /// `encrypt`
    pub encrypt: u16,
    /// `buffer`
    pub buffer: u16,
    /// `average`
    pub average: u16,
    /// `periodic`
    pub periodic: u16,
    /// `latest`
    pub latest: u16,
    /// `delta`
    pub delta: u16,
    /// `sync`
    pub sync: u16,
    /// `image`
    pub image: u16,
    /// `opus`
    pub opus: u16,
    /// `multiplex`
    pub multiplex: u16,
    /// `external` (a half in another process)
    pub external: u16,
}

/// The ids in use.
pub const IDS: Ids = Ids {
    pass: 1,
    checksum: 2,
    bundle: 3,
    compress: 4,
    encrypt: 5,
    buffer: 6,
    average: 7,
    periodic: 8,
    latest: 9,
    delta: 10,
    sync: 11,
    image: 12,
    opus: 13,
    multiplex: 14,
    external: ndd_ipc::EXTERNAL_ID,
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
pub const CATALOGUE: &[ModuleInfo] = &[
    pass::INFO,
    checksum::INFO,
    bundle::INFO,
    compress::INFO,
    encrypt::INFO,
    buffer::INFO,
    average::INFO,
    periodic::INFO,
    latest::INFO,
    delta::INFO,
    sync::INFO,
    image::INFO,
    opus::INFO,
    multiplex::INFO,
    EXTERNAL_INFO,
];

/// Catalogue entry of `external` (the pair itself lives in `ndd-ipc`).
pub const EXTERNAL_INFO: ModuleInfo = ModuleInfo {
    name: "external",
    id: IDS.external,
    summary: "a pair whose halves are programs in any language, over pipes or shared memory (docs/external-modules.md)",
    params: &[
        ParamInfo { name: "name", ty: "string", default: "(required)", doc: "module name: in errors, logs and the handshake" },
        ParamInfo { name: "forward", ty: "[string]", default: "(required)", doc: "argv of the source-side program" },
        ParamInfo { name: "inverse", ty: "[string]", default: "(required)", doc: "argv of the sink-side program" },
        ParamInfo { name: "placement", ty: "pipe | shm", default: "pipe", doc: "frames over stdin/stdout or a shared-memory ring" },
        ParamInfo { name: "timeout_ms", ty: "integer", default: "1000", doc: "longest wait for the program's answer" },
        ParamInfo { name: "restart", ty: "never | on-failure", default: "never", doc: "what happens when the program dies or hangs" },
        ParamInfo { name: "ring_kib", ty: "integer", default: "1024", doc: "shm ring size per direction" },
        ParamInfo { name: "spin", ty: "integer", default: "2000", doc: "shm polls before sleeping on the futex" },
        ParamInfo { name: "arena_kib", ty: "integer", default: "4096", doc: "shm frame area where a child rewrites frames in place (0 = off)" },
    ],
};

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
    /// See [`compress`].
    Compress(compress::CompressConfig),
    /// See [`encrypt`].
    Encrypt(encrypt::EncryptConfig),
    /// See [`buffer`].
    Buffer(buffer::BufferConfig),
    /// See [`average`].
    Average(average::AverageConfig),
    /// See [`periodic`].
    Periodic(periodic::PeriodicConfig),
    /// See [`latest`].
    Latest(latest::LatestConfig),
    /// See [`delta`].
    Delta(delta::DeltaConfig),
    /// See [`sync`].
    Sync(sync::SyncConfig),
    /// See [`image`].
    Image(image::ImageConfig),
    /// See [`opus`].
    Opus(opus::OpusConfig),
    /// See [`multiplex`].
    Multiplex(multiplex::MultiplexConfig),
    /// See `ndd_ipc::ExternalConfig`.
    External(ndd_ipc::ExternalConfig),
}

impl ModuleConfig {
    /// Why this pair drops frames by design, if it does: such a pair cannot run on a
    /// `reliable` stream (whose frames must all arrive), only on a `lossy` one.
    pub fn drops_frames(&self) -> Option<&'static str> {
        match self {
            ModuleConfig::Periodic(_) => {
                Some("`periodic` forwards only the latest value every interval")
            }
            ModuleConfig::Latest(_) => {
                Some("`latest` drops the frames that are stale while the link is busy")
            }
            ModuleConfig::Pass(_)
            | ModuleConfig::Checksum(_)
            | ModuleConfig::Bundle(_)
            | ModuleConfig::Compress(_)
            | ModuleConfig::Encrypt(_)
            | ModuleConfig::Buffer(_)
            | ModuleConfig::Average(_)
            | ModuleConfig::Delta(_)
            | ModuleConfig::Sync(_)
            | ModuleConfig::Image(_)
            | ModuleConfig::Opus(_)
            | ModuleConfig::Multiplex(_)
            | ModuleConfig::External(_) => None,
        }
    }

    /// Why this pair needs every frame, in order, if it does: such a pair cannot run on a
    /// `lossy` stream.
    pub fn needs_every_frame(&self) -> Option<&'static str> {
        match self {
            ModuleConfig::Image(_) => Some(
                "`image` sends only what changed since its earlier frames, and paces the source by its credit",
            ),
            ModuleConfig::Pass(_)
            | ModuleConfig::Checksum(_)
            | ModuleConfig::Bundle(_)
            | ModuleConfig::Compress(_)
            | ModuleConfig::Encrypt(_)
            | ModuleConfig::Buffer(_)
            | ModuleConfig::Average(_)
            | ModuleConfig::Periodic(_)
            | ModuleConfig::Latest(_)
            | ModuleConfig::Delta(_)
            | ModuleConfig::Sync(_)
            | ModuleConfig::Opus(_)
            | ModuleConfig::Multiplex(_)
            | ModuleConfig::External(_) => None,
        }
    }

    fn pair(&self) -> &dyn Pair {
        match self {
            ModuleConfig::Pass(c) => c,
            ModuleConfig::Checksum(c) => c,
            ModuleConfig::Bundle(c) => c,
            ModuleConfig::Compress(c) => c,
            ModuleConfig::Encrypt(c) => c,
            ModuleConfig::Buffer(c) => c,
            ModuleConfig::Average(c) => c,
            ModuleConfig::Periodic(c) => c,
            ModuleConfig::Latest(c) => c,
            ModuleConfig::Delta(c) => c,
            ModuleConfig::Sync(c) => c,
            ModuleConfig::Image(c) => c,
            ModuleConfig::Opus(c) => c,
            ModuleConfig::Multiplex(c) => c,
            ModuleConfig::External(c) => c,
        }
    }

    /// The catalogue entry of this pair.
    pub fn info(&self) -> &'static ModuleInfo {
        match self {
            ModuleConfig::Pass(_) => &pass::INFO,
            ModuleConfig::Checksum(_) => &checksum::INFO,
            ModuleConfig::Bundle(_) => &bundle::INFO,
            ModuleConfig::Compress(_) => &compress::INFO,
            ModuleConfig::Encrypt(_) => &encrypt::INFO,
            ModuleConfig::Buffer(_) => &buffer::INFO,
            ModuleConfig::Average(_) => &average::INFO,
            ModuleConfig::Periodic(_) => &periodic::INFO,
            ModuleConfig::Latest(_) => &latest::INFO,
            ModuleConfig::Delta(_) => &delta::INFO,
            ModuleConfig::Sync(_) => &sync::INFO,
            ModuleConfig::Image(_) => &image::INFO,
            ModuleConfig::Opus(_) => &opus::INFO,
            ModuleConfig::Multiplex(_) => &multiplex::INFO,
            ModuleConfig::External(_) => &EXTERNAL_INFO,
        }
    }

    /// The file-system paths among the parameters that are set (the `encrypt` key or
    /// passphrase file), so a config loader can resolve relative ones against the config
    /// file's directory. `external` argv is not included: it is part of the handshake's
    /// parameter hash and must read the same on both sides.
    pub fn paths_mut(&mut self) -> Vec<&mut std::path::PathBuf> {
        match self {
            ModuleConfig::Encrypt(c) => [&mut c.key_file, &mut c.passphrase_file]
                .into_iter()
                .filter(|p| !p.as_os_str().is_empty())
                .collect(),
            ModuleConfig::Pass(_)
            | ModuleConfig::Checksum(_)
            | ModuleConfig::Bundle(_)
            | ModuleConfig::Compress(_)
            | ModuleConfig::Buffer(_)
            | ModuleConfig::Average(_)
            | ModuleConfig::Periodic(_)
            | ModuleConfig::Latest(_)
            | ModuleConfig::Delta(_)
            | ModuleConfig::Sync(_)
            | ModuleConfig::Image(_)
            | ModuleConfig::Opus(_)
            | ModuleConfig::Multiplex(_)
            | ModuleConfig::External(_) => vec![],
        }
    }

    /// Checks parameter ranges; the error names the parameter and the allowed range.
    pub fn validate(&self) -> Result<(), ParamError> {
        match self {
            ModuleConfig::Pass(_) | ModuleConfig::Checksum(_) => Ok(()),
            ModuleConfig::Bundle(c) => c.validate(),
            ModuleConfig::Compress(c) => c.validate(),
            ModuleConfig::Encrypt(c) => c.validate(),
            ModuleConfig::Buffer(c) => c.validate(),
            ModuleConfig::Average(c) => c.validate(),
            ModuleConfig::Periodic(c) => c.validate(),
            ModuleConfig::Latest(c) => c.validate(),
            ModuleConfig::Delta(c) => c.validate(),
            ModuleConfig::Sync(c) => c.validate(),
            ModuleConfig::Image(c) => c.validate(),
            ModuleConfig::Opus(c) => c.validate(),
            ModuleConfig::Multiplex(c) => c.validate(),
            ModuleConfig::External(c) => c.validate(),
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

    #[test]
    fn the_external_entry_lists_the_pairs_own_parameters() {
        // The pair lives in ndd-ipc with its own table; this catalogue entry must not drift.
        let ours: Vec<(&str, String)> = EXTERNAL_INFO
            .params
            .iter()
            .map(|p| (p.name, p.default.replace('"', "")))
            .collect();
        let theirs: Vec<(&str, String)> = ndd_ipc::external::PARAMS
            .iter()
            .map(|&(name, _, default, _)| (name, default.replace('"', "")))
            .collect();
        assert_eq!(ours, theirs);
    }

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
        // encrypt needs a key: give its default a key file.
        let dir = std::env::temp_dir().join(format!("ndd-registry-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = dir.join("key");
        std::fs::write(&key, [7u8; 32]).unwrap();
        std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        let all = [
            ModuleConfig::Pass(Default::default()),
            ModuleConfig::Checksum(Default::default()),
            ModuleConfig::Bundle(Default::default()),
            ModuleConfig::Compress(Default::default()),
            ModuleConfig::Encrypt(encrypt::EncryptConfig {
                key_file: key.clone(),
                ..Default::default()
            }),
            ModuleConfig::Buffer(Default::default()),
            ModuleConfig::Average(Default::default()),
            ModuleConfig::Periodic(Default::default()),
            ModuleConfig::Latest(Default::default()),
            ModuleConfig::Delta(Default::default()),
            ModuleConfig::Sync(Default::default()),
            ModuleConfig::Image(Default::default()),
            ModuleConfig::Opus(Default::default()),
            ModuleConfig::Multiplex(Default::default()),
        ];
        // `external` needs a program to run; it is tested in ndd-ipc.
        assert_eq!(all.len() + 1, CATALOGUE.len());
        assert_eq!(CATALOGUE.last().map(|i| i.name), Some("external"));
        for (m, info) in all.iter().zip(CATALOGUE) {
            assert_eq!(m.info(), info);
            assert_eq!(m.id(), info.id);
            assert_eq!(m.name(), info.name);
            m.validate().expect("defaults are valid");
            m.forward().expect("forward builds");
            m.inverse().expect("inverse builds");
        }
        let _ = std::fs::remove_dir_all(&dir);
        let mut ids: Vec<u16> = CATALOGUE.iter().map(|i| i.id).collect();
        ids.sort();
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

/// What starting `image` or `opus` says in a build without the `media` feature.
#[cfg(not(feature = "media"))]
pub(crate) fn not_built_in(pair: &'static str) -> ModuleError {
    ModuleError::from(ndd_core::SetupError::Failed {
        pair,
        what: "this ndd was built without the media pairs (image, opus): build it with its default features (`./run ndd`, or `cargo build --release -p ndd-cli`)",
    })
}

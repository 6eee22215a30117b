//! Pinned peers: the `known_peers` file, as SSH's `known_hosts`.
//!
//! ```text
//! # comments and blank lines are ignored
//! SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU  laptop
//! SHA256:n4bQgYhMfWWaL+qgxVrQFaO/TxsrC4Is0V1sFbDwCgg
//! ```
//!
//! One peer a line: its fingerprint, then optionally a name (the rest of the line, trimmed).
//! The file is written with mode 0600; a file other users can write to is refused, since
//! whoever can write it decides whom this machine trusts.

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use base64::Engine as _;

use crate::identity::{create_home, read_bounded, BoundedRead, FINGERPRINT_PREFIX};
use crate::{LinkError, Result};

/// File name of the trust list inside the home directory.
pub const KNOWN_PEERS_FILE: &str = "known_peers";

/// A pinned peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trusted {
    /// The name given when it was trusted, if any.
    pub name: Option<String>,
}

/// The parsed `known_peers` file.
#[derive(Debug, Clone, Default)]
pub struct KnownPeers {
    path: PathBuf,
    peers: HashMap<String, Trusted>,
}

impl KnownPeers {
    /// Load `home/known_peers`. A missing file is an empty list; a malformed line is an error
    /// naming the file and the line.
    pub fn load(home: &Path) -> Result<KnownPeers> {
        let path = home.join(KNOWN_PEERS_FILE);
        let text = match read_bounded(&path) {
            Ok(bytes) => bytes,
            Err(BoundedRead::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(KnownPeers {
                    path,
                    peers: HashMap::new(),
                })
            }
            Err(BoundedRead::Io(e)) => return Err(LinkError::file("reading", &path, e)),
            Err(BoundedRead::Shape(e)) => return Err(e),
        };
        check_not_writable_by_others(&path)?;
        let peers = parse(&path, &text)?;
        Ok(KnownPeers { path, peers })
    }

    /// The pinned peer with this fingerprint.
    pub fn lookup(&self, fingerprint: &str) -> Option<&Trusted> {
        self.peers.get(fingerprint)
    }

    /// The pinned peer with this fingerprint, or [`LinkError::UnknownPeer`], whose text shows
    /// the fingerprint and the command that trusts it.
    pub fn verify(&self, fingerprint: &str) -> Result<&Trusted> {
        self.lookup(fingerprint)
            .ok_or_else(|| LinkError::UnknownPeer {
                fingerprint: fingerprint.to_owned(),
                known_peers: self.path.clone(),
                trust_command: self.trust_command(fingerprint),
            })
    }

    /// The command a user runs to pin `fingerprint` in this list (`--home` added when this
    /// list is not in [`crate::default_home`]).
    pub fn trust_command(&self, fingerprint: &str) -> String {
        let home = self.path.parent().unwrap_or(Path::new(""));
        if home == crate::identity::default_home() {
            format!("ndd trust {fingerprint} --name NAME")
        } else {
            format!(
                "ndd trust {fingerprint} --name NAME --home {}",
                shell_quote(&home.display().to_string())
            )
        }
    }

    /// Number of pinned peers.
    pub fn len(&self) -> usize {
        self.peers.len()
    }

    /// True when no peer is pinned.
    pub fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }

    /// The file this list was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// All pinned peers, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Trusted)> {
        self.peers.iter().map(|(fp, t)| (fp.as_str(), t))
    }

    /// Pin `fingerprint` (with an optional name) in `home/known_peers`, creating the home
    /// directory (0700) and the file (0600) if needed. Returns `true` if the peer was added,
    /// `false` if it was already pinned (the file is then left unchanged, whatever `name`).
    pub fn trust(home: &Path, fingerprint: &str, name: Option<&str>) -> Result<bool> {
        validate_fingerprint(fingerprint)?;
        let name = name.map(str::trim).filter(|n| !n.is_empty());
        if let Some(name) = name {
            validate_name(name)?;
        }
        let existing = KnownPeers::load(home)?;
        if existing.lookup(fingerprint).is_some() {
            return Ok(false);
        }
        create_home(home)?;
        let path = existing.path;
        // `load` above has read it already, bounded: it is a small regular file or missing.
        let needs_newline = match read_bounded(&path) {
            Ok(bytes) => bytes.last().is_some_and(|&b| b != b'\n'),
            Err(_) => false,
        };
        let mut line = String::new();
        if needs_newline {
            line.push('\n');
        }
        line.push_str(fingerprint);
        if let Some(name) = name {
            line.push(' ');
            line.push_str(name);
        }
        line.push('\n');
        let result = (|| {
            let mut file = fs::OpenOptions::new()
                .append(true)
                .create(true)
                .mode(0o600)
                .open(&path)?;
            file.write_all(line.as_bytes())?;
            file.sync_all()
        })();
        result.map_err(|e| LinkError::file("writing", &path, e))?;
        tracing::info!(fingerprint, name, file = %path.display(), "peer trusted");
        Ok(true)
    }
}

impl KnownPeers {
    /// Stop trusting a peer: remove every line of `home/known_peers` whose fingerprint is
    /// `who`, or whose name is exactly `who` (comments and other lines are kept; the file is
    /// replaced atomically, mode 0600). Returns the fingerprints removed (empty: nobody
    /// matched, the file is untouched).
    pub fn untrust(home: &Path, who: &str) -> Result<Vec<String>> {
        let who = who.trim();
        let existing = KnownPeers::load(home)?;
        let path = existing.path;
        let text = match read_bounded(&path) {
            Ok(bytes) => bytes,
            Err(_) => return Ok(Vec::new()),
        };
        let mut kept = Vec::with_capacity(text.len());
        let mut removed = Vec::new();
        for raw in text.split_inclusive(|&b| b == b'\n') {
            // `load` parsed every line: each is UTF-8 and each peer line starts with a
            // valid fingerprint.
            let line = String::from_utf8_lossy(raw);
            let line = line.trim();
            let (fp, name) = match line.split_once(char::is_whitespace) {
                Some((fp, rest)) => (fp, rest.trim()),
                None => (line, ""),
            };
            let peer_line = !line.is_empty() && !line.starts_with('#');
            if peer_line && (fp == who || (!name.is_empty() && name == who)) {
                if !removed.iter().any(|r| r == fp) {
                    removed.push(fp.to_owned());
                }
                continue;
            }
            kept.extend_from_slice(raw);
        }
        if removed.is_empty() {
            return Ok(removed);
        }
        let tmp = path.with_extension("new");
        let result = (|| {
            let _ = fs::remove_file(&tmp);
            let mut file = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)?;
            file.write_all(&kept)?;
            file.sync_all()?;
            fs::rename(&tmp, &path)
        })();
        result.map_err(|e| LinkError::file("writing", &path, e))?;
        tracing::info!(who, file = %path.display(), "peer no longer trusted");
        Ok(removed)
    }
}

/// Check that `s` is a fingerprint: `SHA256:` + 43 base64 characters (standard alphabet, no
/// padding) encoding 32 bytes.
pub fn validate_fingerprint(s: &str) -> Result<()> {
    let bad = |reason| LinkError::BadFingerprint {
        input: s.to_owned(),
        reason,
    };
    let b64 = s
        .strip_prefix(FINGERPRINT_PREFIX)
        .ok_or_else(|| bad("it does not start with `SHA256:`"))?;
    if b64.len() != 43 {
        return Err(bad("the part after `SHA256:` must be 43 characters long"));
    }
    if !b64
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/')
    {
        return Err(bad(
            "the part after `SHA256:` may hold only A-Z, a-z, 0-9, `+` and `/`",
        ));
    }
    match base64::engine::general_purpose::STANDARD_NO_PAD.decode(b64) {
        Ok(bytes) if bytes.len() == 32 => Ok(()),
        _ => Err(bad(
            "the part after `SHA256:` is not the base64 of a SHA-256 hash",
        )),
    }
}

/// `s` as one shell word.
fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-+:,@%".contains(&b));
    if plain {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

fn validate_name(name: &str) -> Result<()> {
    if name.chars().any(char::is_control) {
        return Err(LinkError::BadPeerName {
            name: name.to_owned(),
            reason: "it contains control characters (newlines, tabs, …)",
        });
    }
    Ok(())
}

fn parse(path: &Path, bytes: &[u8]) -> Result<HashMap<String, Trusted>> {
    let mut peers = HashMap::new();
    for (index, raw) in bytes.split(|&b| b == b'\n').enumerate() {
        let line_no = index + 1;
        let err = |reason: String| LinkError::KnownPeersLine {
            path: path.to_owned(),
            line: line_no,
            reason,
        };
        let line = std::str::from_utf8(raw)
            .map_err(|_| err("the line is not valid UTF-8".to_owned()))?
            .trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (fingerprint, name) = match line.split_once(char::is_whitespace) {
            Some((fp, rest)) => (fp, Some(rest.trim())),
            None => (line, None),
        };
        validate_fingerprint(fingerprint).map_err(|e| err(e.to_string()))?;
        let name = name.filter(|n| !n.is_empty()).map(str::to_owned);
        // A repeated fingerprint keeps its first name, like the first match in SSH.
        peers
            .entry(fingerprint.to_owned())
            .or_insert(Trusted { name });
    }
    Ok(peers)
}

fn check_not_writable_by_others(path: &Path) -> Result<()> {
    let meta = fs::metadata(path).map_err(|e| LinkError::file("reading", path, e))?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(LinkError::TrustFilePermissions {
            path: path.to_owned(),
            mode,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FP: &str = "SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU";

    #[test]
    fn fingerprint_format() {
        validate_fingerprint(FP).unwrap();
        for bad in [
            "",
            "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU",
            "MD5:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU",
            "SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuF",
            "SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=",
            "SHA256:47DEQpj8HBSa-_TImW+5JCeuQeRkm5NMpJWZG3hSuFU",
            // Last character carries bits past the 32 bytes.
            "SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFV",
        ] {
            let e = validate_fingerprint(bad).unwrap_err().to_string();
            assert!(e.contains("is not a fingerprint"), "{bad}: {e}");
        }
    }

    #[test]
    fn untrust_removes_by_fingerprint_or_name_and_keeps_the_rest() {
        let dir = std::env::temp_dir().join(format!("ndd-untrust-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let other = "SHA256:n4bQgYhMfWWaL+qgxVrQFaO/TxsrC4Is0V1sFbDwCgg";
        assert!(KnownPeers::trust(&dir, FP, Some("laptop")).unwrap());
        assert!(KnownPeers::trust(&dir, other, Some("desk")).unwrap());
        let path = dir.join(KNOWN_PEERS_FILE);
        let mut text = fs::read_to_string(&path).unwrap();
        text.insert_str(0, "# mine\n");
        fs::write(&path, &text).unwrap();
        assert_eq!(
            KnownPeers::untrust(&dir, "nobody").unwrap(),
            Vec::<String>::new()
        );
        assert_eq!(
            KnownPeers::untrust(&dir, "laptop").unwrap(),
            vec![FP.to_string()]
        );
        let left = KnownPeers::load(&dir).unwrap();
        assert!(left.lookup(FP).is_none());
        assert_eq!(left.lookup(other).unwrap().name.as_deref(), Some("desk"));
        assert_eq!(
            fs::read_to_string(&path).unwrap(),
            format!("# mine\n{other} desk\n")
        );
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(
            KnownPeers::untrust(&dir, other).unwrap(),
            vec![other.to_string()]
        );
        assert!(KnownPeers::load(&dir).unwrap().is_empty());
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn parse_names_and_comments() {
        let text = format!("# c\n\n{FP}   my  laptop  \n  {FP} other\n");
        let peers = parse(Path::new("kp"), text.as_bytes()).unwrap();
        assert_eq!(peers.len(), 1);
        assert_eq!(peers[FP].name.as_deref(), Some("my  laptop"));
        let peers = parse(Path::new("kp"), FP.as_bytes()).unwrap();
        assert_eq!(peers[FP].name, None);
    }

    #[test]
    fn trust_command_quotes_the_home() {
        let peers = KnownPeers {
            path: PathBuf::from("/tmp/it's here/known_peers"),
            peers: HashMap::new(),
        };
        assert_eq!(
            peers.trust_command(FP),
            format!("ndd trust {FP} --name NAME --home '/tmp/it'\\''s here'")
        );
        let peers = KnownPeers {
            path: crate::default_home().join(KNOWN_PEERS_FILE),
            peers: HashMap::new(),
        };
        assert_eq!(
            peers.trust_command(FP),
            format!("ndd trust {FP} --name NAME")
        );
    }

    #[test]
    fn bad_line_names_file_and_line() {
        let text = format!("# ok\n{FP} a\nnot-a-fingerprint b\n");
        let e = parse(Path::new("/h/known_peers"), text.as_bytes())
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("/h/known_peers:3: "), "{e}");
        assert!(
            e.contains("`not-a-fingerprint` is not a fingerprint"),
            "{e}"
        );
    }
}

//! This machine's identity: a key pair and a self-signed certificate in the ndd home directory.
//!
//! ```text
//! $NDD_HOME/            mode 0700 when we create it
//!   key.pem             PKCS#8 ECDSA P-256 private key, mode 0600 (checked on every load)
//!   cert.pem            self-signed X.509 certificate, CN "ndd", mode 0600
//!   known_peers         see `trust`
//! ```
//!
//! The fingerprint identifies the *key*, not the certificate: it is
//! `"SHA256:" + base64(SHA-256(SubjectPublicKeyInfo DER))`, standard alphabet, no padding
//! (the same shape as OpenSSH's key fingerprints).

use std::fmt;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use base64::Engine as _;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::{LinkError, Result};

/// File name of the private key inside the home directory.
pub const KEY_FILE: &str = "key.pem";
/// File name of the certificate inside the home directory.
pub const CERT_FILE: &str = "cert.pem";
/// Prefix of every fingerprint.
pub const FINGERPRINT_PREFIX: &str = "SHA256:";
/// The certificate's subject common name.
pub const CERT_COMMON_NAME: &str = "ndd";

/// The ndd home directory: `$NDD_HOME`, else `$XDG_CONFIG_HOME/ndd`, else `$HOME/.config/ndd`
/// (else `.ndd` in the current directory if not even `HOME` is set). Empty variables count
/// as unset; a relative `XDG_CONFIG_HOME` is ignored, as the XDG spec says.
pub fn default_home() -> PathBuf {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(home) = var("NDD_HOME") {
        return PathBuf::from(home);
    }
    if let Some(xdg) = var("XDG_CONFIG_HOME").map(PathBuf::from) {
        if xdg.is_absolute() {
            return xdg.join("ndd");
        }
    }
    match var("HOME") {
        Some(home) => PathBuf::from(home).join(".config").join("ndd"),
        None => PathBuf::from(".ndd"),
    }
}

/// This machine's key pair and self-signed certificate.
pub struct Identity {
    home: PathBuf,
    cert: CertificateDer<'static>,
    key: PrivateKeyDer<'static>,
    spki: Vec<u8>,
    fingerprint: String,
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the private key.
        f.debug_struct("Identity")
            .field("home", &self.home)
            .field("fingerprint", &self.fingerprint)
            .finish_non_exhaustive()
    }
}

impl Clone for Identity {
    fn clone(&self) -> Self {
        Identity {
            home: self.home.clone(),
            cert: self.cert.clone(),
            key: self.key.clone_key(),
            spki: self.spki.clone(),
            fingerprint: self.fingerprint.clone(),
        }
    }
}

impl Identity {
    /// Load the identity in `home`, creating one if neither file exists. Returns it and
    /// whether it was created just now.
    ///
    /// If only one of `key.pem` and `cert.pem` exists, that is an error (nothing is
    /// overwritten).
    pub fn load_or_create(home: &Path) -> Result<(Identity, bool)> {
        let key = home.join(KEY_FILE);
        let cert = home.join(CERT_FILE);
        if exists(&key)? || exists(&cert)? {
            Ok((Identity::load(home)?, false))
        } else {
            Ok((Identity::create(home, false)?, true))
        }
    }

    /// Load the identity in `home`. Checks that `key.pem` is readable by its owner only, that
    /// both files parse and that the key belongs to the certificate.
    pub fn load(home: &Path) -> Result<Identity> {
        let key_path = home.join(KEY_FILE);
        let cert_path = home.join(CERT_FILE);
        for path in [&key_path, &cert_path] {
            if !exists(path)? {
                return Err(LinkError::NoIdentity {
                    home: home.to_owned(),
                    missing: path.clone(),
                });
            }
        }
        check_home(home)?;
        check_private_mode(&key_path)?;
        let key_pem = read(&key_path)?;
        let cert_pem = read(&cert_path)?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| LinkError::BadPem {
            path: key_path.clone(),
            what: "private key",
            reason: e.to_string(),
        })?;
        let cert = CertificateDer::from_pem_slice(&cert_pem).map_err(|e| LinkError::BadPem {
            path: cert_path.clone(),
            what: "certificate",
            reason: e.to_string(),
        })?;
        Identity::from_der(home, cert, key, &key_path, &cert_path)
    }

    /// Generate a new key pair and certificate and store them in `home` (created with mode
    /// 0700 if missing). Refuses to replace an existing key or certificate unless `force`.
    pub fn create(home: &Path, force: bool) -> Result<Identity> {
        let key_path = home.join(KEY_FILE);
        let cert_path = home.join(CERT_FILE);
        if !force {
            for path in [&key_path, &cert_path] {
                if exists(path)? {
                    return Err(LinkError::KeyExists { path: path.clone() });
                }
            }
        }
        create_home(home)?;

        let key_pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let mut params = rcgen::CertificateParams::new(vec![crate::tls::SERVER_NAME.to_owned()])?;
        let mut dn = rcgen::DistinguishedName::new();
        dn.push(rcgen::DnType::CommonName, CERT_COMMON_NAME);
        params.distinguished_name = dn;
        let cert = params.self_signed(&key_pair)?;

        write_private(&key_path, key_pair.serialize_pem().as_bytes())?;
        write_private(&cert_path, cert.pem().as_bytes())?;

        let key =
            PrivateKeyDer::try_from(key_pair.serialize_der()).map_err(|e| LinkError::BadKey {
                path: key_path.clone(),
                reason: e.to_owned(),
            })?;
        let identity = Identity::from_der(home, cert.der().clone(), key, &key_path, &cert_path)?;
        tracing::info!(home = %home.display(), fingerprint = %identity.fingerprint, "created a new identity");
        Ok(identity)
    }

    fn from_der(
        home: &Path,
        cert: CertificateDer<'static>,
        key: PrivateKeyDer<'static>,
        key_path: &Path,
        cert_path: &Path,
    ) -> Result<Identity> {
        let spki = der::cert_spki(&cert)?.to_vec();
        let fingerprint = fingerprint_of_spki(&spki);
        let provider = crate::tls::provider();
        // Loads the key with the provider we will sign with, and compares its public key with
        // the certificate's.
        match rustls::sign::CertifiedKey::from_der(vec![cert.clone()], key.clone_key(), &provider) {
            Ok(_) => {}
            Err(rustls::Error::InconsistentKeys(_)) => {
                return Err(LinkError::KeyMismatch {
                    key: key_path.to_owned(),
                    cert: cert_path.to_owned(),
                })
            }
            Err(e) => {
                return Err(LinkError::BadKey {
                    path: key_path.to_owned(),
                    reason: e.to_string(),
                })
            }
        }
        Ok(Identity {
            home: home.to_owned(),
            cert,
            key,
            spki,
            fingerprint,
        })
    }

    /// This identity's fingerprint, `SHA256:…`.
    pub fn fingerprint(&self) -> String {
        self.fingerprint.clone()
    }

    /// The home directory it was loaded from.
    pub fn home(&self) -> &Path {
        &self.home
    }

    /// The certificate, DER.
    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert
    }

    /// The certificate's SubjectPublicKeyInfo, DER (what the fingerprint hashes).
    pub fn spki_der(&self) -> &[u8] {
        &self.spki
    }

    /// The private key, DER (PKCS#8).
    pub fn key_der(&self) -> &PrivateKeyDer<'static> {
        &self.key
    }

    /// Path of the private key file.
    pub fn key_path(&self) -> PathBuf {
        self.home.join(KEY_FILE)
    }

    /// Path of the certificate file.
    pub fn cert_path(&self) -> PathBuf {
        self.home.join(CERT_FILE)
    }
}

/// Fingerprint of a DER SubjectPublicKeyInfo: `SHA256:` + base64 (standard, no padding).
pub fn fingerprint_of_spki(spki_der: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, spki_der);
    format!(
        "{FINGERPRINT_PREFIX}{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest.as_ref())
    )
}

/// Fingerprint of the key in a DER X.509 certificate. Bad DER is an error, never a panic.
pub fn fingerprint_of_cert(der: &[u8]) -> Result<String> {
    Ok(fingerprint_of_spki(der::cert_spki(der)?))
}

fn exists(path: &Path) -> Result<bool> {
    path.try_exists()
        .map_err(|e| LinkError::file("checking", path, e))
}

/// Largest identity or trust file read: far above any real one (a PEM key or certificate
/// is about 1 KB, a `known_peers` line about 100 bytes), far below what could hurt.
pub const MAX_FILE_BYTES: u64 = 1 << 20;

fn read(path: &Path) -> Result<Vec<u8>> {
    read_bounded(path).map_err(|e| match e {
        BoundedRead::Io(e) => LinkError::file("reading", path, e),
        BoundedRead::Shape(e) => e,
    })
}

/// Why [`read_bounded`] failed.
pub(crate) enum BoundedRead {
    /// Opening or reading failed (`NotFound` included, for callers that allow a missing file).
    Io(std::io::Error),
    /// Not a regular file, or larger than [`MAX_FILE_BYTES`].
    Shape(LinkError),
}

/// Reads a small file: a regular file of at most [`MAX_FILE_BYTES`] (so `/dev/zero`, a FIFO
/// or a huge file is an error naming it, not a hang or an out-of-memory).
pub(crate) fn read_bounded(path: &Path) -> std::result::Result<Vec<u8>, BoundedRead> {
    use std::io::Read;
    let shape = |reason: String| {
        BoundedRead::Shape(LinkError::FileShape {
            path: path.to_owned(),
            reason,
            max: MAX_FILE_BYTES,
        })
    };
    let meta = fs::metadata(path).map_err(BoundedRead::Io)?;
    if !meta.is_file() {
        return Err(shape("not a regular file".into()));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(shape(format!("{} bytes", meta.len())));
    }
    let mut buf = Vec::new();
    fs::File::open(path)
        .and_then(|f| f.take(MAX_FILE_BYTES + 1).read_to_end(&mut buf))
        .map_err(BoundedRead::Io)?;
    if buf.len() as u64 > MAX_FILE_BYTES {
        return Err(shape("it grew while being read".into()));
    }
    Ok(buf)
}

/// Refuse a home directory others can write to; warn when others can read it (as ssh does).
pub fn check_home(home: &Path) -> Result<()> {
    let meta = fs::metadata(home).map_err(|e| LinkError::file("checking", home, e))?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(LinkError::HomePermissions {
            path: home.to_owned(),
            mode,
        });
    }
    if mode & 0o055 != 0 {
        tracing::warn!(
            "{} has permissions {mode:04o}: other users can list it; chmod 700 {} keeps it private",
            home.display(),
            home.display()
        );
    }
    Ok(())
}

/// Refuse a key file that anyone but its owner may read or write.
fn check_private_mode(path: &Path) -> Result<()> {
    let meta = fs::metadata(path).map_err(|e| LinkError::file("reading", path, e))?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(LinkError::KeyPermissions {
            path: path.to_owned(),
            mode,
        });
    }
    Ok(())
}

/// Create `home` (and missing parents) with mode 0700.
pub(crate) fn create_home(home: &Path) -> Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(home)
        .map_err(|e| LinkError::file("creating directory", home, e))
}

/// Write `contents` to `path` with mode 0600, atomically (temporary file + rename).
pub(crate) fn write_private(path: &Path, contents: &[u8]) -> Result<()> {
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(format!(".tmp{}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let _ = fs::remove_file(&tmp);
    let result = (|| {
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        // The umask may have removed bits we need, never added any; set the mode exactly.
        file.set_permissions(fs::Permissions::from_mode(0o600))?;
        file.write_all(contents)?;
        file.sync_all()?;
        fs::rename(&tmp, path)
    })();
    result.map_err(|e| {
        let _ = fs::remove_file(&tmp);
        LinkError::file("writing", path, e)
    })
}

/// A minimal DER walk: just enough to find the SubjectPublicKeyInfo of a certificate.
mod der {
    use crate::{LinkError, Result};

    /// One TLV: (tag, whole TLV bytes, content, rest after it).
    struct Tlv<'a> {
        tag: u8,
        whole: &'a [u8],
        content: &'a [u8],
    }

    fn bad(what: &'static str) -> LinkError {
        LinkError::BadCertificate(what)
    }

    fn next(buf: &[u8]) -> Result<(Tlv<'_>, &[u8])> {
        let (&tag, rest) = buf.split_first().ok_or(bad("DER ends before a tag"))?;
        if tag & 0x1f == 0x1f {
            return Err(bad("DER uses a multi-byte tag, which X.509 does not"));
        }
        let (&first, mut rest) = rest.split_first().ok_or(bad("DER ends before a length"))?;
        let len = if first < 0x80 {
            usize::from(first)
        } else {
            let n = usize::from(first & 0x7f);
            if n == 0 || n > 4 {
                return Err(bad("DER length is indefinite or longer than 4 bytes"));
            }
            let bytes = rest.get(..n).ok_or(bad("DER ends inside a length"))?;
            rest = &rest[n..];
            bytes
                .iter()
                .fold(0usize, |acc, &b| (acc << 8) | usize::from(b))
        };
        let header_len = buf.len() - rest.len();
        let content = rest.get(..len).ok_or(bad("DER value runs past the end"))?;
        let total = header_len + len;
        Ok((
            Tlv {
                tag,
                whole: &buf[..total],
                content,
            },
            &buf[total..],
        ))
    }

    fn expect<'a>(buf: &'a [u8], tag: u8, what: &'static str) -> Result<(Tlv<'a>, &'a [u8])> {
        let (tlv, rest) = next(buf)?;
        if tlv.tag != tag {
            return Err(bad(what));
        }
        Ok((tlv, rest))
    }

    const SEQUENCE: u8 = 0x30;
    const INTEGER: u8 = 0x02;
    const VERSION: u8 = 0xa0;

    /// The SubjectPublicKeyInfo (whole TLV) of a DER certificate.
    pub(super) fn cert_spki(der: &[u8]) -> Result<&[u8]> {
        let (cert, rest) = expect(der, SEQUENCE, "certificate is not a DER SEQUENCE")?;
        if !rest.is_empty() {
            return Err(bad("bytes after the certificate"));
        }
        let (tbs, _) = expect(cert.content, SEQUENCE, "tbsCertificate is not a SEQUENCE")?;
        let mut fields = tbs.content;
        let (first, after) = next(fields)?;
        if first.tag == VERSION {
            fields = after;
        }
        let (_, fields) = expect(fields, INTEGER, "serial number is not an INTEGER")?;
        let (_, fields) = expect(fields, SEQUENCE, "signature algorithm is not a SEQUENCE")?;
        let (_, fields) = expect(fields, SEQUENCE, "issuer is not a SEQUENCE")?;
        let (_, fields) = expect(fields, SEQUENCE, "validity is not a SEQUENCE")?;
        let (_, fields) = expect(fields, SEQUENCE, "subject is not a SEQUENCE")?;
        let (spki, _) = expect(fields, SEQUENCE, "subjectPublicKeyInfo is not a SEQUENCE")?;
        Ok(spki.whole)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn garbage_is_an_error_not_a_panic() {
            for input in [
                &[][..],
                &[0x30],
                &[0x30, 0x85, 1, 2, 3, 4, 5],
                &[0x30, 0x82, 0xff, 0xff],
                &[0x30, 0x00],
                &[0x30, 0x02, 0x30, 0x00],
                &[0x1f, 0x00],
                &[0x30, 0x03, 0x30, 0x01, 0xa0],
            ] {
                assert!(cert_spki(input).is_err(), "{input:02x?}");
            }
        }

        #[test]
        fn truncations_of_a_real_cert_never_panic() {
            let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
            let cert = rcgen::CertificateParams::new(vec!["x".to_owned()])
                .unwrap()
                .self_signed(&key)
                .unwrap();
            let der = cert.der().as_ref();
            let spki = cert_spki(der).unwrap();
            assert_eq!(spki, rcgen::PublicKeyData::subject_public_key_info(&key));
            for n in 0..der.len() {
                assert!(cert_spki(&der[..n]).is_err());
            }
        }
    }
}

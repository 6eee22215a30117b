use super::key::{self as keys, Key, Source};
use super::window::{Replay, ReplayWindow};
use super::*;
use ndd_core::frame::copies_on_this_thread;
use ndd_core::{Frame, Meta, Output, Role, Stack};
use ndd_testkit::{LinkConfig, Pipeline, EPOCH_NS};
use proptest::prelude::*;
use std::collections::HashSet;
use std::fs::{self, OpenOptions, Permissions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The test key: bytes 00 01 … 1f.
const KEY: [u8; 32] = {
    let mut k = [0u8; 32];
    let mut i = 0;
    while i < 32 {
        k[i] = i as u8;
        i += 1;
    }
    k
};
/// The test epoch: bytes a0 a1 … af.
const EPOCH: [u8; 16] = {
    let mut e = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        e[i] = 0xa0 + i as u8;
        i += 1;
    }
    e
};
const CIPHERS: [Cipher; 2] = [Cipher::Aes256Gcm, Cipher::Chacha20Poly1305];

/// A file in the temp directory with a unique name, removed on drop.
struct TempFile(std::path::PathBuf);

impl TempFile {
    fn new(contents: &[u8], mode: u32) -> TempFile {
        static N: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "ndd-encrypt-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_file(&path);
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .expect("create temp key file");
        f.write_all(contents).expect("write temp key file");
        fs::set_permissions(&path, Permissions::from_mode(mode)).expect("chmod");
        TempFile(path)
    }

    fn path(&self) -> String {
        self.0.display().to_string()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

fn key_cfg(file: &TempFile, cipher: Cipher) -> EncryptConfig {
    EncryptConfig {
        cipher,
        key_file: file.0.clone(),
        ..EncryptConfig::default()
    }
}

fn test_key() -> Key {
    Key::from_bytes(KEY, Source::KeyFile("vector".into()))
}

fn meta(seq: u64) -> Meta {
    Meta {
        stream: 3,
        seq,
        timestamp_ns: 1000 + seq,
        flags: 0,
    }
}

fn seal(fwd: &mut dyn Half, m: Meta, payload: &[u8]) -> Frame {
    let mut out = Output::new();
    fwd.handle_frame(Instant::now(), Frame::new(m, payload), &mut out)
        .expect("seal");
    let mut v = out.take_frames();
    assert_eq!(v.len(), 1);
    v.remove(0)
}

/// Feeds one frame to an inverse; returns what came out.
fn open(inv: &mut dyn Half, f: Frame) -> Option<Frame> {
    let mut out = Output::new();
    inv.handle_frame(Instant::now(), f, &mut out)
        .expect("drops are not errors");
    let mut v = out.take_frames();
    assert!(v.len() <= 1);
    v.pop()
}

fn counters(inv: &dyn Half) -> Vec<(&'static str, u64)> {
    inv.stats().counters
}

fn header_of(f: &Frame) -> Header {
    Header::parse(&f.payload()[..HEADER_LEN]).expect("header")
}

#[test]
fn wire_format_matches_vectors_for_both_ciphers() {
    // Independently computed with Python's `cryptography` and `hmac` (see docs/modules.md, `## encrypt`).
    let vectors = [
        (
            Cipher::Aes256Gcm,
            "cc7ea81fba0a3e28bbcc6068d5f196efa1f469f22c25c61abad0c6a312540beb",
            "a0a1a2a3a4a5a6a7a8a9aaabacadaeaf00000000000000002c6dbc1bfd93ec2f0ec8e482bee03e78a10449",
            "a0a1a2a3a4a5a6a7a8a9aaabacadaeaf0000000000000001331f08df63dd3aa32100dcf02b43b0bf4de07c",
        ),
        (
            Cipher::Chacha20Poly1305,
            "a420cea7f07a623fb4c8cb2508c9f2940b827173c0caedf1de291035e2531dd0",
            "a0a1a2a3a4a5a6a7a8a9aaabacadaeaf000000000000000056edcd4030ef8b91cb3ff23034ac24676a488b",
            "a0a1a2a3a4a5a6a7a8a9aaabacadaeaf0000000000000001c377baa77b2082460702e5599a62e9cb8ba8b1",
        ),
    ];
    let m = Meta {
        stream: 3,
        seq: 1,
        timestamp_ns: 1001,
        flags: 0,
    };
    assert_eq!(hex(&aad(&m)), "0003000000000000000100000000000003e9");
    for (cipher, subkey, wire0, wire1) in vectors {
        assert_eq!(
            hex(&keys::subkey_bytes(&KEY, &EPOCH, cipher).unwrap()),
            subkey
        );
        let mut fwd = EncryptForward::with_epoch(&test_key(), cipher, EPOCH).unwrap();
        // Two frames with the same meta (as an upper pair might emit): different counters.
        let f0 = seal(&mut fwd, m, b"abc");
        let f1 = seal(&mut fwd, m, b"abc");
        assert_eq!(hex(f0.payload()), wire0, "{cipher:?} counter 0");
        assert_eq!(hex(f1.payload()), wire1, "{cipher:?} counter 1");
        let mut inv = EncryptInverse::new(std::sync::Arc::new(test_key()), cipher, 1024);
        for f in [f0, f1] {
            let got = open(&mut inv, f).expect("authentic");
            assert_eq!(got.payload(), b"abc");
            assert_eq!(got.meta, m);
        }
        assert_eq!(fwd.stats().counters, vec![("frames", 2)]);
    }
}

#[test]
fn header_parses_only_exact_length_and_round_trips() {
    let h = Header {
        epoch: EPOCH,
        counter: 0x0102_0304_0506_0708,
        tag: [0x55; 16],
    };
    let mut b = [0u8; HEADER_LEN];
    h.emit(&mut b);
    assert_eq!(
        hex(&b),
        "a0a1a2a3a4a5a6a7a8a9aaabacadaeaf010203040506070855555555555555555555555555555555"
    );
    assert_eq!(Header::parse(&b), Some(h));
    assert_eq!(Header::parse(&b[..39]), None);
    assert_eq!(Header::parse(&[0u8; 41]), None);
}

#[test]
fn key_id_and_describe_match_vector_and_hold_no_secret() {
    assert_eq!(hex(&keys::key_id(&KEY)), "1c806d436b26621b");
    let raw = TempFile::new(&KEY, 0o600);
    let cfg = key_cfg(&raw, Cipher::Aes256Gcm);
    let d = cfg.describe();
    assert_eq!(
        d,
        "encrypt(cipher=aes-256-gcm, window=1024, key_id=1c806d436b26621b)"
    );
    assert!(!d.contains(&raw.path()) && !d.contains("ndd-encrypt-test"));
    assert!(!d.contains(&hex(&KEY)) && !d.contains(&hex(&KEY[..8])));
    assert!(
        !format!("{cfg:?}").contains(&hex(&KEY[..4])),
        "Debug shows no key"
    );

    // Same key from another file (hex this time): same description.
    let hexfile = TempFile::new(format!("{}\n", hex(&KEY)).as_bytes(), 0o600);
    assert_eq!(key_cfg(&hexfile, Cipher::Aes256Gcm).describe(), d);
    // Another key, another cipher, another window: another description.
    let mut other = KEY;
    other[31] ^= 1;
    let otherfile = TempFile::new(&other, 0o600);
    let d2 = key_cfg(&otherfile, Cipher::Aes256Gcm).describe();
    assert_ne!(d2, d);
    assert!(d2.starts_with("encrypt(cipher=aes-256-gcm, window=1024, key_id="));
    assert_eq!(
        key_cfg(&raw, Cipher::Chacha20Poly1305).describe(),
        "encrypt(cipher=chacha20-poly1305, window=1024, key_id=1c806d436b26621b)"
    );
    let c = EncryptConfig {
        window: 64,
        ..key_cfg(&raw, Cipher::Aes256Gcm)
    };
    assert_eq!(
        c.describe(),
        "encrypt(cipher=aes-256-gcm, window=64, key_id=1c806d436b26621b)"
    );
}

#[test]
fn cached_key_follows_the_configured_file() {
    let a = TempFile::new(&KEY, 0o600);
    let mut other = KEY;
    other[0] ^= 0xff;
    let b = TempFile::new(&other, 0o600);
    let ca = key_cfg(&a, Cipher::Aes256Gcm);
    let da = ca.describe();
    // The key is cached: removing the file afterwards does not change the description.
    let mut cb = ca.clone();
    assert_eq!(cb, ca);
    drop(a);
    assert_eq!(ca.describe(), da);
    ca.forward().expect("cached key still builds");
    // A clone pointed at another file loads that file, not the cached key.
    cb.key_file = b.0.clone();
    assert_ne!(cb.describe(), da);
    assert_eq!(cb.key_id().unwrap(), hex(&keys::key_id(&other)));
}

#[test]
fn passphrase_derived_key_equals_known_vector() {
    // PBKDF2-HMAC-SHA256("correct horse battery staple", "ndd-encrypt passphrase v1",
    // 600000, 32), computed with Python's hashlib.
    let pass = TempFile::new(b"correct horse battery staple\n", 0o600);
    let cfg = EncryptConfig {
        passphrase_file: pass.0.clone(),
        ..EncryptConfig::default()
    };
    let key = cfg.key().expect("derives");
    assert_eq!(
        hex(key.bytes()),
        "8d8cad421e461894fca80af69b4998d0153c03ff62ffb03dd9a57636ebf6f6c3"
    );
    assert_eq!(
        cfg.describe(),
        "encrypt(cipher=aes-256-gcm, window=1024, key_id=92da230ff473b675)"
    );
    // The same key written to a key file interoperates with the passphrase side.
    let file = TempFile::new(hex(key.bytes()).as_bytes(), 0o600);
    let kcfg = key_cfg(&file, Cipher::Aes256Gcm);
    assert_eq!(kcfg.describe(), cfg.describe());
    let mut fwd = cfg.forward().unwrap();
    let mut inv = kcfg.inverse().unwrap();
    let got = open(inv.as_mut(), seal(fwd.as_mut(), meta(9), b"secret")).unwrap();
    assert_eq!(got.payload(), b"secret");
}

#[test]
fn key_file_forms_agree_and_interoperate() {
    let h = hex(&KEY);
    let forms = [
        TempFile::new(&KEY, 0o600),
        TempFile::new(h.as_bytes(), 0o600),
        TempFile::new(format!("{h}\n").as_bytes(), 0o400),
        TempFile::new(format!("{}\r\n", h.to_uppercase()).as_bytes(), 0o600),
    ];
    for cipher in CIPHERS {
        let src = key_cfg(&forms[0], cipher);
        let mut fwd = src.forward().unwrap();
        for f in &forms {
            let c = key_cfg(f, cipher);
            assert_eq!(c.key_id().unwrap(), "1c806d436b26621b");
            let mut inv = c.inverse().unwrap();
            let got = open(inv.as_mut(), seal(fwd.as_mut(), meta(1), b"hi")).unwrap();
            assert_eq!(got.payload(), b"hi");
        }
    }
}

#[test]
fn key_file_errors_have_the_documented_texts() {
    let dir = std::env::temp_dir();
    let missing = dir.join(format!("ndd-encrypt-test-missing-{}", std::process::id()));
    let size_msg = |p: &str, n: usize| {
        format!(
            "encrypt: key file {p} holds {n} bytes, but a key is exactly 32 raw bytes or 64 hex \
             digits (plus an optional newline)"
        )
    };
    let f31 = TempFile::new(&[7; 31], 0o600);
    let f33 = TempFile::new(&[7; 33], 0o600);
    let f100 = TempFile::new(&[7; 100], 0o600);
    let hex65 = TempFile::new(format!("{}x", hex(&KEY)).as_bytes(), 0o600);
    let nonhex = TempFile::new(format!("{}g", &hex(&KEY)[..63]).as_bytes(), 0o600);
    let short_hex = TempFile::new(&hex(&KEY).as_bytes()[..32], 0o600);
    let open644 = TempFile::new(&KEY, 0o644);
    let open640 = TempFile::new(&KEY, 0o640);
    let open602 = TempFile::new(&KEY, 0o602);
    let short_pass = TempFile::new(b"abcde\n", 0o600);
    let long_pass = TempFile::new(&[b'x'; 1025], 0o600);
    let loose_pass = TempFile::new(b"correct horse", 0o604);
    let perm = |p: &str, mode: &str, what: &str| {
        format!(
            "encrypt: {what} {p} has permissions {mode}, but it must be readable by its owner \
             only (0600); fix it with: chmod 600 {p}"
        )
    };
    let kf = |p: &std::path::Path| EncryptConfig {
        key_file: p.to_path_buf(),
        ..EncryptConfig::default()
    };
    let pf = |p: &std::path::Path| EncryptConfig {
        passphrase_file: p.to_path_buf(),
        ..EncryptConfig::default()
    };
    let cases: Vec<(EncryptConfig, String)> = vec![
        (
            kf(&missing),
            format!(
                "encrypt: cannot read key file {}: No such file or directory (os error 2)",
                missing.display()
            ),
        ),
        (kf(&f31.0), size_msg(&f31.path(), 31)),
        (kf(&f33.0), size_msg(&f33.path(), 33)),
        (kf(&f100.0), size_msg(&f100.path(), 100)),
        (kf(&hex65.0), size_msg(&hex65.path(), 65)),
        (
            kf(&nonhex.0),
            format!(
                "encrypt: key file {} holds 64 characters that are not all hex digits",
                nonhex.path()
            ),
        ),
        (
            kf(&short_hex.0),
            format!(
                "encrypt: key file {} holds 32 hex digits (a 16-byte key), but a key is 32 raw \
                 bytes or 64 hex digits",
                short_hex.path()
            ),
        ),
        (kf(&open644.0), perm(&open644.path(), "0644", "key file")),
        (kf(&open640.0), perm(&open640.path(), "0640", "key file")),
        (kf(&open602.0), perm(&open602.path(), "0602", "key file")),
        (
            kf(&dir),
            format!("encrypt: key file {} is not a regular file", dir.display()),
        ),
        (
            pf(&short_pass.0),
            format!(
                "encrypt: passphrase file {} holds a passphrase of 5 bytes; use at least 8",
                short_pass.path()
            ),
        ),
        (
            pf(&long_pass.0),
            format!(
                "encrypt: passphrase file {} holds 1025 bytes; a passphrase is at most 1024 bytes",
                long_pass.path()
            ),
        ),
        (
            pf(&loose_pass.0),
            perm(&loose_pass.path(), "0604", "passphrase file"),
        ),
        (
            EncryptConfig::default(),
            "encrypt: set exactly one of key_file and passphrase_file (neither is set)".into(),
        ),
        (
            EncryptConfig {
                passphrase_file: f31.0.clone(),
                ..kf(&f31.0)
            },
            "encrypt: set exactly one of key_file and passphrase_file (both are set)".into(),
        ),
        (
            EncryptConfig {
                window: 0,
                ..kf(&f31.0)
            },
            "encrypt: window = 0 is out of range 1..=65536".into(),
        ),
        (
            EncryptConfig {
                window: 65_537,
                ..kf(&f31.0)
            },
            "encrypt: window = 65537 is out of range 1..=65536".into(),
        ),
    ];
    let setup_text = |r: Result<Box<dyn Half>, ModuleError>| match r {
        Err(ModuleError::Setup(e)) => Some(e.to_string()),
        _ => None,
    };
    for (cfg, want) in cases {
        assert_eq!(setup_text(cfg.forward()), Some(want.clone()), "forward");
        assert_eq!(setup_text(cfg.inverse()), Some(want.clone()), "inverse");
        assert!(
            cfg.describe().ends_with(", key_id=unavailable)"),
            "{}",
            cfg.describe()
        );
    }
    // Through a stack: located by stream, layer and side.
    let e = Stack::build(Role::Sink, "mouse", &[&kf(&open644.0)]).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "stream \"mouse\" layer 0 (encrypt, sink side): cannot start: {}",
            perm(&open644.path(), "0644", "key file")
        )
    );
}

#[test]
fn config_parses_from_toml_and_rejects_unknowns() {
    let c: EncryptConfig =
        toml::from_str("cipher = \"chacha20-poly1305\"\nkey_file = \"/k\"\nwindow = 64").unwrap();
    assert_eq!(
        c,
        EncryptConfig {
            cipher: Cipher::Chacha20Poly1305,
            key_file: "/k".into(),
            window: 64,
            ..EncryptConfig::default()
        }
    );
    let e = toml::from_str::<EncryptConfig>("cipher = \"aes-128-gcm\"")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("unknown variant `aes-128-gcm`, expected `aes-256-gcm` or `chacha20-poly1305`"),
        "{e}"
    );
    let e = toml::from_str::<EncryptConfig>("key_cache = 1")
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown field `key_cache`"), "{e}");
    let e = toml::from_str::<EncryptConfig>("key = \"00\"")
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown field `key`"), "{e}");
}

#[test]
fn every_bit_flip_in_header_body_tag_or_meta_is_rejected() {
    let kf = TempFile::new(&KEY, 0o600);
    for cipher in CIPHERS {
        let cfg = key_cfg(&kf, cipher);
        let mut fwd = cfg.forward().unwrap();
        let f = seal(fwd.as_mut(), meta(5), b"hello, world");
        let m = f.meta;
        let wire = f.payload().to_vec();
        assert_eq!(wire.len(), HEADER_LEN + 12);
        let mut inv = cfg.inverse().unwrap();
        let mut tries = 0;
        for bit in 0..wire.len() * 8 {
            let mut w = wire.clone();
            w[bit / 8] ^= 1 << (bit % 8);
            assert!(
                open(inv.as_mut(), Frame::new(m, &w)).is_none(),
                "{cipher:?} bit {bit}"
            );
            tries += 1;
        }
        for bit in 0..16 {
            let mm = Meta {
                stream: m.stream ^ (1 << bit),
                ..m
            };
            assert!(open(inv.as_mut(), Frame::new(mm, &wire)).is_none());
            tries += 1;
        }
        for bit in 0..64 {
            for mm in [
                Meta {
                    seq: m.seq ^ (1 << bit),
                    ..m
                },
                Meta {
                    timestamp_ns: m.timestamp_ns ^ (1 << bit),
                    ..m
                },
            ] {
                assert!(open(inv.as_mut(), Frame::new(mm, &wire)).is_none());
                tries += 1;
            }
        }
        assert_eq!(
            counters(inv.as_ref()),
            vec![
                ("auth_failed", tries),
                ("replayed", 0),
                ("truncated", 0),
                ("epochs", 0)
            ]
        );
        assert_eq!(inv.stats().drops, tries);
        // The failures left no trace: the genuine frame still opens.
        let got = open(inv.as_mut(), Frame::new(m, &wire)).expect("genuine");
        assert_eq!((got.meta, got.payload()), (m, &b"hello, world"[..]));
        // Flags are not authenticated (a link may set RETRANSMIT): documented.
        let mut fresh = cfg.inverse().unwrap();
        let mf = Meta { flags: 1, ..m };
        assert_eq!(
            open(fresh.as_mut(), Frame::new(mf, &wire)).unwrap().meta,
            mf
        );
    }
}

#[test]
fn truncated_frames_are_counted_and_never_panic() {
    let kf = TempFile::new(&KEY, 0o600);
    let mut inv = key_cfg(&kf, Cipher::Aes256Gcm).inverse().unwrap();
    for len in 0..HEADER_LEN {
        assert!(open(inv.as_mut(), Frame::new(meta(len as u64), &vec![0xab; len])).is_none());
    }
    // Exactly a header (an empty plaintext) of garbage: an authentication failure.
    assert!(open(inv.as_mut(), Frame::new(meta(0), &[0xab; HEADER_LEN])).is_none());
    assert_eq!(
        counters(inv.as_ref()),
        vec![
            ("auth_failed", 1),
            ("replayed", 0),
            ("truncated", 40),
            ("epochs", 0)
        ]
    );
    assert_eq!(inv.stats().drops, 41);
    // An empty frame round-trips (header only on the wire).
    let mut fwd = key_cfg(&kf, Cipher::Aes256Gcm).forward().unwrap();
    let f = seal(fwd.as_mut(), meta(1), b"");
    assert_eq!(f.len(), HEADER_LEN);
    assert_eq!(open(inv.as_mut(), f).unwrap().payload(), b"");
}

#[test]
fn replayed_frames_are_dropped_and_counted() {
    let kf = TempFile::new(&KEY, 0o600);
    let cfg = key_cfg(&kf, Cipher::Chacha20Poly1305);
    let mut fwd = cfg.forward().unwrap();
    let mut inv = cfg.inverse().unwrap();
    let wire: Vec<Frame> = (0..3)
        .map(|i| seal(fwd.as_mut(), meta(i), &[i as u8; 10]))
        .collect();
    let copy = |f: &Frame| Frame::new(f.meta, f.payload());
    assert!(open(inv.as_mut(), copy(&wire[1])).is_some());
    assert!(open(inv.as_mut(), copy(&wire[0])).is_some(), "reordered");
    assert!(open(inv.as_mut(), copy(&wire[1])).is_none(), "replay");
    assert!(open(inv.as_mut(), copy(&wire[0])).is_none(), "replay");
    assert!(open(inv.as_mut(), copy(&wire[2])).is_some());
    assert!(open(inv.as_mut(), copy(&wire[2])).is_none(), "replay");
    assert_eq!(
        counters(inv.as_ref()),
        vec![
            ("auth_failed", 0),
            ("replayed", 3),
            ("truncated", 0),
            ("epochs", 1)
        ]
    );
}

#[test]
fn reordering_within_the_window_passes_and_older_is_a_replay() {
    let kf = TempFile::new(&KEY, 0o600);
    let cfg = key_cfg(&kf, Cipher::Aes256Gcm);
    let mut fwd = cfg.forward().unwrap();
    let mut inv = cfg.inverse().unwrap();
    let wire: Vec<Frame> = (0..1501)
        .map(|i| seal(fwd.as_mut(), meta(i), b"x"))
        .collect();
    // Counter 1500 first, then 1499 down to 0: counters 477..=1499 are within the window of
    // 1024 below 1500; 0..=476 are too old.
    let mut delivered = 0;
    for f in wire.into_iter().rev() {
        delivered += usize::from(open(inv.as_mut(), f).is_some());
    }
    assert_eq!(delivered, 1024);
    assert_eq!(
        counters(inv.as_ref()),
        vec![
            ("auth_failed", 0),
            ("replayed", 477),
            ("truncated", 0),
            ("epochs", 1)
        ]
    );
}

#[test]
fn replay_window_bitmap_slides_correctly() {
    for size in [1u32, 2, 63, 64, 65, 100, 1024] {
        let mut w = ReplayWindow::new(size);
        let mut seen = HashSet::new();
        let mut top: Option<u64> = None;
        let mut rng = ndd_testkit::SimRng::new(u64::from(size));
        let mut base = 0u64;
        for _ in 0..5000 {
            // Mostly nearby counters, sometimes big jumps forward.
            if rng.chance(0.01) {
                base += rng.range(0, 5000);
            }
            let c = base + rng.range(0, 3 * u64::from(size));
            base += rng.range(0, 2);
            let want = match top {
                Some(t) if c <= t && t - c >= u64::from(size) => Err(Replay::TooOld),
                _ if seen.contains(&c) => Err(Replay::Seen),
                _ => Ok(()),
            };
            assert_eq!(w.check(c), want, "size {size} counter {c} top {top:?}");
            if want.is_ok() {
                w.mark(c);
                seen.insert(c);
                top = Some(top.map_or(c, |t| t.max(c)));
            }
        }
    }
}

#[test]
fn forward_halves_sharing_a_key_never_share_epoch_and_counter() {
    let kf = TempFile::new(&KEY, 0o600);
    let cfg = key_cfg(&kf, Cipher::Aes256Gcm);
    let (mut a, mut b) = (cfg.forward().unwrap(), cfg.forward().unwrap());
    let mut nonces = HashSet::new();
    let mut bodies = HashSet::new();
    for i in 0..200 {
        for fwd in [&mut a, &mut b] {
            // Same meta (even the same seq twice) and the same plaintext every time.
            let f = seal(fwd.as_mut(), meta(i / 2), b"same plaintext");
            let h = header_of(&f);
            assert!(
                nonces.insert((h.epoch, h.counter)),
                "(epoch, counter) reused"
            );
            assert!(bodies.insert(f.payload()[HEADER_LEN - 16..].to_vec()));
        }
    }
    assert_eq!(nonces.len(), 400);
    // Every forward half draws its own epoch (a restart is a new half).
    let epochs: HashSet<[u8; 16]> = (0..64)
        .map(|_| {
            let mut f = cfg.forward().unwrap();
            header_of(&seal(f.as_mut(), meta(0), b"")).epoch
        })
        .collect();
    assert_eq!(epochs.len(), 64);
}

#[test]
fn source_restarts_and_retired_epochs() {
    let kf = TempFile::new(&KEY, 0o600);
    let cfg = key_cfg(&kf, Cipher::Aes256Gcm);
    let mut inv = cfg.inverse().unwrap();
    let (mut a, mut b, mut c) = (
        cfg.forward().unwrap(),
        cfg.forward().unwrap(),
        cfg.forward().unwrap(),
    );
    let a0 = seal(a.as_mut(), meta(0), b"a0");
    let a1 = seal(a.as_mut(), meta(1), b"a1");
    let a2 = seal(a.as_mut(), meta(2), b"a2");
    let b0 = seal(b.as_mut(), meta(0), b"b0");
    let b1 = seal(b.as_mut(), meta(1), b"b1");
    let c0 = seal(c.as_mut(), meta(0), b"c0");
    let copy = |f: &Frame| Frame::new(f.meta, f.payload());
    assert!(open(inv.as_mut(), copy(&a0)).is_some());
    assert!(
        open(inv.as_mut(), copy(&b0)).is_some(),
        "restart: new epoch"
    );
    // A frame of the previous epoch still in flight is delivered; its replay is not.
    assert!(
        open(inv.as_mut(), copy(&a1)).is_some(),
        "late, previous epoch"
    );
    assert!(
        open(inv.as_mut(), copy(&a1)).is_none(),
        "replay, previous epoch"
    );
    assert!(open(inv.as_mut(), copy(&b1)).is_some());
    // A third epoch retires the least recently used one (a): all of a is refused from now on,
    // even counters it never delivered.
    assert!(open(inv.as_mut(), copy(&c0)).is_some());
    assert!(open(inv.as_mut(), copy(&a2)).is_none(), "retired epoch");
    assert!(open(inv.as_mut(), copy(&a0)).is_none(), "retired epoch");
    assert_eq!(
        counters(inv.as_ref()),
        vec![
            ("auth_failed", 0),
            ("replayed", 3),
            ("truncated", 0),
            ("epochs", 3)
        ]
    );
}

/// A frame of an epoch older than the retired ones kept authenticates as a new epoch: whoever
/// recorded the first frames of many epochs can play them in at line rate. A thousand new
/// epochs in a second are five lines, then one with the count held back; all are delivered
/// and counted as before.
#[test]
fn a_thousand_new_epochs_in_a_second_are_a_few_lines() {
    let kf = TempFile::new(&KEY, 0o600);
    let cfg = key_cfg(&kf, Cipher::Aes256Gcm);
    let mut inv = cfg.inverse().unwrap();
    let firsts: Vec<Frame> = (0..1001)
        .map(|i| seal(cfg.forward().unwrap().as_mut(), meta(i), b"x"))
        .collect();
    let t0 = Instant::now();
    let mut out = Output::new();
    let ((), log) = ndd_core::testlog::Captured::run(|| {
        for (i, f) in firsts.into_iter().enumerate() {
            // 1000 within the first second, the last one a second later.
            let ms = if i == 1000 { 2000 } else { i as u64 };
            inv.handle_frame(t0 + Duration::from_millis(ms), f, &mut out)
                .unwrap();
        }
    });
    assert_eq!(out.take_frames().len(), 1001);
    assert!(counters(inv.as_ref()).contains(&("epochs", 1001)));
    let lines = log.matching("encrypt: new key epoch");
    assert_eq!(lines.len(), 6, "{lines:#?}");
    // Epoch 1 is the first new one: 999 more in the first second, 5 of them said.
    assert!(lines[5].contains("suppressed=994"), "{lines:#?}");
}

/// Many sending halves at once (app sides feeding one NATS subject): with as many live
/// epochs, every sender's frames open, interleaved, and replays are still caught; with the
/// default two, the third sender retires the first one's epoch.
#[test]
fn an_inverse_with_more_live_epochs_takes_many_senders_at_once() {
    let kf = TempFile::new(&KEY, 0o600);
    let cfg = key_cfg(&kf, Cipher::Aes256Gcm);
    let key = std::sync::Arc::new(test_key());
    let copy = |f: &Frame| Frame::new(f.meta, f.payload());
    let mut senders: Vec<Box<dyn Half>> = (0..5).map(|_| cfg.forward().unwrap()).collect();
    let mut many = EncryptInverse::new(key.clone(), Cipher::Aes256Gcm, 64).with_live_epochs(5);
    let mut two = EncryptInverse::new(key, Cipher::Aes256Gcm, 64);
    let mut two_opened = 0;
    for seq in 0..4u64 {
        for s in senders.iter_mut() {
            let f = seal(s.as_mut(), meta(seq), b"frame");
            let again = copy(&f);
            assert!(open(&mut many, f).is_some(), "sender's frame {seq} opens");
            assert!(
                open(&mut many, copy(&again)).is_none(),
                "its replay does not"
            );
            two_opened += usize::from(open(&mut two, again).is_some());
        }
    }
    // Two live epochs: every sender's first frame opens (each retires an older epoch), then
    // only the last two senders' frames; the first three are refused for good.
    assert_eq!(two_opened, 5 + 3 * 2);
}

#[test]
fn retired_epochs_are_remembered_up_to_the_documented_bound() {
    let kf = TempFile::new(&KEY, 0o600);
    let cfg = key_cfg(&kf, Cipher::Chacha20Poly1305);
    let mut inv = cfg.inverse().unwrap();
    let n = LIVE_EPOCHS + RETIRED_EPOCHS + 1;
    let mut late = Vec::new();
    for _ in 0..n {
        let mut f = cfg.forward().unwrap();
        assert!(open(inv.as_mut(), seal(f.as_mut(), meta(0), b"x")).is_some());
        late.push(seal(f.as_mut(), meta(1), b"y"));
    }
    // The second epoch is still remembered and refused. The first fell off the retired list:
    // the documented limitation (a whole epoch that old can be replayed).
    let mut late = late.into_iter();
    let first = late.next().unwrap();
    assert!(open(inv.as_mut(), late.next().unwrap()).is_none());
    assert!(open(inv.as_mut(), first).is_some());
}

#[test]
fn a_peer_with_another_key_gets_only_authentication_failures() {
    let ka = TempFile::new(&KEY, 0o600);
    let mut other = KEY;
    other[5] ^= 0x10;
    let kb = TempFile::new(&other, 0o600);
    let (ca, cb) = (
        key_cfg(&ka, Cipher::Aes256Gcm),
        key_cfg(&kb, Cipher::Aes256Gcm),
    );
    assert_ne!(
        ca.describe(),
        cb.describe(),
        "the handshake catches it first"
    );
    let mut fwd = ca.forward().unwrap();
    let mut inv = cb.inverse().unwrap();
    for i in 0..5 {
        assert!(open(inv.as_mut(), seal(fwd.as_mut(), meta(i), b"data")).is_none());
    }
    assert_eq!(counters(inv.as_ref())[0], ("auth_failed", 5));
    // Another cipher with the same key fails too (the subkey depends on the cipher).
    let mut inv = key_cfg(&ka, Cipher::Chacha20Poly1305).inverse().unwrap();
    assert!(open(inv.as_mut(), seal(fwd.as_mut(), meta(9), b"data")).is_none());
}

#[test]
fn both_halves_work_in_place_without_copying() {
    let kf = TempFile::new(&KEY, 0o600);
    let cfg = key_cfg(&kf, Cipher::Aes256Gcm);
    let (mut src, mut sink) = (
        Stack::build(Role::Source, "s", &[&cfg]).unwrap(),
        Stack::build(Role::Sink, "s", &[&cfg]).unwrap(),
    );
    let payload = vec![0x5a; 64 * 1024];
    let before = copies_on_this_thread();
    let f = Frame::new(meta(1), &payload);
    let ptr = f.payload().as_ptr();
    src.handle_frame(Instant::now(), f).unwrap();
    let wire = src.poll_frame().unwrap();
    assert_eq!(
        wire.payload()[HEADER_LEN..].as_ptr(),
        ptr,
        "sealed in place"
    );
    let bytes = wire.into_bytes();
    sink.handle_frame(Instant::now(), Frame::from_bytes(meta(1), bytes))
        .unwrap();
    let got = sink.poll_frame().unwrap();
    assert_eq!(got.payload(), &payload[..]);
    assert_eq!(got.payload().as_ptr(), ptr, "opened in place");
    assert_eq!(copies_on_this_thread(), before);
}

#[test]
fn no_control_messages_and_any_received_is_refused() {
    let kf = TempFile::new(&KEY, 0o600);
    let cfg = key_cfg(&kf, Cipher::Aes256Gcm);
    let mut p = Pipeline::new(
        &[&cfg],
        LinkConfig::tcp(Duration::from_millis(5), Duration::ZERO),
        1,
    )
    .unwrap();
    for i in 0..50u64 {
        p.send_at(Duration::from_millis(i), vec![i as u8; 20]);
    }
    p.finish().unwrap();
    assert_eq!(p.deliveries().len(), 50);
    for s in p.source_stats().iter().chain(p.sink_stats().iter()) {
        assert_eq!((s.control_in, s.control_out), (0, 0));
    }
    assert_eq!(p.source_stats()[0].half.counters, vec![("frames", 50)]);
    // The pair defines none: a control message from the peer is refused, on either side.
    for role in [Role::Source, Role::Sink] {
        let mut s = Stack::build(role, "s", &[&cfg]).unwrap();
        let e = s
            .handle_control(Instant::now(), 0, bytes::Bytes::from_static(b"\xff"))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "stream \"s\" layer 0 (encrypt, {role} side): malformed control message: \
                 this pair defines no control messages (got one of 1 bytes)"
            )
        );
    }
}

#[test]
fn corrupting_link_delivers_only_intact_frames() {
    let kf = TempFile::new(&KEY, 0o600);
    let cfg = key_cfg(&kf, Cipher::Chacha20Poly1305);
    let link = LinkConfig {
        corrupt: 0.3,
        ..LinkConfig::datagram(Duration::from_millis(2), Duration::from_millis(4), 0.0)
    };
    let mut p = Pipeline::new(&[&cfg], link, 7).unwrap();
    let data: Vec<Vec<u8>> = (0..300u64).map(|i| vec![(i % 251) as u8; 30]).collect();
    for (i, d) in data.iter().enumerate() {
        p.send_at(Duration::from_millis(i as u64), d.clone());
    }
    p.finish().unwrap();
    let corrupted = p.data_link().corrupted;
    assert!(corrupted > 50);
    assert_eq!(p.deliveries().len() as u64, 300 - corrupted);
    let order: Vec<u64> = p.deliveries().iter().map(|d| d.meta.seq).collect();
    assert!(order.windows(2).any(|w| w[0] > w[1]), "the link reordered");
    for d in p.deliveries() {
        assert_eq!(&d.payload[..], &data[d.meta.seq as usize][..]);
    }
    let st = &p.sink_stats()[0].half;
    assert_eq!(st.counters[0], ("auth_failed", corrupted));
    assert_eq!(st.drops, corrupted);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Both ciphers over a datagram link that loses, reorders (jitter ≫ spacing) and
    /// duplicates: the sink gets every frame that arrived, once, bytes and meta intact;
    /// every duplicate is counted as a replay.
    #[test]
    fn round_trip_over_lossy_reordering_duplicating_link(
        chacha in any::<bool>(),
        sizes in proptest::collection::vec(0usize..600, 1..150),
        seed in any::<u64>(),
        loss in 0.0f64..0.3,
        duplicate in 0.0f64..0.3,
    ) {
        let kf = TempFile::new(&KEY, 0o600);
        let cipher = if chacha { Cipher::Chacha20Poly1305 } else { Cipher::Aes256Gcm };
        let cfg = key_cfg(&kf, cipher);
        let link = LinkConfig {
            duplicate,
            ..LinkConfig::datagram(Duration::from_millis(5), Duration::from_millis(40), loss)
        };
        let mut p = Pipeline::new(&[&cfg], link, seed).unwrap();
        let data: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| (0..n).map(|b| (b * 7 + i) as u8).collect())
            .collect();
        for (i, d) in data.iter().enumerate() {
            p.send_at(Duration::from_millis(i as u64), d.clone());
        }
        p.finish().unwrap();
        let mut seen = HashSet::new();
        for d in p.deliveries() {
            let i = d.meta.seq as usize;
            prop_assert!(seen.insert(i), "seq {} delivered twice", i);
            prop_assert_eq!(&d.payload[..], &data[i][..]);
            prop_assert_eq!(d.meta, Meta {
                stream: 1,
                seq: i as u64,
                timestamp_ns: EPOCH_NS + i as u64 * 1_000_000,
                flags: 0,
            });
        }
        let link = p.data_link();
        prop_assert_eq!(seen.len() as u64, data.len() as u64 - link.lost);
        let st = &p.sink_stats()[0].half;
        prop_assert_eq!(
            &st.counters,
            &vec![("auth_failed", 0), ("replayed", link.duplicated), ("truncated", 0), ("epochs", u64::from(!seen.is_empty()))]
        );
    }
}

#[test]
fn a_frame_sealed_bound_opens_only_with_the_same_bound_and_a_wrong_one_spends_nothing() {
    let key = Key::given(KEY);
    let mut fwd = EncryptForward::with_epoch(&key, Cipher::Aes256Gcm, EPOCH).unwrap();
    let mut inv = EncryptInverse::new(std::sync::Arc::new(Key::given(KEY)), Cipher::Aes256Gcm, 64);
    let meta = Meta {
        stream: 4,
        seq: 9,
        timestamp_ns: 7,
        flags: 0,
    };
    let mut sealed = Output::new();
    fwd.seal_bound(Frame::new(meta, b"place 5"), 5, &mut sealed)
        .unwrap();
    let f = sealed.take_frames().pop().unwrap();
    let copy = || Frame::new(f.meta, f.payload());
    let now = Instant::now();
    let mut out = Output::new();
    // Bound to another place, or not bound at all: it does not authenticate.
    assert_eq!(
        inv.open_bound(now, copy(), 6, &mut out).unwrap(),
        Opening::Rejected
    );
    inv.handle_frame(now, copy(), &mut out).unwrap();
    assert!(out.take_frames().is_empty());
    assert_eq!(inv.auth_failures(), 2);
    // Its counter was not spent: with the right place it opens, once.
    assert_eq!(
        inv.open_bound(now, copy(), 5, &mut out).unwrap(),
        Opening::Opened
    );
    let got = out.take_frames();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].payload(), b"place 5");
    assert_eq!(
        inv.open_bound(now, copy(), 5, &mut out).unwrap(),
        Opening::Replayed
    );
    assert!(out.take_frames().is_empty(), "a replay");
    // Too short to carry the header: rejected, not taken for a frame that opened.
    let short = Frame::new(meta, b"garbage!");
    assert_eq!(
        inv.open_bound(now, short, 5, &mut out).unwrap(),
        Opening::Rejected
    );
}

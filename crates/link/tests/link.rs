//! Identity, trust, TLS and framing over real loopback sockets (127.0.0.1, port 0).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ndd_core::{Frame, Meta};
use ndd_link::{
    client_config, connect, fingerprint_of_cert, listen, server_config, validate_fingerprint, Conn,
    Identity, Incoming, KnownPeers, LinkError, Listener, PeerInfo,
};
use ndd_wire::{Message, OwnedMessage};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use tokio::io::AsyncWriteExt;

const T: Duration = Duration::from_secs(10);

/// A fresh home directory under the system temp dir, removed on drop.
struct Home(PathBuf);

impl Home {
    fn new(name: &str) -> Home {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "ndd-link-test-{name}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&dir);
        Home(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn identity(name: &str) -> (Home, Identity) {
    let home = Home::new(name);
    let (id, created) = Identity::load_or_create(home.path()).unwrap();
    assert!(created);
    (home, id)
}

async fn local_listener() -> (Listener, String) {
    let listener = listen("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    (listener, addr)
}

/// A connected TLS pair: (server side, client side).
async fn tls_pair(server: &Identity, client: &Identity) -> ((Conn, PeerInfo), (Conn, PeerInfo)) {
    let (listener, addr) = local_listener().await;
    let sc = server_config(server).unwrap();
    let cc = client_config(client).unwrap();
    let (s, c) = tokio::join!(listener.accept(Some(&sc), T), connect(&addr, Some(&cc), T));
    (s.unwrap(), c.unwrap())
}

async fn plain_pair() -> ((Conn, PeerInfo), (Conn, PeerInfo)) {
    let (listener, addr) = local_listener().await;
    let (s, c) = tokio::join!(listener.accept(None, T), connect(&addr, None, T));
    (s.unwrap(), c.unwrap())
}

fn frame(stream: u16, seq: u64, payload: &[u8]) -> Frame {
    Frame::new(
        Meta {
            stream,
            seq,
            timestamp_ns: 1_700_000_000_000_000_000 + seq,
            flags: 0,
        },
        payload,
    )
}

fn expect_data(msg: Option<Incoming>) -> (ndd_wire::DataHeader, bytes::Bytes) {
    match msg {
        Some(Incoming::Data { header, payload }) => (header, payload),
        other => panic!("expected DATA, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------
// Identity

#[test]
fn keygen_creates_private_files_and_a_stable_fingerprint() {
    let home = Home::new("keygen");
    let (id, created) = Identity::load_or_create(home.path()).unwrap();
    assert!(created);
    assert_eq!(mode(home.path()), 0o700);
    assert_eq!(mode(&home.path().join("key.pem")), 0o600);
    assert_eq!(mode(&home.path().join("cert.pem")), 0o600);

    let fp = id.fingerprint();
    validate_fingerprint(&fp).unwrap();
    assert!(fp.starts_with("SHA256:") && fp.len() == 7 + 43, "{fp}");

    let (again, created) = Identity::load_or_create(home.path()).unwrap();
    assert!(!created);
    assert_eq!(again.fingerprint(), fp);

    // The fingerprint is that of the certificate on disk.
    let cert = CertificateDer::from_pem_file(home.path().join("cert.pem")).unwrap();
    assert_eq!(fingerprint_of_cert(&cert).unwrap(), fp);

    // keygen refuses to overwrite without force, and makes a new key with it.
    let e = Identity::create(home.path(), false).unwrap_err();
    assert!(matches!(e, LinkError::KeyExists { .. }), "{e}");
    assert!(e.to_string().contains("--force"), "{e}");
    let new = Identity::create(home.path(), true).unwrap();
    assert_ne!(new.fingerprint(), fp);
    assert_eq!(
        Identity::load(home.path()).unwrap().fingerprint(),
        new.fingerprint()
    );
    assert_eq!(mode(&home.path().join("key.pem")), 0o600);
}

#[test]
fn key_readable_by_others_is_refused_with_the_chmod_command() {
    let (home, _) = identity("perm");
    let key = home.path().join("key.pem");
    fs::set_permissions(&key, fs::Permissions::from_mode(0o644)).unwrap();
    let e = Identity::load(home.path()).unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(e, LinkError::KeyPermissions { mode: 0o644, .. }),
        "{text}"
    );
    assert!(text.contains("0644"), "{text}");
    assert!(
        text.contains(&format!("chmod 600 {}", key.display())),
        "{text}"
    );
    fs::set_permissions(&key, fs::Permissions::from_mode(0o600)).unwrap();
    Identity::load(home.path()).unwrap();
}

#[test]
fn missing_or_mismatched_files_are_clear_errors() {
    let empty = Home::new("empty");
    let e = Identity::load(empty.path()).unwrap_err().to_string();
    assert!(e.contains("ndd keygen"), "{e}");

    let (a, _) = identity("mismatch-a");
    let (b, _) = identity("mismatch-b");
    fs::copy(b.path().join("cert.pem"), a.path().join("cert.pem")).unwrap();
    let e = Identity::load(a.path()).unwrap_err();
    assert!(matches!(e, LinkError::KeyMismatch { .. }), "{e}");

    fs::write(a.path().join("cert.pem"), "not pem").unwrap();
    let e = Identity::load(a.path()).unwrap_err().to_string();
    assert!(e.contains("not a valid PEM certificate"), "{e}");

    // Only one of the two files: load_or_create refuses to guess.
    fs::remove_file(a.path().join("cert.pem")).unwrap();
    let e = Identity::load_or_create(a.path()).unwrap_err().to_string();
    assert!(e.contains("cert.pem is missing"), "{e}");
}

#[test]
fn fingerprint_of_bad_der_is_an_error() {
    for der in [&b""[..], b"\x30\x03\x01\x02", b"garbage garbage"] {
        let e = fingerprint_of_cert(der).unwrap_err().to_string();
        assert!(e.starts_with("malformed certificate"), "{e}");
    }
}

// ---------------------------------------------------------------------------------------
// Trust

#[test]
fn known_peers_round_trip() {
    let home = Home::new("trust");
    let (_, a) = identity("trust-a");
    let (_, b) = identity("trust-b");
    assert!(KnownPeers::load(home.path()).unwrap().is_empty());

    assert!(KnownPeers::trust(home.path(), &a.fingerprint(), Some("my laptop")).unwrap());
    assert!(!KnownPeers::trust(home.path(), &a.fingerprint(), Some("other")).unwrap());
    assert!(KnownPeers::trust(home.path(), &b.fingerprint(), None).unwrap());
    let file = home.path().join("known_peers");
    assert_eq!(mode(&file), 0o600);

    let peers = KnownPeers::load(home.path()).unwrap();
    assert_eq!(peers.len(), 2);
    assert_eq!(
        peers.lookup(&a.fingerprint()).unwrap().name.as_deref(),
        Some("my laptop")
    );
    assert_eq!(peers.lookup(&b.fingerprint()).unwrap().name, None);
    peers.verify(&a.fingerprint()).unwrap();

    let (_, c) = identity("trust-c");
    let e = peers.verify(&c.fingerprint()).unwrap_err().to_string();
    assert!(e.contains(&c.fingerprint()), "{e}");
    assert!(
        e.contains(&format!(
            "ndd trust {} --name NAME --home {}",
            c.fingerprint(),
            home.path().display()
        )),
        "{e}"
    );

    let e = KnownPeers::trust(home.path(), "SHA256:short", None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("`SHA256:short` is not a fingerprint"), "{e}");
    let e = KnownPeers::trust(home.path(), &c.fingerprint(), Some("two\nlines"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("control characters"), "{e}");
}

#[test]
fn known_peers_bad_line_names_file_and_line() {
    let home = Home::new("badline");
    let (_, a) = identity("badline-a");
    fs::create_dir_all(home.path()).unwrap();
    let file = home.path().join("known_peers");
    fs::write(
        &file,
        format!(
            "# pinned peers\n\n{} desk\nSHA256:oops laptop\n",
            a.fingerprint()
        ),
    )
    .unwrap();
    fs::set_permissions(&file, fs::Permissions::from_mode(0o600)).unwrap();
    let e = KnownPeers::load(home.path()).unwrap_err().to_string();
    assert!(e.starts_with(&format!("{}:4: ", file.display())), "{e}");
    assert!(e.contains("`SHA256:oops` is not a fingerprint"), "{e}");

    // A trust file others can write to is refused.
    fs::write(&file, format!("{}\n", a.fingerprint())).unwrap();
    fs::set_permissions(&file, fs::Permissions::from_mode(0o666)).unwrap();
    let e = KnownPeers::load(home.path()).unwrap_err().to_string();
    assert!(e.contains("chmod 600"), "{e}");
}

// ---------------------------------------------------------------------------------------
// TLS and framing

#[tokio::test]
async fn tls_carries_data_and_control_both_ways_and_shows_fingerprints() {
    let (_hs, server_id) = identity("tls-server");
    let (_hc, client_id) = identity("tls-client");
    let ((sconn, speer), (cconn, cpeer)) = tls_pair(&server_id, &client_id).await;
    assert_eq!(speer.fingerprint, Some(client_id.fingerprint()));
    assert_eq!(cpeer.fingerprint, Some(server_id.fingerprint()));
    assert_eq!(
        sconn.peer_fingerprint().unwrap(),
        Some(client_id.fingerprint())
    );
    assert!(sconn.is_tls() && cconn.is_tls());

    let (mut sr, mut sw) = sconn.split();
    let (mut cr, mut cw) = cconn.split();

    // client -> server
    let copies = ndd_core::frame::copies_on_this_thread();
    cw.write_frame(frame(1, 7, b"device event"), 0)
        .await
        .unwrap();
    assert_eq!(
        ndd_core::frame::copies_on_this_thread(),
        copies,
        "payload copied"
    );
    cw.write_message(&Message::Control {
        stream: 1,
        layer: 2,
        msg: b"refill 7",
    })
    .await
    .unwrap();
    cw.flush().await.unwrap();

    let (h, p) = expect_data(sr.read().await.unwrap());
    assert_eq!((h.stream_id, h.seq, h.retransmit), (1, 7, false));
    assert_eq!(h.timestamp_ns, 1_700_000_000_000_000_007);
    assert_eq!(&p[..], b"device event");
    assert_eq!(
        sr.read().await.unwrap(),
        Some(Incoming::Other(OwnedMessage::Control {
            stream: 1,
            layer: 2,
            msg: b"refill 7".to_vec()
        }))
    );

    // server -> client, with the retransmit flag
    sw.write_frame(frame(2, 1, b"LED on"), ndd_wire::FLAG_RETRANSMIT)
        .await
        .unwrap();
    sw.write_message(&Message::Ping { t1: 42 }).await.unwrap();
    sw.flush().await.unwrap();
    let msg = cr.read().await.unwrap().unwrap();
    let f = msg.into_frame().unwrap();
    assert_eq!(f.meta.stream, 2);
    assert_eq!(f.meta.flags, ndd_wire::FLAG_RETRANSMIT);
    assert_eq!(f.payload(), b"LED on");
    assert_eq!(
        cr.read().await.unwrap(),
        Some(Incoming::Other(OwnedMessage::Ping { t1: 42 }))
    );

    // Clean close: close_notify, then end of stream between messages.
    cw.shutdown().await.unwrap();
    assert_eq!(sr.read().await.unwrap(), None);
    sw.shutdown().await.unwrap();
    assert_eq!(cr.read().await.unwrap(), None);
}

#[tokio::test]
async fn megabyte_frame_crosses_intact() {
    let (_hs, server_id) = identity("big-server");
    let (_hc, client_id) = identity("big-client");
    let ((sconn, _), (cconn, _)) = tls_pair(&server_id, &client_id).await;
    let (mut sr, _sw) = sconn.split();
    let (_cr, mut cw) = cconn.split();
    let payload: Vec<u8> = (0..1_000_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let send = async {
        cw.write_frame(frame(3, 99, &payload), 0).await.unwrap();
        cw.write_frame(frame(3, 100, b"after"), 0).await.unwrap();
        cw.flush().await.unwrap();
    };
    let recv = async {
        let (h, p) = expect_data(sr.read().await.unwrap());
        let (h2, p2) = expect_data(sr.read().await.unwrap());
        (h, p, h2, p2)
    };
    let ((), (h, p, h2, p2)) = tokio::join!(send, recv);
    assert_eq!((h.stream_id, h.seq), (3, 99));
    assert_eq!(p.len(), payload.len());
    assert!(p[..] == payload[..], "payload corrupted");
    assert_eq!((h2.seq, &p2[..]), (100, &b"after"[..]));
}

#[tokio::test]
async fn write_data_sends_a_kept_payload_intact_over_plain_and_tls() {
    // Several megabytes at once so the vectored writes come back partial (the peer reads
    // only when the writer has filled the socket buffers), plus an empty payload.
    let payload: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect();
    let (_hs, server_id) = identity("wd-server");
    let (_hc, client_id) = identity("wd-client");
    for (name, ((sconn, _), (cconn, _))) in [
        ("plain", plain_pair().await),
        ("tls", tls_pair(&server_id, &client_id).await),
    ] {
        let (mut sr, _sw) = sconn.split();
        let (_cr, mut cw) = cconn.split();
        let header = |seq, retransmit| ndd_wire::DataHeader {
            stream_id: 4,
            retransmit,
            more: false,
            seq,
            timestamp_ns: 77,
        };
        // A chunk of a cut frame keeps its MORE flag across the link.
        let chunk = ndd_wire::DataHeader {
            more: true,
            ..header(4, false)
        };
        let send = async {
            cw.write_data(&header(1, false), &payload).await.unwrap();
            cw.write_data(&header(2, true), b"").await.unwrap();
            cw.write_data(&header(3, false), b"tail").await.unwrap();
            cw.write_data(&chunk, b"chunk").await.unwrap();
            cw.flush().await.unwrap();
        };
        let recv = async {
            let mut got = Vec::new();
            for _ in 0..4 {
                got.push(expect_data(sr.read().await.unwrap()));
            }
            got
        };
        let ((), got) = tokio::join!(send, recv);
        assert_eq!(got[0].0, header(1, false), "{name}");
        assert!(got[0].1[..] == payload[..], "{name}: payload corrupted");
        assert_eq!((got[1].0, got[1].1.len()), (header(2, true), 0), "{name}");
        assert_eq!(
            (got[2].0, &got[2].1[..]),
            (header(3, false), &b"tail"[..]),
            "{name}"
        );
        assert_eq!((got[3].0, &got[3].1[..]), (chunk, &b"chunk"[..]), "{name}");
    }
}

#[tokio::test]
async fn the_unsent_limit_reaches_the_socket() {
    let (_hs, server_id) = identity("ul-server");
    let (_hc, client_id) = identity("ul-client");
    for (name, ((_s, _), (cconn, _))) in [
        ("plain", plain_pair().await),
        ("tls", tls_pair(&server_id, &client_id).await),
    ] {
        let (_cr, mut cw) = cconn.split();
        assert_eq!(cw.unsent_limit().unwrap(), None, "{name}: not set yet");
        cw.set_unsent_limit(4096);
        assert_eq!(cw.unsent_limit().unwrap(), Some(4096), "{name}");
        // Within a quarter of the last value: no system call, the option stays.
        cw.set_unsent_limit(4500);
        assert_eq!(cw.unsent_limit().unwrap(), Some(4096), "{name}");
        cw.set_unsent_limit(1 << 20);
        assert_eq!(cw.unsent_limit().unwrap(), Some(1 << 20), "{name}");
    }
}

#[tokio::test]
async fn plain_mode_carries_messages() {
    let ((sconn, speer), (cconn, cpeer)) = plain_pair().await;
    assert_eq!(speer.fingerprint, None);
    assert_eq!(cpeer.fingerprint, None);
    assert!(!sconn.is_tls());
    assert_eq!(sconn.peer_fingerprint().unwrap(), None);
    let (mut sr, mut sw) = sconn.split();
    let (mut cr, mut cw) = cconn.split();
    cw.write_frame(frame(1, 1, b"plain"), 0).await.unwrap();
    cw.write_message(&Message::Ready).await.unwrap();
    let (h, p) = expect_data(sr.read().await.unwrap());
    assert_eq!((h.seq, &p[..]), (1, &b"plain"[..]));
    assert_eq!(
        sr.read().await.unwrap(),
        Some(Incoming::Other(OwnedMessage::Ready))
    );
    sw.write_frame(frame(9, 5, b""), 0).await.unwrap();
    let (h, p) = expect_data(cr.read().await.unwrap());
    assert_eq!((h.stream_id, h.seq, p.len()), (9, 5, 0));
    cw.shutdown().await.unwrap();
    assert_eq!(sr.read().await.unwrap(), None);
}

#[tokio::test]
async fn garbage_fails_that_accept_and_the_next_tls_client_is_served() {
    let (_hs, server_id) = identity("garbage-server");
    let (_hc, client_id) = identity("garbage-client");
    let (listener, addr) = local_listener().await;
    let sc = server_config(&server_id).unwrap();
    let cc = client_config(&client_id).unwrap();

    let mut junk = tokio::net::TcpStream::connect(&addr).await.unwrap();
    junk.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let e = listener.accept(Some(&sc), T).await.unwrap_err();
    assert!(matches!(e, LinkError::Handshake { .. }), "{e}");
    assert!(
        e.to_string().starts_with("TLS handshake with 127.0.0.1:"),
        "{e}"
    );

    let (s, c) = tokio::join!(listener.accept(Some(&sc), T), connect(&addr, Some(&cc), T));
    let (_, speer) = s.unwrap();
    let (_, cpeer) = c.unwrap();
    assert_eq!(speer.fingerprint, Some(client_id.fingerprint()));
    assert_eq!(cpeer.fingerprint, Some(server_id.fingerprint()));
    drop(junk);
}

#[tokio::test]
async fn silent_client_times_out_and_the_next_client_is_served() {
    let (_hs, server_id) = identity("silent-server");
    let (_hc, client_id) = identity("silent-client");
    let (listener, addr) = local_listener().await;
    let sc = server_config(&server_id).unwrap();
    let cc = client_config(&client_id).unwrap();

    let silent = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let e = listener
        .accept(Some(&sc), Duration::from_millis(200))
        .await
        .unwrap_err();
    assert!(matches!(e, LinkError::HandshakeTimeout { .. }), "{e}");
    assert!(e.to_string().contains("did not finish within"), "{e}");

    let (s, c) = tokio::join!(listener.accept(Some(&sc), T), connect(&addr, Some(&cc), T));
    s.unwrap();
    c.unwrap();
    drop(silent);
}

#[tokio::test]
async fn tls_client_refused_by_plain_server_and_vice_versa() {
    let (_h, id) = identity("mixed");
    let cc = client_config(&id).unwrap();
    let sc = server_config(&id).unwrap();

    // TLS client, plain server: the client's handshake fails, it does not hang.
    let (listener, addr) = local_listener().await;
    let server = async {
        let (conn, _) = listener.accept(None, T).await.unwrap();
        let (mut r, _w) = conn.split();
        r.read().await
    };
    let (s, c) = tokio::join!(server, connect(&addr, Some(&cc), T));
    // The plain side recognises the ClientHello.
    let e = s.unwrap_err();
    assert!(matches!(e, LinkError::PeerSpeaksTls), "{e}");
    assert!(e.to_string().contains("--insecure"), "{e}");
    assert!(c.unwrap_err().to_string().contains("--insecure"));

    // Plain client, TLS server.
    let (listener, addr) = local_listener().await;
    let client = async {
        let (conn, _) = connect(&addr, None, T).await.unwrap();
        let (_r, mut w) = conn.split();
        w.write_message(&Message::Ready).await.unwrap();
        w
    };
    let (s, _w) = tokio::join!(listener.accept(Some(&sc), T), client);
    let e = s.unwrap_err();
    assert!(matches!(e, LinkError::Handshake { .. }), "{e}");
    assert!(e.to_string().contains("does not speak TLS"), "{e}");
}

#[tokio::test]
async fn peer_closing_mid_message_is_an_error() {
    // Plain TCP.
    let ((sconn, _), (mut cconn, _)) = plain_pair().await;
    let mut bytes = Vec::new();
    Message::Control {
        stream: 1,
        layer: 0,
        msg: &[7; 100],
    }
    .emit_append(&mut bytes)
    .unwrap();
    cconn.write_all(&bytes[..40]).await.unwrap();
    cconn.shutdown().await.unwrap();
    let (mut sr, _sw) = sconn.split();
    let e = sr.read().await.unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "peer closed the connection in the middle of a message (got 40 of {} bytes)",
            bytes.len()
        )
    );

    // Inside the prefix: the length is not known yet.
    let ((sconn, _), (mut cconn, _)) = plain_pair().await;
    cconn.write_all(&[1, 2, 0]).await.unwrap();
    cconn.shutdown().await.unwrap();
    let (mut sr, _sw) = sconn.split();
    let e = sr.read().await.unwrap_err().to_string();
    assert!(e.ends_with("(got 3 of 10 bytes)"), "{e}");

    // TLS, with and without close_notify.
    let (_hs, server_id) = identity("mid-server");
    let (_hc, client_id) = identity("mid-client");
    for close_notify in [true, false] {
        let ((sconn, _), (mut cconn, _)) = tls_pair(&server_id, &client_id).await;
        cconn.write_all(&bytes[..50]).await.unwrap();
        if close_notify {
            cconn.shutdown().await.unwrap();
        } else {
            cconn.flush().await.unwrap();
        }
        drop(cconn);
        let (mut sr, _sw) = sconn.split();
        let e = sr.read().await.unwrap_err();
        assert!(
            matches!(e, LinkError::ClosedMidMessage { got: 50, .. }),
            "close_notify {close_notify}: {e}"
        );
    }
}

#[tokio::test]
async fn tls_cut_without_close_notify_is_reported() {
    let (_hs, server_id) = identity("cut-server");
    let (_hc, client_id) = identity("cut-client");
    let ((sconn, _), (cconn, _)) = tls_pair(&server_id, &client_id).await;
    let (mut sr, _sw) = sconn.split();
    let (cr, mut cw) = cconn.split();
    cw.write_message(&Message::Ready).await.unwrap();
    cw.flush().await.unwrap();
    drop((cr, cw)); // no shutdown: no close_notify
    assert_eq!(
        sr.read().await.unwrap(),
        Some(Incoming::Other(OwnedMessage::Ready))
    );
    let e = sr.read().await.unwrap_err();
    assert!(matches!(e, LinkError::TlsTruncated), "{e}");
    assert!(e.to_string().contains("without close_notify"), "{e}");
}

#[tokio::test]
async fn oversized_and_garbage_messages_are_refused() {
    // A body over the reader's limit: refused from the prefix alone.
    let ((sconn, _), (mut cconn, _)) = plain_pair().await;
    let (mut sr, _sw) = sconn.split();
    sr.set_max_body(65_536);
    assert_eq!(sr.max_body(), 65_536);
    cconn
        .write_all(&[1, 1, 0, 0, 0, 1, 0x7f, 0xff, 0xff, 0xff])
        .await
        .unwrap();
    let e = sr.read().await.unwrap_err().to_string();
    assert!(
        e.contains("2147483647 bytes") && e.contains("65536 bytes"),
        "{e}"
    );

    // Wrong version byte: the wire format's text.
    let ((sconn, _), (mut cconn, _)) = plain_pair().await;
    let (mut sr, _sw) = sconn.split();
    cconn.write_all(b"\x07hello there").await.unwrap();
    let e = sr.read().await.unwrap_err();
    let wire = ndd_wire::WireError::UnknownVersion {
        got: 7,
        expected: 1,
    };
    assert_eq!(e.to_string(), wire.to_string());

    // Complete message with a bad body: DATA on stream 0.
    let ((sconn, _), (mut cconn, _)) = plain_pair().await;
    let (mut sr, _sw) = sconn.split();
    let mut data = vec![1, 1, 0, 0, 0, 0, 0, 0, 0, 16];
    data.extend_from_slice(&[0; 16]);
    cconn.write_all(&data).await.unwrap();
    let e = sr.read().await.unwrap_err().to_string();
    assert!(e.contains("stream 0"), "{e}");

    // The writer refuses what the peer would refuse.
    let ((_s, _), (cconn, _)) = plain_pair().await;
    let (_cr, mut cw) = cconn.split();
    cw.set_peer_max_body(65_536);
    let e = cw
        .write_frame(frame(1, 1, &vec![0; 70_000]), 0)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("70016 bytes") && e.contains("peer's limit of 65536"),
        "{e}"
    );
}

/// A client that shows someone else's certificate but cannot sign with its key is refused:
/// the handshake signature is verified, not just the certificate accepted.
#[tokio::test]
async fn stolen_certificate_without_its_key_is_refused() {
    #[derive(Debug)]
    struct Impostor(Arc<rustls::sign::CertifiedKey>);
    impl rustls::client::ResolvesClientCert for Impostor {
        fn resolve(
            &self,
            _hints: &[&[u8]],
            _schemes: &[rustls::SignatureScheme],
        ) -> Option<Arc<rustls::sign::CertifiedKey>> {
            Some(Arc::clone(&self.0))
        }
        fn has_certs(&self) -> bool {
            true
        }
    }

    let (_hs, server_id) = identity("stolen-server");
    let (_hv, victim) = identity("stolen-victim");
    let (_ha, attacker) = identity("stolen-attacker");
    let provider = ndd_link::tls::provider();
    let attacker_key = provider
        .key_provider
        .load_private_key(attacker.key_der().clone_key())
        .unwrap();
    let forged = rustls::sign::CertifiedKey::new(vec![victim.cert_der().clone()], attacker_key);

    // Start from our client config (verifier, TLS 1.3) and swap in the forged credentials.
    let mut cc = (*client_config(&attacker).unwrap()).clone();
    cc.client_auth_cert_resolver = Arc::new(Impostor(Arc::new(forged)));
    let cc = Arc::new(cc);

    let (listener, addr) = local_listener().await;
    let sc = server_config(&server_id).unwrap();
    let (s, _c) = tokio::join!(listener.accept(Some(&sc), T), connect(&addr, Some(&cc), T));
    let e = s.unwrap_err();
    assert!(matches!(e, LinkError::Handshake { .. }), "{e}");
}

/// Identity and trust files are read with a bound and checked at load (issue 17, D8): a
/// device file, a huge file or a home others can write to is one clear error, never a hang.
#[test]
fn identity_and_trust_files_are_bounded_and_their_home_private() {
    use std::os::unix::fs::{symlink, PermissionsExt};
    let home = Home::new("files");
    Identity::create(home.path(), false).unwrap();
    // known_peers pointing at /dev/zero: refused by name, not read until memory runs out.
    let kp = home.path().join("known_peers");
    symlink("/dev/zero", &kp).unwrap();
    let e = KnownPeers::load(home.path()).unwrap_err().to_string();
    assert!(e.contains("known_peers: not a regular file"), "{e}");
    fs::remove_file(&kp).unwrap();
    // A 2 MiB known_peers.
    fs::write(&kp, vec![b'#'; 2 << 20]).unwrap();
    fs::set_permissions(&kp, fs::Permissions::from_mode(0o600)).unwrap();
    let e = KnownPeers::load(home.path()).unwrap_err().to_string();
    assert!(
        e.contains("2097152 bytes") && e.contains("at most 1048576"),
        "{e}"
    );
    fs::remove_file(&kp).unwrap();
    // cert.pem replaced by /dev/zero.
    let cert = home.path().join("cert.pem");
    fs::remove_file(&cert).unwrap();
    symlink("/dev/zero", &cert).unwrap();
    let e = Identity::load(home.path()).unwrap_err().to_string();
    assert!(e.contains("cert.pem: not a regular file"), "{e}");
    fs::remove_file(&cert).unwrap();
    // A home directory others can write to.
    Identity::create(home.path(), true).unwrap();
    fs::set_permissions(home.path(), fs::Permissions::from_mode(0o775)).unwrap();
    let e = Identity::load(home.path()).unwrap_err().to_string();
    assert!(
        e.contains("permissions 0775") && e.contains("chmod 700"),
        "{e}"
    );
    fs::set_permissions(home.path(), fs::Permissions::from_mode(0o700)).unwrap();
    Identity::load(home.path()).unwrap();
}

//! Device records, as a sink endpoint receives them from the peer: display updates (applied
//! to a framebuffer, as the `x11-window` and `framebuffer` sinks do), cursor records, input
//! records, serial records, clipboard records and audio records; and the RFC 2217 (telnet) stream an
//! `rfc2217-server` or `rfc2217-client` reads from its peer; the NATS link's frame records and
//! join messages (what anyone on the NATS server can send a side), and `multiplex` headers. Nothing may panic; whatever
//! parses emits bytes that parse to the same value.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ndd_endpoint::display::{Cursor, Update};
use ndd_endpoint::serial::rfc2217::telnet::{Note, Role, Telnet};
use ndd_endpoint::{Framebuffer, InputMessage, LineSettings, PixelFormat, SerialMessage};
use ndd_wire::audio::Block;
use ndd_wire::clipboard::Contents;
use std::sync::OnceLock;

/// A device identity for the join host (made once per fuzzing process).
fn device() -> &'static ndd_link::seal::LocalIdentity {
    static ID: OnceLock<ndd_link::seal::LocalIdentity> = OnceLock::new();
    ID.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("ndd-fuzz-id-{}", std::process::id()));
        let (id, _) = ndd_link::Identity::load_or_create(&dir).expect("identity");
        ndd_link::seal::LocalIdentity::new(&id).expect("signing identity")
    })
}

fuzz_target!(|data: &[u8]| {
    if let Ok(u) = Update::parse(data) {
        let bytes = u.emit().expect("a parsed update emits");
        assert_eq!(Update::parse(&bytes).as_ref(), Ok(&u));
        // A small screen first: updates for a larger one resize it (bounded by u16 sizes).
        let mut fb = Framebuffer::new(16, 16, PixelFormat::Bgrx32);
        let _ = fb.apply(&u);
    }
    if let Ok(m) = InputMessage::parse(data) {
        let bytes = m.emit().expect("a parsed input record emits");
        assert_eq!(InputMessage::parse(&bytes), Ok(m));
    }
    if let Ok(c) = Cursor::parse(data) {
        let bytes = c.emit().expect("a parsed cursor emits");
        assert_eq!(Cursor::parse(&bytes), Ok(c));
    }
    if let Ok(m) = SerialMessage::parse(data) {
        let bytes = m.emit();
        assert_eq!(SerialMessage::parse(&bytes), Ok(m));
    }
    for role in [Role::Server, Role::Client] {
        let mut t = Telnet::new(role, LineSettings::default());
        let mut notes = Vec::new();
        t.feed(data, &mut notes);
        let bytes: usize = notes
            .iter()
            .map(|n| match n {
                Note::Data(d) => d.len(),
                _ => 0,
            })
            .sum();
        assert!(bytes <= data.len(), "more data out than bytes in");
        if let Some(Note::Settings(s)) = notes.iter().find(|n| matches!(n, Note::Settings(_))) {
            assert!(s.check().is_ok(), "settings out of range: {s:?}");
        }
        let _ = t.take_out();
    }
    if let Ok(b) = Block::parse(data) {
        let bytes = b.emit().expect("a parsed audio record emits");
        assert_eq!(bytes, data, "audio records have one encoding");
    }
    let b = bytes::Bytes::copy_from_slice(data);
    if let Some(r) = ndd_link::nats::record::FrameRecord::parse(&b) {
        assert_eq!(&r.encode()[..], data, "frame records have one encoding");
    }
    if let Ok(h) = ndd_modules::multiplex::Header::parse(data) {
        assert_eq!(&h.encode()[..], &data[..ndd_modules::multiplex::HEADER_LEN]);
    }
    let mut host = ndd_link::nats::join::Host::new(std::time::Duration::from_secs(3));
    let now = std::time::Instant::now();
    let _ = host.handle_init(now, device(), data);
    let _ = host.handle_finish(now, data);
    if let Ok(mut j) = ndd_link::nats::join::Joiner::new() {
        let _ = j.handle_reply(device(), data, b"hello");
        let _ = j.handle_welcome(data);
    }
    if let Ok(c) = Contents::parse(data) {
        let bytes = c.emit().expect("a parsed clipboard record emits");
        assert_eq!(bytes, data, "clipboard records have one encoding");
    }
});

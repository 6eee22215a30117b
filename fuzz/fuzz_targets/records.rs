//! Device records, as a sink endpoint receives them from the peer: display updates (applied
//! to a framebuffer, as the `x11-window` and `framebuffer` sinks do), cursor records, input
//! records, serial records, clipboard records and audio records; and the RFC 2217 (telnet) stream an
//! `rfc2217-server` or `rfc2217-client` reads from its peer. Nothing may panic; whatever
//! parses emits bytes that parse to the same value.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ndd_endpoint::display::{Cursor, Update};
use ndd_endpoint::serial::rfc2217::telnet::{Note, Role, Telnet};
use ndd_endpoint::{Framebuffer, InputMessage, LineSettings, PixelFormat, SerialMessage};
use ndd_wire::audio::Block;
use ndd_wire::clipboard::Contents;

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
    if let Ok(c) = Contents::parse(data) {
        let bytes = c.emit().expect("a parsed clipboard record emits");
        assert_eq!(bytes, data, "clipboard records have one encoding");
    }
});

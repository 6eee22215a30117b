//! The sans-IO parsers over hand-built byte vectors: every encoding, truncation, garbage, and
//! arbitrary splits.

use ndd_rfb::client::{parse_client_message, ClientMsg, ClientStream};
use ndd_rfb::proto::enc;
use ndd_rfb::server::{Boundary, ServerEvent, ServerStream};
use ndd_rfb::{ParseError, PixelFormat};
use proptest::prelude::*;

fn pf8() -> PixelFormat {
    PixelFormat {
        bits_per_pixel: 8,
        depth: 8,
        big_endian: false,
        true_colour: true,
        red_max: 7,
        green_max: 7,
        blue_max: 3,
        red_shift: 0,
        green_shift: 3,
        blue_shift: 6,
    }
}

fn pf16() -> PixelFormat {
    PixelFormat {
        bits_per_pixel: 16,
        depth: 16,
        red_max: 31,
        green_max: 63,
        blue_max: 31,
        red_shift: 11,
        green_shift: 5,
        blue_shift: 0,
        ..PixelFormat::default()
    }
}

fn rect(x: u16, y: u16, w: u16, h: u16, e: i32) -> Vec<u8> {
    let mut v = Vec::new();
    for n in [x, y, w, h] {
        v.extend_from_slice(&n.to_be_bytes());
    }
    v.extend_from_slice(&e.to_be_bytes());
    v
}

fn update(rects: &[Vec<u8>]) -> Vec<u8> {
    let mut v = vec![0, 0];
    v.extend_from_slice(&(rects.len() as u16).to_be_bytes());
    for r in rects {
        v.extend_from_slice(r);
    }
    v
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// Feed in one piece; return the end offsets of updates and other messages.
fn ends(pf: PixelFormat, bytes: &[u8]) -> Result<Vec<(u64, ServerEvent)>, ParseError> {
    let mut s = ServerStream::new(pf);
    let mut out = Vec::new();
    s.feed(bytes, &mut out)?;
    Ok(out
        .into_iter()
        .filter(|b| !matches!(b.event, ServerEvent::UpdateStart { .. }))
        .map(|b| (b.offset, b.event))
        .collect())
}

/// One complete update, exactly `bytes` long, must end at `bytes.len()` and at no earlier
/// point; every strict prefix must give no UpdateEnd (truncation is not an end).
fn assert_single_update(pf: PixelFormat, bytes: &[u8]) {
    assert_eq!(
        ends(pf, bytes),
        Ok(vec![(bytes.len() as u64, ServerEvent::UpdateEnd)]),
        "whole update"
    );
    for cut in 0..bytes.len() {
        let e = ends(pf, &bytes[..cut]).expect("prefix of a valid update is not an error");
        assert!(e.is_empty(), "prefix of {cut} bytes ended an update");
        let mut s = ServerStream::new(pf);
        let mut out = Vec::new();
        s.feed(&bytes[..cut], &mut out).unwrap();
        assert!(!s.is_idle() || cut == 0);
    }
}

#[test]
fn raw_at_every_depth() {
    for (pf, bpp) in [(pf8(), 1), (pf16(), 2), (PixelFormat::default(), 4)] {
        let mut r = rect(0, 0, 3, 2, enc::RAW);
        r.extend(vec![0xAB; 3 * 2 * bpp]);
        assert_single_update(pf, &update(&[r]));
    }
}

#[test]
fn empty_update_and_zero_sized_rects() {
    assert_single_update(PixelFormat::default(), &update(&[]));
    assert_single_update(
        PixelFormat::default(),
        &update(&[rect(5, 5, 0, 0, enc::RAW)]),
    );
    assert_single_update(
        PixelFormat::default(),
        &update(&[rect(5, 5, 0, 7, enc::HEXTILE)]),
    );
}

#[test]
fn copy_rect() {
    let r = cat(&[&rect(1, 2, 30, 40, enc::COPY_RECT), &[0, 9, 0, 8]]);
    assert_single_update(PixelFormat::default(), &update(&[r]));
}

#[test]
fn rre() {
    // 2 subrects at 16 bpp: count, background, then (pixel + x,y,w,h) each.
    let mut r = rect(0, 0, 100, 100, enc::RRE);
    r.extend_from_slice(&2u32.to_be_bytes());
    r.extend_from_slice(&[1, 2]);
    for _ in 0..2 {
        r.extend_from_slice(&[3, 4, 0, 1, 0, 1, 0, 5, 0, 5]);
    }
    assert_single_update(pf16(), &update(&[r]));
}

#[test]
fn hextile_all_subencodings() {
    // 20x18 rectangle = 2x2 tiles: 16x16, 4x16, 16x2, 4x2.
    let bpp = 4;
    let mut r = rect(0, 0, 20, 18, enc::HEXTILE);
    // Tile 1: raw 16x16.
    r.push(1);
    r.extend(vec![7; 16 * 16 * bpp]);
    // Tile 2: background + foreground + 2 mono subrects.
    r.push(2 | 4 | 8);
    r.extend(vec![1; bpp]);
    r.extend(vec![2; bpp]);
    r.push(2);
    r.extend_from_slice(&[0x00, 0x11, 0x12, 0x11]);
    // Tile 3: 1 coloured subrect, no background.
    r.push(8 | 16);
    r.push(1);
    r.extend(vec![3; bpp]);
    r.extend_from_slice(&[0x00, 0x00]);
    // Tile 4: nothing (previous background).
    r.push(0);
    assert_single_update(PixelFormat::default(), &update(&[r]));
}

#[test]
fn zrle() {
    let r = cat(&[
        &rect(0, 0, 64, 64, enc::ZRLE),
        &5u32.to_be_bytes(),
        &[1, 2, 3, 4, 5],
    ]);
    assert_single_update(PixelFormat::default(), &update(&[r]));
}

fn tight(w: u16, h: u16, body: &[u8]) -> Vec<u8> {
    cat(&[&rect(0, 0, w, h, enc::TIGHT), body])
}

#[test]
fn tight_fill_jpeg_and_basic() {
    let pf = PixelFormat::default(); // TPIXEL is 3 bytes
                                     // Fill.
    assert_single_update(pf, &update(&[tight(50, 50, &[0x80, 1, 2, 3])]));
    // JPEG with a 2-byte compact length (200 = 0xC8 -> 0xC8 0x01).
    let mut j = vec![0x90, 0xC8, 0x01];
    j.extend(vec![0xFF; 200]);
    assert_single_update(pf, &update(&[tight(50, 50, &j)]));
    // Basic, copy filter implicit, small (2x1x3 = 6 < 12 bytes: raw, no length).
    assert_single_update(pf, &update(&[tight(2, 1, &[0x00, 1, 2, 3, 4, 5, 6])]));
    // Basic, explicit copy filter, stream 2, compressed (10x10x3 = 300 bytes): length 5.
    assert_single_update(
        pf,
        &update(&[tight(10, 10, &[0x60, 0x00, 5, 9, 9, 9, 9, 9])]),
    );
    // Gradient filter at 16 bpp (TPIXEL 2), 3-byte compact length 16384+1.
    let mut g = vec![0x40, 0x02, 0x81, 0x80, 0x01];
    g.extend(vec![0; 16385]);
    assert_single_update(pf16(), &update(&[tight(100, 100, &g)]));
}

#[test]
fn tight_palette() {
    let pf = PixelFormat::default();
    // 2 colours: 1 bit per pixel, rows padded: 10x1 -> 2 bytes < 12: raw.
    let b = cat(&[&[0x40, 0x01, 1], &[0; 6], &[0xAA, 0xC0]]);
    assert_single_update(pf, &update(&[tight(10, 1, &b)]));
    // 4 colours: 1 byte per pixel, 20x20 = 400 >= 12: compact length 3.
    let b = cat(&[&[0x40, 0x01, 3], &[0; 12], &[3, 1, 2, 3]]);
    assert_single_update(pf, &update(&[tight(20, 20, &b)]));
}

#[test]
fn pseudo_encodings() {
    let pf = PixelFormat::default();
    let cursor = cat(&[&rect(0, 0, 9, 2, enc::CURSOR), &[0; 9 * 2 * 4 + 2 * 2]]);
    let xcursor = cat(&[&rect(0, 0, 9, 2, enc::X_CURSOR), &[0; 6 + 2 * 2 * 2]]);
    let empty_xcursor = rect(0, 0, 0, 0, enc::X_CURSOR);
    let ds = rect(0, 0, 800, 600, enc::DESKTOP_SIZE);
    let eds = cat(&[
        &rect(0, 0, 800, 600, enc::EXTENDED_DESKTOP_SIZE),
        &[2, 0, 0, 0],
        &[0; 32],
    ]);
    let name = cat(&[
        &rect(0, 0, 0, 0, enc::DESKTOP_NAME),
        &3u32.to_be_bytes(),
        b"abc",
    ]);
    let pos = rect(3, 4, 0, 0, enc::POINTER_POS);
    let led = cat(&[&rect(0, 0, 0, 0, enc::LED_STATE), &[1]]);
    let qemu = rect(0, 0, 0, 0, enc::QEMU_EXTENDED_KEY);
    assert_single_update(
        pf,
        &update(&[
            cursor,
            xcursor,
            empty_xcursor,
            ds,
            eds,
            name,
            pos,
            led,
            qemu,
        ]),
    );
}

#[test]
fn last_rect_ends_an_open_ended_update() {
    let mut u = vec![0, 0, 0xFF, 0xFF];
    u.extend(cat(&[&rect(0, 0, 1, 1, enc::RAW), &[1, 2, 3, 4]]));
    u.extend(rect(0, 0, 0, 0, enc::LAST_RECT));
    assert_single_update(PixelFormat::default(), &u);
    // LastRect also ends an update with a count.
    let u = update(&[
        rect(0, 0, 0, 0, enc::LAST_RECT),
        rect(0, 0, 0, 0, enc::LAST_RECT),
    ]);
    let n = u.len() as u64 - 12;
    assert_eq!(
        ends(PixelFormat::default(), &u[..n as usize]),
        Ok(vec![(n, ServerEvent::UpdateEnd)])
    );
}

#[test]
fn other_server_messages() {
    let pf = PixelFormat::default();
    let colour_map = cat(&[&[1, 0, 0, 0, 0, 2], &[0; 12]]);
    let bell = vec![2];
    let cut = cat(&[&[3, 0, 0, 0], &4u32.to_be_bytes(), b"text"]);
    let ext_cut = cat(&[&[3, 0, 0, 0], &(-4i32).to_be_bytes(), &[0, 0, 0, 1]]);
    let eocu = vec![150];
    let fence = cat(&[&[248, 0, 0, 0], &[0x80, 0, 0, 3], &[2], &[7, 7]]);
    let all = cat(&[&colour_map, &bell, &cut, &ext_cut, &eocu, &fence]);
    let mut at = 0u64;
    let mut want = Vec::new();
    for (m, ev) in [
        (&colour_map, ServerEvent::ColourMap),
        (&bell, ServerEvent::Bell),
        (&cut, ServerEvent::CutText),
        (&ext_cut, ServerEvent::CutText),
        (&eocu, ServerEvent::EndOfContinuousUpdates),
        (&fence, ServerEvent::Fence),
    ] {
        at += m.len() as u64;
        want.push((at, ev));
    }
    assert_eq!(ends(pf, &all), Ok(want));
}

#[test]
fn garbage_gives_typed_errors() {
    let pf = PixelFormat::default();
    assert_eq!(ends(pf, &[77]), Err(ParseError::UnknownServerMessage(77)));
    assert_eq!(
        ends(pf, &update(&[rect(0, 0, 1, 1, 6)])),
        Err(ParseError::UnknownEncoding(6))
    );
    assert_eq!(
        ends(pf, &update(&[tight(4, 4, &[0xA0])])),
        Err(ParseError::BadTightControl(0xA))
    );
    assert_eq!(
        ends(pf, &update(&[tight(4, 4, &[0x40, 7])])),
        Err(ParseError::BadTightFilter(7))
    );
    assert_eq!(
        ends(pf, &[248, 0, 0, 0, 0, 0, 0, 0, 65]),
        Err(ParseError::FenceTooLong(65))
    );
}

#[test]
fn pixel_format_change_between_updates() {
    let mut s = ServerStream::new(PixelFormat::default());
    let mut out = Vec::new();
    let u32bpp = update(&[cat(&[&rect(0, 0, 2, 1, enc::RAW), &[0; 8]])]);
    s.feed(&u32bpp, &mut out).unwrap();
    assert!(s.is_idle());
    s.set_pixel_format(pf8());
    let u8bpp = update(&[cat(&[&rect(0, 0, 2, 1, enc::RAW), &[0; 2]])]);
    s.feed(&u8bpp, &mut out).unwrap();
    assert!(s.is_idle());
    assert_eq!(s.updates(), 2);
}

#[test]
fn client_messages() {
    let mut spf = vec![0, 0, 0, 0];
    spf.extend_from_slice(&pf16().emit());
    let msgs: Vec<(Vec<u8>, ClientMsg)> = vec![
        (spf, ClientMsg::SetPixelFormat(pf16())),
        (
            cat(&[&[2, 0, 0, 2], &0i32.to_be_bytes(), &(-239i32).to_be_bytes()]),
            ClientMsg::SetEncodings(vec![0, -239]),
        ),
        (
            vec![3, 1, 0, 0, 0, 0, 2, 128, 1, 224],
            ClientMsg::UpdateRequest(ndd_rfb::UpdateRequest {
                incremental: true,
                x: 0,
                y: 0,
                w: 640,
                h: 480,
            }),
        ),
        (vec![4, 1, 0, 0, 0, 0, 0, 0x61], ClientMsg::KeyEvent),
        (vec![5, 0, 0, 10, 0, 20], ClientMsg::PointerEvent),
        (
            cat(&[&[6, 0, 0, 0], &2u32.to_be_bytes(), b"hi"]),
            ClientMsg::CutText,
        ),
        (
            vec![150, 1, 0, 0, 0, 0, 2, 128, 1, 224],
            ClientMsg::EnableContinuousUpdates { enable: true },
        ),
        (
            cat(&[&[248, 0, 0, 0], &[0, 0, 0, 1], &[1], &[9]]),
            ClientMsg::Fence,
        ),
        (
            cat(&[&[251, 0, 3, 32, 2, 88, 1, 0], &[0; 16]]),
            ClientMsg::SetDesktopSize,
        ),
        (
            vec![255, 0, 0, 1, 0, 0, 0, 0x61, 0, 0, 0, 30],
            ClientMsg::QemuKeyEvent,
        ),
    ];
    let mut all = Vec::new();
    for (raw, want) in &msgs {
        assert_eq!(
            parse_client_message(raw, 1 << 20),
            Ok(Some((want.clone(), raw.len())))
        );
        for cut in 0..raw.len() {
            assert_eq!(parse_client_message(&raw[..cut], 1 << 20), Ok(None));
        }
        all.extend_from_slice(raw);
    }
    // Byte by byte through the stream.
    let mut cs = ClientStream::new(1 << 20);
    let mut out = Vec::new();
    for b in &all {
        cs.feed(std::slice::from_ref(b), &mut out).unwrap();
    }
    assert_eq!(out.len(), msgs.len());
    assert_eq!(cs.pending(), 0);
    assert_eq!(
        out.iter()
            .map(|m| m.raw.clone())
            .collect::<Vec<_>>()
            .concat(),
        all
    );
}

#[test]
fn client_garbage() {
    assert_eq!(
        parse_client_message(&[9], 100),
        Err(ParseError::UnknownClientMessage(9))
    );
    assert_eq!(
        parse_client_message(&cat(&[&[6, 0, 0, 0], &1000u32.to_be_bytes()]), 100),
        Err(ParseError::TooLong(1000))
    );
    let mut spf = vec![0, 0, 0, 0];
    spf.extend_from_slice(&[24; 16]);
    assert_eq!(
        parse_client_message(&spf, 100),
        Err(ParseError::BadPixelFormat(24))
    );
    assert_eq!(
        parse_client_message(&[255, 1], 100),
        Err(ParseError::UnknownClientMessage(255))
    );
}

/// A stream of every message kind, to split arbitrarily.
fn corpus() -> Vec<u8> {
    let mut hex = rect(0, 0, 17, 17, enc::HEXTILE);
    hex.push(1);
    hex.extend(vec![1; 16 * 16 * 4]);
    hex.extend_from_slice(&[8, 1, 0, 0]);
    hex.extend_from_slice(&[2, 9, 9, 9, 9]);
    hex.push(0);
    cat(&[
        &update(&[
            cat(&[&rect(0, 0, 3, 3, enc::RAW), &[5; 36]]),
            hex,
            tight(10, 10, &[0x60, 0x00, 5, 9, 9, 9, 9, 9]),
            cat(&[
                &rect(0, 0, 64, 64, enc::ZRLE),
                &3u32.to_be_bytes(),
                &[1, 2, 3],
            ]),
        ]),
        &[2],
        &cat(&[&[3, 0, 0, 0], &4u32.to_be_bytes(), b"text"]),
        &update(&[cat(&[&rect(1, 2, 30, 40, enc::COPY_RECT), &[0, 9, 0, 8]])]),
        &[150],
        &update(&[]),
    ])
}

fn boundaries_split(bytes: &[u8], cuts: &[usize]) -> Result<Vec<Boundary>, ParseError> {
    let mut s = ServerStream::new(PixelFormat::default());
    let mut out = Vec::new();
    let mut at = 0;
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    cuts.sort_unstable();
    for c in cuts {
        s.feed(&bytes[at..c], &mut out)?;
        at = c;
    }
    s.feed(&bytes[at..], &mut out)?;
    Ok(out)
}

proptest! {
    #[test]
    fn same_boundaries_at_any_split(cuts in proptest::collection::vec(any::<usize>(), 0..20)) {
        let bytes = corpus();
        let whole = boundaries_split(&bytes, &[]).unwrap();
        prop_assert_eq!(whole.iter().filter(|b| b.event == ServerEvent::UpdateEnd).count(), 3);
        prop_assert_eq!(boundaries_split(&bytes, &cuts).unwrap(), whole);
    }

    #[test]
    fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600), bpp in prop_oneof![Just(8u8), Just(16), Just(32)]) {
        let pf = PixelFormat { bits_per_pixel: bpp, ..PixelFormat::default() };
        let mut s = ServerStream::new(pf);
        let _ = s.feed(&bytes, &mut Vec::new());
        let mut c = ClientStream::new(1 << 16);
        let _ = c.feed(&bytes, &mut Vec::new());
    }

    #[test]
    fn corrupted_corpus_never_panics(flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8)) {
        let mut bytes = corpus();
        let len = bytes.len();
        for (at, v) in flips {
            bytes[at % len] = v;
        }
        let _ = boundaries_split(&bytes, &[len / 3, len / 2]);
    }
}

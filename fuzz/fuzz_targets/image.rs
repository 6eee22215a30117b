//! The `image` pair's inverse half, fed what a peer sends: any bytes either fail with an
//! error or decode into a display record that parses. And any display update the forward half
//! takes comes out of forward + inverse pixel-identical with the lossless preset.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ndd_core::frame::Meta;
use ndd_core::{Frame, Half, Output};
use ndd_modules::image::{ImageConfig, ImageForward, ImageInverse, Quality};
use ndd_wire::display::{Framebuffer, PixelFormat, Update, UpdateHeader, FLAG_MORE};
use std::time::Instant;

fuzz_target!(|data: &[u8]| {
    let now = Instant::now();
    // Either mode: paced by credit, or broadcast (it waits for a keyframe, restarts its zstd
    // stream at each).
    let broadcast = data.first().is_some_and(|b| b & 1 == 1);
    let mut inv = ImageInverse::new(1 << 20, broadcast).expect("inverse builds");
    let mut out = Output::new();
    if inv
        .handle_frame(now, Frame::new(Meta::default(), data), &mut out)
        .is_ok()
    {
        for f in out.take_frames() {
            Update::parse(f.payload()).expect("the inverse emits valid display records");
        }
    }
    // Small screens only: the forward half keeps a copy of the whole screen.
    let Ok(u) = Update::parse(data) else { return };
    if u32::from(u.header.width) * u32::from(u.header.height) > 1 << 16 {
        return;
    }
    let cfg = ImageConfig {
        quality: Quality::Lossless,
        keyframe_ms: if broadcast { 1000 } else { 0 },
        ..ImageConfig::default()
    };
    let mut fwd = ImageForward::new(cfg).expect("forward builds");
    let mut inv = ImageInverse::new(1 << 20, broadcast).expect("inverse builds");
    let mut out = Output::new();
    fwd.handle_frame(now, Frame::new(Meta::default(), data), &mut out)
        .expect("a valid update encodes");
    if u.header.more() {
        // Part of a capture: it is coded once the capture's last part comes (an update of
        // the same screen with nothing more to add).
        let last = Update {
            header: UpdateHeader {
                flags: u.header.flags & !FLAG_MORE,
                ..u.header
            },
            rects: Vec::new(),
        }
        .emit()
        .expect("an empty update emits");
        fwd.handle_frame(now, Frame::new(Meta::default(), &last), &mut out)
            .expect("the capture's last part encodes");
    }
    let (w, h) = (u.header.width, u.header.height);
    let (mut want, mut got) = (
        Framebuffer::new(w, h, PixelFormat::Bgrx32),
        Framebuffer::new(w, h, PixelFormat::Bgrx32),
    );
    want.apply(&u).expect("applies");
    for f in out.take_frames() {
        let mut o = Output::new();
        inv.handle_frame(now, f, &mut o)
            .expect("our own frame decodes");
        for d in o.take_frames() {
            got.apply(&Update::parse(d.payload()).expect("parses"))
                .expect("applies");
        }
    }
    let bgr = |fb: &Framebuffer| -> Vec<u8> {
        fb.pixels()
            .chunks_exact(4)
            .flat_map(|p| [p[0], p[1], p[2]])
            .collect()
    };
    // Only what the update covered is compared: the rest is the viewer's initial black in
    // both, except that the forward half also starts from black, so they agree there too.
    assert_eq!(bgr(&want), bgr(&got), "lossless round trip differs");
});

//! The dissertation's Figure 6.14 experiment, in virtual time: frames every 16 ms over a
//! TCP-like link with 5–200 ms of uniform jitter; the spacing the sink endpoint sees is
//! compared with the spacing at creation. `bundle` recreates the original spacing; a bare
//! stack passes the network's jitter on to the application.
//!
//! Run with `--nocapture` to see the table.

use ndd_core::Pair;
use ndd_modules::bundle::BundleConfig;
use ndd_modules::ModuleConfig;
use ndd_testkit::{spacing_error, LinkConfig, Pipeline, SpacingError};
use std::time::Duration;

const FRAMES: u64 = 1000;
const PERIOD_MS: u64 = 16;

fn measure(stack: &[ModuleConfig], jitter_ms: u64, seed: u64) -> SpacingError {
    let refs: Vec<&dyn Pair> = stack.iter().map(|m| m as &dyn Pair).collect();
    let link = LinkConfig::tcp(Duration::from_millis(10), Duration::from_millis(jitter_ms));
    let mut p = Pipeline::new(&refs, link, seed).unwrap();
    for i in 0..FRAMES {
        p.send_at(Duration::from_millis(PERIOD_MS * i), vec![i as u8; 16]);
    }
    p.finish().unwrap();
    assert_eq!(p.deliveries().len() as u64, FRAMES);
    spacing_error(p.deliveries())
}

#[test]
fn bundle_recreates_16ms_spacing_under_5_to_200ms_jitter() {
    // As in the dissertation: 10 frames per bundle.
    let bundle = [ModuleConfig::Bundle(BundleConfig {
        count: 10,
        max_delay_ms: 500,
        ..BundleConfig::default()
    })];
    println!("jitter_ms | bare mean±sd (max) ms | bundle mean±sd (max) ms | dissertation bare / bundle (Fig 6.14)");
    let paper = [
        (5, "3.6 / <1"),
        (10, "- / <1"),
        (25, "- / <1"),
        (50, "12.3 sd / <1"),
        (100, "25.6 / ~1"),
        (200, "- / >1"),
    ];
    for (jitter, paper) in paper {
        let bare = measure(&[], jitter, jitter);
        let bun = measure(&bundle, jitter, jitter);
        println!(
            "{jitter:>9} | {:>6.2} ± {:>6.2} ({:>6.1}) | {:>6.3} ± {:>6.3} ({:>6.1}) | {paper}",
            bare.mean_ms, bare.sd_ms, bare.max_ms, bun.mean_ms, bun.sd_ms, bun.max_ms
        );
        // The bare stack passes jitter through: mean error grows with the jitter.
        assert!(
            bare.mean_ms > jitter as f64 / 12.0,
            "bare at {jitter} ms: {bare:?}"
        );
        // Bundle keeps the spacing: under a millisecond on average at every jitter, and
        // far better than the bare stack.
        assert!(bun.mean_ms < 1.0, "bundle at {jitter} ms: {bun:?}");
        assert!(
            bun.mean_ms * 5.0 < bare.mean_ms,
            "bundle vs bare at {jitter} ms"
        );
    }
}

#[test]
fn playout_delay_removes_even_the_first_late_bundles() {
    let stack = [ModuleConfig::Bundle(BundleConfig {
        count: 10,
        max_delay_ms: 500,
        playout_ms: 60,
        ..BundleConfig::default()
    })];
    let e = measure(&stack, 50, 3);
    assert!(
        e.max_ms < 1e-6,
        "with playout above the jitter, no frame is ever off schedule: {e:?}"
    );
}

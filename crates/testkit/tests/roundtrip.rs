//! Round trips of real pairs over the simulated link: what the source endpoint produced is
//! what the sink endpoint gets, bytes and meta, whatever the stack order.

use ndd_core::Pair;
use ndd_modules::bundle::BundleConfig;
use ndd_modules::checksum::ChecksumConfig;
use ndd_modules::ModuleConfig;
use ndd_testkit::{LinkConfig, Pipeline, SimRng};
use std::collections::HashSet;
use std::time::Duration;

fn payloads(seed: u64, n: usize) -> Vec<Vec<u8>> {
    let mut rng = SimRng::new(seed);
    (0..n)
        .map(|_| {
            let mut v = vec![0; rng.range(0, 700) as usize];
            rng.fill(&mut v);
            v
        })
        .collect()
}

fn run(stack: &[ModuleConfig], link: LinkConfig, seed: u64, n: usize) -> (Pipeline, Vec<Vec<u8>>) {
    let refs: Vec<&dyn Pair> = stack.iter().map(|m| m as &dyn Pair).collect();
    let mut p = Pipeline::new(&refs, link, seed).expect("stack builds");
    let data = payloads(seed, n);
    for (i, d) in data.iter().enumerate() {
        p.send_at(Duration::from_millis(16 * i as u64), d.clone());
    }
    p.finish().expect("no module error");
    (p, data)
}

fn checksum() -> ModuleConfig {
    ModuleConfig::Checksum(ChecksumConfig {})
}

fn bundle(count: u32) -> ModuleConfig {
    ModuleConfig::Bundle(BundleConfig {
        count,
        max_delay_ms: 200,
        ..BundleConfig::default()
    })
}

#[test]
fn checksum_and_bundle_in_both_orders_deliver_every_frame_intact() {
    for (name, stack) in [
        ("checksum over bundle", vec![checksum(), bundle(7)]),
        ("bundle over checksum", vec![bundle(7), checksum()]),
        ("bundle alone", vec![bundle(3)]),
        ("checksum alone", vec![checksum()]),
        (
            "bundle twice around checksum",
            vec![bundle(2), checksum(), bundle(5)],
        ),
    ] {
        for seed in 1..=3 {
            let link = LinkConfig::tcp(Duration::from_millis(20), Duration::from_millis(40));
            let (p, data) = run(&stack, link, seed, 300);
            let got = p.deliveries();
            assert_eq!(got.len(), data.len(), "{name} seed {seed}: count");
            for (i, (d, want)) in got.iter().zip(&data).enumerate() {
                assert_eq!(d.meta.seq, i as u64, "{name} seed {seed}: order");
                assert_eq!(
                    &d.payload[..],
                    &want[..],
                    "{name} seed {seed}: frame {i} bytes"
                );
            }
        }
    }
}

#[test]
fn meta_survives_the_stack() {
    let link = LinkConfig::tcp(Duration::from_millis(5), Duration::from_millis(5));
    let (p, _) = run(&[checksum(), bundle(4)], link, 9, 50);
    for (d, (seq, created)) in p.deliveries().iter().zip(p.created()) {
        assert_eq!(d.meta.seq, *seq);
        assert_eq!(
            d.meta.timestamp_ns,
            ndd_testkit::EPOCH_NS + created.as_nanos() as u64
        );
        assert_eq!(d.meta.stream, 1);
    }
}

#[test]
fn checksum_below_bundle_drops_corrupted_bundles_and_delivers_the_rest_intact() {
    let link = LinkConfig {
        corrupt: 0.2,
        ..LinkConfig::tcp(Duration::from_millis(10), Duration::from_millis(10))
    };
    let (p, data) = run(&[bundle(5), checksum()], link, 4, 500);
    let corrupted = p.data_link().corrupted;
    assert!(corrupted > 0, "the link corrupted something");
    let st = p.sink_stats();
    assert_eq!(
        st[1].half.drops, corrupted,
        "every corrupted wire frame was caught"
    );
    assert_eq!(p.deliveries().len() as u64, 500 - 5 * corrupted);
    for d in p.deliveries() {
        assert_eq!(
            &d.payload[..],
            &data[d.meta.seq as usize][..],
            "frame {} intact",
            d.meta.seq
        );
    }
}

#[test]
fn lossy_reordering_link_delivers_only_intact_frames_at_most_once() {
    for stack in [vec![checksum()], vec![bundle(4), checksum()]] {
        let link = LinkConfig {
            duplicate: 0.0,
            ..LinkConfig::datagram(Duration::from_millis(10), Duration::from_millis(60), 0.1)
        };
        let (p, data) = run(&stack, link, 11, 400);
        let got = p.deliveries();
        assert!(
            got.len() < 400 && got.len() > 250,
            "some lost, most delivered: {}",
            got.len()
        );
        let mut seen = HashSet::new();
        for d in got {
            assert!(
                seen.insert(d.meta.seq),
                "seq {} delivered twice",
                d.meta.seq
            );
            assert_eq!(&d.payload[..], &data[d.meta.seq as usize][..]);
        }
    }
}

#[test]
fn same_seed_same_run() {
    let link = LinkConfig::tcp(Duration::from_millis(10), Duration::from_millis(50));
    let (a, _) = run(&[bundle(10)], link.clone(), 77, 200);
    let (b, _) = run(&[bundle(10)], link, 77, 200);
    let times = |p: &Pipeline| {
        p.deliveries()
            .iter()
            .map(|d| d.released)
            .collect::<Vec<_>>()
    };
    assert_eq!(times(&a), times(&b));
}

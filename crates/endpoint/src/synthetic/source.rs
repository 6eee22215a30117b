//! The `synthetic` and `spacenav-sim` sources: timer-driven tasks ([`run_paced`]) that build
//! each frame from its sequence number alone.

use super::config::{SpacenavSimConfig, SyntheticConfig};
use super::record;
use super::spacenav::Motion;
use crate::common::clock::pacing;
use crate::common::emitter::Emitter;
use crate::common::error::EndpointError;
use crate::common::report::{SourceReport, SourceTask};
use bytes::Bytes;
use ndd_core::frame::DEFAULT_HEADROOM;
use ndd_core::{Frame, Meta};
use std::time::Duration;
use tokio::runtime::Handle;
use tokio::sync::mpsc::Sender;
use tokio::time::MissedTickBehavior;

/// Starts a `synthetic` source: `size` seeded bytes every `interval_ms`.
pub(crate) fn spawn_synthetic_source(
    rt: &Handle,
    endpoint: &'static str,
    c: &SyntheticConfig,
    stream: u16,
    tx: Sender<Frame>,
) -> Result<SourceTask, EndpointError> {
    let (seed, size) = (c.seed, c.size);
    let period = pacing(c.interval_ms / 1000.0);
    if c.repeat {
        // Made once; every frame shares it (the links write a DATA header and a shared
        // payload without copying it; a pair that rewrites the payload copies it once).
        let once = Bytes::from(record::payload(seed, 0, size));
        return Ok(
            rt.spawn(run_paced(endpoint, period, c.count, stream, tx, move |m| {
                Frame::from_bytes(m, once.clone())
            })),
        );
    }
    Ok(
        rt.spawn(run_paced(endpoint, period, c.count, stream, tx, move |m| {
            let mut f = Frame::zeroed(m, DEFAULT_HEADROOM, size);
            record::fill(seed, m.seq, f.payload_mut());
            f
        })),
    )
}

/// Starts a `spacenav-sim` source: one 3D-mouse record every `1 / rate_hz` seconds.
pub(crate) fn spawn_spacenav_sim_source(
    rt: &Handle,
    endpoint: &'static str,
    c: &SpacenavSimConfig,
    stream: u16,
    tx: Sender<Frame>,
) -> Result<SourceTask, EndpointError> {
    let motion = Motion::new(c.seed, c.rate_hz);
    let period = pacing(1.0 / c.rate_hz);
    Ok(
        rt.spawn(run_paced(endpoint, period, c.count, stream, tx, move |m| {
            Frame::new(m, &motion.record(m.seq).encode())
        })),
    )
}

/// A timer-driven source: `make` builds frame `meta.seq`; the first frame goes at once, the
/// next ones every `period` (late ticks are caught up in a burst), or back to back when
/// `period` is `None`.
pub(crate) async fn run_paced(
    endpoint: &'static str,
    period: Option<Duration>,
    count: Option<u64>,
    stream: u16,
    tx: Sender<Frame>,
    mut make: impl FnMut(Meta) -> Frame + Send + 'static,
) -> Result<SourceReport, EndpointError> {
    let mut out = Emitter::new(stream, tx);
    let mut ticker = period.map(|p| {
        let mut t = tokio::time::interval(p);
        t.set_missed_tick_behavior(MissedTickBehavior::Burst);
        t
    });
    while count.is_none_or(|n| out.report.frames < n) {
        if let Some(t) = ticker.as_mut() {
            tokio::select! {
                _ = t.tick() => {}
                _ = out.tx.closed() => break,
            }
        }
        let frame = make(out.next_meta());
        if !out.send(frame).await {
            break;
        }
    }
    tracing::debug!(
        endpoint,
        stream,
        frames = out.report.frames,
        bytes = out.report.bytes,
        "source ended"
    );
    Ok(out.report)
}

//! The `check` sink (a [`Checker`] over every frame) and the `null` sink (counts and discards).
//! Both mark every frame in their [`Delivered`] once checked or counted.

use super::checker::Checker;
use super::config::CheckConfig;
use crate::common::delivered::Delivered;
use crate::common::error::EndpointError;
use crate::common::report::{SinkReport, SinkTask};
use ndd_core::Frame;
use tokio::runtime::Handle;
use tokio::sync::mpsc::Receiver;

/// Starts a `check` sink.
pub(crate) fn spawn_check_sink(
    rt: &Handle,
    endpoint: &'static str,
    c: &CheckConfig,
    rx: Receiver<Frame>,
    delivered: Delivered,
) -> Result<SinkTask, EndpointError> {
    let checker = Checker::new(c.seed, c.size, c.expect);
    Ok(rt.spawn(run_check(endpoint, checker, rx, delivered)))
}

/// Starts a `null` sink.
pub(crate) fn spawn_null_sink(
    rt: &Handle,
    endpoint: &'static str,
    rx: Receiver<Frame>,
    delivered: Delivered,
) -> Result<SinkTask, EndpointError> {
    Ok(rt.spawn(run_null(endpoint, rx, delivered)))
}

async fn run_check(
    endpoint: &'static str,
    mut checker: Checker,
    mut rx: Receiver<Frame>,
    delivered: Delivered,
) -> Result<SinkReport, EndpointError> {
    let mut report = SinkReport::default();
    while let Some(frame) = rx.recv().await {
        report.frames += 1;
        report.bytes += frame.len() as u64;
        let seen = checker.observe(frame.meta.seq, frame.payload());
        tracing::trace!(seq = frame.meta.seq, ?seen, "checked");
        delivered.mark(frame.meta.seq);
    }
    let check = checker.report();
    tracing::debug!(endpoint, ok = check.is_ok(), %check, "sink ended");
    report.check = Some(check);
    Ok(report)
}

async fn run_null(
    endpoint: &'static str,
    mut rx: Receiver<Frame>,
    delivered: Delivered,
) -> Result<SinkReport, EndpointError> {
    let mut report = SinkReport::default();
    while let Some(frame) = rx.recv().await {
        report.frames += 1;
        report.bytes += frame.len() as u64;
        delivered.mark(frame.meta.seq);
    }
    tracing::debug!(
        endpoint,
        frames = report.frames,
        bytes = report.bytes,
        "sink ended"
    );
    Ok(report)
}

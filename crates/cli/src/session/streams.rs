//! A side's streams at its endpoints: the session's plan of each, the endpoint task it
//! feeds or is fed by, the frames a sink has not taken yet, and the stream's stats.

use super::wall_ns;
use crate::config::{Config, SideName};
use crate::stats::StreamStats;
use anyhow::{Context, Result};
use ndd_core::session::{Session, StreamPlan};
use ndd_core::{Frame, Meta, Pair, Role};
use ndd_endpoint::delivered::INJECTED_SEQ;
use ndd_endpoint::display::LinkState;
use ndd_endpoint::{Delivered, Demand, SinkReport, SourceReport};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// One stream's endpoint end on this side: its task, the channel to or from it, and its stats.
pub(super) struct StreamIo {
    pub(super) stats: StreamStats,
    /// Source: frames from the endpoint (`None` once it ended).
    pub(super) source: Option<mpsc::Receiver<Frame>>,
    pub(super) source_task: Option<SourceTask>,
    /// Sink: frames for the endpoint (`None` once the stream ended and all were handed on).
    pub(super) sink: Option<mpsc::Sender<Frame>>,
    /// Sink: frames the endpoint's channel had no room for yet. The driver never waits on one
    /// sink: a sink that does not drain holds back its own stream alone (reliable: the peer's
    /// resume buffer fills, unconfirmed, and its source stops; lossy: the oldest are dropped
    /// beyond [`LOSSY_BEHIND`]), while the link, the other streams, pings and ACKs go on.
    pub(super) pending: std::collections::VecDeque<Frame>,
    /// Sink: the stream ended; the sender goes once `pending` is empty.
    pub(super) sink_ended: bool,
    pub(super) sink_task: Option<SinkTask>,
    /// Sink: what the endpoint has completed.
    pub(super) completed: Option<Delivered>,
    /// Sink of an input device: the record that releases every held key and button.
    pub(super) release: Option<Vec<u8>>,
    /// Sink that shows the link's state (a viewer window).
    pub(super) shows_link: bool,
    /// Source that captures on demand: when the session wants its next frame.
    pub(super) demand: Option<Demand>,
    /// Sink that took nothing as the side ended: left behind.
    pub(super) stuck: bool,
}

type SourceTask = JoinHandle<std::result::Result<SourceReport, ndd_endpoint::EndpointError>>;

/// How long a source whose channel closed has to say why (its task returns right after).
const SOURCE_SAYS: Duration = Duration::from_secs(1);

/// A source's frames stopped: why, in its own words, if it failed (its task's error: a
/// compositor or X server gone, a device unplugged), else `None` (it ended: a count reached,
/// a file read to its end, the side stopping it). A source that has not returned within
/// [`SOURCE_SAYS`] is stopped. Without this a failing source ended its stream as if it were
/// done and the side said nothing (found by hand: sway killed under a running device side).
pub(crate) async fn source_failure(
    task: &mut SourceTask,
    stream: &str,
    source: &str,
) -> Option<anyhow::Error> {
    match tokio::time::timeout(SOURCE_SAYS, &mut *task).await {
        Ok(Ok(Ok(_))) => None,
        Ok(Ok(Err(e))) => Some(
            anyhow::Error::new(e).context(format!("stream \"{stream}\": source {source} failed")),
        ),
        Ok(Err(e)) if e.is_panic() => Some(anyhow::anyhow!(
            "stream \"{stream}\": source {source} failed: its task panicked: {e}"
        )),
        Ok(Err(_)) => None,
        Err(_) => {
            task.abort();
            None
        }
    }
}
type SinkTask = JoinHandle<std::result::Result<SinkReport, ndd_endpoint::EndpointError>>;

fn role_name(role: Role) -> &'static str {
    match role {
        Role::Source => "source",
        Role::Sink => "sink",
    }
}

/// Starts this side's endpoints of every stream of `cfg`: the session's plans and the
/// endpoints' ends, in the config's order.
pub(super) fn start(cfg: &Config, side: SideName) -> Result<(Vec<StreamPlan>, Vec<StreamIo>)> {
    let mut plans = Vec::with_capacity(cfg.streams.len());
    let mut io: Vec<StreamIo> = Vec::with_capacity(cfg.streams.len());
    for (i, s) in cfg.streams.iter().enumerate() {
        let id = Config::stream_id(i);
        let role = if s.direction.source_side() == side {
            Role::Source
        } else {
            Role::Sink
        };
        let release = match role {
            Role::Sink => s.sink.release_record(),
            Role::Source => None,
        };
        plans.push(StreamPlan {
            id,
            name: s.name().to_string(),
            role,
            reliable: s.reliability == crate::config::Reliability::Reliable,
            release_on_loss: release.is_some(),
            replay_outage: role == Role::Sink || s.source.replays_outage(),
            // A source that captures on demand sends a keyframe to a restarted peer.
            keeps_frames: role == Role::Sink || !s.source.captures_on_demand(),
            priority: s.priority(),
            pairs: s
                .pairs()
                .into_iter()
                .map(|m| Arc::new(m.clone()) as Arc<dyn Pair + Send + Sync>)
                .collect(),
        });
        let mut e = StreamIo {
            stats: StreamStats::new(s.name(), role_name(role), s.direction.wire().to_string()),
            source: None,
            source_task: None,
            sink: None,
            pending: Default::default(),
            sink_ended: false,
            sink_task: None,
            completed: None,
            release,
            shows_link: role == Role::Sink && s.sink.shows_link_state(),
            demand: None,
            stuck: false,
        };
        let (tx, rx) = mpsc::channel::<Frame>(64);
        match role {
            Role::Source => {
                e.demand = s.source.captures_on_demand().then(Demand::new);
                let demand = e.demand.clone();
                e.source_task =
                    Some(s.source.spawn_on_demand(id, tx, demand).with_context(|| {
                        format!(
                            "stream \"{}\": cannot start source {}",
                            s.name(),
                            s.source.describe()
                        )
                    })?);
                e.source = Some(rx);
            }
            Role::Sink => {
                let done = Delivered::default();
                e.sink_task = Some(s.sink.spawn_tracked(rx, done.clone()).with_context(|| {
                    format!(
                        "stream \"{}\": cannot start sink {}",
                        s.name(),
                        s.sink.describe()
                    )
                })?);
                e.sink = Some(tx);
                e.completed = Some(done);
            }
        }
        io.push(e);
    }
    Ok((plans, io))
}

/// Most frames of a lossy stream kept for a sink endpoint that is not taking them (beyond its
/// channel's 64): the oldest go first.
pub(super) const LOSSY_BEHIND: usize = 8;
/// How soon a sink whose channel was full is looked at again.
pub(super) const SINK_RETRY: Duration = Duration::from_millis(2);

/// Hands stream `e`'s pending frames to its sink endpoint as far as its channel has room, and
/// lets the channel go once the stream ended and all were handed on. `false`: the endpoint
/// is gone.
pub(super) fn hand_on(e: &mut StreamIo) -> bool {
    let Some(tx) = &e.sink else {
        e.pending.clear();
        return true;
    };
    while let Some(f) = e.pending.pop_front() {
        match tx.try_send(f) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(f)) => {
                e.pending.push_front(f);
                return true;
            }
            Err(mpsc::error::TrySendError::Closed(_)) => return false,
        }
    }
    if e.sink_ended {
        e.sink = None;
    }
    true
}

/// Copies the session's counters of stream `i` into its stats.
pub(super) fn refresh(s: &mut StreamStats, sess: &Session, i: usize) {
    let c = sess.counters(i);
    s.layers = sess.layer_stats(i);
    s.wire_frames = c.wire_frames;
    s.wire_bytes = c.wire_bytes;
    s.retransmits = c.retransmits;
    s.duplicates = c.duplicates;
    s.overflow = c.overflow;
    s.stale = c.stale;
}

/// Tells the sinks that show the link's state (viewer windows) what it is now.
/// (Queued behind the frames they wait for, as every frame for a sink is.)
pub(super) fn show_link(io: &mut [StreamIo], state: LinkState) {
    for e in io.iter_mut().filter(|e| e.shows_link) {
        if e.sink.is_some() {
            let meta = Meta {
                stream: 0,
                seq: INJECTED_SEQ,
                timestamp_ns: wall_ns(),
                flags: 0,
            };
            e.pending.push_back(Frame::new(meta, &state.payload()));
        }
    }
}

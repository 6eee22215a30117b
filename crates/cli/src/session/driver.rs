//! The driver of one side's [`Session`] once its first link is up: it waits for whichever
//! comes first (the user's stop, the write in flight, a message from the link, a reconnect,
//! another peer at the listener, a source's frame, the next deadline), hands it to the
//! session through one handler per kind, then carries out what the session asks
//! ([`Driver::drain_events`]) and starts the next write. The protocol itself lives in the
//! session.

use super::link::{Inbound, Link, Written};
use super::streams::{hand_on, refresh, show_link, StreamIo, SINK_RETRY};
use super::{
    drop_counts, lock_metrics, note, sleep_until_opt, wall_ns, AbortOnDrop, Metrics, PeerMetrics,
    RunReport, SideFailed,
};
use crate::config::{Config, SideName};
use crate::stats::StreamSummary;
use anyhow::{anyhow, Result};
use ndd_core::session::{Event, Session};
use ndd_core::{Frame, Meta};
use ndd_endpoint::delivered::INJECTED_SEQ;
use ndd_endpoint::display::LinkState;
use ndd_link::udp::LinkDrops;
use ndd_link::{Connector, EstablishError, Established, HandshakeCtx};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};
use tokio::sync::watch;

type Reconnect<'a> = Pin<Box<dyn Future<Output = Result<Established, EstablishError>> + Send + 'a>>;
type Busy<'a> = Pin<Box<dyn Future<Output = EstablishError> + Send + 'a>>;

/// How long the wind-down waits for a sink that takes nothing (a frame, or its end).
const SINK_STUCK: Duration = Duration::from_secs(5);

/// How often a side with a link up checks that its peer is still in `known_peers`.
const TRUST_CHECK: Duration = Duration::from_secs(2);

/// What the driver is given from the side's set-up and does not own.
pub(super) struct Wiring<'a> {
    pub(super) cfg: &'a Config,
    pub(super) side: SideName,
    /// No informational lines (benchmarks).
    pub(super) quiet: bool,
    /// Identity and known_peers directory.
    pub(super) home: &'a std::path::Path,
    /// `--stats`: the live board's interval.
    pub(super) live_stats: Option<Duration>,
    /// The live board's panel and the plain lines' tag: the side's name, or on a listener
    /// serving several peers `side@peer` (each peer its own panel).
    pub(super) panel: String,
    pub(super) ctx: &'a HandshakeCtx,
    pub(super) connector: &'a Connector,
    /// `--metrics`: the snapshot it serves and its server's task.
    pub(super) metrics: Option<(Metrics, AbortOnDrop)>,
    /// `--metrics` on a side serving several peers: where this peer's snapshot goes, and its
    /// name.
    pub(super) peer_metrics: Option<(PeerMetrics, String)>,
    /// What `ndd status` reads.
    pub(super) status: Option<crate::status::Served>,
    /// `--duration`: when the side closes.
    pub(super) deadline: Option<Instant>,
    /// A listener serving several peers (`link.peers`): this peer's links, reconnects too,
    /// come from the side's dispatcher, which turns the others away; and whether this
    /// driver's link is up, for it to read.
    pub(super) inbox: Option<(Inbox, Arc<std::sync::atomic::AtomicBool>)>,
}

/// Where a driver of a listener serving several peers gets its links.
pub(super) type Inbox = Arc<tokio::sync::Mutex<tokio::sync::mpsc::Receiver<Established>>>;

/// One side's session, its link and its streams' endpoints, between the first link and the end.
pub(super) struct Driver<'a> {
    w: Wiring<'a>,
    side: SideName,
    quiet: bool,
    sess: Session,
    io: Vec<StreamIo>,
    link: Option<Link>,
    /// The connect or accept that replaces a lost link.
    reconnect: Option<Reconnect<'a>>,
    /// While a link is up, a listener tells any other peer that connects that it is busy.
    busy: Option<Busy<'a>>,
    /// Every UDP connection's drop counters (read live and at the end).
    udp_drops: Vec<Arc<LinkDrops>>,
    peer: String,
    /// Checked against known_peers while the link is up: `ndd untrust` ends a live link.
    peer_fp: Option<String>,
    /// A peer on this host stamps its frames with this host's clock: its timestamps are ours
    /// as they are. The PING/PONG estimate of the offset is right only to within half a round
    /// trip (on loopback ±20 µs, as large as the one-way time itself there).
    same_clock: bool,
    next_trust_check: Instant,
    /// Live lines and the metrics snapshot are refreshed on the same tick.
    tick: Option<Duration>,
    next_stats: Option<Instant>,
    /// The source looked at first next time (round robin).
    cursor: usize,
    /// Which sources the session takes frames from now (backpressure).
    ready: Vec<bool>,
    stopping: bool,
    link_state: &'static str,
}

impl<'a> Driver<'a> {
    pub(super) fn new(
        w: Wiring<'a>,
        mut sess: Session,
        io: Vec<StreamIo>,
        first: Established,
    ) -> Driver<'a> {
        let tick = w.live_stats.or((w.metrics.is_some()
            || w.peer_metrics.is_some()
            || w.status.is_some())
        .then_some(Duration::from_secs(1)));
        let peer = first.peer.clone();
        let busy: Option<Busy<'a>> = w
            .inbox
            .is_none()
            .then(|| Box::pin(w.connector.refuse_while_busy(w.ctx, peer.clone())) as Busy<'a>);
        Driver {
            side: w.side,
            quiet: w.quiet,
            peer_fp: first.fingerprint.clone(),
            same_clock: first.addr.ip().is_loopback(),
            udp_drops: first.rx.drops().into_iter().collect(),
            link: Some(Link::new(first, &mut sess, w.cfg.link.chunk_bytes as usize)),
            reconnect: None,
            busy,
            next_trust_check: Instant::now() + TRUST_CHECK,
            next_stats: tick.map(|d| Instant::now() + d),
            tick,
            cursor: 0,
            ready: Vec::with_capacity(io.len()),
            stopping: false,
            link_state: "up",
            peer,
            sess,
            io,
            w,
        }
    }

    /// Runs until the session closes or fails.
    pub(super) async fn run(&mut self, stop: &mut watch::Receiver<bool>) -> Result<()> {
        loop {
            if let Err(gone) = self.drain_events() {
                return Err(self.sink_gone(gone).await);
            }
            if self.sess.state() == ndd_core::State::Closed {
                return Ok(());
            }
            self.before_wait();
            let wake = self.next_wake();
            let n = self.io.len();
            let (io, ready, cursor) = (&mut self.io, &self.ready, self.cursor);
            let source_next = std::future::poll_fn(|cx| {
                for k in 0..n {
                    let i = (cursor + k) % n;
                    if let Some(rx) = io[i].source.as_mut().filter(|_| ready[i]) {
                        if let Poll::Ready(f) = rx.poll_recv(cx) {
                            return Poll::Ready((i, f));
                        }
                    }
                }
                Poll::Pending
            });
            let (inbound_rx, in_flight) = match self.link.as_mut() {
                Some(l) => (Some(&mut l.inbound), l.writing.as_mut()),
                None => (None, None),
            };
            let writing = async {
                match in_flight {
                    Some(w) => w.await,
                    None => std::future::pending().await,
                }
            };
            let inbound = async {
                match inbound_rx {
                    Some(rx) => rx.recv().await,
                    None => std::future::pending().await,
                }
            };
            let reconnected = async {
                match self.reconnect.as_mut() {
                    Some(r) => r.await,
                    None => std::future::pending().await,
                }
            };
            let refusing = async {
                match self.busy.as_mut() {
                    Some(b) => b.await,
                    None => std::future::pending().await,
                }
            };
            let stopping = self.stopping;
            tokio::select! {
                biased;
                _ = stop.changed(), if !stopping => {
                    self.stopping = true;
                    self.sess.close(Instant::now())?;
                }
                written = writing => self.on_written(written)?,
                m = inbound => self.on_inbound(m)?,
                est = reconnected => self.on_reconnected(est)?,
                e = refusing => {
                    self.busy = None;
                    return Err(anyhow!(e).context("the listener failed"));
                }
                (i, f) = source_next => self.on_source(i, f).await?,
                _ = sleep_until_opt(wake) => self.on_timer().await?,
            }
        }
    }

    /// Carries out what the session has for the endpoints and the user, and hands each sink
    /// what its channel has room for (never waiting on one).
    /// `Err(i)`: stream `i`'s sink endpoint is gone (its task ended).
    fn drain_events(&mut self) -> std::result::Result<(), usize> {
        while let Some(ev) = self.sess.poll_event() {
            self.on_event(ev);
        }
        for (i, e) in self.io.iter_mut().enumerate() {
            if !hand_on(e) {
                return Err(i);
            }
        }
        Ok(())
    }

    /// Stream `i`'s sink endpoint took no more frames: why, in its own words (its task's
    /// error), not just that it stopped.
    async fn sink_gone(&mut self, i: usize) -> anyhow::Error {
        let name = &self.sess.plan(i).name;
        let said = match self.io[i].sink_task.take() {
            Some(h) => tokio::time::timeout(Duration::from_secs(1), h).await.ok(),
            None => None,
        };
        match said {
            Some(Ok(Err(e))) => anyhow!(e).context(format!("stream \"{name}\": sink failed")),
            Some(Err(e)) => anyhow!("stream \"{name}\": sink task failed: {e}"),
            Some(Ok(Ok(_))) | None => {
                anyhow!("stream \"{name}\": the sink endpoint stopped accepting frames")
            }
        }
    }

    fn on_event(&mut self, ev: Event) {
        let (quiet, side) = (self.quiet, self.side);
        match ev {
            Event::Deliver { stream, frame } => self.deliver(stream, frame),
            Event::ReleaseInputs { stream } => {
                let e = &mut self.io[stream];
                if let (Some(_), Some(rec)) = (&e.sink, &e.release) {
                    let meta = Meta {
                        stream: self.sess.plan(stream).id,
                        seq: INJECTED_SEQ,
                        timestamp_ns: wall_ns(),
                        flags: 0,
                    };
                    e.pending.push_back(Frame::new(meta, rec));
                }
            }
            Event::StreamEnded { stream } => self.io[stream].sink_ended = true,
            Event::LinkLost { reason } => {
                note!(quiet, side, "link lost: {reason}; reconnecting");
                self.said_error(format!("link lost: {reason}"));
                self.link_down(LinkState::Down, "down, reconnecting");
            }
            Event::PeerStopped { reason } => {
                self.said_error(reason.clone());
                note!(
                    quiet,
                    side,
                    "{reason}; this side keeps its endpoints and waits for it to come back"
                );
                self.link_down(
                    LinkState::PeerStopped,
                    "down: the peer stopped; waiting for it",
                );
            }
            Event::Resumed { after, resending } => {
                note!(
                    quiet,
                    side,
                    "link restored after {:.0} ms; resending {resending} unacknowledged frame(s)",
                    after.as_secs_f64() * 1e3
                );
                show_link(&mut self.io, LinkState::Up);
            }
            Event::PeerRestarted { resending } => {
                note!(
                    quiet,
                    side,
                    "the peer restarted; its streams start again ({resending} frame(s) it had not completed are sent again)"
                );
                show_link(&mut self.io, LinkState::Up);
                // A restarted viewer has none of the screen: send all of it.
                for d in self.io.iter().filter_map(|e| e.demand.as_ref()) {
                    d.request_keyframe();
                }
            }
            Event::Warning(w) => tracing::warn!(side = %side, "{w}"),
            Event::Closed(how) => tracing::debug!(side = %side, ?how, "session closed"),
        }
    }

    /// A frame for stream `stream`'s sink: counted, and queued for its endpoint (a lossy
    /// stream keeps only the newest few for a sink that is not taking them).
    fn deliver(&mut self, stream: usize, frame: Frame) {
        let ts = frame.meta.timestamp_ns;
        let created = if self.same_clock {
            ts
        } else {
            self.sess.peer_to_local(ts)
        };
        let e = &mut self.io[stream];
        e.stats.delivered(frame.len(), created, wall_ns());
        if e.sink.is_some() {
            e.pending.push_back(frame);
            if !self.sess.plan(stream).reliable && e.pending.len() > super::streams::LOSSY_BEHIND {
                e.pending.pop_front();
                e.stats.sink_behind += 1;
            }
        }
    }

    /// The link is gone: tell the viewers, and connect or accept again.
    fn link_down(&mut self, shown: LinkState, state: &'static str) {
        show_link(&mut self.io, shown);
        self.link_state = state;
        self.link = None;
        self.busy = None;
        self.reconnect = Some(match &self.w.inbox {
            Some((inbox, up)) => {
                up.store(false, std::sync::atomic::Ordering::Release);
                let inbox = inbox.clone();
                Box::pin(async move {
                    inbox.lock().await.recv().await.ok_or_else(|| {
                        EstablishError::Local("the listener stopped taking peers".into())
                    })
                })
            }
            None => Box::pin(self.w.connector.establish(self.w.ctx, false)),
        });
    }

    /// Before waiting: what the sinks completed goes to the session, what it has to send
    /// starts going out, and the sources it is ready for are marked.
    fn before_wait(&mut self) {
        for (i, e) in self.io.iter().enumerate() {
            if let Some(c) = &e.completed {
                self.sess.handle_sink_completed(i, c.count());
            }
        }
        if let Some(l) = self.link.as_mut() {
            if l.writing.is_none() {
                l.start_write(&mut self.sess);
            }
        }
        let n = self.io.len();
        self.ready.clear();
        self.ready.extend((0..n).map(|i| self.sess.source_ready(i)));
        for (e, &r) in self.io.iter().zip(&self.ready) {
            if let (Some(d), Some(rx)) = (&e.demand, &e.source) {
                d.set(rx.is_empty() && r);
            }
        }
    }

    /// The earliest of every deadline the driver keeps.
    fn next_wake(&self) -> Option<Instant> {
        let sinks_busy = self.sess.awaiting_completion();
        [
            self.sess.poll_timeout(),
            self.next_stats,
            self.w.deadline.filter(|_| !self.stopping),
            sinks_busy.then(|| Instant::now() + self.sess.ack_every()),
            // A sink whose channel was full: look again soon.
            self.io
                .iter()
                .any(|e| !e.pending.is_empty())
                .then(|| Instant::now() + SINK_RETRY),
            self.peer_fp
                .as_ref()
                .filter(|_| self.link.is_some())
                .map(|_| self.next_trust_check),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// A write finished; a failed one is the link lost (after what the peer said before it
    /// broke, which explains the break).
    fn on_written(&mut self, (tx, spare, r): Written) -> Result<()> {
        let now = Instant::now();
        if let Some(l) = self.link.as_mut() {
            l.done_writing(tx, spare);
        }
        if let Err(e) = r {
            if let Some(l) = self.link.as_mut() {
                while let Ok((at, Ok(Some(m)))) = l.inbound.try_recv() {
                    self.sess.handle_message(now, at, m)?;
                }
            }
            self.sess.handle_link_lost(now, &e.to_string())?;
        }
        Ok(())
    }

    fn on_inbound(&mut self, m: Option<Inbound>) -> Result<()> {
        let now = Instant::now();
        match m {
            Some((at, Ok(Some(m)))) => self.sess.handle_message(now, at, m)?,
            None | Some((_, Ok(None))) => self
                .sess
                .handle_link_lost(now, "the peer disconnected without closing the session")?,
            Some((_, Err(e))) => self.sess.handle_link_lost(now, &e.to_string())?,
        }
        Ok(())
    }

    fn on_reconnected(&mut self, est: Result<Established, EstablishError>) -> Result<()> {
        self.reconnect = None;
        let e = est.map_err(|e| anyhow!(e).context("cannot reconnect"))?;
        note!(self.quiet, self.side, "reconnected to {}", e.peer);
        match &self.w.inbox {
            Some((_, up)) => up.store(true, std::sync::atomic::Ordering::Release),
            None => {
                self.busy = Some(Box::pin(
                    self.w
                        .connector
                        .refuse_while_busy(self.w.ctx, e.peer.clone()),
                ))
            }
        }
        self.peer_fp = e.fingerprint.clone();
        self.same_clock = e.addr.ip().is_loopback();
        self.udp_drops.extend(e.rx.drops());
        let chunk = self.w.cfg.link.chunk_bytes as usize;
        self.link = Some(Link::new(e, &mut self.sess, chunk));
        self.link_state = "up";
        self.sess.handle_link_up(Instant::now(), wall_ns());
        Ok(())
    }

    /// A source's frame, or its end (`None`).
    async fn on_source(&mut self, i: usize, f: Option<Frame>) -> Result<()> {
        self.cursor = (i + 1) % self.io.len();
        let now = Instant::now();
        match f {
            Some(frame) => {
                self.io[i].stats.produced(frame.len());
                self.sess.handle_source_frame(now, i, frame)?;
            }
            None => {
                self.io[i].source = None;
                // A source that failed ends the side with its error (a daemon starts the
                // driver again): the peer hears the stream was aborted, not that it ended.
                if let Some(t) = self.io[i].source_task.as_mut() {
                    let s = &self.w.cfg.streams[i];
                    if let Some(e) =
                        super::streams::source_failure(t, s.name(), &s.source.describe()).await
                    {
                        self.io[i].source_task = None;
                        return Err(e);
                    }
                }
                self.sess.handle_source_end(now, i)?;
            }
        }
        Ok(())
    }

    /// A deadline passed: the session's timers, the trust check, the stats tick, `--duration`.
    async fn on_timer(&mut self) -> Result<()> {
        let now = Instant::now();
        self.sess.handle_timeout(now)?;
        if now >= self.next_trust_check {
            self.next_trust_check = now + TRUST_CHECK;
            self.check_trust().await?;
        }
        if self.next_stats.is_some_and(|t| now >= t) {
            self.show_stats(now);
            self.next_stats = self.tick.map(|d| now + d);
        }
        if !self.stopping && self.w.deadline.is_some_and(|d| now >= d) {
            self.stopping = true;
            self.sess.close(now)?;
        }
        Ok(())
    }

    /// Ends a live link to a peer that is no longer in `known_peers` (`ndd untrust`).
    async fn check_trust(&mut self) -> Result<()> {
        let side = self.side;
        let (Some(fp), true) = (&self.peer_fp, self.link.is_some()) else {
            return Ok(());
        };
        match ndd_link::KnownPeers::load(self.w.home) {
            Ok(k) if k.lookup(fp).is_none() => {
                tracing::warn!(side = %side, "the peer {fp} is no longer trusted (not in known_peers): closing the link; it is refused until trusted again");
                if let Some(l) = self.link.as_mut() {
                    l.say_untrusted().await;
                }
                self.sess
                    .handle_link_lost(Instant::now(), "the peer is no longer trusted")?;
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(side = %side, "cannot read known_peers: {e}"),
        }
        Ok(())
    }

    /// The last loss, for `ndd status`.
    fn said_error(&self, e: String) {
        if let Some(s) = &self.w.status {
            s.update(|st| st.last_error = Some(e));
        }
    }

    /// The live board (`--stats`), the `--metrics` snapshot and what `ndd status` reads.
    fn show_stats(&mut self, now: Instant) {
        let live = self.w.live_stats.is_some();
        // On a terminal a table redrawn in place, every stream every tick; otherwise lines
        // for the streams that moved.
        let table = crate::board::live_table();
        let mut rows = Vec::new();
        for (i, e) in self.io.iter_mut().enumerate() {
            refresh(&mut e.stats, &self.sess, i);
            if live && table {
                rows.push(e.stats.live_row());
            } else if live && e.stats.due(now) {
                rows.push(e.stats.live_line(&self.w.panel));
            }
        }
        if live {
            let rtt = self
                .sess
                .clock()
                .filter(|_| self.link.is_some())
                .map(|c| format!(" · rtt {:.2} ms", c.rtt_ns as f64 / 1e6))
                .unwrap_or_default();
            let dropped = drop_counts(&self.udp_drops)
                .filter(|d| d.total() > 0)
                .map(|d| {
                    format!(
                        " · dropped {} unauthenticated, {} replayed, {} garbage",
                        d.unauthenticated, d.replayed, d.garbage
                    )
                })
                .unwrap_or_default();
            let heading = format!(
                "[{}] link {} · peer {}{rtt} · {} recoveries{dropped}",
                self.w.panel,
                self.link_state,
                self.peer,
                self.sess.recoveries().len()
            );
            crate::board::show(&self.w.panel, crate::board::Panel { heading, rows });
        }
        if let Some(s) = &mut self.w.status {
            let streams: Vec<StreamSummary> = self.io.iter().map(|e| e.stats.summary()).collect();
            s.streams(now, &streams);
            let rtt = self
                .sess
                .clock()
                .filter(|_| self.link.is_some())
                .map(|c| c.rtt_ns as f64 / 1e6);
            let (link, peer, recoveries) = (
                self.link_state.to_string(),
                self.peer.clone(),
                self.sess.recoveries().len(),
            );
            s.update(|st| {
                st.link = link;
                st.peer = Some(peer);
                st.rtt_ms = rtt;
                st.recoveries = recoveries;
            });
        }
        if self.w.metrics.is_none() && self.w.peer_metrics.is_none() {
            return;
        }
        let snap = crate::stats::Snapshot {
            side: self.side.as_str().to_string(),
            peer: self.w.peer_metrics.as_ref().map(|(_, p)| p.clone()),
            link_up: self.link.is_some(),
            recoveries: self.sess.recoveries().len(),
            drops: drop_counts(&self.udp_drops),
            streams: self.io.iter().map(|e| e.stats.summary()).collect(),
        };
        if let Some((m, peer)) = &self.w.peer_metrics {
            lock_metrics(m).insert(peer.clone(), snap);
        } else if let Some((m, _)) = &self.w.metrics {
            *lock_metrics(m) = crate::stats::prometheus_all(vec![snap]);
        }
    }

    /// Winds the side down after `result`: says what is left to say, stops the sources, lets
    /// the sinks finish, and reports (with the error, if any, as [`SideFailed`]).
    pub(super) async fn finish(mut self, result: Result<()>) -> Result<RunReport> {
        self.reconnect = None;
        self.busy = None;
        crate::board::leave(&self.w.panel);
        if let Err(e) = &result {
            self.sess.abort(&crate::logfmt::error_text(e));
        }
        if let Some(l) = self.link.take() {
            l.goodbye(&mut self.sess).await;
        }
        let side = self.side;
        for (i, e) in self.io.iter_mut().enumerate() {
            // What the sinks were still to get goes to them now (waiting for them here, as the
            // side ends, is what a sink that finishes its work needs), as long as they take it:
            // a sink that takes nothing for `SINK_STUCK` (a FIFO nobody reads, a client that
            // stopped reading) is left behind, said, and the side still ends.
            if let Some(tx) = &e.sink {
                while let Some(f) = e.pending.pop_front() {
                    match tokio::time::timeout(SINK_STUCK, tx.send(f)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(_)) => break,
                        Err(_) => {
                            let s = &self.w.cfg.streams[i];
                            tracing::warn!(side = %side,
                                "stream \"{}\": its sink {} took no frame for {} s as the side ended; the {} frame(s) it had not taken are dropped",
                                s.name(), s.sink.describe(), SINK_STUCK.as_secs(), e.pending.len() + 1);
                            e.pending.clear();
                            e.stuck = true;
                        }
                    }
                }
            }
            e.sink = None;
            e.source = None;
            if let Some(t) = &e.source_task {
                t.abort();
            }
        }
        let mut checks = Vec::new();
        let mut result = result;
        if result.is_ok() {
            for (i, e) in self.io.iter_mut().enumerate() {
                let Some(mut h) = e.sink_task.take() else {
                    continue;
                };
                let name = self.w.cfg.streams[i].name().to_string();
                if e.stuck {
                    h.abort();
                    continue;
                }
                let Ok(done) = tokio::time::timeout(SINK_STUCK, &mut h).await else {
                    h.abort();
                    tracing::warn!(side = %self.side, stream = %name,
                        "the sink did not finish within {} s of its last frame; stopped", SINK_STUCK.as_secs());
                    continue;
                };
                match done {
                    Ok(Ok(rep)) => {
                        if let Some(c) = rep.check {
                            checks.push((name, c));
                        }
                    }
                    Ok(Err(e)) => {
                        result = Err(anyhow!(e).context(format!("stream \"{name}\": sink failed")));
                        break;
                    }
                    Err(e) => {
                        result = Err(anyhow!("stream \"{name}\": sink task failed: {e}"));
                        break;
                    }
                }
            }
        }
        let summaries = self
            .io
            .iter_mut()
            .enumerate()
            .map(|(i, e)| {
                refresh(&mut e.stats, &self.sess, i);
                e.stats.summary()
            })
            .collect();
        let report = RunReport {
            streams: summaries,
            checks,
            peer: self.peer,
            clock_offset: self.sess.clock().map(|c| (c.offset_ns, c.rtt_ns)),
            recoveries: self.sess.recoveries().to_vec(),
            link_drops: drop_counts(&self.udp_drops),
            checks_said: false,
        };
        match result {
            Ok(()) => Ok(report),
            Err(error) => Err(anyhow::Error::new(SideFailed { report, error })),
        }
    }
}

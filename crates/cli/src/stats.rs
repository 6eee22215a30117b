//! Runtime statistics: per stream and per module, always on, cheap. Printed live (`--stats`)
//! and as JSON on exit (`--stats-json FILE`).

use hdrhistogram::Histogram;
use ndd_core::LayerStats;
use serde::Serialize;
use std::time::{Duration, Instant};

/// An idle stream's live line comes this often (one with traffic, every stats period).
pub const IDLE_LINE_EVERY: Duration = Duration::from_secs(10);

/// Counters of one stream on one side.
#[derive(Debug)]
pub struct StreamStats {
    /// Stream name.
    pub name: String,
    /// `source` or `sink` on this side.
    pub role: &'static str,
    /// Direction, as text.
    pub direction: String,
    /// Frames through the endpoint (produced on a source, delivered on a sink).
    pub frames: u64,
    /// Payload bytes through the endpoint.
    pub bytes: u64,
    /// Frames sent to / received from the link.
    pub wire_frames: u64,
    /// Bytes sent to / received from the link (frame payloads, headers of pairs included).
    pub wire_bytes: u64,
    /// One-way latency, source timestamp to delivery, in µs (sink only).
    latency_us: Histogram<u64>,
    /// Inter-frame spacing error |Δdelivery − Δcreation|, in µs (sink only).
    jitter_us: Histogram<u64>,
    last: Option<(u64, u64)>,
    /// When the first frame was delivered (our clock, ns).
    first_delivery_ns: Option<u64>,
    /// When `layers` was last refreshed by a caller that throttles it ([`Self::layers_due`]).
    layers_at: Option<Instant>,
    /// Per-layer stats, refreshed from the stack.
    pub layers: Vec<LayerStats>,
    /// Frames resent after a reconnect (source).
    pub retransmits: u64,
    /// Frames received again after a reconnect and dropped (sink).
    pub duplicates: u64,
    /// Unacknowledged frames dropped because the resume buffer was full (source); over NATS,
    /// frames of a lossy stream dropped while the connection to the server was behind.
    pub overflow: u64,
    /// Input frames not replayed after an outage: produced while the link was down, or
    /// unacknowledged when it went (source).
    pub stale: u64,
    /// Frames of a lossy stream dropped, oldest first, while its sink endpoint did not take
    /// them (sink).
    pub sink_behind: u64,
    /// Frames refused as replayed or forged: over NATS, a frame of an earlier device run or
    /// one that opens under no key (sink).
    pub refused: u64,
    /// Over NATS, stored frames that never came, given up after waiting behind a gap (sink).
    pub given_up: u64,
    /// The `image` layer's (frames out, bytes out) at the last live line.
    image_window: (u64, u64),
    window: (Instant, u64, u64),
}

/// A point-in-time summary, for the live line and JSON.
#[derive(Debug, Clone, Serialize)]
pub struct StreamSummary {
    /// Stream name.
    pub name: String,
    /// `source` or `sink` on this side.
    pub role: &'static str,
    /// Direction.
    pub direction: String,
    /// Frames through the endpoint.
    pub frames: u64,
    /// Payload bytes through the endpoint.
    pub bytes: u64,
    /// Frames over the link.
    pub wire_frames: u64,
    /// Bytes over the link.
    pub wire_bytes: u64,
    /// Frames dropped by pairs.
    pub drops: u64,
    /// One-way latency p50, ms (sink only).
    pub latency_p50_ms: Option<f64>,
    /// One-way latency p99, ms (sink only).
    pub latency_p99_ms: Option<f64>,
    /// Mean inter-frame spacing error, ms (sink only).
    pub jitter_mean_ms: Option<f64>,
    /// Seconds from the first delivered frame to the last (sink; throughput = bytes / span).
    pub delivery_span_s: Option<f64>,
    /// Frames resent after a reconnect.
    pub retransmits: u64,
    /// Resent frames dropped as already delivered.
    pub duplicates: u64,
    /// Frames dropped from a full resume buffer; over NATS, lossy frames dropped while the
    /// connection to the server was behind.
    pub overflow: u64,
    /// Input frames not replayed after an outage: produced while the link was down, or
    /// unacknowledged when it went (source).
    pub stale: u64,
    /// Lossy frames dropped, oldest first, while the sink endpoint did not take them.
    pub sink_behind: u64,
    /// Frames refused as replayed or forged.
    pub refused: u64,
    /// Over NATS, stored frames that never came, given up after waiting behind a gap.
    pub given_up: u64,
    /// Per-module counters.
    pub modules: Vec<ModuleSummary>,
}

/// One layer's counters.
#[derive(Clone, Debug, Serialize)]
pub struct ModuleSummary {
    /// Layer index.
    pub layer: usize,
    /// Pair name.
    pub module: &'static str,
    /// Frames in.
    pub frames_in: u64,
    /// Frames out.
    pub frames_out: u64,
    /// Bytes in.
    pub bytes_in: u64,
    /// Bytes out.
    pub bytes_out: u64,
    /// Drops.
    pub drops: u64,
    /// Frames held.
    pub queue_depth: u64,
    /// Control messages in / out.
    pub control: (u64, u64),
    /// Module-specific counters.
    pub counters: Vec<(&'static str, u64)>,
}

fn hist() -> Histogram<u64> {
    // 1 µs .. 1 hour, 3 significant digits.
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("static histogram bounds are valid")
}

impl StreamStats {
    /// Empty counters.
    pub fn new(name: &str, role: &'static str, direction: String) -> StreamStats {
        StreamStats {
            name: name.to_string(),
            role,
            direction,
            frames: 0,
            bytes: 0,
            wire_frames: 0,
            wire_bytes: 0,
            latency_us: hist(),
            jitter_us: hist(),
            last: None,
            first_delivery_ns: None,
            layers_at: None,
            layers: Vec::new(),
            retransmits: 0,
            duplicates: 0,
            overflow: 0,
            stale: 0,
            sink_behind: 0,
            refused: 0,
            given_up: 0,
            window: (Instant::now(), 0, 0),
            image_window: (0, 0),
        }
    }

    /// A frame created at `created_ns` (source clock, already corrected to ours) was delivered
    /// at `now_ns` (our clock).
    pub fn delivered(&mut self, len: usize, created_ns: u64, now_ns: u64) {
        self.first_delivery_ns.get_or_insert(now_ns);
        self.frames += 1;
        self.bytes += len as u64;
        let lat = now_ns.saturating_sub(created_ns) / 1000;
        self.latency_us.saturating_record(lat.max(1));
        if let Some((pc, pn)) = self.last {
            let dc = created_ns as i128 - pc as i128;
            let dn = now_ns as i128 - pn as i128;
            let err = ((dn - dc).unsigned_abs() / 1000) as u64;
            self.jitter_us.saturating_record(err.max(1));
        }
        self.last = Some((created_ns, now_ns));
    }

    /// Whether the per-layer stats are worth refreshing now (at most every 250 ms: building
    /// them allocates, too much to do per frame); marks them refreshed.
    pub fn layers_due(&mut self, now: Instant) -> bool {
        if self
            .layers_at
            .is_some_and(|t| now.saturating_duration_since(t) < Duration::from_millis(250))
        {
            return false;
        }
        self.layers_at = Some(now);
        true
    }

    /// A frame was produced by the source endpoint.
    pub fn produced(&mut self, len: usize) {
        self.frames += 1;
        self.bytes += len as u64;
    }

    /// Summary now.
    pub fn summary(&self) -> StreamSummary {
        let sink = self.role == "sink" && !self.latency_us.is_empty();
        let ms = |us: u64| us as f64 / 1000.0;
        StreamSummary {
            name: self.name.clone(),
            role: self.role,
            direction: self.direction.clone(),
            frames: self.frames,
            bytes: self.bytes,
            wire_frames: self.wire_frames,
            wire_bytes: self.wire_bytes,
            drops: self.layers.iter().map(|l| l.half.drops).sum(),
            latency_p50_ms: sink.then(|| ms(self.latency_us.value_at_quantile(0.5))),
            latency_p99_ms: sink.then(|| ms(self.latency_us.value_at_quantile(0.99))),
            delivery_span_s: match (self.first_delivery_ns, self.last) {
                (Some(first), Some((_, last))) if last > first => Some((last - first) as f64 / 1e9),
                _ => None,
            },
            jitter_mean_ms: (sink && !self.jitter_us.is_empty())
                .then(|| self.jitter_us.mean() / 1000.0),
            retransmits: self.retransmits,
            duplicates: self.duplicates,
            overflow: self.overflow,
            stale: self.stale,
            sink_behind: self.sink_behind,
            refused: self.refused,
            given_up: self.given_up,
            modules: self
                .layers
                .iter()
                .map(|l| ModuleSummary {
                    layer: l.layer,
                    module: l.module,
                    frames_in: l.frames_in,
                    frames_out: l.frames_out,
                    bytes_in: l.bytes_in,
                    bytes_out: l.bytes_out,
                    drops: l.half.drops,
                    queue_depth: l.half.queue_depth,
                    control: (l.control_in, l.control_out),
                    counters: l.half.counters.clone(),
                })
                .collect(),
        }
    }

    /// Whether the stream gets a live line at `now`: it moved frames since its last line, or
    /// its last line is [`IDLE_LINE_EVERY`] old (an idle stream is not printed every second).
    pub fn due(&self, now: Instant) -> bool {
        self.frames != self.window.1
            || now.saturating_duration_since(self.window.0) >= IDLE_LINE_EVERY
    }

    /// The live line: `[side]` and the [`Self::live_row`].
    pub fn live_line(&mut self, side: &str) -> String {
        format!("[{side}] {}", self.live_row())
    }

    /// Totals, rate since the last row, latency, jitter and drops (the live table's row).
    pub fn live_row(&mut self) -> String {
        let now = Instant::now();
        let (t, f0, b0) = self.window;
        let dt = now
            .duration_since(t)
            .max(Duration::from_millis(1))
            .as_secs_f64();
        let fps = (self.frames - f0) as f64 / dt;
        let bps = (self.bytes - b0) as f64 / dt;
        self.window = (now, self.frames, self.bytes);
        let s = self.summary();
        let mut line = format!(
            "{:<10} {:<6} {} {:>8} frames {:>7.1} f/s {:>9}/s",
            s.name,
            s.role,
            s.direction,
            s.frames,
            fps,
            human_bytes(bps)
        );
        if let (Some(p50), Some(p99)) = (s.latency_p50_ms, s.latency_p99_ms) {
            line += &format!("  latency p50 {p50:.3} ms p99 {p99:.3} ms");
        }
        if let Some(j) = s.jitter_mean_ms {
            line += &format!("  jitter {j:.3} ms");
        }
        line += &format!("  drops {}", s.drops);
        if s.sink_behind > 0 {
            line += &format!("  sink behind {}", s.sink_behind);
        }
        if s.refused > 0 {
            line += &format!("  refused {}", s.refused);
        }
        if s.given_up > 0 {
            line += &format!("  given up {}", s.given_up);
        }
        if let Some(l) = self
            .layers
            .iter()
            .find(|l| l.module == "image" && l.frames_in > 0)
        {
            line += &self.image_part(l.frames_out, l.bytes_out, &l.half.counters.clone(), dt);
        }
        line
    }

    /// `  image medium q80 28.7 fps 0.33 Mbit/frame path 19.8 Mbit/s rtt 102 ms video
    /// 640x480+64+128 h264 13.9 Mbit/s`: the display codec's preset, its frame rate and frame
    /// size on the wire since the last line, its estimate of the path (source side only), and
    /// the video region coded as H.264 with its bit rate, while there is one.
    fn image_part(
        &mut self,
        frames: u64,
        bytes: u64,
        counters: &[(&'static str, u64)],
        dt: f64,
    ) -> String {
        let get = |k: &str| counters.iter().find(|(n, _)| *n == k).map(|(_, v)| *v);
        let Some(preset) = get("preset") else {
            return String::new();
        };
        let (f0, b0) = self.image_window;
        self.image_window = (frames, bytes);
        let (df, db) = (frames.saturating_sub(f0), bytes.saturating_sub(b0));
        let name = match preset {
            1 => "low",
            2 => "medium",
            3 => "high",
            _ => "lossless",
        };
        let mbit_frame = if df > 0 {
            db as f64 * 8.0 / 1e6 / df as f64
        } else {
            0.0
        };
        // The JPEG quality in use: `auto` moves between the presets in finer steps.
        let q = match get("jpeg_q") {
            Some(q) if q > 0 => format!(" q{q}"),
            _ => String::new(),
        };
        let mut out = format!(
            "  image {name}{q} {:.1} fps {mbit_frame:.3} Mbit/frame",
            df as f64 / dt
        );
        if let Some(k) = get("bottleneck_kbps").filter(|&k| k > 0) {
            out += &format!(" path {:.1} Mbit/s", k as f64 / 1000.0);
        }
        if let Some(r) = get("rtt_ms").filter(|&r| r > 0) {
            out += &format!(" rtt {r} ms");
        }
        // The video region, coded as H.264: where, and its bit rate.
        if let (Some(w), Some(h)) = (get("video_w"), get("video_h")) {
            if w > 0 && h > 0 {
                out += &format!(
                    " video {w}x{h}+{}+{} h264 {:.1} Mbit/s",
                    get("video_x").unwrap_or(0),
                    get("video_y").unwrap_or(0),
                    get("video_kbps").unwrap_or(0) as f64 / 1000.0
                );
            }
        }
        out
    }
}

/// `12.3 KB`, `4.0 MB`…
pub fn human_bytes(b: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KB", "MB", "GB", "TB"];
    let mut v = b;
    let mut u = 0;
    while v >= 1000.0 && u < UNITS.len() - 1 {
        v /= 1000.0;
        u += 1;
    }
    if u == 0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// One side's counters at one moment, as `--metrics` exposes them (the values are a
/// snapshot, taken every second, not counters kept in place); `peer`: which peer's, on a side
/// serving several (`link.peers`), as a label.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub side: String,
    pub peer: Option<String>,
    pub link_up: bool,
    pub recoveries: usize,
    pub drops: Option<ndd_link::udp::DropCounts>,
    pub streams: Vec<StreamSummary>,
}

/// Every side's (or peer's) snapshot, as one `prometheus-client` collector: each metric family
/// once, a sample per side, peer and stream.
#[derive(Debug)]
struct Snapshots(Vec<Snapshot>);

/// Per-stream metrics: name (counters without their `_total`, which the encoder adds), help,
/// and the value.
type Get = fn(&StreamSummary) -> Option<f64>;

const STREAM_COUNTERS: [(&str, &str, Get); 12] = [
    (
        "ndd_stream_frames",
        "Frames through the stream's endpoint on this side",
        |s| Some(s.frames as f64),
    ),
    (
        "ndd_stream_bytes",
        "Payload bytes through the stream's endpoint on this side",
        |s| Some(s.bytes as f64),
    ),
    (
        "ndd_stream_wire_frames",
        "Frames of the stream over the link",
        |s| Some(s.wire_frames as f64),
    ),
    (
        "ndd_stream_wire_bytes",
        "Bytes of the stream over the link",
        |s| Some(s.wire_bytes as f64),
    ),
    (
        "ndd_stream_drops",
        "Frames dropped by the stream's pairs",
        |s| Some(s.drops as f64),
    ),
    (
        "ndd_stream_retransmits",
        "Frames resent after a reconnect",
        |s| Some(s.retransmits as f64),
    ),
    (
        "ndd_stream_duplicates",
        "Resent frames dropped as already delivered",
        |s| Some(s.duplicates as f64),
    ),
    (
        "ndd_stream_overflow",
        "Frames dropped from a full resume buffer",
        |s| Some(s.overflow as f64),
    ),
    (
        "ndd_stream_stale",
        "Input frames not replayed after an outage",
        |s| Some(s.stale as f64),
    ),
    (
        "ndd_stream_given_up",
        "Stored frames that never came, given up after waiting behind a gap (NATS)",
        |s| Some(s.given_up as f64),
    ),
    (
        "ndd_stream_sink_behind",
        "Lossy frames dropped while the sink endpoint did not take them",
        |s| Some(s.sink_behind as f64),
    ),
    (
        "ndd_stream_refused",
        "Frames refused as replayed or forged",
        |s| Some(s.refused as f64),
    ),
];

const STREAM_GAUGES: [(&str, &str, Get); 3] = [
    (
        "ndd_stream_latency_p50_seconds",
        "One-way latency, median since start (sink side)",
        |s| s.latency_p50_ms.map(|v| v / 1e3),
    ),
    (
        "ndd_stream_latency_p99_seconds",
        "One-way latency, 99th percentile since start (sink side)",
        |s| s.latency_p99_ms.map(|v| v / 1e3),
    ),
    (
        "ndd_stream_jitter_mean_seconds",
        "Mean inter-frame spacing error (sink side)",
        |s| s.jitter_mean_ms.map(|v| v / 1e3),
    ),
];

/// OpenMetrics label values are written as given: escaped here.
fn label_value(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl prometheus_client::collector::Collector for Snapshots {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder<'_>,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::gauge::ConstGauge;
        use prometheus_client::metrics::MetricType;
        type Labels = Vec<(&'static str, String)>;
        let side = |s: &Snapshot| -> Labels {
            let mut l = vec![("side", s.side.clone())];
            if let Some(p) = &s.peer {
                l.push(("peer", label_value(p)));
            }
            l
        };
        let stream = |s: &Snapshot, st: &StreamSummary| -> Labels {
            let mut l = side(s);
            l.extend([
                ("stream", label_value(&st.name)),
                ("role", st.role.to_string()),
            ]);
            l
        };
        let mut e = encoder.encode_descriptor(
            "ndd_link_up",
            "1 while a link to the peer is up, 0 while this side waits or reconnects",
            None,
            MetricType::Gauge,
        )?;
        for s in &self.0 {
            ConstGauge::new(i64::from(s.link_up)).encode(e.encode_family(&side(s))?)?;
        }
        e = encoder.encode_descriptor(
            "ndd_link_recoveries",
            "Link losses recovered (reconnected and resumed)",
            None,
            MetricType::Counter,
        )?;
        for s in &self.0 {
            ConstCounter::new(s.recoveries as u64).encode(e.encode_family(&side(s))?)?;
        }
        if self.0.iter().any(|s| s.drops.is_some()) {
            let mut e = encoder.encode_descriptor(
                "ndd_link_dropped_datagrams",
                "Datagrams a UDP link dropped: unauthenticated (forged, damaged, another peer's), replayed, garbage",
                None,
                MetricType::Counter,
            )?;
            for s in &self.0 {
                let Some(d) = s.drops else { continue };
                for (why, n) in [
                    ("unauthenticated", d.unauthenticated),
                    ("replayed", d.replayed),
                    ("garbage", d.garbage),
                ] {
                    let mut labels = side(s);
                    labels.push(("reason", why.to_string()));
                    ConstCounter::new(n).encode(e.encode_family(&labels)?)?;
                }
            }
        }
        for (name, help, get) in STREAM_COUNTERS {
            let mut e = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for s in &self.0 {
                for st in &s.streams {
                    if let Some(v) = get(st) {
                        ConstCounter::new(v as u64).encode(e.encode_family(&stream(s, st))?)?;
                    }
                }
            }
        }
        for (name, help, get) in STREAM_GAUGES {
            let mut e = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for s in &self.0 {
                for st in &s.streams {
                    if let Some(v) = get(st) {
                        ConstGauge::new(v).encode(e.encode_family(&stream(s, st))?)?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// The OpenMetrics text exposition (what Prometheus scrapes) of one side's counters
/// (`--metrics`), encoded by `prometheus-client`; label values are escaped by it.
pub fn prometheus(
    side: &str,
    link_up: bool,
    recoveries: usize,
    drops: Option<ndd_link::udp::DropCounts>,
    streams: &[StreamSummary],
) -> String {
    prometheus_all(vec![Snapshot {
        side: side.to_string(),
        peer: None,
        link_up,
        recoveries,
        drops,
        streams: streams.to_vec(),
    }])
}

/// [`prometheus`] of several snapshots (a side serving several peers: one per peer, each
/// labelled with its `peer`), each metric family once.
pub fn prometheus_all(snapshots: Vec<Snapshot>) -> String {
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register_collector(Box::new(Snapshots(snapshots)));
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_live_line_shows_the_display_codec() {
        let mut s = StreamStats::new("screen", "source", "app→device".into());
        let layer = |frames: u64, bytes: u64| LayerStats {
            layer: 0,
            module: "image",
            frames_in: frames,
            bytes_in: bytes * 10,
            frames_out: frames,
            bytes_out: bytes,
            control_in: 0,
            control_out: 0,
            half: ndd_core::HalfStats {
                drops: 0,
                queue_depth: 2,
                counters: vec![
                    ("preset", 1),
                    ("jpeg_q", 45),
                    ("rtt_ms", 104),
                    ("bottleneck_kbps", 19_800),
                    ("video_x", 64),
                    ("video_y", 128),
                    ("video_w", 640),
                    ("video_h", 480),
                    ("video_kbps", 13_860),
                ],
            },
        };
        s.layers = vec![layer(0, 0)];
        let _ = s.live_line("app");
        // 30 frames of 41 625 bytes (0.333 Mbit) since the last line.
        s.layers = vec![layer(30, 30 * 41_625)];
        let line = s.live_line("app");
        let part = line.split("  image ").nth(1).expect(&line);
        let (fps, rest) = part
            .strip_prefix("low q45 ")
            .and_then(|p| p.split_once(" fps "))
            .expect(&line);
        assert!(fps.parse::<f64>().unwrap() > 0.0, "{line}");
        assert_eq!(
            rest,
            "0.333 Mbit/frame path 19.8 Mbit/s rtt 104 ms video 640x480+64+128 h264 13.9 Mbit/s"
        );
    }

    #[test]
    fn the_metrics_are_openmetrics_text_with_escaped_labels() {
        let mut st = StreamStats::new("a\"b\\c\nd", "sink", "device→app".into());
        st.frames = 7;
        let text = prometheus(
            "app",
            true,
            2,
            Some(ndd_link::udp::DropCounts {
                unauthenticated: 3,
                replayed: 0,
                garbage: 1,
            }),
            &[st.summary()],
        );
        for line in [
            "# TYPE ndd_link_up gauge",
            "ndd_link_up{side=\"app\"} 1",
            "# TYPE ndd_link_recoveries counter",
            "ndd_link_recoveries_total{side=\"app\"} 2",
            "ndd_link_dropped_datagrams_total{side=\"app\",reason=\"unauthenticated\"} 3",
            "ndd_link_dropped_datagrams_total{side=\"app\",reason=\"garbage\"} 1",
            "ndd_stream_frames_total{side=\"app\",stream=\"a\\\"b\\\\c\\nd\",role=\"sink\"} 7",
            "# EOF",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} in\n{text}");
        }
        // A gauge without a value (no latency measured yet) has no sample.
        assert!(!text.contains("ndd_stream_latency_p50_seconds{"), "{text}");
    }

    #[test]
    fn latency_and_jitter_are_measured_from_timestamps() {
        let mut s = StreamStats::new("e", "sink", "device→app".into());
        // Created every 16 ms, delivered 2 ms later, one frame 5 ms late.
        for (i, extra) in [(0u64, 0u64), (1, 0), (2, 5), (3, 0)] {
            let c = i * 16_000_000;
            s.delivered(10, c, c + 2_000_000 + extra * 1_000_000);
        }
        let sum = s.summary();
        assert_eq!(sum.frames, 4);
        assert_eq!(sum.bytes, 40);
        assert!((sum.latency_p50_ms.unwrap() - 2.0).abs() < 0.01, "{sum:?}");
        assert!((sum.latency_p99_ms.unwrap() - 7.0).abs() < 0.01, "{sum:?}");
        // Spacing errors: 0, 5, 5 ms (hist floor 1 µs).
        assert!(
            (sum.jitter_mean_ms.unwrap() - 10.0 / 3.0).abs() < 0.01,
            "{sum:?}"
        );
    }

    #[test]
    fn human_units() {
        assert_eq!(human_bytes(999.0), "999 B");
        assert_eq!(human_bytes(1500.0), "1.5 KB");
        assert_eq!(human_bytes(2.5e9), "2.5 GB");
    }

    #[test]
    fn an_idle_stream_gets_a_line_only_every_ten_seconds() {
        let mut s = StreamStats::new("e", "sink", "device→app".into());
        let now = Instant::now();
        assert!(!s.due(now), "no frames yet, just started");
        s.frames += 1;
        assert!(s.due(now));
        let _ = s.live_line("app");
        assert!(!s.due(Instant::now()), "nothing new since that line");
        assert!(s.due(Instant::now() + IDLE_LINE_EVERY));
    }
}

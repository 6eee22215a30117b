//! The jitter experiment of the dissertation (§6.7, Fig. 6.12 and 6.14), in virtual time.
//!
//! A periodic source makes a frame every [`PERIOD_MS`] ms; frames cross a TCP-like (in-order,
//! lossless) link with [`BASE_DELAY_MS`] ms of delay plus uniform 0–J ms of jitter; the sink
//! endpoint's spacing is compared with the spacing at creation ([`spacing_error`]). Each
//! variant is a pair of stacks built by the caller (this crate does not know the pairs), so
//! `make("buffer")` returns the source and sink stacks of whatever the caller calls "buffer".
//! A bare stack (no pairs) is always run alongside, on the same seed, as the reference for
//! the delay a variant adds.
//!
//! [`markdown`] and [`svg`] render the rows as a table and as a self-contained SVG line plot
//! (x: jitter, y: mean spacing error with ±sd bars, one line per variant).

use crate::link::LinkConfig;
use crate::pipeline::{spacing_error, Delivery, Pipeline};
use ndd_core::{Role, Stack, StackError};
use std::fmt::Write as _;
use std::time::Duration;

/// Period of the source, in ms (the dissertation's 62.5 Hz spacenav generator).
pub const PERIOD_MS: u64 = 16;
/// Fixed one-way delay of the link, in ms.
pub const BASE_DELAY_MS: u64 = 10;
/// Payload size of each frame, in bytes.
pub const PAYLOAD: usize = 16;

/// One measurement: a variant at one jitter level.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Variant name as given to `make` (`"bare"` for the reference run when asked for).
    pub variant: String,
    /// Uniform jitter added by the link, 0..=`jitter_ms`.
    pub jitter_ms: u64,
    /// Mean |Δcreation − Δrelease| over consecutive deliveries, in ms.
    pub mean_ms: f64,
    /// Its standard deviation, in ms.
    pub sd_ms: f64,
    /// Its largest value, in ms.
    pub max_ms: f64,
    /// Mean end-to-end latency (creation to release at the sink endpoint), in ms.
    pub latency_ms: f64,
    /// `latency_ms` minus the bare stack's on the same link and seed: what the variant costs.
    pub added_delay_ms: f64,
    /// Frames the sink endpoint received.
    pub delivered: u64,
    /// Frames the source endpoint produced.
    pub frames: u64,
}

/// What one run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Measure {
    /// Spacing error mean, sd and max, in ms.
    pub mean_ms: f64,
    /// See [`Measure::mean_ms`].
    pub sd_ms: f64,
    /// See [`Measure::mean_ms`].
    pub max_ms: f64,
    /// Mean creation-to-release latency, in ms.
    pub latency_ms: f64,
    /// Frames delivered.
    pub delivered: u64,
}

/// The link of the experiment at `jitter_ms`.
pub fn link(jitter_ms: u64) -> LinkConfig {
    LinkConfig::tcp(
        Duration::from_millis(BASE_DELAY_MS),
        Duration::from_millis(jitter_ms),
    )
}

/// Runs `frames` periodic frames through `src` and `sink` over [`link`]`(jitter_ms)`.
pub fn run(
    src: Stack,
    sink: Stack,
    jitter_ms: u64,
    frames: u64,
    seed: u64,
) -> Result<Measure, StackError> {
    let mut p = Pipeline::with_stacks(src, sink, link(jitter_ms), seed);
    for i in 0..frames {
        p.send_at(Duration::from_millis(PERIOD_MS * i), vec![i as u8; PAYLOAD]);
    }
    p.finish()?;
    Ok(measure(p.deliveries()))
}

/// Spacing error and latency of `deliveries`.
pub fn measure(deliveries: &[Delivery]) -> Measure {
    let e = spacing_error(deliveries);
    let latency_ms = if deliveries.is_empty() {
        0.0
    } else {
        deliveries
            .iter()
            .map(|d| d.released.as_secs_f64() - d.created.as_secs_f64())
            .sum::<f64>()
            * 1e3
            / deliveries.len() as f64
    };
    Measure {
        mean_ms: e.mean_ms,
        sd_ms: e.sd_ms,
        max_ms: e.max_ms,
        latency_ms,
        delivered: deliveries.len() as u64,
    }
}

/// Runs every variant at every jitter level (`frames` frames each). Each jitter level uses its
/// own seed (`seed + jitter_ms`), shared by all variants and the bare reference. A variant
/// named `"bare"` is the reference itself (built here, `make` is not called for it).
pub fn jitter_table(
    make: &dyn Fn(&str) -> (Stack, Stack),
    variants: &[&str],
    jitters_ms: &[u64],
    frames: u64,
    seed: u64,
) -> Result<Vec<Row>, StackError> {
    let bare = || {
        (
            Stack::from_halves(Role::Source, "jitter", vec![]),
            Stack::from_halves(Role::Sink, "jitter", vec![]),
        )
    };
    let mut rows = Vec::new();
    for &j in jitters_ms {
        let s = seed.wrapping_add(j);
        let (src, sink) = bare();
        let reference = run(src, sink, j, frames, s)?;
        for &v in variants {
            let m = if v == "bare" {
                reference.clone()
            } else {
                let (src, sink) = make(v);
                run(src, sink, j, frames, s)?
            };
            rows.push(Row {
                variant: v.to_string(),
                jitter_ms: j,
                mean_ms: m.mean_ms,
                sd_ms: m.sd_ms,
                max_ms: m.max_ms,
                latency_ms: m.latency_ms,
                added_delay_ms: m.latency_ms - reference.latency_ms,
                delivered: m.delivered,
                frames,
            });
        }
    }
    Ok(rows)
}

/// The rows as a markdown table, one line per (jitter, variant).
pub fn markdown(rows: &[Row]) -> String {
    let mut s = String::from(
        "| jitter | variant | spacing error mean ± sd | max | latency | added delay | delivered |\n\
         |---:|---|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        let _ = writeln!(
            s,
            "| {} ms | {} | {:.3} ± {:.3} ms | {:.2} ms | {:.1} ms | {:+.1} ms | {}/{} |",
            r.jitter_ms,
            r.variant,
            r.mean_ms,
            r.sd_ms,
            r.max_ms,
            r.latency_ms,
            r.added_delay_ms,
            r.delivered,
            r.frames
        );
    }
    s
}

/// A step of 1, 2 or 5 × 10^k that splits `span` into about five intervals.
fn nice_step(span: f64) -> f64 {
    if span <= 0.0 || !span.is_finite() {
        return 1.0;
    }
    let raw = span / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let nice = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The rows as a self-contained SVG line plot in the manner of the dissertation's Fig. 6.12 and
/// 6.14: x = jitter (ms, one evenly spaced tick per level), y = mean spacing error (ms) with
/// ±sd bars, one line per variant, axes, ticks, gridlines and a legend.
pub fn svg(rows: &[Row]) -> String {
    const W: f64 = 720.0;
    const H: f64 = 440.0;
    const L: f64 = 70.0;
    const R: f64 = 20.0;
    const T: f64 = 40.0;
    const B: f64 = 60.0;
    const COLORS: [&str; 6] = [
        "#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
    ];
    let mut jitters: Vec<u64> = rows.iter().map(|r| r.jitter_ms).collect();
    jitters.sort_unstable();
    jitters.dedup();
    let mut variants: Vec<&str> = Vec::new();
    for r in rows {
        if !variants.contains(&r.variant.as_str()) {
            variants.push(&r.variant);
        }
    }
    let top = rows
        .iter()
        .map(|r| r.mean_ms + r.sd_ms)
        .fold(0.0f64, f64::max);
    let step = nice_step(top.max(1.0));
    let ymax = (top / step).ceil().max(1.0) * step;
    let pw = W - L - R;
    let ph = H - T - B;
    let x_of = |j: u64| {
        let i = jitters.iter().position(|&v| v == j).unwrap_or(0) as f64;
        L + pw * (i + 0.5) / jitters.len().max(1) as f64
    };
    let y_of = |v: f64| T + ph * (1.0 - (v / ymax).clamp(0.0, 1.0));

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="14">Spacing error vs network jitter ({PERIOD_MS} ms frames, {BASE_DELAY_MS} ms + jitter, in-order link)</text>"#,
        W / 2.0
    );
    // Grid and y ticks.
    let mut v = 0.0;
    while v <= ymax + step * 1e-9 {
        let y = y_of(v);
        let _ = writeln!(
            s,
            r##"<line x1="{L}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e0e0e0"/>"##,
            W - R
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            L - 6.0,
            y + 4.0,
            trim(v)
        );
        v += step;
    }
    // Axes.
    let _ = writeln!(
        s,
        r#"<line x1="{L}" y1="{T}" x2="{L}" y2="{:.1}" stroke="black"/>"#,
        T + ph
    );
    let _ = writeln!(
        s,
        r#"<line x1="{L}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="black"/>"#,
        T + ph,
        W - R,
        T + ph
    );
    for &j in &jitters {
        let x = x_of(j);
        let _ = writeln!(
            s,
            r#"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="black"/>"#,
            T + ph,
            T + ph + 5.0
        );
        let _ = writeln!(
            s,
            r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{j}</text>"#,
            T + ph + 18.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">jitter (ms)</text>"#,
        L + pw / 2.0,
        H - 18.0
    );
    let _ = writeln!(
        s,
        r#"<text x="18" y="{:.1}" text-anchor="middle" transform="rotate(-90 18 {:.1})">mean |Δsent − Δreceived| (ms), bars ±1 sd</text>"#,
        T + ph / 2.0,
        T + ph / 2.0
    );
    // One line per variant, with error bars; variants are nudged apart so bars do not overlap.
    let n = variants.len().max(1) as f64;
    for (k, var) in variants.iter().enumerate() {
        let color = COLORS[k % COLORS.len()];
        let nudge = (k as f64 - (n - 1.0) / 2.0) * 6.0;
        let mut pts: Vec<(u64, &Row)> = rows
            .iter()
            .filter(|r| r.variant == *var)
            .map(|r| (r.jitter_ms, r))
            .collect();
        pts.sort_by_key(|p| p.0);
        let path: Vec<String> = pts
            .iter()
            .map(|(j, r)| format!("{:.1},{:.1}", x_of(*j) + nudge, y_of(r.mean_ms)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
            path.join(" ")
        );
        for (j, r) in &pts {
            let x = x_of(*j) + nudge;
            let (y0, y1) = (y_of(r.mean_ms - r.sd_ms), y_of(r.mean_ms + r.sd_ms));
            let _ = writeln!(
                s,
                r#"<line x1="{x:.1}" y1="{y0:.1}" x2="{x:.1}" y2="{y1:.1}" stroke="{color}"/><line x1="{:.1}" y1="{y1:.1}" x2="{:.1}" y2="{y1:.1}" stroke="{color}"/><line x1="{:.1}" y1="{y0:.1}" x2="{:.1}" y2="{y0:.1}" stroke="{color}"/>"#,
                x - 4.0,
                x + 4.0,
                x - 4.0,
                x + 4.0
            );
            let _ = writeln!(
                s,
                r#"<circle cx="{x:.1}" cy="{:.1}" r="3.5" fill="{color}"><title>{} at {j} ms: {:.3} ± {:.3} ms</title></circle>"#,
                y_of(r.mean_ms),
                escape(var),
                r.mean_ms,
                r.sd_ms
            );
        }
        // Legend entry.
        let ly = T + 12.0 + 18.0 * k as f64;
        let _ = writeln!(
            s,
            r#"<line x1="{:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="2"/><circle cx="{:.1}" cy="{ly:.1}" r="3.5" fill="{color}"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            L + 14.0,
            L + 40.0,
            L + 27.0,
            L + 46.0,
            ly + 4.0,
            escape(var)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// `v` without trailing zeros (tick labels).
fn trim(v: f64) -> String {
    let t = format!("{v:.3}");
    let t = t.trim_end_matches('0').trim_end_matches('.');
    if t.is_empty() || t == "-0" {
        "0".to_string()
    } else {
        t.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(variant: &str, jitter_ms: u64, mean_ms: f64) -> Row {
        Row {
            variant: variant.into(),
            jitter_ms,
            mean_ms,
            sd_ms: mean_ms / 2.0,
            max_ms: mean_ms * 3.0,
            latency_ms: 20.0,
            added_delay_ms: 0.0,
            delivered: 10,
            frames: 10,
        }
    }

    #[test]
    fn nice_steps() {
        assert_eq!(nice_step(10.0), 2.0);
        assert_eq!(nice_step(37.0), 10.0);
        assert_eq!(nice_step(0.4), 0.1);
        assert_eq!(trim(0.30000000000000004), "0.3");
        assert_eq!(trim(20.0), "20");
    }

    #[test]
    fn bare_table_has_one_row_per_level_and_no_added_delay() {
        let rows = jitter_table(&|_| unreachable!(), &["bare"], &[0, 20], 50, 1).unwrap();
        assert_eq!(rows.len(), 2);
        assert!(rows[0].mean_ms < 1e-9, "no jitter, no spacing error");
        assert!((rows[0].latency_ms - BASE_DELAY_MS as f64).abs() < 1e-9);
        assert!(rows[1].mean_ms > 0.0);
        assert!(rows
            .iter()
            .all(|r| r.added_delay_ms == 0.0 && r.delivered == 50));
        let md = markdown(&rows);
        assert!(md.contains("| 20 ms | bare |"), "{md}");
    }

    #[test]
    fn svg_is_self_contained_with_a_line_per_variant_and_legend() {
        let rows = vec![
            row("bare", 5, 1.5),
            row("bare", 50, 13.0),
            row("a<b", 5, 0.0),
            row("a<b", 50, 0.1),
        ];
        let s = svg(&rows);
        assert!(s.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(s.trim_end().ends_with("</svg>"));
        assert_eq!(s.matches("<polyline").count(), 2);
        assert!(s.contains(">a&lt;b</text>"), "legend escapes names");
        assert!(s.contains(">jitter (ms)</text>"));
        assert!(!s.contains("href"), "no external resources");
        assert!(!s.contains("NaN"));
    }
}

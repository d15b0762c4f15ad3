//! Measurements and reports: per operation kind, the simulated latency and
//! the inter-DC round trips, set against DESIGN.md §4's cost model; printed
//! as a terminal table and written as `summary.json` plus a latency-CDF SVG.
//! An acquire's [`Work`] (what its DC did for it) is part of its
//! measurement: the DC notes it with the reply, the host takes it with the
//! answer.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use crate::counter::{Counter, Op, Timing};

/// What one acquire cost its DC, counted by its task and reported with
/// its reply (the host measures the acquire by it).
#[derive(Debug, Clone, Copy, Default)]
pub struct Work {
    /// Round trips to other DCs.
    pub peer_rtts: u32,
    /// Global write-once operations.
    pub global_writes: u32,
    /// Link requests sent to a tail's DC.
    pub links: u32,
    /// Times the acquire awaited the holder's reservation.
    pub awaits: u32,
}

/// Samples of one operation kind.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    /// How many.
    pub count: u64,
    /// Simulated latencies, µs (not kept for cached resolves: all zero).
    pub latency_us: Vec<u64>,
    /// Sum of measured inter-DC round trips.
    pub rtt_sum: u64,
    /// Sum of the cost model's round trips for the same operations.
    pub model_rtt_sum: u64,
}

/// Every measurement of a run.
#[derive(Debug, Clone, Default)]
pub struct Measurements {
    /// Samples per operation.
    pub by_op: BTreeMap<Op, Samples>,
    /// How often notable protocol outcomes happened (link replies, drains, kills…).
    pub counters: BTreeMap<Counter, u64>,
    /// Durations of notable events, µs (one sample per occurrence: merged
    /// over seeds, their percentiles are over seeds).
    pub durations: BTreeMap<Timing, Vec<u64>>,
    acquire_work: BTreeMap<u64, Work>,
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i] as f64 / 1000.0
}

impl Measurements {
    /// Records one operation.
    pub fn record(&mut self, op: Op, latency_us: u64, rtts: u32, model_rtts: u32) {
        let s = self.by_op.entry(op).or_default();
        s.count += 1;
        if op != Op::ResolveCached {
            s.latency_us.push(latency_us);
        }
        s.rtt_sum += u64::from(rtts);
        s.model_rtt_sum += u64::from(model_rtts);
    }

    /// Counts one notable outcome.
    pub fn count(&mut self, what: Counter) {
        *self.counters.entry(what).or_default() += 1;
    }

    /// How often `what` happened.
    pub fn counted(&self, what: Counter) -> u64 {
        self.counters.get(&what).copied().unwrap_or(0)
    }

    /// Notes one duration of `what`, µs.
    pub fn duration(&mut self, what: Timing, us: u64) {
        self.durations.entry(what).or_default().push(us);
    }

    /// Each duration as `name: n=…, p50=… ms, p99=… ms, max=… ms`, one per line.
    pub fn durations_lines(&self) -> String {
        let mut out = String::new();
        for (what, samples) in &self.durations {
            let mut sorted = samples.clone();
            sorted.sort_unstable();
            let max = sorted.last().copied().unwrap_or(0) as f64 / 1000.0;
            let _ = writeln!(
                out,
                "{what}: n={}, p50={:.0} ms, p99={:.0} ms, max={max:.0} ms",
                sorted.len(),
                percentile(&sorted, 0.5),
                percentile(&sorted, 0.99)
            );
        }
        out
    }

    /// The counters as `name=value` pairs on one line.
    pub fn counters_line(&self) -> String {
        let pairs: Vec<String> = self
            .counters
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        pairs.join(" ")
    }

    /// A DC reports the work of the acquire answered under `rpc`.
    pub fn note_acquire_work(&mut self, rpc: u64, work: Work) {
        self.acquire_work.insert(rpc, work);
    }

    /// The work noted for `rpc` (zero if the reply never came).
    pub fn take_acquire_work(&mut self, rpc: u64) -> Work {
        self.acquire_work.remove(&rpc).unwrap_or_default()
    }

    /// Adds another run's samples.
    pub fn merge(&mut self, other: &Measurements) {
        for (op, s) in &other.by_op {
            let t = self.by_op.entry(*op).or_default();
            t.count += s.count;
            t.latency_us.extend_from_slice(&s.latency_us);
            t.rtt_sum += s.rtt_sum;
            t.model_rtt_sum += s.model_rtt_sum;
        }
        for (k, v) in &other.counters {
            *self.counters.entry(*k).or_default() += v;
        }
        for (k, v) in &other.durations {
            self.durations.entry(*k).or_default().extend_from_slice(v);
        }
    }

    fn rows(&self) -> Vec<Row> {
        self.by_op
            .iter()
            .map(|(op, s)| {
                let mut sorted = s.latency_us.clone();
                sorted.sort_unstable();
                let mean = if sorted.is_empty() {
                    0.0
                } else {
                    sorted.iter().sum::<u64>() as f64 / sorted.len() as f64 / 1000.0
                };
                let n = s.count.max(1) as f64;
                Row {
                    op: *op,
                    count: s.count,
                    rtt_mean: s.rtt_sum as f64 / n,
                    model_rtt_mean: s.model_rtt_sum as f64 / n,
                    mean_ms: mean,
                    p50_ms: percentile(&sorted, 0.5),
                    p99_ms: percentile(&sorted, 0.99),
                    sorted,
                }
            })
            .collect()
    }

    /// The terminal table.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<38} {:>9}  {:<48} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "operation",
            "count",
            "cost model (DESIGN.md §4)",
            "RTT model",
            "RTT meas",
            "mean ms",
            "p50 ms",
            "p99 ms"
        );
        for r in self.rows() {
            let _ = writeln!(
                out,
                "{:<38} {:>9}  {:<48} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2}",
                r.op.label(),
                r.count,
                r.op.model(),
                r.model_rtt_mean,
                r.rtt_mean,
                r.mean_ms,
                r.p50_ms,
                r.p99_ms
            );
        }
        out
    }

    /// The operations as a JSON array.
    pub fn json(&self) -> serde_json::Value {
        let rows: Vec<serde_json::Value> = self
            .rows()
            .iter()
            .map(|r| {
                serde_json::json!({
                    "op": r.op.label(),
                    "count": r.count,
                    "model": r.op.model(),
                    "model_rtt_mean": r.model_rtt_mean,
                    "rtt_mean": r.rtt_mean,
                    "latency_ms": {"mean": r.mean_ms, "p50": r.p50_ms, "p99": r.p99_ms},
                })
            })
            .collect();
        serde_json::Value::Array(rows)
    }

    /// The counters as a JSON object.
    pub fn counters_json(&self) -> serde_json::Value {
        self.counters
            .iter()
            .map(|(k, v)| (k.name().to_string(), serde_json::Value::from(*v)))
            .collect::<serde_json::Map<_, _>>()
            .into()
    }

    /// The durations as a JSON object: name → samples in ms.
    pub fn durations_json(&self) -> serde_json::Value {
        self.durations
            .iter()
            .map(|(k, v)| {
                let ms: Vec<f64> = v.iter().map(|us| *us as f64 / 1000.0).collect();
                (k.to_string(), serde_json::Value::from(ms))
            })
            .collect::<serde_json::Map<_, _>>()
            .into()
    }

    /// An SVG plot of each operation's latency CDF (log-scaled x axis).
    pub fn cdf_svg(&self) -> String {
        const W: f64 = 1000.0;
        const H: f64 = 520.0;
        const LEFT: f64 = 60.0;
        const BOTTOM: f64 = 40.0;
        const PLOT_W: f64 = 560.0;
        const PLOT_H: f64 = 440.0;
        const COLORS: [&str; 10] = [
            "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
            "#bcbd22", "#17becf",
        ];
        let rows: Vec<Row> = self
            .rows()
            .into_iter()
            .filter(|r| r.sorted.len() >= 2)
            .collect();
        let max_ms = rows
            .iter()
            .filter_map(|r| r.sorted.last())
            .map(|us| *us as f64 / 1000.0)
            .fold(1.0, f64::max);
        let (lo, hi) = (-1.0f64, max_ms.log10().ceil().max(0.0));
        let x = |ms: f64| LEFT + (ms.max(0.1).log10() - lo) / (hi - lo) * PLOT_W;
        let y = |f: f64| 20.0 + (1.0 - f) * PLOT_H;
        let mut svg = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
        );
        let _ = writeln!(
            svg,
            "<rect x=\"{LEFT}\" y=\"20\" width=\"{PLOT_W}\" height=\"{PLOT_H}\" fill=\"none\" stroke=\"black\"/>"
        );
        let mut decade = lo as i32;
        while f64::from(decade) <= hi {
            let ms = 10f64.powi(decade);
            let _ = writeln!(
                svg,
                "<line x1=\"{0:.1}\" y1=\"20\" x2=\"{0:.1}\" y2=\"{1}\" stroke=\"#ddd\"/><text x=\"{0:.1}\" y=\"{2}\" text-anchor=\"middle\">{3} ms</text>",
                x(ms),
                20.0 + PLOT_H,
                20.0 + PLOT_H + 15.0,
                ms
            );
            decade += 1;
        }
        // 0.99 is too close to 1 to label legibly at this height.
        for f in [0.0, 0.5, 0.9, 1.0] {
            let _ = writeln!(
                svg,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{f}</text>",
                LEFT - 5.0,
                y(f) + 4.0
            );
        }
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">simulated latency (log scale)</text>",
            LEFT + PLOT_W / 2.0,
            H - BOTTOM / 4.0
        );
        for (i, r) in rows.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            // Past the palette, lines repeat a colour: dash them to tell them apart.
            let dash = if i >= COLORS.len() {
                " stroke-dasharray=\"6,3\""
            } else {
                ""
            };
            let step = (r.sorted.len() / 400).max(1);
            let points: Vec<String> = r
                .sorted
                .iter()
                .enumerate()
                .step_by(step)
                .chain(std::iter::once((
                    r.sorted.len() - 1,
                    &r.sorted[r.sorted.len() - 1],
                )))
                .map(|(k, us)| {
                    let f = (k + 1) as f64 / r.sorted.len() as f64;
                    format!("{:.1},{:.1}", x(*us as f64 / 1000.0), y(f))
                })
                .collect();
            let _ = writeln!(
                svg,
                "<polyline fill=\"none\" stroke=\"{color}\"{dash} stroke-width=\"1.5\" points=\"{}\"/>",
                points.join(" ")
            );
            let ly = 30.0 + i as f64 * 16.0;
            let _ = writeln!(
                svg,
                "<line x1=\"{0}\" y1=\"{ly}\" x2=\"{1}\" y2=\"{ly}\" stroke=\"{color}\"{dash} stroke-width=\"3\"/><text x=\"{2}\" y=\"{3}\">{4} (n={5})</text>",
                LEFT + PLOT_W + 15.0,
                LEFT + PLOT_W + 35.0,
                LEFT + PLOT_W + 40.0,
                ly + 4.0,
                xml_escape(&r.op.label()),
                r.count
            );
        }
        svg.push_str("</svg>\n");
        svg
    }
}

struct Row {
    op: Op,
    count: u64,
    rtt_mean: f64,
    model_rtt_mean: f64,
    mean_ms: f64,
    p50_ms: f64,
    p99_ms: f64,
    sorted: Vec<u64>,
}

fn xml_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Writes `summary.json` and `latency_cdf.svg` into `dir`.
pub fn write_report(
    dir: &Path,
    summary_json: &str,
    measurements: &Measurements,
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("summary.json"), summary_json)?;
    std::fs::write(dir.join("latency_cdf.svg"), measurements.cdf_svg())?;
    Ok(())
}

//! Reports: the machine description, one [`Row`] per target and configuration, the stdout
//! table, the JSON file and the PNG plot.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::OnceLock;

use anyhow::Context as _;
use serde::Serialize;

/// The machine a run happened on: CPU model, cores, kernel, and the load average when the
/// benchmark started (other work on a shared machine skews numbers).
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_owned());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| std::env::consts::OS.to_owned());
    format!("{cpu}, {cores} cores, Linux {kernel}")
}

/// The 1-minute load average, if the system reports one.
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// One target under one configuration: the median of its runs.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Target name.
    pub target: String,
    /// Isolation level, as the target states it.
    pub isolation: String,
    /// Workload name.
    pub workload: String,
    /// Client threads (connections in server mode).
    pub threads: usize,
    /// Zipfian θ.
    pub theta: f64,
    /// Read ratio.
    pub read_ratio: f64,
    /// Records loaded.
    pub records: u64,
    /// Committed transactions per second (median run).
    pub txn_per_s: f64,
    /// Aborts per second (of the median run).
    pub aborts_per_s: f64,
    /// Latency percentiles in microseconds (of the median run).
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Committed txn/s of every run, in run order.
    pub runs_txn_per_s: Vec<f64>,
    /// Durability setting.
    pub durability: String,
    /// Pipelining depth (server mode), 1 otherwise.
    pub pipeline: usize,
    /// [`machine`].
    pub machine: String,
    /// Seed of the key streams.
    pub seed: u64,
    /// The command line that produced this row.
    pub command: String,
}

/// The table printed on stdout: one line per row; the ratio column compares each row with
/// the first target's row of the same configuration.
pub fn table(rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<16} {:>7} {:>5} {:>5} {:>12} {:>10} {:>9} {:>9} {:>9} {:>7}  isolation",
        "target",
        "threads",
        "theta",
        "reads",
        "txn/s",
        "aborts/s",
        "p50 µs",
        "p99 µs",
        "p999 µs",
        "ratio"
    );
    for row in rows {
        let base = rows
            .iter()
            .find(|r| {
                r.threads == row.threads && r.theta == row.theta && r.read_ratio == row.read_ratio
            })
            .map_or(row.txn_per_s, |r| r.txn_per_s);
        let ratio = if base > 0.0 {
            row.txn_per_s / base
        } else {
            0.0
        };
        let _ = writeln!(
            out,
            "{:<16} {:>7} {:>5} {:>5} {:>12.0} {:>10.0} {:>9.1} {:>9.1} {:>9.1} {:>7.3}  {}",
            row.target,
            row.threads,
            row.theta,
            row.read_ratio,
            row.txn_per_s,
            row.aborts_per_s,
            row.p50_us,
            row.p99_us,
            row.p999_us,
            ratio,
            row.isolation
        );
    }
    out
}

/// Writes `rows` as a JSON array to `path`.
pub fn write_json(rows: &[Row], path: &Path) -> anyhow::Result<()> {
    let json = serde_json::to_string_pretty(rows).context("serializing results")?;
    std::fs::write(path, json + "\n").with_context(|| format!("writing {}", path.display()))
}

/// Which configuration variable a plot puts on its x axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Axis {
    /// Client threads.
    Threads,
    /// Zipfian θ.
    Theta,
    /// Read ratio.
    ReadRatio,
}

impl Axis {
    fn value(self, row: &Row) -> f64 {
        match self {
            Axis::Threads => row.threads as f64,
            Axis::Theta => row.theta,
            Axis::ReadRatio => row.read_ratio,
        }
    }
    fn label(self) -> &'static str {
        match self {
            Axis::Threads => "client threads",
            Axis::Theta => "Zipfian theta",
            Axis::ReadRatio => "read ratio",
        }
    }
}

/// The fonts plotters draws text with, read once from the system (Debian: fonts-dejavu-core).
fn register_font() -> anyhow::Result<()> {
    static FONT: OnceLock<Result<(), String>> = OnceLock::new();
    FONT.get_or_init(|| {
        let candidates = [
            "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
            "/usr/share/fonts/TTF/DejaVuSans.ttf",
            "/usr/share/fonts/dejavu/DejaVuSans.ttf",
            "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
        ];
        let bytes = candidates
            .iter()
            .find_map(|p| std::fs::read(p).ok())
            .ok_or_else(|| {
                format!("no font found for the plot (install fonts-dejavu-core); looked in {candidates:?}")
            })?;
        // The font registry wants 'static bytes; this runs once per process.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", plotters::style::FontStyle::Normal, bytes)
            .map_err(|_| "the font file could not be parsed".to_owned())
    })
    .clone()
    .map_err(anyhow::Error::msg)
}

/// Draws committed txn/s against `axis`, one line per target, into a PNG at `path`.
pub fn plot(rows: &[Row], axis: Axis, title: &str, path: &Path) -> anyhow::Result<()> {
    use plotters::prelude::*;
    anyhow::ensure!(!rows.is_empty(), "nothing to plot");
    register_font()?;
    let mut targets: Vec<&str> = Vec::new();
    for row in rows {
        if !targets.contains(&row.target.as_str()) {
            targets.push(&row.target);
        }
    }
    let xs = rows.iter().map(|r| axis.value(r));
    let (x_min, x_max) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    let (x_min, x_max) = if x_min == x_max {
        (x_min - 0.5, x_max + 0.5)
    } else {
        (x_min, x_max)
    };
    let y_max = rows.iter().map(|r| r.txn_per_s).fold(0.0, f64::max) * 1.1 + 1.0;
    let root = BitMapBackend::new(path, (1000, 640)).into_drawing_area();
    let draw = |e: &dyn std::fmt::Display| anyhow::anyhow!("drawing {}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| draw(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 24))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(90)
        .build_cartesian_2d(x_min..x_max, 0.0..y_max)
        .map_err(|e| draw(&e))?;
    chart
        .configure_mesh()
        .x_desc(axis.label())
        .y_desc("committed txn/s")
        .y_label_formatter(&|y| format!("{:.2}M", y / 1e6))
        .draw()
        .map_err(|e| draw(&e))?;
    for (i, target) in targets.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let mut points: Vec<(f64, f64)> = rows
            .iter()
            .filter(|r| r.target == *target)
            .map(|r| (axis.value(r), r.txn_per_s))
            .collect();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .map_err(|e| draw(&e))?
            .label(*target)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 4, color.filled())),
            )
            .map_err(|e| draw(&e))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| draw(&e))?;
    root.present().map_err(|e| draw(&e))?;
    Ok(())
}

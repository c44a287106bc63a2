//! Reports: the machine description, one [`Row`] per target and configuration, the stdout
//! table, the JSON file and the PNG plot.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::OnceLock;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// This process's CPU microseconds per committed transaction (median run), every thread
    /// counted: embedded targets only (in server mode the server's CPU is elsewhere).
    #[serde(default)]
    pub cpu_us_per_txn: Option<f64>,
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
        "{:<16} {:>7} {:>5} {:>5} {:>12} {:>10} {:>9} {:>9} {:>9} {:>9} {:>7}  isolation",
        "target",
        "threads",
        "theta",
        "reads",
        "txn/s",
        "aborts/s",
        "p50 µs",
        "p99 µs",
        "p999 µs",
        "CPU µs",
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
            "{:<16} {:>7} {:>5} {:>5} {:>12.0} {:>10.0} {:>9.1} {:>9.1} {:>9.1} {:>9} {:>7.3}  {}",
            row.target,
            row.threads,
            row.theta,
            row.read_ratio,
            row.txn_per_s,
            row.aborts_per_s,
            row.p50_us,
            row.p99_us,
            row.p999_us,
            row.cpu_us_per_txn
                .map_or_else(|| "-".to_owned(), |c| format!("{c:.2}")),
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

/// Reads the rows [`write_json`] wrote (to redraw a plot without running again).
pub fn read_json(path: &Path) -> anyhow::Result<Vec<Row>> {
    let json =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&json).with_context(|| format!("parsing {}", path.display()))
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
    /// The variable the rows sweep: threads if they differ, else θ, else the read ratio.
    pub fn of(rows: &[Row]) -> Axis {
        let varies = |f: fn(&Row) -> f64| rows.iter().any(|r| f(r) != f(&rows[0]));
        if varies(|r| r.threads as f64) {
            Axis::Threads
        } else if varies(|r| r.theta) {
            Axis::Theta
        } else if varies(|r| r.read_ratio) {
            Axis::ReadRatio
        } else {
            Axis::Threads
        }
    }

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

/// DejaVu Sans, compiled in so that a plot needs no font on the machine it is drawn on
/// (`fonts/LICENSE`: Bitstream Vera license, DejaVu changes in the public domain).
static FONT: &[u8] = include_bytes!("../fonts/DejaVuSans.ttf");

/// Registers [`FONT`] as the "sans-serif" family plotters draws text with, once per process.
fn register_font() -> anyhow::Result<()> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            plotters::style::register_font("sans-serif", plotters::style::FontStyle::Normal, FONT)
                .map_err(|_| "the embedded plot font could not be parsed".to_owned())
        })
        .clone()
        .map_err(anyhow::Error::msg)
}

/// The caption of a plot of `rows`: workload and records.
pub fn title(rows: &[Row]) -> String {
    rows.first().map_or_else(String::new, |r| {
        format!("{}: committed txn/s ({} records)", r.workload, r.records)
    })
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
    // Whole thread counts only: one label per count up to 16, else plotters' choice.
    let x_labels = match axis {
        Axis::Threads => ((x_max - x_min).round() as usize + 1).clamp(2, 17),
        Axis::Theta | Axis::ReadRatio => 10,
    };
    chart
        .configure_mesh()
        .x_labels(x_labels)
        .x_label_formatter(&|x| match axis {
            Axis::Threads => format!("{x:.0}"),
            Axis::Theta | Axis::ReadRatio => format!("{x:.2}"),
        })
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
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| draw(&e))?;
    root.present().map_err(|e| draw(&e))?;
    Ok(())
}

/// A plot to draw once the figures are safe: [`plot`]'s arguments.
#[derive(Debug, Clone)]
pub struct PlotRequest {
    /// The PNG to write.
    pub path: std::path::PathBuf,
    /// The swept variable on the x axis.
    pub axis: Axis,
    /// The plot's caption.
    pub title: String,
}

/// Checks, before anything is measured, that `path` can be created: its directory exists.
/// A run that could not write its results at the end would otherwise be lost.
pub fn check_output(path: &Path) -> anyhow::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    anyhow::ensure!(
        dir.is_dir(),
        "cannot write {}: {} is not a directory",
        path.display(),
        dir.display()
    );
    Ok(())
}

/// Reports a finished run, in an order that never loses figures: the table goes to `out`
/// first, then the JSON file is written, then the plot is drawn. A plot that cannot be drawn,
/// whatever the reason (a bad path, a font, a panic in the plotting library), is a warning on
/// `err`, not an error: the run's figures are already printed and saved. A JSON file that
/// cannot be written is an error, returned after the plot has been tried.
pub fn emit(
    rows: &[Row],
    json: Option<&Path>,
    plot_request: Option<&PlotRequest>,
    out: &mut dyn std::io::Write,
    err: &mut dyn std::io::Write,
) -> anyhow::Result<()> {
    out.write_all(table(rows).as_bytes())
        .context("printing the table")?;
    out.flush().context("printing the table")?;
    let json_result = match json {
        Some(path) => write_json(rows, path).map(|()| {
            let _ = writeln!(out, "wrote {}", path.display());
        }),
        None => Ok(()),
    };
    if let Some(req) = plot_request {
        let drawn = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            plot(rows, req.axis, &req.title, &req.path)
        }));
        match drawn {
            Ok(Ok(())) => {
                let _ = writeln!(out, "wrote {}", req.path.display());
            }
            Ok(Err(e)) => {
                let _ = writeln!(err, "warning: no plot: {e:#}{}", redraw_hint(json, req));
            }
            Err(panic) => {
                let why = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic".to_owned());
                let _ = writeln!(
                    err,
                    "warning: no plot: drawing {} failed: {why}{}",
                    req.path.display(),
                    redraw_hint(json, req)
                );
            }
        }
    }
    json_result
}

/// What a failed plot's warning adds: the figures are complete, and how to draw it later.
fn redraw_hint(json: Option<&Path>, req: &PlotRequest) -> String {
    match json {
        Some(json) if json.is_file() => format!(
            " (the figures above are complete; redraw with `keel bench --replot {} --plot {}`)",
            json.display(),
            req.path.display()
        ),
        _ => " (the figures above are complete)".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(target: &str, threads: usize, txn_per_s: f64) -> Row {
        Row {
            target: target.to_owned(),
            isolation: "strict serializable".to_owned(),
            workload: "deut".to_owned(),
            threads,
            theta: 0.9,
            read_ratio: 0.5,
            records: 1000,
            txn_per_s,
            aborts_per_s: 0.0,
            p50_us: 1.0,
            p99_us: 2.0,
            p999_us: 3.0,
            cpu_us_per_txn: Some(1.5),
            runs_txn_per_s: vec![txn_per_s],
            durability: "none".to_owned(),
            pipeline: 1,
            machine: machine(),
            seed: 1,
            command: "keel bench deut".to_owned(),
        }
    }

    fn rows() -> Vec<Row> {
        vec![
            row("keel", 1, 600_000.0),
            row("keel", 2, 1_200_000.0),
            row("ceiling-hash", 1, 900_000.0),
            row("ceiling-hash", 2, 1_800_000.0),
        ]
    }

    #[test]
    fn embedded_font_registers_and_a_plot_draws() {
        use plotters::style::{FontDesc, FontFamily, FontStyle};
        register_font().expect("the embedded font parses");
        let (w, h) = FontDesc::new(FontFamily::SansSerif, 24.0, FontStyle::Normal)
            .box_size("committed txn/s")
            .expect("the registered family lays out text");
        assert!(w > 50 && h > 10, "text box {w}x{h}");

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("deut.png");
        plot(&rows(), Axis::Threads, "deut: committed txn/s", &path).expect("plot draws");
        let png = std::fs::read(&path).unwrap();
        assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
        assert!(
            png.len() > 10_000,
            "a 1000x640 plot with text is {} bytes",
            png.len()
        );
    }

    #[test]
    fn a_plot_that_fails_keeps_the_table_and_the_json() {
        let dir = tempfile::tempdir().unwrap();
        let json = dir.path().join("results.json");
        let unwritable = PlotRequest {
            path: dir.path().join("no such directory").join("deut.png"),
            axis: Axis::Threads,
            title: "deut".to_owned(),
        };
        let (mut out, mut err) = (Vec::new(), Vec::new());
        emit(&rows(), Some(&json), Some(&unwritable), &mut out, &mut err)
            .expect("a failed plot is not an error");
        let (out, err) = (
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
        );
        assert!(out.starts_with(&table(&rows())), "table first: {out}");
        assert!(out.contains(&format!("wrote {}", json.display())), "{out}");
        assert!(err.starts_with("warning: no plot:"), "{err}");
        assert!(!unwritable.path.exists());
        let saved: Vec<serde_json::Value> =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert_eq!(saved.len(), 4);
        assert_eq!(saved[1]["txn_per_s"], 1_200_000.0);
        assert!(err.contains("--replot"), "{err}");

        // The saved rows redraw the plot later, without a run.
        let back = read_json(&json).unwrap();
        assert_eq!(back, rows());
        assert_eq!(Axis::of(&back), Axis::Threads);
        let redrawn = dir.path().join("deut.png");
        plot(&back, Axis::of(&back), &title(&back), &redrawn).unwrap();
        assert!(redrawn.is_file());

        // Nothing to plot is a warning too, and a JSON path that cannot be written is an error
        // returned after the table is out.
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let result = emit(
            &[],
            Some(&dir.path().join("nope").join("r.json")),
            Some(&unwritable),
            &mut out,
            &mut err,
        );
        assert!(result.is_err());
        assert!(String::from_utf8(out).unwrap().starts_with("target"));
        assert!(String::from_utf8(err).unwrap().contains("nothing to plot"));
    }

    #[test]
    fn outputs_are_checked_before_a_run() {
        let dir = tempfile::tempdir().unwrap();
        check_output(&dir.path().join("r.json")).unwrap();
        check_output(Path::new("r.json")).unwrap();
        assert!(check_output(&dir.path().join("missing").join("r.json")).is_err());
    }
}

//! `keel bench`: runs one workload against keel, its peers and the no-concurrency-control
//! ceilings (or against RESP servers), and reports throughput, aborts and latency.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use indicatif::{ProgressBar, ProgressStyle};
use keel_bench::report::{self, Axis, Row};
use keel_bench::target::{self, Durability, Open, Target};
use keel_bench::workload::{Params, Stream, Workload};
use keel_bench::{resp, run};

/// Options of `keel bench`.
///
/// Runs WORKLOAD against every target in --target (or every server in --server), for every
/// combination of --threads, --theta and --read-ratio. Keys are drawn before timing, loading
/// is not timed, warm-up is discarded, and each figure is the median of --runs runs.
#[derive(clap::Args)]
#[command(
    after_help = "Workloads: deut, deut-write, ycsb-a, ycsb-b, ycsb-c, ycsb-d, ycsb-e, \
ycsb-f, incr1, like, bid, mgp (see BENCHMARKS.md).\n\
Targets: keel, ceiling-array, ceiling-hash; with --features peers also rocksdb-occ, \
rocksdb-pess, fjall, redb, lmdb.\n\
Example: keel bench deut --target keel,ceiling-array --threads 1,2 --theta 0.8,0.9 --plot deut.png"
)]
pub struct Args {
    /// The workload: deut, deut-write, ycsb-a ... ycsb-f, incr1, like, bid or mgp.
    #[arg(required_unless_present = "replot")]
    workload: Option<String>,
    /// Client threads (connections in server mode); a comma-separated list sweeps them.
    #[arg(long, value_delimiter = ',', default_value = "2")]
    threads: Vec<usize>,
    /// Records loaded before the run (pages and users each for like, auctions for bid).
    /// Default: 10M for deut and ycsb, 1M for incr1, like, bid and mgp.
    #[arg(long)]
    records: Option<u64>,
    /// Zipfian skew θ of key choice (0 = uniform); a comma-separated list sweeps it.
    #[arg(long, value_delimiter = ',', default_value = "0.8")]
    theta: Vec<f64>,
    /// Share of read-only transactions (deut, like, ycsb-a..e) or of plain reads against
    /// read-modify-writes (ycsb-f); default: the workload's own. A list sweeps it.
    #[arg(long, value_delimiter = ',')]
    read_ratio: Vec<f64>,
    /// incr1: probability that a transaction increments the hot key (else a uniform key).
    #[arg(long, default_value_t = 1.0)]
    hot: f64,
    /// Length of each timed run: 10s, 500ms, 2m, or plain seconds.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    duration: Duration,
    /// Warm-up before each timed run, discarded.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    warmup: Duration,
    /// Timed runs per target and configuration; the median is reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Seed of all key and operation draws; the same seed draws the same streams.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Durability, matched across targets: none (memory only / no WAL), async (log without
    /// fsync per commit; keel fsyncs once a second) or sync (fsync before each commit is
    /// acknowledged). The ceilings support only none.
    #[arg(long, default_value = "none")]
    durability: Durability,
    /// keel's splitting of contended records (Doppel): auto (split records whose lock is
    /// contended, join them when reads dominate), off, or force (split every record a
    /// commutative operation touches). Other targets ignore it.
    #[arg(long, default_value = "auto")]
    split: keel::SplitMode,
    /// Embedded targets, comma-separated, in table order (ratios compare with the first):
    /// keel, keel/auto, keel/off, keel/force (keel with that split mode, so variants run side
    /// by side), ceiling-array, ceiling-hash, and with the `peers` feature rocksdb-occ,
    /// rocksdb-pess, fjall, redb, lmdb.
    #[arg(long, value_delimiter = ',', default_value = "keel")]
    target: Vec<String>,
    /// Drive RESP servers instead of embedded targets: comma-separated `host:port` or
    /// `label=host:port` (e.g. redis=127.0.0.1:6379,keel=127.0.0.1:7379). The records are
    /// loaded with MSET first. A target may join several addresses with `+` (a cluster's
    /// nodes, e.g. keel3=127.0.0.1:7001+127.0.0.1:7002+127.0.0.1:7003): the connections go
    /// to them in turn (see --route).
    #[arg(long, value_delimiter = ',')]
    server: Vec<String>,
    /// Server mode, a cluster: `turn` sends each connection's transactions to one node, the
    /// nodes in turn (a node forwards what another owns); `slot` routes as a cluster client
    /// does: every connection opens a socket to each node that `CLUSTER SLOTS` names and sends
    /// each transaction to the node owning its first key's slot (the coordinator of a
    /// transaction that spans nodes). Loading is routed the same way.
    #[arg(long, default_value = "turn")]
    route: resp::Route,
    /// Server mode: transactions in flight per connection (pipelining depth).
    #[arg(long, default_value_t = 1)]
    pipeline: usize,
    /// Server mode: store record `r` behind the hash tag `{r % 1024}` and move every key of a
    /// transaction into its first key's group, so that a transaction's keys share one slot
    /// (one partition of a cluster, as Redis Cluster requires of a MULTI). The records read
    /// and written stay those of the workload's distribution, each moved within its stride
    /// of 1024.
    #[arg(long)]
    hash_tags: bool,
    /// Transactions drawn per thread before timing; a thread that finishes its stream starts
    /// it again.
    #[arg(long, default_value_t = 1 << 20)]
    stream_txns: usize,
    /// Directory for the on-disk peers' files (a temporary directory is made inside it).
    #[arg(long, default_value_os_t = std::env::temp_dir())]
    dir: PathBuf,
    /// Write the results as a JSON array (one object per target and configuration).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Draw committed txn/s against the swept variable (threads, else theta, else read
    /// ratio) into this PNG.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Run nothing: draw --plot from the rows of an earlier run's --json file (for a plot
    /// that could not be drawn at the end of that run).
    #[arg(long, requires = "plot", conflicts_with = "json")]
    replot: Option<PathBuf>,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (number, unit) = s
        .find(|c: char| c.is_ascii_alphabetic())
        .map_or((s, "s"), |i| s.split_at(i));
    let n: f64 = number
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 10s, 500ms or 2m"))?;
    let seconds = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        _ => return Err(format!("unknown unit {unit:?} in {s:?}; use ms, s or m")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{s:?}: {e}"))
}

/// What a run is pointed at.
enum Spec {
    Embedded(String),
    Server { label: String, addr: String },
}

impl Spec {
    fn name(&self) -> &str {
        match self {
            Spec::Embedded(name) => name,
            Spec::Server { label, .. } => label,
        }
    }
}

fn bar(len: u64, template: &str) -> ProgressBar {
    let style = ProgressStyle::with_template(template)
        .expect("valid progress template")
        .progress_chars("=> ");
    ProgressBar::new(len).with_style(style)
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if let (Some(json), Some(png)) = (&args.replot, &args.plot) {
        let rows = report::read_json(json)?;
        report::plot(&rows, Axis::of(&rows), &report::title(&rows), png)?;
        println!("wrote {}", png.display());
        return Ok(());
    }
    let workload: Workload = args
        .workload
        .as_deref()
        .context("a workload is required")?
        .parse()?;
    anyhow::ensure!(args.runs >= 1, "--runs must be at least 1");
    anyhow::ensure!(
        args.threads.iter().all(|&t| t >= 1),
        "--threads must be at least 1"
    );
    let machine = report::machine();
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    println!("machine: {machine}");
    if let Some(load) = report::load_average() {
        println!("load average at start: {load:.2}");
    }
    println!("command: {command}");
    // Fail (JSON) or warn (plot) now about an output that could not be written at the end.
    if let Some(path) = &args.json {
        report::check_output(path)?;
    }
    if let Some(path) = &args.plot
        && let Err(e) = report::check_output(path)
    {
        eprintln!("warning: {e:#}; the run goes on, but its plot will not be drawn");
    }

    let mut configs = Vec::new();
    let read_ratios = if args.read_ratio.is_empty() {
        vec![workload.default_read_ratio()]
    } else {
        args.read_ratio.clone()
    };
    for &threads in &args.threads {
        for &theta in &args.theta {
            for &read_ratio in &read_ratios {
                let mut p = Params::new(workload);
                p.records = args.records.unwrap_or(p.records);
                p.theta = theta;
                p.read_ratio = read_ratio;
                p.hot = args.hot;
                p.threads = threads;
                p.stream_txns = args.stream_txns;
                p.seed = args.seed;
                configs.push(p);
            }
        }
    }

    // Draw every configuration's keys before anything is timed.
    let mut streams: Vec<Vec<Stream>> = Vec::new();
    for p in &configs {
        let pb = bar(
            p.threads as u64,
            "drawing keys {bar:30} {pos}/{len} threads {msg}",
        );
        pb.set_message(format!("(threads={} theta={})", p.threads, p.theta));
        let drawn: anyhow::Result<Vec<Stream>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..p.threads)
                .map(|t| {
                    let pb = &pb;
                    s.spawn(move || {
                        let stream = p.stream(t);
                        pb.inc(1);
                        stream
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("key drawing does not panic"))
                .collect()
        });
        pb.finish_and_clear();
        streams.push(drawn.context("drawing the key streams")?);
    }
    let base = &configs[0];
    let key_space = streams
        .iter()
        .map(|s| keel_bench::workload::key_space(base, s))
        .max()
        .unwrap_or(0);

    let specs: Vec<Spec> = if args.server.is_empty() {
        args.target
            .iter()
            .map(|t| Spec::Embedded(t.clone()))
            .collect()
    } else {
        args.server
            .iter()
            .map(|s| match s.split_once('=') {
                Some((label, addr)) => Spec::Server {
                    label: label.to_owned(),
                    addr: addr.to_owned(),
                },
                None => Spec::Server {
                    label: format!("resp:{s}"),
                    addr: s.clone(),
                },
            })
            .collect()
    };

    let timing = run::Timing {
        warmup: args.warmup,
        duration: args.duration,
    };
    let mut rows: Vec<Row> = Vec::new();
    for spec in &specs {
        let target: Box<dyn Target> = match spec {
            Spec::Embedded(name) => target::open(
                name,
                &Open {
                    key_space,
                    durability: args.durability,
                    dir: args.dir.clone(),
                    split: args.split,
                },
            )
            .with_context(|| format!("opening target {name}"))?,
            Spec::Server { label, addr } => Box::new(resp::Server::connect(
                label,
                addr,
                args.pipeline,
                workload,
                args.route,
                args.hash_tags.then(|| base.initial_keys()),
            )?),
        };
        let name = spec.name();
        let total = base.initial_keys();
        let pb = bar(
            total,
            "loading {msg} {bar:30} {pos}/{len} records, {per_sec}, eta {eta}",
        );
        pb.set_message(name.to_owned());
        let mut records = (0..total).map(|k| (k, base.initial_value(k)));
        target
            .load(&mut records, &mut |n| pb.set_position(n))
            .with_context(|| format!("loading {name}"))?;
        pb.finish_and_clear();
        eprintln!("{name}: loaded {total} records");

        for (p, streams) in configs.iter().zip(&streams) {
            let mut measured = Vec::new();
            for r in 0..args.runs {
                let total_ms = (timing.warmup + timing.duration).as_millis() as u64;
                let pb = bar(total_ms, "{msg} {bar:30} {elapsed}");
                pb.set_message(format!(
                    "{name} {workload} threads={} theta={} run {}/{}",
                    p.threads,
                    p.theta,
                    r + 1,
                    args.runs
                ));
                let m = run::run(target.as_ref(), streams, timing, &mut |t| {
                    pb.set_position(t.as_millis() as u64)
                })
                .with_context(|| format!("running {workload} against {name}"))?;
                pb.finish_and_clear();
                measured.push(m);
            }
            let runs_txn_per_s: Vec<f64> = measured.iter().map(|m| m.txn_per_s()).collect();
            measured.sort_by(|a, b| a.txn_per_s().total_cmp(&b.txn_per_s()));
            let median = &measured[measured.len() / 2];
            let row = Row {
                target: name.to_owned(),
                isolation: target.isolation().to_owned(),
                workload: workload.name().to_owned(),
                threads: p.threads,
                theta: p.theta,
                read_ratio: p.read_ratio,
                records: p.records,
                txn_per_s: median.txn_per_s(),
                aborts_per_s: median.aborts_per_s(),
                p50_us: median.latency_us(50.0),
                p99_us: median.latency_us(99.0),
                p999_us: median.latency_us(99.9),
                cpu_us_per_txn: args.server.is_empty().then(|| median.cpu_us_per_txn()),
                runs_txn_per_s,
                durability: target.durability().to_owned(),
                pipeline: if args.server.is_empty() {
                    1
                } else {
                    args.pipeline
                },
                machine: machine.clone(),
                seed: p.seed,
                command: command.clone(),
            };
            eprintln!(
                "{name}: threads={} theta={} reads={}: {:.0} txn/s, {:.0} aborts/s (runs: {:?})",
                row.threads,
                row.theta,
                row.read_ratio,
                row.txn_per_s,
                row.aborts_per_s,
                row.runs_txn_per_s
                    .iter()
                    .map(|x| x.round())
                    .collect::<Vec<_>>()
            );
            rows.push(row);
        }
    }

    println!(
        "workload {workload}, {} records, durability {}, {} run(s) of {:?} after {:?} warm-up, median shown",
        base.records,
        args.durability.name(),
        args.runs,
        args.duration,
        args.warmup
    );
    let plot = args.plot.as_ref().map(|path| report::PlotRequest {
        path: path.clone(),
        axis: Axis::of(&rows),
        title: report::title(&rows),
    });
    report::emit(
        &rows,
        args.json.as_deref(),
        plot.as_ref(),
        &mut std::io::stdout().lock(),
        &mut std::io::stderr().lock(),
    )?;
    Ok(())
}

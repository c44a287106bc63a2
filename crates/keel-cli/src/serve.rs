//! `keel serve`: settings from flags and `--config keel.toml`, logging, the banner, signals.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use anyhow::Context as _;
use keel_server::{Config, FileConfig};

/// Options of `keel serve`. A flag given here wins over the same setting in `--config`.
#[derive(clap::Args)]
pub struct Args {
    /// TOML file with the same settings as these flags (`port = 6380`, `requirepass = "..."`).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Address to listen on. A non-loopback address needs --requirepass or --protected-mode no.
    #[arg(long, value_name = "IP")]
    bind: Option<IpAddr>,
    /// Port to listen on [default: 6379; 0 picks a free port].
    #[arg(long)]
    port: Option<u16>,
    /// Data directory: the write-ahead log and checkpoints [default: ./keel-data].
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// sync (reply after fsync; concurrent writers share fsyncs) | async:<ms> (reply once
    /// written to the OS, fsync at least every ms: a kill -9 loses nothing replied to, a
    /// machine crash up to ms) | none (memory only, no files) [default: sync].
    #[arg(long, value_name = "MODE")]
    durability: Option<String>,
    /// Password clients must give with AUTH (or HELLO ... AUTH) before anything else.
    #[arg(long, value_name = "PASSWORD")]
    requirepass: Option<String>,
    /// yes | no [default: yes]: refuse to bind a non-loopback address without a password.
    #[arg(long, value_name = "yes|no")]
    protected_mode: Option<String>,
    /// Serve Prometheus metrics (text format) on this address, e.g. 127.0.0.1:9121.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<SocketAddr>,
    /// Largest bulk string a client may send, in bytes [default: 16777216, keel's value limit].
    #[arg(long, value_name = "BYTES")]
    proto_max_bulk_len: Option<i64>,
    /// Most simultaneous clients [default: 10000].
    #[arg(long, value_name = "N")]
    maxclients: Option<usize>,
    /// Split contended keys into per-core slices (Doppel phase reconciliation), so that
    /// concurrent KEEL.ADD/KEEL.MAX/KEEL.MIN on one hot key stop serializing: auto (split a key
    /// once commits often wait for its lock, join it again when reads dominate) | off (never)
    /// | force (split every key those commands touch, keep it split) [default: auto]. INCR and
    /// other commands that reply with the value never go to slices; a command that reads a
    /// split key waits for the next reconciliation (at most about 2 phases).
    #[arg(long, value_name = "auto|off|force")]
    split: Option<String>,
    /// Length of one split phase in milliseconds (1 to 10000): how often split keys are
    /// reconciled, and so about how long a read of a split key may wait [default: 20].
    #[arg(long, value_name = "MS")]
    split_phase_ms: Option<u64>,
    /// Worker threads serving connections (1 to 1024) [default: one per core]. When clients
    /// run on the same few cores, fewer may use less CPU per request: measure.
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// Where connections run: off | on [default: off]. `off`: the worker pool (--threads),
    /// which grows with cores; best with the server on cores of its own. `on`: one thread
    /// serves every connection and keeps polling while requests keep coming (no sleep, no
    /// hand-offs between threads, commands never overlap), better while one core keeps up,
    /// as for unpipelined clients on the same few cores. With `off`, connections whose
    /// commands keep conflicting on one hot key run on that thread while they use it.
    /// CONFIG SET poller changes it at run time. On the poller a long command (KEYS over millions of keys)
    /// delays the other connections until it ends, as in Redis. (BENCHMARKS.md, "Which
    /// lane serves connections", has the measurements.)
    #[arg(long, value_name = "off|on")]
    poller: Option<String>,
    /// How long the poller keeps polling after its last request before it sleeps, in
    /// microseconds (0 to 1000000; 0: sleep at once) [default: 100]. Polling keeps a core
    /// busy while any client sends at least one request per this interval. Under 10 000
    /// commands/s or more it polls at least 2000 µs (unless this is 0 or durability is sync):
    /// a poller that sleeps in a short gap of a heavy load makes the next requests wait for
    /// it to wake. Under sync the gaps are fsyncs, and the flusher needs the core. On a
    /// cluster node the default is 0: replies wait for other nodes.
    #[arg(long, value_name = "US")]
    idle_poll_us: Option<u64>,
    /// When a pub/sub subscriber that does not read its messages is disconnected, as Redis
    /// writes it: "pubsub <hard> <soft> <soft-seconds>" [default: "pubsub 32mb 8mb 60"]: at
    /// once past the hard limit of unwritten bytes, or after staying past the soft one that
    /// long (0 turns a limit off). CONFIG SET client-output-buffer-limit changes it at run time.
    #[arg(long, value_name = "LIMITS")]
    client_output_buffer_limit: Option<String>,
    /// Cluster mode, with the cluster's config file (TOML; the same file on every node):
    /// `myself = "n1"`, `timeout-ms = 2000`, and one `[[node]]` per node with `id`, `addr`
    /// (the client address, HOST:PORT) and `slots` ("0-5460"). Every slot 0-16383 must have
    /// exactly one owner. The node listens on its `addr`'s port unless --port says so (it
    /// must then agree). Any node serves any key: commands for other nodes' slots are
    /// forwarded (cluster-aware clients get MOVED instead). To try one locally:
    /// `keel cluster demo`. See docs/cluster.md.
    #[arg(long, value_name = "FILE")]
    cluster: Option<PathBuf>,
    /// Cluster mode without a file: one node of the cluster as ID,HOST:PORT,SLOTS[,SLOTS...]
    /// (e.g. n1,127.0.0.1:7001,0-5460); repeat it for every node.
    #[arg(long, value_name = "NODE", conflicts_with = "cluster")]
    cluster_node: Vec<String>,
    /// Which node of the cluster this is (its id); wins over `myself` in the cluster file.
    #[arg(long, value_name = "ID")]
    cluster_myself: Option<String>,
    /// How long a command forwarded to another node may take before it fails with
    /// CLUSTERDOWN, in milliseconds (1 to 600000) [default: 2000, or the file's timeout-ms].
    #[arg(long, value_name = "MS")]
    cluster_timeout_ms: Option<u64>,
    /// Cluster mode: keep each partition (the slots of one node in the config) on this many
    /// nodes, in step by Raft: partition p on nodes p, p+1, ... (round the config's list). A
    /// write is acknowledged once a majority of its partition's replicas have it (durable
    /// under --durability sync); a leader's death is survived with nothing acknowledged lost.
    /// Every node must be started with the same value. 1: no replication. Transactions
    /// across partitions run two-phase commit over the partitions' logs (docs/replication.md)
    /// [default: 3 when the cluster has three nodes or more, else 1].
    #[arg(long, value_name = "R")]
    replicas: Option<usize>,
    /// Join a running replicated cluster through one of its nodes (HOST:PORT), as node
    /// --cluster-myself ID listening on --bind (default 127.0.0.1) and --port, which must be
    /// given: the cluster adds a partition on this node (with no slots until `keel cluster
    /// rebalance` moves some to it) and moves replicas of other partitions here. A node that
    /// joined restarts with the same flags (or, if the cluster cannot be reached, from the
    /// view kept in --dir). `keel cluster remove-node ID` takes a node out.
    #[arg(long, value_name = "HOST:PORT", conflicts_with_all = ["cluster", "cluster_node"])]
    cluster_join: Option<String>,
}

/// How long a joining node keeps asking the cluster before it gives up.
const JOIN_PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

/// Joins the cluster `--cluster-join` names: its configuration with this node in it, and the
/// view that placed it.
fn join(
    args: &Args,
    seed: &str,
) -> anyhow::Result<(
    keel_server::cluster_map::Membership,
    keel_server::ClusterView,
)> {
    use std::net::ToSocketAddrs;
    let id = args
        .cluster_myself
        .as_deref()
        .context("--cluster-join needs --cluster-myself ID: the id this node takes")?;
    let port = args
        .port
        .filter(|&p| p != 0)
        .context("--cluster-join needs --port: the port the other nodes reach this one on")?;
    let bind: std::net::IpAddr = args
        .bind
        .unwrap_or_else(|| std::net::Ipv4Addr::LOCALHOST.into());
    anyhow::ensure!(
        !bind.is_unspecified(),
        "--cluster-join needs --bind to be the address the other nodes reach this one at, \
         not {bind}"
    );
    let addr = std::net::SocketAddr::new(bind, port);
    let seed_addr = seed
        .to_socket_addrs()
        .with_context(|| format!("--cluster-join {seed:?} is not HOST:PORT"))?
        .next()
        .with_context(|| format!("--cluster-join {seed:?} names no address"))?;
    let dir = args.dir.clone().unwrap_or_else(|| Config::default().dir);
    let stored = keel_server::stored_view(&dir).map_err(anyhow::Error::msg)?;
    let started = std::time::Instant::now();
    let mut said = std::time::Instant::now() - std::time::Duration::from_secs(10);
    let view = loop {
        match keel_server::ask_to_join(
            seed_addr,
            id,
            addr,
            args.requirepass.as_deref(),
            std::time::Duration::from_secs(10),
        ) {
            Ok(view) => break view,
            Err(keel_server::JoinError::Refused(e)) => {
                anyhow::bail!("the cluster at {seed} refused node {id} at {addr}: {e}")
            }
            Err(keel_server::JoinError::Unreachable(e)) => {
                if let Some(view) = stored.as_ref().filter(|v| v.index(id).is_some()) {
                    eprintln!(
                        "keel: the cluster at {seed} cannot be reached ({e}); starting from \
                         the view kept in {} (epoch {})",
                        dir.display(),
                        view.epoch
                    );
                    break view.clone();
                }
                anyhow::ensure!(
                    started.elapsed() < JOIN_PATIENCE,
                    "the cluster at {seed} cannot be reached: {e}"
                );
                if said.elapsed() >= std::time::Duration::from_secs(5) {
                    eprintln!("keel: waiting for the cluster at {seed} ({e})");
                    said = std::time::Instant::now();
                }
                std::thread::sleep(std::time::Duration::from_millis(500));
            }
        }
    };
    let me = view
        .index(id)
        .with_context(|| format!("the cluster at {seed} answered a view without node {id}"))?;
    if let Some(r) = args.replicas {
        anyhow::ensure!(
            r == view.r,
            "--replicas {r}: the cluster keeps {} replicas of each partition",
            view.r
        );
    }
    let map = view
        .membership(me)
        .context("the cluster's view does not make a configuration")?;
    Ok((map, view))
}

/// The cluster configuration the flags give, if any.
fn membership(args: &Args) -> anyhow::Result<Option<keel_server::cluster_map::Membership>> {
    use keel_server::cluster_map::Membership;
    let myself = args.cluster_myself.as_deref();
    let timeout = args.cluster_timeout_ms;
    if let Some(path) = &args.cluster {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the cluster config {}", path.display()))?;
        let map = Membership::from_toml(&text, myself, timeout)
            .with_context(|| format!("in {}", path.display()))?;
        return Ok(Some(map));
    }
    if !args.cluster_node.is_empty() {
        return Ok(Some(Membership::from_flags(
            &args.cluster_node,
            myself,
            timeout,
        )?));
    }
    anyhow::ensure!(
        (myself.is_none() || args.cluster_join.is_some()) && timeout.is_none(),
        "--cluster-myself and --cluster-timeout-ms need --cluster or --cluster-node"
    );
    Ok(None)
}

fn config(args: Args) -> anyhow::Result<Config> {
    let mut config = Config::default();
    if let Some(seed) = &args.cluster_join {
        let (map, view) = join(&args, seed)?;
        config.port = map.me().addr.port();
        config.bind = map.me().addr.ip();
        config.set_cluster(std::sync::Arc::new(map));
        config.replicas = view.r;
        config.cluster_view = Some(view);
    } else if let Some(map) = membership(&args)? {
        // The node listens where its peers and MOVED send clients, unless told otherwise.
        config.port = map.me().addr.port();
        config.bind = map.me().addr.ip();
        config.set_cluster(std::sync::Arc::new(map));
    }
    anyhow::ensure!(
        args.replicas.is_none_or(|r| r == 1) || config.cluster.is_some(),
        "--replicas needs --cluster or --cluster-node"
    );
    // Three copies of every partition once there are three nodes to keep them.
    let nodes = config.cluster.as_ref().map_or(1, |m| m.nodes().len());
    if config.cluster_view.is_none() {
        config.replicas = args.replicas.unwrap_or(if nodes >= 3 { 3 } else { 1 });
    }
    if let Some(path) = &args.config {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        FileConfig::parse(&text)
            .and_then(|f| f.apply(&mut config))
            .with_context(|| format!("in {}", path.display()))?;
    }
    if let Some(b) = args.bind {
        config.bind = b;
    }
    if let Some(p) = args.port {
        config.port = p;
    }
    if let Some(d) = args.dir {
        config.dir = d;
    }
    if let Some(d) = args.durability {
        config.durability = d.parse()?;
    }
    if let Some(p) = args.requirepass {
        config.requirepass = Some(p).filter(|p| !p.is_empty());
    }
    if let Some(p) = args.protected_mode {
        config.protected_mode = match p.as_str() {
            "yes" => true,
            "no" => false,
            other => anyhow::bail!("--protected-mode takes yes or no, not {other:?}"),
        };
    }
    if let Some(m) = args.metrics {
        config.metrics = Some(m);
    }
    if let Some(n) = args.proto_max_bulk_len {
        config.proto_max_bulk_len = n;
    }
    if let Some(n) = args.maxclients {
        config.maxclients = n;
    }
    if let Some(s) = args.split {
        config.split = keel_server::parse_split(&s)?;
    }
    if let Some(ms) = args.split_phase_ms {
        config.split_phase_ms = ms;
    }
    if let Some(n) = args.threads {
        anyhow::ensure!(
            n > 0,
            "--threads must be at least 1 (leave it out for one per core)"
        );
        config.threads = n;
    }
    if let Some(p) = args.poller {
        config.poller = keel_server::parse_poller(&p)?;
    }
    if let Some(us) = args.idle_poll_us {
        config.idle_poll_us = us;
    }
    if let Some(limit) = args.client_output_buffer_limit
        && let Some(pubsub) = keel_server::OutputLimit::parse(&limit)
            .map_err(|e| anyhow::anyhow!("--client-output-buffer-limit: {e}"))?
    {
        config.pubsub_output_limit = pubsub;
    }
    config.validate()?;
    Ok(config)
}

/// `println!` that ignores a closed stdout: the banner is for a human, and a server whose
/// output nobody reads any more (`keel serve | head -3`) must keep serving, not panic.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

pub fn run(args: Args) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=off")),
        )
        .with_writer(std::io::stderr)
        .init();
    let config = config(args)?;
    let config_poller = config.poller.name();
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if config.threads > 0 {
        runtime.worker_threads(config.threads);
    }
    let threads = match config.threads {
        0 => std::thread::available_parallelism().map_or(1, usize::from),
        n => n,
    };
    let runtime = runtime
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(async move {
        // Catch SIGTERM/SIGINT from here on: a signal that arrives while recovery runs or the
        // banner prints must still mean a clean shutdown, not the default instant death.
        let signals = Signals::install();
        let durability = config.durability;
        let split = format!("{} (phase {} ms)", config.split, config.split_phase_ms);
        let dir = config.dir.clone();
        let cluster = config.cluster.clone();
        let replicas = config.replicas;
        let server = keel_server::Server::bind(config).await?;
        say!("keel {} (Redis protocol {})", keel_server::VERSION, keel_server::REDIS_VERSION);
        say!("listening on   {}", server.local_addr());
        if let Some(m) = server.metrics_addr() {
            say!("metrics on     http://{m}/metrics");
        }
        say!("threads        {threads} (poller {})", config_poller);
        if let Some(map) = &cluster {
            let me = map.me();
            let slots: Vec<String> = me
                .slots
                .iter()
                .map(|r| format!("{}-{}", r.start(), r.end()))
                .collect();
            say!(
                "cluster        node {} of {}, slots {}, config digest {:016x}",
                me.id,
                map.nodes().len(),
                slots.join(" "),
                map.digest()
            );
            if replicas > 1 {
                say!("replicas       {replicas} per partition (Raft)");
            }
        }
        match server.recovery() {
            None => {
                say!("data directory none (durability none: data lives in memory only)");
                say!("durability     none");
                say!("split          {split}");
            }
            Some(r) => {
                say!("data directory {}", dir.display());
                say!("durability     {durability}");
                say!("split          {split}");
                let checkpoint = match &r.checkpoint {
                    Some((name, keys)) => format!("checkpoint {name} ({keys} keys)"),
                    None => "no checkpoint".into(),
                };
                say!(
                    "recovery       {checkpoint}, {} log frames ({} bytes) replayed, last ts {}, {:.1?}",
                    r.log_frames, r.log_bytes, r.last_ts.0, r.elapsed
                );
                if let Some((file, offset, bytes)) = &r.torn_tail {
                    say!(
                        "               cut a torn log tail: {bytes} bytes at {} offset {offset}",
                        file.display()
                    );
                }
            }
        }
        let handle = server.handle();
        tokio::spawn(async move {
            signals.wait().await;
            tracing::info!("signal received, shutting down");
            handle.shutdown();
        });
        server.run().await.context("closing the database")?;
        Ok::<(), anyhow::Error>(())
    })
}

/// The shutdown signals, registered with the runtime.
pub enum Signals {
    Unix {
        term: tokio::signal::unix::Signal,
        int: tokio::signal::unix::Signal,
    },
    /// Registration failed: fall back to Ctrl-C alone.
    CtrlC,
}

impl Signals {
    pub fn install() -> Signals {
        use tokio::signal::unix::{SignalKind, signal};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(term), Ok(int)) => Signals::Unix { term, int },
            _ => Signals::CtrlC,
        }
    }

    pub async fn wait(self) {
        match self {
            Signals::Unix { mut term, mut int } => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            Signals::CtrlC => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
}

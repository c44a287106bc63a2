//! `keel cluster demo N`: a whole local cluster in one process, for trying it out (as
//! `cockroach demo` does). Each node is a full `keel serve --cluster` server on its own
//! loopback port; the slots are split evenly in order. Real deployments run one
//! `keel serve --cluster FILE` per node instead.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use keel_server::cluster_map::Membership;
use keel_server::{Config, Durability};

/// `keel cluster ...`.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Start a local N-node cluster on loopback ports (Ctrl-C stops every node).
    ///
    /// Any node serves any key: redis-cli on any port sets and gets keys of every slot
    /// (commands for another node's slots are forwarded to it). Cluster-aware clients
    /// (`redis-cli -c`, redis-py RedisCluster, redis-rs ClusterClient) read the slot map with
    /// CLUSTER SLOTS and go to each key's node themselves. Commands and transactions whose
    /// keys are on several nodes answer CROSSSLOT for now (see docs/cluster.md).
    Demo(DemoArgs),
}

/// Options of `keel cluster demo`.
#[derive(clap::Args)]
pub struct DemoArgs {
    /// Nodes to start (1 to 64).
    #[arg(default_value_t = 3)]
    nodes: usize,
    /// Port of the first node; node i listens on this + i - 1 (0: any free ports).
    #[arg(long, default_value_t = 7001)]
    port: u16,
    /// Keep each node's data under DIR/node-<i> with sync durability; without it the nodes
    /// keep their data in memory only and lose it when the demo stops.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// How long a command forwarded to another node may take before CLUSTERDOWN, in ms.
    #[arg(long, value_name = "MS", default_value_t = keel_server::cluster_map::membership::TIMEOUT_MS_DEFAULT)]
    timeout_ms: u64,
}

/// Most nodes one demo starts.
const DEMO_NODES_MAX: usize = 64;

pub fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        Command::Demo(demo) => run_demo(demo),
    }
}

macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

fn run_demo(args: DemoArgs) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,openraft=off")),
        )
        .with_writer(std::io::stderr)
        .init();
    anyhow::ensure!(
        (1..=DEMO_NODES_MAX).contains(&args.nodes),
        "a demo cluster has 1 to {DEMO_NODES_MAX} nodes, not {}",
        args.nodes
    );
    // Every socket is bound before any node starts, so each node's config names the others'
    // real ports and nothing can take a port in between.
    let mut listeners = Vec::with_capacity(args.nodes);
    for i in 0..args.nodes {
        let port = match args.port {
            0 => 0,
            p => u16::try_from(usize::from(p) + i)
                .ok()
                .context("the nodes' ports must stay below 65536")?,
        };
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let listener = TcpListener::bind(addr).with_context(|| {
            format!("cannot listen on {addr} (pick other ports with --port, or --port 0)")
        })?;
        listeners.push(listener);
    }
    let addrs: Vec<SocketAddr> = listeners
        .iter()
        .map(TcpListener::local_addr)
        .collect::<Result<_, _>>()
        .context("reading a listening socket's address")?;
    // The nodes' transport (bus) sockets: client port + 10000 as Redis Cluster's, or any
    // free ports with --port 0.
    let mut buses = Vec::with_capacity(args.nodes);
    for addr in &addrs {
        let port = match args.port {
            0 => 0,
            _ => addr
                .port()
                .checked_add(keel_server::BUS_PORT_OFFSET)
                .context("the nodes' bus ports (port + 10000) must stay below 65536")?,
        };
        let bus = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let listener = TcpListener::bind(bus).with_context(|| {
            format!("cannot listen on {bus} for the cluster bus (pick other ports with --port)")
        })?;
        buses.push(Arc::new(listener));
    }
    let bus_addrs: Vec<SocketAddr> = buses
        .iter()
        .map(|l| l.local_addr())
        .collect::<Result<_, _>>()
        .context("reading a listening socket's address")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(async move {
        let signals = crate::serve::Signals::install();
        let mut servers = Vec::with_capacity(args.nodes);
        for (i, listener) in listeners.into_iter().enumerate() {
            let map = Membership::even(&addrs, i, args.timeout_ms)?;
            let mut config = Config::default();
            config.bind = Ipv4Addr::LOCALHOST.into();
            match &args.dir {
                Some(dir) => {
                    config.dir = dir.join(format!("node-{}", i + 1));
                    config.durability = Durability::Sync;
                }
                None => config.durability = Durability::None,
            }
            config.cluster = Some(Arc::new(map));
            config.cluster_bus = bus_addrs.clone();
            config.cluster_bus_listener = Some(Arc::clone(&buses[i]));
            let server = keel_server::Server::with_listener(config, listener)
                .await
                .with_context(|| format!("starting node-{}", i + 1))?;
            servers.push(server);
        }
        say!(
            "keel {} cluster demo: {} nodes on loopback, slots split evenly ({})",
            keel_server::VERSION,
            args.nodes,
            match &args.dir {
                Some(d) => format!("data under {}", d.display()),
                None => "data in memory only".into(),
            }
        );
        for (i, addr) in addrs.iter().enumerate() {
            let (start, end) = keel_server::cluster_map::membership::even_range(i, args.nodes);
            say!("  node-{}  {addr}  slots {start}-{end}", i + 1);
        }
        let first = addrs[0].port();
        say!("try:");
        say!("  redis-cli -p {first} set hello world       # any node serves any key");
        say!("  redis-cli -p {} get hello", addrs[addrs.len() - 1].port());
        say!("  redis-cli -p {first} -c                    # cluster-aware: follows MOVED");
        say!("  redis-cli -p {first} cluster slots");
        say!("Ctrl-C stops every node.");
        let handles: Vec<_> = servers.iter().map(keel_server::Server::handle).collect();
        let mut running = Vec::with_capacity(servers.len());
        for server in servers {
            running.push(tokio::spawn(server.run()));
        }
        signals.wait().await;
        say!("stopping {} nodes", handles.len());
        for h in &handles {
            h.shutdown();
        }
        for (i, r) in running.into_iter().enumerate() {
            r.await
                .context("a node's task panicked")?
                .with_context(|| format!("closing node-{}", i + 1))?;
        }
        Ok::<(), anyhow::Error>(())
    })
}

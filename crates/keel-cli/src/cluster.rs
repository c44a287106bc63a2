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
    /// CLUSTER SLOTS and go to each key's node themselves. MULTI … EXEC (and WATCH) over keys
    /// of several nodes runs as one serializable transaction across them (two-phase commit),
    /// as does any command whose keys are on several nodes (SUNIONSTORE, ZUNION, SMOVE,
    /// RENAME, ...; read whole and written back when they are not split key by key), except
    /// the blocking pops and such commands inside MULTI, which answer CROSSSLOT. Hash tags
    /// (`{user1}:a`, `{user1}:b`) keep keys on one node (see docs/cluster.md).
    Demo(DemoArgs),
    /// Start a local N-node cluster as N separate `keel serve` processes, each partition
    /// replicated on R of them (Raft), with data under DIR/node-<i>.
    ///
    /// Kill one node (`kill -9 <pid>`, the pids are printed) and the others keep serving:
    /// each of its partitions elects a new leader within a few seconds, and nothing
    /// acknowledged is lost. This command restarts a node that died after a few seconds
    /// (unless --no-restart), and the node catches up from its peers. Ctrl-C stops them all.
    /// Nodes join such a cluster with `keel serve --cluster-join` (this command prints the
    /// line) and leave it with `keel cluster remove-node`.
    Start(StartArgs),
    /// Even out the slots over a replicated cluster's partitions, online.
    ///
    /// Reads the slot map from one node (CLUSTER NODES: each node's line lists the slots of
    /// the partition it is home to), then moves slots from the partitions that hold more than
    /// their share to those that hold less with KEEL.MOVESLOTS, a batch at a time, each
    /// batch one transaction (clients keep working; requests for a moving slot wait for it).
    /// Prints each move.
    Rebalance(RebalanceArgs),
    /// Take a node out of a replicated cluster, online.
    ///
    /// Moves its partition's slots to the other partitions (as rebalance does), then sends
    /// KEEL.REMOVENODE: each partition with a replica on the node moves that replica to
    /// another node (the new one catches up as a Raft learner, then one joint membership
    /// change swaps them), and the node leaves CLUSTER NODES. Returns once no partition
    /// counts on it; the process may then be stopped. A node joins with `keel serve
    /// --cluster-join`.
    RemoveNode(RemoveNodeArgs),
}

/// Options of `keel cluster remove-node`.
#[derive(clap::Args)]
pub struct RemoveNodeArgs {
    /// The id of the node to remove (CLUSTER NODES' first column).
    id: String,
    /// Any node of the cluster other than the one removed.
    #[arg(long, default_value = "127.0.0.1:7001", value_name = "HOST:PORT")]
    node: String,
}

/// Options of `keel cluster rebalance`.
#[derive(clap::Args)]
pub struct RebalanceArgs {
    /// Any node of the cluster.
    #[arg(long, default_value = "127.0.0.1:7001", value_name = "HOST:PORT")]
    node: String,
    /// Print the moves without making them.
    #[arg(long)]
    dry_run: bool,
}

/// Options of `keel cluster start`.
#[derive(clap::Args)]
pub struct StartArgs {
    /// Nodes to start (1 to 64).
    #[arg(default_value_t = 3)]
    nodes: usize,
    /// Nodes that keep each partition (1 to the number of nodes) [default: 3, or the number
    /// of nodes if fewer].
    #[arg(long, value_name = "R")]
    replicas: Option<usize>,
    /// Port of the first node; node i listens on this + i - 1 (its bus on that + 10000).
    #[arg(long, default_value_t = 7001)]
    port: u16,
    /// Where the nodes keep their data (node-<i> each) and logs (node-<i>.log). Starting
    /// again on the same directory with the same nodes and replicas recovers the data.
    #[arg(long, value_name = "DIR", default_value = "keel-cluster")]
    dir: PathBuf,
    /// The nodes' durability: sync, async:<ms> or none (memory only, no files, as `keel serve
    /// --durability none`).
    #[arg(long, default_value = "sync")]
    durability: String,
    /// Leave a node that died down instead of restarting it.
    #[arg(long)]
    no_restart: bool,
}

/// How long a dead node stays down before `keel cluster start` restarts it.
const RESTART_AFTER: std::time::Duration = std::time::Duration::from_secs(3);

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
        Command::Start(start) => run_start(start),
        Command::Rebalance(rebalance) => run_rebalance(rebalance),
        Command::RemoveNode(remove) => run_remove_node(remove),
    }
}

macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// Slots per partition (by its home node's id), from `CLUSTER PARTITIONS` (`CLUSTER NODES`
/// lists the slots under the node leading them, which may lead several partitions).
fn slot_map(conn: &mut keel_bench::resp::Conn) -> anyhow::Result<Vec<(String, Vec<u16>)>> {
    use keel_bench::resp::Reply;
    let text = match conn.call(&[b"CLUSTER", b"PARTITIONS"])? {
        Reply::Bulk(Some(b)) => String::from_utf8(b)?,
        Reply::Error(e) => anyhow::bail!("CLUSTER PARTITIONS: {e}"),
        other => anyhow::bail!("CLUSTER PARTITIONS answered {other:?}"),
    };
    let mut map = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let mut slots = Vec::new();
        for range in &fields[1..] {
            let (a, b) = range.split_once('-').unwrap_or((range, range));
            let (a, b): (u16, u16) = (a.parse()?, b.parse()?);
            slots.extend(a..=b);
        }
        map.push((fields[0].to_owned(), slots));
    }
    Ok(map)
}

/// `slots` as `a-b` ranges.
fn ranges(slots: &[u16]) -> Vec<String> {
    let mut out: Vec<(u16, u16)> = Vec::new();
    for &s in slots {
        match out.last_mut() {
            Some((_, end)) if *end + 1 == s => *end = s,
            _ => out.push((s, s)),
        }
    }
    out.into_iter().map(|(a, b)| format!("{a}-{b}")).collect()
}

fn run_rebalance(args: RebalanceArgs) -> anyhow::Result<()> {
    let mut conn = keel_bench::resp::Conn::connect(&args.node)
        .with_context(|| format!("connecting to {}", args.node))?;
    rebalance(&mut conn, &args.node, None, args.dry_run)
}

fn run_remove_node(args: RemoveNodeArgs) -> anyhow::Result<()> {
    use keel_bench::resp::Reply;
    let mut conn = keel_bench::resp::Conn::connect(&args.node)
        .with_context(|| format!("connecting to {}", args.node))?;
    let map = slot_map(&mut conn)?;
    anyhow::ensure!(
        map.iter().any(|(id, _)| id == &args.id),
        "{} lists no node {} (CLUSTER PARTITIONS)",
        args.node,
        args.id
    );
    rebalance(&mut conn, &args.node, Some(&args.id), false)?;
    say!("moving {}'s replicas to the other nodes", args.id);
    match conn.call(&[b"KEEL.REMOVENODE", args.id.as_bytes()])? {
        Reply::Int(moved) => {
            say!(
                "{} removed: {moved} partitions moved their replica off it",
                args.id
            );
            Ok(())
        }
        Reply::Error(e) => anyhow::bail!("removing {}: {e}", args.id),
        other => anyhow::bail!("KEEL.REMOVENODE answered {other:?}"),
    }
}

/// Moves slots so that every partition but `emptied`'s holds its share and `emptied`'s
/// none, printing each move.
fn rebalance(
    conn: &mut keel_bench::resp::Conn,
    node: &str,
    emptied: Option<&str>,
    dry_run: bool,
) -> anyhow::Result<()> {
    use keel_bench::resp::Reply;
    // The node's map shows the moves it knows of: first it learns every partition's.
    match conn.call(&[b"KEEL.LEARNSLOTS"])? {
        Reply::Int(_) => {}
        Reply::Error(e) => anyhow::bail!("KEEL.LEARNSLOTS on {node}: {e}"),
        other => anyhow::bail!("KEEL.LEARNSLOTS answered {other:?}"),
    }
    let mut map = slot_map(conn)?;
    let n = map.len() - usize::from(emptied.is_some());
    anyhow::ensure!(n > 0, "{node} lists no other node");
    let total: usize = map.iter().map(|(_, s)| s.len()).sum();
    // Each partition's share: the total split evenly, the first ones taking the remainder.
    let mut shares = Vec::with_capacity(map.len());
    let mut rank = 0;
    for (id, _) in &map {
        if Some(id.as_str()) == emptied {
            shares.push(0);
        } else {
            shares.push(total / n + usize::from(rank < total % n));
            rank += 1;
        }
    }
    let mut surplus: Vec<u16> = Vec::new();
    for (i, (_, slots)) in map.iter_mut().enumerate() {
        if slots.len() > shares[i] {
            surplus.extend(slots.drain(shares[i]..));
        }
    }
    let mut moves = 0;
    for (i, (id, slots)) in map.iter().enumerate() {
        let want = shares[i].saturating_sub(slots.len());
        if want == 0 {
            continue;
        }
        let mut take: Vec<u16> = surplus.drain(..want.min(surplus.len())).collect();
        take.sort_unstable();
        let ranges = ranges(&take);
        say!("{} slots to {id}: {}", take.len(), ranges.join(" "));
        moves += take.len();
        if dry_run {
            continue;
        }
        let mut call: Vec<&[u8]> = vec![b"KEEL.MOVESLOTS", id.as_bytes()];
        call.extend(ranges.iter().map(|r| r.as_bytes()));
        match conn.call(&call)? {
            Reply::Int(moved) => say!("  moved {moved}"),
            Reply::Error(e) => anyhow::bail!("moving slots to {id}: {e}"),
            other => anyhow::bail!("KEEL.MOVESLOTS answered {other:?}"),
        }
    }
    if moves == 0 {
        say!("balanced: {n} partitions, {total} slots");
    }
    Ok(())
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
            config.set_cluster(Arc::new(map));
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

/// One node process of `keel cluster start`.
struct Proc {
    name: String,
    args: Vec<String>,
    log: PathBuf,
    child: Option<std::process::Child>,
    /// When it died, if it is down.
    died: Option<std::time::Instant>,
    /// When it was last started.
    spawned: std::time::Instant,
}

impl Proc {
    fn spawn(&mut self) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        let exe = std::env::current_exe().context("finding the keel executable")?;
        let child = std::process::Command::new(exe)
            .args(&self.args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", self.name))?;
        self.child = Some(child);
        self.died = None;
        self.spawned = std::time::Instant::now();
        Ok(())
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }
}

fn run_start(args: StartArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=DEMO_NODES_MAX).contains(&args.nodes),
        "a local cluster has 1 to {DEMO_NODES_MAX} nodes, not {}",
        args.nodes
    );
    let replicas = args.replicas.unwrap_or(args.nodes.min(3));
    anyhow::ensure!(
        (1..=args.nodes).contains(&replicas),
        "--replicas must be between 1 and the number of nodes ({}), not {replicas}",
        args.nodes
    );
    args.durability
        .parse::<keel_server::Durability>()
        .context("--durability")?;
    let ports: Vec<u16> = (0..args.nodes)
        .map(|i| {
            u16::try_from(usize::from(args.port) + i)
                .ok()
                .filter(|p| p.checked_add(keel_server::BUS_PORT_OFFSET).is_some())
                .context("the nodes' ports and bus ports (port + 10000) must stay below 65536")
        })
        .collect::<anyhow::Result<_>>()?;
    // Refuse taken ports now rather than watch the nodes die one by one.
    for &port in &ports {
        for p in [port, port + keel_server::BUS_PORT_OFFSET] {
            TcpListener::bind((Ipv4Addr::LOCALHOST, p))
                .with_context(|| format!("port {p} is taken (pick other ports with --port)"))?;
        }
    }
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("creating {}", args.dir.display()))?;
    let nodes: Vec<String> = ports
        .iter()
        .enumerate()
        .map(|(i, port)| {
            let (start, end) = keel_server::cluster_map::membership::even_range(i, args.nodes);
            format!("n{},127.0.0.1:{port},{start}-{end}", i + 1)
        })
        .collect();
    let mut procs: Vec<Proc> = (0..args.nodes)
        .map(|i| {
            let mut a: Vec<String> = vec![
                "serve".into(),
                "--port".into(),
                ports[i].to_string(),
                "--dir".into(),
                args.dir
                    .join(format!("node-{}", i + 1))
                    .display()
                    .to_string(),
                "--durability".into(),
                args.durability.clone(),
                "--replicas".into(),
                replicas.to_string(),
                "--cluster-myself".into(),
                format!("n{}", i + 1),
            ];
            for n in &nodes {
                a.push("--cluster-node".into());
                a.push(n.clone());
            }
            Proc {
                name: format!("node-{}", i + 1),
                args: a,
                log: args.dir.join(format!("node-{}.log", i + 1)),
                child: None,
                died: None,
                spawned: std::time::Instant::now(),
            }
        })
        .collect();
    for p in &mut procs {
        p.spawn()?;
    }
    say!(
        "keel {} local cluster: {} nodes, each partition on {replicas} (data and logs under {})",
        keel_server::VERSION,
        args.nodes,
        args.dir.display()
    );
    for (i, p) in procs.iter().enumerate() {
        let (start, end) = keel_server::cluster_map::membership::even_range(i, args.nodes);
        let pid = p.child.as_ref().map_or(0, std::process::Child::id);
        say!(
            "  {}  127.0.0.1:{}  pid {pid}  slots {start}-{end}",
            p.name,
            ports[i]
        );
    }
    let first = ports[0];
    say!("try:");
    say!("  redis-cli -p {first} set hello world        # any node serves any key");
    say!("  redis-cli -p {first} info replication       # who leads each partition");
    say!("  kill -9 <a pid above>                      # the others keep serving");
    if replicas > 1 {
        let next = usize::from(first) + args.nodes;
        say!(
            "  keel serve --cluster-join 127.0.0.1:{first} --cluster-myself n{n} --port {next} \
             --dir {}/node-{n}   # add a node",
            args.dir.display(),
            n = args.nodes + 1
        );
        say!("  keel cluster rebalance --node 127.0.0.1:{first}          # then move slots to it");
        say!(
            "  keel cluster remove-node n1 --node 127.0.0.1:{}   # take a node out",
            first + 1
        );
    }
    say!("Ctrl-C stops every node.");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let outcome = runtime.block_on(async {
        let signals = crate::serve::Signals::install();
        let watch = async {
            loop {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                for p in &mut procs {
                    if let Some(child) = &mut p.child
                        && let Ok(Some(status)) = child.try_wait()
                    {
                        p.child = None;
                        p.died = Some(std::time::Instant::now());
                        // Exiting by itself right away is a failure to start (a bad
                        // flag, a taken port, damaged data), not a death to recover from.
                        use std::os::unix::process::ExitStatusExt as _;
                        if status.signal().is_none()
                            && p.spawned.elapsed() < std::time::Duration::from_secs(5)
                        {
                            anyhow::bail!(
                                "{} stopped at start ({status}); the end of its log:\n{}",
                                p.name,
                                p.log_tail()
                            );
                        }
                        if args.no_restart {
                            say!("{} exited ({status})", p.name);
                        } else {
                            say!(
                                "{} exited ({status}); restarting it in {} s",
                                p.name,
                                RESTART_AFTER.as_secs()
                            );
                        }
                    }
                    if !args.no_restart && p.died.is_some_and(|d| d.elapsed() >= RESTART_AFTER) {
                        p.spawn()?;
                        let pid = p.child.as_ref().map_or(0, std::process::Child::id);
                        say!("{} restarted (pid {pid})", p.name);
                    }
                }
            }
        };
        tokio::select! {
            r = watch => r,
            () = signals.wait() => Ok(()),
        }
    });
    say!(
        "stopping {} nodes",
        procs.iter().filter(|p| p.child.is_some()).count()
    );
    for p in &procs {
        if let Some(child) = &p.child {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
        }
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    for p in &mut procs {
        if let Some(child) = &mut p.child {
            loop {
                match child.try_wait() {
                    Ok(Some(_)) => break,
                    _ if std::time::Instant::now() > deadline => {
                        say!("{} did not stop within 15 s: killing it", p.name);
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                    _ => std::thread::sleep(std::time::Duration::from_millis(50)),
                }
            }
        }
    }
    outcome
}

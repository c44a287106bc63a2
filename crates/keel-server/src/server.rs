//! The accept loop, the state all connections share, graceful shutdown and the metrics
//! endpoint.
//!
//! The engine is synchronous and its calls are short and never wait on I/O, so connections run
//! them directly on tokio's worker threads. The database is created once per server and
//! leaked (`&'static Db`): a `WATCH` keeps an engine transaction open across commands, and an
//! engine transaction borrows its database, so the database must outlive every connection. A
//! process runs one server, so the leak is one database.
//!
//! Split keys are the exception to "short": a commit that writes a split key with anything
//! but a commutative operation waits (up to two split phase lengths) for the key's
//! reconciliation. While anything is split, such commits, and the waits before retrying a
//! transaction that read a split key, run on the blocking pool.
//!
//! Shutdown (`SHUTDOWN`, SIGTERM, or [`Handle::shutdown`]): stop accepting, let every
//! connection finish the requests it has already read, close the database (a final
//! checkpoint), return. After that the leaked handle refuses writes; the process is expected
//! to exit.
//!
//! With `sync` durability a reply waits until its commit's log frame is fsynced. The commit
//! runs on the worker (`Txn::commit_async`) and the task waits without a thread: the log's
//! flusher publishes the commit once it is durable and wakes the task, so many connections
//! wait at once and share one fsync (group commit) while the workers keep serving.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU8, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use keel::Db;
use parking_lot::{Mutex, RwLock};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::config::{Config, ConfigError};
use crate::data::Cursors;

/// How long shutdown waits for connections to finish what they have read.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Latency histogram buckets: bucket `b` holds commands that took `[2^(b-1), 2^b)` ns.
pub const LATENCY_BUCKETS: usize = 40;

/// The server could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// A setting is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Opening (recovering) the database failed.
    #[error("cannot open the database in {dir}: {source}")]
    Open {
        /// The data directory.
        dir: std::path::PathBuf,
        /// Why.
        #[source]
        source: keel::OpenError,
    },
    /// Starting the poller thread failed.
    #[error("cannot start the poller thread: {0}")]
    Poller(#[source] std::io::Error),
    /// Binding the listening socket failed.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Cluster mode: the cross-node transaction driver could not start.
    #[error("cannot start the cluster's transactions: {0}")]
    Cluster(#[source] crate::xnode::StartError),
    /// Cluster mode with replicas: a partition's Raft group could not start.
    #[error("cannot start replication: {0}")]
    Replication(#[source] crate::replica::StartError),
    /// Not in cluster mode, but the data directory holds transactions a cluster prepared and
    /// did not decide: only the cluster can decide them.
    #[error(
        "{dir} holds {count} transaction(s) prepared as part of a cluster and not yet decided: \
         start this node with its cluster configuration (--cluster) so that it can resolve them"
    )]
    InDoubt {
        /// The data directory.
        dir: std::path::PathBuf,
        /// How many.
        count: usize,
    },
}

/// Counters for `INFO stats` and the metrics endpoint.
pub struct Counters {
    pub connections_received: AtomicU64,
    pub connections_rejected: AtomicU64,
    pub commands_processed: AtomicU64,
    pub net_input_bytes: AtomicU64,
    pub net_output_bytes: AtomicU64,
    pub protocol_errors: AtomicU64,
    pub exec_retries: AtomicU64,
    pub watch_aborts: AtomicU64,
    /// Replicated cluster: times a connection renewed its watches (`conn.rs`).
    pub watch_renewals: AtomicU64,
    /// Cluster mode: commands run gathered across nodes (`gather`), and the times one ran
    /// again because a key changed between its read and its write.
    pub gathered: AtomicU64,
    pub gathered_retries: AtomicU64,
    pub latency: [AtomicU64; LATENCY_BUCKETS],
}

impl Default for Counters {
    fn default() -> Counters {
        Counters {
            connections_received: AtomicU64::new(0),
            connections_rejected: AtomicU64::new(0),
            commands_processed: AtomicU64::new(0),
            net_input_bytes: AtomicU64::new(0),
            net_output_bytes: AtomicU64::new(0),
            protocol_errors: AtomicU64::new(0),
            exec_retries: AtomicU64::new(0),
            watch_aborts: AtomicU64::new(0),
            watch_renewals: AtomicU64::new(0),
            gathered: AtomicU64::new(0),
            gathered_retries: AtomicU64::new(0),
            latency: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl Counters {
    /// Records one command's latency.
    pub fn record_latency(&self, elapsed: Duration) {
        self.record_latencies(elapsed, 1);
    }

    /// Records `n` commands that each took `elapsed`, with one atomic add.
    pub fn record_latencies(&self, elapsed: Duration, n: u64) {
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        let bucket = (64 - ns.leading_zeros() as usize).min(LATENCY_BUCKETS - 1);
        self.latency[bucket].fetch_add(n, Relaxed);
    }

    /// The upper bound, in ns, of the bucket holding quantile `q` (0..1); 0 with no samples.
    pub fn latency_quantile_ns(&self, q: f64) -> u64 {
        let counts: Vec<u64> = self.latency.iter().map(|c| c.load(Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return 0;
        }
        let target = ((total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (b, c) in counts.iter().enumerate() {
            seen += c;
            if seen >= target {
                return 1u64 << b;
            }
        }
        1u64 << (LATENCY_BUCKETS - 1)
    }

    /// Zeroes the counters (`CONFIG RESETSTAT`).
    pub fn reset(&self) {
        for c in [
            &self.connections_received,
            &self.connections_rejected,
            &self.commands_processed,
            &self.net_input_bytes,
            &self.net_output_bytes,
            &self.protocol_errors,
            &self.exec_retries,
            &self.watch_aborts,
        ] {
            c.store(0, Relaxed);
        }
        for c in &self.latency {
            c.store(0, Relaxed);
        }
    }
}

/// What `CLIENT LIST` and `CLIENT KILL` know about a connection.
pub struct ClientInfo {
    pub id: u64,
    pub addr: SocketAddr,
    pub laddr: SocketAddr,
    pub created: Instant,
    pub last_active_ms: AtomicU64,
    pub name: Mutex<String>,
    pub lib: Mutex<(String, String)>,
    pub resp: AtomicU8,
    pub kill: CancellationToken,
    /// Channels, patterns and shard channels subscribed to, for `CLIENT LIST`.
    pub subscriptions: [AtomicU64; 3],
}

/// State shared by all connections.
pub struct Shared {
    pub db: &'static Db,
    pub config: Config,
    pub local_addr: SocketAddr,
    pub requirepass: RwLock<Option<String>>,
    pub proto_max_bulk_len: AtomicI64,
    /// Redis' encoding thresholds (`CONFIG SET hash-max-listpack-entries` and the like).
    pub encodings: crate::config::Encodings,
    pub maxclients: AtomicUsize,
    pub clients: Mutex<HashMap<u64, Arc<ClientInfo>>>,
    pub next_client_id: AtomicU64,
    pub cursors: Cursors,
    pub shutdown: CancellationToken,
    pub started: Instant,
    /// A checkpoint asked for by `SAVE` or `BGSAVE` is being written.
    pub saving: std::sync::atomic::AtomicBool,
    pub counters: Counters,
    /// Pub/sub subscriptions.
    pub pubsub: crate::pubsub::Registry,
    /// Clients blocked in `BLPOP` and its kin.
    pub blocked: crate::blocking::Registry,
    /// Keys whose commands keep conflicting, and their locks.
    pub hot: crate::hot::HotKeys,
    /// Where connections run.
    pub lanes: crate::lanes::Lanes,
    /// Every connection task, whichever runtime runs it: shutdown waits for them.
    pub tracker: tokio_util::task::TaskTracker,
    /// What the reaper (expirer and graveyard sweeper) has done.
    pub reaper: Arc<crate::reaper::ReaperStats>,
    /// `SLOWLOG`: the commands that took longest.
    pub slowlog: crate::slowlog::SlowLog,
    /// Cluster mode's routing and peer connections; `None` on a single node.
    pub cluster: Option<crate::cluster::Cluster>,
    /// Cluster mode: this node's end of transactions across nodes.
    pub xnode: std::sync::OnceLock<crate::xnode::Xnode>,
    /// Cluster mode with `--replicas` over 1: the partitions this node keeps.
    pub replication: std::sync::OnceLock<crate::replica::Replication>,
    /// A single node under `sync`: transactions that write read at the installed watermark
    /// ([`keel::Db::begin_installed`], [`Shared::begin_writer`]), so a chain of them on one
    /// hot key (`LPUSH`/`RPOP` on a queue, `HSET` of one field) shares fsyncs instead of
    /// waiting for one per link; read-only commands read what is durable, as before. A
    /// cluster node keeps every transaction at the visible (durable) watermark.
    pub writers_read_installed: bool,
}

impl Shared {
    /// Begins a transaction for `cmds`: one that may write at the installed watermark where
    /// [`Shared::writers_read_installed`], else (and one of only reads always) at the
    /// visible one. `read` keeps the newest installed snapshot begun: the connection's next
    /// replies wait until it is visible (durable), in case the transaction ends without a
    /// commit (an error), whose wait would have covered it.
    pub fn begin_writer(
        &self,
        mut cmds: impl Iterator<Item = crate::table::Cmd>,
        read: &std::sync::atomic::AtomicU64,
    ) -> Result<keel::Txn<'static>, keel::BeginError> {
        if !self.writers_read_installed || cmds.all(crate::data::is_read_only) {
            return self.db.begin();
        }
        let txn = self.db.begin_installed()?;
        read.fetch_max(txn.read_ts().0, std::sync::atomic::Ordering::Relaxed);
        Ok(txn)
    }

    /// Milliseconds since the server started.
    pub fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// A bound server, not yet accepting.
pub struct Server {
    shared: Arc<Shared>,
    listener: TcpListener,
    metrics: Option<TcpListener>,
}

/// Stops a running server from outside.
#[derive(Clone)]
pub struct Handle {
    token: CancellationToken,
}

impl Handle {
    /// Starts a graceful shutdown.
    pub fn shutdown(&self) {
        self.token.cancel();
    }
}

impl Server {
    /// Validates `config`, creates the database and binds the listening socket(s).
    pub async fn bind(config: Config) -> Result<Server, StartError> {
        config.validate()?;
        let addr = SocketAddr::new(config.bind, config.port);
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| StartError::Bind { addr, source })?;
        Server::start(config, listener).await
    }

    /// As [`Server::bind`], on a socket already listening: how a cluster whose nodes must
    /// know each other's ports before they start (`keel cluster demo`, tests) is started
    /// without a race for the ports. `config`'s `bind` and `port` are not used.
    pub async fn with_listener(
        config: Config,
        listener: std::net::TcpListener,
    ) -> Result<Server, StartError> {
        let addr = listener
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::new(config.bind, config.port));
        let mut config = config;
        config.port = addr.port();
        config.validate()?;
        let listener = listener
            .set_nonblocking(true)
            .and_then(|()| TcpListener::from_std(listener))
            .map_err(|source| StartError::Bind { addr, source })?;
        Server::start(config, listener).await
    }

    async fn start(config: Config, listener: TcpListener) -> Result<Server, StartError> {
        let addr = SocketAddr::new(config.bind, config.port);
        let local_addr = listener
            .local_addr()
            .map_err(|source| StartError::Bind { addr, source })?;
        let metrics = match config.metrics {
            Some(m) => Some(
                TcpListener::bind(m)
                    .await
                    .map_err(|source| StartError::Bind { addr: m, source })?,
            ),
            None => None,
        };
        let mut config = config;
        if config.cluster.is_some() && config.replicas > 1 && config.split != keel::SplitMode::Off {
            // Each partition's Raft state machine applies its writes one at a time, so no two
            // commits there ever wait for one record: nothing would split.
            tracing::info!("replicated cluster: hot-key splitting is off");
            config.split = keel::SplitMode::Off;
        }
        let mut options = config.engine_options();
        if config.replicas > 1 {
            options = options.durability(crate::replica::data_durability(config.durability));
        }
        let dir = config.dir.clone();
        // Recovery reads the whole log: keep it off the async workers.
        let opened = tokio::task::spawn_blocking(move || Db::open(&dir, options))
            .await
            .expect("opening the database does not panic");
        let db = opened.map_err(|source| StartError::Open {
            dir: config.dir.clone(),
            source,
        })?;
        let db: &'static Db = Box::leak(Box::new(db));
        let inline_log = (config.durability != crate::config::Durability::None).then_some(db);
        let lanes = crate::lanes::Lanes::start(config.poller, config.idle_poll_us, inline_log)
            .map_err(StartError::Poller)?;
        let pubsub = crate::pubsub::Registry::new(config.pubsub_output_limit);
        let cluster = config.cluster.clone().map(crate::cluster::Cluster::new);
        let writers_read_installed =
            config.cluster.is_none() && db.durability() == keel::Durability::Sync;
        let shared = Arc::new(Shared {
            db,
            requirepass: RwLock::new(config.requirepass.clone()),
            proto_max_bulk_len: AtomicI64::new(config.proto_max_bulk_len),
            encodings: Default::default(),
            maxclients: AtomicUsize::new(config.maxclients),
            config,
            local_addr,
            clients: Mutex::new(HashMap::new()),
            next_client_id: AtomicU64::new(1),
            cursors: Cursors::default(),
            shutdown: CancellationToken::new(),
            started: Instant::now(),
            saving: std::sync::atomic::AtomicBool::new(false),
            counters: Counters::default(),
            pubsub,
            blocked: Default::default(),
            hot: Default::default(),
            lanes,
            tracker: tokio_util::task::TaskTracker::new(),
            reaper: Arc::default(),
            slowlog: Default::default(),
            cluster,
            xnode: std::sync::OnceLock::new(),
            writers_read_installed,
            replication: std::sync::OnceLock::new(),
        });
        match &shared.cluster {
            Some(cluster) => {
                tokio::spawn(crate::cluster::probe_loop(Arc::downgrade(&shared)));
                cluster.relay.start(Arc::downgrade(&shared));
                let map = cluster.map();
                // The nodes of the config run the transport of cross-node transactions
                // without replication; a node that joined a replicated cluster later is not
                // in its peers' configs, and has no use for it.
                let joined = shared
                    .config
                    .cluster_view
                    .as_ref()
                    .is_some_and(|v| map.myself() >= v.configured);
                if !joined {
                    let xnode = crate::xnode::Xnode::start(&shared, &map)
                        .await
                        .map_err(StartError::Cluster)?;
                    let _ = shared.xnode.set(xnode);
                }
                if shared.config.replicas > 1 {
                    let replication = crate::replica::Replication::start(&shared)
                        .await
                        .map_err(StartError::Replication)?;
                    let _ = shared.replication.set(replication);
                    tokio::spawn(crate::replica::txn::resolve_loop(Arc::downgrade(&shared)));
                    tokio::spawn(crate::replica::reconcile_loop(Arc::downgrade(&shared)));
                    tokio::spawn(crate::replica::reap_loop(Arc::downgrade(&shared)));
                    tokio::spawn(crate::replica::follow_moves_loop(Arc::downgrade(&shared)));
                }
            }
            None if db.recovery().is_some_and(|r| r.in_doubt > 0) => {
                return Err(StartError::InDoubt {
                    dir: shared.config.dir.clone(),
                    count: db.recovery().map_or(0, |r| r.in_doubt),
                });
            }
            None => {}
        }
        Ok(Server {
            shared,
            listener,
            metrics,
        })
    }

    /// The address clients connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.local_addr
    }

    /// What opening the database recovered (`None` without files).
    pub fn recovery(&self) -> Option<&keel::Recovery> {
        self.shared.db.recovery()
    }

    /// The metrics address, if serving metrics.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().and_then(|m| m.local_addr().ok())
    }

    /// A handle that stops the server.
    pub fn handle(&self) -> Handle {
        Handle {
            token: self.shared.shutdown.clone(),
        }
    }

    /// Accepts clients until shutdown, then waits (at most a few seconds) for connections to
    /// finish the requests they have read, and closes the database (final checkpoint, log
    /// made durable).
    pub async fn run(self) -> Result<(), keel::CloseError> {
        let Server {
            shared,
            listener,
            metrics,
        } = self;
        if let Some(m) = metrics {
            tokio::spawn(serve_metrics(m, shared.clone()));
        }
        let tracker = shared.tracker.clone();
        // A replicated partition changes only through its log: keys expire when met.
        let reaper = match shared.replication.get() {
            Some(_) => Err(std::io::Error::other("replicated")),
            None => crate::reaper::Reaper::start(shared.db, shared.reaper.clone()),
        };
        if let Err(e) = &reaper
            && shared.replication.get().is_none()
        {
            tracing::error!(error = %e, "cannot start the reaper thread: keys will expire only when met");
        }
        tokio::spawn({
            let shared = shared.clone();
            async move {
                let commands = &shared.counters.commands_processed;
                shared
                    .lanes
                    .control(shared.shutdown.clone(), commands)
                    .await;
            }
        });
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                () = shared.shutdown.cancelled() => break,
            };
            let (stream, addr) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            shared.counters.connections_received.fetch_add(1, Relaxed);
            if shared.clients.lock().len() >= shared.maxclients.load(Relaxed) {
                shared.counters.connections_rejected.fetch_add(1, Relaxed);
                tracker.spawn(reject(stream));
                continue;
            }
            let _ = stream.set_nodelay(true);
            // Registered again by the lane's runtime.
            let stream = match stream.into_std() {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!(error = %e, "accepted connection lost");
                    continue;
                }
            };
            crate::conn::start(shared.clone(), stream, addr);
        }
        tracing::info!("shutting down: no longer accepting connections");
        tracker.close();
        if tokio::time::timeout(SHUTDOWN_GRACE, tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!("some connections did not finish within the shutdown grace period");
        }
        // Closes any connection still on the poller.
        let stopping = shared.clone();
        let _ = tokio::task::spawn_blocking(move || stopping.lanes.stop()).await;
        if let Ok(reaper) = reaper {
            let _ = tokio::task::spawn_blocking(move || reaper.stop()).await;
        }
        if let Some(replication) = shared.replication.get() {
            replication.stop().await;
        }
        let db = shared.db.clone();
        let closed = tokio::task::spawn_blocking(move || db.close())
            .await
            .expect("closing the database does not panic");
        match &closed {
            Ok(()) => tracing::info!("database closed; server stopped"),
            Err(e) => tracing::error!(error = %e, "closing the database failed"),
        }
        closed
    }
}

async fn reject(mut stream: TcpStream) {
    let _ = stream
        .write_all(b"-ERR max number of clients reached\r\n")
        .await;
}

/// Serves Prometheus text on every HTTP request, whatever the path.
async fn serve_metrics(listener: TcpListener, shared: Arc<Shared>) {
    /// An HTTP request head larger than this is not a scrape.
    const REQUEST_BYTES_MAX: usize = 8192;
    loop {
        let (mut stream, _) = tokio::select! {
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            () = shared.shutdown.cancelled() => return,
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let mut head = Vec::new();
            let mut chunk = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < REQUEST_BYTES_MAX {
                match tokio::time::timeout(Duration::from_secs(5), stream.read(&mut chunk)).await {
                    Ok(Ok(n)) if n > 0 => head.extend_from_slice(&chunk[..n]),
                    _ => return,
                }
            }
            let body = crate::info::prometheus(&shared);
            let response = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
        });
    }
}

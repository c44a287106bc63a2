//! Server settings: what `keel serve` flags and `keel.toml` say, validated once at startup.
//!
//! The file takes the same names as the flags (`port = 6380`, `requirepass = "..."`,
//! `durability = "async:1000"`, `split = "force"`); a flag given on the command line wins over
//! the file.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::str::FromStr;

use crate::lanes::{IDLE_POLL_US_DEFAULT, IDLE_POLL_US_MAX, PollerMode};

/// Default `proto-max-bulk-len`: keel's largest value, so that a bulk the engine would refuse is
/// refused before it is buffered.
pub const PROTO_MAX_BULK_LEN_DEFAULT: i64 = keel::limits::VALUE_BYTES_MAX as i64;

/// Default `split-phase-ms`: the engine's default split phase (Doppel's 20 ms).
pub const SPLIT_PHASE_MS_DEFAULT: u64 = 20;
/// Largest `split-phase-ms`: a command that reads a split key waits up to two phases for the
/// reconciliation, and a wait of more than seconds is one clients time out on.
pub const SPLIT_PHASE_MS_MAX: u64 = 10_000;

/// `client-output-buffer-limit` for the `pubsub` class: bytes a subscriber may owe (queued
/// or in its output, not yet written to its socket) before it is disconnected. 0 disables a
/// limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputLimit {
    /// Disconnect as soon as a subscriber owes more than this.
    pub hard_bytes: u64,
    /// Disconnect a subscriber that has owed more than this for longer than `soft_seconds`.
    pub soft_bytes: u64,
    /// See `soft_bytes`.
    pub soft_seconds: u64,
}

impl Default for OutputLimit {
    /// Redis's default: `pubsub 32mb 8mb 60`.
    fn default() -> OutputLimit {
        OutputLimit {
            hard_bytes: 32 << 20,
            soft_bytes: 8 << 20,
            soft_seconds: 60,
        }
    }
}

/// Redis's reply to a `client-output-buffer-limit` value with the wrong number of words.
pub const OUTPUT_LIMIT_ARITY: &str = "Wrong number of arguments in buffer limit configuration.";
/// Redis's reply to an unknown client class.
pub const OUTPUT_LIMIT_CLASS: &str =
    "Invalid client class specified in buffer limit configuration.";
/// Redis's reply to a limit that is not a size or a count of seconds.
pub const OUTPUT_LIMIT_NUMBER: &str =
    "Error in hard, soft or soft_seconds setting in buffer limit configuration.";
/// What `client-output-buffer-limit` reports for the classes keel does not enforce: normal
/// clients have no output limit (each reply is bounded by `reply_bytes_max` instead) and keel
/// has no replicas; both are Redis's defaults.
pub const OUTPUT_LIMIT_OTHERS: &str = "normal 0 0 0 slave 268435456 67108864 60";

impl OutputLimit {
    /// `client-output-buffer-limit`'s value, as Redis writes it.
    pub fn redis_value(self) -> String {
        format!(
            "{OUTPUT_LIMIT_OTHERS} pubsub {} {} {}",
            self.hard_bytes, self.soft_bytes, self.soft_seconds
        )
    }

    /// Parses a `client-output-buffer-limit` value: `<class> <hard> <soft> <seconds>`,
    /// repeated, sizes as Redis writes them (`32mb`, `1gb`, `1000`). Returns the `pubsub`
    /// limit, if given. `normal` and `replica` (`slave`) are taken only at the values keel
    /// behaves by (`OUTPUT_LIMIT_OTHERS`), so that a tool that writes back what it read
    /// works, and nothing keel would ignore is accepted.
    pub fn parse(value: &str) -> Result<Option<OutputLimit>, String> {
        let words: Vec<&str> = value.split_whitespace().collect();
        if words.is_empty() || !words.len().is_multiple_of(4) {
            return Err(OUTPUT_LIMIT_ARITY.into());
        }
        let mut pubsub = None;
        for class in words.chunks(4) {
            let name = class[0].to_ascii_lowercase();
            if !matches!(name.as_str(), "normal" | "replica" | "slave" | "pubsub") {
                return Err(OUTPUT_LIMIT_CLASS.into());
            }
            let (Some(hard), Some(soft), Ok(seconds)) = (
                parse_memory(class[1]),
                parse_memory(class[2]),
                class[3].parse::<u64>(),
            ) else {
                return Err(OUTPUT_LIMIT_NUMBER.into());
            };
            let limit = OutputLimit {
                hard_bytes: hard,
                soft_bytes: soft,
                soft_seconds: seconds,
            };
            match name.as_str() {
                "pubsub" => pubsub = Some(limit),
                "normal" if (hard, soft, seconds) == (0, 0, 0) => {}
                "replica" | "slave" if (hard, soft, seconds) == (268_435_456, 67_108_864, 60) => {}
                _ => {
                    return Err(format!(
                        "keel enforces client-output-buffer-limit for the pubsub class only; \
                         the others must stay {OUTPUT_LIMIT_OTHERS}"
                    ));
                }
            }
        }
        Ok(pubsub)
    }
}

/// A size as Redis writes it in its configuration: digits, then `b`, `k` (1000), `kb`
/// (1024), `m`, `mb`, `g` or `gb`, in any case.
fn parse_memory(word: &str) -> Option<u64> {
    let lower = word.to_ascii_lowercase();
    let digits = lower.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit: u64 = match &lower[digits.len()..] {
        "" | "b" => 1,
        "k" => 1000,
        "kb" => 1024,
        "m" => 1000 * 1000,
        "mb" => 1024 * 1024,
        "g" => 1000 * 1000 * 1000,
        "gb" => 1024 * 1024 * 1024,
        _ => return None,
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u64>().ok()?.checked_mul(unit)
}

/// How committed data is made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Acknowledge after fsync (group commit).
    Sync,
    /// Acknowledge once written to the OS (no fsync); fsync every `ms` milliseconds.
    Async {
        /// The fsync interval.
        ms: u64,
    },
    /// Memory only.
    None,
}

impl std::fmt::Display for Durability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Durability::Sync => f.write_str("sync"),
            Durability::Async { ms } => write!(f, "async:{ms}"),
            Durability::None => f.write_str("none"),
        }
    }
}

/// A setting had a value keel cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// In cluster mode, the port to listen on is not the one the cluster config gives this
    /// node (clients sent there by `MOVED` would find nobody).
    #[error(
        "the cluster config says node {node} listens on {addr}, but this server would listen on port {port}"
    )]
    ClusterPort {
        /// This node.
        node: String,
        /// Its address in the cluster config.
        addr: SocketAddr,
        /// The port configured here.
        port: u16,
    },
    /// `replicas` is 0, or more than the cluster's nodes (1 without a cluster).
    #[error("replicas must be between 1 and the number of cluster nodes ({nodes}), not {value}")]
    Replicas {
        /// What was asked.
        value: usize,
        /// The cluster's nodes (1 on a single node).
        nodes: usize,
    },
    /// `durability` is not `sync`, `async:<ms>` or `none`.
    #[error("durability must be sync, async:<milliseconds> or none, not {0:?}")]
    Durability(String),
    /// The configuration file is not valid TOML for these settings.
    #[error("invalid configuration file: {0}")]
    File(String),
    /// `bind` is not an IP address.
    #[error("bind must be an IP address, not {0:?}")]
    Bind(String),
    /// Protected mode forbids this bind without a password.
    #[error(
        "refusing to listen on {0} without a password: set --requirepass, or bind a loopback \
         address, or pass --protected-mode no if this network is trusted"
    )]
    Protected(IpAddr),
    /// `split` is not `auto`, `off` or `force`.
    #[error("split must be auto, off or force, not {0:?}")]
    Split(String),
    /// `split-phase-ms` is out of its range.
    #[error("split-phase-ms must be between 1 and {max} (milliseconds), not {value}")]
    SplitPhase {
        /// What was asked.
        value: u64,
        /// The largest allowed.
        max: u64,
    },
    /// `threads` is out of its range.
    #[error("threads must be between 1 and {max} (0: one per core), not {value}")]
    Threads {
        /// What was asked.
        value: usize,
        /// The largest allowed.
        max: usize,
    },
    /// `poller` is not `on` or `off` (the reason).
    #[error("{0}")]
    Poller(String),
    /// `idle-poll-us` is out of its range.
    #[error("idle-poll-us must be between 0 and {max} (microseconds), not {value}")]
    IdlePoll {
        /// What was asked.
        value: u64,
        /// The largest allowed.
        max: u64,
    },
    /// `client-output-buffer-limit` is not `<class> <hard> <soft> <seconds>`, repeated.
    #[error("client-output-buffer-limit: {0}")]
    OutputLimit(String),
    /// `proto-max-bulk-len` is out of its range.
    #[error("proto-max-bulk-len must be between 1024 and {max}, not {value}")]
    BulkLen {
        /// What was asked.
        value: i64,
        /// The largest allowed.
        max: i64,
    },
}

impl Durability {
    /// The engine's setting.
    pub fn engine(self) -> keel::Durability {
        match self {
            Durability::Sync => keel::Durability::Sync,
            Durability::Async { ms } => keel::Durability::Async {
                interval: std::time::Duration::from_millis(ms),
            },
            Durability::None => keel::Durability::None,
        }
    }
}

impl FromStr for Durability {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Durability, ConfigError> {
        match s {
            "sync" => Ok(Durability::Sync),
            "none" => Ok(Durability::None),
            _ => s
                .strip_prefix("async:")
                .and_then(|ms| ms.parse().ok())
                .filter(|&ms| ms > 0)
                .map(|ms| Durability::Async { ms })
                .ok_or_else(|| ConfigError::Durability(s.to_owned())),
        }
    }
}

/// Every server setting.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Config {
    /// Address to listen on.
    pub bind: IpAddr,
    /// Port to listen on (0: any free port).
    pub port: u16,
    /// Data directory: the engine's log and checkpoints (unused with `Durability::None`).
    pub dir: PathBuf,
    /// When a write is acknowledged relative to the disk.
    pub durability: Durability,
    /// Password every client must give with `AUTH`/`HELLO`.
    pub requirepass: Option<String>,
    /// Refuse a non-loopback bind without a password.
    pub protected_mode: bool,
    /// Where to serve Prometheus metrics, if anywhere.
    pub metrics: Option<SocketAddr>,
    /// Largest bulk string a client may send.
    pub proto_max_bulk_len: i64,
    /// Most simultaneous clients.
    pub maxclients: usize,
    /// Most bytes of replies one command may produce before it fails (the output buffer limit).
    pub reply_bytes_max: usize,
    /// Whether the engine splits contended keys (Doppel phase reconciliation).
    pub split: keel::SplitMode,
    /// Length of one split phase in milliseconds: a command that reads a split key waits up to
    /// about twice this for its reconciliation.
    pub split_phase_ms: u64,
    /// Worker threads serving connections; 0: one per core.
    pub threads: usize,
    /// Where connections run: the poller thread, the worker pool, or whichever the load
    /// calls for (see the `lanes` module).
    pub poller: PollerMode,
    /// How long the poller keeps polling after its last read before it sleeps.
    pub idle_poll_us: u64,
    /// `client-output-buffer-limit pubsub`: when a subscriber that does not read its
    /// messages is disconnected.
    pub pubsub_output_limit: OutputLimit,
    /// Cluster mode: the cluster's configuration, with this node in it (`None`: a single
    /// node, with no routing at all).
    pub cluster: Option<std::sync::Arc<keel_cluster::Membership>>,
    /// A replicated cluster's view as a join brought it (`keel serve --cluster-join`); the
    /// node starts from it if it is newer than the one it keeps (`replica::view`).
    pub cluster_view: Option<crate::replica::View>,
    /// Cluster mode: every node's transport (bus) address, by node index; empty: each node's
    /// client address with the port + 10000, as Redis Cluster's bus.
    pub cluster_bus: Vec<std::net::SocketAddr>,
    /// Cluster mode: this node's bus socket, already listening (so that a demo or a test
    /// that picks free ports has no race); `None`: bind it.
    pub cluster_bus_listener: Option<std::sync::Arc<std::net::TcpListener>>,
    /// Cluster mode: on how many nodes each partition is kept (1: no replication). Partition
    /// `p` (the slots the cluster config gives node `p`) lives on nodes `p`, `p + 1`, ...
    /// `p + replicas - 1`, counted round the config's node list (`replica`).
    pub replicas: usize,
    /// Tests: the engine's files go through this simulated disk (held fsyncs, power loss)
    /// instead of the real one.
    #[doc(hidden)]
    pub sim_disk: Option<keel::SimDisk>,
}

/// Most worker threads `threads` may ask for.
pub const THREADS_MAX: usize = 1024;

impl Default for Config {
    fn default() -> Config {
        Config {
            bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 6379,
            dir: PathBuf::from("keel-data"),
            durability: Durability::Sync,
            requirepass: None,
            protected_mode: true,
            metrics: None,
            proto_max_bulk_len: PROTO_MAX_BULK_LEN_DEFAULT,
            maxclients: 10_000,
            reply_bytes_max: 256 * 1024 * 1024,
            split: keel::SplitMode::Auto,
            split_phase_ms: SPLIT_PHASE_MS_DEFAULT,
            threads: 0,
            poller: PollerMode::Off,
            idle_poll_us: IDLE_POLL_US_DEFAULT,
            pubsub_output_limit: OutputLimit::default(),
            cluster: None,
            cluster_view: None,
            cluster_bus: Vec::new(),
            cluster_bus_listener: None,
            replicas: 1,
            sim_disk: None,
        }
    }
}

/// Parses a `poller` setting.
pub fn parse_poller(s: &str) -> Result<PollerMode, ConfigError> {
    s.parse().map_err(ConfigError::Poller)
}

/// Checks an `idle-poll-us` setting.
pub fn check_idle_poll(us: u64) -> Result<(), ConfigError> {
    if us > IDLE_POLL_US_MAX {
        return Err(ConfigError::IdlePoll {
            value: us,
            max: IDLE_POLL_US_MAX,
        });
    }
    Ok(())
}

/// Largest `proto-max-bulk-len`: a request is buffered whole before it runs.
pub const PROTO_MAX_BULK_LEN_MAX: i64 = 512 * 1024 * 1024;

/// `keel.toml`: every field optional, names as the flags.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileConfig {
    /// See [`Config::bind`].
    pub bind: Option<String>,
    /// See [`Config::port`].
    pub port: Option<u16>,
    /// See [`Config::dir`].
    pub dir: Option<PathBuf>,
    /// See [`Config::durability`].
    pub durability: Option<String>,
    /// See [`Config::requirepass`].
    pub requirepass: Option<String>,
    /// See [`Config::protected_mode`]: `true`/`false` or `"yes"`/`"no"`.
    pub protected_mode: Option<YesNo>,
    /// See [`Config::metrics`].
    pub metrics: Option<SocketAddr>,
    /// See [`Config::proto_max_bulk_len`].
    pub proto_max_bulk_len: Option<i64>,
    /// See [`Config::maxclients`].
    pub maxclients: Option<usize>,
    /// See [`Config::split`]: `"auto"`, `"off"` or `"force"`.
    pub split: Option<String>,
    /// See [`Config::split_phase_ms`].
    pub split_phase_ms: Option<u64>,
    /// See [`Config::threads`].
    pub threads: Option<usize>,
    /// See [`Config::poller`]: `"on"` or `"off"`.
    pub poller: Option<String>,
    /// See [`Config::idle_poll_us`].
    pub idle_poll_us: Option<u64>,
    /// See [`Config::pubsub_output_limit`], in Redis's form: `"pubsub 32mb 8mb 60"`.
    pub client_output_buffer_limit: Option<String>,
}

/// A boolean written either as TOML `true`/`false` or as Redis's `yes`/`no`.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(untagged)]
pub enum YesNo {
    /// `true` / `false`.
    Bool(bool),
    /// `"yes"` / `"no"`.
    Word(String),
}

impl YesNo {
    /// The boolean, or `None` for a word other than yes/no.
    pub fn get(&self) -> Option<bool> {
        match self {
            YesNo::Bool(b) => Some(*b),
            YesNo::Word(w) if w == "yes" => Some(true),
            YesNo::Word(w) if w == "no" => Some(false),
            YesNo::Word(_) => None,
        }
    }
}

impl FileConfig {
    /// Parses `keel.toml` text.
    pub fn parse(text: &str) -> Result<FileConfig, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::File(e.to_string()))
    }

    /// Applies the file's settings on top of `config`.
    pub fn apply(self, config: &mut Config) -> Result<(), ConfigError> {
        if let Some(b) = self.bind {
            config.bind = b.parse().map_err(|_| ConfigError::Bind(b))?;
        }
        if let Some(p) = self.port {
            config.port = p;
        }
        if let Some(d) = self.dir {
            config.dir = d;
        }
        if let Some(d) = self.durability {
            config.durability = d.parse()?;
        }
        if let Some(p) = self.requirepass {
            config.requirepass = Some(p).filter(|p| !p.is_empty());
        }
        if let Some(p) = self.protected_mode {
            config.protected_mode = p
                .get()
                .ok_or_else(|| ConfigError::File("protected-mode must be yes or no".into()))?;
        }
        if let Some(m) = self.metrics {
            config.metrics = Some(m);
        }
        if let Some(n) = self.proto_max_bulk_len {
            config.proto_max_bulk_len = n;
        }
        if let Some(n) = self.maxclients {
            config.maxclients = n;
        }
        if let Some(s) = self.split {
            config.split = parse_split(&s)?;
        }
        if let Some(ms) = self.split_phase_ms {
            config.split_phase_ms = ms;
        }
        if let Some(n) = self.threads {
            config.threads = n;
        }
        if let Some(p) = self.poller {
            config.poller = parse_poller(&p)?;
        }
        if let Some(us) = self.idle_poll_us {
            config.idle_poll_us = us;
        }
        if let Some(limit) = self.client_output_buffer_limit
            && let Some(pubsub) = OutputLimit::parse(&limit).map_err(ConfigError::OutputLimit)?
        {
            config.pubsub_output_limit = pubsub;
        }
        Ok(())
    }
}

impl Config {
    /// Makes this a node of the cluster `map`, with the defaults a cluster node needs.
    ///
    /// It does not idle-poll (`idle_poll_us` 0; a config file or `--idle-poll-us` applied
    /// afterwards still sets it): its replies wait for other nodes (forwards, votes,
    /// decisions) and, when replicated, for its partitions' logs, and its peers need the
    /// cores, which a poller spinning through those gaps took. Replicated, ycsb-a through a
    /// node of three on one 2-core machine: 3 362 and 3 837 txn/s polling 100 µs, 4 549 and
    /// 4 734 not. Unreplicated, deut across three nodes: 23 197 operations per second of
    /// server CPU polling, 33 082 not (ycsb-a and deut within a node unchanged).
    pub fn set_cluster(&mut self, map: std::sync::Arc<keel_cluster::Membership>) {
        self.cluster = Some(map);
        self.idle_poll_us = 0;
    }

    /// Checks settings that depend on each other; called by the server before it binds.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.protected_mode && self.requirepass.is_none() && !self.bind.is_loopback() {
            return Err(ConfigError::Protected(self.bind));
        }
        check_split_phase(self.split_phase_ms)?;
        if self.threads > THREADS_MAX {
            return Err(ConfigError::Threads {
                value: self.threads,
                max: THREADS_MAX,
            });
        }
        check_idle_poll(self.idle_poll_us)?;
        let nodes = self.cluster.as_ref().map_or(1, |m| m.nodes().len());
        if self.replicas == 0 || self.replicas > nodes {
            return Err(ConfigError::Replicas {
                value: self.replicas,
                nodes,
            });
        }
        if let Some(map) = &self.cluster {
            let me = map.me();
            if self.port != 0 && self.port != me.addr.port() {
                return Err(ConfigError::ClusterPort {
                    node: me.id.to_string(),
                    addr: me.addr,
                    port: self.port,
                });
            }
        }
        check_bulk_len(self.proto_max_bulk_len)
    }

    /// The engine's options for these settings.
    pub fn engine_options(&self) -> keel::Options {
        let options = keel::Options::default()
            .durability(self.durability.engine())
            .split(self.split)
            .split_phase(std::time::Duration::from_millis(self.split_phase_ms));
        match &self.sim_disk {
            Some(disk) => options.disk(disk.reboot()),
            None => options,
        }
    }
}

/// Parses a `split` value: `auto`, `off` or `force`.
pub fn parse_split(s: &str) -> Result<keel::SplitMode, ConfigError> {
    s.parse().map_err(|_| ConfigError::Split(s.to_owned()))
}

/// Checks a `split-phase-ms` value.
pub fn check_split_phase(ms: u64) -> Result<(), ConfigError> {
    if !(1..=SPLIT_PHASE_MS_MAX).contains(&ms) {
        return Err(ConfigError::SplitPhase {
            value: ms,
            max: SPLIT_PHASE_MS_MAX,
        });
    }
    Ok(())
}

/// One of Redis' encoding thresholds.
pub struct Threshold {
    pub name: &'static str,
    /// The name Redis 6 used, which Redis 7 still accepts.
    pub alias: Option<&'static str>,
    pub default: i64,
    pub min: i64,
    pub max: i64,
}

/// Redis' encoding thresholds, in [`Encodings`] order. keel's storage does not depend on them:
/// `CONFIG SET` accepts and reports them so that tools which set them keep working, and
/// `OBJECT ENCODING` answers by them as Redis would.
pub const THRESHOLDS: [Threshold; 7] = [
    Threshold {
        name: "hash-max-listpack-entries",
        alias: Some("hash-max-ziplist-entries"),
        default: 512,
        min: 0,
        max: i64::MAX,
    },
    Threshold {
        name: "hash-max-listpack-value",
        alias: Some("hash-max-ziplist-value"),
        default: 64,
        min: 0,
        max: i64::MAX,
    },
    Threshold {
        name: "zset-max-listpack-entries",
        alias: Some("zset-max-ziplist-entries"),
        default: 128,
        min: 0,
        max: i64::MAX,
    },
    Threshold {
        name: "zset-max-listpack-value",
        alias: Some("zset-max-ziplist-value"),
        default: 64,
        min: 0,
        max: i64::MAX,
    },
    Threshold {
        name: "set-max-intset-entries",
        alias: None,
        default: 512,
        min: 0,
        max: i64::MAX,
    },
    Threshold {
        name: "list-max-listpack-size",
        alias: Some("list-max-ziplist-size"),
        default: -2,
        min: i32::MIN as i64,
        max: i32::MAX as i64,
    },
    Threshold {
        name: "list-compress-depth",
        alias: None,
        default: 0,
        min: 0,
        max: i32::MAX as i64,
    },
];

/// The current values of [`THRESHOLDS`].
pub struct Encodings([std::sync::atomic::AtomicI64; THRESHOLDS.len()]);

impl Default for Encodings {
    fn default() -> Encodings {
        Encodings(THRESHOLDS.map(|t| std::sync::atomic::AtomicI64::new(t.default)))
    }
}

impl Encodings {
    /// The index in [`THRESHOLDS`] of `name` (lower case) or its alias.
    pub fn find(name: &str) -> Option<usize> {
        THRESHOLDS
            .iter()
            .position(|t| t.name == name || t.alias == Some(name))
    }

    /// Parses a value for threshold `i`, with Redis' error texts.
    pub fn parse(i: usize, value: &str) -> Result<i64, String> {
        let t = &THRESHOLDS[i];
        let n: i64 = value
            .parse()
            .map_err(|_| "argument couldn't be parsed into an integer".to_string())?;
        if !(t.min..=t.max).contains(&n) {
            return Err(format!(
                "argument must be between {} and {} inclusive",
                t.min, t.max
            ));
        }
        Ok(n)
    }

    pub fn get(&self, i: usize) -> i64 {
        self.0[i].load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn set(&self, i: usize, value: i64) {
        self.0[i].store(value, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn hash_entries(&self) -> i64 {
        self.get(0)
    }

    pub fn hash_value(&self) -> i64 {
        self.get(1)
    }

    pub fn zset_entries(&self) -> i64 {
        self.get(2)
    }

    pub fn zset_value(&self) -> i64 {
        self.get(3)
    }

    pub fn intset_entries(&self) -> i64 {
        self.get(4)
    }
}

/// Checks a `proto-max-bulk-len` value.
pub fn check_bulk_len(value: i64) -> Result<(), ConfigError> {
    if !(1024..=PROTO_MAX_BULK_LEN_MAX).contains(&value) {
        return Err(ConfigError::BulkLen {
            value,
            max: PROTO_MAX_BULK_LEN_MAX,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durability_parses() {
        assert_eq!("sync".parse(), Ok(Durability::Sync));
        assert_eq!("async:1000".parse(), Ok(Durability::Async { ms: 1000 }));
        assert_eq!("none".parse(), Ok(Durability::None));
        assert!("async:".parse::<Durability>().is_err());
        assert!("async:0".parse::<Durability>().is_err());
        assert!("fast".parse::<Durability>().is_err());
    }

    #[test]
    fn file_overrides_defaults() {
        let file = FileConfig::parse(
            "port = 7000\nbind = \"0.0.0.0\"\ndurability = \"none\"\nprotected-mode = \"no\"\nrequirepass = \"pw\"\n",
        )
        .expect("valid file");
        let mut config = Config::default();
        file.apply(&mut config).expect("valid values");
        assert_eq!(config.port, 7000);
        assert_eq!(config.durability, Durability::None);
        assert!(!config.protected_mode);
        assert_eq!(config.requirepass.as_deref(), Some("pw"));
        assert!(FileConfig::parse("nosuch = 1").is_err());
    }

    #[test]
    fn split_settings() {
        let mut config = Config::default();
        assert_eq!(config.split, keel::SplitMode::Auto);
        assert_eq!(config.split_phase_ms, 20);
        FileConfig::parse("split = \"force\"\nsplit-phase-ms = 5\n")
            .expect("valid file")
            .apply(&mut config)
            .expect("valid values");
        assert_eq!(config.split, keel::SplitMode::Force);
        assert_eq!(config.split_phase_ms, 5);
        assert!(config.validate().is_ok());
        let options = config.engine_options();
        assert_eq!(options.split, keel::SplitMode::Force);
        assert_eq!(options.split_phase, std::time::Duration::from_millis(5));
        assert_eq!(parse_split("off"), Ok(keel::SplitMode::Off));
        assert_eq!(
            FileConfig::parse("split = \"sometimes\"")
                .expect("valid TOML")
                .apply(&mut config),
            Err(ConfigError::Split("sometimes".into()))
        );
        for bad in [0, SPLIT_PHASE_MS_MAX + 1] {
            config.split_phase_ms = bad;
            assert!(matches!(
                config.validate(),
                Err(ConfigError::SplitPhase { value, .. }) if value == bad
            ));
        }
    }

    #[test]
    fn poller() {
        let mut config = Config::default();
        assert_eq!(config.poller, PollerMode::Off);
        assert_eq!(config.idle_poll_us, IDLE_POLL_US_DEFAULT);
        FileConfig::parse("poller = \"on\"\nidle-poll-us = 0")
            .expect("valid file")
            .apply(&mut config)
            .expect("valid values");
        assert_eq!((config.poller, config.idle_poll_us), (PollerMode::On, 0));
        for (bad, says) in [("sometimes", "not \"sometimes\""), ("auto", "removed")] {
            let file = FileConfig::parse(&format!("poller = \"{bad}\"")).expect("valid TOML");
            let err = file.apply(&mut config).expect_err("refused").to_string();
            assert!(err.contains(says), "{err}");
        }
        config.idle_poll_us = IDLE_POLL_US_MAX + 1;
        assert!(matches!(
            config.validate(),
            Err(ConfigError::IdlePoll { value, .. }) if value == IDLE_POLL_US_MAX + 1
        ));
    }

    #[test]
    fn output_limit() {
        let mut config = Config::default();
        assert_eq!(
            config.pubsub_output_limit.redis_value(),
            "normal 0 0 0 slave 268435456 67108864 60 pubsub 33554432 8388608 60"
        );
        FileConfig::parse("client-output-buffer-limit = \"pubsub 1mb 1k 5\"")
            .expect("valid file")
            .apply(&mut config)
            .expect("valid values");
        assert_eq!(
            config.pubsub_output_limit,
            OutputLimit {
                hard_bytes: 1 << 20,
                soft_bytes: 1000,
                soft_seconds: 5
            }
        );
        let same = OutputLimit::parse(&config.pubsub_output_limit.redis_value());
        assert_eq!(same, Ok(Some(config.pubsub_output_limit)));
        assert_eq!(OutputLimit::parse("normal 0 0 0"), Ok(None));
        assert_eq!(
            OutputLimit::parse("pubsub 1mb"),
            Err(OUTPUT_LIMIT_ARITY.into())
        );
        assert_eq!(
            OutputLimit::parse("others 1 1 1"),
            Err(OUTPUT_LIMIT_CLASS.into())
        );
        for bad in [
            "pubsub x 1 1",
            "pubsub 1 1 -1",
            "pubsub 1tb 1 1",
            "pubsub -1 1 1",
        ] {
            assert_eq!(
                OutputLimit::parse(bad),
                Err(OUTPUT_LIMIT_NUMBER.into()),
                "{bad}"
            );
        }
        assert!(OutputLimit::parse("normal 1mb 0 0").is_err());
    }

    #[test]
    fn threads() {
        let mut config = Config::default();
        assert_eq!(config.threads, 0, "one per core by default");
        FileConfig::parse("threads = 3")
            .expect("valid file")
            .apply(&mut config)
            .expect("valid values");
        assert_eq!(config.threads, 3);
        assert!(config.validate().is_ok());
        config.threads = THREADS_MAX + 1;
        assert!(matches!(
            config.validate(),
            Err(ConfigError::Threads { value, .. }) if value == THREADS_MAX + 1
        ));
    }

    #[test]
    fn protected_mode() {
        let mut config = Config {
            bind: "0.0.0.0".parse().expect("ip"),
            ..Config::default()
        };
        assert!(matches!(config.validate(), Err(ConfigError::Protected(_))));
        config.requirepass = Some("pw".into());
        assert!(config.validate().is_ok());
        config.requirepass = None;
        config.protected_mode = false;
        assert!(config.validate().is_ok());
    }
}

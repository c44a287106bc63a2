//! What a benchmark runs against: the [`Target`] trait, its per-thread [`Worker`]s, and the
//! [`Tx`] operations a workload transaction is made of.
//!
//! Embedded engines implement [`Engine`] (run one transaction body once, report commit or
//! conflict) and get a [`Worker`] from [`embedded_worker`]; the RESP client implements
//! [`Worker`] directly because it pipelines whole transactions. Retrying aborted
//! transactions is the runner's job, never a target's.

use std::fmt;

use crate::workload::{self, Stream, Txn, Writer};

/// Why a transaction step stopped.
#[derive(Debug)]
pub enum Fail {
    /// A concurrency-control conflict: the transaction aborts and the runner retries it.
    Conflict,
    /// Anything else stops the benchmark.
    Error(anyhow::Error),
}

impl Fail {
    /// Wraps any error as [`Fail::Error`].
    pub fn error<E: Into<anyhow::Error>>(e: E) -> Fail {
        Fail::Error(e.into())
    }
}

impl From<anyhow::Error> for Fail {
    fn from(e: anyhow::Error) -> Fail {
        Fail::Error(e)
    }
}

impl fmt::Display for Fail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fail::Conflict => f.write_str("conflict"),
            Fail::Error(e) => write!(f, "{e:#}"),
        }
    }
}

/// The outcome of one transaction step.
pub type Step<T = ()> = Result<T, Fail>;

/// The 8-byte big-endian form every target stores a key in.
pub fn key_bytes(key: u64) -> [u8; 8] {
    key.to_be_bytes()
}

/// Parses an integer stored as decimal text (as keel and Redis store counters); a missing
/// value counts as 0.
pub fn parse_int(value: Option<&[u8]>) -> Step<i64> {
    match value {
        None => Ok(0),
        Some(v) => keel::parse_int(b"", v)
            .map_err(|_| Fail::Error(anyhow::anyhow!("value {v:?} is not an integer"))),
    }
}

/// Operations inside one transaction. Reads in a read-write transaction must be
/// conflict-checked (serializable); `add`, `max` and `put_ordered` default to a checked read
/// followed by a write, which engines with native commutative operations override.
pub trait Tx {
    /// Announces the keys the transaction is about to touch, as a client that knows them up
    /// front would: an engine with a batch-prefetch API starts their loads together. The
    /// default does nothing.
    fn prefetch(&mut self, _keys: &[u64]) {}
    /// Reads `key` and hands the value (or `None`) to `f`.
    fn read(&mut self, key: u64, f: &mut dyn FnMut(Option<&[u8]>)) -> Step;
    /// Writes `value` under `key`.
    fn write(&mut self, key: u64, value: &[u8]) -> Step;
    /// Reads up to `len` records with keys `>= start`, in key order. Read-only transactions
    /// only.
    fn scan(&mut self, start: u64, len: u32, f: &mut dyn FnMut(&[u8], &[u8])) -> Step;

    /// Adds `delta` to the integer under `key`.
    fn add(&mut self, key: u64, delta: i64) -> Step {
        let mut old = Ok(0);
        self.read(key, &mut |v| old = parse_int(v))?;
        let new = old?.wrapping_add(delta);
        self.write(key, new.to_string().as_bytes())
    }

    /// Keeps the larger of the integer under `key` and `n`.
    fn max(&mut self, key: u64, n: i64) -> Step {
        let mut old = Ok(0);
        self.read(key, &mut |v| old = parse_int(v))?;
        let old = old?;
        if n > old {
            self.write(key, n.to_string().as_bytes())?;
        }
        Ok(())
    }

    /// Stores `value` with `order` unless the stored value has a higher order; the stored
    /// bytes are [`keel::encode_ordered`]`(order, value)`.
    fn put_ordered(&mut self, key: u64, order: u64, value: &[u8]) -> Step {
        let mut old = None;
        self.read(key, &mut |v| {
            old = v.and_then(keel::decode_ordered).map(|(o, _)| o)
        })?;
        if old.is_none_or(|old| order >= old) {
            self.write(key, &keel::encode_ordered(order, value))?;
        }
        Ok(())
    }
}

/// One thread's handle on an embedded engine.
pub trait Engine {
    /// Runs `body` once inside one transaction (a snapshot when `read_only`) and tries to
    /// commit: `Ok(true)` committed, `Ok(false)` aborted by a conflict (nothing written).
    fn transaction(
        &mut self,
        read_only: bool,
        body: &mut dyn FnMut(&mut dyn Tx) -> Step,
    ) -> anyhow::Result<bool>;
}

/// Runs one transaction of a stream once.
pub trait Worker {
    /// Transactions sent together (pipelining depth); 1 for embedded engines.
    fn depth(&self) -> usize {
        1
    }
    /// Attempts every transaction of `batch` whose `done` flag is false, setting it when the
    /// transaction commits. A conflict leaves the flag false; the runner retries.
    fn attempt(&mut self, stream: &Stream, batch: &[Txn], done: &mut [bool]) -> anyhow::Result<()>;
}

struct Embedded<E> {
    engine: E,
    writer: Writer,
}

impl<E: Engine> Worker for Embedded<E> {
    fn attempt(&mut self, stream: &Stream, batch: &[Txn], done: &mut [bool]) -> anyhow::Result<()> {
        for (txn, done) in batch.iter().zip(done) {
            if *done {
                continue;
            }
            let keys = stream.keys(txn);
            let writer = &mut self.writer;
            let mut failure = None;
            let committed = self.engine.transaction(txn.kind.read_only(), &mut |tx| {
                match workload::execute(txn, keys, tx, writer) {
                    Err(Fail::Error(e)) => {
                        // Keep the cause; the engine only needs to know to abort.
                        failure = Some(e);
                        Err(Fail::Conflict)
                    }
                    other => other,
                }
            })?;
            if let Some(e) = failure {
                return Err(e);
            }
            *done = committed;
        }
        Ok(())
    }
}

/// A [`Worker`] for an embedded engine handle, writing values stamped with `thread`.
pub fn embedded_worker<'a, E: Engine + 'a>(engine: E, thread: u32) -> Box<dyn Worker + 'a> {
    Box::new(Embedded {
        engine,
        writer: Writer::new(thread),
    })
}

/// Something a benchmark runs against: an engine in this process or a server.
pub trait Target: Send + Sync {
    /// The name in reports (`keel`, `rocksdb-occ`, ...).
    fn name(&self) -> String;
    /// The isolation level its read-write transactions run at, and how, in a few words.
    fn isolation(&self) -> &'static str;
    /// The durability it runs with (`none`, `async`, `sync`).
    fn durability(&self) -> &'static str;
    /// Writes the initial records, outside any timing; `progress` is called with the number
    /// of records written so far, now and then.
    fn load(
        &self,
        records: &mut dyn Iterator<Item = (u64, Vec<u8>)>,
        progress: &mut dyn FnMut(u64),
    ) -> anyhow::Result<()>;
    /// A handle for one client thread.
    fn worker(&self, thread: u32) -> anyhow::Result<Box<dyn Worker + '_>>;
    /// Reads `key` outside the benchmark (to check what was written).
    fn get(&self, key: u64) -> anyhow::Result<Option<Vec<u8>>>;
}

/// How durable a commit must be before it is acknowledged; matched across targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Memory only: no log, or a log never written (RocksDB `disable_wal`, fjall and redb
    /// `Durability::None`, LMDB `NO_SYNC | NO_META_SYNC`).
    None,
    /// Logged, flushed to the OS but not fsynced per commit.
    Async,
    /// fsync before the commit is acknowledged.
    Sync,
}

impl Durability {
    /// The name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Durability::None => "none",
            Durability::Async => "async",
            Durability::Sync => "sync",
        }
    }
}

impl std::str::FromStr for Durability {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Durability> {
        match s {
            "none" => Ok(Durability::None),
            "async" => Ok(Durability::Async),
            "sync" => Ok(Durability::Sync),
            _ => anyhow::bail!("unknown durability {s:?}; expected none, async or sync"),
        }
    }
}

/// What opening a target needs to know.
#[derive(Debug, Clone)]
pub struct Open {
    /// Keys `0..key_space` may be touched (sizes indexes and the ceiling array).
    pub key_space: u64,
    /// Durability to run with.
    pub durability: Durability,
    /// Where on-disk peers put their files (a fresh temporary directory inside it).
    pub dir: std::path::PathBuf,
    /// keel's splitting of contended records (other targets ignore it).
    pub split: keel::SplitMode,
}

/// Embedded targets built into every build (also `keel/auto`, `keel/off`, `keel/force`: keel
/// with that split mode whatever `--split` says).
pub const BUILTIN: [&str; 3] = ["keel", "ceiling-array", "ceiling-hash"];

/// Embedded targets behind the `peers` feature.
pub const PEERS: [&str; 5] = ["rocksdb-occ", "rocksdb-pess", "fjall", "redb", "lmdb"];

/// Opens the embedded target called `name`.
pub fn open(name: &str, open: &Open) -> anyhow::Result<Box<dyn Target>> {
    use crate::engines::{CeilingArray, CeilingHash, Keel};
    if name.starts_with("ceiling") && open.durability != Durability::None {
        anyhow::bail!("{name} is memory only; run it with --durability none");
    }
    if let Some(mode) = name.strip_prefix("keel/") {
        // keel with its own split mode, so that split variants run side by side.
        let split = mode
            .parse::<keel::SplitMode>()
            .map_err(|e| anyhow::anyhow!("target {name:?}: {e}"))?;
        return Ok(Box::new(Keel::named(
            &Open {
                split,
                ..open.clone()
            },
            name,
        )?));
    }
    match name {
        "keel" => Ok(Box::new(Keel::new(open)?)),
        "ceiling-array" => Ok(Box::new(CeilingArray::new(open.key_space)?)),
        "ceiling-hash" => Ok(Box::new(CeilingHash::new(open.key_space))),
        #[cfg(feature = "peers")]
        _ if PEERS.contains(&name) => crate::peers::open(name, open),
        #[cfg(not(feature = "peers"))]
        _ if PEERS.contains(&name) => anyhow::bail!(
            "target {name} needs the `peers` cargo feature: cargo run --release -p keel-cli --features peers -- bench ..."
        ),
        _ => anyhow::bail!(
            "unknown target {name:?}; expected one of {}, {}",
            BUILTIN.join(", "),
            PEERS.join(", ")
        ),
    }
}

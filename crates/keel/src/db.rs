//! The database handle: options, opening, statistics and the retrying `transact` helper.

use std::sync::Arc;
use std::time::Duration;

use crate::concurrency::{Oracle, SlotStats};
use crate::error::{BeginError, TransactError};
use crate::limits::TRANSACT_ATTEMPTS_MAX;
use crate::store::{MemStore, Store};
use crate::txn::{Snapshot, Txn};
use crate::{Error, Ts};

/// Settings for a database.
///
/// ```
/// let options = keel::Options::default().capacity_hint(1 << 20);
/// let db = keel::Db::with_options(options);
/// # drop(db);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Options {
    /// Keys expected; the point index is sized for this many before it first grows.
    /// Growing is correct at any size but pauses inserts (never reads) while it copies.
    pub capacity_hint: usize,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            capacity_hint: 1 << 16,
        }
    }
}

impl Options {
    /// Sets [`Options::capacity_hint`].
    pub fn capacity_hint(mut self, keys: usize) -> Options {
        self.capacity_hint = keys;
        self
    }
}

pub(crate) struct Shared {
    pub(crate) oracle: Oracle,
    pub(crate) store: MemStore,
}

/// A database. Cheap to clone; clones share the same data.
///
/// ```
/// let db = keel::Db::in_memory();
/// let mut txn = db.begin()?;
/// txn.put(b"alice", b"10")?;
/// txn.add(b"visits", 1)?;
/// let committed_at = txn.commit()?.expect("nobody else is running");
///
/// let snapshot = db.snapshot()?;
/// assert_eq!(snapshot.get(b"alice")?, Some(b"10".to_vec()));
/// assert_eq!(snapshot.get(b"visits")?, Some(b"1".to_vec()));
/// assert!(snapshot.read_ts() >= committed_at);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Db {
    shared: Arc<Shared>,
}

/// Counters describing what a database has done; each is a sum over all transactions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Committed read-write transactions (with at least one write).
    pub commits: u64,
    /// Committed transactions that wrote nothing, and finished snapshots.
    pub read_only_commits: u64,
    /// Aborts because a key to be written was locked by another committer.
    pub aborts_write_locked: u64,
    /// Aborts because a key read had changed since the snapshot.
    pub aborts_read_changed: u64,
    /// Aborts because a scanned range had changed since the snapshot.
    pub aborts_phantom: u64,
    /// Versions held in memory, over all keys (live and reclaimable-but-not-yet-reclaimed).
    pub versions: u64,
    /// Records (keys ever written, including deleted ones whose record remains).
    pub records: u64,
    /// Bytes mapped for records (keys and their first versions); later versions are
    /// allocated separately.
    pub record_bytes: u64,
    /// The newest timestamp whose commits are all visible.
    pub visible_ts: Ts,
    /// The garbage-collection horizon: versions older than what a snapshot at this
    /// timestamp sees are reclaimed.
    pub gc_horizon_ts: Ts,
}

impl Db {
    /// An empty in-memory database with default options.
    pub fn in_memory() -> Db {
        Db::with_options(Options::default())
    }

    /// An empty in-memory database.
    pub fn with_options(options: Options) -> Db {
        Db {
            shared: Arc::new(Shared {
                oracle: Oracle::new(Ts(0)),
                store: MemStore::new(options.capacity_hint),
            }),
        }
    }

    /// Begins a read-write transaction. It reads one consistent snapshot, buffers its
    /// writes, and is validated at commit; dropping it aborts it.
    pub fn begin(&self) -> Result<Txn<'_>, BeginError> {
        Txn::begin(&self.shared)
    }

    /// Opens a read-only snapshot of everything committed so far. It never blocks writers
    /// and never aborts.
    pub fn snapshot(&self) -> Result<Snapshot<'_>, BeginError> {
        Snapshot::begin(&self.shared)
    }

    /// Runs `body` in a transaction and commits it, retrying on conflicts with bounded
    /// exponential backoff, at most [`TRANSACT_ATTEMPTS_MAX`] times. `body` may run more than
    /// once, so it should have no effects outside the transaction.
    ///
    /// ```
    /// let db = keel::Db::in_memory();
    /// db.transact(|txn| txn.put(b"a", b"1"))?;
    /// let moved = db.transact(|txn| {
    ///     let a = txn.get(b"a")?.unwrap_or_default();
    ///     txn.put(b"b", &a)?;
    ///     txn.delete(b"a")?;
    ///     Ok::<_, keel::Error>(a.len())
    /// })?;
    /// assert_eq!(moved, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn transact<T, E>(
        &self,
        mut body: impl FnMut(&mut Txn<'_>) -> Result<T, E>,
    ) -> Result<T, TransactError<E>>
    where
        E: From<Error>,
    {
        let mut backoff = Duration::from_micros(1);
        let mut attempt = 1;
        loop {
            let mut txn = self.begin()?;
            let value = body(&mut txn).map_err(TransactError::Aborted)?;
            match txn.commit()? {
                Ok(_) => return Ok(value),
                Err(last) if attempt >= TRANSACT_ATTEMPTS_MAX => {
                    return Err(TransactError::Conflicts {
                        attempts: attempt,
                        last,
                    });
                }
                Err(_) => {}
            }
            attempt += 1;
            if backoff < Duration::from_micros(50) {
                for _ in 0..(1 << attempt.min(6)) {
                    std::hint::spin_loop();
                }
                std::thread::yield_now();
            } else {
                std::thread::sleep(backoff);
            }
            backoff = (backoff * 2).min(Duration::from_millis(2));
        }
    }

    /// Counters summed over all transactions so far.
    pub fn stats(&self) -> Stats {
        let oracle = &self.shared.oracle;
        let sum = |f: fn(&SlotStats) -> i64| u64::try_from(oracle.sum(f)).unwrap_or(0);
        use std::sync::atomic::Ordering::Relaxed;
        Stats {
            commits: sum(|s| s.commits.load(Relaxed) as i64),
            read_only_commits: sum(|s| s.read_only_commits.load(Relaxed) as i64),
            aborts_write_locked: sum(|s| s.aborts_write_locked.load(Relaxed) as i64),
            aborts_read_changed: sum(|s| s.aborts_read_changed.load(Relaxed) as i64),
            aborts_phantom: sum(|s| s.aborts_phantom.load(Relaxed) as i64),
            versions: sum(|s| s.versions.load(Relaxed)),
            records: self.shared.store.len() as u64,
            record_bytes: self.shared.store.arena_bytes() as u64,
            visible_ts: oracle.visible(),
            gc_horizon_ts: oracle.horizon(),
        }
    }

    /// Recomputes the garbage-collection horizon now. Commits do this on their own every
    /// few hundred transactions; versions are reclaimed when their key is next written.
    pub fn collect_garbage(&self) {
        self.shared.oracle.collect();
    }
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Db").field("stats", &self.stats()).finish()
    }
}

//! The database handle: options, opening and recovery, checkpoints, statistics, and the
//! retrying `transact` helper.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::checkpoint::{self, MANIFEST, Manifest};
use crate::concurrency::{Oracle, SlotStats};
use crate::error::{BeginError, OpenError, TransactError};
use crate::index::hash;
use crate::io::{Disk, OsDisk};
use crate::limits::{DECISION_WAIT_MAX, TRANSACT_ATTEMPTS_MAX};
use crate::mvcc::RecordRef;
use crate::replay::{self, Replayed};
use crate::split::{Joined, SplitMode, Splitter};
use crate::store::{KeyRange, MemStore, Store};
use crate::txn::{Snapshot, Txn};
use crate::wal::format::{Entry, Kind, segment_name};
use crate::wal::reader::{self, SegmentFrames};
use crate::wal::{Durability, Log, LogFailed, Tail};
use crate::{Error, Ts};

/// Settings for a database.
///
/// ```
/// use std::time::Duration;
/// let options = keel::Options::default()
///     .capacity_hint(1 << 20)
///     .durability(keel::Durability::Async { interval: Duration::from_millis(100) });
/// # drop(options);
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub struct Options {
    /// Keys expected; the point index is sized for this many before it first grows.
    /// Growing is correct at any size but pauses inserts (never reads) while it copies.
    pub capacity_hint: usize,
    /// When commits are acknowledged relative to the disk. Default: [`Durability::Sync`].
    /// [`Durability::None`] keeps everything in memory and writes no files.
    pub durability: Durability,
    /// A checkpoint starts once this many log bytes were written since the last one.
    pub checkpoint_log_bytes: u64,
    /// A checkpoint starts at least this often while anything is written.
    pub checkpoint_interval: Duration,
    /// Log segments are rotated at about this size.
    pub segment_bytes: u64,
    /// Threads that replay the checkpoint and the log at open.
    pub recovery_threads: usize,
    /// Whether contended records are split into per-core slices (Doppel's phase
    /// reconciliation). Default: [`SplitMode::Auto`].
    pub split: SplitMode,
    /// Longest split phase, and so the longest a transaction that reads a split record (or
    /// writes it with a non-commutative operation) waits for its reconciliation. Default:
    /// 20 ms, as in Doppel.
    pub split_phase: Duration,
    /// In [`SplitMode::Auto`], a record is split once commits applying commutative
    /// operations waited this many times for its lock within one phase length. Default: 64.
    pub split_contention: u32,
    /// How often the collector's thread looks for deleted keys to reclaim. Commits that
    /// delete run passes of their own in between (every 8 deletes), so this bounds how
    /// long deletes that stopped short of that wait. Default: 10 ms.
    pub collector_interval: Duration,
    disk: Option<Arc<dyn Disk>>,
    ts_lease_step: u64,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            capacity_hint: 1 << 16,
            durability: Durability::Sync,
            checkpoint_log_bytes: 256 << 20,
            checkpoint_interval: Duration::from_secs(300),
            segment_bytes: 64 << 20,
            recovery_threads: std::thread::available_parallelism().map_or(2, usize::from),
            split: SplitMode::Auto,
            split_phase: Duration::from_millis(20),
            split_contention: 64,
            collector_interval: GC_INTERVAL,
            disk: None,
            ts_lease_step: TS_LEASE_STEP,
        }
    }
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("capacity_hint", &self.capacity_hint)
            .field("durability", &self.durability)
            .field("checkpoint_log_bytes", &self.checkpoint_log_bytes)
            .field("checkpoint_interval", &self.checkpoint_interval)
            .field("segment_bytes", &self.segment_bytes)
            .field("recovery_threads", &self.recovery_threads)
            .field("split", &self.split)
            .field("split_phase", &self.split_phase)
            .field("split_contention", &self.split_contention)
            .field("simulated_disk", &self.disk.is_some())
            .field("ts_lease_step", &self.ts_lease_step)
            .finish()
    }
}

impl Options {
    /// Sets [`Options::capacity_hint`].
    pub fn capacity_hint(mut self, keys: usize) -> Options {
        self.capacity_hint = keys;
        self
    }

    /// Sets [`Options::durability`].
    pub fn durability(mut self, durability: Durability) -> Options {
        self.durability = durability;
        self
    }

    /// Sets [`Options::checkpoint_log_bytes`].
    pub fn checkpoint_log_bytes(mut self, bytes: u64) -> Options {
        self.checkpoint_log_bytes = bytes;
        self
    }

    /// Sets [`Options::collector_interval`].
    pub fn collector_interval(mut self, interval: Duration) -> Options {
        self.collector_interval = interval;
        self
    }

    /// Sets [`Options::checkpoint_interval`].
    pub fn checkpoint_interval(mut self, interval: Duration) -> Options {
        self.checkpoint_interval = interval;
        self
    }

    /// Sets [`Options::segment_bytes`].
    pub fn segment_bytes(mut self, bytes: u64) -> Options {
        self.segment_bytes = bytes.max(4096);
        self
    }

    /// Sets [`Options::recovery_threads`].
    pub fn recovery_threads(mut self, threads: usize) -> Options {
        self.recovery_threads = threads.max(1);
        self
    }

    /// Sets [`Options::split`].
    pub fn split(mut self, mode: SplitMode) -> Options {
        self.split = mode;
        self
    }

    /// Sets [`Options::split_phase`] (at least 100 µs).
    pub fn split_phase(mut self, phase: Duration) -> Options {
        self.split_phase = phase.max(Duration::from_micros(100));
        self
    }

    /// Sets [`Options::split_contention`] (at least 1).
    pub fn split_contention(mut self, waits: u32) -> Options {
        self.split_contention = waits.max(1);
        self
    }

    fn split_settings(&self) -> crate::split::Settings {
        crate::split::Settings {
            mode: self.split,
            phase: self.split_phase,
            contention: self.split_contention,
        }
    }

    /// Routes all file I/O through `disk` (tests use [`SimDisk`](crate::SimDisk)).
    pub fn disk(mut self, disk: impl Disk) -> Options {
        self.disk = Some(Arc::new(disk));
        self
    }

    /// How many commit timestamps one lease frame covers (at least 2; default 2^20): for
    /// tests, which reach a lease's end in a few commits with a small step.
    #[doc(hidden)]
    pub fn ts_lease_step(mut self, step: u64) -> Options {
        self.ts_lease_step = step.max(2);
        self
    }
}

/// What opening a database found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Recovery {
    /// The checkpoint loaded, and how many keys it held.
    pub checkpoint: Option<(String, u64)>,
    /// Log frames (commits) replayed after the checkpoint.
    pub log_frames: u64,
    /// Bytes of log replayed.
    pub log_bytes: u64,
    /// A torn tail cut from the log: file, offset, bytes cut.
    pub torn_tail: Option<(PathBuf, u64, u64)>,
    /// The newest commit timestamp recovered.
    pub last_ts: Ts,
    /// Prepared transactions found without a decision ([`Db::in_doubt`]).
    pub in_doubt: usize,
    /// How long recovery took.
    pub elapsed: Duration,
    /// Of `elapsed`, how long building the ordered index from the recovered keys took.
    pub index_elapsed: Duration,
}

struct Files {
    disk: Arc<dyn Disk>,
    dir: PathBuf,
    checkpoint: Mutex<CheckpointState>,
    options: Options,
    _lock: Box<dyn Send + Sync>,
}

struct CheckpointState {
    /// The log position after the newest checkpoint's own lease frame: what was logged past
    /// it is what the next checkpoint would take in (its size makes a checkpoint due).
    baseline_lsn: u64,
    at: Instant,
}

pub(crate) struct Shared {
    pub(crate) oracle: Arc<Oracle>,
    pub(crate) store: MemStore,
    pub(crate) log: Option<Log>,
    pub(crate) splitter: Splitter,
    files: Option<Files>,
    recovered_versions: AtomicI64,
    checkpoints: AtomicU64,
    /// Commit timestamps are handed out only below this lease, which a durable log frame
    /// records (see [`Shared::next_commit_ts`]); `u64::MAX` without a log.
    ts_lease: AtomicU64,
    /// The next lease, logged and on its way to disk; held while a lease is logged.
    lease_renewal: Mutex<Option<LeaseRenewal>>,
    /// The end LSN of `lease_renewal`'s frame, 0 if none: commits check it without the lock
    /// while the frame is on its way.
    lease_renewal_end: AtomicU64,
    /// How many timestamps one lease covers ([`Options::ts_lease_step`]); commits renew the
    /// lease from half a step below it on.
    ts_lease_step: u64,
    /// Prepared transactions recovery found undecided, until [`Db::in_doubt`] takes them.
    in_doubt: Mutex<Vec<InDoubt>>,
    /// The collector thread's signal: set, it stops; notified, it runs a pass now
    /// ([`Shared::wake_collector`]: a two-phase commit's decision that made one due).
    collector_signal: StopSignal,
    /// [`Options::collector_interval`].
    collector_interval: Duration,
    /// Until when commits that write are refused as if a prepared transaction held every
    /// key ([`Db::hold_writes_for`]); `None` once that passed.
    writes_held_until: Mutex<Option<Instant>>,
    /// Whether `writes_held_until` may be set: what a commit checks first.
    writes_held: std::sync::atomic::AtomicBool,
    /// Whether a transaction was ever prepared here (or recovered in doubt): from then on a
    /// read-only commit that began below an unpublished timestamp is validated
    /// ([`crate::Txn::commit`]).
    pub(crate) two_phase: std::sync::atomic::AtomicBool,
}

impl Shared {
    /// Whether commits that write are held back now ([`Db::hold_writes_for`]).
    pub(crate) fn writes_held(&self) -> bool {
        !self.writes_held_for().is_zero()
    }

    /// How much longer commits that write are held back ([`Db::hold_writes_for`]).
    fn writes_held_for(&self) -> Duration {
        if !self.writes_held.load(Ordering::Acquire) {
            return Duration::ZERO;
        }
        let mut until = self.writes_held_until.lock();
        let left = until.map_or(Duration::ZERO, |d| {
            d.saturating_duration_since(Instant::now())
        });
        if left.is_zero() {
            *until = None;
            self.writes_held.store(false, Ordering::Release);
        }
        left
    }
}

/// A prepared transaction recovered without its decision: its records are locked by `owner`.
struct InDoubt {
    owner: crate::mvcc::LockOwner,
    ts: Ts,
    meta: Vec<u8>,
    writes: Vec<(Vec<u8>, RecordRef, Option<Vec<u8>>)>,
}

/// A lease frame logged ahead of need, not yet known to be durable.
#[derive(Debug, Clone, Copy)]
struct LeaseRenewal {
    lease: u64,
    /// The LSN just past its frame.
    end: u64,
}

/// How far one timestamp lease reaches: one lease frame (and fsync) per this many
/// timestamps, and the clock may jump by less than three steps at a restart (a lease is
/// renewed half a step early, and a checkpoint logs one a step above the current lease,
/// which may itself be a step and a half ahead of the clock). Half a step is the commits a renewal's fsync has before a
/// commit must wait for it: with the earlier 2^16, half a step lasted 0.4 s of INCR -P 1 and
/// 60 ms of -P 16, no longer than the slowest fsyncs seen here.
const TS_LEASE_STEP: u64 = 1 << 20;

impl Shared {
    /// Takes the next commit timestamp, which the caller must publish (see
    /// [`Oracle::next_commit_ts`]).
    ///
    /// Timestamps must never go backwards across a restart: a snapshot may have read at a
    /// timestamp that no logged commit carries (one taken by a commit that then lost its
    /// validation, say), and a commit after the restart must still come after it. So the
    /// clock runs under a lease: a timestamp is handed out only below a lease that an empty
    /// log frame records and that is durable. The next lease, a step higher, is logged half a
    /// step ahead ([`Shared::renew_ts_lease`]); a commit waits for it only if the clock
    /// reaches the current lease before that frame is durable. Recovery resumes the clock
    /// above the highest frame timestamp, hence above every timestamp handed out before the
    /// crash.
    pub(crate) fn next_commit_ts(&self) -> Ts {
        let ts = self.oracle.next_commit_ts();
        if ts.0 + self.ts_lease_step / 2 >= self.ts_lease.load(Ordering::Acquire) {
            self.renew_ts_lease(ts);
        }
        ts
    }

    /// For a timestamp past the renewal point: waits for a new lease if `ts` is not under
    /// the current one, and otherwise logs the next lease ahead of need, or publishes it
    /// once it is durable, without waiting.
    ///
    /// A commit that waited for the lease's fsync held up its thread, which for the server's
    /// poller is every connection: under `async:1000` those fsyncs took 20–400 ms on the
    /// VMs here, once every lease step. Renewing half a step ahead leaves that many commits
    /// for the fsync to finish in.
    #[cold]
    fn renew_ts_lease(&self, ts: Ts) {
        let Some(log) = &self.log else { return };
        if ts.0 >= self.ts_lease.load(Ordering::Acquire) {
            self.extend_ts_lease(Some(ts));
            return;
        }
        if log.durable_lsn() < self.lease_renewal_end.load(Ordering::Acquire) {
            return; // the next lease is still on its way to disk
        }
        // A thread holding the lock is renewing the lease (or waiting for it) already.
        let Some(mut renewal) = self.lease_renewal.try_lock() else {
            return;
        };
        match *renewal {
            Some(next) if log.durable_lsn() >= next.end => {
                self.publish_lease(&mut renewal, next.lease);
            }
            Some(_) => {}
            // Renewed since this thread looked: nothing to do.
            None if ts.0 + self.ts_lease_step / 2 < self.ts_lease.load(Ordering::Acquire) => {}
            None => {
                let lease = self.ts_lease.load(Ordering::Acquire) + self.ts_lease_step;
                // After a log failure no commit can succeed any more: nothing to renew.
                if let Ok(end) = log.append(Ts(lease), 0, std::iter::empty()) {
                    log.request_durable(end);
                    *renewal = Some(LeaseRenewal { lease, end });
                    self.lease_renewal_end.store(end, Ordering::Release);
                }
            }
        }
    }

    /// Logs a new timestamp lease above `ts` (above the clock and the current lease when
    /// `None`: a checkpoint renews the lease after the log position it replays from, and
    /// opening a database renews it before the first commit) and waits until it is durable.
    /// A renewal already on its way that covers `ts` is waited for instead. After a log
    /// failure the lease stays where it was: no commit can succeed any more.
    #[cold]
    fn extend_ts_lease(&self, ts: Option<Ts>) {
        let Some(log) = &self.log else { return };
        let mut renewal = self.lease_renewal.lock();
        let current = self.ts_lease.load(Ordering::Acquire);
        let base = match (ts, *renewal) {
            (Some(ts), _) if ts.0 < current => return, // extended meanwhile
            (Some(ts), Some(next)) if next.lease > ts.0 => {
                if log.wait_durable(next.end).is_ok() {
                    self.publish_lease(&mut renewal, next.lease);
                }
                return;
            }
            (Some(ts), _) => ts.0,
            (None, _) => current.max(self.oracle.last_commit_ts().0),
        };
        // Above any renewal on its way, which this one therefore replaces.
        let lease = base + self.ts_lease_step;
        let logged = log
            .append(Ts(lease), 0, std::iter::empty())
            .and_then(|end| log.wait_durable(end));
        if logged.is_ok() {
            self.publish_lease(&mut renewal, lease);
        }
    }

    /// Raises the lease to `lease`, whose frame is durable, and clears the renewal on its
    /// way (which is at or below it). Called with the renewal lock held.
    fn publish_lease(&self, renewal: &mut Option<LeaseRenewal>, lease: u64) {
        self.ts_lease.fetch_max(lease, Ordering::AcqRel);
        *renewal = None;
        self.lease_renewal_end.store(0, Ordering::Release);
    }

    /// Counts versions added (or freed, negative) outside a transaction's slot.
    pub(crate) fn note_versions(&self, versions: i64) {
        self.recovered_versions
            .fetch_add(versions, Ordering::Relaxed);
    }

    /// Whether the log has failed (writes are refused for good).
    pub(crate) fn log_failed(&self) -> bool {
        self.log.as_ref().is_some_and(|log| log.failed().is_some())
    }

    /// Writes a checkpoint; `None` for a database without files.
    fn checkpoint(&self) -> Result<Option<CheckpointInfo>, CheckpointError> {
        let (Some(files), Some(log)) = (&self.files, &self.log) else {
            return Ok(None);
        };
        let mut state = files.checkpoint.lock();
        let started = Instant::now();
        // Every frame before `replay_from` was reserved by a commit that had already taken
        // its timestamp, so at or below `newest`; once the watermark passes `newest`, a
        // snapshot holds all of them.
        let replay_from_lsn = log.tail();
        // The lease frames before `replay_from_lsn` will not be replayed: log a fresh one
        // after it, above every timestamp handed out so far.
        self.extend_ts_lease(None);
        let baseline_lsn = log.tail();
        let newest = self.oracle.last_commit_ts();
        while self.oracle.visible() < newest {
            if let Some(failed) = log.failed() {
                return Err(CheckpointError::Log(failed));
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        let snapshot = Snapshot::begin(self).map_err(CheckpointError::Begin)?;
        let snapshot_ts = snapshot.read_ts();
        let everything = KeyRange {
            lo: std::ops::Bound::Unbounded,
            hi: std::ops::Bound::Unbounded,
        };
        let entries = self.store.scan(everything).filter_map(|record| {
            let r = record.get();
            if !r.is_split() {
                let version = r.visible(snapshot_ts)?;
                return Some((r.key(), version.ts(), Cow::Borrowed(version.value()?)));
            }
            // A split record's value includes its slice entries up to the snapshot; its
            // timestamp is the newest entry's, so that replay skips exactly those entries.
            let (value, ts) = crate::txn::read_at(self, Some(record), snapshot_ts, |v, ts| {
                (v.map(<[u8]>::to_vec), ts)
            })
            .ok()?;
            Some((r.key(), ts?, Cow::Owned(value?)))
        });
        let disk = &*files.disk;
        let (name, keys) =
            checkpoint::write(disk, &files.dir, snapshot_ts, replay_from_lsn, entries)
                .map_err(|e| CheckpointError::Io(files.dir.clone(), e))?;
        drop(snapshot);
        let manifest = Manifest {
            checkpoint: Some(name.clone()),
            snapshot_ts,
            replay_from_lsn,
        };
        manifest
            .write(disk, &files.dir)
            .map_err(|e| CheckpointError::Io(files.dir.join(MANIFEST), e))?;
        state.baseline_lsn = baseline_lsn;
        state.at = Instant::now();
        remove_obsolete(disk, &files.dir, &manifest)
            .map_err(|e| CheckpointError::Io(files.dir.clone(), e))?;
        self.checkpoints.fetch_add(1, Ordering::Relaxed);
        Ok(Some(CheckpointInfo {
            name,
            keys,
            snapshot_ts,
            replay_from_lsn,
            elapsed: started.elapsed(),
        }))
    }

    fn checkpoint_due(&self) -> bool {
        let Some((logged, age)) = self.since_checkpoint() else {
            return false;
        };
        let options = &self.files.as_ref().expect("a log has files").options;
        logged >= options.checkpoint_log_bytes || (logged > 0 && age >= options.checkpoint_interval)
    }

    /// Log bytes written since the newest checkpoint (past its lease frame), and the time
    /// since it; `None` without files.
    fn since_checkpoint(&self) -> Option<(u64, Duration)> {
        let (Some(files), Some(log)) = (&self.files, &self.log) else {
            return None;
        };
        let state = files.checkpoint.lock();
        Some((
            log.tail().saturating_sub(state.baseline_lsn),
            state.at.elapsed(),
        ))
    }
}

/// Deletes checkpoints other than the manifest's, log segments wholly before its
/// `replay_from`, and temporary files left by a crash.
fn remove_obsolete(disk: &dyn Disk, dir: &Path, manifest: &Manifest) -> std::io::Result<()> {
    let mut removed = false;
    for name in disk.list(dir)? {
        let stale_checkpoint =
            checkpoint::is_checkpoint_name(&name) && manifest.checkpoint.as_deref() != Some(&name);
        if stale_checkpoint || name.ends_with(".tmp") {
            disk.remove(&dir.join(&name))?;
            removed = true;
        }
    }
    let segments =
        reader::list_segments(disk, dir).map_err(|e| std::io::Error::other(e.to_string()))?;
    for pair in segments.windows(2) {
        if pair[1].first_lsn <= manifest.replay_from_lsn {
            disk.remove(&pair[0].path)?;
            removed = true;
        }
    }
    if removed {
        disk.sync_dir(dir)?;
    }
    Ok(())
}

/// Resolves once the watermark passes a timestamp ([`Db::visible_at`]).
#[must_use = "a future does nothing unless awaited"]
pub struct VisibleAt<'db> {
    db: &'db Shared,
    ts: Ts,
}

impl std::future::Future for VisibleAt<'_> {
    type Output = Result<(), LogFailed>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        self.db
            .poll_published(self.ts, cx)
            .map(|published| match published {
                true => Ok(()),
                false => Err(self
                    .db
                    .log
                    .as_ref()
                    .and_then(|log| log.failed())
                    .expect("a wait for the watermark ends early only on failure")),
            })
    }
}

/// A checkpoint that was written.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CheckpointInfo {
    /// Its file name.
    pub name: String,
    /// Keys it holds.
    pub keys: u64,
    /// The snapshot it was written from.
    pub snapshot_ts: Ts,
    /// Log replay starts here after it.
    pub replay_from_lsn: u64,
    /// How long it took.
    pub elapsed: Duration,
}

/// A checkpoint failed; the previous one stays current, nothing is lost.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// Writing a file failed.
    #[error("checkpoint in {dir}: {1}", dir = .0.display())]
    Io(PathBuf, #[source] std::io::Error),
    /// The log has failed.
    #[error(transparent)]
    Log(LogFailed),
    /// No snapshot could be opened.
    #[error(transparent)]
    Begin(BeginError),
}

/// Tells a periodic thread to stop: a flag and the condition variable it sleeps on.
type StopSignal = Arc<(Mutex<bool>, Condvar)>;

/// A background thread that runs `tick` every interval until told to stop, or until `tick`
/// says it is done (the checkpointer and the collector).
struct Periodic {
    handle: JoinHandle<()>,
    stop: StopSignal,
}

impl Periodic {
    fn spawn(
        name: &str,
        shared: &Arc<Shared>,
        interval: Duration,
        tick: fn(&Shared) -> bool,
        stop: StopSignal,
    ) -> Periodic {
        let (worker, signal) = (Arc::clone(shared), Arc::clone(&stop));
        let handle = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                loop {
                    {
                        let mut stopped = signal.0.lock();
                        if !*stopped {
                            signal.1.wait_for(&mut stopped, interval);
                        }
                        if *stopped {
                            return;
                        }
                    }
                    if !tick(&worker) {
                        return;
                    }
                }
            })
            .unwrap_or_else(|e| panic!("spawning the {name} thread: {e}"));
        Periodic { handle, stop }
    }

    /// Stops the thread and waits for it.
    fn stop(self) {
        *self.stop.0.lock() = true;
        self.stop.1.notify_all();
        let name = self
            .handle
            .thread()
            .name()
            .unwrap_or("background")
            .to_owned();
        self.handle
            .join()
            .unwrap_or_else(|_| panic!("the {name} thread panicked"));
    }
}

/// Stops the background work and closes the log when the last handle goes.
struct Owner {
    shared: Arc<Shared>,
    checkpointer: Mutex<Option<Periodic>>,
    collector: Mutex<Option<Periodic>>,
    coordinator: Mutex<Option<JoinHandle<()>>>,
    recovery: Option<Recovery>,
}

impl Owner {
    fn shut_down(&self) -> Result<(), CloseError> {
        if let Some(collector) = self.collector.lock().take() {
            collector.stop();
        }
        // The coordinator reconciles an open phase before it stops.
        if let Some(handle) = self.coordinator.lock().take() {
            self.shared.splitter.stop();
            handle.join().expect("the split coordinator does not panic");
        }
        if let Some(checkpointer) = self.checkpointer.lock().take() {
            checkpointer.stop();
        }
        let Some(log) = &self.shared.log else {
            return Ok(());
        };
        if log.failed().is_none() && self.shared.checkpoint_due_on_close() {
            self.shared.checkpoint().map_err(CloseError::Checkpoint)?;
        }
        log.close().map_err(CloseError::Log)
    }
}

impl Shared {
    fn checkpoint_due_on_close(&self) -> bool {
        // Transactions still in doubt hold the watermark: a checkpoint would wait for them.
        self.in_doubt.lock().is_empty()
            && self
                .since_checkpoint()
                .is_some_and(|(logged, _)| logged > 0)
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        let _ = self.shut_down();
    }
}

/// Closing a database failed; what was acknowledged is still in the log.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CloseError {
    /// The final checkpoint failed (recovery will replay the log instead).
    #[error(transparent)]
    Checkpoint(CheckpointError),
    /// The log had failed.
    #[error(transparent)]
    Log(LogFailed),
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
    owner: Arc<Owner>,
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
    /// Commits that applied operations to per-core slices of split records.
    pub split_commits: u64,
    /// Records split now.
    pub split_records: u64,
    /// Split phases opened (each ends in one reconciliation).
    pub split_phases: u64,
    /// Times a transaction had to wait for a split record's reconciliation (it read the
    /// record, or wrote it with an operation its slices cannot take).
    pub split_stashes: u64,
    /// Times a record was split.
    pub split_splits: u64,
    /// Times a split record was joined for good (reads dominated, or it went idle).
    pub split_joins: u64,
    /// Versions held in memory, over all keys (live and reclaimable-but-not-yet-reclaimed).
    pub versions: u64,
    /// Records: keys written and not deleted, and deleted ones the collector has not
    /// reclaimed yet.
    pub records: u64,
    /// Records of deleted keys the collector has freed since open.
    pub reclaimed_records: u64,
    /// Bytes mapped for records (keys and their first versions); later versions are
    /// allocated separately.
    pub record_bytes: u64,
    /// Frames written to the log: one per commit, and one per 65 536 timestamps handed out
    /// (the timestamp lease that keeps timestamps rising across restarts).
    pub log_frames: u64,
    /// fsyncs of the log.
    pub log_fsyncs: u64,
    /// Of those, fsyncs run by a thread flushing inline ([`Db::flush_log_here`]).
    pub log_inline_fsyncs: u64,
    /// Checkpoints written since open.
    pub checkpoints: u64,
    /// Time since the newest checkpoint was written by this process, or since the database
    /// opened (recovery then left the state it found); `None` without files.
    pub checkpoint_age: Option<Duration>,
    /// Log bytes written after the newest checkpoint (past its timestamp-lease frame): about
    /// what recovery would replay now.
    pub log_bytes_since_checkpoint: u64,
    /// The newest timestamp whose commits are all visible.
    pub visible_ts: Ts,
    /// The garbage-collection horizon: versions older than what a snapshot at this
    /// timestamp sees are reclaimed.
    pub gc_horizon_ts: Ts,
}

impl Db {
    /// An empty in-memory database with default options (no files, no durability).
    pub fn in_memory() -> Db {
        Db::with_options(Options::default())
    }

    /// An empty in-memory database (the durability option is ignored: there are no files).
    pub fn with_options(options: Options) -> Db {
        let shared = Arc::new(Shared {
            oracle: Arc::new(Oracle::new(Ts(0))),
            store: MemStore::new(options.capacity_hint),
            log: None,
            splitter: Splitter::new(options.split_settings()),
            files: None,
            recovered_versions: AtomicI64::new(0),
            checkpoints: AtomicU64::new(0),
            ts_lease: AtomicU64::new(u64::MAX),
            lease_renewal: Mutex::new(None),
            lease_renewal_end: AtomicU64::new(0),
            ts_lease_step: options.ts_lease_step,
            in_doubt: Mutex::new(Vec::new()),
            collector_signal: Arc::new((Mutex::new(false), Condvar::new())),
            collector_interval: options.collector_interval,
            writes_held_until: Mutex::new(None),
            writes_held: std::sync::atomic::AtomicBool::new(false),
            two_phase: std::sync::atomic::AtomicBool::new(false),
        });
        Db::from_shared(shared, None)
    }

    fn from_shared(shared: Arc<Shared>, recovery: Option<Recovery>) -> Db {
        let owner = Arc::new(Owner {
            shared: Arc::clone(&shared),
            checkpointer: Mutex::new(None),
            collector: Mutex::new(Some(Periodic::spawn(
                "keel-gc",
                &shared,
                shared.collector_interval,
                |shared| {
                    shared.gc_pass();
                    true
                },
                Arc::clone(&shared.collector_signal),
            ))),
            coordinator: Mutex::new(None),
            recovery,
        });
        if shared.splitter.enabled() {
            let worker = Arc::clone(&shared);
            let handle = std::thread::Builder::new()
                .name("keel-splitter".into())
                .spawn(move || crate::split::coordinator::run(&worker))
                .expect("spawning the split coordinator thread");
            *owner.coordinator.lock() = Some(handle);
        }
        if shared.files.is_some() {
            *owner.checkpointer.lock() = Some(Periodic::spawn(
                "keel-checkpointer",
                &shared,
                Duration::from_millis(200),
                checkpoint_tick,
                Arc::new((Mutex::new(false), Condvar::new())),
            ));
        }
        Db { shared, owner }
    }

    /// Opens (creating if needed) the database in `dir` and recovers it: the newest
    /// checkpoint, then every whole log frame after it. With [`Durability::None`] nothing is
    /// read or written and the database starts empty.
    ///
    /// ```
    /// let dir = std::env::temp_dir().join(format!("keel-doc-open-{}", std::process::id()));
    /// {
    ///     let db = keel::Db::open(&dir, keel::Options::default())?;
    ///     db.transact(|txn| txn.put(b"k", b"durable"))?;
    /// }
    /// let db = keel::Db::open(&dir, keel::Options::default())?;
    /// assert_eq!(db.snapshot()?.get(b"k")?, Some(b"durable".to_vec()));
    /// # drop(db);
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open(dir: impl AsRef<Path>, options: Options) -> Result<Db, OpenError> {
        if options.durability == Durability::None {
            return Ok(Db::with_options(options));
        }
        let started = Instant::now();
        let dir = dir.as_ref().to_path_buf();
        let disk: Arc<dyn Disk> = options.disk.clone().unwrap_or_else(|| Arc::new(OsDisk));
        disk.create_dir_all(&dir)
            .map_err(|e| OpenError::io(&dir, e))?;
        let lock_path = dir.join("LOCK");
        let lock = disk
            .try_lock(&lock_path)
            .map_err(|e| OpenError::io(&lock_path, e))?
            .ok_or_else(|| OpenError::Locked { dir: dir.clone() })?;
        let names = disk.list(&dir).map_err(|e| OpenError::io(&dir, e))?;
        if !names.iter().any(|n| n == MANIFEST) {
            let keel_shaped = |n: &String| {
                n == "LOCK"
                    || n.ends_with(".tmp")
                    || checkpoint::is_checkpoint_name(n)
                    || crate::wal::format::parse_segment_name(n).is_some()
            };
            if let Some(foreign) = names.iter().find(|n| !keel_shaped(n)) {
                return Err(OpenError::NotKeel {
                    dir,
                    example: foreign.clone(),
                });
            }
            if names
                .iter()
                .any(|n| crate::wal::format::parse_segment_name(n).is_some())
            {
                return Err(OpenError::Damaged {
                    file: dir.join(MANIFEST),
                    offset: 0,
                    reason: "the manifest is missing but log segments exist".into(),
                });
            }
            Manifest::default()
                .write(&*disk, &dir)
                .map_err(|e| OpenError::io(&dir, e))?;
        }
        let manifest = Manifest::read(&*disk, &dir)?;
        let threads = options.recovery_threads.max(1);
        let mut shared_store = MemStore::new(options.capacity_hint);
        let mut versions = 0;
        let mut last_ts = manifest.snapshot_ts;
        let mut recovery = Recovery::default();
        // Per thread, the records it created (for the ordered index, built at the end).
        let mut created: Vec<Vec<(u64, RecordRef)>> = vec![Vec::new(); threads];
        let mut gather = |done: Vec<Replayed>| {
            for (mine, done) in created.iter_mut().zip(done) {
                mine.extend(done.created);
                versions += done.versions;
            }
        };

        // Load the checkpoint, its blocks spread over the recovery threads.
        if let Some(name) = &manifest.checkpoint {
            let loaded = checkpoint::load(&*disk, &dir.join(name))?;
            if loaded.snapshot_ts != manifest.snapshot_ts
                || loaded.replay_from_lsn != manifest.replay_from_lsn
            {
                return Err(OpenError::Damaged {
                    file: dir.join(name),
                    offset: 16,
                    reason: "checkpoint header disagrees with the manifest".into(),
                });
            }
            let loaded = &loaded;
            gather(replay::on_threads(&shared_store, threads, |t, replayer| {
                for block in loaded.blocks().skip(t).step_by(threads) {
                    checkpoint::for_each_entry(block, |k, ts, v| {
                        replayer.push(hash(k), ts, Entry::Put(k, v));
                    })
                    .expect("verified while loading");
                }
            }));
            recovery.checkpoint = Some((name.clone(), loaded.count));
        }

        // Replay the log after it, partitioned by key so each key's frames apply in order.
        let segments = reader::list_segments(&*disk, &dir)?;
        if let Some(first) = segments.first()
            && first.first_lsn > manifest.replay_from_lsn
        {
            return Err(OpenError::Damaged {
                file: first.path.clone(),
                offset: 0,
                reason: format!(
                    "log before LSN {} is missing; the checkpoint needs it from {}",
                    first.first_lsn, manifest.replay_from_lsn
                ),
            });
        }
        let mut log: Vec<SegmentFrames> = Vec::new();
        let scanned = reader::scan(&*disk, &segments, manifest.replay_from_lsn, |frames| {
            log.push(frames)
        })?;
        let frames = || log.iter().flat_map(SegmentFrames::frames);
        // Two-phase commit's frames: a prepare frame's writes apply if its decision frame
        // says committed; without a decision the transaction is in doubt.
        let mut decisions: HashMap<Ts, bool> = HashMap::new();
        // The newest timestamp a commit or prepare frame carries (leases excluded).
        let mut logged_ts = manifest.snapshot_ts;
        for frame in frames() {
            last_ts = last_ts.max(frame.ts);
            recovery.log_frames += u64::from(!frame.is_lease());
            if !frame.is_lease() {
                logged_ts = logged_ts.max(frame.ts);
            }
            if let Kind::Decision(commit) = frame.kind {
                decisions.insert(frame.ts, commit);
            }
        }
        let applies = |frame: &crate::wal::format::Frame<'_>| match frame.kind {
            Kind::Commit => true,
            Kind::Prepare(_) => decisions.get(&frame.ts) == Some(&true),
            Kind::Decision(_) => false,
        };
        gather(replay::on_threads(&shared_store, threads, |t, replayer| {
            for frame in frames().filter(applies) {
                for entry in frame.entries() {
                    let h = hash(entry.key());
                    if h as usize % threads == t {
                        replayer.push(h, frame.ts, entry);
                    }
                }
            }
        }));
        // Every record is in; now the ordered index, in one sorted pass.
        let indexing = Instant::now();
        shared_store.link_recovered(created);
        recovery.index_elapsed = indexing.elapsed();
        // Lock the writes of transactions in doubt again, each under an owner of its own.
        let mut in_doubt = Vec::new();
        for frame in frames() {
            let Kind::Prepare(meta) = frame.kind else {
                continue;
            };
            if decisions.contains_key(&frame.ts) {
                continue;
            }
            let owner = crate::mvcc::LockOwner::in_doubt(in_doubt.len() as u64);
            let writes = frame
                .entries()
                .map(|entry| {
                    let (key, value) = match entry {
                        Entry::Put(key, value) => (key, Some(value.to_vec())),
                        Entry::Delete(key) => (key, None),
                        Entry::Delta(..) => unreachable!("a prepare logs no delta"),
                    };
                    let (record, created) = shared_store.get_or_create_locked(
                        key,
                        hash(key),
                        owner,
                        value.as_ref().map(Vec::len),
                    );
                    assert!(
                        created || record.get().try_lock(owner),
                        "a transaction in doubt holds its keys' locks alone"
                    );
                    (key.to_vec(), record, value)
                })
                .collect();
            in_doubt.push(InDoubt {
                owner,
                ts: frame.ts,
                meta: meta.to_vec(),
                writes,
            });
        }
        drop(log);
        recovery.in_doubt = in_doubt.len();
        recovery.log_bytes = scanned.bytes;
        if let Some((path, len, cut)) = &scanned.torn {
            disk.truncate(path, *len)
                .map_err(|e| OpenError::io(path, e))?;
            recovery.torn_tail = Some((path.clone(), *len, *cut));
        }
        remove_obsolete(&*disk, &dir, &manifest).map_err(|e| OpenError::io(&dir, e))?;

        // Continue the log where it ends.
        let end_lsn = scanned.end_lsn.max(manifest.replay_from_lsn);
        let (segment, segment_first_lsn) = match segments.last() {
            Some(last) => {
                let file = disk
                    .open_append(&last.path)
                    .map_err(|e| OpenError::io(&last.path, e))?;
                (file, last.first_lsn)
            }
            _ => {
                let file = crate::wal::create_segment(&*disk, &dir, end_lsn)
                    .map_err(|e| OpenError::io(&dir.join(segment_name(end_lsn)), e))?;
                (file, end_lsn)
            }
        };
        // With transactions in doubt, the watermark stops below the first until each is
        // decided, and the clock resumes at the newest logged timestamp: every snapshot taken
        // before the crash was below the first (its timestamp was never published), so no
        // timestamp a snapshot read at is handed out again.
        let oracle = if in_doubt.is_empty() {
            Oracle::new(last_ts)
        } else {
            let held: Vec<Ts> = in_doubt.iter().map(|d| d.ts).collect();
            Oracle::holding(logged_ts, &held).ok_or_else(|| OpenError::Damaged {
                file: dir.clone(),
                offset: 0,
                reason: format!(
                    "prepared transactions in doubt at {held:?} lie too far below the newest \
                     logged timestamp {logged_ts:?}"
                ),
            })?
        };
        let oracle = Arc::new(oracle);
        let log = Log::start(
            Arc::clone(&disk),
            dir.clone(),
            Tail {
                segment,
                segment_first_lsn,
                start_lsn: end_lsn,
            },
            options.durability,
            options.segment_bytes,
            Some(Arc::clone(&oracle)),
        );
        recovery.last_ts = last_ts;
        recovery.elapsed = started.elapsed();
        let settings = options.split_settings();
        let ts_lease_step = options.ts_lease_step;
        let collector_interval = options.collector_interval;
        let files = Files {
            disk,
            dir,
            checkpoint: Mutex::new(CheckpointState {
                baseline_lsn: manifest.replay_from_lsn,
                at: Instant::now(),
            }),
            options,
            _lock: lock,
        };
        let shared = Arc::new(Shared {
            oracle,
            store: shared_store,
            log: Some(log),
            splitter: Splitter::new(settings),
            files: Some(files),
            recovered_versions: AtomicI64::new(versions),
            checkpoints: AtomicU64::new(0),
            // Nothing above the recovered clock is leased yet: renewed below, so that the
            // first commit does not wait for the lease's fsync.
            ts_lease: AtomicU64::new(last_ts.0 + 1),
            lease_renewal: Mutex::new(None),
            lease_renewal_end: AtomicU64::new(0),
            ts_lease_step,
            in_doubt: Mutex::new(in_doubt),
            collector_signal: Arc::new((Mutex::new(false), Condvar::new())),
            collector_interval,
            writes_held_until: Mutex::new(None),
            writes_held: std::sync::atomic::AtomicBool::new(false),
            // Transactions in doubt hold the watermark below their timestamps from here on.
            two_phase: std::sync::atomic::AtomicBool::new(recovery.in_doubt > 0),
        });
        let before = shared.log.as_ref().map_or(0, Log::tail);
        shared.extend_ts_lease(None);
        if let (Some(files), Some(log)) = (&shared.files, &shared.log) {
            // Like a checkpoint's own lease frame, this one is not log written since.
            files.checkpoint.lock().baseline_lsn += log.tail() - before;
        }
        Ok(Db::from_shared(shared, Some(recovery)))
    }

    /// The prepared transactions recovery found without a decision (see
    /// [`Txn::prepare`]), each locked again, its timestamp unpublished: until every one is
    /// decided ([`Prepared::commit`](crate::Prepared::commit) or
    /// [`abort`](crate::Prepared::abort)), nothing committed after the first becomes visible.
    /// Returns them once; later calls return nothing.
    pub fn in_doubt(&self) -> Vec<crate::Prepared<'_>> {
        std::mem::take(&mut *self.shared.in_doubt.lock())
            .into_iter()
            .map(|d| crate::Prepared::recovered(&self.shared, d.owner, d.ts, d.meta, d.writes))
            .collect()
    }

    /// What recovery did when this database was opened from files.
    pub fn recovery(&self) -> Option<&Recovery> {
        self.owner.recovery.as_ref()
    }

    /// The data directory, if the database has files.
    pub fn dir(&self) -> Option<&Path> {
        self.shared.files.as_ref().map(|f| f.dir.as_path())
    }

    /// The default durability of commits.
    pub fn durability(&self) -> Durability {
        self.shared.log.as_ref().map_or(Durability::None, Log::mode)
    }

    /// Begins a read-write transaction. It reads one consistent snapshot, buffers its
    /// writes, and is validated at commit; dropping it aborts it.
    pub fn begin(&self) -> Result<Txn<'_>, BeginError> {
        Txn::begin(&self.shared)
    }

    /// [`Db::begin`] at the newest commits installed, durable or not: under `sync` a commit
    /// becomes visible to [`Db::begin`] and [`Db::snapshot`] only once durable, so a chain
    /// of read-modify-write transactions on one key would wait for an fsync at each link.
    /// Begun here, a writer reads the last link at once; its own commit is acknowledged only
    /// once durable, and its log frame follows what it read, so that fsync covers both (and
    /// power lost before it loses both, neither acknowledged). Should it commit without
    /// writes, the commit waits until everything it may have read is durable. Under `async`
    /// and without files commits are visible once installed, and this is [`Db::begin`].
    ///
    /// ```
    /// let db = keel::Db::in_memory();
    /// db.transact(|txn| txn.put(b"k", b"1"))?;
    /// let mut txn = db.begin_installed()?;
    /// assert_eq!(txn.get(b"k")?.as_deref(), Some(&b"1"[..]));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn begin_installed(&self) -> Result<Txn<'_>, BeginError> {
        Txn::begin_installed(&self.shared)
    }

    /// Resolves once every commit at or below `ts` is visible (under `sync`, durable): what
    /// a caller awaits before it reveals what a transaction begun at the installed watermark
    /// ([`Db::begin_installed`]) read at `ts`, if that transaction ended without a commit (an
    /// error ended it), since what it read may not be durable yet. Resolves to the log's
    /// failure if the log failed first.
    pub fn visible_at(&self, ts: Ts) -> VisibleAt<'_> {
        VisibleAt {
            db: &self.shared,
            ts,
        }
    }

    /// [`Db::begin`] for a transaction that keeps the database alive itself, so that it (and
    /// its [`CommitFuture`](crate::CommitFuture)) can outlive this handle: a task that
    /// outlives the caller, or a database that is closed and dropped once its last user
    /// goes. Closing the database ends what such a transaction can do (its commit fails as
    /// after a log failure), not its memory.
    ///
    /// ```
    /// let db = keel::Db::in_memory();
    /// let mut txn: keel::Txn<'static> = db.begin_owned()?;
    /// txn.put(b"k", b"v")?;
    /// drop(db);
    /// assert!(txn.commit()?.is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn begin_owned(&self) -> Result<Txn<'static>, BeginError> {
        Txn::begin_owned(&self.shared)
    }

    /// Waits until every commit at or below `ts` is visible (the watermark passed it): what a
    /// caller of [`Prepared::commit`](crate::Prepared::commit) does before it acknowledges.
    /// Fails only if the log failed meanwhile.
    pub fn wait_visible(&self, ts: Ts) -> Result<(), LogFailed> {
        let shared = &self.shared;
        if shared.oracle.wait_published(ts, || shared.log_failed()) {
            return Ok(());
        }
        Err(shared
            .log
            .as_ref()
            .and_then(Log::failed)
            .expect("the wait stops early only after a log failure"))
    }

    /// Whether every commit at or below `ts` is visible now.
    pub fn is_visible(&self, ts: Ts) -> bool {
        self.shared.oracle.advance() >= ts.0
    }

    /// [`Db::wait_visible`] without blocking a thread: resolves once every commit at or
    /// below `ts` is visible, or with the log's failure.
    pub fn visible(&self, ts: Ts) -> impl std::future::Future<Output = Result<(), LogFailed>> {
        let shared = Arc::clone(&self.shared);
        std::future::poll_fn(move |cx| {
            shared
                .poll_published(ts, cx)
                .map(|published| match published {
                    true => Ok(()),
                    false => Err(shared
                        .log
                        .as_ref()
                        .and_then(Log::failed)
                        .expect("a log failure was flagged")),
                })
        })
    }

    /// Whether a transaction prepared in a two-phase commit ([`Txn::prepare`], or one recovered
    /// in doubt) holds `key` until its decision, exclusively or shared: what a commit that
    /// failed with [`ConflictReason::Prepared`](crate::ConflictReason::Prepared) met.
    pub fn awaits_decision(&self, key: &[u8]) -> bool {
        self.shared.writes_held() || self.snapshot().is_ok_and(|s| s.awaits_decision(key))
    }

    /// Refuses every commit that writes for `duration` from now, as if a transaction
    /// prepared in a two-phase commit held every key: the commit fails with
    /// [`ConflictReason::Prepared`](crate::ConflictReason::Prepared) and
    /// [`Db::awaits_decision`] is true for any key until then. Reads, read-only commits and
    /// the decisions of prepared transactions go on.
    ///
    /// A cluster node that restarts holds its writes this way for the vote timeout: a prepare
    /// that only read logged nothing, so the crash released what it read while its yes vote
    /// may still count (`keel-server/src/xnode.rs`).
    pub fn hold_writes_for(&self, duration: Duration) {
        let mut until = self.shared.writes_held_until.lock();
        *until = Some(Instant::now() + duration);
        self.shared.writes_held.store(true, Ordering::Release);
    }

    /// How much longer [`Db::hold_writes_for`] holds writes back; zero when it does not.
    pub fn writes_held_for(&self) -> Duration {
        self.shared.writes_held_for()
    }

    /// Waits, sleeping, until no prepared transaction holds `key` ([`Db::awaits_decision`]),
    /// or for `timeout` at most; whether it is free. A thread that must not block (an async
    /// task) polls [`Db::awaits_decision`] between timer waits instead.
    pub fn wait_decided(&self, key: &[u8], timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_micros(20);
        loop {
            if !self.awaits_decision(key) {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            std::thread::sleep(pause.min(deadline - now));
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }

    /// Opens a read-only snapshot of everything committed so far. It never blocks writers
    /// and never aborts.
    pub fn snapshot(&self) -> Result<Snapshot<'_>, BeginError> {
        Snapshot::begin(&self.shared)
    }

    /// Writes a checkpoint now (they also run in the background). `Ok(None)` for a
    /// database without files.
    pub fn checkpoint(&self) -> Result<Option<CheckpointInfo>, CheckpointError> {
        self.shared.checkpoint()
    }

    /// Closes the database cleanly: stops background work, writes a final checkpoint and
    /// makes the log durable. Other clones of this handle stop working for writes. Dropping
    /// the last handle does the same but cannot report errors.
    pub fn close(self) -> Result<(), CloseError> {
        self.owner.shut_down()
    }

    /// Runs `body` in a transaction and commits it, retrying on conflicts with bounded
    /// exponential backoff, at most [`TRANSACT_ATTEMPTS_MAX`] times. `body` may run more than
    /// once, so it should have no effects outside the transaction. A conflict with a prepared
    /// transaction waits for its decision (up to [`DECISION_WAIT_MAX`]) before the retry.
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
        let splitter = &self.shared.splitter;
        // Held across a retry after a `Split` conflict, so that it runs in the joined phase.
        let mut joined: Option<Joined<'_>> = None;
        let mut split_waits = 0;
        loop {
            let outcome = (|| {
                let mut txn = self.begin()?;
                let value = body(&mut txn).map_err(TransactError::Aborted)?;
                Ok::<_, TransactError<E>>(txn.commit()?.map(|_| value))
            })();
            drop(joined.take());
            match outcome? {
                Ok(value) => return Ok(value),
                Err(last) if attempt >= TRANSACT_ATTEMPTS_MAX => {
                    return Err(TransactError::Conflicts {
                        attempts: attempt,
                        last,
                    });
                }
                Err(conflict)
                    if conflict.reason == crate::ConflictReason::Split
                        && split_waits < TRANSACT_ATTEMPTS_MAX =>
                {
                    // Stashed: run again in the joined phase, which waits for us. Bounded
                    // separately: each wait is bounded by the phase length.
                    split_waits += 1;
                    joined = Some(splitter.wait_joined());
                    continue;
                }
                Err(conflict) if conflict.reason == crate::ConflictReason::Prepared => {
                    attempt += 1;
                    self.wait_decided(&conflict.key, DECISION_WAIT_MAX);
                    continue;
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

    /// Makes the calling thread flush the log itself under `sync` durability, as Redis's event
    /// loop does, instead of handing every batch to the flusher thread: a commit on this
    /// thread that waits for the log asynchronously ([`Txn::commit_async`]) calls `on_wait`
    /// instead of waking the flusher thread, and the thread promises to call
    /// [`Db::flush_log_here`] soon (from its event loop). The flusher thread still writes
    /// whatever is left 5–10 ms after the last inline flush, so a missed call costs latency,
    /// never a lost or stuck commit. A commit that blocks its thread ([`Txn::commit`]) wakes
    /// the flusher as usual. Under `async` durability the same goes for a wait for the log to
    /// be written ([`Db::log_written`]). Applies to every database used on this thread; `None`
    /// undoes it.
    pub fn flush_log_inline_on_this_thread(on_wait: Option<std::rc::Rc<dyn Fn()>>) {
        crate::wal::flush_inline_on_this_thread(on_wait);
    }

    /// Under `sync` durability, writes and fsyncs the log on the calling thread for the
    /// commits that wait for it; under `async`, writes it (no fsync) for the replies that
    /// wait for it ([`Db::log_written`]). Does nothing if the flusher thread is writing at
    /// this moment, or if nobody waits. Says how long it waited for the disk, and whether
    /// commits or replies still wait for the log (call again soon).
    pub fn flush_log_here(&self) -> crate::wal::LogFlush {
        self.shared
            .log
            .as_ref()
            .map_or_else(Default::default, Log::flush_here)
    }

    /// Under `async` durability: resolves once every commit made so far, by any
    /// transaction, is written to the operating system. From then on a crash of this
    /// process (`kill -9`) cannot lose them; a crash of the machine still may, until the next
    /// fsync. A server awaits this before it sends replies, as Redis writes its append-only
    /// file before replying under `appendfsync everysec`: then no client has seen a commit,
    /// its own or another's, that a crash of the server loses.
    ///
    /// On a thread that flushes inline ([`Db::flush_log_inline_on_this_thread`]) the wait
    /// calls the thread's hook and the thread writes the log from its loop
    /// ([`Db::flush_log_here`]), once for everything its pass committed; elsewhere the
    /// waiting thread writes the log itself, or, if another thread is writing it, wakes the
    /// flusher thread. Ready at once under `sync` durability (a commit is
    /// acknowledged and visible only once durable, unless it asked for less itself) and
    /// without files. Resolves to the log's failure if the log failed first: the commits may
    /// then be lost.
    pub fn log_written(&self) -> crate::wal::LogWritten<'_> {
        let log = self
            .shared
            .log
            .as_ref()
            .filter(|log| matches!(log.mode(), Durability::Async { .. }));
        crate::wal::LogWritten::new(log)
    }

    /// Counters summed over all transactions so far.
    pub fn stats(&self) -> Stats {
        let oracle = &self.shared.oracle;
        let sum = |f: fn(&SlotStats) -> i64| u64::try_from(oracle.sum(f)).unwrap_or(0);
        use std::sync::atomic::Ordering::Relaxed;
        let versions =
            oracle.sum(|s| s.versions.load(Relaxed)) + self.shared.recovered_versions.load(Relaxed);
        let log = self.shared.log.as_ref().map(Log::shared);
        let splitter = &self.shared.splitter;
        let since_checkpoint = self.shared.since_checkpoint();
        Stats {
            commits: sum(|s| s.commits.load(Relaxed) as i64),
            read_only_commits: sum(|s| s.read_only_commits.load(Relaxed) as i64),
            aborts_write_locked: sum(|s| s.aborts_write_locked.load(Relaxed) as i64),
            aborts_read_changed: sum(|s| s.aborts_read_changed.load(Relaxed) as i64),
            aborts_phantom: sum(|s| s.aborts_phantom.load(Relaxed) as i64),
            split_commits: sum(|s| s.split_commits.load(Relaxed) as i64),
            split_records: splitter.split_count() as u64,
            split_phases: splitter.counters.phases.load(Relaxed),
            split_stashes: splitter.counters.stashes.load(Relaxed),
            split_splits: splitter.counters.splits.load(Relaxed),
            split_joins: splitter.counters.joins.load(Relaxed),
            versions: u64::try_from(versions).unwrap_or(0),
            records: self.shared.store.len() as u64,
            reclaimed_records: self.shared.store.gc_counters().freed.load(Relaxed),
            record_bytes: self.shared.store.arena_bytes() as u64,
            log_frames: log.map_or(0, |l| l.frames.load(Relaxed)),
            log_fsyncs: log.map_or(0, |l| l.fsyncs.load(Relaxed)),
            log_inline_fsyncs: log.map_or(0, |l| l.inline_fsyncs.load(Relaxed)),
            checkpoints: self.shared.checkpoints.load(Relaxed),
            checkpoint_age: since_checkpoint.map(|(_, age)| age),
            log_bytes_since_checkpoint: since_checkpoint.map_or(0, |(logged, _)| logged),
            visible_ts: oracle.visible(),
            gc_horizon_ts: oracle.horizon(),
        }
    }

    /// Runs the collector now, as its thread does every 10 ms, until what deleted keys
    /// left is freed or `passes` passes have run (a snapshot open from before a delete
    /// holds its key's memory until it ends). Returns how many records it freed.
    pub fn reclaim_deleted(&self, passes: usize) -> u64 {
        let mut freed = 0;
        for _ in 0..passes {
            let pass = self.shared.gc_pass();
            freed += pass.freed as u64;
            if pass.blocked_at.is_none() && pass.waiting == 0 && pass.unlinked == 0 {
                break;
            }
        }
        freed
    }

    /// Keys of the records split now (see [`SplitMode`]).
    pub fn split_keys(&self) -> Vec<Vec<u8>> {
        self.shared.splitter.split_keys()
    }

    /// Waits (at most two split phase lengths) until the split phase open now, if any, is
    /// reconciled, and holds the joined phase open (bounded by a quarter phase) until the
    /// returned guard is dropped. A retry loop that got
    /// [`ConflictReason::Split`](crate::ConflictReason) holds the guard across its retry, as
    /// [`Db::transact`] does, so the retry runs while the record is joined.
    pub fn wait_joined(&self) -> Joined<'_> {
        self.shared.splitter.wait_joined()
    }

    /// Hints that `key` is about to be read or written: starts loading the index bucket it
    /// hashes to, so that a batch of lookups (a pipeline, a multi-key command) overlaps its
    /// cache misses instead of taking them one after another. Never blocks, never fails, and
    /// changes nothing visible.
    ///
    /// ```
    /// let db = keel::Db::in_memory();
    /// let keys: [&[u8]; 3] = [b"a", b"b", b"c"];
    /// keys.iter().for_each(|k| db.prefetch(k));
    /// let snapshot = db.snapshot()?;
    /// for k in keys {
    ///     assert_eq!(snapshot.get(k)?, None);
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn prefetch(&self, key: &[u8]) {
        self.shared.store.prefetch(hash(key));
    }

    /// Hints that every one of `keys` is about to be read or written, and goes further than
    /// [`Db::prefetch`]: once the index buckets are on their way it starts loading each
    /// key's record and newest version too, so a batch takes each of those cache misses
    /// in parallel with the others' instead of in turn. For a pipeline or a multi-key
    /// command; never blocks on a lock, never fails, and changes nothing visible.
    ///
    /// ```
    /// let db = keel::Db::in_memory();
    /// let keys: [&[u8]; 3] = [b"a", b"b", b"c"];
    /// db.prefetch_all(keys);
    /// let snapshot = db.snapshot()?;
    /// for k in keys {
    ///     assert_eq!(snapshot.get(k)?, None);
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn prefetch_all<'k>(&self, keys: impl IntoIterator<Item = &'k [u8]>) {
        // The guesses read index tables and records, which the collector frees only after
        // every registered reader that could have found them has gone: register for it.
        let oracle = &self.shared.oracle;
        let Some((slot, _)) = oracle.register() else {
            return; // a hint: skipped when every slot is taken
        };
        self.shared.store.prefetch_all(keys.into_iter().map(hash));
        oracle.unregister(slot);
    }

    /// How many records are split now (cheap: one load).
    pub fn split_count(&self) -> usize {
        self.shared.splitter.split_count()
    }

    /// Recomputes the garbage-collection horizon now. Commits do this on their own every
    /// few hundred transactions; versions are reclaimed when their key is next written.
    pub fn collect_garbage(&self) {
        self.shared.oracle.collect();
    }
}

/// How often the collector (`keel-gc`) looks for deleted keys to reclaim, by default.
const GC_INTERVAL: Duration = Duration::from_millis(10);

impl Shared {
    /// Whether the watermark has passed `ts` (`Ready(true)`) or the log failed first
    /// (`Ready(false)`: the watermark may never move again); otherwise `cx` is woken when
    /// either happens.
    pub(crate) fn poll_published(
        &self,
        ts: Ts,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<bool> {
        use std::task::Poll;
        if self.oracle.advance() >= ts.0 {
            return Poll::Ready(true);
        }
        if self.log_failed() {
            return Poll::Ready(false);
        }
        // The failure check after registering pairs with the log's failure path, which sets
        // the flag before it wakes the watchers.
        if self.oracle.watch(ts, cx.waker()) {
            Poll::Ready(true)
        } else if self.log_failed() {
            Poll::Ready(false)
        } else {
            Poll::Pending
        }
    }

    /// Wakes the collector for a pass now, before its interval is up (if it is waiting: a
    /// pass under way already takes what was noted before it started).
    pub(crate) fn wake_collector(&self) {
        self.collector_signal.1.notify_one();
    }

    /// One pass of the collector (`gc::pass`) at a freshly computed horizon. If retired
    /// memory waits for a watermark that nothing has moved past since, takes an empty
    /// timestamp, so that the next pass can free it.
    ///
    /// It takes one only once the watermark has passed the last it took. Timestamps in
    /// flight must stay fewer than the oracle's ring of finished ones: a commit stuck for a
    /// minute would otherwise see the collector take 6 000 behind it, wrap the ring, and the
    /// watermark could never pass them.
    pub(crate) fn gc_pass(&self) -> crate::gc::Pass {
        let mut state = self.store.gc.lock();
        self.oracle.collect();
        let horizon = self.oracle.horizon();
        self.gc_pass_locked(&mut state, horizon)
    }

    /// A pass of the collector on this thread, unless one is running (on the collector's
    /// thread or another committer's): what a commit that noted the
    /// [`crate::gc::COLLECT_CANDIDATES`]th dead record does once it is published.
    /// Nor when the horizon has not moved since the last pass: it would free nothing more.
    pub(crate) fn gc_pass_here(&self) {
        if let Some(mut state) = self.store.gc.try_lock() {
            self.oracle.collect();
            let horizon = self.oracle.horizon();
            if horizon > state.horizon {
                self.gc_pass_locked(&mut state, horizon);
            }
        }
    }

    /// A pass at `horizon`, just computed, with the collector's state locked.
    fn gc_pass_locked(&self, state: &mut crate::gc::State, horizon: Ts) -> crate::gc::Pass {
        let visible = || {
            std::sync::atomic::fence(Ordering::SeqCst);
            self.oracle.visible()
        };
        let pass = crate::gc::pass(&self.store, state, horizon, visible, &self.splitter);
        // The versions the freed records held leave the count their installs added to.
        self.note_versions(-i64::try_from(pass.freed_versions).expect("a count"));
        if let Some(at) = pass.blocked_at
            && self.oracle.visible() <= at
            && self.oracle.visible() >= state.nudged
            && !self.log_failed()
        {
            let ts = self.next_commit_ts();
            state.nudged = ts;
            self.oracle.finish(ts);
            self.oracle.advance();
        }
        pass
    }
}

/// The checkpointer's tick: a checkpoint when one is due; stops once the log has failed.
fn checkpoint_tick(shared: &Shared) -> bool {
    if shared.log_failed() {
        return false;
    }
    if shared.checkpoint_due() {
        // A failed checkpoint leaves the previous one current; the log still holds
        // everything, so the next attempt (or recovery) loses nothing.
        let _ = shared.checkpoint();
    }
    true
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Db")
            .field("dir", &self.dir())
            .field("stats", &self.stats())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A commit stuck between taking its timestamp and finishing it holds the watermark. The
    /// collector, finding retired memory behind that watermark, takes at most one empty
    /// timestamp meanwhile; when the commit finishes, the watermark passes everything.
    #[test]
    fn a_stuck_commit_does_not_make_the_collector_wrap_the_finished_ring() {
        let db = Db::in_memory();
        db.transact(|txn| txn.put(b"k", b"v")).unwrap();
        db.transact(|txn| txn.delete(b"k")).unwrap();
        let shared = &db.shared;
        let stuck = shared.next_commit_ts();
        // Far more passes than the ring of finished timestamps holds (2 × OPEN_TXNS_MAX).
        let passes = 4 * crate::limits::OPEN_TXNS_MAX + 1;
        for _ in 0..passes {
            assert!(
                shared.gc_pass().blocked_at.is_some(),
                "the stuck commit holds it"
            );
        }
        let taken = shared.oracle.clock() - stuck.0;
        assert!(
            taken <= 1,
            "the collector took {taken} timestamps behind a stuck commit"
        );
        shared.oracle.finish(stuck);
        let last = shared.oracle.clock();
        assert_eq!(
            shared.oracle.advance(),
            last,
            "the watermark passes every timestamp"
        );
        assert!(db.reclaim_deleted(10) > 0, "the deleted key is freed");
        db.transact(|txn| txn.put(b"k", b"again")).unwrap();
    }

    /// The database a queue test pops: 60 000 other keys around a queue of 20 000, then the
    /// queue's first 10 000 popped (deleted) and collected.
    fn popped_queue(unlink: bool) -> Db {
        let db = Db::in_memory();
        db.shared.store.ordered().set_unlink(unlink);
        let key = |prefix: &str, i: u32| format!("{prefix}:{i:08}").into_bytes();
        for chunk in (0..60_000u32).collect::<Vec<_>>().chunks(1000) {
            db.transact(|txn| {
                for &i in chunk {
                    txn.put(&key("other", i), b"v")?;
                    if i < 20_000 {
                        txn.put(&key("queue", i), b"v")?;
                    }
                }
                Ok::<_, Error>(())
            })
            .unwrap();
        }
        for chunk in (0..10_000u32).collect::<Vec<_>>().chunks(1000) {
            db.transact(|txn| {
                for &i in chunk {
                    txn.delete(&key("queue", i))?;
                }
                Ok::<_, Error>(())
            })
            .unwrap();
        }
        db.reclaim_deleted(100);
        db
    }

    /// A queue's front popped: the collector takes the records out of the ordered index and
    /// the leaves they emptied with them, so a scan from the front passes none.
    #[test]
    fn a_popped_queue_front_leaves_no_empty_leaves_to_pass() {
        let db = popped_queue(true);
        let ordered = db.shared.store.ordered();
        let before = ordered.empty_hops();
        let snap = db.snapshot().unwrap();
        let first = snap.range(&b"queue:"[..]..&b"queue;"[..]).next();
        assert_eq!(first.map(|(k, _)| k), Some(b"queue:00010000".to_vec()));
        assert!(ordered.empty_hops() - before <= 1, "empty leaves in front");
    }

    /// Empty leaves that stay (here because unlinking is off; in use, one an unlink had to
    /// leave): every scan from the front passes them. Far fewer removals than half the live
    /// records, but once scans have passed that many empty leaves the collector rebuilds
    /// the tree, and scans from the front pass none.
    #[test]
    fn scans_passing_many_empty_leaves_make_the_collector_rebuild() {
        let db = popped_queue(false);
        let key = |prefix: &str, i: u32| format!("{prefix}:{i:08}").into_bytes();
        let ordered = db.shared.store.ordered();
        let front = |db: &Db| {
            let snap = db.snapshot().unwrap();
            let first = snap.range(&b"queue:"[..]..&b"queue;"[..]).next();
            first.map(|(k, _)| k)
        };
        let hops = |db: &Db| {
            let before = ordered.empty_hops();
            assert_eq!(front(db), Some(key("queue", 10_000)));
            ordered.empty_hops() - before
        };
        let per_scan = hops(&db);
        assert!(per_scan > 10, "the front's empty leaves: {per_scan}");
        // Not yet due by removals (10 000 of 70 000 live): scans until they have passed
        // half the live records' worth of empty leaves, then one more pass rebuilds.
        let due = 35_000 / per_scan + 1;
        for _ in 0..due {
            hops(&db);
        }
        db.reclaim_deleted(1);
        assert_eq!(hops(&db), 0, "rebuilt: nothing empty in front");
    }

    /// A commit that creates many keys puts them into the ordered index in key order, not
    /// in the hash order it locks them in: keys that follow each other are then a run that
    /// fills leaves, where hash order splits each leaf in the middle and leaves it half
    /// full.
    #[test]
    fn keys_created_in_one_commit_fill_their_leaves() {
        const KEYS: usize = 32_000;
        let db = Db::in_memory();
        for batch in (0..KEYS).collect::<Vec<_>>().chunks(1000) {
            db.transact(|txn| {
                for &i in batch {
                    txn.put(format!("member:{i:010}").as_bytes(), b"1")?;
                }
                Ok::<_, crate::Error>(())
            })
            .unwrap();
        }
        let nodes = db.shared.store.ordered().nodes();
        let full = KEYS / (crate::index::ordered::CAP - 1) + 1;
        assert!(
            nodes <= full * 11 / 10,
            "{nodes} nodes for {KEYS} keys, {full} leaves if full"
        );
    }
}

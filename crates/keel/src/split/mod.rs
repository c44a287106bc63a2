//! Phase reconciliation for contended records (Doppel).
//!
//! A record that many transactions hit with commutative operations (`add`, `max`, `min`,
//! ordered put, top-k insert) is *split*: during a split phase each core applies those
//! operations to its own slice of the record, with no shared cache-line write, and a
//! coordinator thread periodically *reconciles* the slices into one new committed version
//! (the joined phase), runs what had to wait, and splits again.
//!
//! How this stays serializable under MVCC (keel's twist on Doppel):
//! - While split, the record is locked by [`SPLIT_OWNER`], so no ordinary commit can write it
//!   and a read-write transaction that read it fails validation with
//!   [`ConflictReason::Split`](crate::ConflictReason::Split) ("stashed"); `Db::transact`
//!   then waits for the joined phase and runs it again there.
//! - Every slice entry carries a *tag*: the timestamp its operations are serialized at. A
//!   transaction that only applies split operations takes no commit timestamp: its tag is the
//!   visible watermark, loaded under the slice's mutex, and it is serialized just after that
//!   commit. A transaction that also reads or writes ordinary records commits normally and
//!   tags its slice entries with its commit timestamp.
//! - A reader at `read_ts` sees the version chain at `read_ts` plus every entry tagged at or
//!   below `read_ts`. Before reading slices it raises the record's *tag floor* to `read_ts`;
//!   a split-only commit that finds the watermark at or below the floor (under the slice's
//!   mutex, which orders it after the reader's raise or before the reader's fold) takes the
//!   ordinary path instead, with a fresh commit timestamp above the floor, acknowledged once
//!   the watermark passes it. So every append after a read gets a larger tag: what a
//!   snapshot sees of a split record never changes under it. Opening a phase raises the
//!   floor to the record's newest version, so every tag is above the base the entries apply
//!   to, even while that version is not yet visible, and to the installed watermark, above
//!   every snapshot that read the record before it was split (and so folded nothing).
//!   Nothing here waits for the watermark, which a transaction prepared for a two-phase
//!   commit holds until a decision from another node.
//! - Entries appended with `sync` durability carry their log position; a reader waits for it
//!   to be durable before using them, so nobody acts on what a crash could erase.
//! - Reconciliation closes the phase (a store-then-load handshake with committers that
//!   announced the phase in their oracle slot), folds every slice into one value, installs it
//!   at a fresh commit timestamp `ts_r` above every tag, and keeps the folded entries as
//!   history for snapshots older than `ts_r` until the GC horizon passes it.
//! - Split operations are logged (one frame per commit, as deltas); recovery applies them
//!   above the key's last full value, so a crash in the middle of a split phase loses nothing
//!   acknowledged. Reconciled versions are not logged: the deltas already are.
//!
//! What it deliberately does not do: split operations that return a value, split records of
//! mixed kinds (a record splits for one kind; other operations on it wait for the joined
//! phase), or free a record's split state before the database closes.

mod delta;
mod table;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use parking_lot::{Condvar, Mutex, MutexGuard};

pub(crate) use delta::{Delta, Kind};

use crate::Ts;
use crate::commutative::Op;
use crate::mvcc::{LockOwner, RecordRef};

/// The lock owner of a record while it is split.
pub(crate) const SPLIT_OWNER: LockOwner = LockOwner(u64::MAX - 1);

/// Whether and when keel splits contended records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SplitMode {
    /// Split a record once commits wait for its lock often enough
    /// ([`Options::split_contention`](crate::Options::split_contention) waits in one phase
    /// length), and join it for good when reads and other operations outnumber the split
    /// operations in a phase.
    #[default]
    Auto,
    /// Never split.
    Off,
    /// Split every record a splittable operation touches, and keep it split.
    Force,
}

impl std::str::FromStr for SplitMode {
    type Err = String;
    fn from_str(s: &str) -> Result<SplitMode, String> {
        match s {
            "auto" => Ok(SplitMode::Auto),
            "off" => Ok(SplitMode::Off),
            "force" => Ok(SplitMode::Force),
            other => Err(format!(
                "unknown split mode {other:?}: expected auto, off or force"
            )),
        }
    }
}

impl std::fmt::Display for SplitMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SplitMode::Auto => "auto",
            SplitMode::Off => "off",
            SplitMode::Force => "force",
        })
    }
}

/// Settings of the splitter (from [`Options`](crate::Options)).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    pub(crate) mode: SplitMode,
    pub(crate) phase: Duration,
    pub(crate) contention: u32,
}

/// One slice entry: the folded operations serialized at `tag`.
struct Entry {
    tag: Ts,
    delta: Delta,
    /// Log position the entry's commit waits for (`sync`); readers wait for it too. 0: none.
    durable_lsn: u64,
}

#[derive(Default)]
pub(crate) struct Slice {
    entries: Vec<Entry>,
    /// Sum of absolute additions this phase (reserved before use; see `budget`).
    magnitude: u64,
    /// Commits that appended here this phase.
    commits: u64,
}

/// A phase's entries, kept after reconciliation for snapshots older than it.
struct Closed {
    closed_at: Ts,
    entries: Vec<Entry>,
}

/// The split state of one record. Created once, never freed while the database lives.
pub(crate) struct SplitRecord {
    record: RecordRef,
    pub(crate) kind: Kind,
    /// The phase word of the split phase this record takes part in; 0 while joined.
    phase: AtomicU64,
    /// Whether the record is split in coming phases.
    active: AtomicBool,
    /// Largest magnitude one slice may reach this phase: the slices together can never push
    /// the base out of `i64`.
    budget: AtomicU64,
    slices: Box<[CachePadded<Mutex<Slice>>]>,
    history: Mutex<Vec<Closed>>,
    /// A split-only commit may not tag an entry at or below this: the newest snapshot
    /// timestamp a reader folded the slices at, and, when its phase opened, the record's
    /// newest version and the installed watermark.
    tag_floor: AtomicU64,
    /// Reads and stashes this phase (for the decision to join the record for good).
    reads: AtomicU64,
    stashes: AtomicU64,
}

/// What a split-aware read found beyond the version chain.
#[derive(Default)]
pub(crate) struct Folded {
    pub(crate) delta: Option<Delta>,
    pub(crate) max_tag: Ts,
    pub(crate) durable_lsn: u64,
}

impl SplitRecord {
    fn new(record: RecordRef, kind: Kind, slices: usize) -> SplitRecord {
        SplitRecord {
            record,
            kind,
            phase: AtomicU64::new(0),
            active: AtomicBool::new(false),
            budget: AtomicU64::new(0),
            slices: (0..slices)
                .map(|_| CachePadded::new(Mutex::new(Slice::default())))
                .collect(),
            history: Mutex::new(Vec::new()),
            tag_floor: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            stashes: AtomicU64::new(0),
        }
    }

    /// Whether a commit in phase `phase` may apply `ops` to this record's slices.
    pub(crate) fn takes(&self, phase: u64, ops: &[Op]) -> bool {
        self.in_phase(phase) && self.accepts(ops)
    }

    /// Whether the record takes part in split phase `phase`.
    pub(crate) fn in_phase(&self, phase: u64) -> bool {
        self.phase.load(Ordering::Acquire) == phase
    }

    /// Whether the record's slices can take `ops` (while it is split at all).
    pub(crate) fn accepts(&self, ops: &[Op]) -> bool {
        self.active.load(Ordering::Relaxed)
            && !ops.is_empty()
            && ops.iter().all(|op| Kind::of(op) == Some(self.kind))
    }

    /// This thread's slice.
    pub(crate) fn slice(&self) -> MutexGuard<'_, Slice> {
        let index = SLICE.with(|s| *s) % self.slices.len();
        self.slices[index].lock()
    }

    /// Folds every entry tagged at or below `read_ts` from the open slices and from the
    /// closed phases that `read_ts` predates, having raised the tag floor to `read_ts`. The
    /// caller holds nothing of this record's.
    pub(crate) fn fold_at(&self, key: &[u8], read_ts: Ts, lsn_limit: u64) -> Folded {
        self.reads.fetch_add(1, Ordering::Relaxed);
        // Before any slice's mutex is taken: an append under one after this fold left it
        // sees the floor ([`SplitRecord::takes_tag`]).
        self.raise_tag_floor(read_ts);
        let mut folded = Folded::default();
        let mut take = |entry: &Entry| {
            if entry.tag <= read_ts && entry.durable_lsn <= lsn_limit {
                folded.take(key, entry);
            }
        };
        let history = self.history.lock();
        for closed in history.iter().filter(|c| c.closed_at > read_ts) {
            closed.entries.iter().for_each(&mut take);
        }
        for slice in self.slices.iter() {
            slice.lock().entries.iter().for_each(&mut take);
        }
        drop(history);
        folded
    }

    /// Whether a split-only commit may tag an entry `tag`: above every snapshot that folded
    /// the slices (it would change what that saw) and above the record's versions. The
    /// caller holds its slice's mutex.
    pub(crate) fn takes_tag(&self, tag: Ts) -> bool {
        tag.0 > self.tag_floor.load(Ordering::SeqCst)
    }

    /// Tags from now on must be above `ts`.
    pub(crate) fn raise_tag_floor(&self, ts: Ts) {
        self.tag_floor.fetch_max(ts.0, Ordering::SeqCst);
    }

    /// Largest magnitude one slice may reach this phase.
    pub(crate) fn budget(&self) -> u64 {
        self.budget.load(Ordering::Relaxed)
    }
}

impl Folded {
    /// Folds one entry in.
    fn take(&mut self, key: &[u8], entry: &Entry) {
        self.max_tag = self.max_tag.max(entry.tag);
        self.durable_lsn = self.durable_lsn.max(entry.durable_lsn);
        match &mut self.delta {
            None => self.delta = Some(entry.delta.clone()),
            Some(d) => {
                d.merge(key, &entry.delta)
                    .expect("entries of one split record share a kind and a budget");
            }
        }
    }
}

impl Slice {
    /// Reserves room for `delta` under the record's per-slice budget; `false` if it does not
    /// fit (the commit then takes the ordinary path once the record is joined).
    pub(crate) fn reserve(&mut self, budget: u64, delta: &Delta) -> bool {
        let Some(total) = self.magnitude.checked_add(delta.magnitude()) else {
            return false;
        };
        if total > budget {
            return false;
        }
        self.magnitude = total;
        true
    }

    /// Appends a commit's delta at `tag`.
    pub(crate) fn append(&mut self, tag: Ts, delta: Delta, durable_lsn: u64) {
        self.commits += 1;
        if let Some(last) = self.entries.last_mut()
            && last.tag == tag
            && last.durable_lsn <= durable_lsn
        {
            last.durable_lsn = durable_lsn;
            last.delta
                .merge(&[], &delta)
                .expect("entries of one split record share a kind and a budget");
            return;
        }
        self.entries.push(Entry {
            tag,
            delta,
            durable_lsn,
        });
    }
}

thread_local! {
    /// This thread's slice index (modulo the slice count).
    static SLICE: usize = NEXT_SLICE.fetch_add(1, Ordering::Relaxed);
}
static NEXT_SLICE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Control state of the coordinator, under one mutex.
#[derive(Default)]
struct Control {
    stop: bool,
    /// Stash requests since the phase opened.
    urgent: u32,
    /// Transactions waiting for the joined phase or running in it after a stash.
    waiting: u32,
    /// Epoch of the last joined phase.
    joined_epoch: u64,
}

/// Counters of the splitter.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) phases: AtomicU64,
    pub(crate) stashes: AtomicU64,
    pub(crate) splits: AtomicU64,
    pub(crate) joins: AtomicU64,
}

pub(crate) struct Splitter {
    pub(crate) settings: Settings,
    /// `epoch * 2 + 1` while the split phase of `epoch` is open, `epoch * 2` otherwise.
    phase: CachePadded<AtomicU64>,
    /// Every split record ever made (they are freed with the database). Boxed: records
    /// point at them, so they must not move when the vector grows.
    #[allow(clippy::vec_box, reason = "split records must keep their address")]
    records: Mutex<Vec<Box<SplitRecord>>>,
    /// Which records are split, to their split states.
    table: table::SplitTable,
    proposals: Mutex<Proposals>,
    /// Lock waits per record hash bucket since the last phase turn (`Auto`).
    contention: Box<[AtomicU32]>,
    control: Mutex<Control>,
    wake: Condvar,
    joined: Condvar,
    pub(crate) counters: Counters,
    /// Records split now (those with `active` set).
    active: AtomicUsize,
    slices: usize,
}

/// The proposals, held by the collector ([`Splitter::proposal_gate`]).
pub(crate) struct ProposalGate<'a>(parking_lot::MutexGuard<'a, Proposals>);

impl ProposalGate<'_> {
    /// Whether `record` was ever proposed for splitting.
    pub(crate) fn proposed(&self, record: RecordRef) -> bool {
        self.0.seen.contains(&(record.0.as_ptr() as usize))
    }
}

/// Records proposed for splitting, not yet adopted by the coordinator.
#[derive(Default)]
struct Proposals {
    list: Vec<(RecordRef, Kind)>,
    /// Record addresses in `list`, to propose each once.
    seen: HashSet<usize>,
}

const CONTENTION_BUCKETS: usize = 4096;

impl Splitter {
    /// `record`'s split state, if it was ever split.
    #[inline]
    pub(crate) fn split_of(&self, record: &crate::mvcc::Record) -> Option<&'static SplitRecord> {
        self.table.get(record)
    }

    /// Attaches `split` to its record (once; the coordinator does it).
    pub(crate) fn attach(&self, record: &crate::mvcc::Record, split: &SplitRecord) {
        self.table.attach(record, split);
    }

    pub(crate) fn new(settings: Settings) -> Splitter {
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        Splitter {
            settings,
            phase: CachePadded::new(AtomicU64::new(0)),
            records: Mutex::new(Vec::new()),
            table: table::SplitTable::new(),
            proposals: Mutex::new(Proposals::default()),
            contention: (0..CONTENTION_BUCKETS).map(|_| AtomicU32::new(0)).collect(),
            control: Mutex::new(Control::default()),
            wake: Condvar::new(),
            joined: Condvar::new(),
            counters: Counters::default(),
            active: AtomicUsize::new(0),
            slices: cores.next_power_of_two().clamp(2, 64),
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.settings.mode != SplitMode::Off
    }

    /// The open split phase's word, if one is open.
    #[inline]
    pub(crate) fn open_phase(&self) -> Option<u64> {
        let p = self.phase.load(Ordering::SeqCst);
        (p & 1 == 1).then_some(p)
    }

    /// Whether phase `p` is still open (after the caller announced it).
    pub(crate) fn still_open(&self, p: u64) -> bool {
        self.phase.load(Ordering::SeqCst) == p
    }

    /// A commit waited for the lock of `record` to apply `ops` (Auto mode), or touched it
    /// with them (Force mode).
    pub(crate) fn note(&self, record: RecordRef, ops: &[Op], waited: bool) {
        let Some(Some(kind)) = ops.first().map(Kind::of) else {
            return;
        };
        if ops.iter().any(|op| Kind::of(op) != Some(kind)) {
            return;
        }
        if self
            .split_of(record.get())
            .is_some_and(|sr| sr.active.load(Ordering::Relaxed))
        {
            return;
        }
        match self.settings.mode {
            SplitMode::Off => {}
            SplitMode::Force => self.propose(record, kind),
            SplitMode::Auto if waited => {
                let bucket = record.get().hash() as usize % CONTENTION_BUCKETS;
                let waits = self.contention[bucket].fetch_add(1, Ordering::Relaxed) + 1;
                if waits == self.settings.contention {
                    self.propose(record, kind);
                }
            }
            SplitMode::Auto => {}
        }
    }

    fn propose(&self, record: RecordRef, kind: Kind) {
        let mut proposals = self.proposals.lock();
        // Under the lock the collector takes records under (`proposal_gate`): either it
        // sees this proposal, or this sees the record taken.
        if record.get().is_dead() {
            return;
        }
        if proposals.seen.insert(record.0.as_ptr() as usize) {
            proposals.list.push((record, kind));
            drop(proposals);
            self.wake.notify_all();
        }
    }

    /// Holds the proposals while the collector takes records, so that it never takes one
    /// proposed for splitting (the coordinator adopts those without a registry slot).
    pub(crate) fn proposal_gate(&self) -> ProposalGate<'_> {
        ProposalGate(self.proposals.lock())
    }

    /// A transaction needs `sr` joined (it read it, or writes it with something that cannot
    /// go to a slice): count it and ask for an early reconciliation.
    pub(crate) fn stash(&self, sr: &SplitRecord) {
        sr.stashes.fetch_add(1, Ordering::Relaxed);
        self.counters.stashes.fetch_add(1, Ordering::Relaxed);
        let mut control = self.control.lock();
        control.urgent += 1;
        drop(control);
        self.wake.notify_all();
    }

    /// Waits (at most two phase lengths) until the split phase open now, if any, has been
    /// reconciled, and holds the joined phase open (bounded by a phase length) until the
    /// returned guard is dropped.
    pub(crate) fn wait_joined(&self) -> Joined<'_> {
        let mut control = self.control.lock();
        control.waiting += 1;
        let p = self.phase.load(Ordering::SeqCst);
        if p & 1 == 1 {
            let epoch = p >> 1;
            let deadline = Instant::now() + 2 * self.settings.phase;
            while control.joined_epoch < epoch && !control.stop {
                if self.joined.wait_until(&mut control, deadline).timed_out() {
                    break;
                }
            }
        }
        Joined { splitter: self }
    }

    /// Splits `sr` in coming phases (no-op if it is).
    fn activate(&self, sr: &SplitRecord) {
        if !sr.active.swap(true, Ordering::Relaxed) {
            self.active.fetch_add(1, Ordering::Relaxed);
            self.counters.splits.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Joins `sr` for good (no-op if it is).
    fn deactivate(&self, sr: &SplitRecord) {
        if sr.active.swap(false, Ordering::Relaxed) {
            self.active.fetch_sub(1, Ordering::Relaxed);
            self.counters.joins.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// How many records are split now.
    pub(crate) fn split_count(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }

    /// Keys of the records split now.
    pub(crate) fn split_keys(&self) -> Vec<Vec<u8>> {
        self.records
            .lock()
            .iter()
            .filter(|sr| sr.active.load(Ordering::Relaxed))
            .map(|sr| sr.record.get().key().to_vec())
            .collect()
    }

    pub(crate) fn stop(&self) {
        self.control.lock().stop = true;
        self.wake.notify_all();
        self.joined.notify_all();
    }
}

/// Holds a joined phase open for a retry; see [`Db::wait_joined`](crate::Db::wait_joined).
#[must_use = "the joined phase waits only while the guard lives: hold it across the retry"]
pub struct Joined<'db> {
    splitter: &'db Splitter,
}

impl Drop for Joined<'_> {
    fn drop(&mut self) {
        let mut control = self.splitter.control.lock();
        control.waiting = control.waiting.saturating_sub(1);
        drop(control);
        self.splitter.wake.notify_all();
    }
}

impl std::fmt::Debug for Joined<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Joined")
    }
}

pub(crate) mod coordinator;

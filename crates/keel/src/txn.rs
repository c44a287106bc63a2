//! Transactions and snapshots.
//!
//! A read-write [`Txn`] reads the snapshot at its `read_ts`, remembers every record it read,
//! every absent key it looked up and every range it scanned, and buffers its writes. Commit:
//!
//! 1. lock the write set in one global order, by key hash and then key (creating records
//!    for new keys, locked, in both indexes); a lock held by someone else is waited on
//!    briefly, then the commit aborts — no deadlock is possible and no wait is unbounded;
//! 2. compute the values of commutative operations from the newest committed value (stable
//!    under the lock);
//! 3. take `commit_ts`;
//! 4. validate: nothing read or scanned has a version newer than `read_ts` or is locked by
//!    another transaction, except that a key read only for its presence
//!    ([`Txn::exists_for_write`]) and written (so locked here) need only be present exactly
//!    when it was;
//! 5. install one version per written key at `commit_ts`, unlock, and publish `commit_ts` to
//!    the watermark in timestamp order.
//!
//! A transaction with no writes commits at its snapshot without validation: it is
//! serializable at `read_ts`, and strictly so because `read_ts` was the watermark when it
//! began. [`Snapshot`] is the same without any bookkeeping.

use std::ops::{Bound, RangeBounds};

use crossbeam_utils::Backoff;

use crate::Ts;
use crate::commutative::Op;
use crate::concurrency::{SlotId, SlotStats};
use crate::db::Shared;
use crate::error::{BeginError, CommitError, Conflict, ConflictReason, Error, Limit};
use crate::index::hash;
use crate::limits::{
    KEY_BYTES_MAX, TXN_READS_MAX, TXN_WRITE_BYTES_MAX, TXN_WRITE_KEYS_MAX, VALUE_BYTES_MAX,
};
use crate::mvcc::{LockOwner, RecordRef, Staleness};
use crate::split::{Delta, SplitRecord};
use crate::store::{KeyRange, Store};
use crate::wal::Durability;
use crate::wal::format::Logged;

/// How often (in commit timestamps) committers recompute the garbage-collection horizon.
const COLLECT_EVERY: u64 = 256;
/// How many rounds of exponential spinning (about 120 pause instructions in all) an async
/// committer that is not waiting for an fsync spends on its predecessors before its task
/// sleeps (see [`Txn::commit_async`]).
const PUBLISH_SPINS: usize = 7;

/// Value bytes a record created by commutative operations keeps room for in its embedded
/// slot (see `mvcc::Record`): eight decimal digits, a counter below 10^8. Room for any i64
/// (20) would make a 20-byte key's record 104 bytes instead of 88. A longer first value,
/// like every later one, gets a version of its own.
const OPS_FIRST_VALUE_RESERVE: usize = 8;

/// How long a committer waits for a record lock held by one other committer before
/// aborting. Locks are taken in one global order (hash, then key), so waiting cannot
/// deadlock; a holder keeps its locks only while it validates, logs and installs (never
/// across an fsync), so the wait is short unless the holder was descheduled, which yielding
/// lets it recover from, or is a prepared transaction waiting for its decision. A lock that
/// changed hands meanwhile is not stuck, only contended: the wait starts again, up to
/// [`LOCK_WAIT_CONTENDED_MAX`] in all, so that a committer that keeps losing a hot record's
/// lock to others under CPU pressure does not abort (commutative operations promise not to).
const LOCK_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(1);
/// The longest a committer waits for a lock that keeps changing hands.
const LOCK_WAIT_CONTENDED_MAX: std::time::Duration = std::time::Duration::from_secs(30);

/// A wait for a record lock ([`Txn::lock`]): it gives up once one holder has kept the lock
/// for `wait`, or after `patience` in all. The lock changing hands, or the record getting a
/// new version, shows that others get through: the lock is contended, not stuck, and the
/// `wait` starts again.
struct LockWait {
    started: std::time::Instant,
    deadline: std::time::Instant,
    wait: std::time::Duration,
    patience: std::time::Duration,
    /// The lock word and newest version last seen.
    seen: (u64, *const crate::mvcc::Version),
    moved: bool,
}

impl LockWait {
    fn new(
        now: std::time::Instant,
        wait: std::time::Duration,
        patience: std::time::Duration,
        r: &crate::mvcc::Record,
    ) -> LockWait {
        LockWait {
            started: now,
            deadline: now + wait,
            wait,
            patience: patience.max(wait),
            seen: Self::state(r),
            moved: false,
        }
    }

    fn state(r: &crate::mvcc::Record) -> (u64, *const crate::mvcc::Version) {
        (
            r.lock_word(),
            r.head().map_or(std::ptr::null(), std::ptr::from_ref),
        )
    }

    /// Whether to give up at `now`, having looked at `r` once more.
    fn gives_up(&mut self, now: std::time::Instant, r: &crate::mvcc::Record) -> bool {
        self.observe(now, Self::state(r))
    }

    fn observe(
        &mut self,
        now: std::time::Instant,
        state: (u64, *const crate::mvcc::Version),
    ) -> bool {
        if state != self.seen {
            self.seen = state;
            self.moved = true;
        }
        if now < self.deadline {
            return false;
        }
        if !self.moved || now >= self.started + self.patience {
            return true;
        }
        self.deadline = now + self.wait;
        self.moved = false;
        false
    }
}
/// How long a prepare waits for a key it read to be free of an exclusive holder.
/// How long a prepare waits for a lock (exclusive for a key it writes, shared for one it
/// read): briefly, as it holds its other locks meanwhile, and the holder may be a prepared
/// transaction waiting in turn for this one's locks on another node. Its coordinator
/// retries with backoff.
const PREPARE_LOCK_WAIT_MAX: std::time::Duration = std::time::Duration::from_millis(2);

/// Gives back shared holds; a record left empty (made for a key read absent) goes to the
/// collector.
pub(crate) fn unlock_shared(db: &Shared, shared: &[RecordRef]) {
    for record in shared {
        let r = record.get();
        // Noted while held, so that the collector cannot have taken it before the note.
        if r.head().is_none() {
            db.store.note_dead(*record, Ts(0));
        }
        r.unlock_shared();
    }
}

/// How often a commit starts over because a record it applies commutative operations to
/// moved into a split phase while it was locking.
const SPLIT_RESTARTS_MAX: u32 = 64;

/// The error of the smallest key whose operations fail against its committed value, among
/// `writes` (locked as `locked`; those going to split slices are not applied at commit).
fn first_apply_error(
    writes: &[WriteEntry],
    locked: &[RecordRef],
    slices: &[Option<&'static SplitRecord>],
) -> Option<Error> {
    let mut first: Option<(&[u8], Error)> = None;
    for (i, (entry, record)) in writes.iter().zip(locked).enumerate() {
        let Write::Ops(ops) = &entry.write else {
            continue;
        };
        if slices.get(i).is_some_and(Option::is_some)
            || first
                .as_ref()
                .is_some_and(|(k, _)| *k <= entry.key.as_slice())
        {
            continue;
        }
        let mut value = record
            .get()
            .head()
            .and_then(|v| v.value())
            .map(<[u8]>::to_vec);
        for op in ops {
            match op.apply(&entry.key, value.as_deref()) {
                Ok(v) => value = Some(v),
                Err(e) => {
                    first = Some((&entry.key, e));
                    break;
                }
            }
        }
    }
    first.map(|(_, e)| e)
}

/// What [`Txn::lock`] achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Locking {
    Held,
    /// Held by another committer for too long.
    Busy,
    /// Held by a prepared transaction until its decision; a commit does not wait for it.
    AwaitsDecision,
    /// The record is split in the phase open now, and the write can go to a slice.
    SplitOpening,
    /// A prepare met a split record, which it can neither write to a slice nor hold: it
    /// asked for the joined phase and gives up (`ConflictReason::Split`).
    Split,
    /// The collector took the record: look the key up again.
    Dead,
}

/// Reads a transaction remembers without allocating, the common case: a command reads a key or
/// two (the server's commands read one absent meta record before each write).
const READS_INLINE: usize = 2;
/// Bytes of an absent key remembered inline; longer keys are copied to the heap.
const ABSENT_KEY_INLINE_BYTES: usize = 32;

enum Read {
    Record(RecordRef),
    Absent {
        key: smallvec::SmallVec<[u8; ABSENT_KEY_INLINE_BYTES]>,
        hash: u64,
    },
    /// Whether a key the transaction writes was present ([`Txn::exists_for_write`]): only
    /// its presence at commit is validated, not its value.
    Presence {
        key: smallvec::SmallVec<[u8; ABSENT_KEY_INLINE_BYTES]>,
        hash: u64,
        present: bool,
    },
}

#[derive(Debug, Clone)]
enum Write {
    Put(Vec<u8>),
    Delete,
    Ops(Vec<Op>),
}

impl Write {
    fn bytes(&self) -> usize {
        match self {
            Write::Put(v) => v.len(),
            Write::Delete => 0,
            Write::Ops(ops) => ops.iter().map(Op::bytes).sum(),
        }
    }
}

/// A write-set entry's key: inline up to [`WRITE_KEY_INLINE`] bytes, so that most keys take
/// no allocation of their own.
pub(crate) type WriteKey = smallvec::SmallVec<[u8; WRITE_KEY_INLINE]>;

struct WriteEntry {
    key: WriteKey,
    hash: u64,
    write: Write,
    /// Tickets ([`Txn::track`]) for the value after the first `n` of this entry's operations,
    /// resolved at commit: `(ticket, n)`. Only on `Write::Ops` entries.
    tickets: Tickets,
}

/// Key bytes a write-set entry holds without an allocation: a collection's sub-key (a 10- to
/// 18-byte prefix, then the field or member: one of 22 to 30 bytes fits). At 24,
/// every member of 14 bytes or more cost an allocation per write.
const WRITE_KEY_INLINE: usize = 40;

/// An entry's tickets: usually none or one (an `INCR`), which take no allocation.
#[derive(Default)]
struct Tickets {
    first: Option<(u32, usize)>,
    rest: Vec<(u32, usize)>,
}

impl Tickets {
    fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    fn push(&mut self, ticket: (u32, usize)) {
        if self.first.is_none() {
            self.first = Some(ticket);
        } else {
            self.rest.push(ticket);
        }
    }

    fn iter(&self) -> impl Iterator<Item = (u32, usize)> + '_ {
        self.first.into_iter().chain(self.rest.iter().copied())
    }
}

/// Buffered writes: a vector in arrival order, with a hash index once it grows.
#[derive(Default)]
struct WriteSet {
    entries: Vec<WriteEntry>,
    /// Positions in `entries` by key hash, open addressing with linear probing, once there
    /// are more than [`WRITE_SET_SCAN_MAX`]: [`NO_ENTRY`] marks a free slot, and the table
    /// is at most half full. It keeps positions only, by the hash each entry already
    /// carries: a map from copied keys cost a key allocation and a second hash per write.
    index: Vec<u32>,
    bytes: usize,
    /// Writes made so far ([`Txn::write_count`]).
    count: u64,
}

/// A free slot of [`WriteSet::index`].
const NO_ENTRY: u32 = u32::MAX;

const WRITE_SET_SCAN_MAX: usize = 16;

impl WriteSet {
    /// The entry for `key`, whose [`hash`] is `hash`.
    fn find(&self, key: &[u8], hash: u64) -> Option<usize> {
        // Empty also once the commit took the entries (the index then outlives them).
        if self.entries.is_empty() {
            return None;
        }
        if self.index.is_empty() {
            // The hash first: keys of one length (a benchmark's, a schema's) would otherwise
            // cost a `memcmp` call per entry, and a pipelined `INCR` scans several times.
            return self
                .entries
                .iter()
                .position(|e| e.hash == hash && e.key.as_slice() == key);
        }
        let mask = self.index.len() - 1;
        let mut slot = hash as usize & mask;
        loop {
            let position = self.index[slot];
            if position == NO_ENTRY {
                return None;
            }
            let entry = &self.entries[position as usize];
            if entry.hash == hash && entry.key.as_slice() == key {
                return Some(position as usize);
            }
            slot = (slot + 1) & mask;
        }
    }

    fn push(&mut self, key: &[u8], hash: u64, write: Write) {
        self.count += 1;
        self.bytes += key.len() + write.bytes();
        let position = self.entries.len();
        self.entries.push(WriteEntry {
            // `from_slice` copies at once; `into` (a slice's `From`) pushes byte by byte.
            key: WriteKey::from_slice(key),
            hash,
            write,
            tickets: Tickets::default(),
        });
        if !self.index.is_empty() && 2 * self.entries.len() <= self.index.len() {
            self.index_entry(position);
        } else if self.entries.len() > WRITE_SET_SCAN_MAX {
            // (Re)built at four times the entries: a quarter full, room to double.
            self.index = vec![NO_ENTRY; (4 * self.entries.len()).next_power_of_two()];
            for position in 0..self.entries.len() {
                self.index_entry(position);
            }
        }
    }

    /// Puts `entries[position]` in the index, which has room.
    fn index_entry(&mut self, position: usize) {
        let mask = self.index.len() - 1;
        let mut slot = self.entries[position].hash as usize & mask;
        while self.index[slot] != NO_ENTRY {
            slot = (slot + 1) & mask;
        }
        self.index[slot] = u32::try_from(position).expect("write sets are bounded");
    }

    fn replace(&mut self, position: usize, write: Write) {
        self.count += 1;
        let entry = &mut self.entries[position];
        debug_assert!(entry.tickets.is_empty() || matches!(write, Write::Ops(_)));
        self.bytes = self.bytes - entry.write.bytes() + write.bytes();
        entry.write = write;
    }
}

mod prepared;
pub use prepared::{PrepareFuture, Prepared, Resolved};

/// A promise of the value a key holds right after some of a transaction's writes, given by
/// [`Txn::track`] and redeemed with [`Committed::value`] once the transaction commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ticket(u32);

/// The value behind a ticket: known when it was given (the key's value did not depend on
/// the committed state, or the transaction read it anyway), or resolved at commit.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Tracked {
    Known(Option<Vec<u8>>),
    Pending,
}

/// A successful commit and where it sits in the serial order.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Committed {
    /// The commit timestamp: snapshots at or above it see the commit.
    pub ts: Ts,
    /// The commit only applied commutative operations to split records' slices (see
    /// [`SplitMode`](crate::SplitMode)): it took no timestamp of its own and is serialized
    /// right after the commit at `ts` and after the snapshots at `ts` that did not see it.
    pub split_only: bool,
    /// The values behind the transaction's tickets, by ticket number.
    tracked: Vec<Option<Vec<u8>>>,
}

/// What is left of a commit once its committer's own work is done.
enum Step {
    /// Nothing: the result.
    Done(Result<Result<Committed, Conflict>, CommitError>),
    /// Commit timestamp `ts` must be published (the watermark must pass it) before the
    /// transaction lets go of its slot, whatever the outcome. With `durable_end`, only once
    /// the log is durable up to it; without, it can be marked finished at once.
    Publish {
        ts: Ts,
        outcome: Outcome,
        durable_end: Option<u64>,
    },
    /// A split-only commit that must be durable up to `end` before it is acknowledged.
    Durable { end: u64, committed: Committed },
    /// A read-only commit of a transaction that read at the installed watermark
    /// ([`Db::begin_installed`]): acknowledged once the visible watermark passes `ts`, its
    /// snapshot (everything it may have read is then durable). Nothing is finished for it.
    Visible { ts: Ts, committed: Committed },
    /// A prepare ([`Txn::prepare`]) that locked and validated: what the prepared transaction
    /// holds until its decision. Timestamp `ts` is taken and unpublished.
    Prepared {
        ts: Ts,
        writes: Vec<WriteEntry>,
        locked: Vec<RecordRef>,
        values: Vec<Option<Vec<u8>>>,
        /// The records read, held shared (absent keys get an empty record to hold).
        shared: Vec<RecordRef>,
    },
}

/// How a commit that took a timestamp turned out.
enum Outcome {
    Committed { versions: i64, announced: bool },
    Aborted(Conflict),
    LogFailed(crate::LogFailed),
}

/// What [`CommitFuture`] waits for.
enum State {
    Ready(Result<Result<Committed, Conflict>, CommitError>),
    Publish { ts: Ts, outcome: Outcome },
    Durable { end: u64, committed: Committed },
    Visible { ts: Ts, committed: Committed },
}

/// The rest of a commit started by [`Txn::commit_async`]: the wait for durability and
/// publication. Resolves to what [`Txn::commit_detailed`] returns.
#[must_use = "the commit is acknowledged only when the future resolves"]
pub struct CommitFuture<'db> {
    txn: Txn<'db>,
    /// `None` once resolved.
    state: Option<State>,
}

impl std::future::Future for CommitFuture<'_> {
    type Output = Result<Result<Committed, Conflict>, CommitError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        use std::task::Poll;
        let this = &mut *self;
        let db = this.txn.db;
        match this.state.take().expect("polled after it resolved") {
            State::Ready(result) => Poll::Ready(result),
            State::Publish { ts, outcome } => {
                let Poll::Ready(published) = db.poll_published(ts, cx) else {
                    this.state = Some(State::Publish { ts, outcome });
                    return Poll::Pending;
                };
                Poll::Ready(this.txn.conclude(ts, outcome, published))
            }
            State::Visible { ts, committed } => {
                let Poll::Ready(published) = db.poll_published(ts, cx) else {
                    this.state = Some(State::Visible { ts, committed });
                    return Poll::Pending;
                };
                Poll::Ready(match published {
                    true => Ok(Ok(committed)),
                    false => Err(CommitError::Log(
                        db.log
                            .as_ref()
                            .and_then(|log| log.failed())
                            .expect("a visibility wait ends early only on failure"),
                    )),
                })
            }
            State::Durable { end, committed } => {
                let log = db.log.as_ref().expect("a durable wait has a log");
                if !log.watch_durable(end, cx.waker()) {
                    this.state = Some(State::Durable { end, committed });
                    return Poll::Pending;
                }
                Poll::Ready(match log.durable_lsn() >= end {
                    true => Ok(Ok(this.txn.conclude_split_only(committed))),
                    false => Err(CommitError::Log(
                        log.failed()
                            .expect("a durable wait ends early only on failure"),
                    )),
                })
            }
        }
    }
}

impl Drop for CommitFuture<'_> {
    /// Dropped while waiting for publication: wait here, blocking, so that the transaction
    /// keeps its slot until the watermark passes its timestamp (or the log fails).
    fn drop(&mut self) {
        if let Some(State::Publish { ts, .. }) = self.state {
            let db = self.txn.db;
            db.oracle.wait_published(ts, || db.log_failed());
        }
    }
}

impl Committed {
    /// The value the ticket's key held right after the writes before [`Txn::track`] gave
    /// it (`None`: absent). Panics on a ticket of another transaction.
    pub fn value(&self, ticket: Ticket) -> Option<&[u8]> {
        self.tracked
            .get(ticket.0 as usize)
            .expect("a ticket of this transaction")
            .as_deref()
    }
}

/// A read-write transaction. Dropping it without committing aborts it.
///
/// ```
/// let db = keel::Db::in_memory();
/// let mut txn = db.begin()?;
/// txn.put(b"apple", b"red")?;
/// txn.put(b"banana", b"yellow")?;
/// txn.put(b"cherry", b"red")?;
/// let fruit: Vec<_> = txn.range(b"a".as_slice()..b"c".as_slice()).map(|(k, _)| k).collect();
/// assert_eq!(fruit, [b"apple".to_vec(), b"banana".to_vec()]);
/// let backwards: Vec<_> = txn.range::<&[u8]>(..).rev().map(|(k, _)| k).collect();
/// assert_eq!(backwards[0], b"cherry");
/// match txn.commit()? {
///     Ok(commit_ts) => println!("committed at {commit_ts:?}"),
///     Err(conflict) => println!("lost a conflict, retry: {conflict}"),
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Txn<'db> {
    /// Began in a database that has prepared transactions with a timestamp handed out
    /// above its snapshot and not yet published: a read-only commit is then validated.
    below_pending: bool,
    db: &'db Shared,
    durability: Option<Durability>,
    /// How long a prepare waits for each lock ([`Txn::set_prepare_lock_wait`]).
    prepare_lock_wait: std::time::Duration,
    slot: SlotId,
    read_ts: Ts,
    reads: smallvec::SmallVec<[Read; READS_INLINE]>,
    ranges: Vec<KeyRange>,
    writes: WriteSet,
    /// A write of this transaction waited for a split record's reconciliation: a failed
    /// validation then reports [`ConflictReason::Split`], so that the retry runs in the
    /// joined phase instead of meeting the next split phase again.
    stashed: std::sync::atomic::AtomicBool,
    /// What [`Txn::track`] promised, by ticket number.
    tracked: Vec<Tracked>,
    /// The registry slot was handed on ([`Oracle::release_when_published`]): dropping the
    /// transaction leaves it alone.
    ///
    /// [`Oracle::release_when_published`]: crate::concurrency::Oracle::release_when_published
    slot_handed_on: bool,
    /// A delete of this commit made a collector pass due: it runs one once published
    /// ([`Txn::conclude`]).
    collect_due: bool,
    /// Some write-set entry may hold pending score adds ([`Txn::score_add`]), whose index
    /// entries are not in the write set until they resolve: reads and writes that could meet
    /// them resolve them first.
    score_adds: bool,
    /// The caller's note ([`Txn::set_note`]).
    note: Option<Box<dyn std::any::Any + Send + Sync>>,
    /// Began at the installed watermark ([`Db::begin_installed`]): a read-only commit waits
    /// until its snapshot is visible.
    ///
    /// [`Db::begin_installed`]: crate::Db::begin_installed
    read_installed: bool,
    /// A transaction of [`Db::begin_owned`](crate::Db::begin_owned): the database it
    /// borrows as `'static`, kept alive until it ends. Declared last, so dropped after
    /// everything else that may reach into the database.
    keep: Option<std::sync::Arc<Shared>>,
}

fn check_key(key: &[u8]) -> Result<(), Error> {
    if key.len() > KEY_BYTES_MAX {
        return Err(Error::LimitExceeded {
            limit: Limit::KeyBytes,
            requested: key.len(),
        });
    }
    Ok(())
}

fn check_value(value: &[u8]) -> Result<(), Error> {
    if value.len() > VALUE_BYTES_MAX {
        return Err(Error::LimitExceeded {
            limit: Limit::ValueBytes,
            requested: value.len(),
        });
    }
    Ok(())
}

impl<'db> Txn<'db> {
    pub(crate) fn begin(db: &'db Shared) -> Result<Txn<'db>, BeginError> {
        Txn::begin_at(db, false)
    }

    /// [`Txn::begin`] at the installed watermark ([`Db::begin_installed`]).
    pub(crate) fn begin_installed(db: &'db Shared) -> Result<Txn<'db>, BeginError> {
        Txn::begin_at(db, true)
    }

    fn begin_at(db: &'db Shared, installed: bool) -> Result<Txn<'db>, BeginError> {
        let (slot, read_ts) = match installed {
            true => db.oracle.register_installed(),
            false => db.oracle.register(),
        }
        .ok_or(BeginError::TooManyOpen)?;
        // A timestamp handed out above the snapshot and not yet published may be a prepared
        // transaction's, which another database may have committed (and a client seen)
        // already; see `commit_work`'s read-only path.
        let below_pending = below_pending(db, read_ts);
        Ok(Txn {
            below_pending,
            db,
            durability: None,
            prepare_lock_wait: PREPARE_LOCK_WAIT_MAX,
            slot,
            read_ts,
            reads: smallvec::SmallVec::new(),
            ranges: Vec::new(),
            writes: WriteSet::default(),
            stashed: std::sync::atomic::AtomicBool::new(false),
            tracked: Vec::new(),
            slot_handed_on: false,
            collect_due: false,
            score_adds: false,
            note: None,
            read_installed: installed,
            keep: None,
        })
    }

    /// [`Txn::begin`] on a database this transaction keeps alive ([`Db::begin_owned`]).
    ///
    /// [`Db::begin_owned`]: crate::Db::begin_owned
    pub(crate) fn begin_owned(db: &std::sync::Arc<Shared>) -> Result<Txn<'static>, BeginError> {
        // SAFETY: the reference lives as long as the transaction, which holds a count of
        // the `Arc` (`keep`, dropped after every other field and after `Drop::drop`), and
        // whatever it is handed on to holds one too (`CommitFuture` holds the transaction,
        // `Prepared` its own count); the `Shared` never moves while counted.
        let shared: &'static Shared = unsafe { &*std::sync::Arc::as_ptr(db) };
        let mut txn = Txn::begin(shared)?;
        txn.keep = Some(std::sync::Arc::clone(db));
        Ok(txn)
    }

    /// How many writes this transaction has made: every put, delete and operation, and
    /// each resolution of pending ones. Equal counts at two moments mean that nothing was
    /// written between them, so that what a read saw of this transaction's own writes
    /// still holds (what [`Txn::set_note`] notes may rest on it).
    pub fn write_count(&self) -> u64 {
        self.writes.count
    }

    /// Keeps `note` with this transaction, in place of any before it, until it ends: what a
    /// caller learned in one command that the next one may use (where a sorted set's pops
    /// left off), tied to this transaction so that a retry, which begins another, starts
    /// without it. Notes of other types read as none.
    ///
    /// ```
    /// let db = keel::Db::in_memory();
    /// let mut txn = db.begin()?;
    /// txn.set_note(7u32);
    /// assert_eq!(txn.note::<u32>(), Some(&7));
    /// assert_eq!(txn.note::<u64>(), None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_note<T: std::any::Any + Send + Sync>(&mut self, note: T) {
        self.note = Some(Box::new(note));
    }

    /// The note [`Txn::set_note`] kept, if it is a `T`.
    pub fn note<T: std::any::Any + Send + Sync>(&self) -> Option<&T> {
        self.note.as_ref()?.downcast_ref()
    }

    /// Overrides the database's durability for this commit: [`Durability::Sync`] waits for
    /// the fsync, [`Durability::Async`] does not. Every commit of a database with files is
    /// logged, so [`Durability::None`] acts as `Async` there.
    pub fn set_durability(&mut self, durability: Durability) {
        self.durability = Some(durability);
    }

    /// How long [`Txn::prepare`] waits for each lock held by another transaction, after a
    /// brief spin (default 2 ms). A caller that would itself decide the holder (a single
    /// thread running every prepare and decision) sets zero: waiting cannot help it.
    pub fn set_prepare_lock_wait(&mut self, wait: std::time::Duration) {
        self.prepare_lock_wait = wait;
    }

    /// Whether the transaction scanned a range (its validation covers keys it never saw). A
    /// prepared transaction holds the keys it read, but not its ranges (see
    /// [`Txn::prepare`]).
    pub fn reads_ranges(&self) -> bool {
        !self.ranges.is_empty()
    }

    /// The snapshot this transaction reads.
    /// Hints that every one of `keys` is about to be read or written: [`Db::prefetch_all`](crate::Db::prefetch_all)
    /// inside the transaction, which is already registered for it. A transaction that knows
    /// its keys up front takes their cache misses in parallel instead of one read at a time.
    pub fn prefetch_all<'k>(&self, keys: impl IntoIterator<Item = &'k [u8]>) {
        self.db.store.prefetch_all(keys.into_iter().map(hash));
    }

    pub fn read_ts(&self) -> Ts {
        self.read_ts
    }

    /// How many more keys, and how many more bytes, this transaction may write within
    /// [`TXN_WRITE_KEYS_MAX`] and [`TXN_WRITE_BYTES_MAX`] (a write counts its key's bytes
    /// and its value's).
    pub fn writes_left(&self) -> (usize, usize) {
        (
            TXN_WRITE_KEYS_MAX.saturating_sub(self.writes.entries.len()),
            TXN_WRITE_BYTES_MAX.saturating_sub(self.writes.bytes),
        )
    }

    fn me(&self) -> LockOwner {
        LockOwner(u64::from(self.slot_index()) + 1)
    }

    fn slot_index(&self) -> u32 {
        self.slot.index()
    }

    fn remember(&mut self, read: Read) -> Result<(), Error> {
        if self.reads.len() + self.ranges.len() >= TXN_READS_MAX {
            return Err(Error::LimitExceeded {
                limit: Limit::TxnReads,
                requested: TXN_READS_MAX + 1,
            });
        }
        self.reads.push(read);
        Ok(())
    }

    /// Finds the committed record of `key` and remembers the read (of the record, or of the
    /// key's absence) for validation.
    fn read_record(&mut self, key: &[u8], hash: u64) -> Result<Option<RecordRef>, Error> {
        let record = self.db.store.get(key, hash);
        match record {
            Some(record) => self.remember(Read::Record(record))?,
            None => self.remember(Read::Absent {
                key: smallvec::SmallVec::from_slice(key),
                hash,
            })?,
        }
        Ok(record)
    }

    /// The committed value at the snapshot, remembered for validation.
    fn read_committed(&mut self, key: &[u8], hash: u64) -> Result<Option<Vec<u8>>, Error> {
        let record = self.read_record(key, hash)?;
        read_at(self.db, record, self.read_ts, |v, _| v.map(<[u8]>::to_vec))
    }

    /// Reads `key` without copying the committed value: `f` sees it in place. Same
    /// semantics as [`Txn::get`].
    ///
    /// ```
    /// let db = keel::Db::in_memory();
    /// db.transact(|txn| txn.put(b"k", b"hello"))?;
    /// let mut txn = db.begin()?;
    /// assert_eq!(txn.get_with(b"k", |v| v.map(<[u8]>::len))?, Some(5));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn get_with<T>(
        &mut self,
        key: &[u8],
        f: impl FnOnce(Option<&[u8]>) -> T,
    ) -> Result<T, Error> {
        let h = hash(key);
        if let Some(i) = self.writes.find(key, h) {
            // A put or a delete is read in place; only operations are computed.
            return match &self.writes.entries[i].write {
                Write::Put(v) => Ok(f(Some(v))),
                Write::Delete => Ok(f(None)),
                Write::Ops(_) => {
                    let value = self.get(key)?;
                    Ok(f(value.as_deref()))
                }
            };
        }
        check_key(key)?;
        let record = self.read_record(key, h)?;
        read_at(self.db, record, self.read_ts, |v, _| f(v))
    }

    /// Whether `key` is present (holds a value) in this transaction's view: its own writes,
    /// then the snapshot. Unlike [`Txn::get`], which conflicts with any commit to `key`
    /// after the snapshot, this remembers only the key's presence: the commit validates that
    /// `key` is present at commit exactly when it was here, whatever its value became. A
    /// write that depends on whether a key exists but not on its value (a counter that
    /// also counts the keys it creates) stays commutative with other writes of the key.
    ///
    /// Only for a key this transaction writes by commit time, which the commit then holds
    /// locked while it validates, so the key's newest version is the state the commit
    /// follows. A presence read of a key that is not written (or whose write goes to a split
    /// record's slice, see [`SplitMode`](crate::SplitMode)) is validated as a read of its value,
    /// like [`Txn::get`]: always safe, but it conflicts with any change.
    ///
    /// A key the transaction has written already needs no read: a `put` or a commutative
    /// operation leaves it present, a `delete` absent.
    ///
    /// ```
    /// let db = keel::Db::in_memory();
    /// db.transact(|txn| txn.put(b"n", b"1"))?;
    /// let mut txn = db.begin()?;
    /// assert!(txn.exists_for_write(b"n")?);
    /// txn.add(b"n", 1)?;
    /// db.transact(|txn| txn.add(b"n", 10))?; // changes the value, not the presence
    /// assert!(txn.commit()?.is_ok());
    /// assert_eq!(db.snapshot()?.get(b"n")?.as_deref(), Some(&b"12"[..]));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn exists_for_write(&mut self, key: &[u8]) -> Result<bool, Error> {
        check_key(key)?;
        let h = hash(key);
        if let Some(i) = self.writes.find(key, h) {
            // A commutative operation always leaves a value, or fails the commit.
            return Ok(!matches!(self.writes.entries[i].write, Write::Delete));
        }
        let record = self.db.store.get(key, h);
        let present = read_at(self.db, record, self.read_ts, |v, _| v.is_some())?;
        self.remember(Read::Presence {
            key: smallvec::SmallVec::from_slice(key),
            hash: h,
            present,
        })?;
        Ok(present)
    }

    /// The commit timestamp of the version of `key` this transaction's snapshot sees
    /// (`None` if the key is absent there), remembered as a read: if anyone commits to the key
    /// before this transaction does, the commit conflicts. Own buffered writes are ignored.
    /// This is what a Redis `WATCH` needs: "changed since", even to an equal value.
    ///
    /// ```
    /// let db = keel::Db::in_memory();
    /// let first = db.begin()?.commit()?.unwrap();
    /// db.transact(|txn| txn.put(b"k", b"v"))?;
    /// let mut txn = db.begin()?;
    /// assert!(txn.version_ts(b"k")?.is_some_and(|ts| ts > first));
    /// assert_eq!(txn.version_ts(b"missing")?, None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn version_ts(&mut self, key: &[u8]) -> Result<Option<Ts>, Error> {
        check_key(key)?;
        let record = self.read_record(key, hash(key))?;
        read_at(self.db, record, self.read_ts, |v, ts| {
            ts.filter(|_| v.is_some())
        })
    }

    /// The commit timestamp of the newest version of `key` this transaction's snapshot sees,
    /// a deletion included (`None`: never written, or deleted so long ago that the collector
    /// took the record), remembered as a read like [`Txn::version_ts`]. "Has anyone
    /// committed to `key` after timestamp `t`?" is `newest_ts(key)? > Some(t)`, for as long as
    /// a snapshot at or below `t` stays open (it keeps a later deletion from being
    /// collected). Own buffered writes are ignored.
    ///
    /// ```
    /// let db = keel::Db::in_memory();
    /// let watch = db.begin()?;
    /// db.transact(|txn| txn.put(b"k", b"v"))?;
    /// db.transact(|txn| txn.delete(b"k"))?;
    /// let mut txn = db.begin()?;
    /// assert_eq!(txn.version_ts(b"k")?, None);
    /// assert!(txn.newest_ts(b"k")? > Some(watch.read_ts()));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn newest_ts(&mut self, key: &[u8]) -> Result<Option<Ts>, Error> {
        check_key(key)?;
        let record = self.read_record(key, hash(key))?;
        read_at(self.db, record, self.read_ts, |_, ts| ts)
    }

    /// Reads `key`: this transaction's own writes first, then the snapshot.
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        check_key(key)?;
        let h = hash(key);
        match self
            .writes
            .find(key, h)
            .map(|i| self.writes.entries[i].write.clone())
        {
            None => self.read_committed(key, h),
            Some(Write::Put(v)) => Ok(Some(v)),
            Some(Write::Delete) => Ok(None),
            Some(Write::Ops(ops)) if ops.first().is_some_and(Op::moves_index) => {
                let i = self.writes.find(key, h).expect("found above");
                self.settle_score_add(i)?;
                match &self.writes.entries[i].write {
                    Write::Put(v) => Ok(Some(v.clone())),
                    _ => unreachable!("a settled score add is a put"),
                }
            }
            Some(Write::Ops(ops)) => {
                let mut value = self.read_committed(key, h)?;
                for op in &ops {
                    value = Some(op.apply(key, value.as_deref())?);
                }
                Ok(value)
            }
        }
    }

    /// Resolves the pending score adds of entry `i` now, by reading the key's committed
    /// score: the entry becomes a put of the sum, and the index entries move in the write
    /// set (the one at the committed score deleted, one at the sum written). Its tickets are
    /// known from here on. A read of this transaction that could see the key or its index
    /// entries calls this first, so that the transaction reads its own writes; the adds are
    /// then an ordinary read and write, which conflict as such.
    fn settle_score_add(&mut self, i: usize) -> Result<(), Error> {
        let entry = &self.writes.entries[i];
        let (key, hash) = (entry.key.clone(), entry.hash);
        let Write::Ops(ops) = entry.write.clone() else {
            unreachable!("only pending score adds settle")
        };
        let committed = self.read_committed(&key, hash)?;
        let mut value = committed.clone();
        let mut after = Vec::with_capacity(ops.len());
        for op in &ops {
            value = Some(op.apply(&key, value.as_deref())?);
            after.push(value.clone());
        }
        for (ticket, n) in std::mem::take(&mut self.writes.entries[i].tickets).iter() {
            self.tracked[ticket as usize] = Tracked::Known(after[n - 1].clone());
        }
        let value = value.expect("an entry holds at least one operation");
        self.move_score_index(&ops[0], committed.as_deref(), &value)?;
        self.writes.replace(i, Write::Put(value));
        Ok(())
    }

    /// Writes the index entries of a score that goes from `old` to `new` (through `op`'s
    /// index): the old one deleted, the new one written; nothing if they are equal.
    fn move_score_index(&mut self, op: &Op, old: Option<&[u8]>, new: &[u8]) -> Result<(), Error> {
        if old == Some(new) {
            return Ok(());
        }
        if let Some(old) = old {
            let k = op.index_key(old).expect("a score add has an index");
            let h = hash(&k);
            self.write_at(&k, h, self.writes.find(&k, h), Write::Delete)?;
        }
        let k = op.index_key(new).expect("a score add has an index");
        let h = hash(&k);
        self.write_at(&k, h, self.writes.find(&k, h), Write::Put(Vec::new()))
    }

    /// Settles the pending score adds ([`Txn::settle_score_add`]) that `touches` says a
    /// coming read or write could meet: given an entry's key and its score add, whether the
    /// read or write reaches either.
    fn settle_score_adds(&mut self, touches: impl Fn(&[u8], &Op) -> bool) -> Result<(), Error> {
        if !self.score_adds {
            return Ok(());
        }
        let mut pending = false;
        for i in 0..self.writes.entries.len() {
            let entry = &self.writes.entries[i];
            let Write::Ops(ops) = &entry.write else {
                continue;
            };
            let Some(op) = ops.first().filter(|op| op.moves_index()) else {
                continue;
            };
            if touches(&entry.key, op) {
                self.settle_score_add(i)?;
            } else {
                pending = true;
            }
        }
        self.score_adds = pending;
        Ok(())
    }

    fn check_write(&self, key: &[u8], write: &Write, existing: Option<usize>) -> Result<(), Error> {
        check_key(key)?;
        let old = existing.map_or(0, |i| self.writes.entries[i].write.bytes() + key.len());
        let bytes = self.writes.bytes - old + key.len() + write.bytes();
        if bytes > TXN_WRITE_BYTES_MAX {
            return Err(Error::LimitExceeded {
                limit: Limit::TxnWriteBytes,
                requested: bytes,
            });
        }
        if existing.is_none() && self.writes.entries.len() >= TXN_WRITE_KEYS_MAX {
            return Err(Error::LimitExceeded {
                limit: Limit::TxnWriteKeys,
                requested: self.writes.entries.len() + 1,
            });
        }
        Ok(())
    }

    fn write(&mut self, key: &[u8], write: Write) -> Result<(), Error> {
        // A put or delete of a pending score add's key, or of a key where its index entries
        // could be: the add resolves first, so that the write replaces what it read.
        self.settle_score_adds(|k, op| k == key || op.indexes(key))?;
        let h = hash(key);
        self.write_at(key, h, self.writes.find(key, h), write)
    }

    /// [`Txn::write`] for a caller that has looked `key` (hash `h`) up already: `existing`
    /// is its entry.
    fn write_at(
        &mut self,
        key: &[u8],
        h: u64,
        existing: Option<usize>,
        write: Write,
    ) -> Result<(), Error> {
        self.check_write(key, &write, existing)?;
        if let Some(i) = existing
            && !matches!(write, Write::Ops(_))
            && !self.writes.entries[i].tickets.is_empty()
        {
            self.resolve_tickets(i)?;
        }
        match existing {
            Some(i) => self.writes.replace(i, write),
            None => self.writes.push(key, h, write),
        }
        Ok(())
    }

    /// The operations of entry `i` are about to be overwritten: resolve its tickets now,
    /// against the committed value, which becomes a read of this transaction.
    fn resolve_tickets(&mut self, i: usize) -> Result<(), Error> {
        let entry = &self.writes.entries[i];
        let (key, hash) = (entry.key.clone(), entry.hash);
        let Write::Ops(ops) = entry.write.clone() else {
            unreachable!("tickets wait only on operations")
        };
        let mut value = self.read_committed(&key, hash)?;
        let mut after = Vec::with_capacity(ops.len());
        for op in &ops {
            value = Some(op.apply(&key, value.as_deref())?);
            after.push(value.clone());
        }
        for (ticket, n) in std::mem::take(&mut self.writes.entries[i].tickets).iter() {
            self.tracked[ticket as usize] = Tracked::Known(after[n - 1].clone());
        }
        Ok(())
    }

    /// A ticket for the value `key` holds after this transaction's writes so far, which
    /// [`Committed::value`] gives once the transaction commits. This is how a caller learns
    /// what a commutative operation resolved to (a Redis `INCR` replies with the new value)
    /// without reading the key: the operations stay commutative, and concurrent ones still
    /// never conflict. The ticket's key is no longer split into per-core slices for this
    /// commit (see [`SplitMode`](crate::SplitMode)), since its value must be known.
    ///
    /// If the key holds a plain value written by this transaction, the ticket is that value.
    /// If the transaction has not written the key, tracking it reads it, like [`Txn::get`].
    /// If a later `put` or `delete` overwrites pending operations, their tickets are
    /// resolved then, by reading the key. A transaction holds at most
    /// [`TXN_READS_MAX`](crate::limits::TXN_READS_MAX) tickets.
    ///
    /// ```
    /// let db = keel::Db::in_memory();
    /// db.transact(|txn| txn.put(b"hits", b"41"))?;
    /// let mut txn = db.begin()?;
    /// txn.add(b"hits", 1)?;
    /// let ticket = txn.track(b"hits")?;
    /// let committed = txn.commit_detailed()?.expect("no conflict");
    /// assert_eq!(committed.value(ticket), Some(&b"42"[..]));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn track(&mut self, key: &[u8]) -> Result<Ticket, Error> {
        if self.tracked.len() >= TXN_READS_MAX {
            return Err(Error::LimitExceeded {
                limit: Limit::TxnReads,
                requested: TXN_READS_MAX + 1,
            });
        }
        let ticket = u32::try_from(self.tracked.len()).expect("bounded by TXN_READS_MAX");
        let pending =
            self.writes
                .find(key, hash(key))
                .and_then(|i| match &self.writes.entries[i].write {
                    Write::Ops(ops) => Some((i, ops.len())),
                    _ => None,
                });
        let tracked = match pending {
            Some((i, n)) => {
                self.writes.entries[i].tickets.push((ticket, n));
                Tracked::Pending
            }
            None => Tracked::Known(self.get(key)?),
        };
        self.tracked.push(tracked);
        Ok(Ticket(ticket))
    }

    /// Writes `value` under `key`.
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        check_value(value)?;
        self.write(key, Write::Put(value.to_vec()))
    }

    /// Deletes `key` (a no-op if it is absent).
    pub fn delete(&mut self, key: &[u8]) -> Result<(), Error> {
        self.write(key, Write::Delete)
    }

    fn commutative(&mut self, key: &[u8], op: Op) -> Result<(), Error> {
        op.check()?;
        self.settle_score_adds(|k, pending| {
            (k == key && !op.moves_index()) || pending.indexes(key)
        })?;
        let h = hash(key);
        let existing = self.writes.find(key, h);
        let entry = existing.map(|i| &mut self.writes.entries[i]);
        let write = match entry.map(|e| (&mut e.write, &e.tickets)) {
            None => Write::Ops(vec![op]),
            Some((Write::Put(v), _)) => Write::Put(op.apply(key, Some(v))?),
            Some((Write::Delete, _)) => Write::Put(op.apply(key, None)?),
            // Appended where it is (a copy of the list per operation made a pipeline of
            // adds to one key quadratic): only the transaction's bytes can refuse it.
            Some((Write::Ops(ops), tickets)) => {
                // An add after an add of the same sign is their sum: it fails (overflows)
                // exactly when one of the two would, whatever the value, so one parse and
                // one decimal text serve both at commit. Not where a ticket wants the value
                // between them.
                let ticketed = tickets.iter().any(|(_, n)| n == ops.len());
                if let (Op::Add(b), Some(Op::Add(a))) = (&op, ops.last_mut())
                    && (*a < 0) == (*b < 0)
                    && !ticketed
                    && let Some(sum) = a.checked_add(*b)
                {
                    *a = sum;
                    self.writes.count += 1;
                    return Ok(());
                }
                let bytes = self.writes.bytes + op.bytes();
                if bytes > TXN_WRITE_BYTES_MAX {
                    return Err(Error::LimitExceeded {
                        limit: Limit::TxnWriteBytes,
                        requested: bytes,
                    });
                }
                ops.push(op);
                self.writes.bytes = bytes;
                self.writes.count += 1;
                return Ok(());
            }
        };
        self.write_at(key, h, existing, write)
    }

    /// Adds `delta` to the integer stored under `key` (a missing key counts as 0). Integers
    /// are stored as decimal text, as Redis does. Adds no read dependency: concurrent adds to
    /// the same key never conflict. If the committed value is not an integer, the commit
    /// fails with [`Error::NotAnInteger`] naming the key.
    pub fn add(&mut self, key: &[u8], delta: i64) -> Result<(), Error> {
        self.commutative(key, Op::Add(delta))
    }

    /// Keeps the larger of the stored integer and `n`. Commutative, like [`Txn::add`].
    pub fn max(&mut self, key: &[u8], n: i64) -> Result<(), Error> {
        self.commutative(key, Op::Max(n))
    }

    /// Keeps the smaller of the stored integer and `n`. Commutative, like [`Txn::add`].
    pub fn min(&mut self, key: &[u8], n: i64) -> Result<(), Error> {
        self.commutative(key, Op::Min(n))
    }

    /// Ordered put: stores `value` with `order` unless the stored value has a higher order.
    /// The stored bytes are [`encode_ordered`](crate::encode_ordered)`(order, value)`.
    /// Commutative, like [`Txn::add`].
    pub fn put_ordered(&mut self, key: &[u8], order: u64, value: &[u8]) -> Result<(), Error> {
        self.commutative(
            key,
            Op::OrderedPut {
                order,
                value: value.to_vec(),
            },
        )
    }

    /// Inserts `member` with `score` into the top-`k` list under `key` (highest scores kept;
    /// a member keeps its highest score). Read it with [`decode_top_k`](crate::decode_top_k).
    /// Commutative, like [`Txn::add`].
    pub fn top_k_insert(
        &mut self,
        key: &[u8],
        k: u32,
        score: i64,
        member: &[u8],
    ) -> Result<(), Error> {
        check_key(member)?;
        self.commutative(
            key,
            Op::TopK {
                k,
                score,
                member: member.to_vec(),
            },
        )
    }

    /// Adds `delta` to the score stored under `key` (an `f64` in the 8 bytes of
    /// [`encode_score`](crate::encode_score), big-endian; a missing key counts as 0) and keeps
    /// its index entry in step: the key `index_prefix ++ score ++ index_suffix` (the score's 8
    /// bytes in the middle, the value empty) exists for the score `key` holds, and for no
    /// other. So an index whose entries sort by score (a Redis sorted set's) follows the
    /// scores without its writers reading them.
    ///
    /// Commutative, like [`Txn::add`]: concurrent score adds to one key never conflict. The
    /// commit resolves the sum against the newest committed score under the key's lock, then
    /// deletes the index entry at the old score and writes the one at the new, locking them
    /// for as long as a commit's locks wait ([`ConflictReason::WriteLocked`] if another
    /// writer keeps one). [`Txn::track`] gives the sum. The adds resolve early, as a read of
    /// the key, when this transaction reads the key, ranges over it or over its index
    /// entries, or writes either itself: it reads its own writes. Score adds never go to split
    /// slices. Writers of the index entries other than score adds must hold the key too (write
    /// it in the same transaction), as any index's writers must.
    ///
    /// The commit fails with [`Error::NotAScore`] if the committed value is not 8 bytes, and
    /// with [`Error::NotANumber`] if the sum is NaN (`inf` plus `-inf`); a NaN `delta` is
    /// refused here.
    ///
    /// ```
    /// use keel::{decode_score_value, encode_score};
    /// let db = keel::Db::in_memory();
    /// let index = |score: f64| [&b"i/"[..], &encode_score(score).to_be_bytes(), b"/m"].concat();
    /// let mut txn = db.begin()?;
    /// txn.score_add(b"s/m", 1.5, b"i/", b"/m")?;
    /// let ticket = txn.track(b"s/m")?;
    /// let committed = txn.commit_detailed()?.expect("no conflict");
    /// assert_eq!(committed.value(ticket).and_then(decode_score_value), Some(1.5));
    /// db.transact(|txn| txn.score_add(b"s/m", 2.0, b"i/", b"/m"))?;
    /// let snapshot = db.snapshot()?;
    /// assert_eq!(snapshot.get(&index(1.5))?, None);
    /// assert_eq!(snapshot.get(&index(3.5))?, Some(Vec::new()));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn score_add(
        &mut self,
        key: &[u8],
        delta: f64,
        index_prefix: &[u8],
        index_suffix: &[u8],
    ) -> Result<(), Error> {
        if delta.is_nan() {
            return Err(Error::NotANumber { key: key.to_vec() });
        }
        check_key(key)?;
        if index_prefix.len() + 8 + index_suffix.len() > KEY_BYTES_MAX {
            return Err(Error::LimitExceeded {
                limit: Limit::KeyBytes,
                requested: index_prefix.len() + 8 + index_suffix.len(),
            });
        }
        // Its index entries are locked and written at commit besides the key.
        if self.writes.entries.len() + 3 > TXN_WRITE_KEYS_MAX {
            return Err(Error::LimitExceeded {
                limit: Limit::TxnWriteKeys,
                requested: self.writes.entries.len() + 3,
            });
        }
        let op = Op::score_add(delta, index_prefix, index_suffix);
        let h = hash(key);
        let existing = self.writes.find(key, h);
        let pending = existing.and_then(|i| match &self.writes.entries[i].write {
            Write::Ops(ops) => ops.first().cloned(),
            _ => None,
        });
        match pending {
            // More adds of the same index: they resolve together at commit.
            Some(pending) if pending.index_parts() == Some((index_prefix, index_suffix)) => {
                return self.commutative(key, op);
            }
            // Pending adds of any other kind: a read resolves them (`get`).
            Some(_) => {}
            // Nothing pending, and no index entry of this key written by this transaction,
            // which the commit would meet among its own writes: pending.
            None if existing.is_none()
                && !self.writes.entries.iter().any(|e| op.indexes(&e.key)) =>
            {
                let write = Write::Ops(vec![op]);
                self.check_write(key, &write, None)?;
                self.writes.push(key, h, write);
                self.score_adds = true;
                return Ok(());
            }
            None => {}
        }
        // The key's score is known to this transaction, or must be read: add now, and move
        // the index entry in the write set.
        let old = self.get(key)?;
        let new = op.apply(key, old.as_deref())?;
        self.move_score_index(&op, old.as_deref(), &new)?;
        let h = hash(key);
        let existing = self.writes.find(key, h);
        self.write_at(key, h, existing, Write::Put(new))
    }

    /// Key-ordered iterator over `bounds` at this transaction's snapshot, with its own writes
    /// applied. Reverse it with `.rev()`. The part of the range actually read is remembered:
    /// if another transaction inserts, deletes or changes a key there before this one commits,
    /// one of the two aborts (no phantoms).
    pub fn range<'k, K>(&mut self, bounds: impl RangeBounds<K>) -> Range<'_, 'db>
    where
        K: AsRef<[u8]> + ?Sized + 'k,
    {
        self.range_of(owned_range(&bounds))
    }

    /// [`Txn::range`] over bounds the caller already owns: nothing is copied.
    ///
    /// ```
    /// use std::ops::Bound;
    /// let db = keel::Db::in_memory();
    /// let mut txn = db.begin()?;
    /// txn.put(b"a", b"1")?;
    /// let keys: Vec<_> = txn
    ///     .range_owned(Bound::Included(b"a".to_vec()), Bound::Unbounded)
    ///     .map(|(k, _)| k)
    ///     .collect();
    /// assert_eq!(keys, [b"a".to_vec()]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn range_owned(&mut self, lo: Bound<Vec<u8>>, hi: Bound<Vec<u8>>) -> Range<'_, 'db> {
        self.range_of(KeyRange { lo, hi })
    }

    /// [`Txn::range_owned`] that the commit does **not** check: another transaction may
    /// insert, delete or change keys in it and this one still commits. It sees what
    /// `range_owned` would (the snapshot with this transaction's writes).
    ///
    /// For choices any outcome of which is correct, such as a random member of a set: the
    /// caller confirms what its decision rests on with checked reads (a [`Txn::get_with`] of
    /// each key it picked), so that the commit is serializable whatever the range held. A
    /// decision that rests on what the range does *not* hold (the lowest key, a gap) needs
    /// [`Txn::range_owned`].
    ///
    /// ```
    /// use std::ops::Bound;
    /// let db = keel::Db::in_memory();
    /// let mut setup = db.begin()?;
    /// setup.put(b"m1", b"")?;
    /// setup.commit()?.expect("commits");
    /// let mut txn = db.begin()?;
    /// let first = txn
    ///     .range_unchecked(Bound::Included(b"m".to_vec()), Bound::Excluded(b"n".to_vec()))
    ///     .next()
    ///     .map(|(k, _)| k);
    /// assert_eq!(first.as_deref(), Some(&b"m1"[..]));
    /// // A member added meanwhile is no conflict: only the keys read are checked.
    /// let mut other = db.begin()?;
    /// other.put(b"m0", b"")?;
    /// other.commit()?.expect("commits");
    /// assert!(txn.get(b"m1")?.is_some());
    /// txn.delete(b"m1")?;
    /// assert!(txn.commit()?.is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn range_unchecked(&mut self, lo: Bound<Vec<u8>>, hi: Bound<Vec<u8>>) -> Range<'_, 'db> {
        let mut range = self.range_of(KeyRange { lo, hi });
        range.checked = false;
        range
    }

    /// A key drawn at random among those the store's ordered index holds in `lo..hi`, as a
    /// place to start a [`Txn::range_unchecked`] from (a random member of a set). It is not a
    /// read: the key may be one deleted at this transaction's snapshot or written after it,
    /// and nothing about it is checked at commit. `draw(n)` returns a number below `n`.
    /// Random, not uniform (see the index's `sample`); `None` when the draw found no key
    /// (start from `lo`).
    pub fn sample_key(
        &self,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
        draw: impl FnMut(usize) -> usize,
    ) -> Option<Vec<u8>> {
        sample_key(self.db, lo, hi, draw)
    }

    fn range_of(&mut self, range: KeyRange) -> Range<'_, 'db> {
        // A range over a pending score add's key or index: it resolves first. An error there
        // (a value that is not a score) is met again at `get` and at commit, as in `overlay`.
        let _ = self.settle_score_adds(|k, op| range.contains(k) || op.index_overlaps(&range));
        let overlay = self.overlay(&range);
        let scan = Scan::new(self.db, range, self.read_ts, overlay);
        Range {
            txn: self,
            scan,
            checked: true,
        }
    }

    /// This transaction's writes inside `range`, in key order, as the values a reader sees.
    fn overlay(&mut self, range: &KeyRange) -> Overlay {
        // Sized first, so that neither buffer grows while it fills.
        let (mut count, mut bytes) = (0, 0);
        for e in &self.writes.entries {
            if range.contains(e.key.as_slice()) {
                count += 1;
                bytes += e.key.len()
                    + match &e.write {
                        Write::Put(v) => v.len(),
                        _ => 0,
                    };
            }
        }
        if count == 0 {
            return Overlay::default();
        }
        let mut found = Overlay {
            bytes: Vec::with_capacity(bytes),
            entries: Vec::with_capacity(count),
        };
        let mut computed = Vec::new();
        for e in &self.writes.entries {
            if !range.contains(e.key.as_slice()) {
                continue;
            }
            // A put or a delete is its own value: only operations need the committed one.
            match &e.write {
                Write::Put(v) => found.push(&e.key, Some(v)),
                Write::Delete => found.push(&e.key, None),
                Write::Ops(_) => computed.push(e.key.to_vec()),
            }
        }
        for key in computed {
            // A commutative operation that cannot apply (say, `add` to a non-integer) makes
            // its key read as absent in a range; the error surfaces at `get` and at commit.
            let value = self.get(&key).unwrap_or(None);
            found.push(&key, value.as_deref());
        }
        found.sort();
        found
    }

    /// Commits. `Ok(Ok(commit_ts))` on success, `Ok(Err(conflict))` when another transaction
    /// won a conflict (nothing was written; retrying may succeed), `Err` when a commutative
    /// operation could not be applied (nothing was written).
    ///
    /// A transaction that only applies commutative operations to split records (see
    /// [`SplitMode`](crate::SplitMode)) takes no timestamp of its own: it is serialized just
    /// after the commit it returns, which snapshots at or above it see.
    pub fn commit(self) -> Result<Result<Ts, Conflict>, CommitError> {
        Ok(self.commit_detailed()?.map(|c| c.ts))
    }

    /// Whether committing may block until a split record is reconciled: the transaction
    /// writes a record split now in a way its slices cannot take (a put, a delete, tracked
    /// operations or ones of another kind), and the commit then waits for the record's lock
    /// (up to two split phases). One load while nothing is split. A caller on an async
    /// runtime commits such a transaction off its workers and every other one inline.
    pub fn may_wait_for_split(&self) -> bool {
        let splitter = &self.db.splitter;
        if splitter.split_count() == 0 {
            return false;
        }
        self.writes.entries.iter().any(|e| {
            let Some(record) = self.db.store.get(&e.key, e.hash) else {
                return false;
            };
            let Some(split) = splitter.split_of(record.get()) else {
                return false;
            };
            match &e.write {
                Write::Ops(ops) if e.tickets.is_empty() => !split.accepts(ops),
                _ => true,
            }
        })
    }

    /// [`Txn::commit`], also telling where the commit sits in the serial order.
    pub fn commit_detailed(mut self) -> Result<Result<Committed, Conflict>, CommitError> {
        match self.commit_work(false) {
            Step::Done(result) => result,
            Step::Publish {
                ts,
                outcome,
                durable_end,
            } => {
                let failed = || self.db.log_failed();
                if let (Some(end), Some(log)) = (durable_end, &self.db.log)
                    && let Err(error) = log.wait_durable(end)
                {
                    // Not published: nobody may read what the disk does not hold.
                    return Err(CommitError::Log(error));
                }
                let published = self.db.oracle.publish(ts, failed);
                self.conclude(ts, outcome, published)
            }
            Step::Durable { end, committed } => {
                if let Some(log) = &self.db.log
                    && let Err(error) = log.wait_durable(end)
                {
                    return Err(CommitError::Log(error));
                }
                Ok(Ok(self.conclude_split_only(committed)))
            }
            Step::Visible { ts, committed } => {
                let db = self.db;
                if !db.oracle.wait_published(ts, || db.log_failed()) {
                    let error = db
                        .log
                        .as_ref()
                        .and_then(|log| log.failed())
                        .expect("gave up only on failure");
                    return Err(CommitError::Log(error));
                }
                Ok(Ok(committed))
            }
            Step::Prepared { .. } => unreachable!("only a prepare stops prepared"),
        }
    }

    /// [`Txn::commit_detailed`] for async code: it never blocks the thread on the disk.
    ///
    /// The commit's own work (locking, validation, logging, installing) runs in this call, as
    /// in `commit_detailed`. What the returned future waits for is what `commit_detailed`
    /// would block on: with `sync` durability, the fsync that makes the commit durable. Here
    /// the log's flusher publishes the commit once it is durable, and wakes the task; a
    /// thread is never parked for it. The future is ready at once when there is nothing to
    /// wait for.
    ///
    /// Dropping the future before it is ready is allowed, but then the drop waits (blocking)
    /// until the commit is published or the log fails, as `commit_detailed` would have: the
    /// timestamp must be published before the transaction's slot is given back.
    ///
    /// ```
    /// let db = keel::Db::in_memory();
    /// let mut txn = db.begin().unwrap();
    /// txn.put(b"k", b"v").unwrap();
    /// // Without `sync` durability there is nothing to wait for: ready at the first poll.
    /// let waker = std::task::Waker::noop();
    /// let mut cx = std::task::Context::from_waker(&waker);
    /// let mut commit = std::pin::pin!(txn.commit_async());
    /// let std::task::Poll::Ready(Ok(Ok(committed))) = commit.as_mut().poll(&mut cx) else {
    ///     panic!("an in-memory commit waits for nothing");
    /// };
    /// assert_eq!(db.snapshot().unwrap().get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
    /// # let _ = committed;
    /// ```
    pub fn commit_async(mut self) -> CommitFuture<'db> {
        let state = match self.commit_work(false) {
            Step::Done(result) => State::Ready(result),
            Step::Publish {
                ts,
                outcome,
                durable_end,
            } => {
                match (durable_end, &self.db.log) {
                    // The frame's fsync is far away: no spinning, the task sleeps until the
                    // flusher's advance wakes it.
                    (Some(end), Some(log)) => log.finish_when_durable(end, ts),
                    _ => {
                        // A predecessor that is only installing is microseconds away: spin a
                        // little before the task goes to sleep.
                        self.db.oracle.finish(ts);
                        let backoff = Backoff::new();
                        for _ in 0..PUBLISH_SPINS {
                            if self.db.oracle.advance() >= ts.0 {
                                break;
                            }
                            backoff.spin();
                        }
                    }
                }
                State::Publish { ts, outcome }
            }
            Step::Durable { end, committed } => State::Durable { end, committed },
            Step::Visible { ts, committed } => State::Visible { ts, committed },
            Step::Prepared { .. } => unreachable!("only a prepare stops prepared"),
        };
        CommitFuture {
            txn: self,
            state: Some(state),
        }
    }

    /// A commit whose timestamp the watermark has passed (`published`), or that gave up
    /// waiting because the log failed: the result, and the statistics.
    fn conclude(
        &mut self,
        ts: Ts,
        outcome: Outcome,
        published: bool,
    ) -> Result<Result<Committed, Conflict>, CommitError> {
        let (versions, announced) = match outcome {
            Outcome::Aborted(conflict) => return Ok(Err(conflict)),
            Outcome::LogFailed(error) => return Err(CommitError::Log(error)),
            Outcome::Committed { .. } if !published => {
                let error = self
                    .db
                    .log
                    .as_ref()
                    .and_then(|log| log.failed())
                    .expect("publication stops only after a log failure");
                return Err(CommitError::Log(error));
            }
            Outcome::Committed {
                versions,
                announced,
            } => (versions, announced),
        };
        let stats = self.db.oracle.stats(self.slot);
        let live = stats.versions.load(std::sync::atomic::Ordering::Relaxed);
        stats
            .versions
            .store(live + versions, std::sync::atomic::Ordering::Relaxed);
        SlotStats::bump(&stats.commits);
        if announced {
            SlotStats::bump(&stats.split_commits);
        }
        if self.db.oracle.collect_due(ts, COLLECT_EVERY) {
            self.db.oracle.collect();
        }
        if std::mem::take(&mut self.collect_due) {
            // Here rather than by waking the collector's thread: no wake-up, and the records
            // just deleted are still in this core's cache.
            self.db.gc_pass_here();
        }
        Ok(Ok(Committed {
            ts,
            split_only: false,
            tracked: self.take_tracked(),
        }))
    }

    /// A split-only commit, durable if it had to be: the statistics, and the result.
    fn conclude_split_only(&mut self, mut committed: Committed) -> Committed {
        let stats = self.db.oracle.stats(self.slot);
        SlotStats::bump(&stats.commits);
        SlotStats::bump(&stats.split_commits);
        committed.tracked = self.take_tracked();
        committed
    }

    /// The committer's own work: everything up to the wait for durability and publication,
    /// which [`Step`] says is left.
    ///
    /// A `prepare` stops after validation with [`Step::Prepared`]: it takes a timestamp and
    /// validates even without writes, and sends nothing to split slices.
    fn commit_work(&mut self, prepare: bool) -> Step {
        let stats = self.db.oracle.stats(self.slot);
        if self.writes.entries.is_empty() && !prepare {
            // A transaction that only reads is serialized at its snapshot, unless the
            // snapshot lies below a timestamp that was pending when it began: a transaction
            // prepared in a two-phase commit holds the watermark below its timestamp until
            // its decision reaches this database, yet another database may have installed
            // it and a client seen it before this transaction began. Then its reads must
            // still be the newest now (none changed, none held by a prepared writer), so
            // that it serializes here, inside its real-time span; otherwise it conflicts
            // (`Prepared` while the writer awaits its decision) and its caller runs it again.
            if self.below_pending
                && let Err(conflict) = self.validate(self.me())
            {
                count_validation_abort(stats, &conflict);
                return Step::Done(Ok(Err(conflict)));
            }
            SlotStats::bump(&stats.read_only_commits);
            let committed = Committed {
                ts: self.read_ts,
                split_only: false,
                tracked: self.take_tracked(),
            };
            // It may have read commits not yet durable: no acknowledgement before they are.
            if self.read_installed && self.db.oracle.visible() < self.read_ts {
                return Step::Visible {
                    ts: self.read_ts,
                    committed,
                };
            }
            return Step::Done(Ok(Ok(committed)));
        }
        if let Some(error) = self.db.log.as_ref().and_then(|log| log.failed()) {
            return Step::Done(Err(CommitError::Log(error)));
        }
        // Writes held back (`Db::hold_writes_for`): as if a prepared transaction held them.
        if let Some(first) = self.writes.entries.first()
            && self.db.writes_held()
        {
            return Step::Done(Ok(Err(Conflict {
                key: first.key.to_vec(),
                reason: ConflictReason::Prepared,
            })));
        }
        // A prepare's locks say so: commits meeting them do not wait for the decision.
        let me = if prepare {
            self.me().prepared()
        } else {
            self.me()
        };
        let mut writes = std::mem::take(&mut self.writes.entries);
        // Lock order: by hash, then key. Any order that every commit agrees on rules out
        // deadlock; this one compares keys only when hashes tie.
        writes.sort_unstable_by(|a, b| a.hash.cmp(&b.hash).then_with(|| a.key.cmp(&b.key)));
        // Locking looks the keys up one after another, each a chain of cache misses (bucket,
        // record, newest version): start them all first, so that they overlap. We hold our
        // registry slot, which keeps whatever the guesses touch from being freed.
        if writes.len() > 1 {
            self.db.store.prefetch_all(writes.iter().map(|e| e.hash));
        }
        // Room for the index entries that score adds move (two each), added after locking.
        let moves = if self.score_adds {
            let pending = |e: &WriteEntry| match &e.write {
                Write::Ops(ops) => ops.first().is_some_and(Op::moves_index),
                _ => false,
            };
            2 * writes.iter().filter(|e| pending(e)).count()
        } else {
            0
        };
        writes.reserve_exact(moves);
        let splitter = &self.db.splitter;

        // 1. Lock the write set. Commutative operations on a record split in the open phase
        //    go to this thread's slice instead and take no lock. If such a record is between
        //    phases, start over once the next phase opens (bounded).
        let mut restarts = 0;
        let (mut locked, slices, mut deltas) = 'lock: loop {
            // Past the restart bound, nothing goes to a slice: the commit locks every record.
            let slices_allowed = restarts < SPLIT_RESTARTS_MAX && !prepare;
            let phase = splitter.open_phase().filter(|_| slices_allowed);
            let mut locked: Vec<RecordRef> = Vec::with_capacity(writes.len() + moves);
            // Which entries go to slices; left empty (no allocation) when no entry could.
            let mut slices: Vec<Option<&'static SplitRecord>> = Vec::new();
            if phase.is_some() && writes.iter().any(|e| matches!(e.write, Write::Ops(_))) {
                slices.reserve_exact(writes.len());
            }
            // Records this commit made, not yet in the ordered index (`link_created`).
            let mut created: smallvec::SmallVec<[RecordRef; 4]> = smallvec::SmallVec::new();
            for entry in &writes {
                // A tracked entry's value must be known at commit: it never goes to a slice,
                // and it is no reason to split its record.
                let untracked = entry.tickets.is_empty();
                if let (Some(p), Write::Ops(ops), true) = (phase, &entry.write, untracked)
                    && let Some(record) = self.db.store.get(&entry.key, entry.hash)
                    && let Some(sr) = splitter.split_of(record.get())
                    && sr.takes(p, ops)
                {
                    locked.push(record);
                    slices.push(Some(sr));
                    continue;
                }
                let reserve = match &entry.write {
                    Write::Put(v) => Some(v.len()),
                    Write::Delete => None,
                    Write::Ops(_) => Some(OPS_FIRST_VALUE_RESERVE),
                };
                let (record, outcome) = loop {
                    let (record, new) = self
                        .db
                        .store
                        .get_or_create_locked_unlinked(&entry.key, entry.hash, me, reserve);
                    let outcome = if new {
                        created.push(record);
                        Locking::Held
                    } else {
                        // A prepare's wait stays short even while the lock changes hands:
                        // its holders may be waiting for it through another node, outside
                        // the one lock order.
                        let wait = if prepare {
                            (self.prepare_lock_wait, self.prepare_lock_wait)
                        } else {
                            (LOCK_WAIT_MAX, LOCK_WAIT_CONTENDED_MAX)
                        };
                        self.lock(record, me, &entry.write, slices_allowed && untracked, wait)
                    };
                    if !matches!(outcome, Locking::Dead) {
                        break (record, outcome);
                    }
                };
                match outcome {
                    Locking::Held => {}
                    Locking::SplitOpening if restarts < SPLIT_RESTARTS_MAX => {
                        self.db.store.link_created(&mut created);
                        self.unlock_all(&locked, &slices, me);
                        restarts += 1;
                        continue 'lock;
                    }
                    Locking::Busy
                    | Locking::AwaitsDecision
                    | Locking::SplitOpening
                    | Locking::Split
                    | Locking::Dead => {
                        self.db.store.link_created(&mut created);
                        self.unlock_all(&locked, &slices, me);
                        SlotStats::bump(&stats.aborts_write_locked);
                        let reason = match outcome {
                            Locking::AwaitsDecision => ConflictReason::Prepared,
                            Locking::Split => ConflictReason::Split,
                            _ => ConflictReason::WriteLocked,
                        };
                        return Step::Done(Ok(Err(Conflict {
                            key: entry.key.to_vec(),
                            reason,
                        })));
                    }
                }
                if let (Write::Ops(ops), true) = (&entry.write, untracked) {
                    splitter.note(record, ops, false);
                }
                locked.push(record);
                if slices.capacity() > 0 {
                    slices.push(None);
                }
            }
            self.db.store.link_created(&mut created);
            // 1b. Join the split phase: announce it, check it is still open, and reserve room in
            //     the slices. If anything does not fit, leave the phase and start over (past
            //     the restart bound, with every record locked).
            let mut deltas: Vec<Option<Delta>> = Vec::new();
            if let Some(p) = phase.filter(|_| slices.iter().any(Option::is_some)) {
                self.db.oracle.announce(self.slot, p);
                let mut fits = splitter.still_open(p);
                if fits
                    && self.reads.is_empty()
                    && self.ranges.is_empty()
                    && slices.iter().all(Option::is_some)
                    && let Some(done) = self.commit_split_only(&writes, &slices)
                {
                    return done;
                }
                deltas = vec![None; writes.len()];
                for (i, entry) in writes.iter().enumerate() {
                    let (Some(sr), Write::Ops(ops), true) = (slices[i], &entry.write, fits) else {
                        continue;
                    };
                    deltas[i] =
                        Delta::fold(&entry.key, ops).filter(|d| sr.slice().reserve(sr.budget(), d));
                    fits = deltas[i].is_some();
                    if !fits && restarts < SPLIT_RESTARTS_MAX {
                        // The slice's budget is spent: start over after the reconciliation.
                        self.db.oracle.announce(self.slot, 0);
                        self.unlock_all(&locked, &slices, me);
                        splitter.stash(sr);
                        drop(splitter.wait_joined());
                        restarts += 1;
                        continue 'lock;
                    }
                }
                if !fits {
                    // The phase closed under us, or restarts ran out: start over. Locking the
                    // records meant for slices here would take locks out of order (and
                    // deadlock against a committer holding them and waiting for ours).
                    self.db.oracle.announce(self.slot, 0);
                    self.unlock_all(&locked, &slices, me);
                    restarts += 1;
                    continue 'lock;
                }
            }
            break (locked, slices, deltas);
        };

        for (i, record) in locked.iter().enumerate() {
            if !slices.get(i).is_some_and(Option::is_some) {
                record.get().prefetch_below_head();
            }
        }
        let announced = slices.iter().any(Option::is_some);
        let leave = |txn: &Txn<'_>| {
            if announced {
                txn.db.oracle.announce(txn.slot, 0);
            }
        };

        // 2. Resolve commutative operations against the newest committed values.
        let mut values: Vec<Option<Vec<u8>>> = Vec::with_capacity(writes.len() + moves);
        // Index entries that score adds move: (key, whether it is written; else deleted).
        let mut moved: smallvec::SmallVec<[(WriteKey, bool); 2]> = smallvec::SmallVec::new();
        for (i, (entry, record)) in writes.iter_mut().zip(&locked).enumerate() {
            let value = match &mut entry.write {
                _ if slices.get(i).is_some_and(Option::is_some) => None,
                Write::Put(v) => Some(std::mem::take(v)),
                Write::Delete => None,
                Write::Ops(ops) => {
                    // The first operation reads the committed value in place.
                    let committed = record.get().head().and_then(|v| v.value());
                    let mut value: Option<Vec<u8>> = None;
                    for (n, op) in ops.iter().enumerate() {
                        let current = if n == 0 { committed } else { value.as_deref() };
                        match op.apply(&entry.key, current) {
                            Ok(v) => value = Some(v),
                            Err(e) => {
                                // Entries are in lock order; the error reported is the one
                                // of the smallest key, as in a run in key order.
                                let e = first_apply_error(&writes, &locked, &slices).unwrap_or(e);
                                leave(self);
                                self.unlock_all(&locked, &slices, me);
                                return Step::Done(Err(CommitError::Apply(e)));
                            }
                        }
                        for (ticket, _) in entry.tickets.iter().filter(|&(_, k)| k == n + 1) {
                            self.tracked[ticket as usize] = Tracked::Known(value.clone());
                        }
                    }
                    if ops.is_empty() {
                        value = committed.map(<[u8]>::to_vec);
                    }
                    if let (Some(op), Some(new)) = (ops.first(), value.as_deref())
                        && op.moves_index()
                        && committed != Some(new)
                    {
                        if let Some(old) = committed.and_then(|old| op.index_key(old)) {
                            moved.push((old, false));
                        }
                        moved.extend(op.index_key(new).map(|k| (k, true)));
                    }
                    value
                }
            };
            values.push(value);
        }

        // 2a. Lock the index entries that score adds move, and write them with the rest. They
        //     come after the write set in no agreed order, so a wait for one is bounded and
        //     ends the commit as a conflict, never a deadlock.
        if !moved.is_empty() {
            let wait = if prepare {
                (self.prepare_lock_wait, self.prepare_lock_wait)
            } else {
                (LOCK_WAIT_MAX, LOCK_WAIT_CONTENDED_MAX)
            };
            let mut created: smallvec::SmallVec<[RecordRef; 4]> = smallvec::SmallVec::new();
            for (key, put) in moved {
                // A transaction's own writes of these keys resolve its score adds early
                // (`Txn::write`, `Txn::score_add`): a lock it holds would be waited for.
                debug_assert!(!writes.iter().any(|e| e.key == key));
                let h = hash(&key);
                let write = if put {
                    Write::Put(Vec::new())
                } else {
                    Write::Delete
                };
                let reserve = matches!(write, Write::Put(_)).then_some(0);
                let (record, outcome) = loop {
                    let (record, new) = self
                        .db
                        .store
                        .get_or_create_locked_unlinked(&key, h, me, reserve);
                    let outcome = if new {
                        created.push(record);
                        Locking::Held
                    } else {
                        self.lock(record, me, &write, false, wait)
                    };
                    if !matches!(outcome, Locking::Dead) {
                        break (record, outcome);
                    }
                };
                if outcome != Locking::Held {
                    self.db.store.link_created(&mut created);
                    leave(self);
                    self.unlock_all(&locked, &slices, me);
                    SlotStats::bump(&stats.aborts_write_locked);
                    let reason = match outcome {
                        Locking::AwaitsDecision => ConflictReason::Prepared,
                        _ => ConflictReason::WriteLocked,
                    };
                    return Step::Done(Ok(Err(Conflict {
                        key: key.to_vec(),
                        reason,
                    })));
                }
                locked.push(record);
                values.push(put.then(Vec::new));
                writes.push(WriteEntry {
                    key,
                    hash: h,
                    write,
                    tickets: Tickets::default(),
                });
            }
            self.db.store.link_created(&mut created);
        }

        // 2b. A prepare also holds what it read, shared, until its decision (see
        //     `txn/prepared.rs`): locks come before validation, so nothing changes a read
        //     between its validation and the decision.
        let shared = if prepare {
            match self.lock_reads(me) {
                Ok(shared) => shared,
                Err(conflict) => {
                    self.unlock_all(&locked, &slices, me);
                    SlotStats::bump(&stats.aborts_read_changed);
                    return Step::Done(Ok(Err(conflict)));
                }
            }
        } else {
            Vec::new()
        };

        // 3. Take the commit timestamp; from here on it must be published. A prepare's
        //    stays unpublished until its decision: readers that begin below it from now on
        //    validate (`below_pending`).
        if prepare {
            self.db
                .two_phase
                .store(true, std::sync::atomic::Ordering::SeqCst);
        }
        let commit_ts = self.db.next_commit_ts();

        // 4. Validate.
        if let Err(mut conflict) = self.validate(me) {
            if self.stashed.load(std::sync::atomic::Ordering::Relaxed) {
                conflict.reason = ConflictReason::Split;
            }
            leave(self);
            self.unlock_all(&locked, &slices, me);
            unlock_shared(self.db, &shared);
            count_validation_abort(stats, &conflict);
            return Step::Publish {
                ts: commit_ts,
                outcome: Outcome::Aborted(conflict),
                durable_end: None,
            };
        }

        if prepare {
            return Step::Prepared {
                ts: commit_ts,
                writes,
                locked,
                values,
                shared,
            };
        }

        // 5. Log the commit (only validated commits reach the log), install, unlock, wait
        //    for durability if asked, and publish in timestamp order.
        let mut log_end = None;
        if let Some(log) = &self.db.log {
            let entries = writes.iter().zip(&values).enumerate().map(|(i, (e, v))| {
                let logged = match (deltas.get(i).and_then(Option::as_ref), v) {
                    (Some(d), _) => Logged::Delta(d),
                    (None, Some(v)) => Logged::Put(v),
                    (None, None) => Logged::Delete,
                };
                (e.key.as_slice(), logged)
            });
            match log.append(commit_ts, writes.len(), entries) {
                Ok(end) => log_end = Some((log, end)),
                Err(error) => {
                    leave(self);
                    self.unlock_all(&locked, &slices, me);
                    return Step::Publish {
                        ts: commit_ts,
                        outcome: Outcome::LogFailed(error),
                        durable_end: None,
                    };
                }
            }
        }
        let horizon = self.db.oracle.horizon();
        let mut versions = 0;
        for (i, (record, value)) in locked.iter().zip(&values).enumerate() {
            if let Some(sr) = slices.get(i).copied().flatten() {
                let delta = deltas[i].take().expect("reserved for a split entry");
                sr.slice().append(commit_ts, delta, 0);
                continue;
            }
            versions += record
                .get()
                .install(me, commit_ts, value.as_deref(), horizon);
            if value.is_none() && self.db.store.note_dead(*record, commit_ts) {
                self.collect_due = true;
            }
            record.get().unlock(me);
        }
        // Every record is in place: writers that read the installed watermark may see it,
        // before it is durable ([`Db::begin_installed`]).
        self.db.oracle.mark_installed(commit_ts);
        leave(self);
        let durable_end = log_end.and_then(|(log, end)| {
            let wait = self.durability.unwrap_or(log.mode()) == Durability::Sync;
            wait.then_some(end)
        });
        Step::Publish {
            ts: commit_ts,
            outcome: Outcome::Committed {
                versions,
                announced,
            },
            durable_end,
        }
    }

    /// The tickets' values, once every one is known.
    fn take_tracked(&mut self) -> Vec<Option<Vec<u8>>> {
        std::mem::take(&mut self.tracked)
            .into_iter()
            .map(|t| match t {
                Tracked::Known(v) => v,
                Tracked::Pending => unreachable!("a committed ticket is resolved"),
            })
            .collect()
    }

    /// Commits a transaction whose every write is a delta for a slice of a split record in
    /// the phase this transaction announced. No timestamp, no record lock: the tag is the
    /// watermark, read under the slice locks (see `split` for why that is serializable). The
    /// room for each delta is reserved under the same locks; `None` (nothing written) if one
    /// does not fit, or if a record does not take the watermark as a tag (a reader folded its
    /// slices there or above, or its phase opened on a version above it), and the caller
    /// takes the general path.
    fn commit_split_only(
        &mut self,
        writes: &[WriteEntry],
        slices: &[Option<&'static SplitRecord>],
    ) -> Option<Step> {
        let mut guards = Vec::with_capacity(writes.len());
        for sr in slices {
            let Some(sr) = sr else {
                unreachable!("every entry of a split-only commit is a delta for a slice")
            };
            guards.push(sr.slice());
        }
        let tag = self.db.oracle.visible();
        if !slices.iter().flatten().all(|sr| sr.takes_tag(tag)) {
            return None;
        }
        let mut deltas = Vec::with_capacity(writes.len());
        for ((entry, sr), guard) in writes.iter().zip(slices.iter().flatten()).zip(&mut guards) {
            let Write::Ops(ops) = &entry.write else {
                unreachable!("every entry of a split-only commit is a delta for a slice")
            };
            deltas.push(Delta::fold(&entry.key, ops).filter(|d| guard.reserve(sr.budget(), d))?);
        }
        let mut durable_lsn = 0;
        if let Some(log) = &self.db.log {
            let entries = writes
                .iter()
                .zip(&deltas)
                .map(|(e, d)| (e.key.as_slice(), Logged::Delta(d)));
            match log.append(tag, writes.len(), entries) {
                Ok(end) if matches!(self.durability.unwrap_or(log.mode()), Durability::Sync) => {
                    durable_lsn = end;
                }
                Ok(_) => {}
                Err(error) => {
                    drop(guards);
                    self.db.oracle.announce(self.slot, 0);
                    return Some(Step::Done(Err(CommitError::Log(error))));
                }
            }
        }
        for (guard, delta) in guards.iter_mut().zip(deltas) {
            guard.append(tag, delta, durable_lsn);
        }
        drop(guards);
        self.db.oracle.announce(self.slot, 0);
        let committed = Committed {
            ts: tag,
            split_only: true,
            tracked: Vec::new(),
        };
        if durable_lsn > 0 {
            return Some(Step::Durable {
                end: durable_lsn,
                committed,
            });
        }
        Some(Step::Done(Ok(Ok(self.conclude_split_only(committed)))))
    }

    /// Locks a record for writing `write`, waiting if another committer holds it: up to
    /// `wait` while one holder keeps it, up to `patience` in all while it changes hands. A
    /// commit (not a prepare) does not wait for a prepared transaction, which holds the lock
    /// until a decision that may be far away: it stops at once
    /// ([`Locking::AwaitsDecision`]), and its caller waits as it sees fit
    /// ([`Db::wait_decided`](crate::Db::wait_decided)). If the splitter holds it: commutative operations it takes wait for
    /// its next phase to open ([`Locking::SplitOpening`]: the commit starts over and goes to
    /// a slice, if `slices` allows); anything else is stashed until the reconciliation. A
    /// wait by commutative operations that could go to a slice counts toward splitting the
    /// record.
    fn lock(
        &self,
        record: RecordRef,
        me: LockOwner,
        write: &Write,
        slices: bool,
        (wait, patience): (std::time::Duration, std::time::Duration),
    ) -> Locking {
        let r = record.get();
        if r.try_lock(me) {
            return Locking::Held;
        }
        if r.is_dead() {
            return Locking::Dead;
        }
        let for_decision = || !me.is_prepared() && r.awaits_decision();
        if for_decision() {
            return Locking::AwaitsDecision;
        }
        let splitter = &self.db.splitter;
        if me.is_prepared() && self.stash_split(r) {
            return Locking::Split;
        }
        let sliceable = |sr: &SplitRecord| match write {
            Write::Ops(ops) => slices && sr.accepts(ops),
            _ => false,
        };
        if r.is_split_locked()
            && let Some(sr) = splitter.split_of(r)
            && sliceable(sr)
        {
            let deadline = std::time::Instant::now() + 2 * splitter.settings.phase;
            while r.is_split_locked() && std::time::Instant::now() < deadline {
                if splitter.open_phase().is_some_and(|p| sr.in_phase(p)) {
                    return Locking::SplitOpening;
                }
                std::thread::yield_now();
            }
        } else if let (Write::Ops(ops), true) = (write, slices) {
            splitter.note(record, ops, true);
        }
        let backoff = Backoff::new();
        while !backoff.is_completed() {
            if r.try_lock(me) {
                return Locking::Held;
            }
            if for_decision() {
                return Locking::AwaitsDecision;
            }
            backoff.snooze();
        }
        let mut waiting = LockWait::new(std::time::Instant::now(), wait, patience, r);
        loop {
            if r.try_lock(me) {
                return Locking::Held;
            }
            if r.is_dead() {
                return Locking::Dead;
            }
            if for_decision() {
                return Locking::AwaitsDecision;
            }
            if waiting.gives_up(std::time::Instant::now(), r) {
                return Locking::Busy;
            }
            if r.is_split_locked()
                && let Some(sr) = splitter.split_of(r)
            {
                if sliceable(sr) && splitter.open_phase().is_some_and(|p| sr.in_phase(p)) {
                    return Locking::SplitOpening;
                }
                // Stashed: this write cannot go to a slice; wait for the reconciliation.
                self.stashed
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                splitter.stash(sr);
                let joined = splitter.wait_joined();
                let locked = r.try_lock(me);
                drop(joined);
                if locked {
                    return Locking::Held;
                }
            }
            std::thread::yield_now();
        }
    }

    /// Whether `r` is split now; if so, asks for its reconciliation (the joined phase), so
    /// that the caller's retry, holding [`Db::wait_joined`](crate::Db::wait_joined)'s guard,
    /// finds it joined. A prepare gives up on such a record at once: it cannot write to a
    /// slice (its writes must stay invisible until the decision), nor hold the record while
    /// the splitter does.
    fn stash_split(&self, r: &crate::mvcc::Record) -> bool {
        let Some(sr) = r
            .is_split_locked()
            .then(|| self.db.splitter.split_of(r))
            .flatten()
        else {
            return false;
        };
        self.stashed
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.db.splitter.stash(sr);
        true
    }

    /// Takes a shared hold on the record of every key read and not written (an empty,
    /// held record for a key read absent), waiting briefly for an exclusive holder; on a
    /// timeout gives every hold back and reports the key.
    fn lock_reads(&self, me: LockOwner) -> Result<Vec<RecordRef>, Conflict> {
        let mut shared = Vec::with_capacity(self.reads.len());
        for read in &self.reads {
            let (key, hash) = match read {
                Read::Record(record) => {
                    let key = record.get().key();
                    (key, hash(key))
                }
                Read::Absent { key, hash } | Read::Presence { key, hash, .. } => {
                    (key.as_slice(), *hash)
                }
            };
            let held = loop {
                let (record, created) = self.db.store.get_or_create_locked(key, hash, me, None);
                let r = record.get();
                if created {
                    r.downgrade(me);
                    break Some(record);
                }
                if r.is_locked_by(me) {
                    // Written too: held exclusively already.
                    break None;
                }
                if self.stash_split(r) {
                    unlock_shared(self.db, &shared);
                    return Err(Conflict {
                        key: key.to_vec(),
                        reason: ConflictReason::Split,
                    });
                }
                match Self::lock_shared(r, self.prepare_lock_wait) {
                    Locking::Held => break Some(record),
                    Locking::Dead => continue,
                    _ => {
                        unlock_shared(self.db, &shared);
                        return Err(Conflict {
                            key: key.to_vec(),
                            reason: ConflictReason::ReadChanged,
                        });
                    }
                }
            };
            shared.extend(held);
        }
        Ok(shared)
    }

    /// A shared hold on `r`, waiting at most `wait` (after a brief spin) for its exclusive
    /// holder: a prepare that waits holds its other locks meanwhile.
    fn lock_shared(r: &crate::mvcc::Record, wait: std::time::Duration) -> Locking {
        let deadline = std::time::Instant::now() + wait;
        let backoff = Backoff::new();
        loop {
            if r.try_lock_shared() {
                return Locking::Held;
            }
            if r.is_dead() {
                return Locking::Dead;
            }
            if backoff.is_completed() && std::time::Instant::now() >= deadline {
                return Locking::Busy;
            }
            backoff.snooze();
        }
    }

    /// Unlocks the write set of a commit that stops short. A record it created and leaves
    /// empty goes to the collector.
    fn unlock_all(&self, locked: &[RecordRef], slices: &[Option<&SplitRecord>], me: LockOwner) {
        for (i, record) in locked.iter().enumerate() {
            if slices.get(i).is_none_or(Option::is_none) {
                // Noted while held, so that the collector cannot have taken it before the
                // note (`gc::pass`).
                if record.get().head().is_none() {
                    self.db.store.note_dead(*record, Ts(0));
                }
                record.get().unlock(me);
            }
        }
    }

    fn validate(&self, me: LockOwner) -> Result<(), Conflict> {
        let conflict = |record: &crate::mvcc::Record, s: Staleness, reason: ConflictReason| {
            let reason = if s == Staleness::Split {
                if let Some(sr) = self.db.splitter.split_of(record) {
                    self.db.splitter.stash(sr);
                }
                ConflictReason::Split
            } else if s == Staleness::Locked && record.awaits_decision() {
                ConflictReason::Prepared
            } else {
                reason
            };
            Conflict {
                key: record.key().to_vec(),
                reason,
            }
        };
        for read in &self.reads {
            let record = match read {
                Read::Record(record) => Some(*record),
                Read::Absent { key, hash } => self.db.store.get(key, *hash),
                Read::Presence { key, hash, present } => match self.db.store.get(key, *hash) {
                    // Written by this transaction and locked for it since before the commit
                    // timestamp was taken: nobody else commits to the key before this commit
                    // installs, so the newest version is the state this commit follows. Its
                    // value may have changed since the snapshot; only its presence must not.
                    Some(record) if record.get().is_locked_by(me) => {
                        let r = record.get();
                        if r.head().is_some_and(|v| v.value().is_some()) != *present {
                            return Err(conflict(
                                r,
                                Staleness::Changed,
                                ConflictReason::ReadChanged,
                            ));
                        }
                        continue;
                    }
                    // Not locked for this transaction: not written after all, or written to
                    // a split record's slice. Validated as a read of the key's value, which
                    // a split record fails (and is stashed for) as any read of it does.
                    other => other,
                },
            };
            if let Some(record) = record {
                let (r, s) = self.staleness_of_key(record, me);
                if s != Staleness::Fresh {
                    return Err(conflict(r, s, ConflictReason::ReadChanged));
                }
            }
        }
        for range in &self.ranges {
            for record in self.db.store.ordered().range_within(range) {
                let r = record.get();
                // A dead record holds only a tombstone at or below the horizon, so it did
                // not change; a new record for its key is in the range if it was made
                // before our timestamp (it enters the tree only after the dead one left).
                let s = match r.staleness(self.read_ts, me) {
                    Staleness::Dead => Staleness::Fresh,
                    s => s,
                };
                if s != Staleness::Fresh {
                    return Err(conflict(r, s, ConflictReason::Phantom));
                }
            }
        }
        Ok(())
    }

    /// The staleness of the key `record` holds. A record the collector took is unchanged
    /// (it holds only a tombstone the horizon has passed, or nothing), but a commit after
    /// our snapshot may have written the key into a new record: the one the index holds
    /// now decides, if it is another.
    fn staleness_of_key<'r>(
        &self,
        mut record: RecordRef,
        me: LockOwner,
    ) -> (&'r crate::mvcc::Record, Staleness) {
        loop {
            let r: &'r crate::mvcc::Record = record.get();
            let s = r.staleness(self.read_ts, me);
            if s != Staleness::Dead {
                return (r, s);
            }
            match self.db.store.get(r.key(), hash(r.key())) {
                Some(now) if now != record => record = now,
                _ => return (r, Staleness::Fresh),
            }
        }
    }
}

impl Drop for Txn<'_> {
    fn drop(&mut self) {
        if !self.slot_handed_on {
            self.db.oracle.unregister(self.slot);
        }
    }
}

/// Counts, in `stats`, an abort by a failed validation ([`Txn::validate`]) by its reason.
fn count_validation_abort(stats: &SlotStats, conflict: &Conflict) {
    SlotStats::bump(match conflict.reason {
        ConflictReason::Phantom => &stats.aborts_phantom,
        ConflictReason::ReadChanged | ConflictReason::Split => &stats.aborts_read_changed,
        _ => &stats.aborts_write_locked,
    });
}

/// Whether a snapshot at `read_ts`, just registered, lies below a pending timestamp of a
/// database that prepares ([`Snapshot::below_pending`]).
fn below_pending(db: &Shared, read_ts: Ts) -> bool {
    db.two_phase.load(std::sync::atomic::Ordering::SeqCst) && db.oracle.last_commit_ts() > read_ts
}

/// [`Txn::sample_key`] and [`Snapshot::sample_key`]: the caller is registered, so the record
/// drawn stays readable while its key is copied.
fn sample_key(
    db: &Shared,
    lo: Bound<&[u8]>,
    hi: Bound<&[u8]>,
    draw: impl FnMut(usize) -> usize,
) -> Option<Vec<u8>> {
    db.store
        .ordered()
        .sample(lo, hi, draw)
        .map(|record| record.get().key().to_vec())
}

/// Passes `record`'s value at `read_ts` and the timestamp it was written at to `f`. A split
/// record's value also holds the slice entries tagged at or below `read_ts` (see `split`).
#[inline]
pub(crate) fn read_at<T>(
    db: &Shared,
    record: Option<RecordRef>,
    read_ts: Ts,
    f: impl FnOnce(Option<&[u8]>, Option<Ts>) -> T,
) -> Result<T, Error> {
    let Some(record) = record else {
        return Ok(f(None, None));
    };
    let r = record.get();
    let Some(sr) = db.splitter.split_of(r) else {
        let version = r.visible(read_ts);
        return Ok(f(version.and_then(|v| v.value()), version.map(|v| v.ts())));
    };
    // Appends from now on get tags above `read_ts` (the fold raises the record's tag
    // floor), so this snapshot's view of the record never changes.
    let mut folded = sr.fold_at(r.key(), read_ts, u64::MAX);
    if folded.durable_lsn > 0
        && let Some(log) = &db.log
        && log.wait_durable(folded.durable_lsn).is_err()
    {
        // The log failed: what did not reach the disk was never acknowledged.
        folded = sr.fold_at(r.key(), read_ts, log.durable_lsn());
    }
    let base = r.visible(read_ts);
    let base_value = base.and_then(|v| v.value());
    let base_ts = base.map(|v| v.ts());
    match folded.delta {
        None => Ok(f(base_value, base_ts)),
        Some(delta) => {
            let value = delta.apply(r.key(), base_value)?;
            let ts = base_ts.map_or(folded.max_tag, |b| b.max(folded.max_tag));
            Ok(f(Some(&value), Some(ts)))
        }
    }
}

/// A read-only snapshot: serializable, never blocks writers, never aborts.
///
/// ```
/// let db = keel::Db::in_memory();
/// db.transact(|txn| txn.put(b"k", b"before"))?;
/// let snapshot = db.snapshot()?;
/// db.transact(|txn| txn.put(b"k", b"after"))?;
/// assert_eq!(snapshot.get(b"k")?, Some(b"before".to_vec()));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Snapshot<'db> {
    db: &'db Shared,
    slot: SlotId,
    read_ts: Ts,
}

impl<'db> Snapshot<'db> {
    pub(crate) fn begin(db: &'db Shared) -> Result<Snapshot<'db>, BeginError> {
        let (slot, read_ts) = db.oracle.register().ok_or(BeginError::TooManyOpen)?;
        Ok(Snapshot { db, slot, read_ts })
    }

    /// Whether this snapshot lies below a timestamp that was pending (handed out, not
    /// published) when it began, in a database that prepares transactions for two-phase
    /// commits: such a timestamp may be a prepared transaction's that another database has
    /// committed and a client has seen already, whose writes this snapshot misses. A caller
    /// that must be strictly serializable across databases (a cluster node) reads in a
    /// transaction instead, whose read-only commit is then validated ([`Txn::commit`]).
    pub fn below_pending(&self) -> bool {
        below_pending(self.db, self.read_ts)
    }

    /// Whether a prepared transaction holds `key` until its decision.
    pub(crate) fn awaits_decision(&self, key: &[u8]) -> bool {
        // Our registry slot keeps the record from being freed while we look at it.
        self.db
            .store
            .get(key, hash(key))
            .is_some_and(|record| record.get().awaits_decision())
    }

    /// The timestamp this snapshot reads at.
    pub fn read_ts(&self) -> Ts {
        self.read_ts
    }

    /// Reads `key`.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        self.get_with(key, |v| v.map(<[u8]>::to_vec))
    }

    /// Hints that every one of `keys` is about to be read: [`Db::prefetch_all`](crate::Db::prefetch_all)
    /// inside the snapshot, which is already registered for it.
    pub fn prefetch_all<'k>(&self, keys: impl IntoIterator<Item = &'k [u8]>) {
        self.db.store.prefetch_all(keys.into_iter().map(hash));
    }

    /// Reads `key` without copying: `f` sees the value in place.
    pub fn get_with<T>(&self, key: &[u8], f: impl FnOnce(Option<&[u8]>) -> T) -> Result<T, Error> {
        check_key(key)?;
        let record = self.db.store.get(key, hash(key));
        read_at(self.db, record, self.read_ts, |v, _| f(v))
    }

    /// Key-ordered iterator over `bounds`; reverse it with `.rev()`.
    pub fn range<'k, K>(&self, bounds: impl RangeBounds<K>) -> Scan<'_>
    where
        K: AsRef<[u8]> + ?Sized + 'k,
    {
        Scan::new(
            self.db,
            owned_range(&bounds),
            self.read_ts,
            Overlay::default(),
        )
    }

    /// [`Snapshot::range`] over bounds the caller already owns: nothing is copied.
    /// [`Txn::sample_key`] for a snapshot.
    pub fn sample_key(
        &self,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
        draw: impl FnMut(usize) -> usize,
    ) -> Option<Vec<u8>> {
        sample_key(self.db, lo, hi, draw)
    }

    pub fn range_owned(&self, lo: Bound<Vec<u8>>, hi: Bound<Vec<u8>>) -> Scan<'_> {
        Scan::new(
            self.db,
            KeyRange { lo, hi },
            self.read_ts,
            Overlay::default(),
        )
    }
}

impl Drop for Snapshot<'_> {
    fn drop(&mut self) {
        SlotStats::bump(&self.db.oracle.stats(self.slot).read_only_commits);
        self.db.oracle.unregister(self.slot);
    }
}

fn owned_range<K: AsRef<[u8]> + ?Sized>(bounds: &impl RangeBounds<K>) -> KeyRange {
    let own = |b: Bound<&K>| b.map(|k| k.as_ref().to_vec());
    KeyRange {
        lo: own(bounds.start_bound()),
        hi: own(bounds.end_bound()),
    }
}

/// Key-ordered iterator over a snapshot (plus a transaction's own writes), from either end.
pub struct Scan<'db> {
    db: &'db Shared,
    records: <crate::store::MemStore as Store>::Scan<'db>,
    read_ts: Ts,
    overlay: Overlay,
    /// Overlay entries not yet yielded: `overlay_lo..overlay_hi`.
    overlay_lo: usize,
    overlay_hi: usize,
    /// Record peeked from each end, not yet merged.
    front: Option<RecordRef>,
    back: Option<RecordRef>,
    /// The last key yielded from each end; the other end stops there.
    front_last: Option<Vec<u8>>,
    back_last: Option<Vec<u8>>,
    front_done: bool,
    back_done: bool,
}

impl<'db> Scan<'db> {
    fn new(db: &'db Shared, range: KeyRange, read_ts: Ts, overlay: Overlay) -> Scan<'db> {
        let overlay_hi = overlay.len();
        let empty = range.is_empty();
        Scan {
            db,
            records: db.store.scan(range),
            read_ts,
            overlay,
            overlay_lo: 0,
            overlay_hi,
            front: None,
            back: None,
            front_last: None,
            back_last: None,
            front_done: empty,
            back_done: empty,
        }
    }

    /// Next candidate from the front (a deleted or absent one included).
    fn step_front(&mut self) -> Option<Candidate> {
        if self.front.is_none() {
            // Once the records run out from this end, the other end's peeked record is the
            // last one left.
            self.front = self.records.next().or_else(|| self.back.take());
        }
        let record_key = self.front.map(|r| r.get().key());
        let overlay =
            (self.overlay_lo < self.overlay_hi).then(|| self.overlay.key(self.overlay_lo));
        let take_overlay = match (record_key, overlay) {
            (None, None) => return None,
            (Some(_), None) => false,
            (None, Some(_)) => true,
            (Some(r), Some(o)) => o <= r,
        };
        if take_overlay {
            let i = self.overlay_lo;
            self.overlay_lo += 1;
            if self
                .front
                .is_some_and(|r| r.get().key() == self.overlay.key(i))
            {
                self.front = None;
            }
            Some(Candidate::Overlay(i))
        } else {
            Some(Candidate::Record(self.front.take().expect("checked above")))
        }
    }

    fn step_back(&mut self) -> Option<Candidate> {
        if self.back.is_none() {
            self.back = self.records.next_back().or_else(|| self.front.take());
        }
        let record_key = self.back.map(|r| r.get().key());
        let overlay =
            (self.overlay_lo < self.overlay_hi).then(|| self.overlay.key(self.overlay_hi - 1));
        let take_overlay = match (record_key, overlay) {
            (None, None) => return None,
            (Some(_), None) => false,
            (None, Some(_)) => true,
            (Some(r), Some(o)) => o >= r,
        };
        if take_overlay {
            self.overlay_hi -= 1;
            let i = self.overlay_hi;
            if self
                .back
                .is_some_and(|r| r.get().key() == self.overlay.key(i))
            {
                self.back = None;
            }
            Some(Candidate::Overlay(i))
        } else {
            Some(Candidate::Record(self.back.take().expect("checked above")))
        }
    }

    /// The next pair from the front (`rev`: from the back), passed to `f` in place: nothing
    /// is copied, and keys deleted or absent at the snapshot are passed over without
    /// allocating. `None` once the ends meet or the range is done.
    pub fn next_with<T>(&mut self, rev: bool, f: impl FnOnce(&[u8], &[u8]) -> T) -> Option<T> {
        self.next_found(rev, f).map(|(t, _)| t)
    }

    /// [`Scan::next_with`], and the committed record the pair came from (`None` for one of
    /// the transaction's own writes).
    fn next_found<T>(
        &mut self,
        rev: bool,
        f: impl FnOnce(&[u8], &[u8]) -> T,
    ) -> Option<(T, Option<RecordRef>)> {
        let mut f = Some(f);
        loop {
            let done = if rev { self.back_done } else { self.front_done };
            if done {
                return None;
            }
            let step = if rev {
                self.step_back()
            } else {
                self.step_front()
            };
            let Some(candidate) = step else {
                break;
            };
            let db = self.db;
            let read_ts = self.read_ts;
            let found = match candidate {
                Candidate::Record(record) => Some(record),
                Candidate::Overlay(_) => None,
            };
            let (key, result) = match candidate {
                Candidate::Overlay(i) => {
                    let key = self.overlay.key(i);
                    if crossed(&self.front_last, &self.back_last, rev, key) {
                        break;
                    }
                    let result = self
                        .overlay
                        .value(i)
                        .map(|v| f.take().expect("called once")(key, v));
                    (key, result)
                }
                Candidate::Record(record) => {
                    let key = record.get().key();
                    if crossed(&self.front_last, &self.back_last, rev, key) {
                        break;
                    }
                    // A split record's delta that cannot apply (impossible by construction:
                    // the phase's base accepts its kind) reads as absent rather than failing
                    // the scan.
                    let result = read_at(db, Some(record), read_ts, |v, _| {
                        v.map(|v| f.take().expect("called once")(key, v))
                    })
                    .unwrap_or(None);
                    (key, result)
                }
            };
            if let Some(result) = result {
                let last = if rev {
                    &mut self.back_last
                } else {
                    &mut self.front_last
                };
                let last = last.get_or_insert_with(Vec::new);
                last.clear();
                last.extend_from_slice(key);
                return Some((result, found));
            }
        }
        if rev {
            self.back_done = true;
        } else {
            self.front_done = true;
        }
        None
    }
}

/// A transaction's own writes inside a scan's range, in key order, as the values a reader
/// sees (`None`: deleted). Their bytes share one buffer: a scan over a range that the
/// earlier commands of a pipeline wrote (each pop of a set deletes a member its next pop's
/// scan passes) costs two allocations, not one or two per write.
#[derive(Default)]
struct Overlay {
    bytes: Vec<u8>,
    /// Per write: where its key starts in `bytes`, the key's length, and the length of the
    /// value that follows it (`None`: deleted).
    entries: Vec<(usize, usize, Option<usize>)>,
}

impl Overlay {
    fn push(&mut self, key: &[u8], value: Option<&[u8]>) {
        self.entries
            .push((self.bytes.len(), key.len(), value.map(<[u8]>::len)));
        self.bytes.extend_from_slice(key);
        self.bytes.extend_from_slice(value.unwrap_or_default());
    }

    /// Puts the entries in key order; pops from one end of a range wrote them in it already.
    fn sort(&mut self) {
        let bytes = &self.bytes;
        let key = |e: &(usize, usize, Option<usize>)| &bytes[e.0..e.0 + e.1];
        if !self.entries.is_sorted_by(|a, b| key(a) <= key(b)) {
            self.entries.sort_unstable_by(|a, b| key(a).cmp(key(b)));
        }
    }

    fn len(&self) -> usize {
        self.entries.len()
    }

    fn key(&self, i: usize) -> &[u8] {
        let (at, len, _) = self.entries[i];
        &self.bytes[at..at + len]
    }

    fn value(&self, i: usize) -> Option<&[u8]> {
        let (at, key_len, len) = self.entries[i];
        len.map(|len| &self.bytes[at + key_len..at + key_len + len])
    }
}

/// Whether `key`, reached from the front (`rev`: the back), is at or past the last key the
/// other end of a [`Scan`] yielded.
fn crossed(
    front_last: &Option<Vec<u8>>,
    back_last: &Option<Vec<u8>>,
    rev: bool,
    key: &[u8],
) -> bool {
    if rev {
        front_last.as_deref().is_some_and(|f| key <= f)
    } else {
        back_last.as_deref().is_some_and(|b| key >= b)
    }
}

/// What one step of a [`Scan`] reached: one of the transaction's own writes, or a record.
#[derive(Clone, Copy)]
enum Candidate {
    Overlay(usize),
    Record(RecordRef),
}

impl Iterator for Scan<'_> {
    type Item = (Vec<u8>, Vec<u8>);

    fn next(&mut self) -> Option<(Vec<u8>, Vec<u8>)> {
        self.next_with(false, |k, v| (k.to_vec(), v.to_vec()))
    }
}

impl DoubleEndedIterator for Scan<'_> {
    fn next_back(&mut self) -> Option<(Vec<u8>, Vec<u8>)> {
        self.next_with(true, |k, v| (k.to_vec(), v.to_vec()))
    }
}

/// A range read inside a [`Txn`]. When dropped, the part of the range it actually covered is
/// remembered for validation.
pub struct Range<'t, 'db> {
    txn: &'t mut Txn<'db>,
    /// Holds the range's bounds (the store's scan does), taken back at the drop.
    scan: Scan<'db>,
    /// Whether the commit checks what was read ([`Txn::range_unchecked`] says no).
    checked: bool,
}

impl Range<'_, '_> {
    /// The next pair from the front (`rev`: from the back), passed to `f` in place, as
    /// [`Scan::next_with`].
    pub fn next_with<T>(&mut self, rev: bool, f: impl FnOnce(&[u8], &[u8]) -> T) -> Option<T> {
        self.scan.next_with(rev, f)
    }

    /// [`Range::next_with`], remembering the pair's key as a point read (the commit checks
    /// that nobody wrote it since, as after [`Txn::get`] of it) where the pair is a committed
    /// one: for a [`Txn::range_unchecked`] whose picks must stay as read, without looking
    /// each up again. A pair of the transaction's own writes needs no read.
    ///
    /// ```
    /// use std::ops::Bound;
    /// let db = keel::Db::in_memory();
    /// db.transact(|txn| {
    ///     txn.put(b"m1", b"")?;
    ///     txn.put(b"m2", b"")
    /// })?;
    /// fn pick(db: &keel::Db) -> Result<keel::Txn<'_>, Box<dyn std::error::Error>> {
    ///     let mut txn = db.begin()?;
    ///     let lo = Bound::Included(b"m".to_vec());
    ///     let first = txn
    ///         .range_unchecked(lo, Bound::Excluded(b"n".to_vec()))
    ///         .next_read(false, |k, _| k.to_vec())?;
    ///     assert_eq!(first.as_deref(), Some(&b"m1"[..]));
    ///     txn.put(b"out", b"")?;
    ///     Ok(txn)
    /// }
    /// // A member added or changed beside the pick is no conflict,
    /// let txn = pick(&db)?;
    /// db.transact(|t| t.put(b"m0", b""))?;
    /// db.transact(|t| t.put(b"m2", b"x"))?;
    /// assert!(txn.commit()?.is_ok());
    /// // but a write of the pick is.
    /// db.transact(|t| t.delete(b"m0"))?;
    /// let txn = pick(&db)?;
    /// db.transact(|t| t.delete(b"m1"))?;
    /// assert!(txn.commit()?.is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn next_read<T>(
        &mut self,
        rev: bool,
        f: impl FnOnce(&[u8], &[u8]) -> T,
    ) -> Result<Option<T>, Error> {
        match self.scan.next_found(rev, f) {
            Some((t, Some(record))) => {
                self.txn.remember(Read::Record(record))?;
                Ok(Some(t))
            }
            Some((t, None)) => Ok(Some(t)),
            None => Ok(None),
        }
    }
}

impl Iterator for Range<'_, '_> {
    type Item = (Vec<u8>, Vec<u8>);
    fn next(&mut self) -> Option<(Vec<u8>, Vec<u8>)> {
        self.scan.next()
    }
}

impl DoubleEndedIterator for Range<'_, '_> {
    fn next_back(&mut self) -> Option<(Vec<u8>, Vec<u8>)> {
        self.scan.next_back()
    }
}

impl Drop for Range<'_, '_> {
    fn drop(&mut self) {
        if !self.checked {
            return;
        }
        let scan = &mut self.scan;
        let whole = scan.front_done || scan.back_done;
        let (front_last, back_last) = (scan.front_last.take(), scan.back_last.take());
        let range = scan.records.take_range();
        let covered = if whole {
            1
        } else {
            usize::from(front_last.is_some()) + usize::from(back_last.is_some())
        };
        let ranges = &mut self.txn.ranges;
        if self.txn.reads.len() + ranges.len() + covered > TXN_READS_MAX {
            // Too many ranges to remember one by one: remember the whole key space instead,
            // which is stricter and bounded.
            ranges.clear();
            ranges.push(KeyRange {
                lo: Bound::Unbounded,
                hi: Bound::Unbounded,
            });
            return;
        }
        if whole {
            remember(ranges, range);
            return;
        }
        let KeyRange { lo, hi } = range;
        match (front_last, back_last) {
            (Some(front), Some(back)) => {
                remember(
                    ranges,
                    KeyRange {
                        lo,
                        hi: Bound::Included(front),
                    },
                );
                remember(
                    ranges,
                    KeyRange {
                        lo: Bound::Included(back),
                        hi,
                    },
                );
            }
            (Some(front), None) => remember(
                ranges,
                KeyRange {
                    lo,
                    hi: Bound::Included(front),
                },
            ),
            (None, Some(back)) => remember(
                ranges,
                KeyRange {
                    lo: Bound::Included(back),
                    hi,
                },
            ),
            (None, None) => {}
        }
    }
}

/// Adds `range` to the ranges a transaction read, merged into the last one when the two
/// overlap or touch: the commit then passes their keys once. Scans that restart where the
/// last began (a pipeline of pops, each from the head of one sorted set) read one growing
/// range, and checking each again made the commit's check quadratic in them.
fn remember(ranges: &mut Vec<KeyRange>, range: KeyRange) {
    match ranges.last_mut() {
        Some(last) if overlap(last, &range) => {
            // Their union, the bounds moved rather than copied.
            if !starts_before(&last.lo, &range.lo) {
                last.lo = range.lo;
            }
            if !ends_after(&last.hi, &range.hi) {
                last.hi = range.hi;
            }
        }
        _ => ranges.push(range),
    }
}

/// Whether `a ∪ b` is one range: they overlap or touch.
fn overlap(a: &KeyRange, b: &KeyRange) -> bool {
    let (first, second) = if starts_before(&a.lo, &b.lo) {
        (a, b)
    } else {
        (b, a)
    };
    reaches(&first.hi, &second.lo)
}

/// `a ∪ b` when it is one range (they overlap or touch), else `None`.
#[cfg(test)]
fn union(a: &KeyRange, b: &KeyRange) -> Option<KeyRange> {
    let mut ranges = vec![a.clone()];
    remember(&mut ranges, b.clone());
    (ranges.len() == 1).then(|| ranges.remove(0))
}

/// Whether a range starting at `a` starts no later than one starting at `b`.
fn starts_before(a: &Bound<Vec<u8>>, b: &Bound<Vec<u8>>) -> bool {
    match (a, b) {
        (Bound::Unbounded, _) => true,
        (_, Bound::Unbounded) => false,
        (Bound::Excluded(x), Bound::Included(y)) => x < y,
        (Bound::Included(x) | Bound::Excluded(x), Bound::Included(y) | Bound::Excluded(y)) => {
            x <= y
        }
    }
}

/// Whether a range ending at `a` reaches at least as far as one ending at `b`.
fn ends_after(a: &Bound<Vec<u8>>, b: &Bound<Vec<u8>>) -> bool {
    match (a, b) {
        (Bound::Unbounded, _) => true,
        (_, Bound::Unbounded) => false,
        (Bound::Excluded(x), Bound::Included(y)) => x > y,
        (Bound::Included(x) | Bound::Excluded(x), Bound::Included(y) | Bound::Excluded(y)) => {
            x >= y
        }
    }
}

/// Whether a range ending at `hi` and one starting at `lo` leave no key between them.
fn reaches(hi: &Bound<Vec<u8>>, lo: &Bound<Vec<u8>>) -> bool {
    match (hi, lo) {
        (Bound::Unbounded, _) | (_, Bound::Unbounded) => true,
        // `..x)` and `(x..` leave `x` out.
        (Bound::Excluded(x), Bound::Excluded(y)) => y < x,
        (Bound::Included(x) | Bound::Excluded(x), Bound::Included(y) | Bound::Excluded(y)) => {
            y <= x
        }
    }
}

#[cfg(test)]
mod tests {
    use std::ops::Bound::{self, Excluded, Included, Unbounded};
    use std::ops::RangeBounds;
    use std::time::{Duration, Instant};

    use super::{KeyRange, LockWait};

    fn range(lo: Bound<&str>, hi: Bound<&str>) -> KeyRange {
        let own = |b: Bound<&str>| b.map(|k| k.as_bytes().to_vec());
        KeyRange {
            lo: own(lo),
            hi: own(hi),
        }
    }

    /// A transaction's own writes read back through the write set's index as it grows and
    /// is rebuilt: puts, deletes and overwrites of thousands of keys, and keys it never
    /// wrote, which read the committed value.
    #[test]
    fn a_large_write_set_finds_every_key() {
        let db = crate::Db::in_memory();
        let key = |i: usize| format!("key:{i}").into_bytes();
        let mut setup = db.begin().expect("begin");
        for i in 0..3000 {
            setup.put(&key(i), b"old").expect("put");
        }
        setup.commit().expect("commit").expect("no conflict");
        let mut txn = db.begin().expect("begin");
        for i in (0..3000).step_by(2) {
            txn.put(&key(i), b"new").expect("put");
        }
        for i in (0..3000).step_by(3) {
            txn.delete(&key(i)).expect("delete");
        }
        for i in 0..3000 {
            let want: Option<&[u8]> = match (i % 3, i % 2) {
                (0, _) => None,
                (_, 0) => Some(b"new"),
                _ => Some(b"old"),
            };
            assert_eq!(txn.get(&key(i)).expect("get").as_deref(), want, "key {i}");
        }
        assert_eq!(txn.get(b"never").expect("get"), None);
        txn.commit().expect("commit").expect("no conflict");
        let snap = db.snapshot().expect("snapshot");
        assert_eq!(
            snap.get(&key(2)).expect("get").as_deref(),
            Some(&b"new"[..])
        );
        assert_eq!(snap.get(&key(3)).expect("get"), None);
        assert_eq!(
            snap.get(&key(5)).expect("get").as_deref(),
            Some(&b"old"[..])
        );
    }

    /// Ranges that overlap or touch merge into their union, in either order; a gap, even
    /// of one key, keeps them apart. Checked against every key of a small alphabet.
    #[test]
    fn read_ranges_merge_exactly_when_no_key_lies_between() {
        const KEYS: [&str; 6] = ["", "a", "b", "c", "d", "e"];
        let mut bounds = vec![Unbounded];
        for k in &KEYS[1..] {
            bounds.push(Included(*k));
            bounds.push(Excluded(*k));
        }
        let mut ranges = Vec::new();
        for &lo in &bounds {
            for &hi in &bounds {
                let r = range(lo, hi);
                if !r.is_empty() {
                    ranges.push(r);
                }
            }
        }
        for a in &ranges {
            for b in &ranges {
                check(a, b);
            }
        }
        fn check(a: &KeyRange, b: &KeyRange) {
            let keys = KEYS;
            // Keys between the alphabet's: "a\0" lies just after "a", "a~" well before "b".
            let probes: Vec<String> = keys
                .iter()
                .flat_map(|k| [k.to_string(), format!("{k}\0"), format!("{k}~")])
                .collect();
            let union = super::union(a, b);
            for probe in &probes {
                let p = probe.as_bytes();
                let inside = a.contains(p) || b.contains(p);
                if let Some(u) = &union {
                    assert_eq!(u.contains(p), inside, "{probe:?} in {a:?} and {b:?}: {u:?}");
                }
            }
            // Merged whenever one of them starts inside, or right after, the other.
            let touching = |x: &KeyRange, y: &KeyRange| match &y.lo {
                Unbounded => x.lo == Unbounded,
                Included(k) | Excluded(k) => x.contains(k.as_slice()),
            };
            if touching(a, b) || touching(b, a) {
                assert!(union.is_some(), "{a:?} and {b:?} overlap");
            }
        }
    }

    /// The lock wait's rule: one holder for the whole `wait` gives up; a lock that changes
    /// hands (or a record that gets new versions) restarts the wait, up to `patience`.
    #[test]
    fn a_lock_wait_gives_up_on_one_holder_not_on_a_contended_lock() {
        let (wait, patience) = (Duration::from_secs(1), Duration::from_secs(30));
        let version = |n: usize| n as *const crate::mvcc::Version;
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let waiting = |first: (u64, *const crate::mvcc::Version)| LockWait {
            started: t0,
            deadline: t0 + wait,
            wait,
            patience,
            seen: first,
            moved: false,
        };
        // One holder, nothing installed: gives up at the deadline, not before.
        let mut stuck = waiting((7, version(8)));
        assert!(!stuck.observe(at(999), (7, version(8))));
        assert!(stuck.observe(at(1000), (7, version(8))));
        // Holders take turns (each installing a version): never gives up within patience.
        let mut busy = waiting((7, version(8)));
        let mut ms = 0;
        while ms < 29_000 {
            ms += 100;
            let holder = 7 + (ms / 100) % 3;
            assert!(
                !busy.observe(at(ms), (holder, version(8 + ms as usize))),
                "gave up at {ms} ms"
            );
        }
        // ... and does at the end of it.
        assert!(busy.observe(at(30_000), (99, version(1))));
        // Turns that stop: the wait restarts from the last one, then gives up a wait later.
        let mut stopped = waiting((7, version(8)));
        assert!(!stopped.observe(at(500), (8, version(8))));
        assert!(
            !stopped.observe(at(1000), (8, version(8))),
            "moved since the start"
        );
        assert!(!stopped.observe(at(1999), (8, version(8))));
        assert!(stopped.observe(at(2000), (8, version(8))));
        // A prepare's wait (patience = wait) never restarts.
        let mut prepare = LockWait {
            patience: Duration::from_millis(2),
            deadline: t0 + Duration::from_millis(2),
            wait: Duration::from_millis(2),
            ..waiting((7, version(8)))
        };
        assert!(!prepare.observe(at(1), (8, version(9))));
        assert!(prepare.observe(at(2), (9, version(10))));
    }
}

//! Two-phase commit's participant side: a transaction prepared (locked, validated, its
//! timestamp taken and its writes logged) that commits or aborts later, on a decision taken
//! elsewhere (`docs/cluster.md`).
//!
//! A prepared transaction holds its write set's record locks, a *shared* hold on the record
//! of every key it read (an empty record is made for a key read absent), and its commit
//! timestamp, which stays unpublished until the decision: the watermark stops below it, so no
//! snapshot can be taken at or above it while its writes are missing, and later commits wait
//! to become visible until it is decided. Its serial position is fixed at prepare (the
//! timestamp): each database's serial order is its order of votes.
//!
//! The timestamp alone does not make databases that each order by their own timestamps
//! serializable together: two transactions that each read on one database what the other
//! writes there, preparing in opposite orders, would both commit (write skew across
//! databases). What does is commitment ordering: nothing that follows a prepared transaction
//! in a database's conflict order commits (or prepares) there before its decision. The locks
//! give that for keys: a writer of a key it read or wrote does not commit before the decision
//! (a commit conflicts at once, `ConflictReason::Prepared`, and its caller waits outside the
//! engine; a prepare waits briefly, then gives up), and a
//! reader of a key it wrote fails validation (the record is locked); shared holds do not
//! conflict with each other or with validating readers. They do not cover a scanned
//! range: a key inserted into it later follows the prepared transaction without touching
//! any record it holds. Nor does a transaction recovered in doubt hold its reads (they are
//! not logged). The caller keeps others from preparing while such a transaction is
//! undecided (`keel-server/src/xnode.rs`, `Gate`; [`Txn::reads_ranges`]).
//!
//! Durability: the prepare frame (the writes, the caller's metadata) is durable before
//! [`Txn::prepare`] returns; the decision frame is durable before the timestamp is published.
//! A database opened with a prepare frame and no decision frame recovers it as *in doubt*
//! ([`Db::in_doubt`](crate::Db::in_doubt)): locked again, its timestamp held unpublished, until
//! the caller decides it.

use super::{
    CommitError, Conflict, Error, Limit, LockOwner, Outcome, RecordRef, Shared, Step, Ticket,
    Tracked, Ts, Txn, WriteEntry,
};
use crate::concurrency::SlotStats;
use crate::wal::format::{Kind, Logged};

/// The values behind a transaction's tickets, resolved at prepare: what the metadata closure
/// of [`Txn::prepare`] may record.
pub struct Resolved<'a> {
    tracked: &'a [Tracked],
}

impl Resolved<'_> {
    /// The value the ticket's key held right after the writes before [`Txn::track`] gave it
    /// (`None`: absent). Panics on a ticket of another transaction.
    pub fn value(&self, ticket: Ticket) -> Option<&[u8]> {
        match self.tracked.get(ticket.0 as usize) {
            Some(Tracked::Known(v)) => v.as_deref(),
            _ => panic!("a resolved ticket of this transaction"),
        }
    }
}

/// A transaction that voted to commit and waits for the decision: [`Prepared::commit`] or
/// [`Prepared::abort`]. Dropping it aborts it.
pub struct Prepared<'db> {
    db: &'db Shared,
    /// The transaction, keeping its registry slot until the timestamp is published; `None`
    /// for one recovered from the log.
    txn: Option<Txn<'db>>,
    owner: LockOwner,
    ts: Ts,
    meta: Vec<u8>,
    keys: Vec<Vec<u8>>,
    locked: Vec<RecordRef>,
    values: Vec<Option<Vec<u8>>>,
    /// The records of the keys it read (and did not write), held shared until the decision.
    shared: Vec<RecordRef>,
    /// A prepare frame is in the log: the decision must be logged too.
    logged: bool,
    settled: bool,
    /// Prepared from a transaction of [`Db::begin_owned`](crate::Db::begin_owned): its count
    /// of the database, which outlives the transaction here (`txn` may end first). Last, so
    /// dropped after everything else.
    _keep: Option<std::sync::Arc<crate::db::Shared>>,
}

// SAFETY: the record references point into the store, which outlives `'db`, and the records
// they name stay locked by this transaction (nobody frees or changes them) until it settles.
unsafe impl Send for Prepared<'_> {}

impl std::fmt::Debug for Prepared<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared")
            .field("ts", &self.ts)
            .field("keys", &self.keys.len())
            .field("meta_bytes", &self.meta.len())
            .field("recovered", &self.txn.is_none())
            .finish()
    }
}

impl<'db> Txn<'db> {
    /// Phase one of a two-phase commit: locks the write set, holds the keys read (shared;
    /// a brief wait for a key locked exclusively, then a conflict), resolves commutative
    /// operations, takes the commit timestamp, validates the reads, and logs the writes with
    /// the metadata
    /// `meta` returns (given the tickets' values; at most
    /// [`PREPARE_META_BYTES_MAX`](crate::limits::PREPARE_META_BYTES_MAX) bytes), durably.
    /// On success the transaction is prepared: its locks and timestamp are held until
    /// [`Prepared::commit`] or [`Prepared::abort`], and nothing committed after it becomes
    /// visible before that. A transaction without writes takes a timestamp and validates too
    /// (its reads hold at that timestamp), but logs nothing.
    ///
    /// A database that prepares should not split hot records ([`SplitMode::Off`]): a commit
    /// that only applies operations to a split record's slices takes no timestamp and
    /// serializes at the watermark, which a prepared transaction holds below its own
    /// timestamp, so it would land before a prepared transaction that did not see it. A
    /// prepare that meets a split record (writing or reading it) gives up at once with
    /// [`ConflictReason::Split`](crate::ConflictReason::Split), having asked for the joined
    /// phase: it can neither write to a slice nor hold the record while the splitter does.
    /// Run again holding [`Db::wait_joined`](crate::Db::wait_joined)'s guard, it prepares.
    ///
    /// [`SplitMode::Off`]: crate::SplitMode::Off
    ///
    /// ```
    /// let db = keel::Db::in_memory();
    /// let mut txn = db.begin()?;
    /// txn.put(b"k", b"v")?;
    /// let prepared = txn.prepare(|_| b"txn 7".to_vec())?.expect("no conflict");
    /// assert_eq!(db.snapshot()?.get(b"k")?, None); // not visible before the decision
    /// let ts = prepared.commit()?;
    /// assert_eq!(db.snapshot()?.get(b"k")?.as_deref(), Some(&b"v"[..]));
    /// # let _ = ts;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn prepare(
        self,
        meta: impl FnOnce(&Resolved<'_>) -> Vec<u8>,
    ) -> Result<Result<Prepared<'db>, Conflict>, CommitError> {
        match self.prepare_async(meta)? {
            Ok(pending) => pending.wait().map(Ok),
            Err(conflict) => Ok(Err(conflict)),
        }
    }

    /// [`Txn::prepare`] without blocking for the disk: when it returns, the transaction is
    /// locked, validated, its timestamp taken and its prepare frame written to the log; the
    /// [`PrepareFuture`] resolves to the [`Prepared`] transaction once that frame is durable
    /// (a vote must wait for that), or to the log's failure. Dropping the future aborts
    /// the transaction ([`Prepared::abort_nowait`]).
    pub fn prepare_async(
        mut self,
        meta: impl FnOnce(&Resolved<'_>) -> Vec<u8>,
    ) -> Result<Result<PrepareFuture<'db>, Conflict>, CommitError> {
        if let Some(error) = self.db.log.as_ref().and_then(|log| log.failed()) {
            return Err(CommitError::Log(error));
        }
        let (ts, writes, locked, values, shared) = match self.commit_work(true) {
            Step::Done(Ok(Ok(_))) => unreachable!("a prepare always stops prepared"),
            Step::Done(Ok(Err(conflict))) => return Ok(Err(conflict)),
            Step::Done(Err(error)) => return Err(error),
            Step::Publish { ts, outcome, .. } => {
                // Lost its validation: nothing was logged or installed. The timestamp is
                // finished, but not waited for: earlier prepared transactions may be waiting
                // for decisions that wait for this caller.
                let Outcome::Aborted(conflict) = outcome else {
                    unreachable!(
                        "a prepare that took a timestamp either failed validation or stopped prepared"
                    )
                };
                self.db.oracle.finish(ts);
                self.hand_on_slot(ts);
                return Ok(Err(conflict));
            }
            Step::Durable { .. } => unreachable!("a prepare takes no split slice"),
            Step::Visible { .. } => unreachable!("a prepare takes a timestamp even to read"),
            Step::Prepared {
                ts,
                writes,
                locked,
                values,
                shared,
            } => (ts, writes, locked, values, shared),
        };
        let meta = meta(&Resolved {
            tracked: &self.tracked,
        });
        let owner = self.me().prepared();
        let keys: Vec<Vec<u8>> = writes
            .into_iter()
            .map(|e: WriteEntry| e.key.into_vec())
            .collect();
        let mut prepared = Prepared {
            db: self.db,
            txn: None,
            owner,
            ts,
            meta,
            keys,
            locked,
            values,
            shared,
            logged: false,
            // Until logged, dropping it only unlocks and publishes.
            settled: false,
            _keep: self.keep.clone(),
        };
        if prepared.meta.len() > crate::limits::PREPARE_META_BYTES_MAX {
            let requested = prepared.meta.len();
            prepared.txn = Some(self);
            drop(prepared.settle(false, true));
            return Err(CommitError::Apply(Error::LimitExceeded {
                limit: Limit::PrepareMetaBytes,
                requested,
            }));
        }
        prepared.txn = Some(self);
        if let Some(log) = &prepared.db.log
            && !prepared.keys.is_empty()
        {
            let entries = prepared.keys.iter().zip(&prepared.values).map(|(k, v)| {
                let logged = match v {
                    Some(v) => Logged::Put(v),
                    None => Logged::Delete,
                };
                (k.as_slice(), logged)
            });
            let appended = log.append_frame(
                ts,
                Kind::Prepare(&prepared.meta),
                prepared.keys.len(),
                entries,
            );
            match appended {
                Ok(end) => {
                    return Ok(Ok(PrepareFuture {
                        prepared: Some(prepared),
                        end: Some(end),
                    }));
                }
                Err(error) => {
                    // The log is dead: nothing will commit again. Give the locks back.
                    drop(prepared.settle(false, true));
                    return Err(CommitError::Log(error));
                }
            }
        }
        Ok(Ok(PrepareFuture {
            prepared: Some(prepared),
            end: None,
        }))
    }
}

/// A transaction prepared and logged whose prepare frame may not be durable yet
/// ([`Txn::prepare_async`]): a future of the [`Prepared`] transaction, or of the log's
/// failure. Dropping it aborts the transaction without waiting.
#[must_use = "dropping it aborts the prepared transaction"]
pub struct PrepareFuture<'db> {
    prepared: Option<Prepared<'db>>,
    /// Where the prepare frame ends in the log; `None` when nothing was logged.
    end: Option<u64>,
}

impl std::fmt::Debug for PrepareFuture<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrepareFuture")
            .field("prepared", &self.prepared)
            .field("end", &self.end)
            .finish()
    }
}

impl<'db> PrepareFuture<'db> {
    /// Blocks until the prepare frame is durable.
    pub fn wait(mut self) -> Result<Prepared<'db>, CommitError> {
        if let Some((log, end)) = self.logged() {
            // A failure shows in `conclude`.
            let _ = log.wait_durable(end);
        }
        self.conclude()
    }

    /// The prepared transaction if its frame is durable already (or the log failed), and
    /// then the future is spent; `None` while it is not. A caller that polls from a loop of
    /// its own need not spawn a task when nothing was logged.
    pub fn ready(&mut self) -> Option<Result<Prepared<'db>, CommitError>> {
        if let Some((log, end)) = self.logged()
            && log.durable_lsn() < end
            && log.failed().is_none()
        {
            return None;
        }
        Some(self.conclude())
    }

    /// The log and where the prepare frame ends in it, if the prepare logged anything.
    fn logged(&self) -> Option<(&'db crate::wal::Log, u64)> {
        let db = self.prepared.as_ref().expect("not resolved yet").db;
        let log = || db.log.as_ref().expect("a logged prepare has a log");
        self.end.map(|end| (log(), end))
    }

    /// The outcome once the wait for the frame ended: the prepared transaction if the
    /// frame is durable, else the log's failure (the locks given back).
    fn conclude(&mut self) -> Result<Prepared<'db>, CommitError> {
        let durable = self
            .logged()
            .map(|(log, end)| (log, log.durable_lsn() >= end));
        let mut prepared = self.prepared.take().expect("not resolved yet");
        match durable {
            None => Ok(prepared),
            Some((_, true)) => {
                prepared.logged = true;
                Ok(prepared)
            }
            Some((log, false)) => {
                let error = log
                    .failed()
                    .expect("a durable wait ends early only on failure");
                // The log is dead: nothing will commit again. Give the locks back.
                drop(prepared.settle(false, true));
                Err(CommitError::Log(error))
            }
        }
    }
}

impl<'db> std::future::Future for PrepareFuture<'db> {
    type Output = Result<Prepared<'db>, CommitError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let this = &mut *self;
        if let Some((log, end)) = this.logged()
            && !log.watch_durable(end, cx.waker())
        {
            return std::task::Poll::Pending;
        }
        std::task::Poll::Ready(this.conclude())
    }
}

impl Drop for PrepareFuture<'_> {
    fn drop(&mut self) {
        if let Some(mut prepared) = self.prepared.take() {
            // Its frame is in the log: the abort is logged too.
            prepared.logged = self.end.is_some();
            drop(prepared.abort_nowait());
        }
    }
}

impl Txn<'_> {
    /// Gives the registry slot back once the watermark passes `ts`, which is finished.
    fn hand_on_slot(mut self, ts: Ts) {
        self.slot_handed_on = true;
        self.db.oracle.release_when_published(self.slot, ts);
    }
}

impl<'db> Prepared<'db> {
    /// A prepared transaction rebuilt by recovery: its records are locked by `owner` already.
    pub(crate) fn recovered(
        db: &'db Shared,
        owner: LockOwner,
        ts: Ts,
        meta: Vec<u8>,
        writes: Vec<(Vec<u8>, RecordRef, Option<Vec<u8>>)>,
    ) -> Prepared<'db> {
        let mut keys = Vec::with_capacity(writes.len());
        let mut locked = Vec::with_capacity(writes.len());
        let mut values = Vec::with_capacity(writes.len());
        for (key, record, value) in writes {
            keys.push(key);
            locked.push(record);
            values.push(value);
        }
        Prepared {
            db,
            txn: None,
            owner,
            ts,
            meta,
            keys,
            locked,
            values,
            // Not logged: a transaction recovered in doubt holds its writes only, and its
            // caller must keep others from depending on what it read (xnode's `Gate`).
            shared: Vec::new(),
            logged: true,
            settled: false,
            _keep: None,
        }
    }

    /// The commit timestamp: where the transaction sits in this database's serial order.
    pub fn ts(&self) -> Ts {
        self.ts
    }

    /// The metadata given at prepare.
    pub fn meta(&self) -> &[u8] {
        &self.meta
    }

    /// Whether it writes nothing: committing it and aborting it then both only release what
    /// it read (and neither is logged).
    pub fn is_read_only(&self) -> bool {
        self.keys.is_empty()
    }

    /// The keys written, in lock order.
    pub fn keys(&self) -> impl Iterator<Item = &[u8]> {
        self.keys.iter().map(Vec::as_slice)
    }

    /// Phase two, committed: logs the decision, installs the writes at [`Prepared::ts`],
    /// releases the locks, and returns once the decision is durable. The commit is visible
    /// once every earlier timestamp is finished too ([`Db::wait_visible`]): an earlier
    /// prepared transaction still undecided holds it up. Returning before that is what keeps
    /// coordinators that decide several transactions on several databases from waiting on
    /// each other; one that acknowledges a client waits for visibility first.
    ///
    /// [`Db::wait_visible`]: crate::Db::wait_visible
    pub fn commit(mut self) -> Result<Ts, CommitError> {
        self.settle(true, true)
    }

    /// Phase two, aborted: logs the decision, releases the locks, finishes the timestamp.
    pub fn abort(mut self) -> Result<(), CommitError> {
        self.settle(false, true).map(|_| ())
    }

    /// [`Prepared::commit`] without waiting for the disk: logs the decision, installs the
    /// writes and releases the locks, and returns. The log's flusher finishes the timestamp
    /// once the decision is durable, so the commit becomes visible only then (and never if
    /// the log fails): wait for [`Db::visible`](crate::Db::visible) of the timestamp before
    /// telling anyone it committed.
    pub fn commit_nowait(mut self) -> Result<Ts, CommitError> {
        self.settle(true, false)
    }

    /// [`Prepared::abort`] without waiting for the disk.
    pub fn abort_nowait(mut self) -> Result<(), CommitError> {
        self.settle(false, false).map(|_| ())
    }

    /// Logs the decision, installs (if `commit`) and unlocks; then, if `wait`, waits for
    /// the decision to be durable and finishes the timestamp, else has the log's flusher
    /// finish it once durable.
    fn settle(&mut self, commit: bool, wait: bool) -> Result<Ts, CommitError> {
        self.settled = true;
        let db = self.db;
        let mut durable_end = None;
        if self.logged
            && let Some(log) = &db.log
        {
            // Logged before the locks go, so that the decision comes before the frame of any
            // later commit of these keys, which are durable in log order.
            match log.append_frame(self.ts, Kind::Decision(commit), 0, std::iter::empty()) {
                Ok(end) => durable_end = Some((log, end)),
                // The log is dead: the locks stay, nothing commits any more anyway.
                Err(error) => return Err(CommitError::Log(error)),
            }
        }
        let horizon = db.oracle.horizon();
        let mut versions = 0;
        let mut collect = false;
        for (record, value) in self.locked.iter().zip(&self.values) {
            if commit {
                versions += record
                    .get()
                    .install(self.owner, self.ts, value.as_deref(), horizon);
                if value.is_none() {
                    collect |= db.store.note_dead(*record, self.ts);
                }
            }
            record.get().unlock(self.owner);
        }
        // A decision is installed on the two-phase commit's driver, which must not stall on
        // a pass: the collector's thread runs it.
        if collect {
            db.wake_collector();
        }
        super::unlock_shared(db, &std::mem::take(&mut self.shared));
        match durable_end {
            Some((log, end)) if wait => {
                if let Err(error) = log.wait_durable(end) {
                    // Not published: nobody may read what the disk does not hold.
                    return Err(CommitError::Log(error));
                }
                db.oracle.finish(self.ts);
            }
            Some((log, end)) => log.finish_when_durable(end, self.ts),
            None => db.oracle.finish(self.ts),
        }
        match &self.txn {
            Some(txn) => {
                let stats = db.oracle.stats(txn.slot);
                let live = stats.versions.load(std::sync::atomic::Ordering::Relaxed);
                stats
                    .versions
                    .store(live + versions, std::sync::atomic::Ordering::Relaxed);
                if commit {
                    SlotStats::bump(&stats.commits);
                }
            }
            None => db.note_versions(versions),
        }
        match self.txn.take() {
            Some(txn) => txn.hand_on_slot(self.ts),
            None => {
                db.oracle.advance();
            }
        }
        Ok(self.ts)
    }
}

impl Drop for Prepared<'_> {
    fn drop(&mut self) {
        if !self.settled {
            // A decision that cannot be logged leaves the transaction in doubt for recovery.
            drop(self.settle(false, true));
        }
    }
}

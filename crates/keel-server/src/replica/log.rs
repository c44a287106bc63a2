//! A partition's Raft log, on a keel database of its own.
//!
//! Keys: `e` + index (8 bytes, big-endian, so entries sort by index) → the entry (postcard);
//! `v` → the vote; `p` → the last purged log id; `c` → the last committed log id known; `f`
//! → the replica's floor and `x` → a mark, both of [`empty`]ing (a replica that left its
//! partition forgets its log and data, but never its vote, and never votes for a log older
//! than the one it forgot). An
//! append is one engine transaction per batch (at most [`BATCH_KEYS`] entries and
//! [`BATCH_BYTES`] bytes each), committed with the server's durability, so under `sync` it is
//! on disk before openraft hears it was appended; a vote is always fsynced (voting twice in a
//! term after a crash would let two leaders be elected).
//!
//! `append` returns as soon as its transactions are committed, before their fsync: openraft
//! goes on (sends the entries to the followers, takes more) while the disk works, and hears
//! of durability through the append's callback, which the store's flusher task calls, in
//! append order, once the commits' futures resolve. Until then the entries are not yet
//! visible in the database (keel publishes a `sync` commit after its fsync), so reads find
//! them in `pending`. Truncating and purging first wait for every flush in flight, so that
//! they see (and delete) exactly what was appended. While a snapshot from the leader is
//! being installed, a purge also waits until the state machine's snapshot file covers it
//! ([`LogStore::purge_behind`]).

// openraft's storage traits return its `StorageError`, which is large; the helpers here
// return it too rather than converting at every call.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

use keel::{Db, Durability};
use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{Entry, LogId, OptionalSend, StorageError, StorageIOError, Vote};

use super::Tc;

/// Commits whose loss a crash may cause (the log has what they did): on a database with
/// files they are logged and made durable by the next `sync` commit.
const LAZY: Durability = Durability::None;

const ENTRY: u8 = b'e';
const VOTE: &[u8] = b"v";
const PURGED: &[u8] = b"p";
const COMMITTED: &[u8] = b"c";
const FLOOR: &[u8] = b"f";
const EMPTYING: &[u8] = b"x";

/// Most entries one transaction of an append, truncate or purge writes.
const BATCH_KEYS: usize = 4096;
/// Most bytes one transaction of an append writes.
const BATCH_BYTES: usize = 16 << 20;

type Result<T> = std::result::Result<T, StorageError<u64>>;

fn entry_key(index: u64) -> [u8; 9] {
    let mut k = [ENTRY; 9];
    k[1..].copy_from_slice(&index.to_be_bytes());
    k
}

fn read_err(e: impl ToString) -> StorageError<u64> {
    StorageIOError::read_logs(openraft::AnyError::error(e.to_string())).into()
}

fn write_err(e: impl ToString) -> StorageError<u64> {
    StorageIOError::write_logs(openraft::AnyError::error(e.to_string())).into()
}

/// One append's commits on their way to durability.
struct Flush {
    commits: Vec<keel::CommitFuture<'static>>,
    /// The entries they hold, to drop from `pending` once visible.
    ids: Vec<LogId<u64>>,
    callback: LogFlushed<Tc>,
}

/// The log store and its readers (they share the database).
#[derive(Clone)]
pub struct LogStore {
    db: Db,
    durability: Durability,
    /// Entries appended whose commits are not yet visible (waiting for their fsync).
    pending: Arc<parking_lot::Mutex<BTreeMap<u64, Entry<Tc>>>>,
    /// To the flusher task.
    flushes: tokio::sync::mpsc::UnboundedSender<Flush>,
    /// Appends handed to the flusher.
    submitted: Arc<AtomicU64>,
    /// Appends the flusher has finished (their callbacks called).
    flushed: tokio::sync::watch::Receiver<u64>,
    /// The last log id the state machine's durable snapshot covers, if purges wait for it.
    durable: Option<super::machine::Durable>,
}

impl LogStore {
    /// The log kept in `db`; appends commit with `durability`. Starts the store's flusher
    /// task on the current tokio runtime.
    pub fn open(db: Db, durability: Durability) -> LogStore {
        let (flushes, mut queue) = tokio::sync::mpsc::unbounded_channel::<Flush>();
        let (done, flushed) = tokio::sync::watch::channel(0u64);
        let pending: Arc<parking_lot::Mutex<BTreeMap<u64, Entry<Tc>>>> = Arc::default();
        let visible = Arc::clone(&pending);
        tokio::spawn(async move {
            let mut finished = 0u64;
            while let Some(flush) = queue.recv().await {
                let mut result = Ok(());
                for commit in flush.commits {
                    match commit.await {
                        Ok(Ok(_)) => {}
                        Ok(Err(conflict)) => {
                            result = Err(std::io::Error::other(format!(
                                "a raft log append conflicted: {conflict}"
                            )));
                        }
                        Err(e) => result = Err(std::io::Error::other(e.to_string())),
                    }
                }
                if result.is_ok() {
                    let mut pending = visible.lock();
                    for id in &flush.ids {
                        if pending.get(&id.index).is_some_and(|e| e.log_id == *id) {
                            pending.remove(&id.index);
                        }
                    }
                }
                flush.callback.log_io_completed(result);
                finished += 1;
                let _ = done.send(finished);
            }
        });
        LogStore {
            db,
            durability,
            pending,
            flushes,
            submitted: Arc::default(),
            flushed,
            durable: None,
        }
    }

    /// Waits until every append handed to the flusher so far is finished.
    async fn wait_flushed(&self) -> Result<()> {
        let target = self.submitted.load(SeqCst);
        let mut flushed = self.flushed.clone();
        flushed
            .wait_for(|&done| done >= target)
            .await
            .map(|_| ())
            .map_err(|_| write_err("the raft log's flusher stopped"))
    }

    /// Cuts the log only behind the state machine's durable snapshot (`durable`): while a
    /// snapshot from the leader is being installed, a purge past the snapshot file waits for
    /// it. openraft purges a follower's log as soon as it accepts a snapshot, while the state
    /// machine is still writing it; a crash in between would leave neither the entries nor
    /// the snapshot on disk, and openraft refuses to start on such a log (its purge point past
    /// its snapshot). While the purge waits, openraft appends nothing, so the log has no gap
    /// either. Other purges (behind a snapshot built here, or openraft's clean-up at start)
    /// do not wait.
    pub fn purge_behind(mut self, durable: super::machine::Durable) -> LogStore {
        self.durable = Some(durable);
        self
    }

    fn get<T: serde::de::DeserializeOwned>(&self, key: &[u8]) -> Result<Option<T>> {
        let snap = self.db.snapshot().map_err(read_err)?;
        match snap.get(key).map_err(read_err)? {
            Some(v) => postcard::from_bytes(&v).map(Some).map_err(read_err),
            None => Ok(None),
        }
    }

    fn put<T: serde::Serialize>(
        &self,
        key: &[u8],
        value: &T,
        durability: Durability,
    ) -> Result<()> {
        let bytes = postcard::to_stdvec(value).map_err(write_err)?;
        self.db
            .transact(|t| {
                t.set_durability(durability);
                t.put(key, &bytes)
            })
            .map_err(write_err)
    }

    /// Deletes the entries with index in `range`, a batch per transaction.
    fn delete_entries(&self, from: u64, to: Bound<u64>) -> Result<()> {
        let end = match to {
            Bound::Included(i) => Bound::Included(entry_key(i).to_vec()),
            Bound::Excluded(i) => Bound::Excluded(entry_key(i).to_vec()),
            Bound::Unbounded => Bound::Excluded(vec![ENTRY + 1]),
        };
        loop {
            let snap = self.db.snapshot().map_err(write_err)?;
            let keys: Vec<Vec<u8>> = snap
                .range::<Vec<u8>>((Bound::Included(entry_key(from).to_vec()), end.clone()))
                .take(BATCH_KEYS)
                .map(|(k, _)| k)
                .collect();
            drop(snap);
            if keys.is_empty() {
                return Ok(());
            }
            self.db
                .transact(|t| {
                    t.set_durability(self.durability);
                    keys.iter().try_for_each(|k| t.delete(k))
                })
                .map_err(write_err)?;
        }
    }

    /// Commits `entries`, a transaction per batch (at most [`BATCH_KEYS`] entries and
    /// [`BATCH_BYTES`] bytes), with the log's durability; the futures resolve once each is
    /// durable and visible.
    fn commit_entries(&self, entries: &[Entry<Tc>]) -> Result<Vec<keel::CommitFuture<'static>>> {
        let mut commits = Vec::new();
        let mut rest = entries;
        while !rest.is_empty() {
            // Owned: the flusher task awaits its commit, past this call.
            let mut txn = self.db.begin_owned().map_err(write_err)?;
            txn.set_durability(self.durability);
            let (mut n, mut bytes) = (0, 0);
            while n < rest.len() && n < BATCH_KEYS {
                let e = &rest[n];
                let value = postcard::to_stdvec(e).map_err(write_err)?;
                if n > 0 && bytes + value.len() > BATCH_BYTES {
                    break;
                }
                bytes += value.len();
                txn.put(&entry_key(e.log_id.index), &value)
                    .map_err(write_err)?;
                n += 1;
            }
            rest = &rest[n..];
            // Blind writes of keys only this store writes, one append at a time: they cannot
            // conflict (the flusher reports it as an I/O error if one ever did).
            commits.push(txn.commit_async());
        }
        Ok(commits)
    }

    /// The entries from `start` to `end`: the database's, with those still pending over
    /// them.
    fn entries(&self, start: u64, end: Bound<u64>) -> Result<Vec<Entry<Tc>>> {
        let key_end = match end {
            Bound::Included(i) => Bound::Included(entry_key(i).to_vec()),
            Bound::Excluded(i) => Bound::Excluded(entry_key(i).to_vec()),
            Bound::Unbounded => Bound::Excluded(vec![ENTRY + 1]),
        };
        // Pending entries first: one that becomes visible meanwhile is then read twice (the
        // same entry), never missed.
        let pending: Vec<Entry<Tc>> = self
            .pending
            .lock()
            .range((Bound::Included(start), end))
            .map(|(_, e)| e.clone())
            .collect();
        let snap = self.db.snapshot().map_err(read_err)?;
        let mut found = BTreeMap::new();
        for (_, v) in snap.range::<Vec<u8>>((Bound::Included(entry_key(start).to_vec()), key_end)) {
            let e: Entry<Tc> = postcard::from_bytes(&v).map_err(read_err)?;
            found.insert(e.log_id.index, e);
        }
        for e in pending {
            found.insert(e.log_id.index, e);
        }
        Ok(found.into_values().collect())
    }

    fn last_entry(&self) -> Result<Option<Entry<Tc>>> {
        let snap = self.db.snapshot().map_err(read_err)?;
        let last = snap
            .range([ENTRY].as_slice()..[ENTRY + 1].as_slice())
            .next_back();
        match last {
            Some((_, v)) => postcard::from_bytes(&v).map(Some).map_err(read_err),
            None => Ok(None),
        }
    }
}

impl RaftLogReader<Tc> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<Tc>>> {
        let start = match range.start_bound() {
            Bound::Included(&i) => i,
            Bound::Excluded(&i) => i.saturating_add(1),
            Bound::Unbounded => 0,
        };
        // A scan of the log's own database: microseconds, no thread hand-off.
        self.entries(start, range.end_bound().cloned())
    }

    /// What the leader sends a follower: only the run of entries that starts at `start` and
    /// has no gap. openraft sends these as the entries after the one before `start`; a purge
    /// running meanwhile (it deletes from the front, a batch per transaction) could leave a
    /// gap at the front, and the follower would get entries that do not follow the previous
    /// one (openraft's debug assertion in `append_entries` fired once in the replicated
    /// simulation under a loaded CI run). Fewer entries, or none, are allowed: openraft asks
    /// again, finds the purge and sends a snapshot. (`try_get_log_entries` itself may skip
    /// missing entries, as openraft's suite requires.)
    async fn limited_get_log_entries(&mut self, start: u64, end: u64) -> Result<Vec<Entry<Tc>>> {
        let mut next = start;
        let mut run = self.entries(start, Bound::Excluded(end))?;
        let contiguous = run
            .iter()
            .take_while(|e| {
                let ok = e.log_id.index == next;
                next += 1;
                ok
            })
            .count();
        run.truncate(contiguous);
        Ok(run)
    }
}

impl RaftLogStorage<Tc> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<Tc>> {
        let purged: Option<LogId<u64>> = self.get(PURGED)?;
        let pending = self.pending.lock().last_key_value().map(|(_, e)| e.log_id);
        let last = pending.or(self.last_entry()?.map(|e| e.log_id)).or(purged);
        Ok(LogState {
            last_purged_log_id: purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> LogStore {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<()> {
        let this = self.clone();
        let vote = *vote;
        tokio::task::spawn_blocking(move || this.put(VOTE, &vote, Durability::Sync))
            .await
            .map_err(write_err)?
            .map_err(|_| {
                StorageIOError::write_vote(openraft::AnyError::error("vote not saved")).into()
            })
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>> {
        self.get(VOTE)
    }

    async fn save_committed(&mut self, committed: Option<LogId<u64>>) -> Result<()> {
        self.put(COMMITTED, &committed, LAZY)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<u64>>> {
        Ok(self.get::<Option<LogId<u64>>>(COMMITTED)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<Tc>) -> Result<()>
    where
        I: IntoIterator<Item = Entry<Tc>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry<Tc>> = entries.into_iter().collect();
        {
            let mut pending = self.pending.lock();
            for e in &entries {
                pending.insert(e.log_id.index, e.clone());
            }
        }
        let commits = match self.commit_entries(&entries) {
            Ok(c) => c,
            Err(e) => {
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                return Err(e);
            }
        };
        self.submitted.fetch_add(1, SeqCst);
        let flush = Flush {
            commits,
            ids: entries.iter().map(|e| e.log_id).collect(),
            callback,
        };
        if let Err(refused) = self.flushes.send(flush) {
            let flush = refused.0;
            flush
                .callback
                .log_io_completed(Err(std::io::Error::other("the raft log's flusher stopped")));
            return Err(write_err("the raft log's flusher stopped"));
        }
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> Result<()> {
        self.wait_flushed().await?;
        self.pending.lock().retain(|&i, _| i < log_id.index);
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.delete_entries(log_id.index, Bound::Unbounded))
            .await
            .map_err(write_err)?
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result<()> {
        if let Some(durable) = &self.durable
            && !durable.covers(log_id.index)
        {
            durable.wait_for(log_id.index).await;
        }
        self.wait_flushed().await?;
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            // The purge point first: a crash part way leaves entries below it, never a gap.
            this.put(PURGED, &log_id, this.durability)?;
            this.delete_entries(0, Bound::Included(log_id.index))
        })
        .await
        .map_err(write_err)?
    }
}

fn get_in<T: serde::de::DeserializeOwned>(
    snap: &keel::Snapshot<'_>,
    key: &[u8],
) -> std::result::Result<Option<T>, String> {
    match snap.get(key).map_err(|e| e.to_string())? {
        Some(v) => postcard::from_bytes(&v)
            .map(Some)
            .map_err(|e| e.to_string()),
        None => Ok(None),
    }
}

/// The floor of the replica whose log is `db`: the newest last log id it had when it was
/// emptied (`None`: never emptied). Such a replica refuses its vote to a candidate whose last
/// log id is older (`super::vote`), as it would have with its log: a node of an older
/// configuration that still counts it a voter cannot be elected by its empty log, which could
/// then overwrite entries this replica helped commit.
pub fn floor(db: &Db) -> std::result::Result<Option<LogId<u64>>, String> {
    let snap = db.snapshot().map_err(|e| e.to_string())?;
    Ok(get_in::<Option<LogId<u64>>>(&snap, FLOOR)?.flatten())
}

/// Begins emptying the log in `db` (of a replica that left its partition, stopped): in one
/// durable commit, the mark and the floor (the newer of the floor and the last log id).
/// Until [`finish_emptying`] clears the mark, the replica's data and snapshot are being
/// emptied too; an open finishes the job first (`super::finish_emptying`).
pub fn begin_emptying(db: &Db) -> std::result::Result<(), String> {
    /// An engine error, or a value that does not decode.
    struct Failed(String);
    impl From<keel::Error> for Failed {
        fn from(e: keel::Error) -> Failed {
            Failed(e.to_string())
        }
    }
    impl std::fmt::Display for Failed {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(&self.0)
        }
    }
    fn decode<T: serde::de::DeserializeOwned>(
        v: Option<Vec<u8>>,
    ) -> std::result::Result<Option<T>, Failed> {
        v.map(|v| postcard::from_bytes(&v).map_err(|e| Failed(e.to_string())))
            .transpose()
    }
    // Read in the transaction: an append whose commit is still on its way to visibility
    // conflicts with this one, which then runs again and sees it.
    db.transact(|t| {
        t.set_durability(Durability::Sync);
        let last = t
            .range([ENTRY].as_slice()..[ENTRY + 1].as_slice())
            .next_back()
            .map(|(_, v)| v);
        let last: Option<LogId<u64>> = decode::<Entry<Tc>>(last)?.map(|e| e.log_id);
        let purged: Option<LogId<u64>> = decode(t.get(PURGED)?)?;
        let before: Option<Option<LogId<u64>>> = decode(t.get(FLOOR)?)?;
        let floor = last.max(purged).max(before.flatten());
        t.put(
            FLOOR,
            &postcard::to_stdvec(&floor).expect("a log id encodes"),
        )?;
        t.put(EMPTYING, b"")?;
        Ok::<_, Failed>(())
    })
    .map_err(|e| e.to_string())
}

/// Whether the log in `db` is marked as being emptied.
pub fn emptying(db: &Db) -> std::result::Result<bool, String> {
    let snap = db.snapshot().map_err(|e| e.to_string())?;
    Ok(snap.get(EMPTYING).map_err(|e| e.to_string())?.is_some())
}

/// Deletes every key of the log in `db` but its vote and floor, a batch at a time, then the
/// mark.
pub fn finish_emptying(db: &Db) -> std::result::Result<(), String> {
    loop {
        let keys: Vec<Vec<u8>> = db
            .snapshot()
            .map_err(|e| e.to_string())?
            .range::<[u8]>(..)
            .map(|(k, _)| k)
            .filter(|k| ![VOTE, FLOOR, EMPTYING].contains(&k.as_slice()))
            .take(BATCH_KEYS)
            .collect();
        if keys.is_empty() {
            break;
        }
        db.transact(|t| {
            t.set_durability(LAZY);
            keys.iter().try_for_each(|k| t.delete(k))
        })
        .map_err(|e| e.to_string())?;
    }
    db.transact(|t| {
        t.set_durability(Durability::Sync);
        t.delete(EMPTYING)
    })
    .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, EntryPayload};

    use super::*;

    fn entry(index: u64) -> Entry<Tc> {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 0), index),
            payload: EntryPayload::Blank,
        }
    }

    /// What a leader sends starts where it was asked to and has no gap, even while a purge
    /// has deleted only the front of a range; a plain read skips what is missing.
    #[tokio::test]
    async fn what_a_leader_sends_starts_where_asked_and_has_no_gap() {
        let mut store = LogStore::open(Db::in_memory(), Durability::None);
        let entries: Vec<Entry<Tc>> = (1..=8).map(entry).collect();
        for commit in store.commit_entries(&entries).expect("committed") {
            commit.await.expect("no error").expect("no conflict");
        }
        let indexes = |es: Vec<Entry<Tc>>| es.iter().map(|e| e.log_id.index).collect::<Vec<_>>();
        let sent = store.limited_get_log_entries(2, 9).await.expect("read");
        assert_eq!(indexes(sent), [2, 3, 4, 5, 6, 7, 8]);
        // A purge part way: 1 to 3 gone. Asked from 2, nothing (openraft asks again).
        store
            .delete_entries(0, Bound::Included(3))
            .expect("deleted");
        let sent = store.limited_get_log_entries(2, 9).await.expect("read");
        assert!(sent.is_empty(), "{:?}", indexes(sent));
        let read = store.try_get_log_entries(2..9).await.expect("read");
        assert_eq!(indexes(read), [4, 5, 6, 7, 8]);
        // A gap in the middle: what comes before it.
        store
            .delete_entries(6, Bound::Included(6))
            .expect("deleted");
        let sent = store.limited_get_log_entries(4, 9).await.expect("read");
        assert_eq!(indexes(sent), [4, 5]);
    }
}

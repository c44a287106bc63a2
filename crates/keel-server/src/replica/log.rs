//! A partition's Raft log, on a keel database of its own.
//!
//! Keys: `e` + index (8 bytes, big-endian, so entries sort by index) → the entry (postcard);
//! `v` → the vote; `p` → the last purged log id; `c` → the last committed log id known. An
//! append is one engine transaction per batch (at most [`BATCH_KEYS`] entries and
//! [`BATCH_BYTES`] bytes each), committed with the server's durability, so under `sync` it is
//! on disk before openraft hears it was appended; a vote is always fsynced (voting twice in a
//! term after a crash would let two leaders be elected).

// openraft's storage traits return its `StorageError`, which is large; the helpers here
// return it too rather than converting at every call.
#![allow(clippy::result_large_err)]

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};

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

/// The log store and its readers (they share the database).
#[derive(Clone)]
pub struct LogStore {
    db: &'static Db,
    durability: Durability,
}

impl LogStore {
    /// The log kept in `db`; appends commit with `durability`.
    pub fn open(db: &'static Db, durability: Durability) -> std::result::Result<LogStore, String> {
        Ok(LogStore { db, durability })
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

    /// Writes `entries`, a transaction per batch, with the log's durability.
    pub fn write_entries(&self, entries: &[Entry<Tc>]) -> Result<()> {
        let mut encoded = Vec::with_capacity(entries.len());
        for entry in entries {
            let bytes = postcard::to_stdvec(entry).map_err(write_err)?;
            encoded.push((entry_key(entry.log_id.index), bytes));
        }
        let mut rest = encoded.as_slice();
        while !rest.is_empty() {
            let (mut n, mut bytes) = (0, 0);
            while n < rest.len()
                && n < BATCH_KEYS
                && (n == 0 || bytes + rest[n].1.len() <= BATCH_BYTES)
            {
                bytes += rest[n].1.len();
                n += 1;
            }
            let (batch, after) = rest.split_at(n);
            self.db
                .transact(|t| {
                    t.set_durability(self.durability);
                    batch.iter().try_for_each(|(k, v)| t.put(k, v))
                })
                .map_err(write_err)?;
            rest = after;
        }
        Ok(())
    }

    fn entries(&self, start: u64, end: Bound<u64>) -> Result<Vec<Entry<Tc>>> {
        let end = match end {
            Bound::Included(i) => Bound::Included(entry_key(i).to_vec()),
            Bound::Excluded(i) => Bound::Excluded(entry_key(i).to_vec()),
            Bound::Unbounded => Bound::Excluded(vec![ENTRY + 1]),
        };
        let snap = self.db.snapshot().map_err(read_err)?;
        snap.range::<Vec<u8>>((Bound::Included(entry_key(start).to_vec()), end))
            .map(|(_, v)| postcard::from_bytes(&v).map_err(read_err))
            .collect()
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
        let end = range.end_bound().cloned();
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.entries(start, end))
            .await
            .map_err(read_err)?
    }
}

impl RaftLogStorage<Tc> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<Tc>> {
        let purged: Option<LogId<u64>> = self.get(PURGED)?;
        let last = self.last_entry()?.map(|e| e.log_id).or(purged);
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
        let this = self.clone();
        let durability = LAZY;
        tokio::task::spawn_blocking(move || this.put(COMMITTED, &committed, durability))
            .await
            .map_err(write_err)?
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
        let this = self.clone();
        let written = tokio::task::spawn_blocking(move || this.write_entries(&entries))
            .await
            .map_err(write_err)?;
        match written {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                Err(e)
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> Result<()> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.delete_entries(log_id.index, Bound::Unbounded))
            .await
            .map_err(write_err)?
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result<()> {
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

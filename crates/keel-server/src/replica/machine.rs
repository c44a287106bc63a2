//! A partition's state machine: its data, a keel database, to which committed log entries
//! are applied.
//!
//! Each entry is one engine transaction that runs the entry's commands (as `conn` would, with
//! the entry's clock and a generator seeded by its log id, so every replica computes the same
//! effect) and writes the applied marker `FF 'r' 'a'` (the entry's log id and the membership
//! in force) in the same commit: the data and the marker never disagree, so a restart
//! resumes right after the last entry applied, and the commit need not wait for its fsync
//! (the log already has the entry; anything lost is applied again). A command that fails
//! rolls its entry back (as `EXEC` does in keel) and only the marker moves.
//!
//! A snapshot is every key of the database but the markers, with the marker's log id and
//! membership; before it is taken a `sync` commit makes everything it contains durable
//! (openraft cuts the log behind a snapshot). It is written from a consistent engine snapshot
//! a frame of keys at a time (`snapfile`) to a file of its own in `<dir>/raft-<p>/`, synced
//! and renamed to `snapshot`, the current snapshot: memory holds a frame, never the whole
//! partition. A received snapshot arrives chunk by chunk in a file beside it, is checked
//! whole (a truncated or damaged file is refused before anything is replaced), synced and
//! renamed to `snapshot`, then read into the database a frame (one transaction) at a time: a
//! crash during the install is finished from the file on the next start. [`Durable`] says
//! which log id that file covers (the log store cuts the log no further); it is renamed by
//! one writer at a time, and never goes back to an older snapshot (a build that started
//! before an install finished). With no data directory the same bytes are kept in memory.

// openraft's storage traits return its `StorageError`, which is large; the helpers here
// return it too rather than converting at every call.
#![allow(clippy::result_large_err)]

use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use bytes::{Bytes, BytesMut};
use keel::{Db, Durability};
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine, Snapshot};
use openraft::{
    Entry, EntryPayload, LogId, OptionalSend, SnapshotMeta, StorageError, StorageIOError,
    StoredMembership,
};
use serde::{Deserialize, Serialize};

use super::snapfile::{self, Meta, SnapData};
use super::{Op, Request, Response, Status, Tc, prepared};
use crate::data::{self, Ctx, Fail, View};
use crate::keyspace::Clock;
use crate::reply::Out;
use crate::table;

/// Commits whose loss a crash may cause (the log has what they did): on a database with
/// files they are logged and made durable by the next `sync` commit.
pub(super) const LAZY: Durability = Durability::None;

/// The applied marker: `(last applied log id, membership)`.
pub(super) const APPLIED: &[u8] = &[0xFF, b'r', b'a'];
/// Written with `sync` before a snapshot is taken.
const SYNC: &[u8] = &[0xFF, b'r', b's'];
/// A group of writes (`Op::Many`) cut short: its log index and how many of its writes are
/// in (8 + 4 bytes, big-endian), from the commit of its first write to that of its last,
/// which deletes it (`execute_group`). Part of a snapshot's data, as the writes are.
const GROUP: &[u8] = &[0xFF, b'r', b'g'];
/// The replication keys' prefix (the markers, and the records of transactions across
/// partitions, which are part of a snapshot's data).
const MARKERS: &[u8] = &[0xFF, b'r'];

/// The snapshot file's name in the partition's log directory.
pub const SNAPSHOT_FILE: &str = "snapshot";

/// Deletes every key of `db` (a replica's data, as it is emptied: `super::empty`), a batch
/// at a time. A crash part way leaves the log's mark (`log::begin_emptying`), and the next
/// open finishes the job before anything reads the data.
pub fn wipe(db: &Db) -> std::result::Result<(), String> {
    loop {
        let keys: Vec<Vec<u8>> = db
            .snapshot()
            .map_err(|e| e.to_string())?
            .range::<[u8]>(..)
            .take(BATCH_KEYS)
            .map(|(k, _)| k)
            .collect();
        if keys.is_empty() {
            break;
        }
        db.transact(|t| {
            t.set_durability(LAZY);
            keys.iter().try_for_each(|k| t.delete(k))
        })
        .map_err(|e: keel::TransactError<keel::Error>| e.to_string())?;
    }
    // Durable before the log's mark goes: a commit with `sync` makes the deletions before
    // it durable too.
    for put in [true, false] {
        db.transact(|t| {
            t.set_durability(Durability::Sync);
            if put {
                t.put(SYNC, b"")
            } else {
                t.delete(SYNC)
            }
        })
        .map_err(|e: keel::TransactError<keel::Error>| e.to_string())?;
    }
    Ok(())
}

/// Whether `key` is one of the markers, which a snapshot does not carry.
fn is_marker(key: &[u8]) -> bool {
    key == APPLIED || key == SYNC
}

/// Most keys one transaction of a wipe deletes.
const BATCH_KEYS: usize = 4096;
/// Attempts at an entry's transaction (nothing else writes the database, so a conflict is
/// not expected; an expired key deleted by a read on the leader is the one way).
pub(super) const APPLY_ATTEMPTS: u32 = 16;

type Membership = StoredMembership<u64, openraft::BasicNode>;
type Result<T> = std::result::Result<T, StorageError<u64>>;

pub(super) fn sm_err(e: impl ToString) -> StorageError<u64> {
    StorageIOError::write_state_machine(openraft::AnyError::error(e.to_string())).into()
}

fn snap_err(e: impl ToString) -> StorageError<u64> {
    StorageIOError::write_snapshot(None, openraft::AnyError::error(e.to_string())).into()
}

#[derive(Serialize, Deserialize)]
struct Marker {
    applied: Option<LogId<u64>>,
    membership: Membership,
}

/// A partition's state machine.
pub struct Machine {
    db: Db,
    /// Where the current snapshot is kept (`None`: in memory only).
    dir: Option<PathBuf>,
    applied: Option<LogId<u64>>,
    membership: Membership,
    /// The current snapshot, when there is no directory to keep it in.
    current: Current,
    durable: Durable,
    /// The keys locked by prepared transactions (see `prepared`).
    locks: prepared::Shared,
    /// Told each command of an applied entry that may push into a list (see [`Pushed`]).
    pushed: Option<Pushed>,
}

/// Told, on this node, each command of a log entry applied here (leader or follower) that
/// may have pushed into a list: the server wakes the clients blocked on its key
/// (`blocking::Registry::applied`).
pub type Pushed = std::sync::Arc<dyn Fn(&[Vec<u8>]) + Send + Sync>;

/// The last log id covered by the snapshot that survives a crash (the snapshot file; with no
/// directory, the one in memory), shared with the builders and the log store, which cuts the
/// log no further than it.
#[derive(Clone, Default)]
pub struct Durable(std::sync::Arc<DurableState>);

#[derive(Default)]
struct DurableState {
    last: tokio::sync::watch::Sender<Option<LogId<u64>>>,
    /// Whether a snapshot from the leader is being received or installed: from openraft's
    /// `begin_receiving_snapshot` to the end of the install.
    receiving: tokio::sync::watch::Sender<bool>,
    /// Held while a snapshot file is renamed to the current one: one writer at a time.
    writing: parking_lot::Mutex<()>,
}

impl Durable {
    /// The last log id covered.
    pub fn get(&self) -> Option<LogId<u64>> {
        *self.0.last.borrow()
    }

    /// Whether entry `index` is covered.
    pub fn covers(&self, index: u64) -> bool {
        self.get().is_some_and(|l| l.index >= index)
    }

    /// Whether a snapshot from the leader is being received or installed.
    pub fn receiving(&self) -> bool {
        *self.0.receiving.borrow()
    }

    /// Waits while a snapshot from the leader is being received or installed, until entry
    /// `index` is covered or the install is over (done, or failed).
    pub async fn wait_for(&self, index: u64) {
        let (mut last, mut receiving) = (self.0.last.subscribe(), self.0.receiving.subscribe());
        // The senders live as long as `self`.
        while !self.covers(index) && self.receiving() {
            tokio::select! {
                _ = last.changed() => {}
                _ = receiving.changed() => {}
            }
        }
    }

    /// Runs `write` (which makes a snapshot file the current one) if `last` is past what is
    /// covered, alone, then covers `last`; whether it ran.
    fn write_past(
        &self,
        last: Option<LogId<u64>>,
        write: impl FnOnce() -> Result<()>,
    ) -> Result<bool> {
        let _alone = self.0.writing.lock();
        if last <= self.get() {
            return Ok(false);
        }
        write()?;
        self.0.last.send_replace(last);
        Ok(true)
    }
}

/// A snapshot kept in memory (no data directory), shared with the builders: its meta and
/// its bytes (the file's format).
type Current = std::sync::Arc<parking_lot::Mutex<Option<(Meta, std::sync::Arc<Vec<u8>>)>>>;

/// Builds snapshots of a [`Machine`]'s database.
pub struct Builder {
    db: Db,
    dir: Option<PathBuf>,
    current: Current,
    durable: Durable,
}

impl Machine {
    /// The state machine on `db`, finishing a snapshot install a crash interrupted.
    pub async fn open(db: Db, dir: Option<PathBuf>) -> Result<Machine> {
        let marker = read_marker(&db)?;
        let mut machine = Machine {
            db: db.clone(),
            dir,
            applied: marker.applied,
            membership: marker.membership,
            current: Current::default(),
            durable: Durable::default(),
            locks: prepared::Shared::default(),
            pushed: None,
        };
        let (path, applied) = (machine.file_path(), machine.applied);
        let installing = db.clone();
        let file = tokio::task::spawn_blocking(move || -> Result<Option<Meta>> {
            let Some(path) = path else {
                return Ok(None);
            };
            snapfile::remove_temps(&path).map_err(snap_err)?;
            let Some((meta, file)) = open_current(&path)? else {
                return Ok(None);
            };
            if meta.last_log_id > applied {
                tracing::info!(
                    "finishing the install of snapshot {} interrupted by a stop",
                    meta.snapshot_id
                );
                install_from(&installing, &meta, file).map_err(|e| {
                    snap_err(format!(
                        "{}: finishing the install of snapshot {}: {e}",
                        path.display(),
                        meta.snapshot_id
                    ))
                })?;
            }
            Ok(Some(meta))
        })
        .await
        .map_err(sm_err)??;
        machine
            .durable
            .0
            .last
            .send_replace(file.as_ref().and_then(|m| m.last_log_id));
        if let Some(meta) = file
            && meta.last_log_id > machine.applied
        {
            machine.applied = meta.last_log_id;
            machine.membership = meta.last_membership;
        }
        machine.locks.lock().load(&db)?;
        Ok(machine)
    }

    /// The lock table, which readers check with their snapshot.
    pub fn locks(&self) -> prepared::Shared {
        std::sync::Arc::clone(&self.locks)
    }

    /// From now on, `pushed` is told the commands of the entries applied here.
    pub fn on_push(&mut self, pushed: Pushed) {
        self.pushed = Some(pushed);
    }

    /// The voters of the membership this partition's replica last knew (applied, or the
    /// initial entry still in its log), if it knows one.
    pub async fn stored_voters(
        &self,
        log: &super::log::LogStore,
    ) -> Option<std::collections::BTreeSet<u64>> {
        let applied: std::collections::BTreeSet<u64> = self.membership.voter_ids().collect();
        if !applied.is_empty() {
            return Some(applied);
        }
        let mut reader = log.clone();
        let first = openraft::storage::RaftLogReader::try_get_log_entries(&mut reader, 0..1)
            .await
            .ok()?;
        match &first.first()?.payload {
            EntryPayload::Membership(m) => Some(m.voter_ids().collect()),
            _ => None,
        }
    }

    /// The last log id the snapshot that survives a crash covers (see [`Durable`]).
    pub fn durable(&self) -> Durable {
        self.durable.clone()
    }

    /// The partition's data.
    #[cfg(test)]
    pub(super) fn db(&self) -> &Db {
        &self.db
    }

    fn installer(&self) -> Installer {
        Installer {
            db: self.db.clone(),
            current: self.file_path(),
            durable: self.durable.clone(),
            memory: std::sync::Arc::clone(&self.current),
        }
    }

    /// As `install_snapshot`, with the file and database work on this thread (to measure
    /// what it holds): what it read, and the most bytes this thread held at once during it
    /// above what it held at the end (the data installed stays).
    #[cfg(test)]
    pub(super) async fn install_here(
        &mut self,
        meta: &Meta,
        data: SnapData,
    ) -> Result<(snapfile::Stats, usize)> {
        let received = Received::from(data).await;
        let installer = self.installer();
        let (installed, peak, end) = snapfile::counting::measure(|| installer.run(received, meta));
        self.durable.0.receiving.send_replace(false);
        let stats = installed?;
        self.locks.lock().load(&self.db)?;
        self.applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        Ok((stats, peak.saturating_sub(end.max(0)) as usize))
    }

    fn file_path(&self) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| d.join(SNAPSHOT_FILE))
    }
}

/// The snapshot file at `path`, if there is one: its meta, and the file open at its start. A
/// file of format version 1 is converted first.
fn open_current(path: &Path) -> Result<Option<(Meta, std::fs::File)>> {
    let open = || match std::fs::File::open(path) {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(file_err(path, e)),
    };
    let Some(mut file) = open()? else {
        return Ok(None);
    };
    let mut head = Vec::with_capacity(8);
    (&mut file)
        .take(8)
        .read_to_end(&mut head)
        .map_err(|e| file_err(path, e))?;
    if let snapfile::Kind::Legacy = snapfile::kind_of(&head) {
        tracing::info!(
            "{}: converting a snapshot file of format version 1",
            path.display()
        );
        snapfile::convert_legacy(path).map_err(snap_err)?;
        let Some(again) = open()? else {
            return Ok(None);
        };
        file = again;
    }
    let meta = (|| {
        file.seek(SeekFrom::Start(0))?;
        let len = file.metadata()?.len();
        let reader = snapfile::Reader::open(BufReader::new(&mut file), len)
            .map_err(|e| std::io::Error::other(e.0))?;
        let meta = reader.meta().clone();
        file.seek(SeekFrom::Start(0))?;
        Ok(meta)
    })()
    .map_err(|e: std::io::Error| file_err(path, e))?;
    Ok(Some((meta, file)))
}

fn file_err(path: &Path, e: std::io::Error) -> StorageError<u64> {
    snap_err(format!("{}: {e}", path.display()))
}

/// Whether `db` holds any key but the replication markers.
pub fn holds_data(db: &Db) -> bool {
    db.snapshot()
        .is_ok_and(|snap| snap.range::<[u8]>(..).any(|(k, _)| !k.starts_with(MARKERS)))
}

fn read_marker(db: &Db) -> Result<Marker> {
    let snap = db.snapshot().map_err(sm_err)?;
    match snap.get(APPLIED).map_err(sm_err)? {
        Some(v) => postcard::from_bytes(&v).map_err(sm_err),
        None => Ok(Marker {
            applied: None,
            membership: Membership::default(),
        }),
    }
}

/// A snapshot's bytes, for an install: a synced file of this partition's directory at its
/// temporary name (removed when the guard drops, unless renamed to the current snapshot
/// first), or, with no directory, in memory.
enum Source {
    File(std::fs::File, snapfile::Temp),
    Memory(Vec<u8>),
}

/// What an install needs of its [`Machine`], to run on a blocking thread.
struct Installer {
    db: Db,
    current: Option<PathBuf>,
    durable: Durable,
    memory: Current,
}

impl Installer {
    /// Installs the snapshot `meta`, received as `received`: checked whole, made the current
    /// snapshot (durable, before anything is replaced), then read into the database a frame
    /// at a time; what was read.
    fn run(self, received: Received, meta: &Meta) -> Result<snapfile::Stats> {
        let Installer {
            db,
            current,
            durable,
            memory,
        } = self;
        match received.into_source(current.as_deref())? {
            Source::File(mut file, temp) => {
                let current = current.expect("a file source has a directory");
                // Whole, and the snapshot announced, before it replaces anything.
                let len = check(&mut file, meta).map_err(|e| refused(meta, e))?;
                // Durable under its name before the data goes: a crash from here on is
                // finished from it at the next start.
                durable.write_past(meta.last_log_id, || {
                    std::fs::rename(temp.path(), &current)
                        .and_then(|()| snapfile::sync_dir(&current))
                        .map_err(|e| file_err(&current, e))
                })?;
                install_checked(&db, meta, file, len)
            }
            Source::Memory(bytes) => {
                let len =
                    check(std::io::Cursor::new(&bytes), meta).map_err(|e| refused(meta, e))?;
                let bytes = std::sync::Arc::new(bytes);
                durable.write_past(meta.last_log_id, || {
                    *memory.lock() = Some((meta.clone(), std::sync::Arc::clone(&bytes)));
                    Ok(())
                })?;
                install_checked(&db, meta, std::io::Cursor::new(&bytes[..]), len)
            }
        }
    }
}

fn refused(meta: &Meta, why: String) -> StorageError<u64> {
    snap_err(format!(
        "snapshot {} refused, nothing installed: {why}",
        meta.snapshot_id
    ))
}

/// What openraft hands an install, taken out of tokio's file once its writes are done.
enum Received {
    File(std::fs::File, Option<snapfile::Temp>),
    Memory(Vec<u8>),
}

impl Received {
    async fn from(data: SnapData) -> Received {
        match data {
            SnapData::File { file, temp } => Received::File(file.into_std().await, temp),
            SnapData::Memory(c) => Received::Memory(c.into_inner()),
        }
    }

    /// As a [`Source`] for a machine whose current snapshot is at `current` (if it has a
    /// directory): a file received into that directory is used as it is; anything else is
    /// copied there, a buffer at a time.
    fn into_source(self, current: Option<&Path>) -> Result<Source> {
        let Some(current) = current else {
            return match self {
                Received::Memory(bytes) => Ok(Source::Memory(bytes)),
                Received::File(mut file, _) => {
                    let mut bytes = Vec::new();
                    file.seek(SeekFrom::Start(0))
                        .and_then(|_| file.read_to_end(&mut bytes))
                        .map_err(snap_err)?;
                    Ok(Source::Memory(bytes))
                }
            };
        };
        match self {
            Received::File(file, Some(temp)) if temp.path().parent() == current.parent() => {
                file.sync_all().map_err(|e| file_err(temp.path(), e))?;
                Ok(Source::File(file, temp))
            }
            other => {
                let temp = snapfile::Temp::beside(current);
                let copy = || -> std::io::Result<std::fs::File> {
                    let mut out = std::fs::File::options()
                        .read(true)
                        .write(true)
                        .create_new(true)
                        .open(temp.path())?;
                    match other {
                        Received::File(mut file, _) => {
                            file.seek(SeekFrom::Start(0))?;
                            std::io::copy(&mut file, &mut out)?;
                        }
                        Received::Memory(bytes) => std::io::Write::write_all(&mut out, &bytes)?,
                    }
                    out.sync_all()?;
                    Ok(out)
                };
                let file = copy().map_err(|e| file_err(temp.path(), e))?;
                Ok(Source::File(file, temp))
            }
        }
    }
}

/// Reads a received snapshot (`data`, written to its end) through as an install does before
/// it replaces anything ([`check`]): handed back if it is whole and the snapshot `meta`,
/// else why not (then it is dropped, and its file with it).
pub(super) async fn verify_received(
    data: Box<SnapData>,
    meta: &Meta,
) -> std::result::Result<Box<SnapData>, String> {
    let meta = meta.clone();
    match *data {
        SnapData::File { file, temp } => {
            let mut file = file.into_std().await;
            let checked =
                tokio::task::spawn_blocking(move || check(&mut file, &meta).map(|_| file))
                    .await
                    .map_err(|e| e.to_string())??;
            Ok(Box::new(SnapData::File {
                file: tokio::fs::File::from_std(checked),
                temp,
            }))
        }
        SnapData::Memory(bytes) => {
            let checked = tokio::task::spawn_blocking(move || {
                let mut bytes = bytes;
                check(&mut bytes, &meta).map(|_| bytes)
            })
            .await
            .map_err(|e| e.to_string())??;
            Ok(Box::new(SnapData::Memory(checked)))
        }
    }
}

/// Installs the snapshot `meta` from `inp`: checked whole first ([`check`]), then
/// [`install_checked`].
fn install_from(db: &Db, meta: &Meta, mut inp: impl Read + Seek) -> Result<snapfile::Stats> {
    let len = check(&mut inp, meta).map_err(snap_err)?;
    install_checked(db, meta, inp, len)
}

/// Reads all of `inp` (a snapshot file), a frame at a time, and refuses it if any frame is
/// damaged, it is cut short, or it is not the snapshot `meta`; its length.
fn check(mut inp: impl Read + Seek, meta: &Meta) -> std::result::Result<u64, String> {
    let len = inp.seek(SeekFrom::End(0)).map_err(|e| e.to_string())?;
    inp.seek(SeekFrom::Start(0)).map_err(|e| e.to_string())?;
    let (found, _) = snapfile::verify(BufReader::new(&mut inp), len).map_err(|e| e.0)?;
    if found != *meta {
        return Err(format!(
            "the snapshot file holds snapshot {} (up to {:?}), not the {} (up to {:?}) being \
             installed",
            found.snapshot_id, found.last_log_id, meta.snapshot_id, meta.last_log_id
        ));
    }
    Ok(len)
}

/// Replaces everything in `db` with the snapshot in `inp` (`len` bytes, already checked),
/// one transaction per frame, then sets the marker (with `sync`); what it read.
fn install_checked(
    db: &Db,
    meta: &Meta,
    mut inp: impl Read + Seek,
    len: u64,
) -> Result<snapfile::Stats> {
    // Everything but the marker goes, a batch at a time; the marker still names the old
    // state, and the snapshot file finishes the install after a crash.
    loop {
        let snap = db.snapshot().map_err(sm_err)?;
        let keys: Vec<Vec<u8>> = snap
            .range::<[u8]>(..)
            .filter(|(k, _)| k.as_slice() != APPLIED)
            .take(BATCH_KEYS)
            .map(|(k, _)| k)
            .collect();
        drop(snap);
        if keys.is_empty() {
            break;
        }
        db.transact(|t| {
            t.set_durability(LAZY);
            keys.iter().try_for_each(|k| t.delete(k))
        })
        .map_err(sm_err)?;
    }
    inp.seek(SeekFrom::Start(0)).map_err(snap_err)?;
    let mut reader = snapfile::Reader::open(BufReader::new(inp), len).map_err(snap_err)?;
    while let Some(batch) = reader.next_batch().map_err(snap_err)? {
        db.transact(|t| {
            t.set_durability(LAZY);
            batch.iter().try_for_each(|(k, v)| t.put(k, v))
        })
        .map_err(sm_err)?;
    }
    let marker = postcard::to_stdvec(&Marker {
        applied: meta.last_log_id,
        membership: meta.last_membership.clone(),
    })
    .map_err(sm_err)?;
    db.transact(|t| {
        t.set_durability(Durability::Sync);
        t.put(APPLIED, &marker)
    })
    .map_err(sm_err)?;
    Ok(reader.stats())
}

/// A snapshot just built: an open file (read from its start), or the bytes.
pub(super) enum Built {
    File(std::fs::File),
    Memory(Vec<u8>),
}

/// Writes every key of `snap` but the markers to `out` as a snapshot file of `meta`.
fn write_pairs<W: std::io::Write>(
    out: W,
    meta: &Meta,
    snap: &keel::Snapshot<'_>,
) -> std::io::Result<(W, snapfile::Stats)> {
    let mut writer = snapfile::Writer::new(out, meta)?;
    for (k, v) in snap.range::<[u8]>(..) {
        if !is_marker(&k) {
            writer.push(k, v)?;
        }
    }
    writer.finish()
}

/// Takes a snapshot of `db` (after making everything in it durable) and writes it, a frame at
/// a time, to a new file beside `current`, synced, which becomes the current snapshot if it
/// is newer than what `durable` covers (with no directory, into memory, kept in `memory`).
pub(super) fn build(
    db: &Db,
    current: Option<&Path>,
    durable: &Durable,
    memory: &Current,
) -> Result<(Meta, Built, snapfile::Stats)> {
    db.transact(|t| {
        t.set_durability(Durability::Sync);
        t.put(SYNC, b"")
    })
    .map_err(snap_err)?;
    let snap = db.snapshot().map_err(snap_err)?;
    let marker: Marker = match snap.get(APPLIED).map_err(snap_err)? {
        Some(v) => postcard::from_bytes(&v).map_err(snap_err)?,
        None => Marker {
            applied: None,
            membership: Membership::default(),
        },
    };
    let id = match marker.applied {
        Some(l) => format!(
            "{}-{}-{}",
            l.leader_id,
            l.index,
            crate::data::random() % 1_000_000
        ),
        None => format!("empty-{}", crate::data::random() % 1_000_000),
    };
    let meta = SnapshotMeta {
        last_log_id: marker.applied,
        last_membership: marker.membership,
        snapshot_id: id,
    };
    let Some(current) = current else {
        let (bytes, stats) = write_pairs(Vec::new(), &meta, &snap).map_err(snap_err)?;
        drop(snap);
        let bytes = std::sync::Arc::new(bytes);
        durable.write_past(meta.last_log_id, || {
            *memory.lock() = Some((meta.clone(), std::sync::Arc::clone(&bytes)));
            Ok(())
        })?;
        let bytes = std::sync::Arc::unwrap_or_clone(bytes);
        return Ok((meta, Built::Memory(bytes), stats));
    };
    let temp = snapfile::Temp::beside(current);
    let written = (|| -> std::io::Result<_> {
        let file = std::fs::File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(temp.path())?;
        let out = std::io::BufWriter::with_capacity(64 << 10, file);
        let (out, stats) = write_pairs(out, &meta, &snap)?;
        let mut file = out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        file.seek(SeekFrom::Start(0))?;
        Ok((file, stats))
    })();
    drop(snap);
    let (file, stats) = written.map_err(|e| file_err(temp.path(), e))?;
    // Never an older snapshot over a newer one (an install may have finished while this one
    // was built); the file stays readable either way.
    durable.write_past(meta.last_log_id, || {
        std::fs::rename(temp.path(), current)
            .and_then(|()| snapfile::sync_dir(current))
            .map_err(|e| file_err(current, e))
    })?;
    Ok((meta, Built::File(file), stats))
}

#[cfg(test)]
impl Builder {
    /// As `build_snapshot`, on this thread: the meta, the file (or bytes), what went in, and
    /// the most bytes this thread held at once while it built.
    pub(super) fn build_here(&self) -> Result<(Meta, Built, snapfile::Stats, usize)> {
        let current = self.dir.as_ref().map(|d| d.join(SNAPSHOT_FILE));
        let (built, peak, _) = snapfile::counting::measure(|| {
            build(&self.db, current.as_deref(), &self.durable, &self.current)
        });
        let (meta, built, stats) = built?;
        Ok((meta, built, stats, peak.max(0) as usize))
    }
}

impl RaftSnapshotBuilder<Tc> for Builder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<Tc>> {
        let (db, current) = (
            self.db.clone(),
            self.dir.as_ref().map(|d| d.join(SNAPSHOT_FILE)),
        );
        let (durable, memory) = (self.durable.clone(), std::sync::Arc::clone(&self.current));
        let (meta, built, stats) =
            tokio::task::spawn_blocking(move || build(&db, current.as_deref(), &durable, &memory))
                .await
                .map_err(snap_err)??;
        tracing::debug!(
            "snapshot {} built: {} keys, {} bytes in {} frames",
            meta.snapshot_id,
            stats.pairs,
            stats.bytes,
            stats.frames
        );
        let data = match built {
            Built::File(file) => SnapData::File {
                file: tokio::fs::File::from_std(file),
                temp: None,
            },
            Built::Memory(bytes) => SnapData::Memory(std::io::Cursor::new(bytes)),
        };
        Ok(Snapshot {
            meta,
            snapshot: Box::new(data),
        })
    }
}

impl RaftStateMachine<Tc> for Machine {
    type SnapshotBuilder = Builder;

    async fn applied_state(&mut self) -> Result<(Option<LogId<u64>>, Membership)> {
        Ok((self.applied, self.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Response>>
    where
        I: IntoIterator<Item = Entry<Tc>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry<Tc>> = entries.into_iter().collect();
        let (db, mut membership) = (&self.db, self.membership.clone());
        let mut applied = self.applied;
        let locks = std::sync::Arc::clone(&self.locks);
        let pushed = self.pushed.clone();
        // Engine work without fsyncs (the commits are lazy): done here, no thread hand-off.
        let (responses, membership, applied) = (move || {
            let mut responses = Vec::with_capacity(entries.len());
            for entry in entries {
                let log_id = entry.log_id;
                // Where the log stood before this entry: what a group's writes but its last
                // leave the marker at.
                let previous = applied;
                applied = Some(log_id);
                if let EntryPayload::Membership(m) = &entry.payload {
                    membership = StoredMembership::new(Some(log_id), m.clone());
                }
                let marker = postcard::to_stdvec(&Marker {
                    applied: Some(log_id),
                    membership: membership.clone(),
                })
                .map_err(sm_err)?;
                let response = match &entry.payload {
                    EntryPayload::Normal(request) => {
                        // Held while the entry applies: readers see the lock table and the
                        // data after the same entries.
                        let mut locks = locks.lock();
                        let seed = entry_seed(locks.partition(), log_id);
                        match &request.op {
                            Op::Run => execute(
                                db,
                                &mut locks,
                                request,
                                Mark::entry(&marker),
                                seed,
                                log_id.index,
                            )?,
                            Op::Many(requests) => execute_group(
                                db,
                                &mut locks,
                                requests,
                                (
                                    &marker,
                                    &postcard::to_stdvec(&Marker {
                                        applied: previous,
                                        membership: membership.clone(),
                                    })
                                    .map_err(sm_err)?,
                                ),
                                seed,
                                log_id.index,
                            )?,
                            _ => {
                                // A participant's commit installs its prepared commands:
                                // their pushes wake clients as an applied command's do.
                                let installed = match (&pushed, &request.op) {
                                    (Some(_), Op::Commit { txn, .. }) => {
                                        locks.prepared_commands(txn)
                                    }
                                    _ => None,
                                };
                                let response = prepared::apply(
                                    db,
                                    &mut locks,
                                    request,
                                    &marker,
                                    seed,
                                    log_id.index,
                                )?;
                                tracing::debug!(
                                    "partition {} applied {} at {log_id}: {:?}",
                                    locks.partition(),
                                    step_name(&request.op),
                                    response.status
                                );
                                if let (Some(pushed), Some(commands)) = (&pushed, installed) {
                                    commands.iter().for_each(|c| pushed(c));
                                }
                                response
                            }
                        }
                    }
                    _ => {
                        put_marker(db, Mark::entry(&marker))?;
                        Response::default()
                    }
                };
                // After the entry's commit: a client woken now pops through the log, after it.
                if let (Some(pushed), EntryPayload::Normal(request)) = (&pushed, &entry.payload) {
                    tell_pushes(pushed, request, &response);
                }
                responses.push(response);
            }
            Ok::<_, StorageError<u64>>((responses, membership, applied))
        })()?;
        self.membership = membership;
        self.applied = applied;
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> Builder {
        Builder {
            db: self.db.clone(),
            dir: self.dir.clone(),
            current: std::sync::Arc::clone(&self.current),
            durable: self.durable.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<SnapData>> {
        self.durable.0.receiving.send_replace(true);
        let Some(current) = self.file_path() else {
            return Ok(Box::new(SnapData::Memory(std::io::Cursor::new(Vec::new()))));
        };
        // A file of its own beside the current snapshot, which the install renames (and
        // which goes when openraft drops it unfinished: a newer snapshot, a stop).
        let temp = snapfile::Temp::beside(&current);
        let file = tokio::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(temp.path())
            .await
            .map_err(|e| file_err(temp.path(), e))?;
        Ok(Box::new(SnapData::File {
            file,
            temp: Some(temp),
        }))
    }

    async fn install_snapshot(&mut self, meta: &Meta, snapshot: Box<SnapData>) -> Result<()> {
        let installer = self.installer();
        let received = Received::from(*snapshot).await;
        let meta2 = meta.clone();
        let installed = tokio::task::spawn_blocking(move || installer.run(received, &meta2)).await;
        // Done, or failed: a purge waiting for this snapshot goes ahead either way.
        self.durable.0.receiving.send_replace(false);
        let stats = installed.map_err(sm_err)??;
        tracing::debug!(
            "snapshot {} installed: {} keys, {} bytes in {} frames",
            meta.snapshot_id,
            stats.pairs,
            stats.bytes,
            stats.frames
        );
        self.locks.lock().load(&self.db)?;
        self.applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<Tc>>> {
        let Some(current) = self.file_path() else {
            let kept = self.current.lock().clone();
            return Ok(kept.map(|(meta, bytes)| Snapshot {
                meta,
                snapshot: Box::new(SnapData::Memory(std::io::Cursor::new(bytes.to_vec()))),
            }));
        };
        let opened = tokio::task::spawn_blocking(move || open_current(&current))
            .await
            .map_err(snap_err)??;
        Ok(opened.map(|(meta, file)| Snapshot {
            meta,
            snapshot: Box::new(SnapData::File {
                file: tokio::fs::File::from_std(file),
                temp: None,
            }),
        }))
    }
}

/// A transaction step as the logs name it: its kind and transaction.
fn step_name(op: &Op) -> String {
    match op {
        Op::Prepare {
            txn, coordinator, ..
        } => format!("prepare {txn:?} (coordinator {coordinator})"),
        Op::Decide {
            txn, participants, ..
        } => format!("decide {txn:?} (participants {participants:?})"),
        Op::Commit { txn, .. } => format!("commit {txn:?}"),
        Op::Abort { txn, .. } => format!("abort {txn:?}"),
        Op::Resolve { txn, .. } => format!("resolve {txn:?}"),
        Op::Forget { txn } => format!("forget {txn:?}"),
        Op::MoveOut { txn, .. } => format!("move-out {txn:?}"),
        Op::MoveIn { txn, .. } => format!("move-in {txn:?}"),
        Op::MoveChunk { txn, .. } => format!("move-chunk {txn:?}"),
        Op::MoveStage { txn, .. } => format!("move-stage {txn:?}"),
        Op::View { expect, .. } => format!("view (expecting epoch {expect})"),
        Op::Watch => "watch".into(),
        Op::ReadDecide { txn, .. } => format!("read-decide {txn:?}"),
        Op::Run | Op::Many(_) => "a write".into(),
    }
}

/// Tells `pushed` the commands of `request` that may have written a key (it applied with
/// `response`): a command run alone, an `EXEC`'s, a group's, a coordinator's own in its
/// decision. (A participant's commit of a transaction across partitions is told where it
/// applies: its commands are in the prepared record.)
fn tell_pushes(pushed: &Pushed, request: &Request, response: &Response) {
    match &request.op {
        Op::Run | Op::Decide { .. }
            if matches!(response.status, Status::Done | Status::Committed) =>
        {
            request.commands.iter().for_each(|c| pushed(c));
        }
        // A member that did not apply only costs its woken client a look.
        Op::Many(requests) => requests
            .iter()
            .filter(|r| matches!(r.op, Op::Run))
            .flat_map(|r| &r.commands)
            .for_each(|c| pushed(c)),
        _ => {}
    }
}

/// Applies one request to `db` with `marker` as the new applied marker, drawing random
/// numbers from `seed`; returns the reply. Nothing applies (`Busy`) if a key it touches is
/// locked by a prepared transaction.
/// Applies a group of writes (`Op::Many`): each as an entry of its own would apply, in
/// order, with random numbers of its own; each one's response, encoded, in `replies`.
///
/// Each write commits on its own, so the marker moves to this entry only with the last one:
/// the others leave it where the log stood before the entry (`before`) and record how many
/// of the group's writes are in (`GROUP`). A crash between two of them (the data's commits
/// are lazy, and a kill loses the tail not yet written) then applies the entry again, past
/// the writes that were in; it used to find the marker at the entry after the first write,
/// and the rest of the group lost on that replica alone.
fn execute_group(
    db: &Db,
    locks: &mut prepared::Locks,
    requests: &[Request],
    (marker, before): (&[u8], &[u8]),
    seed: u64,
    index: u64,
) -> Result<Response> {
    let mut replies = Vec::with_capacity(requests.len());
    let done = group_done(db, index)?;
    for (i, request) in requests.iter().enumerate() {
        let seed = seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mark = if requests.len() == 1 {
            Mark::entry(marker)
        } else if i + 1 == requests.len() {
            Mark {
                applied: marker,
                group: Group::Last,
            }
        } else {
            Mark {
                applied: before,
                group: Group::Member {
                    index,
                    done: u32::try_from(i + 1).expect("groups are small"),
                },
            }
        };
        let response = match request.op {
            // In before a crash cut the group short: nobody waits for its answer now (a
            // write with an id that asks again gets the answer it kept).
            Op::Run if i < done => Response::default(),
            Op::Run => {
                let response = execute(db, locks, request, mark, seed, index)?;
                #[cfg(test)]
                if CRASH_IN_GROUP_AFTER.with(std::cell::Cell::get) == Some(i + 1) {
                    return Err(sm_err("stopped inside a group, as a crash would"));
                }
                response
            }
            _ => Response {
                reply: b"ERR keel: only writes go into a group".to_vec(),
                status: Status::Failed,
                ..Response::default()
            },
        };
        replies.push(postcard::to_stdvec(&response).map_err(sm_err)?);
    }
    if requests.is_empty() {
        put_marker(db, Mark::entry(marker))?;
    }
    Ok(Response {
        replies,
        ..Response::default()
    })
}

#[cfg(test)]
thread_local! {
    /// Tests: a group's apply stops, as a crash would, once this many of its writes are in.
    pub(super) static CRASH_IN_GROUP_AFTER: std::cell::Cell<Option<usize>> =
        const { std::cell::Cell::new(None) };
}

/// How an entry's commit moves the applied marker (`APPLIED`): to `applied`, and inside a
/// group of writes also the group's progress ([`GROUP`], see [`execute_group`]).
#[derive(Clone, Copy)]
pub struct Mark<'a> {
    applied: &'a [u8],
    group: Group,
}

#[derive(Clone, Copy)]
enum Group {
    /// A whole entry.
    None,
    /// A group's write, not its last: `done` of the group's writes are in with it.
    Member { index: u64, done: u32 },
    /// A group's last write: the group is done.
    Last,
}

impl<'a> Mark<'a> {
    fn entry(applied: &'a [u8]) -> Mark<'a> {
        Mark {
            applied,
            group: Group::None,
        }
    }

    /// Writes the mark in `t`, the commit it belongs to.
    fn book(self, t: &mut keel::Txn<'_>) -> std::result::Result<(), keel::Error> {
        t.put(APPLIED, self.applied)?;
        match self.group {
            Group::None => Ok(()),
            Group::Member { index, done } => t.put(
                GROUP,
                &[&index.to_be_bytes()[..], &done.to_be_bytes()].concat(),
            ),
            Group::Last => t.delete(GROUP),
        }
    }
}

/// How many writes of the group at log index `index` a crash left in (0: none, or no
/// group was cut short).
fn group_done(db: &Db, index: u64) -> Result<usize> {
    let Some(v) = db.snapshot().map_err(sm_err)?.get(GROUP).map_err(sm_err)? else {
        return Ok(0);
    };
    let (at, done) = v
        .split_at_checked(8)
        .ok_or_else(|| sm_err("a bad group record"))?;
    let at = u64::from_be_bytes(at.try_into().map_err(sm_err)?);
    let done = u32::from_be_bytes(done.try_into().map_err(sm_err)?);
    Ok(if at == index { done as usize } else { 0 })
}

/// The seed of the random numbers an entry draws (a new collection's generation among them):
/// the same on every replica, and distinct per partition as well as per log id, since a
/// collection keeps its generation when its slot moves to another partition, whose own
/// entries at the same log ids would otherwise have drawn the same generations (two keys'
/// records then mixed: the replicated simulation found it).
///
/// Mixed, not merely XORed: a group's requests take `seed ^ i·φ` (`execute_group`), and
/// partitions' seeds that differed by `p·φ ^ q·φ` would give two of them the same one.
fn entry_seed(partition: usize, log_id: LogId<u64>) -> u64 {
    mix(log_id.index ^ log_id.leader_id.term.rotate_left(32) ^ mix(partition as u64 + 1))
}

/// splitmix64's finalizer: every bit of the output depends on every bit of `z`.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

pub fn execute(
    db: &Db,
    locks: &mut prepared::Locks,
    request: &Request,
    mark: Mark<'_>,
    seed: u64,
    index: u64,
) -> Result<Response> {
    // A write sent again after its answer was lost: the answer it got, nothing run again.
    let kept_key = request
        .id
        .map(|id| [REQUESTS, &prepared::id_bytes(id)[..]].concat());
    if let Some(key) = &kept_key
        && let Some(kept) = db.snapshot().map_err(sm_err)?.get(key).map_err(sm_err)?
    {
        let (_, reply): (u64, Vec<u8>) = postcard::from_bytes(&kept).map_err(sm_err)?;
        put_marker(db, mark)?;
        return Ok(Response {
            reply,
            ..Response::default()
        });
    }
    let touched = prepared::touched(request);
    let moved = locks.misplaced(&touched);
    if !moved.is_empty() {
        put_marker(db, mark)?;
        return Ok(Response {
            reply: postcard::to_stdvec(&moved).map_err(sm_err)?,
            status: Status::Moved,
            ..Response::default()
        });
    }
    if locks.conflicts(&touched) {
        put_marker(db, mark)?;
        return Ok(Response {
            status: Status::Busy,
            ..Response::default()
        });
    }
    if locks.watch_changed(&request.watched, request.now_ms) {
        // `EXEC` under a `WATCH` whose key changed: nothing runs, a null array.
        put_marker(db, mark)?;
        let mut buf = BytesMut::new();
        Out::new(&mut buf, request.proto()).null_array();
        return Ok(Response {
            reply: buf.to_vec(),
            ..Response::default()
        });
    }
    let bumps = locks.bumps(&request.commands, index);
    let proto = request.proto();
    let cursors = data::Cursors::default();
    let encodings = crate::config::Encodings::default();
    let commands = request.args();
    for _ in 0..APPLY_ATTEMPTS {
        let ctx = Ctx {
            bulk_bytes_max: request.bulk_bytes_max,
            cursors: &cursors,
            reply_bytes_max: request.reply_bytes_max,
            track_increments: false,
            clock: Clock::at(request.now_ms),
            encodings: &encodings,
            contended: Default::default(),
            cluster: true,
        };
        let mut buf = BytesMut::new();
        let mut out = Out::new(&mut buf, proto);
        let (failed, txn) = data::with_seed(seed, || {
            let mut txn = db.begin().map_err(sm_err)?;
            let failed = run_all(
                &commands,
                request.exec,
                !request.exec,
                &mut txn,
                &ctx,
                &mut out,
            );
            Ok::<_, StorageError<u64>>((failed, txn))
        })?;
        let rolled_back = |db: &Db, reply: Vec<u8>| {
            put_marker(db, mark)?;
            Ok(Response {
                status: if request.batch {
                    Status::RolledBack
                } else {
                    Status::Done
                },
                reply: if request.batch { Vec::new() } else { reply },
                ..Response::default()
            })
        };
        if failed {
            drop(txn);
            return rolled_back(db, buf.to_vec());
        }
        let mut txn = txn;
        txn.set_durability(LAZY);
        // The entry's own records go in its transaction too. A write that leaves no room
        // for them (an `MSET` of 65 535 keys) fails as a command past a limit does: were
        // the put to fail the entry, every replica would fail it, and the partition's Raft
        // group would stop, at every restart again.
        let booked = (|| {
            mark.book(&mut txn)?;
            for (k, v, lapse) in &bumps {
                let (key, value) = prepared::watch_record(k, *v, *lapse);
                txn.put(&key, &value)?;
            }
            if let (Some(key), Some(id)) = (&kept_key, request.id) {
                keep_answer(&mut txn, request, key, id, buf.as_ref())?;
            }
            Ok::<(), keel::Error>(())
        })();
        if let Err(e) = booked {
            drop(txn);
            buf.clear();
            Out::new(&mut buf, proto).error(&format!(
                "ERR keel: {e} (with the records a replicated write keeps beside it)"
            ));
            return rolled_back(db, buf.to_vec());
        }
        if index.is_multiple_of(REQUESTS_SWEEP_EVERY) {
            sweep_answers(db, &mut txn, request.now_ms)?;
        }
        match txn.commit() {
            Ok(Ok(_)) => {
                locks.bumped(bumps);
                return Ok(Response {
                    reply: buf.to_vec(),
                    ..Response::default()
                });
            }
            Ok(Err(_conflict)) => continue,
            Err(keel::CommitError::Apply(e)) => {
                // A commutative add met a value that is not an integer.
                buf.clear();
                let mut out = Out::new(&mut buf, proto);
                out.error(&format!("ERR {e}"));
                return rolled_back(db, buf.to_vec());
            }
            Err(e) => return Err(sm_err(e)),
        }
    }
    Err(sm_err("an entry's transaction kept conflicting"))
}

/// Answers of applied writes by id (`Request::id`): `FF 'r' 'q' <id>` → (until, reply).
const REQUESTS: &[u8] = &[0xFF, b'r', b'q'];
/// The same by the time they may go: `FF 'r' 'Q' <until, 8 bytes big-endian> <id>` → "".
const REQUESTS_UNTIL: &[u8] = &[0xFF, b'r', b'Q'];
/// Every this many entries, answers past their time are dropped (in the entry's commit, if
/// it is a write that commits), at most [`REQUESTS_SWEEP_MAX`] of them.
const REQUESTS_SWEEP_EVERY: u64 = 8;
/// Most answers one sweep drops (two records each). A sweep shares its entry's engine
/// transaction, which may write at most `TXN_WRITE_KEYS_MAX` keys: an unbounded one failed
/// the entry, and with it the partition's Raft group on every replica, once more answers
/// than that fell due at once (a pause in the writes of a few seconds at 17 000 writes per
/// second, as many seconds of `keep_ms` later). Bounded, a sweep leaves the rest to the
/// next ones: up to 128 answers per entry, as many as a busy group of writes keeps.
const REQUESTS_SWEEP_MAX: usize = 1024;

/// Keeps the answer `reply` of the write `request` (id `id`, record `key`) in `txn` until
/// its time by the entry's clock.
fn keep_answer(
    txn: &mut keel::Txn<'_>,
    request: &Request,
    key: &[u8],
    id: super::TxnId,
    reply: &[u8],
) -> std::result::Result<(), keel::Error> {
    let until = request.now_ms.saturating_add(request.keep_ms);
    let kept = postcard::to_stdvec(&(until, reply)).expect("a reply encodes");
    txn.put(key, &kept)?;
    txn.put(
        &[
            REQUESTS_UNTIL,
            &until.to_be_bytes(),
            &prepared::id_bytes(id),
        ]
        .concat(),
        b"",
    )
}

/// Drops, in `txn`, the kept answers whose time is before `now_ms` (the entry's clock),
/// oldest first: every [`REQUESTS_SWEEP_EVERY`] entries, by log index, so every replica
/// drops the same; at most [`REQUESTS_SWEEP_MAX`], and no more than `txn` has room for
/// beside what its entry wrote (the same on every replica too).
fn sweep_answers(db: &Db, txn: &mut keel::Txn<'_>, now_ms: u64) -> Result<()> {
    let end = [REQUESTS_UNTIL, &now_ms.to_be_bytes()].concat();
    let snap = db.snapshot().map_err(sm_err)?;
    let (mut keys_left, mut bytes_left) = txn.writes_left();
    for (k, _) in snap
        .range::<[u8]>((
            std::ops::Bound::Included(REQUESTS_UNTIL),
            std::ops::Bound::Excluded(end.as_slice()),
        ))
        .take(REQUESTS_SWEEP_MAX)
    {
        let answer = [REQUESTS, &k[REQUESTS_UNTIL.len() + 8..]].concat();
        let bytes = answer.len() + k.len();
        if keys_left < 2 || bytes_left < bytes {
            break;
        }
        (keys_left, bytes_left) = (keys_left - 2, bytes_left - bytes);
        txn.delete(&answer).map_err(sm_err)?;
        txn.delete(&k).map_err(sm_err)?;
    }
    Ok(())
}

fn put_marker(db: &Db, mark: Mark<'_>) -> Result<()> {
    db.transact(|t| {
        t.set_durability(LAZY);
        mark.book(t)
    })
    .map_err(sm_err)
}

/// Runs one data command in `txn`. `FLUSHDB` and `FLUSHALL` delete the partition's data
/// but not the replication records (`FF 'r' …`: the applied marker, prepared transactions,
/// decisions, slot ownership), in this one transaction.
///
/// A blocking pop runs as a pop: with nothing to pop it fails with `lists::WOULD_BLOCK` (the
/// node waits and sends it again), or, inside a transaction (`in_exec`), answers nil as
/// Redis does there.
pub(super) fn run_command(
    cmd: table::Cmd,
    args: &[Bytes],
    txn: &mut keel::Txn<'_>,
    ctx: &Ctx<'_>,
    out: &mut Out<'_>,
    in_exec: bool,
) -> std::result::Result<(), Fail> {
    if crate::lists::is_blocking(cmd) {
        if crate::lists::run_blocking(cmd, args, txn, ctx, out)? {
            return Ok(());
        }
        if !in_exec {
            return Err(Fail(crate::lists::WOULD_BLOCK.into()));
        }
        match cmd {
            table::Cmd::Blmove | table::Cmd::Brpoplpush => out.null(),
            _ => out.null_array(),
        }
        return Ok(());
    }
    if cmd == table::Cmd::KeelFlushbatch {
        let (_, more) = data::delete_all_but(
            txn,
            MARKERS,
            FLUSH_ENTRY_KEYS_MAX,
            FLUSH_ENTRY_ROOM_BYTES,
            false,
        )?;
        out.int(i64::from(more));
        return Ok(());
    }
    if !matches!(cmd, table::Cmd::Flushdb | table::Cmd::Flushall) {
        return data::run(cmd, args, &mut View::Txn(txn), ctx, out);
    }
    data::check_flush_args(args)?;
    let (held, more) = data::delete_all_but(txn, MARKERS, usize::MAX, 0, true)?;
    if more {
        // One engine transaction deletes them, in every replica's log entry at once: the
        // node flushes such a partition in entries of `KEEL.FLUSHBATCH` instead.
        return Err(format!(
            "{FLUSH_TOO_LARGE} which deletes at most {} keys; this one holds {held} or more \
             (its node then flushes it in batches)",
            keel::limits::TXN_WRITE_KEYS_MAX,
        )
        .into());
    }
    out.ok();
    Ok(())
}

/// The start of the error of a replicated partition's `FLUSHALL`/`FLUSHDB` whose keys are
/// too many for its one transaction (the node then flushes it in `KEEL.FLUSHBATCH` entries).
pub const FLUSH_TOO_LARGE: &str = "ERR keel: a replicated partition is flushed in one transaction,";

/// Keys one `KEEL.FLUSHBATCH` entry deletes at most: below the engine's limit by room for
/// the entry's own records (the applied marker, a kept answer, watched keys' versions).
const FLUSH_ENTRY_KEYS_MAX: usize = keel::limits::TXN_WRITE_KEYS_MAX - 4096;
/// Bytes one `KEEL.FLUSHBATCH` entry leaves unwritten for its own records.
const FLUSH_ENTRY_ROOM_BYTES: usize = 1 << 20;

/// Runs `commands` in `txn`, writing their replies (in an array if `array`); whether one
/// failed (a write then rolls back). With `stop`, the first failure ends the run (a single
/// command, a batch that will run again one by one); `EXEC` and reads run them all.
pub(super) fn run_all(
    commands: &[Vec<Bytes>],
    array: bool,
    stop: bool,
    txn: &mut keel::Txn<'_>,
    ctx: &Ctx<'_>,
    out: &mut Out<'_>,
) -> bool {
    if array {
        out.array(commands.len());
    }
    let mut failed = false;
    for args in commands {
        let slot = out.buf.len();
        let result = match table::lookup(&args[0]).filter(|s| data::is_data(s.cmd)) {
            Some(spec) => run_command(spec.cmd, args, txn, ctx, out, array),
            None => Err(Fail("ERR keel: not a data command".into())),
        };
        if let Err(Fail(text)) = result {
            out.buf.truncate(slot);
            out.error(&text);
            failed = true;
            if stop {
                break;
            }
        }
        if out.buf.len() > ctx.reply_bytes_max {
            out.buf.clear();
            out.error(&data::reply_too_big().0);
            return true;
        }
    }
    failed
}

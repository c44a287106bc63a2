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
//! A snapshot is every key of the database but the markers, encoded whole, with the marker's
//! log id and membership; before it is taken a `sync` commit makes everything it contains
//! durable (openraft cuts the log behind a snapshot). The current snapshot is also kept in
//! `<dir>/raft-<p>/snapshot`, written before a received one is installed: a crash during the
//! install is finished on the next start. [`Durable`] says which log id that file covers (the
//! log store cuts the log no further); it is written by one writer at a time, and never goes
//! back to an older snapshot (a build that started before an install finished).

// openraft's storage traits return its `StorageError`, which is large; the helpers here
// return it too rather than converting at every call.
#![allow(clippy::result_large_err)]

use std::io::Cursor;
use std::path::PathBuf;

use bytes::{Bytes, BytesMut};
use keel::{Db, Durability};
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine, Snapshot};
use openraft::{
    Entry, EntryPayload, LogId, OptionalSend, SnapshotMeta, StorageError, StorageIOError,
    StoredMembership,
};
use serde::{Deserialize, Serialize};

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

/// Most keys one transaction of a snapshot install writes.
const BATCH_KEYS: usize = 4096;
/// Most bytes one transaction of a snapshot install writes.
const BATCH_BYTES: usize = 16 << 20;
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

/// The snapshot file: its metadata and data.
#[derive(Serialize, Deserialize)]
struct SnapshotFile {
    meta: SnapshotMeta<u64, openraft::BasicNode>,
    data: Vec<u8>,
}

/// A partition's state machine.
pub struct Machine {
    db: &'static Db,
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
    /// Held while the snapshot file is written: one writer at a time.
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

    /// Runs `write` (which writes the snapshot file) if `last` is past what is covered, alone,
    /// then covers `last`.
    fn write_past(
        &self,
        last: Option<LogId<u64>>,
        write: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let _alone = self.0.writing.lock();
        if last <= self.get() {
            return Ok(());
        }
        write()?;
        self.0.last.send_replace(last);
        Ok(())
    }
}

/// A snapshot kept in memory (no data directory), shared with the builders.
type Current = std::sync::Arc<parking_lot::Mutex<Option<std::sync::Arc<SnapshotFile>>>>;

/// Builds snapshots of a [`Machine`]'s database.
pub struct Builder {
    db: &'static Db,
    dir: Option<PathBuf>,
    current: Current,
    durable: Durable,
}

impl Machine {
    /// The state machine on `db`, finishing a snapshot install a crash interrupted.
    pub async fn open(db: &'static Db, dir: Option<PathBuf>) -> Result<Machine> {
        let marker = read_marker(db)?;
        let mut machine = Machine {
            db,
            dir,
            applied: marker.applied,
            membership: marker.membership,
            current: Current::default(),
            durable: Durable::default(),
            locks: prepared::Shared::default(),
            pushed: None,
        };
        let file = machine.read_file()?;
        machine
            .durable
            .0
            .last
            .send_replace(file.as_ref().and_then(|f| f.meta.last_log_id));
        if let Some(file) = file
            && file.meta.last_log_id > machine.applied
        {
            tracing::info!(
                "finishing the install of snapshot {} interrupted by a stop",
                file.meta.snapshot_id
            );
            let SnapshotFile { meta, data } = file;
            let db = machine.db;
            let meta2 = meta.clone();
            tokio::task::spawn_blocking(move || load(db, &meta2, &data))
                .await
                .map_err(sm_err)??;
            machine.applied = meta.last_log_id;
            machine.membership = meta.last_membership;
        }
        machine.locks.lock().load(db)?;
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

    fn file_path(&self) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| d.join(SNAPSHOT_FILE))
    }

    fn read_file(&self) -> Result<Option<SnapshotFile>> {
        let Some(path) = self.file_path() else {
            return Ok(None);
        };
        match std::fs::read(&path) {
            Ok(bytes) => postcard::from_bytes(&bytes).map(Some).map_err(snap_err),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(snap_err(e)),
        }
    }
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

/// Writes `file` durably to `path` (a temporary file, fsynced, renamed over it).
fn write_file(path: &std::path::Path, file: &SnapshotFile) -> std::io::Result<()> {
    use std::io::Write as _;
    let bytes = postcard::to_stdvec(file).map_err(std::io::Error::other)?;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Replaces everything in `db` with a snapshot's `data`, then sets the marker (with `sync`).
fn load(db: &Db, meta: &SnapshotMeta<u64, openraft::BasicNode>, data: &[u8]) -> Result<()> {
    let pairs: Vec<(Vec<u8>, Vec<u8>)> = postcard::from_bytes(data).map_err(snap_err)?;
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
    let mut rest = pairs.as_slice();
    while !rest.is_empty() {
        let (mut n, mut bytes) = (0, 0);
        while n < rest.len()
            && n < BATCH_KEYS
            && (n == 0 || bytes + rest[n].0.len() + rest[n].1.len() <= BATCH_BYTES)
        {
            bytes += rest[n].0.len() + rest[n].1.len();
            n += 1;
        }
        let (batch, after) = rest.split_at(n);
        db.transact(|t| {
            t.set_durability(LAZY);
            batch.iter().try_for_each(|(k, v)| t.put(k, v))
        })
        .map_err(sm_err)?;
        rest = after;
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
    .map_err(sm_err)
}

/// Takes a snapshot of `db` (after making everything in it durable).
fn build(db: &Db) -> Result<SnapshotFile> {
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
    let pairs: Vec<(Vec<u8>, Vec<u8>)> = snap
        .range::<[u8]>(..)
        .filter(|(k, _)| !is_marker(k))
        .collect();
    let data = postcard::to_stdvec(&pairs).map_err(snap_err)?;
    let id = match marker.applied {
        Some(l) => format!(
            "{}-{}-{}",
            l.leader_id,
            l.index,
            crate::data::random() % 1_000_000
        ),
        None => format!("empty-{}", crate::data::random() % 1_000_000),
    };
    Ok(SnapshotFile {
        meta: SnapshotMeta {
            last_log_id: marker.applied,
            last_membership: marker.membership,
            snapshot_id: id,
        },
        data,
    })
}

impl RaftSnapshotBuilder<Tc> for Builder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<Tc>> {
        let (db, path) = (self.db, self.dir.as_ref().map(|d| d.join("snapshot")));
        let durable = self.durable.clone();
        let file = tokio::task::spawn_blocking(move || {
            let file = build(db)?;
            // Never an older snapshot over a newer one (an install may have finished while
            // this one was built).
            durable.write_past(file.meta.last_log_id, || match &path {
                Some(path) => write_file(path, &file).map_err(snap_err),
                None => Ok(()),
            })?;
            Ok::<_, StorageError<u64>>(file)
        })
        .await
        .map_err(snap_err)??;
        let snapshot = Snapshot {
            meta: file.meta.clone(),
            snapshot: Box::new(Cursor::new(file.data.clone())),
        };
        if self.dir.is_none() {
            *self.current.lock() = Some(std::sync::Arc::new(file));
        }
        Ok(snapshot)
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
        let (db, mut membership) = (self.db, self.membership.clone());
        let (mut applied, db) = (self.applied, db);
        let locks = std::sync::Arc::clone(&self.locks);
        let pushed = self.pushed.clone();
        // Engine work without fsyncs (the commits are lazy): done here, no thread hand-off.
        let (responses, membership, applied) = (move || {
            let mut responses = Vec::with_capacity(entries.len());
            for entry in entries {
                let log_id = entry.log_id;
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
                        let seed = log_id.index ^ log_id.leader_id.term.rotate_left(32);
                        // Held while the entry applies: readers see the lock table and the
                        // data after the same entries.
                        let mut locks = locks.lock();
                        match &request.op {
                            Op::Run => {
                                execute(db, &mut locks, request, &marker, seed, log_id.index)?
                            }
                            Op::Many(requests) => execute_group(
                                db,
                                &mut locks,
                                requests,
                                &marker,
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
                                if let (Some(pushed), Some(commands)) = (&pushed, installed) {
                                    commands.iter().for_each(|c| pushed(c));
                                }
                                response
                            }
                        }
                    }
                    _ => {
                        put_marker(db, &marker)?;
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
            db: self.db,
            dir: self.dir.clone(),
            current: std::sync::Arc::clone(&self.current),
            durable: self.durable.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>> {
        self.durable.0.receiving.send_replace(true);
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, openraft::BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<()> {
        let file = SnapshotFile {
            meta: meta.clone(),
            data: snapshot.into_inner(),
        };
        let (db, path) = (self.db, self.file_path());
        let durable = self.durable.clone();
        let installed = tokio::task::spawn_blocking(move || {
            durable.write_past(file.meta.last_log_id, || match &path {
                Some(path) => write_file(path, &file).map_err(snap_err),
                None => Ok(()),
            })?;
            load(db, &file.meta, &file.data)?;
            Ok::<_, StorageError<u64>>(file)
        })
        .await;
        // Done, or failed: a purge waiting for this snapshot goes ahead either way.
        self.durable.0.receiving.send_replace(false);
        let file = installed.map_err(sm_err)??;
        self.locks.lock().load(self.db)?;
        self.applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        if self.dir.is_none() {
            *self.current.lock() = Some(std::sync::Arc::new(file));
        }
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<Tc>>> {
        let file = match self.read_file()? {
            Some(f) => Some(f),
            None => self.current.lock().as_ref().map(|f| SnapshotFile {
                meta: f.meta.clone(),
                data: f.data.clone(),
            }),
        };
        Ok(file.map(|f| Snapshot {
            meta: f.meta,
            snapshot: Box::new(Cursor::new(f.data)),
        }))
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
fn execute_group(
    db: &Db,
    locks: &mut prepared::Locks,
    requests: &[Request],
    marker: &[u8],
    seed: u64,
    index: u64,
) -> Result<Response> {
    let mut replies = Vec::with_capacity(requests.len());
    for (i, request) in requests.iter().enumerate() {
        let seed = seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let response = match request.op {
            Op::Run => execute(db, locks, request, marker, seed, index)?,
            _ => Response {
                reply: b"ERR keel: only writes go into a group".to_vec(),
                status: Status::Failed,
                ..Response::default()
            },
        };
        replies.push(postcard::to_stdvec(&response).map_err(sm_err)?);
    }
    if requests.is_empty() {
        put_marker(db, marker)?;
    }
    Ok(Response {
        replies,
        ..Response::default()
    })
}

pub fn execute(
    db: &Db,
    locks: &mut prepared::Locks,
    request: &Request,
    marker: &[u8],
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
        put_marker(db, marker)?;
        return Ok(Response {
            reply,
            ..Response::default()
        });
    }
    let touched = prepared::touched(request);
    let moved = locks.misplaced(&touched);
    if !moved.is_empty() {
        put_marker(db, marker)?;
        return Ok(Response {
            reply: postcard::to_stdvec(&moved).map_err(sm_err)?,
            status: Status::Moved,
            ..Response::default()
        });
    }
    if locks.conflicts(&touched) {
        put_marker(db, marker)?;
        return Ok(Response {
            status: Status::Busy,
            ..Response::default()
        });
    }
    if locks.watch_changed(&request.watched, request.now_ms) {
        // `EXEC` under a `WATCH` whose key changed: nothing runs, a null array.
        put_marker(db, marker)?;
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
            put_marker(db, marker)?;
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
        txn.put(APPLIED, marker).map_err(sm_err)?;
        for (k, v, lapse) in &bumps {
            let (key, value) = prepared::watch_record(k, *v, *lapse);
            txn.put(&key, &value).map_err(sm_err)?;
        }
        if let (Some(key), Some(id)) = (&kept_key, request.id) {
            keep_answer(&mut txn, request, key, id, buf.as_ref())?;
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
/// it is a write that commits).
const REQUESTS_SWEEP_EVERY: u64 = 64;

/// Keeps the answer `reply` of the write `request` (id `id`, record `key`) in `txn` until
/// its time by the entry's clock.
fn keep_answer(
    txn: &mut keel::Txn<'_>,
    request: &Request,
    key: &[u8],
    id: super::TxnId,
    reply: &[u8],
) -> Result<()> {
    let until = request.now_ms.saturating_add(request.keep_ms);
    txn.put(key, &postcard::to_stdvec(&(until, reply)).map_err(sm_err)?)
        .map_err(sm_err)?;
    txn.put(
        &[
            REQUESTS_UNTIL,
            &until.to_be_bytes(),
            &prepared::id_bytes(id),
        ]
        .concat(),
        b"",
    )
    .map_err(sm_err)
}

/// Drops, in `txn`, the kept answers whose time is before `now_ms` (the entry's clock):
/// every [`REQUESTS_SWEEP_EVERY`] entries, by log index, so every replica drops the same.
fn sweep_answers(db: &Db, txn: &mut keel::Txn<'_>, now_ms: u64) -> Result<()> {
    let end = [REQUESTS_UNTIL, &now_ms.to_be_bytes()].concat();
    let snap = db.snapshot().map_err(sm_err)?;
    for (k, _) in snap.range::<[u8]>((
        std::ops::Bound::Included(REQUESTS_UNTIL),
        std::ops::Bound::Excluded(end.as_slice()),
    )) {
        txn.delete(&[REQUESTS, &k[REQUESTS_UNTIL.len() + 8..]].concat())
            .map_err(sm_err)?;
        txn.delete(&k).map_err(sm_err)?;
    }
    Ok(())
}

fn put_marker(db: &Db, marker: &[u8]) -> Result<()> {
    db.transact(|t| {
        t.set_durability(LAZY);
        t.put(APPLIED, marker)
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
    if !matches!(cmd, table::Cmd::Flushdb | table::Cmd::Flushall) {
        return data::run(cmd, args, &mut View::Txn(txn), ctx, out);
    }
    data::check_flush_args(args)?;
    let keys: Vec<Vec<u8>> = txn
        .range::<Vec<u8>>(..)
        .map(|(k, _)| k)
        .filter(|k| !k.starts_with(MARKERS))
        .collect();
    for k in &keys {
        txn.delete(k)?;
    }
    out.ok();
    Ok(())
}

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

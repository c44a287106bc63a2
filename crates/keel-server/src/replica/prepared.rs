//! Transactions across replicated partitions as a partition's state machine sees them: the
//! entries of `Op::Prepare`, `Decide`, `Commit`, `Abort`, `Resolve` and `Forget` (the protocol
//! that sends them is in `txn`).
//!
//! Every replica applies the same entries in the same order, so everything here is replicated
//! state, decided by the log alone:
//!
//! - A **prepared** transaction (`FF 'r' 'p' <txn>`: its commands, the clock and random seed
//!   of its prepare, its replies) holds every key its commands touch: a shared lock on the keys
//!   it only reads, an exclusive one on those it writes, until its decision is applied. Its
//!   effect is not in the data: `Commit` runs the commands again at the prepare's clock and
//!   seed, on keys nothing could change in between, so they do exactly what they did.
//! - Any other entry, prepare or read that would read a key a prepared transaction writes,
//!   or write a key it touches, is refused with `Busy` (no waiting inside the log: the sender
//!   retries). That is strict two-phase locking per partition, which with every partition's
//!   locks held until the decision makes the whole history serializable.
//! - The coordinator partition keeps a **commit decision** (`FF 'r' 'd' <txn>`) until the
//!   transaction is installed everywhere (`Forget`), and an abort decision, like every
//!   participant's finished transaction, as a **finished** record (`FF 'r' 'f' <deadline> <txn>`)
//!   until its deadline passes. Whichever of `Decide` and `Resolve` comes first in its log
//!   decides: a `Resolve` that finds no decision decides abort.
//! - The partition's **clock** (`FF 'r' 't'`) is the largest leader clock of the transaction
//!   entries applied: after a transaction's deadline by this clock, no prepare or decision of
//!   it is accepted, and a partition that has no decision for it answers abort. Finished
//!   records are dropped then, as nothing can arrive that they would refuse.
//!
//! The records are ordinary keys of the data database: they are in snapshots, and the lock
//! table (memory) is rebuilt from them at start and after a snapshot install.

#![allow(clippy::result_large_err)]

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound::{Excluded, Included, Unbounded};
use std::ops::ControlFlow;
use std::sync::Arc;

use bytes::BytesMut;
use keel::Db;
use openraft::StorageError;
use serde::{Deserialize, Serialize};

use super::machine::{self, LAZY, sm_err};
use super::{Op, Request, Response, Status, TxnId};
use crate::data;
use crate::reply::Out;
use crate::table;

const PREPARED: &[u8] = &[0xFF, b'r', b'p'];
const DECIDED: &[u8] = &[0xFF, b'r', b'd'];
const FINISHED: &[u8] = &[0xFF, b'r', b'f'];
const CLOCK: &[u8] = &[0xFF, b'r', b't'];
/// The slots moved away from the config's owners: `BTreeMap<slot, partition>`.
const MOVED: &[u8] = &[0xFF, b'r', b'o'];
/// A watched key's version and when its watch lapses: `FF 'r' 'w' <key>` → 16 bytes.
const WATCHED: &[u8] = &[0xFF, b'r', b'w'];
/// The cluster's view (`super::view`), kept by partition 0: `FF 'r' 'v'` → the encoded view.
const VIEW: &[u8] = &[0xFF, b'r', b'v'];
/// A generation a slot move staged here ahead of its `MoveIn`: `FF 'r' 'i' <txn> <generation>`
/// → empty.
const STAGED: &[u8] = &[0xFF, b'r', b'i'];

/// How long a key stays watched after its last `WATCH` (by the partition's clock): an `EXEC`
/// later than that finds no version and aborts, as if the key had changed.
pub const WATCH_LAPSE_MS: u64 = 600_000;

/// Most engine records one slot move carries: the destination writes them, and the source
/// then deletes them, each in one engine transaction with a few records of its own (the
/// applied marker, the slot owners, the decision). A move past it would fail its entry on
/// every replica, and with it the partition's Raft group.
pub const MOVE_RECORDS_MAX: usize = keel::limits::TXN_WRITE_KEYS_MAX - 64;

/// Keys, and bytes per key, a prepared transaction's commit writes beside its commands (the
/// applied marker, the finished record, its prepared record's removal; a watch record for
/// each watched key it writes, counted apart): a prepare whose commands leave less room is
/// refused.
const ROOM_FOR_BOOKS: (usize, usize) = (16, 4096);

/// A vote's error when a watched key changed: the driver answers `EXEC` with a null array.
pub const WATCH_CHANGED: &str = "keel: a watched key changed";

type Result<T> = std::result::Result<T, StorageError<u64>>;

/// The lock table, shared by the state machine (which changes it with the entries) and the
/// readers (which take it with their snapshot, so both are after the same entries).
pub type Shared = Arc<parking_lot::Mutex<Locks>>;

/// A prepared transaction, as kept until its decision.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    /// Its commands (with `op: Run`), clock and limits.
    pub request: Request,
    /// The random seed of its prepare.
    pub seed: u64,
    /// The partition whose log holds the decision.
    pub coordinator: usize,
    pub deadline_ms: u64,
    /// The replies of its prepare.
    pub replies: Vec<Vec<u8>>,
    /// A slot move's prepare: the slots (locked whole) and the partition they move to.
    pub moving: Option<(Vec<u16>, usize)>,
}

/// A commit decision kept by the coordinator partition until every participant installed it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Decided {
    /// The other participants.
    pub participants: Vec<usize>,
    pub deadline_ms: u64,
    /// The coordinator's replies (for a driver that lost the answer to its `Decide`).
    pub replies: Vec<Vec<u8>>,
}

/// Which partition a state machine is, and the owner of every slot in the cluster's config.
pub type Home = (usize, Arc<dyn Fn(u16) -> usize + Send + Sync>);

/// The keys locked by prepared transactions, the transactions' records, and the slots this
/// partition owns.
#[derive(Default)]
pub struct Locks {
    held: HashMap<Vec<u8>, Held>,
    prepared: BTreeMap<TxnId, Record>,
    decided: BTreeMap<TxnId, Decided>,
    clock: u64,
    /// `None`: this partition owns every slot (a state machine outside a cluster: tests).
    home: Option<Home>,
    /// Slots whose owner is not the config's any more, and their owner now.
    moved: BTreeMap<u16, usize>,
    /// Set once `moved` holds anything: routing reads it without this table's lock.
    moved_any: Arc<std::sync::atomic::AtomicBool>,
    /// Slots a prepared move holds: every key in them is locked.
    slots_locked: std::collections::BTreeSet<u16>,
    /// Prepared transactions that write without keys (`FLUSHALL`): every key is locked.
    global: u32,
    /// Watched keys: version (log index of the last write since watched) and lapse time.
    watched: HashMap<Vec<u8>, (u64, u64)>,
    /// Slot moves into this partition with collections staged here (`Op::MoveStage`), and
    /// their deadline and generations: a flush waits for them. Past the deadline, the
    /// partition's leader aborts what is left (`txn::resolve_once`).
    staging: BTreeMap<TxnId, Staging>,
    /// A deliberate bug for the simulation's checks to catch: nothing conflicts.
    #[cfg(test)]
    pub ignore_locks: bool,
    /// Another: a slot move's `MoveIn` takes the slots but not their keys.
    #[cfg(test)]
    pub lose_moves: bool,
    /// Records a slot move carries in its vote, and in each chunk, at most, if fewer than
    /// [`MOVE_RECORDS_MAX`] and [`MOVE_CHUNK_RECORDS`]: the simulation's collections of a few
    /// elements go in chunks.
    #[cfg(test)]
    pub move_records_max: Option<usize>,
}

/// A slot move's collections staged in the destination ahead of its `MoveIn`.
#[derive(Debug, Default, Clone)]
struct Staging {
    deadline_ms: u64,
    generations: std::collections::BTreeSet<u64>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Held {
    readers: u32,
    writer: bool,
}

/// Whether `commands` write without keys (`FLUSHDB`, `FLUSHALL`, a batch of one,
/// `KEEL.FLUSHBATCH`): they may touch every key.
fn writes_everything(commands: &[Vec<Vec<u8>>]) -> bool {
    runs_any(
        commands,
        &[
            table::Cmd::Flushdb,
            table::Cmd::Flushall,
            table::Cmd::KeelFlushbatch,
        ],
    )
}

/// Whether `commands` may write a key they do not name: the flushes, and `KEEL.REAP`,
/// which deletes whatever expired (but changes no watched key's version: a watch sees an
/// expiry by its deadline).
fn may_write_unnamed(commands: &[Vec<Vec<u8>>]) -> bool {
    runs_any(
        commands,
        &[
            table::Cmd::Flushdb,
            table::Cmd::Flushall,
            table::Cmd::KeelFlushbatch,
            table::Cmd::KeelReap,
        ],
    )
}

fn runs_any(commands: &[Vec<Vec<u8>>], cmds: &[table::Cmd]) -> bool {
    commands.iter().any(|c| {
        c.first()
            .and_then(|n| table::lookup(n))
            .is_some_and(|s| cmds.contains(&s.cmd))
    })
}

/// The commands of `request`, and a read of its watched keys (they are locked like reads).
pub fn touched(request: &Request) -> std::borrow::Cow<'_, [Vec<Vec<u8>>]> {
    if request.watched.is_empty() {
        return std::borrow::Cow::Borrowed(&request.commands);
    }
    let mut commands = request.commands.clone();
    commands.push(
        std::iter::once(b"EXISTS".to_vec())
            .chain(request.watched.iter().map(|w| w.key.clone()))
            .collect(),
    );
    std::borrow::Cow::Owned(commands)
}

/// Each key `commands` touch, and whether it is written (every key of a command that writes).
fn accesses(commands: &[Vec<Vec<u8>>]) -> Vec<(Vec<u8>, bool)> {
    let mut keys = Vec::new();
    for command in commands {
        let Some(spec) = command.first().and_then(|name| table::lookup(name)) else {
            continue;
        };
        let write = !data::is_read_only(spec.cmd);
        for key in crate::cluster::key_args(spec, command) {
            keys.push((key.to_vec(), write));
        }
    }
    keys
}

fn slot_of(key: &[u8]) -> u16 {
    keel_cluster::key_slot(key).0
}

impl Locks {
    /// The partition's clock: the largest leader clock of the transaction entries applied.
    pub fn clock(&self) -> u64 {
        self.clock
    }

    /// Whether running `commands` now would read a key a prepared transaction writes, or
    /// write one it touches, or touch a slot a prepared move holds.
    pub fn conflicts(&self, commands: &[Vec<Vec<u8>>]) -> bool {
        #[cfg(test)]
        if self.ignore_locks {
            return false;
        }
        if !self.staging.is_empty() && writes_everything(commands) {
            // It would delete a move's staged collections (not this partition's yet).
            return true;
        }
        if self.held.is_empty() && self.slots_locked.is_empty() && self.global == 0 {
            return false;
        }
        if self.global > 0 || may_write_unnamed(commands) {
            return true;
        }
        accesses(commands).iter().any(|(key, write)| {
            self.held
                .get(key)
                .is_some_and(|h| h.writer || (*write && h.readers > 0))
                || self.slots_locked.contains(&slot_of(key))
        })
    }

    /// Whether a key of `watched` changed since its `WATCH` (or its deadline passed by
    /// `clock`, or its watch lapsed).
    pub fn watch_changed(&self, watched: &[super::Watched], clock: u64) -> bool {
        watched.iter().any(|w| {
            !matches!(self.watched.get(&w.key), Some((v, _)) if *v == w.version)
                || (w.deadline != 0 && w.deadline <= clock)
        })
    }

    /// The records that a commit of `commands` at log index `index` writes for the watched
    /// keys it writes (their new version), to apply with [`Locks::bumped`] once committed.
    pub fn bumps(&self, commands: &[Vec<Vec<u8>>], index: u64) -> Vec<(Vec<u8>, u64, u64)> {
        if self.watched.is_empty() {
            return Vec::new();
        }
        if writes_everything(commands) {
            return self
                .watched
                .iter()
                .map(|(k, (_, lapse))| (k.clone(), index, *lapse))
                .collect();
        }
        dedup(accesses(commands))
            .into_iter()
            .filter(|(_, write)| *write)
            .filter_map(|(k, _)| {
                let (_, lapse) = self.watched.get(&k)?;
                Some((k, index, *lapse))
            })
            .collect()
    }

    /// Applies committed [`Locks::bumps`].
    pub fn bumped(&mut self, bumps: Vec<(Vec<u8>, u64, u64)>) {
        for (k, v, lapse) in bumps {
            self.watched.insert(k, (v, lapse));
        }
    }

    /// Transactions prepared here, commit decisions kept here, watched keys, and slots
    /// moved away from their config owner (as far as this partition knows).
    pub fn counts(&self) -> (usize, usize, usize, usize) {
        (
            self.prepared.len(),
            self.decided.len(),
            self.watched.len(),
            self.moved.len(),
        )
    }

    /// Records one slot move carries inline at most (its vote, `MoveIn`), and one chunk.
    fn move_records(&self, max: usize) -> usize {
        #[cfg(test)]
        if let Some(fewer) = self.move_records_max {
            return fewer.min(max);
        }
        max
    }

    /// Which partition this is (0 outside a cluster).
    pub fn partition(&self) -> usize {
        self.home.as_ref().map_or(0, |(me, _)| *me)
    }

    /// Sets which partition this is (see [`Home`]).
    pub fn set_home(&mut self, home: Home) {
        self.home = Some(home);
    }

    /// A flag that is set once this partition has moved any slot (see
    /// `Replication::owner`).
    pub fn moved_flag(&self) -> Arc<std::sync::atomic::AtomicBool> {
        Arc::clone(&self.moved_any)
    }

    fn set_moved(&mut self, moved: BTreeMap<u16, usize>) {
        if !moved.is_empty() {
            self.moved_any
                .store(true, std::sync::atomic::Ordering::Release);
        }
        self.moved = moved;
    }

    /// The partition that owns `slot` as far as this one knows: itself, the one it moved
    /// the slot to, or the config's owner.
    pub fn owner(&self, slot: u16) -> Option<usize> {
        let (_, config) = self.home.as_ref()?;
        Some(
            self.moved
                .get(&slot)
                .copied()
                .unwrap_or_else(|| config(slot)),
        )
    }

    /// A digest of the slot moves this partition knows (its replicated table of slots moved
    /// from their config owners): whenever the slots it owns change, so does the digest, so a
    /// node that learned them can tell, from eight bytes, whether to ask again.
    pub fn moves_digest(&self) -> u64 {
        // FNV-1a over (slot, partition) in slot order: the same table gives the same digest
        // on every replica.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for (&slot, &p) in &self.moved {
            for b in slot
                .to_le_bytes()
                .into_iter()
                .chain((p as u64).to_le_bytes())
            {
                h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        h
    }

    /// The slots of `slots` this partition does not own, with their owner.
    fn elsewhere(&self, slots: impl IntoIterator<Item = u16>) -> Vec<(u16, usize)> {
        let Some((me, _)) = &self.home else {
            return Vec::new();
        };
        let mut out: Vec<(u16, usize)> = slots
            .into_iter()
            .filter_map(|s| self.owner(s).filter(|o| o != me).map(|o| (s, o)))
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The slots of `commands`' keys that are not this partition's, with their owner: such an
    /// entry or read is answered `Moved`.
    pub fn misplaced(&self, commands: &[Vec<Vec<u8>>]) -> Vec<(u16, usize)> {
        if self.home.is_none() {
            return Vec::new();
        }
        self.elsewhere(accesses(commands).iter().map(|(k, _)| slot_of(k)))
    }

    /// The prepared transactions: id, coordinator partition, when it was prepared (its
    /// leader's clock) and its deadline.
    pub fn prepared(&self) -> Vec<(TxnId, usize, u64, u64)> {
        self.prepared
            .iter()
            .map(|(t, r)| (*t, r.coordinator, r.request.now_ms, r.deadline_ms))
            .collect()
    }

    /// The commands of the transaction `txn` prepared here (`None`: not prepared here), for
    /// the blocked clients its commit may wake.
    pub fn prepared_commands(&self, txn: &TxnId) -> Option<Vec<Vec<Vec<u8>>>> {
        self.prepared.get(txn).map(|r| r.request.commands.clone())
    }

    /// The slot moves with collections staged here, and their deadlines.
    pub fn staged(&self) -> Vec<(TxnId, u64)> {
        self.staging
            .iter()
            .map(|(t, s)| (*t, s.deadline_ms))
            .collect()
    }

    /// The commit decisions kept here.
    pub fn decided(&self) -> Vec<(TxnId, Decided)> {
        self.decided.iter().map(|(t, d)| (*t, d.clone())).collect()
    }

    /// How many keys are locked.
    #[cfg(test)]
    pub fn locked_keys(&self) -> usize {
        self.held.len()
    }

    fn take(&mut self, txn: TxnId, record: Record) {
        if let Some((slots, _)) = &record.moving {
            self.slots_locked.extend(slots);
        }
        if writes_everything(&record.request.commands) {
            self.global += 1;
        }
        for (key, write) in dedup(accesses(&record.request.commands)) {
            let held = self.held.entry(key).or_default();
            if write {
                held.writer = true;
            } else {
                held.readers += 1;
            }
        }
        self.prepared.insert(txn, record);
    }

    fn release(&mut self, txn: TxnId) -> Option<Record> {
        let record = self.prepared.remove(&txn)?;
        if let Some((slots, _)) = &record.moving {
            for s in slots {
                self.slots_locked.remove(s);
            }
        }
        if writes_everything(&record.request.commands) {
            self.global = self.global.saturating_sub(1);
        }
        for (key, write) in dedup(accesses(&record.request.commands)) {
            if let Some(held) = self.held.get_mut(&key) {
                if write {
                    held.writer = false;
                } else {
                    held.readers = held.readers.saturating_sub(1);
                }
                if !held.writer && held.readers == 0 {
                    self.held.remove(&key);
                }
            }
        }
        Some(record)
    }

    /// Rebuilds the table from `db`'s records (at start, after a snapshot install).
    pub fn load(&mut self, db: &Db) -> Result<()> {
        let home = self.home.take();
        let moved_any = Arc::clone(&self.moved_any);
        #[cfg(test)]
        let (ignore_locks, lose_moves, move_records_max) =
            (self.ignore_locks, self.lose_moves, self.move_records_max);
        *self = Locks {
            home,
            moved_any,
            ..Locks::default()
        };
        #[cfg(test)]
        {
            self.ignore_locks = ignore_locks;
            self.lose_moves = lose_moves;
            self.move_records_max = move_records_max;
        }
        let snap = db.snapshot().map_err(sm_err)?;
        for (key, value) in snap.range::<[u8]>((Included(PREPARED), Unbounded)) {
            let Some(id) = key.strip_prefix(PREPARED) else {
                break;
            };
            let txn = decode_id(id)?;
            let record: Record = postcard::from_bytes(&value).map_err(sm_err)?;
            self.take(txn, record);
        }
        for (key, value) in snap.range::<[u8]>((Included(DECIDED), Unbounded)) {
            let Some(id) = key.strip_prefix(DECIDED) else {
                break;
            };
            let decided: Decided = postcard::from_bytes(&value).map_err(sm_err)?;
            self.decided.insert(decode_id(id)?, decided);
        }
        if let Some(v) = snap.get(CLOCK).map_err(sm_err)? {
            self.clock = u64::from_be_bytes(v.as_slice().try_into().map_err(sm_err)?);
        }
        if let Some(v) = snap.get(MOVED).map_err(sm_err)? {
            let moved = postcard::from_bytes(&v).map_err(sm_err)?;
            self.set_moved(moved);
        }
        for (key, value) in snap.range::<[u8]>((Included(WATCHED), Unbounded)) {
            let Some(k) = key.strip_prefix(WATCHED) else {
                break;
            };
            let (v, lapse) = watch_value(&value)?;
            self.watched.insert(k.to_vec(), (v, lapse));
        }
        for (key, value) in snap.range::<[u8]>((Included(STAGED), Unbounded)) {
            let Some(rest) = key.strip_prefix(STAGED) else {
                break;
            };
            let (Ok(generation), Ok(deadline)) = (
                <[u8; 8]>::try_from(rest.get(18..).unwrap_or_default()),
                <[u8; 8]>::try_from(value.as_slice()),
            ) else {
                return Err(sm_err("a staged generation's record is malformed"));
            };
            let staging = self.staging.entry(decode_id(&rest[..18])?).or_default();
            staging.deadline_ms = u64::from_be_bytes(deadline);
            staging.generations.insert(u64::from_be_bytes(generation));
        }
        Ok(())
    }
}

/// The record of a watched key.
pub fn watch_record(key: &[u8], version: u64, lapse: u64) -> (Vec<u8>, Vec<u8>) {
    let mut v = version.to_be_bytes().to_vec();
    v.extend_from_slice(&lapse.to_be_bytes());
    ([WATCHED, key].concat(), v)
}

fn watch_value(v: &[u8]) -> Result<(u64, u64)> {
    if v.len() != 16 {
        return Err(sm_err("a watch record is malformed"));
    }
    Ok((
        u64::from_be_bytes(v[..8].try_into().expect("8 bytes")),
        u64::from_be_bytes(v[8..].try_into().expect("8 bytes")),
    ))
}

/// The records of a move's slots, as their source reads them.
pub struct SlotData {
    /// What makes their keys exist: plain strings, meta records, expiry index entries.
    pub visible: Vec<(Vec<u8>, Vec<u8>)>,
    /// The generations of their collections, in key order.
    pub generations: Vec<u64>,
    /// Every size record and sub-key of those generations, when they fit one move beside
    /// `visible` ([`fits_one_move`]); `None`: the move carries them in chunks
    /// (`Op::MoveChunk`, `Op::MoveStage`).
    pub inline: Option<Vec<(Vec<u8>, Vec<u8>)>>,
}

/// Whether `records` records of `bytes` bytes (each counted with 20 bytes of framing) fit
/// one move's entry at the destination, and the source's deletion of them.
pub fn fits_one_move(records: usize, bytes: usize) -> bool {
    records <= MOVE_RECORDS_MAX && bytes + 4096 <= super::REQUEST_BYTES_MAX
}

/// Bytes a record weighs in a move (its key and value, and framing).
pub fn move_weight((k, v): &(Vec<u8>, Vec<u8>)) -> usize {
    k.len() + v.len() + 20
}

/// The records of the keys in `slots` ([`SlotData`]; the graveyard of dropped collections
/// stays). A scan of the whole database, then of each collection.
pub fn slot_data(
    db: &Db,
    locks: &Locks,
    slots: &std::collections::BTreeSet<u16>,
) -> Result<SlotData> {
    let records_max = locks.move_records(MOVE_RECORDS_MAX);
    use crate::keyspace::{self, EXPIRY, INTERNAL, META};
    let snap = db.snapshot().map_err(sm_err)?;
    let mut visible = Vec::new();
    let mut generations = Vec::new();
    for (key, value) in snap.range::<[u8]>(..) {
        let user: Option<Vec<u8>> = if let Some(user) = keyspace::user_key(&key) {
            Some(user.into_owned())
        } else if key.len() >= 2 && key[0] == INTERNAL && key[1] == META {
            Some(key[2..].to_vec())
        } else if key.len() >= 10 && key[0] == INTERNAL && key[1] == EXPIRY {
            Some(key[10..].to_vec())
        } else {
            None
        };
        let Some(user) = user else {
            continue;
        };
        if !slots.contains(&slot_of(&user)) {
            continue;
        }
        if key.len() >= 2 && key[0] == INTERNAL && key[1] == META {
            let meta = keyspace::Meta::decode(&value).map_err(|e| sm_err(e.0))?;
            if meta.generation != 0 {
                generations.push(meta.generation);
            }
        }
        visible.push((key, value));
    }
    let mut records = visible.len();
    let mut bytes: usize = visible.iter().map(move_weight).sum();
    let mut inline = Some(Vec::new());
    generation_records(&snap, &generations, &[], |pair| {
        records += 1;
        bytes += move_weight(&pair);
        if !fits_one_move(records, bytes) || records > records_max {
            inline = None;
            return ControlFlow::Break(());
        }
        inline.as_mut().expect("still inline").push(pair);
        ControlFlow::Continue(())
    })?;
    Ok(SlotData {
        visible,
        generations,
        inline,
    })
}

/// Each size record and sub-key of `generations`, generation by generation (each: its size
/// record, then its sub-keys kind by kind), starting after the engine key `after` (empty:
/// from the start), until `each` breaks.
fn generation_records(
    snap: &keel::Snapshot<'_>,
    generations: &[u64],
    after: &[u8],
    mut each: impl FnMut((Vec<u8>, Vec<u8>)) -> ControlFlow<()>,
) -> Result<()> {
    use crate::keyspace::{self, ALL_SUB_KINDS, INTERNAL, SIZE};
    // Where `after` is: its generation's place in `generations`, and its kind's.
    let kinds: Vec<u8> = std::iter::once(SIZE)
        .chain(ALL_SUB_KINDS.iter().copied())
        .collect();
    let (mut from_generation, mut from_kind) = (0, 0);
    if !after.is_empty() {
        let generation = (after.len() >= 10 && after[0] == INTERNAL)
            .then(|| u64::from_be_bytes(after[2..10].try_into().expect("8 bytes")));
        let place = generation.and_then(|g| generations.iter().position(|&x| x == g));
        let kind = kinds.iter().position(|&k| after.get(1) == Some(&k));
        let (Some(place), Some(kind)) = (place, kind) else {
            return Err(sm_err(
                "a move's chunk starts after a key of none of its generations",
            ));
        };
        (from_generation, from_kind) = (place, kind);
    }
    for (i, &generation) in generations.iter().enumerate().skip(from_generation) {
        let first_kind = if i == from_generation { from_kind } else { 0 };
        for &kind in &kinds[first_kind..] {
            let prefix = keyspace::sub_prefix(kind, generation);
            let (lo, hi) = keyspace::prefix_range(&prefix);
            let lo = if i == from_generation && kind == kinds[from_kind] && !after.is_empty() {
                Excluded(after.to_vec())
            } else {
                lo
            };
            for pair in snap.range::<[u8]>((
                lo.as_ref().map(Vec::as_slice),
                hi.as_ref().map(Vec::as_slice),
            )) {
                if each(pair).is_break() {
                    return Ok(());
                }
            }
        }
    }
    Ok(())
}

/// A move's vote: its records (every one when they fit one move), and the generations
/// whose records it carries in chunks instead (none when they fit).
fn move_vote(data: SlotData) -> Result<Response> {
    let (pairs, chunked) = match data.inline {
        Some(inline) => ([data.visible, inline].concat(), Vec::new()),
        None => (data.visible, data.generations),
    };
    Ok(Response {
        replies: vec![
            postcard::to_stdvec(&pairs).map_err(sm_err)?,
            postcard::to_stdvec(&chunked).map_err(sm_err)?,
        ],
        ..Response::default()
    })
}

fn still_graved(generation: u64) -> String {
    format!(
        "TRYAGAIN keel: a collection of the slots (generation {generation:016x}) moved away \
         from this partition lately and its old records are still being reclaimed here; move \
         the slots again in a moment"
    )
}

/// Why the destination refuses a move's `MoveIn` (`None`: it takes it): a collection it
/// brings whose generation is in the graveyard here or names a collection here.
fn move_in_refusal(
    db: &Db,
    locks: &Locks,
    txn: TxnId,
    slots: &[u16],
    pairs: &[(Vec<u8>, Vec<u8>)],
) -> Result<Option<String>> {
    let me = locks.home.as_ref().map(|(me, _)| *me);
    let staged = locks.staging.get(&txn).map_or(0, |s| s.generations.len());
    Ok(if slots.iter().any(|&s| locks.owner(s) == me) {
        Some("ERR keel: a slot to move in is this partition's already".into())
    } else if pairs.len() + staged > MOVE_RECORDS_MAX {
        // The driver sends no more (`txn::move_batch`); one that did is refused rather than
        // fail the entry here and at the source.
        Some(format!(
            "ERR keel: a move carries at most {MOVE_RECORDS_MAX} engine records, not {}",
            pairs.len() + staged
        ))
    } else {
        graved(db, pairs, locks.staging.get(&txn))?
    })
}

/// How much longer than a prepare's the source's resolver waits for a chunked move's next
/// chunk before it asks the destination for the decision.
const MOVE_PATIENCE_MS: u64 = 4_000;

/// Most records, and bytes, one chunk of a move carries (`Op::MoveChunk`): small enough that
/// the source hears from its driver well within its resolver's patience.
pub const MOVE_CHUNK_RECORDS: usize = 16_384;
pub const MOVE_CHUNK_BYTES: usize = 2 << 20;

/// The generation a size record or sub-key belongs to (`None`: neither).
fn generation_of(key: &[u8]) -> Option<u64> {
    use crate::keyspace::{ALL_SUB_KINDS, INTERNAL, SIZE};
    (key.len() >= 10 && key[0] == INTERNAL && (key[1] == SIZE || ALL_SUB_KINDS.contains(&key[1])))
        .then(|| u64::from_be_bytes(key[2..10].try_into().expect("8 bytes")))
}

/// Why a move's records `pairs` may not be written here (`staged`: what the move staged
/// here already): a generation still in this partition's graveyard (its old sub-keys may be
/// swept after the move wrote them again: a collection that moved away and back before its
/// old copy was swept; refused until they are gone), or one a collection here has.
fn graved(
    db: &Db,
    pairs: &[(Vec<u8>, Vec<u8>)],
    staged: Option<&Staging>,
) -> Result<Option<String>> {
    let generations: std::collections::BTreeSet<u64> = pairs
        .iter()
        .filter_map(|(k, _)| generation_of(k))
        .filter(|g| !staged.is_some_and(|s| s.generations.contains(g)))
        .collect();
    if generations.is_empty() {
        return Ok(None);
    }
    let snap = db.snapshot().map_err(sm_err)?;
    for generation in generations {
        let held = |key: &[u8]| snap.get(key).map(|v| v.is_some()).map_err(sm_err);
        if held(&crate::keyspace::grave_key(generation))? {
            return Ok(Some(still_graved(generation)));
        }
        // A collection here under the same generation: the two would mix their records.
        // Generations are drawn at random per partition (`machine::entry_seed`), so this
        // refuses what should never come.
        if held(&crate::keyspace::size_key(generation))? {
            return Ok(Some(format!(
                "ERR keel: a collection of the slots (generation {generation:016x}) has the \
                 generation of a collection of this partition; it cannot move here"
            )));
        }
    }
    Ok(None)
}

fn staged_key(txn: TxnId, generation: u64) -> Vec<u8> {
    [STAGED, &id_bytes(txn), &generation.to_be_bytes()].concat()
}

/// Drops what the move `txn` staged here (it did not commit): its records, and its
/// generations to the graveyard, whose sweeper deletes their sub-keys. Apply with
/// [`Locks::unstaged`] once committed.
fn unstage(books: &mut Books<'_>, locks: &Locks, txn: TxnId) {
    for &generation in locks
        .staging
        .get(&txn)
        .into_iter()
        .flat_map(|s| &s.generations)
    {
        books.deletes.push(staged_key(txn, generation));
        books
            .deletes
            .push(crate::keyspace::size_key(generation).to_vec());
        books
            .puts
            .push((crate::keyspace::grave_key(generation).to_vec(), Vec::new()));
    }
}

/// Writes `record` as `txn`'s prepared record with `books`, and takes its locks.
/// Keeps `record` as transaction `txn`'s prepared record and takes its locks; or, when the
/// record (its request and replies) is larger than one value may be, commits the books
/// alone and says why the prepare is refused. Failing the entry instead would fail it on
/// every replica, and stop the partition's Raft group (a `MULTI` of three `GET`s of a 7 MiB
/// value beside a write on another partition did).
fn keep_prepared(
    db: &Db,
    locks: &mut Locks,
    books: &mut Books<'_>,
    txn: TxnId,
    record: Record,
) -> Result<std::result::Result<(), String>> {
    let encoded = postcard::to_stdvec(&record).map_err(sm_err)?;
    let room = keel::limits::VALUE_BYTES_MAX.min(keel::limits::TXN_WRITE_BYTES_MAX / 2);
    if encoded.len() > room {
        books.commit(db)?;
        return Ok(Err(format!(
            "ERR keel: limit exceeded: a transaction across partitions keeps its commands and \
             replies on each partition until its decision, at most {room} bytes there; this \
             one needs {}",
            encoded.len()
        )));
    }
    books.puts.push((key(PREPARED, txn), encoded));
    books.commit(db)?;
    locks.take(txn, record);
    Ok(Ok(()))
}

fn moved_status(moved: &[(u16, usize)]) -> Response {
    Response {
        reply: postcard::to_stdvec(moved).expect("encodes"),
        status: Status::Moved,
        ..Response::default()
    }
}

/// A key once, written if any access writes it.
fn dedup(mut keys: Vec<(Vec<u8>, bool)>) -> Vec<(Vec<u8>, bool)> {
    keys.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    keys.dedup_by(|later, first| later.0 == first.0);
    keys
}

pub(super) fn id_bytes(txn: TxnId) -> [u8; 18] {
    let mut b = [0; 18];
    b[..2].copy_from_slice(&txn.node.to_be_bytes());
    b[2..10].copy_from_slice(&txn.incarnation.to_be_bytes());
    b[10..].copy_from_slice(&txn.seq.to_be_bytes());
    b
}

fn decode_id(b: &[u8]) -> Result<TxnId> {
    if b.len() != 18 {
        return Err(sm_err("a transaction record's key is malformed"));
    }
    Ok(TxnId {
        node: u16::from_be_bytes([b[0], b[1]]),
        incarnation: u64::from_be_bytes(b[2..10].try_into().expect("8 bytes")),
        seq: u64::from_be_bytes(b[10..].try_into().expect("8 bytes")),
    })
}

fn key(prefix: &[u8], txn: TxnId) -> Vec<u8> {
    [prefix, &id_bytes(txn)].concat()
}

/// Whether this partition finished `txn` (of deadline `deadline_ms`), as `engine` reads it:
/// decided it, or voted on it and let go. The error's text if the read failed.
pub fn finished(
    engine: &mut keel::Txn<'_>,
    txn: TxnId,
    deadline_ms: u64,
) -> std::result::Result<bool, String> {
    engine
        .get(&finished_key(deadline_ms, txn))
        .map(|found| found.is_some())
        .map_err(|e| format!("ERR keel: {e}"))
}

fn finished_key(deadline_ms: u64, txn: TxnId) -> Vec<u8> {
    [FINISHED, &deadline_ms.to_be_bytes(), &id_bytes(txn)].concat()
}

/// What a transaction entry writes beside the data: records put and deleted, and the marker.
struct Books<'m> {
    puts: Vec<(Vec<u8>, Vec<u8>)>,
    deletes: Vec<Vec<u8>>,
    marker: &'m [u8],
}

impl Books<'_> {
    fn write(&self, t: &mut keel::Txn<'_>) -> std::result::Result<(), keel::Error> {
        t.set_durability(LAZY);
        for (k, v) in &self.puts {
            t.put(k, v)?;
        }
        for k in &self.deletes {
            t.delete(k)?;
        }
        t.put(machine::APPLIED, self.marker)
    }

    /// Writes the books alone (the entry changes no data).
    fn commit(&self, db: &Db) -> Result<()> {
        db.transact(|t| self.write(t)).map_err(sm_err)
    }
}

/// Runs `request`'s commands in a fresh transaction of `db` with the random seed `seed`:
/// the transaction, each command's reply, and the first failure's error (the commands after
/// it are not run).
fn run_each<'a>(
    db: &'a Db,
    request: &Request,
    seed: u64,
) -> Result<(keel::Txn<'a>, Vec<Vec<u8>>, Option<String>)> {
    let cursors = data::Cursors::default();
    let encodings = crate::config::Encodings::default();
    let ctx = data::Ctx {
        bulk_bytes_max: request.bulk_bytes_max,
        cursors: &cursors,
        reply_bytes_max: request.reply_bytes_max,
        track_increments: false,
        clock: crate::keyspace::Clock::at(request.now_ms),
        encodings: &encodings,
        contended: Default::default(),
        cluster: true,
    };
    data::with_seed(seed, || {
        let mut txn = db.begin().map_err(sm_err)?;
        let (replies, failed) = run_in(&mut txn, request, &ctx);
        Ok((txn, replies, failed))
    })
}

/// Runs `request`'s commands in `txn` with `ctx`: each command's reply, and the first
/// failure's error (the commands after it are not run).
pub fn run_in(
    txn: &mut keel::Txn<'_>,
    request: &Request,
    ctx: &data::Ctx<'_>,
) -> (Vec<Vec<u8>>, Option<String>) {
    let commands = request.args();
    let mut replies = Vec::with_capacity(commands.len());
    for args in &commands {
        let mut buf = BytesMut::new();
        let mut out = Out::new(&mut buf, request.proto());
        let result = match table::lookup(&args[0]).filter(|s| data::is_data(s.cmd)) {
            Some(spec) => machine::run_command(spec.cmd, args, txn, ctx, &mut out, true),
            None => Err(data::Fail("ERR keel: not a data command".into())),
        };
        if let Err(data::Fail(text)) = result {
            return (replies, Some(text.into_owned()));
        }
        if buf.len() > ctx.reply_bytes_max {
            return (replies, Some(data::reply_too_big().0.into_owned()));
        }
        replies.push(buf.to_vec());
    }
    (replies, None)
}

/// Runs `request`'s commands and commits them with `books`: their replies, or the error of
/// the command that failed (nothing committed).
fn commit_run(
    db: &Db,
    request: &Request,
    seed: u64,
    books: &Books<'_>,
) -> Result<std::result::Result<Vec<Vec<u8>>, String>> {
    commit_run_with(db, request, seed, books, |_| Ok(Vec::new()))
}

/// [`commit_run`], also writing the records `more` makes of the replies (a decision that
/// keeps them), in the same commit.
///
/// The books and those records may not fit beside what the commands wrote (the engine's
/// limits on one transaction): that is a failed run, not a failed entry, which would fail
/// on every replica and stop the partition's Raft group. (A prepare leaves the room its
/// commit needs, [`ROOM_FOR_BOOKS`]; a coordinator's decision that keeps replies past a
/// value's size aborts.)
fn commit_run_with(
    db: &Db,
    request: &Request,
    seed: u64,
    books: &Books<'_>,
    more: impl Fn(&[Vec<u8>]) -> Result<Vec<(Vec<u8>, Vec<u8>)>>,
) -> Result<std::result::Result<Vec<Vec<u8>>, String>> {
    for _ in 0..machine::APPLY_ATTEMPTS {
        let (mut txn, replies, failed) = run_each(db, request, seed)?;
        if let Some(text) = failed {
            return Ok(Err(text));
        }
        let records = more(&replies)?;
        let booked = books
            .write(&mut txn)
            .and_then(|()| records.iter().try_for_each(|(k, v)| txn.put(k, v)));
        match booked {
            Ok(()) => {}
            Err(e @ keel::Error::LimitExceeded { .. }) => {
                return Ok(Err(format!(
                    "ERR keel: {e} (with the records a replicated transaction keeps beside it)"
                )));
            }
            Err(e) => return Err(sm_err(e)),
        }
        match txn.commit() {
            Ok(Ok(_)) => return Ok(Ok(replies)),
            Ok(Err(_conflict)) => continue,
            // A commutative add met a value that is not an integer.
            Err(keel::CommitError::Apply(e)) => return Ok(Err(format!("ERR {e}"))),
            Err(e) => return Err(sm_err(e)),
        }
    }
    Err(sm_err("an entry's transaction kept conflicting"))
}

fn status(status: Status) -> Response {
    Response {
        status,
        ..Response::default()
    }
}

fn committed(replies: Vec<Vec<u8>>) -> Response {
    Response {
        replies,
        status: Status::Committed,
        ..Response::default()
    }
}

fn failed(text: String) -> Response {
    Response {
        reply: text.into_bytes(),
        status: Status::Failed,
        ..Response::default()
    }
}

/// Applies a transaction entry (`request.op` is not `Run`) with `marker` as the new applied
/// marker and `seed` the entry's random seed.
pub fn apply(
    db: &Db,
    locks: &mut Locks,
    request: &Request,
    marker: &[u8],
    seed: u64,
    index: u64,
) -> Result<Response> {
    let clock = locks.clock.max(request.now_ms);
    let mut books = Books {
        puts: vec![(CLOCK.to_vec(), clock.to_be_bytes().to_vec())],
        deletes: Vec::new(),
        marker,
    };
    // Finished records whose deadline passed: nothing they would refuse can be accepted now.
    {
        let snap = db.snapshot().map_err(sm_err)?;
        let end = [FINISHED, &clock.to_be_bytes()].concat();
        books.deletes.extend(
            snap.range::<[u8]>((Included(FINISHED), Excluded(end.as_slice())))
                .map(|(k, _)| k),
        );
    }
    let finished = |deadline_ms: u64, txn: TxnId| -> Result<bool> {
        let snap = db.snapshot().map_err(sm_err)?;
        Ok(snap
            .get(&finished_key(deadline_ms, txn))
            .map_err(sm_err)?
            .is_some())
    };
    let response = match &request.op {
        Op::Run | Op::Many(_) => unreachable!("plain entries are applied by the machine"),
        Op::Prepare {
            txn,
            coordinator,
            deadline_ms,
        } => {
            if let Some(record) = locks.prepared.get(txn) {
                // Already prepared here: the same vote.
                let replies = record.replies.clone();
                books.commit(db)?;
                Response {
                    replies,
                    ..Response::default()
                }
            } else if clock > *deadline_ms || finished(*deadline_ms, *txn)? {
                books.commit(db)?;
                status(Status::Aborted)
            } else if let moved @ [_, ..] = &locks.misplaced(&touched(request))[..] {
                books.commit(db)?;
                moved_status(moved)
            } else if locks.conflicts(&touched(request)) {
                books.commit(db)?;
                status(Status::Busy)
            } else if locks.watch_changed(&request.watched, clock) {
                books.commit(db)?;
                failed(WATCH_CHANGED.into())
            } else {
                let (txn_data, replies, mut fail) = run_each(db, request, seed)?;
                // The commit runs the commands again, with its records beside them: it
                // must not meet a limit then, after this vote (its keys are locked until
                // it, so they write the same).
                let (keys_left, bytes_left) = txn_data.writes_left();
                let bumps = locks.bumps(&request.commands, index).len();
                if fail.is_none()
                    && (keys_left < ROOM_FOR_BOOKS.0 + bumps
                        || bytes_left < ROOM_FOR_BOOKS.1 * (1 + bumps))
                {
                    fail = Some(format!(
                        "ERR keel: limit exceeded: the transaction leaves no room in its \
                         partition's commit for the records a replicated transaction keeps \
                         beside it (at most {} keys written, less {} of them)",
                        keel::limits::TXN_WRITE_KEYS_MAX,
                        ROOM_FOR_BOOKS.0 + bumps
                    ));
                }
                // The effect is not kept: the commit runs the commands again.
                drop(txn_data);
                match fail {
                    Some(text) => {
                        books.commit(db)?;
                        failed(text)
                    }
                    None => {
                        let record = Record {
                            request: Request {
                                op: Op::Run,
                                ..request.clone()
                            },
                            seed,
                            coordinator: *coordinator,
                            deadline_ms: *deadline_ms,
                            replies: replies.clone(),
                            moving: None,
                        };
                        match keep_prepared(db, locks, &mut books, *txn, record)? {
                            Ok(()) => Response {
                                replies,
                                ..Response::default()
                            },
                            Err(text) => failed(text),
                        }
                    }
                }
            }
        }
        Op::Decide {
            txn,
            participants,
            deadline_ms,
        } => {
            let abort = |books: &mut Books<'_>| {
                books
                    .puts
                    .push((finished_key(*deadline_ms, *txn), b"a".to_vec()));
            };
            if let Some(decided) = locks.decided.get(txn) {
                let replies = decided.replies.clone();
                books.commit(db)?;
                committed(replies)
            } else if clock > *deadline_ms || finished(*deadline_ms, *txn)? {
                books.commit(db)?;
                status(Status::Aborted)
            } else if let moved @ [_, ..] = &locks.misplaced(&touched(request))[..] {
                abort(&mut books);
                books.commit(db)?;
                moved_status(moved)
            } else if locks.conflicts(&touched(request)) {
                abort(&mut books);
                books.commit(db)?;
                status(Status::Busy)
            } else if locks.watch_changed(&request.watched, clock) {
                abort(&mut books);
                books.commit(db)?;
                failed(WATCH_CHANGED.into())
            } else {
                // The decision keeps the replies (for a driver that lost its answer), made
                // in the commit of the commands that give them.
                let decided_of = |replies: Vec<Vec<u8>>| Decided {
                    participants: participants.clone(),
                    deadline_ms: *deadline_ms,
                    replies,
                };
                let decision = |replies: &[Vec<u8>]| {
                    let record = postcard::to_stdvec(&decided_of(replies.to_vec()));
                    Ok(vec![(key(DECIDED, *txn), record.map_err(sm_err)?)])
                };
                let bumps = locks.bumps(&request.commands, index);
                let mut with_bumps = Books {
                    puts: books.puts.clone(),
                    deletes: books.deletes.clone(),
                    marker,
                };
                with_bumps
                    .puts
                    .extend(bumps.iter().map(|(k, v, l)| watch_record(k, *v, *l)));
                let outcome =
                    commit_run_with(db, request, seed, &with_bumps, decision)?.map(|replies| {
                        locks.bumped(bumps);
                        decided_of(replies)
                    });
                match outcome {
                    Ok(decided) => {
                        let replies = decided.replies.clone();
                        locks.decided.insert(*txn, decided);
                        committed(replies)
                    }
                    Err(text) => {
                        abort(&mut books);
                        books.commit(db)?;
                        failed(text)
                    }
                }
            }
        }
        Op::Commit { txn, deadline_ms } => {
            books
                .puts
                .push((finished_key(*deadline_ms, *txn), b"c".to_vec()));
            match locks.prepared.get(txn).cloned() {
                Some(Record {
                    moving: Some((slots, to)),
                    ..
                }) => {
                    // The slots' data went to `to` with its decision: drop it here. A move
                    // that went in chunks drops what makes its keys exist, and sends its
                    // collections to the graveyard (the move kept them within one
                    // transaction's keys: `txn::move_batch`).
                    books.deletes.push(key(PREPARED, *txn));
                    let set: std::collections::BTreeSet<u16> = slots.iter().copied().collect();
                    let data = slot_data(db, locks, &set)?;
                    books
                        .deletes
                        .extend(data.visible.into_iter().map(|(k, _)| k));
                    match data.inline {
                        Some(records) => books.deletes.extend(records.into_iter().map(|(k, _)| k)),
                        None => {
                            for generation in data.generations {
                                books
                                    .deletes
                                    .push(crate::keyspace::size_key(generation).to_vec());
                                books.puts.push((
                                    crate::keyspace::grave_key(generation).to_vec(),
                                    Vec::new(),
                                ));
                            }
                        }
                    }
                    let mut moved = locks.moved.clone();
                    moved.extend(slots.iter().map(|&s| (s, to)));
                    books
                        .puts
                        .push((MOVED.to_vec(), postcard::to_stdvec(&moved).map_err(sm_err)?));
                    books.commit(db)?;
                    locks.release(*txn);
                    locks.set_moved(moved);
                }
                Some(record) => {
                    books.deletes.push(key(PREPARED, *txn));
                    let bumps = locks.bumps(&record.request.commands, index);
                    books
                        .puts
                        .extend(bumps.iter().map(|(k, v, l)| watch_record(k, *v, *l)));
                    let done = commit_run(db, &record.request, record.seed, &books)?;
                    if done.is_ok() {
                        locks.bumped(bumps);
                    }
                    if let Err(text) = done {
                        // Its keys were locked since the prepare ran them: this cannot
                        // happen, and every replica would fail the same way.
                        tracing::error!(
                            "a prepared transaction failed at its commit ({text}); dropped"
                        );
                        books.commit(db)?;
                    }
                    locks.release(*txn);
                }
                // Not prepared here (installed already, or its prepare never applied): the
                // finished record refuses a prepare of it that comes later.
                None => books.commit(db)?,
            }
            status(Status::Done)
        }
        Op::Abort { txn, deadline_ms } => {
            books
                .puts
                .push((finished_key(*deadline_ms, *txn), b"a".to_vec()));
            if locks.prepared.contains_key(txn) {
                books.deletes.push(key(PREPARED, *txn));
            }
            unstage(&mut books, locks, *txn);
            books.commit(db)?;
            locks.release(*txn);
            locks.staging.remove(txn);
            status(Status::Done)
        }
        Op::Resolve { txn, deadline_ms } => {
            if let Some(decided) = locks.decided.get(txn) {
                let replies = decided.replies.clone();
                books.commit(db)?;
                committed(replies)
            } else {
                // No decision yet: abort, recorded so that a `Decide` that comes later is
                // refused (past the deadline it is anyway).
                if clock <= *deadline_ms {
                    books
                        .puts
                        .push((finished_key(*deadline_ms, *txn), b"a".to_vec()));
                }
                unstage(&mut books, locks, *txn);
                books.commit(db)?;
                locks.staging.remove(txn);
                status(Status::Aborted)
            }
        }
        Op::MoveOut {
            txn,
            slots,
            to,
            deadline_ms,
        } => {
            let set: std::collections::BTreeSet<u16> = slots.iter().copied().collect();
            let locked = |locks: &Locks| {
                locks.global > 0
                    || slots.iter().any(|s| locks.slots_locked.contains(s))
                    || locks.held.keys().any(|k| set.contains(&slot_of(k)))
            };
            if locks.prepared.contains_key(txn) {
                // Already prepared here: the same vote.
                books.commit(db)?;
                move_vote(slot_data(db, locks, &set)?)?
            } else if clock > *deadline_ms || finished(*deadline_ms, *txn)? {
                books.commit(db)?;
                status(Status::Aborted)
            } else if let moved @ [_, ..] = &locks.elsewhere(slots.iter().copied())[..] {
                books.commit(db)?;
                moved_status(moved)
            } else if locked(locks) {
                books.commit(db)?;
                status(Status::Busy)
            } else {
                let data = slot_data(db, locks, &set)?;
                let record = Record {
                    request: Request {
                        commands: Vec::new(),
                        op: Op::Run,
                        ..request.clone()
                    },
                    seed,
                    coordinator: *to,
                    deadline_ms: *deadline_ms,
                    replies: Vec::new(),
                    moving: Some((slots.clone(), *to)),
                };
                match keep_prepared(db, locks, &mut books, *txn, record)? {
                    Ok(()) => move_vote(data)?,
                    // A move's record holds no replies: never this big.
                    Err(text) => failed(text),
                }
            }
        }
        Op::MoveIn {
            txn,
            slots,
            from,
            pairs,
            deadline_ms,
        } => {
            let me = locks.home.as_ref().map(|(me, _)| *me);
            if locks.decided.contains_key(txn) {
                books.commit(db)?;
                committed(Vec::new())
            } else if clock > *deadline_ms || finished(*deadline_ms, *txn)? {
                books.commit(db)?;
                status(Status::Aborted)
            } else if let Some(text) = move_in_refusal(db, locks, *txn, slots, pairs)? {
                // Refused: decided abort (the source's `Abort`, or its resolver, follows).
                books
                    .puts
                    .push((finished_key(*deadline_ms, *txn), b"a".to_vec()));
                unstage(&mut books, locks, *txn);
                books.commit(db)?;
                locks.staging.remove(txn);
                failed(text)
            } else {
                let Some(me) = me else {
                    unreachable!("a partition outside a cluster owns every slot");
                };
                let decided = Decided {
                    participants: vec![*from],
                    deadline_ms: *deadline_ms,
                    replies: Vec::new(),
                };
                // What it staged is the partition's now.
                for &generation in locks
                    .staging
                    .get(txn)
                    .into_iter()
                    .flat_map(|s| &s.generations)
                {
                    books.deletes.push(staged_key(*txn, generation));
                }
                let mut moved = locks.moved.clone();
                moved.extend(slots.iter().map(|&s| (s, me)));
                #[cfg(test)]
                let pairs = if locks.lose_moves { &Vec::new() } else { pairs };
                books.puts.extend(pairs.iter().cloned());
                books
                    .puts
                    .push((MOVED.to_vec(), postcard::to_stdvec(&moved).map_err(sm_err)?));
                books.puts.push((
                    key(DECIDED, *txn),
                    postcard::to_stdvec(&decided).map_err(sm_err)?,
                ));
                books.commit(db)?;
                locks.decided.insert(*txn, decided);
                locks.set_moved(moved);
                locks.staging.remove(txn);
                committed(Vec::new())
            }
        }
        Op::MoveChunk {
            txn,
            generations,
            after,
        } => match locks.prepared.get(txn).cloned() {
            Some(mut record) if record.moving.is_some() => {
                // Renewed: its driver is alive. The resolver leaves it alone for
                // `MOVE_PATIENCE_MS` more than a prepare (`txn::resolve_once`): between
                // chunks the driver stages the last one at the destination.
                record.request.now_ms = clock + MOVE_PATIENCE_MS;
                books.puts.push((
                    key(PREPARED, *txn),
                    postcard::to_stdvec(&record).map_err(sm_err)?,
                ));
                books.commit(db)?;
                locks.prepared.insert(*txn, record);
                let snap = db.snapshot().map_err(sm_err)?;
                let mut pairs: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
                let (mut bytes, mut more) = (0, None);
                let chunk_records = locks.move_records(MOVE_CHUNK_RECORDS);
                generation_records(&snap, generations, after, |pair| {
                    if pairs.len() >= chunk_records
                        || (!pairs.is_empty() && bytes + move_weight(&pair) > MOVE_CHUNK_BYTES)
                    {
                        more = pairs.last().map(|(k, _)| k.clone());
                        return ControlFlow::Break(());
                    }
                    bytes += move_weight(&pair);
                    pairs.push(pair);
                    ControlFlow::Continue(())
                })?;
                Response {
                    replies: vec![
                        postcard::to_stdvec(&pairs).map_err(sm_err)?,
                        more.unwrap_or_default(),
                    ],
                    ..Response::default()
                }
            }
            // Decided (or never prepared here): the driver learns the move is off.
            _ => {
                books.commit(db)?;
                status(Status::Aborted)
            }
        },
        Op::MoveStage {
            txn,
            slots,
            pairs,
            deadline_ms,
        } => {
            let me = locks.home.as_ref().map(|(me, _)| *me);
            if locks.decided.contains_key(txn)
                || clock > *deadline_ms
                || finished(*deadline_ms, *txn)?
                || slots.iter().any(|&s| locks.owner(s) == me)
            {
                // Decided, or late: nothing more may land for it.
                books.commit(db)?;
                status(Status::Aborted)
            } else if pairs.len() > MOVE_RECORDS_MAX / 2 {
                books.commit(db)?;
                failed(format!(
                    "ERR keel: a move's chunk carries at most {} engine records, not {}",
                    MOVE_RECORDS_MAX / 2,
                    pairs.len()
                ))
            } else if let Some(text) = graved(db, pairs, locks.staging.get(txn))? {
                books.commit(db)?;
                failed(text)
            } else if let Some((k, _)) = pairs.iter().find(|(k, _)| generation_of(k).is_none()) {
                books.commit(db)?;
                failed(format!(
                    "ERR keel: a move's chunk holds a record of no collection ({})",
                    String::from_utf8_lossy(k)
                ))
            } else {
                let known = locks.staging.get(txn);
                let fresh: std::collections::BTreeSet<u64> = pairs
                    .iter()
                    .filter_map(|(k, _)| generation_of(k))
                    .filter(|g| !known.is_some_and(|known| known.generations.contains(g)))
                    .collect();
                books.puts.extend(pairs.iter().cloned());
                books.puts.extend(
                    fresh
                        .iter()
                        .map(|&g| (staged_key(*txn, g), deadline_ms.to_be_bytes().to_vec())),
                );
                books.commit(db)?;
                let staging = locks.staging.entry(*txn).or_default();
                staging.deadline_ms = *deadline_ms;
                staging.generations.extend(fresh);
                status(Status::Done)
            }
        }
        Op::ReadDecide { .. } => {
            // A read at the leader (`Partition::submit`), never sent as an entry by keel: one
            // that came as an entry is refused on every replica alike.
            books.commit(db)?;
            failed("ERR keel: a transaction's read is not a log entry".into())
        }
        Op::Watch => {
            let watching: usize = request
                .commands
                .iter()
                .map(|c| c.len().saturating_sub(1))
                .sum();
            if let moved @ [_, ..] = &locks.misplaced(&request.commands)[..] {
                books.commit(db)?;
                moved_status(moved)
            } else if watching > super::WATCH_ENTRY_KEYS_MAX {
                // The node sends no more in one entry (`conn.rs`, `watch_replicated`): one
                // that did is refused rather than fail the entry on every replica.
                books.commit(db)?;
                failed(format!(
                    "ERR keel: one WATCH entry watches at most {} keys, not {watching}",
                    super::WATCH_ENTRY_KEYS_MAX
                ))
            } else if locks.conflicts(&request.commands) {
                books.commit(db)?;
                status(Status::Busy)
            } else {
                // Lapsed watches go, the first [`WATCH_ENTRY_KEYS_MAX`] in key order (the
                // same on every replica; the rest at the next entries); each key keeps its
                // version, or starts at this entry.
                let mut lapsed: Vec<Vec<u8>> = locks
                    .watched
                    .iter()
                    .filter(|(_, (_, lapse))| *lapse < clock)
                    .map(|(k, _)| k.clone())
                    .collect();
                lapsed.sort_unstable();
                lapsed.truncate(super::WATCH_ENTRY_KEYS_MAX);
                for k in &lapsed {
                    locks.watched.remove(k);
                    books.deletes.push([WATCHED, k].concat());
                }
                let snap = db.snapshot().map_err(sm_err)?;
                let lapse = clock + WATCH_LAPSE_MS;
                let mut answer = Vec::new();
                for key in request.commands.iter().flat_map(|c| c.iter().skip(1)) {
                    let version = locks.watched.get(key).map_or(index, |(v, _)| *v);
                    let deadline =
                        match snap.get(&crate::keyspace::meta_key(key)).map_err(sm_err)? {
                            Some(meta) => {
                                crate::keyspace::Meta::decode(&meta)
                                    .map_err(|e| sm_err(e.0))?
                                    .deadline
                            }
                            None => 0,
                        };
                    locks.watched.insert(key.clone(), (version, lapse));
                    books.puts.push(watch_record(key, version, lapse));
                    answer.push(super::Watched {
                        key: key.clone(),
                        version,
                        deadline,
                    });
                }
                drop(snap);
                books.commit(db)?;
                Response {
                    reply: postcard::to_stdvec(&answer).map_err(sm_err)?,
                    ..Response::default()
                }
            }
        }
        Op::View { expect, view } => {
            let stored = db.snapshot().map_err(sm_err)?.get(VIEW).map_err(sm_err)?;
            let epoch = match &stored {
                Some(bytes) => {
                    postcard::from_bytes::<super::View>(bytes)
                        .map_err(sm_err)?
                        .epoch
                }
                None => 0,
            };
            let now = if epoch == *expect {
                books.puts.push((VIEW.to_vec(), view.clone()));
                view.clone()
            } else {
                stored.unwrap_or_default()
            };
            books.commit(db)?;
            Response {
                reply: now,
                ..Response::default()
            }
        }
        Op::Forget { txn } => {
            // A finished record refuses a copy of the `Decide` (or `MoveIn`) that comes later,
            // until the deadline (after it, the clock refuses it): run again, it would
            // apply the coordinator's commands a second time.
            if let Some(decided) = locks.decided.get(txn) {
                books
                    .puts
                    .push((finished_key(decided.deadline_ms, *txn), b"c".to_vec()));
            }
            books.deletes.push(key(DECIDED, *txn));
            books.commit(db)?;
            locks.decided.remove(txn);
            status(Status::Done)
        }
    };
    locks.clock = clock;
    Ok(response)
}

//! The reaper: one background thread per server that removes keys past their deadline (the
//! expirer) and the sub-keys of dropped collections (the graveyard sweeper), both as ordinary
//! engine transactions, so that their effects are logged, checkpointed and serializable like
//! any command's (`docs/types.md`).
//!
//! Expirer: lists the expiry index (`FF 'x' deadline key`) up to now in a snapshot, then
//! deletes each key whose meta record still carries that deadline, in a transaction of at most
//! [`BATCH_KEYS`] keys that reads each meta record (so it conflicts with, and loses to or
//! waits for, a concurrent write of the key, which decides that key's fate instead). Sweeper:
//! deletes a dead generation's sub-keys in transactions of at most [`BATCH_KEYS`], then its
//! graveyard entry. Nobody else writes a dead generation's sub-keys (every writer reads the
//! meta record that pointed to it), so these deletes are blind. It also deletes the kept
//! answers of forwarded writes past their deadline (`once::sweep`).
//!
//! It runs every [`INTERVAL`], and again at once while a pass finds a full batch. It never
//! blocks a command; a pass that loses a conflict is simply tried again next time.

use std::ops::{Bound, ControlFlow};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::thread::JoinHandle;
use std::time::Duration;

use keel::Db;
use parking_lot::{Condvar, Mutex};

use crate::data::View;
use crate::keyspace::{self as ks, Meta};

/// How often the reaper looks for work when the last pass found little.
pub const INTERVAL: Duration = Duration::from_millis(100);
/// Most keys one reaper transaction deletes (expired keys, or one generation's sub-keys).
pub const BATCH_KEYS: usize = 512;

/// What the reaper has done, for `INFO`.
#[derive(Default)]
pub struct ReaperStats {
    /// Keys deleted because their deadline passed.
    pub expired_keys: AtomicU64,
    /// Sub-keys of dropped collections deleted.
    pub swept_keys: AtomicU64,
    /// Exactly-once answers (`once`) deleted after their deadline.
    pub swept_answers: AtomicU64,
}

type StopSignal = Arc<(Mutex<bool>, Condvar)>;

/// The running reaper thread.
pub struct Reaper {
    handle: JoinHandle<()>,
    stop: StopSignal,
}

impl Reaper {
    /// Starts the thread.
    pub fn start(db: &'static Db, stats: Arc<ReaperStats>) -> std::io::Result<Reaper> {
        let stop: StopSignal = Arc::new((Mutex::new(false), Condvar::new()));
        let signal = stop.clone();
        let handle = std::thread::Builder::new()
            .name("keel-reaper".into())
            .spawn(move || {
                let mut busy = false;
                loop {
                    {
                        let mut stopped = signal.0.lock();
                        if !*stopped && !busy {
                            signal.1.wait_for(&mut stopped, INTERVAL);
                        }
                        if *stopped {
                            return;
                        }
                    }
                    busy = pass(db, &stats);
                }
            })?;
        Ok(Reaper { handle, stop })
    }

    /// Stops the thread and waits for it.
    pub fn stop(self) {
        *self.stop.0.lock() = true;
        self.stop.1.notify_all();
        if self.handle.join().is_err() {
            tracing::error!("the reaper thread panicked");
        }
    }
}

/// One round of both jobs; whether either found a full batch (so there is more to do now).
pub fn pass(db: &Db, stats: &ReaperStats) -> bool {
    let expired = match expire_due(db, ks::unix_ms()) {
        Ok(n) => {
            stats.expired_keys.fetch_add(n.deleted, Relaxed);
            n.full
        }
        Err(e) => {
            tracing::debug!(error = %e.0, "expiry pass failed; retrying later");
            false
        }
    };
    let swept = match sweep(db) {
        Ok(n) => {
            stats.swept_keys.fetch_add(n.deleted, Relaxed);
            n.full
        }
        Err(e) => {
            tracing::debug!(error = %e.0, "graveyard pass failed; retrying later");
            false
        }
    };
    let answers = match crate::once::sweep(db, ks::unix_ms()) {
        Ok(n) => {
            stats.swept_answers.fetch_add(n.deleted, Relaxed);
            n.full
        }
        Err(e) => {
            tracing::debug!(error = %e.0, "kept answer pass failed; retrying later");
            false
        }
    };
    expired || swept || answers
}

/// What a pass did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Done {
    /// Keys deleted.
    pub deleted: u64,
    /// The pass stopped at its batch limit: more work is waiting.
    pub full: bool,
}

fn begin_error(e: keel::BeginError) -> crate::data::Fail {
    format!("ERR keel: {e}").into()
}

/// Up to [`BATCH_KEYS`] keys whose deadline is at or before `now_ms`, from the expiry index
/// in `view`, with their deadlines; and whether more are due.
fn due_keys(view: &mut View<'_, '_>, now_ms: u64) -> (Vec<(u64, Vec<u8>)>, bool) {
    let lo = Bound::Included(vec![ks::INTERNAL, ks::EXPIRY]);
    let hi = Bound::Included(ks::expiry_key(now_ms, &[]).to_vec());
    let mut due = Vec::new();
    view.range(lo, hi, false, |k, _| {
        if let Some((deadline, key)) = ks::parse_expiry_key(k) {
            due.push((deadline, key.to_vec()));
        }
        if due.len() > BATCH_KEYS {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    });
    let full = due.len() > BATCH_KEYS;
    due.truncate(BATCH_KEYS);
    (due, full)
}

/// Deletes, in `txn`, each of `due` whose meta record still carries that deadline (reading
/// it, so a concurrent write of the key conflicts); how many it deleted.
fn expire_in(
    txn: &mut keel::Txn<'_>,
    due: &[(u64, Vec<u8>)],
    now_ms: u64,
) -> Result<u64, crate::data::Fail> {
    let mut deleted = 0;
    for (deadline, key) in due {
        let meta = txn
            .get_with(&ks::meta_key(key), |v| v.map(Meta::decode))?
            .transpose()?;
        match meta {
            Some(m) if m.deadline == *deadline && m.expired(now_ms) => {
                ks::expire(txn, key, &m)?;
                deleted += 1;
            }
            // A stale entry (never left behind by a command, but harmless to remove).
            _ => txn.delete(&ks::expiry_key(*deadline, key))?,
        }
    }
    Ok(deleted)
}

/// Deletes up to [`BATCH_KEYS`] keys whose deadline is at or before `now_ms`.
pub fn expire_due(db: &Db, now_ms: u64) -> Result<Done, crate::data::Fail> {
    let (due, full) = due_keys(
        &mut View::Snap(&db.snapshot().map_err(begin_error)?),
        now_ms,
    );
    if due.is_empty() {
        return Ok(Done::default());
    }
    let mut txn = db.begin().map_err(begin_error)?;
    let deleted = expire_in(&mut txn, &due, now_ms)?;
    match txn.commit() {
        Ok(Ok(_)) => Ok(Done { deleted, full }),
        Ok(Err(conflict)) => Err(format!("ERR keel: expiry pass conflicted: {conflict}").into()),
        Err(e) => Err(format!("ERR keel: {e}").into()),
    }
}

/// Sub-keys of dropped collections, and graveyard entries, to delete.
type Doomed = (Vec<Vec<u8>>, Vec<Vec<u8>>);

/// Up to [`BATCH_KEYS`] sub-keys of dropped collections in `view`, and the graveyard entries
/// of those whose every sub-key is among them.
fn doomed(view: &mut View<'_, '_>) -> Result<Doomed, crate::data::Fail> {
    let mut graves = Vec::new();
    view.range(
        Bound::Included(vec![ks::INTERNAL, ks::GRAVE]),
        Bound::Excluded(vec![ks::INTERNAL, ks::GRAVE + 1]),
        false,
        |k, v| {
            graves.push((k.to_vec(), v.to_vec()));
            if graves.len() >= BATCH_KEYS {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        },
    );
    let mut doomed = Vec::new();
    let mut empty = Vec::new();
    for (grave, ty) in graves {
        let generation = u64::from_be_bytes(
            grave[2..]
                .try_into()
                .map_err(|_| crate::data::Fail::from("ERR keel: damaged graveyard entry"))?,
        );
        let ty = ty.first().and_then(|&c| ks::Type::from_code(c));
        let prefixes = ty.map_or(ks::ALL_SUB_KINDS, ks::sub_prefixes);
        for &kind in prefixes {
            let (lo, hi) = ks::prefix_range(&ks::sub_prefix(kind, generation));
            view.range(lo, hi, false, |k, _| {
                doomed.push(k.to_vec());
                if doomed.len() >= BATCH_KEYS {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            });
            if doomed.len() >= BATCH_KEYS {
                break;
            }
        }
        if doomed.len() >= BATCH_KEYS {
            break;
        }
        // Everything of this generation is in `doomed`: its entry can go in the same commit.
        empty.push(grave);
    }
    Ok((doomed, empty))
}

/// Deletes up to [`BATCH_KEYS`] sub-keys of dropped collections, and the graveyard entries of
/// those with none left.
pub fn sweep(db: &Db) -> Result<Done, crate::data::Fail> {
    let (doomed, empty) = doomed(&mut View::Snap(&db.snapshot().map_err(begin_error)?))?;
    if doomed.is_empty() && empty.is_empty() {
        return Ok(Done::default());
    }
    let full = doomed.len() >= BATCH_KEYS;
    let mut txn = db.begin().map_err(begin_error)?;
    for k in doomed.iter().chain(&empty) {
        txn.delete(k)?;
    }
    match txn.commit() {
        Ok(Ok(_)) => Ok(Done {
            deleted: doomed.len() as u64,
            full,
        }),
        Ok(Err(conflict)) => Err(format!("ERR keel: graveyard pass conflicted: {conflict}").into()),
        Err(e) => Err(format!("ERR keel: {e}").into()),
    }
}

/// `KEEL.REAP`: one pass of both, in `txn` at `now_ms`: what a replicated partition's leader
/// proposes as a log entry, so that every replica deletes the same keys at the same place in
/// its log (a replicated node runs no reaper thread: its data changes only by entries).
/// Whether more work waits is in `full`.
pub fn reap_in(txn: &mut keel::Txn<'_>, now_ms: u64) -> Result<Reaped, crate::data::Fail> {
    let (due, expiring_full) = due_keys(&mut View::Txn(txn), now_ms);
    let expired = expire_in(txn, &due, now_ms)?;
    let (doomed, empty) = doomed(&mut View::Txn(txn))?;
    for k in doomed.iter().chain(&empty) {
        txn.delete(k)?;
    }
    Ok(Reaped {
        expired,
        swept: doomed.len() as u64,
        full: expiring_full || doomed.len() >= BATCH_KEYS,
    })
}

/// What one [`reap_in`] deleted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Reaped {
    /// Keys past their deadline.
    pub expired: u64,
    /// Sub-keys of dropped collections.
    pub swept: u64,
    /// It stopped at a batch limit: more work is waiting.
    pub full: bool,
}

/// Whether a pass of [`reap_in`] at `now_ms` would find work in `db`: a key due, or a
/// dropped collection.
pub fn has_work(db: &Db, now_ms: u64) -> bool {
    let Ok(snap) = db.snapshot() else {
        return false;
    };
    let mut any = false;
    let mut view = View::Snap(&snap);
    for (lo, hi) in [
        (
            Bound::Included(vec![ks::INTERNAL, ks::EXPIRY]),
            Bound::Included(ks::expiry_key(now_ms, &[]).to_vec()),
        ),
        (
            Bound::Included(vec![ks::INTERNAL, ks::GRAVE]),
            Bound::Excluded(vec![ks::INTERNAL, ks::GRAVE + 1]),
        ),
    ] {
        view.range(lo, hi, false, |_, _| {
            any = true;
            ControlFlow::Break(())
        });
    }
    any
}

//! The coordinator thread: opens split phases, reconciles them, and runs the joined phase in
//! between.
//!
//! One cycle: (1) split: lock every active split record with [`SPLIT_OWNER`], wait until
//! every commit that touched them is visible, open the phase; (2) wait for the phase length,
//! or less once transactions are stashed; (3) close the phase and wait for committers that
//! announced it; (4) reconcile: fold each record's slices, install the result at one fresh
//! commit timestamp, keep the entries as history, publish, unlock; (5) joined: let stashed
//! transactions run, bounded by the phase length.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{Closed, Folded, Kind, SPLIT_OWNER, SplitMode, SplitRecord, Splitter};
use crate::db::Shared;
use crate::mvcc::RecordRef;

/// Stash requests that end a split phase early (batched: one reconciliation serves them).
const STASH_BATCH: u32 = 16;

/// How long the coordinator tries to lock a record before leaving it out of a phase.
const LOCK_TRY: Duration = Duration::from_micros(200);

pub(crate) fn run(shared: &Shared) {
    let splitter = &shared.splitter;
    let phase_len = splitter.settings.phase;
    let mut epoch = 0u64;
    loop {
        // Idle until something is split or proposed.
        {
            let mut control = splitter.control.lock();
            if control.stop {
                return;
            }
            let idle = splitter.proposals.lock().list.is_empty() && splitter.split_count() == 0;
            if idle {
                splitter.wake.wait_for(&mut control, phase_len);
                if control.stop {
                    return;
                }
                drop(control);
                decay(splitter);
                continue;
            }
        }
        if shared.log_failed() {
            return;
        }

        // 1. Split.
        epoch += 1;
        let word = epoch * 2 + 1;
        let members = open(shared, word);
        if members.is_empty() {
            std::thread::sleep(phase_len / 4);
            continue;
        }
        splitter.control.lock().urgent = 0;
        splitter.phase.store(word, Ordering::SeqCst);
        splitter.counters.phases.fetch_add(1, Ordering::Relaxed);

        // 2. Let it run.
        let opened = Instant::now();
        {
            let mut control = splitter.control.lock();
            loop {
                let elapsed = opened.elapsed();
                if control.stop || elapsed >= phase_len {
                    break;
                }
                // Stashed transactions end the phase early, but not before a tenth of it has
                // run, so that one reconciliation serves a batch of them.
                if control.urgent >= STASH_BATCH
                    || (control.urgent > 0 && elapsed >= phase_len / 10)
                {
                    break;
                }
                let wait = if control.urgent > 0 {
                    (phase_len / 10).saturating_sub(elapsed)
                } else {
                    phase_len - elapsed
                };
                splitter
                    .wake
                    .wait_for(&mut control, wait.max(Duration::from_micros(50)));
            }
        }
        decay(splitter);

        // 3 and 4. Close and reconcile.
        splitter.phase.store(epoch * 2, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
        while shared.oracle.announced(word) {
            std::thread::yield_now();
        }
        reconcile(shared, &members);
        {
            let mut control = splitter.control.lock();
            control.joined_epoch = epoch;
            splitter.joined.notify_all();
            // 5. Joined: stashed transactions run now, for at most one phase length.
            let deadline = Instant::now() + phase_len;
            while control.waiting > 0 && !control.stop {
                if splitter.wake.wait_until(&mut control, deadline).timed_out() {
                    break;
                }
            }
            if control.stop {
                return;
            }
        }
    }
}

/// Forgets lock waits counted so far: contention is measured per phase length.
fn decay(splitter: &Splitter) {
    for bucket in splitter.contention.iter() {
        if bucket.load(Ordering::Relaxed) != 0 {
            bucket.store(0, Ordering::Relaxed);
        }
    }
}

/// Adopts proposals, locks every active record for the phase `word`, and returns them.
fn open(shared: &Shared, word: u64) -> Vec<&'static SplitRecord> {
    let splitter = &shared.splitter;
    let mut records = splitter.records.lock();
    {
        // Adopted under the proposals' lock: the collector takes no record while it is
        // held, and none that was proposed (`Splitter::proposal_gate`), and adopted ones are
        // split, which it never takes; so none of these is freed under us.
        let mut p = splitter.proposals.lock();
        for (record, kind) in std::mem::take(&mut p.list) {
            adopt(splitter, &mut records, record, kind);
        }
        p.seen.clear();
    }
    let mut members = Vec::new();
    for sr in records.iter() {
        if !sr.active.load(Ordering::Relaxed) {
            continue;
        }
        let r = sr.record.get();
        if !try_lock_for(sr.record, LOCK_TRY) {
            continue; // busy: left out of this phase, tried again next time
        }
        let base = r.head().and_then(|v| v.value());
        if !sr.kind.accepts_base(r.key(), base) {
            // The value changed to something this kind cannot apply to: join for good.
            splitter.deactivate(sr);
            r.unlock(SPLIT_OWNER);
            continue;
        }
        let budget = match (sr.kind, base) {
            (Kind::Add, Some(v)) => {
                let base = crate::commutative::parse_int(r.key(), v).expect("checked above");
                (i64::MAX as u64 - base.unsigned_abs()) / sr.slices.len() as u64
            }
            (Kind::Add, None) => i64::MAX as u64 / sr.slices.len() as u64,
            _ => u64::MAX,
        };
        sr.budget.store(budget, Ordering::Relaxed);
        sr.reads.store(0, Ordering::Relaxed);
        sr.stashes.store(0, Ordering::Relaxed);
        // SAFETY of the reference: split records live as long as the splitter, which lives
        // as long as the database, and are never moved (boxed).
        let sr: &'static SplitRecord = unsafe { &*std::ptr::from_ref::<SplitRecord>(sr) };
        members.push(sr);
    }
    drop(records);
    // Every tag must be above every version of a member (a reader folds entries tagged at or
    // below its snapshot onto the version there, and recovery applies a record's deltas above
    // its last full value), and above every snapshot that read a member before it was split
    // (such a read folded nothing, so it raised no floor): those began before the split
    // record was attached, at or below the installed watermark now. The newest version may
    // not be visible yet (a commit at the watermark, or one that a transaction prepared for a
    // two-phase commit holds below it until a decision from another node): split-only
    // commits take the ordinary path, a timestamp of their own, until the watermark passes
    // the floor. Nothing waits here for the watermark, with the members locked.
    let read = crate::Ts(shared.oracle.installed());
    for sr in &members {
        let newest = sr.record.get().head().map_or(crate::Ts(0), |v| v.ts());
        sr.raise_tag_floor(newest.max(read));
        sr.phase.store(word, Ordering::Release);
    }
    members
}

#[allow(clippy::vec_box, reason = "split records must keep their address")]
fn adopt(splitter: &Splitter, records: &mut Vec<Box<SplitRecord>>, record: RecordRef, kind: Kind) {
    match splitter.split_of(record.get()) {
        Some(sr) if sr.kind == kind => splitter.activate(sr),
        // Split before for another kind: its history must keep one kind.
        Some(_) => {}
        None => {
            let sr = Box::new(SplitRecord::new(record, kind, splitter.slices));
            splitter.attach(record.get(), &sr);
            splitter.activate(&sr);
            records.push(sr);
        }
    }
}

/// Finishes commit `ts` and waits until the watermark passes it (or the log fails). A
/// transaction prepared for a two-phase commit holds the watermark below its timestamp until
/// its decision, which comes from another node (a round trip, or a recovery): past a short
/// spin this thread sleeps between looks rather than yielding in a loop on a core.
fn publish(shared: &Shared, ts: crate::Ts) {
    shared.oracle.finish(ts);
    let started = Instant::now();
    while shared.oracle.advance() < ts.0 && !shared.log_failed() {
        if started.elapsed() < PUBLISH_SPIN {
            std::thread::yield_now();
        } else {
            std::thread::sleep(PUBLISH_NAP);
        }
    }
}

/// How long [`publish`] yields before it naps, and each nap.
const PUBLISH_SPIN: Duration = Duration::from_micros(200);
const PUBLISH_NAP: Duration = Duration::from_micros(100);

fn try_lock_for(record: RecordRef, wait: Duration) -> bool {
    let r = record.get();
    let deadline = Instant::now() + wait;
    loop {
        if r.try_lock(SPLIT_OWNER) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::yield_now();
    }
}

/// Folds each member's slices into one version at a fresh timestamp, keeps the entries as
/// history, publishes, and unlocks.
fn reconcile(shared: &Shared, members: &[&'static SplitRecord]) {
    let splitter = &shared.splitter;
    let oracle = &shared.oracle;
    let ts = shared.next_commit_ts();
    let horizon = oracle.horizon();
    let mut durable_lsn = 0;
    let mut versions = 0;
    for sr in members {
        let r = sr.record.get();
        let mut history = sr.history.lock();
        let mut entries = Vec::new();
        let mut commits = 0;
        for slice in sr.slices.iter() {
            let mut slice = slice.lock();
            entries.append(&mut slice.entries);
            commits += slice.commits;
            slice.commits = 0;
            slice.magnitude = 0;
        }
        entries.sort_by_key(|e| e.tag);
        let mut folded = Folded::default();
        for entry in &entries {
            folded.take(r.key(), entry);
        }
        durable_lsn = durable_lsn.max(folded.durable_lsn);
        if let Some(delta) = folded.delta {
            let base = r.head().and_then(|v| v.value());
            let value = delta
                .apply(r.key(), base)
                .expect("the phase's base accepts its kind and the budget bounds additions");
            versions += r.install(SPLIT_OWNER, ts, Some(&value), horizon);
            history.push(Closed {
                closed_at: ts,
                entries,
            });
        }
        history.retain(|c| c.closed_at > horizon);
        drop(history);
        sr.phase.store(0, Ordering::Release);
        let reads = sr.reads.load(Ordering::Relaxed) + sr.stashes.load(Ordering::Relaxed);
        let join = match splitter.settings.mode {
            SplitMode::Off => true,
            SplitMode::Force => false,
            // Reads and other operations dominate, or nobody used the split: join.
            SplitMode::Auto => reads > commits || commits == 0,
        };
        if join {
            splitter.deactivate(sr);
        }
    }
    shared.note_versions(versions);
    // Entries of `sync` commits are in the log; the merged version must not be seen before
    // they are durable. After a log failure the version is never published.
    let durable = match &shared.log {
        Some(log) if durable_lsn > 0 => log.wait_durable(durable_lsn).is_ok(),
        _ => true,
    };
    if durable {
        publish(shared, ts);
    }
    for sr in members {
        sr.record.get().unlock(SPLIT_OWNER);
    }
}

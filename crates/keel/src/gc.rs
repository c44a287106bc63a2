//! The collector: gives deleted keys' memory back.
//!
//! A commit that installs a tombstone (and one that aborts after creating a record) notes the
//! record as a *candidate*. The collector thread (`keel-gc`, started by the database) takes
//! each candidate once the GC horizon has passed its tombstone, so that no snapshot can see
//! anything in it but absence: it locks the record for good ([`Record::try_take`]), takes it
//! out of the ordered index and then out of the point index, and *retires* it.
//!
//! A record is noted only while its noter holds its lock (exclusive or shared), so every
//! note of it comes before the take, and a pass examines every waiting note (a taken record
//! reads as dead, and the note goes) before it frees anything: no note outlives its record.
//! A note of a record someone holds waits for the next pass rather than going, as the
//! holder may leave it just as dead.
//!
//! Retired memory (records, the point index's replaced tables, the ordered index's replaced
//! trees) is freed after a grace period: once the horizon has passed the watermark read just
//! after the unlink. Every holder of a record handle or an index node is a registered
//! transaction, snapshot or scan (the registry slot is held from before the lookup to after
//! the last use), and one that could have found the unlinked memory registered before the
//! unlink, so its `read_ts` is at or below that watermark and holds the horizon down until it
//! ends (the registry's store-then-load handshake, model-checked in `concurrency`). The
//! registry slot is the epoch: transactions move between threads (the server's lanes), so a
//! thread-bound epoch (crossbeam-epoch's, seize's local guards) could not cover them, and an
//! owned guard per transaction takes a global lock. Where nothing commits, the collector
//! takes an empty timestamp itself so that the watermark, and with it the horizon, moves on.
//!
//! A leaf the unlinks leave empty is taken out of the ordered index at once
//! ([`Ordered::unlink_empty`](crate::index::ordered::Ordered::unlink_empty)) and freed with
//! the records. A record that is a separator in the ordered index (its leaf's low fence)
//! stays until the tree is rebuilt ([`Ordered::rebuild`](crate::index::ordered::Ordered::rebuild)), which
//! the collector does once removals since the last rebuild reach half the live records, or
//! once scans have passed that many empty leaves (with at least 8192 removals either way).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;
use parking_lot::Mutex;

use crate::Ts;
use crate::index::RetiredTable;
use crate::index::ordered::{RetiredNodes, RetiredTree};
use crate::mvcc::{RecordRef, Take};

/// Removals since the last rebuild of the ordered index that make the next one due, at
/// least: below it a rebuild costs more than the empty leaves it frees.
const REBUILD_REMOVALS_MIN: usize = 8192;

/// Candidates noted since the collector's last pass that make a pass due before its interval
/// is up. Deleted keys stay in the ordered index until collected, and every scan that starts
/// before them passes them (twice: the scan, and the validation's rescan): popping a queue's
/// head (`ZPOPMIN`) at 100 000 pops a second would leave a thousand of them in front of the
/// next pop by the end of an interval. The commit that notes the this-many-th runs the pass
/// itself once published ([`crate::db::Shared::gc_pass_here`]), on its own thread, while
/// the records it deleted are in its cache: no wake-up of the collector's thread, so passes
/// can come often and the runs of deleted keys stay short. (Waking the thread every 32
/// deletes cost more than the shorter runs saved; every 128, a pop still passed about 34.)
/// Passes here every 8 deletes rather than 32 cost a `DEL` 0.8% more instructions and save
/// a `ZPOPMIN` 8.8%, which passes a quarter as many deleted entries (`cost::del`,
/// `cost::zpopmin`).
/// None is due while the last pass left [`WAITING_MAX`] waiting for the horizon (an old
/// snapshot holds it back): a pass then frees little more, and each one walks the waiting
/// list; nor does a committer run one while the horizon has not moved since the last.
pub(crate) const COLLECT_CANDIDATES: usize = 8;

/// Candidates the last pass left waiting above which deletes make no pass due (the
/// collector's interval still runs them). Well above [`COLLECT_CANDIDATES`]: a committer's
/// pass runs while its own transaction holds the horizon below its deletes, so it leaves
/// at least those waiting (a pipeline of 16 `ZPOPMIN`s deletes 32 records).
const WAITING_MAX: usize = 1024;

/// Records noted dead, with the timestamp from which they hold only absence.
type Noted = Vec<(RecordRef, Ts)>;

/// Candidates noted by committers, sharded by thread so that deleting commits on many cores
/// do not meet on one lock.
pub(crate) struct Candidates {
    shards: Box<[CachePadded<Mutex<Noted>>]>,
    count: CachePadded<AtomicUsize>,
    /// Candidates the last pass left waiting for the horizon.
    waiting: AtomicUsize,
}

impl Candidates {
    pub(crate) fn new() -> Candidates {
        Candidates {
            shards: (0..crate::memory::shard_count())
                .map(|_| CachePadded::new(Mutex::new(Vec::new())))
                .collect(),
            count: CachePadded::new(AtomicUsize::new(0)),
            waiting: AtomicUsize::new(0),
        }
    }

    /// `record` may hold nothing but absence from `ts` on: a tombstone committed at `ts`, or
    /// (`Ts(0)`) a record its creator left empty.
    /// Returns whether a pass is due now rather than at the collector's next interval.
    pub(crate) fn note(&self, record: RecordRef, ts: Ts) -> bool {
        let shard = &self.shards[crate::memory::thread_number() % self.shards.len()];
        shard.lock().push((record, ts));
        // The count runs behind the shards (a drain may take this record before the add):
        // it may wrap below zero for a moment, so it adds wrapping, as the atomic does.
        let noted = self.count.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        noted.is_multiple_of(COLLECT_CANDIDATES)
            && self.waiting.load(Ordering::Relaxed) < WAITING_MAX
    }

    fn drain_into(&self, out: &mut Vec<(RecordRef, Ts)>) {
        if self.count.load(Ordering::Relaxed) == 0 {
            return;
        }
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            self.count.fetch_sub(shard.len(), Ordering::Relaxed);
            out.append(&mut shard);
        }
    }
}

/// Memory unlinked in one pass, freed together once the horizon passes `after`.
struct Batch {
    after: Ts,
    records: Vec<RecordRef>,
    #[allow(dead_code)] // held only to be dropped
    tables: Vec<RetiredTable>,
    #[allow(dead_code)] // held only to be dropped
    tree: Option<RetiredTree>,
    #[allow(dead_code)] // held only to be dropped
    nodes: Vec<RetiredNodes>,
}

/// The collector's state; only the collector thread (and the store's drop) touch it.
#[derive(Default)]
pub(crate) struct State {
    /// Candidates whose tombstone the horizon has not passed yet.
    waiting: Vec<(RecordRef, Ts)>,
    /// Unlinked records the ordered index may still use as separators.
    separators: Vec<RecordRef>,
    removed_since_rebuild: usize,
    /// [`Ordered::empty_hops`](crate::index::ordered::Ordered::empty_hops) at the last
    /// rebuild.
    hops_at_rebuild: u64,
    retired: VecDeque<Batch>,
    /// The last empty timestamp the collector took to move the watermark
    /// (`Shared::gc_pass`). It takes no other until the watermark has passed this one.
    pub(crate) nudged: Ts,
    /// The horizon of the last pass.
    pub(crate) horizon: Ts,
}

/// What a pass left behind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Pass {
    /// Records freed in this pass.
    pub(crate) freed: usize,
    /// Versions those records held.
    pub(crate) freed_versions: usize,
    /// Records unlinked in this pass.
    pub(crate) unlinked: usize,
    /// The oldest retired batch's watermark, which the horizon must pass before it is freed.
    pub(crate) blocked_at: Option<Ts>,
    /// Candidates still waiting for the horizon.
    pub(crate) waiting: usize,
}

/// Counters for [`crate::Stats`].
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) freed: AtomicU64,
}

impl State {
    /// Retired records not freed yet (unlinked, or separators awaiting a rebuild).
    pub(crate) fn retired_records(&self) -> impl Iterator<Item = RecordRef> + '_ {
        self.retired
            .iter()
            .flat_map(|b| b.records.iter().copied())
            .chain(self.separators.iter().copied())
    }
}

/// One pass of the collector over `store`, at GC horizon `horizon`. `visible` reads the
/// watermark (after the unlinks, sequentially consistent); `proposed` holds the splitter's
/// proposals while records are taken and says whether one was proposed for splitting (such a
/// record is left alone: the split coordinator will adopt it without a registry slot).
pub(crate) fn pass(
    store: &crate::store::MemStore,
    state: &mut State,
    horizon: Ts,
    visible: impl Fn() -> Ts,
    splitter: &crate::split::Splitter,
) -> Pass {
    let mut out = Pass::default();
    state.horizon = horizon;
    // 1. Take the candidates the horizon has passed. Every note of a record is made while
    //    its noter holds the record's lock, so none comes after the take; and this runs
    //    before the frees below, so every note of a record taken in an earlier pass has
    //    found it dead (and gone) before it is freed.
    store.candidates().drain_into(&mut state.waiting);
    let mut taken = Vec::new();
    if !state.waiting.is_empty() {
        let gate = splitter.proposal_gate();
        state.waiting.retain(|&(record, ts)| {
            if ts > horizon || gate.proposed(record) {
                return true;
            }
            match record.get().try_take(horizon) {
                Take::Taken => {
                    taken.push(record);
                    false
                }
                Take::Held => true,
                Take::Live => false,
            }
        });
    }
    // 2. Free what every transaction open at its unlink has left.
    while state.retired.front().is_some_and(|b| b.after < horizon) {
        let batch = state.retired.pop_front().expect("checked non-empty");
        for record in &batch.records {
            // SAFETY: unlinked from both indexes before `after` was read, and the horizon
            // is past `after`: no registered holder is left (module docs), and no note of
            // it is left (above). Retired once.
            out.freed_versions += unsafe { store.free_record(*record) };
        }
        out.freed += batch.records.len();
    }
    out.waiting = state.waiting.len();
    store
        .candidates()
        .waiting
        .store(out.waiting, Ordering::Relaxed);
    // 3. Unlink: the ordered index first, so that a new record for the same key (which
    //    waits until the point index lets go of this one) never meets it in the tree.
    let mut batch = Batch {
        after: Ts(0),
        records: Vec::with_capacity(taken.len()),
        tables: Vec::new(),
        tree: None,
        nodes: Vec::new(),
    };
    let mut hints = crate::index::ordered::Hints::default();
    for &record in &taken {
        let removed = store.ordered().remove_hinted(record, &mut hints);
        match removed {
            Some(r) if r.separator => state.separators.push(record),
            _ => batch.records.push(record),
        }
        // A leaf left empty goes now, so that scans from that end (a queue's pops) do not
        // pass it until the next rebuild.
        if removed.is_some_and(|r| r.emptied)
            && let Some(nodes) = store.ordered().unlink_empty(record.get().key())
        {
            batch.nodes.push(nodes);
        }
    }
    store.index().remove_all(&taken);
    out.unlinked = taken.len();
    state.removed_since_rebuild += taken.len();
    // Due once removals reach half the live records, or once scans have passed as many
    // empty leaves as that: popping a queue's front leaves empty leaves there, and every
    // later pop passes all of them until a rebuild (quadratic in the pops), while a rebuild
    // costs about one step per live record.
    let due = REBUILD_REMOVALS_MIN.max(store.index().len() / 2);
    let hops = store.ordered().empty_hops();
    let passed = usize::try_from(hops - state.hops_at_rebuild).unwrap_or(usize::MAX);
    if state.removed_since_rebuild >= due
        || (state.removed_since_rebuild >= REBUILD_REMOVALS_MIN && passed >= due)
    {
        batch.tree = Some(store.ordered().rebuild());
        batch.records.append(&mut state.separators);
        state.removed_since_rebuild = 0;
        state.hops_at_rebuild = hops;
    }
    batch.tables = store.index().take_retired();
    if !batch.records.is_empty()
        || !batch.tables.is_empty()
        || batch.tree.is_some()
        || !batch.nodes.is_empty()
    {
        batch.after = visible();
        state.retired.push_back(batch);
    }
    store
        .gc_counters()
        .freed
        .fetch_add(out.freed as u64, Ordering::Relaxed);
    out.blocked_at = state.retired.front().map(|b| b.after);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::Arena;
    use crate::mvcc::{LockOwner, Record};

    /// Every [`COLLECT_CANDIDATES`]th delete makes a pass due, unless the last pass left
    /// [`WAITING_MAX`] waiting for the horizon.
    #[test]
    fn deletes_wake_the_collector_unless_it_is_held_back() {
        let arena = Arena::new();
        let record = RecordRef(Record::new_locked(&arena, b"k", LockOwner(1), None));
        let candidates = Candidates::new();
        let wakes: Vec<usize> = (1..=3 * COLLECT_CANDIDATES)
            .filter(|_| candidates.note(record, Ts(1)))
            .collect();
        assert_eq!(
            wakes,
            [
                COLLECT_CANDIDATES,
                2 * COLLECT_CANDIDATES,
                3 * COLLECT_CANDIDATES
            ]
        );
        let mut drained = Vec::new();
        candidates.drain_into(&mut drained);
        assert_eq!(drained.len(), 3 * COLLECT_CANDIDATES);
        candidates.waiting.store(WAITING_MAX, Ordering::Relaxed);
        assert!(!(0..2 * COLLECT_CANDIDATES).any(|_| candidates.note(record, Ts(1))));
        candidates.waiting.store(WAITING_MAX - 1, Ordering::Relaxed);
        let wakes = (0..COLLECT_CANDIDATES)
            .filter(|_| candidates.note(record, Ts(1)))
            .count();
        assert_eq!(wakes, 1);
        // A drain may take a record before its add to the count: the count wraps below zero
        // for a moment, and noting goes on.
        candidates.count.store(usize::MAX, Ordering::Relaxed);
        candidates.note(record, Ts(1));
        assert_eq!(candidates.count.load(Ordering::Relaxed), 0);
    }
}

//! Timestamps and snapshots: the oracle, the visible watermark and the snapshot registry.
//!
//! - `clock` hands out commit timestamps with one atomic add, taken only after the write set
//!   is locked (lock → timestamp → validate is what makes timestamp order a serial order).
//! - `visible` is the watermark: every commit at or below it is fully installed. It advances
//!   strictly in timestamp order — a committer waits until its predecessor has published —
//!   so a snapshot taken at the watermark never sees half a transaction.
//! - The registry holds one slot per open transaction with its snapshot timestamp. Garbage
//!   collection takes the minimum over the slots as its horizon. Registration and the horizon
//!   computation meet in a store-then-load handshake on both sides (a Dekker pattern): a
//!   transaction publishes its snapshot and then checks the proposed horizon; the collector
//!   publishes its proposal and then scans the slots. At least one of them sees the other, so
//!   the horizon never passes a snapshot that is in use.

use std::cell::Cell;
use std::sync::Arc;

use crossbeam_utils::{Backoff, CachePadded};
use sync::{AtomicI64, AtomicU64, AtomicUsize, Mutex, Ordering};

use crate::Ts;
use crate::limits::OPEN_TXNS_MAX;

const FREE: u64 = u64::MAX;

/// Per-slot counters: written only by the slot's transaction, summed on demand, so that
/// statistics cost no shared cache-line write.
#[derive(Default)]
pub(crate) struct SlotStats {
    pub(crate) commits: AtomicU64,
    pub(crate) read_only_commits: AtomicU64,
    pub(crate) aborts_write_locked: AtomicU64,
    pub(crate) aborts_read_changed: AtomicU64,
    pub(crate) aborts_phantom: AtomicU64,
    /// Commits that applied operations to split records' slices.
    pub(crate) split_commits: AtomicU64,
    pub(crate) versions: AtomicI64,
}

impl SlotStats {
    pub(crate) fn bump(counter: &AtomicU64) {
        // Only one transaction uses a slot at a time, so load + store is an exact increment
        // without a locked instruction.
        counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }
}

struct Slot {
    read_ts: AtomicU64,
    /// The split phase word this slot's committer is applying operations in, or 0
    /// (see `split`: the coordinator waits for it to clear before reconciling).
    split_phase: AtomicU64,
    stats: SlotStats,
}

pub(crate) struct Oracle {
    clock: CachePadded<AtomicU64>,
    visible: CachePadded<AtomicU64>,
    proposal: CachePadded<AtomicU64>,
    horizon: CachePadded<AtomicU64>,
    slots: Box<[CachePadded<Slot>]>,
    slots_used: CachePadded<AtomicUsize>,
    collector: Mutex<()>,
    /// `done[ts % len]` holds `ts` once commit `ts` has finished (installed, durable, or
    /// aborted). Timestamps in flight are bounded by the open transactions, which the ring
    /// outnumbers, so an entry is never overwritten before the watermark passes it.
    done: Box<[AtomicU64]>,
    /// The installed watermark: every commit at or below it is installed, durable or not
    /// (at or above `visible`). Writers that may read what is not yet durable take their
    /// snapshot here ([`Oracle::register_installed`]).
    installed: CachePadded<AtomicU64>,
    /// `installed_done[ts % len]` holds `ts` once commit `ts` is installed or finished, as
    /// `done` does for finished.
    installed_done: Box<[AtomicU64]>,
    /// Tasks waiting for the watermark to pass a timestamp ([`Oracle::watch`]), and the
    /// smallest such timestamp (`u64::MAX`: none), which [`Oracle::advance`] checks.
    watchers: Mutex<Vec<(u64, std::task::Waker)>>,
    watch_min: CachePadded<AtomicU64>,
}

/// A claimed registry slot. Index into the slot array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SlotId(u32);

impl SlotId {
    pub(crate) fn index(self) -> u32 {
        self.0
    }
}

/// A thread's number among the threads alive now that have registered a snapshot: the
/// smallest free one when it first registers, given back when it exits. Its registrations
/// start probing at its *home* slot, `number * HOME_SPREAD` (modulo the slots), so that
/// threads rarely probe each other's lines and the slots in use stay a prefix whose length
/// follows the threads alive. (Starting where the thread last found a free slot, as this
/// did once, let a thread with several transactions open at once walk the whole registry:
/// `slots_used` reached all 4096 slots with four threads, and every horizon computation
/// scanned them all.)
struct ThreadNumber(Cell<usize>);

impl ThreadNumber {
    fn get(&self) -> usize {
        if self.0.get() == usize::MAX {
            self.0.set(lock_numbers().take());
        }
        self.0.get()
    }
}

impl Drop for ThreadNumber {
    fn drop(&mut self) {
        if self.0.get() != usize::MAX {
            lock_numbers().free.push(std::cmp::Reverse(self.0.get()));
        }
    }
}

thread_local! {
    static THREAD_NUMBER: ThreadNumber = const { ThreadNumber(Cell::new(usize::MAX)) };
}

/// The thread numbers: how many were ever handed out, and those given back by threads that
/// exited (smallest first).
struct ThreadNumbers {
    next: usize,
    free: std::collections::BinaryHeap<std::cmp::Reverse<usize>>,
}

impl ThreadNumbers {
    /// The smallest number no live thread holds.
    fn take(&mut self) -> usize {
        match self.free.pop() {
            Some(std::cmp::Reverse(n)) => n,
            None => {
                self.next += 1;
                self.next - 1
            }
        }
    }
}

static THREAD_NUMBERS: std::sync::Mutex<ThreadNumbers> = std::sync::Mutex::new(ThreadNumbers {
    next: 0,
    free: std::collections::BinaryHeap::new(),
});

fn lock_numbers() -> std::sync::MutexGuard<'static, ThreadNumbers> {
    THREAD_NUMBERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Slots between two threads' home slots: room for that many transactions open at once on
/// one thread (async tasks interleave them) before it probes the next thread's.
const HOME_SPREAD: usize = 7;

impl Oracle {
    /// An oracle whose first commit gets timestamp `last + 1`.
    pub(crate) fn new(last: Ts) -> Oracle {
        Oracle::with_slots(last, OPEN_TXNS_MAX)
    }

    /// An oracle with `slots` registry slots (tests use few, to model-check).
    pub(crate) fn with_slots(last: Ts, slots: usize) -> Oracle {
        Oracle {
            clock: CachePadded::new(AtomicU64::new(last.0)),
            visible: CachePadded::new(AtomicU64::new(last.0)),
            proposal: CachePadded::new(AtomicU64::new(0)),
            horizon: CachePadded::new(AtomicU64::new(0)),
            slots: (0..slots)
                .map(|_| {
                    CachePadded::new(Slot {
                        read_ts: AtomicU64::new(FREE),
                        split_phase: AtomicU64::new(0),
                        stats: SlotStats::default(),
                    })
                })
                .collect(),
            slots_used: CachePadded::new(AtomicUsize::new(0)),
            collector: Mutex::new(()),
            done: (0..(2 * slots).next_power_of_two())
                .map(|_| AtomicU64::new(0))
                .collect(),
            installed: CachePadded::new(AtomicU64::new(last.0)),
            installed_done: (0..(2 * slots).next_power_of_two())
                .map(|_| AtomicU64::new(0))
                .collect(),
            watchers: Mutex::new(Vec::new()),
            watch_min: CachePadded::new(AtomicU64::new(u64::MAX)),
        }
    }

    /// Claims a slot and registers a snapshot at the current watermark.
    pub(crate) fn register(&self) -> Option<(SlotId, Ts)> {
        self.register_at(false)
    }

    /// [`Oracle::register`] at the installed watermark ([`Oracle::installed`]) instead of
    /// the visible one.
    pub(crate) fn register_installed(&self) -> Option<(SlotId, Ts)> {
        self.register_at(true)
    }

    fn register_at(&self, installed: bool) -> Option<(SlotId, Ts)> {
        let slots = self.slots.len();
        // A thread exiting may have dropped its number already; it starts at slot 0.
        let start = THREAD_NUMBER
            .try_with(ThreadNumber::get)
            .map_or(0, |n| n.wrapping_mul(HOME_SPREAD) % slots);
        for i in 0..slots {
            let index = (start + i) % slots;
            let slot = &self.slots[index];
            if slot.read_ts.load(Ordering::Relaxed) != FREE {
                continue;
            }
            let mut read_ts = match installed {
                true => self.installed(),
                false => self.visible.load(Ordering::Acquire),
            };
            // A read-modify-write takes the line exclusively even when it changes nothing;
            // the load keeps `slots_used` shared between cores once it is large enough.
            if self.slots_used.load(Ordering::SeqCst) <= index {
                self.slots_used.fetch_max(index + 1, Ordering::SeqCst);
            }
            if slot
                .read_ts
                .compare_exchange(FREE, read_ts, Ordering::SeqCst, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            // The handshake: our snapshot is published; if the collector has already proposed
            // a horizon above it, move up to a fresh snapshot (the watermark is at least the
            // proposal) and check again. The fence pairs with the collector's: of our slot
            // store and its proposal store, at least one is seen by the other side's load.
            sync::fence(Ordering::SeqCst);
            while read_ts < self.proposal.load(Ordering::SeqCst) {
                read_ts = self.visible.load(Ordering::Acquire);
                slot.read_ts.store(read_ts, Ordering::SeqCst);
                sync::fence(Ordering::SeqCst);
            }
            let id = SlotId(u32::try_from(index).expect("OPEN_TXNS_MAX fits in u32"));
            return Some((id, Ts(read_ts)));
        }
        None
    }

    pub(crate) fn unregister(&self, slot: SlotId) {
        self.slots[slot.0 as usize]
            .read_ts
            .store(FREE, Ordering::Release);
    }

    /// Gives `slot` back once the watermark passes `ts` (finished by the caller), without
    /// waiting for it here: a prepared transaction's decision or a failed prepare must not
    /// wait for other transactions' decisions, which may wait for this caller (two
    /// coordinators each committing one transaction on two databases in turn would).
    pub(crate) fn release_when_published(self: &Arc<Oracle>, slot: SlotId, ts: Ts) {
        struct Release {
            oracle: Arc<Oracle>,
            slot: SlotId,
            done: std::sync::atomic::AtomicBool,
        }
        impl Release {
            fn run(&self) {
                if !self.done.swap(true, std::sync::atomic::Ordering::AcqRel) {
                    self.oracle.unregister(self.slot);
                }
            }
        }
        impl std::task::Wake for Release {
            fn wake(self: Arc<Self>) {
                self.run();
            }
        }
        if self.advance() >= ts.0 {
            self.unregister(slot);
            return;
        }
        let release = Arc::new(Release {
            oracle: Arc::clone(self),
            slot,
            done: std::sync::atomic::AtomicBool::new(false),
        });
        let waker = std::task::Waker::from(Arc::clone(&release));
        if self.watch(ts, &waker) {
            release.run();
        }
    }

    /// Announces that `slot`'s committer applies operations in split phase `word` (0: no
    /// longer). A store-then-load handshake with [`Oracle::announced`]: the committer
    /// announces and then checks the phase is still open; the coordinator closes the phase
    /// and then waits for announcements to clear.
    pub(crate) fn announce(&self, slot: SlotId, word: u64) {
        self.slots[slot.0 as usize]
            .split_phase
            .store(word, Ordering::SeqCst);
    }

    /// Whether any committer still announces split phase `word`.
    pub(crate) fn announced(&self, word: u64) -> bool {
        let used = self.slots_used.load(Ordering::SeqCst);
        self.slots[..used]
            .iter()
            .any(|slot| slot.split_phase.load(Ordering::SeqCst) == word)
    }

    pub(crate) fn stats(&self, slot: SlotId) -> &SlotStats {
        &self.slots[slot.0 as usize].stats
    }

    /// An oracle for a database recovered with prepared transactions in doubt: the clock
    /// resumes at `clock`, and the watermark stops below the smallest of `in_doubt` until
    /// each is published (every other timestamp up to `clock` counts as finished). `None` if
    /// the span does not fit the ring, which a log that keel wrote never asks for: timestamps
    /// in flight were bounded by the slots when it was written.
    pub(crate) fn holding(clock: Ts, in_doubt: &[Ts]) -> Option<Oracle> {
        let oracle = Oracle::new(clock);
        let Some(first) = in_doubt.iter().min() else {
            return Some(oracle);
        };
        let mask = oracle.done.len() as u64 - 1;
        if first.0 == 0 || clock < *first || clock.0 - first.0 >= mask {
            return None;
        }
        oracle.visible.store(first.0 - 1, Ordering::Release);
        oracle.installed.store(first.0 - 1, Ordering::Release);
        for ts in first.0..=clock.0 {
            if !in_doubt.contains(&Ts(ts)) {
                oracle.installed_done[(ts & mask) as usize].store(ts, Ordering::Release);
                oracle.done[(ts & mask) as usize].store(ts, Ordering::Release);
            }
        }
        Some(oracle)
    }

    /// The last commit timestamp taken.
    #[cfg(test)]
    pub(crate) fn clock(&self) -> u64 {
        self.clock.load(Ordering::SeqCst)
    }

    /// Takes the next commit timestamp. The caller must publish it with [`Oracle::publish`]
    /// whether it commits or not, or the watermark stops.
    pub(crate) fn next_commit_ts(&self) -> Ts {
        Ts(self.clock.fetch_add(1, Ordering::SeqCst) + 1)
    }

    /// Marks commit `ts` finished and returns once the watermark has passed it, that is once
    /// every earlier timestamp is finished too. Whoever runs advances the watermark over every
    /// finished timestamp, so a finished committer that is not scheduled holds nobody up; only
    /// an unfinished one does. Gives up (returns `false`) if `failed` turns true while
    /// waiting: after a log failure a predecessor may never finish.
    pub(crate) fn publish(&self, ts: Ts, failed: impl Fn() -> bool) -> bool {
        self.finish(ts);
        self.wait_published(ts, failed)
    }

    /// Waits, spinning, until the watermark passes `ts` (`true`), or gives up once `failed`
    /// turns true (`false`). Someone must have finished `ts`, or will.
    pub(crate) fn wait_published(&self, ts: Ts, failed: impl Fn() -> bool) -> bool {
        let backoff = Backoff::new();
        loop {
            if self.advance() >= ts.0 {
                return true;
            }
            if backoff.is_completed() && failed() {
                return false;
            }
            sync::spin(&backoff);
        }
    }

    /// Marks commit `ts` finished, without waiting for the watermark: the caller (or whoever
    /// it hands the wait to, see [`Oracle::watch`]) must still keep its slot until the
    /// watermark passes `ts`, which bounds the timestamps in flight by the slots.
    pub(crate) fn finish(&self, ts: Ts) {
        self.mark_installed(ts);
        let mask = self.done.len() as u64 - 1;
        self.done[(ts.0 & mask) as usize].store(ts.0, Ordering::Release);
    }

    /// Marks commit `ts` installed (every record of it is in place), before it is durable
    /// and finished: the installed watermark may pass it ([`Oracle::installed`]).
    pub(crate) fn mark_installed(&self, ts: Ts) {
        let mask = self.installed_done.len() as u64 - 1;
        self.installed_done[(ts.0 & mask) as usize].store(ts.0, Ordering::Release);
    }

    /// Advances the installed watermark over every installed timestamp after it and returns
    /// it. It never lags the visible one (whatever is finished is installed), which it
    /// first catches up with: the ring may have moved on past a lagging watermark.
    pub(crate) fn installed(&self) -> u64 {
        let mask = self.installed_done.len() as u64 - 1;
        let visible = self.visible.load(Ordering::Acquire);
        let mut installed = self.installed.load(Ordering::Acquire);
        // Only a watermark that fell behind is written here: a read-modify-write on every
        // writer's begin would take the shared line exclusively each time.
        if installed < visible {
            installed = self
                .installed
                .fetch_max(visible, Ordering::AcqRel)
                .max(visible);
        }
        while self.installed_done[((installed + 1) & mask) as usize].load(Ordering::Acquire)
            == installed + 1
        {
            match self.installed.compare_exchange_weak(
                installed,
                installed + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => installed += 1,
                Err(now) => installed = now,
            }
        }
        installed
    }

    /// Advances the watermark over every finished timestamp after it, wakes the watchers it
    /// passes, and returns it.
    pub(crate) fn advance(&self) -> u64 {
        let mask = self.done.len() as u64 - 1;
        let mut visible = self.visible.load(Ordering::Acquire);
        let mut moved = false;
        while self.done[((visible + 1) & mask) as usize].load(Ordering::Acquire) == visible + 1 {
            match self.visible.compare_exchange_weak(
                visible,
                visible + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    visible += 1;
                    moved = true;
                }
                Err(now) => visible = now,
            }
        }
        if moved {
            // The handshake with `watch`, which stores `watch_min` and then loads `visible`:
            // with a fence on both sides, at least one sees the other's store, so a watcher
            // is either told the watermark passed or found here and woken.
            sync::fence(Ordering::SeqCst);
            if self.watch_min.load(Ordering::SeqCst) <= visible {
                self.wake_watchers(visible);
            }
        }
        visible
    }

    /// Asks for `waker` to be woken once the watermark passes `ts`. Returns whether it
    /// already has (then nothing is registered).
    pub(crate) fn watch(&self, ts: Ts, waker: &std::task::Waker) -> bool {
        if self.visible.load(Ordering::Acquire) >= ts.0 {
            return true;
        }
        let mut watchers = sync::lock(&self.watchers);
        watchers.push((ts.0, waker.clone()));
        self.watch_min.fetch_min(ts.0, Ordering::SeqCst);
        drop(watchers);
        sync::fence(Ordering::SeqCst);
        let visible = self.visible.load(Ordering::SeqCst);
        if visible >= ts.0 {
            // An advance may have missed us; whoever wakes us next finds us gone or woken.
            self.wake_watchers(visible);
            return true;
        }
        false
    }

    /// Wakes the watchers of timestamps up to `upto`: the watermark, or `u64::MAX` after a
    /// log failure (the watermark may never move again, and they must see the failure).
    pub(crate) fn wake_watchers(&self, upto: u64) {
        let mut watchers = sync::lock(&self.watchers);
        let woken: Vec<_> = watchers.extract_if(.., |(ts, _)| *ts <= upto).collect();
        let min = watchers.iter().map(|(ts, _)| *ts).min().unwrap_or(u64::MAX);
        self.watch_min.store(min, Ordering::SeqCst);
        drop(watchers);
        for (_, waker) in woken {
            waker.wake();
        }
    }

    /// The last commit timestamp handed out.
    pub(crate) fn last_commit_ts(&self) -> Ts {
        Ts(self.clock.load(Ordering::Acquire))
    }

    /// The newest timestamp whose commits are all installed.
    pub(crate) fn visible(&self) -> Ts {
        Ts(self.visible.load(Ordering::Acquire))
    }

    /// The GC horizon: no open snapshot is below it.
    pub(crate) fn horizon(&self) -> Ts {
        Ts(self.horizon.load(Ordering::Acquire))
    }

    /// Whether the horizon was last computed `every` or more timestamps before `ts`. A
    /// committer asks after each commit, so a recomputation skipped because another thread
    /// held the collector (or a timestamp nobody committed at) is made up by the next commit,
    /// not a whole interval later.
    pub(crate) fn collect_due(&self, ts: Ts, every: u64) -> bool {
        ts.0 >= self.proposal.load(Ordering::Relaxed).saturating_add(every)
    }

    /// Recomputes the horizon unless another thread is doing it.
    pub(crate) fn collect(&self) {
        let Some(_only_collector) = sync::try_lock(&self.collector) else {
            return;
        };
        let proposal = self.visible.load(Ordering::Acquire);
        self.proposal.store(proposal, Ordering::SeqCst);
        sync::fence(Ordering::SeqCst);
        let used = self.slots_used.load(Ordering::SeqCst);
        let oldest = self.slots[..used]
            .iter()
            .map(|slot| slot.read_ts.load(Ordering::SeqCst))
            .min()
            .unwrap_or(FREE);
        self.horizon
            .fetch_max(proposal.min(oldest), Ordering::AcqRel);
    }

    /// Sums a statistic over all slots.
    pub(crate) fn sum(&self, field: impl Fn(&SlotStats) -> i64) -> i64 {
        self.slots.iter().map(|slot| field(&slot.stats)).sum()
    }
}

/// The atomics and the lock this module uses: std's (and parking_lot's) normally, loom's
/// when model checking (`RUSTFLAGS="--cfg keel_loom" cargo test -p keel --lib --release loom`).
mod sync {
    #[cfg(keel_loom)]
    pub(crate) use loom::sync::Mutex;
    #[cfg(keel_loom)]
    pub(crate) use loom::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering, fence};
    #[cfg(not(keel_loom))]
    pub(crate) use parking_lot::Mutex;
    #[cfg(not(keel_loom))]
    pub(crate) use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering, fence};

    #[cfg(not(keel_loom))]
    pub(crate) fn lock<T>(m: &Mutex<T>) -> parking_lot::MutexGuard<'_, T> {
        m.lock()
    }
    #[cfg(keel_loom)]
    pub(crate) fn lock<T>(m: &Mutex<T>) -> loom::sync::MutexGuard<'_, T> {
        m.lock().expect("no panic while holding it")
    }

    #[cfg(not(keel_loom))]
    pub(crate) fn try_lock<T>(m: &Mutex<T>) -> Option<parking_lot::MutexGuard<'_, T>> {
        m.try_lock()
    }
    #[cfg(keel_loom)]
    pub(crate) fn try_lock<T>(m: &Mutex<T>) -> Option<loom::sync::MutexGuard<'_, T>> {
        m.try_lock().ok()
    }

    pub(crate) fn spin(backoff: &crossbeam_utils::Backoff) {
        #[cfg(keel_loom)]
        {
            let _ = backoff;
            loom::thread::yield_now();
        }
        #[cfg(not(keel_loom))]
        backoff.snooze();
    }
}

#[cfg(test)]
mod tests;

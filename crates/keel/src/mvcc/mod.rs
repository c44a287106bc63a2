//! Records and their version chains.
//!
//! A [`Record`] is one key: a lock word, the head of its version chain and the key bytes,
//! in one allocation. Records are created on the first write to a key. A deleted key keeps
//! its record, with a tombstone version, until the collector (`gc`) finds that no snapshot
//! can see anything but the tombstone: it then locks the record for good ([`DEAD_OWNER`]),
//! unlinks it from both indexes, and frees it once every transaction that was open at the
//! unlink has ended. A `&Record` handed to a transaction therefore stays valid while the
//! transaction holds its registry slot.
//!
//! A [`Version`] is one committed value: its commit timestamp, the next older version and the
//! value bytes inline, in one allocation. Chains are ordered newest first with strictly
//! decreasing timestamps. Only the holder of a record's lock pushes a version, and only it
//! trims the chain.
//!
//! Invariants that make reading without latches safe:
//! - a version is pushed only after its commit timestamp is fixed, and the visible watermark
//!   passes that timestamp only after the push, so a reader at `read_ts <= watermark` never
//!   misses a version it should see;
//! - trimming (garbage collection) cuts the chain after the newest version whose timestamp is
//!   at or below the GC horizon, and the horizon is at or below every open snapshot; a reader
//!   stops at the first version at or below its own `read_ts`, which is never past the cut.

use std::alloc::{Layout, alloc, dealloc, handle_alloc_error};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

use crate::Ts;
use crate::memory::Arena;

/// One committed value of a key.
#[repr(C)]
pub(crate) struct Version {
    ts: Ts,
    next: AtomicPtr<Version>,
    /// `u32::MAX` marks a tombstone (the key was deleted at `ts`).
    len: u32,
    /// Value bytes the block holds, or [`EMBEDDED`] for a version that lives inside its
    /// record's allocation (see [`Record`]) rather than in its own heap block.
    cap: u32,
    // value bytes follow
}

const TOMBSTONE: u32 = u32::MAX;
const EMBEDDED: u32 = u32::MAX;
const _: () = assert!(crate::limits::VALUE_BYTES_MAX < TOMBSTONE as usize);

impl Version {
    fn layout(len: usize) -> Layout {
        Layout::from_size_align(size_of::<Version>() + len, align_of::<Version>())
            .expect("value length is bounded by VALUE_BYTES_MAX")
    }

    /// The value capacity of a heap block for `value`: its length rounded up to a word, so
    /// that a block cut off by one write of a key fits the next write of a similar value.
    fn heap_cap(value: Option<&[u8]>) -> usize {
        value.map_or(0, <[u8]>::len).next_multiple_of(8)
    }

    /// Allocates a version; `None` makes a tombstone.
    pub(crate) fn new(ts: Ts, value: Option<&[u8]>) -> NonNull<Version> {
        let cap = Self::heap_cap(value);
        let layout = Self::layout(cap);
        // SAFETY: the layout has non-zero size (the header).
        let raw = unsafe { alloc(layout) }.cast::<Version>();
        let Some(ptr) = NonNull::new(raw) else {
            handle_alloc_error(layout)
        };
        let cap = u32::try_from(cap).expect("value length is bounded by VALUE_BYTES_MAX");
        // SAFETY: a fresh allocation of the right layout.
        unsafe { Self::write(ptr, ts, value, cap) };
        ptr
    }

    /// Writes a version header and value at `ptr`.
    ///
    /// # Safety
    /// `ptr` is valid for writes of a header and `cap` value bytes (or, for [`EMBEDDED`],
    /// of `layout(value.len())` bytes), aligned, and unshared.
    unsafe fn write(ptr: NonNull<Version>, ts: Ts, value: Option<&[u8]>, cap: u32) {
        let len = match value {
            Some(v) => u32::try_from(v.len()).expect("value length is bounded by VALUE_BYTES_MAX"),
            None => TOMBSTONE,
        };
        // SAFETY: guaranteed by the caller.
        unsafe {
            ptr.as_ptr().write(Version {
                ts,
                next: AtomicPtr::new(ptr::null_mut()),
                len,
                cap,
            });
            if let Some(v) = value {
                ptr::copy_nonoverlapping(v.as_ptr(), ptr.as_ptr().add(1).cast::<u8>(), v.len());
            }
        }
    }

    /// Builds a version for `value` in `dead`'s heap block if the block is the size
    /// [`Version::new`] would allocate; otherwise hands `dead` back.
    ///
    /// # Safety
    /// `dead` is a version nobody can reach any more, and the caller owns it.
    unsafe fn reuse(
        dead: NonNull<Version>,
        ts: Ts,
        value: Option<&[u8]>,
    ) -> Result<NonNull<Version>, NonNull<Version>> {
        // SAFETY: the caller owns `dead`.
        let cap = unsafe { dead.as_ref() }.cap;
        if cap == EMBEDDED || cap as usize != Self::heap_cap(value) {
            return Err(dead);
        }
        // SAFETY: a heap block with room for `cap` value bytes, which `value` fits.
        unsafe { Self::write(dead, ts, value, cap) };
        Ok(dead)
    }

    /// Frees one version (not its successors).
    ///
    /// # Safety
    /// `ptr` came from [`Version::new`], is unreachable, and is freed once.
    pub(crate) unsafe fn free(ptr: NonNull<Version>) {
        // SAFETY: the caller guarantees `ptr` is a live version.
        let cap = unsafe { ptr.as_ref() }.cap;
        if cap == EMBEDDED {
            return; // part of its record's allocation, which the arena owns
        }
        // SAFETY: same layout as the allocation.
        unsafe { dealloc(ptr.as_ptr().cast(), Self::layout(cap as usize)) };
    }

    pub(crate) fn ts(&self) -> Ts {
        self.ts
    }

    /// The value, or `None` for a tombstone.
    pub(crate) fn value(&self) -> Option<&[u8]> {
        if self.len == TOMBSTONE {
            return None;
        }
        // SAFETY: `len` bytes follow the header in the same allocation and never change.
        Some(unsafe {
            std::slice::from_raw_parts(ptr::from_ref(self).add(1).cast::<u8>(), self.len as usize)
        })
    }

    pub(crate) fn next(&self) -> Option<&Version> {
        // SAFETY: a non-null `next` points at a live version; see the module invariants for
        // why a reader never follows a pointer that trimming frees.
        unsafe { self.next.load(Ordering::Acquire).as_ref() }
    }
}

/// What [`Record::try_take`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Take {
    /// Locked for good: the collector unlinks and frees it.
    Taken,
    /// Someone holds it: ask again later (the holder may leave it as dead as it was).
    Held,
    /// Not dead: it holds a value a snapshot could see, was split, or was taken already.
    /// Whoever deletes it again notes it again.
    Live,
}

/// One key: its lock, its version chain, its key bytes, and room for one version.
///
/// Records are allocated from the store's [`Arena`] and laid out as the header, the key
/// bytes, then (optionally) an embedded slot where a version that fits is built in place:
/// the first one, and again whenever trimming cut the one that lived there. A key that is
/// loaded once and then only read thus costs one allocation, and reading it touches adjacent
/// cache lines: the header and key, then the version right after them.
#[repr(C)]
pub(crate) struct Record {
    /// `0` when unlocked, otherwise the [`LockOwner`] of the committing transaction.
    lock: AtomicU64,
    head: AtomicPtr<Version>,
    // No copy of the key's hash: the index compares keys after a tag match, and the few
    // that need it (a growing index, the split coordinator) compute it again.
    /// The key's length, and [`SPLIT`] once the record was split: its split state is then
    /// in the database's split table (`split::table`), which keeps such pointers out of
    /// the many records that never are.
    key_len: AtomicU32,
    /// Value bytes the embedded slot holds, with [`SLOT_USED`] set while a version lives in
    /// it; [`NO_SLOT`] when there is none. Written only under the lock; read to free the
    /// record (the block's size follows from it).
    embedded_cap: AtomicU32,
    // key bytes follow, then padding to the version alignment, then the embedded slot
}

const _: () = assert!(size_of::<Record>() == 24);

/// Set in `key_len` once the record was split.
const SPLIT: u32 = 1 << 31;
const _: () = assert!(crate::limits::KEY_BYTES_MAX < SPLIT as usize);

const NO_SLOT: u32 = u32::MAX;
/// Set in `embedded_cap` while the slot holds a version; the capacity stays in the low bits.
const SLOT_USED: u32 = 1 << 31;
const _: () = assert!(crate::limits::VALUE_BYTES_MAX < SLOT_USED as usize);

/// The lock owner of a record the collector took for good: it is unlinked (or about to be)
/// and will be freed. A committer that meets it looks the key up again.
pub(crate) const DEAD_OWNER: LockOwner = LockOwner(u64::MAX - 2);

/// A record held *shared* by prepared transactions that read it (`txn/prepared.rs`): the lock
/// word is `SHARED + n` for `n` holders. Writers wait for the decision (a commit outside the
/// engine, [`awaits_decision`]); readers validating do
/// not count it as a change (reads do not conflict with reads). Owners (registry slots + 1)
/// and the special owners near `u64::MAX` never fall in this range.
const SHARED: u64 = 1 << 62;
const SHARED_HOLDERS_MAX: u64 = u32::MAX as u64;

#[inline]
fn is_shared(word: u64) -> bool {
    word > SHARED && word <= SHARED + SHARED_HOLDERS_MAX
}

/// Set in the owner of a lock held by a prepared transaction (`txn/prepared.rs`), exclusively
/// (a shared hold is one too): it keeps the lock until its decision, which may come from
/// another node, milliseconds or seconds away, so a committer does not spin for it
/// ([`awaits_decision`]). The top four bits of a lock word are `0001` only for these owners:
/// registry slots + 1 stay below 2^32, shared holds set bit 62, and the special owners near
/// `u64::MAX` (recovery, the splitter, the collector) set the top bits.
const PREPARED: u64 = 1 << 60;

/// Whether lock word `word` is held for a two-phase commit's decision: by a prepared
/// transaction (exclusively, or shared: only prepared transactions take shared holds), or
/// one recovered in doubt.
#[inline]
pub(crate) fn awaits_decision(word: u64) -> bool {
    word >> 60 == PREPARED >> 60 || is_shared(word)
}

/// Identifies the transaction holding a record lock; never zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LockOwner(pub(crate) u64);

impl LockOwner {
    /// The owner a transaction that prepares locks its writes as.
    pub(crate) fn prepared(self) -> LockOwner {
        debug_assert!(self.0 < 1 << 32, "a registry slot's owner");
        LockOwner(self.0 | PREPARED)
    }

    /// Whether this is a prepared transaction's owner.
    pub(crate) fn is_prepared(self) -> bool {
        awaits_decision(self.0)
    }

    /// The owner of the `n`th transaction recovered in doubt (`Db::open`): prepared, and
    /// apart from every registry slot's.
    pub(crate) fn in_doubt(n: u64) -> LockOwner {
        debug_assert!(n < 1 << 32);
        LockOwner(PREPARED | 1 << 32 | n)
    }
}

/// A record that was found unlocked but whose newest version is newer than a snapshot, or is
/// locked by someone else: what validation needs to know about a read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Staleness {
    /// Unchanged since the snapshot and not locked by another transaction.
    Fresh,
    /// Locked by another transaction that may be committing.
    Locked,
    /// A version newer than the snapshot exists.
    Changed,
    /// The record is split: it changes without versions until it is reconciled.
    Split,
    /// The collector took the record: it is unchanged, but a newer record for its key may
    /// exist in the index, and that one decides.
    Dead,
}

impl Record {
    /// Offset of the embedded version slot from the record's start.
    fn slot_offset(key_len: usize) -> usize {
        (size_of::<Record>() + key_len).next_multiple_of(align_of::<Version>())
    }

    /// The arena block of a record of a `key_len`-byte key with an embedded slot for
    /// `reserve` value bytes (`None`: no slot).
    fn block(key_len: usize, reserve: Option<usize>) -> Layout {
        let bytes = match reserve {
            Some(value) => Self::slot_offset(key_len) + Version::layout(value).size(),
            None => size_of::<Record>() + key_len,
        };
        Layout::from_size_align(bytes, align_of::<Record>())
            .expect("sizes are bounded by KEY_BYTES_MAX and VALUE_BYTES_MAX")
    }

    /// Allocates a record with an empty chain, locked by `owner`, with an embedded slot for a
    /// first version of up to `reserve` value bytes (`None`: no slot).
    pub(crate) fn new_locked(
        arena: &Arena,
        key: &[u8],
        owner: LockOwner,
        reserve: Option<usize>,
    ) -> NonNull<Record> {
        let key_len = u32::try_from(key.len()).expect("key length is bounded by KEY_BYTES_MAX");
        let layout = Self::block(key.len(), reserve);
        let ptr = arena.alloc(layout).cast::<Record>();
        let cap = reserve.map_or(NO_SLOT, |v| {
            u32::try_from(v).expect("bounded by VALUE_BYTES_MAX")
        });
        // SAFETY: a fresh arena block large enough for header and key.
        unsafe {
            ptr.as_ptr().write(Record {
                lock: AtomicU64::new(owner.0),
                head: AtomicPtr::new(ptr::null_mut()),
                key_len: AtomicU32::new(key_len),
                embedded_cap: AtomicU32::new(cap),
            });
            ptr::copy_nonoverlapping(key.as_ptr(), ptr.as_ptr().add(1).cast::<u8>(), key.len());
            ptr
        }
    }

    /// Frees the record: its versions, and its block back to `arena`. Returns how many
    /// versions it held.
    ///
    /// # Safety
    /// Nobody can reach the record any more (it is unlinked from both indexes and no
    /// transaction that could have found it is still open), and this is called once.
    pub(crate) unsafe fn free(ptr: NonNull<Record>, arena: &Arena) -> usize {
        // SAFETY: the caller guarantees exclusive access.
        let record = unsafe { ptr.as_ref() };
        let cap = record.embedded_cap.load(Ordering::Relaxed);
        let reserve = (cap != NO_SLOT).then_some((cap & !SLOT_USED) as usize);
        let layout = Self::block(record.key_len(), reserve);
        // SAFETY: exclusive access, once; the block came from `arena` with this layout.
        unsafe {
            let versions = Self::free_versions(ptr);
            arena.free(ptr.cast(), layout);
            versions
        }
    }

    /// The collector's claim: locks the record for good if nobody holds it, it was never
    /// split, and no snapshot at or above `horizon` can see anything in it but absence (an
    /// empty chain, or a tombstone at or below `horizon`).
    pub(crate) fn try_take(&self, horizon: Ts) -> Take {
        if let Err(owner) =
            self.lock
                .compare_exchange(0, DEAD_OWNER.0, Ordering::AcqRel, Ordering::Relaxed)
        {
            return if owner == DEAD_OWNER.0 {
                Take::Live
            } else {
                Take::Held
            };
        }
        let absent = self
            .head()
            .is_none_or(|v| v.value().is_none() && v.ts <= horizon);
        if absent && !self.is_split() {
            return Take::Taken;
        }
        self.lock.store(0, Ordering::Release);
        Take::Live
    }

    /// Whether the collector took the record for good ([`DEAD_OWNER`]).
    #[inline]
    pub(crate) fn is_dead(&self) -> bool {
        self.lock.load(Ordering::Acquire) == DEAD_OWNER.0
    }

    /// Frees every version of the chain that has its own allocation (the record itself
    /// belongs to the arena). Returns the chain's length, the embedded version included.
    ///
    /// # Safety
    /// Nobody else can reach the record any more, and this is called once.
    pub(crate) unsafe fn free_versions(ptr: NonNull<Record>) -> usize {
        // SAFETY: the caller guarantees exclusive access.
        let record = unsafe { ptr.as_ref() };
        let mut v = record.head.load(Ordering::Relaxed);
        let mut versions = 0;
        while let Some(version) = NonNull::new(v) {
            // SAFETY: exclusive access; each version is freed once.
            unsafe {
                v = version.as_ref().next.load(Ordering::Relaxed);
                Version::free(version);
            }
            versions += 1;
        }
        versions
    }

    #[inline]
    fn key_len(&self) -> usize {
        (self.key_len.load(Ordering::Relaxed) & !SPLIT) as usize
    }

    pub(crate) fn key(&self) -> &[u8] {
        // SAFETY: `key_len` bytes follow the header and never change.
        unsafe {
            std::slice::from_raw_parts(ptr::from_ref(self).add(1).cast::<u8>(), self.key_len())
        }
    }

    /// The key's hash ([`crate::index::hash`]), computed.
    pub(crate) fn hash(&self) -> u64 {
        crate::index::hash(self.key())
    }

    /// Whether the record was ever split (its split state is in the split table).
    #[inline]
    pub(crate) fn is_split(&self) -> bool {
        self.key_len.load(Ordering::Acquire) & SPLIT != 0
    }

    /// Marks the record split, once its split state is in the split table.
    pub(crate) fn mark_split(&self) {
        self.key_len.fetch_or(SPLIT, Ordering::Release);
    }

    /// Whether the record is held by the splitter.
    pub(crate) fn is_split_locked(&self) -> bool {
        self.lock.load(Ordering::Acquire) == crate::split::SPLIT_OWNER.0
    }

    pub(crate) fn head(&self) -> Option<&Version> {
        // SAFETY: the head is live while the record is (trimming never frees the head).
        unsafe { self.head.load(Ordering::Acquire).as_ref() }
    }

    /// The newest version visible at `read_ts`, if any (it may be a tombstone).
    #[inline]
    pub(crate) fn visible(&self, read_ts: Ts) -> Option<&Version> {
        let mut v = self.head();
        while let Some(version) = v {
            if version.ts <= read_ts {
                return Some(version);
            }
            v = version.next();
        }
        None
    }

    /// The value visible at `read_ts`: `None` when absent or deleted. (Readers go through
    /// `txn::read_at`, which also sees split records' slices.)
    #[cfg(test)]
    pub(crate) fn value_at(&self, read_ts: Ts) -> Option<&[u8]> {
        self.visible(read_ts).and_then(Version::value)
    }

    /// Whether anything committed, or may be committing, on this record after `read_ts`.
    /// `me` is the caller's own lock identity: its own lock does not count.
    #[inline]
    pub(crate) fn staleness(&self, read_ts: Ts, me: LockOwner) -> Staleness {
        let owner = self.lock.load(Ordering::Acquire);
        if owner == crate::split::SPLIT_OWNER.0 {
            return Staleness::Split;
        }
        if owner == DEAD_OWNER.0 {
            return Staleness::Dead;
        }
        if owner != 0 && owner != me.0 && !is_shared(owner) {
            return Staleness::Locked;
        }
        match self.head() {
            Some(v) if v.ts > read_ts => Staleness::Changed,
            _ => Staleness::Fresh,
        }
    }

    /// Whether a prepared transaction holds the record until its decision ([`awaits_decision`]).
    #[inline]
    pub(crate) fn awaits_decision(&self) -> bool {
        awaits_decision(self.lock.load(Ordering::Acquire))
    }

    /// The lock word: 0 when free, else its holder (a waiter watches it change hands).
    #[inline]
    pub(crate) fn lock_word(&self) -> u64 {
        self.lock.load(Ordering::Relaxed)
    }

    pub(crate) fn try_lock(&self, me: LockOwner) -> bool {
        self.lock
            .compare_exchange(0, me.0, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// Takes a shared hold on the record if nobody holds it exclusively; whether it did.
    pub(crate) fn try_lock_shared(&self) -> bool {
        let mut word = self.lock.load(Ordering::Relaxed);
        loop {
            let next = match word {
                0 => SHARED + 1,
                w if is_shared(w) && w < SHARED + SHARED_HOLDERS_MAX => w + 1,
                _ => return false,
            };
            match self
                .lock
                .compare_exchange_weak(word, next, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(now) => word = now,
            }
        }
    }

    /// Gives back one shared hold.
    pub(crate) fn unlock_shared(&self) {
        let mut word = self.lock.load(Ordering::Relaxed);
        loop {
            assert!(
                is_shared(word),
                "a shared hold given back that was not taken"
            );
            let next = if word == SHARED + 1 { 0 } else { word - 1 };
            match self
                .lock
                .compare_exchange_weak(word, next, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(now) => word = now,
            }
        }
    }

    /// Turns `me`'s exclusive lock into one shared hold.
    pub(crate) fn downgrade(&self, me: LockOwner) {
        let was = self.lock.swap(SHARED + 1, Ordering::Release);
        assert_eq!(
            was, me.0,
            "a record downgraded by a transaction that did not hold it"
        );
    }

    pub(crate) fn is_locked_by(&self, me: LockOwner) -> bool {
        self.lock.load(Ordering::Relaxed) == me.0
    }

    /// Prefetches the version below the head: the one the next install usually trims, reading
    /// its header and reusing its block. A commit does this for all its records before it
    /// installs any, so their cache misses overlap instead of coming one install at a time.
    /// Caller holds the lock (the chain stays as it is).
    pub(crate) fn prefetch_below_head(&self) {
        if let Some(head) = self.head() {
            crate::memory::prefetch(head.next.load(Ordering::Relaxed));
        }
    }

    pub(crate) fn unlock(&self, me: LockOwner) {
        // A held lock word changes only by its holder (others' compare-exchanges fail), so a
        // load and a release store do what a swap would, without a locked instruction: its
        // full fence would hold the next record's install behind this one's.
        let was = self.lock.load(Ordering::Relaxed);
        self.lock.store(0, Ordering::Release);
        assert_eq!(
            was, me.0,
            "a record was unlocked by a transaction that did not hold it"
        );
    }

    /// Pushes a new head version, then frees the versions no snapshot at or above `horizon`
    /// can reach. Returns how many versions were added minus how many were freed.
    ///
    /// The caller holds the lock, and `ts` is above every version in the chain.
    pub(crate) fn install(&self, me: LockOwner, ts: Ts, value: Option<&[u8]>, horizon: Ts) -> i64 {
        assert!(
            self.is_locked_by(me),
            "versions are installed only under the record lock"
        );
        let old = self.head.load(Ordering::Relaxed);
        // SAFETY: the head is live; we hold the lock so nobody else changes the chain.
        if let Some(old) = unsafe { old.as_ref() } {
            assert!(ts > old.ts, "versions must be installed in timestamp order");
        }
        if ts <= horizon {
            // No snapshot can read below the new version: push it, then free the whole old
            // chain (recovery installs this way).
            let new = self.new_version(ts, value);
            // SAFETY: `new` is fresh and not yet shared.
            unsafe { new.as_ref() }.next.store(old, Ordering::Relaxed);
            self.head.store(new.as_ptr(), Ordering::Release);
            // SAFETY: the cut chain is unreachable and ours.
            return 1 - unsafe { self.free_cut(self.trim(horizon)) };
        }
        // `ts` is above `horizon`, so trimming before the push cuts what trimming after it
        // would. A cut version's block, in cache from the cut, then takes the new version:
        // that saves an allocation (whose free-list block is usually cold) and a free.
        let mut cut = self.trim(horizon);
        let mut reused = None;
        let mut freed = 0;
        if let Some(dead) = cut {
            // SAFETY: `trim` detached the chain from `dead` on: nobody reaches it, it is ours.
            // Its successor is read before `reuse` overwrites the header.
            cut = NonNull::new(unsafe { dead.as_ref() }.next.load(Ordering::Relaxed));
            // SAFETY: as above.
            match unsafe { Version::reuse(dead, ts, value) } {
                Ok(new) => reused = Some(new),
                // SAFETY: as above; freed once, since `cut` has moved past it.
                Err(dead) => unsafe { self.free_cut_one(dead) },
            }
            freed = 1;
        }
        // SAFETY: what is left of the cut chain is unreachable and ours.
        freed += unsafe { self.free_cut(cut) };
        let new = reused.unwrap_or_else(|| self.new_version(ts, value));
        // SAFETY: `new` is fresh (or reused, so unreachable) and not yet shared; the cut left
        // the head in place.
        unsafe { new.as_ref() }.next.store(old, Ordering::Relaxed);
        self.head.store(new.as_ptr(), Ordering::Release);
        1 - freed
    }

    /// Frees `chain`, cut from this record's chain, and every version after it; returns how
    /// many. Caller holds the lock.
    ///
    /// # Safety
    /// Nobody can reach `chain` any more, and the caller owns it.
    unsafe fn free_cut(&self, mut chain: Option<NonNull<Version>>) -> i64 {
        let mut freed = 0;
        while let Some(dead) = chain {
            // SAFETY: guaranteed by the caller; each version is freed once.
            unsafe {
                chain = NonNull::new(dead.as_ref().next.load(Ordering::Relaxed));
                self.free_cut_one(dead);
            }
            freed += 1;
        }
        freed
    }

    /// Frees one version cut from this record's chain (not its successors). The embedded
    /// slot, if that is where it lived, is free again: the next install builds in it, so a
    /// record updated in place alternates between its slot and one heap block, and half the
    /// time its newest version is in the lines its header is in. Caller holds the lock.
    ///
    /// # Safety
    /// As for [`Version::free`]; `dead` was in this record's chain.
    unsafe fn free_cut_one(&self, dead: NonNull<Version>) {
        // SAFETY: the caller owns `dead`.
        if unsafe { dead.as_ref() }.cap == EMBEDDED {
            let cap = self.embedded_cap.load(Ordering::Relaxed);
            debug_assert!(cap != NO_SLOT && cap & SLOT_USED != 0);
            self.embedded_cap.store(cap & !SLOT_USED, Ordering::Relaxed);
        } else {
            // SAFETY: guaranteed by the caller.
            unsafe { Version::free(dead) };
        }
    }

    /// Builds a version in the embedded slot if it is free and large enough, else on the heap.
    /// Caller holds the lock.
    fn new_version(&self, ts: Ts, value: Option<&[u8]>) -> NonNull<Version> {
        let cap = self.embedded_cap.load(Ordering::Relaxed);
        let len = value.map_or(0, <[u8]>::len);
        if cap & SLOT_USED != 0 || len > cap as usize {
            return Version::new(ts, value);
        }
        self.embedded_cap.store(cap | SLOT_USED, Ordering::Relaxed);
        // SAFETY: the slot lies inside this record's block (sized in `new_locked` for `cap`
        // value bytes), is aligned for `Version`, and has never been used: we hold the lock
        // and just marked it used.
        unsafe {
            let slot = ptr::from_ref(self)
                .cast::<u8>()
                .add(Self::slot_offset(self.key_len()));
            let slot = NonNull::new_unchecked(slot.cast::<Version>().cast_mut());
            Version::write(slot, ts, value, EMBEDDED);
            slot
        }
    }

    /// Cuts the chain below the newest version at or below `horizon` and returns the first
    /// version cut off, which heads a chain nobody can reach any more. Caller holds the lock.
    fn trim(&self, horizon: Ts) -> Option<NonNull<Version>> {
        let mut v = self.head.load(Ordering::Relaxed);
        // SAFETY: versions reachable from the head are live; under the lock nobody else
        // changes the chain.
        while let Some(version) = unsafe { v.as_ref() } {
            if version.ts <= horizon {
                // No snapshot at or above `horizon` reaches past `version`, and no snapshot
                // below it exists (module invariants), so what hangs below is unreachable.
                // Only the lock holder writes `next`: a load and a store, not a swap.
                let cut = version.next.load(Ordering::Relaxed);
                version.next.store(ptr::null_mut(), Ordering::Relaxed);
                return NonNull::new(cut);
            }
            v = version.next.load(Ordering::Relaxed);
        }
        None
    }
}

/// A record pointer that may cross threads: records are immutable apart from their atomics
/// and live while a registered transaction could hold them (see the module docs).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecordRef(pub(crate) NonNull<Record>);

// SAFETY: `Record` is only mutated through atomics, and records outlive every user that could
// have found them (freed by the collector after a grace period, or in `Drop` of the store).
unsafe impl Send for RecordRef {}
// SAFETY: as above.
unsafe impl Sync for RecordRef {}

impl RecordRef {
    /// The record. Valid while the holder keeps the registry slot it held when it found the
    /// handle (every transaction, snapshot and scan does), or the store is exclusively its.
    #[inline]
    pub(crate) fn get<'a>(self) -> &'a Record {
        // SAFETY: the collector frees a record only after every slot registered when it was
        // unlinked is released (`gc`); callers found the handle while registered.
        unsafe { self.0.as_ref() }
    }
}

impl std::fmt::Debug for RecordRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RecordRef({:?})",
            crate::error::show_key(self.get().key())
        )
    }
}

#[cfg(test)]
mod tests;

//! The record store: where records live and how they are found, by key and in key order.
//!
//! This is the transaction component's view of the data component (Deuteronomy's TC/DC
//! split): the transaction layer (`txn`, `concurrency`) decides visibility, locking and
//! validation, and asks the store only for record handles. [`MemStore`] keeps every record in
//! memory behind two indexes — the hash index for point access and a B+tree read without
//! locks for ordered scans (Hekaton keeps both kinds over one row the same way). A
//! disk-resident store implements the same trait.
//!
//! Invariant: a record is in the hash index and in the ordered index before its creator takes
//! a commit timestamp, so a range validation that runs after a later timestamp sees it.

use std::ops::{Bound, RangeBounds};

use crate::index::Index;
use crate::index::ordered::{Ordered, Range};
use crate::memory::Arena;
use crate::mvcc::{LockOwner, Record, RecordRef};

/// A key range with owned bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyRange {
    pub(crate) lo: Bound<Vec<u8>>,
    pub(crate) hi: Bound<Vec<u8>>,
}

impl RangeBounds<[u8]> for KeyRange {
    fn start_bound(&self) -> Bound<&[u8]> {
        self.lo.as_ref().map(Vec::as_slice)
    }
    fn end_bound(&self) -> Bound<&[u8]> {
        self.hi.as_ref().map(Vec::as_slice)
    }
}

impl KeyRange {
    pub(crate) fn is_empty(&self) -> bool {
        match (&self.lo, &self.hi) {
            (Bound::Included(a), Bound::Included(b)) => a > b,
            (Bound::Included(a) | Bound::Excluded(a), Bound::Excluded(b))
            | (Bound::Excluded(a), Bound::Included(b)) => a >= b,
            _ => false,
        }
    }
}

/// What the transaction layer needs from a record store.
pub(crate) trait Store: Send + Sync {
    /// Ordered iterator over record handles.
    type Scan<'a>: DoubleEndedIterator<Item = RecordRef>
    where
        Self: 'a;

    /// The record for `key`, if one was ever created.
    fn get(&self, key: &[u8], hash: u64) -> Option<RecordRef>;

    /// The record for `key`, created (locked by `me`) if absent. Returns whether it was
    /// created; if not, the caller must lock it itself.
    /// `reserve` is the size of the value about to be installed, if known, so that a new
    /// record can hold it inline.
    fn get_or_create_locked(
        &self,
        key: &[u8],
        hash: u64,
        me: LockOwner,
        reserve: Option<usize>,
    ) -> (RecordRef, bool);

    /// Records whose keys fall in `range`, in key order.
    fn scan(&self, range: KeyRange) -> Self::Scan<'_>;

    /// Number of records (including deleted keys whose record the collector has not taken
    /// yet).
    fn len(&self) -> usize;
}

/// The in-memory record store.
pub(crate) struct MemStore {
    index: Index,
    ordered: Ordered,
    arena: Arena,
    /// Records that may have died, for the collector (`gc`).
    candidates: crate::gc::Candidates,
    /// The collector's own state (its thread's, and the drop's).
    pub(crate) gc: parking_lot::Mutex<crate::gc::State>,
    gc_counters: crate::gc::Counters,
}

impl MemStore {
    pub(crate) fn new(capacity_hint: usize) -> MemStore {
        MemStore {
            index: Index::new(capacity_hint),
            ordered: Ordered::new(),
            arena: Arena::new(),
            candidates: crate::gc::Candidates::new(),
            gc: parking_lot::Mutex::new(crate::gc::State::default()),
            gc_counters: crate::gc::Counters::default(),
        }
    }

    pub(crate) fn index(&self) -> &Index {
        &self.index
    }

    pub(crate) fn ordered(&self) -> &Ordered {
        &self.ordered
    }

    pub(crate) fn candidates(&self) -> &crate::gc::Candidates {
        &self.candidates
    }

    pub(crate) fn gc_counters(&self) -> &crate::gc::Counters {
        &self.gc_counters
    }

    /// `record` holds only absence from `ts` on (a tombstone committed at `ts`, or `Ts(0)`:
    /// an empty record its creator left): the collector will look at it.
    #[inline]
    pub(crate) fn note_dead(&self, record: RecordRef, ts: crate::Ts) -> bool {
        self.candidates.note(record, ts)
    }

    /// Frees an unlinked record and its versions; returns how many versions it held.
    ///
    /// # Safety
    /// The record is in neither index, nobody can hold it any more, and it is freed once.
    pub(crate) unsafe fn free_record(&self, record: RecordRef) -> usize {
        // SAFETY: guaranteed by the caller; the record came from this store's arena.
        unsafe { Record::free(record.0, &self.arena) }
    }

    /// Bytes mapped for records.
    pub(crate) fn arena_bytes(&self) -> usize {
        self.arena.mapped_bytes()
    }

    /// Recovery's [`Store::get_or_create_locked`]: a new record goes into the point index
    /// only. Nothing may scan until [`MemStore::link_recovered`] has put every record in the
    /// ordered index, which is far cheaper in one sorted pass than key by key.
    #[inline]
    pub(crate) fn get_or_create_unordered(
        &self,
        key: &[u8],
        hash: u64,
        me: LockOwner,
        reserve: Option<usize>,
    ) -> (RecordRef, bool) {
        if let Some(record) = self.index.get(key, hash) {
            return (record, false);
        }
        let new = RecordRef(Record::new_locked(&self.arena, key, me, reserve));
        self.index.insert(new)
    }

    /// Starts loading the index bucket a lookup of `hash` reads first.
    #[inline]
    pub(crate) fn prefetch(&self, hash: u64) {
        self.index.prefetch(hash);
    }

    /// For a batch of lookups, in windows of 32 (enough loads in flight to cover a miss's
    /// latency): starts loading every hash's index bucket, then the record each hash
    /// probably names (the first tag match in its bucket), then each such record's newest
    /// version. A wrong guess costs a wasted load, nothing else: the caller holds a registry
    /// slot, so nothing it could find is freed under it (`gc`).
    pub(crate) fn prefetch_all(&self, hashes: impl IntoIterator<Item = u64>) {
        const WINDOW: usize = 32;
        let mut hashes = hashes.into_iter();
        loop {
            let mut window = [0u64; WINDOW];
            let mut n = 0;
            for hash in hashes.by_ref().take(WINDOW) {
                self.index.prefetch(hash);
                window[n] = hash;
                n += 1;
            }
            let mut records = [None; WINDOW];
            for (slot, &hash) in records.iter_mut().zip(&window[..n]) {
                *slot = self.index.candidate(hash);
                if let Some(record) = *slot {
                    let at = record.0.as_ptr().cast::<u8>();
                    // The header and key, and the line after, where a small record keeps
                    // its first version.
                    crate::memory::prefetch(at);
                    crate::memory::prefetch(at.wrapping_add(64));
                }
            }
            for record in records.iter().flatten() {
                if let Some(version) = record.get().head() {
                    crate::memory::prefetch(version);
                }
            }
            if n < WINDOW {
                return;
            }
        }
    }

    /// Links every record into the empty ordered index; ends recovery's
    /// [`MemStore::get_or_create_unordered`]. `runs` hold every record, in any order, each
    /// with its sort key ([`Ordered::build`]). Records recovered deleted go to the collector.
    pub(crate) fn link_recovered(&mut self, runs: Vec<Vec<(u64, RecordRef)>>) {
        assert_eq!(
            runs.iter().map(Vec::len).sum::<usize>(),
            self.index.len(),
            "every record is in exactly one run"
        );
        for (_, record) in runs.iter().flatten() {
            if let Some(head) = record.get().head()
                && head.value().is_none()
            {
                self.candidates.note(*record, head.ts());
            }
        }
        self.ordered.build(runs);
    }

    /// [`Store::get_or_create_locked`], but a new record goes into the point index only:
    /// the caller must pass it to [`MemStore::link_created`] before it lets go of the lock
    /// (another writer could commit a value into it then) and before it takes a commit
    /// timestamp (the module invariant).
    #[inline]
    pub(crate) fn get_or_create_locked_unlinked(
        &self,
        key: &[u8],
        hash: u64,
        me: LockOwner,
        reserve: Option<usize>,
    ) -> (RecordRef, bool) {
        // A record that lost the race to create the key stays in the arena unused; such
        // races are rare. A record the collector took is on its way out of the index: wait
        // for it to go, then make a new one.
        loop {
            let (record, created) = self.get_or_create_unordered(key, hash, me, reserve);
            if created || !record.get().is_dead() {
                return (record, created);
            }
            std::thread::yield_now();
        }
    }

    /// Puts records made by [`MemStore::get_or_create_locked_unlinked`] into the ordered
    /// index, in key order, and empties `created`. A commit locks its keys in hash order;
    /// inserted in that order, a batch of new keys that follow each other (a sorted set's
    /// members loaded in order, `MSET` of a range) lands in random places of the leaf they
    /// go to, which then splits in the middle and stays half full. In key order they are a
    /// run, which fills leaves (`split_point`): 95 000 nodes became 73 000 for a sorted set
    /// of a million members loaded a thousand at a time.
    pub(crate) fn link_created(&self, created: &mut smallvec::SmallVec<[RecordRef; 4]>) {
        if created.len() > 1 {
            created.sort_unstable_by(|a, b| a.get().key().cmp(b.get().key()));
        }
        for record in created.drain(..) {
            self.ordered.insert(record);
        }
    }
}

impl Store for MemStore {
    type Scan<'a> = Range<'a>;

    #[inline]
    fn get(&self, key: &[u8], hash: u64) -> Option<RecordRef> {
        self.index.get(key, hash)
    }

    #[inline]
    fn get_or_create_locked(
        &self,
        key: &[u8],
        hash: u64,
        me: LockOwner,
        reserve: Option<usize>,
    ) -> (RecordRef, bool) {
        let (record, created) = self.get_or_create_locked_unlinked(key, hash, me, reserve);
        if created {
            self.ordered.insert(record);
        }
        (record, created)
    }

    fn scan(&self, range: KeyRange) -> Range<'_> {
        self.ordered.range(range)
    }

    fn len(&self) -> usize {
        self.index.len()
    }
}

impl Drop for MemStore {
    fn drop(&mut self) {
        // A growth in progress reads the records.
        self.index.close();
        let retired = self.gc.get_mut();
        // SAFETY: the store is being dropped, so nobody else holds a handle; each record is
        // in the index or retired by the collector, exactly once. The arena frees the
        // records themselves after.
        for record in self.index.records().chain(retired.retired_records()) {
            unsafe { Record::free_versions(record.0) };
        }
    }
}

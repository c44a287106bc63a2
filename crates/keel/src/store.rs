//! The record store: where records live and how they are found, by key and in key order.
//!
//! This is the transaction component's view of the data component (Deuteronomy's TC/DC
//! split): the transaction layer (`txn`, `concurrency`) decides visibility, locking and
//! validation, and asks the store only for record handles. [`MemStore`] keeps every record in
//! memory behind two indexes — the hash index for point access and a lock-free skip list for
//! ordered scans (Hekaton keeps both kinds on one row the same way). A disk-resident store
//! implements the same trait.
//!
//! Invariant: a record is in the hash index and in the ordered index before its creator takes
//! a commit timestamp, so a range validation that runs after a later timestamp sees it.

use std::ops::{Bound, RangeBounds};

use crossbeam_skiplist::SkipMap;

use crate::index::Index;
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

    /// Number of records (including deleted keys whose record remains).
    fn len(&self) -> usize;
}

/// The in-memory record store.
pub(crate) struct MemStore {
    index: Index,
    ordered: SkipMap<Vec<u8>, RecordRef>,
    arena: Arena,
}

impl MemStore {
    pub(crate) fn new(capacity_hint: usize) -> MemStore {
        MemStore {
            index: Index::new(capacity_hint),
            ordered: SkipMap::new(),
            arena: Arena::new(),
        }
    }

    /// Bytes mapped for records.
    pub(crate) fn arena_bytes(&self) -> usize {
        self.arena.mapped_bytes()
    }
}

/// Scan over [`MemStore`].
pub(crate) struct MemScan<'a> {
    inner: crossbeam_skiplist::map::Range<'a, [u8], KeyRange, Vec<u8>, RecordRef>,
}

impl Iterator for MemScan<'_> {
    type Item = RecordRef;
    fn next(&mut self) -> Option<RecordRef> {
        self.inner.next().map(|entry| *entry.value())
    }
}

impl DoubleEndedIterator for MemScan<'_> {
    fn next_back(&mut self) -> Option<RecordRef> {
        self.inner.next_back().map(|entry| *entry.value())
    }
}

impl Store for MemStore {
    type Scan<'a> = MemScan<'a>;

    #[inline]
    fn get(&self, key: &[u8], hash: u64) -> Option<RecordRef> {
        self.index.get(key, hash)
    }

    fn get_or_create_locked(
        &self,
        key: &[u8],
        hash: u64,
        me: LockOwner,
        reserve: Option<usize>,
    ) -> (RecordRef, bool) {
        if let Some(record) = self.index.get(key, hash) {
            return (record, false);
        }
        let new = RecordRef(Record::new_locked(&self.arena, key, hash, me, reserve));
        let (record, inserted) = self.index.insert(new);
        if !inserted {
            // The losing record stays in the arena unused; races on a new key are rare.
            return (record, false);
        }
        self.ordered.insert(key.to_vec(), record);
        (record, true)
    }

    fn scan(&self, range: KeyRange) -> MemScan<'_> {
        MemScan {
            inner: self.ordered.range(range),
        }
    }

    fn len(&self) -> usize {
        self.index.len()
    }
}

impl Drop for MemStore {
    fn drop(&mut self) {
        let records: Vec<RecordRef> = self.index.records().collect();
        self.ordered.clear();
        for record in records {
            // SAFETY: the store is being dropped, so nobody else holds a handle; each record
            // is in the index exactly once. The arena frees the records themselves after.
            unsafe { Record::free_versions(record.0) };
        }
    }
}

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

    /// Number of records (including deleted keys whose record remains).
    fn len(&self) -> usize;
}

/// The in-memory record store.
pub(crate) struct MemStore {
    index: Index,
    ordered: Ordered,
    arena: Arena,
}

impl MemStore {
    pub(crate) fn new(capacity_hint: usize) -> MemStore {
        MemStore {
            index: Index::new(capacity_hint),
            ordered: Ordered::new(),
            arena: Arena::new(),
        }
    }

    /// Bytes mapped for records.
    pub(crate) fn arena_bytes(&self) -> usize {
        self.arena.mapped_bytes()
    }

    /// Recovery's [`Store::get_or_create_locked`]: a new record goes into the point index
    /// only. Nothing may scan until [`MemStore::link_recovered`] has put every record in the
    /// ordered index, which is far cheaper in one sorted pass than key by key.
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
        let new = RecordRef(Record::new_locked(&self.arena, key, hash, me, reserve));
        self.index.insert(new)
    }

    /// Starts loading the index bucket a lookup of `hash` reads first.
    #[inline]
    pub(crate) fn prefetch(&self, hash: u64) {
        self.index.prefetch(hash);
    }

    /// Links every record into the empty ordered index; ends recovery's
    /// [`MemStore::get_or_create_unordered`]. `runs` hold every record, each with its key's
    /// [`key_prefix`], in any order. Each run is sorted on a thread of its own; then each
    /// thread merges one key range of all runs, and the tree is built from those stretches
    /// ([`Ordered::build`]).
    pub(crate) fn link_recovered(&mut self, mut runs: Vec<Vec<(u64, RecordRef)>>) {
        // Sorting by the first 8 key bytes, then by the whole key, keeps most comparisons
        // in the run instead of chasing two record pointers.
        type Entry = (u64, RecordRef);
        fn order(a: &Entry, b: &Entry) -> std::cmp::Ordering {
            a.0.cmp(&b.0)
                .then_with(|| a.1.get().key().cmp(b.1.get().key()))
        }
        assert_eq!(
            runs.iter().map(Vec::len).sum::<usize>(),
            self.index.len(),
            "every record is in exactly one run"
        );
        runs.retain(|run| !run.is_empty());
        let threads = runs.len().max(1);
        std::thread::scope(|s| {
            for run in &mut runs {
                s.spawn(move || run.sort_unstable_by(order));
            }
        });
        // Key ranges split at quantiles of the longest run; in each run, a range starts at
        // the first entry not below its splitter.
        let longest = runs
            .iter()
            .max_by_key(|r| r.len())
            .map_or(&[][..], Vec::as_slice);
        let splitters: Vec<Entry> = (1..threads)
            .map(|p| longest[longest.len() * p / threads])
            .collect();
        let cuts: Vec<Vec<usize>> = runs
            .iter()
            .map(|run| {
                let mut cuts = vec![0];
                cuts.extend(
                    splitters
                        .iter()
                        .map(|sp| run.partition_point(|e| order(e, sp).is_lt())),
                );
                cuts.push(run.len());
                cuts
            })
            .collect();
        let stretches: Vec<Vec<RecordRef>> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..threads)
                .map(|p| {
                    let mut heads: Vec<&[Entry]> = runs
                        .iter()
                        .zip(&cuts)
                        .map(|(run, cuts)| &run[cuts[p]..cuts[p + 1]])
                        .collect();
                    s.spawn(move || {
                        let mut merged = Vec::with_capacity(heads.iter().map(|h| h.len()).sum());
                        // A k-way merge over a handful of runs: the smallest head, by scanning.
                        while let Some((i, _)) = heads
                            .iter()
                            .enumerate()
                            .filter(|(_, h)| !h.is_empty())
                            .min_by(|(_, a), (_, b)| order(&a[0], &b[0]))
                        {
                            let (first, rest) = heads[i].split_first().expect("non-empty run");
                            heads[i] = rest;
                            merged.push(first.1);
                        }
                        merged
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|w| w.join().expect("linking thread"))
                .collect()
        });
        self.ordered.build(stretches);
    }
}

/// The first 8 bytes of `key`, zero-padded, as a big-endian number: ordering by it agrees
/// with ordering by key wherever the prefixes differ.
pub(crate) fn key_prefix(key: &[u8]) -> u64 {
    let mut bytes = [0u8; 8];
    let n = key.len().min(8);
    bytes[..n].copy_from_slice(&key[..n]);
    u64::from_be_bytes(bytes)
}

impl Store for MemStore {
    type Scan<'a> = Range<'a>;

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
        // A record that lost the race to create the key stays in the arena unused; such
        // races are rare.
        let (record, created) = self.get_or_create_unordered(key, hash, me, reserve);
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
        for record in self.index.records() {
            // SAFETY: the store is being dropped, so nobody else holds a handle; each record
            // is in the index exactly once. The arena frees the records themselves after.
            unsafe { Record::free_versions(record.0) };
        }
    }
}

//! The ordered index: an insert-only, lock-free skip list threaded through the records.
//!
//! Each record carries its own tower of forward links in front of its header (see
//! [`Record`]), so the list allocates nothing, copies no key and compares keys where they
//! already are. Records are never removed (a deleted key keeps its record), which removes
//! what makes concurrent skip lists hard: there is no marking, no helping and no memory
//! reclamation, and a node once reached stays in the list at every level it was linked at.
//!
//! Insertion (after RocksDB's `InlineSkipList`): find the predecessor and successor at every
//! level, then link the record bottom-up, one compare-and-swap per level. A failed swap means
//! another record was linked right after the predecessor; the search resumes from that
//! predecessor on that level only, since it is still in place and still smaller. Level 0 is
//! the list; the levels above only shorten searches, so a reader that sees a record at a
//! higher level before it is linked everywhere is still correct. The point index guarantees
//! one record per key, so no two inserts race on the same key.
//!
//! Heights are drawn at random (each further level with probability 1/4) so that no choice
//! of keys can make searches linear. Recovery builds the list from sorted records instead:
//! stretches linked in parallel ([`Stretch::link`]), then joined ([`Ordered::join`]).

use std::cell::Cell;
use std::ops::Bound;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use crate::mvcc::{Record, RecordRef};
use crate::store::KeyRange;

/// Levels a tower may have: 4^20 keys before searches slow down.
pub(crate) const MAX_HEIGHT: usize = 20;

/// A random tower height: 1, then each further level with probability 1/4.
pub(crate) fn random_height() -> usize {
    thread_local! {
        static STATE: Cell<u64> = Cell::new(seed());
    }
    let bits = STATE.with(|state| {
        // xorshift64: never zero when seeded non-zero.
        let mut x = state.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        state.set(x);
        x
    });
    (1 + bits.trailing_zeros() as usize / 2).min(MAX_HEIGHT)
}

fn seed() -> u64 {
    let local = 0u8;
    let address = ptr::from_ref(&local) as u64;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (address ^ nanos.rotate_left(32)).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1
}

/// Byte-wise key order, compared 8 bytes at a time inline: a search compares ~40 keys, and
/// a call into `memcmp` for each cost more than the comparison itself.
#[inline]
pub(crate) fn compare(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    let mut a_words = a.chunks_exact(8);
    let mut b_words = b.chunks_exact(8);
    for (x, y) in (&mut a_words).zip(&mut b_words) {
        let x = u64::from_be_bytes(x.try_into().expect("8 bytes"));
        let y = u64::from_be_bytes(y.try_into().expect("8 bytes"));
        if x != y {
            return x.cmp(&y);
        }
    }
    let done = a.len().min(b.len()) / 8 * 8;
    a[done..].cmp(&b[done..])
}

/// A tower: the list's head or a record. Level `i`'s link is `i` pointers below level 0's.
#[derive(Clone, Copy)]
struct Node {
    level0: *const AtomicPtr<Record>,
    /// The record, or null for the head.
    record: *mut Record,
}

impl Node {
    fn of(record: &Record) -> Node {
        Node {
            level0: record.link(0),
            record: ptr::from_ref(record).cast_mut(),
        }
    }

    #[inline]
    fn link<'a>(self, level: usize) -> &'a AtomicPtr<Record> {
        // SAFETY: callers pass a level below the tower's height; towers live as long as the
        // list (records as long as the store, the head as long as the list, and a `Node`
        // never outlives a borrow of the list).
        unsafe { &*self.level0.sub(level) }
    }
}

/// The predecessor and successor of a key at every level.
struct Splice {
    preds: [Node; MAX_HEIGHT],
    succs: [*mut Record; MAX_HEIGHT],
}

/// The skip list. Holds no records: it links records the store owns.
pub(crate) struct Ordered {
    /// The head tower; level `i` is `head[MAX_HEIGHT - 1 - i]`.
    head: [AtomicPtr<Record>; MAX_HEIGHT],
    /// Levels in use; searches start at the top one. Only grows.
    height: AtomicUsize,
}

// SAFETY: the list holds pointers to records, which are shared through atomics only and
// outlive it (the store owns both).
unsafe impl Send for Ordered {}
// SAFETY: as above.
unsafe impl Sync for Ordered {}

impl Ordered {
    pub(crate) fn new() -> Ordered {
        Ordered {
            head: std::array::from_fn(|_| AtomicPtr::new(ptr::null_mut())),
            height: AtomicUsize::new(0),
        }
    }

    fn head(&self) -> Node {
        Node {
            // SAFETY: in bounds: the last element of the head array.
            level0: unsafe { self.head.as_ptr().add(MAX_HEIGHT - 1) },
            record: ptr::null_mut(),
        }
    }

    /// Walks down from the top level, staying on records whose key is `before`. Returns the
    /// last such record at level 0 (the head if none) and the record after it; fills
    /// `splice` with the same pair per level.
    #[inline]
    fn seek(
        &self,
        before: impl Fn(&[u8]) -> bool,
        mut splice: Option<&mut Splice>,
    ) -> (Node, *mut Record) {
        let mut pred = self.head();
        let mut succ = ptr::null_mut();
        let mut level = self.height.load(Ordering::Acquire);
        while level > 0 {
            level -= 1;
            loop {
                succ = pred.link(level).load(Ordering::Acquire);
                if level > 0 {
                    // Where the search goes if it descends from here: load it meanwhile.
                    crate::memory::prefetch(pred.link(level - 1).load(Ordering::Relaxed));
                }
                // SAFETY: a non-null link points at a live record.
                match unsafe { succ.as_ref() } {
                    Some(next) if before(next.key()) => pred = Node::of(next),
                    _ => break,
                }
            }
            if let Some(splice) = splice.as_deref_mut() {
                splice.preds[level] = pred;
                splice.succs[level] = succ;
            }
        }
        (pred, succ)
    }

    /// Links `record` in. Its key must not be in the list and must not be inserted by anyone
    /// else meanwhile (the point index hands out one record per key).
    pub(crate) fn insert(&self, record: RecordRef) {
        let r = record.get();
        let (key, height) = (r.key(), r.height());
        let me = record.0.as_ptr();
        self.height.fetch_max(height, Ordering::AcqRel);
        let mut splice = Splice {
            preds: [self.head(); MAX_HEIGHT],
            succs: [ptr::null_mut(); MAX_HEIGHT],
        };
        self.seek(|k| compare(k, key).is_lt(), Some(&mut splice));
        for level in 0..height {
            let (mut pred, mut succ) = (splice.preds[level], splice.succs[level]);
            loop {
                r.link(level).store(succ, Ordering::Relaxed);
                match pred.link(level).compare_exchange(
                    succ,
                    me,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => break,
                    Err(now) => {
                        // Someone linked a record after `pred` on this level: move past
                        // every record now there that is still smaller than ours.
                        succ = now;
                        // SAFETY: a non-null link points at a live record.
                        while let Some(next) = unsafe { succ.as_ref() } {
                            debug_assert_ne!(next.key(), key, "a key was inserted twice");
                            if compare(next.key(), key).is_ge() {
                                break;
                            }
                            pred = Node::of(next);
                            succ = pred.link(level).load(Ordering::Acquire);
                        }
                    }
                }
            }
        }
    }

    /// Links `records`, which are sorted by key and distinct, into an empty list in one
    /// pass. Their links must be null (fresh records).
    #[cfg(test)]
    pub(crate) fn build_sorted(&mut self, records: &[RecordRef]) {
        self.join(vec![Stretch::link(records)]);
    }

    /// Makes an empty list of `stretches`, which follow each other in key order (recovery:
    /// each stretch is linked on its own thread, then they are joined here).
    pub(crate) fn join(&mut self, stretches: Vec<Stretch>) {
        assert_eq!(
            *self.height.get_mut(),
            0,
            "a sorted build starts from an empty list"
        );
        let mut last = [self.head(); MAX_HEIGHT];
        let mut top = 0;
        for stretch in stretches {
            for (level, last) in last.iter_mut().enumerate() {
                let (first, end) = (stretch.first[level], stretch.last[level]);
                if first.is_null() {
                    continue;
                }
                last.link(level).store(first, Ordering::Relaxed);
                // SAFETY: a record of the stretch, alive as long as the store.
                *last = Node::of(unsafe { &*end });
                top = top.max(level + 1);
            }
        }
        *self.height.get_mut() = top;
    }

    /// Records whose keys fall in `range`, in key order (either end).
    pub(crate) fn range(&self, range: KeyRange) -> Range<'_> {
        Range {
            list: self,
            range,
            front: None,
            back: None,
            done: false,
        }
    }
}

/// Sorted records linked among themselves at every level, not yet in a list: the first and
/// last record per level (null where none is that tall).
pub(crate) struct Stretch {
    first: [*mut Record; MAX_HEIGHT],
    last: [*mut Record; MAX_HEIGHT],
}

// SAFETY: pointers to records, which outlive the stretch and are shared through atomics.
unsafe impl Send for Stretch {}

impl Stretch {
    /// Links `records`, sorted by key and distinct, with null links (fresh records), to each
    /// other. No record here may be in a list yet, so nothing else reads these links.
    pub(crate) fn link(records: &[RecordRef]) -> Stretch {
        /// Records ahead whose header is prefetched: linking writes to records in key
        /// order, which is random in memory.
        const AHEAD: usize = 12;
        let mut stretch = Stretch {
            first: [ptr::null_mut(); MAX_HEIGHT],
            last: [ptr::null_mut(); MAX_HEIGHT],
        };
        for (i, record) in records.iter().enumerate() {
            if let Some(ahead) = records.get(i + AHEAD) {
                crate::memory::prefetch(ahead.0.as_ptr());
                crate::memory::prefetch(ahead.0.as_ptr().cast::<u8>().wrapping_sub(8));
            }
            let r = record.get();
            let me = record.0.as_ptr();
            for level in 0..r.height() {
                match NonNull::new(stretch.last[level]) {
                    // SAFETY: a record linked earlier in this stretch.
                    Some(last) => {
                        let last = unsafe { last.as_ref() };
                        debug_assert!(last.key() < r.key(), "records must be sorted and distinct");
                        last.link(level).store(me, Ordering::Relaxed);
                    }
                    None => stretch.first[level] = me,
                }
                stretch.last[level] = me;
            }
        }
        stretch
    }
}

/// Iterator over a key range of [`Ordered`]. Records linked while it runs may or may not be
/// seen; the two ends never pass each other.
pub(crate) struct Range<'a> {
    list: &'a Ordered,
    range: KeyRange,
    /// The last record returned from each end.
    front: Option<RecordRef>,
    back: Option<RecordRef>,
    done: bool,
}

impl Range<'_> {
    fn below_end(&self, key: &[u8]) -> bool {
        match &self.range.hi {
            Bound::Included(hi) => key <= hi.as_slice(),
            Bound::Excluded(hi) => key < hi.as_slice(),
            Bound::Unbounded => true,
        }
    }

    fn above_start(&self, key: &[u8]) -> bool {
        match &self.range.lo {
            Bound::Included(lo) => key >= lo.as_slice(),
            Bound::Excluded(lo) => key > lo.as_slice(),
            Bound::Unbounded => true,
        }
    }

    fn finish(&mut self) -> Option<RecordRef> {
        self.done = true;
        None
    }
}

impl Iterator for Range<'_> {
    type Item = RecordRef;

    fn next(&mut self) -> Option<RecordRef> {
        if self.done {
            return None;
        }
        let next = match self.front {
            Some(front) => front.get().link(0).load(Ordering::Acquire),
            None => match &self.range.lo {
                Bound::Included(lo) => self.list.seek(|k| compare(k, lo).is_lt(), None).1,
                Bound::Excluded(lo) => self.list.seek(|k| compare(k, lo).is_le(), None).1,
                Bound::Unbounded => self.list.head().link(0).load(Ordering::Acquire),
            },
        };
        // SAFETY: a non-null link points at a live record.
        let Some(next) = (unsafe { next.as_ref() }) else {
            return self.finish();
        };
        if !self.below_end(next.key())
            || self.back.is_some_and(|back| next.key() >= back.get().key())
        {
            return self.finish();
        }
        let next = RecordRef(NonNull::from(next));
        self.front = Some(next);
        Some(next)
    }
}

impl DoubleEndedIterator for Range<'_> {
    fn next_back(&mut self) -> Option<RecordRef> {
        if self.done {
            return None;
        }
        // There are no back links: each step searches for the predecessor.
        let (prev, _) = match self.back {
            Some(back) => {
                let key = back.get().key();
                self.list.seek(|k| compare(k, key).is_lt(), None)
            }
            None => match &self.range.hi {
                Bound::Included(hi) => self.list.seek(|k| compare(k, hi).is_le(), None),
                Bound::Excluded(hi) => self.list.seek(|k| compare(k, hi).is_lt(), None),
                Bound::Unbounded => self.list.seek(|_| true, None),
            },
        };
        // SAFETY: a non-null record pointer of a node points at a live record.
        let Some(prev) = (unsafe { prev.record.as_ref() }) else {
            return self.finish(); // the head: nothing before
        };
        if !self.above_start(prev.key())
            || self
                .front
                .is_some_and(|front| prev.key() <= front.get().key())
        {
            return self.finish();
        }
        let prev = RecordRef(NonNull::from(prev));
        self.back = Some(prev);
        Some(prev)
    }
}

#[cfg(test)]
mod tests;

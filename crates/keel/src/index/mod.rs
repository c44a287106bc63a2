//! The point index: a purpose-built open-addressing hash table from key to record.
//!
//! Buckets are one cache line of eight slots. A slot holds a record pointer (low 48 bits)
//! and a 16-bit tag from the key's hash (high bits), so a lookup touches one bucket line and,
//! when the tag matches, the record it points at, which holds the key inline. Probing is
//! linear over buckets.
//!
//! Reads take no lock and write nothing shared. An empty slot ends a probe. The collector
//! (`gc`, one thread) removes a dead record's entry by overwriting it with [`TOMBSTONE`],
//! which probes pass over and inserts never reuse, so a slot never goes back to empty and
//! there is no ABA; growths copy only live entries, and the collector has the table rebuilt
//! at its size (or half of it) once tombstones fill a quarter of it.
//!
//! Inserts publish with one compare-and-swap. The table grows to twice its size in the
//! background: a helper thread started when it is half full maps and faults in the next
//! table (faulting in fresh memory took ~150 ms for 32 MiB on the VMs here), and once the
//! table is three-quarters full copies every entry into it while inserts go on into the
//! current table, then publishes it. An insert into a bucket the copy has passed puts its
//! record in the new table too ([`Table::forward`]). Only the publication holds inserts off,
//! while those in progress finish: microseconds, where copying held every insert for the
//! whole copy (30–40 ms at 400 000 keys, and longer as the table grows; on the server's
//! single poller thread, every connection). An insert waits for a copy only if the table
//! reaches 15/16 full first, and grows it itself if no helper could start.
//! Lookups never wait: one that still holds the old table sees every record inserted before
//! the new one was published, which is all it may see. Old tables go to the collector, which
//! frees them once every transaction that could still be probing one has ended.

use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_utils::CachePadded;
use parking_lot::{Condvar, Mutex};

use crate::memory::Region;
use crate::mvcc::{Record, RecordRef};

pub(crate) mod ordered;

const SLOTS: usize = 8;
const POINTER_BITS: u32 = 48;
const POINTER_MASK: u64 = (1 << POINTER_BITS) - 1;
/// A removed entry. Its pointer bits are no record's (user addresses fit in 47 bits), and
/// its tag is no key's ([`tag_of`]), so a probe that compares tags passes it by itself.
const TOMBSTONE: u64 = u64::MAX;

#[repr(C, align(64))]
struct Bucket {
    slots: [AtomicU64; SLOTS],
}
const _: () = assert!(size_of::<Bucket>() == 64);

struct Table {
    /// `mask + 1` buckets, zeroed (empty) when mapped: a huge-page region, since every
    /// lookup lands on a random bucket and TLB misses cost as much as cache misses.
    region: Region,
    mask: usize,
    /// The table a growth is filling from this one; null until it begins.
    moved_to: AtomicPtr<Table>,
    /// Buckets the growth has claimed, in order, each before it reads it.
    frontier: AtomicUsize,
    /// Slots holding [`TOMBSTONE`].
    tombstones: AtomicUsize,
}

impl Table {
    fn with_buckets(count: usize) -> Box<Table> {
        assert!(count.is_power_of_two());
        Box::new(Table {
            region: Region::new(count * size_of::<Bucket>()),
            mask: count - 1,
            moved_to: AtomicPtr::new(std::ptr::null_mut()),
            frontier: AtomicUsize::new(0),
            tombstones: AtomicUsize::new(0),
        })
    }

    #[inline]
    fn buckets(&self) -> &[Bucket] {
        // SAFETY: the region holds `mask + 1` buckets' bytes, 2 MiB-aligned, zeroed, which
        // is a valid `Bucket` (all slots empty); it lives as long as the table.
        unsafe {
            std::slice::from_raw_parts(self.region.start().as_ptr().cast::<Bucket>(), self.mask + 1)
        }
    }

    /// Starts loading the bucket `hash` probes first.
    #[inline]
    fn prefetch(&self, hash: u64) {
        crate::memory::prefetch(&self.buckets()[bucket_of(hash, self.mask)]);
    }

    fn capacity(&self) -> usize {
        (self.mask + 1) * SLOTS
    }

    // Always inlined: the commit path's lookups are its hottest code, and once the collector
    // also called it the compiler stopped inlining it there (callgrind: +5% instructions per
    // deut-write transaction).
    #[inline(always)]
    fn find(&self, key: &[u8], hash: u64) -> Option<RecordRef> {
        let tag = tag_of(hash);
        let mut b = bucket_of(hash, self.mask);
        loop {
            let bucket = &self.buckets()[b];
            for slot in &bucket.slots {
                let entry = slot.load(Ordering::Acquire);
                if entry == 0 {
                    return None;
                }
                if entry >> POINTER_BITS == tag {
                    let record = record_of(entry);
                    let r = record.get();
                    if r.key() == key {
                        return Some(record);
                    }
                }
            }
            b = (b + 1) & self.mask;
        }
    }

    /// See [`Index::candidate`]: `find`'s first bucket, tags only.
    #[inline]
    fn candidate(&self, hash: u64) -> Option<RecordRef> {
        let tag = tag_of(hash);
        for slot in &self.buckets()[bucket_of(hash, self.mask)].slots {
            let entry = slot.load(Ordering::Acquire);
            if entry == 0 {
                return None;
            }
            if entry >> POINTER_BITS == tag {
                return Some(record_of(entry));
            }
        }
        None
    }

    /// Inserts `new` unless a record with its key is present; returns the record that is in
    /// the table afterwards, and the bucket `new` went into (`None`: the key was present).
    fn insert(&self, new: RecordRef) -> (RecordRef, Option<usize>) {
        let r = new.get();
        // Records keep no hash (it would cost every key 8 bytes): hashing a short key again
        // is a few nanoseconds.
        let (key, hash) = (r.key(), r.hash());
        let tag = tag_of(hash);
        let address = new.0.as_ptr() as u64;
        assert_eq!(
            address & !POINTER_MASK,
            0,
            "record addresses must fit in 48 bits"
        );
        let entry_new = (tag << POINTER_BITS) | address;
        let mut b = bucket_of(hash, self.mask);
        loop {
            for slot in &self.buckets()[b].slots {
                let mut entry = slot.load(Ordering::Acquire);
                if entry == 0 {
                    // Sequentially consistent: see `forward`.
                    match slot.compare_exchange(0, entry_new, Ordering::SeqCst, Ordering::Acquire) {
                        Ok(_) => return (new, Some(b)),
                        Err(now) => entry = now,
                    }
                }
                if entry >> POINTER_BITS == tag {
                    let record = record_of(entry);
                    let other = record.get();
                    if other.key() == key {
                        return (record, None);
                    }
                }
            }
            b = (b + 1) & self.mask;
        }
    }

    /// Replaces `record`'s entry with a tombstone; returns whether it was there. Only the
    /// collector removes, and never during a growth.
    fn remove(&self, record: RecordRef, hash: u64) -> bool {
        let address = record.0.as_ptr() as u64;
        let mut b = bucket_of(hash, self.mask);
        loop {
            for slot in &self.buckets()[b].slots {
                let entry = slot.load(Ordering::Acquire);
                if entry == 0 {
                    return false;
                }
                if entry != TOMBSTONE && entry & POINTER_MASK == address {
                    slot.store(TOMBSTONE, Ordering::Release);
                    self.tombstones.fetch_add(1, Ordering::Relaxed);
                    return true;
                }
            }
            b = (b + 1) & self.mask;
        }
    }

    /// After `record` went into `bucket` of this table: if a growth has claimed that bucket
    /// already, and so may have read it before the record was there, puts the record in the
    /// table the growth fills too. Both sides are sequentially consistent (the growth stores
    /// the frontier, then reads the bucket; the insert wrote the bucket, then reads the
    /// frontier), so at least one sees the other's write: the record is copied, by the
    /// growth or here, and the target's insert-if-absent keeps one entry.
    fn forward(&self, bucket: usize, record: RecordRef) {
        // The frontier first: the growth stores `moved_to` before it claims any bucket.
        if self.frontier.load(Ordering::SeqCst) > bucket {
            let to = self.moved_to.load(Ordering::SeqCst);
            // SAFETY: set before the frontier moved; tables live as long as the index.
            unsafe { &*to }.insert(record);
        }
    }

    /// Copies every entry of `from` into this table, the one `from` is moving to, while
    /// inserts go on into `from`: bucket by bucket, each claimed before it is read (see
    /// [`Table::forward`]). The records a few buckets ahead are loaded early: hashing each
    /// key reads its record, a cache miss.
    fn fill_from(&self, from: &Table) {
        const AHEAD: usize = 4;
        let prefetch = |b: usize| {
            if let Some(bucket) = from.buckets().get(b) {
                for slot in &bucket.slots {
                    let entry = slot.load(Ordering::Relaxed);
                    if entry == 0 {
                        break;
                    }
                    if entry != TOMBSTONE {
                        crate::memory::prefetch(record_of(entry).0.as_ptr());
                    }
                }
            }
        };
        (0..AHEAD).for_each(prefetch);
        for (b, bucket) in from.buckets().iter().enumerate() {
            prefetch(b + AHEAD);
            from.frontier.store(b + 1, Ordering::SeqCst);
            for slot in &bucket.slots {
                // Slots fill in order and are never emptied; one filled after this read
                // is forwarded by its inserter. Tombstones stay behind.
                let entry = slot.load(Ordering::SeqCst);
                if entry == 0 {
                    break;
                }
                if entry != TOMBSTONE {
                    self.insert(record_of(entry));
                }
            }
        }
    }

    fn entries(&self) -> impl Iterator<Item = RecordRef> + '_ {
        self.buckets()
            .iter()
            .flat_map(|b| b.slots.iter())
            .filter_map(|slot| {
                let entry = slot.load(Ordering::Acquire);
                (entry != 0 && entry != TOMBSTONE).then(|| record_of(entry))
            })
    }
}

#[inline]
fn tag_of(hash: u64) -> u64 {
    // Zero tags are fine: a slot is empty only when the whole word is zero, and record
    // pointers are never null. The all-ones tag is the tombstone's: keys' tags stop one
    // short of it, which spares every probe a second comparison per slot.
    (hash >> POINTER_BITS).min((TOMBSTONE >> POINTER_BITS) - 1)
}

#[inline]
fn bucket_of(hash: u64, mask: usize) -> usize {
    hash as usize & mask
}

#[inline]
fn record_of(entry: u64) -> RecordRef {
    let ptr = (entry & POINTER_MASK) as *mut Record;
    RecordRef(NonNull::new(ptr).expect("occupied slots hold non-null pointers"))
}

/// Insert bookkeeping for the threads that share one stripe, on a cache line of its own.
#[derive(Default)]
struct Stripe {
    /// Inserts in progress (a growth waits until none is).
    active: AtomicUsize,
    /// Records inserted and not yet added to [`Index::len`].
    unflushed: AtomicUsize,
}

/// The hash index. Owns no records: the store frees them, after [`Index::close`].
///
/// Inserters touch no shared cache line but the bucket they write: each announces itself
/// and counts its records on its thread's [`Stripe`], and adds its count to the shared
/// length only every `batch` records (a sixteenth of the table over the stripes), which the
/// load-factor checks allow for. Publishing a grown table raises `publishing`, then waits
/// for every stripe to go idle (both sides use sequentially consistent accesses, so either
/// the inserter sees the flag and backs off, or the grower sees the inserter and waits):
/// an insert in progress may still be forwarding its record into the new table.
pub(crate) struct Index {
    inner: Arc<Inner>,
    /// Helper threads started for growths, joined by [`Index::close`].
    helpers: Mutex<Vec<JoinHandle<()>>>,
}

pub(crate) struct Inner {
    table: AtomicPtr<Table>,
    len: CachePadded<AtomicUsize>,
    stripes: Box<[CachePadded<Stripe>]>,
    publishing: AtomicBool,
    /// Held while a grown table is published; inserters that saw `publishing` wait on it.
    publish: Mutex<()>,
    /// Held for a whole growth: one at a time, and an insert that finds the table too full
    /// waits on it for the growth in progress.
    grow: Mutex<()>,
    /// Tables replaced by growths, for the collector to free ([`Index::take_retired`]).
    /// Boxed so that the `Table` structs readers point at never move.
    #[allow(clippy::vec_box)]
    retired: Mutex<Vec<Box<Table>>>,
    /// The first table's bucket count: a rebuild never shrinks below it.
    min_buckets: usize,
    /// The table the next growth will fill, once a helper thread has faulted it in.
    next: Mutex<Option<Box<Table>>>,
    /// A helper was started for the current table's successor.
    preparing: AtomicBool,
    /// An insert found the current table three-quarters full and woke the helpers.
    grow_asked: AtomicBool,
    /// Helpers wait here for `grow_asked` (or `closing`).
    helper_wake: Mutex<()>,
    helper_cv: Condvar,
    closing: AtomicBool,
}

impl std::ops::Deref for Index {
    type Target = Inner;

    fn deref(&self) -> &Inner {
        &self.inner
    }
}

/// Share of the table filled (counted with the stripes' slack) at which a helper grows it.
const GROW_AT: (usize, usize) = (3, 4);
/// Share of the table filled at which an insert waits for the growth (or grows it): below
/// it, probes always find an empty slot soon.
const FULL_AT: (usize, usize) = (15, 16);

/// `num / den` of `table`'s slots.
fn share(table: &Table, (num, den): (usize, usize)) -> usize {
    table.capacity() / den * num
}

impl Index {
    /// An index sized for about `capacity_hint` keys before it first grows.
    pub(crate) fn new(capacity_hint: usize) -> Index {
        let buckets = (capacity_hint.max(SLOTS) * 4 / 3 / SLOTS + 1).next_power_of_two();
        let table = Box::into_raw(Table::with_buckets(buckets));
        Index {
            inner: Arc::new(Inner {
                table: AtomicPtr::new(table),
                len: CachePadded::new(AtomicUsize::new(0)),
                stripes: (0..crate::memory::shard_count())
                    .map(|_| CachePadded::default())
                    .collect(),
                publishing: AtomicBool::new(false),
                publish: Mutex::new(()),
                grow: Mutex::new(()),
                retired: Mutex::new(Vec::new()),
                min_buckets: buckets,
                next: Mutex::new(None),
                preparing: AtomicBool::new(false),
                grow_asked: AtomicBool::new(false),
                helper_wake: Mutex::new(()),
                helper_cv: Condvar::new(),
                closing: AtomicBool::new(false),
            }),
            helpers: Mutex::new(Vec::new()),
        }
    }

    /// Inserts `new` unless its key is present. Returns the record in the index for that key
    /// and whether it is `new` (if not, the caller still owns `new`).
    pub(crate) fn insert(&self, new: RecordRef) -> (RecordRef, bool) {
        let stripe = &self.stripes[crate::memory::thread_number() % self.stripes.len()];
        loop {
            stripe.active.fetch_add(1, Ordering::SeqCst);
            if self.publishing.load(Ordering::SeqCst) {
                stripe.active.fetch_sub(1, Ordering::Release);
                drop(self.publish.lock()); // wait for the new table
                continue;
            }
            let table = self.table();
            let filled = self.filled(table);
            if filled >= share(table, FULL_AT) {
                stripe.active.fetch_sub(1, Ordering::Release);
                self.grow(table); // waits for the growth in progress, or grows it here
                continue;
            }
            if filled >= share(table, GROW_AT) && !self.grow_asked.swap(true, Ordering::Relaxed) {
                drop(self.helper_wake.lock());
                self.helper_cv.notify_all();
            }
            let (record, bucket) = table.insert(new);
            if let Some(bucket) = bucket {
                table.forward(bucket, record);
            }
            stripe.active.fetch_sub(1, Ordering::Release);
            if bucket.is_some() {
                let counted = stripe.unflushed.fetch_add(1, Ordering::Relaxed) + 1;
                if counted >= self.batch(table.capacity()) {
                    let taken = stripe.unflushed.swap(0, Ordering::Relaxed);
                    // Wrapping: the collector subtracts removals from `len` while the stripes
                    // still hold some of the insertions.
                    let len = self
                        .len
                        .fetch_add(taken, Ordering::Relaxed)
                        .wrapping_add(taken);
                    if (table.capacity() / 2..=isize::MAX as usize).contains(&len)
                        && !self.preparing.swap(true, Ordering::Relaxed)
                    {
                        self.start_helper(table);
                    }
                }
            }
            return (record, bucket.is_some());
        }
    }

    /// Starts a helper thread that maps the table `from` grows into and faults it in, then
    /// grows `from` into it once an insert finds `from` three-quarters full. If the thread
    /// cannot start, an insert that finds the table too full grows it itself.
    fn start_helper(&self, from: &Table) {
        let inner = Arc::clone(&self.inner);
        // The table is current (the caller is inserting into it), so it is not freed yet;
        // the helper reads nothing of it later but its address, until `grow` checks under
        // the growth lock that it is still current.
        let buckets = from.mask + 1;
        let grow_at = share(from, GROW_AT);
        let from = std::ptr::from_ref(from) as usize;
        let spawned = std::thread::Builder::new()
            .name("keel-index-grow".into())
            .spawn(move || {
                let current = || std::ptr::eq(inner.table(), from as *const Table);
                let table = Table::with_buckets(buckets * 2);
                table.region.populate(0, table.region.bytes());
                *inner.next.lock() = Some(table);
                let mut wake = inner.helper_wake.lock();
                loop {
                    if inner.closing.load(Ordering::Acquire) || !current() {
                        return; // closing, or grown without us
                    }
                    if inner.filled_with(buckets * SLOTS, 0) >= grow_at {
                        break;
                    }
                    // An insert notifies at the threshold; the timeout covers a notice sent
                    // between the check above and this wait.
                    inner
                        .helper_cv
                        .wait_for(&mut wake, Duration::from_millis(5));
                }
                drop(wake);
                inner.grow_if_current(from as *const Table);
            });
        if let Ok(handle) = spawned {
            let mut helpers = self.helpers.lock();
            // Finished helpers go now, so that the list stays short.
            let (done, running): (Vec<_>, Vec<_>) =
                helpers.drain(..).partition(JoinHandle::is_finished);
            *helpers = running;
            helpers.push(handle);
            drop(helpers);
            done.into_iter().for_each(|h| drop(h.join()));
        }
    }

    /// Removes the entries of `records` (the collector's, under no growth); returns how
    /// many were there. Rebuilds the table if tombstones then fill a quarter of it.
    pub(crate) fn remove_all(&self, records: &[RecordRef]) -> usize {
        // Each removal probes a random bucket, a cache miss on a large table: start loading
        // the buckets a few removals ahead (hashing a key reads its record, which the
        // collector has just taken, so it is in cache).
        const AHEAD: usize = 8;
        let hashes: Vec<u64> = records.iter().map(|r| r.get().hash()).collect();
        let grow = self.grow.lock();
        let table = self.table();
        for &hash in hashes.iter().take(AHEAD) {
            table.prefetch(hash);
        }
        let mut removed = 0;
        for (i, (record, &hash)) in records.iter().zip(&hashes).enumerate() {
            if let Some(&ahead) = hashes.get(i + AHEAD) {
                table.prefetch(ahead);
            }
            removed += usize::from(table.remove(*record, hash));
        }
        self.len.fetch_sub(removed, Ordering::Relaxed);
        drop(grow);
        if table.tombstones.load(Ordering::Relaxed) >= table.capacity() / 4 {
            self.grow(table);
        }
        removed
    }

    /// Tables that growths replaced. The caller frees them once no reader can be probing
    /// them: every transaction open now has ended.
    pub(crate) fn take_retired(&self) -> Vec<RetiredTable> {
        std::mem::take(&mut *self.retired.lock())
            .into_iter()
            .map(RetiredTable)
            .collect()
    }

    /// Stops the helper threads: they grow nothing more, and a growth in progress finishes
    /// first. The store calls this before it frees the records, which a growth reads.
    pub(crate) fn close(&self) {
        self.closing.store(true, Ordering::Release);
        drop(self.helper_wake.lock());
        self.helper_cv.notify_all();
        for helper in std::mem::take(&mut *self.helpers.lock()) {
            // A helper that panicked has nothing left to stop.
            drop(helper.join());
        }
    }
}

impl Inner {
    fn table(&self) -> &Table {
        // SAFETY: the current table is never freed; a replaced one is freed by the collector
        // only after every transaction that could have loaded it has ended.
        unsafe { &*self.table.load(Ordering::Acquire) }
    }

    /// Starts loading what a lookup of `hash` reads first, for a lookup soon after.
    #[inline]
    pub(crate) fn prefetch(&self, hash: u64) {
        self.table().prefetch(hash);
    }

    /// The record in the first tag match of `hash`'s first bucket, without comparing keys
    /// (which would wait for the record): a guess, for prefetching.
    #[inline]
    pub(crate) fn candidate(&self, hash: u64) -> Option<RecordRef> {
        self.table().candidate(hash)
    }

    #[inline(always)]
    pub(crate) fn get(&self, key: &[u8], hash: u64) -> Option<RecordRef> {
        self.table().find(key, hash)
    }

    /// Records a stripe may count before adding them to `len`, for a table of `capacity`.
    fn batch(&self, capacity: usize) -> usize {
        (capacity / 16 / self.stripes.len()).max(1)
    }

    /// Slots of `table` taken, at most: the length, the tombstones, and what the stripes
    /// may not have added to the length yet.
    fn filled(&self, table: &Table) -> usize {
        self.filled_with(table.capacity(), table.tombstones.load(Ordering::Relaxed))
    }

    fn filled_with(&self, capacity: usize, tombstones: usize) -> usize {
        self.len() + tombstones + self.batch(capacity) * self.stripes.len()
    }

    /// [`Inner::grow`] for a table known only by address, which may have been freed.
    fn grow_if_current(&self, from: *const Table) {
        let _one = self.grow.lock();
        if std::ptr::eq(self.table(), from) {
            // SAFETY: the current table is live, and under the growth lock it stays current.
            self.grow_locked(unsafe { &*from });
        }
    }

    /// Rebuilds `from` into a new table (the one a helper prepared, if it is the size
    /// wanted), unless it is no longer the current table; waits for a growth in progress
    /// first. The new table is twice the size if live entries fill a quarter of `from`,
    /// half of it if they fill under a sixteenth, else the same (tombstones are left
    /// behind). Inserts go on into `from` meanwhile, until the new table is published.
    fn grow(&self, from: &Table) {
        let _one = self.grow.lock();
        if !std::ptr::eq(self.table(), from) {
            return; // grown meanwhile
        }
        self.grow_locked(from);
    }

    fn grow_locked(&self, from: &Table) {
        let (live, capacity) = (self.len(), from.capacity());
        let buckets = if live >= capacity / 4 {
            (from.mask + 1) * 2
        } else if live < capacity / 16 && from.mask + 1 > self.min_buckets {
            (from.mask + 1) >> 1
        } else {
            from.mask + 1
        };
        let to = match self.next.lock().take() {
            Some(prepared) if prepared.mask + 1 == buckets => prepared,
            _ => Table::with_buckets(buckets),
        };
        let to = Box::into_raw(to);
        from.moved_to.store(to, Ordering::SeqCst);
        // SAFETY: from `Box::into_raw` just above; freed only with the index.
        unsafe { &*to }.fill_from(from);
        {
            let _publishing = self.publish.lock();
            self.publishing.store(true, Ordering::SeqCst);
            for stripe in &self.stripes {
                while stripe.active.load(Ordering::SeqCst) != 0 {
                    std::hint::spin_loop();
                }
            }
            self.table.store(to, Ordering::SeqCst);
            self.publishing.store(false, Ordering::SeqCst);
        }
        self.grow_asked.store(false, Ordering::Relaxed);
        self.preparing.store(false, Ordering::Relaxed);
        let from = std::ptr::from_ref(from).cast_mut();
        // SAFETY: `from` came from `Box::into_raw` and is no longer the current table.
        self.retired.lock().push(unsafe { Box::from_raw(from) });
    }

    /// Buckets of the current table.
    #[cfg(test)]
    pub(crate) fn buckets(&self) -> usize {
        self.table().mask + 1
    }

    /// Number of records (exact when no insert is in progress).
    pub(crate) fn len(&self) -> usize {
        let unflushed = self
            .stripes
            .iter()
            .map(|s| s.unflushed.load(Ordering::Relaxed))
            .fold(0, usize::wrapping_add);
        // `len` alone may have wrapped below zero (removals counted before the insertions
        // a stripe holds back); the sum may read a moment's mix, never below zero for long.
        let len = self.len.load(Ordering::Relaxed).wrapping_add(unflushed);
        if len > isize::MAX as usize { 0 } else { len }
    }

    /// Every record, for teardown and checks. Not a consistent snapshot under inserts.
    pub(crate) fn records(&self) -> impl Iterator<Item = RecordRef> + '_ {
        self.table().entries()
    }
}

/// A table a growth replaced, owned by the collector until no reader can be probing it;
/// dropping it unmaps it.
pub(crate) struct RetiredTable(#[allow(dead_code)] Box<Table>);

impl Drop for Index {
    fn drop(&mut self) {
        self.close();
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // SAFETY: the last owner (helpers are joined or gone); from `Box::into_raw`.
        drop(unsafe { Box::from_raw(*self.table.get_mut()) });
    }
}

/// The key hash used by the index: fast on short keys, well mixed in both the low bits
/// (bucket) and the high bits (tag).
#[inline]
pub(crate) fn hash(key: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut h = (key.len() as u64).wrapping_mul(K) ^ 0x243f_6a88_85a3_08d3;
    let mut chunks = key.chunks_exact(8);
    for chunk in &mut chunks {
        let word = u64::from_le_bytes(chunk.try_into().expect("chunks_exact yields 8 bytes"));
        h = (h ^ word).wrapping_mul(K).rotate_left(31);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut word = [0u8; 8];
        word[..rest.len()].copy_from_slice(rest);
        h = (h ^ u64::from_le_bytes(word))
            .wrapping_mul(K)
            .rotate_left(31);
    }
    // murmur3's finalizer
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests;

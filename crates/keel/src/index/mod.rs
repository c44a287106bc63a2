//! The point index: a purpose-built open-addressing hash table from key to record.
//!
//! Buckets are one cache line of eight slots. A slot holds a record pointer (low 48 bits)
//! and a 16-bit tag from the key's hash (high bits), so a lookup touches one bucket line and,
//! when the tag matches, the record it points at, which holds the key inline. Probing is
//! linear over buckets.
//!
//! Reads take no lock and write nothing shared. Entries are never removed (records live as
//! long as the database), so an empty slot ends a probe and there is no ABA.
//!
//! Inserts publish with one compare-and-swap. When the table is three-quarters full it grows:
//! inserts are held off (see [`Index`]) while the entries are copied into a table twice the
//! size, which is then published. That table is mapped and faulted in ahead of time, by a
//! helper thread started when the current one is half full: faulting in fresh memory is most
//! of a growth's cost (32 MiB took ~150 ms on the VMs here), and while inserts are held
//! off every writer waits for it.
//! Lookups never wait: one that still holds the old table sees every record inserted before
//! the growth began, which is all it may see. Old tables are freed when the index is dropped,
//! since a reader may still be probing one; their total size is below the final table's.

use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;
use parking_lot::Mutex;

use crate::memory::Region;
use crate::mvcc::{Record, RecordRef};

pub(crate) mod ordered;

const SLOTS: usize = 8;
const POINTER_BITS: u32 = 48;
const POINTER_MASK: u64 = (1 << POINTER_BITS) - 1;

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
}

impl Table {
    fn with_buckets(count: usize) -> Box<Table> {
        assert!(count.is_power_of_two());
        Box::new(Table {
            region: Region::new(count * size_of::<Bucket>()),
            mask: count - 1,
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

    #[inline]
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
    /// the table afterwards and whether it is `new`.
    fn insert(&self, new: RecordRef) -> (RecordRef, bool) {
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
                    match slot.compare_exchange(0, entry_new, Ordering::AcqRel, Ordering::Acquire) {
                        Ok(_) => return (new, true),
                        Err(now) => entry = now,
                    }
                }
                if entry >> POINTER_BITS == tag {
                    let record = record_of(entry);
                    let other = record.get();
                    if other.key() == key {
                        return (record, false);
                    }
                }
            }
            b = (b + 1) & self.mask;
        }
    }

    /// Fills this table, empty and not yet published, with every entry of `old` (whose
    /// inserts are held off). A record's hash lives in the record, so each entry costs a
    /// miss to read it and another for its new bucket: entries go in windows, every load of
    /// a window started before the first is used, so that the misses overlap instead of
    /// queuing. The keys in `old` are distinct, so nothing is compared.
    fn rehash_from(&self, old: &Table) {
        const WINDOW: usize = 64;
        let mut entries = old
            .buckets()
            .iter()
            .flat_map(|b| b.slots.iter())
            .map(|slot| slot.load(Ordering::Relaxed))
            .filter(|&entry| entry != 0);
        loop {
            let mut window = [0u64; WINDOW];
            let mut n = 0;
            for entry in entries.by_ref().take(WINDOW) {
                crate::memory::prefetch(record_of(entry).0.as_ptr());
                window[n] = entry;
                n += 1;
            }
            let mut hashes = [0u64; WINDOW];
            for (hash, &entry) in hashes.iter_mut().zip(&window[..n]) {
                *hash = record_of(entry).get().hash();
                self.prefetch(*hash);
            }
            for (&entry, &hash) in window[..n].iter().zip(&hashes) {
                self.place(entry, hash);
            }
            if n < WINDOW {
                return;
            }
        }
    }

    /// Puts `entry` (its tag and record; the key's hash is `hash`) in the first empty slot
    /// of its probe sequence, in a table no one else sees yet.
    fn place(&self, entry: u64, hash: u64) {
        let mut b = bucket_of(hash, self.mask);
        loop {
            for slot in &self.buckets()[b].slots {
                if slot.load(Ordering::Relaxed) == 0 {
                    slot.store(entry, Ordering::Relaxed);
                    return;
                }
            }
            b = (b + 1) & self.mask;
        }
    }

    fn entries(&self) -> impl Iterator<Item = RecordRef> + '_ {
        self.buckets()
            .iter()
            .flat_map(|b| b.slots.iter())
            .filter_map(|slot| {
                let entry = slot.load(Ordering::Acquire);
                (entry != 0).then(|| record_of(entry))
            })
    }
}

#[inline]
fn tag_of(hash: u64) -> u64 {
    // Zero tags are fine: a slot is empty only when the whole word is zero, and record
    // pointers are never null.
    hash >> POINTER_BITS
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

/// The hash index. Owns no records: the store frees them.
///
/// Inserters touch no shared cache line but the bucket they write: each announces itself
/// and counts its records on its thread's [`Stripe`], and adds its count to the shared
/// length only every `batch` records (a sixteenth of the table over the stripes), which the
/// load-factor check allows for. A growth raises `growing`, then waits for every stripe to
/// go idle (both sides use sequentially consistent accesses, so either the inserter sees
/// the flag and backs off, or the grower sees the inserter and waits).
pub(crate) struct Index {
    table: AtomicPtr<Table>,
    len: CachePadded<AtomicUsize>,
    stripes: Box<[CachePadded<Stripe>]>,
    growing: AtomicBool,
    /// Held by the grower for the whole growth; inserters that saw `growing` wait on it.
    grow: Mutex<()>,
    /// Boxed so that the `Table` structs readers point at never move.
    #[allow(clippy::vec_box)]
    retired: Mutex<Vec<Box<Table>>>,
    /// The table the next growth will fill, once a helper thread has faulted it in.
    next: Arc<Mutex<Option<Box<Table>>>>,
    /// A helper was started for the current table's successor.
    preparing: AtomicBool,
}

impl Index {
    /// An index sized for about `capacity_hint` keys before it first grows.
    pub(crate) fn new(capacity_hint: usize) -> Index {
        let buckets = (capacity_hint.max(SLOTS) * 4 / 3 / SLOTS + 1).next_power_of_two();
        let table = Box::into_raw(Table::with_buckets(buckets));
        Index {
            table: AtomicPtr::new(table),
            len: CachePadded::new(AtomicUsize::new(0)),
            stripes: (0..crate::memory::shard_count())
                .map(|_| CachePadded::default())
                .collect(),
            growing: AtomicBool::new(false),
            grow: Mutex::new(()),
            retired: Mutex::new(Vec::new()),
            next: Arc::new(Mutex::new(None)),
            preparing: AtomicBool::new(false),
        }
    }

    fn table(&self) -> &Table {
        // SAFETY: the current table is never freed while the index lives (old ones are
        // retired, not freed).
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

    #[inline]
    pub(crate) fn get(&self, key: &[u8], hash: u64) -> Option<RecordRef> {
        self.table().find(key, hash)
    }

    /// Records a stripe may count before adding them to `len`, for a table of `capacity`.
    fn batch(&self, capacity: usize) -> usize {
        (capacity / 16 / self.stripes.len()).max(1)
    }

    /// Whether `table` has room for one more record, allowing for unflushed counts.
    fn has_room(&self, table: &Table) -> bool {
        let slack = self.batch(table.capacity()) * self.stripes.len();
        self.len.load(Ordering::Relaxed) + slack < table.capacity() * 3 / 4
    }

    /// Inserts `new` unless its key is present. Returns the record in the index for that key
    /// and whether it is `new` (if not, the caller still owns `new`).
    pub(crate) fn insert(&self, new: RecordRef) -> (RecordRef, bool) {
        let stripe = &self.stripes[crate::memory::thread_number() % self.stripes.len()];
        loop {
            stripe.active.fetch_add(1, Ordering::SeqCst);
            if self.growing.load(Ordering::SeqCst) {
                stripe.active.fetch_sub(1, Ordering::Release);
                drop(self.grow.lock()); // wait for the growth to finish
                continue;
            }
            let table = self.table();
            if !self.has_room(table) {
                stripe.active.fetch_sub(1, Ordering::Release);
                self.grow_table();
                continue;
            }
            let (record, inserted) = table.insert(new);
            stripe.active.fetch_sub(1, Ordering::Release);
            if inserted {
                let counted = stripe.unflushed.fetch_add(1, Ordering::Relaxed) + 1;
                if counted >= self.batch(table.capacity()) {
                    let taken = stripe.unflushed.swap(0, Ordering::Relaxed);
                    let len = self.len.fetch_add(taken, Ordering::Relaxed) + taken;
                    if len >= table.capacity() / 2 && !self.preparing.swap(true, Ordering::Relaxed)
                    {
                        self.prepare_next((table.mask + 1) * 2);
                    }
                }
            }
            return (record, inserted);
        }
    }

    /// Starts a helper thread that maps a table of `buckets` and faults it in, for the next
    /// growth to take ([`Index::grow_table`]). If the thread cannot start, or the growth comes
    /// first, the growth maps its own.
    fn prepare_next(&self, buckets: usize) {
        let next = Arc::clone(&self.next);
        // Without the thread, the growth maps and faults in its table itself, as it would
        // if it came first.
        let _ = std::thread::Builder::new()
            .name("keel-index-grow".into())
            .spawn(move || {
                let table = Table::with_buckets(buckets);
                table.region.populate(0, table.region.bytes());
                *next.lock() = Some(table);
            });
    }

    fn grow_table(&self) {
        let _exclusive = self.grow.lock();
        let old = self.table();
        if self.has_room(old) {
            return; // another thread grew it
        }
        self.growing.store(true, Ordering::SeqCst);
        for stripe in &self.stripes {
            while stripe.active.load(Ordering::SeqCst) != 0 {
                std::hint::spin_loop();
            }
        }
        let buckets = (old.mask + 1) * 2;
        let new = match self.next.lock().take() {
            Some(prepared) if prepared.mask + 1 == buckets => prepared,
            _ => Table::with_buckets(buckets),
        };
        new.rehash_from(old);
        self.preparing.store(false, Ordering::Relaxed);
        let old = self.table.swap(Box::into_raw(new), Ordering::AcqRel);
        self.growing.store(false, Ordering::SeqCst);
        // SAFETY: `old` came from `Box::into_raw` and is no longer the current table.
        self.retired.lock().push(unsafe { Box::from_raw(old) });
    }

    /// Number of records (exact when no insert is in progress).
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
            + self
                .stripes
                .iter()
                .map(|s| s.unflushed.load(Ordering::Relaxed))
                .sum::<usize>()
    }

    /// Every record, for teardown and checks. Not a consistent snapshot under inserts.
    pub(crate) fn records(&self) -> impl Iterator<Item = RecordRef> + '_ {
        self.table().entries()
    }
}

impl Drop for Index {
    fn drop(&mut self) {
        // SAFETY: exclusive access; the pointer came from `Box::into_raw`.
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

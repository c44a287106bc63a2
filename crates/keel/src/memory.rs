//! Large memory regions for the engine's long-lived structures: the point index's bucket
//! array and the record arena.
//!
//! Both are read at random all the time, so TLB misses matter as much as cache misses: the
//! regions are mapped directly, aligned to 2 MiB and advised for transparent huge pages.
//! The arena bump-allocates; blocks the collector frees go to free lists by size, which
//! allocation takes from first, so a store that keeps creating and deleting keys reuses its
//! memory instead of growing.

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::Arc;

use std::sync::atomic::{AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;
use parking_lot::Mutex;

const HUGE_PAGE_BYTES: usize = 2 << 20;

/// A zeroed anonymous mapping, unmapped on drop; huge-page-advised unless made for
/// sequential use ([`Region::sequential`]).
pub(crate) struct Region {
    map: NonNull<u8>,
    map_bytes: usize,
    start: NonNull<u8>,
    bytes: usize,
}

// SAFETY: a region is plain memory; what lives in it decides its own thread safety.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl Region {
    /// Maps `bytes` zeroed bytes aligned to 2 MiB, advised for huge pages: for memory read at
    /// random, where TLB misses cost as much as cache misses. Aborts like the global
    /// allocator when the system is out of memory.
    pub(crate) fn new(bytes: usize) -> Region {
        Self::map(bytes, true)
    }

    /// Like [`Region::new`], but left to base pages: for memory used front to back, which
    /// huge pages do not speed up. A fresh huge page also costs more to fault in than the
    /// same bytes of base pages (on the VMs here 2-3 s/GB against 0.6 s/GB, when the guest
    /// has not used that memory before).
    pub(crate) fn sequential(bytes: usize) -> Region {
        Self::map(bytes, false)
    }

    fn map(bytes: usize, huge: bool) -> Region {
        assert!(bytes > 0);
        let map_bytes = bytes + HUGE_PAGE_BYTES;
        // SAFETY: an anonymous private mapping with no address hint has no preconditions.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if map == libc::MAP_FAILED {
            std::alloc::handle_alloc_error(
                Layout::from_size_align(bytes, HUGE_PAGE_BYTES)
                    .expect("non-zero, power-of-two alignment"),
            );
        }
        let map = NonNull::new(map.cast::<u8>()).expect("mmap succeeded");
        let offset = map.as_ptr().align_offset(HUGE_PAGE_BYTES);
        // SAFETY: `offset < HUGE_PAGE_BYTES`, so `start..start + bytes` lies inside the map.
        let start = unsafe { map.add(offset) };
        if huge {
            // SAFETY: advising a range we mapped; failure only means no huge pages, which is
            // fine.
            unsafe { libc::madvise(start.as_ptr().cast(), bytes, libc::MADV_HUGEPAGE) };
        }
        Region {
            map,
            map_bytes,
            start,
            bytes,
        }
    }

    pub(crate) fn start(&self) -> NonNull<u8> {
        self.start
    }

    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Faults in `len` bytes from `offset` as a write would, without touching them, so the
    /// next write there does not stop for page faults. A hint: pages already there are left
    /// alone, and a kernel without `MADV_POPULATE_WRITE` (before 5.14) just does nothing.
    /// Safe while other threads write the range: it changes no byte. Goes a huge page at a
    /// time: faulting in holds the process's memory-map lock, and a writer that needs it (any
    /// mmap) would otherwise wait for the whole range, and every thread that faults after
    /// that writer with it.
    pub(crate) fn populate(&self, offset: usize, len: usize) {
        assert!(offset + len <= self.bytes);
        for from in (offset..offset + len).step_by(HUGE_PAGE_BYTES) {
            // SAFETY: the range lies inside our mapping; populating changes no contents.
            unsafe {
                libc::madvise(
                    self.start.as_ptr().add(from).cast(),
                    HUGE_PAGE_BYTES.min(offset + len - from),
                    libc::MADV_POPULATE_WRITE,
                )
            };
        }
    }

    /// Gives `len` bytes from `offset` back to the kernel: they read as zero from now on, and
    /// the next write there faults them in afresh. `offset` and `len` are multiples of 4 KiB,
    /// and nobody may be reading or writing the range meanwhile.
    pub(crate) fn discard(&self, offset: usize, len: usize) {
        assert!(offset + len <= self.bytes && offset.is_multiple_of(4096));
        // SAFETY: the range lies inside our mapping and, by the caller's word, is unused.
        let rc = unsafe {
            libc::madvise(
                self.start.as_ptr().add(offset).cast(),
                len,
                libc::MADV_DONTNEED,
            )
        };
        if rc != 0 {
            // Not given back, but it must still read as zero.
            // SAFETY: as above.
            unsafe { std::ptr::write_bytes(self.start.as_ptr().add(offset), 0, len) };
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `new` mapped, once.
        unsafe { libc::munmap(self.map.as_ptr().cast(), self.map_bytes) };
    }
}

/// Free lists by block size. Every allocation looks here once blocks are free, and every free
/// does: the sizes are few small numbers, hashed by one multiplication rather than SipHash
/// (a tenth of the collector's time per removed record went to hashing sizes).
type FreeLists = std::collections::HashMap<usize, usize, std::hash::BuildHasherDefault<SizeHash>>;

/// [`FreeLists`]' hasher: Fibonacci hashing of the size, its high bits folded down (the low
/// bits of a multiple of the alignment are zero).
#[derive(Default)]
struct SizeHash(u64);

impl std::hash::Hasher for SizeHash {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(self.0.rotate_left(8) ^ u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        let h = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 29);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// Bump allocator for records: word-aligned blocks from huge-page chunks, never freed
/// one by one. Threads allocate from shards of their own (by a per-thread number), so that
/// threads creating records at once do not pass one lock's cache line back and forth.
/// Helper threads fault in the huge pages ahead of each shard's allocation
/// ([`POPULATE_AHEAD`]), so that creating a record does not wait for fresh memory.
pub(crate) struct Arena {
    shards: Box<[CachePadded<Mutex<ArenaInner>>]>,
    /// Freed blocks by size (a multiple of [`ARENA_ALIGN`]): the head of a list threaded
    /// through the blocks' first words.
    free: Mutex<FreeLists>,
    /// Blocks in `free`: allocation looks there only when there are some.
    free_blocks: CachePadded<AtomicUsize>,
    /// Every block's size is a multiple of this, so every block is aligned to it (chunks
    /// start on a page boundary).
    align: usize,
    /// Whether helper threads fault huge pages in ahead of allocation ([`POPULATE_AHEAD`]).
    populate: bool,
}

struct ArenaInner {
    next: usize,
    end: usize,
    /// Shared with the helper threads that fault pages in ahead of `next`.
    chunks: Vec<Arc<Region>>,
}

/// Huge pages of the current chunk kept faulted in ahead of the one being allocated from.
/// A fresh huge page takes milliseconds to fault in on the VMs here (see
/// [`Region::sequential`]), and the thread that first writes it waits that long: for a
/// server thread serving many clients, a stall of all of them. Whenever allocation enters a
/// new huge page, a helper thread faults in the next ones instead.
const POPULATE_AHEAD: usize = 2;

const CHUNK_BYTES: usize = 32 << 20;
/// Blocks are rounded to this: a word, what records and versions need. 16 would round the
/// record of a 20-byte key holding a counter from 88 bytes to 96. A cache line (64) would
/// keep a small record's header and key in one line, but rounds a record of a 16-byte key
/// and a 3-byte value from 75 bytes to 128: two fifths of the memory a new key touches, and
/// first-touching memory costs more here than the extra line on a read.
pub(crate) const ARENA_ALIGN: usize = 8;

/// How many per-thread shards (arena) or stripes (index) a structure keeps: one per core.
pub(crate) fn shard_count() -> usize {
    std::thread::available_parallelism()
        .map_or(2, usize::from)
        .clamp(1, 64)
}

/// A small number for this thread, given out in order of first use: threads pick shards
/// and stripes by it (modulo [`shard_count`]).
pub(crate) fn thread_number() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static NUMBER: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    NUMBER.with(|n| *n)
}

impl Arena {
    pub(crate) fn new() -> Arena {
        Arena {
            shards: (0..shard_count())
                .map(|_| {
                    CachePadded::new(Mutex::new(ArenaInner {
                        next: 0,
                        end: 0,
                        chunks: Vec::new(),
                    }))
                })
                .collect(),
            free: Mutex::new(FreeLists::default()),
            free_blocks: CachePadded::new(AtomicUsize::new(0)),
            align: ARENA_ALIGN,
            populate: true,
        }
    }

    /// An arena whose blocks are aligned to `align` (a power of two up to a page), for
    /// blocks whose sizes are multiples of it, without faulting pages in ahead: the ordered
    /// index's nodes, one per 16 to 32 keys, so a fault is rare, and a server that holds
    /// few keys should not pay the huge pages ahead. In the global allocator a 576-byte
    /// leaf takes a 640-byte block: after loading a sorted set of a million members (56 MiB
    /// of nodes), mimalloc's heap held 83-110 MiB resident with them, 18-35 MiB without.
    pub(crate) fn aligned(align: usize) -> Arena {
        assert!(align.is_power_of_two() && align <= 4096);
        Arena {
            align,
            populate: false,
            ..Arena::new()
        }
    }

    /// Allocates `layout` (alignment at most the arena's, [`ARENA_ALIGN`] unless [`Arena::aligned`], size at least a word). The
    /// memory lives until [`Arena::free`] or until the arena is dropped.
    pub(crate) fn alloc(&self, layout: Layout) -> NonNull<u8> {
        assert!(layout.align() <= self.align && layout.size() >= size_of::<usize>());
        let bytes = layout.size().next_multiple_of(self.align);
        if self.free_blocks.load(Ordering::Relaxed) > 0
            && let Some(block) = self.take_free(bytes)
        {
            return block;
        }
        let mut inner = self.shards[thread_number() % self.shards.len()].lock();
        if bytes > CHUNK_BYTES / 4 {
            // Large records get a region of their own so chunks are not wasted.
            let region = Region::new(bytes);
            let start = region.start();
            inner.chunks.push(Arc::new(region));
            return start;
        }
        if inner.next + bytes > inner.end {
            let region = Region::new(CHUNK_BYTES);
            inner.next = region.start().as_ptr() as usize;
            inner.end = inner.next + region.bytes();
            inner.chunks.push(Arc::new(region));
        }
        let at = inner.next;
        inner.next += bytes;
        // The block enters a new huge page: its last byte is on another page than the byte
        // before it (chunks start on a page boundary).
        if self.populate && (at - 1) / HUGE_PAGE_BYTES != (inner.next - 1) / HUGE_PAGE_BYTES {
            let chunk = inner.chunks.last().expect("a chunk is current");
            populate_ahead(chunk, inner.next - chunk.start().as_ptr() as usize);
        }
        NonNull::new(at as *mut u8).expect("arena addresses are non-null")
    }

    /// A freed block of exactly `bytes`, if there is one.
    fn take_free(&self, bytes: usize) -> Option<NonNull<u8>> {
        let mut free = self.free.lock();
        let head = free.get_mut(&bytes)?;
        let block = *head as *mut usize;
        // SAFETY: a freed block of ours, whose first word links the next one (0: none).
        let next = unsafe { block.read() };
        if next == 0 {
            free.remove(&bytes);
        } else {
            *head = next;
        }
        self.free_blocks.fetch_sub(1, Ordering::Relaxed);
        NonNull::new(block.cast::<u8>())
    }

    /// Gives back a block from [`Arena::alloc`] with the same `layout`. A block of a region
    /// of its own is unmapped; others go to the free list of their size.
    ///
    /// # Safety
    /// `ptr` came from this arena's `alloc(layout)`, nobody uses it any more, and it is
    /// freed once.
    pub(crate) unsafe fn free(&self, ptr: NonNull<u8>, layout: Layout) {
        let bytes = layout.size().next_multiple_of(self.align);
        if bytes > CHUNK_BYTES / 4 {
            for shard in self.shards.iter() {
                let mut inner = shard.lock();
                if let Some(i) = inner.chunks.iter().position(|c| c.start() == ptr) {
                    inner.chunks.swap_remove(i);
                    return;
                }
            }
            unreachable!("a large block has a region of its own");
        }
        let mut free = self.free.lock();
        let head = free.entry(bytes).or_insert(0);
        // SAFETY: the block is ours now and at least a word long and aligned.
        unsafe { ptr.as_ptr().cast::<usize>().write(*head) };
        *head = ptr.as_ptr() as usize;
        self.free_blocks.fetch_add(1, Ordering::Relaxed);
    }

    /// Bytes held in free lists, ready for reuse.
    #[cfg(test)]
    pub(crate) fn free_blocks(&self) -> usize {
        self.free_blocks.load(Ordering::Relaxed)
    }

    /// Bytes mapped by the arena.
    pub(crate) fn mapped_bytes(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| shard.lock().chunks.iter().map(|c| c.bytes()).sum::<usize>())
            .sum()
    }
}

/// Faults in, on a helper thread, the [`POPULATE_AHEAD`] huge pages of `chunk` after the one
/// holding `offset`. Without the thread (it could not start) the allocator faults them in
/// itself when it gets there, as it would anyway.
fn populate_ahead(chunk: &Arc<Region>, offset: usize) {
    let from = (offset / HUGE_PAGE_BYTES + 1) * HUGE_PAGE_BYTES;
    let to = (from + POPULATE_AHEAD * HUGE_PAGE_BYTES).min(chunk.bytes());
    if from >= to {
        return;
    }
    let chunk = Arc::clone(chunk);
    let _ = std::thread::Builder::new()
        .name("keel-arena-fault".into())
        .spawn(move || chunk.populate(from, to - from));
}

/// Hints the CPU to start loading the cache line at `at`; never faults.
#[inline]
pub(crate) fn prefetch<T>(at: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetching is a hint: it reads nothing architecturally and cannot fault.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(at.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the page holding `at` is in memory (faulted in).
    fn resident(at: usize) -> bool {
        let page = at & !4095;
        let mut vec = 0u8;
        // SAFETY: one page of a mapping we own; `vec` has room for its one entry.
        let rc = unsafe { libc::mincore(page as *mut libc::c_void, 4096, &mut vec) };
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        vec & 1 == 1
    }

    #[test]
    fn blocks_are_rounded_to_a_word_only() {
        let arena = Arena::new();
        // 83 bytes: 88 rounded to a word, 96 rounded to 16.
        let record = Layout::from_size_align(83, 8).expect("layout");
        let first = arena.alloc(record).as_ptr() as usize;
        let second = arena.alloc(record).as_ptr() as usize;
        assert_eq!(second - first, 88);
        assert_eq!(first % 8, 0);
    }

    #[test]
    fn freed_blocks_are_reused_by_size() {
        let arena = Arena::new();
        let small = Layout::from_size_align(40, 8).expect("layout");
        let other = Layout::from_size_align(48, 8).expect("layout");
        let a = arena.alloc(small);
        let b = arena.alloc(small);
        // SAFETY: blocks of ours, freed once.
        unsafe {
            arena.free(a, small);
            arena.free(b, small);
        }
        assert_eq!(arena.free_blocks(), 2);
        // Another size does not take them.
        let c = arena.alloc(other);
        assert!(c != a && c != b);
        let again = [arena.alloc(small), arena.alloc(small)];
        assert!(again.contains(&a) && again.contains(&b));
        assert_eq!(arena.free_blocks(), 0);
        // A block with a region of its own is unmapped.
        let large = Layout::from_size_align(CHUNK_BYTES, 8).expect("layout");
        let before = arena.mapped_bytes();
        let l = arena.alloc(large);
        assert!(arena.mapped_bytes() > before);
        // SAFETY: ours, freed once.
        unsafe { arena.free(l, large) };
        assert_eq!(arena.mapped_bytes(), before);
    }

    /// An aligned arena's blocks, fresh or reused, all keep its alignment when their sizes
    /// are multiples of it (the ordered index's leaves and inner nodes).
    #[test]
    fn an_aligned_arena_keeps_its_alignment() {
        let arena = Arena::aligned(64);
        let leaf = Layout::from_size_align(576, 64).expect("layout");
        let inner = Layout::from_size_align(896, 64).expect("layout");
        let mut blocks: Vec<_> = (0..1000)
            .map(|i| {
                let layout = if i % 3 == 0 { inner } else { leaf };
                (arena.alloc(layout), layout)
            })
            .collect();
        for &(block, layout) in blocks.iter().step_by(2) {
            // SAFETY: blocks of ours, freed once.
            unsafe { arena.free(block, layout) };
        }
        blocks = (0..1000)
            .map(|i| {
                let layout = if i % 2 == 0 { inner } else { leaf };
                (arena.alloc(layout), layout)
            })
            .collect();
        assert!(
            blocks
                .iter()
                .all(|(b, _)| (b.as_ptr() as usize).is_multiple_of(64))
        );
    }

    #[test]
    fn allocation_entering_a_huge_page_faults_in_the_next_ones() {
        if !cfg!(target_os = "linux") {
            return;
        }
        let arena = Arena::new();
        let block = Layout::from_size_align(4096, ARENA_ALIGN).expect("layout");
        let first = arena.alloc(block).as_ptr() as usize;
        let chunk = first - first % HUGE_PAGE_BYTES;
        // Nothing has written the chunk's later pages.
        let ahead = chunk + POPULATE_AHEAD * HUGE_PAGE_BYTES + 4096;
        // Into the second huge page: its successors get faulted in by a helper.
        let mut last = first;
        while last < chunk + HUGE_PAGE_BYTES {
            last = arena.alloc(block).as_ptr() as usize;
        }
        let began = std::time::Instant::now();
        while !resident(ahead) {
            assert!(
                began.elapsed() < std::time::Duration::from_secs(60),
                "the page {} huge pages on was never faulted in",
                POPULATE_AHEAD
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // Beyond the window nothing is.
        assert!(!resident(chunk + (POPULATE_AHEAD + 2) * HUGE_PAGE_BYTES));
    }
}

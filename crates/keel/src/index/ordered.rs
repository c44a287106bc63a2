//! The ordered index: an insert-only B+tree over record pointers, read without locks.
//!
//! A skip list threaded through the records (this module's first form) costs one cache
//! miss per record it passes, ~20 per insert at a million keys, and that was the largest
//! single cost of a new key in the server. A node here holds up to [`CAP`] keys, and next
//! to each key an 8-byte *head*: the key's bytes at the node's prefix offset (every key in
//! a node's range shares its first `prefix` bytes, so the heads are where keys differ).
//! Searches compare heads inside the node and touch a record only on a tie, so a search
//! costs about one miss per level, four at a million keys.
//!
//! Concurrency is optimistic lock coupling (Leis et al., "The ART of practical
//! synchronization"): every node has a version word, odd while a writer holds it. Readers
//! take no lock: they read a node, then check its version is unchanged, and start over if
//! not. Writers lock only the nodes they change. Full nodes are split on the way down, so a
//! split only ever needs the parent, which then has room.
//!
//! Removal (the collector's, one thread) takes a dead record out of its leaf, and a leaf it
//! left empty out of the tree ([`Ordered::unlink_empty`]): the parent drops it and the
//! separator beside it, a sibling's range widens over it, and its neighbours link to each
//! other. Nodes are never merged otherwise, and separators (which point at records) stay. So
//! that the rest (half-empty leaves, an empty leaf that was its parent's only child, inner
//! nodes, separators pointing at dead records) does not pile up, the collector rebuilds the
//! tree from its live records once removals since the last rebuild reach a share of the live
//! ones ([`Ordered::rebuild`]): inserts go on into the old tree meanwhile and are replayed
//! into the new one, only publishing it holds them off, and the old tree's nodes, and the
//! records removed before it, are freed after a grace period (every transaction open at the
//! swap has ended), since readers may still be in it. Unlinked leaves are freed the same way.
//!
//! Popping a queue's head (or a sorted set's maximum) empties leaves at one end, which every
//! scan from that end would cross until the next rebuild, and a rebuild copies the whole tree
//! (every key of the database): so emptied leaves go at once, but for the few an unlink must
//! leave (an only child, a leaf whose neighbours are busy). Each leaf links to both
//! neighbours, and a scan that runs off a leaf follows the link its way, checking each leaf's
//! version as a descent would, instead of descending from the root for every leaf. The links
//! change when a leaf splits, under the splitting leaf's lock: its right link and the new
//! leaf's two links, and the left link of the leaf after it, which is not locked; and when a
//! leaf is unlinked, under its lock and its left neighbour's: the left neighbour's right link
//! and the right neighbour's left link. So a left link is written only by whoever holds the
//! lock of the leaf's left neighbour, and may be read behind a split of it: a backward step
//! takes the leaf it leads to only if that leaf's right link, read at the version it checks,
//! points back (else it descends). An unlinked leaf keeps its own links, so a reader still in
//! it goes on to a neighbour, or, finding the leaf changed, descends again.
//!
//! Every node field is an atomic, so that a reader racing a writer reads stale or mixed
//! values (which its version check then rejects), never undefined ones.

use std::alloc::Layout;
use std::cmp::Ordering as Cmp;
use std::ops::Bound;
use std::ptr::{self, NonNull};
use std::sync::Arc;
use std::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence,
};

use crossbeam_utils::CachePadded;
use parking_lot::Mutex;

use crate::memory::Arena;
use crate::mvcc::{Record, RecordRef};
use crate::store::KeyRange;

/// Keys per node.
pub(crate) const CAP: usize = 32;

/// Descents one [`Ordered::sample`] tries before it gives up.
const SAMPLE_TRIES: usize = 16;

/// Byte-wise key order, compared 8 bytes at a time inline.
#[inline]
pub(crate) fn compare(a: &[u8], b: &[u8]) -> Cmp {
    let mut a_words = a.chunks_exact(8);
    let mut b_words = b.chunks_exact(8);
    for (x, y) in (&mut a_words).zip(&mut b_words) {
        let x = u64::from_be_bytes(x.try_into().expect("8 bytes"));
        let y = u64::from_be_bytes(y.try_into().expect("8 bytes"));
        if x != y {
            return x.cmp(&y);
        }
    }
    // Fewer than 8 bytes left in one of them: compare the rest zero-padded, then by length
    // (a key that is a prefix of the other sorts first).
    let done = a.len().min(b.len()) / 8 * 8;
    let (a_rest, b_rest) = (&a[done..], &b[done..]);
    head(a_rest, 0)
        .cmp(&head(b_rest, 0))
        .then(a_rest.len().cmp(&b_rest.len()))
}

/// `key`'s 8 bytes from `prefix` on, zero-padded, as a big-endian number: ordering by heads
/// agrees with ordering by key wherever heads differ (for keys sharing `prefix` bytes).
#[inline]
fn head(key: &[u8], prefix: usize) -> u64 {
    let rest = key.get(prefix..).unwrap_or_default();
    let mut bytes = [0u8; 8];
    let n = rest.len().min(8);
    bytes[..n].copy_from_slice(&rest[..n]);
    u64::from_be_bytes(bytes)
}

/// What recovery sorts records by before [`Ordered::build`]: the key's first 8 bytes as a
/// number, so that most comparisons stay in the sorted array.
pub(crate) fn sort_key(key: &[u8]) -> u64 {
    head(key, 0)
}

/// Length of the common prefix of `a` and `b`.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// In a node's prefix word: the node's range is unbounded on a side (it is on the tree's
/// first or last path), so its prefix is only what the keys it holds share, which an insert
/// may shorten ([`Node::admit`]), and a probe may lie outside it ([`Node::rank`] checks).
/// Without it those nodes had no prefix, and keys that share their first 8 bytes (every
/// member of one collection: `FF`, the type, the generation) tied on every head there, so a
/// descent compared whole keys, a record's cache miss each, at every such level.
const OPEN: u32 = 1 << 31;

/// The prefix word of a new node whose range is `[lo, hi)` (`None`: unbounded) and whose
/// keys run from `first` to `last`.
fn prefix_word(
    lo: Option<RecordRef>,
    hi: Option<RecordRef>,
    first: Option<&[u8]>,
    last: Option<&[u8]>,
) -> u32 {
    if lo.is_some() && hi.is_some() {
        return prefix_of(lo, hi);
    }
    let shared = match (first, last) {
        (Some(first), Some(last)) => common_prefix(first, last),
        _ => 0,
    };
    OPEN | u32::try_from(shared).expect("keys are bounded by KEY_BYTES_MAX")
}

/// The prefix offset for a node whose keys lie in `[lo, hi)` (`None`: unbounded).
fn prefix_of(lo: Option<RecordRef>, hi: Option<RecordRef>) -> u32 {
    match (lo, hi) {
        (Some(lo), Some(hi)) => u32::try_from(common_prefix(lo.get().key(), hi.get().key()))
            .expect("keys are bounded by KEY_BYTES_MAX"),
        _ => 0,
    }
}

/// A node: all of a leaf, and the first part of an inner node (an [`Inner`], whose
/// children follow in the same block). Leaves are most of the tree, and leaving their
/// children out makes each a third smaller (576 bytes instead of 832).
#[repr(C, align(64))]
struct Node {
    /// Even when free, odd while a writer holds the node; every change adds 2.
    version: AtomicU64,
    count: AtomicU32,
    /// Offset of the heads: the keys of this node's range share their first `prefix`
    /// bytes. Set at creation; shortened only in a leaf whose range an unlink widens
    /// ([`Ordered::unlink_empty`]), with its heads, under its lock and its parent's. With
    /// [`OPEN`]: the keys the node holds share them, and an insert may shorten it.
    prefix: AtomicU32,
    /// Null in a leaf (which is what makes it one); in an inner node, the children, which
    /// follow this node in its [`Inner`]. Fixed at creation. Reached through this pointer, which covers the whole block, rather
    /// than by casting a `&Node` to its `Inner`: a reference covers only its own type.
    children: AtomicPtr<[AtomicPtr<Node>; CAP + 1]>,
    /// A leaf's right neighbour (null in the last leaf, and in inner nodes): set when a leaf
    /// splits (under its lock) and when leaves are built, so that a forward scan goes on to
    /// the next leaf, past empty ones too, without descending from the root again.
    next: AtomicPtr<Node>,
    /// A leaf's left neighbour (null in the first leaf, and in inner nodes), for backward
    /// scans: set when leaves are built, when the leaf is made by a split, and when its left
    /// neighbour splits, under that neighbour's lock rather than this leaf's (so a reader
    /// checks that the leaf it leads to links back).
    prev: AtomicPtr<Node>,
    /// Where the last insert put its key (`u32::MAX` before any), written under the lock:
    /// inserts that keep landing just after (or just before) it are a run of ascending (or
    /// descending) keys, which [`split_point`] splits for.
    last_insert: AtomicU32,
    heads: [AtomicU64; CAP],
    /// Leaf: the records, in key order. Inner: separators; `keys[i]` is the smallest key
    /// under `children[i + 1]`.
    keys: [AtomicPtr<Record>; CAP],
}

/// A node built on a worker thread, handed back to the builder.
struct NodePtr(*mut Node);

// SAFETY: a fresh node, not shared yet: whoever holds it owns it.
unsafe impl Send for NodePtr {}

/// An inner node: the common part, then `count + 1` children.
#[repr(C, align(64))]
struct Inner {
    node: Node,
    children: [AtomicPtr<Node>; CAP + 1],
}
const _: () = assert!(size_of::<Node>() == 576 && size_of::<Inner>() == 896);

impl Node {
    fn empty(prefix: u32) -> Node {
        Node {
            version: AtomicU64::new(0),
            count: AtomicU32::new(0),
            prefix: AtomicU32::new(prefix),
            children: AtomicPtr::new(ptr::null_mut()),
            next: AtomicPtr::new(ptr::null_mut()),
            prev: AtomicPtr::new(ptr::null_mut()),
            last_insert: AtomicU32::new(u32::MAX),
            heads: std::array::from_fn(|_| AtomicU64::new(0)),
            keys: std::array::from_fn(|_| AtomicPtr::new(ptr::null_mut())),
        }
    }

    fn layout(leaf: bool) -> Layout {
        if leaf {
            Layout::new::<Node>()
        } else {
            Layout::new::<Inner>()
        }
    }

    /// A new node from `arena`: it lives until [`Node::free`] (or the arena goes).
    fn alloc(arena: &Arena, leaf: bool, prefix: u32) -> *mut Node {
        let block = arena.alloc(Node::layout(leaf)).as_ptr();
        if leaf {
            let node = block.cast::<Node>();
            // SAFETY: a fresh block of the node's size and alignment.
            unsafe { node.write(Node::empty(prefix)) };
            node
        } else {
            let inner = block.cast::<Inner>();
            // SAFETY: a fresh block of the inner node's size and alignment, never freed
            // before `Node::free`; the node's pointer to its children derives from the whole
            // block's.
            unsafe {
                inner.write(Inner {
                    node: Node::empty(prefix),
                    children: std::array::from_fn(|_| AtomicPtr::new(ptr::null_mut())),
                });
                let children = &raw mut (*inner).children;
                (*inner).node.children.store(children, Ordering::Relaxed);
                &raw mut (*inner).node
            }
        }
    }

    /// Gives a node from [`Node::alloc`] back to `arena` (not its children).
    ///
    /// # Safety
    /// Nobody can reach `node` any more, it came from `arena`, and it is freed once.
    unsafe fn free(arena: &Arena, node: *mut Node) {
        // SAFETY: the caller guarantees `node` is live and ours. An inner node was allocated
        // as the `Inner` it starts (`repr(C)`), and the tree keeps only pointers derived from
        // the whole allocation's. Nodes hold only atomics: nothing to drop.
        unsafe {
            let layout = Node::layout((*node).is_leaf());
            arena.free(NonNull::new_unchecked(node.cast::<u8>()), layout);
        }
    }

    #[inline]
    fn is_leaf(&self) -> bool {
        self.children.load(Ordering::Relaxed).is_null()
    }

    /// An inner node's children.
    #[inline]
    fn children(&self) -> &[AtomicPtr<Node>; CAP + 1] {
        let children = self.children.load(Ordering::Relaxed);
        assert!(!children.is_null(), "only inner nodes have children");
        // SAFETY: set once, before the node is shared, to the children of the `Inner` that
        // holds this node, which lives as long as the node.
        unsafe { &*children }
    }

    #[inline]
    fn prefix(&self) -> usize {
        (self.prefix.load(Ordering::Relaxed) & !OPEN) as usize
    }

    /// Whether the prefix is only what the keys here share ([`OPEN`]).
    #[inline]
    fn is_open(&self) -> bool {
        self.prefix.load(Ordering::Relaxed) & OPEN != 0
    }

    /// Before `key` joins this node (locked): if the node is [`OPEN`], shortens its prefix
    /// to what `key` shares with the keys here, and takes the heads again at it.
    fn admit(&self, key: &[u8]) {
        let word = self.prefix.load(Ordering::Relaxed);
        let prefix = (word & !OPEN) as usize;
        if word & OPEN == 0 || prefix == 0 {
            return;
        }
        let n = self.count();
        // SAFETY: a locked node's slots below its count point at live records.
        let shared = match unsafe { self.key(0).as_ref() } {
            Some(record) if n > 0 => common_prefix(key, record.key()),
            _ => key.len(),
        };
        if shared >= prefix {
            return;
        }
        self.prefix.store(
            OPEN | u32::try_from(shared).expect("keys are bounded by KEY_BYTES_MAX"),
            Ordering::Relaxed,
        );
        for at in 0..n {
            self.set_slot(at, self.key(at));
        }
    }

    #[inline]
    fn count(&self) -> usize {
        (self.count.load(Ordering::Relaxed) as usize).min(CAP)
    }

    /// The version once no writer holds the node.
    #[inline]
    fn stable_version(&self) -> u64 {
        let mut spins = 0u32;
        loop {
            let v = self.version.load(Ordering::Acquire);
            if v & 1 == 0 {
                return v;
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Whether nothing changed the node since `version` was read (and what was read from
    /// it since is consistent).
    #[inline]
    fn unchanged(&self, version: u64) -> bool {
        fence(Ordering::Acquire);
        self.version.load(Ordering::Relaxed) == version
    }

    /// Locks the node if it is still at `version`.
    fn try_lock(&self, version: u64) -> bool {
        let locked = self
            .version
            .compare_exchange(version, version + 1, Ordering::Acquire, Ordering::Relaxed)
            .is_ok();
        if locked {
            fence(Ordering::Release);
        }
        locked
    }

    fn unlock(&self) {
        self.version.fetch_add(1, Ordering::Release);
    }

    #[inline]
    fn key(&self, i: usize) -> *mut Record {
        self.keys[i].load(Ordering::Acquire)
    }

    /// Puts `record` in slot `at`, with its head at this node's prefix. The node is locked
    /// or not yet shared.
    fn set_slot(&self, at: usize, record: *mut Record) {
        // SAFETY: records handed to the index are live.
        let key = unsafe { &*record }.key();
        self.heads[at].store(head(key, self.prefix()), Ordering::Relaxed);
        self.keys[at].store(record, Ordering::Release);
    }

    /// `key` against slot `i`: heads first, the record only on a tie. A slot read while a
    /// writer moves things may be empty or stale; the caller's version check catches that.
    #[inline]
    fn compare_slot(&self, i: usize, key: &[u8], key_head: u64) -> Cmp {
        match key_head.cmp(&self.heads[i].load(Ordering::Relaxed)) {
            Cmp::Equal => {
                // SAFETY: a non-null slot points at a live record.
                match unsafe { self.key(i).as_ref() } {
                    Some(r) => compare(key, r.key()),
                    None => Cmp::Equal,
                }
            }
            other => other,
        }
    }

    /// How many of the first `n` keys are below `probe` (`inclusive`: at or below).
    #[inline]
    fn rank(&self, n: usize, probe: Probe<'_>, inclusive: bool) -> usize {
        let key = match probe {
            Probe::Key(key) => key,
            Probe::Max => return n,
        };
        // An open node's keys share its prefix, but the probe need not: below or above all
        // of them unless it shares it too. (Read racing a writer, the caller's version check
        // rejects whatever this returns.)
        let prefix = self.prefix();
        if prefix > 0
            && n > 0
            && self.is_open()
            // SAFETY: a non-null slot points at a live record.
            && let Some(record) = unsafe { self.key(0).as_ref() }
        {
            let theirs = record.key();
            let shared = &theirs[..prefix.min(theirs.len())];
            match compare(&key[..prefix.min(key.len())], shared) {
                Cmp::Less => return 0,
                Cmp::Greater => return n,
                Cmp::Equal => {}
            }
        }
        // The heads span four cache lines: start loading them all before searching.
        for line in (0..n).step_by(8) {
            crate::memory::prefetch(&self.heads[line]);
        }
        let key_head = head(key, prefix);
        let (mut lo, mut hi) = (0, n);
        while lo < hi {
            let mid = (lo + hi) / 2;
            let below = match self.compare_slot(mid, key, key_head) {
                Cmp::Greater => true,
                Cmp::Equal => inclusive,
                Cmp::Less => false,
            };
            if below {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// The child of this inner node (read at `version`) towards `probe` (see
    /// [`Ordered::leaf`] for `right`), or `None` if the node changed: start over.
    #[inline]
    fn down(&self, version: u64, probe: Probe<'_>, right: bool) -> Option<Down<'_>> {
        let n = self.count();
        let index = self.rank(n, probe, right);
        let child = self.children()[index].load(Ordering::Acquire);
        let lo = if index > 0 {
            NonNull::new(self.key(index - 1))
        } else {
            None
        };
        let hi = if index < n {
            NonNull::new(self.key(index))
        } else {
            None
        };
        // SAFETY: a non-null child pointer points at a live node (nodes are freed only with
        // the tree); a stale one is rejected by the version check below.
        let child = unsafe { child.as_ref() }?;
        let child_version = child.stable_version();
        self.unchanged(version).then(|| Down {
            child,
            version: child_version,
            index,
            lo: lo.map(RecordRef),
            hi: hi.map(RecordRef),
        })
    }

    /// Removes key `key_at` and child `child_at` of this inner node, which is locked and
    /// keeps at least one child.
    fn remove_at(&self, key_at: usize, child_at: usize) {
        let n = self.count();
        debug_assert!(n > 0 && key_at < n && child_at <= n);
        for j in key_at..n - 1 {
            self.keys[j].store(self.key(j + 1), Ordering::Release);
            self.heads[j].store(self.heads[j + 1].load(Ordering::Relaxed), Ordering::Relaxed);
        }
        self.keys[n - 1].store(ptr::null_mut(), Ordering::Release);
        let children = self.children();
        for j in child_at..n {
            let moved = children[j + 1].load(Ordering::Acquire);
            children[j].store(moved, Ordering::Release);
        }
        children[n].store(ptr::null_mut(), Ordering::Release);
        self.count.store(n as u32 - 1, Ordering::Relaxed);
    }

    /// Inserts `key` at `at` and, in an inner node, `child` after it. The node is locked and
    /// has room.
    fn insert_at(&self, at: usize, key: *mut Record, child: Option<*mut Node>) {
        // SAFETY: records handed to the index are live.
        self.admit(unsafe { &*key }.key());
        let n = self.count();
        debug_assert!(n < CAP);
        for j in (at..n).rev() {
            self.keys[j + 1].store(self.key(j), Ordering::Release);
            self.heads[j + 1].store(self.heads[j].load(Ordering::Relaxed), Ordering::Relaxed);
        }
        if let Some(child) = child {
            let children = self.children();
            for j in (at + 1..=n).rev() {
                let moved = children[j].load(Ordering::Acquire);
                children[j + 1].store(moved, Ordering::Release);
            }
            children[at + 1].store(child, Ordering::Release);
        }
        self.set_slot(at, key);
        self.count.store(n as u32 + 1, Ordering::Relaxed);
        self.last_insert.store(at as u32, Ordering::Relaxed);
    }
}

/// Where a full node of `n` keys splits for an insert at rank `at`, the last insert having
/// put its key at `last`: the first key that moves to the new right sibling (a leaf's stays
/// there as the separator; an inner node's moves up).
///
/// In the middle, unless the insert lands right after the last one (or right before it).
/// Keys that arrive in order (a sorted set's members loaded in order, a queue's pushes, a
/// log's timestamps) keep inserting at one point of a leaf, with older keys below it and
/// others (say, the next key prefix's) above. Split in the middle, the half the run leaves
/// behind is never written again, so such leaves stay half full: 36 bytes of leaf per key
/// instead of 18. So a run splits at its insert point, and the keys behind it stay where they
/// are with room only for the run (InnoDB splits sequential inserts the same way). Each side
/// keeps a key (an inner node's separator moves up, so it needs one more). A random insert
/// lands next to the last one rarely, and an uneven split then costs little: the fuller
/// side splits evenly next.
fn split_point(leaf: bool, n: usize, at: usize, last: usize) -> usize {
    debug_assert!(n >= 4, "only full nodes split");
    let run = at == last || at == last.wrapping_add(1);
    match (run, leaf) {
        (false, _) => n / 2,
        (true, true) => at.clamp(1, n - 1),
        (true, false) => at.clamp(1, n - 2),
    }
}

/// One step down from an inner node: the child, its version, which child it is, and the
/// separators around it (`None` where the child's range ends at the parent's).
struct Down<'a> {
    child: &'a Node,
    version: u64,
    index: usize,
    lo: Option<RecordRef>,
    hi: Option<RecordRef>,
}

/// Where a descent goes: towards a key, or to the right edge.
#[derive(Clone, Copy)]
enum Probe<'a> {
    Key(&'a [u8]),
    Max,
}

/// A leaf reached by a descent, with the version it was read at and its key range (or by a
/// link from a neighbour: then without its key range, `None` at both ends).
#[derive(Clone, Copy)]
struct Leaf<'a> {
    node: &'a Node,
    version: u64,
    lo: Option<RecordRef>,
    hi: Option<RecordRef>,
}

/// The leaves of the collector's last removals in one pass ([`Ordered::remove_hinted`]):
/// two, so that a pop's two records (a sorted set's member and its score entry) each find
/// theirs.
#[derive(Default)]
pub(crate) struct Hints<'a>([Option<Leaf<'a>>; 2]);

#[cfg(test)]
thread_local! {
    /// Descents from the root this thread began (tests count them, to see scans take links).
    static DESCENTS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The B+tree. Holds no records: it points at records the store owns.
pub(crate) struct Ordered {
    root: AtomicPtr<Node>,
    /// Where the nodes live, shared with the trees and nodes retired to the collector.
    nodes: Arc<Arena>,
    /// Inserts in progress, per stripe of threads: a rebuild publishes when none is.
    stripes: Box<[CachePadded<AtomicUsize>]>,
    /// Raised while a rebuild publishes its tree; inserters that see it wait on `publish`.
    publishing: AtomicBool,
    publish: Mutex<()>,
    /// A rebuild is reading the tree: inserts are also noted in `pending` for replay.
    rebuilding: AtomicBool,
    pending: Mutex<Vec<RecordRef>>,
    /// Empty leaves scans have passed (a queue's front, popped and not yet rebuilt away):
    /// the collector rebuilds sooner when scans waste much time on them.
    empty_hops: CachePadded<std::sync::atomic::AtomicU64>,
    /// Tests turn [`Ordered::unlink_empty`] off, to leave empty leaves for the rebuild.
    #[cfg(test)]
    unlink_off: AtomicBool,
}

/// What [`Ordered::remove`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Removed {
    /// The record is a separator, which must stay readable until the next rebuild.
    pub(crate) separator: bool,
    /// Its leaf is empty now: [`Ordered::unlink_empty`] may take it out.
    pub(crate) emptied: bool,
}

/// Nodes [`Ordered::unlink_empty`] took out of the tree (a leaf and the inner nodes that had
/// only it below them), owned by the collector until no reader can be in them; dropping it
/// frees them.
pub(crate) struct RetiredNodes(Vec<*mut Node>, Arc<Arena>);

// SAFETY: detached nodes, freed once, by whoever drops them.
unsafe impl Send for RetiredNodes {}

impl Drop for RetiredNodes {
    fn drop(&mut self) {
        for &node in &self.0 {
            // SAFETY: unlinked from the tree (no parent or neighbour points at them; the
            // inner ones point only at each other and the leaf, which go too), and no reader
            // is left in them (the collector's grace period). Each is freed once.
            unsafe { Node::free(&self.1, node) };
        }
    }
}

/// The nodes of a tree a rebuild replaced, owned by the collector until no reader can be
/// in them; dropping it frees them (not the records).
pub(crate) struct RetiredTree(*mut Node, Arc<Arena>);

// SAFETY: a detached tree of plain nodes, freed once, by whoever drops it.
unsafe impl Send for RetiredTree {}

impl Drop for RetiredTree {
    fn drop(&mut self) {
        // SAFETY: detached from the tree that owned it, and no reader is left in it (the
        // collector's grace period).
        unsafe { free_tree(&self.1, self.0) };
    }
}

/// Frees `root` and every node under it.
///
/// # Safety
/// Nobody can reach any of the nodes any more, and they are freed once.
unsafe fn free_tree(arena: &Arena, root: *mut Node) {
    let mut stack = vec![root];
    while let Some(node) = stack.pop() {
        // SAFETY: exclusive access, by the caller's word; every node is reachable exactly
        // once from the root.
        unsafe {
            let n = &*node;
            if !n.is_leaf() {
                let children = n.children();
                stack.extend((0..=n.count()).map(|i| children[i].load(Ordering::Relaxed)));
            }
            Node::free(arena, node);
        }
    }
}

// SAFETY: nodes are shared only through atomics and freed only in `drop` or, after a rebuild,
// by the collector after its grace period; records outlive the tree's use of them (the store
// owns both).
unsafe impl Send for Ordered {}
// SAFETY: as above.
unsafe impl Sync for Ordered {}

impl Ordered {
    pub(crate) fn new() -> Ordered {
        Ordered::with_nodes(Arc::new(Arena::aligned(align_of::<Node>())))
    }

    fn with_nodes(nodes: Arc<Arena>) -> Ordered {
        Ordered {
            root: AtomicPtr::new(Node::alloc(&nodes, true, OPEN)),
            nodes,
            stripes: (0..crate::memory::shard_count())
                .map(|_| CachePadded::new(AtomicUsize::new(0)))
                .collect(),
            publishing: AtomicBool::new(false),
            publish: Mutex::new(()),
            rebuilding: AtomicBool::new(false),
            pending: Mutex::new(Vec::new()),
            empty_hops: CachePadded::new(std::sync::atomic::AtomicU64::new(0)),
            #[cfg(test)]
            unlink_off: AtomicBool::new(false),
        }
    }

    /// Empty leaves scans have passed since the tree was made (every rebuild's tree
    /// included).
    pub(crate) fn empty_hops(&self) -> u64 {
        self.empty_hops.load(Ordering::Relaxed)
    }

    fn root(&self) -> &Node {
        // SAFETY: the root is never null, and nodes live as long as the tree.
        unsafe { &*self.root.load(Ordering::Acquire) }
    }

    /// The root and its version, once it is unlocked and still the root.
    fn start(&self) -> (&Node, u64) {
        loop {
            let root = self.root();
            let version = root.stable_version();
            if ptr::eq(root, self.root()) {
                return (root, version);
            }
        }
    }

    /// Descends to the leaf whose range holds `probe`; on a separator equal to it, to the
    /// right child (`right`), where the separator's key is, or to the left one, which holds
    /// the keys just below it.
    fn leaf(&self, probe: Probe<'_>, right: bool) -> Leaf<'_> {
        'restart: loop {
            #[cfg(test)]
            DESCENTS.with(|d| d.set(d.get() + 1));
            let (mut node, mut version) = self.start();
            let (mut lo, mut hi) = (None, None);
            while !node.is_leaf() {
                let Some(down) = node.down(version, probe, right) else {
                    continue 'restart;
                };
                lo = down.lo.or(lo);
                hi = down.hi.or(hi);
                node = down.child;
                version = down.version;
            }
            return Leaf {
                node,
                version,
                lo,
                hi,
            };
        }
    }

    /// A record drawn at random among those with keys in `lo..hi`, dead ones included, for
    /// picks that any key of the range would answer correctly: a descent that takes, in each
    /// inner node, a child drawn among those whose range meets `lo..hi`, then a slot drawn
    /// among the leaf's keys in it. `draw(n)` returns a number below `n`. Keys under a fuller
    /// or an edge subtree come up somewhat more or less often than others: random, not
    /// uniform. The leaf's slot is drawn among all it can hold and kept only if it holds a
    /// key inside the range, so that the keys of a sparse leaf, or of a leaf at an edge of
    /// the range, are not drawn more often than others; a descent that keeps none draws
    /// again, up to [`SAMPLE_TRIES`] times in all (about 1.5 descents a draw).
    /// `None` when the range holds no key (or every try failed): the caller starts from `lo`.
    pub(crate) fn sample(
        &self,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
        mut draw: impl FnMut(usize) -> usize,
    ) -> Option<RecordRef> {
        // The first child or slot that can hold a key in the range, and the last.
        let (lo_probe, lo_inclusive) = match lo {
            Bound::Included(k) => (Probe::Key(k), true),
            Bound::Excluded(k) => (Probe::Key(k), false),
            Bound::Unbounded => (Probe::Key(&[]), true),
        };
        let (hi_probe, hi_inclusive) = match hi {
            Bound::Included(k) => (Probe::Key(k), true),
            Bound::Excluded(k) => (Probe::Key(k), false),
            Bound::Unbounded => (Probe::Max, true),
        };
        'restart: for attempt in 0..SAMPLE_TRIES {
            let (mut node, mut version) = self.start();
            // Whether the node's range holds the range's start (its end): a node's keys are
            // compared with a probe only then, as a descent towards the probe would (a node
            // whose keys share a prefix compares the bytes after it); else the whole node
            // is past the start (before the end).
            let (mut holds_lo, mut holds_hi) = (true, true);
            while !node.is_leaf() {
                let n = node.count();
                // A separator is its right subtree's smallest key: a separator equal to `lo`
                // starts the first child that can hold a key in the range.
                let first = if holds_lo {
                    node.rank(n, lo_probe, true)
                } else {
                    0
                };
                let last = if holds_hi {
                    node.rank(n, hi_probe, hi_inclusive).max(first)
                } else {
                    n
                };
                // Below the node where the range's ends part (one that holds both), a node
                // holds one end at most: a child is drawn among all of its children and kept
                // only inside the range, so that an edge subtree weighs in as much as its
                // children there, not as a whole subtree (the last try keeps one whatever).
                let index = if (holds_lo && holds_hi) || attempt == SAMPLE_TRIES - 1 {
                    first + draw(last - first + 1)
                } else {
                    let index = draw(n + 1);
                    if !(first..=last).contains(&index) {
                        continue 'restart;
                    }
                    index
                };
                let child = node.children()[index].load(Ordering::Acquire);
                // SAFETY: as in `Node::down`: a non-null child points at a live node, and a
                // stale one is rejected by the version check.
                let Some(child) = (unsafe { child.as_ref() }) else {
                    continue 'restart;
                };
                let child_version = child.stable_version();
                if !node.unchanged(version) {
                    continue 'restart;
                }
                (holds_lo, holds_hi) = (holds_lo && index == first, holds_hi && index == last);
                (node, version) = (child, child_version);
            }
            let n = node.count();
            // Slots below the range, and below its end.
            let below = if holds_lo {
                node.rank(n, lo_probe, !lo_inclusive)
            } else {
                0
            };
            let within = if holds_hi {
                node.rank(n, hi_probe, hi_inclusive)
            } else {
                n
            };
            // A slot drawn among all a leaf can hold, kept if it holds a key in the range: a
            // leaf weighs in as much as the keys it holds there, not as a whole leaf (leaves
            // hold from one key to `CAP`, and the range may take a few of an edge leaf's).
            // The last try keeps a slot in the range whatever.
            let record = (below < within)
                .then(|| {
                    let slot = draw(CAP);
                    if (below..within).contains(&slot) {
                        Some(slot)
                    } else if attempt == SAMPLE_TRIES - 1 {
                        Some(below + draw(within - below))
                    } else {
                        None
                    }
                })
                .flatten()
                .map(|slot| node.key(slot));
            if !node.unchanged(version) {
                continue;
            }
            // A leaf under a child that meets the range only between its keys (the child
            // that holds `lo` may hold only keys below it) has none in it: draw again.
            if let Some(record) = record.and_then(NonNull::new) {
                return Some(RecordRef(record));
            }
        }
        None
    }

    /// Links `record` in. Its key must not be in the tree and must not be inserted by anyone
    /// else meanwhile (the point index hands out one record per key).
    pub(crate) fn insert(&self, record: RecordRef) {
        let stripe = &self.stripes[crate::memory::thread_number() % self.stripes.len()];
        loop {
            // The handshake with `rebuild`'s publication, as the point index's with a growth:
            // both sides store, then load, sequentially consistent.
            stripe.fetch_add(1, Ordering::SeqCst);
            if self.publishing.load(Ordering::SeqCst) {
                stripe.fetch_sub(1, Ordering::Release);
                drop(self.publish.lock()); // wait for the new tree
                continue;
            }
            self.insert_here(record);
            if self.rebuilding.load(Ordering::SeqCst) {
                self.pending.lock().push(record);
            }
            stripe.fetch_sub(1, Ordering::Release);
            return;
        }
    }

    /// [`Ordered::remove_hinted`] without hints.
    #[cfg(test)]
    pub(crate) fn remove(&self, record: RecordRef) -> Option<Removed> {
        self.remove_hinted(record, &mut Hints::default())
    }

    /// Takes `record` out of its leaf. Returns `None` if it was not there, else whether it
    /// is a separator (its leaf's low fence: then a separator on the path to it, since a
    /// separator is its subtree's smallest key when made), which must stay readable until
    /// the next [`Ordered::rebuild`] has replaced the tree, and whether it left its leaf
    /// empty (see [`Ordered::unlink_empty`]). Only the collector removes.
    ///
    /// It tries first the leaves `hints` remember from its last removals (unchanged since,
    /// and whose range holds the key): the collector removes runs of neighbouring keys (a
    /// queue's popped front), and each would descend from the root.
    pub(crate) fn remove_hinted<'a>(
        &'a self,
        record: RecordRef,
        hints: &mut Hints<'a>,
    ) -> Option<Removed> {
        let key = record.get().key();
        loop {
            let hinted = hints.0.iter().position(|h| {
                h.as_ref().is_some_and(|h| {
                    h.node.unchanged(h.version)
                        && h.lo.is_none_or(|lo| lo.get().key() <= key)
                        && h.hi.is_none_or(|hi| key < hi.get().key())
                })
            });
            let leaf = match hinted {
                Some(i) => hints.0[i].take().expect("found above"),
                None => self.leaf(Probe::Key(key), true),
            };
            let node = leaf.node;
            let n = node.count();
            let at = node.rank(n, Probe::Key(key), false);
            let found = at < n && ptr::eq(node.key(at), record.0.as_ptr());
            if !found {
                if node.unchanged(leaf.version) {
                    return None;
                }
                continue;
            }
            if !node.try_lock(leaf.version) {
                continue;
            }
            for j in at..n - 1 {
                node.keys[j].store(node.key(j + 1), Ordering::Release);
                node.heads[j].store(node.heads[j + 1].load(Ordering::Relaxed), Ordering::Relaxed);
            }
            node.keys[n - 1].store(ptr::null_mut(), Ordering::Release);
            node.count.store(n as u32 - 1, Ordering::Relaxed);
            node.unlock();
            let removed = Removed {
                separator: leaf.lo == Some(record),
                emptied: n == 1,
            };
            // The version our unlock left: the hint holds only while nobody changes the leaf.
            // The older hint moves to the back (of two: a swap, which costs far less than
            // the general `rotate_right`).
            hints.0.swap(0, 1);
            hints.0[0] = Some(Leaf {
                version: leaf.version + 2,
                ..leaf
            });
            return Some(removed);
        }
    }

    /// Takes the empty leaf whose range holds `key` out of the tree, if it still is empty,
    /// with the inner nodes above it that have it as their only descendant: their nearest
    /// ancestor with more children drops the topmost of them and the separator beside it, a
    /// sibling's range widens over theirs, and the leaf's neighbours link to each other.
    /// Returns the nodes, which readers may still be in, to be freed after the collector's
    /// grace period.
    ///
    /// Without this, the empty leaves a queue's pops leave at its front stay until the
    /// next [`Ordered::rebuild`], and every pop passes all of them; and a rebuild copies the
    /// whole tree, every key of the database, so pops that trigger one every few thousand
    /// pops keep the collector rebuilding instead of collecting.
    ///
    /// The sibling's range widens, and with it the ranges of the nodes down its edge next to
    /// the dropped subtree: each of their prefixes (the bytes every key of a node's range
    /// shares) must hold for the wider range, and one that is too long is shortened and the
    /// node's heads taken again. The first leaf (no left neighbour) stays, as does a leaf
    /// whose surroundings are busy: the next rebuild takes those. Only the collector calls this, as it removes, never while it rebuilds. It locks
    /// the ancestor, the dropped nodes, the sibling's edge (so that a split there restarts
    /// with the new fences), and the leaf's left neighbour (whose right link it changes, and
    /// which owns the right neighbour's left link), each only if unchanged since read, so
    /// it never waits for anyone.
    pub(crate) fn unlink_empty(&self, key: &[u8]) -> Option<RetiredNodes> {
        #[cfg(test)]
        if self.unlink_off.load(Ordering::Relaxed) {
            return None;
        }
        'retry: for _ in 0..4 {
            // The inner nodes from the root: each, its version, which child the path takes,
            // and its fences.
            let mut path = Vec::with_capacity(8);
            let (mut node, mut version) = self.start();
            let (mut lo, mut hi) = (None, None);
            while !node.is_leaf() {
                let Some(down) = node.down(version, Probe::Key(key), true) else {
                    continue 'retry;
                };
                path.push((node, version, down.index, lo, hi));
                lo = down.lo.or(lo);
                hi = down.hi.or(hi);
                node = down.child;
                version = down.version;
            }
            let (leaf, leaf_version) = (node, version);
            let prev = leaf.prev.load(Ordering::Acquire);
            if leaf.count() != 0 || prev.is_null() || !leaf.unchanged(leaf_version) {
                return None;
            }
            // SAFETY: a non-null link points at a leaf of this tree, and nodes are freed only
            // with their tree or, once unlinked, after every reader has left.
            let left = unsafe { &*prev };
            // The nearest ancestor with more than one child; the nodes below it on the path
            // have one each, and go with the leaf.
            let g = path.iter().rposition(|&(n, ..)| n.count() > 0)?;
            let (ancestor, ancestor_version, i, a_lo, a_hi) = path[g];
            let n = ancestor.count();
            // Separators by position, the ancestor's fences at the ends.
            let fence = |at: isize| -> Option<RecordRef> {
                if at < 0 {
                    a_lo
                } else if at as usize >= n {
                    a_hi
                } else {
                    NonNull::new(ancestor.key(at as usize)).map(RecordRef)
                }
            };
            let i = i as isize;
            // The left sibling takes the range (its range ends where the dropped one did),
            // else the right one (its range starts where the dropped one did).
            let (sibling_at, separator_at, widens_right) = if i > 0 {
                (i - 1, i - 1, true)
            } else {
                (i + 1, i, false)
            };
            let new_fence = if widens_right { fence(i) } else { fence(i - 1) };
            if !ancestor.try_lock(ancestor_version) {
                continue;
            }
            let mut locked: Vec<&Node> = vec![ancestor];
            let unlock = |locked: &[&Node]| {
                for node in locked.iter().rev() {
                    node.unlock();
                }
            };
            // The dropped nodes, then the leaf's left neighbour.
            for &(node, version, ..) in &path[g + 1..] {
                if !node.try_lock(version) {
                    unlock(&locked);
                    continue 'retry;
                }
                locked.push(node);
            }
            if !leaf.try_lock(leaf_version) {
                unlock(&locked);
                continue;
            }
            locked.push(leaf);
            let left_version = left.version.load(Ordering::Acquire);
            if left_version & 1 == 1 || !left.try_lock(left_version) {
                unlock(&locked);
                continue;
            }
            locked.push(left);
            if !ptr::eq(left.next.load(Ordering::Acquire), leaf) {
                unlock(&locked);
                continue;
            }
            // The sibling's edge next to the dropped range, each node with the fence on its
            // other side, locked (the left neighbour is the left sibling's last leaf).
            let mut edge: Vec<(&Node, Option<RecordRef>)> = Vec::with_capacity(8);
            let children = ancestor.children();
            let mut at = children[sibling_at as usize].load(Ordering::Acquire);
            let mut other = if widens_right {
                fence(sibling_at - 1)
            } else {
                fence(sibling_at)
            };
            loop {
                // SAFETY: a child read under its parent's lock is a live node of this tree.
                let Some(node) = (unsafe { at.as_ref() }) else {
                    unlock(&locked);
                    continue 'retry;
                };
                if !ptr::eq(node, left) {
                    let v = node.version.load(Ordering::Acquire);
                    if v & 1 == 1 || !node.try_lock(v) {
                        unlock(&locked);
                        continue 'retry;
                    }
                    locked.push(node);
                }
                edge.push((node, other));
                if node.is_leaf() {
                    break;
                }
                let c = node.count();
                if widens_right {
                    if c > 0 {
                        other = NonNull::new(node.key(c - 1)).map(RecordRef);
                    }
                    at = node.children()[c].load(Ordering::Acquire);
                } else {
                    if c > 0 {
                        other = NonNull::new(node.key(0)).map(RecordRef);
                    }
                    at = node.children()[0].load(Ordering::Acquire);
                }
            }
            // Each edge node's range now reaches the new fence: a prefix too long for it is
            // shortened, and the heads taken again at it.
            for &(node, other) in &edge {
                let prefix = if widens_right {
                    prefix_of(other, new_fence)
                } else {
                    prefix_of(new_fence, other)
                };
                if node.prefix() as u32 > prefix {
                    let open = node.prefix.load(Ordering::Relaxed) & OPEN;
                    node.prefix.store(open | prefix, Ordering::Relaxed);
                    for at in 0..node.count() {
                        node.set_slot(at, node.key(at));
                    }
                }
            }
            ancestor.remove_at(separator_at as usize, i as usize);
            let right = leaf.next.load(Ordering::Acquire);
            left.next.store(right, Ordering::Release);
            // SAFETY: as for `left`.
            if let Some(right) = unsafe { right.as_ref() } {
                right.prev.store(prev, Ordering::Release);
            }
            unlock(&locked);
            let dropped = path[g + 1..]
                .iter()
                .map(|&(node, ..)| node)
                .chain([leaf])
                .map(|node| ptr::from_ref(node).cast_mut())
                .collect();
            return Some(RetiredNodes(dropped, Arc::clone(&self.nodes)));
        }
        None
    }

    /// Whether `record` is in the tree.
    fn contains(&self, record: RecordRef) -> bool {
        self.seek(true, Bound::Included(record.get().key()))
            .is_some_and(|at| at.record == record)
    }

    /// Replaces the tree with one built from its records, so that empty leaves and
    /// separators of removed records go (the collector's, which removes nothing meanwhile).
    /// Inserts go on into the old tree while its records are read and the new one is
    /// built, and are replayed into the new one; publishing it holds them off only while
    /// the last of them are replayed. Returns the old tree, which readers may still be in.
    pub(crate) fn rebuild(&self) -> RetiredTree {
        self.rebuilding.store(true, Ordering::SeqCst);
        let all = KeyRange {
            lo: Bound::Unbounded,
            hi: Bound::Unbounded,
        };
        let live: Vec<RecordRef> = self.range(all).collect();
        let mut fresh = Ordered::with_nodes(Arc::clone(&self.nodes));
        fresh.build_sorted(vec![live]);
        let replay = |fresh: &Ordered, pending: Vec<RecordRef>| {
            for record in pending {
                if !fresh.contains(record) {
                    fresh.insert_here(record);
                }
            }
        };
        replay(&fresh, std::mem::take(&mut *self.pending.lock()));
        let old = {
            let _publishing = self.publish.lock();
            self.publishing.store(true, Ordering::SeqCst);
            for stripe in self.stripes.iter() {
                while stripe.load(Ordering::SeqCst) != 0 {
                    std::hint::spin_loop();
                }
            }
            replay(&fresh, std::mem::take(&mut *self.pending.lock()));
            let placeholder = Node::alloc(&self.nodes, true, 0);
            let new_root = fresh.root.swap(placeholder, Ordering::Relaxed);
            let old = self.root.swap(new_root, Ordering::SeqCst);
            self.rebuilding.store(false, Ordering::SeqCst);
            self.publishing.store(false, Ordering::SeqCst);
            old
        };
        RetiredTree(old, Arc::clone(&self.nodes))
    }

    /// Leaves emptied from now on stay until a rebuild (`false`), as before unlinking.
    #[cfg(test)]
    pub(crate) fn set_unlink(&self, on: bool) {
        self.unlink_off.store(!on, Ordering::Relaxed);
    }

    /// Nodes in the tree (a count for tests and statistics; not a snapshot under writers).
    #[cfg(test)]
    pub(crate) fn nodes(&self) -> usize {
        let mut stack = vec![self.root()];
        let mut count = 0;
        while let Some(node) = stack.pop() {
            count += 1;
            if !node.is_leaf() {
                for child in &node.children()[..=node.count()] {
                    // SAFETY: nodes live while the tree does (tests only, no rebuild).
                    stack.push(unsafe { &*child.load(Ordering::Acquire) });
                }
            }
        }
        count
    }

    fn insert_here(&self, record: RecordRef) {
        let key = record.get().key();
        'restart: loop {
            let (mut node, mut version) = self.start();
            // The parent, its version, and which child `node` is.
            let mut parent: Option<(&Node, u64, usize)> = None;
            let mut hi = None;
            loop {
                let n = node.count();
                if n == CAP {
                    // Split on the way down, so that the parent (unchanged since we passed
                    // it, or the locks fail) has room for the separator.
                    if let Some((p, pv, _)) = parent
                        && !p.try_lock(pv)
                    {
                        continue 'restart;
                    }
                    if !node.try_lock(version) {
                        if let Some((p, ..)) = parent {
                            p.unlock();
                        }
                        continue 'restart;
                    }
                    if parent.is_none() && !ptr::eq(node, self.root()) {
                        node.unlock();
                        continue 'restart;
                    }
                    self.split(node, parent.map(|(p, _, i)| (p, i)), hi, key);
                    node.unlock();
                    if let Some((p, ..)) = parent {
                        p.unlock();
                    }
                    continue 'restart;
                }
                if node.is_leaf() {
                    let at = node.rank(n, Probe::Key(key), false);
                    if !node.try_lock(version) {
                        continue 'restart;
                    }
                    debug_assert!(
                        at == n
                            // SAFETY: slots below the count point at live records.
                            || compare(unsafe { &*node.key(at) }.key(), key).is_ne(),
                        "a key was inserted twice"
                    );
                    node.insert_at(at, record.0.as_ptr(), None);
                    node.unlock();
                    return;
                }
                let Some(down) = node.down(version, Probe::Key(key), true) else {
                    continue 'restart;
                };
                hi = down.hi.or(hi);
                parent = Some((node, version, down.index));
                node = down.child;
                version = down.version;
            }
        }
    }

    /// Splits the full, locked `node` (child `index` of the locked `parent`, or the root)
    /// whose range ends at `hi`, for an insert of `key`: the keys from [`split_point`] on
    /// move to a new right sibling.
    fn split(
        &self,
        node: &Node,
        parent: Option<(&Node, usize)>,
        hi: Option<RecordRef>,
        key: &[u8],
    ) {
        let n = node.count();
        let at = node.rank(n, Probe::Key(key), false);
        let mid = split_point(
            node.is_leaf(),
            n,
            at,
            node.last_insert.load(Ordering::Relaxed) as usize,
        );
        let separator = node.key(mid);
        let sep = RecordRef(NonNull::new(separator).expect("a full node's keys are set"));
        let leaf = node.is_leaf();
        // A leaf's separator stays in the right leaf; an inner node's moves up.
        let first = if leaf { mid } else { mid + 1 };
        // SAFETY: a locked node's slots below its count point at live records.
        let key_at = |i: usize| unsafe { &*node.key(i) }.key();
        let word = prefix_word(
            Some(sep),
            hi,
            (first < n).then(|| key_at(first)),
            (first < n).then(|| key_at(n - 1)),
        );
        let right_ptr = Node::alloc(&self.nodes, leaf, word);
        // SAFETY: fresh and live; nodes are freed only with the tree.
        let right = unsafe { &*right_ptr };
        for (to, from) in (first..n).enumerate() {
            right.set_slot(to, node.key(from));
        }
        if !leaf {
            let (from_children, to_children) = (node.children(), right.children());
            for (to, from) in (first..=n).enumerate() {
                let child = from_children[from].load(Ordering::Acquire);
                to_children[to].store(child, Ordering::Relaxed);
            }
        }
        right.count.store((n - first) as u32, Ordering::Relaxed);
        if leaf {
            // The new leaf goes between `node` and its right neighbour. It is complete before
            // either link to it is stored (readers may follow them at once), and reachable
            // from the parent only after both, so whoever splits it next (and so writes the
            // neighbour's left link again) does so after this.
            let next = node.next.load(Ordering::Acquire);
            right.next.store(next, Ordering::Relaxed);
            right
                .prev
                .store(ptr::from_ref(node).cast_mut(), Ordering::Relaxed);
            // SAFETY: a non-null link points at a leaf of this tree, and nodes are freed only
            // with the tree.
            if let Some(next) = unsafe { next.as_ref() } {
                next.prev.store(right_ptr, Ordering::Release);
            }
            node.next.store(right_ptr, Ordering::Release);
        }
        let right = right_ptr;
        node.count.store(mid as u32, Ordering::Relaxed);
        match parent {
            Some((parent, index)) => parent.insert_at(index, separator, Some(right)),
            None => {
                // SAFETY: records handed to the index are live.
                let only = unsafe { &*separator }.key();
                let word = prefix_word(None, None, Some(only), Some(only));
                let root_ptr = Node::alloc(&self.nodes, false, word);
                // SAFETY: fresh and live; nodes are freed only with the tree.
                let root = unsafe { &*root_ptr };
                root.set_slot(0, separator);
                // The tree's own pointer to the old root (the caller checked it is `node`),
                // which, unlike one made from `&Node`, covers an inner node's children too.
                let old_root = self.root.load(Ordering::Acquire);
                debug_assert!(ptr::eq(old_root, node));
                let children = root.children();
                children[0].store(old_root, Ordering::Relaxed);
                children[1].store(right, Ordering::Relaxed);
                root.count.store(1, Ordering::Relaxed);
                self.root.store(root_ptr, Ordering::Release);
            }
        }
    }

    /// The first record at or after `bound` (`forward`) or the last at or before it, with
    /// where it is; an excluded bound's own key does not count.
    fn seek(&self, forward: bool, bound: Bound<&[u8]>) -> Option<Cursor<'_>> {
        let (mut probe, mut inclusive) = match bound {
            Bound::Included(key) => (Probe::Key(key), true),
            Bound::Excluded(key) => (Probe::Key(key), false),
            Bound::Unbounded if forward => (Probe::Key(&[]), true),
            Bound::Unbounded => (Probe::Max, true),
        };
        loop {
            // Backwards from an excluded key equal to a separator, the leaf left of it.
            let leaf = self.leaf(probe, forward || inclusive);
            let node = leaf.node;
            let n = node.count();
            // The candidate slot; `n` or more (wrapped below zero) when the leaf has none.
            let at = if forward {
                node.rank(n, probe, !inclusive)
            } else {
                node.rank(n, probe, inclusive).wrapping_sub(1)
            };
            let found = (at < n).then(|| node.key(at));
            if !node.unchanged(leaf.version) {
                continue;
            }
            match found.and_then(NonNull::new) {
                Some(record) => {
                    return Some(Cursor {
                        leaf,
                        at,
                        record: RecordRef(record),
                    });
                }
                // Nothing more in this leaf that way: follow the leaves' links; if a leaf
                // on the way changed, go on from the neighbouring leaf's edge (a leaf's high
                // fence is the next leaf's first key).
                None => {
                    if let Some(found) = self.hop(forward, leaf) {
                        return found;
                    }
                    let edge = if forward { leaf.hi } else { leaf.lo }?;
                    probe = Probe::Key(edge.get().key());
                    inclusive = forward;
                }
            }
        }
    }

    /// The next record past `leaf` (read at its version) in the leaves right of it
    /// (`forward`) or left of it, by their links: see [`Ordered::hop_right`] and
    /// [`Ordered::hop_left`].
    #[inline]
    fn hop<'a>(&'a self, forward: bool, leaf: Leaf<'a>) -> Option<Option<Cursor<'a>>> {
        if forward {
            self.hop_right(leaf)
        } else {
            self.hop_left(leaf)
        }
    }

    /// The first record in the leaves right of `leaf` (read at its version), reached by
    /// following their links past empty ones: `Some(None)` at the tree's end, `None` if a
    /// leaf on the way changed (then the caller descends from the root instead). Every key
    /// there is above `leaf`'s range.
    fn hop_right<'a>(&'a self, leaf: Leaf<'a>) -> Option<Option<Cursor<'a>>> {
        let (mut node, mut version) = (leaf.node, leaf.version);
        loop {
            let next = node.next.load(Ordering::Acquire);
            if !node.unchanged(version) {
                return None;
            }
            // SAFETY: a non-null link points at a leaf of this tree, and nodes are freed
            // only with their tree (after every reader in it has left).
            let Some(next) = (unsafe { next.as_ref() }) else {
                return Some(None);
            };
            let next_version = next.stable_version();
            let first = (next.count() > 0).then(|| next.key(0));
            if !next.unchanged(next_version) {
                return None;
            }
            if let Some(record) = first.and_then(NonNull::new) {
                return Some(Some(Cursor {
                    // Reached by a link: its fences are not known (nothing after a seek
                    // uses them).
                    leaf: Leaf {
                        node: next,
                        version: next_version,
                        lo: None,
                        hi: None,
                    },
                    at: 0,
                    record: RecordRef(record),
                }));
            }
            self.empty_hops.fetch_add(1, Ordering::Relaxed);
            node = next;
            version = next_version;
        }
    }

    /// The last record in the leaves left of `leaf` (read at its version), reached by
    /// following their left links past empty ones: `Some(None)` at the tree's start, `None`
    /// if a leaf on the way changed or a link was read behind a split (then the caller
    /// descends from the root instead). Every key there is below `leaf`'s range.
    ///
    /// A leaf's left link is not written under its own lock, so the leaf it leads to is
    /// taken only if its right link, read at the version checked, points back: then at that
    /// version the two are neighbours, and the left one holds every key between the start
    /// of its range and the start of `node`'s (a leaf's low fence never moves), as a descent
    /// to it would have found.
    fn hop_left<'a>(&'a self, leaf: Leaf<'a>) -> Option<Option<Cursor<'a>>> {
        let (mut node, mut version) = (leaf.node, leaf.version);
        loop {
            let prev = node.prev.load(Ordering::Acquire);
            // Not for the link (checked below), but for what the caller read of the leaf:
            // nothing before its cursor, since the leaf is as it was.
            if !node.unchanged(version) {
                return None;
            }
            // SAFETY: a non-null link points at a leaf of this tree, and nodes are freed
            // only with their tree (after every reader in it has left). The first leaf
            // stays first (leaves split to the right), and only it has no left link.
            let Some(prev) = (unsafe { prev.as_ref() }) else {
                return Some(None);
            };
            let prev_version = prev.stable_version();
            let back = prev.next.load(Ordering::Acquire);
            let at = prev.count().checked_sub(1);
            let last = at.map(|at| prev.key(at));
            if !prev.unchanged(prev_version) || !ptr::eq(back, node) {
                return None;
            }
            if let (Some(at), Some(record)) = (at, last.and_then(NonNull::new)) {
                return Some(Some(Cursor {
                    // Reached by a link: its fences are not known (nothing after a seek
                    // uses them).
                    leaf: Leaf {
                        node: prev,
                        version: prev_version,
                        lo: None,
                        hi: None,
                    },
                    at,
                    record: RecordRef(record),
                }));
            }
            self.empty_hops.fetch_add(1, Ordering::Relaxed);
            node = prev;
            version = prev_version;
        }
    }

    /// Makes an empty tree of `runs` (recovery): distinct records in any order, each with its
    /// [`sort_key`]. Each run is sorted on a thread of its own; then each thread merges one
    /// key range of all runs, splitting at quantiles of the longest run, and the tree is
    /// built from those stretches.
    pub(crate) fn build(&mut self, mut runs: Vec<Vec<(u64, RecordRef)>>) {
        type Entry = (u64, RecordRef);
        fn order(a: &Entry, b: &Entry) -> Cmp {
            a.0.cmp(&b.0)
                .then_with(|| compare(a.1.get().key(), b.1.get().key()))
        }
        runs.retain(|run| !run.is_empty());
        let threads = runs.len().max(1);
        std::thread::scope(|s| {
            for run in &mut runs {
                s.spawn(move || run.sort_unstable_by(order));
            }
        });
        // In each run, a key range starts at the first entry not below its splitter.
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
                .map(|w| w.join().expect("merging thread"))
                .collect()
        });
        self.build_sorted(stretches);
    }

    /// Makes an empty tree of `stretches`, which are sorted, distinct and follow each other
    /// in key order. Each stretch's leaves are built on a thread of their own.
    fn build_sorted(&mut self, stretches: Vec<Vec<RecordRef>>) {
        let stretches: Vec<Vec<RecordRef>> =
            stretches.into_iter().filter(|s| !s.is_empty()).collect();
        let root = self.root.get_mut();
        // SAFETY: exclusive access; the root is a live node.
        assert_eq!(
            unsafe { &**root }.count(),
            0,
            "a build starts from an empty tree"
        );
        if stretches.is_empty() {
            return;
        }
        // Each leaf's range ends where the next leaf starts; the last one is unbounded.
        let nodes = &*self.nodes;
        let leaves: Vec<(NodePtr, RecordRef)> = std::thread::scope(|s| {
            let workers: Vec<_> = stretches
                .iter()
                .enumerate()
                .map(|(i, stretch)| {
                    let next = stretches.get(i + 1).map(|n| n[0]);
                    let first = i == 0;
                    s.spawn(move || {
                        let mut leaves = Vec::with_capacity(stretch.len() / CAP + 1);
                        let chunks: Vec<&[RecordRef]> = stretch.chunks(CAP).collect();
                        for (c, chunk) in chunks.iter().enumerate() {
                            // Records are in key order, which is random in memory: load the
                            // next leaf's while this one is built.
                            for ahead in chunks.get(c + 1).into_iter().flat_map(|n| n.iter()) {
                                crate::memory::prefetch(ahead.0.as_ptr());
                            }
                            let lo = (!(first && c == 0)).then_some(chunk[0]);
                            let hi = chunks.get(c + 1).map(|n| n[0]).or(next);
                            let word = prefix_word(
                                lo,
                                hi,
                                chunk.first().map(|r| r.get().key()),
                                chunk.last().map(|r| r.get().key()),
                            );
                            let leaf_ptr = Node::alloc(nodes, true, word);
                            // SAFETY: fresh, not shared yet.
                            let leaf = unsafe { &*leaf_ptr };
                            for (j, record) in chunk.iter().enumerate() {
                                leaf.set_slot(j, record.0.as_ptr());
                            }
                            leaf.count.store(chunk.len() as u32, Ordering::Relaxed);
                            leaves.push((NodePtr(leaf_ptr), chunk[0]));
                        }
                        leaves
                    })
                })
                .collect();
            workers
                .into_iter()
                .flat_map(|w| w.join().expect("building leaves"))
                .collect()
        });
        let mut level: Vec<(*mut Node, RecordRef)> = leaves
            .into_iter()
            .map(|(leaf, first)| (leaf.0, first))
            .collect();
        for pair in level.windows(2) {
            // SAFETY: fresh leaves, not shared yet; freed only with the tree.
            let (left, right) = unsafe { (&*pair[0].0, &*pair[1].0) };
            left.next.store(pair[1].0, Ordering::Relaxed);
            right.prev.store(pair[0].0, Ordering::Relaxed);
        }
        while level.len() > 1 {
            let groups: Vec<&[(*mut Node, RecordRef)]> = level.chunks(CAP + 1).collect();
            let mut up = Vec::with_capacity(groups.len());
            for (g, group) in groups.iter().enumerate() {
                let lo = (g > 0).then_some(group[0].1);
                let hi = groups.get(g + 1).map(|n| n[0].1);
                let word = prefix_word(
                    lo,
                    hi,
                    group.get(1).map(|(_, first)| first.get().key()),
                    group.last().map(|(_, first)| first.get().key()),
                );
                let inner_ptr = Node::alloc(nodes, false, word);
                // SAFETY: fresh and live; nodes are freed only with the tree.
                let inner = unsafe { &*inner_ptr };
                for (j, (child, first)) in group.iter().enumerate() {
                    inner.children()[j].store(*child, Ordering::Relaxed);
                    if j > 0 {
                        inner.set_slot(j - 1, first.0.as_ptr());
                    }
                }
                inner
                    .count
                    .store((group.len() - 1) as u32, Ordering::Relaxed);
                up.push((inner_ptr, group[0].1));
            }
            level = up;
        }
        // SAFETY: the empty root is a node nobody else can reach.
        unsafe { Node::free(nodes, *root) };
        *root = level[0].0;
    }

    /// Records whose keys fall in `range`, in key order (either end).
    pub(crate) fn range(&self, range: KeyRange) -> Range<'_> {
        self.range_of(std::borrow::Cow::Owned(range))
    }

    /// [`Ordered::range`] over bounds the caller keeps (a commit's validation of the ranges
    /// it read): nothing is copied.
    pub(crate) fn range_within<'a>(&'a self, range: &'a KeyRange) -> Range<'a> {
        self.range_of(std::borrow::Cow::Borrowed(range))
    }

    fn range_of<'a>(&'a self, range: std::borrow::Cow<'a, KeyRange>) -> Range<'a> {
        Range {
            list: self,
            range,
            front: None,
            back: None,
            inside: [None, None],
            done: false,
        }
    }
}

impl Drop for Ordered {
    fn drop(&mut self) {
        // SAFETY: exclusive access.
        unsafe { free_tree(&self.nodes, *self.root.get_mut()) };
    }
}

/// A record found in a leaf, and where, so that the next step can stay in the leaf.
#[derive(Clone, Copy)]
struct Cursor<'a> {
    leaf: Leaf<'a>,
    at: usize,
    record: RecordRef,
}

impl<'a> Cursor<'a> {
    /// The next (or previous) record in the same leaf, if the leaf has not changed.
    fn step(&self, forward: bool) -> Option<Cursor<'a>> {
        let node = self.leaf.node;
        let n = node.count();
        let at = if forward {
            (self.at + 1 < n).then_some(self.at + 1)?
        } else {
            self.at.checked_sub(1)?
        };
        let record = NonNull::new(node.key(at));
        // A scan reads each record it passes (its key, its newest version): start loading
        // the one a few places on, so that a run of records, live or deleted, costs
        // overlapping cache misses rather than one after another. A hint: a stale pointer
        // read from a changing leaf is never dereferenced.
        let ahead = if forward {
            at + SCAN_PREFETCH_AHEAD
        } else {
            at.wrapping_sub(SCAN_PREFETCH_AHEAD)
        };
        if ahead < n {
            crate::memory::prefetch(node.key(ahead));
        }
        if !node.unchanged(self.leaf.version) {
            return None;
        }
        Some(Cursor {
            leaf: self.leaf,
            at,
            record: RecordRef(record?),
        })
    }
}

/// How many records ahead of a scan's position [`Cursor::step`] prefetches.
const SCAN_PREFETCH_AHEAD: usize = 4;

/// Iterator over a key range of [`Ordered`]. Records inserted while it runs may or may not
/// be seen; the two ends never pass each other.
pub(crate) struct Range<'a> {
    list: &'a Ordered,
    range: std::borrow::Cow<'a, KeyRange>,
    /// Where each end is: the last record returned from it.
    front: Option<Cursor<'a>>,
    back: Option<Cursor<'a>>,
    /// For each direction (backward, forward): a leaf, and the version it was read at, whose
    /// every key is short of the range's end that way. Steps inside it then compare no key
    /// with the bound: a queue's or a sorted set's front of deleted keys, which pops and
    /// their validations pass, cost a key comparison each.
    inside: [Option<(*const Node, u64)>; 2],
    done: bool,
}

impl<'a> Range<'a> {
    /// The bounds it was made with, taken out: it yields nothing more.
    pub(crate) fn take_range(&mut self) -> KeyRange {
        self.done = true;
        std::mem::replace(
            &mut self.range,
            std::borrow::Cow::Owned(KeyRange {
                lo: Bound::Unbounded,
                hi: Bound::Unbounded,
            }),
        )
        .into_owned()
    }

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

    /// Whether `found`'s key is short of the range's end that way (`forward`: its end,
    /// else its start). A new leaf's farthest key that way is compared first: if it is short
    /// of the end, so is every key of the leaf, and the leaf (at the version read) is noted
    /// as inside; else `found`'s own key is compared.
    fn short_of_end(&mut self, forward: bool, found: &Cursor<'a>) -> bool {
        let leaf = found.leaf;
        let here = (ptr::from_ref(leaf.node), leaf.version);
        if self.inside[usize::from(forward)] == Some(here) {
            return true;
        }
        let within = |range: &Self, key: &[u8]| {
            if forward {
                range.below_end(key)
            } else {
                range.above_start(key)
            }
        };
        let n = leaf.node.count();
        let far = n
            .checked_sub(1)
            .map(|last| leaf.node.key(if forward { last } else { 0 }));
        // The farthest slot as the leaf was at `version`, or nothing if it changed since.
        if let Some(far) = far.and_then(NonNull::new)
            && leaf.node.unchanged(leaf.version)
            // SAFETY: records outlive every scan that could have found them (the
            // collector's grace period).
            && within(self, unsafe { far.as_ref() }.key())
        {
            self.inside[usize::from(forward)] = Some(here);
            return true;
        }
        within(self, found.record.get().key())
    }

    /// The next record from the front (`forward`) or the back, if it is inside the range
    /// and before the other end.
    fn advance(&mut self, forward: bool) -> Option<RecordRef> {
        if self.done {
            return None;
        }
        let list: &'a Ordered = self.list;
        let (mine, other) = if forward {
            (self.front, self.back)
        } else {
            (self.back, self.front)
        };
        let seek = |bound| list.seek(forward, bound);
        let found = match mine {
            Some(at) => match at.step(forward) {
                Some(found) => Some(found),
                // Past the leaf's end: its link that way leads on, unless the leaf changed.
                None => match list.hop(forward, at.leaf) {
                    Some(found) => found,
                    None => seek(Bound::Excluded(at.record.get().key())),
                },
            },
            None if forward => seek(self.range.lo.as_ref().map(Vec::as_slice)),
            None => seek(self.range.hi.as_ref().map(Vec::as_slice)),
        };
        let Some(found) = found else {
            return self.finish();
        };
        let inside = self.short_of_end(forward, &found);
        let short_of_other = other.is_none_or(|o| {
            let key = found.record.get().key();
            let other_key = o.record.get().key();
            if forward {
                key < other_key
            } else {
                key > other_key
            }
        });
        if !inside || !short_of_other {
            return self.finish();
        }
        if forward {
            self.front = Some(found);
        } else {
            self.back = Some(found);
        }
        Some(found.record)
    }
}

impl Iterator for Range<'_> {
    type Item = RecordRef;

    fn next(&mut self) -> Option<RecordRef> {
        self.advance(true)
    }
}

impl DoubleEndedIterator for Range<'_> {
    fn next_back(&mut self) -> Option<RecordRef> {
        self.advance(false)
    }
}

#[cfg(test)]
mod tests;

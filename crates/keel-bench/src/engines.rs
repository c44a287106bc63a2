//! The targets that need no optional dependency: keel itself and the two no-concurrency-control
//! ceilings (a flat array indexed by key, and a papaya concurrent hash map).
//!
//! The ceilings mark how fast the point-access path could possibly be on this machine: values
//! are updated in place in fixed [`Slot`]s, "transactions" never abort and isolate nothing
//! (each single read or write is atomic, nothing more). They are not serializable and their
//! numbers are bounds, not peers.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering, fence};

use anyhow::Context as _;

use crate::target::{
    Durability, Engine, Fail, Open, Step, Target, Tx, Worker, embedded_worker, key_bytes,
};

/// keel: in memory with durability `none`, otherwise with its write-ahead log in a fresh
/// temporary directory (deleted when the target is dropped).
pub struct Keel {
    db: keel::Db,
    name: String,
    durability: Durability,
    _dir: Option<tempfile::TempDir>,
}

/// How often keel's `async` mode fsyncs: once a second, like Redis `appendfsync everysec`.
pub const KEEL_ASYNC_FSYNC: std::time::Duration = std::time::Duration::from_secs(1);

impl Keel {
    /// An empty database sized for `open.key_space` keys.
    pub fn new(open: &Open) -> anyhow::Result<Keel> {
        Keel::named(open, "keel")
    }

    /// [`Keel::new`], reported as `name`.
    pub fn named(open: &Open, name: &str) -> anyhow::Result<Keel> {
        let name = name.to_owned();
        let options = keel::Options::default()
            .capacity_hint(open.key_space as usize)
            .split(open.split);
        let durability = match open.durability {
            Durability::None => {
                return Ok(Keel {
                    db: keel::Db::with_options(options),
                    name,
                    durability: open.durability,
                    _dir: None,
                });
            }
            Durability::Async => keel::Durability::Async {
                interval: KEEL_ASYNC_FSYNC,
            },
            Durability::Sync => keel::Durability::Sync,
        };
        std::fs::create_dir_all(&open.dir)
            .with_context(|| format!("creating {}", open.dir.display()))?;
        let dir = tempfile::Builder::new()
            .prefix("keel-bench-keel-")
            .tempdir_in(&open.dir)
            .with_context(|| format!("making a temporary directory in {}", open.dir.display()))?;
        let db = keel::Db::open(dir.path(), options.durability(durability))
            .with_context(|| format!("opening keel in {}", dir.path().display()))?;
        Ok(Keel {
            db,
            name,
            durability: open.durability,
            _dir: Some(dir),
        })
    }
}

struct KeelEngine<'a> {
    db: &'a keel::Db,
}

struct KeelTxn<'a, 'db>(&'a mut keel::Txn<'db>);

/// Keys a [`Tx::prefetch`] hands keel at once (their bytes are built on the stack).
const PREFETCH_CHUNK: usize = 8;

/// Hands `keys` to `f` as key bytes, [`PREFETCH_CHUNK`] at a time.
fn in_chunks(keys: &[u64], mut f: impl FnMut(&[[u8; 8]])) {
    for chunk in keys.chunks(PREFETCH_CHUNK) {
        let bytes: [[u8; 8]; PREFETCH_CHUNK] =
            std::array::from_fn(|i| key_bytes(chunk.get(i).copied().unwrap_or(0)));
        f(&bytes[..chunk.len()]);
    }
}

struct KeelSnapshot<'a, 'db>(&'a keel::Snapshot<'db>);

impl Tx for KeelTxn<'_, '_> {
    fn prefetch(&mut self, keys: &[u64]) {
        in_chunks(keys, |bytes| {
            self.0.prefetch_all(bytes.iter().map(|k| &k[..]));
        });
    }
    fn read(&mut self, key: u64, f: &mut dyn FnMut(Option<&[u8]>)) -> Step {
        self.0.get_with(&key_bytes(key), f).map_err(Fail::error)
    }
    fn write(&mut self, key: u64, value: &[u8]) -> Step {
        self.0.put(&key_bytes(key), value).map_err(Fail::error)
    }
    fn scan(&mut self, start: u64, len: u32, f: &mut dyn FnMut(&[u8], &[u8])) -> Step {
        for (k, v) in self.0.range(&key_bytes(start)[..]..).take(len as usize) {
            f(&k, &v);
        }
        Ok(())
    }
    fn add(&mut self, key: u64, delta: i64) -> Step {
        self.0.add(&key_bytes(key), delta).map_err(Fail::error)
    }
    fn max(&mut self, key: u64, n: i64) -> Step {
        self.0.max(&key_bytes(key), n).map_err(Fail::error)
    }
    fn put_ordered(&mut self, key: u64, order: u64, value: &[u8]) -> Step {
        self.0
            .put_ordered(&key_bytes(key), order, value)
            .map_err(Fail::error)
    }
}

fn read_only_violation() -> Fail {
    Fail::Error(anyhow::anyhow!("a read-only transaction tried to write"))
}

impl Tx for KeelSnapshot<'_, '_> {
    fn prefetch(&mut self, keys: &[u64]) {
        in_chunks(keys, |bytes| {
            self.0.prefetch_all(bytes.iter().map(|k| &k[..]));
        });
    }
    fn read(&mut self, key: u64, f: &mut dyn FnMut(Option<&[u8]>)) -> Step {
        self.0.get_with(&key_bytes(key), f).map_err(Fail::error)
    }
    fn write(&mut self, _key: u64, _value: &[u8]) -> Step {
        Err(read_only_violation())
    }
    fn scan(&mut self, start: u64, len: u32, f: &mut dyn FnMut(&[u8], &[u8])) -> Step {
        for (k, v) in self.0.range(&key_bytes(start)[..]..).take(len as usize) {
            f(&k, &v);
        }
        Ok(())
    }
}

impl Engine for KeelEngine<'_> {
    fn transaction(
        &mut self,
        read_only: bool,
        body: &mut dyn FnMut(&mut dyn Tx) -> Step,
    ) -> anyhow::Result<bool> {
        if read_only {
            // Read-only transactions use a snapshot: it never validates and never aborts.
            let snapshot = self.db.snapshot().context("opening a keel snapshot")?;
            return match body(&mut KeelSnapshot(&snapshot)) {
                Ok(()) => Ok(true),
                Err(Fail::Conflict) => Ok(false),
                Err(Fail::Error(e)) => Err(e),
            };
        }
        let mut txn = self.db.begin().context("beginning a keel transaction")?;
        match body(&mut KeelTxn(&mut txn)) {
            Ok(()) => {}
            Err(Fail::Conflict) => return Ok(false),
            Err(Fail::Error(e)) => return Err(e),
        }
        match txn.commit().context("committing a keel transaction")? {
            Ok(_) => Ok(true),
            Err(conflict) => {
                if conflict.reason == keel::ConflictReason::Split {
                    // Stashed (Doppel): the retry runs in the joined phase.
                    // The harness retries at once, inside the joined phase this holds open
                    // only until it returns; good enough for a benchmark's rare stashes.
                    drop(self.db.wait_joined());
                }
                Ok(false)
            }
        }
    }
}

impl Target for Keel {
    fn name(&self) -> String {
        self.name.clone()
    }
    fn isolation(&self) -> &'static str {
        "strict serializable (OCC, validated reads); read-only txns on snapshots"
    }
    fn durability(&self) -> &'static str {
        self.durability.name()
    }
    fn load(
        &self,
        records: &mut dyn Iterator<Item = (u64, Vec<u8>)>,
        progress: &mut dyn FnMut(u64),
    ) -> anyhow::Result<()> {
        let mut done = 0u64;
        loop {
            let mut txn = self.db.begin().context("beginning a load transaction")?;
            let mut n = 0;
            for (k, v) in (&mut *records).take(10_000) {
                txn.put(&key_bytes(k), &v).context("loading a record")?;
                n += 1;
            }
            if n == 0 {
                return Ok(());
            }
            txn.commit()
                .context("committing a load transaction")?
                .map_err(|c| anyhow::anyhow!("load transaction conflicted: {c}"))?;
            done += n;
            progress(done);
        }
    }
    fn worker(&self, thread: u32) -> anyhow::Result<Box<dyn Worker + '_>> {
        Ok(embedded_worker(KeelEngine { db: &self.db }, thread))
    }
    fn get(&self, key: u64) -> anyhow::Result<Option<Vec<u8>>> {
        let snapshot = self.db.snapshot().context("opening a keel snapshot")?;
        Ok(snapshot.get(&key_bytes(key))?)
    }
}

/// Bytes a [`Slot`] holds.
pub const SLOT_BYTES: usize = 104;
const SLOT_WORDS: usize = SLOT_BYTES / 8;
const _: () = assert!(SLOT_BYTES.is_multiple_of(8));
const _: () = assert!(SLOT_BYTES >= crate::workload::VALUE_BYTES);

/// A value of up to [`SLOT_BYTES`] updated in place under a sequence lock. Every access is
/// atomic, so racing readers and writers are sound; a reader retries while a writer is in the
/// middle. Length 0 means "never written".
pub struct Slot {
    seq: AtomicU64,
    len: AtomicU64,
    words: [AtomicU64; SLOT_WORDS],
}

impl Default for Slot {
    fn default() -> Slot {
        Slot {
            seq: AtomicU64::new(0),
            len: AtomicU64::new(0),
            words: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl Slot {
    /// Copies the value out and hands it to `f`.
    pub fn read<T>(&self, f: impl FnOnce(Option<&[u8]>) -> T) -> T {
        let mut buf = [0u8; SLOT_BYTES];
        let len = loop {
            let before = self.seq.load(Ordering::Acquire);
            if before & 1 == 1 {
                // A writer is in the middle; it finishes in a few nanoseconds.
                std::hint::spin_loop();
                continue;
            }
            let len = self.len.load(Ordering::Relaxed) as usize;
            for (chunk, word) in buf.chunks_exact_mut(8).zip(&self.words) {
                chunk.copy_from_slice(&word.load(Ordering::Relaxed).to_ne_bytes());
            }
            fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) == before {
                break len.min(SLOT_BYTES);
            }
        };
        f((len > 0).then_some(&buf[..len]))
    }

    /// Replaces the value with what `f` computes from the current one, atomically with
    /// respect to other writers of this slot.
    pub fn update(&self, f: impl FnOnce(Option<&[u8]>, &mut [u8; SLOT_BYTES]) -> usize) {
        let seq = loop {
            let seq = self.seq.load(Ordering::Relaxed);
            if seq & 1 == 0
                && self
                    .seq
                    .compare_exchange_weak(seq, seq + 1, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                break seq;
            }
            std::hint::spin_loop();
        };
        fence(Ordering::Release);
        let mut old = [0u8; SLOT_BYTES];
        let old_len = self.len.load(Ordering::Relaxed) as usize;
        for (chunk, word) in old.chunks_exact_mut(8).zip(&self.words) {
            chunk.copy_from_slice(&word.load(Ordering::Relaxed).to_ne_bytes());
        }
        let mut new = [0u8; SLOT_BYTES];
        let len = f((old_len > 0).then_some(&old[..old_len]), &mut new).min(SLOT_BYTES);
        for (chunk, word) in new.chunks_exact(8).zip(&self.words) {
            word.store(
                u64::from_ne_bytes(chunk.try_into().expect("8-byte chunk")),
                Ordering::Relaxed,
            );
        }
        self.len.store(len as u64, Ordering::Relaxed);
        self.seq.store(seq + 2, Ordering::Release);
    }

    /// Replaces the value.
    pub fn write(&self, value: &[u8]) -> Step {
        if value.len() > SLOT_BYTES || value.is_empty() {
            return Err(Fail::Error(anyhow::anyhow!(
                "ceiling slots hold 1 to {SLOT_BYTES} bytes, not {}",
                value.len()
            )));
        }
        self.update(|_, new| {
            new[..value.len()].copy_from_slice(value);
            value.len()
        });
        Ok(())
    }

    fn apply_int(&self, f: impl FnOnce(i64) -> i64) -> Step {
        let mut result = Ok(());
        self.update(|old, new| {
            let old_value = old.map(<[u8]>::to_vec);
            match crate::target::parse_int(old) {
                Ok(n) => {
                    let text = f(n).to_string();
                    new[..text.len()].copy_from_slice(text.as_bytes());
                    text.len()
                }
                Err(e) => {
                    result = Err(e);
                    // Leave the slot as it was.
                    let old_value = old_value.unwrap_or_default();
                    new[..old_value.len()].copy_from_slice(&old_value);
                    old_value.len()
                }
            }
        });
        result
    }
}

/// Operations on slots, shared by both ceilings: no concurrency control, but each
/// commutative update is atomic on its slot, so no increment is lost.
trait Slots {
    fn slot(&self, key: u64) -> Step<&Slot>;
}

struct SlotTx<'a, S>(&'a S);

impl<S: Slots> Tx for SlotTx<'_, S> {
    fn read(&mut self, key: u64, f: &mut dyn FnMut(Option<&[u8]>)) -> Step {
        self.0.slot(key)?.read(f);
        Ok(())
    }
    fn write(&mut self, key: u64, value: &[u8]) -> Step {
        self.0.slot(key)?.write(value)
    }
    fn scan(&mut self, start: u64, len: u32, f: &mut dyn FnMut(&[u8], &[u8])) -> Step {
        // Keys are dense integers, so a scan is consecutive point reads; absent keys are
        // skipped (the hash map has no order to scan).
        let mut found = 0;
        let mut key = start;
        while found < len && key < start.saturating_add(u64::from(len) * 2) {
            if let Ok(slot) = self.0.slot(key) {
                slot.read(|v| {
                    if let Some(v) = v {
                        f(&key_bytes(key), v);
                        found += 1;
                    }
                });
            }
            key += 1;
        }
        Ok(())
    }
    fn add(&mut self, key: u64, delta: i64) -> Step {
        self.0.slot(key)?.apply_int(|n| n.wrapping_add(delta))
    }
    fn max(&mut self, key: u64, n: i64) -> Step {
        self.0.slot(key)?.apply_int(|old| old.max(n))
    }
    fn put_ordered(&mut self, key: u64, order: u64, value: &[u8]) -> Step {
        let encoded = keel::encode_ordered(order, value);
        if encoded.len() > SLOT_BYTES {
            return Err(Fail::Error(anyhow::anyhow!(
                "ordered value too long for a slot"
            )));
        }
        self.0.slot(key)?.update(|old, new| {
            let keep = old
                .and_then(keel::decode_ordered)
                .is_some_and(|(o, _)| o > order);
            let bytes = match (keep, old) {
                (true, Some(old)) => old,
                _ => &encoded,
            };
            new[..bytes.len()].copy_from_slice(bytes);
            bytes.len()
        });
        Ok(())
    }
}

struct SlotEngine<'a, S>(&'a S);

impl<S: Slots> Engine for SlotEngine<'_, S> {
    fn transaction(
        &mut self,
        _read_only: bool,
        body: &mut dyn FnMut(&mut dyn Tx) -> Step,
    ) -> anyhow::Result<bool> {
        match body(&mut SlotTx(self.0)) {
            Ok(()) => Ok(true),
            Err(Fail::Conflict) => Ok(false),
            Err(Fail::Error(e)) => Err(e),
        }
    }
}

/// The ceiling: a preallocated array of slots indexed by key. No index, no concurrency
/// control.
pub struct CeilingArray {
    slots: Vec<Slot>,
}

impl CeilingArray {
    /// An array for keys `0..keys`.
    pub fn new(keys: u64) -> anyhow::Result<CeilingArray> {
        let n = usize::try_from(keys).context("key space too large for an array")?;
        let mut slots = Vec::new();
        slots
            .try_reserve_exact(n)
            .with_context(|| format!("allocating {n} slots"))?;
        slots.resize_with(n, Slot::default);
        Ok(CeilingArray { slots })
    }
}

impl Slots for CeilingArray {
    fn slot(&self, key: u64) -> Step<&Slot> {
        self.slots.get(key as usize).ok_or_else(|| {
            Fail::Error(anyhow::anyhow!(
                "key {key} is outside the ceiling array (0..{})",
                self.slots.len()
            ))
        })
    }
}

fn load_slots(
    slots: &impl Slots,
    records: &mut dyn Iterator<Item = (u64, Vec<u8>)>,
    progress: &mut dyn FnMut(u64),
) -> anyhow::Result<()> {
    let mut done = 0u64;
    for (k, v) in records {
        match slots.slot(k).and_then(|s| s.write(&v)) {
            Ok(()) => {}
            Err(e) => anyhow::bail!("loading key {k}: {e}"),
        }
        done += 1;
        if done.is_multiple_of(65_536) {
            progress(done);
        }
    }
    progress(done);
    Ok(())
}

fn get_slot(slots: &impl Slots, key: u64) -> anyhow::Result<Option<Vec<u8>>> {
    match slots.slot(key) {
        Ok(slot) => Ok(slot.read(|v| v.map(<[u8]>::to_vec))),
        Err(_) => Ok(None),
    }
}

const CEILING_ISOLATION: &str = "none (no concurrency control; single ops atomic)";

impl Target for CeilingArray {
    fn name(&self) -> String {
        "ceiling-array".into()
    }
    fn isolation(&self) -> &'static str {
        CEILING_ISOLATION
    }
    fn durability(&self) -> &'static str {
        "none"
    }
    fn load(
        &self,
        records: &mut dyn Iterator<Item = (u64, Vec<u8>)>,
        progress: &mut dyn FnMut(u64),
    ) -> anyhow::Result<()> {
        load_slots(self, records, progress)
    }
    fn worker(&self, thread: u32) -> anyhow::Result<Box<dyn Worker + '_>> {
        Ok(embedded_worker(SlotEngine(self), thread))
    }
    fn get(&self, key: u64) -> anyhow::Result<Option<Vec<u8>>> {
        get_slot(self, key)
    }
}

/// A fast hasher for `u64` keys (SplitMix64's finalizer); SipHash would measure the hash
/// function rather than the map.
#[derive(Default, Clone, Copy)]
pub struct U64Hasher(u64);

impl Hasher for U64Hasher {
    fn finish(&self) -> u64 {
        let mut x = self.0;
        x ^= x >> 30;
        x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x ^= x >> 27;
        x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^ (x >> 31)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 ^= n;
    }
}

impl BuildHasher for U64Hasher {
    type Hasher = U64Hasher;
    fn build_hasher(&self) -> U64Hasher {
        U64Hasher(0)
    }
}

/// The hash-map ceiling: papaya's concurrent hash map from key to slot, values updated in
/// place. No concurrency control.
pub struct CeilingHash {
    map: papaya::HashMap<u64, Slot, U64Hasher>,
}

impl CeilingHash {
    /// An empty map sized for `keys` keys.
    pub fn new(keys: u64) -> CeilingHash {
        CeilingHash {
            map: papaya::HashMap::builder()
                .capacity(keys as usize)
                .hasher(U64Hasher(0))
                .build(),
        }
    }
}

/// A pinned view of the map for one transaction.
struct PinnedHash<'a> {
    map: papaya::HashMapRef<'a, u64, Slot, U64Hasher, papaya::LocalGuard<'a>>,
}

impl Slots for PinnedHash<'_> {
    fn slot(&self, key: u64) -> Step<&Slot> {
        // Writes to absent keys insert a slot first (ycsb-d/e inserts, new bids).
        Ok(self.map.get_or_insert_with(key, Slot::default))
    }
}

struct HashEngine<'a>(&'a CeilingHash);

impl Engine for HashEngine<'_> {
    fn transaction(
        &mut self,
        read_only: bool,
        body: &mut dyn FnMut(&mut dyn Tx) -> Step,
    ) -> anyhow::Result<bool> {
        let pinned = PinnedHash {
            map: self.0.map.pin(),
        };
        SlotEngine(&pinned).transaction(read_only, body)
    }
}

impl Target for CeilingHash {
    fn name(&self) -> String {
        "ceiling-hash".into()
    }
    fn isolation(&self) -> &'static str {
        CEILING_ISOLATION
    }
    fn durability(&self) -> &'static str {
        "none"
    }
    fn load(
        &self,
        records: &mut dyn Iterator<Item = (u64, Vec<u8>)>,
        progress: &mut dyn FnMut(u64),
    ) -> anyhow::Result<()> {
        let pinned = PinnedHash {
            map: self.map.pin(),
        };
        load_slots(&pinned, records, progress)
    }
    fn worker(&self, thread: u32) -> anyhow::Result<Box<dyn Worker + '_>> {
        Ok(embedded_worker(HashEngine(self), thread))
    }
    fn get(&self, key: u64) -> anyhow::Result<Option<Vec<u8>>> {
        let map = self.map.pin();
        Ok(map
            .get(&key)
            .and_then(|s| s.read(|v| v.map(<[u8]>::to_vec))))
    }
}

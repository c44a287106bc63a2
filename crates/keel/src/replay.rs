//! Recovery's writer: installs what the checkpoint and the log hold into an empty store.
//!
//! Recovery is a stream of independent cache misses (each key's index bucket, each new
//! record), so a [`Replayer`] applies writes a few entries behind reading them and prefetches
//! each key's bucket as it reads it, letting the misses overlap. New records go into the
//! point index only; each replayer remembers the ones it created, and the ordered index is
//! built from all of them in one sorted pass at the end ([`MemStore::link_recovered`]).
//!
//! Keys are partitioned over the replay threads (log) or come once each (checkpoint), so no
//! two replayers touch one key, and per key the writes apply in log order: the window is
//! first in, first out.

use std::collections::{HashMap, VecDeque};

use crate::Ts;
use crate::mvcc::{LockOwner, RecordRef};
use crate::split::Delta;
use crate::store::{MemStore, Store};
use crate::wal::format::Entry;

/// Writes in flight between being read and being applied.
const WINDOW: usize = 16;

/// The lock owner recovery installs under.
const RECOVERY: LockOwner = LockOwner(u64::MAX);

/// Deltas of one split record found in the log after its last full value.
struct Pending {
    /// Head timestamp when the first delta arrived: deltas at or below it are in the
    /// checkpoint already.
    base_ts: Ts,
    delta: Delta,
    max_tag: Ts,
}

/// What a replayer leaves behind.
pub(crate) struct Replayed {
    /// Records it created, each with its sort key (see [`Ordered::build`]).
    ///
    /// [`Ordered::build`]: crate::index::ordered::Ordered::build
    pub(crate) created: Vec<(u64, RecordRef)>,
    /// Versions installed minus versions trimmed.
    pub(crate) versions: i64,
}

/// Runs `work(t, replayer)` for `t` in `0..threads`, each on a thread of its own with a
/// replayer of its own, and returns what each replayed, in thread order.
pub(crate) fn on_threads<'a>(
    store: &'a MemStore,
    threads: usize,
    work: impl Fn(usize, &mut Replayer<'a>) + Sync,
) -> Vec<Replayed> {
    std::thread::scope(|s| {
        let work = &work;
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let mut replayer = Replayer::new(store);
                    work(t, &mut replayer);
                    replayer.finish()
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("replay thread"))
            .collect()
    })
}

/// Applies one thread's share of recovered writes.
pub(crate) struct Replayer<'a> {
    store: &'a MemStore,
    window: VecDeque<(u64, Ts, Entry<'a>)>,
    /// Deltas wait here until a full value supersedes them or the log ends.
    pending: HashMap<&'a [u8], Pending>,
    replayed: Replayed,
}

impl<'a> Replayer<'a> {
    pub(crate) fn new(store: &'a MemStore) -> Replayer<'a> {
        Replayer {
            store,
            window: VecDeque::with_capacity(WINDOW + 1),
            pending: HashMap::new(),
            replayed: Replayed {
                created: Vec::new(),
                versions: 0,
            },
        }
    }

    /// Queues `entry` (its key's hash is `h`), committed at `ts`; it applies after the
    /// entries queued before.
    #[inline]
    pub(crate) fn push(&mut self, h: u64, ts: Ts, entry: Entry<'a>) {
        self.store.prefetch(h);
        self.window.push_back((h, ts, entry));
        if self.window.len() > WINDOW {
            let (h, ts, entry) = self.window.pop_front().expect("a full window");
            self.apply(h, ts, entry);
        }
    }

    /// Applies everything queued and the deltas still pending.
    pub(crate) fn finish(mut self) -> Replayed {
        while let Some((h, ts, entry)) = self.window.pop_front() {
            self.apply(h, ts, entry);
        }
        for (key, p) in std::mem::take(&mut self.pending) {
            let h = crate::index::hash(key);
            let record = self.store.get(key, h).map(|r| r.get());
            let base = record.and_then(|r| r.head()).and_then(|v| v.value());
            // A delta that cannot apply was never acknowledged (the commit checked its
            // base); it cannot occur in a log keel wrote.
            if let Ok(value) = p.delta.apply(key, base) {
                self.install(h, key, p.max_tag, Some(&value));
            }
        }
        self.replayed
    }

    fn apply(&mut self, h: u64, ts: Ts, entry: Entry<'a>) {
        let value = match entry {
            Entry::Put(_, value) => Some(value),
            Entry::Delete(_) => None,
            Entry::Delta(key, encoded) => {
                let delta = Delta::decode(encoded).expect("checked by the log reader");
                return self.note_delta(h, key, ts, delta);
            }
        };
        let key = entry.key();
        if self.install(h, key, ts, value) && !self.pending.is_empty() {
            self.pending.remove(key);
        }
    }

    /// Installs a recovered version unless the key already has one at or after `ts`;
    /// returns whether it did.
    fn install(&mut self, h: u64, key: &[u8], ts: Ts, value: Option<&[u8]>) -> bool {
        let (record, created) =
            self.store
                .get_or_create_unordered(key, h, RECOVERY, value.map(<[u8]>::len));
        let r = record.get();
        if created {
            self.replayed
                .created
                .push((crate::index::ordered::sort_key(key), record));
        } else {
            assert!(
                r.try_lock(RECOVERY),
                "recovery partitions keys, so nobody else holds the lock"
            );
        }
        let newer = r.head().is_none_or(|v| v.ts() < ts);
        if newer {
            self.replayed.versions += r.install(RECOVERY, ts, value, ts);
        }
        r.unlock(RECOVERY);
        newer
    }

    /// Folds a logged delta into the pending ones unless the key's recovered value already
    /// holds it.
    fn note_delta(&mut self, h: u64, key: &'a [u8], tag: Ts, delta: Delta) {
        if let Some(p) = self.pending.get_mut(key) {
            if tag > p.base_ts {
                p.max_tag = p.max_tag.max(tag);
                if p.delta.merge(key, &delta).is_none() {
                    // Deltas of one phase share a kind; a record re-split for another kind
                    // starts after a full value, which cleared the pending entry.
                    p.delta = delta;
                }
            }
            return;
        }
        let base_ts = self
            .store
            .get(key, h)
            .and_then(|r| r.get().head().map(|v| v.ts()))
            .unwrap_or(Ts(0));
        if tag > base_ts {
            self.pending.insert(
                key,
                Pending {
                    base_ts,
                    delta,
                    max_tag: tag,
                },
            );
        }
    }
}

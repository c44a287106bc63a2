//! Hot keys: commands on a key whose commands keep conflicting run one at a time.
//!
//! Outside `MULTI` a command is its own optimistic transaction, retried when it loses a
//! conflict. That is cheap while keys are cold, but commands that all read and write one key
//! (pops from one list or sorted set, pushes beside them) conflict with each other on every
//! worker thread at once: each retry meets the next winner, and under enough threads a command
//! can lose [`crate::conn::CONFLICT_ATTEMPTS_MAX`] times in a row and fail. So, as MOCC does
//! (Wang and Kimura, "Mostly-Optimistic Concurrency Control for Highly Contended Dynamic
//! Workloads on a Thousand Cores", VLDB 2016), the keys of a command that lost
//! [`HEAT_AFTER`] conflicts in a row turn *hot* for [`HOT_MS`], and while one is hot a command on it first takes the key's lock (one
//! of [`STRIPES`] async mutexes, chosen by hash), so the commands on a hot key queue instead
//! of aborting each other; a cold key's commands take no lock. The lock only orders commands
//! that take it: the engine's validation still decides what commits, so correctness never
//! depends on it (a command that finds the key cold races a locked one as before, and the
//! loser retries, now holding the lock).
//!
//! A command takes the locks of all its keys' stripes in stripe order, and never holds one
//! while it waits for another out of order, so the locks cannot deadlock. A hot key stays hot
//! while it is used at least once per [`HOT_MS`]; the other keys of its stripe stay cold.
//!
//! A connection whose command took a hot key's lock runs on the poller thread until
//! [`HOT_MS`] after the last such command (`Conn::lane`): there the key's commands run one
//! after another on one thread, as in Redis, with no conflicts and no lock handed between
//! threads, while the other connections stay on the pool.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use tokio::sync::{Mutex, MutexGuard};

/// Lock stripes: a hot key's commands queue on its stripe's lock.
pub const STRIPES: usize = 1024;

/// How long a key stays hot after it was heated or last used while hot, in milliseconds.
pub const HOT_MS: u64 = 1000;

/// The conflicts in a row a command loses before its keys turn hot: an occasional conflict
/// costs less than queueing every command on the key (a lock holder's commit waits for the
/// log under `async` and `sync` durability, and the next one waits for it).
pub const HEAT_AFTER: u32 = 3;

/// Whether the retry after `conflict`, the `attempt`th conflict in a row, turns its keys hot:
/// from [`HEAT_AFTER`] on, unless a transaction prepared across nodes held the key. Queueing
/// this node's commands would not bring that one's decision sooner, and the poller a hot
/// key's connection moves to would spin through the wait.
pub fn heats(attempt: u32, conflict: &keel::Conflict) -> bool {
    attempt >= HEAT_AFTER && conflict.reason != keel::ConflictReason::Prepared
}

/// The hot-key locks of a server.
pub struct HotKeys {
    base: Instant,
    stripes: Box<[Stripe]>,
    /// Milliseconds since `base` until which some key may be hot, plus one (the latest
    /// `hot_until` of any stripe): past it no key is, and a command skips hashing its keys.
    any_until: AtomicU64,
}

struct Stripe {
    /// Milliseconds since `base` until which `key` is hot, plus one; 0 if never hot.
    hot_until: AtomicU64,
    /// The hash of the stripe's hot key (odd; 0 if none): the other keys of the stripe stay
    /// cold, so a hot key does not drag the commands of its stripe's cold keys along.
    key: AtomicU64,
    lock: Mutex<()>,
}

/// The locks a command holds while it runs.
pub type Guards<'a> = Vec<MutexGuard<'a, ()>>;

impl Default for HotKeys {
    fn default() -> Self {
        HotKeys::new()
    }
}

/// A key's 64-bit hash (FNV-1a), made odd so that it is never 0.
fn hash(key: &[u8]) -> u64 {
    key.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    }) | 1
}

/// The stripe of a key's hash.
fn stripe_of(hash: u64) -> usize {
    (hash >> 1) as usize % STRIPES
}

impl HotKeys {
    pub fn new() -> HotKeys {
        HotKeys {
            base: Instant::now(),
            stripes: (0..STRIPES)
                .map(|_| Stripe {
                    hot_until: AtomicU64::new(0),
                    key: AtomicU64::new(0),
                    lock: Mutex::new(()),
                })
                .collect(),
            any_until: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether the key of `hash` is hot now; if so it stays hot for another [`HOT_MS`]: a
    /// hot key cools once nothing has used it for that long.
    fn use_if_hot(&self, hash: u64) -> bool {
        let stripe = &self.stripes[stripe_of(hash)];
        if stripe.key.load(Relaxed) != hash {
            return false;
        }
        let now = self.now_ms();
        if now >= stripe.hot_until.load(Relaxed) {
            return false;
        }
        stripe.hot_until.fetch_max(now + HOT_MS + 1, Relaxed);
        self.stay_hot_until(now + HOT_MS + 1);
        true
    }

    /// Raises `any_until` to `until`, writing the shared word only when that raises it.
    fn stay_hot_until(&self, until: u64) {
        if self.any_until.load(Relaxed) < until {
            self.any_until.fetch_max(until, Relaxed);
        }
    }

    /// A command on `keys` lost conflicts: they turn hot for [`HOT_MS`].
    pub fn heat<'k>(&self, keys: impl Iterator<Item = &'k [u8]>) {
        let until = self.now_ms() + HOT_MS + 1;
        for key in keys {
            let hash = hash(key);
            let stripe = &self.stripes[stripe_of(hash)];
            stripe.key.store(hash, Relaxed);
            stripe.hot_until.fetch_max(until, Relaxed);
        }
        self.stay_hot_until(until);
    }

    /// Takes the locks of the stripes of `keys` that are hot (all of them if `all`), in
    /// stripe order. Empty, and immediate, for a command on cold keys.
    pub async fn lock<'k>(&self, keys: impl Iterator<Item = &'k [u8]>, all: bool) -> Guards<'_> {
        // Nothing hot anywhere (the usual case): the keys are not even looked at. A key
        // heated meanwhile is locked from the next command on.
        if !all && self.now_ms() >= self.any_until.load(Relaxed) {
            return Vec::new();
        }
        let mut stripes: Vec<usize> = keys
            .map(hash)
            .filter(|&h| all || self.use_if_hot(h))
            .map(stripe_of)
            .collect();
        if stripes.is_empty() {
            return Vec::new();
        }
        stripes.sort_unstable();
        stripes.dedup();
        let mut guards = Vec::with_capacity(stripes.len());
        for s in stripes {
            guards.push(self.stripes[s].lock.lock().await);
        }
        guards
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_cold_key_takes_no_lock_and_a_conflict_heats_it() {
        let hot = HotKeys::new();
        assert!(hot.lock([&b"k"[..]].into_iter(), false).await.is_empty());
        hot.heat([&b"k"[..]].into_iter());
        let guards = hot
            .lock([&b"k"[..], &b"other"[..]].into_iter(), false)
            .await;
        assert_eq!(guards.len(), 1, "only the hot key's stripe");
        drop(guards);
        assert_eq!(
            hot.lock([&b"k"[..], &b"k"[..]].into_iter(), true)
                .await
                .len(),
            1
        );
    }

    /// While no key is hot anywhere, a command's keys are not even hashed.
    #[tokio::test]
    async fn with_nothing_hot_the_keys_are_not_looked_at() {
        let hot = HotKeys::new();
        let looked = std::cell::Cell::new(0);
        let keys = || {
            [&b"a"[..], &b"b"[..]]
                .into_iter()
                .inspect(|_| looked.set(looked.get() + 1))
        };
        assert!(hot.lock(keys(), false).await.is_empty());
        assert_eq!(looked.get(), 0);
        hot.heat([&b"elsewhere"[..]].into_iter());
        assert!(hot.lock(keys(), false).await.is_empty());
        assert_eq!(looked.get(), 2, "something is hot: each key is checked");
    }

    #[tokio::test]
    async fn a_cold_key_beside_a_hot_one_in_its_stripe_stays_cold() {
        let hot = HotKeys::new();
        let stripe = |k: &[u8]| stripe_of(hash(k));
        let neighbour = (0..)
            .map(|i| format!("c{i}").into_bytes())
            .find(|k| stripe(k) == stripe(b"k"))
            .expect("some key shares the stripe");
        hot.heat([&b"k"[..]].into_iter());
        assert!(
            hot.lock([&neighbour[..]].into_iter(), false)
                .await
                .is_empty()
        );
        assert_eq!(hot.lock([&b"k"[..]].into_iter(), false).await.len(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn commands_on_a_hot_key_run_one_at_a_time() {
        let hot = std::sync::Arc::new(HotKeys::new());
        hot.heat([&b"k"[..]].into_iter());
        let inside = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let (hot, inside) = (hot.clone(), inside.clone());
                tokio::spawn(async move {
                    for _ in 0..200 {
                        let _g = hot.lock([&b"k"[..]].into_iter(), false).await;
                        assert_eq!(inside.fetch_add(1, Relaxed), 0, "two holders at once");
                        tokio::task::yield_now().await;
                        inside.fetch_sub(1, Relaxed);
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("no task panics");
        }
    }
}

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
//! while it waits for another out of order, so the locks cannot deadlock.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use tokio::sync::{Mutex, MutexGuard};

/// Lock stripes: keys that share one are serialized together while either is hot.
pub const STRIPES: usize = 1024;

/// How long a key stays hot after it was heated, in milliseconds.
pub const HOT_MS: u64 = 1000;

/// The conflicts in a row a command loses before its keys turn hot: an occasional conflict
/// costs less than queueing every command on the key (a lock holder's commit waits for the
/// log under `async` and `sync` durability, and the next one waits for it).
pub const HEAT_AFTER: u32 = 3;

/// The hot-key locks of a server.
pub struct HotKeys {
    base: Instant,
    stripes: Box<[Stripe]>,
}

struct Stripe {
    /// Milliseconds since `base` until which the stripe is hot, plus one; 0 if never hot.
    hot_until: AtomicU64,
    lock: Mutex<()>,
}

/// The locks a command holds while it runs.
pub type Guards<'a> = Vec<MutexGuard<'a, ()>>;

impl Default for HotKeys {
    fn default() -> Self {
        HotKeys::new()
    }
}

impl HotKeys {
    pub fn new() -> HotKeys {
        HotKeys {
            base: Instant::now(),
            stripes: (0..STRIPES)
                .map(|_| Stripe {
                    hot_until: AtomicU64::new(0),
                    lock: Mutex::new(()),
                })
                .collect(),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The stripe of `key` (FNV-1a).
    fn stripe_of(key: &[u8]) -> usize {
        let h = key.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        (h % STRIPES as u64) as usize
    }

    /// Whether `stripe` is hot now.
    fn is_hot(&self, stripe: usize) -> bool {
        match self.stripes[stripe].hot_until.load(Relaxed) {
            0 => false,
            until => self.now_ms() < until,
        }
    }

    /// A command on `keys` lost a conflict: they turn hot for [`HOT_MS`].
    pub fn heat<'k>(&self, keys: impl Iterator<Item = &'k [u8]>) {
        let until = self.now_ms() + HOT_MS + 1;
        for key in keys {
            let stripe = &self.stripes[Self::stripe_of(key)];
            if stripe.hot_until.load(Relaxed) < until {
                stripe.hot_until.store(until, Relaxed);
            }
        }
    }

    /// Takes the locks of the stripes of `keys` that are hot (all of them if `all`), in
    /// stripe order. Empty, and immediate, for a command on cold keys.
    pub async fn lock<'k>(&self, keys: impl Iterator<Item = &'k [u8]>, all: bool) -> Guards<'_> {
        let mut stripes: Vec<usize> = keys
            .map(Self::stripe_of)
            .filter(|&s| all || self.is_hot(s))
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

//! Clients blocked in `BLPOP`, `BRPOP`, `BLMOVE` and `BRPOPLPUSH`, by key, in the order they
//! blocked.
//!
//! A blocked connection (`conn.rs`) registers here, then runs its pop again as a transaction:
//! a push committed before the registration is seen by that attempt, and one committed after
//! it wakes the client. The waker side runs after the pushing transaction has committed (and
//! is visible): it wakes the *first* client blocked on the key. That client pops, and when it
//! leaves the registry (served, timed out, unblocked or disconnected) it wakes the next one on
//! each of its keys, so clients are served in the order they blocked, as in Redis, and a push
//! of several elements reaches as many clients one after another. A woken client that finds
//! nothing (another client popped first) keeps its place and waits again.
//!
//! A wake-up goes through a `tokio::sync::Notify`, which keeps a wake-up that comes while its
//! client is not waiting (it is running its attempt), and wakes the client's task on whichever
//! runtime (lane) runs it.
//!
//! Lost wake-ups: a client registers (a SeqCst count, then its attempt's snapshot) and a
//! pusher commits, then reads the count after a SeqCst fence. Either the pusher sees the
//! client registered, or the client's snapshot, taken after the pusher's fence, sees the push.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering, fence};

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::table::Cmd;

/// Clients blocked on keys.
#[derive(Default)]
pub struct Registry {
    /// Clients registered: pushers skip the lock while it is 0.
    count: AtomicUsize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// The clients blocked on each key, first blocked first.
    by_key: HashMap<Bytes, VecDeque<Arc<Waiter>>>,
    /// Each blocked client, by client id (for `CLIENT UNBLOCK`).
    by_client: HashMap<u64, Arc<Waiter>>,
}

/// How a blocked client was told to stop waiting by `CLIENT UNBLOCK`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unblock {
    /// As if its timeout had passed.
    Timeout,
    /// With an `UNBLOCKED` error.
    Error,
}

struct Waiter {
    client: u64,
    keys: Vec<Bytes>,
    notify: Notify,
    /// 0: blocked; 1: unblocked as a timeout; 2: unblocked with an error.
    unblock: AtomicU8,
}

/// A client's place in the registry; dropping it leaves, waking the next client on each key.
pub struct Guard<'a> {
    registry: &'a Registry,
    waiter: Arc<Waiter>,
}

impl Registry {
    /// Registers `client` as blocked on `keys` (duplicates count once).
    pub fn block(&self, client: u64, keys: &[Bytes]) -> Guard<'_> {
        let mut unique: Vec<Bytes> = Vec::with_capacity(keys.len());
        for k in keys {
            if !unique.contains(k) {
                unique.push(k.clone());
            }
        }
        let waiter = Arc::new(Waiter {
            client,
            keys: unique,
            notify: Notify::new(),
            unblock: AtomicU8::new(0),
        });
        {
            let mut inner = self.inner.lock();
            for k in &waiter.keys {
                inner
                    .by_key
                    .entry(k.clone())
                    .or_default()
                    .push_back(waiter.clone());
            }
            inner.by_client.insert(client, waiter.clone());
            self.count.fetch_add(1, Ordering::SeqCst);
        }
        // The caller's next snapshot comes after this (see the module docs).
        fence(Ordering::SeqCst);
        Guard {
            registry: self,
            waiter,
        }
    }

    /// After a committed `cmd`: wakes the first client blocked on the key it pushed to.
    pub fn committed(&self, cmd: Cmd, args: &[Bytes]) {
        let Some(key) = crate::lists::pushed_key(cmd, args) else {
            return;
        };
        fence(Ordering::SeqCst);
        if self.count.load(Ordering::SeqCst) == 0 {
            return;
        }
        self.wake_first(key);
    }

    fn wake_first(&self, key: &[u8]) {
        let inner = self.inner.lock();
        if let Some(w) = inner.by_key.get(key).and_then(VecDeque::front) {
            w.notify.notify_one();
        }
    }

    /// `CLIENT UNBLOCK`: whether `client` was blocked.
    pub fn unblock(&self, client: u64, how: Unblock) -> bool {
        let inner = self.inner.lock();
        let Some(w) = inner.by_client.get(&client) else {
            return false;
        };
        let code = match how {
            Unblock::Timeout => 1,
            Unblock::Error => 2,
        };
        w.unblock.store(code, Ordering::Relaxed);
        w.notify.notify_one();
        true
    }

    /// Whether `client` is blocked (`CLIENT LIST`'s flag `b`).
    pub fn is_blocked(&self, client: u64) -> bool {
        self.count.load(Ordering::Relaxed) > 0 && self.inner.lock().by_client.contains_key(&client)
    }

    /// Clients blocked now (`INFO clients`).
    pub fn blocked_clients(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }
}

impl Guard<'_> {
    /// Waits until a push to one of the keys (or `CLIENT UNBLOCK`) wakes this client.
    pub async fn woken(&self) {
        self.waiter.notify.notified().await;
    }

    /// Whether `CLIENT UNBLOCK` ended the wait, and how.
    pub fn unblocked(&self) -> Option<Unblock> {
        match self.waiter.unblock.load(Ordering::Relaxed) {
            0 => None,
            1 => Some(Unblock::Timeout),
            _ => Some(Unblock::Error),
        }
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        let mut inner = self.registry.inner.lock();
        let me = &self.waiter;
        for k in &me.keys {
            let Some(queue) = inner.by_key.get_mut(k) else {
                continue;
            };
            queue.retain(|w| !Arc::ptr_eq(w, me));
            match queue.front() {
                // The next in line may be due what this client was woken for, or what is left
                // after its pop: it looks (if there is nothing, it waits again).
                Some(next) => next.notify.notify_one(),
                None => {
                    inner.by_key.remove(k);
                }
            }
        }
        if inner
            .by_client
            .get(&me.client)
            .is_some_and(|w| Arc::ptr_eq(w, me))
        {
            inner.by_client.remove(&me.client);
        }
        self.registry.count.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(names: &[&str]) -> Vec<Bytes> {
        names.iter().map(|n| Bytes::from(n.to_string())).collect()
    }

    #[tokio::test]
    async fn the_first_blocked_is_woken_then_the_next() {
        let r = Registry::default();
        let a = r.block(1, &keys(&["k", "k"]));
        let b = r.block(2, &keys(&["k"]));
        assert_eq!(r.blocked_clients(), 2);
        r.committed(Cmd::Rpush, &keys(&["rpush", "k", "x"]));
        // Only the first: a stored wake-up resolves at once; the second has none.
        tokio::time::timeout(std::time::Duration::from_secs(5), a.woken())
            .await
            .expect("the first client is woken");
        let second = tokio::time::timeout(std::time::Duration::from_millis(20), b.woken()).await;
        assert!(second.is_err(), "the second client waits its turn");
        drop(a);
        tokio::time::timeout(std::time::Duration::from_secs(5), b.woken())
            .await
            .expect("leaving wakes the next client");
        drop(b);
        assert_eq!(r.blocked_clients(), 0);
        assert!(r.inner.lock().by_key.is_empty());
        assert!(r.inner.lock().by_client.is_empty());
    }

    #[tokio::test]
    async fn unblock_names_a_blocked_client() {
        let r = Registry::default();
        assert!(!r.unblock(7, Unblock::Timeout));
        let g = r.block(7, &keys(&["a", "b"]));
        assert_eq!(g.unblocked(), None);
        assert!(r.unblock(7, Unblock::Error));
        g.woken().await;
        assert_eq!(g.unblocked(), Some(Unblock::Error));
    }
}

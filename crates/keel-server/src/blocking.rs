//! Clients blocked in `BLPOP`, `BRPOP`, `BLMOVE`, `BRPOPLPUSH` and `BLMPOP` (waiting for a
//! list) and in `BZPOPMIN`, `BZPOPMAX` and `BZMPOP` (waiting for a sorted set), by key, in the
//! order they blocked. A push wakes only clients waiting for its type: as in Redis, a client
//! blocked on a key that comes to hold the other type keeps waiting.
//!
//! Single node: a push wakes its waiters after its local commit (`Registry::committed`).
//! Replicated cluster: after a log entry applies on this node's replica of its partition
//! (`Registry::applied`); a woken client runs its pop again through the log.
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
//! A *watcher* (`Registry::watch`) is another node's blocked client, waiting here through
//! `KEEL.AWAITPUSH` for a push to keys this node owns (`conn.rs`, "Blocking pops across
//! nodes"): every push to one of its keys wakes every watcher of it, besides the first
//! client; watchers take no place in line, are not `blocked_clients`, and leaving wakes no one.
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
    /// Clients and watchers registered: pushers skip the lock while it is 0.
    count: AtomicUsize,
    /// Clients registered (`INFO clients`' `blocked_clients`).
    clients: AtomicUsize,
    inner: Mutex<Inner>,
}

impl Inner {
    /// The first client blocked on `key` that waits for `kind`.
    fn first<'a>(
        by_key: &'a HashMap<Bytes, VecDeque<Arc<Waiter>>>,
        key: &[u8],
        kind: Kind,
    ) -> Option<&'a Arc<Waiter>> {
        by_key
            .get(key)?
            .iter()
            .find(|w| w.kind == kind && !w.watcher)
    }
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

/// What a blocked client waits for, and what a write provides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Elements of a list.
    List,
    /// Members of a sorted set.
    ZSet,
}

impl Kind {
    /// What the blocking pop `cmd` waits for.
    pub fn of(cmd: Cmd) -> Kind {
        if crate::zsets::is_blocking(cmd) {
            Kind::ZSet
        } else {
            Kind::List
        }
    }
}

/// The key a committed `cmd` may have turned from absent into one to pop from, and the kind
/// of client it may serve (`None`: either; a key moved, copied or restored whole). As Redis
/// signals every key that a command creates as a list or sorted set: `SORT … STORE` makes a
/// list, and `KEEL.RESTORE` is how a command across nodes (`LMOVE`, `ZUNIONSTORE`, `COPY`,
/// ... gathered) writes its destination on the destination's node.
fn pushed(cmd: Cmd, args: &[Bytes]) -> Option<(&[u8], Option<Kind>)> {
    match cmd {
        Cmd::Rename | Cmd::Renamenx | Cmd::Copy => return args.get(2).map(|k| (&k[..], None)),
        Cmd::KeelRestore => return args.get(1).map(|k| (&k[..], None)),
        Cmd::Sort => return crate::sort::store_key(args).map(|k| (k, Some(Kind::List))),
        _ => {}
    }
    if let Some(k) = crate::lists::pushed_key(cmd, args) {
        return Some((k, Some(Kind::List)));
    }
    crate::zsets::pushed_key(cmd, args).map(|k| (k, Some(Kind::ZSet)))
}

struct Waiter {
    client: u64,
    kind: Kind,
    /// Another node's client, waiting here for a push (module docs).
    watcher: bool,
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
    /// Registers `client` as blocked on `keys` (duplicates count once), waiting for `kind`.
    pub fn block(&self, client: u64, keys: &[Bytes], kind: Kind) -> Guard<'_> {
        self.register(client, keys, kind, false)
    }

    /// Registers a watcher (module docs) of `keys` for `kind`, on behalf of the connection
    /// `client`: woken by every push to one of them.
    pub fn watch(&self, client: u64, keys: &[Bytes], kind: Kind) -> Guard<'_> {
        self.register(client, keys, kind, true)
    }

    fn register(&self, client: u64, keys: &[Bytes], kind: Kind, watcher: bool) -> Guard<'_> {
        let mut unique: Vec<Bytes> = Vec::with_capacity(keys.len());
        for k in keys {
            if !unique.contains(k) {
                unique.push(k.clone());
            }
        }
        let waiter = Arc::new(Waiter {
            client,
            kind,
            watcher,
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
            if !watcher {
                inner.by_client.insert(client, waiter.clone());
                self.clients.fetch_add(1, Ordering::Relaxed);
            }
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
        let Some((key, kind)) = pushed(cmd, args) else {
            return;
        };
        fence(Ordering::SeqCst);
        if self.count.load(Ordering::SeqCst) == 0 {
            return;
        }
        self.wake_first(key, kind);
    }

    /// Replicated cluster: after a log entry's `command` (its arguments) applied on this
    /// node's replica of its partition, leader or follower (`replica::machine`): wakes the
    /// first client blocked on the key it pushed to. No wake-up is lost: a client registers
    /// before it sends its pop into the log, so a push ordered after that pop in the log is
    /// applied here after the registration, and this sees it.
    pub fn applied(&self, command: &[Vec<u8>]) {
        fence(Ordering::SeqCst);
        if self.count.load(Ordering::SeqCst) == 0 {
            return;
        }
        let Some(spec) = command.first().and_then(|name| crate::table::lookup(name)) else {
            return;
        };
        // The pushed key is among the first arguments; the rest (elements) are not copied.
        let head: Vec<Bytes> = command
            .iter()
            .take(3)
            .map(|a| Bytes::copy_from_slice(a))
            .collect();
        if let Some((key, kind)) = pushed(spec.cmd, &head) {
            self.wake_first(key, kind);
        }
    }

    /// Wakes the first client blocked on `key` that waits for `kind`, and every watcher of
    /// it for `kind`; for `None` (a key written whole, which may now hold either), the first
    /// that waits for each kind: the first of all alone could be one waiting for the other
    /// kind, which finds nothing and waits on, while the client due the key was never woken.
    fn wake_first(&self, key: &[u8], kind: Option<Kind>) {
        let inner = self.inner.lock();
        let kinds = match kind {
            Some(kind) => &[kind][..],
            None => &[Kind::List, Kind::ZSet][..],
        };
        for &kind in kinds {
            if let Some(w) = Inner::first(&inner.by_key, key, kind) {
                w.notify.notify_one();
            }
        }
        for w in inner.by_key.get(key).into_iter().flatten() {
            if w.watcher && kind.is_none_or(|k| k == w.kind) {
                w.notify.notify_one();
            }
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
        self.clients.load(Ordering::Relaxed)
    }

    /// Watchers registered now (`INFO cluster`).
    pub fn watchers(&self) -> usize {
        self.count
            .load(Ordering::Relaxed)
            .saturating_sub(self.clients.load(Ordering::Relaxed))
    }
}

impl Guard<'_> {
    /// Waits until a push to one of the keys (or `CLIENT UNBLOCK`) wakes this client.
    pub async fn woken(&self) {
        self.waiter.notify.notified().await;
    }

    /// Something may be there to pop on one of the keys, which no push announced (a poll
    /// found it): wakes the first client blocked on each key, this one or one before it, so
    /// that clients are still served in the order they blocked.
    pub fn found(&self) {
        let inner = self.registry.inner.lock();
        for k in &self.waiter.keys {
            if let Some(w) = Inner::first(&inner.by_key, k, self.waiter.kind) {
                w.notify.notify_one();
            }
        }
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
            if queue.is_empty() {
                inner.by_key.remove(k);
            } else if me.watcher {
                // It took no place in line: nobody is due what it was woken for.
            } else if let Some(next) = Inner::first(&inner.by_key, k, me.kind) {
                // The next in line for this kind may be due what this client was woken for,
                // or what is left after its pop: it looks (if there is nothing, it waits
                // again).
                next.notify.notify_one();
            }
        }
        if !me.watcher {
            if inner
                .by_client
                .get(&me.client)
                .is_some_and(|w| Arc::ptr_eq(w, me))
            {
                inner.by_client.remove(&me.client);
            }
            self.registry.clients.fetch_sub(1, Ordering::Relaxed);
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
        let a = r.block(1, &keys(&["k", "k"]), Kind::List);
        let b = r.block(2, &keys(&["k"]), Kind::List);
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

    fn command(args: &[&str]) -> Vec<Vec<u8>> {
        args.iter().map(|a| a.as_bytes().to_vec()).collect()
    }

    #[tokio::test]
    async fn an_applied_push_wakes_the_first_and_a_poll_finds_for_the_first() {
        let r = Registry::default();
        let short = std::time::Duration::from_millis(20);
        let a = r.block(1, &keys(&["k"]), Kind::List);
        let b = r.block(2, &keys(&["other", "k"]), Kind::List);
        // Not pushes, or into another key: nobody is woken.
        r.applied(&command(&["GET", "k"]));
        r.applied(&command(&["RPUSH", "elsewhere", "x"]));
        r.applied(&command(&["NOSUCHCOMMAND", "k"]));
        r.applied(&[]);
        assert!(tokio::time::timeout(short, a.woken()).await.is_err());
        // A push applied into `k` (`LMOVE` pushes into its destination): the first in line.
        r.applied(&command(&["LMOVE", "src", "k", "LEFT", "RIGHT"]));
        tokio::time::timeout(std::time::Duration::from_secs(5), a.woken())
            .await
            .expect("the first client is woken");
        assert!(tokio::time::timeout(short, b.woken()).await.is_err());
        // The second client's poll found something on `k`: the first in line is woken, and
        // on `other`, where it is first, the second itself.
        b.found();
        tokio::time::timeout(std::time::Duration::from_secs(5), a.woken())
            .await
            .expect("the first in line on k");
        tokio::time::timeout(std::time::Duration::from_secs(5), b.woken())
            .await
            .expect("the first in line on other");
    }

    #[tokio::test]
    async fn watchers_hear_every_push_and_take_no_place_in_line() {
        let r = Registry::default();
        let short = std::time::Duration::from_millis(20);
        let soon = std::time::Duration::from_secs(5);
        let w1 = r.watch(10, &keys(&["k"]), Kind::List);
        let a = r.block(1, &keys(&["k"]), Kind::List);
        let w2 = r.watch(11, &keys(&["k", "j"]), Kind::List);
        let z = r.watch(12, &keys(&["k"]), Kind::ZSet);
        assert_eq!(r.blocked_clients(), 1, "watchers are not blocked clients");
        assert!(!r.is_blocked(10));
        // A push: the first client (though a watcher registered before it) and every watcher
        // of its kind.
        r.committed(Cmd::Rpush, &keys(&["rpush", "k", "x"]));
        tokio::time::timeout(soon, a.woken())
            .await
            .expect("the client");
        tokio::time::timeout(soon, w1.woken())
            .await
            .expect("a watcher");
        tokio::time::timeout(soon, w2.woken())
            .await
            .expect("another");
        assert!(tokio::time::timeout(short, z.woken()).await.is_err());
        // A key written whole: watchers of either kind, and the first client.
        r.committed(Cmd::Copy, &keys(&["copy", "src", "k"]));
        for g in [&z, &w1, &w2, &a] {
            tokio::time::timeout(soon, g.woken())
                .await
                .expect("any kind");
        }
        // A watcher that leaves wakes nobody; a client that leaves wakes no watcher.
        drop(w1);
        assert!(tokio::time::timeout(short, a.woken()).await.is_err());
        drop(a);
        assert!(tokio::time::timeout(short, w2.woken()).await.is_err());
        assert_eq!(r.blocked_clients(), 0);
        drop((w2, z));
        assert!(r.inner.lock().by_key.is_empty());
        assert_eq!(r.count.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn unblock_names_a_blocked_client() {
        let r = Registry::default();
        assert!(!r.unblock(7, Unblock::Timeout));
        let g = r.block(7, &keys(&["a", "b"]), Kind::List);
        assert_eq!(g.unblocked(), None);
        assert!(r.unblock(7, Unblock::Error));
        g.woken().await;
        assert_eq!(g.unblocked(), Some(Unblock::Error));
    }
}

//! How long requests to other nodes of the cluster take, per peer: every forwarded command,
//! `KEEL.RAFT` message (Raft's RPCs, requests sent to a partition's leader) and cluster
//! transport round trip is recorded in a histogram of powers of two microseconds, shown by
//! `INFO cluster` (`keel_rpc_<node>:…`) and the Prometheus metrics
//! (`keel_rpc_duration_seconds`).
//!
//! Each peer also keeps when it last answered and when a request to it last failed (probes
//! included, `cluster::probe_loop`): a peer whose last request failed and that has not
//! answered for a cluster timeout is *unreachable*, which `CLUSTER NODES`, `SHARDS`, `SLOTS`
//! and `INFO` show as Redis shows a failing node.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Buckets: `[0]` holds requests under 2 µs, `[i]` those under `2^(i+1)` µs; the last one
/// everything longer (over about 36 minutes).
const BUCKETS: usize = 32;

/// One peer's requests.
#[derive(Default)]
pub struct Latency {
    buckets: [AtomicU64; BUCKETS],
    count: AtomicU64,
    errors: AtomicU64,
    sum_us: AtomicU64,
    max_us: AtomicU64,
    /// When the peer last answered, and when a request to it last ended: [`now_ms`] + 1
    /// (0: never).
    answered_ms: AtomicU64,
    ended_ms: AtomicU64,
    /// Whether the request that ended last failed.
    last_failed: AtomicBool,
}

/// Milliseconds since this process first asked (the origin of the times above).
fn now_ms() -> u64 {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    u64::try_from(ORIGIN.get_or_init(Instant::now).elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// A summary of a [`Latency`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub calls: u64,
    /// Requests that failed (not sent, or no answer in time).
    pub errors: u64,
    pub mean_us: u64,
    pub sum_us: u64,
    /// The bucket bound below which half the requests finished (at most `max_us`), in µs.
    pub p50_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
}

/// The upper bound of bucket `i`, in µs.
fn bound_us(i: usize) -> u64 {
    1u64 << (i + 1)
}

impl Latency {
    /// Records one request that took `took`; `ok`: it was answered.
    pub fn record(&self, took: Duration, ok: bool) {
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        let i = (63 - us.max(1).leading_zeros() as usize).min(BUCKETS - 1);
        self.buckets[i].fetch_add(1, Relaxed);
        self.count.fetch_add(1, Relaxed);
        if !ok {
            self.errors.fetch_add(1, Relaxed);
        }
        self.sum_us.fetch_add(us, Relaxed);
        self.max_us.fetch_max(us, Relaxed);
        self.heard(ok);
    }

    /// Notes that a request to the peer was answered (`ok`) or failed (not sent, or no
    /// answer in time), without timing it (a probe).
    pub fn heard(&self, ok: bool) {
        let at = now_ms() + 1;
        if ok {
            self.answered_ms.fetch_max(at, Relaxed);
        }
        self.ended_ms.fetch_max(at, Relaxed);
        self.last_failed.store(!ok, Relaxed);
    }

    /// Whether the last request to the peer failed and it has not answered for `after`
    /// (since this process started, if it never has). A peer never asked is not.
    pub fn unreachable_for(&self, after: Duration) -> bool {
        let after = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
        self.last_failed.load(Relaxed)
            && (now_ms() + 1).saturating_sub(self.answered_ms.load(Relaxed)) >= after
    }

    /// How long since a request to the peer last ended, answered or not (`None`: never).
    pub fn idle(&self) -> Option<Duration> {
        let last = self.ended_ms.load(Relaxed);
        (last > 0).then(|| Duration::from_millis((now_ms() + 1).saturating_sub(last)))
    }

    /// Each bucket's bound (µs) and how many requests took less than it (cumulative).
    pub fn cumulative(&self) -> Vec<(u64, u64)> {
        let mut total = 0;
        (0..BUCKETS)
            .map(|i| {
                total += self.buckets[i].load(Relaxed);
                (bound_us(i), total)
            })
            .collect()
    }

    pub fn summary(&self) -> Summary {
        let calls = self.count.load(Relaxed);
        let cumulative = self.cumulative();
        let max_us = self.max_us.load(Relaxed);
        // A bucket's bound, or the slowest request if that is lower.
        let quantile = |q: f64| {
            let want = ((calls as f64) * q).ceil().max(1.0) as u64;
            cumulative
                .iter()
                .find(|(_, n)| *n >= want)
                .map_or(0, |(bound, _)| (*bound).min(max_us))
        };
        Summary {
            calls,
            errors: self.errors.load(Relaxed),
            mean_us: self.sum_us.load(Relaxed) / calls.max(1),
            sum_us: self.sum_us.load(Relaxed),
            p50_us: quantile(0.5),
            p99_us: quantile(0.99),
            max_us,
        }
    }
}

/// Every peer's [`Latency`], by node index (growing as nodes join).
#[derive(Default)]
pub struct Peers(parking_lot::RwLock<Vec<Arc<Latency>>>);

impl Peers {
    /// Node `node`'s.
    pub fn of(&self, node: usize) -> Arc<Latency> {
        if let Some(l) = self.0.read().get(node) {
            return Arc::clone(l);
        }
        let mut all = self.0.write();
        while all.len() <= node {
            all.push(Arc::default());
        }
        Arc::clone(&all[node])
    }

    /// The peers that were sent anything: `(node, latency)`.
    pub fn used(&self) -> Vec<(usize, Arc<Latency>)> {
        self.0
            .read()
            .iter()
            .enumerate()
            .filter(|(_, l)| l.count.load(Relaxed) > 0)
            .map(|(i, l)| (i, Arc::clone(l)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_come_from_power_of_two_buckets() {
        let l = Latency::default();
        for _ in 0..98 {
            l.record(Duration::from_micros(100), true);
        }
        l.record(Duration::from_millis(3), true);
        l.record(Duration::from_secs(2), false);
        let s = l.summary();
        assert_eq!(s.calls, 100);
        assert_eq!(s.errors, 1);
        assert_eq!(s.p50_us, 128, "100 µs is under the 128 µs bound");
        assert_eq!(s.p99_us, 4096, "the 99th request took 3 ms");
        let one = Latency::default();
        one.record(Duration::from_micros(1500), true);
        assert_eq!(one.summary().p99_us, 1500, "no bound above the slowest");
        assert_eq!(s.max_us, 2_000_000);
        assert_eq!(s.mean_us, (98 * 100 + 3000 + 2_000_000) / 100);
        assert_eq!(l.cumulative().last().map(|c| c.1), Some(100));
        let peers = Peers::default();
        peers.of(3).record(Duration::from_micros(5), true);
        assert_eq!(peers.used().len(), 1);
        assert_eq!(peers.used()[0].0, 3);
    }

    #[test]
    fn a_peer_is_unreachable_once_its_last_request_failed_and_it_stayed_silent() {
        let l = Latency::default();
        assert!(!l.unreachable_for(Duration::ZERO), "never asked");
        assert_eq!(l.idle(), None);
        l.record(Duration::from_micros(100), true);
        assert!(!l.unreachable_for(Duration::ZERO), "it answered last");
        l.heard(false);
        assert!(l.unreachable_for(Duration::ZERO));
        assert!(
            !l.unreachable_for(Duration::from_secs(3600)),
            "it answered within the hour"
        );
        std::thread::sleep(Duration::from_millis(30));
        assert!(l.unreachable_for(Duration::from_millis(20)));
        assert!(l.idle().is_some_and(|d| d >= Duration::from_millis(20)));
        l.heard(true);
        assert!(!l.unreachable_for(Duration::ZERO), "it answers again");
        assert!(l.idle().is_some_and(|d| d < Duration::from_millis(20)));
    }
}

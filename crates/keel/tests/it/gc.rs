//! Garbage collection: old versions are reclaimed once no snapshot can see them.
//!
//! An update-only workload on a small key set runs for ten million updates while a
//! long-lived snapshot is opened and closed over and over. Throughout, the number of versions
//! held in memory must stay within what the open snapshot and the collection interval can
//! pin, independent of how long the workload has run; and every long-lived snapshot must
//! still read exactly what it saw when it opened, so reclaiming never takes a version that a
//! snapshot still needs. (About 45 s in a debug build.)

use keel::Db;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const KEYS: u64 = 100;
const UPDATES_PER_TXN: u64 = 10;
/// Commits between the engine's own horizon recomputations (`COLLECT_EVERY` in txn.rs);
/// versions written since the last recomputation cannot be reclaimed yet.
const COLLECT_INTERVAL: u64 = 256;
/// Commits a long-lived snapshot stays open, and commits between two of them.
const HOLD_TXNS: u64 = 400;
const PERIOD_TXNS: u64 = 2000;

fn key(k: u64) -> Vec<u8> {
    format!("key{k:03}").into_bytes()
}

/// Runs `updates` updates; returns the most versions ever held.
fn churn(updates: u64) -> u64 {
    let db = Db::with_options(keel::Options::default().capacity_hint(KEYS as usize));
    db.transact(|txn| {
        for k in 0..KEYS {
            txn.put(&key(k), b"0")?;
        }
        Ok::<_, keel::Error>(())
    })
    .unwrap();
    // Pinned: the snapshot can hold every version written while it is open.
    let bound = 2 * KEYS + UPDATES_PER_TXN * (2 * COLLECT_INTERVAL + HOLD_TXNS);
    let mut rng = StdRng::seed_from_u64(7);
    let mut versions_max = 0;
    let mut held: Option<(keel::Snapshot<'_>, Vec<Option<Vec<u8>>>)> = None;
    let txns = updates.div_ceil(UPDATES_PER_TXN);
    for n in 0..txns {
        if n % PERIOD_TXNS == 0 {
            let snapshot = db.snapshot().unwrap();
            let seen = (0..KEYS).map(|k| snapshot.get(&key(k)).unwrap()).collect();
            held = Some((snapshot, seen));
        }
        if n % PERIOD_TXNS == HOLD_TXNS
            && let Some((snapshot, seen)) = held.take()
        {
            for k in 0..KEYS {
                assert_eq!(
                    snapshot.get(&key(k)).unwrap(),
                    seen[k as usize],
                    "a long-lived snapshot changed under garbage collection (txn {n})"
                );
            }
            let scanned: Vec<Vec<u8>> = snapshot.range::<&[u8]>(..).map(|(_, v)| v).collect();
            let seen: Vec<Vec<u8>> = seen.into_iter().flatten().collect();
            assert_eq!(
                scanned, seen,
                "a long-lived snapshot's scan changed (txn {n})"
            );
        }
        let mut txn = db.begin().unwrap();
        let value = n.to_string();
        for _ in 0..UPDATES_PER_TXN {
            txn.put(&key(rng.random_range(0..KEYS)), value.as_bytes())
                .unwrap();
        }
        txn.commit().unwrap().unwrap();
        if n % 64 == 0 {
            let versions = db.stats().versions;
            assert!(
                versions >= KEYS,
                "every key has a live version, yet only {versions} versions are counted"
            );
            assert!(
                versions <= bound,
                "{versions} versions held after {n} transactions (bound {bound})"
            );
            versions_max = versions_max.max(versions);
        }
    }
    drop(held);
    // Once nothing is pinned, a collection and one more write per key trim every chain.
    db.collect_garbage();
    db.transact(|txn| {
        for k in 0..KEYS {
            txn.put(&key(k), b"last")?;
        }
        Ok::<_, keel::Error>(())
    })
    .unwrap();
    db.collect_garbage();
    db.transact(|txn| {
        for k in 0..KEYS {
            txn.put(&key(k), b"final")?;
        }
        Ok::<_, keel::Error>(())
    })
    .unwrap();
    let versions = db.stats().versions;
    assert!(
        versions <= 2 * KEYS,
        "{versions} versions left for {KEYS} keys after collection"
    );
    versions_max
}

#[test]
fn versions_stay_bounded_over_ten_million_updates() {
    let max = churn(10_000_000);
    eprintln!("at most {max} versions over 10M updates of {KEYS} keys");
}

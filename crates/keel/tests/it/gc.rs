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

/// Sets the flag when dropped during a panic, so that threads looping on it stop.
struct StopOnPanic<'a>(&'a std::sync::atomic::AtomicBool);

impl Drop for StopOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// Reclaiming while snapshots come and go on other threads: writers rewrite every key with
/// one value per transaction (of varying length, so that freed memory is reused for other
/// values), a collector recomputes the horizon non-stop, and readers open snapshots and
/// read-write transactions, dawdle between reads, and must always see one transaction's
/// value under every key. A version freed while a reader could still reach it shows up as a
/// mixed or garbled read (or a crash).
#[test]
fn concurrent_snapshots_never_see_reclaimed_versions() {
    use std::sync::atomic::{AtomicBool, Ordering};
    const KEYS: u64 = 8;
    const WRITES: u64 = 20_000;
    let db = Db::in_memory();
    let done = AtomicBool::new(false);
    let check = |values: Vec<Option<Vec<u8>>>, what: &str| {
        assert!(
            values.windows(2).all(|w| w[0] == w[1]),
            "{what} saw a mix of versions: {values:?}"
        );
    };
    std::thread::scope(|s| {
        let readers: Vec<_> = (0..2)
            .map(|reader| {
                let (db, done) = (&db, &done);
                s.spawn(move || {
                    let mut reads = 0u64;
                    while !done.load(Ordering::Relaxed) {
                        if reader == 0 {
                            let snapshot = db.snapshot().unwrap();
                            let mut values = Vec::new();
                            for k in 0..KEYS {
                                values.push(snapshot.get(&key(k)).unwrap());
                                std::thread::yield_now();
                            }
                            check(values, "a snapshot");
                            let scanned: Vec<_> =
                                snapshot.range::<&[u8]>(..).map(|(_, v)| Some(v)).collect();
                            check(scanned, "a snapshot scan");
                        } else {
                            let mut txn = db.begin().unwrap();
                            let mut values = Vec::new();
                            for k in (0..KEYS).rev() {
                                values.push(txn.get(&key(k)).unwrap());
                                std::thread::yield_now();
                            }
                            check(values, "a transaction");
                        }
                        reads += 1;
                    }
                    reads
                })
            })
            .collect();
        let collector = {
            let (db, done) = (&db, &done);
            s.spawn(move || {
                while !done.load(Ordering::Relaxed) {
                    db.collect_garbage();
                    std::thread::yield_now();
                }
            })
        };
        let writers: Vec<_> = (0..2)
            .map(|writer| {
                let (db, done) = (&db, &done);
                s.spawn(move || {
                    // If this thread panics, stop the others rather than strand them.
                    let _stop = StopOnPanic(done);
                    for n in 0..WRITES {
                        let value = format!("{writer}:{n}:{}", "x".repeat((n % 61) as usize));
                        // Blind writes of the same keys lose the lock race whenever the
                        // other writer is descheduled holding a lock (see
                        // `concurrent_adds_never_conflict`); on a loaded machine that lasts
                        // long. Retry for up to ten seconds: longer means a leaked lock.
                        let started = std::time::Instant::now();
                        loop {
                            let mut txn = db.begin().unwrap();
                            for k in 0..KEYS {
                                txn.put(&key(k), value.as_bytes()).unwrap();
                            }
                            if txn.commit().unwrap().is_ok() {
                                break;
                            }
                            assert!(
                                started.elapsed().as_secs() < 10,
                                "a record stayed locked for ten seconds"
                            );
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        let results: Vec<_> = writers.into_iter().map(|w| w.join()).collect();
        done.store(true, Ordering::Relaxed);
        for result in results {
            if let Err(panic) = result {
                std::panic::resume_unwind(panic);
            }
        }
        collector.join().unwrap();
        for r in readers {
            assert!(r.join().unwrap() > 0, "a reader never finished a read");
        }
    });
    let versions = db.stats().versions;
    assert!(
        versions < 2 * WRITES * KEYS / 10,
        "{versions} versions kept"
    );
}

/// Deleted keys, once reclaimed, leave the version count (`Stats::versions`, which `INFO`
/// reports) along with the record count: it counted their tombstones and older values
/// for good before.
#[test]
fn reclaimed_keys_leave_the_version_count() {
    let db = Db::in_memory();
    let key = |k: u64| format!("gone:{k:06}").into_bytes();
    for round in 0..3 {
        db.transact(|txn| {
            for k in 0..10_000 {
                txn.put(&key(k), format!("v{round}").as_bytes())?;
            }
            Ok::<_, keel::Error>(())
        })
        .unwrap();
    }
    db.transact(|txn| {
        for k in 0..10_000 {
            txn.delete(&key(k))?;
        }
        Ok::<_, keel::Error>(())
    })
    .unwrap();
    assert!(db.stats().versions >= 10_000);
    db.reclaim_deleted(100);
    let stats = db.stats();
    assert_eq!(stats.records, 0);
    assert_eq!(stats.versions, 0, "versions left for no record");
}

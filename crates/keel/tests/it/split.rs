//! Splitting of contended records (Doppel's phase reconciliation): what a split record looks
//! like to snapshots and transactions, stashing, and when records split and join.
//!
//! The serializability checker and the bank test also run with splitting forced
//! (`concurrent::histories_with_split_counters_are_strictly_serializable`,
//! `bank::transfers_with_split_accounts_keep_the_total`); recovery of split operations is in
//! `tests/durability.rs`.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use keel::{ConflictReason, Db, Options, SplitMode};

use crate::StopOnDrop;

fn split_db(mode: SplitMode) -> Db {
    Db::with_options(
        Options::default()
            .split(mode)
            .split_phase(Duration::from_millis(5))
            .split_contention(8),
    )
}

fn int(value: Option<Vec<u8>>) -> i64 {
    value.map_or(0, |v| String::from_utf8(v).unwrap().parse().unwrap())
}

/// Adds 1 to `key` from `threads` threads until `stop`; `acked` counts acknowledged adds.
fn adders<'s>(
    s: &'s std::thread::Scope<'s, '_>,
    db: &'s Db,
    key: &'static [u8],
    threads: usize,
    stop: &'s AtomicBool,
    acked: &'s AtomicI64,
) {
    for _ in 0..threads {
        s.spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let mut txn = db.begin().unwrap();
                txn.add(key, 1).unwrap();
                if txn.commit().unwrap().is_ok() {
                    acked.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
    }
}

/// Adds to `hot` from one thread until it is split, then stops; `acked` counts the adds.
fn heat(db: &Db, acked: &AtomicI64) {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        adders(s, db, b"hot", 1, &stop, acked);
        wait_split(db);
        stop.store(true, Ordering::Relaxed);
    });
}

/// Waits (at most 20 s) until `hot` is split and has taken a few split-only commits.
fn wait_split(db: &Db) {
    let started = Instant::now();
    while db.split_keys().is_empty() || db.stats().split_commits < 10 {
        assert!(started.elapsed() < Duration::from_secs(20), "never split");
        std::thread::yield_now();
    }
}

/// A snapshot of a split record sees every add acknowledged before it began (strictness) and
/// keeps seeing the same value while adds continue (a snapshot never changes).
#[test]
fn snapshots_of_a_split_record_are_strict_and_stable() {
    let db = split_db(SplitMode::Force);
    db.transact(|txn| txn.add(b"hot", 1)).unwrap();
    let (stop, acked) = (AtomicBool::new(false), AtomicI64::new(1));
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        adders(s, &db, b"hot", 2, &stop, &acked);
        let started = Instant::now();
        let mut checks = 0;
        while checks < 300 || db.stats().split_commits < 1000 {
            assert!(started.elapsed() < Duration::from_secs(30), "adds stalled");
            let acked_before = acked.load(Ordering::SeqCst);
            let snapshot = db.snapshot().unwrap();
            let first = int(snapshot.get(b"hot").unwrap());
            assert!(
                first >= acked_before,
                "snapshot saw {first} after {acked_before} adds were acknowledged"
            );
            std::thread::sleep(Duration::from_micros(200));
            assert_eq!(
                int(snapshot.get(b"hot").unwrap()),
                first,
                "snapshot changed"
            );
            let ranged: Vec<_> = snapshot
                .range(b"hot".as_slice()..=b"hot".as_slice())
                .collect();
            assert_eq!(ranged.len(), 1);
            assert_eq!(int(Some(ranged[0].1.clone())), first, "range disagrees");
            checks += 1;
        }
        stop.store(true, Ordering::Relaxed);
    });
    let total = acked.load(Ordering::SeqCst);
    assert_eq!(int(db.snapshot().unwrap().get(b"hot").unwrap()), total);
    let stats = db.stats();
    assert!(stats.split_phases > 1, "{stats:?}");
    assert!(stats.split_commits > 0, "{stats:?}");
}

/// A transaction prepared for a two-phase commit holds the watermark below its timestamp
/// until its decision, which in a cluster comes from another node. A snapshot reads a split
/// record meanwhile without waiting for that decision (it used to commit an empty timestamp
/// and wait for the watermark to pass it), and an add that commits after the read does not
/// change what the snapshot sees: it is tagged above the snapshot, so it is acknowledged only
/// once the decision lets the watermark pass it.
#[test]
fn a_split_record_reads_at_once_while_a_prepared_transaction_holds_the_watermark() {
    let db = split_db(SplitMode::Force);
    db.transact(|txn| txn.add(b"hot", 1)).unwrap();
    let acked = AtomicI64::new(1);
    heat(&db, &acked);
    let total = acked.load(Ordering::SeqCst);
    let mut txn = db.begin().unwrap();
    txn.put(b"elsewhere", b"x").unwrap();
    let prepared = txn.prepare(|_| Vec::new()).unwrap().expect("no conflict");
    let snapshot = db.snapshot().unwrap();
    assert!(snapshot.read_ts() < prepared.ts());
    let (read, was_read) = std::sync::mpsc::channel();
    let (added, was_added) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| read.send(int(snapshot.get(b"hot").unwrap())).unwrap());
        let Ok(first) = was_read.recv_timeout(Duration::from_secs(5)) else {
            prepared.commit().unwrap();
            panic!("a read of the split record waited for the prepared transaction's decision");
        };
        assert_eq!(first, total);
        s.spawn(|| {
            db.transact(|txn| txn.add(b"hot", 1000)).unwrap();
            added.send(()).unwrap();
        });
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(
            int(snapshot.get(b"hot").unwrap()),
            first,
            "an add after the read changed the snapshot"
        );
        assert!(
            was_added.try_recv().is_err(),
            "an add acknowledged while the watermark stayed below it"
        );
        prepared.commit().unwrap();
        was_added
            .recv_timeout(Duration::from_secs(10))
            .expect("the add, once the prepared transaction is decided");
    });
    assert_eq!(
        int(snapshot.get(b"hot").unwrap()),
        total,
        "the snapshot changed"
    );
    assert_eq!(
        int(db.snapshot().unwrap().get(b"hot").unwrap()),
        total + 1000
    );
}

/// A read-modify-write of a split record (not commutative) is stashed and then runs in the
/// joined phase: no update is lost, and it never waits long.
#[test]
fn read_modify_writes_of_a_split_record_are_stashed_not_lost() {
    // Bounded by the phase length (5 ms) times a few retries; generous for a loaded machine.
    const WAIT_MAX: Duration = Duration::from_secs(5);
    let db = split_db(SplitMode::Force);
    db.transact(|txn| txn.add(b"hot", 1)).unwrap();
    let (stop, acked) = (AtomicBool::new(false), AtomicI64::new(1));
    let mut slowest = Duration::ZERO;
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        adders(s, &db, b"hot", 2, &stop, &acked);
        while db.stats().split_commits < 100 {
            std::thread::yield_now();
        }
        for _ in 0..20 {
            let started = Instant::now();
            // Two adders commit to the key without pause: in the joined phase the read-modify-
            // write can lose its validation to them dozens of times running on a slow build
            // (plain optimistic contention, which the server queues with its hot-key locks;
            // `transact` gives up after 64). What must hold is that it is never lost and never
            // waits long, so a transact that gave up is run again, within the bound below.
            loop {
                match db.transact(|txn| {
                    let v = int(txn.get(b"hot")?);
                    txn.put(b"hot", (v + 1000).to_string().as_bytes())
                }) {
                    Ok(()) => break,
                    Err(keel::TransactError::Conflicts { .. }) if started.elapsed() < WAIT_MAX => {}
                    Err(e) => panic!("a read-modify-write failed: {e:?}"),
                }
            }
            slowest = slowest.max(started.elapsed());
        }
        stop.store(true, Ordering::Relaxed);
    });
    let total = acked.load(Ordering::SeqCst) + 20 * 1000;
    assert_eq!(int(db.snapshot().unwrap().get(b"hot").unwrap()), total);
    let stats = db.stats();
    assert!(stats.split_stashes > 0, "{stats:?}");
    assert!(
        slowest < WAIT_MAX,
        "a stashed transaction waited {slowest:?}"
    );
}

/// A hand-written retry loop sees the `Split` reason, and `wait_joined` lets the retry run.
#[test]
fn a_read_of_a_split_record_conflicts_with_reason_split() {
    let db = split_db(SplitMode::Force);
    db.transact(|txn| txn.add(b"hot", 1)).unwrap();
    let (stop, acked) = (AtomicBool::new(false), AtomicI64::new(1));
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        adders(s, &db, b"hot", 1, &stop, &acked);
        wait_split(&db);
        let mut saw_split = false;
        let mut _joined = None;
        for _ in 0..1000 {
            let mut txn = db.begin().unwrap();
            let v = int(txn.get(b"hot").unwrap());
            txn.put(b"copy", v.to_string().as_bytes()).unwrap();
            match txn.commit().unwrap() {
                Ok(_) => {
                    if saw_split {
                        break;
                    }
                }
                // In the joined phase an ordinary conflict with the adders is possible too.
                Err(c) if c.reason != ConflictReason::Split => {}
                Err(c) => {
                    assert!(c.to_string().contains("split"), "{c}");
                    saw_split = true;
                    _joined = Some(db.wait_joined());
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        assert!(saw_split, "never read the record while split");
    });
}

/// `Auto` splits a record whose lock commits keep waiting for, and joins it for good once
/// reads dominate.
#[test]
fn auto_splits_contended_records_and_joins_read_mostly_ones() {
    let db = split_db(SplitMode::Auto);
    let (stop, acked) = (AtomicBool::new(false), AtomicI64::new(0));
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        adders(s, &db, b"hot", 2, &stop, &acked);
        let started = Instant::now();
        while db.split_keys() != [b"hot".to_vec()] {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "a contended counter was never split: {:?}",
                db.stats()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        stop.store(true, Ordering::Relaxed);
    });
    // Now only reads: the record goes idle and reads dominate, so it is joined.
    let started = Instant::now();
    while !db.split_keys().is_empty() {
        assert!(started.elapsed() < Duration::from_secs(20), "never joined");
        db.transact(|txn| {
            let v = int(txn.get(b"hot")?);
            txn.put(b"seen", v.to_string().as_bytes())
        })
        .unwrap();
    }
    let stats = db.stats();
    assert!(
        stats.split_splits >= 1 && stats.split_joins >= 1,
        "{stats:?}"
    );
    assert_eq!(
        int(db.snapshot().unwrap().get(b"hot").unwrap()),
        acked.load(Ordering::SeqCst)
    );
}

/// `Off` never splits, however contended.
#[test]
fn off_never_splits() {
    let db = split_db(SplitMode::Off);
    let (stop, acked) = (AtomicBool::new(false), AtomicI64::new(0));
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        adders(s, &db, b"hot", 2, &stop, &acked);
        std::thread::sleep(Duration::from_millis(100));
        stop.store(true, Ordering::Relaxed);
    });
    let stats = db.stats();
    assert_eq!(stats.split_commits, 0, "{stats:?}");
    assert!(db.split_keys().is_empty());
}

/// Every splittable kind merges like its operations applied one by one: max, min, ordered put
/// (ties broken by payload) and top-k, from several threads at once.
#[test]
fn every_splittable_kind_reconciles_to_the_serial_result() {
    let db = split_db(SplitMode::Force);
    db.transact(|txn| {
        txn.max(b"max", 0)?;
        txn.min(b"min", 0)?;
        txn.put_ordered(b"ordered", 0, b"")?;
        txn.top_k_insert(b"top", 3, 0, b"zero")
    })
    .unwrap();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        for t in 0..2i64 {
            let (db, stop) = (&db, &stop);
            s.spawn(move || {
                let mut i = 0i64;
                while !stop.load(Ordering::Relaxed) || i < 2000 {
                    let n = (i * 7919 + t * 104_729) % 10_007;
                    db.transact(|txn| {
                        txn.max(b"max", n)?;
                        txn.min(b"min", -n)?;
                        txn.put_ordered(b"ordered", (n % 100) as u64, &n.to_be_bytes())?;
                        txn.top_k_insert(b"top", 3, n, format!("m{}", n % 50).as_bytes())
                    })
                    .unwrap();
                    i += 1;
                }
            });
        }
        while db.stats().split_commits < 500 {
            std::thread::yield_now();
        }
        stop.store(true, Ordering::Relaxed);
    });
    // The serial result over every value any thread could have drawn is what some order of
    // the committed operations gives; recompute it from what the threads actually drew.
    let snapshot = db.snapshot().unwrap();
    let max = int(snapshot.get(b"max").unwrap());
    let min = int(snapshot.get(b"min").unwrap());
    assert_eq!(max, -min, "max and min saw different operations");
    let (order, payload) = keel::decode_ordered(&snapshot.get(b"ordered").unwrap().unwrap())
        .map(|(o, p)| (o, p.to_vec()))
        .unwrap();
    assert_eq!(order, 99, "some draw had n % 100 == 99");
    let n = i64::from_be_bytes(payload.try_into().unwrap());
    assert_eq!(n % 100, 99);
    let top = keel::decode_top_k(&snapshot.get(b"top").unwrap().unwrap()).unwrap();
    assert_eq!(top.len(), 3);
    assert!(top.windows(2).all(|w| w[0].0 >= w[1].0), "{top:?}");
    assert_eq!(top[0].0, max, "the top score is the maximum");
    assert!(db.stats().split_commits > 0);
}

/// `Txn::may_wait_for_split` answers yes exactly for a transaction whose commit must wait for
/// a split record's reconciliation: a put to it, or a tracked add; no for an add its slices
/// take, for writes elsewhere, and for anything while nothing is split.
#[test]
fn only_writes_a_split_record_cannot_take_may_wait() {
    let db = split_db(SplitMode::Force);
    let quiet = |f: &dyn Fn(&mut keel::Txn<'_>)| {
        let mut txn = db.begin().unwrap();
        f(&mut txn);
        txn.may_wait_for_split()
    };
    db.transact(|txn| txn.put(b"hot", b"1")).unwrap();
    assert!(
        !quiet(&|t| t.put(b"hot", b"1").unwrap()),
        "nothing is split yet"
    );
    let (stop, acked) = (AtomicBool::new(false), AtomicI64::new(1));
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        adders(s, &db, b"hot", 1, &stop, &acked);
        while db.split_keys().is_empty() {
            std::thread::yield_now();
        }
        assert!(
            quiet(&|t| t.put(b"hot", b"1").unwrap()),
            "a put to the split record"
        );
        assert!(
            quiet(&|t| {
                t.add(b"hot", 1).unwrap();
                t.track(b"hot").unwrap();
            }),
            "a tracked add"
        );
        assert!(
            !quiet(&|t| t.add(b"hot", 1).unwrap()),
            "an add goes to a slice"
        );
        assert!(!quiet(&|t| t.put(b"cold", b"1").unwrap()), "another record");
        stop.store(true, Ordering::Relaxed);
    });
}

/// A prepare (two-phase commit's vote) that meets a split record, writing or reading it,
/// gives up at once with `ConflictReason::Split`, having asked for the joined phase: it can
/// neither write to a slice nor hold the record while the splitter does. Run again while
/// holding `wait_joined`'s guard (again, should the guard's bounded hold run out first), it
/// prepares and commits, and nothing is lost.
#[test]
fn a_prepare_meeting_a_split_record_runs_again_in_the_joined_phase() {
    let db = split_db(SplitMode::Force);
    db.transact(|txn| txn.add(b"hot", 1)).unwrap();
    let acked = AtomicI64::new(1);
    // Each case heats the record anew: once the adds stop, it is joined back in time.
    for read in [false, true] {
        let mut rounds = 0;
        loop {
            rounds += 1;
            heat(&db, &acked);
            let mut refused = false;
            for _ in 0..10_000 {
                let mut txn = db.begin().unwrap();
                if read {
                    let v = int(txn.get(b"hot").unwrap());
                    txn.put(b"seen", v.to_string().as_bytes()).unwrap();
                } else {
                    txn.add(b"hot", 0).unwrap();
                }
                match txn.prepare(|_| Vec::new()).unwrap() {
                    Err(c) if c.reason == ConflictReason::Split => {
                        refused = true;
                        break;
                    }
                    // The reconciliation committed between the read and the prepare.
                    Err(c) if read && c.reason == ConflictReason::ReadChanged => {}
                    Err(c) => panic!("{c}"),
                    // Caught in a joined phase: give it back and try again.
                    Ok(prepared) => prepared.abort().unwrap(),
                }
            }
            if refused {
                break;
            }
            assert!(
                rounds < 5,
                "a prepare never met the record split (read: {read}, {rounds} heats)"
            );
        }
        // The guard holds the joined phase for at most a quarter phase (1.25 ms here): a
        // loaded machine may let the next split phase open before the prepare runs, and the
        // prepare then gives up as before. Another guard, another try, for up to 10 s.
        let mut tries = 0;
        let trying = Instant::now();
        let prepared = loop {
            tries += 1;
            let _joined = db.wait_joined();
            let mut txn = db.begin().unwrap();
            if read {
                let v = int(txn.get(b"hot").unwrap());
                txn.put(b"seen", v.to_string().as_bytes()).unwrap();
            } else {
                txn.add(b"hot", 100).unwrap();
            }
            match txn.prepare(|_| Vec::new()).unwrap() {
                Ok(prepared) => break prepared,
                Err(c)
                    if c.reason == ConflictReason::Split
                        && trying.elapsed() < Duration::from_secs(10) => {}
                Err(c) => panic!("prepares in the joined phase, try {tries}: {c}"),
            }
        };
        prepared.commit().unwrap();
    }
    assert_eq!(
        int(db.snapshot().unwrap().get(b"hot").unwrap()),
        acked.load(Ordering::SeqCst) + 100
    );
    assert_eq!(
        int(db.snapshot().unwrap().get(b"seen").unwrap()),
        acked.load(Ordering::SeqCst) + 100
    );
}

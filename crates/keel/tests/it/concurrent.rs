//! Concurrent histories against the engine, checked for strict serializability.
//!
//! Several threads run random transactions over a handful of list keys: appends (read the
//! list, put it back with a new unique element), point reads, and range reads that go
//! forward, backward, from both ends, or stop early (so that the engine's "only the part
//! actually read is validated" logic is exercised), plus read-only snapshots and transactions
//! dropped without committing. Every operation and its result is recorded with real-time
//! ticks and the engine's timestamps, and [`history::check`](crate::history::check) must find
//! no cycle, no dirty or garbage read, and no contradiction between dependencies and the
//! timestamps. One variant mixes in commutative `add`s to counters; they carry no read
//! dependency, so the checker verifies counter reads against the committed deltas instead.

use std::sync::atomic::{AtomicU64, Ordering};

use std::time::Duration;

use keel::{Db, Options, SplitMode};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::history::{
    Key, Op, Outcome, Position, Report, TxnRecord, check, decode_list, list_key, read_then_append,
};

/// List keys `k00..k05`: few, so that transactions contend.
const KEYS: Key = 6;
/// Counter keys `c0..c2` (they sort before the list keys, outside every list range).
const COUNTERS: Key = 3;

fn list_key_id(key: &[u8]) -> Key {
    let text = std::str::from_utf8(key).expect("keys are ASCII");
    text[1..].parse().expect("list keys are k + number")
}

fn counter_key(c: Key) -> Vec<u8> {
    format!("c{c}").into_bytes()
}

fn counter_value(value: Option<Vec<u8>>) -> i64 {
    value.map_or(0, |v| {
        std::str::from_utf8(&v)
            .expect("counters are ASCII")
            .parse()
            .expect("counters are integers")
    })
}

#[derive(Clone, Copy)]
struct Config {
    threads: u64,
    txns_per_thread: u64,
    with_adds: bool,
    /// Splitting of contended records (`Force`: every counter an add touches).
    split: SplitMode,
}

/// Real time, in ticks: every tick is unique and ordered.
struct Clock(AtomicU64);

impl Clock {
    fn tick(&self) -> u64 {
        self.0.fetch_add(1, Ordering::SeqCst)
    }
}

/// Reads a range of list keys the way `mode` says and records the part actually covered.
/// Modes: 0 forward, 1 backward, 2 alternating ends; `limit` stops early.
fn range_ops<'a, I>(mut it: I, lo: Key, hi: Key, mode: u32, limit: Option<usize>) -> Vec<Op>
where
    I: DoubleEndedIterator<Item = (Vec<u8>, Vec<u8>)> + 'a,
{
    let mut front = Vec::new();
    let mut back = Vec::new();
    let mut exhausted = false;
    loop {
        if limit.is_some_and(|l| front.len() + back.len() >= l) {
            break;
        }
        let from_back = match mode {
            0 => false,
            1 => true,
            _ => (front.len() + back.len()) % 2 == 1,
        };
        let item = if from_back { it.next_back() } else { it.next() };
        let Some((k, v)) = item else {
            exhausted = true;
            break;
        };
        let item = (list_key_id(&k), decode_list(Some(&v)));
        if from_back {
            back.push(item);
        } else {
            front.push(item);
        }
    }
    drop(it);
    back.reverse();
    if exhausted {
        front.extend(back);
        return vec![Op::Range {
            lo,
            hi,
            found: front,
        }];
    }
    let mut ops = Vec::new();
    if let Some(&(last, _)) = front.last() {
        ops.push(Op::Range {
            lo,
            hi: last,
            found: front,
        });
    }
    if let Some(&(first, _)) = back.first() {
        ops.push(Op::Range {
            lo: first,
            hi,
            found: back,
        });
    }
    ops
}

fn random_range(rng: &mut StdRng) -> (Key, Key, u32, Option<usize>) {
    let lo = rng.random_range(0..KEYS);
    let hi = rng.random_range(lo..KEYS);
    let mode = rng.random_range(0..3);
    let limit = rng.random_bool(0.4).then(|| rng.random_range(0..4));
    (lo, hi, mode, limit)
}

fn run_thread(db: &Db, clock: &Clock, config: Config, seed: u64, thread: u64) -> Vec<TxnRecord> {
    let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(1_000_003).wrapping_add(thread));
    let mut history = Vec::new();
    let mut next_elem = thread << 32;
    for n in 0..config.txns_per_thread {
        let name = format!("t{thread}.{n}");
        if rng.random_bool(0.15) {
            history.push(run_snapshot(db, clock, config, &mut rng, name));
            continue;
        }
        let began = clock.tick();
        let mut txn = db.begin().expect("few transactions are open");
        let read_ts = txn.read_ts().0;
        let mut ops = Vec::new();
        let mut appended = Vec::new();
        let mut wrote = false;
        for _ in 0..rng.random_range(1..=4) {
            let choice = rng.random_range(0..100);
            if choice < 40 {
                let k = rng.random_range(0..KEYS);
                wrote |=
                    read_then_append(&mut txn, k, true, &mut next_elem, &mut ops, &mut appended);
            } else if choice < 65 {
                let k = rng.random_range(0..KEYS);
                let value = decode_list(txn.get(&list_key(k)).unwrap().as_deref());
                ops.push(Op::Read { key: k, value });
            } else if choice < 85 || !config.with_adds {
                let (lo, hi, mode, limit) = random_range(&mut rng);
                let (lo_key, hi_key) = (list_key(lo), list_key(hi));
                let it = txn.range(lo_key.as_slice()..=hi_key.as_slice());
                ops.extend(range_ops(it, lo, hi, mode, limit));
            } else if choice < 95 {
                let counter = rng.random_range(0..COUNTERS);
                let delta = rng.random_range(1..=5);
                txn.add(&counter_key(counter), delta).unwrap();
                ops.push(Op::Add { counter, delta });
                wrote = true;
            } else {
                let counter = rng.random_range(0..COUNTERS);
                let value = counter_value(txn.get(&counter_key(counter)).unwrap());
                ops.push(Op::CounterRead { counter, value });
            }
        }
        let (outcome, position) = if rng.random_bool(0.05) {
            drop(txn);
            (Outcome::Aborted, None)
        } else {
            match txn
                .commit_detailed()
                .expect("no commutative operation can fail here")
            {
                Ok(c) if c.split_only => (Outcome::Committed, Some(Position::After(c.ts.0))),
                Ok(c) if wrote => (Outcome::Committed, Some(Position::Commit(c.ts.0))),
                Ok(keel::Committed { ts, .. }) => {
                    assert_eq!(
                        ts.0, read_ts,
                        "a read-only transaction commits at its snapshot"
                    );
                    (Outcome::Committed, Some(Position::ReadAt(ts.0)))
                }
                Err(_conflict) => (Outcome::Aborted, None),
            }
        };
        let ended = clock.tick();
        history.push(TxnRecord {
            name,
            ops,
            outcome,
            position,
            read_ts: Some(read_ts),
            time: Some((began, ended)),
        });
    }
    history
}

fn run_snapshot(
    db: &Db,
    clock: &Clock,
    config: Config,
    rng: &mut StdRng,
    name: String,
) -> TxnRecord {
    let began = clock.tick();
    let snapshot = db.snapshot().expect("few transactions are open");
    let read_ts = snapshot.read_ts().0;
    let mut ops = Vec::new();
    for _ in 0..rng.random_range(1..=3) {
        match rng.random_range(0..3) {
            0 => {
                let k = rng.random_range(0..KEYS);
                let value = decode_list(snapshot.get(&list_key(k)).unwrap().as_deref());
                ops.push(Op::Read { key: k, value });
            }
            1 => {
                let (lo, hi, mode, limit) = random_range(rng);
                let (lo_key, hi_key) = (list_key(lo), list_key(hi));
                let it = snapshot.range(lo_key.as_slice()..=hi_key.as_slice());
                ops.extend(range_ops(it, lo, hi, mode, limit));
            }
            _ if config.with_adds => {
                let counter = rng.random_range(0..COUNTERS);
                let value = counter_value(snapshot.get(&counter_key(counter)).unwrap());
                ops.push(Op::CounterRead { counter, value });
            }
            _ => {}
        }
    }
    drop(snapshot);
    let ended = clock.tick();
    TxnRecord {
        name,
        ops,
        outcome: Outcome::Committed,
        position: Some(Position::ReadAt(read_ts)),
        read_ts: Some(read_ts),
        time: Some((began, ended)),
    }
}

/// Runs one seed and checks its history; returns the checker's report.
fn run(seed: u64, config: Config) -> Report {
    // Short phases, so that a run crosses many split phases and reconciliations.
    let db = Db::with_options(
        Options::default()
            .split(config.split)
            .split_phase(Duration::from_millis(2)),
    );
    let clock = Clock(AtomicU64::new(0));
    let mut history: Vec<TxnRecord> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..config.threads)
            .map(|thread| {
                let (db, clock) = (&db, &clock);
                s.spawn(move || run_thread(db, clock, config, seed, thread))
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("worker panicked"))
            .collect()
    });

    // A final snapshot that began after everything finished must see every committed write.
    let began = clock.tick();
    let snapshot = db.snapshot().unwrap();
    let mut ops = range_ops(
        snapshot.range(list_key(0).as_slice()..=list_key(KEYS - 1).as_slice()),
        0,
        KEYS - 1,
        0,
        None,
    );
    for counter in 0..COUNTERS {
        let value = counter_value(snapshot.get(&counter_key(counter)).unwrap());
        ops.push(Op::CounterRead { counter, value });
    }
    let read_ts = snapshot.read_ts().0;
    drop(snapshot);
    history.push(TxnRecord {
        name: "final".into(),
        ops,
        outcome: Outcome::Committed,
        position: Some(Position::ReadAt(read_ts)),
        read_ts: Some(read_ts),
        time: Some((began, clock.tick())),
    });

    let stats = db.stats();
    match check(&history) {
        Ok(report) => {
            let aborts =
                stats.aborts_read_changed + stats.aborts_phantom + stats.aborts_write_locked;
            if config.split == SplitMode::Force {
                assert!(
                    stats.split_commits > 0 && stats.split_phases > 0,
                    "nothing went to a split record's slices: {stats:?}"
                );
            }
            eprintln!("seed {seed}: {report:?}; engine aborts {aborts}");
            report
        }
        Err(anomaly) => panic!("seed {seed}: history is not strictly serializable: {anomaly}"),
    }
}

const PLAIN: Config = Config {
    threads: 4,
    txns_per_thread: 400,
    with_adds: false,
    split: SplitMode::Off,
};

fn assert_nontrivial(report: &Report) {
    assert!(report.committed > 100, "{report:?}");
    assert!(
        report.rw_edges > 0,
        "no anti-dependency was ever observed: {report:?}"
    );
    assert!(
        report.range_keys > 0,
        "no range read returned anything: {report:?}"
    );
    assert!(report.list_len_max > 20, "{report:?}");
}

#[test]
fn list_append_histories_are_strictly_serializable() {
    for seed in 1..=4 {
        assert_nontrivial(&run(seed, PLAIN));
    }
}

#[test]
fn histories_with_commutative_adds_are_strictly_serializable() {
    for seed in 101..=102 {
        let report = run(
            seed,
            Config {
                with_adds: true,
                ..PLAIN
            },
        );
        assert_nontrivial(&report);
    }
}

/// The same histories with every counter split (Doppel): adds go to per-core slices, reads of
/// counters see exactly the adds at or below their snapshot, and the checker still finds no
/// cycle.
#[test]
fn histories_with_split_counters_are_strictly_serializable() {
    for seed in 201..=203 {
        let report = run(
            seed,
            Config {
                with_adds: true,
                split: SplitMode::Force,
                ..PLAIN
            },
        );
        assert_nontrivial(&report);
    }
}

/// The guarantee that concurrent commutative operations never conflict, under real
/// contention: four threads add to the same two counters, whether the counters are split or
/// not. Short phases make commits cross phase boundaries (a commit that locked one counter
/// while the other went to a slice once deadlocked here when the phase closed under it).
#[test]
fn concurrent_adds_never_conflict() {
    for mode in [SplitMode::Off, SplitMode::Auto, SplitMode::Force] {
        adds_never_conflict(mode);
    }
}

fn adds_never_conflict(mode: SplitMode) {
    const THREADS: i64 = 4;
    const TXNS: i64 = 3000;
    let db = Db::with_options(
        Options::default()
            .split(mode)
            .split_phase(Duration::from_millis(1)),
    );
    let conflicts: u64 = std::thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS)
            .map(|_| {
                let db = &db;
                s.spawn(move || {
                    let mut conflicts = 0;
                    for _ in 0..TXNS {
                        loop {
                            let mut txn = db.begin().unwrap();
                            txn.add(b"hits", 1).unwrap();
                            txn.add(b"total", 2).unwrap();
                            match txn.commit().unwrap() {
                                Ok(_) => break,
                                Err(_) => conflicts += 1,
                            }
                        }
                    }
                    conflicts
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).sum()
    });
    let snapshot = db.snapshot().unwrap();
    assert_eq!(
        counter_value(snapshot.get(b"hits").unwrap()),
        THREADS * TXNS,
        "{mode:?}"
    );
    assert_eq!(
        counter_value(snapshot.get(b"total").unwrap()),
        2 * THREADS * TXNS,
        "{mode:?}"
    );
    assert_eq!(
        conflicts, 0,
        "commutative adds conflicted {conflicts} times ({mode:?})"
    );
}

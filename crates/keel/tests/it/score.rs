//! Score adds (`Txn::score_add`): a commutative add to a score that keeps the score's index
//! entry in step. Concurrent adds of one key never conflict, the index holds exactly one
//! entry per key at the score the key holds, a transaction reads its own adds, and readers of
//! the index conflict with adds that move entries under them.

use std::sync::atomic::{AtomicBool, Ordering};

use keel::{CommitError, ConflictReason, Db, Error, Options, decode_score_value, encode_score};

use crate::StopOnDrop;

const PREFIX: &[u8] = b"i/";

fn key(member: &[u8]) -> Vec<u8> {
    [b"s/", member].concat()
}

fn index(score: f64, member: &[u8]) -> Vec<u8> {
    [PREFIX, &encode_score(score).to_be_bytes()[..], member].concat()
}

fn add(txn: &mut keel::Txn<'_>, member: &[u8], delta: f64) {
    txn.score_add(&key(member), delta, PREFIX, member).unwrap();
}

/// Every index entry in `db`, as (score, member), in index order.
fn entries(db: &Db) -> Vec<(f64, Vec<u8>)> {
    let snapshot = db.snapshot().unwrap();
    snapshot
        .range(PREFIX..b"i0".as_slice())
        .map(|(k, _)| {
            let score = decode_score_value(&k[2..10]).unwrap();
            (score, k[10..].to_vec())
        })
        .collect()
}

fn score(db: &Db, member: &[u8]) -> Option<f64> {
    let value = db.snapshot().unwrap().get(&key(member)).unwrap();
    value.map(|v| decode_score_value(&v).unwrap())
}

#[test]
fn concurrent_adds_of_one_key_do_not_conflict_and_move_its_index_entry() {
    let db = Db::in_memory();
    db.transact(|txn| txn.score_add(&key(b"m"), 1.0, PREFIX, b"m"))
        .unwrap();
    let mut a = db.begin().unwrap();
    let mut b = db.begin().unwrap();
    add(&mut a, b"m", 10.0);
    add(&mut b, b"m", 0.5);
    let (ta, tb) = (a.track(&key(b"m")).unwrap(), b.track(&key(b"m")).unwrap());
    let committed_a = a.commit_detailed().unwrap().unwrap();
    let committed_b = b.commit_detailed().unwrap().unwrap();
    assert_eq!(
        committed_a.value(ta).and_then(decode_score_value),
        Some(11.0)
    );
    assert_eq!(
        committed_b.value(tb).and_then(decode_score_value),
        Some(11.5)
    );
    assert_eq!(score(&db, b"m"), Some(11.5));
    assert_eq!(entries(&db), [(11.5, b"m".to_vec())]);
    assert_eq!(db.stats().aborts_read_changed, 0);
    assert_eq!(db.stats().aborts_write_locked, 0);
}

#[test]
fn a_transaction_reads_its_own_adds_in_the_key_and_in_the_index() {
    let db = Db::in_memory();
    db.transact(|txn| {
        txn.score_add(&key(b"a"), 5.0, PREFIX, b"a")?;
        txn.score_add(&key(b"b"), 7.0, PREFIX, b"b")
    })
    .unwrap();
    let mut txn = db.begin().unwrap();
    add(&mut txn, b"a", 10.0);
    add(&mut txn, b"a", 1.0);
    // The range over the index sees `a` moved past `b`.
    let seen: Vec<Vec<u8>> = txn
        .range(PREFIX..b"i0".as_slice())
        .map(|(k, _)| k)
        .collect();
    assert_eq!(seen, [index(7.0, b"b"), index(16.0, b"a")]);
    assert_eq!(
        txn.get(&key(b"a"))
            .unwrap()
            .as_deref()
            .and_then(decode_score_value),
        Some(16.0)
    );
    // An add after the read resolves against what the transaction knows.
    add(&mut txn, b"a", 1.0);
    txn.commit().unwrap().unwrap();
    assert_eq!(entries(&db), [(7.0, b"b".to_vec()), (17.0, b"a".to_vec())]);
}

#[test]
fn removing_a_key_with_pending_adds_removes_its_index_entry() {
    // As ZREM after ZINCRBY in one MULTI: read the score (the adds resolve), delete the key
    // and its entry at that score.
    let db = Db::in_memory();
    db.transact(|txn| txn.score_add(&key(b"m"), 2.0, PREFIX, b"m"))
        .unwrap();
    let mut txn = db.begin().unwrap();
    add(&mut txn, b"m", 3.0);
    let now = decode_score_value(&txn.get(&key(b"m")).unwrap().unwrap()).unwrap();
    assert_eq!(now, 5.0);
    txn.delete(&key(b"m")).unwrap();
    txn.delete(&index(now, b"m")).unwrap();
    txn.commit().unwrap().unwrap();
    assert_eq!(score(&db, b"m"), None);
    assert_eq!(entries(&db), []);

    // A blind write of an index entry of a pending add resolves the add first, too.
    db.transact(|txn| txn.score_add(&key(b"n"), 1.0, PREFIX, b"n"))
        .unwrap();
    let mut txn = db.begin().unwrap();
    add(&mut txn, b"n", 1.0);
    txn.put(&index(9.0, b"n"), b"").unwrap();
    txn.commit().unwrap().unwrap();
    assert_eq!(entries(&db), [(2.0, b"n".to_vec()), (9.0, b"n".to_vec())]);
}

#[test]
fn an_add_after_a_write_of_the_key_applies_to_what_was_written() {
    let db = Db::in_memory();
    let mut txn = db.begin().unwrap();
    txn.put(&key(b"m"), &encode_score(4.0).to_be_bytes())
        .unwrap();
    txn.put(&index(4.0, b"m"), b"").unwrap();
    add(&mut txn, b"m", 2.0);
    txn.commit().unwrap().unwrap();
    assert_eq!(score(&db, b"m"), Some(6.0));
    assert_eq!(entries(&db), [(6.0, b"m".to_vec())]);
}

#[test]
fn a_range_reader_of_the_index_conflicts_with_an_add_that_moves_an_entry_into_it() {
    let db = Db::in_memory();
    db.transact(|txn| txn.score_add(&key(b"m"), 1.0, PREFIX, b"m"))
        .unwrap();
    let mut reader = db.begin().unwrap();
    // Reads the scores from 10 up: nothing there yet.
    let lo = index(10.0, b"");
    assert_eq!(reader.range(lo.as_slice()..b"i0".as_slice()).count(), 0);
    reader.put(b"report", b"empty").unwrap();
    db.transact(|txn| txn.score_add(&key(b"m"), 20.0, PREFIX, b"m"))
        .unwrap();
    let conflict = reader.commit().unwrap().unwrap_err();
    assert_eq!(conflict.reason, ConflictReason::Phantom);
}

#[test]
fn a_sum_that_is_not_a_number_fails_the_commit_and_writes_nothing() {
    let db = Db::in_memory();
    db.transact(|txn| txn.score_add(&key(b"m"), f64::INFINITY, PREFIX, b"m"))
        .unwrap();
    let mut txn = db.begin().unwrap();
    add(&mut txn, b"m", f64::NEG_INFINITY);
    txn.put(b"other", b"x").unwrap();
    match txn.commit() {
        Err(CommitError::Apply(Error::NotANumber { key: k })) => assert_eq!(k, key(b"m")),
        other => panic!("expected NotANumber, got {other:?}"),
    }
    assert_eq!(db.snapshot().unwrap().get(b"other").unwrap(), None);
    assert_eq!(entries(&db), [(f64::INFINITY, b"m".to_vec())]);

    let mut txn = db.begin().unwrap();
    assert!(matches!(
        txn.score_add(&key(b"m"), f64::NAN, PREFIX, b"m"),
        Err(Error::NotANumber { .. })
    ));
    // A value that is not a score.
    db.transact(|txn| txn.put(&key(b"x"), b"12")).unwrap();
    let mut txn = db.begin().unwrap();
    add(&mut txn, b"x", 1.0);
    assert!(matches!(
        txn.commit(),
        Err(CommitError::Apply(Error::NotAScore { .. }))
    ));
}

/// Writers add to a few hot keys from several threads while readers check, in snapshots,
/// that the index holds exactly one entry per key, at the key's score. At the end each key
/// holds the sum of what was added (integers, so that the order of the adds cannot round
/// differently), and so does the index after a restart from the log.
#[test]
fn concurrent_adds_keep_one_index_entry_per_key_through_a_restart() {
    let dir = std::env::temp_dir().join(format!("keel-test-score-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let members: [&[u8]; 3] = [b"a", b"b", b"c"];
    let stop = AtomicBool::new(false);
    let db = Db::open(&dir, Options::default()).unwrap();
    let sums = std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        let writers: Vec<_> = (0..3u64)
            .map(|t| {
                let db = &db;
                s.spawn(move || {
                    let mut sums = [0i64; 3];
                    for i in 0..2_000u64 {
                        let m = ((i * 7 + t) % 3) as usize;
                        let delta = ((i * 31 + t * 17) % 21) as i64 - 10;
                        db.transact(|txn| {
                            txn.score_add(&key(members[m]), delta as f64, PREFIX, members[m])
                        })
                        .unwrap();
                        sums[m] += delta;
                    }
                    sums
                })
            })
            .collect();
        let reader = s.spawn(|| {
            let mut checks = 0;
            while !stop.load(Ordering::Relaxed) {
                let snapshot = db.snapshot().unwrap();
                let listed: Vec<(f64, Vec<u8>)> = snapshot
                    .range(PREFIX..b"i0".as_slice())
                    .map(|(k, _)| (decode_score_value(&k[2..10]).unwrap(), k[10..].to_vec()))
                    .collect();
                let mut expected = Vec::new();
                for m in members {
                    if let Some(v) = snapshot.get(&key(m)).unwrap() {
                        expected.push((decode_score_value(&v).unwrap(), m.to_vec()));
                    }
                }
                expected.sort_by(|x, y| x.0.total_cmp(&y.0).then_with(|| x.1.cmp(&y.1)));
                assert_eq!(listed, expected, "the index disagrees with the scores");
                checks += 1;
            }
            checks
        });
        let mut sums = [0i64; 3];
        for w in writers {
            for (total, s) in sums.iter_mut().zip(w.join().unwrap()) {
                *total += s;
            }
        }
        stop.store(true, Ordering::Relaxed);
        assert!(reader.join().unwrap() > 0);
        sums
    });
    let check = |db: &Db| {
        let mut expected: Vec<(f64, Vec<u8>)> = members
            .iter()
            .zip(sums)
            .map(|(m, s)| (s as f64, m.to_vec()))
            .collect();
        expected.sort_by(|x, y| x.0.total_cmp(&y.0).then_with(|| x.1.cmp(&y.1)));
        for (m, s) in members.iter().zip(sums) {
            assert_eq!(score(db, m), Some(s as f64));
        }
        assert_eq!(entries(db), expected);
    };
    check(&db);
    drop(db);
    let db = Db::open(&dir, Options::default()).unwrap();
    check(&db);
    drop(db);
    let _ = std::fs::remove_dir_all(&dir);
}

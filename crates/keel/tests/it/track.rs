//! Tickets: the values commutative operations resolve to at commit (`Txn::track`).

use std::time::Duration;

use keel::{CommitError, ConflictReason, Db, Error, Options, SplitMode};

fn int(value: Option<&[u8]>) -> i64 {
    std::str::from_utf8(value.expect("present"))
        .expect("ASCII")
        .parse()
        .expect("an integer")
}

#[test]
fn tickets_give_the_value_after_each_operation() {
    let db = Db::in_memory();
    db.transact(|txn| txn.put(b"n", b"10")).unwrap();
    let mut txn = db.begin().unwrap();
    txn.add(b"n", 1).unwrap();
    let first = txn.track(b"n").unwrap();
    txn.add(b"n", 5).unwrap();
    txn.max(b"n", 100).unwrap();
    let second = txn.track(b"n").unwrap();
    txn.add(b"absent", -3).unwrap();
    let absent = txn.track(b"absent").unwrap();
    let committed = txn.commit_detailed().unwrap().unwrap();
    assert_eq!(int(committed.value(first)), 11);
    assert_eq!(int(committed.value(second)), 100);
    assert_eq!(int(committed.value(absent)), -3);
}

#[test]
fn tickets_on_plain_writes_and_reads_are_known_at_once() {
    let db = Db::in_memory();
    db.transact(|txn| txn.put(b"a", b"7")).unwrap();
    let mut txn = db.begin().unwrap();
    let read = txn.track(b"a").unwrap();
    let missing = txn.track(b"missing").unwrap();
    txn.put(b"b", b"5").unwrap();
    txn.add(b"b", 2).unwrap();
    let folded = txn.track(b"b").unwrap();
    txn.delete(b"c").unwrap();
    let deleted = txn.track(b"c").unwrap();
    let committed = txn.commit_detailed().unwrap().unwrap();
    assert_eq!(committed.value(read), Some(&b"7"[..]));
    assert_eq!(committed.value(missing), None);
    assert_eq!(int(committed.value(folded)), 7);
    assert_eq!(committed.value(deleted), None);
}

/// Tracking a key the transaction has not written reads it: a concurrent change conflicts.
#[test]
fn tracking_an_unwritten_key_is_a_read() {
    let db = Db::in_memory();
    let mut txn = db.begin().unwrap();
    txn.track(b"k").unwrap();
    txn.put(b"other", b"x").unwrap();
    db.transact(|t| t.put(b"k", b"changed")).unwrap();
    let conflict = txn.commit().unwrap().unwrap_err();
    assert_eq!(conflict.key, b"k");
    assert_eq!(conflict.reason, ConflictReason::ReadChanged);
}

/// A put over pending operations resolves their tickets by reading the key, which makes the
/// transaction depend on the value read.
#[test]
fn overwriting_tracked_operations_resolves_them_by_reading() {
    let db = Db::in_memory();
    db.transact(|txn| txn.put(b"n", b"1")).unwrap();

    let mut txn = db.begin().unwrap();
    txn.add(b"n", 1).unwrap();
    let ticket = txn.track(b"n").unwrap();
    txn.put(b"n", b"100").unwrap();
    let committed = txn.commit_detailed().unwrap().unwrap();
    assert_eq!(int(committed.value(ticket)), 2);
    assert_eq!(
        db.snapshot().unwrap().get(b"n").unwrap(),
        Some(b"100".to_vec())
    );

    let mut txn = db.begin().unwrap();
    txn.add(b"n", 1).unwrap();
    txn.track(b"n").unwrap();
    txn.delete(b"n").unwrap();
    db.transact(|t| t.add(b"n", 5)).unwrap();
    let conflict = txn.commit().unwrap().unwrap_err();
    assert_eq!(conflict.reason, ConflictReason::ReadChanged);

    // Without a ticket the same overwrite reads nothing and commits.
    let mut txn = db.begin().unwrap();
    txn.add(b"n", 1).unwrap();
    txn.delete(b"n").unwrap();
    db.transact(|t| t.add(b"n", 5)).unwrap();
    assert!(txn.commit().unwrap().is_ok());
}

#[test]
fn a_tracked_operation_on_a_bad_value_fails_the_commit() {
    let db = Db::in_memory();
    db.transact(|txn| txn.put(b"n", b"text")).unwrap();
    let mut txn = db.begin().unwrap();
    txn.add(b"n", 1).unwrap();
    txn.track(b"n").unwrap();
    txn.put(b"side", b"effect").unwrap();
    match txn.commit() {
        Err(CommitError::Apply(Error::NotAnInteger { key })) => assert_eq!(key, b"n"),
        other => panic!("expected NotAnInteger, got {other:?}"),
    }
    assert_eq!(db.snapshot().unwrap().get(b"side").unwrap(), None);
}

/// Concurrent tracked increments never conflict, and the values they report are exactly
/// 1..=N, each once: every increment saw a distinct, serial count. Under every split mode:
/// a tracked key never goes to a slice, so its value is always known.
#[test]
fn concurrent_tracked_increments_never_conflict_and_report_distinct_counts() {
    const THREADS: usize = 4;
    const TXNS: usize = 2000;
    for mode in [SplitMode::Off, SplitMode::Auto, SplitMode::Force] {
        let db = Db::with_options(
            Options::default()
                .split(mode)
                .split_phase(Duration::from_millis(1)),
        );
        let (mut seen, conflicts) = std::thread::scope(|s| {
            let workers: Vec<_> = (0..THREADS)
                .map(|_| {
                    let db = &db;
                    s.spawn(move || {
                        let mut seen = Vec::with_capacity(TXNS);
                        let mut conflicts = 0;
                        while seen.len() < TXNS {
                            let mut txn = db.begin().unwrap();
                            txn.add(b"hot", 1).unwrap();
                            let ticket = txn.track(b"hot").unwrap();
                            // Untracked, so it may go to a slice when split.
                            txn.add(b"also", 1).unwrap();
                            match txn.commit_detailed().unwrap() {
                                Ok(c) => {
                                    assert!(!c.split_only);
                                    seen.push(int(c.value(ticket)));
                                }
                                Err(_) => conflicts += 1,
                            }
                        }
                        (seen, conflicts)
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).fold(
                (Vec::new(), 0),
                |(mut all, c), (seen, n)| {
                    all.extend(seen);
                    (all, c + n)
                },
            )
        });
        seen.sort_unstable();
        let expected: Vec<i64> = (1..=(THREADS * TXNS) as i64).collect();
        assert!(
            seen == expected,
            "{mode:?}: counts were not 1..=N, each once"
        );
        assert_eq!(conflicts, 0, "{mode:?}: tracked adds conflicted");
        let snap = db.snapshot().unwrap();
        assert_eq!(
            int(snap.get(b"also").unwrap().as_deref()),
            (THREADS * TXNS) as i64
        );
    }
}

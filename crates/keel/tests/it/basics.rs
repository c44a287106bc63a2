//! Single-threaded semantics: reads of own writes, ranges, conflicts, limits.

use keel::{ConflictReason, Db, Error, Limit};

#[test]
fn own_writes_and_snapshot_isolation() {
    let db = Db::in_memory();
    let mut t1 = db.begin().unwrap();
    t1.put(b"a", b"1").unwrap();
    assert_eq!(t1.get(b"a").unwrap(), Some(b"1".to_vec()));
    let mut t2 = db.begin().unwrap();
    assert_eq!(
        t2.get(b"a").unwrap(),
        None,
        "uncommitted writes are invisible"
    );
    t1.commit().unwrap().unwrap();
    assert_eq!(t2.get(b"a").unwrap(), None, "a snapshot does not move");
    drop(t2);
    let mut t3 = db.begin().unwrap();
    assert_eq!(t3.get(b"a").unwrap(), Some(b"1".to_vec()));
    t3.delete(b"a").unwrap();
    assert_eq!(t3.get(b"a").unwrap(), None);
    t3.commit().unwrap().unwrap();
    assert_eq!(db.snapshot().unwrap().get(b"a").unwrap(), None);
}

/// A read of an absent key conflicts with its creation, whether the key is remembered inline
/// (short) or on the heap (long), and whatever else the transaction read (reads spill from
/// their inline slots to the heap).
#[test]
fn absent_reads_of_short_and_long_keys_conflict_with_their_creation() {
    let db = Db::in_memory();
    let long = vec![b'k'; 300];
    for key in [
        &b"short"[..],
        &b"exactly-thirty-two-bytes-long-k!"[..],
        &long,
    ] {
        for other_reads in [0, 1, 5] {
            let mut reader = db.begin().unwrap();
            for i in 0..other_reads {
                reader.get(format!("other{i}").as_bytes()).unwrap();
            }
            assert_eq!(reader.get(key).unwrap(), None);
            reader.put(b"out", b"1").unwrap();
            db.transact(|t| t.put(key, b"now here")).unwrap();
            let conflict = reader.commit().unwrap().unwrap_err();
            assert_eq!(conflict.reason, ConflictReason::ReadChanged);
            assert_eq!(conflict.key, key);
            db.transact(|t| t.delete(key)).unwrap();
            // Unchanged, the same read commits.
            let mut reader = db.begin().unwrap();
            assert_eq!(reader.get(key).unwrap(), None);
            reader.put(b"out", b"2").unwrap();
            assert!(reader.commit().unwrap().is_ok());
        }
    }
}

#[test]
fn dropped_transaction_aborts() {
    let db = Db::in_memory();
    {
        let mut t = db.begin().unwrap();
        t.put(b"x", b"1").unwrap();
    }
    assert_eq!(db.snapshot().unwrap().get(b"x").unwrap(), None);
}

#[test]
fn write_skew_is_prevented() {
    let db = Db::in_memory();
    db.transact(|t| {
        t.put(b"x", b"1")?;
        t.put(b"y", b"1")
    })
    .unwrap();
    let mut a = db.begin().unwrap();
    let mut b = db.begin().unwrap();
    for t in [&mut a, &mut b] {
        t.get(b"x").unwrap();
        t.get(b"y").unwrap();
    }
    a.put(b"x", b"0").unwrap();
    b.put(b"y", b"0").unwrap();
    assert!(a.commit().unwrap().is_ok());
    let conflict = b.commit().unwrap().unwrap_err();
    assert_eq!(conflict.reason, ConflictReason::ReadChanged);
    assert_eq!(conflict.key, b"x");
}

#[test]
fn phantom_insert_into_scanned_range_aborts() {
    let db = Db::in_memory();
    db.transact(|t| t.put(b"k1", b"v")).unwrap();
    let mut scanner = db.begin().unwrap();
    let seen: Vec<_> = scanner.range(b"k0".as_slice()..b"k9".as_slice()).collect();
    assert_eq!(seen.len(), 1);
    db.transact(|t| t.put(b"k5", b"new")).unwrap();
    scanner.put(b"summary", b"1").unwrap();
    assert_eq!(
        scanner.commit().unwrap().unwrap_err().reason,
        ConflictReason::Phantom
    );
}

/// What an unchecked range read is not checked for (inserts, deletes, changes in it), and
/// what its reader still is: the keys it then reads with `get`, and its checked ranges.
#[test]
fn an_unchecked_range_is_checked_only_through_the_reads_that_confirm_it() {
    use std::ops::Bound;
    let db = Db::in_memory();
    db.transact(|t| {
        for k in [b"k1", b"k2", b"k3"] {
            t.put(k, b"v")?;
        }
        Ok::<_, Error>(())
    })
    .unwrap();
    let span = || {
        (
            Bound::Included(b"k0".to_vec()),
            Bound::Excluded(b"k9".to_vec()),
        )
    };
    let first = |t: &mut keel::Txn<'_>| {
        let (lo, hi) = span();
        t.range_unchecked(lo, hi).next().map(|(k, _)| k)
    };
    // Inserts and deletes elsewhere in the range: commits.
    let mut picker = db.begin().unwrap();
    assert_eq!(first(&mut picker).as_deref(), Some(&b"k1"[..]));
    assert!(picker.get(b"k1").unwrap().is_some());
    db.transact(|t| {
        t.put(b"k0", b"new")?;
        t.delete(b"k3")
    })
    .unwrap();
    picker.delete(b"k1").unwrap();
    assert!(picker.commit().unwrap().is_ok());
    // The key it read goes meanwhile: aborts, as any read's.
    let mut picker = db.begin().unwrap();
    assert_eq!(first(&mut picker).as_deref(), Some(&b"k0"[..]));
    assert!(picker.get(b"k0").unwrap().is_some());
    db.transact(|t| t.delete(b"k0")).unwrap();
    picker.put(b"summary", b"1").unwrap();
    assert_eq!(
        picker.commit().unwrap().unwrap_err().reason,
        ConflictReason::ReadChanged
    );
    // Its own writes are in it, as in a checked range; a checked range beside it still
    // catches a phantom.
    let mut picker = db.begin().unwrap();
    picker.put(b"k1", b"mine").unwrap();
    assert_eq!(first(&mut picker).as_deref(), Some(&b"k1"[..]));
    let (lo, hi) = span();
    assert_eq!(picker.range_owned(lo, hi).count(), 2);
    db.transact(|t| t.put(b"k5", b"new")).unwrap();
    assert_eq!(
        picker.commit().unwrap().unwrap_err().reason,
        ConflictReason::Phantom
    );
}

#[test]
fn insert_outside_scanned_part_does_not_conflict() {
    let db = Db::in_memory();
    db.transact(|t| {
        for k in [b"a", b"b", b"c", b"d"] {
            t.put(k, b"v")?;
        }
        Ok::<_, Error>(())
    })
    .unwrap();
    let mut scanner = db.begin().unwrap();
    let first: Vec<_> = scanner.range::<&[u8]>(..).take(2).collect();
    assert_eq!(first.len(), 2);
    db.transact(|t| t.put(b"z", b"new")).unwrap();
    scanner.put(b"summary", b"1").unwrap();
    assert!(scanner.commit().unwrap().is_ok(), "only [.., b] was read");
}

#[test]
fn commutative_adds_do_not_conflict() {
    let db = Db::in_memory();
    let mut a = db.begin().unwrap();
    let mut b = db.begin().unwrap();
    a.add(b"n", 5).unwrap();
    b.add(b"n", 7).unwrap();
    b.max(b"m", 3).unwrap();
    a.max(b"m", 9).unwrap();
    assert!(a.commit().unwrap().is_ok());
    assert!(b.commit().unwrap().is_ok());
    let s = db.snapshot().unwrap();
    assert_eq!(s.get(b"n").unwrap(), Some(b"12".to_vec()));
    assert_eq!(s.get(b"m").unwrap(), Some(b"9".to_vec()));
}

/// A key created by a commutative operation keeps room for a short first value in its
/// record; first values at, around and far past that room all read back, and so do the
/// values written after them.
#[test]
fn first_values_of_new_counters_of_every_length_read_back() {
    let db = Db::in_memory();
    let firsts = [
        0,
        7,
        -1,
        9_999_999,
        99_999_999,
        -9_999_999,
        100_000_000,
        -99_999_999,
    ];
    let firsts = firsts.into_iter().chain([i64::MAX, i64::MIN]);
    for (i, first) in firsts.clone().enumerate() {
        db.transact(|t| t.add(format!("counter:{i}").as_bytes(), first))
            .unwrap();
    }
    let s = db.snapshot().unwrap();
    for (i, first) in firsts.clone().enumerate() {
        let got = s.get(format!("counter:{i}").as_bytes()).unwrap();
        assert_eq!(
            got,
            Some(first.to_string().into_bytes()),
            "first value {first}"
        );
    }
    drop(s);
    for (i, first) in firsts.clone().enumerate() {
        let step = if first > 0 { -1 } else { 1 };
        db.transact(|t| t.add(format!("counter:{i}").as_bytes(), step))
            .unwrap();
    }
    let s = db.snapshot().unwrap();
    for (i, first) in firsts.enumerate() {
        let then = if first > 0 { first - 1 } else { first + 1 };
        let got = s.get(format!("counter:{i}").as_bytes()).unwrap();
        assert_eq!(got, Some(then.to_string().into_bytes()), "after {first}");
    }
}

#[test]
fn add_to_non_integer_fails_naming_the_key() {
    let db = Db::in_memory();
    db.transact(|t| t.put(b"name", b"bob")).unwrap();
    let mut t = db.begin().unwrap();
    t.add(b"name", 1).unwrap();
    t.put(b"other", b"1").unwrap();
    let err = t.commit().unwrap_err();
    assert!(err.to_string().contains("\"name\""), "{err}");
    assert_eq!(
        db.snapshot().unwrap().get(b"other").unwrap(),
        None,
        "nothing was written"
    );
}

#[test]
fn limits_give_errors_and_change_nothing() {
    let db = Db::in_memory();
    let mut t = db.begin().unwrap();
    let key = vec![b'k'; keel::limits::KEY_BYTES_MAX + 1];
    match t.put(&key, b"v") {
        Err(Error::LimitExceeded {
            limit: Limit::KeyBytes,
            ..
        }) => {}
        other => panic!("expected a key limit error, got {other:?}"),
    }
    let value = vec![0; keel::limits::VALUE_BYTES_MAX + 1];
    assert!(matches!(
        t.put(b"k", &value),
        Err(Error::LimitExceeded {
            limit: Limit::ValueBytes,
            ..
        })
    ));
    t.commit().unwrap().unwrap();
    assert_eq!(db.stats().records, 0);
}

#[test]
fn range_merges_own_writes_both_directions() {
    let db = Db::in_memory();
    db.transact(|t| {
        for k in [b"b", b"d", b"f"] {
            t.put(k, k)?;
        }
        Ok::<_, Error>(())
    })
    .unwrap();
    let mut t = db.begin().unwrap();
    t.put(b"c", b"c").unwrap();
    t.delete(b"d").unwrap();
    t.put(b"f", b"F").unwrap();
    let fwd: Vec<_> = t.range::<&[u8]>(..).collect();
    let want = vec![
        (b"b".to_vec(), b"b".to_vec()),
        (b"c".to_vec(), b"c".to_vec()),
        (b"f".to_vec(), b"F".to_vec()),
    ];
    assert_eq!(fwd, want);
    let mut rev: Vec<_> = t.range::<&[u8]>(..).rev().collect();
    rev.reverse();
    assert_eq!(rev, want);
    let mut both = t.range::<&[u8]>(..);
    let first = both.next().unwrap();
    let last = both.next_back().unwrap();
    let middle: Vec<_> = both.collect();
    assert_eq!(vec![first, middle[0].clone(), last], want);
}

#[test]
fn version_ts_changes_on_equal_value_rewrites_and_is_validated() {
    let db = Db::in_memory();
    db.transact(|t| t.put(b"k", b"same")).unwrap();
    let before = db.begin().unwrap().version_ts(b"k").unwrap().unwrap();
    db.transact(|t| t.put(b"k", b"same")).unwrap();
    let mut watcher = db.begin().unwrap();
    let after = watcher.version_ts(b"k").unwrap().unwrap();
    assert!(after > before, "an equal-value rewrite is a new version");
    db.transact(|t| t.put(b"k", b"same")).unwrap();
    watcher.put(b"other", b"1").unwrap();
    assert_eq!(
        watcher.commit().unwrap().unwrap_err().reason,
        ConflictReason::ReadChanged
    );
    db.transact(|t| t.delete(b"k")).unwrap();
    assert_eq!(db.begin().unwrap().version_ts(b"k").unwrap(), None);
}

/// Prefetching inside a transaction or a snapshot is only a hint: present, absent and
/// repeated keys read back what they hold, and the transaction commits as it would have.
#[test]
fn prefetching_in_a_transaction_or_snapshot_changes_nothing() {
    let db = Db::in_memory();
    db.transact(|txn| txn.put(b"a", b"1")).unwrap();
    let keys: [&[u8]; 4] = [b"a", b"missing", b"a", b"b"];
    let mut txn = db.begin().unwrap();
    txn.prefetch_all(keys);
    assert_eq!(txn.get(b"a").unwrap().as_deref(), Some(&b"1"[..]));
    assert_eq!(txn.get(b"missing").unwrap(), None);
    txn.put(b"b", b"2").unwrap();
    txn.prefetch_all(keys);
    assert_eq!(txn.get(b"b").unwrap().as_deref(), Some(&b"2"[..]));
    txn.commit().unwrap().unwrap();
    let snapshot = db.snapshot().unwrap();
    snapshot.prefetch_all(keys);
    assert_eq!(snapshot.get(b"a").unwrap().as_deref(), Some(&b"1"[..]));
    assert_eq!(snapshot.get(b"b").unwrap().as_deref(), Some(&b"2"[..]));
    assert_eq!(snapshot.get(b"missing").unwrap(), None);
}

/// A transaction of `begin_owned` keeps its database alive: it (and its commit future) may
/// outlive every handle and commit after the last one is dropped; a durable database's
/// directory stays locked until the last such transaction ends, and after `close` their
/// commits fail.
#[test]
fn an_owned_transaction_outlives_the_database_handles() {
    let db = Db::in_memory();
    let mut txn: keel::Txn<'static> = db.begin_owned().unwrap();
    txn.put(b"a", b"1").unwrap();
    let reader = db.clone();
    drop(db);
    txn.commit().unwrap().unwrap();
    assert_eq!(
        reader.snapshot().unwrap().get(b"a").unwrap(),
        Some(b"1".to_vec())
    );
    let mut late = reader.begin_owned().unwrap();
    late.put(b"b", b"2").unwrap();
    drop(reader);
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    let mut commit = std::pin::pin!(late.commit_async());
    assert!(
        matches!(
            commit.as_mut().poll(&mut cx),
            std::task::Poll::Ready(Ok(Ok(_)))
        ),
        "committed with no handle left"
    );

    let path = std::env::temp_dir().join(format!("keel-test-owned-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&path);
    let db = Db::open(&path, keel::Options::default()).unwrap();
    let mut txn = db.begin_owned().unwrap();
    txn.put(b"c", b"3").unwrap();
    db.close().unwrap();
    assert!(
        matches!(
            Db::open(&path, keel::Options::default()),
            Err(keel::OpenError::Locked { .. })
        ),
        "the transaction keeps the database, and its lock"
    );
    assert!(txn.commit().is_err(), "the log is closed");
    let again = Db::open(&path, keel::Options::default()).unwrap();
    assert_eq!(again.snapshot().unwrap().get(b"c").unwrap(), None);
    drop(again);
    std::fs::remove_dir_all(&path).unwrap();
}

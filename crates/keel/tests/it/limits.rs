//! Every limit in `keel::limits`, exceeded: the documented error, naming the limit, and
//! nothing changed — the failed call leaves the transaction as it was (it can go on and
//! commit what it had) and the database untouched. Values exactly at a limit are accepted.

use keel::limits::{
    KEY_BYTES_MAX, OPEN_TXNS_MAX, TOP_K_MAX, TRANSACT_ATTEMPTS_MAX, TXN_READS_MAX,
    TXN_WRITE_BYTES_MAX, TXN_WRITE_KEYS_MAX, VALUE_BYTES_MAX,
};
use keel::{BeginError, CommitError, Db, Error, Limit, TransactError};

#[track_caller]
fn assert_limit<T: std::fmt::Debug>(result: Result<T, Error>, limit: Limit) {
    match result {
        Err(Error::LimitExceeded { limit: hit, .. }) if hit == limit => {}
        other => panic!("expected the {limit} limit, got {other:?}"),
    }
}

/// Everything the database holds, through a fresh snapshot.
fn contents(db: &Db) -> Vec<(Vec<u8>, Vec<u8>)> {
    db.snapshot().unwrap().range::<&[u8]>(..).collect()
}

#[test]
fn key_size() {
    let db = Db::in_memory();
    let long = vec![b'k'; KEY_BYTES_MAX + 1];
    let mut txn = db.begin().unwrap();
    txn.put(b"before", b"1").unwrap();
    assert_limit(txn.put(&long, b"v"), Limit::KeyBytes);
    assert_limit(txn.get(&long), Limit::KeyBytes);
    assert_limit(txn.get_with(&long, |v| v.is_some()), Limit::KeyBytes);
    assert_limit(txn.delete(&long), Limit::KeyBytes);
    assert_limit(txn.add(&long, 1), Limit::KeyBytes);
    assert_limit(txn.max(&long, 1), Limit::KeyBytes);
    assert_limit(txn.min(&long, 1), Limit::KeyBytes);
    assert_limit(txn.put_ordered(&long, 1, b"v"), Limit::KeyBytes);
    assert_limit(txn.top_k_insert(&long, 3, 1, b"m"), Limit::KeyBytes);
    assert_limit(txn.top_k_insert(b"board", 3, 1, &long), Limit::KeyBytes);
    assert_limit(db.snapshot().unwrap().get(&long), Limit::KeyBytes);
    // Exactly at the limit is fine.
    let longest = vec![b'k'; KEY_BYTES_MAX];
    txn.put(&longest, b"v").unwrap();
    txn.commit().unwrap().unwrap();
    assert_eq!(
        contents(&db),
        [
            (b"before".to_vec(), b"1".to_vec()),
            (longest, b"v".to_vec())
        ]
    );
}

#[test]
fn value_size() {
    let db = Db::in_memory();
    let mut txn = db.begin().unwrap();
    txn.put(b"k", b"small").unwrap();
    let big = vec![7; VALUE_BYTES_MAX + 1];
    assert_limit(txn.put(b"k", &big), Limit::ValueBytes);
    assert_limit(txn.put_ordered(b"o", 1, &big[8..]), Limit::ValueBytes);
    assert_eq!(txn.get(b"k").unwrap(), Some(b"small".to_vec()));
    let largest = &big[1..];
    txn.put(b"largest", largest).unwrap();
    txn.commit().unwrap().unwrap();
    let snapshot = db.snapshot().unwrap();
    assert_eq!(snapshot.get(b"k").unwrap(), Some(b"small".to_vec()));
    assert_eq!(snapshot.get(b"o").unwrap(), None);
    assert_eq!(snapshot.get(b"largest").unwrap().as_deref(), Some(largest));
}

#[test]
fn transaction_write_bytes() {
    let db = Db::in_memory();
    let value = vec![1; VALUE_BYTES_MAX];
    let mut txn = db.begin().unwrap();
    // Rewriting one key does not accumulate.
    for _ in 0..2 * (TXN_WRITE_BYTES_MAX / VALUE_BYTES_MAX) {
        txn.put(b"same", &value).unwrap();
    }
    txn.put(b"same", b"small").unwrap();
    // Fill up to just below the limit: one more full value does not fit.
    let fits = TXN_WRITE_BYTES_MAX / VALUE_BYTES_MAX - 1;
    for i in 0..fits {
        txn.put(format!("k{i:02}").as_bytes(), &value).unwrap();
    }
    assert_limit(txn.put(b"one-too-many", &value), Limit::TxnWriteBytes);
    assert_limit(
        txn.put_ordered(b"one-too-many", 1, &value[8..]),
        Limit::TxnWriteBytes,
    );
    assert_eq!(txn.get(b"one-too-many").unwrap(), None);
    // Shrinking a write makes room again.
    txn.put(b"k00", b"small").unwrap();
    txn.put(b"one-too-many", &value).unwrap();
    drop(txn);
    assert_eq!(db.stats().records, 0, "nothing was written");
}

#[test]
fn transaction_write_keys() {
    let db = Db::in_memory();
    let mut txn = db.begin().unwrap();
    for i in 0..TXN_WRITE_KEYS_MAX {
        txn.put(&(i as u64).to_be_bytes(), b"").unwrap();
    }
    assert_limit(txn.put(b"one more", b""), Limit::TxnWriteKeys);
    assert_limit(txn.add(b"one more", 1), Limit::TxnWriteKeys);
    assert_limit(txn.delete(b"one more"), Limit::TxnWriteKeys);
    // Rewriting a key already in the write set is not a new key.
    txn.put(&0u64.to_be_bytes(), b"again").unwrap();
    assert_eq!(txn.get(b"one more").unwrap(), None);
    assert_eq!(
        txn.get(&0u64.to_be_bytes()).unwrap(),
        Some(b"again".to_vec())
    );
    drop(txn);
    assert_eq!(db.stats().records, 0, "nothing was written");
}

#[test]
fn transaction_reads() {
    let db = Db::in_memory();
    db.transact(|txn| txn.put(b"k", b"v")).unwrap();
    let mut txn = db.begin().unwrap();
    for _ in 0..TXN_READS_MAX {
        assert!(txn.get_with(b"k", |v| v.is_some()).unwrap());
    }
    assert_limit(txn.get(b"k"), Limit::TxnReads);
    assert_limit(txn.get_with(b"k", |v| v.is_some()), Limit::TxnReads);
    // The transaction goes on: a write is not a read.
    txn.put(b"w", b"1").unwrap();
    txn.commit().unwrap().unwrap();
    assert_eq!(
        db.snapshot().unwrap().get(b"w").unwrap(),
        Some(b"1".to_vec())
    );
}

#[test]
fn open_transactions() {
    let db = Db::in_memory();
    db.transact(|txn| txn.put(b"k", b"v")).unwrap();
    let stats = db.stats();
    let mut txns = Vec::new();
    let mut snapshots = Vec::new();
    for i in 0..OPEN_TXNS_MAX {
        if i % 2 == 0 {
            txns.push(db.begin().unwrap());
        } else {
            snapshots.push(db.snapshot().unwrap());
        }
    }
    assert!(matches!(db.begin(), Err(BeginError::TooManyOpen)));
    assert!(matches!(db.snapshot(), Err(BeginError::TooManyOpen)));
    match db.transact(|txn| txn.put(b"k", b"changed")) {
        Err(TransactError::Begin(BeginError::TooManyOpen)) => {}
        other => panic!("expected TooManyOpen, got {other:?}"),
    }
    assert_eq!(db.stats().commits, stats.commits, "nothing was committed");
    // Closing one makes room for exactly one.
    drop(snapshots.pop());
    let snapshot = db.snapshot().unwrap();
    assert_eq!(snapshot.get(b"k").unwrap(), Some(b"v".to_vec()));
    assert!(matches!(db.begin(), Err(BeginError::TooManyOpen)));
    drop(txns.pop());
    let mut txn = db.begin().unwrap();
    txn.put(b"k", b"new").unwrap();
    txn.commit().unwrap().unwrap();
    drop((txns, snapshots, snapshot));
    let all: Vec<_> = (0..OPEN_TXNS_MAX).map(|_| db.snapshot().unwrap()).collect();
    assert_eq!(all[0].get(b"k").unwrap(), Some(b"new".to_vec()));
}

#[test]
fn top_k_length() {
    let db = Db::in_memory();
    let mut txn = db.begin().unwrap();
    txn.top_k_insert(b"board", 2, 5, b"alice").unwrap();
    assert_limit(
        txn.top_k_insert(b"board", TOP_K_MAX + 1, 9, b"bob"),
        Limit::TopK,
    );
    assert_limit(txn.top_k_insert(b"board", 0, 9, b"bob"), Limit::TopK);
    txn.top_k_insert(b"other", TOP_K_MAX, 1, b"carol").unwrap();
    txn.commit().unwrap().unwrap();
    let snapshot = db.snapshot().unwrap();
    let board = keel::decode_top_k(&snapshot.get(b"board").unwrap().unwrap()).unwrap();
    assert_eq!(board, [(5, b"alice".to_vec())]);
}

#[test]
fn transact_attempts() {
    let db = Db::in_memory();
    let mut attempts = 0;
    let result = db.transact(|txn| {
        attempts += 1;
        txn.get(b"contended")?;
        // Someone else changes what this attempt read, every time.
        db.transact(|other| other.add(b"contended", 1)).unwrap();
        txn.put(b"outcome", b"won")
    });
    match result {
        Err(TransactError::Conflicts { attempts: n, last }) => {
            assert_eq!(n, TRANSACT_ATTEMPTS_MAX);
            assert_eq!(last.key, b"contended");
        }
        other => panic!("expected to give up, got {other:?}"),
    }
    assert_eq!(attempts, TRANSACT_ATTEMPTS_MAX);
    let snapshot = db.snapshot().unwrap();
    assert_eq!(snapshot.get(b"outcome").unwrap(), None);
    assert_eq!(
        snapshot.get(b"contended").unwrap(),
        Some(TRANSACT_ATTEMPTS_MAX.to_string().into_bytes())
    );
}

/// Adds of one sign to one key fold into their sum in the write set: a run of them
/// overflows exactly when applying them one by one would, a run that changes sign is
/// applied one by one, and a ticket between two adds still reads the value between them.
#[test]
fn runs_of_adds_overflow_and_answer_as_adds_one_by_one() {
    let db = Db::in_memory();
    let near = i64::MAX - 5;
    let set = |v: i64| {
        db.transact(|txn| txn.put(b"n", v.to_string().as_bytes()))
            .unwrap()
    };
    let adds = |deltas: &[i64]| {
        let mut txn = db.begin().unwrap();
        for &d in deltas {
            txn.add(b"n", d).unwrap();
        }
        txn.commit().map(|r| r.is_ok())
    };
    let read = || db.snapshot().unwrap().get(b"n").unwrap();
    set(near);
    assert_eq!(adds(&[2, 2]), Ok(true));
    assert_eq!(read(), Some((near + 4).to_string().into_bytes()));
    set(near);
    // 3 then 3 passes the maximum on the second add: the whole commit fails.
    assert_eq!(
        adds(&[3, 3]),
        Err(CommitError::Apply(Error::Overflow { key: b"n".to_vec() }))
    );
    set(i64::MAX);
    // Up past the maximum, then back: one by one, the first add overflows.
    assert_eq!(
        adds(&[1, -1]),
        Err(CommitError::Apply(Error::Overflow { key: b"n".to_vec() }))
    );
    set(0);
    assert_eq!(adds(&[-1; 100]), Ok(true));
    assert_eq!(read(), Some(b"-100".to_vec()));
    let mut txn = db.begin().unwrap();
    txn.add(b"n", 1).unwrap();
    let between = txn.track(b"n").unwrap();
    txn.add(b"n", 1).unwrap();
    let after = txn.track(b"n").unwrap();
    let committed = txn.commit_detailed().unwrap().unwrap();
    assert_eq!(committed.value(between), Some(&b"-99"[..]));
    assert_eq!(committed.value(after), Some(&b"-98"[..]));
}

#[test]
fn integer_overflow_fails_the_commit_and_writes_nothing() {
    let db = Db::in_memory();
    db.transact(|txn| txn.put(b"n", i64::MAX.to_string().as_bytes()))
        .unwrap();
    let mut txn = db.begin().unwrap();
    txn.put(b"other", b"1").unwrap();
    txn.add(b"n", 1).unwrap();
    assert_eq!(
        txn.commit().unwrap_err(),
        CommitError::Apply(Error::Overflow { key: b"n".to_vec() })
    );
    let mut txn = db.begin().unwrap();
    txn.put(b"m", i64::MIN.to_string().as_bytes()).unwrap();
    assert_eq!(
        txn.add(b"m", -1),
        Err(Error::Overflow { key: b"m".to_vec() })
    );
    assert_eq!(
        txn.get(b"m").unwrap(),
        Some(i64::MIN.to_string().into_bytes())
    );
    drop(txn);
    assert_eq!(
        contents(&db),
        [(b"n".to_vec(), i64::MAX.to_string().into_bytes())]
    );
}

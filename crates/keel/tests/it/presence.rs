//! Presence reads (`Txn::exists_for_write`): a write that depends on whether a key exists,
//! not on its value, validates only the key's presence, so concurrent commutative writes of
//! the key do not conflict; a change of presence does.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use keel::{ConflictReason, Db, Options, SplitMode};

use crate::StopOnDrop;

fn int(value: Option<Vec<u8>>) -> i64 {
    value.map_or(0, |v| String::from_utf8(v).unwrap().parse().unwrap())
}

/// `HINCRBY` on a spread hash: adds `delta` to `field`, and 1 to `size` when the field is
/// new. Returns the ticket of the field's new value.
fn count_in(txn: &mut keel::Txn<'_>, field: &[u8], delta: i64) -> keel::Ticket {
    let present = txn.exists_for_write(field).unwrap();
    txn.add(field, delta).unwrap();
    txn.add(b"size", i64::from(!present)).unwrap();
    txn.track(field).unwrap()
}

#[test]
fn presence_reads_of_a_key_both_adding_to_it_do_not_conflict() {
    let db = Db::in_memory();
    db.transact(|txn| txn.put(b"f", b"1")).unwrap();
    let mut a = db.begin().unwrap();
    let mut b = db.begin().unwrap();
    let ta = count_in(&mut a, b"f", 10);
    let tb = count_in(&mut b, b"f", 100);
    let committed_a = a.commit_detailed().unwrap().unwrap();
    let committed_b = b.commit_detailed().unwrap().unwrap();
    assert_eq!(committed_a.value(ta), Some(&b"11"[..]));
    assert_eq!(committed_b.value(tb), Some(&b"111"[..]));
    let snapshot = db.snapshot().unwrap();
    assert_eq!(int(snapshot.get(b"f").unwrap()), 111);
    assert_eq!(int(snapshot.get(b"size").unwrap()), 0);
    assert_eq!(db.stats().aborts_read_changed, 0);
}

/// The same with a read of the value: the second commit conflicts. This is what presence
/// reads avoid.
#[test]
fn value_reads_of_a_key_both_adding_to_it_conflict() {
    let db = Db::in_memory();
    db.transact(|txn| txn.put(b"f", b"1")).unwrap();
    let mut a = db.begin().unwrap();
    let mut b = db.begin().unwrap();
    for txn in [&mut a, &mut b] {
        assert!(txn.get(b"f").unwrap().is_some());
        txn.add(b"f", 1).unwrap();
    }
    a.commit().unwrap().unwrap();
    let conflict = b.commit().unwrap().unwrap_err();
    assert_eq!(conflict.key, b"f");
    assert_eq!(conflict.reason, ConflictReason::ReadChanged);
}

/// Two that both find the key absent would both count it as new: the second conflicts.
#[test]
fn a_presence_read_of_an_absent_key_conflicts_with_its_creation() {
    let db = Db::in_memory();
    let mut a = db.begin().unwrap();
    let mut b = db.begin().unwrap();
    count_in(&mut a, b"f", 1);
    count_in(&mut b, b"f", 1);
    a.commit().unwrap().unwrap();
    let conflict = b.commit().unwrap().unwrap_err();
    assert_eq!(conflict.key, b"f");
    assert_eq!(conflict.reason, ConflictReason::ReadChanged);
    let snapshot = db.snapshot().unwrap();
    assert_eq!(int(snapshot.get(b"size").unwrap()), 1);

    // A plain write creating the key conflicts just the same.
    let mut c = db.begin().unwrap();
    count_in(&mut c, b"g", 1);
    db.transact(|txn| txn.put(b"g", b"5")).unwrap();
    assert_eq!(c.commit().unwrap().unwrap_err().key, b"g");
}

#[test]
fn a_presence_read_of_a_present_key_conflicts_with_its_deletion() {
    let db = Db::in_memory();
    db.transact(|txn| txn.put(b"f", b"1")).unwrap();
    let mut a = db.begin().unwrap();
    count_in(&mut a, b"f", 1);
    db.transact(|txn| txn.delete(b"f")).unwrap();
    let conflict = a.commit().unwrap().unwrap_err();
    assert_eq!(conflict.key, b"f");
    assert_eq!(conflict.reason, ConflictReason::ReadChanged);
}

/// Only presence is validated: a key deleted and created again in between is present, as the
/// transaction found it, and the commit follows the new value.
#[test]
fn a_presence_read_follows_presence_not_versions() {
    let db = Db::in_memory();
    db.transact(|txn| txn.put(b"f", b"1")).unwrap();
    let mut a = db.begin().unwrap();
    let ticket = count_in(&mut a, b"f", 1);
    db.transact(|txn| txn.delete(b"f")).unwrap();
    db.transact(|txn| txn.put(b"f", b"40")).unwrap();
    let committed = a.commit_detailed().unwrap().unwrap();
    assert_eq!(committed.value(ticket), Some(&b"41"[..]));
}

/// A presence read of a key the transaction does not write is validated as a read of its
/// value: a change of the value conflicts, though the key stays present.
#[test]
fn a_presence_read_of_a_key_not_written_is_a_value_read() {
    let db = Db::in_memory();
    db.transact(|txn| txn.put(b"f", b"1")).unwrap();
    let mut a = db.begin().unwrap();
    assert!(a.exists_for_write(b"f").unwrap());
    a.put(b"other", b"x").unwrap();
    db.transact(|txn| txn.put(b"f", b"2")).unwrap();
    let conflict = a.commit().unwrap().unwrap_err();
    assert_eq!(conflict.key, b"f");
    assert_eq!(conflict.reason, ConflictReason::ReadChanged);

    // Absent and still absent: no conflict, as for a read of an absent key.
    let mut b = db.begin().unwrap();
    assert!(!b.exists_for_write(b"missing").unwrap());
    b.put(b"other", b"y").unwrap();
    db.transact(|txn| txn.put(b"f", b"3")).unwrap();
    b.commit().unwrap().unwrap();
}

/// A key the transaction wrote already answers from its own writes and reads nothing: a
/// concurrent deletion does not conflict.
#[test]
fn a_presence_read_after_own_writes_reads_nothing() {
    let db = Db::in_memory();
    db.transact(|txn| {
        txn.put(b"p", b"1")?;
        txn.put(b"d", b"1")?;
        txn.put(b"o", b"1")
    })
    .unwrap();
    let mut a = db.begin().unwrap();
    a.put(b"p", b"2").unwrap();
    a.delete(b"d").unwrap();
    a.add(b"o", 1).unwrap();
    a.add(b"new", 1).unwrap();
    assert!(a.exists_for_write(b"p").unwrap());
    assert!(!a.exists_for_write(b"d").unwrap());
    assert!(a.exists_for_write(b"o").unwrap());
    assert!(a.exists_for_write(b"new").unwrap());
    db.transact(|txn| {
        txn.delete(b"p")?;
        txn.put(b"d", b"5")?;
        txn.delete(b"o")?;
        txn.put(b"new", b"7")
    })
    .unwrap();
    a.commit().unwrap().unwrap();
    let snapshot = db.snapshot().unwrap();
    assert_eq!(int(snapshot.get(b"o").unwrap()), 1);
    assert_eq!(int(snapshot.get(b"new").unwrap()), 8);
}

/// A prepare validates presence reads as a commit does.
#[test]
fn a_prepare_validates_presence_reads() {
    let db = Db::in_memory();
    db.transact(|txn| txn.put(b"f", b"1")).unwrap();
    let mut a = db.begin().unwrap();
    let ticket = count_in(&mut a, b"f", 1);
    db.transact(|txn| txn.add(b"f", 10)).unwrap();
    let prepared = a
        .prepare(|resolved| {
            assert_eq!(resolved.value(ticket), Some(&b"12"[..]));
            Vec::new()
        })
        .unwrap()
        .unwrap();
    prepared.commit().unwrap();
    assert_eq!(int(db.snapshot().unwrap().get(b"f").unwrap()), 12);

    let mut b = db.begin().unwrap();
    count_in(&mut b, b"f", 1);
    db.transact(|txn| txn.delete(b"f")).unwrap();
    let conflict = b.prepare(|_| Vec::new()).unwrap().unwrap_err();
    assert_eq!(conflict.key, b"f");
    assert_eq!(conflict.reason, ConflictReason::ReadChanged);
}

/// A split record's operations go to slices without its lock: a presence read of it then
/// conflicts with reason `Split`, as a read of it does, and runs again in the joined phase.
#[test]
fn a_presence_read_of_a_split_record_conflicts_with_reason_split() {
    let db = Db::with_options(
        Options::default()
            .split(SplitMode::Force)
            .split_phase(Duration::from_millis(5))
            .split_contention(8),
    );
    db.transact(|txn| txn.add(b"hot", 1)).unwrap();
    let (stop, acked) = (AtomicBool::new(false), AtomicI64::new(1));
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let mut txn = db.begin().unwrap();
                txn.add(b"hot", 1).unwrap();
                if txn.commit().unwrap().is_ok() {
                    acked.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
        while db.split_keys().is_empty() || db.stats().split_commits < 10 {
            std::thread::yield_now();
        }
        let mut saw_split = false;
        let mut committed_joined = false;
        // Held once a commit was stashed: the next attempt runs in the joined phase.
        let mut joined = None;
        for _ in 0..1000 {
            let mut txn = db.begin().unwrap();
            assert!(txn.exists_for_write(b"hot").unwrap());
            txn.add(b"hot", 1).unwrap();
            match txn.commit().unwrap() {
                Ok(_) => {
                    acked.fetch_add(1, Ordering::SeqCst);
                    committed_joined |= joined.is_some();
                    if saw_split && committed_joined {
                        break;
                    }
                }
                Err(c) => {
                    assert_eq!(c.reason, ConflictReason::Split, "{c}");
                    saw_split = true;
                    joined = Some(db.wait_joined());
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        assert!(saw_split, "never read the record while split");
        assert!(committed_joined, "never committed in the joined phase");
    });
    assert_eq!(
        int(db.snapshot().unwrap().get(b"hot").unwrap()),
        acked.load(Ordering::SeqCst)
    );
    assert!(db.stats().split_stashes > 0);
}

/// A model check: threads count into and delete a few fields, each keeping `size` as the
/// number of present fields (counting with presence reads, deleting with value reads, as
/// `HINCRBY` and `HDEL` do). Every snapshot must see `size` equal to the fields present, and
/// at the end every acknowledged delta must be in a field or in a deleted value.
#[test]
fn counting_and_deleting_keep_the_size_and_every_delta() {
    const FIELDS: u64 = 4;
    const OPS: u64 = 2_000;
    let db = Db::in_memory();
    let field = |i: u64| format!("f{i}").into_bytes();
    let (stop, added, removed) = (AtomicBool::new(false), AtomicI64::new(0), AtomicI64::new(0));
    let checks = std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        let watch = s.spawn(|| {
            let mut checks = 0;
            while !stop.load(Ordering::Relaxed) {
                let snapshot = db.snapshot().unwrap();
                let present = (0..FIELDS)
                    .filter(|&i| snapshot.get(&field(i)).unwrap().is_some())
                    .count() as i64;
                assert_eq!(int(snapshot.get(b"size").unwrap()), present);
                checks += 1;
            }
            checks
        });
        let writers: Vec<_> = (0..3u64)
            .map(|seed| {
                let (db, added, removed) = (&db, &added, &removed);
                s.spawn(move || {
                    let mut x = seed * 0x9E37_79B9 + 1;
                    for _ in 0..OPS {
                        // xorshift: a fixed sequence per thread.
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let f = field(x % FIELDS);
                        if x % 8 == 0 {
                            let value = db
                                .transact(|txn| {
                                    let value = txn.get(&f)?;
                                    if value.is_some() {
                                        txn.delete(&f)?;
                                        txn.add(b"size", -1)?;
                                    }
                                    Ok::<_, keel::Error>(value)
                                })
                                .unwrap();
                            removed.fetch_add(int(value), Ordering::SeqCst);
                        } else {
                            let delta = (x % 5) as i64 + 1;
                            db.transact(|txn| {
                                let present = txn.exists_for_write(&f)?;
                                txn.add(&f, delta)?;
                                txn.add(b"size", i64::from(!present))
                            })
                            .unwrap();
                            added.fetch_add(delta, Ordering::SeqCst);
                        }
                    }
                })
            })
            .collect();
        for writer in writers {
            writer.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        watch.join().unwrap()
    });
    assert!(checks > 0);
    let snapshot = db.snapshot().unwrap();
    let fields: Vec<_> = (0..FIELDS)
        .filter_map(|i| snapshot.get(&field(i)).unwrap())
        .collect();
    assert_eq!(int(snapshot.get(b"size").unwrap()), fields.len() as i64);
    let left: i64 = fields.into_iter().map(|v| int(Some(v))).sum();
    assert_eq!(
        left + removed.load(Ordering::SeqCst),
        added.load(Ordering::SeqCst)
    );
}

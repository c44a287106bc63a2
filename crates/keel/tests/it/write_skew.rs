//! Write skew under real concurrency, repeated.
//!
//! Doctors on call: each transaction reads every doctor's flag and goes off call (writes its
//! own flag to 0) only if at least two are on call. Under snapshot isolation all of them can
//! go off call at once; under serializability at least one stays. Barriers line the threads
//! up so that every round really is the dangerous interleaving: everyone has read before
//! anyone commits, and then they all commit at the same moment.

use std::sync::Barrier;

use keel::Db;

fn doctor(i: usize) -> Vec<u8> {
    format!("doctor{i}").into_bytes()
}

/// Sets every flag to 1, retrying until it commits (nothing else runs at that moment).
fn reset(db: &Db, doctors: usize) {
    loop {
        let mut txn = db.begin().unwrap();
        for i in 0..doctors {
            txn.put(&doctor(i), b"1").unwrap();
        }
        if txn.commit().unwrap().is_ok() {
            return;
        }
    }
}

/// `doctors` threads, `rounds` rounds; returns how many rounds let someone go off call.
/// Nothing inside the barrier dance panics (a panic would strand the others at a barrier);
/// violations are collected and asserted at the end.
fn on_call(doctors: usize, rounds: usize) -> usize {
    let db = Db::in_memory();
    let start = Barrier::new(doctors + 1);
    let read = Barrier::new(doctors);
    let end = Barrier::new(doctors + 1);
    let (violations, progress, misreads) = std::thread::scope(|s| {
        let threads: Vec<_> = (0..doctors)
            .map(|me| {
                let (db, start, read, end) = (&db, &start, &read, &end);
                s.spawn(move || {
                    let mut misreads = 0;
                    for _ in 0..rounds {
                        start.wait();
                        let mut txn = db.begin().unwrap();
                        let on = (0..doctors)
                            .filter(|&i| txn.get(&doctor(i)).unwrap().as_deref() == Some(b"1"))
                            .count();
                        if on != doctors {
                            misreads += 1;
                        }
                        txn.put(&doctor(me), b"0").unwrap();
                        read.wait();
                        let _ = txn.commit().unwrap();
                        end.wait();
                    }
                    misreads
                })
            })
            .collect();
        let mut violations = Vec::new();
        let mut progress = 0;
        for round in 0..rounds {
            reset(&db, doctors);
            start.wait();
            end.wait();
            let snapshot = db.snapshot().unwrap();
            let off = (0..doctors)
                .filter(|&i| snapshot.get(&doctor(i)).unwrap().as_deref() == Some(b"0"))
                .count();
            // Each committed transaction read every flag as 1 and wrote one: two commits in a
            // round would each have missed the other's write, a cycle of anti-dependencies.
            if off > 1 {
                violations.push((round, off));
            }
            if off > 0 {
                progress += 1;
            }
        }
        let misreads: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        (violations, progress, misreads)
    });
    assert_eq!(misreads, 0, "a round did not start with everyone on call");
    assert!(
        violations.is_empty(),
        "(round, doctors off call) with more than one off call at once: {violations:?}"
    );
    progress
}

#[test]
fn two_doctors_never_both_go_off_call() {
    let progress = on_call(2, 300);
    eprintln!("rounds in which one doctor went off call: {progress} of 300");
}

#[test]
fn four_doctors_keep_one_on_call() {
    let progress = on_call(4, 200);
    eprintln!("rounds in which one doctor went off call: {progress} of 200");
}

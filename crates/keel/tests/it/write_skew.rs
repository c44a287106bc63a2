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

/// `doctors` threads, `rounds` rounds; returns how many rounds let someone go off call.
fn on_call(doctors: usize, rounds: usize) -> usize {
    let db = Db::in_memory();
    let start = Barrier::new(doctors + 1);
    let read = Barrier::new(doctors);
    let end = Barrier::new(doctors + 1);
    std::thread::scope(|s| {
        for me in 0..doctors {
            let (db, start, read, end) = (&db, &start, &read, &end);
            s.spawn(move || {
                for _ in 0..rounds {
                    start.wait();
                    let mut txn = db.begin().unwrap();
                    let on: usize = (0..doctors)
                        .filter(|&i| txn.get(&doctor(i)).unwrap().as_deref() == Some(b"1"))
                        .count();
                    assert_eq!(on, doctors, "every round starts with everyone on call");
                    txn.put(&doctor(me), b"0").unwrap();
                    read.wait();
                    let _ = txn.commit().unwrap();
                    end.wait();
                }
            });
        }
        let mut progress = 0;
        for round in 0..rounds {
            db.transact(|txn| {
                for i in 0..doctors {
                    txn.put(&doctor(i), b"1")?;
                }
                Ok::<_, keel::Error>(())
            })
            .unwrap();
            start.wait();
            end.wait();
            let snapshot = db.snapshot().unwrap();
            let off = (0..doctors)
                .filter(|&i| snapshot.get(&doctor(i)).unwrap().as_deref() == Some(b"0"))
                .count();
            // Each committed transaction read every flag as 1 and wrote one: two commits in a
            // round would each have missed the other's write, a cycle of anti-dependencies.
            assert!(
                off <= 1,
                "round {round}: {off} of {doctors} doctors went off call at once"
            );
            if off > 0 {
                progress += 1;
            }
        }
        progress
    })
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

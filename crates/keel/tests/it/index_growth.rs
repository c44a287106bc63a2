//! The point index grows while it is read: a database sized for one key takes tens of
//! thousands of new keys from two threads, and meanwhile every key whose insert has
//! committed must be found by every later snapshot and transaction (a lookup that probes a
//! table being replaced must not miss it), and a final scan must find every key once.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use keel::{Db, Options};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const WRITERS: u64 = 2;
const KEYS_PER_WRITER: u64 = 20_000;
const KEYS_PER_TXN: u64 = 4;

fn key(writer: u64, i: u64) -> Vec<u8> {
    format!("w{writer}-{i:06}").into_bytes()
}

#[test]
fn committed_keys_stay_visible_while_the_index_grows() {
    let db = Db::with_options(Options::default().capacity_hint(1));
    let published: Vec<AtomicU64> = (0..WRITERS).map(|_| AtomicU64::new(0)).collect();
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let readers: Vec<_> = (0..2)
            .map(|reader| {
                let (db, published, done) = (&db, &published, &done);
                s.spawn(move || {
                    let mut rng = StdRng::seed_from_u64(reader);
                    let mut reads = 0u64;
                    while !done.load(Ordering::Relaxed) {
                        let writer = rng.random_range(0..WRITERS);
                        let count = published[writer as usize].load(Ordering::SeqCst);
                        if count == 0 {
                            continue;
                        }
                        let i = rng.random_range(0..count);
                        let k = key(writer, i);
                        let snapshot = db.snapshot().unwrap();
                        assert!(
                            snapshot.get(&k).unwrap().is_some(),
                            "snapshot lost committed key {}",
                            String::from_utf8_lossy(&k)
                        );
                        drop(snapshot);
                        let mut txn = db.begin().unwrap();
                        assert!(
                            txn.get(&k).unwrap().is_some(),
                            "transaction lost committed key {}",
                            String::from_utf8_lossy(&k)
                        );
                        drop(txn);
                        reads += 1;
                    }
                    reads
                })
            })
            .collect();
        let writers: Vec<_> = (0..WRITERS)
            .map(|writer| {
                let (db, published) = (&db, &published);
                s.spawn(move || {
                    for first in (0..KEYS_PER_WRITER).step_by(KEYS_PER_TXN as usize) {
                        db.transact(|txn| {
                            for i in first..first + KEYS_PER_TXN {
                                txn.put(&key(writer, i), b"v")?;
                            }
                            Ok::<_, keel::Error>(())
                        })
                        .unwrap();
                        published[writer as usize].store(first + KEYS_PER_TXN, Ordering::SeqCst);
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
        for r in readers {
            assert!(r.join().unwrap() > 0);
        }
    });
    let snapshot = db.snapshot().unwrap();
    for writer in 0..WRITERS {
        for i in 0..KEYS_PER_WRITER {
            assert!(snapshot.get(&key(writer, i)).unwrap().is_some());
        }
    }
    let scanned = snapshot.range(b"w".as_slice()..b"x".as_slice()).count() as u64;
    assert_eq!(scanned, WRITERS * KEYS_PER_WRITER);
}

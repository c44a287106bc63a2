use std::collections::BTreeSet;
use std::ops::Bound;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::index::hash;
use crate::memory::Arena;
use crate::mvcc::LockOwner;

fn record(arena: &Arena, key: &[u8]) -> RecordRef {
    RecordRef(Record::new_locked(
        arena,
        key,
        hash(key),
        LockOwner(1),
        None,
    ))
}

fn keys(records: impl Iterator<Item = RecordRef>) -> Vec<Vec<u8>> {
    records.map(|r| r.get().key().to_vec()).collect()
}

/// Every level is strictly sorted and a sublist of level 0; level 0 holds `expected`.
fn check_structure(list: &Ordered, expected: &BTreeSet<Vec<u8>>) {
    let all = keys(list.range(KeyRange {
        lo: Bound::Unbounded,
        hi: Bound::Unbounded,
    }));
    assert_eq!(all, expected.iter().cloned().collect::<Vec<_>>());
    for level in 0..MAX_HEIGHT {
        let mut at = list.head().link(level).load(Ordering::Acquire);
        let mut previous: Option<&[u8]> = None;
        // SAFETY: links point at live records of this test's arena.
        while let Some(r) = unsafe { at.as_ref() } {
            assert!(r.height() > level, "a record linked above its height");
            assert!(
                previous.is_none_or(|p| p < r.key()),
                "level {level} unsorted"
            );
            assert!(expected.contains(r.key()));
            previous = Some(r.key());
            at = r.link(level).load(Ordering::Acquire);
        }
    }
}

fn bound(rng: &mut StdRng) -> Bound<Vec<u8>> {
    let key = vec![rng.random_range(0..40u8)];
    match rng.random_range(0..3) {
        0 => Bound::Included(key),
        1 => Bound::Excluded(key),
        _ => Bound::Unbounded,
    }
}

#[test]
fn ranges_match_a_btree_from_both_ends() {
    let arena = Arena::new();
    let list = Ordered::new();
    let mut model = BTreeSet::new();
    let mut rng = StdRng::seed_from_u64(7);
    for _ in 0..30 {
        let key = vec![rng.random_range(0..40u8)];
        if model.insert(key.clone()) {
            list.insert(record(&arena, &key));
        }
    }
    check_structure(&list, &model);
    for _ in 0..2000 {
        let range = KeyRange {
            lo: bound(&mut rng),
            hi: bound(&mut rng),
        };
        let expected: Vec<Vec<u8>> = if range.is_empty() {
            Vec::new()
        } else {
            model.range::<[u8], _>(range.clone()).cloned().collect()
        };
        assert_eq!(keys(list.range(range.clone())), expected, "{range:?}");
        let mut reversed = keys(list.range(range.clone()).rev());
        reversed.reverse();
        assert_eq!(reversed, expected, "{range:?} reversed");
        // Alternate ends at random: together they yield each key once, in place.
        let mut iter = list.range(range.clone());
        let (mut front, mut back) = (Vec::new(), Vec::new());
        loop {
            let next = if rng.random_bool(0.5) {
                iter.next().map(|r| front.push(r.get().key().to_vec()))
            } else {
                iter.next_back().map(|r| back.push(r.get().key().to_vec()))
            };
            if next.is_none() {
                break;
            }
        }
        back.reverse();
        front.extend(back);
        assert_eq!(front, expected, "{range:?} from both ends");
    }
}

#[test]
fn sorted_build_equals_inserts_and_takes_more() {
    let arena = Arena::new();
    let mut model = BTreeSet::new();
    let mut built = Ordered::new();
    let sorted: Vec<RecordRef> = (0u32..5000)
        .map(|i| {
            let key = (i * 2).to_be_bytes().to_vec();
            model.insert(key.clone());
            record(&arena, &key)
        })
        .collect();
    built.build_sorted(&sorted);
    check_structure(&built, &model);
    // Joined from stretches, some of them empty (fresh records: links are set once).
    let fresh: Vec<RecordRef> = model.iter().map(|key| record(&arena, key)).collect();
    let mut joined = Ordered::new();
    let mut stretches = vec![Stretch::link(&[])];
    for part in fresh.chunks(777) {
        stretches.push(Stretch::link(part));
        stretches.push(Stretch::link(&[]));
    }
    joined.join(stretches);
    check_structure(&joined, &model);
    for i in 0u32..5000 {
        let key = (i * 2 + 1).to_be_bytes().to_vec();
        model.insert(key.clone());
        built.insert(record(&arena, &key));
    }
    check_structure(&built, &model);
}

#[test]
fn concurrent_inserts_and_scans_keep_every_level_sorted() {
    const THREADS: u32 = 4;
    const PER_THREAD: u32 = 20_000;
    let arena = Arena::new();
    let list = Ordered::new();
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let mut inserters = Vec::new();
        for t in 0..THREADS {
            let (arena, list) = (&arena, &list);
            inserters.push(s.spawn(move || {
                // Interleaved keys, so that threads keep inserting next to each other.
                let mut order: Vec<u32> = (0..PER_THREAD).map(|i| i * THREADS + t).collect();
                let mut rng = StdRng::seed_from_u64(u64::from(t));
                for i in (1..order.len()).rev() {
                    order.swap(i, rng.random_range(0..=i));
                }
                for k in order {
                    list.insert(record(arena, &k.to_be_bytes()));
                }
            }));
        }
        let (list, done) = (&list, &done);
        s.spawn(move || {
            while !done.load(Ordering::Relaxed) {
                let seen = keys(list.range(KeyRange {
                    lo: Bound::Unbounded,
                    hi: Bound::Unbounded,
                }));
                assert!(seen.windows(2).all(|w| w[0] < w[1]), "a scan saw disorder");
                let back = keys(
                    list.range(KeyRange {
                        lo: Bound::Included(1000u32.to_be_bytes().to_vec()),
                        hi: Bound::Excluded(1100u32.to_be_bytes().to_vec()),
                    })
                    .rev(),
                );
                assert!(back.windows(2).all(|w| w[0] > w[1]));
            }
        });
        for inserter in inserters {
            inserter.join().expect("inserter");
        }
        done.store(true, Ordering::Relaxed);
    });
    let model: BTreeSet<Vec<u8>> = (0..THREADS * PER_THREAD)
        .map(|k| k.to_be_bytes().to_vec())
        .collect();
    check_structure(&list, &model);
}

#[test]
fn word_compare_is_byte_order() {
    let mut rng = StdRng::seed_from_u64(3);
    for _ in 0..20_000 {
        let len = |rng: &mut StdRng| rng.random_range(0..20);
        let (la, lb) = (len(&mut rng), len(&mut rng));
        // Few distinct bytes, so that long common prefixes are common.
        let a: Vec<u8> = (0..la).map(|_| rng.random_range(0..3)).collect();
        let b: Vec<u8> = (0..lb).map(|_| rng.random_range(0..3)).collect();
        assert_eq!(compare(&a, &b), a.cmp(&b), "{a:?} {b:?}");
    }
}

#[test]
fn heights_are_geometric() {
    let mut counts = [0u32; MAX_HEIGHT + 1];
    for _ in 0..100_000 {
        counts[random_height()] += 1;
    }
    assert_eq!(counts[0], 0);
    // P(height 1) = 3/4, P(height 2) = 3/16.
    assert!((70_000..80_000).contains(&counts[1]), "{counts:?}");
    assert!((15_000..22_000).contains(&counts[2]), "{counts:?}");
}

/// Not a test: `cargo test --release -p keel --lib -- --ignored insert_speed --nocapture`.
#[test]
#[ignore = "timing, not a test"]
fn insert_speed() {
    let arena = Arena::new();
    let list = Ordered::new();
    let n = 1_000_000u64;
    let mut order: Vec<u64> = (0..n).collect();
    let mut rng = StdRng::seed_from_u64(1);
    for i in (1..order.len()).rev() {
        order.swap(i, rng.random_range(0..=i));
    }
    let keys: Vec<Vec<u8>> = order
        .iter()
        .map(|i| format!("key:{i:012}").into_bytes())
        .collect();
    let records: Vec<RecordRef> = keys.iter().map(|k| record(&arena, k)).collect();
    let started = std::time::Instant::now();
    for r in &records {
        list.insert(*r);
    }
    let elapsed = started.elapsed();
    println!("{:.0} ns per insert", elapsed.as_nanos() as f64 / n as f64);
}

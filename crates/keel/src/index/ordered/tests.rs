use std::collections::BTreeSet;
use std::ops::Bound;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::index::tests::record;
use crate::memory::Arena;

fn keys(records: impl Iterator<Item = RecordRef>) -> Vec<Vec<u8>> {
    records.map(|r| r.get().key().to_vec()).collect()
}

/// The tree's shape is sound and it holds exactly `expected`: keys sorted within and across
/// nodes, each subtree inside its separators, heads matching keys, all leaves at one depth.
fn check_structure(list: &Ordered, expected: &BTreeSet<Vec<u8>>) {
    let all = keys(list.range(KeyRange {
        lo: Bound::Unbounded,
        hi: Bound::Unbounded,
    }));
    assert_eq!(all, expected.iter().cloned().collect::<Vec<_>>());
    let mut leaf_depths = BTreeSet::new();
    let mut in_leaves = Vec::new();
    let mut leaves = Vec::new();
    check_node(
        list.root(),
        None,
        None,
        0,
        &mut leaf_depths,
        &mut in_leaves,
        &mut leaves,
    );
    // The links run through the leaves in key order, the last one's to nothing.
    let mut linked = vec![leaves[0]];
    loop {
        let next = unsafe { &*linked[linked.len() - 1] }
            .next
            .load(Ordering::Relaxed);
        if next.is_null() {
            break;
        }
        linked.push(next.cast_const());
        assert!(linked.len() <= leaves.len(), "the links run in a loop");
    }
    assert_eq!(linked, leaves, "the links follow the leaves in order");
    assert_eq!(
        leaf_depths.len(),
        1,
        "leaves at several depths: {leaf_depths:?}"
    );
    assert_eq!(in_leaves, all, "leaves in order hold every key once");
}

fn check_node(
    node: &Node,
    lo: Option<&[u8]>,
    hi: Option<&[u8]>,
    depth: usize,
    leaf_depths: &mut BTreeSet<usize>,
    in_leaves: &mut Vec<Vec<u8>>,
    leaves: &mut Vec<*const Node>,
) {
    let n = node.count();
    let key = |i: usize| unsafe { &*node.key(i) }.key();
    for i in 0..n {
        let k = key(i);
        assert!(lo.is_none_or(|lo| lo <= k), "key below its node's range");
        assert!(hi.is_none_or(|hi| k < hi), "key above its node's range");
        assert!(i == 0 || key(i - 1) < k, "node unsorted");
        assert_eq!(
            node.heads[i].load(Ordering::Relaxed),
            head(k, node.prefix as usize)
        );
        assert!(k.len() >= node.prefix as usize);
    }
    if node.is_leaf() {
        leaf_depths.insert(depth);
        leaves.push(node);
        in_leaves.extend((0..n).map(|i| key(i).to_vec()));
        return;
    }
    for c in 0..=n {
        let child = unsafe { &*node.children()[c].load(Ordering::Relaxed) };
        let child_lo = if c > 0 { Some(key(c - 1)) } else { lo };
        let child_hi = if c < n { Some(key(c)) } else { hi };
        check_node(
            child,
            child_lo,
            child_hi,
            depth + 1,
            leaf_depths,
            in_leaves,
            leaves,
        );
    }
}

/// A key of 0 to 3 bytes from a small alphabet: many shared prefixes, and prefixes of
/// each other. Half of them behind a 10-byte common prefix, so that node heads are taken
/// past the first word and comparisons reach the zero-padded tail.
fn small_key(rng: &mut StdRng) -> Vec<u8> {
    let len = rng.random_range(0..=3);
    let mut key = if rng.random_bool(0.5) {
        b"tenant:42/".to_vec()
    } else {
        Vec::new()
    };
    key.extend((0..len).map(|_| rng.random_range(0..12u8)));
    key
}

fn bound(rng: &mut StdRng) -> Bound<Vec<u8>> {
    let key = small_key(rng);
    match rng.random_range(0..3) {
        0 => Bound::Included(key),
        1 => Bound::Excluded(key),
        _ => Bound::Unbounded,
    }
}

#[test]
fn ranges_match_a_btree_from_both_ends() {
    for seed in 0..6 {
        let arena = Arena::new();
        let list = Ordered::new();
        let mut model = BTreeSet::new();
        let mut rng = StdRng::seed_from_u64(seed);
        for round in 0..3 {
            for _ in 0..[20, 300, 1500][round] {
                let key = small_key(&mut rng);
                if model.insert(key.clone()) {
                    list.insert(record(&arena, &key));
                }
            }
            check_structure(&list, &model);
            check_ranges(&list, &model, &mut rng);
        }
    }
}

fn check_ranges(list: &Ordered, model: &BTreeSet<Vec<u8>>, rng: &mut StdRng) {
    for _ in 0..700 {
        let range = KeyRange {
            lo: bound(rng),
            hi: bound(rng),
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
fn sorted_build_takes_more_inserts() {
    for total in [0u32, 1, 31, 32, 33, 1000, 5000] {
        let arena = Arena::new();
        let mut model = BTreeSet::new();
        // Keys with a long shared prefix, so that node prefixes matter.
        let key = |i: u32| format!("user:000000{i:08}").into_bytes();
        let sorted: Vec<RecordRef> = (0..total)
            .map(|i| {
                model.insert(key(i * 2));
                record(&arena, &key(i * 2))
            })
            .collect();
        let mut built = Ordered::new();
        // Stretches of uneven sizes, some empty.
        let mut stretches = vec![Vec::new()];
        for part in sorted.chunks(777) {
            stretches.push(part.to_vec());
            stretches.push(Vec::new());
        }
        built.build_sorted(stretches);
        check_structure(&built, &model);
        for i in (0..total).rev() {
            model.insert(key(i * 2 + 1));
            built.insert(record(&arena, &key(i * 2 + 1)));
        }
        check_structure(&built, &model);
    }
}

/// Inserters race scanners; every scan is sorted and sees every key whose insert had
/// returned before the scan began (what phantom protection relies on: a creator inserts its
/// record before it takes a timestamp, and a validating scan runs after).
#[test]
fn concurrent_inserts_and_scans_stay_sorted_and_miss_nothing_finished() {
    use std::sync::atomic::{AtomicBool, AtomicUsize};
    const THREADS: usize = 4;
    const PER_THREAD: usize = 20_000;
    let arena = Arena::new();
    let list = Ordered::new();
    let done = AtomicBool::new(false);
    // Each inserter's keys in its insertion order, and how many of them are in.
    let orders: Vec<Vec<u32>> = (0..THREADS)
        .map(|t| {
            // Interleaved keys, so that threads keep inserting next to each other.
            let mut order: Vec<u32> = (0..PER_THREAD).map(|i| (i * THREADS + t) as u32).collect();
            let mut rng = StdRng::seed_from_u64(t as u64);
            for i in (1..order.len()).rev() {
                order.swap(i, rng.random_range(0..=i));
            }
            order
        })
        .collect();
    let progress: Vec<AtomicUsize> = (0..THREADS).map(|_| AtomicUsize::new(0)).collect();
    std::thread::scope(|s| {
        let mut inserters = Vec::new();
        for (order, progress) in orders.iter().zip(&progress) {
            let (arena, list) = (&arena, &list);
            inserters.push(s.spawn(move || {
                for (n, k) in order.iter().enumerate() {
                    list.insert(record(arena, &k.to_be_bytes()));
                    progress.store(n + 1, Ordering::Release);
                }
            }));
        }
        for reverse in [false, true] {
            let (list, done, orders, progress) = (&list, &done, &orders, &progress);
            s.spawn(move || {
                let mut scans = 0;
                while !done.load(Ordering::Relaxed) || scans < 3 {
                    scans += 1;
                    let finished: Vec<usize> =
                        progress.iter().map(|p| p.load(Ordering::Acquire)).collect();
                    let everything = KeyRange {
                        lo: Bound::Unbounded,
                        hi: Bound::Unbounded,
                    };
                    let mut seen = if reverse {
                        let mut seen = keys(list.range(everything).rev());
                        assert!(seen.windows(2).all(|w| w[0] > w[1]), "a scan saw disorder");
                        seen.reverse();
                        seen
                    } else {
                        keys(list.range(everything))
                    };
                    assert!(seen.windows(2).all(|w| w[0] < w[1]), "a scan saw disorder");
                    seen.dedup();
                    for (order, &n) in orders.iter().zip(&finished) {
                        for k in &order[..n] {
                            assert!(
                                seen.binary_search(&k.to_be_bytes().to_vec()).is_ok(),
                                "a scan missed key {k}, inserted before it began"
                            );
                        }
                    }
                }
            });
        }
        for inserter in inserters {
            inserter.join().expect("inserter");
        }
        done.store(true, Ordering::Relaxed);
    });
    let model: BTreeSet<Vec<u8>> = (0..THREADS * PER_THREAD)
        .map(|k| (k as u32).to_be_bytes().to_vec())
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

#[test]
fn removal_and_rebuild_keep_order_and_free_empty_leaves() {
    let arena = Arena::new();
    let list = Ordered::new();
    let mut rng = StdRng::seed_from_u64(11);
    let mut live = BTreeSet::new();
    let mut records = Vec::new();
    for i in 0u32..20_000 {
        let key = format!("k{:08}", rng.random_range(0..1_000_000u32) * 7 + i % 7).into_bytes();
        if live.insert(key.clone()) {
            let r = record(&arena, &key);
            list.insert(r);
            records.push(r);
        }
    }
    let nodes_full = list.nodes();
    // Remove nine in ten; separators report themselves.
    let mut kept = Vec::new();
    for (i, r) in records.iter().enumerate() {
        if i % 10 == 0 {
            kept.push(*r);
            continue;
        }
        assert!(list.remove(*r).is_some());
        assert!(list.remove(*r).is_none(), "removed once");
        live.remove(r.get().key());
    }
    check_structure(&list, &live);
    assert_eq!(list.nodes(), nodes_full, "removal frees no node by itself");
    drop(list.rebuild());
    check_structure(&list, &live);
    assert!(
        list.nodes() * 5 < nodes_full,
        "a rebuild drops the empty leaves: {} of {nodes_full} nodes left",
        list.nodes()
    );
    // Inserts go on after it.
    let r = record(&arena, b"k~after");
    list.insert(r);
    live.insert(b"k~after".to_vec());
    check_structure(&list, &live);
    assert_eq!(kept.len() + 1, live.len());
}

/// Removing keys from the front, as pops of a queue's head do, leaves empty leaves there
/// until a rebuild: a scan from the start passes them by their links, and finds what is left
/// from either end and from any bound.
#[test]
fn scans_pass_empty_leaves() {
    let arena = Arena::new();
    let list = Ordered::new();
    let mut live = BTreeSet::new();
    let mut records = Vec::new();
    for i in 0u32..5_000 {
        let key = format!("q{:06}", (i * 7_919) % 5_000).into_bytes();
        let r = record(&arena, &key);
        list.insert(r);
        records.push(r);
        live.insert(key);
    }
    records.sort_by(|a, b| a.get().key().cmp(b.get().key()));
    let all = || KeyRange {
        lo: Bound::Unbounded,
        hi: Bound::Unbounded,
    };
    for (i, r) in records.iter().enumerate() {
        if i % 1000 == 999 {
            check_structure(&list, &live);
            let first = list.range(all()).next().map(|r| r.get().key().to_vec());
            assert_eq!(first.as_ref(), live.first());
            let last = list
                .range(all())
                .next_back()
                .map(|r| r.get().key().to_vec());
            assert_eq!(last.as_ref(), live.last());
            // From a bound inside the emptied stretch, both ways.
            let probe = b"q000500".to_vec();
            let from = keys(list.range(KeyRange {
                lo: Bound::Included(probe.clone()),
                hi: Bound::Unbounded,
            }));
            assert_eq!(
                from,
                live.range(probe.clone()..).cloned().collect::<Vec<_>>()
            );
            let to = keys(
                list.range(KeyRange {
                    lo: Bound::Unbounded,
                    hi: Bound::Excluded(probe.clone()),
                })
                .rev(),
            );
            assert_eq!(to, live.range(..probe).rev().cloned().collect::<Vec<_>>());
        }
        assert!(list.remove(*r).is_some());
        live.remove(r.get().key());
    }
    check_structure(&list, &live);
    assert!(list.range(all()).next().is_none());
}

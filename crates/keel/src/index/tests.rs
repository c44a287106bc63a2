use super::*;
use crate::mvcc::LockOwner;

fn record(key: &[u8]) -> RecordRef {
    RecordRef(Record::new_locked(key, hash(key), LockOwner(1)))
}

fn free_all(index: &Index) {
    for r in index.records().collect::<Vec<_>>() {
        // SAFETY: test teardown; each record is in the index once and nobody else holds it.
        unsafe { Record::free(r.0) };
    }
}

#[test]
fn insert_find_and_grow() {
    let index = Index::new(8);
    for i in 0u32..10_000 {
        let key = i.to_be_bytes();
        let (r, inserted) = index.insert(record(&key));
        assert!(inserted);
        assert_eq!(r.get().key(), key);
    }
    assert_eq!(index.len(), 10_000);
    for i in 0u32..10_000 {
        let key = i.to_be_bytes();
        assert_eq!(index.get(&key, hash(&key)).unwrap().get().key(), key);
    }
    assert!(index.get(b"missing", hash(b"missing")).is_none());
    let dup = record(&7u32.to_be_bytes());
    let (existing, inserted) = index.insert(dup);
    assert!(!inserted);
    assert_ne!(existing, dup);
    // SAFETY: `dup` was not inserted.
    unsafe { Record::free(dup.0) };
    free_all(&index);
}

#[test]
fn concurrent_inserts_of_the_same_keys_agree() {
    let index = Index::new(16);
    let winners: Vec<Vec<RecordRef>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    (0u32..5_000)
                        .map(|i| {
                            let new = record(&i.to_be_bytes());
                            let (r, inserted) = index.insert(new);
                            if !inserted {
                                // SAFETY: `new` lost the race and was never published.
                                unsafe { Record::free(new.0) };
                            }
                            r
                        })
                        .collect()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for i in 0..5_000 {
        assert!(
            winners.iter().all(|w| w[i] == winners[0][i]),
            "key {i} has two records"
        );
    }
    assert_eq!(index.len(), 5_000);
    free_all(&index);
}

#[test]
fn hash_spreads_short_keys() {
    let mut buckets = [0u32; 64];
    let mut tags = std::collections::HashSet::new();
    for i in 0u64..64_000 {
        let h = hash(&i.to_be_bytes());
        buckets[(h & 63) as usize] += 1;
        tags.insert(h >> 48);
    }
    assert!(
        buckets.iter().all(|&n| (800..1200).contains(&n)),
        "{buckets:?}"
    );
    assert!(tags.len() > 40_000);
}

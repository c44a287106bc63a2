//! Deleted keys give their memory back: a process that keeps creating keys it has never
//! used and deleting them stays within a bounded size, round after round.
//!
//! A binary of its own, so that the resident set it measures is this test's alone.

use keel::{Db, Options};

/// Resident memory of this process, from /proc.
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status");
    kib * 1024
}

const KEYS_PER_ROUND: usize = 60_000;
const ROUNDS: usize = 14;

fn round(db: &Db, r: usize) {
    let key = |i: usize| format!("session:{r:04}:{i:08}").into_bytes();
    for chunk in (0..KEYS_PER_ROUND).collect::<Vec<_>>().chunks(500) {
        db.transact(|txn| {
            for &i in chunk {
                txn.put(&key(i), b"a value of some thirty bytes..")?;
            }
            Ok::<_, keel::Error>(())
        })
        .unwrap();
    }
    let snapshot = db.snapshot().unwrap();
    let prefix = format!("session:{r:04}:");
    assert_eq!(
        snapshot
            .range(prefix.as_bytes()..format!("session:{r:04};").as_bytes())
            .count(),
        KEYS_PER_ROUND
    );
    drop(snapshot);
    for chunk in (0..KEYS_PER_ROUND).collect::<Vec<_>>().chunks(500) {
        db.transact(|txn| {
            for &i in chunk {
                txn.delete(&key(i))?;
            }
            Ok::<_, keel::Error>(())
        })
        .unwrap();
    }
}

#[test]
fn creating_and_deleting_keys_keeps_memory_bounded() {
    let db = Db::in_memory();
    let mut rss = Vec::new();
    let mut arena = Vec::new();
    for r in 0..ROUNDS {
        round(&db, r);
        db.reclaim_deleted(1000);
        let stats = db.stats();
        assert_eq!(
            stats.records, 0,
            "round {r}: every deleted key's record is reclaimed"
        );
        assert_eq!(db.snapshot().unwrap().range::<&[u8]>(..).count(), 0);
        rss.push(rss_bytes());
        arena.push(stats.record_bytes);
    }
    eprintln!(
        "rss per round (MiB): {:?}",
        rss.iter().map(|b| b >> 20).collect::<Vec<_>>()
    );
    eprintln!(
        "record bytes per round (MiB): {:?}",
        arena.iter().map(|b| b >> 20).collect::<Vec<_>>()
    );
    // Without reclamation each round keeps ~60 000 records, two index entries each and their
    // versions: > 10 MiB a round, 120 MiB over the rounds measured.
    let (settled, last) = (rss[3], rss[ROUNDS - 1]);
    assert!(
        last <= settled + (16 << 20),
        "memory kept growing: {} MiB after round 4, {} MiB after round {ROUNDS}",
        settled >> 20,
        last >> 20
    );
    assert_eq!(
        arena[ROUNDS - 1],
        arena[3],
        "freed records are reused: the arena maps nothing more"
    );
    // Every deleted record is unlinked (`records` was 0 after each round) and freed once
    // the horizon passes it, except those the ordered index still uses as separators: they
    // wait for its next rebuild (`gc.rs`), which comes after enough removals, so how many
    // wait at the end depends on where the last rebuild fell. They are a small share (one
    // per index node); a collector that freed nothing, or only some rounds, fails this.
    let want = (KEYS_PER_ROUND * ROUNDS) as u64;
    let freed = db.stats().reclaimed_records;
    eprintln!("records freed: {freed} of {want} deleted");
    assert!(
        freed >= want * 9 / 10,
        "{freed} records freed of {want} deleted"
    );
}

#[test]
fn a_snapshot_holds_deleted_keys_until_it_ends() {
    let db = Db::with_options(Options::default());
    db.transact(|txn| {
        for i in 0..1000u32 {
            txn.put(&i.to_be_bytes(), b"kept for the snapshot")?;
        }
        Ok::<_, keel::Error>(())
    })
    .unwrap();
    let snapshot = db.snapshot().unwrap();
    db.transact(|txn| {
        for i in 0..1000u32 {
            txn.delete(&i.to_be_bytes())?;
        }
        Ok::<_, keel::Error>(())
    })
    .unwrap();
    db.reclaim_deleted(50);
    assert_eq!(
        db.stats().records,
        1000,
        "the open snapshot still sees them"
    );
    assert_eq!(snapshot.range::<&[u8]>(..).count(), 1000);
    assert_eq!(
        snapshot.get(&7u32.to_be_bytes()).unwrap().as_deref(),
        Some(&b"kept for the snapshot"[..])
    );
    drop(snapshot);
    db.reclaim_deleted(1000);
    assert_eq!(db.stats().records, 0);
    // The keys can be written again, and read back.
    db.transact(|txn| txn.put(&7u32.to_be_bytes(), b"again"))
        .unwrap();
    assert_eq!(
        db.snapshot()
            .unwrap()
            .get(&7u32.to_be_bytes())
            .unwrap()
            .as_deref(),
        Some(&b"again"[..])
    );
}

#[test]
fn records_left_by_aborted_creations_are_reclaimed() {
    let db = Db::in_memory();
    db.transact(|txn| txn.put(b"guard", b"0")).unwrap();
    for i in 0..2000u32 {
        // Reads `guard`, which another commit changes before this one commits: the
        // commit locks (and creates) its new key, then fails validation.
        let mut txn = db.begin().unwrap();
        txn.get(b"guard").unwrap();
        txn.put(format!("new:{i}").as_bytes(), b"never").unwrap();
        db.transact(|t| t.put(b"guard", i.to_string().as_bytes()))
            .unwrap();
        assert!(txn.commit().unwrap().is_err());
    }
    db.reclaim_deleted(1000);
    assert_eq!(db.stats().records, 1, "only `guard` is left");
    assert_eq!(db.snapshot().unwrap().range::<&[u8]>(..).count(), 1);
}

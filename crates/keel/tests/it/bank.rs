//! Bank transfers: money moves between accounts from several threads, and no reader ever sees
//! the total change.
//!
//! Transfers run as read-modify-write transactions (read both balances, put both back) and,
//! in a variant, as pairs of commutative `add`s that read nothing. Meanwhile an auditor reads
//! every account through snapshots and through read-write transactions, with point reads, a
//! forward range, a reverse range and a range read from both ends, and checks each sum. A
//! snapshot that saw half a transfer, or a transfer that lost an update, changes the total.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use keel::{Db, Options, SplitMode};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const ACCOUNTS: usize = 8;
const BALANCE: i64 = 1000;
const TOTAL: i64 = ACCOUNTS as i64 * BALANCE;
const TRANSFERS: u64 = 1500;

fn account(i: usize) -> Vec<u8> {
    format!("acct{i:02}").into_bytes()
}

fn balance(value: Option<Vec<u8>>) -> i64 {
    let value = value.expect("accounts are never deleted");
    std::str::from_utf8(&value)
        .expect("balances are ASCII")
        .parse()
        .expect("balances are integers")
}

fn range_sum(items: impl Iterator<Item = (Vec<u8>, Vec<u8>)>) -> (usize, i64) {
    items.fold((0, 0), |(n, sum), (_, v)| (n + 1, sum + balance(Some(v))))
}

fn both_ends(mut items: impl DoubleEndedIterator<Item = (Vec<u8>, Vec<u8>)>) -> (usize, i64) {
    let (mut n, mut sum) = (0, 0);
    loop {
        let item = if n % 2 == 0 {
            items.next()
        } else {
            items.next_back()
        };
        let Some((_, v)) = item else {
            return (n, sum);
        };
        n += 1;
        sum += balance(Some(v));
    }
}

fn transfer_by_put(db: &Db, rng: &mut StdRng) -> u64 {
    let from = rng.random_range(0..ACCOUNTS);
    let to = (from + rng.random_range(1..ACCOUNTS)) % ACCOUNTS;
    let amount = rng.random_range(1..=50);
    let mut conflicts = 0;
    let mut _joined = None;
    loop {
        let mut txn = db.begin().unwrap();
        let a = balance(txn.get(&account(from)).unwrap());
        let b = balance(txn.get(&account(to)).unwrap());
        txn.put(&account(from), (a - amount).to_string().as_bytes())
            .unwrap();
        txn.put(&account(to), (b + amount).to_string().as_bytes())
            .unwrap();
        match txn.commit().unwrap() {
            Ok(_) => return conflicts,
            Err(c) => {
                conflicts += 1;
                if c.reason == keel::ConflictReason::Split {
                    // Held across the retry, so the retry runs in the joined phase.
                    _joined = Some(db.wait_joined());
                }
            }
        }
    }
}

fn transfer_by_add(db: &Db, rng: &mut StdRng) -> u64 {
    let from = rng.random_range(0..ACCOUNTS);
    let to = (from + rng.random_range(1..ACCOUNTS)) % ACCOUNTS;
    let amount = rng.random_range(1..=50);
    let mut conflicts = 0;
    loop {
        let mut txn = db.begin().unwrap();
        txn.add(&account(from), -amount).unwrap();
        txn.add(&account(to), amount).unwrap();
        match txn.commit().unwrap() {
            Ok(_) => return conflicts,
            Err(_) => conflicts += 1,
        }
    }
}

/// One audit of every kind; panics if any sees a different total.
fn audit(db: &Db, round: u64) {
    let lo = account(0);
    let hi = account(ACCOUNTS - 1);
    let snapshot = db.snapshot().unwrap();
    let points: i64 = (0..ACCOUNTS)
        .map(|i| balance(snapshot.get(&account(i)).unwrap()))
        .sum();
    assert_eq!(points, TOTAL, "snapshot point reads, audit {round}");
    let forward = range_sum(snapshot.range(lo.as_slice()..=hi.as_slice()));
    assert_eq!(forward, (ACCOUNTS, TOTAL), "snapshot range, audit {round}");
    let backward = range_sum(snapshot.range(lo.as_slice()..=hi.as_slice()).rev());
    assert_eq!(
        backward,
        (ACCOUNTS, TOTAL),
        "snapshot reverse range, audit {round}"
    );
    drop(snapshot);

    let mut txn = db.begin().unwrap();
    let points: i64 = (0..ACCOUNTS)
        .map(|i| balance(txn.get(&account(i)).unwrap()))
        .sum();
    assert_eq!(points, TOTAL, "transaction point reads, audit {round}");
    let ends = both_ends(txn.range(lo.as_slice()..=hi.as_slice()));
    assert_eq!(
        ends,
        (ACCOUNTS, TOTAL),
        "transaction two-ended range, audit {round}"
    );
    if round.is_multiple_of(2) {
        // A writing auditor is validated: its reads must still hold at commit.
        txn.put(b"audits", round.to_string().as_bytes()).unwrap();
    }
    txn.commit().unwrap().ok();
}

fn run(seed: u64, by_add: bool, split: SplitMode) {
    let db = Db::with_options(
        Options::default()
            .split(split)
            .split_phase(Duration::from_millis(2)),
    );
    db.transact(|txn| {
        for i in 0..ACCOUNTS {
            txn.put(&account(i), BALANCE.to_string().as_bytes())?;
        }
        Ok::<_, keel::Error>(())
    })
    .unwrap();
    let done = AtomicBool::new(false);
    let audits_done = AtomicU64::new(0);
    let started = Instant::now();
    let audits = std::thread::scope(|s| {
        let auditor = s.spawn(|| {
            let mut round = 0;
            while !done.load(Ordering::Relaxed) {
                audit(&db, round);
                round += 1;
                audits_done.store(round, Ordering::Relaxed);
            }
            round
        });
        let transfers: Vec<_> = (0..3)
            .map(|thread| {
                let (db, audits_done, started) = (&db, &audits_done, &started);
                s.spawn(move || {
                    let mut rng = StdRng::seed_from_u64(seed * 10 + thread);
                    let mut conflicts = 0;
                    // At least 1500 transfers, and more until the auditor has audited a
                    // while (a release build transfers faster than it audits), within reason.
                    let mut transfers = 0;
                    while transfers < TRANSFERS
                        || (audits_done.load(Ordering::Relaxed) < 50
                            && started.elapsed() < Duration::from_secs(20))
                    {
                        transfers += 1;
                        conflicts += if by_add && thread > 0 {
                            transfer_by_add(db, &mut rng)
                        } else {
                            transfer_by_put(db, &mut rng)
                        };
                    }
                    conflicts
                })
            })
            .collect();
        let results: Vec<_> = transfers.into_iter().map(|t| t.join()).collect();
        // Stop the auditor before looking at the results, so that a failed transfer thread
        // fails the test instead of leaving the auditor running.
        done.store(true, Ordering::Relaxed);
        let conflicts: u64 = results
            .into_iter()
            .map(|r| r.unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
            .sum();
        eprintln!("seed {seed}, by_add {by_add}: {conflicts} conflicts");
        auditor.join().unwrap()
    });
    assert!(audits > 0);
    audit(&db, u64::MAX);
    let stats = db.stats();
    assert!(stats.commits > 3 * TRANSFERS, "{stats:?}");
    if split == SplitMode::Force && by_add {
        assert!(
            stats.split_commits > 0,
            "no transfer used a slice: {stats:?}"
        );
        assert!(
            stats.split_stashes > 0,
            "no transfer was stashed: {stats:?}"
        );
    }
}

#[test]
fn transfers_by_read_and_put_keep_the_total() {
    run(1, false, SplitMode::Off);
    run(2, false, SplitMode::Off);
}

#[test]
fn transfers_by_add_keep_the_total() {
    run(3, true, SplitMode::Off);
}

/// Every account an add touches is split: adds go to slices, transfers that read an account
/// are stashed until its reconciliation, and the auditor's snapshots and ranges still see a
/// constant total.
#[test]
fn transfers_with_split_accounts_keep_the_total() {
    run(4, true, SplitMode::Force);
    run(5, true, SplitMode::Auto);
}

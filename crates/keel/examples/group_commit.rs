//! Group commit under `sync` durability: many committers, one fsync for many commits.
//!
//! `cargo run --release -p keel --example group_commit -- [dir] [committers] [seconds]`
//! prints committed txn/s, fsyncs/s and transactions per fsync.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "/tmp/keel-group-commit".into());
    let committers: usize = args.get(2).map_or(64, |a| a.parse().expect("committers"));
    let seconds: f64 = args.get(3).map_or(5.0, |a| a.parse().expect("seconds"));
    let _ = std::fs::remove_dir_all(&dir);
    let db = keel::Db::open(&dir, keel::Options::default()).expect("open");
    let stop = AtomicBool::new(false);
    let commits = AtomicU64::new(0);
    let value = [7u8; 100];
    let before = db.stats();
    let started = Instant::now();
    std::thread::scope(|s| {
        for t in 0..committers {
            let (db, stop, commits) = (&db, &stop, &commits);
            s.spawn(move || {
                let mut n = 0u64;
                let mut key = (t as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                while !stop.load(Ordering::Relaxed) {
                    key = key
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let k = (key % 1_000_000).to_be_bytes();
                    db.transact(|txn| txn.put(&k, &value)).expect("commit");
                    n += 1;
                }
                commits.fetch_add(n, Ordering::Relaxed);
            });
        }
        std::thread::sleep(Duration::from_secs_f64(seconds));
        stop.store(true, Ordering::Relaxed);
    });
    let elapsed = started.elapsed().as_secs_f64();
    let after = db.stats();
    let n = commits.load(Ordering::Relaxed) as f64;
    let fsyncs = (after.log_fsyncs - before.log_fsyncs) as f64;
    println!(
        "sync, {committers} committers: {:.0} txn/s, {:.0} fsyncs/s, {:.1} txn per fsync",
        n / elapsed,
        fsyncs / elapsed,
        n / fsyncs.max(1.0)
    );
    drop(db);
    let _ = std::fs::remove_dir_all(&dir);
}

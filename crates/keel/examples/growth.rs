//! Stalls while the point index grows: how long the slowest commits take as a database fills.
//!
//! `cargo run --release -p keel --example growth -- [keys] [batch]`
//! One thread commits `keys` new keys (redis-benchmark's `key:` + 12 digits, 3-byte values)
//! in transactions of `batch` puts, into an in-memory database with the default capacity
//! hint, so the index grows several times on the way. Prints the total rate and the five
//! slowest commits with the key count they ran at: a growth shows as one commit that waits
//! for the whole table to be rehashed, which a server thread serving many clients spends
//! serving none of them.

use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let keys: u64 = args.get(1).map_or(2_000_000, |a| a.parse().expect("keys"));
    let batch: u64 = args.get(2).map_or(16, |a| a.parse().expect("batch"));
    let db = keel::Db::in_memory();
    let mut slowest: Vec<(Duration, u64)> = Vec::new();
    let started = Instant::now();
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    let mut written = 0;
    while written < keys {
        let n = batch.min(keys - written);
        let names: Vec<String> = (0..n)
            .map(|_| {
                // xorshift: distinct enough keys in a random order, as redis-benchmark -r sends
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                format!("key:{:012}", x % 1_000_000_000_000)
            })
            .collect();
        let commit = Instant::now();
        db.transact(|txn| names.iter().try_for_each(|k| txn.put(k.as_bytes(), b"xxx")))
            .expect("commit");
        let took = commit.elapsed();
        written += n;
        slowest.push((took, written));
        if slowest.len() > 64 {
            slowest.sort_unstable_by(|a, b| b.cmp(a));
            slowest.truncate(5);
        }
    }
    let total = started.elapsed();
    slowest.sort_unstable_by(|a, b| b.cmp(a));
    println!(
        "{keys} keys in batches of {batch}: {:.2}s, {:.0} keys/s",
        total.as_secs_f64(),
        keys as f64 / total.as_secs_f64()
    );
    for (took, at) in slowest.iter().take(5) {
        println!(
            "  slow commit: {:.2} ms at {at} keys",
            took.as_secs_f64() * 1e3
        );
    }
}

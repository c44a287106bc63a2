//! A minimal `deut` driver for profiling the engine alone (`perf record`, callgrind) without
//! the benchmark harness around it. The numbers worth quoting come from `keel bench`.
//!
//! `cargo run --release -p keel --example profile_deut -- [records] [threads] [seconds] [theta]`

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize, default: f64| {
        args.get(i)
            .map_or(default, |a| a.parse().expect("a number"))
    };
    let records = arg(1, 1_000_000.0) as u64;
    let threads = arg(2, 2.0) as usize;
    let seconds = arg(3, 5.0);
    let theta = arg(4, 0.8);

    let db = keel::Db::with_options(keel::Options::default().capacity_hint(records as usize));
    let value = [7u8; 100];
    let started = Instant::now();
    for chunk in (0..records).collect::<Vec<_>>().chunks(10_000) {
        let mut txn = db.begin().expect("begin");
        for &k in chunk {
            txn.put(&k.to_be_bytes(), &value).expect("put");
        }
        txn.commit()
            .expect("commit")
            .expect("no conflict while loading");
    }
    eprintln!(
        "loaded {records} in {:.1}s",
        started.elapsed().as_secs_f64()
    );

    let stop = AtomicBool::new(false);
    let commits = AtomicU64::new(0);
    let aborts = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..threads {
            let (db, stop, commits, aborts) = (&db, &stop, &commits, &aborts);
            s.spawn(move || {
                let keys = zipf_keys(records, theta, 1 << 20, t as u64 + 1);
                let mut i = 0usize;
                let mut next = || {
                    i = (i + 1) & ((1 << 20) - 1);
                    keys[i].to_be_bytes()
                };
                let (mut c, mut a) = (0u64, 0u64);
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    if n.is_multiple_of(2) {
                        let snap = db.snapshot().expect("snapshot");
                        for _ in 0..4 {
                            snap.get_with(&next(), |v| std::hint::black_box(v.map(|v| v[0])))
                                .expect("get");
                        }
                        c += 1;
                    } else {
                        let ks = [next(), next(), next(), next()];
                        loop {
                            let mut txn = db.begin().expect("begin");
                            txn.get_with(&ks[0], |v| std::hint::black_box(v.map(|v| v[0])))
                                .expect("get");
                            txn.get_with(&ks[1], |v| std::hint::black_box(v.map(|v| v[0])))
                                .expect("get");
                            txn.put(&ks[2], &value).expect("put");
                            txn.put(&ks[3], &value).expect("put");
                            match txn.commit().expect("commit") {
                                Ok(_) => break,
                                Err(_) => a += 1,
                            }
                        }
                        c += 1;
                    }
                }
                commits.fetch_add(c, Ordering::Relaxed);
                aborts.fetch_add(a, Ordering::Relaxed);
            });
        }
        std::thread::sleep(Duration::from_secs_f64(seconds));
        stop.store(true, Ordering::Relaxed);
    });
    let c = commits.load(Ordering::Relaxed) as f64 / seconds;
    let a = aborts.load(Ordering::Relaxed) as f64 / seconds;
    println!(
        "deut theta={theta} records={records} threads={threads}: {c:.0} txn/s, {a:.0} aborts/s"
    );
    eprintln!("{:?}", db.stats());
    // Freeing millions of records is not what is being profiled.
    std::process::exit(0);
}

/// Scrambled Zipfian keys (Gray et al.'s generator, as YCSB), drawn before timing.
fn zipf_keys(n: u64, theta: f64, count: usize, seed: u64) -> Vec<u64> {
    let zeta = |n: u64| (1..=n).map(|i| 1.0 / (i as f64).powf(theta)).sum::<f64>();
    let zetan = zeta(n);
    let zeta2 = zeta(2);
    let alpha = 1.0 / (1.0 - theta);
    let eta = (1.0 - (2.0 / n as f64).powf(1.0 - theta)) / (1.0 - zeta2 / zetan);
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..count)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let u = (state >> 11) as f64 / (1u64 << 53) as f64;
            let uz = u * zetan;
            let rank = if uz < 1.0 {
                0
            } else if uz < 1.0 + 0.5f64.powf(theta) {
                1
            } else {
                ((n as f64) * (eta * u - eta + 1.0).powf(alpha)) as u64
            };
            // FNV-style scramble so hot ranks spread over the key space.
            let mut h = 0xcbf2_9ce4_8422_2325u64;
            for b in rank.min(n - 1).to_le_bytes() {
                h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
            }
            h % n
        })
        .collect()
}

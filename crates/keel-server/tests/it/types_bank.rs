//! The bank test over hash fields, while keys expire around it: transfers between fields of
//! two hashes (commutative `HINCRBY` pairs in `MULTI`, and read-then-write transfers under
//! `WATCH`), TTLs set on and removed from the bank's own hashes, and a stream of short-lived
//! keys of every type expiring under the expirer. Every snapshot (one `MULTI` of two `HGETALL`s)
//! must hold every account and sum to the total; at the end the short-lived keys are gone.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::Value;

use crate::{TestServer, connect, query};

const HASHES: [&str; 2] = ["bank:{a}", "bank:{b}"];
const FIELDS: usize = 8;
const START: i64 = 1000;
const TOTAL: i64 = START * (HASHES.len() * FIELDS) as i64;

/// Account `i` (any number: it wraps around the accounts).
fn account(i: usize) -> (&'static str, String) {
    let i = i % (HASHES.len() * FIELDS);
    (
        HASHES[i % HASHES.len()],
        format!("acct{}", i / HASHES.len()),
    )
}

/// Reads every account in one transaction; panics unless the books balance.
fn audit(c: &mut redis::Connection) -> i64 {
    let mut pipe = redis::pipe();
    pipe.atomic();
    for h in HASHES {
        pipe.cmd("HGETALL").arg(h);
    }
    let replies: Vec<Value> = pipe.query(c).expect("audit");
    let mut sum = 0;
    let mut accounts = 0;
    for reply in replies {
        let fields: Vec<(String, i64)> = match reply {
            Value::Map(m) => m
                .into_iter()
                .map(|(k, v)| {
                    (
                        redis::from_redis_value(k).expect("field"),
                        redis::from_redis_value(v).expect("balance"),
                    )
                })
                .collect(),
            other => {
                let flat: Vec<String> = redis::from_redis_value(other).expect("HGETALL reply");
                flat.chunks(2)
                    .map(|kv| (kv[0].clone(), kv[1].parse().expect("balance")))
                    .collect()
            }
        };
        accounts += fields.len();
        sum += fields.iter().map(|(_, v)| v).sum::<i64>();
    }
    assert_eq!(accounts, HASHES.len() * FIELDS, "an account vanished");
    assert_eq!(sum, TOTAL, "the books do not balance");
    sum
}

#[test]
fn hash_bank_balances_while_keys_expire_around_it() {
    let server = TestServer::start();
    let mut c = server.client();
    for i in 0..HASHES.len() * FIELDS {
        let (h, f) = account(i);
        let _: i64 = query(&mut c, &["HSET", h, &f, &START.to_string()]);
    }
    audit(&mut c);

    let stop = Arc::new(AtomicBool::new(false));
    let transfers = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();

    // Commutative transfers: never conflict, each one serializable transaction.
    for seed in 0..2u64 {
        let (url, stop, transfers) = (server.url(seed == 1), stop.clone(), transfers.clone());
        threads.push(std::thread::spawn(move || {
            let mut c = connect(&url);
            let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            while !stop.load(Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let n = HASHES.len() * FIELDS;
                let (from, to) = (x as usize % n, (x >> 20) as usize % n);
                let amount = (x >> 40) as i64 % 50;
                let ((fh, ff), (th, tf)) = (account(from), account(to));
                let _: Vec<i64> = redis::pipe()
                    .atomic()
                    .cmd("HINCRBY")
                    .arg(fh)
                    .arg(&ff)
                    .arg(-amount)
                    .cmd("HINCRBY")
                    .arg(th)
                    .arg(&tf)
                    .arg(amount)
                    .query(&mut c)
                    .expect("transfer");
                transfers.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }

    // Read-then-write transfers under WATCH: they may lose to others and retry.
    {
        let (url, stop, transfers) = (server.url(false), stop.clone(), transfers.clone());
        threads.push(std::thread::spawn(move || {
            let mut c = connect(&url);
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let ((fh, ff), (th, tf)) = (account(i * 7), account(i * 11 + 3));
                let _: () = redis::cmd("WATCH").arg(fh).arg(th).query(&mut c).unwrap();
                let balance: i64 = redis::cmd("HGET").arg(fh).arg(&ff).query(&mut c).unwrap();
                let amount = balance.clamp(0, 30);
                let done: Option<Vec<Value>> = redis::pipe()
                    .atomic()
                    .cmd("HSET")
                    .arg(fh)
                    .arg(&ff)
                    .arg(balance - amount)
                    .cmd("HINCRBY")
                    .arg(th)
                    .arg(&tf)
                    .arg(amount)
                    .query(&mut c)
                    .expect("watched transfer");
                if done.is_some() {
                    transfers.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }

    // TTLs on the bank's own hashes, set far ahead and removed again: nothing may be lost.
    // Short-lived keys of every type, left to the expirer (most are never read again).
    {
        let (url, stop) = (server.url(false), stop.clone());
        threads.push(std::thread::spawn(move || {
            let mut c = connect(&url);
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let h = HASHES[(n % 2) as usize];
                let _: i64 = query(&mut c, &["PEXPIRE", h, "600000"]);
                let _: i64 = query(&mut c, &["PERSIST", h]);
                let ttl = (1 + n % 20).to_string();
                let k = format!("tmp:{n}");
                let _: () = query(&mut c, &["SET", &format!("{k}:s"), "v", "PX", &ttl]);
                let _: i64 = query(&mut c, &["HSET", &format!("{k}:h"), "f", "1", "g", "2"]);
                let _: i64 = query(&mut c, &["PEXPIRE", &format!("{k}:h"), &ttl]);
                if n.is_multiple_of(3) {
                    // Read some back as they expire: a reader that meets an expired key
                    // deletes it (or, outside MULTI, reruns as a transaction that does).
                    let _: Value = query(&mut c, &["GET", &format!("tmp:{}:s", n - 1)]);
                    let _: Value = query(&mut c, &["HGETALL", &format!("tmp:{}:h", n - 2)]);
                }
            }
        }));
    }

    // At least 3 s, and on until the floors below are passed (a loaded machine fits less into
    // 3 s); if that takes 90 s, they fail.
    let started = Instant::now();
    let mut audits = 0;
    let mut c2 = server.client_proto(true);
    while started.elapsed() < Duration::from_secs(3)
        || transfers.load(Ordering::Relaxed) <= 100
        || audits <= 10
    {
        if started.elapsed() > Duration::from_secs(90) {
            break;
        }
        audit(&mut c);
        audit(&mut c2);
        audits += 2;
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("client thread");
    }
    audit(&mut c);
    assert!(transfers.load(Ordering::Relaxed) > 100, "transfers ran");
    assert!(audits > 10, "audits ran");
    for h in HASHES {
        assert_eq!(query::<i64>(&mut c, &["TTL", h]), -1, "{h} keeps no TTL");
    }

    // Every short-lived key expires and is deleted by the expirer, unread.
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let left: i64 = query(&mut c, &["DBSIZE"]);
        if left == HASHES.len() as i64 {
            break;
        }
        assert!(
            Instant::now() < until,
            "{left} keys left 10 s after the last TTL of at most 20 ms"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let keys: Vec<String> = query(&mut c, &["KEYS", "tmp:*"]);
    assert!(keys.is_empty(), "expired keys still listed: {keys:?}");
}

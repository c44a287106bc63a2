//! Strict serializability through the server over hash fields, checked by the engine's
//! list-append checker (`crates/keel/tests/it/history.rs`, with real-time edges), while keys
//! expire around it. Each list lives in a field of one of four hashes; a read-write
//! transaction `WATCH`es the hashes it touches, reads its lists with `HGET`, then writes the
//! longer lists with `HSET` in `MULTI … EXEC`; a read-only one reads its lists in one `MULTI`.
//! Meanwhile TTLs come and go on the hashes and short-lived keys expire under the expirer.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use redis::Value;

use crate::history::{Elem, Key, Op, Outcome, Report, TxnRecord, check, decode_list, encode_list};
use crate::{TestServer, connect, query};

const KEYS: Key = 8;
const THREADS: u64 = 4;
const TXNS_PER_THREAD: usize = 300;

fn field_of(k: Key) -> (String, String) {
    (format!("lh:{{{}}}", k % 4), format!("f{k}"))
}

fn bulk(v: Value) -> Option<Vec<u8>> {
    match v {
        Value::Nil => None,
        Value::BulkString(b) => Some(b),
        other => panic!("a list value, not {other:?}"),
    }
}

/// One thread's transactions: ops, outcome and real-time interval (from `tick`).
fn client(url: &str, thread: u64, tick: &AtomicU64) -> Vec<TxnRecord> {
    let mut c = connect(url);
    let mut next = rng(thread);
    // Elements are unique across the history: the thread in the high bits.
    let mut elem: Elem = thread << 40;
    let mut history = Vec::new();
    for i in 0..TXNS_PER_THREAD {
        let n = 1 + next() % 3;
        let mut keys: Vec<Key> = (0..n).map(|_| (next() % u64::from(KEYS)) as Key).collect();
        keys.sort_unstable();
        keys.dedup();
        let read_only = next().is_multiple_of(4);
        let began = tick.fetch_add(1, Ordering::SeqCst);
        let mut ops = Vec::new();
        let outcome = if read_only {
            let mut pipe = redis::pipe();
            pipe.atomic();
            for &k in &keys {
                let (h, f) = field_of(k);
                pipe.cmd("HGET").arg(h).arg(f);
            }
            let values: Vec<Value> = pipe.query(&mut c).expect("read-only MULTI");
            for (&k, v) in keys.iter().zip(values) {
                let value = decode_list(bulk(v).as_deref());
                ops.push(Op::Read { key: k, value });
            }
            Outcome::Committed
        } else {
            let hashes: Vec<String> = keys.iter().map(|&k| field_of(k).0).collect();
            let _: () = redis::cmd("WATCH")
                .arg(&hashes)
                .query(&mut c)
                .expect("WATCH");
            let mut pipe = redis::pipe();
            pipe.atomic();
            for &k in &keys {
                let (h, f) = field_of(k);
                let v: Value = redis::cmd("HGET")
                    .arg(&h)
                    .arg(&f)
                    .query(&mut c)
                    .expect("HGET");
                let mut list = decode_list(bulk(v).as_deref());
                ops.push(Op::Read {
                    key: k,
                    value: list.clone(),
                });
                if !next().is_multiple_of(3) {
                    elem += 1;
                    list.push(elem);
                    ops.push(Op::Append { key: k, elem });
                    pipe.cmd("HSET").arg(h).arg(f).arg(encode_list(&list));
                }
            }
            let done: Option<Vec<Value>> = pipe.query(&mut c).expect("EXEC");
            if done.is_some() {
                Outcome::Committed
            } else {
                Outcome::Aborted
            }
        };
        let ended = tick.fetch_add(1, Ordering::SeqCst);
        history.push(TxnRecord {
            name: format!("t{thread}.{i}"),
            ops,
            outcome,
            position: None,
            read_ts: None,
            time: Some((began, ended)),
        });
    }
    history
}

/// A client thread of a history test: its transactions, timed by `tick`.
pub type Client = fn(&str, u64, &AtomicU64) -> Vec<TxnRecord>;

/// A seeded xorshift stream for client `thread`.
pub fn rng(thread: u64) -> impl FnMut() -> u64 {
    let mut x = (thread + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// Runs four `client` threads (two in RESP3) against `server` while `noise(connection, n)` runs
/// once a millisecond on another connection (TTLs coming and going), then a last read of every
/// key by `last`, which sees every committed append; returns the checker's report, or panics
/// with the cycle or anomaly it found.
pub fn run_checked(
    server: &TestServer,
    client: Client,
    noise: fn(&mut redis::Connection, u64),
    last: fn(&mut redis::Connection) -> Vec<Op>,
) -> Report {
    let tick = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let noise = {
        let (url, stop) = (server.url(false), stop.clone());
        std::thread::spawn(move || {
            let mut c = connect(&url);
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                noise(&mut c, n);
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        })
    };
    let clients: Vec<_> = (0..THREADS)
        .map(|t| {
            let (url, tick) = (server.url(t % 2 == 1), tick.clone());
            std::thread::spawn(move || client(&url, t, &tick))
        })
        .collect();
    let mut history = Vec::new();
    for c in clients {
        history.extend(c.join().expect("client thread"));
    }
    stop.store(true, Ordering::Relaxed);
    noise.join().expect("noise thread");

    let mut c = server.client();
    let began = tick.fetch_add(1, Ordering::SeqCst);
    let ops = last(&mut c);
    let ended = tick.fetch_add(1, Ordering::SeqCst);
    history.push(TxnRecord {
        time: Some((began, ended)),
        ..TxnRecord::committed("final", ops)
    });
    check(&history).unwrap_or_else(|e| panic!("not strictly serializable: {e}"))
}

#[test]
fn hash_fields_stay_strictly_serializable_while_keys_expire() {
    let server = TestServer::start();
    let noise = |c: &mut redis::Connection, n: u64| {
        let h = format!("lh:{{{}}}", n % 4);
        // A TTL far ahead and gone again: the lists must not notice.
        let _: i64 = query(c, &["PEXPIRE", &h, "600000"]);
        let _: i64 = query(c, &["PERSIST", &h]);
        let ttl = (1 + n % 10).to_string();
        let _: () = query(c, &["SET", &format!("tmp:{n}"), "v", "PX", &ttl]);
        let _: i64 = query(c, &["HSET", &format!("tmph:{n}"), "f", "1"]);
        let _: i64 = query(c, &["PEXPIRE", &format!("tmph:{n}"), &ttl]);
    };
    let last = |c: &mut redis::Connection| {
        (0..KEYS)
            .map(|k| {
                let (h, f) = field_of(k);
                let v: Value = redis::cmd("HGET").arg(h).arg(f).query(c).expect("HGET");
                Op::Read {
                    key: k,
                    value: decode_list(bulk(v).as_deref()),
                }
            })
            .collect()
    };
    let report = run_checked(&server, client, noise, last);
    assert!(report.committed > 300, "enough commits: {report:?}");
    assert!(report.aborted > 0, "WATCH lost some races: {report:?}");
    assert!(
        report.rw_edges > 0,
        "anti-dependencies were exercised: {report:?}"
    );
    assert!(report.list_len_max > 20, "lists grew: {report:?}");
}

/// Key `k`'s list as a sorted set: its elements are the members, each scored by its position,
/// so that `ZRANGE` by rank reads the list in order.
fn zset_of(k: Key) -> String {
    format!("lz:{k}")
}

fn zrange(c: &mut redis::Connection, k: Key) -> Vec<Elem> {
    let members: Vec<String> = redis::cmd("ZRANGE")
        .arg(zset_of(k))
        .arg(0)
        .arg(-1)
        .query(c)
        .expect("ZRANGE");
    members
        .iter()
        .map(|m| m.parse().expect("an element"))
        .collect()
}

/// One thread of [`sorted_sets_stay_strictly_serializable_while_keys_expire`]: a read-write
/// transaction `WATCH`es its sets, reads them with `ZRANGE`, then appends with `ZADD` at the
/// next position (and counts its appends in one hot member with `ZINCRBY`, the engine's
/// score add, which must not disturb the order of the rest) in `MULTI … EXEC`; a read-only
/// one reads its sets in one `MULTI`.
fn zset_client(url: &str, thread: u64, tick: &AtomicU64) -> Vec<TxnRecord> {
    let mut c = connect(url);
    let mut next = rng(thread + 100);
    let mut elem: Elem = thread << 40;
    let mut history = Vec::new();
    for i in 0..TXNS_PER_THREAD {
        let n = 1 + next() % 3;
        let mut keys: Vec<Key> = (0..n).map(|_| (next() % u64::from(KEYS)) as Key).collect();
        keys.sort_unstable();
        keys.dedup();
        let read_only = next().is_multiple_of(4);
        let began = tick.fetch_add(1, Ordering::SeqCst);
        let mut ops = Vec::new();
        let outcome = if read_only {
            let mut pipe = redis::pipe();
            pipe.atomic();
            for &k in &keys {
                pipe.cmd("ZRANGE").arg(zset_of(k)).arg(0).arg(-1);
            }
            let lists: Vec<Vec<String>> = pipe.query(&mut c).expect("read-only MULTI");
            for (&k, members) in keys.iter().zip(lists) {
                let value = members
                    .iter()
                    .map(|m| m.parse().expect("an element"))
                    .collect();
                ops.push(Op::Read { key: k, value });
            }
            Outcome::Committed
        } else {
            let sets: Vec<String> = keys.iter().map(|&k| zset_of(k)).collect();
            let _: () = redis::cmd("WATCH").arg(&sets).query(&mut c).expect("WATCH");
            let mut pipe = redis::pipe();
            pipe.atomic();
            for &k in &keys {
                let list = zrange(&mut c, k);
                let len = list.len();
                ops.push(Op::Read {
                    key: k,
                    value: list,
                });
                if !next().is_multiple_of(3) {
                    elem += 1;
                    ops.push(Op::Append { key: k, elem });
                    pipe.cmd("ZADD").arg(zset_of(k)).arg(len).arg(elem);
                    pipe.cmd("ZINCRBY").arg("lz:appends").arg(1).arg(thread);
                }
            }
            let done: Option<Vec<Value>> = pipe.query(&mut c).expect("EXEC");
            if done.is_some() {
                Outcome::Committed
            } else {
                Outcome::Aborted
            }
        };
        let ended = tick.fetch_add(1, Ordering::SeqCst);
        history.push(TxnRecord {
            name: format!("t{thread}.{i}"),
            ops,
            outcome,
            position: None,
            read_ts: None,
            time: Some((began, ended)),
        });
    }
    history
}

#[test]
fn sorted_sets_stay_strictly_serializable_while_keys_expire() {
    let server = TestServer::start();
    let noise = |c: &mut redis::Connection, n: u64| {
        let z = zset_of((n % u64::from(KEYS)) as Key);
        // A TTL far ahead and gone again: the lists must not notice.
        let _: i64 = query(c, &["PEXPIRE", &z, "600000"]);
        let _: i64 = query(c, &["PERSIST", &z]);
        let ttl = (1 + n % 10).to_string();
        let tmp = format!("tmpz:{n}");
        let _: i64 = query(c, &["ZADD", &tmp, "1", "a", "2", "b"]);
        let _: i64 = query(c, &["PEXPIRE", &tmp, &ttl]);
    };
    let last = |c: &mut redis::Connection| {
        (0..KEYS)
            .map(|k| Op::Read {
                key: k,
                value: zrange(c, k),
            })
            .collect()
    };
    let report = run_checked(&server, zset_client, noise, last);
    assert!(report.committed > 300, "enough commits: {report:?}");
    assert!(report.aborted > 0, "WATCH lost some races: {report:?}");
    assert!(report.list_len_max > 20, "lists grew: {report:?}");
    // Every committed append counted once in its thread's member.
    let mut c = server.client();
    let counted: Vec<String> = query(&mut c, &["ZRANGE", "lz:appends", "0", "-1", "WITHSCORES"]);
    let total: f64 = counted
        .chunks(2)
        .map(|p| p[1].parse::<f64>().unwrap())
        .sum();
    let appended: usize = (0..KEYS).map(|k| zrange(&mut c, k).len()).sum();
    assert_eq!(total as usize, appended, "{counted:?}");
}

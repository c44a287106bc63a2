//! Key expiry: TTL commands and their Redis replies, keys disappearing at their deadline under
//! concurrent readers and writers, and expired keys' memory coming back. (Deadlines surviving
//! a restart: `keel-cli/tests/serve.rs`, which restarts a server process.)

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::Value;

use crate::{TestServer, assert_ttl, error, info_counter, info_field, query, waited_ms};

fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64
}

/// Polls `check` until it holds, for at most 30 s (the expirer and the collector run in the
/// background, slowly on a loaded machine).
fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let started = Instant::now();
    while !check() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "never happened: {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn ttl_commands_match_redis() {
    let server = TestServer::start();
    for resp3 in [false, true] {
        let mut c = server.client_proto(resp3);
        let _: () = query(&mut c, &["FLUSHDB"]);
        // No key, no TTL.
        assert_eq!(query::<i64>(&mut c, &["TTL", "k"]), -2);
        assert_eq!(query::<i64>(&mut c, &["PTTL", "k"]), -2);
        assert_eq!(query::<i64>(&mut c, &["EXPIRETIME", "k"]), -2);
        assert_eq!(query::<i64>(&mut c, &["EXPIRE", "k", "10"]), 0);
        assert_eq!(query::<i64>(&mut c, &["PERSIST", "k"]), 0);
        let _: () = query(&mut c, &["SET", "k", "v"]);
        assert_eq!(query::<i64>(&mut c, &["TTL", "k"]), -1);
        assert_eq!(query::<i64>(&mut c, &["PEXPIRETIME", "k"]), -1);
        assert_eq!(query::<i64>(&mut c, &["PERSIST", "k"]), 0);
        // EXPIRE moves the string to its meta record; reads still see it. The bounds widen
        // by however long a loaded machine took since the EXPIRE.
        let (set, set_ms) = (Instant::now(), unix_ms());
        assert_eq!(query::<i64>(&mut c, &["EXPIRE", "k", "100"]), 1);
        assert_ttl(&mut c, "k", 100, set);
        let pttl: i64 = query(&mut c, &["PTTL", "k"]);
        let waited_ms = waited_ms(set);
        assert!(
            (100_000 - waited_ms..=100_000).contains(&pttl),
            "{pttl} after {waited_ms} ms"
        );
        let at: i64 = query(&mut c, &["PEXPIRETIME", "k"]);
        assert!(
            (set_ms + 100_000..=unix_ms() + 100_000).contains(&at),
            "{at} set at {set_ms}"
        );
        assert_eq!(
            query::<i64>(&mut c, &["EXPIRETIME", "k"]),
            (at + 500) / 1000
        );
        assert_eq!(query::<String>(&mut c, &["GET", "k"]), "v");
        assert_eq!(query::<String>(&mut c, &["TYPE", "k"]), "string");
        assert_eq!(query::<i64>(&mut c, &["EXISTS", "k"]), 1);
        assert_eq!(query::<i64>(&mut c, &["STRLEN", "k"]), 1);
        assert_eq!(query::<Vec<String>>(&mut c, &["KEYS", "*"]), ["k"]);
        assert_eq!(query::<i64>(&mut c, &["DBSIZE"]), 1);
        // NX / XX / GT / LT.
        assert_eq!(query::<i64>(&mut c, &["EXPIRE", "k", "50", "NX"]), 0);
        assert_eq!(query::<i64>(&mut c, &["EXPIRE", "k", "50", "GT"]), 0);
        assert_eq!(query::<i64>(&mut c, &["EXPIRE", "k", "200", "gt"]), 1);
        assert_eq!(query::<i64>(&mut c, &["EXPIRE", "k", "300", "LT"]), 0);
        assert_eq!(query::<i64>(&mut c, &["EXPIRE", "k", "150", "LT"]), 1);
        let set = Instant::now();
        assert_eq!(query::<i64>(&mut c, &["EXPIRE", "k", "120", "XX"]), 1);
        assert_ttl(&mut c, "k", 120, set);
        assert_eq!(query::<i64>(&mut c, &["PERSIST", "k"]), 1);
        assert_eq!(query::<i64>(&mut c, &["TTL", "k"]), -1);
        assert_eq!(query::<i64>(&mut c, &["EXPIRE", "k", "50", "XX"]), 0);
        assert_eq!(query::<i64>(&mut c, &["EXPIRE", "k", "50", "GT"]), 0);
        let set = Instant::now();
        assert_eq!(query::<i64>(&mut c, &["EXPIRE", "k", "50", "LT"]), 1);
        assert_ttl(&mut c, "k", 50, set);
        // Absolute forms.
        let at = unix_ms() / 1000 + 1000;
        assert_eq!(query::<i64>(&mut c, &["EXPIREAT", "k", &at.to_string()]), 1);
        assert_eq!(query::<i64>(&mut c, &["EXPIRETIME", "k"]), at);
        let pat = unix_ms() + 500_000;
        assert_eq!(
            query::<i64>(&mut c, &["PEXPIREAT", "k", &pat.to_string()]),
            1
        );
        assert_eq!(query::<i64>(&mut c, &["PEXPIRETIME", "k"]), pat);
        assert_eq!(query::<i64>(&mut c, &["PEXPIRE", "k", "300000"]), 1);
        // A deadline in the past deletes the key at once.
        assert_eq!(query::<i64>(&mut c, &["EXPIRE", "k", "-1"]), 1);
        assert_eq!(query::<i64>(&mut c, &["EXISTS", "k"]), 0);
        assert_eq!(query::<i64>(&mut c, &["DBSIZE"]), 0);
        // Errors, with Redis's texts, checked before the key.
        assert_eq!(
            error(&mut c, &["EXPIRE", "k", "10", "NX", "XX"]),
            "ERR NX and XX, GT or LT options at the same time are not compatible"
        );
        assert_eq!(
            error(&mut c, &["EXPIRE", "k", "10", "GT", "LT"]),
            "ERR GT and LT options at the same time are not compatible"
        );
        assert_eq!(
            error(&mut c, &["EXPIRE", "k", "10", "BOGUS"]),
            "ERR Unsupported option BOGUS"
        );
        assert_eq!(
            error(&mut c, &["EXPIRE", "k", "ten"]),
            "ERR value is not an integer or out of range"
        );
        assert_eq!(
            error(&mut c, &["EXPIRE", "k", "9223372036854775807"]),
            "ERR invalid expire time in 'expire' command"
        );
        assert_eq!(
            error(&mut c, &["PEXPIRE", "k", "9223372036854775807"]),
            "ERR invalid expire time in 'pexpire' command"
        );
        assert_eq!(
            error(&mut c, &["EXPIRE", "k"]),
            "ERR wrong number of arguments for 'expire' command"
        );
    }
}

#[test]
fn set_and_friends_handle_ttls_like_redis() {
    let server = TestServer::start();
    let mut c = server.client();
    let ttl = |c: &mut redis::Connection, k: &str| query::<i64>(c, &["TTL", k]);
    // Each TTL is checked against the time since it was set (`assert_ttl`).
    let set = Instant::now();
    let _: () = query(&mut c, &["SET", "a", "1", "EX", "100"]);
    assert_ttl(&mut c, "a", 100, set);
    let set = Instant::now();
    let _: () = query(&mut c, &["SET", "a", "1", "PX", "50000"]);
    assert_ttl(&mut c, "a", 50, set);
    let at = unix_ms() / 1000 + 70;
    let _: () = query(&mut c, &["SET", "a", "1", "EXAT", &at.to_string()]);
    assert_eq!(query::<i64>(&mut c, &["EXPIRETIME", "a"]), at);
    let pat = unix_ms() + 80_000;
    let _: () = query(&mut c, &["SET", "a", "1", "PXAT", &pat.to_string()]);
    assert_eq!(query::<i64>(&mut c, &["PEXPIRETIME", "a"]), pat);
    // INCR, APPEND and SETRANGE keep the TTL; SET without KEEPTTL drops it.
    assert_eq!(query::<i64>(&mut c, &["INCR", "a"]), 2);
    assert_eq!(query::<i64>(&mut c, &["INCRBY", "a", "3"]), 5);
    assert_eq!(query::<String>(&mut c, &["INCRBYFLOAT", "a", "0.5"]), "5.5");
    assert_eq!(query::<i64>(&mut c, &["APPEND", "a", "x"]), 4);
    assert_eq!(query::<i64>(&mut c, &["SETRANGE", "a", "0", "9"]), 4);
    assert_eq!(query::<String>(&mut c, &["GET", "a"]), "9.5x");
    assert_eq!(query::<i64>(&mut c, &["PEXPIRETIME", "a"]), pat);
    let _: () = query(&mut c, &["SET", "a", "2", "KEEPTTL"]);
    assert_eq!(query::<i64>(&mut c, &["PEXPIRETIME", "a"]), pat);
    assert_eq!(
        query::<Option<String>>(&mut c, &["SET", "a", "3", "GET", "KEEPTTL"]),
        Some("2".into())
    );
    assert_eq!(query::<i64>(&mut c, &["PEXPIRETIME", "a"]), pat);
    let _: () = query(&mut c, &["SET", "a", "4"]);
    assert_eq!(ttl(&mut c, "a"), -1);
    assert_eq!(query::<String>(&mut c, &["GET", "a"]), "4");
    // NX/XX with a TTL.
    assert_eq!(
        query::<Option<String>>(&mut c, &["SET", "a", "5", "NX", "EX", "10"]),
        None
    );
    assert_eq!(ttl(&mut c, "a"), -1);
    let set = Instant::now();
    let _: () = query(&mut c, &["SET", "a", "5", "XX", "EX", "10"]);
    assert_ttl(&mut c, "a", 10, set);
    // GETSET drops the TTL; RENAME carries it.
    assert_eq!(query::<String>(&mut c, &["GETSET", "a", "6"]), "5");
    assert_eq!(ttl(&mut c, "a"), -1);
    let set = Instant::now();
    let _: () = query(&mut c, &["SET", "a", "7", "EX", "30"]);
    let _: () = query(&mut c, &["SET", "b", "old", "EX", "90"]);
    let _: () = query(&mut c, &["RENAME", "a", "b"]);
    assert_eq!(query::<i64>(&mut c, &["EXISTS", "a"]), 0);
    assert_eq!(query::<String>(&mut c, &["GET", "b"]), "7");
    assert_ttl(&mut c, "b", 30, set);
    let _: () = query(&mut c, &["SET", "plain", "p"]);
    let _: () = query(&mut c, &["RENAME", "plain", "b"]);
    assert_eq!(ttl(&mut c, "b"), -1);
    assert_eq!(query::<String>(&mut c, &["GET", "b"]), "p");
    let set = Instant::now();
    let _: () = query(&mut c, &["EXPIRE", "b", "40"]);
    let _: () = query(&mut c, &["RENAME", "b", "b"]);
    assert_ttl(&mut c, "b", 40, set);
    // Only one expiry index entry per key whatever happened to it.
    let info: String = query(&mut c, &["INFO", "keyspace"]);
    assert!(info.contains("db0:keys=1,expires=1,avg_ttl="), "{info}");
    // SETEX, PSETEX, GETEX.
    let set = Instant::now();
    let _: () = query(&mut c, &["SETEX", "s", "20", "v"]);
    assert_ttl(&mut c, "s", 20, set);
    let set = Instant::now();
    let _: () = query(&mut c, &["PSETEX", "s", "25000", "w"]);
    assert_ttl(&mut c, "s", 25, set);
    assert_eq!(query::<String>(&mut c, &["GET", "s"]), "w");
    assert_eq!(
        error(&mut c, &["SETEX", "s", "0", "v"]),
        "ERR invalid expire time in 'setex' command"
    );
    assert_eq!(
        error(&mut c, &["PSETEX", "s", "-5", "v"]),
        "ERR invalid expire time in 'psetex' command"
    );
    assert_eq!(query::<String>(&mut c, &["GETEX", "s"]), "w");
    assert_ttl(&mut c, "s", 25, set);
    let set = Instant::now();
    assert_eq!(query::<String>(&mut c, &["GETEX", "s", "EX", "60"]), "w");
    assert_ttl(&mut c, "s", 60, set);
    assert_eq!(query::<String>(&mut c, &["GETEX", "s", "PERSIST"]), "w");
    assert_eq!(ttl(&mut c, "s"), -1);
    let set = Instant::now();
    assert_eq!(query::<String>(&mut c, &["GETEX", "s", "PX", "70000"]), "w");
    assert_ttl(&mut c, "s", 70, set);
    assert_eq!(
        query::<String>(&mut c, &["GETEX", "s", "PXAT", "1"]),
        "w",
        "GETEX with a past deadline replies, then deletes"
    );
    assert_eq!(query::<i64>(&mut c, &["EXISTS", "s"]), 0);
    assert_eq!(query::<Value>(&mut c, &["GETEX", "s"]), Value::Nil);
    assert_eq!(
        error(&mut c, &["GETEX", "s", "EX", "1", "PERSIST"]),
        "ERR syntax error"
    );
    // As in Redis, the expire time is checked only once the key is found.
    assert_eq!(
        query::<Value>(&mut c, &["GETEX", "s", "EX", "0"]),
        Value::Nil
    );
    let _: () = query(&mut c, &["SET", "s", "v"]);
    assert_eq!(
        error(&mut c, &["GETEX", "s", "EX", "0"]),
        "ERR invalid expire time in 'getex' command"
    );
    let _: () = query(&mut c, &["DEL", "s"]);
    assert_eq!(
        error(&mut c, &["SET", "s", "v", "EX", "1", "KEEPTTL"]),
        "ERR syntax error"
    );
    assert_eq!(
        error(&mut c, &["SET", "s", "v", "EX", "1", "PX", "5"]),
        "ERR syntax error"
    );
    assert_eq!(error(&mut c, &["SET", "s", "v", "EX"]), "ERR syntax error");
    assert_eq!(
        error(&mut c, &["SET", "s", "v", "EX", "9223372036854775807"]),
        "ERR invalid expire time in 'set' command"
    );
    // A past absolute deadline: SET succeeds and the key is gone.
    let _: () = query(&mut c, &["SET", "s", "v", "PXAT", "1"]);
    assert_eq!(query::<i64>(&mut c, &["EXISTS", "s"]), 0);
    // User keys starting with 0xFF are ordinary keys, with or without a TTL.
    let mut ff = redis::cmd("SET");
    ff.arg(b"\xffm\x00x").arg("v").arg("EX").arg(100);
    let _: () = ff.query(&mut c).expect("set");
    let mut ff2 = redis::cmd("SET");
    ff2.arg(b"\xff").arg("w");
    let _: () = ff2.query(&mut c).expect("set");
    let keys: Vec<Vec<u8>> = query(&mut c, &["KEYS", "*"]);
    assert_eq!(
        keys,
        [b"b".to_vec(), b"\xff".to_vec(), b"\xffm\x00x".to_vec()]
    );
    let got: Vec<u8> = redis::cmd("GET")
        .arg(b"\xffm\x00x")
        .query(&mut c)
        .expect("get");
    assert_eq!(got, b"v");
}

/// Keys expire under clients reading and writing them: a reader sees a key's value until the
/// deadline and never after (nobody rewrites them), and a counter with a TTL counts on, then
/// starts over without a TTL once it has expired. The clients run at least 800 ms, and on
/// until every reader saw every key gone and every counter started over (a loaded machine
/// may take longer; if that takes 30 s the checks below fail).
#[test]
fn keys_expire_under_concurrent_readers_and_writers() {
    const KEYS: usize = 20;
    /// Where the counters start: an `INCR` before the deadline counts on from here, one
    /// after it starts over at 1, however late a writer begins.
    const FROM: i64 = 1000;
    let server = TestServer::start();
    let mut c = server.client();
    for i in 0..KEYS {
        let _: () = query(
            &mut c,
            &[
                "SET",
                &format!("e{i}"),
                "v",
                "PX",
                &(150 + 10 * i).to_string(),
            ],
        );
        let _: () = query(
            &mut c,
            &["SET", &format!("n{i}"), &FROM.to_string(), "PX", "300"],
        );
    }
    let stop = Arc::new(AtomicBool::new(false));
    // Keys readers saw gone (per reader), and counters that started over.
    let seen_gone = Arc::new(AtomicUsize::new(0));
    let started_over = Arc::new(AtomicUsize::new(0));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let url = server.url(false);
            let (stop, seen_gone) = (stop.clone(), seen_gone.clone());
            std::thread::spawn(move || {
                let mut c = crate::connect(&url);
                let mut gone = [false; KEYS];
                while !stop.load(Ordering::Relaxed) {
                    for (i, gone) in gone.iter_mut().enumerate() {
                        let v: Option<String> = query(&mut c, &["GET", &format!("e{i}")]);
                        match v {
                            Some(v) => {
                                assert_eq!(v, "v");
                                assert!(!*gone, "e{i} came back after it expired");
                            }
                            None if !*gone => {
                                *gone = true;
                                seen_gone.fetch_add(1, Ordering::Relaxed);
                            }
                            None => {}
                        }
                    }
                }
                gone
            })
        })
        .collect();
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let url = server.url(w == 1);
            let (stop, started_over) = (stop.clone(), started_over.clone());
            std::thread::spawn(move || {
                let mut c = crate::connect(&url);
                let mut last = [FROM; KEYS];
                let mut restarts = [0; KEYS];
                while !stop.load(Ordering::Relaxed) {
                    for i in (w..KEYS).step_by(2) {
                        let n: i64 = query(&mut c, &["INCR", &format!("n{i}")]);
                        if n != last[i] + 1 {
                            assert_eq!(n, 1, "n{i} went from {} to {n}", last[i]);
                            restarts[i] += 1;
                            if restarts[i] == 1 {
                                started_over.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        last[i] = n;
                    }
                }
                restarts
            })
        })
        .collect();
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(800)
        || seen_gone.load(Ordering::Relaxed) < 2 * KEYS
        || started_over.load(Ordering::Relaxed) < KEYS
    {
        if started.elapsed() > Duration::from_secs(30) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        assert!(
            r.join().expect("reader").iter().all(|&g| g),
            "every e key expired"
        );
    }
    for (w, t) in writers.into_iter().enumerate() {
        let restarts = t.join().expect("writer");
        for i in (w..KEYS).step_by(2) {
            assert_eq!(restarts[i], 1, "n{i} started over exactly once");
        }
    }
    for i in 0..KEYS {
        assert_eq!(query::<i64>(&mut c, &["TTL", &format!("n{i}")]), -1);
        assert_eq!(query::<i64>(&mut c, &["EXISTS", &format!("e{i}")]), 0);
    }
    // The expirer removes what no client touched again: only the counters are left.
    eventually("the expirer deleted the e keys", || {
        query::<i64>(&mut c, &["DBSIZE"]) == KEYS as i64
    });
    let info: String = query(&mut c, &["INFO", "keyspace"]);
    assert_eq!(
        info_field(&info, "db0"),
        format!("keys={KEYS},expires=0,avg_ttl=0")
    );
}

/// Expired keys give their memory back: the expirer deletes them, and the engine's collector
/// reclaims deleted records.
#[test]
fn expired_keys_memory_is_reclaimed() {
    const KEYS: usize = 10_000;
    let server = TestServer::with(|c| c.metrics = Some("127.0.0.1:0".parse().expect("addr")));
    let mut c = server.client();
    let records = |c: &mut redis::Connection| {
        let info: String = query(c, &["INFO", "keel"]);
        info_counter(&info, "keel_records")
    };
    let before = records(&mut c);
    // One absolute deadline for all, so that none expires before the count below unless
    // loading them took that long. (A key whose deadline passed before its SET is never
    // created, so it does not count as expired: the exact counts below hold only when the
    // loading ended in time, which 4 s leaves room for on a loaded machine.)
    let started = Instant::now();
    let ahead = Duration::from_millis(4_000);
    let deadline = (unix_ms() + ahead.as_millis() as i64).to_string();
    for chunk in 0..KEYS / 1000 {
        let mut pipe = redis::pipe();
        for i in 0..1000 {
            pipe.cmd("SET")
                .arg(format!("k{chunk}:{i}"))
                .arg("value")
                .arg("PXAT")
                .arg(&deadline)
                .ignore();
        }
        let () = pipe.query(&mut c).expect("pipelined SET PXAT");
    }
    let loaded = records(&mut c);
    let in_time = started.elapsed() < ahead - Duration::from_millis(500);
    if in_time {
        // A meta record and an expiry index entry per key.
        assert!(loaded >= before + 2 * KEYS as u64, "{before} -> {loaded}");
    }
    eventually("every key expired and was deleted", || {
        query::<i64>(&mut c, &["DBSIZE"]) == 0
    });
    let expired_keys = |c: &mut redis::Connection| {
        info_counter(&query::<String>(c, &["INFO", "stats"]), "expired_keys")
    };
    // The reaper counts a batch once its commit returns, a moment after DBSIZE sees it.
    if in_time {
        eventually("every expired key was counted", || {
            expired_keys(&mut c) >= KEYS as u64
        });
    }
    let expired = expired_keys(&mut c);
    if in_time {
        assert_eq!(expired, KEYS as u64);
        let metrics = server.metrics();
        assert!(
            metrics.contains(&format!("\nkeel_expired_keys_total {KEYS}\n")),
            "{metrics}"
        );
    } else {
        assert!(expired > 0 && expired <= KEYS as u64, "{expired}");
    }
    eventually("the collector reclaimed the records", || {
        records(&mut c) <= before + 100
    });
}

//! Hashes through the server: every command's replies in RESP2 and RESP3, `WRONGTYPE` between
//! types, the generic key commands on hashes, a hash's TTL, and dropped hashes swept.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use redis::Value;

use crate::{TestServer, assert_ttl, error, exec_survives, info_counter, query};

const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

#[test]
fn hash_commands_match_redis() {
    let server = TestServer::start();
    for resp3 in [false, true] {
        let mut c = server.client_proto(resp3);
        let _: () = query(&mut c, &["FLUSHDB"]);
        assert_eq!(query::<i64>(&mut c, &["HSET", "h", "a", "1", "b", "2"]), 2);
        assert_eq!(
            query::<i64>(&mut c, &["HSET", "h", "a", "10", "c", "3", "c", "4"]),
            1
        );
        assert_eq!(query::<String>(&mut c, &["HMSET", "h", "d", "x"]), "OK");
        assert_eq!(query::<i64>(&mut c, &["HSETNX", "h", "d", "y"]), 0);
        assert_eq!(query::<i64>(&mut c, &["HSETNX", "h", "e", "y"]), 1);
        assert_eq!(query::<String>(&mut c, &["HGET", "h", "a"]), "10");
        assert_eq!(query::<Value>(&mut c, &["HGET", "h", "zz"]), Value::Nil);
        assert_eq!(query::<Value>(&mut c, &["HGET", "nokey", "a"]), Value::Nil);
        assert_eq!(
            query::<Vec<Option<String>>>(&mut c, &["HMGET", "h", "a", "zz", "c"]),
            [Some("10".into()), None, Some("4".into())]
        );
        assert_eq!(
            query::<Vec<Option<String>>>(&mut c, &["HMGET", "nokey", "a"]),
            [None]
        );
        assert_eq!(query::<i64>(&mut c, &["HLEN", "h"]), 5);
        assert_eq!(query::<i64>(&mut c, &["HLEN", "nokey"]), 0);
        assert_eq!(query::<i64>(&mut c, &["HEXISTS", "h", "b"]), 1);
        assert_eq!(query::<i64>(&mut c, &["HEXISTS", "h", "zz"]), 0);
        assert_eq!(query::<i64>(&mut c, &["HSTRLEN", "h", "a"]), 2);
        assert_eq!(query::<i64>(&mut c, &["HSTRLEN", "h", "zz"]), 0);
        let all: HashMap<String, String> = query(&mut c, &["HGETALL", "h"]);
        let expected: HashMap<String, String> =
            [("a", "10"), ("b", "2"), ("c", "4"), ("d", "x"), ("e", "y")]
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        assert_eq!(all, expected);
        let raw: Value = query(&mut c, &["HGETALL", "h"]);
        assert_eq!(matches!(raw, Value::Map(_)), resp3, "{raw:?}");
        let empty: Value = query(&mut c, &["HGETALL", "nokey"]);
        assert!(
            matches!(&empty, Value::Map(m) if m.is_empty())
                || matches!(&empty, Value::Array(a) if a.is_empty()),
            "{empty:?}"
        );
        assert_eq!(
            query::<Vec<String>>(&mut c, &["HKEYS", "h"]),
            ["a", "b", "c", "d", "e"]
        );
        assert_eq!(
            query::<Vec<String>>(&mut c, &["HVALS", "h"]),
            ["10", "2", "4", "x", "y"]
        );
        assert!(query::<Vec<String>>(&mut c, &["HKEYS", "nokey"]).is_empty());
        // Counters.
        assert_eq!(query::<i64>(&mut c, &["HINCRBY", "h", "a", "5"]), 15);
        assert_eq!(query::<i64>(&mut c, &["HINCRBY", "h", "n", "-3"]), -3);
        assert_eq!(
            query::<String>(&mut c, &["HINCRBYFLOAT", "h", "f", "0.1"]),
            "0.1"
        );
        assert_eq!(
            query::<String>(&mut c, &["HINCRBYFLOAT", "h", "f", "0.2"]),
            "0.3"
        );
        assert_eq!(query::<i64>(&mut c, &["HLEN", "h"]), 7);
        assert_eq!(
            error(&mut c, &["HINCRBY", "h", "d", "1"]),
            "ERR hash value is not an integer"
        );
        assert_eq!(
            error(&mut c, &["HINCRBY", "h", "a", "x"]),
            "ERR value is not an integer or out of range"
        );
        let _: () = query(&mut c, &["HSET", "h", "big", "9223372036854775807"]);
        assert_eq!(
            error(&mut c, &["HINCRBY", "h", "big", "1"]),
            "ERR increment or decrement would overflow"
        );
        assert_eq!(
            error(&mut c, &["HINCRBYFLOAT", "h", "d", "1"]),
            "ERR hash value is not a float"
        );
        assert_eq!(
            error(&mut c, &["HINCRBYFLOAT", "h", "a", "x"]),
            "ERR value is not a valid float"
        );
        // Arity and pairs.
        assert_eq!(
            error(&mut c, &["HSET", "h", "a"]),
            "ERR wrong number of arguments for 'hset' command"
        );
        assert_eq!(
            error(&mut c, &["HSET", "h", "a", "1", "b"]),
            "ERR wrong number of arguments for 'hset' command"
        );
        assert_eq!(
            error(&mut c, &["HMSET", "h", "a", "1", "b"]),
            "ERR wrong number of arguments for 'hmset' command"
        );
        // HDEL deletes the key with its last field.
        assert_eq!(query::<i64>(&mut c, &["HDEL", "h", "a", "zz", "b"]), 2);
        assert_eq!(query::<i64>(&mut c, &["HDEL", "nokey", "a"]), 0);
        let _: () = query(&mut c, &["HSET", "two", "x", "1", "y", "2"]);
        assert_eq!(query::<i64>(&mut c, &["HDEL", "two", "x", "y"]), 2);
        assert_eq!(query::<i64>(&mut c, &["EXISTS", "two"]), 0);
        assert_eq!(query::<String>(&mut c, &["TYPE", "two"]), "none");
        // HSCAN: a small hash whole, a large one in pages.
        let (cursor, items): (String, Vec<String>) = query(&mut c, &["HSCAN", "h", "0"]);
        assert_eq!(cursor, "0");
        assert_eq!(items.len(), 2 * 6);
        let (_, items): (String, Vec<String>) =
            query(&mut c, &["HSCAN", "h", "0", "MATCH", "[cd]"]);
        assert_eq!(items, ["c", "4", "d", "x"]);
        let (cursor, items): (String, Vec<String>) = query(&mut c, &["HSCAN", "nokey", "0"]);
        assert_eq!((cursor.as_str(), items.len()), ("0", 0));
        assert_eq!(error(&mut c, &["HSCAN", "h", "x"]), "ERR invalid cursor");
        assert_eq!(
            error(&mut c, &["HSCAN", "h", "0", "COUNT", "0"]),
            "ERR syntax error"
        );
        assert_eq!(
            error(&mut c, &["HSCAN", "h", "0", "NOVALUES"]),
            "ERR syntax error"
        );
        let mut args = vec!["HSET".to_string(), "big".into()];
        for i in 0..300 {
            args.push(format!("f{i:03}"));
            args.push(i.to_string());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_eq!(query::<i64>(&mut c, &args), 300);
        let mut cursor = "0".to_string();
        let mut seen = Vec::new();
        let mut calls = 0;
        loop {
            let (next, items): (String, Vec<String>) =
                query(&mut c, &["HSCAN", "big", &cursor, "COUNT", "50"]);
            seen.extend(items.chunks(2).map(|p| p[0].clone()));
            calls += 1;
            if next == "0" {
                break;
            }
            cursor = next;
        }
        assert!(calls >= 6, "{calls}");
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 300);
        // HRANDFIELD.
        let one: String = query(&mut c, &["HRANDFIELD", "h"]);
        assert!(
            ["c", "d", "e", "n", "f", "big"].contains(&one.as_str()),
            "{one}"
        );
        assert_eq!(query::<Value>(&mut c, &["HRANDFIELD", "nokey"]), Value::Nil);
        assert!(query::<Vec<String>>(&mut c, &["HRANDFIELD", "nokey", "3"]).is_empty());
        assert!(query::<Vec<String>>(&mut c, &["HRANDFIELD", "h", "0"]).is_empty());
        let mut some: Vec<String> = query(&mut c, &["HRANDFIELD", "h", "100"]);
        some.sort();
        assert_eq!(some, ["big", "c", "d", "e", "f", "n"]);
        let some: Vec<String> = query(&mut c, &["HRANDFIELD", "h", "3"]);
        assert_eq!(some.len(), 3);
        let mut unique = some.clone();
        unique.dedup();
        assert_eq!(unique.len(), 3);
        assert_eq!(
            query::<Vec<String>>(&mut c, &["HRANDFIELD", "h", "-10"]).len(),
            10
        );
        let with: Value = query(&mut c, &["HRANDFIELD", "h", "-2", "WITHVALUES"]);
        match with {
            Value::Array(items) if resp3 => {
                assert_eq!(items.len(), 2);
                assert!(
                    items
                        .iter()
                        .all(|p| matches!(p, Value::Array(kv) if kv.len() == 2))
                );
            }
            Value::Array(items) => assert_eq!(items.len(), 4),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            error(&mut c, &["HRANDFIELD", "h", "1", "WITHVALUE"]),
            "ERR syntax error"
        );
        assert_eq!(
            error(&mut c, &["HRANDFIELD", "h", "WITHVALUES"]),
            "ERR value is not an integer or out of range"
        );
        assert_eq!(
            error(&mut c, &["HRANDFIELD", "h", "-9223372036854775808"]),
            "ERR value is out of range, value must between -9223372036854775807 and 9223372036854775807"
        );
    }
}

#[test]
fn types_keep_to_themselves() {
    let server = TestServer::start();
    let mut c = server.client();
    let _: () = query(&mut c, &["HSET", "h", "f", "v"]);
    let _: () = query(&mut c, &["SET", "s", "12"]);
    let t_set = Instant::now();
    let _: () = query(&mut c, &["SET", "t", "x", "EX", "100"]);
    assert_eq!(query::<String>(&mut c, &["TYPE", "h"]), "hash");
    assert_eq!(query::<String>(&mut c, &["TYPE", "s"]), "string");
    assert_eq!(query::<String>(&mut c, &["TYPE", "t"]), "string");
    // String commands on a hash, hash commands on strings (with and without a TTL).
    for args in [
        &["GET", "h"][..],
        &["GETSET", "h", "x"],
        &["GETDEL", "h"],
        &["GETEX", "h"],
        &["GETRANGE", "h", "0", "1"],
        &["STRLEN", "h"],
        &["APPEND", "h", "x"],
        &["SETRANGE", "h", "0", "x"],
        &["INCR", "h"],
        &["DECRBY", "h", "2"],
        &["INCRBYFLOAT", "h", "1"],
        &["SET", "h", "x", "GET"],
        &["HGET", "s", "f"],
        &["HSET", "s", "f", "v"],
        &["HLEN", "t"],
        &["HGETALL", "t"],
        &["HINCRBY", "s", "f", "1"],
        &["HDEL", "t", "f"],
        &["HSCAN", "s", "0"],
        &["HRANDFIELD", "t"],
    ] {
        assert_eq!(error(&mut c, args), WRONGTYPE, "{args:?}");
    }
    // What Redis lets through.
    assert_eq!(
        query::<Vec<Option<String>>>(&mut c, &["MGET", "h", "s", "t"]),
        [None, Some("12".into()), Some("x".into())]
    );
    assert_eq!(query::<i64>(&mut c, &["SETNX", "h", "x"]), 0);
    assert_eq!(query::<i64>(&mut c, &["EXISTS", "h", "s", "t", "nope"]), 3);
    assert_eq!(query::<i64>(&mut c, &["DBSIZE"]), 3);
    let mut keys: Vec<String> = query(&mut c, &["KEYS", "*"]);
    keys.sort();
    assert_eq!(keys, ["h", "s", "t"]);
    let (_, hashes): (String, Vec<String>) = query(&mut c, &["SCAN", "0", "TYPE", "hash"]);
    assert_eq!(hashes, ["h"]);
    let (_, strings): (String, Vec<String>) = query(&mut c, &["SCAN", "0", "TYPE", "string"]);
    assert_eq!(strings, ["s", "t"]);
    // KEEL.RANGE lists strings only.
    let pairs: Vec<(String, String)> = query(&mut c, &["KEEL.RANGE", "-", "+"]);
    assert_eq!(pairs, [("s".into(), "12".into()), ("t".into(), "x".into())]);
    // RENAME moves a hash whole, TTL and all; the destination's old value goes.
    let h_set = Instant::now();
    let _: () = query(&mut c, &["EXPIRE", "h", "50"]);
    let _: () = query(&mut c, &["RENAME", "h", "s"]);
    assert_eq!(query::<String>(&mut c, &["TYPE", "s"]), "hash");
    assert_eq!(query::<String>(&mut c, &["HGET", "s", "f"]), "v");
    assert_ttl(&mut c, "s", 50, h_set);
    assert_eq!(query::<i64>(&mut c, &["EXISTS", "h"]), 0);
    let _: () = query(&mut c, &["RENAME", "t", "s"]);
    assert_eq!(query::<String>(&mut c, &["GET", "s"]), "x");
    assert_ttl(&mut c, "s", 100, t_set);
    // SET over a hash replaces it; a new hash under the old name starts empty.
    let _: () = query(&mut c, &["HSET", "h", "a", "1", "b", "2"]);
    let _: () = query(&mut c, &["SET", "h", "str"]);
    assert_eq!(query::<String>(&mut c, &["GET", "h"]), "str");
    let _: () = query(&mut c, &["DEL", "h"]);
    assert_eq!(query::<i64>(&mut c, &["HSET", "h", "c", "3"]), 1);
    assert_eq!(query::<i64>(&mut c, &["HLEN", "h"]), 1);
    assert_eq!(query::<Vec<String>>(&mut c, &["HKEYS", "h"]), ["c"]);
    // PERSIST on a hash, and DEL counts it.
    let _: () = query(&mut c, &["PEXPIRE", "h", "100000"]);
    assert_eq!(query::<i64>(&mut c, &["PERSIST", "h"]), 1);
    assert_eq!(query::<i64>(&mut c, &["TTL", "h"]), -1);
    assert_eq!(query::<i64>(&mut c, &["DEL", "h", "s", "nope"]), 2);
    assert_eq!(query::<i64>(&mut c, &["DBSIZE"]), 0);
    // KEEL.ADD reads nothing: on a hash or a string with a TTL its integer shadows them
    // (docs/types.md), and DEL removes both.
    let _: () = query(&mut c, &["HSET", "h", "f", "v"]);
    let _: () = query(&mut c, &["SET", "t", "x", "EX", "100"]);
    for key in ["h", "t"] {
        let _: () = query(&mut c, &["KEEL.ADD", key, "5"]);
        assert_eq!(query::<String>(&mut c, &["TYPE", key]), "string");
        assert_eq!(query::<i64>(&mut c, &["GET", key]), 5);
        assert_eq!(query::<i64>(&mut c, &["DEL", key]), 1);
        assert_eq!(query::<i64>(&mut c, &["EXISTS", key]), 0);
        assert_eq!(query::<i64>(&mut c, &["TTL", key]), -2);
    }
    assert_eq!(query::<i64>(&mut c, &["DBSIZE"]), 0);
}

/// A hash with a TTL expires whole, and the fields of hashes deleted, overwritten or expired
/// are swept from the engine.
#[test]
fn dropped_hashes_are_swept() {
    let server = TestServer::start();
    let mut c = server.client();
    let records = |c: &mut redis::Connection| {
        let info: String = query(c, &["INFO", "keel"]);
        info_counter(&info, "keel_records")
    };
    let before = records(&mut c);
    for name in ["deleted", "overwritten", "expiring"] {
        let mut pipe = redis::pipe();
        for chunk in 0..10 {
            let mut cmd = redis::cmd("HSET");
            cmd.arg(name);
            for i in 0..200 {
                cmd.arg(format!("f{chunk}:{i}")).arg(i);
            }
            pipe.add_command(cmd).ignore();
        }
        let () = pipe.query(&mut c).expect("HSET");
        assert_eq!(query::<i64>(&mut c, &["HLEN", name]), 2000);
    }
    assert!(records(&mut c) >= before + 6000);
    let _: () = query(&mut c, &["DEL", "deleted"]);
    let _: () = query(&mut c, &["SET", "overwritten", "now a string"]);
    let _: () = query(&mut c, &["PEXPIRE", "expiring", "100"]);
    std::thread::sleep(Duration::from_millis(150));
    assert_eq!(query::<i64>(&mut c, &["HLEN", "expiring"]), 0);
    let started = Instant::now();
    loop {
        let info: String = query(&mut c, &["INFO", "stats"]);
        if info_counter(&info, "keel_swept_keys") == 6000 && records(&mut c) <= before + 10 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "not swept: {info} records {}",
            records(&mut c)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(query::<i64>(&mut c, &["DBSIZE"]), 1);
}

/// Clients writing different fields of one spread hash at once (`HINCRBY` of a field each,
/// `HSET` of new fields) never conflict.
#[test]
fn concurrent_field_writers_do_not_conflict() {
    const CLIENTS: usize = 4;
    const ROUNDS: i64 = 300;
    // On the worker pool: the poller thread runs one command at a time, so nothing would
    // overlap and the check below could not fail.
    let server = TestServer::with(|c| c.poller = keel_server::lanes::PollerMode::Off);
    let mut c = server.client();
    // More fields than a packed hash holds (`hashes::FIELDS_MAX`): spread, so that each
    // field is a record of its own. (A packed hash is one value, which writers of different
    // fields do conflict on until the first conflict spreads it.)
    const SEEDED: i64 = 200;
    let mut fill = vec!["HSET".to_string(), "h".to_string()];
    for i in 0..SEEDED {
        fill.extend([format!("seed{i}"), "0".to_string()]);
    }
    let fill: Vec<&str> = fill.iter().map(String::as_str).collect();
    let _: i64 = query(&mut c, &fill);
    let conflicts = |c: &mut redis::Connection| {
        let info: String = query(c, &["INFO", "keel"]);
        info_counter(&info, "keel_aborts_read_changed") + info_counter(&info, "keel_aborts_phantom")
    };
    let before = conflicts(&mut c);
    let threads: Vec<_> = (0..CLIENTS)
        .map(|t| {
            let url = server.url(false);
            std::thread::spawn(move || {
                let mut c = crate::connect(&url);
                for i in 0..ROUNDS {
                    let _: i64 = query(&mut c, &["HINCRBY", "h", &format!("n{t}"), "1"]);
                    let _: i64 = query(&mut c, &["HSET", "h", &format!("f{t}:{i}"), "v"]);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("client");
    }
    for t in 0..CLIENTS {
        assert_eq!(
            query::<i64>(&mut c, &["HGET", "h", &format!("n{t}")]),
            ROUNDS
        );
    }
    assert_eq!(
        query::<i64>(&mut c, &["HLEN", "h"]),
        SEEDED + (CLIENTS as i64) * (ROUNDS + 1)
    );
    assert_eq!(conflicts(&mut c), before, "a field write lost a validation");
}

/// Clients incrementing one field of a spread hash at once never conflict: `HINCRBY` adds
/// with the engine's commutative add and reads only whether the field exists. Clients
/// creating one field at once may conflict (only one of them may count it as new); the size
/// stays right. Replies and errors are compared with Redis' in
/// `differential::increments_of_spread_hashes_match_redis`.
#[test]
fn concurrent_increments_of_one_field_do_not_conflict() {
    const CLIENTS: usize = 4;
    const ROUNDS: i64 = 400;
    const BATCH: i64 = 20;
    const NEW_FIELDS: i64 = 40;
    // More fields than a packed hash holds (`hashes::FIELDS_MAX`): spread.
    const FIELDS: i64 = 200;
    // On the worker pool: the poller thread would run one command at a time.
    let server = TestServer::with(|c| c.poller = keel_server::lanes::PollerMode::Off);
    let mut c = server.client();
    let mut fill = vec!["HSET".to_string(), "h".to_string()];
    for i in 0..FIELDS - 1 {
        fill.extend([format!("f{i}"), "0".to_string()]);
    }
    fill.extend(["n".to_string(), "0".to_string()]);
    let fill: Vec<&str> = fill.iter().map(String::as_str).collect();
    assert_eq!(query::<i64>(&mut c, &fill), FIELDS);
    let conflicts = |c: &mut redis::Connection| {
        let info: String = query(c, &["INFO", "keel"]);
        [
            "keel_aborts_read_changed",
            "keel_aborts_write_locked",
            "keel_aborts_phantom",
            "keel_conflict_retries",
        ]
        .map(|name| info_counter(&info, name))
    };
    let before = conflicts(&mut c);
    let run = |work: fn(&mut redis::Connection, usize)| {
        let threads: Vec<_> = (0..CLIENTS)
            .map(|t| {
                let url = server.url(false);
                std::thread::spawn(move || work(&mut crate::connect(&url), t))
            })
            .collect();
        for t in threads {
            t.join().expect("client");
        }
    };
    // In pipelines too, which keel runs as one transaction each: longer transactions, more
    // of them overlapping.
    run(|c, t| {
        let mut last = 0;
        for round in 0..ROUNDS / BATCH {
            let replies: Vec<i64> = if round % 2 == 0 {
                let mut pipe = redis::pipe();
                for _ in 0..BATCH {
                    pipe.cmd("HINCRBY").arg("h").arg("n").arg(t + 1);
                }
                pipe.query(c).expect("pipeline")
            } else {
                (0..BATCH)
                    .map(|_| query(c, &["HINCRBY", "h", "n", &(t + 1).to_string()]))
                    .collect()
            };
            for now in replies {
                assert!(now > last, "{now} after {last}");
                last = now;
            }
        }
    });
    let sum: i64 = (1..=CLIENTS as i64).sum::<i64>() * ROUNDS;
    assert_eq!(query::<i64>(&mut c, &["HGET", "h", "n"]), sum);
    assert_eq!(query::<i64>(&mut c, &["HLEN", "h"]), FIELDS);
    assert_eq!(
        conflicts(&mut c),
        before,
        "increments of one field conflicted"
    );

    // Every client creates the same new fields: each field counted once.
    run(|c, _| {
        for i in 0..NEW_FIELDS {
            let _: i64 = query(c, &["HINCRBY", "h", &format!("new{i}"), "1"]);
        }
    });
    for i in 0..NEW_FIELDS {
        assert_eq!(
            query::<i64>(&mut c, &["HGET", "h", &format!("new{i}")]),
            CLIENTS as i64
        );
    }
    assert_eq!(query::<i64>(&mut c, &["HLEN", "h"]), FIELDS + NEW_FIELDS);
}

/// `WATCH` sees a hash gain a field, a string gain a TTL, and a key expire.
#[test]
fn watch_sees_fields_added_and_ttls_changed() {
    let server = TestServer::start();
    let mut c = server.client();
    let mut other = server.client();
    let _: () = query(&mut c, &["HSET", "h", "a", "1"]);
    let _: () = query(&mut c, &["SET", "s", "v"]);
    for (key, change) in [
        ("h", &["HSET", "h", "b", "2"][..]),
        ("s", &["EXPIRE", "s", "100"]),
        ("s", &["PERSIST", "s"]),
    ] {
        let _: () = query(&mut c, &["WATCH", key]);
        let _: Value = query(&mut other, change);
        let _: () = query(&mut c, &["MULTI"]);
        let _: () = query(&mut c, &["TYPE", key]);
        let reply: Value = redis::cmd("EXEC").query(&mut c).expect("EXEC");
        assert_eq!(reply, Value::Nil, "{change:?} went unseen");
    }
    // A watched key whose deadline passes before EXEC, even if nothing deleted it yet. The
    // WATCH must come before the deadline, which a loaded machine can miss: then again.
    for tries in 1.. {
        let set = Instant::now();
        let _: () = query(&mut c, &["SET", "t", "v", "PX", "150"]);
        let _: () = query(&mut c, &["WATCH", "t"]);
        if set.elapsed() < Duration::from_millis(150) {
            break;
        }
        let _: () = query(&mut c, &["UNWATCH"]);
        assert!(tries < 20, "never watched t within 150 ms of setting it");
    }
    std::thread::sleep(Duration::from_millis(200));
    let _: () = query(&mut c, &["MULTI"]);
    let _: () = query(&mut c, &["SET", "other", "1"]);
    let reply: Value = redis::cmd("EXEC").query(&mut c).expect("EXEC");
    assert_eq!(reply, Value::Nil, "the watched key expired");
    assert_eq!(query::<i64>(&mut c, &["EXISTS", "other"]), 0);
    // Unchanged: EXEC runs.
    let _: () = query(&mut c, &["WATCH", "h"]);
    let _: () = query(&mut c, &["MULTI"]);
    let _: () = query(&mut c, &["HLEN", "h"]);
    let reply: Vec<i64> = redis::cmd("EXEC").query(&mut c).expect("EXEC");
    assert_eq!(reply, [2]);
}

/// A hash of `n` fields `f0000`, `f0001`, ... (field order is numeric order), values `0`, `1`.
fn big_hash(c: &mut redis::Connection, key: &str, n: usize) {
    let mut args = vec!["HSET".to_string(), key.to_string()];
    args.extend((0..n).flat_map(|i| [format!("f{i:04}"), i.to_string()]));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_eq!(query::<usize>(c, &args), n);
}

/// `WATCH` of a hash sees any of its fields overwritten, however many fields come before it
/// (an overwrite adds 0 to the size record, which `WATCH` records), as Redis sees any write
/// to a watched key; a write that changes nothing (`HSETNX` of an existing field) does not
/// abort, as in Redis.
#[test]
fn watch_sees_any_field_overwritten() {
    let server = TestServer::start();
    let mut c = server.client();
    let mut other = server.client();
    big_hash(&mut c, "h", 2000);
    for write in [
        &["HINCRBY", "h", "f1500", "1"][..],
        &["HINCRBYFLOAT", "h", "f1500", "0.5"],
        &["HSET", "h", "f1500", "new"],
        &["HSET", "h", "f1500", "new"],
        &["HMSET", "h", "f1999", "x", "f1998", "y"],
        &["HSET", "h", "f1500", "again", "added", "1"],
        &["HDEL", "h", "added"],
    ] {
        assert!(
            !exec_survives(&mut c, &mut other, "h", write),
            "{write:?} went unseen"
        );
    }
    assert_eq!(query::<String>(&mut c, &["HGET", "h", "f1500"]), "again");
    assert_eq!(query::<String>(&mut c, &["HGET", "h", "f1999"]), "x");
    assert_eq!(query::<i64>(&mut c, &["HLEN", "h"]), 2000);
    for write in [
        &["HSETNX", "h", "f1500", "no"][..],
        &["HDEL", "h", "nofield"],
        &["HGET", "h", "f1500"],
    ] {
        assert!(
            exec_survives(&mut c, &mut other, "h", write),
            "{write:?} changed nothing"
        );
    }
}

/// Overwriting a field of a hash nobody watches does not abort a transaction that watches
/// another hash, nor does adding to that hash: each hash has its own size record.
#[test]
fn watch_ignores_fields_of_other_hashes() {
    let server = TestServer::start();
    let mut c = server.client();
    let mut other = server.client();
    big_hash(&mut c, "h", 2000);
    big_hash(&mut c, "watched", 2000);
    for write in [
        &["HINCRBY", "h", "f1500", "1"][..],
        &["HINCRBYFLOAT", "h", "f0001", "1.5"],
        &["HSET", "h", "f1500", "new"],
        &["HSET", "h", "new", "1"],
        &["SET", "s", "v"],
    ] {
        assert!(
            exec_survives(&mut c, &mut other, "watched", write),
            "{write:?} aborted a transaction that does not watch it"
        );
    }
}

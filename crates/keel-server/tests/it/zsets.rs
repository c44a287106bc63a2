//! Sorted sets through the server: replies in RESP2 and RESP3 (doubles, pairs), `WRONGTYPE`,
//! the generic key commands, and concurrent writers that never conflict.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use redis::Value;

use crate::{TestServer, assert_ttl, error, exec_survives, info_counter, query};

const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

/// A reply as text, RESP types kept apart: `"a"` bulk, `,1.5` double, `[..]` array.
fn text(v: &Value) -> String {
    match v {
        Value::Nil => "nil".into(),
        Value::Int(n) => format!(":{n}"),
        Value::BulkString(b) => format!("\"{}\"", String::from_utf8_lossy(b)),
        Value::SimpleString(s) => format!("+{s}"),
        Value::Double(d) => format!(",{d}"),
        Value::Array(items) | Value::Set(items) => {
            let inner: Vec<String> = items.iter().map(text).collect();
            format!("[{}]", inner.join(" "))
        }
        other => format!("{other:?}"),
    }
}

fn q(c: &mut redis::Connection, args: &[&str]) -> String {
    text(&query::<Value>(c, args))
}

#[test]
fn sorted_set_commands_match_redis() {
    let server = TestServer::start();
    for resp3 in [false, true] {
        let mut c = server.client_proto(resp3);
        // A double is a bulk string in RESP2, a double in RESP3.
        let d = |x: &str| {
            if resp3 {
                format!(",{x}")
            } else {
                format!("\"{x}\"")
            }
        };
        // A member and its score: flat in RESP2, a pair in RESP3.
        let ms = |pairs: &[(&str, &str)]| {
            let items: Vec<String> = pairs
                .iter()
                .map(|(m, s)| {
                    if resp3 {
                        format!("[\"{m}\" {}]", d(s))
                    } else {
                        format!("\"{m}\" {}", d(s))
                    }
                })
                .collect();
            format!("[{}]", items.join(" "))
        };
        let _: () = query(&mut c, &["FLUSHDB"]);
        assert_eq!(
            q(
                &mut c,
                &["ZADD", "z", "1", "a", "2", "b", "3", "c", "1.5", "d"]
            ),
            ":4"
        );
        assert_eq!(q(&mut c, &["ZADD", "z", "-inf", "m", "inf", "n"]), ":2");
        assert_eq!(
            q(&mut c, &["ZRANGE", "z", "0", "-1", "WITHSCORES"]),
            ms(&[
                ("m", "-inf"),
                ("a", "1"),
                ("d", "1.5"),
                ("b", "2"),
                ("c", "3"),
                ("n", "inf")
            ])
        );
        // Scores print as %.17g.
        let _: () = query(&mut c, &["ZADD", "f", "0.1", "p", "1e-5", "q", "-0", "u"]);
        if resp3 {
            // The client reads a double as an f64; the differential test sees its text.
            assert_eq!(q(&mut c, &["ZSCORE", "f", "p"]), ",0.1");
        } else {
            assert_eq!(q(&mut c, &["ZSCORE", "f", "p"]), "\"0.10000000000000001\"");
            assert_eq!(
                q(&mut c, &["ZSCORE", "f", "q"]),
                "\"1.0000000000000001e-05\""
            );
        }
        assert_eq!(q(&mut c, &["ZSCORE", "f", "u"]), d("0"));
        assert_eq!(q(&mut c, &["ZSCORE", "f", "nosuch"]), "nil");
        assert_eq!(q(&mut c, &["ZSCORE", "nokey", "a"]), "nil");
        assert_eq!(
            q(&mut c, &["ZMSCORE", "z", "a", "nosuch", "n"]),
            format!("[{} nil {}]", d("1"), d("inf"))
        );
        // Options.
        assert_eq!(
            error(&mut c, &["ZADD", "z", "NX", "XX", "1", "a"]),
            "ERR XX and NX options at the same time are not compatible"
        );
        assert_eq!(
            error(&mut c, &["ZADD", "z", "GT", "LT", "1", "a"]),
            "ERR GT, LT, and/or NX options at the same time are not compatible"
        );
        assert_eq!(
            error(&mut c, &["ZADD", "z", "INCR", "1", "a", "2", "b"]),
            "ERR INCR option supports a single increment-element pair"
        );
        assert_eq!(
            error(&mut c, &["ZADD", "z", "1", "a", "2"]),
            "ERR syntax error"
        );
        assert_eq!(
            error(&mut c, &["ZADD", "z", "nan", "a"]),
            "ERR value is not a valid float"
        );
        assert_eq!(
            error(&mut c, &["ZADD", "z", "1e400", "a"]),
            "ERR value is not a valid float"
        );
        assert_eq!(q(&mut c, &["ZADD", "z", "INCR", "5", "a"]), d("6"));
        assert_eq!(q(&mut c, &["ZADD", "z", "INCR", "NX", "5", "a"]), "nil");
        assert_eq!(q(&mut c, &["ZADD", "z", "INCR", "XX", "5", "zz"]), "nil");
        assert_eq!(q(&mut c, &["ZADD", "z", "GT", "INCR", "-100", "a"]), "nil");
        assert_eq!(
            q(
                &mut c,
                &["ZADD", "z", "CH", "1", "a", "2", "b", "10", "new"]
            ),
            ":2"
        );
        assert_eq!(q(&mut c, &["ZADD", "z", "XX", "CH", "100", "new2"]), ":0");
        assert_eq!(q(&mut c, &["ZADD", "nokey", "XX", "1", "a"]), ":0");
        assert_eq!(q(&mut c, &["EXISTS", "nokey"]), ":0");
        assert_eq!(
            q(&mut c, &["ZADD", "z", "LT", "CH", "5", "new", "20", "c"]),
            ":1"
        );
        assert_eq!(q(&mut c, &["ZINCRBY", "z", "1.5", "fresh"]), d("1.5"));
        assert_eq!(q(&mut c, &["ZINCRBY", "z", "inf", "n"]), d("inf"));
        assert_eq!(
            error(&mut c, &["ZINCRBY", "z", "-inf", "n"]),
            "ERR resulting score is not a number (NaN)"
        );
        assert_eq!(
            error(&mut c, &["ZINCRBY", "z", "x", "n"]),
            "ERR value is not a valid float"
        );
        // z: m -inf, a 1, d 1.5, fresh 1.5, b 2, c 3, new 5, n inf.
        assert_eq!(q(&mut c, &["ZCARD", "z"]), ":8");
        assert_eq!(q(&mut c, &["ZCARD", "nokey"]), ":0");
        assert_eq!(q(&mut c, &["ZCOUNT", "z", "-inf", "+inf"]), ":8");
        assert_eq!(q(&mut c, &["ZCOUNT", "z", "(1", "3"]), ":4");
        assert_eq!(q(&mut c, &["ZCOUNT", "z", "3", "1"]), ":0");
        assert_eq!(
            error(&mut c, &["ZCOUNT", "z", "x", "3"]),
            "ERR min or max is not a float"
        );
        assert_eq!(q(&mut c, &["ZRANK", "z", "b"]), ":4");
        assert_eq!(q(&mut c, &["ZREVRANK", "z", "b"]), ":3");
        assert_eq!(q(&mut c, &["ZRANK", "z", "nosuch"]), "nil");
        assert_eq!(q(&mut c, &["ZRANK", "nokey", "a"]), "nil");
        // Ranges.
        assert_eq!(q(&mut c, &["ZRANGE", "z", "1", "2"]), "[\"a\" \"d\"]");
        assert_eq!(
            q(&mut c, &["ZRANGE", "z", "-2", "-1", "REV"]),
            "[\"a\" \"m\"]"
        );
        assert_eq!(q(&mut c, &["ZRANGE", "z", "5", "1"]), "[]");
        assert_eq!(q(&mut c, &["ZRANGE", "z", "-100", "0"]), "[\"m\"]");
        assert_eq!(
            q(&mut c, &["ZRANGE", "z", "(1", "2", "BYSCORE", "WITHSCORES"]),
            ms(&[("d", "1.5"), ("fresh", "1.5"), ("b", "2")])
        );
        assert_eq!(
            q(
                &mut c,
                &["ZRANGE", "z", "(1", "3", "BYSCORE", "LIMIT", "1", "2"]
            ),
            "[\"fresh\" \"b\"]"
        );
        assert_eq!(
            q(&mut c, &["ZRANGE", "z", "3", "(1", "BYSCORE", "REV"]),
            "[\"c\" \"b\" \"fresh\" \"d\"]"
        );
        assert_eq!(
            error(&mut c, &["ZRANGE", "z", "0", "-1", "LIMIT", "0", "1"]),
            "ERR syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX"
        );
        assert_eq!(
            error(&mut c, &["ZRANGE", "z", "0", "1", "BYSCORE", "BYLEX"]),
            "ERR syntax error"
        );
        assert_eq!(
            error(&mut c, &["ZRANGE", "z", "x", "1"]),
            "ERR value is not an integer or out of range"
        );
        assert_eq!(
            q(
                &mut c,
                &["ZRANGEBYSCORE", "z", "-inf", "+inf", "LIMIT", "1", "2"]
            ),
            "[\"a\" \"d\"]"
        );
        assert_eq!(
            q(
                &mut c,
                &[
                    "ZREVRANGEBYSCORE",
                    "z",
                    "+inf",
                    "-inf",
                    "WITHSCORES",
                    "LIMIT",
                    "0",
                    "1"
                ]
            ),
            ms(&[("n", "inf")])
        );
        assert_eq!(
            q(&mut c, &["ZREVRANGE", "z", "0", "1", "WITHSCORES"]),
            ms(&[("n", "inf"), ("new", "5")])
        );
        assert_eq!(
            error(&mut c, &["ZRANGEBYLEX", "z", "-", "+", "WITHSCORES"]),
            "ERR syntax error, WITHSCORES not supported in combination with BYLEX"
        );
        // Lex ranges over members of one score.
        let _: () = query(
            &mut c,
            &["ZADD", "l", "0", "a", "0", "b", "0", "c", "0", "d"],
        );
        assert_eq!(
            q(&mut c, &["ZRANGEBYLEX", "l", "[b", "(d"]),
            "[\"b\" \"c\"]"
        );
        assert_eq!(
            q(&mut c, &["ZRANGEBYLEX", "l", "-", "+", "LIMIT", "1", "2"]),
            "[\"b\" \"c\"]"
        );
        assert_eq!(
            q(&mut c, &["ZREVRANGEBYLEX", "l", "+", "(b"]),
            "[\"d\" \"c\"]"
        );
        assert_eq!(
            q(&mut c, &["ZRANGE", "l", "[c", "-", "BYLEX", "REV"]),
            "[\"c\" \"b\" \"a\"]"
        );
        assert_eq!(q(&mut c, &["ZLEXCOUNT", "l", "(a", "+"]), ":3");
        assert_eq!(q(&mut c, &["ZLEXCOUNT", "l", "[b", "[b"]), ":1");
        assert_eq!(q(&mut c, &["ZLEXCOUNT", "l", "(b", "[b"]), ":0");
        assert_eq!(
            error(&mut c, &["ZLEXCOUNT", "l", "b", "+"]),
            "ERR min or max not valid string range item"
        );
        // Removal.
        assert_eq!(q(&mut c, &["ZREM", "l", "a", "zz"]), ":1");
        assert_eq!(q(&mut c, &["ZREMRANGEBYLEX", "l", "[c", "+"]), ":2");
        assert_eq!(q(&mut c, &["ZREMRANGEBYRANK", "l", "0", "-1"]), ":1");
        assert_eq!(q(&mut c, &["EXISTS", "l"]), ":0");
        assert_eq!(q(&mut c, &["ZREMRANGEBYSCORE", "z", "(1", "2"]), ":3");
        assert_eq!(q(&mut c, &["ZREMRANGEBYRANK", "z", "-1", "-1"]), ":1");
        assert_eq!(
            error(&mut c, &["ZREMRANGEBYSCORE", "z", "x", "1"]),
            "ERR min or max is not a float"
        );
        // z: m -inf, a 1, c 3, new 5.
        assert_eq!(
            q(&mut c, &["ZPOPMIN", "z"]),
            format!("[\"m\" {}]", d("-inf"))
        );
        assert_eq!(
            q(&mut c, &["ZPOPMAX", "z", "2"]),
            ms(&[("new", "5"), ("c", "3")])
        );
        assert_eq!(q(&mut c, &["ZPOPMIN", "z", "0"]), "[]");
        assert_eq!(q(&mut c, &["ZPOPMIN", "nokey"]), "[]");
        assert_eq!(
            error(&mut c, &["ZPOPMIN", "z", "-1"]),
            "ERR value is out of range, must be positive"
        );
        assert_eq!(q(&mut c, &["ZPOPMIN", "z", "5"]), ms(&[("a", "1")]));
        assert_eq!(q(&mut c, &["EXISTS", "z"]), ":0");
        // Stores.
        let _: () = query(&mut c, &["ZADD", "z", "1", "a", "2", "b", "3", "c"]);
        let _: () = query(&mut c, &["SADD", "s", "a", "b", "x"]);
        assert_eq!(q(&mut c, &["ZRANGESTORE", "d", "z", "0", "1"]), ":2");
        assert_eq!(
            q(&mut c, &["ZRANGE", "d", "0", "-1", "WITHSCORES"]),
            ms(&[("a", "1"), ("b", "2")])
        );
        assert_eq!(q(&mut c, &["ZRANGESTORE", "d", "nokey", "0", "-1"]), ":0");
        assert_eq!(q(&mut c, &["EXISTS", "d"]), ":0");
        assert_eq!(
            error(&mut c, &["ZRANGESTORE", "d", "z", "0", "-1", "WITHSCORES"]),
            "ERR syntax error"
        );
        assert_eq!(q(&mut c, &["ZUNIONSTORE", "u", "2", "z", "s"]), ":4");
        assert_eq!(
            q(&mut c, &["ZRANGE", "u", "0", "-1", "WITHSCORES"]),
            ms(&[("x", "1"), ("a", "2"), ("b", "3"), ("c", "3")])
        );
        assert_eq!(
            q(
                &mut c,
                &[
                    "ZINTERSTORE",
                    "i",
                    "2",
                    "z",
                    "s",
                    "WEIGHTS",
                    "2",
                    "3",
                    "AGGREGATE",
                    "MAX"
                ]
            ),
            ":2"
        );
        assert_eq!(
            q(&mut c, &["ZRANGE", "i", "0", "-1", "WITHSCORES"]),
            ms(&[("a", "3"), ("b", "4")])
        );
        assert_eq!(q(&mut c, &["ZINTERSTORE", "i", "2", "z", "nokey"]), ":0");
        assert_eq!(q(&mut c, &["EXISTS", "i"]), ":0");
        assert_eq!(
            q(
                &mut c,
                &["ZUNIONSTORE", "u", "2", "z", "z", "WEIGHTS", "inf", "-inf"]
            ),
            ":3"
        );
        assert_eq!(q(&mut c, &["ZSCORE", "u", "a"]), d("0"));
        assert_eq!(
            error(&mut c, &["ZUNIONSTORE", "u", "0", "z"]),
            "ERR at least 1 input key is needed for 'zunionstore' command"
        );
        assert_eq!(
            error(&mut c, &["ZUNIONSTORE", "u", "3", "z"]),
            "ERR syntax error"
        );
        assert_eq!(
            error(&mut c, &["ZUNIONSTORE", "u", "1", "z", "WEIGHTS", "x"]),
            "ERR weight value is not a float"
        );
        assert_eq!(
            error(&mut c, &["ZINTERSTORE", "u", "1", "z", "AGGREGATE", "avg"]),
            "ERR syntax error"
        );
        // ZSCAN and ZRANDMEMBER.
        assert_eq!(
            q(&mut c, &["ZSCAN", "z", "0"]),
            "[\"0\" [\"a\" \"1\" \"b\" \"2\" \"c\" \"3\"]]"
        );
        assert_eq!(
            q(&mut c, &["ZSCAN", "z", "0", "MATCH", "b"]),
            "[\"0\" [\"b\" \"2\"]]"
        );
        assert_eq!(
            q(&mut c, &["ZSCAN", "nokey", "0", "COUNT", "0"]),
            "[\"0\" []]"
        );
        let one: String = query(&mut c, &["ZRANDMEMBER", "z"]);
        assert!(["a", "b", "c"].contains(&one.as_str()));
        assert_eq!(q(&mut c, &["ZRANDMEMBER", "nokey"]), "nil");
        assert_eq!(q(&mut c, &["ZRANDMEMBER", "z", "0"]), "[]");
        let all = q(&mut c, &["ZRANDMEMBER", "z", "10", "WITHSCORES"]);
        for pair in [("a", "1"), ("b", "2"), ("c", "3")] {
            let want = ms(&[pair]);
            assert!(all.contains(&want[1..want.len() - 1]), "{all}");
        }
        let many: Vec<Value> = query(&mut c, &["ZRANDMEMBER", "z", "-5"]);
        assert_eq!(many.len(), 5);
        assert_eq!(
            error(&mut c, &["ZRANDMEMBER", "z", "1", "WITHSCORE"]),
            "ERR syntax error"
        );
        assert_eq!(
            error(
                &mut c,
                &["ZRANDMEMBER", "z", "9223372036854775807", "WITHSCORES"]
            ),
            "ERR value is out of range"
        );
    }
}

#[test]
fn sorted_sets_keep_to_themselves() {
    let server = TestServer::start();
    let mut c = server.client();
    let _: () = query(&mut c, &["ZADD", "z", "1", "m"]);
    let _: () = query(&mut c, &["SET", "str", "x"]);
    assert_eq!(query::<String>(&mut c, &["TYPE", "z"]), "zset");
    for args in [
        &["GET", "z"][..],
        &["SADD", "z", "a"],
        &["ZADD", "str", "1", "a"],
        &["ZINCRBY", "str", "1", "a"],
        &["ZSCORE", "str", "a"],
        &["ZCARD", "str"],
        &["ZRANGE", "str", "0", "-1"],
        &["ZRANK", "str", "a"],
        &["ZPOPMIN", "str"],
        &["ZREM", "str", "a"],
        &["ZUNIONSTORE", "d", "2", "z", "str"],
        &["ZRANGESTORE", "d", "str", "0", "-1"],
        &["ZSCAN", "str", "0"],
        &["ZRANDMEMBER", "str"],
    ] {
        assert_eq!(error(&mut c, args), WRONGTYPE, "{args:?}");
    }
    let (_, zsets): (String, Vec<String>) = query(&mut c, &["SCAN", "0", "TYPE", "zset"]);
    assert_eq!(zsets, ["z"]);
    let set = std::time::Instant::now();
    let _: () = query(&mut c, &["EXPIRE", "z", "100"]);
    let _: () = query(&mut c, &["RENAME", "z", "moved"]);
    assert_ttl(&mut c, "moved", 100, set);
    assert_eq!(
        query::<Vec<String>>(&mut c, &["ZRANGE", "moved", "0", "-1"]),
        ["m"]
    );
    // ZADD over a string with a TTL's name after it expired starts afresh.
    let _: () = query(&mut c, &["PEXPIRE", "moved", "1"]);
    std::thread::sleep(std::time::Duration::from_millis(5));
    assert_eq!(query::<i64>(&mut c, &["ZCARD", "moved"]), 0);
    assert_eq!(query::<i64>(&mut c, &["ZADD", "moved", "2", "n"]), 1);
    assert_eq!(
        query::<Vec<String>>(&mut c, &["ZRANGE", "moved", "0", "-1"]),
        ["n"]
    );
}

/// Clients adding and incrementing different members of one sorted set never conflict.
#[test]
fn concurrent_member_writers_do_not_conflict() {
    const CLIENTS: usize = 4;
    const ROUNDS: i64 = 200;
    // On the worker pool: the poller thread runs one command at a time, so nothing would
    // overlap and the check below could not fail.
    let server = TestServer::with(|c| c.poller = keel_server::lanes::PollerMode::Off);
    let mut c = server.client();
    let _: () = query(&mut c, &["ZADD", "z", "0", "seed"]);
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
                    let _: Value = query(&mut c, &["ZINCRBY", "z", "1", &format!("n{t}")]);
                    let _: i64 =
                        query(&mut c, &["ZADD", "z", &i.to_string(), &format!("m{t}:{i}")]);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("client");
    }
    for t in 0..CLIENTS {
        assert_eq!(
            query::<f64>(&mut c, &["ZSCORE", "z", &format!("n{t}")]),
            ROUNDS as f64
        );
    }
    assert_eq!(
        query::<i64>(&mut c, &["ZCARD", "z"]),
        1 + (CLIENTS as i64) * (ROUNDS + 1)
    );
    assert_eq!(
        conflicts(&mut c),
        before,
        "a member write lost a validation"
    );
}

/// Clients incrementing the same members of one sorted set never conflict either: `ZINCRBY`
/// is the engine's score add, which moves the member's index entry at commit. Meanwhile
/// every `ZRANGE` sees each member once, at the score `ZSCORE` gives it in the same `MULTI`.
#[test]
fn concurrent_increments_of_one_member_do_not_conflict() {
    const CLIENTS: usize = 4;
    const ROUNDS: i64 = 300;
    let server = TestServer::with(|c| c.poller = keel_server::lanes::PollerMode::Off);
    let mut c = server.client();
    let _: () = query(&mut c, &["ZADD", "z", "0", "hot", "5", "other"]);
    let conflicts = |c: &mut redis::Connection| {
        let info: String = query(c, &["INFO", "keel"]);
        // Validations lost (a lock held past its wait under CPU pressure is not one).
        info_counter(&info, "keel_aborts_read_changed") + info_counter(&info, "keel_aborts_phantom")
    };
    let before = conflicts(&mut c);
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (url, stop) = (server.url(false), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut c = crate::connect(&url);
            let mut checks = 0;
            while !stop.load(Ordering::Relaxed) {
                let (range, hot): (Vec<(String, f64)>, f64) = redis::pipe()
                    .atomic()
                    .cmd("ZRANGE")
                    .arg("z")
                    .arg(0)
                    .arg(-1)
                    .arg("WITHSCORES")
                    .cmd("ZSCORE")
                    .arg("z")
                    .arg("hot")
                    .query(&mut c)
                    .expect("ZRANGE and ZSCORE");
                let names: Vec<&str> = range.iter().map(|(m, _)| m.as_str()).collect();
                assert!(
                    names == ["other", "hot"] || names == ["hot", "other"],
                    "each member once: {range:?}"
                );
                assert!(range.contains(&("hot".to_string(), hot)), "{range:?} {hot}");
                checks += 1;
            }
            checks
        })
    };
    let threads: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let url = server.url(false);
            std::thread::spawn(move || {
                let mut c = crate::connect(&url);
                let mut last = 0.0;
                for _ in 0..ROUNDS {
                    let now: f64 = query(&mut c, &["ZINCRBY", "z", "1", "hot"]);
                    assert!(
                        now > last,
                        "an increment's reply went back: {last} then {now}"
                    );
                    last = now;
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("client");
    }
    stop.store(true, Ordering::Relaxed);
    assert!(reader.join().expect("reader") > 0);
    let total = (CLIENTS as i64 * ROUNDS) as f64;
    assert_eq!(query::<f64>(&mut c, &["ZSCORE", "z", "hot"]), total);
    assert_eq!(
        query::<Vec<String>>(&mut c, &["ZRANGEBYSCORE", "z", &total.to_string(), "+inf"]),
        ["hot"]
    );
    assert_eq!(query::<i64>(&mut c, &["ZCARD", "z"]), 2);
    assert_eq!(conflicts(&mut c), before, "an increment conflicted");
}

/// A sorted set past `ZSCAN`'s whole-set size: ranks counted over the index, `ZSCAN` in
/// pages that see every member once, and `ZREMRANGEBYRANK` over many members.
#[test]
fn a_large_sorted_set_pages_and_ranks() {
    let server = TestServer::start();
    let mut c = server.client();
    let mut zadd = vec!["ZADD".to_string(), "big".into()];
    for i in 0..300 {
        zadd.push((i * 2).to_string());
        zadd.push(format!("m{i:03}"));
    }
    let zadd: Vec<&str> = zadd.iter().map(String::as_str).collect();
    assert_eq!(query::<i64>(&mut c, &zadd), 300);
    assert_eq!(query::<i64>(&mut c, &["ZRANK", "big", "m250"]), 250);
    assert_eq!(query::<i64>(&mut c, &["ZREVRANK", "big", "m250"]), 49);
    assert_eq!(
        query::<Vec<String>>(&mut c, &["ZRANGE", "big", "100", "102"]),
        ["m100", "m101", "m102"]
    );
    assert_eq!(
        query::<Vec<String>>(&mut c, &["ZRANGE", "big", "-2", "-1", "REV"]),
        ["m001", "m000"]
    );
    assert_eq!(query::<i64>(&mut c, &["ZCOUNT", "big", "(100", "200"]), 50);
    let mut cursor = "0".to_string();
    let mut seen = Vec::new();
    let mut calls = 0;
    loop {
        let (next, items): (String, Vec<String>) =
            query(&mut c, &["ZSCAN", "big", &cursor, "COUNT", "40"]);
        for pair in items.chunks(2) {
            let i: usize = pair[0][1..].parse().expect("a member number");
            assert_eq!(pair[1], (i * 2).to_string());
            seen.push(i);
        }
        calls += 1;
        if next == "0" {
            break;
        }
        cursor = next;
    }
    assert!(calls >= 8, "{calls}");
    assert_eq!(
        seen,
        (0..300).collect::<Vec<_>>(),
        "in score order, each once"
    );
    assert_eq!(
        query::<i64>(&mut c, &["ZREMRANGEBYRANK", "big", "0", "199"]),
        200
    );
    assert_eq!(query::<i64>(&mut c, &["ZCARD", "big"]), 100);
    assert_eq!(
        query::<Vec<String>>(&mut c, &["ZRANGE", "big", "0", "0"]),
        ["m200"]
    );
}

/// A sorted set of `n` members `m0000`, `m0001`, ... with scores 0, 1, ...: member order and
/// score order agree.
fn big_zset(c: &mut redis::Connection, key: &str, n: usize) {
    let mut args = vec!["ZADD".to_string(), key.to_string()];
    args.extend((0..n).flat_map(|i| [i.to_string(), format!("m{i:04}")]));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_eq!(query::<usize>(c, &args), n);
}

/// `WATCH` of a sorted set sees any member's score change, however many members come before
/// it in member or score order, as Redis does; a `ZADD` or `ZINCRBY` that leaves the score as
/// it was changes nothing and does not abort (Redis signals only an added or updated member).
/// A score change in another sorted set does not abort.
#[test]
fn watch_sees_any_score_changed() {
    let server = TestServer::start();
    let mut c = server.client();
    let mut other = server.client();
    big_zset(&mut c, "z", 2000);
    big_zset(&mut c, "y", 2000);
    for write in [
        &["ZADD", "z", "1500.5", "m1500"][..],
        &["ZINCRBY", "z", "1", "m1500"],
        &["ZADD", "z", "XX", "CH", "5", "m1999"],
        &["ZADD", "z", "GT", "3000", "m1999"],
        &["ZADD", "z", "INCR", "-2", "m1600"],
        &["ZADD", "z", "1", "new", "1700", "m1700"],
        &["ZREM", "z", "new"],
    ] {
        assert!(
            !exec_survives(&mut c, &mut other, "z", write),
            "{write:?} went unseen"
        );
    }
    assert_eq!(q(&mut c, &["ZSCORE", "z", "m1500"]), "\"1501.5\"");
    assert_eq!(q(&mut c, &["ZSCORE", "z", "m1999"]), "\"3000\"");
    assert_eq!(q(&mut c, &["ZRANK", "z", "m1999"]), ":1999");
    assert_eq!(q(&mut c, &["ZCARD", "z"]), ":2000");
    for write in [
        &["ZADD", "z", "1501.5", "m1500"][..],
        &["ZINCRBY", "z", "0", "m1500"],
        &["ZADD", "z", "NX", "7", "m1500"],
        &["ZADD", "z", "LT", "9000", "m1500"],
        &["ZADD", "z", "XX", "1", "absent"],
        &["ZADD", "y", "7", "m1500"],
        &["ZINCRBY", "y", "1", "m1800"],
    ] {
        assert!(
            exec_survives(&mut c, &mut other, "z", write),
            "{write:?} aborted the EXEC"
        );
    }
}

/// Pipelined pops of one sorted set from many clients on the worker pool, where they overlap
/// and every pop conflicts with the others: each member is popped exactly once, no pop fails,
/// and once the key is hot (`hot.rs`) the pops queue for its lock instead of retrying, and
/// their connections move to the poller thread.
#[test]
fn pops_of_one_hot_key_queue_instead_of_conflicting() {
    const CLIENTS: usize = 8;
    const DEPTH: usize = 16;
    const MEMBERS: usize = 8 * 16 * 40;
    let server = TestServer::with(|c| c.poller = keel_server::lanes::PollerMode::Off);
    let mut c = server.client();
    for chunk in (0..MEMBERS).collect::<Vec<_>>().chunks(1000) {
        let mut zadd = redis::cmd("ZADD");
        zadd.arg("q");
        for i in chunk {
            zadd.arg(*i).arg(format!("m{i}"));
        }
        let _: i64 = zadd.query(&mut c).expect("ZADD");
    }
    let retries = |c: &mut redis::Connection| {
        info_counter(
            &query::<String>(c, &["INFO", "keel"]),
            "keel_conflict_retries",
        )
    };
    let moves = |c: &mut redis::Connection| {
        info_counter(&query::<String>(c, &["INFO", "keel"]), "connection_moves")
    };
    let before = retries(&mut c);
    let moves_before = moves(&mut c);
    let threads: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let url = server.url(false);
            std::thread::spawn(move || {
                let mut c = crate::connect(&url);
                let mut popped = Vec::new();
                for _ in 0..MEMBERS / CLIENTS / DEPTH {
                    let mut pipe = redis::pipe();
                    for _ in 0..DEPTH {
                        pipe.cmd("ZPOPMIN").arg("q");
                    }
                    let replies: Vec<Vec<String>> = pipe.query(&mut c).expect("no pop fails");
                    popped.extend(replies.into_iter().map(|r| r[0].clone()));
                }
                popped
            })
        })
        .collect();
    let mut popped: Vec<String> = threads
        .into_iter()
        .flat_map(|t| t.join().expect("client"))
        .collect();
    popped.sort();
    let mut expected: Vec<String> = (0..MEMBERS).map(|i| format!("m{i}")).collect();
    expected.sort();
    assert_eq!(popped, expected, "every member popped exactly once");
    let retries = retries(&mut c) - before;
    // The poppers' connections took the hot key's lock once pops conflicted, so they went
    // to the poller thread. (On a loaded machine the clients' batches may never overlap:
    // then nothing conflicted and nothing had to move.)
    assert!(
        moves(&mut c) > moves_before || retries == 0,
        "{retries} conflict retries and no connection moved to the poller"
    );
    // Pops that all conflict with each other retry until the key turns hot, then queue: a
    // few retries per pop without the lock (236-255 here with keys never turning hot), a
    // handful in all with it (83 once in a loaded CI run, where the key cooled between
    // batches).
    assert!(
        retries < (MEMBERS / DEPTH / 2) as u64,
        "{retries} conflict retries for {} pipelined batches",
        MEMBERS / DEPTH
    );
}

fn bulk(s: &str) -> Value {
    Value::BulkString(s.as_bytes().to_vec())
}

/// `BZPOPMIN`, `BZPOPMAX` and `BZMPOP`: served at once when a key holds members, else woken by
/// a write that makes one (`ZADD`, `ZINCRBY`, a `…STORE`), in the order clients blocked; a
/// client blocked on a list (or a sorted set) is not woken by the other type's writes and
/// keeps waiting, as in Redis; timeouts answer a null array; inside `MULTI` they never block.
#[test]
fn blocked_sorted_set_pops_wake_on_add_and_time_out() {
    use crate::lists::{blocked_clients, spawn_query, wait_blocked};
    use std::time::Duration;
    let server = TestServer::start();
    let url = server.url(false);
    let mut c = server.client();
    // At once, from the first key that holds a sorted set.
    let _: i64 = query(&mut c, &["ZADD", "z2", "1", "a", "2", "b"]);
    assert_eq!(
        query::<Value>(&mut c, &["BZPOPMAX", "none", "z2", "0"]),
        Value::Array(vec![bulk("z2"), bulk("b"), bulk("2")])
    );
    assert_eq!(
        error(&mut c, &["BZPOPMIN", "z2", "x"]),
        "ERR timeout is not a float or out of range"
    );
    let _: () = query(&mut c, &["RPUSH", "alist", "x"]);
    assert_eq!(error(&mut c, &["BZPOPMIN", "alist", "0"]), WRONGTYPE);
    // Woken by a ZADD from another client.
    let waiter = spawn_query(url.clone(), vec!["BZPOPMIN", "w1", "w2", "0"]);
    wait_blocked(&mut c, 1);
    let _: i64 = query(&mut c, &["ZADD", "w2", "5", "x", "3", "y"]);
    let (reply, _) = waiter.join().expect("waiter");
    assert_eq!(reply, Value::Array(vec![bulk("w2"), bulk("y"), bulk("3")]));
    assert_eq!(blocked_clients(&mut c), 0);
    // BZMPOP woken by ZINCRBY takes up to its count; a ZUNIONSTORE into the key wakes too.
    let waiter = spawn_query(
        url.clone(),
        vec!["BZMPOP", "0", "1", "m", "MAX", "COUNT", "2"],
    );
    wait_blocked(&mut c, 1);
    let _: f64 = query(&mut c, &["ZINCRBY", "m", "7", "p"]);
    let (reply, _) = waiter.join().expect("waiter");
    assert_eq!(
        reply,
        Value::Array(vec![
            bulk("m"),
            Value::Array(vec![Value::Array(vec![bulk("p"), bulk("7")])])
        ])
    );
    let waiter = spawn_query(url.clone(), vec!["BZPOPMIN", "u", "0"]);
    wait_blocked(&mut c, 1);
    let _: i64 = query(&mut c, &["ZUNIONSTORE", "u", "1", "w2"]);
    let (reply, _) = waiter.join().expect("waiter");
    assert_eq!(reply, Value::Array(vec![bulk("u"), bulk("x"), bulk("5")]));
    // In the order they blocked, one member each.
    let mut waiters = Vec::new();
    for i in 0..3 {
        waiters.push(spawn_query(url.clone(), vec!["BZPOPMIN", "q", "0"]));
        wait_blocked(&mut c, i + 1);
    }
    let _: i64 = query(&mut c, &["ZADD", "q", "1", "m1", "2", "m2", "3", "m3"]);
    for (i, w) in waiters.into_iter().enumerate() {
        let (reply, _) = w.join().expect("waiter");
        let member = format!("m{}", i + 1);
        let score = (i + 1).to_string();
        assert_eq!(
            reply,
            Value::Array(vec![bulk("q"), bulk(&member), bulk(&score)])
        );
    }
    // A list's waiter is not woken by a sorted set on its key, and keeps waiting; the sorted
    // set's waiter behind it is served.
    let list_waiter = spawn_query(url.clone(), vec!["BLPOP", "mixed", "0.5"]);
    wait_blocked(&mut c, 1);
    let zset_waiter = spawn_query(url.clone(), vec!["BZPOPMIN", "mixed", "0"]);
    wait_blocked(&mut c, 2);
    let _: i64 = query(&mut c, &["ZADD", "mixed", "1", "a", "2", "b"]);
    let (reply, _) = zset_waiter.join().expect("zset waiter");
    assert_eq!(
        reply,
        Value::Array(vec![bulk("mixed"), bulk("a"), bulk("1")])
    );
    let (reply, took) = list_waiter.join().expect("list waiter");
    assert_eq!(reply, Value::Nil, "timed out, not WRONGTYPE");
    assert!(took >= Duration::from_millis(500), "{took:?}");
    // Timeouts, RESP2 and RESP3.
    let waiter = spawn_query(url.clone(), vec!["BZPOPMAX", "none", "0.1"]);
    let (reply, took) = waiter.join().expect("waiter");
    assert_eq!(reply, Value::Nil);
    assert!(took >= Duration::from_millis(100), "{took:?}");
    let mut c3 = server.client_proto(true);
    assert_eq!(
        query::<Value>(&mut c3, &["BZMPOP", "0.01", "1", "none", "MIN"]),
        Value::Nil
    );
    assert_eq!(
        query::<Value>(&mut c3, &["BZPOPMIN", "mixed", "0"]),
        Value::Array(vec![bulk("mixed"), bulk("b"), Value::Double(2.0)])
    );
    // Inside MULTI: no blocking.
    let replies: Vec<Value> = redis::pipe()
        .atomic()
        .cmd("BZPOPMIN")
        .arg("none")
        .arg(0)
        .cmd("BZMPOP")
        .arg(0)
        .arg(1)
        .arg("none")
        .arg("MIN")
        .query(&mut c)
        .expect("MULTI");
    assert_eq!(replies, [Value::Nil, Value::Nil]);
}

//! Sets through the server: every command's replies in RESP2 and RESP3, `WRONGTYPE`, the
//! generic key commands on sets, and concurrent adders that never conflict.

use redis::Value;

use crate::{TestServer, assert_ttl, error, info_counter, query};

const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

#[test]
fn set_commands_match_redis() {
    let server = TestServer::start();
    for resp3 in [false, true] {
        let mut c = server.client_proto(resp3);
        let _: () = query(&mut c, &["FLUSHDB"]);
        assert_eq!(query::<i64>(&mut c, &["SADD", "s", "a", "b", "c", "a"]), 3);
        assert_eq!(query::<i64>(&mut c, &["SADD", "s", "c", "d"]), 1);
        assert_eq!(query::<i64>(&mut c, &["SCARD", "s"]), 4);
        assert_eq!(query::<i64>(&mut c, &["SCARD", "nokey"]), 0);
        let raw: Value = query(&mut c, &["SMEMBERS", "s"]);
        assert_eq!(matches!(raw, Value::Set(_)), resp3, "{raw:?}");
        assert_eq!(
            sorted(query(&mut c, &["SMEMBERS", "s"])),
            ["a", "b", "c", "d"]
        );
        assert!(query::<Vec<String>>(&mut c, &["SMEMBERS", "nokey"]).is_empty());
        assert_eq!(query::<i64>(&mut c, &["SISMEMBER", "s", "a"]), 1);
        assert_eq!(query::<i64>(&mut c, &["SISMEMBER", "s", "z"]), 0);
        assert_eq!(
            query::<Vec<i64>>(&mut c, &["SMISMEMBER", "s", "a", "z", "d"]),
            [1, 0, 1]
        );
        assert_eq!(
            query::<Vec<i64>>(&mut c, &["SMISMEMBER", "nokey", "a"]),
            [0]
        );
        assert_eq!(query::<i64>(&mut c, &["SREM", "s", "a", "z"]), 1);
        assert_eq!(query::<i64>(&mut c, &["SREM", "nokey", "a"]), 0);
        // Algebra.
        let _: () = query(&mut c, &["SADD", "t", "c", "d", "e"]);
        assert_eq!(sorted(query(&mut c, &["SINTER", "s", "t"])), ["c", "d"]);
        assert!(query::<Vec<String>>(&mut c, &["SINTER", "s", "nokey"]).is_empty());
        assert_eq!(
            sorted(query(&mut c, &["SUNION", "s", "t", "nokey"])),
            ["b", "c", "d", "e"]
        );
        assert_eq!(sorted(query(&mut c, &["SDIFF", "s", "t"])), ["b"]);
        assert!(query::<Vec<String>>(&mut c, &["SDIFF", "nokey", "s"]).is_empty());
        let raw: Value = query(&mut c, &["SUNION", "s"]);
        assert_eq!(matches!(raw, Value::Set(_)), resp3, "{raw:?}");
        assert_eq!(query::<i64>(&mut c, &["SINTERSTORE", "d", "s", "t"]), 2);
        assert_eq!(sorted(query(&mut c, &["SMEMBERS", "d"])), ["c", "d"]);
        assert_eq!(query::<i64>(&mut c, &["SUNIONSTORE", "d", "s", "t"]), 4);
        assert_eq!(query::<i64>(&mut c, &["SCARD", "d"]), 4);
        assert_eq!(query::<i64>(&mut c, &["SDIFFSTORE", "d", "t", "s"]), 1);
        assert_eq!(query::<Vec<String>>(&mut c, &["SMEMBERS", "d"]), ["e"]);
        // An empty result deletes the destination, whatever it held.
        let _: () = query(&mut c, &["SET", "str", "x", "EX", "100"]);
        assert_eq!(
            query::<i64>(&mut c, &["SINTERSTORE", "str", "s", "nokey"]),
            0
        );
        assert_eq!(query::<i64>(&mut c, &["EXISTS", "str"]), 0);
        let _: () = query(&mut c, &["SET", "str", "x", "EX", "100"]);
        assert_eq!(query::<i64>(&mut c, &["SUNIONSTORE", "str", "s"]), 3);
        assert_eq!(query::<i64>(&mut c, &["TTL", "str"]), -1);
        assert_eq!(query::<String>(&mut c, &["TYPE", "str"]), "set");
        assert_eq!(query::<i64>(&mut c, &["SINTERCARD", "2", "s", "t"]), 2);
        assert_eq!(
            query::<i64>(&mut c, &["SINTERCARD", "2", "s", "t", "LIMIT", "1"]),
            1
        );
        assert_eq!(query::<i64>(&mut c, &["SINTERCARD", "1", "nokey"]), 0);
        assert_eq!(
            error(&mut c, &["SINTERCARD", "0", "s"]),
            "ERR numkeys should be greater than 0"
        );
        assert_eq!(
            error(&mut c, &["SINTERCARD", "3", "s", "t"]),
            "ERR Number of keys can't be greater than number of args"
        );
        assert_eq!(
            error(&mut c, &["SINTERCARD", "1", "s", "LIMIT", "-1"]),
            "ERR LIMIT can't be negative"
        );
        assert_eq!(
            error(&mut c, &["SINTERCARD", "1", "s", "LIMIT"]),
            "ERR syntax error"
        );
        // SMOVE.
        assert_eq!(query::<i64>(&mut c, &["SMOVE", "s", "t", "b"]), 1);
        assert_eq!(query::<i64>(&mut c, &["SMOVE", "s", "t", "b"]), 0);
        assert_eq!(query::<i64>(&mut c, &["SMOVE", "s", "s", "c"]), 1);
        assert_eq!(query::<i64>(&mut c, &["SMOVE", "nokey", "t", "c"]), 0);
        assert_eq!(query::<i64>(&mut c, &["SMOVE", "s", "new", "c"]), 1);
        assert_eq!(query::<Vec<String>>(&mut c, &["SMEMBERS", "new"]), ["c"]);
        assert_eq!(query::<i64>(&mut c, &["SMOVE", "s", "new", "d"]), 1);
        assert_eq!(query::<i64>(&mut c, &["EXISTS", "s"]), 0, "emptied");
        assert_eq!(query::<i64>(&mut c, &["SCARD", "new"]), 2);
        // SPOP and SRANDMEMBER.
        let _: () = query(&mut c, &["SADD", "p", "1", "2", "3", "4", "5"]);
        let one: String = query(&mut c, &["SPOP", "p"]);
        assert!(["1", "2", "3", "4", "5"].contains(&one.as_str()));
        assert_eq!(query::<i64>(&mut c, &["SISMEMBER", "p", &one]), 0);
        let two: Vec<String> = query(&mut c, &["SPOP", "p", "2"]);
        assert_eq!(two.len(), 2);
        assert_eq!(query::<i64>(&mut c, &["SCARD", "p"]), 2);
        let raw: Value = query(&mut c, &["SPOP", "p", "0"]);
        assert_eq!(matches!(raw, Value::Set(_)), resp3, "{raw:?}");
        assert_eq!(query::<Value>(&mut c, &["SPOP", "nokey"]), Value::Nil);
        assert_eq!(
            error(&mut c, &["SPOP", "p", "-1"]),
            "ERR value is out of range, must be positive"
        );
        assert_eq!(error(&mut c, &["SPOP", "p", "1", "2"]), "ERR syntax error");
        let rest: Vec<String> = query(&mut c, &["SRANDMEMBER", "p", "10"]);
        assert_eq!(rest.len(), 2);
        let raw: Value = query(&mut c, &["SRANDMEMBER", "p", "2"]);
        assert!(matches!(raw, Value::Array(_)), "{raw:?}");
        let many: Vec<String> = query(&mut c, &["SRANDMEMBER", "p", "-7"]);
        assert_eq!(many.len(), 7);
        assert!(many.iter().all(|m| rest.contains(m)));
        let one: String = query(&mut c, &["SRANDMEMBER", "p"]);
        assert!(rest.contains(&one));
        assert_eq!(
            query::<Value>(&mut c, &["SRANDMEMBER", "nokey"]),
            Value::Nil
        );
        assert_eq!(
            error(&mut c, &["SRANDMEMBER", "p", "x"]),
            "ERR value is not an integer or out of range"
        );
        let all: Vec<String> = query(&mut c, &["SPOP", "p", "5"]);
        assert_eq!(sorted(all), sorted(rest));
        assert_eq!(query::<i64>(&mut c, &["EXISTS", "p"]), 0);
        // SSCAN: a small set whole, a large one in pages.
        let (cursor, items): (String, Vec<String>) = query(&mut c, &["SSCAN", "t", "0"]);
        assert_eq!(cursor, "0");
        assert_eq!(sorted(items), ["b", "c", "d", "e"]);
        let (_, items): (String, Vec<String>) =
            query(&mut c, &["SSCAN", "t", "0", "MATCH", "[bc]"]);
        assert_eq!(sorted(items), ["b", "c"]);
        assert_eq!(error(&mut c, &["SSCAN", "t", "x"]), "ERR invalid cursor");
        assert_eq!(
            error(&mut c, &["SSCAN", "t", "0", "COUNT", "0"]),
            "ERR syntax error"
        );
        let mut sadd = vec!["SADD".to_string(), "big".into()];
        sadd.extend((0..300).map(|i| format!("m{i:03}")));
        let sadd: Vec<&str> = sadd.iter().map(String::as_str).collect();
        assert_eq!(query::<i64>(&mut c, &sadd), 300);
        let mut cursor = "0".to_string();
        let mut seen = Vec::new();
        let mut calls = 0;
        loop {
            let (next, items): (String, Vec<String>) =
                query(&mut c, &["SSCAN", "big", &cursor, "COUNT", "50"]);
            seen.extend(items);
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
    }
}

#[test]
fn sets_keep_to_themselves() {
    let server = TestServer::start();
    let mut c = server.client();
    let _: () = query(&mut c, &["SADD", "s", "m"]);
    let _: () = query(&mut c, &["SET", "str", "x"]);
    let _: () = query(&mut c, &["HSET", "h", "f", "v"]);
    assert_eq!(query::<String>(&mut c, &["TYPE", "s"]), "set");
    for args in [
        &["GET", "s"][..],
        &["HGET", "s", "f"],
        &["SADD", "str", "a"],
        &["SREM", "h", "a"],
        &["SMEMBERS", "str"],
        &["SCARD", "h"],
        &["SISMEMBER", "str", "a"],
        &["SPOP", "str"],
        &["SRANDMEMBER", "h", "2"],
        &["SINTER", "nokey", "str"],
        &["SUNION", "s", "h"],
        &["SDIFF", "s", "str"],
        &["SINTERSTORE", "d", "s", "str"],
        &["SINTERCARD", "2", "s", "str"],
        &["SMOVE", "str", "s", "m"],
        &["SMOVE", "s", "str", "m"],
        &["SSCAN", "h", "0"],
    ] {
        assert_eq!(error(&mut c, args), WRONGTYPE, "{args:?}");
    }
    let (_, sets): (String, Vec<String>) = query(&mut c, &["SCAN", "0", "TYPE", "set"]);
    assert_eq!(sets, ["s"]);
    // A set with a TTL expires whole; RENAME moves it.
    let set = std::time::Instant::now();
    let _: () = query(&mut c, &["EXPIRE", "s", "100"]);
    let _: () = query(&mut c, &["RENAME", "s", "moved"]);
    assert_ttl(&mut c, "moved", 100, set);
    assert_eq!(query::<Vec<String>>(&mut c, &["SMEMBERS", "moved"]), ["m"]);
    let _: () = query(&mut c, &["PEXPIRE", "moved", "1"]);
    std::thread::sleep(std::time::Duration::from_millis(5));
    assert_eq!(query::<i64>(&mut c, &["SCARD", "moved"]), 0);
    assert_eq!(query::<i64>(&mut c, &["SADD", "moved", "n"]), 1);
    assert_eq!(query::<Vec<String>>(&mut c, &["SMEMBERS", "moved"]), ["n"]);
}

/// Clients adding different members to one spread set at once never conflict.
#[test]
fn concurrent_adders_do_not_conflict() {
    const CLIENTS: usize = 4;
    const ROUNDS: i64 = 300;
    // On the worker pool: the poller thread runs one command at a time, so nothing would
    // overlap and the check below could not fail.
    let server = TestServer::with(|c| c.poller = keel_server::lanes::PollerMode::Off);
    let mut c = server.client();
    // More members than a packed set holds: spread, each member a record of its own (a
    // packed set is one value, which adders conflict on until the first conflict spreads
    // it).
    const SEEDED: i64 = 200;
    let mut fill = vec!["SADD".to_string(), "s".to_string()];
    fill.extend((0..SEEDED).map(|i| format!("seed{i}")));
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
                    let _: i64 = query(&mut c, &["SADD", "s", &format!("m{t}:{i}")]);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("client");
    }
    assert_eq!(
        query::<i64>(&mut c, &["SCARD", "s"]),
        SEEDED + (CLIENTS as i64) * ROUNDS
    );
    assert_eq!(conflicts(&mut c), before, "an SADD lost a validation");
}

/// Clients popping one spread set at once, while another adds to it, take every member
/// exactly once, and the set goes with its last member. (The race for the last two members
/// is `cost::spop_of_the_last_two_at_once`: the server queues pops of one hot key, so
/// this one seldom meets it.)
#[test]
fn concurrent_pops_take_each_member_once_and_the_last_takes_the_key() {
    const CLIENTS: usize = 4;
    const ROUNDS: usize = 8;
    const SEEDED: usize = 200;
    const LATE: usize = 50;
    let server = TestServer::with(|c| c.poller = keel_server::lanes::PollerMode::Off);
    let mut c = server.client();
    for round in 0..ROUNDS {
        let mut fill = vec!["SADD".to_string(), "s".to_string()];
        fill.extend((0..SEEDED).map(|i| format!("r{round}:{i}")));
        let fill: Vec<&str> = fill.iter().map(String::as_str).collect();
        let _: i64 = query(&mut c, &fill);
        let adder = {
            let url = server.url(false);
            std::thread::spawn(move || {
                let mut c = crate::connect(&url);
                for i in 0..LATE {
                    let _: i64 = query(&mut c, &["SADD", "s", &format!("r{round}:late{i}")]);
                }
            })
        };
        let poppers: Vec<_> = (0..CLIENTS)
            .map(|_| {
                let url = server.url(false);
                std::thread::spawn(move || {
                    let mut c = crate::connect(&url);
                    let mut popped = Vec::new();
                    let mut empty_in_a_row = 0;
                    // Until the set is empty and stays so a while (the adder may refill it).
                    while empty_in_a_row < 20 {
                        match query::<Option<String>>(&mut c, &["SPOP", "s"]) {
                            Some(m) => {
                                popped.push(m);
                                empty_in_a_row = 0;
                            }
                            None => {
                                empty_in_a_row += 1;
                                std::thread::sleep(std::time::Duration::from_millis(1));
                            }
                        }
                    }
                    popped
                })
            })
            .collect();
        adder.join().expect("adder");
        let mut popped: Vec<String> = poppers
            .into_iter()
            .flat_map(|t| t.join().expect("popper"))
            .collect();
        // Whatever the poppers left (they stop after a quiet spell) is popped here.
        while let Some(m) = query::<Option<String>>(&mut c, &["SPOP", "s"]) {
            popped.push(m);
        }
        let n = popped.len();
        popped.sort();
        popped.dedup();
        assert_eq!(popped.len(), n, "round {round}: a member was popped twice");
        assert_eq!(n, SEEDED + LATE, "round {round}: members lost");
        assert_eq!(query::<i64>(&mut c, &["EXISTS", "s"]), 0, "round {round}");
        assert_eq!(query::<String>(&mut c, &["TYPE", "s"]), "none");
        assert_eq!(query::<i64>(&mut c, &["SCARD", "s"]), 0);
    }
}

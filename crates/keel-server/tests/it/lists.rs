//! Lists through the server: every command's replies in RESP2 and RESP3, `WRONGTYPE`, lists
//! under `WATCH`, `MULTI` and expiry, and the blocking pops: woken by a push from another
//! client, timeouts, many blocked clients served in the order they blocked, pushes inside
//! `MULTI` waking at `EXEC`, `CLIENT UNBLOCK`, and a blocked client that disconnects.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use redis::Value;

use crate::{TestServer, connect, error, info_counter, query};

const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

fn range(c: &mut redis::Connection, key: &str) -> Vec<String> {
    query(c, &["LRANGE", key, "0", "-1"])
}

#[test]
fn list_commands_match_redis() {
    let server = TestServer::start();
    for resp3 in [false, true] {
        let mut c = server.client_proto(resp3);
        let _: () = query(&mut c, &["FLUSHDB"]);
        // Pushes reply with the length.
        assert_eq!(query::<i64>(&mut c, &["RPUSH", "l", "a", "b", "c"]), 3);
        assert_eq!(query::<i64>(&mut c, &["LPUSH", "l", "y", "z"]), 5);
        assert_eq!(range(&mut c, "l"), ["z", "y", "a", "b", "c"]);
        assert_eq!(query::<i64>(&mut c, &["LPUSHX", "l", "x"]), 6);
        assert_eq!(query::<i64>(&mut c, &["RPUSHX", "l", "d", "e"]), 8);
        assert_eq!(query::<i64>(&mut c, &["LPUSHX", "nokey", "x"]), 0);
        assert_eq!(query::<i64>(&mut c, &["RPUSHX", "nokey", "x"]), 0);
        assert_eq!(query::<i64>(&mut c, &["EXISTS", "nokey"]), 0);
        assert_eq!(query::<i64>(&mut c, &["LLEN", "l"]), 8);
        assert_eq!(query::<i64>(&mut c, &["LLEN", "nokey"]), 0);
        assert_eq!(query::<String>(&mut c, &["TYPE", "l"]), "list");
        // LRANGE and LINDEX, with negative and out-of-range indices.
        assert_eq!(
            query::<Vec<String>>(&mut c, &["LRANGE", "l", "1", "2"]),
            ["z", "y"]
        );
        assert_eq!(
            query::<Vec<String>>(&mut c, &["LRANGE", "l", "-2", "100"]),
            ["d", "e"]
        );
        assert!(query::<Vec<String>>(&mut c, &["LRANGE", "l", "5", "2"]).is_empty());
        assert!(query::<Vec<String>>(&mut c, &["LRANGE", "l", "8", "9"]).is_empty());
        assert!(query::<Vec<String>>(&mut c, &["LRANGE", "nokey", "0", "-1"]).is_empty());
        assert_eq!(query::<String>(&mut c, &["LINDEX", "l", "0"]), "x");
        assert_eq!(query::<String>(&mut c, &["LINDEX", "l", "-1"]), "e");
        assert_eq!(query::<Value>(&mut c, &["LINDEX", "l", "8"]), Value::Nil);
        assert_eq!(query::<Value>(&mut c, &["LINDEX", "l", "-9"]), Value::Nil);
        assert_eq!(
            query::<Value>(&mut c, &["LINDEX", "nokey", "x"]),
            Value::Nil
        );
        assert_eq!(
            error(&mut c, &["LINDEX", "l", "x"]),
            "ERR value is not an integer or out of range"
        );
        assert_eq!(
            error(&mut c, &["LRANGE", "l", "0", "x"]),
            "ERR value is not an integer or out of range"
        );
        // LSET.
        let _: () = query(&mut c, &["LSET", "l", "-1", "E"]);
        let _: () = query(&mut c, &["LSET", "l", "0", "X"]);
        assert_eq!(
            error(&mut c, &["LSET", "l", "8", "v"]),
            "ERR index out of range"
        );
        assert_eq!(
            error(&mut c, &["LSET", "nokey", "0", "v"]),
            "ERR no such key"
        );
        assert_eq!(range(&mut c, "l"), ["X", "z", "y", "a", "b", "c", "d", "E"]);
        // Pops, with and without a count.
        assert_eq!(query::<String>(&mut c, &["LPOP", "l"]), "X");
        assert_eq!(query::<String>(&mut c, &["RPOP", "l"]), "E");
        assert_eq!(
            query::<Vec<String>>(&mut c, &["LPOP", "l", "2"]),
            ["z", "y"]
        );
        assert_eq!(
            query::<Vec<String>>(&mut c, &["RPOP", "l", "2"]),
            ["d", "c"]
        );
        assert!(query::<Vec<String>>(&mut c, &["LPOP", "l", "0"]).is_empty());
        assert_eq!(query::<Value>(&mut c, &["LPOP", "nokey"]), Value::Nil);
        assert_eq!(query::<Value>(&mut c, &["LPOP", "nokey", "2"]), Value::Nil);
        assert_eq!(
            error(&mut c, &["LPOP", "l", "-1"]),
            "ERR value is out of range, must be positive"
        );
        assert_eq!(
            error(&mut c, &["LPOP", "l", "1", "2"]),
            "ERR wrong number of arguments for 'lpop' command"
        );
        // Popping the last elements deletes the key.
        assert_eq!(
            query::<Vec<String>>(&mut c, &["RPOP", "l", "10"]),
            ["b", "a"]
        );
        assert_eq!(query::<i64>(&mut c, &["EXISTS", "l"]), 0);
        assert_eq!(query::<String>(&mut c, &["TYPE", "l"]), "none");
        // LINSERT on both sides of the middle.
        let _: () = query(&mut c, &["RPUSH", "i", "1", "2", "3", "4", "5", "6"]);
        assert_eq!(
            query::<i64>(&mut c, &["LINSERT", "i", "BEFORE", "2", "a"]),
            7
        );
        assert_eq!(
            query::<i64>(&mut c, &["LINSERT", "i", "after", "5", "b"]),
            8
        );
        assert_eq!(
            query::<i64>(&mut c, &["LINSERT", "i", "AFTER", "6", "c"]),
            9
        );
        assert_eq!(
            query::<i64>(&mut c, &["LINSERT", "i", "BEFORE", "1", "d"]),
            10
        );
        assert_eq!(
            range(&mut c, "i"),
            ["d", "1", "a", "2", "3", "4", "5", "b", "6", "c"]
        );
        assert_eq!(
            query::<i64>(&mut c, &["LINSERT", "i", "BEFORE", "zz", "a"]),
            -1
        );
        assert_eq!(
            query::<i64>(&mut c, &["LINSERT", "nokey", "BEFORE", "1", "a"]),
            0
        );
        assert_eq!(
            error(&mut c, &["LINSERT", "i", "MIDDLE", "1", "a"]),
            "ERR syntax error"
        );
        assert_eq!(query::<String>(&mut c, &["LINDEX", "i", "7"]), "b");
        assert_eq!(query::<String>(&mut c, &["LINDEX", "i", "-8"]), "a");
        // LREM from the head, from the tail, all.
        let _: () = query(&mut c, &["DEL", "r"]);
        let _: () = query(
            &mut c,
            &["RPUSH", "r", "x", "a", "x", "b", "x", "c", "x", "d", "x"],
        );
        assert_eq!(query::<i64>(&mut c, &["LREM", "r", "2", "x"]), 2);
        assert_eq!(range(&mut c, "r"), ["a", "b", "x", "c", "x", "d", "x"]);
        assert_eq!(query::<i64>(&mut c, &["LREM", "r", "-1", "x"]), 1);
        assert_eq!(range(&mut c, "r"), ["a", "b", "x", "c", "x", "d"]);
        assert_eq!(query::<i64>(&mut c, &["LREM", "r", "0", "x"]), 2);
        assert_eq!(range(&mut c, "r"), ["a", "b", "c", "d"]);
        assert_eq!(query::<i64>(&mut c, &["LREM", "r", "0", "zz"]), 0);
        assert_eq!(query::<i64>(&mut c, &["LREM", "nokey", "0", "x"]), 0);
        assert_eq!(query::<String>(&mut c, &["LINDEX", "r", "-1"]), "d");
        assert_eq!(query::<i64>(&mut c, &["LLEN", "r"]), 4);
        let _: () = query(&mut c, &["RPUSH", "same", "v", "v"]);
        assert_eq!(query::<i64>(&mut c, &["LREM", "same", "0", "v"]), 2);
        assert_eq!(query::<i64>(&mut c, &["EXISTS", "same"]), 0);
        // LTRIM.
        let _: () = query(&mut c, &["LTRIM", "r", "1", "-2"]);
        assert_eq!(range(&mut c, "r"), ["b", "c"]);
        assert_eq!(query::<i64>(&mut c, &["LLEN", "r"]), 2);
        let _: () = query(&mut c, &["LTRIM", "r", "5", "10"]);
        assert_eq!(query::<i64>(&mut c, &["EXISTS", "r"]), 0);
        let _: () = query(&mut c, &["LTRIM", "nokey", "0", "1"]);
        // LPOS.
        let _: () = query(
            &mut c,
            &["RPUSH", "p", "a", "b", "c", "1", "2", "3", "c", "c"],
        );
        assert_eq!(query::<i64>(&mut c, &["LPOS", "p", "c"]), 2);
        assert_eq!(query::<i64>(&mut c, &["LPOS", "p", "c", "RANK", "2"]), 6);
        assert_eq!(query::<i64>(&mut c, &["LPOS", "p", "c", "RANK", "-1"]), 7);
        assert_eq!(
            query::<Vec<i64>>(&mut c, &["LPOS", "p", "c", "COUNT", "0"]),
            [2, 6, 7]
        );
        assert_eq!(
            query::<Vec<i64>>(&mut c, &["LPOS", "p", "c", "RANK", "-1", "COUNT", "2"]),
            [7, 6]
        );
        assert_eq!(
            query::<Vec<i64>>(&mut c, &["LPOS", "p", "c", "COUNT", "0", "MAXLEN", "7"]),
            [2, 6]
        );
        assert_eq!(query::<Value>(&mut c, &["LPOS", "p", "zz"]), Value::Nil);
        assert!(query::<Vec<i64>>(&mut c, &["LPOS", "nokey", "a", "COUNT", "1"]).is_empty());
        assert_eq!(
            error(&mut c, &["LPOS", "p", "c", "RANK", "0"]),
            "ERR RANK can't be zero: use 1 to start from the first match, 2 from the second \
             ... or use negative to start from the end of the list"
        );
        assert_eq!(
            error(&mut c, &["LPOS", "p", "c", "COUNT", "-1"]),
            "ERR COUNT can't be negative"
        );
        assert_eq!(
            error(&mut c, &["LPOS", "p", "c", "MAXLEN", "-1"]),
            "ERR MAXLEN can't be negative"
        );
        assert_eq!(
            error(&mut c, &["LPOS", "p", "c", "RANK"]),
            "ERR syntax error"
        );
        // LMOVE and RPOPLPUSH, also onto the same list.
        let _: () = query(&mut c, &["DEL", "src", "dst"]);
        let _: () = query(&mut c, &["RPUSH", "src", "1", "2", "3"]);
        assert_eq!(
            query::<String>(&mut c, &["LMOVE", "src", "dst", "LEFT", "RIGHT"]),
            "1"
        );
        assert_eq!(query::<String>(&mut c, &["RPOPLPUSH", "src", "dst"]), "3");
        assert_eq!(range(&mut c, "dst"), ["3", "1"]);
        assert_eq!(
            query::<String>(&mut c, &["LMOVE", "dst", "dst", "right", "left"]),
            "1"
        );
        assert_eq!(range(&mut c, "dst"), ["1", "3"]);
        assert_eq!(
            query::<String>(&mut c, &["LMOVE", "src", "src", "LEFT", "RIGHT"]),
            "2"
        );
        assert_eq!(range(&mut c, "src"), ["2"]);
        assert_eq!(
            query::<String>(&mut c, &["LMOVE", "src", "dst", "LEFT", "LEFT"]),
            "2"
        );
        assert_eq!(query::<i64>(&mut c, &["EXISTS", "src"]), 0);
        assert_eq!(
            query::<Value>(&mut c, &["LMOVE", "src", "dst", "LEFT", "LEFT"]),
            Value::Nil
        );
        assert_eq!(
            error(&mut c, &["LMOVE", "dst", "src", "UP", "LEFT"]),
            "ERR syntax error"
        );
        // WRONGTYPE both ways; LMOVE checks the destination before it pops.
        let _: () = query(&mut c, &["SET", "s", "v"]);
        let _: () = query(&mut c, &["HSET", "h", "f", "v"]);
        for args in [
            &["LPUSH", "s", "a"][..],
            &["RPUSHX", "h", "a"],
            &["LPOP", "s"],
            &["LLEN", "h"],
            &["LRANGE", "s", "0", "1"],
            &["LINDEX", "s", "0"],
            &["LSET", "s", "0", "a"],
            &["LREM", "s", "0", "a"],
            &["LTRIM", "s", "0", "1"],
            &["LINSERT", "s", "BEFORE", "a", "b"],
            &["LPOS", "s", "a"],
            &["LMOVE", "s", "dst", "LEFT", "LEFT"],
            &["LMOVE", "dst", "s", "LEFT", "LEFT"],
            &["RPOPLPUSH", "dst", "h"],
            &["BLPOP", "nokey", "s", "0"],
            &["GET", "dst"],
            &["HGET", "dst", "f"],
        ] {
            assert_eq!(error(&mut c, args), WRONGTYPE, "{args:?}");
        }
        assert_eq!(range(&mut c, "dst"), ["2", "1", "3"]);
        // Overwritten and deleted lists.
        let _: () = query(&mut c, &["SET", "dst", "v"]);
        assert_eq!(query::<String>(&mut c, &["GET", "dst"]), "v");
        let _: () = query(&mut c, &["RPUSH", "gone", "a", "b"]);
        assert_eq!(query::<i64>(&mut c, &["DEL", "gone"]), 1);
        assert_eq!(query::<i64>(&mut c, &["RPUSH", "gone", "c"]), 1);
        assert_eq!(range(&mut c, "gone"), ["c"]);
        let _: () = query(&mut c, &["RENAME", "gone", "moved"]);
        assert_eq!(range(&mut c, "moved"), ["c"]);
        // LMPOP: the first of its keys that is a list.
        let _: () = query(&mut c, &["RPUSH", "mp", "a", "b", "c"]);
        let popped: Value = query(
            &mut c,
            &["LMPOP", "2", "nokey", "mp", "RIGHT", "COUNT", "2"],
        );
        assert_eq!(
            popped,
            Value::Array(vec![
                Value::BulkString(b"mp".to_vec()),
                Value::Array(vec![
                    Value::BulkString(b"c".to_vec()),
                    Value::BulkString(b"b".to_vec())
                ]),
            ])
        );
        let popped: Value = query(&mut c, &["LMPOP", "1", "mp", "left", "COUNT", "5"]);
        assert_eq!(
            popped,
            Value::Array(vec![
                Value::BulkString(b"mp".to_vec()),
                Value::Array(vec![Value::BulkString(b"a".to_vec())]),
            ])
        );
        assert_eq!(query::<i64>(&mut c, &["EXISTS", "mp"]), 0);
        assert_eq!(
            query::<Value>(&mut c, &["LMPOP", "1", "mp", "LEFT"]),
            Value::Nil
        );
        assert_eq!(
            error(&mut c, &["LMPOP", "0", "mp", "LEFT"]),
            "ERR numkeys should be greater than 0"
        );
        assert_eq!(
            error(&mut c, &["LMPOP", "2", "mp", "LEFT"]),
            "ERR syntax error"
        );
        assert_eq!(
            error(&mut c, &["LMPOP", "1", "mp", "LEFT", "COUNT", "0"]),
            "ERR count should be greater than 0"
        );
        assert_eq!(
            error(
                &mut c,
                &["LMPOP", "1", "mp", "LEFT", "COUNT", "1", "COUNT", "1"]
            ),
            "ERR syntax error"
        );
        assert_eq!(error(&mut c, &["LMPOP", "1", "s", "LEFT"]), WRONGTYPE);
        assert_eq!(
            error(&mut c, &["BLMPOP", "x", "1", "mp", "LEFT"]),
            "ERR timeout is not a float or out of range"
        );
        assert_eq!(
            query::<Value>(&mut c, &["BLMPOP", "0.01", "1", "mp", "LEFT"]),
            Value::Nil
        );
        // Blocking pops that need not block, and the arity/timeout errors.
        let _: () = query(&mut c, &["RPUSH", "bl", "1", "2", "3"]);
        assert_eq!(
            query::<Vec<String>>(&mut c, &["BLPOP", "nokey", "bl", "0"]),
            ["bl", "1"]
        );
        assert_eq!(
            query::<Vec<String>>(&mut c, &["BRPOP", "bl", "0"]),
            ["bl", "3"]
        );
        assert_eq!(
            query::<String>(&mut c, &["BLMOVE", "bl", "bl2", "LEFT", "RIGHT", "0"]),
            "2"
        );
        assert_eq!(
            query::<String>(&mut c, &["BRPOPLPUSH", "bl2", "bl", "0"]),
            "2"
        );
        assert_eq!(
            error(&mut c, &["BLPOP", "bl", "x"]),
            "ERR timeout is not a float or out of range"
        );
        assert_eq!(
            error(&mut c, &["BLPOP", "bl", "-1"]),
            "ERR timeout is negative"
        );
        assert_eq!(
            error(&mut c, &["BLPOP", "bl"]),
            "ERR wrong number of arguments for 'blpop' command"
        );
        assert_eq!(
            error(&mut c, &["BLMOVE", "bl", "x", "LEFT", "UP", "0"]),
            "ERR syntax error"
        );
    }
}

#[test]
fn lists_in_transactions_and_with_ttls() {
    let server = TestServer::start();
    let mut c = server.client();
    let mut other = server.client();
    // Inside MULTI the blocking pops do not block: nil at once.
    let _: () = query(&mut c, &["MULTI"]);
    let _: () = query(&mut c, &["BLPOP", "q", "0"]);
    let _: () = query(&mut c, &["BRPOPLPUSH", "q", "q2", "0"]);
    let _: () = query(&mut c, &["RPUSH", "q", "a", "b"]);
    let _: () = query(&mut c, &["BLMOVE", "q", "q2", "LEFT", "LEFT", "0"]);
    let _: () = query(&mut c, &["LLEN", "q"]);
    let replies: Value = query(&mut c, &["EXEC"]);
    assert_eq!(
        replies,
        Value::Array(vec![
            Value::Nil,
            Value::Nil,
            Value::Int(2),
            Value::BulkString(b"a".to_vec()),
            Value::Int(1),
        ])
    );
    // WATCH sees pushes, pops and LSET of another client.
    for write in [
        &["RPUSH", "q", "x"][..],
        &["LPOP", "q"],
        &["LSET", "q", "0", "y"],
    ] {
        let _: () = query(&mut c, &["WATCH", "q"]);
        let _: () = query(&mut other, write);
        let _: () = query(&mut c, &["MULTI"]);
        let _: () = query(&mut c, &["LLEN", "q"]);
        assert_eq!(query::<Value>(&mut c, &["EXEC"]), Value::Nil, "{write:?}");
    }
    // ... and a list's only element moved onto itself, which writes it back in place, an
    // element far from both ends overwritten, and an LTRIM that trims nothing (a write to
    // Redis all the same).
    let _: () = query(&mut c, &["RPUSH", "one", "only"]);
    let mut args = vec!["RPUSH".to_string(), "long".into()];
    args.extend((0..2000).map(|i| i.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_eq!(query::<i64>(&mut c, &args), 2000);
    for (key, write) in [
        ("one", &["LMOVE", "one", "one", "LEFT", "RIGHT"][..]),
        ("one", &["RPOPLPUSH", "one", "one"]),
        ("long", &["LSET", "long", "1500", "x"]),
        ("long", &["LTRIM", "long", "0", "-1"]),
    ] {
        assert!(
            !crate::exec_survives(&mut c, &mut other, key, write),
            "{write:?}"
        );
    }
    // A list with a TTL expires whole; one emptied by pops loses its TTL with it.
    let _: () = query(&mut c, &["DEL", "t"]);
    let _: () = query(&mut c, &["RPUSH", "t", "a", "b", "c"]);
    // A TTL long enough that a loaded machine cannot reach it before the push, then a short
    // one to see the list expire.
    let _: () = query(&mut c, &["PEXPIRE", "t", "100000"]);
    assert!(query::<i64>(&mut c, &["PTTL", "t"]) > 0);
    assert_eq!(query::<i64>(&mut c, &["RPUSH", "t", "d"]), 4);
    assert!(
        query::<i64>(&mut c, &["PTTL", "t"]) > 0,
        "a push keeps the TTL"
    );
    let _: () = query(&mut c, &["PEXPIRE", "t", "100"]);
    std::thread::sleep(Duration::from_millis(150));
    assert_eq!(query::<i64>(&mut c, &["LLEN", "t"]), 0);
    assert_eq!(query::<i64>(&mut c, &["RPUSH", "t", "new"]), 1);
    assert_eq!(query::<i64>(&mut c, &["PTTL", "t"]), -1);
    let _: () = query(&mut c, &["EXPIRE", "t", "100"]);
    let _: () = query(&mut c, &["LPOP", "t"]);
    assert_eq!(query::<i64>(&mut c, &["RPUSH", "t", "again"]), 1);
    assert_eq!(query::<i64>(&mut c, &["TTL", "t"]), -1);
    // A dropped list's records are swept: its chunks of 16 elements and its two ends.
    let mut args = vec!["RPUSH".to_string(), "big".into()];
    args.extend((0..200).map(|i| i.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_eq!(query::<i64>(&mut c, &args), 200);
    let swept = |c: &mut redis::Connection| {
        let info: String = query(c, &["INFO", "stats"]);
        info_counter(&info, "keel_swept_keys")
    };
    let before = swept(&mut c);
    assert_eq!(query::<i64>(&mut c, &["DEL", "big"]), 1);
    let start = Instant::now();
    while swept(&mut c) < before + 200usize.div_ceil(16) as u64 + 2 {
        assert!(start.elapsed() < Duration::from_secs(10), "not swept");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `args` on a fresh connection in a thread; the reply and how long it took.
pub fn spawn_query(
    url: String,
    args: Vec<&'static str>,
) -> std::thread::JoinHandle<(Value, Duration)> {
    std::thread::spawn(move || {
        let mut c = connect(&url);
        let start = Instant::now();
        let v: Value = query(&mut c, &args);
        (v, start.elapsed())
    })
}

pub fn blocked_clients(c: &mut redis::Connection) -> u64 {
    let info: String = query(c, &["INFO", "clients"]);
    info_counter(&info, "blocked_clients")
}

/// Waits until `n` clients are blocked.
pub fn wait_blocked(c: &mut redis::Connection, n: u64) {
    let start = Instant::now();
    while blocked_clients(c) != n {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{} blocked, not {n}",
            blocked_clients(c)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn bulk(s: &str) -> Value {
    Value::BulkString(s.as_bytes().to_vec())
}

#[test]
fn blocked_pops_wake_on_push_and_time_out() {
    let server = TestServer::start();
    let url = server.url(false);
    let mut c = server.client();
    // Woken by a push from another client.
    let waiter = spawn_query(url.clone(), vec!["BLPOP", "k1", "k2", "0"]);
    wait_blocked(&mut c, 1);
    assert_eq!(query::<i64>(&mut c, &["RPUSH", "k2", "v"]), 1);
    let (reply, _) = waiter.join().expect("waiter");
    assert_eq!(reply, Value::Array(vec![bulk("k2"), bulk("v")]));
    assert_eq!(query::<i64>(&mut c, &["EXISTS", "k2"]), 0);
    assert_eq!(blocked_clients(&mut c), 0);
    // BLMOVE woken by an LMOVE into its source; the element lands in its destination.
    let waiter = spawn_query(
        url.clone(),
        vec!["BLMOVE", "src", "dst", "RIGHT", "LEFT", "0"],
    );
    wait_blocked(&mut c, 1);
    let _: () = query(&mut c, &["RPUSH", "elsewhere", "e"]);
    let _: () = query(&mut c, &["LMOVE", "elsewhere", "src", "LEFT", "LEFT"]);
    let (reply, _) = waiter.join().expect("waiter");
    assert_eq!(reply, bulk("e"));
    assert_eq!(range(&mut c, "dst"), ["e"]);
    // BLMPOP woken by a push of several elements takes up to its count.
    let waiter = spawn_query(
        url.clone(),
        vec!["BLMPOP", "0", "2", "m1", "m2", "LEFT", "COUNT", "2"],
    );
    wait_blocked(&mut c, 1);
    assert_eq!(query::<i64>(&mut c, &["RPUSH", "m2", "a", "b", "c"]), 3);
    let (reply, _) = waiter.join().expect("waiter");
    assert_eq!(
        reply,
        Value::Array(vec![bulk("m2"), Value::Array(vec![bulk("a"), bulk("b")])])
    );
    assert_eq!(range(&mut c, "m2"), ["c"]);
    // COPY and RENAMENX of a list into the key a client waits on wake it.
    let _: i64 = query(&mut c, &["RPUSH", "orig", "x", "y"]);
    for (verb, expect) in [("COPY", "x"), ("RENAMENX", "x")] {
        let waiter = spawn_query(url.clone(), vec!["BLPOP", "cp", "0"]);
        wait_blocked(&mut c, 1);
        assert_eq!(query::<i64>(&mut c, &[verb, "orig", "cp"]), 1, "{verb}");
        let (reply, _) = waiter.join().expect("waiter");
        assert_eq!(
            reply,
            Value::Array(vec![bulk("cp"), bulk(expect)]),
            "{verb}"
        );
        let _: i64 = query(&mut c, &["DEL", "cp"]);
    }
    assert_eq!(query::<i64>(&mut c, &["EXISTS", "orig"]), 0, "renamed");
    // So do `SORT … STORE` and `KEEL.RESTORE` (how a command across nodes writes its
    // destination on that node), which make the key a list (before: it waited on, and these
    // waits' timeouts ended in nil).
    let _: i64 = query(&mut c, &["RPUSH", "unsorted", "3", "1", "2"]);
    let waiter = spawn_query(url.clone(), vec!["BLPOP", "sorted", "10"]);
    wait_blocked(&mut c, 1);
    let _: i64 = query(
        &mut c,
        &["SORT", "unsorted", "LIMIT", "0", "2", "STORE", "sorted"],
    );
    assert_eq!(
        waiter.join().expect("waiter").0,
        Value::Array(vec![bulk("sorted"), bulk("1")])
    );
    let dump: Vec<u8> = redis::cmd("KEEL.DUMP")
        .arg("unsorted")
        .query(&mut c)
        .expect("KEEL.DUMP");
    let waiter = spawn_query(url.clone(), vec!["BRPOP", "restored", "10"]);
    wait_blocked(&mut c, 1);
    let _: () = redis::cmd("KEEL.RESTORE")
        .arg("restored")
        .arg(dump)
        .query(&mut c)
        .expect("KEEL.RESTORE");
    assert_eq!(
        waiter.join().expect("waiter").0,
        Value::Array(vec![bulk("restored"), bulk("2")])
    );
    // A key written whole wakes the first client of the kind it now holds, even behind one
    // waiting for the other kind, which waits on (as in Redis: no WRONGTYPE for it).
    let list_waiter = spawn_query(url.clone(), vec!["BLPOP", "mixed", "10"]);
    wait_blocked(&mut c, 1);
    let zset_waiter = spawn_query(url.clone(), vec!["BZPOPMIN", "mixed", "10"]);
    wait_blocked(&mut c, 2);
    let _: i64 = query(&mut c, &["ZADD", "zorig", "1", "m", "2", "n"]);
    assert_eq!(query::<i64>(&mut c, &["COPY", "zorig", "mixed"]), 1);
    assert_eq!(
        zset_waiter.join().expect("zset waiter").0,
        Value::Array(vec![bulk("mixed"), bulk("m"), bulk("1")])
    );
    wait_blocked(&mut c, 1);
    assert_eq!(query::<i64>(&mut c, &["DEL", "mixed"]), 1);
    assert_eq!(query::<i64>(&mut c, &["RPUSH", "mixed", "l"]), 1);
    assert_eq!(
        list_waiter.join().expect("list waiter").0,
        Value::Array(vec![bulk("mixed"), bulk("l")])
    );
    // Timeouts: a float number of seconds; nil (a null array for BLPOP/BRPOP).
    let waiter = spawn_query(url.clone(), vec!["BRPOP", "none", "0.2"]);
    let (reply, took) = waiter.join().expect("waiter");
    assert_eq!(reply, Value::Nil);
    assert!(took >= Duration::from_millis(200), "{took:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    let waiter = spawn_query(url.clone(), vec!["BRPOPLPUSH", "none", "d", "0.05"]);
    assert_eq!(waiter.join().expect("waiter").0, Value::Nil);
    // RESP3: the timeout is a null too.
    let mut c3 = server.client_proto(true);
    assert_eq!(
        query::<Value>(&mut c3, &["BLPOP", "none", "0.01"]),
        Value::Nil
    );
    // A push inside MULTI wakes the client at EXEC, not before.
    let waiter = spawn_query(url.clone(), vec!["BLPOP", "m", "0"]);
    wait_blocked(&mut c, 1);
    let _: () = query(&mut c, &["MULTI"]);
    let _: () = query(&mut c, &["RPUSH", "m", "1", "2"]);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        blocked_clients(&mut server.client()),
        1,
        "still blocked before EXEC"
    );
    let _: Value = query(&mut c, &["EXEC"]);
    let (reply, _) = waiter.join().expect("waiter");
    assert_eq!(reply, Value::Array(vec![bulk("m"), bulk("1")]));
    assert_eq!(range(&mut c, "m"), ["2"]);
    // A pipelined push wakes it too.
    let waiter = spawn_query(url.clone(), vec!["BRPOP", "p", "0"]);
    wait_blocked(&mut c, 1);
    let _: ((), i64) = redis::pipe()
        .cmd("SET")
        .arg("x")
        .arg("1")
        .cmd("LPUSH")
        .arg("p")
        .arg("v")
        .query(&mut c)
        .expect("pipeline");
    assert_eq!(
        waiter.join().expect("waiter").0,
        Value::Array(vec![bulk("p"), bulk("v")])
    );
}

#[test]
fn blocked_clients_are_served_in_order() {
    let server = TestServer::start();
    let url = server.url(false);
    let mut c = server.client();
    let mut waiters = Vec::new();
    for i in 0..5 {
        waiters.push(spawn_query(url.clone(), vec!["BLPOP", "q", "0"]));
        wait_blocked(&mut c, i + 1);
    }
    // One push of five elements and single pushes alike reach them in the order they blocked.
    assert_eq!(query::<i64>(&mut c, &["RPUSH", "q", "a", "b", "c"]), 3);
    let _: () = query(&mut c, &["RPUSH", "q", "d"]);
    let _: () = query(&mut c, &["RPUSH", "q", "e"]);
    for (w, expected) in waiters.into_iter().zip(["a", "b", "c", "d", "e"]) {
        let (reply, _) = w.join().expect("waiter");
        assert_eq!(reply, Value::Array(vec![bulk("q"), bulk(expected)]));
    }
    assert_eq!(query::<i64>(&mut c, &["EXISTS", "q"]), 0);
    assert_eq!(blocked_clients(&mut c), 0);
}

#[test]
fn blocked_clients_unblock_and_disconnect() {
    let server = TestServer::start();
    let url = server.url(false);
    let mut c = server.client();
    // CLIENT UNBLOCK: as a timeout, or with an error.
    let (id_tx, id_rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn({
        let url = url.clone();
        move || {
            let mut w = connect(&url);
            let id: i64 = query(&mut w, &["CLIENT", "ID"]);
            id_tx.send(id).expect("send id");
            let reply: Value = query(&mut w, &["BLPOP", "u", "0"]);
            reply
        }
    });
    let id = id_rx.recv().expect("the waiter's id");
    wait_blocked(&mut c, 1);
    let list: String = query(&mut c, &["CLIENT", "LIST"]);
    let flags: Vec<&str> = list
        .lines()
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("flags=")))
        .collect();
    assert_eq!(flags.iter().filter(|f| **f == "b").count(), 1, "{list}");
    assert_eq!(
        query::<i64>(&mut c, &["CLIENT", "UNBLOCK", &id.to_string()]),
        1
    );
    let reply = waiter.join().expect("waiter");
    assert_eq!(reply, Value::Nil);
    assert_eq!(query::<i64>(&mut c, &["CLIENT", "UNBLOCK", "99999"]), 0);
    assert_eq!(
        error(&mut c, &["CLIENT", "UNBLOCK", "1", "LATER"]),
        "ERR CLIENT UNBLOCK reason should be TIMEOUT or ERROR"
    );
    let mut raw = server.raw();
    raw.write_all(b"CLIENT ID\r\nBLPOP u 0\r\n").expect("write");
    let mut buf = [0u8; 64];
    let n = raw.read(&mut buf).expect("read id");
    let id = String::from_utf8_lossy(&buf[1..n]).trim().to_string();
    wait_blocked(&mut c, 1);
    assert_eq!(
        query::<i64>(&mut c, &["CLIENT", "UNBLOCK", &id, "ERROR"]),
        1
    );
    let n = raw.read(&mut buf).expect("read error");
    assert_eq!(
        &buf[..n],
        b"-UNBLOCKED client unblocked via CLIENT UNBLOCK\r\n"
    );
    // A blocked client that disconnects leaves the registry, and a push is not lost on it.
    raw.write_all(b"BLPOP gone 0\r\n").expect("write");
    wait_blocked(&mut c, 1);
    drop(raw);
    wait_blocked(&mut c, 0);
    assert_eq!(query::<i64>(&mut c, &["RPUSH", "gone", "v"]), 1);
    assert_eq!(range(&mut c, "gone"), ["v"]);
    // A pipelined command after a blocking pop runs once the pop is served.
    let mut raw = server.raw();
    raw.write_all(b"BLPOP piped 0\r\nPING\r\n").expect("write");
    wait_blocked(&mut c, 1);
    let _: () = query(&mut c, &["RPUSH", "piped", "v"]);
    let expected = b"*2\r\n$5\r\npiped\r\n$1\r\nv\r\n+PONG\r\n";
    let got = crate::exchange(&mut raw, b"", expected.len());
    assert_eq!(got, expected);
}

#[test]
fn a_queue_under_concurrent_producers_and_consumers_loses_nothing() {
    const PRODUCERS: usize = 4;
    const CONSUMERS: usize = 4;
    const EACH: usize = 150;
    let server = TestServer::start();
    let url = server.url(false);
    let taken = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let consumers: Vec<_> = (0..CONSUMERS)
        .map(|n| {
            let url = url.clone();
            let taken = taken.clone();
            std::thread::spawn(move || {
                let mut c = connect(&url);
                let mut got = Vec::new();
                while taken.load(std::sync::atomic::Ordering::SeqCst) < PRODUCERS * EACH {
                    // Blocking pops and plain pops, from both ends of the work.
                    let item: Option<String> = if n % 2 == 0 {
                        let reply: Option<(String, String)> =
                            query(&mut c, &["BLPOP", "q", "0.05"]);
                        reply.map(|(_, v)| v)
                    } else {
                        query(&mut c, &["LPOP", "q"])
                    };
                    if let Some(v) = item {
                        taken.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        got.push(v);
                    }
                }
                got
            })
        })
        .collect();
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let url = url.clone();
            std::thread::spawn(move || {
                let mut c = connect(&url);
                for j in (0..EACH).step_by(3) {
                    let items: Vec<String> = (j..(j + 3).min(EACH))
                        .map(|j| format!("{p}-{j:04}"))
                        .collect();
                    let mut args = vec!["RPUSH", "q"];
                    args.extend(items.iter().map(String::as_str));
                    let _: i64 = query(&mut c, &args);
                }
            })
        })
        .collect();
    for p in producers {
        p.join().expect("producer");
    }
    let mut all = Vec::new();
    for c in consumers {
        let got = c.join().expect("consumer");
        // One consumer sees each producer's items in the order they were pushed.
        for p in 0..PRODUCERS {
            let mine: Vec<&String> = got
                .iter()
                .filter(|v| v.starts_with(&format!("{p}-")))
                .collect();
            assert!(mine.windows(2).all(|w| w[0] < w[1]), "{mine:?}");
        }
        all.extend(got);
    }
    all.sort();
    let expected: Vec<String> = (0..PRODUCERS)
        .flat_map(|p| (0..EACH).map(move |j| format!("{p}-{j:04}")))
        .collect();
    assert_eq!(all, expected, "every item popped exactly once");
    let mut c = server.client();
    assert_eq!(query::<i64>(&mut c, &["EXISTS", "q"]), 0);
}

/// One thread of [`lists_stay_strictly_serializable_while_keys_expire`]: each transaction is
/// one `MULTI … EXEC` that reads some lists whole (`LRANGE`) and appends to some (`RPUSH`).
fn list_client(
    url: &str,
    thread: u64,
    tick: &std::sync::atomic::AtomicU64,
) -> Vec<crate::history::TxnRecord> {
    use crate::history::{Elem, Key, Op, Outcome, TxnRecord};
    use std::sync::atomic::Ordering;
    const KEYS: u64 = 6;
    let mut c = connect(url);
    let mut next = crate::types_history::rng(thread);
    // Elements are unique across the history: the thread in the high bits.
    let mut elem: Elem = thread << 40;
    let mut history = Vec::new();
    for i in 0..250 {
        let n = 1 + next() % 3;
        let mut keys: Vec<Key> = (0..n).map(|_| (next() % KEYS) as Key).collect();
        keys.sort_unstable();
        keys.dedup();
        let mut pipe = redis::pipe();
        pipe.atomic();
        let mut plan = Vec::new();
        for &k in &keys {
            let list = format!("hl:{k}");
            pipe.cmd("LRANGE").arg(&list).arg(0).arg(-1);
            let append = (!next().is_multiple_of(3)).then(|| {
                elem += 1;
                elem
            });
            if let Some(e) = append {
                pipe.cmd("RPUSH").arg(&list).arg(e.to_string());
            }
            plan.push((k, append));
        }
        let began = tick.fetch_add(1, Ordering::SeqCst);
        let replies: Result<Vec<Value>, _> = pipe.query(&mut c);
        let ended = tick.fetch_add(1, Ordering::SeqCst);
        let mut ops = Vec::new();
        let outcome = match replies {
            Ok(replies) => {
                let mut replies = replies.into_iter();
                for (k, append) in plan {
                    let read: Vec<String> =
                        redis::from_redis_value(replies.next().expect("an LRANGE reply"))
                            .expect("LRANGE gives strings");
                    let value = read
                        .iter()
                        .map(|v| v.parse().expect("an element"))
                        .collect();
                    ops.push(Op::Read { key: k, value });
                    if let Some(e) = append {
                        let _ = replies.next().expect("an RPUSH reply");
                        ops.push(Op::Append { key: k, elem: e });
                    }
                }
                Outcome::Committed
            }
            // keel gave up on a transaction that kept conflicting: nothing of it committed.
            Err(e) if e.to_string().contains("conflicting attempts") => Outcome::Aborted,
            Err(e) => panic!("EXEC failed: {e}"),
        };
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
fn lists_stay_strictly_serializable_while_keys_expire() {
    use crate::history::Op;
    let server = TestServer::start();
    let noise = |c: &mut redis::Connection, n: u64| {
        let l = format!("hl:{}", n % 6);
        // A TTL far ahead and gone again: the lists must not notice.
        let _: i64 = query(c, &["PEXPIRE", &l, "600000"]);
        let _: i64 = query(c, &["PERSIST", &l]);
        let ttl = (1 + n % 10).to_string();
        let tmp = format!("tmpl:{n}");
        let _: i64 = query(c, &["RPUSH", &tmp, "a", "b"]);
        let _: i64 = query(c, &["PEXPIRE", &tmp, &ttl]);
    };
    let last = |c: &mut redis::Connection| {
        (0..6)
            .map(|k| Op::Read {
                key: k,
                value: range(c, &format!("hl:{k}"))
                    .iter()
                    .map(|v| v.parse().expect("an element"))
                    .collect(),
            })
            .collect()
    };
    let report = crate::types_history::run_checked(&server, list_client, noise, last);
    assert!(report.committed > 300, "enough commits: {report:?}");
    assert!(report.list_len_max > 20, "lists grew: {report:?}");
}

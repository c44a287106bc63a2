//! String and key commands, over RESP2 and RESP3.

use redis::Value;

use crate::{TestServer, error, query};

#[test]
fn strings_resp2_and_resp3() {
    let server = TestServer::start();
    for resp3 in [false, true] {
        let mut c = server.client_proto(resp3);
        let k = if resp3 { "r3" } else { "r2" };
        let _: () = query(&mut c, &["FLUSHDB"]);
        assert_eq!(query::<String>(&mut c, &["PING"]), "PONG");
        assert_eq!(query::<String>(&mut c, &["ECHO", "hi"]), "hi");
        assert_eq!(query::<Option<String>>(&mut c, &["GET", k]), None);
        assert_eq!(query::<Value>(&mut c, &["GET", k]), Value::Nil);
        assert_eq!(query::<String>(&mut c, &["SET", k, "v1"]), "OK");
        assert_eq!(query::<String>(&mut c, &["GET", k]), "v1");
        // NX / XX / GET.
        assert_eq!(
            query::<Option<String>>(&mut c, &["SET", k, "x", "NX"]),
            None
        );
        assert_eq!(query::<String>(&mut c, &["SET", k, "v2", "XX"]), "OK");
        assert_eq!(
            query::<Option<String>>(&mut c, &["SET", "absent", "x", "XX"]),
            None
        );
        assert_eq!(
            query::<Option<String>>(&mut c, &["SET", k, "v3", "GET"]),
            Some("v2".into())
        );
        assert_eq!(
            query::<Option<String>>(&mut c, &["SET", "n1", "a", "NX", "GET"]),
            None
        );
        assert_eq!(query::<String>(&mut c, &["GET", "n1"]), "a");
        assert_eq!(
            error(&mut c, &["SET", k, "v", "NX", "XX"]),
            "ERR syntax error"
        );
        assert_eq!(error(&mut c, &["SET", k, "v", "BOGUS"]), "ERR syntax error");
        assert_eq!(
            error(&mut c, &["SET", k, "v", "EX", "0"]),
            "ERR invalid expire time in 'set' command"
        );
        assert_eq!(query::<String>(&mut c, &["GET", k]), "v3");
        // MSET / MGET.
        assert_eq!(query::<String>(&mut c, &["MSET", "a", "1", "b", "2"]), "OK");
        assert_eq!(
            query::<Vec<Option<String>>>(&mut c, &["MGET", "a", "nope", "b"]),
            vec![Some("1".into()), None, Some("2".into())]
        );
        assert_eq!(
            error(&mut c, &["MSET", "a", "1", "b"]),
            "ERR wrong number of arguments for 'mset' command"
        );
        // Counters.
        assert_eq!(query::<i64>(&mut c, &["INCR", "ctr"]), 1);
        assert_eq!(query::<i64>(&mut c, &["INCRBY", "ctr", "10"]), 11);
        assert_eq!(query::<i64>(&mut c, &["DECR", "ctr"]), 10);
        assert_eq!(query::<i64>(&mut c, &["DECRBY", "ctr", "-5"]), 15);
        assert_eq!(
            error(&mut c, &["INCR", k]),
            "ERR value is not an integer or out of range"
        );
        assert_eq!(
            error(&mut c, &["INCRBY", "ctr", "1.5"]),
            "ERR value is not an integer or out of range"
        );
        let _: () = query(&mut c, &["SET", "big", "9223372036854775807"]);
        assert_eq!(
            error(&mut c, &["INCR", "big"]),
            "ERR increment or decrement would overflow"
        );
        assert_eq!(
            error(&mut c, &["DECRBY", "big", "-9223372036854775808"]),
            "ERR decrement would overflow"
        );
        // DEL / EXISTS / UNLINK.
        assert_eq!(query::<i64>(&mut c, &["EXISTS", "a", "a", "nope"]), 2);
        assert_eq!(query::<i64>(&mut c, &["DEL", "a", "nope"]), 1);
        assert_eq!(query::<i64>(&mut c, &["UNLINK", "b", "a"]), 1);
        assert_eq!(query::<i64>(&mut c, &["EXISTS", "a", "b"]), 0);
    }
}

#[test]
fn more_string_commands() {
    let server = TestServer::start();
    let mut c = server.client();
    assert_eq!(query::<i64>(&mut c, &["SETNX", "k", "1"]), 1);
    assert_eq!(query::<i64>(&mut c, &["SETNX", "k", "2"]), 0);
    assert_eq!(query::<String>(&mut c, &["GETSET", "k", "3"]), "1");
    assert_eq!(
        query::<Option<String>>(&mut c, &["GETSET", "new", "x"]),
        None
    );
    assert_eq!(query::<String>(&mut c, &["GETDEL", "k"]), "3");
    assert_eq!(query::<Option<String>>(&mut c, &["GETDEL", "k"]), None);
    assert_eq!(query::<i64>(&mut c, &["MSETNX", "m1", "a", "m2", "b"]), 1);
    assert_eq!(query::<i64>(&mut c, &["MSETNX", "m2", "z", "m3", "c"]), 0);
    assert_eq!(query::<i64>(&mut c, &["EXISTS", "m3"]), 0);
    assert_eq!(query::<i64>(&mut c, &["APPEND", "s", "Hello"]), 5);
    assert_eq!(query::<i64>(&mut c, &["APPEND", "s", " World"]), 11);
    assert_eq!(query::<i64>(&mut c, &["STRLEN", "s"]), 11);
    assert_eq!(query::<i64>(&mut c, &["STRLEN", "nope"]), 0);
    assert_eq!(
        query::<String>(&mut c, &["GETRANGE", "s", "0", "4"]),
        "Hello"
    );
    assert_eq!(
        query::<String>(&mut c, &["GETRANGE", "s", "-5", "-1"]),
        "World"
    );
    assert_eq!(
        query::<String>(&mut c, &["GETRANGE", "nope", "0", "-1"]),
        ""
    );
    assert_eq!(query::<i64>(&mut c, &["SETRANGE", "s", "6", "Redis"]), 11);
    assert_eq!(query::<String>(&mut c, &["GET", "s"]), "Hello Redis");
    assert_eq!(query::<i64>(&mut c, &["SETRANGE", "pad", "3", "x"]), 4);
    assert_eq!(query::<Vec<u8>>(&mut c, &["GET", "pad"]), b"\0\0\0x");
    assert_eq!(query::<i64>(&mut c, &["SETRANGE", "empty", "5", ""]), 0);
    assert_eq!(query::<i64>(&mut c, &["EXISTS", "empty"]), 0);
    assert_eq!(
        error(&mut c, &["SETRANGE", "s", "-1", "x"]),
        "ERR offset is out of range"
    );
    assert_eq!(
        error(&mut c, &["SETRANGE", "s", "536870912", "x"]),
        "ERR string exceeds maximum allowed size (proto-max-bulk-len)"
    );
    assert_eq!(
        query::<String>(&mut c, &["INCRBYFLOAT", "f", "10.5"]),
        "10.5"
    );
    assert_eq!(
        query::<String>(&mut c, &["INCRBYFLOAT", "f", "0.1"]),
        "10.6"
    );
    assert_eq!(query::<String>(&mut c, &["INCRBYFLOAT", "f", "-5"]), "5.6");
    assert_eq!(
        error(&mut c, &["INCRBYFLOAT", "s", "1"]),
        "ERR value is not a valid float"
    );
    assert_eq!(
        error(&mut c, &["INCRBYFLOAT", "f", "x"]),
        "ERR value is not a valid float"
    );
    assert_eq!(
        error(&mut c, &["INCRBYFLOAT", "f", "inf"]),
        "ERR increment would produce NaN or Infinity"
    );
    assert_eq!(query::<String>(&mut c, &["TYPE", "s"]), "string");
    assert_eq!(query::<String>(&mut c, &["TYPE", "nope"]), "none");
    assert_eq!(query::<String>(&mut c, &["RENAME", "s", "s2"]), "OK");
    assert_eq!(query::<String>(&mut c, &["GET", "s2"]), "Hello Redis");
    assert_eq!(query::<i64>(&mut c, &["EXISTS", "s"]), 0);
    assert_eq!(error(&mut c, &["RENAME", "nope", "x"]), "ERR no such key");
    let time: Vec<String> = query(&mut c, &["TIME"]);
    assert!(time[0].parse::<u64>().expect("seconds") > 1_600_000_000);
    assert!(time[1].parse::<u32>().expect("micros") < 1_000_000);
}

#[test]
fn keys_scan_dbsize_flush() {
    let server = TestServer::start();
    let mut c = server.client();
    for i in 0..250 {
        let _: () = query(&mut c, &["SET", &format!("user:{i:03}"), "x"]);
    }
    let _: () = query(&mut c, &["SET", "other", "x"]);
    assert_eq!(query::<i64>(&mut c, &["DBSIZE"]), 251);
    let mut keys: Vec<String> = query(&mut c, &["KEYS", "user:1?0"]);
    keys.sort();
    let expected: Vec<String> = (0..10).map(|i| format!("user:1{i}0")).collect();
    assert_eq!(keys, expected);
    assert_eq!(query::<Vec<String>>(&mut c, &["KEYS", "*"]).len(), 251);
    assert_eq!(
        query::<Vec<String>>(&mut c, &["KEYS", "oth[a-f]r"]),
        vec!["other"]
    );
    // SCAN visits every key exactly once when nothing changes.
    let mut seen = std::collections::BTreeSet::new();
    let mut cursor = "0".to_string();
    let mut calls = 0;
    loop {
        let (next, batch): (String, Vec<String>) =
            query(&mut c, &["SCAN", &cursor, "MATCH", "user:*", "COUNT", "20"]);
        for k in batch {
            assert!(seen.insert(k), "SCAN returned a key twice");
        }
        calls += 1;
        if next == "0" {
            break;
        }
        cursor = next;
    }
    assert_eq!(seen.len(), 250);
    assert!(calls >= 12, "COUNT 20 over 251 keys took {calls} calls");
    // The redis crate's own iterator works too.
    let it: Vec<String> = redis::cmd("SCAN")
        .cursor_arg(0)
        .clone()
        .iter(&mut c)
        .expect("scan")
        .collect::<Result<_, _>>()
        .expect("scan items");
    assert_eq!(it.len(), 251);
    assert_eq!(error(&mut c, &["SCAN", "x"]), "ERR invalid cursor");
    assert_eq!(error(&mut c, &["FLUSHDB", "x"]), "ERR syntax error");
    assert_eq!(query::<i64>(&mut c, &["DBSIZE"]), 251);
    assert_eq!(query::<String>(&mut c, &["FLUSHDB"]), "OK");
    assert_eq!(query::<i64>(&mut c, &["DBSIZE"]), 0);
    let _: () = query(&mut c, &["SET", "a", "1"]);
    assert_eq!(query::<String>(&mut c, &["FLUSHALL", "ASYNC"]), "OK");
    assert_eq!(query::<i64>(&mut c, &["DBSIZE"]), 0);
}

/// `FLUSHALL` of more keys than one transaction may write (the engine's limit) empties the
/// database in several transactions (it answered `limit exceeded` and deleted nothing);
/// inside `MULTI` it deletes what one transaction may, else the `EXEC` fails whole.
#[test]
fn flush_of_more_keys_than_one_transaction_writes() {
    let server = TestServer::start();
    let mut c = server.client();
    let keys = 70_000;
    assert!(keys > keel::limits::TXN_WRITE_KEYS_MAX);
    let fill = |c: &mut redis::Connection| {
        for batch in 0..keys / 1_000 {
            let mut mset = redis::cmd("MSET");
            for i in batch * 1_000..(batch + 1) * 1_000 {
                mset.arg(format!("k{i}")).arg("v");
            }
            let _: () = mset.query(c).expect("MSET");
        }
        assert_eq!(query::<usize>(c, &["DBSIZE"]), keys);
    };
    fill(&mut c);
    assert_eq!(query::<String>(&mut c, &["FLUSHALL"]), "OK");
    assert_eq!(query::<i64>(&mut c, &["DBSIZE"]), 0);
    fill(&mut c);
    let _: () = query(&mut c, &["MULTI"]);
    let _: () = query(&mut c, &["SET", "also", "1"]);
    let _: () = query(&mut c, &["FLUSHDB"]);
    let replies: redis::RedisResult<redis::Value> = redis::cmd("EXEC").query(&mut c);
    assert!(
        format!("{replies:?}").contains("FLUSHDB inside MULTI deletes at most 65536 keys"),
        "{replies:?}"
    );
    assert_eq!(query::<usize>(&mut c, &["DBSIZE"]), keys, "nothing applied");
    assert_eq!(query::<String>(&mut c, &["FLUSHDB"]), "OK");
    assert_eq!(query::<i64>(&mut c, &["DBSIZE"]), 0);
}

#[test]
fn keel_commands() {
    let server = TestServer::start();
    let mut c = server.client();
    for k in ["a", "b", "c", "d"] {
        let _: () = query(&mut c, &["SET", k, &k.to_uppercase()]);
    }
    let range: Vec<(String, String)> = query(&mut c, &["KEEL.RANGE", "[b", "+"]);
    assert_eq!(
        range,
        vec![
            ("b".into(), "B".into()),
            ("c".into(), "C".into()),
            ("d".into(), "D".into())
        ]
    );
    let range: Vec<(String, String)> =
        query(&mut c, &["KEEL.RANGE", "-", "(c", "REV", "LIMIT", "1"]);
    assert_eq!(range, vec![("b".into(), "B".into())]);
    assert_eq!(
        error(&mut c, &["KEEL.RANGE", "b", "+"]),
        "ERR min or max not valid string range item"
    );
    assert_eq!(query::<String>(&mut c, &["KEEL.MAX", "hi", "5"]), "OK");
    assert_eq!(query::<String>(&mut c, &["KEEL.MAX", "hi", "3"]), "OK");
    assert_eq!(query::<String>(&mut c, &["KEEL.MIN", "lo", "5"]), "OK");
    assert_eq!(query::<String>(&mut c, &["KEEL.MIN", "lo", "-2"]), "OK");
    assert_eq!(query::<String>(&mut c, &["KEEL.ADD", "n", "40"]), "OK");
    assert_eq!(query::<String>(&mut c, &["KEEL.ADD", "n", "2"]), "OK");
    assert_eq!(
        query::<Vec<i64>>(&mut c, &["MGET", "hi", "lo", "n"]),
        vec![5, -2, 42]
    );
    assert_eq!(
        error(&mut c, &["KEEL.ADD", "a", "1"]),
        "ERR value is not an integer or out of range"
    );
}

#[test]
fn concurrent_counters_from_many_connections() {
    let server = TestServer::start();
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let url = server.url(false);
            std::thread::spawn(move || {
                let mut c = crate::connect(&url);
                for _ in 0..200 {
                    let _: i64 = query(&mut c, &["INCR", "hot"]);
                    let _: String = query(&mut c, &["KEEL.ADD", "hot2", "1"]);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("client thread");
    }
    let mut c = server.client();
    assert_eq!(query::<i64>(&mut c, &["GET", "hot"]), 1600);
    assert_eq!(query::<i64>(&mut c, &["GET", "hot2"]), 1600);
}

//! MULTI/EXEC/DISCARD/WATCH: one serializable transaction per EXEC, several connections.

use redis::Value;

use crate::{TestServer, error, query};

#[test]
fn multi_exec_runs_the_queue() {
    let server = TestServer::start();
    for resp3 in [false, true] {
        let mut c = server.client_proto(resp3);
        assert_eq!(query::<String>(&mut c, &["MULTI"]), "OK");
        assert_eq!(query::<String>(&mut c, &["SET", "a", "1"]), "QUEUED");
        assert_eq!(query::<String>(&mut c, &["INCR", "a"]), "QUEUED");
        assert_eq!(query::<String>(&mut c, &["GET", "a"]), "QUEUED");
        assert_eq!(query::<String>(&mut c, &["PING"]), "QUEUED");
        let replies: Value = query(&mut c, &["EXEC"]);
        assert_eq!(
            replies,
            Value::Array(vec![
                Value::Okay,
                Value::Int(2),
                Value::BulkString(b"2".to_vec()),
                Value::SimpleString("PONG".into()),
            ])
        );
        // The redis crate's atomic pipeline.
        let (x, y): (i64, i64) = redis::pipe()
            .atomic()
            .cmd("INCR")
            .arg("x")
            .cmd("INCR")
            .arg("x")
            .query(&mut c)
            .expect("atomic pipeline");
        assert_eq!((x + 1, y), (y, y));
        let _: () = query(&mut c, &["DEL", "x"]);
    }
}

#[test]
fn errors_in_multi() {
    let server = TestServer::start();
    let mut c = server.client();
    assert_eq!(error(&mut c, &["EXEC"]), "ERR EXEC without MULTI");
    assert_eq!(error(&mut c, &["DISCARD"]), "ERR DISCARD without MULTI");
    let _: () = query(&mut c, &["MULTI"]);
    assert_eq!(
        error(&mut c, &["MULTI"]),
        "ERR MULTI calls can not be nested"
    );
    assert_eq!(
        error(&mut c, &["WATCH", "a"]),
        "ERR WATCH inside MULTI is not allowed"
    );
    assert_eq!(query::<String>(&mut c, &["SET", "a", "1"]), "QUEUED");
    // UNWATCH is queued (and answers OK in EXEC), as in Redis.
    assert_eq!(query::<String>(&mut c, &["UNWATCH"]), "QUEUED");
    assert_eq!(query::<String>(&mut c, &["DISCARD"]), "OK");
    assert_eq!(query::<i64>(&mut c, &["EXISTS", "a"]), 0);
    // A queue-time error aborts the whole EXEC, as in Redis.
    let _: () = query(&mut c, &["MULTI"]);
    assert_eq!(query::<String>(&mut c, &["SET", "a", "1"]), "QUEUED");
    assert_eq!(
        error(&mut c, &["GET"]),
        "ERR wrong number of arguments for 'get' command"
    );
    assert_eq!(
        error(&mut c, &["EXEC"]),
        "EXECABORT Transaction discarded because of previous errors."
    );
    assert_eq!(query::<i64>(&mut c, &["EXISTS", "a"]), 0);
}

#[test]
fn a_failing_command_rolls_back_the_whole_exec() {
    let server = TestServer::start();
    let mut c = server.client();
    let _: () = query(&mut c, &["SET", "text", "abc"]);
    let _: () = query(&mut c, &["SET", "keep", "old"]);
    // The redis crate turns a reply holding an error into an Err: read the raw reply.
    let mut s = server.raw();
    let got = crate::exchange(
        &mut s,
        b"MULTI\r\nSET keep new\r\nINCR text\r\nSET other 1\r\nEXEC\r\n",
        92,
    );
    assert_eq!(
        String::from_utf8_lossy(&got),
        "+OK\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n*3\r\n+OK\r\n-ERR value is not an integer or out of range\r\n+OK\r\n"
    );
    // keel, unlike Redis, applied nothing.
    assert_eq!(query::<String>(&mut c, &["GET", "keep"]), "old");
    assert_eq!(query::<i64>(&mut c, &["EXISTS", "other"]), 0);
}

#[test]
fn watch_detects_a_change_by_another_connection() {
    let server = TestServer::start();
    let mut a = server.client();
    let mut b = server.client();
    let _: () = query(&mut a, &["SET", "balance", "100"]);
    assert_eq!(query::<String>(&mut a, &["WATCH", "balance"]), "OK");
    let balance: i64 = query(&mut a, &["GET", "balance"]);
    let _: () = query(&mut b, &["SET", "balance", "50"]);
    // The WATCH snapshot: a still reads what it read at WATCH.
    assert_eq!(query::<i64>(&mut a, &["GET", "balance"]), balance);
    let _: () = query(&mut a, &["MULTI"]);
    let _: () = query(&mut a, &["SET", "balance", &(balance - 10).to_string()]);
    assert_eq!(query::<Value>(&mut a, &["EXEC"]), Value::Nil);
    assert_eq!(query::<i64>(&mut a, &["GET", "balance"]), 50);
}

#[test]
fn watch_detects_an_equal_value_rewrite_and_a_create() {
    let server = TestServer::start();
    for resp3 in [false, true] {
        let mut a = server.client_proto(resp3);
        let mut b = server.client();
        let _: () = query(&mut a, &["SET", "k", "same"]);
        let _: () = query(&mut a, &["WATCH", "k", "fresh"]);
        let _: () = query(&mut b, &["SET", "k", "same"]);
        let _: () = query(&mut a, &["MULTI"]);
        let _: () = query(&mut a, &["SET", "k", "mine"]);
        assert_eq!(query::<Value>(&mut a, &["EXEC"]), Value::Nil);
        assert_eq!(query::<String>(&mut a, &["GET", "k"]), "same");

        let _: () = query(&mut a, &["WATCH", "k", "fresh"]);
        let _: () = query(&mut b, &["SET", "fresh", "1"]);
        let _: () = query(&mut a, &["MULTI"]);
        let _: () = query(&mut a, &["SET", "k", "mine"]);
        assert_eq!(query::<Value>(&mut a, &["EXEC"]), Value::Nil);
        let _: () = query(&mut a, &["DEL", "fresh"]);

        // A bit write that changes a bit, or grows the string, is a write like any other;
        // one that changes nothing is not (as in Redis 7.0): 's' is 0111 0011.
        let _: () = query(&mut a, &["SET", "k", "same"]);
        for (write, aborts) in [
            (&["SETBIT", "k", "0", "0"][..], false),
            (&["SETBIT", "k", "1", "1"], false),
            (&["SETBIT", "k", "0", "1"], true),
            (&["SETBIT", "k", "0", "0"], true),
            (&["SETBIT", "k", "100", "0"], true),
            (
                &["BITFIELD", "k", "SET", "u8", "0", "115", "GET", "u8", "8"],
                false,
            ),
            (
                &[
                    "BITFIELD", "k", "SET", "u8", "0", "1", "SET", "u8", "0", "115",
                ],
                true,
            ),
            (&["BITOP", "OR", "k", "k"], true),
        ] {
            let _: () = query(&mut a, &["WATCH", "k"]);
            let _: Value = query(&mut b, write);
            let _: () = query(&mut a, &["MULTI"]);
            let _: () = query(&mut a, &["GETBIT", "k", "0"]);
            let exec: Value = query(&mut a, &["EXEC"]);
            assert_eq!(exec == Value::Nil, aborts, "{write:?}");
        }
        let _: () = query(&mut a, &["DEL", "k"]);
    }
}

#[test]
fn watch_without_a_change_commits() {
    let server = TestServer::start();
    let mut a = server.client();
    let mut b = server.client();
    let _: () = query(&mut a, &["SET", "k", "1"]);
    let _: () = query(&mut a, &["WATCH", "k"]);
    // Changes to other keys, even ones the transaction reads, do not fail the EXEC.
    let _: () = query(&mut b, &["SET", "other", "2"]);
    let _: () = query(&mut a, &["MULTI"]);
    let _: () = query(&mut a, &["GET", "other"]);
    let _: () = query(&mut a, &["SET", "k", "2"]);
    let replies: Vec<Value> = query(&mut a, &["EXEC"]);
    assert_eq!(replies, vec![Value::BulkString(b"2".to_vec()), Value::Okay]);
    // UNWATCH forgets; DISCARD and EXEC unwatch.
    let _: () = query(&mut a, &["WATCH", "k"]);
    let _: () = query(&mut a, &["UNWATCH"]);
    let _: () = query(&mut b, &["SET", "k", "3"]);
    let _: () = query(&mut a, &["MULTI"]);
    let _: () = query(&mut a, &["SET", "k", "4"]);
    assert_eq!(query::<Vec<Value>>(&mut a, &["EXEC"]), vec![Value::Okay]);
    let _: () = query(&mut a, &["WATCH", "k"]);
    let _: () = query(&mut a, &["MULTI"]);
    let _: () = query(&mut a, &["DISCARD"]);
    let _: () = query(&mut b, &["SET", "k", "5"]);
    let _: () = query(&mut a, &["MULTI"]);
    let _: () = query(&mut a, &["SET", "k", "6"]);
    assert_eq!(query::<Vec<Value>>(&mut a, &["EXEC"]), vec![Value::Okay]);
    assert_eq!(query::<i64>(&mut a, &["GET", "k"]), 6);
}

/// Each WATCH records the version its keys have then: a key changed before it was watched
/// does not fail the EXEC, a key rewritten with an equal value after it was watched does.
#[test]
fn watch_is_exact_per_watch_command() {
    let server = TestServer::start();
    let mut a = server.client();
    let mut b = server.client();
    let _: () = query(&mut a, &["SET", "first", "1"]);
    let _: () = query(&mut a, &["SET", "second", "1"]);
    let _: () = query(&mut a, &["WATCH", "first"]);
    // Changed between the two WATCHes, not after the second.
    let _: () = query(&mut b, &["SET", "second", "2"]);
    let _: () = query(&mut a, &["WATCH", "second"]);
    // Reads after the second WATCH see its snapshot.
    assert_eq!(query::<i64>(&mut a, &["GET", "second"]), 2);
    let _: () = query(&mut a, &["MULTI"]);
    let _: () = query(&mut a, &["INCR", "second"]);
    let _: () = query(&mut a, &["INCR", "first"]);
    assert_eq!(
        query::<Vec<i64>>(&mut a, &["EXEC"]),
        vec![3, 2],
        "a key changed before it was watched does not fail EXEC"
    );

    // An equal-value rewrite of a watched key by another connection fails the EXEC.
    let _: () = query(&mut a, &["WATCH", "first"]);
    let _: () = query(&mut a, &["WATCH", "second"]);
    let _: () = query(&mut b, &["SET", "second", "3"]);
    let _: () = query(&mut a, &["MULTI"]);
    let _: () = query(&mut a, &["SET", "first", "mine"]);
    assert_eq!(query::<Value>(&mut a, &["EXEC"]), Value::Nil);
    assert_eq!(query::<i64>(&mut a, &["GET", "first"]), 2);
    assert_eq!(query::<i64>(&mut a, &["GET", "second"]), 3);
}

#[test]
fn watch_by_own_write_fails_exec_as_in_redis() {
    let server = TestServer::start();
    let mut a = server.client();
    let _: () = query(&mut a, &["WATCH", "k"]);
    let _: () = query(&mut a, &["SET", "k", "1"]);
    let _: () = query(&mut a, &["MULTI"]);
    let _: () = query(&mut a, &["SET", "k", "2"]);
    assert_eq!(query::<Value>(&mut a, &["EXEC"]), Value::Nil);
    assert_eq!(query::<i64>(&mut a, &["GET", "k"]), 1);
}

/// A key absent at WATCH, created and deleted again before EXEC, was changed.
#[test]
fn watch_sees_a_create_then_delete() {
    let server = TestServer::start();
    let mut a = server.client();
    let mut b = server.client();
    let _: () = query(&mut a, &["WATCH", "k"]);
    let _: () = query(&mut b, &["SET", "k", "1"]);
    let _: () = query(&mut b, &["DEL", "k"]);
    let _: () = query(&mut a, &["MULTI"]);
    let _: () = query(&mut a, &["SET", "other", "1"]);
    assert_eq!(query::<Value>(&mut a, &["EXEC"]), Value::Nil);
    // A key deleted before the WATCH and left alone is unchanged, also across a second WATCH.
    let _: () = query(&mut a, &["WATCH", "k"]);
    std::thread::sleep(std::time::Duration::from_millis(50));
    let _: () = query(&mut a, &["WATCH", "other2"]);
    let _: () = query(&mut a, &["MULTI"]);
    let _: () = query(&mut a, &["SET", "other", "2"]);
    assert_eq!(
        query::<Value>(&mut a, &["EXEC"]),
        Value::Array(vec![Value::Okay])
    );
}

/// Read-modify-write transfers between accounts from several connections, each a MULTI with
/// reads and writes: conflicts are retried inside the server, and the total is conserved.
#[test]
fn concurrent_exec_is_serializable() {
    let server = TestServer::start();
    let mut c = server.client();
    for i in 0..4 {
        let _: () = query(&mut c, &["SET", &format!("acct{i}"), "100"]);
    }
    let threads: Vec<_> = (0..6)
        .map(|t| {
            let url = server.url(t % 2 == 0);
            std::thread::spawn(move || {
                let mut c = crate::connect(&url);
                for i in 0..100 {
                    let from = format!("acct{}", (t + i) % 4);
                    let to = format!("acct{}", (t + i + 1) % 4);
                    // INCRBY reads the value in the transaction: a conflict is possible and
                    // must be retried by the server, never surfaced.
                    let (_, _, sum): (i64, i64, i64) = redis::pipe()
                        .atomic()
                        .cmd("DECRBY")
                        .arg(&from)
                        .arg(7)
                        .cmd("INCRBY")
                        .arg(&to)
                        .arg(7)
                        .cmd("INCRBY")
                        .arg("transfers")
                        .arg(1)
                        // A read-modify-write of a string's bits: a lost update would
                        // show in the final count.
                        .cmd("BITFIELD")
                        .arg("bits")
                        .arg(&["INCRBY", "u16", "#1", "1"])
                        .ignore()
                        .query(&mut c)
                        .expect("EXEC never fails for a conflict");
                    assert!(sum >= 1);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("client thread");
    }
    let values: Vec<i64> = query(&mut c, &["MGET", "acct0", "acct1", "acct2", "acct3"]);
    assert_eq!(values.iter().sum::<i64>(), 400);
    assert_eq!(query::<i64>(&mut c, &["GET", "transfers"]), 600);
    let bits: Vec<i64> = query(&mut c, &["BITFIELD", "bits", "GET", "u16", "#1"]);
    assert_eq!(bits, [600]);
}

/// Many WATCH-based optimistic increments: every EXEC either commits or returns null, and the
/// final count equals the number of EXECs that committed (no lost update).
#[test]
fn watch_increments_lose_no_update() {
    let server = TestServer::start();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let url = server.url(false);
            std::thread::spawn(move || {
                let mut c = crate::connect(&url);
                let mut committed = 0;
                for _ in 0..100 {
                    let _: () = query(&mut c, &["WATCH", "n"]);
                    let n: Option<i64> = query(&mut c, &["GET", "n"]);
                    let _: () = query(&mut c, &["MULTI"]);
                    let _: () = query(&mut c, &["SET", "n", &(n.unwrap_or(0) + 1).to_string()]);
                    match query::<Value>(&mut c, &["EXEC"]) {
                        Value::Nil => {}
                        Value::Array(_) => committed += 1,
                        other => panic!("EXEC returned {other:?}"),
                    }
                }
                committed
            })
        })
        .collect();
    let committed: i64 = threads
        .into_iter()
        .map(|t| t.join().expect("client thread"))
        .sum();
    let mut c = server.client();
    assert!(committed > 0);
    assert_eq!(query::<i64>(&mut c, &["GET", "n"]), committed);
}

#[test]
fn keel_range_in_multi_is_consistent() {
    let server = TestServer::start();
    let mut c = server.client();
    for k in ["a", "b", "c"] {
        let _: () = query(&mut c, &["SET", k, "1"]);
    }
    let _: () = query(&mut c, &["MULTI"]);
    let _: () = query(&mut c, &["KEEL.RANGE", "-", "+"]);
    let _: () = query(&mut c, &["SET", "d", "1"]);
    let _: () = query(&mut c, &["KEEL.RANGE", "-", "+", "REV", "LIMIT", "2"]);
    let _: () = query(&mut c, &["KEEL.ADD", "a", "5"]);
    let _: () = query(&mut c, &["GET", "a"]);
    let replies: Vec<Value> = query(&mut c, &["EXEC"]);
    assert_eq!(replies.len(), 5);
    let pairs = |v: &Value| -> Vec<String> {
        match v {
            Value::Array(items) => items
                .iter()
                .map(|p| match p {
                    Value::Array(kv) => match &kv[0] {
                        Value::BulkString(k) => String::from_utf8_lossy(k).into_owned(),
                        other => panic!("{other:?}"),
                    },
                    other => panic!("{other:?}"),
                })
                .collect(),
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(pairs(&replies[0]), vec!["a", "b", "c"]);
    assert_eq!(pairs(&replies[2]), vec!["d", "c"]);
    assert_eq!(replies[4], Value::BulkString(b"6".to_vec()));
}

/// The conflict retries the server counted so far.
fn conflict_retries(c: &mut redis::Connection) -> u64 {
    let info: String = query(c, &["INFO", "all"]);
    crate::info_counter(&info, "keel_conflict_retries")
}

/// INCR inside MULTI is the engine's commutative add: many connections incrementing one hot
/// counter never conflict (no retry inside the server), and each EXEC's reply is the count
/// right after its own increment, so the replies are exactly 1..=N.
#[test]
fn hot_counter_increments_in_multi_never_conflict() {
    const CLIENTS: usize = 4;
    const EXECS: usize = 150;
    // On the worker pool: the poller thread runs one command at a time, so nothing would
    // overlap and the check below could not fail.
    let server = TestServer::with(|c| c.poller = keel_server::lanes::PollerMode::Off);
    let mut c = server.client();
    let retries_before = conflict_retries(&mut c);
    let threads: Vec<_> = (0..CLIENTS)
        .map(|t| {
            let url = server.url(t % 2 == 0);
            std::thread::spawn(move || {
                let mut c = crate::connect(&url);
                (0..EXECS)
                    .map(|_| {
                        let (hot, _, by_two): (i64, String, i64) = redis::pipe()
                            .atomic()
                            .cmd("INCR")
                            .arg("hot")
                            .cmd("SET")
                            .arg(format!("last{t}"))
                            .arg("x")
                            .cmd("INCRBY")
                            .arg("pairs")
                            .arg(2)
                            .query(&mut c)
                            .expect("EXEC");
                        assert_eq!(by_two % 2, 0);
                        hot
                    })
                    .collect::<Vec<i64>>()
            })
        })
        .collect();
    let mut seen: Vec<i64> = threads
        .into_iter()
        .flat_map(|t| t.join().expect("client thread"))
        .collect();
    seen.sort_unstable();
    let n = (CLIENTS * EXECS) as i64;
    assert!(
        seen == (1..=n).collect::<Vec<_>>(),
        "replies were not 1..=N"
    );
    assert_eq!(query::<i64>(&mut c, &["GET", "hot"]), n);
    assert_eq!(query::<i64>(&mut c, &["GET", "pairs"]), 2 * n);
    assert_eq!(conflict_retries(&mut c), retries_before);
}

/// A tracked increment followed, in the same EXEC, by a read or an overwrite of its key, and
/// increments on a value that is not an integer: the replies are Redis's.
#[test]
fn increments_mixed_with_reads_and_overwrites_in_multi() {
    let server = TestServer::start();
    let mut c = server.client();
    let _: () = query(&mut c, &["SET", "n", "5"]);
    let replies: Value = redis::pipe()
        .atomic()
        .cmd("INCR")
        .arg("n")
        .cmd("GET")
        .arg("n")
        .cmd("INCRBY")
        .arg("n")
        .arg(10)
        .cmd("SET")
        .arg("n")
        .arg("100")
        .cmd("DECR")
        .arg("n")
        .cmd("INCR")
        .arg("fresh")
        .cmd("DECRBY")
        .arg("fresh")
        .arg(3)
        .query(&mut c)
        .expect("EXEC");
    assert_eq!(
        replies,
        Value::Array(vec![
            Value::Int(6),
            Value::BulkString(b"6".to_vec()),
            Value::Int(16),
            Value::Okay,
            Value::Int(99),
            Value::Int(1),
            Value::Int(-2),
        ])
    );
    // Overflow found at commit: the error is in the increment's slot; nothing applied.
    let _: () = query(&mut c, &["SET", "big", &i64::MAX.to_string()]);
    let mut s = server.raw();
    let got = crate::exchange(&mut s, b"MULTI\r\nINCR n\r\nINCR big\r\nEXEC\r\n", 77);
    assert_eq!(
        String::from_utf8_lossy(&got),
        "+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n:100\r\n-ERR increment or decrement would overflow\r\n"
    );
    assert_eq!(query::<i64>(&mut c, &["GET", "n"]), 99);
    // Outside MULTI, one at a time and pipelined.
    assert_eq!(
        error(&mut c, &["INCR", "big"]),
        "ERR increment or decrement would overflow"
    );
    let _: () = query(&mut c, &["SET", "text", "abc"]);
    assert_eq!(
        error(&mut c, &["INCR", "text"]),
        "ERR value is not an integer or out of range"
    );
    let got = crate::exchange(&mut s, b"INCR n\r\nINCR text\r\nINCRBY n 2\r\n", 58);
    assert_eq!(
        String::from_utf8_lossy(&got),
        ":100\r\n-ERR value is not an integer or out of range\r\n:102\r\n"
    );
}

/// `MULTI` blocks that move elements from one list to another, from many clients on the
/// worker pool: every block conflicts with the others until the lists turn hot (`hot.rs`),
/// then they queue for the lists' locks. Every element moves exactly once, no `EXEC` fails,
/// and the retries stay a small share of the blocks.
#[test]
fn blocks_on_hot_keys_queue_instead_of_conflicting() {
    const CLIENTS: usize = 8;
    const MOVES: usize = 100;
    let server = TestServer::with(|c| c.poller = keel_server::lanes::PollerMode::Off);
    let mut c = server.client();
    for chunk in (0..CLIENTS * MOVES).collect::<Vec<_>>().chunks(500) {
        let mut push = redis::cmd("RPUSH");
        push.arg("from");
        for i in chunk {
            push.arg(format!("e{i}"));
        }
        let _: i64 = push.query(&mut c).expect("RPUSH");
    }
    let retries_before = conflict_retries(&mut c);
    let threads: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let url = server.url(false);
            std::thread::spawn(move || {
                let mut c = crate::connect(&url);
                for _ in 0..MOVES {
                    let (moved,): (Vec<String>,) = redis::pipe()
                        .atomic()
                        .cmd("LPOP")
                        .arg("from")
                        .arg(1)
                        .cmd("LLEN")
                        .arg("to")
                        .ignore()
                        .query(&mut c)
                        .expect("no EXEC fails");
                    let _: i64 = query(&mut c, &["RPUSH", "to", &moved[0]]);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("client");
    }
    let mut moved: Vec<String> = query(&mut c, &["LRANGE", "to", "0", "-1"]);
    moved.sort();
    let mut expected: Vec<String> = (0..CLIENTS * MOVES).map(|i| format!("e{i}")).collect();
    expected.sort();
    assert_eq!(moved, expected, "every element moved exactly once");
    let retries = conflict_retries(&mut c) - retries_before;
    assert!(
        retries < (CLIENTS * MOVES / 4) as u64,
        "{retries} conflict retries for {} blocks",
        CLIENTS * MOVES
    );
}

//! Differential test: keel against a real `redis-server`, command by command.
//!
//! Each run starts `/usr/bin/redis-server` (no persistence) on a free loopback port and a keel
//! server in-process, then sends both the same seeded random sequence of commands over raw
//! RESP and requires equal replies: same RESP types, same bytes, same error texts. It runs once
//! speaking RESP2 and once after `HELLO 3`. Now and then a few data commands go out in one
//! write (pipelined), which keel runs as one batched transaction, and a command goes out as
//! an inline command (bare, single- or double-quoted arguments with escapes). Redis is the reference; the installed one is what
//! CI installs (Debian's, 7.0 at the time of writing).
//!
//! Running more: `KEEL_DIFF_OPS=200000 KEEL_DIFF_SEED=7 cargo test -p keel-server --test it
//! differential` (`KEEL_DIFF_OPS` steps per protocol, default [`OPS_DEFAULT`]; `KEEL_DIFF_SEED`
//! replaces the fixed default seeds). A mismatch prints the seed, the step, the command, both
//! replies, the steps before it and a shortened sequence that still reproduces it.
//!
//! The generator is organised by command family ([`FAMILIES`]): each is a function that draws
//! one command from a small key space ([`KEYS`], so commands collide) with a mix of valid and
//! invalid arguments. To add a family, write such a function and add a line to [`FAMILIES`];
//! to check a new type's contents in the periodic state comparison, add its read command to
//! [`contents`]. The `errors` family mutates the data families' commands (drops, adds or
//! spoils an argument), so new families get arity and argument errors for free.
//!
//! Not sent, and why:
//! - `KEEL.*`: keel's own, Redis has no such commands.
//! - Nondeterministic or server-specific replies: `INFO`, `TIME`, `CLIENT ID|LIST|INFO|KILL`,
//!   `COMMAND` (keel lists fewer commands), `CONFIG` (different parameters), a successful
//!   `HELLO` (server name, version and client id differ; the harness sends `HELLO 3` itself
//!   and checks only that both answer with a map), `CLIENT SETINFO` (Redis 7.2's; the
//!   reference is 7.0).
//! - `QUIT`, `SHUTDOWN`: they end the connection or the server.
//! - `SELECT 1`..`SELECT 15`: keel has one database (documented); `SELECT 0` and bad indexes
//!   are sent.
//! - `AUTH` with a password set: the servers run without one (the errors are compared).
//! - `OBJECT IDLETIME`: keel keeps no access times (an error says so); `COPY ... DB 1`..`15`
//!   (as `SELECT`).
//! - `SET` with an absolute deadline in the past: both servers store the key expired, and
//!   `DBSIZE` counts it until each one's expiry cycle deletes it, at different moments.
//! - `BITFIELD ... OVERFLOW FAIL` while watching: a `BITFIELD` whose every write fails but
//!   that creates or pads the string changes the key in both, but Redis does not tell the
//!   key's watchers (keel's `EXEC` aborts; documented in `bits.rs`).
//! - `EXPIRE ... GT|LT` with relative times: two equal relative TTLs compare by the
//!   milliseconds between the commands, which differ between the servers; GT and LT are sent
//!   with absolute deadlines.
//!
//! Deliberate differences, encoded as allowances (each documented in the README):
//! - A command that fails inside `EXEC` rolls the whole transaction back in keel; Redis
//!   applies the others. The `EXEC` replies must still be equal; then the harness restores
//!   Redis's keys to what they were before `EXEC` (`DUMP`/`RESTORE`), so both go on from
//!   keel's state.
//! - Reads between `WATCH` and `EXEC` see the snapshot of the latest `WATCH` in keel; Redis
//!   reads the newest data. A read-only command outside `MULTI`, while watching, after some
//!   write since that `WATCH`, is sent to both but its replies are not compared.
//! - Connection commands inside `MULTI` other than `PING` and `ECHO` are refused by keel
//!   (documented); the generator does not queue them.
//! - Pub/sub (the `pubsub` family): only the main client subscribes; the harness follows its
//!   subscriptions to know how many frames each (un)subscribe sends, and after a `PUBLISH`
//!   or `SPUBLISH` (by the second client, or by the main one under RESP3) reads the messages
//!   the main client got on each server. Orders Redis leaves to its hash tables are compared
//!   sorted: the messages of one publish (a channel and its matching patterns), the names an
//!   `UNSUBSCRIBE` without arguments lists (their counts in order), `PUBSUB CHANNELS`.
//!   (Un)subscribing inside `MULTI` is refused by keel (documented) and `PUBLISH` there is
//!   not drawn: a rolled-back `EXEC` sends nothing in keel.
//! - Replies whose order Redis leaves unspecified (`KEYS`, `SCAN`) are compared as sorted
//!   sets; `SCAN` outside `MULTI` is iterated to its end on each server first (cursors are
//!   opaque and differ by design), and so is `HSCAN`. A hash's fields (`HGETALL`, `HKEYS`, `HVALS`, `HSCAN`) are
//!   compared sorted: Redis keeps a small hash in insertion order, keel in field order.
//! - Deadlines are set from each server's clock a few milliseconds apart: `TTL`, `PTTL`,
//!   `EXPIRETIME` and `PEXPIRETIME` are compared by what they say (no key, no TTL, or some
//!   deadline), not by value. The generator's TTLs are long enough that none runs out.
//! - `HRANDFIELD` picks at random: only the shape of its reply is compared; so is
//!   `RANDOMKEY`'s.
//! - `OBJECT ENCODING` is answered from the data as it is now in keel, from the value's history
//!   in Redis (`APPEND` makes any string `raw`; a hash that outgrew `listpack` stays
//!   `hashtable`): two string encodings agree, and so does keel's compact encoding with
//!   Redis's larger one of the same type ([`encodings_agree`], in an `EXEC`'s replies too). The
//!   deterministic `object_encodings_match_redis` compares them exactly for values built in
//!   one step. `OBJECT REFCOUNT` is compared by shape (Redis's shared integers, likewise).

use std::collections::HashMap;
use std::fmt;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::TestServer;

/// Steps per protocol in a plain `cargo test`: a few seconds.
const OPS_DEFAULT: usize = 10_000;
/// The key space: small, so that commands collide; prefixes and lengths vary for `KEYS`.
const KEYS: &[&str] = &["a", "b", "ab", "k1", "k2", "k:3", "x{1}", "xy"];
/// Steps between two full comparisons of the servers' contents.
const STATE_CHECK_EVERY: usize = 97;
/// Replays the shortening of a failing sequence may take.
const SHRINK_REPLAYS_MAX: usize = 400;
/// Time the shortening may take.
const SHRINK_TIME_MAX: Duration = Duration::from_secs(60);

#[test]
fn differential_resp2() {
    differential(false, 0x5eed_0002);
}

#[test]
fn differential_resp3() {
    differential(true, 0x5eed_0003);
}

/// Sequences that once differed, each named for what it caught. Each runs from empty servers,
/// in RESP2 and in RESP3, and must get Redis's replies.
const REGRESSIONS: &[(&str, &[&[&str]])] = &[
    (
        "LMOVE of a list's only element onto itself keeps the key and its TTL",
        &[
            &["RPUSH", "ab", "b"],
            &["EXPIRE", "ab", "100"],
            &["LMOVE", "ab", "ab", "left", "RIGHT"],
            &["PTTL", "ab"],
        ],
    ),
    (
        "a refused EXEC discards the transaction and says why",
        &[
            &["MULTI"],
            &["SET", "a", "1"],
            &["EXEC", "x"],
            &["EXEC"],
            &["GET", "a"],
            &["SUBSCRIBE", "c"],
            &["EXEC"],
            &["RESET"],
        ],
    ),
    (
        "CLIENT LIST and KILL check client types and users as Redis does",
        &[
            &["CLIENT", "LIST", "TYPE", "nosuch"],
            &["CLIENT", "KILL", "TYPE", "nosuch"],
            &["CLIENT", "KILL", "TYPE", "master"],
            &["CLIENT", "KILL", "TYPE", "Replica", "USER", "default"],
            &["CLIENT", "KILL", "USER", "nosuch"],
            &["CLIENT", "KILL", "MAXAGE", "100"],
        ],
    ),
    (
        "pub/sub patterns match the empty channel only when empty",
        &[
            &["SUBSCRIBE", ""],
            &["PSUBSCRIBE", "*", ""],
            &["PUBSUB", "CHANNELS", "*"],
            &["PUBSUB", "CHANNELS", ""],
            &["PUBLISH", "", "m"],
            &["PUBLISH", "a", "m"],
            &["RESET"],
        ],
    ),
    (
        "AUTH with a user name succeeds for the default user when no password is set",
        &[
            &["AUTH", "default", "secret"],
            &["AUTH", "alice", "secret"],
            &["AUTH", "secret"],
        ],
    ),
    (
        "UNWATCH is queued inside MULTI",
        &[&["MULTI"], &["UNWATCH"], &["SET", "a", "1"], &["EXEC"]],
    ),
    (
        "SELECT reads its index as a C int",
        &[
            &["SELECT", "99999999999"],
            &["SELECT", "-99999999999"],
            &["SELECT", "2147483648"],
            &["SELECT", "2147483647"],
            &["SELECT", "-1"],
            &["SELECT", "abc"],
        ],
    ),
    (
        "unknown command errors quote arguments as C's printf does",
        &[
            &["NOSUCH", "k", "a\0b", "\0"],
            &[
                "NOSUCH",
                "0123456789012345678901234567890123456789012345678901234567890123456789",
                "0123456789012345678901234567890123456789012345678901234567890123456789",
                "more",
            ],
            &["NO\0SUCH", "\u{ff}\u{fe}"],
        ],
    ),
    (
        "FLUSHDB and FLUSHALL check their options outside MULTI too",
        &[
            &["SET", "a", "1"],
            &["FLUSHDB", "NaN"],
            &["FLUSHALL", "sync", "x"],
            &["FLUSHDB", "async"],
            &["FLUSHALL", "SYNC"],
        ],
    ),
    (
        "glob patterns match the empty key only as Redis's matcher does",
        &[
            &["SET", "", "1"],
            &["SET", "]", "2"],
            &["SET", "_", "3"],
            &["KEYS", "*"],
            &["KEYS", "**"],
            &["KEYS", "?"],
            &["KEYS", ""],
            &["KEYS", "[a-]"],
            &["SCAN", "0", "MATCH", "*"],
            &["SCAN", "0", "MATCH", "**"],
            &["SCAN", "0", "MATCH", "[a-]"],
        ],
    ),
    (
        "INCRBYFLOAT adds in C's long double and prints it as Redis does",
        &[
            &["SET", "a", "10.50"],
            &["INCRBYFLOAT", "a", "0.1"],
            &["INCRBYFLOAT", "a", "1000.1"],
            &["INCRBYFLOAT", "a", "0x10"],
            &["INCRBYFLOAT", "b", "1e308"],
            &["INCRBYFLOAT", "b", "1e308"],
            &["INCRBYFLOAT", "c", "1e5000"],
            &["INCRBYFLOAT", "c", "inf"],
            &["INCRBYFLOAT", "c", "nan"],
            &["INCRBYFLOAT", "c", " 1"],
            &["SET", "d", "abc"],
            &["INCRBYFLOAT", "d", "xyz"],
            &["INCRBYFLOAT", "e", "-0"],
            &["SET", "f", "\u{0}7"],
            &["INCRBYFLOAT", "f", "1"],
            &["INCRBYFLOAT", "g", "1\u{0}"],
        ],
    ),
    (
        "HINCRBYFLOAT adds in C's long double and checks as Redis does",
        &[
            &["HINCRBYFLOAT", "h", "f", "1000.1"],
            &["HINCRBYFLOAT", "h", "f", "10.6"],
            &["HINCRBYFLOAT", "h", "f", "0x10"],
            &["HINCRBYFLOAT", "h", "f", "inf"],
            &["HINCRBYFLOAT", "h", "f", "abc"],
            &["HSET", "h", "g", "abc", "i", "5"],
            &["HINCRBYFLOAT", "h", "g", "1"],
            &["HINCRBYFLOAT", "h", "i", "1.5"],
            &["HINCRBYFLOAT", "h", "j", "1e308"],
            &["HINCRBYFLOAT", "h", "j", "1e308"],
            &["SET", "s", "1"],
            &["HINCRBYFLOAT", "s", "f", "abc"],
            &["HINCRBYFLOAT", "s", "f", "-inf"],
            &["HINCRBYFLOAT", "s", "f", "1"],
        ],
    ),
    (
        "EXEC with arguments aborts the transaction and its WATCH",
        &[
            &["SET", "a", "1"],
            &["WATCH", "a"],
            &["EXEC", "x"],
            &["SET", "a", "2"],
            &["MULTI"],
            &["SET", "b", "1"],
            &["EXEC"],
            &["MULTI"],
            &["SET", "c", "1"],
            &["EXEC", "x"],
            &["EXEC"],
            &["MULTI"],
            &["DISCARD", "x"],
            &["SET", "d", "1"],
            &["EXEC"],
        ],
    ),
    (
        "SCAN reads its cursor as strtoul does",
        &[
            &["SET", "a", "1"],
            &["SCAN", ""],
            &["SCAN", "+0"],
            &["SCAN", "-0", "COUNT", "5"],
            &["SCAN", " 0"],
            &["SCAN", "0 "],
            &["SCAN", "-"],
            &["SCAN", "18446744073709551616"],
        ],
    ),
    (
        "WATCH sees a key created and deleted again after it",
        &[
            &["WATCH", "a"],
            &["SET", "a", "1"],
            &["DEL", "a"],
            &["MULTI"],
            &["SET", "b", "1"],
            &["EXEC"],
            &["SET", "c", "1"],
            &["DEL", "c"],
            &["WATCH", "c"],
            &["WATCH", "a"],
            &["MULTI"],
            &["SET", "b", "2"],
            &["EXEC"],
        ],
    ),
    (
        "SCAN and HSCAN read an empty cursor as 0",
        &[
            &["SET", "a", "1"],
            &["HSET", "h", "f", "v"],
            &["SCAN", ""],
            &["HSCAN", "h", ""],
            &["HSCAN", "h", " 1"],
        ],
    ),
    (
        "WATCH sees a field of a watched hash overwritten",
        &[
            &["HMSET", "k2", "f1", "abc", "f2", "abc"],
            &["WATCH", "k2"],
            &["HSET", "k2", "f1", "7"],
            &["MULTI"],
            &["HLEN", "k2"],
            &["EXEC"],
        ],
    ),
    (
        "HSCAN and GETEX look at the key before their options",
        &[
            &["SET", "s", "v"],
            &["HSCAN", "s", "0", "COUNT", "0"],
            &["HSCAN", "nokey", "0", "COUNT", "0"],
            &["GETEX", "nokey", "EX", "0"],
            &["HSET", "h", "f", "v"],
            &["GETEX", "h", "EX", "0"],
            &["GETEX", "s", "EX", "0"],
        ],
    ),
    (
        "an option error quotes the option up to a NUL byte",
        &[&["SET", "k", "v"], &["PEXPIRE", "k", "100000", "a\0b"]],
    ),
    (
        "SORT ALPHA compares up to a NUL byte, and keeps equals in their order; with STORE, \
         byte by byte",
        &[
            &["RPUSH", "l", "", "b\0z", "", "\0\0x", "", "b", "b\0a", "a"],
            &["SORT", "l", "ALPHA"],
            &["SORT", "l", "ALPHA", "DESC"],
            &["SORT", "l", "ALPHA", "STORE", "d"],
            &["LRANGE", "d", "0", "-1"],
            &["HSET", "w_", "f", "x"],
            &["SET", "wb", "b\0b"],
            &["SET", "wa", "b\0a"],
            &["RPUSH", "m", "b", "a", "_"],
            &["SORT", "m", "BY", "w*", "ALPHA"],
            &["SORT", "m", "BY", "w*", "ALPHA", "STORE", "e"],
            &["LRANGE", "e", "0", "-1"],
        ],
    ),
    (
        "a SORT of a set that sorts nothing answers its members in any order",
        &[
            &["SADD", "k2", "", "x y", "a", "b", "c"],
            &["SORT", "k2", "alpha", "BY", "-9223372036854775808"],
            &["SORT", "k2", "BY", "nosort", "LIMIT", "1", "2"],
        ],
    ),
    (
        "a ZINCRBY that leaves the score as it was aborts a WATCH in keel only",
        &[
            &["ZADD", "b", "inf", "10", "3.0", ""],
            &["WATCH", "b"],
            &["ZINCRBY", "b", "1.5", "10"],
            &["MULTI"],
            &["SET", "x", "1"],
            &["EXEC"],
            &["GET", "x"],
        ],
    ),
    (
        "a numeric SORT that Redis refuses for the range error an earlier command left in errno \
         sorts in keel",
        &[
            &["SADD", "k1", "1", "", "-1"],
            &["ZINCRBY", "xy", "1e400", "1"],
            &["SORT", "k1", "DESC"],
        ],
    ),
];

#[test]
fn differential_regressions() {
    let servers = Servers::start();
    for resp3 in [false, true] {
        for (name, sequence) in REGRESSIONS {
            let mut harness = Harness::new(&servers, resp3);
            harness.flush_all();
            for args in *sequence {
                let step = Step {
                    who: Who::Main,
                    args: cmd(args),
                };
                if let Err(mismatch) = harness.run(&step) {
                    panic!("regression \"{name}\" (resp3: {resp3}):\n{mismatch}");
                }
            }
            if let Err(mismatch) = harness.check_contents() {
                panic!("regression \"{name}\" (resp3: {resp3}):\n{mismatch}");
            }
        }
    }
}

/// Runs `writes` (each a step, or several pipelined) on fresh servers, in RESP2 and then in
/// RESP3, panicking at the first reply that differs; with `contents`, the servers' contents
/// must then be equal too.
fn run_writes_on_both(writes: &[Vec<Step>], contents: bool) {
    let servers = Servers::start();
    for resp3 in [false, true] {
        let mut harness = Harness::new(&servers, resp3);
        harness.flush_all();
        for write in writes {
            if let Err(mismatch) = harness.run_write(write) {
                panic!("resp3: {resp3}:\n{mismatch}");
            }
        }
        if contents && let Err(mismatch) = harness.check_contents() {
            panic!("resp3: {resp3}:\n{mismatch}");
        }
    }
}

/// `HINCRBY` of a spread hash adds with the engine's commutative add and replies after the
/// commit, unlike that of a packed hash (which the random sequences mostly build): its
/// replies, its errors (met at commit), in pipelines (one batch in keel), inside `MULTI` and
/// with a second client writing between `WATCH` and `EXEC`, must be Redis's.
#[test]
fn increments_of_spread_hashes_match_redis() {
    let long = "y".repeat(300);
    let main = |args: &[&str]| Step {
        who: Who::Main,
        args: cmd(args),
    };
    let other = |args: &[&str]| Step {
        who: Who::Other,
        args: cmd(args),
    };
    // Each a write: one step, or several pipelined.
    let writes: Vec<Vec<Step>> = vec![
        // Spread at once: a value longer than a packed hash holds.
        vec![main(&["HSET", "h", "long", &long, "n", "5", "s", "abc"])],
        vec![main(&[
            "HSET",
            "h",
            "big",
            "9223372036854775807",
            "neg",
            "-9223372036854775808",
        ])],
        vec![main(&["HINCRBY", "h", "n", "3"])],
        vec![main(&["HINCRBY", "h", "new", "0"])],
        vec![main(&["HLEN", "h"])],
        vec![main(&["HINCRBY", "h", "new", "-7"])],
        vec![main(&["HINCRBY", "h", "s", "1"])],
        vec![main(&["HINCRBY", "h", "long", "0"])],
        vec![main(&["HINCRBY", "h", "big", "1"])],
        vec![main(&["HINCRBY", "h", "big", "-1"])],
        vec![main(&["HINCRBY", "h", "neg", "-1"])],
        vec![main(&["HINCRBY", "h", "n", "x"])],
        vec![main(&["HINCRBY", "h", "n", "9223372036854775807"])],
        vec![main(&["HLEN", "h"])],
        vec![
            main(&["HINCRBY", "h", "p", "1"]),
            main(&["HINCRBY", "h", "p", "2"]),
            main(&["HLEN", "h"]),
        ],
        vec![
            main(&["HINCRBY", "h", "q", "1"]),
            main(&["HINCRBY", "h", "s", "1"]),
            main(&["HINCRBY", "h", "q", "1"]),
            main(&["HINCRBY", "h", "big", "5"]),
            main(&["HGET", "h", "q"]),
        ],
        vec![main(&["MULTI"])],
        vec![main(&["HINCRBY", "h", "m", "1"])],
        vec![main(&["HINCRBY", "h", "m", "2"])],
        vec![main(&["HGET", "h", "m"])],
        vec![main(&["HLEN", "h"])],
        vec![main(&["HDEL", "h", "m"])],
        vec![main(&["HINCRBY", "h", "m", "4"])],
        vec![main(&["HSET", "h", "r", "7"])],
        vec![main(&["HINCRBY", "h", "r", "1"])],
        vec![main(&["HLEN", "h"])],
        vec![main(&["EXEC"])],
        vec![main(&["MULTI"])],
        vec![main(&["HINCRBY", "h", "n", "1"])],
        vec![main(&["HINCRBY", "h", "s", "1"])],
        vec![main(&["EXEC"])],
        vec![main(&["HGET", "h", "n"])],
        // Another client's increment of an existing field is a change, even by 0.
        vec![main(&["WATCH", "h"])],
        vec![other(&["HINCRBY", "h", "n", "0"])],
        vec![main(&["MULTI"])],
        vec![main(&["HINCRBY", "h", "n", "1"])],
        vec![main(&["EXEC"])],
        vec![main(&["WATCH", "h"])],
        vec![other(&["HINCRBY", "h", "s", "1"])],
        vec![main(&["MULTI"])],
        vec![main(&["HINCRBY", "h", "n", "1"])],
        vec![main(&["EXEC"])],
        vec![main(&["HDEL", "h", "n", "new"])],
        vec![main(&["HINCRBY", "h", "n", "2"])],
        vec![main(&["HLEN", "h"])],
        vec![main(&["HGETALL", "h"])],
    ];
    run_writes_on_both(&writes, true);
}

/// `SORT` and `SORT_RO` on fresh servers (see [`sorts`] for why not in the random runs):
/// numbers (integers, floats, text that is not one, bytes after a NUL), ties broken by the
/// elements' bytes, `BY` weights from strings and hash fields (missing ones as 0), `GET`
/// patterns, `LIMIT` at and past the edges, `DESC`, `ALPHA`, `BY` without `*` on lists and
/// sorted sets, `STORE`, and the errors, in RESP2 and RESP3.
#[test]
fn sort_matches_redis() {
    let step = |args: Vec<Vec<u8>>| {
        vec![Step {
            who: Who::Main,
            args,
        }]
    };
    let main = |args: &[&str]| step(cmd(args));
    let mut writes: Vec<Vec<Step>> = vec![
        main(&["RPUSH", "l", "3", "1", "10", "2.5", "-4", "1e2", "07", "1"]),
        main(&["SADD", "s", "b", "a", "c", "10", "9"]),
        main(&["ZADD", "z", "3", "x", "1", "y", "2", "w"]),
        main(&[
            "MSET", "w_x", "5", "w_y", "-1", "w_w", "5", "n_3", "c", "n_1", "a",
        ]),
        main(&["HSET", "h_3", "f", "30", "g", "z"]),
        main(&["HSET", "h_10", "f", "-2"]),
        main(&["RPUSH", "bad", "1", "x", "2"]),
        // C's strtod stops at a NUL: "1\09" sorts as 1, "\05" as 0.
        step(vec![
            b"RPUSH".to_vec(),
            b"nul".to_vec(),
            b"1\x009".to_vec(),
            b"\x005".to_vec(),
            b"0.5".to_vec(),
        ]),
    ];
    let sorts: &[&[&str]] = &[
        &["SORT", "l"],
        &["SORT", "l", "DESC"],
        &["SORT", "l", "LIMIT", "1", "3"],
        &["SORT", "l", "LIMIT", "-2", "2"],
        &["SORT", "l", "LIMIT", "6", "-1"],
        &["SORT", "l", "LIMIT", "20", "5"],
        &["SORT", "l", "ALPHA"],
        &["SORT", "l", "ALPHA", "DESC", "LIMIT", "0", "3"],
        &["SORT", "l", "BY", "nosort"],
        &["SORT", "l", "BY", "nosort", "DESC", "LIMIT", "1", "2"],
        &["SORT", "l", "BY", "h_*->f"],
        &[
            "SORT", "l", "BY", "h_*->f", "GET", "#", "GET", "n_*", "GET", "h_*->g",
        ],
        &["SORT", "l", "BY", "n_*"],
        &["SORT", "l", "GET", "nostar"],
        &["SORT_RO", "l", "DESC", "GET", "#"],
        &["SORT", "s", "ALPHA"],
        &["SORT", "s"],
        &["SORT", "s", "ALPHA", "DESC", "GET", "#", "GET", "w_*"],
        &["SORT", "z"],
        &["SORT", "z", "BY", "w_*"],
        &["SORT", "z", "BY", "w_*", "DESC"],
        &["SORT", "z", "BY", "nosort"],
        &["SORT", "z", "BY", "nosort", "DESC", "LIMIT", "1", "1"],
        &[
            "SORT", "z", "BY", "w_*", "GET", "#", "GET", "w_*", "STORE", "dst",
        ],
        &["LRANGE", "dst", "0", "-1"],
        &["SORT", "s", "BY", "nosort", "STORE", "dst"],
        &["LRANGE", "dst", "0", "-1"],
        &["SORT", "missing", "STORE", "dst"],
        &["EXISTS", "dst"],
        &["SORT", "bad"],
        &["SORT", "nul"],
        &["SORT", "w_x"],
        &["SORT", "l", "LIMIT", "x", "1"],
        &["SORT", "l", "LIMIT", "1"],
        &["SORT", "l", "bogus"],
        &["SORT_RO", "l", "STORE", "dst"],
        &["SORT", "missing"],
    ];
    for args in sorts {
        writes.push(main(args));
    }
    run_writes_on_both(&writes, true);
}

/// `LCS` over strings with many equally long common subsequences and several matching
/// ranges: which subsequence and which ranges it reports (with `IDX`, `MINMATCHLEN`,
/// `WITHMATCHLEN`), and its errors, must be Redis's.
#[test]
fn lcs_matches_redis() {
    let main = |args: &[&str]| {
        vec![Step {
            who: Who::Main,
            args: cmd(args),
        }]
    };
    let pairs = [
        ("ohmytext", "mynewtext"),
        ("abcabcabc", "cbacbacba"),
        ("aaaa", "aa"),
        ("", "abc"),
        ("banana", "atana"),
        ("the quick brown fox", "quick the fox brown"),
        ("xyzzy", "zyxxyzy"),
    ];
    let mut writes: Vec<Vec<Step>> = Vec::new();
    for (a, b) in pairs {
        writes.push(main(&["SET", "a", a]));
        writes.push(main(&["SET", "b", b]));
        for opts in [
            &[][..],
            &["LEN"],
            &["IDX"],
            &["IDX", "WITHMATCHLEN"],
            &["IDX", "MINMATCHLEN", "2", "WITHMATCHLEN"],
            &["IDX", "MINMATCHLEN", "-3"],
        ] {
            let mut args = vec!["LCS", "a", "b"];
            args.extend_from_slice(opts);
            writes.push(main(&args));
            args[1] = "b";
            args[2] = "a";
            writes.push(main(&args));
        }
    }
    writes.push(main(&["LCS", "a", "missing"]));
    writes.push(main(&["LCS", "a", "b", "LEN", "IDX"]));
    writes.push(main(&["LCS", "a", "b", "MINMATCHLEN"]));
    writes.push(main(&["LCS", "a", "b", "MINMATCHLEN", "x"]));
    writes.push(main(&["RPUSH", "l", "x"]));
    writes.push(main(&["LCS", "a", "l"]));
    writes.push(main(&["LCS", "l", "a", "bogus"]));
    writes.push(main(&["SUBSTR", "a", "1", "-2"]));
    run_writes_on_both(&writes, false);
}

/// `ZINCRBY` (and `ZADD … INCR` without conditions) adds with the engine's score add, which
/// moves the member's index entry at commit and replies after it: its replies, its errors
/// (a NaN sum, met at commit), in pipelines (one batch in keel, where a later read of the set
/// resolves the adds early), inside `MULTI` and with a second client writing between `WATCH`
/// and `EXEC`, must be Redis's.
#[test]
fn increments_of_sorted_sets_match_redis() {
    let main = |args: &[&str]| Step {
        who: Who::Main,
        args: cmd(args),
    };
    let other = |args: &[&str]| Step {
        who: Who::Other,
        args: cmd(args),
    };
    let writes: Vec<Vec<Step>> = vec![
        vec![main(&["ZINCRBY", "z", "1.5", "a"])],
        vec![main(&["ZADD", "z", "10", "b", "-3", "c", "inf", "d"])],
        vec![main(&["ZINCRBY", "z", "2", "a"])],
        vec![main(&["ZINCRBY", "z", "-20", "a"])],
        vec![main(&["ZINCRBY", "z", "0", "a"])],
        vec![main(&["ZINCRBY", "z", "0", "new0"])],
        vec![main(&["ZINCRBY", "z", "-inf", "d"])],
        vec![main(&["ZINCRBY", "z", "inf", "d"])],
        vec![main(&["ZINCRBY", "z", "1e308", "b"])],
        vec![main(&["ZINCRBY", "z", "1e308", "b"])],
        vec![main(&["ZINCRBY", "z", "0.1", "c"])],
        vec![main(&["ZINCRBY", "z", "x", "c"])],
        vec![main(&["ZADD", "z", "INCR", "5", "c"])],
        vec![main(&["ZADD", "z", "INCR", "CH", "5", "e"])],
        vec![main(&["ZADD", "z", "XX", "INCR", "5", "f"])],
        vec![main(&["ZRANGE", "z", "0", "-1", "WITHSCORES"])],
        vec![main(&["ZCARD", "z"])],
        vec![main(&["SET", "s", "1"])],
        vec![main(&["ZINCRBY", "s", "1", "a"])],
        // Pipelined: one batch, with reads of the set between the increments.
        vec![
            main(&["ZINCRBY", "z", "1", "p"]),
            main(&["ZINCRBY", "z", "2", "p"]),
            main(&["ZINCRBY", "z", "1", "a"]),
            main(&["ZRANGE", "z", "0", "-1", "WITHSCORES"]),
            main(&["ZINCRBY", "z", "4", "p"]),
            main(&["ZSCORE", "z", "p"]),
            main(&["ZRANK", "z", "p"]),
        ],
        vec![
            main(&["ZINCRBY", "z", "3", "q"]),
            main(&["ZREM", "z", "q"]),
            main(&["ZINCRBY", "z", "3", "q"]),
            main(&["ZINCRBY", "z", "1", "q"]),
            main(&["ZCARD", "z"]),
        ],
        vec![
            main(&["ZINCRBY", "z", "1", "r"]),
            main(&["ZINCRBY", "z", "-inf", "d"]),
            main(&["ZINCRBY", "z", "1", "r"]),
        ],
        vec![
            main(&["ZINCRBY", "y", "1", "a"]),
            main(&["ZINCRBY", "y", "1", "b"]),
            main(&["ZRANGEBYSCORE", "y", "1", "1"]),
            main(&["DEL", "y"]),
            main(&["ZINCRBY", "y", "7", "a"]),
        ],
        vec![main(&["MULTI"])],
        vec![main(&["ZINCRBY", "z", "1", "m"])],
        vec![main(&["ZINCRBY", "z", "2", "m"])],
        vec![main(&["ZSCORE", "z", "m"])],
        vec![main(&["ZREM", "z", "m"])],
        vec![main(&["ZINCRBY", "z", "4", "m"])],
        vec![main(&["ZADD", "z", "7", "n"])],
        vec![main(&["ZINCRBY", "z", "1", "n"])],
        vec![main(&["ZRANGE", "z", "0", "-1", "WITHSCORES"])],
        vec![main(&["EXEC"])],
        vec![main(&["MULTI"])],
        vec![main(&["ZINCRBY", "z", "1", "a"])],
        vec![main(&["ZINCRBY", "z", "-inf", "d"])],
        vec![main(&["EXEC"])],
        vec![main(&["ZSCORE", "z", "a"])],
        // Another client's increment of a member is a change; by 0 it is not (Redis).
        vec![main(&["WATCH", "z"])],
        vec![other(&["ZINCRBY", "z", "1", "a"])],
        vec![main(&["MULTI"])],
        vec![main(&["ZINCRBY", "z", "1", "a"])],
        vec![main(&["EXEC"])],
        vec![main(&["WATCH", "z"])],
        vec![other(&["ZINCRBY", "z", "0", "a"])],
        vec![main(&["MULTI"])],
        vec![main(&["ZINCRBY", "z", "1", "a"])],
        vec![main(&["EXEC"])],
        vec![main(&["ZREM", "z", "a", "b"])],
        vec![main(&["ZINCRBY", "z", "2", "a"])],
        vec![main(&[
            "ZRANGE",
            "z",
            "-inf",
            "+inf",
            "BYSCORE",
            "WITHSCORES",
        ])],
    ];
    run_writes_on_both(&writes, true);
}

/// `OBJECT ENCODING` and `REFCOUNT` of values built in one command, at the edges of Redis's
/// default thresholds, compared exactly (random sequences allow for history: see
/// [`encodings_agree`]); and `OBJECT HELP`, `FREQ` and an absent key, in both protocols.
#[test]
fn object_encodings_match_redis() {
    let servers = Servers::start();
    let many = |n: usize, item: &dyn Fn(usize) -> Vec<String>| -> Vec<String> {
        (0..n).flat_map(item).collect()
    };
    let x = |n: usize| "x".repeat(n);
    let mut builds: Vec<Vec<String>> = [
        "123",
        "-5",
        "0",
        "9999",
        "10000",
        "-0",
        "01",
        "1.5",
        "",
        "abc",
        "9223372036854775807",
        "12345678901234567890",
    ]
    .iter()
    .map(|v| vec!["SET".to_string(), v.to_string()])
    .collect();
    builds.extend([
        vec!["SET".into(), x(44)],
        vec!["SET".into(), x(45)],
        vec!["SET".into(), "77".into(), "EX".into(), "1000".into()],
        vec!["HSET".into(), "f".into(), "v".into()],
        vec!["HSET".into(), x(64), x(64)],
        vec!["HSET".into(), "f".into(), x(65)],
        vec!["HSET".into(), x(65), "v".into()],
        vec!["SADD".into(), "1".into(), "-3".into()],
        vec!["SADD".into(), "1".into(), "a".into()],
        vec!["SADD".into(), "-0".into()],
        vec!["SADD".into(), "01".into()],
        vec!["SADD".into(), "9223372036854775808".into()],
        vec!["ZADD".into(), "1".into(), "a".into()],
        vec!["ZADD".into(), "1".into(), x(64)],
        vec!["ZADD".into(), "1".into(), x(65)],
        vec!["RPUSH".into(), "a".into()],
    ]);
    for (n, field) in [(512, true), (513, true), (128, false), (129, false)] {
        let mut b = vec![if field { "HSET" } else { "ZADD" }.to_string()];
        b.extend(many(n, &|i| vec![i.to_string(), format!("m{i}")]));
        builds.push(b);
    }
    for n in [512, 513] {
        let mut b = vec!["SADD".to_string()];
        b.extend(many(n, &|i| vec![i.to_string()]));
        builds.push(b);
    }
    for resp3 in [false, true] {
        let mut h = Harness::new(&servers, resp3);
        h.flush_all();
        let mut both = |args: &[&str]| {
            let args = cmd(args);
            let keel = h.main.keel.call(&args);
            let redis = h.main.redis.call(&args);
            (keel, redis)
        };
        for (i, build) in builds.iter().enumerate() {
            let key = format!("k{i}");
            let mut args: Vec<&str> = vec![&build[0], &key];
            args.extend(build[1..].iter().map(String::as_str));
            let (keel, redis) = both(&args);
            assert_eq!(keel, redis, "{}", args[..args.len().min(6)].join(" "));
            for sub in ["ENCODING", "REFCOUNT"] {
                let (keel, redis) = both(&["OBJECT", sub, &key]);
                assert_eq!(
                    keel,
                    redis,
                    "OBJECT {sub} after {}",
                    build[..build.len().min(4)].join(" ")
                );
            }
        }
        for args in [
            &["OBJECT", "HELP"][..],
            &["OBJECT", "ENCODING", "nokey"],
            &["OBJECT", "FREQ", "k0"],
            &["OBJECT", "FREQ", "nokey"],
            &["OBJECT", "nosuch", "k0"],
            &["OBJECT", "ENCODING"],
            &["OBJECT"],
        ] {
            let (keel, redis) = both(args);
            assert_eq!(keel, redis, "{}", args.join(" "));
        }
    }
}

/// `WATCH` of collections larger than any bound on what a `WATCH` might record one by one:
/// another client's write to a member far from the start of a watched hash, sorted set, set
/// or list aborts `EXEC` exactly when it does in Redis (which signals a key when a command
/// changed it, also to the value it had), and a write to another collection does not.
#[test]
fn watch_of_large_collections_matches_redis() {
    const N: usize = 2000;
    let build = |head: &[&str], item: &dyn Fn(usize) -> Vec<String>| -> Vec<Vec<u8>> {
        let mut args: Vec<Vec<u8>> = cmd(head);
        args.extend((0..N).flat_map(item).map(String::into_bytes));
        args
    };
    let builds = [
        build(&["HSET", "h"], &|i| vec![format!("f{i:04}"), i.to_string()]),
        build(&["ZADD", "z"], &|i| vec![i.to_string(), format!("m{i:04}")]),
        build(&["ZADD", "y"], &|i| vec![i.to_string(), format!("m{i:04}")]),
        build(&["SADD", "s"], &|i| vec![format!("m{i:04}")]),
        build(&["RPUSH", "l"], &|i| vec![i.to_string()]),
        cmd(&["RPUSH", "one", "only"]),
    ];
    // (the key watched, another client's write)
    let writes: &[(&str, &[&str])] = &[
        ("h", &["HINCRBY", "h", "f1500", "1"]),
        ("h", &["HINCRBY", "h", "f1500", "0"]),
        ("h", &["HINCRBYFLOAT", "h", "f1500", "0.5"]),
        ("h", &["HSET", "h", "f1500", "new"]),
        ("h", &["HSET", "h", "f1500", "new"]),
        ("h", &["HMSET", "h", "f1999", "x", "f1998", "y"]),
        ("h", &["HSETNX", "h", "f1500", "no"]),
        ("h", &["HSETNX", "h", "added", "1"]),
        ("h", &["HDEL", "h", "nofield"]),
        ("h", &["HDEL", "h", "added"]),
        ("h", &["HSET", "h2", "f1500", "elsewhere"]),
        ("z", &["ZADD", "z", "1500.5", "m1500"]),
        ("z", &["ZADD", "z", "1500.5", "m1500"]),
        ("z", &["ZINCRBY", "z", "1", "m1500"]),
        ("z", &["ZINCRBY", "z", "0", "m1500"]),
        ("z", &["ZADD", "z", "XX", "CH", "5", "m1999"]),
        ("z", &["ZADD", "z", "GT", "3000", "m1999"]),
        ("z", &["ZADD", "z", "GT", "1", "m1999"]),
        ("z", &["ZADD", "z", "LT", "9000", "m1600"]),
        ("z", &["ZADD", "z", "NX", "7", "m1600"]),
        ("z", &["ZADD", "z", "INCR", "-2", "m1600"]),
        ("z", &["ZADD", "z", "XX", "1", "absent"]),
        ("z", &["ZADD", "y", "7", "m1500"]),
        ("z", &["ZINCRBY", "y", "1", "m1800"]),
        ("s", &["SADD", "s", "m1500"]),
        ("s", &["SREM", "s", "nomember"]),
        ("s", &["SMOVE", "s", "s", "m1500"]),
        ("s", &["SMOVE", "s", "t", "m1500"]),
        ("s", &["SMOVE", "t", "s", "m1500"]),
        ("l", &["LSET", "l", "1500", "x"]),
        ("l", &["LSET", "l", "1500", "x"]),
        ("l", &["LMOVE", "l", "l", "LEFT", "RIGHT"]),
        ("l", &["LINSERT", "l", "BEFORE", "nopivot", "x"]),
        ("l", &["LREM", "l", "0", "noelement"]),
        ("l", &["LTRIM", "l", "0", "-1"]),
        ("one", &["LMOVE", "one", "one", "LEFT", "RIGHT"]),
        ("one", &["RPOPLPUSH", "one", "one"]),
    ];
    let servers = Servers::start();
    for resp3 in [false, true] {
        let mut harness = Harness::new(&servers, resp3);
        harness.flush_all();
        for args in &builds {
            let step = Step {
                who: Who::Main,
                args: args.clone(),
            };
            if let Err(mismatch) = harness.run(&step) {
                panic!("resp3: {resp3}:\n{mismatch}");
            }
        }
        let main = |args: &[&str]| Step {
            who: Who::Main,
            args: cmd(args),
        };
        for (key, write) in writes {
            let write = Step {
                who: Who::Other,
                args: cmd(write),
            };
            for step in [
                main(&["WATCH", key]),
                write.clone(),
                main(&["MULTI"]),
                main(&["SET", "marker", "1"]),
                main(&["EXEC"]),
                main(&["DEL", "marker"]),
            ] {
                if let Err(mismatch) = harness.run(&step) {
                    panic!("resp3: {resp3}, WATCH {key}, then {write}:\n{mismatch}");
                }
            }
        }
        if let Err(mismatch) = harness.check_contents() {
            panic!("resp3: {resp3}:\n{mismatch}");
        }
    }
}

/// `MEMORY USAGE`: nil, errors and `HELP`'s shape as Redis's; the numbers are keel's own
/// estimates (its records, not Redis's encodings): a value's bytes are counted whole, a
/// sampled collection comes near the count of all its sub-keys, and more members count
/// more.
#[test]
fn memory_usage_estimates_and_answers_as_redis() {
    let servers = Servers::start();
    let mut h = Harness::new(&servers, false);
    h.flush_all();
    let mut both = |args: &[&str]| h.main.both(args);
    let long = "x".repeat(3000);
    let _ = both(&["SET", "s", &long]);
    let _ = both(&["HSET", "h", "a", "1"]);
    for i in 0..300 {
        let _ = both(&["ZADD", "z", &i.to_string(), &format!("m{i}")]);
        let _ = both(&["RPUSH", "l", &format!("item-{i}")]);
    }
    for args in [
        &["MEMORY", "USAGE", "nokey"][..],
        &["MEMORY", "USAGE", "s", "SAMPLES", "-1"],
        &["MEMORY", "USAGE", "s", "SAMPLES", "x"],
        &["MEMORY", "USAGE", "s", "FOO"],
        &["MEMORY", "USAGE", "s", "SAMPLES"],
        &["MEMORY", "USAGE"],
        &["MEMORY", "NOPE"],
        &["MEMORY"],
    ] {
        let (keel, redis) = both(args);
        assert_eq!(keel, redis, "{}", args.join(" "));
    }
    let (Reply::Array(keel), Reply::Array(redis)) = both(&["MEMORY", "HELP"]) else {
        panic!("MEMORY HELP");
    };
    assert_eq!(keel[0], redis[0]);
    let mut usage = |args: &[&str]| -> i64 {
        match h.main.keel.call(&cmd(args)) {
            Reply::Int(n) => n,
            other => panic!("{}: {other:?}", args.join(" ")),
        }
    };
    let s = usage(&["MEMORY", "USAGE", "s"]);
    assert!((3000..3300).contains(&s), "a 3000-byte value: {s}");
    let small = usage(&["MEMORY", "USAGE", "h"]);
    for key in ["z", "l"] {
        let sampled = usage(&["MEMORY", "USAGE", key]);
        let all = usage(&["MEMORY", "USAGE", key, "SAMPLES", "0"]);
        assert!(all > 3000 && all > 10 * small, "{key}: {all}");
        assert!(
            (sampled - all).abs() * 5 < all,
            "{key}: sampled {sampled}, all {all}"
        );
    }
}

/// `SLOWLOG`: with every command logged, the same entries' arguments as Redis (newest
/// first, long arguments and argument lists cut, `AUTH`'s redacted), the same `LEN` and
/// `RESET`, and Redis' errors; `CONFIG GET|SET` of its two settings.
/// `COMMAND GETKEYS` and `GETKEYSANDFLAGS`, which cluster clients (redis-py's
/// `RedisCluster`) ask before routing a command whose keys move: the keys, their flags and
/// the errors, in RESP2 and RESP3, as redis-server answers them.
#[test]
fn command_getkeys_matches_redis() {
    let servers = Servers::start();
    let calls: &[&str] = &[
        "COMMAND GETKEYS",
        "COMMAND GETKEYS get",
        "COMMAND GETKEYS nosuch a",
        "COMMAND GETKEYS ping x",
        "COMMAND GETKEYS get a b",
        "COMMAND GETKEYS set a b",
        "COMMAND GETKEYS mset a 1 b 2",
        "COMMAND GETKEYS mset a 1 b",
        "COMMAND GETKEYS zunionstore d 2 a b weights 1 2",
        "COMMAND GETKEYS zunionstore d 3 a b",
        "COMMAND GETKEYS zunionstore d x a b",
        "COMMAND GETKEYS sort a by w* get # store b",
        "COMMAND GETKEYS object encoding k",
        "COMMAND GETKEYS memory usage k",
        "COMMAND GETKEYS blmpop 0 2 a b left",
        "COMMAND GETKEYS sintercard 2 a b",
        "COMMAND GETKEYS zintercard 2 a b limit 1",
        "COMMAND GETKEYS bzmpop 0 1 a min",
        "COMMAND GETKEYS ssubscribe ch",
        "COMMAND GETKEYS bitop and d a b",
        "command getkeys DEL a b c",
        "COMMAND GETKEYSANDFLAGS get",
        "COMMAND GETKEYSANDFLAGS set a b",
        "COMMAND GETKEYSANDFLAGS set a b nx get",
        "COMMAND GETKEYSANDFLAGS lmove a b left right",
        "COMMAND GETKEYSANDFLAGS zunionstore d 2 a b",
        "COMMAND GETKEYSANDFLAGS sinterstore d a b",
        "COMMAND GETKEYSANDFLAGS copy a b",
        "COMMAND GETKEYSANDFLAGS renamenx a b",
        "COMMAND GETKEYSANDFLAGS sort a store b",
        "COMMAND GETKEYSANDFLAGS lmpop 2 a b left",
        "COMMAND GETKEYSANDFLAGS bitfield a get u8 0",
        "COMMAND GETKEYSANDFLAGS bitfield a incrby u8 0 1",
        "COMMAND GETKEYSANDFLAGS exists a b",
        "COMMAND GETKEYSANDFLAGS lpush l x",
        "COMMAND GETKEYSANDFLAGS del a b",
        "COMMAND GETKEYSANDFLAGS object encoding k",
        "COMMAND GETKEYSANDFLAGS msetnx a 1 b 2",
    ];
    for resp3 in [false, true] {
        let mut pair = Pair::connect(&servers, resp3);
        for call in calls {
            let args: Vec<&str> = call.split(' ').collect();
            let (keel, redis) = pair.both(&args);
            assert_eq!(keel, redis, "{call} (resp3 {resp3})");
        }
    }
}

#[test]
fn slowlog_matches_redis() {
    let servers = Servers::start();
    let mut h = Harness::new(&servers, false);
    h.flush_all();
    let mut both = |args: &[&str]| h.main.both(args);
    let long = "x".repeat(300);
    let mut mset = vec!["MSET".to_owned()];
    for i in 0..20 {
        mset.push(format!("k{i}"));
        mset.push(i.to_string());
    }
    let mset: Vec<&str> = mset.iter().map(String::as_str).collect();
    for args in [
        &["CONFIG", "GET", "slowlog-log-slower-than"][..],
        &["CONFIG", "GET", "slowlog-max-len"],
        &["CONFIG", "SET", "slowlog-log-slower-than", "-2"],
        &["CONFIG", "SET", "slowlog-log-slower-than", "abc"],
        &["CONFIG", "SET", "slowlog-max-len", "-1"],
        &["CONFIG", "SET", "slowlog-max-len", "20"],
        &["CONFIG", "SET", "slowlog-log-slower-than", "0"],
        &["SLOWLOG", "RESET"],
        &["SET", "k", &long],
        &mset,
        &["AUTH", "secret"],
        &["GET", "k"],
        &["SLOWLOG", "LEN"],
        &["SLOWLOG", "GET", "x"],
        &["SLOWLOG", "GET", "-2"],
        &["SLOWLOG", "GET", "1", "2"],
        &["SLOWLOG", "LEN", "x"],
        &["SLOWLOG", "NOPE"],
        &["SLOWLOG", "HELP"],
    ] {
        let (keel, redis) = both(args);
        assert_eq!(keel, redis, "{}", args.join(" "));
    }
    let logged = |reply: Reply| -> Vec<Reply> {
        let Reply::Array(entries) = reply else {
            panic!("SLOWLOG GET: {reply:?}")
        };
        entries
            .into_iter()
            .map(|e| match e {
                Reply::Array(fields) => fields[3].clone(),
                other => panic!("an entry: {other:?}"),
            })
            .collect()
    };
    // RESET, SET, MSET, AUTH, GET, LEN, the three GETs that failed running and HELP: not
    // the commands refused before they ran (arity, unknown subcommand), as in Redis.
    let (keel, redis) = both(&["SLOWLOG", "GET", "-1"]);
    let (keel, redis) = (logged(keel), logged(redis));
    assert_eq!(keel, redis);
    assert_eq!(keel.len(), 10, "{keel:?}");
    let (keel, redis) = both(&["SLOWLOG", "GET", "2"]);
    assert_eq!(logged(keel), logged(redis));
    // A shorter length drops the oldest at once.
    let (keel, redis) = both(&["CONFIG", "SET", "slowlog-max-len", "3"]);
    assert_eq!(keel, redis);
    let (keel, redis) = both(&["SLOWLOG", "GET", "-1"]);
    let (keel, redis) = (logged(keel), logged(redis));
    assert_eq!(keel, redis);
    assert_eq!(keel.len(), 3, "{keel:?}");
    let (keel, redis) = both(&["CONFIG", "SET", "slowlog-log-slower-than", "10000"]);
    assert_eq!(keel, redis);
}

/// Redis' encoding thresholds: `CONFIG SET` under their names and Redis 6 aliases, `CONFIG
/// GET`, the errors for bad values, and `OBJECT ENCODING` answering by the values set.
#[test]
fn encoding_thresholds_set_by_config_match_redis() {
    let servers = Servers::start();
    let mut h = Harness::new(&servers, false);
    h.flush_all();
    let mut both = |args: &[&str]| h.main.both(args);
    for args in [
        &["CONFIG", "SET", "hash-max-listpack-entries", "3"][..],
        &["CONFIG", "SET", "hash-max-ziplist-value", "5"],
        &["CONFIG", "SET", "zset-max-listpack-entries", "2"],
        &["CONFIG", "SET", "zset-max-ziplist-value", "4"],
        &["CONFIG", "SET", "set-max-intset-entries", "2"],
        &["CONFIG", "SET", "list-max-listpack-size", "-3"],
        &["CONFIG", "SET", "list-compress-depth", "1"],
        &["CONFIG", "SET", "hash-max-listpack-entries", "-1"],
        &["CONFIG", "SET", "hash-max-listpack-entries", "many"],
        &["CONFIG", "SET", "list-max-listpack-size", "99999999999"],
        &["CONFIG", "SET", "list-compress-depth", "-1"],
        &["CONFIG", "GET", "hash-max-listpack-entries"],
        &["CONFIG", "GET", "hash-max-ziplist-entries"],
        &["CONFIG", "GET", "zset-max-listpack-value"],
        &["CONFIG", "GET", "set-max-intset-entries"],
        &["CONFIG", "GET", "list-max-ziplist-size"],
        &["CONFIG", "GET", "list-compress-depth"],
        // keel never evicts: Redis' defaults, which set to themselves change nothing.
        &["CONFIG", "GET", "maxmemory"],
        &["CONFIG", "GET", "maxmemory-policy"],
        &["CONFIG", "SET", "maxmemory", "0"],
        &["CONFIG", "SET", "maxmemory-policy", "noeviction"],
        // No RDB snapshots on either (tools switch them off so).
        &["CONFIG", "SET", "save", ""],
        &["CONFIG", "GET", "save"],
        &["HSET", "h3", "a", "1", "b", "2", "c", "3"],
        &["HSET", "h4", "a", "1", "b", "2", "c", "3", "d", "4"],
        &["HSET", "hv", "a", "123456"],
        &["ZADD", "z2", "1", "a", "2", "b"],
        &["ZADD", "z3", "1", "a", "2", "b", "3", "c"],
        &["ZADD", "zv", "1", "abcde"],
        &["SADD", "s2", "1", "2"],
        &["SADD", "s3", "1", "2", "3"],
        &["OBJECT", "ENCODING", "h3"],
        &["OBJECT", "ENCODING", "h4"],
        &["OBJECT", "ENCODING", "hv"],
        &["OBJECT", "ENCODING", "z2"],
        &["OBJECT", "ENCODING", "z3"],
        &["OBJECT", "ENCODING", "zv"],
        &["OBJECT", "ENCODING", "s2"],
        &["OBJECT", "ENCODING", "s3"],
    ] {
        let (keel, redis) = both(args);
        assert_eq!(keel, redis, "{}", args.join(" "));
    }
    // A limit or a policy that evicts is refused, and changes nothing.
    for (name, value) in [("maxmemory", "100mb"), ("maxmemory-policy", "allkeys-lru")] {
        match h.main.keel.call(&cmd(&["CONFIG", "SET", name, value])) {
            Reply::Error(e) => {
                let text = String::from_utf8_lossy(&e);
                assert!(text.starts_with("ERR CONFIG SET failed"), "{text}");
                assert!(text.contains("never evicts"), "{text}");
            }
            other => panic!("CONFIG SET {name} {value}: {other:?}"),
        }
        let args = cmd(&["CONFIG", "GET", name]);
        assert_eq!(
            h.main.keel.call(&args),
            h.main.redis.call(&args),
            "unchanged"
        );
    }
    // The durability is chosen at start: `appendfsync` set to what it is changes nothing,
    // anything else is refused, saying how to choose it, and changes nothing.
    let appendfsync =
        |h: &mut Harness| match h.main.keel.call(&cmd(&["CONFIG", "GET", "appendfsync"])) {
            Reply::Array(v) => v[1].clone(),
            other => panic!("CONFIG GET appendfsync: {other:?}"),
        };
    let Reply::Bulk(current) = appendfsync(&mut h) else {
        panic!("appendfsync");
    };
    let current = String::from_utf8(current).expect("ASCII");
    assert_eq!(
        h.main
            .keel
            .call(&cmd(&["CONFIG", "SET", "appendfsync", &current])),
        Reply::Simple(b"OK".to_vec())
    );
    let other = if current == "always" {
        "everysec"
    } else {
        "always"
    };
    match h
        .main
        .keel
        .call(&cmd(&["CONFIG", "SET", "appendfsync", other]))
    {
        Reply::Error(e) => {
            let text = String::from_utf8_lossy(&e);
            assert!(text.starts_with("ERR CONFIG SET failed"), "{text}");
            assert!(text.contains("--durability"), "{text}");
        }
        other => panic!("CONFIG SET appendfsync: {other:?}"),
    }
    assert_eq!(
        appendfsync(&mut h),
        Reply::Bulk(current.into_bytes()),
        "unchanged"
    );
}

fn differential(resp3: bool, default_seed: u64) {
    let ops = std::env::var("KEEL_DIFF_OPS")
        .map(|v| v.parse().expect("KEEL_DIFF_OPS is a number"))
        .unwrap_or(OPS_DEFAULT);
    let seed = std::env::var("KEEL_DIFF_SEED")
        .map(|v| v.parse().expect("KEEL_DIFF_SEED is a number"))
        .unwrap_or(default_seed);
    let servers = Servers::start();
    let mut draw = Gen::new(seed);
    let mut harness = Harness::new(&servers, resp3);
    let mut trace = Vec::with_capacity(ops.min(1 << 20));
    for step_no in 0..ops {
        let write = draw.next_write(&harness.state);
        trace.push(write.clone());
        harness.before_lex_ranges(&write);
        let mut result = harness.run_write(&write);
        if result.is_ok() && (step_no + 1) % STATE_CHECK_EVERY == 0 {
            result = harness.check_contents();
        }
        if let Err(mismatch) = result {
            let report = report(&servers, resp3, seed, step_no, &trace, &mismatch);
            panic!("{report}");
        }
    }
    if let Err(mismatch) = harness.check_contents() {
        let report = report(&servers, resp3, seed, ops, &trace, &mismatch);
        panic!("{report}");
    }
}

/// The failure report: what differed, the steps before it, and a shortened sequence.
fn report(
    servers: &Servers,
    resp3: bool,
    seed: u64,
    step_no: usize,
    trace: &[Vec<Step>],
    mismatch: &Mismatch,
) -> String {
    let proto = if resp3 { "RESP3" } else { "RESP2" };
    let mut text = format!(
        "keel and redis-server differ ({proto}, seed {seed}, step {step_no}):\n{mismatch}\n\
         the last steps:\n"
    );
    for w in &trace[trace.len().saturating_sub(30)..] {
        text.push_str(&format!("  {}\n", show(w)));
    }
    match shrink(servers, resp3, trace) {
        Some(short) => {
            text.push_str(&format!(
                "a shorter sequence that differs ({} steps):\n",
                short.len()
            ));
            for w in &short {
                text.push_str(&format!("  {}\n", show(w)));
            }
        }
        None => text.push_str("(no shorter sequence reproduces it from empty servers)\n"),
    }
    text
}

/// One write of steps: a step alone, or several pipelined.
fn show(write: &[Step]) -> String {
    match write {
        [step] => step.to_string(),
        steps => {
            let steps: Vec<String> = steps.iter().map(Step::to_string).collect();
            format!("pipelined: {}", steps.join(" | "))
        }
    }
}

/// Drops writes from `trace` while a fresh replay still differs at its last write.
fn shrink(servers: &Servers, resp3: bool, trace: &[Vec<Step>]) -> Option<Vec<Vec<Step>>> {
    let started = Instant::now();
    let replays = std::cell::Cell::new(0);
    let fails = |steps: &[Vec<Step>]| -> bool {
        replays.set(replays.get() + 1);
        let mut harness = Harness::new(servers, resp3);
        harness.flush_all();
        for (i, s) in steps.iter().enumerate() {
            harness.before_lex_ranges(s);
            match harness.run_write(s) {
                Ok(()) => {}
                Err(_) => return i + 1 == steps.len(),
            }
        }
        harness.check_contents().is_err()
    };
    if !fails(trace) {
        return None;
    }
    let mut steps = trace.to_vec();
    let mut chunk = steps.len() / 2;
    while chunk >= 1 {
        let mut at = 0;
        // Never drop the last step: it is where the replies differ.
        while at + 1 < steps.len() {
            if replays.get() >= SHRINK_REPLAYS_MAX || started.elapsed() > SHRINK_TIME_MAX {
                return Some(steps);
            }
            let end = (at + chunk).min(steps.len() - 1);
            let candidate: Vec<Vec<Step>> =
                steps[..at].iter().chain(&steps[end..]).cloned().collect();
            if fails(&candidate) {
                steps = candidate;
            } else {
                at = end;
            }
        }
        chunk /= 2;
    }
    Some(steps)
}

// ---------------------------------------------------------------------------------------------
// The servers and the wire.

/// A `redis-server` child process on a free loopback port; killed when dropped.
struct RedisProcess {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl RedisProcess {
    fn start() -> RedisProcess {
        const BINARY: &str = "/usr/bin/redis-server";
        assert!(
            std::path::Path::new(BINARY).exists(),
            "{BINARY} is missing: the differential test needs a real Redis (apt-get install \
             redis-server)"
        );
        for _ in 0..10 {
            let dir = tempfile::tempdir().expect("temp dir");
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port();
            let mut child = Command::new(BINARY)
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                // keel's default, so that bit offsets and string sizes meet the same bound.
                .args(["--proto-max-bulk-len", "16777216"])
                .arg("--dir")
                .arg(dir.path())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("{BINARY} does not start: {e}"));
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break; // The port was taken meanwhile: try another.
                }
                // Still running a moment after the port answers: it is this Redis that
                // answers, not another process that took the port (this one then exits).
                if TcpStream::connect(addr).is_ok() && {
                    std::thread::sleep(Duration::from_millis(50));
                    matches!(child.try_wait(), Ok(None))
                } {
                    return RedisProcess {
                        child,
                        addr,
                        _dir: dir,
                    };
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("{BINARY} did not start listening on a loopback port");
    }
}

impl Drop for RedisProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One keel server and one Redis, shared by a run and the replays that shorten its failure.
struct Servers {
    keel: TestServer,
    redis: RedisProcess,
}

impl Servers {
    fn start() -> Servers {
        Servers {
            keel: TestServer::start(),
            redis: RedisProcess::start(),
        }
    }
}

/// A reply exactly as it came over the wire: RESP2 and RESP3 types stay apart.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Reply {
    Simple(Vec<u8>),
    Error(Vec<u8>),
    Int(i64),
    Bulk(Vec<u8>),
    /// RESP2 `$-1`.
    NullBulk,
    Array(Vec<Reply>),
    /// RESP2 `*-1`.
    NullArray,
    /// RESP3 `_`.
    Null,
    Bool(bool),
    /// RESP3 `,`, as its text.
    Double(Vec<u8>),
    /// RESP3 `(`, as its text.
    BigNumber(Vec<u8>),
    /// RESP3 `!`.
    BlobError(Vec<u8>),
    /// RESP3 `=`: format and text.
    Verbatim(Vec<u8>),
    Map(Vec<(Reply, Reply)>),
    Set(Vec<Reply>),
    Push(Vec<Reply>),
}

impl Reply {
    fn is_error(&self) -> bool {
        matches!(self, Reply::Error(_) | Reply::BlobError(_))
    }

    fn is_ok(&self) -> bool {
        *self == Reply::Simple(b"OK".to_vec())
    }

    fn items(&self) -> Option<&[Reply]> {
        match self {
            Reply::Array(v) | Reply::Set(v) | Reply::Push(v) => Some(v),
            _ => None,
        }
    }

    fn bytes(&self) -> Option<&[u8]> {
        match self {
            Reply::Simple(b) | Reply::Bulk(b) | Reply::Verbatim(b) => Some(b),
            _ => None,
        }
    }
}

fn escaped(b: &[u8]) -> String {
    b.iter()
        .flat_map(|&c| std::ascii::escape_default(c))
        .map(char::from)
        .collect()
}

impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |f: &mut fmt::Formatter<'_>, open: &str, items: &[Reply]| {
            write!(f, "{open}")?;
            for (i, r) in items.iter().enumerate() {
                if i > 0 {
                    write!(f, ", ")?;
                }
                write!(f, "{r}")?;
            }
            write!(f, "]")
        };
        match self {
            Reply::Simple(s) => write!(f, "+{}", escaped(s)),
            Reply::Error(s) => write!(f, "-{}", escaped(s)),
            Reply::Int(n) => write!(f, ":{n}"),
            Reply::Bulk(b) => write!(f, "\"{}\"", escaped(b)),
            Reply::NullBulk => write!(f, "$-1"),
            Reply::NullArray => write!(f, "*-1"),
            Reply::Null => write!(f, "_"),
            Reply::Bool(b) => write!(f, "#{}", if *b { 't' } else { 'f' }),
            Reply::Double(d) => write!(f, ",{}", escaped(d)),
            Reply::BigNumber(d) => write!(f, "({}", escaped(d)),
            Reply::BlobError(s) => write!(f, "!{}", escaped(s)),
            Reply::Verbatim(s) => write!(f, "={}", escaped(s)),
            Reply::Array(v) => list(f, "*[", v),
            Reply::Set(v) => list(f, "~[", v),
            Reply::Push(v) => list(f, ">[", v),
            Reply::Map(m) => {
                write!(f, "%{{")?;
                for (i, (k, v)) in m.iter().enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{k}: {v}")?;
                }
                write!(f, "}}")
            }
        }
    }
}

/// A raw RESP connection.
struct Client {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Client {
    fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        stream.set_nodelay(true).expect("nodelay");
        Client {
            reader: BufReader::new(stream.try_clone().expect("clone")),
            writer: stream,
        }
    }

    fn send(&mut self, args: &[Vec<u8>]) {
        let mut frame = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            frame.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            frame.extend_from_slice(a);
            frame.extend_from_slice(b"\r\n");
        }
        self.writer.write_all(&frame).expect("write a request");
    }

    /// Writes `args` as an inline command: each argument bare, double-quoted with escapes or
    /// single-quoted, picked by the argument's bytes (the same choice on both servers).
    fn send_inline(&mut self, args: &[Vec<u8>]) {
        let mut line = Vec::new();
        for (i, a) in args.iter().enumerate() {
            if i > 0 {
                line.push(b' ');
            }
            let plain = a
                .iter()
                .all(|&c| c.is_ascii_graphic() && !b"\"'\\".contains(&c));
            let pick = a
                .iter()
                .fold(i, |h, &c| h.wrapping_mul(31).wrapping_add(c.into()))
                % 3;
            if plain && !a.is_empty() && pick == 0 {
                line.extend_from_slice(a);
            } else if a
                .iter()
                .all(|&c| c == b' ' || c.is_ascii_graphic() && c != b'\'' && c != b'\\')
                && pick == 1
            {
                line.push(b'\'');
                line.extend_from_slice(a);
                line.push(b'\'');
            } else {
                line.push(b'"');
                for &c in a {
                    match c {
                        b'"' => line.extend_from_slice(b"\\\""),
                        b'\\' => line.extend_from_slice(b"\\\\"),
                        b'\n' => line.extend_from_slice(b"\\n"),
                        b'\r' => line.extend_from_slice(b"\\r"),
                        b'\t' => line.extend_from_slice(b"\\t"),
                        c if c == b' ' || c.is_ascii_graphic() => line.push(c),
                        c => line.extend_from_slice(format!("\\x{c:02x}").as_bytes()),
                    }
                }
                line.push(b'"');
            }
        }
        line.extend_from_slice(b"\r\n");
        self.writer.write_all(&line).expect("write a request");
    }

    fn call(&mut self, args: &[Vec<u8>]) -> Reply {
        self.send(args);
        self.read()
    }

    fn call_str(&mut self, args: &[&str]) -> Reply {
        let args: Vec<Vec<u8>> = args.iter().map(|a| a.as_bytes().to_vec()).collect();
        self.call(&args)
    }

    fn line(&mut self) -> Vec<u8> {
        let mut line = Vec::new();
        self.reader
            .read_until(b'\n', &mut line)
            .expect("read a reply");
        assert!(
            line.ends_with(b"\r\n"),
            "a reply line ends with CRLF: {line:?}"
        );
        line.truncate(line.len() - 2);
        line
    }

    fn read(&mut self) -> Reply {
        let line = self.line();
        let (&kind, rest) = line.split_first().expect("a reply is not empty");
        let text = rest.to_vec();
        let number = |t: &[u8]| -> i64 {
            std::str::from_utf8(t)
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("a number in {}", escaped(&line)))
        };
        let count = |t: &[u8]| usize::try_from(number(t)).expect("a count");
        match kind {
            b'+' => Reply::Simple(text),
            b'-' => Reply::Error(text),
            b':' => Reply::Int(number(&text)),
            b'$' if number(&text) < 0 => Reply::NullBulk,
            b'*' if number(&text) < 0 => Reply::NullArray,
            b'$' => Reply::Bulk(self.blob(count(&text))),
            b'!' => Reply::BlobError(self.blob(count(&text))),
            b'=' => Reply::Verbatim(self.blob(count(&text))),
            b'_' => Reply::Null,
            b'#' => Reply::Bool(text == b"t"),
            b',' => Reply::Double(text),
            b'(' => Reply::BigNumber(text),
            b'*' => Reply::Array((0..count(&text)).map(|_| self.read()).collect()),
            b'~' => Reply::Set((0..count(&text)).map(|_| self.read()).collect()),
            b'>' => Reply::Push((0..count(&text)).map(|_| self.read()).collect()),
            b'%' => Reply::Map(
                (0..count(&text))
                    .map(|_| (self.read(), self.read()))
                    .collect(),
            ),
            _ => panic!("not a RESP reply: {}", escaped(&line)),
        }
    }

    fn blob(&mut self, len: usize) -> Vec<u8> {
        let mut b = vec![0; len + 2];
        self.reader.read_exact(&mut b).expect("read a bulk string");
        assert_eq!(&b[len..], b"\r\n");
        b.truncate(len);
        b
    }
}

// ---------------------------------------------------------------------------------------------
// Running steps on both servers.

/// Which client of the pair sends a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Who {
    /// The client the sequence is about (`MULTI`, `WATCH`, ...).
    Main,
    /// The main client, writing the step as an inline command (quoted as `redis-cli` would),
    /// so that both servers' inline parsers must agree.
    Inline,
    /// A second client, which writes between another's `WATCH` and `EXEC`.
    Other,
}

/// One command of the sequence.
#[derive(Debug, Clone)]
struct Step {
    who: Who,
    args: Vec<Vec<u8>>,
}

impl Step {
    /// Whether the main client sends it.
    fn main(&self) -> bool {
        self.who != Who::Other
    }

    /// Writes the step to `client`, inline or as a multibulk frame.
    fn send(&self, client: &mut Client) {
        if self.who == Who::Inline {
            client.send_inline(&self.args);
        } else {
            client.send(&self.args);
        }
    }

    fn name(&self) -> String {
        String::from_utf8_lossy(&self.args[0]).to_ascii_lowercase()
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.who {
            Who::Other => write!(f, "(other client) ")?,
            Who::Inline => write!(f, "(inline) ")?,
            Who::Main => {}
        }
        for (i, a) in self.args.iter().enumerate() {
            if i > 0 {
                write!(f, " ")?;
            }
            write!(f, "\"{}\"", escaped(a))?;
        }
        Ok(())
    }
}

/// Replies that differ.
struct Mismatch {
    what: String,
    keel: Reply,
    redis: Reply,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "  {}\n  keel:  {}\n  redis: {}",
            self.what, self.keel, self.redis
        )
    }
}

/// What the main client is in the middle of, as the replies say.
#[derive(Debug, Default)]
struct State {
    /// Inside `MULTI`: the names of the commands queued so far.
    multi: Option<Vec<String>>,
    /// `WATCH` is in force.
    watching: bool,
    /// Some client wrote since the latest `WATCH`.
    wrote_since_watch: bool,
    /// The main client ran a `ZINCRBY` since the latest `WATCH` that left the score as it
    /// was (`inf` plus 1.5): no change to Redis, a write to keel (docs/types.md).
    absorbed_since_watch: bool,
    /// The main client's channels, patterns and shard channels.
    subs: [Vec<Vec<u8>>; 3],
}

impl State {
    fn subscribed(&self) -> bool {
        self.subs.iter().any(|s| !s.is_empty())
    }
}

/// For a (un)subscribe command: which of [`State::subs`] it works on, and whether it
/// subscribes.
fn subscription(name: &str) -> Option<(usize, bool)> {
    match name {
        "subscribe" => Some((0, true)),
        "psubscribe" => Some((1, true)),
        "ssubscribe" => Some((2, true)),
        "unsubscribe" => Some((0, false)),
        "punsubscribe" => Some((1, false)),
        "sunsubscribe" => Some((2, false)),
        _ => None,
    }
}

/// `UNSUBSCRIBE` without arguments lists the subscriptions in the server's hash order: the
/// names sorted, each frame keeping its place's count.
fn normalize_unsubscribe_all(frames: Vec<Reply>) -> Vec<Reply> {
    let mut names: Vec<Reply> = frames
        .iter()
        .filter_map(|f| f.items().and_then(|i| i.get(1)).cloned())
        .collect();
    names.sort();
    let mut names = names.into_iter();
    frames
        .into_iter()
        .map(|f| match f {
            Reply::Push(mut v) | Reply::Array(mut v) if v.len() == 3 => {
                v[1] = names.next().expect("one name per frame");
                Reply::Array(v)
            }
            other => other,
        })
        .collect()
}

/// A client on each server.
struct Pair {
    keel: Client,
    redis: Client,
}

impl Pair {
    /// `args` sent to both: keel's reply and Redis's.
    fn both(&mut self, args: &[&str]) -> (Reply, Reply) {
        let args = cmd(args);
        (self.keel.call(&args), self.redis.call(&args))
    }

    fn connect(servers: &Servers, resp3: bool) -> Pair {
        let mut pair = Pair {
            keel: Client::connect(servers.keel.addr),
            redis: Client::connect(servers.redis.addr),
        };
        if resp3 {
            pair.hello3();
        }
        pair
    }

    /// `HELLO 3` on both; the replies differ by design (server name, version, id).
    fn hello3(&mut self) {
        for c in [&mut self.keel, &mut self.redis] {
            let reply = c.call_str(&["HELLO", "3"]);
            assert!(matches!(reply, Reply::Map(_)), "HELLO 3 replied {reply}");
        }
    }
}

struct Harness {
    resp3: bool,
    main: Pair,
    other: Pair,
    /// A RESP2 client of the Redis server for the harness's own `DUMP`/`RESTORE`/`COMMAND`.
    admin: Client,
    /// Redis's flags for each command name seen (`COMMAND INFO`).
    flags: HashMap<String, Vec<String>>,
    state: State,
}

impl Harness {
    fn new(servers: &Servers, resp3: bool) -> Harness {
        Harness {
            resp3,
            main: Pair::connect(servers, resp3),
            other: Pair::connect(servers, resp3),
            admin: Client::connect(servers.redis.addr),
            flags: HashMap::new(),
            state: State::default(),
        }
    }

    fn flush_all(&mut self) {
        for c in [&mut self.main.keel, &mut self.main.redis] {
            let reply = c.call_str(&["FLUSHALL"]);
            assert!(reply.is_ok(), "FLUSHALL replied {reply}");
        }
    }

    /// Whether Redis flags the command `name` with `flag` (`readonly`, `write`).
    fn has_flag(&mut self, name: &str, flag: &str) -> bool {
        if !self.flags.contains_key(name) {
            let reply = self.admin.call_str(&["COMMAND", "INFO", name]);
            let flags = reply
                .items()
                .and_then(|v| v.first())
                .and_then(|info| info.items().map(<[Reply]>::to_vec))
                .and_then(|info| info.get(2).and_then(|f| f.items().map(<[Reply]>::to_vec)))
                .unwrap_or_default()
                .iter()
                .filter_map(|f| f.bytes().map(|b| String::from_utf8_lossy(b).into_owned()))
                .collect();
            self.flags.insert(name.to_string(), flags);
        }
        self.flags[name].iter().any(|f| f == flag)
    }

    /// Sends one write of steps (from [`Gen::next_write`]) to both servers and compares the
    /// replies. Several steps are pipelined: written at once, their replies read after, so
    /// keel runs them as one batch. They are data commands of the main client outside
    /// `MULTI` and `WATCH`, none that the harness must follow up (`SCAN`).
    fn run_write(&mut self, steps: &[Step]) -> Result<(), Mismatch> {
        if let [step] = steps {
            return self.run(step);
        }
        for s in steps {
            s.send(&mut self.main.keel);
            s.send(&mut self.main.redis);
        }
        for (i, s) in steps.iter().enumerate() {
            let name = s.name();
            let keel = normalize(&name, self.main.keel.read());
            let redis = normalize(&name, self.main.redis.read());
            if keel != redis {
                return Err(Mismatch {
                    what: format!("step {} of {} pipelined: {s}", i + 1, steps.len()),
                    keel,
                    redis,
                });
            }
        }
        Ok(())
    }

    /// Sends `step` to both servers and compares the replies.
    fn run(&mut self, step: &Step) -> Result<(), Mismatch> {
        let name = step.name();
        let main = step.main();
        let in_multi = main && self.state.multi.is_some();
        // Allowance: keel rolls back a whole EXEC when a command in it fails; keep what Redis
        // held before, to restore it then.
        let before_exec = (in_multi && name == "exec").then(|| self.dump_redis());
        // Allowance: reads while watching see the WATCH's snapshot in keel.
        let snapshot_read = main
            && !in_multi
            && self.state.watching
            && self.state.wrote_since_watch
            // OBJECT's subcommands only read (Redis gives the container itself no flags).
            && (self.has_flag(&name, "readonly") || name == "object");
        // Allowance: a ZINCRBY that leaves the score as it was is no change to Redis, so it
        // does not abort a WATCH of the key; keel writes it (docs/types.md, "an increment too
        // small to change the score"). The score before, to tell (seed 9311: inf plus 1.5).
        let score_before =
            (main && !in_multi && self.state.watching && name == "zincrby" && step.args.len() == 4)
                .then(|| {
                    self.admin.call(&[
                        b"ZSCORE".to_vec(),
                        step.args[1].clone(),
                        step.args[3].clone(),
                    ])
                });
        // Random picks: what the collection held before, to check the picks against.
        let random =
            main && !in_multi && !snapshot_read && is_random_pick(&name) && step.args.len() > 1;
        let held = if random {
            Some(self.members_in_redis(&name, &step.args[1]))
        } else {
            None
        };
        let pair = if main {
            &mut self.main
        } else {
            &mut self.other
        };
        step.send(&mut pair.keel);
        step.send(&mut pair.redis);
        // (Un)subscribing sends a frame per name, or per subscription when none is named.
        let subscribing = subscription(&name).filter(|_| main && !in_multi);
        if let Some((kind, subscribe)) = subscribing {
            let frames = match step.args.len() {
                1 if subscribe => 1,
                1 => self.state.subs[kind].len().max(1),
                n => n - 1,
            };
            let mut keel: Vec<Reply> = (0..frames).map(|_| pair.keel.read()).collect();
            let mut redis: Vec<Reply> = (0..frames).map(|_| pair.redis.read()).collect();
            if step.args.len() == 1 && !subscribe {
                keel = normalize_unsubscribe_all(keel);
                redis = normalize_unsubscribe_all(redis);
            }
            if keel != redis {
                return Err(Mismatch {
                    what: format!("step: {step}"),
                    keel: Reply::Array(keel),
                    redis: Reply::Array(redis),
                });
            }
            for frame in &keel {
                let Some([_, Reply::Bulk(channel), _]) = frame.items() else {
                    continue;
                };
                let subs = &mut self.state.subs[kind];
                subs.retain(|c| c != channel);
                if subscribe {
                    subs.push(channel.clone());
                }
            }
            return Ok(());
        }
        // Under RESP3 messages to the main client (its own PUBLISH) come before the reply.
        let (mut keel_pushes, mut redis_pushes) = (Vec::new(), Vec::new());
        let mut keel = pair.keel.read();
        while main && matches!(keel, Reply::Push(_)) {
            keel_pushes.push(keel);
            keel = pair.keel.read();
        }
        let mut redis = pair.redis.read();
        while main && matches!(redis, Reply::Push(_)) {
            redis_pushes.push(redis);
            redis = pair.redis.read();
        }
        keel_pushes.sort();
        redis_pushes.sort();
        if keel_pushes != redis_pushes {
            return Err(Mismatch {
                what: format!("messages before the reply to: {step}"),
                keel: Reply::Array(keel_pushes),
                redis: Reply::Array(redis_pushes),
            });
        }
        if name == "pubsub"
            && !in_multi
            && step.args.get(1).is_some_and(|a| {
                a.eq_ignore_ascii_case(b"channels") || a.eq_ignore_ascii_case(b"shardchannels")
            })
        {
            keel = normalize("keys", keel);
            redis = normalize("keys", redis);
        }
        if matches!(name.as_str(), "scan" | "hscan" | "sscan" | "zscan") && !in_multi {
            keel = scan_to_end(&mut pair.keel, step, keel);
            redis = scan_to_end(&mut pair.redis, step, redis);
        }
        if let Some(held) = &held {
            check_picks(step, held, &keel)?;
            if name == "spop" && keel != redis {
                self.follow_keels_pop(&step.args[1], &keel, &redis);
            }
        }
        let queued = self.state.multi.clone().unwrap_or_default();
        let (keel, redis) = if main && name == "exec" {
            (
                normalize_exec(&queued, keel),
                normalize_exec(&queued, redis),
            )
        } else if in_multi {
            (keel, redis)
        } else {
            (normalize(&name, keel), normalize(&name, redis))
        };
        // EXEC's replies: each queued OBJECT ENCODING with the encodings' allowance too.
        let exec_agrees = || match (keel.items(), redis.items()) {
            (Some(k), Some(r)) if main && name == "exec" && k.len() == r.len() => {
                k.iter().zip(r).enumerate().all(|(i, (k, r))| {
                    k == r
                        || (queued.get(i).is_some_and(|q| q == "object") && encodings_agree(k, r))
                })
            }
            _ => false,
        };
        // Allowance: a SORT of a set that does not sort (`BY` a pattern without `*`) and does
        // not STORE gives the set in its hash table's order in Redis (seed 243495557, which a
        // spoilt command made: the generator draws no such SORT). The same elements then, or
        // under LIMIT as many.
        let unsorted_set = main
            && !in_multi
            && matches!(name.as_str(), "sort" | "sort_ro")
            && sorts_nothing(&step.args)
            && self.admin.call(&[b"TYPE".to_vec(), step.args[1].clone()])
                == Reply::Simple(b"set".to_vec());
        // That ZINCRBY's EXEC: keel aborts it, Redis runs it (and is set back, below).
        let absorbed = main
            && in_multi
            && name == "exec"
            && self.state.watching
            && self.state.absorbed_since_watch
            && matches!(keel, Reply::NullArray | Reply::Null)
            && redis.items().is_some();
        // Allowance: Redis 7.0's numeric SORT does not clear `errno` before its `strtod`, so a
        // range error an earlier command left (`ZINCRBY k 1e400 m`) refuses a sort of elements
        // that are all numbers (seed 9150, a spoilt `SORT k ALPHA`: the generator draws no
        // numeric sort, `sort_matches_redis` checks them). keel's sort stands if every element
        // of the key, as Redis holds it, is a number by Redis's own test.
        let mut stale_errno = || {
            main && !in_multi
                && matches!(name.as_str(), "sort" | "sort_ro")
                && redis
                    == Reply::Error(
                        b"ERR One or more scores can't be converted into double".to_vec(),
                    )
                && keel.items().is_some()
                && sorts_elements_by_number(&step.args)
                && self
                    .elements_in_redis(&step.args[1])
                    .is_some_and(|all| all.iter().all(|e| strtod_accepts(e)))
        };
        let agree = keel == redis
            || snapshot_read
            || (name == "object" && encodings_agree(&keel, &redis))
            || exec_agrees()
            || (unsorted_set && same_elements(&step.args, &keel, &redis))
            || stale_errno()
            || absorbed;
        if !agree {
            return Err(Mismatch {
                what: format!("step: {step}"),
                keel,
                redis,
            });
        }
        // The replies agree: follow the client's state.
        if !in_multi && self.has_flag(&name, "write") {
            self.state.wrote_since_watch = true;
        }
        if let Some(before) = score_before
            && before.bytes().is_some()
            && keel.bytes().or(match &keel {
                Reply::Double(d) => Some(d),
                _ => None,
            }) == before.bytes()
        {
            self.state.absorbed_since_watch = true;
        }
        if absorbed {
            // Redis ran what keel did not: Redis as it was before the EXEC, as keel is.
            let before = before_exec.clone().expect("dumped before EXEC");
            self.restore_redis(before);
        }
        if !main {
            // The main client is the only subscriber: read what the publish sent it.
            if let ("publish" | "spublish", Reply::Int(n)) = (name.as_str(), &keel) {
                let n = usize::try_from(*n).expect("a count");
                let mut keel: Vec<Reply> = (0..n).map(|_| self.main.keel.read()).collect();
                let mut redis: Vec<Reply> = (0..n).map(|_| self.main.redis.read()).collect();
                keel.sort();
                redis.sort();
                if keel != redis {
                    return Err(Mismatch {
                        what: format!("messages the main client got from: {step}"),
                        keel: Reply::Array(keel),
                        redis: Reply::Array(redis),
                    });
                }
            }
            return Ok(());
        }
        if let Some(q) = &mut self.state.multi
            && keel == Reply::Simple(b"QUEUED".to_vec())
        {
            q.push(name);
            return Ok(());
        }
        match name.as_str() {
            "multi" if keel.is_ok() => self.state.multi = Some(Vec::new()),
            // With the wrong number of arguments they are refused, and MULTI goes on.
            "exec" | "discard" if in_multi && !is_arity_error(&keel) => {
                self.state.multi = None;
                self.state.watching = false;
                if keel.items().is_some_and(|v| v.iter().any(Reply::is_error)) {
                    let before = before_exec.expect("dumped before EXEC");
                    self.restore_redis(before);
                }
            }
            // A refused EXEC ends MULTI and WATCH, in MULTI or not.
            "exec" if matches!(&keel, Reply::Error(e) if e.starts_with(b"EXECABORT")) => {
                self.state.multi = None;
                self.state.watching = false;
            }
            "watch" if keel.is_ok() => {
                self.state.watching = true;
                self.state.wrote_since_watch = false;
                self.state.absorbed_since_watch = false;
            }
            // Refused to a RESP2 subscriber, which keeps watching.
            "unwatch" if keel.is_ok() => self.state.watching = false,
            "reset" if !keel.is_error() => {
                self.state = State::default();
                if self.resp3 {
                    self.main.hello3();
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// Whether two `OBJECT ENCODING` replies agree but for history: keel answers from the data as
/// it is now, Redis from how the value was built (any string encoding, as `APPEND` leaves
/// `raw`) and never converts a collection back to its compact encoding once it grew past it.
fn encodings_agree(keel: &Reply, redis: &Reply) -> bool {
    let (Reply::Bulk(k), Reply::Bulk(r)) = (keel, redis) else {
        return false;
    };
    let string = |e: &[u8]| matches!(e, b"int" | b"embstr" | b"raw");
    string(k) && string(r)
        || matches!(
            (&k[..], &r[..]),
            (b"listpack", b"hashtable") | (b"intset", b"hashtable") | (b"listpack", b"skiplist")
        )
}

/// Whether a SORT's arguments ask for no sorting (`BY` a pattern without `*`) and no STORE.
fn sorts_nothing(args: &[Vec<u8>]) -> bool {
    let is = |a: &[u8], word: &str| a.eq_ignore_ascii_case(word.as_bytes());
    !args.iter().any(|a| is(a, "STORE"))
        && args
            .windows(2)
            .any(|w| is(&w[0], "BY") && !w[1].contains(&b'*'))
}

/// Whether a SORT's arguments sort the elements themselves as numbers: no `ALPHA`, `BY`,
/// `GET` or `STORE`.
fn sorts_elements_by_number(args: &[Vec<u8>]) -> bool {
    !args.iter().any(|a| {
        ["ALPHA", "BY", "GET", "STORE"]
            .iter()
            .any(|w| a.eq_ignore_ascii_case(w.as_bytes()))
    })
}

/// Whether Redis's SORT takes `element` as a number: C's `strtod` (up to a NUL byte, as a C
/// string ends there) reads all of it, without a range error (with `errno` cleared first,
/// which Redis 7.0 forgets), and not to NaN.
fn strtod_accepts(element: &[u8]) -> bool {
    unsafe extern "C" {
        fn strtod(s: *const std::ffi::c_char, end: *mut *mut std::ffi::c_char) -> f64;
        fn __errno_location() -> *mut std::ffi::c_int;
    }
    const ERANGE: std::ffi::c_int = 34;
    let text = element.split(|&b| b == 0).next().unwrap_or_default();
    let c = std::ffi::CString::new(text).expect("no NUL before the first NUL");
    let mut end = std::ptr::null_mut();
    // SAFETY: `c` is a NUL-terminated string that outlives the call; `end` is written by
    // strtod to point into it; errno is this thread's.
    let (x, errno, rest) = unsafe {
        *__errno_location() = 0;
        let x = strtod(c.as_ptr(), &mut end);
        (x, *__errno_location(), *end)
    };
    rest == 0 && errno != ERANGE && !x.is_nan()
}

/// Whether two replies hold the same elements in any order (under LIMIT: as many).
fn same_elements(args: &[Vec<u8>], keel: &Reply, redis: &Reply) -> bool {
    let (Some(k), Some(r)) = (keel.items(), redis.items()) else {
        return false;
    };
    if args.iter().any(|a| a.eq_ignore_ascii_case(b"LIMIT")) {
        return k.len() == r.len();
    }
    let (mut k, mut r) = (k.to_vec(), r.to_vec());
    k.sort();
    r.sort();
    k == r
}

/// Whether `reply` says the command had the wrong number of arguments.
fn is_arity_error(reply: &Reply) -> bool {
    matches!(reply, Reply::Error(e) if e.starts_with(b"ERR wrong number of arguments"))
}

impl Harness {
    /// The elements Redis holds at `key` (a list's, a set's members, a sorted set's members);
    /// `None` for another type.
    fn elements_in_redis(&mut self, key: &[u8]) -> Option<Vec<Vec<u8>>> {
        let read: &[&[u8]] = match self.admin.call(&[b"TYPE".to_vec(), key.to_vec()]) {
            Reply::Simple(t) if t == b"list" => &[b"LRANGE", b"0", b"-1"],
            Reply::Simple(t) if t == b"set" => &[b"SMEMBERS"],
            Reply::Simple(t) if t == b"zset" => &[b"ZRANGE", b"0", b"-1"],
            _ => return None,
        };
        let mut args = vec![read[0].to_vec(), key.to_vec()];
        args.extend(read[1..].iter().map(|a| a.to_vec()));
        let reply = self.admin.call(&args);
        reply
            .items()?
            .iter()
            .map(|e| match e {
                Reply::Bulk(b) => Some(b.clone()),
                _ => None,
            })
            .collect()
    }

    /// The members (and for a sorted set, each one's score as Redis prints it) that Redis
    /// holds at `key` for the random pick `name`; empty if it holds none or another type.
    fn members_in_redis(&mut self, name: &str, key: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        let reply = if name == "zrandmember" {
            self.admin.call(&[
                b"ZRANGE".to_vec(),
                key.to_vec(),
                b"0".to_vec(),
                b"-1".to_vec(),
                b"WITHSCORES".to_vec(),
            ])
        } else {
            self.admin.call(&[b"SMEMBERS".to_vec(), key.to_vec()])
        };
        let items: Vec<Vec<u8>> = reply
            .items()
            .unwrap_or_default()
            .iter()
            .map(|r| r.bytes().expect("a member is a bulk string").to_vec())
            .collect();
        if name == "zrandmember" {
            items
                .chunks(2)
                .map(|p| (p[0].clone(), p[1].clone()))
                .collect()
        } else {
            items.into_iter().map(|m| (m, Vec::new())).collect()
        }
    }

    /// After an `SPOP` that popped other members from Redis than from keel (each valid): make
    /// Redis's set what keel's is, by giving back what Redis popped and removing what keel
    /// popped. (Never while watching, so no `WATCH` sees it: see [`sets`].)
    fn follow_keels_pop(&mut self, key: &[u8], keel: &Reply, redis: &Reply) {
        for (verb, popped) in [(&b"SADD"[..], redis), (b"SREM", keel)] {
            let members = picked(popped);
            if members.is_empty() {
                continue;
            }
            let mut args = vec![verb.to_vec(), key.to_vec()];
            args.extend(members);
            let reply = self.admin.call(&args);
            assert!(
                matches!(reply, Reply::Int(_)),
                "resyncing SPOP: {} replied {reply}",
                escaped(verb)
            );
        }
    }

    /// Every key Redis holds now, with its `DUMP` and `PTTL`.
    fn dump_redis(&mut self) -> Vec<(Vec<u8>, Vec<u8>, i64)> {
        let keys = match self.admin.call_str(&["KEYS", "*"]) {
            Reply::Array(keys) => keys,
            other => panic!("KEYS * replied {other}"),
        };
        keys.iter()
            .map(|k| {
                let k = k.bytes().expect("a key is a bulk string").to_vec();
                let dump = match self.admin.call(&[b"DUMP".to_vec(), k.clone()]) {
                    Reply::Bulk(b) => b,
                    other => panic!("DUMP {} replied {other}", escaped(&k)),
                };
                // The deadline itself: a PTTL restored later moves it by the time between.
                let ttl = match self.admin.call(&[b"PEXPIRETIME".to_vec(), k.clone()]) {
                    Reply::Int(n) => n.max(0),
                    other => panic!("PEXPIRETIME {} replied {other}", escaped(&k)),
                };
                (k, dump, ttl)
            })
            .collect()
    }

    /// Allowance: Redis's `SORT` converts a sorted set to the skiplist encoding for good, and
    /// a set that once held a long member stays skiplist-encoded. A lex range over members
    /// of different scores (which Redis leaves unspecified) then answers otherwise than over
    /// a listpack, as keel answers (seed 232033173: `ZREMRANGEBYLEX` removed 2 members in
    /// Redis, 0 in keel). Before a write that may run one, unless a `WATCH` could see it,
    /// Redis's skiplist-encoded sets are restored (`DUMP`, `RESTORE ... REPLACE ABSTTL`),
    /// which gives those that fit a listpack their listpack back.
    fn before_lex_ranges(&mut self, write: &[Step]) {
        let lex = |s: &Step| {
            let name = s.name();
            name.contains("lex")
                || name == "exec"
                || (name.starts_with("zrange")
                    && s.args.iter().any(|a| a.eq_ignore_ascii_case(b"BYLEX")))
        };
        if self.state.watching || !write.iter().any(lex) {
            return;
        }
        let Reply::Array(keys) = self.admin.call_str(&["KEYS", "*"]) else {
            return;
        };
        for k in keys {
            let Some(k) = k.bytes().map(<[u8]>::to_vec) else {
                continue;
            };
            let encoding = self
                .admin
                .call(&[b"OBJECT".to_vec(), b"ENCODING".to_vec(), k.clone()]);
            if encoding != Reply::Bulk(b"skiplist".to_vec()) {
                continue;
            }
            let (Reply::Bulk(dump), Reply::Int(deadline)) = (
                self.admin.call(&[b"DUMP".to_vec(), k.clone()]),
                self.admin.call(&[b"PEXPIRETIME".to_vec(), k.clone()]),
            ) else {
                continue;
            };
            let reply = self.admin.call(&[
                b"RESTORE".to_vec(),
                k,
                deadline.max(0).to_string().into_bytes(),
                dump,
                b"REPLACE".to_vec(),
                b"ABSTTL".to_vec(),
            ]);
            assert!(reply.is_ok(), "RESTORE of a sorted set replied {reply}");
        }
    }

    /// Makes Redis hold exactly `keys` (from [`Harness::dump_redis`]), with their deadlines
    /// (Unix ms; 0: none).
    fn restore_redis(&mut self, keys: Vec<(Vec<u8>, Vec<u8>, i64)>) {
        let reply = self.admin.call_str(&["FLUSHALL"]);
        assert!(reply.is_ok(), "restoring Redis: FLUSHALL replied {reply}");
        for (k, dump, ttl) in keys {
            let reply = self.admin.call(&[
                b"RESTORE".to_vec(),
                k,
                ttl.to_string().into_bytes(),
                dump,
                b"ABSTTL".to_vec(),
            ]);
            assert!(reply.is_ok(), "restoring Redis: RESTORE replied {reply}");
        }
    }

    /// Sends `args` to both servers by the second client (the main one may be inside MULTI)
    /// and compares the replies.
    fn read_both(&mut self, args: Vec<Vec<u8>>) -> Result<Reply, Mismatch> {
        let step = Step {
            who: Who::Other,
            args,
        };
        let keel = normalize(&step.name(), self.other.keel.call(&step.args));
        let redis = normalize(&step.name(), self.other.redis.call(&step.args));
        if keel != redis {
            return Err(Mismatch {
                what: format!("contents: {step}"),
                keel,
                redis,
            });
        }
        Ok(keel)
    }

    /// Compares what each server holds: the keys, and each key's type and contents.
    fn check_contents(&mut self) -> Result<(), Mismatch> {
        let keys = self.read_both(cmd(&["KEYS", "*"]))?;
        for key in keys.items().unwrap_or_default() {
            let key = key.bytes().expect("a key is a bulk string").to_vec();
            let kind = self.read_both(vec![b"TYPE".to_vec(), key.clone()])?;
            let kind = String::from_utf8_lossy(kind.bytes().unwrap_or_default()).into_owned();
            for read in contents(&kind, &key) {
                self.read_both(read)?;
            }
        }
        Ok(())
    }
}

/// The reads that show all of a key of type `kind` (as `TYPE` names it).
fn contents(kind: &str, key: &[u8]) -> Vec<Vec<Vec<u8>>> {
    let read = |name: &str| vec![name.as_bytes().to_vec(), key.to_vec()];
    match kind {
        "string" => vec![read("GET"), read("PTTL")],
        "hash" => vec![read("HGETALL"), read("PTTL")],
        "set" => vec![read("SMEMBERS"), read("PTTL")],
        "list" => vec![[read("LRANGE"), cmd(&["0", "-1"])].concat(), read("PTTL")],
        "zset" => vec![
            vec![
                b"ZRANGE".to_vec(),
                key.to_vec(),
                b"0".to_vec(),
                b"-1".to_vec(),
                b"WITHSCORES".to_vec(),
            ],
            read("PTTL"),
        ],
        "none" => vec![],
        other => panic!("no contents read for type {other}: add one to `contents`"),
    }
}

/// Continues a `SCAN` to its end on one server; the reply becomes `[0, every key found]`.
fn scan_to_end(client: &mut Client, step: &Step, first: Reply) -> Reply {
    let mut keys = Vec::new();
    let mut reply = first;
    for _ in 0..10_000 {
        let Some([Reply::Bulk(cursor), Reply::Array(found)]) = reply.items() else {
            return reply;
        };
        keys.extend(found.iter().cloned());
        if cursor == b"0" {
            return Reply::Array(vec![Reply::Bulk(b"0".to_vec()), Reply::Array(keys)]);
        }
        let mut args = step.args.clone();
        // `SCAN cursor ...`, `HSCAN key cursor ...`.
        let at = if step.name() == "scan" { 1 } else { 2 };
        args[at] = cursor.clone();
        reply = client.call(&args);
    }
    panic!("SCAN did not end after 10000 calls");
}

/// A reply in a form where what Redis leaves unspecified (order) does not matter.
fn normalize(name: &str, reply: Reply) -> Reply {
    let sorted = |mut v: Vec<Reply>| {
        v.sort();
        v.dedup();
        v
    };
    // Pairs (field, value) of a flat array, sorted by field.
    let sorted_pairs = |v: Vec<Reply>| {
        let mut pairs: Vec<Vec<Reply>> = v.chunks(2).map(<[Reply]>::to_vec).collect();
        pairs.sort();
        pairs.concat()
    };
    match (name, reply) {
        // Deadlines: both servers set them from their own clocks, a few milliseconds apart,
        // so a TTL is compared by what it says (none, absent, or some time left), not by its
        // value. The generator's TTLs are long enough that none runs out during a run.
        ("ttl" | "pttl" | "expiretime" | "pexpiretime", Reply::Int(n)) if n >= 0 => {
            Reply::Simple(b"<a deadline>".to_vec())
        }
        // A random key: only that there is one is compared.
        ("randomkey", Reply::Bulk(_)) => Reply::Bulk(b"<a key>".to_vec()),
        // OBJECT REFCOUNT of a string depends on how Redis built it (a shared integer from
        // SET, 1 after APPEND); keel answers from the value: compared by shape.
        ("object", Reply::Int(_)) => Reply::Int(1),
        // Redis keeps a small hash in insertion order; keel in field order.
        ("hkeys" | "hvals", Reply::Array(v)) => Reply::Array(sorted_keep_dups(v)),
        ("hgetall", Reply::Array(v)) => Reply::Array(sorted_pairs(v)),
        ("hgetall", Reply::Map(mut v)) => {
            v.sort();
            Reply::Map(v)
        }
        ("hscan", Reply::Array(v)) if v.len() == 2 => {
            let mut v = v;
            if let Some(Reply::Array(items)) = v.pop() {
                v.push(Reply::Array(sorted_pairs(items)));
            }
            Reply::Array(v)
        }
        // Random picks: only the shape is compared.
        ("hrandfield", reply) => shape(reply),
        (name, reply) if is_random_pick(name) => shape_of_picks(reply),
        ("smembers" | "sinter" | "sunion" | "sdiff", Reply::Array(v)) => Reply::Array(sorted(v)),
        ("smembers" | "sinter" | "sunion" | "sdiff", Reply::Set(v)) => Reply::Set(sorted(v)),
        ("zscan", Reply::Array(v)) if v.len() == 2 => {
            let mut v = v;
            if let Some(Reply::Array(items)) = v.pop() {
                v.push(Reply::Array(sorted_pairs(items)));
            }
            Reply::Array(v)
        }
        ("sscan", Reply::Array(v)) if v.len() == 2 => {
            let mut v = v;
            if let Some(Reply::Array(items)) = v.pop() {
                v.push(Reply::Array(sorted(items)));
            }
            Reply::Array(v)
        }
        ("keys", Reply::Array(v)) => Reply::Array(sorted(v)),
        ("keys", Reply::Set(v)) => Reply::Set(sorted(v)),
        ("scan", Reply::Array(v)) if v.len() == 2 => {
            let mut v = v;
            if let Reply::Array(keys) = v.pop().expect("two items") {
                v.push(Reply::Array(sorted(keys)));
            }
            Reply::Array(v)
        }
        (_, reply) => reply,
    }
}

/// Whether `name` picks members at random (its replies are checked, not compared).
fn is_random_pick(name: &str) -> bool {
    matches!(name, "spop" | "srandmember" | "zrandmember")
}

/// A random pick's reply with every string replaced by a placeholder (sets and arrays of
/// pairs included): its structure only.
fn shape_of_picks(reply: Reply) -> Reply {
    match reply {
        Reply::Bulk(_) => Reply::Bulk(b"<picked>".to_vec()),
        Reply::Double(_) => Reply::Double(b"<score>".to_vec()),
        Reply::Array(v) => Reply::Array(v.into_iter().map(shape_of_picks).collect()),
        Reply::Set(v) => Reply::Set(v.into_iter().map(shape_of_picks).collect()),
        other => other,
    }
}

/// The members a random pick's reply names (scores left out).
fn picked(reply: &Reply) -> Vec<Vec<u8>> {
    match reply {
        Reply::Bulk(b) => vec![b.clone()],
        Reply::Array(v) | Reply::Set(v) => v.iter().flat_map(picked).collect(),
        _ => Vec::new(),
    }
}

/// Checks keel's reply to a random pick against what the collection held (`held`: members,
/// with scores as Redis prints them for a sorted set): every member picked is one it held,
/// with its score; `SPOP` and a positive count pick each member at most once.
fn check_picks(step: &Step, held: &[(Vec<u8>, Vec<u8>)], reply: &Reply) -> Result<(), Mismatch> {
    let bad = |why: &str| Mismatch {
        what: format!("step: {step}: {why}"),
        keel: reply.clone(),
        redis: Reply::Array(held.iter().map(|(m, _)| Reply::Bulk(m.clone())).collect()),
    };
    if reply.is_error() {
        return Ok(());
    }
    let withscores = step.name() == "zrandmember"
        && step.args.len() == 4
        && step.args[3].eq_ignore_ascii_case(b"withscores");
    let mut members = Vec::new();
    let flat: Vec<Reply> = match reply {
        Reply::Array(v) | Reply::Set(v) => v
            .iter()
            .flat_map(|r| match r {
                Reply::Array(pair) => pair.clone(),
                other => vec![other.clone()],
            })
            .collect(),
        other => vec![other.clone()],
    };
    let mut it = flat.into_iter();
    while let Some(r) = it.next() {
        let member = match r {
            Reply::Bulk(m) => m,
            Reply::NullBulk | Reply::Null => continue,
            other => return Err(bad(&format!("{other} is not a member"))),
        };
        let Some((_, score)) = held.iter().find(|(m, _)| *m == member) else {
            return Err(bad(&format!("{} was not a member", escaped(&member))));
        };
        if withscores {
            let text = match it.next() {
                Some(Reply::Bulk(t) | Reply::Double(t)) => t,
                other => return Err(bad(&format!("no score after a member: {other:?}"))),
            };
            if text != *score {
                return Err(bad(&format!(
                    "score {} for {}",
                    escaped(&text),
                    escaped(&member)
                )));
            }
        }
        members.push(member);
    }
    let distinct = step.name() == "spop" || step.args.get(2).is_some_and(|n| !n.starts_with(b"-"));
    if distinct {
        let mut unique = members.clone();
        unique.sort();
        unique.dedup();
        if unique.len() != members.len() {
            return Err(bad("a member picked twice"));
        }
    }
    Ok(())
}

/// `v` sorted, duplicates kept (values of different fields may be equal).
fn sorted_keep_dups(mut v: Vec<Reply>) -> Vec<Reply> {
    v.sort();
    v
}

/// A reply with every string replaced by a placeholder: its structure only.
fn shape(reply: Reply) -> Reply {
    match reply {
        Reply::Bulk(_) => Reply::Bulk(b"<picked>".to_vec()),
        Reply::Array(v) => Reply::Array(v.into_iter().map(shape).collect()),
        other => other,
    }
}

/// An `EXEC` reply with each queued command's reply normalized.
fn normalize_exec(queued: &[String], reply: Reply) -> Reply {
    match reply {
        Reply::Array(v) if v.len() == queued.len() => Reply::Array(
            v.into_iter()
                .zip(queued)
                .map(|(r, name)| normalize(name, r))
                .collect(),
        ),
        other => other,
    }
}

// ---------------------------------------------------------------------------------------------
// The generator.

/// SplitMix64: small, seeded, the same everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Draws commands; what a family function gets.
struct Gen {
    rng: Rng,
    /// The main client is inside `MULTI` (families avoid what keel refuses there).
    in_multi: bool,
    /// The main client is watching keys.
    watching: bool,
    /// Unix time (seconds) when the run started, rounded down to a day: absolute deadlines
    /// are drawn on a grid after it, the same for both servers.
    base_secs: i64,
    /// The main client is subscribed to something.
    subscribed: bool,
}

/// A command family: how often it is drawn, and how it draws one command.
struct Family {
    weight: usize,
    draw: fn(&mut Gen) -> Vec<Vec<u8>>,
    /// Whether `errors` may spoil this family's commands (not where a spoilt command could
    /// succeed with a server-specific reply, like `HELLO 4` losing its argument).
    spoil: bool,
}

/// Every family. The `errors` family spoils the others' commands; `transactions` is drawn
/// by [`Gen::step`] itself, which knows whether the client is inside `MULTI`.
static FAMILIES: &[Family] = &[
    Family {
        weight: 30,
        draw: strings,
        spoil: true,
    },
    Family {
        weight: 15,
        draw: counters,
        spoil: true,
    },
    Family {
        weight: 15,
        draw: keys,
        spoil: true,
    },
    Family {
        weight: 10,
        draw: bits,
        spoil: true,
    },
    Family {
        weight: 12,
        draw: expiry,
        spoil: true,
    },
    Family {
        weight: 20,
        draw: hashes,
        spoil: true,
    },
    Family {
        weight: 15,
        draw: sets,
        spoil: true,
    },
    Family {
        weight: 15,
        draw: lists,
        spoil: true,
    },
    Family {
        weight: 2,
        draw: blocking,
        spoil: false,
    },
    Family {
        weight: 20,
        draw: zsets,
        spoil: true,
    },
    Family {
        weight: 6,
        draw: sorts,
        spoil: true,
    },
    Family {
        weight: 4,
        draw: connection,
        spoil: false,
    },
    Family {
        weight: 8,
        draw: errors,
        spoil: false,
    },
    Family {
        weight: 4,
        draw: pubsub,
        spoil: false,
    },
];

impl Gen {
    fn new(seed: u64) -> Gen {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs() as i64;
        Gen {
            rng: Rng(seed),
            in_multi: false,
            watching: false,
            base_secs: now - now % 86_400 + 86_400,
            subscribed: false,
        }
    }

    /// The next write: usually one step; sometimes, outside `MULTI` and `WATCH`, a few data
    /// commands pipelined.
    fn next_write(&mut self, state: &State) -> Vec<Step> {
        if state.multi.is_some() || state.watching || !self.chance(1, 12) {
            return vec![self.step(state)];
        }
        self.in_multi = false;
        let n = 2 + self.rng.below(7);
        let mut steps = Vec::with_capacity(n);
        while steps.len() < n {
            let args = self.family_command(false);
            let step = Step {
                who: Who::Main,
                args,
            };
            // The harness follows a SCAN's cursor with more calls, a subscription's frames
            // and messages, and an SPOP's picks, which a pipeline cannot.
            let name = step.name();
            let pubsub = subscription(&name).is_some()
                || matches!(name.as_str(), "publish" | "spublish" | "pubsub");
            // OBJECT's replies are compared with an allowance a pipeline does not apply.
            if !name.ends_with("scan") && !pubsub && name != "spop" && name != "object" {
                steps.push(step);
            }
        }
        steps
    }

    /// The next step, given what the main client is in the middle of.
    fn step(&mut self, state: &State) -> Step {
        self.in_multi = state.multi.is_some();
        self.watching = state.watching;
        self.subscribed = state.subscribed();
        // A subscriber: the second client publishes to it, or it leaves (under RESP2 it can
        // do little else).
        if self.subscribed && self.chance(1, 3) {
            if self.chance(2, 3) {
                let (name, channel) = if self.chance(1, 4) {
                    ("SPUBLISH", self.channel())
                } else {
                    ("PUBLISH", self.channel())
                };
                let message = self.value();
                return Step {
                    who: Who::Other,
                    args: cmd(&[name, channel, &message]),
                };
            }
            if !self.in_multi {
                let name = self.pick(&["UNSUBSCRIBE", "PUNSUBSCRIBE", "SUNSUBSCRIBE", "RESET"]);
                return Step {
                    who: Who::Main,
                    args: cmd(&[name]),
                };
            }
        }
        let queued = state.multi.as_ref().map_or(0, Vec::len);
        // Inside MULTI, end it after a few commands (EXEC mostly).
        if self.in_multi && self.chance(1 + queued as u32, 8) {
            let args = if self.chance(1, 8) {
                cmd(&["DISCARD"])
            } else {
                cmd(&["EXEC"])
            };
            return Step {
                who: Who::Main,
                args,
            };
        }
        // A second client writes, so that WATCH has something to see.
        if state.watching && self.chance(1, 6) {
            let args = self.write();
            return Step {
                who: Who::Other,
                args,
            };
        }
        if self.chance(1, 10) {
            let args = transactions(self);
            return Step {
                who: Who::Main,
                args,
            };
        }
        let args = self.family_command(false);
        let who = if self.chance(1, 16) {
            Who::Inline
        } else {
            Who::Main
        };
        Step { who, args }
    }

    /// A command of a family picked by weight (only those `errors` may spoil, if `spoilable`).
    fn family_command(&mut self, spoilable: bool) -> Vec<Vec<u8>> {
        let families: Vec<&Family> = FAMILIES.iter().filter(|f| f.spoil || !spoilable).collect();
        let total: usize = families.iter().map(|f| f.weight).sum();
        let mut pick = self.rng.below(total);
        for f in families {
            if pick < f.weight {
                return (f.draw)(self);
            }
            pick -= f.weight;
        }
        unreachable!("the weights add up");
    }

    /// `true` with probability `n / d`.
    fn chance(&mut self, n: u32, d: u32) -> bool {
        self.rng.below(d as usize) < n as usize
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[self.rng.below(from.len())]
    }

    fn key(&mut self) -> &'static str {
        KEYS[self.rng.below(KEYS.len())]
    }

    /// A value: numbers, text, binary, long.
    fn value(&mut self) -> String {
        match self.rng.below(8) {
            0 => "x".repeat(self.rng.below(70)),
            1 => self.int().to_string(),
            _ => self
                .pick(&[
                    "",
                    "0",
                    "1",
                    "-1",
                    "7",
                    "10",
                    "+1",
                    " 1",
                    "01",
                    "-0",
                    "1.5",
                    "-2.25",
                    "3e2",
                    "abc",
                    "hello world",
                    "\u{0}\u{7f}é",
                    "9223372036854775807",
                    "-9223372036854775808",
                    "9223372036854775808",
                    "0x1f",
                    "1 ",
                    "1e400",
                    "inf",
                    "nan",
                    "10.50",
                ])
                .to_string(),
        }
    }

    /// A small integer, sometimes negative.
    fn int(&mut self) -> i64 {
        self.rng.below(41) as i64 - 20
    }

    /// An integer argument: mostly valid, sometimes extreme or not a number.
    fn int_arg(&mut self) -> String {
        if self.chance(3, 4) {
            return self.int().to_string();
        }
        self.pick(&[
            "9223372036854775807",
            "-9223372036854775808",
            "9223372036854775808",
            "-9223372036854775809",
            "abc",
            "",
            "1.0",
            " 3",
            "3 ",
            "+3",
            "0x10",
            "007",
            "-0",
        ])
        .to_string()
    }

    /// A float argument for `INCRBYFLOAT`.
    fn float_arg(&mut self) -> String {
        self.pick(&[
            "0.1",
            "1.5",
            "-2.5",
            "3e2",
            "1e-3",
            "10",
            "-7",
            "0",
            "-0",
            "abc",
            "inf",
            "-inf",
            "nan",
            "",
            " 1",
            "1 ",
            "0x10",
            "1.0e",
            ".5",
            "5.",
            "+1.25",
            "10.5",
            "1000.1",
            "1e308",
            "-1e308",
            "1e4000",
            "1e5000",
            "1e-5000",
            "0x1p-2",
            "1.23456789012345678",
            "infinity",
            "1\u{0}2",
        ])
        .to_string()
    }

    /// A glob pattern for `KEYS` and `SCAN MATCH`.
    fn pattern(&mut self) -> &'static str {
        self.pick(&[
            "*", "a*", "k?", "k[12]", "*b", "[^a]*", "k\\:3", "x{*", "*y", "?", "??", "[a-k]*",
            "k[!1]", "[", "a\\", "*{1}", "**", "nothing", "[a-]", "", "[]]*",
        ])
    }

    /// A hash field: few, so that commands collide.
    fn field(&mut self) -> &'static str {
        self.pick(&["f1", "f2", "f3", "f:4", "", "F1"])
    }

    /// A relative TTL in seconds: long (none runs out during a run), or not in the future
    /// (the key is deleted at once), or not a number.
    fn ttl_secs(&mut self) -> String {
        match self.rng.below(10) {
            0 => self.pick(&["0", "-1", "-100"]).to_string(),
            1 => self.int_arg(),
            _ => (100 * (1 + self.rng.below(50))).to_string(),
        }
    }

    /// An absolute deadline in unix seconds: far ahead of now (a fixed grid from the run's
    /// start, so that GT and LT compare the same way on both servers), or in the past.
    fn unix_secs(&mut self) -> i64 {
        if self.chance(1, 8) {
            return self.pick(&["1", "1000000000"]).parse().expect("a number");
        }
        self.base_secs + 1000 * (1 + self.rng.below(20)) as i64
    }

    /// An absolute deadline in unix seconds on the grid of [`Gen::unix_secs`], never past.
    fn future_secs(&mut self) -> i64 {
        self.base_secs + 1000 * (1 + self.rng.below(20)) as i64
    }

    /// A pub/sub channel.
    fn channel(&mut self) -> &'static str {
        self.pick(&["c1", "c2", "news", "a", "", "x{1}"])
    }

    /// A pub/sub pattern.
    fn channel_pattern(&mut self) -> &'static str {
        self.pick(&["c*", "*", "c?", "n[ae]ws", "x*", "[c", "\\c1", "", "a"])
    }

    /// A set or sorted set member: few, so that commands collide; some are integers (Redis
    /// keeps small integer sets apart).
    fn member(&mut self) -> &'static str {
        self.pick(&["a", "b", "c", "1", "2", "10", "-1", "x y", ""])
    }

    /// Some members, for the commands that take several.
    fn members(&mut self, args: &mut Vec<String>) {
        for _ in 0..=self.rng.below(4) {
            args.push(self.member().to_string());
        }
    }

    /// A plain write, for the second client.
    fn write(&mut self) -> Vec<Vec<u8>> {
        let key = self.key();
        match self.rng.below(11) {
            0 => cmd(&["SET", key, &self.value()]),
            1 => cmd(&["DEL", key]),
            2 => cmd(&["INCR", key]),
            3 => cmd(&["HSET", key, self.field(), &self.value()]),
            4 => cmd(&["EXPIRE", key, &self.ttl_secs()]),
            5 => cmd(&["PERSIST", key]),
            6 => cmd(&["SADD", key, self.member()]),
            7 => {
                let score = self.pick(&["1", "2", "1.5"]);
                cmd(&["ZADD", key, score, self.member()])
            }
            8 => cmd(&["RPUSH", key, self.pick(&["a", "b"])]),
            9 => cmd(&["LPOP", key]),
            _ => cmd(&["APPEND", key, "z"]),
        }
    }
}

fn cmd(args: &[&str]) -> Vec<Vec<u8>> {
    args.iter().map(|a| a.as_bytes().to_vec()).collect()
}

/// Strings: GET, SET and its options, SETNX, GETSET, GETDEL, MGET, MSET, MSETNX, APPEND,
/// STRLEN, GETRANGE, SUBSTR, SETRANGE, LCS.
fn strings(g: &mut Gen) -> Vec<Vec<u8>> {
    let key = g.key();
    match g.rng.below(16) {
        14 => cmd(&["SUBSTR", key, &g.int_arg(), &g.int_arg()]),
        15 => {
            let mut args = vec!["LCS".to_string(), key.to_string(), g.key().to_string()];
            for _ in 0..g.rng.below(4) {
                match g.rng.below(6) {
                    0 => args.extend([
                        "MINMATCHLEN".to_string(),
                        g.pick(&["0", "1", "2", "4", "-1", "x"]).to_string(),
                    ]),
                    _ => args.push(
                        g.pick(&["IDX", "LEN", "WITHMATCHLEN", "idx", "bogus"])
                            .to_string(),
                    ),
                }
            }
            args.iter().map(|a| a.as_bytes().to_vec()).collect()
        }
        0 | 1 => cmd(&["GET", key]),
        2 | 3 => {
            let mut args = vec!["SET".to_string(), key.to_string(), g.value()];
            for _ in 0..g.rng.below(3) {
                match g.rng.below(9) {
                    0 => args.extend(["EX".to_string(), g.ttl_secs()]),
                    1 => args.extend(["px".to_string(), format!("{}000", g.ttl_secs())]),
                    // Future deadlines only: a key set already expired is counted by
                    // `DBSIZE` until each server's expiry cycle deletes it, at times that
                    // differ.
                    2 => args.extend(["EXAT".to_string(), g.future_secs().to_string()]),
                    3 => args.extend(["PXAT".to_string(), format!("{}000", g.future_secs())]),
                    _ => args.push(
                        g.pick(&["NX", "XX", "GET", "KEEPTTL", "nx", "get"])
                            .to_string(),
                    ),
                }
            }
            args.iter().map(|a| a.as_bytes().to_vec()).collect()
        }
        4 => cmd(&["SETNX", key, &g.value()]),
        5 => cmd(&["GETSET", key, &g.value()]),
        6 => cmd(&["GETDEL", key]),
        7 => {
            let mut args = vec!["MGET".to_string()];
            for _ in 0..=g.rng.below(4) {
                args.push(g.key().to_string());
            }
            args.iter().map(|a| a.as_bytes().to_vec()).collect()
        }
        8 | 9 => {
            let mut args = vec![if g.chance(1, 2) { "MSET" } else { "MSETNX" }.to_string()];
            for _ in 0..=g.rng.below(3) {
                args.push(g.key().to_string());
                args.push(g.value());
            }
            args.iter().map(|a| a.as_bytes().to_vec()).collect()
        }
        10 => cmd(&["APPEND", key, &g.value()]),
        11 => cmd(&["STRLEN", key]),
        12 => cmd(&["GETRANGE", key, &g.int_arg(), &g.int_arg()]),
        _ => {
            let offset = if g.chance(1, 8) {
                g.pick(&["-1", "abc", "4294967296", "9223372036854775807"])
                    .to_string()
            } else {
                g.rng.below(12).to_string()
            };
            cmd(&["SETRANGE", key, &offset, &g.value()])
        }
    }
}

/// SORT and SORT_RO over the lists, sets and sorted sets the other families build, with
/// `GET` patterns naming other keys (`k*` names `k1` for element `1`, `*->f` a hash field),
/// `LIMIT`, `ASC`/`DESC` and `STORE`, sorting as text (`ALPHA`), or not at all (`BY` without
/// `*`, with `STORE`). Numeric sorts are left to [`sort_matches_redis`]: Redis 7.0 does not
/// clear `errno` before its `strtod`, so after any overflow the random sequence parses
/// elsewhere it may refuse valid numbers. Also left out, where Redis's reply is not
/// determined: `ALPHA` with a `BY` pattern (its sort is not stable, and weights tie), and `BY`
/// without `*` and without `STORE` (a set then comes in its hash table's order).
fn sorts(g: &mut Gen) -> Vec<Vec<u8>> {
    let ro = g.chance(1, 4);
    let mut args = vec![
        if ro { "SORT_RO" } else { "SORT" }.to_string(),
        g.key().to_string(),
    ];
    let store = !ro && g.chance(1, 3);
    if store && g.chance(1, 3) {
        args.extend(["BY".to_string(), g.pick(&["nosort", "k"]).to_string()]);
    } else {
        args.push(g.pick(&["ALPHA", "alpha"]).to_string());
    }
    for _ in 0..g.rng.below(3) {
        args.extend([
            "GET".to_string(),
            g.pick(&["#", "k*", "*", "k*->f", "*->a", "nostar"])
                .to_string(),
        ]);
    }
    if g.chance(1, 3) {
        args.extend(["LIMIT".to_string(), g.int_arg(), g.int_arg()]);
    }
    if g.chance(1, 2) {
        args.push(g.pick(&["ASC", "DESC", "desc"]).to_string());
    }
    if store {
        args.extend(["STORE".to_string(), g.key().to_string()]);
    }
    if g.chance(1, 20) {
        args.push(g.pick(&["LIMIT", "BY", "bogus", "STORE"]).to_string());
    }
    args.iter().map(|a| a.as_bytes().to_vec()).collect()
}

/// Counters: INCR, INCRBY, DECR, DECRBY, INCRBYFLOAT.
fn counters(g: &mut Gen) -> Vec<Vec<u8>> {
    let key = g.key();
    match g.rng.below(6) {
        0 | 1 => cmd(&["INCR", key]),
        2 => cmd(&["DECR", key]),
        3 => cmd(&["INCRBY", key, &g.int_arg()]),
        4 => cmd(&["DECRBY", key, &g.int_arg()]),
        _ => cmd(&["INCRBYFLOAT", key, &g.float_arg()]),
    }
}

/// Keys: DEL, UNLINK, EXISTS, TYPE, RENAME, KEYS, SCAN, DBSIZE, FLUSHDB, FLUSHALL, COPY,
/// RENAMENX, RANDOMKEY, TOUCH, OBJECT (not IDLETIME: keel keeps no access times), MOVE,
/// SWAPDB.
fn keys(g: &mut Gen) -> Vec<Vec<u8>> {
    let key = g.key();
    // Not DB 1..15: Redis has those databases, keel only 0 (as SELECT).
    let dbs = ["0", "0", "-1", "16", "x", "2147483648", "00"];
    match g.rng.below(29) {
        27 => cmd(&["MOVE", key, g.pick(&dbs)]),
        28 => cmd(&["SWAPDB", g.pick(&dbs), g.pick(&dbs)]),
        20 | 21 => {
            let mut args = vec!["COPY".to_string(), key.to_string(), g.key().to_string()];
            for _ in 0..g.rng.below(3) {
                if g.chance(1, 2) {
                    args.push(g.pick(&["REPLACE", "replace", "REPLAC"]).to_string());
                } else {
                    args.extend(["DB".to_string(), g.pick(&dbs).to_string()]);
                }
            }
            args.iter().map(|a| a.as_bytes().to_vec()).collect()
        }
        22 => cmd(&["RENAMENX", key, g.key()]),
        23 => cmd(&["RANDOMKEY"]),
        24 => {
            let mut args = vec!["TOUCH".to_string()];
            for _ in 0..=g.rng.below(3) {
                args.push(g.key().to_string());
            }
            args.iter().map(|a| a.as_bytes().to_vec()).collect()
        }
        25 | 26 => match g.rng.below(8) {
            0 => cmd(&["OBJECT", g.pick(&["HELP", "help", "nosuch"])]),
            1 => cmd(&["OBJECT", g.pick(&["ENCODING", "FREQ", "HELP"]), key, key]),
            2 => cmd(&["OBJECT", "FREQ", key]),
            3 => cmd(&["OBJECT", "REFCOUNT", key]),
            _ => cmd(&["OBJECT", g.pick(&["ENCODING", "encoding"]), key]),
        },
        0..=2 => {
            let mut args = vec![if g.chance(1, 2) { "DEL" } else { "UNLINK" }.to_string()];
            for _ in 0..=g.rng.below(3) {
                args.push(g.key().to_string());
            }
            args.iter().map(|a| a.as_bytes().to_vec()).collect()
        }
        3..=5 => {
            let mut args = vec!["EXISTS".to_string()];
            for _ in 0..=g.rng.below(3) {
                args.push(g.key().to_string());
            }
            args.iter().map(|a| a.as_bytes().to_vec()).collect()
        }
        6 | 7 => cmd(&["TYPE", key]),
        8..=10 => cmd(&["RENAME", key, g.key()]),
        11 | 12 => cmd(&["KEYS", g.pattern()]),
        13..=16 => {
            let mut args = vec!["SCAN".to_string(), "0".to_string()];
            if g.chance(1, 2) {
                args.extend(["MATCH".to_string(), g.pattern().to_string()]);
            }
            if g.chance(1, 4) {
                args.extend([
                    "TYPE".to_string(),
                    g.pick(&["string", "hash", "list", "set", "zset", "none"])
                        .into(),
                ]);
            }
            if g.in_multi {
                // Inside MULTI the harness cannot follow the cursor: one call must see all.
                args.extend(["COUNT".to_string(), "1000".to_string()]);
            } else if g.chance(1, 2) {
                args.extend(["COUNT".to_string(), (1 + g.rng.below(5)).to_string()]);
            }
            args.iter().map(|a| a.as_bytes().to_vec()).collect()
        }
        17 => cmd(&["DBSIZE"]),
        18 => cmd(&["FLUSHDB", g.pick(&["SYNC", "ASYNC", "sync"])]),
        _ => {
            if g.chance(1, 3) {
                cmd(&["FLUSHALL"])
            } else {
                cmd(&["DBSIZE"])
            }
        }
    }
}

/// Bits: SETBIT, GETBIT, BITCOUNT and BITPOS (with BYTE|BIT ranges), BITOP, BITFIELD and
/// BITFIELD_RO (GET, SET, INCRBY, OVERFLOW, `#` offsets).
fn bits(g: &mut Gen) -> Vec<Vec<u8>> {
    let key = g.key();
    let offset = |g: &mut Gen| -> String {
        if g.chance(1, 10) {
            g.pick(&["-1", "abc", "4294967296", "134217728", "1.5", "+1", "01"])
                .to_string()
        } else {
            g.rng.below(40).to_string()
        }
    };
    let index = |g: &mut Gen| -> String {
        if g.chance(1, 10) {
            g.int_arg()
        } else {
            (g.rng.below(13) as i64 - 6).to_string()
        }
    };
    let args: Vec<String> = match g.rng.below(12) {
        0 | 1 => {
            let bit = if g.chance(1, 10) {
                g.pick(&["2", "-1", "x", "", "01"])
            } else {
                g.pick(&["0", "1"])
            };
            vec!["SETBIT".into(), key.into(), offset(g), bit.into()]
        }
        2 => vec!["GETBIT".into(), key.into(), offset(g)],
        3 | 4 => {
            let mut a = vec!["BITCOUNT".to_string(), key.to_string()];
            if g.chance(2, 3) {
                a.extend([index(g), index(g)]);
                if g.chance(1, 2) {
                    a.push(g.pick(&["BIT", "BYTE", "bit", "bits"]).into());
                }
            } else if g.chance(1, 4) {
                a.push(index(g));
            }
            a
        }
        5 | 6 => {
            let bit = if g.chance(1, 10) {
                g.pick(&["2", "-1", "x"])
            } else {
                g.pick(&["0", "1"])
            };
            let mut a = vec!["BITPOS".to_string(), key.to_string(), bit.to_string()];
            for _ in 0..g.rng.below(3) {
                a.push(index(g));
            }
            if a.len() == 5 && g.chance(1, 2) {
                a.push(g.pick(&["BIT", "BYTE", "Byte", "x"]).into());
            }
            a
        }
        7 | 8 => {
            let op = g.pick(&["AND", "OR", "XOR", "NOT", "and", "nand"]);
            let mut a = vec!["BITOP".to_string(), op.to_string(), key.to_string()];
            let n = if op == "NOT" && g.chance(7, 8) {
                1
            } else {
                1 + g.rng.below(3)
            };
            for _ in 0..n {
                a.push(g.key().to_string());
            }
            a
        }
        _ => {
            let ro = g.chance(1, 4);
            let mut a = vec![
                if ro { "BITFIELD_RO" } else { "BITFIELD" }.to_string(),
                key.to_string(),
            ];
            let ty = |g: &mut Gen| -> String {
                if g.chance(1, 12) {
                    g.pick(&["u64", "i65", "u0", "x8", "I8", "u"]).to_string()
                } else {
                    let bits = 1 + g.rng.below(64);
                    if g.chance(1, 2) && bits < 64 {
                        format!("u{bits}")
                    } else {
                        format!("i{bits}")
                    }
                }
            };
            let field_offset = |g: &mut Gen| -> String {
                if g.chance(1, 4) {
                    format!("#{}", g.rng.below(5))
                } else {
                    offset(g)
                }
            };
            let value = |g: &mut Gen| -> String {
                if g.chance(1, 3) {
                    g.int_arg()
                } else {
                    (g.rng.below(600) as i64 - 300).to_string()
                }
            };
            for _ in 0..g.rng.below(4) {
                match g.rng.below(if ro { 6 } else { 4 }) {
                    0 => {
                        // Not FAIL while watching: see the module docs.
                        let kind = if g.watching {
                            g.pick(&["WRAP", "SAT", "sat", "bad"])
                        } else {
                            g.pick(&["WRAP", "SAT", "FAIL", "sat", "bad"])
                        };
                        a.extend(["OVERFLOW".to_string(), kind.to_string()]);
                    }
                    1 if !ro || g.chance(1, 4) => {
                        a.extend(["SET".to_string(), ty(g), field_offset(g), value(g)]);
                    }
                    2 if !ro => {
                        a.extend(["INCRBY".to_string(), ty(g), field_offset(g), value(g)]);
                    }
                    _ => a.extend(["GET".to_string(), ty(g), field_offset(g)]),
                }
            }
            a
        }
    };
    args.iter().map(|a| a.as_bytes().to_vec()).collect()
}

/// Expiry: EXPIRE, PEXPIRE, EXPIREAT, PEXPIREAT (NX XX GT LT), TTL, PTTL, EXPIRETIME,
/// PEXPIRETIME, PERSIST, SETEX, PSETEX, GETEX. GT and LT only with absolute deadlines: two
/// relative ones of equal length compare by the milliseconds between them, which differ
/// between the servers.
fn expiry(g: &mut Gen) -> Vec<Vec<u8>> {
    let key = g.key();
    match g.rng.below(16) {
        0..=2 => {
            let mut args = vec!["EXPIRE".to_string(), key.to_string(), g.ttl_secs()];
            if g.chance(1, 3) {
                args.push(g.pick(&["NX", "XX", "nx"]).to_string());
            }
            args.iter().map(|a| a.as_bytes().to_vec()).collect()
        }
        3 => cmd(&["PEXPIRE", key, &format!("{}000", g.ttl_secs())]),
        4 | 5 => {
            let ms = g.chance(1, 2);
            let at = g.unix_secs();
            let mut args = if ms {
                vec!["PEXPIREAT".to_string(), key.to_string(), format!("{at}000")]
            } else {
                vec!["EXPIREAT".to_string(), key.to_string(), at.to_string()]
            };
            for _ in 0..g.rng.below(3) {
                args.push(g.pick(&["NX", "XX", "GT", "LT", "gt", "bogus"]).to_string());
            }
            args.iter().map(|a| a.as_bytes().to_vec()).collect()
        }
        6 | 7 => cmd(&[g.pick(&["TTL", "PTTL"]), key]),
        8 => cmd(&[g.pick(&["EXPIRETIME", "PEXPIRETIME"]), key]),
        9 | 10 => cmd(&["PERSIST", key]),
        11 => cmd(&["SETEX", key, &g.ttl_secs(), &g.value()]),
        12 => cmd(&["PSETEX", key, &format!("{}000", g.ttl_secs()), &g.value()]),
        _ => {
            let mut args = vec!["GETEX".to_string(), key.to_string()];
            match g.rng.below(6) {
                0 => args.extend(["EX".to_string(), g.ttl_secs()]),
                1 => args.extend(["PXAT".to_string(), format!("{}000", g.unix_secs())]),
                2 => args.push("PERSIST".to_string()),
                3 => args.extend(["EX".to_string(), g.ttl_secs(), "PERSIST".to_string()]),
                _ => {}
            }
            args.iter().map(|a| a.as_bytes().to_vec()).collect()
        }
    }
}

/// Hashes: HSET, HSETNX, HGET, HMGET, HMSET, HGETALL, HDEL, HLEN, HEXISTS, HKEYS, HVALS,
/// HINCRBY, HINCRBYFLOAT, HSTRLEN, HSCAN, HRANDFIELD.
fn hashes(g: &mut Gen) -> Vec<Vec<u8>> {
    let key = g.key();
    let pairs = |g: &mut Gen, name: &str| {
        let mut args = vec![name.to_string(), key.to_string()];
        for _ in 0..=g.rng.below(3) {
            args.push(g.field().to_string());
            // Now and then a value too long for a packed hash (`hashes::ITEM_BYTES_MAX`):
            // keel spreads the hash, whose commands (`HINCRBY` among them) take other paths.
            if g.chance(1, 20) {
                args.push("y".repeat(256 + g.rng.below(40)));
            } else {
                args.push(g.value());
            }
        }
        args.iter().map(|a| a.as_bytes().to_vec()).collect()
    };
    let fields = |g: &mut Gen, name: &str| {
        let mut args = vec![name.to_string(), key.to_string()];
        for _ in 0..=g.rng.below(3) {
            args.push(g.field().to_string());
        }
        args.iter().map(|a| a.as_bytes().to_vec()).collect()
    };
    match g.rng.below(20) {
        0..=3 => pairs(g, "HSET"),
        4 => pairs(g, "HMSET"),
        5 => cmd(&["HSETNX", key, g.field(), &g.value()]),
        6 | 7 => cmd(&["HGET", key, g.field()]),
        8 => fields(g, "HMGET"),
        9 => cmd(&["HGETALL", key]),
        10 | 11 => fields(g, "HDEL"),
        12 => cmd(&["HLEN", key]),
        13 => cmd(&["HEXISTS", key, g.field()]),
        14 => cmd(&[g.pick(&["HKEYS", "HVALS"]), key]),
        15 => cmd(&["HINCRBY", key, g.field(), &g.int_arg()]),
        16 => cmd(&["HINCRBYFLOAT", key, g.field(), &g.float_arg()]),
        17 => cmd(&["HSTRLEN", key, g.field()]),
        18 => {
            let mut args = vec!["HSCAN".to_string(), key.to_string(), "0".to_string()];
            if g.chance(1, 2) {
                args.extend([
                    "MATCH".to_string(),
                    g.pick(&["f*", "*", "f[12]", "?"]).into(),
                ]);
            }
            if g.in_multi {
                // Inside MULTI the harness cannot follow the cursor: one call must see all.
                args.extend(["COUNT".to_string(), "1000".to_string()]);
            } else if g.chance(1, 3) {
                args.extend(["COUNT".to_string(), g.pick(&["1", "100", "0"]).into()]);
            }
            args.iter().map(|a| a.as_bytes().to_vec()).collect()
        }
        _ => {
            let mut args = vec!["HRANDFIELD".to_string(), key.to_string()];
            if g.chance(2, 3) {
                args.push(g.pick(&["0", "1", "2", "10", "-1", "-3", "x"]).to_string());
                if g.chance(1, 2) {
                    args.push(g.pick(&["WITHVALUES", "withvalues", "bogus"]).to_string());
                }
            }
            args.iter().map(|a| a.as_bytes().to_vec()).collect()
        }
    }
}

/// Sets: SADD, SREM, SMEMBERS, SISMEMBER, SMISMEMBER, SCARD, SPOP, SRANDMEMBER, SMOVE, SINTER,
/// SUNION, SDIFF and their STORE forms, SINTERCARD, SSCAN. `SPOP` picks at random, so the
/// harness makes Redis pop what keel popped; not inside `MULTI` (the harness cannot follow it
/// there) nor while watching (a `WATCH` in Redis would see the harness's writes).
fn sets(g: &mut Gen) -> Vec<Vec<u8>> {
    let key = g.key().to_string();
    let with = |g: &mut Gen, head: &[&str]| {
        let mut args: Vec<String> = head.iter().map(|s| s.to_string()).collect();
        g.members(&mut args);
        args.iter().map(|a| a.as_bytes().to_vec()).collect()
    };
    let keys = |g: &mut Gen, head: &[&str]| {
        let mut args: Vec<String> = head.iter().map(|s| s.to_string()).collect();
        for _ in 0..=g.rng.below(3) {
            args.push(g.key().to_string());
        }
        args.iter().map(|a| a.as_bytes().to_vec()).collect()
    };
    match g.rng.below(22) {
        0..=4 => with(g, &["SADD", &key]),
        5 | 6 => with(g, &["SREM", &key]),
        7 => cmd(&["SMEMBERS", &key]),
        8 => cmd(&["SISMEMBER", &key, g.member()]),
        9 => with(g, &["SMISMEMBER", &key]),
        10 => cmd(&["SCARD", &key]),
        11 if !g.in_multi && !g.watching => {
            if g.chance(1, 2) {
                cmd(&["SPOP", &key])
            } else {
                cmd(&["SPOP", &key, g.pick(&["0", "1", "2", "5", "-1", "x"])])
            }
        }
        11 | 12 => {
            if g.chance(1, 3) {
                cmd(&["SRANDMEMBER", &key])
            } else {
                cmd(&[
                    "SRANDMEMBER",
                    &key,
                    g.pick(&["0", "1", "2", "10", "-1", "-5", "x"]),
                ])
            }
        }
        13 => cmd(&["SMOVE", &key, g.key(), g.member()]),
        14 | 15 => {
            let name = g.pick(&["SINTER", "SUNION", "SDIFF"]);
            keys(g, &[name])
        }
        16 | 17 => {
            let name = g.pick(&["SINTERSTORE", "SUNIONSTORE", "SDIFFSTORE"]);
            keys(g, &[name, &key])
        }
        18 | 19 => {
            let n = 1 + g.rng.below(3);
            let mut args = vec!["SINTERCARD".to_string(), n.to_string()];
            for _ in 0..n {
                args.push(g.key().to_string());
            }
            if g.chance(1, 3) {
                args.extend(["LIMIT".to_string(), g.pick(&["0", "1", "2", "-1"]).into()]);
            }
            if g.chance(1, 8) {
                args[1] = g.pick(&["0", "-1", "9", "x"]).to_string();
            }
            args.iter().map(|a| a.as_bytes().to_vec()).collect()
        }
        _ => {
            let mut args = vec!["SSCAN".to_string(), key.clone(), "0".to_string()];
            if g.chance(1, 2) {
                args.extend([
                    "MATCH".to_string(),
                    g.pick(&["*", "[ab]", "1*", "?"]).into(),
                ]);
            }
            if g.chance(1, 3) {
                args.extend(["COUNT".to_string(), g.pick(&["10", "100", "0"]).into()]);
            }
            args.iter().map(|a| a.as_bytes().to_vec()).collect()
        }
    }
}

/// A list element: mostly from a few, so that `LREM`, `LINSERT` and `LPOS` find matches.
fn element(g: &mut Gen) -> String {
    if g.chance(3, 4) {
        g.pick(&["a", "b", "c", "1"]).to_string()
    } else {
        g.value()
    }
}

/// Lists: every command but the blocking ones.
fn lists(g: &mut Gen) -> Vec<Vec<u8>> {
    let key = g.key();
    let mut args: Vec<String> = Vec::new();
    let mut push = |a: &str| args.push(a.to_string());
    match g.rng.below(23) {
        0..=4 => {
            push(g.pick(&["LPUSH", "RPUSH", "LPUSHX", "RPUSHX", "lpush", "RPUSH"]));
            push(key);
            for _ in 0..=g.rng.below(3) {
                push(&element(g));
            }
        }
        5..=7 => {
            push(g.pick(&["LPOP", "RPOP"]));
            push(key);
            if g.chance(1, 2) {
                push(&(g.rng.below(4)).to_string());
            } else if g.chance(1, 4) {
                push(&g.int_arg());
            }
        }
        8 => {
            push("LLEN");
            push(key);
        }
        9 | 10 => {
            push("LRANGE");
            push(key);
            let (a, b) = (g.int_arg(), g.int_arg());
            push(&a);
            push(&b);
        }
        11 => {
            push("LINDEX");
            push(key);
            push(&g.int_arg());
        }
        12 => {
            push("LSET");
            push(key);
            push(&g.int_arg());
            push(&element(g));
        }
        13 => {
            push("LREM");
            push(key);
            push(&g.int().clamp(-3, 3).to_string());
            push(&element(g));
        }
        14 => {
            push("LTRIM");
            push(key);
            let (a, b) = (g.int_arg(), g.int_arg());
            push(&a);
            push(&b);
        }
        15 | 16 => {
            push("LINSERT");
            push(key);
            push(g.pick(&["BEFORE", "AFTER", "after", "AROUND"]));
            push(&element(g));
            push(&element(g));
        }
        17 => {
            push("LPOS");
            push(key);
            push(&element(g));
            for _ in 0..g.rng.below(3) {
                match g.rng.below(3) {
                    0 => {
                        push("RANK");
                        push(&g.int().clamp(-3, 3).to_string());
                    }
                    1 => {
                        push("COUNT");
                        push(&g.int().clamp(-1, 3).to_string());
                    }
                    _ => {
                        push("MAXLEN");
                        push(&g.int().clamp(-1, 5).to_string());
                    }
                }
            }
        }
        18 | 19 => {
            push("LMOVE");
            push(key);
            push(g.key());
            push(g.pick(&["LEFT", "RIGHT", "left", "UP"]));
            push(g.pick(&["LEFT", "RIGHT", "right"]));
        }
        20 => {
            push("RPOPLPUSH");
            push(key);
            push(g.key());
        }
        _ => {
            push("LMPOP");
            let n = g.rng.below(4);
            push(&n.to_string());
            for _ in 0..n {
                push(g.key());
            }
            push(g.pick(&["LEFT", "RIGHT", "right"]));
            if g.chance(1, 2) {
                push("COUNT");
                push(&g.int().clamp(-1, 4).to_string());
            }
        }
    }
    args.iter().map(|a| a.as_bytes().to_vec()).collect()
}

/// The blocking pops (of lists and sorted sets), only where the reply is deterministic:
/// inside `MULTI` (they never block there), or with a short timeout (nothing else runs while
/// they wait).
fn blocking(g: &mut Gen) -> Vec<Vec<u8>> {
    let timeout = if g.chance(1, 8) {
        g.pick(&["x", "-1", "inf", "", "1e400"])
    } else if g.in_multi {
        g.pick(&["0", "0.01", "5"])
    } else {
        g.pick(&["0.01", "0.02", "0.001"])
    };
    let mut args: Vec<String> = Vec::new();
    if g.chance(1, 4) {
        // The sorted sets' blocking pops.
        if g.chance(1, 3) {
            args.extend(["BZMPOP".to_string(), timeout.to_string()]);
            let n = 1 + g.rng.below(3);
            args.push(if g.chance(1, 10) {
                g.pick(&["0", "x"]).to_string()
            } else {
                n.to_string()
            });
            for _ in 0..n {
                args.push(g.key().to_string());
            }
            args.push(g.pick(&["MIN", "MAX", "LEFT"]).to_string());
            if g.chance(1, 2) {
                args.push("COUNT".to_string());
                args.push(g.pick(&["1", "2", "10", "0"]).to_string());
            }
        } else {
            args.push(g.pick(&["BZPOPMIN", "BZPOPMAX"]).to_string());
            for _ in 0..=g.rng.below(3) {
                args.push(g.key().to_string());
            }
            args.push(timeout.to_string());
        }
        return args.iter().map(|a| a.as_bytes().to_vec()).collect();
    }
    if g.chance(1, 5) {
        args.push("BLMPOP".to_string());
        args.push(timeout.to_string());
        let n = 1 + g.rng.below(3);
        args.push(n.to_string());
        for _ in 0..n {
            args.push(g.key().to_string());
        }
        args.push(g.pick(&["LEFT", "RIGHT"]).to_string());
        if g.chance(1, 2) {
            args.push("COUNT".to_string());
            args.push((1 + g.rng.below(3)).to_string());
        }
        return args.iter().map(|a| a.as_bytes().to_vec()).collect();
    }
    match g.rng.below(4) {
        0 | 1 => {
            args.push(g.pick(&["BLPOP", "BRPOP"]).to_string());
            for _ in 0..=g.rng.below(3) {
                args.push(g.key().to_string());
            }
        }
        2 => {
            args.push("BLMOVE".to_string());
            args.push(g.key().to_string());
            args.push(g.key().to_string());
            args.push(g.pick(&["LEFT", "RIGHT", "DOWN"]).to_string());
            args.push(g.pick(&["LEFT", "RIGHT"]).to_string());
        }
        _ => {
            args.push("BRPOPLPUSH".to_string());
            args.push(g.key().to_string());
            args.push(g.key().to_string());
        }
    }
    args.push(timeout.to_string());
    args.iter().map(|a| a.as_bytes().to_vec()).collect()
}

/// A sorted set score: integers, fractions that print with 17 digits, infinities, and a few
/// that are not scores.
/// Not `-0`: keel stores it as `0`, as Redis's listpack-encoded sets do, but a set that a
/// random `SORT` has read is skiplist-encoded in Redis from then on, and keeps `-0` (seed
/// 263234686); `sorted_set_commands_match_redis` adds `-0` to a listpack set.
fn score(g: &mut Gen) -> &'static str {
    g.pick(&[
        "0", "1", "-1", "2", "1.5", "-2.5", "10", "0.1", "3.0", "1e3", "inf", "-inf", "+inf",
        "0x10", "x", "nan", "1e400", "",
    ])
}

/// One end of a score range.
fn score_bound(g: &mut Gen) -> &'static str {
    g.pick(&[
        "-inf", "+inf", "0", "1", "(1", "2", "(2.5", "10", "(0", "1.5", "(-1", "x", "(", "", " 1",
        "1e400", "nan", "(inf",
    ])
}

/// One end of a lex range.
fn lex_bound(g: &mut Gen) -> &'static str {
    g.pick(&[
        "-", "+", "[a", "(a", "[b", "(c", "[1", "(10", "[", "(", "a", "[x y", "+x",
    ])
}

/// A LIMIT clause's offset and count.
fn limit(g: &mut Gen, args: &mut Vec<String>) {
    args.push("LIMIT".to_string());
    args.push(g.pick(&["0", "1", "2", "-1", "x"]).to_string());
    args.push(g.pick(&["1", "2", "-1", "0", "10"]).to_string());
}

/// Sorted sets: ZADD (NX XX GT LT CH INCR), ZINCRBY, ZREM, ZSCORE, ZMSCORE, ZCARD, ZCOUNT,
/// ZLEXCOUNT, ZRANGE (BYSCORE BYLEX REV LIMIT WITHSCORES) and its older forms, ZRANK,
/// ZREVRANK, ZPOPMIN, ZPOPMAX, ZRANGESTORE, ZUNIONSTORE, ZINTERSTORE, ZREMRANGEBY*, ZSCAN,
/// ZRANDMEMBER, ZUNION, ZINTER, ZDIFF, ZDIFFSTORE, ZINTERCARD, ZMPOP. `ZUNIONSTORE`/`ZINTERSTORE` (and `ZUNION`/`ZINTER`) take at most two inputs: Redis sums inputs in an
/// order its unstable sort picks, and two summands give one result in any order.
fn zsets(g: &mut Gen) -> Vec<Vec<u8>> {
    let key = g.key().to_string();
    let done = |args: Vec<String>| args.iter().map(|a| a.as_bytes().to_vec()).collect();
    let mut args: Vec<String> = Vec::new();
    match g.rng.below(36) {
        0..=6 => {
            args.extend(["ZADD".to_string(), key]);
            for _ in 0..g.rng.below(3) {
                args.push(
                    g.pick(&["NX", "XX", "GT", "LT", "CH", "INCR", "ch", "gt"])
                        .into(),
                );
            }
            let pairs = if g.chance(3, 4) {
                1
            } else {
                1 + g.rng.below(3)
            };
            for _ in 0..pairs {
                args.push(score(g).to_string());
                args.push(g.member().to_string());
            }
        }
        7 | 8 => args.extend([
            "ZINCRBY".to_string(),
            key,
            score(g).to_string(),
            g.member().to_string(),
        ]),
        9 | 10 => {
            args.extend(["ZREM".to_string(), key]);
            g.members(&mut args);
        }
        11 => args.extend(["ZSCORE".to_string(), key, g.member().to_string()]),
        12 => {
            args.extend(["ZMSCORE".to_string(), key]);
            g.members(&mut args);
        }
        13 => args.extend(["ZCARD".to_string(), key]),
        14 => args.extend([
            "ZCOUNT".to_string(),
            key,
            score_bound(g).to_string(),
            score_bound(g).to_string(),
        ]),
        15 => args.extend([
            "ZLEXCOUNT".to_string(),
            key,
            lex_bound(g).to_string(),
            lex_bound(g).to_string(),
        ]),
        16..=18 | 24 => {
            let store = g.rng.below(6) == 0;
            if store {
                args.extend(["ZRANGESTORE".to_string(), g.key().to_string()]);
            } else {
                args.push("ZRANGE".to_string());
            }
            args.push(key);
            let kind = g.rng.below(3);
            let (min, max) = match kind {
                0 => (g.int_arg(), g.int_arg()),
                1 => (score_bound(g).to_string(), score_bound(g).to_string()),
                _ => (lex_bound(g).to_string(), lex_bound(g).to_string()),
            };
            args.extend([min, max]);
            match kind {
                0 => {}
                1 => args.push(g.pick(&["BYSCORE", "byscore"]).into()),
                _ => args.push("BYLEX".to_string()),
            }
            for _ in 0..g.rng.below(3) {
                match g.rng.below(5) {
                    0 | 1 => args.push("REV".to_string()),
                    2 => args.push("WITHSCORES".to_string()),
                    3 => limit(g, &mut args),
                    _ => args.push(g.pick(&["BYSCORE", "BYLEX", "bogus"]).into()),
                }
            }
        }
        19 => {
            let rev = g.chance(1, 2);
            args.push(
                if rev {
                    "ZREVRANGEBYSCORE"
                } else {
                    "ZRANGEBYSCORE"
                }
                .into(),
            );
            args.extend([key, score_bound(g).to_string(), score_bound(g).to_string()]);
            if g.chance(1, 2) {
                args.push("WITHSCORES".to_string());
            }
            if g.chance(1, 3) {
                limit(g, &mut args);
            }
        }
        20 => {
            let rev = g.chance(1, 2);
            args.push(if rev { "ZREVRANGEBYLEX" } else { "ZRANGEBYLEX" }.into());
            args.extend([key, lex_bound(g).to_string(), lex_bound(g).to_string()]);
            if g.chance(1, 3) {
                limit(g, &mut args);
            }
        }
        21 => {
            args.extend(["ZREVRANGE".to_string(), key, g.int_arg(), g.int_arg()]);
            if g.chance(1, 2) {
                args.push("WITHSCORES".to_string());
            }
        }
        22 | 23 => args.extend([
            g.pick(&["ZRANK", "ZREVRANK"]).to_string(),
            key,
            g.member().to_string(),
        ]),
        25 | 26 => {
            args.extend([g.pick(&["ZPOPMIN", "ZPOPMAX"]).to_string(), key]);
            if g.chance(1, 2) {
                args.push(g.pick(&["0", "1", "2", "10", "-1", "x"]).into());
            }
        }
        27 => {
            args.push(g.pick(&["ZUNIONSTORE", "ZINTERSTORE"]).into());
            args.push(key);
            let n = 1 + g.rng.below(2);
            args.push(if g.chance(1, 10) {
                g.pick(&["0", "3", "x", "-1"]).to_string()
            } else {
                n.to_string()
            });
            for _ in 0..n {
                args.push(g.key().to_string());
            }
            if g.chance(1, 3) {
                args.push("WEIGHTS".to_string());
                for _ in 0..n {
                    args.push(g.pick(&["1", "2", "-1", "0.5", "inf", "x"]).into());
                }
            }
            if g.chance(1, 3) {
                args.push("AGGREGATE".to_string());
                args.push(g.pick(&["SUM", "MIN", "MAX", "max", "avg"]).into());
            }
        }
        28 => {
            let name = g.pick(&["ZREMRANGEBYSCORE", "ZREMRANGEBYRANK", "ZREMRANGEBYLEX"]);
            let (min, max) = match name {
                "ZREMRANGEBYSCORE" => (score_bound(g).to_string(), score_bound(g).to_string()),
                "ZREMRANGEBYRANK" => (g.int_arg(), g.int_arg()),
                _ => (lex_bound(g).to_string(), lex_bound(g).to_string()),
            };
            args.extend([name.to_string(), key, min, max]);
        }
        29 => {
            args.extend(["ZSCAN".to_string(), key, "0".to_string()]);
            if g.chance(1, 2) {
                args.extend([
                    "MATCH".to_string(),
                    g.pick(&["*", "[ab]", "1*", "?"]).into(),
                ]);
            }
            if g.chance(1, 3) {
                args.extend(["COUNT".to_string(), g.pick(&["10", "100", "0"]).into()]);
            }
        }
        30 => {
            let name = g.pick(&["ZUNION", "ZINTER", "ZDIFF"]);
            args.push(name.into());
            let n = 1 + g.rng.below(if name == "ZDIFF" { 3 } else { 2 });
            args.push(if g.chance(1, 10) {
                g.pick(&["0", "3", "x", "-1"]).to_string()
            } else {
                n.to_string()
            });
            args.push(key);
            for _ in 1..n {
                args.push(g.key().to_string());
            }
            if g.chance(1, 4) {
                args.push("WEIGHTS".to_string());
                for _ in 0..n {
                    args.push(g.pick(&["1", "2", "-1", "0.5", "inf", "x"]).into());
                }
            }
            if g.chance(1, 4) {
                args.push("AGGREGATE".to_string());
                args.push(g.pick(&["SUM", "MIN", "MAX", "max", "avg"]).into());
            }
            if g.chance(1, 2) {
                args.push(g.pick(&["WITHSCORES", "withscores", "bogus"]).into());
            }
        }
        31 => {
            args.extend(["ZDIFFSTORE".to_string(), g.key().to_string()]);
            let n = 1 + g.rng.below(3);
            args.push(if g.chance(1, 10) {
                g.pick(&["0", "4", "x"]).to_string()
            } else {
                n.to_string()
            });
            args.push(key);
            for _ in 1..n {
                args.push(g.key().to_string());
            }
            if g.chance(1, 8) {
                args.push(g.pick(&["WITHSCORES", "WEIGHTS", "AGGREGATE"]).into());
            }
        }
        32 => {
            args.push("ZINTERCARD".to_string());
            let n = 1 + g.rng.below(3);
            args.push(if g.chance(1, 10) {
                g.pick(&["0", "4", "x"]).to_string()
            } else {
                n.to_string()
            });
            args.push(key);
            for _ in 1..n {
                args.push(g.key().to_string());
            }
            if g.chance(1, 3) {
                args.push(g.pick(&["LIMIT", "limit", "WITHSCORES"]).into());
                args.push(g.pick(&["0", "1", "2", "-1", "x"]).into());
            }
        }
        33 | 34 => {
            args.push("ZMPOP".to_string());
            let n = 1 + g.rng.below(2);
            args.push(if g.chance(1, 10) {
                g.pick(&["0", "3", "x", "-1"]).to_string()
            } else {
                n.to_string()
            });
            args.push(key);
            for _ in 1..n {
                args.push(g.key().to_string());
            }
            args.push(g.pick(&["MIN", "MAX", "max", "LEFT"]).into());
            if g.chance(1, 2) {
                args.push(g.pick(&["COUNT", "count"]).into());
                args.push(g.pick(&["1", "2", "10", "0", "-1", "x"]).into());
            }
        }
        _ => {
            args.extend(["ZRANDMEMBER".to_string(), key]);
            if g.chance(2, 3) {
                args.push(g.pick(&["0", "1", "2", "10", "-1", "-5", "x"]).into());
                if g.chance(1, 2) {
                    args.push(g.pick(&["WITHSCORES", "withscores", "bogus"]).into());
                }
            }
        }
    }
    done(args)
}

/// Connection commands with deterministic replies: PING, ECHO, SELECT, AUTH (no password is
/// set), CLIENT SETNAME/GETNAME, HELLO's errors, ROLE. Inside MULTI only PING, ECHO and ROLE
/// (keel refuses the others there, as documented).
fn connection(g: &mut Gen) -> Vec<Vec<u8>> {
    let choice = if g.in_multi {
        [0, 1, 8][g.rng.below(3)]
    } else {
        g.rng.below(9)
    };
    match choice {
        0 => {
            if g.chance(1, 2) {
                cmd(&["PING"])
            } else {
                cmd(&["PING", &g.value()])
            }
        }
        1 => cmd(&["ECHO", &g.value()]),
        2 => cmd(&["SELECT", g.pick(&["0", "-1", "16", "abc", "99999999999"])]),
        3 => {
            if g.chance(1, 2) {
                cmd(&["AUTH", "secret"])
            } else {
                cmd(&["AUTH", g.pick(&["default", "alice"]), "secret"])
            }
        }
        4 => cmd(&[
            "CLIENT",
            "SETNAME",
            g.pick(&["conn-1", "", "has space", "x\ny"]),
        ]),
        5 => cmd(&["CLIENT", "GETNAME"]),
        6 => cmd(&["HELLO", g.pick(&["4", "1", "abc", "-1"])]),
        7 => cmd(&["HELLO", "2", g.pick(&["SETNAME", "AUTH", "bogus"])]),
        _ if g.chance(1, 8) => cmd(&["ROLE", "extra"]),
        _ => cmd(&["ROLE"]),
    }
}

/// Transactions: MULTI, EXEC, DISCARD, WATCH, UNWATCH, RESET.
/// Pub/sub by the main client: (un)subscribing, its own PUBLISH, PUBSUB, PING. Inside `MULTI`
/// only what keel queues and runs as Redis does.
fn pubsub(g: &mut Gen) -> Vec<Vec<u8>> {
    let names = |g: &mut Gen, name: &str, pattern: bool| {
        let mut args = vec![name.to_string()];
        for _ in 0..g.rng.below(4) {
            let n = if pattern {
                g.channel_pattern()
            } else {
                g.channel()
            };
            args.push(n.to_string());
        }
        args.iter()
            .map(|a| a.as_bytes().to_vec())
            .collect::<Vec<_>>()
    };
    if g.in_multi {
        return match g.rng.below(3) {
            0 => cmd(&["PUBSUB", "NUMPAT"]),
            1 => names(g, "PUBSUB NUMSUB", false)
                .into_iter()
                .flat_map(|a| {
                    if a == b"PUBSUB NUMSUB" {
                        vec![b"PUBSUB".to_vec(), b"NUMSUB".to_vec()]
                    } else {
                        vec![a]
                    }
                })
                .collect(),
            _ => cmd(&["PING"]),
        };
    }
    match g.rng.below(12) {
        0..=2 => names(g, "SUBSCRIBE", false),
        3 | 4 => names(g, "PSUBSCRIBE", true),
        5 => names(g, "SSUBSCRIBE", false),
        6 => names(g, "UNSUBSCRIBE", false),
        7 => names(g, "PUNSUBSCRIBE", true),
        8 => names(g, "SUNSUBSCRIBE", false),
        9 => {
            let name = g.pick(&["PUBLISH", "SPUBLISH"]);
            let channel = g.channel();
            let message = g.value();
            cmd(&[name, channel, &message])
        }
        10 => {
            let sub = g.pick(&[
                "CHANNELS",
                "SHARDCHANNELS",
                "NUMSUB",
                "SHARDNUMSUB",
                "NUMPAT",
                "HELP",
                "nosuch",
            ]);
            let mut args = vec!["PUBSUB".to_string(), sub.to_string()];
            if g.chance(1, 2) {
                args.push(if sub.ends_with("CHANNELS") {
                    g.channel_pattern().to_string()
                } else {
                    g.channel().to_string()
                });
            }
            args.iter().map(|a| a.as_bytes().to_vec()).collect()
        }
        _ => {
            if g.chance(1, 2) {
                cmd(&["PING"])
            } else {
                cmd(&["PING", &g.value()])
            }
        }
    }
}

fn transactions(g: &mut Gen) -> Vec<Vec<u8>> {
    if g.chance(1, 12) {
        // With the wrong number of arguments.
        let name = g.pick(&["MULTI", "EXEC", "DISCARD", "UNWATCH", "RESET"]);
        return if name == "RESET" || g.chance(1, 2) {
            cmd(&[name, g.key()])
        } else {
            cmd(&["WATCH"])
        };
    }
    match g.rng.below(10) {
        0..=3 => cmd(&["MULTI"]),
        4..=6 => {
            let mut args = vec!["WATCH".to_string()];
            for _ in 0..=g.rng.below(2) {
                args.push(g.key().to_string());
            }
            args.iter().map(|a| a.as_bytes().to_vec()).collect()
        }
        7 => cmd(&["UNWATCH"]),
        8 => cmd(&[g.pick(&["EXEC", "DISCARD"])]),
        _ => cmd(&["RESET"]),
    }
}

/// Errors: unknown commands, and another family's command spoilt: an argument dropped,
/// one added, one replaced by something that is not a number, or the name's case changed.
fn errors(g: &mut Gen) -> Vec<Vec<u8>> {
    if g.chance(1, 8) {
        let name = g.pick(&["NOSUCH", "GETT", "hset_", "", "keel"]);
        return cmd(&[name, g.key(), &g.value()]);
    }
    let mut args = g.family_command(true);
    match g.rng.below(4) {
        0 => {
            let at = 1 + g.rng.below(args.len());
            if at < args.len() {
                args.remove(at);
            } else {
                args.truncate(1);
            }
        }
        1 => {
            let junk = g.value();
            args.push(junk.into_bytes());
        }
        2 if args.len() > 1 => {
            let at = 1 + g.rng.below(args.len() - 1);
            args[at] = g.pick(&["x", "", "-", "1.5", "NaN"]).as_bytes().to_vec();
        }
        _ => {
            let name = String::from_utf8_lossy(&args[0]).into_owned();
            let flipped: String = name
                .chars()
                .enumerate()
                .map(|(i, c)| {
                    if i % 2 == 0 {
                        c.to_ascii_lowercase()
                    } else {
                        c.to_ascii_uppercase()
                    }
                })
                .collect();
            args[0] = flipped.into_bytes();
        }
    }
    args
}

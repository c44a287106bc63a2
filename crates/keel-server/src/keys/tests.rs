use super::*;
use crate::data::Cursors;
use crate::data::test_support::{exec, try_exec};

/// COPY of every type: the copy is equal, keeps the TTL, and is independent of the source.
#[test]
fn copy_copies_every_type_and_its_ttl() {
    let db = keel::Db::in_memory();
    let c = Cursors::default();
    exec(&db, &c, &["SET", "s", "v"]);
    exec(&db, &c, &["SET", "st", "w", "EX", "1000"]);
    exec(&db, &c, &["HSET", "h", "f", "1", "g", "2"]);
    exec(&db, &c, &["SADD", "S", "a", "b", "c"]);
    exec(&db, &c, &["ZADD", "z", "1", "a", "2", "b"]);
    exec(&db, &c, &["RPUSH", "l", "x", "y", "z"]);
    exec(&db, &c, &["EXPIRE", "h", "1000"]);
    let reads: [(&str, &[&str]); 6] = [
        ("s", &["GET"]),
        ("st", &["GET"]),
        ("h", &["HGETALL"]),
        ("S", &["SMEMBERS"]),
        ("z", &["ZRANGE", "", "0", "-1", "WITHSCORES"]),
        ("l", &["LRANGE", "", "0", "-1"]),
    ];
    let read = |key: &str, how: &[&str]| {
        let mut a = vec![how[0], key];
        a.extend(&how[1..]);
        a.retain(|x| !x.is_empty());
        exec(&db, &c, &a)
    };
    for (key, how) in reads {
        let dst = format!("{key}-copy");
        assert_eq!(exec(&db, &c, &["COPY", key, &dst]), b":1\r\n", "{key}");
        assert_eq!(read(&dst, how), read(key, how), "{key}");
        assert_eq!(
            exec(&db, &c, &["TYPE", &dst]),
            exec(&db, &c, &["TYPE", key])
        );
        let ttl = |k: &str| exec(&db, &c, &["TTL", k]) != b":-1\r\n";
        assert_eq!(ttl(&dst), ttl(key), "{key}'s TTL");
    }
    // Independent: changing the source leaves the copy.
    exec(&db, &c, &["HSET", "h", "f", "changed"]);
    exec(&db, &c, &["SREM", "S", "a"]);
    exec(&db, &c, &["RPOP", "l"]);
    exec(&db, &c, &["ZINCRBY", "z", "5", "a"]);
    assert_eq!(exec(&db, &c, &["HGET", "h-copy", "f"]), b"$1\r\n1\r\n");
    assert_eq!(exec(&db, &c, &["SCARD", "S-copy"]), b":3\r\n");
    assert_eq!(exec(&db, &c, &["LLEN", "l-copy"]), b":3\r\n");
    assert_eq!(exec(&db, &c, &["ZSCORE", "z-copy", "a"]), b"$1\r\n1\r\n");
    // An existing destination: 0, unless REPLACE (then of any type).
    assert_eq!(exec(&db, &c, &["COPY", "s", "h-copy"]), b":0\r\n");
    assert_eq!(
        exec(&db, &c, &["COPY", "s", "h-copy", "REPLACE", "DB", "0"]),
        b":1\r\n"
    );
    assert_eq!(exec(&db, &c, &["GET", "h-copy"]), b"$1\r\nv\r\n");
    assert_eq!(exec(&db, &c, &["COPY", "nokey", "x"]), b":0\r\n");
    let err = |a: &[&str]| try_exec(&db, &c, a).expect_err("fails").0.into_owned();
    assert_eq!(
        err(&["COPY", "s", "s"]),
        "ERR source and destination objects are the same"
    );
    assert_eq!(
        err(&["COPY", "s", "x", "DB", "1"]),
        "ERR DB index is out of range"
    );
    assert_eq!(
        err(&["COPY", "s", "x", "DB", "x"]),
        crate::data::NOT_INTEGER
    );
    assert_eq!(err(&["COPY", "s", "x", "DB"]), SYNTAX);
    assert_eq!(err(&["COPY", "s", "x", "REPLAC"]), SYNTAX);
}

#[test]
fn renamenx_renames_only_to_a_free_name() {
    let db = keel::Db::in_memory();
    let c = Cursors::default();
    exec(&db, &c, &["SET", "a", "1"]);
    exec(&db, &c, &["SADD", "b", "m"]);
    assert_eq!(exec(&db, &c, &["RENAMENX", "a", "b"]), b":0\r\n");
    assert_eq!(exec(&db, &c, &["RENAMENX", "a", "a"]), b":0\r\n");
    assert_eq!(exec(&db, &c, &["RENAMENX", "b", "c"]), b":1\r\n");
    assert_eq!(exec(&db, &c, &["SMEMBERS", "c"]), b"*1\r\n$1\r\nm\r\n");
    assert_eq!(exec(&db, &c, &["EXISTS", "b"]), b":0\r\n");
    assert_eq!(
        try_exec(&db, &c, &["RENAMENX", "nokey", "x"]),
        Err(Fail::from("ERR no such key"))
    );
}

/// OBJECT ENCODING at Redis 7.0's default thresholds.
#[test]
fn encodings_follow_redis_thresholds() {
    let db = keel::Db::in_memory();
    let c = Cursors::default();
    let enc = |key: &str| {
        let r = exec(&db, &c, &["OBJECT", "ENCODING", key]);
        String::from_utf8(r).expect("text")
    };
    let long = "x".repeat(65);
    exec(&db, &c, &["SET", "i", "-123"]);
    exec(&db, &c, &["SET", "e", &"y".repeat(44)]);
    exec(&db, &c, &["SET", "r", &"y".repeat(45)]);
    exec(&db, &c, &["SET", "t", "12", "EX", "100"]);
    assert_eq!(enc("i"), "$3\r\nint\r\n");
    assert_eq!(enc("e"), "$6\r\nembstr\r\n");
    assert_eq!(enc("r"), "$3\r\nraw\r\n");
    assert_eq!(enc("t"), "$3\r\nint\r\n");
    assert_eq!(enc("none"), "$-1\r\n");
    exec(&db, &c, &["RPUSH", "l", "a"]);
    assert_eq!(enc("l"), "$9\r\nquicklist\r\n");
    let many = |n: usize| (0..n).map(|i| i.to_string()).collect::<Vec<_>>();
    let mut sadd = vec!["SADD".to_string(), "ints".into()];
    sadd.extend(many(512));
    let sadd: Vec<&str> = sadd.iter().map(String::as_str).collect();
    exec(&db, &c, &sadd);
    assert_eq!(enc("ints"), "$6\r\nintset\r\n");
    exec(&db, &c, &["SADD", "ints", "512"]);
    assert_eq!(enc("ints"), "$9\r\nhashtable\r\n");
    exec(&db, &c, &["SADD", "mixed", "1", "a"]);
    assert_eq!(enc("mixed"), "$9\r\nhashtable\r\n");
    let mut hset = vec!["HSET".to_string(), "big".into()];
    hset.extend(many(1024));
    let hset: Vec<&str> = hset.iter().map(String::as_str).collect();
    exec(&db, &c, &hset);
    assert_eq!(enc("big"), "$8\r\nlistpack\r\n");
    exec(&db, &c, &["HSET", "big", "x", "y"]);
    assert_eq!(enc("big"), "$9\r\nhashtable\r\n");
    exec(&db, &c, &["HSET", "h", "f", &"v".repeat(64)]);
    assert_eq!(enc("h"), "$8\r\nlistpack\r\n");
    exec(&db, &c, &["HSET", "h", "g", &long]);
    assert_eq!(enc("h"), "$9\r\nhashtable\r\n");
    exec(&db, &c, &["ZADD", "z", "1", "m"]);
    assert_eq!(enc("z"), "$8\r\nlistpack\r\n");
    exec(&db, &c, &["ZADD", "z", "1", &long]);
    assert_eq!(enc("z"), "$8\r\nskiplist\r\n");
    assert_eq!(exec(&db, &c, &["OBJECT", "REFCOUNT", "i"]), b":1\r\n");
    exec(&db, &c, &["SET", "small", "9999"]);
    assert_eq!(
        exec(&db, &c, &["OBJECT", "REFCOUNT", "small"]),
        b":2147483647\r\n"
    );
    assert_eq!(exec(&db, &c, &["OBJECT", "REFCOUNT", "h"]), b":1\r\n");
    let e = try_exec(&db, &c, &["OBJECT", "FREQ", "h"]).expect_err("no LFU");
    assert!(e.0.starts_with("ERR An LFU maxmemory policy is not selected"));
    let e = try_exec(&db, &c, &["OBJECT", "IDLETIME", "h"]).expect_err("not tracked");
    assert!(e.0.starts_with("ERR keel: OBJECT IDLETIME is not tracked"));
}

#[test]
fn randomkey_picks_live_keys() {
    let db = keel::Db::in_memory();
    let c = Cursors::default();
    assert_eq!(exec(&db, &c, &["RANDOMKEY"]), b"$-1\r\n");
    exec(&db, &c, &["SET", "a", "1"]);
    exec(&db, &c, &["HSET", "b", "f", "1"]);
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..200 {
        seen.insert(exec(&db, &c, &["RANDOMKEY"]));
    }
    let want: std::collections::BTreeSet<Vec<u8>> =
        [b"$1\r\na\r\n".to_vec(), b"$1\r\nb\r\n".to_vec()].into();
    assert_eq!(seen, want);
    // Many keys: every pick is a key, and the picks spread.
    let mut txn = db.begin().expect("begin");
    for i in 0..3000 {
        txn.put(format!("key:{i:05}").as_bytes(), b"v")
            .expect("put");
    }
    txn.commit().expect("commit").expect("no conflict");
    // "a" and "b" come first in the descent's first byte more often than their share (the
    // documented bias: they sit before a gap); among the others the picks spread.
    let (mut picks, mut drawn) = (std::collections::BTreeSet::new(), 0);
    for _ in 0..100 {
        let r = exec(&db, &c, &["RANDOMKEY"]);
        let key = String::from_utf8(r[4..r.len() - 2].to_vec()).expect("text");
        assert!(key == "a" || key == "b" || key.starts_with("key:"), "{key}");
        if key.starts_with("key:") {
            drawn += 1;
            picks.insert(key);
        }
    }
    assert!(drawn >= 50, "{drawn} of 100 picks among 3000 keys");
    assert!(
        picks.len() + 10 >= drawn,
        "{} distinct of {drawn}",
        picks.len()
    );
}

/// A collection too large to copy in one transaction is refused with an error naming the
/// limit, and nothing is written.
#[test]
fn copy_of_a_collection_past_the_write_limit_is_refused() {
    let db = keel::Db::in_memory();
    let c = Cursors::default();
    let half = keel::limits::TXN_WRITE_KEYS_MAX / 2 + 1;
    for part in 0..2 {
        let members: Vec<String> = (0..half).map(|i| format!("{part}:{i}")).collect();
        let mut sadd = vec!["SADD", "big"];
        sadd.extend(members.iter().map(String::as_str));
        exec(&db, &c, &sadd);
    }
    let e = try_exec(&db, &c, &["COPY", "big", "copy"]).expect_err("too many keys");
    assert!(
        e.0.starts_with("ERR keel: COPY of the set 'big' would write more than"),
        "{e:?}"
    );
    assert_eq!(exec(&db, &c, &["EXISTS", "copy"]), b":0\r\n");
    // A small one copies.
    exec(&db, &c, &["SADD", "small", "a", "b"]);
    assert_eq!(exec(&db, &c, &["COPY", "small", "copy"]), b":1\r\n");
}

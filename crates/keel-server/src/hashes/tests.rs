use crate::data::Cursors;
use crate::data::test_support::{ctx, exec, meta, records, run_in, run_in_ctx};
use crate::keyspace as ks;

/// Two open transactions writing different fields of one spread hash (new fields and
/// increments) both commit: neither reads what the other writes, and the size record is a
/// commutative add. Increments of one field commit too, unless both create it.
#[test]
fn writers_of_different_fields_do_not_conflict() {
    let db = keel::Db::in_memory();
    let cursors = Cursors::default();
    // A value over `ITEM_BYTES_MAX` spreads the hash at once.
    let long = "v".repeat(super::ITEM_BYTES_MAX + 1);
    assert_eq!(
        exec(&db, &cursors, &["HSET", "h", "a", "1", "long", &long]),
        b":2\r\n"
    );
    assert_eq!(records(&db), 1 + 2 + 1, "meta, two fields, size");
    let cases: [(&[&str], &[&str]); 3] = [
        (&["HSET", "h", "x", "1"], &["HSET", "h", "y", "2"]),
        (&["HINCRBY", "h", "a", "5"], &["HINCRBY", "h", "b", "7"]),
        (
            &["HINCRBYFLOAT", "h", "c", "1.5"],
            &["HSETNX", "h", "d", "v"],
        ),
    ];
    for (one, two) in cases {
        let mut t1 = db.begin().expect("begin");
        let mut t2 = db.begin().expect("begin");
        run_in(&mut t1, &cursors, one);
        run_in(&mut t2, &cursors, two);
        assert!(t1.commit().expect("commit").is_ok(), "{one:?}");
        assert!(
            t2.commit().expect("commit").is_ok(),
            "{two:?} conflicted with {one:?}"
        );
    }
    assert_eq!(exec(&db, &cursors, &["HLEN", "h"]), b":7\r\n");
    assert_eq!(exec(&db, &cursors, &["HGET", "h", "a"]), b"$1\r\n6\r\n");
    // Increments of one existing field do not conflict either: they read only that it
    // exists, and add.
    let mut t1 = db.begin().expect("begin");
    let mut t2 = db.begin().expect("begin");
    run_in(&mut t1, &cursors, &["HINCRBY", "h", "a", "1"]);
    run_in(&mut t2, &cursors, &["HINCRBY", "h", "a", "1"]);
    assert!(t1.commit().expect("commit").is_ok());
    assert!(t2.commit().expect("commit").is_ok());
    assert_eq!(exec(&db, &cursors, &["HGET", "h", "a"]), b"$1\r\n8\r\n");
    // Two that create one field do: only one may count it in the size.
    let mut t1 = db.begin().expect("begin");
    let mut t2 = db.begin().expect("begin");
    run_in(&mut t1, &cursors, &["HINCRBY", "h", "e", "1"]);
    run_in(&mut t2, &cursors, &["HINCRBY", "h", "e", "1"]);
    assert!(t1.commit().expect("commit").is_ok());
    assert!(t2.commit().expect("commit").is_err());
    assert_eq!(exec(&db, &cursors, &["HLEN", "h"]), b":8\r\n");
    // Where the reply must be known before the commit, an increment reads the field: one
    // field's increments conflict.
    let mut reading = ctx(&cursors);
    reading.track_increments = false;
    let mut t1 = db.begin().expect("begin");
    let mut t2 = db.begin().expect("begin");
    run_in_ctx(&mut t1, &reading, &["HINCRBY", "h", "a", "1"]);
    run_in_ctx(&mut t2, &reading, &["HINCRBY", "h", "a", "1"]);
    assert!(t1.commit().expect("commit").is_ok());
    assert!(t2.commit().expect("commit").is_err());
}

/// Deleting a hash is O(1): its fields go to the graveyard, which the sweeper empties.
#[test]
fn a_deleted_hash_is_swept() {
    let db = keel::Db::in_memory();
    let cursors = Cursors::default();
    let mut fields = vec!["HSET", "h"];
    let names: Vec<String> = (0..1200).map(|i| format!("f{i}")).collect();
    for n in &names {
        fields.push(n);
        fields.push("v");
    }
    exec(&db, &cursors, &fields);
    let count = |db: &keel::Db| {
        db.snapshot()
            .expect("snapshot")
            .range::<Vec<u8>>(..)
            .count()
    };
    assert_eq!(count(&db), 1200 + 2);
    assert_eq!(exec(&db, &cursors, &["DEL", "h"]), b":1\r\n");
    // The fields and a graveyard entry are left.
    assert_eq!(count(&db), 1200 + 1);
    let stats = crate::reaper::ReaperStats::default();
    let mut passes = 0;
    while crate::reaper::pass(&db, &stats) {
        passes += 1;
    }
    assert!(
        passes >= 2,
        "{passes} passes for 1200 fields in batches of 512"
    );
    crate::reaper::pass(&db, &stats);
    assert_eq!(count(&db), 0);
    assert_eq!(
        stats.swept_keys.load(std::sync::atomic::Ordering::Relaxed),
        1200
    );
}

/// A small hash is one engine record, its meta record, with its fields in the order they were
/// added (as Redis' listpack keeps them). One field too many, or a field or value too long,
/// spreads it over sub-keys, keeping every field, its TTL and its order-independent replies.
#[test]
fn a_small_hash_is_packed_until_it_outgrows_the_limits() {
    let db = keel::Db::in_memory();
    let cursors = Cursors::default();
    let mut hset: Vec<String> = vec!["HSET".into(), "h".into()];
    for i in (0..super::FIELDS_MAX).rev() {
        hset.push(format!("f{i}"));
        hset.push(format!("{i}"));
    }
    let hset: Vec<&str> = hset.iter().map(String::as_str).collect();
    let n = super::FIELDS_MAX;
    assert_eq!(exec(&db, &cursors, &hset), format!(":{n}\r\n").as_bytes());
    assert_eq!(records(&db), 1, "packed in its meta record");
    assert_eq!(exec(&db, &cursors, &["HGET", "h", "f7"]), b"$1\r\n7\r\n");
    let keys = exec(&db, &cursors, &["HKEYS", "h"]);
    let last = format!("f{}", n - 1);
    assert!(keys.starts_with(format!("*{n}\r\n${}\r\n{last}\r\n", last.len()).as_bytes()));
    assert_eq!(exec(&db, &cursors, &["EXPIRE", "h", "1000"]), b":1\r\n");
    assert_eq!(records(&db), 2, "and its expiry index entry");
    assert_eq!(
        exec(&db, &cursors, &["HINCRBY", "h", "f7", "3"]),
        b":10\r\n"
    );
    assert_eq!(exec(&db, &cursors, &["HDEL", "h", "f0", "nope"]), b":1\r\n");
    assert_eq!(records(&db), 2);
    assert_eq!(
        exec(&db, &cursors, &["OBJECT", "ENCODING", "h"]),
        b"$8\r\nlistpack\r\n"
    );
    // Back to `FIELDS_MAX`, then one more: spread.
    assert_eq!(
        exec(&db, &cursors, &["HSET", "h", "f0", "0", "new", "x"]),
        b":2\r\n"
    );
    assert_eq!(
        records(&db),
        1 + (n + 1) + 1 + 1,
        "meta, fields, size, expiry"
    );
    assert_eq!(
        exec(&db, &cursors, &["HLEN", "h"]),
        format!(":{}\r\n", n + 1).as_bytes()
    );
    assert_eq!(exec(&db, &cursors, &["HGET", "h", "f7"]), b"$2\r\n10\r\n");
    assert_eq!(exec(&db, &cursors, &["HGET", "h", "new"]), b"$1\r\nx\r\n");
    let ttl = exec(&db, &cursors, &["TTL", "h"]);
    assert!(ttl.starts_with(b":9") || ttl == b":1000\r\n", "{ttl:?}");
    // What Redis would report (it packs up to 512 fields), not what keel does.
    assert_eq!(
        exec(&db, &cursors, &["OBJECT", "ENCODING", "h"]),
        b"$8\r\nlistpack\r\n"
    );

    // A long value spreads a packed hash, and a long increment result does too.
    exec(&db, &cursors, &["HSET", "g", "a", "1"]);
    let long = "v".repeat(super::ITEM_BYTES_MAX + 1);
    exec(&db, &cursors, &["HSET", "g", "b", &long]);
    assert!(!meta(&db, "g").packed);
    exec(&db, &cursors, &["HSET", "f", "a", "1"]);
    let big = format!("1{}", "0".repeat(super::ITEM_BYTES_MAX + 8));
    exec(&db, &cursors, &["HINCRBYFLOAT", "f", "a", &big]);
    let v = exec(&db, &cursors, &["HGET", "f", "a"]);
    assert!(!meta(&db, "f").packed, "{}", String::from_utf8_lossy(&v));

    // Fields that each fit but together outgrow `packed::BYTES_MAX` spread it too.
    let value = "v".repeat(super::ITEM_BYTES_MAX);
    let mut n = 0;
    while n == 0 || meta(&db, "e").packed {
        n += 1;
        exec(&db, &cursors, &["HSET", "e", &format!("f{n}"), &value]);
        assert!(
            n * (value.len() + 1) < ks::packed::BYTES_MAX + 2 * (value.len() + 1),
            "{n}"
        );
    }
    assert_eq!(
        exec(&db, &cursors, &["HLEN", "e"]),
        format!(":{n}\r\n").as_bytes()
    );
    exec(&db, &cursors, &["DEL", "e"]);

    // Deleting a packed hash leaves nothing to sweep; so does removing its last field.
    exec(&db, &cursors, &["DEL", "h", "g", "f"]);
    let before = records(&db);
    exec(&db, &cursors, &["HSET", "p", "a", "1", "b", "2"]);
    exec(&db, &cursors, &["COPY", "p", "q"]);
    exec(&db, &cursors, &["RENAME", "q", "r"]);
    assert_eq!(
        exec(&db, &cursors, &["HGETALL", "r"]),
        b"*4\r\n$1\r\na\r\n$1\r\n1\r\n$1\r\nb\r\n$1\r\n2\r\n"
    );
    exec(&db, &cursors, &["DEL", "p"]);
    exec(&db, &cursors, &["HDEL", "r", "a", "b"]);
    assert_eq!(exec(&db, &cursors, &["EXISTS", "p", "r"]), b":0\r\n");
    assert_eq!(records(&db), before);
}

/// Writers of different fields of one packed hash conflict (each rewrites its meta record);
/// the retry of the one that lost spreads the hash, after which they no longer conflict.
#[test]
fn a_contended_packed_hash_is_spread() {
    let db = keel::Db::in_memory();
    let cursors = Cursors::default();
    exec(&db, &cursors, &["HSET", "h", "a", "1"]);
    let mut t1 = db.begin().expect("begin");
    let mut t2 = db.begin().expect("begin");
    run_in(&mut t1, &cursors, &["HSET", "h", "x", "1"]);
    run_in(&mut t2, &cursors, &["HINCRBY", "h", "y", "2"]);
    assert!(t1.commit().expect("commit").is_ok());
    let conflict = t2
        .commit()
        .expect("commit")
        .expect_err("one meta record, two writers");
    assert_eq!(conflict.key, ks::meta_key(b"h").to_vec());
    assert_eq!(records(&db), 1);
    // The retry, told of the conflict, spreads the hash.
    let retry = ctx(&cursors);
    retry.contended.set(&conflict);
    let mut t2 = db.begin().expect("begin");
    assert_eq!(
        run_in_ctx(&mut t2, &retry, &["HINCRBY", "h", "y", "2"]),
        b":2\r\n"
    );
    assert!(t2.commit().expect("commit").is_ok());
    assert_eq!(records(&db), 1 + 3 + 1, "meta, three fields, size");
    let mut t1 = db.begin().expect("begin");
    let mut t2 = db.begin().expect("begin");
    run_in(&mut t1, &cursors, &["HSET", "h", "z", "1"]);
    run_in(&mut t2, &cursors, &["HINCRBY", "h", "y", "2"]);
    assert!(t1.commit().expect("commit").is_ok());
    assert!(t2.commit().expect("commit").is_ok());
    assert_eq!(exec(&db, &cursors, &["HLEN", "h"]), b":4\r\n");
    assert_eq!(exec(&db, &cursors, &["HGET", "h", "y"]), b"$1\r\n4\r\n");
}

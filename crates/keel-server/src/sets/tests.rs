use super::*;
use crate::data::Cursors;
use crate::data::test_support::{ctx, exec, meta, records, run_in, run_in_ctx};

/// Two open transactions adding different members to one spread set both commit: neither
/// reads what the other writes, and the size record is a commutative add.
#[test]
fn adders_of_different_members_do_not_conflict() {
    let db = keel::Db::in_memory();
    let cursors = Cursors::default();
    // A member over `packed::ITEM_BYTES_MAX` spreads a set at once.
    let long = "m".repeat(packed::ITEM_BYTES_MAX + 1);
    assert_eq!(exec(&db, &cursors, &["SADD", "s", "a", &long]), b":2\r\n");
    assert!(!meta(&db, "s").packed);
    let cases: [(&[&str], &[&str]); 2] = [
        (&["SADD", "s", "x"], &["SADD", "s", "y", "z"]),
        (&["SADD", "s", "p", "a"], &["SMOVE", "t", "s", "q"]),
    ];
    exec(&db, &cursors, &["SADD", "t", "q", "r", &long]);
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
    assert_eq!(exec(&db, &cursors, &["SCARD", "s"]), b":7\r\n");
    assert_eq!(exec(&db, &cursors, &["SCARD", "t"]), b":2\r\n");
    // The same member does conflict.
    let mut t1 = db.begin().expect("begin");
    let mut t2 = db.begin().expect("begin");
    run_in(&mut t1, &cursors, &["SADD", "s", "new"]);
    run_in(&mut t2, &cursors, &["SADD", "s", "new"]);
    assert!(t1.commit().expect("commit").is_ok());
    assert!(t2.commit().expect("commit").is_err());
}

/// `SPOP` of every member drops the set in O(1): its members go to the graveyard, which the
/// sweeper empties.
#[test]
fn a_set_popped_whole_is_swept() {
    let db = keel::Db::in_memory();
    let cursors = Cursors::default();
    let names: Vec<String> = (0..700).map(|i| format!("m{i}")).collect();
    let mut sadd = vec!["SADD", "s"];
    sadd.extend(names.iter().map(String::as_str));
    assert_eq!(exec(&db, &cursors, &sadd), b":700\r\n");
    let count = |db: &keel::Db| {
        db.snapshot()
            .expect("snapshot")
            .range::<Vec<u8>>(..)
            .count()
    };
    assert_eq!(count(&db), 700 + 2);
    let popped = exec(&db, &cursors, &["SPOP", "s", "1000"]);
    assert!(popped.starts_with(b"*700\r\n"));
    assert_eq!(count(&db), 700 + 1);
    let stats = crate::reaper::ReaperStats::default();
    while crate::reaper::pass(&db, &stats) {}
    crate::reaper::pass(&db, &stats);
    assert_eq!(count(&db), 0);
}

#[test]
fn cursors_read_as_strtoul() {
    assert_eq!(parse_cursor(b"0"), Ok(0));
    assert_eq!(parse_cursor(b"+12"), Ok(12));
    assert_eq!(parse_cursor(b"-1"), Ok(u64::MAX));
    assert_eq!(parse_cursor(b""), Ok(0));
    assert!(parse_cursor(b"-").is_err());
    assert!(parse_cursor(b" 1").is_err());
    assert!(parse_cursor(b"1x").is_err());
    assert!(parse_cursor(b"18446744073709551616").is_err());
}

/// A small set is one engine record, its meta record, through every command; one member too
/// many or too long spreads it, keeping its members and TTL; a contended one is spread by
/// the retry of the writer that lost.
#[test]
fn a_small_set_is_packed_until_it_outgrows_the_limits_or_is_contended() {
    let db = keel::Db::in_memory();
    let c = Cursors::default();
    let steps: &[(&[&str], &[u8])] = &[
        (&["SADD", "s", "3", "1", "2", "1"], b":3\r\n"),
        (&["OBJECT", "ENCODING", "s"], b"$6\r\nintset\r\n"),
        (&["SADD", "s", "1"], b":0\r\n"),
        (&["SREM", "s", "2", "9"], b":1\r\n"),
        (&["SISMEMBER", "s", "3"], b":1\r\n"),
        (&["SMISMEMBER", "s", "1", "2"], b"*2\r\n:1\r\n:0\r\n"),
        (&["SMEMBERS", "s"], b"*2\r\n$1\r\n3\r\n$1\r\n1\r\n"),
        (&["SADD", "t", "1", "x"], b":2\r\n"),
        (&["OBJECT", "ENCODING", "t"], b"$9\r\nhashtable\r\n"),
        (&["SINTER", "s", "t"], b"*1\r\n$1\r\n1\r\n"),
        (&["SINTERSTORE", "u", "s", "t"], b":1\r\n"),
        (&["SMOVE", "t", "u", "x"], b":1\r\n"),
        (&["SCARD", "u"], b":2\r\n"),
        (&["EXPIRE", "s", "1000"], b":1\r\n"),
        (
            &["SSCAN", "s", "0"],
            b"*2\r\n$1\r\n0\r\n*2\r\n$1\r\n3\r\n$1\r\n1\r\n",
        ),
    ];
    for (cmd, reply) in steps {
        assert_eq!(exec(&db, &c, cmd), *reply, "{cmd:?}");
    }
    for key in ["s", "t", "u"] {
        assert!(meta(&db, key).packed, "{key}");
    }
    assert_eq!(records(&db), 4, "three meta records and an expiry entry");
    // Past `packed::ITEMS_MAX` members: spread, every member and the TTL kept.
    let more: Vec<String> = (10..10 + packed::ITEMS_MAX)
        .map(|i| i.to_string())
        .collect();
    let mut sadd = vec!["SADD", "s"];
    sadd.extend(more.iter().map(String::as_str));
    let n = packed::ITEMS_MAX;
    assert_eq!(exec(&db, &c, &sadd), format!(":{n}\r\n").as_bytes());
    assert!(!meta(&db, "s").packed);
    assert_eq!(
        exec(&db, &c, &["SCARD", "s"]),
        format!(":{}\r\n", n + 2).as_bytes()
    );
    assert_eq!(exec(&db, &c, &["SISMEMBER", "s", "3"]), b":1\r\n");
    let ttl = exec(&db, &c, &["TTL", "s"]);
    assert!(ttl.starts_with(b":9") || ttl == b":1000\r\n", "{ttl:?}");
    // Popping a packed set empty deletes it, leaving nothing.
    exec(&db, &c, &["DEL", "s", "t"]);
    assert_eq!(exec(&db, &c, &["SPOP", "u"]).len(), b"$1\r\n1\r\n".len());
    assert_eq!(
        exec(&db, &c, &["SPOP", "u", "5"]).len(),
        b"*1\r\n$1\r\n1\r\n".len()
    );
    assert_eq!(exec(&db, &c, &["EXISTS", "u"]), b":0\r\n");
    // (The spread set's members wait in the graveyard for the sweeper.)
    let stats = crate::reaper::ReaperStats::default();
    while crate::reaper::pass(&db, &stats) {}
    crate::reaper::pass(&db, &stats);
    assert_eq!(records(&db), 0);

    // Two adders of one packed set conflict; the retry told of it spreads the set.
    exec(&db, &c, &["SADD", "h", "a"]);
    let mut t1 = db.begin().expect("begin");
    let mut t2 = db.begin().expect("begin");
    run_in(&mut t1, &c, &["SADD", "h", "x"]);
    run_in(&mut t2, &c, &["SADD", "h", "y"]);
    assert!(t1.commit().expect("commit").is_ok());
    let conflict = t2.commit().expect("commit").expect_err("one meta record");
    assert_eq!(conflict.key, ks::meta_key(b"h").to_vec());
    let retry = ctx(&c);
    retry.contended.set(&conflict);
    let mut t2 = db.begin().expect("begin");
    assert_eq!(run_in_ctx(&mut t2, &retry, &["SADD", "h", "y"]), b":1\r\n");
    assert!(t2.commit().expect("commit").is_ok());
    assert!(!meta(&db, "h").packed);
    assert_eq!(exec(&db, &c, &["SCARD", "h"]), b":3\r\n");
}

/// `SRANDMEMBER` of a spread set, in a snapshot and in a transaction, comes to (nearly)
/// every member, none much more often than the others, and never to members deleted
/// meanwhile (not collected yet, so still in the index). Picks are random, not uniform
/// (`keel::Txn::sample_key`).
#[test]
fn random_picks_reach_every_member_and_only_live_ones() {
    let db = keel::Db::with_options(
        keel::Options::default().collector_interval(std::time::Duration::from_secs(3600)),
    );
    let cursors = Cursors::default();
    const MEMBERS: usize = 1000;
    // Spelled unevenly, so that picks by spelling would favour some.
    let member = |i: usize| format!("{}:{i}", if i.is_multiple_of(3) { "a" } else { "zzzz" });
    for chunk in (0..MEMBERS).collect::<Vec<_>>().chunks(100) {
        let mut args = vec!["SADD".to_string(), "s".to_string()];
        args.extend(chunk.iter().map(|&i| member(i)));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        exec(&db, &cursors, &args);
    }
    assert!(!meta(&db, "s").packed);
    // Every tenth member goes; the collector sleeps, so they stay in the index, dead.
    for i in (0..MEMBERS).step_by(10) {
        exec(&db, &cursors, &["SREM", "s", &member(i)]);
    }
    let live = MEMBERS - MEMBERS / 10;
    let mut counts = std::collections::HashMap::<Vec<u8>, usize>::new();
    let draws = 30 * live;
    let snap = db.snapshot().expect("snapshot");
    for i in 0..draws {
        let reply = if i % 2 == 0 {
            let mut buf = bytes::BytesMut::new();
            let mut out = crate::reply::Out::new(&mut buf, crate::reply::Proto::Resp2);
            let args = crate::data::test_support::args(&["SRANDMEMBER", "s"]);
            crate::data::run(
                Cmd::Srandmember,
                &args,
                &mut View::Snap(&snap),
                &ctx(&cursors),
                &mut out,
            )
            .expect("runs");
            buf.to_vec()
        } else {
            let mut t = db.begin().expect("begin");
            run_in(&mut t, &cursors, &["SRANDMEMBER", "s"])
        };
        let name = reply.splitn(2, |&b| b == b'\n').nth(1).expect("a bulk");
        *counts.entry(name.to_vec()).or_default() += 1;
    }
    for i in (0..MEMBERS).step_by(10) {
        let dead = format!("{}\r\n", member(i));
        assert!(
            !counts.contains_key(dead.as_bytes()),
            "picked removed {dead}"
        );
    }
    assert!(
        counts.len() >= live * 99 / 100,
        "{} of {live} members picked",
        counts.len()
    );
    let most = counts.values().copied().max().expect("picks");
    // A member after a removed one is picked for both: twice as often as the others.
    assert!(most < 4 * 30, "one member picked {most} times of {draws}");
}

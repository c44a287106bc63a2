use super::*;
use crate::data::Cursors;
use crate::data::test_support::{exec, run_in};

/// Two open transactions adding different members to one set both commit: neither reads
/// what the other writes, and the size record is a commutative add.
#[test]
fn adders_of_different_members_do_not_conflict() {
    let db = keel::Db::in_memory();
    let cursors = Cursors::default();
    assert_eq!(exec(&db, &cursors, &["SADD", "s", "a"]), b":1\r\n");
    let cases: [(&[&str], &[&str]); 2] = [
        (&["SADD", "s", "x"], &["SADD", "s", "y", "z"]),
        (&["SADD", "s", "p", "a"], &["SMOVE", "t", "s", "q"]),
    ];
    exec(&db, &cursors, &["SADD", "t", "q", "r"]);
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
    assert_eq!(exec(&db, &cursors, &["SCARD", "s"]), b":6\r\n");
    assert_eq!(exec(&db, &cursors, &["SCARD", "t"]), b":1\r\n");
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

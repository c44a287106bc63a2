use crate::data::Cursors;
use crate::data::test_support::{exec, run_in};

/// Two open transactions writing different fields of one hash (new fields and increments)
/// both commit: neither reads what the other writes, and the size record is a commutative
/// add.
#[test]
fn writers_of_different_fields_do_not_conflict() {
    let db = keel::Db::in_memory();
    let cursors = Cursors::default();
    assert_eq!(exec(&db, &cursors, &["HSET", "h", "a", "1"]), b":1\r\n");
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
    assert_eq!(exec(&db, &cursors, &["HLEN", "h"]), b":6\r\n");
    assert_eq!(exec(&db, &cursors, &["HGET", "h", "a"]), b"$1\r\n6\r\n");
    // The same field does conflict.
    let mut t1 = db.begin().expect("begin");
    let mut t2 = db.begin().expect("begin");
    run_in(&mut t1, &cursors, &["HINCRBY", "h", "a", "1"]);
    run_in(&mut t2, &cursors, &["HINCRBY", "h", "a", "1"]);
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

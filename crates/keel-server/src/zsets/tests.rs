use super::*;
use crate::data::Cursors;
use crate::data::test_support::{exec, run_in};

#[test]
fn stored_scores_sort_as_numbers() {
    let scores = [
        f64::NEG_INFINITY,
        -f64::MAX,
        -1e10,
        -1.5,
        -f64::MIN_POSITIVE,
        -5e-324,
        0.0,
        5e-324,
        f64::MIN_POSITIVE,
        1.0,
        1.5,
        1e300,
        f64::MAX,
        f64::INFINITY,
    ];
    for pair in scores.windows(2) {
        assert!(
            encode_score(pair[0]) < encode_score(pair[1]),
            "{} < {}",
            pair[0],
            pair[1]
        );
    }
    for x in scores {
        assert_eq!(decode_score(encode_score(x)), x);
    }
    assert_eq!(encode_score(-0.0), encode_score(0.0));
    assert!(decode_score(encode_score(-0.0)).is_sign_positive());
}

#[test]
fn scores_read_as_redis_reads_them() {
    let ok = |s: &str| parse_score(s.as_bytes());
    assert_eq!(ok("1"), Some(1.0));
    assert_eq!(ok("-2.5"), Some(-2.5));
    assert_eq!(ok("+.5"), Some(0.5));
    assert_eq!(ok("5."), Some(5.0));
    assert_eq!(ok("1E3"), Some(1000.0));
    assert_eq!(ok("0x10"), Some(16.0));
    assert_eq!(ok("0x1p-2"), Some(0.25));
    assert_eq!(ok("inf"), Some(f64::INFINITY));
    assert_eq!(ok("-Infinity"), Some(f64::NEG_INFINITY));
    assert_eq!(ok("+inf"), Some(f64::INFINITY));
    for bad in [
        "", " 1", "1 ", "nan", "NaN", "1e400", "-1e400", "1e-400", "1e", "e1", ".", "0x", "abc",
        "1.5.5", "--1",
    ] {
        assert_eq!(ok(bad), None, "{bad:?}");
    }
    // Range bounds take what C's strtod takes whole: an empty string is 0, leading spaces
    // pass, an overflow is infinite.
    assert_eq!(parse_score_bound(b""), Some((0.0, false)));
    assert_eq!(parse_score_bound(b"("), Some((0.0, true)));
    assert_eq!(parse_score_bound(b" 1"), Some((1.0, false)));
    assert_eq!(parse_score_bound(b"1e400"), Some((f64::INFINITY, false)));
    assert_eq!(parse_score_bound(b"(nan"), None);
    assert_eq!(parse_score_bound(b"1 "), None);
}

/// Two open transactions writing different members of one sorted set both commit.
#[test]
fn writers_of_different_members_do_not_conflict() {
    let db = keel::Db::in_memory();
    let cursors = Cursors::default();
    assert_eq!(exec(&db, &cursors, &["ZADD", "z", "1", "a"]), b":1\r\n");
    let cases: [(&[&str], &[&str]); 3] = [
        (&["ZADD", "z", "2", "x"], &["ZADD", "z", "3", "y", "4", "w"]),
        (&["ZINCRBY", "z", "5", "a"], &["ZINCRBY", "z", "7", "b"]),
        (
            &["ZADD", "z", "INCR", "1", "x"],
            &["ZADD", "z", "GT", "9", "y"],
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
    assert_eq!(exec(&db, &cursors, &["ZCARD", "z"]), b":5\r\n");
    assert_eq!(
        exec(&db, &cursors, &["ZRANGE", "z", "0", "-1", "WITHSCORES"]),
        b"*10\r\n$1\r\nx\r\n$1\r\n3\r\n$1\r\nw\r\n$1\r\n4\r\n$1\r\na\r\n$1\r\n6\r\n\
          $1\r\nb\r\n$1\r\n7\r\n$1\r\ny\r\n$1\r\n9\r\n"
    );
    // Increments of the same member do not conflict either (score adds)...
    let mut t1 = db.begin().expect("begin");
    let mut t2 = db.begin().expect("begin");
    run_in(&mut t1, &cursors, &["ZINCRBY", "z", "1", "a"]);
    run_in(&mut t2, &cursors, &["ZINCRBY", "z", "1", "a"]);
    assert!(t1.commit().expect("commit").is_ok());
    assert!(t2.commit().expect("commit").is_ok());
    assert_eq!(exec(&db, &cursors, &["ZSCORE", "z", "a"]), b"$1\r\n8\r\n");
    // ...but writes that read the member's score do.
    let mut t1 = db.begin().expect("begin");
    let mut t2 = db.begin().expect("begin");
    run_in(&mut t1, &cursors, &["ZADD", "z", "1", "a"]);
    run_in(&mut t2, &cursors, &["ZADD", "z", "GT", "20", "a"]);
    assert!(t1.commit().expect("commit").is_ok());
    assert!(t2.commit().expect("commit").is_err());
}

/// Deleting a sorted set is O(1): its scores and index entries go to the graveyard, which
/// the sweeper empties.
#[test]
fn a_deleted_sorted_set_is_swept() {
    let db = keel::Db::in_memory();
    let cursors = Cursors::default();
    let pairs: Vec<String> = (0..600)
        .flat_map(|i| [i.to_string(), format!("m{i}")])
        .collect();
    let mut zadd = vec!["ZADD", "z"];
    zadd.extend(pairs.iter().map(String::as_str));
    assert_eq!(exec(&db, &cursors, &zadd), b":600\r\n");
    let count = |db: &keel::Db| {
        db.snapshot()
            .expect("snapshot")
            .range::<Vec<u8>>(..)
            .count()
    };
    assert_eq!(count(&db), 2 * 600 + 2);
    assert_eq!(exec(&db, &cursors, &["DEL", "z"]), b":1\r\n");
    assert_eq!(count(&db), 2 * 600 + 1);
    let stats = crate::reaper::ReaperStats::default();
    while crate::reaper::pass(&db, &stats) {}
    crate::reaper::pass(&db, &stats);
    assert_eq!(count(&db), 0);
}

/// Pops in one transaction resume where the last pop of the set left off while nothing was
/// written between (`PopsLeftOff`): a random run of adds, pops from both ends, removals and
/// deletes of two sets, all in one transaction, answers exactly as the same run with every
/// command in a transaction of its own, where no pop resumes.
#[test]
fn pops_in_one_transaction_answer_as_pops_in_many() {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut draw = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for round in 0..40 {
        let mut run: Vec<Vec<String>> = Vec::new();
        for _ in 0..60 {
            let key = if draw(4) == 0 { "y" } else { "z" }.to_string();
            let member = format!("m{}", draw(12));
            let score = (draw(9) as i64 - 4).to_string();
            let cmd: Vec<String> = match draw(10) {
                0..=2 => vec!["ZADD".into(), key, score, member],
                3..=4 => vec!["ZPOPMIN".into(), key],
                5 => vec!["ZPOPMIN".into(), key, draw(4).to_string()],
                6 => vec!["ZPOPMAX".into(), key, (1 + draw(3)).to_string()],
                7 => vec!["ZREM".into(), key, member],
                8 => vec!["ZINCRBY".into(), key, score, member],
                _ if draw(4) == 0 => vec!["DEL".into(), key],
                _ => vec!["ZRANGE".into(), key, "0".into(), "-1".into()],
            };
            run.push(cmd);
        }
        let cursors = Cursors::default();
        let one = keel::Db::in_memory();
        let mut txn = one.begin().expect("begin");
        let together: Vec<Vec<u8>> = run
            .iter()
            .map(|c| {
                run_in(
                    &mut txn,
                    &cursors,
                    &c.iter().map(String::as_str).collect::<Vec<_>>(),
                )
            })
            .collect();
        txn.commit().expect("commit").expect("no conflict");
        let many = keel::Db::in_memory();
        for (cmd, reply) in run.iter().zip(&together) {
            let alone = exec(
                &many,
                &cursors,
                &cmd.iter().map(String::as_str).collect::<Vec<_>>(),
            );
            assert_eq!(
                String::from_utf8_lossy(reply),
                String::from_utf8_lossy(&alone),
                "round {round}: {cmd:?} in {run:?}"
            );
        }
    }
}

/// A pop that resumed where the one before it left off still conflicts with an add below
/// either, and with one between them.
#[test]
fn resumed_pops_conflict_with_adds_before_them() {
    for (score, member) in [("0", "first"), ("2", "between")] {
        let db = keel::Db::in_memory();
        let cursors = Cursors::default();
        exec(&db, &cursors, &["ZADD", "z", "1", "a", "3", "b", "5", "c"]);
        let mut popper = db.begin().expect("begin");
        assert_eq!(
            run_in(&mut popper, &cursors, &["ZPOPMIN", "z"]),
            b"*2\r\n$1\r\na\r\n$1\r\n1\r\n"
        );
        assert_eq!(
            run_in(&mut popper, &cursors, &["ZPOPMIN", "z"]),
            b"*2\r\n$1\r\nb\r\n$1\r\n3\r\n"
        );
        exec(&db, &cursors, &["ZADD", "z", score, member]);
        assert!(
            popper.commit().expect("commit").is_err(),
            "pops committed past an add of {member}"
        );
    }
}

use super::*;
use crate::data::Cursors;
use crate::data::test_support::{exec, run_in, try_exec};

fn naive_bit(v: &[u8], i: u64) -> u8 {
    (v[(i / 8) as usize] >> (7 - i % 8)) & 1
}

/// The popcount and the search over bit ranges agree with a bit-by-bit reading, for every
/// range of a few strings.
#[test]
fn ranges_agree_with_a_bit_by_bit_reading() {
    for v in [
        &b"\x00"[..],
        b"\xff",
        b"foobar",
        b"\xff\xf0\x00\x0f",
        b"\x00\x00\x01",
    ] {
        let bits = v.len() as u64 * 8;
        for first in 0..bits {
            for last in first..bits {
                let ones = (first..=last).filter(|&i| naive_bit(v, i) == 1).count() as u64;
                assert_eq!(count_ones(v, first, last), ones, "{v:?} {first}..={last}");
                for bit in [0, 1] {
                    let want = (first..=last).find(|&i| naive_bit(v, i) == bit);
                    assert_eq!(find_bit(v, bit, first, last), want, "{v:?} {bit}");
                }
            }
        }
    }
}

/// Redis's documented examples and the edges of its overflow rules.
#[test]
fn bitfield_overflow_follows_redis() {
    // BITFIELD k INCRBY u2 100 1 OVERFLOW SAT INCRBY u2 102 1, four times (the docs' example).
    assert_eq!(unsigned_overflow(3, 1, 2, Overflow::Wrap), Some(0));
    assert_eq!(unsigned_overflow(3, 1, 2, Overflow::Sat), Some(3));
    assert_eq!(unsigned_overflow(2, 1, 2, Overflow::Sat), None);
    assert_eq!(unsigned_overflow(0, -1, 8, Overflow::Sat), Some(0));
    assert_eq!(unsigned_overflow(0, -1, 8, Overflow::Wrap), Some(255));
    // SET u8 -1: the value is taken as a huge unsigned one; SAT stores the maximum.
    assert_eq!(unsigned_overflow(u64::MAX, 0, 8, Overflow::Sat), Some(255));
    assert_eq!(unsigned_overflow(u64::MAX, 0, 8, Overflow::Wrap), Some(255));
    assert_eq!(signed_overflow(127, 1, 8, Overflow::Wrap), Some(-128));
    assert_eq!(signed_overflow(127, 1, 8, Overflow::Sat), Some(127));
    assert_eq!(signed_overflow(-128, -1, 8, Overflow::Sat), Some(-128));
    assert_eq!(signed_overflow(-128, -1, 8, Overflow::Wrap), Some(127));
    assert_eq!(
        signed_overflow(i64::MAX, 1, 64, Overflow::Wrap),
        Some(i64::MIN)
    );
    assert_eq!(
        signed_overflow(i64::MIN, -1, 64, Overflow::Sat),
        Some(i64::MIN)
    );
    assert_eq!(signed_overflow(5, -10, 64, Overflow::Sat), None);
    assert_eq!(signed_overflow(200, 0, 8, Overflow::Wrap), Some(-56));
}

#[test]
fn bit_commands_read_and_write_strings() {
    let db = keel::Db::in_memory();
    let c = Cursors::default();
    assert_eq!(exec(&db, &c, &["SETBIT", "k", "7", "1"]), b":0\r\n");
    assert_eq!(exec(&db, &c, &["SETBIT", "k", "7", "0"]), b":1\r\n");
    assert_eq!(exec(&db, &c, &["SETBIT", "k", "9", "1"]), b":0\r\n");
    assert_eq!(exec(&db, &c, &["GET", "k"]), b"$2\r\n\x00\x40\r\n");
    assert_eq!(exec(&db, &c, &["GETBIT", "k", "9"]), b":1\r\n");
    assert_eq!(exec(&db, &c, &["GETBIT", "k", "1000"]), b":0\r\n");
    exec(&db, &c, &["SET", "f", "foobar"]);
    assert_eq!(exec(&db, &c, &["BITCOUNT", "f"]), b":26\r\n");
    assert_eq!(exec(&db, &c, &["BITCOUNT", "f", "1", "1"]), b":6\r\n");
    assert_eq!(
        exec(&db, &c, &["BITCOUNT", "f", "5", "30", "BIT"]),
        b":17\r\n"
    );
    assert_eq!(exec(&db, &c, &["BITCOUNT", "f", "-1", "-2"]), b":0\r\n");
    exec(&db, &c, &["SET", "p", "\u{0}\u{ff}\u{f0}"]);
    // "\u{ff}" is two bytes in UTF-8 (c3 bf), "\u{f0}" too (c3 b0).
    assert_eq!(exec(&db, &c, &["BITPOS", "p", "1"]), b":8\r\n");
    assert_eq!(exec(&db, &c, &["BITPOS", "nokey", "0"]), b":0\r\n");
    assert_eq!(exec(&db, &c, &["BITPOS", "nokey", "1"]), b":-1\r\n");
    exec(&db, &c, &["SET", "ones", "\u{7f}"]);
    // All ones after bit 0: no end given, the first 0 is past the string.
    assert_eq!(exec(&db, &c, &["BITPOS", "ones", "0", "0"]), b":0\r\n");
    assert_eq!(
        exec(&db, &c, &["BITPOS", "ones", "0", "1", "-1", "BIT"]),
        b":-1\r\n"
    );
    exec(&db, &c, &["SET", "a", "\u{1}\u{3}"]);
    exec(&db, &c, &["SET", "b", "\u{2}"]);
    assert_eq!(
        exec(&db, &c, &["BITOP", "OR", "d", "a", "b", "none"]),
        b":2\r\n"
    );
    assert_eq!(exec(&db, &c, &["GET", "d"]), b"$2\r\n\x03\x03\r\n");
    assert_eq!(exec(&db, &c, &["BITOP", "AND", "d", "a", "b"]), b":2\r\n");
    assert_eq!(exec(&db, &c, &["GET", "d"]), b"$2\r\n\x00\x00\r\n");
    assert_eq!(exec(&db, &c, &["BITOP", "NOT", "d", "b"]), b":1\r\n");
    assert_eq!(exec(&db, &c, &["GET", "d"]), b"$1\r\n\xfd\r\n");
    // Only empty sources: the destination goes, whatever it held.
    exec(&db, &c, &["DEL", "d"]);
    exec(&db, &c, &["SADD", "d", "m"]);
    assert_eq!(exec(&db, &c, &["BITOP", "XOR", "d", "x", "y"]), b":0\r\n");
    assert_eq!(exec(&db, &c, &["EXISTS", "d"]), b":0\r\n");
    let bf = exec(
        &db,
        &c,
        &[
            "BITFIELD", "bf", "INCRBY", "u2", "100", "1", "OVERFLOW", "SAT", "INCRBY", "u2", "102",
            "1", "OVERFLOW", "FAIL", "INCRBY", "u2", "102", "5", "GET", "i8", "#12",
        ],
    );
    assert_eq!(bf, b"*4\r\n:1\r\n:1\r\n$-1\r\n:5\r\n");
    assert_eq!(exec(&db, &c, &["STRLEN", "bf"]), b":13\r\n");
    assert_eq!(
        exec(&db, &c, &["BITFIELD_RO", "bf", "GET", "u2", "100"]),
        b"*1\r\n:1\r\n"
    );
}

#[test]
fn bit_commands_check_arguments_and_types() {
    let db = keel::Db::in_memory();
    let c = Cursors::default();
    exec(&db, &c, &["HSET", "h", "f", "v"]);
    let err = |a: &[&str]| try_exec(&db, &c, a).expect_err("fails").0.into_owned();
    assert_eq!(err(&["SETBIT", "k", "-1", "1"]), BAD_OFFSET);
    assert_eq!(err(&["SETBIT", "k", "1", "2"]), BAD_BIT);
    assert_eq!(err(&["SETBIT", "h", "1", "1"]), ks::WRONGTYPE);
    assert_eq!(err(&["GETBIT", "h", "1"]), ks::WRONGTYPE);
    assert_eq!(err(&["BITCOUNT", "h"]), ks::WRONGTYPE);
    assert_eq!(
        err(&["BITPOS", "k", "2"]),
        "ERR The bit argument must be 1 or 0."
    );
    assert_eq!(
        err(&["BITOP", "NOT", "d", "a", "b"]),
        "ERR BITOP NOT must be called with a single source key."
    );
    assert_eq!(err(&["BITOP", "NAND", "d", "a"]), SYNTAX);
    assert_eq!(err(&["BITOP", "OR", "d", "a", "h"]), ks::WRONGTYPE);
    assert_eq!(err(&["BITFIELD", "k", "GET", "u64", "0"]), BAD_TYPE);
    assert_eq!(err(&["BITFIELD", "k", "GET", "I8", "0"]), BAD_TYPE);
    assert_eq!(
        err(&["BITFIELD", "k", "OVERFLOW", "x"]),
        "ERR Invalid OVERFLOW type specified"
    );
    assert_eq!(
        err(&["BITFIELD_RO", "k", "SET", "u8", "0", "1"]),
        "ERR BITFIELD_RO only supports the GET subcommand"
    );
    // As in Redis 7.0, an absent key answers before the range is read.
    assert_eq!(
        try_exec(&db, &c, &["BITCOUNT", "nokey", "x", "y"]),
        Ok(b":0\r\n".to_vec())
    );
}

/// A bit write past keel's value size limit fails with an error naming it, and changes
/// nothing; with a TTL the string has 9 bytes less (the meta record's head).
#[test]
fn bit_writes_stop_at_the_value_size_limit() {
    let db = keel::Db::in_memory();
    let c = Cursors::default();
    let max = keel::limits::VALUE_BYTES_MAX as u64;
    let last_bit = (max * 8 - 1).to_string();
    assert_eq!(exec(&db, &c, &["SETBIT", "k", &last_bit, "1"]), b":0\r\n");
    assert_eq!(
        exec(&db, &c, &["STRLEN", "k"]),
        format!(":{max}\r\n").as_bytes()
    );
    let past = (max * 8).to_string();
    let e = try_exec(&db, &c, &["SETBIT", "k", &past, "1"]).expect_err("too big");
    assert!(e.0.starts_with("ERR keel: SETBIT at bit offset"), "{e:?}");
    assert!(e.0.contains(&format!("limit of {max} bytes")), "{e:?}");
    exec(&db, &c, &["SET", "t", "x", "EX", "100"]);
    let e = try_exec(&db, &c, &["SETBIT", "t", &last_bit, "1"]).expect_err("too big");
    assert!(
        e.0.contains(&format!("limit of {} bytes", max - 9)),
        "{e:?}"
    );
    let e = try_exec(&db, &c, &["BITFIELD", "t", "SET", "u8", &past, "1"]).expect_err("too big");
    assert!(e.0.starts_with("ERR keel: BITFIELD"), "{e:?}");
    assert_eq!(exec(&db, &c, &["GET", "t"]), b"$1\r\nx\r\n");
}

/// Bit writes are read-modify-writes: two of one key conflict, one commits after the other;
/// and they keep a key's TTL.
#[test]
fn bit_writes_conflict_and_keep_the_ttl() {
    let db = keel::Db::in_memory();
    let c = Cursors::default();
    exec(&db, &c, &["SET", "k", "a", "EX", "100"]);
    let mut t1 = db.begin().expect("begin");
    let mut t2 = db.begin().expect("begin");
    run_in(&mut t1, &c, &["SETBIT", "k", "0", "1"]);
    run_in(&mut t2, &c, &["BITFIELD", "k", "INCRBY", "u8", "8", "1"]);
    assert!(t1.commit().expect("commit").is_ok());
    assert!(t2.commit().expect("commit").is_err(), "a lost update");
    assert_eq!(exec(&db, &c, &["GET", "k"]), b"$1\r\n\xe1\r\n");
    let ttl = exec(&db, &c, &["TTL", "k"]);
    assert!(ttl != b":-1\r\n" && ttl != b":-2\r\n", "{ttl:?}");
}

use super::*;

#[test]
fn parse_int_accepts_only_canonical_decimal() {
    assert_eq!(parse_int(b"k", b"0").unwrap(), 0);
    assert_eq!(parse_int(b"k", b"-17").unwrap(), -17);
    assert_eq!(parse_int(b"k", b"9223372036854775807").unwrap(), i64::MAX);
    for bad in [
        &b""[..],
        b"-",
        b"+1",
        b" 1",
        b"01",
        b"-0",
        b"1.0",
        b"9223372036854775808",
        b"abc",
    ] {
        assert!(parse_int(b"k", bad).is_err(), "{bad:?}");
    }
}

#[test]
fn add_overflow_is_an_error() {
    let err = Op::Add(1)
        .apply(b"k", Some(b"9223372036854775807"))
        .unwrap_err();
    assert_eq!(err, Error::Overflow { key: b"k".to_vec() });
}

#[test]
fn max_min_on_missing_take_the_argument() {
    assert_eq!(Op::Max(-5).apply(b"k", None).unwrap(), b"-5");
    assert_eq!(Op::Min(3).apply(b"k", Some(b"7")).unwrap(), b"3");
    assert_eq!(Op::Max(3).apply(b"k", Some(b"7")).unwrap(), b"7");
}

#[test]
fn ordered_put_keeps_highest_order_and_larger_payload_on_ties() {
    let first = Op::OrderedPut {
        order: 5,
        value: b"a".to_vec(),
    }
    .apply(b"k", None)
    .unwrap();
    let lower = Op::OrderedPut {
        order: 4,
        value: b"b".to_vec(),
    }
    .apply(b"k", Some(&first))
    .unwrap();
    assert_eq!(decode_ordered(&lower).unwrap(), (5, &b"a"[..]));
    let tie = Op::OrderedPut {
        order: 5,
        value: b"c".to_vec(),
    }
    .apply(b"k", Some(&first))
    .unwrap();
    assert_eq!(decode_ordered(&tie).unwrap(), (5, &b"c"[..]));
    let smaller_tie = Op::OrderedPut {
        order: 5,
        value: b"0".to_vec(),
    }
    .apply(b"k", Some(&tie))
    .unwrap();
    assert_eq!(decode_ordered(&smaller_tie).unwrap(), (5, &b"c"[..]));
    assert!(
        Op::OrderedPut {
            order: 1,
            value: vec![]
        }
        .apply(b"k", Some(b"short"))
        .is_err()
    );
}

#[test]
fn top_k_keeps_highest_scores_and_unique_members() {
    let mut value = None;
    for (score, member) in [(3, "c"), (-1, "neg"), (10, "a"), (5, "b"), (7, "c")] {
        let op = Op::TopK {
            k: 3,
            score,
            member: member.as_bytes().to_vec(),
        };
        value = Some(op.apply(b"k", value.as_deref()).unwrap());
    }
    let entries = decode_top_k(value.as_deref().unwrap()).unwrap();
    let want: Vec<(i64, Vec<u8>)> =
        vec![(10, b"a".to_vec()), (7, b"c".to_vec()), (5, b"b".to_vec())];
    assert_eq!(entries, want);
    assert!(
        Op::TopK {
            k: 0,
            score: 1,
            member: vec![]
        }
        .check()
        .is_err()
    );
}

use super::*;

const OPEN: Limits = Limits {
    bulk_bytes_max: 512 * 1024 * 1024,
    authenticated: true,
};

fn args_of(buf: &[u8], limits: Limits) -> (Vec<Vec<u8>>, usize) {
    match parse(buf, limits).expect("valid request") {
        Request::Parsed(Parsed::Request { args, consumed }) => (
            args.into_iter().map(|r| buf[r].to_vec()).collect(),
            consumed,
        ),
        Request::Inline { args, consumed } => (args, consumed),
        other => panic!("expected a request, got {other:?}"),
    }
}

fn words(ws: &[&str]) -> Vec<Vec<u8>> {
    ws.iter().map(|w| w.as_bytes().to_vec()).collect()
}

#[test]
fn multibulk_and_pipeline() {
    let buf = b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*1\r\n$4\r\nPING\r\n";
    let (args, used) = args_of(buf, OPEN);
    assert_eq!(args, words(&["GET", "k"]));
    let (args, rest) = args_of(&buf[used..], OPEN);
    assert_eq!(args, words(&["PING"]));
    assert_eq!(used + rest, buf.len());
}

#[test]
fn every_prefix_is_incomplete() {
    let buf = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\n";
    for end in 0..buf.len() {
        match parse(&buf[..end], OPEN) {
            Ok(Request::Parsed(Parsed::Incomplete { needed })) => {
                if let Some(n) = needed {
                    assert!(n > end, "needed {n} at prefix {end}");
                }
            }
            other => panic!("prefix {end}: {other:?}"),
        }
    }
    assert_eq!(args_of(buf, OPEN).0, words(&["SET", "k", "hello"]));
}

#[test]
fn binary_bulk_bodies_are_not_scanned() {
    let buf = b"*2\r\n$3\r\nGET\r\n$4\r\n\r\n\r\n\r\n";
    assert_eq!(
        args_of(buf, OPEN).0,
        vec![b"GET".to_vec(), b"\r\n\r\n".to_vec()]
    );
}

#[test]
fn inline_commands() {
    assert_eq!(args_of(b"PING\r\n", OPEN), (words(&["PING"]), 6));
    assert_eq!(args_of(b"set k v\n", OPEN), (words(&["set", "k", "v"]), 8));
    assert_eq!(
        args_of(b"SET \"a b\" 'c d' \"\\x41\\n\"\r\n", OPEN).0,
        vec![
            b"SET".to_vec(),
            b"a b".to_vec(),
            b"c d".to_vec(),
            b"A\n".to_vec()
        ]
    );
    assert_eq!(
        parse(b"\r\n", OPEN),
        Ok(Request::Parsed(Parsed::Skip { consumed: 2 }))
    );
    assert_eq!(
        parse(b"PING", OPEN),
        Ok(Request::Parsed(Parsed::Incomplete { needed: None }))
    );
}

#[test]
fn empty_multibulk_is_skipped() {
    assert_eq!(
        parse(b"*0\r\n", OPEN),
        Ok(Request::Parsed(Parsed::Skip { consumed: 4 }))
    );
    assert_eq!(
        parse(b"*-1\r\n", OPEN),
        Ok(Request::Parsed(Parsed::Skip { consumed: 5 }))
    );
}

#[test]
fn redis_error_texts() {
    let cases: &[(&[u8], &str)] = &[
        (b"*x\r\n", "Protocol error: invalid multibulk length"),
        (
            b"*3000000000\r\n",
            "Protocol error: invalid multibulk length",
        ),
        (b"*1\r\n+PING\r\n", "Protocol error: expected '$', got '+'"),
        (b"*1\r\n$-1\r\n", "Protocol error: invalid bulk length"),
        (b"*1\r\n$abc\r\n", "Protocol error: invalid bulk length"),
        (b"*1\r\n$01\r\n", "Protocol error: invalid bulk length"),
        (
            b"SET \"a\r\n",
            "Protocol error: unbalanced quotes in request",
        ),
        (
            b"SET \"a\"b\r\n",
            "Protocol error: unbalanced quotes in request",
        ),
        (
            b"SET 'a\r\n",
            "Protocol error: unbalanced quotes in request",
        ),
    ];
    for (buf, text) in cases {
        let err = parse(buf, OPEN).expect_err("malformed");
        assert_eq!(
            err.to_string(),
            *text,
            "for {:?}",
            String::from_utf8_lossy(buf)
        );
    }
}

#[test]
fn proto_max_bulk_len() {
    let limits = Limits {
        bulk_bytes_max: 10,
        ..OPEN
    };
    assert!(args_of(b"*1\r\n$10\r\n0123456789\r\n", limits).1 > 0);
    assert_eq!(
        parse(b"*1\r\n$11\r\n", limits),
        Err(ProtoError::InvalidBulkLength)
    );
}

#[test]
fn unauthenticated_limits() {
    let closed = Limits {
        authenticated: false,
        ..OPEN
    };
    assert_eq!(
        parse(b"*11\r\n", closed),
        Err(ProtoError::UnauthenticatedMultibulkLength)
    );
    assert_eq!(
        parse(b"*1\r\n$16385\r\n", closed),
        Err(ProtoError::UnauthenticatedBulkLength)
    );
    assert!(matches!(
        parse(b"*10\r\n$16384\r\n", closed),
        Ok(Request::Parsed(Parsed::Incomplete { .. }))
    ));
}

#[test]
fn oversized_lines() {
    let long = vec![b'a'; INLINE_BYTES_MAX + 1];
    assert_eq!(parse(&long, OPEN), Err(ProtoError::InlineTooBig));
    let mut mbulk = b"*".to_vec();
    mbulk.extend(std::iter::repeat_n(b'1', INLINE_BYTES_MAX + 1));
    assert_eq!(parse(&mbulk, OPEN), Err(ProtoError::MbulkCountTooBig));
    let mut bulk = b"*1\r\n$".to_vec();
    bulk.extend(std::iter::repeat_n(b'1', INLINE_BYTES_MAX + 1));
    assert_eq!(parse(&bulk, OPEN), Err(ProtoError::BulkCountTooBig));
}

#[test]
fn huge_count_does_not_preallocate() {
    // Two billion claimed arguments, none sent: the parser must just wait.
    assert!(matches!(
        parse(b"*2000000000\r\n", OPEN),
        Ok(Request::Parsed(Parsed::Incomplete { .. }))
    ));
}

#[test]
fn string_to_i64_matches_redis() {
    assert_eq!(string_to_i64(b"0"), Some(0));
    assert_eq!(string_to_i64(b"-12"), Some(-12));
    assert_eq!(string_to_i64(b"9223372036854775807"), Some(i64::MAX));
    assert_eq!(string_to_i64(b"-9223372036854775808"), Some(i64::MIN));
    for bad in [
        &b""[..],
        b"-",
        b"+1",
        b"01",
        b"-0",
        b" 1",
        b"1 ",
        b"9223372036854775808",
    ] {
        assert_eq!(string_to_i64(bad), None, "{bad:?}");
    }
}

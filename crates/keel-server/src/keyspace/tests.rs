use super::*;

#[test]
fn plain_keys_escape_ff_and_keep_user_order() {
    assert_eq!(&*plain_key(b"abc"), b"abc");
    assert!(matches!(plain_key(b"abc"), Cow::Borrowed(_)));
    assert_eq!(&*plain_key(b"\xffm"), b"\xff\x00m");
    assert_eq!(&*plain_key(b"\xff"), b"\xff\x00");
    for k in [
        &b"a"[..],
        b"",
        b"\xfe\xff",
        b"\xff",
        b"\xff\xff\x01",
        b"\xffm",
    ] {
        assert_eq!(user_key(&plain_key(k)).as_deref(), Some(k));
        assert!(&*plain_key(k) < PLAIN_END, "{k:?} is a plain key");
    }
    // Internal keys are not user keys.
    assert_eq!(user_key(&meta_key(b"a")), None);
    assert_eq!(user_key(&expiry_key(5, b"a")), None);
    // The escaping keeps user keys in their order.
    let mut users: Vec<&[u8]> = vec![b"\xff\x01", b"a", b"\xff", b"\xfe", b"\xff\x00", b""];
    let mut engine: Vec<Vec<u8>> = users.iter().map(|k| plain_key(k).into_owned()).collect();
    users.sort();
    engine.sort();
    let back: Vec<Vec<u8>> = engine
        .iter()
        .map(|k| user_key(k).expect("plain").into_owned())
        .collect();
    assert_eq!(back, users.iter().map(|k| k.to_vec()).collect::<Vec<_>>());
}

#[test]
fn internal_keys() {
    assert_eq!(&*meta_key(b"k"), b"\xffmk");
    let e = expiry_key(0x0102, b"key");
    assert_eq!(&e[..2], b"\xffx");
    assert_eq!(parse_expiry_key(&e), Some((0x0102, &b"key"[..])));
    assert_eq!(parse_expiry_key(b"\xffx\x00"), None);
    // The expiry index is ordered by deadline first.
    assert!(*expiry_key(1, b"z") < *expiry_key(2, b"a"));
    assert_eq!(&*size_key(7), b"\xffn\0\0\0\0\0\0\0\x07");
    assert_eq!(&grave_key(7)[..2], b"\xffg");
    assert_eq!(&*sub_key(HASH_FIELD, 1, b"f"), b"\xffh\0\0\0\0\0\0\0\x01f");
    assert!(sub_key(HASH_FIELD, 1, b"f").starts_with(&sub_prefix(HASH_FIELD, 1)));
    // Long keys spill to the heap and stay whole.
    let long = vec![b'x'; 300];
    let m = meta_key(&long);
    assert_eq!(m.len(), 302);
    assert_eq!(&m[2..], &long[..]);
}

#[test]
fn prefix_ranges() {
    assert_eq!(prefix_end(b"ab"), Some(b"ac".to_vec()));
    assert_eq!(prefix_end(b"a\xff"), Some(b"b".to_vec()));
    assert_eq!(prefix_end(b"\xff"), None);
    assert_eq!(
        prefix_range(b"a"),
        (
            Bound::Included(b"a".to_vec()),
            Bound::Excluded(b"b".to_vec())
        )
    );
}

#[test]
fn meta_records_round_trip() {
    let s = Meta::string(b"hello", 1_700_000_000_000);
    let bytes = s.encode();
    assert_eq!(bytes[0], b's');
    assert_eq!(&bytes[1..9], &1_700_000_000_000u64.to_be_bytes());
    assert_eq!(&bytes[9..], b"hello");
    assert_eq!(Meta::decode(&bytes), Ok(s));
    let mut h = Meta::collection(Type::Hash);
    h.deadline = 9;
    let bytes = h.encode();
    assert_eq!(bytes.len(), 17);
    assert_eq!(Meta::decode(&bytes), Ok(h.clone()));
    assert_ne!(Meta::collection(Type::Hash).generation, h.generation);
    // Damage is an error, not a panic.
    for bad in [
        &b""[..],
        b"s",
        b"q\0\0\0\0\0\0\0\0",
        b"h\0\0\0\0\0\0\0\0\x01",
    ] {
        assert!(Meta::decode(bad).is_err(), "{bad:?}");
    }
    // A list in keel's earlier layout (one record per element) is refused by name.
    let mut old = Meta::collection(Type::List).encode();
    assert_eq!(old[0], b'q');
    old[0] = b'l';
    let refused = Meta::decode(&old).expect_err("the old layout");
    assert!(refused.0.contains("older keel"), "{}", refused.0);
    assert!(!s_expired(0, 5));
    assert!(s_expired(5, 5));
    assert!(!s_expired(6, 5));
}

fn s_expired(deadline: u64, now: u64) -> bool {
    Meta::string(b"", deadline).expired(now) && deadline != 0
}

#[test]
fn merged_listing_is_ordered_and_capped() {
    let l = |k: &[u8]| Listed {
        key: k.to_vec(),
        ty: Type::String,
        value: Vec::new(),
    };
    let keys = |v: Vec<Listed>| v.into_iter().map(|l| l.key).collect::<Vec<_>>();
    let got = merge(
        vec![l(b"a"), l(b"c"), l(b"e")],
        vec![l(b"b"), l(b"c"), l(b"d")],
        false,
        10,
    );
    assert_eq!(
        keys(got),
        [b"a", b"b", b"c", b"d", b"e"].map(|k| k.to_vec())
    );
    let got = merge(vec![l(b"e"), l(b"c")], vec![l(b"d"), l(b"a")], true, 3);
    assert_eq!(keys(got), [b"e", b"d", b"c"].map(|k| k.to_vec()));
}

#[test]
fn the_clock_is_read_once_per_attempt_and_never_goes_back() {
    let clock = Clock::default();
    let first = clock.now_ms();
    std::thread::sleep(std::time::Duration::from_millis(3));
    assert_eq!(clock.now_ms(), first);
    clock.reset();
    assert!(clock.now_ms() > first);
    let a = unix_ms();
    assert!(unix_ms() >= a);
}

/// A key past its deadline: a snapshot cannot delete it, so its lookup fails and asks for a
/// rerun; a transaction sees it absent and deletes it (meta record and expiry index entry).
#[test]
fn an_expired_key_is_deleted_by_the_transaction_that_meets_it() {
    let db = keel::Db::in_memory();
    let deadline = unix_ms() - 1;
    let mut t = db.begin().expect("begin");
    put_string(&mut t, b"k", b"v", deadline, &Held::Absent).expect("put");
    t.commit().expect("commit").expect("no conflict");
    let engine_keys = |db: &keel::Db| {
        db.snapshot()
            .expect("snapshot")
            .range::<Vec<u8>>(..)
            .count()
    };
    assert_eq!(
        engine_keys(&db),
        2,
        "the meta record and its expiry index entry"
    );

    let clock = Clock::default();
    let snap = db.snapshot().expect("snapshot");
    let got = read_string(&mut View::Snap(&snap), &clock, b"k", |v| {
        v.map(<[u8]>::to_vec)
    });
    assert_eq!(got, Err(EXPIRED_IN_SNAPSHOT.into()));
    assert!(clock.rerun.load(Relaxed));
    drop(snap);

    clock.reset();
    let mut t = db.begin().expect("begin");
    let got = read_string(&mut View::Txn(&mut t), &clock, b"k", |v| {
        v.map(<[u8]>::to_vec)
    });
    assert_eq!(got, Ok(None));
    assert!(!clock.rerun.load(Relaxed));
    t.commit().expect("commit").expect("no conflict");
    assert_eq!(engine_keys(&db), 0);

    // A live deadline reads as the value, from a snapshot too.
    let mut t = db.begin().expect("begin");
    put_string(&mut t, b"k", b"w", unix_ms() + 60_000, &Held::Absent).expect("put");
    t.commit().expect("commit").expect("no conflict");
    let snap = db.snapshot().expect("snapshot");
    let got = read_string(&mut View::Snap(&snap), &clock, b"k", |v| {
        v.map(<[u8]>::to_vec)
    });
    assert_eq!(got, Ok(Some(b"w".to_vec())));
}

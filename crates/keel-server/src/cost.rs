//! The work behind redis-benchmark's type tests (`LPUSH`, `SADD`, `SPOP`, `ZPOPMIN`,
//! `LRANGE_100/300/600`, ...) and `hot-collection.sh`'s `ZINCRBY`,
//! and `ZPOPMAX` beside them (which pops from the other end of the score index), run in process through the command functions, so that a profiler can count it without a
//! server or a client: each test fills a key as redis-benchmark does, then runs the measured
//! loop in a function of its own (`measured_*`). Instructions per command:
//!
//! ```sh
//! cargo test --release -p keel-server --lib cost:: --no-run   # prints the test binary
//! valgrind --tool=callgrind --fair-sched=yes --toggle-collect='keel_server::cost::measured_*' \
//!   target/release/deps/keel_server-<hash> cost::spop --test-threads=1
//! ```
//!
//! and divide the total `Ir` by the commands the loop ran (each test prints its count).
//! The collector's thread is kept asleep ([`db`]): the passes the pops' own commits run
//! (every 8 deletes) are counted with them, the same every run. The
//! tests check the replies too, and that concurrent pops of one key conflict only as they
//! must (`*_interleaved`).

use bytes::{Bytes, BytesMut};

use crate::data::test_support::{args, ctx, exec};
use crate::data::{self, Cursors, View};
use crate::reply::{Out, Proto};

/// Members or elements a test loads: redis-benchmark loads ~95 000 with its defaults, which
/// is too slow under a profiler; the costs that grow with the size show at this one.
const LOADED: usize = 10_000;

/// redis-benchmark's `element:__rand_int__` with `-r 1000000`: twelve digits.
fn element(i: usize) -> String {
    // A fixed scramble of 0..1_000_000, so that members arrive out of order.
    format!("element:{:012}", (i * 7_919 + 13) % 1_000_000)
}

/// Runs a write command in its own transaction, retrying nothing: it must commit.
fn write(db: &keel::Db, cursors: &Cursors, a: &[&str]) -> Vec<u8> {
    exec(db, cursors, a)
}

/// Runs a read-only command on a snapshot, as the server does outside `MULTI`.
fn read(db: &keel::Db, cursors: &Cursors, a: &[&str]) -> Vec<u8> {
    let cmd = crate::table::lookup(a[0].as_bytes())
        .expect("a command")
        .cmd;
    let snap = db.snapshot().expect("snapshot");
    let mut buf = BytesMut::new();
    let mut out = Out::new(&mut buf, Proto::Resp2);
    data::run(
        cmd,
        &args(a),
        &mut View::Snap(&snap),
        &ctx(cursors),
        &mut out,
    )
    .expect("runs");
    buf.to_vec()
}

/// The count of the array a RESP2 reply opens with.
fn array_len(reply: &[u8]) -> usize {
    assert_eq!(reply[0], b'*', "{}", String::from_utf8_lossy(reply));
    let end = reply.iter().position(|&b| b == b'\r').expect("a line");
    std::str::from_utf8(&reply[1..end])
        .expect("ascii")
        .parse()
        .expect("a count")
}

/// A database whose collector thread does not run during a test (an hour apart): deleted
/// keys are collected by the passes of the commits that delete them, on the measured thread.
fn db() -> keel::Db {
    keel::Db::with_options(
        keel::Options::default().collector_interval(std::time::Duration::from_secs(3600)),
    )
}

#[inline(never)]
fn measured_spop(db: &keel::Db, cursors: &Cursors, n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|_| write(db, cursors, &["SPOP", "myset"]))
        .collect()
}

#[inline(never)]
fn measured_zpopmin(db: &keel::Db, cursors: &Cursors, n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|_| write(db, cursors, &["ZPOPMIN", "myzset"]))
        .collect()
}

/// Pops in transactions of [`PIPELINED`] commands each, as the server runs a pipeline of
/// redis-benchmark's `-P 16`: each pop's scan passes the members the ones before it deleted.
#[inline(never)]
fn measured_pipelined(db: &keel::Db, cursors: &Cursors, a: &[&str], n: usize) -> Vec<Vec<u8>> {
    let mut replies = Vec::with_capacity(n);
    while replies.len() < n {
        let mut txn = db.begin().expect("begin");
        for _ in 0..PIPELINED.min(n - replies.len()) {
            replies.push(crate::data::test_support::run_in(&mut txn, cursors, a));
        }
        txn.commit().expect("commit").expect("no conflict");
    }
    replies
}

/// Commands per transaction in [`measured_pipelined`]: redis-benchmark's `-P 16`.
const PIPELINED: usize = 16;

#[inline(never)]
fn measured_zpopmax(db: &keel::Db, cursors: &Cursors, n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|_| write(db, cursors, &["ZPOPMAX", "myzset"]))
        .collect()
}

#[inline(never)]
fn measured_pop(db: &keel::Db, cursors: &Cursors, cmd: &str, n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|_| write(db, cursors, &[cmd, "mylist"]))
        .collect()
}

#[inline(never)]
fn measured_push(db: &keel::Db, cursors: &Cursors, cmd: &str, n: usize) -> usize {
    (0..n)
        .map(|_| write(db, cursors, &[cmd, "mylist", "xxx"]).len())
        .sum()
}

#[inline(never)]
fn measured_lrange(db: &keel::Db, cursors: &Cursors, stop: usize, n: usize) -> usize {
    let stop = stop.to_string();
    (0..n)
        .map(|_| array_len(&read(db, cursors, &["LRANGE", "mylist", "0", &stop])))
        .sum()
}

/// A set loaded as redis-benchmark's `SADD` test leaves it.
fn loaded_set() -> (keel::Db, Cursors) {
    let db = db();
    let cursors = Cursors::default();
    for i in 0..LOADED {
        write(&db, &cursors, &["SADD", "myset", &element(i)]);
    }
    (db, cursors)
}

/// Checks the replies of popping a set loaded by [`loaded_set`] empty and once more: each
/// member once, then nothing.
fn check_spopped(db: &keel::Db, cursors: &Cursors, popped: &[Vec<u8>]) {
    assert_eq!(popped.len(), LOADED + 1);
    let mut seen = std::collections::BTreeSet::new();
    for reply in &popped[..LOADED] {
        assert!(reply.starts_with(b"$20\r\nelement:"), "{reply:?}");
        assert!(seen.insert(reply.clone()), "popped twice: {reply:?}");
    }
    assert_eq!(popped[LOADED], b"$-1\r\n");
    assert_eq!(read(db, cursors, &["EXISTS", "myset"]), b":0\r\n");
}

#[test]
fn spop() {
    let (db, cursors) = loaded_set();
    let popped = measured_spop(&db, &cursors, LOADED + 1);
    eprintln!("spop: {} commands", popped.len());
    check_spopped(&db, &cursors, &popped);
}

/// `SPOP` as the server runs redis-benchmark's pipelined test: 16 pops per transaction.
#[test]
fn spop_pipelined() {
    let (db, cursors) = loaded_set();
    let popped = measured_pipelined(&db, &cursors, &["SPOP", "myset"], LOADED + 1);
    eprintln!("spop_pipelined: {} commands", popped.len());
    check_spopped(&db, &cursors, &popped);
}

/// A sorted set loaded as redis-benchmark's `ZADD` test leaves it.
fn loaded_zset() -> (keel::Db, Cursors) {
    let db = db();
    let cursors = Cursors::default();
    for i in 0..LOADED {
        let member = element(i);
        // redis-benchmark's score is a random integer too.
        let score = &member["element:".len()..];
        write(&db, &cursors, &["ZADD", "myzset", score, &member]);
    }
    (db, cursors)
}

/// Checks the replies of popping a set loaded by [`loaded_zset`] empty and once more: each
/// pop after the last in pop order (members sort as their scores do here), then nothing.
fn check_popped(db: &keel::Db, cursors: &Cursors, popped: &[Vec<u8>], max: bool) {
    assert_eq!(popped.len(), LOADED + 1);
    for pair in popped[..LOADED].windows(2) {
        for reply in pair {
            assert!(reply.starts_with(b"*2\r\n$20\r\nelement:"), "{reply:?}");
        }
        let in_order = if max {
            pair[0] > pair[1]
        } else {
            pair[0] < pair[1]
        };
        assert!(in_order, "out of order: {:?} then {:?}", pair[0], pair[1]);
    }
    assert_eq!(popped[LOADED], b"*0\r\n");
    assert_eq!(read(db, cursors, &["EXISTS", "myzset"]), b":0\r\n");
}

#[test]
fn zpopmin() {
    let (db, cursors) = loaded_zset();
    let popped = measured_zpopmin(&db, &cursors, LOADED + 1);
    eprintln!("zpopmin: {} commands", popped.len());
    check_popped(&db, &cursors, &popped, false);
}

/// `ZPOPMIN` as the server runs redis-benchmark's pipelined test: 16 pops per transaction.
#[test]
fn zpopmin_pipelined() {
    let (db, cursors) = loaded_zset();
    let popped = measured_pipelined(&db, &cursors, &["ZPOPMIN", "myzset"], LOADED + 1);
    eprintln!("zpopmin_pipelined: {} commands", popped.len());
    check_popped(&db, &cursors, &popped, false);
}

/// `ZPOPMAX` pops from the top of the score index, so the emptied leaves a backward scan
/// passes pile up at its end.
#[test]
fn zpopmax() {
    let (db, cursors) = loaded_zset();
    let popped = measured_zpopmax(&db, &cursors, LOADED + 1);
    eprintln!("zpopmax: {} commands", popped.len());
    check_popped(&db, &cursors, &popped, true);
}

/// `LPOP`/`RPOP` until the list (as redis-benchmark's `LPUSH` leaves it) is gone.
fn pop(cmd: &str) {
    let db = db();
    let cursors = Cursors::default();
    for i in 0..LOADED {
        write(&db, &cursors, &["RPUSH", "mylist", &element(i)]);
    }
    let popped = measured_pop(&db, &cursors, cmd, LOADED + 1);
    eprintln!("{cmd}: {} commands", popped.len());
    for (n, reply) in popped[..LOADED].iter().enumerate() {
        let i = if cmd == "LPOP" { n } else { LOADED - 1 - n };
        let want = format!("$20\r\n{}\r\n", element(i));
        assert_eq!(reply, want.as_bytes(), "pop {n}");
    }
    assert_eq!(popped[LOADED], b"$-1\r\n");
    assert_eq!(read(&db, &cursors, &["EXISTS", "mylist"]), b":0\r\n");
}

#[test]
fn lpop() {
    pop("LPOP");
}

#[test]
fn rpop() {
    pop("RPOP");
}

/// `LPUSH`/`RPUSH` of redis-benchmark's 3-byte value onto one list, long enough from the
/// start to be spread over chunks.
fn push(cmd: &str) {
    let db = db();
    let cursors = Cursors::default();
    for _ in 0..200 {
        write(&db, &cursors, &["RPUSH", "mylist", "xxx"]);
    }
    measured_push(&db, &cursors, cmd, LOADED);
    eprintln!("{}: {LOADED} commands", cmd.to_lowercase());
    let len = format!(":{}\r\n", LOADED + 200);
    assert_eq!(read(&db, &cursors, &["LLEN", "mylist"]), len.as_bytes());
}

/// `LPUSH` as the server runs redis-benchmark's pipelined test: 16 pushes per transaction.
#[test]
fn lpush_pipelined() {
    let db = db();
    let cursors = Cursors::default();
    for _ in 0..200 {
        write(&db, &cursors, &["RPUSH", "mylist", "xxx"]);
    }
    // The replies (the list's length) are filled in at commit, which the harness skips.
    let replies = measured_pipelined(&db, &cursors, &["LPUSH", "mylist", "xxx"], LOADED);
    eprintln!("lpush_pipelined: {} commands", replies.len());
    let len = format!(":{}\r\n", LOADED + 200);
    assert_eq!(read(&db, &cursors, &["LLEN", "mylist"]), len.as_bytes());
}

#[inline(never)]
fn measured_add(db: &keel::Db, cursors: &Cursors, cmd: &str, key: &str, n: usize) -> usize {
    (0..n)
        .map(|i| write(db, cursors, &[cmd, key, &element(LOADED + i)]).len())
        .sum()
}

/// `SADD myset element:N` of new members (an insert into the ordered index each), onto a set
/// of [`LOADED`], as redis-benchmark's `SADD` test does (it draws members at random).
#[test]
fn sadd() {
    let (db, cursors) = loaded_set();
    let replies = measured_add(&db, &cursors, "SADD", "myset", LOADED);
    eprintln!("sadd: {LOADED} commands");
    assert_eq!(replies, LOADED * b":1\r\n".len());
    let card = format!(":{}\r\n", 2 * LOADED);
    assert_eq!(read(&db, &cursors, &["SCARD", "myset"]), card.as_bytes());
}

/// Runs a write command in its own transaction, as the server does: replies that wait for
/// the commit (increments) are filled in after it.
fn write_filled(db: &keel::Db, cursors: &Cursors, a: &[&str]) -> Vec<u8> {
    let cmd = crate::table::lookup(a[0].as_bytes())
        .expect("a command")
        .cmd;
    let mut txn = db.begin().expect("begin");
    let mut buf = BytesMut::new();
    let mut out = Out::new(&mut buf, Proto::Resp2);
    data::run(
        cmd,
        &args(a),
        &mut View::Txn(&mut txn),
        &ctx(cursors),
        &mut out,
    )
    .expect("runs");
    let committed = txn.commit_detailed().expect("commit").expect("no conflict");
    out.fill(&committed);
    buf.to_vec()
}

#[inline(never)]
fn measured_zincrby(db: &keel::Db, cursors: &Cursors, n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| write_filled(db, cursors, &["ZINCRBY", "myzset", "1", &element(i)]))
        .collect()
}

/// `ZINCRBY myzset 1 element:N` of members of a sorted set of [`LOADED`] (each moves in the
/// score index), as `hot-collection.sh`'s `ZINCRBY` test does.
#[test]
fn zincrby() {
    let db = db();
    let cursors = Cursors::default();
    for i in 0..LOADED {
        write(
            &db,
            &cursors,
            &["ZADD", "myzset", &i.to_string(), &element(i)],
        );
    }
    let replies = measured_zincrby(&db, &cursors, LOADED);
    eprintln!("zincrby: {LOADED} commands");
    for (i, reply) in replies.iter().enumerate() {
        let score = (i + 1).to_string();
        let expected = format!("${}\r\n{score}\r\n", score.len());
        assert_eq!(reply, expected.as_bytes());
    }
    let card = format!(":{LOADED}\r\n");
    assert_eq!(read(&db, &cursors, &["ZCARD", "myzset"]), card.as_bytes());
    let last = LOADED.to_string();
    let top = read(&db, &cursors, &["ZRANGEBYSCORE", "myzset", &last, "+inf"]);
    let member = element(LOADED - 1);
    assert_eq!(
        top,
        format!("*1\r\n${}\r\n{member}\r\n", member.len()).as_bytes()
    );
}

/// `SET element:N xxx` of new keys beside [`LOADED`] others: an insert into the ordered
/// index each, among keys that share their first 14 bytes.
#[test]
fn set_new() {
    let db = db();
    let cursors = Cursors::default();
    for i in 0..LOADED {
        write(&db, &cursors, &["SET", &element(i), "xxx"]);
    }
    let mut n = 0;
    measured_set(&db, &cursors, &mut n);
    eprintln!("set_new: {n} commands");
    assert_eq!(
        read(&db, &cursors, &["DBSIZE"]),
        format!(":{}\r\n", LOADED + n).as_bytes()
    );
}

#[inline(never)]
fn measured_set(db: &keel::Db, cursors: &Cursors, n: &mut usize) {
    for i in 0..LOADED {
        write(db, cursors, &["SET", &element(LOADED + i), "xxx"]);
        *n += 1;
    }
}

/// `DEL` of each of 10 000 string keys in turn: the delete-heavy load whose tombstones the
/// collector's passes (every `COLLECT_CANDIDATES` deletes, `keel::gc`) take away.
#[test]
fn del() {
    let db = db();
    let cursors = Cursors::default();
    for i in 0..LOADED {
        write(&db, &cursors, &["SET", &element(i), "xxx"]);
    }
    let deleted = measured_del(&db, &cursors);
    eprintln!("del: {LOADED} commands");
    assert_eq!(deleted, LOADED);
    assert_eq!(read(&db, &cursors, &["DBSIZE"]), b":0\r\n");
}

#[inline(never)]
fn measured_del(db: &keel::Db, cursors: &Cursors) -> usize {
    // In another order than the keys were set in.
    (0..LOADED)
        .filter(|i| write(db, cursors, &["DEL", &element((i * 31) % LOADED)]) == b":1\r\n")
        .count()
}

#[test]
fn lpush() {
    push("LPUSH");
}

#[test]
fn rpush() {
    push("RPUSH");
}

fn lrange(stop: usize) {
    let db = db();
    let cursors = Cursors::default();
    for _ in 0..LOADED {
        write(&db, &cursors, &["LPUSH", "mylist", "xxx"]);
    }
    let runs = 200;
    let items = measured_lrange(&db, &cursors, stop, runs);
    eprintln!("lrange_{}: {runs} commands", stop + 1);
    assert_eq!(items, runs * (stop + 1));
}

#[test]
fn lrange_100() {
    lrange(99);
}

#[test]
fn lrange_300() {
    lrange(299);
}

#[test]
fn lrange_600() {
    lrange(599);
}

/// Runs `cmd` in `k` transactions begun together and committed one after another, as `k`
/// clients' commands overlap on a server's threads; returns how many conflicted.
fn interleaved(db: &keel::Db, cursors: &Cursors, cmd: &[&str], k: usize) -> usize {
    let c = ctx(cursors);
    let table = crate::table::lookup(cmd[0].as_bytes())
        .expect("a command")
        .cmd;
    let cmd_args: Vec<Bytes> = args(cmd);
    let mut txns = Vec::new();
    for _ in 0..k {
        let mut txn = db.begin().expect("begin");
        let mut buf = BytesMut::new();
        let mut out = Out::new(&mut buf, Proto::Resp2);
        data::run(table, &cmd_args, &mut View::Txn(&mut txn), &c, &mut out).expect("runs");
        txns.push(txn);
    }
    txns.into_iter()
        .map(|t| t.commit().expect("commit"))
        .filter(Result::is_err)
        .count()
}

/// Two pops of a spread set's last two members at once: each reads both, picks one and
/// lowers the size without reading it, so the commit must check the member each left. One
/// of the two conflicts, and the set holds one member; had both committed, the set would be
/// empty with its key left behind.
#[test]
fn spop_of_the_last_two_at_once() {
    let db = db();
    let cursors = Cursors::default();
    let mut conflicts = 0;
    for round in 0..20 {
        let key = format!("set{round}");
        // `a` and `b` stay: each pop picks either about half the time.
        for m in ["a", "b"]
            .into_iter()
            .map(String::from)
            .chain((0..298).map(element))
        {
            write(&db, &cursors, &["SADD", &key, &m]);
        }
        for i in 0..298 {
            write(&db, &cursors, &["SREM", &key, &element(i)]);
        }
        assert_eq!(read(&db, &cursors, &["SCARD", &key]), b":2\r\n");
        conflicts += interleaved(&db, &cursors, &["SPOP", &key], 2);
        assert_eq!(read(&db, &cursors, &["SCARD", &key]), b":1\r\n");
        assert_eq!(array_len(&read(&db, &cursors, &["SMEMBERS", &key])), 1);
        write(&db, &cursors, &["SPOP", &key]);
        assert_eq!(read(&db, &cursors, &["EXISTS", &key]), b":0\r\n");
    }
    assert_eq!(conflicts, 20);
}

/// Two pops of a large set at once pick different members, and neither reads what the
/// other writes beyond what it must: they rarely conflict.
#[test]
fn spop_interleaved() {
    let db = db();
    let cursors = Cursors::default();
    for i in 0..LOADED {
        write(&db, &cursors, &["SADD", "myset", &element(i)]);
    }
    let rounds = 200;
    let conflicts: usize = (0..rounds)
        .map(|_| interleaved(&db, &cursors, &["SPOP", "myset"], 2))
        .sum();
    eprintln!("spop_interleaved: {conflicts} conflicts in {rounds} rounds of 2");
    assert!(
        conflicts <= rounds / 10,
        "{conflicts} of {rounds} rounds conflicted"
    );
    let left = read(&db, &cursors, &["SCARD", "myset"]);
    let expected = format!(":{}\r\n", LOADED - (2 * rounds - conflicts));
    assert_eq!(left, expected.as_bytes());
    let members = array_len(&read(&db, &cursors, &["SMEMBERS", "myset"]));
    assert_eq!(members, LOADED - (2 * rounds - conflicts));
}

/// Two pops of a sorted set's minimum at once: both read the same first member, so one must
/// lose (serializability), and the members popped are each popped once.
#[test]
fn zpopmin_interleaved() {
    let db = db();
    let cursors = Cursors::default();
    for i in 0..100 {
        write(
            &db,
            &cursors,
            &["ZADD", "myzset", &i.to_string(), &element(i)],
        );
    }
    for round in 0..50 {
        assert_eq!(interleaved(&db, &cursors, &["ZPOPMIN", "myzset"], 2), 1);
        let card = format!(":{}\r\n", 100 - round - 1);
        assert_eq!(read(&db, &cursors, &["ZCARD", "myzset"]), card.as_bytes());
    }
}

//! Two-phase commit's participant side (`Txn::prepare`): what a prepared transaction holds,
//! and that databases which each order by their own timestamps stay serializable together
//! when cross-database transactions prepare on every one before committing on any
//! and no transaction prepares on a database while an earlier one prepared there is
//! undecided (commitment ordering; the tests' `two_phase` keeps a gate per database, as the
//! cluster does per node): a bank across two databases keeps its total under concurrent
//! transfers and audits, and list-append histories across two databases have no cycle.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use keel::{ConflictReason, Db, Prepared, Txn};

use crate::StopOnDrop;
use crate::history::{self, Op, Outcome, TxnRecord};

fn put(db: &Db, key: &[u8], value: &[u8]) -> keel::Ts {
    let mut txn = db.begin().unwrap();
    txn.put(key, value).unwrap();
    txn.commit().unwrap().unwrap()
}

fn get(db: &Db, key: &[u8]) -> Option<Vec<u8>> {
    db.snapshot().unwrap().get(key).unwrap()
}

fn prepare(txn: Txn<'_>) -> Prepared<'_> {
    txn.prepare(|_| Vec::new()).unwrap().expect("no conflict")
}

#[test]
fn prepared_writes_stay_invisible_until_the_commit_installs_them_at_the_prepare_timestamp() {
    let db = Db::in_memory();
    let before = put(&db, b"a", b"1");
    let mut txn = db.begin().unwrap();
    assert_eq!(txn.get(b"a").unwrap().as_deref(), Some(&b"1"[..]));
    txn.put(b"a", b"2").unwrap();
    txn.put(b"b", b"x").unwrap();
    let prepared = txn.prepare(|_| b"meta".to_vec()).unwrap().unwrap();
    assert!(prepared.ts() > before);
    assert_eq!(prepared.meta(), b"meta");
    assert_eq!(prepared.keys().count(), 2);
    assert_eq!(get(&db, b"a").as_deref(), Some(&b"1"[..]));
    assert_eq!(get(&db, b"b"), None);
    let ts = prepared.ts();
    assert_eq!(prepared.commit().unwrap(), ts);
    db.wait_visible(ts).unwrap();
    let snapshot = db.snapshot().unwrap();
    assert!(snapshot.read_ts() >= ts);
    assert_eq!(snapshot.get(b"a").unwrap().as_deref(), Some(&b"2"[..]));
    assert_eq!(snapshot.get(b"b").unwrap().as_deref(), Some(&b"x"[..]));
    assert_eq!(db.stats().commits, 2);
}

/// A read-only transaction that began while a prepared transaction's timestamp was
/// unpublished may not commit having missed its writes: another database may have
/// committed that transaction and a client seen it before this one began (the cluster's
/// list-append check found it so: strict serializability needs the reader to serialize after
/// it). It commits only if what it read is still the newest: it conflicts while the writer
/// awaits its decision, and once the decision installed a newer version; begun after the
/// decision, it sees the write. A database that never prepared keeps read-only commits
/// unvalidated (serialized at their snapshot).
#[test]
fn a_reader_begun_below_a_prepared_timestamp_validates_at_commit() {
    let db = Db::in_memory();
    put(&db, b"k", b"old");
    // Before any prepare: a read-only commit is not validated.
    let mut reader = db.begin().unwrap();
    assert_eq!(reader.get(b"k").unwrap().as_deref(), Some(&b"old"[..]));
    put(&db, b"k", b"newer");
    assert!(
        reader.commit().unwrap().is_ok(),
        "serialized at its snapshot"
    );

    let mut writer = db.begin().unwrap();
    writer.put(b"k", b"prepared").unwrap();
    let prepared = prepare(writer);
    let mut reader = db.begin().unwrap();
    assert_eq!(reader.get(b"k").unwrap().as_deref(), Some(&b"newer"[..]));
    assert_eq!(
        reader.commit().unwrap().unwrap_err().reason,
        ConflictReason::Prepared,
        "read a key its prepared writer holds"
    );
    // Begun while prepared, committed after the decision installed: the read is stale.
    let mut reader = db.begin().unwrap();
    assert_eq!(reader.get(b"k").unwrap().as_deref(), Some(&b"newer"[..]));
    prepared.commit().unwrap();
    assert_eq!(
        reader.commit().unwrap().unwrap_err().reason,
        ConflictReason::ReadChanged
    );
    // Begun after the decision: sees it, and commits.
    let mut reader = db.begin().unwrap();
    assert_eq!(reader.get(b"k").unwrap().as_deref(), Some(&b"prepared"[..]));
    assert!(reader.commit().unwrap().is_ok());
    // A reader of other keys, begun below a pending prepare, still commits.
    let mut writer = db.begin().unwrap();
    writer.put(b"k", b"again").unwrap();
    let prepared = prepare(writer);
    let mut reader = db.begin().unwrap();
    assert_eq!(reader.get(b"other").unwrap(), None);
    assert!(reader.commit().unwrap().is_ok());
    drop(prepared);
}

#[test]
fn a_prepared_transaction_holds_its_locks_until_the_decision() {
    let db = Db::in_memory();
    put(&db, b"a", b"1");
    let mut txn = db.begin().unwrap();
    txn.put(b"a", b"2").unwrap();
    let prepared = prepare(txn);

    let mut writer = db.begin().unwrap();
    writer.put(b"a", b"3").unwrap();
    let conflict = writer.commit().unwrap().unwrap_err();
    assert_eq!(conflict.reason, ConflictReason::Prepared);

    // A reader of the prepared key that writes elsewhere: its read is about to change. (A
    // plain commit that loses its validation waits for its timestamp to be published, which
    // the prepared one holds up: prepare it instead, which does not wait.)
    let mut reader = db.begin().unwrap();
    assert_eq!(reader.get(b"a").unwrap().as_deref(), Some(&b"1"[..]));
    reader.put(b"c", b"1").unwrap();
    let conflict = reader.prepare(|_| Vec::new()).unwrap().unwrap_err();
    assert_eq!(conflict.key, b"a");

    prepared.abort().unwrap();
    assert_eq!(get(&db, b"a").as_deref(), Some(&b"1"[..]));
    assert_eq!(get(&db, b"c"), None);
    put(&db, b"a", b"4");
    assert_eq!(get(&db, b"a").as_deref(), Some(&b"4"[..]));
}

/// A prepared transaction holds the keys it read, shared: writers wait for its decision
/// (a prepare gives up after a brief wait), readers do not, nor other prepares that read
/// them. A key read absent is held too, by an empty record the collector takes back.
#[test]
fn a_prepared_transaction_holds_what_it_read_until_the_decision() {
    let db = Db::in_memory();
    put(&db, b"read", b"1");
    let mut txn = db.begin().unwrap();
    txn.get(b"read").unwrap();
    assert_eq!(txn.get(b"absent").unwrap(), None);
    txn.put(b"written", b"1").unwrap();
    let prepared = prepare(txn);

    for key in [&b"read"[..], b"absent"] {
        let mut writer = db.begin().unwrap();
        writer.put(key, b"2").unwrap();
        let conflict = writer.prepare(|_| Vec::new()).unwrap().unwrap_err();
        assert_eq!(conflict.key, key);
        assert_eq!(conflict.reason, ConflictReason::WriteLocked);
    }
    // A reader of the held keys that writes elsewhere, and another prepare that only reads
    // them: neither conflicts with a shared hold.
    let mut reader = db.begin().unwrap();
    assert_eq!(reader.get(b"read").unwrap().as_deref(), Some(&b"1"[..]));
    assert_eq!(reader.get(b"absent").unwrap(), None);
    reader.put(b"elsewhere", b"1").unwrap();
    let reader = prepare(reader);
    let mut also = db.begin().unwrap();
    also.get(b"read").unwrap();
    let also = prepare(also);

    prepared.commit().unwrap();
    reader.commit().unwrap();
    also.commit().unwrap();
    // Decided: the holds are gone, and the empty record of the absent key goes back (to
    // this call, or to the collector's thread before it): the keys written are left.
    db.reclaim_deleted(100);
    assert_eq!(db.stats().records, 3, "read, written, elsewhere");
    put(&db, b"read", b"3");
    put(&db, b"absent", b"3");
    assert_eq!(get(&db, b"absent").as_deref(), Some(&b"3"[..]));
}

/// A prepare that cannot hold a key it read (another prepared transaction writes it) gives
/// back everything it took, and its timestamp is never taken.
#[test]
fn a_prepare_that_cannot_hold_a_read_gives_everything_back() {
    let db = Db::in_memory();
    put(&db, b"a", b"1");
    let mut writer = db.begin().unwrap();
    writer.put(b"a", b"2").unwrap();
    let writer = prepare(writer);
    let mut reader = db.begin().unwrap();
    reader.get(b"a").unwrap();
    reader.get(b"fresh").unwrap();
    reader.put(b"b", b"1").unwrap();
    let conflict = reader.prepare(|_| Vec::new()).unwrap().unwrap_err();
    assert_eq!(conflict.key, b"a");
    writer.abort().unwrap();
    // Nothing stays held: every key takes a write.
    for key in [&b"a"[..], b"b", b"fresh"] {
        put(&db, key, b"x");
    }
}

#[test]
fn held_writes_are_refused_as_if_prepared_until_their_time_passes() {
    let db = Db::in_memory();
    put(&db, b"a", b"1");
    // Prepared before the hold: its decision still installs.
    let mut txn = db.begin().unwrap();
    txn.put(b"p", b"x").unwrap();
    let prepared = prepare(txn);
    db.hold_writes_for(Duration::from_millis(300));
    let held = Instant::now();
    let mut txn = db.begin().unwrap();
    assert_eq!(txn.get(b"a").unwrap().as_deref(), Some(&b"1"[..]));
    txn.put(b"a", b"2").unwrap();
    let conflict = txn.commit().unwrap().expect_err("writes are held");
    assert_eq!(conflict.reason, ConflictReason::Prepared);
    assert_eq!(conflict.key, b"a");
    assert!(db.awaits_decision(b"a") && db.awaits_decision(b"elsewhere"));
    // A prepare that writes is refused too; reads, read-only commits and read-only prepares
    // go on.
    let mut txn = db.begin().unwrap();
    txn.put(b"b", b"1").unwrap();
    let conflict = txn.prepare(|_| Vec::new()).unwrap().expect_err("held");
    assert_eq!(conflict.reason, ConflictReason::Prepared);
    let mut txn = db.begin().unwrap();
    assert_eq!(txn.get(b"a").unwrap().as_deref(), Some(&b"1"[..]));
    txn.commit().unwrap().expect("a read-only commit");
    let mut txn = db.begin().unwrap();
    txn.get(b"a").unwrap();
    prepare(txn).commit().unwrap();
    prepared.commit().unwrap();
    assert_eq!(get(&db, b"p").as_deref(), Some(&b"x"[..]));
    // Waiting for the "decision" ends with the hold.
    assert!(db.wait_decided(b"a", Duration::from_secs(10)));
    assert!(held.elapsed() >= Duration::from_millis(300));
    assert!(!db.awaits_decision(b"a"));
    put(&db, b"a", b"2");
    assert_eq!(get(&db, b"a").as_deref(), Some(&b"2"[..]));
}

#[test]
fn dropping_a_prepared_transaction_aborts_it() {
    let db = Db::in_memory();
    let mut txn = db.begin().unwrap();
    txn.put(b"a", b"2").unwrap();
    drop(prepare(txn));
    assert_eq!(get(&db, b"a"), None);
    put(&db, b"a", b"3");
    assert_eq!(get(&db, b"a").as_deref(), Some(&b"3"[..]));
}

#[test]
fn later_commits_become_visible_only_after_the_decision() {
    let db = Db::in_memory();
    let mut txn = db.begin().unwrap();
    txn.put(b"a", b"1").unwrap();
    let prepared = prepare(txn);
    let (done, acknowledged) = mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            let ts = put(&db, b"b", b"1");
            done.send(ts).unwrap();
        });
        // However long this waits, the later commit must not be acknowledged (it would be
        // visible before the earlier timestamp is decided).
        std::thread::sleep(Duration::from_millis(50));
        assert!(acknowledged.try_recv().is_err());
        assert_eq!(get(&db, b"b"), None);
        let ts = prepared.commit().unwrap();
        let later = acknowledged.recv().unwrap();
        assert!(later > ts);
    });
    assert_eq!(get(&db, b"a").as_deref(), Some(&b"1"[..]));
    assert_eq!(get(&db, b"b").as_deref(), Some(&b"1"[..]));
}

#[test]
fn a_read_only_prepare_validates_its_reads() {
    let db = Db::in_memory();
    put(&db, b"a", b"1");
    let mut stale = db.begin().unwrap();
    stale.get(b"a").unwrap();
    put(&db, b"a", b"2");
    let conflict = stale.prepare(|_| Vec::new()).unwrap().unwrap_err();
    assert_eq!(conflict.reason, ConflictReason::ReadChanged);

    let mut fresh = db.begin().unwrap();
    fresh.get(b"a").unwrap();
    let prepared = prepare(fresh);
    prepared.commit().unwrap();
}

#[test]
fn commutative_operations_resolve_at_prepare_and_the_metadata_sees_them() {
    let db = Db::in_memory();
    db.transact(|txn| txn.add(b"n", 10)).unwrap();
    let mut txn = db.begin().unwrap();
    txn.add(b"n", 5).unwrap();
    let ticket = txn.track(b"n").unwrap();
    let prepared = txn
        .prepare(|resolved| resolved.value(ticket).unwrap().to_vec())
        .unwrap()
        .unwrap();
    assert_eq!(prepared.meta(), b"15");
    prepared.commit().unwrap();
    assert_eq!(get(&db, b"n").as_deref(), Some(&b"15"[..]));
}

#[test]
fn oversized_metadata_is_refused_and_releases_everything() {
    let db = Db::in_memory();
    let mut txn = db.begin().unwrap();
    txn.put(b"a", b"1").unwrap();
    let big = keel::limits::PREPARE_META_BYTES_MAX + 1;
    let error = txn.prepare(|_| vec![0; big]).unwrap_err();
    assert!(error.to_string().contains("metadata"), "{error}");
    put(&db, b"a", b"2");
    assert_eq!(get(&db, b"a").as_deref(), Some(&b"2"[..]));
}

/// Runs `body` on both databases as one transaction: prepare on both (in the order given),
/// then commit both; a conflict on either aborts both. Returns whether it committed, and the
/// results.
fn two_phase<T>(dbs: [&Db; 2], body: impl FnMut(usize, &mut Txn<'_>) -> T) -> Option<[T; 2]> {
    two_phase_gated(dbs, true, body)
}

/// [`two_phase`], with or without a gate per database. Without, transactions rely on the
/// engine's holds of what they read and wrote (point reads only here).
fn two_phase_gated<T>(
    dbs: [&Db; 2],
    gated: bool,
    mut body: impl FnMut(usize, &mut Txn<'_>) -> T,
) -> Option<[T; 2]> {
    let mut txns = [dbs[0].begin().unwrap(), dbs[1].begin().unwrap()];
    let results = [body(0, &mut txns[0]), body(1, &mut txns[1])];
    let [t0, t1] = txns;
    if !gated {
        // Votes in either order, as messages to two nodes arrive, with time between them
        // (a message's flight) for another transaction to prepare on both in between.
        static FLIP: AtomicU64 = AtomicU64::new(0);
        let flip = FLIP.fetch_add(1, Ordering::Relaxed) % 2 == 1;
        let (first, second) = if flip { (t1, t0) } else { (t0, t1) };
        let p_first = first.prepare(|_| Vec::new()).unwrap().ok()?;
        std::thread::sleep(Duration::from_micros(100));
        let Ok(p_second) = second.prepare(|_| Vec::new()).unwrap() else {
            p_first.abort().unwrap();
            return None;
        };
        let (p0, p1) = if flip {
            (p_second, p_first)
        } else {
            (p_first, p_second)
        };
        let ts = [p0.commit().unwrap(), p1.commit().unwrap()];
        dbs[0].wait_visible(ts[0]).unwrap();
        dbs[1].wait_visible(ts[1]).unwrap();
        return Some(results);
    }
    // One transaction prepared per database at a time, taken in database order (no
    // deadlock): a transaction prepares only once the one prepared before it is decided.
    static GATES: [std::sync::Mutex<()>; 2] =
        [std::sync::Mutex::new(()), std::sync::Mutex::new(())];
    let _gate0 = GATES[0].lock().unwrap();
    let p0 = t0.prepare(|_| Vec::new()).unwrap().ok()?;
    let _gate1 = GATES[1].lock().unwrap();
    let Ok(p1) = t1.prepare(|_| Vec::new()).unwrap() else {
        p0.abort().unwrap();
        return None;
    };
    let ts = [p0.commit().unwrap(), p1.commit().unwrap()];
    dbs[0].wait_visible(ts[0]).unwrap();
    dbs[1].wait_visible(ts[1]).unwrap();
    Some(results)
}

fn parse(value: &[u8]) -> i64 {
    std::str::from_utf8(value).unwrap().parse().unwrap()
}

fn balance(txn: &mut Txn<'_>, account: u32) -> i64 {
    let value = txn.get(format!("acct{account}").as_bytes()).unwrap();
    parse(&value.expect("every account exists"))
}

/// Accounts 0..4 live in database 0 and 4..8 in database 1; transfers move money across
/// them (and within one); audits read every account of both with read-only prepares. A
/// transfer's two halves are serialized at different timestamps in the two databases, yet no
/// audit ever sees money missing or doubled.
#[test]
fn a_bank_across_two_databases_keeps_its_total() {
    const ACCOUNTS: u32 = 8;
    const TOTAL: i64 = 800;
    let dbs = [Db::in_memory(), Db::in_memory()];
    for a in 0..ACCOUNTS {
        let db = &dbs[(a / 4) as usize];
        put(db, format!("acct{a}").as_bytes(), b"100");
    }
    let stop = AtomicBool::new(false);
    let transfers = AtomicU64::new(0);
    let audits = AtomicU64::new(0);
    std::thread::scope(|s| {
        for worker in 0..3u64 {
            let (dbs, stop, transfers) = (&dbs, &stop, &transfers);
            s.spawn(move || {
                let mut rng = worker * 7919 + 1;
                let mut next = || {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng
                };
                while !stop.load(Ordering::Relaxed) {
                    let from = (next() % u64::from(ACCOUNTS)) as u32;
                    let to = (next() % u64::from(ACCOUNTS)) as u32;
                    let amount = (next() % 20) as i64;
                    if from == to {
                        continue;
                    }
                    let moved = two_phase([&dbs[0], &dbs[1]], |d, txn| {
                        for (account, delta) in [(from, -amount), (to, amount)] {
                            if (account / 4) as usize == d {
                                let b = balance(txn, account);
                                txn.put(
                                    format!("acct{account}").as_bytes(),
                                    (b + delta).to_string().as_bytes(),
                                )
                                .unwrap();
                            }
                        }
                    });
                    if moved.is_some() {
                        transfers.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        let (dbs, stop, transfers, audits) = (&dbs, &stop, &transfers, &audits);
        s.spawn(move || {
            // The transfers stop however this thread ends, a failed audit included.
            let _stop = StopOnDrop(stop);
            // At least 1.5 s of both, and until enough of each committed: a loaded machine
            // fits less into a fixed time, yet a stall still fails below.
            let started = Instant::now();
            while started.elapsed() < Duration::from_millis(1500)
                || transfers.load(Ordering::Relaxed) <= 50
                || audits.load(Ordering::Relaxed) <= 20
            {
                assert!(
                    started.elapsed() < Duration::from_secs(90),
                    "progress stalled: {} transfers, {} audits in 90 s",
                    transfers.load(Ordering::Relaxed),
                    audits.load(Ordering::Relaxed)
                );
                let sums = two_phase([&dbs[0], &dbs[1]], |d, txn| {
                    (0..4).map(|i| balance(txn, d as u32 * 4 + i)).sum::<i64>()
                });
                if let Some([a, b]) = sums {
                    assert_eq!(a + b, TOTAL, "an audit saw {a} + {b}");
                    audits.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    });
    let transfers = transfers.into_inner();
    let audits = audits.into_inner();
    println!("{transfers} transfers, {audits} audits");
    let total: i64 = (0..ACCOUNTS)
        .map(|a| {
            let v = get(&dbs[(a / 4) as usize], format!("acct{a}").as_bytes()).unwrap();
            parse(&v)
        })
        .sum();
    assert_eq!(total, TOTAL);
}

/// Elle list-append across two databases: each transaction reads and appends to keys of
/// both, committed by two-phase commit; the history (with real-time order) must be acyclic.
#[test]
fn list_append_histories_across_two_databases_are_strictly_serializable() {
    list_append_across_two_databases(true, 0);
}

/// The same without a gate, beside transactions local to one database: prepared
/// transactions hold what they read, so nothing that follows one in a database's conflict
/// order (directly, or through a local commit) commits or prepares there before its
/// decision. Without the holds this finds cycles through the local transactions.
#[test]
fn list_append_across_two_databases_without_a_gate_holds_reads_until_the_decision() {
    list_append_across_two_databases(false, 2);
}

fn list_append_across_two_databases(gated: bool, local_workers: u64) {
    const KEYS: u32 = 6;
    let dbs = [Db::in_memory(), Db::in_memory()];
    let epoch = Instant::now();
    let tick = || epoch.elapsed().as_nanos() as u64;
    let next_elem = AtomicU64::new(1);
    let records = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for worker in 0..local_workers {
            let (dbs, next_elem, records) = (&dbs, &next_elem, &records);
            s.spawn(move || {
                let mut rng = worker * 7_901 + 11;
                let mut next = || {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng
                };
                for n in 0..1500 {
                    // Read one key of a database, append to another of the same one.
                    let d = next() % 2;
                    let k = |r: u64| (d + 2 * (r % u64::from(KEYS / 2))) as u32;
                    let (read, append) = (k(next()), k(next()));
                    let elem = next_elem.fetch_add(1, Ordering::Relaxed);
                    let began = tick();
                    let db = &dbs[d as usize];
                    let mut txn = db.begin().unwrap();
                    let seen =
                        history::decode_list(txn.get(&history::list_key(read)).unwrap().as_deref());
                    let akey = history::list_key(append);
                    let mut list = history::decode_list(txn.get(&akey).unwrap().as_deref());
                    list.push(elem);
                    txn.put(&akey, &history::encode_list(&list)).unwrap();
                    let committed = matches!(txn.commit(), Ok(Ok(_)));
                    let ended = tick();
                    let mut ops = vec![Op::Read {
                        key: read,
                        value: seen,
                    }];
                    if committed && read != append {
                        list.pop();
                        ops.push(Op::Read {
                            key: append,
                            value: list,
                        });
                    }
                    ops.push(Op::Append { key: append, elem });
                    records.lock().unwrap().push(TxnRecord {
                        name: format!("l{worker}.{n}"),
                        ops,
                        outcome: if committed {
                            Outcome::Committed
                        } else {
                            Outcome::Aborted
                        },
                        position: None,
                        read_ts: None,
                        time: Some((began, ended)),
                    });
                }
            });
        }
        for worker in 0..3u64 {
            let (dbs, next_elem, records) = (&dbs, &next_elem, &records);
            s.spawn(move || {
                let mut rng = worker * 104_729 + 3;
                let mut next = || {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng
                };
                for n in 0..if gated { 300 } else { 1000 } {
                    // Two or three keys, each read then (mostly) appended to.
                    let mut keys: Vec<u32> = (0..2 + next() % 2)
                        .map(|_| (next() % u64::from(KEYS)) as u32)
                        .collect();
                    keys.sort_unstable();
                    keys.dedup();
                    let plan: Vec<(u32, Option<u64>)> = keys
                        .iter()
                        .map(|&k| {
                            let append = next() % 4 != 0;
                            (k, append.then(|| next_elem.fetch_add(1, Ordering::Relaxed)))
                        })
                        .collect();
                    let began = tick();
                    let mut ops = Vec::new();
                    let outcome = two_phase_gated([&dbs[0], &dbs[1]], gated, |d, txn| {
                        let mut mine = Vec::new();
                        for &(k, append) in &plan {
                            if (k % 2) as usize != d {
                                continue;
                            }
                            let key = history::list_key(k);
                            let mut list = history::decode_list(txn.get(&key).unwrap().as_deref());
                            mine.push(Op::Read {
                                key: k,
                                value: list.clone(),
                            });
                            if let Some(e) = append {
                                list.push(e);
                                txn.put(&key, &history::encode_list(&list)).unwrap();
                                mine.push(Op::Append { key: k, elem: e });
                            }
                        }
                        mine
                    });
                    let ended = tick();
                    let outcome =
                        match outcome {
                            Some([a, b]) => {
                                ops.extend(a);
                                ops.extend(b);
                                Outcome::Committed
                            }
                            None => {
                                ops.extend(plan.iter().filter_map(|&(k, e)| {
                                    e.map(|e| Op::Append { key: k, elem: e })
                                }));
                                Outcome::Aborted
                            }
                        };
                    records.lock().unwrap().push(TxnRecord {
                        name: format!("w{worker}.{n}"),
                        ops,
                        outcome,
                        position: None,
                        read_ts: None,
                        time: Some((began, ended)),
                    });
                }
            });
        }
    });
    let history = records.into_inner().unwrap();
    let report = history::check(&history).unwrap_or_else(|e| panic!("{e}"));
    println!("{report:?}");
    assert!(report.committed > 300 && report.rw_edges > 10, "{report:?}");
}

/// A commit does not wait for a lock a prepared transaction holds (exclusively, or shared for
/// a key it read): its decision may be a network round trip away, and a thread spinning for it
/// may be the one that would carry it. The commit conflicts at once with
/// `ConflictReason::Prepared`; `Db::awaits_decision` and `Db::wait_decided` tell when the
/// decision came, and `Db::transact` waits for it before retrying.
#[test]
fn a_commit_does_not_wait_for_a_prepared_transaction() {
    let db = Db::in_memory();
    put(&db, b"k", b"0");
    put(&db, b"w", b"0");
    let mut holder = db.begin().unwrap();
    holder.get(b"k").unwrap();
    holder.put(b"w", b"1").unwrap();
    let holder = prepare(holder);
    assert!(db.awaits_decision(b"k") && db.awaits_decision(b"w"));
    assert!(!db.awaits_decision(b"other"));
    for key in [&b"k"[..], b"w"] {
        let started = Instant::now();
        let mut writer = db.begin().unwrap();
        writer.put(key, b"x").unwrap();
        let conflict = writer.commit().unwrap().unwrap_err();
        assert_eq!(
            (&conflict.key[..], conflict.reason),
            (key, ConflictReason::Prepared)
        );
        assert!(
            started.elapsed() < Duration::from_millis(200),
            "{:?}",
            started.elapsed()
        );
    }
    assert!(!db.wait_decided(b"w", Duration::from_millis(20)));

    // `transact` waits for the decision, then commits.
    let decided = AtomicBool::new(false);
    std::thread::scope(|s| {
        let writer = s.spawn(|| {
            db.transact(|txn| {
                let w = txn.get(b"w")?;
                txn.put(b"k", b"after")?;
                Ok::<_, keel::Error>(w)
            })
            .unwrap()
        });
        std::thread::sleep(Duration::from_millis(100));
        decided.store(true, Ordering::SeqCst);
        let ts = holder.commit().unwrap();
        db.wait_visible(ts).unwrap();
        // It read the prepared transaction's write: it ran again after the decision.
        assert_eq!(writer.join().unwrap().as_deref(), Some(&b"1"[..]));
    });
    assert!(decided.load(Ordering::SeqCst));
    assert!(!db.awaits_decision(b"k") && db.wait_decided(b"w", Duration::ZERO));
    assert_eq!(get(&db, b"k").as_deref(), Some(&b"after"[..]));
}

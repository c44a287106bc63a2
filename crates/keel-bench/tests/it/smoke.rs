use std::time::Duration;

use keel_bench::run::{self, Measurement, Timing};
use keel_bench::target::{self, Durability, Open, Target};
use keel_bench::workload::{self, Kind, Params, Stream, Workload};

const TIMING: Timing = Timing {
    warmup: Duration::from_millis(50),
    duration: Duration::from_millis(250),
};

fn params(workload: Workload) -> Params {
    let mut p = Params::new(workload);
    p.records = 2_000;
    p.threads = 2;
    p.stream_txns = 20_000;
    p.theta = 0.9;
    p
}

fn streams(p: &Params) -> Vec<Stream> {
    (0..p.threads)
        .map(|t| p.stream(t).expect("stream"))
        .collect()
}

/// Loads `p`'s records into `target` and runs the streams once.
pub fn load_and_run(target: &dyn Target, p: &Params, streams: &[Stream]) -> Measurement {
    let mut records = (0..p.initial_keys()).map(|k| (k, p.initial_value(k)));
    let mut last = 0;
    target
        .load(&mut records, &mut |n| last = n)
        .expect("loading");
    assert_eq!(last, p.initial_keys(), "{}: load progress", target.name());
    let m = run::run(target, streams, TIMING, &mut |_| {}).expect("running");
    assert!(m.commits > 0, "{}: nothing committed", target.name());
    assert!(m.commits_total >= m.commits);
    assert!(m.latency_ns.len() >= m.commits);
    m
}

fn int(target: &dyn Target, key: u64) -> i64 {
    let v = target.get(key).expect("get").expect("value present");
    std::str::from_utf8(&v)
        .expect("text")
        .parse()
        .expect("integer")
}

/// Every committed increment of the hot key is there: none lost, none invented.
pub fn incr1(open: &dyn Fn(u64) -> Box<dyn Target>) {
    let p = params(Workload::Incr1);
    let s = streams(&p);
    let target = open(workload::key_space(&p, &s));
    let m = load_and_run(target.as_ref(), &p, &s);
    assert_eq!(
        int(target.as_ref(), 0),
        m.commits_total as i64,
        "{}",
        target.name()
    );
}

/// The keys the first read-write transaction of thread 0 wrote hold values written by a
/// benchmark thread, not the loaded ones.
pub fn deut(open: &dyn Fn(u64) -> Box<dyn Target>, workload: Workload) {
    let p = params(workload);
    let s = streams(&p);
    let target = open(workload::key_space(&p, &s));
    load_and_run(target.as_ref(), &p, &s);
    let first = s[0]
        .txns
        .iter()
        .find(|t| t.kind == Kind::ReadWrite)
        .expect("a read-write transaction");
    let written = &s[0].keys(first)[first.arg as usize..];
    for &k in written {
        let v = target.get(k).expect("get").expect("value present");
        let thread = workload::stamp_thread(&v).expect("a stamped value");
        assert!(
            thread < 2,
            "{}: key {k} still holds its loaded value",
            target.name()
        );
    }
}

/// Bid's counter, MAX and ordered put all took effect for the first bid of thread 0.
pub fn bid(open: &dyn Fn(u64) -> Box<dyn Target>) {
    let p = params(Workload::Bid);
    let s = streams(&p);
    let target = open(workload::key_space(&p, &s));
    load_and_run(target.as_ref(), &p, &s);
    let first = &s[0].txns[0];
    let keys = s[0].keys(first);
    let t = target.as_ref();
    assert!(int(t, keys[0]) >= 1, "{}: bid count", t.name());
    assert!(
        int(t, keys[1]) >= i64::from(first.arg),
        "{}: max bid",
        t.name()
    );
    let bidder = t.get(keys[2]).expect("get").expect("max bidder present");
    let (order, _) = keel::decode_ordered(&bidder).expect("an ordered value");
    assert!(
        order >= u64::from(first.arg),
        "{}: max bidder order",
        t.name()
    );
    assert_eq!(
        int(t, keys[1]) as u64,
        order,
        "{}: max bid = max bidder's bid",
        t.name()
    );
    let bid = t.get(keys[3]).expect("get").expect("new bid present");
    assert!(workload::stamp_thread(&bid).is_some_and(|th| th < 2));
}

/// Workloads with nothing special to read back still commit (ycsb scans and inserts, like,
/// mgp's 500-key transactions).
pub fn others(open: &dyn Fn(u64) -> Box<dyn Target>) {
    for w in [
        Workload::YcsbA,
        Workload::YcsbB,
        Workload::YcsbC,
        Workload::YcsbD,
        Workload::YcsbE,
        Workload::YcsbF,
        Workload::Like,
        Workload::Mgp,
    ] {
        let mut p = params(w);
        if w == Workload::Mgp {
            p.stream_txns = 200;
        }
        let s = streams(&p);
        let target = open(workload::key_space(&p, &s));
        load_and_run(target.as_ref(), &p, &s);
        if w == Workload::Like {
            // Some page was liked: its counter moved off the loaded 0.
            let liked = s[0]
                .txns
                .iter()
                .find(|t| t.kind == Kind::LikeWrite)
                .expect("a like");
            let page = s[0].keys(liked)[0];
            assert!(
                int(target.as_ref(), page) >= 1,
                "{}: like count",
                target.name()
            );
        }
    }
}

pub fn embedded(name: &'static str) -> impl Fn(u64) -> Box<dyn Target> {
    move |key_space| {
        let dir = std::env::temp_dir();
        target::open(
            name,
            &Open {
                key_space,
                durability: Durability::None,
                dir,
                split: keel::SplitMode::Auto,
            },
        )
        .expect("opening the target")
    }
}

fn all(name: &'static str) {
    let open = embedded(name);
    incr1(&open);
    deut(&open, Workload::Deut);
    deut(&open, Workload::DeutWrite);
    bid(&open);
    others(&open);
}

#[test]
fn keel() {
    all("keel");
}

#[test]
fn ceiling_array() {
    all("ceiling-array");
}

#[test]
fn ceiling_hash() {
    all("ceiling-hash");
}

#[cfg(feature = "peers")]
#[test]
fn rocksdb_occ() {
    all("rocksdb-occ");
}

#[cfg(feature = "peers")]
#[test]
fn rocksdb_pess() {
    all("rocksdb-pess");
}

#[cfg(feature = "peers")]
#[test]
fn fjall() {
    all("fjall");
}

#[cfg(feature = "peers")]
#[test]
fn redb() {
    all("redb");
}

#[cfg(feature = "peers")]
#[test]
fn lmdb() {
    all("lmdb");
}

#[cfg(not(feature = "peers"))]
#[test]
fn peers_need_the_feature() {
    let err = target::open(
        "rocksdb-occ",
        &Open {
            key_space: 10,
            durability: Durability::None,
            dir: std::env::temp_dir(),
            split: keel::SplitMode::Auto,
        },
    )
    .err()
    .expect("peers are not built");
    assert!(err.to_string().contains("peers"), "{err}");
}

#[test]
fn ceilings_refuse_durability() {
    let err = target::open(
        "ceiling-array",
        &Open {
            key_space: 10,
            durability: Durability::Sync,
            dir: std::env::temp_dir(),
            split: keel::SplitMode::Auto,
        },
    )
    .err()
    .expect("the ceilings are memory only");
    assert!(err.to_string().contains("durability"), "{err}");
}

/// keel with its write-ahead log: sync and async commits do the same work.
#[test]
fn keel_durable() {
    for durability in [Durability::Sync, Durability::Async] {
        let open = move |key_space| {
            target::open(
                "keel",
                &Open {
                    key_space,
                    durability,
                    dir: std::env::temp_dir(),
                    split: keel::SplitMode::Auto,
                },
            )
            .expect("opening keel")
        };
        incr1(&open);
        deut(&open, Workload::Deut);
    }
}

use super::*;

fn params(workload: Workload) -> Params {
    let mut p = Params::new(workload);
    p.records = 10_000;
    p.stream_txns = 100_000;
    p.threads = 2;
    p
}

fn share(s: &Stream, f: impl Fn(&Txn) -> bool) -> f64 {
    s.txns.iter().filter(|t| f(t)).count() as f64 / s.txns.len() as f64
}

fn near(observed: f64, expected: f64) {
    assert!(
        (observed - expected).abs() < 0.01,
        "observed {observed:.4}, expected {expected:.4}"
    );
}

#[test]
fn seeds_reproduce_and_differ() {
    let p = params(Workload::Deut);
    assert_eq!(p.stream(0).expect("stream"), p.stream(0).expect("stream"));
    assert_ne!(p.stream(0).expect("stream"), p.stream(1).expect("stream"));
    let mut q = p.clone();
    q.seed = 2;
    assert_ne!(p.stream(0).expect("stream"), q.stream(0).expect("stream"));
}

#[test]
fn deut_mix() {
    let s = params(Workload::Deut).stream(0).expect("stream");
    near(share(&s, |t| t.kind == Kind::Read), 0.5);
    assert!(s.txns.iter().all(|t| s.keys(t).len() == 4));
    assert!(
        s.txns
            .iter()
            .all(|t| t.kind == Kind::Read || (t.kind == Kind::ReadWrite && t.arg == 2))
    );
    // The definition (half read-only with 4 reads, half 2 reads + 2 updates) makes 75% of
    // operations reads; DESIGN.md's "84%" is the slides' figure, which this mix does not
    // reach (see BENCHMARKS.md). The test pins the definition.
    let reads: usize = s
        .txns
        .iter()
        .map(|t| if t.kind == Kind::Read { 4 } else { 2 })
        .sum();
    near(reads as f64 / (s.txns.len() * 4) as f64, 0.75);
}

#[test]
fn deut_write_is_all_updates() {
    let s = params(Workload::DeutWrite).stream(0).expect("stream");
    assert!(
        s.txns
            .iter()
            .all(|t| t.kind == Kind::ReadWrite && t.arg == 0)
    );
}

#[test]
fn ycsb_mixes() {
    for (w, reads) in [
        (Workload::YcsbA, 0.5),
        (Workload::YcsbB, 0.95),
        (Workload::YcsbC, 1.0),
        (Workload::YcsbD, 0.95),
        (Workload::YcsbF, 0.5),
    ] {
        let s = params(w).stream(1).expect("stream");
        near(share(&s, |t| t.kind == Kind::Read), reads);
    }
    let e = params(Workload::YcsbE).stream(0).expect("stream");
    near(share(&e, |t| t.kind == Kind::Scan), 0.95);
    assert!(
        e.txns
            .iter()
            .filter(|t| t.kind == Kind::Scan)
            .all(|t| (1..=SCAN_LEN_MAX).contains(&t.arg))
    );
    let f = params(Workload::YcsbF).stream(0).expect("stream");
    near(share(&f, |t| t.kind == Kind::ReadModifyWrite), 0.5);
}

#[test]
fn read_ratio_overrides_the_mix() {
    let mut p = params(Workload::Deut);
    p.read_ratio = 0.9;
    near(
        share(&p.stream(0).expect("stream"), |t| t.kind == Kind::Read),
        0.9,
    );
}

#[test]
fn inserts_are_unique_across_threads() {
    let p = params(Workload::YcsbD);
    let mut inserted: Vec<u64> = (0..2)
        .flat_map(|t| {
            let s = p.stream(t).expect("stream");
            s.txns
                .iter()
                .filter(|t| t.kind == Kind::ReadWrite)
                .map(|t| s.keys(t)[0])
                .collect::<Vec<_>>()
        })
        .collect();
    let n = inserted.len();
    assert!(inserted.iter().all(|&k| k >= p.records));
    inserted.sort_unstable();
    inserted.dedup();
    assert_eq!(inserted.len(), n);
}

#[test]
fn incr1_hot_probability() {
    let mut p = params(Workload::Incr1);
    p.hot = 0.3;
    let s = p.stream(0).expect("stream");
    assert!(s.txns.iter().all(|t| t.kind == Kind::Incr));
    // Uniform draws land on key 0 too, 1 time in 10 000.
    near(share(&s, |t| s.keys(t)[0] == 0), 0.3 + 0.7 / 10_000.0);
}

#[test]
fn like_and_bid_key_layout() {
    let p = params(Workload::Like);
    let s = p.stream(0).expect("stream");
    near(share(&s, |t| t.kind == Kind::Read), 0.5);
    for t in &s.txns {
        let k = s.keys(t);
        assert!(k[0] < p.records, "page {}", k[0]);
        assert!((p.records..2 * p.records).contains(&k[1]), "user {}", k[1]);
    }
    let p = params(Workload::Bid);
    let s = p.stream(0).expect("stream");
    for t in &s.txns {
        let k = s.keys(t);
        assert_eq!(t.kind, Kind::Bid);
        assert_eq!([k[0] % 3, k[1] % 3, k[2] % 3], [0, 1, 2]);
        assert!(k[3] >= 3 * p.records);
        assert!((1..=1_000_000).contains(&t.arg));
    }
}

#[test]
fn mgp_half_read_half_write() {
    let mut p = params(Workload::Mgp);
    p.stream_txns = 2_000;
    let readers = p.stream(0).expect("stream");
    let writers = p.stream(1).expect("stream");
    assert!(readers.txns.iter().all(|t| t.kind == Kind::Read));
    assert!(
        writers
            .txns
            .iter()
            .all(|t| t.kind == Kind::ReadWrite && t.arg == 0)
    );
    assert!(
        readers
            .txns
            .iter()
            .all(|t| readers.keys(t).len() == MGP_KEYS)
    );
    let mut alone = p.clone();
    alone.threads = 1;
    near(
        share(&alone.stream(0).expect("stream"), |t| t.kind == Kind::Read),
        0.5,
    );
}

#[test]
fn deut_keys_follow_zipf() {
    let mut p = params(Workload::Deut);
    p.theta = 0.9;
    let s = p.stream(0).expect("stream");
    let mut counts = vec![0u64; p.records as usize];
    let mut draws = 0;
    for t in &s.txns {
        for &k in s.keys(t) {
            counts[k as usize] += 1;
            draws += 1;
        }
    }
    counts.sort_unstable_by(|a, b| b.cmp(a));
    let top: u64 = counts[..(p.records / 5) as usize].iter().sum();
    near(
        top as f64 / draws as f64,
        crate::keys::zipf_top_share(p.records, 0.9, p.records / 5),
    );
}

#[test]
fn stamps_identify_the_writer() {
    let mut w = Writer::new(7);
    let v = w.next_value().to_vec();
    assert_eq!(v.len(), VALUE_BYTES);
    assert_eq!(stamp_thread(&v), Some(7));
    let p = params(Workload::Deut);
    assert_eq!(stamp_thread(&p.initial_value(3)), Some(u32::MAX));
}

//! Model-based property tests: random operation sequences against the engine and a
//! `BTreeMap` model, with two read-write transactions interleaved and a snapshot open beside
//! them, all on one thread.
//!
//! The model predicts every result exactly: reads (own writes first, then the snapshot taken
//! at `begin`), range reads forward and backward with arbitrary bounds (inverted and empty
//! ones included) and early stops, commutative operations (`add`, `max`, `min`, ordered put,
//! top-k insert, the last two against their documented encodings) and their errors when they
//! meet a value of another kind, score adds (which also move an index entry per key, and
//! resolve early, as reads, when the transaction reads the key or ranges over it or its
//! index), and the outcome of every commit. A commit that wrote
//! something conflicts exactly when a key it read, or a key inside the part of a range it
//! actually read, was written by a transaction that committed after it began; a read-only
//! commit never conflicts. After each commit a fresh snapshot must equal the model's
//! committed map. Shrunk failures, and the edge cases worth naming, are kept below as
//! regression tests.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;

use keel::{CommitError, ConflictReason, Db, Error, Snapshot, Txn};
use proptest::prelude::*;

const KEY_NAMES: [&[u8]; 6] = [b"a", b"b", b"c", b"d", b"e", b"f"];

/// Keys only score adds (and their removal, as `ZREM` does it) write, before every key name;
/// their index entries (`i`, the score, the key) come after every key name, so that some
/// ranges reach the keys but not their index entries, and others the reverse.
const SCORE_KEYS: [&[u8]; 2] = [b"0s", b"0t"];
const INDEX_PREFIX: &[u8] = b"i";

fn index_key(value: &[u8], member: &[u8]) -> Vec<u8> {
    [INDEX_PREFIX, value, member].concat()
}

fn name(k: u8) -> Vec<u8> {
    KEY_NAMES[usize::from(k)].to_vec()
}

#[derive(Clone, Debug)]
struct RangeSpec {
    lo: Bound<u8>,
    hi: Bound<u8>,
    rev: bool,
    limit: Option<usize>,
}

impl RangeSpec {
    fn bounds(&self) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
        (self.lo.map(name), self.hi.map(name))
    }
}

#[derive(Clone, Debug)]
enum Step {
    Put(usize, u8, Vec<u8>),
    Delete(usize, u8),
    Get(usize, u8),
    Add(usize, u8, i64),
    Max(usize, u8, i64),
    Min(usize, u8, i64),
    Ordered(usize, u8, u64, Vec<u8>),
    TopK(usize, u8, u32, i64, Vec<u8>),
    /// A score add of an integer to `SCORE_KEYS[k]`.
    Score(usize, u8, i64),
    /// Reads `SCORE_KEYS[k]`.
    ScoreGet(usize, u8),
    /// Reads `SCORE_KEYS[k]` and, if present, deletes it and its index entry.
    ScoreRemove(usize, u8),
    Range(usize, RangeSpec),
    Commit(usize),
    Abort(usize),
    SnapOpen,
    SnapGet(u8),
    SnapRange(RangeSpec),
    SnapClose,
}

fn contains(bounds: &(Bound<Vec<u8>>, Bound<Vec<u8>>), key: &[u8]) -> bool {
    let lo = match &bounds.0 {
        Bound::Included(b) => key >= b.as_slice(),
        Bound::Excluded(b) => key > b.as_slice(),
        Bound::Unbounded => true,
    };
    let hi = match &bounds.1 {
        Bound::Included(b) => key <= b.as_slice(),
        Bound::Excluded(b) => key < b.as_slice(),
        Bound::Unbounded => true,
    };
    lo && hi
}

#[derive(Clone, Debug, PartialEq)]
enum MOp {
    Add(i64),
    Max(i64),
    Min(i64),
    Ordered(u64, Vec<u8>),
    TopK(u32, i64, Vec<u8>),
    Score(i64),
}

/// The documented top-k encoding: per entry an 8-byte big-endian score with the sign bit
/// flipped, a 4-byte big-endian member length, the member; highest score first, then member.
fn encode_top_k(entries: &[(i64, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (score, member) in entries {
        out.extend_from_slice(&((*score as u64) ^ (1 << 63)).to_be_bytes());
        out.extend_from_slice(&(member.len() as u32).to_be_bytes());
        out.extend_from_slice(member);
    }
    out
}

fn parse(key: &[u8], value: &[u8]) -> Result<i64, Error> {
    keel::parse_int(key, value)
}

impl MOp {
    fn apply(&self, key: &[u8], current: Option<&[u8]>) -> Result<Vec<u8>, Error> {
        match self {
            MOp::Ordered(order, payload) => {
                if let Some(current) = current {
                    let not_ordered = || Error::NotOrdered { key: key.to_vec() };
                    let (stored, stored_payload) =
                        current.split_first_chunk::<8>().ok_or_else(not_ordered)?;
                    // Highest order wins; on equal orders the larger payload (commutative).
                    if (u64::from_be_bytes(*stored), stored_payload) >= (*order, payload.as_slice())
                    {
                        return Ok(current.to_vec());
                    }
                }
                let mut out = order.to_be_bytes().to_vec();
                out.extend_from_slice(payload);
                return Ok(out);
            }
            MOp::TopK(k, score, member) => {
                let mut entries = match current {
                    Some(v) => keel::decode_top_k(v)
                        .ok_or_else(|| Error::NotATopK { key: key.to_vec() })?,
                    None => Vec::new(),
                };
                match entries.iter_mut().find(|(_, m)| m == member) {
                    Some(entry) => entry.0 = entry.0.max(*score),
                    None => entries.push((*score, member.clone())),
                }
                entries.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
                entries.truncate(*k as usize);
                return Ok(encode_top_k(&entries));
            }
            MOp::Score(delta) => {
                let base = current.map_or(0.0, |v| {
                    keel::decode_score_value(v).expect("score keys hold scores")
                });
                let sum = base + *delta as f64;
                return Ok(keel::encode_score(sum).to_be_bytes().to_vec());
            }
            _ => {}
        }
        let base = current.map(|v| parse(key, v)).transpose()?;
        let result = match (self, base) {
            (MOp::Add(d), base) => base.unwrap_or(0) + d,
            (MOp::Max(n) | MOp::Min(n), None) => *n,
            (MOp::Max(n), Some(b)) => b.max(*n),
            (MOp::Min(n), Some(b)) => b.min(*n),
            (MOp::Ordered(..) | MOp::TopK(..) | MOp::Score(_), _) => {
                unreachable!("handled above")
            }
        };
        Ok(result.to_string().into_bytes())
    }
}

#[derive(Clone, Debug)]
enum MWrite {
    Put(Vec<u8>),
    Delete,
    Ops(Vec<MOp>),
}

type Map = BTreeMap<Vec<u8>, Vec<u8>>;
type Items = Vec<(Vec<u8>, Vec<u8>)>;
type Bounds = (Bound<Vec<u8>>, Bound<Vec<u8>>);

struct MTxn {
    begin_seq: u64,
    snapshot: Map,
    writes: BTreeMap<Vec<u8>, MWrite>,
    reads: BTreeSet<Vec<u8>>,
    ranges: Vec<Bounds>,
    /// The engine's newest commit timestamp when this transaction began.
    ts_at_begin: u64,
}

fn is_score_add(write: &MWrite) -> bool {
    matches!(write, MWrite::Ops(ops) if matches!(ops.first(), Some(MOp::Score(_))))
}

impl MTxn {
    /// Resolves the pending score adds of `key` as the engine does before a read that could
    /// see them: a read of the key, a put of the sum, the index entry moved.
    fn settle(&mut self, key: &[u8]) {
        let Some(MWrite::Ops(ops)) = self.writes.get(key).cloned() else {
            unreachable!("only pending score adds settle")
        };
        self.reads.insert(key.to_vec());
        let committed = self.snapshot.get(key).cloned();
        let mut value = committed.clone();
        for op in &ops {
            value = Some(op.apply(key, value.as_deref()).expect("scores add"));
        }
        let value = value.expect("at least one add");
        self.move_index(key, committed.as_deref(), &value);
        self.writes.insert(key.to_vec(), MWrite::Put(value));
    }

    fn move_index(&mut self, key: &[u8], old: Option<&[u8]>, new: &[u8]) {
        if old == Some(new) {
            return;
        }
        if let Some(old) = old {
            self.writes.insert(index_key(old, key), MWrite::Delete);
        }
        self.writes
            .insert(index_key(new, key), MWrite::Put(Vec::new()));
    }

    fn score_add(&mut self, key: &[u8], delta: i64) {
        let op = MOp::Score(delta);
        match self.writes.get(key).cloned() {
            Some(MWrite::Ops(mut ops)) => {
                ops.push(op);
                self.writes.insert(key.to_vec(), MWrite::Ops(ops));
            }
            None => {
                self.writes.insert(key.to_vec(), MWrite::Ops(vec![op]));
            }
            Some(_) => {
                let old = self.get(key).expect("own writes of scores");
                let new = op.apply(key, old.as_deref()).expect("scores add");
                self.move_index(key, old.as_deref(), &new);
                self.writes.insert(key.to_vec(), MWrite::Put(new));
            }
        }
    }

    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        if self.writes.get(key).is_some_and(is_score_add) {
            self.settle(key);
        }
        match self.writes.get(key) {
            Some(MWrite::Put(v)) => Ok(Some(v.clone())),
            Some(MWrite::Delete) => Ok(None),
            Some(MWrite::Ops(ops)) => {
                self.reads.insert(key.to_vec());
                let mut value = self.snapshot.get(key).cloned();
                for op in ops {
                    value = Some(op.apply(key, value.as_deref())?);
                }
                Ok(value)
            }
            None => {
                self.reads.insert(key.to_vec());
                Ok(self.snapshot.get(key).cloned())
            }
        }
    }

    fn commutative(&mut self, key: &[u8], op: MOp) -> Result<(), Error> {
        let write = match self.writes.get(key) {
            None => MWrite::Ops(vec![op]),
            Some(MWrite::Put(v)) => MWrite::Put(op.apply(key, Some(v))?),
            Some(MWrite::Delete) => MWrite::Put(op.apply(key, None)?),
            Some(MWrite::Ops(ops)) => {
                let mut ops = ops.clone();
                ops.push(op);
                MWrite::Ops(ops)
            }
        };
        self.writes.insert(key.to_vec(), write);
        Ok(())
    }

    /// What a range read returns, in key order; own commutative writes in the range are read
    /// (and remembered) when the range is created. An own commutative write that fails reads
    /// as absent in the first view and as its committed base value in the second: the code
    /// does the former, a comment in `txn.rs` promises the latter, and either is accepted
    /// (the failure itself surfaces at `get` and at commit).
    fn range_view(&mut self, bounds: &Bounds) -> (Items, Items) {
        // Pending score adds whose key or index the range could reach resolve first.
        let pending: Vec<Vec<u8>> = self
            .writes
            .iter()
            .filter(|(k, w)| {
                is_score_add(w)
                    && (contains(bounds, k)
                        || range_overlaps(
                            bounds,
                            &index_key(&[0; 8], k),
                            &index_key(&[0xff; 8], k),
                        ))
            })
            .map(|(k, _)| k.clone())
            .collect();
        for key in pending {
            self.settle(&key);
        }
        let mut view: Map = self
            .snapshot
            .iter()
            .filter(|(k, _)| contains(bounds, k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let own: Vec<Vec<u8>> = self
            .writes
            .keys()
            .filter(|k| contains(bounds, k))
            .cloned()
            .collect();
        let mut base_view = view.clone();
        for key in own {
            match self.get(&key) {
                Ok(Some(v)) => {
                    view.insert(key.clone(), v.clone());
                    base_view.insert(key, v);
                }
                Ok(None) => {
                    view.remove(&key);
                    base_view.remove(&key);
                }
                Err(_) => {
                    view.remove(&key);
                    match self.snapshot.get(&key) {
                        Some(v) => base_view.insert(key, v.clone()),
                        None => base_view.remove(&key),
                    };
                }
            }
        }
        (view.into_iter().collect(), base_view.into_iter().collect())
    }
}

/// Whether `bounds` reaches into `[first, last]`.
fn range_overlaps(bounds: &Bounds, first: &[u8], last: &[u8]) -> bool {
    let ends_before = match &bounds.1 {
        Bound::Included(h) => h.as_slice() < first,
        Bound::Excluded(h) => h.as_slice() <= first,
        Bound::Unbounded => false,
    };
    let starts_after = match &bounds.0 {
        Bound::Included(l) => l.as_slice() > last,
        Bound::Excluded(l) => l.as_slice() >= last,
        Bound::Unbounded => false,
    };
    !ends_before && !starts_after
}

#[derive(Default)]
struct Model {
    committed: Map,
    /// Per key, the sequence number of the last commit that wrote it.
    last_write: HashMap<Vec<u8>, u64>,
    seq: u64,
    last_commit_ts: u64,
}

/// Drives a range iterator the way `spec` says; returns what it yielded (in key order) and
/// whether it ran out.
fn drive(
    mut it: impl DoubleEndedIterator<Item = (Vec<u8>, Vec<u8>)>,
    spec: &RangeSpec,
) -> (Items, bool) {
    let mut got = Vec::new();
    let mut exhausted = false;
    while spec.limit.is_none_or(|l| got.len() < l) {
        let item = if spec.rev { it.next_back() } else { it.next() };
        match item {
            Some(item) => got.push(item),
            None => {
                exhausted = true;
                break;
            }
        }
    }
    if spec.rev {
        got.reverse();
    }
    (got, exhausted)
}

/// The model's answer to a range read over `view` (everything in range, in key order).
fn predict(view: &[(Vec<u8>, Vec<u8>)], spec: &RangeSpec) -> (Items, bool) {
    let limit = spec.limit.unwrap_or(usize::MAX);
    let exhausted = view.len() < limit;
    let mut got: Vec<_> = if spec.rev {
        view.iter().rev().take(limit).cloned().collect()
    } else {
        view.iter().take(limit).cloned().collect()
    };
    if spec.rev {
        got.reverse();
    }
    (got, exhausted)
}

fn scan_all(snapshot: &Snapshot<'_>) -> Map {
    snapshot.range::<&[u8]>(..).collect()
}

fn run_steps(steps: &[Step]) -> Result<(), TestCaseError> {
    let db = Db::in_memory();
    let mut model = Model::default();
    let mut txns: [Option<(Txn<'_>, MTxn)>; 2] = [None, None];
    let mut snap: Option<(Snapshot<'_>, Map)> = None;
    for (i, step) in steps.iter().enumerate() {
        let slot = match *step {
            Step::Put(s, ..)
            | Step::Delete(s, _)
            | Step::Get(s, _)
            | Step::Add(s, ..)
            | Step::Max(s, ..)
            | Step::Min(s, ..)
            | Step::Ordered(s, ..)
            | Step::TopK(s, ..)
            | Step::Score(s, ..)
            | Step::ScoreGet(s, _)
            | Step::ScoreRemove(s, _)
            | Step::Range(s, _) => Some(s),
            _ => None,
        };
        if let Some(s) = slot
            && txns[s].is_none()
        {
            let txn = db.begin().unwrap();
            prop_assert!(
                txn.read_ts().0 >= model.last_commit_ts,
                "step {i}: stale read_ts"
            );
            let m = MTxn {
                begin_seq: model.seq,
                snapshot: model.committed.clone(),
                writes: BTreeMap::new(),
                reads: BTreeSet::new(),
                ranges: Vec::new(),
                ts_at_begin: model.last_commit_ts,
            };
            txns[s] = Some((txn, m));
        }
        match step {
            Step::Put(s, k, v) => {
                let (txn, m) = txns[*s].as_mut().unwrap();
                txn.put(&name(*k), v).unwrap();
                m.writes.insert(name(*k), MWrite::Put(v.clone()));
            }
            Step::Delete(s, k) => {
                let (txn, m) = txns[*s].as_mut().unwrap();
                txn.delete(&name(*k)).unwrap();
                m.writes.insert(name(*k), MWrite::Delete);
            }
            Step::Get(s, k) => {
                let (txn, m) = txns[*s].as_mut().unwrap();
                prop_assert_eq!(
                    txn.get(&name(*k)),
                    m.get(&name(*k)),
                    "step {}: {:?}",
                    i,
                    step
                );
            }
            Step::Add(s, k, n) | Step::Max(s, k, n) | Step::Min(s, k, n) => {
                let (txn, m) = txns[*s].as_mut().unwrap();
                let key = name(*k);
                let (got, op) = match step {
                    Step::Add(..) => (txn.add(&key, *n), MOp::Add(*n)),
                    Step::Max(..) => (txn.max(&key, *n), MOp::Max(*n)),
                    _ => (txn.min(&key, *n), MOp::Min(*n)),
                };
                prop_assert_eq!(got, m.commutative(&key, op), "step {}: {:?}", i, step);
            }
            Step::Ordered(s, k, order, payload) => {
                let (txn, m) = txns[*s].as_mut().unwrap();
                let key = name(*k);
                let got = txn.put_ordered(&key, *order, payload);
                let want = m.commutative(&key, MOp::Ordered(*order, payload.clone()));
                prop_assert_eq!(got, want, "step {}: {:?}", i, step);
            }
            Step::TopK(s, k, n, score, member) => {
                let (txn, m) = txns[*s].as_mut().unwrap();
                let key = name(*k);
                let got = txn.top_k_insert(&key, *n, *score, member);
                let want = m.commutative(&key, MOp::TopK(*n, *score, member.clone()));
                prop_assert_eq!(got, want, "step {}: {:?}", i, step);
            }
            Step::Score(s, k, delta) => {
                let (txn, m) = txns[*s].as_mut().unwrap();
                let key = SCORE_KEYS[usize::from(*k)];
                txn.score_add(key, *delta as f64, INDEX_PREFIX, key)
                    .unwrap();
                m.score_add(key, *delta);
            }
            Step::ScoreGet(s, k) => {
                let (txn, m) = txns[*s].as_mut().unwrap();
                let key = SCORE_KEYS[usize::from(*k)];
                prop_assert_eq!(txn.get(key), m.get(key), "step {}: {:?}", i, step);
            }
            Step::ScoreRemove(s, k) => {
                let (txn, m) = txns[*s].as_mut().unwrap();
                let key = SCORE_KEYS[usize::from(*k)];
                let got = txn.get(key).unwrap();
                prop_assert_eq!(&got, &m.get(key).unwrap(), "step {}: {:?}", i, step);
                if let Some(v) = got {
                    txn.delete(key).unwrap();
                    txn.delete(&index_key(&v, key)).unwrap();
                    m.writes.insert(key.to_vec(), MWrite::Delete);
                    m.writes.insert(index_key(&v, key), MWrite::Delete);
                }
            }
            Step::Range(s, spec) => {
                let (txn, m) = txns[*s].as_mut().unwrap();
                let bounds = spec.bounds();
                let (view, base_view) = m.range_view(&bounds);
                let (got, engine_exhausted) = drive(txn.range(bounds.clone()), spec);
                let (mut want, mut exhausted) = predict(&view, spec);
                if got != want {
                    (want, exhausted) = predict(&base_view, spec);
                }
                prop_assert_eq!(&got, &want, "step {}: {:?}", i, step);
                prop_assert_eq!(engine_exhausted, exhausted, "step {}: {:?}", i, step);
                // The part actually read, as the engine documents it.
                if exhausted {
                    m.ranges.push(bounds);
                } else if spec.rev {
                    if let Some((first, _)) = got.first() {
                        m.ranges.push((Bound::Included(first.clone()), bounds.1));
                    }
                } else if let Some((last, _)) = got.last() {
                    m.ranges.push((bounds.0, Bound::Included(last.clone())));
                }
            }
            Step::Commit(s) => {
                let Some((txn, m)) = txns[*s].take() else {
                    continue;
                };
                let got = txn.commit();
                commit_model(&mut model, m, got, i)?;
                let fresh = db.snapshot().unwrap();
                prop_assert_eq!(
                    scan_all(&fresh),
                    model.committed.clone(),
                    "after step {}",
                    i
                );
            }
            Step::Abort(s) => {
                txns[*s] = None;
            }
            Step::SnapOpen => {
                if snap.is_none() {
                    snap = Some((db.snapshot().unwrap(), model.committed.clone()));
                }
            }
            Step::SnapGet(k) => {
                if let Some((snapshot, m)) = &snap {
                    prop_assert_eq!(
                        snapshot.get(&name(*k)).unwrap(),
                        m.get(&name(*k)).cloned(),
                        "step {}",
                        i
                    );
                }
            }
            Step::SnapRange(spec) => {
                if let Some((snapshot, m)) = &snap {
                    let bounds = spec.bounds();
                    let view: Vec<_> = m
                        .iter()
                        .filter(|(k, _)| contains(&bounds, k))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                    let (want, _) = predict(&view, spec);
                    let (got, _) = drive(snapshot.range(bounds), spec);
                    prop_assert_eq!(got, want, "step {}: {:?}", i, step);
                }
            }
            Step::SnapClose => snap = None,
        }
    }
    Ok(())
}

/// Checks a commit's outcome against the model's prediction and applies it to the model.
fn commit_model(
    model: &mut Model,
    m: MTxn,
    got: Result<Result<keel::Ts, keel::Conflict>, CommitError>,
    step: usize,
) -> Result<(), TestCaseError> {
    if m.writes.is_empty() {
        let ts = got.unwrap().unwrap();
        prop_assert!(
            ts.0 >= m.ts_at_begin,
            "step {step}: read-only commit ts {ts:?}"
        );
        return Ok(());
    }
    // Commutative operations meet the newest committed value, in key order.
    let mut values: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::new();
    let mut apply_error = None;
    for (key, write) in &m.writes {
        let value = match write {
            MWrite::Put(v) => Some(v.clone()),
            MWrite::Delete => None,
            // A score add resolves against the newest committed score and moves the index
            // entry from that score to the sum.
            MWrite::Ops(ops) if is_score_add(write) => {
                let old = model.committed.get(key).cloned();
                let mut value = old.clone();
                for op in ops {
                    value = Some(op.apply(key, value.as_deref()).expect("scores add"));
                }
                if old != value {
                    if let Some(old) = &old {
                        values.push((index_key(old, key), None));
                    }
                    let new = value.as_deref().expect("a sum");
                    values.push((index_key(new, key), Some(Vec::new())));
                }
                value
            }
            MWrite::Ops(ops) => {
                let mut value = model.committed.get(key).cloned();
                for op in ops {
                    match op.apply(key, value.as_deref()) {
                        Ok(v) => value = Some(v),
                        Err(e) => {
                            apply_error.get_or_insert(e);
                        }
                    }
                }
                value
            }
        };
        values.push((key.clone(), value));
    }
    let changed = |key: &Vec<u8>| model.last_write.get(key).is_some_and(|&s| s > m.begin_seq);
    let stale_reads: BTreeSet<Vec<u8>> = m.reads.iter().filter(|k| changed(k)).cloned().collect();
    let stale_ranged: BTreeSet<Vec<u8>> = model
        .last_write
        .keys()
        .filter(|k| changed(k) && m.ranges.iter().any(|r| contains(r, k)))
        .cloned()
        .collect();
    let conflict = !stale_reads.is_empty() || !stale_ranged.is_empty();
    match got {
        Err(CommitError::Apply(e)) => {
            prop_assert_eq!(Some(e), apply_error, "step {}: apply error", step);
            return Ok(());
        }
        Err(e) => return Err(TestCaseError::fail(format!("step {step}: {e}"))),
        Ok(Err(c)) => {
            prop_assert!(
                conflict,
                "step {step}: conflict {c}, but nothing it read changed since it began"
            );
            if !stale_reads.is_empty() {
                prop_assert_eq!(c.reason, ConflictReason::ReadChanged, "step {}", step);
                prop_assert!(stale_reads.contains(&c.key), "step {step}: {c}");
            } else {
                prop_assert_eq!(c.reason, ConflictReason::Phantom, "step {}: {}", step, c);
                prop_assert!(stale_ranged.contains(&c.key), "step {step}: {c}");
            }
            return Ok(());
        }
        Ok(Ok(ts)) => {
            prop_assert!(
                apply_error.is_none(),
                "step {step}: committed despite {apply_error:?}"
            );
            prop_assert!(
                !conflict,
                "step {step}: committed although it read {stale_reads:?} and scanned \
                 {stale_ranged:?}, changed since it began"
            );
            prop_assert!(
                ts.0 > model.last_commit_ts,
                "step {step}: ts {ts:?} not increasing"
            );
            model.last_commit_ts = ts.0;
        }
    }
    model.seq += 1;
    for (key, value) in values {
        model.last_write.insert(key.clone(), model.seq);
        match value {
            Some(v) => model.committed.insert(key, v),
            None => model.committed.remove(&key),
        };
    }
    Ok(())
}

fn step() -> impl Strategy<Value = Step> {
    let slot = 0usize..2;
    let key = 0u8..5;
    let value = prop_oneof![
        4 => (-5i64..20).prop_map(|n| n.to_string().into_bytes()),
        1 => Just(b"x".to_vec()),
    ];
    let member = prop_oneof![
        Just(b"p".to_vec()),
        Just(b"q".to_vec()),
        Just(b"rr".to_vec())
    ];
    let bound = prop_oneof![
        1 => Just(Bound::Unbounded),
        2 => (0u8..6).prop_map(Bound::Included),
        2 => (0u8..6).prop_map(Bound::Excluded),
    ];
    let range = (
        bound.clone(),
        bound,
        any::<bool>(),
        proptest::option::of(0usize..4),
    )
        .prop_map(|(lo, hi, rev, limit)| RangeSpec { lo, hi, rev, limit });
    prop_oneof![
        3 => (slot.clone(), key.clone(), value).prop_map(|(s, k, v)| Step::Put(s, k, v)),
        1 => (slot.clone(), key.clone()).prop_map(|(s, k)| Step::Delete(s, k)),
        3 => (slot.clone(), key.clone()).prop_map(|(s, k)| Step::Get(s, k)),
        2 => (slot.clone(), key.clone(), -3i64..4).prop_map(|(s, k, n)| Step::Add(s, k, n)),
        1 => (slot.clone(), key.clone(), -3i64..9).prop_map(|(s, k, n)| Step::Max(s, k, n)),
        1 => (slot.clone(), key.clone(), -3i64..9).prop_map(|(s, k, n)| Step::Min(s, k, n)),
        1 => (slot.clone(), key.clone(), 0u64..4, member.clone())
            .prop_map(|(s, k, o, v)| Step::Ordered(s, k, o, v)),
        1 => (slot.clone(), key.clone(), 1u32..4, -3i64..4, member)
            .prop_map(|(s, k, n, score, m)| Step::TopK(s, k, n, score, m)),
        2 => (slot.clone(), 0u8..2, -3i64..4).prop_map(|(s, k, d)| Step::Score(s, k, d)),
        1 => (slot.clone(), 0u8..2).prop_map(|(s, k)| Step::ScoreGet(s, k)),
        1 => (slot.clone(), 0u8..2).prop_map(|(s, k)| Step::ScoreRemove(s, k)),
        2 => (slot.clone(), range.clone()).prop_map(|(s, r)| Step::Range(s, r)),
        3 => slot.clone().prop_map(Step::Commit),
        1 => slot.prop_map(Step::Abort),
        1 => Just(Step::SnapOpen),
        1 => key.prop_map(Step::SnapGet),
        1 => range.prop_map(Step::SnapRange),
        1 => Just(Step::SnapClose),
    ]
}

/// Random sequences `engine_matches_model` runs: 512, or `KEEL_MODEL_CASES` (a longer hunt).
fn model_cases() -> u32 {
    std::env::var("KEEL_MODEL_CASES").map_or(512, |v| {
        v.parse()
            .expect("KEEL_MODEL_CASES is a number of random sequences")
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: model_cases(), ..ProptestConfig::default() })]

    #[test]
    fn engine_matches_model(steps in proptest::collection::vec(step(), 1..80)) {
        run_steps(&steps)?;
    }
}

/// Regression cases, named. Each runs through the same model as the property.
mod regressions {
    use super::*;

    fn spec(lo: Bound<u8>, hi: Bound<u8>, rev: bool, limit: Option<usize>) -> RangeSpec {
        RangeSpec { lo, hi, rev, limit }
    }

    #[test]
    fn partial_forward_range_ignores_an_insert_past_the_last_key_read() {
        let steps = [
            Step::Put(1, 0, b"1".to_vec()),
            Step::Put(1, 2, b"1".to_vec()),
            Step::Commit(1),
            Step::Range(0, spec(Bound::Unbounded, Bound::Unbounded, false, Some(1))),
            Step::Put(1, 3, b"new".to_vec()),
            Step::Commit(1),
            Step::Put(0, 4, b"mine".to_vec()),
            Step::Commit(0),
        ];
        run_steps(&steps).unwrap();
    }

    #[test]
    fn partial_reverse_range_conflicts_with_an_insert_in_the_part_read() {
        let steps = [
            Step::Put(1, 0, b"1".to_vec()),
            Step::Put(1, 2, b"1".to_vec()),
            Step::Commit(1),
            Step::Range(0, spec(Bound::Unbounded, Bound::Unbounded, true, Some(1))),
            Step::Put(1, 3, b"new".to_vec()),
            Step::Commit(1),
            Step::Put(0, 4, b"mine".to_vec()),
            Step::Commit(0),
        ];
        run_steps(&steps).unwrap();
    }

    #[test]
    fn inverted_and_empty_bounds_read_nothing_and_conflict_with_nothing() {
        let steps = [
            Step::Put(1, 2, b"1".to_vec()),
            Step::Commit(1),
            Step::Range(0, spec(Bound::Included(3), Bound::Included(1), false, None)),
            Step::Range(0, spec(Bound::Excluded(2), Bound::Excluded(2), true, None)),
            Step::Range(0, spec(Bound::Excluded(2), Bound::Included(2), false, None)),
            Step::SnapOpen,
            Step::SnapRange(spec(Bound::Included(4), Bound::Excluded(0), true, None)),
            Step::Put(1, 2, b"2".to_vec()),
            Step::Commit(1),
            Step::Put(0, 0, b"mine".to_vec()),
            Step::Commit(0),
        ];
        run_steps(&steps).unwrap();
    }

    #[test]
    fn a_delete_of_an_absent_key_is_a_phantom_for_a_scanner() {
        let steps = [
            Step::Range(0, spec(Bound::Unbounded, Bound::Unbounded, false, None)),
            Step::Delete(1, 3),
            Step::Commit(1),
            Step::Put(0, 0, b"1".to_vec()),
            Step::Commit(0),
        ];
        run_steps(&steps).unwrap();
    }

    #[test]
    fn commutative_ops_on_values_of_another_kind_fail_at_commit() {
        let steps = [
            Step::Put(1, 0, b"x".to_vec()),
            Step::Ordered(1, 1, 2, b"p".to_vec()),
            Step::Commit(1),
            Step::Add(0, 0, 1),
            Step::Get(0, 0),
            Step::TopK(0, 1, 2, 5, b"q".to_vec()),
            Step::Range(0, spec(Bound::Unbounded, Bound::Unbounded, false, None)),
            Step::Commit(0),
        ];
        run_steps(&steps).unwrap();
    }
}

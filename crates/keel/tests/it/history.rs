//! A serializability checker for recorded histories, and the tests that prove it.
//!
//! Histories use the list-append design of Elle (Kingsbury and Alvaro, 2020): every write
//! appends an element that is unique in the whole history to the list stored under a key, so
//! every read of a key reveals that key's entire version order up to the version it saw. The
//! checker therefore never has to trust the engine's timestamps to know which version came
//! after which. From the reads it rebuilds, per key, one version order (every read must be a
//! prefix of the longest one), then the dependency graph over committed transactions:
//!
//! - `ww`: the writer of version `i` precedes the writer of version `i + 1`;
//! - `wr`: the writer of the version a transaction read precedes the reader;
//! - `rw`: a reader of version `i` precedes the writer of version `i + 1` (an
//!   anti-dependency). A range read is a read of every key in its covered range, and a key the
//!   range did not return was read as absent (the empty list), so an insert into a scanned
//!   range gives the scanner an `rw` edge to the inserter: phantoms become cycles;
//! - `rt`: a transaction that finished (in real time) before another began precedes it
//!   (strict serializability).
//!
//! Committed appends that no read observed are placed after the longest observed version
//! (any read serialized after them would have shown them). A cycle is reported with every edge
//! on it. Before the graph, the checker rejects reads that no serial order explains: an
//! element no transaction appended (garbage), an element of an aborted transaction (dirty
//! read, G1a), two reads of a key that are not prefixes of each other, duplicates, and reads
//! of one's own writes that lost them.
//!
//! Separately, it checks the engine's own claim that timestamp order is a serial order: every
//! dependency edge must go forward in commit-timestamp order, where a read-only transaction
//! with snapshot `r` sits after the commit at `r` and before `r + 1`, and every real-time
//! precedence must too. Commutative counter `add`s carry no dependency edges; counter reads are
//! checked against the sum of the deltas committed at or below the reader's snapshot.
//!
//! The `tests` at the bottom feed the checker hand-built histories with known anomalies (write
//! skew, lost update, read skew, dirty and garbage reads, phantoms, stale reads, incompatible
//! orders, timestamp inversions) and a valid history, so that a checker that accepts
//! everything cannot pass.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;

/// A list key, by number.
pub type Key = u32;
/// A list element; unique across a history.
pub type Elem = u64;

/// The key a list is stored under: `k00`, `k01`, ... (list keys sort together, after
/// anything starting with a lower byte).
pub fn list_key(k: Key) -> Vec<u8> {
    format!("k{k:02}").into_bytes()
}

/// A stored list (`None`: absent, the empty list): elements as decimal text, space-separated.
pub fn decode_list(value: Option<&[u8]>) -> Vec<Elem> {
    let Some(value) = value else {
        return Vec::new();
    };
    let text = std::str::from_utf8(value).expect("lists are ASCII");
    text.split(' ')
        .map(|e| e.parse().expect("list elements are numbers"))
        .collect()
}

/// The stored form of `list` (see [`decode_list`]).
pub fn encode_list(list: &[Elem]) -> Vec<u8> {
    let text: Vec<String> = list.iter().map(u64::to_string).collect();
    text.join(" ").into_bytes()
}

/// The workload's step on list `k` inside `txn`: read the list (recorded in `ops`), then, if
/// `append` and `txn` has not appended to `k` yet, append a fresh element (`next_elem` + 1)
/// and put the longer list back. Returns whether it wrote.
pub fn read_then_append(
    txn: &mut keel::Txn<'_>,
    k: Key,
    append: bool,
    next_elem: &mut Elem,
    ops: &mut Vec<Op>,
    appended: &mut Vec<Key>,
) -> bool {
    let mut list = decode_list(txn.get(&list_key(k)).unwrap().as_deref());
    ops.push(Op::Read {
        key: k,
        value: list.clone(),
    });
    if !append || appended.contains(&k) {
        return false;
    }
    *next_elem += 1;
    list.push(*next_elem);
    txn.put(&list_key(k), &encode_list(&list)).unwrap();
    ops.push(Op::Append {
        key: k,
        elem: *next_elem,
    });
    appended.push(k);
    true
}

/// One operation of a transaction, in the order it ran.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// A point read of a list key; `value` is the whole list seen (empty: the key was absent).
    Read { key: Key, value: Vec<Elem> },
    /// Appended `elem` to the list under `key`.
    Append { key: Key, elem: Elem },
    /// A range read whose covered part is the keys `lo..=hi`; `found` holds what it returned,
    /// in key order. Keys in `lo..=hi` that are not in `found` were read as absent.
    Range {
        lo: Key,
        hi: Key,
        found: Vec<(Key, Vec<Elem>)>,
    },
    /// A commutative `add` of `delta` to a counter; adds no read dependency.
    Add { counter: Key, delta: i64 },
    /// A read of a counter.
    CounterRead { counter: Key, value: i64 },
}

/// How a transaction ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Committed,
    /// Lost a conflict, was dropped, or failed: none of its writes may be visible.
    Aborted,
}

/// Where the engine says a committed transaction sits in its serial order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Position {
    /// A transaction that wrote, at its commit timestamp.
    Commit(u64),
    /// A read-only transaction or snapshot at its snapshot timestamp: after the commit at
    /// that timestamp, before the next one.
    ReadAt(u64),
    /// A commit that only applied commutative operations to split records: right after the
    /// commit at this timestamp, and after the snapshots there that did not see it, before
    /// the next commit. Its deltas count for readers at or above it, like a commit's.
    After(u64),
}

impl Position {
    fn order(self) -> (u64, u8) {
        match self {
            Position::Commit(ts) | Position::After(ts) => (ts, 0),
            Position::ReadAt(ts) => (ts, 1),
        }
    }

    /// The latest position that may finish before this one begins (real time): for `After`,
    /// snapshots at its timestamp may precede it too.
    fn order_as_later(self) -> (u64, u8) {
        match self {
            Position::After(ts) => (ts, 1),
            other => other.order(),
        }
    }

    /// The commit timestamp whose readers see this transaction's writes.
    fn visible_at(self) -> Option<u64> {
        match self {
            Position::Commit(ts) | Position::After(ts) => Some(ts),
            Position::ReadAt(_) => None,
        }
    }
}

/// One transaction of a history.
#[derive(Clone, Debug)]
pub struct TxnRecord {
    /// A name for messages, such as `"t2.17"` (thread 2, its 17th transaction).
    pub name: String,
    pub ops: Vec<Op>,
    pub outcome: Outcome,
    /// The engine's claimed serial position, if known.
    pub position: Option<Position>,
    /// The snapshot timestamp the transaction read at, if known (for counter reads).
    pub read_ts: Option<u64>,
    /// Real-time interval: a tick taken before it began and one after it ended.
    pub time: Option<(u64, u64)>,
}

impl TxnRecord {
    /// A committed transaction without timestamps or timing (for hand-built histories).
    pub fn committed(name: &str, ops: Vec<Op>) -> TxnRecord {
        TxnRecord {
            name: name.to_string(),
            ops,
            outcome: Outcome::Committed,
            position: None,
            read_ts: None,
            time: None,
        }
    }

    /// An aborted transaction.
    pub fn aborted(name: &str, ops: Vec<Op>) -> TxnRecord {
        TxnRecord {
            outcome: Outcome::Aborted,
            ..TxnRecord::committed(name, ops)
        }
    }

    fn at(mut self, position: Position) -> TxnRecord {
        self.position = Some(position);
        self
    }

    fn during(mut self, began: u64, ended: u64) -> TxnRecord {
        self.time = Some((began, ended));
        self
    }

    /// A transaction of list appends whose outcome its client never learned (a lost answer),
    /// resolved by the final state: committed, at some time after `began`, if any of its
    /// appends is `present`, else aborted. An error if only some of them are (it was not
    /// all-or-nothing). Used by the cluster tests, whose clients meet such outcomes.
    #[allow(dead_code)]
    pub fn resolve_unknown(
        name: String,
        appends: Vec<Op>,
        began: u64,
        present: impl Fn(Key, Elem) -> bool,
    ) -> Result<TxnRecord, String> {
        let shown = appends
            .iter()
            .filter(|op| matches!(op, Op::Append { key, elem } if present(*key, *elem)))
            .count();
        if shown != 0 && shown != appends.len() {
            let each: Vec<String> = appends
                .iter()
                .filter_map(|op| match op {
                    Op::Append { key, elem } => Some(format!(
                        "{elem} to key {key} {}",
                        if present(*key, *elem) {
                            "present"
                        } else {
                            "absent"
                        }
                    )),
                    _ => None,
                })
                .collect();
            return Err(format!(
                "{name}: only part of a transaction's appends are present: {}",
                each.join(", ")
            ));
        }
        Ok(TxnRecord {
            name,
            ops: appends,
            outcome: if shown > 0 {
                Outcome::Committed
            } else {
                Outcome::Aborted
            },
            position: None,
            read_ts: None,
            time: Some((began, u64::MAX)),
        })
    }
}

/// What a successful check saw, so that callers can assert a history was not trivial.
#[derive(Debug, Default)]
pub struct Report {
    pub committed: usize,
    pub aborted: usize,
    /// Dependency edges (ww, wr, rw) between distinct committed transactions.
    pub edges: usize,
    /// Anti-dependency (rw) edges among them.
    pub rw_edges: usize,
    /// Range reads by committed transactions, and how many keys they returned in all.
    pub ranges: usize,
    pub range_keys: usize,
    /// The longest list seen.
    pub list_len_max: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EdgeKind {
    Ww,
    Wr,
    Rw,
    Rt,
}

#[derive(Clone, Debug)]
struct Edge {
    to: usize,
    kind: EdgeKind,
    why: String,
}

/// Checks a history; `Err` describes the first anomaly found.
pub fn check(history: &[TxnRecord]) -> Result<Report, String> {
    let mut report = Report::default();
    for t in history {
        match t.outcome {
            Outcome::Committed => report.committed += 1,
            Outcome::Aborted => report.aborted += 1,
        }
    }
    let name = |i: usize| history[i].name.as_str();

    // Who appended what.
    let mut writer: HashMap<(Key, Elem), usize> = HashMap::new();
    for (i, t) in history.iter().enumerate() {
        let mut keys = BTreeSet::new();
        for op in &t.ops {
            if let Op::Append { key, elem } = *op {
                if let Some(j) = writer.insert((key, elem), i) {
                    return Err(format!(
                        "element {elem} of key {key} appended by both {} and {}",
                        name(j),
                        name(i)
                    ));
                }
                if !keys.insert(key) {
                    return Err(format!(
                        "{} appends twice to key {key}; histories append once per key",
                        name(i)
                    ));
                }
            }
        }
    }

    // The external reads of committed transactions: (txn, key, list).
    let universe: BTreeSet<Key> = history
        .iter()
        .flat_map(|t| &t.ops)
        .flat_map(|op| match op {
            Op::Read { key, .. } | Op::Append { key, .. } => vec![*key],
            Op::Range { found, .. } => found.iter().map(|(k, _)| *k).collect(),
            Op::Add { .. } | Op::CounterRead { .. } => vec![],
        })
        .collect();
    let mut reads: Vec<(usize, Key, Vec<Elem>)> = Vec::new();
    for (i, t) in history.iter().enumerate() {
        if t.outcome != Outcome::Committed {
            continue;
        }
        let mut own: BTreeMap<Key, Elem> = BTreeMap::new();
        for op in &t.ops {
            let mut seen: Vec<(Key, &[Elem])> = Vec::new();
            match op {
                Op::Append { key, elem } => {
                    own.insert(*key, *elem);
                }
                Op::Read { key, value } => seen.push((*key, value)),
                Op::Range { lo, hi, found } => {
                    report.ranges += 1;
                    report.range_keys += found.len();
                    for pair in found.windows(2) {
                        if pair[0].0 >= pair[1].0 {
                            return Err(format!("{}: range read out of key order", name(i)));
                        }
                    }
                    let found: BTreeMap<Key, &[Elem]> =
                        found.iter().map(|(k, v)| (*k, v.as_slice())).collect();
                    if found.keys().any(|k| k < lo || k > hi) {
                        return Err(format!(
                            "{}: range {lo}..={hi} returned a key outside it",
                            name(i)
                        ));
                    }
                    if found.values().any(|v| v.is_empty()) {
                        return Err(format!("{}: range returned an empty (absent) key", name(i)));
                    }
                    for key in universe.range(lo..=hi) {
                        seen.push((*key, found.get(key).copied().unwrap_or(&[])));
                    }
                }
                Op::Add { .. } | Op::CounterRead { .. } => {}
            }
            for (key, value) in seen {
                if let Some(&mine) = own.get(&key) {
                    // An internal read: it must show this transaction's own append last.
                    if value.last() != Some(&mine) {
                        return Err(format!(
                            "{} appended {mine} to key {key} and then read {value:?}",
                            name(i)
                        ));
                    }
                    continue;
                }
                reads.push((i, key, value.to_vec()));
            }
        }
    }

    // Every element read was written by a committed transaction, once, and not by the reader
    // later on.
    for (reader, key, value) in &reads {
        let mut distinct = BTreeSet::new();
        for elem in value {
            if !distinct.insert(elem) {
                return Err(format!(
                    "{} read key {key} = {value:?}: {elem} twice",
                    name(*reader)
                ));
            }
            match writer.get(&(*key, *elem)) {
                None => {
                    return Err(format!(
                        "garbage read: {} read key {key} = {value:?}, but nobody appended {elem}",
                        name(*reader)
                    ));
                }
                Some(&w) if history[w].outcome == Outcome::Aborted => {
                    return Err(format!(
                        "dirty read (G1a): {} read key {key} = {value:?}, but {elem} was \
                         appended by {}, which aborted",
                        name(*reader),
                        name(w)
                    ));
                }
                Some(&w) if w == *reader => {
                    return Err(format!(
                        "{} read key {key} = {value:?}, including its own later append {elem}",
                        name(*reader)
                    ));
                }
                Some(_) => {}
            }
        }
    }

    // One version order per key: the longest read, of which every other read is a prefix.
    let mut order: BTreeMap<Key, &Vec<Elem>> = BTreeMap::new();
    for (_, key, value) in &reads {
        let longest = order.entry(*key).or_insert(value);
        if value.len() > longest.len() {
            *longest = value;
        }
    }
    for (reader, key, value) in &reads {
        let longest = order[key];
        if !longest.starts_with(value) {
            return Err(format!(
                "incompatible orders of key {key}: {} read {value:?}, another read {longest:?}",
                name(*reader)
            ));
        }
    }
    for list in order.values() {
        report.list_len_max = report.list_len_max.max(list.len());
    }

    // The dependency graph. Nodes 0..n are transactions; n..2n are real-time helpers.
    let n = history.len();
    let mut graph: Vec<Vec<Edge>> = vec![Vec::new(); 2 * n];
    let add_edge = |graph: &mut Vec<Vec<Edge>>, from: usize, to: usize, kind, why: String| {
        if from != to {
            graph[from].push(Edge { to, kind, why });
        }
    };
    // Committed appends per key that no read saw.
    let mut unseen: BTreeMap<Key, Vec<(usize, Elem)>> = BTreeMap::new();
    for (&(key, elem), &w) in &writer {
        if history[w].outcome != Outcome::Committed {
            continue;
        }
        let seen = order.get(&key).is_some_and(|list| list.contains(&elem));
        if !seen {
            unseen.entry(key).or_default().push((w, elem));
        }
    }
    for list in unseen.values_mut() {
        list.sort_unstable();
    }
    let writer_of = |key: Key, list: &[Elem], len: usize| -> Option<usize> {
        len.checked_sub(1).map(|i| writer[&(key, list[i])])
    };
    for (&key, list) in &order {
        for i in 1..list.len() {
            let (a, b) = (writer_of(key, list, i), writer_of(key, list, i + 1));
            let (a, b) = (a.expect("i >= 1"), b.expect("i + 1 >= 1"));
            let why = format!("key {key}: {} then {}", list[i - 1], list[i]);
            add_edge(&mut graph, a, b, EdgeKind::Ww, why);
        }
        if let (Some(last), Some(later)) = (writer_of(key, list, list.len()), unseen.get(&key)) {
            for &(w, elem) in later {
                let why = format!("key {key}: {} then unread {elem}", list[list.len() - 1]);
                add_edge(&mut graph, last, w, EdgeKind::Ww, why);
            }
        }
    }
    for (reader, key, value) in &reads {
        let list = order[key];
        if let Some(w) = writer_of(*key, list, value.len()) {
            let why = format!("key {key}: read {value:?}");
            add_edge(&mut graph, w, *reader, EdgeKind::Wr, why);
        }
        if value.len() < list.len() {
            let next = writer_of(*key, list, value.len() + 1).expect("len + 1 >= 1");
            let why = format!("key {key}: read {value:?}, missed {}", list[value.len()]);
            add_edge(&mut graph, *reader, next, EdgeKind::Rw, why);
        } else if let Some(later) = unseen.get(key) {
            for &(w, elem) in later {
                let why = format!("key {key}: read {value:?}, missed unread {elem}");
                add_edge(&mut graph, *reader, w, EdgeKind::Rw, why);
            }
        }
    }
    for edges in &graph {
        report.edges += edges.len();
        report.rw_edges += edges.iter().filter(|e| e.kind == EdgeKind::Rw).count();
    }

    // Real time: helper node n + j stands for "the j-th transaction to finish has finished";
    // it points at the next helper, and at every transaction that began after that finish.
    let mut by_end: Vec<(u64, usize)> = history
        .iter()
        .enumerate()
        .filter(|(_, t)| t.outcome == Outcome::Committed)
        .filter_map(|(i, t)| t.time.map(|(_, ended)| (ended, i)))
        .collect();
    by_end.sort_unstable();
    for (j, &(_, i)) in by_end.iter().enumerate() {
        add_edge(&mut graph, i, n + j, EdgeKind::Rt, "finished".into());
        if j + 1 < by_end.len() {
            add_edge(&mut graph, n + j, n + j + 1, EdgeKind::Rt, "then".into());
        }
    }
    for (i, t) in history.iter().enumerate() {
        let (Outcome::Committed, Some((began, _))) = (t.outcome, t.time) else {
            continue;
        };
        let before = by_end.partition_point(|&(ended, _)| ended < began);
        if before > 0 {
            add_edge(
                &mut graph,
                n + before - 1,
                i,
                EdgeKind::Rt,
                "began after".into(),
            );
        }
    }

    if let Some(cycle) = find_cycle(&graph) {
        let mut out = String::from("dependency cycle:\n");
        for (from, edge) in cycle {
            let show = |i: usize| {
                if i < n {
                    name(i).to_string()
                } else {
                    "(real time)".to_string()
                }
            };
            let _ = writeln!(
                out,
                "  {} -{:?}-> {}  [{}]",
                show(from),
                edge.kind,
                show(edge.to),
                edge.why
            );
        }
        return Err(out);
    }

    check_positions(history, &graph)?;
    check_counters(history)?;
    Ok(report)
}

/// Every dependency edge goes forward in the engine's claimed serial order, and so does
/// every real-time precedence.
fn check_positions(history: &[TxnRecord], graph: &[Vec<Edge>]) -> Result<(), String> {
    let n = history.len();
    // Split-only commits carry no dependency edges of their own (only commutative adds and
    // real time), and real time is checked below with their own rule.
    let ordered = |i: usize| {
        history[i]
            .position
            .filter(|p| !matches!(p, Position::After(_)))
    };
    for (from, edges) in graph.iter().enumerate().take(n) {
        let Some(p) = ordered(from) else {
            continue;
        };
        for edge in edges.iter().filter(|e| e.to < n) {
            let Some(q) = ordered(edge.to) else {
                continue;
            };
            if p.order() >= q.order() {
                return Err(format!(
                    "timestamp order contradicts a dependency: {} at {p:?} -{:?}-> {} at {q:?} \
                     [{}]",
                    history[from].name, edge.kind, history[edge.to].name, edge.why
                ));
            }
        }
    }
    let mut by_end: Vec<(u64, (u64, u8), usize)> = history
        .iter()
        .enumerate()
        .filter(|(_, t)| t.outcome == Outcome::Committed)
        .filter_map(|(i, t)| Some((t.time?.1, t.position?.order(), i)))
        .collect();
    by_end.sort_unstable();
    // prefix_max[j]: the latest position among the first j + 1 transactions to finish.
    let mut prefix_max: Vec<((u64, u8), usize)> = Vec::with_capacity(by_end.len());
    for &(_, order, i) in &by_end {
        let best = match prefix_max.last() {
            Some(&(o, j)) if o >= order => (o, j),
            _ => (order, i),
        };
        prefix_max.push(best);
    }
    for t in history {
        let (Outcome::Committed, Some((began, _)), Some(p)) = (t.outcome, t.time, t.position)
        else {
            continue;
        };
        let before = by_end.partition_point(|&(ended, _, _)| ended < began);
        if before > 0 {
            let (order, j) = prefix_max[before - 1];
            if order > p.order_as_later() {
                return Err(format!(
                    "not strictly serializable: {} finished before {} began, but its position \
                     {:?} is after {:?}",
                    history[j].name, t.name, history[j].position, t.position
                ));
            }
        }
    }
    Ok(())
}

/// A counter read at snapshot `r` equals the sum of the deltas committed at or below `r`,
/// plus the reader's own earlier deltas.
fn check_counters(history: &[TxnRecord]) -> Result<(), String> {
    let mut deltas: BTreeMap<Key, Vec<(u64, i64)>> = BTreeMap::new();
    for t in history.iter().filter(|t| t.outcome == Outcome::Committed) {
        for op in &t.ops {
            if let Op::Add { counter, delta } = *op {
                let Some(ts) = t.position.and_then(Position::visible_at) else {
                    return Err(format!(
                        "{} added to a counter but has no commit ts",
                        t.name
                    ));
                };
                deltas.entry(counter).or_default().push((ts, delta));
            }
        }
    }
    for t in history {
        let mut own: BTreeMap<Key, i64> = BTreeMap::new();
        for op in &t.ops {
            match *op {
                Op::Add { counter, delta } => *own.entry(counter).or_default() += delta,
                Op::CounterRead { counter, value } => {
                    let Some(read_ts) = t.read_ts else {
                        return Err(format!("{} read a counter but has no read ts", t.name));
                    };
                    let committed: i64 = deltas
                        .get(&counter)
                        .map(|d| {
                            d.iter()
                                .filter(|(ts, _)| *ts <= read_ts)
                                .map(|(_, d)| d)
                                .sum()
                        })
                        .unwrap_or(0);
                    let want = committed + own.get(&counter).copied().unwrap_or(0);
                    if value != want {
                        return Err(format!(
                            "{} read counter {counter} = {value} at ts {read_ts}, but the deltas \
                             committed by then (plus its own) sum to {want}",
                            t.name
                        ));
                    }
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// Some cycle in `graph`, as its edges, if there is one. Iterative Tarjan SCC, then a
/// breadth-first search inside the first non-trivial component.
fn find_cycle(graph: &[Vec<Edge>]) -> Option<Vec<(usize, Edge)>> {
    let n = graph.len();
    let mut index = vec![usize::MAX; n];
    let mut low = vec![0; n];
    let mut on_stack = vec![false; n];
    let mut stack = Vec::new();
    let mut next_index = 0;
    let mut component = vec![usize::MAX; n];
    let mut components = 0;
    for root in 0..n {
        if index[root] != usize::MAX {
            continue;
        }
        let mut work: Vec<(usize, usize)> = vec![(root, 0)];
        index[root] = next_index;
        low[root] = next_index;
        next_index += 1;
        stack.push(root);
        on_stack[root] = true;
        while let Some(&mut (v, ref mut child)) = work.last_mut() {
            if let Some(edge) = graph[v].get(*child) {
                *child += 1;
                let w = edge.to;
                if index[w] == usize::MAX {
                    index[w] = next_index;
                    low[w] = next_index;
                    next_index += 1;
                    stack.push(w);
                    on_stack[w] = true;
                    work.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                let mut size = 0;
                loop {
                    let w = stack.pop().expect("v is on the stack");
                    on_stack[w] = false;
                    component[w] = components;
                    size += 1;
                    if w == v {
                        break;
                    }
                }
                if size > 1 {
                    return Some(cycle_in(graph, &component, components, v));
                }
                components += 1;
            }
        }
    }
    None
}

/// A shortest cycle through `start` using only nodes of component `c`.
fn cycle_in(
    graph: &[Vec<Edge>],
    component: &[usize],
    c: usize,
    start: usize,
) -> Vec<(usize, Edge)> {
    let mut parent: HashMap<usize, (usize, Edge)> = HashMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for edge in &graph[v] {
            if component[edge.to] != c || parent.contains_key(&edge.to) {
                continue;
            }
            parent.insert(edge.to, (v, edge.clone()));
            if edge.to == start {
                let mut cycle = Vec::new();
                let mut at = start;
                loop {
                    let (from, edge) = parent[&at].clone();
                    cycle.push((from, edge));
                    at = from;
                    if at == start {
                        break;
                    }
                }
                cycle.reverse();
                return cycle;
            }
            queue.push_back(edge.to);
        }
    }
    unreachable!("a strongly connected component of two or more nodes has a cycle through each")
}

mod tests {
    //! The checker rejects each known anomaly and accepts a valid history.

    use super::*;

    fn read(key: Key, value: &[Elem]) -> Op {
        Op::Read {
            key,
            value: value.to_vec(),
        }
    }

    fn append(key: Key, elem: Elem) -> Op {
        Op::Append { key, elem }
    }

    fn range(lo: Key, hi: Key, found: &[(Key, &[Elem])]) -> Op {
        Op::Range {
            lo,
            hi,
            found: found.iter().map(|(k, v)| (*k, v.to_vec())).collect(),
        }
    }

    /// Keys 0 and 1 hold `[1]` and `[2]`, written by `init`.
    fn init() -> TxnRecord {
        TxnRecord::committed(
            "init",
            vec![read(0, &[]), append(0, 1), read(1, &[]), append(1, 2)],
        )
    }

    fn rejected(history: &[TxnRecord], expected: &str) {
        match check(history) {
            Ok(report) => panic!("accepted an anomaly ({expected}): {report:?}"),
            Err(message) => assert!(
                message.contains(expected),
                "rejected, but not for {expected:?}: {message}"
            ),
        }
    }

    #[test]
    fn accepts_a_valid_history() {
        let history = [
            init().at(Position::Commit(1)).during(0, 1),
            TxnRecord::committed("t1", vec![read(0, &[1]), append(0, 3)])
                .at(Position::Commit(3))
                .during(2, 5),
            TxnRecord::committed("t2", vec![read(1, &[2]), append(1, 4), read(1, &[2, 4])])
                .at(Position::Commit(2))
                .during(2, 4),
            TxnRecord::aborted("t3", vec![read(0, &[1]), append(0, 5)]),
            TxnRecord::committed(
                "snap",
                vec![read(0, &[1]), range(0, 9, &[(0, &[1]), (1, &[2, 4])])],
            )
            .at(Position::ReadAt(2))
            .during(3, 6),
            TxnRecord::committed(
                "t4",
                vec![
                    range(0, 9, &[(0, &[1, 3]), (1, &[2, 4])]),
                    read(2, &[]),
                    append(2, 6),
                ],
            )
            .at(Position::Commit(4))
            .during(7, 8),
            // Appended, never read: sorts after everything read.
            TxnRecord::committed("t5", vec![read(0, &[1, 3]), append(0, 7)])
                .at(Position::Commit(5))
                .during(9, 10),
        ];
        let report = check(&history).unwrap();
        assert_eq!(report.committed, 6);
        assert_eq!(report.aborted, 1);
        assert!(report.rw_edges > 0, "{report:?}");
    }

    #[test]
    fn rejects_write_skew() {
        let history = [
            init(),
            TxnRecord::committed("a", vec![read(0, &[1]), read(1, &[2]), append(0, 3)]),
            TxnRecord::committed("b", vec![read(0, &[1]), read(1, &[2]), append(1, 4)]),
            TxnRecord::committed("final", vec![read(0, &[1, 3]), read(1, &[2, 4])]),
        ];
        rejected(&history, "dependency cycle");
    }

    #[test]
    fn rejects_lost_update() {
        // Both read [1] and append; the final read shows only one of them. Even without the
        // final read, the unread append sorts last and closes the cycle.
        let a = TxnRecord::committed("a", vec![read(0, &[1]), append(0, 3)]);
        let b = TxnRecord::committed("b", vec![read(0, &[1]), append(0, 4)]);
        rejected(&[init(), a.clone(), b.clone()], "dependency cycle");
        let last = TxnRecord::committed("final", vec![read(0, &[1, 3])]);
        rejected(&[init(), a, b, last], "dependency cycle");
    }

    #[test]
    fn rejects_read_skew() {
        let history = [
            init(),
            TxnRecord::committed("reader", vec![read(0, &[1]), read(1, &[2, 4])]),
            TxnRecord::committed(
                "writer",
                vec![read(0, &[1]), append(0, 3), read(1, &[2]), append(1, 4)],
            ),
        ];
        rejected(&history, "dependency cycle");
    }

    #[test]
    fn rejects_dirty_and_garbage_reads() {
        let aborted = TxnRecord::aborted("aborted", vec![read(0, &[1]), append(0, 5)]);
        let dirty = TxnRecord::committed("reader", vec![read(0, &[1, 5])]);
        rejected(&[init(), aborted.clone(), dirty], "dirty read");
        let in_range =
            TxnRecord::committed("scanner", vec![range(0, 3, &[(0, &[1, 5]), (1, &[2])])]);
        rejected(&[init(), aborted, in_range], "dirty read");
        let garbage = TxnRecord::committed("reader", vec![read(1, &[2, 99])]);
        rejected(&[init(), garbage], "garbage read");
    }

    #[test]
    fn rejects_incompatible_orders() {
        let history = [
            init(),
            TxnRecord::committed("a", vec![read(0, &[1]), append(0, 3)]),
            TxnRecord::committed("b", vec![read(0, &[1, 3]), append(0, 4)]),
            TxnRecord::committed("x", vec![read(0, &[1, 3, 4])]),
            TxnRecord::committed("y", vec![read(0, &[1, 4, 3])]),
        ];
        rejected(&history, "incompatible orders");
    }

    #[test]
    fn rejects_a_phantom() {
        // Each scans keys 0..=9, sees only key 0, and inserts a key the other's scan missed:
        // write skew through a predicate.
        let history = [
            init(),
            TxnRecord::committed(
                "a",
                vec![
                    range(0, 9, &[(0, &[1]), (1, &[2])]),
                    read(5, &[]),
                    append(5, 10),
                ],
            ),
            TxnRecord::committed(
                "b",
                vec![
                    range(0, 9, &[(0, &[1]), (1, &[2])]),
                    read(6, &[]),
                    append(6, 11),
                ],
            ),
            TxnRecord::committed(
                "final",
                vec![range(0, 9, &[(0, &[1]), (1, &[2]), (5, &[10]), (6, &[11])])],
            ),
        ];
        rejected(&history, "dependency cycle");
        // Scanning only the part that excludes the other's insert is fine.
        let fine = [
            init(),
            TxnRecord::committed(
                "a",
                vec![
                    range(0, 4, &[(0, &[1]), (1, &[2])]),
                    read(5, &[]),
                    append(5, 10),
                ],
            ),
            TxnRecord::committed("b", vec![range(6, 9, &[]), read(6, &[]), append(6, 11)]),
        ];
        check(&fine).unwrap();
    }

    #[test]
    fn rejects_a_stale_read_in_real_time() {
        // Serializable (the reader could go first) but not strictly: it began after the
        // writer finished and still missed its insert.
        let history = [
            init().during(0, 1),
            TxnRecord::committed("writer", vec![read(3, &[]), append(3, 7)]).during(2, 3),
            TxnRecord::committed("reader", vec![range(0, 9, &[(0, &[1]), (1, &[2])])]).during(4, 5),
        ];
        rejected(&history, "dependency cycle");
        let mut relaxed = history.clone();
        relaxed[2].time = None;
        check(&relaxed).unwrap();
    }

    #[test]
    fn rejects_timestamps_that_contradict_dependencies() {
        // Serializable, but the engine's timestamps put the reader before the write it saw.
        let history = [
            init().at(Position::Commit(1)),
            TxnRecord::committed("writer", vec![read(0, &[1]), append(0, 3)])
                .at(Position::Commit(5)),
            TxnRecord::committed("reader", vec![read(0, &[1, 3])]).at(Position::ReadAt(4)),
        ];
        rejected(&history, "timestamp order contradicts");
        // And a snapshot at 5 sits after the commit at 5.
        let mut fixed = history.clone();
        fixed[2].position = Some(Position::ReadAt(5));
        check(&fixed).unwrap();
        // Real time against timestamps: finished first, yet later in timestamp order.
        let history = [
            TxnRecord::committed("first", vec![read(0, &[]), append(0, 1)])
                .at(Position::Commit(9))
                .during(0, 1),
            TxnRecord::committed("second", vec![read(1, &[]), append(1, 2)])
                .at(Position::Commit(3))
                .during(2, 3),
        ];
        rejected(&history, "not strictly serializable");
    }

    #[test]
    fn checks_counters_against_committed_deltas() {
        let add = |delta| Op::Add { counter: 0, delta };
        let counter_read = |value| Op::CounterRead { counter: 0, value };
        let adder = |name: &str, ts, delta| {
            TxnRecord::committed(name, vec![add(delta)]).at(Position::Commit(ts))
        };
        let reader = |ts, value| {
            let mut t = TxnRecord::committed("reader", vec![counter_read(value)]);
            t.read_ts = Some(ts);
            t
        };
        let lost = TxnRecord::aborted("lost", vec![add(100)]);
        let good = [
            adder("a", 1, 5),
            adder("b", 2, 7),
            lost.clone(),
            reader(1, 5),
            reader(2, 12),
        ];
        check(&good).unwrap();
        let bad = [adder("a", 1, 5), adder("b", 2, 7), lost, reader(2, 5)];
        rejected(&bad, "sum to 12");
    }
}

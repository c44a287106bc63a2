//! Crash loop with a serializability check: a child process runs concurrent list-append
//! transactions with `sync` durability and reports each one, the parent kills it with SIGKILL
//! at a random moment, reopens the database and reads every list. Over all cycles:
//!
//! - every acknowledged commit is in the recovered state (nothing acknowledged is lost);
//! - a transaction cut off by the kill is all there or not at all (no partial transaction);
//! - the whole history, across restarts, is accepted by the serializability checker of the
//!   engine tests (`it/history.rs`): dependency-graph cycles, dirty or garbage reads, reads
//!   that no version order explains, and commit timestamps that contradict dependencies,
//!   which also catches timestamps going backwards across a restart.
//!
//! `KEEL_CRASH_CYCLES` sets the number of cycles (default 50, as the durability issue asks
//! of CI); a long mode runs thousands.

#[path = "it/history.rs"]
#[allow(
    dead_code,
    reason = "the checker's other helpers serve the engine tests"
)]
mod history;

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};

use history::{
    Elem, Key, Op, Outcome, Position, TxnRecord, check, decode_list, list_key, read_then_append,
};
use keel::{Db, Options};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// List keys `k00..k07`: few, so that transactions contend.
const KEYS: Key = 8;
const THREADS: u64 = 4;

/// The child's report lines: `I name ops` before a commit (its operations), then `C name ts`
/// once it is acknowledged or `X name` once it lost a conflict. `ops` is `;`-separated:
/// `r key e1,e2,..` (a read) or `a key elem` (an append).
fn format_ops(ops: &[Op]) -> String {
    let parts: Vec<String> = ops
        .iter()
        .map(|op| match op {
            Op::Read { key, value } => {
                let elems: Vec<String> = value.iter().map(u64::to_string).collect();
                format!("r {key} {}", elems.join(","))
            }
            Op::Append { key, elem } => format!("a {key} {elem}"),
            other => unreachable!("the crash workload does not use {other:?}"),
        })
        .collect();
    parts.join(";")
}

fn parse_ops(text: &str) -> Vec<Op> {
    text.split(';')
        .map(|part| {
            let mut words = part.split(' ');
            let kind = words.next().expect("kind");
            let key: Key = words.next().expect("key").parse().expect("key number");
            let rest = words.next().unwrap_or("");
            match kind {
                "r" => Op::Read {
                    key,
                    value: rest
                        .split(',')
                        .filter(|e| !e.is_empty())
                        .map(|e| e.parse().expect("element"))
                        .collect(),
                },
                "a" => Op::Append {
                    key,
                    elem: rest.parse().expect("element"),
                },
                other => panic!("unknown op kind {other}"),
            }
        })
        .collect()
}

/// The child: `THREADS` threads of read/append transactions, forever, each reported.
fn child(dir: &Path, cycle: u64) {
    // Tiny segments and checkpoints: kills often land in a segment switch or a checkpoint.
    let db = Db::open(
        dir,
        Options::default()
            .segment_bytes(4 << 10)
            .checkpoint_log_bytes(32 << 10),
    )
    .unwrap();
    std::thread::scope(|s| {
        for thread in 0..THREADS {
            let db = &db;
            s.spawn(move || {
                let mut rng = StdRng::seed_from_u64(cycle * 1_000 + thread);
                // Unique across the whole history: cycle, thread, counter.
                let mut next_elem = (cycle << 40) | (thread << 32);
                for n in 0u64.. {
                    let name = format!("c{cycle}.t{thread}.{n}");
                    let mut txn = db.begin().unwrap();
                    let mut ops = Vec::new();
                    let mut appended = Vec::new();
                    for _ in 0..rng.random_range(1..=3) {
                        let k = rng.random_range(0..KEYS);
                        let append = rng.random_bool(0.6);
                        read_then_append(
                            &mut txn,
                            k,
                            append,
                            &mut next_elem,
                            &mut ops,
                            &mut appended,
                        );
                    }
                    let intent = format!("I {name} {}\n", format_ops(&ops));
                    std::io::stdout()
                        .lock()
                        .write_all(intent.as_bytes())
                        .unwrap();
                    let line = match txn.commit().unwrap() {
                        Ok(ts) => format!("C {name} {}\n", ts.0),
                        Err(_) => format!("X {name}\n"),
                    };
                    std::io::stdout().lock().write_all(line.as_bytes()).unwrap();
                }
            });
        }
    });
}

/// What the parent knows of one child transaction.
struct Reported {
    ops: Vec<Op>,
    /// `Some(Some(ts))` acknowledged, `Some(None)` lost a conflict, `None` cut off.
    end: Option<Option<u64>>,
}

#[test]
fn crash_loop_histories_stay_serializable() {
    if let (Ok(dir), Ok(cycle)) = (
        std::env::var("KEEL_CRASH_HISTORY_DIR"),
        std::env::var("KEEL_CRASH_HISTORY_CYCLE"),
    ) {
        child(Path::new(&dir), cycle.parse().unwrap());
        return;
    }
    let cycles: u64 = std::env::var("KEEL_CRASH_CYCLES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(50);
    let dir = std::env::temp_dir().join(format!("keel-crash-history-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut rng = StdRng::seed_from_u64(0x5eed);
    let mut history: Vec<TxnRecord> = Vec::new();
    let mut cut_off = 0;
    for cycle in 0..cycles {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "crash_loop_histories_stay_serializable",
                "--nocapture",
            ])
            .env("KEEL_CRASH_HISTORY_DIR", &dir)
            .env("KEEL_CRASH_HISTORY_CYCLE", cycle.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let acks_before_kill = rng.random_range(1..=150);
        let mut reported: HashMap<String, Reported> = HashMap::new();
        let mut order: Vec<String> = Vec::new();
        let mut acks = 0;
        let mut note = |line: &str, reported: &mut HashMap<String, Reported>| -> bool {
            let mut words = line.splitn(3, ' ');
            let (Some(kind), Some(name)) = (words.next(), words.next()) else {
                return false;
            };
            match kind {
                "I" => {
                    let ops = parse_ops(words.next().expect("ops"));
                    order.push(name.to_string());
                    reported.insert(name.to_string(), Reported { ops, end: None });
                    false
                }
                "C" => {
                    let ts = words.next().expect("ts").parse().expect("ts number");
                    reported.get_mut(name).expect("intent first").end = Some(Some(ts));
                    true
                }
                "X" => {
                    reported.get_mut(name).expect("intent first").end = Some(None);
                    false
                }
                // The test harness prints its own lines.
                _ => false,
            }
        };
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        while acks < acks_before_kill {
            let Some(Ok(line)) = lines.next() else { break };
            if note(&line, &mut reported) {
                acks += 1;
            }
        }
        child.kill().unwrap();
        // What the child printed after our last read happened before the kill too.
        for line in lines.map_while(Result::ok) {
            note(&line, &mut reported);
        }
        child.wait().unwrap();

        let db = Db::open(&dir, Options::default())
            .unwrap_or_else(|e| panic!("cycle {cycle}: reopening after the kill: {e}"));
        let snapshot = db.snapshot().unwrap();
        let read_ts = snapshot.read_ts().0;
        let lists: Vec<Vec<Elem>> = (0..KEYS)
            .map(|k| decode_list(snapshot.get(&list_key(k)).unwrap().as_deref()))
            .collect();
        drop(snapshot);
        db.close().unwrap();
        let visible: HashSet<(Key, Elem)> = lists
            .iter()
            .enumerate()
            .flat_map(|(k, l)| l.iter().map(move |&e| (k as Key, e)))
            .collect();

        for name in order {
            let t = reported.remove(&name).expect("reported");
            let appends: Vec<(Key, Elem)> = t
                .ops
                .iter()
                .filter_map(|op| match op {
                    Op::Append { key, elem } => Some((*key, *elem)),
                    _ => None,
                })
                .collect();
            let shown = appends.iter().filter(|a| visible.contains(a)).count();
            let (outcome, position) = match t.end {
                Some(Some(ts)) => {
                    assert_eq!(
                        shown,
                        appends.len(),
                        "cycle {cycle}: acknowledged {name} lost appends"
                    );
                    let position = if appends.is_empty() {
                        Position::ReadAt(ts)
                    } else {
                        Position::Commit(ts)
                    };
                    (Outcome::Committed, Some(position))
                }
                Some(None) => {
                    assert_eq!(shown, 0, "cycle {cycle}: aborted {name} is visible");
                    (Outcome::Aborted, None)
                }
                None => {
                    cut_off += 1;
                    assert!(
                        shown == 0 || shown == appends.len(),
                        "cycle {cycle}: {name}, cut off by the kill, is partly visible"
                    );
                    // Cut off before its commit returned: committed exactly if its appends
                    // survived. One that only read changed nothing either way.
                    if shown > 0 {
                        (Outcome::Committed, None)
                    } else {
                        (Outcome::Aborted, None)
                    }
                }
            };
            history.push(TxnRecord {
                name,
                ops: t.ops,
                outcome,
                position,
                read_ts: None,
                time: None,
            });
        }
        history.push(TxnRecord {
            name: format!("recovered-{cycle}"),
            ops: lists
                .into_iter()
                .enumerate()
                .map(|(k, value)| Op::Read {
                    key: k as Key,
                    value,
                })
                .collect(),
            outcome: Outcome::Committed,
            position: Some(Position::ReadAt(read_ts)),
            read_ts: Some(read_ts),
            time: None,
        });
    }
    std::fs::remove_dir_all(&dir).unwrap();
    let report = check(&history).unwrap_or_else(|e| panic!("not serializable: {e}"));
    assert!(report.committed > 10 * cycles as usize, "{report:?}");
    assert!(
        report.rw_edges > 0,
        "no anti-dependency was observed: {report:?}"
    );
    eprintln!("{report:?}; {cut_off} transactions cut off by a kill");
}

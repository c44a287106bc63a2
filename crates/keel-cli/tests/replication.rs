//! A replicated cluster of real processes: five `keel serve --replicas 3` nodes on loopback
//! (every partition on three of them, kept by Raft). Clients run Elle list-append
//! transactions (`MULTI` with `GET`s and `APPEND`s of unique elements, on keys of one
//! partition or of two: two-phase commit over the partitions' logs) and bank transfers and
//! audits across partitions against random nodes while a partition's leader is killed with
//! SIGKILL and restarted, and another leader is stopped with SIGSTOP past the election timeout
//! and resumed. Afterwards every acknowledged append is present, the history (with real-time
//! order) is strictly serializable, every audit saw the bank's total, and the cluster kept
//! committing through the faults.

#[path = "../../keel/tests/it/history.rs"]
#[allow(dead_code)]
mod history;
#[allow(dead_code)]
mod support;

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use std::net::SocketAddr;

use history::{Op, Outcome, TxnRecord};
use support::{Node, StopOnDrop, connect, connect_addr};

const NODES: usize = 5;
const KEYS_PER_PARTITION: usize = 3;
/// Bank accounts per partition, and each one's opening balance.
const ACCOUNTS_PER_PARTITION: usize = 2;
const OPENING: i64 = 100;

/// Keys of each partition: `[partition][i]`.
fn keys_by_partition(addr: SocketAddr) -> Vec<Vec<String>> {
    let mut c = connect_addr(addr).expect("connect");
    support::keys_per_node(&mut c, NODES, KEYS_PER_PARTITION, "list")
}

/// The node leading the partition that holds slot `slot`, per `CLUSTER SLOTS` on `port`.
fn leader_of(addr: SocketAddr, slot: u16) -> Option<usize> {
    let mut c = connect_addr(addr).ok()?;
    let slots: Vec<redis::Value> = redis::cmd("CLUSTER").arg("SLOTS").query(&mut c).ok()?;
    for range in slots {
        let redis::Value::Array(items) = range else {
            continue;
        };
        let (Some(redis::Value::Int(s)), Some(redis::Value::Int(e))) =
            (items.first(), items.get(1))
        else {
            continue;
        };
        if (*s..=*e).contains(&i64::from(slot))
            && let Some(redis::Value::Array(master)) = items.get(2)
            && let Some(redis::Value::BulkString(id)) = master.get(2)
        {
            let id = String::from_utf8_lossy(id);
            return id.strip_prefix('n')?.parse::<usize>().ok().map(|i| i - 1);
        }
    }
    None
}

/// How a transaction's request ended, as the client saw it.
enum Seen {
    Committed(Vec<Op>),
    /// Refused before it could apply (no leader reachable): nothing of it happened.
    Refused,
    /// No answer, or an answer that says the outcome is unknown (what the client saw).
    Unknown(String),
}

/// One `GET`/`APPEND` transaction on keys of one partition.
fn transact(c: &mut redis::Connection, plan: &[(u32, String, Option<u64>)]) -> Seen {
    let mut pipe = redis::pipe();
    pipe.cmd("MULTI").ignore();
    for (_, key, append) in plan {
        pipe.cmd("GET").arg(key).ignore();
        if let Some(e) = append {
            pipe.cmd("APPEND").arg(key).arg(format!(" {e}")).ignore();
        }
    }
    if let Err(e) = pipe.query::<()>(c) {
        // Nothing was sent to EXEC: the transaction never ran.
        return if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() {
            Seen::Unknown(format!("queueing: {e}"))
        } else {
            panic!("MULTI and queueing failed: {e}")
        };
    }
    match redis::cmd("EXEC").query::<Vec<redis::Value>>(c) {
        Ok(values) => {
            let mut values = values.into_iter();
            let mut ops = Vec::new();
            for (key, _, append) in plan {
                let read: Option<String> =
                    redis::from_redis_value(values.next().expect("a GET reply")).expect("a string");
                let value = read
                    .unwrap_or_default()
                    .split_whitespace()
                    .map(|e| e.parse().expect("a number"))
                    .collect();
                ops.push(Op::Read { key: *key, value });
                if let Some(e) = append {
                    values.next().expect("an APPEND reply");
                    ops.push(Op::Append {
                        key: *key,
                        elem: *e,
                    });
                }
            }
            Seen::Committed(ops)
        }
        Err(e) if e.code() == Some("CLUSTERDOWN") => Seen::Refused,
        Err(e) if e.code() == Some("TRYAGAIN") => Seen::Unknown(e.to_string()),
        Err(e) if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() => {
            Seen::Unknown(e.to_string())
        }
        Err(e) => panic!("a transaction failed: {e}"),
    }
}

/// What [`elle_under_faults`] gives its fault schedule.
struct Cluster<'a> {
    /// Each node's client address.
    addrs: &'a [SocketAddr],
    /// Keys of each partition.
    keys: &'a [Vec<String>],
    /// When the workload started: commit times count from here.
    epoch: Instant,
    /// Nodes the clients do not pick (a bit per node): those a partition put out of their
    /// reach, as a client that knows which nodes answer would.
    avoid: &'a AtomicU64,
    /// When each acknowledged commit ended, in ns since `epoch`.
    commits_at: &'a Mutex<Vec<u64>>,
}

impl Cluster<'_> {
    /// Waits until a client's commit ended after `since` (ns since `epoch`), for at most
    /// `limit`: a fault that must see the cluster commit lasts until it did, however slowly
    /// a loaded machine gets there, and the caller's check fails if it never does.
    fn wait_commit_after(&self, since: u64, limit: Duration) {
        let started = Instant::now();
        while started.elapsed() < limit
            && !self.commits_at.lock().unwrap().iter().any(|&t| t > since)
        {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The slot of `key`.
    fn slot(&self, key: &str) -> u16 {
        let mut c = connect_addr(self.addrs[0]).expect("connect");
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query::<u16>(&mut c)
            .expect("keyslot")
    }
}

/// How long the load may go on after the faults to reach its floors (commits, transfers,
/// audits) before the test fails as stalled.
const FLOORS_WAIT: Duration = Duration::from_secs(120);

/// Elle list-append transactions (`MULTI` of `GET`s and `APPEND`s on keys of one partition)
/// from four clients to random nodes while `faults` runs, and on until more than
/// `commits_min` were acknowledged and the bank made 5 transfers and 2 audits (a loaded
/// machine fits less into the faults' time; a cluster that stopped committing fails after
/// [`FLOORS_WAIT`]); then final reads of every key through any node that answers, and the
/// checks: no duplicate, every acknowledged append present, a transaction of unknown outcome
/// all-or-nothing, the history strictly serializable. Returns the report and the times (ns
/// since the start) of the commits, and `faults`' result.
fn elle_under_faults<T>(
    addrs: &[SocketAddr],
    commits_min: usize,
    faults: impl FnOnce(&Cluster<'_>) -> T,
) -> (history::Report, Vec<u64>, T) {
    let nodes_n = addrs.len();
    let keys = keys_by_partition(addrs[0]);
    let key_index: HashMap<&str, u32> = keys
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, k)| (k.as_str(), i as u32))
        .collect();
    // Every partition elects a leader and takes a write.
    for part in &keys {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ok = connect_addr(addrs[0])
                .and_then(|mut c| redis::cmd("EXISTS").arg(&part[0]).query::<i64>(&mut c));
            match ok {
                Ok(_) => break,
                Err(e) if Instant::now() > deadline => {
                    panic!("no leader for {} within 20 s: {e}", part[0])
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }
    let accounts = open_accounts(addrs[0]);
    let bank = Bank::default();
    let epoch = Instant::now();
    let records = Mutex::new(Vec::new());
    let unknown = Mutex::new(Vec::new());
    let next_elem = AtomicU64::new(1);
    let stop = AtomicBool::new(false);
    let avoid = AtomicU64::new(0);
    let commits_at = Mutex::new(Vec::new());
    let result = std::thread::scope(|s| {
        for worker in 0..4u64 {
            let (addrs, keys, key_index) = (addrs, &keys, &key_index);
            let (records, unknown, next_elem, stop, commits_at, avoid) =
                (&records, &unknown, &next_elem, &stop, &commits_at, &avoid);
            s.spawn(move || {
                let mut rng = (worker + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                let mut next = move || {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng
                };
                let mut conns: Vec<Option<redis::Connection>> =
                    addrs.iter().map(|_| None).collect();
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    let first = (next() % keys.len() as u64) as usize;
                    let part = &keys[first];
                    let mut chosen: Vec<&String> = (0..1 + next() % 2)
                        .map(|_| &part[(next() % KEYS_PER_PARTITION as u64) as usize])
                        .collect();
                    // One transaction in three also touches another partition.
                    if next() % 3 == 0 {
                        let other =
                            (first + 1 + (next() % (keys.len() as u64 - 1)) as usize) % keys.len();
                        chosen.push(&keys[other][(next() % KEYS_PER_PARTITION as u64) as usize]);
                    }
                    chosen.sort_unstable();
                    chosen.dedup();
                    let plan: Vec<(u32, String, Option<u64>)> = chosen
                        .into_iter()
                        .map(|k| {
                            let append = next() % 4 != 0;
                            (
                                key_index[k.as_str()],
                                k.clone(),
                                append.then(|| next_elem.fetch_add(1, Ordering::Relaxed)),
                            )
                        })
                        .collect();
                    let mut node = (next() % nodes_n as u64) as usize;
                    let avoided = avoid.load(Ordering::Relaxed);
                    if avoided.count_ones() < nodes_n as u32 {
                        while avoided & (1 << node) != 0 {
                            node = (node + 1) % nodes_n;
                        }
                    }
                    if conns[node].is_none() {
                        // A request to a node a partition cut off fails within 2 s (its
                        // outcome unknown) rather than holding the worker.
                        conns[node] = connect_addr(addrs[node])
                            .ok()
                            .filter(|c| c.set_read_timeout(Some(Duration::from_secs(2))).is_ok());
                    }
                    let Some(c) = conns[node].as_mut() else {
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    };
                    let began = epoch.elapsed().as_nanos() as u64;
                    let seen = transact(c, &plan);
                    let ended = epoch.elapsed().as_nanos() as u64;
                    let appends: Vec<Op> = plan
                        .iter()
                        .filter_map(|&(key, _, e)| e.map(|elem| Op::Append { key, elem }))
                        .collect();
                    let name = format!("w{worker}.{n}");
                    n += 1;
                    match seen {
                        Seen::Committed(ops) => {
                            commits_at.lock().unwrap().push(ended);
                            records.lock().unwrap().push(TxnRecord {
                                name,
                                ops,
                                outcome: Outcome::Committed,
                                position: None,
                                read_ts: None,
                                time: Some((began, ended)),
                            });
                        }
                        Seen::Refused => records.lock().unwrap().push(TxnRecord {
                            name,
                            ops: appends,
                            outcome: Outcome::Aborted,
                            position: None,
                            read_ts: None,
                            time: Some((began, ended)),
                        }),
                        Seen::Unknown(why) => {
                            conns[node] = None;
                            let why = format!(
                                "{why} (from n{} at {:.3}-{:.3} s, keys {:?})",
                                node + 1,
                                began as f64 / 1e9,
                                ended as f64 / 1e9,
                                plan.iter()
                                    .map(|(k, name, _)| (*k, name))
                                    .collect::<Vec<_>>()
                            );
                            unknown.lock().unwrap().push((name, appends, began, why));
                            std::thread::sleep(Duration::from_millis(20));
                        }
                    }
                }
            });
        }
        for worker in 0..2u64 {
            let (addrs, accounts, stop, bank) = (addrs, &accounts, &stop, &bank);
            s.spawn(move || bank_worker(worker, addrs, accounts, stop, bank));
        }
        // The faults. The load stops however this closure ends.
        let _stop = StopOnDrop(&stop);
        let result = faults(&Cluster {
            addrs,
            keys: &keys,
            epoch,
            avoid: &avoid,
            commits_at: &commits_at,
        });
        let faults_ended = Instant::now();
        loop {
            let commits = commits_at.lock().unwrap().len();
            let (transfers, audits) = {
                let book = bank.0.lock().unwrap();
                (book.transfers, book.audits)
            };
            if commits > commits_min && transfers >= 5 && audits >= 2 {
                break;
            }
            assert!(
                faults_ended.elapsed() < FLOORS_WAIT,
                "progress stalled: {commits} commits, {transfers} transfers, {audits} audits \
                 {FLOORS_WAIT:?} after the faults"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        result
    });

    // Final reads of every key, after everything (real time), on any node.
    let final_began = epoch.elapsed().as_nanos() as u64;
    let mut finals: HashMap<u32, Vec<u64>> = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    for (key, &k) in &key_index {
        // Each failed attempt tries the next node (one may be down for good).
        for attempt in 0.. {
            let read = connect_addr(addrs[(k as usize + attempt) % nodes_n])
                .and_then(|mut c| redis::cmd("GET").arg(*key).query::<Option<String>>(&mut c));
            match read {
                Ok(v) => {
                    let list = v
                        .unwrap_or_default()
                        .split_whitespace()
                        .map(|e| e.parse().expect("a number"))
                        .collect();
                    finals.insert(k, list);
                    break;
                }
                Err(e) if Instant::now() > deadline => panic!("no final read within 20 s: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }
    let final_ended = epoch.elapsed().as_nanos() as u64;

    let mut history = records.into_inner().unwrap();
    let unknown = unknown.into_inner().unwrap();
    // No duplicates (an append applied twice), and every acknowledged append is there.
    for (k, list) in &finals {
        let mut seen = HashSet::new();
        if let Some(twice) = list.iter().find(|&e| !seen.insert(e)) {
            // Who appended it, and what its client saw.
            let appended = |ops: &[Op]| {
                ops.iter()
                    .any(|op| matches!(op, Op::Append { key, elem } if key == k && elem == twice))
            };
            let by: Vec<String> = history
                .iter()
                .filter(|t| appended(&t.ops))
                .map(|t| format!("{} {:?} at {:?}", t.name, t.outcome, t.time))
                .chain(
                    unknown
                        .iter()
                        .filter(|u| appended(&u.1))
                        .map(|u| format!("{} unknown: {}", u.0, u.3)),
                )
                .collect();
            panic!("key {k} holds element {twice} twice ({by:?}): {list:?}");
        }
    }
    let present: HashSet<(u32, u64)> = finals
        .iter()
        .flat_map(|(&k, list)| list.iter().map(move |&e| (k, e)))
        .collect();
    let mut acknowledged = 0;
    for t in history.iter().filter(|t| t.outcome == Outcome::Committed) {
        for op in &t.ops {
            if let Op::Append { key, elem } = op {
                acknowledged += 1;
                assert!(
                    present.contains(&(*key, *elem)),
                    "{}: acknowledged append of {elem} to key {key} is lost",
                    t.name
                );
            }
        }
    }
    // An unknown outcome committed if any of its appends shows (then all must), at some
    // time after it began.
    let unknown_count = unknown.len();
    for (name, appends, began, why) in unknown {
        let record =
            TxnRecord::resolve_unknown(name, appends, began, |k, e| present.contains(&(k, e)));
        history.push(record.unwrap_or_else(|e| panic!("{e}; its client saw: {why}")));
    }
    for (&key, list) in &finals {
        history.push(TxnRecord {
            name: format!("final.{key}"),
            ops: vec![Op::Read {
                key,
                value: list.clone(),
            }],
            outcome: Outcome::Committed,
            position: None,
            read_ts: None,
            time: Some((final_began, final_ended)),
        });
    }
    let report = history::check(&history).unwrap_or_else(|e| panic!("{e}"));
    println!("{report:?}; {acknowledged} acknowledged appends, {unknown_count} unknown outcomes");
    let total = audit(addrs, &accounts).expect("a final audit within 20 s");
    let bank = bank.0.into_inner().unwrap();
    println!(
        "bank: {} transfers across partitions acknowledged, {} audits, {} unknown outcomes",
        bank.transfers, bank.audits, bank.unknown
    );
    assert!(
        bank.wrong.is_empty(),
        "audits saw the wrong total: {:?}",
        bank.wrong
    );
    assert_eq!(
        total,
        OPENING * accounts.len() as i64,
        "the bank's total changed"
    );
    assert!(bank.transfers >= 5, "too few transfers: {bank:?}");
    assert!(bank.audits >= 2, "too few audits: {bank:?}");
    (report, commits_at.into_inner().unwrap(), result)
}

/// Bank accounts, `ACCOUNTS_PER_PARTITION` on each partition, opened with `OPENING` each.
fn open_accounts(addr: SocketAddr) -> Vec<String> {
    let mut c = connect_addr(addr).expect("connect");
    let accounts: Vec<String> =
        support::keys_per_node(&mut c, NODES, ACCOUNTS_PER_PARTITION, "acct")
            .into_iter()
            .flatten()
            .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    for a in &accounts {
        while redis::cmd("SET")
            .arg(a)
            .arg(OPENING)
            .query::<String>(&mut c)
            .is_err()
        {
            assert!(Instant::now() < deadline, "opening {a} took over 20 s");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    accounts
}

#[derive(Debug, Default)]
struct BankBook {
    transfers: u64,
    audits: u64,
    unknown: u64,
    /// Totals that audits saw and should not have.
    wrong: Vec<i64>,
}

#[derive(Default)]
struct Bank(Mutex<BankBook>);

/// `MULTI`, `commands`, `EXEC`: `EXEC`'s reply (an error of `EXEC` as an error, which an
/// atomic pipeline of redis-rs does not give).
fn exec(c: &mut redis::Connection, commands: &[redis::Cmd]) -> redis::RedisResult<redis::Value> {
    let mut pipe = redis::pipe();
    pipe.cmd("MULTI").ignore();
    for command in commands {
        pipe.add_command(command.clone()).ignore();
    }
    pipe.query::<()>(c)?;
    redis::cmd("EXEC").query(c)
}

/// Reads every account in one transaction (across every partition): the total.
fn audit_on(c: &mut redis::Connection, accounts: &[String]) -> redis::RedisResult<i64> {
    let gets: Vec<redis::Cmd> = accounts
        .iter()
        .map(|a| redis::cmd("GET").arg(a).clone())
        .collect();
    let balances: Vec<i64> = redis::from_redis_value(exec(c, &gets)?)?;
    Ok(balances.iter().sum())
}

/// An audit through any node that answers, within 20 s.
fn audit(addrs: &[SocketAddr], accounts: &[String]) -> Option<i64> {
    let deadline = Instant::now() + Duration::from_secs(20);
    for node in (0..addrs.len()).cycle() {
        if let Ok(total) = connect_addr(addrs[node]).and_then(|mut c| audit_on(&mut c, accounts)) {
            return Some(total);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

/// Transfers between accounts of different partitions (`MULTI`, `DECRBY`, `INCRBY`,
/// `EXEC`), and now and then an audit, through random nodes until `stop`.
fn bank_worker(
    worker: u64,
    addrs: &[SocketAddr],
    accounts: &[String],
    stop: &AtomicBool,
    bank: &Bank,
) {
    let mut rng = (worker + 101).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let per = ACCOUNTS_PER_PARTITION as u64;
    let n = accounts.len() as u64;
    while !stop.load(Ordering::Relaxed) {
        let node = (next() % addrs.len() as u64) as usize;
        let Ok(mut c) = connect_addr(addrs[node]) else {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        };
        if c.set_read_timeout(Some(Duration::from_secs(2))).is_err() {
            continue;
        }
        for _ in 0..20 {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            if next() % 5 == 0 {
                match audit_on(&mut c, accounts) {
                    Ok(total) => {
                        let mut book = bank.0.lock().unwrap();
                        book.audits += 1;
                        if total != OPENING * accounts.len() as i64 {
                            book.wrong.push(total);
                        }
                    }
                    Err(e) if e.code().is_some() => {}
                    Err(_) => break,
                }
                continue;
            }
            // Accounts of two different partitions (accounts are grouped by partition).
            let from = next() % n;
            let to = (from / per * per + per + next() % (n - per)) % n;
            let amount = 1 + next() % 10;
            let transfer = [
                redis::cmd("DECRBY")
                    .arg(&accounts[from as usize])
                    .arg(amount)
                    .clone(),
                redis::cmd("INCRBY")
                    .arg(&accounts[to as usize])
                    .arg(amount)
                    .clone(),
            ];
            match exec(&mut c, &transfer) {
                Ok(redis::Value::Array(v)) if v.len() == 2 => {
                    bank.0.lock().unwrap().transfers += 1;
                }
                Ok(other) => panic!("a transfer answered {other:?}"),
                Err(e) if e.code() == Some("CLUSTERDOWN") => {}
                Err(e) if e.code() == Some("TRYAGAIN") => bank.0.lock().unwrap().unknown += 1,
                Err(e) if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() => {
                    bank.0.lock().unwrap().unknown += 1;
                    break;
                }
                Err(e) => panic!("a transfer failed: {e}"),
            }
        }
    }
}

#[test]
fn replicated_cluster_loses_nothing_acknowledged_through_sigkill_and_sigstop() {
    let dir = support::TestDir::new();
    let ports = support::ports(0, NODES);
    let addrs: Vec<SocketAddr> = ports
        .iter()
        .map(|&p| SocketAddr::from(([127, 0, 0, 1], p)))
        .collect();
    let mut nodes: Vec<Node> = (0..NODES)
        .map(|i| Node::start_with(dir.path(), i, &ports, &["--replicas", "3"]))
        .collect();
    let (report, commits, failover) = elle_under_faults(&addrs, 100, |cluster| {
        std::thread::sleep(Duration::from_millis(1500));
        // SIGKILL the leader of the partition of the first key, then time the first commit
        // on that partition through another node.
        let probe_key = &cluster.keys[0][0];
        let slot = cluster.slot(probe_key);
        let victim = leader_of(addrs[1], slot).expect("partition 0 has a leader");
        nodes[victim].kill_9();
        let killed = Instant::now();
        let via = (victim + 1) % NODES;
        let failover = loop {
            let wrote = connect(ports[via]).and_then(|mut c| {
                redis::cmd("SET")
                    .arg(format!("{probe_key}-probe"))
                    .arg(1)
                    .query::<String>(&mut c)
            });
            if wrote.is_ok() {
                break killed.elapsed();
            }
            assert!(
                killed.elapsed() < Duration::from_secs(20),
                "no commit on the partition 20 s after its leader was killed: {wrote:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        let recovered = cluster.epoch.elapsed().as_nanos() as u64;
        std::thread::sleep(Duration::from_millis(1000));
        // Down until the clients committed without it (checked below), however long a
        // loaded machine takes.
        cluster.wait_commit_after(recovered, Duration::from_secs(30));
        let restarted = cluster.epoch.elapsed().as_nanos() as u64;
        nodes[victim].spawn();
        std::thread::sleep(Duration::from_millis(1500));
        // SIGSTOP another partition's leader for longer than an election takes.
        let slot2 = cluster.slot(&cluster.keys[2][0]);
        let paused = leader_of(addrs[0], slot2).expect("partition 2 has a leader");
        nodes[paused].signal("-STOP");
        cluster.avoid.store(1 << paused, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(2500));
        nodes[paused].signal("-CONT");
        cluster.avoid.store(0, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(2000));
        (failover, (recovered, restarted))
    });
    let (failover, (recovered, restarted)) = failover;
    assert!(nodes.iter().all(Node::running));
    // What drivers on the killed node left prepared was resolved by the partitions' leaders.
    settle(&addrs, false);
    let summary = format!(
        "{report:?}; failover to the first commit {} ms",
        failover.as_millis()
    );
    // (Modest: the other five-node tests of this file run at the same time on two cores.)
    assert!(report.committed > 100, "{summary}");
    assert!(commits.len() > 100, "{summary}");
    assert!(failover < Duration::from_secs(10), "{summary}");
    // The clients kept committing (through the surviving nodes) while the victim was down.
    let while_down = commits
        .iter()
        .filter(|&&t| t >= recovered && t <= restarted)
        .count();
    assert!(
        while_down > 0,
        "no commit while the killed node was down; {summary}"
    );
}

/// Waits (up to 20 s) until no partition on any node holds a prepared transaction (and, with
/// `decisions`, a kept commit decision): whatever drivers left was resolved. Returns every
/// node's `keel_partition_` lines of `INFO replication`.
fn settle(addrs: &[SocketAddr], decisions: bool) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let lines: Vec<String> = addrs
            .iter()
            .map(|&a| {
                connect_addr(a)
                    .and_then(|mut c| redis::cmd("INFO").arg("replication").query(&mut c))
                    .unwrap_or_else(|_| String::new())
            })
            .flat_map(|i: String| {
                i.lines()
                    .filter(|l| l.starts_with("keel_partition_"))
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .collect();
        let settled = lines.len() == addrs.len() * 3
            && lines
                .iter()
                .all(|l| l.contains(",prepared=0,") && (!decisions || l.contains(",decisions=0,")));
        if settled {
            return lines;
        }
        assert!(
            Instant::now() < deadline,
            "transactions left prepared or decided: {lines:#?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Rebalancing under load: while the Elle clients and the bank run (transactions within and
/// across partitions), slots holding their keys and accounts move between partitions again
/// and again (`KEEL.MOVESLOTS` through random nodes). The same checks as under faults: the
/// history strictly serializable, nothing acknowledged lost or doubled, every audit and the
/// final state with the bank's opening total; and the moves all succeed.
#[test]
fn rebalancing_under_load_keeps_the_history_and_the_bank() {
    let dir = support::TestDir::new();
    let ports = support::ports(4, NODES);
    let addrs: Vec<SocketAddr> = ports
        .iter()
        .map(|&p| SocketAddr::from(([127, 0, 0, 1], p)))
        .collect();
    let mut nodes: Vec<Node> = (0..NODES)
        .map(|i| Node::start_with(dir.path(), i, &ports, &["--replicas", "3"]))
        .collect();
    let (report, commits, moves) = elle_under_faults(&addrs, 100, |cluster| {
        let mut c = connect_addr(addrs[0]).expect("connect");
        let accounts: Vec<String> =
            support::keys_per_node(&mut c, NODES, ACCOUNTS_PER_PARTITION, "acct")
                .into_iter()
                .flatten()
                .collect();
        let slots: Vec<u16> = cluster
            .keys
            .iter()
            .flatten()
            .chain(&accounts)
            .map(|k| cluster.slot(k))
            .collect();
        let mut rng: u64 = 0x005E_ED0F_0AB5;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let started = Instant::now();
        let mut moved = 0;
        std::thread::sleep(Duration::from_millis(500));
        // For 8 s, and on until 5 slots moved (a loaded machine moves fewer in 8 s).
        while started.elapsed() < Duration::from_secs(8) || moved < 5 {
            assert!(
                started.elapsed() < Duration::from_secs(90),
                "slot moves stalled: {moved} in 90 s"
            );
            let slot = slots[(next() % slots.len() as u64) as usize];
            let to = (next() % NODES as u64) as usize;
            let via = (next() % NODES as u64) as usize;
            let mut c = connect_addr(addrs[via]).expect("connect");
            let n: i64 = redis::cmd("KEEL.MOVESLOTS")
                .arg(format!("n{}", to + 1))
                .arg(slot)
                .query(&mut c)
                .unwrap_or_else(|e| panic!("moving slot {slot} to n{}: {e}", to + 1));
            moved += n;
            std::thread::sleep(Duration::from_millis(50));
        }
        // Then a node dies (SIGKILL) and comes back 2 s later while moves go on: a move
        // driven by it, or needing it, may fail (its answer says so, or it is lost); its
        // prepared moves are finished by the partitions' leaders.
        let victim = (next() % NODES as u64) as usize;
        nodes[victim].kill_9();
        let killed = Instant::now();
        let mut restarted = false;
        while killed.elapsed() < Duration::from_secs(4) {
            if !restarted && killed.elapsed() > Duration::from_secs(2) {
                nodes[victim].spawn();
                restarted = true;
            }
            let slot = slots[(next() % slots.len() as u64) as usize];
            let to = (next() % NODES as u64) as usize;
            let via = (victim + 1 + (next() % (NODES as u64 - 1)) as usize) % NODES;
            let Ok(mut c) = connect_addr(addrs[via]) else {
                continue;
            };
            let _ = c.set_read_timeout(Some(Duration::from_secs(10)));
            match redis::cmd("KEEL.MOVESLOTS")
                .arg(format!("n{}", to + 1))
                .arg(slot)
                .query::<i64>(&mut c)
            {
                Ok(n) => moved += n,
                Err(e) if matches!(e.code(), Some("CLUSTERDOWN" | "TRYAGAIN")) => {}
                Err(e) if e.is_io_error() || e.is_timeout() => {}
                Err(e) => panic!(
                    "moving slot {slot} to n{} with n{} down: {e}",
                    to + 1,
                    victim + 1
                ),
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if !restarted {
            nodes[victim].spawn();
        }
        moved
    });
    assert!(nodes.iter().all(Node::running));
    let summary = format!("{report:?}; {moves} slot moves");
    println!("{summary}");
    assert!(moves >= 5, "{summary}");
    // Once the load stopped, nothing stays prepared or decided on any replica, and the
    // moves show in INFO replication.
    let lines = settle(&addrs, true);
    assert!(
        lines.iter().any(|l| !l.ends_with("moved_slots=0")),
        "{lines:#?}"
    );
    assert!(report.committed > 100, "{summary}");
    assert!(commits.len() > 100, "{summary}");
}

/// Membership under load: while the Elle clients and the bank run against five nodes, a
/// sixth joins (`keel serve --cluster-join`: a new partition, replicas moved to it) while
/// another node is killed and restarted, `keel cluster rebalance` moves slots to it, `keel cluster remove-node n1` moves n1's slots and
/// replicas away, and n1 is killed. The same checks as under faults (strict
/// serializability, nothing acknowledged lost or doubled, the bank's total), and afterwards
/// no partition keeps a replica on n1, the new node serves slots, and nothing stays prepared.
#[test]
fn nodes_join_and_leave_under_load_keeping_the_history_and_the_bank() {
    let dir = support::TestDir::new();
    // Block 3's first two ports belong to `data_written_without_replicas_is_refused`.
    let ports: Vec<u16> = support::ports(3, 8)[2..].to_vec();
    let addrs: Vec<SocketAddr> = ports
        .iter()
        .map(|&p| SocketAddr::from(([127, 0, 0, 1], p)))
        .collect();
    let mut nodes: Vec<Node> = (0..NODES)
        .map(|i| Node::start_with(dir.path(), i, &ports[..NODES], &["--replicas", "3"]))
        .collect();
    let keel = |args: &[String]| -> String {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_keel"))
            .args(args)
            .output()
            .expect("keel cluster");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "keel {args:?}: {text}");
        text
    };
    // Each partition's slots by its home's id (CLUSTER NODES lists slots under the leaders).
    let partitions = |addr: SocketAddr| -> String {
        connect_addr(addr)
            .and_then(|mut c| redis::cmd("CLUSTER").arg("PARTITIONS").query(&mut c))
            .unwrap_or_default()
    };
    let mut joined: Option<Node> = None;
    let (report, commits, steps) = elle_under_faults(&addrs[..NODES], 100, |cluster| {
        std::thread::sleep(Duration::from_secs(1));
        let began = Instant::now();
        joined = Some(Node::join(dir.path(), NODES, ports[NODES], addrs[1]));
        let deadline = Instant::now() + Duration::from_secs(20);
        while !partitions(addrs[0])
            .lines()
            .any(|l| l.split(' ').next() == Some("n6"))
        {
            assert!(Instant::now() < deadline, "n6 never listed");
            std::thread::sleep(Duration::from_millis(100));
        }
        // A node dies while replicas move to n6 (kill -9), and comes back 2 s later: the
        // moves its partitions' leaders make go on, or are made again, once it is back.
        nodes[2].kill_9();
        std::thread::sleep(Duration::from_secs(2));
        nodes[2].spawn();
        let rebalanced = keel(&[
            "cluster".into(),
            "rebalance".into(),
            "--node".into(),
            addrs[2].to_string(),
        ]);
        assert!(rebalanced.contains("slots to n6"), "{rebalanced}");
        std::thread::sleep(Duration::from_secs(1));
        // Not while its partition owns slots (as that partition's leader knows).
        let refused = redis::cmd("KEEL.REMOVENODE")
            .arg("n1")
            .query::<i64>(&mut connect_addr(addrs[4]).expect("connect"))
            .expect_err("n1's partition owns slots");
        assert!(refused.to_string().contains("owns"), "{refused}");
        let removed = keel(&[
            "cluster".into(),
            "remove-node".into(),
            "n1".into(),
            "--node".into(),
            addrs[3].to_string(),
        ]);
        assert!(removed.contains("n1 removed"), "{removed}");
        // Planned from every partition's own table (KEEL.LEARNSLOTS), not the node's
        // routes: every slot a plan names moves.
        for text in [&rebalanced, &removed] {
            let lines: Vec<&str> = text.lines().collect();
            for pair in lines.windows(2) {
                if let Some((n, _)) = pair[0].split_once(" slots to ") {
                    assert_eq!(pair[1].trim(), format!("moved {n}"), "{text}");
                }
            }
        }
        // Every replica left n1, which emptied and closed their databases (until this
        // session, kept open until the process stopped).
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let info: String = connect_addr(addrs[0])
                .and_then(|mut c| redis::cmd("INFO").arg("replication").query(&mut c))
                .unwrap_or_default();
            if info.contains("\r\nkeel_replica_databases:\r\n") && !info.contains("keel_partition_")
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "n1 keeps its replicas' databases:\n{info}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        cluster.avoid.fetch_or(1, Ordering::Relaxed);
        nodes[0].kill_9();
        let took = began.elapsed();
        std::thread::sleep(Duration::from_secs(2));
        format!("join, rebalance, remove-node in {took:?}:\n{rebalanced}{removed}")
    });
    println!("{report:?}\n{steps}");
    assert!(report.committed > 100, "{report:?}");
    assert!(commits.len() > 100);
    let live: Vec<SocketAddr> = addrs[1..].to_vec();
    // Every live node lists n2..n6 and every slot; none lists n1; the new node owns slots.
    for &a in &live {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let text = partitions(a);
            let ids: Vec<&str> = text.lines().filter_map(|l| l.split(' ').next()).collect();
            if ids == ["n2", "n3", "n4", "n5", "n6"] {
                let n6 = text.lines().find(|l| l.starts_with("n6 ")).expect("n6");
                assert!(n6.split_whitespace().count() > 1, "n6 owns no slot: {text}");
                break;
            }
            assert!(Instant::now() < deadline, "on {a}: {text}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    // No partition keeps n1 among its replicas, the new node hosts some, nothing prepared.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let lines: Vec<String> = live
            .iter()
            .flat_map(|&a| {
                let info: String = connect_addr(a)
                    .and_then(|mut c| redis::cmd("INFO").arg("replication").query(&mut c))
                    .unwrap_or_default();
                info.lines()
                    .filter(|l| l.starts_with("keel_partition_"))
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .collect();
        let replicas = |l: &String| -> Vec<String> {
            l.split(",replicas=")
                .nth(1)
                .and_then(|r| r.split(',').next())
                .map(|r| r.split(';').map(str::to_owned).collect())
                .unwrap_or_default()
        };
        let done = lines.len() == 3 * (NODES + 1)
            && lines.iter().all(|l| {
                let r = replicas(l);
                r.len() == 3 && !r.contains(&"n1".to_owned()) && l.contains(",prepared=0,")
            })
            && lines.iter().any(|l| replicas(l).contains(&"n6".to_owned()));
        if done {
            break;
        }
        assert!(Instant::now() < deadline, "{lines:#?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query(&mut connect_addr(addrs[4]).expect("connect"))
        .expect("INFO");
    assert!(
        info.contains("keel_view_epoch:2\r\nkeel_nodes:5\r\nkeel_partitions:6"),
        "{info}"
    );
    // Each live node keeps open exactly the databases of the partitions it hosts (its home
    // partition's data is the node's own database).
    for (i, &a) in addrs.iter().enumerate().skip(1) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let info: String = connect_addr(a)
                .and_then(|mut c| redis::cmd("INFO").arg("replication").query(&mut c))
                .unwrap_or_default();
            let mut hosted: Vec<String> = info
                .lines()
                .filter_map(|l| l.strip_prefix("keel_partition_")?.split(':').next())
                .flat_map(|p| {
                    let data = (p != i.to_string()).then(|| format!("partition-{p}"));
                    data.into_iter().chain([format!("raft-{p}")])
                })
                .collect();
            hosted.sort();
            let open: Vec<String> = info
                .lines()
                .find_map(|l| l.strip_prefix("keel_replica_databases:"))
                .map(|l| {
                    l.split(',')
                        .filter(|n| !n.is_empty())
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default();
            if !hosted.is_empty() && open == hosted {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "on {a}, open {open:?} for the hosted {hosted:?}:\n{info}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    // The joined node restarts with the same command (a join that changes nothing) and
    // serves every key again.
    let mut joined = joined.expect("n6 joined");
    joined.kill_9();
    joined.spawn();
    let mut c = connect(ports[NODES]).expect("connect to n6");
    let deadline = Instant::now() + Duration::from_secs(20);
    while redis::cmd("MGET")
        .arg(cluster_keys(addrs[1]))
        .query::<Vec<Option<String>>>(&mut c)
        .is_err()
    {
        assert!(
            Instant::now() < deadline,
            "n6 does not serve after a restart"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Joins that conflict are refused, with the reason, and change nothing.
    let refused = |id: &str, port: u16| -> String {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_keel"))
            .args([
                "serve",
                "--cluster-join",
                &addrs[2].to_string(),
                "--cluster-myself",
                id,
            ])
            .args(["--port", &port.to_string(), "--dir"])
            .arg(dir.path().join(format!("refused-{id}")))
            .output()
            .expect("keel serve");
        assert!(!out.status.success(), "{id} joined");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let spare = support::ports(3, 8)[0];
    let text = refused("n2", spare);
    assert!(text.contains("is in the cluster at"), "{text}");
    let text = refused("n1", spare);
    assert!(text.contains("was removed"), "{text}");
    let text = refused("n7", ports[2]);
    assert!(text.contains("address"), "{text}");
}

/// The Elle keys of every partition, as `CLUSTER KEYSLOT` on `addr` finds them.
fn cluster_keys(addr: SocketAddr) -> Vec<String> {
    keys_by_partition(addr).into_iter().flatten().collect()
}

/// A node whose disk is lost (killed, its directory deleted) comes back empty under the same
/// identity and catches up from its partitions' leaders, snapshot or log, while the others
/// keep serving: afterwards its own copy (READONLY) holds every acknowledged write of the
/// partitions it keeps.
#[test]
fn a_node_that_lost_its_disk_catches_up_from_the_others() {
    let dir = support::TestDir::new();
    let ports = support::ports(5, 3);
    let mut nodes: Vec<Node> = (0..3)
        .map(|i| Node::start_with(dir.path(), i, &ports, &[]))
        .collect();
    let mut c = connect(ports[0]).expect("connect");
    let write = |c: &mut redis::Connection, range: std::ops::Range<u32>| {
        let mut pipe = redis::pipe();
        for i in range {
            pipe.cmd("SET").arg(format!("disk{i}")).arg(i).ignore();
        }
        pipe.query::<()>(c)
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while let Err(e) = write(&mut c, 0..300) {
        assert!(Instant::now() < deadline, "writes: {e}");
        std::thread::sleep(Duration::from_millis(100));
    }
    nodes[1].kill_9();
    std::fs::remove_dir_all(&nodes[1].dir).expect("wipe node 2's data");
    // The others keep serving while it is gone.
    write(&mut c, 300..600).expect("writes while node 2 is down");
    nodes[1].spawn();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        // Single-key GETs on a READONLY connection read node 2's own copies (an MGET
        // across partitions would be a transaction at the leaders).
        let copy = connect(ports[1]).and_then(|mut c2| {
            redis::cmd("READONLY").query::<()>(&mut c2)?;
            let mut pipe = redis::pipe();
            for i in 0..600 {
                pipe.cmd("GET").arg(format!("disk{i}"));
            }
            pipe.query::<Vec<Option<u32>>>(&mut c2)
        });
        match copy {
            Ok(values) if values.iter().enumerate().all(|(i, v)| *v == Some(i as u32)) => break,
            other => {
                assert!(
                    Instant::now() < deadline,
                    "node 2 did not catch up within 30 s: {:?}",
                    other.map(|v| v.iter().filter(|x| x.is_none()).count())
                );
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
    // And it serves writes again, as a member of every group.
    let mut c2 = connect(ports[1]).expect("connect");
    write(&mut c2, 600..650).expect("writes through the restored node");
}

/// What a cluster-aware client reads of the topology follows a failover: after `kill -9` of
/// the node leading partition 0, a survivor's `CLUSTER NODES` shows that node `fail?` and
/// `disconnected` with no slots, and every slot under a live node (the partitions' new
/// leaders), `CLUSTER SHARDS` gives it `health failed`, `CLUSTER SLOTS` names no range after
/// it, and `CLUSTER INFO` stays `ok` (every partition kept a majority). Restarted, it is
/// `connected` again. (Before, `CLUSTER NODES` kept listing the killed node as the master of
/// its partition's slots, `connected`: a client that routes by it, as Lettuce does, sent
/// those slots to a dead node.)
#[test]
fn the_topology_clients_read_follows_a_failover() {
    let dir = support::TestDir::new();
    let ports: Vec<u16> = support::ports(2, 6)[3..6].to_vec();
    let mut nodes: Vec<Node> = (0..3)
        .map(|i| Node::start_with(dir.path(), i, &ports, &[]))
        .collect();
    let query = |port: u16, args: &[&str]| -> redis::RedisResult<redis::Value> {
        let mut c = connect(port)?;
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(&mut c)
    };
    let text = |port: u16, args: &[&str]| -> String {
        match query(port, args) {
            Ok(v) => redis::from_redis_value::<String>(v).unwrap_or_default(),
            Err(e) => format!("error: {e}"),
        }
    };
    // The node serving slot 0's writes: the first of its range in CLUSTER SLOTS.
    let serving_slot_0 = |port: u16| -> Option<u16> {
        let slots: Vec<(u16, u16, Vec<redis::Value>)> = match query(port, &["CLUSTER", "SLOTS"]) {
            Ok(redis::Value::Array(ranges)) => ranges
                .into_iter()
                .filter_map(|r| match r {
                    redis::Value::Array(mut parts) if parts.len() >= 3 => {
                        let rest = parts.split_off(2);
                        let start = redis::from_redis_value(parts.remove(0)).ok()?;
                        let end = redis::from_redis_value(parts.remove(0)).ok()?;
                        Some((start, end, rest))
                    }
                    _ => None,
                })
                .collect(),
            _ => return None,
        };
        let (_, _, nodes) = slots.into_iter().find(|(s, _, _)| *s == 0)?;
        match nodes.into_iter().next()? {
            redis::Value::Array(node) => redis::from_redis_value(node.get(1)?.clone()).ok(),
            _ => None,
        }
    };
    // Wait until the cluster serves writes and slot 0 has a leader.
    let deadline = Instant::now() + Duration::from_secs(30);
    let leader = loop {
        let wrote = query(ports[1], &["SET", "topology", "1"]).is_ok();
        if let (true, Some(port)) = (wrote, serving_slot_0(ports[1])) {
            break port;
        }
        assert!(Instant::now() < deadline, "no leader for slot 0");
        std::thread::sleep(Duration::from_millis(100));
    };
    let killed = ports
        .iter()
        .position(|&p| p == leader)
        .expect("a node's port");
    let survivor = ports[(killed + 1) % 3];
    let killed_id = format!("n{}", killed + 1);
    nodes[killed].kill_9();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let nodes_text = text(survivor, &["CLUSTER", "NODES"]);
        let dead_line = nodes_text
            .lines()
            .find(|l| l.starts_with(&format!("{killed_id} ")))
            .unwrap_or_default()
            .to_owned();
        let live_slots: usize = nodes_text
            .lines()
            .filter(|l| !l.starts_with(&format!("{killed_id} ")))
            .flat_map(|l| l.split_whitespace().skip(8))
            .map(|r| {
                let (a, b) = r.split_once('-').unwrap_or((r, r));
                b.parse::<usize>().expect("slot") - a.parse::<usize>().expect("slot") + 1
            })
            .sum();
        let failed = dead_line.contains(" master,fail? ")
            && dead_line.ends_with(" disconnected")
            && live_slots == 16384;
        let shards = format!("{:?}", query(survivor, &["CLUSTER", "SHARDS"]));
        let info = text(survivor, &["CLUSTER", "INFO"]);
        let slots_moved = serving_slot_0(survivor).is_some_and(|p| p != leader);
        if failed
            && slots_moved
            && shards.contains("failed")
            && info.starts_with("cluster_state:ok")
        {
            // A write to slot 0's keys goes through the new leader.
            query(survivor, &["SET", "{06S}x", "after"]).expect("a write after the failover");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "30 s after kill -9 of {killed_id}:\n{nodes_text}\n{info}\n{shards}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    nodes[killed].spawn();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let nodes_text = text(survivor, &["CLUSTER", "NODES"]);
        let back = nodes_text
            .lines()
            .find(|l| l.starts_with(&format!("{killed_id} ")))
            .is_some_and(|l| !l.contains("fail?") && l.contains(" connected"));
        if back && !format!("{:?}", query(survivor, &["CLUSTER", "SHARDS"])).contains("failed") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "30 s after {killed_id} restarted:\n{nodes_text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `keel cluster rebalance`: after all of one partition's slots were moved to another, it
/// evens the slots out again (every node's CLUSTER PARTITIONS agrees), and every key still reads.
#[test]
fn rebalance_evens_out_the_slots() {
    let dir = support::TestDir::new();
    let ports = support::ports(6, 3);
    let _nodes: Vec<Node> = (0..3)
        .map(|i| Node::start_with(dir.path(), i, &ports, &[]))
        .collect();
    let mut c = connect(ports[0]).expect("connect");
    let mut pipe = redis::pipe();
    for i in 0..200 {
        pipe.cmd("SET").arg(format!("r{i}")).arg(i).ignore();
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while let Err(e) = pipe.query::<()>(&mut c) {
        assert!(Instant::now() < deadline, "writes: {e}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // A transaction across partitions answers PING, ECHO and TIME where the client is.
    let mut commands = vec![redis::cmd("PING"), redis::cmd("ECHO").arg("hi").clone()];
    commands.extend((0..10).map(|i| redis::cmd("GET").arg(format!("r{i}")).clone()));
    commands.push(redis::cmd("TIME"));
    let got = exec(&mut c, &commands).expect("EXEC across partitions with PING");
    let got: (String, String, Vec<i64>) = match got {
        redis::Value::Array(mut v) => {
            let time = v.pop().expect("TIME");
            assert!(
                matches!(&time, redis::Value::Array(t) if t.len() == 2),
                "{time:?}"
            );
            let gets = redis::from_redis_value(redis::Value::Array(v.split_off(2))).expect("GETs");
            let mut v = v.into_iter();
            (
                redis::from_redis_value(v.next().expect("PING")).expect("PONG"),
                redis::from_redis_value(v.next().expect("ECHO")).expect("hi"),
                gets,
            )
        }
        other => panic!("EXEC: {other:?}"),
    };
    assert_eq!(got, ("PONG".into(), "hi".into(), (0..10).collect()));
    let (start, end) = keel_server::cluster_map::membership::even_range(1, 3);
    // A third of the slots move in 11 transactions through Raft, with fsyncs: a few seconds,
    // past the connection's 10 s on a loaded machine (each batch has its own deadline).
    c.set_read_timeout(Some(Duration::from_secs(120)))
        .expect("read timeout");
    let moved: i64 = redis::cmd("KEEL.MOVESLOTS")
        .arg("n1")
        .arg(format!("{start}-{end}"))
        .query(&mut c)
        .expect("KEEL.MOVESLOTS");
    assert_eq!(moved, i64::from(end - start + 1));
    // Slots per partition (CLUSTER NODES lists them under the partitions' leaders).
    let counts = |port: u16| -> Vec<usize> {
        let text: String = redis::cmd("CLUSTER")
            .arg("PARTITIONS")
            .query(&mut connect(port).expect("connect"))
            .expect("CLUSTER PARTITIONS");
        text.lines()
            .map(|l| {
                l.split_whitespace()
                    .skip(1)
                    .map(|r| {
                        let (a, b) = r.split_once('-').unwrap_or((r, r));
                        b.parse::<usize>().expect("slot") - a.parse::<usize>().expect("slot") + 1
                    })
                    .sum()
            })
            .collect()
    };
    // Another node knows of the move once its replica of partition 1 applied it (a
    // majority without it acknowledged the move): soon, later on a loaded machine.
    let eventually = |port: u16, what: &str, done: &dyn Fn(&[usize]) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let n = counts(port);
            if done(&n) {
                break;
            }
            assert!(Instant::now() < deadline, "on {port}, {what}: {n:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    eventually(ports[2], "partition 1 moved out whole", &|n| n[1] == 0);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["cluster", "rebalance", "--node"])
        .arg(format!("127.0.0.1:{}", ports[1]))
        .output()
        .expect("keel cluster rebalance");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("slots to n2"), "{stdout}");
    for &port in &ports {
        eventually(port, "the slots evened out", &|n| {
            n.iter().sum::<usize>() == 16384 && n.iter().all(|&k| (5461..=5462).contains(&k))
        });
    }
    let values: Vec<Option<i64>> = redis::cmd("MGET")
        .arg((0..200).map(|i| format!("r{i}")).collect::<Vec<_>>())
        .query(&mut c)
        .expect("MGET");
    // Requests to the peers (Raft's messages, the moves) are timed per peer.
    let info: String = redis::cmd("INFO")
        .arg("cluster")
        .query(&mut c)
        .expect("INFO cluster");
    for peer in ["n2", "n3"] {
        let line = info
            .lines()
            .find(|l| l.starts_with(&format!("keel_rpc_{peer}:calls=")))
            .unwrap_or_else(|| panic!("no RPC latency for {peer}: {info}"));
        assert!(
            line.contains(",p99_us=") && !line.contains("calls=0,"),
            "{line}"
        );
    }
    assert!(
        values.iter().enumerate().all(|(i, v)| *v == Some(i as i64)),
        "{values:?}"
    );
}

/// Every node learns every slot move within a few seconds, whether or not it hosts the
/// partitions the slots left or joined, so `CLUSTER NODES`/`SLOTS`/`SHARDS` agree on every
/// node and `redis-cli --cluster check` passes. Before, a node learned a move only from a
/// `MOVED` answer, a move it made or `KEEL.LEARNSLOTS`: four nodes with three replicas each
/// each lack one partition, and a node lacking the partition a slot left listed the old owner
/// for good.
#[test]
fn every_node_learns_every_slot_move() {
    const NODES: usize = 4;
    let dir = support::TestDir::new();
    // Ports the other tests leave free.
    let mut ports: Vec<u16> = support::ports(0, 8)[5..].to_vec();
    ports.push(support::ports(6, 8)[3]);
    let _nodes: Vec<Node> = (0..NODES)
        .map(|i| Node::start_with(dir.path(), i, &ports, &[]))
        .collect();
    let mut c = connect(ports[0]).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(120)))
        .expect("read timeout");
    // Ten slots of each partition move to the next node's, each move asked of node 1, so
    // that every node lacks the partition some slots left.
    let mut expected: Vec<Vec<(u16, u16)>> = (0..NODES)
        .map(|i| vec![keel_server::cluster_map::membership::even_range(i, NODES)])
        .collect();
    for i in 0..NODES {
        let (start, _) = expected[i][0];
        let to = (i + 1) % NODES;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match redis::cmd("KEEL.MOVESLOTS")
                .arg(format!("n{}", to + 1))
                .arg(format!("{start}-{}", start + 9))
                .query::<i64>(&mut c)
            {
                Ok(moved) => {
                    assert_eq!(moved, 10);
                    break;
                }
                // The partitions elect their leaders first.
                Err(e) => assert!(Instant::now() < deadline, "KEEL.MOVESLOTS: {e}"),
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        expected[i][0].0 += 10;
        expected[to].push((start, start + 9));
    }
    let text: String = expected
        .iter()
        .enumerate()
        .map(|(i, ranges)| {
            let mut ranges = ranges.clone();
            ranges.sort_unstable();
            let ranges: Vec<String> = ranges.iter().map(|(a, b)| format!("{a}-{b}")).collect();
            format!("n{} {}\n", i + 1, ranges.join(" "))
        })
        .collect();
    for &port in &ports {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let got: String = connect(port)
                .and_then(|mut c| redis::cmd("CLUSTER").arg("PARTITIONS").query(&mut c))
                .unwrap_or_default();
            if got == text {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node on {port} lists:\n{got}\nnot:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// `redis-cli --cluster reshard`, the tool Redis users move slots with, works against keel:
/// its `CLUSTER SETSLOT ... MIGRATING` moves the slot and its keys at once, so the source's
/// `GETKEYSINSLOT` finds nothing left to `MIGRATE` (which keel does not have), and `SETSLOT
/// ... NODE` finds the move done. Before, it stopped at the first slot: `ERR unknown
/// subcommand 'SETSLOT'`. Afterwards `redis-cli --cluster check` passes and every key reads.
#[test]
fn redis_cli_reshard_moves_slots() {
    let dir = support::TestDir::new();
    // Ports the other tests leave free.
    let mut ports: Vec<u16> = support::ports(1, 8)[6..].to_vec();
    ports.push(support::ports(2, 8)[6]);
    let _nodes: Vec<Node> = (0..3)
        .map(|i| Node::start_with(dir.path(), i, &ports, &[]))
        .collect();
    let mut c = connect(ports[0]).expect("connect");
    let deadline = Instant::now() + Duration::from_secs(20);
    while let Err(e) = redis::cmd("SET").arg("probe").arg(1).query::<()>(&mut c) {
        assert!(Instant::now() < deadline, "writes: {e}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // The source: a node that serves slots (CLUSTER NODES lists them under the leaders);
    // the destination: another node, whose partition takes them. redis-cli moves the
    // source's first slots: each gets five keys.
    let nodes: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query(&mut c)
        .expect("CLUSTER NODES");
    let line: Vec<&str> = nodes
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|l| l.len() > 8)
        .expect("a node serving slots");
    let from = line[0].to_string();
    let first: u16 = line[8]
        .split('-')
        .next()
        .and_then(|s| s.parse().ok())
        .expect("a slot range");
    let to = ["n1", "n2", "n3"]
        .into_iter()
        .find(|&n| n != from)
        .expect("another node");
    let mut keys: Vec<String> = Vec::new();
    let mut per_slot = [0usize; 40];
    for i in 0.. {
        let key = format!("k{i}");
        let slot = keel_server::cluster_map::key_slot(key.as_bytes()).0;
        if let Some(n) = slot
            .checked_sub(first)
            .and_then(|d| per_slot.get_mut(d as usize))
            && *n < 5
        {
            *n += 1;
            keys.push(key);
        }
        if keys.len() == 200 {
            break;
        }
    }
    let mut pipe = redis::pipe();
    for (i, key) in keys.iter().enumerate() {
        pipe.cmd("SET").arg(key).arg(i).ignore();
    }
    pipe.query::<()>(&mut c).expect("SETs");
    let owned = |id: &str| -> usize {
        let text: String = redis::cmd("CLUSTER")
            .arg("PARTITIONS")
            .query(&mut connect(ports[0]).expect("connect"))
            .expect("CLUSTER PARTITIONS");
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{id} ")))
            .unwrap_or_else(|| panic!("{id} in {text}"));
        line.split_whitespace()
            .skip(1)
            .map(|r| {
                let (a, b) = r.split_once('-').unwrap_or((r, r));
                b.parse::<usize>().expect("slot") - a.parse::<usize>().expect("slot") + 1
            })
            .sum()
    };
    let before = owned(to);
    let out = std::process::Command::new("redis-cli")
        .args(["--cluster", "reshard"])
        .arg(format!("127.0.0.1:{}", ports[0]))
        .args(["--cluster-from", &from, "--cluster-to", to])
        .args(["--cluster-slots", "40", "--cluster-yes"])
        .output()
        .expect("redis-cli (apt-get install redis-tools)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("Moving slot"), "{text}");
    assert!(!text.contains("ERR"), "{text}");
    assert_eq!(owned(to), before + 40, "{text}");
    // Every node follows the moves within about a second.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = std::process::Command::new("redis-cli")
            .args(["--cluster", "check"])
            .arg(format!("127.0.0.1:{}", ports[2]))
            .output()
            .expect("redis-cli");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if text.contains("[OK] All nodes agree about slots configuration.")
            && text.contains("[OK] All 16384 slots covered.")
        {
            break;
        }
        assert!(Instant::now() < deadline, "{text}");
        std::thread::sleep(Duration::from_millis(200));
    }
    // A new connection: `c` asked for the slot map, so it is answered `MOVED`.
    let values: Vec<Option<i64>> = redis::cmd("MGET")
        .arg(&keys)
        .query(&mut connect(ports[1]).expect("connect"))
        .expect("MGET");
    assert!(
        values.iter().enumerate().all(|(i, v)| *v == Some(i as i64)),
        "{values:?}"
    );
}

/// Blocking pops in a replicated cluster wake on the push: a client blocked in `BLPOP` on
/// any node (whose replica of the partition, the leader's or a follower's, applies the push)
/// gets the element a few log rounds after the push, not after a poll's pause (polling, whose
/// pause grows to 100 ms, served a push that came after a second of waiting about 50 ms late
/// on average, 100 at worst). Clients blocked on one node are served in the order they
/// blocked, as by Redis, and `CLIENT UNBLOCK` ends a wait.
/// A replicated node runs no reaper thread: each partition's leader proposes `KEEL.REAP`
/// entries, so keys past their deadline and the members of a deleted collection go without
/// anyone touching them again (before, they stayed: `INFO keyspace` kept counting the keys,
/// and the set's members kept their records).
#[test]
fn expired_keys_and_deleted_collections_are_reaped() {
    let dir = support::TestDir::new();
    let ports: Vec<u16> = support::ports(5, 8)[3..6].to_vec();
    let _nodes: Vec<Node> = (0..3)
        .map(|i| Node::start_with(dir.path(), i, &ports, &[]))
        .collect();
    let mut c = connect(ports[0]).expect("connect");
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Err(e) = redis::cmd("DEL").arg("{b}warm").query::<i64>(&mut c) {
        assert!(Instant::now() < deadline, "writes: {e}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let info = |c: &mut redis::Connection, section: &str| -> String {
        redis::cmd("INFO").arg(section).query(c).expect("INFO")
    };
    let records = |c: &mut redis::Connection| -> u64 {
        info(c, "keel")
            .lines()
            .find_map(|l| l.strip_prefix("keel_records:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("keel_records")
    };
    let before = records(&mut c);
    let mut sadd = redis::cmd("SADD");
    sadd.arg("{b}big");
    for i in 0..1_000 {
        sadd.arg(format!("member-{i}"));
    }
    let _: i64 = sadd.query(&mut c).expect("SADD");
    for i in 0..100 {
        let _: () = redis::cmd("SET")
            .arg(format!("{{b}}ttl{i}"))
            .arg("v")
            .arg("PX")
            .arg(50)
            .query(&mut c)
            .expect("SET");
    }
    let peak = records(&mut c);
    assert!(peak >= before + 1_000, "{peak} records");
    let _: i64 = redis::cmd("DEL").arg("{b}big").query(&mut c).expect("DEL");
    // Nothing touches them again. (The answers kept for retried writes stay a while longer:
    // a few records per write.)
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let keyspace = info(&mut c, "keyspace");
        let left = records(&mut c);
        if !keyspace.contains("db0:") && left + 1_000 <= peak {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not reaped: {left} records (from {peak}), {keyspace:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Counted in INFO by the leaders that proposed the passes.
    let counted = |name: &str| -> u64 {
        ports
            .iter()
            .map(|&port| {
                let mut c = connect(port).expect("connect");
                info(&mut c, "stats")
                    .lines()
                    .find_map(|l| l.strip_prefix(name))
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .unwrap_or_else(|| panic!("no {name} on {port}"))
            })
            .sum()
    };
    // (A pass whose answer a leader change lost is not counted: at most the totals.)
    let (expired, swept) = (counted("expired_keys:"), counted("keel_swept_keys:"));
    assert!((1..=100).contains(&expired), "expired_keys {expired}");
    assert!((1..=1_000).contains(&swept), "keel_swept_keys {swept}");
}

/// A slot holding a collection too large for one log entry moves (in chunks, its slot
/// locked until the move ends) with every member, while a client keeps adding to it through
/// the move; the source then reclaims the old copy in the background. Before, `KEEL.MOVESLOTS`
/// refused such a slot: "holds more than one move can carry".
#[test]
fn a_slot_with_a_large_collection_moves_in_chunks() {
    const MEMBERS: usize = 100_000;
    let dir = support::TestDir::new();
    let ports: Vec<u16> = support::ports(1, 6)[3..6].to_vec();
    let _nodes: Vec<Node> = (0..3)
        .map(|i| Node::start_with(dir.path(), i, &ports, &[]))
        .collect();
    let mut c = connect(ports[0]).expect("connect");
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Err(e) = redis::cmd("DEL").arg("{big}warm").query::<i64>(&mut c) {
        assert!(Instant::now() < deadline, "writes: {e}");
        std::thread::sleep(Duration::from_millis(100));
    }
    for batch in 0..MEMBERS / 5_000 {
        let mut sadd = redis::cmd("SADD");
        sadd.arg("{big}set");
        for i in batch * 5_000..(batch + 1) * 5_000 {
            sadd.arg(format!("member-{i}"));
        }
        let added: i64 = sadd.query(&mut c).expect("SADD");
        assert_eq!(added, 5_000);
    }
    let mut hset = redis::cmd("HSET");
    hset.arg("{big}hash");
    for i in 0..2_000 {
        hset.arg(format!("field-{i}")).arg(i);
    }
    let _: i64 = hset.query(&mut c).expect("HSET");
    let _: () = redis::cmd("SET")
        .arg("{big}string")
        .arg("v")
        .arg("EX")
        .arg(3_600)
        .query(&mut c)
        .expect("SET");
    let slot: u16 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg("{big}set")
        .query(&mut c)
        .expect("KEYSLOT");
    // The slot goes to the next node's partition.
    let owner = (usize::from(slot) * 3 / 16_384).min(2);
    let to = format!("n{}", (owner + 1) % 3 + 1);

    // A client adds members through the move (each waits while the slot is locked).
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, port) = (stop.clone(), ports[2]);
        std::thread::spawn(move || {
            let mut c = connect(port).expect("connect");
            let mut acknowledged = Vec::new();
            for i in 0.. {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let member = format!("during-{i}");
                if redis::cmd("SADD")
                    .arg("{big}set")
                    .arg(&member)
                    .query::<i64>(&mut c)
                    .is_ok()
                {
                    acknowledged.push(member);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            acknowledged
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    c.set_read_timeout(Some(Duration::from_secs(120)))
        .expect("read timeout");
    let started = Instant::now();
    let moved: i64 = redis::cmd("KEEL.MOVESLOTS")
        .arg(&to)
        .arg(slot)
        .query(&mut c)
        .expect("KEEL.MOVESLOTS of a slot with a large set");
    let took = started.elapsed();
    assert_eq!(moved, 1);
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Relaxed);
    let during = writer.join().expect("writer");
    assert!(!during.is_empty(), "the writer got through");
    eprintln!(
        "moved slot {slot} ({MEMBERS} members) to {to} in {took:?}; {} writes during it",
        during.len()
    );

    // Every member is there, and the keys beside it, on every node's view of the slot.
    for &port in &ports {
        let mut c = connect(port).expect("connect");
        let n: usize = redis::cmd("SCARD")
            .arg("{big}set")
            .query(&mut c)
            .expect("SCARD");
        assert_eq!(n, MEMBERS + during.len(), "on {port}");
    }
    let members: HashSet<String> = redis::cmd("SMEMBERS")
        .arg("{big}set")
        .query(&mut c)
        .expect("SMEMBERS");
    assert!((0..MEMBERS).all(|i| members.contains(&format!("member-{i}"))));
    assert!(during.iter().all(|m| members.contains(m)));
    let fields: HashMap<String, i64> = redis::cmd("HGETALL")
        .arg("{big}hash")
        .query(&mut c)
        .expect("HGETALL");
    assert_eq!(fields.len(), 2_000);
    assert!((0..2_000).all(|i| fields.get(&format!("field-{i}")) == Some(&i)));
    let ttl: i64 = redis::cmd("TTL")
        .arg("{big}string")
        .query(&mut c)
        .expect("TTL");
    assert!((3_000..=3_600).contains(&ttl), "TTL {ttl}");
    let partitions: String = redis::cmd("CLUSTER")
        .arg("PARTITIONS")
        .query(&mut c)
        .expect("CLUSTER PARTITIONS");
    let line = partitions
        .lines()
        .find(|l| l.starts_with(&format!("{to} ")))
        .expect("the destination in CLUSTER PARTITIONS");
    assert!(
        line.split_whitespace().skip(1).any(|r| {
            let (a, b) = r.split_once('-').unwrap_or((r, r));
            (a.parse::<u16>().expect("slot")..=b.parse::<u16>().expect("slot")).contains(&slot)
        }),
        "{line}"
    );

    // The source reclaims its copy in the background (counted by the leaders that swept).
    let swept = || -> u64 {
        ports
            .iter()
            .map(|&port| {
                let text: String = redis::cmd("INFO")
                    .arg("stats")
                    .query(&mut connect(port).expect("connect"))
                    .expect("INFO");
                text.lines()
                    .find_map(|l| l.strip_prefix("keel_swept_keys:"))
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .expect("keel_swept_keys")
            })
            .sum()
    };
    // (A pass whose answer a leader change lost is not counted.)
    let deadline = Instant::now() + Duration::from_secs(60);
    while swept() < (MEMBERS + 2_000 - 4_096) as u64 {
        assert!(Instant::now() < deadline, "reclaimed {} records", swept());
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn blocked_pops_wake_on_the_push_in_the_order_they_blocked() {
    let dir = support::TestDir::new();
    let ports: Vec<u16> = support::ports(6, 8)[5..].to_vec();
    let _nodes: Vec<Node> = (0..3)
        .map(|i| Node::start_with(dir.path(), i, &ports, &[]))
        .collect();
    // Up once a write goes through every node.
    let mut conns: Vec<redis::Connection> = ports
        .iter()
        .map(|&port| connect(port).expect("connect"))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    for c in &mut conns {
        while let Err(e) = redis::cmd("DEL").arg("{b}warm").query::<i64>(c) {
            assert!(Instant::now() < deadline, "writes: {e}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let blpop = |port: u16, key: String| {
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let mut c = connect(port).expect("connect");
            let id: i64 = redis::cmd("CLIENT")
                .arg("ID")
                .query(&mut c)
                .expect("CLIENT ID");
            tx.send(id).expect("send");
            let got: redis::RedisResult<Option<(String, String)>> =
                redis::cmd("BLPOP").arg(&key).arg(10).query(&mut c);
            (got, Instant::now())
        });
        (rx.recv().expect("connected"), waiter)
    };
    // The wait from the push's reply to the element, blocked on each node in turn, against
    // the push's own round trip (a log entry, as the woken client's pop: load on the machine
    // slows both). Medians: a round now and then is slow.
    const ROUNDS: usize = 20;
    let (mut waits, mut pushes) = (Vec::with_capacity(ROUNDS), Vec::with_capacity(ROUNDS));
    for round in 0..ROUNDS {
        let key = format!("{{b}}latency{round}");
        let (_, waiter) = blpop(ports[round % 3], key.clone());
        // About a second of waiting, pushes at phases spread over a poll's pause.
        std::thread::sleep(Duration::from_millis(1_000 + (round as u64 * 37) % 100));
        let sent = Instant::now();
        let _: i64 = redis::cmd("RPUSH")
            .arg(&key)
            .arg(round)
            .query(&mut conns[(round + 1) % 3])
            .expect("RPUSH");
        let pushed = Instant::now();
        let (got, at) = waiter.join().expect("waiter");
        assert_eq!(got.expect("BLPOP"), Some((key, round.to_string())));
        waits.push(at.saturating_duration_since(pushed));
        pushes.push(pushed - sent);
    }
    waits.sort();
    pushes.sort();
    let (wait, push) = (waits[ROUNDS / 2], pushes[ROUNDS / 2]);
    // Woken: about one more log round (the pop) than the push took. Polling after a second
    // of waiting: half its 100 ms pause more, and a read's round.
    assert!(
        wait < push + (push / 2).max(Duration::from_millis(25)),
        "median wait from a push's reply to the pop {wait:?}, median push {push:?}: \
         {waits:?}, {pushes:?}"
    );
    // A waited key that another client turns into a sorted set (COPY, which wakes the
    // client) keeps it waiting, as in Redis 7.0: nil at the timeout, not WRONGTYPE.
    {
        let _: i64 = redis::cmd("ZADD")
            .arg("{b}zsrc")
            .arg(1)
            .arg("m")
            .query(&mut conns[0])
            .expect("ZADD");
        let port = ports[1];
        let waiter = std::thread::spawn(move || {
            let mut c = connect(port).expect("connect");
            redis::cmd("BLPOP")
                .arg("{b}becomes-zset")
                .arg(2)
                .query::<Option<(String, String)>>(&mut c)
        });
        std::thread::sleep(Duration::from_millis(500));
        let copied: i64 = redis::cmd("COPY")
            .arg("{b}zsrc")
            .arg("{b}becomes-zset")
            .query(&mut conns[1])
            .expect("COPY");
        assert_eq!(copied, 1);
        let got = waiter.join().expect("waiter");
        assert_eq!(got.expect("no WRONGTYPE"), None);
    }
    // Three clients blocked on one node, each once the one before waits: served in turn by
    // one push of three elements through another node.
    let blocked = |c: &mut redis::Connection| -> usize {
        let info: String = redis::cmd("INFO")
            .arg("clients")
            .query(c)
            .expect("INFO clients");
        info.lines()
            .find_map(|l| l.strip_prefix("blocked_clients:"))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no blocked_clients: {info}"))
    };
    let mut waiters = Vec::new();
    for i in 0..3 {
        waiters.push(blpop(ports[1], "{b}queue".into()).1);
        let deadline = Instant::now() + Duration::from_secs(10);
        while blocked(&mut conns[1]) < i + 1 {
            assert!(Instant::now() < deadline, "client {i} does not block");
            std::thread::sleep(Duration::from_millis(10));
        }
        // Its first pop (a log entry) is through, it waits: a while, and a write through the
        // partition's log from the same node after it, which load slows as much.
        std::thread::sleep(Duration::from_millis(300));
        let _: () = redis::cmd("SET")
            .arg("{b}marker")
            .arg(i)
            .query(&mut conns[1])
            .expect("SET");
    }
    let _: i64 = redis::cmd("RPUSH")
        .arg("{b}queue")
        .arg(&["first", "second", "third"][..])
        .query(&mut conns[2])
        .expect("RPUSH");
    let served: Vec<Option<(String, String)>> = waiters
        .into_iter()
        .map(|w| w.join().expect("waiter").0.expect("BLPOP"))
        .collect();
    assert_eq!(
        served,
        ["first", "second", "third"].map(|e| Some(("{b}queue".to_string(), e.to_string()))),
    );
    // CLIENT UNBLOCK ends a wait, with an error when asked.
    let (id, waiter) = blpop(ports[0], "{b}never".into());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let unblocked: i64 = redis::cmd("CLIENT")
            .arg("UNBLOCK")
            .arg(id)
            .arg("ERROR")
            .query(&mut conns[0])
            .expect("CLIENT UNBLOCK");
        if unblocked == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "client {id} does not block");
        std::thread::sleep(Duration::from_millis(10));
    }
    let err = waiter.join().expect("waiter").0.expect_err("unblocked");
    assert!(err.to_string().contains("UNBLOCKED"), "{err}");
    // A push in a transaction across partitions wakes too where the key's partition is a
    // participant (its commit installs the commands of its prepared record): the client
    // blocks on its partition's home node; the transaction goes through another node, which
    // coordinates from its own home partition, and pushes last, after writes to the other
    // partitions. Waking by the 1 s poll would make the median wait about half a second.
    let keys = support::keys_per_node(&mut conns[0], 3, 2, "xp");
    let mut waits = Vec::new();
    for round in 0..6 {
        let home = round % 3;
        let target = keys[home][0].clone();
        let (_, waiter) = blpop(ports[home], target.clone());
        std::thread::sleep(Duration::from_millis(300 + (round as u64 * 53) % 200));
        let mut pipe = redis::pipe();
        pipe.atomic();
        for (p, ks) in keys.iter().enumerate() {
            if p != home {
                pipe.cmd("SET").arg(&ks[1]).arg(round).ignore();
            }
        }
        pipe.cmd("RPUSH").arg(&target).arg(round).ignore();
        let via = (home + 1) % 3;
        let _: () = pipe.query(&mut conns[via]).expect("EXEC across partitions");
        let pushed = Instant::now();
        let (got, at) = waiter.join().expect("waiter");
        assert_eq!(got.expect("BLPOP"), Some((target, round.to_string())));
        waits.push(at.saturating_duration_since(pushed));
    }
    waits.sort();
    assert!(
        waits[waits.len() / 2] < Duration::from_millis(250),
        "median wait after a push across partitions: {waits:?}"
    );
    // A blocking pop whose keys are in two partitions (Redis Cluster: CROSSSLOT) waits for a
    // push, here through a third node, and moves the element across the partitions.
    let keys = support::keys_per_node(&mut conns[0], 3, 1, "bx");
    let (src, dst) = (keys[0][0].clone(), keys[1][0].clone());
    let mover = {
        let (port, src, dst) = (ports[2], src.clone(), dst.clone());
        std::thread::spawn(move || {
            let mut c = connect(port).expect("connect");
            redis::cmd("BLMOVE")
                .arg(&src)
                .arg(&dst)
                .arg("LEFT")
                .arg("RIGHT")
                .arg(10)
                .query::<Option<String>>(&mut c)
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let _: i64 = redis::cmd("RPUSH")
        .arg(&src)
        .arg("m")
        .query(&mut conns[1])
        .expect("RPUSH");
    let moved = mover
        .join()
        .expect("mover")
        .expect("BLMOVE across partitions");
    assert_eq!(moved.as_deref(), Some("m"));
    let there: Vec<String> = redis::cmd("LRANGE")
        .arg(&dst)
        .arg(0)
        .arg(-1)
        .query(&mut conns[0])
        .expect("LRANGE");
    assert_eq!(there, ["m"]);
    let left: i64 = redis::cmd("EXISTS")
        .arg(&src)
        .query(&mut conns[0])
        .expect("EXISTS");
    assert_eq!(left, 0);
    // Clients that go while they wait (on one partition, and across two) leave the registry.
    for keys in [vec!["{b}gone"], vec![&src[..], &keys[2][0][..]]] {
        let mut gone = connect(ports[0]).expect("connect");
        gone.set_read_timeout(Some(Duration::from_millis(300)))
            .expect("read timeout");
        let waited = redis::cmd("BLPOP")
            .arg(&keys)
            .arg(0)
            .query::<Option<Vec<String>>>(&mut gone);
        assert!(waited.is_err(), "nothing to pop: {waited:?}");
        drop(gone);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let info: String = redis::cmd("INFO")
                .arg("clients")
                .query(&mut conns[0])
                .expect("INFO");
            if info.contains("blocked_clients:0") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "a client gone from {keys:?} still blocked"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// `keel cluster start`: three processes, one killed with SIGKILL while clients keep
/// writing through the others; it is restarted and catches up; SIGINT stops them all. Then a
/// node started on that data with another `--replicas` refuses to start, with the reason.
#[test]
fn cluster_start_survives_a_killed_node_and_refuses_a_changed_layout() {
    use std::io::BufRead as _;
    use std::process::{Command, Stdio};
    let dir = support::TestDir::new();
    let ports = support::ports(1, 3);
    let child = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args([
            "cluster",
            "start",
            "3",
            "--port",
            &ports[0].to_string(),
            "--dir",
        ])
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn keel cluster start");
    struct Running(std::process::Child);
    impl Drop for Running {
        fn drop(&mut self) {
            if matches!(self.0.try_wait(), Ok(None)) {
                let _ = Command::new("kill")
                    .args(["-INT", &self.0.id().to_string()])
                    .status();
                let _ = self.0.wait();
            }
        }
    }
    let mut running = Running(child);
    let (lines_tx, lines) = std::sync::mpsc::channel::<String>();
    let stdout = running.0.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let _ = lines_tx.send(line);
        }
    });
    let next_line = |what: &str| -> String {
        loop {
            let line = lines
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| panic!("no line with {what:?} within 30 s"));
            if line.contains(what) {
                return line;
            }
        }
    };
    let node2 = next_line("node-2 ");
    let pid: u32 = node2
        .split_whitespace()
        .skip_while(|w| *w != "pid")
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("a pid in {node2:?}"));
    next_line("Ctrl-C");
    let write = |port: u16, key: &str| -> redis::RedisResult<String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let r = connect(port)
                .and_then(|mut c| redis::cmd("SET").arg(key).arg(key).query::<String>(&mut c));
            match r {
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                r => return r,
            }
        }
    };
    for i in 0..30 {
        write(ports[i % 3], &format!("before{i}")).expect("a write before the kill");
    }
    let status = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    for i in 0..30 {
        let port = [ports[0], ports[2]][i % 2];
        write(port, &format!("after{i}")).expect("a write with node-2 dead");
    }
    next_line("node-2 restarted");
    // The restarted node serves every key written, the ones from while it was down too.
    for i in 0..30 {
        let key = format!("after{i}");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let got = connect(ports[1])
                .and_then(|mut c| redis::cmd("GET").arg(&key).query::<Option<String>>(&mut c));
            match got {
                Ok(v) => {
                    assert_eq!(v.as_deref(), Some(key.as_str()));
                    break;
                }
                Err(e) if Instant::now() > deadline => panic!("{key} unreadable: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }
    let status = Command::new("kill")
        .args(["-INT", &running.0.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    next_line("stopping 3 nodes");
    let status = running.0.wait().expect("wait");
    assert!(status.success(), "keel cluster start exited with {status}");

    // node-1's data says its partitions live on three nodes: --replicas 2 is refused.
    let stderr = refused_start(&dir.path().join("node-1"), &ports, 2);
    assert!(
        stderr.contains("its data was replicated on n1,n2,n3")
            && stderr.contains("place it on n1,n2"),
        "{stderr}"
    );
}

/// Starts node 1 of the cluster on `ports` over `dir` with `--replicas replicas`, expecting
/// it to refuse; what it wrote to stderr.
fn refused_start(dir: &std::path::Path, ports: &[u16], replicas: usize) -> String {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_keel"));
    command
        .args(["serve", "--port", &ports[0].to_string()])
        .args([
            "--replicas",
            &replicas.to_string(),
            "--cluster-myself",
            "n1",
        ])
        .arg("--dir")
        .arg(dir);
    for (i, port) in ports.iter().enumerate() {
        let (start, end) = keel_server::cluster_map::membership::even_range(i, ports.len());
        command
            .arg("--cluster-node")
            .arg(format!("n{},127.0.0.1:{port},{start}-{end}", i + 1));
    }
    let out = command.output().expect("keel serve");
    assert!(!out.status.success(), "keel serve started");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A node whose data directory holds data written without `--replicas` refuses to start
/// replicated (the log would be applied over data no entry made, and the replicas differ).
#[test]
fn data_written_without_replicas_is_refused() {
    let dir = support::TestDir::new();
    let ports = support::ports(3, 2);
    let mut node = Node::start(dir.path(), 0, &ports);
    // A key of node 1's slots (0-8191), written on node 1 without replication.
    let mut c = connect(ports[0]).expect("connect");
    let _: () = redis::cmd("SET")
        .arg("{b}k")
        .arg("v")
        .query(&mut c)
        .expect("SET");
    drop(c);
    node.signal("-TERM");
    node.wait();
    let stderr = refused_start(&node.dir, &ports, 2);
    assert!(
        stderr.contains("holds data written without --replicas"),
        "{stderr}"
    );
}

/// `--replicas` out of range, or without a cluster, is refused before anything starts.
#[test]
fn bad_replicas_are_refused() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["serve", "--durability", "none", "--replicas", "3"])
        .output()
        .expect("keel serve");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--replicas needs --cluster"), "{stderr}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["serve", "--durability", "none", "--replicas", "4"])
        .args(["--cluster-node", "n1,127.0.0.1:7001,0-8000"])
        .args(["--cluster-node", "n2,127.0.0.1:7002,8001-16383"])
        .args(["--cluster-myself", "n1"])
        .output()
        .expect("keel serve");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("replicas must be between 1 and the number of cluster nodes (2), not 4"),
        "{stderr}"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["cluster", "start", "2", "--replicas", "3", "--port", "1"])
        .output()
        .expect("keel cluster start");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--replicas must be between 1 and the number of nodes (2), not 3"),
        "{stderr}"
    );
}

/// `f`'s answer, asked again (up to 20 s) while it fails. For the healthy cluster of the test
/// below, whose 300 ms cluster timeout a leader misses now and then on a loaded machine (a
/// checkpoint just taken, the CI's other tests), which answers `TRYAGAIN` or `CLUSTERDOWN`:
/// what the checks read is the answer, not how soon it came. Only for commands that may run
/// twice.
fn answered<T>(what: &str, mut f: impl FnMut() -> redis::RedisResult<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match f() {
            Ok(answer) => return answer,
            Err(e) if Instant::now() > deadline => panic!("{what}: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Pipelined commands reply as if run one by one. A node cut off from the majority of its
/// partition's replicas (here: the other two are killed) refuses writes and linearizable reads with `CLUSTERDOWN`, but serves a `READONLY`
/// connection from its own copy, as a Redis replica serves its slots.
#[test]
fn a_minority_refuses_writes_and_linearizable_reads_but_serves_readonly() {
    let dir = support::TestDir::new();
    let ports = support::ports(2, 3);
    // No --replicas: three nodes keep three copies by default.
    let extra = ["--cluster-timeout-ms", "300"];
    let mut nodes: Vec<Node> = (0..3)
        .map(|i| Node::start_with(dir.path(), i, &ports, &extra))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let set = connect(ports[0])
            .and_then(|mut c| redis::cmd("SET").arg("k").arg("v1").query::<String>(&mut c));
        match set {
            Ok(_) => break,
            Err(e) if Instant::now() > deadline => panic!("no write within 20 s: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query(&mut connect(ports[1]).expect("connect"))
        .expect("INFO");
    assert!(info.contains("keel_replicas:3"), "{info}");
    // Every node answers a linearizable read (elections at start may still be settling).
    for &port in &ports {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let got = connect(port)
                .and_then(|mut c| redis::cmd("GET").arg("k").query::<Option<String>>(&mut c));
            match got {
                Ok(v) => {
                    assert_eq!(v.as_deref(), Some("v1"));
                    break;
                }
                Err(e) if Instant::now() > deadline => panic!("no read within 20 s: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }
    // FLUSHALL empties every partition in one transaction across them, and the partitions
    // keep working (their replication records are not data). One partition here holds more
    // keys than one transaction deletes: then every partition is flushed in batches.
    {
        let mut c = connect(ports[1]).expect("connect");
        let mut pipe = redis::pipe();
        for i in 0..30 {
            pipe.cmd("SET").arg(format!("f{i}")).arg(i).ignore();
        }
        for from in (0..70_000).step_by(10_000) {
            let mut mset = redis::cmd("MSET");
            for i in from..from + 10_000 {
                mset.arg(format!("{{big}}:{i}")).arg("v");
            }
            pipe.add_command(mset).ignore();
        }
        // Every partition has elected a leader once all of these are written.
        let deadline = Instant::now() + Duration::from_secs(20);
        while let Err(e) = pipe.query::<()>(&mut c) {
            assert!(Instant::now() < deadline, "sets: {e}");
            std::thread::sleep(Duration::from_millis(100));
        }
        let err = redis::cmd("FLUSHALL")
            .arg("LATER")
            .query::<String>(&mut c)
            .expect_err("a bad argument");
        assert!(err.to_string().contains("syntax error"), "{err}");
        let ok: String = redis::cmd("FLUSHALL").query(&mut c).expect("FLUSHALL");
        assert_eq!(ok, "OK");
        for &port in &ports {
            let mut c = connect(port).expect("connect");
            let (left, n) = answered("MGET, DBSIZE", || {
                redis::cmd("MGET")
                    .arg((0..30).map(|i| format!("f{i}")).collect::<Vec<_>>())
                    .query::<Vec<Option<String>>>(&mut c)
                    .and_then(|left| Ok((left, redis::cmd("DBSIZE").query::<i64>(&mut c)?)))
            });
            assert!(left.iter().all(Option::is_none), "{left:?}");
            assert_eq!(n, 0, "node on {port} still holds keys");
        }
        let set = redis::cmd("SET").arg("k").arg("v1").query::<String>(&mut c);
        assert_eq!(set.expect("a write after FLUSHALL"), "OK");
    }
    // SAVE on a replicated node is a snapshot of each partition it keeps, written before
    // the answer; LASTSAVE then says when; BGSAVE takes them in the background.
    {
        let mut c = connect(ports[1]).expect("connect");
        let before = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs() as i64;
        let ok: String = redis::cmd("SAVE").query(&mut c).expect("SAVE");
        assert_eq!(ok, "OK");
        for p in 0..3 {
            let file = dir.path().join(format!("node-2/raft-{p}/snapshot"));
            let written = std::fs::metadata(&file)
                .and_then(|m| m.modified())
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let written = written
                .duration_since(std::time::UNIX_EPOCH)
                .expect("after 1970")
                .as_secs() as i64;
            assert!(
                written >= before,
                "{} is older than the SAVE",
                file.display()
            );
        }
        let last: i64 = redis::cmd("LASTSAVE").query(&mut c).expect("LASTSAVE");
        assert!(last >= before, "LASTSAVE {last}, SAVE at {before}");
        let started: String = redis::cmd("BGSAVE").query(&mut c).expect("BGSAVE");
        assert!(started.starts_with("Background saving"), "{started}");
    }
    // WAIT: how many replicas besides the leader hold every write the connection sent,
    // on the partitions it wrote to; no more than a partition has, at once.
    {
        let mut c = connect(ports[0]).expect("connect");
        answered("SET", || {
            redis::cmd("SET").arg("w1").arg("v").query::<()>(&mut c)
        });
        // CI at 2a22458 saw this one miss the timeout just after the `BGSAVE` above.
        answered("MSET", || {
            redis::cmd("MSET")
                .arg("w2")
                .arg("v")
                .arg("{big}w3")
                .arg("v")
                .query::<()>(&mut c)
        });
        let n: i64 = redis::cmd("WAIT")
            .arg(2)
            .arg(10_000)
            .query(&mut c)
            .expect("WAIT");
        assert_eq!(n, 2, "both other replicas of each partition written");
        let began = Instant::now();
        let n: i64 = redis::cmd("WAIT")
            .arg(3)
            .arg(0)
            .query(&mut c)
            .expect("WAIT");
        assert!(n <= 2, "{n} replicas besides the leader, of three");
        assert!(began.elapsed() < Duration::from_secs(5), "WAIT 3 0 waited");
        // Inside MULTI it answers at once, as Redis does: the replicas holding the writes
        // before the EXEC.
        let (n, v): (i64, String) = redis::pipe()
            .atomic()
            .cmd("WAIT")
            .arg(3)
            .arg(0)
            .cmd("GET")
            .arg("w1")
            .query(&mut c)
            .expect("MULTI with WAIT");
        assert!(
            (0..=2).contains(&n),
            "{n} replicas besides the leader, of three"
        );
        assert_eq!(v, "v");
        let e = redis::cmd("WAIT")
            .arg(1)
            .arg(-1)
            .query::<i64>(&mut c)
            .expect_err("a negative timeout");
        assert!(e.to_string().contains("timeout is negative"), "{e}");
        // SWAPDB inside MULTI: Redis Cluster's refusal as one element of EXEC's reply, the
        // rest applied, alone or beside commands of a partition.
        for with_key in [true, false] {
            let mut commands = vec![redis::cmd("SWAPDB").arg(0).arg(1).clone()];
            if with_key {
                commands.push(redis::cmd("SET").arg("swapped").arg("v").clone());
            }
            // Errors inside EXEC's reply as values (redis-rs makes the first one the reply).
            let mut pipe = redis::pipe();
            pipe.ignore_errors().cmd("MULTI");
            for command in &commands {
                pipe.add_command(command.clone());
            }
            let mut all: Vec<redis::Value> = pipe.cmd("EXEC").query(&mut c).expect("EXEC");
            let Some(redis::Value::Array(replies)) = all.pop() else {
                panic!("{all:?}")
            };
            assert_eq!(replies.len(), commands.len(), "{replies:?}");
            assert!(
                matches!(&replies[0], redis::Value::ServerError(e)
                    if e.details() == Some("SWAPDB is not allowed in cluster mode")),
                "{replies:?}"
            );
            if with_key {
                assert_eq!(replies[1], redis::Value::Okay);
            }
        }
        let v: String = redis::cmd("GET").arg("swapped").query(&mut c).expect("GET");
        assert_eq!(v, "v");
    }
    // Multi-key commands whose keys span partitions, inside MULTI: split key by key into
    // the partitions' parts of one transaction, their replies merged as Redis gives them.
    {
        let mut c = connect(ports[1]).expect("connect");
        let keys = support::keys_per_node(&mut c, 3, 1, "multikey");
        let (x, y, z) = (&keys[0][0], &keys[1][0], &keys[2][0]);
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("MSET")
            .arg(x)
            .arg("1")
            .arg(y)
            .arg("2")
            .arg(x)
            .arg("3")
            .cmd("SET")
            .arg(z)
            .arg("4")
            .cmd("MGET")
            .arg(&[x, y, z, &"missing-key".to_owned()])
            .cmd("EXISTS")
            .arg(&[x, y, z, x])
            .cmd("DEL")
            .arg(&[y, z])
            .cmd("MGET")
            .arg(&[y, x]);
        type Replies = (
            String,
            String,
            Vec<Option<String>>,
            i64,
            i64,
            Vec<Option<String>>,
        );
        let (ok, set, got, exists, deleted, after): Replies = pipe
            .query(&mut c)
            .expect("EXEC with multi-key commands across partitions");
        assert_eq!((ok.as_str(), set.as_str()), ("OK", "OK"));
        assert_eq!(
            got,
            [Some("3".into()), Some("2".into()), Some("4".into()), None],
            "the later value of x in one MSET wins, as in Redis"
        );
        assert_eq!((exists, deleted), (4, 2));
        assert_eq!(after, [None, Some("3".into())]);
    }
    // WATCH: each watched key's partition checks it at EXEC, in one transaction with the
    // commands wherever they are; a write to it, or its deadline passing, aborts the EXEC.
    {
        let mut c = connect(ports[0]).expect("connect");
        let mut other = connect(ports[2]).expect("connect");
        let keys = support::keys_per_node(&mut c, 3, 1, "watched");
        let (x, y, z) = (&keys[0][0], &keys[1][0], &keys[2][0]);
        let exec = |c: &mut redis::Connection, watch: &[&String], incr: &String| {
            if !watch.is_empty() {
                redis::cmd("WATCH")
                    .arg(watch)
                    .query::<()>(c)
                    .expect("WATCH");
            }
            redis::cmd("MULTI").query::<()>(c).expect("MULTI");
            redis::cmd("INCR").arg(incr).query::<()>(c).expect("queued");
            redis::cmd("EXEC")
                .query::<Option<Vec<i64>>>(c)
                .expect("EXEC")
        };
        // Unchanged: applies (the commands on another partition than the watched keys).
        assert_eq!(exec(&mut c, &[x, y], z), Some(vec![1]));
        // Written by another client between WATCH and EXEC: aborts.
        redis::cmd("WATCH")
            .arg(y)
            .query::<()>(&mut c)
            .expect("WATCH");
        redis::cmd("SET")
            .arg(y)
            .arg(7)
            .query::<()>(&mut other)
            .expect("SET");
        redis::cmd("MULTI").query::<()>(&mut c).expect("MULTI");
        redis::cmd("INCR")
            .arg(z)
            .query::<()>(&mut c)
            .expect("queued");
        let aborted: Option<Vec<i64>> = redis::cmd("EXEC").query(&mut c).expect("EXEC");
        assert_eq!(aborted, None, "a write to a watched key aborts EXEC");
        // A write to another key does not.
        redis::cmd("WATCH")
            .arg(x)
            .query::<()>(&mut c)
            .expect("WATCH");
        redis::cmd("SET")
            .arg(y)
            .arg(8)
            .query::<()>(&mut other)
            .expect("SET");
        redis::cmd("MULTI").query::<()>(&mut c).expect("MULTI");
        redis::cmd("INCR")
            .arg(x)
            .query::<()>(&mut c)
            .expect("queued");
        let applied: Option<Vec<i64>> = redis::cmd("EXEC").query(&mut c).expect("EXEC");
        assert_eq!(applied, Some(vec![1]));
        // A watched key whose deadline passes before EXEC counts as changed, as in Redis.
        // The WATCH must come before the deadline, which a loaded machine can miss: then
        // again.
        for tries in 1.. {
            let set = Instant::now();
            redis::cmd("SET")
                .arg(y)
                .arg(1)
                .arg("PX")
                .arg(300)
                .query::<()>(&mut other)
                .expect("SET");
            redis::cmd("WATCH")
                .arg(y)
                .query::<()>(&mut c)
                .expect("WATCH");
            if set.elapsed() < Duration::from_millis(300) {
                break;
            }
            redis::cmd("UNWATCH").query::<()>(&mut c).expect("UNWATCH");
            assert!(tries < 20, "never watched {y} within 300 ms of setting it");
        }
        std::thread::sleep(Duration::from_millis(400));
        redis::cmd("MULTI").query::<()>(&mut c).expect("MULTI");
        redis::cmd("INCR")
            .arg(z)
            .query::<()>(&mut c)
            .expect("queued");
        let expired: Option<Vec<i64>> = redis::cmd("EXEC").query(&mut c).expect("EXEC");
        assert_eq!(expired, None, "a watched key that expired aborts EXEC");
        // UNWATCH forgets; WATCH inside MULTI is refused as by Redis.
        redis::cmd("WATCH")
            .arg(x)
            .query::<()>(&mut c)
            .expect("WATCH");
        redis::cmd("UNWATCH").query::<()>(&mut c).expect("UNWATCH");
        redis::cmd("SET")
            .arg(x)
            .arg(1)
            .query::<()>(&mut other)
            .expect("SET");
        assert_eq!(exec(&mut c, &[], x), Some(vec![2]));
        redis::cmd("MULTI").query::<()>(&mut c).expect("MULTI");
        let err = redis::cmd("WATCH")
            .arg(x)
            .query::<()>(&mut c)
            .expect_err("WATCH inside MULTI");
        assert!(
            err.to_string()
                .contains("WATCH inside MULTI is not allowed"),
            "{err}"
        );
        redis::cmd("DISCARD").query::<()>(&mut c).expect("DISCARD");
        let z_now: i64 = redis::cmd("GET").arg(z).query(&mut c).expect("GET");
        assert_eq!(z_now, 1, "only the first EXEC incremented {z}");
    }
    // Blocking pops: served at once when there is something, woken by a push through
    // another node, nil at the timeout.
    {
        let mut c = connect(ports[0]).expect("connect");
        let served: Option<(String, String)> = redis::cmd("BLPOP")
            .arg("{q}absent")
            .arg("{q}list")
            .arg(0.2)
            .query(&mut c)
            .expect("BLPOP");
        assert_eq!(served, None, "nil at the timeout");
        let pusher = std::thread::spawn({
            let port = ports[2];
            move || {
                std::thread::sleep(Duration::from_millis(300));
                let mut c = connect(port).expect("connect");
                redis::cmd("RPUSH")
                    .arg("{q}list")
                    .arg("woken")
                    .query::<i64>(&mut c)
                    .expect("RPUSH")
            }
        });
        let started = Instant::now();
        let served: Option<(String, String)> = redis::cmd("BLPOP")
            .arg("{q}absent")
            .arg("{q}list")
            .arg(5)
            .query(&mut c)
            .expect("BLPOP");
        pusher.join().expect("pusher");
        assert_eq!(served, Some(("{q}list".into(), "woken".into())));
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        let moved: Option<String> = redis::cmd("BLMOVE")
            .arg("{q}list")
            .arg("{q}other")
            .arg("LEFT")
            .arg("RIGHT")
            .arg(0.1)
            .query(&mut c)
            .expect("BLMOVE");
        assert_eq!(moved, None);
    }
    // Pipelines: a run of commands on one partition is one log entry; one that fails runs
    // again command by command, so the replies and effects are those of one by one.
    {
        let mut c = connect(ports[1]).expect("connect");
        let _: () = redis::cmd("SET")
            .arg("{t}s")
            .arg("text")
            .query(&mut c)
            .expect("SET");
        let replies: Vec<redis::Value> = redis::pipe()
            .ignore_errors()
            .cmd("SET")
            .arg("{t}a")
            .arg(1)
            .cmd("INCR")
            .arg("{t}s")
            .cmd("INCR")
            .arg("{t}a")
            .cmd("SET")
            .arg("other")
            .arg("x")
            .cmd("GET")
            .arg("{t}a")
            .cmd("GET")
            .arg("other")
            .query(&mut c)
            .expect("a pipeline");
        assert_eq!(replies.len(), 6, "{replies:?}");
        assert_eq!(replies[0], redis::Value::Okay);
        assert!(
            matches!(&replies[1], redis::Value::ServerError(e) if e.details().unwrap_or("").contains("not an integer")),
            "{replies:?}"
        );
        assert_eq!(replies[2], redis::Value::Int(2));
        assert_eq!(replies[3], redis::Value::Okay);
        assert_eq!(replies[4], redis::Value::BulkString(b"2".to_vec()));
        assert_eq!(replies[5], redis::Value::BulkString(b"x".to_vec()));
        let n: i64 = (0..100)
            .fold(&mut redis::pipe(), |p, _| p.cmd("INCR").arg("{t}n"))
            .query::<Vec<i64>>(&mut c)
            .expect("100 INCRs")
            .into_iter()
            .max()
            .unwrap_or(0);
        assert_eq!(n, 100);
    }
    std::thread::sleep(Duration::from_millis(500));
    nodes[1].kill_9();
    nodes[2].kill_9();
    let mut c = connect(ports[0]).expect("connect");
    let e = redis::cmd("SET")
        .arg("k")
        .arg("v2")
        .query::<String>(&mut c)
        .expect_err("a minority must not take a write");
    assert_eq!(e.code(), Some("CLUSTERDOWN"), "{e}");
    let e = redis::cmd("GET")
        .arg("k")
        .query::<Option<String>>(&mut c)
        .expect_err("a minority cannot prove a read is current");
    assert_eq!(e.code(), Some("CLUSTERDOWN"), "{e}");
    let ok: String = redis::cmd("READONLY").query(&mut c).expect("READONLY");
    assert_eq!(ok, "OK");
    let v: Option<String> = redis::cmd("GET")
        .arg("k")
        .query(&mut c)
        .expect("READONLY GET");
    assert_eq!(v.as_deref(), Some("v1"));
    let e = redis::cmd("SET")
        .arg("k")
        .arg("v3")
        .query::<String>(&mut c)
        .expect_err("READONLY does not make writes local");
    assert_eq!(e.code(), Some("CLUSTERDOWN"), "{e}");
    // The majority back: writes again, and the refused ones never happened.
    nodes[1].spawn();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut c = connect(ports[0]).expect("connect");
        match redis::cmd("GET").arg("k").query::<Option<String>>(&mut c) {
            Ok(v) => {
                assert_eq!(v.as_deref(), Some("v1"));
                break;
            }
            Err(e) if Instant::now() > deadline => panic!("no leader again within 20 s: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Network namespaces for a partition test: one per node, each joined by a veth pair to a
/// bridge in a "switch" namespace, and this process (the clients) on the same bridge through
/// a veth pair from its own namespace. A partition moves nodes' switch ports to a second
/// bridge, or off any bridge; removed (nodes first) on drop.
#[cfg(feature = "netns")]
struct Netns {
    tag: String,
    n: usize,
    hosts: Vec<std::net::IpAddr>,
}

#[cfg(feature = "netns")]
impl Netns {
    fn ip(args: &str) {
        let out = std::process::Command::new("ip")
            .args(args.split_whitespace())
            .output()
            .unwrap_or_else(|e| {
                panic!("running ip {args}: {e} (the netns feature needs iproute2)")
            });
        assert!(
            out.status.success(),
            "ip {args}: {} (the netns feature needs root)",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn new(n: usize) -> Netns {
        let pid = std::process::id();
        let tag = format!("k{}", pid % 100_000);
        let net = 200 + (pid % 50) as u8;
        let sw = format!("{tag}sw");
        let hosts = (0..n)
            .map(|i| std::net::IpAddr::from([10, 213, net, i as u8 + 1]))
            .collect();
        let me = Netns { tag, n, hosts };
        Netns::ip(&format!("netns add {sw}"));
        for br in ["br0", "br1"] {
            Netns::ip(&format!("-n {sw} link add {br} type bridge"));
            Netns::ip(&format!("-n {sw} link set {br} up"));
        }
        for i in 0..n {
            let ns = me.ns(i);
            Netns::ip(&format!("netns add {ns}"));
            Netns::ip(&format!(
                "link add eth0 netns {ns} type veth peer name p{i} netns {sw}"
            ));
            Netns::ip(&format!(
                "-n {ns} addr add 10.213.{net}.{}/24 dev eth0",
                i + 1
            ));
            Netns::ip(&format!("-n {ns} link set eth0 up"));
            Netns::ip(&format!("-n {ns} link set lo up"));
            Netns::ip(&format!("-n {sw} link set p{i} master br0"));
            Netns::ip(&format!("-n {sw} link set p{i} up"));
        }
        let client = format!("{}c", me.tag);
        Netns::ip(&format!(
            "link add {client} type veth peer name pc netns {sw}"
        ));
        Netns::ip(&format!("addr add 10.213.{net}.100/24 dev {client}"));
        Netns::ip(&format!("link set {client} up"));
        Netns::ip(&format!("-n {sw} link set pc master br0"));
        Netns::ip(&format!("-n {sw} link set pc up"));
        me
    }

    fn ns(&self, i: usize) -> String {
        format!("{}n{i}", self.tag)
    }

    /// Node `i` reaches nobody, and nobody reaches it.
    fn isolate(&self, i: usize) {
        Netns::ip(&format!("-n {}sw link set p{i} nomaster", self.tag));
    }

    /// The nodes of `group` reach each other only; the clients stay with the rest.
    fn split(&self, group: &[usize]) {
        for i in group {
            Netns::ip(&format!("-n {}sw link set p{i} master br1", self.tag));
        }
    }

    fn heal(&self) {
        for i in 0..self.n {
            Netns::ip(&format!("-n {}sw link set p{i} master br0", self.tag));
        }
    }
}

#[cfg(feature = "netns")]
impl Drop for Netns {
    fn drop(&mut self) {
        let quiet = |args: String| {
            let _ = std::process::Command::new("ip")
                .args(args.split_whitespace())
                .output();
        };
        quiet(format!("link del {}c", self.tag));
        for i in 0..self.n {
            quiet(format!("netns del {}", self.ns(i)));
        }
        quiet(format!("netns del {}sw", self.tag));
    }
}

/// How long each network partition of the test below lasts at least.
#[cfg(feature = "netns")]
const PARTITION_MS: u64 = 5000;
/// How long into a partition the majority must be committing (ns): its election, and
/// requests in flight to a node cut off timing out, come first.
#[cfg(feature = "netns")]
const LATE_NS: u64 = 2_500_000_000;
/// How much longer than `PARTITION_MS` a partition may last while the majority has not
/// committed past `LATE_NS` (then the test fails).
#[cfg(feature = "netns")]
const PARTITION_WAIT: Duration = Duration::from_secs(30);

/// Five nodes in network namespaces, `--replicas 3`, Elle list-append clients on the
/// bridge: a partition's leader is cut off from everyone for `PARTITION_MS`, then two nodes
/// are split from the three the clients reach for as long. Nothing acknowledged is lost, the
/// history is strictly serializable, and the majority side commits during each partition.
#[cfg(feature = "netns")]
#[test]
fn replicated_cluster_serves_from_the_majority_through_network_partitions() {
    let net = Netns::new(NODES);
    let dir = support::TestDir::new();
    let nodes: Vec<Node> = (0..NODES)
        .map(|i| {
            Node::start_in_netns(
                dir.path(),
                i,
                &net.hosts,
                7001,
                &net.ns(i),
                // A request forwarded to a node cut off fails (and is retried elsewhere)
                // within 500 ms.
                &["--replicas", "3", "--cluster-timeout-ms", "500"],
            )
        })
        .collect();
    let addrs: Vec<SocketAddr> = nodes.iter().map(Node::addr).collect();
    let (report, commits, windows) = elle_under_faults(&addrs, 200, |cluster| {
        let ns_now = || cluster.epoch.elapsed().as_nanos() as u64;
        std::thread::sleep(Duration::from_millis(1500));
        let slot = cluster.slot(&cluster.keys[0][0]);
        let leader = leader_of(addrs[(1) % NODES], slot).expect("a leader");
        net.isolate(leader);
        cluster.avoid.store(1 << leader, Ordering::Relaxed);
        let cut = ns_now();
        // Long enough that the check below, after the election, covers 2.5 s: clients
        // stuck on a partition without a majority wait out their retries meanwhile. On a
        // loaded machine, on until the majority committed after those 2.5 s.
        std::thread::sleep(Duration::from_millis(PARTITION_MS));
        cluster.wait_commit_after(cut + LATE_NS, PARTITION_WAIT);
        net.heal();
        cluster.avoid.store(0, Ordering::Relaxed);
        let healed = ns_now();
        std::thread::sleep(Duration::from_millis(2000));
        let slot2 = cluster.slot(&cluster.keys[2][0]);
        let leader2 = leader_of(addrs[0], slot2).expect("a leader");
        let minority = [leader2, (leader2 + 1) % NODES];
        net.split(&minority);
        cluster
            .avoid
            .store((1 << minority[0]) | (1 << minority[1]), Ordering::Relaxed);
        let split = ns_now();
        // As above.
        std::thread::sleep(Duration::from_millis(PARTITION_MS));
        cluster.wait_commit_after(split + LATE_NS, PARTITION_WAIT);
        net.heal();
        cluster.avoid.store(0, Ordering::Relaxed);
        let healed2 = ns_now();
        std::thread::sleep(Duration::from_millis(2000));
        [(cut, healed), (split, healed2)]
    });
    let summary = format!("{report:?}; commits {}", commits.len());
    assert!(report.committed > 200, "{summary}");
    // The majority side served: commits in each partition after its first 2.5 s (the
    // election it needed, and requests in flight to a node cut off timing out).
    let second = |t: u64| t / 1_000_000_000;
    let mut per_second = std::collections::BTreeMap::new();
    for &t in &commits {
        *per_second.entry(second(t)).or_insert(0) += 1;
    }
    let windows_s: Vec<(f64, f64)> = windows
        .iter()
        .map(|&(a, b)| (a as f64 / 1e9, b as f64 / 1e9))
        .collect();
    let summary =
        format!("{summary}; partitions at {windows_s:.1?} s; commits per second {per_second:?}");
    println!("{summary}");
    for (from, to) in windows {
        let late = from + LATE_NS;
        let during = commits.iter().filter(|&&t| t >= late && t <= to).count();
        assert!(
            during > 0,
            "no commit in a partition after its first 2.5 s; {summary}"
        );
    }
    drop(nodes);
}

//! The simulation of `sim` with transactions across partitions: [`PARTS`] Raft groups, each
//! on the same `n` nodes, under the same nemesis (a crash takes down a node's replica of every
//! group; the network's cuts, loss and delays are the nodes', so every group meets them).
//!
//! Clients run Elle list-append transactions over keys spread across the partitions (key `k` is
//! partition `k % PARTS`'s). One that touches a single partition is an `EXEC` on its leader
//! (retried while a prepared transaction locks its keys, as the server does); one that touches
//! several runs through the real driver, `txn::run_across`, on a node of the cluster: the
//! simulation's [`Driver`] is its `txn::Net`, calling a partition's leader through the same faulty
//! network (a cut link refuses or loses the request, a lost answer is an unknown outcome). Drivers
//! die on purpose: their node crashes, or a random one is killed at a random time or step of its
//! transaction (before its k-th request, or once that request applied), and then it sends nothing
//! more (its requests already sent still arrive). Every live node runs `txn::resolve_once` every
//! `txn::RESOLVE_EVERY`, as the server does, which finishes what dead drivers left. Bank clients
//! move money between accounts of different partitions the same way, and audit every account in
//! one transaction across all partitions.
//!
//! Checked once every fault is healed, the clients stopped and the resolvers had time:
//!
//! 1. the whole history (unknown outcomes resolved by the final state, all-or-nothing across
//!    partitions) is strictly serializable;
//! 2. every acknowledged append is in the final state, no element twice, and each partition's
//!    replicas are identical;
//! 3. `sim`'s checks of state machine safety and leaders, per partition;
//! 4. each partition takes a write within `RECOVERY_MS` of healing, and within [`SETTLE_MS`]
//!    no replica holds a prepared transaction, a lock or a commit decision;
//! 5. every committed audit, and the final balances, sum to the opening total.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use openraft::ServerState;
use parking_lot::Mutex;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};

use super::history::{self, Op, Outcome, TxnRecord};
use super::{
    Book, Mutation, Net, RECOVERY_MS, Rng, Sim, check_history, decode, nemesis, parse_exec,
    request, resp_value, seeds,
};
use crate::replica::txn::{self, Limits, Work};
use crate::replica::{Refused, Request, Response, RunError, Status, TxnId, prepared};

/// Partitions (Raft groups), each on every node.
const PARTS: usize = 3;
/// Simulated time the nemesis runs for.
const FAULT_MS: u64 = 15_000;
/// List keys the clients use, spread over the partitions.
const KEYS: u32 = 9;
/// Client tasks.
const CLIENTS: usize = 6;
/// The cluster timeout the drivers see (a transaction's deadline is three).
const TIMEOUT_MS: u64 = 2_000;
/// Chance a driver is killed during its transaction.
const KILL_PER_MILLE: u64 = 100;
/// Once healed, within this (simulated) time no transaction is left prepared or decided.
const SETTLE_MS: u64 = 30_000;
/// Bank accounts, spread over the partitions, and what each holds at the start.
const ACCOUNTS: usize = 6;
const OPENING: i64 = 100;
/// Bank clients (transfers and audits), beside the list-append ones.
const BANKERS: usize = 2;
/// What an unknown outcome's error says.
const MAYBE: &str = "may or may not have happened";

/// Seeds every CI run checks (3 nodes, then 5).
const SEEDS_3: &[u64] = &[1, 2, 3, 4, 5, 6];
const SEEDS_5: &[u64] = &[101];

fn part_of(key: u32) -> usize {
    key as usize % PARTS
}

/// The simulation's groups, and what the clients saw.
struct World {
    groups: Vec<Arc<Sim>>,
    book: Mutex<Book>,
    /// Names the drivers' transactions: each driver is one run of a node.
    incarnations: AtomicU64,
    killed: AtomicU64,
    across: AtomicU64,
    /// Audits that saw the opening total.
    audits: AtomicU64,
    /// Coordinator partitions asked by a resolver for a decision.
    resolves: Arc<AtomicU64>,
}

/// A transaction driver (or resolver) running on node `home`: the `txn::Net` of the
/// simulation. Dead once killed or once its node crashed: it sends nothing more.
struct Driver {
    groups: Vec<Arc<Sim>>,
    home: usize,
    /// The run of `home` it belongs to.
    life: Option<u64>,
    killed: AtomicBool,
    /// Per partition, the node believed to lead it.
    guess: Mutex<Vec<usize>>,
    rng: Mutex<Rng>,
    incarnation: u64,
    seq: AtomicU64,
    /// Counts the decisions asked, if this is a node's resolver.
    resolver: Option<Arc<AtomicU64>>,
    /// Requests sent.
    calls: AtomicU64,
    /// Dies at its `k`th request: before sending it (`false`), or once it applied, before
    /// the answer is seen (`true`).
    die_at: Option<(u64, bool)>,
}

/// How one request to a node ended.
enum Sent {
    Answer(Response),
    /// Not appended: refused by a node that does not lead, or never sent.
    NotLeader(Option<u64>),
    /// Sent, and no answer came back.
    Lost,
}

impl Driver {
    fn new(world: &World, home: usize, seed: u64) -> Driver {
        // As the server: the leader this node knows of, else itself.
        let guess = world
            .groups
            .iter()
            .map(|g| {
                g.raft(home)
                    .and_then(|r| r.metrics().borrow().current_leader)
                    .map_or(home, |l| l as usize)
            })
            .collect();
        Driver {
            groups: world.groups.clone(),
            home,
            life: world.groups[0].up(home).map(|u| u.life),
            killed: AtomicBool::new(false),
            guess: Mutex::new(guess),
            rng: Mutex::new(Rng::new(seed)),
            incarnation: world.incarnations.fetch_add(1, Ordering::Relaxed),
            seq: AtomicU64::new(0),
            resolver: None,
            calls: AtomicU64::new(0),
            die_at: None,
        }
    }

    fn alive(&self) -> bool {
        !self.killed.load(Ordering::SeqCst)
            && self
                .life
                .is_some_and(|l| self.groups[0].alive(self.home as u64, l))
    }

    /// Never returns once the driver is dead.
    async fn gone(&self) {
        if !self.alive() {
            std::future::pending::<()>().await;
        }
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(TIMEOUT_MS)
    }

    /// After `target` did not take a request for partition `p`: its hint, or another node.
    fn next_guess(&self, p: usize, target: usize, hint: Option<u64>) {
        let n = self.groups[p].n;
        let next = hint
            .map(|h| h as usize)
            .filter(|&h| h < n && h != target)
            .unwrap_or_else(|| (target + 1 + self.rng.lock().below(n as u64 - 1) as usize) % n);
        self.guess.lock()[p] = next;
    }

    /// One message's fate on the link `from` → `to`: refused (cut, and the connection
    /// refused), lost, or delivered after a delay.
    fn link(&self, from: usize, to: usize) -> Result<Duration, bool> {
        if from == to {
            return Ok(Duration::ZERO);
        }
        let mut net = self.groups[0].net.lock();
        let p = net.drop_per_mille;
        let (cut, lost, refused) = (net.cut[from][to], net.rng.chance(p), net.rng.chance(500));
        if cut && refused {
            return Err(true);
        }
        if cut || lost {
            return Err(false);
        }
        Ok(net.delay())
    }

    /// Sends `request` to `target` as partition `p`'s leader, through the network.
    async fn send(&self, p: usize, target: usize, request: &Request, read: bool) -> Sent {
        let sim = &self.groups[p];
        let began = Instant::now();
        let Some(up) = sim.up(target) else {
            return Sent::NotLeader(None);
        };
        match self.link(self.home, target) {
            Ok(delay) => sleep(delay).await,
            Err(true) => return Sent::NotLeader(None),
            Err(false) => {
                sleep(self.timeout()).await;
                return Sent::Lost;
            }
        }
        let part = sim.part(target, up);
        let submitted = tokio::time::timeout(self.timeout(), part.submit(request.clone(), read));
        let res = submitted.await;
        let answer = match res {
            Ok(Ok(response)) => Sent::Answer(response),
            Ok(Err(Refused::NotLeader(hint))) => Sent::NotLeader(hint),
            // The node stopped while it had the request, or did not answer in time.
            Ok(Err(Refused::Failed(_) | Refused::RolledBack | Refused::Stopped(_))) | Err(_) => {
                return Sent::Lost;
            }
        };
        match self.link(target, self.home) {
            Ok(delay) => sleep(delay).await,
            Err(_) => {
                tokio::time::sleep_until(began + self.timeout()).await;
                return Sent::Lost;
            }
        }
        answer
    }

    /// A linearizable read of partition `p` (retried while its keys are locked); `None` if
    /// none answered by `deadline`.
    async fn read(&self, p: usize, request: &Request, deadline: Instant) -> Option<Vec<u8>> {
        loop {
            let target = self.guess.lock()[p];
            match self.send(p, target, request, true).await {
                Sent::Answer(r) if r.status == Status::Busy => {}
                Sent::Answer(r) => return Some(r.reply),
                Sent::NotLeader(hint) => self.next_guess(p, target, hint),
                Sent::Lost => self.next_guess(p, target, None),
            }
            if Instant::now() >= deadline {
                return None;
            }
            sleep(crate::replica::RETRY_PAUSE).await;
        }
    }

    /// A write of partition `p`, retried while its keys are locked (as `Replication::run`
    /// does): the reply, or whether the outcome is unknown.
    async fn write(self: &Arc<Self>, p: usize, request: &Request) -> Result<Vec<u8>, bool> {
        let deadline = Instant::now() + self.timeout() * 3;
        let mut backoff = Duration::from_millis(1);
        loop {
            match txn::Net::call(&**self, p, request.clone(), deadline).await {
                Ok(r) if r.status == Status::Busy && Instant::now() < deadline => {
                    sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(20));
                }
                Ok(r) if matches!(r.status, Status::Busy | Status::Failed) => return Err(false),
                Ok(r) => return Ok(r.reply),
                Err(RunError::Unknown(_)) => return Err(true),
                Err(_) => return Err(false),
            }
        }
    }
}

impl txn::Net for Driver {
    async fn call(
        &self,
        p: usize,
        request: Request,
        deadline: Instant,
    ) -> Result<Response, RunError> {
        if let Some(resolves) = &self.resolver
            && matches!(request.op, crate::replica::Op::Resolve { .. })
        {
            resolves.fetch_add(1, Ordering::Relaxed);
            if self.groups[0].mutation == Mutation::RogueResolver {
                return Ok(Response {
                    status: Status::Aborted,
                    ..Response::default()
                });
            }
        }
        let k = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
        if self.die_at == Some((k, false)) {
            self.killed.store(true, Ordering::SeqCst);
        }
        loop {
            self.gone().await;
            let target = self.guess.lock()[p];
            let sent = self.send(p, target, &request, false).await;
            if self.die_at == Some((k, true)) && matches!(sent, Sent::Answer(_)) {
                self.killed.store(true, Ordering::SeqCst);
            }
            self.gone().await;
            let hint = match sent {
                Sent::Answer(response) => return Ok(response),
                Sent::Lost => {
                    return Err(RunError::Unknown(format!(
                        "TRYAGAIN keel: partition {p}'s leader did not answer; the write {MAYBE}"
                    )));
                }
                Sent::NotLeader(hint) => hint,
            };
            self.next_guess(p, target, hint);
            if Instant::now() >= deadline {
                return Err(RunError::Failed(format!(
                    "CLUSTERDOWN The cluster is down: partition {p} has no leader this node \
                     can reach"
                )));
            }
            sleep(crate::replica::RETRY_PAUSE).await;
        }
    }

    fn leads(&self, p: usize) -> bool {
        self.groups[p]
            .raft(self.home)
            .is_some_and(|r| r.metrics().borrow().state == ServerState::Leader)
    }

    fn knows_leader(&self, p: usize) -> bool {
        self.groups[p]
            .raft(self.home)
            .is_some_and(|r| r.metrics().borrow().current_leader.is_some())
    }

    fn led(&self) -> Vec<(usize, prepared::Shared)> {
        self.groups
            .iter()
            .enumerate()
            .filter_map(|(p, g)| {
                let up = g.up(self.home)?;
                let leads = up.raft.metrics().borrow().state == ServerState::Leader;
                leads.then_some((p, up.locks))
            })
            .collect()
    }

    fn timeout(&self) -> Duration {
        Driver::timeout(self)
    }

    fn now_ms(&self) -> u64 {
        self.groups[0].now_ms()
    }

    fn learn(&self, moved: &[(u16, usize)]) {
        self.groups[0].violation(format!("slots moved, and none was: {moved:?}"));
    }

    fn owner(&self, _slot: u16) -> usize {
        unreachable!("the simulation moves no slots")
    }

    fn next_txn(&self) -> TxnId {
        TxnId {
            node: self.home as u16,
            incarnation: self.incarnation,
            seq: self.seq.fetch_add(1, Ordering::Relaxed),
        }
    }
}

/// The operations of a transaction across partitions, from each partition's replies (one
/// per command: a `GET` of each key, then an `APPEND` if it has an element).
fn parse_across(
    replies: &[Vec<Vec<u8>>],
    parts: &BTreeMap<usize, Vec<(u32, Option<u64>)>>,
) -> Result<Vec<Op>, String> {
    if replies.len() != parts.len() {
        return Err(format!(
            "{} partitions' replies for {parts:?}",
            replies.len()
        ));
    }
    let mut ops = Vec::new();
    for ((p, plan), replies) in parts.iter().zip(replies) {
        let mut each = replies.iter();
        let mut next = || {
            let reply = each
                .next()
                .ok_or_else(|| format!("too few replies from partition {p}"))?;
            let mut at = 0;
            let value = resp_value(reply, &mut at)?;
            if at != reply.len() {
                return Err(format!("a reply {:?}", String::from_utf8_lossy(reply)));
            }
            Ok::<_, String>(value)
        };
        for &(key, append) in plan {
            let value = next()?;
            ops.push(Op::Read {
                key,
                value: decode(value.as_deref())?,
            });
            if let Some(elem) = append {
                next()?;
                ops.push(Op::Append { key, elem });
            }
        }
        if each.next().is_some() {
            return Err(format!("too many replies from partition {p}"));
        }
    }
    Ok(ops)
}

/// Until the driver is dead: killed after `kill`, or its node crashed.
async fn watch(driver: &Driver, kill: Option<Duration>) {
    let began = Instant::now();
    loop {
        if kill.is_some_and(|k| began.elapsed() >= k) {
            driver.killed.store(true, Ordering::SeqCst);
            return;
        }
        if !driver.alive() {
            return;
        }
        sleep(Duration::from_millis(10)).await;
    }
}

/// One client: transactions until `stop`, each recorded in the book.
async fn client(
    world: Arc<World>,
    c: usize,
    seed: u64,
    stop: Arc<AtomicBool>,
    elems: Arc<AtomicU64>,
) {
    let mut rng = Rng::new(seed.wrapping_mul(37).wrapping_add(c as u64 + 1));
    let sim = Arc::clone(&world.groups[0]);
    let limits = Limits {
        resp3: false,
        bulk_bytes_max: 512 << 20,
        reply_bytes_max: 1 << 30,
    };
    let mut t = 0;
    while !stop.load(Ordering::SeqCst) {
        sleep(rng.ms(5, 60)).await;
        // The node it talks to, which drives the transaction.
        let home = rng.below(sim.n as u64) as usize;
        if sim.up(home).is_none() {
            continue;
        }
        let mut driver = Driver::new(&world, home, rng.next());
        // Killed at a random time, or at a random step of the protocol.
        let mut kill = None;
        if rng.chance(KILL_PER_MILLE) {
            if rng.chance(500) {
                kill = Some(rng.ms(0, 300));
            } else {
                driver.die_at = Some((1 + rng.below(4), rng.chance(500)));
            }
        }
        let driver = Arc::new(driver);
        let mut keys: Vec<u32> = (0..1 + rng.below(3))
            .map(|_| rng.below(u64::from(KEYS)) as u32)
            .collect();
        keys.sort_unstable();
        keys.dedup();
        let name = format!("c{c}.{t}");
        t += 1;
        let read = rng.chance(200);
        let mut parts: BTreeMap<usize, Vec<(u32, Option<u64>)>> = BTreeMap::new();
        for &k in &keys {
            let append = !read && rng.chance(750);
            let elem = append.then(|| elems.fetch_add(1, Ordering::SeqCst));
            parts.entry(part_of(k)).or_default().push((k, elem));
        }
        let appends: Vec<Op> = parts
            .values()
            .flatten()
            .filter_map(|&(key, e)| e.map(|elem| Op::Append { key, elem }))
            .collect();
        let began = sim.now();
        // The operations it did; `Err(true)`: unknown, `Err(false)`: nothing applied.
        let attempt = async {
            if parts.len() == 1 {
                let (&p, plan) = parts.iter().next().expect("one partition");
                let request = request(plan);
                if read {
                    let deadline = Instant::now() + driver.timeout() * 3;
                    match driver.read(p, &request, deadline).await {
                        Some(reply) => Ok(parse_exec(&reply, plan)),
                        None => Err(false),
                    }
                } else {
                    driver
                        .write(p, &request)
                        .await
                        .map(|reply| parse_exec(&reply, plan))
                }
            } else {
                world.across.fetch_add(1, Ordering::Relaxed);
                let work: Work = parts
                    .iter()
                    .map(|(&p, plan)| (p, request(plan).commands))
                    .collect();
                match txn::run_across(&driver, work, limits).await {
                    Ok(replies) => Ok(parse_across(&replies, &parts)),
                    Err(txn::AcrossError::Failed(text)) => Err(text.contains(MAYBE)),
                    // Every partition owns every key here: nothing moves.
                    Err(txn::AcrossError::Moved) => {
                        sim.violation(format!("{name}: a partition answered moved"));
                        Err(false)
                    }
                }
            }
        };
        let seen: Result<Result<Vec<Op>, String>, bool> = tokio::select! {
            seen = attempt => seen,
            () = watch(&driver, kill) => {
                world.killed.fetch_add(1, Ordering::Relaxed);
                Err(true)
            }
        };
        let ended = sim.now();
        let mut book = world.book.lock();
        match seen {
            // Now and then the answer is lost on its way to the client.
            Ok(_) if !read && rng.chance(20) => book.unknown.push((name, appends, began)),
            Ok(Ok(ops)) => book.records.push(TxnRecord {
                name,
                ops,
                outcome: Outcome::Committed,
                position: None,
                read_ts: None,
                time: Some((began, ended)),
            }),
            Ok(Err(e)) => sim.violation(format!("{name}: {e}")),
            Err(_) if read => {}
            Err(true) => book.unknown.push((name, appends, began)),
            Err(false) => book.records.push(TxnRecord {
                name,
                ops: appends,
                outcome: Outcome::Aborted,
                position: None,
                read_ts: None,
                time: Some((began, ended)),
            }),
        }
    }
}

fn account(a: usize) -> Vec<u8> {
    format!("acct{a}").into_bytes()
}

/// The partition of account `a`.
fn bank_part(a: usize) -> usize {
    a % PARTS
}

/// The balances in `replies` (a `GET` of each account, partition by partition as in
/// [`audit_work`]).
fn balances(replies: &[Vec<Vec<u8>>]) -> Result<Vec<i64>, String> {
    let mut all = Vec::new();
    for reply in replies.iter().flatten() {
        let mut at = 0;
        let value = resp_value(reply, &mut at)?.ok_or("an account is missing")?;
        let text = String::from_utf8_lossy(&value);
        all.push(text.parse().map_err(|_| format!("a balance {text:?}"))?);
    }
    Ok(all)
}

/// A `GET` of every account, grouped by partition.
fn audit_work() -> Work {
    (0..PARTS)
        .map(|p| {
            let gets = (0..ACCOUNTS)
                .filter(|&a| bank_part(a) == p)
                .map(|a| vec![b"GET".to_vec(), account(a)])
                .collect();
            (p, gets)
        })
        .collect()
}

/// Opens the accounts: `OPENING` in each, written before any client starts.
async fn open_accounts(world: &World, seed: u64) -> Result<(), String> {
    let driver = Arc::new(Driver::new(world, 0, seed));
    for p in 0..PARTS {
        let commands: Vec<Vec<Vec<u8>>> = (0..ACCOUNTS)
            .filter(|&a| bank_part(a) == p)
            .map(|a| {
                vec![
                    b"SET".to_vec(),
                    account(a),
                    OPENING.to_string().into_bytes(),
                ]
            })
            .collect();
        let opening = Request {
            commands,
            ..request(&[])
        };
        let deadline = Instant::now() + Duration::from_millis(RECOVERY_MS);
        loop {
            match txn::Net::call(&*driver, p, opening.clone(), deadline).await {
                Ok(r) if r.status == Status::Done => break,
                Ok(r) => return Err(format!("opening the accounts answered {r:?}")),
                // Written again: the same values.
                Err(RunError::Unknown(_)) => {}
                Err(e) => return Err(format!("opening the accounts: {e:?}")),
            }
        }
    }
    Ok(())
}

/// One bank client until `stop`: transfers between accounts of different partitions (its
/// driver killed now and then), and audits of every account that must see the opening
/// total.
async fn banker(world: Arc<World>, b: usize, seed: u64, stop: Arc<AtomicBool>) {
    let mut rng = Rng::new(seed.wrapping_mul(41).wrapping_add(b as u64 + 100));
    let sim = Arc::clone(&world.groups[0]);
    let total = OPENING * ACCOUNTS as i64;
    let limits = Limits {
        resp3: false,
        bulk_bytes_max: 512 << 20,
        reply_bytes_max: 1 << 30,
    };
    while !stop.load(Ordering::SeqCst) {
        sleep(rng.ms(5, 60)).await;
        let home = rng.below(sim.n as u64) as usize;
        if sim.up(home).is_none() {
            continue;
        }
        let mut driver = Driver::new(&world, home, rng.next());
        let mut kill = None;
        if rng.chance(KILL_PER_MILLE) {
            if rng.chance(500) {
                kill = Some(rng.ms(0, 300));
            } else {
                driver.die_at = Some((1 + rng.below(4), rng.chance(500)));
            }
        }
        let driver = Arc::new(driver);
        if rng.chance(300) {
            let result = tokio::select! {
                result = txn::run_across(&driver, audit_work(), limits) => result,
                () = watch(&driver, kill) => continue,
            };
            if let Ok(replies) = result {
                match balances(&replies) {
                    Ok(all) if all.iter().sum::<i64>() == total => {
                        world.audits.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(all) => sim.violation(format!(
                        "an audit saw {all:?}, which sum to {}, not {total}",
                        all.iter().sum::<i64>()
                    )),
                    Err(e) => sim.violation(format!("an audit: {e}")),
                }
            }
            continue;
        }
        let from = rng.below(ACCOUNTS as u64) as usize;
        let to = (from + 1 + rng.below(ACCOUNTS as u64 - 1) as usize) % ACCOUNTS;
        let amount = (1 + rng.below(20)).to_string().into_bytes();
        let mut work: Work = vec![
            (
                bank_part(from),
                vec![vec![b"DECRBY".to_vec(), account(from), amount.clone()]],
            ),
            (
                bank_part(to),
                vec![vec![b"INCRBY".to_vec(), account(to), amount.clone()]],
            ),
        ];
        if work[0].0 == work[1].0 {
            // One partition: one `EXEC`.
            let (p, mut commands) = work.remove(0);
            commands.extend(work.remove(0).1);
            let transfer = Request {
                commands,
                ..request(&[])
            };
            tokio::select! {
                _ = driver.write(p, &transfer) => {}
                () = watch(&driver, kill) => {}
            }
        } else {
            tokio::select! {
                _ = txn::run_across(&driver, work, limits) => {}
                () = watch(&driver, kill) => {
                    world.killed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

/// Every node's resolver, as the server's `resolve_loop`: `txn::resolve_once` every
/// `txn::RESOLVE_EVERY` on each node that is up (one at a time per node; a crash of the node
/// ends its run).
async fn resolvers(world: Arc<World>, seed: u64, stop: Arc<AtomicBool>) {
    let n = world.groups[0].n;
    let mut running: Vec<Option<(u64, JoinHandle<()>)>> = (0..n).map(|_| None).collect();
    let mut rng = Rng::new(seed ^ 0x7265_736f_6c76);
    while !stop.load(Ordering::SeqCst) {
        sleep(txn::RESOLVE_EVERY).await;
        for (i, slot) in running.iter_mut().enumerate() {
            let life = world.groups[0].up(i).map(|u| u.life);
            if let Some((l, handle)) = slot {
                if Some(*l) != life {
                    handle.abort();
                } else if !handle.is_finished() {
                    continue;
                }
                *slot = None;
            }
            if let Some(life) = life {
                let driver = Arc::new(Driver {
                    resolver: Some(Arc::clone(&world.resolves)),
                    ..Driver::new(&world, i, rng.next())
                });
                *slot = Some((
                    life,
                    tokio::spawn(async move { txn::resolve_once(&driver).await }),
                ));
            }
        }
    }
    for (_, handle) in running.into_iter().flatten() {
        handle.abort();
    }
}

/// What one run did, for its line of output.
#[derive(Debug)]
#[allow(dead_code)]
struct Summary {
    acknowledged: usize,
    unknown: usize,
    across: u64,
    killed: u64,
    audits: u64,
    resolves: u64,
    history: history::Report,
    recovery_ms: u64,
    settle_ms: u64,
    crashes: u64,
    crashes_installing: u64,
    installs: u64,
    snapshots: u64,
    chunks: u64,
    chunks_refused: u64,
    dropped: u64,
    two_leader_terms: usize,
}

/// Runs one seed on `n` nodes: faults, then the checks; a description of what broke.
fn run(seed: u64, n: usize, mutation: Mutation) -> Result<Summary, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime");
    rt.block_on(simulate(seed, n, mutation))
}

/// The transactions, prepared records, locks and decisions some replica still holds.
fn unsettled(groups: &[Arc<Sim>]) -> Vec<String> {
    let mut left = Vec::new();
    for g in groups {
        for i in 0..g.n {
            let Some(up) = g.up(i) else {
                left.push(format!("partition {}: node {i} is down", g.part));
                continue;
            };
            let locks = up.locks.lock();
            let (prepared, decided) = (locks.prepared(), locks.decided());
            if !prepared.is_empty() || !decided.is_empty() || locks.locked_keys() != 0 {
                left.push(format!(
                    "partition {} node {i}: prepared {prepared:?}, decided {:?}, {} keys locked",
                    g.part,
                    decided.iter().map(|(t, _)| t).collect::<Vec<_>>(),
                    locks.locked_keys()
                ));
            }
        }
    }
    left
}

async fn simulate(seed: u64, n: usize, mutation: Mutation) -> Result<Summary, String> {
    let net = Arc::new(Mutex::new(Net::new(seed, n)));
    let epoch = Instant::now();
    let groups: Vec<Arc<Sim>> = (0..PARTS)
        .map(|p| Sim::new(n, p, mutation, Arc::clone(&net), epoch))
        .collect();
    for g in &groups {
        *g.groups.lock() = groups.iter().map(Arc::downgrade).collect();
    }
    for i in 0..n {
        for g in &groups {
            g.start(i).await;
        }
    }
    let world = Arc::new(World {
        groups: groups.clone(),
        book: Mutex::default(),
        incarnations: AtomicU64::new(1),
        killed: AtomicU64::new(0),
        across: AtomicU64::new(0),
        audits: AtomicU64::new(0),
        resolves: Arc::default(),
    });
    open_accounts(&world, seed).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let elems = Arc::new(AtomicU64::new(1));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            tokio::spawn(client(
                Arc::clone(&world),
                c,
                seed,
                Arc::clone(&stop),
                Arc::clone(&elems),
            ))
        })
        .collect();
    let bankers: Vec<_> = (0..BANKERS)
        .map(|b| tokio::spawn(banker(Arc::clone(&world), b, seed, Arc::clone(&stop))))
        .collect();
    let stop_resolving = Arc::new(AtomicBool::new(false));
    let resolving = tokio::spawn(resolvers(
        Arc::clone(&world),
        seed,
        Arc::clone(&stop_resolving),
    ));
    nemesis(&groups, seed, FAULT_MS).await?;

    // 4. Healed: each partition takes a write within RECOVERY_MS.
    let healed = Instant::now();
    let prober = Arc::new(Driver::new(&world, 0, seed));
    for p in 0..PARTS {
        let probe = Request {
            commands: vec![vec![b"SET".to_vec(), b"probe".to_vec(), b"1".to_vec()]],
            exec: false,
            ..request(&[])
        };
        loop {
            let deadline = healed + Duration::from_millis(RECOVERY_MS);
            match txn::Net::call(&*prober, p, probe.clone(), deadline).await {
                Ok(r) if r.reply == b"+OK\r\n" => break,
                Ok(r) => return Err(format!("partition {p}'s probe write answered {r:?}")),
                Err(RunError::Unknown(_)) if Instant::now() < deadline => {}
                Err(_) => {
                    for g in &groups {
                        g.stopped()?;
                    }
                    return Err(format!(
                        "partition {p}: no write committed within {RECOVERY_MS} ms of healing \
                         every fault"
                    ));
                }
            }
        }
    }
    let recovery_ms = healed.elapsed().as_millis() as u64;
    stop.store(true, Ordering::SeqCst);
    for c in clients.into_iter().chain(bankers) {
        if let Err(e) = c.await {
            std::panic::resume_unwind(e.into_panic());
        }
    }

    // Nothing left prepared, locked or decided once the resolvers had time.
    let settling = Instant::now();
    loop {
        let left = unsettled(&groups);
        if left.is_empty() {
            break;
        }
        for g in &groups {
            g.stopped()?;
        }
        if settling.elapsed() > Duration::from_millis(SETTLE_MS) {
            return Err(format!(
                "transactions not settled {SETTLE_MS} ms after the clients stopped:\n{}",
                left.join("\n")
            ));
        }
        sleep(Duration::from_millis(200)).await;
    }
    let settle_ms = settling.elapsed().as_millis() as u64;
    for g in &groups {
        g.catch_up().await?;
    }

    // The final state, read linearizably from each partition's leader.
    let final_began = groups[0].now();
    let mut finals = Vec::new();
    for p in 0..PARTS {
        let plan: Vec<(u32, Option<u64>)> = (0..KEYS)
            .filter(|&k| part_of(k) == p)
            .map(|k| (k, None))
            .collect();
        let deadline = Instant::now() + Duration::from_millis(RECOVERY_MS);
        let reply = prober
            .read(p, &request(&plan), deadline)
            .await
            .ok_or_else(|| format!("partition {p}: no final read"))?;
        finals.extend(parse_exec(&reply, &plan).map_err(|e| format!("the final read: {e}"))?);
    }
    let final_ended = groups[0].now();
    // The bank's final balances.
    let mut balances = Vec::new();
    for (p, gets) in audit_work() {
        let reading = Request {
            commands: gets,
            ..request(&[])
        };
        let deadline = Instant::now() + Duration::from_millis(RECOVERY_MS);
        let reply = prober
            .read(p, &reading, deadline)
            .await
            .ok_or_else(|| format!("partition {p}: no final read of the accounts"))?;
        let header = format!("*{}\r\n", reading.commands.len());
        let mut at = header.len();
        if !reply.starts_with(header.as_bytes()) {
            return Err(format!("the final read of the accounts: {reply:?}"));
        }
        for _ in &reading.commands {
            let value = resp_value(&reply, &mut at)?.unwrap_or_default();
            let text = String::from_utf8_lossy(&value);
            balances.push(
                text.parse::<i64>()
                    .map_err(|_| format!("a balance {text:?}"))?,
            );
        }
    }
    stop_resolving.store(true, Ordering::SeqCst);
    let _ = resolving.await;
    let left = unsettled(&groups);
    for g in &groups {
        for i in 0..n {
            if let Some(raft) = g.raft(i) {
                let _ = raft.shutdown().await;
            }
        }
    }

    let mut violations = left;
    if balances.iter().sum::<i64>() != OPENING * ACCOUNTS as i64 {
        violations.push(format!(
            "the accounts end with {balances:?}, which sum to {}, not {}",
            balances.iter().sum::<i64>(),
            OPENING * ACCOUNTS as i64
        ));
    }
    // 3. and 2.: per partition, state machine safety and identical replicas.
    for g in &groups {
        violations.extend(std::mem::take(&mut *g.violations.lock()));
        violations.extend(g.differing());
    }
    let book = std::mem::take(&mut *world.book.lock());
    let (report, acknowledged, unknown) =
        check_history(book, finals, (final_began, final_ended), &mut violations);
    if !violations.is_empty() {
        return Err(violations.join("\n"));
    }
    let sum = |f: fn(&Sim) -> &AtomicU64| -> u64 {
        groups.iter().map(|g| f(g).load(Ordering::Relaxed)).sum()
    };
    Ok(Summary {
        acknowledged,
        unknown,
        across: world.across.load(Ordering::Relaxed),
        killed: world.killed.load(Ordering::Relaxed),
        audits: world.audits.load(Ordering::Relaxed),
        resolves: world.resolves.load(Ordering::Relaxed),
        history: report.expect("checked"),
        recovery_ms,
        settle_ms,
        // Every group of a node crashes with it.
        crashes: groups[0].stats.crashes.load(Ordering::Relaxed),
        crashes_installing: sum(|g| &g.stats.crashes_installing),
        installs: sum(|g| &g.stats.installs),
        snapshots: sum(|g| &g.stats.snapshots),
        chunks: sum(|g| &g.stats.chunks),
        chunks_refused: sum(|g| &g.stats.chunks_refused),
        dropped: sum(|g| &g.stats.dropped),
        two_leader_terms: groups
            .iter()
            .map(|g| g.leaders.lock().values().filter(|l| l.len() > 1).count())
            .sum(),
    })
}

fn run_seeds(n: usize, fixed: &[u64]) {
    for seed in seeds(fixed) {
        let began = std::time::Instant::now();
        match run(seed, n, Mutation::None) {
            Ok(summary) => println!(
                "seed {seed} ({n} nodes, {PARTS} partitions): ok in {} ms: {summary:?}",
                began.elapsed().as_millis()
            ),
            Err(e) => panic!(
                "seed {seed} ({n} nodes, {PARTS} partitions) failed; replay with \
                 KEEL_SIM_SEED={seed}:\n{e}"
            ),
        }
    }
}

#[test]
fn transactions_across_partitions_survive_seeded_faults() {
    run_seeds(3, SEEDS_3);
}

#[test]
fn transactions_across_five_nodes_survive_seeded_faults() {
    run_seeds(5, SEEDS_5);
}

/// The checks catch prepared transactions that lock nothing (what another transaction
/// writes between a prepare and its commit makes the prepare's reads stale, and an audit
/// may see a transfer half done).
#[test]
fn the_checks_catch_prepares_that_lock_nothing() {
    let caught = [1u64, 2, 3]
        .iter()
        .find_map(|&seed| run(seed, 3, Mutation::IgnoreLocks).err())
        .expect("no seed caught prepares that lock nothing");
    println!("{}", &caught[..caught.len().min(600)]);
    assert!(caught.contains("not strictly serializable"), "{caught}");
}

/// The checks catch resolvers that abort what they find prepared without asking the
/// coordinator partition (which may have decided commit): a transaction half applied.
#[test]
fn the_checks_catch_a_resolver_that_does_not_ask() {
    let caught = [1u64, 2, 3]
        .iter()
        .find_map(|&seed| run(seed, 3, Mutation::RogueResolver).err())
        .expect("no seed caught a resolver that does not ask");
    println!("{}", &caught[..caught.len().min(600)]);
}

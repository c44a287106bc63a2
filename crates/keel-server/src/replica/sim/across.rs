//! The simulation of `sim` with transactions across partitions: [`PARTS`] Raft groups, each
//! on the same `n` nodes, under the same nemesis (a crash takes down a node's replica of every
//! group; the network's cuts, loss and delays are the nodes', so every group meets them).
//!
//! Clients run Elle list-append transactions over keys spread across the partitions (key `k`'s
//! slot is partition `k % PARTS`'s in the config, [`config_owner`]), and a mover moves those
//! slots between partitions with the real driver (`txn::move_slots`), killed now and then as
//! the clients' drivers are: every node answers `Moved` for a slot it does not own, and the
//! clients, like the server, learn where it went and plan their transactions again. One that touches a single partition is an `EXEC` on its leader
//! (retried while a prepared transaction locks its keys, as the server does); one that touches
//! several runs through the real driver, `txn::run_across`, on a node of the cluster: the
//! simulation's [`Driver`] is its `txn::Net`, calling a partition's leader through the same faulty
//! network (a cut link refuses or loses the request, a lost answer is an unknown outcome; a
//! single partition's write carries an id and its deadline and is sent again after a lost
//! answer, as `Replication::call` does). The network also delivers writes late, after their
//! sender gave up: a request it lost (any step, or a write with an id), up to 20 s later, and a
//! held-back copy of every write whose answer it lost, as a kernel resends what a socket
//! still held once a partition heals, or a stopped node reads its socket when it resumes.
//! Drivers die on purpose: their node crashes, or a random one is killed at a random time or step of its
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
//! 5. every committed audit, and the final balances, sum to the opening total;
//! 6. every key is held by the partition that owns its slot and by no other, and every
//!    account keeps the TTL it was opened with.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use openraft::ServerState;
use parking_lot::Mutex;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};

use super::history::{self, Op, Outcome, TxnRecord};
use super::{
    Book, Mutation, Net, RECOVERY_MS, Rng, Sim, SlotOwners, check_history, decode, key_name,
    nemesis, parse_exec, read_command, request, resp_value, seeds,
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
/// The accounts' expiry (Unix ms, 2100): after the simulated clock (entries run at their
/// leader's, from 2023) and the real one (reads outside a transaction judge expiry by it).
const ACCOUNT_EXPIRY_MS: u64 = 4_102_444_800_000;
/// Bank clients (transfers and audits), beside the list-append ones.
const BANKERS: usize = 2;
/// What an unknown outcome's error says.
const MAYBE: &str = "may or may not have happened";
/// Chance a write the network lost is delivered anyway, later (a kernel resending what a
/// socket its process gave up on still held, a stopped node reading its socket when it
/// resumes); chance a write with an id whose answer was lost is delivered again later (the
/// copy its sender sends again, held back); how much later, at most.
const LATE_PER_MILLE: u64 = 500;
const AGAIN_PER_MILLE: u64 = 1000;
const LATE_MS_MAX: u64 = 20_000;
/// How much longer than its sender's window a partition keeps a write's answer here: the
/// least the late refusal's slack allows (the server keeps it `REQUEST_KEEP_MARGIN_MS`), so
/// that late deliveries may meet answers already swept.
const KEEP_MARGIN_MS: u64 = crate::replica::LATE_SLACK_MS + 1_000;

/// Seeds every CI run checks (3 nodes, then 5).
const SEEDS_3: &[u64] = &[1, 2, 3, 4, 5, 6];
const SEEDS_5: &[u64] = &[101];

/// How long a slot move that goes in chunks may take (the server's ten minutes would keep
/// a move's records past the checks' [`SETTLE_MS`]).
const CHUNKED_SPAN_MS: u64 = 8_000;
/// Mean pause between two slot moves (simulated ms).
const MOVE_EVERY_MS: u64 = 400;

fn slot(key: &[u8]) -> u16 {
    keel_cluster::key_slot(key).0
}

/// The partition a probe key's slot stays with (no move takes it).
fn probe(p: usize) -> Vec<u8> {
    format!("probe{p}").into_bytes()
}

/// The keys a move may take, with the partition the config gives each: the clients' list keys
/// (`k % PARTS`) and the bank's accounts (`a % PARTS`).
fn movable() -> Vec<(Vec<u8>, usize)> {
    (0..KEYS)
        .map(|k| (key_name(k), k as usize % PARTS))
        .chain((0..ACCOUNTS).map(|a| (account(a), a % PARTS)))
        .collect()
}

/// The config's owner of every slot: each key of the simulation's where [`movable`] and
/// [`probe`] put it, any other slot `slot % PARTS`. Panics if two keys meant for different
/// partitions share a slot.
fn config_owner() -> SlotOwners {
    let mut table: HashMap<u16, usize> = HashMap::new();
    let probes = (0..PARTS).map(|p| (probe(p), p));
    for (key, p) in movable().into_iter().chain(probes) {
        let was = table.insert(slot(&key), p);
        assert!(
            was.is_none_or(|q| q == p),
            "{} shares a slot with a key of another partition",
            String::from_utf8_lossy(&key)
        );
    }
    Arc::new(move |s| table.get(&s).copied().unwrap_or(usize::from(s) % PARTS))
}

/// How a request to one partition failed.
#[derive(Debug, PartialEq)]
enum Miss {
    /// It may have applied.
    Unknown,
    /// Nothing applied.
    Nothing,
    /// Nothing applied: its slots are elsewhere (learned); plan it again.
    Moved,
}

/// Plans run again after a `Moved` before a client gives up on its transaction.
const REPLANS: usize = 8;

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
    owners: SlotOwners,
    /// Per node, the slots it learned moved, and where: the server's `Replication::learn`.
    learned: Arc<Vec<Mutex<BTreeMap<u16, usize>>>>,
    /// Slot moves that ended moved, and those that failed (or whose driver died).
    moves: AtomicU64,
    moves_failed: AtomicU64,
    /// Each move tried, when, and how it ended: printed with a failure.
    move_log: Mutex<Vec<String>>,
    /// Transactions planned again after a `Moved`.
    replans: AtomicU64,
    late: Arc<Late>,
}

/// Requests the network delivers after their sender gave up on them.
#[derive(Default)]
struct Late {
    /// Still to come: the final checks wait for them.
    pending: AtomicU64,
    delivered: AtomicU64,
    /// Refused as late (`Part::submit_until`).
    refused: AtomicU64,
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
    owners: SlotOwners,
    learned: Arc<Vec<Mutex<BTreeMap<u16, usize>>>>,
    late: Arc<Late>,
}

/// Submits `request` to `part`: a write with a deadline as the server's `KEEL.RAFT p
/// write@<until>` does.
async fn submit(
    part: &crate::replica::Part,
    request: Request,
    read: bool,
    until: Option<u64>,
) -> Result<Response, Refused> {
    match until {
        Some(until) if !read => part.submit_until(request, until).await,
        _ => part.submit(request, read).await,
    }
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
            owners: Arc::clone(&world.owners),
            learned: Arc::clone(&world.learned),
            late: Arc::clone(&world.late),
        }
    }

    /// The partition that owns `key`'s slot, as this driver's node knows.
    fn owner_of(&self, key: &[u8]) -> usize {
        txn::Net::owner(self, slot(key))
    }

    /// Learns the slots a `Moved` answer names.
    fn learn_from(&self, response: &Response) {
        let moved: Vec<(u16, usize)> = postcard::from_bytes(&response.reply).unwrap_or_default();
        txn::Net::learn(self, &moved);
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

    /// Sends `request` to `target` as partition `p`'s leader, through the network; a write
    /// with an id goes with its sender's deadline, `until` (simulated Unix ms).
    async fn send(
        &self,
        p: usize,
        target: usize,
        request: &Request,
        read: bool,
        until: Option<u64>,
    ) -> Sent {
        let sim = &self.groups[p];
        let began = Instant::now();
        let Some(up) = sim.up(target) else {
            return Sent::NotLeader(None);
        };
        match self.link(self.home, target) {
            Ok(delay) => sleep(delay).await,
            Err(true) => return Sent::NotLeader(None),
            Err(false) => {
                // Every write the server forwards has an id, or is a step of a transaction
                // across partitions (the simulation's opening and probe writes have none).
                let stepped =
                    request.id.is_some() || !matches!(request.op, crate::replica::Op::Run);
                if !read && stepped && self.rng.lock().chance(LATE_PER_MILLE) {
                    self.deliver_late(p, target, request, until);
                }
                sleep(self.timeout()).await;
                return Sent::Lost;
            }
        }
        let part = sim.part(target, up);
        let submitted =
            tokio::time::timeout(self.timeout(), submit(&part, request.clone(), read, until));
        let res = submitted.await;
        let answer = match res {
            Ok(Ok(response)) => Sent::Answer(response),
            Ok(Err(Refused::NotLeader(hint))) => Sent::NotLeader(hint),
            // The node stopped while it had the request, or did not answer in time.
            Ok(Err(
                Refused::Failed(_) | Refused::RolledBack | Refused::Stopped(_) | Refused::Late(_),
            ))
            | Err(_) => {
                if request.id.is_some() && self.rng.lock().chance(AGAIN_PER_MILLE) {
                    self.deliver_late(p, target, request, until);
                }
                return Sent::Lost;
            }
        };
        match self.link(target, self.home) {
            Ok(delay) => sleep(delay).await,
            Err(_) => {
                // Its sender sends it again (`call_tracked`), and the network may hold that
                // copy back: delivered later, after the sender gave up.
                if request.id.is_some() && self.rng.lock().chance(AGAIN_PER_MILLE) {
                    self.deliver_late(p, target, request, until);
                }
                tokio::time::sleep_until(began + self.timeout()).await;
                return Sent::Lost;
            }
        }
        answer
    }

    /// Delivers `request` to `target`'s replica of partition `p` later (if that replica still
    /// runs then), whatever became of its sender.
    fn deliver_late(&self, p: usize, target: usize, request: &Request, until: Option<u64>) {
        let sim = Arc::clone(&self.groups[p]);
        let Some(life) = sim.up(target).map(|u| u.life) else {
            return;
        };
        let delay = self.rng.lock().ms(100, LATE_MS_MAX);
        let (late, request, timeout) = (Arc::clone(&self.late), request.clone(), self.timeout());
        late.pending.fetch_add(1, Ordering::SeqCst);
        tokio::spawn(async move {
            sleep(delay).await;
            if let Some(up) = sim.up(target).filter(|u| u.life == life) {
                let part = sim.part(target, up);
                let answer = tokio::time::timeout(timeout, submit(&part, request, false, until));
                late.delivered.fetch_add(1, Ordering::Relaxed);
                if let Ok(Err(Refused::Late(_))) = answer.await {
                    late.refused.fetch_add(1, Ordering::Relaxed);
                }
            }
            late.pending.fetch_sub(1, Ordering::SeqCst);
        });
    }

    /// `txn::Net::call`, setting `maybe_applied` once a try of the write (with an id) was
    /// sent and its answer lost (`Replication::call_tracked`).
    async fn call_tracked(
        &self,
        p: usize,
        request: Request,
        deadline: Instant,
        maybe_applied: &mut bool,
    ) -> Result<Response, RunError> {
        let k = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
        if self.die_at == Some((k, false)) {
            self.killed.store(true, Ordering::SeqCst);
        }
        // As `Replication::call`: a write with an id goes with its deadline, and is sent
        // again when its answer is lost, until the deadline.
        let until = request.id.map(|_| {
            txn::Net::now_ms(self)
                + deadline
                    .saturating_duration_since(Instant::now())
                    .as_millis() as u64
        });
        loop {
            self.gone().await;
            let target = self.guess.lock()[p];
            let sent = self.send(p, target, &request, false, until).await;
            if self.die_at == Some((k, true)) && matches!(sent, Sent::Answer(_)) {
                self.killed.store(true, Ordering::SeqCst);
            }
            self.gone().await;
            let hint = match sent {
                // As `Replication::call_tracked`.
                Sent::Answer(response) if *maybe_applied && response.status.refuses_this_try() => {
                    return Err(RunError::Unknown(format!(
                        "TRYAGAIN keel: partition {p}'s leader did not answer, and a later try \
                         did not apply; the write {MAYBE}"
                    )));
                }
                Sent::Answer(response) => return Ok(response),
                Sent::Lost if request.id.is_some() && Instant::now() < deadline => {
                    *maybe_applied = true;
                    None
                }
                Sent::Lost => {
                    return Err(RunError::Unknown(format!(
                        "TRYAGAIN keel: partition {p}'s leader did not answer; the write {MAYBE}"
                    )));
                }
                Sent::NotLeader(hint) => hint,
            };
            self.next_guess(p, target, hint);
            if Instant::now() >= deadline && *maybe_applied {
                return Err(RunError::Unknown(format!(
                    "TRYAGAIN keel: partition {p}'s leader did not answer; the write {MAYBE}"
                )));
            }
            if Instant::now() >= deadline {
                return Err(RunError::Failed(format!(
                    "CLUSTERDOWN The cluster is down: partition {p} has no leader this node \
                     can reach"
                )));
            }
            sleep(crate::replica::RETRY_PAUSE).await;
        }
    }

    /// A linearizable read of partition `p` (retried while its keys are locked), or
    /// [`Miss::Nothing`] if none answered by `deadline`.
    async fn read(&self, p: usize, request: &Request, deadline: Instant) -> Result<Vec<u8>, Miss> {
        loop {
            let target = self.guess.lock()[p];
            match self.send(p, target, request, true, None).await {
                Sent::Answer(r) if r.status == Status::Busy => {}
                Sent::Answer(r) if r.status == Status::Moved => {
                    self.learn_from(&r);
                    return Err(Miss::Moved);
                }
                Sent::Answer(r) => return Ok(r.reply),
                Sent::NotLeader(hint) => self.next_guess(p, target, hint),
                Sent::Lost => self.next_guess(p, target, None),
            }
            if Instant::now() >= deadline {
                return Err(Miss::Nothing);
            }
            sleep(crate::replica::RETRY_PAUSE).await;
        }
    }

    /// A write of partition `p`, retried while its keys are locked (as `Replication::run`
    /// does), with an id, so that it is sent again when its answer is lost: the reply, or how
    /// it failed.
    async fn write(self: &Arc<Self>, p: usize, request: &Request) -> Result<Vec<u8>, Miss> {
        let deadline = Instant::now() + self.timeout() * 3;
        let request = Request {
            id: Some(txn::Net::next_txn(&**self)),
            keep_ms: (self.timeout() * 3).as_millis() as u64 + KEEP_MARGIN_MS,
            ..request.clone()
        };
        let mut backoff = Duration::from_millis(1);
        let mut maybe_applied = false;
        loop {
            let answer = self
                .call_tracked(p, request.clone(), deadline, &mut maybe_applied)
                .await;
            match answer {
                Ok(r) if r.status == Status::Busy && Instant::now() < deadline => {
                    sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(20));
                }
                Ok(r) if r.status == Status::Busy && maybe_applied => return Err(Miss::Unknown),
                Ok(r) if matches!(r.status, Status::Busy | Status::Failed) => {
                    return Err(Miss::Nothing);
                }
                Ok(r) if r.status == Status::Moved => {
                    self.learn_from(&r);
                    return Err(Miss::Moved);
                }
                Ok(r) => return Ok(r.reply),
                Err(RunError::Unknown(_)) => return Err(Miss::Unknown),
                Err(_) => return Err(Miss::Nothing),
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
        let mut maybe_applied = false;
        self.call_tracked(p, request, deadline, &mut maybe_applied)
            .await
    }

    async fn read(
        &self,
        p: usize,
        request: Request,
        deadline: Instant,
    ) -> Result<Response, RunError> {
        // As `Replication::call` does a read: to the leader it guesses, the next on a miss,
        // until one answers (any answer: the driver decides what `Busy` means) or the
        // deadline passes.
        loop {
            self.gone().await;
            let target = self.guess.lock()[p];
            match self.send(p, target, &request, true, None).await {
                Sent::Answer(response) => return Ok(response),
                Sent::NotLeader(hint) => self.next_guess(p, target, hint),
                Sent::Lost => self.next_guess(p, target, None),
            }
            if Instant::now() >= deadline {
                return Err(RunError::Unknown(format!(
                    "TRYAGAIN keel: partition {p}'s leader did not answer a read"
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
        self.learned[self.home].lock().extend(moved.iter().copied());
    }

    fn chunked_span(&self) -> Duration {
        Duration::from_millis(CHUNKED_SPAN_MS)
    }

    fn owner(&self, slot: u16) -> usize {
        let learned = self.learned[self.home].lock().get(&slot).copied();
        learned.unwrap_or_else(|| (self.owners)(slot))
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

/// One try at a client's transaction over `items` (keys, and the element to append to each
/// if any), planned by where the driver's node believes each key's slot is: the operations
/// it did, or how it failed (`Moved`: nothing applied; plan again).
async fn attempt(
    world: &World,
    driver: &Arc<Driver>,
    items: &[(u32, Option<u64>)],
    read: bool,
    limits: Limits,
) -> Result<Result<Vec<Op>, String>, Miss> {
    let mut parts: BTreeMap<usize, Vec<(u32, Option<u64>)>> = BTreeMap::new();
    for &(k, elem) in items {
        let p = driver.owner_of(&key_name(k));
        parts.entry(p).or_default().push((k, elem));
    }
    if parts.len() == 1 {
        let (&p, plan) = parts.iter().next().expect("one partition");
        let request = request(plan);
        let reply = if read {
            let deadline = Instant::now() + driver.timeout() * 3;
            driver.read(p, &request, deadline).await?
        } else {
            driver.write(p, &request).await?
        };
        return Ok(parse_exec(&reply, plan));
    }
    world.across.fetch_add(1, Ordering::Relaxed);
    let work: Work = parts
        .iter()
        .map(|(&p, plan)| (p, request(plan).commands))
        .collect();
    match txn::run_across(driver, work, limits).await {
        Ok(replies) => Ok(parse_across(&replies, &parts)),
        Err(txn::AcrossError::Failed(text)) if text.contains(MAYBE) => Err(Miss::Unknown),
        Err(txn::AcrossError::Failed(_)) => Err(Miss::Nothing),
        Err(txn::AcrossError::Moved) => Err(Miss::Moved),
    }
}

/// A driver on a random node (`None`: that node is down), which dies one time in
/// [`KILL_PER_MILLE`]: killed at a random time (the `Duration` for [`watch`]), or at a random
/// step of the protocol (before its k-th request, or once that request applied).
fn doomed_driver(world: &World, rng: &mut Rng) -> Option<(Arc<Driver>, Option<Duration>)> {
    let sim = &world.groups[0];
    let home = rng.below(sim.n as u64) as usize;
    sim.up(home)?;
    let mut driver = Driver::new(world, home, rng.next());
    let mut kill = None;
    if rng.chance(KILL_PER_MILLE) {
        if rng.chance(500) {
            kill = Some(rng.ms(0, 300));
        } else {
            driver.die_at = Some((1 + rng.below(4), rng.chance(500)));
        }
    }
    Some((Arc::new(driver), kill))
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
        let Some((driver, kill)) = doomed_driver(&world, &mut rng) else {
            continue;
        };
        let mut keys: Vec<u32> = (0..1 + rng.below(3))
            .map(|_| rng.below(u64::from(KEYS)) as u32)
            .collect();
        keys.sort_unstable();
        keys.dedup();
        let name = format!("c{c}.{t}");
        t += 1;
        let read = rng.chance(200);
        let items: Vec<(u32, Option<u64>)> = keys
            .iter()
            .map(|&k| {
                let append = !read && rng.chance(750);
                (k, append.then(|| elems.fetch_add(1, Ordering::SeqCst)))
            })
            .collect();
        let appends: Vec<Op> = items
            .iter()
            .filter_map(|&(key, e)| e.map(|elem| Op::Append { key, elem }))
            .collect();
        let began = sim.now();
        let attempt = async {
            for _ in 0..REPLANS {
                let seen = attempt(&world, &driver, &items, read, limits).await;
                if seen.as_ref().err() != Some(&Miss::Moved) {
                    return seen;
                }
                world.replans.fetch_add(1, Ordering::Relaxed);
            }
            Err(Miss::Nothing)
        };
        let seen: Result<Result<Vec<Op>, String>, Miss> = tokio::select! {
            seen = attempt => seen,
            () = watch(&driver, kill) => {
                world.killed.fetch_add(1, Ordering::Relaxed);
                Err(Miss::Unknown)
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
            Err(Miss::Unknown) => book.unknown.push((name, appends, began)),
            Err(Miss::Nothing | Miss::Moved) => book.records.push(TxnRecord {
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

/// A `GET` of every account, grouped by partition as `driver`'s node knows them.
fn audit_work(driver: &Driver) -> Work {
    let mut parts: BTreeMap<usize, Vec<Vec<Vec<u8>>>> = BTreeMap::new();
    for a in 0..ACCOUNTS {
        let gets = parts.entry(driver.owner_of(&account(a))).or_default();
        gets.push(vec![b"GET".to_vec(), account(a)]);
    }
    parts.into_iter().collect()
}

/// Opens the accounts: `OPENING` in each, written before any client starts.
async fn open_accounts(world: &World, seed: u64) -> Result<(), String> {
    let driver = Arc::new(Driver::new(world, 0, seed));
    for p in 0..PARTS {
        let commands: Vec<Vec<Vec<u8>>> = (0..ACCOUNTS)
            .filter(|&a| driver.owner_of(&account(a)) == p)
            .map(|a| {
                // With an expiry no run reaches, which every move must carry along (and
                // `DECRBY`/`INCRBY` keep): the final check reads it.
                vec![
                    b"SET".to_vec(),
                    account(a),
                    OPENING.to_string().into_bytes(),
                    b"PXAT".to_vec(),
                    ACCOUNT_EXPIRY_MS.to_string().into_bytes(),
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
        let Some((driver, kill)) = doomed_driver(&world, &mut rng) else {
            continue;
        };
        if rng.chance(300) {
            let result = tokio::select! {
                result = txn::run_across(&driver, audit_work(&driver), limits) => result,
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
                driver.owner_of(&account(from)),
                vec![vec![b"DECRBY".to_vec(), account(from), amount.clone()]],
            ),
            (
                driver.owner_of(&account(to)),
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

/// Moves the slots of one to three random keys of [`movable`] to another partition every
/// [`MOVE_EVERY_MS`] or so, until `stop`: `txn::move_slots` on a random node (a batch per
/// source partition), its driver killed now and then as the clients' are (the source's
/// resolver then ends the move).
async fn mover(world: Arc<World>, seed: u64, stop: Arc<AtomicBool>, on: bool) {
    let mut rng = Rng::new(seed ^ 0x6d6f_7665);
    let sim = Arc::clone(&world.groups[0]);
    let keys = movable();
    while on && !stop.load(Ordering::SeqCst) {
        sleep(rng.ms(MOVE_EVERY_MS / 2, MOVE_EVERY_MS * 3 / 2)).await;
        let Some((driver, kill)) = doomed_driver(&world, &mut rng) else {
            continue;
        };
        let picked: Vec<&Vec<u8>> = (0..1 + rng.below(3))
            .map(|_| &keys[rng.below(keys.len() as u64) as usize].0)
            .collect();
        let from = driver.owner_of(picked[0]);
        let to = (from + 1 + rng.below(PARTS as u64 - 1) as usize) % PARTS;
        let slots: Vec<u16> = picked.iter().map(|k| slot(k)).collect();
        let moved = tokio::select! {
            moved = txn::move_slots(&driver, &slots, to) => moved,
            () = watch(&driver, kill) => Err("its driver died".into()),
        };
        world.move_log.lock().push(format!(
            "{} ms: {:?} (slots {slots:?}) from partition {from} (the first's) to {to}, \
             driver {} on node {}: {moved:?}",
            sim.now() / 1_000_000,
            picked
                .iter()
                .map(|k| String::from_utf8_lossy(k))
                .collect::<Vec<_>>(),
            driver.incarnation,
            driver.home,
        ));
        match moved {
            Ok(_) => world.moves.fetch_add(1, Ordering::Relaxed),
            Err(_) => world.moves_failed.fetch_add(1, Ordering::Relaxed),
        };
    }
}

/// Reads keys linearizably, each with its command (`reads`: the key, and the command that
/// reads it) from the partition that owns it (planned again after a `Moved`): each key's
/// value, in order.
async fn read_owned(
    driver: &Driver,
    reads: &[(Vec<u8>, Vec<Vec<u8>>)],
) -> Result<Vec<Option<Vec<u8>>>, String> {
    let deadline = Instant::now() + Duration::from_millis(RECOVERY_MS);
    let mut values = vec![None; reads.len()];
    let mut left: Vec<usize> = (0..reads.len()).collect();
    while !left.is_empty() {
        let mut parts: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for &i in &left {
            parts
                .entry(driver.owner_of(&reads[i].0))
                .or_default()
                .push(i);
        }
        left.clear();
        for (p, which) in parts {
            let reading = Request {
                commands: which.iter().map(|&i| reads[i].1.clone()).collect(),
                ..request(&[])
            };
            let reply = match driver.read(p, &reading, deadline).await {
                Ok(reply) => reply,
                Err(Miss::Moved) if Instant::now() < deadline => {
                    left.extend(which);
                    continue;
                }
                Err(e) => return Err(format!("partition {p}: no final read ({e:?})")),
            };
            let header = format!("*{}\r\n", which.len());
            if !reply.starts_with(header.as_bytes()) {
                return Err(format!("a final read: {reply:?}"));
            }
            let mut at = header.len();
            for &i in &which {
                values[i] = resp_value(&reply, &mut at)?;
            }
        }
    }
    Ok(values)
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
    moves: u64,
    moves_failed: u64,
    replans: u64,
    /// Writes delivered after their sender gave up, and those refused as late.
    late: u64,
    late_refused: u64,
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
            let (prepared, decided, staged) = (locks.prepared(), locks.decided(), locks.staged());
            if !prepared.is_empty()
                || !decided.is_empty()
                || !staged.is_empty()
                || locks.locked_keys() != 0
            {
                left.push(format!(
                    "partition {} node {i}: prepared {prepared:?}, decided {:?}, staged \
                     {staged:?}, {} keys locked",
                    g.part,
                    decided.iter().map(|(t, _)| t).collect::<Vec<_>>(),
                    locks.locked_keys()
                ));
            }
        }
    }
    left
}

/// Check 6: each movable key's slot is owned by exactly one partition, as every replica of
/// every partition sees it, and no replica of another partition holds the key.
fn misplaced(groups: &[Arc<Sim>]) -> Vec<String> {
    let mut wrong = Vec::new();
    let cursors = crate::data::Cursors::default();
    for (key, _) in movable() {
        let s = slot(&key);
        let name = String::from_utf8_lossy(&key);
        let mut claimed = Vec::new();
        for g in groups {
            for i in 0..g.n {
                let Some(up) = g.up(i) else { continue };
                let owner = up.locks.lock().owner(s);
                if owner == Some(g.part) {
                    claimed.push((g.part, i));
                }
                let mut txn = g.nodes[i].data_db.begin().expect("begin");
                let held =
                    crate::data::test_support::run_in(&mut txn, &cursors, &["EXISTS", &name]);
                if owner != Some(g.part) && held != b":0\r\n" {
                    wrong.push(format!(
                        "partition {} node {i} still holds {name}, whose slot {s} it gave to \
                         {owner:?}",
                        g.part
                    ));
                }
            }
        }
        let parts: std::collections::BTreeSet<usize> = claimed.iter().map(|&(p, _)| p).collect();
        let replicas = claimed
            .iter()
            .filter(|&&(p, _)| Some(&p) == parts.first())
            .count();
        if parts.len() != 1 || replicas != groups[0].n {
            wrong.push(format!(
                "slot {s} ({name}) is claimed by (partition, node) {claimed:?}: one partition's \
                 every replica should"
            ));
        }
    }
    wrong
}

async fn simulate(seed: u64, n: usize, mutation: Mutation) -> Result<Summary, String> {
    let net = Arc::new(Mutex::new(Net::new(seed, n)));
    let epoch = Instant::now();
    let groups: Vec<Arc<Sim>> = (0..PARTS)
        .map(|p| Sim::new(n, p, mutation, Arc::clone(&net), epoch))
        .collect();
    let owners = config_owner();
    for g in &groups {
        *g.groups.lock() = groups.iter().map(Arc::downgrade).collect();
        *g.home.lock() = Some(Arc::clone(&owners));
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
        owners,
        learned: Arc::new((0..n).map(|_| Mutex::default()).collect()),
        moves: AtomicU64::new(0),
        moves_failed: AtomicU64::new(0),
        move_log: Mutex::default(),
        late: Arc::default(),
        replans: AtomicU64::new(0),
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
    // The checks of other deliberate bugs look for what those bugs break, not for what a
    // move meets beside them (a prepared move that locks nothing).
    let moves = matches!(mutation, Mutation::None | Mutation::MoveLosesKeys);
    let moving = tokio::spawn(mover(Arc::clone(&world), seed, Arc::clone(&stop), moves));
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
            commands: vec![vec![b"SET".to_vec(), probe(p), b"1".to_vec()]],
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
    for c in clients.into_iter().chain(bankers).chain([moving]) {
        if let Err(e) = c.await {
            std::panic::resume_unwind(e.into_panic());
        }
    }

    // Every request the network holds back delivered (or its node gone).
    while world.late.pending.load(Ordering::SeqCst) > 0 {
        sleep(Duration::from_millis(200)).await;
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
    let lists: Vec<(Vec<u8>, Vec<Vec<u8>>)> =
        (0..KEYS).map(|k| (key_name(k), read_command(k))).collect();
    let mut finals = Vec::new();
    for (k, value) in (0..KEYS).zip(read_owned(&prober, &lists).await?) {
        finals.push(Op::Read {
            key: k,
            value: decode(value.as_deref()).map_err(|e| format!("the final read: {e}"))?,
        });
    }
    let final_ended = groups[0].now();
    // The bank's final balances.
    let mut balances = Vec::new();
    let accounts: Vec<(Vec<u8>, Vec<Vec<u8>>)> = (0..ACCOUNTS)
        .map(|a| (account(a), vec![b"GET".to_vec(), account(a)]))
        .collect();
    for (a, value) in read_owned(&prober, &accounts)
        .await?
        .into_iter()
        .enumerate()
    {
        let Some(value) = value else {
            return Err(format!("account {a} is gone"));
        };
        let text = String::from_utf8_lossy(&value).into_owned();
        balances.push(
            text.parse::<i64>()
                .map_err(|_| format!("a balance {text:?}"))?,
        );
    }
    // Every account kept its TTL through the moves.
    let ttls: Vec<(Vec<u8>, Vec<Vec<u8>>)> = (0..ACCOUNTS)
        .map(|a| (account(a), vec![b"PTTL".to_vec(), account(a)]))
        .collect();
    let mut ttl_lost = Vec::new();
    for (a, ttl) in read_owned(&prober, &ttls).await?.into_iter().enumerate() {
        let ms: i64 = ttl
            .and_then(|t| String::from_utf8_lossy(&t).parse().ok())
            .unwrap_or(-3);
        if ms <= 0 {
            ttl_lost.push(format!("account {a} has a TTL of {ms} ms"));
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
    violations.extend(misplaced(&groups));
    violations.extend(ttl_lost);
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
    let mut appended: Vec<String> = Vec::new();
    for r in &book.records {
        for op in &r.ops {
            if let Op::Append { key, elem } = op {
                appended.push(format!("{elem} to k{key} by {} ({:?})", r.name, r.outcome));
            }
        }
    }
    for (name, ops, _) in &book.unknown {
        for op in ops {
            if let Op::Append { key, elem } = op {
                appended.push(format!("{elem} to k{key} by {name} (unknown)"));
            }
        }
    }
    let (report, acknowledged, unknown) =
        check_history(book, finals, (final_began, final_ended), &mut violations);
    if !violations.is_empty() {
        if std::env::var("KEEL_SIM_APPENDS").is_ok() {
            violations.push("the appends:".into());
            violations.extend(appended);
        }
        violations.push("the slot moves:".into());
        violations.extend(std::mem::take(&mut *world.move_log.lock()));
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
        moves: world.moves.load(Ordering::Relaxed),
        moves_failed: world.moves_failed.load(Ordering::Relaxed),
        replans: world.replans.load(Ordering::Relaxed),
        late: world.late.delivered.load(Ordering::Relaxed),
        late_refused: world.late.refused.load(Ordering::Relaxed),
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

/// The checks catch a slot move that loses the keys it carries (acknowledged appends gone, or
/// the bank's total changed).
#[test]
fn the_checks_catch_a_move_that_loses_keys() {
    let caught = [1u64, 2, 3]
        .iter()
        .find_map(|&seed| run(seed, 3, Mutation::MoveLosesKeys).err())
        .expect("no seed caught a move that loses keys");
    println!("{}", &caught[..caught.len().min(600)]);
}

//! A deterministic simulation of two-phase commit: the real [`Coordinator`] and
//! [`Participant`] of `keel_cluster::txn` on 3 to 5 simulated nodes, each with a model
//! partition, a network and a disk, all driven by one seed.
//!
//! A node's model partition keeps, durably, its committed data (bank accounts and Elle lists),
//! its prepared records (the writes, the locked keys, the reply) and its coordinator's commit
//! decisions, plus the list of commits it installed (ground truth for the checks); and,
//! volatile, its locks and the protocol state machines. Prepares follow strict two-phase
//! locking with one-shot execution: a prepare locks every key its work touches, and a key
//! locked by another prepare makes it refuse (`Busy`). The disk is a log: its entries become
//! durable in order, each after a random delay, and a crash loses those not yet durable (and
//! every volatile thing); a restarted node takes its prepared records' locks again before it
//! serves anything, and gives the protocol its durable records back. A prepare that only
//! reads is not logged (as in the engine): it votes at once, and a crash loses it with its
//! locks, so a restarted node prepares nothing until the vote timeout has passed (its last
//! incarnation's yes votes can count until then).
//!
//! The seed drives message delay (reordering), loss, duplication, long delays (late
//! duplicates that outlive the participants' memory of finished transactions), isolation of a
//! node, crashes at any millisecond and restarts after a while (a fifth of them long enough,
//! up to 2.5 s, that the participants a crashed coordinator left prepared ask each other),
//! how much each participant remembers of finished transactions, disk latency and stalls, and
//! clients: bank transfers between accounts on different nodes (retried when aborted),
//! audits reading every account, and Elle list-append transactions. Then everything is
//! healed, the clients stop, and the run waits until no transaction is in progress anywhere.
//! The checks: nothing locked, prepared or decided is left; every commit installed at most
//! once per node and at all of its participants that write or none; every transaction
//! answered committed installed everywhere, every one answered aborted nowhere; the bank's total
//! unchanged, in the final state and in every committed audit; and the list-append history
//! strictly serializable (the engine's checker, with real-time intervals in simulated
//! milliseconds; a transaction whose client never heard the outcome counts by what its
//! participants installed, as an Elle "info" operation without its reads).
//!
//! `KEEL_SIM_SEED` runs one seed; `KEEL_SIM_RUNS` sets how many seeds the default test runs,
//! from `KEEL_SIM_FROM` (0 unless set: a longer hunt can go on past the seeds run before).
//! A failure names its seed. The `catches_*` tests run the model with a bug on purpose and
//! require the checks to fail, so that the simulation cannot pass vacuously.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use keel_cluster::txn::{
    AbortReason, Config, Coordinator, CoordinatorAction, Decided, Decision, Message, Outcome,
    Participant, ParticipantAction, Peer, PrepareId, Recovered, Refusal, TxnId, Vote,
};

use crate::history::{self, TxnRecord};

/// Bank accounts, each starting with `BALANCE`.
const ACCOUNTS: u32 = 32;
const BALANCE: i64 = 100;
/// Elle list keys.
const LISTS: u32 = 16;
/// Clients per node.
const CLIENTS_PER_NODE: usize = 2;
/// Simulated milliseconds with faults and clients, before healing.
const RUN_MS: u64 = 1500;
/// Longest the healed cluster may take to finish every transaction.
const SETTLE_MS_MAX: u64 = 30_000;
/// Attempts of one bank transfer or list transaction that keeps aborting.
const ATTEMPTS_MAX: u32 = 5;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Key {
    Account(u32),
    List(u32),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Value {
    Int(i64),
    List(Vec<u64>),
}

/// One step of a participant's work.
#[derive(Clone, Debug)]
enum Step {
    Get(Key),
    Add(Key, i64),
    Append(Key, u64),
}

impl Step {
    fn key(&self) -> Key {
        match self {
            Step::Get(k) | Step::Add(k, _) | Step::Append(k, _) => *k,
        }
    }
}

type Work = Vec<Step>;
/// Per step: the value a `Get` saw, `None` for writes.
type Reply = Vec<Option<Value>>;
type Msg = Message<Work, Reply>;
type CAction = CoordinatorAction<Work, Reply>;
type PAction = ParticipantAction<Work, Reply>;

/// splitmix64: small, and the same on every platform.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `per_million` / 1e6.
    fn chance(&mut self, per_million: u64) -> bool {
        self.below(1_000_000) < per_million
    }
}

/// Deliberate bugs, to show the checks catch them.
#[derive(Clone, Copy, Debug, Default)]
pub struct Bugs {
    /// Prepares ignore other prepares' locks on accounts.
    pub unlocked_accounts: bool,
    /// Prepares ignore other prepares' locks on lists.
    pub unlocked_lists: bool,
    /// Prepared records are volatile: a crash loses them.
    pub volatile_prepare: bool,
    /// The network turns every no vote into a yes: the coordinator commits without a real
    /// yes from every participant.
    pub forge_yes_votes: bool,
    /// The network answers every question of a participant to another with abort, as if
    /// every peer knew the transaction aborted.
    pub forge_peer_aborts: bool,
    /// The network makes every `NoYesVote` claim a memory that reaches back forever, as if
    /// participants forgot nothing at crashes and evictions.
    pub forge_long_memory: bool,
    /// A restarted node prepares at once, without waiting out the vote timeout (see
    /// `Node::fenced_until`).
    pub no_restart_fence: bool,
    /// Prepares that write vote as if they only read: a transaction of them is answered
    /// and released without its commit (`Vote::Yes`'s `read_only`).
    pub writes_claim_read_only: bool,
}

/// What a run did, so that a passing run can be seen to be non-trivial.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub nodes: usize,
    pub txns: u64,
    pub committed: u64,
    pub aborted: u64,
    /// Aborts because a participant found a key locked, and because votes were missing.
    pub aborted_busy: u64,
    pub aborted_timeout: u64,
    /// Transactions whose client never heard the outcome (its node crashed, or `Unknown`),
    /// and how many of them committed.
    pub in_doubt: u64,
    pub in_doubt_committed: u64,
    /// Answered `Unknown` (the commit decision was not durable by the client deadline).
    pub answered_unknown: u64,
    pub audits_committed: u64,
    pub transfers_committed: u64,
    pub lists_committed: u64,
    pub retries: u64,
    pub messages: u64,
    pub dropped: u64,
    pub duplicated: u64,
    pub delayed_long: u64,
    pub crashes: u64,
    /// Crashes of a coordinator that had sent only some of its `Prepare`s or decisions.
    pub crashes_mid_broadcast: u64,
    pub isolations: u64,
    /// Prepared records and commit decisions handed back at restarts.
    pub recovered_prepared: u64,
    pub recovered_decisions: u64,
    pub inquiries: u64,
    /// Questions of a participant to the others, their answers that named a decision and
    /// that said the answerer never voted yes, and the prepares they decided: committed on a
    /// peer's word, aborted on it, aborted on a `NoYesVote`.
    pub peer_inquiries: u64,
    pub peer_decisions_told: u64,
    pub no_yes_votes: u64,
    pub peer_commits: u64,
    pub peer_aborts: u64,
    pub no_yes_aborts: u64,
    /// Prepares of a transaction already installed on that node, aborted (late duplicates
    /// that ran again).
    pub stale_prepares: u64,
    pub settle_ms: u64,
    pub history_edges: usize,
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        self.nodes += o.nodes;
        self.txns += o.txns;
        self.committed += o.committed;
        self.aborted += o.aborted;
        self.aborted_busy += o.aborted_busy;
        self.aborted_timeout += o.aborted_timeout;
        self.in_doubt += o.in_doubt;
        self.in_doubt_committed += o.in_doubt_committed;
        self.answered_unknown += o.answered_unknown;
        self.audits_committed += o.audits_committed;
        self.transfers_committed += o.transfers_committed;
        self.lists_committed += o.lists_committed;
        self.retries += o.retries;
        self.messages += o.messages;
        self.dropped += o.dropped;
        self.duplicated += o.duplicated;
        self.delayed_long += o.delayed_long;
        self.crashes += o.crashes;
        self.crashes_mid_broadcast += o.crashes_mid_broadcast;
        self.isolations += o.isolations;
        self.recovered_prepared += o.recovered_prepared;
        self.recovered_decisions += o.recovered_decisions;
        self.inquiries += o.inquiries;
        self.peer_inquiries += o.peer_inquiries;
        self.peer_decisions_told += o.peer_decisions_told;
        self.no_yes_votes += o.no_yes_votes;
        self.peer_commits += o.peer_commits;
        self.peer_aborts += o.peer_aborts;
        self.no_yes_aborts += o.no_yes_aborts;
        self.stale_prepares += o.stale_prepares;
        self.settle_ms = self.settle_ms.max(o.settle_ms);
        self.history_edges += o.history_edges;
    }
}

/// A prepared record.
#[derive(Clone, Debug)]
struct Prepared {
    participants: Vec<Peer>,
    keys: Vec<Key>,
    writes: Vec<(Key, Value)>,
    reply: Reply,
}

/// A disk (log) entry; durable once its due time passed, in order.
#[derive(Debug)]
enum Entry {
    Prepared {
        txn: TxnId,
        prepare: PrepareId,
        record: Prepared,
    },
    /// A refused prepare: nothing to write, but it completes in order like the rest.
    Refused {
        txn: TxnId,
        refusal: Refusal,
    },
    Commit {
        txn: TxnId,
        prepare: PrepareId,
    },
    Abort {
        txn: TxnId,
        prepare: PrepareId,
    },
    Decision(Decision),
    Forget(TxnId),
}

struct Node {
    up: bool,
    down_until: u64,
    // Durable.
    data: BTreeMap<Key, Value>,
    prepared: BTreeMap<(TxnId, PrepareId), Prepared>,
    decisions: BTreeMap<TxnId, Decision>,
    /// Every commit installed here, in order (of transactions that wrote here).
    installed: Vec<TxnId>,
    // Volatile.
    locks: BTreeMap<Key, (TxnId, PrepareId)>,
    /// Prepares that only read: the engine logs nothing for them (`Txn::prepare`), so they
    /// vote at once and a crash loses them with their locks.
    reading: BTreeMap<(TxnId, PrepareId), Prepared>,
    /// After a restart, prepares wait until then (the vote timeout after the restart): a yes
    /// vote of the last incarnation that only read may still be counted until its
    /// coordinator's vote timeout, and the crash released what it read. A write here before
    /// then could make the transaction read a value and miss its overwrite (the server holds
    /// every write back for as long: `keel-server/src/xnode.rs`, the restart fence).
    fenced_until: u64,
    /// The prepares waiting for `fenced_until`.
    deferred: Vec<(TxnId, PrepareId, Vec<Peer>, Work)>,
    disk: VecDeque<(u64, Entry)>,
    coordinator: Coordinator<Work, Reply>,
    participant: Participant<Reply>,
    /// Transactions of this node's clients waiting for an answer: record index.
    waiting: BTreeMap<TxnId, usize>,
}

/// Which counter a participant's decision on another participant's answer adds to.
#[derive(Clone, Copy)]
enum PeerCount {
    None,
    Commit,
    Abort,
    NoYes,
}

/// What a client does; kept to retry it.
#[derive(Clone, Debug)]
enum Plan {
    Transfer {
        from: u32,
        to: u32,
        amount: i64,
    },
    Audit,
    /// Per key: read it, append to it.
    Lists(Vec<(u32, bool, bool)>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Heard {
    Committed,
    Aborted,
    /// The client never heard (its node crashed) or heard `Unknown`.
    Nothing,
}

/// One transaction a client began.
struct Record {
    client: usize,
    plan: Plan,
    txn: TxnId,
    /// Each step, in the client's order, with where it ran: (participant, index in its work).
    steps: Vec<(Step, Peer, usize)>,
    began: u64,
    ended: Option<u64>,
    heard: Heard,
    replies: BTreeMap<Peer, Reply>,
}

struct Client {
    node: Peer,
    next_at: Option<u64>,
    waiting: bool,
    retry: Option<(Plan, u32)>,
}

struct Sim {
    rng: Rng,
    bugs: Bugs,
    config: Config,
    now: u64,
    faults: bool,
    /// A node's chance to crash in a millisecond, per million.
    crash_per_million: u64,
    issuing: bool,
    nodes: Vec<Node>,
    /// In flight: (delivery time, order) -> (recipient, message, sent by a participant).
    net: BTreeMap<(u64, u64), (Peer, Msg, bool)>,
    net_seq: u64,
    isolated: Option<(Peer, u64)>,
    clients: Vec<Client>,
    records: Vec<Record>,
    incarnation_last: u64,
    elem_last: u64,
    stats: Stats,
}

fn config() -> Config {
    Config {
        resend_ms: 25,
        vote_timeout_ms: 300,
        ack_wait_ms: 60,
        // Short, so that disk stalls make some answers `Unknown`.
        client_deadline_ms: 250,
        inquire_after_ms: 80,
        inquire_every_ms: 60,
        txns_max: 64,
        // Small, so that late duplicate prepares outlive it and run again (half the seeds
        // remember more: see `Sim::new`).
        finished_max: 16,
    }
}

impl Sim {
    fn new(seed: u64, bugs: Bugs) -> Sim {
        let mut rng = Rng(seed);
        let n = 3 + rng.below(3) as usize;
        let mut config = config();
        if rng.below(2) == 0 {
            // Long enough that participants vouch for never having voted yes.
            config.finished_max = 4096;
        }
        // Half the seeds crash nodes less often (besides crashes mid-broadcast), so that
        // participants remember far enough back to vouch.
        let crash_per_million = if rng.below(2) == 0 { 300 } else { 50 };
        let mut sim = Sim {
            rng,
            bugs,
            config,
            now: 0,
            faults: true,
            crash_per_million,
            issuing: true,
            nodes: Vec::new(),
            net: BTreeMap::new(),
            net_seq: 0,
            isolated: None,
            clients: Vec::new(),
            records: Vec::new(),
            incarnation_last: 0,
            elem_last: 0,
            stats: Stats {
                nodes: n,
                ..Stats::default()
            },
        };
        for i in 0..n {
            let peer = Peer(i as u16);
            let incarnation = sim.incarnation();
            sim.nodes.push(Node {
                up: true,
                down_until: 0,
                data: BTreeMap::new(),
                prepared: BTreeMap::new(),
                reading: BTreeMap::new(),
                fenced_until: 0,
                deferred: Vec::new(),
                decisions: BTreeMap::new(),
                installed: Vec::new(),
                locks: BTreeMap::new(),
                disk: VecDeque::new(),
                coordinator: Coordinator::new(peer, incarnation, sim.config.clone()),
                participant: Participant::new(peer, incarnation, sim.config.clone()),
                waiting: BTreeMap::new(),
            });
            for _ in 0..CLIENTS_PER_NODE {
                sim.clients.push(Client {
                    node: peer,
                    next_at: Some(0),
                    waiting: false,
                    retry: None,
                });
            }
        }
        for a in 0..ACCOUNTS {
            let key = Key::Account(a);
            let owner = sim.owner(key);
            sim.nodes[owner.0 as usize]
                .data
                .insert(key, Value::Int(BALANCE));
        }
        sim
    }

    fn incarnation(&mut self) -> u64 {
        self.incarnation_last += 1;
        self.incarnation_last
    }

    fn owner(&self, key: Key) -> Peer {
        let n = self.nodes.len() as u32;
        let i = match key {
            Key::Account(a) => a % n,
            Key::List(l) => (l * 7 + 1) % n,
        };
        Peer(i as u16)
    }

    /// Runs the faulty phase, heals, settles; returns the checks' verdict.
    fn run(mut self) -> Result<Stats, String> {
        while self.now < RUN_MS {
            self.step();
            self.now += 1;
        }
        // Healed: no more faults, but a node that is down stays down until its time (up to
        // 2.5 s), so that its transactions' participants have to ask each other.
        self.faults = false;
        self.issuing = false;
        self.isolated = None;
        let healed = self.now;
        loop {
            self.step();
            if self.settled() {
                break;
            }
            self.now += 1;
            if self.now > healed + SETTLE_MS_MAX {
                return Err(format!(
                    "not settled {SETTLE_MS_MAX} ms after healing: {}",
                    self.unsettled()
                ));
            }
        }
        self.stats.settle_ms = self.now - healed;
        self.check()?;
        Ok(self.stats)
    }

    fn step(&mut self) {
        for i in 0..self.nodes.len() {
            if self.faults && self.nodes[i].up && self.rng.chance(self.crash_per_million) {
                self.crash(i);
            } else if !self.nodes[i].up && self.now >= self.nodes[i].down_until {
                self.restart(i);
            }
        }
        if self.faults {
            match self.isolated {
                Some((_, until)) if self.now >= until => self.isolated = None,
                None if self.rng.chance(500) => {
                    let peer = Peer(self.rng.below(self.nodes.len() as u64) as u16);
                    self.isolated = Some((peer, self.now + self.rng.range(20, 300)));
                    self.stats.isolations += 1;
                }
                _ => {}
            }
        }
        while let Some(entry) = self.net.first_entry() {
            if entry.key().0 > self.now {
                break;
            }
            let (to, msg, by_participant) = entry.remove();
            self.deliver(to, msg, by_participant);
        }
        for i in 0..self.nodes.len() {
            if !self.nodes[i].up {
                continue;
            }
            self.disk(i);
            // A decision's broadcast may have crashed it.
            if !self.nodes[i].up {
                continue;
            }
            if self.now >= self.nodes[i].fenced_until && !self.nodes[i].deferred.is_empty() {
                let deferred = std::mem::take(&mut self.nodes[i].deferred);
                let actions = deferred
                    .into_iter()
                    .map(
                        |(txn, prepare, participants, work)| ParticipantAction::Prepare {
                            txn,
                            prepare,
                            participants,
                            work,
                        },
                    )
                    .collect();
                self.participant_actions(i, actions);
            }
            let mut out = Vec::new();
            self.nodes[i].coordinator.tick(self.now, &mut out);
            self.coordinator_actions(i, out);
            let mut out = Vec::new();
            self.nodes[i].participant.tick(self.now, &mut out);
            self.participant_actions(i, out);
        }
        for c in 0..self.clients.len() {
            let client = &self.clients[c];
            let up = self.nodes[client.node.0 as usize].up;
            if up
                && self.issuing
                && !client.waiting
                && client.next_at.is_some_and(|at| at <= self.now)
            {
                self.start(c);
            }
        }
    }

    fn settled(&self) -> bool {
        self.net.is_empty()
            && self.clients.iter().all(|c| !c.waiting)
            && self.nodes.iter().all(|n| {
                n.up && n.disk.is_empty()
                    && n.coordinator.is_empty()
                    && n.participant.is_empty()
                    && n.prepared.is_empty()
                    && n.reading.is_empty()
                    && n.deferred.is_empty()
                    && n.decisions.is_empty()
            })
    }

    fn unsettled(&self) -> String {
        let mut parts = vec![format!("{} messages in flight", self.net.len())];
        for (i, n) in self.nodes.iter().enumerate() {
            parts.push(format!(
                "node {i}: up {}, disk {}, coordinator {}, participant {}, prepared {:?}, \
                 decisions {:?}",
                n.up,
                n.disk.len(),
                n.coordinator.len(),
                n.participant.len(),
                n.prepared.keys().collect::<Vec<_>>(),
                n.decisions.keys().collect::<Vec<_>>()
            ));
        }
        parts.join("; ")
    }

    // The network.

    /// Sends `msg`; `by_participant` tells a participant's `Decide` (an answer to another
    /// participant) from the coordinator's.
    fn send(&mut self, from: Peer, to: Peer, mut msg: Msg, by_participant: bool) {
        self.stats.messages += 1;
        if self.bugs.forge_yes_votes
            && let Message::Vote {
                vote: vote @ Vote::No(_),
                ..
            } = &mut msg
        {
            *vote = Vote::Yes {
                prepare: PrepareId {
                    incarnation: 0,
                    seq: 0,
                },
                reply: Vec::new(),
                read_only: false,
            };
        }
        match msg {
            Message::Inquire { .. } => self.stats.inquiries += 1,
            Message::PeerInquire { .. } => self.stats.peer_inquiries += 1,
            Message::NoYesVote { .. } => self.stats.no_yes_votes += 1,
            Message::Decide { .. } if by_participant => self.stats.peer_decisions_told += 1,
            _ => {}
        }
        if self.faults {
            let cut = self
                .isolated
                .is_some_and(|(peer, _)| (peer == from) != (peer == to));
            if cut || self.rng.chance(50_000) {
                self.stats.dropped += 1;
                return;
            }
            if self.rng.chance(30_000) {
                self.stats.duplicated += 1;
                let delay = self.delay();
                self.enqueue(delay, to, msg.clone(), by_participant);
            }
        }
        let delay = self.delay();
        self.enqueue(delay, to, msg, by_participant);
    }

    fn delay(&mut self) -> u64 {
        if self.faults && self.rng.chance(20_000) {
            self.stats.delayed_long += 1;
            self.rng.range(50, 400)
        } else {
            self.rng.range(1, 6)
        }
    }

    fn enqueue(&mut self, delay: u64, to: Peer, msg: Msg, by_participant: bool) {
        self.net_seq += 1;
        self.net
            .insert((self.now + delay, self.net_seq), (to, msg, by_participant));
    }

    fn deliver(&mut self, to: Peer, msg: Msg, by_participant: bool) {
        let i = to.0 as usize;
        if !self.nodes[i].up {
            self.stats.dropped += 1;
            return;
        }
        if self.bugs.forge_peer_aborts
            && let Message::PeerInquire { txn, from, .. } = msg
        {
            let abort = Message::Decide {
                txn,
                decision: Decided::Abort,
            };
            self.send(to, from, abort, true);
            return;
        }
        let mut msg = msg;
        if self.bugs.forge_long_memory
            && let Message::NoYesVote { for_ms, .. } = &mut msg
        {
            *for_ms = u64::MAX / 4;
        }
        if msg.is_for_coordinator() {
            let mut out = Vec::new();
            self.nodes[i].coordinator.handle(self.now, msg, &mut out);
            self.coordinator_actions(i, out);
        } else {
            let counts = match &msg {
                Message::Decide { .. } if by_participant => {
                    Some((PeerCount::Commit, PeerCount::Abort))
                }
                Message::NoYesVote { .. } => Some((PeerCount::None, PeerCount::NoYes)),
                _ => None,
            };
            let mut out = Vec::new();
            self.nodes[i].participant.handle(self.now, msg, &mut out);
            if let Some((commit, abort)) = counts {
                for action in &out {
                    match action {
                        ParticipantAction::Commit { .. } => self.count(commit),
                        ParticipantAction::Abort { .. } => self.count(abort),
                        _ => {}
                    }
                }
            }
            self.participant_actions(i, out);
        }
    }

    fn count(&mut self, what: PeerCount) {
        match what {
            PeerCount::None => {}
            PeerCount::Commit => self.stats.peer_commits += 1,
            PeerCount::Abort => self.stats.peer_aborts += 1,
            PeerCount::NoYes => self.stats.no_yes_aborts += 1,
        }
    }

    // The disk.

    fn write(&mut self, i: usize, entry: Entry) {
        let mut delay = self.rng.range(0, 3);
        if self.faults && self.rng.chance(10_000) {
            delay += self.rng.range(20, 200);
        }
        let due = self.now + delay;
        let disk = &mut self.nodes[i].disk;
        let due = disk.back().map_or(due, |(last, _)| due.max(*last));
        disk.push_back((due, entry));
    }

    /// Makes the entries due by now durable, in order, and reports their completions.
    fn disk(&mut self, i: usize) {
        while self.nodes[i].up
            && let Some((due, _)) = self.nodes[i].disk.front()
            && *due <= self.now
        {
            let (_, entry) = self.nodes[i].disk.pop_front().expect("front exists");
            let node = &mut self.nodes[i];
            match entry {
                Entry::Prepared {
                    txn,
                    prepare,
                    record,
                } => {
                    let reply = record.reply.clone();
                    node.prepared.insert((txn, prepare), record);
                    let mut out = Vec::new();
                    if self.bugs.writes_claim_read_only {
                        node.participant
                            .prepared_read_only(self.now, txn, Ok(reply), &mut out);
                    } else {
                        node.participant
                            .prepared(self.now, txn, Ok(reply), &mut out);
                    }
                    self.participant_actions(i, out);
                }
                Entry::Refused { txn, refusal } => {
                    let mut out = Vec::new();
                    node.participant
                        .prepared(self.now, txn, Err(refusal), &mut out);
                    self.participant_actions(i, out);
                }
                Entry::Commit { txn, prepare } => {
                    let record = node
                        .prepared
                        .remove(&(txn, prepare))
                        .expect("a commit of a durable prepared record");
                    for (key, value) in record.writes {
                        node.data.insert(key, value);
                    }
                    for key in record.keys {
                        if node.locks.get(&key) == Some(&(txn, prepare)) {
                            node.locks.remove(&key);
                        }
                    }
                    node.installed.push(txn);
                    let mut out = Vec::new();
                    node.participant.committed(self.now, txn, &mut out);
                    self.participant_actions(i, out);
                }
                Entry::Abort { txn, prepare } => {
                    node.prepared.remove(&(txn, prepare));
                }
                Entry::Decision(decision) => {
                    let txn = decision.txn;
                    node.decisions.insert(txn, decision);
                    let mut out = Vec::new();
                    node.coordinator.logged(self.now, txn, &mut out);
                    self.broadcast(i, out);
                }
                Entry::Forget(txn) => {
                    node.decisions.remove(&txn);
                }
            }
        }
    }

    // The roles' actions.

    fn coordinator_actions(&mut self, i: usize, actions: Vec<CAction>) {
        let me = Peer(i as u16);
        for action in actions {
            match action {
                CoordinatorAction::Send { to, msg } => self.send(me, to, msg, false),
                CoordinatorAction::LogCommit(decision) => self.write(i, Entry::Decision(decision)),
                CoordinatorAction::Forget(txn) => self.write(i, Entry::Forget(txn)),
                CoordinatorAction::Answer { txn, outcome } => self.answer(i, txn, outcome),
            }
        }
    }

    fn participant_actions(&mut self, i: usize, actions: Vec<PAction>) {
        let me = Peer(i as u16);
        for action in actions {
            match action {
                ParticipantAction::Send { to, msg } => self.send(me, to, msg, true),
                ParticipantAction::Prepare {
                    txn,
                    prepare,
                    participants,
                    work,
                } if self.now < self.nodes[i].fenced_until => {
                    self.nodes[i]
                        .deferred
                        .push((txn, prepare, participants, work));
                }
                ParticipantAction::Prepare {
                    txn,
                    prepare,
                    participants,
                    work,
                } => match self.execute(i, txn, prepare, participants, &work) {
                    Entry::Prepared {
                        txn,
                        prepare,
                        record,
                    } if record.writes.is_empty() => {
                        let reply = record.reply.clone();
                        self.nodes[i].reading.insert((txn, prepare), record);
                        let mut out = Vec::new();
                        self.nodes[i].participant.prepared_read_only(
                            self.now,
                            txn,
                            Ok(reply),
                            &mut out,
                        );
                        self.participant_actions(i, out);
                    }
                    entry => self.write(i, entry),
                },
                ParticipantAction::Commit { txn, prepare } => {
                    let node = &mut self.nodes[i];
                    if node.reading.remove(&(txn, prepare)).is_some() {
                        node.locks.retain(|_, holder| *holder != (txn, prepare));
                        let mut out = Vec::new();
                        node.participant.committed(self.now, txn, &mut out);
                        self.participant_actions(i, out);
                    } else {
                        self.write(i, Entry::Commit { txn, prepare });
                    }
                }
                ParticipantAction::Abort { txn, prepare } => {
                    let node = &mut self.nodes[i];
                    if node.installed.contains(&txn) {
                        self.stats.stale_prepares += 1;
                    }
                    node.locks.retain(|_, holder| *holder != (txn, prepare));
                    if node.reading.remove(&(txn, prepare)).is_none() {
                        self.write(i, Entry::Abort { txn, prepare });
                    }
                }
            }
        }
    }

    /// Runs `work` under strict two-phase locking: refuses if another prepare holds a key,
    /// else locks every key and computes the writes and the reply.
    fn execute(
        &mut self,
        i: usize,
        txn: TxnId,
        prepare: PrepareId,
        participants: Vec<Peer>,
        work: &Work,
    ) -> Entry {
        let me = Peer(i as u16);
        for step in work {
            assert_eq!(self.owner(step.key()), me, "work for another node's key");
        }
        let node = &mut self.nodes[i];
        let bugs = self.bugs;
        let locked = |key: &Key| match key {
            Key::Account(_) if bugs.unlocked_accounts => false,
            Key::List(_) if bugs.unlocked_lists => false,
            _ => node.locks.contains_key(key),
        };
        if work.iter().any(|step| locked(&step.key())) {
            return Entry::Refused {
                txn,
                refusal: Refusal::Busy,
            };
        }
        let mut view: BTreeMap<Key, Value> = BTreeMap::new();
        let mut reply = Vec::new();
        let mut written = BTreeSet::new();
        for step in work {
            let key = step.key();
            let current = view.get(&key).or(node.data.get(&key)).cloned();
            let current = current.unwrap_or(match key {
                Key::Account(_) => Value::Int(0),
                Key::List(_) => Value::List(Vec::new()),
            });
            match (step, current) {
                (Step::Get(_), value) => reply.push(Some(value)),
                (Step::Add(_, delta), Value::Int(v)) => {
                    view.insert(key, Value::Int(v + delta));
                    written.insert(key);
                    reply.push(None);
                }
                (Step::Append(_, elem), Value::List(mut list)) => {
                    list.push(*elem);
                    view.insert(key, Value::List(list));
                    written.insert(key);
                    reply.push(None);
                }
                (step, value) => panic!("{step:?} on {value:?}"),
            }
        }
        let keys: Vec<Key> = work
            .iter()
            .map(Step::key)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        for key in &keys {
            node.locks.insert(*key, (txn, prepare));
        }
        let writes = written
            .into_iter()
            .map(|k| (k, view.remove(&k).expect("written keys are in the view")))
            .collect();
        Entry::Prepared {
            txn,
            prepare,
            record: Prepared {
                participants,
                keys,
                writes,
                reply,
            },
        }
    }

    // Crashes.

    /// Carries out a coordinator's `Prepare`s or commit decisions, or, now and then, only
    /// some of them before the node crashes for long: the participants that heard must
    /// learn the outcome from each other.
    fn broadcast(&mut self, i: usize, mut out: Vec<CAction>) {
        if !self.faults || out.len() < 2 || !self.rng.chance(5_000) {
            self.coordinator_actions(i, out);
            return;
        }
        self.stats.crashes_mid_broadcast += 1;
        out.truncate(self.rng.below(out.len() as u64) as usize);
        self.coordinator_actions(i, out);
        let down_for = self.rng.range(600, 2500);
        self.crash_for(i, down_for);
    }

    fn crash(&mut self, i: usize) {
        let down_for = if self.rng.below(5) == 0 {
            self.rng.range(600, 2500)
        } else {
            self.rng.range(10, 400)
        };
        self.crash_for(i, down_for);
    }

    fn crash_for(&mut self, i: usize, down_for: u64) {
        self.stats.crashes += 1;
        let node = &mut self.nodes[i];
        node.up = false;
        node.down_until = self.now + down_for;
        node.disk.clear();
        node.locks.clear();
        node.reading.clear();
        node.deferred.clear();
        if self.bugs.volatile_prepare {
            node.prepared.clear();
        }
        let waiting = std::mem::take(&mut node.waiting);
        for (_, r) in waiting {
            let client = self.records[r].client;
            self.clients[client].waiting = false;
            self.clients[client].next_at = Some(self.now + down_for);
        }
    }

    fn restart(&mut self, i: usize) {
        let incarnation = self.incarnation();
        let peer = Peer(i as u16);
        let config = self.config.clone();
        let node = &mut self.nodes[i];
        node.up = true;
        if !self.bugs.no_restart_fence {
            node.fenced_until = self.now + config.vote_timeout_ms;
        }
        node.coordinator = Coordinator::new(peer, incarnation, config.clone());
        node.participant = Participant::new(peer, incarnation, config);
        for (&(txn, prepare), record) in &node.prepared {
            for key in &record.keys {
                let held = node.locks.insert(*key, (txn, prepare));
                if !self.bugs.unlocked_accounts && !self.bugs.unlocked_lists {
                    assert!(
                        held.is_none(),
                        "two prepared records lock {key:?}: {held:?} and {:?} at {}",
                        (txn, prepare),
                        self.now
                    );
                }
            }
        }
        self.stats.recovered_prepared += node.prepared.len() as u64;
        self.stats.recovered_decisions += node.decisions.len() as u64;
        let decisions: Vec<Decision> = node.decisions.values().cloned().collect();
        let records: Vec<Recovered<Reply>> = node
            .prepared
            .iter()
            .map(|(&(txn, prepare), record)| Recovered {
                txn,
                prepare,
                participants: record.participants.clone(),
                reply: record.reply.clone(),
            })
            .collect();
        let mut out = Vec::new();
        node.coordinator.recover(self.now, decisions, &mut out);
        self.coordinator_actions(i, out);
        let mut out = Vec::new();
        self.nodes[i]
            .participant
            .recover(self.now, records, &mut out);
        self.participant_actions(i, out);
    }

    // Clients.

    fn plan(&mut self) -> Plan {
        match self.rng.below(40) {
            0..=15 => {
                let from = self.rng.below(u64::from(ACCOUNTS)) as u32;
                let mut to = self.rng.below(u64::from(ACCOUNTS)) as u32;
                if to == from {
                    to = (to + 1) % ACCOUNTS;
                }
                let amount = self.rng.range(1, 30) as i64;
                Plan::Transfer { from, to, amount }
            }
            16 => Plan::Audit,
            _ => {
                let mut keys = BTreeSet::new();
                let len = self.rng.range(1, 4);
                while keys.len() < len as usize {
                    keys.insert(self.rng.below(u64::from(LISTS)) as u32);
                }
                let steps = keys
                    .into_iter()
                    .map(|k| match self.rng.below(3) {
                        0 => (k, true, false),
                        1 => (k, false, true),
                        _ => (k, true, true),
                    })
                    .collect();
                Plan::Lists(steps)
            }
        }
    }

    fn start(&mut self, c: usize) {
        let (plan, attempt) = match self.clients[c].retry.take() {
            Some((plan, attempt)) => {
                self.stats.retries += 1;
                (plan, attempt)
            }
            None => (self.plan(), 1),
        };
        let mut steps = Vec::new();
        match &plan {
            Plan::Transfer { from, to, amount } => {
                steps.push(Step::Get(Key::Account(*from)));
                steps.push(Step::Add(Key::Account(*from), -amount));
                steps.push(Step::Add(Key::Account(*to), *amount));
            }
            Plan::Audit => {
                steps.extend((0..ACCOUNTS).map(|a| Step::Get(Key::Account(a))));
            }
            Plan::Lists(keys) => {
                for &(k, read, append) in keys {
                    if read {
                        steps.push(Step::Get(Key::List(k)));
                    }
                    if append {
                        self.elem_last += 1;
                        steps.push(Step::Append(Key::List(k), self.elem_last));
                    }
                }
            }
        }
        let mut work: BTreeMap<Peer, Work> = BTreeMap::new();
        let mut placed = Vec::new();
        for step in steps {
            let owner = self.owner(step.key());
            let part = work.entry(owner).or_default();
            placed.push((step.clone(), owner, part.len()));
            part.push(step);
        }
        let node = self.clients[c].node;
        let i = node.0 as usize;
        let mut out = Vec::new();
        let begun = self.nodes[i]
            .coordinator
            .begin(self.now, work.into_iter().collect(), &mut out);
        let Ok(txn) = begun else {
            self.clients[c].next_at = Some(self.now + 10);
            self.clients[c].retry = Some((plan, attempt));
            return;
        };
        self.stats.txns += 1;
        let r = self.records.len();
        self.records.push(Record {
            client: c,
            plan: plan.clone(),
            txn,
            steps: placed,
            began: self.now,
            ended: None,
            heard: Heard::Nothing,
            replies: BTreeMap::new(),
        });
        self.nodes[i].waiting.insert(txn, r);
        let client = &mut self.clients[c];
        client.waiting = true;
        client.next_at = None;
        client.retry = Some((plan, attempt));
        self.broadcast(i, out);
    }

    fn answer(&mut self, i: usize, txn: TxnId, outcome: Outcome<Reply>) {
        let Some(r) = self.nodes[i].waiting.remove(&txn) else {
            panic!("answer for {txn}, which no client waits for");
        };
        let record = &mut self.records[r];
        let c = record.client;
        record.ended = Some(self.now);
        let client = &mut self.clients[c];
        client.waiting = false;
        let (plan, attempt) = client.retry.take().expect("set at start");
        let mut backoff = self.rng.range(0, 5);
        match outcome {
            Outcome::Committed(replies) => {
                record.heard = Heard::Committed;
                record.replies = replies.into_iter().collect();
            }
            Outcome::Aborted(reason) => {
                record.heard = Heard::Aborted;
                match reason {
                    AbortReason::Timeout => self.stats.aborted_timeout += 1,
                    AbortReason::Refused {
                        refusal: Refusal::Busy,
                        ..
                    } => self.stats.aborted_busy += 1,
                    _ => {}
                }
                let retryable = matches!(
                    reason,
                    AbortReason::Timeout
                        | AbortReason::Refused {
                            refusal: Refusal::Busy | Refusal::Overloaded,
                            ..
                        }
                );
                if retryable && attempt < ATTEMPTS_MAX {
                    client.retry = Some((plan, attempt + 1));
                    backoff += self.rng.range(1, 1 << (attempt + 2));
                }
            }
            Outcome::Unknown => {
                record.heard = Heard::Nothing;
                self.stats.answered_unknown += 1;
            }
        }
        client.next_at = Some(self.now + backoff);
    }

    // The checks.

    fn check(&mut self) -> Result<(), String> {
        for (i, node) in self.nodes.iter().enumerate() {
            if !node.locks.is_empty() {
                return Err(format!("node {i} still locks {:?}", node.locks));
            }
        }
        // Where each transaction was installed, and how often.
        let mut installed: BTreeMap<TxnId, BTreeMap<Peer, usize>> = BTreeMap::new();
        for (i, node) in self.nodes.iter().enumerate() {
            for txn in &node.installed {
                *installed
                    .entry(*txn)
                    .or_default()
                    .entry(Peer(i as u16))
                    .or_default() += 1;
            }
        }
        let total = i64::from(ACCOUNTS) * BALANCE;
        let mut history = Vec::new();
        for record in &self.records {
            let at = installed.remove(&record.txn).unwrap_or_default();
            if let Some((peer, _)) = at.iter().find(|(_, count)| **count > 1) {
                return Err(format!("{} installed twice on {peer}", record.txn));
            }
            let at: BTreeSet<Peer> = at.into_keys().collect();
            // A participant that only read installs nothing (its prepare left no record).
            let writers: BTreeSet<Peer> = record
                .steps
                .iter()
                .filter(|(step, ..)| !matches!(step, Step::Get(_)))
                .map(|(_, peer, _)| *peer)
                .collect();
            if !at.is_empty() && at != writers {
                return Err(format!(
                    "partial commit: {} installed on {at:?} of {writers:?}",
                    record.txn
                ));
            }
            let committed = if writers.is_empty() {
                record.heard == Heard::Committed
            } else {
                !at.is_empty()
            };
            match record.heard {
                Heard::Committed if !committed => {
                    return Err(format!(
                        "{} was answered committed and is installed nowhere",
                        record.txn
                    ));
                }
                Heard::Aborted if committed => {
                    return Err(format!(
                        "{} was answered aborted and is installed",
                        record.txn
                    ));
                }
                Heard::Committed => self.stats.committed += 1,
                Heard::Aborted => self.stats.aborted += 1,
                Heard::Nothing => {
                    self.stats.in_doubt += 1;
                    self.stats.in_doubt_committed += u64::from(committed);
                }
            }
            match &record.plan {
                Plan::Audit if record.heard == Heard::Committed => {
                    self.stats.audits_committed += 1;
                    let mut sum = 0;
                    for (_, peer, at) in &record.steps {
                        match record.read(*peer, *at)? {
                            Value::Int(v) => sum += v,
                            other => return Err(format!("an audit read {other:?}")),
                        }
                    }
                    if sum != total {
                        return Err(format!(
                            "audit {} saw a total of {sum}, not {total}",
                            record.txn
                        ));
                    }
                }
                Plan::Transfer { .. } if committed => self.stats.transfers_committed += 1,
                Plan::Lists(_) => history.push(self.list_record(record, committed)?),
                _ => {}
            }
        }
        if let Some(txn) = installed.keys().next() {
            return Err(format!("{txn} installed, but no client began it"));
        }
        let mut sum = 0;
        let mut lists = Vec::new();
        for node in &self.nodes {
            for (key, value) in &node.data {
                match (key, value) {
                    (Key::Account(_), Value::Int(v)) => sum += v,
                    (Key::List(k), Value::List(list)) => lists.push(history::Op::Read {
                        key: *k,
                        value: list.clone(),
                    }),
                    _ => unreachable!("a key holds its kind of value"),
                }
            }
        }
        if sum != total {
            return Err(format!("the bank holds {sum}, not {total}"));
        }
        let mut last = TxnRecord::committed("final state", lists);
        last.time = Some((self.now + 1, self.now + 2));
        history.push(last);
        let report = history::check(&history).map_err(|e| format!("history: {e}"))?;
        self.stats.lists_committed = report.committed as u64 - 1;
        self.stats.history_edges = report.edges;
        Ok(())
    }

    /// A list transaction for the checker. A transaction whose client did not hear the
    /// outcome keeps its appends only (its reads are unknown), as committed up to the end of
    /// the run if its participants installed it.
    fn list_record(&self, record: &Record, committed: bool) -> Result<TxnRecord, String> {
        let name = format!("{} (client {})", record.txn, record.client);
        let heard = record.heard == Heard::Committed;
        let mut ops = Vec::new();
        for (step, peer, at) in &record.steps {
            match step {
                Step::Get(Key::List(k)) if heard => {
                    let Value::List(list) = record.read(*peer, *at)? else {
                        return Err(format!("{} read a number from a list", record.txn));
                    };
                    ops.push(history::Op::Read {
                        key: *k,
                        value: list.clone(),
                    });
                }
                Step::Append(Key::List(k), elem) => ops.push(history::Op::Append {
                    key: *k,
                    elem: *elem,
                }),
                _ => {}
            }
        }
        let mut t = if committed {
            TxnRecord::committed(&name, ops)
        } else {
            TxnRecord::aborted(&name, ops)
        };
        t.time = Some((
            record.began,
            record.ended.filter(|_| heard).unwrap_or(self.now),
        ));
        Ok(t)
    }
}

impl Record {
    /// What step `at` of `peer`'s work read, from the replies the client was given.
    fn read(&self, peer: Peer, at: usize) -> Result<&Value, String> {
        match self.replies.get(&peer).and_then(|reply| reply.get(at)) {
            Some(Some(value)) => Ok(value),
            _ => Err(format!(
                "{}: the reply of {peer} has no value for its step {at}",
                self.txn
            )),
        }
    }
}

/// Runs seed `seed`; `Err` names the seed and the failed check.
fn run(seed: u64, bugs: Bugs) -> Result<Stats, String> {
    // A broken assertion inside the model or the protocol names its seed too.
    let ran = std::panic::catch_unwind(|| Sim::new(seed, bugs).run()).unwrap_or_else(|panic| {
        let text = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_default();
        Err(format!("panicked: {text}"))
    });
    ran.map_err(|e| format!("seed {seed} (KEEL_SIM_SEED={seed}): {e}"))
}

fn env(name: &str) -> Option<u64> {
    let text = std::env::var(name).ok()?;
    Some(
        text.parse()
            .unwrap_or_else(|_| panic!("{name}={text:?} is not a number")),
    )
}

#[test]
fn many_seeds_pass_every_check() {
    let seeds: Vec<u64> = match env("KEEL_SIM_SEED") {
        Some(seed) => vec![seed],
        None => {
            let from = env("KEEL_SIM_FROM").unwrap_or(0);
            (from..from + env("KEEL_SIM_RUNS").unwrap_or(300)).collect()
        }
    };
    let mut total = Stats::default();
    for &seed in &seeds {
        match run(seed, Bugs::default()) {
            Ok(stats) => total.add(&stats),
            Err(e) => panic!("{e}"),
        }
    }
    println!("{} seeds: {total:#?}", seeds.len());
    if seeds.len() >= 20 {
        // The runs must have exercised what they claim to.
        for (what, count) in [
            ("commits", total.committed),
            ("aborts", total.aborted),
            ("in-doubt transactions", total.in_doubt),
            (
                "in-doubt transactions that committed",
                total.in_doubt_committed,
            ),
            ("answers `Unknown`", total.answered_unknown),
            ("committed audits", total.audits_committed),
            ("committed transfers", total.transfers_committed),
            ("committed list transactions", total.lists_committed),
            ("dropped messages", total.dropped),
            ("duplicated messages", total.duplicated),
            ("crashes", total.crashes),
            ("crashes mid-broadcast", total.crashes_mid_broadcast),
            ("recovered prepared records", total.recovered_prepared),
            ("recovered decisions", total.recovered_decisions),
            ("inquiries", total.inquiries),
            ("questions to other participants", total.peer_inquiries),
            ("decisions told by participants", total.peer_decisions_told),
            ("`NoYesVote` answers", total.no_yes_votes),
            ("commits on a participant's word", total.peer_commits),
            ("aborts on a participant's word", total.peer_aborts),
            ("aborts on a `NoYesVote`", total.no_yes_aborts),
            ("stale prepares", total.stale_prepares),
            (
                "dependency edges in the histories",
                total.history_edges as u64,
            ),
        ] {
            assert!(count > 0, "no {what} in {} seeds: {total:#?}", seeds.len());
        }
    }
}

/// Runs seeds with `bugs` until one fails; panics if none does.
fn some_seed_fails(bugs: Bugs) -> String {
    some_seed_fails_within(40, bugs)
}

/// Runs up to `seeds` seeds with `bugs` until one fails; panics if none does.
fn some_seed_fails_within(seeds: u64, bugs: Bugs) -> String {
    for seed in 0..seeds {
        if let Err(e) = Sim::new(seed, bugs).run() {
            println!("seed {seed} fails, as it should: {e}");
            return e;
        }
    }
    panic!("no seed caught {bugs:?}");
}

#[test]
fn a_seed_replays_exactly() {
    let runs: Vec<String> = (0..2)
        .map(|_| format!("{:?}", run(7, Bugs::default()).unwrap()))
        .collect();
    assert_eq!(runs[0], runs[1]);
}

#[test]
fn catches_prepares_that_ignore_locks() {
    let e = some_seed_fails(Bugs {
        unlocked_accounts: true,
        ..Bugs::default()
    });
    assert!(e.contains("total of") || e.contains("bank holds"), "{e}");
    // With the bank intact, the serializability checker must be the one to see it.
    let e = some_seed_fails(Bugs {
        unlocked_lists: true,
        ..Bugs::default()
    });
    assert!(e.contains("history: "), "{e}");
}

#[test]
fn catches_prepared_records_lost_in_a_crash() {
    some_seed_fails(Bugs {
        volatile_prepare: true,
        ..Bugs::default()
    });
}

#[test]
fn catches_participants_that_answer_abort_without_knowing() {
    some_seed_fails(Bugs {
        forge_peer_aborts: true,
        ..Bugs::default()
    });
}

#[test]
fn catches_no_yes_votes_that_claim_too_long_a_memory() {
    // It needs a participant that committed and then forgot (a crash, or its bounded memory)
    // while another still waits for the decision, its coordinator down: seed 105 is the
    // first.
    some_seed_fails_within(
        300,
        Bugs {
            forge_long_memory: true,
            ..Bugs::default()
        },
    );
}

#[test]
fn catches_a_restart_that_writes_under_a_lost_read() {
    // A participant that only read votes at once and logs nothing; a crash then frees what
    // it read while its vote may still count. It needs that crash between the vote and the
    // last vote of a transaction whose coordinator hears late from another participant, and
    // a write in between: about one seed in 100 000. Seed 147751 is the first; a change to
    // the simulation or the protocol moves it, and `KEEL_SIM_FIND=1` with this test prints
    // the new one.
    const SEED: u64 = 147_751;
    let bugs = Bugs {
        no_restart_fence: true,
        ..Bugs::default()
    };
    if std::env::var("KEEL_SIM_FIND").is_ok() {
        some_seed_fails_within(1_000_000, bugs);
    }
    match run(SEED, bugs) {
        Err(e) => assert!(e.contains("total of") || e.contains("history: "), "{e}"),
        Ok(_) => panic!(
            "seed {SEED} no longer loses a read without the fence; find the seed that does \
             with KEEL_SIM_FIND=1"
        ),
    }
    run(SEED, Bugs::default()).expect("with the fence, the same seed passes");
}

#[test]
fn catches_writes_that_vote_as_reads() {
    let e = some_seed_fails(Bugs {
        writes_claim_read_only: true,
        ..Bugs::default()
    });
    assert!(
        e.contains("installed nowhere") || e.contains("partial"),
        "{e}"
    );
}

#[test]
fn catches_a_commit_without_every_yes_vote() {
    some_seed_fails(Bugs {
        forge_yes_votes: true,
        ..Bugs::default()
    });
}

//! Transactions across nodes (issue 20, slice 4): the server's driver of keel-cluster's
//! sans-IO two-phase commit ([`keel_cluster::txn`]), with the engine as every partition's
//! storage ([`keel::Txn::prepare`]) and [`keel_cluster::transport`] between nodes.
//!
//! One task owns this node's [`Coordinator`] and [`Participant`]; it takes the transport's
//! events, the clients' transactions and the storage's completions from channels, ticks the
//! timers every [`TICK`], and carries out the actions. Storage steps run on the task and
//! never block it: a prepare takes no lock waits (a held lock is a `Busy` vote, which the
//! coordinator retries with backoff) and does not wait for its fsync
//! ([`keel::Txn::prepare_async`]: the vote goes out from a small task once the frame is
//! durable), a decision is logged and installed without waiting
//! ([`keel::Prepared::commit_nowait`]: acknowledged once visible), and the decisions
//! database is written with `commit_async`. Handing each step to tokio's blocking threads
//! and its result back cost a thread wake-up each way (futex calls were 22% of a node's
//! time under `sync`).
//!
//! A transaction is one-shot: its work on a node is the commands of a `MULTI` block whose
//! keys that node owns, run there in one engine transaction and prepared. The replies travel
//! back with the yes vote. The prepared record's metadata (see [`Meta`]) holds the ids and the
//! replies, so that a restarted participant can vote again. The coordinator's commit
//! decisions are records of a second engine database, `cluster-decisions` in the data
//! directory, written durably before any participant hears commit and deleted once every
//! participant acknowledged. Not the node's own database: there a commit becomes durable and
//! then waits to become visible, which a transaction this node has prepared holds up until
//! the very decision being logged.
//!
//! The transport listens on the node's client port + [`BUS_PORT_OFFSET`] (as Redis Cluster's
//! bus does) on the node's own host.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use keel::{Db, Durability, PrepareFuture, Prepared};
use keel_cluster::transport::{self, Event, Transport};
use keel_cluster::txn::{
    CoordinatorAction, Decision, Message, Outcome, Participant, ParticipantAction, Peer, PrepareId,
    Recovered, Refusal, TxnId,
};
use keel_cluster::{Membership, txn::Coordinator};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use crate::data::{self, Fail, View};
use crate::reply::{Out, Proto};
use crate::server::Shared;
use crate::table;

/// The transport port is the client port plus this (Redis Cluster's bus convention).
pub const BUS_PORT_OFFSET: u16 = 10_000;
/// How often the protocol's timers run.
const TICK: Duration = Duration::from_millis(20);
/// Events and inputs the driver handles after the one it woke for before it releases the
/// messages they made (so a busy stream of them still goes out, and ticks still run).
const BATCH_MAX: usize = 64;

/// The decisions database, in the node's data directory.
const DECISIONS_DIR: &str = "cluster-decisions";

/// How many cluster timeouts the coordinator waits for every participant to install a
/// committed transaction before it answers the client anyway.
const ACK_WAIT_TIMEOUTS: u64 = 15;

/// How long a transaction prepared here stays undecided, in cluster timeouts, before reads
/// of its keys here wait for its decision (see [`Stuck`]). Far below [`ACK_WAIT_TIMEOUTS`]:
/// the coordinator answers its client early only after that many, so by then every read
/// here that could follow the answer waits.
const STUCK_AFTER_TIMEOUTS: u32 = 1;
/// How long such a read waits, in halves of a cluster timeout, before it is answered
/// [`STUCK_TEXT`]: less than the timeout, within which a node that forwarded the request
/// expects its answer.
const STUCK_READ_WAIT_HALF_TIMEOUTS: u32 = 1;

/// The answer to a command that waited in vain for a stuck transaction's decision.
pub const STUCK_TEXT: &str = "TRYAGAIN keel: a transaction across nodes that holds this key \
    was committed but its decision has not reached this node yet; try again";

/// One node's part of a transaction: commands, run in order in one engine transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Work {
    /// Replies in RESP3 (the client said `HELLO 3`).
    pub resp3: bool,
    /// The commands, each its arguments.
    pub commands: Vec<Vec<Vec<u8>>>,
    /// `WATCH` of these user keys: after the commands' replies, one more reply, a
    /// [`WatchReport`] of what to check at `EXEC`.
    pub watch: Vec<Vec<u8>>,
    /// `EXEC` under `WATCH`: engine keys that must not have a version newer than the given
    /// timestamp, checked before the commands run ...
    pub checks: Vec<(Vec<u8>, u64)>,
    /// ... and deadlines (unix ms) of watched keys that must still be ahead.
    pub deadlines: Vec<u64>,
    /// A transaction that only reads and lost conflicts several times in a row: its prepare
    /// may wait for the decision of a transaction prepared on a record it reads
    /// ([`Driver::again`]).
    pub patient: bool,
}

/// What `WATCH` of a node's keys recorded (see [`crate::conn::watch_targets`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchReport {
    /// Engine keys, with the timestamp of the snapshot that watched them.
    pub keys: Vec<(Vec<u8>, u64)>,
    /// Deadlines still ahead.
    pub deadlines: Vec<u64>,
}

/// The refusal text of a participant whose watched keys changed: `EXEC` answers nil.
pub const WATCH_CHANGED: &str = "keel: a watched key changed";

/// The replies of one node's work, each command's RESP bytes.
pub type Replies = Vec<Vec<u8>>;

type Msg = Message<Work, Replies>;

/// What nodes send each other on the cluster bus (postcard-encoded, back to back in each
/// frame): for tools and tests that look at the traffic.
pub type BusMessage = Msg;

/// What a prepared record keeps beside its writes (the engine's prepare metadata).
#[derive(Debug, Serialize, Deserialize)]
struct Meta {
    txn: TxnId,
    prepare: PrepareId,
    participants: Vec<Peer>,
    reply: Replies,
}

/// Counters for `INFO cluster`.
#[derive(Debug, Default)]
pub struct Stats {
    pub begun: AtomicU64,
    pub committed: AtomicU64,
    pub aborted: AtomicU64,
    pub unknown: AtomicU64,
    pub prepares: AtomicU64,
    pub prepares_refused: AtomicU64,
    /// Prepares refused on a conflict that ran again on their participant (`Driver::again`).
    pub prepares_again: AtomicU64,
    pub recovered_prepared: AtomicU64,
    pub recovered_decisions: AtomicU64,
    /// `EXEC`s whose keys were all on one other node: forwarded, committed there in one phase.
    pub one_node_forwarded: AtomicU64,
    /// Aborted transactions by reason: a conflict (lock busy, read changed, overloaded), a
    /// vote timeout, a failing command.
    pub aborts_conflict: AtomicU64,
    pub aborts_timeout: AtomicU64,
    pub aborts_failed: AtomicU64,
    /// Committed two-phase transactions' latency, begin to answer: total microseconds, and
    /// the largest.
    pub commit_us_total: AtomicU64,
    pub commit_us_max: AtomicU64,
    /// Commands that waited for a stuck transaction's decision ([`Stuck`]), and those of
    /// them answered [`STUCK_TEXT`].
    pub stuck_waits: AtomicU64,
    pub stuck_refused: AtomicU64,
}

enum Input {
    Begin {
        work: Vec<(Peer, Work)>,
        answer: oneshot::Sender<Outcome<Replies>>,
    },
    Prepared {
        txn: TxnId,
        result: Result<Replies, Refusal>,
        /// The prepare writes nothing (`Prepared::is_read_only`).
        read_only: bool,
    },
    Committed {
        txn: TxnId,
    },
    Logged {
        txn: TxnId,
    },
    /// A prepare refused on a conflict, to run again once what refused it passed
    /// (`Driver::again`): with `joined`, while the engine holds the joined phase open.
    Again {
        txn: TxnId,
        prepare: PrepareId,
        participants: Vec<Peer>,
        work: Work,
        joined: Option<keel::Joined<'static>>,
        /// How many times it ran again so.
        tries: u32,
    },
}

/// The prepared transactions on this node whose reads the engine does not hold: those that
/// scanned a range (a key inserted into it later follows them without touching a record
/// they hold), and those recovered in doubt (their read holds were not logged).
///
/// Commitment ordering needs every transaction that follows a prepared one in a node's
/// conflict order to vote only after that one's decision; otherwise two transactions that
/// each read on one node what the other writes there, preparing in opposite orders on two
/// nodes, would both commit (the Elle test found that write skew under load). A prepared
/// transaction holds the keys it wrote (exclusively) and read (shared) in the engine, so for
/// keys nothing can follow it before its decision, on this node or through a local commit
/// (`keel/src/txn/prepared.rs`). For the transactions counted here the gate does it: one at
/// a time, taken before its validation, and every other prepare checks after its own
/// validation that none is undecided, or aborts. A transaction that follows one counted here
/// through a local commit validated after that commit, which came after the counted one's
/// validation, so its check sees it.
#[derive(Default)]
struct Gate {
    unheld: Mutex<usize>,
    freed: parking_lot::Condvar,
}

impl Gate {
    /// Waits at most `wait` for no transaction to be counted; the count, locked, if none is.
    fn none_within(&self, wait: Duration) -> Option<parking_lot::MutexGuard<'_, usize>> {
        let deadline = Instant::now() + wait;
        let mut unheld = self.unheld.lock();
        while *unheld > 0 {
            if self.freed.wait_until(&mut unheld, deadline).timed_out() {
                return None;
            }
        }
        Some(unheld)
    }

    /// Waits at most `wait` for no transaction to be counted; whether none is.
    fn clear(&self, wait: Duration) -> bool {
        self.none_within(wait).is_some()
    }

    /// Counts a transaction whose reads are not held, once none is, waiting at most `wait`;
    /// whether it did.
    fn enter(&self, wait: Duration) -> bool {
        self.none_within(wait)
            .map(|mut unheld| *unheld = 1)
            .is_some()
    }

    fn leave(&self) {
        let mut unheld = self.unheld.lock();
        *unheld = unheld.saturating_sub(1);
        if *unheld == 0 {
            self.freed.notify_all();
        }
    }
}

/// A prepared transaction this node holds, and its commands (to wake blocked clients once
/// committed).
struct Held {
    prepared: Prepared<'static>,
    commands: Arc<Vec<Vec<Vec<u8>>>>,
    /// Counted by the [`Gate`] until decided.
    gated: bool,
    /// When it was prepared here.
    since: Instant,
    /// In [`Stuck`].
    stuck: bool,
}

/// Prepared transactions undecided here for [`STUCK_AFTER_TIMEOUTS`] cluster timeouts, and
/// those recovered in doubt: commands that touch their keys wait for their decision.
///
/// A participant that has not installed a committed transaction still holds its keys, so
/// writers meeting them wait; but a read of them here runs at the watermark, below the
/// prepared timestamp, and sees the value before it. While the coordinator waits for this
/// node's acknowledgement, that is serializable and in real-time order: the client has no
/// answer yet. But a coordinator that heard nothing from a participant for `ack_wait_ms`
/// answers its client anyway, and a read here after that answer would miss the commit (and
/// so would a read by a node that crashed prepared and restarted). So once a transaction
/// is undecided here far longer than a decision takes, reads of its keys here wait for the
/// decision (and its install), up to [`STUCK_READ_WAIT_HALF_TIMEOUTS`], then answer
/// [`STUCK_TEXT`]. Keys are the user keys of its commands; a transaction recovered in doubt
/// (its commands are not logged) and a command without keys (`KEYS`, `SCAN`, `DBSIZE`)
/// meet every stuck transaction.
#[derive(Default)]
pub struct Stuck {
    count: AtomicUsize,
    /// Each stuck transaction's user keys (`None`: unknown, so every key).
    txns: Mutex<HashMap<TxnId, Option<Vec<Vec<u8>>>>>,
}

impl Stuck {
    /// Whether any transaction is stuck: one load, so commands pay nothing while none is.
    #[inline]
    pub fn any(&self) -> bool {
        self.count.load(Relaxed) > 0
    }

    /// Whether a stuck transaction holds one of `keys`, or, with no keys, any stuck at all.
    pub fn holds(&self, keys: &[Vec<u8>]) -> bool {
        let txns = self.txns.lock();
        if keys.is_empty() {
            return !txns.is_empty();
        }
        txns.values().any(|held| match held {
            None => true,
            Some(held) => held.iter().any(|h| keys.contains(h)),
        })
    }

    fn mark(&self, txn: TxnId, keys: Option<Vec<Vec<u8>>>) {
        let mut txns = self.txns.lock();
        txns.insert(txn, keys);
        self.count.store(txns.len(), Relaxed);
    }

    fn clear(&self, txn: TxnId) {
        if !self.any() {
            return;
        }
        let mut txns = self.txns.lock();
        txns.remove(&txn);
        self.count.store(txns.len(), Relaxed);
    }

    /// How many transactions are stuck now.
    pub fn len(&self) -> usize {
        self.count.load(Relaxed)
    }
}

/// The user keys `commands` touch.
fn user_keys(commands: &[Vec<Vec<u8>>]) -> Vec<Vec<u8>> {
    let mut keys = Vec::new();
    for command in commands {
        if let Some(spec) = command.first().and_then(|name| table::lookup(name)) {
            keys.extend(crate::cluster::key_args_owned(spec, command));
        }
    }
    keys
}

/// This node's end of cross-node transactions.
pub struct Xnode {
    inputs: mpsc::UnboundedSender<Input>,
    pub stats: Arc<Stats>,
    pub incarnation: u64,
    pub stuck: Arc<Stuck>,
    /// How long a command waits for stuck transactions' decisions.
    stuck_read_wait: Duration,
}

/// Why the driver could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen for cluster peers on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("node {id}'s client port {port} leaves no bus port (port + {BUS_PORT_OFFSET})")]
    NoBusPort { id: String, port: u16 },
    #[error("{given} bus addresses for {nodes} nodes")]
    BusCount { given: usize, nodes: usize },
    #[error("cannot open the coordinator's decisions: {0}")]
    Decisions(#[source] keel::OpenError),
    #[error("a prepared transaction in the log has metadata keel cannot read: {0}")]
    Meta(String),
}

/// Every node's transport address, by index.
pub fn bus_addrs(map: &Membership) -> Result<Vec<SocketAddr>, StartError> {
    map.nodes()
        .iter()
        .map(|n| {
            let port = n.addr.port().checked_add(BUS_PORT_OFFSET).ok_or_else(|| {
                StartError::NoBusPort {
                    id: n.id.to_string(),
                    port: n.addr.port(),
                }
            })?;
            Ok(SocketAddr::new(n.addr.ip(), port))
        })
        .collect()
}

/// A fresh incarnation: differs from every earlier run of this node (with overwhelming
/// probability), so that transaction and prepare ids are never reused.
fn incarnation() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    RandomState::new().hash_one((now, std::process::id())) | 1
}

fn decision_key(txn: TxnId) -> Vec<u8> {
    let mut key = Vec::with_capacity(18);
    key.extend_from_slice(&txn.coordinator.0.to_be_bytes());
    key.extend_from_slice(&txn.incarnation.to_be_bytes());
    key.extend_from_slice(&txn.seq.to_be_bytes());
    key
}

impl Xnode {
    /// Recovers this node's prepared transactions and commit decisions from `db`, starts the
    /// transport and the driver. Must run inside the server's runtime, before it serves.
    pub async fn start(shared: &Arc<Shared>, map: &Membership) -> Result<Xnode, StartError> {
        let me = Peer(u16::try_from(map.myself()).expect("at most u16::MAX nodes"));
        let incarnation = incarnation();
        let addrs = match &shared.config.cluster_bus {
            given if given.is_empty() => bus_addrs(map)?,
            given if given.len() == map.nodes().len() => given.clone(),
            given => {
                return Err(StartError::BusCount {
                    given: given.len(),
                    nodes: map.nodes().len(),
                });
            }
        };
        let listen = SocketAddr::new(shared.config.bind, addrs[map.myself()].port());
        let bind = |source| StartError::Bind {
            addr: listen,
            source,
        };
        let listener = match &shared.config.cluster_bus_listener {
            Some(listener) => {
                let listener = listener.try_clone().map_err(bind)?;
                listener.set_nonblocking(true).map_err(bind)?;
                tokio::net::TcpListener::from_std(listener).map_err(bind)?
            }
            None => tokio::net::TcpListener::bind(listen).await.map_err(bind)?,
        };
        let (transport, events) = Transport::<Msg>::start(
            map,
            &addrs,
            incarnation,
            listener,
            transport::Config::default(),
        )
        .map_err(bind)?;
        let config = keel_cluster::txn::Config {
            // The client is answered once every participant has installed (real-time
            // order); a participant that stays silent this long is answered for anyway,
            // which is serializable but not strictly (a later read of that participant may
            // miss the commit until it installs). 15 cluster timeouts (30 s by default): the
            // full-CI Elle run saw a participant's install take over 2 s under load, and the
            // early answer then broke real-time order.
            ack_wait_ms: (map.timeout().as_millis() as u64).saturating_mul(ACK_WAIT_TIMEOUTS),
            ..Default::default()
        };
        let mut coordinator = Coordinator::new(me, incarnation, config.clone());
        let mut participant = Participant::new(me, incarnation, config.clone());
        let stats = Arc::new(Stats::default());
        let db = shared.db;
        let held: Arc<Mutex<HashMap<TxnId, Held>>> = Arc::default();
        let stuck: Arc<Stuck> = Arc::default();

        // Recovery: the prepared records in doubt, and the decisions not yet forgotten.
        let mut records = Vec::new();
        for prepared in db.in_doubt() {
            let meta: Meta = postcard::from_bytes(prepared.meta())
                .map_err(|e| StartError::Meta(e.to_string()))?;
            records.push(Recovered {
                txn: meta.txn,
                prepare: meta.prepare,
                participants: meta.participants,
                reply: meta.reply,
            });
            // The coordinator may have answered its client before this node stopped:
            // reads wait for the decision from the start.
            stuck.mark(meta.txn, None);
            held.lock().insert(
                meta.txn,
                Held {
                    prepared,
                    commands: Arc::default(),
                    gated: true,
                    since: Instant::now(),
                    stuck: true,
                },
            );
        }
        // Transactions recovered in doubt hold no reads: the gate counts them until decided.
        let gate = Arc::new(Gate::default());
        *gate.unheld.lock() = records.len();
        // An earlier incarnation of this node ran in the cluster (its decisions database is
        // there): see `Driver::deferred`. (A replicated cluster's transactions across
        // partitions are log entries of theirs, not this driver's.)
        let restarted = shared.config.replicas <= 1
            && shared
                .db
                .dir()
                .is_some_and(|dir| dir.join(DECISIONS_DIR).exists());
        let decisions_db = match shared.db.dir() {
            Some(dir) => {
                let path = dir.join(DECISIONS_DIR);
                let options = keel::Options::default().durability(Durability::Sync);
                tokio::task::spawn_blocking(move || Db::open(path, options))
                    .await
                    .expect("opening a database does not panic")
                    .map_err(StartError::Decisions)?
            }
            None => Db::in_memory(),
        };
        let decisions_db: &'static Db = Box::leak(Box::new(decisions_db));
        let decisions = read_decisions(decisions_db).map_err(StartError::Meta)?;
        stats
            .recovered_prepared
            .store(records.len() as u64, Relaxed);
        stats
            .recovered_decisions
            .store(decisions.len() as u64, Relaxed);
        let started = Instant::now();
        let now_ms = move || started.elapsed().as_millis() as u64;
        let mut coordinator_out = Vec::new();
        let mut participant_out = Vec::new();
        coordinator.recover(now_ms(), decisions, &mut coordinator_out);
        participant.recover(now_ms(), records, &mut participant_out);

        if restarted {
            // See `Driver::deferred`.
            let fence = Duration::from_millis(config.vote_timeout_ms);
            db.hold_writes_for(fence);
            tracing::info!(
                "cluster: restarted; writes and prepares wait {} ms (the vote timeout) for \
                 what the last run's votes read",
                fence.as_millis()
            );
        }
        let (inputs, inputs_rx) = mpsc::unbounded_channel();
        if let Some(cluster) = &shared.cluster {
            // For INFO cluster and CLUSTER INFO.
            let _ = cluster.bus.set(transport.stats_handle());
        }
        let mut driver = Driver {
            shared: Arc::clone(shared),
            me,
            coordinator,
            participant,
            transport,
            inputs: inputs.clone(),
            answers: HashMap::new(),
            held,
            gate,
            decisions: decisions_db,
            stats: Arc::clone(&stats),
            now_ms: Box::new(now_ms),
            stuck: Arc::clone(&stuck),
            stuck_after: map.timeout() * STUCK_AFTER_TIMEOUTS,
            installing: Arc::default(),
            deferred: Vec::new(),
        };
        driver.carry_out(coordinator_out, participant_out);
        let token = shared.shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = driver.run(events, inputs_rx) => {}
                () = token.cancelled() => {}
            }
        });
        Ok(Xnode {
            inputs,
            stats,
            incarnation,
            stuck,
            stuck_read_wait: map.timeout() * STUCK_READ_WAIT_HALF_TIMEOUTS / 2,
        })
    }

    /// Waits until no stuck transaction holds one of `keys` (with no keys: until none is
    /// stuck), or answers [`STUCK_TEXT`] after [`STUCK_READ_WAIT_HALF_TIMEOUTS`] halves of a
    /// cluster timeout.
    pub async fn wait_unstuck(&self, keys: &[Vec<u8>]) -> Result<(), Fail> {
        if !self.stuck.holds(keys) {
            return Ok(());
        }
        self.stats.stuck_waits.fetch_add(1, Relaxed);
        let deadline = Instant::now() + self.stuck_read_wait;
        while self.stuck.holds(keys) {
            if Instant::now() >= deadline {
                self.stats.stuck_refused.fetch_add(1, Relaxed);
                return Err(STUCK_TEXT.into());
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(())
    }

    /// Runs `work` (per node) as one transaction and waits for its outcome.
    pub async fn run(&self, work: Vec<(Peer, Work)>) -> Outcome<Replies> {
        let began = Instant::now();
        let (answer, outcome) = oneshot::channel();
        if self.inputs.send(Input::Begin { work, answer }).is_err() {
            return Outcome::Unknown;
        }
        let outcome = outcome.await.unwrap_or(Outcome::Unknown);
        let s = &self.stats;
        match &outcome {
            Outcome::Committed(_) => {
                let us = began.elapsed().as_micros() as u64;
                s.commit_us_total.fetch_add(us, Relaxed);
                s.commit_us_max.fetch_max(us, Relaxed);
            }
            Outcome::Aborted(keel_cluster::txn::AbortReason::Timeout) => {
                s.aborts_timeout.fetch_add(1, Relaxed);
            }
            Outcome::Aborted(keel_cluster::txn::AbortReason::Refused {
                refusal: Refusal::Failed(_),
                ..
            }) => {
                s.aborts_failed.fetch_add(1, Relaxed);
            }
            Outcome::Aborted(_) => {
                s.aborts_conflict.fetch_add(1, Relaxed);
            }
            Outcome::Unknown => {}
        }
        outcome
    }
}

fn read_decisions(db: &Db) -> Result<Vec<Decision>, String> {
    let snapshot = db.snapshot().map_err(|e| e.to_string())?;
    snapshot
        .range::<&[u8]>(..)
        .map(|(_, v)| postcard::from_bytes(&v).map_err(|e| e.to_string()))
        .collect()
}

struct Driver {
    shared: Arc<Shared>,
    me: Peer,
    coordinator: Coordinator<Work, Replies>,
    participant: Participant<Replies>,
    transport: Transport<Msg>,
    inputs: mpsc::UnboundedSender<Input>,
    answers: HashMap<TxnId, oneshot::Sender<Outcome<Replies>>>,
    held: Arc<Mutex<HashMap<TxnId, Held>>>,
    gate: Arc<Gate>,
    /// The commit decisions' database.
    decisions: &'static Db,
    stats: Arc<Stats>,
    now_ms: Box<dyn Fn() -> u64 + Send>,
    stuck: Arc<Stuck>,
    /// How long a prepared transaction stays undecided before it is stuck.
    stuck_after: Duration,
    /// Transactions committed here and not visible yet (an earlier prepared one holds the
    /// watermark): they age toward [`Stuck`] as held ones do.
    installing: Arc<Mutex<HashMap<TxnId, Installing>>>,
    /// The prepares that wait while the engine holds writes back after a restart
    /// (`Db::hold_writes_for`, for the vote timeout from the start). A prepare that only read
    /// logs nothing, so the crash released what it read, but its yes vote can still count
    /// until its coordinator's vote timeout; a write here before then could slip under that
    /// read. The vote timeout from the restart covers every such vote (the crash came after
    /// it, and the transaction began before). The simulation's
    /// `catches_a_restart_that_writes_under_a_lost_read` shows what goes wrong without it.
    deferred: Vec<(TxnId, PrepareId, Vec<Peer>, Work)>,
}

/// A committed transaction waiting to become visible.
struct Installing {
    since: Instant,
    commands: Arc<Vec<Vec<Vec<u8>>>>,
    stuck: bool,
}

impl Driver {
    async fn run(
        &mut self,
        mut events: mpsc::Receiver<Event<Msg>>,
        mut inputs: mpsc::UnboundedReceiver<Input>,
    ) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let (mut c, mut p) = (Vec::new(), Vec::new());
            tokio::select! {
                event = events.recv() => match event {
                    Some(event) => self.event(event, &mut c, &mut p),
                    None => return,
                },
                input = inputs.recv() => match input {
                    Some(input) => self.input(input, &mut c, &mut p),
                    None => return,
                },
                _ = tick.tick() => {
                    let now = (self.now_ms)();
                    self.coordinator.tick(now, &mut c);
                    self.participant.tick(now, &mut p);
                    self.mark_stuck();
                    if !self.deferred.is_empty() && self.shared.db.writes_held_for().is_zero() {
                        for (txn, prepare, participants, work) in std::mem::take(&mut self.deferred) {
                            self.prepare(txn, prepare, participants, work, (None, 0));
                        }
                    }
                }
            }
            self.carry_out(c, p);
            // Whatever else is ready now is handled before the messages go out, so that they
            // leave in one frame per peer (`Transport::hold`): the votes for a frame of
            // prepares, the decisions and acknowledgements of several transactions.
            for _ in 0..BATCH_MAX {
                let (mut c, mut p) = (Vec::new(), Vec::new());
                if let Ok(event) = events.try_recv() {
                    self.event(event, &mut c, &mut p);
                } else if let Ok(input) = inputs.try_recv() {
                    self.input(input, &mut c, &mut p);
                } else {
                    break;
                }
                self.carry_out(c, p);
            }
            self.transport.release();
        }
    }

    fn event(
        &mut self,
        event: Event<Msg>,
        c: &mut Vec<CoordinatorAction<Work, Replies>>,
        p: &mut Vec<ParticipantAction<Work, Replies>>,
    ) {
        match event {
            Event::Received { message, .. } => self.deliver(message, c, p),
            Event::Refused { peer, addr, why } => {
                tracing::error!("cluster peer {peer:?} at {addr} refused: {why}")
            }
            Event::PeerDown { peer, why } => tracing::warn!("cluster peer {peer} is down: {why}"),
            Event::Broken { peer, why } => {
                tracing::warn!("cluster peer {peer} sent a bad frame: {why}")
            }
            _ => {}
        }
    }

    /// Marks the transactions prepared here for [`Driver::stuck_after`] as stuck.
    fn mark_stuck(&self) {
        let mark = |txn: TxnId, since: Instant, stuck: &mut bool, commands: &[_]| {
            if !*stuck && since.elapsed() >= self.stuck_after {
                *stuck = true;
                self.stuck.mark(txn, Some(user_keys(commands)));
            }
        };
        for (&txn, h) in self.held.lock().iter_mut() {
            mark(txn, h.since, &mut h.stuck, &h.commands);
        }
        for (&txn, i) in self.installing.lock().iter_mut() {
            mark(txn, i.since, &mut i.stuck, &i.commands);
        }
    }

    fn deliver(
        &mut self,
        msg: Msg,
        c: &mut Vec<CoordinatorAction<Work, Replies>>,
        p: &mut Vec<ParticipantAction<Work, Replies>>,
    ) {
        // `PeerInquire` and `NoYesVote` (participants asking each other while a coordinator
        // is away) go to the participant like `Prepare` and `Decide`.
        let now = (self.now_ms)();
        if msg.is_for_coordinator() {
            self.coordinator.handle(now, msg, c);
        } else {
            self.participant.handle(now, msg, p);
        }
    }

    fn input(
        &mut self,
        input: Input,
        c: &mut Vec<CoordinatorAction<Work, Replies>>,
        p: &mut Vec<ParticipantAction<Work, Replies>>,
    ) {
        let now = (self.now_ms)();
        match input {
            Input::Begin { work, answer } => match self.coordinator.begin(now, work, c) {
                Ok(txn) => {
                    self.stats.begun.fetch_add(1, Relaxed);
                    self.answers.insert(txn, answer);
                }
                Err(e) => {
                    let refusal = Refusal::Failed(format!("ERR keel: {e}"));
                    let reason = keel_cluster::txn::AbortReason::Refused {
                        by: self.me,
                        refusal,
                    };
                    let _ = answer.send(Outcome::Aborted(reason));
                }
            },
            Input::Prepared {
                txn,
                result,
                read_only: true,
            } => self.participant.prepared_read_only(now, txn, result, p),
            Input::Prepared { txn, result, .. } => self.participant.prepared(now, txn, result, p),
            Input::Committed { txn } => self.participant.committed(now, txn, p),
            Input::Logged { txn } => self.coordinator.logged(now, txn, c),
            Input::Again {
                txn,
                prepare,
                participants,
                work,
                joined,
                tries,
            } => self.prepare(txn, prepare, participants, work, (joined, tries)),
        }
    }

    /// Carries out actions until none are left (a message to this node is handled at once,
    /// and may make more).
    fn carry_out(
        &mut self,
        mut c: Vec<CoordinatorAction<Work, Replies>>,
        mut p: Vec<ParticipantAction<Work, Replies>>,
    ) {
        while !c.is_empty() || !p.is_empty() {
            let (mut c2, mut p2) = (Vec::new(), Vec::new());
            for action in c.drain(..) {
                match action {
                    CoordinatorAction::Send { to, msg } => self.send(to, msg, &mut c2, &mut p2),
                    CoordinatorAction::LogCommit(decision) => self.log_commit(decision),
                    CoordinatorAction::Forget(txn) => self.forget(txn),
                    CoordinatorAction::Answer { txn, outcome } => {
                        let counter = match &outcome {
                            Outcome::Committed(_) => &self.stats.committed,
                            Outcome::Aborted(_) => &self.stats.aborted,
                            Outcome::Unknown => &self.stats.unknown,
                        };
                        counter.fetch_add(1, Relaxed);
                        if let Some(answer) = self.answers.remove(&txn) {
                            let _ = answer.send(outcome);
                        }
                    }
                }
            }
            for action in p.drain(..) {
                match action {
                    ParticipantAction::Send { to, msg } => self.send(to, msg, &mut c2, &mut p2),
                    ParticipantAction::Prepare {
                        txn,
                        prepare,
                        participants,
                        work,
                    } if !self.shared.db.writes_held_for().is_zero() => {
                        self.deferred.push((txn, prepare, participants, work));
                    }
                    ParticipantAction::Prepare {
                        txn,
                        prepare,
                        participants,
                        work,
                    } => self.prepare(txn, prepare, participants, work, (None, 0)),
                    ParticipantAction::Commit { txn, .. } => self.commit(txn),
                    ParticipantAction::Abort { txn, .. } => self.abort(txn),
                }
            }
            c = c2;
            p = p2;
        }
    }

    fn send(
        &mut self,
        to: Peer,
        msg: Msg,
        c: &mut Vec<CoordinatorAction<Work, Replies>>,
        p: &mut Vec<ParticipantAction<Work, Replies>>,
    ) {
        if to == self.me {
            self.deliver(msg, c, p);
        } else if let Err(e) = self.transport.hold(to, &msg) {
            // Dropped: the protocol resends what matters.
            tracing::debug!("cluster message to {to} dropped: {e}");
        }
    }

    fn log_commit(&self, decision: Decision) {
        let (db, inputs) = (self.decisions, self.inputs.clone());
        let txn = decision.txn;
        let value = postcard::to_stdvec(&decision).expect("a decision encodes");
        soon(async move {
            match write_decision(db, &decision_key(txn), Some(&value)).await {
                Ok(()) => {
                    let _ = inputs.send(Input::Logged { txn });
                }
                // Never logged: the coordinator answers `Unknown` at the client deadline and
                // the participants learn abort when they inquire.
                Err(e) => tracing::error!("logging the commit decision of {txn}: {e}"),
            }
        });
    }

    fn forget(&self, txn: TxnId) {
        let db = self.decisions;
        soon(async move {
            if let Err(e) = write_decision(db, &decision_key(txn), None).await {
                tracing::warn!("forgetting the decision of {txn}: {e}");
            }
        });
    }

    /// Runs the commands and prepares them here, on the driver's task: a prepare takes no
    /// lock waits (the holders' decisions run here too) and does not wait for the disk; the
    /// vote goes out once the prepare frame is durable. One refused on a conflict may run
    /// again here ([`Driver::again`]); `again` is how (holding the joined phase, or not) and
    /// how many times it did so.
    fn prepare(
        &self,
        txn: TxnId,
        prepare: PrepareId,
        participants: Vec<Peer>,
        work: Work,
        again: (Option<keel::Joined<'static>>, u32),
    ) {
        self.stats.prepares.fetch_add(1, Relaxed);
        let db = self.shared.db;
        let (joined, tries) = again;
        let mut conflict = None;
        let result = if self.gate.clear(Duration::ZERO) {
            execute(&self.shared, &work, &self.gate, &mut conflict, |reply| {
                Meta {
                    txn,
                    prepare,
                    participants: participants.clone(),
                    reply,
                }
            })
        } else {
            Err(Refusal::Busy)
        };
        drop(joined);
        let (mut pending, reply, gated) = match result {
            Ok(prepared) => prepared,
            Err(Refusal::Busy)
                if tries < AGAIN_MAX
                    && conflict.as_ref().is_some_and(|c| may_again(db, c, &work)) =>
            {
                let conflict = conflict.expect("checked");
                return self.again(txn, prepare, participants, work, conflict, tries);
            }
            Err(refusal) => {
                self.stats.prepares_refused.fetch_add(1, Relaxed);
                let _ = self.inputs.send(Input::Prepared {
                    txn,
                    result: Err(refusal),
                    read_only: false,
                });
                return;
            }
        };
        let (inputs, held, gate) = (
            self.inputs.clone(),
            Arc::clone(&self.held),
            Arc::clone(&self.gate),
        );
        let stats = Arc::clone(&self.stats);
        let vote = move |prepared: Result<Prepared<'static>, keel::CommitError>| {
            let mut read_only = false;
            let result = match prepared {
                Ok(prepared) => {
                    read_only = prepared.is_read_only();
                    held.lock().insert(
                        txn,
                        Held {
                            prepared,
                            commands: Arc::new(work.commands),
                            gated,
                            since: Instant::now(),
                            stuck: false,
                        },
                    );
                    Ok(reply)
                }
                // The log failed: nothing prepares or commits any more.
                Err(e) => {
                    if gated {
                        gate.leave();
                    }
                    stats.prepares_refused.fetch_add(1, Relaxed);
                    Err(Refusal::Failed(format!("ERR keel: {e}")))
                }
            };
            let _ = inputs.send(Input::Prepared {
                txn,
                result,
                read_only,
            });
        };
        match pending.ready() {
            Some(prepared) => vote(prepared),
            None => {
                tokio::spawn(async move { vote(pending.await) });
            }
        }
    }

    /// A prepare refused on `conflict` runs again here (when [`may_again`]) rather than being
    /// refused to its coordinator, whose retry costs an abort everywhere, a backoff (1 to
    /// 50 ms) and a prepare everywhere again, and may meet the same obstacle.
    ///
    /// - A record split into per-core slices (Doppel): a prepare can neither hold it nor
    ///   write to a slice, and asked the engine to reconcile it. It runs again holding the
    ///   joined phase open (`Db::wait_joined`, on a blocking thread), as a single node's retry
    ///   does (`Conn::attempt`); once prepared it holds the records, so they stay joined until
    ///   the decision. Refused instead, its retries met the next split phase: every
    ///   transaction across nodes on a record that stays split (`--split force`, or a counter
    ///   hot enough for `auto`) ended in `TRYAGAIN`.
    /// - A record held by a transaction prepared here, awaiting its decision from another
    ///   node: a patient prepare ([`Work::patient`]: it only reads, and lost conflicts
    ///   [`crate::conn::PATIENT_AFTER`] times in a row) waits for that decision (at most
    ///   [`PATIENT_WAIT`] a try), then runs again. It holds nothing here meanwhile, and the
    ///   transaction it waits for is prepared and waits for no one (a prepare that writes
    ///   never waits: two such, each waiting on another node for the other's decision, would
    ///   deadlock until the vote timeout), so nothing waits in a cycle. Any other is refused.
    ///   Letting every prepare that only reads wait starved writers: audits back to back
    ///   always held the accounts, and a bank's transfers fell from 23 000 to 240 in 8 s; a
    ///   reader that waits only after losing a few times keeps them going.
    /// - Anything else (a read that changed since the prepare's snapshot, a record an
    ///   ordinary commit holds for a moment): at once, with a fresh snapshot.
    fn again(
        &self,
        txn: TxnId,
        prepare: PrepareId,
        participants: Vec<Peer>,
        work: Work,
        conflict: keel::Conflict,
        tries: u32,
    ) {
        let db = self.shared.db;
        let split = conflict.reason == keel::ConflictReason::Split;
        let awaits_decision = !split && db.awaits_decision(&conflict.key);
        self.stats.prepares_again.fetch_add(1, Relaxed);
        let inputs = self.inputs.clone();
        tokio::spawn(async move {
            let joined = if split {
                let joined = tokio::task::spawn_blocking(move || db.wait_joined())
                    .await
                    .expect("waiting for a reconciliation does not panic");
                Some(joined)
            } else {
                if awaits_decision {
                    let deadline = Instant::now() + PATIENT_WAIT;
                    while db.awaits_decision(&conflict.key) && Instant::now() < deadline {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
                tokio::task::yield_now().await;
                None
            };
            let _ = inputs.send(Input::Again {
                txn,
                prepare,
                participants,
                work,
                joined,
                tries: tries + 1,
            });
        });
    }

    /// Commits here, on the driver's task, without waiting for the disk; acknowledged once
    /// visible.
    fn commit(&self, txn: TxnId) {
        let Some(held) = self.held.lock().remove(&txn) else {
            tracing::error!("told to commit {txn}, which this node does not hold");
            return;
        };
        let (shared, inputs) = (Arc::clone(&self.shared), self.inputs.clone());
        let (stuck, installing) = (Arc::clone(&self.stuck), Arc::clone(&self.installing));
        let db = shared.db;
        let committed = held.prepared.commit_nowait();
        if held.gated {
            self.gate.leave();
        }
        let ts = match committed {
            Ok(ts) => ts,
            // The log failed: nothing commits any more; the prepare stays in doubt for the
            // next start.
            Err(e) => return tracing::error!("committing {txn}: {e}"),
        };
        let commands = Arc::clone(&held.commands);
        let acknowledge = move || {
            for command in commands.iter() {
                let args: Vec<Bytes> = command.iter().map(|a| Bytes::copy_from_slice(a)).collect();
                if let Some(spec) = table::lookup(&args[0]) {
                    shared.blocked.committed(spec.cmd, &args);
                }
            }
            // Visible: reads that waited for it see it.
            installing.lock().remove(&txn);
            stuck.clear(txn);
            let _ = inputs.send(Input::Committed { txn });
        };
        // Acknowledged only once visible (so durable): the client hears of it after that. An
        // earlier transaction prepared here and undecided holds it up, or the fsync of the
        // decision: wait on the watermark's watchers, not in a thread.
        if db.is_visible(ts) {
            acknowledge();
        } else {
            self.installing.lock().insert(
                txn,
                Installing {
                    since: held.since,
                    commands: held.commands,
                    stuck: held.stuck,
                },
            );
            tokio::spawn(async move {
                if db.visible(ts).await.is_ok() {
                    acknowledge();
                }
            });
        }
    }

    fn abort(&self, txn: TxnId) {
        let Some(held) = self.held.lock().remove(&txn) else {
            return;
        };
        if let Err(e) = held.prepared.abort_nowait() {
            tracing::error!("aborting {txn}: {e}");
        }
        self.stuck.clear(txn);
        if held.gated {
            self.gate.leave();
        }
    }
}

/// Writes (or with `None` deletes) a decision record, durably, without holding a thread.
async fn write_decision(db: &'static Db, key: &[u8], value: Option<&[u8]>) -> Result<(), String> {
    // Nothing else writes the key: a conflict is only a record the collector was taking.
    for _ in 0..crate::conn::CONFLICT_ATTEMPTS_MAX {
        let mut txn = db.begin().map_err(|e| e.to_string())?;
        txn.set_durability(Durability::Sync);
        match value {
            Some(value) => txn.put(key, value),
            None => txn.delete(key),
        }
        .map_err(|e| e.to_string())?;
        match txn.commit_async().await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(_)) => tokio::task::yield_now().await,
            Err(e) => return Err(e.to_string()),
        }
    }
    Err("conflicts on a key nothing else writes".to_owned())
}

/// Runs `work` to its end: here if it needs no wait (the decisions database keeps nothing on
/// disk), else in a task of its own.
fn soon(work: impl std::future::Future<Output = ()> + Send + 'static) {
    let mut work = Box::pin(work);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    if work.as_mut().poll(&mut cx).is_pending() {
        tokio::spawn(work);
    }
}

/// How many times a prepare refused on a conflict runs again on its participant before it is
/// refused to its coordinator ([`Driver::again`]).
const AGAIN_MAX: u32 = 4;

/// How long a patient prepare waits, each try, for the decision of a transaction prepared on
/// a record it reads ([`Driver::again`]): [`AGAIN_MAX`] of them stay well within the
/// coordinator's vote timeout.
const PATIENT_WAIT: Duration = Duration::from_millis(50);

/// Whether a prepare of `work` refused on `conflict` may run again on its participant
/// ([`Driver::again`]): not if a prepared transaction holds the key, unless the prepare is
/// patient. The client's node marks only reads patient; checked here too, since a prepare
/// that writes and waits for a decision could close a cycle.
fn may_again(db: &Db, conflict: &keel::Conflict, work: &Work) -> bool {
    conflict.reason == keel::ConflictReason::Split
        || !db.awaits_decision(&conflict.key)
        || (work.patient && reads_only(work))
}

/// Whether every command of `work` only reads.
pub fn reads_only(work: &Work) -> bool {
    work.commands.iter().all(|command| {
        command
            .first()
            .and_then(|name| table::lookup(name))
            .is_some_and(|spec| data::is_read_only(spec.cmd))
    })
}

/// Runs `work`'s commands in one engine transaction and prepares it, with the metadata
/// `meta` builds from the replies; the prepare frame may not be durable yet. A transaction
/// that scanned a range is counted by `gate` from before its validation (the flag returned
/// says so); any other checks after its own validation that none is counted. Nothing waits:
/// a lock or the gate taken is a `Busy` vote (the coordinator retries with backoff).
fn execute(
    shared: &Shared,
    work: &Work,
    gate: &Gate,
    conflict_met: &mut Option<keel::Conflict>,
    meta: impl FnOnce(Replies) -> Meta,
) -> Result<(PrepareFuture<'static>, Replies, bool), Refusal> {
    let wait = Duration::ZERO;
    let db: &'static Db = shared.db;
    let mut ctx = crate::conn::ctx(shared);
    // Increments read: their replies must travel with the vote.
    ctx.track_increments = false;
    let proto = if work.resp3 {
        Proto::Resp3
    } else {
        Proto::Resp2
    };
    let mut txn = db.begin().map_err(|_| Refusal::Overloaded)?;
    txn.set_prepare_lock_wait(wait);
    let failed = |e: keel::Error| Refusal::Failed(format!("ERR keel: {e}"));
    for (key, ts) in &work.checks {
        if txn.newest_ts(key).map_err(failed)? > Some(keel::Ts(*ts)) {
            return Err(Refusal::Failed(WATCH_CHANGED.into()));
        }
    }
    let now = crate::keyspace::unix_ms();
    if work.deadlines.iter().any(|&d| d <= now) {
        return Err(Refusal::Failed(WATCH_CHANGED.into()));
    }
    let mut replies = Vec::with_capacity(work.commands.len() + 1);
    for command in &work.commands {
        let args: Vec<Bytes> = command.iter().map(|a| Bytes::copy_from_slice(a)).collect();
        let spec = args
            .first()
            .and_then(|name| table::lookup(name))
            .filter(|spec| data::is_data(spec.cmd))
            .ok_or_else(|| Refusal::Failed("ERR keel: not a data command".into()))?;
        let mut buf = BytesMut::new();
        let mut out = Out::new(&mut buf, proto);
        if let Err(Fail(text)) =
            data::run(spec.cmd, &args, &mut View::Txn(&mut txn), &ctx, &mut out)
        {
            return Err(Refusal::Failed(text.into_owned()));
        }
        replies.push(buf.to_vec());
    }
    if !work.watch.is_empty() {
        let keys: Vec<Bytes> = work
            .watch
            .iter()
            .map(|k| Bytes::copy_from_slice(k))
            .collect();
        let (keys, deadlines) = crate::conn::watch_targets(&mut txn, &keys)
            .map_err(|Fail(text)| Refusal::Failed(text.into_owned()))?;
        let at = txn.read_ts().0;
        let report = WatchReport {
            keys: keys.into_iter().map(|k| (k.to_vec(), at)).collect(),
            deadlines,
        };
        replies.push(postcard::to_stdvec(&report).expect("a report encodes"));
    }
    let meta = postcard::to_stdvec(&meta(replies.clone())).expect("metadata encodes");
    let gated = txn.reads_ranges();
    if gated && !gate.enter(wait) {
        return Err(Refusal::Busy);
    }
    let prepared = match txn.prepare_async(|_| meta) {
        Ok(Ok(prepared)) => prepared,
        Ok(Err(conflict)) => {
            if gated {
                gate.leave();
            }
            *conflict_met = Some(conflict);
            return Err(Refusal::Busy);
        }
        Err(e) => {
            if gated {
                gate.leave();
            }
            return Err(Refusal::Failed(format!("ERR keel: {e}")));
        }
    };
    if !gated && !gate.clear(Duration::ZERO) {
        // A counted transaction is undecided: this one may follow it (see `Gate`). Dropping
        // it aborts it.
        drop(prepared);
        return Err(Refusal::Busy);
    }
    Ok((prepared, replies, gated))
}

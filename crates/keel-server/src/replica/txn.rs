//! Transactions across replicated partitions: two-phase commit whose prepares and decision
//! are entries of the partitions' Raft logs, so a prepared transaction and a decision survive
//! the loss of any minority of each partition's replicas (docs/replication.md).
//!
//! The node a client talks to runs the transaction (the *driver*); it keeps nothing durable.
//! One participant partition is the *coordinator*: its log holds the decision.
//!
//! 1. `Prepare` to every other participant, at once. Each applies it as `prepared` says: runs
//!    its commands, locks their keys, keeps the record, and votes yes with the replies, or no
//!    (`Busy`, `Failed`, `Aborted`).
//! 2. All yes: `Decide` to the coordinator partition. Applying it runs the coordinator's own
//!    commands and commits them together with the commit decision, so the decision and the
//!    coordinator's part are one entry; or it refuses (a lock, a failing command, the
//!    deadline past), which decides abort. Any no: `Abort` to those that prepared.
//! 3. Committed: `Commit` to every other participant (each installs and unlocks), then the
//!    client's answer, then `Forget` to the coordinator.
//!
//! A participant prepared for over a second asks the coordinator partition (`Resolve`), which
//! answers commit if it holds the decision, and otherwise decides abort: whichever of the
//! driver's `Decide` and a `Resolve` comes first in the coordinator's log decides. So a driver
//! that dies at any step leaves nothing locked for long, and nothing half-committed: the
//! resolver on each partition's leader (`resolve_loop`) finishes what it left, and also
//! re-sends the commit of a decision still kept well after its deadline (a driver that died
//! before `Forget`) before forgetting it.
//!
//! Every transaction has a deadline (three cluster timeouts). After it, by a partition's
//! clock (the largest leader clock its transaction entries carried), the partition accepts no
//! prepare or decision of it, so the records that refuse late duplicates (a prepare after
//! its abort, a decision after a `Resolve`) need not be kept longer.
//!
//! A transaction that only reads takes no decision: once every other participant voted, the
//! coordinator partition's part is read at its leader (`Op::ReadDecide`), refused if that
//! partition's log already decided the transaction (a participant's `Resolve`, after which
//! that participant lets go) or passed its deadline; then the prepares are released with
//! `Abort`, without waiting (`read_and_release`).
//!
//! The client's answer waits for the participants' installs (up to one cluster timeout):
//! after that, a participant that has not installed still holds the transaction's locks, and
//! anything that would read the old value is refused (`Busy`) and retried until it installs.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Op, Replication, Request, Response, RunError, Status, TxnId, Watched, prepared};
use crate::server::Shared;

/// Attempts of a transaction that lost a lock conflict before `TRYAGAIN`.
const ATTEMPTS_MAX: u32 = 30;
/// How often the resolver looks at the partitions this node leads.
pub const RESOLVE_EVERY: Duration = Duration::from_millis(500);
/// How long a prepared transaction waits for its driver before its partition's leader asks
/// the coordinator partition (which decides abort if it has no decision yet). A driver
/// takes milliseconds unless a partition it needs is electing a leader.
const RESOLVE_AFTER_MS: u64 = 1000;
/// How long past its deadline a commit decision is kept before the coordinator's leader
/// re-sends the commit to every participant and forgets it.
const FORGET_AFTER_MS: u64 = 10_000;

/// One partition's part of a transaction: the partition and its commands.
pub type Work = Vec<(usize, Vec<Vec<Vec<u8>>>)>;

/// The limits and protocol a transaction's commands run with.
#[derive(Clone, Copy, Default)]
pub struct Limits {
    pub resp3: bool,
    pub bulk_bytes_max: i64,
    pub reply_bytes_max: usize,
}

/// What the driver and the resolver need of the node they run on: the server's
/// [`Node`], or the simulation's.
pub trait Net: Send + Sync + 'static {
    /// Sends `request` (a write) to partition `p`'s leader, retrying while it has none
    /// until `deadline`; the entry's response.
    fn call(
        &self,
        p: usize,
        request: Request,
        deadline: Instant,
    ) -> impl Future<Output = Result<Response, RunError>> + Send;
    /// Sends `request` (a read: [`Op::ReadDecide`]) to partition `p`'s leader, which answers
    /// it as a linearizable read, retrying while it has none until `deadline`.
    fn read(
        &self,
        p: usize,
        request: Request,
        deadline: Instant,
    ) -> impl Future<Output = Result<Response, RunError>> + Send;
    /// Whether this node leads partition `p` (a coordinator here saves a network hop).
    fn leads(&self, p: usize) -> bool;
    /// Whether this node knows a leader of partition `p` (a coordinator without one would
    /// keep the other participants' keys locked until it has one).
    fn knows_leader(&self, _p: usize) -> bool {
        true
    }
    /// The hosted partitions this node leads, and their lock tables.
    fn led(&self) -> Vec<(usize, prepared::Shared)>;
    /// The cluster's request timeout.
    fn timeout(&self) -> Duration;
    /// The wall clock, Unix ms (the clock the leaders stamp entries with).
    fn now_ms(&self) -> u64;
    /// A new transaction id, never used before by any node.
    fn next_txn(&self) -> TxnId;
    /// Learns that slots moved to other partitions (from a `Moved` answer).
    fn learn(&self, moved: &[(u16, usize)]);
    /// The partition that owns `slot`, as far as this node knows.
    fn owner(&self, slot: u16) -> usize;
    /// How long a slot move that goes in chunks may take ([`MOVE_CHUNKED_SPAN`]; the
    /// simulation's are shorter).
    fn chunked_span(&self) -> Duration {
        MOVE_CHUNKED_SPAN
    }
}

/// The server's node as the driver sees it.
pub struct Node(pub Arc<Shared>);

impl Node {
    fn rep(&self) -> &Replication {
        self.0.replication.get().expect("replicated")
    }

    /// `request` to partition `p`'s leader: a write, or (`read`) a linearizable read.
    async fn send(
        &self,
        p: usize,
        request: Request,
        read: bool,
        deadline: Instant,
    ) -> Result<Response, RunError> {
        self.rep()
            .call(&self.0, p, &request, read, deadline.into_std())
            .await
    }
}

impl Net for Node {
    async fn call(
        &self,
        p: usize,
        request: Request,
        deadline: Instant,
    ) -> Result<Response, RunError> {
        self.send(p, request, false, deadline).await
    }

    async fn read(
        &self,
        p: usize,
        request: Request,
        deadline: Instant,
    ) -> Result<Response, RunError> {
        self.send(p, request, true, deadline).await
    }

    fn leads(&self, p: usize) -> bool {
        let rep = self.rep();
        rep.leader(p) == Some(rep.me)
    }

    fn knows_leader(&self, p: usize) -> bool {
        self.rep().leader(p).is_some()
    }

    fn led(&self) -> Vec<(usize, prepared::Shared)> {
        self.rep()
            .hosted()
            .iter()
            .filter(|p| p.leads())
            .map(|p| (p.id, Arc::clone(&p.locks)))
            .collect()
    }

    fn timeout(&self) -> Duration {
        self.0
            .cluster
            .as_ref()
            .expect("cluster mode")
            .map()
            .timeout()
    }

    fn now_ms(&self) -> u64 {
        crate::keyspace::unix_ms()
    }

    fn learn(&self, moved: &[(u16, usize)]) {
        self.rep().learn(moved);
    }

    fn owner(&self, slot: u16) -> usize {
        let map = &self.0.cluster.as_ref().expect("cluster mode").map();
        self.rep().owner(map, slot)
    }

    fn next_txn(&self) -> TxnId {
        self.rep().next_id()
    }
}

/// How one attempt ended.
enum Attempt {
    Committed(Vec<Vec<Vec<u8>>>),
    /// Refused for a lock, or aborted by a resolver: nothing applied; may run again.
    Busy,
    /// Nothing applied; the error for the client.
    Failed(String),
    /// It may have committed; the error for the client.
    Unknown(String),
    /// A partition no longer owns some of its keys (learned): nothing applied; plan again.
    Moved,
}

/// Why a transaction across partitions did not commit.
#[derive(Debug)]
pub enum AcrossError {
    /// The error for the client.
    Failed(String),
    /// Some of its keys' slots moved to other partitions (learned): nothing applied; split
    /// the work by partition again and run it again.
    Moved,
}

/// Runs `work` (commands of two partitions or more) as one serializable transaction: each
/// partition's replies, in `work`'s order. A transaction that meets another's locks runs
/// again (nothing of it was applied), up to [`ATTEMPTS_MAX`] times.
pub async fn run_across<N: Net>(
    net: &Arc<N>,
    work: Work,
    limits: Limits,
) -> Result<Vec<Vec<Vec<u8>>>, AcrossError> {
    run_across_watched(net, work, Vec::new(), limits).await
}

/// [`run_across`] under `WATCH`: `watched` are the watched keys by partition (a partition
/// with watched keys and no commands joins to check them). If one changed, it fails with
/// [`super::prepared::WATCH_CHANGED`] and nothing is applied. The replies of a partition
/// that only checks are empty, after those of `work`.
pub async fn run_across_watched<N: Net>(
    net: &Arc<N>,
    mut work: Work,
    watched: Vec<(usize, Vec<Watched>)>,
    limits: Limits,
) -> Result<Vec<Vec<Vec<u8>>>, AcrossError> {
    let mut checks: Vec<Vec<Watched>> = vec![Vec::new(); work.len()];
    for (p, keys) in watched {
        match work.iter().position(|(q, _)| *q == p) {
            Some(i) => checks[i].extend(keys),
            None => {
                work.push((p, Vec::new()));
                checks.push(keys);
            }
        }
    }
    let mut backoff = Duration::from_millis(1);
    for attempt in 1..=ATTEMPTS_MAX {
        match attempt_once(net, &work, &checks, limits).await {
            Attempt::Committed(replies) => return Ok(replies),
            Attempt::Failed(text) | Attempt::Unknown(text) => {
                return Err(AcrossError::Failed(text));
            }
            Attempt::Moved => return Err(AcrossError::Moved),
            Attempt::Busy if attempt < ATTEMPTS_MAX => {
                // Jittered, so that transactions that refused each other do not meet again
                // at the same moment.
                let jitter = crate::data::random() % (backoff.as_micros() as u64 + 1);
                tokio::time::sleep(backoff / 2 + Duration::from_micros(jitter)).await;
                backoff = (backoff * 2).min(Duration::from_millis(50));
            }
            Attempt::Busy => {}
        }
    }
    Err(AcrossError::Failed(format!(
        "TRYAGAIN keel: the transaction across partitions was refused {ATTEMPTS_MAX} times \
         in a row (locked keys, or aborted while it waited); nothing of it was applied"
    )))
}

fn step(op: Op, now_ms: u64) -> Request {
    Request {
        commands: Vec::new(),
        exec: false,
        batch: false,
        resp3: false,
        now_ms,
        bulk_bytes_max: 0,
        reply_bytes_max: 0,
        op,
        watched: Vec::new(),
        id: None,
        keep_ms: 0,
    }
}

async fn attempt_once<N: Net>(
    net: &Arc<N>,
    work: &Work,
    checks: &[Vec<Watched>],
    limits: Limits,
) -> Attempt {
    let span = net.timeout() * 3;
    let deadline = Instant::now() + span;
    let deadline_ms = net.now_ms() + span.as_millis() as u64;
    let txn = net.next_txn();
    // The coordinator: a partition this node leads if there is one (its entry needs no
    // network hop), else one with a leader it knows of, else the first.
    let c = work
        .iter()
        .position(|(p, _)| net.leads(*p))
        .or_else(|| work.iter().position(|(p, _)| net.knows_leader(*p)))
        .unwrap_or(0);
    let coordinator = work[c].0;
    let reads_only = checks.iter().all(Vec::is_empty)
        && work.iter().all(|(_, commands)| {
            commands.iter().all(|command| {
                command
                    .first()
                    .and_then(|name| crate::table::lookup(name))
                    .is_some_and(|spec| crate::data::is_read_only(spec.cmd))
            })
        });
    let request = |i: usize, op: Op| Request {
        commands: work[i].1.clone(),
        resp3: limits.resp3,
        bulk_bytes_max: limits.bulk_bytes_max,
        reply_bytes_max: limits.reply_bytes_max,
        watched: checks[i].clone(),
        ..step(op, net.now_ms())
    };

    // 1. Prepare everywhere but the coordinator.
    let prepares: Vec<(usize, Request)> = work
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != c)
        .map(|(i, (p, _))| {
            let op = Op::Prepare {
                txn,
                coordinator,
                deadline_ms,
            };
            (*p, request(i, op))
        })
        .collect();
    let votes = call_all(net, prepares, deadline).await;
    let mut replies: Vec<Vec<Vec<u8>>> = vec![Vec::new(); work.len()];
    let mut prepared = Vec::new();
    let mut refusal: Option<Attempt> = None;
    let others = work.iter().enumerate().filter(|&(i, _)| i != c);
    for ((i, (p, _)), vote) in others.zip(votes) {
        match vote {
            Ok(Response {
                status: Status::Done,
                replies: r,
                ..
            }) => {
                prepared.push(*p);
                replies[i] = r;
            }
            Ok(Response {
                status: Status::Busy,
                ..
            }) => {
                refusal.get_or_insert(Attempt::Busy);
            }
            Ok(Response {
                status: Status::Moved,
                reply,
                ..
            }) => {
                net.learn(&postcard::from_bytes::<Vec<(u16, usize)>>(&reply).unwrap_or_default());
                refusal = Some(Attempt::Moved);
            }
            Err(RunError::Moved) => refusal = Some(Attempt::Moved),
            Ok(Response {
                status: Status::Failed,
                reply,
                ..
            }) => {
                refusal = Some(Attempt::Failed(String::from_utf8_lossy(&reply).into()));
            }
            // Aborted before it prepared (past its deadline, or resolved by a partition's
            // leader while this driver waited on another): nothing applied; run it again.
            Ok(_) => {
                refusal.get_or_insert(Attempt::Busy);
            }
            // Never applied, or not known: an abort covers both (a prepare applied after it
            // is refused).
            Err(RunError::Failed(text) | RunError::Unknown(text)) => {
                prepared.push(*p);
                refusal = Some(Attempt::Failed(text));
            }
            Err(RunError::RolledBack) => unreachable!("a prepare is not a batch"),
        }
    }
    if let Some(refusal) = refusal {
        tracing::debug!(
            "{txn:?}: refused ({}); aborting at {prepared:?}",
            match &refusal {
                Attempt::Failed(text) | Attempt::Unknown(text) => text.as_str(),
                Attempt::Moved => "moved",
                _ => "busy",
            }
        );
        abort(net, txn, deadline_ms, prepared).await;
        return refusal;
    }
    if reads_only {
        let read = request(c, Op::ReadDecide { txn, deadline_ms });
        return read_and_release(net, txn, deadline, deadline_ms, coordinator, prepared, read)
            .await
            .map(|own| {
                replies[c] = own;
                Attempt::Committed(replies)
            })
            .unwrap_or_else(|refused| refused);
    }
    tracing::debug!("{txn:?}: prepared at {prepared:?}; deciding at {coordinator}");

    // 2. The decision, with the coordinator's own commands.
    let decide = request(
        c,
        Op::Decide {
            txn,
            participants: prepared.clone(),
            deadline_ms,
        },
    );
    let decided = match net.call(coordinator, decide, deadline).await {
        Ok(response) => response,
        Err(RunError::Unknown(text)) => {
            tracing::debug!("{txn:?}: decision unknown ({text}); resolving");
            match resolve(&**net, coordinator, txn, deadline_ms).await {
                Some(response) => response,
                // The prepared participants resolve it themselves.
                None => return Attempt::Unknown(text),
            }
        }
        Err(RunError::Failed(text)) => {
            tracing::debug!("{txn:?}: decision failed ({text}); aborting at {prepared:?}");
            abort(net, txn, deadline_ms, prepared).await;
            return Attempt::Failed(text);
        }
        Err(RunError::Moved) => {
            abort(net, txn, deadline_ms, prepared).await;
            return Attempt::Moved;
        }
        Err(RunError::RolledBack) => unreachable!("a decision is not a batch"),
    };
    tracing::debug!("{txn:?}: decided {:?}", decided.status);
    match decided.status {
        Status::Committed => replies[c] = decided.replies,
        status => {
            abort(net, txn, deadline_ms, prepared).await;
            return match status {
                Status::Busy => Attempt::Busy,
                Status::Moved => {
                    net.learn(
                        &postcard::from_bytes::<Vec<(u16, usize)>>(&decided.reply)
                            .unwrap_or_default(),
                    );
                    Attempt::Moved
                }
                Status::Failed => Attempt::Failed(String::from_utf8_lossy(&decided.reply).into()),
                // Decided abort first (a participant's leader resolved it while this driver
                // waited): nothing applied; run it again.
                _ => Attempt::Busy,
            };
        }
    }

    // 3. Committed: the installs, then the answer; the decision is forgotten once every
    // participant installed.
    let installs = prepared
        .iter()
        .map(|&p| (p, step(Op::Commit { txn, deadline_ms }, net.now_ms())))
        .collect();
    let wait = Instant::now() + net.timeout();
    let net2 = Arc::clone(net);
    let mut finish = tokio::spawn(async move {
        let done = call_all(&net2, installs, deadline.max(wait)).await;
        if done.iter().all(Result::is_ok) {
            let forget = step(Op::Forget { txn }, net2.now_ms());
            let _ = net2.call(coordinator, forget, Instant::now() + span).await;
        }
    });
    // (A transaction that only reads ended at `read_and_release`.)
    let _ = tokio::time::timeout_at(wait, &mut finish).await;
    Attempt::Committed(replies)
}

/// The end of a transaction across partitions that only reads, once every other participant
/// voted yes: the coordinator partition's part is read at its leader ([`Op::ReadDecide`]),
/// no entry in its log, while the others hold their keys; then they let go of them (an abort
/// releases a prepare that only read as a commit would), without waiting. Its replies, or
/// how the attempt ended.
///
/// Every key the others read stays as they read it until they let go, which is after this
/// read (their releases are sent after it), unless a participant's leader resolved the
/// transaction first. That goes through the coordinator partition's log, which then refuses
/// the read (and so does its clock past the deadline, once that record may be gone). So
/// what the transaction read is one state, current at this read, inside its real-time span:
/// it serializes there, as it would at the decision, with two entries fewer (the decision and
/// its `Forget`) and one round of the coordinator partition's replication fewer before the
/// answer.
async fn read_and_release<N: Net>(
    net: &Arc<N>,
    txn: TxnId,
    deadline: Instant,
    deadline_ms: u64,
    coordinator: usize,
    prepared: Vec<usize>,
    read: Request,
) -> Result<Vec<Vec<u8>>, Attempt> {
    let answer = net.read(coordinator, read, deadline).await;
    let release = |net: &Arc<N>| {
        let net = Arc::clone(net);
        tokio::spawn(async move { abort(&net, txn, deadline_ms, prepared).await })
    };
    let refused = match answer {
        Ok(Response {
            status: Status::Done,
            replies,
            ..
        }) => {
            release(net);
            return Ok(replies);
        }
        Ok(Response {
            status: Status::Moved,
            reply,
            ..
        }) => {
            net.learn(&postcard::from_bytes::<Vec<(u16, usize)>>(&reply).unwrap_or_default());
            Attempt::Moved
        }
        Ok(Response {
            status: Status::Failed,
            reply,
            ..
        }) => Attempt::Failed(String::from_utf8_lossy(&reply).into()),
        Err(RunError::Moved) => Attempt::Moved,
        Err(RunError::Failed(text)) => Attempt::Failed(text),
        // Held by a prepared writer, decided there already (resolved), past the deadline, or
        // not answered: nothing of it was applied anywhere; it may run again.
        Ok(_) | Err(RunError::Unknown(_)) => Attempt::Busy,
        Err(RunError::RolledBack) => unreachable!("a read is not a batch"),
    };
    tracing::debug!("{txn:?}: the coordinator's read was refused; releasing");
    let _ = release(net).await;
    Err(refused)
}

/// Asks the coordinator partition for `txn`'s decision (deciding abort if it has none) until
/// it answers or cannot be reached: `Committed` (with the coordinator's replies) or
/// `Aborted`.
async fn resolve<N: Net>(
    net: &N,
    coordinator: usize,
    txn: TxnId,
    deadline_ms: u64,
) -> Option<Response> {
    resolve_within(net, coordinator, txn, deadline_ms, net.timeout() * 6).await
}

/// [`resolve`], giving up after `patience`.
async fn resolve_within<N: Net>(
    net: &N,
    coordinator: usize,
    txn: TxnId,
    deadline_ms: u64,
    patience: Duration,
) -> Option<Response> {
    let give_up = Instant::now() + patience;
    while Instant::now() < give_up {
        let ask = step(Op::Resolve { txn, deadline_ms }, net.now_ms());
        match net.call(coordinator, ask, give_up).await {
            Err(RunError::Unknown(_)) => tokio::time::sleep(super::RETRY_PAUSE).await,
            Ok(response) => return Some(response),
            Err(_) => return None,
        }
    }
    None
}

/// Aborts `txn` on `parts` (waiting up to one cluster timeout: the aborts release its locks
/// before it runs again; one not delivered is resolved by the partition's leader).
async fn abort<N: Net>(net: &Arc<N>, txn: TxnId, deadline_ms: u64, parts: Vec<usize>) {
    if parts.is_empty() {
        return;
    }
    let aborts = parts
        .into_iter()
        .map(|p| (p, step(Op::Abort { txn, deadline_ms }, net.now_ms())))
        .collect();
    let net = Arc::clone(net);
    let wait = Instant::now() + net.timeout();
    let mut sent = tokio::spawn(async move { call_all(&net, aborts, wait).await });
    let _ = tokio::time::timeout_at(wait, &mut sent).await;
}

/// Sends every `(partition, request)` at once (writes); their responses, in order.
async fn call_all<N: Net>(
    net: &Arc<N>,
    requests: Vec<(usize, Request)>,
    deadline: Instant,
) -> Vec<Result<Response, RunError>> {
    let mut running = tokio::task::JoinSet::new();
    let n = requests.len();
    for (i, (p, request)) in requests.into_iter().enumerate() {
        let net = Arc::clone(net);
        running.spawn(async move { (i, net.call(p, request, deadline).await) });
    }
    let mut results: Vec<Option<Result<Response, RunError>>> = (0..n).map(|_| None).collect();
    while let Some(done) = running.join_next().await {
        let (i, result) = done.expect("a replicated request does not panic");
        results[i] = Some(result);
    }
    results
        .into_iter()
        .map(|r| r.expect("every request answered"))
        .collect()
}

/// The resolver of the server: every [`RESOLVE_EVERY`], [`resolve_once`]. Ends when the
/// server stops.
pub async fn resolve_loop(shared: std::sync::Weak<Shared>) {
    loop {
        tokio::time::sleep(RESOLVE_EVERY).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        if shared.shutdown.is_cancelled() {
            return;
        }
        if shared.replication.get().is_none() {
            continue;
        }
        resolve_once(&Arc::new(Node(shared))).await;
    }
}

/// For each partition this node leads: finishes the prepared transactions whose driver is
/// gone (prepared for over [`RESOLVE_AFTER_MS`]: the coordinator partition's decision, or
/// abort), and forgets the commit decisions kept well past their deadline once every
/// participant has installed them.
pub async fn resolve_once<N: Net>(net: &Arc<N>) {
    let now = net.now_ms();
    for (part, locks) in net.led() {
        let (stale, kept, staged) = {
            let locks = locks.lock();
            (locks.prepared(), locks.decided(), locks.staged())
        };
        // Moves that staged collections here and are past their deadline without a
        // `MoveIn` (their driver gave up and its abort did not arrive): no `MoveIn` can apply
        // now, so their collections go to the graveyard.
        for (txn, deadline_ms) in staged {
            if now > deadline_ms {
                let deadline = Instant::now() + net.timeout();
                let abort = step(Op::Abort { txn, deadline_ms }, net.now_ms());
                let _ = net.call(part, abort, deadline).await;
            }
        }
        // Each at once: one whose coordinator partition cannot be reached (no majority)
        // must not hold up the others, whose keys stay locked meanwhile.
        let mut resolving = tokio::task::JoinSet::new();
        for (txn, coordinator, prepared_ms, deadline_ms) in stale {
            if now <= prepared_ms + RESOLVE_AFTER_MS {
                continue;
            }
            let net = Arc::clone(net);
            resolving.spawn(async move {
                let patience = net.timeout();
                let decision =
                    match resolve_within(&*net, coordinator, txn, deadline_ms, patience).await {
                        Some(Response {
                            status: Status::Committed,
                            ..
                        }) => Op::Commit { txn, deadline_ms },
                        Some(Response {
                            status: Status::Aborted,
                            ..
                        }) => Op::Abort { txn, deadline_ms },
                        _ => return,
                    };
                tracing::info!(
                    "partition {part}: resolved {txn:?} left by its driver: {}",
                    if matches!(decision, Op::Commit { .. }) {
                        "commit"
                    } else {
                        "abort"
                    }
                );
                let deadline = Instant::now() + net.timeout();
                let _ = net.call(part, step(decision, net.now_ms()), deadline).await;
            });
        }
        while resolving.join_next().await.is_some() {}
        for (txn, decided) in kept {
            if now <= decided.deadline_ms + FORGET_AFTER_MS {
                continue;
            }
            let deadline = Instant::now() + net.timeout();
            let installs = decided
                .participants
                .iter()
                .map(|&p| {
                    let op = Op::Commit {
                        txn,
                        deadline_ms: decided.deadline_ms,
                    };
                    (p, step(op, net.now_ms()))
                })
                .collect();
            let done = call_all(net, installs, deadline).await;
            if done.iter().all(|r| {
                matches!(
                    r,
                    Ok(Response {
                        status: Status::Done,
                        ..
                    })
                )
            }) {
                let _ = net
                    .call(part, step(Op::Forget { txn }, net.now_ms()), deadline)
                    .await;
            }
        }
    }
}

/// Slots moved per transaction at most (fewer when their data is too large for one entry).
const MOVE_BATCH: usize = 512;
/// Attempts at one batch of a move that meets locked keys before giving up.
const MOVE_ATTEMPTS: u32 = 200;
/// The deadline of a move that goes in chunks: its slot stays locked until the move ends,
/// or until the source's resolver finds no chunk asked for in a second (a driver that died).
const MOVE_CHUNKED_SPAN: Duration = Duration::from_secs(600);
/// Generations one chunk request names at most.
const MOVE_CHUNK_GENERATIONS: usize = 1024;

/// What [`move_slots`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Moved {
    /// Slots that changed partition.
    pub slots: usize,
    /// Engine records that went with them.
    pub records: usize,
}

/// Moves `slots` to partition `to`, online: a batch of slots of one source partition at a
/// time, each batch one transaction of two participants (`MoveOut` prepares at the source:
/// the slots lock whole and their data comes back with the vote; `MoveIn` at `to` takes the
/// data and the ownership and records the decision; `Commit` at the source drops them). While
/// a batch is prepared, requests for its slots wait (`Busy`); once it is decided, the source
/// answers `Moved` and they follow the slots to `to`. Slots already at `to` are skipped.
pub async fn move_slots<N: Net>(net: &Arc<N>, slots: &[u16], to: usize) -> Result<Moved, String> {
    let mut pending: std::collections::VecDeque<u16> = {
        let mut s = slots.to_vec();
        s.sort_unstable();
        s.dedup();
        s.into()
    };
    let mut done = Moved::default();
    let mut batch_max = MOVE_BATCH;
    let mut busy = 0;
    let mut chunked = false;
    while let Some(&first) = pending.front() {
        let from = net.owner(first);
        if from == to {
            pending.pop_front();
            continue;
        }
        let batch: Vec<u16> = pending
            .iter()
            .copied()
            .take_while(|&s| net.owner(s) == from)
            .take(batch_max)
            .collect();
        match move_batch(net, &batch, from, to, chunked).await? {
            BatchMove::Done(records) => {
                pending.drain(..batch.len());
                chunked = false;
                net.learn(&batch.iter().map(|&s| (s, to)).collect::<Vec<_>>());
                done.slots += batch.len();
                done.records += records;
                busy = 0;
                tracing::info!(
                    "moved slots {}..={} ({records} records) from partition {from} to {to}",
                    batch[0],
                    batch[batch.len() - 1]
                );
            }
            // Learned where they are: planned again.
            BatchMove::Moved => {}
            BatchMove::TooLarge if batch.len() > 1 => batch_max = batch.len() / 2,
            BatchMove::TooLarge => {
                return Err(format!(
                    "ERR keel: slot {first} holds more keys than one move can carry (their \
                     strings, meta records and expiry entries must fit {} bytes and {} engine \
                     records, two more for each collection; a collection's members may be \
                     any number); it cannot be moved",
                    super::REQUEST_BYTES_MAX,
                    prepared::MOVE_RECORDS_MAX
                ));
            }
            // One slot too large for one entry: again, with the time to go in chunks.
            BatchMove::Chunked => chunked = true,
            BatchMove::Busy => {
                busy += 1;
                if busy > MOVE_ATTEMPTS {
                    return Err(format!(
                        "TRYAGAIN keel: slot {first}'s keys stayed locked by transactions; \
                         moved {} slots before it",
                        done.slots
                    ));
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
    Ok(done)
}

/// Engine records, as a move carries them.
type Records = Vec<(Vec<u8>, Vec<u8>)>;

enum BatchMove {
    Done(usize),
    Moved,
    TooLarge,
    /// The slot's collections must go in chunks, under [`MOVE_CHUNKED_SPAN`].
    Chunked,
    Busy,
}

async fn move_batch<N: Net>(
    net: &Arc<N>,
    slots: &[u16],
    from: usize,
    to: usize,
    chunked: bool,
) -> Result<BatchMove, String> {
    let span = if chunked {
        net.chunked_span()
    } else {
        net.timeout() * 3
    };
    let deadline = Instant::now() + span;
    let deadline_ms = net.now_ms() + span.as_millis() as u64;
    let txn = net.next_txn();
    let out = Op::MoveOut {
        txn,
        slots: slots.to_vec(),
        to,
        deadline_ms,
    };
    let data_err = |e: postcard::Error| format!("ERR keel: a slot's data: {e}");
    let (pairs, generations): (Records, Vec<u64>) =
        match net.call(from, step(out, net.now_ms()), deadline).await {
            Ok(Response {
                status: Status::Done,
                replies,
                ..
            }) => (
                postcard::from_bytes(replies.first().map(Vec::as_slice).unwrap_or_default())
                    .map_err(data_err)?,
                match replies.get(1) {
                    Some(encoded) => postcard::from_bytes(encoded).map_err(data_err)?,
                    None => Vec::new(),
                },
            ),
            Ok(Response {
                status: Status::Moved,
                reply,
                ..
            }) => {
                net.learn(&postcard::from_bytes::<Vec<(u16, usize)>>(&reply).unwrap_or_default());
                return Ok(BatchMove::Moved);
            }
            Ok(Response {
                status: Status::Busy,
                ..
            }) => return Ok(BatchMove::Busy),
            // Past its deadline before it prepared: nothing happened; again.
            Ok(Response {
                status: Status::Aborted,
                ..
            }) => return Ok(BatchMove::Busy),
            Ok(Response { status, reply, .. }) => {
                abort(net, txn, deadline_ms, vec![from]).await;
                return Err(format!(
                    "ERR keel: partition {from} refused to move slots ({status:?}: {})",
                    String::from_utf8_lossy(&reply)
                ));
            }
            Err(RunError::Failed(text) | RunError::Unknown(text)) => {
                abort(net, txn, deadline_ms, vec![from]).await;
                return Err(text);
            }
            Err(RunError::Moved | RunError::RolledBack) => unreachable!("call answers a response"),
        };
    let mut records = pairs.len();
    let size: usize = pairs.iter().map(prepared::move_weight).sum();
    // A move in chunks stages each collection at `to` (a record there for each, dropped by
    // `MoveIn`) and the source sends each to its graveyard (its size record deleted): both
    // within one engine transaction.
    if !prepared::fits_one_move(records + 2 * generations.len(), size) {
        abort(net, txn, deadline_ms, vec![from]).await;
        return Ok(BatchMove::TooLarge);
    }
    if !generations.is_empty() {
        if slots.len() > 1 {
            abort(net, txn, deadline_ms, vec![from]).await;
            return Ok(BatchMove::TooLarge);
        }
        if !chunked {
            abort(net, txn, deadline_ms, vec![from]).await;
            return Ok(BatchMove::Chunked);
        }
        match move_chunks(net, txn, slots, from, to, &generations, deadline_ms).await {
            Ok(staged) => records += staged,
            Err(stop) => {
                // `to` drops what was staged (past the deadline its leader does so anyway).
                abort(net, txn, deadline_ms, vec![to, from]).await;
                return stop;
            }
        }
    }
    let into = Op::MoveIn {
        txn,
        slots: slots.to_vec(),
        from,
        pairs,
        deadline_ms,
    };
    let decided = match net.call(to, step(into, net.now_ms()), deadline).await {
        Ok(response) => Some(response),
        Err(RunError::Unknown(text)) => match resolve(&**net, to, txn, deadline_ms).await {
            Some(response) => Some(response),
            // `to` may have taken the slots: only an answer from it decides. The source
            // stays prepared, and its leader's resolver asks `to` (an abort here would leave
            // the slots owned by both).
            None => {
                return Err(format!(
                    "{text} (partition {to} did not say whether it took the slots; partition \
                     {from}'s leader settles the move with it)"
                ));
            }
        },
        Err(_) => None,
    };
    match decided {
        Some(Response {
            status: Status::Committed,
            ..
        }) => {}
        // Decided abort first (the source's leader resolved the move while this driver
        // waited, e.g. on an election at `to`): nothing moved; again.
        Some(Response {
            status: Status::Aborted,
            ..
        }) => {
            abort(net, txn, deadline_ms, vec![from]).await;
            return Ok(BatchMove::Busy);
        }
        Some(Response { status, reply, .. }) => {
            abort(net, txn, deadline_ms, vec![from]).await;
            return Err(format!(
                "ERR keel: partition {to} refused the slots ({status:?}: {})",
                String::from_utf8_lossy(&reply)
            ));
        }
        // `MoveIn` was never appended: `to` drops what it staged (the abort also refuses a
        // late `MoveIn`), the source keeps the slots.
        None => {
            abort(net, txn, deadline_ms, vec![to, from]).await;
            return Err(format!(
                "CLUSTERDOWN keel: partition {to} could not be reached to take the slots"
            ));
        }
    }
    // Decided: the source drops the slots (its leader's resolver does, if this fails).
    let commit = step(Op::Commit { txn, deadline_ms }, net.now_ms());
    if net.call(from, commit, Instant::now() + span).await.is_ok() {
        let _ = net
            .call(
                to,
                step(Op::Forget { txn }, net.now_ms()),
                Instant::now() + span,
            )
            .await;
    }
    Ok(BatchMove::Done(records))
}

/// Carries a prepared move's collections from `from` to `to` in chunks (`MoveChunk` at the
/// source, `MoveStage` at the destination), before its `MoveIn`: the records it staged, or
/// how the move ends instead (`Err`: the caller aborts it).
async fn move_chunks<N: Net>(
    net: &Arc<N>,
    txn: TxnId,
    slots: &[u16],
    from: usize,
    to: usize,
    generations: &[u64],
    deadline_ms: u64,
) -> Result<usize, Result<BatchMove, String>> {
    let mut staged = 0;
    for (n, group) in generations.chunks(MOVE_CHUNK_GENERATIONS).enumerate() {
        let mut after = Vec::new();
        loop {
            let read = Op::MoveChunk {
                txn,
                generations: group.to_vec(),
                after: std::mem::take(&mut after),
            };
            let mut replies = chunk_step(net, from, read).await?;
            let (Some(more), Some(encoded), None) = (replies.pop(), replies.pop(), replies.pop())
            else {
                return Err(Err(format!(
                    "ERR keel: partition {from} answered a chunk of the slots without its records"
                )));
            };
            let pairs: Records = postcard::from_bytes(&encoded)
                .map_err(|e| Err(format!("ERR keel: a slot's data: {e}")))?;
            if !pairs.is_empty() {
                staged += pairs.len();
                let stage = Op::MoveStage {
                    txn,
                    slots: slots.to_vec(),
                    pairs,
                    deadline_ms,
                };
                chunk_step(net, to, stage).await?;
            }
            if more.is_empty() {
                break;
            }
            after = more;
        }
        tracing::info!(
            "slot {}: {} of {} collections sent ({staged} records)",
            slots[0],
            (n * MOVE_CHUNK_GENERATIONS + group.len()),
            generations.len()
        );
    }
    Ok(staged)
}

/// One chunk's step of a move at partition `part` (`MoveChunk` or `MoveStage`): its replies,
/// or how the move ends instead (`Ok(Busy)`: decided abort meanwhile, run it again).
async fn chunk_step<N: Net>(
    net: &Arc<N>,
    part: usize,
    op: Op,
) -> Result<Vec<Vec<u8>>, Result<BatchMove, String>> {
    let deadline = Instant::now() + net.timeout();
    match net.call(part, step(op, net.now_ms()), deadline).await {
        Ok(Response {
            status: Status::Done,
            replies,
            ..
        }) => Ok(replies),
        // Resolved abort while this driver was slow: again.
        Ok(Response {
            status: Status::Aborted,
            ..
        }) => Err(Ok(BatchMove::Busy)),
        Ok(Response { status, reply, .. }) => Err(Err(format!(
            "ERR keel: partition {part} refused a chunk of the slots ({status:?}: {})",
            String::from_utf8_lossy(&reply)
        ))),
        Err(RunError::Failed(text) | RunError::Unknown(text)) => Err(Err(text)),
        Err(RunError::Moved | RunError::RolledBack) => unreachable!("call answers a response"),
    }
}

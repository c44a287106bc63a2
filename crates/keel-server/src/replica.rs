//! Replication (`keel serve --cluster … --replicas R`): each partition of the cluster kept on
//! R nodes by Raft, with openraft doing consensus (docs/replication.md).
//!
//! A partition is the slots the cluster config gives one node; partition `p` lives on nodes
//! `p`, `p + 1`, … `p + R - 1` (round the config's node list), so every node hosts R
//! partitions and is the home of one (its own slots, whose data is the server's usual
//! database). Each hosted partition has:
//!
//! - a Raft log on a keel database of its own (`log`), fsynced under `sync` before an append
//!   is acknowledged;
//! - a state machine (`machine`): the partition's data, a keel database, to which every
//!   committed entry is applied as one engine transaction, together with the index of the
//!   entry (so that a restart resumes exactly after it);
//! - a network (`net`): Raft's RPCs travel to the other replicas as `KEEL.RAFT` requests on
//!   their client ports.
//!
//! A write (or an `EXEC`) whose keys are in one partition becomes one log entry: the leader
//! appends it, and it is acknowledged once a majority of the replicas have it durable and the
//! leader has applied it (the reply is the one the state machine computed). An entry carries
//! its leader's clock and is applied with a random generator seeded by its index, so every
//! replica computes the same effect (expiry deadlines, `SPOP`'s pick, a collection's
//! generation). A read runs on the leader after openraft's `ensure_linearizable` (a read
//! index: the leader confirms with a quorum that it still leads and waits until it has
//! applied everything committed before the read; no assumption about clocks).
//!
//! A node that is not the partition's leader forwards the request to the one it believes
//! leads (`KEEL.RAFT p write|read`), retrying while an election runs, up to three times the
//! cluster's request timeout; cluster-aware clients get `MOVED` to the leader instead.

mod inbox;
mod log;
mod machine;
mod net;
mod prepared;
mod snapfile;
pub use machine::FLUSH_TOO_LARGE;
pub use prepared::{WATCH_CHANGED, WATCH_LAPSE_MS};
pub mod view;
pub use view::View;
#[cfg(test)]
mod sim;
pub mod txn;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use keel::Db;
use openraft::BasicNode;
use serde::{Deserialize, Serialize};

use crate::data;
use crate::reply::{Out, Proto};
use crate::server::Shared;

openraft::declare_raft_types!(
    /// keel's Raft types: entries carry [`Request`]s, applying one gives a [`Response`].
    pub Tc:
        D = Request,
        R = Response,
        NodeId = u64,
        Node = BasicNode,
        SnapshotData = snapfile::SnapData,
);

/// A Raft group: one partition's replicas.
pub type Raft = openraft::Raft<Tc>;

/// What one log entry asks: commands to run as one transaction on the partition.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// Each command's arguments.
    pub commands: Vec<Vec<Vec<u8>>>,
    /// A `MULTI … EXEC` block (the reply is an array), or one command.
    pub exec: bool,
    /// A pipelined batch: the commands' replies one after another, all applied or, if one
    /// fails, none (the entry is then rolled back and the sender runs them one by one, as a
    /// pipeline on one node is).
    pub batch: bool,
    /// Reply in RESP3.
    pub resp3: bool,
    /// The leader's clock when the request arrived (Unix ms): every replica applies the entry
    /// at this time.
    pub now_ms: u64,
    /// `proto-max-bulk-len` at the leader: the largest string a command may build.
    pub bulk_bytes_max: i64,
    /// The largest reply the client takes.
    pub reply_bytes_max: usize,
    /// What the entry does with the commands: run them, or a step of a transaction across
    /// partitions (`txn`).
    pub op: Op,
    /// `EXEC` under `WATCH`: the watched keys of this partition as `WATCH` found them; if
    /// one changed since, nothing runs (the reply is a null array, or the vote is no).
    pub watched: Vec<Watched>,
    /// A write's id (`Op::Run`): the partition keeps the answer of an applied write for
    /// `keep_ms`, and answers it again to the same id without running it again, so that the
    /// node that sent it may send it again after losing the answer (a leader that died).
    pub id: Option<TxnId>,
    /// How long the answer is kept (ms from the entry's clock).
    pub keep_ms: u64,
}

/// A key watched in a replicated cluster: the version its partition gave it at `WATCH` (the
/// log index of the last write to it since it was first watched), and its deadline then.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Watched {
    pub key: Vec<u8>,
    pub version: u64,
    /// Unix ms; 0: none. Passing it before `EXEC` counts as a change, as in Redis.
    pub deadline: u64,
}

/// A transaction across partitions: the node that runs it, that node's incarnation (drawn at
/// start, so ids are never reused) and a sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TxnId {
    pub node: u16,
    pub incarnation: u64,
    pub seq: u64,
}

/// What an entry does (see `txn` for the protocol). Every step of a transaction across
/// partitions carries its deadline (Unix ms): after it, no partition prepares or commits it,
/// and a partition that has no decision for it decides abort.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    /// Run the commands (one, an `EXEC`'s, a pipelined batch).
    #[default]
    Run,
    /// A participant's prepare: run the commands without keeping their effect, lock every key
    /// they touch, and keep the prepared record (the commands, their clock and seed) until a
    /// decision. The vote is the reply: `Done` with the replies, or `Busy`/`Failed`/`Aborted`.
    Prepare {
        txn: TxnId,
        /// The partition whose log holds the decision.
        coordinator: usize,
        deadline_ms: u64,
    },
    /// The coordinator partition's entry, once every other participant voted yes: its own
    /// commands run and commit, and the decision to commit is recorded (until `Forget`).
    /// `Committed` with the replies, or `Busy`/`Failed`/`Aborted` (decided abort).
    Decide {
        txn: TxnId,
        participants: Vec<usize>,
        deadline_ms: u64,
    },
    /// A participant installs a prepared transaction (the decision was commit): its commands
    /// run again at their prepare's clock and seed, on the keys it kept locked.
    Commit { txn: TxnId, deadline_ms: u64 },
    /// A participant drops a prepared transaction (the decision was abort).
    Abort { txn: TxnId, deadline_ms: u64 },
    /// Asks the coordinator partition for the decision: `Committed`, or `Aborted`, deciding
    /// abort if there is no decision yet (a `Decide` that comes later is refused).
    Resolve { txn: TxnId, deadline_ms: u64 },
    /// The coordinator partition forgets a commit decision every participant installed.
    Forget { txn: TxnId },
    /// `WATCH` of the keys of the commands (one `EXISTS`): from now on every write to them
    /// changes their version; the reply is each key's `(version, deadline)`, encoded.
    Watch,
    /// A slot move's prepare at the partition that owns the slots: lock them (every key in
    /// them), and vote yes with their data (every engine record of their keys).
    MoveOut {
        txn: TxnId,
        slots: Vec<u16>,
        /// The partition they move to, which decides.
        to: usize,
        deadline_ms: u64,
    },
    /// A slot move's decision at the partition the slots move to: take their data and
    /// ownership, and record the commit decision (the source's `Commit` then drops them).
    MoveIn {
        txn: TxnId,
        slots: Vec<u16>,
        from: usize,
        pairs: Vec<(Vec<u8>, Vec<u8>)>,
        deadline_ms: u64,
    },
    /// A change of the cluster's view (`view`), in partition 0's log: `view` (encoded)
    /// becomes the view if the one there is still at epoch `expect` (0: none was stored).
    /// The reply is the encoded view in force after the entry.
    View { expect: u64, view: Vec<u8> },
    /// Writes of several clients in one entry (`Proposals`): each request (an `Op::Run`)
    /// applies as if it were an entry of its own, in order; `Response::replies` holds each
    /// one's response, encoded.
    Many(Vec<Request>),
    /// A chunk of a prepared slot move's collections, read at the source (a move whose data
    /// is too large for one entry: its vote names the generations instead of carrying their
    /// records). `replies`: the records (size records and sub-keys of `generations`, in that
    /// order, after the engine key `after`; empty: from the start), encoded, and the key to
    /// go on after (empty: `generations` are done). Also renews the prepared move, so the
    /// source's resolver leaves it to its driver while chunks come.
    MoveChunk {
        txn: TxnId,
        generations: Vec<u64>,
        after: Vec<u8>,
    },
    /// A chunk of a slot move's collections, written at the destination ahead of its
    /// `MoveIn`: sub-keys of generations that no meta record there names yet, so nothing
    /// sees them. A move that aborts sends them to the graveyard.
    MoveStage {
        txn: TxnId,
        slots: Vec<u16>,
        pairs: Vec<(Vec<u8>, Vec<u8>)>,
        deadline_ms: u64,
    },
    /// Never an entry: a read, at the leader. The coordinator partition's part of a
    /// transaction across partitions that only reads, read while every other participant
    /// holds its keys prepared; `Done` with each command's reply, or `Aborted` once this
    /// partition decided the transaction (a participant's `Resolve`, after which that
    /// participant lets go of its keys) or its clock passed the deadline (after which the
    /// record of that decision may be gone). `txn` names the transaction (`txn::attempt_once`).
    ReadDecide { txn: TxnId, deadline_ms: u64 },
}

/// How an entry ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Status {
    /// Applied (or, for a prepare, prepared: the vote is yes).
    #[default]
    Done,
    /// A batch whose commands did not all succeed: nothing of it applied, no reply.
    RolledBack,
    /// A key it touches is locked by a prepared transaction: nothing applied.
    Busy,
    /// A command failed: nothing applied; `reply` is the error.
    Failed,
    /// The transaction across partitions is committed.
    Committed,
    /// The transaction across partitions is aborted.
    Aborted,
    /// A key's slot is not this partition's (any more): nothing applied; `reply` is the
    /// encoded `Vec<(slot, partition that owns it)>`.
    Moved,
}

impl Status {
    /// A try of a write that did not apply, and that would not apply if sent again as it is
    /// (its keys' slot moved away, a batch rolled back, a command failed): after an earlier
    /// try's answer was lost, it says nothing of that try, which may have applied, or may
    /// still (on its way, to a partition the slot comes back to).
    pub fn refuses_this_try(self) -> bool {
        matches!(self, Status::Moved | Status::RolledBack | Status::Failed)
    }
}

/// What applying an entry gave.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    /// The reply, as RESP bytes (for `Failed`, the error's text).
    pub reply: Vec<u8>,
    /// A transaction step's replies, one per command.
    pub replies: Vec<Vec<u8>>,
    pub status: Status,
}

/// The largest request (encoded) one log entry may carry: an entry is stored as one value of
/// the log's database.
pub const REQUEST_BYTES_MAX: usize = 8 << 20;

/// Most keys one `WATCH` log entry watches, and most lapsed watches it drops: it writes a
/// record for each, in one engine transaction (at most `TXN_WRITE_KEYS_MAX` keys). A
/// connection's `WATCH` of more keys goes to their partition in several entries.
pub const WATCH_ENTRY_KEYS_MAX: usize = 4096;

/// How often a leader sends heartbeats.
const HEARTBEAT_MS: u64 = 100;
/// A follower that hears nothing from its leader for a random time in this range (ms) stands
/// for election (etcd's defaults are 100 and 1000). Failover takes about the upper end plus an
/// election: openraft's followers also refuse to vote while their leader's lease (the
/// election timeout) has not run out.
const ELECTION_MS: (u64, u64) = (600, 1200);
/// Entries applied between snapshots (a snapshot lets the log be cut).
const SNAPSHOT_EVERY: u64 = 10_000;
/// How long one snapshot chunk's RPC may take (openraft's `install_snapshot_timeout`, 200 ms
/// by default). The last chunk is answered once the follower installed the whole snapshot,
/// which takes seconds for a partition of gigabytes: within the default the leader gave up
/// on it and sent the snapshot again while the follower installed it.
const SNAPSHOT_RPC_MS: u64 = 30_000;
/// How long the replicas of a partition other than its home wait for the home node to start
/// the group on a fresh cluster before they do.
const INITIALIZE_AFTER: Duration = Duration::from_secs(3);
/// How much longer than its sender may send it again a write's answer is kept (clocks of
/// different nodes differ by this much at most, for the purpose).
const REQUEST_KEEP_MARGIN_MS: u64 = 10_000;
/// How long `SAVE` waits for one partition's snapshot.
const SAVE_WAIT: Duration = Duration::from_secs(120);
/// Pause between attempts while a partition has no leader.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// Why a request did not run where it was sent.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Refused {
    /// This node does not lead the partition; the one it believes does, if any.
    NotLeader(Option<u64>),
    /// It failed for good; the error text for the client.
    Failed(String),
    /// A batch that did not apply because one of its commands failed: run them one by one.
    RolledBack,
    /// The partition's replica here stopped (it left the partition, or the server stops)
    /// while the write was submitted: it may or may not have been appended.
    Stopped(String),
    /// A write that reached the leader after its sender's deadline (by the leader's clock,
    /// with [`LATE_SLACK_MS`]): not appended. The sender no longer waits for it, and may
    /// have stopped sending it again; were it run now, past the window in which its id is
    /// deduplicated, a write sent earlier with the same id that did apply would apply twice.
    Late(String),
}

/// How far past a forwarded write's deadline (its sender's clock) the leader's clock may be
/// before the write is refused as late: room for the nodes' clocks to differ. The window in
/// which a partition keeps a write's answer is longer than its sender's by
/// `REQUEST_KEEP_MARGIN_MS`, which this slack plus the clocks' difference must not exceed.
const LATE_SLACK_MS: u64 = 2_000;

/// Why [`Replication::run`] has no reply.
#[derive(Debug)]
pub enum RunError {
    /// The error for the client: nothing was applied.
    Failed(String),
    /// The request was sent and its answer lost: it may or may not have applied (the error
    /// for the client).
    Unknown(String),
    /// A key's slot has moved to another partition (learned: [`Replication::owner`] names
    /// it now); nothing applied.
    Moved,
    /// A batch rolled back: run its commands one by one.
    RolledBack,
}

/// A clock, Unix ms.
pub type Clock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// One hosted partition.
pub struct Part {
    pub id: usize,
    pub raft: Raft,
    /// The partition's data.
    pub db: Db,
    /// The keys locked by prepared transactions, shared with the state machine.
    pub locks: prepared::Shared,
    /// The clock the leader stamps entries with (Unix ms): the wall clock, or the
    /// simulation's.
    pub clock: Clock,
    /// Whether the partition has moved any slot (its table is then consulted for routing).
    moved: Arc<std::sync::atomic::AtomicBool>,
    /// Concurrent linearizable reads share read-index rounds, and the lease they give.
    reads: Arc<ReadRounds>,
    /// Concurrent writes share log entries.
    proposals: Arc<Proposals>,
    /// The newest last log id the replica had when it was emptied (`log::floor`): it votes
    /// for no candidate with an older log ([`vote`]).
    floor: Option<openraft::LogId<u64>>,
    /// Receives the leader's snapshots, a chunk at a time (`KEEL.RAFT p snapshot`).
    inbox: inbox::Inbox,
}

/// Writes from several clients that go into one log entry together (`Op::Many`). At most
/// `GROUPS_IN_FLIGHT` entries of grouped writes are in flight per partition; writes that
/// arrive meanwhile wait, and the next entry takes every one of them. One entry's round
/// (append, replication, fsync, apply) then serves a whole group, where each write paid for
/// its own before (etcd and TiKV batch proposals likewise).
#[derive(Default)]
pub struct Proposals {
    state: parking_lot::Mutex<Waiting>,
}

#[derive(Default)]
struct Waiting {
    #[allow(clippy::type_complexity)]
    writes: std::collections::VecDeque<(
        Request,
        tokio::sync::oneshot::Sender<Result<Response, Refused>>,
    )>,
    /// Tasks proposing groups.
    proposers: usize,
}

/// The most writes one group takes, and the most bytes (`Request::size_bound`) it holds:
/// a larger write goes alone.
const GROUP_WRITES_MAX: usize = 64;
const GROUP_BYTES_MAX: usize = 1 << 20;
/// Entries of grouped writes in flight per partition at once.
const GROUPS_IN_FLIGHT: usize = 2;

impl Proposals {
    /// Queues `request`; whether the caller must start a proposer (`Proposals::propose`).
    fn push(
        &self,
        request: Request,
        answer: tokio::sync::oneshot::Sender<Result<Response, Refused>>,
    ) -> bool {
        let mut state = self.state.lock();
        state.writes.push_back((request, answer));
        let start = state.proposers < GROUPS_IN_FLIGHT;
        if start {
            state.proposers += 1;
        }
        start
    }

    /// Proposes the waiting writes, a group per entry, until none waits; answers each.
    async fn propose(self: Arc<Self>, raft: Raft, part: usize) {
        // Writes arriving while this task gets going join its first group.
        tokio::task::yield_now().await;
        loop {
            let (requests, answers): (Vec<Request>, Vec<_>) = {
                let mut state = self.state.lock();
                if state.writes.is_empty() {
                    state.proposers -= 1;
                    return;
                }
                let mut bytes = 0;
                let mut take = 0;
                for (request, _) in &state.writes {
                    bytes += request.size_bound();
                    if take == GROUP_WRITES_MAX || (take > 0 && bytes > GROUP_BYTES_MAX) {
                        break;
                    }
                    take += 1;
                }
                state.writes.drain(..take).unzip()
            };
            if requests.len() == 1 {
                let request = requests.into_iter().next().expect("one");
                let answer = write_entry(&raft, part, request).await;
                let _ = answers.into_iter().next().expect("one").send(answer);
                continue;
            }
            let entry = Request {
                now_ms: requests.iter().map(|r| r.now_ms).max().unwrap_or(0),
                op: Op::Many(requests),
                ..Request::default()
            };
            let n = answers.len();
            let responses: Vec<Result<Response, Refused>> =
                match write_entry(&raft, part, entry).await {
                    Ok(response) if response.replies.len() == n => response
                        .replies
                        .iter()
                        .map(|r| {
                            postcard::from_bytes(r).map_err(|e| {
                                Refused::Failed(format!("ERR keel: a grouped answer: {e}"))
                            })
                        })
                        .collect(),
                    Ok(response) => vec![
                        Err(Refused::Failed(format!(
                            "ERR keel: a group of {n} writes got {} answers",
                            response.replies.len()
                        )));
                        n
                    ],
                    Err(refused) => vec![Err(refused); n],
                };
            for (answer, response) in answers.into_iter().zip(responses) {
                let _ = answer.send(response);
            }
        }
    }
}

/// Appends `request` to the partition's log as the leader and waits for it to apply.
async fn write_entry(raft: &Raft, part: usize, request: Request) -> Result<Response, Refused> {
    use openraft::error::{ClientWriteError, RaftError};
    match raft.client_write(request).await {
        Ok(written) => Ok(written.data),
        // Not appended (or cut from the log): it will never apply, so it may be sent
        // again.
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
            Err(Refused::NotLeader(f.leader_id))
        }
        Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e))) => {
            Err(Refused::Failed(format!("ERR keel: partition {part}: {e}")))
        }
        Err(RaftError::Fatal(e)) => Err(Refused::Stopped(format!(
            "TRYAGAIN keel: partition {part}'s replica on this node stopped ({e}); the write \
             may or may not have happened"
        ))),
    }
}

/// Serves a vote request to a replica whose floor is `floor` (`log::floor`): refused, as
/// openraft refuses a candidate whose log is older than its own, when the candidate's last
/// log id is older than the floor (the log this replica had before it was emptied).
pub async fn vote(
    raft: &Raft,
    floor: Option<openraft::LogId<u64>>,
    request: openraft::raft::VoteRequest<u64>,
) -> Result<openraft::raft::VoteResponse<u64>, openraft::error::RaftError<u64>> {
    if floor.is_some() && request.last_log_id < floor {
        let vote = raft.metrics().borrow().vote;
        return Ok(openraft::raft::VoteResponse::new(vote, floor, false));
    }
    raft.vote(request).await
}

/// Empties the replica of a partition that left this node (stopped): its data (`data`), its
/// log (`log_db`) but for its vote, and its snapshot file, keeping a floor
/// (`log::begin_emptying`): placed here again, it starts with no log and no data, and votes
/// as if it still had the log it forgot. Without the vote and the floor, a node of an older
/// configuration that still counts this replica a voter (one that was down while the
/// membership moved on) could get its vote in a new term with an older log, and overwrite
/// entries this replica helped commit. A crash part way is finished by the next open
/// ([`finish_emptying`]).
pub fn empty(data: &Db, log_db: &Db, snapshot: Option<&std::path::Path>) -> Result<(), String> {
    log::begin_emptying(log_db)?;
    finish_emptying(data, log_db, snapshot).map(|_| ())
}

/// Finishes an [`empty`] that the log's mark says was begun (whether one was).
pub fn finish_emptying(
    data: &Db,
    log_db: &Db,
    snapshot: Option<&std::path::Path>,
) -> Result<bool, String> {
    if !log::emptying(log_db)? {
        return Ok(false);
    }
    machine::wipe(data)?;
    if let Some(path) = snapshot {
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(format!("removing {}: {e}", path.display()));
            }
            _ => {}
        }
        if let Some(dir) = path.parent()
            && let Err(e) = std::fs::File::open(dir).and_then(|d| d.sync_all())
        {
            return Err(format!("syncing {}: {e}", dir.display()));
        }
    }
    log::finish_emptying(log_db)?;
    Ok(true)
}

/// Linearizable reads' read-index rounds (openraft's `ensure_linearizable`: the leader
/// confirms with a quorum that it still leads, then waits to have applied everything
/// committed when the round began). A read needs a round that began after it arrived; reads
/// that arrive while a round runs share the next one, so N concurrent reads cost about two
/// rounds of heartbeats, not N (etcd batches its ReadIndex requests the same way).
///
/// A round that succeeded also gives the leader a lease ([`READ_LEASE`] from when the round
/// began): until it runs out, reads in the same term are served at once, with no round.
#[derive(Default)]
pub struct ReadRounds {
    /// Rounds begun, numbered from 1.
    begun: std::sync::atomic::AtomicU64,
    /// One round at a time; inside: the last round that succeeded.
    round: tokio::sync::Mutex<u64>,
    /// The term of the last round that succeeded, and when its lease ends.
    lease: parking_lot::Mutex<Option<(u64, tokio::time::Instant)>>,
    /// [`READ_LEASE`] unless a test says otherwise.
    lease_len: Option<Duration>,
}

/// How long after a read-index round began its leader may serve linearizable reads without
/// another. A round that succeeded was acknowledged by a majority, each of which received its
/// heartbeat after the round began and refuses every vote request for openraft's leader lease
/// (`election_timeout_max`, `ELECTION_MS.1`) from then (a replica that restarts does so for
/// as long after it opens: openraft restores its vote with the time of the start as its last
/// change, and it does not stand for election itself before then either). So no other leader
/// can be elected, and no write
/// committed anywhere else, until the round's start plus that lease: reads on the leader's
/// applied state are linearizable until then (every write acknowledged before a read arrived
/// was applied here before its answer). This leaves a margin of 300 ms, so it assumes only
/// that the nodes' clocks run at rates within 25% of each other (it uses no clock's time of
/// day); etcd's lease reads and TiKV's rest on the same.
pub const READ_LEASE: Duration = Duration::from_millis(ELECTION_MS.1 - 300);

impl ReadRounds {
    /// Returns once a round that began after this call succeeded (running `check` as one if
    /// none did), or with the error of the round run for it.
    pub async fn linearize<F, Fut>(&self, check: F) -> Result<(), Refused>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<(), Refused>>,
    {
        use std::sync::atomic::Ordering;
        // Any round numbered from here on begins after this read arrived.
        let need = self.begun.load(Ordering::Acquire) + 1;
        let mut last_ok = self.round.lock().await;
        if *last_ok >= need {
            return Ok(());
        }
        let id = self.begun.fetch_add(1, Ordering::AcqRel) + 1;
        let result = check().await;
        if result.is_ok() {
            *last_ok = id;
        }
        result
    }

    /// Whether the leader holds a lease for reads in `term` now.
    pub fn leased(&self, term: u64) -> bool {
        self.lease
            .lock()
            .is_some_and(|(t, until)| t == term && tokio::time::Instant::now() < until)
    }

    /// Rounds whose lease lasts `len` (a test's unsafe one).
    #[cfg(test)]
    pub fn with_lease(len: Duration) -> ReadRounds {
        ReadRounds {
            lease_len: Some(len),
            ..ReadRounds::default()
        }
    }

    /// A round in `term` that began at `began` succeeded: the lease runs to `began +
    /// READ_LEASE`.
    pub fn extend(&self, term: u64, began: tokio::time::Instant) {
        let until = began + self.lease_len.unwrap_or(READ_LEASE);
        let mut lease = self.lease.lock();
        match *lease {
            Some((t, u)) if t == term && u >= until => {}
            _ => *lease = Some((term, until)),
        }
    }
}

/// This node's side of replication.
pub struct Replication {
    /// Replicas per partition.
    pub r: usize,
    /// This node's index.
    pub me: usize,
    /// A digest of the cluster config and `r`: every `KEEL.RAFT` carries it, and a node
    /// refuses messages from one that places partitions differently.
    pub layout: u64,
    /// The newest view of the cluster this node knows (`view`).
    view: parking_lot::RwLock<Arc<View>>,
    /// The hosted partitions, by partition.
    parts: parking_lot::RwLock<BTreeMap<usize, Arc<Part>>>,
    /// For partitions not hosted here: the node last seen leading each.
    hints: parking_lot::Mutex<std::collections::HashMap<usize, usize>>,
    /// Slots this node has learned moved from their config owner: slot → partition.
    routes: parking_lot::RwLock<std::collections::HashMap<u16, usize>>,
    /// Drawn at start: names this process's transactions across partitions.
    incarnation: u64,
    /// The next transaction's sequence number.
    seq: std::sync::atomic::AtomicU64,
    /// openraft's settings, for every group.
    config: Arc<openraft::Config>,
    /// The data directory (`None`: in memory).
    dir: Option<PathBuf>,
    /// Partitions whose membership this node (their leader) is changing now.
    conforming: Arc<parking_lot::Mutex<std::collections::HashSet<usize>>>,
    /// Wakes the reconciler (a newer view arrived).
    wake: Arc<tokio::sync::Notify>,
    /// A fetch of a newer view from a peer is under way.
    fetching: std::sync::atomic::AtomicBool,
    /// Every database opened here for a partition, by directory name (`raft-<p>`,
    /// `partition-<p>`): a replica that leaves a partition keeps them open (a database's
    /// directory lock lasts as long as the process) and reuses them if it comes back; all
    /// are closed when the server stops.
    dbs: parking_lot::Mutex<std::collections::HashMap<String, Db>>,
}

/// Opening replication failed.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("opening partition {part}'s {what} at {}: {source}", dir.display())]
    Open {
        part: usize,
        what: &'static str,
        dir: PathBuf,
        source: keel::OpenError,
    },
    #[error("partition {part}: {text}")]
    Raft { part: usize, text: String },
}

/// The durability of a replicated partition's data: the log is what must be durable (a
/// restart applies again what follows the applied marker), so the data is fsynced lazily,
/// once a second, and made durable at once before a snapshot lets the log be cut. Without it
/// every apply would fsync the data too, on the disk the log's fsyncs wait for.
pub fn data_durability(configured: crate::config::Durability) -> keel::Durability {
    match configured {
        crate::config::Durability::None => keel::Durability::None,
        _ => keel::Durability::Async {
            interval: Duration::from_secs(1),
        },
    }
}

/// The layout digest of a cluster config (its digest) with `r` replicas per partition.
pub fn layout(config_digest: u64, r: usize) -> u64 {
    let mut h = config_digest ^ 0x6b65_656c_7265_706c;
    for _ in 0..2 {
        h = (h ^ r as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        h ^= h >> 29;
    }
    h
}

/// Where a node keeps the newest view it knows, in its data directory.
const VIEW_FILE: &str = "cluster-view";
/// How often a node checks that it hosts what its view places on it, and that the
/// partitions it leads have the view's members.
const RECONCILE_EVERY: Duration = Duration::from_secs(1);
/// How long a leader waits for a new replica to catch up, and for a membership change.
const CONFORM_WAIT: Duration = Duration::from_secs(120);

/// Reads the view kept in `dir`, if there is one.
pub fn stored_view(dir: &std::path::Path) -> Result<Option<View>, String> {
    let path = dir.join(VIEW_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => postcard::from_bytes(&bytes)
            .map(Some)
            .map_err(|e| format!("{} is damaged: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("reading {}: {e}", path.display())),
    }
}

/// Keeps `view` in `dir` (written aside, synced, then renamed over the old one).
fn store_view(dir: &std::path::Path, view: &View) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = dir.join(format!("{VIEW_FILE}.tmp"));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&postcard::to_stdvec(view).expect("a view encodes"))?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join(VIEW_FILE))?;
    std::fs::File::open(dir)?.sync_all()
}

impl Replication {
    /// Opens every partition the view places on this node and starts its Raft group. The
    /// view is the newest of the one kept in the data directory, the one a join brought
    /// (`Config::cluster_view`) and the config's. The home partition's data is the server's
    /// database; the others' are opened under `<dir>/partition-<p>`, and every log under
    /// `<dir>/raft-<p>`.
    pub async fn start(shared: &Arc<Shared>) -> Result<Replication, StartError> {
        let cluster = shared
            .cluster
            .as_ref()
            .expect("replication needs a cluster");
        let map = cluster.map();
        let (me, r) = (map.myself(), shared.config.replicas);
        let layout = layout(map.digest(), r);
        let config = openraft::Config {
            cluster_name: format!("keel-{:016x}", map.digest()),
            heartbeat_interval: HEARTBEAT_MS,
            election_timeout_min: ELECTION_MS.0,
            election_timeout_max: ELECTION_MS.1,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(SNAPSHOT_EVERY),
            max_in_snapshot_log_to_keep: 1000,
            install_snapshot_timeout: SNAPSHOT_RPC_MS,
            ..Default::default()
        };
        let config = Arc::new(config.validate().map_err(|e| StartError::Raft {
            part: me,
            text: e.to_string(),
        })?);
        let dir = shared.db.dir().map(std::path::Path::to_path_buf);
        let mut view = View::initial(&map, r, layout);
        let stored = match &dir {
            Some(d) => stored_view(d).map_err(|text| StartError::Raft { part: me, text })?,
            None => None,
        };
        for other in stored.into_iter().chain(shared.config.cluster_view.clone()) {
            if other.layout != layout {
                return Err(StartError::Raft {
                    part: me,
                    text: format!(
                        "the cluster view kept in the data directory belongs to another \
                         cluster (layout {:016x}, this config and --replicas {r} give \
                         {layout:016x}): start with that cluster's config, or an empty --dir",
                        other.layout
                    ),
                });
            }
            if other.epoch > view.epoch {
                view = other;
            }
        }
        if view.nodes.get(me).is_some_and(|n| n.removed) {
            return Err(StartError::Raft {
                part: me,
                text: format!(
                    "node {} was removed from the cluster (view epoch {}); a node joins again \
                     under a new id with an empty --dir",
                    map.me().id,
                    view.epoch
                ),
            });
        }
        if view.nodes.len() > map.nodes().len() {
            let grown = view.membership(me).map_err(|e| StartError::Raft {
                part: me,
                text: format!("the cluster view: {e}"),
            })?;
            cluster.set_map(Arc::new(grown));
        }
        if let Some(d) = &dir
            && view.epoch > 0
            && let Err(e) = store_view(d, &view)
        {
            tracing::warn!("keeping the cluster view in {}: {e}", d.display());
        }
        let rep = Replication {
            r,
            me,
            layout,
            view: parking_lot::RwLock::new(Arc::new(view.clone())),
            parts: Default::default(),
            hints: Default::default(),
            routes: Default::default(),
            incarnation: data::random(),
            seq: std::sync::atomic::AtomicU64::new(0),
            config,
            dir,
            conforming: Default::default(),
            wake: Arc::default(),
            fetching: std::sync::atomic::AtomicBool::new(false),
            dbs: Default::default(),
        };
        for p in 0..view.parts.len() {
            if view.parts[p].contains(&me) {
                let part = rep.open_part(shared, &view, p).await?;
                rep.parts.write().insert(p, Arc::new(part));
            }
        }
        // Replicas the view placed elsewhere whose membership may still count this node
        // (it stopped before its leader let it go): reopened, so that the partition keeps
        // its majority; the reconciler closes them once the leader has let this node go.
        let kept: Vec<usize> = rep
            .dir
            .as_ref()
            .and_then(|d| std::fs::read_dir(d).ok())
            .into_iter()
            .flatten()
            .filter_map(|e| {
                e.ok()?
                    .file_name()
                    .to_str()?
                    .strip_prefix("raft-")?
                    .parse()
                    .ok()
            })
            .filter(|&p: &usize| p < view.parts.len() && !view.parts[p].contains(&me))
            .collect();
        for p in kept {
            if let Some(part) = rep.open_part_if(shared, &view, p, true).await? {
                tracing::info!("partition {p}: reopened a replica its membership still counts");
                rep.parts.write().insert(p, Arc::new(part));
            }
        }
        Ok(rep)
    }

    /// Opens partition `p` here and starts its Raft group (a member of `view.parts[p]`).
    async fn open_part(
        &self,
        shared: &Arc<Shared>,
        view: &View,
        p: usize,
    ) -> Result<Part, StartError> {
        Ok(self
            .open_part_if(shared, view, p, false)
            .await?
            .expect("opened unconditionally"))
    }

    /// [`Replication::open_part`]; with `if_counted`, only if the membership its storage
    /// holds (applied, or its log's first entry) counts this node (`None` otherwise).
    async fn open_part_if(
        &self,
        shared: &Arc<Shared>,
        view: &View,
        p: usize,
        if_counted: bool,
    ) -> Result<Option<Part>, StartError> {
        let (me, r) = (self.me, self.r);
        let dir = self.dir.as_ref();
        let own_db = p == me;
        let db: Db = if own_db {
            shared.db.clone()
        } else {
            self.open_db(&format!("partition-{p}"), shared, p, "data")
                .await?
        };
        let log_db = self.open_db(&format!("raft-{p}"), shared, p, "log").await?;
        let snapshot_dir = dir.map(|d| d.join(format!("raft-{p}")));
        // A replica whose emptying a crash cut short (`Replication::empty`): finished
        // before anything reads its data or log.
        let snapshot_file = snapshot_dir
            .as_ref()
            .map(|d| d.join(machine::SNAPSHOT_FILE));
        let (emptying, emptying_log) = (db.clone(), log_db.clone());
        let floor = tokio::task::spawn_blocking(move || {
            finish_emptying(&emptying, &emptying_log, snapshot_file.as_deref())?;
            log::floor(&emptying_log)
        })
        .await
        .expect("emptying does not panic")
        .map_err(|text| StartError::Raft {
            part: p,
            text: format!("finishing the emptying of the replica that left: {text}"),
        })?;
        let log = log::LogStore::open(log_db, shared.config.durability.engine());
        let mut machine = machine::Machine::open(db.clone(), snapshot_dir)
            .await
            .map_err(|e| StartError::Raft {
                part: p,
                text: e.to_string(),
            })?;
        let log = log.purge_behind(machine.durable());
        if if_counted
            && !machine
                .stored_voters(&log)
                .await
                .is_some_and(|voters| voters.contains(&(me as u64)))
        {
            return Ok(None);
        }
        let locks = machine.locks();
        let owners = shared.cluster.as_ref().expect("cluster mode").map();
        let moved = locks.lock().moved_flag();
        locks.lock().set_home((
            p,
            Arc::new(move |slot| owners.owner(keel_cluster::Slot(slot))),
        ));
        // Data that no log entry made (the directory of a node that ran without
        // --replicas): the log would be applied over it, and the replicas would differ.
        if own_db && machine.stored_voters(&log).await.is_none() && machine::holds_data(&db) {
            return Err(StartError::Raft {
                part: p,
                text: format!(
                    "{} holds data written without --replicas; a replicated node starts on an \
                     empty data directory (load the data through the cluster)",
                    dir.map_or("the data directory".into(), |d| d.display().to_string())
                ),
            });
        }
        let placed: std::collections::BTreeSet<u64> =
            view.parts[p].iter().map(|&i| i as u64).collect();
        // While the cluster is its config, a partition's members are the placement: other
        // ones mean the config or --replicas changed under old data.
        if view.epoch == 0
            && let Some(stored) = machine.stored_voters(&log).await
            && stored != placed
        {
            let names = |set: &std::collections::BTreeSet<u64>| {
                set.iter()
                    .map(|&i| {
                        view.nodes
                            .get(i as usize)
                            .map_or_else(|| i.to_string(), |n| n.id.clone())
                    })
                    .collect::<Vec<_>>()
                    .join(",")
            };
            return Err(StartError::Raft {
                part: p,
                text: format!(
                    "its data was replicated on {} but the config and --replicas {r} place it \
                     on {}: a cluster's nodes change by joining and removing nodes, and its \
                     replicas not at all; start with the original config, or with an empty \
                     --dir",
                    names(&stored),
                    names(&placed)
                ),
            });
        }
        // Pushes applied here wake this node's clients blocked on their keys.
        let waker = Arc::downgrade(shared);
        machine.on_push(Arc::new(move |command: &[Vec<u8>]| {
            if let Some(shared) = waker.upgrade() {
                shared.blocked.applied(command);
            }
        }));
        let network = net::Network {
            shared: Arc::downgrade(shared),
            part: p,
            idle: Arc::default(),
        };
        let raft = Raft::new(me as u64, Arc::clone(&self.config), network, log, machine)
            .await
            .map_err(|e| StartError::Raft {
                part: p,
                text: e.to_string(),
            })?;
        let mut metrics = raft.metrics();
        let ids: Vec<String> = view.nodes.iter().map(|n| n.id.clone()).collect();
        tokio::spawn(async move {
            let mut last = None;
            loop {
                let leader = metrics.borrow().current_leader;
                if leader != last {
                    match leader.and_then(|l| ids.get(l as usize)) {
                        Some(id) => tracing::info!("partition {p}: {id} leads"),
                        None => tracing::info!("partition {p}: no leader"),
                    }
                    last = leader;
                }
                // openraft's own log is off by default: say why the group stopped (a
                // storage error, which every replica applying the same entry meets).
                let fatal = match &metrics.borrow().running_state {
                    Err(openraft::error::Fatal::Stopped) | Ok(()) => None,
                    Err(fatal) => Some(fatal.to_string()),
                };
                if let Some(fatal) = fatal {
                    tracing::error!(
                        "partition {p}: its Raft group stopped on this node ({fatal}); \
                         INFO replication shows it as stopped until the node restarts"
                    );
                    return;
                }
                if metrics.changed().await.is_err() {
                    return;
                }
            }
        });
        // A partition is started by its home node with the nodes it was created on: with
        // the first entry in its log the home node wins the first election, so each node
        // first leads its own slots and the leaders are spread. If the home node is not
        // there, the other replicas propose the same membership after a while. A group
        // already started (a restart) refuses, which is what should happen. A replica
        // placed here later (a join, a removal) waits for the leader to add it.
        if view.parts[p] == view.born[p] && view.born[p].contains(&me) {
            let members: BTreeMap<u64, BasicNode> = view.born[p]
                .iter()
                .map(|&i| (i as u64, BasicNode::new(view.nodes[i].addr.clone())))
                .collect();
            if p == me {
                if let Err(e) = raft.initialize(members).await {
                    tracing::debug!("partition {p}: not initializing: {e}");
                }
            } else {
                let raft = raft.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(INITIALIZE_AFTER).await;
                    let started = {
                        let m = raft.metrics().borrow().clone();
                        m.current_leader.is_some() || m.last_log_index.is_some()
                    };
                    if !started && let Err(e) = raft.initialize(members).await {
                        tracing::debug!("partition {p}: not initializing: {e}");
                    }
                });
            }
        }
        Ok(Some(Part {
            id: p,
            raft,
            db,
            locks,
            clock: Arc::new(crate::keyspace::unix_ms),
            moved,
            reads: Arc::default(),
            proposals: Arc::default(),
            floor,
            inbox: inbox::Inbox::default(),
        }))
    }

    /// Opens (or creates) one of a partition's databases, or takes the one opened before.
    async fn open_db(
        &self,
        name: &str,
        shared: &Shared,
        part: usize,
        what: &'static str,
    ) -> Result<Db, StartError> {
        if let Some(db) = self.dbs.lock().get(name) {
            return Ok(db.clone());
        }
        let db = match &self.dir {
            Some(dir) => {
                let path = dir.join(name);
                let mut options = shared.config.engine_options().split(keel::SplitMode::Off);
                if what == "data" {
                    options = options.durability(data_durability(shared.config.durability));
                }
                let at = path.clone();
                tokio::task::spawn_blocking(move || Db::open(at, options))
                    .await
                    .expect("opening a database does not panic")
                    .map_err(|source| StartError::Open {
                        part,
                        what,
                        dir: path,
                        source,
                    })?
            }
            None => Db::in_memory(),
        };
        self.dbs.lock().insert(name.to_owned(), db.clone());
        Ok(db)
    }

    /// The partition hosted here, if it is.
    pub fn part(&self, p: usize) -> Option<Arc<Part>> {
        self.parts.read().get(&p).cloned()
    }

    /// Every partition hosted here.
    pub fn hosted(&self) -> Vec<Arc<Part>> {
        self.parts.read().values().cloned().collect()
    }

    /// `WAIT`'s count on a replicated node: over partitions `parts`, the fewest of a
    /// partition's other voters that hold every entry its leader had applied when asked (so
    /// every write acknowledged to anyone by then); 0 for a partition whose leader cannot be
    /// asked.
    pub async fn caught_up(&self, shared: &Shared, parts: &[usize]) -> usize {
        let mut fewest = usize::MAX;
        for &p in parts {
            let n = match self.part(p).and_then(|part| part.caught_up()) {
                Some(n) => n,
                None => match self.leader(p).filter(|&l| l != self.me) {
                    Some(leader) => net::call_node(shared, leader, p, "caught", &[], None)
                        .await
                        .ok()
                        .and_then(|a| postcard::from_bytes::<Option<usize>>(&a).ok())
                        .flatten()
                        .unwrap_or(0),
                    None => 0,
                },
            };
            fewest = fewest.min(n);
        }
        if fewest == usize::MAX { 0 } else { fewest }
    }

    /// `SAVE` on a replicated node: a snapshot of every partition hosted here that applied
    /// anything (its data written to the partition's snapshot file, after which its log
    /// before it may be cut), each waited for; how many were taken. `None` without a data
    /// directory. A snapshot that openraft was already building when asked (it takes one
    /// at a time) is waited out and asked for again.
    pub async fn save(&self) -> Option<Result<usize, String>> {
        self.dir.as_ref()?;
        let mut saved = 0;
        for part in self.hosted() {
            let Some(applied) = part.raft.metrics().borrow().last_applied.map(|l| l.index) else {
                continue;
            };
            let give_up = Instant::now() + SAVE_WAIT;
            loop {
                if let Err(e) = part.raft.trigger().snapshot().await {
                    return Some(Err(format!(
                        "ERR keel: partition {}'s snapshot: {e}",
                        part.id
                    )));
                }
                let taken = part
                    .raft
                    .wait(Some(Duration::from_secs(1)))
                    .metrics(
                        |m| m.snapshot.is_some_and(|s| s.index >= applied),
                        "a snapshot of what was applied",
                    )
                    .await;
                if taken.is_ok() {
                    break;
                }
                if Instant::now() >= give_up {
                    return Some(Err(format!(
                        "ERR keel: partition {}'s snapshot was not written within {} s",
                        part.id,
                        SAVE_WAIT.as_secs()
                    )));
                }
            }
            saved += 1;
        }
        Some(Ok(saved))
    }

    /// The data directory (`None`: in memory).
    pub fn dir(&self) -> Option<&std::path::Path> {
        self.dir.as_deref()
    }

    /// When the newest snapshot file of a partition hosted here was written (`LASTSAVE`).
    pub fn last_save(&self) -> Option<std::time::SystemTime> {
        let dir = self.dir.as_ref()?;
        self.hosted()
            .iter()
            .filter_map(|part| {
                let file = dir
                    .join(format!("raft-{}", part.id))
                    .join(machine::SNAPSHOT_FILE);
                std::fs::metadata(file).and_then(|m| m.modified()).ok()
            })
            .max()
    }

    /// The newest view of the cluster this node knows.
    pub fn view(&self) -> Arc<View> {
        Arc::clone(&self.view.read())
    }

    /// How many partitions the cluster has (every node it has had started one).
    pub fn partitions(&self) -> usize {
        self.view.read().parts.len()
    }

    /// Whether node `n` was removed from the cluster.
    pub fn removed(&self, n: usize) -> bool {
        self.view.read().nodes.get(n).is_some_and(|n| n.removed)
    }

    /// The partition that owns `slot`, as far as this node knows: a partition hosted here
    /// knows its own slots; otherwise the last move learned, or the config's owner. A
    /// request sent to a partition that moved the slot on is answered `Moved` with the new
    /// owner, which this node then learns.
    pub fn owner(&self, map: &keel_cluster::Membership, slot: u16) -> usize {
        // The last move learned, else the config's owner; then, while that partition is
        // kept here, where its own table (replicated state, newer than anything learned)
        // says the slot went.
        let mut p = self
            .routes
            .read()
            .get(&slot)
            .copied()
            .unwrap_or_else(|| map.owner(keel_cluster::Slot(slot)));
        let parts = self.parts.read();
        for _ in 0..parts.len() {
            let Some(part) = parts.get(&p) else {
                break;
            };
            // Without a move, a partition owns the config's slots: no need for its lock,
            // which the state machine holds while it applies each entry.
            if !part.moved.load(std::sync::atomic::Ordering::Acquire) {
                break;
            }
            match part.locks.lock().owner(slot) {
                Some(next) if next != p => p = next,
                _ => break,
            }
        }
        p
    }

    /// Learns where slots went (from a `Moved` answer, or a move this node made).
    pub fn learn(&self, moved: &[(u16, usize)]) {
        let n = self.partitions();
        let mut routes = self.routes.write();
        for &(slot, p) in moved {
            if p < n {
                routes.insert(slot, p);
            }
        }
    }

    /// The slots that moved away from their config owner, as this node knows them.
    pub fn routes(&self, map: &keel_cluster::Membership) -> Vec<(u16, usize)> {
        (0..keel_cluster::SLOTS)
            .filter_map(|slot| {
                let p = self.owner(map, slot);
                (p != map.owner(keel_cluster::Slot(slot))).then_some((slot, p))
            })
            .collect()
    }

    /// `INFO replication`'s lines for the hosted partitions: `keel_partition_<p>:role=leader,
    /// leader=n2,term=3,last_log=120,applied=120,replicas=n1;n2;n3,prepared=0,decisions=0,
    /// watched=0,moved_slots=0` (the partition's voters as this replica knows them,
    /// transactions prepared here, commit decisions kept here, watched keys, slots whose
    /// owner is no longer the config's, as this partition knows).
    pub fn describe(&self, map: &keel_cluster::Membership) -> Vec<String> {
        let id = |n: u64| {
            map.nodes()
                .get(n as usize)
                .map_or_else(|| n.to_string(), |node| node.id.to_string())
        };
        self.hosted()
            .iter()
            .map(|part| {
                let m = part.raft.metrics().borrow().clone();
                let role = match m.state {
                    openraft::ServerState::Leader => "leader",
                    openraft::ServerState::Candidate => "candidate",
                    openraft::ServerState::Learner => "learner",
                    openraft::ServerState::Follower => "follower",
                    openraft::ServerState::Shutdown => "stopped",
                };
                let replicas: Vec<String> = m
                    .membership_config
                    .membership()
                    .voter_ids()
                    .map(id)
                    .collect();
                let (prepared, decided, watched, moved) = part.locks.lock().counts();
                format!(
                    "keel_partition_{}:role={role},leader={},term={},last_log={},applied={},replicas={},\
                     prepared={prepared},decisions={decided},watched={watched},moved_slots={moved}",
                    part.id,
                    m.current_leader.map_or_else(|| "-".to_owned(), id),
                    m.current_term,
                    m.last_log_index.unwrap_or(0),
                    m.last_applied.map_or(0, |l| l.index),
                    replicas.join(";"),
                )
            })
            .collect()
    }

    /// Partition `p`'s nodes, the one this node believes leads it first.
    pub fn serving(&self, p: usize) -> Vec<usize> {
        let mut nodes = self.view.read().parts.get(p).cloned().unwrap_or_default();
        if let Some(leader) = self.leader(p)
            && let Some(i) = nodes.iter().position(|&n| n == leader)
        {
            nodes[..=i].rotate_right(1);
        }
        nodes
    }

    /// The node this node believes leads partition `p`.
    pub fn leader(&self, p: usize) -> Option<usize> {
        match self.part(p) {
            Some(part) => part
                .raft
                .metrics()
                .borrow()
                .current_leader
                .map(|l| l as usize),
            None => self.hints.lock().get(&p).copied(),
        }
    }

    /// Stops every Raft group and closes the databases opened here.
    pub async fn stop(&self) {
        let parts: Vec<Arc<Part>> = std::mem::take(&mut *self.parts.write())
            .into_values()
            .collect();
        for part in parts {
            part.stop().await;
        }
        let dbs: Vec<Db> = self.dbs.lock().drain().map(|(_, db)| db).collect();
        let _ = tokio::task::spawn_blocking(move || {
            for db in dbs {
                if let Err(e) = db.clone().close() {
                    tracing::error!("closing a partition's database: {e}");
                }
            }
        })
        .await;
    }

    /// Takes `view` if it is newer than the one this node knows (and of this cluster): keeps
    /// it in the data directory, learns the nodes that joined, and wakes the reconciler.
    pub fn adopt(&self, shared: &Shared, view: View) -> bool {
        if view.layout != self.layout {
            return false;
        }
        {
            let mut current = self.view.write();
            if view.epoch <= current.epoch {
                return false;
            }
            if let Some(cluster) = &shared.cluster
                && view.nodes.len() > cluster.map().nodes().len()
            {
                match view.membership(self.me) {
                    Ok(map) => cluster.set_map(Arc::new(map)),
                    Err(e) => {
                        tracing::error!("a cluster view (epoch {}) is unusable: {e}", view.epoch);
                        return false;
                    }
                }
            }
            *current = Arc::new(view.clone());
        }
        tracing::info!("cluster view epoch {}", view.epoch);
        if let Some(dir) = &self.dir
            && let Err(e) = store_view(dir, &view)
        {
            tracing::warn!("keeping the cluster view in {}: {e}", dir.display());
        }
        self.wake.notify_one();
        true
    }

    /// Sends this node's view to every other node it lists (a node that misses it learns it
    /// from the next message of a node that has it).
    fn spread(&self, shared: &Arc<Shared>) {
        let view = self.view();
        let payload = postcard::to_stdvec(&*view).expect("a view encodes");
        for n in 0..view.nodes.len() {
            if n == self.me {
                continue;
            }
            let (shared, payload) = (Arc::clone(shared), payload.clone());
            tokio::spawn(async move {
                let _ = net::call_node(&shared, n, 0, "view", &payload, None).await;
            });
        }
    }

    /// A peer's message said it knows a view newer than this node's: asks it for that view.
    fn fetch_view(&self, shared: Arc<Shared>, from: usize) {
        use std::sync::atomic::Ordering;
        if self.fetching.swap(true, Ordering::AcqRel) {
            return;
        }
        tokio::spawn(async move {
            if let Ok(bytes) = net::call_node(&shared, from, 0, "view-get", &[], None).await
                && let Ok(view) = postcard::from_bytes::<View>(&bytes)
                && let Some(rep) = shared.replication.get()
            {
                rep.adopt(&shared, view);
            }
            if let Some(rep) = shared.replication.get() {
                rep.fetching.store(false, Ordering::Release);
            }
        });
    }

    /// Changes the view by `change` (of the newest view partition 0 holds), as an entry of
    /// partition 0's log that applies only if the view there is still the one `change` saw;
    /// retried on a newer one. The view in force once done.
    async fn change_view(
        &self,
        shared: &Arc<Shared>,
        change: impl Fn(&View) -> Result<Option<View>, String>,
    ) -> Result<Arc<View>, String> {
        for _ in 0..16 {
            let current = self.view();
            let Some(next) = change(&current)? else {
                return Ok(current);
            };
            let request = Request {
                op: Op::View {
                    expect: current.epoch,
                    view: postcard::to_stdvec(&next).expect("a view encodes"),
                },
                ..Request::default()
            };
            let reply = match self.run(shared, 0, request, false).await {
                Ok(reply) => reply,
                Err(RunError::Failed(text) | RunError::Unknown(text)) => return Err(text),
                Err(RunError::Moved | RunError::RolledBack) => {
                    return Err("ERR keel: partition 0 refused the view change".into());
                }
            };
            let now: View = postcard::from_bytes(&reply)
                .map_err(|e| format!("ERR keel: partition 0 answered a bad view: {e}"))?;
            let done = now == next;
            self.adopt(shared, now);
            if done {
                self.spread(shared);
                return Ok(self.view());
            }
        }
        Err("TRYAGAIN keel: the cluster view kept changing; try again".into())
    }

    /// Adds node `id` at `addr` to the cluster (`KEEL.JOIN`, sent by a node started with
    /// `--cluster-join`): the view with it, which the joining node starts from.
    pub async fn join(
        &self,
        shared: &Arc<Shared>,
        id: &str,
        addr: std::net::SocketAddr,
    ) -> Result<Arc<View>, String> {
        let view = self.change_view(shared, |v| v.join(id, addr)).await?;
        tracing::info!(
            "node {id} at {addr} is in the cluster (view epoch {})",
            view.epoch
        );
        Ok(view)
    }

    /// Removes node `id` (`KEEL.REMOVENODE`): its partition must own no slot; each partition
    /// it hosts moves that replica to another node. Returns once every such partition's
    /// membership no longer has it (or fails with `TRYAGAIN` after a while, the change going
    /// on); the number of partitions that moved a replica.
    pub async fn remove(&self, shared: &Arc<Shared>, id: &str) -> Result<usize, String> {
        let before = self.view();
        let k = before
            .index(id)
            .ok_or_else(|| format!("ERR keel: no node '{id}' in the cluster"))?;
        if !before.nodes[k].removed {
            // As the partition's leader knows it (this node's routes may be behind).
            let owned = self.owned(shared, k).await.ok_or_else(|| {
                format!(
                    "CLUSTERDOWN keel: node {id}'s partition has no leader this node can ask \
                     which slots it owns; nothing was changed"
                )
            })?;
            if owned > 0 {
                return Err(format!(
                    "ERR keel: node {id}'s partition owns {owned} slots: move them to other \
                     partitions first (keel cluster remove-node does)"
                ));
            }
        }
        let view = self.change_view(shared, |v| v.remove(id)).await?;
        let moving: Vec<usize> = (0..view.parts.len())
            .filter(|&p| before.parts.get(p).is_some_and(|nodes| nodes.contains(&k)))
            .collect();
        let deadline = Instant::now() + CONFORM_WAIT;
        let mut pending = moving.clone();
        while !pending.is_empty() {
            let mut still = Vec::new();
            for &p in &pending {
                let target: std::collections::BTreeSet<u64> =
                    view.parts[p].iter().map(|&n| n as u64).collect();
                if self.voters(shared, p).await.as_ref() != Some(&target) {
                    still.push(p);
                }
            }
            pending = still;
            if pending.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "TRYAGAIN keel: node {id} is out of the view, but partitions {pending:?} \
                     still have it among their replicas; their leaders go on moving them"
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(moving.len())
    }

    /// Empties the replica of partition `p` that left this node (stopped; its data `db`)
    /// ([`empty`]), then closes the databases opened for it ([`Replication::close`]).
    async fn empty(&self, p: usize, db: Db) {
        let Some(log_db) = self.dbs.lock().get(&format!("raft-{p}")).cloned() else {
            return;
        };
        let snapshot = self
            .dir
            .as_ref()
            .map(|d| d.join(format!("raft-{p}")).join(machine::SNAPSHOT_FILE));
        let emptied =
            tokio::task::spawn_blocking(move || empty(&db, &log_db, snapshot.as_deref())).await;
        match emptied.expect("emptying does not panic") {
            Ok(()) => {
                tracing::info!("partition {p}: the replica that left here is emptied");
                self.close(p).await;
            }
            // Kept open: the next open of the replica finishes the emptying.
            Err(e) => tracing::warn!("partition {p}: emptying the replica that left: {e}"),
        }
    }

    /// Closes the databases opened for partition `p`'s replica here (its data, unless it is
    /// the node's own database, and its log): their threads stop and their files close at
    /// once, and their memory and directory locks go with the last handle (a request still
    /// running on one fails). Placed here again, the replica opens them anew.
    async fn close(&self, p: usize) {
        let closing: Vec<(String, Db)> = {
            let mut open = self.dbs.lock();
            [format!("partition-{p}"), format!("raft-{p}")]
                .into_iter()
                .filter_map(|name| open.remove(&name).map(|db| (name, db)))
                .collect()
        };
        let _ = tokio::task::spawn_blocking(move || {
            for (name, db) in closing {
                match db.close() {
                    Ok(()) => tracing::info!("closed {name}, whose replica left this node"),
                    Err(e) => tracing::warn!("closing {name}: {e}"),
                }
            }
        })
        .await;
    }

    /// The names of the databases open for partitions' replicas here (`INFO replication`).
    pub fn open_databases(&self) -> Vec<String> {
        let mut names: Vec<String> = self.dbs.lock().keys().cloned().collect();
        names.sort();
        names
    }

    /// A new id for a request or a transaction of this node.
    pub fn next_id(&self) -> TxnId {
        TxnId {
            node: u16::try_from(self.me).expect("at most u16::MAX nodes"),
            incarnation: self.incarnation,
            seq: self.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// Partition `p`'s voters as its leader knows them.
    async fn voters(&self, shared: &Shared, p: usize) -> Option<std::collections::BTreeSet<u64>> {
        postcard::from_bytes(&self.ask_leader(shared, p, b"members").await?).ok()
    }

    /// Whether partition `p`'s leader has a committed, not joint, membership without this
    /// node (neither a voter nor a learner).
    async fn settled_without_me(&self, shared: &Shared, p: usize) -> bool {
        let Some(bytes) = self.ask_leader(shared, p, b"settled").await else {
            return false;
        };
        postcard::from_bytes::<std::collections::BTreeSet<u64>>(&bytes)
            .is_ok_and(|voters| !voters.is_empty() && !voters.contains(&(self.me as u64)))
    }

    /// How many slots partition `p` owns, as its leader knows.
    async fn owned(&self, shared: &Shared, p: usize) -> Option<usize> {
        postcard::from_bytes(&self.ask_leader(shared, p, b"owned").await?).ok()
    }

    /// Asks every partition's leader which slots it owns and learns the answers (a node's
    /// routes otherwise hold only the moves it made or met); how many partitions answered.
    pub async fn learn_slots(&self, shared: &Shared) -> usize {
        let mut answered = 0;
        for p in 0..self.partitions() {
            let Some(bytes) = self.ask_leader(shared, p, b"slots").await else {
                continue;
            };
            if let Ok(slots) = postcard::from_bytes::<Vec<u16>>(&bytes) {
                self.learn(&slots.iter().map(|&s| (s, p)).collect::<Vec<_>>());
                answered += 1;
            }
        }
        answered
    }

    /// Learns the slots of every partition whose moves changed since this node last learned
    /// them (`seen`: partition → [`prepared::Prepared::moves_digest`]), so that its routes,
    /// and the `CLUSTER` replies clients route by, follow a move made anywhere: from its own
    /// replica of a partition it hosts, else from the partition's leader. Before, a node
    /// learned a move only from a `MOVED` answer, a move it made, or `KEEL.LEARNSLOTS`, and
    /// until then listed the slot under its old owner.
    pub async fn follow_moves(
        &self,
        shared: &Shared,
        seen: &mut std::collections::HashMap<usize, u64>,
    ) {
        for p in 0..self.partitions() {
            // A removed node's partition owns no slot (`KEEL.REMOVENODE` moved them first).
            if self.removed(p) {
                continue;
            }
            let digest = match self.part(p) {
                Some(part) => Some(part.locks.lock().moves_digest()),
                None => self
                    .ask_leader(shared, p, b"moves")
                    .await
                    .and_then(|bytes| postcard::from_bytes::<u64>(&bytes).ok()),
            };
            let Some(digest) = digest else {
                continue;
            };
            if seen.get(&p) == Some(&digest) {
                continue;
            }
            let slots = match self.part(p) {
                Some(part) => Some(part.owned_slots()),
                None => self
                    .ask_leader(shared, p, b"slots")
                    .await
                    .and_then(|bytes| postcard::from_bytes::<Vec<u16>>(&bytes).ok()),
            };
            if let Some(slots) = slots {
                self.learn(&slots.iter().map(|&s| (s, p)).collect::<Vec<_>>());
                // The slots may be newer than the digest: then the next round asks again.
                seen.insert(p, digest);
            }
        }
    }

    /// [`Part::leader_knows`] `kind` of partition `p`, asked of the leader this node knows,
    /// else of the replicas the view places it on, following the leader they name.
    async fn ask_leader(&self, shared: &Shared, p: usize, kind: &[u8]) -> Option<Vec<u8>> {
        let mut ask: Vec<usize> = self.leader(p).into_iter().collect();
        ask.extend(self.view().parts.get(p).into_iter().flatten());
        let mut asked = std::collections::HashSet::new();
        while let Some(node) = ask.first().copied() {
            ask.remove(0);
            if !asked.insert(node) {
                continue;
            }
            let (known, leader): (Option<Vec<u8>>, Option<u64>) = if node == self.me {
                let part = self.part(p)?;
                let leader = part.raft.metrics().borrow().current_leader;
                (part.leader_knows(kind), leader)
            } else {
                let kind = std::str::from_utf8(kind).expect("an ASCII kind");
                let Ok(bytes) = net::call_node(shared, node, p, kind, &[], None).await else {
                    continue;
                };
                match postcard::from_bytes(&bytes) {
                    Ok(answer) => answer,
                    Err(_) => continue,
                }
            };
            match (known, leader) {
                (Some(known), _) => return Some(known),
                (None, Some(leader)) => ask.insert(0, leader as usize),
                (None, None) => {}
            }
        }
        None
    }

    /// Brings this node in line with its view: opens the partitions placed here, closes the
    /// ones placed elsewhere once their membership lets this node go, and, for the ones it
    /// leads, moves their membership to the view's placement.
    pub async fn reconcile(&self, shared: &Arc<Shared>) {
        if shared.shutdown.is_cancelled() {
            return;
        }
        let view = self.view();
        for p in 0..view.parts.len() {
            if view.parts[p].contains(&self.me) && self.part(p).is_none() {
                match self.open_part(shared, &view, p).await {
                    Ok(part) => {
                        tracing::info!("partition {p}: a replica opened here");
                        self.parts.write().insert(p, Arc::new(part));
                    }
                    Err(e) => tracing::warn!("partition {p}: cannot open a replica here: {e}"),
                }
            }
        }
        for part in self.hosted() {
            let p = part.id;
            let m = part.raft.metrics().borrow().clone();
            let voters: std::collections::BTreeSet<u64> =
                m.membership_config.membership().voter_ids().collect();
            let target: std::collections::BTreeSet<u64> = view
                .parts
                .get(p)
                .into_iter()
                .flatten()
                .map(|&n| n as u64)
                .collect();
            let leads = m.state == openraft::ServerState::Leader;
            if !target.contains(&(self.me as u64)) && !leads {
                // Out of the view, it stays until the partition's leader has committed a
                // membership without it that is not joint: until then the change may be
                // undone (a removed voter never hears of the final configuration, which goes
                // only to the new members). Then it is emptied, keeping its vote and a floor
                // ([`empty`]): a node that is behind may still count it a voter.
                if self.settled_without_me(shared, p).await {
                    self.parts.write().remove(&p);
                    tracing::info!("partition {p}: this node's replica left");
                    part.stop().await;
                    self.empty(p, part.db.clone()).await;
                }
                continue;
            }
            let stray_learners = m
                .membership_config
                .membership()
                .learner_ids()
                .any(|n| !target.contains(&n));
            if !leads || (voters == target && !stray_learners) || target.is_empty() {
                continue;
            }
            if !self.conforming.lock().insert(p) {
                continue;
            }
            let conforming = Arc::clone(&self.conforming);
            let view = Arc::clone(&view);
            tokio::spawn(async move {
                if let Err(e) = part.conform(&view, target).await {
                    tracing::info!("partition {p}: membership change: {e}");
                }
                conforming.lock().remove(&p);
            });
        }
    }

    /// Runs `request` on partition `p`: here if this node leads it, else on its leader,
    /// waiting through elections for up to three times the cluster's timeout, and while a
    /// key it touches is locked by a prepared transaction. `read`: every command only reads
    /// (no log entry; a linearizable read on the leader).
    pub async fn run(
        &self,
        shared: &Shared,
        p: usize,
        request: Request,
        read: bool,
    ) -> Result<Vec<u8>, RunError> {
        let cluster = shared.cluster.as_ref().expect("cluster mode");
        let patience = cluster.map().timeout() * 3;
        let deadline = Instant::now() + patience;
        let mut request = request;
        if !read && request.op == Op::Run && request.id.is_none() {
            request.id = Some(self.next_id());
            // Kept while this node may send it again, with a margin for the clocks.
            request.keep_ms = u64::try_from(patience.as_millis()).unwrap_or(u64::MAX / 2)
                + REQUEST_KEEP_MARGIN_MS;
        }
        let mut backoff = Duration::from_millis(1);
        // Over every try: a lost answer makes the outcome unknown until one succeeds.
        let mut maybe_applied = false;
        loop {
            let response = self
                .call_tracked(shared, p, &request, read, deadline, &mut maybe_applied)
                .await?;
            match response.status {
                Status::RolledBack => return Err(RunError::RolledBack),
                Status::Failed => {
                    return Err(RunError::Failed(
                        String::from_utf8_lossy(&response.reply).into_owned(),
                    ));
                }
                Status::Busy if Instant::now() < deadline => {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(20));
                }
                Status::Busy if maybe_applied => {
                    return Err(RunError::Unknown(format!(
                        "TRYAGAIN keel: partition {p}'s leader did not answer a write, and its \
                         keys stayed locked; it may or may not have happened"
                    )));
                }
                Status::Busy => {
                    return Err(RunError::Failed(format!(
                        "TRYAGAIN keel: a key of partition {p} stayed locked by a transaction \
                         across partitions; nothing was applied"
                    )));
                }
                Status::Moved => {
                    self.learn(
                        &postcard::from_bytes::<Vec<(u16, usize)>>(&response.reply)
                            .unwrap_or_default(),
                    );
                    return Err(RunError::Moved);
                }
                _ => return Ok(response.reply),
            }
        }
    }

    /// Sends `request` to partition `p`'s leader (here, or the node believed to lead it),
    /// following "not the leader" answers and retrying while the partition has no leader
    /// until `deadline`; the entry's response.
    pub async fn call(
        &self,
        shared: &Shared,
        p: usize,
        request: &Request,
        read: bool,
        deadline: Instant,
    ) -> Result<Response, RunError> {
        let mut maybe_applied = false;
        self.call_tracked(shared, p, request, read, deadline, &mut maybe_applied)
            .await
    }

    /// [`Replication::call`], setting `maybe_applied` once a try of the write (with an id)
    /// was sent and its answer lost: from then on, until its deadline, it may apply, and
    /// only a success says what happened.
    async fn call_tracked(
        &self,
        shared: &Shared,
        p: usize,
        request: &Request,
        read: bool,
        deadline: Instant,
        maybe_applied: &mut bool,
    ) -> Result<Response, RunError> {
        let mut target = self.leader(p);
        if p >= self.partitions() {
            return Err(RunError::Failed(format!(
                "ERR keel: no partition {p} in this cluster"
            )));
        }
        if request.size_bound() > REQUEST_BYTES_MAX {
            return Err(RunError::Failed(format!(
                "ERR keel: a replicated request is limited to {REQUEST_BYTES_MAX} bytes"
            )));
        }
        let mut payload: Option<Vec<u8>> = None;
        // A write with an id goes with its deadline on this node's clock: a leader it
        // reaches later refuses it (`Refused::Late`) rather than run it after this node has
        // stopped sending it again.
        let kind = match (read, request.id) {
            (true, _) => "read".to_owned(),
            (false, None) => "write".to_owned(),
            (false, Some(_)) => {
                let left = deadline.saturating_duration_since(Instant::now());
                let until = crate::keyspace::unix_ms()
                    .saturating_add(u64::try_from(left.as_millis()).unwrap_or(u64::MAX / 2));
                format!("write@{until}")
            }
        };
        // A write with an id that may have applied (its answer was lost) is sent again until
        // answered, the partition answering what it did the first time.
        loop {
            let outcome = match target {
                Some(node) if node == self.me => match self.part(p) {
                    Some(part) => part.submit(request.clone(), read).await,
                    None => Err(Refused::NotLeader(None)),
                },
                Some(node) => {
                    // Encoded only to go to another node (a local leader takes the request).
                    let payload = payload.get_or_insert_with(|| {
                        postcard::to_stdvec(request).expect("a request encodes")
                    });
                    match net::call_node(shared, node, p, &kind, payload, None).await {
                        Ok(bytes) => postcard::from_bytes::<Result<Response, Refused>>(&bytes)
                            .unwrap_or_else(|e| {
                                Err(Refused::Failed(format!(
                                    "ERR keel: a bad reply from node {node}: {e}"
                                )))
                            }),
                        // Never sent: try again once the partition has a reachable leader.
                        Err(net::CallError::Unsent(_)) => Err(Refused::NotLeader(None)),
                        // Sent, and the answer lost: a write may or may not have happened.
                        Err(net::CallError::Lost(text)) if !read && request.id.is_none() => {
                            return Err(RunError::Unknown(format!(
                                "TRYAGAIN keel: partition {p}'s leader did not answer ({text}); \
                                 the write may or may not have happened"
                            )));
                        }
                        Err(net::CallError::Lost(_)) if !read => {
                            *maybe_applied = true;
                            Err(Refused::NotLeader(None))
                        }
                        Err(net::CallError::Lost(_)) => Err(Refused::NotLeader(None)),
                    }
                }
                None => Err(Refused::NotLeader(None)),
            };
            match outcome {
                Ok(response) if *maybe_applied && response.status.refuses_this_try() => {
                    return Err(RunError::Unknown(format!(
                        "TRYAGAIN keel: partition {p}'s leader did not answer a write, and a \
                         later try did not apply; it may or may not have happened"
                    )));
                }
                Ok(response) => return Ok(response),
                Err(Refused::Failed(text)) => return Err(RunError::Failed(text)),
                Err(Refused::Stopped(text)) if request.id.is_none() => {
                    return Err(RunError::Unknown(text));
                }
                Err(Refused::Stopped(_)) => {
                    *maybe_applied = true;
                    if Instant::now() >= deadline {
                        return Err(RunError::Unknown(format!(
                            "TRYAGAIN keel: partition {p} did not answer a write in time; it \
                             may or may not have happened"
                        )));
                    }
                    tokio::time::sleep(RETRY_PAUSE).await;
                    target = None;
                }
                Err(Refused::RolledBack) => return Err(RunError::RolledBack),
                // This node's deadline passed too (the clocks differ by less than the slack).
                Err(Refused::Late(text)) if *maybe_applied => {
                    return Err(RunError::Unknown(format!(
                        "TRYAGAIN keel: partition {p}'s leader did not answer a write in time \
                         ({text}); it may or may not have happened"
                    )));
                }
                Err(Refused::Late(text)) => return Err(RunError::Failed(text)),
                Err(Refused::NotLeader(hint)) => {
                    if Instant::now() >= deadline && *maybe_applied {
                        return Err(RunError::Unknown(format!(
                            "TRYAGAIN keel: partition {p}'s leader did not answer a write, and \
                             no leader could be asked again in time; it may or may not have \
                             happened"
                        )));
                    }
                    if Instant::now() >= deadline {
                        return Err(RunError::Failed(format!(
                            "CLUSTERDOWN The cluster is down: partition {p} has no leader \
                             this node can reach"
                        )));
                    }
                    let nodes = self.view.read().nodes.len();
                    let hint = hint.map(|h| h as usize).filter(|&h| h < nodes);
                    if self.part(p).is_none() {
                        let mut hints = self.hints.lock();
                        match hint {
                            Some(h) => hints.insert(p, h),
                            None => hints.remove(&p),
                        };
                    }
                    tokio::time::sleep(RETRY_PAUSE).await;
                    // A replica other than the last one asked, if nobody knows the leader.
                    target = hint.or_else(|| self.leader(p)).or_else(|| {
                        let replicas = self.view.read().parts.get(p).cloned()?;
                        let at = target.and_then(|t| replicas.iter().position(|&n| n == t));
                        replicas
                            .get(at.map_or(0, |i| (i + 1) % replicas.len()))
                            .copied()
                    });
                }
            }
        }
    }
}

impl Part {
    /// Stops the Raft group (its databases stay open: `Replication::dbs`).
    async fn stop(&self) {
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!("partition {}: stopping raft: {e}", self.id);
        }
    }

    /// Moves the partition's membership (this node leads it) to `target`: each new node
    /// first joins as a learner and catches up from the log or a snapshot, then one joint
    /// change makes the voters `target` (openraft's joint consensus: both the old and the new
    /// majorities agree on every entry in between), and learners outside `target` (added
    /// for a placement the view left before the change) are removed. A leader that is not
    /// in `target` steps down once the change commits.
    async fn conform(
        &self,
        view: &View,
        target: std::collections::BTreeSet<u64>,
    ) -> Result<(), String> {
        let m = self.raft.metrics().borrow().membership_config.clone();
        let known: std::collections::BTreeSet<u64> =
            m.membership().nodes().map(|(&n, _)| n).collect();
        for &n in &target {
            if known.contains(&n) {
                continue;
            }
            let addr = view
                .nodes
                .get(n as usize)
                .map(|node| node.addr.clone())
                .ok_or_else(|| format!("no node {n} in the view"))?;
            may_change_membership(&self.raft)?;
            tracing::info!("partition {}: adding node {n} as a learner", self.id);
            tokio::time::timeout(
                CONFORM_WAIT,
                self.raft.add_learner(n, BasicNode::new(addr), true),
            )
            .await
            .map_err(|_| format!("node {n} did not catch up in {CONFORM_WAIT:?}"))?
            .map_err(|e| e.to_string())?;
        }
        let m = self.raft.metrics().borrow().membership_config.clone();
        let (voters, uniform) = (
            m.membership()
                .voter_ids()
                .collect::<std::collections::BTreeSet<u64>>(),
            m.membership().get_joint_config().len() == 1,
        );
        if !(uniform && voters == target) {
            may_change_membership(&self.raft)?;
            let goal = next_voters(m.membership(), self.raft.metrics().borrow().id, &target);
            tracing::info!("partition {}: changing the voters to {goal:?}", self.id);
            tokio::time::timeout(
                CONFORM_WAIT,
                self.raft.change_membership(goal.clone(), false),
            )
            .await
            .map_err(|_| format!("the change did not commit in {CONFORM_WAIT:?}"))?
            .map_err(|e| e.to_string())?;
            if goal != target {
                return Err(format!(
                    "finished an earlier change to {goal:?}, which this leader leaves; the next \
                     leader moves on to {target:?}"
                ));
            }
        }
        remove_learners(&self.raft, &target, self.id).await
    }

    /// Runs `request`'s reads on this replica's copy, whatever its role: a consistent
    /// snapshot of the entries it has applied, possibly behind the leader (`READONLY`).
    /// `Err` (`Busy` or `Moved`) while a key it reads is written by a prepared
    /// transaction, or its slot is not this partition's.
    pub fn read_local(&self, request: &Request) -> Result<Vec<u8>, Response> {
        read_here(&self.db, &self.locks, request)
    }

    /// Runs `request` here if this node leads the partition; the reply.
    #[cfg(test)]
    pub async fn serve(&self, request: Request, read: bool) -> Result<Vec<u8>, Refused> {
        let response = self.submit(request, read).await?;
        match response.status {
            Status::RolledBack => Err(Refused::RolledBack),
            Status::Failed => Err(Refused::Failed(
                String::from_utf8_lossy(&response.reply).into_owned(),
            )),
            _ => Ok(response.reply),
        }
    }

    /// Submits the write `request` (`Part::submit`) unless it arrived later than
    /// [`LATE_SLACK_MS`] after `until_ms`, its sender's deadline (`Refused::Late`).
    pub async fn submit_until(&self, request: Request, until_ms: u64) -> Result<Response, Refused> {
        let now = (self.clock)();
        if now > until_ms.saturating_add(LATE_SLACK_MS) {
            return Err(Refused::Late(format!(
                "TRYAGAIN keel: a write reached partition {}'s leader {} ms after its sender's \
                 deadline; it was not applied",
                self.id,
                now - until_ms
            )));
        }
        self.submit(request, false).await
    }

    /// Runs `request` here if this node leads the partition; the entry's response (for a
    /// read, `Busy` while a key it reads is written by a prepared transaction).
    pub async fn submit(&self, mut request: Request, read: bool) -> Result<Response, Refused> {
        use openraft::error::{CheckIsLeaderError, RaftError};
        // A replica that left the partition: nothing was submitted, try the others.
        if self.raft.metrics().borrow().state == openraft::ServerState::Shutdown {
            return Err(Refused::NotLeader(None));
        }
        if read {
            let (leads, term) = {
                let metrics = self.raft.metrics();
                let m = metrics.borrow();
                (m.state == openraft::ServerState::Leader, m.current_term)
            };
            let leased = leads && self.reads.leased(term);
            if !leased {
                self.reads
                    .linearize(|| async {
                        let began = tokio::time::Instant::now();
                        match self.raft.ensure_linearizable().await {
                            Ok(_) => {
                                self.reads.extend(term, began);
                                Ok(())
                            }
                            Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f))) => {
                                Err(Refused::NotLeader(f.leader_id))
                            }
                            Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(_))) => {
                                Err(Refused::NotLeader(None))
                            }
                            // Stopped here: a read may go to another replica.
                            Err(RaftError::Fatal(_)) => Err(Refused::NotLeader(None)),
                        }
                    })
                    .await?;
            }
            if let Op::ReadDecide { txn, deadline_ms } = request.op {
                return Ok(read_decided(
                    &self.db,
                    &self.locks,
                    &request,
                    txn,
                    deadline_ms,
                ));
            }
            return Ok(match read_here(&self.db, &self.locks, &request) {
                Ok(reply) => Response {
                    reply,
                    ..Response::default()
                },
                Err(refused) => refused,
            });
        }
        // The entry runs at the leader's time, whichever node took the request.
        request.now_ms = (self.clock)();
        if !matches!(request.op, Op::Run) || request.size_bound() > GROUP_BYTES_MAX {
            return write_entry(&self.raft, self.id, request).await;
        }
        let (answer, answered) = tokio::sync::oneshot::channel();
        if self.proposals.push(request, answer) {
            // In a task of its own: the group must be proposed even if this caller goes.
            tokio::spawn(Arc::clone(&self.proposals).propose(self.raft.clone(), self.id));
        }
        answered.await.unwrap_or_else(|_| {
            Err(Refused::Stopped(format!(
                "TRYAGAIN keel: partition {}'s replica on this node stopped; the write may or \
                 may not have happened",
                self.id
            )))
        })
    }

    /// If this replica leads the partition, what it knows of `kind` (encoded): its voters
    /// (`members`; `settled`: every node of it, only once the membership committed and is not
    /// joint), how many slots it owns (`owned`), which (`slots`), or a digest of its moves
    /// (`moves`).
    pub fn leader_knows(&self, kind: &[u8]) -> Option<Vec<u8>> {
        let m = self.raft.metrics().borrow().clone();
        if m.state != openraft::ServerState::Leader {
            return None;
        }
        let encoded = match kind {
            b"members" => postcard::to_stdvec(
                &m.membership_config
                    .membership()
                    .voter_ids()
                    .collect::<std::collections::BTreeSet<u64>>(),
            ),
            // Every node of the membership (voters and learners), once it is one
            // configuration (not joint) that committed: nodes outside it are out for good.
            b"settled" => {
                let stored = &m.membership_config;
                let uniform = stored.membership().get_joint_config().len() == 1;
                let applied = m.last_applied.map(|l| l.index);
                let committed = stored.log_id().is_none_or(|l| Some(l.index) <= applied);
                if !(uniform && committed) {
                    return None;
                }
                postcard::to_stdvec(
                    &stored
                        .membership()
                        .nodes()
                        .map(|(&n, _)| n)
                        .collect::<std::collections::BTreeSet<u64>>(),
                )
            }
            b"slots" => postcard::to_stdvec(&self.owned_slots()),
            b"moves" => postcard::to_stdvec(&self.locks.lock().moves_digest()),
            _ => {
                let locks = self.locks.lock();
                postcard::to_stdvec(
                    &(0..keel_cluster::SLOTS)
                        .filter(|&s| locks.owner(s) == Some(self.id))
                        .count(),
                )
            }
        };
        Some(encoded.expect("encodes"))
    }

    /// The slots this replica's table says the partition owns (a follower's lags its
    /// leader's by the entries it has yet to apply).
    pub fn owned_slots(&self) -> Vec<u16> {
        let locks = self.locks.lock();
        (0..keel_cluster::SLOTS)
            .filter(|&s| locks.owner(s) == Some(self.id))
            .collect()
    }

    /// Whether this node leads the partition now.
    pub fn leads(&self) -> bool {
        self.raft.metrics().borrow().state == openraft::ServerState::Leader
    }

    /// On the partition's leader: how many of its other voters hold every entry it has
    /// applied (`WAIT`'s count); `None` elsewhere.
    pub fn caught_up(&self) -> Option<usize> {
        let m = self.raft.metrics().borrow().clone();
        if m.state != openraft::ServerState::Leader {
            return None;
        }
        let applied = m.last_applied.map_or(0, |l| l.index);
        let matched = m.replication.as_ref()?;
        Some(
            m.membership_config
                .voter_ids()
                .filter(|&v| v != m.id)
                .filter(|v| {
                    matched
                        .get(v)
                        .and_then(|l| l.as_ref())
                        .is_some_and(|l| l.index >= applied)
                })
                .count(),
        )
    }
}

/// Whether the leader `raft` may propose a membership change now (`Err`: why not): only
/// while its membership has committed and counts it a voter. One whose committed membership
/// no longer has it (the end of a change that removed it, maybe one a caller gave up
/// waiting for) leads on until it steps down, and openraft asserts that it appends no
/// membership meanwhile (`Only leader is allowed to call update_effective_membership()`).
/// Checked right before each change: a learner's catch-up may take long, and a change
/// given up on goes on meanwhile.
/// Whether the leader `raft` may propose a membership change now (`Err`: why not): only
/// while its membership has committed and counts it a voter (one whose committed membership
/// no longer has it leads on until it steps down, and openraft asserts that it appends no
/// membership meanwhile). Checked right before each change: a learner's catch-up may take
/// long, and a change a caller gave up waiting for goes on meanwhile.
pub(crate) fn may_change_membership(raft: &Raft) -> Result<(), String> {
    let m = raft.metrics().borrow().clone();
    let stored = &m.membership_config;
    let applied = m.last_applied.map(|l| l.index);
    if stored.log_id().is_some_and(|l| Some(l.index) > applied) {
        return Err("the last membership change has not committed yet".into());
    }
    if !stored.membership().voter_ids().any(|v| v == m.id) {
        return Err(format!(
            "node {} is leaving; the next leader changes it",
            m.id
        ));
    }
    Ok(())
}

/// The voters the leader `me` changes the membership `m` to on its way to `target`:
/// `target`, except when `m` is joint (a change an earlier leader began), its newer
/// configuration lacks `me`, and `target` too. openraft moves a joint `[old, new]` toward
/// `target` through `[new, target]`, then `[target]`, each step a membership entry this
/// leader appends; the second would be appended by a leader its effective membership no
/// longer counts, which openraft asserts never happens (`Only leader is allowed to call
/// update_effective_membership()`). Then the change goes to `new` alone (one step), after
/// which this leader steps down and the next one moves on to `target`.
pub(crate) fn next_voters(
    m: &openraft::Membership<u64, BasicNode>,
    me: u64,
    target: &std::collections::BTreeSet<u64>,
) -> std::collections::BTreeSet<u64> {
    match m.get_joint_config().as_slice() {
        [old, new]
            if new != target && old != target && !new.contains(&me) && !target.contains(&me) =>
        {
            new.clone()
        }
        _ => target.clone(),
    }
}

/// Removes from the leader `raft`'s membership of partition `part` the learners outside
/// `target` (its voters): a replica stops only once the membership does not count it at
/// all (`Part::leader_knows`, `settled`), and a leader keeps replicating to its learners.
pub(crate) async fn remove_learners(
    raft: &Raft,
    target: &std::collections::BTreeSet<u64>,
    part: usize,
) -> Result<(), String> {
    let m = raft.metrics().borrow().membership_config.clone();
    let stray: std::collections::BTreeSet<u64> = m
        .membership()
        .learner_ids()
        .filter(|n| !target.contains(n))
        .collect();
    if stray.is_empty() {
        return Ok(());
    }
    may_change_membership(raft)?;
    tracing::info!("partition {part}: removing the learners {stray:?}");
    tokio::time::timeout(
        CONFORM_WAIT,
        raft.change_membership(openraft::ChangeMembers::RemoveNodes(stray), false),
    )
    .await
    .map_err(|_| format!("removing learners did not commit in {CONFORM_WAIT:?}"))?
    .map_err(|e| e.to_string())?;
    Ok(())
}

/// Runs `request`'s read-only commands on `db` (after a linearizable read check) and returns
/// the reply; `Busy` if a key they read is written by a prepared transaction (its effect is
/// not there yet, and the old value may no longer be one a serial order allows), `Moved` if
/// a key's slot is not this partition's.
fn read_here(db: &Db, locks: &prepared::Shared, request: &Request) -> Result<Vec<u8>, Response> {
    let cursors = data::Cursors::default();
    let encodings = crate::config::Encodings::default();
    let ctx = read_ctx(request, &cursors, &encodings);
    let mut buf = bytes::BytesMut::new();
    let mut out = Out::new(&mut buf, request.proto());
    let begun = {
        // The lock table and the snapshot taken together: both after the same entries.
        let locks = locks.lock();
        refuse_read(&locks, request)?;
        db.begin()
    };
    match begun {
        // Dropped, never committed: a read that met an expired key deleted it only here.
        Ok(mut txn) => {
            machine::run_all(
                &request.args(),
                request.exec,
                false,
                &mut txn,
                &ctx,
                &mut out,
            );
        }
        Err(e) => out.error(&format!("ERR keel: {e}")),
    }
    Ok(buf.to_vec())
}

/// What a read at the leader runs its commands with: the limits `request` carries, the
/// clock now.
fn read_ctx<'a>(
    request: &Request,
    cursors: &'a data::Cursors,
    encodings: &'a crate::config::Encodings,
) -> data::Ctx<'a> {
    data::Ctx {
        bulk_bytes_max: request.bulk_bytes_max,
        cursors,
        reply_bytes_max: request.reply_bytes_max,
        track_increments: false,
        clock: Default::default(),
        encodings,
        contended: Default::default(),
        cluster: true,
    }
}

/// Why a read may not run now, if it may not: a key of another partition's slot (`Moved`),
/// or one a prepared transaction writes (`Busy`).
fn refuse_read(locks: &prepared::Locks, request: &Request) -> Result<(), Response> {
    let moved = locks.misplaced(&request.commands);
    if !moved.is_empty() {
        return Err(Response {
            reply: postcard::to_stdvec(&moved).expect("encodes"),
            status: Status::Moved,
            ..Response::default()
        });
    }
    if locks.conflicts(&request.commands) {
        return Err(Response {
            status: Status::Busy,
            ..Response::default()
        });
    }
    Ok(())
}

/// [`Op::ReadDecide`]: the coordinator partition's reads of a transaction across partitions
/// that only reads, each command's reply, unless this partition decided `txn` or passed
/// `deadline_ms` (`Aborted`). Checked against the same entries as the reads: a `Resolve`
/// applied after them comes after the reads, and so does the release of the keys a
/// participant holds, which waits for the `Resolve`'s answer.
fn read_decided(
    db: &Db,
    locks: &prepared::Shared,
    request: &Request,
    txn: TxnId,
    deadline_ms: u64,
) -> Response {
    let cursors = data::Cursors::default();
    let encodings = crate::config::Encodings::default();
    let ctx = read_ctx(request, &cursors, &encodings);
    let ended = |status: Status, reply: String| Response {
        reply: reply.into_bytes(),
        status,
        ..Response::default()
    };
    let begun = {
        let locks = locks.lock();
        if let Err(refused) = refuse_read(&locks, request) {
            return refused;
        }
        if locks.clock() > deadline_ms {
            return ended(Status::Aborted, String::new());
        }
        db.begin()
    };
    let mut engine = match begun {
        Ok(engine) => engine,
        Err(e) => return ended(Status::Failed, format!("ERR keel: {e}")),
    };
    match prepared::finished(&mut engine, txn, deadline_ms) {
        Ok(false) => {}
        Ok(true) => return ended(Status::Aborted, String::new()),
        Err(text) => return ended(Status::Failed, text),
    }
    // As a prepare runs them: the first failure fails it all.
    match prepared::run_in(&mut engine, request, &ctx) {
        (_, Some(text)) => ended(Status::Failed, text),
        (replies, None) => Response {
            replies,
            ..Response::default()
        },
    }
}

impl Request {
    /// `commands` for `op` (one command's reply, RESP2, no id), stamped with this node's
    /// clock and `shared`'s limits: what a node asks of a partition; the caller sets what
    /// differs.
    pub fn new(shared: &Shared, commands: Vec<Vec<Vec<u8>>>, op: Op) -> Request {
        Request {
            commands,
            exec: false,
            batch: false,
            resp3: false,
            now_ms: crate::keyspace::unix_ms(),
            bulk_bytes_max: shared
                .proto_max_bulk_len
                .load(std::sync::atomic::Ordering::Relaxed),
            reply_bytes_max: shared.config.reply_bytes_max,
            op,
            watched: Vec::new(),
            id: None,
            keep_ms: 0,
        }
    }

    /// The protocol of the reply.
    pub fn proto(&self) -> Proto {
        if self.resp3 {
            Proto::Resp3
        } else {
            Proto::Resp2
        }
    }

    /// At least the request's encoded size (postcard: a length of at most 10 bytes before
    /// each argument and list, and the fixed fields), without encoding it.
    pub fn size_bound(&self) -> usize {
        let args: usize = self.commands.iter().flatten().map(|a| a.len() + 10).sum();
        args + 10 * self.commands.len() + 64
    }

    /// Each command's arguments, as the command functions take them.
    pub fn args(&self) -> Vec<Vec<Bytes>> {
        self.commands
            .iter()
            .map(|c| c.iter().map(|a| Bytes::copy_from_slice(a)).collect())
            .collect()
    }
}

/// How often a partition's leader looks for keys past their deadline and dropped
/// collections to delete ([`reap_loop`]).
const REAP_EVERY: Duration = Duration::from_secs(1);

/// Passes of `KEEL.REAP` one look proposes at most, while work remains.
const REAP_PASSES_MAX: usize = 64;

/// The reaper of a replicated node, which runs no reaper thread (its data changes only by
/// log entries): every [`REAP_EVERY`], for each partition this node leads that holds a key
/// past its deadline or a dropped collection, proposes `KEEL.REAP` entries (each deletes up
/// to 512 of each, at the entry's time, identically on every replica) until none is left or
/// [`REAP_PASSES_MAX`] went, until the server stops. So expired keys that nobody reads
/// again, and the members of deleted collections, give their memory back here too.
pub async fn reap_loop(shared: std::sync::Weak<Shared>) {
    loop {
        tokio::time::sleep(REAP_EVERY).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        if shared.shutdown.is_cancelled() {
            return;
        }
        let Some(rep) = shared.replication.get() else {
            return;
        };
        for part in rep.hosted() {
            for _ in 0..REAP_PASSES_MAX {
                if !part.leads() || !crate::reaper::has_work(&part.db, (part.clock)()) {
                    break;
                }
                let request = Request {
                    now_ms: (part.clock)(),
                    ..Request::new(&shared, vec![vec![b"KEEL.REAP".to_vec()]], Op::Run)
                };
                match rep.run(&shared, part.id, request, false).await {
                    // Counted where the pass was proposed, as a Redis primary counts the
                    // expiries its replicas only apply.
                    Ok(reply) => match parse_reaped(&reply) {
                        Some((expired, swept)) => {
                            let stats = &shared.reaper;
                            stats
                                .expired_keys
                                .fetch_add(expired, std::sync::atomic::Ordering::Relaxed);
                            stats
                                .swept_keys
                                .fetch_add(swept, std::sync::atomic::Ordering::Relaxed);
                        }
                        None => {
                            tracing::debug!(
                                "partition {}: a reap pass answered {}",
                                part.id,
                                String::from_utf8_lossy(&reply).trim_end()
                            );
                            break;
                        }
                    },
                    Err(e) => {
                        tracing::debug!("partition {}: a reap pass failed: {e:?}", part.id);
                        break;
                    }
                }
            }
        }
    }
}

/// `KEEL.REAP`'s answer, `*2 :expired :swept`.
fn parse_reaped(reply: &[u8]) -> Option<(u64, u64)> {
    let text = std::str::from_utf8(reply).ok()?;
    let mut lines = text.split("\r\n");
    (lines.next()? == "*2").then_some(())?;
    let expired = lines.next()?.strip_prefix(':')?.parse().ok()?;
    let swept = lines.next()?.strip_prefix(':')?.parse().ok()?;
    Some((expired, swept))
}

/// Runs [`Replication::reconcile`] every second, and at once when a newer view arrives,
/// until the server stops.
pub async fn reconcile_loop(shared: std::sync::Weak<Shared>) {
    loop {
        let wake = {
            let Some(shared) = shared.upgrade() else {
                return;
            };
            if shared.shutdown.is_cancelled() {
                return;
            }
            let Some(rep) = shared.replication.get() else {
                return;
            };
            rep.reconcile(&shared).await;
            Arc::clone(&rep.wake)
        };
        let _ = tokio::time::timeout(RECONCILE_EVERY, wake.notified()).await;
    }
}

/// How often [`follow_moves_loop`] looks for slot moves.
pub const FOLLOW_MOVES_EVERY: Duration = Duration::from_secs(1);

/// Runs [`Replication::follow_moves`] every [`FOLLOW_MOVES_EVERY`] until the server stops,
/// so that every node's routes agree within about a second of a move (Redis Cluster's nodes
/// spread a new slot owner with their pings).
pub async fn follow_moves_loop(shared: std::sync::Weak<Shared>) {
    let mut seen = std::collections::HashMap::new();
    loop {
        tokio::time::sleep(FOLLOW_MOVES_EVERY).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        if shared.shutdown.is_cancelled() {
            return;
        }
        let Some(rep) = shared.replication.get() else {
            return;
        };
        rep.follow_moves(&shared, &mut seen).await;
    }
}

/// Serves a `KEEL.RAFT <partition> <kind> <payload>` request from another node: Raft's RPCs
/// (`append`, `vote`, `snapshot`) and requests forwarded to this node as the leader
/// (`write`, `read`). The reply is the encoded answer.
pub async fn serve_rpc(shared: &Arc<Shared>, args: &[Bytes]) -> Result<Vec<u8>, String> {
    let Some(rep) = shared.replication.get() else {
        return Err("ERR keel: this node does not replicate partitions".into());
    };
    let header = std::str::from_utf8(&args[1]).unwrap_or("");
    let mut fields = header.split('/');
    let (p, layout) = fields
        .next()
        .zip(fields.next())
        .and_then(|(p, l)| Some((p.parse::<usize>().ok()?, u64::from_str_radix(l, 16).ok()?)))
        .ok_or("ERR keel: KEEL.RAFT needs <partition>/<layout digest>[/<epoch>/<sender>]")?;
    let sent_by = fields
        .next()
        .zip(fields.next())
        .and_then(|(e, n)| Some((e.parse::<u64>().ok()?, n.parse::<usize>().ok()?)));
    if layout != rep.layout {
        // Nodes that place partitions differently must not vote in each other's groups.
        static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        let text = format!(
            "ERR keel: this node places partitions differently (layout {:016x}, the sender's \
             {layout:016x}): every node needs the same cluster config and --replicas",
            rep.layout
        );
        if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::error!("refusing raft messages from a node: {text}");
        }
        return Err(text);
    }
    let kind = args[2].as_ref();
    let payload = &args[3];
    if let Some((epoch, sender)) = sent_by
        && epoch > rep.view.read().epoch
        && sender != rep.me
        && sender < shared.cluster.as_ref().map_or(0, |c| c.map().nodes().len())
    {
        rep.fetch_view(Arc::clone(shared), sender);
    }
    match kind {
        // A node passing on a newer view, and one asking for this node's.
        b"view" => {
            let view: View = postcard::from_bytes(payload)
                .map_err(|e| format!("ERR keel: a bad cluster view: {e}"))?;
            rep.adopt(shared, view);
            return Ok(Vec::new());
        }
        b"view-get" => return Ok(postcard::to_stdvec(&*rep.view()).expect("a view encodes")),
        _ => {}
    }
    let Some(part) = rep.part(p) else {
        if matches!(kind, b"write" | b"read") {
            let refused: Result<Response, Refused> =
                Err(Refused::NotLeader(rep.leader(p).map(|l| l as u64)));
            return Ok(postcard::to_stdvec(&refused).expect("encodes"));
        }
        return Err(format!("ERR keel: partition {p} is not on this node"));
    };
    net::serve(&part, kind, payload).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
    use openraft::testing::{StoreBuilder, Suite};
    use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, StorageError};

    fn memory_db() -> Db {
        Db::in_memory()
    }

    /// openraft's settings with the server's heartbeat and election timeouts.
    fn timeouts() -> openraft::Config {
        openraft::Config {
            heartbeat_interval: HEARTBEAT_MS,
            election_timeout_min: ELECTION_MS.0,
            election_timeout_max: ELECTION_MS.1,
            ..Default::default()
        }
    }

    struct Stores;

    impl StoreBuilder<Tc, log::LogStore, machine::Machine, ()> for Stores {
        async fn build(&self) -> Result<((), log::LogStore, machine::Machine), StorageError<u64>> {
            let log = log::LogStore::open(memory_db(), keel::Durability::None);
            let machine = machine::Machine::open(memory_db(), None).await?;
            Ok(((), log, machine))
        }
    }

    /// openraft's own conformance suite for log stores and state machines.
    #[tokio::test]
    async fn reads_share_rounds_that_began_after_they_arrived() {
        use std::sync::atomic::{AtomicU64, Ordering};
        let rounds = Arc::new(ReadRounds::default());
        let checks = Arc::new(AtomicU64::new(0));
        let (release, hold) = tokio::sync::oneshot::channel::<()>();
        // A round under way, held open.
        let first = {
            let (rounds, checks) = (Arc::clone(&rounds), Arc::clone(&checks));
            tokio::spawn(async move {
                rounds
                    .linearize(|| async move {
                        checks.fetch_add(1, Ordering::SeqCst);
                        hold.await.ok();
                        Ok(())
                    })
                    .await
            })
        };
        while checks.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        // Ten reads arrive while it runs: it began before them, so it serves none of them;
        // one more round serves them all.
        let later: Vec<_> = (0..10)
            .map(|_| {
                let (rounds, checks) = (Arc::clone(&rounds), Arc::clone(&checks));
                tokio::spawn(async move {
                    rounds
                        .linearize(|| async move {
                            checks.fetch_add(1, Ordering::SeqCst);
                            Ok(())
                        })
                        .await
                })
            })
            .collect();
        tokio::task::yield_now().await;
        release.send(()).expect("held");
        first.await.expect("joins").expect("ok");
        for read in later {
            read.await.expect("joins").expect("ok");
        }
        assert_eq!(checks.load(Ordering::SeqCst), 2);
        // A failed round serves nobody else: the next read runs its own.
        let failed = rounds
            .linearize(|| async { Err(Refused::NotLeader(None)) })
            .await;
        assert!(failed.is_err());
        rounds
            .linearize(|| async {
                checks.fetch_add(1, Ordering::SeqCst);
                Ok(())
            })
            .await
            .expect("ok");
        assert_eq!(checks.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_write_sent_again_is_answered_once_and_its_answer_dropped_in_time() {
        let db = memory_db();
        let mut m = machine::Machine::open(db.clone(), None)
            .await
            .expect("open");
        let id = TxnId {
            node: 1,
            incarnation: 2,
            seq: 3,
        };
        let incr = |index: u64, now_ms: u64, id: Option<TxnId>| {
            let mut e = step(index, now_ms, &[&["INCR", "n"]], Op::Run);
            if let EntryPayload::Normal(r) = &mut e.payload {
                r.id = id;
                r.keep_ms = 1_000;
            }
            e
        };
        let t = 1_700_000_000_000;
        let replies = m
            .apply(vec![
                incr(1, t, Some(id)),
                // The same write again (its sender lost the answer): answered, not run.
                incr(2, t + 10, Some(id)),
                incr(3, t + 20, None),
            ])
            .await
            .expect("apply");
        let replies: Vec<&[u8]> = replies.iter().map(|r| r.reply.as_slice()).collect();
        assert_eq!(replies, [&b":1\r\n"[..], b":1\r\n", b":2\r\n"]);
        // Past its time, the next sweep (every 8 entries) drops the answer: the id would
        // run again, and nothing is kept for it.
        let later: Vec<Entry<Tc>> = (4..=64).map(|i| incr(i, t + 5_000, None)).collect();
        m.apply(later).await.expect("apply");
        let kept = |db: &Db| {
            db.snapshot()
                .unwrap()
                .range::<[u8]>(..)
                .filter(|(k, _)| {
                    k.starts_with(&[0xFF, b'r', b'q']) || k.starts_with(&[0xFF, b'r', b'Q'])
                })
                .count()
        };
        assert_eq!(kept(&db), 0);
        let again = m
            .apply(vec![incr(65, t + 5_000, Some(id))])
            .await
            .expect("apply");
        assert_eq!(again[0].reply, b":64\r\n");
        assert_eq!(kept(&db), 2);
    }

    /// Answers that fall due faster than one transaction can drop them (more than
    /// `TXN_WRITE_KEYS_MAX` / 2 at once: a few seconds of a busy partition's writes, all due
    /// after a pause) are dropped a bounded number per sweep. Unbounded, the sweep failed its
    /// entry, and with it the partition's Raft group, on every replica (found under load:
    /// `limit exceeded: keys written by one transaction`).
    #[tokio::test]
    async fn answers_due_all_at_once_are_dropped_over_several_sweeps() {
        let db = memory_db();
        let mut m = machine::Machine::open(db.clone(), None)
            .await
            .expect("open");
        let t = 1_700_000_000_000;
        let (groups, per_group) = (400u64, 100u64);
        let mut index = 0;
        for g in 0..groups {
            let writes: Vec<Request> = (0..per_group)
                .map(|i| {
                    let EntryPayload::Normal(mut r) = step(
                        0,
                        t,
                        &[&["SET", &format!("k{}", g * per_group + i), "v"]],
                        Op::Run,
                    )
                    .payload
                    else {
                        unreachable!("a normal entry")
                    };
                    r.id = Some(TxnId {
                        node: 1,
                        incarnation: 7,
                        seq: g * per_group + i,
                    });
                    r.keep_ms = 1_000;
                    r
                })
                .collect();
            index += 1;
            let mut entry = step(index, t, &[], Op::Many(writes));
            if let EntryPayload::Normal(r) = &mut entry.payload {
                r.commands.clear();
            }
            // Entries at a multiple of the sweep interval sweep nothing yet: nothing is due.
            m.apply(vec![entry]).await.expect("apply");
        }
        let kept = |db: &Db| {
            db.snapshot()
                .unwrap()
                .range::<[u8]>((
                    std::ops::Bound::Included(&[0xFF, b'r', b'Q'][..]),
                    std::ops::Bound::Excluded(&[0xFF, b'r', b'R'][..]),
                ))
                .count()
        };
        let total = (groups * per_group) as usize;
        assert_eq!(kept(&db), total);
        // Every one of them due now: each sweep drops some, none fails, and they all go.
        let mut sweeps = 0;
        while kept(&db) > 0 {
            assert!(index < 100_000, "{} answers left", kept(&db));
            let before = kept(&db);
            index += 1;
            m.apply(vec![step(index, t + 5_000, &[&["SET", "x", "y"]], Op::Run)])
                .await
                .expect("a sweep fits in its entry");
            let dropped = before - kept(&db);
            assert!(dropped <= 1024, "{dropped} dropped at once");
            sweeps += usize::from(dropped > 0);
        }
        assert!(sweeps >= total / 1024, "{sweeps} sweeps");
        assert_eq!(
            db.snapshot()
                .unwrap()
                .range::<[u8]>(..)
                .filter(|(k, _)| k.starts_with(&[0xFF, b'r', b'q']))
                .count(),
            0,
            "every answer went with its entry in the index"
        );
    }

    /// A partition holding more keys than one transaction may write is not flushed by one
    /// `FLUSHALL` entry: it answers why (the node then sends `KEEL.FLUSHBATCH` entries), and
    /// the partition applies on. `KEEL.FLUSHBATCH` entries then empty it, answering 1 while
    /// keys remain, and leave the replication records (the applied marker).
    #[tokio::test]
    async fn a_flush_of_more_keys_than_one_transaction_writes_goes_in_batches() {
        let db = memory_db();
        let mut m = machine::Machine::open(db.clone(), None)
            .await
            .expect("open");
        let t = 1_700_000_000_000;
        let mut index = 0;
        for from in (0..70_000).step_by(1_000) {
            let mset = mset_of(from, 1_000);
            let mset: Vec<&str> = mset.iter().map(String::as_str).collect();
            index += 1;
            m.apply(vec![step(index, t, &[&mset], Op::Run)])
                .await
                .expect("apply");
        }
        let flushed = m
            .apply(vec![step(index + 1, t, &[&["FLUSHALL"]], Op::Run)])
            .await
            .expect("the entry applies");
        let reply = String::from_utf8_lossy(&flushed[0].reply);
        assert!(reply.starts_with(&format!("-{FLUSH_TOO_LARGE}")), "{reply}");
        assert!(
            reply.contains("or more (its node then flushes it in batches)"),
            "{reply}"
        );
        assert_eq!(applies_on(&mut m, index + 2, t).await, b":70001\r\n");
        let batch = |index| step(index, t, &[&["KEEL.FLUSHBATCH"]], Op::Run);
        let first = m.apply(vec![batch(index + 4)]).await.expect("applies");
        assert_eq!(first[0].reply, b":1\r\n", "more than one entry deletes");
        assert_eq!(applies_on(&mut m, index + 5, t).await, b":8561\r\n");
        let second = m.apply(vec![batch(index + 7)]).await.expect("applies");
        assert_eq!(second[0].reply, b":0\r\n", "{:?}", second[0]);
        assert_eq!(applies_on(&mut m, index + 8, t).await, b":1\r\n");
        let kept = db
            .snapshot()
            .expect("snapshot")
            .range::<[u8]>(..)
            .filter(|(k, _)| k.starts_with(&[0xFF, b'r']))
            .count();
        assert!(kept > 0, "the replication records stay");
    }

    /// A group's writes apply in order, each as its own entry would (ids included), and
    /// each gets its own response; anything but a plain write in a group is refused alone.
    #[tokio::test]
    async fn a_group_of_writes_applies_each_as_its_own_entry() {
        let db = memory_db();
        let mut m = machine::Machine::open(db, None).await.expect("open");
        let id = TxnId {
            node: 1,
            incarnation: 2,
            seq: 3,
        };
        let request = |commands: &[&[&str]], id: Option<TxnId>, op: Op| {
            let EntryPayload::Normal(mut r) = step(0, 1_700_000_000_000, commands, op).payload
            else {
                unreachable!("a normal entry")
            };
            r.id = id;
            r.keep_ms = 1_000;
            r
        };
        let group = vec![
            request(&[&["INCR", "n"]], Some(id), Op::Run),
            // Sent again inside the same group: answered from the first, not run.
            request(&[&["INCR", "n"]], Some(id), Op::Run),
            request(&[&["INCR", "n"]], None, Op::Run),
            request(&[&["GET", "n"]], None, Op::Watch),
            request(&[&["SET", "s", "v"]], None, Op::Run),
        ];
        let mut entry = step(1, 1_700_000_000_000, &[], Op::Many(group));
        if let EntryPayload::Normal(r) = &mut entry.payload {
            r.commands.clear();
        }
        let responses = m.apply(vec![entry]).await.expect("apply");
        let inner: Vec<Response> = responses[0]
            .replies
            .iter()
            .map(|r| postcard::from_bytes(r).expect("a response"))
            .collect();
        let replies: Vec<&[u8]> = inner.iter().map(|r| r.reply.as_slice()).collect();
        assert_eq!(
            replies,
            [
                &b":1\r\n"[..],
                b":1\r\n",
                b":2\r\n",
                b"ERR keel: only writes go into a group",
                b"+OK\r\n"
            ]
        );
        assert_eq!(inner[3].status, Status::Failed);
        let after = m
            .apply(vec![step(2, 1_700_000_000_010, &[&["GET", "n"]], Op::Run)])
            .await
            .expect("apply");
        assert_eq!(after[0].reply, b"$1\r\n2\r\n");
    }

    #[test]
    fn log_and_state_machine_pass_openraft_suite() {
        Suite::test_all(Stores).expect("the suite passes");
    }

    fn entry(index: u64, commands: &[&[&str]]) -> Entry<Tc> {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 0), index),
            payload: EntryPayload::Normal(Request {
                commands: commands
                    .iter()
                    .map(|c| c.iter().map(|a| a.as_bytes().to_vec()).collect())
                    .collect(),
                exec: commands.len() > 1,
                batch: false,
                resp3: false,
                now_ms: 1_700_000_000_000 + index,
                bulk_bytes_max: 512 << 20,
                reply_bytes_max: 1 << 30,
                op: Op::Run,
                watched: Vec::new(),
                id: None,
                keep_ms: 0,
            }),
        }
    }

    /// `MSET k<from> v k<from+1> v ...` of `n` keys, as owned arguments.
    fn mset_of(from: usize, n: usize) -> Vec<String> {
        std::iter::once("MSET".to_owned())
            .chain((from..from + n).flat_map(|i| [format!("k{i}"), "v".to_owned()]))
            .collect()
    }

    /// The response of an entry that was refused rather than failed: `Failed`, its reply
    /// saying `why`.
    fn assert_refused(r: &Response, why: &str) {
        let reply = String::from_utf8_lossy(&r.reply);
        assert_eq!(r.status, Status::Failed, "{reply}");
        assert!(reply.contains(why), "{reply}");
    }

    /// After an entry refused for its size, the partition applies on: `SET x y` at `index`,
    /// then `DBSIZE`, whose reply this returns.
    async fn applies_on(m: &mut machine::Machine, index: u64, now: u64) -> Vec<u8> {
        let after = m
            .apply(vec![
                step(index, now, &[&["SET", "x", "y"]], Op::Run),
                step(index + 1, now, &[&["DBSIZE"]], Op::Run),
            ])
            .await
            .expect("it applies on");
        after[1].reply.clone()
    }

    fn step(index: u64, now_ms: u64, commands: &[&[&str]], op: Op) -> Entry<Tc> {
        let mut e = entry(index, commands);
        if let EntryPayload::Normal(r) = &mut e.payload {
            r.exec = false;
            r.now_ms = now_ms;
            r.op = op;
        }
        e
    }

    /// A state machine on `db` as partition `me` of two (0 owns the slots below 8192, 1 the
    /// others).
    async fn homed(db: Db, me: usize) -> machine::Machine {
        let m = machine::Machine::open(db, None).await.expect("open");
        m.locks()
            .lock()
            .set_home((me, Arc::new(|slot| usize::from(slot >= 8192))));
        m
    }

    /// A slot move's driver as `txn::move_slots` sees two partitions: each request applied
    /// at once as the next entry of its partition's state machine (0 owns the slots below
    /// 8192, 1 the others), with the faults the test sets.
    struct Scripted {
        parts: Vec<tokio::sync::Mutex<(machine::Machine, u64)>>,
        locks: Vec<prepared::Shared>,
        /// `MoveIn` applies, and its answer is lost.
        lose_move_in: std::sync::atomic::AtomicBool,
        /// Every `Resolve` fails (its partition unreachable).
        deaf: std::sync::atomic::AtomicBool,
        clock: std::sync::atomic::AtomicU64,
        seq: std::sync::atomic::AtomicU64,
    }

    impl txn::Net for Scripted {
        async fn call(
            &self,
            p: usize,
            request: Request,
            _: tokio::time::Instant,
        ) -> Result<Response, RunError> {
            use std::sync::atomic::Ordering::SeqCst;
            if self.deaf.load(SeqCst) && matches!(request.op, Op::Resolve { .. }) {
                return Err(RunError::Failed(format!("CLUSTERDOWN partition {p}")));
            }
            let lost = self.lose_move_in.load(SeqCst) && matches!(request.op, Op::MoveIn { .. });
            let mut part = self.parts[p].lock().await;
            let (machine, index) = &mut *part;
            *index += 1;
            let entry = Entry {
                log_id: LogId::new(CommittedLeaderId::new(1, 0), *index),
                payload: EntryPayload::Normal(request),
            };
            let response = machine.apply(vec![entry]).await.expect("apply").remove(0);
            if lost {
                return Err(RunError::Unknown(format!("TRYAGAIN partition {p} lost it")));
            }
            Ok(response)
        }

        async fn read(
            &self,
            p: usize,
            request: Request,
            _: tokio::time::Instant,
        ) -> Result<Response, RunError> {
            let Op::ReadDecide { txn, deadline_ms } = request.op else {
                unreachable!("the driver reads only a transaction's coordinator part");
            };
            let part = self.parts[p].lock().await;
            Ok(read_decided(
                part.0.db(),
                &self.locks[p],
                &request,
                txn,
                deadline_ms,
            ))
        }

        fn leads(&self, _: usize) -> bool {
            true
        }

        fn led(&self) -> Vec<(usize, prepared::Shared)> {
            self.locks.iter().cloned().enumerate().collect()
        }

        fn timeout(&self) -> Duration {
            Duration::from_millis(100)
        }

        fn now_ms(&self) -> u64 {
            self.clock.load(std::sync::atomic::Ordering::SeqCst)
        }

        fn next_txn(&self) -> TxnId {
            TxnId {
                node: 0,
                incarnation: 1,
                seq: self.seq.fetch_add(1, std::sync::atomic::Ordering::SeqCst),
            }
        }

        fn learn(&self, _: &[(u16, usize)]) {}

        fn owner(&self, slot: u16) -> usize {
            usize::from(slot >= 8192)
        }
    }

    /// A group of writes (`Op::Many`) commits each write on its own. A crash between two of
    /// them leaves the applied marker before the group, with the writes that were in
    /// recorded, so the group applies again past them: each `INCR` once. The marker used to
    /// move to the group with its first write, and the replica lost the rest of it.
    #[tokio::test]
    async fn a_group_of_writes_cut_short_by_a_crash_applies_the_rest_once() {
        let db = memory_db();
        let incr = |key: &str| {
            let Entry {
                payload: EntryPayload::Normal(r),
                ..
            } = entry(0, &[&["INCR", key]])
            else {
                unreachable!()
            };
            r
        };
        let group = |index: u64| Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 0), index),
            payload: EntryPayload::Normal(Request {
                op: Op::Many(vec![incr("a"), incr("b"), incr("c")]),
                ..match entry(index, &[]).payload {
                    EntryPayload::Normal(r) => r,
                    _ => unreachable!(),
                }
            }),
        };
        let mut m = machine::Machine::open(db.clone(), None)
            .await
            .expect("open");
        m.apply(vec![entry(1, &[&["SET", "x", "1"]])])
            .await
            .expect("apply");
        machine::CRASH_IN_GROUP_AFTER.with(|c| c.set(Some(1)));
        assert!(
            m.apply(vec![group(2)]).await.is_err(),
            "stopped after one write"
        );
        machine::CRASH_IN_GROUP_AFTER.with(|c| c.set(None));
        drop(m);

        // The restart: the data as the crash left it, the marker still at entry 1.
        let mut m = machine::Machine::open(db.clone(), None)
            .await
            .expect("reopen");
        let (applied, _) = m.applied_state().await.expect("applied");
        assert_eq!(
            applied.map(|l| l.index),
            Some(1),
            "the group is not applied yet"
        );
        m.apply(vec![group(2)]).await.expect("apply again");
        let (applied, _) = m.applied_state().await.expect("applied");
        assert_eq!(applied.map(|l| l.index), Some(2));
        let snap = db.snapshot().expect("snapshot");
        for key in ["a", "b", "c"] {
            assert_eq!(
                snap.get(key.as_bytes()).expect("get").as_deref(),
                Some(b"1".as_slice()),
                "{key} incremented once"
            );
        }
        // A whole group leaves no record of its progress behind.
        drop(snap);
        m.apply(vec![group(3)]).await.expect("apply");
        let snap = db.snapshot().expect("snapshot");
        assert_eq!(
            snap.get(b"a").expect("get").as_deref(),
            Some(b"2".as_slice())
        );
        assert!(
            snap.range::<[u8]>(..)
                .all(|(k, _)| !k.starts_with(&[0xFF, b'r', b'g'])),
            "no group record left"
        );
    }

    /// Two partitions' state machines on fresh databases (0 owns the slots below 8192, 1 the
    /// others) behind a [`Scripted`] driver's view, its clock at `now`; and the databases.
    async fn scripted(now: u64, lose_move_in: bool, deaf: bool) -> (Arc<Scripted>, [Db; 2]) {
        let dbs = [memory_db(), memory_db()];
        let (mut parts, mut locks) = (Vec::new(), Vec::new());
        for (me, db) in dbs.iter().enumerate() {
            let m = homed(db.clone(), me).await;
            locks.push(m.locks());
            parts.push(tokio::sync::Mutex::new((m, 0)));
        }
        let net = Arc::new(Scripted {
            parts,
            locks,
            lose_move_in: lose_move_in.into(),
            deaf: deaf.into(),
            clock: now.into(),
            seq: 1.into(),
        });
        (net, dbs)
    }

    /// A request of `op` with `commands`, stamped `now_ms`.
    fn scripted_request(now_ms: u64, commands: Vec<Vec<Vec<u8>>>, op: Op) -> Request {
        Request {
            commands,
            exec: false,
            now_ms,
            op,
            ..match entry(0, &[]).payload {
                EntryPayload::Normal(r) => r,
                _ => unreachable!(),
            }
        }
    }

    /// A transaction across partitions that only reads ends with a read of the coordinator
    /// partition's part at its leader, no entry in its log: the driver answers it, the other
    /// participants let go, and the coordinator keeps no decision. The read is refused once
    /// the coordinator partition decided the transaction (a participant's `Resolve`, after
    /// which that participant lets go of its keys, so what it read may change) or its clock
    /// passed the deadline (when that decision's record may be gone).
    #[tokio::test]
    async fn a_read_only_transaction_reads_its_coordinator_unless_a_participant_let_go() {
        let now = 1_700_000_000_000;
        let (net, _) = scripted(now, false, false).await;
        let key_of = |p: usize| {
            (0..)
                .map(|i| format!("k{i}"))
                .find(|k| usize::from(keel_cluster::key_slot(k.as_bytes()).0 >= 8192) == p)
                .expect("a key of each partition")
        };
        let (a, b) = (key_of(0), key_of(1));
        let request = scripted_request;
        let cmd = |args: &[&str]| vec![args.iter().map(|a| a.as_bytes().to_vec()).collect()];
        let t0 = tokio::time::Instant::now();
        for (p, key, value) in [(0, &a, "x"), (1, &b, "y")] {
            let set = request(now, cmd(&["SET", key, value]), Op::Run);
            let r = txn::Net::call(&*net, p, set, t0).await.expect("set");
            assert_eq!(r.status, Status::Done);
        }

        // Through the driver: each partition's reply, no decision kept, nothing left held.
        let work: txn::Work = vec![(0, cmd(&["GET", &a])), (1, cmd(&["GET", &b]))];
        let limits = txn::Limits {
            resp3: false,
            bulk_bytes_max: 512 << 20,
            reply_bytes_max: 1 << 30,
        };
        let replies = txn::run_across(&net, work, limits).await.expect("commits");
        assert_eq!(
            replies,
            [vec![b"$1\r\nx\r\n".to_vec()], vec![b"$1\r\ny\r\n".to_vec()]]
        );
        assert!(
            net.locks[0].lock().decided().is_empty(),
            "no decision entry"
        );
        let released = async {
            while !net.locks[1].lock().prepared().is_empty() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(5), released)
            .await
            .expect("the participant lets go");

        // By hand: partition 1 prepared, partition 0 coordinates.
        let txn = TxnId {
            node: 9,
            incarnation: 1,
            seq: 1,
        };
        let deadline_ms = now + 6_000;
        let prepare = Op::Prepare {
            txn,
            coordinator: 0,
            deadline_ms,
        };
        let vote = txn::Net::call(&*net, 1, request(now, cmd(&["GET", &b]), prepare), t0)
            .await
            .expect("prepare");
        assert_eq!(vote.status, Status::Done);
        let read = || request(now, cmd(&["GET", &a]), Op::ReadDecide { txn, deadline_ms });
        let r = txn::Net::read(&*net, 0, read(), t0).await.expect("read");
        assert_eq!(r.status, Status::Done);
        assert_eq!(r.replies, [b"$1\r\nx\r\n".to_vec()]);
        // Partition 1's resolver asks: no decision, so partition 0 decides abort, and
        // partition 1 may let go of `b` now. The read is refused from then on.
        let resolve = Op::Resolve { txn, deadline_ms };
        let r = txn::Net::call(&*net, 0, request(now + 1_500, Vec::new(), resolve), t0)
            .await
            .expect("resolve");
        assert_eq!(r.status, Status::Aborted);
        let r = txn::Net::read(&*net, 0, read(), t0).await.expect("read");
        assert_eq!(
            r.status,
            Status::Aborted,
            "read after the coordinator decided"
        );

        // Another transaction, whose deadline partition 0's clock has passed (an entry of a
        // later transaction applied there): refused, though no record of it is there.
        let late = TxnId { seq: 2, ..txn };
        let other = Op::Resolve {
            txn: TxnId { seq: 3, ..txn },
            deadline_ms: now + 60_000,
        };
        txn::Net::call(&*net, 0, request(now + 10_000, Vec::new(), other), t0)
            .await
            .expect("a later entry");
        let r = txn::Net::read(
            &*net,
            0,
            request(
                now,
                cmd(&["GET", &a]),
                Op::ReadDecide {
                    txn: late,
                    deadline_ms,
                },
            ),
            t0,
        )
        .await
        .expect("read");
        assert_eq!(r.status, Status::Aborted, "read past the deadline");
        // A failing command fails the read, as it would fail a prepare.
        let r = txn::Net::read(
            &*net,
            0,
            request(
                now,
                cmd(&["LLEN", &a]),
                Op::ReadDecide {
                    txn: TxnId { seq: 4, ..txn },
                    deadline_ms: now + 60_000,
                },
            ),
            t0,
        )
        .await
        .expect("read");
        assert_eq!(r.status, Status::Failed);
        assert!(
            String::from_utf8_lossy(&r.reply).starts_with("WRONGTYPE"),
            "{r:?}"
        );
    }

    /// A move whose `MoveIn` applied but whose answer was lost, and whose destination then
    /// cannot be asked: the driver leaves the source prepared (an abort there would leave the
    /// slot owned by both partitions: the replicated simulation found this), and the source's
    /// resolver, once it can ask, commits the move.
    #[tokio::test]
    async fn a_move_whose_outcome_is_unknown_is_settled_by_the_source_not_aborted() {
        let now = 1_700_000_000_000;
        let (net, [src_db, dst_db]) = scripted(now, true, true).await;
        let key = (0..)
            .map(|i| format!("k{i}"))
            .find(|k| keel_cluster::key_slot(k.as_bytes()).0 < 8192)
            .expect("a key of partition 0");
        let slot = keel_cluster::key_slot(key.as_bytes()).0;
        let fill = scripted_request(
            now,
            vec![vec![
                b"SET".to_vec(),
                key.clone().into_bytes(),
                b"v".to_vec(),
            ]],
            Op::Run,
        );
        let r = txn::Net::call(&*net, 0, fill, tokio::time::Instant::now()).await;
        assert_eq!(r.expect("set").status, Status::Done);

        let moved = txn::move_slots(&net, &[slot], 1).await;
        let text = moved.expect_err("the outcome is unknown");
        assert!(
            text.contains("did not say whether it took the slots"),
            "{text}"
        );
        assert_eq!(
            net.locks[1].lock().owner(slot),
            Some(1),
            "the destination took it"
        );
        assert_eq!(
            net.locks[0].lock().prepared().len(),
            1,
            "the source is still prepared, not aborted"
        );
        assert!(
            read(&src_db, &net.locks[0], &key).is_none(),
            "the source serves nothing of the slot meanwhile"
        );

        // Reachable again, and past the time a driver has: the source's resolver asks.
        net.deaf.store(false, std::sync::atomic::Ordering::SeqCst);
        net.clock
            .store(now + 60_000, std::sync::atomic::Ordering::SeqCst);
        txn::resolve_once(&net).await;
        assert!(net.locks[0].lock().prepared().is_empty(), "resolved");
        assert_eq!(
            net.locks[0].lock().owner(slot),
            Some(1),
            "the source gave it"
        );
        assert_eq!(
            read(&dst_db, &net.locks[1], &key).as_deref(),
            Some(&b"$1\r\nv\r\n"[..])
        );
    }

    /// The generations of the collections in `db` (its size records).
    fn generations(db: &Db) -> Vec<u64> {
        let prefix = crate::keyspace::size_key(0).to_vec();
        let snap = db.snapshot().expect("snapshot");
        snap.range::<[u8]>(..)
            .filter_map(|(k, _)| {
                let g = k.strip_prefix(&prefix[..2])?;
                Some(u64::from_be_bytes(g.try_into().ok()?))
            })
            .collect()
    }

    /// Partitions that apply commands at the same log ids create their collections under
    /// different generations, alone or in a group (whose requests draw from seeds of their
    /// own): a collection keeps its generation when its slot moves, so equal ones would mix
    /// two keys' records at the destination.
    #[tokio::test]
    async fn partitions_draw_different_generations_at_the_same_log_ids() {
        let elem = "e".repeat(crate::keyspace::packed::ITEM_BYTES_MAX + 1);
        let mut drawn = std::collections::BTreeSet::new();
        let parts = 4;
        for me in 0..parts {
            let db = memory_db();
            let mut m = machine::Machine::open(db.clone(), None)
                .await
                .expect("open");
            m.locks()
                .lock()
                .set_home((me, Arc::new(move |slot| usize::from(slot) % parts)));
            // This partition's own keys, so that none answers `Moved`.
            let keys: Vec<String> = (0..)
                .map(|i| format!("l{i}"))
                .filter(|k| usize::from(keel_cluster::key_slot(k.as_bytes()).0) % parts == me)
                .take(4)
                .collect();
            let rpush = |key: &str| {
                let EntryPayload::Normal(r) =
                    step(0, 1_700_000_000_000, &[&["RPUSH", key, &elem]], Op::Run).payload
                else {
                    unreachable!("a normal entry")
                };
                r
            };
            let group = keys[1..].iter().map(|k| rpush(k)).collect();
            let mut many = step(2, 1_700_000_000_000, &[], Op::Many(group));
            if let EntryPayload::Normal(r) = &mut many.payload {
                r.commands.clear();
            }
            let single = step(
                1,
                1_700_000_000_000,
                &[&["RPUSH", &keys[0], &elem]],
                Op::Run,
            );
            let r = m.apply(vec![single, many]).await.expect("apply");
            assert!(r.iter().all(|r| r.status == Status::Done), "{r:?}");
            let g = generations(&db);
            assert_eq!(g.len(), 4, "four spread lists");
            drawn.extend(g);
        }
        assert_eq!(
            drawn.len(),
            4 * parts,
            "a generation drawn twice: {drawn:x?}"
        );
    }

    /// A move that would bring a collection under a generation a collection of the
    /// destination has is refused, whole.
    #[tokio::test]
    async fn a_move_in_of_a_generation_the_destination_has_is_refused() {
        let db = memory_db();
        let mut dst = homed(db.clone(), 1).await;
        let elem = "e".repeat(crate::keyspace::packed::ITEM_BYTES_MAX + 1);
        let key = (0..)
            .map(|i| format!("l{i}"))
            .find(|k| keel_cluster::key_slot(k.as_bytes()).0 >= 8192)
            .expect("a key of partition 1");
        let now = 1_700_000_000_000;
        let r = dst
            .apply(vec![step(1, now, &[&["RPUSH", &key, &elem]], Op::Run)])
            .await
            .expect("apply");
        assert_eq!(r[0].status, Status::Done, "{r:?}");
        let g = generations(&db)[0];
        let before = contents(&db);
        let txn = TxnId {
            node: 0,
            incarnation: 1,
            seq: 1,
        };
        let into = Op::MoveIn {
            txn,
            slots: vec![100],
            from: 0,
            pairs: vec![(
                crate::keyspace::size_key(g).to_vec(),
                1i64.to_be_bytes().to_vec(),
            )],
            deadline_ms: now + 60_000,
        };
        let r = dst
            .apply(vec![step(2, now, &[], into)])
            .await
            .expect("apply");
        assert_eq!(r[0].status, Status::Failed, "{r:?}");
        assert!(
            String::from_utf8_lossy(&r[0].reply).contains("has the generation of a collection"),
            "{r:?}"
        );
        assert_eq!(dst.locks().lock().owner(100), Some(0), "the slot stays");
        assert_eq!(contents(&db), before, "the list is as it was");
    }

    fn read(db: &Db, locks: &prepared::Shared, key: &str) -> Option<Vec<u8>> {
        let request = Request {
            commands: vec![vec![b"GET".to_vec(), key.as_bytes().to_vec()]],
            exec: false,
            ..match entry(0, &[]).payload {
                EntryPayload::Normal(r) => r,
                _ => unreachable!(),
            }
        };
        read_here(db, locks, &request).ok()
    }

    /// What a connection's renewal of its watches (`conn.rs`, `renew_watches`) relies on: a
    /// `WATCH` of a key watched already keeps its version and moves its lapse on, so the key
    /// is still watched, unchanged, past its first lapse; a key not renewed is forgotten by
    /// the first `WATCH` entry after its lapse, and then counts as changed. A write after the
    /// renewal still changes the version the connection recorded.
    /// A write that leaves its transaction no room for the entry's own records (the applied
    /// marker, a kept answer) fails as a command past a limit does, and the partition
    /// applies on. (It failed the entry on every replica, which stopped the partition's Raft
    /// group, again at each restart: one client's `MSET` of 65 534 keys.)
    #[tokio::test]
    async fn a_write_that_leaves_no_room_for_the_entry_fails_alone() {
        let db = memory_db();
        let mut m = machine::Machine::open(db, None).await.expect("open");
        let t = 1_700_000_000_000;
        let mset = mset_of(0, keel::limits::TXN_WRITE_KEYS_MAX - 1);
        let mset: Vec<&str> = mset.iter().map(String::as_str).collect();
        let mut entry = step(1, t, &[&mset], Op::Run);
        if let EntryPayload::Normal(r) = &mut entry.payload {
            r.id = Some(TxnId {
                node: 1,
                incarnation: 2,
                seq: 3,
            });
            r.keep_ms = 1_000;
        }
        let r = m.apply(vec![entry]).await.expect("the entry applies");
        let reply = String::from_utf8_lossy(&r[0].reply);
        assert!(reply.starts_with("-ERR keel: limit exceeded"), "{reply}");
        assert_eq!(
            applies_on(&mut m, 2, t).await,
            b":1\r\n",
            "nothing of it was written"
        );
    }

    /// A prepare whose commands leave its commit no room for its records votes no, with
    /// the reason: its commit, after a yes vote, would have failed on every replica.
    #[tokio::test]
    async fn a_prepare_that_leaves_its_commit_no_room_is_refused() {
        let db = memory_db();
        let mut m = machine::Machine::open(db, None).await.expect("open");
        let t = 1_700_000_000_000;
        let mset = mset_of(0, keel::limits::TXN_WRITE_KEYS_MAX - 4);
        let mset: Vec<&str> = mset.iter().map(String::as_str).collect();
        let txn = TxnId {
            node: 1,
            incarnation: 2,
            seq: 3,
        };
        let prepare = step(
            1,
            t,
            &[&mset],
            Op::Prepare {
                txn,
                coordinator: 1,
                deadline_ms: t + 6_000,
            },
        );
        let r = m.apply(vec![prepare]).await.expect("the entry applies");
        assert_refused(&r[0], "leaves no room");
        assert_eq!(applies_on(&mut m, 2, t).await, b":1\r\n");
        assert_eq!(m.locks().lock().counts().0, 0, "nothing stays prepared");
    }

    /// `WATCH` entries stay within one transaction: an entry watches at most
    /// [`WATCH_ENTRY_KEYS_MAX`] keys (more is refused, not applied: `WATCH` of 65 536 keys
    /// failed its entry on every replica and stopped the partition's Raft group), and drops
    /// at most as many lapsed watches, the first in key order on every replica.
    #[tokio::test]
    async fn watch_entries_stay_within_one_transaction() {
        let db = memory_db();
        let mut m = machine::Machine::open(db, None).await.expect("open");
        let t = 1_700_000_000_000;
        let watch = |index: u64, now: u64, keys: std::ops::Range<usize>| {
            let names: Vec<String> = keys.map(|i| format!("w{i:06}")).collect();
            let mut exists = vec!["EXISTS"];
            exists.extend(names.iter().map(String::as_str));
            step(index, now, &[&exists], Op::Watch)
        };
        let r = m
            .apply(vec![watch(1, t, 0..WATCH_ENTRY_KEYS_MAX + 1)])
            .await
            .expect("the entry applies");
        assert_refused(&r[0], "at most 4096 keys");
        let watching = |m: &machine::Machine| m.locks().lock().counts().2;
        assert_eq!(watching(&m), 0);
        m.apply(vec![
            watch(2, t, 0..WATCH_ENTRY_KEYS_MAX),
            watch(3, t, WATCH_ENTRY_KEYS_MAX..WATCH_ENTRY_KEYS_MAX + 1000),
        ])
        .await
        .expect("apply");
        assert_eq!(watching(&m), WATCH_ENTRY_KEYS_MAX + 1000);
        // All lapsed: each later entry drops at most an entry's worth, and watches its own.
        let later = t + prepared::WATCH_LAPSE_MS + 1;
        m.apply(vec![watch(4, later, 900_000..900_001)])
            .await
            .expect("apply");
        assert_eq!(watching(&m), 1000 + 1, "the first 4096 in key order went");
        m.apply(vec![watch(5, later, 900_000..900_001)])
            .await
            .expect("apply");
        assert_eq!(watching(&m), 1, "then the rest");
    }

    /// A prepare whose record (its commands and replies, kept until the decision) is larger
    /// than a value may be votes no with the reason, and the partition applies on.
    #[tokio::test]
    async fn a_prepare_too_large_to_keep_is_refused() {
        let db = memory_db();
        let mut m = machine::Machine::open(db, None).await.expect("open");
        let t = 1_700_000_000_000;
        let big = "x".repeat(7 << 20);
        m.apply(vec![step(1, t, &[&["SET", "big", &big]], Op::Run)])
            .await
            .expect("apply");
        let prepare = step(
            2,
            t,
            &[&["GET", "big"], &["GET", "big"], &["GET", "big"]],
            Op::Prepare {
                txn: TxnId {
                    node: 1,
                    incarnation: 2,
                    seq: 3,
                },
                coordinator: 1,
                deadline_ms: t + 6_000,
            },
        );
        let r = m.apply(vec![prepare]).await.expect("the entry applies");
        assert_refused(&r[0], "keeps its commands and replies");
        assert_eq!(m.locks().lock().counts().0, 0, "nothing stays prepared");
        assert_eq!(applies_on(&mut m, 3, t).await, b":2\r\n");
    }

    /// `KEEL.REAP`, the entry a replicated partition's leader proposes in place of a reaper
    /// thread: it deletes keys past their deadline at the entry's time, and the members of
    /// deleted collections, the same on every replica, and a partition with nothing to reap
    /// has no more to do.
    #[tokio::test]
    async fn reap_entries_delete_expired_keys_and_dropped_collections_alike_everywhere() {
        let t = 1_700_000_000_000;
        let members: Vec<String> = (0..300).map(|i| format!("member-{i}")).collect();
        let mut sadd = vec!["SADD", "s"];
        sadd.extend(members.iter().map(String::as_str));
        let entries = || {
            vec![
                step(1, t, &[&sadd], Op::Run),
                step(2, t, &[&["SET", "ttl", "v", "PX", "10"]], Op::Run),
                step(3, t, &[&["SET", "kept", "v"]], Op::Run),
                step(4, t, &[&["DEL", "s"]], Op::Run),
                step(5, t + 1_000, &[&["KEEL.REAP"]], Op::Run),
                step(6, t + 1_000, &[&["KEEL.REAP"]], Op::Run),
            ]
        };
        let mut replicas = Vec::new();
        for _ in 0..2 {
            let db = memory_db();
            let mut m = machine::Machine::open(db.clone(), None)
                .await
                .expect("open");
            let before_reap = {
                let mut e = entries();
                let reaps = e.split_off(4);
                m.apply(e).await.expect("apply");
                let left = contents(&db).len();
                (left, reaps)
            };
            assert!(
                crate::reaper::has_work(&db, t + 1_000),
                "an expired key and a dropped set"
            );
            let r = m.apply(before_reap.1).await.expect("apply");
            assert_eq!(
                parse_reaped(&r[0].reply),
                Some((1, 300)),
                "the expired key and 300 members"
            );
            assert_eq!(parse_reaped(&r[1].reply), Some((0, 0)), "nothing left");
            assert!(!crate::reaper::has_work(&db, t + 1_000));
            assert!(before_reap.0 > 300);
            replicas.push(contents(&db));
        }
        assert_eq!(replicas[0], replicas[1], "every replica reaps the same");
        let keys: Vec<&[u8]> = replicas[0].iter().map(|(k, _)| k.as_slice()).collect();
        assert_eq!(keys, [&b"kept"[..]], "only the live key is left");
    }

    /// `KEEL.REAP` names no keys but deletes any that expired, so it waits while a prepared
    /// transaction holds keys here (its commit runs its commands on them again).
    #[tokio::test]
    async fn reaping_waits_for_prepared_transactions() {
        let db = memory_db();
        let mut m = machine::Machine::open(db, None).await.expect("open");
        let t = 1_700_000_000_000;
        let txn = TxnId {
            node: 1,
            incarnation: 2,
            seq: 3,
        };
        let r = m
            .apply(vec![
                step(1, t, &[&["SET", "ttl", "v", "PX", "10"]], Op::Run),
                step(
                    2,
                    t,
                    &[&["GET", "ttl"]],
                    Op::Prepare {
                        txn,
                        coordinator: 1,
                        deadline_ms: t + 6_000,
                    },
                ),
                step(3, t + 1_000, &[&["KEEL.REAP"]], Op::Run),
                step(
                    4,
                    t + 1_000,
                    &[],
                    Op::Abort {
                        txn,
                        deadline_ms: t + 6_000,
                    },
                ),
                step(5, t + 1_000, &[&["KEEL.REAP"]], Op::Run),
            ])
            .await
            .expect("apply");
        assert_eq!(r[1].status, Status::Done, "prepared");
        assert_eq!(r[2].status, Status::Busy, "held: not reaped");
        assert_eq!(
            parse_reaped(&r[4].reply),
            Some((1, 0)),
            "reaped once released"
        );
    }

    #[tokio::test]
    async fn a_renewed_watch_keeps_its_version_past_the_first_lapse() {
        let db = memory_db();
        let mut m = machine::Machine::open(db, None).await.expect("open");
        m.locks().lock().set_home((0, Arc::new(|_| 0)));
        let (t0, lapse) = (1_700_000_000_000, WATCH_LAPSE_MS);
        let after = t0 + lapse + 1_000;
        let answers = m
            .apply(vec![
                step(1, t0, &[&["EXISTS", "renewed"]], Op::Watch),
                step(2, t0, &[&["EXISTS", "forgotten"]], Op::Watch),
                step(3, t0 + lapse * 3 / 4, &[&["EXISTS", "renewed"]], Op::Watch),
                step(4, after, &[&["EXISTS", "other"]], Op::Watch),
            ])
            .await
            .expect("apply");
        let watched = |i: usize| -> Vec<Watched> {
            postcard::from_bytes(&answers[i].reply).expect("versions")
        };
        let (renewed, forgotten) = (watched(0), watched(1));
        assert_eq!(renewed[0].version, 1);
        assert_eq!(watched(2)[0].version, 1, "a renewal keeps the version");
        let locks = m.locks();
        assert!(
            !locks.lock().watch_changed(&renewed, after),
            "renewed: still watched"
        );
        assert!(
            locks.lock().watch_changed(&forgotten, after),
            "not renewed: lapsed"
        );
        m.apply(vec![step(5, after, &[&["SET", "renewed", "x"]], Op::Run)])
            .await
            .expect("apply");
        assert!(
            m.locks().lock().watch_changed(&renewed, after),
            "a write after the renewal changes the key"
        );
    }

    /// Slot moves, watches and flushes as the state machine applies them: two replicas fed
    /// the same entries agree (data, ownership, versions), a snapshot carries it all, a moved
    /// slot answers `Moved` and a moving one `Busy`, a write moves a watched key's version
    /// and a flush keeps the replication records.
    /// A slot move whose records would not fit one engine transaction is refused where it
    /// would land, and the partition applies on. (Sent, it failed its entry on every replica
    /// and stopped the partition's Raft group: a slot of 100 000 small keys, well under a log
    /// entry's 8 MiB. The driver now halves such a batch, and refuses a single slot that
    /// holds that much, as for size.)
    #[tokio::test]
    async fn a_move_of_more_records_than_one_transaction_writes_is_refused() {
        let db = memory_db();
        let mut m = homed(db, 1).await;
        let now = 1_700_000_000_000;
        let pairs: Vec<(Vec<u8>, Vec<u8>)> = (0..=prepared::MOVE_RECORDS_MAX)
            .map(|i| (format!("k{i}").into_bytes(), b"v".to_vec()))
            .collect();
        let txn = TxnId {
            node: 1,
            incarnation: 9,
            seq: 1,
        };
        let into = step(
            1,
            now,
            &[],
            Op::MoveIn {
                txn,
                slots: vec![100],
                from: 0,
                pairs,
                deadline_ms: now + 6_000,
            },
        );
        let r = m.apply(vec![into]).await.expect("the entry applies");
        assert_refused(&r[0], "engine records");
        assert_eq!(
            applies_on(&mut m, 2, now).await,
            b":1\r\n",
            "nothing of the move was written"
        );
    }

    /// Applies `KEEL.REAP` entries at the indexes of `at` until one finds nothing to do.
    async fn reap_all(m: &mut machine::Machine, at: std::ops::Range<u64>, now: u64) {
        for i in at {
            let r = m
                .apply(vec![step(i, now, &[&["KEEL.REAP"]], Op::Run)])
                .await
                .expect("reap");
            if r[0].reply == b"*2\r\n:0\r\n:0\r\n" {
                return;
            }
        }
        panic!("the reaper did not finish");
    }

    /// A slot whose collections are too large for one entry moves in chunks: the vote names
    /// the generations, `MoveChunk` reads them at the source (in order, resuming after the
    /// last key), `MoveStage` writes them at the destination where nothing sees them, and
    /// `MoveIn` makes them the partition's. A move that aborts after staging sends what it
    /// staged to the graveyard (a flush waits meanwhile, and a chunk that comes later is
    /// refused); the source sends the moved collections there once the move commits. Before,
    /// a slot holding one set of 70 000 members could not move at all.
    #[tokio::test]
    async fn a_slot_too_large_for_one_entry_moves_in_chunks() {
        let tag = (0..)
            .map(|i| format!("k{i}"))
            .find(|k| keel_cluster::key_slot(k.as_bytes()).0 == 100)
            .expect("a key in slot 100");
        let (set, hash, string) = (
            format!("{{{tag}}}set"),
            format!("{{{tag}}}hash"),
            format!("{{{tag}}}string"),
        );
        let members: Vec<String> = (0..70_000).map(|i| format!("member-{i}")).collect();
        let sadd = |range: std::ops::Range<usize>| -> Vec<String> {
            ["SADD".to_owned(), set.clone()]
                .into_iter()
                .chain(members[range].iter().cloned())
                .collect()
        };
        let (first, second) = (sadd(0..35_000), sadd(35_000..70_000));
        fn strs(v: &[String]) -> Vec<&str> {
            v.iter().map(String::as_str).collect()
        }
        let (now, deadline) = (1_700_000_000_000, 1_700_000_600_000);
        let txn = |seq| TxnId {
            node: 1,
            incarnation: 9,
            seq,
        };
        let mut index = 0;
        let mut next = || {
            index += 1;
            index
        };
        let (src_db, dst_db) = (memory_db(), memory_db());
        let mut src = machine::Machine::open(src_db.clone(), None)
            .await
            .expect("open");
        let mut dst = machine::Machine::open(dst_db.clone(), None)
            .await
            .expect("open");
        for (m, me) in [(&src, 0), (&dst, 1)] {
            m.locks()
                .lock()
                .set_home((me, Arc::new(|slot| usize::from(slot >= 8192))));
        }
        let fill = vec![
            step(next(), now, &[&strs(&first)], Op::Run),
            step(next(), now, &[&strs(&second)], Op::Run),
            step(
                next(),
                now,
                &[&["HSET", &hash, "f", "v", "g", "w"]],
                Op::Run,
            ),
            step(
                next(),
                now,
                &[&["SET", &string, "s", "EX", "1000"]],
                Op::Run,
            ),
        ];
        let r = src.apply(fill).await.expect("fill");
        assert!(r.iter().all(|r| r.status == Status::Done), "{r:?}");

        // Prepares `seq` at the source; its vote's records and generations.
        async fn move_out(
            src: &mut machine::Machine,
            index: u64,
            txn: TxnId,
            now: u64,
            deadline: u64,
        ) -> (Vec<(Vec<u8>, Vec<u8>)>, Vec<u64>) {
            let out = Op::MoveOut {
                txn,
                slots: vec![100],
                to: 1,
                deadline_ms: deadline,
            };
            let r = src
                .apply(vec![step(index, now, &[], out)])
                .await
                .expect("out");
            assert_eq!(r[0].status, Status::Done, "{r:?}");
            (
                postcard::from_bytes(&r[0].replies[0]).expect("records"),
                postcard::from_bytes(&r[0].replies[1]).expect("generations"),
            )
        }
        // The records of `generations` in chunks from the source, each as it arrives.
        async fn chunks(
            src: &mut machine::Machine,
            mut index: impl FnMut() -> u64,
            txn: TxnId,
            now: u64,
            generations: &[u64],
        ) -> Vec<Vec<(Vec<u8>, Vec<u8>)>> {
            let (mut out, mut after) = (Vec::new(), Vec::new());
            loop {
                let read = Op::MoveChunk {
                    txn,
                    generations: generations.to_vec(),
                    after,
                };
                let r = src
                    .apply(vec![step(index(), now, &[], read)])
                    .await
                    .expect("chunk");
                assert_eq!(r[0].status, Status::Done, "{r:?}");
                out.push(postcard::from_bytes(&r[0].replies[0]).expect("chunk"));
                after = r[0].replies[1].clone();
                if after.is_empty() {
                    return out;
                }
            }
        }

        // The first attempt stages a chunk and aborts.
        let (visible, generations) = move_out(&mut src, next(), txn(1), now, deadline).await;
        assert_eq!(
            generations.len(),
            1,
            "the set goes in chunks (the small hash is packed in its meta record)"
        );
        assert_eq!(
            visible.len(),
            4,
            "three keys and an expiry entry: {visible:?}"
        );
        let mut sent = chunks(&mut src, &mut next, txn(1), now, &generations).await;
        assert_eq!(
            sent.len(),
            70_001_usize.div_ceil(prepared::MOVE_CHUNK_RECORDS)
        );
        assert!(sent.iter().all(|c| c.len() <= prepared::MOVE_CHUNK_RECORDS));
        let all: Vec<_> = sent.concat();
        assert_eq!(all.len(), 70_000 + 1, "members and the size record");
        let mut keys: Vec<_> = all.iter().map(|(k, _)| k.clone()).collect();
        keys.dedup();
        assert_eq!(keys.len(), all.len(), "no record twice");
        let stage = |txn, pairs| Op::MoveStage {
            txn,
            slots: vec![100],
            pairs,
            deadline_ms: deadline,
        };
        let r = dst
            .apply(vec![
                step(1, now, &[], stage(txn(1), sent.remove(0))),
                step(2, now, &[&["FLUSHALL"]], Op::Run),
                step(3, now, &[&["DBSIZE"]], Op::Run),
                step(
                    4,
                    now,
                    &[],
                    Op::Abort {
                        txn: txn(1),
                        deadline_ms: deadline,
                    },
                ),
                step(5, now, &[], stage(txn(1), sent.remove(0))),
            ])
            .await
            .expect("apply");
        assert_eq!(r[0].status, Status::Done, "{r:?}");
        assert_eq!(r[1].status, Status::Busy, "a flush waits for a staged move");
        assert_eq!(r[2].reply, b":0\r\n", "staged records are no keys");
        assert_eq!(
            r[4].status,
            Status::Aborted,
            "a chunk after the abort is refused"
        );
        let abort = Op::Abort {
            txn: txn(1),
            deadline_ms: deadline,
        };
        src.apply(vec![step(next(), now, &[], abort)])
            .await
            .expect("abort");
        // What it staged goes once the reaper has swept it.
        reap_all(&mut dst, 6..200, now).await;
        assert_eq!(
            contents(&dst_db),
            Vec::new(),
            "the abort left nothing behind"
        );

        // The second attempt moves it all.
        let (visible, generations) = move_out(&mut src, next(), txn(2), now, deadline).await;
        let sent = chunks(&mut src, &mut next, txn(2), now, &generations).await;
        let mut entries: Vec<_> = sent
            .into_iter()
            .enumerate()
            .map(|(i, pairs)| step(200 + i as u64, now, &[], stage(txn(2), pairs)))
            .collect();
        entries.push(step(
            300,
            now,
            &[],
            Op::MoveIn {
                txn: txn(2),
                slots: vec![100],
                from: 0,
                pairs: visible,
                deadline_ms: deadline,
            },
        ));
        entries.push(step(301, now, &[&["SCARD", &set]], Op::Run));
        entries.push(step(
            302,
            now,
            &[&["SISMEMBER", &set, "member-69999"]],
            Op::Run,
        ));
        entries.push(step(303, now, &[&["HGETALL", &hash]], Op::Run));
        entries.push(step(304, now, &[&["GET", &string]], Op::Run));
        entries.push(step(305, now, &[&["DBSIZE"]], Op::Run));
        let r = dst.apply(entries).await.expect("move in");
        let n = r.len();
        assert!(r[..n - 6].iter().all(|r| r.status == Status::Done), "{r:?}");
        assert_eq!(r[n - 6].status, Status::Committed, "{:?}", r[n - 6]);
        assert_eq!(r[n - 5].reply, b":70000\r\n");
        assert_eq!(r[n - 4].reply, b":1\r\n");
        assert_eq!(
            r[n - 3].reply,
            b"*4\r\n$1\r\nf\r\n$1\r\nv\r\n$1\r\ng\r\n$1\r\nw\r\n"
        );
        assert_eq!(r[n - 2].reply, b"$1\r\ns\r\n");
        assert_eq!(r[n - 1].reply, b":3\r\n");
        assert_eq!(
            dst.locks().lock().staged(),
            Vec::new(),
            "nothing staged is left"
        );
        let commit = Op::Commit {
            txn: txn(2),
            deadline_ms: deadline,
        };
        let r = src
            .apply(vec![
                step(next(), now, &[], commit),
                step(next(), now, &[&["SCARD", &set]], Op::Run),
            ])
            .await
            .expect("commit");
        assert_eq!(r[0].status, Status::Done, "{r:?}");
        assert_eq!(r[1].status, Status::Moved, "the slot is the destination's");
        let from = next();
        reap_all(&mut src, from..from + 200, now).await;
        assert_eq!(
            contents(&src_db),
            Vec::new(),
            "the source reclaimed the moved records"
        );
    }

    #[tokio::test]
    async fn moves_watches_and_flushes_apply_identically_and_travel_in_snapshots() {
        let key_in = |slot: u16| -> String {
            (0..)
                .map(|i| format!("k{i}"))
                .find(|k| keel_cluster::key_slot(k.as_bytes()).0 == slot)
                .expect("a key in every slot")
        };
        let (moving, staying) = (key_in(100), key_in(200));
        let txn = |seq| TxnId {
            node: 1,
            incarnation: 9,
            seq,
        };
        let (now, deadline) = (1_700_000_000_000, 1_700_000_006_000);
        let mut machines = Vec::new();
        for _ in 0..2 {
            let db = memory_db();
            let m = machine::Machine::open(db.clone(), None)
                .await
                .expect("open");
            // Partition 0 of two: slots below 8192 are its own by the config.
            m.locks()
                .lock()
                .set_home((0, Arc::new(|slot| usize::from(slot >= 8192))));
            machines.push((db, m));
        }
        let entries = || {
            vec![
                step(
                    1,
                    now,
                    &[&["SET", &moving, "a"], &["SET", &staying, "b"]],
                    Op::Run,
                ),
                step(2, now, &[&["EXISTS", &staying]], Op::Watch),
                step(3, now, &[&["SET", &staying, "c"]], Op::Run),
                step(
                    4,
                    now,
                    &[],
                    Op::MoveOut {
                        txn: txn(1),
                        slots: vec![100],
                        to: 1,
                        deadline_ms: deadline,
                    },
                ),
                step(5, now, &[&["GET", &moving]], Op::Run),
                step(
                    6,
                    now,
                    &[],
                    Op::Commit {
                        txn: txn(1),
                        deadline_ms: deadline,
                    },
                ),
                step(7, now, &[&["GET", &moving]], Op::Run),
                step(8, now, &[&["FLUSHALL"]], Op::Run),
                step(9, now, &[&["GET", &staying]], Op::Run),
            ]
        };
        let mut answers = Vec::new();
        for (_, m) in &mut machines {
            answers.push(m.apply(entries()).await.expect("apply"));
        }
        assert_eq!(answers[0], answers[1], "the same answers on both replicas");
        let r = &answers[0];
        let watched: Vec<Watched> = postcard::from_bytes(&r[1].reply).expect("versions");
        assert_eq!(
            watched[0].version, 2,
            "a key starts at the WATCH entry's index"
        );
        let out: Vec<(Vec<u8>, Vec<u8>)> = postcard::from_bytes(&r[3].replies[0]).expect("data");
        assert!(
            out.iter().any(|(_, v)| v == b"a"),
            "the moving slot's record goes with the vote: {out:?}"
        );
        assert_eq!(r[4].status, Status::Busy, "a moving slot waits");
        assert_eq!(r[6].status, Status::Moved, "a moved slot redirects");
        let moved: Vec<(u16, usize)> = postcard::from_bytes(&r[6].reply).expect("moved");
        assert_eq!(moved, vec![(100, 1)]);
        assert_eq!(r[8].reply, b"$-1\r\n", "flushed");
        {
            let locks = machines[0].1.locks();
            let locks = locks.lock();
            let (prepared, decided, watching, moved) = locks.counts();
            assert_eq!((prepared, decided, watching, moved), (0, 0, 1, 1));
            assert!(
                locks.watch_changed(&watched, now),
                "entry 3 moved the version"
            );
        }
        assert_eq!(
            contents(&machines[0].0),
            contents(&machines[1].0),
            "identical replicas"
        );

        // A third replica from a snapshot: the same data, ownership and versions.
        let snapshot = machines[0]
            .1
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .expect("snapshot");
        let db = memory_db();
        let mut copy = homed(db.clone(), 0).await;
        copy.install_snapshot(&snapshot.meta, snapshot.snapshot)
            .await
            .expect("install");
        assert_eq!(contents(&db), contents(&machines[0].0));
        assert_eq!(copy.locks().lock().counts(), (0, 0, 1, 1));
        let again = copy
            .apply(vec![step(10, now, &[&["GET", &moving]], Op::Run)])
            .await
            .expect("apply");
        assert_eq!(
            again[0].status,
            Status::Moved,
            "ownership came with the snapshot"
        );
    }

    /// A copy of a decision that arrives after the decision was forgotten (were one held back
    /// by the network) is refused and runs nothing: the coordinator's commands ran once.
    /// (Without `Forget`'s finished record, the copy found no decision, ran them again and
    /// decided anew.)
    #[tokio::test]
    async fn a_decision_that_comes_again_after_its_forget_runs_nothing() {
        let db = memory_db();
        let mut m = machine::Machine::open(db, None).await.expect("open");
        let txn = TxnId {
            node: 1,
            incarnation: 3,
            seq: 9,
        };
        let (now, deadline) = (1_700_000_000_000, 1_700_000_006_000);
        let decide = Op::Decide {
            txn,
            participants: vec![1],
            deadline_ms: deadline,
        };
        let r = m
            .apply(vec![
                step(1, now, &[&["INCR", "w"]], decide.clone()),
                step(2, now + 1, &[], Op::Forget { txn }),
                step(3, now + 2, &[&["INCR", "w"]], decide.clone()),
                step(4, now + 3, &[&["GET", "w"]], Op::Run),
                // Past the deadline the finished record goes, and the clock refuses it.
                step(5, deadline + 1, &[&["INCR", "w"]], decide),
                step(6, deadline + 2, &[&["GET", "w"]], Op::Run),
            ])
            .await
            .expect("apply");
        assert_eq!(r[0].status, Status::Committed);
        assert_eq!(r[2].status, Status::Aborted, "{:?}", r[2]);
        assert_eq!(r[3].reply, b"$1\r\n1\r\n", "the commands ran once");
        assert_eq!(r[4].status, Status::Aborted);
        assert_eq!(r[5].reply, b"$1\r\n1\r\n");
        assert!(m.locks().lock().decided().is_empty());
    }

    /// The state machine's side of transactions across partitions: a prepare locks what it
    /// touches and keeps its effect out of the data; conflicting entries and reads are
    /// refused until the decision; a commit installs exactly what the prepare computed;
    /// the lock table comes back from a snapshot; the coordinator's decision answers
    /// `Resolve`; and past the deadline nothing prepares or decides.
    #[tokio::test]
    async fn prepared_transactions_lock_until_decided_and_travel_in_snapshots() {
        let t1 = TxnId {
            node: 0,
            incarnation: 7,
            seq: 1,
        };
        let (t2, t3, t4) = (
            TxnId { seq: 2, ..t1 },
            TxnId { seq: 3, ..t1 },
            TxnId { seq: 4, ..t1 },
        );
        let (now, deadline) = (1_700_000_000_000, 1_700_000_006_000);
        let prepare = |txn| Op::Prepare {
            txn,
            coordinator: 2,
            deadline_ms: deadline,
        };
        let db = memory_db();
        let mut m = machine::Machine::open(db.clone(), None)
            .await
            .expect("open");
        let locks = m.locks();
        let r = m
            .apply(vec![
                step(1, now, &[&["SET", "x", "1"]], Op::Run),
                step(
                    2,
                    now,
                    &[&["INCR", "x"], &["SADD", "s", "m"], &["GET", "r"]],
                    prepare(t1),
                ),
                step(3, now, &[&["GET", "x"]], Op::Run),
                step(4, now, &[&["SET", "z", "1"]], Op::Run),
                step(5, now, &[&["GET", "s"]], prepare(t2)),
                // Reading a key t1 only reads is no conflict; writing it is.
                step(6, now, &[&["GET", "r"]], Op::Run),
                step(7, now, &[&["SET", "r", "v"]], Op::Run),
            ])
            .await
            .expect("apply");
        assert_eq!(r[1].status, Status::Done, "t1 prepared");
        assert_eq!(
            r[1].replies,
            vec![b":2\r\n".to_vec(), b":1\r\n".to_vec(), b"$-1\r\n".to_vec()]
        );
        assert_eq!(r[2].status, Status::Busy, "a read of a key t1 writes waits");
        assert_eq!(r[3].status, Status::Done);
        assert_eq!(
            r[4].status,
            Status::Busy,
            "a prepare that reads t1's write is refused"
        );
        assert_eq!(r[5].reply, b"$-1\r\n");
        assert_eq!(r[6].status, Status::Busy, "a write of a key t1 read waits");
        assert_eq!(read(&db, &locks, "x"), None, "reads wait for the decision");
        assert_eq!(read(&db, &locks, "z"), Some(b"$1\r\n1\r\n".to_vec()));

        // A replica that catches up from a snapshot holds the same locks.
        let snapshot = m
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .expect("snapshot");
        let other = memory_db();
        let mut copy = machine::Machine::open(other.clone(), None)
            .await
            .expect("open");
        copy.install_snapshot(&snapshot.meta, snapshot.snapshot)
            .await
            .expect("install");
        assert_eq!(
            read(&other, &copy.locks(), "x"),
            None,
            "locked on the copy too"
        );

        let commit = Op::Commit {
            txn: t1,
            deadline_ms: deadline,
        };
        for machine in [&mut m, &mut copy] {
            let r = machine
                .apply(vec![
                    step(8, now + 5, &[], commit.clone()),
                    step(9, now + 5, &[&["GET", "x"]], Op::Run),
                    // A late duplicate of the prepare is refused, not run again.
                    step(10, now + 5, &[&["INCR", "x"]], prepare(t1)),
                    step(11, now + 5, &[&["GET", "x"]], Op::Run),
                ])
                .await
                .expect("apply");
            assert_eq!(r[1].reply, b"$1\r\n2\r\n", "installed as prepared");
            assert_eq!(r[2].status, Status::Aborted);
            assert_eq!(r[3].reply, b"$1\r\n2\r\n");
        }
        assert_eq!(contents(&db), contents(&other), "replicas agree");
        assert_eq!(read(&db, &locks, "x"), Some(b"$1\r\n2\r\n".to_vec()));

        // The coordinator's side.
        let decide = |txn| Op::Decide {
            txn,
            participants: vec![0],
            deadline_ms: deadline,
        };
        let resolve = |txn| Op::Resolve {
            txn,
            deadline_ms: deadline,
        };
        let r = m
            .apply(vec![
                step(12, now, &[&["SET", "w", "1"], &["INCR", "w"]], decide(t3)),
                step(13, now, &[], resolve(t3)),
                step(14, now, &[], resolve(t4)),
                step(15, now, &[], Op::Forget { txn: t3 }),
                // Past the deadline: no decision can be made, and none is kept.
                step(16, deadline + 1, &[], resolve(t3)),
                step(17, now, &[], resolve(t4)),
                step(18, now, &[&["SET", "w", "9"]], decide(t4)),
                step(19, now, &[&["GET", "w"]], Op::Run),
            ])
            .await
            .expect("apply");
        assert_eq!(r[0].status, Status::Committed);
        assert_eq!(r[0].replies, vec![b"+OK\r\n".to_vec(), b":2\r\n".to_vec()]);
        assert_eq!(r[1].status, Status::Committed);
        assert_eq!(r[1].replies, r[0].replies, "a lost answer is recovered");
        assert_eq!(
            r[2].status,
            Status::Aborted,
            "asked before any decision, t4 is decided abort"
        );
        assert_eq!(r[4].status, Status::Aborted);
        assert_eq!(
            r[5].status,
            Status::Aborted,
            "the partition's clock does not go back"
        );
        assert_eq!(r[6].status, Status::Aborted);
        assert_eq!(r[7].reply, b"$1\r\n2\r\n");
        assert!(locks.lock().decided().is_empty());
        assert!(locks.lock().prepared().is_empty());
    }

    fn contents(db: &Db) -> Vec<(Vec<u8>, Vec<u8>)> {
        let snap = db.snapshot().expect("snapshot");
        snap.range::<[u8]>(..)
            .filter(|(k, _)| !k.starts_with(&[0xFF, b'r']))
            .collect()
    }

    fn history() -> Vec<Entry<Tc>> {
        vec![
            entry(1, &[&["SADD", "s", "a", "b", "c", "d", "e", "f", "g", "h"]]),
            entry(2, &[&["SET", "t", "v", "PX", "5"]]),
            entry(3, &[&["SPOP", "s", "3"], &["INCR", "n"]]),
            entry(4, &[&["HSET", "h", "f", "1"], &["RPUSH", "l", "x", "y"]]),
            // Past the key's deadline at this entry's time: it expires here, on every replica.
            entry(10, &[&["APPEND", "t", "w"]]),
            entry(11, &[&["SRANDMEMBER", "s"], &["ZADD", "z", "1", "m"]]),
            // Fails: rolls back, replies the error.
            entry(12, &[&["INCR", "h"]]),
        ]
    }

    /// The log is cut only behind the snapshot file: openraft purges a follower's log as soon
    /// as it accepts a snapshot, before the state machine has written it, and a crash in
    /// between used to leave a log cut past the snapshot on disk, on which openraft refuses to
    /// start (found by `replica::sim`).
    #[tokio::test(start_paused = true)]
    async fn the_log_is_cut_only_behind_the_snapshot_file() {
        use openraft::storage::{RaftLogStorage, RaftSnapshotBuilder};
        let dir = tempfile::tempdir().expect("temp dir");
        let mut follower = machine::Machine::open(memory_db(), Some(dir.path().to_path_buf()))
            .await
            .expect("open");
        let mut log = log::LogStore::open(memory_db(), keel::Durability::None)
            .purge_behind(follower.durable());
        // The leader's snapshot starts to arrive.
        let received = follower.begin_receiving_snapshot().await.expect("begin");
        let entries: Vec<Entry<Tc>> = (1..=10).map(|i| entry(i, &[&["SET", "k", "v"]])).collect();
        let upto = LogId::new(CommittedLeaderId::new(1, 0), 6);
        let waited = tokio::time::timeout(Duration::from_secs(60), log.purge(upto)).await;
        assert!(waited.is_err(), "a purge past the snapshot file waits");
        assert_eq!(
            log.get_log_state().await.expect("state").last_purged_log_id,
            None
        );

        let mut leader = machine::Machine::open(memory_db(), None)
            .await
            .expect("open");
        leader.apply(entries[..6].to_vec()).await.expect("apply");
        let snapshot = leader
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .expect("snapshot");
        drop(received);
        follower
            .install_snapshot(&snapshot.meta, snapshot.snapshot)
            .await
            .expect("install");
        tokio::time::timeout(Duration::from_secs(60), log.purge(upto))
            .await
            .expect("the purge goes ahead once the file covers it")
            .expect("purge");
        assert_eq!(
            log.get_log_state().await.expect("state").last_purged_log_id,
            Some(upto)
        );
        // What the file covers survives a restart.
        let again = machine::Machine::open(memory_db(), Some(dir.path().to_path_buf()))
            .await
            .expect("open");
        assert!(again.durable().covers(6));
        // With no snapshot arriving, a purge does not wait (openraft's clean-up at start).
        let mut log = log.purge_behind(again.durable());
        let upto = LogId::new(CommittedLeaderId::new(1, 0), 8);
        tokio::time::timeout(Duration::from_secs(1), log.purge(upto))
            .await
            .expect("no wait")
            .expect("purge");
    }

    /// A leader finishing a joint configuration an earlier leader began, that the newer half
    /// lacks, moves it to a target that lacks it too only through that newer half alone: the
    /// two steps through `[new, target]` would have it append a membership while its
    /// effective one no longer counts it (openraft's debug assertion `Only leader is allowed
    /// to call update_effective_membership()`, seen in `sim::member`).
    #[test]
    fn a_leader_leaving_a_joint_membership_only_finishes_it() {
        let set = |ids: &[u64]| {
            ids.iter()
                .copied()
                .collect::<std::collections::BTreeSet<u64>>()
        };
        let joint = openraft::Membership::<u64, BasicNode>::new(
            vec![set(&[1, 2, 4]), set(&[2, 3, 4])],
            None,
        );
        // Leader 1 is in the old half only.
        assert_eq!(next_voters(&joint, 1, &set(&[0, 2, 3])), set(&[2, 3, 4]));
        // A target with it, or the newer half itself: straight there.
        assert_eq!(next_voters(&joint, 1, &set(&[1, 2, 3])), set(&[1, 2, 3]));
        assert_eq!(next_voters(&joint, 1, &set(&[2, 3, 4])), set(&[2, 3, 4]));
        assert_eq!(next_voters(&joint, 1, &set(&[1, 2, 4])), set(&[1, 2, 4]));
        // A leader in the newer half, or a uniform membership: straight there.
        assert_eq!(next_voters(&joint, 2, &set(&[0, 2, 3])), set(&[0, 2, 3]));
        let uniform = openraft::Membership::<u64, BasicNode>::new(vec![set(&[1, 2, 4])], None);
        assert_eq!(next_voters(&uniform, 1, &set(&[0, 2, 3])), set(&[0, 2, 3]));
    }

    /// A single-node group on `data` and `log_db` (node 1), with a snapshot directory.
    async fn one_node(data: Db, log_db: Db, dir: &std::path::Path) -> Raft {
        let config = timeouts();
        let machine = machine::Machine::open(data, Some(dir.to_path_buf()))
            .await
            .expect("open");
        let log =
            log::LogStore::open(log_db, keel::Durability::Sync).purge_behind(machine.durable());
        let network = net::Network {
            shared: std::sync::Weak::new(),
            part: 0,
            idle: Arc::default(),
        };
        let config = Arc::new(config.validate().expect("a valid config"));
        Raft::new(1, config, network, log, machine)
            .await
            .expect("raft")
    }

    /// A read-index round gives its term a lease of `READ_LEASE` from when it began.
    #[tokio::test]
    async fn rounds_give_their_term_a_lease() {
        let rounds = ReadRounds::default();
        assert!(!rounds.leased(3));
        rounds.extend(3, tokio::time::Instant::now());
        assert!(rounds.leased(3), "within the lease");
        assert!(!rounds.leased(4), "another term holds none");
        rounds.extend(3, tokio::time::Instant::now() - READ_LEASE);
        assert!(rounds.leased(3), "an older round does not shorten it");
        rounds.extend(4, tokio::time::Instant::now() - READ_LEASE);
        assert!(!rounds.leased(4), "run out");
    }

    /// A replica that left is emptied (`empty`): its data, log and snapshot go, its vote
    /// stays, and, opened again, it refuses its vote to a candidate whose log is older than
    /// the one it forgot (which its empty log alone would grant: the lost entries of
    /// `sim::member`'s `a_replica_that_left_is_emptied_safely`). An emptying a crash cut
    /// short is finished by the next open, and a second one keeps the floor.
    #[tokio::test(start_paused = true)]
    async fn an_emptied_replica_keeps_its_vote_and_refuses_older_logs() {
        use openraft::raft::VoteRequest;
        use openraft::storage::RaftLogStorage;
        use openraft::{ServerState, Vote};
        let (data, log_db) = (memory_db(), memory_db());
        let dir = tempfile::tempdir().expect("temp dir");
        let raft = one_node(data.clone(), log_db.clone(), dir.path()).await;
        let members: BTreeMap<u64, BasicNode> = [(1, BasicNode::new("n1"))].into();
        raft.initialize(members).await.expect("initialize");
        raft.wait(Some(Duration::from_secs(10)))
            .state(ServerState::Leader, "leads")
            .await
            .expect("leads");
        for i in 0..5 {
            let mut request = match entry(0, &[&["SET", &format!("k{i}"), "v"]]).payload {
                EntryPayload::Normal(r) => r,
                _ => unreachable!(),
            };
            request.now_ms = 1_700_000_000_000;
            raft.client_write(request).await.expect("write");
        }
        raft.trigger().snapshot().await.expect("snapshot");
        raft.wait(Some(Duration::from_secs(10)))
            .metrics(|m| m.snapshot.is_some(), "a snapshot")
            .await
            .expect("snapshot");
        let before = raft.metrics().borrow().clone();
        let last = LogId::new(
            CommittedLeaderId::new(before.current_term, 1),
            before.last_log_index.expect("a log"),
        );
        raft.shutdown().await.expect("shutdown");
        assert!(machine::holds_data(&data));
        let snapshot = dir.path().join(machine::SNAPSHOT_FILE);
        assert!(snapshot.exists());

        // Cut short after the data: the next open finishes it.
        log::begin_emptying(&log_db).expect("begin");
        machine::wipe(&data).expect("wipe");
        assert!(finish_emptying(&data, &log_db, Some(&snapshot)).expect("finish"));
        assert!(!finish_emptying(&data, &log_db, Some(&snapshot)).expect("nothing left"));
        assert!(!machine::holds_data(&data));
        assert!(!snapshot.exists());
        assert_eq!(log::floor(&log_db).expect("floor"), Some(last));
        // Emptied again: the floor stays.
        empty(&data, &log_db, Some(&snapshot)).expect("empty");
        let floor = log::floor(&log_db).expect("floor");
        assert_eq!(floor, Some(last));
        let mut store = log::LogStore::open(log_db.clone(), keel::Durability::Sync);
        let state = store.get_log_state().await.expect("state");
        assert_eq!((state.last_purged_log_id, state.last_log_id), (None, None));
        assert_eq!(store.read_committed().await.expect("committed"), None);
        assert_eq!(store.read_vote().await.expect("vote"), Some(before.vote));

        let raft = one_node(data, log_db, dir.path()).await;
        let m = raft
            .wait(Some(Duration::from_secs(10)))
            .metrics(|m| m.vote == before.vote, "the kept vote")
            .await
            .expect("the kept vote");
        assert_eq!((m.last_log_index, m.last_applied), (None, None));
        assert_eq!(m.state, ServerState::Learner);
        // Past the kept vote's leader lease.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let term = before.current_term;
        let older = Some(LogId::new(CommittedLeaderId::new(term, 0), last.index - 1));
        // A candidate of the kept vote's term: refused, the vote is taken.
        let stale = raft
            .vote(VoteRequest::new(Vote::new(term, 0), Some(last)))
            .await
            .expect("vote");
        assert!(!stale.vote_granted);
        // A newer term with an older log: refused by the floor, which openraft alone, on an
        // empty log, would grant.
        let request = VoteRequest::new(Vote::new(term + 1, 0), older);
        let refused = vote(&raft, floor, request.clone()).await.expect("vote");
        assert!(!refused.vote_granted);
        assert_eq!(refused.last_log_id, floor);
        assert_eq!(raft.metrics().borrow().vote, before.vote);
        let granted = vote(
            &raft,
            floor,
            VoteRequest::new(Vote::new(term + 1, 0), Some(last)),
        )
        .await
        .expect("vote");
        assert!(granted.vote_granted);
        let unguarded = raft
            .vote(VoteRequest::new(Vote::new(term + 2, 0), older))
            .await
            .expect("vote");
        assert!(
            unguarded.vote_granted,
            "an empty log alone votes for any log"
        );
        raft.shutdown().await.expect("shutdown");
    }

    /// Two replicas applying the same entries end with identical databases (random picks,
    /// generations and expiry included), and a snapshot installed on a third reproduces them.
    #[tokio::test]
    async fn replicas_apply_identically_and_snapshots_reproduce_them() {
        let (a, b) = (memory_db(), memory_db());
        let mut ma = machine::Machine::open(a.clone(), None).await.expect("open");
        let mut mb = machine::Machine::open(b.clone(), None).await.expect("open");
        let ra = ma.apply(history()).await.expect("apply");
        let rb = mb.apply(history()).await.expect("apply");
        assert_eq!(ra, rb, "the same replies on both replicas");
        assert_eq!(
            ra[4].reply, b":1\r\n",
            "the key expired at the entry's time"
        );
        assert!(
            String::from_utf8_lossy(&ra[6].reply).contains("WRONGTYPE"),
            "{:?}",
            String::from_utf8_lossy(&ra[6].reply)
        );
        assert!(!contents(&a).is_empty());
        assert_eq!(contents(&a), contents(&b), "identical databases");
        let (applied, _) = ma.applied_state().await.expect("state");
        assert_eq!(applied.map(|l| l.index), Some(12));

        let snapshot = ma
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .expect("snapshot");
        let c = memory_db();
        let mut mc = machine::Machine::open(c.clone(), None).await.expect("open");
        mc.apply(vec![entry(1, &[&["SET", "junk", "1"]])])
            .await
            .expect("apply");
        mc.install_snapshot(&snapshot.meta, snapshot.snapshot)
            .await
            .expect("install");
        assert_eq!(
            contents(&c),
            contents(&a),
            "the snapshot reproduces the data"
        );
        let (applied, _) = mc.applied_state().await.expect("state");
        assert_eq!(applied.map(|l| l.index), Some(12));
    }

    /// A partition of `keys` keys of `value` bytes beside `history()`'s, on a replica with a
    /// snapshot directory.
    async fn big_replica(dir: &std::path::Path, keys: usize, value: usize) -> machine::Machine {
        let db = memory_db();
        let mut m = machine::Machine::open(db.clone(), Some(dir.to_path_buf()))
            .await
            .expect("open");
        m.apply(history()).await.expect("apply");
        for chunk in (0..keys).collect::<Vec<_>>().chunks(1024) {
            db.transact(|t| {
                chunk.iter().try_for_each(|i| {
                    let v: Vec<u8> = (0..value).map(|j| (i * 31 + j) as u8).collect();
                    t.put(format!("big:{i:08}").as_bytes(), &v)
                })
            })
            .expect("put");
        }
        m
    }

    /// Names in `dir` but the snapshot file (temporary files left behind).
    fn strays(dir: &std::path::Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|n| n != machine::SNAPSHOT_FILE)
            .collect()
    }

    /// A snapshot of 16 MiB is built from an engine snapshot and installed a frame (about
    /// 1 MiB) at a time: the thread that builds it never holds more than a few frames, nor
    /// the one that installs it beyond the data it adds; the copy equals the original.
    #[tokio::test]
    async fn a_snapshot_is_built_and_installed_a_frame_at_a_time() {
        let (da, db_dir) = (
            tempfile::tempdir().expect("dir"),
            tempfile::tempdir().expect("dir"),
        );
        let mut leader = big_replica(da.path(), 4096, 4096).await;
        let (meta, built, stats, peak) = leader
            .get_snapshot_builder()
            .await
            .build_here()
            .expect("build");
        let whole = std::fs::metadata(da.path().join(machine::SNAPSHOT_FILE))
            .expect("the snapshot file")
            .len();
        assert!(
            peak < 4 << 20,
            "the builder held {peak} bytes at once for a snapshot of {whole}"
        );
        assert!(whole > 16 << 20, "{whole} bytes");
        assert!(stats.frames > 15, "{stats:?}");
        assert!(
            stats.peak_frame <= snapfile::FRAME_BYTES + 4096 + 10 * snapfile::FRAME_KEYS,
            "{stats:?}"
        );
        let machine::Built::File(file) = built else {
            panic!("a replica with a directory builds a file");
        };
        let data = snapfile::SnapData::File {
            file: tokio::fs::File::from_std(file),
            temp: None,
        };

        let copy = memory_db();
        let mut follower = machine::Machine::open(copy.clone(), Some(db_dir.path().to_path_buf()))
            .await
            .expect("open");
        follower
            .apply(vec![entry(1, &[&["SET", "junk", "1"]])])
            .await
            .expect("apply");
        let (read, held) = follower.install_here(&meta, data).await.expect("install");
        assert_eq!((read.pairs, read.frames), (stats.pairs, stats.frames));
        assert!(
            held < 4 << 20,
            "the install held {held} bytes beyond the data for a snapshot of {whole}"
        );
        assert_eq!(
            contents(&copy),
            contents(leader.db()),
            "the copy equals the original"
        );
        assert!(
            strays(db_dir.path()).is_empty(),
            "{:?}",
            strays(db_dir.path())
        );
        // The installed file is the follower's current snapshot, and survives a restart.
        let again = machine::Machine::open(memory_db(), Some(db_dir.path().to_path_buf()))
            .await
            .expect("open");
        assert_eq!(again.durable().get(), meta.last_log_id);
    }

    /// A snapshot received truncated, damaged, or not the one announced is refused, and the
    /// replica keeps its data and its snapshot file as they were, with no file left behind;
    /// a damaged snapshot file met at a start (an install to finish) stops the open, saying
    /// why, before anything is replaced.
    #[tokio::test]
    async fn a_truncated_or_damaged_snapshot_is_refused_whole() {
        use tokio::io::AsyncWriteExt;
        let (da, dir) = (
            tempfile::tempdir().expect("dir"),
            tempfile::tempdir().expect("dir"),
        );
        let mut leader = big_replica(da.path(), 3000, 1000).await;
        let snapshot = leader
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .expect("build");
        let meta = snapshot.meta.clone();
        let good = std::fs::read(da.path().join(machine::SNAPSHOT_FILE)).expect("read");

        let db = memory_db();
        let mut follower = machine::Machine::open(db.clone(), Some(dir.path().to_path_buf()))
            .await
            .expect("open");
        follower
            .apply(vec![entry(1, &[&["SET", "junk", "1"]])])
            .await
            .expect("apply");
        let before = contents(&db);
        let mut flipped = good.clone();
        let at = good.len() / 2;
        flipped[at] ^= 0x40;
        let mut other = meta.clone();
        other.snapshot_id = "another".into();
        type Meta = openraft::SnapshotMeta<u64, BasicNode>;
        let cases: Vec<(&str, Vec<u8>, &Meta, &str)> = vec![
            (
                "cut in a frame",
                good[..good.len() / 3].to_vec(),
                &meta,
                "truncated",
            ),
            (
                "cut before the end frame",
                good[..good.len() - 20].to_vec(),
                &meta,
                "truncated",
            ),
            ("empty", Vec::new(), &meta, "truncated"),
            ("a flipped bit", flipped, &meta, "checksum"),
            (
                "trailing bytes",
                [&good[..], b"xx"].concat(),
                &meta,
                "after its end frame",
            ),
            (
                "not the one announced",
                good.clone(),
                &other,
                "not the another",
            ),
        ];
        for (what, bytes, meta, why) in cases {
            let mut data = follower.begin_receiving_snapshot().await.expect("begin");
            data.write_all(&bytes).await.expect("write");
            data.shutdown().await.expect("shutdown");
            let err = follower
                .install_snapshot(meta, data)
                .await
                .expect_err(what)
                .to_string();
            assert!(
                err.contains("refused, nothing installed") && err.contains(why),
                "{what}: {err}"
            );
            assert_eq!(contents(&db), before, "{what}: the data stays");
            assert!(!dir.path().join(machine::SNAPSHOT_FILE).exists(), "{what}");
            assert!(
                strays(dir.path()).is_empty(),
                "{what}: {:?}",
                strays(dir.path())
            );
            assert_eq!(
                follower
                    .applied_state()
                    .await
                    .expect("state")
                    .0
                    .map(|l| l.index),
                Some(1)
            );
        }
        // The whole file installs.
        let mut data = follower.begin_receiving_snapshot().await.expect("begin");
        data.write_all(&good).await.expect("write");
        data.shutdown().await.expect("shutdown");
        follower
            .install_snapshot(&meta, data)
            .await
            .expect("install");
        assert_eq!(contents(&db), contents(leader.db()));

        // A start that finds a snapshot newer than its data finishes the install, unless the
        // file is damaged: then it refuses to open, and the data stays.
        let path = dir.path().join(machine::SNAPSHOT_FILE);
        std::fs::write(&path, &good[..good.len() - 100]).expect("cut");
        let fresh = memory_db();
        fresh.transact(|t| t.put(b"mine", b"1")).expect("put");
        let err = machine::Machine::open(fresh.clone(), Some(dir.path().to_path_buf()))
            .await
            .err()
            .expect("a damaged snapshot to finish stops the open")
            .to_string();
        assert!(
            err.contains("finishing the install") && err.contains("truncated"),
            "{err}"
        );
        assert_eq!(contents(&fresh), vec![(b"mine".to_vec(), b"1".to_vec())]);
        std::fs::write(&path, &good).expect("mend");
        machine::Machine::open(fresh.clone(), Some(dir.path().to_path_buf()))
            .await
            .expect("open");
        assert_eq!(
            contents(&fresh),
            contents(leader.db()),
            "finished at the start"
        );
    }

    /// Routes a test group's RPCs straight to the target's `Raft` (a snapshot's chunks through
    /// its inbox, as `net::serve` does), but for the links cut (`cut`: from, to; `from` is
    /// the sending node's), and records the size of every snapshot chunk that goes.
    #[derive(Clone, Default)]
    struct Direct {
        rafts: Arc<parking_lot::Mutex<BTreeMap<u64, Raft>>>,
        inboxes: Arc<parking_lot::Mutex<BTreeMap<u64, inbox::Inbox>>>,
        chunks: Arc<parking_lot::Mutex<Vec<(u64, usize, bool)>>>,
        cut: Arc<parking_lot::Mutex<std::collections::BTreeSet<(u64, u64)>>>,
        from: u64,
    }

    impl Direct {
        /// Cuts the links between `a` and `b`, both ways.
        fn cut(&self, a: u64, b: u64) {
            self.cut.lock().extend([(a, b), (b, a)]);
        }
    }

    impl openraft::RaftNetworkFactory<Tc> for Direct {
        type Network = DirectTo;
        async fn new_client(&mut self, target: u64, _: &BasicNode) -> DirectTo {
            DirectTo {
                net: self.clone(),
                target,
            }
        }
    }

    struct DirectTo {
        net: Direct,
        target: u64,
    }

    impl DirectTo {
        #[allow(clippy::result_large_err)]
        fn raft<E: std::error::Error>(
            &self,
        ) -> Result<Raft, openraft::error::RPCError<u64, BasicNode, E>> {
            let cut = self.net.cut.lock().contains(&(self.net.from, self.target));
            let raft = self.net.rafts.lock().get(&self.target).cloned();
            raft.filter(|_| !cut).ok_or_else(|| {
                openraft::error::RPCError::Unreachable(openraft::error::Unreachable::new(
                    &std::io::Error::other("down"),
                ))
            })
        }
    }

    fn remote<E: std::error::Error>(
        target: u64,
        e: openraft::error::RaftError<u64, E>,
    ) -> openraft::error::RPCError<u64, BasicNode, openraft::error::RaftError<u64, E>> {
        openraft::error::RPCError::RemoteError(openraft::error::RemoteError::new(target, e))
    }

    impl openraft::RaftNetwork<Tc> for DirectTo {
        async fn append_entries(
            &mut self,
            rpc: openraft::raft::AppendEntriesRequest<Tc>,
            _: openraft::network::RPCOption,
        ) -> Result<
            openraft::raft::AppendEntriesResponse<u64>,
            openraft::error::RPCError<u64, BasicNode, openraft::error::RaftError<u64>>,
        > {
            let raft = self.raft()?;
            raft.append_entries(rpc)
                .await
                .map_err(|e| remote(self.target, e))
        }

        async fn install_snapshot(
            &mut self,
            rpc: openraft::raft::InstallSnapshotRequest<Tc>,
            _: openraft::network::RPCOption,
        ) -> Result<
            openraft::raft::InstallSnapshotResponse<u64>,
            openraft::error::RPCError<
                u64,
                BasicNode,
                openraft::error::RaftError<u64, openraft::error::InstallSnapshotError>,
            >,
        > {
            self.net
                .chunks
                .lock()
                .push((rpc.offset, rpc.data.len(), rpc.done));
            let raft = self.raft()?;
            let inbox = self
                .net
                .inboxes
                .lock()
                .entry(self.target)
                .or_default()
                .clone();
            inbox
                .receive(&raft, rpc)
                .await
                .map_err(|e| remote(self.target, e))
        }

        async fn vote(
            &mut self,
            rpc: openraft::raft::VoteRequest<u64>,
            _: openraft::network::RPCOption,
        ) -> Result<
            openraft::raft::VoteResponse<u64>,
            openraft::error::RPCError<u64, BasicNode, openraft::error::RaftError<u64>>,
        > {
            let raft = self.raft()?;
            raft.vote(rpc).await.map_err(|e| remote(self.target, e))
        }
    }

    /// A forwarded write that reaches its leader after its sender's deadline (a request a
    /// network held back, or a node stopped with it unread, while its sender gave up) is
    /// refused with nothing applied, so that it cannot run after the window in which its id
    /// is deduplicated; one in time applies, and a malformed deadline is an error.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_that_arrives_after_its_senders_deadline_is_refused() {
        let (_, _, dbs, parts, l) = three_on_direct().await;
        let leader = &parts[l];
        let set = |seq: u64, value: &str| Request {
            commands: vec![vec![
                b"SET".to_vec(),
                b"k".to_vec(),
                value.as_bytes().to_vec(),
            ]],
            id: Some(TxnId {
                node: 2,
                incarnation: 7,
                seq,
            }),
            keep_ms: 60_000,
            bulk_bytes_max: 512 << 20,
            reply_bytes_max: 1 << 30,
            ..Request::default()
        };
        let send = |kind: String, request: Request| async move {
            let payload = postcard::to_stdvec(&request).expect("encodes");
            let bytes = net::serve(leader, kind.as_bytes(), &payload).await?;
            Ok::<_, String>(
                postcard::from_bytes::<Result<Response, Refused>>(&bytes).expect("decodes"),
            )
        };
        let now = crate::keyspace::unix_ms();
        let late = send(
            format!("write@{}", now - LATE_SLACK_MS - 1_000),
            set(1, "late"),
        )
        .await
        .expect("answered");
        match late {
            Err(Refused::Late(text)) => {
                assert!(text.contains("after its sender's deadline"), "{text}")
            }
            other => panic!("a late write must be refused: {other:?}"),
        }
        let value = || String::from_utf8(read(&dbs[l].0, &leader.locks, "k").expect("read"));
        assert_eq!(value().expect("utf-8"), "$-1\r\n", "nothing applied");
        // Within the slack (the clocks may differ), and before the deadline: applied.
        for (seq, until) in [(2, now - LATE_SLACK_MS / 2), (3, now + 10_000)] {
            let v = format!("v{seq}");
            let done = send(format!("write@{until}"), set(seq, &v))
                .await
                .expect("answered")
                .expect("applied");
            assert_eq!(
                (done.status, &done.reply[..]),
                (Status::Done, &b"+OK\r\n"[..])
            );
            assert_eq!(value().expect("utf-8"), format!("$2\r\n{v}\r\n"));
        }
        let bad = send("write@soon".into(), set(4, "bad")).await;
        assert!(
            bad.is_err_and(|e| e.contains("deadline")),
            "a malformed deadline"
        );
        assert_eq!(value().expect("utf-8"), "$2\r\nv3\r\n");
        for p in &parts {
            p.stop().await;
        }
    }

    /// Three rafts on one `Direct` network with the server's timeouts, started: the config,
    /// the network, each node's databases (data, log), their `Part`s and the leader's index.
    #[allow(clippy::type_complexity)]
    async fn three_on_direct() -> (
        Arc<openraft::Config>,
        Direct,
        Vec<(Db, Db)>,
        Vec<Part>,
        usize,
    ) {
        let config = Arc::new(timeouts().validate().expect("a valid config"));
        let net = Direct::default();
        let dbs: Vec<(Db, Db)> = (0..3).map(|_| (memory_db(), memory_db())).collect();
        let mut parts = Vec::new();
        for id in 1..=3u64 {
            parts.push(direct_part(id, dbs[id as usize - 1].clone(), &config, &net).await);
        }
        let members: BTreeMap<u64, BasicNode> = (1..=3)
            .map(|i| (i, BasicNode::new(format!("n{i}"))))
            .collect();
        parts[0].raft.initialize(members).await.expect("initialize");
        let started = Instant::now();
        let leader = loop {
            let leads = |p: &Part| p.raft.metrics().borrow().state == openraft::ServerState::Leader;
            if let Some(l) = (0..3).find(|&i| leads(&parts[i])) {
                break l;
            }
            assert!(started.elapsed() < Duration::from_secs(30), "no leader");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        (config, net, dbs, parts, leader)
    }

    /// Opens node `id` of a `Direct` group on its databases (again, after a restart), as
    /// `Replication::open_part` does: its `Part`.
    async fn direct_part(
        id: u64,
        (db, log_db): (Db, Db),
        config: &Arc<openraft::Config>,
        net: &Direct,
    ) -> Part {
        let machine = machine::Machine::open(db.clone(), None)
            .await
            .expect("open");
        let locks = machine.locks();
        let moved = locks.lock().moved_flag();
        let log = log::LogStore::open(log_db, keel::Durability::None);
        let node_net = Direct {
            from: id,
            ..net.clone()
        };
        let raft = Raft::new(id, Arc::clone(config), node_net, log, machine)
            .await
            .expect("raft");
        net.rafts.lock().insert(id, raft.clone());
        Part {
            id: 0,
            raft,
            db,
            moved,
            locks,
            clock: Arc::new(crate::keyspace::unix_ms),
            reads: Arc::default(),
            proposals: Arc::default(),
            floor: None,
            inbox: inbox::Inbox::default(),
        }
    }

    /// A follower that acknowledged its leader's read-index round (the only one that could: the
    /// other is cut off from the leader and stands for election over and over) and then
    /// restarts must keep openraft's promise to vote for no one while that leader's lease
    /// runs, which lives in memory: openraft restores the stored vote with the time of the
    /// start as its last change, so the restarted follower votes for no one, itself included,
    /// for a whole lease. The other is elected only after that, when the old leader's lease for
    /// reads has run out, and the old leader's read after the new leader's write is refused.
    /// (Opened on an empty log instead, a follower that forgot its vote, it voted at once: the
    /// candidate won 150-300 ms after the restart, within the lease.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_restarted_follower_votes_for_no_one_while_its_leader_may_read_on_its_lease() {
        use openraft::ServerState;
        let (config, net, dbs, mut parts, l) = three_on_direct().await;
        let leads = |part: &Part| part.raft.metrics().borrow().state == ServerState::Leader;
        let (a, b) = ((l + 1) % 3, (l + 2) % 3);
        let id = |i: usize| i as u64 + 1;
        let request = |commands: &[&str]| match entry(0, &[commands]).payload {
            EntryPayload::Normal(r) => r,
            _ => unreachable!(),
        };
        parts[l]
            .serve(request(&["SET", "k", "old"]), false)
            .await
            .expect("write");
        // b loses the leader and stands for election again and again; a, which hears the
        // leader, refuses it.
        net.cut(id(l), id(b));
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(leads(&parts[l]), "the leader kept a majority with a");
        let term = parts[l].raft.metrics().borrow().current_term;
        assert_eq!(
            parts[l]
                .serve(request(&["GET", "k"]), true)
                .await
                .expect("a round acknowledged by a"),
            b"$3\r\nold\r\n"
        );
        assert!(parts[l].reads.leased(term));
        // a restarts, cut off from the leader.
        parts[a].raft.shutdown().await.expect("shutdown");
        net.rafts.lock().remove(&id(a));
        net.cut(id(l), id(a));
        let reopened = Instant::now();
        parts[a] = direct_part(id(a), dbs[a].clone(), &config, &net).await;
        let new = loop {
            if let Some(n) = [a, b].into_iter().find(|&i| leads(&parts[i])) {
                break n;
            }
            assert!(
                reopened.elapsed() < Duration::from_secs(30),
                "no new leader"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let elected = reopened.elapsed();
        assert!(
            elected >= Duration::from_millis(ELECTION_MS.1),
            "elected {elected:?} after the restart, while the follower's promise to the old \
             leader's lease held"
        );
        assert!(
            !parts[l].reads.leased(term),
            "another leader was elected while the old one read on its lease"
        );
        parts[new]
            .serve(request(&["SET", "k", "new"]), false)
            .await
            .expect("write at the new leader");
        let read = tokio::time::timeout(
            Duration::from_secs(2),
            parts[l].serve(request(&["GET", "k"]), true),
        )
        .await;
        assert!(
            !matches!(&read, Ok(Ok(v)) if v == b"$3\r\nold\r\n"),
            "a stale read: {read:?}"
        );
        for part in &parts {
            part.raft.shutdown().await.expect("shutdown");
        }
    }

    /// Linearizable reads on a leader's lease: a leader that confirmed its leadership serves
    /// reads without a round for a while, but a leader cut off from the others stops before
    /// another can be elected and commit a write. Here the cut-off leader's read, once the
    /// new leader has committed a newer value, is refused rather than answered with the old
    /// value; the same leader with a lease that never ends (`ReadRounds::with_lease`)
    /// answers the old value, which is what the lease's length guards against.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_leader_cut_off_stops_reading_on_its_lease_before_another_is_elected() {
        use openraft::ServerState;
        let (_, net, _, parts, old) = three_on_direct().await;
        let leader = |parts: &[Part], not: Option<usize>| -> Option<usize> {
            (0..3).filter(|&i| Some(i) != not).find(|&i| {
                let m = parts[i].raft.metrics().borrow().clone();
                m.state == ServerState::Leader
            })
        };
        let request = |commands: &[&str]| match entry(0, &[commands]).payload {
            EntryPayload::Normal(r) => r,
            _ => unreachable!(),
        };
        let set = |v: &str| request(&["SET", "k", v]);
        parts[old].serve(set("old"), false).await.expect("write");
        assert_eq!(
            parts[old]
                .serve(request(&["GET", "k"]), true)
                .await
                .expect("read"),
            b"$3\r\nold\r\n",
            "a read-index round, which gives the lease"
        );
        let term = parts[old].raft.metrics().borrow().current_term;
        assert!(parts[old].reads.leased(term), "the round gave a lease");
        // The same leader, with a lease that never ends.
        let endless = Part {
            id: 0,
            raft: parts[old].raft.clone(),
            db: parts[old].db.clone(),
            locks: Arc::clone(&parts[old].locks),
            clock: Arc::clone(&parts[old].clock),
            moved: Arc::clone(&parts[old].moved),
            reads: Arc::new(ReadRounds::with_lease(Duration::from_secs(3_600))),
            proposals: Arc::default(),
            floor: None,
            inbox: inbox::Inbox::default(),
        };
        endless
            .serve(request(&["GET", "k"]), true)
            .await
            .expect("a round for the endless lease");

        for other in (1..=3).filter(|&o| o != old as u64 + 1) {
            net.cut(old as u64 + 1, other);
        }
        let cut = Instant::now();
        let new = loop {
            if let Some(l) = leader(&parts, Some(old)) {
                break l;
            }
            assert!(cut.elapsed() < Duration::from_secs(30), "no new leader");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let elected = cut.elapsed();
        assert!(
            elected > READ_LEASE,
            "a new leader after {elected:?}, within the old one's lease"
        );
        parts[new]
            .serve(set("new"), false)
            .await
            .expect("write at the new leader");
        assert_eq!(
            parts[old].raft.metrics().borrow().state,
            ServerState::Leader,
            "the old leader does not know yet"
        );
        let read = tokio::time::timeout(
            Duration::from_secs(2),
            parts[old].serve(request(&["GET", "k"]), true),
        )
        .await;
        assert!(
            !matches!(&read, Ok(Ok(v)) if v == b"$3\r\nold\r\n"),
            "the old leader answered from its copy after another was elected: {read:?}"
        );
        assert_eq!(
            endless
                .serve(request(&["GET", "k"]), true)
                .await
                .expect("read"),
            b"$3\r\nold\r\n",
            "with a lease that never ends the old value comes back (a stale read)"
        );
        for part in &parts {
            part.raft.shutdown().await.expect("shutdown");
        }
    }

    /// Through openraft's own transport: a learner that joins after the log was cut gets the
    /// leader's snapshot file in chunks no larger than the configured size (many of them),
    /// into a file of its own, and ends with the leader's data and the same snapshot file.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_snapshot_travels_to_a_learner_in_chunks_from_its_file() {
        use openraft::ServerState;
        const CHUNK: u64 = 64 << 10;
        let config = Arc::new(
            openraft::Config {
                snapshot_max_chunk_size: CHUNK,
                // Generous: the test machine may be loaded.
                install_snapshot_timeout: 10_000,
                ..timeouts()
            }
            .validate()
            .expect("a valid config"),
        );
        let net = Direct::default();
        let dirs = [
            tempfile::tempdir().expect("dir"),
            tempfile::tempdir().expect("dir"),
        ];
        let data = [memory_db(), memory_db()];
        let mut rafts = Vec::new();
        for (i, (dir, db)) in dirs.iter().zip(data.clone()).enumerate() {
            let machine = machine::Machine::open(db, Some(dir.path().to_path_buf()))
                .await
                .expect("open");
            let log = log::LogStore::open(memory_db(), keel::Durability::None)
                .purge_behind(machine.durable());
            let raft = Raft::new(i as u64 + 1, Arc::clone(&config), net.clone(), log, machine)
                .await
                .expect("raft");
            net.rafts.lock().insert(i as u64 + 1, raft.clone());
            rafts.push(raft);
        }
        let wait = |raft: &Raft| raft.wait(Some(Duration::from_secs(30)));
        rafts[0]
            .initialize(BTreeMap::from([(1, BasicNode::new("n1"))]))
            .await
            .expect("initialize");
        wait(&rafts[0])
            .state(ServerState::Leader, "leads")
            .await
            .expect("leads");
        let value = "v".repeat(8 << 10);
        for i in 0..200 {
            let mut request = match entry(0, &[&["SET", &format!("k{i}"), &value]]).payload {
                EntryPayload::Normal(r) => r,
                _ => unreachable!(),
            };
            request.now_ms = 1_700_000_000_000;
            rafts[0].client_write(request).await.expect("write");
        }
        rafts[0].trigger().snapshot().await.expect("snapshot");
        let m = wait(&rafts[0])
            .metrics(|m| m.snapshot.is_some_and(|s| s.index >= 200), "a snapshot")
            .await
            .expect("snapshot");
        let last = m.snapshot.expect("a snapshot");
        rafts[0]
            .trigger()
            .purge_log(last.index)
            .await
            .expect("purge");
        wait(&rafts[0])
            .metrics(|m| m.purged == Some(last), "the log cut")
            .await
            .expect("purged");

        rafts[0]
            .add_learner(2, BasicNode::new("n2"), true)
            .await
            .expect("add the learner");
        wait(&rafts[1])
            .metrics(
                |m| m.snapshot == Some(last) && m.last_applied >= Some(last),
                "installed",
            )
            .await
            .expect("installed");

        let file = |i: usize| std::fs::read(dirs[i].path().join(machine::SNAPSHOT_FILE));
        let sent = file(0).expect("the leader's snapshot file");
        assert_eq!(file(1).expect("the learner's snapshot file"), sent);
        assert!(sent.len() as u64 > 20 * CHUNK, "{} bytes", sent.len());
        let chunks = net.chunks.lock().clone();
        assert!(
            chunks.iter().all(|&(_, len, _)| len as u64 <= CHUNK),
            "a chunk over {CHUNK} bytes"
        );
        let whole: Vec<_> = chunks.iter().filter(|c| c.0 == 0).collect();
        assert_eq!(whole.len(), 1, "sent once: {whole:?}");
        assert_eq!(
            chunks.iter().map(|c| c.1 as u64).sum::<u64>(),
            sent.len() as u64
        );
        assert!(
            chunks.len() as u64 >= sent.len() as u64 / CHUNK,
            "{}",
            chunks.len()
        );
        assert!(chunks.last().is_some_and(|c| c.2), "the last chunk is done");
        assert!(
            strays(dirs[1].path()).is_empty(),
            "{:?}",
            strays(dirs[1].path())
        );
        assert_eq!(contents(&data[1]), contents(&data[0]));
        for raft in rafts {
            raft.shutdown().await.expect("shutdown");
        }
    }

    /// A follower (node 2) of a test group, on `data` and `log` with its snapshot in `dir`:
    /// its Raft, and what receives the chunks of the leader's snapshots.
    async fn follower(dir: &std::path::Path, data: Db, log: Db) -> (Raft, inbox::Inbox) {
        let config = Arc::new(timeouts().validate().expect("a valid config"));
        let machine = machine::Machine::open(data, Some(dir.to_path_buf()))
            .await
            .expect("open");
        let log = log::LogStore::open(log, keel::Durability::None).purge_behind(machine.durable());
        let raft = Raft::new(2, config, Direct::default(), log, machine)
            .await
            .expect("raft");
        (raft, inbox::Inbox::default())
    }

    /// The leader's current snapshot, as its meta and its file's bytes.
    async fn leader_snapshot(
        leader: &mut machine::Machine,
        dir: &std::path::Path,
    ) -> (snapfile::Meta, Vec<u8>) {
        let snapshot = leader
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .expect("build");
        let bytes = std::fs::read(dir.join(machine::SNAPSHOT_FILE)).expect("read");
        (snapshot.meta, bytes)
    }

    /// The leader's chunks of the snapshot `meta` (`bytes`), of 1 KiB, as openraft sends them.
    fn chunks(
        meta: &snapfile::Meta,
        bytes: &[u8],
    ) -> Vec<openraft::raft::InstallSnapshotRequest<Tc>> {
        let n = bytes.len().div_ceil(1024);
        (0..n)
            .map(|i| openraft::raft::InstallSnapshotRequest {
                vote: openraft::Vote::new_committed(1, 0),
                meta: meta.clone(),
                offset: (i * 1024) as u64,
                data: bytes[i * 1024..bytes.len().min((i + 1) * 1024)].to_vec(),
                done: i + 1 == n,
            })
            .collect()
    }

    type ChunkAnswer = Result<
        openraft::raft::InstallSnapshotResponse<u64>,
        openraft::error::RaftError<u64, openraft::error::InstallSnapshotError>,
    >;

    /// Delivers a snapshot chunk to `raft` as a server does.
    async fn deliver(
        (raft, inbox): &(Raft, inbox::Inbox),
        chunk: &openraft::raft::InstallSnapshotRequest<Tc>,
    ) -> ChunkAnswer {
        inbox.receive(raft, chunk.clone()).await
    }

    /// Whether the answer to a chunk is a refusal that makes the sender start over (not a
    /// fatal error).
    /// Delivers `chunks` in order; each must be accepted.
    async fn deliver_all(
        f: &(Raft, inbox::Inbox),
        chunks: &[openraft::raft::InstallSnapshotRequest<Tc>],
    ) {
        for chunk in chunks {
            deliver(f, chunk).await.expect("a chunk in order");
        }
    }

    /// The current snapshot file in `dir`.
    fn snapshot_file(dir: &std::path::Path) -> Vec<u8> {
        std::fs::read(dir.join(machine::SNAPSHOT_FILE)).expect("the snapshot file")
    }

    fn starts_over(answer: &ChunkAnswer) -> bool {
        matches!(
            answer,
            Err(openraft::error::RaftError::APIError(
                openraft::error::InstallSnapshotError::SnapshotMismatch(_)
            ))
        )
    }

    /// Whether `raft` still runs.
    fn runs(raft: &Raft) -> bool {
        raft.metrics().borrow().running_state.is_ok()
    }

    /// Late copies of a transfer's first and last chunks (the simulation's faults duplicate
    /// and delay messages, `replica::sim::across` seed 101) neither start a file nor finish
    /// one. After the transfer completed and installed, they are acknowledged and nothing is
    /// written. After a restart cut a newer snapshot's transfer short, the late first chunk
    /// starts a file and the late last chunk, which does not follow it, is refused as a
    /// mismatch (the sender starts over) instead of finishing a file with a hole, whose
    /// install fails and stops Raft; the snapshot sent again installs.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn late_copies_of_a_transfers_chunks_are_harmless() {
        let (da, dir) = (
            tempfile::tempdir().expect("dir"),
            tempfile::tempdir().expect("dir"),
        );
        let mut leader = big_replica(da.path(), 40, 100).await;
        let (meta, bytes) = leader_snapshot(&mut leader, da.path()).await;
        let sent = chunks(&meta, &bytes);
        assert!(sent.len() > 3, "{} chunks", sent.len());
        let (data, log) = (memory_db(), memory_db());
        let f = follower(dir.path(), data.clone(), log.clone()).await;
        deliver_all(&f, &sent).await;
        assert_eq!(contents(&data), contents(leader.db()));
        assert_eq!(snapshot_file(dir.path()), bytes);
        // The late copies, once installed: acknowledged, nothing started or written.
        for chunk in [&sent[0], &sent[sent.len() - 1]] {
            deliver(&f, chunk).await.expect("acknowledged");
            assert!(strays(dir.path()).is_empty(), "{:?}", strays(dir.path()));
        }
        assert!(runs(&f.0));

        // A newer snapshot, whose transfer a restart cuts short before its last chunk.
        leader
            .apply(vec![entry(13, &[&["SET", "later", "1"]])])
            .await
            .expect("apply");
        let (newer, newer_bytes) = leader_snapshot(&mut leader, da.path()).await;
        let resent = chunks(&newer, &newer_bytes);
        deliver_all(&f, &resent[..resent.len() - 1]).await;
        f.0.shutdown().await.expect("shutdown");
        let f = follower(dir.path(), data.clone(), log).await;
        deliver(&f, &resent[0]).await.expect("a first chunk");
        let last = deliver(&f, &resent[resent.len() - 1]).await;
        assert!(starts_over(&last), "{last:?}");
        assert!(runs(&f.0), "{:?}", f.0.metrics().borrow().running_state);
        assert_eq!(
            snapshot_file(dir.path()),
            bytes,
            "the installed snapshot stays"
        );
        deliver_all(&f, &resent).await;
        assert_eq!(contents(&data), contents(leader.db()));
        assert_eq!(snapshot_file(dir.path()), newer_bytes);
        assert!(strays(dir.path()).is_empty(), "{:?}", strays(dir.path()));
        f.0.shutdown().await.expect("shutdown");
    }

    /// A chunk past the end of the file being received (a chunk lost, the next delivered) is
    /// refused as a mismatch, and so is every later one, so no file with a hole is assembled;
    /// Raft keeps running. The sender starts over from the first chunk: those received are
    /// acknowledged as repeats, the rest written, and the snapshot installs whole.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_chunk_after_a_gap_is_refused() {
        let (da, dir) = (
            tempfile::tempdir().expect("dir"),
            tempfile::tempdir().expect("dir"),
        );
        let mut leader = big_replica(da.path(), 40, 100).await;
        let (meta, bytes) = leader_snapshot(&mut leader, da.path()).await;
        let sent = chunks(&meta, &bytes);
        assert!(sent.len() > 3, "{} chunks", sent.len());
        let data = memory_db();
        data.transact(|t| t.put(b"mine", b"1")).expect("put");
        let f = follower(dir.path(), data.clone(), memory_db()).await;
        deliver(&f, &sent[0]).await.expect("the first chunk");
        deliver(&f, &sent[1]).await.expect("the second chunk");
        for chunk in &sent[3..] {
            let answer = deliver(&f, chunk).await;
            assert!(starts_over(&answer), "at {}: {answer:?}", chunk.offset);
        }
        assert!(runs(&f.0), "{:?}", f.0.metrics().borrow().running_state);
        assert_eq!(contents(&data), vec![(b"mine".to_vec(), b"1".to_vec())]);
        assert!(!dir.path().join(machine::SNAPSHOT_FILE).exists());
        deliver_all(&f, &sent).await;
        assert_eq!(contents(&data), contents(leader.db()));
        assert_eq!(snapshot_file(dir.path()), bytes);
        assert!(strays(dir.path()).is_empty(), "{:?}", strays(dir.path()));
        f.0.shutdown().await.expect("shutdown");
    }

    /// A snapshot whose chunks fit together but whose file does not check (damaged on the
    /// way, or on the leader) is dropped when its last chunk arrives and refused as a
    /// mismatch, so the leader sends it again: Raft keeps running, nothing is installed and
    /// no file stays; the snapshot sent whole then installs.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_damaged_snapshot_is_dropped_and_sent_again() {
        let (da, dir) = (
            tempfile::tempdir().expect("dir"),
            tempfile::tempdir().expect("dir"),
        );
        let mut leader = big_replica(da.path(), 40, 100).await;
        let (meta, bytes) = leader_snapshot(&mut leader, da.path()).await;
        let mut damaged = bytes.clone();
        damaged[bytes.len() / 2] ^= 0x08;
        let data = memory_db();
        let f = follower(dir.path(), data.clone(), memory_db()).await;
        let sent = chunks(&meta, &damaged);
        deliver_all(&f, &sent[..sent.len() - 1]).await;
        let last = deliver(&f, &sent[sent.len() - 1]).await;
        assert!(starts_over(&last), "{last:?}");
        assert!(runs(&f.0), "{:?}", f.0.metrics().borrow().running_state);
        assert!(contents(&data).is_empty());
        assert!(!dir.path().join(machine::SNAPSHOT_FILE).exists());
        assert!(strays(dir.path()).is_empty(), "{:?}", strays(dir.path()));
        deliver_all(&f, &chunks(&meta, &bytes)).await;
        assert_eq!(contents(&data), contents(leader.db()));
        f.0.shutdown().await.expect("shutdown");
    }
}

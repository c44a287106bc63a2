//! The two-phase commit of a cross-partition transaction, as sans-IO state machines: a
//! [`Coordinator`] and a [`Participant`] consume messages, storage completions and clock
//! ticks, and emit actions (messages to send, storage work to start, answers to clients).
//! Nothing here reads a clock, draws a random number, starts a thread or touches a socket or
//! a file: time comes in as `now_ms`, and the caller (the real server, or the deterministic
//! simulation in `tests/it/sim.rs`) carries out the actions and feeds their results back.
//!
//! Transactions are one-shot: the coordinator knows every participant's whole work when it
//! begins (a `MULTI` block split by the node owning its keys). A participant's prepare runs
//! its work against its partition, locks what it touched, makes the prepared record durable
//! and votes yes with the work's replies, or refuses (votes no). The generic `W` (work) and
//! `R` (reply) are whatever the partition executes; this module never looks inside them, and
//! it never sees timestamps: each partition orders its own commits, and serializability across
//! partitions follows from commitment ordering (a prepared transaction holds its locks until
//! its decision is installed).
//!
//! The protocol (presumed abort):
//!
//! 1. The coordinator sends [`Message::Prepare`] to every participant and resends it to those
//!    that have not voted, every [`Config::resend_ms`], until [`Config::vote_timeout_ms`].
//! 2. Every vote yes: the coordinator logs the commit [`Decision`] durably (the only record
//!    it ever logs), then sends [`Message::Decide`] with each participant's own
//!    [`PrepareId`]. Any vote no, or the vote timeout: it decides abort, answers the client
//!    at once and tells the participants, logging nothing.
//! 3. A participant installs the writes of the prepare named in the decision, makes that
//!    durable, and acknowledges. Once every participant acknowledged, the coordinator drops
//!    the decision record ([`CoordinatorAction::Forget`]).
//!
//! Idempotence. Every message may be lost, duplicated or reordered:
//!
//! - A participant keeps the transactions it is working on, and a bounded memory of those it
//!   finished ([`Config::finished_max`]): a duplicate `Prepare` gets the stored vote again,
//!   never a second execution.
//! - A `Prepare` that outlived that memory executes again (a *stale re-prepare*). This is
//!   harmless because every execution has its own [`PrepareId`] (the participant's
//!   incarnation and a counter, kept in the durable prepared record), and a commit decision
//!   names the prepare whose vote was counted: a participant holding another prepare of a
//!   committed transaction aborts it (the counted one was installed before). A stale
//!   re-prepare of a transaction the coordinator no longer knows stays prepared until its
//!   inquiry, and the coordinator answers abort.
//! - A coordinator asked about a transaction it has no record of answers abort. It never
//!   decides commit for such a transaction later: its ids are never reused (a restarted
//!   coordinator draws a fresh incarnation), and a transaction of an earlier incarnation
//!   without a durable decision was never decided commit.
//! - A prepared participant that hears no decision inquires ([`Message::Inquire`]) after
//!   [`Config::inquire_after_ms`], and again every [`Config::inquire_every_ms`]; after a
//!   restart it is given its durable prepared records ([`Participant::recover`]) and inquires
//!   about each at once. A restarted coordinator is given its durable decisions
//!   ([`Coordinator::recover`]) and sends them again until acknowledged.
//! - Cooperative termination: a prepared participant whose inquiry went unanswered also asks
//!   the other participants ([`Message::PeerInquire`]; the participant list comes with the
//!   `Prepare` and is kept in the prepared record). One that knows the decision tells it (a
//!   commit decision carries every participant's counted prepare, so it can); one that knows
//!   none and holds no prepare answers how far back it knows it never voted yes
//!   ([`Message::NoYesVote`]), and the asker aborts on that only when it proves no yes vote
//!   of the answerer can count (see [`Participant::handle`]). The coordinator never counts a
//!   vote that arrives after its vote timeout, which that proof relies on.
//!
//! Read-only transactions. A participant whose work only read says so in its yes vote. When
//! every vote is yes and read-only, there is nothing to install anywhere: the coordinator
//! answers `Committed` at once (every participant held what it read when the last vote
//! arrived, so the replies are one consistent cut), sends every participant abort, which
//! releases its holds as a commit would, and forgets the transaction. Nothing is logged and
//! nothing acknowledged; a participant that misses the abort inquires and hears abort (the
//! coordinator has no record), which is the same.
//!
//! The client is answered `Committed` once the decision is durable and every participant
//! acknowledged, or once the decision is durable and [`Config::ack_wait_ms`] passed without
//! every acknowledgement (see [`Config::ack_wait_ms`] for why that early answer keeps real-time
//! order), `Aborted` as soon as abort is decided, and `Unknown` if the decision record is not
//! durable by [`Config::client_deadline_ms`].
//!
//! The messages and ids derive serde's traits (for `W` and `R` that do), for the transport to
//! encode; nothing here encodes or needs them.

use serde::{Deserialize, Serialize};

mod coordinator;
mod participant;
#[cfg(test)]
mod tests;

pub use coordinator::{Action as CoordinatorAction, BeginError, Coordinator, Decision};
pub use participant::{Action as ParticipantAction, Participant, Recovered};

/// A node, by its index in [`crate::Membership::nodes`] (the same list, in the same order, on
/// every node).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Peer(pub u16);

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "node#{}", self.0)
    }
}

/// A cross-partition transaction: its coordinator, the coordinator's incarnation (drawn when
/// that process started, so that a restarted coordinator never reuses an id), and a sequence
/// number within the incarnation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TxnId {
    /// The node that coordinates it.
    pub coordinator: Peer,
    /// The coordinator process' incarnation.
    pub incarnation: u64,
    /// Its number in that incarnation, from 1.
    pub seq: u64,
}

impl std::fmt::Display for TxnId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{:x}:{}",
            self.coordinator.0, self.incarnation, self.seq
        )
    }
}

/// One execution of a transaction's prepare on a participant: the participant's incarnation
/// and a counter. Kept in the durable prepared record and named by the commit decision, so
/// that a late duplicate `Prepare` that executed again is told apart from the prepare whose
/// vote was counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PrepareId {
    /// The participant process' incarnation.
    pub incarnation: u64,
    /// Its number in that incarnation, from 1.
    pub seq: u64,
}

/// Why a participant voted no.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Refusal {
    /// A key is locked by another prepared transaction (or the work conflicted otherwise):
    /// trying again later may succeed.
    Busy,
    /// The work failed (an error reply, a limit): trying again will not help.
    Failed(String),
    /// The participant has too many transactions in progress ([`Config::txns_max`]).
    Overloaded,
    /// The participant had already finished the transaction (aborted): this prepare is a late
    /// duplicate.
    Finished,
}

/// A participant's vote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Vote<R> {
    /// Prepared (durably, holding its locks) as `prepare`; `reply` is the work's replies.
    Yes {
        /// Which execution of the prepare.
        prepare: PrepareId,
        /// What the work answered.
        reply: R,
        /// The work only read: committing and aborting it both only release what it
        /// holds. A coordinator whose every yes vote says so answers its client at once and
        /// releases the participants with abort, logging nothing and waiting for no
        /// acknowledgement.
        read_only: bool,
    },
    /// Not prepared, and why.
    No(Refusal),
}

/// A transaction's decision, as the coordinator (or a participant that knows it) tells a
/// participant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Decided {
    /// Commit, with every participant's counted prepare (the one whose yes vote was counted):
    /// the recipient commits its own, and any other prepare of the transaction it holds is a
    /// stale re-prepare, to abort. The whole list travels so that a participant that learnt
    /// the decision can tell it to the others ([`Message::PeerInquire`]).
    Commit(Vec<(Peer, PrepareId)>),
    /// Abort whatever prepare of the transaction the participant holds.
    Abort,
}

impl Decided {
    /// The prepare of `peer` that a commit decision counted; `None` for abort, or if `peer`
    /// is not a participant.
    pub fn counted(&self, peer: Peer) -> Option<PrepareId> {
        match self {
            Decided::Commit(parts) => parts.iter().find(|(p, _)| *p == peer).map(|(_, id)| *id),
            Decided::Abort => None,
        }
    }
}

/// Everything nodes say to each other about a transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Message<W, R> {
    /// Coordinator to participant: execute and prepare `work`.
    Prepare {
        /// The transaction.
        txn: TxnId,
        /// Every participant, the recipient among them (for its prepared record).
        participants: Vec<Peer>,
        /// This participant's part of the transaction.
        work: W,
    },
    /// Participant to coordinator: the answer to `Prepare`.
    Vote {
        /// The transaction.
        txn: TxnId,
        /// The voter.
        from: Peer,
        /// Its vote.
        vote: Vote<R>,
    },
    /// Coordinator to participant: the outcome.
    Decide {
        /// The transaction.
        txn: TxnId,
        /// Commit (which prepare) or abort.
        decision: Decided,
    },
    /// Participant to coordinator: the commit is installed and durable.
    Ack {
        /// The transaction.
        txn: TxnId,
        /// The participant.
        from: Peer,
    },
    /// Participant to coordinator: `prepare` is prepared and has heard no decision.
    Inquire {
        /// The transaction.
        txn: TxnId,
        /// The participant.
        from: Peer,
        /// The prepare it holds.
        prepare: PrepareId,
    },
    /// Participant to participant (cooperative termination): `from` is prepared, and its
    /// coordinator did not answer its inquiry; what does the recipient know? The recipient
    /// answers with [`Message::Decide`] if it knows the decision, with
    /// [`Message::NoYesVote`] if it never voted yes lately, and not at all if it is prepared
    /// and undecided itself.
    PeerInquire {
        /// The transaction.
        txn: TxnId,
        /// The asking participant.
        from: Peer,
        /// The asker's clock when it asked, echoed in a [`Message::NoYesVote`] answer.
        asked_ms: u64,
    },
    /// Participant to participant, the answer to [`Message::PeerInquire`] of one that knows no
    /// decision and holds no prepare of `txn`: it has not voted yes for `txn` in the last
    /// `for_ms` milliseconds of its clock before answering (its memory of the transactions it
    /// prepared is complete that far back), and it votes no if a `Prepare` comes now.
    NoYesVote {
        /// The transaction.
        txn: TxnId,
        /// The answering participant.
        from: Peer,
        /// How far back, by the answerer's clock, it knows it never voted yes.
        for_ms: u64,
        /// The asker's `asked_ms`, echoed.
        asked_ms: u64,
    },
}

impl<W, R> Message<W, R> {
    /// The transaction the message is about.
    pub fn txn(&self) -> TxnId {
        match self {
            Message::Prepare { txn, .. }
            | Message::Vote { txn, .. }
            | Message::Decide { txn, .. }
            | Message::Ack { txn, .. }
            | Message::Inquire { txn, .. }
            | Message::PeerInquire { txn, .. }
            | Message::NoYesVote { txn, .. } => *txn,
        }
    }

    /// Whether the coordinator consumes it (`Vote`, `Ack`, `Inquire`) rather than a
    /// participant (`Prepare`, `Decide`, `PeerInquire`, `NoYesVote`).
    pub fn is_for_coordinator(&self) -> bool {
        matches!(
            self,
            Message::Vote { .. } | Message::Ack { .. } | Message::Inquire { .. }
        )
    }
}

/// How a transaction ended, as the client is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<R> {
    /// Committed; every participant's replies, in the order the work was given to `begin`.
    Committed(Vec<(Peer, R)>),
    /// Aborted: nothing of it is or will be visible.
    Aborted(AbortReason),
    /// The commit decision was not durable by the client deadline: it may commit or abort.
    Unknown,
}

/// Why a transaction aborted.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AbortReason {
    /// A participant voted no.
    Refused {
        /// Which.
        by: Peer,
        /// Its reason.
        refusal: Refusal,
    },
    /// Not every vote came within [`Config::vote_timeout_ms`].
    Timeout,
}

/// Timers and bounds of both roles.
#[derive(Debug, Clone)]
pub struct Config {
    /// How often the coordinator resends a `Prepare` to a participant that has not voted, and
    /// a commit `Decide` to one that has not acknowledged.
    pub resend_ms: u64,
    /// How long the coordinator waits for votes before it aborts; it counts no vote that
    /// arrives later. Participants rely on it when they ask each other: every node must use
    /// the same value.
    pub vote_timeout_ms: u64,
    /// How long after the commit decision is durable the coordinator waits for every
    /// acknowledgement before it answers the client `Committed` anyway. Answering then keeps
    /// real-time order: a participant that has not installed the writes still holds its
    /// locks (and takes them again at recovery, before serving), so a later transaction that
    /// touches those keys waits or is refused, and never reads what was there before.
    pub ack_wait_ms: u64,
    /// How long after `begin` the coordinator answers `Unknown` if its commit decision is
    /// still not durable (the storage is stalled).
    pub client_deadline_ms: u64,
    /// How long a prepared participant waits for the decision before it inquires.
    pub inquire_after_ms: u64,
    /// How often it inquires again.
    pub inquire_every_ms: u64,
    /// Most transactions one coordinator, or one participant, has in progress at once.
    pub txns_max: usize,
    /// How many finished transactions a participant remembers, to answer duplicate `Prepare`s
    /// without executing them again.
    pub finished_max: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            resend_ms: 200,
            vote_timeout_ms: 2000,
            ack_wait_ms: 500,
            client_deadline_ms: 5000,
            inquire_after_ms: 1000,
            inquire_every_ms: 1000,
            txns_max: 10_000,
            finished_max: 100_000,
        }
    }
}

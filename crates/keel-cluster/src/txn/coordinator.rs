//! The coordinator's side of two-phase commit (see the parent module for the protocol).
//!
//! It keeps, per transaction in progress, each participant's work (to resend `Prepare`),
//! vote and acknowledgement. Only commit decisions are logged ([`Action::LogCommit`]); an
//! aborted transaction is forgotten as soon as it is decided, and anything the coordinator has
//! no record of is answered abort (presumed abort). Everything is in memory and lost at a
//! crash, except the decisions the caller logged, which it hands back to
//! [`Coordinator::recover`] in the next incarnation.

use std::collections::BTreeMap;

use super::{AbortReason, Config, Decided, Message, Outcome, Peer, PrepareId, TxnId, Vote};

/// What the caller must do for the coordinator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action<W, R> {
    /// Send `msg` to node `to` (it may be this node: its participant).
    Send {
        /// The recipient.
        to: Peer,
        /// The message.
        msg: Message<W, R>,
    },
    /// Make this commit decision durable, then call [`Coordinator::logged`]. Until then no
    /// participant is told commit.
    LogCommit(Decision),
    /// Every participant installed the commit: the decision record may be dropped (lazily:
    /// if it survives a crash, it is sent again and acknowledged again, harmlessly).
    Forget(TxnId),
    /// Tell the client that began `txn` how it ended. Given once per transaction begun by
    /// this incarnation.
    Answer {
        /// The transaction.
        txn: TxnId,
        /// How it ended.
        outcome: Outcome<R>,
    },
}

/// A durable commit decision: the transaction and the prepare of each participant to commit.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Decision {
    /// The transaction.
    pub txn: TxnId,
    /// Every participant and the prepare whose yes vote was counted.
    pub participants: Vec<(Peer, PrepareId)>,
}

/// Why [`Coordinator::begin`] refused a transaction.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BeginError {
    /// No participant: nothing to commit.
    #[error("a transaction needs at least one participant")]
    Empty,
    /// A participant is named twice: its work must be given as one.
    #[error("participant {0} is named twice")]
    Duplicate(Peer),
    /// [`Config::txns_max`] transactions are in progress.
    #[error("too many transactions in progress ({0})")]
    Busy(usize),
}

/// The coordinator of one node (one incarnation of it).
#[derive(Debug)]
pub struct Coordinator<W, R> {
    me: Peer,
    incarnation: u64,
    seq_last: u64,
    config: Config,
    txns: BTreeMap<TxnId, Txn<W, R>>,
}

#[derive(Debug)]
struct Txn<W, R> {
    parts: Vec<Part<W, R>>,
    phase: Phase,
    began_ms: u64,
    /// When to resend `Prepare` (voting) or `Decide` (committing) to the silent.
    resend_at_ms: u64,
    /// A client of this incarnation waits for the answer (false once answered, and for
    /// recovered decisions).
    client_waits: bool,
}

#[derive(Debug)]
struct Part<W, R> {
    peer: Peer,
    /// The work, kept to resend `Prepare` until the vote arrives.
    work: Option<W>,
    /// The counted yes vote: its prepare, and the reply until the client has it.
    yes: Option<(PrepareId, Option<R>)>,
    /// The counted yes vote said the work only read.
    read_only: bool,
    acked: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Voting,
    /// Every vote is yes; the decision is being made durable.
    Logging,
    /// The decision is durable (since `durable_ms`); waiting for acknowledgements.
    Committing {
        durable_ms: u64,
    },
}

impl<W: Clone, R: Clone> Coordinator<W, R> {
    /// The coordinator of node `me`, in a process whose incarnation is `incarnation` (drawn
    /// at start, different from every earlier incarnation of this node).
    pub fn new(me: Peer, incarnation: u64, config: Config) -> Self {
        Coordinator {
            me,
            incarnation,
            seq_last: 0,
            config,
            txns: BTreeMap::new(),
        }
    }

    /// Takes back the durable commit decisions of earlier incarnations (after a restart) and
    /// sends them again. Call it before handing the coordinator any message: until then it
    /// would answer abort about a transaction decided commit. What the caller read back must
    /// be durable (a log read after a crash may show writes the kernel still holds), or a
    /// later incarnation could find it gone.
    pub fn recover(
        &mut self,
        now_ms: u64,
        decisions: impl IntoIterator<Item = Decision>,
        out: &mut Vec<Action<W, R>>,
    ) {
        for decision in decisions {
            assert_eq!(decision.txn.coordinator, self.me, "another node's decision");
            let parts = decision
                .participants
                .iter()
                .map(|&(peer, prepare)| Part {
                    peer,
                    work: None,
                    yes: Some((prepare, None)),
                    read_only: false,
                    acked: false,
                })
                .collect();
            let txn = Txn {
                parts,
                phase: Phase::Committing { durable_ms: now_ms },
                began_ms: now_ms,
                resend_at_ms: now_ms + self.config.resend_ms,
                client_waits: false,
            };
            send_decisions(decision.txn, &txn, out);
            self.txns.insert(decision.txn, txn);
        }
    }

    /// Begins a transaction whose participants and their work are `work`, and sends the
    /// `Prepare`s.
    pub fn begin(
        &mut self,
        now_ms: u64,
        work: Vec<(Peer, W)>,
        out: &mut Vec<Action<W, R>>,
    ) -> Result<TxnId, BeginError> {
        if work.is_empty() {
            return Err(BeginError::Empty);
        }
        for (i, (peer, _)) in work.iter().enumerate() {
            if work[..i].iter().any(|(p, _)| p == peer) {
                return Err(BeginError::Duplicate(*peer));
            }
        }
        if self.txns.len() >= self.config.txns_max {
            return Err(BeginError::Busy(self.txns.len()));
        }
        self.seq_last += 1;
        let id = TxnId {
            coordinator: self.me,
            incarnation: self.incarnation,
            seq: self.seq_last,
        };
        let txn = Txn {
            parts: work
                .into_iter()
                .map(|(peer, work)| Part {
                    peer,
                    work: Some(work),
                    yes: None,
                    read_only: false,
                    acked: false,
                })
                .collect(),
            phase: Phase::Voting,
            began_ms: now_ms,
            resend_at_ms: now_ms + self.config.resend_ms,
            client_waits: true,
        };
        send_prepares(id, &txn, out);
        self.txns.insert(id, txn);
        Ok(id)
    }

    /// Consumes a message for the coordinator (`Vote`, `Ack`, `Inquire`) at `now_ms`; others
    /// are ignored.
    pub fn handle(&mut self, now_ms: u64, msg: Message<W, R>, out: &mut Vec<Action<W, R>>) {
        match msg {
            Message::Vote { txn, from, vote } => self.on_vote(now_ms, txn, from, vote, out),
            Message::Inquire { txn, from, .. } => self.on_inquire(txn, from, out),
            Message::Ack { txn, from } => self.on_ack(txn, from, out),
            Message::Prepare { .. }
            | Message::Decide { .. }
            | Message::PeerInquire { .. }
            | Message::NoYesVote { .. } => {}
        }
    }

    fn on_vote(
        &mut self,
        now_ms: u64,
        id: TxnId,
        from: Peer,
        vote: Vote<R>,
        out: &mut Vec<Action<W, R>>,
    ) {
        if id.coordinator != self.me {
            return;
        }
        let Some(txn) = self.txns.get_mut(&id) else {
            // Aborted, or committed and acknowledged by everyone, or of an earlier
            // incarnation and never decided commit: whatever `from` prepared must go.
            if matches!(vote, Vote::Yes { .. }) {
                out.push(send(from, id, Decided::Abort));
            }
            return;
        };
        let Some(i) = txn.parts.iter().position(|p| p.peer == from) else {
            return;
        };
        // No vote counts after the vote deadline, even when the tick that aborts is late (a
        // stalled process): participants that ask each other rely on a commit decision
        // never counting a vote cast later than `vote_timeout_ms` after `begin`.
        if txn.phase == Phase::Voting && now_ms >= txn.began_ms + self.config.vote_timeout_ms {
            self.abort(id, AbortReason::Timeout, out);
            return;
        }
        match (txn.phase, vote) {
            (
                Phase::Voting,
                Vote::Yes {
                    prepare,
                    reply,
                    read_only,
                },
            ) => {
                let part = &mut txn.parts[i];
                if part.yes.is_some() {
                    return;
                }
                part.yes = Some((prepare, Some(reply)));
                part.read_only = read_only;
                part.work = None;
                if !txn.parts.iter().all(|p| p.yes.is_some()) {
                    return;
                }
                if txn.parts.iter().all(|p| p.read_only) {
                    // Nothing to install anywhere: answer now, and release everyone (see
                    // "Read-only transactions" in `txn.rs`).
                    answer_committed(id, txn, out);
                    for part in &txn.parts {
                        out.push(send(part.peer, id, Decided::Abort));
                    }
                    self.txns.remove(&id);
                    return;
                }
                txn.phase = Phase::Logging;
                out.push(Action::LogCommit(decision(id, txn)));
            }
            (Phase::Voting, Vote::No(refusal)) => {
                let reason = AbortReason::Refused { by: from, refusal };
                self.abort(id, reason, out);
            }
            // The decision is being logged: it is sent to everyone once durable.
            (Phase::Logging, _) | (Phase::Committing { .. }, Vote::No(_)) => {}
            // A lost `Decide`, or a stale re-prepare: the decision names the counted prepare.
            (Phase::Committing { .. }, Vote::Yes { .. }) => {
                out.push(send_decision(id, txn, &txn.parts[i]));
            }
        }
    }

    fn on_inquire(&mut self, id: TxnId, from: Peer, out: &mut Vec<Action<W, R>>) {
        if id.coordinator != self.me {
            return;
        }
        let Some(txn) = self.txns.get(&id) else {
            out.push(send(from, id, Decided::Abort));
            return;
        };
        let Some(part) = txn.parts.iter().find(|p| p.peer == from) else {
            return;
        };
        // Undecided: the participant hears the decision when it is made.
        if let Phase::Committing { .. } = txn.phase {
            out.push(send_decision(id, txn, part));
        }
    }

    fn on_ack(&mut self, id: TxnId, from: Peer, out: &mut Vec<Action<W, R>>) {
        let Some(txn) = self.txns.get_mut(&id) else {
            return;
        };
        if !matches!(txn.phase, Phase::Committing { .. }) {
            return;
        }
        if let Some(part) = txn.parts.iter_mut().find(|p| p.peer == from) {
            part.acked = true;
        }
        if txn.parts.iter().all(|p| p.acked) {
            let mut txn = self.txns.remove(&id).expect("found above");
            out.push(Action::Forget(id));
            answer_committed(id, &mut txn, out);
        }
    }

    /// The decision of `txn` given in [`Action::LogCommit`] is durable: tell the participants.
    pub fn logged(&mut self, now_ms: u64, id: TxnId, out: &mut Vec<Action<W, R>>) {
        let Some(txn) = self.txns.get_mut(&id) else {
            return;
        };
        if txn.phase != Phase::Logging {
            return;
        }
        txn.phase = Phase::Committing { durable_ms: now_ms };
        txn.resend_at_ms = now_ms + self.config.resend_ms;
        send_decisions(id, txn, out);
    }

    /// Resends what went unanswered and acts on the deadlines that passed by `now_ms`.
    pub fn tick(&mut self, now_ms: u64, out: &mut Vec<Action<W, R>>) {
        let mut timed_out = Vec::new();
        for (&id, txn) in &mut self.txns {
            match txn.phase {
                Phase::Voting => {
                    if now_ms >= txn.began_ms + self.config.vote_timeout_ms {
                        timed_out.push(id);
                    } else if now_ms >= txn.resend_at_ms {
                        txn.resend_at_ms = now_ms + self.config.resend_ms;
                        send_prepares(id, txn, out);
                    }
                }
                Phase::Logging => {
                    if txn.client_waits && now_ms >= txn.began_ms + self.config.client_deadline_ms {
                        txn.client_waits = false;
                        out.push(Action::Answer {
                            txn: id,
                            outcome: Outcome::Unknown,
                        });
                    }
                }
                Phase::Committing { durable_ms } => {
                    if now_ms >= txn.resend_at_ms {
                        txn.resend_at_ms = now_ms + self.config.resend_ms;
                        send_decisions(id, txn, out);
                    }
                    if now_ms >= durable_ms + self.config.ack_wait_ms {
                        answer_committed(id, txn, out);
                    }
                }
            }
        }
        for id in timed_out {
            self.abort(id, AbortReason::Timeout, out);
        }
    }

    /// Decides abort: answers the client and tells every participant; nothing is logged.
    fn abort(&mut self, id: TxnId, reason: AbortReason, out: &mut Vec<Action<W, R>>) {
        let txn = self
            .txns
            .remove(&id)
            .expect("aborting a transaction in progress");
        assert_eq!(txn.phase, Phase::Voting, "abort after the decision");
        for part in &txn.parts {
            // One that refused holds nothing; one not heard from may prepare still, and
            // hears abort now or at its inquiry.
            let refused = matches!(reason, AbortReason::Refused { by, .. } if by == part.peer);
            if !refused {
                out.push(send(part.peer, id, Decided::Abort));
            }
        }
        if txn.client_waits {
            out.push(Action::Answer {
                txn: id,
                outcome: Outcome::Aborted(reason),
            });
        }
    }

    /// Transactions in progress (begun and not answered and forgotten, or recovered and not
    /// acknowledged by every participant).
    pub fn len(&self) -> usize {
        self.txns.len()
    }

    /// Whether no transaction is in progress.
    pub fn is_empty(&self) -> bool {
        self.txns.is_empty()
    }

    /// This coordinator's node.
    pub fn me(&self) -> Peer {
        self.me
    }
}

fn send<W, R>(to: Peer, txn: TxnId, decision: Decided) -> Action<W, R> {
    Action::Send {
        to,
        msg: Message::Decide { txn, decision },
    }
}

/// The commit decision, to `part`: every participant's counted prepare.
fn send_decision<W, R>(id: TxnId, txn: &Txn<W, R>, part: &Part<W, R>) -> Action<W, R> {
    send(
        part.peer,
        id,
        Decided::Commit(decision(id, txn).participants),
    )
}

fn send_decisions<W, R>(id: TxnId, txn: &Txn<W, R>, out: &mut Vec<Action<W, R>>) {
    for part in txn.parts.iter().filter(|p| !p.acked) {
        out.push(send_decision(id, txn, part));
    }
}

fn send_prepares<W: Clone, R>(id: TxnId, txn: &Txn<W, R>, out: &mut Vec<Action<W, R>>) {
    let participants: Vec<Peer> = txn.parts.iter().map(|p| p.peer).collect();
    for part in &txn.parts {
        if let Some(work) = &part.work {
            out.push(Action::Send {
                to: part.peer,
                msg: Message::Prepare {
                    txn: id,
                    participants: participants.clone(),
                    work: work.clone(),
                },
            });
        }
    }
}

fn decision<W, R>(id: TxnId, txn: &Txn<W, R>) -> Decision {
    Decision {
        txn: id,
        participants: txn
            .parts
            .iter()
            .map(|p| (p.peer, p.yes.as_ref().expect("every vote is yes").0))
            .collect(),
    }
}

fn answer_committed<W, R>(id: TxnId, txn: &mut Txn<W, R>, out: &mut Vec<Action<W, R>>) {
    if !txn.client_waits {
        return;
    }
    txn.client_waits = false;
    let replies = txn
        .parts
        .iter_mut()
        .map(|p| {
            let (_, reply) = p.yes.as_mut().expect("a commit decision has every vote");
            (p.peer, reply.take().expect("replies are taken once"))
        })
        .collect();
    out.push(Action::Answer {
        txn: id,
        outcome: Outcome::Committed(replies),
    });
}

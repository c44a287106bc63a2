//! A partition's side of two-phase commit (see the parent module for the protocol).
//!
//! Storage is asynchronous: the participant asks for a prepare, a commit or an abort with an
//! [`Action`], and the caller reports a finished prepare ([`Participant::prepared`]) or a
//! durable commit ([`Participant::committed`]) later. The caller must carry out the storage
//! actions in the order they are emitted. What the caller's storage keeps durably for a
//! prepare (the transaction, its [`PrepareId`], its writes and locks, and the reply) comes
//! back through [`Participant::recover`] after a restart; everything else here is volatile.
//!
//! Invariants: a prepare is committed only when a commit decision names its [`PrepareId`];
//! a yes vote is sent only once its prepare is durable; an acknowledgement only once the
//! commit is durable (a participant that acknowledged never needs the decision again).
//!
//! Cooperative termination: a prepared participant whose coordinator left an inquiry
//! unanswered also asks the other participants ([`Message::PeerInquire`]). One that knows the
//! decision tells it ([`Message::Decide`], the same as the coordinator's); one that holds no
//! prepare and knows no decision answers [`Message::NoYesVote`]: how far back its memory of
//! the transactions it voted yes for is complete (its *horizon*: when this incarnation
//! started, or when the newest transaction it forgot had finished), and it refuses the
//! transaction from then on. The asker aborts on that answer only if it proves that no yes
//! vote of the answerer can have been counted: see [`Participant::handle`] and
//! docs/cluster.md, "Cooperative termination".

use std::collections::{BTreeMap, VecDeque};

use super::{Config, Decided, Message, Peer, PrepareId, Refusal, TxnId, Vote};

/// A commit decision: every participant and its counted prepare.
type Decision = Vec<(Peer, PrepareId)>;

/// What the caller must do for the participant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action<W, R> {
    /// Send `msg` to node `to`.
    Send {
        /// The recipient.
        to: Peer,
        /// The message.
        msg: Message<W, R>,
    },
    /// Execute `work` against the partition, lock what it touched, and make a prepared record
    /// (`txn`, `prepare`, the writes, the reply) durable; then call
    /// [`Participant::prepared`] with the reply, or with a refusal if it could not (nothing
    /// stays locked then).
    Prepare {
        /// The transaction.
        txn: TxnId,
        /// This execution's id, to keep in the record.
        prepare: PrepareId,
        /// Every participant of the transaction.
        participants: Vec<Peer>,
        /// The work.
        work: W,
    },
    /// Install the writes of prepared record `prepare`, release its locks, and make that
    /// durable; then call [`Participant::committed`].
    Commit {
        /// The transaction.
        txn: TxnId,
        /// Which prepared record.
        prepare: PrepareId,
    },
    /// Drop prepared record `prepare` and release its locks. Nothing is reported back, and
    /// the drop need not be durable at once: a record that comes back after a crash is
    /// inquired about and aborted again.
    Abort {
        /// The transaction.
        txn: TxnId,
        /// Which prepared record.
        prepare: PrepareId,
    },
}

/// A durable prepared record, given back to [`Participant::recover`] after a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovered<R> {
    /// The transaction.
    pub txn: TxnId,
    /// Which execution of its prepare.
    pub prepare: PrepareId,
    /// Every participant of the transaction (from the `Prepare`), to ask when the
    /// coordinator does not answer.
    pub participants: Vec<Peer>,
    /// The reply the prepare voted with (to vote again if the coordinator asks).
    pub reply: R,
}

/// The participant of one node (one incarnation of it).
#[derive(Debug)]
pub struct Participant<R> {
    me: Peer,
    incarnation: u64,
    prepare_last: u64,
    config: Config,
    txns: BTreeMap<TxnId, Txn<R>>,
    /// Finished transactions, oldest first in `finished_order` with when each finished, at
    /// most [`Config::finished_max`].
    finished: BTreeMap<TxnId, Finished>,
    finished_order: VecDeque<(TxnId, u64)>,
    /// Since when (this participant's clock) it remembers every transaction it voted yes
    /// for: its first clock reading, raised to the finish time of each finished transaction
    /// it forgets. `None` until the first call that gives the time.
    horizon_ms: Option<u64>,
}

#[derive(Debug)]
enum Txn<R> {
    /// The storage is preparing; `doom` says how the transaction already ended elsewhere
    /// (the prepare is aborted when it completes).
    Preparing {
        prepare: PrepareId,
        participants: Vec<Peer>,
        doom: Option<Finished>,
    },
    /// Prepared and voted yes; waiting for the decision.
    Prepared {
        prepare: PrepareId,
        reply: R,
        /// The work only read (see [`Vote::Yes`]).
        read_only: bool,
        participants: Vec<Peer>,
        /// When the yes vote was first sent, by this incarnation's clock; `None` for a record
        /// recovered from an earlier incarnation (its age is unknown).
        voted_ms: Option<u64>,
        inquire_at_ms: u64,
        /// Inquiries sent to the coordinator; from the second on, the others are asked too.
        inquiries: u32,
    },
    /// Told to commit; the storage is installing.
    Committing {
        prepare: PrepareId,
        decision: Decision,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Finished {
    /// Committed, by this decision.
    Committed(Decision),
    /// Aborted, as the coordinator said, or a participant that knew. (Not what a
    /// [`Message::NoYesVote`] proves: that is only that this participant's own prepare was
    /// not counted, and the transaction may have committed with an earlier prepare of it.)
    Aborted,
    /// This participant voted no (or promised a peer to), and had voted no yes for the
    /// transaction since `horizon_ms` when it did.
    Refused { refusal: Refusal, horizon_ms: u64 },
}

impl<R: Clone> Participant<R> {
    /// The participant of node `me`, in a process whose incarnation is `incarnation` (drawn at
    /// start, different from every earlier incarnation of this node).
    pub fn new(me: Peer, incarnation: u64, config: Config) -> Self {
        Participant {
            me,
            incarnation,
            prepare_last: 0,
            config,
            txns: BTreeMap::new(),
            finished: BTreeMap::new(),
            finished_order: VecDeque::new(),
            horizon_ms: None,
        }
    }

    /// Takes back the durable prepared records of earlier incarnations (after a restart; the
    /// storage holds their locks again before it serves anything) and asks their coordinators
    /// for the decisions. Call it before handing the participant any message.
    pub fn recover<W>(
        &mut self,
        now_ms: u64,
        records: impl IntoIterator<Item = Recovered<R>>,
        out: &mut Vec<Action<W, R>>,
    ) {
        self.clock(now_ms);
        for record in records {
            out.push(self.inquiry(record.txn, record.prepare));
            self.txns.insert(
                record.txn,
                Txn::Prepared {
                    prepare: record.prepare,
                    reply: record.reply,
                    // A prepare that only read logs nothing, so none is recovered.
                    read_only: false,
                    participants: record.participants,
                    voted_ms: None,
                    inquire_at_ms: now_ms + self.config.inquire_every_ms,
                    inquiries: 1,
                },
            );
        }
    }

    /// Consumes a message for the participant (`Prepare`, `Decide`, `PeerInquire`,
    /// `NoYesVote`) at `now_ms`; others are ignored.
    ///
    /// A `NoYesVote` from a participant aborts this participant's prepare only if both hold,
    /// with `window` twice [`Config::vote_timeout_ms`] and `voted` when this prepare first
    /// voted yes (by this incarnation's clock; a prepare recovered from an earlier
    /// incarnation never aborts on it):
    ///
    /// - the question was asked at least `window` after `voted`: the coordinator began the
    ///   transaction before `voted` and counts no vote later than the vote timeout after
    ///   that, so the answerer's voting time was over when it answered;
    /// - the answerer's memory reaches more than `window` before `voted`: had this prepare's
    ///   yes vote been counted, it arrived within the vote timeout of the begin, so the
    ///   answerer's counted yes vote, cast after the begin, is inside its memory, and it would
    ///   not have answered so.
    ///
    /// So no yes vote of the answerer can be counted, and the transaction cannot commit, or
    /// it committed with another prepare of this participant (this one is a stale
    /// re-prepare). `window` is twice the vote timeout to allow for clocks that measure time
    /// at slightly different rates.
    pub fn handle<W>(&mut self, now_ms: u64, msg: Message<W, R>, out: &mut Vec<Action<W, R>>) {
        self.clock(now_ms);
        match msg {
            Message::Prepare {
                txn,
                participants,
                work,
            } => self.on_prepare(txn, participants, work, out),
            Message::Decide { txn, decision } => self.on_decide(now_ms, txn, decision, out),
            Message::PeerInquire {
                txn,
                from,
                asked_ms,
            } => self.on_peer_inquire(now_ms, txn, from, asked_ms, out),
            Message::NoYesVote {
                txn,
                for_ms,
                asked_ms,
                ..
            } => self.on_no_yes_vote(now_ms, txn, for_ms, asked_ms, out),
            Message::Vote { .. } | Message::Ack { .. } | Message::Inquire { .. } => {}
        }
    }

    fn on_prepare<W>(
        &mut self,
        id: TxnId,
        participants: Vec<Peer>,
        work: W,
        out: &mut Vec<Action<W, R>>,
    ) {
        match self.txns.get(&id) {
            // The vote goes out when the storage is done, or went out already.
            Some(Txn::Preparing { .. } | Txn::Committing { .. }) => return,
            Some(Txn::Prepared {
                prepare,
                reply,
                read_only,
                ..
            }) => {
                let vote = Vote::Yes {
                    prepare: *prepare,
                    reply: reply.clone(),
                    read_only: *read_only,
                };
                out.push(self.vote(id, vote));
                return;
            }
            None => {}
        }
        match self.finished.get(&id) {
            Some(Finished::Committed(_)) => return,
            Some(Finished::Aborted) => {
                out.push(self.vote(id, Vote::No(Refusal::Finished)));
                return;
            }
            Some(Finished::Refused { refusal, .. }) => {
                let refusal = refusal.clone();
                out.push(self.vote(id, Vote::No(refusal)));
                return;
            }
            None => {}
        }
        if self.txns.len() >= self.config.txns_max {
            out.push(self.vote(id, Vote::No(Refusal::Overloaded)));
            return;
        }
        self.prepare_last += 1;
        let prepare = PrepareId {
            incarnation: self.incarnation,
            seq: self.prepare_last,
        };
        self.txns.insert(
            id,
            Txn::Preparing {
                prepare,
                participants: participants.clone(),
                doom: None,
            },
        );
        out.push(Action::Prepare {
            txn: id,
            prepare,
            participants,
            work,
        });
    }

    fn on_decide<W>(
        &mut self,
        now_ms: u64,
        id: TxnId,
        decision: Decided,
        out: &mut Vec<Action<W, R>>,
    ) {
        let counted = match &decision {
            Decided::Commit(_) => match decision.counted(self.me) {
                Some(counted) => Some(counted),
                // Not a participant: not for this node.
                None => return,
            },
            Decided::Abort => None,
        };
        let Some(txn) = self.txns.get_mut(&id) else {
            // A commit of a prepare this participant no longer holds: that prepare was
            // installed (nothing else ends a prepare of a transaction decided commit), and
            // the acknowledgement was lost.
            if counted.is_some() {
                out.push(self.ack(id));
            }
            return;
        };
        match (txn, decision) {
            (Txn::Preparing { prepare, doom, .. }, Decided::Commit(all)) => {
                // This prepare voted nothing yet, so it is not the counted one: a stale
                // re-prepare of a transaction committed here before.
                assert_ne!(
                    Some(*prepare),
                    counted,
                    "commit of a prepare that has not voted"
                );
                *doom = Some(Finished::Committed(all));
                out.push(self.ack(id));
            }
            (Txn::Preparing { doom, .. }, Decided::Abort) => {
                *doom = Some(Finished::Aborted);
            }
            (Txn::Prepared { prepare, .. }, Decided::Commit(all)) if Some(*prepare) == counted => {
                let prepare = *prepare;
                self.txns.insert(
                    id,
                    Txn::Committing {
                        prepare,
                        decision: all,
                    },
                );
                out.push(Action::Commit { txn: id, prepare });
            }
            (Txn::Prepared { prepare, .. }, Decided::Commit(all)) => {
                // Stale re-prepare; the counted prepare was installed before.
                out.push(Action::Abort {
                    txn: id,
                    prepare: *prepare,
                });
                self.txns.remove(&id);
                self.finish(now_ms, id, Finished::Committed(all));
                out.push(self.ack(id));
            }
            (Txn::Prepared { prepare, .. }, Decided::Abort) => {
                out.push(Action::Abort {
                    txn: id,
                    prepare: *prepare,
                });
                self.txns.remove(&id);
                self.finish(now_ms, id, Finished::Aborted);
            }
            // Installing: acknowledged when durable. A decision never changes, so a commit
            // names the same prepare again.
            (Txn::Committing { prepare, .. }, Decided::Commit(_)) => {
                assert_eq!(Some(*prepare), counted, "two commit decisions for {id}");
            }
            // An abort cannot follow a commit decision: the coordinator keeps that until
            // every participant acknowledged it. Ignored rather than trusted.
            (Txn::Committing { .. }, Decided::Abort) => {}
        }
    }

    /// Another participant of `id` asks what this one knows.
    fn on_peer_inquire<W>(
        &mut self,
        now_ms: u64,
        id: TxnId,
        from: Peer,
        asked_ms: u64,
        out: &mut Vec<Action<W, R>>,
    ) {
        let known = match self.txns.get(&id) {
            // Undecided here too: no answer.
            Some(Txn::Preparing { doom: None, .. } | Txn::Prepared { .. }) => return,
            Some(Txn::Preparing {
                doom: Some(doom), ..
            }) => doom.clone(),
            Some(Txn::Committing { decision, .. }) => Finished::Committed(decision.clone()),
            None => match self.finished.get(&id) {
                Some(finished) => finished.clone(),
                None => {
                    // Never voted yes since the horizon, and from now on votes no.
                    let refused = Finished::Refused {
                        refusal: Refusal::Finished,
                        horizon_ms: self.horizon(),
                    };
                    self.finish(now_ms, id, refused.clone());
                    refused
                }
            },
        };
        let msg = match known {
            Finished::Committed(all) => Message::Decide {
                txn: id,
                decision: Decided::Commit(all),
            },
            Finished::Aborted => Message::Decide {
                txn: id,
                decision: Decided::Abort,
            },
            Finished::Refused { horizon_ms, .. } => Message::NoYesVote {
                txn: id,
                from: self.me,
                for_ms: now_ms.saturating_sub(horizon_ms),
                asked_ms,
            },
        };
        out.push(Action::Send { to: from, msg });
    }

    /// A participant that never voted yes lately answered this one's question.
    fn on_no_yes_vote<W>(
        &mut self,
        now_ms: u64,
        id: TxnId,
        for_ms: u64,
        asked_ms: u64,
        out: &mut Vec<Action<W, R>>,
    ) {
        let window = self.config.vote_timeout_ms.saturating_mul(2);
        let Some(Txn::Prepared {
            prepare,
            voted_ms: Some(voted),
            ..
        }) = self.txns.get(&id)
        else {
            return;
        };
        let (prepare, voted) = (*prepare, *voted);
        let asked_late = asked_ms <= now_ms && asked_ms >= voted.saturating_add(window);
        let remembers = for_ms > now_ms.saturating_sub(voted).saturating_add(window);
        if !(asked_late && remembers) {
            return;
        }
        out.push(Action::Abort { txn: id, prepare });
        self.txns.remove(&id);
        // Not `Aborted`, which others would take as the decision: the transaction may have
        // committed with an earlier prepare of this participant's, which it forgot, and
        // another participant may hold its counted prepare still. What this one knows is
        // that it voted yes for it last when this prepare did.
        let refused = Finished::Refused {
            refusal: Refusal::Finished,
            horizon_ms: voted,
        };
        self.finish(now_ms, id, refused);
    }

    /// The storage finished the prepare of `txn`: `Ok` with the reply once the prepared
    /// record is durable, or the refusal (nothing of it is kept or locked).
    pub fn prepared<W>(
        &mut self,
        now_ms: u64,
        id: TxnId,
        result: Result<R, Refusal>,
        out: &mut Vec<Action<W, R>>,
    ) {
        self.prepared_as(now_ms, id, result, false, out);
    }

    /// [`Participant::prepared`] of a prepare whose work only read: its yes vote says so
    /// ([`Vote::Yes`]), so that a transaction of such prepares only is answered and released
    /// without a logged decision.
    pub fn prepared_read_only<W>(
        &mut self,
        now_ms: u64,
        id: TxnId,
        result: Result<R, Refusal>,
        out: &mut Vec<Action<W, R>>,
    ) {
        self.prepared_as(now_ms, id, result, true, out);
    }

    fn prepared_as<W>(
        &mut self,
        now_ms: u64,
        id: TxnId,
        result: Result<R, Refusal>,
        read_only: bool,
        out: &mut Vec<Action<W, R>>,
    ) {
        self.clock(now_ms);
        let Some(Txn::Preparing {
            prepare,
            participants,
            doom,
        }) = self.txns.remove(&id)
        else {
            panic!("prepare of {id} completed, but none was started");
        };
        match (result, doom) {
            (Ok(_), Some(doom)) => {
                out.push(Action::Abort { txn: id, prepare });
                self.finish(now_ms, id, doom);
            }
            (Ok(reply), None) => {
                let vote = Vote::Yes {
                    prepare,
                    reply: reply.clone(),
                    read_only,
                };
                out.push(self.vote(id, vote));
                self.txns.insert(
                    id,
                    Txn::Prepared {
                        prepare,
                        reply,
                        read_only,
                        participants,
                        voted_ms: Some(now_ms),
                        inquire_at_ms: now_ms + self.config.inquire_after_ms,
                        inquiries: 0,
                    },
                );
            }
            (Err(_), Some(doom)) => self.finish(now_ms, id, doom),
            (Err(refusal), None) => {
                out.push(self.vote(id, Vote::No(refusal.clone())));
                let horizon_ms = self.horizon();
                self.finish(
                    now_ms,
                    id,
                    Finished::Refused {
                        refusal,
                        horizon_ms,
                    },
                );
            }
        }
    }

    /// The storage installed the commit of `txn` durably: acknowledge it.
    pub fn committed<W>(&mut self, now_ms: u64, id: TxnId, out: &mut Vec<Action<W, R>>) {
        self.clock(now_ms);
        let Some(Txn::Committing { decision, .. }) = self.txns.remove(&id) else {
            panic!("commit of {id} completed, but none was started");
        };
        self.finish(now_ms, id, Finished::Committed(decision));
        out.push(self.ack(id));
    }

    /// Inquires about the prepared transactions whose decision is overdue at `now_ms`: of the
    /// coordinator, and from the second inquiry on of the other participants too, once a vote
    /// timeout has passed since this participant's vote. Before that the coordinator may still
    /// be collecting votes, and a participant whose `Prepare` is still on its way would refuse
    /// it on being asked, aborting a transaction that could commit.
    pub fn tick<W>(&mut self, now_ms: u64, out: &mut Vec<Action<W, R>>) {
        self.clock(now_ms);
        let mut due = Vec::new();
        for (&id, txn) in &mut self.txns {
            if let Txn::Prepared {
                prepare,
                participants,
                voted_ms,
                inquire_at_ms,
                inquiries,
                ..
            } = txn
                && now_ms >= *inquire_at_ms
            {
                *inquire_at_ms = now_ms + self.config.inquire_every_ms;
                *inquiries += 1;
                let voting_over = voted_ms
                    .is_none_or(|v| now_ms >= v.saturating_add(self.config.vote_timeout_ms));
                let peers = if *inquiries > 1 && voting_over {
                    participants.clone()
                } else {
                    Vec::new()
                };
                due.push((id, *prepare, peers));
            }
        }
        for (id, prepare, peers) in due {
            out.push(self.inquiry(id, prepare));
            for peer in peers.into_iter().filter(|&p| p != self.me) {
                out.push(Action::Send {
                    to: peer,
                    msg: Message::PeerInquire {
                        txn: id,
                        from: self.me,
                        asked_ms: now_ms,
                    },
                });
            }
        }
    }

    /// Transactions in progress (preparing, prepared or committing).
    pub fn len(&self) -> usize {
        self.txns.len()
    }

    /// Whether no transaction is in progress.
    pub fn is_empty(&self) -> bool {
        self.txns.is_empty()
    }

    /// Starts the horizon at the first clock reading of this incarnation: every yes vote of
    /// this incarnation comes later, and earlier incarnations' still prepared records are
    /// recovered (a later reading than the true start only shortens what it vouches for).
    fn clock(&mut self, now_ms: u64) {
        self.horizon_ms.get_or_insert(now_ms);
    }

    fn horizon(&self) -> u64 {
        self.horizon_ms
            .expect("set by the call that gives the time")
    }

    fn finish(&mut self, now_ms: u64, id: TxnId, how: Finished) {
        let before = self.finished.insert(id, how);
        debug_assert!(before.is_none(), "{id} finished twice");
        if before.is_none() {
            self.finished_order.push_back((id, now_ms));
        }
        while self.finished_order.len() > self.config.finished_max {
            let (oldest, finished_ms) = self
                .finished_order
                .pop_front()
                .expect("longer than the bound");
            self.finished.remove(&oldest);
            // Every transaction finished after it is still remembered: a yes vote cast
            // after `finished_ms` belongs to one of those, or to one in progress.
            let horizon = self.horizon_ms.get_or_insert(finished_ms);
            *horizon = (*horizon).max(finished_ms);
        }
    }

    fn vote<W>(&self, id: TxnId, vote: Vote<R>) -> Action<W, R> {
        Action::Send {
            to: id.coordinator,
            msg: Message::Vote {
                txn: id,
                from: self.me,
                vote,
            },
        }
    }

    fn ack<W>(&self, id: TxnId) -> Action<W, R> {
        Action::Send {
            to: id.coordinator,
            msg: Message::Ack {
                txn: id,
                from: self.me,
            },
        }
    }

    fn inquiry<W>(&self, id: TxnId, prepare: PrepareId) -> Action<W, R> {
        Action::Send {
            to: id.coordinator,
            msg: Message::Inquire {
                txn: id,
                from: self.me,
                prepare,
            },
        }
    }
}

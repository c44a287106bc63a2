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

use std::collections::{BTreeMap, VecDeque};

use super::{Config, Decided, Message, Peer, PrepareId, Refusal, TxnId, Vote};

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
    /// Finished transactions, oldest first in `finished_order`, at most
    /// [`Config::finished_max`].
    finished: BTreeMap<TxnId, Finished>,
    finished_order: VecDeque<TxnId>,
}

#[derive(Debug)]
enum Txn<R> {
    /// The storage is preparing; `doom` says how the transaction already ended elsewhere
    /// (the prepare is aborted when it completes).
    Preparing {
        prepare: PrepareId,
        doom: Option<Finished>,
    },
    /// Prepared and voted yes; waiting for the decision.
    Prepared {
        prepare: PrepareId,
        reply: R,
        inquire_at_ms: u64,
    },
    /// Told to commit; the storage is installing.
    Committing { prepare: PrepareId },
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Finished {
    Committed,
    /// Aborted; the refusal if this participant voted no.
    Aborted(Option<Refusal>),
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
        for record in records {
            out.push(self.inquiry(record.txn, record.prepare));
            self.txns.insert(
                record.txn,
                Txn::Prepared {
                    prepare: record.prepare,
                    reply: record.reply,
                    inquire_at_ms: now_ms + self.config.inquire_every_ms,
                },
            );
        }
    }

    /// Consumes a message for the participant (`Prepare`, `Decide`); others are ignored.
    pub fn handle<W>(&mut self, msg: Message<W, R>, out: &mut Vec<Action<W, R>>) {
        match msg {
            Message::Prepare {
                txn,
                participants,
                work,
            } => self.on_prepare(txn, participants, work, out),
            Message::Decide { txn, decision } => self.on_decide(txn, decision, out),
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
            Some(Txn::Prepared { prepare, reply, .. }) => {
                let vote = Vote::Yes {
                    prepare: *prepare,
                    reply: reply.clone(),
                };
                out.push(self.vote(id, vote));
                return;
            }
            None => {}
        }
        match self.finished.get(&id) {
            Some(Finished::Committed) => return,
            Some(Finished::Aborted(refusal)) => {
                let refusal = refusal.clone().unwrap_or(Refusal::Finished);
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

    fn on_decide<W>(&mut self, id: TxnId, decision: Decided, out: &mut Vec<Action<W, R>>) {
        let Some(txn) = self.txns.get_mut(&id) else {
            // A commit of a prepare this participant no longer holds: that prepare was
            // installed (nothing else ends a prepare of a transaction decided commit), and
            // the acknowledgement was lost.
            if let Decided::Commit(_) = decision {
                out.push(self.ack(id));
            }
            return;
        };
        match (txn, decision) {
            (Txn::Preparing { prepare, doom }, Decided::Commit(counted)) => {
                // This prepare voted nothing yet, so it is not the counted one: a stale
                // re-prepare of a transaction committed here before.
                assert_ne!(*prepare, counted, "commit of a prepare that has not voted");
                *doom = Some(Finished::Committed);
                out.push(self.ack(id));
            }
            (Txn::Preparing { doom, .. }, Decided::Abort) => {
                *doom = Some(Finished::Aborted(None));
            }
            (Txn::Prepared { prepare, .. }, Decided::Commit(counted)) if *prepare == counted => {
                let prepare = *prepare;
                self.txns.insert(id, Txn::Committing { prepare });
                out.push(Action::Commit { txn: id, prepare });
            }
            (Txn::Prepared { prepare, .. }, Decided::Commit(_)) => {
                // Stale re-prepare; the counted prepare was installed before.
                out.push(Action::Abort {
                    txn: id,
                    prepare: *prepare,
                });
                self.txns.remove(&id);
                self.finish(id, Finished::Committed);
                out.push(self.ack(id));
            }
            (Txn::Prepared { prepare, .. }, Decided::Abort) => {
                out.push(Action::Abort {
                    txn: id,
                    prepare: *prepare,
                });
                self.txns.remove(&id);
                self.finish(id, Finished::Aborted(None));
            }
            // Installing: acknowledged when durable. A decision never changes, so a commit
            // names the same prepare again.
            (Txn::Committing { prepare }, Decided::Commit(counted)) => {
                assert_eq!(*prepare, counted, "two commit decisions for {id}");
            }
            // An abort cannot follow a commit decision: the coordinator keeps that until
            // every participant acknowledged it. Ignored rather than trusted.
            (Txn::Committing { .. }, Decided::Abort) => {}
        }
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
        let Some(Txn::Preparing { prepare, doom }) = self.txns.remove(&id) else {
            panic!("prepare of {id} completed, but none was started");
        };
        match (result, doom) {
            (Ok(_), Some(doom)) => {
                out.push(Action::Abort { txn: id, prepare });
                self.finish(id, doom);
            }
            (Ok(reply), None) => {
                let vote = Vote::Yes {
                    prepare,
                    reply: reply.clone(),
                };
                out.push(self.vote(id, vote));
                self.txns.insert(
                    id,
                    Txn::Prepared {
                        prepare,
                        reply,
                        inquire_at_ms: now_ms + self.config.inquire_after_ms,
                    },
                );
            }
            (Err(_), Some(doom)) => self.finish(id, doom),
            (Err(refusal), None) => {
                out.push(self.vote(id, Vote::No(refusal.clone())));
                self.finish(id, Finished::Aborted(Some(refusal)));
            }
        }
    }

    /// The storage installed the commit of `txn` durably: acknowledge it.
    pub fn committed<W>(&mut self, id: TxnId, out: &mut Vec<Action<W, R>>) {
        let Some(Txn::Committing { .. }) = self.txns.remove(&id) else {
            panic!("commit of {id} completed, but none was started");
        };
        self.finish(id, Finished::Committed);
        out.push(self.ack(id));
    }

    /// Inquires about the prepared transactions whose decision is overdue at `now_ms`.
    pub fn tick<W>(&mut self, now_ms: u64, out: &mut Vec<Action<W, R>>) {
        let mut due = Vec::new();
        for (&id, txn) in &mut self.txns {
            if let Txn::Prepared {
                prepare,
                inquire_at_ms,
                ..
            } = txn
                && now_ms >= *inquire_at_ms
            {
                *inquire_at_ms = now_ms + self.config.inquire_every_ms;
                due.push((id, *prepare));
            }
        }
        for (id, prepare) in due {
            out.push(self.inquiry(id, prepare));
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

    fn finish(&mut self, id: TxnId, how: Finished) {
        if self.finished.insert(id, how).is_none() {
            self.finished_order.push_back(id);
        }
        while self.finished_order.len() > self.config.finished_max {
            let oldest = self
                .finished_order
                .pop_front()
                .expect("longer than the bound");
            self.finished.remove(&oldest);
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

//! Each role alone, driven by hand: the messages and storage actions it emits for one
//! scenario at a time. The whole protocol under faults is `tests/it/sim.rs`.

use super::*;

type Work = &'static str;
type Reply = u32;
type CAction = CoordinatorAction<Work, Reply>;
type PAction = ParticipantAction<Work, Reply>;
type Msg = Message<Work, Reply>;

const A: Peer = Peer(0);
const B: Peer = Peer(1);
const C: Peer = Peer(2);

fn config() -> Config {
    Config {
        resend_ms: 10,
        vote_timeout_ms: 100,
        ack_wait_ms: 50,
        client_deadline_ms: 500,
        inquire_after_ms: 30,
        inquire_every_ms: 20,
        txns_max: 4,
        finished_max: 2,
    }
}

fn coordinator() -> Coordinator<Work, Reply> {
    Coordinator::new(A, 7, config())
}

fn participant() -> Participant<Reply> {
    Participant::new(B, 3, config())
}

fn prep(incarnation: u64, seq: u64) -> PrepareId {
    PrepareId { incarnation, seq }
}

fn yes(txn: TxnId, from: Peer, prepare: PrepareId, reply: Reply) -> Msg {
    Message::Vote {
        txn,
        from,
        vote: Vote::Yes {
            prepare,
            reply,
            read_only: false,
        },
    }
}

/// The commit decision of [`decided_commit`].
fn commit_ab() -> Decided {
    Decided::Commit(vec![(A, prep(1, 1)), (B, prep(2, 1))])
}

/// The commit decision of `recovered_decisions_are_sent_again`.
fn commit_bc() -> Decided {
    Decided::Commit(vec![(B, prep(2, 1)), (C, prep(3, 5))])
}

/// A commit decision counting prepare `b` of participant B (and some prepare of A).
fn commit_b(b: PrepareId) -> Decided {
    Decided::Commit(vec![(A, prep(1, 1)), (B, b)])
}

fn decide(to: Peer, txn: TxnId, decision: Decided) -> CAction {
    CAction::Send {
        to,
        msg: Message::Decide { txn, decision },
    }
}

/// The messages among `out`, as (recipient, message).
fn sent<W, R>(out: &[impl AsSend<W, R>]) -> Vec<(Peer, &Message<W, R>)> {
    out.iter().filter_map(AsSend::as_send).collect()
}

trait AsSend<W, R> {
    fn as_send(&self) -> Option<(Peer, &Message<W, R>)>;
}

impl<W, R> AsSend<W, R> for CoordinatorAction<W, R> {
    fn as_send(&self) -> Option<(Peer, &Message<W, R>)> {
        match self {
            CoordinatorAction::Send { to, msg } => Some((*to, msg)),
            _ => None,
        }
    }
}

impl<W, R> AsSend<W, R> for ParticipantAction<W, R> {
    fn as_send(&self) -> Option<(Peer, &Message<W, R>)> {
        match self {
            ParticipantAction::Send { to, msg } => Some((*to, msg)),
            _ => None,
        }
    }
}

/// Begins a transaction on A and B (work "a" and "b") and takes both yes votes and the log.
fn decided_commit(c: &mut Coordinator<Work, Reply>) -> TxnId {
    let mut out = Vec::new();
    let txn = c.begin(0, vec![(A, "a"), (B, "b")], &mut out).unwrap();
    out.clear();
    c.handle(0, yes(txn, A, prep(1, 1), 10), &mut out);
    assert!(out.is_empty(), "{out:?}");
    c.handle(0, yes(txn, B, prep(2, 1), 20), &mut out);
    let decision = Decision {
        txn,
        participants: vec![(A, prep(1, 1)), (B, prep(2, 1))],
    };
    assert_eq!(out, vec![CAction::LogCommit(decision)]);
    out.clear();
    c.logged(5, txn, &mut out);
    assert_eq!(
        out,
        vec![decide(A, txn, commit_ab()), decide(B, txn, commit_ab()),]
    );
    txn
}

fn yes_read_only(txn: TxnId, from: Peer, prepare: PrepareId, reply: Reply) -> Msg {
    Message::Vote {
        txn,
        from,
        vote: Vote::Yes {
            prepare,
            reply,
            read_only: true,
        },
    }
}

#[test]
fn a_transaction_that_only_read_is_answered_at_its_last_vote_and_released_with_abort() {
    let mut c = coordinator();
    let mut out = Vec::new();
    let txn = c.begin(0, vec![(A, "a"), (B, "b")], &mut out).unwrap();
    out.clear();
    c.handle(1, yes_read_only(txn, A, prep(1, 1), 10), &mut out);
    assert!(out.is_empty(), "{out:?}");
    c.handle(2, yes_read_only(txn, B, prep(2, 1), 20), &mut out);
    // Nothing logged, the client answered, everyone released.
    assert_eq!(
        out,
        vec![
            CAction::Answer {
                txn,
                outcome: Outcome::Committed(vec![(A, 10), (B, 20)]),
            },
            decide(A, txn, Decided::Abort),
            decide(B, txn, Decided::Abort),
        ]
    );
    assert!(c.is_empty(), "forgotten at once");
    // A duplicate vote, and an inquiry of a participant that missed the release, hear abort.
    out.clear();
    c.handle(3, yes_read_only(txn, B, prep(2, 1), 20), &mut out);
    assert_eq!(out, vec![decide(B, txn, Decided::Abort)]);

    // One participant that writes: the decision is logged and acknowledged as always.
    let txn = c.begin(10, vec![(A, "a"), (B, "b")], &mut out).unwrap();
    out.clear();
    c.handle(11, yes_read_only(txn, A, prep(1, 2), 10), &mut out);
    c.handle(12, yes(txn, B, prep(2, 2), 20), &mut out);
    assert!(matches!(out.as_slice(), [CAction::LogCommit(_)]), "{out:?}");
}

#[test]
fn a_participant_says_in_its_vote_that_it_only_read() {
    let mut p = participant();
    let mut out = Vec::new();
    p.handle(0, prepare_msg(1), &mut out);
    out.clear();
    p.prepared_read_only(0, txn(1), Ok(42), &mut out);
    let yes = Vote::Yes {
        prepare: prep(3, 1),
        reply: 42,
        read_only: true,
    };
    assert_eq!(out, vec![p_vote(1, yes.clone())]);
    // Asked again, it votes the same; released with abort, it holds nothing.
    out.clear();
    p.handle(1, prepare_msg(1), &mut out);
    assert_eq!(out, vec![p_vote(1, yes)]);
    out.clear();
    p.handle(
        2,
        Message::Decide {
            txn: txn(1),
            decision: Decided::Abort,
        },
        &mut out,
    );
    assert_eq!(
        out,
        vec![PAction::Abort {
            txn: txn(1),
            prepare: prep(3, 1)
        }]
    );
    assert!(p.is_empty());
}

#[test]
fn commit_answers_after_every_ack() {
    let mut c = coordinator();
    let mut out = Vec::new();
    let txn = c.begin(0, vec![(A, "a"), (B, "b")], &mut out).unwrap();
    assert_eq!(
        txn,
        TxnId {
            coordinator: A,
            incarnation: 7,
            seq: 1
        }
    );
    let prepares: Vec<_> = sent(&out)
        .into_iter()
        .map(|(to, m)| (to, m.clone()))
        .collect();
    assert_eq!(
        prepares,
        vec![
            (
                A,
                Message::Prepare {
                    txn,
                    participants: vec![A, B],
                    work: "a"
                }
            ),
            (
                B,
                Message::Prepare {
                    txn,
                    participants: vec![A, B],
                    work: "b"
                }
            ),
        ]
    );
    let mut c = coordinator();
    let txn = decided_commit(&mut c);
    let mut out = Vec::new();
    c.handle(0, Message::Ack { txn, from: B }, &mut out);
    c.handle(0, Message::Ack { txn, from: B }, &mut out);
    assert!(out.is_empty(), "one ack of two: {out:?}");
    c.handle(0, Message::Ack { txn, from: A }, &mut out);
    assert_eq!(
        out,
        vec![
            CAction::Forget(txn),
            CAction::Answer {
                txn,
                outcome: Outcome::Committed(vec![(A, 10), (B, 20)])
            }
        ]
    );
    assert!(c.is_empty());
    // A late duplicate ack changes nothing; a late duplicate yes vote is told abort (the
    // coordinator forgot, and the participant acknowledged its commit long ago: it ignores
    // the abort).
    out.clear();
    c.handle(0, Message::Ack { txn, from: A }, &mut out);
    assert!(out.is_empty());
    c.handle(0, yes(txn, A, prep(1, 1), 10), &mut out);
    assert_eq!(out, vec![decide(A, txn, Decided::Abort)]);
}

#[test]
fn a_no_vote_aborts_at_once() {
    let mut c = coordinator();
    let mut out = Vec::new();
    let txn = c
        .begin(0, vec![(A, "a"), (B, "b"), (C, "c")], &mut out)
        .unwrap();
    out.clear();
    c.handle(0, yes(txn, A, prep(1, 1), 10), &mut out);
    c.handle(
        0,
        Message::Vote {
            txn,
            from: B,
            vote: Vote::No(Refusal::Busy),
        },
        &mut out,
    );
    assert_eq!(
        out,
        vec![
            decide(A, txn, Decided::Abort),
            decide(C, txn, Decided::Abort),
            CAction::Answer {
                txn,
                outcome: Outcome::Aborted(AbortReason::Refused {
                    by: B,
                    refusal: Refusal::Busy
                })
            }
        ]
    );
    assert!(c.is_empty(), "nothing logged, nothing kept");
    // C prepares late and votes yes: it is told abort.
    out.clear();
    c.handle(0, yes(txn, C, prep(3, 1), 30), &mut out);
    assert_eq!(out, vec![decide(C, txn, Decided::Abort)]);
}

#[test]
fn resends_prepare_then_times_out() {
    let mut c = coordinator();
    let mut out = Vec::new();
    let txn = c.begin(0, vec![(A, "a"), (B, "b")], &mut out).unwrap();
    out.clear();
    c.handle(0, yes(txn, A, prep(1, 1), 10), &mut out);
    c.tick(9, &mut out);
    assert!(out.is_empty(), "not yet due: {out:?}");
    c.tick(10, &mut out);
    let resent: Vec<_> = sent(&out).into_iter().map(|(to, _)| to).collect();
    assert_eq!(resent, vec![B], "only to the silent participant");
    out.clear();
    c.tick(100, &mut out);
    assert_eq!(
        out,
        vec![
            decide(A, txn, Decided::Abort),
            decide(B, txn, Decided::Abort),
            CAction::Answer {
                txn,
                outcome: Outcome::Aborted(AbortReason::Timeout)
            }
        ]
    );
    assert!(c.is_empty());
}

#[test]
fn resends_decisions_and_answers_after_the_ack_wait() {
    let mut c = coordinator();
    let txn = decided_commit(&mut c);
    let mut out = Vec::new();
    c.handle(0, Message::Ack { txn, from: A }, &mut out);
    c.tick(15, &mut out);
    assert_eq!(out, vec![decide(B, txn, commit_ab())]);
    out.clear();
    c.tick(55, &mut out);
    assert_eq!(
        out,
        vec![
            decide(B, txn, commit_ab()),
            CAction::Answer {
                txn,
                outcome: Outcome::Committed(vec![(A, 10), (B, 20)])
            }
        ],
        "durable at 5, ack wait 50"
    );
    out.clear();
    c.handle(0, Message::Ack { txn, from: B }, &mut out);
    assert_eq!(out, vec![CAction::Forget(txn)], "answered once only");
}

#[test]
fn inquiries_hear_the_decision_or_abort() {
    let mut c = coordinator();
    let mut out = Vec::new();
    let undecided = c.begin(0, vec![(A, "a"), (B, "b")], &mut out).unwrap();
    out.clear();
    c.handle(0, yes(undecided, B, prep(2, 1), 20), &mut out);
    let inquire = |txn| Message::Inquire {
        txn,
        from: B,
        prepare: prep(2, 1),
    };
    c.handle(0, inquire(undecided), &mut out);
    assert!(out.is_empty(), "undecided: no answer yet");
    let committed = decided_commit(&mut c);
    c.handle(0, inquire(committed), &mut out);
    assert_eq!(out, vec![decide(B, committed, commit_ab())]);
    out.clear();
    // Unknown ids, of this incarnation or an earlier one, are aborted.
    let earlier = TxnId {
        incarnation: 6,
        ..committed
    };
    let never = TxnId {
        seq: 99,
        ..committed
    };
    c.handle(0, inquire(earlier), &mut out);
    c.handle(0, inquire(never), &mut out);
    assert_eq!(
        out,
        vec![
            decide(B, earlier, Decided::Abort),
            decide(B, never, Decided::Abort)
        ]
    );
    // Another coordinator's transaction is none of this one's business.
    out.clear();
    c.handle(
        0,
        inquire(TxnId {
            coordinator: C,
            ..never
        }),
        &mut out,
    );
    assert!(out.is_empty());
}

#[test]
fn a_stale_yes_vote_after_the_decision_gets_the_counted_prepare() {
    let mut c = coordinator();
    let txn = decided_commit(&mut c);
    let mut out = Vec::new();
    c.handle(0, yes(txn, B, prep(9, 4), 20), &mut out);
    assert_eq!(out, vec![decide(B, txn, commit_ab())]);
}

#[test]
fn recovered_decisions_are_sent_again() {
    let mut c = Coordinator::<Work, Reply>::new(A, 8, config());
    let txn = TxnId {
        coordinator: A,
        incarnation: 7,
        seq: 3,
    };
    let mut out = Vec::new();
    c.recover(
        100,
        vec![Decision {
            txn,
            participants: vec![(B, prep(2, 1)), (C, prep(3, 5))],
        }],
        &mut out,
    );
    assert_eq!(
        out,
        vec![decide(B, txn, commit_bc()), decide(C, txn, commit_bc()),]
    );
    out.clear();
    c.handle(0, Message::Ack { txn, from: B }, &mut out);
    c.tick(200, &mut out);
    assert_eq!(
        out,
        vec![decide(C, txn, commit_bc())],
        "no client to answer"
    );
    out.clear();
    c.handle(0, Message::Ack { txn, from: C }, &mut out);
    assert_eq!(out, vec![CAction::Forget(txn)]);
    // The new incarnation numbers its own transactions afresh, under its own incarnation.
    let id = c.begin(0, vec![(A, "a")], &mut out).unwrap();
    assert_eq!((id.incarnation, id.seq), (8, 1));
}

#[test]
fn unknown_outcome_when_the_log_stalls() {
    let mut c = coordinator();
    let mut out = Vec::new();
    let txn = c.begin(0, vec![(A, "a")], &mut out).unwrap();
    c.handle(0, yes(txn, A, prep(1, 1), 10), &mut out);
    out.clear();
    c.tick(499, &mut out);
    assert!(out.is_empty());
    c.tick(500, &mut out);
    assert_eq!(
        out,
        vec![CAction::Answer {
            txn,
            outcome: Outcome::Unknown
        }]
    );
    out.clear();
    // The log completes after all; the commit proceeds, with no second answer.
    c.logged(600, txn, &mut out);
    c.handle(0, Message::Ack { txn, from: A }, &mut out);
    assert_eq!(
        out,
        vec![
            decide(A, txn, Decided::Commit(vec![(A, prep(1, 1))])),
            CAction::Forget(txn)
        ]
    );
}

#[test]
fn begin_checks_its_participants_and_the_bound() {
    let mut c = coordinator();
    let mut out = Vec::new();
    assert_eq!(c.begin(0, vec![], &mut out), Err(BeginError::Empty));
    assert_eq!(
        c.begin(0, vec![(A, "a"), (B, "b"), (A, "c")], &mut out),
        Err(BeginError::Duplicate(A))
    );
    assert!(out.is_empty());
    for _ in 0..4 {
        c.begin(0, vec![(A, "a")], &mut out).unwrap();
    }
    assert_eq!(
        c.begin(0, vec![(A, "a")], &mut out),
        Err(BeginError::Busy(4))
    );
}

fn txn(seq: u64) -> TxnId {
    TxnId {
        coordinator: A,
        incarnation: 7,
        seq,
    }
}

fn prepare_msg(seq: u64) -> Msg {
    Message::Prepare {
        txn: txn(seq),
        participants: vec![A, B],
        work: "w",
    }
}

/// A prepare of `txn(seq)` (coordinated by A) for participants A, B and C.
fn prepare3(seq: u64) -> Msg {
    Message::Prepare {
        txn: txn(seq),
        participants: vec![A, B, C],
        work: "w",
    }
}

/// B asks `to` about `txn(seq)`.
fn p_peer_inquire(seq: u64, to: Peer, asked_ms: u64) -> PAction {
    PAction::Send {
        to,
        msg: Message::PeerInquire {
            txn: txn(seq),
            from: B,
            asked_ms,
        },
    }
}

fn p_vote(seq: u64, vote: Vote<Reply>) -> PAction {
    PAction::Send {
        to: A,
        msg: Message::Vote {
            txn: txn(seq),
            from: B,
            vote,
        },
    }
}

fn p_ack(seq: u64) -> PAction {
    PAction::Send {
        to: A,
        msg: Message::Ack {
            txn: txn(seq),
            from: B,
        },
    }
}

fn p_inquire(seq: u64, prepare: PrepareId) -> PAction {
    PAction::Send {
        to: A,
        msg: Message::Inquire {
            txn: txn(seq),
            from: B,
            prepare,
        },
    }
}

fn p_decide(seq: u64, decision: Decided) -> Msg {
    Message::Decide {
        txn: txn(seq),
        decision,
    }
}

#[test]
fn participant_prepares_once_and_commits_the_counted_prepare() {
    let mut p = participant();
    let mut out = Vec::new();
    p.handle(0, prepare_msg(1), &mut out);
    assert_eq!(
        out,
        vec![PAction::Prepare {
            txn: txn(1),
            prepare: prep(3, 1),
            participants: vec![A, B],
            work: "w"
        }]
    );
    out.clear();
    p.handle(0, prepare_msg(1), &mut out);
    assert!(out.is_empty(), "preparing: the vote comes when done");
    p.prepared(0, txn(1), Ok(42), &mut out);
    let yes = Vote::Yes {
        prepare: prep(3, 1),
        reply: 42,
        read_only: false,
    };
    assert_eq!(out, vec![p_vote(1, yes.clone())]);
    out.clear();
    p.handle(0, prepare_msg(1), &mut out);
    assert_eq!(
        out,
        vec![p_vote(1, yes)],
        "the stored vote, not a second run"
    );
    out.clear();
    p.handle(0, p_decide(1, commit_b(prep(3, 1))), &mut out);
    assert_eq!(
        out,
        vec![PAction::Commit {
            txn: txn(1),
            prepare: prep(3, 1)
        }]
    );
    out.clear();
    p.handle(0, p_decide(1, commit_b(prep(3, 1))), &mut out);
    assert!(out.is_empty(), "acknowledged once durable");
    p.committed(0, txn(1), &mut out);
    assert_eq!(out, vec![p_ack(1)]);
    assert!(p.is_empty());
    out.clear();
    // Duplicates after the end: a commit is acknowledged again, a prepare ignored, an abort
    // (a late answer to a duplicate vote) ignored.
    p.handle(0, p_decide(1, commit_b(prep(3, 1))), &mut out);
    assert_eq!(out, vec![p_ack(1)]);
    out.clear();
    p.handle(0, prepare_msg(1), &mut out);
    p.handle(0, p_decide(1, Decided::Abort), &mut out);
    assert!(out.is_empty(), "{out:?}");
}

#[test]
fn participant_refusal_is_remembered() {
    let mut p = participant();
    let mut out = Vec::new();
    p.handle(0, prepare_msg(1), &mut out);
    out.clear();
    p.prepared(0, txn(1), Err(Refusal::Busy), &mut out);
    assert_eq!(out, vec![p_vote(1, Vote::No(Refusal::Busy))]);
    out.clear();
    p.handle(0, prepare_msg(1), &mut out);
    assert_eq!(
        out,
        vec![p_vote(1, Vote::No(Refusal::Busy))],
        "not run again"
    );
    assert!(p.is_empty());
}

#[test]
fn participant_forgets_beyond_its_bound_and_a_stale_reprepare_is_harmless() {
    let mut p = participant();
    let mut out = Vec::new();
    for seq in 1..=3 {
        p.handle(0, prepare_msg(seq), &mut out);
        p.prepared(0, txn(seq), Ok(1), &mut out);
        p.handle(0, p_decide(seq, commit_b(prep(3, seq))), &mut out);
        p.committed(0, txn(seq), &mut out);
    }
    out.clear();
    // finished_max is 2: transaction 1 is forgotten, and its late duplicate prepare runs
    // again as prepare (3, 4).
    p.handle(0, prepare_msg(3), &mut out);
    assert!(out.is_empty());
    p.handle(0, prepare_msg(1), &mut out);
    assert_eq!(
        out,
        vec![PAction::Prepare {
            txn: txn(1),
            prepare: prep(3, 4),
            participants: vec![A, B],
            work: "w"
        }]
    );
    out.clear();
    p.prepared(0, txn(1), Ok(1), &mut out);
    out.clear();
    // The coordinator still resends the commit of prepare (3, 1): the re-prepare is aborted,
    // not committed a second time.
    p.handle(0, p_decide(1, commit_b(prep(3, 1))), &mut out);
    assert_eq!(
        out,
        vec![
            PAction::Abort {
                txn: txn(1),
                prepare: prep(3, 4)
            },
            p_ack(1)
        ]
    );
    assert!(p.is_empty());
}

#[test]
fn a_decision_during_the_prepare_takes_effect_when_it_completes() {
    let mut p = participant();
    let mut out = Vec::new();
    p.handle(0, prepare_msg(1), &mut out);
    p.handle(0, p_decide(1, Decided::Abort), &mut out);
    out.clear();
    p.prepared(0, txn(1), Ok(1), &mut out);
    assert_eq!(
        out,
        vec![PAction::Abort {
            txn: txn(1),
            prepare: prep(3, 1)
        }],
        "no vote: the coordinator decided"
    );
    out.clear();
    // A commit naming another prepare while this one runs: acknowledged now, aborted later.
    p.handle(0, prepare_msg(2), &mut out);
    out.clear();
    p.handle(0, p_decide(2, commit_b(prep(1, 1))), &mut out);
    assert_eq!(out, vec![p_ack(2)]);
    out.clear();
    p.prepared(0, txn(2), Err(Refusal::Busy), &mut out);
    assert!(out.is_empty(), "{out:?}");
    assert!(p.is_empty());
}

#[test]
fn participant_inquires_until_it_hears() {
    let mut p = participant();
    let mut out = Vec::new();
    p.handle(0, prepare3(1), &mut out);
    p.prepared(100, txn(1), Ok(1), &mut out);
    out.clear();
    p.tick(129, &mut out);
    assert!(out.is_empty());
    p.tick(130, &mut out);
    assert_eq!(out, vec![p_inquire(1, prep(3, 1))], "the coordinator first");
    out.clear();
    p.tick(149, &mut out);
    p.tick(150, &mut out);
    assert_eq!(
        out,
        vec![p_inquire(1, prep(3, 1))],
        "the coordinator may still be collecting votes (vote timeout 100): nobody else yet"
    );
    out.clear();
    p.tick(200, &mut out);
    assert_eq!(
        out,
        vec![
            p_inquire(1, prep(3, 1)),
            p_peer_inquire(1, A, 200),
            p_peer_inquire(1, C, 200)
        ],
        "unanswered: the other participants too (A coordinates and takes part)"
    );
    out.clear();
    p.handle(0, p_decide(1, Decided::Abort), &mut out);
    assert_eq!(
        out,
        vec![PAction::Abort {
            txn: txn(1),
            prepare: prep(3, 1)
        }]
    );
    out.clear();
    p.tick(1000, &mut out);
    assert!(out.is_empty());
}

#[test]
fn participant_recovers_and_inquires_at_once() {
    let mut p = Participant::<Reply>::new(B, 4, config());
    let mut out: Vec<PAction> = Vec::new();
    p.recover(
        0,
        vec![Recovered {
            txn: txn(5),
            prepare: prep(3, 9),
            participants: vec![A, B],
            reply: 7,
        }],
        &mut out,
    );
    assert_eq!(out, vec![p_inquire(5, prep(3, 9))]);
    out.clear();
    // The coordinator is still voting and resends its prepare: the recovered vote goes again.
    p.handle(0, prepare_msg(5), &mut out);
    assert_eq!(
        out,
        vec![p_vote(
            5,
            Vote::Yes {
                prepare: prep(3, 9),
                reply: 7,
                read_only: false,
            }
        )]
    );
    out.clear();
    p.handle(0, p_decide(5, commit_b(prep(3, 9))), &mut out);
    assert_eq!(
        out,
        vec![PAction::Commit {
            txn: txn(5),
            prepare: prep(3, 9)
        }]
    );
}

#[test]
fn participant_refuses_beyond_its_bound() {
    let mut p = participant();
    let mut out = Vec::new();
    for seq in 1..=4 {
        p.handle(0, prepare_msg(seq), &mut out);
    }
    out.clear();
    p.handle(0, prepare_msg(5), &mut out);
    assert_eq!(out, vec![p_vote(5, Vote::No(Refusal::Overloaded))]);
}

#[test]
fn a_vote_after_the_deadline_is_not_counted() {
    // Participants that ask each other rely on it: a stalled coordinator whose tick is late
    // still never counts a vote that came after the vote timeout.
    let mut c = coordinator();
    let mut out = Vec::new();
    let txn = c.begin(0, vec![(A, "a"), (B, "b")], &mut out).unwrap();
    out.clear();
    c.handle(99, yes(txn, A, prep(1, 1), 10), &mut out);
    assert!(out.is_empty());
    c.handle(100, yes(txn, B, prep(2, 1), 20), &mut out);
    assert_eq!(
        out,
        vec![
            decide(A, txn, Decided::Abort),
            decide(B, txn, Decided::Abort),
            CAction::Answer {
                txn,
                outcome: Outcome::Aborted(AbortReason::Timeout)
            }
        ],
        "no LogCommit"
    );
}

/// The participant of `me` (incarnation 5), whose clock starts at `start_ms`.
fn peer(me: Peer, start_ms: u64) -> Participant<Reply> {
    let mut p = Participant::new(me, 5, config());
    let mut out: Vec<PAction> = Vec::new();
    p.tick(start_ms, &mut out);
    assert!(out.is_empty());
    p
}

/// `p` prepares `txn(seq)` (participants A, B, C) at `at_ms` as its next prepare and votes
/// yes.
fn prepare_at(p: &mut Participant<Reply>, seq: u64, at_ms: u64) {
    let mut out: Vec<PAction> = Vec::new();
    p.handle(at_ms, prepare3(seq), &mut out);
    p.prepared(at_ms, txn(seq), Ok(1), &mut out);
    assert!(
        matches!(
            &out[..],
            [
                _,
                PAction::Send {
                    msg: Message::Vote {
                        vote: Vote::Yes { .. },
                        ..
                    },
                    ..
                }
            ]
        ),
        "{out:?}"
    );
}

/// What `answerer` says when `asker` asks it about `txn(seq)` at `now_ms`, having asked at
/// `asked_ms`: the messages to `asker`.
fn ask(
    answerer: &mut Participant<Reply>,
    asker: Peer,
    seq: u64,
    asked_ms: u64,
    now_ms: u64,
) -> Vec<Msg> {
    let mut out: Vec<PAction> = Vec::new();
    let question = Message::PeerInquire {
        txn: txn(seq),
        from: asker,
        asked_ms,
    };
    answerer.handle(now_ms, question, &mut out);
    sent(&out)
        .into_iter()
        .map(|(to, msg)| {
            assert_eq!(to, asker);
            msg.clone()
        })
        .collect()
}

/// Every participant's counted prepare of a committed `txn(_)`: B's is (3, 1).
fn commit_abc() -> Decided {
    Decided::Commit(vec![(A, prep(1, 1)), (B, prep(3, 1)), (C, prep(5, 1))])
}

#[test]
fn learns_commit_from_a_peer_while_the_coordinator_is_down() {
    let mut b = participant();
    let mut c = peer(C, 0);
    let mut out = Vec::new();
    prepare_at(&mut b, 1, 0);
    prepare_at(&mut c, 1, 0);
    // C hears the commit from A, installs it and forgets it is in progress; A goes down
    // before B hears it.
    c.handle(5, p_decide(1, commit_abc()), &mut out);
    assert_eq!(
        out,
        vec![PAction::Commit {
            txn: txn(1),
            prepare: prep(5, 1)
        }]
    );
    out.clear();
    // Installing: C already tells the decision.
    assert_eq!(ask(&mut c, B, 1, 6, 6), vec![p_decide(1, commit_abc())]);
    c.committed(7, txn(1), &mut out);
    out.clear();
    // B's inquiry of the coordinator goes unanswered; then it asks the others.
    b.tick(30, &mut out);
    assert_eq!(out, vec![p_inquire(1, prep(3, 1))]);
    out.clear();
    b.tick(100, &mut out);
    assert_eq!(
        out,
        vec![
            p_inquire(1, prep(3, 1)),
            p_peer_inquire(1, A, 100),
            p_peer_inquire(1, C, 100)
        ]
    );
    out.clear();
    // A is down; C knows.
    let answer = ask(&mut c, B, 1, 100, 102);
    assert_eq!(answer, vec![p_decide(1, commit_abc())]);
    for msg in answer {
        b.handle(103, msg, &mut out);
    }
    assert_eq!(
        out,
        vec![PAction::Commit {
            txn: txn(1),
            prepare: prep(3, 1)
        }],
        "B commits its counted prepare"
    );
    out.clear();
    b.committed(110, txn(1), &mut out);
    assert_eq!(out, vec![p_ack(1)], "acknowledged to the coordinator");
    assert!(b.is_empty());
    // B now knows too, and tells C's question (say C restarted and asks) the same.
    assert_eq!(ask(&mut b, C, 1, 70, 70), vec![p_decide(1, commit_abc())]);
}

#[test]
fn a_stale_reprepare_learns_commit_from_a_peer_and_is_aborted() {
    // B holds prepare (3, 1) of a transaction whose decision counted B's earlier prepare
    // (3, 9) (installed and forgotten): the peer's decision names the counted one.
    let mut b = participant();
    let mut out = Vec::new();
    prepare_at(&mut b, 1, 0);
    let counted_elsewhere =
        Decided::Commit(vec![(A, prep(1, 1)), (B, prep(3, 9)), (C, prep(5, 1))]);
    b.handle(60, p_decide(1, counted_elsewhere), &mut out);
    assert_eq!(
        out,
        vec![
            PAction::Abort {
                txn: txn(1),
                prepare: prep(3, 1)
            },
            p_ack(1)
        ]
    );
    assert!(b.is_empty());
}

#[test]
fn learns_abort_from_a_peer_that_never_prepared_and_the_peer_refuses_the_late_prepare() {
    let mut b = participant();
    let mut c = peer(C, 0);
    let mut out = Vec::new();
    // B votes yes at 1000; the Prepare to C is lost, and A goes down.
    prepare_at(&mut b, 1, 1000);
    b.tick(1030, &mut out);
    b.tick(1150, &mut out);
    assert!(out.contains(&p_peer_inquire(1, C, 1150)), "{out:?}");
    out.clear();
    // Asked at 1150, 150 ms after B voted: past the vote timeout (100) by B's clock, but not
    // by twice it, the margin for clocks that run at different rates. C answers what it
    // knows ...
    let early = ask(&mut c, B, 1, 1150, 1151);
    assert_eq!(
        early,
        vec![Message::NoYesVote {
            txn: txn(1),
            from: C,
            for_ms: 1151,
            asked_ms: 1150
        }],
        "C's memory reaches back to its start"
    );
    // ... and refuses the transaction from now on: the late Prepare gets a no.
    c.handle(1060, prepare3(1), &mut out);
    assert_eq!(
        out,
        vec![PAction::Send {
            to: A,
            msg: Message::Vote {
                txn: txn(1),
                from: C,
                vote: Vote::No(Refusal::Finished)
            }
        }]
    );
    out.clear();
    // B does not decide on an answer to so early a question.
    for msg in early {
        b.handle(1152, msg, &mut out);
    }
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(b.len(), 1);
    // Asked again past the window: C's memory reaches far enough back (1000 - 200).
    b.tick(1200, &mut out);
    out.clear();
    let late = ask(&mut c, B, 1, 1200, 1201);
    assert_eq!(
        late,
        vec![Message::NoYesVote {
            txn: txn(1),
            from: C,
            for_ms: 1201,
            asked_ms: 1200
        }]
    );
    for msg in late {
        b.handle(1202, msg, &mut out);
    }
    assert_eq!(
        out,
        vec![PAction::Abort {
            txn: txn(1),
            prepare: prep(3, 1)
        }]
    );
    out.clear();
    assert!(b.is_empty());
    // B does not pass abort on as the decision: it proved only that its own prepare was not
    // counted (the transaction might have committed with an earlier prepare of B's that B
    // forgot). It vouches for what it knows: no yes vote since its prepare's, at 1000. And
    // it refuses a late duplicate Prepare.
    assert_eq!(
        ask(&mut b, C, 1, 1300, 1300),
        vec![Message::NoYesVote {
            txn: txn(1),
            from: B,
            for_ms: 300,
            asked_ms: 1300
        }]
    );
    b.handle(1301, prepare3(1), &mut out);
    assert_eq!(out, vec![p_vote(1, Vote::No(Refusal::Finished))]);
}

#[test]
fn a_peer_that_may_have_forgotten_does_not_decide_abort() {
    let mut out = Vec::new();
    // C restarted at 900: its memory does not reach 200 ms before B's vote at 1000, so C
    // may have voted yes before and forgotten it.
    let mut b = participant();
    prepare_at(&mut b, 1, 1000);
    let mut c = peer(C, 900);
    for msg in ask(&mut c, B, 1, 1300, 1300) {
        assert!(
            matches!(msg, Message::NoYesVote { for_ms: 400, .. }),
            "{msg:?}"
        );
        b.handle(1301, msg, &mut out);
    }
    assert!(out.is_empty(), "{out:?}");
    // A peer that forgot finished transactions (it remembers 2) vouches only back to the
    // finish of the newest one it forgot.
    let mut d = peer(Peer(3), 0);
    for (seq, at) in [(11, 850), (12, 900), (13, 950)] {
        prepare_at(&mut d, seq, at);
        d.handle(at, p_decide(seq, Decided::Abort), &mut out);
    }
    out.clear();
    let answer = ask(&mut d, B, 1, 1300, 1300);
    assert_eq!(
        answer,
        vec![Message::NoYesVote {
            txn: txn(1),
            from: Peer(3),
            for_ms: 450,
            asked_ms: 1300
        }],
        "forgot transaction 11, finished at 850"
    );
    for msg in answer {
        b.handle(1301, msg, &mut out);
    }
    assert!(out.is_empty(), "{out:?}");
    // A recovered prepare's vote has no known age: no `NoYesVote` aborts it.
    let mut r = Participant::<Reply>::new(B, 4, config());
    r.recover(
        2000,
        vec![Recovered {
            txn: txn(1),
            prepare: prep(3, 1),
            participants: vec![A, B, C],
            reply: 1,
        }],
        &mut out,
    );
    out.clear();
    let vouch = Message::NoYesVote {
        txn: txn(1),
        from: C,
        for_ms: 1_000_000,
        asked_ms: 5000,
    };
    r.handle(5000, vouch, &mut out);
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(r.len(), 1);
}

#[test]
fn all_prepared_and_the_coordinator_down_stays_prepared() {
    let mut b = participant();
    let mut c = peer(C, 0);
    prepare_at(&mut b, 1, 0);
    prepare_at(&mut c, 1, 0);
    let mut out = Vec::new();
    for now in (0..=5000).step_by(10) {
        b.tick(now, &mut out);
        c.tick(now, &mut out);
        // Every question goes to the other; A is down.
        for (_, msg) in sent(&std::mem::take(&mut out)) {
            if let Message::PeerInquire { from, .. } = msg {
                let answerer = if *from == B { &mut c } else { &mut b };
                answerer.handle(now, msg.clone(), &mut out);
            }
        }
        assert!(sent(&out).is_empty(), "an undecided peer answers nothing");
    }
    assert_eq!((b.len(), c.len()), (1, 1), "both still prepared");
    // A comes back and tells them.
    b.handle(5001, p_decide(1, commit_abc()), &mut out);
    c.handle(5001, p_decide(1, commit_abc()), &mut out);
    assert_eq!(out.len(), 2, "{out:?}");
}

#[test]
fn a_peer_tells_what_it_learnt_or_refused() {
    let mut out = Vec::new();
    // Told abort by the coordinator: says abort, with no conditions.
    let mut c = peer(C, 0);
    prepare_at(&mut c, 1, 10);
    c.handle(20, p_decide(1, Decided::Abort), &mut out);
    assert_eq!(ask(&mut c, B, 1, 30, 30), vec![p_decide(1, Decided::Abort)]);
    let mut b = participant();
    prepare_at(&mut b, 1, 25);
    out.clear();
    b.handle(31, p_decide(1, Decided::Abort), &mut out);
    assert_eq!(
        out,
        vec![PAction::Abort {
            txn: txn(1),
            prepare: prep(3, 1)
        }]
    );
    // Voted no: it never voted yes since its horizon when it refused, and says so.
    let mut d = peer(Peer(3), 100);
    out.clear();
    d.handle(200, prepare3(2), &mut out);
    d.prepared(210, txn(2), Err(Refusal::Busy), &mut out);
    assert_eq!(
        ask(&mut d, B, 2, 400, 400),
        vec![Message::NoYesVote {
            txn: txn(2),
            from: Peer(3),
            for_ms: 300,
            asked_ms: 400
        }]
    );
    // Still preparing, and undecided: no answer; preparing and told abort: abort.
    d.handle(500, prepare3(3), &mut out);
    assert!(ask(&mut d, B, 3, 501, 501).is_empty());
    d.handle(502, p_decide(3, Decided::Abort), &mut out);
    assert_eq!(
        ask(&mut d, B, 3, 503, 503),
        vec![p_decide(3, Decided::Abort)]
    );
}

#[test]
fn messages_round_trip_through_serde() {
    // TOML is the serde format this crate already has; the transport will use its own.
    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Frame {
        msgs: Vec<Message<Vec<String>, u32>>,
    }
    let txn = TxnId {
        coordinator: A,
        incarnation: u64::from(u32::MAX) + 1,
        seq: 9,
    };
    let frame = Frame {
        msgs: vec![
            Message::Prepare {
                txn,
                participants: vec![A, B],
                work: vec!["SET".into(), "k".into()],
            },
            Message::Vote {
                txn,
                from: B,
                vote: Vote::Yes {
                    prepare: prep(2, 1),
                    reply: 5,
                    read_only: false,
                },
            },
            Message::Vote {
                txn,
                from: C,
                vote: Vote::No(Refusal::Failed("WRONGTYPE".into())),
            },
            Message::Decide {
                txn,
                decision: commit_b(prep(2, 1)),
            },
            Message::Decide {
                txn,
                decision: Decided::Abort,
            },
            Message::Ack { txn, from: B },
            Message::Inquire {
                txn,
                from: B,
                prepare: prep(2, 1),
            },
            Message::PeerInquire {
                txn,
                from: B,
                asked_ms: 7,
            },
            Message::NoYesVote {
                txn,
                from: C,
                for_ms: 3,
                asked_ms: 7,
            },
        ],
    };
    let text = toml::to_string(&frame).unwrap();
    assert_eq!(toml::from_str::<Frame>(&text).unwrap(), frame, "{text}");
}

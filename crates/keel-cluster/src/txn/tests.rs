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
        vote: Vote::Yes { prepare, reply },
    }
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
    c.handle(yes(txn, A, prep(1, 1), 10), &mut out);
    assert!(out.is_empty(), "{out:?}");
    c.handle(yes(txn, B, prep(2, 1), 20), &mut out);
    let decision = Decision {
        txn,
        participants: vec![(A, prep(1, 1)), (B, prep(2, 1))],
    };
    assert_eq!(out, vec![CAction::LogCommit(decision)]);
    out.clear();
    c.logged(5, txn, &mut out);
    assert_eq!(
        out,
        vec![
            decide(A, txn, Decided::Commit(prep(1, 1))),
            decide(B, txn, Decided::Commit(prep(2, 1))),
        ]
    );
    txn
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
    c.handle(Message::Ack { txn, from: B }, &mut out);
    c.handle(Message::Ack { txn, from: B }, &mut out);
    assert!(out.is_empty(), "one ack of two: {out:?}");
    c.handle(Message::Ack { txn, from: A }, &mut out);
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
    c.handle(Message::Ack { txn, from: A }, &mut out);
    assert!(out.is_empty());
    c.handle(yes(txn, A, prep(1, 1), 10), &mut out);
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
    c.handle(yes(txn, A, prep(1, 1), 10), &mut out);
    c.handle(
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
    c.handle(yes(txn, C, prep(3, 1), 30), &mut out);
    assert_eq!(out, vec![decide(C, txn, Decided::Abort)]);
}

#[test]
fn resends_prepare_then_times_out() {
    let mut c = coordinator();
    let mut out = Vec::new();
    let txn = c.begin(0, vec![(A, "a"), (B, "b")], &mut out).unwrap();
    out.clear();
    c.handle(yes(txn, A, prep(1, 1), 10), &mut out);
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
    c.handle(Message::Ack { txn, from: A }, &mut out);
    c.tick(15, &mut out);
    assert_eq!(out, vec![decide(B, txn, Decided::Commit(prep(2, 1)))]);
    out.clear();
    c.tick(55, &mut out);
    assert_eq!(
        out,
        vec![
            decide(B, txn, Decided::Commit(prep(2, 1))),
            CAction::Answer {
                txn,
                outcome: Outcome::Committed(vec![(A, 10), (B, 20)])
            }
        ],
        "durable at 5, ack wait 50"
    );
    out.clear();
    c.handle(Message::Ack { txn, from: B }, &mut out);
    assert_eq!(out, vec![CAction::Forget(txn)], "answered once only");
}

#[test]
fn inquiries_hear_the_decision_or_abort() {
    let mut c = coordinator();
    let mut out = Vec::new();
    let undecided = c.begin(0, vec![(A, "a"), (B, "b")], &mut out).unwrap();
    out.clear();
    c.handle(yes(undecided, B, prep(2, 1), 20), &mut out);
    let inquire = |txn| Message::Inquire {
        txn,
        from: B,
        prepare: prep(2, 1),
    };
    c.handle(inquire(undecided), &mut out);
    assert!(out.is_empty(), "undecided: no answer yet");
    let committed = decided_commit(&mut c);
    c.handle(inquire(committed), &mut out);
    assert_eq!(out, vec![decide(B, committed, Decided::Commit(prep(2, 1)))]);
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
    c.handle(inquire(earlier), &mut out);
    c.handle(inquire(never), &mut out);
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
    c.handle(yes(txn, B, prep(9, 4), 20), &mut out);
    assert_eq!(out, vec![decide(B, txn, Decided::Commit(prep(2, 1)))]);
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
        vec![
            decide(B, txn, Decided::Commit(prep(2, 1))),
            decide(C, txn, Decided::Commit(prep(3, 5))),
        ]
    );
    out.clear();
    c.handle(Message::Ack { txn, from: B }, &mut out);
    c.tick(200, &mut out);
    assert_eq!(
        out,
        vec![decide(C, txn, Decided::Commit(prep(3, 5)))],
        "no client to answer"
    );
    out.clear();
    c.handle(Message::Ack { txn, from: C }, &mut out);
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
    c.handle(yes(txn, A, prep(1, 1), 10), &mut out);
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
    c.handle(Message::Ack { txn, from: A }, &mut out);
    assert_eq!(
        out,
        vec![
            decide(A, txn, Decided::Commit(prep(1, 1))),
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
    p.handle(prepare_msg(1), &mut out);
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
    p.handle(prepare_msg(1), &mut out);
    assert!(out.is_empty(), "preparing: the vote comes when done");
    p.prepared(0, txn(1), Ok(42), &mut out);
    let yes = Vote::Yes {
        prepare: prep(3, 1),
        reply: 42,
    };
    assert_eq!(out, vec![p_vote(1, yes.clone())]);
    out.clear();
    p.handle(prepare_msg(1), &mut out);
    assert_eq!(
        out,
        vec![p_vote(1, yes)],
        "the stored vote, not a second run"
    );
    out.clear();
    p.handle(p_decide(1, Decided::Commit(prep(3, 1))), &mut out);
    assert_eq!(
        out,
        vec![PAction::Commit {
            txn: txn(1),
            prepare: prep(3, 1)
        }]
    );
    out.clear();
    p.handle(p_decide(1, Decided::Commit(prep(3, 1))), &mut out);
    assert!(out.is_empty(), "acknowledged once durable");
    p.committed(txn(1), &mut out);
    assert_eq!(out, vec![p_ack(1)]);
    assert!(p.is_empty());
    out.clear();
    // Duplicates after the end: a commit is acknowledged again, a prepare ignored, an abort
    // (a late answer to a duplicate vote) ignored.
    p.handle(p_decide(1, Decided::Commit(prep(3, 1))), &mut out);
    assert_eq!(out, vec![p_ack(1)]);
    out.clear();
    p.handle(prepare_msg(1), &mut out);
    p.handle(p_decide(1, Decided::Abort), &mut out);
    assert!(out.is_empty(), "{out:?}");
}

#[test]
fn participant_refusal_is_remembered() {
    let mut p = participant();
    let mut out = Vec::new();
    p.handle(prepare_msg(1), &mut out);
    out.clear();
    p.prepared(0, txn(1), Err(Refusal::Busy), &mut out);
    assert_eq!(out, vec![p_vote(1, Vote::No(Refusal::Busy))]);
    out.clear();
    p.handle(prepare_msg(1), &mut out);
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
        p.handle(prepare_msg(seq), &mut out);
        p.prepared(0, txn(seq), Ok(1), &mut out);
        p.handle(p_decide(seq, Decided::Commit(prep(3, seq))), &mut out);
        p.committed(txn(seq), &mut out);
    }
    out.clear();
    // finished_max is 2: transaction 1 is forgotten, and its late duplicate prepare runs
    // again as prepare (3, 4).
    p.handle(prepare_msg(3), &mut out);
    assert!(out.is_empty());
    p.handle(prepare_msg(1), &mut out);
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
    p.handle(p_decide(1, Decided::Commit(prep(3, 1))), &mut out);
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
    p.handle(prepare_msg(1), &mut out);
    p.handle(p_decide(1, Decided::Abort), &mut out);
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
    p.handle(prepare_msg(2), &mut out);
    out.clear();
    p.handle(p_decide(2, Decided::Commit(prep(1, 1))), &mut out);
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
    p.handle(prepare_msg(1), &mut out);
    p.prepared(100, txn(1), Ok(1), &mut out);
    out.clear();
    p.tick(129, &mut out);
    assert!(out.is_empty());
    p.tick(130, &mut out);
    p.tick(149, &mut out);
    p.tick(150, &mut out);
    assert_eq!(
        out,
        vec![p_inquire(1, prep(3, 1)), p_inquire(1, prep(3, 1))]
    );
    out.clear();
    p.handle(p_decide(1, Decided::Abort), &mut out);
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
            reply: 7,
        }],
        &mut out,
    );
    assert_eq!(out, vec![p_inquire(5, prep(3, 9))]);
    out.clear();
    // The coordinator is still voting and resends its prepare: the recovered vote goes again.
    p.handle(prepare_msg(5), &mut out);
    assert_eq!(
        out,
        vec![p_vote(
            5,
            Vote::Yes {
                prepare: prep(3, 9),
                reply: 7
            }
        )]
    );
    out.clear();
    p.handle(p_decide(5, Decided::Commit(prep(3, 9))), &mut out);
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
        p.handle(prepare_msg(seq), &mut out);
    }
    out.clear();
    p.handle(prepare_msg(5), &mut out);
    assert_eq!(out, vec![p_vote(5, Vote::No(Refusal::Overloaded))]);
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
                },
            },
            Message::Vote {
                txn,
                from: C,
                vote: Vote::No(Refusal::Failed("WRONGTYPE".into())),
            },
            Message::Decide {
                txn,
                decision: Decided::Commit(prep(2, 1)),
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
        ],
    };
    let text = toml::to_string(&frame).unwrap();
    assert_eq!(toml::from_str::<Frame>(&text).unwrap(), frame, "{text}");
}

//! The simulation of `sim` with membership changes under faults (issue 22: nodes join and
//! leave; restarts during a membership change).
//!
//! A pool of [`POOL`] nodes; the partition starts on three of them. While the clients and the
//! nemesis run, a driver moves the partition again and again: it picks a new placement (the
//! cluster's view), one replica swapped for a node outside it, and moves the membership there
//! as the server's reconciler does, on whichever node leads, trying again every second until it
//! matches or the view moves on. Each try is either the server's own `Part::conform` or the
//! same two steps taken one at a time (`add_learner`, blocking until the learner caught up,
//! then `change_membership`), so that for some seeds the driver crashes, on purpose, the leader
//! or the new learner right after `add_learner` returns, and the leader, a node leaving or a
//! node joining once the leader's membership turns joint. As the server does, a node opens
//! its replica while the view places it there (and, at a restart, one its stored membership
//! still counts), a born member initializes the group only while the placement is the born
//! one, and a replica the view no longer places closes, unless it leads, once the leader's
//! committed, uniform membership no longer has it (neither a voter nor a learner: the leader
//! removes learners the view left), and is then emptied (`replica::empty`: its data, log and
//! snapshot go, its vote and a floor stay; one emptying in four is cut short and finished by
//! the next open). Snapshots every 20 entries make a new learner catch up by a snapshot
//! install, and the nemesis crashes nodes during installs.
//!
//! Checked once every fault is healed, besides `sim`'s checks (strict serializability of the
//! whole history, every acknowledged append present, no index applied with two different
//! entries, a write within `RECOVERY_MS`), on the voters of the final membership:
//!
//! 1. the membership reaches the last placement the driver asked for within `RECOVERY_MS` of
//!    the write (the driver goes on trying, as the server's reconciler would);
//! 2. the committed membership entries, in log order: each configuration among the placements
//!    the driver asked for (or the born one), each one coherent with the one before (a joint
//!    configuration between any two different voter sets), every change the driver saw succeed
//!    among them in the order it saw them (with the voters it asked, no other), and the last one
//!    the final placement alone;
//! 3. the final voters' data identical once caught up.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use openraft::{BasicNode, EntryPayload, Membership, ServerState};
use parking_lot::Mutex;
use tokio::time::{Instant, sleep, timeout};

use super::{ADDING, CHANGING, IDLE, Mutation, Net, RECOVERY_MS, Rng, Run, Sim, nemesis, seeds};
use crate::replica::view::{View, ViewNode};
use crate::replica::{self, Tc, log, machine};

/// Nodes in the pool.
const POOL: usize = 5;
/// Replicas of the partition.
const REPLICAS: usize = 3;
/// Simulated time the nemesis (and the driver) run for.
const FAULT_MS: u64 = 20_000;
/// How long one step of a try (adding a learner, changing the voters) may take before the
/// driver gives up on it (the server's `CONFORM_WAIT` is 120 s; short here, so that a step
/// stuck on a deposed leader does not stop the driver for the rest of the run).
const STEP_MS: u64 = 6_000;
/// The reconciler's period (`RECONCILE_EVERY`).
const RECONCILE_MS: u64 = 1_000;

/// Seeds every CI run checks.
const SEEDS: &[u64] = &[1, 2, 3, 4];

/// What the driver asked and saw.
#[derive(Default)]
struct Changes {
    /// Every placement the view had, in order; the first is the born one.
    asked: Vec<BTreeSet<u64>>,
    /// The voter sets of the changes the driver saw succeed, in order.
    done: Vec<BTreeSet<u64>>,
    /// Tries (each a `Part::conform` or its two steps) and those through `Part::conform`.
    tries: u64,
    conforms: u64,
    /// Crashes the driver made on purpose: after `add_learner`, during the joint phase.
    crashed_after_learner: u64,
    crashed_joint: u64,
}

/// The view the server's `Part::conform` takes: only its nodes' addresses are used.
fn view() -> View {
    View {
        epoch: 1,
        layout: 0,
        r: REPLICAS,
        configured: POOL,
        timeout_ms: 1_000,
        nodes: (0..POOL)
            .map(|i| ViewNode {
                id: format!("n{i}"),
                addr: format!("n{i}"),
                slots: Vec::new(),
                removed: false,
            })
            .collect(),
        parts: Vec::new(),
        born: Vec::new(),
    }
}

/// The voters of `m` (of both sets of a joint configuration), and whether it is uniform.
fn voters(m: &Membership<u64, BasicNode>) -> (BTreeSet<u64>, bool) {
    (m.voter_ids().collect(), m.get_joint_config().len() == 1)
}

/// Crashes node `i` now and restarts it after `down`, unless every fault is healed.
async fn crash_for(sim: &Arc<Sim>, i: usize, down: Duration) -> bool {
    if sim.healed.load(Ordering::SeqCst) {
        return false;
    }
    sim.crash(i).await;
    let sim = Arc::clone(sim);
    tokio::spawn(async move {
        sleep(down).await;
        sim.start(i).await;
    });
    true
}

/// One try at moving the membership to `target`, on the node that leads: `Ok` once it is
/// `target`, uniform. `hooks`: the chance (per mille) of each crash on purpose.
async fn attempt(
    sim: &Arc<Sim>,
    target: &BTreeSet<u64>,
    rng: &mut Rng,
    hooks: u64,
    changes: &Mutex<Changes>,
) -> Result<(), String> {
    let l = sim.leader().ok_or("no leader")?;
    let up = sim.up(l).ok_or("the leader is down")?;
    let raft = up.raft.clone();
    let m = raft.metrics().borrow().membership_config.clone();
    let (now, uniform) = voters(m.membership());
    let stray = m.membership().learner_ids().any(|n| !target.contains(&n));
    if uniform && now == *target && !stray {
        return Ok(());
    }
    // As `Part::conform`: a leader outside its own membership is stepping down.
    replica::may_change_membership(&raft)?;
    // As `Part::conform`: an earlier change this leader cannot finish toward the target goes
    // to its newer configuration first.
    let goal = replica::next_voters(m.membership(), l as u64, target);
    changes.lock().tries += 1;
    let learners: BTreeSet<u64> = m.membership().learner_ids().collect();
    let adding: Vec<u64> = target
        .iter()
        .copied()
        .filter(|n| !now.contains(n) && !learners.contains(n))
        .collect();
    let seen = if rng.chance(300) {
        // The server's own code: both steps in one call.
        changes.lock().conforms += 1;
        let phase = if adding.is_empty() { CHANGING } else { ADDING };
        sim.changing.store(phase, Ordering::SeqCst);
        let part = sim.part(l, up);
        let done = timeout(
            Duration::from_millis(2 * STEP_MS),
            part.conform(&view(), target.clone()),
        )
        .await;
        sim.changing.store(IDLE, Ordering::SeqCst);
        done.map_err(|_| "Part::conform timed out".to_string())??;
        raft.metrics().borrow().membership_config.clone()
    } else if uniform && now == *target {
        // Only learners outside the target are left (added for a placement the view left):
        // removed, as `Part::conform` does.
        return replica::remove_learners(&raft, target, sim.part).await;
    } else {
        for &n in &adding {
            sim.changing.store(ADDING, Ordering::SeqCst);
            if let Err(e) = replica::may_change_membership(&raft) {
                sim.changing.store(IDLE, Ordering::SeqCst);
                return Err(e);
            }
            let added = timeout(
                Duration::from_millis(STEP_MS),
                raft.add_learner(n, BasicNode::new(format!("n{n}")), true),
            )
            .await;
            match added {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    sim.changing.store(IDLE, Ordering::SeqCst);
                    return Err(format!("adding {n} as a learner: {e}"));
                }
                Err(_) => {
                    sim.changing.store(IDLE, Ordering::SeqCst);
                    return Err(format!("adding {n} as a learner timed out"));
                }
            }
            sim.changing.store(CHANGING, Ordering::SeqCst);
            // Between the learner and the change of voters: the leader or the learner dies.
            if rng.chance(hooks) {
                let victim = if rng.chance(500) { l } else { n as usize };
                if crash_for(sim, victim, rng.ms(50, 3_000)).await {
                    changes.lock().crashed_after_learner += 1;
                }
            }
        }
        sim.changing.store(CHANGING, Ordering::SeqCst);
        // During the joint phase: the leader, a node leaving or one joining dies.
        let watcher = rng.chance(hooks).then(|| {
            let removed: Vec<u64> = now.difference(target).copied().collect();
            let mut pick: Vec<u64> = vec![l as u64];
            pick.extend(removed);
            pick.extend(target.difference(&now).copied());
            let victim = pick[rng.below(pick.len() as u64) as usize] as usize;
            let (after, down) = (rng.ms(0, 30), rng.ms(50, 3_000));
            let (sim, raft) = (Arc::clone(sim), raft.clone());
            tokio::spawn(async move {
                let mut metrics = raft.metrics();
                let joint = metrics
                    .wait_for(|m| m.membership_config.membership().get_joint_config().len() > 1);
                if timeout(Duration::from_millis(STEP_MS), joint)
                    .await
                    .is_err()
                {
                    return false;
                }
                sleep(after).await;
                crash_for(&sim, victim, down).await
            })
        });
        let changed = match replica::may_change_membership(&raft) {
            Ok(()) => Ok(timeout(
                Duration::from_millis(STEP_MS),
                raft.change_membership(goal.clone(), false),
            )
            .await),
            Err(e) => Err(e),
        };
        sim.changing.store(IDLE, Ordering::SeqCst);
        if let Some(watcher) = watcher
            && watcher.await.unwrap_or(false)
        {
            changes.lock().crashed_joint += 1;
        }
        match changed? {
            Ok(Ok(response)) => response.membership.map_or_else(
                || raft.metrics().borrow().membership_config.clone(),
                |m| Arc::new(openraft::StoredMembership::new(Some(response.log_id), m)),
            ),
            Ok(Err(e)) => return Err(format!("changing the voters: {e}")),
            Err(_) => return Err("changing the voters timed out".into()),
        }
    };
    if goal != *target {
        return Err(format!(
            "node {l} finished an earlier change to {goal:?} and leaves"
        ));
    }
    // The change succeeded: its voters are the target's, no other.
    let (got, uniform) = voters(seen.membership());
    if !uniform || got != *target {
        sim.violation(format!(
            "a change to {target:?} succeeded, but the membership is {:?}",
            seen.membership()
        ));
    }
    changes.lock().done.push(target.clone());
    replica::remove_learners(&raft, target, sim.part).await
}

/// Whether moving the view to `placement` now leaves every configuration of the leader's
/// membership a majority of nodes that the view places, which therefore keep their replicas
/// open across restarts (see [`Careful`]).
fn keeps_majority(sim: &Sim, placement: &BTreeSet<u64>) -> bool {
    let Some(raft) = sim.leader().and_then(|l| sim.raft(l)) else {
        return false;
    };
    let m = raft.metrics().borrow().membership_config.clone();
    m.membership()
        .get_joint_config()
        .iter()
        .all(|set| 2 * set.intersection(placement).count() > set.len())
}

/// How far the view may run ahead of the membership.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Careful {
    /// The view moves on, before the membership has followed, only to a placement that keeps
    /// a majority of every configuration of the membership.
    Majority,
    /// The view moves on whenever the driver's patience runs out, by another swap from the
    /// placement (an operator's joins and removals in quick succession). A node that restarts
    /// while the view does not place the partition on it does not reopen its replica
    /// (`Replication::start` opens only the placed ones), so two such restarts leave a
    /// membership the view ran two swaps ahead of without a majority, for good: the bug that
    /// `a_membership_behind_the_view_survives_restarts` shows.
    No,
}

/// Moves the partition to a new placement again and again until `stop`.
async fn driver(
    sim: Arc<Sim>,
    seed: u64,
    careful: Careful,
    stop: Arc<AtomicBool>,
    changes: Arc<Mutex<Changes>>,
) {
    let mut rng = Rng::new(seed.wrapping_mul(0x5851_F42D_4C95_7F2D));
    // One seed in three crashes nodes on purpose at the steps of a change, often (drawn, not
    // `seed % 3`: the extra seeds of a run are all congruent modulo 3).
    let hooks = if rng.below(3) == 0 { 500 } else { 0 };
    let mut target = sim.placed.lock().clone();
    let mut settled = true;
    let mut patience = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        // Once the membership followed, or the driver's patience ran out, the view moves on
        // (an operator's next join or removal).
        if settled || Instant::now() >= patience {
            sleep(rng.ms(200, 1_500)).await;
            let mut next = target.clone();
            let inside: Vec<u64> = next.iter().copied().collect();
            let outside: Vec<u64> = (0..POOL as u64).filter(|n| !next.contains(n)).collect();
            next.remove(&inside[rng.below(inside.len() as u64) as usize]);
            next.insert(outside[rng.below(outside.len() as u64) as usize]);
            if careful == Careful::No || keeps_majority(&sim, &next) {
                changes.lock().asked.push(next.clone());
                *sim.placed.lock() = next.clone();
                target = next;
                settled = false;
                patience = Instant::now() + rng.ms(1_000, 15_000);
            }
        }
        // The leader's reconciler tries every second until the membership matches.
        match attempt(&sim, &target, &mut rng, hooks, &changes).await {
            Ok(()) => settled = true,
            Err(_) => sleep(Duration::from_millis(RECONCILE_MS)).await,
        }
    }
}

/// Every node's reconciler (`Replication::reconcile`), until `stop`: opens the replica the
/// view places on a node, and closes one it no longer places (unless it leads) once the
/// leader has a committed, uniform membership without it, then empties it as the server
/// does ([`empty`]). How many were emptied.
async fn reconciler(sim: Arc<Sim>, stop: Arc<AtomicBool>) -> u64 {
    let mut emptied = 0;
    while !stop.load(Ordering::SeqCst) {
        for i in 0..sim.n {
            let me = i as u64;
            if sim.placed.lock().contains(&me) {
                sim.open(i).await;
                continue;
            }
            let Some(raft) = sim.raft(i) else {
                continue;
            };
            if raft.metrics().borrow().state == ServerState::Leader {
                continue;
            }
            if settled_without(&sim, me) {
                sim.leave(i).await;
                if empty(&sim, i).await {
                    emptied += 1;
                }
            }
        }
        sleep(Duration::from_millis(RECONCILE_MS)).await;
    }
    emptied
}

/// Whether the leader has a committed membership, not joint, without `node`
/// (`Part::leader_knows`, `settled`).
fn settled_without(sim: &Sim, node: u64) -> bool {
    let Some(raft) = sim.leader().and_then(|l| sim.raft(l)) else {
        return false;
    };
    let m = raft.metrics().borrow().clone();
    let stored = &m.membership_config;
    let (voters, uniform) = voters(stored.membership());
    let applied = m.last_applied.map(|l| l.index);
    let committed = stored.log_id().is_none_or(|l| Some(l.index) <= applied);
    m.state == ServerState::Leader
        && uniform
        && committed
        && !voters.is_empty()
        && !stored.membership().nodes().any(|(&n, _)| n == node)
}

/// Empties node `i`'s closed replica as the server does (`replica::empty`: its data, its log
/// but for its vote, its snapshot file; a floor kept), unless it opened again meanwhile.
/// One emptying in four is cut short after its mark and the data (a crash part way): the
/// next open finishes it. With `Mutation::ForgetsVote`, the whole log goes, vote and all.
async fn empty(sim: &Sim, i: usize) -> bool {
    let node = &sim.nodes[i];
    let _alone = node.life.lock().await;
    if node.up.lock().is_some() {
        return false;
    }
    let snapshot = node.dir.path().join(machine::SNAPSHOT_FILE);
    let cut_short = sim.net.lock().rng.chance(250);
    let emptied = if sim.mutation == Mutation::ForgetsVote {
        machine::wipe(&node.data_db)
            .and_then(|()| machine::wipe(&node.log_db))
            .and_then(|()| match std::fs::remove_file(&snapshot) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.to_string()),
                _ => Ok(()),
            })
    } else if cut_short {
        log::begin_emptying(&node.log_db).and_then(|()| machine::wipe(&node.data_db))
    } else {
        replica::empty(&node.data_db, &node.log_db, Some(&snapshot))
    };
    if let Err(e) = emptied {
        sim.violation(format!("emptying node {i}'s replica: {e}"));
    }
    true
}

/// 2: the committed membership entries, in log order, against what the driver asked and saw.
fn check_memberships(sim: &Sim, changes: &Changes, last: &BTreeSet<u64>) -> Vec<String> {
    let mut violations = Vec::new();
    let applied = sim.applied.lock().clone();
    let entries = sim.entries.lock();
    let mut chain: Vec<(openraft::LogId<u64>, Membership<u64, BasicNode>)> = Vec::new();
    for (index, id) in applied {
        let key = (id.leader_id.term, id.leader_id.node_id, index);
        let Some(bytes) = entries.get(&key) else {
            violations.push(format!("{id} was applied but never appended"));
            continue;
        };
        let payload: EntryPayload<Tc> = postcard::from_bytes(bytes).expect("an entry decodes");
        if let EntryPayload::Membership(m) = payload {
            chain.push((id, m));
        }
    }
    let asked: BTreeSet<&BTreeSet<u64>> = changes.asked.iter().collect();
    let mut done = changes.done.iter().peekable();
    let mut before: Option<&Membership<u64, BasicNode>> = None;
    for (id, m) in &chain {
        let sets = m.get_joint_config();
        for set in sets {
            if !asked.contains(set) {
                violations.push(format!(
                    "the membership at {id} has voters {set:?}, which no view placed"
                ));
            }
        }
        if let Some(before) = before
            && !before.get_joint_config().iter().any(|b| sets.contains(b))
        {
            violations.push(format!(
                "the membership jumps from {before:?} to {m:?} at {id}, with no joint \
                 configuration between"
            ));
        }
        if sets.len() == 1 && done.peek().is_some_and(|d| **d == sets[0]) {
            done.next();
        }
        before = Some(m);
    }
    if let Some(missing) = done.next() {
        violations.push(format!(
            "the change to {missing:?} succeeded, but no committed membership after the \
             previous changes has these voters: {chain:?}"
        ));
    }
    match chain.last() {
        Some((_, m)) if voters(m) == (last.clone(), true) => {}
        other => violations.push(format!(
            "the last committed membership is {other:?}, not the final placement {last:?}"
        )),
    }
    violations
}

/// Each node's replica: its role, term, log and membership, for a failure's report.
fn describe(sim: &Sim) -> String {
    let mut lines = vec![format!("placed on {:?}", sim.placed.lock())];
    for i in 0..sim.n {
        let node = &sim.nodes[i];
        let line = match sim.raft(i) {
            None if node.down.load(Ordering::SeqCst) => "down".to_string(),
            None => "closed".to_string(),
            Some(raft) => {
                let m = raft.metrics().borrow().clone();
                format!(
                    "{:?} ({:?}) term {} last log {:?} applied {:?} leader {:?} membership {:?}",
                    m.state,
                    m.running_state,
                    m.current_term,
                    m.last_log_index,
                    m.last_applied,
                    m.current_leader,
                    m.membership_config
                )
            }
        };
        lines.push(format!("node {i}: {line}"));
    }
    lines.join("\n")
}

/// What a run did, for its line of output.
#[derive(Debug)]
#[allow(dead_code)]
struct Summary {
    asked: usize,
    done: usize,
    tries: u64,
    conforms: u64,
    final_voters: BTreeSet<u64>,
    crashes_adding: u64,
    crashes_changing: u64,
    crashes_joint: u64,
    crashed_after_learner: u64,
    crashed_joint: u64,
    left: u64,
    emptied: u64,
    run: super::Summary,
}

fn run(seed: u64, careful: Careful, mutation: Mutation) -> Result<Summary, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime");
    rt.block_on(simulate(seed, careful, mutation))
}

async fn simulate(seed: u64, careful: Careful, mutation: Mutation) -> Result<Summary, String> {
    let born: BTreeSet<u64> = (0..REPLICAS as u64).collect();
    let sim = Sim::new_on(
        POOL,
        born.clone(),
        0,
        mutation,
        Arc::new(Mutex::new(Net::new(seed, POOL))),
        Instant::now(),
    );
    for i in 0..POOL {
        sim.start(i).await;
    }
    let changes = Arc::new(Mutex::new(Changes {
        asked: vec![born],
        ..Changes::default()
    }));
    let mut run = Run::begin(&sim, seed);
    let (stop_driver, stop_reconciler) = (Arc::default(), Arc::new(AtomicBool::new(false)));
    let reconciling = tokio::spawn(reconciler(Arc::clone(&sim), Arc::clone(&stop_reconciler)));
    let driving = tokio::spawn(driver(
        Arc::clone(&sim),
        seed,
        careful,
        Arc::clone(&stop_driver),
        Arc::clone(&changes),
    ));
    let faults = nemesis(&[Arc::clone(&sim)], seed, FAULT_MS).await;
    stop_driver.store(true, Ordering::SeqCst);
    if let Err(e) = driving.await {
        std::panic::resume_unwind(e.into_panic());
    }
    if let Err(e) = faults {
        run.stop.store(true, Ordering::SeqCst);
        stop_reconciler.store(true, Ordering::SeqCst);
        return Err(e);
    }
    let recovery_ms = match run.probe(&sim).await {
        Ok(ms) => ms,
        Err(e) => {
            let mut more = Vec::new();
            for i in 0..sim.n {
                if let Some(raft) = sim.raft(i) {
                    let state = raft.with_raft_state(|s| format!("{s:?}"));
                    let state = timeout(Duration::from_secs(2), state).await;
                    more.push(format!("node {i}'s core: {:.900}", format!("{state:?}")));
                }
            }
            return Err(format!("{e}\n{}\n{}", describe(&sim), more.join("\n")));
        }
    };

    // 1. The leader's reconciler finishes the last change.
    let last = sim.placed.lock().clone();
    let healed = Instant::now();
    let mut rng = Rng::new(seed ^ 0x004c_4153_5420);
    while let Err(e) = attempt(&sim, &last, &mut rng, 0, &changes).await {
        sim.stopped()?;
        if healed.elapsed() > Duration::from_millis(RECOVERY_MS) {
            let m = sim
                .leader()
                .and_then(|l| sim.raft(l))
                .map(|r| r.metrics().borrow().membership_config.clone());
            return Err(format!(
                "the membership did not reach {last:?} within {RECOVERY_MS} ms of the write \
                 after healing (last try: {e}); the leader has {m:?}"
            ));
        }
        sleep(Duration::from_millis(RECONCILE_MS)).await;
    }
    // The reconciler opens the replicas of the final placement (one may have closed while the
    // view was elsewhere, and the membership come back to it).
    while let Some(i) = last
        .iter()
        .map(|&n| n as usize)
        .find(|&i| sim.raft(i).is_none())
    {
        if healed.elapsed() > Duration::from_millis(RECOVERY_MS) {
            return Err(format!(
                "node {i}'s replica did not open within {RECOVERY_MS} ms of the write after \
                 healing\n{}",
                describe(&sim)
            ));
        }
        sleep(Duration::from_millis(100)).await;
    }
    stop_reconciler.store(true, Ordering::SeqCst);
    let emptied = match reconciling.await {
        Ok(emptied) => emptied,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    };

    let changes = std::mem::take(&mut *changes.lock());
    for v in check_memberships(&sim, &changes, &last) {
        sim.violation(v);
    }
    let nodes: Vec<usize> = last.iter().map(|&n| n as usize).collect();
    let summary = run.check(&sim, &nodes, recovery_ms).await?;
    let s = &sim.stats;
    Ok(Summary {
        asked: changes.asked.len() - 1,
        done: changes.done.len(),
        tries: changes.tries,
        conforms: changes.conforms,
        final_voters: last,
        crashes_adding: s.crashes_adding.load(Ordering::Relaxed),
        crashes_changing: s.crashes_changing.load(Ordering::Relaxed),
        crashes_joint: s.crashes_joint.load(Ordering::Relaxed),
        crashed_after_learner: changes.crashed_after_learner,
        crashed_joint: changes.crashed_joint,
        left: s.left.load(Ordering::Relaxed),
        emptied,
        run: summary,
    })
}

#[test]
fn replicas_move_between_nodes_under_seeded_faults() {
    for seed in seeds(SEEDS) {
        let began = std::time::Instant::now();
        match run(seed, Careful::Majority, Mutation::None) {
            Ok(summary) => println!(
                "member seed {seed}: ok in {} ms: {summary:?}",
                began.elapsed().as_millis()
            ),
            Err(e) => panic!(
                "member seed {seed} failed; replay with KEEL_SIM_SEED={seed} \
                 (cargo test -p keel-server --lib replica::sim::member):\n{e}"
            ),
        }
    }
}

/// The checks catch a replica that joins by initializing the group itself with the view's
/// placement (what `Replication::open_part` must not do for a replica placed after the group
/// started): its first entry differs from the group's at the same log id.
#[test]
fn the_checks_catch_a_joiner_that_initializes_the_group() {
    let caught = [1u64, 2, 3]
        .iter()
        .find_map(|&seed| run(seed, Careful::Majority, Mutation::JoinerInitializes).err())
        .expect("no seed caught a joiner initializing the group");
    println!("{}", &caught[..caught.len().min(300)]);
    assert!(caught.contains("two different entries"), "{caught}");
}

/// The view moves on by another swap whenever the driver's patience runs out, however far
/// behind the membership is (`Careful::No`: joins and removals in quick succession). A node
/// that restarts while the view has moved a partition away from it reopens the replica its
/// stored membership still counts (once it did not, and the old configuration could be left
/// with one live voter of three, for good: seeds 4 and 15 before 8460c9d), and a replica out
/// of the view stops only once the leader has committed a membership without it.
///
/// Seed 4 also hit openraft's debug assertion `Only leader is allowed to call
/// update_effective_membership()` (two runs in eight): a new leader in the old configuration
/// of a joint one that an earlier leader began, but not in its new one, moving it to a third
/// placement: openraft goes through `[new, third]`, whose second step this leader appends
/// while its effective membership no longer counts it (`replica::next_voters` now finishes
/// the earlier change alone first).
#[test]
fn a_membership_behind_the_view_survives_restarts() {
    survive(Careful::No, Mutation::None, &[4, 15], 0);
}

/// [`a_membership_behind_the_view_survives_restarts`] over seeds 1 to 80 as well.
#[test]
#[ignore = "long: 82 seeds, about a minute in a debug build"]
fn a_membership_behind_the_view_survives_restarts_over_many_seeds() {
    survive(Careful::No, Mutation::None, &[4, 15], 80);
}

/// A replica that left is emptied once the leader's committed, uniform membership no longer
/// has it, as the server does (`Replication::empty`). Without its vote and log, that was
/// unsafe: that membership is not yet every node's. Seed 1795570281810405307 once (seed 33
/// and others too, or a follower whose committed entries differ trips openraft's
/// assertions): the membership moves from {0, 1, 4} to {0, 1, 3} (committed at index 112 by
/// node 0, term 2, with node 3) while node 1 is down; node 4 leaves and is emptied; the view
/// places the partition on node 4 again, which opens with no log and no vote; node 1
/// restarts with its old log (configuration {0, 1, 4}, no entries past 102), stands for term
/// 5 and gets node 4's vote, which a replica that kept its log would have refused: it leads
/// {0, 1, 4} and overwrites indexes 103 to 115, which node 0 had committed and applied
/// (acknowledged appends lost, two entries applied at one index). Now the emptied replica
/// keeps its vote, and a floor: the last log id it forgot, below which it votes for no
/// candidate (`replica::vote`; `replica::tests::an_emptied_replica_keeps_its_vote_and_
/// refuses_older_logs`).
#[test]
fn a_replica_that_left_is_emptied_safely() {
    survive(
        Careful::Majority,
        Mutation::None,
        &[1_795_570_281_810_405_307, 33, 35],
        0,
    );
}

/// [`a_replica_that_left_is_emptied_safely`] over seeds 1 to 80 as well (81 passed, with
/// 129 emptyings).
#[test]
#[ignore = "long: 83 seeds, about a minute in a debug build"]
fn a_replica_that_left_is_emptied_safely_over_many_seeds() {
    survive(
        Careful::Majority,
        Mutation::None,
        &[1_795_570_281_810_405_307, 33, 35],
        80,
    );
}

/// The checks catch replicas emptied vote and all, with no floor (`Mutation::ForgetsVote`,
/// the server's emptying before the floor): seed 26 (and 7, 20) of 1 to 80, a follower's
/// committed entries overwritten (openraft's `has_log_id` assertion), a replica never caught
/// up. About one seed in thirty catches it, hence ignored.
#[test]
#[ignore = "long: about one seed in thirty catches it, up to a minute"]
fn the_checks_catch_a_replica_emptied_vote_and_all() {
    let caught = (1..=80u64).find_map(|seed| {
        std::panic::catch_unwind(|| run(seed, Careful::Majority, Mutation::ForgetsVote))
            .map_or_else(|_| Some("openraft panicked".to_string()), Result::err)
    });
    let caught = caught.expect("no seed caught replicas emptied vote and all");
    println!("{}", &caught[..caught.len().min(300)]);
}

/// Runs `first`, then seeds 1 to `more` (a seed replays its schedule, not always its
/// interleaving), until one fails: for the tests of bugs that some seeds hit.
fn survive(careful: Careful, mutation: Mutation, first: &[u64], more: u64) {
    let mut list = first.to_vec();
    list.extend(1..=more);
    for seed in seeds(&list) {
        let began = std::time::Instant::now();
        match run(seed, careful, mutation) {
            Ok(summary) => println!(
                "member seed {seed} ({careful:?}): ok in {} ms: {summary:?}",
                began.elapsed().as_millis()
            ),
            Err(e) => panic!("seed {seed} ({careful:?}, {mutation:?}):\n{e}"),
        }
    }
}

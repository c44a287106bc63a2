//! Exactly-once forwarding in a cluster of single copies (`--replicas 1`; `docs/cluster.md`,
//! "Exactly-once forwarding").
//!
//! A write that a node forwards to the slot's owner goes as `KEEL.ONCE <node> <incarnation>
//! <seq> <keep-ms> <until-ms> <command ...>`: the id is the forwarding node's index, a random
//! incarnation drawn when its process started, and a sequence number; `until-ms` is when the
//! forwarding node stops waiting for this try's answer (Unix ms, its clock; 0: never). The owner runs the command in one
//! engine transaction that first reads the kept answer of that id and, if there is none,
//! writes the command's reply under the id (`FF 'o' 'q' id`, with its deadline) and an entry
//! of the by-time index (`FF 'o' 'Q' deadline id`) in the same commit: the answer is exactly
//! as durable as the write. A request whose id has an answer runs nothing and gets the answer.
//! Two attempts of one id running at once conflict on the answer's key, so one commits and the
//! other, run again, finds its answer. The reaper deletes answers past their deadline
//! ([`sweep`]). The forwarding node sends a request again with the same id when the answer was
//! lost (`cluster::Down { sent: true }`), within [`RETRY_TIMEOUTS`] cluster timeouts; every
//! answer is kept [`KEEP_SLACK_MS`] longer than that. A try that reaches the owner more
//! than [`LATE_SLACK_MS`] after its `until-ms` (held back by the network, or unread while
//! the owner was stopped) is refused unrun: run then, it could come after its answer was
//! swept, and run twice.
//!
//! `KEYS`, `SCAN`, `DBSIZE`, `RANDOMKEY` and `KEEL.RANGE` list only user keys (plain keys and
//! meta records), so kept answers are invisible to them; `FLUSHDB`/`FLUSHALL` delete the data
//! and leave the kept answers (a write sent again after a flush must not run twice), which
//! the sweep removes in their time.

use std::ops::{Bound, ControlFlow};

use std::sync::Arc;

use bytes::Bytes;
use keel::{Db, Txn};

use crate::data::{Fail, View};
use crate::keyspace::INTERNAL;

/// After [`INTERNAL`]: exactly-once records (`FF 'o' 'q'` answers by id, `FF 'o' 'Q'` by time).
pub const ONCE: u8 = b'o';
/// Kept answers by id: `FF 'o' 'q' <node u16> <incarnation u64> <seq u64>` (big-endian) →
/// `<deadline ms u64 BE> <reply>`.
const ANSWERS: &[u8] = &[INTERNAL, ONCE, b'q'];
/// The same by deadline: `FF 'o' 'Q' <deadline ms u64 BE> <id>` → empty.
const BY_TIME: &[u8] = &[INTERNAL, ONCE, b'Q'];

/// The forwarding node retries a write whose answer was lost for this many cluster timeouts.
pub const RETRY_TIMEOUTS: u32 = 3;
/// Answers are kept this much longer than the retry window, so that one sent again at the
/// window's end still finds its answer.
pub const KEEP_SLACK_MS: u64 = 10_000;
/// The longest a `KEEL.ONCE` may ask its answer to be kept (bounds what a client can make the
/// node keep).
pub const KEEP_MS_MAX: u64 = 3_600_000;
/// Most answers one sweep deletes.
pub const SWEEP_BATCH: usize = 512;
/// How far past a try's `until-ms` the owner's clock may be before it refuses the try: room
/// for the nodes' clocks to differ (less than [`KEEP_SLACK_MS`] minus this).
pub const LATE_SLACK_MS: u64 = 2_000;
/// The start of the refusal of a late try.
pub const LATE: &str = "TRYAGAIN keel: a forwarded write reached its owner";

/// A forwarded write's id: the forwarding node, its incarnation, its sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Id {
    pub node: u16,
    pub incarnation: u64,
    pub seq: u64,
}

impl Id {
    fn bytes(&self) -> [u8; 18] {
        let mut b = [0u8; 18];
        b[..2].copy_from_slice(&self.node.to_be_bytes());
        b[2..10].copy_from_slice(&self.incarnation.to_be_bytes());
        b[10..].copy_from_slice(&self.seq.to_be_bytes());
        b
    }

    /// The record of this id's answer.
    pub fn answer_key(&self) -> Vec<u8> {
        [ANSWERS, &self.bytes()].concat()
    }
}

/// A parsed `KEEL.ONCE`: the id, how long to keep the answer, when the sender stops waiting
/// (0: never), the wrapped command.
pub struct Request<'a> {
    pub id: Id,
    pub keep_ms: u64,
    pub until_ms: u64,
    pub command: &'a [Bytes],
}

impl Request<'_> {
    /// The refusal of this try if it arrived too late at `now_ms`.
    pub fn late(&self, now_ms: u64) -> Option<String> {
        (self.until_ms != 0 && now_ms > self.until_ms.saturating_add(LATE_SLACK_MS)).then(|| {
            format!(
                "{LATE} {} ms after its sender stopped waiting; it was not applied",
                now_ms - self.until_ms
            )
        })
    }
}

/// Parses `KEEL.ONCE node incarnation seq keep-ms until-ms command [arg ...]` (`args[0]` is
/// the name).
pub fn parse(args: &[Bytes]) -> Result<Request<'_>, Fail> {
    if args.len() < 7 {
        return Err("ERR wrong number of arguments for 'keel.once' command".into());
    }
    fn number<T: std::str::FromStr>(arg: &[u8], what: &str) -> Result<T, Fail> {
        std::str::from_utf8(arg)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("ERR keel: KEEL.ONCE's {what} is not a valid number").into())
    }
    let id = Id {
        node: number(&args[1], "node index")?,
        incarnation: number(&args[2], "incarnation")?,
        seq: number(&args[3], "sequence number")?,
    };
    let keep_ms: u64 = number(&args[4], "keep-ms")?;
    if keep_ms > KEEP_MS_MAX {
        return Err(format!("ERR keel: KEEL.ONCE keeps an answer at most {KEEP_MS_MAX} ms").into());
    }
    Ok(Request {
        id,
        keep_ms,
        until_ms: number(&args[5], "until-ms")?,
        command: &args[6..],
    })
}

/// The request's words for forwarding `command` with `id`, keeping its answer `keep_ms`; its
/// sender waits for the answer until `until_ms` (0: for ever).
pub fn wrap(id: Id, keep_ms: u64, until_ms: u64, command: &[Bytes]) -> Vec<Bytes> {
    let mut words = Vec::with_capacity(command.len() + 6);
    words.push(Bytes::from_static(b"KEEL.ONCE"));
    words.push(Bytes::from(id.node.to_string()));
    words.push(Bytes::from(id.incarnation.to_string()));
    words.push(Bytes::from(id.seq.to_string()));
    words.push(Bytes::from(keep_ms.to_string()));
    words.push(Bytes::from(until_ms.to_string()));
    words.extend_from_slice(command);
    words
}

/// The attempts of forwarded blocking pops running on this node, by id: at most one per id.
/// A blocking pop's answer may be lost while the pop still waits here (the forwarding node
/// saw its connection break); the forwarding node then sends it again with the same id. The
/// new attempt cancels the old one and waits until it has ended, then looks for the kept
/// answer: either the old attempt popped (and kept its answer in the same commit) or it
/// never will, so the element goes to exactly one answer.
#[derive(Default)]
pub struct Attempts(parking_lot::Mutex<std::collections::HashMap<[u8; 18], Arc<Attempt>>>);

/// One attempt of a forwarded blocking pop.
#[derive(Default)]
pub struct Attempt {
    /// Set by a newer attempt of the same id: stop waiting, and answer nothing.
    pub superseded: tokio_util::sync::CancellationToken,
    /// Set when the attempt has ended.
    ended: tokio_util::sync::CancellationToken,
}

/// An attempt running: it ends (and leaves [`Attempts`]) when dropped.
pub struct Running<'a> {
    attempts: &'a Attempts,
    key: [u8; 18],
    pub attempt: Arc<Attempt>,
}

impl Attempts {
    /// Makes this the one attempt of `id` on this node: an older one is told it was
    /// superseded, and this waits until it has ended.
    pub async fn enter(&self, id: Id) -> Running<'_> {
        let key = id.bytes();
        let attempt = Arc::new(Attempt::default());
        let older = self.0.lock().insert(key, Arc::clone(&attempt));
        if let Some(older) = older {
            older.superseded.cancel();
            older.ended.cancelled().await;
        }
        Running {
            attempts: self,
            key,
            attempt,
        }
    }

    /// Attempts running now.
    pub fn count(&self) -> usize {
        self.0.lock().len()
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let mut map = self.attempts.0.lock();
        if map
            .get(&self.key)
            .is_some_and(|a| Arc::ptr_eq(a, &self.attempt))
        {
            map.remove(&self.key);
        }
        drop(map);
        self.attempt.ended.cancel();
    }
}

/// The kept answer of `id`, read in `txn` (so that an attempt that commits one conflicts
/// with this transaction).
pub fn kept(txn: &mut Txn<'_>, id: Id) -> Result<Option<Vec<u8>>, Fail> {
    let value = txn.get(&id.answer_key())?;
    match value {
        Some(v) if v.len() >= 8 => Ok(Some(v[8..].to_vec())),
        Some(_) => Err("ERR keel: a damaged exactly-once record".into()),
        None => Ok(None),
    }
}

/// Keeps `reply` as `id`'s answer until `deadline_ms`, in `txn`.
pub fn keep(txn: &mut Txn<'_>, id: Id, deadline_ms: u64, reply: &[u8]) -> Result<(), Fail> {
    let mut value = Vec::with_capacity(8 + reply.len());
    value.extend_from_slice(&deadline_ms.to_be_bytes());
    value.extend_from_slice(reply);
    txn.put(&id.answer_key(), &value)?;
    txn.put(
        &[BY_TIME, &deadline_ms.to_be_bytes(), &id.bytes()].concat(),
        b"",
    )?;
    Ok(())
}

/// Deletes up to [`SWEEP_BATCH`] kept answers whose deadline is before `now_ms` (blind
/// deletes: nothing else writes an answer once kept).
pub fn sweep(db: &Db, now_ms: u64) -> Result<crate::reaper::Done, Fail> {
    let due: Vec<Vec<u8>> = {
        let snap = db
            .snapshot()
            .map_err(|e| Fail::from(format!("ERR keel: {e}")))?;
        let end = [BY_TIME, &now_ms.to_be_bytes()].concat();
        let mut due = Vec::new();
        View::Snap(&snap).range(
            Bound::Included(BY_TIME.to_vec()),
            Bound::Excluded(end),
            false,
            |k, _| {
                due.push(k.to_vec());
                if due.len() > SWEEP_BATCH {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            },
        );
        due
    };
    let full = due.len() > SWEEP_BATCH;
    let due = &due[..due.len().min(SWEEP_BATCH)];
    if due.is_empty() {
        return Ok(crate::reaper::Done::default());
    }
    let mut txn = db
        .begin()
        .map_err(|e| Fail::from(format!("ERR keel: {e}")))?;
    for k in due {
        txn.delete(&[ANSWERS, &k[BY_TIME.len() + 8..]].concat())?;
        txn.delete(k)?;
    }
    match txn.commit() {
        Ok(Ok(_)) => Ok(crate::reaper::Done {
            deleted: due.len() as u64,
            full,
        }),
        Ok(Err(conflict)) => Err(format!("ERR keel: answer sweep conflicted: {conflict}").into()),
        Err(e) => Err(format!("ERR keel: {e}").into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A newer attempt of an id supersedes the one running and starts only once it ended;
    /// attempts of other ids do not meet.
    #[tokio::test]
    async fn a_newer_attempt_supersedes_the_running_one_and_waits_for_its_end() {
        let attempts = Attempts::default();
        let id = Id {
            node: 1,
            incarnation: 2,
            seq: 3,
        };
        let first = attempts.enter(id).await;
        let other = attempts.enter(Id { seq: 4, ..id }).await;
        assert_eq!(attempts.count(), 2);
        let superseded = first.attempt.superseded.clone();
        let ended = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let second = async {
            let running = attempts.enter(id).await;
            assert!(
                ended.load(std::sync::atomic::Ordering::SeqCst),
                "started first"
            );
            running
        };
        let end_first = async {
            superseded.cancelled().await;
            ended.store(true, std::sync::atomic::Ordering::SeqCst);
            drop(first);
        };
        let (second, ()) = tokio::join!(second, end_first);
        assert!(!other.attempt.superseded.is_cancelled());
        assert_eq!(attempts.count(), 2);
        drop(second);
        drop(other);
        assert_eq!(attempts.count(), 0);
    }

    fn args(words: &[&str]) -> Vec<Bytes> {
        words.iter().map(|w| Bytes::from(w.to_string())).collect()
    }

    #[test]
    fn parses_and_wraps() {
        let id = Id {
            node: 2,
            incarnation: u64::MAX,
            seq: 7,
        };
        let command = args(&["INCR", "a"]);
        let words = wrap(id, 1500, 1_000_000, &command);
        let r = parse(&words).expect("parses");
        assert_eq!(r.id, id);
        assert_eq!((r.keep_ms, r.until_ms), (1500, 1_000_000));
        assert_eq!(r.command, &command[..]);
        let too_long = format!("KEEL.ONCE 1 2 3 {} 5 GET a", KEEP_MS_MAX + 1);
        for bad in [
            "KEEL.ONCE 1 2 3 4 5",
            "KEEL.ONCE x 2 3 4 5 GET a",
            "KEEL.ONCE 70000 2 3 4 5 GET a",
            "KEEL.ONCE 1 2 3 4 soon GET a",
            &too_long,
        ] {
            let words: Vec<&str> = bad.split(' ').collect();
            assert!(parse(&args(&words)).is_err(), "{bad}");
        }
        // Late only past the slack, and never without a deadline.
        assert_eq!(r.late(1_000_000 + LATE_SLACK_MS), None);
        let late = r.late(1_000_001 + LATE_SLACK_MS).expect("late");
        assert!(
            late.starts_with(LATE) && late.contains("not applied"),
            "{late}"
        );
        let forever = wrap(id, 1500, 0, &command);
        assert_eq!(parse(&forever).expect("parses").late(u64::MAX), None);
    }

    #[test]
    fn keeps_and_sweeps_by_deadline() {
        let db = &Db::in_memory();
        let ids: Vec<Id> = (0..3)
            .map(|seq| Id {
                node: 1,
                incarnation: 9,
                seq,
            })
            .collect();
        for (i, id) in ids.iter().enumerate() {
            let mut txn = db.begin().expect("begin");
            assert_eq!(kept(&mut txn, *id).expect("reads"), None);
            keep(&mut txn, *id, 1000 * (i as u64 + 1), b":1\r\n").expect("keeps");
            txn.put(b"user", b"v").expect("put");
            assert!(txn.commit().expect("commits").is_ok());
        }
        let mut txn = db.begin().expect("begin");
        assert_eq!(
            kept(&mut txn, ids[0]).expect("reads"),
            Some(b":1\r\n".to_vec())
        );
        drop(txn);
        // Due: deadlines before 2000 ms (the first only).
        assert_eq!(
            sweep(db, 2000).expect("sweeps"),
            crate::reaper::Done {
                deleted: 1,
                full: false
            }
        );
        let mut txn = db.begin().expect("begin");
        assert_eq!(kept(&mut txn, ids[0]).expect("reads"), None);
        assert!(kept(&mut txn, ids[1]).expect("reads").is_some());
        drop(txn);
        assert_eq!(sweep(db, 10_000).expect("sweeps").deleted, 2);
        let snap = db.snapshot().expect("snapshot");
        // Only the user's key is left: both indexes of the answers are gone.
        assert_eq!(snap.range::<[u8]>(..).count(), 1);
    }
}

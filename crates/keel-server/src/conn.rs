//! One client connection: read, parse, run, reply, in a loop; plus the connection-level
//! commands (`HELLO`, `AUTH`, `CLIENT`, ...) and `MULTI`/`EXEC`/`WATCH`.
//!
//! Pipelining: every whole request already read is run before the replies are written, so a
//! pipeline of N requests costs one read and one write. Memory per connection is bounded: the
//! input buffer by the largest request (`proto-max-bulk-len` per argument, [`QUERY_BYTES_MAX`]
//! per request); the output buffer is written out whenever it passes [`OUT_FLUSH_BYTES`], and a
//! connection that stops reading stops being read from; one reply may not exceed
//! `reply_bytes_max`.
//!
//! Transactions: a command outside `MULTI` is its own engine transaction, retried on conflict.
//! `EXEC` runs the queue as one engine transaction, also retried on conflict unless `WATCH`
//! says otherwise. Each `WATCH` opens a fresh engine transaction, records its snapshot
//! timestamp for each newly watched key, and keeps the transaction as the snapshot later reads
//! see (until the next `WATCH`). `EXEC` runs the queue in a new transaction that first reads
//! the newest commit timestamp of every watched key, deletions included
//! ([`Txn::newest_ts`]): if one is above the key's `WATCH`, a commit changed the key after
//! it (even to an equal value, even a create then a delete) and `EXEC` replies null. The
//! first `WATCH`'s transaction stays open until `EXEC` is done, so no such deletion is
//! collected meanwhile. Those reads make a later commit to a watched key conflict, so a
//! conflicting `EXEC` is retried whole, re-checking the watched keys each time: never a lost
//! update.
//!
//! Pub/sub (`pubsub`): a subscribed connection's task also wakes for its mailbox, and writes the
//! messages waiting there before each command's reply and at the end of each pass. A RESP2
//! subscriber runs only the commands Redis allows it. `PUBLISH` inside `MULTI` is sent once
//! `EXEC` has committed, its count written into its slot ([`Out::later`]); a rolled-back `EXEC`
//! sends nothing and writes 0 there.
//!
//! Split keys (the engine's Doppel mode): a transaction that reads a split key, or writes it
//! with anything but `KEEL.ADD`/`KEEL.MAX`/`KEEL.MIN`, loses a conflict with reason `Split`
//! (also when the engine made its write wait for the reconciliation). Every retry loop
//! here then waits for the key's reconciliation ([`keel::Db::wait_joined`]) instead of backing
//! off, and runs the next attempt right after it, in the joined phase, on the same thread
//! ([`Conn::attempt`]). `KEEL.*` commands never read, so they never wait for this.

use std::future::Future;
use std::net::SocketAddr;
use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use keel::Txn;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::cluster::{self, Route};
use crate::data::{self, Ctx, Fail, NOT_INTEGER, SYNTAX, View};
use crate::hot;
use crate::keyspace as ks;
use crate::lanes::Lane;
use crate::once;
use crate::pubsub::{self, Kind, Mailbox, Subs};
use crate::reply::{Out, Proto};
use crate::resp::{self, Limits, Parsed, Request};
use crate::server::{ClientInfo, Shared};
use crate::table::{self, Cmd, Spec};

/// Replies are written to the socket once this many bytes are pending.
pub const OUT_FLUSH_BYTES: usize = 64 * 1024;
/// The largest request (all arguments together) a client may send; a bigger one closes the
/// connection, as Redis's `client-query-buffer-limit` does.
pub const QUERY_BYTES_MAX: usize = keel::limits::TXN_WRITE_BYTES_MAX + resp::INLINE_BYTES_MAX;
/// Commands one `MULTI` may queue.
pub const MULTI_QUEUE_MAX: usize = 1 << 16;
/// Bytes of arguments one `MULTI` may queue: what one engine transaction may write.
pub const MULTI_QUEUE_BYTES_MAX: usize = keel::limits::TXN_WRITE_BYTES_MAX;
/// Keys one connection may watch.
pub const WATCH_KEYS_MAX: usize = 1 << 16;
/// Attempts a conflicting single command or `EXEC` makes before it reports the conflict.
pub const CONFLICT_ATTEMPTS_MAX: u32 = 64;
/// Most pipelined data commands run as one transaction.
pub const PIPELINE_BATCH_MAX: usize = 256;
/// Initial read buffer.
const READ_BYTES: usize = 16 * 1024;
/// Argument slots (ranges while parsing, `Bytes` while batching) a connection keeps between
/// reads, 128 KiB at most; more, left by a wider request or batch, are freed.
const ARGS_KEPT_MAX: usize = 4096;

/// What a commit came to: a timestamp, a lost conflict, or an error.
type CommitOutcome = Result<Result<keel::Committed, keel::Conflict>, keel::CommitError>;

const NOAUTH: &str = "NOAUTH Authentication required.";
const ONCE_ONLY: &str = "ERR keel: KEEL.ONCE carries writes between the nodes of a cluster \
                         of single copies (--cluster-node ... --replicas 1)";
const PING_ARITY: &str = "ERR wrong number of arguments for 'ping' command";
const WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";

/// What the connection loop does after a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    Continue,
    /// Write what is pending, then close (QUIT, protocol errors, SHUTDOWN).
    Close,
    /// A blocking pop found nothing: wait for a push ([`Conn::block`]).
    Block,
}

struct Watch {
    /// The snapshot reads between `WATCH` and `EXEC` see: the latest `WATCH`'s.
    txn: Txn<'static>,
    /// The first `WATCH`'s transaction, once a later one replaced `txn`: while it is open
    /// the collector keeps every deletion committed after it, which `EXEC` must see.
    first: Option<Txn<'static>>,
    /// Each watched engine key (a user key's plain key and meta record) with the snapshot
    /// timestamp of the `WATCH` that watched it.
    keys: Vec<(Bytes, keel::Ts)>,
    /// The deadlines (unix ms) of watched keys that had one, still ahead, when watched: one
    /// that has passed by `EXEC` aborts it, as in Redis, even if nothing deleted the key yet.
    deadlines: Vec<u64>,
    /// Cluster mode: what other nodes recorded for their watched keys, by node.
    remote: Vec<(usize, crate::xnode::WatchReport)>,
}

/// What `WATCH` of `keys` records, read in `txn`: the engine keys whose change aborts the
/// `EXEC` (a user key's plain key and meta record, and a collection's size record), and the
/// deadlines still ahead of keys that have one.
///
/// A collection's members need no watching of their own: every command that changes a
/// collection writes its size record, with the engine's commutative add (0 when it only
/// overwrites members), so that writers of different members still do not conflict with
/// each other, but a `WATCH` of the collection sees every change (docs/types.md).
pub(crate) fn watch_targets(
    txn: &mut Txn<'_>,
    keys: &[Bytes],
) -> Result<(Vec<Bytes>, Vec<u64>), Fail> {
    let mut engine_keys: Vec<Bytes> = Vec::with_capacity(keys.len() * 2);
    let mut deadlines = Vec::new();
    for user_key in keys {
        let meta_key = crate::keyspace::meta_key(user_key);
        engine_keys.push(Bytes::from(
            crate::keyspace::plain_key(user_key).into_owned(),
        ));
        engine_keys.push(Bytes::from(meta_key.to_vec()));
        // A collection's size record too, which every change of the collection writes (a
        // packed hash has none: every change of it rewrites its meta record).
        let meta = txn.get_with(&meta_key, |v| v.map(crate::keyspace::Meta::decode))?;
        if let Some(Ok(m)) = &meta
            && m.deadline > crate::keyspace::unix_ms()
        {
            deadlines.push(m.deadline);
        }
        if let Some(Ok(m)) = meta
            && m.ty != crate::keyspace::Type::String
            && !m.packed
        {
            engine_keys.push(Bytes::from(
                crate::keyspace::size_key(m.generation).to_vec(),
            ));
        }
    }
    for key in &engine_keys {
        // Rejects a key over the engine's limit, as any read of it does.
        txn.newest_ts(key)?;
    }
    Ok((engine_keys, deadlines))
}

/// The `[key, value]` pairs of a `KEEL.RANGE` reply (an array of two-element arrays of bulk
/// strings, the same in RESP2 and RESP3).
fn parse_pairs(reply: &[u8]) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    fn line<'a>(input: &mut &'a [u8]) -> Option<&'a [u8]> {
        let at = input.windows(2).position(|w| w == b"\r\n")?;
        let (head, rest) = input.split_at(at);
        *input = &rest[2..];
        Some(head)
    }
    fn count(input: &mut &[u8], kind: u8) -> Option<usize> {
        let head = line(input)?;
        let (&first, digits) = head.split_first()?;
        (first == kind).then_some(())?;
        std::str::from_utf8(digits).ok()?.parse().ok()
    }
    fn bulk(input: &mut &[u8]) -> Option<Vec<u8>> {
        let len = count(input, b'$')?;
        let (value, rest) = input.split_at_checked(len)?;
        *input = rest.strip_prefix(b"\r\n")?;
        Some(value.to_vec())
    }
    let mut input = reply;
    let n = count(&mut input, b'*')?;
    let mut pairs = Vec::with_capacity(n);
    for _ in 0..n {
        (count(&mut input, b'*')? == 2).then_some(())?;
        pairs.push((bulk(&mut input)?, bulk(&mut input)?));
    }
    input.is_empty().then_some(pairs)
}

/// The work of a transaction across nodes: each node and its part.
type AcrossWork = Vec<(keel_cluster::txn::Peer, crate::xnode::Work)>;

/// Where a command of a transaction across nodes or partitions has its reply.
enum Place {
    /// Run on one node (or partition): its reply is at (work index, position).
    At(usize, usize),
    /// A multi-key command split key by key ([`per_key`]): one part per key, and how they
    /// merge.
    Split(Vec<(usize, usize)>, Merge),
    /// Answered by the node the client is on (`PING`, `ECHO`, `TIME`, `ROLE`, `UNWATCH`, which
    /// touch no data, and `SWAPDB`'s refusal), when the transaction is planned.
    Here(Vec<u8>),
}

impl Place {
    /// Where a command that touches no data is answered, if `cmd` is one: `PING`, `ECHO`,
    /// `TIME`, `ROLE`, `UNWATCH` and `WAIT` reply as they would inside a local `EXEC`
    /// (`acked`: [`Conn::exec_acked`]).
    /// `SWAPDB` answers Redis Cluster's refusal here too, an element of `EXEC`'s reply as in
    /// Redis: no partition need see a command that changes nothing in cluster mode.
    fn here(cmd: Cmd, args: &[Bytes], proto: Proto, acked: usize) -> Option<Result<Place, Fail>> {
        let mut buf = BytesMut::new();
        if cmd == Cmd::Swapdb {
            Out::new(&mut buf, proto).error(crate::keys::SWAPDB_IN_CLUSTER);
            return Some(Ok(Place::Here(buf.to_vec())));
        }
        if !in_exec_here(cmd) {
            return None;
        }
        Some(
            simple_in_exec(cmd, args, &mut Out::new(&mut buf, proto), acked)
                .map(|()| Place::Here(buf.to_vec())),
        )
    }
}

/// What an `EXEC` across nodes (or partitions) checks of the connection's `WATCH`.
enum Watching<'a> {
    Nothing,
    /// Unreplicated cluster: the keys watched here and what other nodes recorded.
    Nodes(&'a Watch),
    /// Replicated cluster: each watched key's version, checked in its partition.
    Partitions(&'a [crate::replica::Watched]),
}

/// Each command's reply, from every node's (or partition's) replies by `place`.
fn gather(mut replies: Vec<Vec<Vec<u8>>>, place: &[Place], proto: Proto) -> Vec<Vec<u8>> {
    place
        .iter()
        .map(|place| match place {
            Place::At(i, j) => std::mem::take(&mut replies[*i][*j]),
            Place::Split(at, merge) => {
                let parts: Vec<Vec<u8>> = at
                    .iter()
                    .map(|&(i, j)| std::mem::take(&mut replies[i][j]))
                    .collect();
                let mut buf = BytesMut::new();
                merge_replies(*merge, &parts, &mut Out::new(&mut buf, proto));
                buf.to_vec()
            }
            Place::Here(reply) => reply.clone(),
        })
        .collect()
}

/// How the replies of a multi-key command split per key ([`per_key`]) make its reply.
#[derive(Clone, Copy)]
enum Merge {
    /// `MGET`: each part is a one-key `MGET`; the elements, in order.
    Elements,
    /// `MSET`: `OK`.
    Ok,
    /// `DEL`, `UNLINK`, `EXISTS`, `TOUCH`: the sum of the parts' integers.
    Sum,
}

/// A multi-key command whose keys are on several nodes, as one single-key command per key
/// (run together as one transaction across nodes); `None` for commands that do not split.
fn per_key(cmd: Cmd, args: &[Bytes]) -> Option<(Vec<Vec<Bytes>>, Merge)> {
    let name = args[0].clone();
    match cmd {
        Cmd::Mget => Some((
            args[1..]
                .iter()
                .map(|k| vec![name.clone(), k.clone()])
                .collect(),
            Merge::Elements,
        )),
        Cmd::Mset if args.len() % 2 == 1 => Some((
            args[1..]
                .chunks(2)
                .map(|kv| vec![name.clone(), kv[0].clone(), kv[1].clone()])
                .collect(),
            Merge::Ok,
        )),
        Cmd::Del | Cmd::Unlink | Cmd::Exists | Cmd::Touch => Some((
            args[1..]
                .iter()
                .map(|k| vec![name.clone(), k.clone()])
                .collect(),
            Merge::Sum,
        )),
        _ => None,
    }
}

fn merge_replies(merge: Merge, replies: &[Vec<u8>], out: &mut Out<'_>) {
    match merge {
        Merge::Elements => {
            out.array(replies.len());
            for reply in replies {
                // A one-element array: drop its header line.
                let body = reply
                    .iter()
                    .position(|&b| b == b'\n')
                    .map_or(&reply[..], |at| &reply[at + 1..]);
                out.buf.extend_from_slice(body);
            }
        }
        Merge::Ok => out.ok(),
        Merge::Sum => {
            let sum = replies
                .iter()
                .filter_map(|r| std::str::from_utf8(r.strip_prefix(b":")?).ok())
                .filter_map(|r| r.trim_end().parse::<i64>().ok())
                .sum();
            out.int(sum);
        }
    }
}

/// Attempts of a transaction across nodes that loses conflicts (each a fresh two-phase
/// commit, with backoff from 1 to 50 ms between).
const ACROSS_ATTEMPTS_MAX: u32 = 30;

/// From this attempt on, a transaction across nodes that only reads is patient: its
/// prepares wait for the decision of a transaction prepared on a record they read rather
/// than being refused (`xnode::Driver::again`). Readers that waited from the first attempt
/// starved writers.
pub const PATIENT_AFTER: u32 = 10;
/// Times a replicated request follows its slots to the partition they moved to.
const MOVES_FOLLOWED: usize = 8;

/// The keys of `commands` (each a command's arguments), by the command table.
fn keys_of(commands: &[Vec<Vec<u8>>]) -> Vec<Vec<u8>> {
    let mut keys = Vec::new();
    for command in commands {
        let Some(spec) = command.first().and_then(|n| table::lookup(n)) else {
            continue;
        };
        keys.extend(
            cluster::key_args(spec, command)
                .into_iter()
                .map(<[u8]>::to_vec),
        );
    }
    keys
}

struct Multi {
    queue: Vec<(Cmd, Vec<Bytes>)>,
    bytes: usize,
    dirty: bool,
}

/// Data commands read but not run yet (see [`Conn::run_pending`]). Their arguments share
/// one vector, which the connection keeps: collecting a request allocates nothing.
#[derive(Default)]
struct Pending {
    /// Each command with the range of `args` that holds its arguments (its name first).
    cmds: Vec<(Cmd, Range<usize>)>,
    args: Vec<Bytes>,
}

impl Pending {
    fn iter(&self) -> impl Iterator<Item = (Cmd, &[Bytes])> {
        self.cmds.iter().map(|(c, r)| (*c, &self.args[r.clone()]))
    }

    fn clear(&mut self) {
        self.cmds.clear();
        self.args.clear();
    }

    /// Frees what an unusually wide request or batch left behind. (`cmds` needs no limit:
    /// a batch holds at most [`PIPELINE_BATCH_MAX`] commands.)
    fn shrink(&mut self) {
        if self.args.capacity() > ARGS_KEPT_MAX {
            self.args = Vec::new();
        }
    }
}

struct Conn {
    shared: Arc<Shared>,
    info: Arc<ClientInfo>,
    proto: Proto,
    authenticated: bool,
    multi: Option<Multi>,
    watch: Option<Watch>,
    /// Replicated cluster: the keys `WATCH` recorded, with their partitions' versions.
    rwatch: Vec<crate::replica::Watched>,
    /// While an `EXEC` runs: how many replicas held this connection's writes when it began,
    /// which a `WAIT` inside it answers.
    exec_acked: usize,
    /// Replicated cluster: when the watches in `rwatch` are next renewed
    /// ([`Conn::renew_watches`]).
    rwatch_renew: Option<Instant>,
    /// Replicated cluster: the partitions this connection has sent writes to (`WAIT` looks
    /// at their replicas).
    wrote: parking_lot::Mutex<std::collections::BTreeSet<usize>>,
    /// Pub/sub subscriptions and the mailbox their messages arrive in, once the client
    /// (un)subscribed.
    subs: Option<Box<Subs>>,
    /// The blocking pop that answered [`Next::Block`], and where it waits.
    blocked: Option<(Cmd, Vec<Bytes>, BlockedIn)>,
    /// Cluster mode: the client asked for the slot map (`CLUSTER SLOTS`/`SHARDS`/`NODES`), so
    /// it routes by itself and gets `MOVED` rather than forwarding.
    aware: bool,
    /// Slots this connection moved away with `CLUSTER SETSLOT <slot> MIGRATING`: its
    /// `GETKEYSINSLOT`/`COUNTKEYSINSLOT` of them find no key left to migrate (the keys went
    /// with the slot), as a Redis source once it has migrated them all.
    migrated: Vec<u16>,
    /// The newest snapshot a transaction that may write read at the installed watermark
    /// (`Shared::begin_writer`; 0: none since the last replies went out): the next replies
    /// wait until it is visible, so that none reveals a commit before its fsync.
    installed_read: std::sync::atomic::AtomicU64,
    /// `READONLY` was sent: in a replicated cluster, reads of a partition this node keeps
    /// run on its copy (consistent, possibly stale) rather than at the leader.
    readonly: bool,
    /// Until when (ms since the server started; 0: never) the connection runs on the poller
    /// because its commands took hot keys' locks ([`Conn::hot_locks`]).
    hot_until_ms: std::sync::atomic::AtomicU64,
}

/// Serves one client until it quits, is killed, breaks the protocol or the server stops: on
/// the lane connections go to now, moving when the lanes say so (see `lanes`).
pub fn start(shared: Arc<Shared>, stream: std::net::TcpStream, addr: SocketAddr) {
    let id = shared.next_client_id.fetch_add(1, Relaxed);
    let laddr = stream.local_addr().unwrap_or(shared.local_addr);
    let info = Arc::new(ClientInfo {
        id,
        addr,
        laddr,
        created: Instant::now(),
        last_active_ms: shared.now_ms().into(),
        name: Default::default(),
        lib: Default::default(),
        resp: 2.into(),
        kill: shared.shutdown.child_token(),
        subscriptions: Default::default(),
    });
    shared.clients.lock().insert(id, info.clone());
    tracing::debug!(id, %addr, "client connected");
    let authenticated = shared.requirepass.read().is_none();
    let conn = Conn {
        authenticated,
        shared,
        info,
        proto: Proto::Resp2,
        multi: None,
        watch: None,
        rwatch: Vec::new(),
        exec_acked: 0,
        rwatch_renew: None,
        wrote: parking_lot::Mutex::default(),
        subs: None,
        blocked: None,
        aware: false,
        migrated: Vec::new(),
        installed_read: std::sync::atomic::AtomicU64::new(0),
        readonly: false,
        hot_until_ms: std::sync::atomic::AtomicU64::new(0),
    };
    conn.spawn(stream, Carry::default());
}

impl Conn {
    /// Runs the connection as a task on the lane connections go to now.
    fn spawn(self, stream: std::net::TcpStream, carry: Carry) {
        let lane = self.lane();
        let shared = self.shared.clone();
        shared.lanes.handle(lane).spawn(
            shared
                .tracker
                .track_future(drive(self, stream, carry, lane)),
        );
    }
}

/// Runs `conn` on `lane` until it ends, or until it moves: then this task spawns its
/// continuation on the other lane's runtime and ends. (Boxed: the future contains itself.)
fn drive(
    mut conn: Conn,
    stream: std::net::TcpStream,
    carry: Carry,
    lane: Lane,
) -> Pin<Box<dyn Future<Output = ()> + Send>> {
    Box::pin(async move {
        let id = conn.info.id;
        let ended = match TcpStream::from_std(stream) {
            Ok(stream) => conn.run(stream, carry, lane).await,
            Err(e) => Err(e),
        };
        match ended {
            Ok(Exit::Done) => {}
            Ok(Exit::Move(stream, carry)) => match stream.into_std() {
                Ok(stream) => {
                    conn.shared.lanes.moves.fetch_add(1, Relaxed);
                    return conn.spawn(stream, carry);
                }
                Err(e) => tracing::debug!(id, error = %e, "connection could not move"),
            },
            Err(e) => tracing::debug!(id, error = %e, "connection ended with an I/O error"),
        }
        tracing::debug!(id, "client disconnected");
    })
}

/// What a connection carries from one lane to the other besides itself: bytes of requests
/// read but not run yet (at most one partial request).
#[derive(Default)]
struct Carry {
    input: BytesMut,
    needed: usize,
}

/// How [`Conn::run`] ended.
enum Exit {
    /// The connection is over.
    Done,
    /// The connection should continue on the other lane.
    Move(TcpStream, Carry),
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.shared.clients.lock().remove(&self.info.id);
        if let Some(subs) = &mut self.subs {
            subs.leave(&self.shared.pubsub, &self.info);
        }
    }
}

/// Waits for a message in `mailbox`; never, without one.
async fn mail(mailbox: Option<&Mailbox>) {
    match mailbox {
        Some(m) => m.notify.notified().await,
        None => std::future::pending().await,
    }
}

/// Waits until `at` (for ever with `None`).
async fn until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// How often a connection of a replicated cluster renews its `WATCH`es while it holds them:
/// well inside [`crate::replica::WATCH_LAPSE_MS`], after which a partition forgets a
/// watched key, so that a watch lapses only when its node stops renewing it (the node is
/// gone, or cut off from the partition for that long).
const WATCH_RENEW_EVERY: Duration = Duration::from_millis(crate::replica::WATCH_LAPSE_MS / 4);
/// How soon a renewal that failed (no leader, a slot moving) is tried again.
const WATCH_RENEW_RETRY: Duration = Duration::from_secs(5);

impl Conn {
    async fn run(
        &mut self,
        mut stream: TcpStream,
        carry: Carry,
        lane: Lane,
    ) -> std::io::Result<Exit> {
        let Carry {
            mut input,
            mut needed,
        } = carry;
        if input.capacity() == 0 {
            input.reserve(READ_BYTES);
        }
        let mut output = BytesMut::with_capacity(READ_BYTES);
        // Both kept across requests, so that a request allocates nothing in the common case.
        let mut ranges = Vec::new();
        let mut pending = Pending::default();
        // One registration for the connection's life: a fresh `cancelled()` per read would
        // register with (and, once read, unregister from) the token's waiter list each time.
        let kill = self.info.kill.clone();
        let killed = kill.cancelled();
        tokio::pin!(killed);
        loop {
            // Run every whole request already read. Consecutive data commands are collected
            // first, so that a pipeline of them can share one engine transaction.
            let mut next = Next::Continue;
            while input.len() >= needed && !input.is_empty() {
                let limits = Limits {
                    bulk_bytes_max: self.shared.proto_max_bulk_len.load(Relaxed),
                    authenticated: self.authenticated,
                };
                // The request's arguments go to the end of `pending.args`; they stay there
                // if it joins the batch.
                let start = pending.args.len();
                match resp::parse_into(&input, limits, &mut ranges) {
                    Ok(Request::Parsed(Parsed::Request { consumed, .. })) => {
                        let frame = input.split_to(consumed).freeze();
                        pending
                            .args
                            .extend(ranges.drain(..).map(|r| frame.slice(r)));
                    }
                    Ok(Request::Inline { args, consumed }) => {
                        let _ = input.split_to(consumed);
                        pending.args.extend(args.into_iter().map(Bytes::from));
                    }
                    Ok(Request::Parsed(Parsed::Skip { consumed })) => {
                        let _ = input.split_to(consumed);
                        continue;
                    }
                    Ok(Request::Parsed(Parsed::Incomplete { needed: n })) => {
                        needed = n.unwrap_or(input.len() + 1);
                        break;
                    }
                    Err(e) => {
                        self.run_pending(&mut pending, &mut output).await;
                        self.shared.counters.protocol_errors.fetch_add(1, Relaxed);
                        tracing::debug!(id = self.info.id, error = %e, "protocol error");
                        self.out(&mut output).error(&format!("ERR {e}"));
                        next = Next::Close;
                        break;
                    }
                };
                needed = 0;
                // Keys of a cross-node transaction stuck here: this command waits (unbatched).
                let stuck = self.stuck_keys(&pending.args[start..]);
                let batch = match stuck {
                    None => self.batchable(&pending.args[start..]),
                    Some(_) => None,
                };
                if let Some(cmd) = batch {
                    pending.cmds.push((cmd, start..pending.args.len()));
                    if pending.cmds.len() < PIPELINE_BATCH_MAX {
                        continue;
                    }
                    self.run_pending(&mut pending, &mut output).await;
                } else {
                    let args: Vec<Bytes> = pending.args.drain(start..).collect();
                    self.run_pending(&mut pending, &mut output).await;
                    // Kept for the slow log (the command takes `args`).
                    let logged = self.shared.slowlog.enabled().then(|| args.clone());
                    let started = Instant::now();
                    next = match stuck {
                        Some(keys) => self.command_unstuck(args, &keys, &mut output).await,
                        None => self.command(args, &mut output).await,
                    };
                    let elapsed = started.elapsed();
                    self.shared.counters.record_latency(elapsed);
                    if let Some(args) = logged
                        && self.shared.slowlog.is_slow(elapsed)
                    {
                        self.log_slow(elapsed, &args, 0);
                    }
                    if next == Next::Block {
                        if !self.block(&mut stream, &mut input, &mut output).await? {
                            return Ok(Exit::Done);
                        }
                        next = Next::Continue;
                    }
                    self.shared
                        .counters
                        .commands_processed
                        .fetch_add(1, Relaxed);
                }
                if output.len() >= OUT_FLUSH_BYTES {
                    self.flush(&mut stream, &mut output).await?;
                }
                if next == Next::Close {
                    break;
                }
            }
            self.run_pending(&mut pending, &mut output).await;
            // Messages that came meanwhile go out with the replies, a bounded batch at a time.
            loop {
                let more = self.deliver(&mut output, OUT_FLUSH_BYTES);
                self.flush(&mut stream, &mut output).await?;
                if !more {
                    break;
                }
            }
            if next == Next::Close {
                return Ok(Exit::Done);
            }
            if ranges.capacity() > ARGS_KEPT_MAX {
                ranges = Vec::new();
            }
            pending.shrink();
            if input.len() > QUERY_BYTES_MAX {
                tracing::warn!(
                    id = self.info.id,
                    bytes = input.len(),
                    "closing client that reached the query buffer limit"
                );
                return Ok(Exit::Done);
            }
            if needed > input.len() {
                input.reserve(needed.min(QUERY_BYTES_MAX + 1) - input.len());
            } else if input.capacity() - input.len() < 4096 {
                input.reserve(READ_BYTES);
            }
            // The read first, so that the kill is polled only when there is nothing to read
            // (then the connection sleeps until either comes). A client that always has
            // more to read would never get there: it meets this check instead.
            if kill.is_cancelled() {
                return Ok(Exit::Done);
            }
            // Every reply is written and nothing is half run: the place to change lanes.
            if self.lane() != lane {
                return Ok(Exit::Move(stream, Carry { input, needed }));
            }
            // A subscriber also wakes for a message: the loop then writes it out.
            let mailbox = self.subs.as_deref().map(|s| &*s.mailbox);
            let renew = self.rwatch_renew.filter(|_| !self.rwatch.is_empty());
            let n = tokio::select! {
                biased;
                r = stream.read_buf(&mut input) => Some(r?),
                () = &mut killed => return Ok(Exit::Done),
                () = mail(mailbox) => continue,
                () = until(renew) => None,
            };
            let Some(n) = n else {
                self.renew_watches().await;
                continue;
            };
            if n == 0 {
                return Ok(Exit::Done);
            }
            if lane == Lane::Poller {
                self.shared.lanes.state.active();
            }
            self.shared
                .counters
                .net_input_bytes
                .fetch_add(n as u64, Relaxed);
            self.info
                .last_active_ms
                .store(self.shared.now_ms(), Relaxed);
        }
    }

    async fn flush(&self, stream: &mut TcpStream, output: &mut BytesMut) -> std::io::Result<()> {
        if output.is_empty() {
            return Ok(());
        }
        // The other connections that have requests run first, and their replies go out
        // after theirs, as Redis writes every reply of an event-loop pass at its end: a client
        // woken by one reply finds the next ones already there instead of going back to sleep
        // between them. Each wake-up of a sleeping client costs the writer the most of a send
        // (`perf`: 28% of the server's CPU under pipelined `LPUSH` on the poller, 6% in
        // Redis's). One scheduler pass when no other connection waits.
        tokio::task::yield_now().await;
        // Under `async`, no reply goes out before the commits it reports or has read are
        // written to the OS, as Redis writes its AOF first: a kill -9 then loses nothing a
        // client was told. If the log failed first they may be lost, and the connection
        // closes without the replies.
        self.shared
            .db
            .log_written()
            .await
            .map_err(std::io::Error::other)?;
        // What a writer read at the installed watermark may not be durable yet: a commit
        // waited for it, but a command that failed did not (`Shared::begin_writer`).
        let read = self.installed_read.swap(0, Relaxed);
        if read != 0 {
            self.shared
                .db
                .visible_at(keel::Ts(read))
                .await
                .map_err(std::io::Error::other)?;
        }
        // A client that does not read must not keep a killed connection open (a subscriber
        // cut off for its output buffer is one).
        tokio::select! {
            biased;
            r = stream.write_all(output) => r?,
            () = self.info.kill.cancelled() => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionAborted,
                    "client killed",
                ));
            }
        }
        if let Some(subs) = &self.subs {
            subs.mailbox.written(self.shared.pubsub.limit());
        }
        self.shared
            .counters
            .net_output_bytes
            .fetch_add(output.len() as u64, Relaxed);
        output.clear();
        if output.capacity() > 4 * OUT_FLUSH_BYTES {
            // Give back the memory of one huge reply.
            *output = BytesMut::with_capacity(READ_BYTES);
        }
        Ok(())
    }

    fn out<'a>(&self, buf: &'a mut BytesMut) -> Out<'a> {
        Out::new(buf, self.proto)
    }

    /// Writes messages waiting for this subscriber into `output`, until it has grown by
    /// `bytes_max`; whether more wait.
    fn deliver(&self, output: &mut BytesMut, bytes_max: usize) -> bool {
        match &self.subs {
            Some(subs) => subs.mailbox.deliver(&mut self.out(output), bytes_max),
            None => false,
        }
    }

    /// Whether the connection is in Redis's pub/sub context (subscribed to anything).
    fn subscribed(&self) -> bool {
        self.subs.as_ref().is_some_and(|s| s.active())
    }

    /// The command, if `args` may join a pipelined batch: a data command outside `MULTI` and
    /// `WATCH`, from an authenticated client (not a RESP2 subscriber), with the right arity.
    fn batchable(&self, args: &[Bytes]) -> Option<Cmd> {
        if !self.authenticated || self.multi.is_some() || self.watch.is_some() {
            return None;
        }
        // In RESP2 a subscriber may not run data commands: `command` says so.
        if self.proto == Proto::Resp2 && self.subscribed() {
            return None;
        }
        let spec = table::lookup(&args[0])?;
        // Replicated: commands with keys, each command's keys in one partition (a run of
        // them on one partition becomes one log entry, or one linearizable read). A
        // cluster-aware client is answered MOVED command by command instead, and a READONLY
        // one reads here.
        if self.shared.replication.get().is_some() {
            let keys = cluster::key_args(spec, args);
            let ok = !self.aware
                && !self.readonly
                && spec.arity_ok(args.len())
                && data::is_data(spec.cmd)
                && !crate::lists::is_blocking(spec.cmd)
                && !matches!(spec.cmd, Cmd::Object | Cmd::Memory)
                && !keys.is_empty()
                && self.partition_of(keys.iter().copied()).is_some();
            return ok.then_some(spec.cmd);
        }
        // In cluster mode only commands this node runs itself join a batch.
        if let Some(cluster) = &self.shared.cluster
            && (cluster.route(spec, args) != Route::Local || spec.cmd == Cmd::KeelRange)
        {
            // (KEEL.RANGE reads every node: `command` runs it across them.)
            return None;
        }
        let ok = spec.arity_ok(args.len())
            && data::is_data(spec.cmd)
            && !matches!(spec.cmd, Cmd::Flushdb | Cmd::Flushall)
            && !crate::lists::is_blocking(spec.cmd)
            // A bad OBJECT or MEMORY subcommand is refused by `command`, before anything
            // runs.
            && (!matches!(spec.cmd, Cmd::Object | Cmd::Memory)
                || table::subcommand(spec, args).is_ok());
        ok.then_some(spec.cmd)
    }

    /// Runs the collected pipeline of data commands. Two or more, not all reads: one engine
    /// transaction for all of them, committed once, so a pipeline of writes costs one commit
    /// (and, with `sync` durability, one fsync). That is a valid serial order: the client sent
    /// them all before it saw any reply, and nothing else runs between them. If any of them
    /// fails, or the batch cannot commit, each runs again as its own transaction, so that
    /// replies and effects are exactly those of running them one by one.
    async fn run_pending(&mut self, pending: &mut Pending, output: &mut BytesMut) {
        if pending.cmds.is_empty() {
            return;
        }
        // Messages published before these commands ran go before their replies.
        self.deliver(output, usize::MAX);
        let started = Instant::now();
        let n = pending.cmds.len() as u64;
        if self.shared.replication.get().is_some() {
            self.run_pending_replicated(pending, output).await;
        } else {
            if n >= 2 {
                // Start loading every key's index bucket, record and version now, so that the
                // pipeline's cache misses overlap.
                let keys = pending.iter().flat_map(|(cmd, args)| data::keys(cmd, args));
                self.shared.db.prefetch_all(keys);
            }
            let batched = pending.cmds.len() >= 2
                && pending.cmds.iter().any(|(c, _)| !data::is_read_only(*c))
                && self.run_batched(pending, output).await;
            if !batched {
                for (cmd, args) in pending.iter() {
                    self.data_command(cmd, args, output).await;
                }
            }
        }
        let elapsed = started.elapsed();
        if self.shared.slowlog.is_slow(elapsed)
            && let Some((_, args)) = pending.iter().next()
        {
            self.log_slow(elapsed, args, pending.cmds.len() - 1);
        }
        pending.clear();
        let per_command = elapsed / u32::try_from(n).unwrap_or(u32::MAX);
        let counters = &self.shared.counters;
        counters.record_latencies(per_command, n);
        counters.commands_processed.fetch_add(n, Relaxed);
    }

    /// Replicated cluster: the collected pipeline, its commands grouped by partition (in
    /// order within each), each group one request (one log entry, or one linearizable read
    /// of them all), the groups of different partitions at once; the replies go out in the
    /// order the commands came. Commands of different partitions touch different keys, and
    /// the client sent them all before any reply, so running the groups in any order is a
    /// valid serial order. A group's entry applies whole or not at all: if one of its
    /// commands fails, they run again one entry each, so that replies and effects are those
    /// of running them one by one.
    async fn run_pending_replicated(&mut self, pending: &Pending, output: &mut BytesMut) {
        let mut groups: Vec<(usize, keel_cluster::Slot, Vec<usize>)> = Vec::new();
        let cmds: Vec<(Cmd, &[Bytes])> = pending.iter().collect();
        for (i, (_, args)) in cmds.iter().enumerate() {
            let spec = table::lookup(&args[0]).expect("a batched command is known");
            let (p, slot) = self
                .partition_of(cluster::key_args(spec, args).iter().copied())
                .expect("batched commands have keys of one partition");
            match groups.iter_mut().find(|(q, _, _)| *q == p) {
                Some((_, _, members)) => members.push(i),
                None => groups.push((p, slot, vec![i])),
            }
        }
        if groups.len() == 1 && cmds.len() == 1 {
            let (p, slot, _) = groups[0];
            let (cmd, args) = cmds[0];
            let one = vec![args.iter().map(|a| a.to_vec()).collect()];
            self.run_replicated(p, slot, one, false, false, data::is_read_only(cmd), output)
                .await;
            return;
        }
        let shared = Arc::clone(&self.shared);
        let proto = self.proto;
        let mut running = tokio::task::JoinSet::new();
        for (g, (p, _, members)) in groups.iter().enumerate() {
            let commands = members
                .iter()
                .map(|&i| cmds[i].1.iter().map(|a| a.to_vec()).collect())
                .collect();
            let request = crate::replica::Request {
                batch: members.len() > 1,
                resp3: proto == Proto::Resp3,
                ..crate::replica::Request::new(&shared, commands, crate::replica::Op::Run)
            };
            let read = members.iter().all(|&i| data::is_read_only(cmds[i].0));
            let (shared, p) = (Arc::clone(&shared), *p);
            running.spawn(async move {
                let rep = shared.replication.get().expect("replicated");
                (g, rep.run(&shared, p, request, read).await)
            });
        }
        // Each command's reply, by its position in the pipeline.
        let mut replies: Vec<Option<Vec<u8>>> = vec![None; cmds.len()];
        let mut again = Vec::new();
        let mut results = Vec::with_capacity(groups.len());
        tokio::select! {
            () = async {
                while let Some(done) = running.join_next().await {
                    results.push(done.expect("a replicated request does not panic"));
                }
            } => {}
            () = self.info.kill.cancelled() => return,
        }
        for (g, result) in results {
            let members = &groups[g].2;
            match result {
                Ok(reply) => {
                    let mut rest = &reply[..];
                    for &i in members {
                        let n = cluster::reply_len(rest)
                            .ok()
                            .flatten()
                            .unwrap_or(rest.len());
                        replies[i] = Some(rest[..n].to_vec());
                        rest = &rest[n..];
                    }
                }
                Err(
                    crate::replica::RunError::Failed(text)
                    | crate::replica::RunError::Unknown(text),
                ) => {
                    let mut buf = BytesMut::new();
                    Out::new(&mut buf, proto).error(&text);
                    for &i in members {
                        replies[i] = Some(buf.to_vec());
                    }
                }
                Err(crate::replica::RunError::RolledBack | crate::replica::RunError::Moved) => {
                    again.push(g);
                }
            }
        }
        // Rolled-back groups, one command at a time, in pipeline order.
        let mut redo: Vec<usize> = again.iter().flat_map(|&g| groups[g].2.clone()).collect();
        redo.sort_unstable();
        for i in redo {
            let (cmd, args) = cmds[i];
            let (p, slot, _) = *groups
                .iter()
                .find(|(_, _, m)| m.contains(&i))
                .expect("in a group");
            let one = vec![args.iter().map(|a| a.to_vec()).collect()];
            let mut buf = BytesMut::new();
            self.run_replicated(
                p,
                slot,
                one,
                false,
                false,
                data::is_read_only(cmd),
                &mut buf,
            )
            .await;
            replies[i] = Some(buf.to_vec());
        }
        for reply in replies.into_iter().flatten() {
            output.extend_from_slice(&reply);
        }
    }

    /// One transaction for a pipelined batch; `false` (and no reply written) when the batch
    /// must run command by command instead.
    async fn run_batched(&mut self, pending: &Pending, output: &mut BytesMut) -> bool {
        // Borrowed, not cloned: an `Arc` clone per request is a write to a cache line that
        // every connection shares.
        let shared = &*self.shared;
        let ctx = ctx(shared);
        let mark = output.len();
        let proto = self.proto;
        let may_wait = self.may_wait(pending.cmds.iter().map(|(c, _)| *c));
        let mut rejoin = false;
        let mut out = Out::new(output, proto);
        let keys = || pending.iter().flat_map(|(cmd, args)| data::keys(cmd, args));
        let mut held = self.hot_locks(keys()).await;
        for attempt in 1..=CONFLICT_ATTEMPTS_MAX {
            let prepare = || {
                out.forget_tracked();
                ctx.clock.reset();
                let mut txn = shared
                    .begin_writer(pending.cmds.iter().map(|(c, _)| *c), &self.installed_read)
                    .map_err(|_| false)?;
                for (cmd, args) in pending.iter() {
                    if data::run(cmd, args, &mut View::Txn(&mut txn), &ctx, &mut out).is_err()
                        || out.buf.len() - mark > ctx.reply_bytes_max
                    {
                        out.buf.truncate(mark);
                        return Err(false);
                    }
                }
                Ok(txn)
            };
            let committed = match self.attempt(rejoin, may_wait, &mut held, prepare).await {
                Ok(committed) => committed,
                Err(done) => return done,
            };
            match committed {
                Ok(Ok(committed)) => {
                    out.fill(&committed);
                    for (cmd, args) in pending.iter() {
                        shared.blocked.committed(cmd, args);
                    }
                    return true;
                }
                Ok(Err(conflict)) => {
                    out.buf.truncate(mark);
                    ctx.contended.set(&conflict);
                    self.shared.counters.exec_retries.fetch_add(1, Relaxed);
                    if hot::heats(attempt, &conflict) && held.is_empty() {
                        held = self.heat_and_lock(keys).await;
                    }
                    rejoin = self.wait_to_retry(&conflict, attempt).await;
                }
                Err(_) => {
                    out.buf.truncate(mark);
                    return false;
                }
            }
        }
        out.buf.truncate(mark);
        false
    }

    /// Dispatches one request.
    async fn command(&mut self, args: Vec<Bytes>, output: &mut BytesMut) -> Next {
        // Messages published before this command ran go before its reply.
        self.deliver(output, usize::MAX);
        let Some(spec) = table::lookup(&args[0]) else {
            self.flag_multi();
            self.out(output).error_bytes(&unknown_command(&args));
            return Next::Continue;
        };
        if !spec.arity_ok(args.len()) {
            let text = format!("ERR wrong number of arguments for '{}' command", spec.name);
            self.reject(spec, &text, output);
            return Next::Continue;
        }
        // A data command with subcommands (OBJECT, MEMORY) is refused for a bad subcommand
        // before it is queued or run, as Redis refuses it.
        if matches!(spec.cmd, Cmd::Object | Cmd::Memory)
            && let Err(text) = table::subcommand(spec, &args)
        {
            self.reject(spec, &text, output);
            return Next::Continue;
        }
        if !self.authenticated
            && !matches!(spec.cmd, Cmd::Auth | Cmd::Hello | Cmd::Quit | Cmd::Reset)
        {
            self.reject(spec, NOAUTH, output);
            return Next::Continue;
        }
        if self.proto == Proto::Resp2
            && self.subscribed()
            && !pubsub::allowed_in_context(spec.cmd)
            && let Some(name) = full_name(spec, &args)
        {
            self.reject(spec, &pubsub::not_in_context(&name), output);
            return Next::Continue;
        }
        if self.shared.replication.get().is_some() {
            if (data::is_data(spec.cmd) || spec.cmd == Cmd::Watch)
                && self.replicated(spec, &args, output).await
            {
                return self.next_after_routed();
            }
        } else if self.shared.cluster.is_some()
            && (data::is_data(spec.cmd) || spec.cmd == Cmd::Watch)
            && self.routed(spec, &args, output).await
        {
            return self.next_after_routed();
        }
        if spec.cmd == Cmd::KeelRange && self.multi.is_none() && self.shared.xnode.get().is_some() {
            let result = self.range_across(&args).await;
            let mut out = self.out(output);
            match result {
                Ok(pairs) => {
                    out.array(pairs.len());
                    for (k, v) in &pairs {
                        out.array(2);
                        out.bulk(k);
                        out.bulk(v);
                    }
                }
                Err(Fail(text)) => out.error(&text),
            }
            return Next::Continue;
        }
        if self.multi.is_some()
            && !matches!(
                spec.cmd,
                Cmd::Exec
                    | Cmd::Discard
                    | Cmd::Multi
                    | Cmd::Watch
                    | Cmd::Quit
                    | Cmd::Reset
                    | Cmd::KeelOnce
            )
        {
            self.queue(spec, args, output);
            return Next::Continue;
        }
        match self.connection_command(spec, &args, output).await {
            Ok(next) => next,
            Err(Fail(text)) => {
                self.out(output).error(&text);
                Next::Continue
            }
        }
    }

    /// Cluster mode, while a transaction across nodes is stuck here (`xnode::Stuck`): the
    /// user keys the command in `args` would read or write (all of a queued `MULTI`'s at
    /// `EXEC`; a `KEEL.ONCE`'s wrapped command's; none for a command without keys, which
    /// meets every stuck transaction), or
    /// `None` when it needs no wait (no transaction is stuck, or it touches no data).
    fn stuck_keys(&self, args: &[Bytes]) -> Option<Vec<Vec<u8>>> {
        let xnode = self.shared.xnode.get()?;
        if !xnode.stuck.any() {
            return None;
        }
        let mut spec = table::lookup(&args[0])?;
        let mut args = args;
        // A write another node forwarded (exactly once): what it wraps, an `EXEC` included.
        if spec.cmd == Cmd::KeelOnce {
            args = once::parse(args).ok()?.command;
            spec = table::lookup(&args[0])?;
        }
        match (&self.multi, spec.cmd) {
            (Some(multi), Cmd::Exec) => {
                let mut keys = Vec::new();
                for (cmd, args) in &multi.queue {
                    let spec = table::lookup(&args[0])?;
                    if !data::is_data(*cmd) {
                        continue;
                    }
                    let mine = cluster::key_args_owned(spec, args);
                    if mine.is_empty() {
                        return Some(Vec::new());
                    }
                    keys.extend(mine);
                }
                Some(keys)
            }
            (None, cmd) if data::is_data(cmd) || cmd == Cmd::Watch => {
                Some(cluster::key_args_owned(spec, args))
            }
            _ => None,
        }
    }

    /// Runs `args` once no stuck transaction holds `keys` (see [`Conn::stuck_keys`]), or
    /// answers `xnode::STUCK_TEXT` (an `EXEC` then discards its transaction).
    async fn command_unstuck(
        &mut self,
        args: Vec<Bytes>,
        keys: &[Vec<u8>],
        output: &mut BytesMut,
    ) -> Next {
        let xnode = self.shared.xnode.get().expect("a stuck transaction");
        match xnode.wait_unstuck(keys).await {
            Ok(()) => self.command(args, output).await,
            Err(Fail(text)) => {
                if self.multi.take().is_some() {
                    self.watch = None;
                    self.rwatch.clear();
                }
                self.out(output).error(&text);
                Next::Continue
            }
        }
    }

    /// Refuses a command before it runs, as Redis's `rejectCommand` does: the error flags an
    /// open `MULTI`, and a refused `EXEC` discards the transaction with an `EXECABORT` that
    /// gives the reason (also outside `MULTI`).
    fn reject(&mut self, spec: &Spec, text: &str, output: &mut BytesMut) {
        if spec.cmd == Cmd::Exec {
            self.multi = None;
            self.watch = None;
            self.rwatch.clear();
            let reason = text.strip_prefix("ERR ").unwrap_or(text);
            self.out(output).error(&format!(
                "EXECABORT Transaction discarded because of: {reason}"
            ));
            return;
        }
        self.flag_multi();
        self.out(output).error(text);
    }

    /// Replicated cluster (`replica`): runs a data command on its partition's leader;
    /// whether it was answered (not: queued inside `MULTI`, or a read without keys, which
    /// runs on this node's copy of its own partition).
    async fn replicated(&mut self, spec: &Spec, args: &[Bytes], output: &mut BytesMut) -> bool {
        if spec.cmd == Cmd::Watch {
            let result = if self.multi.is_some() {
                Err("ERR WATCH inside MULTI is not allowed".into())
            } else {
                self.watch_replicated(&args[1..]).await
            };
            match result {
                Ok(()) => self.out(output).ok(),
                Err(Fail(text)) => self.out(output).error(&text),
            }
            return true;
        }
        if self.multi.is_some() {
            return false;
        }
        if crate::lists::is_blocking(spec.cmd) {
            self.block_next(spec, args, BlockedIn::Partition);
            return true;
        }
        let keys = cluster::key_args(spec, args);
        if keys.is_empty() && matches!(spec.cmd, Cmd::Flushdb | Cmd::Flushall) {
            // Every partition, in one transaction across them.
            let result = match data::check_flush_args(args) {
                Ok(()) => self.flush_partitions(args).await,
                Err(e) => Err(e),
            };
            match result {
                Ok(()) => self.out(output).ok(),
                Err(Fail(text)) => self.out(output).error(&text),
            }
            return true;
        }
        if keys.is_empty() {
            // SWAPDB writes nothing in cluster mode: it answers Redis Cluster's error.
            if data::is_read_only(spec.cmd) || spec.cmd == Cmd::Swapdb {
                return false;
            }
            self.out(output).error(&format!(
                "ERR keel: {} is not supported in a replicated cluster yet",
                spec.name.to_ascii_uppercase()
            ));
            return true;
        }
        let Some((p, slot)) = self.partition_of(keys.iter().copied()) else {
            // Keys of several partitions: one transaction across them, key by key.
            self.split_across(spec, args, output, true).await;
            return true;
        };
        let read = data::is_read_only(spec.cmd);
        let commands = vec![args.iter().map(|a| a.to_vec()).collect()];
        self.run_replicated(p, slot, commands, false, false, read, output)
            .await;
        true
    }

    /// A multi-key command whose keys span nodes (`replicated`: partitions), run key by key
    /// (`per_key`) as one transaction across them; `CROSSSLOT` for one that cannot be split.
    async fn split_across(
        &self,
        spec: &Spec,
        args: &[Bytes],
        output: &mut BytesMut,
        replicated: bool,
    ) {
        if spec.cmd == Cmd::Mset && args.len().is_multiple_of(2) {
            self.out(output)
                .error("ERR wrong number of arguments for 'mset' command");
            return;
        }
        let Some((parts, merge)) = per_key(spec.cmd, args) else {
            if crate::gather::may_gather(spec.cmd) {
                match self.gathered(&[args], &Watching::Nothing).await {
                    Ok(Some(mut ran)) => output.extend_from_slice(&ran.replies.remove(0)),
                    Ok(None) => unreachable!("nothing watched, nothing changed"),
                    Err(Fail(text)) => self.out(output).error(&text),
                }
            } else {
                self.out(output).error(cluster::CROSSSLOT);
            }
            return;
        };
        let parts: Vec<&[Bytes]> = parts.iter().map(Vec::as_slice).collect();
        let result = if replicated {
            self.across_partitions(&parts).await
        } else {
            self.across_nodes(&parts).await
        };
        let mut out = self.out(output);
        match result {
            Ok(replies) => merge_replies(merge, &replies, &mut out),
            Err(Fail(text)) => out.error(&text),
        }
    }

    /// Commands whose keys are on several nodes (or partitions) and that no key-by-key
    /// split serves, run gathered: one command outside `MULTI`, or a whole `MULTI`'s queue
    /// (its data commands). Their keys are read whole in one transaction across the nodes,
    /// the commands run over them here, and what they changed is written back in a second
    /// one that checks nothing changed in between (see `gather`). Both transactions check
    /// what `watching` holds, so a `WATCH` is judged in the transaction that commits.
    /// `None` when a watched key changed (nothing was written).
    async fn gathered(
        &self,
        commands: &[&[Bytes]],
        watching: &Watching<'_>,
    ) -> Result<Option<crate::gather::Ran>, Fail> {
        let mut unique: Vec<Vec<u8>> = Vec::new();
        for args in commands {
            let spec = table::lookup(&args[0]).expect("a known command");
            for k in cluster::key_args(spec, args) {
                if !unique.iter().any(|u| u[..] == *k) {
                    unique.push(k.to_vec());
                }
            }
        }
        let word = |w: &'static [u8]| Bytes::from_static(w);
        self.shared.counters.gathered.fetch_add(1, Relaxed);
        for attempt in 1..=ACROSS_ATTEMPTS_MAX {
            let reads: Vec<Vec<Bytes>> = unique
                .iter()
                .map(|k| vec![word(b"KEEL.DUMP"), Bytes::copy_from_slice(k)])
                .collect();
            let parts: Vec<&[Bytes]> = reads.iter().map(Vec::as_slice).collect();
            let Some(replies) = self.across_checked(&parts, watching).await? else {
                return Ok(None);
            };
            let dumps = replies
                .iter()
                .map(|r| crate::gather::dump_of_reply(r))
                .collect::<Result<Vec<_>, _>>()?;
            let mut ctx = ctx(&self.shared);
            // Replies are written as the commands run: nothing here commits.
            ctx.track_increments = false;
            let ran = crate::gather::compute(
                self.shared.db,
                &ctx,
                self.proto,
                commands,
                &unique,
                &dumps,
            )?;
            if ran.failed || ran.changed.is_empty() {
                return Ok(Some(ran));
            }
            let mut writes: Vec<Vec<Bytes>> = unique
                .iter()
                .zip(&dumps)
                .map(|(k, d)| {
                    vec![
                        word(b"KEEL.CHECK"),
                        Bytes::copy_from_slice(k),
                        Bytes::copy_from_slice(d),
                    ]
                })
                .collect();
            writes.extend(ran.changed.iter().map(|(k, d)| {
                vec![
                    word(b"KEEL.RESTORE"),
                    Bytes::copy_from_slice(k),
                    Bytes::copy_from_slice(d),
                ]
            }));
            let parts: Vec<&[Bytes]> = writes.iter().map(Vec::as_slice).collect();
            match self.across_checked(&parts, watching).await {
                Ok(Some(_)) => return Ok(Some(ran)),
                Ok(None) => return Ok(None),
                Err(Fail(text)) if text.contains(crate::gather::CHANGED) => {
                    self.shared.counters.gathered_retries.fetch_add(1, Relaxed);
                    let pause = Duration::from_millis(u64::from(attempt.min(50)));
                    tokio::time::sleep(pause).await;
                }
                Err(e) => return Err(e),
            }
        }
        Err(format!(
            "TRYAGAIN keel: the keys of a command across nodes kept changing ({ACROSS_ATTEMPTS_MAX} tries)"
        )
        .into())
    }

    /// Runs `commands` as one transaction across nodes (or, in a replicated cluster,
    /// partitions), checking `watching` where each watched key lives: each command's reply,
    /// or `None` if a watched key changed (nothing was applied).
    async fn across_checked(
        &self,
        commands: &[&[Bytes]],
        watching: &Watching<'_>,
    ) -> Result<Option<Vec<Vec<u8>>>, Fail> {
        if self.shared.replication.get().is_some() {
            let watched = match watching {
                Watching::Partitions(w) => w,
                _ => &[][..],
            };
            return self.across_partitions_watched(commands, watched).await;
        }
        let (mut work, place) = self.plan_across(commands)?;
        if let Watching::Nodes(watch) = watching {
            self.check_watch_across(&mut work, watch);
        }
        Ok(self
            .run_across(work)
            .await?
            .map(|replies| gather(replies, &place, self.proto)))
    }

    /// Cluster mode, `EXEC` of a queue with a command whose keys are on several nodes (or
    /// partitions) and that no key-by-key split serves: the whole queue runs gathered
    /// ([`Conn::gathered`]). Refused, with nothing run, if a command has no keys (it would
    /// see only the gathered ones) or touches no data but `PING`, `ECHO`, `TIME`, `UNWATCH`.
    async fn exec_gathered(
        &self,
        multi: &Multi,
        watching: Watching<'_>,
        output: &mut BytesMut,
    ) -> Result<(), Fail> {
        let mut here: Vec<Option<Vec<u8>>> = Vec::with_capacity(multi.queue.len());
        let mut commands: Vec<&[Bytes]> = Vec::new();
        for (cmd, args) in &multi.queue {
            if let Some(place) = Place::here(*cmd, args, self.proto, self.exec_acked) {
                let Place::Here(reply) = place? else {
                    unreachable!("answered here")
                };
                here.push(Some(reply));
                continue;
            }
            let spec = table::lookup(&args[0])
                .filter(|s| s.cmd == *cmd)
                .expect("a queued command is known");
            if !data::is_data(*cmd) || cluster::key_args(spec, args).is_empty() {
                return Err(format!(
                    "ERR keel: a transaction with commands across nodes runs only commands \
                     with keys and PING, ECHO, TIME, and '{}' is none",
                    spec.name
                )
                .into());
            }
            here.push(None);
            commands.push(args);
        }
        let ran = self.gathered(&commands, &watching).await?;
        let mut out = Out::new(output, self.proto);
        let Some(ran) = ran else {
            self.shared.counters.watch_aborts.fetch_add(1, Relaxed);
            out.null_array();
            return Ok(());
        };
        out.array(here.len());
        let mut replies = ran.replies.into_iter();
        for reply in here {
            let reply = reply.unwrap_or_else(|| replies.next().expect("one per data command"));
            out.buf.extend_from_slice(&reply);
        }
        Ok(())
    }

    /// Whether `EXEC` must run `multi` gathered: a queued command's keys are on several
    /// nodes (or partitions), and no key-by-key split serves it.
    fn exec_gathers(&self, multi: &Multi) -> bool {
        let replicated = self.shared.replication.get().is_some();
        multi.queue.iter().any(|(cmd, args)| {
            let Some(spec) = table::lookup(&args[0]).filter(|s| s.cmd == *cmd) else {
                return false;
            };
            if !crate::gather::may_gather(*cmd) || per_key(*cmd, args).is_some() {
                return false;
            }
            let keys = cluster::key_args(spec, args);
            if keys.is_empty() {
                return false;
            }
            if replicated {
                self.partition_of(keys.iter().copied()).is_none()
            } else {
                self.shared
                    .cluster
                    .as_ref()
                    .is_some_and(|c| c.route(spec, args) == Route::CrossSlot)
            }
        })
    }

    /// The protocol and limits this connection's commands run with in a transaction across
    /// partitions.
    fn txn_limits(&self) -> crate::replica::txn::Limits {
        crate::replica::txn::Limits {
            resp3: self.proto == Proto::Resp3,
            bulk_bytes_max: self.shared.proto_max_bulk_len.load(Relaxed),
            reply_bytes_max: self.shared.config.reply_bytes_max,
        }
    }

    /// Replicated cluster: runs `commands` (each with keys of one partition, the
    /// partitions two or more) as one transaction across their partitions (`replica::txn`);
    /// each command's reply, in order.
    async fn across_partitions(&self, commands: &[&[Bytes]]) -> Result<Vec<Vec<u8>>, Fail> {
        self.across_partitions_watched(commands, &[])
            .await
            .map(|r| r.expect("nothing watched, nothing changed"))
    }

    /// [`Conn::across_partitions`] checking `watched` (keys of any partitions) where they
    /// live, in the same transaction: `None` if one changed (nothing was applied).
    async fn across_partitions_watched(
        &self,
        commands: &[&[Bytes]],
        watched: &[crate::replica::Watched],
    ) -> Result<Option<Vec<Vec<u8>>>, Fail> {
        let shared = Arc::clone(&self.shared);
        // Planned again when a partition answers that some of the keys' slots moved on.
        for _ in 0..MOVES_FOLLOWED {
            let mut checks: Vec<(usize, Vec<crate::replica::Watched>)> = Vec::new();
            for w in watched {
                let (p, _) = self
                    .partition_of([w.key.as_slice()])
                    .expect("one key, one partition");
                match checks.iter_mut().find(|(q, _)| *q == p) {
                    Some((_, ws)) => ws.push(w.clone()),
                    None => checks.push((p, vec![w.clone()])),
                }
            }
            let mut work: crate::replica::txn::Work = Vec::new();
            // Where each command's reply will be: one place, or, for a multi-key command
            // whose keys span partitions, one per key and how they merge.
            let mut place: Vec<Place> = Vec::with_capacity(commands.len());
            let mut put = |p: usize, command: Vec<Vec<u8>>| {
                let i = match work.iter().position(|(q, _)| *q == p) {
                    Some(i) => i,
                    None => {
                        work.push((p, Vec::new()));
                        work.len() - 1
                    }
                };
                work[i].1.push(command);
                (i, work[i].1.len() - 1)
            };
            for args in commands {
                let spec = table::lookup(&args[0]).expect("a queued command is known");
                if let Some(here) = Place::here(spec.cmd, args, self.proto, self.exec_acked) {
                    place.push(here?);
                    continue;
                }
                let keys = cluster::key_args(spec, args);
                if !data::is_data(spec.cmd) || keys.is_empty() {
                    return Err(format!(
                        "ERR keel: a transaction across partitions runs only commands with \
                         keys and PING, ECHO, TIME, and '{}' is none",
                        spec.name
                    )
                    .into());
                }
                if let Some((p, _)) = self.partition_of(keys.iter().copied()) {
                    let (i, j) = put(p, args.iter().map(|a| a.to_vec()).collect());
                    place.push(Place::At(i, j));
                    continue;
                }
                // Keys of several partitions: key by key, each part in its key's partition
                // (in the transaction's order there), the replies merged.
                let Some((parts, merge)) = per_key(spec.cmd, args) else {
                    return Err(cluster::CROSSSLOT.into());
                };
                let mut at = Vec::with_capacity(parts.len());
                for part in parts {
                    let (p, _) = self
                        .partition_of([part[1].as_ref()])
                        .expect("one key, one partition");
                    at.push(put(p, part.iter().map(|a| a.to_vec()).collect()));
                }
                place.push(Place::Split(at, merge));
            }
            let limits = self.txn_limits();
            let node = Arc::new(crate::replica::txn::Node(Arc::clone(&shared)));
            self.wrote.lock().extend(work.iter().map(|(p, _)| *p));
            // (If the slots moved into one partition, the same protocol runs it there: a
            // decision with no other participant.)
            let replies = tokio::select! {
                r = crate::replica::txn::run_across_watched(&node, work, checks, limits) => r,
                () = self.info.kill.cancelled() => {
                    return Err("ERR keel: the connection was killed".into());
                }
            };
            match replies {
                Ok(replies) => return Ok(Some(gather(replies, &place, self.proto))),
                Err(crate::replica::txn::AcrossError::Failed(text))
                    if text == crate::replica::WATCH_CHANGED =>
                {
                    return Ok(None);
                }
                Err(crate::replica::txn::AcrossError::Failed(text)) => return Err(text.into()),
                Err(crate::replica::txn::AcrossError::Moved) => {}
            }
        }
        Err(
            "TRYAGAIN keel: the transaction's slots kept moving between partitions; nothing \
             was applied"
                .into(),
        )
    }

    /// Replicated cluster: a blocking pop (`BLPOP`, `BRPOP`, `BLMOVE`, `BRPOPLPUSH`,
    /// `BLMPOP`). It runs as a pop (a log entry); while there is nothing to pop, the client
    /// waits in this node's registry of blocked clients (`blocking`), which a push applied
    /// on this node's replica of the partition wakes (leader or follower), and then runs the
    /// pop again, until the timeout (then nil), `CLIENT UNBLOCK` or a kill. It registers
    /// before its first attempt, so that a push ordered after that attempt in the log wakes
    /// it. Clients blocked on this node are served in the order they blocked, as Redis
    /// serves them. As a fallback (a wake-up that cannot come: a push inside a transaction
    /// across partitions, a slot move) it checks its keys with a linearizable read every
    /// [`BLOCKED_POLL`]; on a node that holds no replica of the partition, where no push
    /// is applied, every 10 ms growing to 100 ms.
    async fn blocking_replicated(
        &mut self,
        (cmd, args): (Cmd, Vec<Bytes>),
        stream: &mut TcpStream,
        input: &mut BytesMut,
        output: &mut BytesMut,
    ) -> std::io::Result<bool> {
        let spec = table::lookup(&args[0]).expect("a known command");
        debug_assert_eq!(spec.cmd, cmd);
        let args = &args[..];
        let keys: Vec<Vec<u8>> = cluster::key_args(spec, args)
            .into_iter()
            .map(<[u8]>::to_vec)
            .collect();
        let Some((p, slot)) = self.partition_of(keys.iter().map(Vec::as_slice)) else {
            return self
                .block_across((cmd, args.to_vec()), stream, input, output)
                .await;
        };
        self.flush(stream, output).await?;
        // A bad timeout: the pop answers the error.
        let until = cluster::block_time(spec, args)
            .flatten()
            .map(|d| tokio::time::Instant::now() + d);
        let would_block = {
            let mut buf = BytesMut::new();
            Out::new(&mut buf, self.proto).error(crate::lists::WOULD_BLOCK);
            buf
        };
        let pop = vec![args.iter().map(|a| a.to_vec()).collect::<Vec<Vec<u8>>>()];
        // Only the source list of `BLMOVE`/`BRPOPLPUSH` (the first key) decides.
        let watched: Vec<Vec<u8>> = match spec.cmd {
            Cmd::Blmove | Cmd::Brpoplpush => keys[..1].to_vec(),
            _ => keys,
        };
        let shared = Arc::clone(&self.shared);
        let hosted = shared
            .replication
            .get()
            .is_some_and(|rep| rep.part(p).is_some());
        let waiting: Vec<Bytes> = watched.iter().map(|k| Bytes::copy_from_slice(k)).collect();
        let guard =
            shared
                .blocked
                .block(self.info.id, &waiting, crate::blocking::Kind::of(spec.cmd));
        let probe = vec![
            std::iter::once(b"EXISTS".to_vec())
                .chain(watched)
                .collect::<Vec<Vec<u8>>>(),
        ];
        let mut pause = if hosted {
            BLOCKED_POLL
        } else {
            Duration::from_millis(10)
        };
        let mut ready = true;
        let mut tried = false;
        loop {
            if std::mem::take(&mut ready) {
                let mut buf = BytesMut::new();
                self.run_replicated(p, slot, pop.clone(), false, false, false, &mut buf)
                    .await;
                // A key that became another kind while the client waited keeps it waiting,
                // as in Redis; at the first try it is the client's error.
                let other_kind = tried && buf.starts_with(b"-WRONGTYPE");
                if buf[..] != would_block[..] && !other_kind {
                    output.extend_from_slice(&buf);
                    return Ok(true);
                }
                tried = true;
            }
            match self
                .wait_blocked(
                    &guard,
                    until,
                    tokio::time::sleep(pause),
                    stream,
                    input,
                    output,
                )
                .await?
            {
                Waited::Woken => ready = true,
                Waited::Over(keep) => return Ok(keep),
                Waited::Look(()) => {
                    if !hosted {
                        pause = (pause * 2).min(Duration::from_millis(100));
                    }
                    let mut buf = BytesMut::new();
                    self.run_replicated(p, slot, probe.clone(), false, false, true, &mut buf)
                        .await;
                    // `:0` (nothing there), or an error (no leader yet): look again later.
                    // Something there goes to the first client in line on its key, which may
                    // be this one.
                    if buf.starts_with(b":") && &buf[..] != b":0\r\n" {
                        guard.found();
                    }
                }
            }
        }
    }

    /// After a cluster path ran a command: [`Next::Block`] if it was a blocking pop to wait
    /// in ([`Conn::block_next`]).
    fn next_after_routed(&self) -> Next {
        if self.blocked.is_some() {
            Next::Block
        } else {
            Next::Continue
        }
    }

    /// Cluster mode: a blocking pop is to run and wait `where_` ([`Conn::block`], which
    /// reads the socket meanwhile).
    fn block_next(&mut self, spec: &Spec, args: &[Bytes], where_: BlockedIn) {
        self.blocked = Some((spec.cmd, args.to_vec(), where_));
    }

    /// Cluster mode: a blocking pop whose keys are on several nodes (or partitions). Each
    /// try runs it gathered, as a pop that does not block (`gather`): one serializable
    /// transaction across the nodes that pops, or finds every list empty and changes
    /// nothing. While there is nothing to pop the client waits in this node's registry of
    /// blocked clients, which a push committed here to one of its keys wakes (and
    /// `CLIENT UNBLOCK`), until the timeout (then nil) or the client goes. Pushes on other
    /// nodes: in a cluster of single copies, each node that owns some of the keys is asked
    /// to answer once one of them holds something (`KEEL.AWAITPUSH`, [`Conn::await_push`],
    /// [`remote_pushes`]); where that fails (a node away), and in a replicated cluster, it
    /// looks every 10 ms growing to 100 ms whether any of the lists holds something (`EXISTS`
    /// on each key's owner, in one read-only transaction across them). Clients blocked on
    /// one node are served in the order they blocked; clients blocked on different nodes
    /// race. `false` when the connection should end.
    async fn block_across(
        &mut self,
        (cmd, args): (Cmd, Vec<Bytes>),
        stream: &mut TcpStream,
        input: &mut BytesMut,
        output: &mut BytesMut,
    ) -> std::io::Result<bool> {
        let spec = table::lookup(&args[0]).expect("a known command");
        debug_assert_eq!(spec.cmd, cmd);
        // A bad timeout: the first try answers the error.
        let until = cluster::block_time(spec, &args)
            .flatten()
            .map(|d| tokio::time::Instant::now() + d);
        self.flush(stream, output).await?;
        let shared = Arc::clone(&self.shared);
        let waiting: Vec<Bytes> = crate::lists::blocking_keys(cmd, &args).to_vec();
        let kind = crate::blocking::Kind::of(cmd);
        let guard = shared.blocked.block(self.info.id, &waiting, kind);
        let probe: Vec<Vec<Bytes>> = waiting
            .iter()
            .map(|k| vec![Bytes::from_static(b"EXISTS"), k.clone()])
            .collect();
        let probe: Vec<&[Bytes]> = probe.iter().map(Vec::as_slice).collect();
        // The other nodes' keys, by node, to wait on there (single copies only: a
        // replicated partition's keys are not where the static map says).
        let elsewhere = match (&shared.cluster, shared.replication.get()) {
            (Some(cluster), None) => cluster.by_other_owner(&waiting),
            _ => Vec::new(),
        };
        let password = shared.requirepass.read().clone();
        let mut pause = Duration::from_millis(10);
        let mut ready = true;
        let mut pause_first = elsewhere.is_empty();
        let mut tried = false;
        loop {
            if std::mem::take(&mut ready) {
                match self.gathered(&[&args], &Watching::Nothing).await {
                    // A key that became another kind while the client waited keeps it
                    // waiting, as in Redis; at the first try it is the client's error.
                    Ok(Some(ran))
                        if tried && ran.failed && ran.replies[0].starts_with(b"-WRONGTYPE") => {}
                    Ok(Some(mut ran)) if ran.failed || !ran.changed.is_empty() => {
                        output.extend_from_slice(&ran.replies.remove(0));
                        return Ok(true);
                    }
                    // Every list empty: nothing was written.
                    Ok(Some(_)) => {}
                    Ok(None) => unreachable!("nothing watched, nothing changed"),
                    Err(Fail(text)) => {
                        self.out(output).error(&text);
                        return Ok(true);
                    }
                }
                tried = true;
            }
            // After an answer that came at once (the keys hold something another client
            // here is due first), or a failed one, ask again only after a pause.
            let look = async {
                if pause_first {
                    tokio::time::sleep(pause).await;
                }
                if elsewhere.is_empty() {
                    return Remote::Failed;
                }
                remote_pushes(&shared, &elsewhere, kind, until, password.clone()).await
            };
            match self
                .wait_blocked(&guard, until, look, stream, input, output)
                .await?
            {
                Waited::Woken => ready = true,
                Waited::Over(keep) => return Ok(keep),
                // Something there goes to the first client in line on its key here, which
                // may be this one.
                Waited::Look(Remote::Pushed) => {
                    guard.found();
                    pause_first = true;
                    pause = Duration::from_millis(10);
                }
                Waited::Look(Remote::Quiet) => pause_first = false,
                Waited::Look(Remote::Failed) => {
                    pause_first = true;
                    pause = (pause * 2).min(Duration::from_millis(100));
                    // (A failed look, a node away, is tried again at the next.)
                    if let Ok(Some(replies)) = self.across_checked(&probe, &Watching::Nothing).await
                        && replies.iter().any(|r| r[..] != b":0\r\n"[..])
                    {
                        guard.found();
                    }
                }
            }
        }
    }

    /// `KEEL.AWAITPUSH list|zset timeout-ms key [key ...]` (cluster of single copies):
    /// another node's client blocked across nodes ([`Conn::block_across`]) waits here,
    /// through this connection, for a push to `keys`, which this node owns. Answers `:1` once
    /// one of them holds the kind (at once if one does: the client's last try may have come
    /// before a push here), nil at the timeout. It registers as a watcher first, so a push
    /// committed from then on wakes it and one before is seen by its look (as a blocked
    /// client's registration and its try). `false` when the connection should end.
    async fn await_push(
        &mut self,
        args: &[Bytes],
        stream: &mut TcpStream,
        input: &mut BytesMut,
        output: &mut BytesMut,
    ) -> std::io::Result<bool> {
        let (kind, wait) = parse_await_push(args).expect("checked before blocking");
        let until = tokio::time::Instant::now() + wait;
        let shared = Arc::clone(&self.shared);
        let keys = &args[3..];
        let guard = shared.blocked.watch(self.info.id, keys, kind);
        loop {
            if holds(shared.db, keys, kind) {
                self.out(output).int(1);
                return Ok(true);
            }
            if let Some(keep) = self
                .wait_woken(&guard, Some(until), stream, input, output)
                .await?
            {
                return Ok(keep);
            }
        }
    }

    /// Replicated cluster: `WATCH` of `keys`: each key's partition records it (a log entry:
    /// from then on every write to it changes its version) and answers its version, which
    /// `EXEC` has its partition check. A key watched earlier keeps its first version.
    async fn watch_replicated(&mut self, keys: &[Bytes]) -> Result<(), Fail> {
        if self.rwatch.is_empty() {
            self.rwatch_renew = Some(Instant::now() + WATCH_RENEW_EVERY);
        }
        if self.rwatch.len() + keys.len() > WATCH_KEYS_MAX {
            return Err(format!("ERR keel: at most {WATCH_KEYS_MAX} keys may be watched").into());
        }
        let shared = Arc::clone(&self.shared);
        let rep = shared.replication.get().expect("replicated");
        'plan: for _ in 0..MOVES_FOLLOWED {
            let mut groups: Vec<(usize, Vec<Vec<u8>>)> = Vec::new();
            for key in keys {
                let (p, _) = self.partition_of([&key[..]]).expect("one key");
                match groups.iter_mut().find(|(q, _)| *q == p) {
                    Some((_, ks)) => ks.push(key.to_vec()),
                    None => groups.push((p, vec![key.to_vec()])),
                }
            }
            // A partition's keys go in entries of a bounded size: an entry writes a watch
            // record per key in one engine transaction.
            let requests = groups.into_iter().flat_map(|(p, ks)| {
                ks.chunks(crate::replica::WATCH_ENTRY_KEYS_MAX)
                    .map(|chunk| (p, chunk.to_vec()))
                    .collect::<Vec<_>>()
            });
            let mut known: std::collections::HashSet<Vec<u8>> =
                self.rwatch.iter().map(|w| w.key.clone()).collect();
            for (p, ks) in requests {
                let request = crate::replica::Request::new(
                    &shared,
                    vec![std::iter::once(b"EXISTS".to_vec()).chain(ks).collect()],
                    crate::replica::Op::Watch,
                );
                let answer = tokio::select! {
                    r = rep.run(&shared, p, request, false) => r,
                    () = self.info.kill.cancelled() => {
                        return Err("ERR keel: the connection was killed".into());
                    }
                };
                match answer {
                    Ok(reply) => {
                        let got: Vec<crate::replica::Watched> = postcard::from_bytes(&reply)
                            .map_err(|e| format!("ERR keel: a bad WATCH answer: {e}"))?;
                        for w in got {
                            if known.insert(w.key.clone()) {
                                self.rwatch.push(w);
                            }
                        }
                    }
                    Err(crate::replica::RunError::Moved) => continue 'plan,
                    Err(
                        crate::replica::RunError::Failed(text)
                        | crate::replica::RunError::Unknown(text),
                    ) => return Err(text.into()),
                    Err(crate::replica::RunError::RolledBack) => {
                        unreachable!("a watch is not a batch")
                    }
                }
            }
            return Ok(());
        }
        Err("TRYAGAIN keel: the watched keys' slots kept moving; watch them again".into())
    }

    /// Replicated cluster: `WATCH`es the watched keys again before their partitions would
    /// forget them. A partition keeps a key's version while it stays watched, so a renewal
    /// changes nothing else; the versions first recorded stay, and a key that changed since
    /// still aborts `EXEC`. A renewal that fails is tried again soon; one that never gets
    /// through lets the watch lapse, which aborts `EXEC` as a change would.
    async fn renew_watches(&mut self) {
        let keys: Vec<Bytes> = self
            .rwatch
            .iter()
            .map(|w| Bytes::copy_from_slice(&w.key))
            .collect();
        let recorded = std::mem::take(&mut self.rwatch);
        let renewed = self.watch_replicated(&keys).await;
        self.rwatch = recorded;
        let again = match renewed {
            Ok(()) => {
                self.shared.counters.watch_renewals.fetch_add(1, Relaxed);
                WATCH_RENEW_EVERY
            }
            Err(Fail(text)) => {
                tracing::debug!(id = self.info.id, error = %text, "renewing watches");
                WATCH_RENEW_RETRY
            }
        };
        self.rwatch_renew = Some(Instant::now() + again);
    }

    /// Replicated cluster: `FLUSHDB`/`FLUSHALL` as one transaction across every partition
    /// (each deletes its data in one engine transaction; nothing is seen half flushed). A
    /// partition holding more keys than one transaction deletes refuses it; then every
    /// partition is flushed in entries of `KEEL.FLUSHBATCH` instead, one after another, as a
    /// single node flushes so many (writes meanwhile may stay, and reads may see it half
    /// done).
    async fn flush_partitions(&self, args: &[Bytes]) -> Result<(), Fail> {
        match self.flush_partitions_at_once(args).await {
            Err(Fail(text)) if text.starts_with(crate::replica::FLUSH_TOO_LARGE) => {
                self.flush_partitions_in_batches().await
            }
            other => other,
        }
    }

    /// Each partition in turn, in `KEEL.FLUSHBATCH` entries until it answers that it is
    /// empty.
    async fn flush_partitions_in_batches(&self) -> Result<(), Fail> {
        let shared = Arc::clone(&self.shared);
        let rep = shared.replication.get().expect("replicated");
        for p in 0..rep.partitions() {
            let mut entries = 0u64;
            loop {
                let request = crate::replica::Request::new(
                    &shared,
                    vec![vec![b"KEEL.FLUSHBATCH".to_vec()]],
                    crate::replica::Op::Run,
                );
                let result = tokio::select! {
                    r = rep.run(&shared, p, request, false) => r,
                    () = self.info.kill.cancelled() => {
                        return Err("ERR keel: the connection was killed".into());
                    }
                };
                entries += 1;
                match result {
                    Ok(reply) if reply == b":0\r\n" => break,
                    Ok(reply) if reply == b":1\r\n" => {}
                    Ok(other) => {
                        return Err(format!(
                            "ERR keel: partition {p} answered a flush batch with {}",
                            String::from_utf8_lossy(&other).trim_end()
                        )
                        .into());
                    }
                    Err(
                        crate::replica::RunError::Failed(text)
                        | crate::replica::RunError::Unknown(text),
                    ) => return Err(text.into()),
                    Err(e) => {
                        return Err(format!(
                            "TRYAGAIN keel: partition {p} refused a flush batch ({e:?}); part \
                             of it may be flushed"
                        )
                        .into());
                    }
                }
            }
            if entries > 1 {
                tracing::info!("flushed partition {p} in {entries} entries");
            }
        }
        Ok(())
    }

    async fn flush_partitions_at_once(&self, args: &[Bytes]) -> Result<(), Fail> {
        let shared = Arc::clone(&self.shared);
        let rep = shared.replication.get().expect("replicated");
        let command: Vec<Vec<u8>> = args.iter().map(|a| a.to_vec()).collect();
        let work: crate::replica::txn::Work = (0..rep.partitions())
            .map(|p| (p, vec![command.clone()]))
            .collect();
        let limits = self.txn_limits();
        let node = Arc::new(crate::replica::txn::Node(Arc::clone(&shared)));
        self.wrote.lock().extend(0..rep.partitions());
        let result = tokio::select! {
            r = crate::replica::txn::run_across(&node, work, limits) => r,
            () = self.info.kill.cancelled() => {
                return Err("ERR keel: the connection was killed".into());
            }
        };
        match result {
            Ok(_) => Ok(()),
            Err(crate::replica::txn::AcrossError::Failed(text)) => Err(text.into()),
            // A flush has no keys: no slot of it moves.
            Err(crate::replica::txn::AcrossError::Moved) => {
                Err("TRYAGAIN keel: a partition refused the flush; nothing was flushed".into())
            }
        }
    }

    /// `KEEL.MOVESLOTS node-id slot|start-end ...`: moves the slots to the partition whose
    /// home is `node-id` (`replica::txn::move_slots`); the number of slots that changed.
    async fn move_slots(&self, args: &[Bytes]) -> Result<usize, Fail> {
        let (Some(rep), Some(cluster)) = (self.shared.replication.get(), &self.shared.cluster)
        else {
            return Err(
                "ERR keel: KEEL.MOVESLOTS moves slots between the partitions of a replicated \
                 cluster (--replicas 2 or more)"
                    .into(),
            );
        };
        let map = &cluster.map();
        let to = map
            .nodes()
            .iter()
            .position(|n| n.id.as_str().as_bytes() == &args[1][..])
            .filter(|&n| !rep.removed(n))
            .ok_or_else(|| {
                format!(
                    "ERR keel: no node '{}' in the cluster",
                    String::from_utf8_lossy(&args[1])
                )
            })?;
        let mut slots = Vec::new();
        for arg in &args[2..] {
            let text = std::str::from_utf8(arg).unwrap_or("");
            let slot = |s: &str| -> Result<u16, Fail> {
                s.parse::<u16>()
                    .ok()
                    .filter(|&n| n < keel_cluster::SLOTS)
                    .ok_or_else(|| {
                        format!(
                            "ERR keel: '{text}' is not a slot (0-{}) or a range of them",
                            keel_cluster::SLOTS - 1
                        )
                        .into()
                    })
            };
            match text.split_once('-') {
                Some((a, b)) => {
                    let (a, b) = (slot(a)?, slot(b)?);
                    if a > b {
                        return Err(format!("ERR keel: the range '{text}' is empty").into());
                    }
                    slots.extend(a..=b);
                }
                None => slots.push(slot(text)?),
            }
        }
        let node = Arc::new(crate::replica::txn::Node(Arc::clone(&self.shared)));
        let moved = tokio::select! {
            r = crate::replica::txn::move_slots(&node, &slots, to) => r?,
            () = self.info.kill.cancelled() => {
                return Err("ERR keel: the connection was killed".into());
            }
        };
        Ok(moved.slots)
    }

    /// The partition of every key in `keys` and the first key's slot; `None` if they are in
    /// several partitions.
    fn partition_of<'k>(
        &self,
        keys: impl IntoIterator<Item = &'k [u8]>,
    ) -> Option<(usize, keel_cluster::Slot)> {
        let map = &self.shared.cluster.as_ref().expect("cluster mode").map();
        let rep = self.shared.replication.get();
        let mut at = None;
        for key in keys {
            let slot = keel_cluster::key_slot(key);
            let p = match rep {
                Some(rep) => rep.owner(map, slot.0),
                None => map.owner(slot),
            };
            match at {
                None => at = Some((p, slot)),
                Some((q, _)) if q != p => return None,
                Some(_) => {}
            }
        }
        at
    }

    /// Runs `commands` (one, an `EXEC`'s, or a pipelined `batch`) on partition `p`'s leader
    /// and writes the reply; a cluster-aware client gets `MOVED` to the leader instead when it
    /// is another node. `false` (nothing written) for a batch that rolled back.
    #[allow(clippy::too_many_arguments)]
    async fn run_replicated(
        &mut self,
        p: usize,
        slot: keel_cluster::Slot,
        commands: Vec<Vec<Vec<u8>>>,
        exec: bool,
        batch: bool,
        read: bool,
        output: &mut BytesMut,
    ) -> bool {
        let shared = Arc::clone(&self.shared);
        let rep = shared.replication.get().expect("replicated");
        let cluster = shared.cluster.as_ref().expect("cluster mode");
        let request = crate::replica::Request {
            exec,
            batch,
            resp3: self.proto == Proto::Resp3,
            ..crate::replica::Request::new(&shared, commands, crate::replica::Op::Run)
        };
        let (mut p, mut slot) = (p, slot);
        // A slot that moved to another partition is followed (a few times: it may move on).
        for _ in 0..MOVES_FOLLOWED {
            // READONLY: a read of a partition kept here runs on this copy, as a Redis replica
            // serves its slots after READONLY.
            if read
                && self.readonly
                && let Some(part) = rep.part(p)
            {
                // While a key it reads is written by a prepared transaction, wait for its
                // decision (up to the cluster timeout).
                let give_up = std::time::Instant::now() + cluster.map().timeout();
                let refused = loop {
                    match part.read_local(&request) {
                        Ok(reply) => {
                            output.extend_from_slice(&reply);
                            return true;
                        }
                        Err(r) if r.status == crate::replica::Status::Busy => {
                            if std::time::Instant::now() >= give_up {
                                self.out(output).error(
                                    "TRYAGAIN keel: a key stayed locked by a transaction across \
                                     partitions",
                                );
                                return true;
                            }
                            tokio::time::sleep(Duration::from_millis(2)).await;
                        }
                        Err(r) => break r,
                    }
                };
                rep.learn(
                    &postcard::from_bytes::<Vec<(u16, usize)>>(&refused.reply).unwrap_or_default(),
                );
            } else {
                if self.aware
                    && let Some(leader) = rep.leader(p)
                    && leader != rep.me
                {
                    self.flag_multi();
                    self.out(output).error(&cluster.moved(leader, slot));
                    return true;
                }
                if !read {
                    self.wrote.lock().insert(p);
                }
                let result = tokio::select! {
                    r = rep.run(&shared, p, request.clone(), read) => r,
                    () = self.info.kill.cancelled() => return true,
                };
                match result {
                    Ok(reply) => {
                        output.extend_from_slice(&reply);
                        return true;
                    }
                    Err(
                        crate::replica::RunError::Failed(text)
                        | crate::replica::RunError::Unknown(text),
                    ) => {
                        self.out(output).error(&text);
                        return true;
                    }
                    Err(crate::replica::RunError::RolledBack) => return false,
                    // A batch runs again command by command, each routed anew.
                    Err(crate::replica::RunError::Moved) if batch => return false,
                    Err(crate::replica::RunError::Moved) => {}
                }
            }
            let keys = keys_of(&request.commands);
            match self.partition_of(keys.iter().map(Vec::as_slice)) {
                Some((q, s)) => (p, slot) = (q, s),
                // An `EXEC` whose keys are now in several partitions runs across them.
                None if exec => {
                    let commands: Vec<Vec<Bytes>> = request
                        .commands
                        .iter()
                        .map(|c| c.iter().map(|a| Bytes::copy_from_slice(a)).collect())
                        .collect();
                    let refs: Vec<&[Bytes]> = commands.iter().map(Vec::as_slice).collect();
                    let result = self.across_partitions(&refs).await;
                    let mut out = self.out(output);
                    match result {
                        Ok(replies) => {
                            out.array(replies.len());
                            for reply in replies {
                                out.buf.extend_from_slice(&reply);
                            }
                        }
                        Err(Fail(text)) => out.error(&text),
                    }
                    return true;
                }
                None => {
                    self.out(output).error(
                        "TRYAGAIN keel: the request's keys moved to several partitions while it \
                         ran; nothing was applied",
                    );
                    return true;
                }
            }
        }
        self.out(output).error(
            "TRYAGAIN keel: the request's slots kept moving between partitions; nothing was \
             applied",
        );
        true
    }

    /// Replicated cluster: `EXEC` of the queued commands, as one log entry of their
    /// partition.
    async fn exec_replicated(&mut self, multi: Multi, output: &mut BytesMut) -> Result<(), Fail> {
        let watched = std::mem::take(&mut self.rwatch);
        if self.exec_gathers(&multi) {
            return self
                .exec_gathered(&multi, Watching::Partitions(&watched), output)
                .await;
        }
        let mut keys = Vec::new();
        // PING, ECHO, TIME, ROLE, UNWATCH, WAIT and SWAPDB are answered here (`Place::here`),
        // by the path across partitions, which places replies from several sources.
        let mut here = 0;
        for (cmd, args) in &multi.queue {
            let spec = table::lookup(&args[0])
                .filter(|s| s.cmd == *cmd)
                .expect("a queued command is known");
            if Place::here(*cmd, args, self.proto, self.exec_acked).is_some() {
                here += 1;
                continue;
            }
            if !data::is_data(*cmd) {
                return Err(format!(
                    "ERR keel: {} inside MULTI is not supported in a replicated cluster yet",
                    spec.name.to_ascii_uppercase()
                )
                .into());
            }
            let these = cluster::key_args(spec, args);
            if these.is_empty() {
                return Err(format!(
                    "ERR keel: {} (a command without keys) inside MULTI is not supported in a \
                     replicated cluster yet",
                    spec.name.to_ascii_uppercase()
                )
                .into());
            }
            keys.extend(these);
        }
        if !watched.is_empty() {
            // Checked where each watched key lives, in one transaction with the commands.
            let commands: Vec<&[Bytes]> = multi.queue.iter().map(|(_, a)| &a[..]).collect();
            let result = self.across_partitions_watched(&commands, &watched).await?;
            let mut out = self.out(output);
            match result {
                Some(replies) => {
                    out.array(replies.len());
                    for reply in replies {
                        out.buf.extend_from_slice(&reply);
                    }
                }
                None => {
                    self.shared.counters.watch_aborts.fetch_add(1, Relaxed);
                    out.null_array();
                }
            }
            return Ok(());
        }
        if here == multi.queue.len() {
            // Nothing for a partition.
            let mut replies = Vec::with_capacity(here);
            for (cmd, args) in &multi.queue {
                match Place::here(*cmd, args, self.proto, self.exec_acked) {
                    Some(Ok(Place::Here(reply))) => replies.push(reply),
                    Some(Err(e)) => return Err(e),
                    _ => unreachable!("counted as answered here"),
                }
            }
            let mut out = self.out(output);
            out.array(replies.len());
            for reply in replies {
                out.buf.extend_from_slice(&reply);
            }
            return Ok(());
        }
        let one = self
            .partition_of(keys.iter().copied())
            .filter(|_| here == 0);
        let Some((p, slot)) = one else {
            let commands: Vec<&[Bytes]> = multi.queue.iter().map(|(_, a)| &a[..]).collect();
            let replies = self.across_partitions(&commands).await?;
            let mut out = self.out(output);
            out.array(replies.len());
            for reply in replies {
                out.buf.extend_from_slice(&reply);
            }
            return Ok(());
        };
        let read = multi.queue.iter().all(|(c, _)| data::is_read_only(*c));
        let commands = multi
            .queue
            .iter()
            .map(|(_, args)| args.iter().map(|a| a.to_vec()).collect())
            .collect();
        self.run_replicated(p, slot, commands, true, false, read, output)
            .await;
        Ok(())
    }

    /// Cluster mode: sends a command whose keys are not all on this node's slots where it
    /// belongs (see `cluster`); whether it was answered. A command for another node inside
    /// `MULTI` from a plain connection is queued (`EXEC` forwards the transaction).
    async fn routed(&mut self, spec: &Spec, args: &[Bytes], output: &mut BytesMut) -> bool {
        let cluster = self
            .shared
            .cluster
            .as_ref()
            .expect("called in cluster mode");
        let (node, slot) = match cluster.route(spec, args) {
            Route::Local => return false,
            Route::CrossSlot if spec.cmd == Cmd::Watch => {
                self.watch_command(args, output).await;
                return true;
            }
            Route::CrossSlot if self.multi.is_none() && self.shared.xnode.get().is_some() => {
                if crate::lists::is_blocking(spec.cmd) {
                    self.block_next(spec, args, BlockedIn::Across);
                } else {
                    self.split_across(spec, args, output, false).await;
                }
                return true;
            }
            // Queued: `EXEC` runs it key by key in its transaction across nodes, or runs the
            // whole transaction gathered.
            Route::CrossSlot
                if self.shared.xnode.get().is_some()
                    && (per_key(spec.cmd, args).is_some()
                        || crate::gather::may_gather(spec.cmd))
                    && !(spec.cmd == Cmd::Mset && args.len().is_multiple_of(2)) =>
            {
                return false;
            }
            Route::CrossSlot => {
                self.flag_multi();
                self.out(output).error(cluster::CROSSSLOT);
                return true;
            }
            Route::Remote { node, slot } => (node, slot),
        };
        if self.aware {
            let moved = cluster.moved(node, slot);
            self.flag_multi();
            self.out(output).error(&moved);
            return true;
        }
        if spec.cmd == Cmd::Watch {
            self.watch_command(args, output).await;
            return true;
        }
        if self.multi.is_some() {
            return false;
        }
        let block = cluster::block_time(spec, args);
        // A write (a blocking pop too) goes exactly once (`once`); reads as they are.
        let once = !data::is_read_only(spec.cmd);
        self.forward(node, &[args], output, block, once).await;
        true
    }

    /// Runs `requests` on cluster node `node` and writes the last one's reply (or why it
    /// failed) to `output`. With `once`, the last request (a write that does not block) runs
    /// exactly once: sent again with its id when its answer is lost (`Cluster::forward_once`).
    async fn forward(
        &self,
        node: usize,
        requests: &[&[Bytes]],
        output: &mut BytesMut,
        block: Option<Option<std::time::Duration>>,
        once: bool,
    ) {
        let cluster = self
            .shared
            .cluster
            .as_ref()
            .expect("called in cluster mode");
        let password = self.shared.requirepass.read().clone();
        let forwarding = async {
            if once {
                cluster
                    .forward_once(node, requests, self.proto, password, block)
                    .await
            } else {
                cluster
                    .forward(node, requests, self.proto, password, block)
                    .await
            }
        };
        // A killed connection (CLIENT KILL, shutdown) stops waiting, as a blocked pop does.
        let forwarded = tokio::select! {
            r = forwarding => r,
            () = self.info.kill.cancelled() => return,
        };
        match forwarded {
            Ok(reply) => output.extend_from_slice(&reply),
            Err(text) => self.out(output).error(&text),
        }
    }

    /// `KEEL.ONCE node incarnation seq keep-ms until-ms command [arg ...]` (`once`): a write
    /// that another node of a cluster of single copies forwarded here, run at most once per
    /// id, and not at all if it arrived well after `until-ms`. The command is a data command
    /// with keys on this node's slots, or `EXEC` of the MULTI this connection queued.
    async fn keel_once(&mut self, args: &[Bytes], output: &mut BytesMut) -> Result<(), Fail> {
        let Some(cluster) = self.shared.cluster.as_ref() else {
            return Err(ONCE_ONLY.into());
        };
        if self.shared.replication.get().is_some() {
            return Err(ONCE_ONLY.into());
        }
        let request = once::parse(args)?;
        if let Some(late) = request.late(crate::keyspace::unix_ms()) {
            // An `EXEC`'s transaction goes too: the connection may serve other requests.
            if self.multi.take().is_some() {
                self.watch = None;
                self.rwatch.clear();
            }
            return Err(late.into());
        }
        let Some(spec) = table::lookup(&request.command[0]) else {
            return Err(Fail(
                String::from_utf8_lossy(&unknown_command(request.command))
                    .trim_start_matches('-')
                    .trim_end()
                    .to_owned()
                    .into(),
            ));
        };
        if !spec.arity_ok(request.command.len()) {
            return Err(
                format!("ERR wrong number of arguments for '{}' command", spec.name).into(),
            );
        }
        let local = |spec: &Spec, args: &[Bytes]| -> Result<(), Fail> {
            if !data::is_data(spec.cmd) || cluster::key_args(spec, args).is_empty() {
                return Err(format!(
                    "ERR keel: KEEL.ONCE runs a data command with keys, and '{}' is not one",
                    spec.name
                )
                .into());
            }
            match cluster.route(spec, args) {
                Route::Local => Ok(()),
                Route::Remote { node, slot } => Err(cluster.moved(node, slot).into()),
                Route::CrossSlot => Err(cluster::CROSSSLOT.into()),
            }
        };
        if spec.cmd != Cmd::Exec {
            if self.multi.is_some() {
                self.flag_multi();
                return Err("ERR keel: inside MULTI, KEEL.ONCE wraps only EXEC".into());
            }
            local(spec, request.command)?;
            if crate::lists::is_blocking(spec.cmd) {
                return self
                    .once_blocking(
                        request.id,
                        request.keep_ms,
                        spec.cmd,
                        request.command,
                        output,
                    )
                    .await;
            }
            let commands = [(spec.cmd, request.command.to_vec())];
            self.run_once(request.id, request.keep_ms, &commands, false, output)
                .await;
            return Ok(());
        }
        let Some(multi) = self.multi.take() else {
            return Err("ERR EXEC without MULTI".into());
        };
        if self.watch.take().is_some() {
            self.rwatch.clear();
            return Err("ERR keel: KEEL.ONCE does not run an EXEC under WATCH".into());
        }
        if multi.dirty {
            return Err("EXECABORT Transaction discarded because of previous errors.".into());
        }
        for (cmd, args) in &multi.queue {
            let spec = table::lookup(&args[0]).expect("a queued command is known");
            debug_assert_eq!(spec.cmd, *cmd);
            local(spec, args)?;
        }
        self.run_once(request.id, request.keep_ms, &multi.queue, true, output)
            .await;
        Ok(())
    }

    /// `KEEL.ONCE … BLPOP|BRPOP|BLMOVE|BRPOPLPUSH|BLMPOP …`: a blocking pop forwarded
    /// exactly once. It becomes the one attempt of its id on this node (an older attempt,
    /// whose answer the forwarding node lost while it waited, is superseded and ends first:
    /// `once::Attempts`), then pops as soon as it can, in one commit with its kept answer (or
    /// finds the answer an older attempt kept), waiting meanwhile as a blocked client does. A
    /// timeout answers as the pop's does and keeps nothing (nothing changed).
    async fn once_blocking(
        &mut self,
        id: once::Id,
        keep_ms: u64,
        cmd: Cmd,
        args: &[Bytes],
        output: &mut BytesMut,
    ) -> Result<(), Fail> {
        let timeout = crate::lists::timeout(crate::lists::timeout_arg_of(cmd, args))?;
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        let shared = self.shared.clone();
        let cluster = shared.cluster.as_ref().expect("checked by KEEL.ONCE");
        let running = cluster.attempts.enter(id).await;
        // Registered before the first try: a push committed from now on wakes this attempt,
        // and the try sees any committed before (`blocking`).
        let guard = shared.blocked.block(
            self.info.id,
            crate::lists::blocking_keys(cmd, args),
            crate::blocking::Kind::of(cmd),
        );
        let commands = [(cmd, args.to_vec())];
        let kill = self.info.kill.clone();
        loop {
            if !self.run_once(id, keep_ms, &commands, false, output).await {
                return Ok(());
            }
            let expired = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                () = kill.cancelled() => return Ok(()),
                () = running.attempt.superseded.cancelled() => {
                    return Err("ERR keel: a newer attempt of this forwarded pop took over".into());
                }
                () = guard.woken() => match guard.unblocked() {
                    None => {}
                    Some(crate::blocking::Unblock::Error) => {
                        return Err("UNBLOCKED client unblocked via CLIENT UNBLOCK".into());
                    }
                    Some(crate::blocking::Unblock::Timeout) => {
                        timed_out(&mut self.out(output));
                        return Ok(());
                    }
                },
                () = expired => {
                    timed_out(&mut self.out(output));
                    return Ok(());
                }
            }
        }
    }

    /// Runs `commands` (one, or `EXEC`'s queue when `exec`) as one transaction that first
    /// looks for `id`'s kept answer (then runs nothing and writes that answer) and that
    /// keeps its reply under `id` for `keep_ms` in its own commit (`once`). Increments read
    /// their value rather than wait for the commit, so the reply is whole before it.
    async fn run_once(
        &self,
        id: once::Id,
        keep_ms: u64,
        commands: &[(Cmd, Vec<Bytes>)],
        exec: bool,
        output: &mut BytesMut,
    ) -> bool {
        let shared = &*self.shared;
        let mut ctx = ctx(shared);
        ctx.track_increments = false;
        let ctx = ctx;
        let mark = output.len();
        let mut out = Out::new(output, self.proto);
        let may_wait = self.may_wait(commands.iter().map(|(c, _)| *c));
        let mut attempt = 1;
        let mut rejoin = false;
        loop {
            let mut replayed = false;
            let mut would_block = false;
            let prepare = || {
                ctx.clock.reset();
                let mut txn = shared.db.begin().map_err(|e| Some(begin_error(e)))?;
                if let Some(kept) = once::kept(&mut txn, id).map_err(Some)? {
                    out.buf.extend_from_slice(&kept);
                    replayed = true;
                    return Err(None);
                }
                if exec {
                    out.array(commands.len());
                }
                let mut failed = false;
                for (cmd, args) in commands {
                    let slot = out.buf.len();
                    let result = if !exec && crate::lists::is_blocking(*cmd) {
                        // A blocking pop outside MULTI: nothing to pop yet is no answer.
                        match crate::lists::run_blocking(*cmd, args, &mut txn, &ctx, &mut out) {
                            Ok(true) => Ok(()),
                            Ok(false) => {
                                out.buf.truncate(mark);
                                would_block = true;
                                return Err(None);
                            }
                            Err(e) => Err(e),
                        }
                    } else {
                        data::run(*cmd, args, &mut View::Txn(&mut txn), &ctx, &mut out)
                    };
                    if let Err(Fail(text)) = result {
                        out.buf.truncate(slot);
                        out.error(&text);
                        failed = true;
                    }
                    if out.buf.len() - mark > ctx.reply_bytes_max {
                        return Err(Some(data::reply_too_big()));
                    }
                }
                if failed {
                    // Nothing changed (keel rolls back a whole EXEC with a failing command):
                    // the reply stands and nothing needs keeping.
                    return Err(None);
                }
                let deadline = ks::unix_ms().saturating_add(keep_ms);
                once::keep(&mut txn, id, deadline, &out.buf[mark..]).map_err(Some)?;
                Ok(txn)
            };
            let committed = match self
                .attempt(rejoin, may_wait, &mut Vec::new(), prepare)
                .await
            {
                Ok(committed) => committed,
                Err(None) if would_block => return true,
                Err(None) => {
                    if replayed && let Some(cluster) = &shared.cluster {
                        cluster.once.replayed.fetch_add(1, Relaxed);
                    }
                    return false;
                }
                Err(Some(Fail(text))) => {
                    out.buf.truncate(mark);
                    out.error(&text);
                    return false;
                }
            };
            match committed {
                Ok(Ok(_)) => {
                    if let Some(cluster) = &shared.cluster {
                        cluster.once.kept.fetch_add(1, Relaxed);
                    }
                    for (cmd, args) in commands {
                        shared.blocked.committed(*cmd, args);
                    }
                    return false;
                }
                Ok(Err(conflict)) => {
                    out.buf.truncate(mark);
                    ctx.contended.set(&conflict);
                    if attempt >= CONFLICT_ATTEMPTS_MAX {
                        out.error(&format!(
                            "ERR keel: gave up after {attempt} conflicting attempts; last: {conflict}"
                        ));
                        return false;
                    }
                    shared.counters.exec_retries.fetch_add(1, Relaxed);
                    rejoin = self.wait_to_retry(&conflict, attempt).await;
                    attempt += 1;
                }
                Err(keel::CommitError::Apply(e)) => {
                    out.buf.truncate(mark);
                    out.error(&data::engine_error(&e).0);
                    return false;
                }
                Err(e) => {
                    out.buf.truncate(mark);
                    out.error(&format!("ERR keel: {e}"));
                    return false;
                }
            }
        }
    }

    /// Cluster mode: runs `commands` (each on the node that owns its keys) as one
    /// transaction across nodes, and returns each command's reply, in order (see
    /// [`Conn::run_across`]).
    async fn across_nodes(&self, commands: &[&[Bytes]]) -> Result<Vec<Vec<u8>>, Fail> {
        let (work, place) = self.plan_across(commands)?;
        let replies = self
            .run_across(work)
            .await?
            .expect("nothing watched, nothing to change");
        Ok(gather(replies, &place, self.proto))
    }

    /// Splits `commands` by the node that owns their keys: each node's work, and where each
    /// command's reply will be (work index, position).
    fn plan_across(&self, commands: &[&[Bytes]]) -> Result<(AcrossWork, Vec<Place>), Fail> {
        let cluster = self.shared.cluster.as_ref().expect("cluster mode");
        let mut work = Vec::new();
        let mut place = Vec::with_capacity(commands.len());
        let put = |work: &mut AcrossWork, node: usize, command: &[Bytes]| {
            let i = self.work_for(work, node);
            work[i]
                .1
                .commands
                .push(command.iter().map(|a| a.to_vec()).collect());
            (i, work[i].1.commands.len() - 1)
        };
        for args in commands {
            let spec = table::lookup(&args[0]).expect("a queued command is known");
            if let Some(here) = Place::here(spec.cmd, args, self.proto, self.exec_acked) {
                place.push(here?);
                continue;
            }
            if !data::is_data(spec.cmd) {
                return Err(format!(
                    "ERR keel: a transaction across nodes runs only data commands and PING, \
                     ECHO, TIME, and '{}' is none",
                    spec.name
                )
                .into());
            }
            // A command without keys (DBSIZE, KEYS, SCAN, RANDOMKEY, FLUSHDB, ...) runs on
            // this node, as it does outside MULTI: a node answers for its own slots, as in
            // Redis Cluster.
            let node = match cluster.route(spec, args) {
                Route::Local => cluster.map().myself(),
                Route::Remote { node, .. } => node,
                Route::CrossSlot => {
                    // Key by key, each part on its key's node, the replies merged.
                    let (parts, merge) =
                        per_key(spec.cmd, args).ok_or_else(|| Fail::from(cluster::CROSSSLOT))?;
                    let map = cluster.map();
                    let at = parts
                        .iter()
                        .map(|part| {
                            let node = map.owner(keel_cluster::key_slot(&part[1]));
                            put(&mut work, node, part)
                        })
                        .collect();
                    place.push(Place::Split(at, merge));
                    continue;
                }
            };
            let (i, j) = put(&mut work, node, args);
            place.push(Place::At(i, j));
        }
        Ok((work, place))
    }

    /// The index of `node`'s entry in `work`, added empty if missing.
    fn work_for(&self, work: &mut AcrossWork, node: usize) -> usize {
        let peer = keel_cluster::txn::Peer(u16::try_from(node).expect("at most u16::MAX nodes"));
        match work.iter().position(|(p, _)| *p == peer) {
            Some(i) => i,
            None => {
                let part = crate::xnode::Work {
                    resp3: self.proto == Proto::Resp3,
                    commands: Vec::new(),
                    watch: Vec::new(),
                    checks: Vec::new(),
                    deadlines: Vec::new(),
                    patient: false,
                };
                work.push((peer, part));
                work.len() - 1
            }
        }
    }

    /// Runs `work` as one transaction across nodes: every node's replies, or `None` if a
    /// watched key changed. A transaction that loses a conflict runs again (nothing of it
    /// was seen): up to [`ACROSS_ATTEMPTS_MAX`] times, then `TRYAGAIN`.
    async fn run_across(&self, mut work: AcrossWork) -> Result<Option<Vec<Vec<Vec<u8>>>>, Fail> {
        use keel_cluster::txn::{AbortReason, Outcome, Refusal};
        let Some(xnode) = self.shared.xnode.get() else {
            return Err(cluster::CROSSSLOT.into());
        };
        let reads_only = work.iter().all(|(_, part)| crate::xnode::reads_only(part));
        let mut backoff = Duration::from_millis(1);
        let mut attempt = 1;
        loop {
            if reads_only && attempt == PATIENT_AFTER {
                for (_, part) in &mut work {
                    part.patient = true;
                }
            }
            match xnode.run(work.clone()).await {
                Outcome::Committed(replies) => {
                    return Ok(Some(replies.into_iter().map(|(_, r)| r).collect()));
                }
                Outcome::Aborted(AbortReason::Refused {
                    refusal: Refusal::Failed(text),
                    ..
                }) if text == crate::xnode::WATCH_CHANGED => return Ok(None),
                Outcome::Aborted(AbortReason::Refused {
                    refusal: Refusal::Failed(text),
                    ..
                }) => return Err(text.into()),
                Outcome::Aborted(AbortReason::Timeout) => {
                    return Err(
                        "TRYAGAIN keel: a node of the transaction did not vote in time; \
                                nothing of it was applied"
                            .into(),
                    );
                }
                Outcome::Aborted(_) if attempt < ACROSS_ATTEMPTS_MAX => {
                    // Jittered, so that transactions that refused each other do not meet
                    // again at the same moment.
                    let nanos = std::time::SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .map_or(0, |d| d.subsec_nanos());
                    let jitter = u64::from(nanos ^ (nanos >> 7)) % (backoff.as_micros() as u64 + 1);
                    tokio::time::sleep(backoff / 2 + Duration::from_micros(jitter)).await;
                    backoff = (backoff * 2).min(Duration::from_millis(50));
                    attempt += 1;
                }
                Outcome::Aborted(reason) => {
                    let last = match &reason {
                        AbortReason::Refused { by, refusal } => {
                            let node = self
                                .shared
                                .cluster
                                .as_ref()
                                .and_then(|c| {
                                    c.map()
                                        .nodes()
                                        .get(usize::from(by.0))
                                        .map(|n| n.id.to_string())
                                })
                                .unwrap_or_else(|| by.0.to_string());
                            let why = match refusal {
                                Refusal::Overloaded => "it has too many transactions in progress",
                                _ => {
                                    "another transaction holds one of its keys, or one changed \
                                     as it ran"
                                }
                            };
                            format!("last refused by node {node}: {why}")
                        }
                        _ => "a node did not vote in time".to_owned(),
                    };
                    return Err(format!(
                        "TRYAGAIN keel: the transaction across nodes lost {attempt} conflicts \
                         in a row ({last}); nothing of it was applied"
                    )
                    .into());
                }
                Outcome::Unknown => {
                    return Err(
                        "TRYAGAIN keel: the outcome of the transaction across nodes is \
                                unknown (a node's log stalled); it may have committed"
                            .into(),
                    );
                }
            }
        }
    }

    /// Cluster mode: `KEEL.RANGE` over the whole keyspace: the range on every node, read in
    /// one transaction across the nodes (one consistent cut), merged in key order.
    async fn range_across(&self, args: &[Bytes]) -> Result<Vec<(Vec<u8>, Vec<u8>)>, Fail> {
        let cluster = self.shared.cluster.as_ref().expect("cluster mode");
        let mut work = AcrossWork::new();
        for node in 0..cluster.map().nodes().len() {
            let i = self.work_for(&mut work, node);
            work[i]
                .1
                .commands
                .push(args.iter().map(|a| a.to_vec()).collect());
        }
        let replies = self
            .run_across(work)
            .await?
            .expect("nothing watched, nothing to change");
        let rev = args.iter().skip(3).any(|a| a.eq_ignore_ascii_case(b"rev"));
        let limit = args
            .iter()
            .skip(3)
            .position(|a| a.eq_ignore_ascii_case(b"limit"))
            .and_then(|at| args.get(3 + at + 1))
            .and_then(|n| crate::resp::string_to_i64(n))
            .map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX));
        let mut pairs = Vec::new();
        for reply in replies.iter().flatten() {
            pairs.extend(
                parse_pairs(reply).ok_or("ERR keel: a node's KEEL.RANGE reply is malformed")?,
            );
        }
        pairs.sort_unstable_by(|a, b| if rev { b.0.cmp(&a.0) } else { a.0.cmp(&b.0) });
        pairs.truncate(limit);
        if pairs.len() > data::REPLY_ITEMS_MAX {
            return Err(format!(
                "ERR keel: KEEL.RANGE returns at most {} pairs; use LIMIT",
                data::REPLY_ITEMS_MAX
            )
            .into());
        }
        Ok(pairs)
    }

    /// Cluster mode: `WATCH` with keys of other nodes, answered.
    async fn watch_command(&mut self, args: &[Bytes], output: &mut BytesMut) {
        let result = if self.multi.is_some() {
            Err("ERR WATCH inside MULTI is not allowed".into())
        } else {
            self.watch_across(&args[1..]).await
        };
        match result {
            Ok(()) => self.out(output).ok(),
            Err(Fail(text)) => self.out(output).error(&text),
        }
    }

    /// Cluster mode: `WATCH` of keys on other nodes. Each owner records what to check (in a
    /// read-only transaction across the nodes), and `EXEC` checks it there.
    async fn watch_across(&mut self, keys: &[Bytes]) -> Result<(), Fail> {
        let cluster = self.shared.cluster.as_ref().expect("cluster mode");
        let watched = self.watch.as_ref().map_or(0, |w| w.keys.len() / 2);
        if watched + keys.len() > WATCH_KEYS_MAX {
            return Err(format!("ERR keel: at most {WATCH_KEYS_MAX} keys may be watched").into());
        }
        let me = cluster.map().myself();
        let mut local = Vec::new();
        let mut work = AcrossWork::new();
        let mut nodes = Vec::new();
        for key in keys {
            let node = cluster.map().owner(keel_cluster::key_slot(key));
            if node == me {
                local.push(key.clone());
                continue;
            }
            let i = self.work_for(&mut work, node);
            if work[i].1.watch.is_empty() {
                nodes.push(node);
            }
            work[i].1.watch.push(key.to_vec());
        }
        let replies = self
            .run_across(work)
            .await?
            .expect("nothing watched, nothing to change");
        // Local keys (or none: the snapshot later reads see) as on a single node.
        self.watch_keys(&local)?;
        let watch = self.watch.as_mut().expect("just watched");
        for (node, mut replies) in nodes.into_iter().zip(replies) {
            let report: crate::xnode::WatchReport = replies
                .pop()
                .and_then(|r| postcard::from_bytes(&r).ok())
                .ok_or("ERR keel: a node answered WATCH with no report")?;
            match watch.remote.iter_mut().find(|(n, _)| *n == node) {
                Some((_, r)) => {
                    for (k, ts) in report.keys {
                        // A key watched earlier keeps the version recorded then.
                        if !r.keys.iter().any(|(known, _)| *known == k) {
                            r.keys.push((k, ts));
                        }
                    }
                    r.deadlines.extend(report.deadlines);
                }
                None => watch.remote.push((node, report)),
            }
        }
        Ok(())
    }

    /// Cluster mode, `EXEC` under a `WATCH` of other nodes' keys (or with commands for
    /// other nodes): one transaction across the nodes that checks every watched key where it
    /// lives before the commands run. Answers nil if one changed.
    async fn exec_watched_across(
        &mut self,
        multi: &Multi,
        watch: Watch,
        output: &mut BytesMut,
    ) -> Result<(), Fail> {
        let commands: Vec<&[Bytes]> = multi.queue.iter().map(|(_, a)| &a[..]).collect();
        let (mut work, place) = self.plan_across(&commands)?;
        self.check_watch_across(&mut work, &watch);
        // The WATCH snapshots stay open until the check ran, so that no deletion of a
        // watched local key is collected before it is seen.
        let result = self.run_across(work).await;
        drop(watch);
        let mut out = Out::new(output, self.proto);
        match result? {
            Some(replies) => {
                let replies = gather(replies, &place, self.proto);
                out.array(replies.len());
                for reply in replies {
                    out.buf.extend_from_slice(&reply);
                }
            }
            None => {
                self.shared.counters.watch_aborts.fetch_add(1, Relaxed);
                out.null_array();
            }
        }
        Ok(())
    }

    /// Adds to `work` the checks of `watch`, on the node where each watched key lives.
    fn check_watch_across(&self, work: &mut AcrossWork, watch: &Watch) {
        let cluster = self.shared.cluster.as_ref().expect("cluster mode");
        let me = cluster.map().myself();
        let i = self.work_for(work, me);
        work[i]
            .1
            .checks
            .extend(watch.keys.iter().map(|(k, ts)| (k.to_vec(), ts.0)));
        work[i].1.deadlines.extend(watch.deadlines.iter().copied());
        for (node, report) in &watch.remote {
            let i = self.work_for(work, *node);
            work[i].1.checks.extend(report.keys.iter().cloned());
            work[i].1.deadlines.extend(report.deadlines.iter().copied());
        }
    }

    /// Cluster mode, at `EXEC`: where the queued transaction runs. `None`: here.
    /// `Some(Ok(node))`: every key is on `node`. `Some(Err(()))`: keys on several nodes.
    fn exec_route(&self, multi: &Multi) -> Option<Result<usize, ()>> {
        let cluster = self.shared.cluster.as_ref()?;
        let mut at = None;
        for (cmd, args) in &multi.queue {
            let Some(spec) = table::lookup(&args[0]).filter(|s| s.cmd == *cmd) else {
                continue;
            };
            let node = match cluster.route(spec, args) {
                Route::Local => cluster.map().myself(),
                Route::Remote { node, .. } => node,
                Route::CrossSlot => return Some(Err(())),
            };
            if spec.first_key > 0 && at.replace(node).is_some_and(|n| n != node) {
                return Some(Err(()));
            }
        }
        match at {
            Some(node) if node != cluster.map().myself() => Some(Ok(node)),
            _ => None,
        }
    }

    fn flag_multi(&mut self) {
        if let Some(m) = &mut self.multi {
            m.dirty = true;
        }
    }

    fn queue(&mut self, spec: &'static Spec, args: Vec<Bytes>, output: &mut BytesMut) {
        let proto = self.proto;
        let multi = self.multi.as_mut().expect("called inside MULTI");
        let mut out = Out::new(output, proto);
        let queueable = data::is_data(spec.cmd)
            || matches!(
                spec.cmd,
                Cmd::Ping
                    | Cmd::Echo
                    | Cmd::Time
                    | Cmd::Role
                    | Cmd::Unwatch
                    | Cmd::Wait
                    | Cmd::Publish
                    | Cmd::Spublish
                    | Cmd::Pubsub
            );
        if !queueable {
            multi.dirty = true;
            out.error("ERR Command not allowed inside a transaction");
            return;
        }
        if spec.cmd == Cmd::Pubsub
            && let Err(Fail(text)) = pubsub::check_pubsub(&args)
        {
            multi.dirty = true;
            out.error(&text);
            return;
        }
        let bytes: usize = args.iter().map(Bytes::len).sum();
        if multi.queue.len() >= MULTI_QUEUE_MAX || multi.bytes + bytes > MULTI_QUEUE_BYTES_MAX {
            multi.dirty = true;
            out.error(&format!(
                "ERR keel: MULTI queue is full (at most {MULTI_QUEUE_MAX} commands and \
                 {MULTI_QUEUE_BYTES_MAX} bytes)"
            ));
            return;
        }
        multi.bytes += bytes;
        multi.queue.push((spec.cmd, args));
        out.simple("QUEUED");
    }

    /// Enters a command that took `elapsed` (with `more` others run with it) in the slow
    /// log, its passwords redacted as Redis redacts them (`AUTH`'s arguments, `HELLO`'s after
    /// `AUTH`); not `WAIT`, whose time is waiting.
    fn log_slow(&self, elapsed: Duration, args: &[Bytes], more: usize) {
        // Refused before it ran (unknown, or the wrong number of arguments): not logged,
        // as in Redis.
        let Some(spec) = table::lookup(&args[0]) else {
            return;
        };
        if !spec.arity_ok(args.len())
            || (!spec.subcommands.is_empty() && table::subcommand(spec, args).is_err())
        {
            return;
        }
        let redacted = || Bytes::from_static(b"(redacted)");
        let args: std::borrow::Cow<'_, [Bytes]> = match spec.cmd {
            Cmd::Wait => return,
            Cmd::Auth => std::iter::once(args[0].clone())
                .chain(args[1..].iter().map(|_| redacted()))
                .collect(),
            Cmd::Hello => {
                let mut args = args.to_vec();
                if let Some(at) = args.iter().position(|a| a.eq_ignore_ascii_case(b"auth")) {
                    for a in args.iter_mut().skip(at + 1).take(2) {
                        *a = redacted();
                    }
                }
                args.into()
            }
            _ => args.into(),
        };
        let name = self.info.name.lock().clone();
        self.shared
            .slowlog
            .record(elapsed, &args, more, self.info.addr.to_string(), name);
    }

    /// `CLUSTER SETSLOT <slot> IMPORTING|MIGRATING|NODE <node-id>` and `STABLE`, as
    /// `redis-cli --cluster reshard` and `rebalance` send them to move a slot: `IMPORTING` to
    /// the destination, `MIGRATING` to the source, `GETKEYSINSLOT` and `MIGRATE` at the
    /// source until no key is left, then `NODE` to every node. keel moves a slot with its
    /// keys in one transaction (`KEEL.MOVESLOTS`), to the partition made for the node named:
    /// `MIGRATING` moves it at once (and this connection's `GETKEYSINSLOT` of it then finds
    /// nothing left to migrate), `NODE` moves it unless it is there already, `IMPORTING` and
    /// `STABLE` change nothing, since no slot is ever half moved.
    async fn setslot(&mut self, args: &[Bytes]) -> Result<(), Fail> {
        let slot = crate::resp::string_to_i64(&args[2])
            .filter(|s| (0..i64::from(keel_cluster::SLOTS)).contains(s))
            .ok_or("ERR Invalid or out of range slot")? as u16;
        let action = args[3].to_ascii_lowercase();
        let bad_action =
            "ERR Invalid CLUSTER SETSLOT action or number of arguments. Try CLUSTER HELP";
        if action == b"stable" {
            if args.len() != 4 {
                return Err(bad_action.into());
            }
            self.migrated.retain(|&s| s != slot);
            return Ok(());
        }
        if !matches!(&action[..], b"importing" | b"migrating" | b"node") || args.len() != 5 {
            return Err(bad_action.into());
        }
        let cluster = self.shared.cluster.as_ref().expect("cluster mode");
        let known = cluster
            .map()
            .nodes()
            .iter()
            .position(|n| n.id.as_str().as_bytes() == &args[4][..])
            .is_some_and(|n| !self.shared.replication.get().is_some_and(|r| r.removed(n)));
        if !known {
            return Err(format!(
                "ERR I don't know about node {}",
                String::from_utf8_lossy(&args[4])
            )
            .into());
        }
        if action == b"importing" {
            return Ok(());
        }
        let request = [
            Bytes::from_static(b"KEEL.MOVESLOTS"),
            args[4].clone(),
            Bytes::from(slot.to_string()),
        ];
        self.move_slots(&request).await?;
        if action == b"migrating" {
            self.migrated.push(slot);
        } else {
            self.migrated.retain(|&s| s != slot);
        }
        Ok(())
    }

    /// `CLUSTER COUNTKEYSINSLOT slot` and `CLUSTER GETKEYSINSLOT slot count`: the keys of
    /// the slot that this node holds, as a Redis Cluster node answers for its own slots and a
    /// replica for its copy: the partition that owns the slot, if this node keeps a copy of
    /// it (its own, or a replica's), else none.
    async fn keys_in_slot(&self, args: &[Bytes], out: &mut Out<'_>) -> Result<(), Fail> {
        let get = args[1].eq_ignore_ascii_case(b"getkeysinslot");
        let slot = crate::resp::string_to_i64(&args[2])
            .ok_or("ERR value is not an integer or out of range")?;
        let limit = match args.get(3) {
            Some(a) => crate::resp::string_to_i64(a)
                .ok_or("ERR value is not an integer or out of range")?,
            None => 0,
        };
        if !(0..i64::from(keel_cluster::SLOTS)).contains(&slot) || limit < 0 {
            return Err(if get {
                "ERR Invalid slot or number of keys"
            } else {
                "ERR Invalid slot"
            }
            .into());
        }
        let slot = slot as u16;
        let cluster = self.shared.cluster.as_ref().expect("cluster mode");
        let db: Option<keel::Db> = match self.shared.replication.get() {
            _ if self.migrated.contains(&slot) => None,
            Some(rep) => rep
                .part(rep.owner(&cluster.map(), slot))
                .map(|part| part.db.clone()),
            None => (cluster.map().owner(keel_cluster::Slot(slot)) == cluster.map().myself())
                .then(|| self.shared.db.clone()),
        };
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        let (count, keys) = match db {
            Some(db) => tokio::task::spawn_blocking(move || {
                crate::keyspace::keys_in_slot(&db, slot, if get { limit } else { 0 })
            })
            .await
            .map_err(|_| Fail::from("ERR keel: the scan of the slot panicked"))?
            .map_err(|e| Fail::from(format!("ERR keel: {e}")))?,
            None => (0, Vec::new()),
        };
        if get {
            out.array(keys.len());
            for k in &keys {
                out.bulk(k);
            }
        } else {
            out.int(i64::try_from(count).unwrap_or(i64::MAX));
        }
        Ok(())
    }

    /// `WAIT numreplicas timeout`: how many replicas hold every write acknowledged to this
    /// connection. Without replication there are none: 0 at once (Redis would wait out the
    /// timeout first, or forever with 0). On a replicated node, the fewest voters besides
    /// its leader holding all it applied, of the partitions the connection wrote to (its
    /// node's own if none; [`crate::replica::Replication::caught_up`]), looked at until `want` of them do or `timeout_ms` (0: no limit) passes;
    /// at once when `want` exceeds the replicas a partition has, which no wait would change.
    async fn wait_replicas(&self, want: i64, timeout_ms: u64) -> Result<usize, Fail> {
        let Some(rep) = self.shared.replication.get() else {
            return Ok(0);
        };
        let give_up = (timeout_ms > 0)
            .then(|| tokio::time::Instant::now() + Duration::from_millis(timeout_ms));
        let most = rep.r.saturating_sub(1) as i64;
        // With no write yet, its node's own partition's replicas.
        let mut parts: Vec<usize> = self.wrote.lock().iter().copied().collect();
        if parts.is_empty() {
            parts.push(rep.me);
        }
        loop {
            let reached = rep.caught_up(&self.shared, &parts).await;
            if reached as i64 >= want
                || want > most
                || give_up.is_some_and(|t| tokio::time::Instant::now() >= t)
            {
                return Ok(reached);
            }
            tokio::select! {
                () = tokio::time::sleep(WAIT_LOOK_EVERY) => {}
                () = self.info.kill.cancelled() => {
                    return Err("ERR keel: the connection was killed".into());
                }
                () = self.shared.shutdown.cancelled() => return Ok(reached),
            }
        }
    }

    async fn connection_command(
        &mut self,
        spec: &'static Spec,
        args: &[Bytes],
        output: &mut BytesMut,
    ) -> Result<Next, Fail> {
        let cmd = spec.cmd;
        if data::is_data(cmd) {
            if self.data_command(cmd, args, output).await {
                self.blocked = Some((cmd, args.to_vec(), BlockedIn::Here));
                return Ok(Next::Block);
            }
            return Ok(Next::Continue);
        }
        let mut out = self.out(output);
        match cmd {
            // PING's arity is -1, but it takes one message at most.
            Cmd::Ping if args.len() > 2 => return Err(PING_ARITY.into()),
            Cmd::Ping if self.proto == Proto::Resp2 && self.subscribed() => {
                pubsub::ping(args, &mut out);
            }
            Cmd::Subscribe | Cmd::Psubscribe | Cmd::Ssubscribe => {
                let kind = kind_of(cmd);
                let subs = self
                    .subs
                    .get_or_insert_with(|| Box::new(Subs::new(&self.info)));
                subs.subscribe(&self.shared.pubsub, &self.info, kind, &args[1..], &mut out);
            }
            Cmd::Unsubscribe | Cmd::Punsubscribe | Cmd::Sunsubscribe => {
                let kind = kind_of(cmd);
                let subs = self
                    .subs
                    .get_or_insert_with(|| Box::new(Subs::new(&self.info)));
                subs.unsubscribe(&self.shared.pubsub, &self.info, kind, &args[1..], &mut out);
            }
            Cmd::Publish | Cmd::Spublish => {
                let receivers =
                    self.shared
                        .pubsub
                        .publish(cmd == Cmd::Spublish, &args[1], &args[2]);
                relay(&self.shared, cmd == Cmd::Spublish, &args[1], &args[2]);
                // A subscriber publishing to itself gets the message before the count, as
                // from Redis.
                if let Some(subs) = &self.subs {
                    subs.mailbox.deliver(&mut out, usize::MAX);
                }
                out.int(receivers as i64);
            }
            Cmd::Pubsub => pubsub::pubsub(&self.shared.pubsub, args, &mut out)?,
            Cmd::Ping => match args.get(1) {
                Some(msg) => out.bulk(msg),
                None => out.simple("PONG"),
            },
            Cmd::Echo => out.bulk(&args[1]),
            Cmd::Cluster
                if self.shared.cluster.is_some() && args[1].eq_ignore_ascii_case(b"setslot") =>
            {
                table::subcommand(spec, args).map_err(Fail::from)?;
                self.setslot(args).await?;
                out.ok();
            }
            Cmd::Cluster
                if self.shared.cluster.is_some()
                    && (args[1].eq_ignore_ascii_case(b"countkeysinslot")
                        || args[1].eq_ignore_ascii_case(b"getkeysinslot")) =>
            {
                table::subcommand(spec, args).map_err(Fail::from)?;
                self.keys_in_slot(args, &mut out).await?;
            }
            Cmd::Cluster => {
                // Each partition's nodes, the one serving writes first: in a replicated
                // cluster its leader (as far as this node knows) and then its other replicas.
                let replication = self.shared.replication.get();
                let serving = |p: usize| match replication {
                    Some(rep) => rep.serving(p),
                    None => vec![p],
                };
                let moved = match (replication, self.shared.cluster.as_ref()) {
                    (Some(rep), Some(cluster)) => rep.routes(&cluster.map()),
                    _ => Vec::new(),
                };
                let unreachable = |n: usize| {
                    self.shared.cluster.as_ref().is_some_and(|cluster| {
                        cluster.rpc.of(n).unreachable_for(cluster.map().timeout())
                    })
                };
                let topology = cluster::Topology {
                    serving: &serving,
                    gone: &|n| replication.is_some_and(|rep| rep.removed(n)),
                    unreachable: &unreachable,
                    moved: &moved,
                };
                cluster::command(
                    self.shared.cluster.as_ref(),
                    args,
                    &mut out,
                    &mut self.aware,
                    &topology,
                )?;
            }
            Cmd::KeelMoveslots => {
                let moved = self.move_slots(args).await?;
                out.int(moved as i64);
            }
            Cmd::KeelLearnslots => {
                let Some(rep) = self.shared.replication.get() else {
                    return Err("ERR keel: KEEL.LEARNSLOTS is for a replicated cluster \
                                (--replicas 2 or more)"
                        .into());
                };
                let answered = rep.learn_slots(&self.shared).await;
                out.int(answered as i64);
            }
            Cmd::KeelJoin | Cmd::KeelRemovenode => {
                let Some(rep) = self.shared.replication.get() else {
                    return Err("ERR keel: nodes join and leave a replicated cluster \
                                (--replicas 2 or more); a cluster of single copies has a fixed \
                                config"
                        .into());
                };
                let id = String::from_utf8_lossy(&args[1]).into_owned();
                let work = async {
                    if cmd == Cmd::KeelJoin {
                        let addr: std::net::SocketAddr = std::str::from_utf8(&args[2])
                            .ok()
                            .and_then(|a| a.parse().ok())
                            .ok_or("ERR keel: KEEL.JOIN needs the node's address as IP:PORT")?;
                        let view = rep.join(&self.shared, &id, addr).await?;
                        out.bulk(&postcard::to_stdvec(&*view).expect("a view encodes"));
                    } else {
                        let moved = rep.remove(&self.shared, &id).await?;
                        out.int(moved as i64);
                    }
                    Ok::<(), String>(())
                };
                tokio::select! {
                    r = work => r.map_err(|text| Fail(text.into()))?,
                    () = self.info.kill.cancelled() => {
                        return Err("ERR keel: the connection was killed".into());
                    }
                }
            }
            Cmd::KeelOnce => self.keel_once(args, output).await?,
            Cmd::KeelAwaitpush => {
                if self.shared.cluster.is_none() || self.shared.replication.get().is_some() {
                    return Err(AWAIT_PUSH_ONLY.into());
                }
                parse_await_push(args)?;
                self.blocked = Some((cmd, args.to_vec(), BlockedIn::Watcher));
                return Ok(Next::Block);
            }
            Cmd::KeelPublish => {
                let shard = match &args[1][..] {
                    b"0" => false,
                    b"1" => true,
                    _ => return Err(Fail::from("ERR keel: KEEL.PUBLISH takes 0 or 1 first")),
                };
                let receivers = self.shared.pubsub.publish(shard, &args[2], &args[3]);
                if let Some(subs) = &self.subs {
                    subs.mailbox.deliver(&mut out, usize::MAX);
                }
                out.int(receivers as i64);
            }
            Cmd::KeelRaft => {
                let answer = crate::replica::serve_rpc(&self.shared, args)
                    .await
                    .map_err(|text| Fail(text.into()))?;
                out.bulk(&answer);
            }
            Cmd::Asking | Cmd::Readonly | Cmd::Readwrite => {
                if self.shared.cluster.is_none() {
                    return Err(cluster::DISABLED.into());
                }
                match spec.cmd {
                    Cmd::Readonly => self.readonly = true,
                    Cmd::Readwrite => self.readonly = false,
                    _ => {}
                }
                out.simple("OK");
            }
            Cmd::Time => {
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or(Duration::ZERO);
                out.array(2);
                out.bulk(now.as_secs().to_string().as_bytes());
                out.bulk(now.subsec_micros().to_string().as_bytes());
            }
            Cmd::Role => role(&mut out),
            Cmd::Quit => {
                out.ok();
                return Ok(Next::Close);
            }
            Cmd::Reset => {
                if let Some(mut subs) = self.subs.take() {
                    subs.leave(&self.shared.pubsub, &self.info);
                    // What arrived before the subscriptions ended still goes out, first.
                    subs.mailbox.deliver(&mut out, usize::MAX);
                }
                self.multi = None;
                self.watch = None;
                self.rwatch.clear();
                self.readonly = false;
                self.set_proto(Proto::Resp2);
                *self.info.name.lock() = String::new();
                self.authenticated = self.shared.requirepass.read().is_none();
                self.out(output).simple("RESET");
            }
            Cmd::Select => {
                // Redis Cluster refuses any database but 0, once the index is a C int.
                let index = resp::string_to_i64(&args[1]).filter(|n| i32::try_from(*n).is_ok());
                if self.shared.cluster.is_some() && index.is_some_and(|n| n != 0) {
                    return Err("ERR SELECT is not allowed in cluster mode".into());
                }
                data::check_db_index(&args[1])?;
                out.ok();
            }
            Cmd::Auth => {
                let (user, pass) = match args.len() {
                    2 => (&b"default"[..], &args[1]),
                    3 => (&args[1][..], &args[2]),
                    _ => return Err(SYNTAX.into()),
                };
                // Without a password the default user has none (`nopass`): `AUTH <password>`
                // is an error, but `AUTH default <anything>` succeeds, as in Redis.
                if args.len() == 2 && self.shared.requirepass.read().is_none() {
                    return Err(
                        "ERR AUTH <password> called without any password configured for \
                                the default user. Are you sure your configuration is correct?"
                            .into(),
                    );
                }
                self.authenticate(user, pass)?;
                self.out(output).ok();
            }
            Cmd::Hello => self.hello(args, output)?,
            Cmd::Client => return self.client(args, output),
            Cmd::Command => crate::info::command(args, &mut out)?,
            Cmd::Config => crate::info::config(&self.shared, args, &mut out)?,
            Cmd::Info => {
                let text = crate::info::info(&self.shared, &args[1..]);
                out.verbatim(&text);
            }
            Cmd::Shutdown => {
                if args
                    .get(1)
                    .is_some_and(|a| a.eq_ignore_ascii_case(b"abort"))
                {
                    return Err("ERR No shutdown in progress.".into());
                }
                tracing::info!(id = self.info.id, "SHUTDOWN requested by a client");
                self.shared.shutdown.cancel();
                return Ok(Next::Close);
            }
            Cmd::Save => {
                if self.shared.saving.swap(true, Relaxed) {
                    return Err(SAVE_IN_PROGRESS.into());
                }
                let shared = Arc::clone(&self.shared);
                let saved = save_any(shared).await;
                self.shared.saving.store(false, Relaxed);
                saved?;
                out.ok();
            }
            Cmd::Bgsave => {
                let schedule = match args.get(1) {
                    None => false,
                    Some(a) if args.len() == 2 && a.eq_ignore_ascii_case(b"schedule") => true,
                    Some(_) => return Err("ERR syntax error".into()),
                };
                if !can_save(&self.shared) {
                    return Err(NOTHING_TO_SAVE.into());
                }
                let busy = self.shared.saving.swap(true, Relaxed);
                if busy && !schedule {
                    return Err(SAVE_IN_PROGRESS.into());
                }
                let shared = Arc::clone(&self.shared);
                tokio::spawn(async move {
                    // Scheduled: runs once the save under way is done.
                    while busy && shared.saving.swap(true, Relaxed) {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    let saved = save_any(Arc::clone(&shared)).await;
                    shared.saving.store(false, Relaxed);
                    match saved {
                        Ok(()) => tracing::info!("background saving terminated with success"),
                        Err(Fail(text)) => tracing::error!("background saving failed: {text}"),
                    }
                });
                out.simple(if busy {
                    "Background saving scheduled"
                } else {
                    "Background saving started"
                });
            }
            Cmd::Slowlog => {
                let sub = table::subcommand(spec, args).map_err(Fail::from)?;
                crate::slowlog::command(&self.shared.slowlog, sub, args, &mut out)?;
            }
            Cmd::Wait => {
                let (want, timeout_ms) = parse_wait(args)?;
                let reached = self.wait_replicas(want, timeout_ms).await?;
                self.out(output).int(reached as i64);
            }
            Cmd::Lastsave => {
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or(Duration::ZERO);
                // A replicated node's saves are its partitions' snapshots.
                let replicated = self.shared.replication.get().map(|rep| {
                    rep.last_save()
                        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                });
                // Never saved: the time the server started, as Redis answers after a start.
                let at = match replicated {
                    Some(Some(at)) => at,
                    Some(None) => now.saturating_sub(self.shared.started.elapsed()),
                    None => now.saturating_sub(
                        self.shared
                            .db
                            .stats()
                            .checkpoint_age
                            .unwrap_or_else(|| self.shared.started.elapsed()),
                    ),
                };
                out.int(at.as_secs() as i64);
            }
            Cmd::Multi => {
                if self.multi.is_some() {
                    return Err("ERR MULTI calls can not be nested".into());
                }
                self.multi = Some(Multi {
                    queue: Vec::new(),
                    bytes: 0,
                    dirty: false,
                });
                out.ok();
            }
            Cmd::Discard => {
                if self.multi.take().is_none() {
                    return Err("ERR DISCARD without MULTI".into());
                }
                self.watch = None;
                self.rwatch.clear();
                self.out(output).ok();
            }
            Cmd::Watch => {
                if self.multi.is_some() {
                    return Err("ERR WATCH inside MULTI is not allowed".into());
                }
                self.watch_keys(&args[1..])?;
                self.out(output).ok();
            }
            Cmd::Unwatch => {
                self.watch = None;
                self.rwatch.clear();
                out.ok();
            }
            Cmd::Exec => self.exec(output).await?,
            other => panic!("{other:?} has no handler"),
        }
        Ok(Next::Continue)
    }

    fn set_proto(&mut self, proto: Proto) {
        self.proto = proto;
        self.info.resp.store(proto.version() as u8, Relaxed);
    }

    fn authenticate(&mut self, user: &[u8], pass: &[u8]) -> Result<(), Fail> {
        let expected = self.shared.requirepass.read().clone();
        let ok = user == b"default"
            && match &expected {
                Some(p) => constant_time_eq(p.as_bytes(), pass),
                None => true,
            };
        if !ok {
            tracing::info!(id = self.info.id, addr = %self.info.addr, "authentication failed");
            return Err(WRONGPASS.into());
        }
        self.authenticated = true;
        Ok(())
    }

    fn hello(&mut self, args: &[Bytes], output: &mut BytesMut) -> Result<(), Fail> {
        let mut proto = self.proto;
        if let Some(v) = args.get(1) {
            proto = match resp::string_to_i64(v) {
                Some(2) => Proto::Resp2,
                Some(3) => Proto::Resp3,
                Some(_) => return Err("NOPROTO unsupported protocol version".into()),
                None => {
                    return Err("ERR Protocol version is not an integer or out of range".into());
                }
            };
        }
        let mut auth = None;
        let mut name = None;
        let mut i = 2;
        while i < args.len() {
            if args[i].eq_ignore_ascii_case(b"auth") && i + 2 < args.len() {
                auth = Some((&args[i + 1], &args[i + 2]));
                i += 3;
            } else if args[i].eq_ignore_ascii_case(b"setname") && i + 1 < args.len() {
                name = Some(&args[i + 1]);
                i += 2;
            } else {
                return Err(format!(
                    "ERR Syntax error in HELLO option '{}'",
                    String::from_utf8_lossy(&args[i])
                )
                .into());
            }
        }
        if let Some((user, pass)) = auth {
            self.authenticate(user, pass)?;
        }
        if !self.authenticated {
            return Err(
                "NOAUTH HELLO must be called with the client already authenticated, \
                        otherwise the HELLO <proto> AUTH <user> <pass> option can be used to \
                        authenticate the client and select the RESP protocol version at the same \
                        time"
                    .into(),
            );
        }
        if let Some(name) = name {
            self.set_name(name)?;
        }
        self.set_proto(proto);
        let mut out = self.out(output);
        out.map(7);
        out.bulk(b"server");
        out.bulk(b"keel");
        out.bulk(b"version");
        out.bulk(crate::REDIS_VERSION.as_bytes());
        out.bulk(b"proto");
        out.int(proto.version());
        out.bulk(b"id");
        out.int(self.info.id as i64);
        out.bulk(b"mode");
        out.bulk(if self.shared.cluster.is_some() {
            &b"cluster"[..]
        } else {
            b"standalone"
        });
        out.bulk(b"role");
        out.bulk(b"master");
        out.bulk(b"modules");
        out.array(0);
        Ok(())
    }

    fn set_name(&self, name: &[u8]) -> Result<(), Fail> {
        if name.iter().any(|&c| !(b'!'..=b'~').contains(&c)) {
            return Err(
                "ERR Client names cannot contain spaces, newlines or special characters.".into(),
            );
        }
        *self.info.name.lock() = String::from_utf8_lossy(name).into_owned();
        Ok(())
    }

    fn client(&mut self, args: &[Bytes], output: &mut BytesMut) -> Result<Next, Fail> {
        let spec = table::lookup(b"client").expect("client is in the table");
        let sub = table::subcommand(spec, args)
            .map_err(Fail::from)?
            .as_bytes();
        let mut out = Out::new(output, self.proto);
        match sub {
            b"id" => out.int(self.info.id as i64),
            b"setname" => {
                self.set_name(&args[2])?;
                out.ok();
            }
            b"getname" => {
                let name = self.info.name.lock().clone();
                out.bulk_or_null(Some(name.as_bytes()).filter(|n| !n.is_empty()));
            }
            b"setinfo" => {
                let value = String::from_utf8_lossy(&args[3]).into_owned();
                if value.contains(|c: char| c == ' ' || c == '\n' || !c.is_ascii_graphic()) {
                    return Err(format!(
                        "ERR {} cannot contain spaces, newlines or special characters.",
                        String::from_utf8_lossy(&args[2])
                    )
                    .into());
                }
                let mut lib = self.info.lib.lock();
                if args[2].eq_ignore_ascii_case(b"lib-name") {
                    lib.0 = value;
                } else if args[2].eq_ignore_ascii_case(b"lib-ver") {
                    lib.1 = value;
                } else {
                    return Err(format!(
                        "ERR Unrecognized option '{}'",
                        String::from_utf8_lossy(&args[2])
                    )
                    .into());
                }
                drop(lib);
                out.ok();
            }
            b"info" => {
                let line = crate::info::client_line(&self.shared, &self.info);
                out.verbatim(&line);
            }
            b"list" => {
                let clients: Vec<_> = {
                    let mut c: Vec<_> = self.shared.clients.lock().values().cloned().collect();
                    c.sort_by_key(|c| c.id);
                    c
                };
                let mut ids: Option<Vec<u64>> = None;
                let mut ty = None;
                let mut i = 2;
                while i < args.len() {
                    if args[i].eq_ignore_ascii_case(b"id") {
                        let mut list = Vec::new();
                        for a in &args[i + 1..] {
                            match resp::string_to_i64(a).filter(|&n| n > 0) {
                                Some(n) => list.push(n as u64),
                                None => return Err("ERR Invalid client ID".into()),
                            }
                        }
                        ids = Some(list);
                        break;
                    } else if args[i].eq_ignore_ascii_case(b"type") && i + 1 < args.len() {
                        ty = Some(client_type(&args[i + 1])?);
                        i += 2;
                    } else {
                        return Err(SYNTAX.into());
                    }
                }
                let mut text = String::new();
                for c in &clients {
                    if ids.as_ref().is_none_or(|ids| ids.contains(&c.id))
                        && ty.is_none_or(|t| t == type_of(c))
                    {
                        text.push_str(&crate::info::client_line(&self.shared, c));
                    }
                }
                out.verbatim(&text);
            }
            b"kill" => return self.client_kill(args, output),
            b"unblock" => {
                if args.len() > 4 {
                    return Err("ERR unknown subcommand or wrong number of arguments for \
                                'unblock'. Try CLIENT HELP."
                        .into());
                }
                let id = resp::string_to_i64(&args[2]).ok_or(NOT_INTEGER)?;
                let how = match args.get(3) {
                    None => crate::blocking::Unblock::Timeout,
                    Some(a) if a.eq_ignore_ascii_case(b"timeout") => {
                        crate::blocking::Unblock::Timeout
                    }
                    Some(a) if a.eq_ignore_ascii_case(b"error") => crate::blocking::Unblock::Error,
                    Some(_) => {
                        return Err("ERR CLIENT UNBLOCK reason should be TIMEOUT or ERROR".into());
                    }
                };
                let unblocked =
                    u64::try_from(id).is_ok_and(|id| self.shared.blocked.unblock(id, how));
                out.int(i64::from(unblocked));
            }
            _ => unreachable!("subcommands are listed in the table"),
        }
        Ok(Next::Continue)
    }

    fn client_kill(&mut self, args: &[Bytes], output: &mut BytesMut) -> Result<Next, Fail> {
        let clients: Vec<_> = self.shared.clients.lock().values().cloned().collect();
        if args.len() == 3 {
            // Old form: CLIENT KILL addr:port.
            let addr = String::from_utf8_lossy(&args[2]);
            let target = clients.iter().find(|c| c.addr.to_string() == addr);
            let Some(target) = target else {
                return Err("ERR No such client".into());
            };
            target.kill.cancel();
            self.out(output).ok();
            return Ok(Next::Continue);
        }
        let (mut id, mut addr, mut laddr, mut skipme) = (None, None, None, true);
        let mut ty = None;
        let mut i = 2;
        while i + 1 < args.len() {
            let value = &args[i + 1];
            let key = args[i].to_ascii_lowercase();
            match &key[..] {
                b"id" => {
                    id = Some(
                        resp::string_to_i64(value)
                            .filter(|&n| n > 0)
                            .ok_or("ERR client-id should be greater than 0")?
                            as u64,
                    )
                }
                b"addr" => addr = Some(String::from_utf8_lossy(value).into_owned()),
                b"laddr" => laddr = Some(String::from_utf8_lossy(value).into_owned()),
                b"skipme" => {
                    skipme = if value.eq_ignore_ascii_case(b"yes") {
                        true
                    } else if value.eq_ignore_ascii_case(b"no") {
                        false
                    } else {
                        return Err(SYNTAX.into());
                    }
                }
                b"type" => ty = Some(client_type(value)?),
                // Every keel client is the default user.
                b"user" if value[..] == *b"default" => {}
                b"user" => {
                    return Err(format!("ERR No such user '{}'", shorten(value)).into());
                }
                _ => return Err(SYNTAX.into()),
            }
            i += 2;
        }
        if i != args.len() {
            return Err(SYNTAX.into());
        }
        let mut killed = 0;
        let mut me = false;
        for c in &clients {
            let hit = id.is_none_or(|id| c.id == id)
                && addr.as_ref().is_none_or(|a| c.addr.to_string() == *a)
                && laddr.as_ref().is_none_or(|a| c.laddr.to_string() == *a)
                && ty.is_none_or(|t| t == type_of(c))
                && !(skipme && c.id == self.info.id);
            if hit {
                c.kill.cancel();
                killed += 1;
                me |= c.id == self.info.id;
            }
        }
        self.out(output).int(killed);
        Ok(if me { Next::Close } else { Next::Continue })
    }

    fn watch_keys(&mut self, keys: &[Bytes]) -> Result<(), Fail> {
        // Two or more engine keys per user key: the plain key, the meta record and a
        // collection's size record and fields (see `keyspace`).
        let watched = self.watch.as_ref().map_or(0, |w| w.keys.len() / 2);
        if watched + keys.len() > WATCH_KEYS_MAX {
            return Err(format!("ERR keel: at most {WATCH_KEYS_MAX} keys may be watched").into());
        }
        // A fresh snapshot: what the keys watched now hold now, and what later reads see (a
        // key watched earlier keeps the version recorded then).
        let mut txn = self.shared.db.begin().map_err(begin_error)?;
        let (engine_keys, deadlines) = watch_targets(&mut txn, keys)?;
        // Only once every key is checked: a failed WATCH leaves the earlier watches as they were.
        let (mut recorded, first, mut recorded_deadlines, remote) = match self.watch.take() {
            Some(w) => (
                w.keys,
                Some(w.first.unwrap_or(w.txn)),
                w.deadlines,
                w.remote,
            ),
            None => (Vec::new(), None, Vec::new(), Vec::new()),
        };
        for key in engine_keys {
            if !recorded.iter().any(|(k, _)| *k == key) {
                recorded.push((key, txn.read_ts()));
            }
        }
        recorded_deadlines.extend(deadlines);
        self.watch = Some(Watch {
            txn,
            first,
            keys: recorded,
            deadlines: recorded_deadlines,
            remote,
        });
        Ok(())
    }

    /// A data command outside `MULTI`: its own transaction (a snapshot when it only reads),
    /// retried on conflict. `true` (and nothing written) when a blocking pop found nothing to
    /// pop.
    async fn data_command(&mut self, cmd: Cmd, args: &[Bytes], output: &mut BytesMut) -> bool {
        let shared = &*self.shared;
        let ctx = ctx(shared);
        let proto = self.proto;
        let mark = output.len();
        let mut out = Out::new(output, proto);
        if data::is_read_only(cmd) {
            let snapshot = match self.watch {
                Some(_) => None,
                None => Some(self.shared.db.snapshot()),
            };
            // A snapshot below a transaction prepared across nodes, which may be decided
            // already: the command runs as a transaction (below), whose commit checks that
            // what it read is still the newest (strict serializability across nodes).
            let below = matches!(&snapshot, Some(Ok(snap)) if snap.below_pending());
            // Between WATCH and EXEC reads see the WATCH snapshot.
            let result = match (&mut self.watch, snapshot) {
                _ if below => Ok(false),
                (Some(w), _) => {
                    data::run(cmd, args, &mut View::Txn(&mut w.txn), &ctx, &mut out).map(|()| true)
                }
                (None, Some(Ok(snap))) => {
                    data::run(cmd, args, &mut View::Snap(&snap), &ctx, &mut out).map(|()| true)
                }
                (None, Some(Err(e))) => Err(begin_error(e)),
                (None, None) => unreachable!("a snapshot when nothing is watched"),
            };
            match result {
                Ok(true) => return false,
                Ok(false) => {}
                // The snapshot met a key past its deadline, which only a write may remove:
                // run the command as a read-write transaction, which deletes it.
                Err(_) if ctx.clock.rerun.load(Relaxed) => out.buf.truncate(mark),
                Err(Fail(text)) => {
                    out.buf.truncate(mark);
                    out.error(&text);
                    return false;
                }
            }
        }
        let mut would_block = false;
        let mut attempt = 1;
        let may_wait = self.may_wait([cmd].into_iter());
        let mut rejoin = false;
        // A hot key's commands queue for its lock (`hot`); a conflict heats the keys and the
        // retries hold their locks.
        let mut held = self.hot_locks(data::keys(cmd, args)).await;
        loop {
            let mut more = false;
            let prepare = || {
                out.forget_tracked();
                ctx.clock.reset();
                let mut txn = match shared.begin_writer([cmd].into_iter(), &self.installed_read) {
                    Ok(t) => t,
                    Err(e) => {
                        out.error(&begin_error(e).0);
                        return Err(());
                    }
                };
                let result = if matches!(cmd, Cmd::Flushdb | Cmd::Flushall) {
                    // Outside MULTI a flush may take several transactions.
                    data::check_flush_args(args)
                        .and_then(|()| data::flush_batch(&mut txn).map(|m| more = m))
                } else if crate::lists::is_blocking(cmd) {
                    crate::lists::run_blocking(cmd, args, &mut txn, &ctx, &mut out).and_then(
                        |served| {
                            if served {
                                Ok(())
                            } else {
                                Err(crate::lists::WOULD_BLOCK.into())
                            }
                        },
                    )
                } else {
                    data::run(cmd, args, &mut View::Txn(&mut txn), &ctx, &mut out)
                };
                match result {
                    Ok(()) => Ok(txn),
                    Err(Fail(text)) if text == crate::lists::WOULD_BLOCK => {
                        out.buf.truncate(mark);
                        would_block = true;
                        Err(())
                    }
                    Err(Fail(text)) => {
                        out.buf.truncate(mark);
                        out.error(&text);
                        Err(())
                    }
                }
            };
            let Ok(committed) = self.attempt(rejoin, may_wait, &mut held, prepare).await else {
                return would_block;
            };
            rejoin = false;
            match committed {
                Ok(Ok(_)) if more => continue,
                Ok(Ok(committed)) => {
                    out.fill(&committed);
                    if matches!(cmd, Cmd::Flushdb | Cmd::Flushall) {
                        out.ok();
                    }
                    shared.blocked.committed(cmd, args);
                    return false;
                }
                Ok(Err(conflict)) => {
                    out.buf.truncate(mark);
                    ctx.contended.set(&conflict);
                    if attempt >= CONFLICT_ATTEMPTS_MAX {
                        out.error(&format!(
                            "ERR keel: gave up after {attempt} conflicting attempts; last: {conflict}"
                        ));
                        return false;
                    }
                    self.shared.counters.exec_retries.fetch_add(1, Relaxed);
                    if hot::heats(attempt, &conflict) && held.is_empty() {
                        held = self.heat_and_lock(|| data::keys(cmd, args)).await;
                    }
                    rejoin = self.wait_to_retry(&conflict, attempt).await;
                    attempt += 1;
                }
                Err(keel::CommitError::Apply(e)) => {
                    out.buf.truncate(mark);
                    out.error(&data::apply_error(cmd, &e).0);
                    return false;
                }
                Err(e) => {
                    out.buf.truncate(mark);
                    out.error(&format!("ERR keel: {e}"));
                    return false;
                }
            }
        }
    }

    /// Waits in a blocking pop ([`Next::Block`]) until it pops, times out, is unblocked or
    /// killed, or the client goes; `false` when the connection should end. Replies written
    /// before the pop go out first. The socket is read meanwhile (pipelined requests wait in
    /// `input`), so that a client that disconnects is noticed.
    async fn block(
        &mut self,
        stream: &mut TcpStream,
        input: &mut BytesMut,
        output: &mut BytesMut,
    ) -> std::io::Result<bool> {
        let (cmd, args, where_) = self.blocked.take().expect("set with Next::Block");
        match where_ {
            BlockedIn::Here => {}
            BlockedIn::Partition => {
                return self
                    .blocking_replicated((cmd, args), stream, input, output)
                    .await;
            }
            BlockedIn::Across => {
                return self.block_across((cmd, args), stream, input, output).await;
            }
            BlockedIn::Watcher => return self.await_push(&args, stream, input, output).await,
        }
        let timeout = crate::lists::timeout(crate::lists::timeout_arg_of(cmd, &args))
            .expect("checked before blocking");
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        self.flush(stream, output).await?;
        let shared = self.shared.clone();
        let (keys, kind) = (
            crate::lists::blocking_keys(cmd, &args),
            crate::blocking::Kind::of(cmd),
        );
        let guard = shared.blocked.block(self.info.id, keys, kind);
        let mut woken = false;
        loop {
            // Registered: a push committed from now on wakes this client, and this attempt
            // sees any committed before. Woken, it tries again only if one of its keys holds
            // what it waits for, as Redis serves a blocked client only from a key of its
            // type: one woken by a key written whole (`COPY`, `RENAME`), which may hold the
            // other type, waits on rather than answering `WRONGTYPE`.
            if (!woken || holds(shared.db, keys, kind))
                && !self.data_command(cmd, &args, output).await
            {
                return Ok(true);
            }
            woken = true;
            if let Some(keep) = self
                .wait_woken(&guard, deadline, stream, input, output)
                .await?
            {
                return Ok(keep);
            }
        }
    }

    /// [`Conn::wait_blocked`] with nothing to look for: `None` once woken, or whether the
    /// connection goes on once the wait is over.
    async fn wait_woken(
        &self,
        guard: &crate::blocking::Guard<'_>,
        until: Option<tokio::time::Instant>,
        stream: &mut TcpStream,
        input: &mut BytesMut,
        output: &mut BytesMut,
    ) -> std::io::Result<Option<bool>> {
        let look = std::future::pending::<()>();
        Ok(
            match self
                .wait_blocked(guard, until, look, stream, input, output)
                .await?
            {
                Waited::Woken => None,
                Waited::Over(keep) => Some(keep),
                Waited::Look(()) => unreachable!("nothing to look for"),
            },
        )
    }

    /// Waits as a blocked client, registered as `guard`, for the first of: the kill switch,
    /// a wake-up (a push, a look that found something, `CLIENT UNBLOCK`), the timeout
    /// `until`, the client going, and the end of `look` (`std::future::pending()` for none).
    /// Requests the socket brings meanwhile wait in `input`; the timeout's and
    /// `CLIENT UNBLOCK`'s replies are written.
    async fn wait_blocked<T>(
        &self,
        guard: &crate::blocking::Guard<'_>,
        until: Option<tokio::time::Instant>,
        look: impl Future<Output = T>,
        stream: &mut TcpStream,
        input: &mut BytesMut,
        output: &mut BytesMut,
    ) -> std::io::Result<Waited<T>> {
        let expired = async {
            match until {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(expired, look);
        loop {
            let mut out = Out::new(output, self.proto);
            tokio::select! {
                biased;
                () = self.info.kill.cancelled() => return Ok(Waited::Over(false)),
                () = guard.woken() => {
                    return Ok(match guard.unblocked() {
                        None => Waited::Woken,
                        Some(crate::blocking::Unblock::Error) => {
                            out.error("UNBLOCKED client unblocked via CLIENT UNBLOCK");
                            Waited::Over(true)
                        }
                        Some(crate::blocking::Unblock::Timeout) => {
                            timed_out(&mut out);
                            Waited::Over(true)
                        }
                    });
                }
                () = &mut expired => {
                    timed_out(&mut out);
                    return Ok(Waited::Over(true));
                }
                r = stream.read_buf(input) => {
                    if r? == 0 || input.len() > QUERY_BYTES_MAX {
                        return Ok(Waited::Over(false));
                    }
                }
                found = &mut look => return Ok(Waited::Look(found)),
            }
        }
    }

    /// Commits `txn`. With `sync` durability the reply goes out only once the commit is
    /// durable: the task waits for the fsync (`commit_async`; the log's flusher publishes
    /// the commit and wakes the task), and concurrent connections share fsyncs. A commit
    /// that `may_wait` for a split key's reconciliation (see [`Conn::may_wait`]) blocks in
    /// its own work, so it runs on the blocking pool.
    ///
    /// The commit's own work (locking, validation, installing) is done once `commit_async`
    /// returns; the hot keys' locks `held` are let go then, before the wait for the fsync,
    /// so that the next command on them runs at once and, reading at the installed
    /// watermark (`Shared::begin_writer`), shares this one's fsync.
    async fn commit(
        &self,
        txn: Txn<'static>,
        may_wait: bool,
        held: &mut hot::Guards<'_>,
    ) -> CommitOutcome {
        if may_wait {
            return tokio::task::spawn_blocking(move || txn.commit_detailed())
                .await
                .expect("a commit does not panic");
        }
        let committed = txn.commit_async();
        held.clear();
        committed.await
    }

    /// One attempt of a retry loop: `prepare` begins a transaction and runs the commands in it
    /// (writing their replies), or ends the loop with `Err`; then the transaction commits.
    ///
    /// `rejoin`: the last attempt lost a conflict on a split key. This attempt can only
    /// succeed if it reads and locks the key in the joined phase after the key's
    /// reconciliation, before the next split phase locks the key again. So it waits for the
    /// reconciliation and then runs whole on this thread with nothing scheduled in between,
    /// out of the async workers' way (`block_in_place`). On a current-thread runtime, which
    /// cannot do that, it waits on the blocking pool and then runs as usual.
    async fn attempt<T>(
        &self,
        rejoin: bool,
        may_wait: bool,
        held: &mut hot::Guards<'_>,
        prepare: impl FnOnce() -> Result<Txn<'static>, T> + Send,
    ) -> Result<CommitOutcome, T> {
        let db = self.shared.db;
        if rejoin {
            let flavor = tokio::runtime::Handle::current().runtime_flavor();
            if flavor == tokio::runtime::RuntimeFlavor::MultiThread {
                return tokio::task::block_in_place(|| {
                    let _joined = db.wait_joined();
                    Ok(prepare()?.commit_detailed())
                });
            }
            let joined = tokio::task::spawn_blocking(move || db.wait_joined())
                .await
                .expect("waiting for a reconciliation does not panic");
            let txn = prepare()?;
            let outcome = self.commit(txn, true, held).await;
            drop(joined);
            return Ok(outcome);
        }
        let txn = prepare()?;
        // Only a commit that writes a split record where its slices cannot take the write
        // may block; the rest commit inline, split records elsewhere or not.
        let may_wait = may_wait && txn.may_wait_for_split();
        Ok(self.commit(txn, may_wait, held).await)
    }

    /// The lane this connection should run on: the poller while its commands take a hot
    /// key's lock ([`hot::HOT_MS`] after the last), else where every connection goes. On
    /// the poller a hot key's commands run one after another on one thread, as Redis runs
    /// them, with no conflicts and no lock handed between threads.
    fn lane(&self) -> Lane {
        let until = self.hot_until_ms.load(Relaxed);
        if until != 0 && self.shared.now_ms() < until {
            return Lane::Poller;
        }
        self.shared.lanes.lane()
    }

    /// The locks of those of `keys` that are hot (`hot.rs`). A connection whose command
    /// takes one moves to the poller at its next request ([`Conn::lane`]).
    async fn hot_locks<'k>(&self, keys: impl Iterator<Item = &'k [u8]>) -> hot::Guards<'_> {
        let guards = self.shared.hot.lock(keys, false).await;
        self.follow(&guards);
        guards
    }

    /// After [`hot::HEAT_AFTER`] conflicts in a row: `keys` turn hot, and the retries hold
    /// all their locks.
    async fn heat_and_lock<'k, I>(&self, keys: impl Fn() -> I) -> hot::Guards<'_>
    where
        I: Iterator<Item = &'k [u8]>,
    {
        self.shared.hot.heat(keys());
        let guards = self.shared.hot.lock(keys(), true).await;
        self.follow(&guards);
        guards
    }

    /// The connection follows the hot keys whose locks it holds to the poller.
    fn follow(&self, guards: &hot::Guards<'_>) {
        if !guards.is_empty() {
            self.hot_until_ms
                .store(self.shared.now_ms() + hot::HOT_MS, Relaxed);
        }
    }

    /// Waits before retrying a transaction that lost `conflict`, unless the conflict was on a
    /// split key (reason `Split`: the transaction read it, or its write waited for the key's
    /// reconciliation): then it returns `true`, and [`Conn::attempt`] waits for the
    /// reconciliation instead.
    async fn wait_to_retry(&self, conflict: &keel::Conflict, attempt: u32) -> bool {
        match conflict.reason {
            keel::ConflictReason::Split => return true,
            keel::ConflictReason::Prepared => self.wait_decided(&conflict.key).await,
            _ => backoff(attempt).await,
        }
        false
    }

    /// Waits, without holding the thread, until the transaction prepared in a two-phase
    /// commit across nodes that holds engine key `key` is decided (a network round trip, or
    /// a recovery after a failure), or [`keel::limits::DECISION_WAIT_MAX`] passed. The engine
    /// does not wait for such a holder in the commit: spinning there would keep this thread
    /// from the very messages that decide it.
    async fn wait_decided(&self, key: &[u8]) {
        let deadline = Instant::now() + keel::limits::DECISION_WAIT_MAX;
        while self.shared.db.awaits_decision(key) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Whether a transaction running `cmds` may block in its commit for up to two split phase
    /// lengths: the engine makes a write to a split key that cannot go to the key's slices (a
    /// `SET`, an `INCR`, ...) wait for the reconciliation. Only while something is split
    /// ([`keel::Db::split_count`]); a transaction whose writes are all
    /// `KEEL.ADD`/`MAX`/`MIN` waits at most for a phase to open, which is short, and commits
    /// inline.
    fn may_wait(&self, mut cmds: impl Iterator<Item = Cmd>) -> bool {
        self.shared.db.split_count() > 0
            && cmds.any(|c| data::is_data(c) && !data::is_read_only(c) && !data::is_commutative(c))
    }

    /// `EXEC`: the queue as one serializable transaction.
    async fn exec(&mut self, output: &mut BytesMut) -> Result<(), Fail> {
        let Some(multi) = self.multi.take() else {
            return Err("ERR EXEC without MULTI".into());
        };
        let watch = self.watch.take();
        if multi.dirty {
            self.rwatch.clear();
            return Err("EXECABORT Transaction discarded because of previous errors.".into());
        }
        // A WAIT inside counts the replicas holding the writes before this EXEC, without
        // waiting (Redis lets no command in a transaction block).
        self.exec_acked = if multi.queue.iter().any(|(cmd, _)| *cmd == Cmd::Wait) {
            self.wait_replicas(0, 0).await?
        } else {
            0
        };
        if self.shared.replication.get().is_some() {
            return self.exec_replicated(multi, output).await;
        }
        if self.exec_gathers(&multi) {
            let watching = watch.as_ref().map_or(Watching::Nothing, Watching::Nodes);
            // The WATCH snapshots stay open until the checks ran (as in
            // `exec_watched_across`).
            let result = self.exec_gathered(&multi, watching, output).await;
            drop(watch);
            return result;
        }
        let watched_across = watch.as_ref().is_some_and(|w| !w.remote.is_empty());
        match self.exec_route(&multi) {
            // Every command here, but watched keys elsewhere too.
            None if watched_across => {
                let watch = watch.expect("watched across nodes");
                return self.exec_watched_across(&multi, watch, output).await;
            }
            None => {}
            // Commands for other nodes under a WATCH: check it where each key lives.
            Some(_) if watch.is_some() => {
                let watch = watch.expect("watching");
                return self.exec_watched_across(&multi, watch, output).await;
            }
            Some(Err(())) => {
                let commands: Vec<&[Bytes]> = multi.queue.iter().map(|(_, a)| &a[..]).collect();
                let mut out = Out::new(output, self.proto);
                let replies = self.across_nodes(&commands).await?;
                out.array(replies.len());
                for reply in replies {
                    out.buf.extend_from_slice(&reply);
                }
                return Ok(());
            }
            Some(Ok(node)) => {
                let begin = [Bytes::from_static(b"MULTI")];
                let end = [Bytes::from_static(b"EXEC")];
                let mut requests: Vec<&[Bytes]> = Vec::with_capacity(multi.queue.len() + 2);
                requests.push(&begin);
                requests.extend(multi.queue.iter().map(|(_, args)| &args[..]));
                requests.push(&end);
                if let Some(x) = self.shared.xnode.get() {
                    x.stats.one_node_forwarded.fetch_add(1, Relaxed);
                }
                // Exactly once (`once`) when every command is a data command and one writes;
                // a transaction of only reads, or with PUBLISH, PING, ..., goes as it is.
                let once = multi.queue.iter().all(|(c, _)| data::is_data(*c))
                    && !multi.queue.iter().all(|(c, _)| data::is_read_only(*c));
                self.forward(node, &requests, output, None, once).await;
                return Ok(());
            }
        }
        let shared = self.shared.clone();
        let mut ctx = ctx(&shared);
        let proto = self.proto;
        let mark = output.len();
        let mut out = Out::new(output, proto);
        // Every attempt is a fresh transaction; the WATCH transactions stay open until EXEC
        // is done, so that no deletion of a watched key is collected before it is seen.
        let (watched, deadlines, _pins) = match watch {
            Some(w) => (w.keys, w.deadlines, Some((w.txn, w.first))),
            None => (Vec::new(), Vec::new(), None),
        };
        let mut attempt = 1;
        let acked = self.exec_acked;
        let may_wait = self.may_wait(multi.queue.iter().map(|(c, _)| *c));
        let mut rejoin = false;
        // As for single commands: a block on hot keys queues for their locks (`hot`).
        let keys = || {
            multi
                .queue
                .iter()
                .flat_map(|(cmd, args)| data::keys(*cmd, args))
        };
        let mut held = self.hot_locks(keys()).await;
        loop {
            let prepare = || {
                out.forget_tracked();
                ctx.clock.reset();
                let mut txn = shared
                    .begin_writer(multi.queue.iter().map(|(c, _)| *c), &self.installed_read)
                    .map_err(|e| Err(begin_error(e)))?;
                // The watched keys must still be at the versions recorded at WATCH; reading
                // them makes a commit to one of them before ours conflict.
                for (key, watched_at) in &watched {
                    if txn.newest_ts(key).map_err(|e| Err(e.into()))? > Some(*watched_at) {
                        shared.counters.watch_aborts.fetch_add(1, Relaxed);
                        out.null_array();
                        return Err(Ok(()));
                    }
                }
                // A watched key whose deadline has passed since WATCH has expired (whether or
                // not anything deleted it yet): Redis counts that as a change.
                if deadlines.iter().any(|&d| d <= ctx.clock.now_ms()) {
                    shared.counters.watch_aborts.fetch_add(1, Relaxed);
                    out.null_array();
                    return Err(Ok(()));
                }
                out.array(multi.queue.len());
                let mut failed = false;
                for (i, (cmd, args)) in multi.queue.iter().enumerate() {
                    let slot = out.buf.len();
                    let result = match cmd {
                        cmd if in_exec_here(*cmd) => simple_in_exec(*cmd, args, &mut out, acked),
                        // Sent once the transaction has committed (below).
                        Cmd::Publish | Cmd::Spublish => {
                            out.later(i);
                            Ok(())
                        }
                        Cmd::Pubsub => pubsub::pubsub(&shared.pubsub, args, &mut out),
                        _ => data::run(*cmd, args, &mut View::Txn(&mut txn), &ctx, &mut out),
                    };
                    if let Err(Fail(text)) = result {
                        out.buf.truncate(slot);
                        out.error(&text);
                        failed = true;
                    }
                    if out.buf.len() - mark > ctx.reply_bytes_max {
                        out.buf.truncate(mark);
                        return Err(Err(data::reply_too_big()));
                    }
                }
                if failed {
                    // keel is stricter than Redis: one failed command rolls back the whole
                    // EXEC.
                    return Err(Ok(()));
                }
                Ok(txn)
            };
            let committed = match self.attempt(rejoin, may_wait, &mut held, prepare).await {
                Ok(committed) => committed,
                // A command failed: the reply shows every command's result, but increments
                // waited for a commit that will not come. Run the queue again with reading
                // increments, which reply at once.
                Err(Ok(())) if out.has_tracked() => {
                    out.forget_tracked();
                    out.buf.truncate(mark);
                    ctx.track_increments = false;
                    continue;
                }
                // Rolled back (or a watched key changed): no message was sent.
                Err(Ok(())) => {
                    out.fill_with(None, &mut |_, out| out.int(0));
                    return Ok(());
                }
                Err(Err(fail)) => {
                    out.forget_tracked();
                    return Err(fail);
                }
            };
            match committed {
                Ok(Ok(committed)) => {
                    for (cmd, args) in &multi.queue {
                        shared.blocked.committed(*cmd, args);
                    }
                    let subs = self.subs.as_deref();
                    out.fill_with(Some(&committed), &mut |i, out| {
                        let (cmd, args) = &multi.queue[i];
                        let receivers =
                            shared
                                .pubsub
                                .publish(*cmd == Cmd::Spublish, &args[1], &args[2]);
                        relay(&shared, *cmd == Cmd::Spublish, &args[1], &args[2]);
                        // As from Redis, a message to this client comes before the count.
                        if let Some(subs) = subs {
                            subs.mailbox.deliver(out, usize::MAX);
                        }
                        out.int(receivers as i64);
                    });
                    return Ok(());
                }
                Ok(Err(conflict)) => {
                    out.buf.truncate(mark);
                    // A watched key changed after this attempt checked it: a retry would see
                    // a different version and reply null, so reply null now. A split watched
                    // key may not have changed at all: the retry, after its reconciliation,
                    // checks its version again.
                    if conflict.reason != keel::ConflictReason::Split
                        && watched.iter().any(|(k, _)| k[..] == conflict.key[..])
                    {
                        self.shared.counters.watch_aborts.fetch_add(1, Relaxed);
                        out.null_array();
                        return Ok(());
                    }
                    if attempt >= CONFLICT_ATTEMPTS_MAX {
                        return Err(format!(
                            "ERR keel: gave up after {attempt} conflicting attempts; last: {conflict}"
                        )
                        .into());
                    }
                    self.shared.counters.exec_retries.fetch_add(1, Relaxed);
                    if hot::heats(attempt, &conflict) && held.is_empty() {
                        held = self.heat_and_lock(keys).await;
                    }
                    rejoin = self.wait_to_retry(&conflict, attempt).await;
                    attempt += 1;
                }
                // An increment met a value that is not an integer: run the queue again with
                // reading increments, so that the error shows in the increment's slot.
                Err(keel::CommitError::Apply(_)) if ctx.track_increments => {
                    out.buf.truncate(mark);
                    ctx.track_increments = false;
                }
                Err(keel::CommitError::Apply(e)) => {
                    out.buf.truncate(mark);
                    return Err(data::engine_error(&e));
                }
                Err(e) => {
                    out.buf.truncate(mark);
                    return Err(format!("ERR keel: {e}").into());
                }
            }
        }
    }
}

/// A client class as `CLIENT LIST|KILL TYPE` names it. keel's clients are normal, or pubsub
/// while subscribed; it has no master or replica connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClientType {
    Normal,
    Pubsub,
    Replication,
}

/// `SAVE`'s and `BGSAVE`'s answer while one is being written.
const SAVE_IN_PROGRESS: &str = "ERR Background save already in progress";
/// `SAVE`'s and `BGSAVE`'s answer on a server without a data directory.
const NOTHING_TO_SAVE: &str =
    "ERR keel: nothing to save: this server keeps its data in memory only (no data directory)";

/// How often `WAIT` looks again at the partitions' replicas.
const WAIT_LOOK_EVERY: Duration = Duration::from_millis(5);

/// Whether `SAVE` has anywhere to write: a data directory.
/// In cluster mode, sends a message just published here on to the other nodes' subscribers
/// (`cluster::Relay`).
fn relay(shared: &Shared, shard: bool, channel: &Bytes, message: &Bytes) {
    if let Some(cluster) = &shared.cluster {
        let removed = |n: usize| shared.replication.get().is_some_and(|rep| rep.removed(n));
        cluster.relay.publish(
            &cluster.map(),
            &removed,
            (shard, channel.clone(), message.clone()),
        );
    }
}

fn can_save(shared: &Shared) -> bool {
    match shared.replication.get() {
        Some(rep) => rep.dir().is_some(),
        None => shared.db.dir().is_some(),
    }
}

/// `SAVE`'s work: a checkpoint of the database ([`save`]), or on a replicated node a
/// snapshot of every partition it keeps (`Replication::save`; the partitions' data is
/// rebuilt from their snapshots and logs, and the server's database has no files of its
/// own there).
async fn save_any(shared: Arc<Shared>) -> Result<(), Fail> {
    if let Some(rep) = shared.replication.get() {
        let saved = rep.save().await.ok_or(Fail(NOTHING_TO_SAVE.into()))??;
        tracing::info!("DB saved on disk (a snapshot of each of {saved} partitions)");
        return Ok(());
    }
    tokio::task::spawn_blocking(move || save(&shared))
        .await
        .unwrap_or_else(|_| Err("ERR keel: the checkpoint panicked".into()))
}

/// Writes a checkpoint of the database now (keel's `SAVE`: its log already holds every
/// commit under `sync` and `async`; the checkpoint shortens the replay at the next start).
fn save(shared: &Shared) -> Result<(), Fail> {
    match shared.db.checkpoint() {
        Ok(Some(info)) => {
            tracing::info!(
                keys = info.keys,
                elapsed_ms = info.elapsed.as_millis() as u64,
                "DB saved on disk (checkpoint {})",
                info.name
            );
            Ok(())
        }
        Ok(None) => Err(NOTHING_TO_SAVE.into()),
        Err(e) => Err(format!("ERR keel: the checkpoint failed: {e}").into()),
    }
}

fn client_type(arg: &[u8]) -> Result<ClientType, Fail> {
    match &arg.to_ascii_lowercase()[..] {
        b"normal" => Ok(ClientType::Normal),
        b"pubsub" => Ok(ClientType::Pubsub),
        b"master" | b"replica" | b"slave" => Ok(ClientType::Replication),
        _ => Err(format!("ERR Unknown client type '{}'", shorten(arg)).into()),
    }
}

/// Redis's class of a client: pubsub while it is subscribed to anything.
fn type_of(c: &ClientInfo) -> ClientType {
    if c.subscriptions.iter().any(|n| n.load(Relaxed) > 0) {
        ClientType::Pubsub
    } else {
        ClientType::Normal
    }
}

/// Replicated cluster: how often a client blocked in a pop on a node that holds a replica
/// of its partition checks its keys, should a push not wake it.
const BLOCKED_POLL: Duration = Duration::from_secs(1);

/// What ended one wait of a blocked client ([`Conn::wait_blocked`]).
enum Waited<T = ()> {
    /// A push, or a look that found something, woke it: it tries its pop again.
    Woken,
    /// Its `look` ended, with this: it looks for what no wake-up announces.
    Look(T),
    /// Its reply is written (the timeout, `CLIENT UNBLOCK`): `true`; or the connection ends
    /// (killed, or the client went): `false`.
    Over(bool),
}

/// Where a blocking pop that answered [`Next::Block`] waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BlockedIn {
    /// On this node's data ([`Conn::block`]).
    Here,
    /// In one partition of a replicated cluster ([`Conn::blocking_replicated`]).
    Partition,
    /// Across nodes or partitions ([`Conn::block_across`]).
    Across,
    /// Not a pop: another node's client waits here for a push (`KEEL.AWAITPUSH`,
    /// [`Conn::await_push`]).
    Watcher,
}

/// The longest one `KEEL.AWAITPUSH` waits before a client blocked across nodes asks again:
/// bounds how long a lost connection or a restarted node goes unnoticed.
const AWAIT_PUSH_MAX: Duration = Duration::from_secs(10);

const AWAIT_PUSH_ONLY: &str = "ERR keel: KEEL.AWAITPUSH serves clients blocked across the nodes \
                               of a cluster of single copies (--cluster-node ... --replicas 1)";

/// `KEEL.AWAITPUSH list|zset timeout-ms key [key ...]`'s kind and wait.
fn parse_await_push(args: &[Bytes]) -> Result<(crate::blocking::Kind, Duration), Fail> {
    let kind = if args[1].eq_ignore_ascii_case(b"list") {
        crate::blocking::Kind::List
    } else if args[1].eq_ignore_ascii_case(b"zset") {
        crate::blocking::Kind::ZSet
    } else {
        return Err("ERR keel: KEEL.AWAITPUSH waits for a list or a zset".into());
    };
    let ms = crate::resp::string_to_i64(&args[2])
        .and_then(|ms| u64::try_from(ms).ok())
        .filter(|&ms| Duration::from_millis(ms) <= AWAIT_PUSH_MAX)
        .ok_or_else(|| {
            format!(
                "ERR keel: KEEL.AWAITPUSH's timeout is milliseconds from 0 to {}",
                AWAIT_PUSH_MAX.as_millis()
            )
        })?;
    Ok((kind, Duration::from_millis(ms)))
}

/// Whether one of `keys` holds `kind` now (a list, or a sorted set).
fn holds(db: &keel::Db, keys: &[Bytes], kind: crate::blocking::Kind) -> bool {
    let want = match kind {
        crate::blocking::Kind::List => crate::keyspace::Type::List,
        crate::blocking::Kind::ZSet => crate::keyspace::Type::ZSet,
    };
    // Unable to look (the database is closing): say yes, and the client's try will tell.
    let Ok(snap) = db.snapshot() else {
        return true;
    };
    let clock = crate::keyspace::Clock::at(crate::keyspace::unix_ms());
    keys.iter().any(|key| {
        crate::keyspace::lookup(&mut View::Snap(&snap), &clock, key, false)
            .is_ok_and(|held| held.ty() == Some(want))
    })
}

/// What the other nodes said of a blocked client's keys ([`remote_pushes`]).
enum Remote {
    /// One of them holds something now.
    Pushed,
    /// Nothing came within the wait.
    Quiet,
    /// A node could not be asked (or there is none to ask).
    Failed,
}

/// Asks each node of `elsewhere` (its keys) to answer once one of them holds `kind`
/// (`KEEL.AWAITPUSH`, [`Conn::await_push`]), waiting at most [`AWAIT_PUSH_MAX`] and not past
/// `until`; the first answer decides, and the other requests are dropped (their
/// connections close, which ends their waits there).
async fn remote_pushes(
    shared: &Arc<Shared>,
    elsewhere: &[(usize, Vec<Bytes>)],
    kind: crate::blocking::Kind,
    until: Option<tokio::time::Instant>,
    password: Option<String>,
) -> Remote {
    let wait = until
        .map_or(AWAIT_PUSH_MAX, |t| {
            t.saturating_duration_since(tokio::time::Instant::now())
        })
        .clamp(Duration::from_millis(1), AWAIT_PUSH_MAX);
    let head = [
        Bytes::from_static(b"KEEL.AWAITPUSH"),
        Bytes::from_static(match kind {
            crate::blocking::Kind::List => b"list",
            crate::blocking::Kind::ZSet => b"zset",
        }),
        Bytes::from(wait.as_millis().to_string()),
    ];
    let mut asks = tokio::task::JoinSet::new();
    for (node, keys) in elsewhere {
        let request: Vec<Bytes> = head.iter().chain(keys).cloned().collect();
        let (shared, password, node) = (Arc::clone(shared), password.clone(), *node);
        asks.spawn(async move {
            let cluster = shared.cluster.as_ref().expect("cluster mode");
            cluster
                .forward(node, &[&request], Proto::Resp2, password, Some(Some(wait)))
                .await
        });
    }
    match asks.join_next().await {
        Some(Ok(Ok(reply))) if reply[..] == b":1\r\n"[..] => Remote::Pushed,
        Some(Ok(Ok(reply))) if reply[..] == b"*-1\r\n"[..] => Remote::Quiet,
        _ => Remote::Failed,
    }
}

/// The reply of a blocking pop whose timeout passed: a null array, also for `BLMOVE` (whose
/// nil inside `MULTI` is a null bulk string), as from Redis.
fn timed_out(out: &mut Out<'_>) {
    out.null_array();
}

/// The subscription kind a (un)subscribe command works on.
fn kind_of(cmd: Cmd) -> Kind {
    match cmd {
        Cmd::Psubscribe | Cmd::Punsubscribe => Kind::Pattern,
        Cmd::Ssubscribe | Cmd::Sunsubscribe => Kind::Shard,
        _ => Kind::Channel,
    }
}

/// Redis's full name of the command `args` runs: `client|id` for a subcommand. `None` for an
/// unknown subcommand, or one with the wrong number of arguments: Redis rejects those for
/// that before anything else, and so does the command's handler here.
fn full_name(spec: &Spec, args: &[Bytes]) -> Option<String> {
    if spec.subcommands.is_empty() || args.len() == 1 {
        return Some(spec.name.to_owned());
    }
    let sub = args[1].to_ascii_lowercase();
    let &(name, arity) = spec
        .subcommands
        .iter()
        .find(|(name, _)| name.as_bytes() == sub)?;
    let fits = if arity >= 0 {
        args.len() == arity as usize
    } else {
        args.len() >= arity.unsigned_abs() as usize
    };
    fits.then(|| format!("{}|{name}", spec.name))
}

pub(crate) fn ctx(shared: &Shared) -> Ctx<'_> {
    Ctx {
        bulk_bytes_max: shared.proto_max_bulk_len.load(Relaxed),
        cursors: &shared.cursors,
        reply_bytes_max: shared.config.reply_bytes_max,
        track_increments: true,
        clock: Default::default(),
        encodings: &shared.encodings,
        contended: Default::default(),
        cluster: shared.cluster.is_some() || shared.replication.get().is_some(),
    }
}

/// Commands of a `MULTI` that touch no data, answered where the `EXEC` runs.
fn in_exec_here(cmd: Cmd) -> bool {
    matches!(
        cmd,
        Cmd::Ping | Cmd::Echo | Cmd::Time | Cmd::Role | Cmd::Unwatch | Cmd::Wait
    )
}

/// `WAIT numreplicas timeout`'s arguments, checked as Redis checks them.
fn parse_wait(args: &[Bytes]) -> Result<(i64, u64), Fail> {
    let want = crate::resp::string_to_i64(&args[1])
        .ok_or("ERR value is not an integer or out of range")?;
    let timeout_ms = crate::resp::string_to_i64(&args[2])
        .ok_or("ERR timeout is not an integer or out of range")?;
    if timeout_ms < 0 {
        return Err("ERR timeout is negative".into());
    }
    Ok((want, timeout_ms as u64))
}

/// A command of [`in_exec_here`] inside `EXEC`; `WAIT` answers `acked` at once, as Redis
/// answers it inside a transaction, which may not block.
fn simple_in_exec(cmd: Cmd, args: &[Bytes], out: &mut Out<'_>, acked: usize) -> Result<(), Fail> {
    match cmd {
        Cmd::Wait => {
            parse_wait(args)?;
            out.int(i64::try_from(acked).unwrap_or(i64::MAX));
        }
        Cmd::Ping if args.len() > 2 => return Err(PING_ARITY.into()),
        Cmd::Ping => match args.get(1) {
            Some(m) => out.bulk(m),
            None => out.simple("PONG"),
        },
        Cmd::Echo => out.bulk(&args[1]),
        // Queued, as in Redis: EXEC has already let go of the watched keys.
        Cmd::Unwatch => out.ok(),
        Cmd::Role => role(out),
        _ => {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or(Duration::ZERO);
            out.array(2);
            out.bulk(now.as_secs().to_string().as_bytes());
            out.bulk(now.subsec_micros().to_string().as_bytes());
        }
    }
    Ok(())
}

/// `ROLE`: a primary without replicas, at replication offset 0, as a Redis that replicates
/// nothing answers. keel's replication is each partition's Raft group, not Redis's
/// primary-replica stream, so every node answers so (clients that look for the primary, as
/// Lettuce's master-replica discovery does, find one wherever they ask).
fn role(out: &mut Out<'_>) {
    out.array(3);
    out.bulk(b"master");
    out.int(0);
    out.array(0);
}

/// Waits before retrying a conflicting transaction: yields at first, then sleeps, bounded.
async fn backoff(attempt: u32) {
    if attempt < 4 {
        tokio::task::yield_now().await;
    } else {
        let us = (1u64 << attempt.min(10)).min(1000);
        tokio::time::sleep(Duration::from_micros(us)).await;
    }
}

fn begin_error(e: keel::BeginError) -> Fail {
    format!("ERR keel: {e}").into()
}

/// Redis's `'%.*s'` of an argument: C's printf stops at the first NUL byte and at `max` bytes.
fn c_str(arg: &[u8], max: usize) -> &[u8] {
    let end = arg.iter().position(|&b| b == 0).unwrap_or(arg.len());
    &arg[..end.min(max)]
}

/// Redis's error for an unknown command: the name, then the arguments, quoted, until their
/// text reaches 128 bytes (the last one cut to fit), each as C's printf shows it.
fn unknown_command(args: &[Bytes]) -> Vec<u8> {
    const ARGS_BYTES_MAX: usize = 128;
    let mut quoted = Vec::new();
    for a in &args[1..] {
        if quoted.len() >= ARGS_BYTES_MAX {
            break;
        }
        let room = ARGS_BYTES_MAX - quoted.len();
        quoted.push(b'\'');
        quoted.extend_from_slice(c_str(a, room));
        quoted.extend_from_slice(b"' ");
    }
    let mut text = b"ERR unknown command '".to_vec();
    text.extend_from_slice(c_str(&args[0], 128));
    text.extend_from_slice(b"', with args beginning with: ");
    text.extend_from_slice(&quoted);
    text
}

fn shorten(arg: &[u8]) -> String {
    String::from_utf8_lossy(&arg[..arg.len().min(128)]).into_owned()
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

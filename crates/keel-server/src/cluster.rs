//! Cluster mode (`keel serve --cluster`): routing commands by hash slot, the `CLUSTER`
//! command, and forwarding to the node that owns a slot (slice 1 of `docs/cluster.md`).
//!
//! A data command's keys (the command table's first key, last key and step) decide where it
//! runs. All on slots this node owns: here, as on a single node (several slots of this node
//! are still one engine transaction). All on one other node: a cluster-aware connection (one
//! that has asked `CLUSTER SLOTS`, `SHARDS` or `NODES`) gets `-MOVED <slot> <host>:<port>`
//! and follows it; any other connection has the command forwarded and the owner's reply
//! relayed. Keys on several nodes: `-CROSSSLOT`, until cross-partition transactions (slice
//! 2 on) exist.
//!
//! Forwarding in this slice is deliberately plain: a pool of RESP connections to each peer's
//! client port, one request (or one `MULTI … EXEC` block) at a time per connection, the
//! reply relayed byte for byte. Every forward is bounded by the cluster's request timeout; a
//! peer that refuses, breaks or does not answer in time gives `-CLUSTERDOWN`, and its
//! connection is dropped (never pooled again, so a late reply cannot be read as another
//! request's). The peers' transport of later slices (`docs/cluster.md`, "transport") replaces
//! it.
//!
//! Commands without keys (`KEYS`, `SCAN`, `DBSIZE`, `FLUSHDB`, `KEEL.RANGE`) run on the node
//! the client talks to and see its slots only, as on a Redis Cluster node.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use keel_cluster::{Membership, SLOTS, Slot, key_slot};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::data::Fail;
use crate::once;
use crate::reply::{Out, Proto};
use crate::table::Spec;

/// Idle connections kept per peer and protocol; more are closed when they come back.
pub const POOL_IDLE_MAX: usize = 64;
/// The largest reply relayed from a peer: the largest reply a node sends.
pub const RELAY_BYTES_MAX: usize = 512 << 20;

/// Redis' reply to keys of several slots (here: of slots on several nodes).
pub const CROSSSLOT: &str = "CROSSSLOT Keys in request don't hash to the same slot";
/// Redis' reply to cluster commands on a node without cluster mode.
pub const DISABLED: &str = "ERR This instance has cluster support disabled";

/// Where a command runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// On this node (no keys, or every key on a slot it owns).
    Local,
    /// On node `node`, which owns `slot` (the first key's) and every other key's slot.
    Remote { node: usize, slot: Slot },
    /// Keys on slots of different nodes.
    CrossSlot,
}

/// A request to another node failed.
#[derive(Debug)]
pub struct Down {
    /// The error for the client (`CLUSTERDOWN …`).
    pub text: String,
    /// Whether the request was sent (it may then have run).
    pub sent: bool,
}

/// This node's view of the cluster and its connections to the peers.
pub struct Cluster {
    /// The checked configuration; in a replicated cluster, with the nodes that joined since
    /// (`replica::view`).
    map: parking_lot::RwLock<Arc<Membership>>,
    /// Per node, idle connections speaking RESP2 (`[0]`) and RESP3 (`[1]`).
    pools: parking_lot::RwLock<Vec<Arc<Pool>>>,
    /// How long requests to each node take.
    pub rpc: crate::rpc_stats::Peers,
    /// Forwarded writes' ids (`once`): this process's incarnation, drawn at start (so that
    /// no id of an earlier run is used again), and the next sequence number.
    incarnation: u64,
    seq: AtomicU64,
    /// Exactly-once forwarding's counters, for `INFO cluster`.
    pub once: OnceStats,
    /// The attempts of blocking pops forwarded to this node exactly once, by id.
    pub attempts: once::Attempts,
    /// The counters of the transport between nodes (`xnode`), once it runs.
    pub bus: std::sync::OnceLock<keel_cluster::transport::StatsHandle>,
    /// Messages published here, on their way to the other nodes' subscribers.
    pub relay: Relay,
}

/// A message to relay: whether to a shard channel, the channel, the message.
type Published = (bool, Bytes, Bytes);

/// Most messages waiting for one peer; past it, messages to that peer are dropped (counted),
/// as Redis Cluster drops what its bus cannot carry: pub/sub delivers at most once.
pub const RELAY_QUEUE: usize = 16_384;

/// Most messages one relay exchange carries (one pipelined round trip).
const RELAY_BATCH: usize = 512;

/// `PUBLISH` and `SPUBLISH` reach the subscribers of every node, as in Redis Cluster (whose
/// bus carries each message to every node): a message published here is delivered here, then
/// queued for each other node, where a task per peer sends its queue in order, in batches, as
/// `KEEL.PUBLISH` (delivered there, not relayed again). So each subscriber, wherever it is
/// connected, gets a publisher's messages in the order they were published; the reply counts
/// this node's receivers, as Redis Cluster's does. A message to a peer that cannot be reached
/// within the cluster timeout is lost for that peer (counted), never retried.
#[derive(Default)]
pub struct Relay {
    /// The server, for the peers' tasks (set when the server starts).
    shared: std::sync::OnceLock<std::sync::Weak<crate::server::Shared>>,
    /// Per node, its queue, once something was published for it.
    queues: Mutex<Vec<Option<tokio::sync::mpsc::Sender<Published>>>>,
    /// Messages delivered to a peer, and dropped (queue full or peer unreachable).
    pub relayed: AtomicU64,
    pub dropped: AtomicU64,
}

impl Relay {
    /// Starts relaying for `shared`'s server.
    pub fn start(&self, shared: std::sync::Weak<crate::server::Shared>) {
        let _ = self.shared.set(shared);
    }

    /// Queues `message` (published here) for every other node of `map` but the removed ones.
    pub fn publish(&self, map: &Membership, removed: &dyn Fn(usize) -> bool, message: Published) {
        let Some(shared) = self.shared.get() else {
            return;
        };
        let mut queues = self.queues.lock();
        for node in (0..map.nodes().len()).filter(|&n| n != map.myself() && !removed(n)) {
            if queues.len() <= node {
                queues.resize(node + 1, None);
            }
            let queue = queues[node].get_or_insert_with(|| {
                let (tx, rx) = tokio::sync::mpsc::channel(RELAY_QUEUE);
                tokio::spawn(relay_to(shared.clone(), node, rx));
                tx
            });
            if queue.try_send(message.clone()).is_err() {
                self.dropped.fetch_add(1, Relaxed);
            }
        }
    }
}

/// Sends node `node`'s queue of published messages, in order, until the server ends.
async fn relay_to(
    shared: std::sync::Weak<crate::server::Shared>,
    node: usize,
    mut queue: tokio::sync::mpsc::Receiver<Published>,
) {
    let mut batch = Vec::with_capacity(RELAY_BATCH);
    while queue.recv_many(&mut batch, RELAY_BATCH).await > 0 {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let Some(cluster) = shared.cluster.as_ref() else {
            return;
        };
        let requests: Vec<[Bytes; 4]> = batch
            .drain(..)
            .map(|(shard, channel, message)| {
                [
                    Bytes::from_static(b"KEEL.PUBLISH"),
                    Bytes::from_static(if shard { b"1" } else { b"0" }),
                    channel,
                    message,
                ]
            })
            .collect();
        let sending: Vec<&[Bytes]> = requests.iter().map(|r| &r[..]).collect();
        let password = shared.requirepass.read().clone();
        let wait = cluster.map().timeout();
        let counter = match cluster
            .exchange(node, &sending, Proto::Resp2, password, Some(Some(wait)))
            .await
        {
            Ok(_) => &cluster.relay.relayed,
            Err(_) => &cluster.relay.dropped,
        };
        counter.fetch_add(requests.len() as u64, Relaxed);
    }
}

/// Counters of exactly-once forwarding (`once`).
#[derive(Debug, Default)]
pub struct OnceStats {
    /// Forwarded writes sent again after their answer was lost.
    pub retries: AtomicU64,
    /// Forwarded writes whose answer stayed lost for the whole retry window.
    pub ambiguous: AtomicU64,
    /// Writes forwarded to this node again that got their kept answer and ran nothing.
    pub replayed: AtomicU64,
    /// Answers of writes forwarded to this node kept (committed with their write).
    pub kept: AtomicU64,
}

/// Idle connections to one node, RESP2 (`[0]`) and RESP3 (`[1]`).
type Pool = [Mutex<Vec<std::net::TcpStream>>; 2];

impl Cluster {
    /// A node of `map`, with no connections yet.
    pub fn new(map: Arc<Membership>) -> Cluster {
        let pools = map.nodes().iter().map(|_| Arc::default()).collect();
        Cluster {
            map: parking_lot::RwLock::new(map),
            pools: parking_lot::RwLock::new(pools),
            rpc: Default::default(),
            incarnation: incarnation(),
            seq: AtomicU64::new(1),
            once: OnceStats::default(),
            attempts: once::Attempts::default(),
            bus: std::sync::OnceLock::new(),
            relay: Relay::default(),
        }
    }

    /// The transport's counters (zero before it runs, and in a replicated cluster, whose
    /// nodes talk over their client ports).
    pub fn bus_stats(&self) -> keel_cluster::transport::Stats {
        self.bus.get().map(|b| b.read()).unwrap_or_default()
    }

    /// The configuration now.
    pub fn map(&self) -> Arc<Membership> {
        Arc::clone(&self.map.read())
    }

    /// Takes `map` (the same nodes at the same indexes, and more) as the configuration.
    pub fn set_map(&self, map: Arc<Membership>) {
        {
            let mut pools = self.pools.write();
            while pools.len() < map.nodes().len() {
                pools.push(Arc::default());
            }
        }
        *self.map.write() = map;
    }

    /// Where the command `spec` with `args` runs.
    pub fn route(&self, spec: &Spec, args: &[Bytes]) -> Route {
        let keys = key_args(spec, args);
        let mut keys = keys.iter();
        let Some(first) = keys.next() else {
            return Route::Local;
        };
        let slot = key_slot(first);
        let map = self.map.read();
        let node = map.owner(slot);
        for &key in keys {
            if map.owner(key_slot(key)) != node {
                return Route::CrossSlot;
            }
        }
        if node == map.myself() {
            Route::Local
        } else {
            Route::Remote { node, slot }
        }
    }

    /// Those of `keys` that other nodes own, by node.
    pub fn by_other_owner(&self, keys: &[Bytes]) -> Vec<(usize, Vec<Bytes>)> {
        let map = self.map.read();
        let mut by: Vec<(usize, Vec<Bytes>)> = Vec::new();
        for key in keys {
            let node = map.owner(key_slot(key));
            if node == map.myself() {
                continue;
            }
            match by.iter_mut().find(|(n, _)| *n == node) {
                Some((_, ks)) => ks.push(key.clone()),
                None => by.push((node, vec![key.clone()])),
            }
        }
        by
    }

    /// The `MOVED` error for `slot` on `node`.
    pub fn moved(&self, node: usize, slot: Slot) -> String {
        format!("MOVED {slot} {}", self.map.read().nodes()[node].addr)
    }

    /// Sends `requests` to `node` over one connection, in order, and returns the last one's
    /// reply (the `EXEC` of a forwarded transaction); the others' replies are read and
    /// dropped. Fails with a `CLUSTERDOWN` error text if the node cannot be reached or does
    /// not answer within the request timeout; a blocking command (`block`: its own timeout,
    /// `Some(None)` for none) has that much longer to answer.
    pub async fn forward(
        &self,
        node: usize,
        requests: &[&[Bytes]],
        proto: Proto,
        password: Option<String>,
        block: Option<Option<Duration>>,
    ) -> Result<Bytes, String> {
        let began = std::time::Instant::now();
        let answer = self
            .exchange(
                node,
                requests,
                proto,
                password,
                block.map(|b| b.map(|b| self.map.read().timeout().saturating_add(b))),
            )
            .await;
        // A blocking command's wait is the client's, not the peer's.
        if block.is_none() {
            self.rpc.of(node).record(began.elapsed(), answer.is_ok());
        }
        answer.map_err(|down| down.text)
    }

    /// As [`Cluster::forward`] for a write (a command, or the `EXEC` of a transaction: the
    /// last of `requests`), exactly once: the last request goes as `KEEL.ONCE` with a fresh
    /// id (`once`), and if its answer is lost after it was sent (the connection broke or
    /// timed out), all of `requests` go again with the same id, within
    /// [`once::RETRY_TIMEOUTS`] cluster timeouts; the owner runs it at most once and answers a
    /// request it already ran with the answer it kept. Only when no answer comes within that
    /// window is the client told that the write may or may not have happened.
    ///
    /// A blocking pop (`block`: its wait, `None` for ever) goes alone, and each try carries
    /// what is left of its wait (at least a millisecond: a try after the wait ended only asks
    /// whether an earlier one popped). The window counts from the first of a run of failed
    /// tries, and a try that waited at the owner longer than the window ends the run, so a
    /// pop that waits long is not cut short.
    pub async fn forward_once(
        &self,
        node: usize,
        requests: &[&[Bytes]],
        proto: Proto,
        password: Option<String>,
        block: Option<Option<Duration>>,
    ) -> Result<Bytes, String> {
        let map = self.map();
        let timeout = map.timeout();
        let window = timeout.saturating_mul(once::RETRY_TIMEOUTS);
        let keep_ms = u64::try_from(window.as_millis())
            .unwrap_or(u64::MAX)
            .saturating_add(once::KEEP_SLACK_MS)
            .min(once::KEEP_MS_MAX);
        let id = once::Id {
            node: u16::try_from(map.myself()).expect("node indices fit 16 bits"),
            incarnation: self.incarnation,
            seq: self.seq.fetch_add(1, Relaxed),
        };
        let (last, before) = requests.split_last().expect("a request to forward");
        let deadline = block.flatten().map(|wait| std::time::Instant::now() + wait);
        let mut sent = false;
        let mut attempt = 0u32;
        let mut failing_since: Option<std::time::Instant> = None;
        loop {
            let (command, wait) = match block {
                None => (std::borrow::Cow::Borrowed(*last), None),
                Some(wait) => {
                    let left = deadline.map(|d| {
                        d.saturating_duration_since(std::time::Instant::now())
                            .max(Duration::from_millis(1))
                    });
                    let command = crate::lists::with_timeout(last, left);
                    (std::borrow::Cow::Owned(command), Some(left.or(wait)))
                }
            };
            // How long this try waits for its answer (`None`: for ever); the owner refuses
            // the try if it arrives later than that (`once::LATE_SLACK_MS`).
            let wait = wait.map_or(Some(timeout), |w| w.map(|w| timeout.saturating_add(w)));
            let until_ms = wait.map_or(0, |w| {
                crate::keyspace::unix_ms()
                    .saturating_add(u64::try_from(w.as_millis()).unwrap_or(u64::MAX / 2))
            });
            let wrapped = once::wrap(id, keep_ms, until_ms, &command);
            let mut sending: Vec<&[Bytes]> = before.to_vec();
            sending.push(&wrapped);
            let try_began = std::time::Instant::now();
            let answer = self
                .exchange(node, &sending, proto, password.clone(), Some(wait))
                .await;
            if block.is_none() {
                self.rpc
                    .of(node)
                    .record(try_began.elapsed(), answer.is_ok());
            }
            let down = match answer {
                // Refused as late (the clocks differ by more than the slack) after an earlier
                // try was sent, which may have run.
                Ok(reply)
                    if sent
                        && reply
                            .get(1..)
                            .is_some_and(|r| r.starts_with(once::LATE.as_bytes())) =>
                {
                    self.once.ambiguous.fetch_add(1, Relaxed);
                    return Err(format!(
                        "TRYAGAIN keel: node #{node} did not answer a forwarded write in time; \
                         the write may or may not have happened"
                    ));
                }
                Ok(reply) => return Ok(reply),
                Err(down) => down,
            };
            sent |= down.sent;
            if !sent {
                // Never sent: nothing ran, the client may send it again itself.
                return Err(down.text);
            }
            // A pop's try that lasted longer than the window waited at the owner: the run of
            // failures starts again. (A write's try ends within a timeout.)
            if block.is_some() && try_began.elapsed() > window {
                failing_since = None;
            }
            let failing = *failing_since.get_or_insert(try_began);
            if failing.elapsed() >= window {
                self.once.ambiguous.fetch_add(1, Relaxed);
                return Err(format!(
                    "{}; the write may or may not have happened",
                    down.text
                ));
            }
            self.once.retries.fetch_add(1, Relaxed);
            // A broken connection is tried again at once, then with a growing pause (the
            // owner may be restarting), each pause at most a quarter of the timeout.
            if attempt > 0 {
                let pause = Duration::from_millis(10u64 << attempt.min(8)).min(timeout / 4);
                tokio::time::sleep(pause).await;
            }
            attempt += 1;
        }
    }

    /// As [`Cluster::forward`], waiting at most `wait` for the answer (`Some(None)`: for ever;
    /// `None`: the request timeout), and saying whether a failed request was sent at all.
    pub async fn exchange(
        &self,
        node: usize,
        requests: &[&[Bytes]],
        proto: Proto,
        password: Option<String>,
        wait: Option<Option<Duration>>,
    ) -> Result<Bytes, Down> {
        let map = self.map();
        let Some(peer) = map.nodes().get(node) else {
            return Err(Down {
                text: format!(
                    "CLUSTERDOWN The cluster is down: node #{node} is not one this node knows"
                ),
                sent: false,
            });
        };
        let timeout = map.timeout();
        let down = |why: &str| Down {
            text: format!(
                "CLUSTERDOWN The cluster is down: node {} at {} {why}",
                peer.id, peer.addr
            ),
            sent: false,
        };
        let lost = |why: &str| Down {
            sent: true,
            ..down(why)
        };
        let pools = Arc::clone(&self.pools.read()[node]);
        let pool = &pools[usize::from(proto == Proto::Resp3)];
        // A pooled connection the peer has closed (it restarted, or died) is dropped before
        // anything is sent on it: a request written there would be lost without knowing
        // whether it ran.
        let pooled = loop {
            let Some(s) = pool.lock().pop() else {
                break None;
            };
            let _ = s.set_nonblocking(true);
            match s.peek(&mut [0u8; 1]) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break Some(s),
                // Closed, failed, or holding bytes nobody asked for.
                _ => continue,
            }
        };
        let mut stream = match pooled.map(TcpStream::from_std) {
            Some(Ok(s)) => s,
            _ => match tokio::time::timeout(timeout, connect(peer.addr, proto, password)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => return Err(down(&format!("cannot be reached ({e})"))),
                Err(_) => {
                    return Err(down(&format!(
                        "did not answer within {} ms",
                        timeout.as_millis()
                    )));
                }
            },
        };
        let wait = wait.unwrap_or(Some(timeout));
        let exchange = async move {
            let mut wire = BytesMut::new();
            for r in requests {
                encode(r, &mut wire);
            }
            stream.write_all(&wire).await?;
            let mut input = BytesMut::with_capacity(4096);
            let mut last = Bytes::new();
            for _ in 0..requests.len() {
                last = read_reply(&mut stream, &mut input).await?;
            }
            if !input.is_empty() {
                return Err(std::io::Error::other(
                    "the peer sent more than it was asked",
                ));
            }
            Ok::<_, std::io::Error>((stream, last))
        };
        let done = match wait {
            Some(wait) => tokio::time::timeout(wait, exchange).await,
            None => Ok(exchange.await),
        };
        match done {
            Ok(Ok((stream, reply))) => {
                if let Ok(stream) = stream.into_std() {
                    let mut idle = pool.lock();
                    if idle.len() < POOL_IDLE_MAX {
                        idle.push(stream);
                    }
                }
                Ok(reply)
            }
            Ok(Err(e)) => Err(lost(&format!("cannot be reached ({e})"))),
            Err(_) => Err(lost(&format!(
                "did not answer within {} ms",
                wait.unwrap_or(timeout).as_millis()
            ))),
        }
    }
}

/// [`key_args`], copied out.
pub(crate) fn key_args_owned<A: AsRef<[u8]>>(spec: &Spec, args: &[A]) -> Vec<Vec<u8>> {
    key_args(spec, args)
        .into_iter()
        .map(<[u8]>::to_vec)
        .collect()
}

/// The key arguments of `spec`: by its first key, last key and step, or, for a command with
/// movable keys (`SINTERCARD numkeys key ...`), by its `numkeys` argument. Empty for a command
/// without keys, and for a malformed `numkeys` (the command itself then answers the error).
pub(crate) fn key_args<'a, A: AsRef<[u8]>>(spec: &Spec, args: &'a [A]) -> Vec<&'a [u8]> {
    if spec.name == "sort" || spec.name == "sort_ro" {
        // The key, and `STORE`'s destination.
        let store = crate::sort::store_key(args).filter(|_| spec.name == "sort");
        return args
            .get(1)
            .map(AsRef::as_ref)
            .into_iter()
            .chain(store)
            .collect();
    }
    if spec.flags.contains(&"movablekeys") {
        // Where `numkeys` is, and any key before it (a destination).
        let (numkeys_at, before): (usize, &[usize]) = match spec.name {
            "blmpop" | "bzmpop" => (2, &[]),
            "zunionstore" | "zinterstore" | "zdiffstore" => (2, &[1]),
            _ => (1, &[]),
        };
        let Some(n) = args
            .get(numkeys_at)
            .and_then(|a| std::str::from_utf8(a.as_ref()).ok())
            .and_then(|a| a.parse::<usize>().ok())
        else {
            return Vec::new();
        };
        let Some(keys) = args.get(numkeys_at + 1..numkeys_at + 1 + n) else {
            return Vec::new();
        };
        return before
            .iter()
            .filter_map(|&i| args.get(i))
            .chain(keys)
            .map(AsRef::as_ref)
            .collect();
    }
    let (Ok(first), Ok(step)) = (
        usize::try_from(spec.first_key),
        usize::try_from(spec.key_step),
    ) else {
        return Vec::new();
    };
    if first == 0 || step == 0 {
        return Vec::new();
    }
    let last = if spec.last_key < 0 {
        usize::try_from(-i64::from(spec.last_key))
            .ok()
            .and_then(|back| args.len().checked_sub(back))
    } else {
        usize::try_from(spec.last_key)
            .ok()
            .map(|l| l.min(args.len() - 1))
    };
    match last.and_then(|last| args.get(first..=last)) {
        Some(keys) => keys.iter().step_by(step).map(AsRef::as_ref).collect(),
        None => Vec::new(),
    }
}

/// How long a forwarded blocking command (`BLPOP`, ...) may block: its timeout argument
/// (the last, or `BLMPOP`'s first), `None` for 0 (block until served). Not for other commands.
pub fn block_time(spec: &Spec, args: &[Bytes]) -> Option<Option<Duration>> {
    if !spec.flags.contains(&"blocking") {
        return None;
    }
    let at = if matches!(spec.name, "blmpop" | "bzmpop") {
        1
    } else {
        args.len() - 1
    };
    let secs: f64 = std::str::from_utf8(&args[at]).ok()?.parse().ok()?;
    if !secs.is_finite() || secs < 0.0 {
        return None; // The owner answers the error at once.
    }
    Some((secs > 0.0).then(|| Duration::from_secs_f64(secs.min(1e9))))
}

/// A fresh incarnation: differs from every earlier run of this node (with overwhelming
/// probability), so that no forwarded write's id is used twice.
fn incarnation() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    RandomState::new().hash_one((now, std::process::id(), "once"))
}

/// Opens a connection to a peer's client port, authenticated and speaking `proto`.
pub(crate) async fn connect(
    addr: SocketAddr,
    proto: Proto,
    password: Option<String>,
) -> std::io::Result<TcpStream> {
    let mut stream = TcpStream::connect(addr).await?;
    let _ = stream.set_nodelay(true);
    // Closed with a reset: a request this node gave up on (its answer did not come in time)
    // must not reach the peer later. Closed gracefully, the kernel would go on sending what
    // the socket still held, for minutes, and deliver it when the network heals: a write run
    // after its sender stopped retrying, past the window its id is deduplicated in (the
    // real-process network partition test ran writes twice so).
    let _ = stream.set_zero_linger();
    let mut setup: Vec<Vec<Bytes>> = Vec::new();
    if let Some(p) = password {
        setup.push(vec![Bytes::from_static(b"AUTH"), Bytes::from(p)]);
    }
    if proto == Proto::Resp3 {
        setup.push(vec![Bytes::from_static(b"HELLO"), Bytes::from_static(b"3")]);
    }
    if setup.is_empty() {
        return Ok(stream);
    }
    let mut wire = BytesMut::new();
    for r in &setup {
        encode(r, &mut wire);
    }
    stream.write_all(&wire).await?;
    let mut input = BytesMut::new();
    for _ in &setup {
        let reply = read_reply(&mut stream, &mut input).await?;
        if reply.first() == Some(&b'-') {
            let text = String::from_utf8_lossy(&reply[1..]).trim_end().to_owned();
            return Err(std::io::Error::other(format!(
                "it refused this node's connection setup: {text}"
            )));
        }
    }
    Ok(stream)
}

/// Appends `args` as a RESP array of bulk strings.
pub(crate) fn encode(args: &[Bytes], wire: &mut BytesMut) {
    wire.put_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        wire.put_slice(format!("${}\r\n", a.len()).as_bytes());
        wire.put_slice(a);
        wire.put_slice(b"\r\n");
    }
}

/// Reads one whole reply from `stream` (with what `input` already holds) and returns its
/// bytes; what follows it stays in `input`.
pub(crate) async fn read_reply(
    stream: &mut TcpStream,
    input: &mut BytesMut,
) -> std::io::Result<Bytes> {
    loop {
        match reply_len(input) {
            Ok(Some(n)) => return Ok(input.split_to(n).freeze()),
            Ok(None) => {}
            Err(e) => return Err(std::io::Error::other(e)),
        }
        if input.len() > RELAY_BYTES_MAX {
            return Err(std::io::Error::other("the reply is too large to relay"));
        }
        if stream.read_buf(input).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
}

/// The length of the first whole RESP2/RESP3 reply in `buf`: `None` if it is not all there.
/// Iterative (a count of elements still expected), so nesting costs no stack.
pub fn reply_len(buf: &[u8]) -> Result<Option<usize>, &'static str> {
    let mut pos = 0usize;
    let mut expected: u64 = 1;
    while expected > 0 {
        let Some(eol) = buf[pos..].windows(2).position(|w| w == b"\r\n") else {
            return Ok(None);
        };
        let line = &buf[pos + 1..pos + eol];
        let kind = buf[pos];
        pos += eol + 2;
        expected -= 1;
        let number = || -> Result<i64, &'static str> {
            std::str::from_utf8(line)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or("a malformed length in a peer's reply")
        };
        match kind {
            b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => {}
            b'$' | b'!' | b'=' => {
                let n = number()?;
                if n >= 0 {
                    let n = usize::try_from(n).map_err(|_| "a length out of range")?;
                    if buf.len() < pos + n + 2 {
                        return Ok(None);
                    }
                    pos += n + 2;
                }
            }
            b'*' | b'~' | b'>' => expected += u64::try_from(number()?).unwrap_or(0),
            b'%' => expected += 2 * u64::try_from(number()?).unwrap_or(0),
            // An attribute map, then the reply it describes.
            b'|' => expected += 2 * u64::try_from(number()?).unwrap_or(0) + 1,
            _ => return Err("a peer's reply is not RESP"),
        }
    }
    Ok(Some(pos))
}

/// How often [`probe_loop`] looks for peers nothing was sent to lately.
pub const PROBE_EVERY: Duration = Duration::from_millis(500);

/// Keeps what this node knows of its peers' reachability fresh (`rpc_stats`): every
/// [`PROBE_EVERY`], a peer that no request went to for that long (forwarded commands, Raft's
/// messages, the transport's round trips) is sent a `PING`, which counts as heard if it is
/// answered within the cluster timeout. Redis Cluster's nodes ping each other on their bus
/// the same way. Ends with the server.
pub async fn probe_loop(shared: std::sync::Weak<crate::server::Shared>) {
    // Per peer, whether a probe is out (a stopped peer holds one for a timeout).
    let mut out: Vec<Arc<std::sync::atomic::AtomicBool>> = Vec::new();
    loop {
        tokio::time::sleep(PROBE_EVERY).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        if shared.shutdown.is_cancelled() {
            return;
        }
        let Some(cluster) = shared.cluster.as_ref() else {
            return;
        };
        let map = cluster.map();
        let removed = |n: usize| shared.replication.get().is_some_and(|rep| rep.removed(n));
        for node in 0..map.nodes().len() {
            if out.len() <= node {
                out.push(Arc::default());
            }
            let latency = cluster.rpc.of(node);
            if node == map.myself()
                || removed(node)
                || latency.idle().is_some_and(|idle| idle < PROBE_EVERY)
                || out[node].swap(true, Relaxed)
            {
                continue;
            }
            let (shared, busy) = (Arc::clone(&shared), Arc::clone(&out[node]));
            tokio::spawn(async move {
                let Some(cluster) = shared.cluster.as_ref() else {
                    return;
                };
                let password = shared.requirepass.read().clone();
                let ping = [Bytes::from_static(b"PING")];
                let wait = cluster.map().timeout();
                let answer = cluster
                    .exchange(node, &[&ping], Proto::Resp2, password, Some(Some(wait)))
                    .await;
                // An answer of any kind (`-NOAUTH` too) is the peer alive.
                latency.heard(answer.is_ok());
                busy.store(false, Relaxed);
            });
        }
    }
}

/// What this node knows of the cluster's nodes now, for the `CLUSTER` replies.
pub struct Topology<'a> {
    /// Partition `p`'s nodes, the one that serves its writes first.
    pub serving: &'a dyn Fn(usize) -> Vec<usize>,
    /// Node `n` was removed from the cluster.
    pub gone: &'a dyn Fn(usize) -> bool,
    /// Node `n` did not answer this node for a cluster timeout.
    pub unreachable: &'a dyn Fn(usize) -> bool,
    /// Slots that moved from their configured partition (slot → partition).
    pub moved: &'a [(u16, usize)],
}

impl Topology<'_> {
    fn serving(&self, p: usize) -> Vec<usize> {
        (self.serving)(p)
    }

    fn gone(&self, n: usize) -> bool {
        (self.gone)(n)
    }

    fn unreachable(&self, n: usize) -> bool {
        (self.unreachable)(n)
    }
}

/// `CLUSTER <subcommand>`. Sets `*aware` when the client asked for the slot map.
pub fn command(
    cluster: Option<&Cluster>,
    args: &[Bytes],
    out: &mut Out<'_>,
    aware: &mut bool,
    t: &Topology<'_>,
) -> Result<(), Fail> {
    let sub = args[1].to_ascii_lowercase();
    let arity = |n: usize| -> Result<(), Fail> {
        if args.len() == n {
            Ok(())
        } else {
            Err(format!(
                "ERR wrong number of arguments for 'cluster|{}' command",
                String::from_utf8_lossy(&sub)
            )
            .into())
        }
    };
    if sub == b"help" {
        arity(2)?;
        let lines = [
            "CLUSTER <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
            "COUNTKEYSINSLOT <slot>",
            "    Return the number of keys in <slot>.",
            "GETKEYSINSLOT <slot> <count>",
            "    Return key names stored by current node in a slot.",
            "INFO",
            "    Return information about the cluster.",
            "KEYSLOT <key>",
            "    Return the hash slot for <key>.",
            "MYID",
            "    Return the node id.",
            "NODES",
            "    Return cluster configuration seen by node. Output format:",
            "    <id> <ip:port> <flags> <master> <pings> <pongs> <epoch> <link> <slot> ...",
            "PARTITIONS",
            "    (keel) The slots of each partition, by the id of the node it was made for:",
            "    <id> <slot> ...",
            "SETSLOT <slot> (IMPORTING <node-id>|MIGRATING <node-id>|NODE <node-id>|STABLE)",
            "    (keel) MIGRATING or NODE moves the slot and its keys at once to the partition",
            "    made for <node-id>, as KEEL.MOVESLOTS does (redis-cli --cluster reshard works);",
            "    IMPORTING and STABLE change nothing. A replicated cluster only.",
            "SHARDS",
            "    Return information about slot range mappings and the nodes serving them.",
            "SLOTS",
            "    Return information about slots range mappings. Each range is made of:",
            "    start, end, master and replicas IP addresses, ports and ids",
            "HELP",
            "    Print this help.",
        ];
        out.help(&lines);
        return Ok(());
    }
    // KEYSLOT needs no cluster (Redis answers it only in cluster mode; so does keel).
    let Some(cluster) = cluster else {
        return Err(DISABLED.into());
    };
    let map = &*cluster.map();
    match &sub[..] {
        b"keyslot" => {
            arity(3)?;
            out.int(i64::from(key_slot(&args[2]).0));
        }
        b"myid" => {
            arity(2)?;
            out.bulk(map.me().id.as_str().as_bytes());
        }
        b"info" => {
            arity(2)?;
            let ranges = ranges(map, t.moved);
            out.verbatim(&info(cluster, map, &ranges, t));
        }
        b"slots" => {
            arity(2)?;
            *aware = true;
            let ranges = ranges(map, t.moved);
            out.array(ranges.len());
            for (start, end, part) in ranges {
                // The node serving the range, then its replicas but those that fail (as
                // Redis leaves out replicas that fail).
                let nodes: Vec<usize> = t
                    .serving(part)
                    .into_iter()
                    .enumerate()
                    .filter(|&(i, n)| i == 0 || !t.unreachable(n))
                    .map(|(_, n)| n)
                    .collect();
                out.array(2 + nodes.len());
                out.int(i64::from(start));
                out.int(i64::from(end));
                for node in nodes {
                    let n = &map.nodes()[node];
                    out.array(4);
                    out.bulk(n.addr.ip().to_string().as_bytes());
                    out.int(i64::from(n.addr.port()));
                    out.bulk(n.id.as_str().as_bytes());
                    out.map(0);
                }
            }
        }
        b"shards" => {
            arity(2)?;
            *aware = true;
            let ranges = ranges(map, t.moved);
            // A removed node's partition owns no slot and is left out.
            let parts: Vec<usize> = (0..map.nodes().len())
                .filter(|&p| !t.gone(p) || ranges.iter().any(|r| r.2 == p))
                .collect();
            out.array(parts.len());
            for part in parts {
                out.map(2);
                out.bulk(b"slots");
                let own: Vec<&(u16, u16, usize)> = ranges.iter().filter(|r| r.2 == part).collect();
                out.array(2 * own.len());
                for (start, end, _) in own {
                    out.int(i64::from(*start));
                    out.int(i64::from(*end));
                }
                out.bulk(b"nodes");
                let nodes = t.serving(part);
                out.array(nodes.len());
                for (i, node) in nodes.into_iter().enumerate() {
                    let n = &map.nodes()[node];
                    out.map(7);
                    out.bulk(b"id");
                    out.bulk(n.id.as_str().as_bytes());
                    out.bulk(b"port");
                    out.int(i64::from(n.addr.port()));
                    let ip = n.addr.ip().to_string();
                    out.bulk(b"ip");
                    out.bulk(ip.as_bytes());
                    out.bulk(b"endpoint");
                    out.bulk(ip.as_bytes());
                    out.bulk(b"role");
                    out.bulk(if i == 0 { b"master" } else { b"replica" });
                    out.bulk(b"replication-offset");
                    out.int(0);
                    out.bulk(b"health");
                    out.bulk(if t.unreachable(node) {
                        &b"failed"[..]
                    } else {
                        b"online"
                    });
                }
            }
        }
        b"nodes" => {
            arity(2)?;
            *aware = true;
            out.verbatim(&nodes(map, &ranges(map, t.moved), t));
        }
        b"partitions" => {
            arity(2)?;
            out.verbatim(&partitions(map, &ranges(map, t.moved), t));
        }
        // What Redis Cluster does with these, keel does otherwise: say how.
        b"meet" => {
            return Err(
                "ERR keel: a node joins with `keel serve --cluster-join HOST:PORT \
                        --cluster-myself ID` (a replicated cluster; docs/replication.md)"
                    .into(),
            );
        }
        b"forget" => {
            return Err(
                "ERR keel: a node leaves with `keel cluster remove-node ID` \
                        (KEEL.REMOVENODE), which moves its slots and replicas away first"
                    .into(),
            );
        }
        b"addslots" | b"addslotsrange" | b"delslots" | b"delslotsrange" | b"flushslots" => {
            return Err(
                "ERR keel: every slot always has an owner (the config's, then where \
                        moves took it); slots move with CLUSTER SETSLOT, KEEL.MOVESLOTS or \
                        `keel cluster rebalance`"
                    .into(),
            );
        }
        b"replicate" | b"failover" => {
            return Err(
                "ERR keel: every partition is kept on --replicas nodes by Raft, which \
                        elects a new leader when one dies or is cut off; there are no replica \
                        nodes to assign or fail over by hand"
                    .into(),
            );
        }
        _ => {
            return Err(format!(
                "ERR unknown subcommand '{}'. Try CLUSTER HELP.",
                String::from_utf8_lossy(&args[1])
            )
            .into());
        }
    }
    Ok(())
}

/// `CLUSTER INFO`'s text. A slot range whose serving node (`Topology::serving`) does not
/// answer this node (`Topology::unreachable`) is counted `pfail` (this node's view, as Redis counts it), and the
/// state is `fail` while there is one: its keys may not be served (a partition that lost its
/// majority, an unreplicated node that is down). The bus messages are the transport's
/// between nodes (`xnode`).
fn info(
    cluster: &Cluster,
    map: &Membership,
    ranges: &[(u16, u16, usize)],
    t: &Topology<'_>,
) -> String {
    let bus = cluster.bus_stats();
    let n = (0..map.nodes().len()).filter(|&i| !t.gone(i)).count();
    let pfail: usize = ranges
        .iter()
        .filter(|r| {
            t.serving(r.2)
                .first()
                .is_some_and(|&node| t.unreachable(node))
        })
        .map(|&(start, end, _)| usize::from(end - start) + 1)
        .sum();
    let state = if pfail == 0 { "ok" } else { "fail" };
    format!(
        "cluster_state:{state}\r\ncluster_slots_assigned:{SLOTS}\r\ncluster_slots_ok:{}\r\n\
         cluster_slots_pfail:{pfail}\r\ncluster_slots_fail:0\r\ncluster_known_nodes:{n}\r\n\
         cluster_size:{n}\r\ncluster_current_epoch:{n}\r\ncluster_my_epoch:{}\r\n\
         cluster_stats_messages_sent:{}\r\ncluster_stats_messages_received:{}\r\n\
         total_cluster_links_buffer_limit_exceeded:0\r\n",
        usize::from(SLOTS) - pfail,
        map.myself() + 1,
        bus.messages_sent,
        bus.messages_received,
    )
}

/// The slot ranges and their partition: the config's, with `moved` (slot → partition) over it.
fn ranges(map: &Membership, moved: &[(u16, usize)]) -> Vec<(u16, u16, usize)> {
    if moved.is_empty() {
        return map.ranges();
    }
    let moved: std::collections::HashMap<u16, usize> = moved.iter().copied().collect();
    let mut out: Vec<(u16, u16, usize)> = Vec::new();
    for slot in 0..SLOTS {
        let owner = moved
            .get(&slot)
            .copied()
            .unwrap_or_else(|| map.owner(Slot(slot)));
        match out.last_mut() {
            Some((_, end, o)) if *o == owner && *end + 1 == slot => *end = slot,
            _ => out.push((slot, slot, owner)),
        }
    }
    out
}

/// `CLUSTER PARTITIONS`'s text (keel's own): a line per partition, the id of the node it was
/// made for (its home, which `KEEL.MOVESLOTS` names it by) and its slot ranges, whichever
/// node leads it; not the partitions of removed nodes (which own no slots: a node is removed
/// only once they moved, though this node may not have learned every move yet), as `NODES`
/// leaves out the nodes. `keel cluster rebalance` and `remove-node` plan by it.
fn partitions(map: &Membership, ranges: &[(u16, u16, usize)], t: &Topology<'_>) -> String {
    let mut text = String::new();
    for (p, n) in map.nodes().iter().enumerate() {
        if t.gone(p) {
            continue;
        }
        text.push_str(n.id.as_str());
        push_ranges(&mut text, ranges, p);
    }
    text
}

/// The ranges of `ranges` whose third field is `of`, as `CLUSTER NODES` writes them (` a-b`,
/// or ` a` for one slot), and the line's end.
fn push_ranges(text: &mut String, ranges: &[(u16, u16, usize)], of: usize) {
    for (start, end, _) in ranges.iter().filter(|r| r.2 == of) {
        if start == end {
            text.push_str(&format!(" {start}"));
        } else {
            text.push_str(&format!(" {start}-{end}"));
        }
    }
    text.push('\n');
}

/// `CLUSTER NODES`'s text: one line per node, as Redis writes it. The cluster bus port is 0
/// (keel has none); each node's config epoch is its position in the config.
fn nodes(map: &Membership, ranges: &[(u16, u16, usize)], t: &Topology<'_>) -> String {
    // Each range under the node that serves it (in a replicated cluster, its partition's
    // leader, as `CLUSTER SLOTS` and `SHARDS` name it): after a failover, the new leader.
    let served: Vec<(u16, u16, usize)> = ranges
        .iter()
        .map(|&(start, end, part)| (start, end, t.serving(part).first().copied().unwrap_or(part)))
        .collect();
    let mut text = String::new();
    for (i, n) in map.nodes().iter().enumerate() {
        if t.gone(i) {
            continue;
        }
        let mut flags = if i == map.myself() {
            String::from("myself,master")
        } else {
            String::from("master")
        };
        // `fail?` (Redis's PFAIL): failing as this node sees it, with its link down.
        let link = if i != map.myself() && t.unreachable(i) {
            flags.push_str(",fail?");
            "disconnected"
        } else {
            "connected"
        };
        text.push_str(&format!(
            "{} {}@0 {flags} - 0 0 {} {link}",
            n.id,
            n.addr,
            i + 1
        ));
        push_ranges(&mut text, &served, i);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &[&str]) -> Vec<Bytes> {
        words.iter().map(|w| Bytes::from(w.to_string())).collect()
    }

    fn keys(words: &[&str]) -> Vec<String> {
        let spec = crate::table::lookup(words[0].as_bytes()).expect("a command");
        let args = args(words);
        key_args(spec, &args)
            .into_iter()
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .collect()
    }

    /// A [`Topology`] of these closures, nothing moved.
    fn topology<'a>(
        serving: &'a dyn Fn(usize) -> Vec<usize>,
        gone: &'a dyn Fn(usize) -> bool,
        unreachable: &'a dyn Fn(usize) -> bool,
    ) -> Topology<'a> {
        Topology {
            serving,
            gone,
            unreachable,
            moved: &[],
        }
    }

    /// Three nodes, the slots split evenly, this node the first.
    fn three() -> Arc<Membership> {
        let addrs: Vec<SocketAddr> = (7001..7004)
            .map(|p| SocketAddr::from(([127, 0, 0, 1], p)))
            .collect();
        Arc::new(Membership::even(&addrs, 0, 2_000).expect("a membership"))
    }

    #[test]
    fn cluster_nodes_names_each_ranges_serving_node_and_the_nodes_that_fail() {
        let map = three();
        let ranges = ranges(&map, &[]);
        let text = |serving: &dyn Fn(usize) -> Vec<usize>, down: &dyn Fn(usize) -> bool| {
            nodes(&map, &ranges, &topology(serving, &|_| false, down))
        };
        let home = text(&|p| vec![p], &|_| false);
        assert_eq!(
            home,
            "node-1 127.0.0.1:7001@0 myself,master - 0 0 1 connected 0-5460\n\
             node-2 127.0.0.1:7002@0 master - 0 0 2 connected 5461-10921\n\
             node-3 127.0.0.1:7003@0 master - 0 0 3 connected 10922-16383\n"
        );
        // Node 2 is killed; partition 1 elects node 3, which now serves two ranges.
        let failed_over = text(&|p| if p == 1 { vec![2, 0, 1] } else { vec![p] }, &|n| {
            n == 1
        });
        assert_eq!(
            failed_over,
            "node-1 127.0.0.1:7001@0 myself,master - 0 0 1 connected 0-5460\n\
             node-2 127.0.0.1:7002@0 master,fail? - 0 0 2 disconnected\n\
             node-3 127.0.0.1:7003@0 master - 0 0 3 connected 5461-10921 10922-16383\n"
        );
        // This node is never shown failing.
        assert!(
            text(&|p| vec![p], &|_| true).starts_with("node-1 127.0.0.1:7001@0 myself,master - ")
        );
        // The partitions keep their homes' ids, whoever leads them.
        assert_eq!(
            partitions(
                &map,
                &ranges,
                &topology(&|p| vec![p], &|_| false, &|_| false)
            ),
            "node-1 0-5460\nnode-2 5461-10921\nnode-3 10922-16383\n"
        );
        let moved = super::ranges(&map, &[(5461, 0), (16383, 0)]);
        assert_eq!(
            partitions(
                &map,
                &moved,
                &topology(&|p| vec![p], &|n| n == 1, &|_| false)
            ),
            "node-1 0-5461 16383\nnode-3 10922-16382\n",
            "a removed node's partition is left out"
        );
    }

    #[test]
    fn cluster_info_fails_while_a_ranges_serving_node_does_not_answer() {
        let map = three();
        let cluster = Cluster::new(Arc::clone(&map));
        let ranges = ranges(&map, &[]);
        let info = |serving: &dyn Fn(usize) -> Vec<usize>, down: &dyn Fn(usize) -> bool| {
            info(
                &cluster,
                &map,
                &ranges,
                &topology(serving, &|_| false, down),
            )
        };
        let fine = info(&|p| vec![p], &|_| false);
        assert!(fine.starts_with("cluster_state:ok\r\n"), "{fine}");
        assert!(fine.contains("cluster_slots_ok:16384\r\ncluster_slots_pfail:0\r\n"));
        // An unreplicated node 3 is down: its slots are not served.
        let down = info(&|p| vec![p], &|n| n == 2);
        assert!(down.starts_with("cluster_state:fail\r\n"), "{down}");
        assert!(down.contains("cluster_slots_ok:10922\r\ncluster_slots_pfail:5462\r\n"));
        // Replicated, and node 3's partition elected node 1: all served again.
        let moved = info(&|p| if p == 2 { vec![0, 1, 2] } else { vec![p] }, &|n| {
            n == 2
        });
        assert!(moved.starts_with("cluster_state:ok\r\n"), "{moved}");
    }

    #[test]
    fn key_positions() {
        assert_eq!(keys(&["GET", "a"]), ["a"]);
        assert_eq!(keys(&["MSET", "a", "1", "b", "2"]), ["a", "b"]);
        assert_eq!(keys(&["DEL", "a", "b", "c"]), ["a", "b", "c"]);
        assert_eq!(keys(&["BLPOP", "a", "b", "0"]), ["a", "b"]);
        assert_eq!(keys(&["BITOP", "AND", "d", "a", "b"]), ["d", "a", "b"]);
        assert_eq!(keys(&["COPY", "a", "b", "REPLACE"]), ["a", "b"]);
        assert_eq!(keys(&["OBJECT", "ENCODING", "a"]), ["a"]);
        assert!(keys(&["OBJECT", "HELP"]).is_empty());
        assert!(keys(&["RANDOMKEY"]).is_empty());
        assert_eq!(
            keys(&["SINTERCARD", "2", "a", "b", "LIMIT", "1"]),
            ["a", "b"]
        );
        assert!(keys(&["SINTERCARD", "x", "a"]).is_empty());
        assert!(keys(&["SINTERCARD", "3", "a"]).is_empty());
        assert!(keys(&["KEYS", "*"]).is_empty());
        assert!(keys(&["PING"]).is_empty());
    }

    #[test]
    fn blocking_times() {
        let blpop = crate::table::lookup(b"blpop").expect("blpop");
        assert_eq!(
            block_time(blpop, &args(&["BLPOP", "a", "1.5"])),
            Some(Some(Duration::from_millis(1500)))
        );
        assert_eq!(block_time(blpop, &args(&["BLPOP", "a", "0"])), Some(None));
        assert_eq!(block_time(blpop, &args(&["BLPOP", "a", "x"])), None);
        let get = crate::table::lookup(b"get").expect("get");
        assert_eq!(block_time(get, &args(&["GET", "0"])), None);
    }

    #[test]
    fn reply_lengths() {
        for whole in [
            &b"+OK\r\n"[..],
            b"-ERR x\r\n",
            b":12\r\n",
            b"$3\r\nfoo\r\n",
            b"$-1\r\n",
            b"*-1\r\n",
            b"*0\r\n",
            b"*2\r\n$1\r\na\r\n*1\r\n:1\r\n",
            b"%1\r\n+a\r\n~2\r\n:1\r\n_\r\n",
            b"|1\r\n+k\r\n+v\r\n$2\r\nab\r\n",
            b"=8\r\ntxt:ab\r\n\r\n",
        ] {
            assert_eq!(reply_len(whole), Ok(Some(whole.len())), "{whole:?}");
            for cut in 0..whole.len() {
                assert_eq!(reply_len(&whole[..cut]), Ok(None), "{whole:?} cut at {cut}");
            }
            let mut two = whole.to_vec();
            two.extend_from_slice(b"+next\r\n");
            assert_eq!(reply_len(&two), Ok(Some(whole.len())));
        }
        assert!(reply_len(b"?\r\n").is_err());
        assert!(reply_len(b"$x\r\n").is_err());
    }
}

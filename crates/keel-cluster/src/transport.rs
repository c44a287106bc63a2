//! The node-to-node transport: carries [`crate::txn::Message`]s (or any serde type) between the
//! nodes of a cluster over TCP, for a sans-IO driver that owns the protocol state.
//!
//! Shape. Every node dials its own outbound connection to every other node and only writes to
//! it; what a node receives comes on the connections its peers dialed. So there is one
//! connection per *ordered* pair of nodes, and no tie-break between two nodes dialing each
//! other at once. A peer is *up* while this node's outbound connection to it is established.
//!
//! Handshake. The dialer sends a fixed 32-byte hello (magic, [`VERSION`], the
//! [`Membership::digest`], its node index, the index it meant to reach, its incarnation); the
//! acceptor reads it and always answers with its own hello before it checks, so both sides see
//! both values. Any disagreement (version, digest, who is who) closes the connection; each
//! side logs it and reports [`Event::Refused`] naming both values, and the dialer retries with
//! backoff (the driver decides whether a refusal is fatal: `docs/cluster.md`, "Configuration
//! checks").
//!
//! Frames. After the handshake the dialer writes frames: a big-endian `u32` length, then that
//! many bytes of postcard-encoded messages back to back. [`Transport::send`] encodes at once
//! (the caller keeps its message for resending) and queues the bytes for the peer's writer; the
//! writer drains everything queued into one frame and one write, up to
//! [`Config::frame_bytes_max`]. A receiver rejects a longer frame, or one that does not decode,
//! and closes that connection only ([`Event::Broken`]).
//!
//! Batches. A driver that handles several events in a row sends with [`Transport::hold`] and
//! then calls [`Transport::release`]: the held messages go to each peer's queue as one entry,
//! so they leave in one frame and wake the writer once, however quickly the writer runs.
//! (Queued one by one, a writer on another thread wakes at the first message and writes it
//! alone: a frame, a `send` and a wake-up of the peer per message.)
//!
//! Bounds. `send` never blocks: each peer's queue holds [`Config::queue_max`] entries (a
//! message, or a released batch), and an entry that does not fit is dropped and its messages
//! counted ([`Stats::dropped`]); the protocol resends.
//! Messages queued while a peer is down wait in the queue and go out once it is up again; those
//! in a frame whose write failed are lost. Received messages wait in the event channel
//! ([`Config::events_max`]); when it is full the readers stop reading, so TCP pushes back on
//! the senders, whose queues then drop.
//!
//! This module knows nothing of transactions, and never reorders the messages of one sender to
//! one receiver on one connection. It does not resolve addresses: the caller gives every
//! node's transport address, by index.

use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::Membership;
use crate::txn::Peer;

#[cfg(test)]
mod tests;

/// The transport protocol's version, compared at the handshake. 2: a commit decision carries
/// every participant's prepare, and participants ask each other (`PeerInquire`,
/// `NoYesVote`). 3: a yes vote says whether the work only read. 4: the server's work
/// carries whether a reader's prepare may wait (`patient`).
pub const VERSION: u32 = 4;

/// Bytes a connection's reader takes from the socket at once, at most.
const READ_BUFFER_BYTES: usize = 64 * 1024;

/// The first bytes of every hello.
const MAGIC: [u8; 8] = *b"KEELBUS\0";

/// Bytes of a hello: magic, version, digest, from, to, incarnation.
const HELLO_BYTES: usize = 8 + 4 + 8 + 2 + 2 + 8;

/// Bounds and timers.
#[derive(Debug, Clone)]
pub struct Config {
    /// Largest frame a node sends or accepts (payload bytes, after the length). A single
    /// encoded message must fit, or `send` refuses it.
    pub frame_bytes_max: u32,
    /// Entries (messages, or batches of them) queued per peer before `send` drops.
    pub queue_max: usize,
    /// Events waiting for the driver before readers stop reading.
    pub events_max: usize,
    /// Incoming connections at once (handshaking or established); more are closed at once.
    pub incoming_max: usize,
    /// How long a dial plus handshake may take.
    pub connect_timeout: Duration,
    /// How long one frame's write may take before the connection counts as broken (a peer
    /// that stopped reading, or a dead host).
    pub write_timeout: Duration,
    /// First wait before redialing a peer that is down or refused; doubled per failure.
    pub backoff_min: Duration,
    /// Longest wait between dials.
    pub backoff_max: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            // A transaction's work and replies are bounded by the engine's 1 MiB of prepare
            // metadata and Redis' 512 MB values; 64 MiB covers any batch of the former.
            frame_bytes_max: 64 << 20,
            queue_max: 4096,
            events_max: 4096,
            // A peer has one at a time, two while its restart is noticed.
            incoming_max: 256,
            connect_timeout: Duration::from_secs(2),
            write_timeout: Duration::from_secs(10),
            backoff_min: Duration::from_millis(20),
            backoff_max: Duration::from_secs(1),
        }
    }
}

/// What happens to a connection that ends it, or keeps it from starting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The other side does not speak this protocol.
    #[error("not a keel cluster transport: the hello starts {found:02x?}")]
    Magic {
        /// The first bytes it sent.
        found: [u8; 8],
    },
    /// The protocol versions differ.
    #[error("protocol version {theirs} at the peer, {ours} here")]
    Version {
        /// This node's [`VERSION`].
        ours: u32,
        /// The peer's.
        theirs: u32,
    },
    /// The cluster configurations differ.
    #[error(
        "config digest {theirs:016x} at the peer, {ours:016x} here: the nodes hold different cluster configs"
    )]
    Digest {
        /// This node's [`Membership::digest`].
        ours: u64,
        /// The peer's.
        theirs: u64,
    },
    /// The peer is not who it should be: a dialed address answered as another node, or a
    /// dialer named a node index that does not exist, is this node, or is not this node's
    /// index as the target.
    #[error(
        "the peer says it is node#{from} reaching node#{to}, expected node#{expected_from} reaching node#{expected_to}"
    )]
    Identity {
        /// The node index it claims.
        from: u16,
        /// The node index it meant to reach.
        to: u16,
        /// What this node expected as `from` (`u16::MAX`: any other node).
        expected_from: u16,
        /// What this node expected as `to`.
        expected_to: u16,
    },
    /// A frame longer than [`Config::frame_bytes_max`].
    #[error("frame of {len} bytes, over the limit of {max}")]
    FrameTooLarge {
        /// Its announced length.
        len: u32,
        /// The limit.
        max: u32,
    },
    /// A frame that does not decode.
    #[error("undecodable frame: {0}")]
    Decode(String),
    /// The connection closed or failed.
    #[error("connection: {0}")]
    Io(String),
    /// A step took longer than its timeout.
    #[error("timed out {0}")]
    Timeout(&'static str),
    /// The peer wrote on a connection it should only read.
    #[error("unexpected bytes from the accepting side")]
    Unexpected,
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e.to_string())
    }
}

/// Why [`Transport::send`] did not queue a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// Not a node of the cluster, or this node itself (the driver delivers its own messages).
    #[error("no peer {0}")]
    NoPeer(Peer),
    /// The encoded message exceeds the frame limit.
    #[error("message of {len} bytes, over the frame limit of {max}")]
    TooLarge {
        /// Its encoded length.
        len: usize,
        /// [`Config::frame_bytes_max`].
        max: u32,
    },
    /// The peer's queue is full; the message was dropped (and counted).
    #[error("queue to {0} is full")]
    Full(Peer),
    /// The message does not encode.
    #[error("cannot encode: {0}")]
    Encode(String),
}

/// What the transport tells its driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event<M> {
    /// A message from a peer, whose process has this incarnation.
    Received {
        /// The sender.
        from: Peer,
        /// The sender's incarnation, from its handshake.
        incarnation: u64,
        /// The message.
        message: M,
    },
    /// This node's connection to `peer` is established; `incarnation` is the peer process'
    /// (a different one than at its last `PeerUp` means it restarted).
    PeerUp {
        /// The peer.
        peer: Peer,
        /// Its incarnation.
        incarnation: u64,
    },
    /// This node's connection to `peer`, up before, broke; redialing.
    PeerDown {
        /// The peer.
        peer: Peer,
        /// Why.
        why: Error,
    },
    /// A handshake failed (a disagreement, not an unreachable peer). `peer` is the node dialed,
    /// or the one an incoming dialer claimed to be if that is a node of the cluster. A
    /// disagreement with a known peer is reported once per direction until it changes or a
    /// handshake succeeds, however often the dialer retries.
    Refused {
        /// The peer, when known.
        peer: Option<Peer>,
        /// The remote address.
        addr: SocketAddr,
        /// The disagreement.
        why: Error,
    },
    /// An incoming connection was closed for a bad frame; the others carry on.
    Broken {
        /// The sender.
        peer: Peer,
        /// What was wrong.
        why: Error,
    },
}

/// Counters since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Frames written.
    pub frames_sent: u64,
    /// Messages in them.
    pub messages_sent: u64,
    /// Frames read.
    pub frames_received: u64,
    /// Messages in them.
    pub messages_received: u64,
    /// Messages dropped by `send` or `release` because the peer's queue was full.
    pub dropped: u64,
}

/// A handle on a transport's counters, for whoever reports them ([`Transport::stats_handle`]).
#[derive(Clone, Default)]
pub struct StatsHandle(Arc<Counters>);

impl StatsHandle {
    /// The counters now.
    pub fn read(&self) -> Stats {
        let c = &self.0;
        Stats {
            frames_sent: c.frames_sent.load(Ordering::Relaxed),
            messages_sent: c.messages_sent.load(Ordering::Relaxed),
            frames_received: c.frames_received.load(Ordering::Relaxed),
            messages_received: c.messages_received.load(Ordering::Relaxed),
            dropped: c.dropped.load(Ordering::Relaxed),
        }
    }
}

impl fmt::Debug for StatsHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.read().fmt(f)
    }
}

#[derive(Default)]
struct Counters {
    frames_sent: AtomicU64,
    messages_sent: AtomicU64,
    frames_received: AtomicU64,
    messages_received: AtomicU64,
    dropped: AtomicU64,
}

/// Who this node is, as the hello says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Hello {
    magic: [u8; 8],
    version: u32,
    digest: u64,
    from: u16,
    to: u16,
    incarnation: u64,
}

impl Hello {
    fn encode(&self) -> [u8; HELLO_BYTES] {
        let mut b = [0u8; HELLO_BYTES];
        b[0..8].copy_from_slice(&self.magic);
        b[8..12].copy_from_slice(&self.version.to_be_bytes());
        b[12..20].copy_from_slice(&self.digest.to_be_bytes());
        b[20..22].copy_from_slice(&self.from.to_be_bytes());
        b[22..24].copy_from_slice(&self.to.to_be_bytes());
        b[24..32].copy_from_slice(&self.incarnation.to_be_bytes());
        b
    }

    fn decode(b: &[u8; HELLO_BYTES]) -> Hello {
        let take = |r: std::ops::Range<usize>| &b[r];
        Hello {
            magic: take(0..8).try_into().expect("8 bytes"),
            version: u32::from_be_bytes(take(8..12).try_into().expect("4 bytes")),
            digest: u64::from_be_bytes(take(12..20).try_into().expect("8 bytes")),
            from: u16::from_be_bytes(take(20..22).try_into().expect("2 bytes")),
            to: u16::from_be_bytes(take(22..24).try_into().expect("2 bytes")),
            incarnation: u64::from_be_bytes(take(24..32).try_into().expect("8 bytes")),
        }
    }

    /// Checks the magic, version and digest of `theirs` against `self`.
    fn agree(&self, theirs: &Hello) -> Result<(), Error> {
        if theirs.magic != MAGIC {
            return Err(Error::Magic {
                found: theirs.magic,
            });
        }
        if theirs.version != self.version {
            return Err(Error::Version {
                ours: self.version,
                theirs: theirs.version,
            });
        }
        if theirs.digest != self.digest {
            return Err(Error::Digest {
                ours: self.digest,
                theirs: theirs.digest,
            });
        }
        Ok(())
    }
}

/// What every task shares.
struct Shared<M> {
    myself: u16,
    nodes: u16,
    digest: u64,
    incarnation: u64,
    config: Config,
    counters: Arc<Counters>,
    events: mpsc::Sender<Event<M>>,
    /// The last refusal reported for an incoming dialer claiming each node index, so that a
    /// misconfigured peer redialing is reported once (cleared by a good handshake).
    refused_incoming: Mutex<Vec<Option<Error>>>,
}

impl<M> Shared<M> {
    fn hello(&self, to: u16) -> Hello {
        Hello {
            magic: MAGIC,
            version: VERSION,
            digest: self.digest,
            from: self.myself,
            to,
            incarnation: self.incarnation,
        }
    }
}

/// Appends to a borrowed buffer: what `postcard::to_extend` writes into.
struct Append<'a>(&'a mut Vec<u8>);

impl Extend<u8> for Append<'_> {
    fn extend<I: IntoIterator<Item = u8>>(&mut self, bytes: I) {
        self.0.extend(bytes);
    }
}

/// Encoded messages back to back, queued for a peer's writer as one entry.
#[derive(Debug, Default)]
struct Batch {
    bytes: Vec<u8>,
    /// How many messages `bytes` holds.
    count: u64,
}

/// A running transport. Dropping it stops every task and closes every connection.
pub struct Transport<M> {
    shared: Arc<Shared<M>>,
    /// One queue of encoded messages per node; `None` for this node.
    queues: Vec<Option<mpsc::Sender<Batch>>>,
    /// Per node, the messages [`Transport::hold`] keeps until [`Transport::release`].
    held: Vec<Batch>,
    local: SocketAddr,
    tasks: JoinSet<()>,
}

impl<M> fmt::Debug for Transport<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transport")
            .field("myself", &self.shared.myself)
            .field("local", &self.local)
            .finish_non_exhaustive()
    }
}

impl<M> Transport<M>
where
    M: Serialize + DeserializeOwned + Send + 'static,
{
    /// Starts the transport of node `membership.myself()` with process incarnation
    /// `incarnation`, accepting on `listener` and dialing node `i` at `addrs[i]` (every node's
    /// transport address, by index, this node's included and ignored). Must run inside a tokio
    /// runtime.
    ///
    /// # Panics
    ///
    /// If `addrs` does not have one address per node, or the cluster has more than
    /// `u16::MAX` nodes.
    pub fn start(
        membership: &Membership,
        addrs: &[SocketAddr],
        incarnation: u64,
        listener: TcpListener,
        config: Config,
    ) -> std::io::Result<(Transport<M>, mpsc::Receiver<Event<M>>)> {
        assert_eq!(
            addrs.len(),
            membership.nodes().len(),
            "one transport address per node"
        );
        let nodes = u16::try_from(addrs.len()).expect("at most u16::MAX nodes");
        let myself = u16::try_from(membership.myself()).expect("index below the node count");
        let local = listener.local_addr()?;
        let (events, events_rx) = mpsc::channel(config.events_max.max(1));
        let shared = Arc::new(Shared {
            myself,
            nodes,
            digest: membership.digest(),
            incarnation,
            config,
            counters: Arc::default(),
            events,
            refused_incoming: Mutex::new(vec![None; addrs.len()]),
        });
        let mut tasks = JoinSet::new();
        tasks.spawn(accept(Arc::clone(&shared), listener));
        let mut queues = Vec::with_capacity(addrs.len());
        for (i, addr) in addrs.iter().enumerate() {
            let i = u16::try_from(i).expect("checked above");
            if i == myself {
                queues.push(None);
                continue;
            }
            let (tx, rx) = mpsc::channel(shared.config.queue_max.max(1));
            queues.push(Some(tx));
            tasks.spawn(dial(Arc::clone(&shared), i, *addr, rx));
        }
        let held = addrs.iter().map(|_| Batch::default()).collect();
        Ok((
            Transport {
                shared,
                queues,
                held,
                local,
                tasks,
            },
            events_rx,
        ))
    }

    /// Binds `listen` and [`Transport::start`]s on it.
    pub async fn bind(
        membership: &Membership,
        addrs: &[SocketAddr],
        incarnation: u64,
        listen: SocketAddr,
        config: Config,
    ) -> std::io::Result<(Transport<M>, mpsc::Receiver<Event<M>>)> {
        let listener = TcpListener::bind(listen).await?;
        Transport::start(membership, addrs, incarnation, listener, config)
    }

    /// Queues `message` for `peer`, never waiting: it is encoded now, and dropped (counted in
    /// [`Stats::dropped`]) if the peer's queue is full.
    pub fn send(&self, peer: Peer, message: &M) -> Result<(), SendError> {
        let queue = self.queue(peer)?;
        let bytes = self.encode(message)?;
        self.enqueue(peer, queue, Batch { bytes, count: 1 })
    }

    /// Keeps `message` for `peer` until [`Transport::release`], which queues everything kept
    /// for a peer as one entry (one frame, one wake-up of its writer). It is encoded now; a
    /// kept batch that would outgrow a frame is queued first.
    pub fn hold(&mut self, peer: Peer, message: &M) -> Result<(), SendError> {
        self.queue(peer)?;
        let max = self.shared.config.frame_bytes_max as usize;
        let i = usize::from(peer.0);
        // Encoded straight onto the peer's batch.
        let start = self.held[i].bytes.len();
        if let Err(e) = postcard::to_extend(message, Append(&mut self.held[i].bytes)) {
            self.held[i].bytes.truncate(start);
            return Err(SendError::Encode(e.to_string()));
        }
        let len = self.held[i].bytes.len() - start;
        if len > max {
            self.held[i].bytes.truncate(start);
            return Err(SendError::TooLarge {
                len,
                max: self.shared.config.frame_bytes_max,
            });
        }
        if start + len > max {
            // The batch would outgrow a frame: what came before goes first.
            let bytes = self.held[i].bytes.split_off(start);
            self.release_one(i)?;
            self.held[i].bytes = bytes;
        }
        self.held[i].count += 1;
        Ok(())
    }

    /// Queues what [`Transport::hold`] kept, one entry per peer. A peer whose queue is full
    /// loses its batch (counted in [`Stats::dropped`]); the others still get theirs.
    pub fn release(&mut self) {
        for i in 0..self.held.len() {
            if let Err(e) = self.release_one(i) {
                tracing::debug!("cluster transport: a held batch was dropped: {e}");
            }
        }
    }

    fn release_one(&mut self, i: usize) -> Result<(), SendError> {
        if self.held[i].count == 0 {
            return Ok(());
        }
        let peer = Peer(u16::try_from(i).expect("at most u16::MAX nodes"));
        let batch = std::mem::take(&mut self.held[i]);
        let queue = self.queue(peer)?;
        self.enqueue(peer, queue, batch)
    }

    fn queue(&self, peer: Peer) -> Result<&mpsc::Sender<Batch>, SendError> {
        self.queues
            .get(usize::from(peer.0))
            .and_then(Option::as_ref)
            .ok_or(SendError::NoPeer(peer))
    }

    fn encode(&self, message: &M) -> Result<Vec<u8>, SendError> {
        let bytes = postcard::to_stdvec(message).map_err(|e| SendError::Encode(e.to_string()))?;
        let max = self.shared.config.frame_bytes_max;
        if u32::try_from(bytes.len()).map_or(true, |len| len > max) {
            return Err(SendError::TooLarge {
                len: bytes.len(),
                max,
            });
        }
        Ok(bytes)
    }

    fn enqueue(
        &self,
        peer: Peer,
        queue: &mpsc::Sender<Batch>,
        batch: Batch,
    ) -> Result<(), SendError> {
        let count = batch.count;
        match queue.try_send(batch) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.shared
                    .counters
                    .dropped
                    .fetch_add(count, Ordering::Relaxed);
                Err(SendError::Full(peer))
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                unreachable!("a peer's writer lives as long as the transport")
            }
        }
    }
}

impl<M> Transport<M> {
    /// The address the transport accepts on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The counters.
    pub fn stats(&self) -> Stats {
        self.stats_handle().read()
    }

    /// A handle that reads the counters while the driver owns the transport.
    pub fn stats_handle(&self) -> StatsHandle {
        StatsHandle(Arc::clone(&self.shared.counters))
    }

    /// Stops every task and waits until they are gone (their sockets closed).
    pub async fn shutdown(mut self) {
        self.tasks.shutdown().await;
    }
}

/// Accepts connections, each served by a reader task. Aborting it aborts them (the `JoinSet`
/// is dropped with the future).
async fn accept<M>(shared: Arc<Shared<M>>, listener: TcpListener)
where
    M: DeserializeOwned + Send + 'static,
{
    let mut readers = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, addr)) if readers.len() < shared.config.incoming_max => {
                    readers.spawn(read(Arc::clone(&shared), stream, addr));
                }
                Ok((stream, addr)) => {
                    tracing::warn!(%addr, max = shared.config.incoming_max, "cluster transport: too many incoming connections, closing one");
                    drop(stream);
                }
                Err(e) => {
                    // Out of descriptors and the like: wait instead of spinning.
                    tracing::warn!(error = %e, "cluster transport: accept failed");
                    tokio::time::sleep(shared.config.backoff_min).await;
                }
            },
            Some(_) = readers.join_next(), if !readers.is_empty() => {}
        }
    }
}

/// Serves one incoming connection: the handshake, then frames until it ends.
async fn read<M>(shared: Arc<Shared<M>>, mut stream: TcpStream, addr: SocketAddr)
where
    M: DeserializeOwned + Send + 'static,
{
    let _ = stream.set_nodelay(true);
    let theirs = match tokio::time::timeout(shared.config.connect_timeout, async {
        let mut b = [0u8; HELLO_BYTES];
        stream.read_exact(&mut b).await?;
        let theirs = Hello::decode(&b);
        stream
            .write_all(&shared.hello(theirs.from).encode())
            .await?;
        Ok::<_, Error>(theirs)
    })
    .await
    {
        Ok(Ok(theirs)) => theirs,
        Ok(Err(e)) => {
            tracing::debug!(%addr, error = %e, "cluster transport: incoming handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!(%addr, "cluster transport: incoming handshake timed out");
            return;
        }
    };
    let ours = shared.hello(theirs.from);
    let valid_from = theirs.from < shared.nodes && theirs.from != shared.myself;
    let check = ours.agree(&theirs).and_then(|()| {
        if valid_from && theirs.to == shared.myself {
            Ok(())
        } else {
            Err(Error::Identity {
                from: theirs.from,
                to: theirs.to,
                expected_from: u16::MAX,
                expected_to: shared.myself,
            })
        }
    });
    let peer = Peer(theirs.from);
    let known = valid_from.then_some(usize::from(theirs.from));
    let repeated = {
        let mut last = shared
            .refused_incoming
            .lock()
            .expect("no panic while holding it");
        match (known, &check) {
            (Some(i), Err(why)) if last[i].as_ref() == Some(why) => true,
            (Some(i), Err(why)) => {
                last[i] = Some(why.clone());
                false
            }
            (Some(i), Ok(())) => {
                last[i] = None;
                false
            }
            (None, _) => false,
        }
    };
    if let Err(why) = check {
        if repeated {
            tracing::debug!(%addr, error = %why, "cluster transport: refused an incoming connection again");
            return;
        }
        tracing::error!(%addr, error = %why, "cluster transport: refused an incoming connection");
        let peer = known.map(|_| peer);
        let _ = shared.events.send(Event::Refused { peer, addr, why }).await;
        return;
    }
    let why = match read_frames(&shared, &mut stream, peer, theirs.incarnation).await {
        Ok(()) => return,
        Err(why @ (Error::FrameTooLarge { .. } | Error::Decode(_))) => why,
        Err(e) => {
            tracing::debug!(%peer, error = %e, "cluster transport: incoming connection ended");
            return;
        }
    };
    tracing::warn!(%peer, %addr, error = %why, "cluster transport: closed an incoming connection");
    let _ = shared.events.send(Event::Broken { peer, why }).await;
}

/// Reads frames and hands their messages to the driver; `Ok` at a clean end of stream, or
/// when the driver is gone.
async fn read_frames<M>(
    shared: &Shared<M>,
    stream: &mut TcpStream,
    peer: Peer,
    incarnation: u64,
) -> Result<(), Error>
where
    M: DeserializeOwned,
{
    let max = shared.config.frame_bytes_max;
    let mut buf = Vec::new();
    // Frames are read through a buffer: one `recv` takes every frame that has arrived, where
    // reading each frame's length and then its body straight from the socket made two or
    // three system calls per frame (the last finding nothing), 89% of a busy node's `recv`s.
    let mut stream = tokio::io::BufReader::with_capacity(READ_BUFFER_BYTES, stream);
    loop {
        let mut len = [0u8; 4];
        match stream.read_exact(&mut len).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        let len = u32::from_be_bytes(len);
        if len > max {
            return Err(Error::FrameTooLarge { len, max });
        }
        buf.resize(len as usize, 0);
        stream.read_exact(&mut buf).await?;
        shared
            .counters
            .frames_received
            .fetch_add(1, Ordering::Relaxed);
        // Decode the whole frame before delivering any of it: a frame is delivered whole or
        // not at all.
        let mut rest = &buf[..];
        let mut messages = Vec::new();
        while !rest.is_empty() {
            let (message, tail) =
                postcard::take_from_bytes::<M>(rest).map_err(|e| Error::Decode(e.to_string()))?;
            messages.push(message);
            rest = tail;
        }
        if messages.is_empty() {
            return Err(Error::Decode("an empty frame".to_owned()));
        }
        shared
            .counters
            .messages_received
            .fetch_add(messages.len() as u64, Ordering::Relaxed);
        if buf.capacity() > 1 << 20 {
            // One large frame does not pin its buffer for the connection's life.
            buf = Vec::new();
        }
        for message in messages {
            let event = Event::Received {
                from: peer,
                incarnation,
                message,
            };
            if shared.events.send(event).await.is_err() {
                return Ok(());
            }
        }
    }
}

/// Keeps this node's connection to `peer` up and writes its queue to it.
async fn dial<M>(
    shared: Arc<Shared<M>>,
    peer: u16,
    addr: SocketAddr,
    mut queue: mpsc::Receiver<Batch>,
) where
    M: Send + 'static,
{
    let config = &shared.config;
    let mut backoff = config.backoff_min;
    let mut last_refusal: Option<Error> = None;
    // An entry taken from the queue that did not fit in the last frame.
    let mut pending: Option<Batch> = None;
    loop {
        match tokio::time::timeout(config.connect_timeout, connect(&shared, peer, addr)).await {
            Ok(Ok((stream, incarnation))) => {
                backoff = config.backoff_min;
                last_refusal = None;
                tracing::info!(peer = %Peer(peer), %addr, incarnation, "cluster transport: peer up");
                if shared
                    .events
                    .send(Event::PeerUp {
                        peer: Peer(peer),
                        incarnation,
                    })
                    .await
                    .is_err()
                {
                    return;
                }
                let why = write_frames(&shared, stream, &mut queue, &mut pending).await;
                tracing::warn!(peer = %Peer(peer), %addr, error = %why, "cluster transport: peer down");
                let down = Event::PeerDown {
                    peer: Peer(peer),
                    why,
                };
                if shared.events.send(down).await.is_err() {
                    return;
                }
            }
            Ok(Err(why @ (Error::Io(_) | Error::Timeout(_)))) => {
                tracing::debug!(peer = %Peer(peer), %addr, error = %why, "cluster transport: dial failed");
            }
            Ok(Err(why)) => {
                tracing::error!(peer = %Peer(peer), %addr, error = %why, "cluster transport: refused");
                if last_refusal.as_ref() != Some(&why) {
                    last_refusal = Some(why.clone());
                    let event = Event::Refused {
                        peer: Some(Peer(peer)),
                        addr,
                        why,
                    };
                    if shared.events.send(event).await.is_err() {
                        return;
                    }
                }
            }
            Err(_) => {
                tracing::debug!(peer = %Peer(peer), %addr, "cluster transport: dial timed out");
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(config.backoff_max);
    }
}

/// Dials `addr` and shakes hands; the peer's incarnation on success.
async fn connect<M>(
    shared: &Shared<M>,
    peer: u16,
    addr: SocketAddr,
) -> Result<(TcpStream, u64), Error> {
    let mut stream = TcpStream::connect(addr).await?;
    // Dialing a port of this machine that nobody listens on can connect the socket to itself
    // (TCP simultaneous open, when the kernel picks the target port as the source port): the
    // socket then holds the very port its peer wants to listen on. Drop it at once.
    if stream.local_addr()? == stream.peer_addr()? {
        return Err(Error::Io(format!(
            "{addr}: connected to itself, nobody listens there"
        )));
    }
    stream.set_nodelay(true)?;
    let ours = shared.hello(peer);
    stream.write_all(&ours.encode()).await?;
    let mut b = [0u8; HELLO_BYTES];
    stream.read_exact(&mut b).await?;
    let theirs = Hello::decode(&b);
    ours.agree(&theirs)?;
    if theirs.from != peer || theirs.to != shared.myself {
        return Err(Error::Identity {
            from: theirs.from,
            to: theirs.to,
            expected_from: peer,
            expected_to: shared.myself,
        });
    }
    Ok((stream, theirs.incarnation))
}

/// Writes frames until the connection fails (the reason returned). Each frame holds everything
/// queued when it is built, up to the frame limit.
async fn write_frames<M>(
    shared: &Shared<M>,
    stream: TcpStream,
    queue: &mut mpsc::Receiver<Batch>,
    pending: &mut Option<Batch>,
) -> Error {
    let (mut rd, mut wr) = stream.into_split();
    let max = shared.config.frame_bytes_max as usize;
    let mut frame: Vec<u8> = Vec::new();
    let mut probe = [0u8; 1];
    loop {
        let first = match pending.take() {
            Some(first) => first,
            None => tokio::select! {
                // The accepting side never writes: a read ends only when the connection does.
                read = rd.read(&mut probe) => return match read {
                    Ok(0) => Error::Io("closed by the peer".to_owned()),
                    Ok(_) => Error::Unexpected,
                    Err(e) => e.into(),
                },
                next = queue.recv() => match next {
                    Some(first) => first,
                    // The transport is gone, and this task is being aborted.
                    None => return Error::Io("transport stopped".to_owned()),
                },
            },
        };
        frame.clear();
        frame.extend_from_slice(&[0; 4]);
        frame.extend_from_slice(&first.bytes);
        let mut count = first.count;
        while let Ok(next) = queue.try_recv() {
            if frame.len() - 4 + next.bytes.len() > max {
                *pending = Some(next);
                break;
            }
            frame.extend_from_slice(&next.bytes);
            count += next.count;
        }
        let len = u32::try_from(frame.len() - 4).expect("at most frame_bytes_max");
        frame[..4].copy_from_slice(&len.to_be_bytes());
        match tokio::time::timeout(shared.config.write_timeout, wr.write_all(&frame)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return e.into(),
            Err(_) => return Error::Timeout("writing a frame"),
        }
        shared.counters.frames_sent.fetch_add(1, Ordering::Relaxed);
        shared
            .counters
            .messages_sent
            .fetch_add(count, Ordering::Relaxed);
    }
}

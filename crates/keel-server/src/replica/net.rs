//! Raft's RPCs between a partition's replicas, and requests forwarded to its leader: each a
//! `KEEL.RAFT <partition> <kind> <payload>` request on the other node's client port (the
//! cluster's pooled connections, `cluster::Cluster::exchange`), its answer an encoded
//! (postcard) bulk string.

use std::sync::Weak;
use std::time::Duration;

use bytes::Bytes;
use openraft::BasicNode;
use openraft::error::{NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Part, Refused, Request, Response, Tc};
use crate::reply::Proto;
use crate::server::Shared;

/// A call to another node failed.
#[derive(Debug)]
pub enum CallError {
    /// The request was never sent (the node cannot be reached).
    Unsent(String),
    /// It was sent and no answer came back: it may or may not have run.
    Lost(String),
}

/// Sends `KEEL.RAFT p kind payload` to node `node` and returns the answer's bytes; waits at
/// most `wait` (default: the cluster's request timeout).
pub async fn call_node(
    shared: &Shared,
    node: usize,
    p: usize,
    kind: &str,
    payload: &[u8],
    wait: Option<Duration>,
) -> Result<Vec<u8>, CallError> {
    let cluster = shared.cluster.as_ref().expect("cluster mode");
    let request = [
        Bytes::from_static(b"KEEL.RAFT"),
        Bytes::from(header(shared, p)),
        Bytes::copy_from_slice(kind.as_bytes()),
        Bytes::copy_from_slice(payload),
    ];
    let password = shared.requirepass.read().clone();
    let wait = wait.unwrap_or_else(|| cluster.map().timeout());
    let began = std::time::Instant::now();
    let reply = cluster
        .exchange(node, &[&request], Proto::Resp2, password, Some(Some(wait)))
        .await;
    cluster.rpc.of(node).record(began.elapsed(), reply.is_ok());
    let reply = reply.map_err(|down| {
        if down.sent {
            CallError::Lost(down.text)
        } else {
            CallError::Unsent(down.text)
        }
    })?;
    parse_bulk(&reply).map_err(CallError::Lost)
}

/// A `KEEL.RAFT` request's second argument: `<partition>/<layout digest>/<view epoch>/<sender>`
/// (the layout digest is `Replication::layout`, known before replication has started; the
/// receiver fetches the sender's view if it is newer than its own).
fn header(shared: &Shared, p: usize) -> String {
    let map = shared.cluster.as_ref().expect("cluster mode").map();
    let layout = super::layout(map.digest(), shared.config.replicas);
    let epoch = shared
        .replication
        .get()
        .map_or(0, |rep| rep.view.read().epoch);
    format!("{p}/{layout:016x}/{epoch}/{}", map.myself())
}

/// The contents of a RESP bulk string reply, or the error it carries.
fn parse_bulk(reply: &[u8]) -> Result<Vec<u8>, String> {
    match reply.first() {
        Some(b'$') => {
            let end = reply
                .windows(2)
                .position(|w| w == b"\r\n")
                .ok_or("a truncated reply")?;
            let len: usize = std::str::from_utf8(&reply[1..end])
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or("a bad bulk length")?;
            reply
                .get(end + 2..end + 2 + len)
                .map(<[u8]>::to_vec)
                .ok_or_else(|| "a truncated reply".to_owned())
        }
        Some(b'-') => Err(String::from_utf8_lossy(&reply[1..]).trim_end().to_owned()),
        _ => Err("an unexpected reply".to_owned()),
    }
}

/// An open connection to a peer and what was read on it past the last answer.
type Conn = (tokio::net::TcpStream, bytes::BytesMut);

/// Idle connections kept per peer (replication streams, heartbeats, linearizable-read checks
/// that openraft runs on clients of their own).
const IDLE_PER_PEER: usize = 8;

/// Makes a partition's connections to its other replicas.
pub struct Network {
    pub shared: Weak<Shared>,
    pub part: usize,
    /// Idle connections by target node, shared by every client made here: openraft makes a
    /// new client for each leadership check, and a TCP connection for each would cost more
    /// than the check.
    pub idle: std::sync::Arc<parking_lot::Mutex<std::collections::HashMap<usize, Vec<Conn>>>>,
}

/// A partition's connection to one other replica. A connection is taken from the network's
/// idle ones for each RPC and given back after a whole answer; one that failed or timed out
/// is dropped, so that a late answer is never read as another's.
pub struct Peer {
    shared: Weak<Shared>,
    part: usize,
    target: usize,
    idle: std::sync::Arc<parking_lot::Mutex<std::collections::HashMap<usize, Vec<Conn>>>>,
}

impl RaftNetworkFactory<Tc> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: u64, _node: &BasicNode) -> Peer {
        Peer {
            shared: self.shared.clone(),
            part: self.part,
            target: target as usize,
            idle: std::sync::Arc::clone(&self.idle),
        }
    }
}

impl Peer {
    /// Sends one `KEEL.RAFT` request on this peer's connection (opening it if needed) and
    /// returns the answer's bytes, within `wait`.
    async fn call(
        &mut self,
        shared: &Shared,
        kind: &str,
        payload: &[u8],
        wait: Duration,
    ) -> Result<Vec<u8>, CallError> {
        let cluster = shared.cluster.as_ref().expect("cluster mode");
        let Some(addr) = cluster.map().nodes().get(self.target).map(|n| n.addr) else {
            return Err(CallError::Unsent(format!(
                "node #{} is not one this node knows yet",
                self.target
            )));
        };
        let pooled = self.idle.lock().get_mut(&self.target).and_then(Vec::pop);
        let mut conn = match pooled {
            Some(c) => c,
            None => {
                let password = shared.requirepass.read().clone();
                let connect = crate::cluster::connect(addr, Proto::Resp2, password);
                match tokio::time::timeout(wait, connect).await {
                    Ok(Ok(stream)) => (stream, bytes::BytesMut::new()),
                    Ok(Err(e)) => return Err(CallError::Unsent(format!("{addr}: {e}"))),
                    Err(_) => return Err(CallError::Unsent(format!("{addr}: connect timed out"))),
                }
            }
        };
        let (stream, input) = &mut conn;
        let mut wire = bytes::BytesMut::with_capacity(payload.len() + 64);
        crate::cluster::encode(
            &[
                Bytes::from_static(b"KEEL.RAFT"),
                Bytes::from(header(shared, self.part)),
                Bytes::copy_from_slice(kind.as_bytes()),
                Bytes::copy_from_slice(payload),
            ],
            &mut wire,
        );
        let exchange = async {
            use tokio::io::AsyncWriteExt as _;
            stream.write_all(&wire).await?;
            crate::cluster::read_reply(stream, input).await
        };
        let reply = match tokio::time::timeout(wait, exchange).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(e)) => return Err(CallError::Lost(format!("{addr}: {e}"))),
            Err(_) => {
                return Err(CallError::Lost(format!(
                    "{addr}: no answer within {} ms",
                    wait.as_millis()
                )));
            }
        };
        if input.is_empty() {
            let mut idle = self.idle.lock();
            let idle = idle.entry(self.target).or_default();
            if idle.len() < IDLE_PER_PEER {
                idle.push(conn);
            }
        }
        parse_bulk(&reply).map_err(CallError::Lost)
    }

    async fn rpc<Q, A, E>(
        &mut self,
        kind: &str,
        request: &Q,
        option: &RPCOption,
    ) -> Result<A, RPCError<u64, BasicNode, E>>
    where
        Q: Serialize,
        A: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let Some(shared) = self.shared.upgrade() else {
            let stopped = std::io::Error::other("this server is stopping");
            return Err(RPCError::Unreachable(Unreachable::new(&stopped)));
        };
        let payload =
            postcard::to_stdvec(request).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let began = std::time::Instant::now();
        let answer = self.call(&shared, kind, &payload, option.hard_ttl()).await;
        if let Some(cluster) = &shared.cluster {
            cluster
                .rpc
                .of(self.target)
                .record(began.elapsed(), answer.is_ok());
        }
        drop(shared);
        match answer {
            Ok(bytes) => {
                let answer: Result<A, E> = postcard::from_bytes(&bytes)
                    .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
                answer.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target as u64, e)))
            }
            Err(CallError::Unsent(text)) => Err(RPCError::Unreachable(Unreachable::new(
                &std::io::Error::other(text),
            ))),
            Err(CallError::Lost(text)) => Err(RPCError::Network(NetworkError::new(
                &std::io::Error::other(text),
            ))),
        }
    }
}

impl RaftNetwork<Tc> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<Tc>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        self.rpc("append", &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<Tc>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<u64>,
        RPCError<u64, BasicNode, RaftError<u64, openraft::error::InstallSnapshotError>>,
    > {
        self.rpc("snapshot", &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        self.rpc("vote", &rpc, &option).await
    }
}

/// Serves one `KEEL.RAFT` request for the hosted partition `part`.
pub async fn serve(part: &Part, kind: &[u8], payload: &[u8]) -> Result<Vec<u8>, String> {
    fn decode<T: DeserializeOwned>(payload: &[u8]) -> Result<T, String> {
        postcard::from_bytes(payload).map_err(|e| format!("ERR keel: a bad KEEL.RAFT payload: {e}"))
    }
    fn encode<T: Serialize>(answer: &T) -> Result<Vec<u8>, String> {
        postcard::to_stdvec(answer).map_err(|e| format!("ERR keel: encoding an answer: {e}"))
    }
    match kind {
        b"append" => encode(&part.raft.append_entries(decode(payload)?).await),
        b"vote" => encode(&super::vote(&part.raft, part.floor, decode(payload)?).await),
        b"snapshot" => encode(&part.inbox.receive(&part.raft, decode(payload)?).await),
        // What the leader knows (`None` from a replica that does not lead), and the leader
        // this replica knows: the partition's voters, how many slots it owns, which, or a
        // digest of its moves.
        b"members" | b"settled" | b"owned" | b"slots" | b"moves" => encode(&(
            part.leader_knows(kind),
            part.raft.metrics().borrow().current_leader,
        )),
        // `WAIT`: how many other voters hold everything this leader applied.
        b"caught" => encode(&part.caught_up()),
        b"write" | b"read" => {
            let request: Request = decode(payload)?;
            let answer: Result<Response, Refused> = part.submit(request, kind == b"read").await;
            encode(&answer)
        }
        // A write with its sender's deadline (Unix ms, the sender's clock).
        _ if let Some(until) = kind.strip_prefix(b"write@") => {
            let until: u64 = std::str::from_utf8(until)
                .ok()
                .and_then(|u| u.parse().ok())
                .ok_or("ERR keel: a bad KEEL.RAFT write deadline")?;
            let request: Request = decode(payload)?;
            encode(&part.submit_until(request, until).await)
        }
        _ => Err(format!(
            "ERR keel: unknown KEEL.RAFT kind '{}'",
            String::from_utf8_lossy(kind)
        )),
    }
}

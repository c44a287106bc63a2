//! The cluster's view: its nodes and where each partition lives, and how it changes when a
//! node joins (`keel serve --cluster-join`) or leaves (`keel cluster remove-node`).
//!
//! A fresh cluster's view is its config: the configured nodes, partition `p` on nodes `p`,
//! `p + 1`, … `p + R - 1` (epoch 0). Each change is an entry of partition 0's log (`Op::View`,
//! applied only if the view there is still the one the change was made from), so changes
//! are serialized and every node that learns epoch `e` learns the same view; nodes pass the
//! newest view they know on (every `KEEL.RAFT` carries its sender's epoch) and keep it in
//! `<dir>/cluster-view`.
//!
//! The view is where partitions *should* be. Where they *are* is each partition's Raft
//! membership, which its leader moves to the view's placement by openraft's joint consensus
//! (a new replica first catches up as a learner). Safety never depends on the view: a node
//! with an old one only routes worse.

use std::collections::BTreeSet;
use std::net::SocketAddr;

use keel_cluster::{Membership, MembershipError, NodeId};
use serde::{Deserialize, Serialize};

/// The view, as stored and sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct View {
    /// Changes made since the config (0: none).
    pub epoch: u64,
    /// The cluster's layout digest (its config and R): a view of another cluster is refused.
    pub layout: u64,
    /// Replicas per partition.
    pub r: usize,
    /// How many of `nodes` the config lists (the others joined later and own no config slot).
    pub configured: usize,
    /// The cluster's request timeout (ms), for nodes that join.
    pub timeout_ms: u64,
    /// Every node the cluster has had, by index; an index is never reused.
    pub nodes: Vec<ViewNode>,
    /// Partition `p`'s nodes. Partition `p` is the one node `p` started (its home): the
    /// config's slots of node `p`, or none for a node that joined.
    pub parts: Vec<Vec<usize>>,
    /// Partition `p`'s nodes when it was created: its Raft group is started with these, and
    /// only while its placement has not changed (a replica added later waits for the leader).
    pub born: Vec<Vec<usize>>,
}

/// A node of the view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ViewNode {
    pub id: String,
    pub addr: String,
    /// Its config slots, as `(start, end)` ranges (none for a node that joined).
    pub slots: Vec<(u16, u16)>,
    /// Removed from the cluster: it hosts nothing and is not listed.
    pub removed: bool,
}

/// Partition `p`'s nodes when `n` nodes keep `r` replicas of each (a fresh cluster).
pub fn placement(p: usize, n: usize, r: usize) -> Vec<usize> {
    (0..r).map(|i| (p + i) % n).collect()
}

impl View {
    /// The view of a fresh cluster: its config.
    pub fn initial(map: &Membership, r: usize, layout: u64) -> View {
        let n = map.nodes().len();
        let parts: Vec<Vec<usize>> = (0..n).map(|p| placement(p, n, r)).collect();
        View {
            epoch: 0,
            layout,
            r,
            configured: n,
            timeout_ms: u64::try_from(map.timeout().as_millis()).unwrap_or(u64::MAX),
            nodes: map
                .nodes()
                .iter()
                .map(|node| ViewNode {
                    id: node.id.to_string(),
                    addr: node.addr.to_string(),
                    slots: node.slots.iter().map(|s| (*s.start(), *s.end())).collect(),
                    removed: false,
                })
                .collect(),
            born: parts.clone(),
            parts,
        }
    }

    /// The index of the node called `id`.
    pub fn index(&self, id: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.id == id)
    }

    /// The nodes that have not been removed.
    pub fn live(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.nodes.len()).filter(|&i| !self.nodes[i].removed)
    }

    /// How many partitions each node hosts.
    fn load(&self) -> Vec<usize> {
        let mut load = vec![0; self.nodes.len()];
        for part in &self.parts {
            for &n in part {
                load[n] += 1;
            }
        }
        load
    }

    /// The live node, not among `except`, hosting the fewest partitions (the lowest index
    /// among equals).
    fn least_loaded(&self, except: &[usize]) -> Option<usize> {
        let load = self.load();
        self.live()
            .filter(|n| !except.contains(n))
            .min_by_key(|&n| (load[n], n))
    }

    /// The configuration this view gives the node at index `me`: the config's nodes and
    /// slots, then the nodes that joined, owning no slot.
    pub fn membership(&self, me: usize) -> Result<Membership, MembershipError> {
        let file = keel_cluster::membership::File {
            myself: None,
            timeout_ms: Some(self.timeout_ms),
            node: self.nodes[..self.configured]
                .iter()
                .map(|n| keel_cluster::membership::FileNode {
                    id: n.id.clone(),
                    addr: n.addr.clone(),
                    slots: n
                        .slots
                        .iter()
                        .map(|(a, b)| format!("{a}-{b}"))
                        .collect::<Vec<_>>()
                        .join(","),
                })
                .collect(),
        };
        let first = self.nodes[0].id.clone();
        let map = Membership::new(file, Some(&first), None)?;
        let added = self.nodes[self.configured..]
            .iter()
            .map(|n| {
                let addr: SocketAddr = n.addr.parse().map_err(|e| MembershipError::BadAddr {
                    node: n.id.clone(),
                    addr: n.addr.clone(),
                    reason: format!("{e}"),
                })?;
                Ok((NodeId::new(&n.id)?, addr))
            })
            .collect::<Result<Vec<_>, MembershipError>>()?;
        let retired: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| self.nodes[i].removed)
            .collect();
        map.extend(&added, me, &retired)
    }

    /// This view with node `id` at `addr` added: a new partition homed there (no slots yet;
    /// `keel cluster rebalance` moves some to it) on it and the R − 1 least loaded nodes,
    /// and replicas of existing partitions moved to it from the most loaded nodes until
    /// every node hosts about as many. `Ok(None)`: the node is in the view already, at that
    /// address.
    pub fn join(&self, id: &str, addr: SocketAddr) -> Result<Option<View>, String> {
        NodeId::new(id).map_err(|e| format!("ERR {e}"))?;
        if let Some(i) = self.index(id) {
            let node = &self.nodes[i];
            if node.removed {
                return Err(format!(
                    "ERR node {id} was removed from this cluster; a node joins under a new id \
                     with an empty --dir"
                ));
            }
            if node.addr != addr.to_string() {
                return Err(format!(
                    "ERR node {id} is in the cluster at {}, not {addr}",
                    node.addr
                ));
            }
            return Ok(None);
        }
        if let Some(other) = self
            .nodes
            .iter()
            .find(|n| !n.removed && n.addr == addr.to_string())
        {
            return Err(format!("ERR {addr} is node {}'s address", other.id));
        }
        if self.nodes.len() >= keel_cluster::membership::NODES_MAX {
            return Err(format!(
                "ERR a cluster has at most {} nodes",
                keel_cluster::membership::NODES_MAX
            ));
        }
        let mut next = self.clone();
        next.epoch += 1;
        let me = next.nodes.len();
        next.nodes.push(ViewNode {
            id: id.to_owned(),
            addr: addr.to_string(),
            slots: Vec::new(),
            removed: false,
        });
        let mut home = vec![me];
        while home.len() < self.r {
            match next.least_loaded(&home) {
                Some(n) => home.push(n),
                None => break,
            }
        }
        next.parts.push(home.clone());
        next.born.push(home);
        // Even the replicas out: move one from a most loaded node while that leaves it no
        // less loaded than the new node.
        loop {
            let load = next.load();
            let Some(from) = next.live().max_by_key(|&n| (load[n], usize::MAX - n)) else {
                break;
            };
            if load[from] <= load[me] + 1 {
                break;
            }
            // Preferably not `from`'s own partition, which `from` most likely leads: a
            // leader that leaves steps down, and its partition waits out an election
            // (openraft 0.9 cannot hand leadership over).
            let movable =
                |p: &usize| next.parts[*p].contains(&from) && !next.parts[*p].contains(&me);
            let Some(p) = (0..next.parts.len())
                .filter(movable)
                .find(|&p| p != from)
                .or_else(|| (0..next.parts.len()).find(movable))
            else {
                break;
            };
            let at = next.parts[p]
                .iter()
                .position(|&n| n == from)
                .expect("contains it");
            next.parts[p][at] = me;
        }
        Ok(Some(next))
    }

    /// This view with node `id` removed: each partition it hosts moves that replica to the
    /// least loaded node that does not host the partition. `Ok(None)`: removed already.
    pub fn remove(&self, id: &str) -> Result<Option<View>, String> {
        let Some(k) = self.index(id) else {
            return Err(format!("ERR no node {id} in this cluster"));
        };
        if self.nodes[k].removed {
            return Ok(None);
        }
        let live = self.live().count();
        if live <= self.r {
            return Err(format!(
                "ERR the cluster has {live} nodes and keeps {} replicas of each partition: \
                 removing one would leave a partition fewer; add a node first",
                self.r
            ));
        }
        let mut next = self.clone();
        next.epoch += 1;
        next.nodes[k].removed = true;
        for p in 0..next.parts.len() {
            if let Some(at) = next.parts[p].iter().position(|&n| n == k) {
                let to = next
                    .least_loaded(&next.parts[p])
                    .ok_or_else(|| format!("ERR no node can take partition {p}'s replica"))?;
                next.parts[p][at] = to;
            }
        }
        Ok(Some(next))
    }

    /// The partitions whose nodes differ between `self` and `other`.
    pub fn moved_parts(&self, other: &View) -> Vec<usize> {
        (0..self.parts.len().max(other.parts.len()))
            .filter(|&p| {
                let set = |v: &View| -> BTreeSet<usize> {
                    v.parts.get(p).into_iter().flatten().copied().collect()
                };
                set(self) != set(other)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(n: usize, r: usize) -> View {
        let addrs: Vec<SocketAddr> = (0..n)
            .map(|i| format!("127.0.0.1:{}", 7001 + i).parse().unwrap())
            .collect();
        let map = Membership::even(&addrs, 0, 2000).unwrap();
        View::initial(&map, r, 42)
    }

    fn loads(v: &View) -> Vec<usize> {
        let load = v.load();
        v.live().map(|n| load[n]).collect()
    }

    #[test]
    fn joins_spread_the_replicas_and_removals_keep_r_of_each() {
        let v = view(3, 3);
        assert_eq!(loads(&v), [3, 3, 3]);
        let v4 = v
            .join("n4", "127.0.0.1:7004".parse().unwrap())
            .unwrap()
            .unwrap();
        assert_eq!(v4.epoch, 1);
        assert_eq!(v4.parts.len(), 4);
        assert_eq!(
            v4.parts[3][0], 3,
            "the new partition's home is the new node"
        );
        assert_eq!(loads(&v4), [3, 3, 3, 3]);
        for part in &v4.parts {
            assert_eq!(part.iter().collect::<BTreeSet<_>>().len(), 3, "{part:?}");
        }
        // Joining again at the same address changes nothing; elsewhere is refused.
        assert_eq!(
            v4.join("n4", "127.0.0.1:7004".parse().unwrap()).unwrap(),
            None
        );
        assert!(v4.join("n4", "127.0.0.1:7009".parse().unwrap()).is_err());
        assert!(v4.join("n9", "127.0.0.1:7004".parse().unwrap()).is_err());
        assert!(
            v4.join("bad id", "127.0.0.1:7010".parse().unwrap())
                .is_err()
        );
        // Four nodes and R = 3: removing one would leave too few.
        let v5 = v4
            .join("n5", "127.0.0.1:7005".parse().unwrap())
            .unwrap()
            .unwrap();
        let spread = loads(&v5);
        assert!(spread.iter().max().unwrap() - spread.iter().min().unwrap() <= 1);
        let gone = v5.remove("node-1").unwrap().unwrap();
        assert!(gone.parts.iter().all(|p| !p.contains(&0)));
        for part in &gone.parts {
            assert_eq!(part.iter().collect::<BTreeSet<_>>().len(), 3, "{part:?}");
        }
        assert_eq!(gone.remove("node-1").unwrap(), None);
        let three = gone.remove("node-2").unwrap().unwrap();
        assert!(three.remove("node-3").is_err(), "3 live nodes keep R = 3");
        assert!(gone.remove("n9").is_err());
        assert!(
            gone.join("node-1", "127.0.0.1:7001".parse().unwrap())
                .is_err(),
            "a removed id does not come back"
        );
        // A new node may take a removed one's address; every node's configuration has it.
        let back = gone
            .join("n7", "127.0.0.1:7001".parse().unwrap())
            .unwrap()
            .unwrap();
        let map = back.membership(back.index("n7").unwrap()).unwrap();
        assert_eq!(map.me().addr, "127.0.0.1:7001".parse().unwrap());
        assert!(back.membership(1).is_ok());
        assert_eq!(gone.moved_parts(&v5).len(), 3);
    }

    #[test]
    fn a_joined_node_gets_the_config_and_the_added_nodes() {
        let v = view(3, 3)
            .join("n4", "127.0.0.1:7004".parse().unwrap())
            .unwrap()
            .unwrap();
        let map = v.membership(3).unwrap();
        assert_eq!(map.nodes().len(), 4);
        assert_eq!(map.me().id.as_str(), "n4");
        assert!(map.me().slots.is_empty());
        let original = view(3, 3).membership(1).unwrap();
        assert_eq!(map.digest(), original.digest());
        assert_eq!(map.ranges(), original.ranges());
    }
}

/// Why a join failed.
#[derive(Debug)]
pub enum JoinError {
    /// The seed could not be reached, or answered nothing usable: worth trying again.
    Unreachable(String),
    /// The cluster refused the node (the error it answered).
    Refused(String),
}

impl std::fmt::Display for JoinError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JoinError::Unreachable(text) | JoinError::Refused(text) => f.write_str(text),
        }
    }
}

/// Asks the cluster node at `seed` to add node `id` at `addr` (`KEEL.JOIN`), with `password`
/// if the cluster needs one; the view with the node in it. Blocking: used before a joining
/// node starts.
pub fn ask_to_join(
    seed: SocketAddr,
    id: &str,
    addr: SocketAddr,
    password: Option<&str>,
    wait: std::time::Duration,
) -> Result<View, JoinError> {
    use std::io::{BufRead, BufReader, Read, Write};
    let unreachable = |e: std::io::Error| JoinError::Unreachable(format!("{seed}: {e}"));
    let stream = std::net::TcpStream::connect_timeout(&seed, wait).map_err(unreachable)?;
    stream.set_read_timeout(Some(wait)).map_err(unreachable)?;
    let mut wire = Vec::new();
    let mut command = |args: &[&[u8]]| {
        wire.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for a in args {
            wire.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            wire.extend_from_slice(a);
            wire.extend_from_slice(b"\r\n");
        }
    };
    if let Some(p) = password {
        command(&[b"AUTH", p.as_bytes()]);
    }
    command(&[b"KEEL.JOIN", id.as_bytes(), addr.to_string().as_bytes()]);
    (&stream).write_all(&wire).map_err(unreachable)?;
    let mut input = BufReader::new(&stream);
    let mut line = String::new();
    let mut read_line = |line: &mut String| -> Result<(), JoinError> {
        line.clear();
        input.read_line(line).map_err(unreachable)?;
        if line.is_empty() {
            return Err(JoinError::Unreachable(format!(
                "{seed} closed the connection"
            )));
        }
        Ok(())
    };
    if password.is_some() {
        read_line(&mut line)?;
        if line.starts_with('-') {
            return Err(JoinError::Refused(line.trim_end()[1..].to_owned()));
        }
    }
    read_line(&mut line)?;
    if let Some(error) = line.strip_prefix('-') {
        let error = error.trim_end().to_owned();
        // The cluster is busy (an election, a view change): the join may be asked again.
        return Err(
            if error.starts_with("TRYAGAIN") || error.starts_with("CLUSTERDOWN") {
                JoinError::Unreachable(error)
            } else {
                JoinError::Refused(error)
            },
        );
    }
    let len: usize = line
        .strip_prefix('$')
        .and_then(|l| l.trim_end().parse().ok())
        .ok_or_else(|| JoinError::Refused(format!("{seed} answered {:?}", line.trim_end())))?;
    let mut body = vec![0; len + 2];
    input.read_exact(&mut body).map_err(unreachable)?;
    body.truncate(len);
    postcard::from_bytes(&body)
        .map_err(|e| JoinError::Refused(format!("{seed} answered a bad cluster view: {e}")))
}

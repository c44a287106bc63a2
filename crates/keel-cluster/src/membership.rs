//! The cluster's configuration: its nodes (id, client address), the slots each owns, which
//! node this process is, and how long a request to a peer may take.
//!
//! In v1 the configuration is static: every node reads the same file (or the same
//! `--cluster-node` flags), and [`Membership::digest`] is what peers will compare in their
//! handshake (`docs/cluster.md`, "Configuration checks"). A configuration is accepted only
//! whole: every slot owned by exactly one node, ids and addresses unique, and the node this
//! process is among them. Nothing here changes after it is built.
//!
//! The file (TOML):
//!
//! ```toml
//! myself = "n1"         # which node this process is; `--cluster-myself` overrides it
//! timeout-ms = 2000     # a request to another node fails after this long
//!
//! [[node]]
//! id = "n1"
//! addr = "127.0.0.1:7001"
//! slots = "0-5460"      # ranges and single slots, separated by spaces or commas
//!
//! [[node]]
//! id = "n2"
//! addr = "127.0.0.1:7002"
//! slots = "5461-10922"
//! ```

use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::time::Duration;

use crate::router::{SLOTS, Slot};

/// Longest node id: Redis' node ids are 40 characters, and clients may keep them in buffers
/// of that size.
pub const NODE_ID_BYTES_MAX: usize = 40;
/// Most nodes in one cluster (Redis' recommended maximum is 1000).
pub const NODES_MAX: usize = 1000;
/// Default time a request to another node may take before it fails with `CLUSTERDOWN`.
pub const TIMEOUT_MS_DEFAULT: u64 = 2000;
/// Longest configurable request timeout: a client waits this long at most.
pub const TIMEOUT_MS_MAX: u64 = 600_000;

/// A node's id: 1 to 40 characters of `[A-Za-z0-9._-]` (so that it fits the space-separated
/// lines of `CLUSTER NODES`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId(String);

impl NodeId {
    /// Checks and wraps `id`.
    pub fn new(id: &str) -> Result<NodeId, Error> {
        let bad = |reason: &str| Error::BadId {
            id: id.to_owned(),
            reason: reason.to_owned(),
        };
        if id.is_empty() {
            return Err(bad("it is empty"));
        }
        if id.len() > NODE_ID_BYTES_MAX {
            return Err(bad(&format!(
                "it is longer than {NODE_ID_BYTES_MAX} characters"
            )));
        }
        if !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        {
            return Err(bad("only letters, digits, '.', '_' and '-' are allowed"));
        }
        Ok(NodeId(id.to_owned()))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for NodeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One node of the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Its id.
    pub id: NodeId,
    /// Where clients (and, in this slice, peers forwarding commands) connect.
    pub addr: SocketAddr,
    /// The slots it owns, as sorted, disjoint, non-adjacent ranges.
    pub slots: Vec<RangeInclusive<u16>>,
}

/// A configuration that cannot be used, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The TOML did not parse, or has a field of the wrong type or an unknown one.
    #[error("cluster config: {0}")]
    Toml(String),
    /// A `--cluster-node` flag is malformed.
    #[error(
        "--cluster-node {text:?}: {reason} (expected ID,HOST:PORT,SLOTS[,SLOTS...], e.g. n1,127.0.0.1:7001,0-5460)"
    )]
    BadNodeFlag {
        /// The flag's value.
        text: String,
        /// What is wrong.
        reason: String,
    },
    /// No node is listed.
    #[error("cluster config lists no nodes")]
    NoNodes,
    /// More nodes than [`NODES_MAX`].
    #[error("cluster config lists {0} nodes; at most {NODES_MAX} are supported")]
    TooManyNodes(usize),
    /// A node id is not acceptable.
    #[error("node id {id:?} is not valid: {reason}")]
    BadId {
        /// The id.
        id: String,
        /// Why.
        reason: String,
    },
    /// A node's address does not parse.
    #[error("node {node}: address {addr:?} is not HOST:PORT with an IP address ({reason})")]
    BadAddr {
        /// The node.
        node: String,
        /// The address as written.
        addr: String,
        /// Why.
        reason: String,
    },
    /// Two nodes share an id.
    #[error("node id {0:?} is listed twice")]
    DuplicateId(String),
    /// Two nodes share an address.
    #[error("nodes {first} and {second} both have the address {addr}")]
    DuplicateAddr {
        /// The address.
        addr: SocketAddr,
        /// The first node with it.
        first: String,
        /// The second.
        second: String,
    },
    /// A node's slot list does not parse or is out of range.
    #[error("node {node}: slots {text:?}: {reason}")]
    BadSlots {
        /// The node.
        node: String,
        /// The slot list as written.
        text: String,
        /// Why.
        reason: String,
    },
    /// A slot is owned by two nodes.
    #[error("slot {slot} is owned by both {first} and {second}")]
    SlotTwice {
        /// The slot.
        slot: u16,
        /// One owner.
        first: String,
        /// The other.
        second: String,
    },
    /// Some slots are owned by no node.
    #[error(
        "{count} slots are owned by no node (the first: {first}-{last}); every slot 0-16383 needs an owner"
    )]
    SlotsUnowned {
        /// How many slots have no owner.
        count: usize,
        /// The first unowned range's start.
        first: u16,
        /// Its end.
        last: u16,
    },
    /// Which node this process is was not said.
    #[error(
        "which node this is was not given: set `myself` in the cluster config or --cluster-myself"
    )]
    NoMyself,
    /// This process's node is not in the list.
    #[error("this node, {myself:?}, is not among the cluster's nodes ({known})")]
    UnknownMyself {
        /// The id given.
        myself: String,
        /// The ids listed.
        known: String,
    },
    /// The request timeout is out of range.
    #[error("timeout-ms must be 1 to {TIMEOUT_MS_MAX}, not {0}")]
    BadTimeout(u64),
}

/// The cluster config file, as written (see the module documentation).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct File {
    /// Which node this process is.
    pub myself: Option<String>,
    /// Request timeout to other nodes, in milliseconds.
    pub timeout_ms: Option<u64>,
    /// The nodes.
    #[serde(default)]
    pub node: Vec<FileNode>,
}

/// One `[[node]]` of the file.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileNode {
    /// See [`Node::id`].
    pub id: String,
    /// See [`Node::addr`].
    pub addr: String,
    /// Slots and ranges, separated by spaces or commas: `"0-5460"`, `"0-100, 200"`.
    pub slots: String,
}

impl File {
    /// Parses the TOML text of a cluster config.
    pub fn parse(text: &str) -> Result<File, Error> {
        toml::from_str(text).map_err(|e| Error::Toml(e.to_string().trim_end().to_owned()))
    }
}

impl FileNode {
    /// Parses one `--cluster-node` flag: `ID,HOST:PORT,SLOTS[,SLOTS...]`.
    pub fn parse_flag(text: &str) -> Result<FileNode, Error> {
        let bad = |reason: &str| Error::BadNodeFlag {
            text: text.to_owned(),
            reason: reason.to_owned(),
        };
        let mut parts = text.splitn(3, ',');
        let id = parts
            .next()
            .filter(|s| !s.is_empty())
            .ok_or_else(|| bad("no id"))?;
        let addr = parts
            .next()
            .filter(|s| !s.is_empty())
            .ok_or_else(|| bad("no address"))?;
        let slots = parts
            .next()
            .filter(|s| !s.is_empty())
            .ok_or_else(|| bad("no slots"))?;
        Ok(FileNode {
            id: id.to_owned(),
            addr: addr.to_owned(),
            slots: slots.to_owned(),
        })
    }
}

/// Parses a slot list: slots and `a-b` ranges separated by spaces or commas, into sorted,
/// merged ranges.
pub fn parse_slots(text: &str) -> Result<Vec<RangeInclusive<u16>>, String> {
    let slot = |s: &str| -> Result<u16, String> {
        let n: u32 = s
            .parse()
            .map_err(|_| format!("{s:?} is not a slot number"))?;
        u16::try_from(n)
            .ok()
            .filter(|&n| n < SLOTS)
            .ok_or_else(|| format!("slot {n} is out of range (0-{})", SLOTS - 1))
    };
    let mut ranges = Vec::new();
    for item in text
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
    {
        let range = match item.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (slot(a.trim())?, slot(b.trim())?);
                if a > b {
                    return Err(format!("range {item:?} ends before it starts"));
                }
                a..=b
            }
            None => {
                let s = slot(item)?;
                s..=s
            }
        };
        ranges.push(range);
    }
    if ranges.is_empty() {
        return Err("no slots given".into());
    }
    ranges.sort_by_key(|r| *r.start());
    let mut merged: Vec<RangeInclusive<u16>> = Vec::with_capacity(ranges.len());
    for r in ranges {
        match merged.last_mut() {
            Some(last) if *r.start() <= *last.end() => {
                return Err(format!(
                    "slot {} is listed twice",
                    r.start().max(last.start())
                ));
            }
            Some(last) if u32::from(*r.start()) == u32::from(*last.end()) + 1 => {
                *last = *last.start()..=*r.end();
            }
            _ => merged.push(r),
        }
    }
    Ok(merged)
}

/// A checked cluster configuration, with the slot → node table.
#[derive(Debug)]
pub struct Membership {
    nodes: Vec<Node>,
    myself: usize,
    timeout: Duration,
    /// For every slot, the index in `nodes` of its owner.
    owners: Box<[u16]>,
    digest: u64,
}

impl Membership {
    /// Builds and checks a configuration from parsed parts. `myself` (a flag) wins over the
    /// file's; `timeout_ms` likewise.
    pub fn new(file: File, myself: Option<&str>, timeout_ms: Option<u64>) -> Result<Self, Error> {
        if file.node.is_empty() {
            return Err(Error::NoNodes);
        }
        if file.node.len() > NODES_MAX {
            return Err(Error::TooManyNodes(file.node.len()));
        }
        let timeout_ms = timeout_ms.or(file.timeout_ms).unwrap_or(TIMEOUT_MS_DEFAULT);
        if !(1..=TIMEOUT_MS_MAX).contains(&timeout_ms) {
            return Err(Error::BadTimeout(timeout_ms));
        }
        let mut nodes: Vec<Node> = Vec::with_capacity(file.node.len());
        for n in file.node {
            let id = NodeId::new(&n.id)?;
            let addr: SocketAddr = n.addr.trim().parse().map_err(|e| Error::BadAddr {
                node: n.id.clone(),
                addr: n.addr.clone(),
                reason: format!("{e}"),
            })?;
            if addr.port() == 0 {
                return Err(Error::BadAddr {
                    node: n.id.clone(),
                    addr: n.addr.clone(),
                    reason: "port 0 is not a port clients can reach".into(),
                });
            }
            let slots = parse_slots(&n.slots).map_err(|reason| Error::BadSlots {
                node: n.id.clone(),
                text: n.slots.clone(),
                reason,
            })?;
            if nodes.iter().any(|m| m.id == id) {
                return Err(Error::DuplicateId(n.id));
            }
            if let Some(m) = nodes.iter().find(|m| m.addr == addr) {
                return Err(Error::DuplicateAddr {
                    addr,
                    first: m.id.to_string(),
                    second: n.id,
                });
            }
            nodes.push(Node { id, addr, slots });
        }
        const NONE: u16 = u16::MAX;
        const _: () = assert!(NODES_MAX < NONE as usize);
        let mut owners = vec![NONE; usize::from(SLOTS)].into_boxed_slice();
        for (i, node) in nodes.iter().enumerate() {
            for range in &node.slots {
                for slot in range.clone() {
                    let owner = &mut owners[usize::from(slot)];
                    if *owner != NONE {
                        return Err(Error::SlotTwice {
                            slot,
                            first: nodes[usize::from(*owner)].id.to_string(),
                            second: node.id.to_string(),
                        });
                    }
                    *owner = u16::try_from(i).expect("at most NODES_MAX nodes");
                }
            }
        }
        let unowned: Vec<u16> = (0..SLOTS)
            .filter(|&s| owners[usize::from(s)] == NONE)
            .collect();
        if let Some(&first) = unowned.first() {
            let last = (first..SLOTS)
                .take_while(|&s| owners[usize::from(s)] == NONE)
                .last()
                .unwrap_or(first);
            return Err(Error::SlotsUnowned {
                count: unowned.len(),
                first,
                last,
            });
        }
        let myself = myself
            .map(str::to_owned)
            .or(file.myself)
            .ok_or(Error::NoMyself)?;
        let myself = nodes
            .iter()
            .position(|n| n.id.as_str() == myself)
            .ok_or_else(|| Error::UnknownMyself {
                myself: myself.clone(),
                known: nodes
                    .iter()
                    .map(|n| n.id.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        let digest = digest(&nodes);
        Ok(Membership {
            nodes,
            myself,
            timeout: Duration::from_millis(timeout_ms),
            owners,
            digest,
        })
    }

    /// Parses and checks a cluster config file's text.
    pub fn from_toml(
        text: &str,
        myself: Option<&str>,
        timeout_ms: Option<u64>,
    ) -> Result<Self, Error> {
        Membership::new(File::parse(text)?, myself, timeout_ms)
    }

    /// Builds and checks a configuration from `--cluster-node` flags.
    pub fn from_flags<S: AsRef<str>>(
        nodes: &[S],
        myself: Option<&str>,
        timeout_ms: Option<u64>,
    ) -> Result<Self, Error> {
        let node = nodes
            .iter()
            .map(|n| FileNode::parse_flag(n.as_ref()))
            .collect::<Result<_, _>>()?;
        Membership::new(
            File {
                node,
                ..File::default()
            },
            myself,
            timeout_ms,
        )
    }

    /// `n` nodes at `addrs` with the slots split evenly in order, as `keel cluster demo` and
    /// Redis' `create-cluster` split them; node `i` is called `node-{i+1}`.
    pub fn even(addrs: &[SocketAddr], myself: usize, timeout_ms: u64) -> Result<Self, Error> {
        let n = addrs.len();
        if n == 0 {
            return Err(Error::NoNodes);
        }
        let node = addrs
            .iter()
            .enumerate()
            .map(|(i, addr)| {
                let (start, end) = even_range(i, n);
                FileNode {
                    id: format!("node-{}", i + 1),
                    addr: addr.to_string(),
                    slots: format!("{start}-{end}"),
                }
            })
            .collect();
        Membership::new(
            File {
                node,
                ..File::default()
            },
            Some(&format!("node-{}", myself + 1)),
            Some(timeout_ms),
        )
    }

    /// This configuration with `added` nodes after the configured ones, owning no slot (nodes
    /// that joined a running cluster: slots come to them by moves), and `myself` the index
    /// of this process's node among all of them. Nodes at the indexes in `retired` have left
    /// the cluster: a node added later may take one's address. The digest is kept: it names
    /// the cluster the configured nodes formed, which the added nodes joined.
    pub fn extend(
        &self,
        added: &[(NodeId, SocketAddr)],
        myself: usize,
        retired: &[usize],
    ) -> Result<Self, Error> {
        let mut nodes = self.nodes.clone();
        if nodes.len() + added.len() > NODES_MAX {
            return Err(Error::TooManyNodes(nodes.len() + added.len()));
        }
        for (id, addr) in added {
            if nodes.iter().any(|m| &m.id == id) {
                return Err(Error::DuplicateId(id.to_string()));
            }
            if let Some((_, m)) = nodes
                .iter()
                .enumerate()
                .find(|(i, m)| m.addr == *addr && !retired.contains(i))
            {
                return Err(Error::DuplicateAddr {
                    addr: *addr,
                    first: m.id.to_string(),
                    second: id.to_string(),
                });
            }
            nodes.push(Node {
                id: id.clone(),
                addr: *addr,
                slots: Vec::new(),
            });
        }
        if myself >= nodes.len() {
            return Err(Error::UnknownMyself {
                myself: myself.to_string(),
                known: nodes
                    .iter()
                    .map(|n| n.id.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        Ok(Membership {
            nodes,
            myself,
            timeout: self.timeout,
            owners: self.owners.clone(),
            digest: self.digest,
        })
    }

    /// Every node, in the order configured.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The index of this process's node in [`Membership::nodes`].
    pub fn myself(&self) -> usize {
        self.myself
    }

    /// This process's node.
    pub fn me(&self) -> &Node {
        &self.nodes[self.myself]
    }

    /// The index of the node that owns `slot`.
    pub fn owner(&self, slot: Slot) -> usize {
        usize::from(self.owners[usize::from(slot.0)])
    }

    /// Whether this process's node owns `slot`.
    pub fn owns(&self, slot: Slot) -> bool {
        self.owner(slot) == self.myself
    }

    /// How long a request to another node may take.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A digest of everything every node must agree on (ids, addresses, slots; not `myself`
    /// nor the timeout): 64-bit FNV-1a of a canonical text, nodes sorted by id.
    pub fn digest(&self) -> u64 {
        self.digest
    }

    /// The slot ranges of every node, sorted by slot, as `(start, end, node index)`.
    pub fn ranges(&self) -> Vec<(u16, u16, usize)> {
        let mut ranges: Vec<(u16, u16, usize)> = self
            .nodes
            .iter()
            .enumerate()
            .flat_map(|(i, n)| n.slots.iter().map(move |r| (*r.start(), *r.end(), i)))
            .collect();
        ranges.sort_unstable();
        ranges
    }
}

/// Slots `start..=end` of node `i` of `n` under an even split.
pub fn even_range(i: usize, n: usize) -> (u16, u16) {
    let slots = usize::from(SLOTS);
    let start = slots * i / n;
    let end = slots * (i + 1) / n - 1;
    (
        u16::try_from(start).expect("below SLOTS"),
        u16::try_from(end).expect("below SLOTS"),
    )
}

fn digest(nodes: &[Node]) -> u64 {
    let mut sorted: Vec<&Node> = nodes.iter().collect();
    sorted.sort_by(|a, b| a.id.cmp(&b.id));
    let mut text = String::from("keel-cluster 1\n");
    for n in sorted {
        text.push_str(&format!("{} {}", n.id, n.addr));
        for r in &n.slots {
            text.push_str(&format!(" {}-{}", r.start(), r.end()));
        }
        text.push('\n');
    }
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const THREE: &str = r#"
        myself = "n2"
        timeout-ms = 500
        [[node]]
        id = "n1"
        addr = "127.0.0.1:7001"
        slots = "0-5460"
        [[node]]
        id = "n2"
        addr = "127.0.0.1:7002"
        slots = "5461-10922"
        [[node]]
        id = "n3"
        addr = "127.0.0.1:7003"
        slots = "10923-16383"
    "#;

    fn err(text: &str) -> Error {
        Membership::from_toml(text, None, None).expect_err("config must be refused")
    }

    #[test]
    fn parses_a_file() {
        let m = Membership::from_toml(THREE, None, None).expect("valid");
        assert_eq!(m.nodes().len(), 3);
        assert_eq!(m.me().id.as_str(), "n2");
        assert_eq!(m.timeout(), Duration::from_millis(500));
        assert_eq!(m.owner(Slot(0)), 0);
        assert_eq!(m.owner(Slot(5461)), 1);
        assert_eq!(m.owner(Slot(16383)), 2);
        assert!(m.owns(Slot(10922)));
        assert!(!m.owns(Slot(10923)));
        assert_eq!(
            m.ranges(),
            vec![(0, 5460, 0), (5461, 10922, 1), (10923, 16383, 2)]
        );
        // The flag overrides the file's `myself` and timeout.
        let m = Membership::from_toml(THREE, Some("n3"), Some(9)).expect("valid");
        assert_eq!(m.me().id.as_str(), "n3");
        assert_eq!(m.timeout(), Duration::from_millis(9));
    }

    #[test]
    fn flags_give_the_same_config_and_digest() {
        let flags = [
            "n3,127.0.0.1:7003,10923-16383",
            "n1,127.0.0.1:7001,0-5460",
            "n2,127.0.0.1:7002,5461-10000,10001-10922",
        ];
        let a = Membership::from_flags(&flags, Some("n1"), None).expect("valid");
        let b = Membership::from_toml(THREE, None, None).expect("valid");
        assert_eq!(a.digest(), b.digest(), "order and myself do not matter");
        let c = Membership::from_flags(
            &[
                "n3,127.0.0.1:7003,10923-16383",
                "n1,127.0.0.1:7001,0-5461",
                "n2,127.0.0.1:7002,5462-10922",
            ],
            Some("n1"),
            None,
        )
        .expect("valid");
        assert_ne!(a.digest(), c.digest(), "moving one slot changes the digest");
    }

    #[test]
    fn even_split_covers_every_slot() {
        for n in 1..=7 {
            let addrs: Vec<SocketAddr> = (0..n)
                .map(|i| SocketAddr::from(([127, 0, 0, 1], 7000 + i as u16)))
                .collect();
            let m = Membership::even(&addrs, n - 1, 100).expect("valid");
            assert_eq!(m.me().id.as_str(), format!("node-{n}"));
        }
        assert_eq!(even_range(0, 3), (0, 5460));
        assert_eq!(even_range(1, 3), (5461, 10921));
        assert_eq!(even_range(2, 3), (10922, 16383));
    }

    #[test]
    fn slot_owned_twice() {
        let text = THREE.replace("5461-10922", "5460-10922");
        assert_eq!(
            err(&text),
            Error::SlotTwice {
                slot: 5460,
                first: "n1".into(),
                second: "n2".into()
            }
        );
        assert_eq!(
            err(&text).to_string(),
            "slot 5460 is owned by both n1 and n2"
        );
    }

    #[test]
    fn slots_owned_by_no_one() {
        let text = THREE.replace("5461-10922", "5461-10000 10005-10922");
        assert_eq!(
            err(&text),
            Error::SlotsUnowned {
                count: 4,
                first: 10001,
                last: 10004
            }
        );
    }

    #[test]
    fn unknown_or_missing_myself() {
        let text = THREE.replace("myself = \"n2\"", "myself = \"n9\"");
        assert_eq!(
            err(&text).to_string(),
            "this node, \"n9\", is not among the cluster's nodes (n1, n2, n3)"
        );
        let text = THREE.replace("myself = \"n2\"", "");
        assert_eq!(err(&text), Error::NoMyself);
    }

    #[test]
    fn duplicate_ids_and_addresses() {
        let text = THREE.replace("id = \"n3\"", "id = \"n1\"");
        assert_eq!(err(&text), Error::DuplicateId("n1".into()));
        let text = THREE.replace("127.0.0.1:7003", "127.0.0.1:7001");
        assert_eq!(
            err(&text).to_string(),
            "nodes n1 and n3 both have the address 127.0.0.1:7001"
        );
    }

    #[test]
    fn bad_fields() {
        assert!(matches!(err("nodes = 3"), Error::Toml(_)));
        assert_eq!(err("myself = \"a\""), Error::NoNodes);
        let text = THREE.replace("0-5460", "0-16384");
        assert!(
            err(&text)
                .to_string()
                .contains("slot 16384 is out of range"),
            "{}",
            err(&text)
        );
        let text = THREE.replace("0-5460", "5460-0");
        assert!(err(&text).to_string().contains("ends before it starts"));
        let text = THREE.replace("0-5460", "0-5460 7");
        assert!(err(&text).to_string().contains("slot 7 is listed twice"));
        let text = THREE.replace("127.0.0.1:7001", "localhost:7001");
        assert!(matches!(err(&text), Error::BadAddr { .. }));
        let text = THREE.replace("id = \"n1\"", "id = \"n 1\"");
        assert!(matches!(err(&text), Error::BadId { .. }));
        let text = THREE.replace("timeout-ms = 500", "timeout-ms = 0");
        assert_eq!(err(&text), Error::BadTimeout(0));
        assert!(matches!(
            Membership::from_flags(&["n1,127.0.0.1:1"], Some("n1"), None),
            Err(Error::BadNodeFlag { .. })
        ));
    }

    #[test]
    fn slot_lists() {
        assert_eq!(parse_slots("0-9, 10 11-20"), Ok(vec![0..=20]));
        assert_eq!(parse_slots("30,1-2"), Ok(vec![1..=2, 30..=30]));
        assert!(parse_slots("").is_err());
        assert!(parse_slots("1-5 3").is_err());
        assert!(parse_slots("x").is_err());
    }
}

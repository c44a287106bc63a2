//! keel's cluster: data partitioned over many keel servers by Redis Cluster hash slots.
//!
//! This crate holds what every node must agree on and nothing that does I/O: [`router`] maps a
//! key to its slot, [`membership`] is the cluster's configuration (nodes, their client
//! addresses, the slots each owns), checked when it is read, with the digest peers compare.
//! The server (`keel-server`) routes commands with them. The protocol, and the slices still
//! to come (cross-partition transactions, transport, recovery), are in `docs/cluster.md`.

pub mod membership;
pub mod router;

pub use membership::{Error as MembershipError, Membership, Node, NodeId};
pub use router::{SLOTS, Slot, key_slot};

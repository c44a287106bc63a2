//! keel's cluster: data partitioned over many keel servers by Redis Cluster hash slots.
//!
//! This crate holds what every node must agree on: [`router`] maps a key to its slot,
//! [`membership`] is the cluster's configuration (nodes, their client addresses, the slots each
//! owns), checked when it is read, with the digest peers compare. The server (`keel-server`)
//! routes commands with them. [`txn`] is the two-phase commit of cross-partition transactions
//! as sans-IO state machines (coordinator and participant), which the deterministic simulation
//! (`tests/it/sim.rs`) drives under faults. [`transport`], the only module that does I/O,
//! carries their messages between nodes over TCP (tokio). The protocol, and the slices still to
//! come (the server driving [`txn`] over [`transport`]), are in `docs/cluster.md`.

pub mod membership;
pub mod router;
pub mod transport;
pub mod txn;

pub use membership::{Error as MembershipError, Membership, Node, NodeId};
pub use router::{SLOTS, Slot, key_slot};

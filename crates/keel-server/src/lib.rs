//! keel's network server: the Redis protocol (RESP2 and RESP3) over tokio, with `MULTI`/`EXEC`
//! as real serializable transactions.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let server = keel_server::Server::bind(keel_server::Config::default()).await?;
//! println!("listening on {}", server.local_addr());
//! server.run().await;
//! # Ok(()) }
//! ```
//!
//! Modules: [`resp`] parses requests (and is what the fuzz target drives), `reply` encodes
//! replies, `table` lists the commands, `data` runs the data commands against the engine,
//! `conn` runs a connection (and `MULTI`/`EXEC`/`WATCH`), `pubsub` keeps
//! subscriptions and delivers messages, `server` accepts and shuts down,
//! `info` answers `INFO`/`COMMAND`/`CONFIG` and the metrics endpoint, `cluster`
//! routes commands by hash slot in cluster mode (`CLUSTER`, `MOVED`, forwarding), [`lanes`] decides which
//! runtime serves connections (one busy-polling thread, or the worker pool). The engine stays
//! synchronous; tokio is only for sockets.

mod bits;
mod blocking;
mod cluster;
mod config;
mod conn;
#[cfg(test)]
mod cost;
mod data;
mod expiry;
mod gather;
mod glob;
mod hashes;
mod hot;
mod info;
mod keys;
mod keyspace;
pub mod lanes;
mod lcs;
mod lists;
mod long_double;
mod once;
mod pubsub;
mod reaper;
mod replica;
mod reply;
pub mod resp;
mod rpc_stats;
mod server;
mod sets;
mod slowlog;
mod sort;
mod table;
mod xnode;
mod zsets;

pub use config::{
    Config, ConfigError, Durability, FileConfig, OutputLimit, PROTO_MAX_BULK_LEN_DEFAULT,
    SPLIT_PHASE_MS_DEFAULT, SPLIT_PHASE_MS_MAX, YesNo, check_idle_poll, parse_poller, parse_split,
};
pub use keel_cluster as cluster_map;
pub use replica::stored_view;
pub use replica::view::{JoinError, View as ClusterView, ask_to_join};
pub use server::{Handle, Server, StartError};
pub use xnode::{BUS_PORT_OFFSET, BusMessage, STUCK_TEXT, Work as BusWork};

/// keel's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The Redis version keel answers as (`HELLO`, `INFO`): the protocol and command behaviour it
/// follows, so that clients enable the features keel has.
pub const REDIS_VERSION: &str = "7.2.0";

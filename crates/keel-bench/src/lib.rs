//! Benchmark harness for keel: the shared workloads of DESIGN.md, keel and its peers behind
//! one [`Target`] trait, a runner that retries aborts and measures latency, and reports
//! (table, JSON, plot).
//!
//! Keys are drawn before timing ([`workload::Params::stream`]); loading is not timed; the
//! runner discards warm-up. The peers (RocksDB, fjall, redb, LMDB) sit behind the `peers`
//! cargo feature so that a plain build stays fast. This crate measures; it never changes the
//! engine.

pub mod engines;
pub mod keys;
#[cfg(feature = "peers")]
pub mod peers;
pub mod report;
pub mod resp;
pub mod run;
pub mod target;
pub mod workload;

pub use target::{Target, Worker};
pub use workload::{Params, Workload};

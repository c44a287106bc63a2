//! Smoke runs: every target runs every workload it supports for a moment, and the test
//! reads back what the committed transactions wrote. Peers (and the Redis server) run with
//! `--features peers`; `.ci/run` does that.

#[cfg(feature = "peers")]
mod server;
mod smoke;

//! The `keel` binary: one entry point for the server, the benchmark harness and the tools.

use clap::{Parser, Subcommand};

mod bench;
mod check;
mod cluster;
mod serve;

/// mimalloc instead of glibc's malloc: commits and replies allocate from several threads at
/// once, and glibc's arenas showed up as lock contention under pipelined load.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// keel: a serializable, multi-version, transactional key-value store.
#[derive(Parser)]
#[command(name = "keel", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server (speaks the Redis protocol).
    Serve(Box<serve::Args>),
    /// Run a benchmark workload against keel and its peers.
    Bench(Box<bench::Args>),
    /// Verify a data directory's checkpoint and log files; optionally repair a damaged tail.
    Check(check::Args),
    /// Clusters: `keel cluster demo [N]` starts a local N-node cluster to try.
    Cluster(cluster::Args),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Serve(args) => serve::run(*args),
        Command::Bench(args) => bench::run(*args),
        Command::Check(args) => check::run(args),
        Command::Cluster(args) => cluster::run(args),
    }
}

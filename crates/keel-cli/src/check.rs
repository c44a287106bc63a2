//! `keel check`: verify a data directory's files, like `redis-check-aof`.

use std::path::PathBuf;

use anyhow::Context;

/// Verify every checkpoint and log file of a data directory and report the first damage
/// with its file and offset. Exits non-zero when damage remains.
#[derive(clap::Args)]
pub struct Args {
    /// The data directory (as given to `keel serve --dir`).
    dir: PathBuf,
    /// Cut the log at the first damage (and a torn tail), never anything before it, and say
    /// what was cut. Commits after the damage are lost; back the directory up first.
    #[arg(long)]
    repair: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let report = keel::check(&args.dir, args.repair)
        .with_context(|| format!("checking {}", args.dir.display()))?;
    match &report.checkpoint {
        Some((name, keys)) => println!("checkpoint {name}: ok, {keys} keys"),
        None => println!("no checkpoint yet"),
    }
    println!(
        "log: {} segments, {} whole commits",
        report.segments, report.frames
    );
    if let Some((file, offset, bytes)) = &report.torn_tail {
        println!(
            "torn tail: {} at offset {offset}, {bytes} bytes (an interrupted last write; recovery cuts it){}",
            file.display(),
            if args.repair { ", cut" } else { "" }
        );
    }
    if let Some((file, offset, reason)) = &report.damage {
        println!("damage: {} at offset {offset}: {reason}", file.display());
    }
    for line in &report.repaired {
        println!("repaired: {line}");
    }
    println!("ok");
    Ok(())
}

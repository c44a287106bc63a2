//! `keel serve`.

/// Options of `keel serve`.
#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("keel serve is not built yet")
}

//! `keel bench`.

/// Options of `keel bench`.
#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("keel bench is not built yet")
}

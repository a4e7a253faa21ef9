//! `encore hwbench`: every GEMM kernel this CPU runs, timed on one shape.

use clap::Args;

use crate::error::CliError;

#[derive(Args)]
pub struct HwbenchArgs {
    #[arg(long, default_value_t = 1024)]
    m: usize,
    #[arg(long, default_value_t = 768)]
    n: usize,
    #[arg(long, default_value_t = 768)]
    k: usize,
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: HwbenchArgs) -> Result<(), CliError> {
    let _ = (args.m, args.n, args.k, args.threads, args.json);
    Err(CliError::usage("hwbench", "not wired yet"))
}

//! `encore hwbench`: every GEMM kernel this CPU runs, timed on one shape, with the picker's
//! choice marked.

use clap::Args;
use codegen::kernels::hwbench::{hwbench, render_json, render_table};

use crate::error::CliError;

#[derive(Args)]
pub struct HwbenchArgs {
    /// Rows of the activations (tokens).
    #[arg(long, default_value_t = 1024)]
    m: usize,
    /// Output features.
    #[arg(long, default_value_t = 768)]
    n: usize,
    /// Input features.
    #[arg(long, default_value_t = 768)]
    k: usize,
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: HwbenchArgs) -> Result<(), CliError> {
    if args.m == 0 || args.n == 0 || args.k == 0 || args.threads == 0 {
        return Err(CliError::usage(
            "--m/--n/--k/--threads",
            "must be at least 1",
        ));
    }
    let rows = hwbench(args.m, args.n, args.k, args.threads);
    if args.json {
        println!("{}", render_json(&rows));
    } else {
        print!("{}", render_table(&rows));
    }
    Ok(())
}

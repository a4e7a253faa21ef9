//! `encore demo`: the main job on a built-in default. Builds a BERT-base-shaped model with
//! seeded random weights (no download), compiles it, runs it and prints its throughput.

use std::path::PathBuf;

use clap::Args;
use prost::Message;
use runtime::model_builder::{build_model, ModelSpec};
use runtime::Model;

use crate::commands::bench::{measure, print_result, BenchArgs};
use crate::error::CliError;

#[derive(Args)]
pub struct DemoArgs {
    /// The model shape (see `build-model --help`).
    #[arg(long, default_value = "bert-base")]
    preset: String,
    #[arg(long, default_value_t = 8)]
    batch: usize,
    #[arg(long, default_value_t = 128)]
    seq: usize,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Seconds of measurement.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
}

pub fn run(args: DemoArgs) -> Result<(), CliError> {
    let spec = ModelSpec::preset(&args.preset)
        .ok_or_else(|| CliError::usage("--preset", format!("unknown preset `{}`", args.preset)))?;
    println!(
        "building {} ({} parameters, seed {}) in memory…",
        args.preset,
        spec.param_count(),
        spec.seed
    );
    let proto = build_model(&spec)?;
    let graph = frontend_onnx::import_bytes(proto.encode_to_vec().into(), None)?;
    let model = Model::from_graph(graph)?;
    let bench = BenchArgs {
        model: PathBuf::from(format!("<built-in {}>", args.preset)),
        batch: args.batch,
        seq: args.seq,
        threads: args.threads,
        warmup: 2,
        seconds: args.seconds,
        min_runs: 5,
        json: false,
        profile: false,
        no_fuse: false,
        no_padding_free: false,
        batch_tokens: runtime::DEFAULT_BATCH_TOKENS,
        no_jit: false,
        lengths_from: None,
        tokenizer: None,
        distinct_batches: 16,
        fresh_outputs: false,
    };
    let result = measure(&model, &bench)?;
    print_result(&bench, model.is_quantized(), &result);
    Ok(())
}

//! `encore`: the command line of the encore compiler and runtime.

mod commands;
mod error;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::commands::{bench, build_model, demo, dump, embed, eval, hwbench, quantize, run, serve};

/// INT8 compiler and runtime for BERT-family encoders on x86 CPUs.
#[derive(Parser)]
#[command(name = "encore", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a model on text or on .npy inputs and print or save the outputs.
    Run(run::RunArgs),
    /// Print the IR after import and after each pass.
    Dump(dump::DumpArgs),
    /// Measure throughput and latency on random inputs.
    Bench(bench::BenchArgs),
    /// Write a BERT, DistilBERT or XLM-RoBERTa ONNX model with seeded random weights.
    BuildModel(build_model::BuildModelArgs),
    /// Time every GEMM kernel this CPU can run on one shape, and mark the picker's choice.
    Hwbench(hwbench::HwbenchArgs),
    /// The main job on a built-in default: a BERT-base-shaped model, compiled, run, timed.
    Demo(demo::DemoArgs),
    /// Embed a file of texts (.jsonl or .txt) into an .npy of sentence embeddings, in input order.
    Embed(embed::EmbedArgs),
    /// Accuracy table: Lee similarity and sentiment-probe figures, optionally against a baseline.
    Eval(eval::EvalArgs),
    /// Calibrate, SmoothQuant and quantize an FP32 model into one compiled INT8 `.encore` file.
    Quantize(quantize::QuantizeArgs),
    /// Serve the model over HTTP: text-embeddings-inference routes and OpenAI `/v1/embeddings`.
    Serve(serve::ServeArgs),
}

/// Tensor rows on cache lines: about 10 % faster INT8 (see `runtime::CacheAligned`).
#[global_allocator]
static ALLOC: runtime::CacheAligned = runtime::CacheAligned;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(a) => run::run(a),
        Command::Dump(a) => dump::run(a),
        Command::Bench(a) => bench::run(a),
        Command::BuildModel(a) => build_model::run(a),
        Command::Hwbench(a) => hwbench::run(a),
        Command::Demo(a) => demo::run(a),
        Command::Embed(a) => embed::run(a),
        Command::Eval(a) => eval::run(a),
        Command::Quantize(a) => quantize::run(a),
        Command::Serve(a) => serve::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                eprintln!("  caused by: {s}");
                source = s.source();
            }
            ExitCode::FAILURE
        }
    }
}

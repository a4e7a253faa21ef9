//! `encore run`: text or `.npy` tensors in, outputs printed or written as `.npy`.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use runtime::text::{Padding, Tokenizer, TokenizerOptions};
use runtime::{CompileOptions, Model, Session, TensorValue};

use crate::error::CliError;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Pooling {
    /// Every output as the model produces it.
    None,
    /// The mean of `last_hidden_state` over the real tokens (sentence-transformers pooling).
    Mean,
}

#[derive(Args)]
pub struct RunArgs {
    /// The ONNX model.
    #[arg(long)]
    model: PathBuf,
    /// A `tokenizer.json` (Hugging Face tokenizers format); needed with --text.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// A text to encode; repeat for a batch.
    #[arg(long = "text")]
    texts: Vec<String>,
    /// An input tensor as NAME=FILE.npy; repeat for each input.
    #[arg(long = "input", value_name = "NAME=FILE")]
    inputs: Vec<String>,
    /// Write each output as DIR/<output name>.npy instead of printing it.
    #[arg(long)]
    output_dir: Option<PathBuf>,
    /// Pool `last_hidden_state` into one vector per text.
    #[arg(long, value_enum, default_value = "none")]
    pooling: Pooling,
    /// L2-normalise pooled embeddings.
    #[arg(long)]
    normalize: bool,
    /// Truncate texts to this many tokens, special tokens included.
    #[arg(long, default_value_t = 256)]
    max_length: usize,
    /// Pad texts to this many tokens instead of to the longest text.
    #[arg(long)]
    pad_to: Option<usize>,
    /// Worker threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Refuse batches larger than this.
    #[arg(long)]
    max_batch: Option<usize>,
    /// Run the graph as imported, without the declutter passes.
    #[arg(long)]
    no_optimize: bool,
    /// Compute every padded token too. By default only the real tokens of the attention mask
    /// are computed and per-token outputs hold zeros at the padding.
    #[arg(long)]
    no_padding_free: bool,
    /// Run the int8 GEMM loop nests interpreted instead of JIT-compiled (same results).
    #[arg(long)]
    no_jit: bool,
    /// Print every value instead of the first few of each row.
    #[arg(long)]
    full: bool,
}

pub fn run(args: RunArgs) -> Result<(), CliError> {
    if !args.texts.is_empty() && !args.inputs.is_empty() {
        return Err(CliError::usage(
            "--text/--input",
            "give either --text (with --tokenizer) or --input NAME=FILE.npy, not both",
        ));
    }
    if args.normalize && args.pooling == Pooling::None {
        return Err(CliError::usage("--normalize", "needs --pooling mean"));
    }
    let model = Model::load(&args.model)?;
    // Neither is right only for a model without inputs (its outputs are constants).
    if args.texts.is_empty() && args.inputs.is_empty() && !model.graph().inputs().is_empty() {
        return Err(CliError::usage(
            "--text/--input",
            "give either --text (with --tokenizer) or --input NAME=FILE.npy",
        ));
    }
    let session = Session::new(
        &model,
        CompileOptions {
            threads: args.threads.max(1),
            max_batch: args.max_batch,
            optimize: !args.no_optimize,
            padding_free: !args.no_padding_free,
            jit: !args.no_jit && CompileOptions::default().jit,
            ..CompileOptions::default()
        },
    )?;

    let feeds: Vec<(String, TensorValue)> = if args.texts.is_empty() {
        read_npy_inputs(&args.inputs)?
    } else {
        let path = args
            .tokenizer
            .as_ref()
            .ok_or_else(|| CliError::usage("--tokenizer", "--text needs a tokenizer.json"))?;
        let tokenizer = Tokenizer::from_file(
            path,
            TokenizerOptions {
                max_length: Some(args.max_length),
                padding: args.pad_to.map_or(Padding::Longest, Padding::Fixed),
            },
        )?;
        let texts: Vec<&str> = args.texts.iter().map(String::as_str).collect();
        let encoded = tokenizer.encode(&texts)?;
        encoded
            .feeds(&session)
            .into_iter()
            .map(|(n, t)| (n.to_string(), t))
            .collect()
    };
    let refs: Vec<(&str, TensorValue)> =
        feeds.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    let mut outputs = session.run(&refs)?;

    if args.pooling == Pooling::Mean {
        let mask = feeds
            .iter()
            .find(|(n, _)| n == "attention_mask")
            .map(|(_, t)| t)
            .ok_or_else(|| {
                CliError::usage("--pooling", "mean pooling needs an attention_mask input")
            })?;
        let (_, hidden) = outputs
            .iter()
            .find(|(n, _)| n == "last_hidden_state")
            .or_else(|| outputs.first())
            .ok_or_else(|| CliError::usage("--pooling", "the model has no outputs"))?;
        if hidden.rank() != 3 {
            return Err(CliError::usage(
                "--pooling",
                format!(
                    "mean pooling needs a [batch, sequence, hidden] output, got {:?}",
                    hidden.shape()
                ),
            ));
        }
        let mut pooled = runtime::text::mean_pool(hidden, mask)?;
        if args.normalize {
            pooled = runtime::text::l2_normalize(&pooled)?;
        }
        outputs = vec![("sentence_embedding".to_string(), pooled)];
    }

    match &args.output_dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(|source| CliError::Io {
                path: dir.clone(),
                source,
            })?;
            for (name, t) in &outputs {
                let path = dir.join(format!("{}.npy", sanitize_file_name(name)));
                t.write_npy(&path)?;
                println!("wrote {} {:?} {}", t.dtype(), t.shape(), path.display());
            }
        }
        None => {
            for (name, t) in &outputs {
                print_tensor(name, t, args.full);
            }
        }
    }
    Ok(())
}

fn read_npy_inputs(specs: &[String]) -> Result<Vec<(String, TensorValue)>, CliError> {
    specs
        .iter()
        .map(|spec| {
            let (name, file) = spec.split_once('=').ok_or_else(|| {
                CliError::usage("--input", format!("`{spec}` is not NAME=FILE.npy"))
            })?;
            Ok((name.to_string(), TensorValue::read_npy(file)?))
        })
        .collect()
}

/// Output names come from the model; keep them from escaping the output folder.
fn sanitize_file_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn print_tensor(name: &str, t: &TensorValue, full: bool) {
    println!("{name}: {}{:?}", t.dtype(), t.shape());
    // Integer and bool outputs print exactly; going through f32 would round ids above 2^24.
    let values: Vec<String> = match t.to_i64_vec() {
        Ok(ints) if !t.dtype().is_float() => ints.iter().map(|v| v.to_string()).collect(),
        _ => t.to_f32_vec().iter().map(|v| format!("{v:.6}")).collect(),
    };
    let row = t.shape().last().copied().unwrap_or(1).max(1);
    let shown = if full { row } else { row.min(8) };
    for (i, chunk) in values.chunks(row).enumerate() {
        let mut line: Vec<&str> = chunk[..shown.min(chunk.len())]
            .iter()
            .map(String::as_str)
            .collect();
        if shown < chunk.len() {
            line.push("…");
        }
        println!("  [{i}] {}", line.join(" "));
    }
}

//! `encore quantize`: calibrate on text (or random ids), SmoothQuant, quantize, fuse, and write one
//! compiled `.encore` file; with an accuracy gate on held-back calibration text.

use std::path::PathBuf;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use runtime::quantize::{
    calibrate, load_stats, quantize_with_gate, save_stats, text_batches, ActivationMode,
    CalibrationBatch, QuantizeOptions,
};
use runtime::text::{Padding, Tokenizer, TokenizerOptions};
use runtime::{CompileOptions, Model, Session};

use crate::commands::bench::{random_feeds_from, RandomIds};
use crate::error::CliError;

#[derive(Args)]
pub struct QuantizeArgs {
    /// The FP32 ONNX model.
    #[arg(long)]
    model: PathBuf,
    /// Where to write the compiled INT8 model (one file; `Model::load` opens it).
    #[arg(long)]
    out: PathBuf,
    /// The tokenizer (tokenizer.json) for --calibration text.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Calibration text: JSONL with a `text` field, or one text per line.
    #[arg(long)]
    calibration: Option<PathBuf>,
    /// Calibrate on this many random-id sequences instead of text (models without a tokenizer).
    #[arg(long)]
    random_calibration: Option<usize>,
    /// Sequence length of random calibration.
    #[arg(long, default_value_t = 128)]
    seq: usize,
    /// Calibration texts to use (the first N of the file).
    #[arg(long, default_value_t = 512)]
    samples: usize,
    /// Of those, held back for the accuracy report and gate (not used for calibration).
    #[arg(long, default_value_t = 64)]
    held_back: usize,
    /// Sequences per calibration batch.
    #[arg(long, default_value_t = 16)]
    batch_size: usize,
    /// Longest calibration sequence in tokens.
    #[arg(long, default_value_t = 256)]
    max_length: usize,
    /// SmoothQuant strength in [0, 1] (0 turns SmoothQuant off), or `auto`: per layer, the one
    /// of 0, 0.25, 0.5, 0.75, 0.85 with the smallest own output error on held-back calibration
    /// text.
    #[arg(long, default_value = "0.5")]
    alpha: String,
    /// Activation quantization: `dynamic` (per token, batch-invariant) or `static` (per tensor).
    #[arg(long, default_value = "dynamic")]
    activations: String,
    /// The attention products q·kᵀ and p·v: `f32`, or `int8` (q and k quantized per token, v
    /// per channel, the softmax as u8: faster, and within noise of f32 on the accuracy test).
    #[arg(long, default_value = "f32")]
    attention: String,
    /// Layers kept in FP32: comma-separated substrings of their node names (attention nodes
    /// too, with `--attention int8`).
    #[arg(long, value_delimiter = ',')]
    keep_fp32: Vec<String>,
    /// Accuracy gate: keep the worst layers in FP32 until the held-back mean cosine of INT8 to
    /// FP32 outputs reaches this.
    #[arg(long)]
    min_cosine: Option<f64>,
    /// Write the calibration statistics here (safetensors).
    #[arg(long)]
    stats_out: Option<PathBuf>,
    /// Use these statistics instead of calibrating.
    #[arg(long)]
    stats_in: Option<PathBuf>,
    /// Worker threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

/// Random ids in [5, vocab) with a full mask, token type 0, as `encore bench` feeds them (one
/// stream of ids across the batches).
fn random_batches(
    session: &Session,
    samples: usize,
    seq: usize,
    batch_size: usize,
) -> Result<Vec<CalibrationBatch>, CliError> {
    let mut ids = RandomIds::new();
    let mut out = Vec::new();
    let mut left = samples;
    while left > 0 {
        let b = left.min(batch_size.max(1));
        left -= b;
        out.push(CalibrationBatch::from_feeds(random_feeds_from(
            session, b, seq, &mut ids,
        )?));
    }
    Ok(out)
}

pub fn run(args: QuantizeArgs) -> Result<(), CliError> {
    let activations = match args.activations.as_str() {
        "dynamic" => ActivationMode::Dynamic,
        "static" => ActivationMode::Static,
        other => {
            return Err(CliError::usage(
                "--activations",
                format!("`{other}`: expected static or dynamic"),
            ))
        }
    };
    let attention = match args.attention.as_str() {
        "f32" => ir::AttnProducts::F32,
        "int8" => ir::AttnProducts::Int8,
        other => {
            return Err(CliError::usage(
                "--attention",
                format!("`{other}`: expected f32 or int8"),
            ))
        }
    };
    let alpha: Option<f32> = match args.alpha.as_str() {
        "auto" => None,
        a => match a.parse::<f32>() {
            Ok(v) if (0.0..=1.0).contains(&v) => Some(v),
            _ => return Err(CliError::usage("--alpha", "a number in [0, 1], or auto")),
        },
    };
    let model = Model::load(&args.model)?;
    let fp32_session = Session::new(
        &model,
        CompileOptions {
            threads: args.threads,
            ..CompileOptions::default()
        },
    )?;
    let (mut batches, held_back) = match (&args.calibration, args.random_calibration) {
        (Some(path), None) => {
            let tok_path = args.tokenizer.as_ref().ok_or_else(|| {
                CliError::usage("--tokenizer", "needed to tokenize --calibration text")
            })?;
            let tokenizer = Tokenizer::from_file(
                tok_path,
                TokenizerOptions {
                    max_length: Some(args.max_length),
                    padding: Padding::Longest,
                },
            )?;
            let mut texts = super::texts::read_all(path)?;
            texts.truncate(args.samples);
            let hold = args.held_back.min(texts.len() / 2);
            let held: Vec<String> = texts.split_off(texts.len() - hold);
            (
                text_batches(&tokenizer, &fp32_session, &texts, args.batch_size)?,
                text_batches(&tokenizer, &fp32_session, &held, args.batch_size)?,
            )
        }
        (None, Some(n)) => {
            let hold = args.held_back.min(n / 2);
            let mut all = random_batches(&fp32_session, n, args.seq, args.batch_size)?;
            let held_batches = hold.div_ceil(args.batch_size.max(1)).min(all.len() / 2);
            let held = all.split_off(all.len() - held_batches);
            (all, held)
        }
        _ => {
            return Err(CliError::usage(
                "--calibration",
                "give either --calibration FILE (with --tokenizer) or --random-calibration N",
            ))
        }
    };
    let stats = match &args.stats_in {
        Some(p) => load_stats(p)?,
        None => {
            let bar = if args.quiet {
                ProgressBar::hidden()
            } else {
                ProgressBar::new(batches.len() as u64)
            };
            bar.set_style(
                ProgressStyle::with_template("calibrating {bar:40} {pos}/{len} batches {elapsed}")
                    .expect("valid template"),
            );
            let t0 = std::time::Instant::now();
            let s = calibrate(&model, &batches, args.threads, &mut |done, _| {
                bar.set_position(done as u64)
            })?;
            bar.finish_and_clear();
            eprintln!(
                "calibrated {} layers on {} batches in {:.1} s",
                s.layers.len(),
                batches.len(),
                t0.elapsed().as_secs_f64()
            );
            s
        }
    };
    batches.clear();
    if let Some(p) = &args.stats_out {
        save_stats(&stats, p)?;
    }
    let mut opts = QuantizeOptions {
        alpha: alpha.unwrap_or(0.5),
        smooth: alpha.is_none_or(|a| a > 0.0),
        activations,
        keep_fp32: args.keep_fp32.clone(),
        attention,
        ..QuantizeOptions::default()
    };
    if alpha.is_none() {
        let t0 = std::time::Instant::now();
        opts.alpha_per_layer = runtime::quantize::choose_alpha(
            &model,
            &stats,
            &opts,
            &held_back,
            &[0.0, 0.25, 0.5, 0.75, 0.85],
            args.threads,
        )?;
        let mut hist = std::collections::BTreeMap::new();
        for a in opts.alpha_per_layer.values() {
            *hist.entry(format!("{a}")).or_insert(0) += 1;
        }
        eprintln!(
            "alpha auto: layers per alpha {hist:?} ({:.1} s)",
            t0.elapsed().as_secs_f64()
        );
    }
    let (q, report, gate) = quantize_with_gate(
        &model,
        &fp32_session,
        Some(&stats),
        &opts,
        &held_back,
        args.min_cosine,
    )?;
    q.save(&args.out)?;
    let quantized = report.quantized_layers();
    let kept = report.kept_fp32();
    println!(
        "quantized {} linear layers (s8 weights per channel, {} activations{})",
        quantized.len(),
        args.activations,
        if opts.smooth {
            format!(", SmoothQuant alpha {}", args.alpha)
        } else {
            String::new()
        }
    );
    if attention == ir::AttnProducts::Int8 {
        let kept = report.attention_kept_fp32();
        println!(
            "attention products in int8 in {} attention ops{}",
            report.attention_int8().len(),
            if kept.is_empty() {
                String::new()
            } else {
                format!(" ({} kept in FP32 by --keep-fp32)", kept.len())
            }
        );
    }
    for (layer, why) in &kept {
        println!("kept in FP32: {layer}: {why}");
    }
    for (layer, err) in &gate.kept {
        println!("  (gate) {layer}: own relative error {err:.4}");
    }
    println!(
        "held-back mean cosine INT8 vs FP32: {:.5}{}",
        gate.cosine,
        if gate.kept.is_empty() {
            String::new()
        } else {
            format!(" (before the gate: {:.5})", gate.first_cosine)
        }
    );
    if let Some(floor) = args.min_cosine {
        if gate.cosine < floor {
            eprintln!("warning: the gate could not reach {floor} even with every layer kept");
        }
    }
    println!("wrote {}", args.out.display());
    Ok(())
}

//! `encore eval`: the accuracy table of a model (Lee document similarity and the sentiment
//! probe, as defined in the shared models README), optionally against a baseline model.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use runtime::eval::{compare_embeddings, encoder_fn, EmbeddingAgreement, EvalData, Evaluation};
use runtime::text::{SentenceEncoder, Tokenizer};
use runtime::{Model, Session};
use serde_json::json;

use crate::error::CliError;

#[derive(Args)]
pub struct EvalArgs {
    /// The model to evaluate (ONNX, or anything `Model::load` opens).
    #[arg(long)]
    model: PathBuf,
    /// Its `tokenizer.json`.
    #[arg(long)]
    tokenizer: PathBuf,
    /// A second model (same tokenizer) to compare with: its figures, the differences, and the
    /// cosine of the two models' embeddings of the sentiment snippets.
    #[arg(long)]
    baseline: Option<PathBuf>,
    /// The models folder with data/lee, data/movie_sentiment and minilm-l6/sentiment_head.safetensors
    /// [default: $ENCORE_MODELS, else ../shared/models].
    #[arg(long)]
    data: Option<PathBuf>,
    /// Worker threads (default: every core).
    #[arg(long)]
    threads: Option<usize>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    /// With a quantized model and an FP32 `--baseline`: each quantized layer's own output error
    /// (`‖x·W − dequant(quant(x)·W_q)‖ / ‖x·W‖` on the inputs the layer sees in the baseline,
    /// over the first `--per-layer-texts` sentiment snippets), largest first: the ranking the
    /// quantize gate uses, to choose `--keep-fp32` layers.
    #[arg(long)]
    per_layer: bool,
    /// Snippets for `--per-layer`.
    #[arg(long, default_value_t = 64)]
    per_layer_texts: usize,
}

/// One model's figures and how long they took.
struct Scored {
    path: PathBuf,
    eval: Evaluation,
    seconds: f64,
}

/// The four figures of the table, in order.
const METRICS: [(&str, &str); 4] = [
    ("lee_pearson", "Lee Pearson r"),
    ("lee_spearman", "Lee Spearman rho"),
    ("sentiment_accuracy", "sentiment accuracy"),
    ("margin_spearman", "margin-vs-score Spearman"),
];

fn figures(e: &Evaluation) -> [f64; 4] {
    [
        e.lee.pearson,
        e.lee.spearman,
        e.sentiment.accuracy,
        e.sentiment.margin_spearman,
    ]
}

fn score(path: &Path, args: &EvalArgs, data: &EvalData, quiet: bool) -> Result<Scored, CliError> {
    let tokenizer = Tokenizer::from_file(&args.tokenizer, runtime::eval::TOKENIZER_OPTIONS)?;
    let model = Model::load(path)?;
    let session = Session::new(&model, super::compile_options(args.threads))?;
    let encoder = SentenceEncoder::new(session, tokenizer);
    let bar = if quiet {
        ProgressBar::hidden()
    } else {
        let b = ProgressBar::new(data.text_count() as u64);
        b.set_style(
            ProgressStyle::with_template("{msg} {bar:40} {pos}/{len} texts  eta {eta}")
                .expect("a valid progress template"),
        );
        b.set_message(path.display().to_string());
        b
    };
    let embed = encoder_fn(&encoder);
    let counted = |texts: &[&str]| {
        let r = embed(texts);
        bar.inc(texts.len() as u64);
        r
    };
    let start = Instant::now();
    let eval = data.evaluate(&counted);
    bar.finish_and_clear();
    Ok(Scored {
        path: path.to_path_buf(),
        eval: eval?,
        seconds: start.elapsed().as_secs_f64(),
    })
}

pub fn run(args: EvalArgs) -> Result<(), CliError> {
    let dir = args
        .data
        .clone()
        .unwrap_or_else(runtime::eval::default_models_dir);
    let data = EvalData::load(&dir)?;
    let quiet = args.quiet || !std::io::stderr().is_terminal();
    let model = score(&args.model, &args, &data, quiet)?;
    let baseline = match &args.baseline {
        Some(b) => Some(score(b, &args, &data, quiet)?),
        None => None,
    };
    let agreement = match &baseline {
        Some(b) => Some(compare_embeddings(
            &model.eval.sentiment_embeddings,
            &b.eval.sentiment_embeddings,
        )?),
        None => None,
    };
    let per_layer = if args.per_layer {
        Some(per_layer_errors(&args, &data)?)
    } else {
        None
    };
    if args.json {
        print_json(
            &dir,
            &data,
            &model,
            baseline.as_ref(),
            agreement.as_ref(),
            per_layer.as_deref(),
        );
    } else {
        print_table(&dir, &data, &model, baseline.as_ref(), agreement.as_ref());
        if let Some(layers) = &per_layer {
            println!();
            println!(
                "own output error of each quantized layer over {} snippets, largest first:",
                args.per_layer_texts.min(data.sentiment.examples.len())
            );
            for (name, err) in layers {
                println!("  {err:>10.6}  {name}");
            }
        }
    }
    Ok(())
}

/// `--per-layer`: the quantized model's layers ranked by their own error against the baseline.
fn per_layer_errors(args: &EvalArgs, data: &EvalData) -> Result<Vec<(String, f64)>, CliError> {
    let Some(baseline) = &args.baseline else {
        return Err(CliError::usage(
            "--per-layer",
            "needs --baseline (the FP32 model the layers are compared with)",
        ));
    };
    let quantized = Model::load(&args.model)?;
    if !quantized.is_quantized() {
        return Err(CliError::usage(
            "--per-layer",
            format!("{} has no quantized layer", args.model.display()),
        ));
    }
    let fp32 = Model::load(baseline)?;
    let options = super::compile_options(args.threads);
    let threads = options.threads;
    let session = Session::new(&fp32, options)?;
    let tokenizer = Tokenizer::from_file(&args.tokenizer, runtime::eval::TOKENIZER_OPTIONS)?;
    let texts: Vec<String> = data
        .sentiment
        .examples
        .iter()
        .take(args.per_layer_texts.max(1))
        .map(|e| e.text.clone())
        .collect();
    let batches = runtime::quantize::text_batches(&tokenizer, &session, &texts, 16)?;
    Ok(runtime::quantize::layer_errors(
        &fp32,
        quantized.graph(),
        &batches,
        threads,
        4096,
    )?)
}

fn scored_json(s: &Scored) -> serde_json::Value {
    let mut obj = serde_json::Map::new();
    obj.insert("path".into(), json!(s.path.display().to_string()));
    for ((key, _), v) in METRICS.iter().zip(figures(&s.eval)) {
        obj.insert((*key).into(), json!(v));
    }
    obj.insert("sentiment_correct".into(), json!(s.eval.sentiment.correct));
    obj.insert("seconds".into(), json!(s.seconds));
    serde_json::Value::Object(obj)
}

fn print_json(
    dir: &Path,
    data: &EvalData,
    model: &Scored,
    baseline: Option<&Scored>,
    agreement: Option<&EmbeddingAgreement>,
    per_layer: Option<&[(String, f64)]>,
) {
    let mut out = json!({
        "data": dir.display().to_string(),
        "lee_documents": data.lee.documents.len(),
        "lee_pairs": data.lee.pairs.len(),
        "sentiment_examples": data.sentiment.examples.len(),
        "model": scored_json(model),
    });
    if let Some(b) = baseline {
        out["baseline"] = scored_json(b);
        let mut diff = serde_json::Map::new();
        for (((key, _), m), b) in METRICS
            .iter()
            .zip(figures(&model.eval))
            .zip(figures(&b.eval))
        {
            diff.insert((*key).into(), json!(m - b));
        }
        out["diff"] = serde_json::Value::Object(diff);
    }
    if let Some(a) = agreement {
        out["cosine_to_baseline"] = json!({
            "mean": a.mean_cosine,
            "min": a.min_cosine,
            "argmin": a.argmin,
            "texts": a.count,
        });
    }
    if let Some(layers) = per_layer {
        out["per_layer"] = layers
            .iter()
            .map(|(name, err)| json!({"layer": name, "error": err}))
            .collect();
    }
    println!("{out}");
}

fn print_table(
    dir: &Path,
    data: &EvalData,
    model: &Scored,
    baseline: Option<&Scored>,
    agreement: Option<&EmbeddingAgreement>,
) {
    println!(
        "data: {} ({} Lee documents, {} pairs; {} sentiment snippets)",
        dir.display(),
        data.lee.documents.len(),
        data.lee.pairs.len(),
        data.sentiment.examples.len()
    );
    println!(
        "model:    {} ({:.1} s)",
        model.path.display(),
        model.seconds
    );
    if let Some(b) = baseline {
        println!("baseline: {} ({:.1} s)", b.path.display(), b.seconds);
    }
    println!();
    match baseline {
        None => {
            println!("{:<26} {:>9}", "metric", "model");
            for ((_, name), m) in METRICS.iter().zip(figures(&model.eval)) {
                println!("{name:<26} {m:>9.4}");
            }
        }
        Some(b) => {
            println!(
                "{:<26} {:>9} {:>9} {:>9}",
                "metric", "model", "baseline", "diff"
            );
            for (((_, name), m), bv) in METRICS
                .iter()
                .zip(figures(&model.eval))
                .zip(figures(&b.eval))
            {
                println!("{name:<26} {m:>9.4} {bv:>9.4} {:>+9.4}", m - bv);
            }
        }
    }
    println!(
        "(sentiment: {} of {} correct)",
        model.eval.sentiment.correct, model.eval.sentiment.examples
    );
    if let Some(a) = agreement {
        println!(
            "cosine of the model's sentence embeddings to the baseline's over {} snippets: mean {:.6}, min {:.6} (snippet {})",
            a.count, a.mean_cosine, a.min_cosine, a.argmin
        );
    }
}

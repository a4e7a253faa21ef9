//! `encore bench`: throughput and latency on random token ids.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use runtime::{CompileOptions, Model, Session, TensorValue};

use crate::error::CliError;

#[derive(Args, Clone)]
pub struct BenchArgs {
    /// The ONNX model.
    #[arg(long)]
    pub model: PathBuf,
    /// Sequences per run.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 128)]
    pub seq: usize,
    /// Worker threads.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Untimed runs before measuring.
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// Measure for at least this many seconds…
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// …and at least this many runs.
    #[arg(long, default_value_t = 5)]
    pub min_runs: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// What one benchmark measured.
pub struct BenchResult {
    pub runs: usize,
    pub throughput_seq_per_s: f64,
    pub latencies_ms: Vec<f64>,
    pub compile_s: f64,
}

impl BenchResult {
    pub fn percentile(&self, p: f64) -> f64 {
        let mut v = self.latencies_ms.clone();
        v.sort_by(f64::total_cmp);
        let idx = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
        v[idx.min(v.len() - 1)]
    }
}

pub fn run(args: BenchArgs) -> Result<(), CliError> {
    let model = Model::load(&args.model)?;
    let r = measure(&model, &args)?;
    if args.json {
        let obj = serde_json::json!({
            "model": args.model.display().to_string(),
            "precision": if model.is_quantized() { "int8" } else { "fp32" },
            "batch": args.batch,
            "seq": args.seq,
            "threads": args.threads,
            "runs": r.runs,
            "compile_s": r.compile_s,
            "throughput_seq_per_s": r.throughput_seq_per_s,
            "latency_ms_mean": r.latencies_ms.iter().sum::<f64>() / r.runs as f64,
            "latency_ms_p50": r.percentile(50.0),
            "latency_ms_p90": r.percentile(90.0),
            "latency_ms_p99": r.percentile(99.0),
        });
        println!("{obj}");
    } else {
        print_result(&args, &r);
    }
    Ok(())
}

pub fn print_result(args: &BenchArgs, r: &BenchResult) {
    println!(
        "{}: batch {} × seq {}, {} threads, fp32",
        args.model.display(),
        args.batch,
        args.seq,
        args.threads
    );
    println!("  compile       {:.2} s", r.compile_s);
    println!("  runs          {}", r.runs);
    println!("  throughput    {:.2} sequences/s", r.throughput_seq_per_s);
    println!(
        "  latency (ms)  p50 {:.2}  p90 {:.2}  p99 {:.2}",
        r.percentile(50.0),
        r.percentile(90.0),
        r.percentile(99.0)
    );
}

/// Compiles `model` and times runs on random ids with a full attention mask.
pub fn measure(model: &Model, args: &BenchArgs) -> Result<BenchResult, CliError> {
    if args.batch == 0 || args.seq == 0 {
        return Err(CliError::usage("--batch/--seq", "must be at least 1"));
    }
    let t0 = Instant::now();
    let session = Session::new(
        model,
        CompileOptions {
            threads: args.threads.max(1),
            max_batch: None,
            optimize: true,
            ..CompileOptions::default()
        },
    )?;
    let compile_s = t0.elapsed().as_secs_f64();
    let feeds = random_feeds(&session, args.batch, args.seq)?;
    let refs: Vec<(&str, TensorValue)> =
        feeds.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    for _ in 0..args.warmup {
        session.run(&refs)?;
    }
    let budget = Duration::from_secs_f64(args.seconds.max(0.0));
    let mut latencies_ms = Vec::new();
    let start = Instant::now();
    while latencies_ms.len() < args.min_runs.max(1) || start.elapsed() < budget {
        let t = Instant::now();
        session.run(&refs)?;
        latencies_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let total_s = latencies_ms.iter().sum::<f64>() / 1e3;
    Ok(BenchResult {
        runs: latencies_ms.len(),
        throughput_seq_per_s: (latencies_ms.len() * args.batch) as f64 / total_s,
        latencies_ms,
        compile_s,
    })
}

/// A xorshift stream of token ids: the same inputs on every machine and every run.
pub(crate) struct RandomIds(u64);

impl RandomIds {
    pub(crate) fn new() -> RandomIds {
        RandomIds(0x9E37_79B9_7F4A_7C15)
    }

    /// An id in `[5, vocab)` (ids below 5 are the special tokens of the usual vocabularies).
    fn next_id(&mut self, vocab: usize) -> i64 {
        let s = &mut self.0;
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        5 + (*s % (vocab.saturating_sub(5).max(1) as u64)) as i64
    }
}

/// Token ids drawn from the model's vocabulary (found from the embedding table that `input_ids`
/// indexes), a full mask, and token type 0.
fn random_feeds(
    session: &Session,
    batch: usize,
    seq: usize,
) -> Result<Vec<(String, TensorValue)>, CliError> {
    random_feeds_from(session, batch, seq, &mut RandomIds::new())
}

/// [`random_feeds`] continuing the stream `ids` (for several batches of different ids).
pub(crate) fn random_feeds_from(
    session: &Session,
    batch: usize,
    seq: usize,
    ids: &mut RandomIds,
) -> Result<Vec<(String, TensorValue)>, CliError> {
    // The ids must be valid rows of the model's own embedding table: no guessed vocabulary.
    let vocab = || {
        session.lookup_rows("input_ids").ok_or_else(|| {
            CliError::usage(
                "--model",
                "cannot tell the vocabulary size: input_ids does not index a constant embedding table",
            )
        })
    };
    let mut feeds = Vec::new();
    for input in session.inputs() {
        let n = batch * seq;
        let values: Vec<i64> = match input.name.as_str() {
            "input_ids" => {
                let vocab = vocab()?;
                (0..n).map(|_| ids.next_id(vocab)).collect()
            }
            "attention_mask" => vec![1; n],
            "token_type_ids" | "position_ids" => vec![0; n],
            other => {
                return Err(CliError::usage(
                    "--model",
                    format!("random inputs fill input_ids, attention_mask and token_type_ids, not `{other}`"),
                ))
            }
        };
        feeds.push((input.name, TensorValue::from_i64(vec![batch, seq], values)?));
    }
    Ok(feeds)
}

//! Semantic search over the Lee documents with MiniLM in INT8, through encore's public API.
//!
//! ```text
//! cargo run --release --example semantic_search -- "floods in China"
//! cargo run --release --example semantic_search -- --top 3 --save /tmp/minilm.int8.encore "bushfires near Sydney"
//! cargo run --release --example semantic_search -- --model /tmp/minilm.int8.encore "the Democrats' new leader"
//! ```
//!
//! Without `--model`, it loads MiniLM-L6 (FP32 ONNX) from the models folder (`--models DIR`,
//! else `$ENCORE_MODELS`, else `../shared/models`), calibrates it on a few background
//! paragraphs, quantizes it to INT8 (SmoothQuant, s8 weights, dynamic u8 activations) and
//! optionally saves the `.encore` file. It then embeds the 50 Lee documents and prints the
//! `--top` documents (default 5) closest to the query by cosine. Exits with status 2 and a
//! message naming what is missing when the models folder is not there.

use std::path::{Path, PathBuf};

use runtime::eval::{embed_in_length_order, encoder_fn, LeeDocument, LeeSet};
use runtime::quantize::{calibrate, quantize, CalibrationBatch, QuantizeOptions};
use runtime::text::{Padding, SentenceEncoder, Tokenizer, TokenizerOptions};
use runtime::{Error, Model, Session};

/// Tensor rows on cache lines, as an application embedding the runtime should do.
#[global_allocator]
static ALLOC: runtime::CacheAligned = runtime::CacheAligned;

/// Calibration paragraphs (from `data/calibration/lee_background.jsonl`, disjoint from the
/// documents searched) and their length cap in tokens.
const CALIBRATION_TEXTS: usize = 16;
const CALIBRATION_TOKENS: usize = 128;

/// The documents, their unit-norm embeddings, and the encoder that embeds queries.
pub struct Index {
    pub encoder: SentenceEncoder,
    pub documents: Vec<LeeDocument>,
    pub embeddings: Vec<Vec<f32>>,
}

/// One hit: the index into [`Index::documents`] and the cosine to the query.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Hit {
    pub document: usize,
    pub score: f32,
}

/// What the search needs from the models folder; an error naming the first file missing.
pub fn check_models(models: &Path) -> Result<(), String> {
    for f in [
        "minilm-l6/model.onnx",
        "minilm-l6/tokenizer.json",
        "data/lee/documents.jsonl",
        "data/lee/pairs.jsonl",
        "data/calibration/lee_background.jsonl",
    ] {
        if !models.join(f).is_file() {
            return Err(format!(
                "{} not found: the models folder {} is missing or incomplete \
                 (pass --models DIR or set ENCORE_MODELS; see ../shared/models/README.md)",
                models.join(f).display(),
                models.display()
            ));
        }
    }
    Ok(())
}

/// MiniLM-L6 in INT8: calibrated on [`CALIBRATION_TEXTS`] background paragraphs, quantized with
/// SmoothQuant (alpha 0.5) and dynamic per-token activations.
pub fn quantize_minilm(models: &Path) -> Result<Model, Error> {
    let fp32 = Model::load(models.join("minilm-l6/model.onnx"))?;
    let texts = std::fs::read_to_string(models.join("data/calibration/lee_background.jsonl"))
        .map_err(|e| Error::Invalid(format!("calibration text: {e}")))?;
    let texts: Vec<String> = texts
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["text"].as_str().map(str::to_string))
        .take(CALIBRATION_TEXTS)
        .collect();
    let tokenizer = Tokenizer::from_file(
        models.join("minilm-l6/tokenizer.json"),
        TokenizerOptions {
            max_length: Some(CALIBRATION_TOKENS),
            padding: Padding::Longest,
        },
    )?;
    let batches: Vec<CalibrationBatch> = texts
        .chunks(8)
        .map(|chunk| {
            let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
            let enc = tokenizer.encode(&refs)?;
            Ok(CalibrationBatch::from_feeds(vec![
                ("input_ids".into(), enc.input_ids),
                ("attention_mask".into(), enc.attention_mask),
                ("token_type_ids".into(), enc.token_type_ids),
            ]))
        })
        .collect::<Result<_, Error>>()?;
    let threads = runtime::CompileOptions::default().threads;
    let stats = calibrate(&fp32, &batches, threads, &mut |_, _| {})?;
    let (int8, _report) = quantize(&fp32, Some(&stats), &QuantizeOptions::default())?;
    Ok(int8)
}

/// Loads (or makes) the INT8 model, compiles it and embeds every Lee document.
/// `prepared`: an `.encore` file to load instead of quantizing; `save`: where to write the
/// model made.
pub fn build_index(
    models: &Path,
    prepared: Option<&Path>,
    save: Option<&Path>,
) -> Result<Index, Error> {
    check_models(models).map_err(Error::Invalid)?;
    // sentence-transformers' MiniLM truncates at 256 tokens.
    let tokenizer = Tokenizer::from_file(
        models.join("minilm-l6/tokenizer.json"),
        TokenizerOptions {
            max_length: Some(256),
            padding: Padding::Longest,
        },
    )?;
    let model = match prepared {
        Some(p) => Model::load(p)?,
        None => quantize_minilm(models)?,
    };
    if let Some(p) = save {
        model.save(p)?;
    }
    let session = Session::builder(&model).build()?;
    let encoder = SentenceEncoder::new(session, tokenizer);
    let lee = LeeSet::load(models)?;
    let embeddings = embed_in_length_order(&lee.texts(), 8, &encoder_fn(&encoder))?;
    Ok(Index {
        encoder,
        documents: lee.documents,
        embeddings,
    })
}

impl Index {
    /// The `k` documents closest to `query`, best first (cosine of unit vectors: a dot product).
    pub fn search(&self, query: &str, k: usize) -> Result<Vec<Hit>, Error> {
        let q = self.encoder.embed(&[query])?;
        let q = q.as_f32().expect("f32 embeddings");
        let mut hits: Vec<Hit> = self
            .embeddings
            .iter()
            .enumerate()
            .map(|(document, e)| Hit {
                document,
                score: e.iter().zip(q).map(|(a, b)| a * b).sum(),
            })
            .collect();
        hits.sort_by(|a, b| b.score.total_cmp(&a.score));
        hits.truncate(k);
        Ok(hits)
    }
}

struct Args {
    models: PathBuf,
    model: Option<PathBuf>,
    save: Option<PathBuf>,
    top: usize,
    query: String,
}

const USAGE: &str = "usage: semantic_search [--models DIR] [--model FILE.encore] [--save FILE.encore] [--top K] QUERY...";

fn parse_args(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut a = Args {
        models: runtime::eval::default_models_dir(),
        model: None,
        save: None,
        top: 5,
        query: String::new(),
    };
    let mut words = Vec::new();
    while let Some(arg) = it.next() {
        let mut value = |flag: &str| it.next().ok_or(format!("{flag} needs a value\n{USAGE}"));
        match arg.as_str() {
            "--models" => a.models = value("--models")?.into(),
            "--model" => a.model = Some(value("--model")?.into()),
            "--save" => a.save = Some(value("--save")?.into()),
            "--top" => {
                a.top = value("--top")?
                    .parse()
                    .map_err(|_| format!("--top needs a count\n{USAGE}"))?
            }
            "-h" | "--help" => return Err(USAGE.to_string()),
            _ => words.push(arg),
        }
    }
    a.query = words.join(" ");
    if a.query.trim().is_empty() {
        return Err(format!("no query given\n{USAGE}"));
    }
    Ok(a)
}

fn main() {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = check_models(&args.models) {
        eprintln!("semantic_search: {e}");
        std::process::exit(2);
    }
    let t0 = std::time::Instant::now();
    let index = match build_index(&args.models, args.model.as_deref(), args.save.as_deref()) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("semantic_search: {e}");
            std::process::exit(1);
        }
    };
    let int8 = index.encoder.session().graph().node_ids().any(|id| {
        matches!(
            index.encoder.session().graph().node(id).op,
            ir::Op::QLinear { .. }
        )
    });
    println!(
        "{} Lee documents embedded with MiniLM-L6 ({}) in {:.1} s",
        index.documents.len(),
        if int8 { "INT8" } else { "FP32" },
        t0.elapsed().as_secs_f64()
    );
    match index.search(&args.query, args.top) {
        Ok(hits) => {
            println!("query: {}", args.query);
            for (rank, h) in hits.iter().enumerate() {
                let text = &index.documents[h.document].text;
                let snippet: String = text.chars().take(100).collect();
                println!(
                    "{:>2}. {:.4}  doc {:>2}  {snippet}…",
                    rank + 1,
                    h.score,
                    index.documents[h.document].id
                );
            }
        }
        Err(e) => {
            eprintln!("semantic_search: {e}");
            std::process::exit(1);
        }
    }
}

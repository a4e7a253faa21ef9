//! `encore embed`: a file of texts in, an `.npy` of sentence embeddings out, in input order.
//!
//! The file is read twice and never held whole: a first pass checks every line and counts the
//! texts (so a bad line fails before any compute, and the progress bar knows its length), the
//! second embeds windows of [`WINDOW_BATCHES`] batches, each sorted by length so that a batch
//! pads little, and appends the rows of each window in input order.

use std::fs::File;
use std::io::{BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use runtime::text::{Padding, SentenceEncoder, Tokenizer, TokenizerOptions};
use runtime::{Model, Session};

use super::texts::{io_err, Texts};
use crate::error::CliError;

/// Batches per sorting window: texts are sorted by length within `WINDOW_BATCHES * batch_size`
/// consecutive texts.
pub const WINDOW_BATCHES: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Pooling {
    /// The mean of `last_hidden_state` over the real tokens (sentence-transformers pooling).
    Mean,
    /// The first token's (`[CLS]`) vector.
    Cls,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// From the file name: `.jsonl` / `.ndjson` are JSONL, `.txt` one text per line.
    Auto,
    /// One JSON object per line with the text in `--text-field`.
    Jsonl,
    /// One text per line.
    Txt,
}

#[derive(Args)]
pub struct EmbedArgs {
    /// The model (ONNX, or anything `Model::load` opens).
    #[arg(long)]
    model: PathBuf,
    /// A `tokenizer.json` (Hugging Face tokenizers format).
    #[arg(long)]
    tokenizer: PathBuf,
    /// The texts: `.jsonl` (one object per line, text in --text-field) or `.txt` (one per line).
    #[arg(long)]
    input: PathBuf,
    /// The `.npy` to write: f32 [texts, hidden], rows in input order.
    #[arg(long)]
    output: PathBuf,
    /// How token vectors become one vector per text.
    #[arg(long, value_enum, default_value = "mean")]
    pooling: Pooling,
    /// L2-normalise each embedding.
    #[arg(long)]
    normalize: bool,
    /// Texts per run.
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    /// Truncate texts to this many tokens, special tokens included.
    #[arg(long, default_value_t = 256)]
    max_length: usize,
    /// Worker threads (default: every core).
    #[arg(long)]
    threads: Option<usize>,
    /// The JSONL field holding the text.
    #[arg(long, default_value = "text")]
    text_field: String,
    /// The input format.
    #[arg(long, value_enum, default_value = "auto")]
    format: Format,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

fn is_jsonl(args: &EmbedArgs) -> Result<bool, CliError> {
    match args.format {
        Format::Jsonl => Ok(true),
        Format::Txt => Ok(false),
        Format::Auto => {
            let ext = args
                .input
                .extension()
                .and_then(|e| e.to_str())
                .map(str::to_ascii_lowercase);
            match ext.as_deref() {
                Some("jsonl" | "ndjson") => Ok(true),
                Some("txt") => Ok(false),
                _ => Err(CliError::usage(
                    "--input",
                    format!(
                        "{}: cannot tell the format from the name; use .jsonl or .txt, or pass --format",
                        args.input.display()
                    ),
                )),
            }
        }
    }
}

/// The `.npy` 1.0 header of a C-order little-endian f32 array `[rows, cols]`.
fn npy_header(rows: usize, cols: usize) -> Vec<u8> {
    let mut dict =
        format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {cols}), }}");
    // Magic (6) + version (2) + length (2) + dict + '\n' is padded to a multiple of 64.
    let total = 10 + dict.len() + 1;
    dict.push_str(&" ".repeat((64 - total % 64) % 64));
    dict.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out
}

impl From<Pooling> for runtime::text::Pooling {
    fn from(p: Pooling) -> runtime::text::Pooling {
        match p {
            Pooling::Mean => runtime::text::Pooling::Mean,
            Pooling::Cls => runtime::text::Pooling::Cls,
        }
    }
}

pub fn run(args: EmbedArgs) -> Result<(), CliError> {
    if args.batch_size == 0 {
        return Err(CliError::usage("--batch-size", "must be at least 1"));
    }
    let jsonl = is_jsonl(&args)?;
    // First pass: every line checked, texts counted.
    let mut count = 0usize;
    for t in Texts::open(&args.input, jsonl, &args.text_field)? {
        t?;
        count += 1;
    }
    if count == 0 {
        return Err(CliError::Runtime(runtime::Error::Data {
            path: args.input.clone(),
            message: "no texts (the file is empty)".into(),
        }));
    }

    let tokenizer = Tokenizer::from_file(
        &args.tokenizer,
        TokenizerOptions {
            max_length: Some(args.max_length),
            padding: Padding::Longest,
        },
    )?;
    let model = Model::load(&args.model)?;
    let session = Session::new(&model, super::compile_options(args.threads))?;
    let embedder = SentenceEncoder::new(session, tokenizer)
        .with_pooling(args.pooling.into())
        .with_normalize(args.normalize);

    let bar = if args.quiet || !std::io::stderr().is_terminal() {
        ProgressBar::hidden()
    } else {
        let b = ProgressBar::new(count as u64);
        b.set_style(
            ProgressStyle::with_template("{bar:40} {pos}/{len} texts  {per_sec}  eta {eta}")
                .expect("a valid progress template"),
        );
        b
    };

    // Written beside the target and renamed at the end: a failure leaves no truncated .npy.
    let partial = {
        let mut name = args.output.file_name().unwrap_or_default().to_os_string();
        name.push(".partial");
        args.output.with_file_name(name)
    };
    let result = write_embeddings(&args, jsonl, count, &embedder, &bar, &partial);
    bar.finish_and_clear();
    match result {
        Ok(hidden) => {
            std::fs::rename(&partial, &args.output).map_err(io_err(&args.output))?;
            eprintln!("wrote f32 [{count}, {hidden}] {}", args.output.display());
            Ok(())
        }
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            Err(e)
        }
    }
}

/// Second pass: embeds window by window and writes the `.npy`; returns the hidden size.
fn write_embeddings(
    args: &EmbedArgs,
    jsonl: bool,
    count: usize,
    embedder: &SentenceEncoder,
    bar: &ProgressBar,
    path: &Path,
) -> Result<usize, CliError> {
    let mut file = BufWriter::new(File::create(path).map_err(io_err(path))?);
    let window = args.batch_size.saturating_mul(WINDOW_BATCHES);
    let mut texts = Texts::open(&args.input, jsonl, &args.text_field)?;
    let mut hidden = None;
    let mut written = 0;
    loop {
        let chunk: Vec<String> = texts.by_ref().take(window).collect::<Result<_, _>>()?;
        if chunk.is_empty() {
            break;
        }
        let rows = embedder.embed_all(&chunk, args.batch_size, |done| bar.inc(done as u64))?;
        let h = rows.shape()[1];
        match hidden {
            None => {
                file.write_all(&npy_header(count, h))
                    .map_err(io_err(path))?;
                hidden = Some(h);
            }
            Some(prev) if prev != h => {
                return Err(CliError::usage(
                    "--model",
                    format!("embeddings of {prev} and then {h} values"),
                ))
            }
            Some(_) => {}
        }
        let bytes: Vec<u8> = rows
            .typed::<f32>()?
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        file.write_all(&bytes).map_err(io_err(path))?;
        written += chunk.len();
    }
    if written != count {
        return Err(CliError::usage(
            "--input",
            format!(
                "{} changed while being read: {count} texts, then {written}",
                args.input.display()
            ),
        ));
    }
    file.flush().map_err(io_err(path))?;
    Ok(hidden.unwrap_or(0))
}

//! The accuracy evaluation of the project: Lee document similarity and movie-snippet sentiment.
//!
//! Both metrics are defined in the shared models folder's README (`../shared/models`):
//!
//! * **Lee document similarity** (`data/lee/`): embed the 50 documents, take the cosine of the two
//!   embeddings of each of the 1,225 rated pairs, and correlate the cosines with the human
//!   `score`: Pearson r (the usual figure) and Spearman ρ.
//! * **Sentiment** (`data/movie_sentiment/test.jsonl`): embed the 2,000 snippets, apply the
//!   logistic-regression probe `minilm-l6/sentiment_head.safetensors`
//!   (`logits = emb · weightᵀ + bias`), predict `argmax`; accuracy against `label`, and the
//!   Spearman correlation of the margin `logits[1] − logits[0]` with the human `score`.
//!
//! Embeddings are the sentence-transformers ones: texts tokenized with truncation to 256 tokens
//! ([`TOKENIZER_OPTIONS`]), padded to the longest text of the batch, token types 0, mean pooling
//! over the attention mask, L2 normalisation. The texts are embedded in batches of
//! [`LEE_BATCH`] (Lee) and [`SENTIMENT_BATCH`] (sentiment) in order of length
//! ([`embed_in_length_order`]), as the reference script does.
//!
//! The embedding itself is a parameter: any [`EmbedFn`] (a closure from a batch of texts to one
//! vector per text), or a [`SentenceEncoder`] through [`EvalData::evaluate_encoder`].
//!
//! ```no_run
//! use runtime::eval::{EvalData, TOKENIZER_OPTIONS};
//! use runtime::text::{SentenceEncoder, Tokenizer};
//! use runtime::{CompileOptions, Model, Session};
//! let data = EvalData::load("../shared/models")?;
//! let session = Session::new(&Model::load("minilm-l6/model.onnx")?, CompileOptions::default())?;
//! let tokenizer = Tokenizer::from_file("minilm-l6/tokenizer.json", TOKENIZER_OPTIONS)?;
//! let report = data.evaluate_encoder(&SentenceEncoder::new(session, tokenizer))?;
//! println!(
//!     "Lee r {:.4}, sentiment accuracy {:.4}",
//!     report.lee.pearson, report.sentiment.accuracy
//! );
//! # Ok::<(), runtime::Error>(())
//! ```

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::text::{Padding, SentenceEncoder, TokenizerOptions};
use crate::{Error, TensorValue};

/// The Lee documents, relative to the models folder.
pub const LEE_DOCUMENTS: &str = "data/lee/documents.jsonl";
/// The rated Lee pairs, relative to the models folder.
pub const LEE_PAIRS: &str = "data/lee/pairs.jsonl";
/// The labelled sentiment test snippets, relative to the models folder.
pub const SENTIMENT_TEST: &str = "data/movie_sentiment/test.jsonl";
/// The sentiment probe, relative to the models folder.
pub const SENTIMENT_PROBE: &str = "minilm-l6/sentiment_head.safetensors";

/// Texts per batch for the Lee documents.
pub const LEE_BATCH: usize = 8;
/// Texts per batch for the sentiment snippets.
pub const SENTIMENT_BATCH: usize = 32;

/// The tokenizer settings of every metric: truncation to 256 tokens (`[CLS]` and `[SEP]`
/// included), padding to the longest text of the batch.
///
/// ```
/// use runtime::eval::TOKENIZER_OPTIONS;
/// use runtime::text::Padding;
/// assert_eq!(TOKENIZER_OPTIONS.max_length, Some(256));
/// assert_eq!(TOKENIZER_OPTIONS.padding, Padding::Longest);
/// ```
pub const TOKENIZER_OPTIONS: TokenizerOptions = TokenizerOptions {
    max_length: Some(256),
    padding: Padding::Longest,
};

/// An embedding function: a batch of texts in, one vector per text out, in the same order.
///
/// ```
/// use runtime::eval::EmbedFn;
/// let f: &EmbedFn = &|texts| Ok(texts.iter().map(|t| vec![t.len() as f32, 1.0]).collect());
/// assert_eq!(f(&["ab", "c"]).unwrap(), vec![vec![2.0, 1.0], vec![1.0, 1.0]]);
/// ```
pub type EmbedFn<'a> = dyn Fn(&[&str]) -> Result<Vec<Vec<f32>>, Error> + 'a;

fn data_err(path: &Path, message: impl Into<String>) -> Error {
    Error::Data {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

fn line_err(path: &Path, line: usize, message: impl Into<String>) -> Error {
    Error::DataLine {
        path: path.to_path_buf(),
        line,
        message: message.into(),
    }
}

/// A JSONL record: its 1-based line number and its object.
type JsonRow = (usize, serde_json::Map<String, Value>);

/// The JSON objects of a JSONL file with their 1-based line numbers; blank lines are skipped.
fn read_jsonl(path: &Path) -> Result<Vec<JsonRow>, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Value>(line) {
            Ok(Value::Object(map)) => rows.push((i + 1, map)),
            Ok(_) => return Err(line_err(path, i + 1, "not a JSON object")),
            Err(e) => return Err(line_err(path, i + 1, format!("not valid JSON: {e}"))),
        }
    }
    if rows.is_empty() {
        return Err(data_err(path, "no records (the file is empty)"));
    }
    Ok(rows)
}

fn field<'a>(
    row: &'a serde_json::Map<String, Value>,
    name: &str,
    path: &Path,
    line: usize,
) -> Result<&'a Value, Error> {
    row.get(name)
        .ok_or_else(|| line_err(path, line, format!("no `{name}` field")))
}

fn str_field(
    row: &serde_json::Map<String, Value>,
    name: &str,
    path: &Path,
    line: usize,
) -> Result<String, Error> {
    let s = field(row, name, path, line)?
        .as_str()
        .ok_or_else(|| line_err(path, line, format!("`{name}` is not a string")))?;
    if s.trim().is_empty() {
        return Err(line_err(path, line, format!("`{name}` is empty")));
    }
    Ok(s.to_string())
}

fn f64_field(
    row: &serde_json::Map<String, Value>,
    name: &str,
    path: &Path,
    line: usize,
) -> Result<f64, Error> {
    field(row, name, path, line)?
        .as_f64()
        .filter(|v| v.is_finite())
        .ok_or_else(|| line_err(path, line, format!("`{name}` is not a finite number")))
}

fn i64_field(
    row: &serde_json::Map<String, Value>,
    name: &str,
    path: &Path,
    line: usize,
) -> Result<i64, Error> {
    field(row, name, path, line)?
        .as_i64()
        .ok_or_else(|| line_err(path, line, format!("`{name}` is not an integer")))
}

/// One Lee document.
#[derive(Clone, Debug, PartialEq)]
pub struct LeeDocument {
    /// The `id` the pairs refer to.
    pub id: i64,
    pub text: String,
}

/// One rated pair of Lee documents, as indices into [`LeeSet::documents`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LeePair {
    pub a: usize,
    pub b: usize,
    /// The averaged human similarity rating.
    pub score: f64,
}

/// The Lee document-similarity set: documents and rated pairs.
///
/// ```no_run
/// let lee = runtime::eval::LeeSet::load("../shared/models")?;
/// assert_eq!((lee.documents.len(), lee.pairs.len()), (50, 1225));
/// # Ok::<(), runtime::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct LeeSet {
    pub documents: Vec<LeeDocument>,
    pub pairs: Vec<LeePair>,
}

/// The Lee figures: correlations of embedding cosines with human ratings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LeeMetrics {
    /// Pearson r of the pair cosines against the human scores.
    pub pearson: f64,
    /// Spearman ρ (average ranks for ties) of the same.
    pub spearman: f64,
    /// The number of pairs.
    pub pairs: usize,
}

impl LeeSet {
    /// Reads [`LEE_DOCUMENTS`] and [`LEE_PAIRS`] under the models folder `dir`.
    ///
    /// ```no_run
    /// let lee = runtime::eval::LeeSet::load("../shared/models")?;
    /// println!("{} documents", lee.documents.len());
    /// # Ok::<(), runtime::Error>(())
    /// ```
    pub fn load(dir: impl AsRef<Path>) -> Result<LeeSet, Error> {
        let dir = dir.as_ref();
        LeeSet::from_files(&dir.join(LEE_DOCUMENTS), &dir.join(LEE_PAIRS))
    }

    /// Reads the documents (`{"id", "text"}` lines) and the pairs (`{"a", "b", "score"}` lines,
    /// `a` and `b` being document ids) from the given files.
    ///
    /// ```no_run
    /// use std::path::Path;
    /// let lee = runtime::eval::LeeSet::from_files(
    ///     Path::new("data/lee/documents.jsonl"),
    ///     Path::new("data/lee/pairs.jsonl"),
    /// )?;
    /// # Ok::<(), runtime::Error>(())
    /// ```
    pub fn from_files(documents: &Path, pairs: &Path) -> Result<LeeSet, Error> {
        let mut docs = Vec::new();
        let mut index = std::collections::HashMap::new();
        for (line, row) in read_jsonl(documents)? {
            let id = i64_field(&row, "id", documents, line)?;
            if index.insert(id, docs.len()).is_some() {
                return Err(line_err(
                    documents,
                    line,
                    format!("document id {id} repeats"),
                ));
            }
            docs.push(LeeDocument {
                id,
                text: str_field(&row, "text", documents, line)?,
            });
        }
        let mut out = Vec::new();
        for (line, row) in read_jsonl(pairs)? {
            let doc = |name: &str| -> Result<usize, Error> {
                let id = i64_field(&row, name, pairs, line)?;
                index.get(&id).copied().ok_or_else(|| {
                    line_err(
                        pairs,
                        line,
                        format!(
                            "`{name}` = {id} is not a document id of {}",
                            documents.display()
                        ),
                    )
                })
            };
            out.push(LeePair {
                a: doc("a")?,
                b: doc("b")?,
                score: f64_field(&row, "score", pairs, line)?,
            });
        }
        Ok(LeeSet {
            documents: docs,
            pairs: out,
        })
    }

    /// The document texts, in [`LeeSet::documents`] order.
    ///
    /// ```no_run
    /// let lee = runtime::eval::LeeSet::load("../shared/models")?;
    /// assert_eq!(lee.texts().len(), lee.documents.len());
    /// # Ok::<(), runtime::Error>(())
    /// ```
    pub fn texts(&self) -> Vec<&str> {
        self.documents.iter().map(|d| d.text.as_str()).collect()
    }

    /// The figures from embeddings of [`LeeSet::documents`] (one vector per document, in order).
    ///
    /// ```no_run
    /// # let lee = runtime::eval::LeeSet::load("../shared/models")?;
    /// # let embeddings: Vec<Vec<f32>> = vec![];
    /// let m = lee.metrics(&embeddings)?;
    /// println!("Pearson r {:.4} over {} pairs", m.pearson, m.pairs);
    /// # Ok::<(), runtime::Error>(())
    /// ```
    pub fn metrics(&self, embeddings: &[Vec<f32>]) -> Result<LeeMetrics, Error> {
        if embeddings.len() != self.documents.len() {
            return Err(Error::Invalid(format!(
                "Lee: {} embeddings for {} documents",
                embeddings.len(),
                self.documents.len()
            )));
        }
        let mut cos = Vec::with_capacity(self.pairs.len());
        for p in &self.pairs {
            cos.push(cosine(&embeddings[p.a], &embeddings[p.b])?);
        }
        let human: Vec<f64> = self.pairs.iter().map(|p| p.score).collect();
        Ok(LeeMetrics {
            pearson: pearson(&cos, &human),
            spearman: spearman(&cos, &human),
            pairs: self.pairs.len(),
        })
    }

    /// Embeds the documents with `embed` (batches of [`LEE_BATCH`] in order of length) and
    /// computes the figures.
    ///
    /// ```no_run
    /// # let lee = runtime::eval::LeeSet::load("../shared/models")?;
    /// // A (useless) embedding: the length of the text.
    /// let m = lee.evaluate(&|texts| Ok(texts.iter().map(|t| vec![t.len() as f32, 1.0]).collect()))?;
    /// # Ok::<(), runtime::Error>(())
    /// ```
    pub fn evaluate(&self, embed: &EmbedFn) -> Result<LeeMetrics, Error> {
        let emb = embed_in_length_order(&self.texts(), LEE_BATCH, embed)?;
        self.metrics(&emb)
    }
}

/// One labelled movie-review snippet.
#[derive(Clone, Debug, PartialEq)]
pub struct SentimentExample {
    pub text: String,
    /// 1 positive, 0 negative.
    pub label: usize,
    /// The mean human rating, from −4 to +4.
    pub score: f64,
}

/// The labelled sentiment test set.
///
/// ```no_run
/// let set = runtime::eval::SentimentSet::load("../shared/models")?;
/// assert_eq!(set.examples.len(), 2000);
/// # Ok::<(), runtime::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct SentimentSet {
    pub examples: Vec<SentimentExample>,
}

/// The sentiment figures of the probe on a set of embeddings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SentimentMetrics {
    /// The share of predictions equal to the label.
    pub accuracy: f64,
    /// Spearman ρ of the logit margin `logits[1] − logits[0]` against the human score.
    pub margin_spearman: f64,
    /// Correct predictions.
    pub correct: usize,
    /// Examples.
    pub examples: usize,
}

impl SentimentSet {
    /// Reads [`SENTIMENT_TEST`] under the models folder `dir`.
    ///
    /// ```no_run
    /// let set = runtime::eval::SentimentSet::load("../shared/models")?;
    /// # Ok::<(), runtime::Error>(())
    /// ```
    pub fn load(dir: impl AsRef<Path>) -> Result<SentimentSet, Error> {
        SentimentSet::from_file(&dir.as_ref().join(SENTIMENT_TEST))
    }

    /// Reads `{"text", "label", "score"}` lines (`label` 0 or 1; other fields are ignored).
    ///
    /// ```no_run
    /// let set = runtime::eval::SentimentSet::from_file("test.jsonl".as_ref())?;
    /// # Ok::<(), runtime::Error>(())
    /// ```
    pub fn from_file(path: &Path) -> Result<SentimentSet, Error> {
        let mut examples = Vec::new();
        for (line, row) in read_jsonl(path)? {
            let label = i64_field(&row, "label", path, line)?;
            if !(0..=1).contains(&label) {
                return Err(line_err(
                    path,
                    line,
                    format!("`label` is {label}, not 0 or 1"),
                ));
            }
            examples.push(SentimentExample {
                text: str_field(&row, "text", path, line)?,
                label: label as usize,
                score: f64_field(&row, "score", path, line)?,
            });
        }
        Ok(SentimentSet { examples })
    }

    /// The snippet texts, in [`SentimentSet::examples`] order.
    ///
    /// ```no_run
    /// let set = runtime::eval::SentimentSet::load("../shared/models")?;
    /// println!("{}", set.texts()[0]);
    /// # Ok::<(), runtime::Error>(())
    /// ```
    pub fn texts(&self) -> Vec<&str> {
        self.examples.iter().map(|e| e.text.as_str()).collect()
    }

    /// Embeds the snippets with `embed` in batches of [`SENTIMENT_BATCH`], in order of length;
    /// the result is in [`SentimentSet::examples`] order.
    ///
    /// ```no_run
    /// # let set = runtime::eval::SentimentSet::load("../shared/models")?;
    /// let emb = set.embed(&|texts| Ok(texts.iter().map(|_| vec![1.0; 384]).collect()))?;
    /// assert_eq!(emb.len(), set.examples.len());
    /// # Ok::<(), runtime::Error>(())
    /// ```
    pub fn embed(&self, embed: &EmbedFn) -> Result<Vec<Vec<f32>>, Error> {
        embed_in_length_order(&self.texts(), SENTIMENT_BATCH, embed)
    }

    /// The probe's figures on embeddings of [`SentimentSet::examples`] (in order).
    ///
    /// ```no_run
    /// # use runtime::eval::{Probe, SentimentSet};
    /// # let set = SentimentSet::load("../shared/models")?;
    /// # let probe = Probe::load("../shared/models")?;
    /// # let emb: Vec<Vec<f32>> = vec![];
    /// let m = set.metrics(&probe, &emb)?;
    /// println!("accuracy {:.4} ({} of {})", m.accuracy, m.correct, m.examples);
    /// # Ok::<(), runtime::Error>(())
    /// ```
    pub fn metrics(
        &self,
        probe: &Probe,
        embeddings: &[Vec<f32>],
    ) -> Result<SentimentMetrics, Error> {
        if embeddings.len() != self.examples.len() {
            return Err(Error::Invalid(format!(
                "sentiment: {} embeddings for {} examples",
                embeddings.len(),
                self.examples.len()
            )));
        }
        let mut correct = 0;
        let mut margins = Vec::with_capacity(embeddings.len());
        for (e, ex) in embeddings.iter().zip(&self.examples) {
            let [l0, l1] = probe.logits(e)?;
            // argmax; a tie goes to the first class, as numpy's argmax.
            let pred = usize::from(l1 > l0);
            correct += usize::from(pred == ex.label);
            margins.push(l1 - l0);
        }
        let scores: Vec<f64> = self.examples.iter().map(|e| e.score).collect();
        Ok(SentimentMetrics {
            accuracy: correct as f64 / self.examples.len() as f64,
            margin_spearman: spearman(&margins, &scores),
            correct,
            examples: self.examples.len(),
        })
    }

    /// Embeds the snippets with `embed` ([`SentimentSet::embed`]) and computes the figures.
    ///
    /// ```no_run
    /// # use runtime::eval::{Probe, SentimentSet};
    /// # let set = SentimentSet::load("../shared/models")?;
    /// # let probe = Probe::load("../shared/models")?;
    /// let m = set.evaluate(&probe, &|texts| Ok(texts.iter().map(|_| vec![0.0; 384]).collect()))?;
    /// # Ok::<(), runtime::Error>(())
    /// ```
    pub fn evaluate(&self, probe: &Probe, embed: &EmbedFn) -> Result<SentimentMetrics, Error> {
        self.metrics(probe, &self.embed(embed)?)
    }
}

/// The two-class logistic-regression sentiment probe: `logits = emb · weightᵀ + bias`.
///
/// ```
/// use runtime::eval::Probe;
/// let p = Probe::new(vec![1.0, 0.0, 0.0, 1.0], vec![0.5, 0.0]).unwrap();
/// assert_eq!(p.hidden(), 2);
/// assert_eq!(p.logits(&[1.0, 2.0]).unwrap(), [1.5, 2.0]);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Probe {
    weight: Vec<f32>,
    bias: [f32; 2],
}

impl Probe {
    /// A probe from `weight` `[2, hidden]` (row-major) and `bias` `[2]`.
    ///
    /// ```
    /// assert!(runtime::eval::Probe::new(vec![1.0; 6], vec![0.0, 0.0]).is_ok());
    /// assert!(runtime::eval::Probe::new(vec![1.0; 5], vec![0.0, 0.0]).is_err());
    /// ```
    pub fn new(weight: Vec<f32>, bias: Vec<f32>) -> Result<Probe, Error> {
        if weight.is_empty() || weight.len() & 1 != 0 || bias.len() != 2 {
            return Err(Error::Invalid(format!(
                "probe: weight of {} values and bias of {} do not make a [2, hidden] and [2] pair",
                weight.len(),
                bias.len()
            )));
        }
        Ok(Probe {
            weight,
            bias: [bias[0], bias[1]],
        })
    }

    /// Reads [`SENTIMENT_PROBE`] under the models folder `dir`.
    ///
    /// ```no_run
    /// let probe = runtime::eval::Probe::load("../shared/models")?;
    /// assert_eq!(probe.hidden(), 384);
    /// # Ok::<(), runtime::Error>(())
    /// ```
    pub fn load(dir: impl AsRef<Path>) -> Result<Probe, Error> {
        Probe::from_safetensors(&dir.as_ref().join(SENTIMENT_PROBE))
    }

    /// Reads a safetensors file holding F32 tensors `weight` `[2, hidden]` and `bias` `[2]`.
    ///
    /// ```no_run
    /// let probe = runtime::eval::Probe::from_safetensors("sentiment_head.safetensors".as_ref())?;
    /// # Ok::<(), runtime::Error>(())
    /// ```
    pub fn from_safetensors(path: &Path) -> Result<Probe, Error> {
        let bytes = std::fs::read(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let tensors = parse_safetensors(&bytes, path)?;
        let get = |name: &str| -> Result<&(Vec<usize>, Vec<f32>), Error> {
            tensors
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, t)| t)
                .ok_or_else(|| data_err(path, format!("no tensor `{name}`")))
        };
        let (wshape, w) = get("weight")?;
        let (bshape, b) = get("bias")?;
        if wshape.len() != 2 || wshape[0] != 2 || wshape[1] == 0 || bshape.as_slice() != [2] {
            return Err(data_err(
                path,
                format!("expected weight [2, hidden] and bias [2], got {wshape:?} and {bshape:?}"),
            ));
        }
        Probe::new(w.clone(), b.clone())
    }

    /// The embedding size the probe takes.
    ///
    /// ```
    /// let p = runtime::eval::Probe::new(vec![0.0; 8], vec![0.0; 2]).unwrap();
    /// assert_eq!(p.hidden(), 4);
    /// ```
    pub fn hidden(&self) -> usize {
        self.weight.len() / 2
    }

    /// The two logits of one embedding (accumulated in f64).
    ///
    /// ```
    /// let p = runtime::eval::Probe::new(vec![1.0, 1.0, -1.0, 1.0], vec![0.0, 1.0]).unwrap();
    /// assert_eq!(p.logits(&[2.0, 3.0]).unwrap(), [5.0, 2.0]);
    /// assert!(p.logits(&[1.0]).is_err());
    /// ```
    pub fn logits(&self, embedding: &[f32]) -> Result<[f64; 2], Error> {
        let h = self.hidden();
        if embedding.len() != h {
            return Err(Error::Invalid(format!(
                "probe takes {h}-dimensional embeddings, got {}",
                embedding.len()
            )));
        }
        let row = |c: usize| {
            self.bias[c] as f64
                + self.weight[c * h..(c + 1) * h]
                    .iter()
                    .zip(embedding)
                    .map(|(&w, &x)| w as f64 * x as f64)
                    .sum::<f64>()
        };
        Ok([row(0), row(1)])
    }
}

type NamedTensors = Vec<(String, (Vec<usize>, Vec<f32>))>;

/// The F32 tensors of a safetensors file: an 8-byte little-endian header size, a JSON header
/// `{name: {"dtype", "shape", "data_offsets": [begin, end]}}`, then the data.
fn parse_safetensors(bytes: &[u8], path: &Path) -> Result<NamedTensors, Error> {
    let bad = |m: String| data_err(path, format!("not a valid safetensors file: {m}"));
    if bytes.len() < 8 {
        return Err(bad("shorter than its header size".into()));
    }
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header = bytes
        .get(8..8usize.saturating_add(n))
        .ok_or_else(|| bad(format!("header of {n} bytes runs past the end")))?;
    let data = &bytes[8 + n..];
    let header: serde_json::Map<String, Value> =
        serde_json::from_slice(header).map_err(|e| bad(format!("header: {e}")))?;
    let mut out = Vec::new();
    for (name, info) in header {
        if name == "__metadata__" {
            continue;
        }
        let dtype = info["dtype"].as_str().unwrap_or("?");
        let shape: Option<Vec<usize>> = info["shape"]
            .as_array()
            .and_then(|a| a.iter().map(|d| d.as_u64().map(|d| d as usize)).collect());
        let offsets: Option<Vec<usize>> = info["data_offsets"]
            .as_array()
            .and_then(|a| a.iter().map(|d| d.as_u64().map(|d| d as usize)).collect());
        let (Some(shape), Some([begin, end])) = (shape, offsets.as_deref()) else {
            return Err(bad(format!("tensor `{name}` lacks shape or data_offsets")));
        };
        let (begin, end) = (*begin, *end);
        if dtype != "F32" {
            // Only F32 tensors are read; others are listed but not needed here.
            continue;
        }
        let count: usize = shape.iter().product();
        if begin > end || end > data.len() || end - begin != count * 4 {
            return Err(bad(format!(
                "tensor `{name}` {shape:?}: data offsets [{begin}, {end}] do not fit"
            )));
        }
        let values = data[begin..end]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        out.push((name, (shape, values)));
    }
    Ok(out)
}

/// Everything the evaluation needs: the two data sets and the probe.
///
/// ```no_run
/// let data = runtime::eval::EvalData::load("../shared/models")?;
/// let report = data.evaluate(&|texts| Ok(texts.iter().map(|_| vec![0.0; 384]).collect()))?;
/// # Ok::<(), runtime::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct EvalData {
    pub lee: LeeSet,
    pub sentiment: SentimentSet,
    pub probe: Probe,
}

/// The result of [`EvalData::evaluate`].
#[derive(Clone, Debug, PartialEq)]
pub struct Evaluation {
    pub lee: LeeMetrics,
    pub sentiment: SentimentMetrics,
    /// The embeddings of the sentiment snippets, in [`SentimentSet::examples`] order (to compare
    /// two models with [`compare_embeddings`]).
    pub sentiment_embeddings: Vec<Vec<f32>>,
}

impl EvalData {
    /// Reads the Lee set, the sentiment set and the probe from the models folder `dir`
    /// ([`LEE_DOCUMENTS`], [`LEE_PAIRS`], [`SENTIMENT_TEST`], [`SENTIMENT_PROBE`]).
    ///
    /// ```no_run
    /// let data = runtime::eval::EvalData::load("../shared/models")?;
    /// assert_eq!(data.probe.hidden(), 384);
    /// # Ok::<(), runtime::Error>(())
    /// ```
    pub fn load(dir: impl AsRef<Path>) -> Result<EvalData, Error> {
        let dir = dir.as_ref();
        let data = EvalData {
            lee: LeeSet::load(dir)?,
            sentiment: SentimentSet::load(dir)?,
            probe: Probe::load(dir)?,
        };
        Ok(data)
    }

    /// The number of texts one evaluation embeds (Lee documents and sentiment snippets).
    ///
    /// ```no_run
    /// let data = runtime::eval::EvalData::load("../shared/models")?;
    /// assert_eq!(data.text_count(), 2050);
    /// # Ok::<(), runtime::Error>(())
    /// ```
    pub fn text_count(&self) -> usize {
        self.lee.documents.len() + self.sentiment.examples.len()
    }

    /// Both metrics with the embedding function `embed`, which should give the L2-normalised
    /// sentence embeddings of the texts it is handed (see the [module docs](self)).
    ///
    /// ```no_run
    /// let data = runtime::eval::EvalData::load("../shared/models")?;
    /// let r = data.evaluate(&|texts| Ok(texts.iter().map(|_| vec![0.0; 384]).collect()))?;
    /// println!("{:.4} {:.4}", r.lee.pearson, r.sentiment.accuracy);
    /// # Ok::<(), runtime::Error>(())
    /// ```
    pub fn evaluate(&self, embed: &EmbedFn) -> Result<Evaluation, Error> {
        let lee = self.lee.evaluate(embed)?;
        let sentiment_embeddings = self.sentiment.embed(embed)?;
        let sentiment = self.sentiment.metrics(&self.probe, &sentiment_embeddings)?;
        Ok(Evaluation {
            lee,
            sentiment,
            sentiment_embeddings,
        })
    }

    /// Both metrics with a [`SentenceEncoder`] (its tokenizer should use
    /// [`TOKENIZER_OPTIONS`]).
    ///
    /// ```no_run
    /// # use runtime::eval::{EvalData, TOKENIZER_OPTIONS};
    /// # use runtime::text::{SentenceEncoder, Tokenizer};
    /// # use runtime::{CompileOptions, Model, Session};
    /// let data = EvalData::load("../shared/models")?;
    /// let session = Session::new(&Model::load("model.onnx")?, CompileOptions::default())?;
    /// let enc = SentenceEncoder::new(session, Tokenizer::from_file("tokenizer.json", TOKENIZER_OPTIONS)?);
    /// let r = data.evaluate_encoder(&enc)?;
    /// # Ok::<(), runtime::Error>(())
    /// ```
    pub fn evaluate_encoder(&self, encoder: &SentenceEncoder) -> Result<Evaluation, Error> {
        self.evaluate(&encoder_fn(encoder))
    }
}

/// A [`SentenceEncoder`] as an [`EmbedFn`].
///
/// ```no_run
/// # use runtime::text::{SentenceEncoder, Tokenizer};
/// # use runtime::{CompileOptions, Model, Session};
/// # let enc = SentenceEncoder::new(
/// #     Session::new(&Model::load("model.onnx")?, CompileOptions::default())?,
/// #     Tokenizer::from_file("tokenizer.json", runtime::eval::TOKENIZER_OPTIONS)?,
/// # );
/// let f = runtime::eval::encoder_fn(&enc);
/// let rows = f(&["a text", "another"])?;
/// assert_eq!(rows.len(), 2);
/// # Ok::<(), runtime::Error>(())
/// ```
pub fn encoder_fn(
    encoder: &SentenceEncoder,
) -> impl Fn(&[&str]) -> Result<Vec<Vec<f32>>, Error> + '_ {
    move |texts: &[&str]| rows(&encoder.embed(texts)?)
}

/// The rows of a `[n, hidden]` f32 tensor.
///
/// ```
/// use runtime::TensorValue;
/// let t = TensorValue::from_f32(vec![2, 2], vec![1., 2., 3., 4.]).unwrap();
/// assert_eq!(runtime::eval::rows(&t).unwrap(), vec![vec![1., 2.], vec![3., 4.]]);
/// ```
pub fn rows(t: &TensorValue) -> Result<Vec<Vec<f32>>, Error> {
    let v = t.typed::<f32>()?;
    match *t.shape() {
        [n, h] => Ok(if h == 0 {
            vec![Vec::new(); n]
        } else {
            v.chunks_exact(h).map(<[f32]>::to_vec).collect()
        }),
        _ => Err(Error::Invalid(format!(
            "expected [n, hidden] embeddings, got shape {:?}",
            t.shape()
        ))),
    }
}

/// Embeds `texts` in batches of `batch_size` taken in order of length (bytes; ties keep input
/// order), as the reference evaluation does, and returns the vectors in input order.
///
/// ```
/// use runtime::eval::embed_in_length_order;
/// let calls = std::cell::RefCell::new(vec![]);
/// let f = |b: &[&str]| {
///     calls.borrow_mut().push(b.len());
///     Ok(b.iter().map(|t| vec![t.len() as f32]).collect())
/// };
/// let out = embed_in_length_order(&["ccc", "a", "bb"], 2, &f).unwrap();
/// assert_eq!(out, vec![vec![3.0], vec![1.0], vec![2.0]]);
/// assert_eq!(*calls.borrow(), vec![2, 1]);
/// ```
pub fn embed_in_length_order(
    texts: &[&str],
    batch_size: usize,
    embed: &EmbedFn,
) -> Result<Vec<Vec<f32>>, Error> {
    if batch_size == 0 {
        return Err(Error::Invalid("batch size must be at least 1".into()));
    }
    let mut order: Vec<usize> = (0..texts.len()).collect();
    order.sort_by_key(|&i| texts[i].len());
    let mut out: Vec<Option<Vec<f32>>> = vec![None; texts.len()];
    let mut hidden = None;
    for chunk in order.chunks(batch_size) {
        let batch: Vec<&str> = chunk.iter().map(|&i| texts[i]).collect();
        let emb = embed(&batch)?;
        if emb.len() != batch.len() {
            return Err(Error::Invalid(format!(
                "the embedding function gave {} vectors for {} texts",
                emb.len(),
                batch.len()
            )));
        }
        for (&i, e) in chunk.iter().zip(emb) {
            if *hidden.get_or_insert(e.len()) != e.len() {
                return Err(Error::Invalid(format!(
                    "the embedding function gave vectors of {} and {} values",
                    hidden.unwrap_or(0),
                    e.len()
                )));
            }
            out[i] = Some(e);
        }
    }
    Ok(out
        .into_iter()
        .map(|e| e.expect("every text embedded"))
        .collect())
}

/// The cosine of two vectors, in f64: 1 when both are zero (they agree), 0 when only one is.
///
/// ```
/// let c = runtime::eval::cosine(&[1.0, 0.0], &[1.0, 1.0]).unwrap();
/// assert!((c - 0.5f64.sqrt()).abs() < 1e-12);
/// assert_eq!(runtime::eval::cosine(&[0.0], &[0.0]).unwrap(), 1.0);
/// assert_eq!(runtime::eval::cosine(&[0.0], &[2.0]).unwrap(), 0.0);
/// assert!(runtime::eval::cosine(&[1.0], &[1.0, 2.0]).is_err());
/// ```
pub fn cosine(a: &[f32], b: &[f32]) -> Result<f64, Error> {
    if a.len() != b.len() {
        return Err(Error::Invalid(format!(
            "cosine of vectors of {} and {} values",
            a.len(),
            b.len()
        )));
    }
    let (mut dot, mut na, mut nb) = (0.0f64, 0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (x as f64, y as f64);
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    let den = (na * nb).sqrt();
    Ok(if na == 0.0 && nb == 0.0 {
        1.0
    } else if den > 0.0 {
        dot / den
    } else {
        0.0
    })
}

/// Pearson's r of two equally long series (NaN when either is constant or shorter than 2).
///
/// ```
/// let r = runtime::eval::pearson(&[1.0, 2.0, 3.0], &[2.0, 4.0, 7.0]);
/// assert!((r - 0.9933992677987828).abs() < 1e-12);
/// ```
pub fn pearson(x: &[f64], y: &[f64]) -> f64 {
    assert_eq!(x.len(), y.len(), "pearson: series of different lengths");
    let n = x.len() as f64;
    let (mx, my) = (x.iter().sum::<f64>() / n, y.iter().sum::<f64>() / n);
    let cov: f64 = x.iter().zip(y).map(|(a, b)| (a - mx) * (b - my)).sum();
    let vx: f64 = x.iter().map(|a| (a - mx).powi(2)).sum();
    let vy: f64 = y.iter().map(|b| (b - my).powi(2)).sum();
    cov / (vx * vy).sqrt()
}

/// Ranks from 1, ties getting the average of their ranks (scipy's `rankdata`, method average).
fn ranks(x: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..x.len()).collect();
    order.sort_by(|&a, &b| x[a].total_cmp(&x[b]));
    let mut r = vec![0.0; x.len()];
    let mut i = 0;
    while i < order.len() {
        let mut j = i;
        while j + 1 < order.len() && x[order[j + 1]] == x[order[i]] {
            j += 1;
        }
        let avg = (i + j) as f64 / 2.0 + 1.0;
        for &k in &order[i..=j] {
            r[k] = avg;
        }
        i = j + 1;
    }
    r
}

/// Spearman's ρ: Pearson's r of the ranks, ties averaged (as `scipy.stats.spearmanr`).
///
/// ```
/// let rho = runtime::eval::spearman(&[1.0, 2.0, 3.0, 4.0], &[10.0, 20.0, 20.0, 40.0]);
/// assert!((rho - 0.9486832980505138).abs() < 1e-12);
/// ```
pub fn spearman(x: &[f64], y: &[f64]) -> f64 {
    assert_eq!(x.len(), y.len(), "spearman: series of different lengths");
    pearson(&ranks(x), &ranks(y))
}

/// How close two embeddings of the same texts are: the cosine of each pair of rows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EmbeddingAgreement {
    pub mean_cosine: f64,
    pub min_cosine: f64,
    /// The row with the smallest cosine.
    pub argmin: usize,
    /// The number of rows compared.
    pub count: usize,
}

/// Mean and minimum cosine between `a[i]` and `b[i]` (for example the INT8 and FP32 embeddings
/// of the same texts). The two sets must have the same number of rows, each of equal length.
///
/// ```
/// use runtime::eval::compare_embeddings;
/// let a = vec![vec![1.0, 0.0], vec![0.0, 1.0]];
/// let b = vec![vec![1.0, 0.0], vec![1.0, 1.0]];
/// let s = compare_embeddings(&a, &b).unwrap();
/// assert_eq!((s.count, s.argmin), (2, 1));
/// assert!((s.min_cosine - 0.5f64.sqrt()).abs() < 1e-12);
/// assert!((s.mean_cosine - (1.0 + 0.5f64.sqrt()) / 2.0).abs() < 1e-12);
/// assert!(compare_embeddings(&a, &b[..1]).is_err());
/// ```
pub fn compare_embeddings(a: &[Vec<f32>], b: &[Vec<f32>]) -> Result<EmbeddingAgreement, Error> {
    if a.len() != b.len() || a.is_empty() {
        return Err(Error::Invalid(format!(
            "compare_embeddings: {} and {} rows (need the same number, at least one)",
            a.len(),
            b.len()
        )));
    }
    let mut sum = 0.0;
    let (mut min, mut argmin) = (f64::INFINITY, 0);
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let c = cosine(x, y).map_err(|e| Error::Invalid(format!("row {i}: {e}")))?;
        sum += c;
        if c < min {
            (min, argmin) = (c, i);
        }
    }
    Ok(EmbeddingAgreement {
        mean_cosine: sum / a.len() as f64,
        min_cosine: min,
        argmin,
        count: a.len(),
    })
}

/// The models folder of the tests and tools: `$ENCORE_MODELS`, else `../shared/models`.
///
/// ```
/// let dir = runtime::eval::default_models_dir();
/// assert!(!dir.as_os_str().is_empty());
/// ```
pub fn default_models_dir() -> PathBuf {
    std::env::var_os("ENCORE_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("../shared/models"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str, body: &[u8]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("runtime_eval_{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        p
    }

    #[test]
    fn ranks_average_ties() {
        assert_eq!(ranks(&[3.0, 1.0, 3.0, 2.0]), vec![3.5, 1.0, 3.5, 2.0]);
        assert!(pearson(&[1.0, 1.0], &[1.0, 2.0]).is_nan());
    }

    #[test]
    fn malformed_lines_name_file_and_line() {
        let p = tmp(
            "s.jsonl",
            b"{\"text\": \"ok\", \"label\": 1, \"score\": 1.0}\n\n{oops\n",
        );
        let e = SentimentSet::from_file(&p).unwrap_err();
        assert!(matches!(e, Error::DataLine { line: 3, .. }), "{e}");
        assert!(
            e.to_string().contains("s.jsonl: line 3: not valid JSON"),
            "{e}"
        );
        let p = tmp("t.jsonl", b"{\"text\": \"ok\", \"score\": 1.0}\n");
        let e = SentimentSet::from_file(&p).unwrap_err();
        assert!(
            e.to_string().ends_with("t.jsonl: line 1: no `label` field"),
            "{e}"
        );
        let p = tmp(
            "u.jsonl",
            b"{\"text\": \"ok\", \"label\": 2, \"score\": 1.0}\n",
        );
        assert!(matches!(
            SentimentSet::from_file(&p),
            Err(Error::DataLine { line: 1, .. })
        ));
        let p = tmp("empty.jsonl", b"\n");
        assert!(matches!(
            SentimentSet::from_file(&p),
            Err(Error::Data { .. })
        ));
        let docs = tmp(
            "d.jsonl",
            b"{\"id\": 0, \"text\": \"a\"}\n{\"id\": 1, \"text\": \"b\"}\n",
        );
        let pairs = tmp(
            "p.jsonl",
            b"{\"a\": 0, \"b\": 1, \"score\": 0.5}\n{\"a\": 0, \"b\": 7, \"score\": 0.5}\n",
        );
        let e = LeeSet::from_files(&docs, &pairs).unwrap_err();
        assert!(
            e.to_string()
                .contains("p.jsonl: line 2: `b` = 7 is not a document id"),
            "{e}"
        );
        assert!(matches!(
            LeeSet::from_files(&docs, Path::new("/no/such/pairs.jsonl")),
            Err(Error::Io { .. })
        ));
    }

    #[test]
    fn safetensors_probe() {
        let header = br#"{"__metadata__":{"x":"y"},"bias":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"weight":{"dtype":"F32","shape":[2,2],"data_offsets":[8,24]}}"#;
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header);
        for v in [0.5f32, -0.5, 1.0, 2.0, 3.0, 4.0] {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        let p = tmp("probe.safetensors", &bytes);
        let probe = Probe::from_safetensors(&p).unwrap();
        assert_eq!(probe.logits(&[1.0, 1.0]).unwrap(), [3.5, 6.5]);
        bytes.truncate(bytes.len() - 1);
        let p = tmp("short.safetensors", &bytes);
        assert!(matches!(
            Probe::from_safetensors(&p),
            Err(Error::Data { .. })
        ));
    }

    #[test]
    fn metrics_on_a_toy_set() {
        let lee = LeeSet {
            documents: ["a", "bb", "ccc"]
                .iter()
                .enumerate()
                .map(|(i, t)| LeeDocument {
                    id: i as i64,
                    text: t.to_string(),
                })
                .collect(),
            pairs: vec![
                LeePair {
                    a: 0,
                    b: 1,
                    score: 0.9,
                },
                LeePair {
                    a: 0,
                    b: 2,
                    score: 0.1,
                },
                LeePair {
                    a: 1,
                    b: 2,
                    score: 0.5,
                },
            ],
        };
        let emb = |t: &[&str]| {
            Ok(t.iter()
                .map(|t| match t.len() {
                    1 => vec![1.0, 0.0],
                    2 => vec![1.0, 0.2],
                    _ => vec![0.0, 1.0],
                })
                .collect())
        };
        let m = lee.evaluate(&emb).unwrap();
        assert_eq!(m.pairs, 3);
        assert!((m.spearman - 1.0).abs() < 1e-12, "{m:?}");
        assert!(m.pearson > 0.9, "{m:?}");
        let set = SentimentSet {
            examples: vec![
                SentimentExample {
                    text: "good".into(),
                    label: 1,
                    score: 2.0,
                },
                SentimentExample {
                    text: "bad".into(),
                    label: 0,
                    score: -2.0,
                },
                SentimentExample {
                    text: "meh".into(),
                    label: 1,
                    score: 0.6,
                },
            ],
        };
        let probe = Probe::new(vec![0.0, 0.0, 1.0, 0.0], vec![0.0, 0.0]).unwrap();
        let e = vec![vec![1.0, 0.0], vec![-1.0, 0.0], vec![-0.5, 0.0]];
        let m = set.metrics(&probe, &e).unwrap();
        assert_eq!((m.correct, m.examples), (2, 3));
        assert!((m.margin_spearman - 1.0).abs() < 1e-12, "{m:?}");
        assert!(set.metrics(&probe, &e[..2]).is_err());
        assert!(set.metrics(&probe, &vec![vec![1.0]; 3]).is_err());
    }
}

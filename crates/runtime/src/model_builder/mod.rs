//! Writes BERT-family ONNX models with seeded random weights.
//!
//! The graphs reproduce what `torch.onnx.export` (TorchScript exporter, eager attention,
//! constant folding on) writes for the Hugging Face `BertModel`, `DistilBertModel` and
//! `XLMRobertaModel`: the same inputs (`input_ids`, `attention_mask`, and `token_type_ids` for
//! BERT, int64 `[batch, sequence]`), the same op patterns (Shape/Gather/Unsqueeze/Concat feeding
//! every Reshape, the `(1 - mask) * f32::MIN` or `Equal`/`Where` masks, GELU as
//! `Div(√2)→Erf→Add 1→Mul→Mul 0.5`, XLM-R's `CumSum` position ids) and the same node and
//! initializer naming. LayerNorm is either the opset-17 `LayerNormalization` op or the opset-14
//! decomposition torch writes below opset 17. They exist so that benchmarks and tests can use
//! models of real sizes (BERT-base: 110 M parameters) that are not shipped.
//!
//! Weights: every Linear weight, embedding table and bias is `N(0, weight_std²)`; LayerNorm γ is
//! `1 + N(0, weight_std²)` and β is `N(0, weight_std²)`. Biases and LayerNorm terms are not
//! zero or one on purpose, so that a dropped term changes the output. Each tensor's values depend
//! only on the seed and the tensor's name, so the same spec always gives the same bytes.
//!
//! ```
//! use runtime::model_builder::{build_model, Architecture, ModelSpec};
//! let spec = ModelSpec { layers: 1, ..ModelSpec::tiny(Architecture::DistilBert) };
//! let model = build_model(&spec).unwrap();
//! let graph = model.graph.unwrap();
//! assert_eq!(graph.input.len(), 2); // input_ids, attention_mask
//! assert!(graph.node.iter().any(|n| n.op_type == "Where"));
//! ```

mod arch;
mod graph;
mod rng;
mod write;

use std::fmt;
use std::fs::File;
use std::io::{BufWriter, Write as _};
use std::path::{Path, PathBuf};

use frontend_onnx::proto::ModelProto;

pub use write::write_proto;

/// The Hugging Face model class whose export is reproduced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Architecture {
    /// `BertModel`: word + position + token-type embeddings, optional pooler.
    Bert,
    /// `DistilBertModel`: word + position embeddings, `masked_fill` mask, no pooler.
    DistilBert,
    /// `XLMRobertaModel`: position ids from `cumsum(input_ids != pad)`, offset by the pad id.
    XlmRoberta,
}

impl Architecture {
    /// The names of the graph inputs, in order.
    pub fn input_names(self) -> &'static [&'static str] {
        match self {
            Architecture::Bert => &["input_ids", "attention_mask", "token_type_ids"],
            Architecture::DistilBert | Architecture::XlmRoberta => &["input_ids", "attention_mask"],
        }
    }

    /// Lower-case name as used in presets: `bert`, `distilbert`, `xlm-roberta`.
    pub fn name(self) -> &'static str {
        match self {
            Architecture::Bert => "bert",
            Architecture::DistilBert => "distilbert",
            Architecture::XlmRoberta => "xlm-roberta",
        }
    }
}

impl fmt::Display for Architecture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How LayerNorm appears in the graph, which also fixes the opset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LayerNormForm {
    /// Opset 17: one `LayerNormalization` node (axis -1).
    Op17,
    /// Opset 14: `ReduceMean, Sub, Pow 2, ReduceMean, Add eps, Sqrt, Div, Mul γ, Add β`, as torch
    /// exports `layer_norm` below opset 17.
    Decomposed14,
}

impl LayerNormForm {
    /// The `ai.onnx` opset the model imports.
    pub fn opset(self) -> i64 {
        match self {
            LayerNormForm::Op17 => 17,
            LayerNormForm::Decomposed14 => 14,
        }
    }

    /// The form for an opset number: 17 → [`LayerNormForm::Op17`], 14 →
    /// [`LayerNormForm::Decomposed14`]; others are not built.
    ///
    /// ```
    /// use runtime::model_builder::LayerNormForm;
    /// assert_eq!(LayerNormForm::from_opset(14), Some(LayerNormForm::Decomposed14));
    /// assert_eq!(LayerNormForm::from_opset(13), None);
    /// ```
    pub fn from_opset(opset: i64) -> Option<LayerNormForm> {
        match opset {
            17 => Some(LayerNormForm::Op17),
            14 => Some(LayerNormForm::Decomposed14),
            _ => None,
        }
    }
}

/// XLM-RoBERTa's `<pad>` id; its position ids start at `PAD + 1`.
pub const XLMR_PAD_ID: i64 = 1;

/// The size and seed of a model to build.
///
/// `max_positions` is the number of rows of the position table, Hugging Face's
/// `max_position_embeddings`. For XLM-R that includes the pad offset: 514 rows allow sequences
/// of 512 tokens.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelSpec {
    /// Which Hugging Face model class's export to reproduce.
    pub arch: Architecture,
    /// Encoder layers.
    pub layers: usize,
    /// Hidden size; a multiple of `heads`.
    pub hidden: usize,
    /// Attention heads.
    pub heads: usize,
    /// Inner size of the feed-forward block (`intermediate_size`).
    pub ffn: usize,
    /// Rows of the word embedding table.
    pub vocab: usize,
    /// Rows of the position table (see above for XLM-R's offset).
    pub max_positions: usize,
    /// Rows of the token-type table (BERT 2, XLM-R 1); DistilBERT has none and ignores this.
    pub type_vocab: usize,
    /// BERT and XLM-R only: `pooler_output = tanh(Gemm(last_hidden_state[:, 0]))`.
    pub with_pooler: bool,
    /// LayerNorm as an op (opset 17) or decomposed (opset 14).
    pub layer_norm: LayerNormForm,
    /// Seed of every random weight.
    pub seed: u64,
    /// LayerNorm epsilon (BERT and DistilBERT 1e-12, XLM-R 1e-5).
    pub eps: f32,
    /// Standard deviation of the random weights (Hugging Face initialises with 0.02).
    pub weight_std: f32,
}

/// The names [`ModelSpec::preset`] knows.
pub const PRESETS: &[&str] = &[
    "bert-base",
    "bert-large",
    "distilbert-base",
    "xlm-roberta-base",
    "minilm-l6",
    "minilm-l12",
    "bert-tiny",
    "distilbert-tiny",
    "xlm-roberta-tiny",
];

impl ModelSpec {
    /// `bert-base-uncased`: 12 layers, hidden 768, 12 heads, FFN 3072, vocab 30522, with pooler.
    /// About 110 M parameters, 440 MB.
    pub fn bert_base() -> ModelSpec {
        ModelSpec {
            arch: Architecture::Bert,
            layers: 12,
            hidden: 768,
            heads: 12,
            ffn: 3072,
            vocab: 30522,
            max_positions: 512,
            type_vocab: 2,
            with_pooler: true,
            layer_norm: LayerNormForm::Op17,
            seed: 0,
            eps: 1e-12,
            weight_std: 0.02,
        }
    }

    /// `distilbert-base-uncased`: 6 layers of BERT-base size, no token types, no pooler.
    pub fn distilbert_base() -> ModelSpec {
        ModelSpec {
            arch: Architecture::DistilBert,
            layers: 6,
            type_vocab: 0,
            with_pooler: false,
            ..ModelSpec::bert_base()
        }
    }

    /// `xlm-roberta-base`: BERT-base encoder, vocab 250002 (768 MB of embeddings alone), 514
    /// positions, 1 token type, eps 1e-5, no pooler (as feature-extraction exports write it).
    /// Set `vocab` lower for a smaller file; the encoder cost does not depend on it. Unless told
    /// otherwise (`build-model --vocab`), tools use this full shape: 277 M parameters, 1.1 GB.
    pub fn xlm_roberta_base() -> ModelSpec {
        ModelSpec {
            arch: Architecture::XlmRoberta,
            vocab: 250_002,
            max_positions: 514,
            type_vocab: 1,
            with_pooler: false,
            eps: 1e-5,
            ..ModelSpec::bert_base()
        }
    }

    /// The shapes of the random models in `shared/models/tiny/<arch>`: BERT 2×128 (4 heads,
    /// FFN 512, with pooler), DistilBERT 2×64 (2 heads, FFN 256), XLM-R 2×96 (3 heads, FFN 384,
    /// 130 positions); vocab 1000.
    pub fn tiny(arch: Architecture) -> ModelSpec {
        let base = ModelSpec {
            layers: 2,
            vocab: 1000,
            max_positions: 128,
            ..ModelSpec::bert_base()
        };
        match arch {
            Architecture::Bert => ModelSpec {
                hidden: 128,
                heads: 4,
                ffn: 512,
                ..base
            },
            Architecture::DistilBert => ModelSpec {
                arch,
                hidden: 64,
                heads: 2,
                ffn: 256,
                type_vocab: 0,
                with_pooler: false,
                ..base
            },
            Architecture::XlmRoberta => ModelSpec {
                arch,
                hidden: 96,
                heads: 3,
                ffn: 384,
                max_positions: 130,
                type_vocab: 1,
                with_pooler: false,
                eps: 1e-5,
                ..base
            },
        }
    }

    /// A spec by name; see [`PRESETS`]. `minilm-l6`/`minilm-l12` are all-MiniLM-L6/L12-v2 shapes
    /// (hidden 384, 12 heads, FFN 1536, no pooler).
    ///
    /// ```
    /// use runtime::model_builder::ModelSpec;
    /// let spec = ModelSpec::preset("bert-base").unwrap();
    /// assert_eq!((spec.layers, spec.hidden), (12, 768));
    /// assert!(ModelSpec::preset("gpt-2").is_none());
    /// ```
    pub fn preset(name: &str) -> Option<ModelSpec> {
        let minilm = |layers| ModelSpec {
            layers,
            hidden: 384,
            heads: 12,
            ffn: 1536,
            with_pooler: false,
            ..ModelSpec::bert_base()
        };
        Some(match name {
            "bert-base" => ModelSpec::bert_base(),
            "bert-large" => ModelSpec {
                layers: 24,
                hidden: 1024,
                heads: 16,
                ffn: 4096,
                ..ModelSpec::bert_base()
            },
            "distilbert-base" => ModelSpec::distilbert_base(),
            "xlm-roberta-base" => ModelSpec::xlm_roberta_base(),
            "minilm-l6" => minilm(6),
            "minilm-l12" => minilm(12),
            "bert-tiny" => ModelSpec::tiny(Architecture::Bert),
            "distilbert-tiny" => ModelSpec::tiny(Architecture::DistilBert),
            "xlm-roberta-tiny" => ModelSpec::tiny(Architecture::XlmRoberta),
            _ => return None,
        })
    }

    /// Head dimension, `hidden / heads`.
    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads.max(1)
    }

    /// Number of f32 parameters (every initializer).
    ///
    /// ```
    /// use runtime::model_builder::ModelSpec;
    /// let n = ModelSpec::bert_base().param_count();
    /// assert_eq!(n, 109_482_240); // the figure usually quoted for bert-base-uncased
    /// ```
    pub fn param_count(&self) -> u64 {
        let (h, f) = (self.hidden as u64, self.ffn as u64);
        let types = match self.arch {
            Architecture::DistilBert => 0,
            _ => self.type_vocab as u64,
        };
        let embeddings = (self.vocab as u64 + self.max_positions as u64 + types) * h + 2 * h;
        let layer = 4 * (h * h + h) + (h * f + f) + (f * h + h) + 4 * h;
        let pooler = if self.with_pooler { h * h + h } else { 0 };
        embeddings + self.layers as u64 * layer + pooler
    }

    /// Checks the sizes; every builder entry point calls this first.
    pub fn validate(&self) -> Result<(), BuildError> {
        let bad =
            |field: &'static str, reason: String| Err(BuildError::InvalidSpec { field, reason });
        for (field, v) in [
            ("layers", self.layers),
            ("hidden", self.hidden),
            ("heads", self.heads),
            ("ffn", self.ffn),
            ("vocab", self.vocab),
            ("max_positions", self.max_positions),
        ] {
            if v == 0 {
                return bad(field, "must be at least 1".into());
            }
        }
        if !self.hidden.is_multiple_of(self.heads) {
            return bad(
                "heads",
                format!("{} does not divide hidden size {}", self.heads, self.hidden),
            );
        }
        match self.arch {
            Architecture::Bert | Architecture::XlmRoberta if self.type_vocab == 0 => {
                return bad(
                    "type_vocab",
                    format!("{} needs at least 1 token type", self.arch),
                );
            }
            Architecture::DistilBert if self.with_pooler => {
                return bad("with_pooler", "DistilBertModel has no pooler".into());
            }
            Architecture::XlmRoberta if (self.max_positions as i64) < XLMR_PAD_ID + 2 => {
                return bad(
                    "max_positions",
                    format!(
                        "XLM-R positions start at pad id + 1 = {}, so the table needs more than {} rows",
                        XLMR_PAD_ID + 1,
                        self.max_positions
                    ),
                );
            }
            _ => {}
        }
        if !(self.eps.is_finite() && self.eps > 0.0) {
            return bad(
                "eps",
                format!("{} is not a positive finite number", self.eps),
            );
        }
        if !(self.weight_std.is_finite() && self.weight_std >= 0.0) {
            return bad(
                "weight_std",
                format!("{} is not a non-negative finite number", self.weight_std),
            );
        }
        let bytes = self.param_count().saturating_mul(4);
        if bytes >= PROTOBUF_LIMIT {
            return Err(BuildError::TooLarge { bytes });
        }
        Ok(())
    }
}

/// Protobuf messages, and so ONNX files without external data, cannot reach 2 GiB.
const PROTOBUF_LIMIT: u64 = 2 << 30;

/// What can go wrong building or writing a model.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("invalid model spec: {field}: {reason}")]
    InvalidSpec { field: &'static str, reason: String },
    #[error(
        "the weights take {bytes} bytes, but an ONNX file without external data must stay under \
         2 GiB (protobuf limit); lower vocab, layers or hidden"
    )]
    TooLarge { bytes: u64 },
    #[error("writing model to {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Builds the ONNX model for `spec` in memory. Weights are `Bytes` owned by the proto, so
/// encoding or writing them does not copy them again.
///
/// ```
/// use runtime::model_builder::{build_model, Architecture, LayerNormForm, ModelSpec};
/// let spec = ModelSpec {
///     layer_norm: LayerNormForm::Decomposed14,
///     ..ModelSpec::tiny(Architecture::XlmRoberta)
/// };
/// let model = build_model(&spec).unwrap();
/// assert_eq!(model.opset_import[0].version, 14);
/// let ops: Vec<_> = model.graph.unwrap().node.iter().map(|n| n.op_type.clone()).collect();
/// assert!(ops.contains(&"CumSum".to_string()) && ops.contains(&"ReduceMean".to_string()));
/// ```
pub fn build_model(spec: &ModelSpec) -> Result<ModelProto, BuildError> {
    spec.validate()?;
    Ok(arch::build(spec))
}

/// Builds the model for `spec` and writes it to `path` (through a temporary file in the same
/// folder, renamed at the end, so a failed write leaves no truncated model behind).
///
/// ```no_run
/// use runtime::model_builder::{write_model, ModelSpec};
/// write_model(&ModelSpec::bert_base(), std::path::Path::new("bert-base.onnx")).unwrap();
/// ```
pub fn write_model(spec: &ModelSpec, path: &Path) -> Result<(), BuildError> {
    let model = build_model(spec)?;
    let io = |source| BuildError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file_name = path.file_name().ok_or_else(|| {
        io(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "no file name",
        ))
    })?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(file_name);
    tmp_name.push(format!(".tmp-{}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let result = (|| {
        let mut w = BufWriter::with_capacity(1 << 20, File::create(&tmp)?);
        write_proto(&model, &mut w)?;
        w.flush()?;
        w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(io)
}

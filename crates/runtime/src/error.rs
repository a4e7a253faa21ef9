//! The errors of the public API.

use std::path::PathBuf;

use ir::DType;

/// Everything that can go wrong when loading, compiling or running a model, or tokenizing text.
///
/// Non-exhaustive: later versions may add variants without breaking callers.
///
/// Each variant names what and where: the input, the node (by its name in the source model) and
/// the op. Bad inputs give one of these, never a panic.
///
/// ```
/// use runtime::Error;
/// let e = Error::MissingInput { name: "input_ids".into() };
/// assert_eq!(e.to_string(), "missing input `input_ids`");
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("IR: {0}")]
    Ir(#[from] ir::IrError),
    #[error("missing input `{name}`")]
    MissingInput { name: String },
    #[error("unknown input `{name}`; the model's inputs are {known:?}")]
    UnknownInput { name: String, known: Vec<String> },
    #[error("the model has no output `{name}`; its outputs are {known:?}")]
    UnknownOutput { name: String, known: Vec<String> },
    #[error("input `{name}` is given twice")]
    DuplicateInput { name: String },
    #[error("input `{name}`: expected dtype {expected}, got {actual}")]
    InputDType {
        name: String,
        expected: DType,
        actual: DType,
    },
    #[error("input `{name}`: expected rank {expected}, got shape {actual:?}")]
    InputRank {
        name: String,
        expected: usize,
        actual: Vec<usize>,
    },
    #[error("input `{name}`, dim {dim}: expected {expected}, got {actual}")]
    InputShape {
        name: String,
        dim: usize,
        expected: String,
        actual: usize,
    },
    #[error("input `{input}`: token id {token_id} is outside the vocabulary of {vocab_size} rows (embedding lookup `{node}`)")]
    TokenOutOfVocab {
        input: String,
        token_id: i64,
        vocab_size: usize,
        node: String,
    },
    #[error("sequence of {len} tokens is longer than the model's {max_positions} positions (position embedding `{node}`)")]
    SequenceTooLong {
        len: usize,
        max_positions: usize,
        node: String,
    },
    #[error("batch of {batch} is larger than max_batch {max_batch}")]
    BatchTooLarge { batch: usize, max_batch: usize },
    #[error("node `{node}` ({op}): {message}")]
    Op {
        node: String,
        op: &'static str,
        message: String,
    },
    #[error("tensor of shape {shape:?} needs {expected} elements, got {actual}")]
    TensorSize {
        shape: Vec<usize>,
        expected: usize,
        actual: usize,
    },
    #[error("expected a {expected} tensor, got {actual}")]
    DType { expected: DType, actual: DType },
    #[error("{path}: {message}")]
    Npy { path: PathBuf, message: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("import: {0}")]
    Import(#[from] frontend_onnx::ImportError),
    #[error("optimizer: {0}")]
    Pass(#[from] passes::PassError),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("empty text: {}", match .index { Some(i) => format!("text {i} is empty"), None => "no texts given".to_string() })]
    EmptyText { index: Option<usize> },
    /// A malformed line of a data or text file: the file, the 1-based line and what is wrong.
    #[error("{path}: line {line}: {message}")]
    DataLine {
        path: PathBuf,
        line: usize,
        message: String,
    },
    /// A data file unusable as a whole (empty, missing tensors, wrong shapes).
    #[error("{path}: {message}")]
    Data { path: PathBuf, message: String },
    /// A compiled model file (`.encore`) that cannot be read or written.
    #[error("compiled model {path}: {message}")]
    Compiled { path: String, message: String },
    #[error("{0}")]
    Invalid(String),
}

impl Error {
    pub(crate) fn op(node: &str, op: &'static str, message: impl Into<String>) -> Error {
        Error::Op {
            node: node.to_string(),
            op,
            message: message.into(),
        }
    }
}

impl From<codegen::lower::LowerError> for Error {
    fn from(e: codegen::lower::LowerError) -> Error {
        match e {
            codegen::lower::LowerError::Op { node, op, message } => Error::Op { node, op, message },
            codegen::lower::LowerError::Ir(e) => Error::Ir(e),
            e @ codegen::lower::LowerError::Program { .. } => {
                Error::Invalid(format!("internal: {e}"))
            }
        }
    }
}

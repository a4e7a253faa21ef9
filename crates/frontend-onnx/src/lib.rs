//! ONNX import into the encore IR.
//!
//! [`import_path`] memory-maps a `.onnx` file and turns it into an [`ir::Graph`]; the weights are
//! not copied: every initializer stored as `raw_data` (or in an external data file) becomes an
//! [`ir::Tensor`] whose bytes are a slice of the mapping.
//!
//! ```no_run
//! let graph = frontend_onnx::import_path("model.onnx")?;
//! graph.verify()?;
//! println!("{}", ir::text::print(&graph)?);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # What is imported
//!
//! The default ONNX domain (`""` or `ai.onnx`) at opsets 7 to 27. Domains listed in
//! `opset_import` that no node uses are ignored. The ops are those a BERT-family encoder exported
//! by torch or optimum contains:
//!
//! - elementwise: Add, Sub, Mul, Div, Pow (an exponent of another numeric dtype is cast to the
//!   base's, an integer base with a float exponent is computed in f32 and truncated), Max, Min,
//!   Sum (variadic ones become chains), Mean (the Sum chain divided by the count), Mod (both
//!   `fmod` forms), Equal, Less, Greater, And, Or,
//!   Xor, Not, Neg, Abs, Sqrt, Reciprocal, Exp, Log, Erf, Tanh, Sigmoid, Relu, Sin, Cos, Round
//!   (half to even), Ceil, Floor, Sign (floats and integers), IsNaN, IsInf, Gelu (opset 20+), Where, Cast and CastLike (whose target is
//!   its second input's ONNX type where the model states it; to FLOAT16 and BFLOAT16 as a
//!   rounding to their precision in f32, to DOUBLE as to FLOAT, see below);
//! - shapes and indexing: Shape, Reshape, Transpose, Unsqueeze, Squeeze, Flatten, Concat, Gather,
//!   GatherElements, GatherND, ScatterND and ScatterElements (every reduction of the opset),
//!   Pad (all four modes, axes from opset 18), Slice, Expand,
//!   ConstantOfShape, Range, CumSum, Trilu;
//! - reductions: ReduceMean, ReduceSum, ReduceMax, ReduceMin, ReduceProd (axes as attribute or
//!   input, per opset; an input that is not a constant is read at run time, except with
//!   `noop_with_empty_axes`), ReduceL1, ReduceL2, ReduceSumSquare, ReduceLogSum and
//!   ReduceLogSumExp (as their definitions over ReduceSum, the last shifted by the maximum),
//!   Size (a product of the Shape), and ArgMax and ArgMin (all attributes);
//! - linear algebra and normalisation: MatMul, Gemm, Einsum (any valid equation, ellipses and
//!   diagonals included, run by a direct summation loop: for small operands), Softmax and LogSoftmax (before opset 13
//!   their 2-D coercion is imported exactly: one op on the last axis, else Flatten, Softmax and
//!   Reshape; LogSoftmax as `(x - max) - log(sum(exp(x - max)))` by reductions),
//!   LayerNormalization (opset 17+; its Mean and InvStdDev outputs, when used, by reductions
//!   beside the op), RMSNormalization (opset 23, as its definition by reductions), Attention
//!   (opset 23: 3-D and 4-D, MHA and GQA, bool and float masks, causal, softcap, past and
//!   present caches, every `qk_matmul_output_mode`; as MatMul, Softmax and the rest; not
//!   `nonpad_kv_seqlen`, sliding windows, or a mask shorter than the keys), RotaryEmbedding
//!   (opset 23: 3-D and 4-D, both pairings, partial rotary dims, with or without position ids);
//! - quantization: QuantizeLinear, DequantizeLinear (not blocked), DynamicQuantizeLinear,
//!   MatMulInteger;
//! - Constant, and Identity and Dropout, which add no node (Dropout's mask must be unused, and
//!   its training mode a constant false);
//! - control flow: If, whose two branches are imported inline (reading values of the enclosing
//!   graph by name) and whose outputs each become a `select` of the two branch values, whole
//!   and of any shape: a condition that constant folding decides (DeBERTa-v2's comparison of
//!   two lengths that are both the sequence) leaves the other branch as dead code; otherwise
//!   both branches run. Loop (opset 11 and later, over tensors), whose trip count is known only
//!   when it runs: its body becomes an [`ir::Op::Loop`] holding the body as a graph of its own,
//!   and every value of the enclosing graphs that the body reads by name (at any depth of nested
//!   bodies) becomes an explicit input of the loop and of the body, so that no IR graph reads
//!   outside itself. An absent trip count is `i64::MAX` and an absent condition `true`; the
//!   body's condition output decides whether another iteration runs even then, as onnxruntime
//!   runs it. Sequence and optional values (Loop-13, Loop-16 over them) are not tensors: refused.
//!   Scan is not imported.
//!
//! Anything else is an [`ImportError::UnsupportedOp`] naming the node, op, domain and opset, never
//! a silently different graph. Inputs that the IR needs at import (a Slice's starts when steps
//! come without axes, Reduce axes with `noop_with_empty_axes`) must be constants (or declared
//! with a zero-length dimension, which leaves only the empty value), else
//! [`ImportError::NonConstantInput`]; Unsqueeze, Squeeze and Reduce axes that are not constants
//! are read at run time.
//!
//! Output dtypes are computed per the ONNX rules (and checked against any declared type);
//! output shapes are taken from the model's `value_info` and graph outputs where present,
//! otherwise left unknown for shape inference (a pass) to fill in. Dimensions become symbols:
//! `dim_param`s sanitized into identifiers, missing dims fresh `unk<N>` symbols.
//!
//! Constants: initializers and `Constant` values of FLOAT, UINT8, INT8, INT32, INT64 and BOOL keep
//! their bytes; FLOAT16, BFLOAT16 and DOUBLE constants are converted to f32.
//!
//! # Half precision and double
//!
//! encore computes every float in f32. FLOAT16, BFLOAT16 and DOUBLE tensors are widened to f32
//! at import (DOUBLE narrowed): weights exactly (a double beyond f32's range becomes ±inf),
//! graph inputs of those types become f32 inputs (feed f32), values and graph outputs declared
//! with them are f32 (outputs are not cast back: the caller gets f32, which holds every f16 and
//! bf16 value exactly), and a `Cast` to FLOAT16 or BFLOAT16 rounds each value to that type's
//! precision (and range: ±inf beyond float16's) but keeps it in f32; a `Cast` to DOUBLE is a
//! `Cast` to f32. A half-precision model therefore computes what its FP32 twin computes on the
//! same (rounded) weights, usually closer to the FP32 original than onnxruntime's f16 kernels. Node names are
//! the ONNX names (the initializer's name for initializers), made unique with a `~N` suffix when
//! they collide, so that [`ir::text::ConstantSource`] can find constants by name.
//!
//! # Why prost, and not `onnx-protobuf` or generated code
//!
//! The messages in [`proto`] are written out with `#[derive(prost::Message)]`, so there is no
//! `protoc`, no build script and no generated file to keep in sync, and the crate builds offline
//! anywhere. More importantly, prost can type `bytes` fields as [`bytes::Bytes`]: decoding from a
//! `Bytes` that owns a memory map makes `TensorProto.raw_data` a slice of that map instead of a
//! fresh `Vec<u8>`. The `onnx-protobuf` crate (rust-protobuf) decodes into `Vec<u8>` fields, which
//! copies every weight (90 MB for MiniLM) at load time; tract made the same choice of prost for its
//! ONNX importer.

mod import;
mod ops;
pub mod proto;
mod tensor;

use std::path::{Path, PathBuf};

use bytes::Bytes;
use prost::Message;

pub use tensor::onnx_dtype_name;

/// Errors of ONNX import. Every variant names what went wrong and where (node, op, value).
///
/// ```
/// use frontend_onnx::{import_bytes, ImportError};
/// // An empty buffer is a valid, empty ModelProto, without a graph.
/// let err = import_bytes(bytes::Bytes::new(), None).unwrap_err();
/// assert!(matches!(err, ImportError::MissingGraph));
/// assert_eq!(err.to_string(), "the model has no graph");
/// ```
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("cannot read `{}`: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("not a valid ONNX protobuf: {source}")]
    Decode { source: prost::DecodeError },
    #[error("the model has no graph")]
    MissingGraph,
    #[error("opset {version} of domain `{domain}` is not supported (the default domain needs opset 7 to 27)")]
    UnsupportedOpset { domain: String, version: i64 },
    #[error("opset_import lists domain `{domain}` twice, at opsets {first} and {second}")]
    ConflictingOpsets {
        domain: String,
        first: i64,
        second: i64,
    },
    #[error("node `{node}`: op `{op_type}` (domain `{domain}`, opset {opset}) is not supported")]
    UnsupportedOp {
        node: String,
        op_type: String,
        domain: String,
        opset: i64,
    },
    #[error("node `{node}` reads `{input}`, which no graph input, initializer or node produces")]
    DanglingInput { node: String, input: String },
    #[error("value `{name}` is produced twice: by {first} and by {second}")]
    DuplicateProducer {
        name: String,
        first: String,
        second: String,
    },
    #[error("graph output `{name}` is produced by no node, input or initializer")]
    MissingOutput { name: String },
    #[error("the nodes form a cycle through node `{node}`")]
    Cycle { node: String },
    #[error(
        "tensor `{name}`: its dtype and dims need {expected} bytes of data, it holds {actual}"
    )]
    InitializerSize {
        name: String,
        expected: usize,
        actual: usize,
    },
    #[error("tensor `{name}`: {message}")]
    BadTensor { name: String, message: String },
    #[error("{what}: ONNX data type {} ({data_type}) is not supported", onnx_dtype_name(*data_type))]
    UnsupportedDType { what: String, data_type: i32 },
    #[error("node `{node}` ({op_type}), attribute `{attr}`: {message}")]
    BadAttribute {
        node: String,
        op_type: String,
        attr: String,
        message: String,
    },
    #[error("node `{node}`: input `{input}` must be a constant: {why}")]
    NonConstantInput {
        node: String,
        input: String,
        why: String,
    },
    #[error("node `{node}` ({op_type}): {message}")]
    BadNode {
        node: String,
        op_type: String,
        message: String,
    },
    #[error("value `{name}`: the model declares {declared}, the op produces {computed}")]
    TypeMismatch {
        name: String,
        declared: String,
        computed: String,
    },
    #[error("tensor `{tensor}`, external data: {message}")]
    ExternalData { tensor: String, message: String },
    #[error(transparent)]
    Ir(#[from] ir::IrError),
}

/// Memory-maps the model at `path` and imports it. Constants point into the mapping; external
/// data files (`TensorProto.data_location = EXTERNAL`) are found relative to the model's folder
/// and mapped too.
///
/// The file must not be modified while the graph (or any tensor taken from it) is alive: the
/// mapping is shared with the file, as in every mmap-based model loader.
///
/// ```no_run
/// let g = frontend_onnx::import_path("../shared/models/tiny/bert/model.onnx")?;
/// assert_eq!(g.inputs().len(), 3);
/// # Ok::<(), frontend_onnx::ImportError>(())
/// ```
pub fn import_path(path: impl AsRef<Path>) -> Result<ir::Graph, ImportError> {
    let path = path.as_ref();
    let bytes = tensor::map_file(path)?;
    let base = path.parent().unwrap_or_else(|| Path::new("."));
    import_bytes(bytes, Some(base))
}

/// Imports a model from bytes already in memory. Tensors stored as `raw_data` share `bytes`.
/// External data is resolved relative to `base_dir`; without one, a model with external data is an
/// [`ImportError::ExternalData`] error.
///
/// ```
/// use frontend_onnx::{import_bytes, ImportError};
/// let err = import_bytes(bytes::Bytes::from_static(b"\xff\xff\xff"), None).unwrap_err();
/// assert!(matches!(err, ImportError::Decode { .. }));
/// ```
pub fn import_bytes(bytes: Bytes, base_dir: Option<&Path>) -> Result<ir::Graph, ImportError> {
    let model = decode_model(bytes)?;
    import::import_model(&model, base_dir)
}

/// Decodes an ONNX `ModelProto` without importing it. Byte fields share `bytes`.
///
/// ```
/// use prost::Message;
/// use frontend_onnx::proto::ModelProto;
/// let m = ModelProto { ir_version: 8, ..Default::default() };
/// let back = frontend_onnx::decode_model(m.encode_to_vec().into()).unwrap();
/// assert_eq!(back.ir_version, 8);
/// ```
pub fn decode_model(bytes: Bytes) -> Result<proto::ModelProto, ImportError> {
    proto::ModelProto::decode(bytes).map_err(|source| ImportError::Decode { source })
}

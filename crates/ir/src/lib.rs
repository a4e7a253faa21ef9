//! The encore intermediate representation.
//!
//! A model is a [`Graph`] of [`Op`]s over values typed by [`TensorType`] (a [`DType`] and a
//! shape whose [`Dim`]s may be symbolic, such as `batch` and `sequence`). Constants are
//! [`Tensor`]s whose bytes may point into a memory-mapped model file. The graph has a stable
//! line-per-node text form ([`text::print`], [`text::parse`]) and a verifier ([`Graph::verify`]).
//!
//! This crate is internal to the workspace: its API may change; `runtime` is the stable surface.

mod dtype;
mod einsum;
mod graph;
mod op;
mod shape;
mod tensor;
pub mod text;
mod verify;

pub use dtype::DType;
pub use einsum::{einsum_plan, EinsumPlan};
pub use graph::{Graph, Node, NodeId, Outlet, Wire};
pub use op::{
    qkv_pieces, u8_qparams, ActQuant, AttnProducts, Attr, BinaryOp, EpilogueStep, GeluApprox,
    LoopParts, Op, OpKind, OutU8, PadMode, ReduceOp, ScatterReduction, UnaryOp, INLINE_LIMIT,
    PACKED_TOKENS,
};
pub use shape::{fixed_shape, is_symbol, Dim, Shape, TensorType};
pub use tensor::{byte_size, Element, Tensor};

/// Errors of the IR: building, verifying, printing and parsing graphs.
#[derive(Debug, thiserror::Error)]
pub enum IrError {
    #[error("text form, line {line}: {message}")]
    Parse { line: usize, message: String },
    #[error("unknown op `{0}`")]
    UnknownOp(String),
    #[error("op `{op}`, attribute `{attr}`: {message}")]
    BadAttr {
        op: String,
        attr: String,
        message: String,
    },
    #[error("node `{node}` ({op}) takes {expected} inputs, got {actual}")]
    Arity {
        node: String,
        op: &'static str,
        expected: String,
        actual: usize,
    },
    #[error("tensor {dtype}{shape:?} needs {expected} bytes, got {actual}")]
    TensorSize {
        dtype: DType,
        shape: Vec<usize>,
        expected: usize,
        actual: usize,
    },
    #[error("tensor {dtype}{shape:?} has more bytes than this machine can address")]
    TensorTooLarge { dtype: DType, shape: Vec<usize> },
    #[error("expected dtype {expected}, got {actual}")]
    DTypeMismatch { expected: DType, actual: DType },
    #[error("constant data is not available (parsed from text without its model)")]
    MissingData,
    #[error("symbol `{0}` has no value")]
    UnboundSymbol(String),
    /// A dimension whose value (its coefficient times its bound symbols) overflows.
    #[error("dimension `{0}` overflows")]
    DimOverflow(String),
    #[error("the graph has a cycle")]
    Cycle,
    #[error("verifier: node `{node}`: {message}")]
    Verify { node: String, message: String },
    #[error("invalid graph: {0}")]
    Invalid(String),
}

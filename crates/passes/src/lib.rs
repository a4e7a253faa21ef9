//! Graph passes of the encore compiler, the pass manager and the dumps.
//!
//! A [`Pass`] rewrites an [`ir::Graph`] in place and says whether it changed it. Passes are named
//! after their type (`ShapeInference`, `RecognizeAttention`, …); that name is what dumps, the
//! CLI's `--after` / `--stop-after` flags and error messages use. A [`Pipeline`] runs a list of
//! passes to a fixpoint, verifies the graph after every pass and can dump the text form
//! ([`ir::text::print`]) after the import and after each pass.
//!
//! `declutter` turns an imported ONNX graph into the canonical form the later pipelines
//! (`quantize`, `fuse`) work on: every value typed with symbolic shapes, shape subgraphs folded
//! into constants, and `Linear`, `LayerNorm`, `Gelu` and `Attention` recognised from their
//! decompositions. Its passes, in order: [`ShapeInference`], [`ConstantFolding`],
//! [`DeadCodeElimination`], [`RecognizeLinear`], [`RecognizeLayerNorm`], [`RecognizeGelu`],
//! [`RecognizeAttention`]. `quantize` ([`SmoothQuant`], [`QuantizeLinears`]) makes an INT8 graph
//! from calibration statistics; `fuse` ([`FoldQdq`], [`FuseEpilogue`]) folds quantized dialects
//! onto integer GEMMs and grows GEMM epilogues; `pack` ([`PackTokens`]) makes the token-wise layers
//! run on the real tokens of a batch only. For a CLI: [`Pipeline::by_name`] finds a pipeline, and
//! [`DumpSpec::parse`] reads `all` or a comma-separated list of pass names (`import` is the
//! graph before the first pass); unknown names are an error.
//!
//! ```
//! use passes::{DumpSpec, Pipeline, RunOptions};
//! let mut g = ir::text::parse(
//!     "%0 = input[name=\"x\"] : f32[B,4]\n\
//!      %1 = const[value=f32[]{1.4142135}] : f32[]\n\
//!      %2 = div(%0, %1) : f32[*]\n\
//!      %3 = erf(%2) : f32[*]\n\
//!      %4 = const[value=f32[]{1.0}] : f32[]\n\
//!      %5 = add(%3, %4) : f32[*]\n\
//!      %6 = mul(%0, %5) : f32[*]\n\
//!      %7 = const[value=f32[]{0.5}] : f32[]\n\
//!      %8 = mul(%6, %7) : f32[*]\n\
//!      output \"y\" = %8\n",
//!     None,
//! ).unwrap();
//! let mut dumps = Vec::new();
//! let mut on_dump = |pass: &str, text: &str| dumps.push((pass.to_string(), text.to_string()));
//! let mut opts = RunOptions {
//!     dump_after: DumpSpec::Named(vec!["RecognizeGelu".into()]),
//!     dump: Some(&mut on_dump),
//!     ..RunOptions::default()
//! };
//! Pipeline::declutter().run(&mut g, &mut opts).unwrap();
//! assert_eq!(dumps[0].0, "RecognizeGelu");
//! assert!(dumps[0].1.contains("gelu[approx=\"erf\"](%0) : f32[B,4]"));
//! ```
//!
//! This crate is internal to the workspace; `runtime` is the stable surface.

mod const_fold;
mod context;
mod dce;
mod eval;
mod fuse;
mod pack;
mod pipeline;
mod quantize;
mod recognize;
mod rewrite;
mod shape_infer;
mod sym;

pub use const_fold::ConstantFolding;
pub use context::{
    ActivationMode, CalibrationStats, ChannelStats, Note, NoteKind, PassContext, QuantizeOptions,
    Report,
};
pub use dce::DeadCodeElimination;
pub use eval::eval_node;
pub use fuse::{FoldQdq, FuseEpilogue};
pub use pack::PackTokens;
pub use pipeline::{DumpFn, DumpSpec, PassRun, Pipeline, RunOptions, RunReport};
pub use quantize::{
    group_by_input, quantize_weight, smoothing_factors, QuantizeAttention, QuantizeLinears,
    SmoothQuant,
};
pub use recognize::{RecognizeAttention, RecognizeGelu, RecognizeLayerNorm, RecognizeLinear};
pub use shape_infer::{analyse, Analysis, ShapeInference};
pub use sym::{SymInt, SymTensor, SMALL};

/// A graph pass.
///
/// ```
/// use passes::{Pass, DeadCodeElimination};
/// let mut g = ir::text::parse(
///     "%0 = input[name=\"x\"] : f32[2]\n%1 = neg(%0) : f32[2]\noutput \"y\" = %0\n",
///     None,
/// ).unwrap();
/// assert_eq!(DeadCodeElimination.name(), "DeadCodeElimination");
/// assert!(DeadCodeElimination.run(&mut g, &mut passes::PassContext::default()).unwrap());
/// assert_eq!(g.node_count(), 1);
/// ```
pub trait Pass {
    /// The type's name: used in dumps, `--after`/`--stop-after` and errors.
    fn name(&self) -> &'static str;
    /// Rewrites `graph`; returns whether anything changed. `ctx` carries the options, the
    /// calibration statistics and the report of decisions.
    fn run(&self, graph: &mut ir::Graph, ctx: &mut PassContext<'_>) -> Result<bool, PassError>;
}

/// Errors of the passes. Each names the pass, and the node where there is one.
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    #[error("{pass} on node {node}: {message}")]
    Node {
        pass: &'static str,
        node: String,
        message: String,
    },
    #[error("{pass}: {source}")]
    Graph {
        pass: &'static str,
        source: ir::IrError,
    },
    #[error("the graph fails verification after {pass}: {source}")]
    Verify {
        pass: &'static str,
        source: ir::IrError,
    },
    #[error("pipeline `{pipeline}` has no pass named `{name}` (it has: {known})")]
    UnknownPass {
        pipeline: &'static str,
        name: String,
        known: String,
    },
    #[error("pipeline `{pipeline}` did not reach a fixpoint in {iterations} iterations")]
    NoFixpoint {
        pipeline: &'static str,
        iterations: usize,
    },
}

impl PassError {
    pub(crate) fn node(pass: &'static str, node: &str, message: impl Into<String>) -> PassError {
        PassError::Node {
            pass,
            node: node.to_string(),
            message: message.into(),
        }
    }
}

//! Lowering: an optimized IR graph becomes a [`Program`], the plain data that the runtime's
//! interpreter executes.
//!
//! What lowering decides, once per compiled model, so that no run re-derives it:
//! - the order of the steps (topological) and, per step, its kernel: the op (with its fused
//!   epilogue program, as the graph says) and, for products with a constant weight, the packed
//!   weight it reads and the microkernel family that weight is packed for;
//! - how each weight GEMM shares its columns among the threads ([`GemmSplit`]);
//! - which constants are kept as plain values, which only packed, and which embedding tables are
//!   read in place from the model's bytes;
//! - the liveness of every value (the step after which it dies) and the buffer each computed
//!   value lives in: values whose lifetimes do not overlap share a buffer when their dtype and
//!   their size (a monomial of the bound symbols, e.g. `1536*batch*sequence` bytes) are equal;
//! - which gathers read token ids or positions (for the input checks of the runtime).
//!
//! [`Program::to_text`] prints all of it (`encore dump --after lower`).

mod batch;
mod text;
mod verify;

pub use batch::{BatchSplit, NoBatchSplit};

use std::collections::HashMap;

use ir::{DType, Dim, EpilogueStep, Graph, Op, Outlet, TensorType};

use crate::jit::{CompiledF32Unit, CompiledUnit};
use crate::kernels::f32::jit_unit_for as f32_jit_unit_for;
use crate::kernels::int8::jit_unit_for;
use crate::kernels::{
    pick_f32, pick_int8, plan_split_f32, plan_split_i8, F32Kernel, GemmSplit, Int8Kernel,
};

/// Embedding tables at least this large are read in place from the model (not copied).
pub const IN_PLACE_TABLE_BYTES: usize = 1 << 20;

/// What lowering needs to know about the target.
///
/// ```
/// let o = codegen::lower::LowerOptions { threads: 2, kernel: None, jit: false };
/// assert_eq!(o.threads, 2);
/// ```
#[derive(Clone, Copy, Debug)]
pub struct LowerOptions {
    /// Worker threads the program is planned for.
    pub threads: usize,
    /// Forces the int8 microkernel family (f32 layers take its f32 counterpart); `None`: the
    /// picker's choice for this CPU.
    pub kernel: Option<Int8Kernel>,
    /// Compile the loop nest of each weight GEMM (int8 and f32) with Cranelift ([`crate::jit`]); where that is
    /// not possible the step runs the interpreted nest and [`Program::jit_unavailable`] says why.
    pub jit: bool,
}

/// Why a graph cannot be lowered.
#[derive(Debug, thiserror::Error)]
pub enum LowerError {
    #[error("node `{node}` ({op}): {message}")]
    Op {
        node: String,
        op: &'static str,
        message: String,
    },
    /// A lowered program that breaks an invariant of the interpreter (a lowering bug).
    #[error("lowered program, at `{node}`: {message}")]
    Program { node: String, message: String },
    #[error(transparent)]
    Ir(#[from] ir::IrError),
}

/// Index into [`Program::values`].
pub type ValueId = usize;
/// Index into [`Program::buffers`].
pub type BufferId = usize;
/// Index into [`Program::weights`].
pub type WeightId = usize;

/// Where a value lives during a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Home {
    /// A model input, borrowed from the caller.
    Input,
    /// A constant kept as a plain value.
    Const,
    /// A constant read only through its packed form (or in place): no plain copy is kept.
    WeightOnly,
    /// A value computed by a step, in this planned buffer.
    Buffer(BufferId),
}

/// One value of the program (one outlet of the graph).
#[derive(Clone, Debug)]
pub struct Value {
    /// The graph outlet it comes from.
    pub outlet: Outlet,
    /// Its name in the text form: `%N` (or `%N.s` for output `s`), `N` the node's topological
    /// number, as in the IR dump.
    pub name: String,
    pub ty: TensorType,
    pub home: Home,
    /// The interpreter's slot: buffers first (values sharing a buffer share the slot), then
    /// inputs and constants.
    pub slot: usize,
}

/// A planned buffer: computed values whose lifetimes do not overlap, all of one dtype and size.
#[derive(Clone, Debug)]
pub struct Buffer {
    pub dtype: DType,
    /// Its size in elements as a monomial of the bound symbols; `None` when the values' shapes
    /// are not known before the run (then the buffer holds one value).
    pub elems: Option<Dim>,
    /// The values it holds, in step order.
    pub values: Vec<ValueId>,
}

/// How a constant weight is laid out for its kernel, made once when a session is created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WeightLayout {
    /// s8 `[k, n]` packed for an int8 microkernel (with its column sums).
    I8 {
        kernel: Int8Kernel,
        k: usize,
        n: usize,
    },
    /// f32 `[k, n]` (or `[n, k]` when `transposed`) packed for an f32 microkernel.
    F32 {
        kernel: F32Kernel,
        k: usize,
        n: usize,
        transposed: bool,
    },
    /// An f32 `[rows, width]` embedding table gathered in place from the model's bytes.
    Table { rows: usize, width: usize },
}

/// A constant weight and its layout.
#[derive(Clone, Debug)]
pub struct Weight {
    /// The constant value it is made from.
    pub source: ValueId,
    pub layout: WeightLayout,
}

/// What an embedding-like gather reads, for input validation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// An ordinary gather.
    Plain,
    /// Token ids (or token types) straight from a model input: ids outside `[0, rows)` are bad
    /// input, negative ones included.
    Token { input: String },
    /// Positions derived from the sequence length; `limit` is the length of the constant
    /// position-id buffer they are sliced from, when the graph shows one.
    Position { limit: Option<usize> },
}

/// One step: an op of the graph on its kernel.
#[derive(Clone, Debug)]
pub struct Step {
    /// The graph node's name (errors and profiles name it).
    pub node: String,
    /// The op, with its attributes and fused epilogue program.
    pub op: Op,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
    /// The packed weight this step reads instead of input `.0`.
    pub weight: Option<(usize, WeightId)>,
    /// Values that die after this step (their last reader), and outputs nobody reads.
    pub frees: Vec<ValueId>,
    pub lookup: Lookup,
    /// How a weight GEMM shares its columns among the threads.
    pub split: Option<GemmSplit>,
    /// The JIT-compiled loop nest of a weight GEMM.
    pub jit: Option<StepJit>,
    /// For an int8 weight GEMM: the int8 weight GEMM that runs next, whose first weights its
    /// threads prefetch during their last unit here.
    pub then: Option<ThenGemm>,
}

/// The int8 weight GEMM a step's threads prefetch for (see [`Step::then`]): its weight and what
/// its thread plan depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThenGemm {
    /// The step that runs it.
    pub step: usize,
    pub weight: WeightId,
    /// Its epilogue has a row-wide step (LayerNorm).
    pub row_step: bool,
    /// Columns its epilogue calls and thread shares hold whole (a head's q, k and v, else 1).
    pub head_columns: usize,
}

/// A JIT-compiled GEMM loop nest, for the kind of weight the step reads.
#[derive(Clone, Copy, Debug)]
pub enum StepJit {
    Int8(CompiledUnit),
    F32(CompiledF32Unit),
}

impl StepJit {
    /// The code's address (identifies the compiled function).
    pub fn address(&self) -> usize {
        match self {
            StepJit::Int8(u) => u.f as usize,
            StepJit::F32(u) => u.f as usize,
        }
    }

    /// Cranelift's time for it, when it was first compiled.
    pub fn compile_time(&self) -> std::time::Duration {
        match self {
            StepJit::Int8(u) => u.compile_time,
            StepJit::F32(u) => u.compile_time,
        }
    }
}

/// A lowered model: plain data, executed by the runtime's interpreter.
#[derive(Clone, Debug)]
pub struct Program {
    pub threads: usize,
    pub values: Vec<Value>,
    pub buffers: Vec<Buffer>,
    pub weights: Vec<Weight>,
    pub steps: Vec<Step>,
    /// Model inputs: (name, value).
    pub inputs: Vec<(String, ValueId)>,
    /// Model outputs: (name, value).
    pub outputs: Vec<(String, ValueId)>,
    /// Slots the interpreter needs.
    pub slots: usize,
    /// Position lookups with a known table length: (node, rows).
    pub position_limits: Vec<(String, usize)>,
    /// Inputs that feed token lookups (their last dim is the sequence length).
    pub token_inputs: Vec<String>,
    /// Why JIT compilation was asked for and not done (the steps run interpreted nests).
    pub jit_unavailable: Option<String>,
    /// Whether a batch may run as consecutive sub-batches with the same results (see
    /// [`BatchSplit`]), or why not.
    pub batch: Result<BatchSplit, NoBatchSplit>,
}

impl Program {
    /// The distinct JIT-compiled units the program calls, and the time Cranelift took for them
    /// (when each was first compiled in this process).
    pub fn jit_units(&self) -> (usize, std::time::Duration) {
        let mut seen: Vec<usize> = Vec::new();
        let mut time = std::time::Duration::ZERO;
        for u in self.steps.iter().filter_map(|s| s.jit.as_ref()) {
            if !seen.contains(&u.address()) {
                seen.push(u.address());
                time += u.compile_time();
            }
        }
        (seen.len(), time)
    }
}

/// Lowers `graph` (already optimized and verified) for `opts`.
///
/// ```
/// let g = ir::text::parse(
///     "%0 = input[name=\"x\"] : f32[B,4]\n\
///      %1 = erf(%0) : f32[B,4]\n\
///      %2 = erf(%1) : f32[B,4]\n\
///      %3 = erf(%2) : f32[B,4]\n\
///      output \"y\" = %3\n",
///     None,
/// ).unwrap();
/// let p = codegen::lower::lower(&g, codegen::lower::LowerOptions { threads: 1, kernel: None, jit: false }).unwrap();
/// assert_eq!(p.steps.len(), 3);
/// // %1 dies when %2 is made, so %3 reuses its buffer.
/// assert_eq!(p.buffers.len(), 2);
/// ```
pub fn lower(graph: &Graph, opts: LowerOptions) -> Result<Program, LowerError> {
    let order = graph.topo_order()?;
    let threads = opts.threads.max(1);

    // Values, in topological order (the IR dump's numbering).
    let mut value_of: HashMap<Outlet, ValueId> = HashMap::new();
    let mut values: Vec<Value> = Vec::new();
    for (number, &id) in order.iter().enumerate() {
        let n = graph.node(id);
        for (s, ty) in n.outputs.iter().enumerate() {
            let o = Outlet::new(id, s);
            value_of.insert(o, values.len());
            values.push(Value {
                outlet: o,
                name: if s == 0 {
                    format!("%{number}")
                } else {
                    format!("%{number}.{s}")
                },
                ty: ty.clone(),
                home: Home::WeightOnly,
                slot: 0,
            });
        }
    }

    // Weights: constant right operands of products, and large embedding tables.
    let mut weights: Vec<Weight> = Vec::new();
    let mut weight_of_node: HashMap<ir::NodeId, (usize, WeightId)> = HashMap::new();
    for &id in &order {
        let n = graph.node(id);
        let ins = graph.node_inputs(id);
        let err = |message: String| LowerError::Op {
            node: n.name.clone(),
            op: n.op.name(),
            message,
        };
        let packable = match &n.op {
            Op::Linear | Op::FusedLinear { .. } | Op::QLinear { .. } => true,
            Op::MatMul => graph
                .const_value(ins[1])
                .is_some_and(|t| t.shape().len() == 2),
            Op::Gemm { .. } => graph.const_value(ins[1]).is_some(),
            _ => false,
        };
        if packable {
            let t = graph
                .const_value(ins[1])
                .ok_or_else(|| err("the weight must be a constant".into()))?;
            let sh = t.shape();
            if sh.len() != 2 {
                return Err(err(format!("weight must be 2-D, got {sh:?}")));
            }
            let layout = if matches!(n.op, Op::QLinear { .. }) {
                if t.dtype() != DType::I8 {
                    return Err(err(format!(
                        "weight must be i8[k, n], got {}{sh:?}",
                        t.dtype()
                    )));
                }
                let (k, nn) = (sh[0], sh[1]);
                WeightLayout::I8 {
                    kernel: opts.kernel.unwrap_or_else(|| pick_int8(usize::MAX, nn, k)),
                    k,
                    n: nn,
                }
            } else {
                if t.dtype() != DType::F32 {
                    return Err(err(format!("weight must be f32, got {}", t.dtype())));
                }
                let transposed = matches!(n.op, Op::Gemm { trans_b: true, .. });
                let (k, nn) = if transposed {
                    (sh[1], sh[0])
                } else {
                    (sh[0], sh[1])
                };
                WeightLayout::F32 {
                    kernel: opts.kernel.map_or_else(pick_f32, |k| k.f32_counterpart()),
                    k,
                    n: nn,
                    transposed,
                }
            };
            weight_of_node.insert(id, (1, weights.len()));
            weights.push(Weight {
                source: value_of[&ins[1]],
                layout,
            });
        } else if let Op::Gather { axis: 0 } = n.op {
            let table = graph.const_value(ins[0]).and_then(|t| match t.shape() {
                &[rows, width] if t.dtype() == DType::F32 && t.bytes().is_some() => {
                    Some((rows, width))
                }
                _ => None,
            });
            if let Some((rows, width)) = table.filter(|(r, w)| r * w * 4 >= IN_PLACE_TABLE_BYTES) {
                weight_of_node.insert(id, (0, weights.len()));
                weights.push(Weight {
                    source: value_of[&ins[0]],
                    layout: WeightLayout::Table { rows, width },
                });
            }
        }
    }

    // Constants read as plain values somewhere (or returned) stay; the others exist only in
    // their packed form.
    let mut plain_const = vec![false; values.len()];
    for &id in &order {
        let w = weight_of_node.get(&id);
        for (slot, o) in graph.node_inputs(id).into_iter().enumerate() {
            if graph.const_value(o).is_some() && w.is_none_or(|w| w.0 != slot) {
                plain_const[value_of[&o]] = true;
            }
        }
    }
    for (_, o) in graph.outputs() {
        if graph.const_value(*o).is_some() {
            plain_const[value_of[o]] = true;
        }
    }

    // Steps, with their gathers' lookups.
    let mut steps: Vec<Step> = Vec::new();
    let mut jit_unavailable = None;
    let mut inputs: Vec<(String, ValueId)> = Vec::new();
    let mut position_limits = Vec::new();
    let mut token_inputs: Vec<String> = Vec::new();
    for &id in &order {
        let n = graph.node(id);
        let outs: Vec<ValueId> = (0..n.outputs.len())
            .map(|s| value_of[&Outlet::new(id, s)])
            .collect();
        match &n.op {
            Op::Input { name } => {
                values[outs[0]].home = Home::Input;
                inputs.push((name.clone(), outs[0]));
                continue;
            }
            Op::Const { .. } => {
                if plain_const[outs[0]] {
                    values[outs[0]].home = Home::Const;
                }
                continue;
            }
            _ => {}
        }
        let ins = graph.node_inputs(id);
        let lookup = match &n.op {
            Op::Gather { axis } if *axis == 0 || *axis == -2 => {
                let table_rank = graph.outlet_type(ins[0]).rank();
                if table_rank.is_some_and(|r| r != 2) {
                    Lookup::Plain
                } else if let Some(input) = trace_to_input(graph, ins[1]) {
                    if !token_inputs.contains(&input) {
                        token_inputs.push(input.clone());
                    }
                    Lookup::Token { input }
                } else if graph.const_value(ins[1]).is_some() {
                    Lookup::Plain
                } else {
                    let limit = trace_to_sliced_const(graph, ins[1]);
                    if let Some(l) = limit {
                        position_limits.push((n.name.clone(), l));
                    }
                    Lookup::Position { limit }
                }
            }
            _ => Lookup::Plain,
        };
        let weight = weight_of_node.get(&id).copied();
        let split = weight.and_then(|(_, w)| match weights[w].layout {
            WeightLayout::I8 { kernel, n: nn, .. } => Some(plan_split_i8(
                kernel,
                nn,
                has_row_step(&n.op),
                head_columns(&n.op, nn),
                threads,
            )),
            WeightLayout::F32 { kernel, n: nn, .. } => Some(plan_split_f32(kernel, nn, threads)),
            WeightLayout::Table { .. } => None,
        });
        let jit = match weight.map(|(_, w)| &weights[w].layout) {
            Some(_) if !opts.jit => Ok(None),
            Some(&WeightLayout::I8 { kernel, k, n: nn }) => {
                jit_unit_for(kernel, k, nn, has_row_step(&n.op), head_columns(&n.op, nn))
                    .map(|u| Some(StepJit::Int8(u)))
            }
            Some(&WeightLayout::F32 { kernel, k, n, .. }) => {
                f32_jit_unit_for(kernel, k, n).map(|u| Some(StepJit::F32(u)))
            }
            Some(WeightLayout::Table { .. }) | None => Ok(None),
        }
        .unwrap_or_else(|e| {
            jit_unavailable.get_or_insert_with(|| e.to_string());
            None
        });
        steps.push(Step {
            node: n.name.clone(),
            op: n.op.clone(),
            inputs: ins.iter().map(|o| value_of[o]).collect(),
            outputs: outs,
            weight,
            frees: Vec::new(),
            lookup,
            split,
            jit,
            then: None,
        });
    }
    // Each int8 weight GEMM learns the next one (in program order, whatever runs between).
    let mut later: Option<ThenGemm> = None;
    for (i, st) in steps.iter_mut().enumerate().rev() {
        let Some((_, w)) = st.weight else { continue };
        let WeightLayout::I8 { n, .. } = weights[w].layout else {
            continue;
        };
        st.then = later;
        later = Some(ThenGemm {
            step: i,
            weight: w,
            row_step: has_row_step(&st.op),
            head_columns: head_columns(&st.op, n),
        });
    }
    let outputs: Vec<(String, ValueId)> = graph
        .outputs()
        .iter()
        .map(|(name, o)| (name.clone(), value_of[o]))
        .collect();

    // Liveness: the last step reading each value. Only computed values die: inputs and
    // constants belong to the caller and the session, outputs to the caller.
    let mut last_use: Vec<Option<usize>> = vec![None; values.len()];
    for (i, st) in steps.iter().enumerate() {
        for &v in &st.inputs {
            last_use[v] = Some(i);
        }
    }
    let mut pinned = vec![true; values.len()];
    for st in &steps {
        for &v in &st.outputs {
            pinned[v] = false;
        }
    }
    for (_, v) in &outputs {
        pinned[*v] = true;
    }
    for (i, st) in steps.iter_mut().enumerate() {
        let mut frees: Vec<ValueId> = st
            .inputs
            .iter()
            .copied()
            .filter(|&v| last_use[v] == Some(i) && !pinned[v])
            .collect();
        frees.extend(
            st.outputs
                .iter()
                .copied()
                .filter(|&v| last_use[v].is_none() && !pinned[v]),
        );
        frees.sort_unstable();
        frees.dedup();
        st.frees = frees;
    }

    // Buffers: each computed value takes a free buffer of its dtype and size, else a new one;
    // a value's buffer is free again after the step it dies in (never during it, so no step
    // writes over an input it is still reading).
    let mut buffers: Vec<Buffer> = Vec::new();
    let mut free_pool: Vec<BufferId> = Vec::new();
    for st in &steps {
        for &v in &st.outputs {
            let elems = element_count(&values[v].ty);
            let dtype = values[v].ty.dtype;
            let reuse = elems.as_ref().and_then(|e| {
                free_pool.iter().position(|&b| {
                    buffers[b].dtype == dtype && buffers[b].elems.as_ref() == Some(e)
                })
            });
            let b = match reuse {
                Some(i) => free_pool.remove(i),
                None => {
                    buffers.push(Buffer {
                        dtype,
                        elems,
                        values: Vec::new(),
                    });
                    buffers.len() - 1
                }
            };
            buffers[b].values.push(v);
            values[v].home = Home::Buffer(b);
        }
        for &v in &st.frees {
            if let Home::Buffer(b) = values[v].home {
                free_pool.push(b);
            }
        }
    }

    // Slots: one per buffer, then one per other value.
    let mut slots = buffers.len();
    for v in &mut values {
        v.slot = match v.home {
            Home::Buffer(b) => b,
            _ => {
                slots += 1;
                slots - 1
            }
        };
    }

    let mut program = Program {
        threads,
        values,
        buffers,
        weights,
        steps,
        inputs,
        outputs,
        slots,
        position_limits,
        token_inputs,
        jit_unavailable,
        batch: Err(NoBatchSplit {
            what: String::new(),
        }),
    };
    program.batch = batch::analyse(&program, graph);
    program.verify()?;
    Ok(program)
}

/// Whether a fused product's epilogue needs whole rows (LayerNorm, a per-row quantization).
fn has_row_step(op: &Op) -> bool {
    match op {
        Op::FusedLinear { epilogue } | Op::QLinear { epilogue, .. } => {
            epilogue.iter().any(EpilogueStep::needs_whole_row)
        }
        _ => false,
    }
}

/// The columns every epilogue call and thread share must hold whole: the q, k and v of a head
/// (three heads' widths, side by side) when the epilogue ends in `quant_heads` (of an
/// `n`-column linear), else 1.
fn head_columns(op: &Op, n: usize) -> usize {
    match op {
        Op::QLinear { epilogue, .. } => match epilogue.last() {
            Some(EpilogueStep::QuantHeads { heads }) => (n / heads).max(1),
            _ => 1,
        },
        _ => 1,
    }
}

/// The number of elements of `ty` as a monomial, when its shape is known.
fn element_count(ty: &TensorType) -> Option<Dim> {
    let shape = ty.shape.as_ref()?;
    Some(shape.iter().fold(Dim::fixed(1), |acc, d| acc.mul(d)))
}

/// Follows `o` back through ops that do not change values (casts, reshapes) to a graph input.
pub fn trace_to_input(g: &Graph, mut o: Outlet) -> Option<String> {
    for _ in 0..16 {
        let n = g.node(o.node);
        match &n.op {
            Op::Input { name } => return Some(name.clone()),
            // (`pack_rows` keeps the real tokens' ids: a padding-free lookup.)
            Op::Cast { .. }
            | Op::Reshape { .. }
            | Op::Unsqueeze { .. }
            | Op::Squeeze { .. }
            | Op::Flatten { .. }
            | Op::PackRows => o = *g.node_inputs(o.node).first()?,
            _ => return None,
        }
    }
    None
}

/// The length of a constant buffer that `o` is sliced from (BERT's `position_ids[:, :seq]`).
fn trace_to_sliced_const(g: &Graph, mut o: Outlet) -> Option<usize> {
    for _ in 0..16 {
        let n = g.node(o.node);
        let ins = g.node_inputs(o.node);
        match &n.op {
            Op::Slice => {
                let data = *ins.first()?;
                return g.const_value(data).and_then(|t| t.shape().last().copied());
            }
            Op::Cast { .. }
            | Op::Reshape { .. }
            | Op::Unsqueeze { .. }
            | Op::Squeeze { .. }
            | Op::Expand
            | Op::PackRows => o = *ins.first()?,
            _ => return None,
        }
    }
    None
}

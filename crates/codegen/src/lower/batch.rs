//! Whether a program's batch may run in parts: the runtime then runs a large batch as
//! consecutive sub-batches of a few hundred tokens, whose activations stay in the last-level
//! cache between the layers (BERT-base at batch 32 keeps ~19 MB of one layer's activations
//! alive, more than a 2-core slice of L3), and lays their outputs side by side.
//!
//! That is exact only when every output row `b` is computed from input row `b` alone. The
//! analysis follows each value's batch axis through the steps: a value is [`Flow::Free`] (it
//! depends on no batched input), [`Flow::Rows`] (axis `k` runs over the batch, and slice `b`
//! depends only on the inputs' slices `b`) or [`Flow::Packed`] (the packed real tokens of the
//! batch, sequence after sequence, `[1, T, …]`). Each op either keeps the rows apart (elementwise
//! ops, row-wise GEMMs and LayerNorms, attention per sequence, packing) or the program is not
//! split; where the batch axis lands is read from the step's output type, and an op that would
//! mix rows (a reduction or softmax over the batch, a reshape that moves it, a dynamic
//! per-tensor quantization) says why in the dump.

use ir::{ActQuant, Dim, Graph, Op, TensorType, PACKED_TOKENS};

use super::{Home, Program};

/// How a value relates to the batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flow {
    /// Independent of every batched input.
    Free,
    /// Axis `k` runs over the batch; slice `b` depends on the inputs' slices `b` only.
    Rows(usize),
    /// `[1, T, …]`: the real tokens of the batch, sequence after sequence.
    Packed,
    /// A 1-D shape vector holding the batch size (from `shape` over the batch axis): it may only
    /// give a shape to values whose every row is the same (`expand`, `constant_of_shape`) or
    /// keep the batch where a reshape finds it.
    Size,
}

/// A program whose batch may run in parts (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchSplit {
    /// The batch symbol: dim 0 of every batched input and output.
    pub symbol: String,
    /// The input whose non-zero elements are the real tokens (`[B, S]`, the mask that packs
    /// the rows), when the program packs them: parts are then cut by real tokens.
    pub tokens: Option<String>,
    /// The inputs with the batch as dim 0 (a part takes their rows; the others go whole).
    pub inputs: Vec<String>,
}

/// Why a program's batch does not run in parts.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{what}")]
pub struct NoBatchSplit {
    pub what: String,
}

fn no(what: impl Into<String>) -> NoBatchSplit {
    NoBatchSplit { what: what.into() }
}

fn is_symbol(d: &Dim, sym: &str) -> bool {
    d.as_symbol() == Some(sym)
}

fn mentions(d: &Dim, sym: &str) -> bool {
    d.symbols().iter().any(|s| s == sym)
}

/// Decides [`BatchSplit`] for `p` (see the module doc).
pub(super) fn analyse(p: &Program, graph: &Graph) -> Result<BatchSplit, NoBatchSplit> {
    // The batch symbol: dim 0 of the first input whose dim 0 is a lone symbol.
    let symbol = p
        .inputs
        .iter()
        .find_map(|(_, v)| {
            let d = p.values[*v].ty.shape.as_ref()?.first()?;
            d.as_symbol().map(str::to_string)
        })
        .ok_or_else(|| no("no input has a symbolic batch dim"))?;
    let sym = symbol.as_str();
    let mut flow: Vec<Option<Flow>> = vec![None; p.values.len()];
    let mut batched = Vec::new();
    for (name, v) in &p.inputs {
        let shape = p.values[*v].ty.shape.as_ref().ok_or_else(|| {
            no(format!(
                "input {} has no known shape",
                ir::text::quote(name)
            ))
        })?;
        flow[*v] = Some(match shape.first() {
            Some(d) if is_symbol(d, sym) && !shape[1..].iter().any(|d| mentions(d, sym)) => {
                batched.push(name.clone());
                Flow::Rows(0)
            }
            _ if !shape.iter().any(|d| mentions(d, sym)) => Flow::Free,
            _ => {
                return Err(no(format!(
                    "input {} does not have {sym} as its first dim only",
                    ir::text::quote(name)
                )))
            }
        });
    }
    for (v, val) in p.values.iter().enumerate() {
        if matches!(val.home, Home::Const | Home::WeightOnly) {
            flow[v] = Some(Flow::Free);
        }
    }
    let mut tokens = None;
    for st in &p.steps {
        let ins: Vec<Flow> = st
            .inputs
            .iter()
            .map(|&v| flow[v].ok_or_else(|| no(format!("{}: an input of unknown flow", st.node))))
            .collect::<Result<_, _>>()?;
        let at = |why: &str| {
            let node = match st.node.as_str() {
                "" => &p.values[st.outputs[0]].name,
                n => n,
            };
            no(format!("{node} ({}): {why}", st.op.name()))
        };
        if ins.iter().all(|f| *f == Flow::Free) {
            for &o in &st.outputs {
                flow[o] = Some(Flow::Free);
            }
            continue;
        }
        let out_ty = |i: usize| &p.values[st.outputs[i]].ty;
        let packed_in = ins.contains(&Flow::Packed);
        let rows_in = ins.iter().any(|f| matches!(f, Flow::Rows(_)));
        let out = match &st.op {
            Op::PackRows => {
                // (a free `x` is a row per position, the same for every sequence)
                if !matches!(ins[0], Flow::Rows(0) | Flow::Free) || ins[1] != Flow::Rows(0) {
                    return Err(at("packs rows that are not the batch's"));
                }
                if let Some(name) = input_name(p, st.inputs[1]) {
                    tokens.get_or_insert(name);
                }
                Flow::Packed
            }
            Op::UnpackRows => {
                if ins[0] != Flow::Packed || ins[1] != Flow::Rows(0) {
                    return Err(at("unpacks rows that are not the batch's"));
                }
                rows_of(out_ty(0), sym).ok_or_else(|| at("the batch is not dim 0 of its output"))?
            }
            Op::AttentionPacked { .. } => {
                // (q, k, v or qkv), the mask, the mask bias: per sequence.
                if ins.iter().any(|f| matches!(f, Flow::Rows(k) if *k != 0)) {
                    return Err(at("a mask whose batch is not dim 0"));
                }
                Flow::Packed
            }
            Op::Attention { .. } | Op::AttentionQkv { .. } => {
                if packed_in || ins.iter().any(|f| matches!(f, Flow::Rows(k) if *k != 0)) {
                    return Err(at("an operand whose batch is not dim 0"));
                }
                Flow::Rows(0)
            }
            Op::Shape { start, end } => {
                // Dims other than the batch (or the packed tokens) are the same in every part.
                let k = match ins[0] {
                    Flow::Rows(k) => k as i64,
                    _ => 1,
                };
                let r = p.values[st.inputs[0]]
                    .ty
                    .shape
                    .as_ref()
                    .ok_or_else(|| at("the shape of a value of unknown rank"))?
                    .len() as i64;
                let norm = |x: i64| if x < 0 { (x + r).max(0) } else { x.min(r) };
                if ins[0] == Flow::Size {
                    return Err(at("the shape of a shape"));
                }
                if (norm(*start)..end.map_or(r, norm)).contains(&k) {
                    Flow::Size
                } else {
                    Flow::Free
                }
            }
            Op::Concat { axis: 0 } if ins.iter().all(|f| matches!(f, Flow::Free | Flow::Size)) => {
                Flow::Size
            }
            Op::Expand | Op::ConstantOfShape { .. } => {
                // Every row the same: the data (if any) is free, only the shape has the batch.
                let shape_at = if matches!(st.op, Op::Expand) { 1 } else { 0 };
                if ins[shape_at] != Flow::Size
                    || ins.iter().filter(|f| **f != Flow::Free).count() != 1
                {
                    return Err(at("expands batched data"));
                }
                rows_of(out_ty(0), sym).ok_or_else(|| at("an output without the batch dim"))?
            }
            Op::Reshape { .. } if ins.get(1) == Some(&Flow::Size) && ins[0] == Flow::Rows(0) => {
                // Row-major: slices along dim 0 stay slices when dim 0 stays the batch.
                match rows_of(out_ty(0), sym) {
                    Some(Flow::Rows(0)) => Flow::Rows(0),
                    _ => return Err(at("a reshape that moves the batch")),
                }
            }
            Op::MatMul | Op::QMatMul
                if {
                    let b = if matches!(st.op, Op::MatMul) { 1 } else { 3 };
                    ins[0] == Flow::Rows(0) && ins[b] == Flow::Rows(0)
                } =>
            {
                // A batched matmul (attention's products before fusion): numpy broadcasting
                // pairs the leading dims, so row b of both operands makes row b.
                let b = if matches!(st.op, Op::MatMul) { 1 } else { 3 };
                let rank = |i: usize| p.values[st.inputs[i]].ty.shape.as_ref().map(Vec::len);
                let others_free = ins
                    .iter()
                    .enumerate()
                    .all(|(i, f)| i == 0 || i == b || *f == Flow::Free);
                let r = rank(0);
                if !others_free || r.is_none_or(|r| r < 3) || rank(b) != r {
                    return Err(at("a batched product of operands of different ranks"));
                }
                match rows_of(out_ty(0), sym) {
                    Some(Flow::Rows(0)) => Flow::Rows(0),
                    _ => return Err(at("a batched product that moves the batch")),
                }
            }
            _ if ins.contains(&Flow::Size) => return Err(at("uses the batch size as data")),
            _ if packed_in && rows_in => return Err(at("mixes packed tokens and batch rows")),
            op => {
                let out = if packed_in {
                    Some(Flow::Packed)
                } else {
                    rows_of(out_ty(0), sym)
                };
                // (an axis no operand has when the output lost the batch: the op's own reason
                // is reported first)
                let out_axis = match out {
                    Some(Flow::Rows(k)) => (k, out_ty(0).shape.as_ref().map_or(0, Vec::len)),
                    Some(_) => (1, out_ty(0).shape.as_ref().map_or(0, Vec::len)),
                    None => (usize::MAX, 0),
                };
                let operand = |i: usize| {
                    let v = &p.values[st.inputs[i]];
                    (v.ty.shape.as_ref(), graph.const_value(v.outlet))
                };
                row_local(op, &ins, operand, out_axis).map_err(at)?;
                out.ok_or_else(|| at("an output without the batch dim"))?
            }
        };
        // Where the batch lands, from the types: every output of a batched step carries it
        // once (at the axis the op keeps it at), or holds the packed tokens at axis 1.
        for (i, &o) in st.outputs.iter().enumerate() {
            let ty = out_ty(i);
            flow[o] = Some(match out {
                Flow::Free => Flow::Free,
                Flow::Size => Flow::Size,
                Flow::Packed => {
                    let shape = ty
                        .shape
                        .as_ref()
                        .ok_or_else(|| at("an output of unknown shape"))?;
                    if shape.len() < 2
                        || !is_symbol(&shape[1], PACKED_TOKENS)
                        || shape.iter().any(|d| mentions(d, sym))
                    {
                        return Err(at("an output that is not [1, packed_tokens, …]"));
                    }
                    Flow::Packed
                }
                _ => rows_of(ty, sym).ok_or_else(|| at("an output without the batch dim"))?,
            });
        }
    }
    for (name, v) in &p.outputs {
        if flow[*v] != Some(Flow::Rows(0)) {
            // (an output of shape data included: it would be the part's, not the batch's)
            return Err(no(format!(
                "output {} does not have the batch as dim 0",
                ir::text::quote(name)
            )));
        }
    }
    Ok(BatchSplit {
        symbol,
        tokens,
        inputs: batched,
    })
}

/// The name of the model input `v` is, if it is one.
fn input_name(p: &Program, v: usize) -> Option<String> {
    p.inputs
        .iter()
        .find(|(_, x)| *x == v)
        .map(|(n, _)| n.clone())
}

/// The axis of `ty` that is the batch symbol, when exactly one dim mentions it.
fn rows_of(ty: &TensorType, sym: &str) -> Option<Flow> {
    let shape = ty.shape.as_ref()?;
    let mut hits = shape.iter().enumerate().filter(|(_, d)| mentions(d, sym));
    let (k, d) = hits.next()?;
    (hits.next().is_none() && is_symbol(d, sym)).then_some(Flow::Rows(k))
}

/// Whether `op` keeps batch rows (or packed tokens) apart given its operands' flows: the ops an
/// encoder runs on its activations, each with the condition under which a row of its output
/// reads the same row of its inputs only.
fn row_local<'a>(
    op: &Op,
    ins: &[Flow],
    operand: impl Fn(usize) -> (Option<&'a Vec<Dim>>, Option<&'a ir::Tensor>),
    (out_axis, out_rank): (usize, usize),
) -> Result<(), &'static str> {
    let shape = |i: usize| operand(i).0;
    // A constant axis operand, normalised against rank `r`.
    let const_axis = |i: usize, r: usize| -> Option<usize> {
        let a = *operand(i).1?.to_i64_vec().ok()?.first()?;
        let a = if a < 0 { a + r as i64 } else { a };
        usize::try_from(a).ok()
    };
    // The batch axis of a batched operand (axis 1 for packed tokens).
    let axis = |i: usize| match ins[i] {
        Flow::Rows(k) => Some(k),
        Flow::Packed => Some(1),
        Flow::Free | Flow::Size => None,
    };
    let rank = |i: usize| shape(i).map(Vec::len);
    match op {
        Op::Binary(_) | Op::Unary(_) | Op::Where | Op::Clip | Op::Cast { .. } | Op::Gelu { .. } => {
            // Broadcasting aligns the trailing dims: each batched operand's batch axis must land
            // on the output's.
            for i in 0..ins.len() {
                if let Some(k) = axis(i) {
                    match rank(i) {
                        Some(r) if r <= out_rank && k + out_rank - r == out_axis => {}
                        _ => return Err("broadcasts a batched operand off the batch axis"),
                    }
                }
            }
            Ok(())
        }
        Op::Unsqueeze { .. } | Op::Squeeze { .. } | Op::Transpose { .. } => {
            if ins[1..].iter().any(|f| *f != Flow::Free) {
                return Err("axes that depend on the batch");
            }
            Ok(())
        }
        Op::Reshape { .. } => match (ins[0], ins.get(1)) {
            // Row-major: slices along dim 0 stay slices when dim 0 stays the batch (checked on
            // the output type by the caller).
            (Flow::Rows(0), Some(Flow::Free)) if out_axis == 0 => Ok(()),
            _ => Err("a reshape that may move the batch"),
        },
        Op::Gather { axis: g } => {
            if ins[1] != Flow::Free && ins[0] != Flow::Free {
                return Err("gathers batched rows at batched indices");
            }
            if let (Some(k), Some(r)) = (axis(0), rank(0)) {
                let g = if *g < 0 { *g + r as i64 } else { *g };
                if g == k as i64 {
                    return Err("gathers along the batch");
                }
            }
            if ins[0] != Flow::Free && rank(0).is_none() {
                return Err("gathers from a value of unknown rank");
            }
            Ok(())
        }
        Op::LayerNorm { axis: a, .. } | Op::Softmax { axis: a } => {
            let (Some(k), Some(r)) = (axis(0), rank(0)) else {
                return Err("normalises a value of unknown rank");
            };
            if k != out_axis {
                return Err("moves the batch axis");
            }
            let a = if *a < 0 { *a + r as i64 } else { *a };
            let over_batch = match op {
                Op::LayerNorm { .. } => a <= k as i64,
                _ => a == k as i64,
            };
            if over_batch || ins[1..].iter().any(|f| *f != Flow::Free) {
                return Err("normalises across the batch");
            }
            Ok(())
        }
        Op::CumSum { .. } => {
            // (x, axis): a running sum along one axis, which must not be the batch's.
            let (Some(k), Some(r)) = (axis(0), rank(0)) else {
                return Err("a running sum over a value of unknown rank");
            };
            match const_axis(1, r) {
                Some(a) if a != k && ins[1] == Flow::Free => Ok(()),
                _ => Err("a running sum that may run along the batch"),
            }
        }
        Op::QuantizeLinear { axis: a, .. } | Op::DequantizeLinear { axis: a } => {
            // (x, scale, zero_point?): constant per tensor, or per an axis other than the batch.
            let (Some(k), Some(r)) = (axis(0), rank(0)) else {
                return Err("quantizes a value of unknown rank");
            };
            let per_axis = shape(1).is_some_and(|s| s.len() == 1 && s[0].as_fixed() != Some(1));
            let a = if *a < 0 { *a + r as i64 } else { *a };
            if ins[1..].iter().any(|f| *f != Flow::Free) || (per_axis && a == k as i64) {
                return Err("quantization parameters that vary along the batch");
            }
            Ok(())
        }
        Op::QMatMul => {
            // (qa, a_scale, a_zero, qb, b_scale, b_zero): qa·qb with a constant qb.
            let (Some(k), Some(r)) = (axis(0), rank(0)) else {
                return Err("multiplies a value of unknown rank");
            };
            if k + 1 >= r || ins[1..].iter().any(|f| *f != Flow::Free) {
                return Err("contracts over the batch or multiplies two batched values");
            }
            Ok(())
        }
        Op::QLinear {
            act: ActQuant::DynamicTensor,
            ..
        } => Err("quantizes its input with one scale for the whole batch"),
        Op::Linear
        | Op::FusedLinear { .. }
        | Op::QLinear { .. }
        | Op::MatMulInteger
        | Op::MatMul => {
            // x·w: the contraction runs over x's last axis; the weight must be the same for
            // every row, and any other batched operand (a residual) aligned with x.
            let (Some(k), Some(r)) = (axis(0), rank(0)) else {
                return Err("multiplies a value of unknown rank");
            };
            if k + 1 >= r || ins[1] != Flow::Free {
                return Err("contracts over the batch or multiplies two batched values");
            }
            if k != out_axis {
                return Err("moves the batch axis");
            }
            Ok(())
        }
        _ => Err("an op that is not known to keep batch rows apart"),
    }
}

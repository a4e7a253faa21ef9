//! The verifier: structural checks that every pass must preserve.

use std::collections::HashSet;

use crate::{
    ActQuant, AttnProducts, DType, EpilogueStep, Graph, IrError, LoopParts, NodeId, Op, TensorType,
};

impl Graph {
    /// Checks that the graph is well formed: acyclic; every node's inputs are contiguous, in
    /// range and within the op's arity; every node has as many output types as its op has
    /// outputs; constants agree with their declared type; ops that keep their input's type,
    /// casts, quantizes and attention agree with their declared types (see `check_types`);
    /// graph inputs are input nodes; output names are unique. A loop's body is verified as a
    /// graph of its own, and against the loop (see `check_loop`).
    pub fn verify(&self) -> Result<(), IrError> {
        let order = self.topo_order()?;
        let invalid = |node: &str, msg: String| IrError::Verify {
            node: node.to_string(),
            message: msg,
        };
        for id in order {
            let node = self.node(id);
            let inputs = self.node_inputs(id);
            let (lo, hi) = node.op.arity();
            if inputs.len() < lo || inputs.len() > hi {
                return Err(invalid(
                    &node.name,
                    format!("{} has {} inputs", node.op.name(), inputs.len()),
                ));
            }
            let mut slots: Vec<usize> = self
                .petgraph()
                .edges_directed(id, petgraph::Direction::Incoming)
                .map(|e| e.weight().dst_slot)
                .collect();
            slots.sort();
            if slots.iter().enumerate().any(|(i, &s)| i != s) {
                return Err(invalid(
                    &node.name,
                    format!("input slots {slots:?} are not 0..n"),
                ));
            }
            for o in &inputs {
                if o.slot >= self.node(o.node).outputs.len() {
                    return Err(invalid(
                        &node.name,
                        format!(
                            "reads output {} of `{}`, which has fewer",
                            o.slot,
                            self.node(o.node).name
                        ),
                    ));
                }
            }
            if node.outputs.len() != node.op.num_outputs() {
                return Err(invalid(&node.name, "wrong number of output types".into()));
            }
            if let Op::Loop { carried, body } = &node.op {
                body.verify()
                    .map_err(|e| invalid(&node.name, format!("loop body: {e}")))?;
                if let Some(msg) = self.check_loop(id, *carried, body) {
                    return Err(invalid(&node.name, msg));
                }
            } else if let Some(msg) = self.check_fused(id).or_else(|| self.check_types(id)) {
                return Err(invalid(&node.name, msg));
            }
            if let Op::Const { value } = &node.op {
                let ty = &node.outputs[0];
                let shape_ok = ty.shape.as_ref().is_some_and(|s| {
                    s.len() == value.shape().len()
                        && s.iter()
                            .zip(value.shape())
                            .all(|(d, &n)| d.as_fixed() == Some(n))
                });
                if ty.dtype != value.dtype() || !shape_ok {
                    return Err(invalid(
                        &node.name,
                        format!("constant {:?} declared as {ty}", value),
                    ));
                }
            }
        }
        for &i in self.inputs() {
            if !matches!(self.node(i).op, Op::Input { .. }) {
                return Err(invalid(
                    &self.node(i).name,
                    "graph input is not an input node".into(),
                ));
            }
        }
        let mut seen = HashSet::new();
        for (name, o) in self.outputs() {
            if !seen.insert(name) {
                return Err(IrError::Verify {
                    node: name.clone(),
                    message: "duplicate graph output name".into(),
                });
            }
            if !self.contains(o.node) || o.slot >= self.node(o.node).outputs.len() {
                return Err(IrError::Verify {
                    node: name.clone(),
                    message: "graph output reads a missing value".into(),
                });
            }
        }
        Ok(())
    }

    /// The typing rules that hold whatever shape inference knows: ops that keep their input's
    /// type keep it (rank, fixed dims, dtype), a cast or quantize gives its target dtype, and
    /// attention splits a fixed hidden size into whole heads. Unknown (`*`) or symbolic parts
    /// are not compared.
    fn check_types(&self, id: NodeId) -> Option<String> {
        let node = self.node(id);
        let ins = self.node_inputs(id);
        let out = &node.outputs[0];
        let input = |i: usize| ins.get(i).map(|&o| self.outlet_type(o));
        let same_shape = |a: &TensorType, b: &TensorType| match (&a.shape, &b.shape) {
            (Some(x), Some(y)) => x.len() == y.len()
                && x.iter().zip(y.iter()).all(
                    |(p, q)| !matches!((p.as_fixed(), q.as_fixed()), (Some(m), Some(n)) if m != n),
                ),
            _ => true,
        };
        let keeps_type = matches!(
            node.op,
            Op::Unary(_)
                | Op::Gelu { .. }
                | Op::Softmax { .. }
                | Op::LayerNorm { .. }
                | Op::CumSum { .. }
        );
        if keeps_type {
            let x = input(0)?;
            // Predicates (is_nan, is_inf, …) keep the shape and give bool.
            let dtype = match node.op {
                Op::Unary(u) => u.output_dtype(x.dtype),
                _ => x.dtype,
            };
            if dtype != out.dtype || !same_shape(x, out) {
                return Some(format!(
                    "{} keeps its input's type: input {x}, output declared {out}",
                    node.op.name()
                ));
            }
        }
        match &node.op {
            Op::Cast { to } | Op::QuantizeLinear { to, .. } if out.dtype != *to => {
                Some(format!("{} to {to} declared as {out}", node.op.name()))
            }
            Op::AttentionQkv {
                num_heads,
                products,
                out_u8,
                ..
            }
            | Op::AttentionPacked {
                num_heads,
                products,
                out_u8,
                ..
            } => {
                let name = node.op.name();
                let packed = matches!(node.op, Op::AttentionPacked { .. });
                let pieces = crate::qkv_pieces(input(0)?.dtype);
                // After q, k, v: the mask (packed), its optional bias, the smoothing factors.
                let smoothing = out_u8.is_some_and(|q| q.smooth);
                let fixed = usize::from(packed) + usize::from(smoothing);
                let extra = ins.len().checked_sub(pieces + fixed);
                if !matches!(extra, Some(0 | 1)) {
                    return Some(format!(
                        "{name}: {} inputs, expected q, k and v ({pieces}){}, a mask bias at most{}",
                        ins.len(),
                        if packed { ", the mask" } else { "" },
                        if smoothing {
                            " and the output's smoothing factors"
                        } else {
                            ""
                        }
                    ));
                }
                let head_dtype = if pieces == 3 {
                    input(2)?.dtype
                } else {
                    input(0)?.dtype
                };
                let out_dtype = if out_u8.is_some() {
                    DType::U8
                } else {
                    head_dtype
                };
                if out.dtype != out_dtype {
                    return Some(format!(
                        "{name}: the output is {out_dtype} ({}), declared {out}",
                        if out_u8.is_some() {
                            "quantized"
                        } else {
                            "v's type"
                        }
                    ));
                }
                let width = |t: &TensorType| t.shape.as_ref()?.last()?.as_fixed();
                if smoothing {
                    let factors = input(ins.len() - 1)?;
                    let bad_width =
                        matches!((width(factors), width(out)), (Some(a), Some(b)) if a != b);
                    if factors.dtype != DType::F32 || bad_width {
                        return Some(format!(
                            "{name}: smoothing factors {factors} must be f32, one per output column of {out}"
                        ));
                    }
                }
                if pieces == 1 {
                    if let (Some(w), Some(h)) = (width(input(0)?), width(out)) {
                        if w != 3 * h || *num_heads == 0 || h % num_heads != 0 {
                            return Some(format!(
                                "{name}: {} must hold q, k and v of {num_heads} heads each as wide as the output {out}",
                                input(0)?
                            ));
                        }
                    }
                    return None;
                }
                let (bytes, scales, v) = (input(0)?, input(1)?, input(2)?);
                if *products != AttnProducts::Int8 {
                    return Some(format!(
                        "{name}: quantized heads are read by 8-bit products only"
                    ));
                }
                if scales.dtype != DType::F32 || v.dtype != DType::F32 {
                    return Some(format!("{name}: scales and v must be f32: {scales}, {v}"));
                }
                if let (Some(b), Some(s), Some(h)) = (width(bytes), width(scales), width(v)) {
                    if *num_heads == 0 || b != 2 * h || s != 2 * num_heads || h % num_heads != 0 {
                        return Some(format!(
                            "{name}: {bytes}, {scales}, {v} are not the quantized q and k and the v of {num_heads} heads"
                        ));
                    }
                }
                None
            }
            Op::Attention { num_heads, .. } => {
                let q = input(0)?;
                let hidden = q.shape.as_ref()?.last()?.as_fixed();
                if *num_heads == 0 || hidden.is_some_and(|h| h % num_heads != 0) {
                    return Some(format!(
                        "attention: {num_heads} heads do not divide the hidden size of {q}"
                    ));
                }
                if q.dtype != out.dtype || !same_shape(q, out) {
                    return Some(format!(
                        "attention keeps the query's type: query {q}, output declared {out}"
                    ));
                }
                None
            }
            _ => None,
        }
    }

    /// The typing rules of a loop: the trip count is i64 and the condition bool, one element
    /// each (the body's iteration number and condition inputs are scalars, its condition output
    /// bool); each carried value has one dtype as the node's initial input, the body's input and
    /// output, and the node's final output; each captured value the node's dtype in the body;
    /// each scan output the body output's dtype, one axis more.
    fn check_loop(&self, id: NodeId, carried: usize, body: &Graph) -> Option<String> {
        let node = self.node(id);
        let ins = self.node_inputs(id);
        let Some(parts) = LoopParts::of(carried, body) else {
            return Some(format!(
                "a body with {} inputs and {} outputs cannot carry {carried} values",
                body.inputs().len(),
                body.outputs().len()
            ));
        };
        let outer = |i: usize| self.outlet_type(ins[i]);
        let body_in = |i: usize| &body.node(body.inputs()[i]).outputs[0];
        let body_out = |i: usize| body.outlet_type(body.outputs()[i].1);
        let scalar_of = |t: &TensorType, d: DType| t.dtype == d && t.rank().is_none_or(|r| r == 0);
        let one_of = |t: &TensorType, d: DType| {
            t.dtype == d
                && t.shape
                    .as_ref()
                    .is_none_or(|s| s.iter().all(|dim| dim.as_fixed().is_none_or(|n| n == 1)))
        };
        if !one_of(outer(0), DType::I64) || !one_of(outer(1), DType::Bool) {
            return Some(format!(
                "the trip count must be one i64 and the condition one bool, they are {} and {}",
                outer(0),
                outer(1)
            ));
        }
        if !scalar_of(body_in(0), DType::I64)
            || !scalar_of(body_in(1), DType::Bool)
            || body_out(0).dtype != DType::Bool
        {
            return Some(format!(
                "the body must take i64[] and bool[] and give bool first, it takes {} and {} and gives {}",
                body_in(0),
                body_in(1),
                body_out(0)
            ));
        }
        for j in 0..parts.carried {
            let types = [
                outer(2 + j),
                body_in(2 + j),
                body_out(1 + j),
                &node.outputs[j],
            ];
            if types.iter().any(|t| t.dtype != types[0].dtype) {
                return Some(format!(
                    "carried value {j} changes dtype: initial {}, body input {}, body output {}, final {}",
                    types[0], types[1], types[2], types[3]
                ));
            }
        }
        for k in 0..parts.captured {
            let i = 2 + parts.carried + k;
            if outer(i).dtype != body_in(i).dtype {
                return Some(format!(
                    "captured value {k} is {} outside the body and {} inside",
                    outer(i),
                    body_in(i)
                ));
            }
        }
        for s in 0..parts.scans {
            let (each, stacked) = (
                body_out(1 + parts.carried + s),
                &node.outputs[parts.carried + s],
            );
            let ranks_ok = match (each.rank(), stacked.rank()) {
                (Some(a), Some(b)) => b == a + 1,
                _ => true,
            };
            if each.dtype != stacked.dtype || !ranks_ok {
                return Some(format!(
                    "scan output {s}: the body gives {each}, stacked over the iterations it cannot be {stacked}"
                ));
            }
        }
        None
    }

    /// The typing rules of the fused ops: what their weights and epilogue operands must be.
    fn check_fused(&self, id: NodeId) -> Option<String> {
        let node = self.node(id);
        let ins = self.node_inputs(id);
        let ty = |i: usize| self.outlet_type(ins[i]);
        let fixed = |i: usize| -> Option<Vec<usize>> {
            ty(i).shape.as_ref()?.iter().map(|d| d.as_fixed()).collect()
        };
        let (w_dtype, first_operand, epilogue) = match &node.op {
            Op::FusedLinear { epilogue } => (DType::F32, 2, epilogue),
            Op::QLinear {
                act,
                smooth,
                epilogue,
            } => (
                DType::I8,
                3 + act.row_param_inputs() + usize::from(*smooth),
                epilogue,
            ),
            _ => return None,
        };
        let prequantized = matches!(
            node.op,
            Op::QLinear {
                act: ActQuant::Static { .. },
                smooth: false,
                ..
            }
        );
        if let Op::QLinear {
            act: ActQuant::TokenU8,
            smooth,
            ..
        } = &node.op
        {
            // The rows quantized by the producer, with their parameters beside them.
            if *smooth || ty(0).dtype != DType::U8 {
                return Some(format!(
                    "qlinear: act `token_u8` reads u8 rows and no smoothing factors, x is {}",
                    ty(0)
                ));
            }
            let row_param = |i: usize, dtype: DType| {
                let t = ty(i);
                t.dtype == dtype
                    && t.rank() == ty(0).rank()
                    && t.shape
                        .as_ref()
                        .is_none_or(|s| s.last().and_then(|d| d.as_fixed()).is_none_or(|d| d == 1))
            };
            if !row_param(3, DType::F32) || !row_param(4, DType::I32) {
                return Some(format!(
                    "qlinear: act `token_u8` needs each row's scale (f32[…, 1]) and zero point (i32[…, 1]), has {} and {}",
                    ty(3),
                    ty(4)
                ));
            }
        } else if ty(0).dtype != DType::F32 && !(prequantized && ty(0).dtype == DType::U8) {
            return Some(format!(
                "{}: x must be f32{}, is {}",
                node.op.name(),
                if prequantized { " or u8" } else { "" },
                ty(0)
            ));
        }
        let out_dtypes = EpilogueStep::output_dtypes(epilogue);
        let declared: Vec<DType> = node.outputs.iter().map(|t| t.dtype).collect();
        // One shape but for the last axis, whose widths the epilogue says (when n is known).
        let n = fixed(1).map(|s| s[1]);
        let widths = n.map(|n| EpilogueStep::output_widths(epilogue, n));
        let lead = |t: &TensorType| {
            t.shape
                .as_ref()
                .map(|s| s[..s.len().saturating_sub(1)].to_vec())
        };
        let same_shapes = node
            .outputs
            .iter()
            .all(|t| lead(t) == lead(&node.outputs[0]) && t.rank() == node.outputs[0].rank())
            && match widths {
                Some(Some(w)) => node.outputs.iter().zip(&w).all(|(t, &w)| {
                    t.shape
                        .as_ref()
                        .is_none_or(|s| s.last().and_then(|d| d.as_fixed()).is_none_or(|d| d == w))
                }),
                Some(None) => false,
                None => true,
            };
        if declared != out_dtypes || !same_shapes {
            return Some(format!(
                "{}: with epilogue ({}) the outputs are {}, of one shape but the last axis (its widths as the epilogue says); declared {}",
                node.op.name(),
                epilogue
                    .iter()
                    .map(|s| s.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                out_dtypes
                    .iter()
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                node.outputs
                    .iter()
                    .map(|t| t.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        if let Some(i) = epilogue.iter().position(|s| {
            matches!(
                s,
                EpilogueStep::RequantU8 { .. }
                    | EpilogueStep::ForkU8 { .. }
                    | EpilogueStep::ForkU8Rows { .. }
                    | EpilogueStep::QuantHeads { .. }
            )
        }) {
            if matches!(node.op, Op::FusedLinear { .. }) {
                return Some(format!(
                    "fused_linear: the f32 GEMM writes f32 only; `{}` needs a qlinear",
                    epilogue[i]
                ));
            }
            if i + 1 != epilogue.len() {
                return Some(format!(
                    "{}: `{}` must be the last epilogue step",
                    node.op.name(),
                    epilogue[i]
                ));
            }
        }
        if ty(1).dtype != w_dtype || ty(1).rank() != Some(2) {
            return Some(format!(
                "{}: the weight must be {w_dtype}[k, n], is {}",
                node.op.name(),
                ty(1)
            ));
        }
        let vector_ok = |i: usize, len: Option<usize>| match (fixed(i), len) {
            (Some(s), Some(l)) => s.len() == 1 && (s[0] == l || s[0] == 1),
            _ => true,
        };
        if let Op::QLinear { smooth, .. } = &node.op {
            if !vector_ok(2, n) {
                return Some(format!("qlinear: w_scale {} does not match n", ty(2)));
            }
            let k = fixed(1).map(|s| s[0]);
            if *smooth && !vector_ok(3, k) {
                return Some(format!("qlinear: inv_smooth {} does not match k", ty(3)));
            }
        }
        let mut at = first_operand;
        for step in epilogue {
            match step {
                EpilogueStep::Bias | EpilogueStep::MulCol => {
                    if ty(at).dtype != DType::F32 || !vector_ok(at, n) {
                        return Some(format!(
                            "epilogue `{step}`: operand {} is not f32[n]",
                            ty(at)
                        ));
                    }
                }
                EpilogueStep::LayerNorm { .. } => {
                    if !vector_ok(at, n) || !vector_ok(at + 1, n) {
                        return Some(format!("epilogue `{step}`: gamma and beta must be [n]"));
                    }
                }
                EpilogueStep::Residual => {
                    if ty(at).dtype != DType::F32 || ty(at).shape != node.outputs[0].shape {
                        return Some(format!(
                            "epilogue `residual`: operand {} is not the output's type {}",
                            ty(at),
                            node.outputs[0]
                        ));
                    }
                }
                EpilogueStep::Gelu(_) | EpilogueStep::QuantHeads { .. } => {}
                EpilogueStep::ForkU8 { smooth: true, .. }
                | EpilogueStep::ForkU8Rows { smooth: true }
                    if ty(at).dtype != DType::F32 || !vector_ok(at, n) =>
                {
                    return Some(format!(
                        "epilogue `{step}`: operand {} is not f32[n]",
                        ty(at)
                    ));
                }
                EpilogueStep::ForkU8Rows { .. } => {}
                EpilogueStep::RequantU8 { scale, zero_point }
                | EpilogueStep::ForkU8 {
                    scale, zero_point, ..
                } => {
                    if !(scale.is_finite() && *scale > 0.0 && (0..=255).contains(zero_point)) {
                        return Some(format!(
                            "epilogue `{step}`: the scale must be finite and positive and the zero point in 0..=255"
                        ));
                    }
                }
            }
            at += step.operands();
        }
        None
    }
}

//! The `fuse` pipeline: quantized ONNX dialects folded onto integer GEMMs, and the ops after a
//! GEMM folded into its epilogue.
//!
//! [`FoldQdq`] turns the three quantized dialects onnxruntime writes into [`Op::QLinear`] and
//! [`Op::QMatMul`]: `MatMul(DequantizeLinear(QuantizeLinear(x)), DequantizeLinear(W))` (QDQ, s8
//! or u8 activations, per-tensor or per-channel weights), `MatMulInteger` after
//! `DynamicQuantizeLinear` with its `Cast` and rescaling `Mul`s (dynamic), and `MatMul` of two
//! `DequantizeLinear` outputs (activation × activation, as in QDQ attention). The
//! `QuantizeLinear`/`DequantizeLinear` pairs that do not feed a matrix product stay: they round
//! values, which is part of the model's meaning.
//!
//! [`FuseEpilogue`] makes every `Linear` a [`Op::FusedLinear`] and grows the epilogue of fused and
//! quantized linears with what their only reader does: a constant bias `Add`, `Gelu`, a `Mul`
//! by a constant per-column vector, a residual `Add`, and a `LayerNorm` over the last axis. It
//! merges Q, K and V into one GEMM, and moves static activation quantizations into the op that
//! produces the activation: a GEMM's epilogue (`requant_u8`, `fork_u8`, `quant_heads`) or an
//! attention's output (`out_u8`). A rule that sees a candidate but cannot take it says why in
//! the report.

use ir::{
    ActQuant, AttnProducts, BinaryOp, DType, EpilogueStep, Graph, NodeId, Op, Outlet, Tensor,
    TensorType,
};

use crate::rewrite::{replace_with, sole_consumer, visit_to_fixpoint};
use crate::{Pass, PassContext, PassError, Report};

/// Applies `rule` to every node in topological order until it fires nowhere, removing what a
/// rewrite left dead.
fn apply(
    graph: &mut Graph,
    pass: &'static str,
    report: &mut Report,
    rule: fn(&mut Graph, NodeId, &mut Report) -> Result<bool, String>,
) -> Result<bool, PassError> {
    visit_to_fixpoint(graph, pass, |g, id| {
        let fired = rule(g, id, report)?;
        if fired {
            crate::dce::remove_dead(g);
        }
        Ok(fired)
    })
}

/// Folds Q/DQ pairs and the dynamic-quantization pattern into integer matrix products.
///
/// ```
/// use passes::{FoldQdq, Pass, PassContext};
/// let mut g = ir::text::parse(
///     "%0 = input[name=\"x\"] : f32[B,4]\n\
///      %1 = const[value=f32[]{0.1}] : f32[]\n\
///      %2 = const[value=i8[]{3}] : i8[]\n\
///      %3 = quantize_linear[axis=1, to=i8](%0, %1, %2) : i8[B,4]\n\
///      %4 = dequantize_linear[axis=1](%3, %1, %2) : f32[B,4]\n\
///      %5 = const[value=i8[4,2]{1, 2, 3, 4, 5, 6, 7, 8}] : i8[4,2]\n\
///      %6 = const[value=f32[2]{0.5, 0.25}] : f32[2]\n\
///      %7 = dequantize_linear[axis=1](%5, %6) : f32[4,2]\n\
///      %8 = matmul(%4, %7) : f32[B,2]\n\
///      output \"y\" = %8\n",
///     None,
/// ).unwrap();
/// assert!(FoldQdq.run(&mut g, &mut PassContext::default()).unwrap());
/// let text = ir::text::print(&g).unwrap();
/// assert!(text.contains("qlinear[act=\"static\", a_scale=0.1, a_zero=131, smooth=false, epilogue=()](%0, %1, %2) : f32[B,2]"), "{text}");
/// ```
pub struct FoldQdq;

const FOLD: &str = "FoldQdq";

impl Pass for FoldQdq {
    fn name(&self) -> &'static str {
        FOLD
    }

    fn run(&self, graph: &mut Graph, ctx: &mut PassContext<'_>) -> Result<bool, PassError> {
        let a = apply(graph, FOLD, &mut ctx.report, fold_qdq_linear)?;
        let b = apply(graph, FOLD, &mut ctx.report, fold_dynamic_linear)?;
        let c = apply(graph, FOLD, &mut ctx.report, fold_qdq_matmul)?;
        Ok(a || b || c)
    }
}

/// A constant's values as f32, when it is a constant with data.
fn const_f32(g: &Graph, o: Outlet) -> Option<Vec<f32>> {
    let t = g.const_value(o)?;
    if !t.has_data() {
        return None;
    }
    t.to_f32_vec().ok()
}

/// A per-tensor scale and zero point (zero point absent → 0), from constants.
fn scalar_qparams(g: &Graph, scale: Outlet, zero: Option<Outlet>) -> Option<(f32, i64)> {
    let s = const_f32(g, scale)?;
    if s.len() != 1 {
        return None;
    }
    let z = match zero {
        None => 0,
        Some(z) => {
            let t = g.const_value(z)?;
            let v = t.to_i64_vec().ok()?;
            if v.len() != 1 {
                return None;
            }
            v[0]
        }
    };
    Some((s[0], z))
}

/// The u8-grid zero point of a static activation quantization whose data type is `dtype`.
fn u8_zero(dtype: DType, zero: i64) -> Option<i32> {
    let z = match dtype {
        DType::U8 => zero,
        DType::I8 => zero + 128,
        _ => return None,
    };
    i32::try_from(z).ok().filter(|z| (0..=255).contains(z))
}

/// A symmetric int8 weight `[k, n]` with its scale (1 or `n` values), from
/// `DequantizeLinear(W const i8, scale const, zero const 0?)`.
fn int8_weight(g: &Graph, dq: NodeId) -> Result<(Outlet, Outlet), String> {
    let Op::DequantizeLinear { axis } = g.node(dq).op else {
        return Err("the weight is not a DequantizeLinear".into());
    };
    let ins = g.node_inputs(dq);
    let w = g
        .const_value(ins[0])
        .ok_or("the quantized weight is not a constant")?;
    if w.dtype() != DType::I8 || w.shape().len() != 2 {
        return Err(format!(
            "the weight is {}{:?}, not i8[k, n]",
            w.dtype(),
            w.shape()
        ));
    }
    let n = w.shape()[1];
    let scale = const_f32(g, ins[1]).ok_or("the weight scale is not a constant")?;
    let per_column = scale.len() == n && (axis == 1 || axis == -1);
    if scale.len() != 1 && !per_column {
        return Err(format!(
            "weight scale of {} values on axis {axis} is neither per tensor nor per output column",
            scale.len()
        ));
    }
    if let Some(&z) = ins.get(2) {
        let zeros = g
            .const_value(z)
            .and_then(|t| t.to_i64_vec().ok())
            .ok_or("the weight zero point is not a constant")?;
        if zeros.iter().any(|&v| v != 0) {
            return Err("the weight zero point is not 0 (asymmetric weights)".into());
        }
    }
    Ok((ins[0], ins[1]))
}

/// `MatMul(DequantizeLinear(QuantizeLinear(x, s, z)), DequantizeLinear(W, ws))` →
/// `QLinear[act=static](x, W, ws)`.
fn fold_qdq_linear(g: &mut Graph, id: NodeId, report: &mut Report) -> Result<bool, String> {
    if g.node(id).op != Op::MatMul {
        return Ok(false);
    }
    let ins = g.node_inputs(id);
    let (a, b) = (ins[0], ins[1]);
    let (Op::DequantizeLinear { .. }, Op::DequantizeLinear { .. }) =
        (&g.node(a.node).op, &g.node(b.node).op)
    else {
        return Ok(false);
    };
    if g.const_value(g.node_inputs(b.node)[0]).is_none() {
        return Ok(false); // activation × activation: fold_qdq_matmul's case
    }
    let name = g.node(id).name.clone();
    let (w, w_scale) = match int8_weight(g, b.node) {
        Ok(v) => v,
        Err(why) => {
            report.declined(FOLD, &name, format!("not an integer linear: {why}"));
            return Ok(false);
        }
    };
    let dq_in = g.node_inputs(a.node);
    let q = dq_in[0];
    let Op::QuantizeLinear { .. } = g.node(q.node).op else {
        report.declined(
            FOLD,
            &name,
            "the activation's DequantizeLinear does not read a QuantizeLinear",
        );
        return Ok(false);
    };
    let q_in = g.node_inputs(q.node);
    let x = q_in[0];
    let dq_params = scalar_qparams(g, dq_in[1], dq_in.get(2).copied());
    let q_params = scalar_qparams(g, q_in[1], q_in.get(2).copied());
    let (Some((scale, zero)), true) = (dq_params, dq_params == q_params) else {
        report.declined(
            FOLD,
            &name,
            "activation scale/zero point not constant per tensor, or Q and DQ disagree",
        );
        return Ok(false);
    };
    let Some(zero_point) = u8_zero(g.outlet_type(q).dtype, zero) else {
        report.declined(FOLD, &name, "activation type is not u8/s8");
        return Ok(false);
    };
    if g.outlet_type(x).dtype != DType::F32 || g.outlet_type(x).rank().is_none_or(|r| r < 2) {
        report.declined(FOLD, &name, "activation is not f32 of rank >= 2");
        return Ok(false);
    }
    let ty = g.node(id).outputs[0].clone();
    let op = Op::QLinear {
        act: ActQuant::Static { scale, zero_point },
        smooth: false,
        epilogue: vec![],
    };
    let new = g
        .add_node(op, &name, &[x, w, w_scale], vec![ty])
        .map_err(|e| e.to_string())?;
    g.replace_uses(id.into(), new.into())
        .map_err(|e| e.to_string())?;
    report.fired(FOLD, &name, "QDQ MatMul → qlinear (static)");
    Ok(true)
}

/// `Mul(Cast(MatMulInteger(DQL(x).0, W, DQL(x).2, 0)), Mul(DQL(x).1, ws))` →
/// `QLinear[act=tensor](x, W, ws)`.
fn fold_dynamic_linear(g: &mut Graph, id: NodeId, report: &mut Report) -> Result<bool, String> {
    if g.node(id).op != Op::MatMulInteger {
        return Ok(false);
    }
    let name = g.node(id).name.clone();
    let ins = g.node_inputs(id);
    let decline = |report: &mut Report, why: &str| {
        report.declined(
            FOLD,
            &name,
            format!("dynamic MatMulInteger not folded: {why}"),
        );
        Ok(false)
    };
    let dql = ins[0].node;
    if g.node(dql).op != Op::DynamicQuantizeLinear || ins[0].slot != 0 {
        return decline(report, "input A is not a DynamicQuantizeLinear");
    }
    if ins.get(2) != Some(&Outlet::new(dql, 2)) {
        return decline(report, "A's zero point is not the DynamicQuantizeLinear's");
    }
    let Some(wt) = g.const_value(ins[1]) else {
        return decline(report, "B is not a constant");
    };
    if wt.dtype() != DType::I8 || wt.shape().len() != 2 {
        return decline(report, "B is not i8[k, n]");
    }
    let n = wt.shape()[1];
    if let Some(&z) = ins.get(3) {
        let zero = g.const_value(z).and_then(|t| t.to_i64_vec().ok());
        if !zero.is_some_and(|v| v.iter().all(|&x| x == 0)) {
            return decline(report, "B's zero point is not 0");
        }
    }
    let Some(cast) = sole_consumer(g, id.into()) else {
        return decline(report, "the i32 product has several readers");
    };
    if g.node(cast).op != (Op::Cast { to: DType::F32 }) {
        return decline(report, "the i32 product is not cast to f32");
    }
    let Some(mul) = sole_consumer(g, cast.into()) else {
        return decline(report, "the cast has several readers");
    };
    let Some(scale) = crate::rewrite::other_operand(g, mul, BinaryOp::Mul, cast.into()) else {
        return decline(report, "the cast is not rescaled by a Mul");
    };
    // The rescale is `a_scale · w_scale`: a Mul of the DQL's scale and a constant.
    let Some(w_scale) =
        crate::rewrite::other_operand(g, scale.node, BinaryOp::Mul, Outlet::new(dql, 1))
    else {
        return decline(
            report,
            "the rescale is not DynamicQuantizeLinear's scale times a constant",
        );
    };
    match const_f32(g, w_scale) {
        Some(v) if v.len() == 1 || v.len() == n => {}
        _ => {
            return decline(
                report,
                "the weight scale is not a constant of 1 or n values",
            )
        }
    }
    let ws_flat = g.const_value(w_scale).cloned().ok_or("weight scale")?;
    let w_scale = if ws_flat.shape().len() == 1 {
        w_scale
    } else {
        let len = ws_flat.len();
        let t = Tensor::from_vec(vec![len], ws_flat.to_f32_vec().map_err(|e| e.to_string())?);
        g.add_const(&format!("{name}/w_scale"), t)
    };
    let x = g.node_inputs(dql)[0];
    let ty = g.node(mul).outputs[0].clone();
    if g.outlet_type(x).rank().is_none_or(|r| r < 2) {
        return decline(report, "the activation has rank < 2");
    }
    let op = Op::QLinear {
        act: ActQuant::DynamicTensor,
        smooth: false,
        epilogue: vec![],
    };
    let new = g
        .add_node(op, &name, &[x, ins[1], w_scale], vec![ty])
        .map_err(|e| e.to_string())?;
    g.replace_uses(mul.into(), new.into())
        .map_err(|e| e.to_string())?;
    report.fired(
        FOLD,
        &name,
        "DynamicQuantizeLinear + MatMulInteger → qlinear (per tensor)",
    );
    Ok(true)
}

/// `MatMul(DequantizeLinear(qa, sa, za), DequantizeLinear(qb, sb, zb))` with constant scales
/// (`a` per tensor, `b` per tensor or per column) → `QMatMul(qa, sa, za, qb, sb, zb)`.
fn fold_qdq_matmul(g: &mut Graph, id: NodeId, report: &mut Report) -> Result<bool, String> {
    if g.node(id).op != Op::MatMul {
        return Ok(false);
    }
    let ins = g.node_inputs(id);
    let (a, b) = (ins[0], ins[1]);
    let (Op::DequantizeLinear { .. }, Op::DequantizeLinear { axis: b_axis }) =
        (&g.node(a.node).op, &g.node(b.node).op)
    else {
        return Ok(false);
    };
    let b_axis = *b_axis;
    let name = g.node(id).name.clone();
    let (a_in, b_in) = (g.node_inputs(a.node), g.node_inputs(b.node));
    if scalar_qparams(g, a_in[1], a_in.get(2).copied()).is_none() {
        report.declined(FOLD, &name, "A's scale/zero point is not one constant");
        return Ok(false);
    }
    let b_rank = g.outlet_type(b_in[0]).rank();
    let n = g
        .outlet_type(b_in[0])
        .shape
        .as_ref()
        .and_then(|s| s.last()?.as_fixed());
    let b_scale_len = const_f32(g, b_in[1]).map(|v| v.len());
    let b_per_col = b_rank.is_some_and(|r| r >= 2)
        && (b_axis == -1 || Some(b_axis) == b_rank.map(|r| r as i64 - 1))
        && n.is_some()
        && b_scale_len == n;
    if !(b_scale_len == Some(1) || b_per_col) {
        report.declined(FOLD, &name, "B's scale is not per tensor or per column");
        return Ok(false);
    }
    let int8 = |t: &TensorType| matches!(t.dtype, DType::U8 | DType::I8);
    if !int8(g.outlet_type(a_in[0])) || !int8(g.outlet_type(b_in[0])) {
        report.declined(FOLD, &name, "operands are not 8-bit");
        return Ok(false);
    }
    let zb_len = match b_in.get(2) {
        Some(&z) => g.const_value(z).map(|t| t.len()),
        None => b_scale_len,
    };
    if zb_len != b_scale_len {
        report.declined(FOLD, &name, "B's zero point and scale differ in length");
        return Ok(false);
    }
    let zero_of = |g: &mut Graph, q: Outlet, zp: Option<&Outlet>, len: usize| -> Outlet {
        match zp {
            Some(&z) => z,
            None => {
                let dtype = g.outlet_type(q).dtype;
                let t = if dtype == DType::U8 {
                    Tensor::from_vec(vec![len], vec![0u8; len])
                } else {
                    Tensor::from_vec(vec![len], vec![0i8; len])
                };
                g.add_const(&format!("{name}/zero_point"), t)
            }
        }
    };
    let za = zero_of(g, a_in[0], a_in.get(2), 1);
    let zb = zero_of(g, b_in[0], b_in.get(2), b_scale_len.unwrap_or(1));
    let ty = g.node(id).outputs[0].clone();
    let new = g
        .add_node(
            Op::QMatMul,
            &name,
            &[a_in[0], a_in[1], za, b_in[0], b_in[1], zb],
            vec![ty],
        )
        .map_err(|e| e.to_string())?;
    g.replace_uses(id.into(), new.into())
        .map_err(|e| e.to_string())?;
    report.fired(FOLD, &name, "MatMul of two DequantizeLinear → qmatmul");
    Ok(true)
}

/// Grows GEMM epilogues: see the module documentation.
///
/// ```
/// use passes::{FuseEpilogue, Pass, PassContext};
/// let mut g = ir::text::parse(
///     "%0 = input[name=\"x\"] : f32[B,4]\n\
///      %1 = const[value=f32[4,2]{1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0}] : f32[4,2]\n\
///      %2 = const[value=f32[2]{0.5, -1.0}] : f32[2]\n\
///      %3 = linear(%0, %1, %2) : f32[B,2]\n\
///      %4 = gelu[approx=\"erf\"](%3) : f32[B,2]\n\
///      output \"y\" = %4\n",
///     None,
/// ).unwrap();
/// assert!(FuseEpilogue.run(&mut g, &mut PassContext::default()).unwrap());
/// let text = ir::text::print(&g).unwrap();
/// assert!(text.contains("fused_linear[epilogue=(bias, gelu_erf)](%0, %1, %2) : f32[B,2]"), "{text}");
/// ```
pub struct FuseEpilogue;

const FUSE: &str = "FuseEpilogue";

impl Pass for FuseEpilogue {
    fn name(&self) -> &'static str {
        FUSE
    }

    fn run(&self, graph: &mut Graph, ctx: &mut PassContext<'_>) -> Result<bool, PassError> {
        let a = apply(graph, FUSE, &mut ctx.report, linear_to_fused)?;
        let b = apply(graph, FUSE, &mut ctx.report, grow_epilogue)?;
        let c = apply(graph, FUSE, &mut ctx.report, merge_qkv)?;
        let d = apply(graph, FUSE, &mut ctx.report, requant_into_producer)?;
        let e = apply(graph, FUSE, &mut ctx.report, quantize_heads)?;
        let f = apply(graph, FUSE, &mut ctx.report, requant_into_attention)?;
        let g = apply(graph, FUSE, &mut ctx.report, token_quant_into_norm)?;
        Ok(a || b || c || d || e || f || g)
    }
}

/// `Linear(x, W, b?)` → `FusedLinear[epilogue=(bias?)](x, W, b?)`.
fn linear_to_fused(g: &mut Graph, id: NodeId, _report: &mut Report) -> Result<bool, String> {
    if g.node(id).op != Op::Linear {
        return Ok(false);
    }
    let ins = g.node_inputs(id);
    let epilogue = if ins.len() == 3 {
        vec![EpilogueStep::Bias]
    } else {
        vec![]
    };
    let node = g.node(id);
    let (name, ty) = (node.name.clone(), node.outputs[0].clone());
    replace_with(g, id.into(), Op::FusedLinear { epilogue }, &name, &ins, ty)?;
    Ok(true)
}

/// Whether `target` is `from` or one of its ancestors.
fn depends_on(g: &Graph, from: Outlet, target: NodeId) -> bool {
    let mut stack = vec![from.node];
    let mut seen = std::collections::HashSet::new();
    while let Some(n) = stack.pop() {
        if n == target {
            return true;
        }
        if seen.insert(n) {
            stack.extend(g.node_inputs(n).iter().map(|o| o.node));
        }
    }
    false
}

/// The output width `n` of a fused or quantized linear, from its weight.
fn width(g: &Graph, id: NodeId) -> Option<usize> {
    let w = g.node_inputs(id)[1];
    g.outlet_type(w).shape.as_ref()?.get(1)?.as_fixed()
}

/// Whether `o` is a constant f32 vector of `n` values.
fn col_vector(g: &Graph, o: Outlet, n: usize) -> bool {
    g.const_value(o)
        .is_some_and(|t| t.dtype() == DType::F32 && t.shape() == [n])
}

/// A `FusedLinear` or `QLinear` takes its only reader into its epilogue.
fn grow_epilogue(g: &mut Graph, id: NodeId, report: &mut Report) -> Result<bool, String> {
    let epilogue = match &g.node(id).op {
        Op::FusedLinear { epilogue } | Op::QLinear { epilogue, .. } => epilogue.clone(),
        _ => return Ok(false),
    };
    // Nothing follows a step that writes bytes.
    if g.node(id).outputs[0].dtype != DType::F32 {
        return Ok(false);
    }
    let name = g.node(id).name.clone();
    let out: Outlet = id.into();
    let Some(n) = width(g, id) else {
        return Ok(false);
    };
    let readers = g.consumers(out);
    let Some(reader) = sole_consumer(g, out) else {
        if readers.len() > 1 {
            let fusible = readers.iter().any(|(r, _)| {
                matches!(
                    g.node(*r).op,
                    Op::Gelu { .. } | Op::LayerNorm { .. } | Op::Binary(BinaryOp::Add)
                )
            });
            if fusible {
                report.declined(
                    FUSE,
                    &name,
                    format!(
                        "output has {} readers; an epilogue needs exactly one",
                        readers.len()
                    ),
                );
            }
        }
        return Ok(false);
    };
    if epilogue
        .iter()
        .any(|s| matches!(s, EpilogueStep::LayerNorm { .. }))
    {
        return Ok(false); // nothing is fused after a LayerNorm
    }
    if EpilogueStep::output_dtype(&epilogue) != DType::F32 {
        return Ok(false); // the output is already quantized
    }
    let reader_name = g.node(reader).name.clone();
    let (step, operands): (EpilogueStep, Vec<Outlet>) = match g.node(reader).op.clone() {
        Op::Gelu { approx } => (EpilogueStep::Gelu(approx), vec![]),
        Op::Binary(b @ (BinaryOp::Add | BinaryOp::Mul)) => {
            let Some(other) = crate::rewrite::other_operand(g, reader, b, out) else {
                return Ok(false); // x + x
            };
            if col_vector(g, other, n) {
                let step = if b == BinaryOp::Add {
                    EpilogueStep::Bias
                } else {
                    EpilogueStep::MulCol
                };
                (step, vec![other])
            } else if b == BinaryOp::Add {
                if g.outlet_type(other) != &g.node(id).outputs[0]
                    || g.node(reader).outputs[0] != g.node(id).outputs[0]
                {
                    report.declined(
                        FUSE,
                        &reader_name,
                        format!(
                            "residual add not fused into `{name}`: operand {} does not have the product's type {}",
                            g.outlet_type(other),
                            g.node(id).outputs[0]
                        ),
                    );
                    return Ok(false);
                }
                if depends_on(g, other, id) {
                    report.declined(
                        FUSE,
                        &reader_name,
                        format!("residual add not fused into `{name}`: the residual is computed from its output"),
                    );
                    return Ok(false);
                }
                (EpilogueStep::Residual, vec![other])
            } else {
                return Ok(false);
            }
        }
        Op::LayerNorm { axis, epsilon } => {
            let rank = g.node(id).outputs[0].rank();
            if !(axis == -1 || rank.is_some_and(|r| axis == r as i64 - 1)) {
                report.declined(FUSE, &reader_name, "layer norm not over the last axis");
                return Ok(false);
            }
            let ln_ins = g.node_inputs(reader);
            if !col_vector(g, ln_ins[1], n) || ln_ins.get(2).is_some_and(|&b| !col_vector(g, b, n))
            {
                report.declined(
                    FUSE,
                    &reader_name,
                    format!(
                        "layer norm not fused into `{name}`: gamma/beta are not constant f32[{n}]"
                    ),
                );
                return Ok(false);
            }
            let beta = match ln_ins.get(2) {
                Some(&b) => b,
                None => g.add_const(
                    &format!("{reader_name}/beta"),
                    Tensor::from_vec(vec![n], vec![0f32; n]),
                ),
            };
            (EpilogueStep::LayerNorm { epsilon }, vec![ln_ins[1], beta])
        }
        _ => return Ok(false),
    };
    let mut new_op = g.node(id).op.clone();
    match &mut new_op {
        Op::FusedLinear { epilogue } | Op::QLinear { epilogue, .. } => epilogue.push(step),
        _ => unreachable!("checked above"),
    }
    let mut inputs = g.node_inputs(id);
    inputs.extend(operands);
    let ty = g.node(reader).outputs[0].clone();
    replace_with(g, reader.into(), new_op, &name, &inputs, ty)?;
    report.fired(FUSE, &name, format!("`{reader_name}` → epilogue `{step}`"));
    Ok(true)
}

/// A static `QLinear` reading an f32 value: what moving its quantization into the value's
/// producer takes from it.
struct StaticReader {
    id: NodeId,
    name: String,
    act: ActQuant,
    scale: f32,
    zero_point: i32,
    smooth: bool,
    epilogue: Vec<EpilogueStep>,
    /// `(x, w, w_scale, inv_smooth?, operands…)`.
    ins: Vec<Outlet>,
}

impl StaticReader {
    fn of(g: &Graph, id: NodeId) -> Option<StaticReader> {
        let Op::QLinear {
            act: act @ ActQuant::Static { scale, zero_point },
            smooth,
            epilogue,
        } = g.node(id).op.clone()
        else {
            return None;
        };
        let ins = g.node_inputs(id);
        (g.outlet_type(ins[0]).dtype == DType::F32).then(|| StaticReader {
            id,
            name: g.node(id).name.clone(),
            act,
            scale,
            zero_point,
            smooth,
            epilogue,
            ins,
        })
    }

    /// The f32 value it reads.
    fn x(&self) -> Outlet {
        self.ins[0]
    }

    /// Its SmoothQuant factors, when it has them.
    fn factors(&self) -> Option<Outlet> {
        self.smooth.then(|| self.ins[3])
    }

    /// Replaces the reader by one that reads `bytes`, the u8 values it would have made of its
    /// input, quantizing nothing (all its outputs: a `fork_u8` epilogue gives it two).
    fn read_bytes(self, g: &mut Graph, bytes: Outlet) -> Result<(), String> {
        let mut inputs = vec![bytes, self.ins[1], self.ins[2]];
        inputs.extend(&self.ins[3 + usize::from(self.smooth)..]);
        let op = Op::QLinear {
            act: self.act,
            smooth: false,
            epilogue: self.epilogue,
        };
        replace_node(g, self.id, op, &inputs)
    }
}

/// Replaces node `id` by `op` on `inputs`, with the same name and outputs: its readers read the
/// new node's outputs, and the old node is left dead.
fn replace_node(g: &mut Graph, id: NodeId, op: Op, inputs: &[Outlet]) -> Result<(), String> {
    let (name, outputs) = (g.node(id).name.clone(), g.node(id).outputs.clone());
    let new = g
        .add_node(op, &name, inputs, outputs.clone())
        .map_err(|e| e.to_string())?;
    for slot in 0..outputs.len() {
        g.replace_uses(Outlet::new(id, slot), Outlet::new(new, slot))
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// A static `QLinear` whose input is another `QLinear`'s output takes its activation
/// quantization out of itself and into that producer's epilogue, and runs on the bytes the
/// producer writes, which are the ones it made itself:
/// - when it is the output's only reader, the producer ends with `mul_col` (the reader's
///   SmoothQuant factor, when it has one) and `requant_u8` with the reader's scale and zero
///   point and writes u8 only: the f32 value between the two GEMMs is never written;
/// - when the f32 value has other readers too (a LayerNorm output read by the next GEMM and as a
///   residual), the producer ends with `fork_u8` (the same three parameters) and writes the f32
///   value for them and the bytes beside it: the value is not read back to be quantized. One
///   producer forks for one reader.
fn requant_into_producer(g: &mut Graph, id: NodeId, report: &mut Report) -> Result<bool, String> {
    let Some(reader) = StaticReader::of(g, id) else {
        return Ok(false);
    };
    let (x, name) = (reader.x(), reader.name.clone());
    let (scale, zero_point, smooth) = (reader.scale, reader.zero_point, reader.smooth);
    let producer = g.node(x.node).name.clone();
    let (producer_act, producer_smooth, mut steps) = match &g.node(x.node).op {
        Op::QLinear {
            act,
            smooth,
            epilogue,
        } => (*act, *smooth, epilogue.clone()),
        Op::FusedLinear { .. } => {
            report.declined(
                FUSE,
                &name,
                format!("quantization not moved into `{producer}`: the f32 GEMM writes f32 only"),
            );
            return Ok(false);
        }
        _ => return Ok(false),
    };
    if g.node(x.node).outputs.len() != 1 {
        report.declined(
            FUSE,
            &name,
            format!("quantization not moved into `{producer}`: it already writes bytes"),
        );
        return Ok(false);
    }
    let fork = sole_consumer(g, x) != Some(id);
    let mut producer_inputs = g.node_inputs(x.node);
    producer_inputs.extend(reader.factors());
    let f32_ty = g.node(x.node).outputs[0].clone();
    let u8_ty = TensorType {
        dtype: DType::U8,
        ..f32_ty.clone()
    };
    let outputs = if fork {
        steps.push(EpilogueStep::ForkU8 {
            scale,
            zero_point,
            smooth,
        });
        vec![f32_ty, u8_ty]
    } else {
        if smooth {
            steps.push(EpilogueStep::MulCol);
        }
        steps.push(EpilogueStep::RequantU8 { scale, zero_point });
        vec![u8_ty]
    };
    let producer_op = Op::QLinear {
        act: producer_act,
        smooth: producer_smooth,
        epilogue: steps,
    };
    let new_producer = g
        .add_node(producer_op, &producer, &producer_inputs, outputs)
        .map_err(|e| e.to_string())?;
    if fork {
        g.replace_uses(x, Outlet::new(new_producer, 0))
            .map_err(|e| e.to_string())?;
    }
    reader.read_bytes(g, Outlet::new(new_producer, usize::from(fork)))?;
    let how = if fork {
        "`fork_u8` (the f32 value has other readers)"
    } else {
        "`requant_u8`"
    };
    report.fired(
        FUSE,
        &producer,
        format!("quantization of `{name}` → epilogue {how}"),
    );
    Ok(true)
}

/// A per-token dynamic `QLinear` (`act="token"`) whose input is another `QLinear`'s output
/// ending in `layer_norm` takes its quantization out of itself and into that producer's
/// epilogue: the producer ends with `fork_u8_rows` (with the reader's SmoothQuant factor when it
/// has one) and writes, beside the f32 value its other readers take (the residual), the bytes
/// and each row's scale and zero point, made from each row while the LayerNorm step holds it;
/// the reader (`act="token_u8"`) reads them as they are. Its own quantization pass read every
/// row back from memory twice (its range, then its bytes). The bytes and parameters are those
/// the reader made itself (one definition: `codegen::kernels::rowquant`), so every output is
/// equal bit for bit. A producer whose epilogue does not end in `layer_norm` keeps writing f32:
/// its threads share columns, and a row's range needs all of them.
fn token_quant_into_norm(g: &mut Graph, id: NodeId, report: &mut Report) -> Result<bool, String> {
    let Op::QLinear {
        act: ActQuant::DynamicToken,
        smooth,
        epilogue,
    } = g.node(id).op.clone()
    else {
        return Ok(false);
    };
    let ins = g.node_inputs(id);
    let x = ins[0];
    if g.outlet_type(x).dtype != DType::F32 {
        return Ok(false);
    }
    let name = g.node(id).name.clone();
    let producer = g.node(x.node).name.clone();
    let (producer_act, producer_smooth, mut steps) = match &g.node(x.node).op {
        Op::QLinear {
            act,
            smooth,
            epilogue,
        } => (*act, *smooth, epilogue.clone()),
        _ => return Ok(false),
    };
    let declined = |report: &mut Report, why: &str| {
        report.declined(
            FUSE,
            &name,
            format!("per-row quantization not moved into `{producer}`: {why}"),
        );
        Ok(false)
    };
    if g.node(x.node).outputs.len() != 1 {
        return declined(report, "it already writes bytes");
    }
    if !matches!(steps.last(), Some(EpilogueStep::LayerNorm { .. })) {
        return declined(
            report,
            "its epilogue does not end in `layer_norm` (its threads share columns, and a row's range needs them all)",
        );
    }
    let mut producer_inputs = g.node_inputs(x.node);
    if smooth {
        producer_inputs.push(ins[3]);
    }
    let f32_ty = g.node(x.node).outputs[0].clone();
    let with = |dtype: DType, last: Option<usize>| {
        let mut t = TensorType {
            dtype,
            ..f32_ty.clone()
        };
        if let (Some(shape), Some(w)) = (t.shape.as_mut(), last) {
            if let Some(d) = shape.last_mut() {
                *d = ir::Dim::fixed(w);
            }
        }
        t
    };
    let outputs = vec![
        f32_ty.clone(),
        with(DType::U8, None),
        with(DType::F32, Some(1)),
        with(DType::I32, Some(1)),
    ];
    steps.push(EpilogueStep::ForkU8Rows { smooth });
    let producer_op = Op::QLinear {
        act: producer_act,
        smooth: producer_smooth,
        epilogue: steps,
    };
    let new_producer = g
        .add_node(producer_op, &producer, &producer_inputs, outputs)
        .map_err(|e| e.to_string())?;
    g.replace_uses(x, Outlet::new(new_producer, 0))
        .map_err(|e| e.to_string())?;
    let mut reader_inputs = vec![
        Outlet::new(new_producer, 1),
        ins[1],
        ins[2],
        Outlet::new(new_producer, 2),
        Outlet::new(new_producer, 3),
    ];
    reader_inputs.extend(&ins[3 + usize::from(smooth)..]);
    let reader_op = Op::QLinear {
        act: ActQuant::TokenU8,
        smooth: false,
        epilogue,
    };
    replace_node(g, id, reader_op, &reader_inputs)?;
    report.fired(
        FUSE,
        &producer,
        format!("per-row quantization of `{name}` → epilogue `fork_u8_rows`"),
    );
    Ok(true)
}

/// A static `QLinear` reading an `AttentionQkv` output that it alone reads takes its
/// activation quantization out of itself and into the attention, as [`requant_into_producer`]
/// moves it into a GEMM: the attention writes the u8 bytes the `QLinear` would have made of its
/// f32 output (`out_u8`, with the `QLinear`'s SmoothQuant factors as its last input when it has
/// them), and the f32 output is never written nor read back.
fn requant_into_attention(g: &mut Graph, id: NodeId, report: &mut Report) -> Result<bool, String> {
    let Some(reader) = StaticReader::of(g, id) else {
        return Ok(false);
    };
    let (x, name) = (reader.x(), reader.name.clone());
    let Op::AttentionQkv {
        num_heads,
        scale: scores_scale,
        products,
        out_u8: None,
    } = g.node(x.node).op
    else {
        return Ok(false);
    };
    let attention = g.node(x.node).name.clone();
    if sole_consumer(g, x) != Some(id) {
        report.declined(
            FUSE,
            &name,
            format!("quantization not moved into `{attention}`: its output has other readers"),
        );
        return Ok(false);
    }
    let mut attention_inputs = g.node_inputs(x.node);
    attention_inputs.extend(reader.factors());
    let u8_ty = TensorType {
        dtype: DType::U8,
        ..g.outlet_type(x).clone()
    };
    let attention_op = Op::AttentionQkv {
        num_heads,
        scale: scores_scale,
        products,
        out_u8: Some(ir::OutU8 {
            scale: reader.scale,
            zero_point: reader.zero_point,
            smooth: reader.smooth,
        }),
    };
    let bytes = g
        .add_node(attention_op, &attention, &attention_inputs, vec![u8_ty])
        .map_err(|e| e.to_string())?;
    reader.read_bytes(g, Outlet::new(bytes, 0))?;
    report.fired(
        FUSE,
        &attention,
        format!("quantization of `{name}` → u8 output"),
    );
    Ok(true)
}

/// An `Attention` whose q, k and v are three linears of one kind that read the same activation
/// the same way (same quantization and smoothing, epilogues of a bias at most) becomes one
/// linear with the three weights side by side (`[k, 3n]`, columns q then k then v) feeding an
/// `AttentionQkv`: one GEMM instead of three, and the activation quantized once.
fn merge_qkv(g: &mut Graph, id: NodeId, report: &mut Report) -> Result<bool, String> {
    let Op::Attention {
        num_heads,
        scale,
        products,
    } = g.node(id).op
    else {
        return Ok(false);
    };
    let name = g.node(id).name.clone();
    let ins = g.node_inputs(id);
    let projections = [ins[0], ins[1], ins[2]];
    let ops: Vec<Op> = projections
        .iter()
        .map(|o| g.node(o.node).op.clone())
        .collect();
    let fixed = match &ops[0] {
        Op::FusedLinear { .. } => 2,
        Op::QLinear { smooth, .. } => 3 + usize::from(*smooth),
        _ => return Ok(false),
    };
    let decline = |report: &mut Report, why: &str| {
        report.declined(
            FUSE,
            &name,
            format!("q, k, v not merged into one GEMM: {why}"),
        );
        Ok(false)
    };
    let same_kind = ops.iter().all(|op| match (op, &ops[0]) {
        (Op::FusedLinear { epilogue: a }, Op::FusedLinear { epilogue: b }) => a == b,
        (
            Op::QLinear {
                act: a1,
                smooth: s1,
                epilogue: e1,
            },
            Op::QLinear {
                act: a2,
                smooth: s2,
                epilogue: e2,
            },
        ) => a1 == a2 && s1 == s2 && e1 == e2,
        _ => false,
    });
    if !same_kind {
        return decline(
            report,
            "the projections differ in kind, quantization or epilogue",
        );
    }
    let epilogue = match &ops[0] {
        Op::FusedLinear { epilogue } | Op::QLinear { epilogue, .. } => epilogue.clone(),
        _ => unreachable!("checked above"),
    };
    if !(epilogue.is_empty() || epilogue == [EpilogueStep::Bias]) {
        return decline(report, "an epilogue does more than add a bias");
    }
    let p_ins: Vec<Vec<Outlet>> = projections.iter().map(|o| g.node_inputs(o.node)).collect();
    // Same activation, and for smoothed ones the same smoothing factors.
    let smoothed = fixed == 4;
    let same_input = p_ins
        .iter()
        .all(|i| i[0] == p_ins[0][0] && (!smoothed || i[3] == p_ins[0][3]));
    if !same_input {
        return decline(
            report,
            "they read different activations or smoothing factors",
        );
    }
    if projections
        .iter()
        .enumerate()
        .any(|(slot, o)| g.consumers(*o) != [(id, slot)] || g.is_graph_output(*o))
    {
        return decline(report, "a projection has other readers");
    }
    // The constants, concatenated along n.
    let consts: Option<Vec<Vec<Tensor>>> = p_ins
        .iter()
        .map(|i| {
            let mut v = vec![g.const_value(i[1])?.clone()];
            if fixed >= 3 {
                v.push(g.const_value(i[2])?.clone());
            }
            if let Some(&b) = i.get(fixed) {
                v.push(g.const_value(b)?.clone());
            }
            Some(v)
        })
        .collect();
    let Some(consts) = consts else {
        return decline(report, "a weight, scale or bias is not a constant");
    };
    let w0 = &consts[0][0];
    if w0.shape().len() != 2
        || consts
            .iter()
            .any(|c| c[0].shape() != w0.shape() || c[0].dtype() != w0.dtype() || !c[0].has_data())
    {
        return decline(report, "the weights differ in shape or type");
    }
    let (k, n) = (w0.shape()[0], w0.shape()[1]);
    let weight = match w0.dtype() {
        DType::I8 => {
            let parts: Vec<Vec<i8>> = consts
                .iter()
                .map(|c| c[0].to_vec::<i8>())
                .collect::<Result<_, _>>()
                .map_err(|e| e.to_string())?;
            Tensor::from_vec(vec![k, 3 * n], side_by_side(&parts, k, n))
        }
        DType::F32 => {
            let parts: Vec<Vec<f32>> = consts
                .iter()
                .map(|c| c[0].to_f32_vec())
                .collect::<Result<_, _>>()
                .map_err(|e| e.to_string())?;
            Tensor::from_vec(vec![k, 3 * n], side_by_side(&parts, k, n))
        }
        _ => return decline(report, "the weights are neither i8 nor f32"),
    };
    // A per-column vector of each projection (a per-tensor value repeated), concatenated.
    let columns = |at: usize| -> Result<Option<Tensor>, String> {
        let mut v = Vec::with_capacity(3 * n);
        for c in &consts {
            let t = c[at].to_f32_vec().map_err(|e| e.to_string())?;
            match t.len() {
                1 => v.extend(std::iter::repeat_n(t[0], n)),
                l if l == n => v.extend(t),
                _ => return Ok(None),
            }
        }
        Ok(Some(Tensor::from_vec(vec![3 * n], v)))
    };
    let merged_name = crate::rewrite::derived_name(&name, "QKV");
    let mut inputs = vec![p_ins[0][0]];
    inputs.push(g.add_const(&format!("{merged_name}/weight"), weight));
    if fixed >= 3 {
        let Some(ws) = columns(1)? else {
            return decline(
                report,
                "a weight scale is neither per tensor nor per column",
            );
        };
        inputs.push(g.add_const(&format!("{merged_name}/weight_scale"), ws));
    }
    if smoothed {
        inputs.push(p_ins[0][3]);
    }
    if !epilogue.is_empty() {
        let Some(bias) = columns(consts[0].len() - 1)? else {
            return decline(report, "a bias is not per column");
        };
        inputs.push(g.add_const(&format!("{merged_name}/bias"), bias));
    }
    let mut ty = g.node(projections[0].node).outputs[0].clone();
    if let Some(last) = ty.shape.as_mut().and_then(|s| s.last_mut()) {
        *last = ir::Dim::fixed(3 * n);
    }
    let merged = g
        .add_node(ops[0].clone(), &merged_name, &inputs, vec![ty])
        .map_err(|e| e.to_string())?;
    let mut att_inputs = vec![merged.into()];
    att_inputs.extend(ins.get(3));
    let att_ty = g.node(id).outputs[0].clone();
    replace_with(
        g,
        id.into(),
        Op::AttentionQkv {
            num_heads,
            scale,
            products,
            out_u8: None,
        },
        &name,
        &att_inputs,
        att_ty,
    )?;
    let names: Vec<String> = projections
        .iter()
        .map(|o| format!("`{}`", g.node(o.node).name))
        .collect();
    report.fired(
        FUSE,
        &name,
        format!("{} → one GEMM `{merged_name}`", names.join(", ")),
    );
    Ok(true)
}

/// An `AttentionQkv` with 8-bit products takes the quantization of q and k out of itself and
/// into the epilogue of the QKV `QLinear` it alone reads: the producer ends with `quant_heads`
/// and writes each head of q and k as the bytes and scale attention would have made of it, and
/// v as f32; attention reads those three outputs. Half the bytes between the two ops, and the
/// same results (one quantization function, on the same f32 values).
fn quantize_heads(g: &mut Graph, id: NodeId, report: &mut Report) -> Result<bool, String> {
    let Op::AttentionQkv {
        num_heads,
        scale,
        products: products @ AttnProducts::Int8,
        out_u8,
    } = g.node(id).op
    else {
        return Ok(false);
    };
    let ins = g.node_inputs(id);
    let qkv = ins[0];
    if g.outlet_type(qkv).dtype != DType::F32 {
        return Ok(false);
    }
    let name = g.node(id).name.clone();
    let producer = g.node(qkv.node).name.clone();
    let decline = |report: &mut Report, why: String| {
        report.declined(
            FUSE,
            &name,
            format!("q and k not quantized in `{producer}`: {why}"),
        );
        Ok(false)
    };
    let (act, smooth, mut steps) = match &g.node(qkv.node).op {
        Op::QLinear {
            act,
            smooth,
            epilogue,
        } => (*act, *smooth, epilogue.clone()),
        Op::FusedLinear { .. } => return decline(report, "the f32 GEMM writes f32 only".into()),
        _ => return Ok(false),
    };
    if g.node(qkv.node).outputs.len() != 1 || sole_consumer(g, qkv) != Some(id) {
        return decline(report, "its output has other readers".into());
    }
    let n = width(g, qkv.node);
    let Some(widths) = n.and_then(|n| {
        EpilogueStep::output_widths(&[EpilogueStep::QuantHeads { heads: num_heads }], n)
    }) else {
        return decline(
            report,
            format!("its {n:?} columns are not q, k and v of {num_heads} whole heads"),
        );
    };
    let producer_inputs = match heads_interleaved(g, qkv.node, &steps, num_heads) {
        Ok(inputs) => inputs,
        Err(why) => return decline(report, format!("its columns cannot go head by head: {why}")),
    };
    steps.push(EpilogueStep::QuantHeads { heads: num_heads });
    let f32_ty = g.outlet_type(qkv).clone();
    let outputs: Vec<TensorType> = EpilogueStep::output_dtypes(&steps)
        .into_iter()
        .zip(widths)
        .map(|(dtype, w)| {
            let mut t = TensorType {
                dtype,
                ..f32_ty.clone()
            };
            if let Some(last) = t.shape.as_mut().and_then(|s| s.last_mut()) {
                *last = ir::Dim::fixed(w);
            }
            t
        })
        .collect();
    let producer_op = Op::QLinear {
        act,
        smooth,
        epilogue: steps,
    };
    let new_producer = g
        .add_node(producer_op, &producer, &producer_inputs, outputs)
        .map_err(|e| e.to_string())?;
    let mut inputs: Vec<Outlet> = (0..3).map(|i| Outlet::new(new_producer, i)).collect();
    inputs.extend(&ins[1..]);
    let ty = g.node(id).outputs[0].clone();
    let op = Op::AttentionQkv {
        num_heads,
        scale,
        products,
        out_u8,
    };
    let old_inputs = g.node_inputs(qkv.node);
    replace_with(g, id.into(), op, &name, &inputs, ty)?;
    // The old producer read the constants the reordered copies replace: both go now rather
    // than at the next DCE, so that compiling never holds the QKV weights twice (BERT-base's
    // peak resident memory was 27-30 MB higher with them left to DCE).
    g.remove_node(qkv.node);
    for o in old_inputs {
        if g.const_value(o).is_some() && g.consumers(o).is_empty() && !g.is_graph_output(o) {
            g.remove_node(o.node);
        }
    }
    report.fired(
        FUSE,
        &producer,
        format!(
            "q and k of `{name}` quantized per head → epilogue `quant_heads {num_heads}`, the weight's columns head by head"
        ),
    );
    Ok(true)
}

/// The inputs of the `QLinear` `id` (epilogue `steps`, `3h` columns: q, k and v side by side)
/// with the columns of its weight, weight scales and per-column operands reordered head by
/// head (q, k and v of head 0, then of head 1, ...), the layout `quant_heads` reads: each
/// thread of the GEMM then computes the q, k and v of whole heads, the ones its attention tasks
/// read. Why not when one of them is not a constant of the expected type and size, or the
/// epilogue holds a step this does not reorder (only `bias`, `mul_col` and GELU may come before
/// `quant_heads`).
fn heads_interleaved(
    g: &mut Graph,
    id: NodeId,
    steps: &[EpilogueStep],
    heads: usize,
) -> Result<Vec<Outlet>, String> {
    let Op::QLinear { smooth, .. } = g.node(id).op else {
        return Err("not a qlinear".into());
    };
    let mut inputs = g.node_inputs(id);
    let n = width(g, id).ok_or("its width is not known")?;
    let dh = n / 3 / heads;
    // Column j of the result is column `order[j]` of the q | k | v layout.
    let order: Vec<usize> = (0..n)
        .map(|j| (j / dh % 3) * (n / 3) + j / (3 * dh) * dh + j % dh)
        .collect();
    let name = g.node(id).name.clone();
    let w = g
        .const_value(inputs[1])
        .ok_or("the weight is not a constant")?;
    let k = w.shape().first().copied().unwrap_or(0);
    // The bytes of an i8 tensor are its values (read in place: BERT-base's are 1.8 MB a layer).
    let w = match w.bytes() {
        Some(b) if w.dtype() == DType::I8 && w.shape() == [k, n] && b.len() == k * n => b,
        _ => return Err(format!("the weight is not {k} × {n} bytes of i8")),
    };
    let mut weight = Vec::with_capacity(k * n);
    for row in w.chunks_exact(n) {
        weight.extend(order.iter().map(|&c| row[c] as i8));
    }
    let mut per_column = vec![(2, "weight_scale")];
    let mut at = 3 + usize::from(smooth);
    for step in steps {
        match step {
            EpilogueStep::Bias => per_column.push((at, "bias")),
            EpilogueStep::MulCol => per_column.push((at, "mul_col")),
            EpilogueStep::Gelu(_) => {}
            other => return Err(format!("its epilogue step `{other}` is not reordered")),
        }
        at += step.operands();
    }
    let mut vectors = Vec::new();
    for &(i, what) in &per_column {
        let (shape, v) = g
            .const_value(inputs[i])
            .filter(|t| t.dtype() == DType::F32)
            .and_then(|t| Some((t.shape().to_vec(), t.to_f32_vec().ok()?)))
            .filter(|(_, v)| v.len() == n || v.len() == 1 && i == 2)
            .ok_or_else(|| format!("its {what} is not a constant f32 vector of {n}"))?;
        vectors.push((i, what, shape, v));
    }
    inputs[1] = g.add_const(
        &format!("{name}/weight_by_head"),
        Tensor::from_vec(vec![k, n], weight),
    );
    for (i, what, shape, v) in vectors {
        if v.len() == n {
            let by_head = order.iter().map(|&c| v[c]).collect();
            inputs[i] = g.add_const(
                &format!("{name}/{what}_by_head"),
                Tensor::from_vec(shape, by_head),
            );
        }
    }
    Ok(inputs)
}

/// `[k, n]` row-major matrices placed side by side: `[k, parts·n]`.
fn side_by_side<T: Copy>(parts: &[Vec<T>], k: usize, n: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(parts.len() * k * n);
    for j in 0..k {
        for p in parts {
            out.extend_from_slice(&p[j * n..(j + 1) * n]);
        }
    }
    out
}

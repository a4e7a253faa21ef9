//! The decomposed layer normalisation of opset < 17 exports → `LayerNorm`.

use ir::{BinaryOp, DType, Graph, NodeId, Op, Outlet, ReduceOp, Tensor, UnaryOp};

use crate::rewrite::{
    apply_rules, binary_inputs, derived_name, is_scalar, op_of, other_operand, replace_with,
    rule_if, rule_if_some, sole_consumer, with_scalar,
};
use crate::{Pass, PassError};

/// Rewrites
/// `d = x - ReduceMean(x, [-1]); d / Sqrt(ReduceMean(Pow(d, 2), [-1]) + eps) * gamma + beta`
/// (also with `Mul(d, d)` for the square, `d · Reciprocal(Sqrt(·))` for the division, and with
/// the two `x - mean` computed separately) to
/// `LayerNorm[axis=-1, epsilon=eps](x, gamma, beta)`. `gamma` and `beta` must be constant
/// vectors over the last axis; without them the scale is ones and there is no bias. A
/// `LayerNorm` already in the graph (opset 17) is left as it is.
///
/// ```
/// use passes::{Pass, RecognizeLayerNorm};
/// let mut g = ir::text::parse(
///     "%0 = input[name=\"x\"] : f32[B,4]\n\
///      %1 = reduce_mean[axes=[-1], keepdims=true](%0) : f32[B,1]\n\
///      %2 = sub(%0, %1) : f32[B,4]\n\
///      %3 = const[value=f32[]{2.0}] : f32[]\n\
///      %4 = pow(%2, %3) : f32[B,4]\n\
///      %5 = reduce_mean[axes=[-1], keepdims=true](%4) : f32[B,1]\n\
///      %6 = const[value=f32[]{1e-5}] : f32[]\n\
///      %7 = add(%5, %6) : f32[B,1]\n\
///      %8 = sqrt(%7) : f32[B,1]\n\
///      %9 = div(%2, %8) : f32[B,4]\n\
///      output \"y\" = %9\n",
///     None,
/// ).unwrap();
/// assert!(RecognizeLayerNorm.run(&mut g, &mut passes::PassContext::default()).unwrap());
/// let text = ir::text::print(&g).unwrap();
/// assert!(text.contains("layer_norm[axis=-1, epsilon=1e-5](%0, %1) : f32[B,4]"), "{text}");
/// ```
pub struct RecognizeLayerNorm;

const PASS: &str = "RecognizeLayerNorm";

impl Pass for RecognizeLayerNorm {
    fn name(&self) -> &'static str {
        PASS
    }

    fn run(&self, graph: &mut Graph, _ctx: &mut crate::PassContext<'_>) -> Result<bool, PassError> {
        apply_rules(graph, PASS, &[decomposed_layer_norm])
    }
}

/// Whether `o` is `ReduceMean(x)` over the last axis only, keeping dims.
fn is_last_axis_mean(g: &Graph, o: Outlet, x: Outlet) -> bool {
    let rank = g.outlet_type(x).rank();
    match op_of(g, o) {
        Op::Reduce {
            op: ReduceOp::Mean,
            axes,
            keepdims: true,
        } => {
            g.node_inputs(o.node)[0] == x
                && matches!(axes.as_slice(), [a] if *a == -1 || rank.is_some_and(|r| *a == r as i64 - 1))
        }
        _ => false,
    }
}

/// `(x, mean)` when `o` is `Sub(x, ReduceMean(x, [-1]))`.
fn centered(g: &Graph, o: Outlet) -> Option<(Outlet, Outlet)> {
    let (x, mean) = binary_inputs(g, o.node, BinaryOp::Sub)?;
    is_last_axis_mean(g, mean, x).then_some((x, mean))
}

/// Whether `o` is the same centring as `(x, mean)`.
fn same_centering(g: &Graph, o: Outlet, x: Outlet, mean: Outlet) -> bool {
    binary_inputs(g, o.node, BinaryOp::Sub) == Some((x, mean))
}

/// `(d, s)` when `id` is `d / s` or `d · Reciprocal(s)` (either order).
fn divided(g: &Graph, id: NodeId) -> Option<(Outlet, Outlet)> {
    if let Some(ds) = binary_inputs(g, id, BinaryOp::Div) {
        return Some(ds);
    }
    let (a, b) = binary_inputs(g, id, BinaryOp::Mul)?;
    let reciprocal = |o: Outlet| {
        (*op_of(g, o) == Op::Unary(UnaryOp::Reciprocal)).then(|| g.node_inputs(o.node)[0])
    };
    match (reciprocal(b), reciprocal(a)) {
        (Some(s), _) => Some((a, s)),
        (None, Some(s)) => Some((b, s)),
        _ => None,
    }
}

/// The `d / sqrt(var + eps)` core, anchored on the `Div` (or the `Mul` by the reciprocal).
fn decomposed_layer_norm(g: &mut Graph, id: NodeId) -> Result<bool, String> {
    rule_if_some!(Some((d, s)) = divided(g, id));
    rule_if_some!(Some((x, mean)) = centered(g, d));
    rule_if!(g.outlet_type(x).dtype == DType::F32);
    rule_if!(*op_of(g, s) == Op::Unary(UnaryOp::Sqrt));
    let e = g.node_inputs(s.node)[0];
    rule_if_some!(Some((var, eps)) = with_scalar(g, e.node, BinaryOp::Add));
    rule_if!(eps.is_finite() && eps.is_sign_positive());
    rule_if!(matches!(op_of(g, var), Op::Reduce { .. }));
    let sq = g.node_inputs(var.node)[0];
    rule_if!(is_last_axis_mean(g, var, sq));
    let squared = match binary_inputs(g, sq.node, BinaryOp::Pow) {
        Some((d1, p)) => is_scalar(g, p, 2.0) && same_centering(g, d1, x, mean),
        None => match binary_inputs(g, sq.node, BinaryOp::Mul) {
            Some((a, b)) => a == b && same_centering(g, a, x, mean),
            None => false,
        },
    };
    rule_if!(squared);
    let n = g
        .outlet_type(x)
        .shape
        .as_ref()
        .and_then(|s| s.last())
        .and_then(|d| d.as_fixed());
    let vector = |g: &Graph, o: Outlet| {
        g.const_value(o).is_some_and(|t| {
            t.dtype() == DType::F32 && t.shape().len() == 1 && Some(t.shape()[0]) == n
        })
    };
    let mut last: Outlet = id.into();
    let mut gamma = None;
    let mut beta = None;
    if let Some(m) = sole_consumer(g, last) {
        if let Some(gm) = other_operand(g, m, BinaryOp::Mul, last).filter(|&o| vector(g, o)) {
            gamma = Some(gm);
            last = m.into();
            if let Some(a) = sole_consumer(g, last) {
                if let Some(bt) = other_operand(g, a, BinaryOp::Add, last).filter(|&o| vector(g, o))
                {
                    beta = Some(bt);
                    last = a.into();
                }
            }
        }
    }
    rule_if!(gamma.is_some() || n.is_some());
    let ty = g.outlet_type(last).clone();
    rule_if!(ty.shape == g.outlet_type(x).shape);
    let name = derived_name(&g.node(last.node).name, "LayerNorm");
    let gamma = match gamma {
        Some(gm) => gm,
        None => {
            let n = n.ok_or("no fixed normalised size")?;
            g.add_const(
                &format!("{name}/ones"),
                Tensor::from_vec(vec![n], vec![1.0f32; n]),
            )
        }
    };
    let mut inputs = vec![x, gamma];
    inputs.extend(beta);
    let op = Op::LayerNorm {
        axis: -1,
        epsilon: eps,
    };
    replace_with(g, last, op, &name, &inputs, ty)?;
    Ok(true)
}

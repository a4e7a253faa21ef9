//! The erf and tanh decompositions of GELU → `Gelu`.

use ir::{BinaryOp, GeluApprox, Graph, NodeId, Op, Outlet, UnaryOp};

use crate::rewrite::{
    apply_rules, binary_inputs, derived_name, is_scalar, op_of, other_operand, replace_with,
    rule_if, rule_if_some, sole_consumer, with_scalar,
};
use crate::{Pass, PassError};

/// Rewrites `0.5·x·(1 + erf(x/√2))` (the division may be a multiplication by `1/√2`) and
/// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))` (the cube as `Pow(x, 3)`, `x·x·x` or
/// `x·(x·x)`) to `Gelu[approx=erf|tanh](x)`. The final product may be grouped as
/// `(x·(1+·))·0.5`, `x·((1+·)·0.5)` or `(x·0.5)·(1+·)`. Constants match within 1e-4, relative.
///
/// ```
/// use passes::{Pass, RecognizeGelu};
/// let mut g = ir::text::parse(
///     "%0 = input[name=\"x\"] : f32[B,8]\n\
///      %1 = const[value=f32[]{0.70710677}] : f32[]\n\
///      %2 = mul(%0, %1) : f32[B,8]\n\
///      %3 = erf(%2) : f32[B,8]\n\
///      %4 = const[value=f32[]{1.0}] : f32[]\n\
///      %5 = add(%4, %3) : f32[B,8]\n\
///      %6 = const[value=f32[]{0.5}] : f32[]\n\
///      %7 = mul(%0, %6) : f32[B,8]\n\
///      %8 = mul(%7, %5) : f32[B,8]\n\
///      output \"y\" = %8\n",
///     None,
/// ).unwrap();
/// assert!(RecognizeGelu.run(&mut g, &mut passes::PassContext::default()).unwrap());
/// assert!(ir::text::print(&g).unwrap().contains("gelu[approx=\"erf\"](%0) : f32[B,8]"));
/// ```
pub struct RecognizeGelu;

const PASS: &str = "RecognizeGelu";

impl Pass for RecognizeGelu {
    fn name(&self) -> &'static str {
        PASS
    }

    fn run(&self, graph: &mut Graph, _ctx: &mut crate::PassContext<'_>) -> Result<bool, PassError> {
        apply_rules(graph, PASS, &[erf_gelu, tanh_gelu])
    }
}

/// The `0.5·x·(1 + t)` tail shared by both forms: from `t`, the outlet that computes it.
fn gelu_tail(g: &Graph, t: Outlet, x: Outlet) -> Option<Outlet> {
    let a = sole_consumer(g, t)?;
    let one = other_operand(g, a, BinaryOp::Add, t)?;
    if !is_scalar(g, one, 1.0) {
        return None;
    }
    let a: Outlet = a.into();
    let m1 = sole_consumer(g, a)?;
    let o = other_operand(g, m1, BinaryOp::Mul, a)?;
    if o == x {
        // (x·(1+t))·0.5
        let m2 = sole_consumer(g, m1.into())?;
        let half = other_operand(g, m2, BinaryOp::Mul, m1.into())?;
        return is_scalar(g, half, 0.5).then_some(m2.into());
    }
    if is_scalar(g, o, 0.5) {
        // x·((1+t)·0.5)
        let m2 = sole_consumer(g, m1.into())?;
        let xx = other_operand(g, m2, BinaryOp::Mul, m1.into())?;
        return (xx == x).then_some(m2.into());
    }
    // (x·0.5)·(1+t)
    let (xx, half) = with_scalar(g, o.node, BinaryOp::Mul)?;
    (xx == x && approx_half(half)).then_some(m1.into())
}

fn approx_half(v: f32) -> bool {
    crate::rewrite::approx(v, 0.5)
}

/// Anchored on the `Erf`.
fn erf_gelu(g: &mut Graph, id: NodeId) -> Result<bool, String> {
    rule_if!(g.node(id).op == Op::Unary(UnaryOp::Erf));
    let arg = g.node_inputs(id)[0];
    let x = match binary_inputs(g, arg.node, BinaryOp::Div) {
        Some((x, c)) if is_scalar(g, c, std::f32::consts::SQRT_2) => Some(x),
        _ => with_scalar(g, arg.node, BinaryOp::Mul)
            .filter(|(_, c)| crate::rewrite::approx(*c, std::f32::consts::FRAC_1_SQRT_2))
            .map(|(x, _)| x),
    };
    rule_if_some!(Some(x) = x);
    rule_if_some!(Some(out) = gelu_tail(g, id.into(), x));
    rewrite(g, out, x, GeluApprox::Erf)
}

/// Whether `o` is `x³` as `Pow(x, 3)`, `(x·x)·x` or `x·(x·x)`.
fn is_cube(g: &Graph, o: Outlet, x: Outlet) -> bool {
    if let Some((b, e)) = binary_inputs(g, o.node, BinaryOp::Pow) {
        return b == x && is_scalar(g, e, 3.0);
    }
    let Some((p, q)) = binary_inputs(g, o.node, BinaryOp::Mul) else {
        return false;
    };
    let is_square = |s: Outlet| binary_inputs(g, s.node, BinaryOp::Mul) == Some((x, x));
    (p == x && is_square(q)) || (q == x && is_square(p))
}

/// Anchored on the `Tanh`.
fn tanh_gelu(g: &mut Graph, id: NodeId) -> Result<bool, String> {
    rule_if!(g.node(id).op == Op::Unary(UnaryOp::Tanh));
    let arg = g.node_inputs(id)[0];
    rule_if_some!(Some((inner, c)) = with_scalar(g, arg.node, BinaryOp::Mul));
    rule_if!(crate::rewrite::approx(
        c,
        (2.0 / std::f32::consts::PI).sqrt()
    ));
    rule_if_some!(Some((p, q)) = binary_inputs(g, inner.node, BinaryOp::Add));
    // x + 0.044715·x³, either order.
    let cubic = |g: &Graph, x: Outlet, k: Outlet| {
        with_scalar(g, k.node, BinaryOp::Mul)
            .is_some_and(|(cube, c)| crate::rewrite::approx(c, 0.044715) && is_cube(g, cube, x))
    };
    let x = if cubic(g, p, q) {
        p
    } else if cubic(g, q, p) {
        q
    } else {
        return Ok(false);
    };
    rule_if!(!matches!(op_of(g, x), Op::Const { .. }));
    rule_if_some!(Some(out) = gelu_tail(g, id.into(), x));
    rewrite(g, out, x, GeluApprox::Tanh)
}

fn rewrite(g: &mut Graph, out: Outlet, x: Outlet, approx: GeluApprox) -> Result<bool, String> {
    let ty = g.outlet_type(out).clone();
    rule_if!(ty.shape.is_some() && ty.shape == g.outlet_type(x).shape);
    let name = derived_name(&g.node(out.node).name, "Gelu");
    replace_with(g, out, Op::Gelu { approx }, &name, &[x], ty)?;
    Ok(true)
}

//! `MatMul` by a constant weight (plus a constant bias) → `Linear`.

use ir::{BinaryOp, DType, Graph, NodeId, Op, Tensor};

use crate::rewrite::{
    apply_rules, derived_name, other_operand, replace_with, rule_if, rule_if_some, sole_consumer,
};
use crate::{eval_node, Pass, PassError};

/// Rewrites `MatMul(x, W)` with a constant 2-D `W` to `Linear(x, W)`, then absorbs a following
/// `Add` of a constant 1-D bias `[n]` (either operand order) into `Linear(x, W, bias)`. A
/// `Gemm(x, B, c)` with `alpha = beta = 1`, no `trans_a` and a constant `B` becomes
/// `Linear(x, W, c)`, where `W` is `B` transposed into a new constant when `trans_b` is set.
///
/// ```
/// use passes::{Pass, RecognizeLinear};
/// let mut g = ir::text::parse(
///     "%0 = input[name=\"x\"] : f32[B,S,4]\n\
///      %1 = const[value=f32[4,2]{extern}] : f32[4,2]\n\
///      %2 = matmul(%0, %1) : f32[B,S,2]\n\
///      %3 = const[value=f32[2]{0.5, -1.0}] : f32[2]\n\
///      %4 = add(%3, %2) : f32[B,S,2]\n\
///      output \"y\" = %4\n",
///     None,
/// ).unwrap();
/// assert!(RecognizeLinear.run(&mut g, &mut passes::PassContext::default()).unwrap());
/// assert!(ir::text::print(&g).unwrap().contains("linear(%0, %1, %2) : f32[B,S,2]"));
/// ```
pub struct RecognizeLinear;

const PASS: &str = "RecognizeLinear";

impl Pass for RecognizeLinear {
    fn name(&self) -> &'static str {
        PASS
    }

    fn run(&self, graph: &mut Graph, _ctx: &mut crate::PassContext<'_>) -> Result<bool, PassError> {
        apply_rules(
            graph,
            PASS,
            &[matmul_to_linear, absorb_bias, gemm_to_linear],
        )
    }
}

fn is_f32_const(g: &Graph, o: ir::Outlet, rank: usize) -> bool {
    g.const_value(o)
        .is_some_and(|t| t.dtype() == DType::F32 && t.shape().len() == rank)
}

/// `MatMul(x, W const [k, n])` → `Linear(x, W)`.
fn matmul_to_linear(g: &mut Graph, id: NodeId) -> Result<bool, String> {
    rule_if!(g.node(id).op == Op::MatMul);
    let ins = g.node_inputs(id);
    rule_if!(is_f32_const(g, ins[1], 2));
    rule_if!(g.outlet_type(ins[0]).rank().is_some_and(|r| r >= 2));
    let ty = g.node(id).outputs[0].clone();
    let name = derived_name(&g.node(id).name, "Linear");
    replace_with(g, id.into(), Op::Linear, &name, &ins[..2], ty)?;
    Ok(true)
}

/// `Add(Linear(x, W), b const [n])` → `Linear(x, W, b)`.
fn absorb_bias(g: &mut Graph, id: NodeId) -> Result<bool, String> {
    rule_if!(g.node(id).op == Op::Linear);
    let ins = g.node_inputs(id);
    rule_if!(ins.len() == 2);
    rule_if_some!(Some(add) = sole_consumer(g, id.into()));
    rule_if_some!(Some(bias) = other_operand(g, add, BinaryOp::Add, id.into()));
    rule_if!(is_f32_const(g, bias, 1));
    let n = g.const_value(ins[1]).map(|w| w.shape()[1]);
    rule_if!(g.const_value(bias).map(|b| b.shape()[0]) == n);
    let ty = g.node(add).outputs[0].clone();
    rule_if!(ty.shape == g.node(id).outputs[0].shape);
    let name = g.node(id).name.clone();
    replace_with(
        g,
        add.into(),
        Op::Linear,
        &name,
        &[ins[0], ins[1], bias],
        ty,
    )?;
    Ok(true)
}

/// `Gemm(x, B const, c?)`, `alpha = beta = 1`, `x` not transposed → `Linear(x, W, c)`.
fn gemm_to_linear(g: &mut Graph, id: NodeId) -> Result<bool, String> {
    rule_if_some!(
        Op::Gemm {
            alpha,
            beta,
            trans_a,
            trans_b
        } = g.node(id).op.clone()
    );
    rule_if!(alpha == 1.0 && !trans_a);
    let ins = g.node_inputs(id);
    rule_if!(is_f32_const(g, ins[1], 2));
    rule_if_some!(Some(b) = g.const_value(ins[1]).cloned());
    rule_if!(b.has_data() || !trans_b);
    let n = if trans_b { b.shape()[0] } else { b.shape()[1] };
    let bias = match ins.get(2) {
        None => None,
        Some(&c) => {
            rule_if!(beta == 1.0);
            rule_if_some!(Some(ct) = g.const_value(c).cloned());
            rule_if!(ct.dtype() == DType::F32 && ct.len() == n);
            rule_if!(ct.shape() == [n] || (ct.shape() == [1, n] && ct.has_data()));
            Some((c, ct))
        }
    };
    let ty = g.node(id).outputs[0].clone();
    let name = g.node(id).name.clone();
    let w = if trans_b {
        let wt = ir::TensorType::new(DType::F32, ir::fixed_shape(&[b.shape()[1], n]));
        let t = eval_node(&Op::Transpose { perm: vec![1, 0] }, &[&b], &wt)?
            .ok_or("transpose not evaluated")?;
        g.add_const(&format!("{}/weight", derived_name(&name, "Linear")), t)
    } else {
        ins[1]
    };
    let mut inputs = vec![ins[0], w];
    if let Some((c, ct)) = bias {
        inputs.push(if ct.shape() == [n] {
            c
        } else {
            let flat = Tensor::from_bytes(
                DType::F32,
                vec![n],
                ct.bytes().cloned().ok_or("bias has no data")?,
            )
            .map_err(|e| e.to_string())?;
            g.add_const(&format!("{}/bias", derived_name(&name, "Linear")), flat)
        });
    }
    replace_with(
        g,
        id.into(),
        Op::Linear,
        &derived_name(&name, "Linear"),
        &inputs,
        ty,
    )?;
    Ok(true)
}

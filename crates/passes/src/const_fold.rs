//! Constant folding, including the shape subgraphs of ONNX exports.

use ir::{DType, Dim, Graph, NodeId, Op, Outlet, Shape, Tensor, TensorType};

use crate::shape_infer::analyse;
use crate::sym::{SymInt, SymTensor, SMALL};
use crate::{eval_node, Pass, PassError};

/// Replaces computations on constants by their result, and shape arithmetic by constants.
///
/// - A node whose inputs are all constants is evaluated when its result is small
///   (≤ [`SMALL`] elements); layout ops (`Transpose`, `Cast`, `Reshape`, `Unsqueeze`, `Squeeze`,
///   `Flatten`) are evaluated on weights of any size.
/// - An integer value that shape inference knows exactly (`Shape` of a fixed shape, `Gather` of
///   a fixed dim, …) becomes a constant.
/// - The target of a `Reshape` whose symbolic value is known becomes a constant in ONNX terms:
///   `0` copies the input dim at the same position, one `-1` infers the rest; e.g.
///   `[batch, sequence, 4, 32]` from an input `[batch, sequence, 128]` is `[0, 0, 4, 32]`.
///   The target of an `Expand` becomes a constant with `1` where the input dim already is the
///   symbol. `Reshape` and `Expand` that do not change the shape are removed.
///
/// ```
/// use passes::{ConstantFolding, DeadCodeElimination, Pass};
/// let mut g = ir::text::parse(
///     "%0 = input[name=\"x\"] : f32[batch,sequence,128]\n\
///      %1 = shape[start=0](%0) : i64[3]\n\
///      %2 = const[value=i64[2]{0, 1}] : i64[2]\n\
///      %3 = gather[axis=0](%1, %2) : i64[2]\n\
///      %4 = const[value=i64[2]{4, 32}] : i64[2]\n\
///      %5 = concat[axis=0](%3, %4) : i64[4]\n\
///      %6 = reshape[allowzero=false](%0, %5) : f32[batch,sequence,4,32]\n\
///      output \"y\" = %6\n",
///     None,
/// ).unwrap();
/// ConstantFolding.run(&mut g).unwrap();
/// DeadCodeElimination.run(&mut g).unwrap();
/// let text = ir::text::print(&g).unwrap();
/// assert!(text.contains("const[value=i64[4]{0, 0, 4, 32}]"), "{text}");
/// assert!(!text.contains(" = shape["));
/// ```
pub struct ConstantFolding;

const PASS: &str = "ConstantFolding";

impl Pass for ConstantFolding {
    fn name(&self) -> &'static str {
        PASS
    }

    fn run(&self, graph: &mut Graph) -> Result<bool, PassError> {
        let analysis = analyse(graph)?;
        let mut changed = analysis.changed;
        let order = graph
            .topo_order()
            .map_err(|source| PassError::Graph { pass: PASS, source })?;
        for id in order {
            let name = graph.node(id).name.clone();
            let fired = fold_node(graph, id, &analysis.values)
                .map_err(|m| PassError::node(PASS, &name, m))?;
            changed |= fired;
        }
        if changed {
            crate::dce::remove_dead(graph);
        }
        Ok(changed)
    }
}

type Values = std::collections::HashMap<Outlet, SymTensor>;

fn fold_node(g: &mut Graph, id: NodeId, values: &Values) -> Result<bool, String> {
    let node = g.node(id);
    if matches!(node.op, Op::Input { .. } | Op::Const { .. }) || node.outputs.len() != 1 {
        return Ok(false);
    }
    let out: Outlet = id.into();
    if g.consumers(out).is_empty() && !g.is_graph_output(out) {
        return Ok(false);
    }
    let ty = node.outputs[0].clone();
    if let Some(t) = concrete_value(&ty, values.get(&out)) {
        return replace_by_const(g, id, t);
    }
    if let Some(t) = evaluate(g, id)? {
        return replace_by_const(g, id, t);
    }
    match node.op.clone() {
        Op::Reshape { allowzero } => fold_reshape(g, id, allowzero, values),
        Op::Expand => fold_expand(g, id, values),
        _ => Ok(false),
    }
}

/// The constant for a fully known integer value of type `ty`.
fn concrete_value(ty: &TensorType, v: Option<&SymTensor>) -> Option<Tensor> {
    let v = v?;
    if !(ty.dtype.is_integer() || ty.dtype == DType::Bool) {
        return None;
    }
    let ints = v.as_ints()?;
    let shape: Vec<usize> = ty
        .shape
        .as_ref()?
        .iter()
        .map(Dim::as_fixed)
        .collect::<Option<_>>()?;
    if shape.iter().product::<usize>() != ints.len() {
        return None;
    }
    Some(match ty.dtype {
        DType::I64 => Tensor::from_vec(shape, ints),
        DType::I32 => Tensor::from_vec(shape, ints.into_iter().map(|x| x as i32).collect()),
        DType::I8 => Tensor::from_vec(shape, ints.into_iter().map(|x| x as i8).collect()),
        DType::U8 => Tensor::from_vec(shape, ints.into_iter().map(|x| x as u8).collect()),
        _ => Tensor::from_vec(shape, ints.into_iter().map(|x| x != 0).collect()),
    })
}

fn evaluate(g: &Graph, id: NodeId) -> Result<Option<Tensor>, String> {
    let node = g.node(id);
    let ins = g.node_inputs(id);
    let consts: Option<Vec<&Tensor>> = ins.iter().map(|&o| g.const_value(o)).collect();
    let Some(consts) = consts else {
        return Ok(None);
    };
    if consts.iter().any(|t| !t.has_data()) {
        return Ok(None);
    }
    let ty = &node.outputs[0];
    let Some(n) = ty
        .shape
        .as_ref()
        .and_then(|s| s.iter().map(Dim::as_fixed).product::<Option<usize>>())
    else {
        return Ok(None);
    };
    let layout = matches!(
        node.op,
        Op::Transpose { .. }
            | Op::Cast { .. }
            | Op::Reshape { .. }
            | Op::Unsqueeze { .. }
            | Op::Squeeze { .. }
            | Op::Flatten { .. }
    );
    if n > SMALL && !layout {
        return Ok(None);
    }
    eval_node(&node.op, &consts, ty)
}

fn replace_by_const(g: &mut Graph, id: NodeId, t: Tensor) -> Result<bool, String> {
    let name = g.node(id).name.clone();
    let c = g.add_const(&name, t);
    g.replace_uses(id.into(), c).map_err(|e| e.to_string())?;
    Ok(true)
}

fn input_shape(g: &Graph, id: NodeId, slot: usize) -> Option<Shape> {
    g.outlet_type(g.node_inputs(id)[slot]).shape.clone()
}

fn fold_reshape(
    g: &mut Graph,
    id: NodeId,
    allowzero: bool,
    values: &Values,
) -> Result<bool, String> {
    let ins = g.node_inputs(id);
    let x = input_shape(g, id, 0);
    let out = g.node(id).outputs[0].shape.clone();
    if x.is_some() && x == out {
        g.replace_uses(id.into(), ins[0])
            .map_err(|e| e.to_string())?;
        return Ok(true);
    }
    if g.const_value(ins[1]).is_some() || allowzero {
        return Ok(false);
    }
    let (Some(x), Some(t)) = (x, values.get(&ins[1])) else {
        return Ok(false);
    };
    let Some(target) = reshape_target(&x, t) else {
        return Ok(false);
    };
    let name = format!("{}/shape", g.node(id).name);
    let c = g.add_const(&name, Tensor::from_vec(vec![target.len()], target));
    g.set_node_input(id, 1, c).map_err(|e| e.to_string())?;
    Ok(true)
}

/// A reshape target in ONNX terms for the symbolic target `t` of an input of shape `x`.
fn reshape_target(x: &Shape, t: &SymTensor) -> Option<Vec<i64>> {
    let mut infer_used = t.data.iter().any(|e| *e == SymInt::Int(-1));
    let mut out = Vec::with_capacity(t.data.len());
    for (i, e) in t.data.iter().enumerate() {
        out.push(match e {
            SymInt::Int(n) => *n,
            SymInt::Dim(d) if x.get(i) == Some(d) => 0,
            _ if !infer_used => {
                infer_used = true;
                -1
            }
            _ => return None,
        });
    }
    Some(out)
}

fn fold_expand(g: &mut Graph, id: NodeId, values: &Values) -> Result<bool, String> {
    let ins = g.node_inputs(id);
    let x = input_shape(g, id, 0);
    let out = g.node(id).outputs[0].shape.clone();
    if x.is_some() && x == out {
        g.replace_uses(id.into(), ins[0])
            .map_err(|e| e.to_string())?;
        return Ok(true);
    }
    if g.const_value(ins[1]).is_some() {
        return Ok(false);
    }
    let (Some(x), Some(t)) = (x, values.get(&ins[1])) else {
        return Ok(false);
    };
    let r = x.len().max(t.data.len());
    let mut target = Vec::with_capacity(t.data.len());
    for (j, e) in t.data.iter().enumerate() {
        let p = r - t.data.len() + j;
        let xd = (p + x.len()).checked_sub(r).map(|k| &x[k]);
        target.push(match e {
            SymInt::Int(n) => *n,
            SymInt::Dim(d) if xd == Some(d) => 1,
            _ => return Ok(false),
        });
    }
    let name = format!("{}/shape", g.node(id).name);
    let c = g.add_const(&name, Tensor::from_vec(vec![target.len()], target));
    g.set_node_input(id, 1, c).map_err(|e| e.to_string())?;
    Ok(true)
}

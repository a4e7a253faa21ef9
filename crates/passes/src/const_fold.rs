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
/// - The target of a `Reshape` whose output type shape inference could work out becomes a
///   constant in ONNX terms: `0` copies the input dim at the same position, one `-1` infers the
///   rest; e.g. `[batch, sequence, 4, 32]` from an input `[batch, sequence, 128]` is
///   `[0, 0, 4, 32]`. The target of an `Expand` becomes a constant with `1` where the output
///   dim is the input's. `Reshape` and `Expand` that do not change the shape are removed.
/// - A symbolic shape value that is a run of a graph input's dims becomes one `Shape` of that
///   input (`Unsqueeze(Gather(Shape(ids), 1))` → `Shape[start=1, end=2](ids)`), and a `Where`
///   on a constant condition becomes the branch it picks.
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
/// ConstantFolding.run(&mut g, &mut passes::PassContext::default()).unwrap();
/// DeadCodeElimination.run(&mut g, &mut passes::PassContext::default()).unwrap();
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

    fn run(&self, graph: &mut Graph, _ctx: &mut crate::PassContext<'_>) -> Result<bool, PassError> {
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
        Op::Reshape { allowzero } => fold_reshape(g, id, allowzero),
        Op::Expand => fold_expand(g, id),
        Op::Where => fold_where(g, id),
        Op::Select => fold_select(g, id),
        Op::Shape { .. } => Ok(false),
        _ => shape_of_input(g, id, values),
    }
}

/// `Select` with a constant condition is the value it chooses (the other, an `If` branch, is
/// then dead code). Unlike `Where`'s branches, the chosen value may be more precisely typed than
/// the select, whose shape is known only where both agree; consumers are retyped by the next
/// shape inference.
fn fold_select(g: &mut Graph, id: NodeId) -> Result<bool, String> {
    let ins = g.node_inputs(id);
    let Some(c) = g.const_value(ins[0]).and_then(|t| t.to_i64_vec().ok()) else {
        return Ok(false);
    };
    let pick = match c.as_slice() {
        [0] => ins[2],
        [_] => ins[1],
        _ => return Ok(false),
    };
    g.replace_uses(id.into(), pick).map_err(|e| e.to_string())?;
    Ok(true)
}

/// `Where` with a constant all-true or all-false condition is the chosen branch, when that
/// branch already has the output's shape.
fn fold_where(g: &mut Graph, id: NodeId) -> Result<bool, String> {
    let ins = g.node_inputs(id);
    let Some(c) = g.const_value(ins[0]).and_then(|t| t.to_i64_vec().ok()) else {
        return Ok(false);
    };
    let pick = if !c.is_empty() && c.iter().all(|&x| x != 0) {
        ins[1]
    } else if c.iter().all(|&x| x == 0) {
        ins[2]
    } else {
        return Ok(false);
    };
    let ty = &g.node(id).outputs[0];
    if ty.shape.is_none() || g.outlet_type(pick) != ty {
        return Ok(false);
    }
    g.replace_uses(id.into(), pick).map_err(|e| e.to_string())?;
    Ok(true)
}

/// A symbolic 1-D i64 value that is a run of dims of a graph input's shape (`[batch, sequence]`
/// built by `Shape`/`Gather`/`Unsqueeze`/`Concat`) becomes one `Shape[start, end]` of that
/// input.
fn shape_of_input(g: &mut Graph, id: NodeId, values: &Values) -> Result<bool, String> {
    let ty = &g.node(id).outputs[0];
    let Some(v) = values.get(&Outlet::from(id)) else {
        return Ok(false);
    };
    if ty.dtype != DType::I64 || ty.rank() != Some(1) || v.is_concrete() {
        return Ok(false);
    }
    let Some(dims) = v
        .data
        .iter()
        .map(SymInt::as_dim)
        .collect::<Option<Vec<Dim>>>()
    else {
        return Ok(false);
    };
    for &input in g.inputs() {
        let Some(s) = &g.node(input).outputs[0].shape else {
            continue;
        };
        let Some(start) = (0..s.len()).find(|&a| s[a..].starts_with(&dims)) else {
            continue;
        };
        let op = Op::Shape {
            start: start as i64,
            end: Some((start + dims.len()) as i64),
        };
        let name = g.node(id).name.clone();
        let new = g
            .add_node(op, &name, &[input.into()], vec![ty.clone()])
            .map_err(|e| e.to_string())?;
        g.replace_uses(id.into(), new.into())
            .map_err(|e| e.to_string())?;
        return Ok(true);
    }
    Ok(false)
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
    // The dtypes that carry symbolic values (`sym::tracked`).
    Some(match ty.dtype {
        DType::I64 => Tensor::from_vec(shape, ints),
        DType::I32 => Tensor::from_vec(shape, ints.into_iter().map(|x| x as i32).collect()),
        DType::Bool => Tensor::from_vec(shape, ints.into_iter().map(|x| x != 0).collect()),
        _ => return None,
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
    let Some(n) = ty.shape.as_ref().and_then(|s| {
        s.iter()
            .try_fold(1usize, |a, d| a.checked_mul(d.as_fixed()?))
    }) else {
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

fn fold_reshape(g: &mut Graph, id: NodeId, allowzero: bool) -> Result<bool, String> {
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
    let (Some(x), Some(out)) = (x, out) else {
        return Ok(false);
    };
    let Some(target) = reshape_target(&x, &out) else {
        return Ok(false);
    };
    let name = format!("{}/shape", g.node(id).name);
    let c = g.add_const(&name, Tensor::from_vec(vec![target.len()], target));
    g.set_node_input(id, 1, c).map_err(|e| e.to_string())?;
    Ok(true)
}

/// A reshape target in ONNX terms for reshaping `x` into the inferred `out`: fixed dims as
/// numbers, a symbolic dim equal to the input's at the same position as `0`, one other as `-1`.
fn reshape_target(x: &Shape, out: &Shape) -> Option<Vec<i64>> {
    let mut infer_used = false;
    let mut target = Vec::with_capacity(out.len());
    for (i, d) in out.iter().enumerate() {
        target.push(match d.as_fixed() {
            // A literal 0 would mean "copy" here.
            Some(0) => return None,
            Some(n) => n as i64,
            None if x.get(i) == Some(d) => 0,
            None if !infer_used => {
                infer_used = true;
                -1
            }
            None => return None,
        });
    }
    Some(target)
}

fn fold_expand(g: &mut Graph, id: NodeId) -> Result<bool, String> {
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
    let (Some(x), Some(out)) = (x, out) else {
        return Ok(false);
    };
    // Each output dim is either x's (aligned right), written 1, or a fixed number.
    let mut target = Vec::with_capacity(out.len());
    for (p, d) in out.iter().enumerate() {
        let xd = (p + x.len()).checked_sub(out.len()).map(|k| &x[k]);
        target.push(match d.as_fixed() {
            _ if xd == Some(d) => 1,
            Some(n) => n as i64,
            None => return Ok(false),
        });
    }
    let name = format!("{}/shape", g.node(id).name);
    let c = g.add_const(&name, Tensor::from_vec(vec![target.len()], target));
    g.set_node_input(id, 1, c).map_err(|e| e.to_string())?;
    Ok(true)
}

//! Shape inference with symbolic dims, and symbolic values of small integer tensors.
//!
//! Every node's output type is computed from its inputs' types (and, for `Reshape`, `Expand`,
//! `Slice`, `ConstantOfShape` and `Range`, from the *value* of their shape operands). Values of
//! small integer tensors are propagated symbolically ([`SymTensor`]): `Shape(x)` of an
//! `f32[batch,sequence,128]` is `[batch, sequence, 128]`, and a reshape target built from it by
//! `Gather`/`Unsqueeze`/`Concat` gives the reshape an exact symbolic output type. A dim that
//! cannot be known gets a fresh symbol `unkN`, never a guessed number.
//!
//! One assumption is made on symbols: a slice whose end is a symbol `S` on an axis of fixed size
//! `n` yields `S` elements, i.e. `S ≤ n` (the `position_ids[:, :sequence]` slice of BERT-family
//! embeddings). Inputs that break it make the model fail anyway (the sliced positions no longer
//! broadcast against `sequence`).

use std::collections::{HashMap, HashSet};

use ir::{BinaryOp, DType, Dim, EpilogueStep, Graph, Op, Outlet, Shape, TensorType, UnaryOp};

use crate::sym::{dim_add, dim_mul, SymInt, SymTensor, SMALL};
use crate::{Pass, PassError};

/// Fills every node's output types from its inputs.
///
/// ```
/// use passes::{Pass, ShapeInference};
/// let mut g = ir::text::parse(
///     "%0 = input[name=\"x\"] : f32[batch,sequence,128]\n\
///      %1 = shape[start=0](%0) : i64[*]\n\
///      %2 = const[value=i64[2]{4, 32}] : i64[2]\n\
///      %3 = const[value=i64[2]{0, 1}] : i64[2]\n\
///      %4 = gather[axis=0](%1, %3) : i64[*]\n\
///      %5 = concat[axis=0](%4, %2) : i64[*]\n\
///      %6 = reshape[allowzero=false](%0, %5) : f32[*]\n\
///      output \"y\" = %6\n",
///     None,
/// ).unwrap();
/// ShapeInference.run(&mut g, &mut passes::PassContext::default()).unwrap();
/// let text = ir::text::print(&g).unwrap();
/// assert!(text.contains("reshape[allowzero=false](%0, %5) : f32[batch,sequence,4,32]"));
/// ```
pub struct ShapeInference;

impl Pass for ShapeInference {
    fn name(&self) -> &'static str {
        "ShapeInference"
    }

    fn run(&self, graph: &mut Graph, _ctx: &mut crate::PassContext<'_>) -> Result<bool, PassError> {
        Ok(analyse(graph)?.changed)
    }
}

/// The result of [`analyse`]: the symbolic values of small integer tensors.
#[derive(Debug, Default)]
pub struct Analysis {
    pub values: HashMap<Outlet, SymTensor>,
    /// Whether any output type changed.
    pub changed: bool,
}

const PASS: &str = "ShapeInference";

/// Infers and writes every node's output types, and returns the symbolic values found.
///
/// ```
/// use ir::Dim;
/// use passes::{analyse, SymInt};
/// let mut g = ir::text::parse(
///     "%0 = input[name=\"x\"] : f32[batch,sequence,128]\n\
///      %1 = shape[start=0](%0) : i64[*]\n\
///      output \"s\" = %1\n",
///     None,
/// ).unwrap();
/// let a = analyse(&mut g).unwrap();
/// let s = g.outputs()[0].1;
/// assert_eq!(a.values[&s].data[1], SymInt::Dim(Dim::sym("sequence")));
/// assert_eq!(a.values[&s].to_string(), "[batch, sequence, 128]");
/// ```
pub fn analyse(graph: &mut Graph) -> Result<Analysis, PassError> {
    let mut ctx = Ctx::new(graph);
    analyse_in(graph, &mut ctx)
}

/// [`analyse`] with the fresh-symbol state of an enclosing analysis (a loop body's symbols must
/// not collide with those of the graph around it).
fn analyse_in(graph: &mut Graph, ctx: &mut Ctx) -> Result<Analysis, PassError> {
    let order = graph
        .topo_order()
        .map_err(|source| PassError::Graph { pass: PASS, source })?;
    let mut analysis = Analysis::default();
    for id in order {
        let node = graph.node(id);
        let name = node.name.clone();
        let inputs = graph.node_inputs(id);
        let in_types: Vec<TensorType> = inputs
            .iter()
            .map(|&o| graph.outlet_type(o).clone())
            .collect();
        let in_values: Vec<Option<&SymTensor>> =
            inputs.iter().map(|o| analysis.values.get(o)).collect();
        let (types, value) = infer(ctx, &node.op, &in_types, &in_values)
            .map_err(|m| PassError::node(PASS, &name, m))?;
        let merged = merge(
            ctx,
            &node.outputs,
            types,
            matches!(node.op, Op::Input { .. }),
        )
        .map_err(|m| PassError::node(PASS, &name, m))?;
        if merged != node.outputs {
            analysis.changed = true;
            graph.node_mut(id).outputs = merged;
        }
        // A loop whose body gives only its condition has no output.
        let Some(out_ty) = graph.node(id).outputs.first() else {
            continue;
        };
        let value = value.or_else(|| match &graph.node(id).op {
            Op::Const { value } => SymTensor::from_tensor(value),
            _ => None,
        });
        if let Some(mut v) = value {
            if let Some(fixed) = fixed_dims(out_ty) {
                if fixed.iter().product::<usize>() == v.data.len() {
                    v.shape = fixed;
                }
            }
            if sym_shape_matches(out_ty, &v) {
                analysis.values.insert(Outlet::new(id, 0), v);
            }
        }
    }
    Ok(analysis)
}

fn fixed_dims(ty: &TensorType) -> Option<Vec<usize>> {
    ty.shape.as_ref()?.iter().map(Dim::as_fixed).collect()
}

fn sym_shape_matches(ty: &TensorType, v: &SymTensor) -> bool {
    ty.shape.as_ref().is_some_and(|s| {
        s.len() == v.shape.len()
            && s.iter()
                .zip(&v.shape)
                .all(|(d, &n)| d.as_fixed() == Some(n))
    })
}

/// Keeps the graph's existing dims where inference could only invent a fresh symbol, so that
/// the pass is idempotent and keeps names the importer gave; rejects contradictions.
fn merge(
    ctx: &Ctx,
    old: &[TensorType],
    new: Vec<TensorType>,
    is_input: bool,
) -> Result<Vec<TensorType>, String> {
    if is_input {
        return Ok(old.to_vec());
    }
    let mut out = Vec::with_capacity(new.len());
    for (i, n) in new.into_iter().enumerate() {
        let Some(o) = old.get(i) else {
            out.push(n);
            continue;
        };
        let shape = match (&o.shape, n.shape) {
            (Some(os), None) => Some(os.clone()),
            (None, ns) => ns,
            (Some(os), Some(ns)) if os.len() != ns.len() => {
                return Err(format!(
                    "output {i}: inferred {}, the graph says {o}",
                    TensorType::new(n.dtype, ns)
                ));
            }
            (Some(os), Some(ns)) => {
                let mut s = Vec::with_capacity(ns.len());
                for (od, nd) in os.iter().zip(ns) {
                    match (od.as_fixed(), nd.as_fixed()) {
                        (Some(a), Some(b)) if a != b => {
                            return Err(format!(
                                "output {i}: inferred dim {b}, the graph says {a} ({o})"
                            ))
                        }
                        _ => {}
                    }
                    s.push(if ctx.is_fresh(&nd) { od.clone() } else { nd });
                }
                Some(s)
            }
        };
        out.push(TensorType {
            dtype: n.dtype,
            shape,
        });
    }
    Ok(out)
}

/// Fresh-symbol state: `unkN` numbered after the largest already in the graph.
struct Ctx {
    next: usize,
    created: HashSet<String>,
}

impl Ctx {
    fn new(g: &Graph) -> Ctx {
        let mut next = 0;
        for id in g.node_ids() {
            for t in &g.node(id).outputs {
                for d in t.shape.iter().flatten() {
                    for s in d.symbols() {
                        if let Some(n) = s.strip_prefix("unk").and_then(|r| r.parse::<usize>().ok())
                        {
                            next = next.max(n + 1);
                        }
                    }
                }
            }
        }
        Ctx {
            next,
            created: HashSet::new(),
        }
    }

    fn fresh(&mut self) -> Dim {
        let name = format!("unk{}", self.next);
        self.next += 1;
        self.created.insert(name.clone());
        Dim::sym(&name)
    }

    fn is_fresh(&self, d: &Dim) -> bool {
        d.symbols().iter().any(|s| self.created.contains(s))
    }
}

fn norm_axis(axis: i64, rank: usize) -> Result<usize, String> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a >= r {
        return Err(format!("axis {axis} is out of range for rank {rank}"));
    }
    Ok(a as usize)
}

fn broadcast_dim(ctx: &mut Ctx, a: &Dim, b: &Dim) -> Result<Dim, String> {
    if a == b {
        return Ok(a.clone());
    }
    match (a.as_fixed(), b.as_fixed()) {
        (Some(1), _) => Ok(b.clone()),
        (_, Some(1)) => Ok(a.clone()),
        (Some(x), Some(y)) => Err(format!("dims {x} and {y} do not broadcast")),
        // A symbol against a fixed n > 1: the symbol must be 1 or n, and the result is n.
        (Some(_), None) => Ok(a.clone()),
        (None, Some(_)) => Ok(b.clone()),
        (None, None) => Ok(ctx.fresh()),
    }
}

fn broadcast(ctx: &mut Ctx, shapes: &[&Shape]) -> Result<Shape, String> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![Dim::fixed(1); rank];
    for s in shapes {
        let off = rank - s.len();
        for (i, d) in s.iter().enumerate() {
            out[off + i] = broadcast_dim(ctx, &out[off + i], d)?;
        }
    }
    Ok(out)
}

fn product(dims: &[Dim]) -> Result<Dim, String> {
    dims.iter()
        .try_fold(Dim::fixed(1), |acc, d| dim_mul(&acc, d))
        .ok_or_else(|| format!("the product of dims {dims:?} overflows"))
}

/// Whether an attention op quantizes its output (its `out_u8`).
fn attention_out_u8(op: &Op) -> bool {
    matches!(
        op,
        Op::AttentionQkv {
            out_u8: Some(_),
            ..
        } | Op::AttentionPacked {
            out_u8: Some(_),
            ..
        }
    )
}

fn check_inner(k1: &Dim, k2: &Dim, what: &str) -> Result<(), String> {
    match (k1.as_fixed(), k2.as_fixed()) {
        (Some(a), Some(b)) if a != b => Err(format!("{what}: inner dims {a} and {b} differ")),
        _ => Ok(()),
    }
}

fn matmul_shape(ctx: &mut Ctx, a: &Shape, b: &Shape) -> Result<Shape, String> {
    if a.is_empty() || b.is_empty() {
        return Err("matmul of a scalar".into());
    }
    let (a2, a_vec) = if a.len() == 1 {
        (vec![Dim::fixed(1), a[0].clone()], true)
    } else {
        (a.clone(), false)
    };
    let (b2, b_vec) = if b.len() == 1 {
        (vec![b[0].clone(), Dim::fixed(1)], true)
    } else {
        (b.clone(), false)
    };
    let (m, k1) = (&a2[a2.len() - 2], &a2[a2.len() - 1]);
    let (k2, n) = (&b2[b2.len() - 2], &b2[b2.len() - 1]);
    check_inner(k1, k2, "matmul")?;
    let batch = broadcast(
        ctx,
        &[&a2[..a2.len() - 2].to_vec(), &b2[..b2.len() - 2].to_vec()],
    )?;
    let mut out = batch;
    if !a_vec {
        out.push(m.clone());
    }
    if !b_vec {
        out.push(n.clone());
    }
    Ok(out)
}

type Inferred = (Vec<TensorType>, Option<SymTensor>);

fn infer(
    ctx: &mut Ctx,
    op: &Op,
    ins: &[TensorType],
    vals: &[Option<&SymTensor>],
) -> Result<Inferred, String> {
    let dtype = |i: usize| ins.get(i).map(|t| t.dtype).unwrap_or(DType::F32);
    let one = |dt: DType, s: Option<Shape>| {
        vec![TensorType {
            dtype: dt,
            shape: s,
        }]
    };
    let shapes: Option<Vec<&Shape>> = ins.iter().map(|t| t.shape.as_ref()).collect();
    let value = infer_value(op, ins, vals);
    let types = match op {
        Op::Input { .. } => return Ok((vec![], None)),
        Op::Loop { carried, body } => loop_types(ctx, *carried, body, ins)?,
        Op::Const { value } => one(
            value.dtype(),
            Some(value.shape().iter().map(|&d| Dim::fixed(d)).collect()),
        ),
        Op::Binary(b) => {
            let dt = match b {
                BinaryOp::Equal
                | BinaryOp::Less
                | BinaryOp::Greater
                | BinaryOp::LessOrEqual
                | BinaryOp::GreaterOrEqual
                | BinaryOp::And
                | BinaryOp::Or
                | BinaryOp::Xor => DType::Bool,
                _ => dtype(0),
            };
            let s = shapes.map(|s| broadcast(ctx, &s)).transpose()?;
            one(dt, s)
        }
        Op::Unary(u) => one(u.output_dtype(dtype(0)), ins[0].shape.clone()),
        Op::Where => one(dtype(1), shapes.map(|s| broadcast(ctx, &s)).transpose()?),
        Op::Select => {
            if dtype(0) != DType::Bool || dtype(1) != dtype(2) {
                return Err(format!(
                    "select: takes a bool condition and two values of one dtype, got {}, {}, {}",
                    dtype(0),
                    dtype(1),
                    dtype(2)
                ));
            }
            let n = ins[0]
                .shape
                .as_ref()
                .and_then(|s| s.iter().map(|d| d.as_fixed()).product::<Option<usize>>());
            if n.is_some_and(|n| n != 1) {
                return Err(format!(
                    "select: the condition must hold one element, holds {n:?}"
                ));
            }
            // A condition whose value is known already (in this same sweep) gives the chosen
            // value's shape, so that what follows is typed at once: DeBERTa's next layer tests
            // shapes that come through this one, and a select per iteration of the pipeline
            // would not reach a fixpoint on 12 layers. Otherwise either value may come out.
            let chosen = vals[0].and_then(|v| match v.data.as_slice() {
                [c] => c.as_int(),
                _ => None,
            });
            let shape = match (chosen, &ins[1].shape, &ins[2].shape) {
                (Some(0), _, b) => b.clone(),
                (Some(_), a, _) => a.clone(),
                (None, Some(a), Some(b)) if a == b => Some(a.clone()),
                _ => None,
            };
            one(dtype(1), shape)
        }
        Op::Cast { to } => one(*to, ins[0].shape.clone()),
        Op::Clip => {
            for (i, t) in ins.iter().enumerate().skip(1) {
                let n = t
                    .shape
                    .as_ref()
                    .and_then(|s| s.iter().map(|d| d.as_fixed()).product::<Option<usize>>());
                if let Some(n) = n {
                    if n != 1 {
                        return Err(format!("clip: bound {i} must hold one element, holds {n}"));
                    }
                }
                if t.dtype != dtype(0) {
                    return Err(format!(
                        "clip: bound {i} is {}, the input is {}",
                        t.dtype,
                        dtype(0)
                    ));
                }
            }
            one(dtype(0), ins[0].shape.clone())
        }
        Op::Shape { start, end } => {
            let s = ins[0].shape.as_ref().map(|s| {
                let (a, b) = shape_range(*start, *end, s.len());
                vec![Dim::fixed(b - a)]
            });
            one(DType::I64, s)
        }
        Op::Reshape { allowzero } => one(
            dtype(0),
            reshape_shape(ctx, &ins[0], &ins[1], vals[1], *allowzero)?,
        ),
        Op::Transpose { perm } => {
            let s = match &ins[0].shape {
                None => None,
                Some(s) => {
                    let perm = if perm.is_empty() {
                        (0..s.len() as i64).rev().collect()
                    } else {
                        perm.clone()
                    };
                    if perm.len() != s.len() {
                        return Err(format!("perm {perm:?} for rank {}", s.len()));
                    }
                    Some(
                        perm.iter()
                            .map(|&p| norm_axis(p, s.len()).map(|p| s[p].clone()))
                            .collect::<Result<_, _>>()?,
                    )
                }
            };
            one(dtype(0), s)
        }
        Op::Unsqueeze { axes } | Op::Squeeze { axes } if ins.len() == 2 => {
            // Axes as an input: the shape follows once they are constant; until then only the
            // rank, when the number of axes is known.
            if let Some(v) = vals[1].and_then(|v| v.as_ints()) {
                let op = match op {
                    Op::Unsqueeze { .. } => Op::Unsqueeze { axes: v },
                    _ => Op::Squeeze { axes: v },
                };
                infer(ctx, &op, &ins[..1], &vals[..1])?.0
            } else {
                let k = match ins[1].shape.as_deref() {
                    Some([d]) => d.as_fixed(),
                    _ => None,
                };
                let rank = match (&ins[0].shape, k, op) {
                    (Some(s), Some(k), Op::Unsqueeze { .. }) => Some(s.len() + k),
                    (Some(s), Some(k), _) if k > 0 => s.len().checked_sub(k),
                    _ => None,
                };
                let _ = axes;
                one(
                    dtype(0),
                    rank.map(|r| (0..r).map(|_| ctx.fresh()).collect()),
                )
            }
        }
        Op::Unsqueeze { axes } => {
            let s = match &ins[0].shape {
                None => None,
                Some(s) => {
                    let r = s.len() + axes.len();
                    let mut ax: Vec<usize> = axes
                        .iter()
                        .map(|&a| norm_axis(a, r))
                        .collect::<Result<_, _>>()?;
                    ax.sort();
                    let mut it = s.iter();
                    Some(
                        (0..r)
                            .map(|i| {
                                if ax.contains(&i) {
                                    Dim::fixed(1)
                                } else {
                                    it.next().cloned().unwrap_or(Dim::fixed(1))
                                }
                            })
                            .collect(),
                    )
                }
            };
            one(dtype(0), s)
        }
        Op::Squeeze { axes } => {
            let s = match &ins[0].shape {
                None => None,
                Some(s) if axes.is_empty() => {
                    if s.iter().any(|d| d.as_fixed().is_none()) {
                        None
                    } else {
                        Some(
                            s.iter()
                                .filter(|d| d.as_fixed() != Some(1))
                                .cloned()
                                .collect(),
                        )
                    }
                }
                Some(s) => {
                    let ax: Vec<usize> = axes
                        .iter()
                        .map(|&a| norm_axis(a, s.len()))
                        .collect::<Result<_, _>>()?;
                    for &a in &ax {
                        if let Some(n) = s[a].as_fixed() {
                            if n != 1 {
                                return Err(format!("squeeze of axis {a} of size {n}"));
                            }
                        }
                    }
                    Some(
                        s.iter()
                            .enumerate()
                            .filter(|(i, _)| !ax.contains(i))
                            .map(|(_, d)| d.clone())
                            .collect(),
                    )
                }
            };
            one(dtype(0), s)
        }
        Op::Concat { axis } => {
            let s = match shapes {
                None => None,
                Some(ss) => {
                    let r = ss[0].len();
                    let a = norm_axis(*axis, r)?;
                    let mut out = ss[0].clone();
                    for s in &ss[1..] {
                        if s.len() != r {
                            return Err(format!("concat of ranks {r} and {}", s.len()));
                        }
                        for i in 0..r {
                            if i != a {
                                out[i] =
                                    broadcast_dim(ctx, &out[i], &s[i]).and_then(|d| {
                                        match (out[i].as_fixed(), s[i].as_fixed()) {
                                            (Some(x), Some(y)) if x != y => Err(format!(
                                                "concat: dims {x} and {y} differ on axis {i}"
                                            )),
                                            _ => Ok(d),
                                        }
                                    })?;
                            }
                        }
                        out[a] = match dim_add(&out[a], &s[a]) {
                            Some(d) => d,
                            None => ctx.fresh(),
                        };
                    }
                    Some(out)
                }
            };
            one(dtype(0), s)
        }
        Op::Split { axis, num_outputs } => {
            let k = *num_outputs;
            match &ins[0].shape {
                None => vec![TensorType::unknown_shape(dtype(0)); k],
                Some(s) => {
                    let a = norm_axis(*axis, s.len())?;
                    let sizes: Option<Vec<usize>> = match vals.get(1).copied().flatten() {
                        Some(v) => match v.as_ints() {
                            Some(sz) => {
                                if sz.len() != k || sz.iter().any(|&x| x < 0) {
                                    return Err(format!("split: sizes {sz:?} for {k} outputs"));
                                }
                                let total: i64 = sz.iter().sum();
                                if let Some(d) = s[a].as_fixed() {
                                    if total != d as i64 {
                                        return Err(format!(
                                            "split: sizes {sz:?} sum to {total}, the axis is {d}"
                                        ));
                                    }
                                }
                                Some(sz.into_iter().map(|x| x as usize).collect())
                            }
                            None => None,
                        },
                        None if ins.len() > 1 => None,
                        None => s[a].as_fixed().map(|d| {
                            let chunk = d.div_ceil(k);
                            (0..k)
                                .map(|i| d.saturating_sub(i * chunk).min(chunk))
                                .collect()
                        }),
                    };
                    (0..k)
                        .map(|i| {
                            let mut o = s.clone();
                            o[a] = match &sizes {
                                Some(sz) => Dim::fixed(sz[i]),
                                None if k == 1 && ins.len() == 1 => s[a].clone(),
                                None => ctx.fresh(),
                            };
                            TensorType {
                                dtype: dtype(0),
                                shape: Some(o),
                            }
                        })
                        .collect()
                }
            }
        }
        Op::Gather { axis } => {
            let s = match shapes {
                None => None,
                Some(ss) => {
                    let a = norm_axis(*axis, ss[0].len())?;
                    let mut out: Shape = ss[0][..a].to_vec();
                    out.extend(ss[1].iter().cloned());
                    out.extend(ss[0][a + 1..].iter().cloned());
                    Some(out)
                }
            };
            one(dtype(0), s)
        }
        Op::GatherElements { .. } => one(dtype(0), ins[1].shape.clone()),
        Op::ScatterNd { .. } | Op::ScatterElements { .. } => one(dtype(0), ins[0].shape.clone()),
        Op::Trilu { .. } => {
            if ins[0].shape.as_ref().is_some_and(|s| s.len() < 2) {
                return Err("trilu: the input has fewer than 2 dims".into());
            }
            one(dtype(0), ins[0].shape.clone())
        }
        Op::GatherNd { batch_dims } => {
            let s = match shapes {
                Some(ss) => {
                    let (data, idx) = (ss[0], ss[1]);
                    let b = usize::try_from(*batch_dims)
                        .ok()
                        .filter(|&b| b < data.len().min(idx.len()))
                        .ok_or_else(|| {
                            format!(
                                "gather_nd: batch_dims {batch_dims} for data rank {} and \
                                 indices rank {}",
                                data.len(),
                                idx.len()
                            )
                        })?;
                    match idx.last().and_then(|d| d.as_fixed()) {
                        Some(k) if b + k > data.len() => {
                            return Err(format!(
                                "gather_nd: indices rows of {k} for data rank {} after {b} \
                                 batch dims",
                                data.len()
                            ))
                        }
                        Some(k) => {
                            let mut out = idx[..idx.len() - 1].to_vec();
                            out.extend(data[b + k..].iter().cloned());
                            Some(out)
                        }
                        None => None,
                    }
                }
                None => None,
            };
            one(dtype(0), s)
        }
        Op::Slice => one(dtype(0), slice_shape(ctx, ins, vals)?),
        Op::Expand => {
            let s = match (&ins[0].shape, shape_operand(&ins[1], vals[1])?) {
                (Some(x), Some(target)) => {
                    let target: Vec<Option<Dim>> = target;
                    let r = x.len().max(target.len());
                    let mut out = Vec::with_capacity(r);
                    for i in 0..r {
                        let xd = (i + x.len())
                            .checked_sub(r)
                            .map(|j| x[j].clone())
                            .unwrap_or(Dim::fixed(1));
                        let td = (i + target.len()).checked_sub(r).map(|j| target[j].clone());
                        out.push(match td {
                            None => xd,
                            Some(None) => ctx.fresh(),
                            Some(Some(t)) => broadcast_dim(ctx, &xd, &t)?,
                        });
                    }
                    Some(out)
                }
                _ => None,
            };
            one(dtype(0), s)
        }
        Op::Pad { .. } => {
            let pads = vals[1].and_then(|v| v.as_ints());
            let axes = match ins.get(3) {
                None => Some(None),
                Some(_) => vals[3].and_then(|v| v.as_ints()).map(Some),
            };
            let s = match (&ins[0].shape, pads, axes) {
                (Some(s), Some(p), Some(axes)) => {
                    let r = s.len();
                    let axes: Vec<usize> = match axes {
                        None => (0..r).collect(),
                        Some(a) => a
                            .iter()
                            .map(|&a| norm_axis(a, r))
                            .collect::<Result<_, _>>()?,
                    };
                    if p.len() != 2 * axes.len() {
                        return Err(format!(
                            "pad: {} pads for {} axes, expected two per axis",
                            p.len(),
                            axes.len()
                        ));
                    }
                    let mut out = s.clone();
                    for (j, &a) in axes.iter().enumerate() {
                        let total = p[j] + p[j + axes.len()];
                        out[a] = match (s[a].as_fixed(), total) {
                            (_, 0) => s[a].clone(),
                            (Some(d), t) => {
                                let n = d as i64 + t;
                                if n < 0 {
                                    return Err(format!(
                                        "pad: pads {p:?} crop axis {a} of size {d} below 0"
                                    ));
                                }
                                Dim::fixed(n as usize)
                            }
                            (None, t) if t > 0 => dim_add(&s[a], &Dim::fixed(t as usize))
                                .unwrap_or_else(|| ctx.fresh()),
                            _ => ctx.fresh(),
                        };
                    }
                    Some(out)
                }
                (Some(s), _, _) => Some(s.iter().map(|_| ctx.fresh()).collect()),
                (None, _, _) => None,
            };
            one(dtype(0), s)
        }
        Op::Tile => {
            let reps = vals[1].and_then(|v| v.as_ints());
            let s = match (&ins[0].shape, reps) {
                (Some(s), Some(r)) => {
                    if r.len() != s.len() || r.iter().any(|&k| k < 0) {
                        return Err(format!(
                            "tile: repeats {r:?} for rank {}, expected one count >= 0 per axis",
                            s.len()
                        ));
                    }
                    Some(
                        s.iter()
                            .zip(&r)
                            .map(|(d, &k)| match dim_mul(d, &Dim::fixed(k as usize)) {
                                Some(d) => d,
                                None => ctx.fresh(),
                            })
                            .collect(),
                    )
                }
                (Some(s), None) => Some(s.iter().map(|_| ctx.fresh()).collect()),
                (None, _) => None,
            };
            one(dtype(0), s)
        }
        Op::ConstantOfShape { value } => {
            let s = shape_operand(&ins[0], vals[0])?.map(|v| {
                v.into_iter()
                    .map(|d| d.unwrap_or_else(|| ctx.fresh()))
                    .collect()
            });
            one(value.dtype(), s)
        }
        Op::Range => {
            let n = match (vals[0], vals[1], vals[2]) {
                (Some(a), Some(b), Some(c)) => match (a.as_ints(), b.as_ints(), c.as_ints()) {
                    (Some(a), Some(b), Some(c))
                        if a.len() == 1 && b.len() == 1 && c.len() == 1 && c[0] != 0 =>
                    {
                        let n =
                            ((b[0] as f64 - a[0] as f64) / c[0] as f64).ceil().max(0.0) as usize;
                        Some(Dim::fixed(n))
                    }
                    // `arange(n)` of a dim: the TorchScript exports' position grids.
                    _ => match (&a.data[..], &b.data[..], &c.data[..]) {
                        ([SymInt::Int(0)], [SymInt::Dim(d)], [SymInt::Int(1)]) => Some(d.clone()),
                        _ => None,
                    },
                },
                _ => None,
            };
            one(dtype(0), Some(vec![n.unwrap_or_else(|| ctx.fresh())]))
        }
        Op::CumSum { .. } => one(dtype(0), ins[0].shape.clone()),
        Op::Flatten { axis } => {
            let s = match &ins[0].shape {
                None => None,
                Some(s) => {
                    let r = s.len() as i64;
                    let a = if *axis < 0 { axis + r } else { *axis };
                    if a < 0 || a > r {
                        return Err(format!("flatten axis {axis} for rank {r}"));
                    }
                    let a = a as usize;
                    Some(vec![product(&s[..a])?, product(&s[a..])?])
                }
            };
            one(dtype(0), s)
        }
        Op::Einsum { equation } => {
            let shapes: Option<Vec<&Shape>> = ins.iter().map(|t| t.shape.as_ref()).collect();
            let s = match shapes {
                None => None,
                Some(ss) => {
                    let ranks: Vec<usize> = ss.iter().map(|s| s.len()).collect();
                    let plan = ir::einsum_plan(equation, &ranks)?;
                    // Each output label's dim: one that is not a broadcast 1, where known.
                    let dim_of = |l: usize| {
                        let dims = plan.operands.iter().zip(&ss).flat_map(|(ax, s)| {
                            ax.iter()
                                .zip(s.iter())
                                .filter(move |(&a, _)| a == l)
                                .map(|(_, d)| d)
                        });
                        let mut best = None;
                        for d in dims {
                            if d.as_fixed() != Some(1) {
                                return Some(d.clone());
                            }
                            best = Some(d.clone());
                        }
                        best
                    };
                    let mut out = Vec::new();
                    for &l in &plan.output {
                        out.push(dim_of(l).unwrap_or_else(|| ctx.fresh()));
                    }
                    Some(out)
                }
            };
            one(dtype(0), s)
        }
        Op::ArgReduce { axis, keepdims, .. } => {
            let s = match &ins[0].shape {
                None => None,
                Some(s) => {
                    let a = norm_axis(*axis, s.len())?;
                    let mut o = s.clone();
                    if *keepdims {
                        o[a] = Dim::fixed(1);
                    } else {
                        o.remove(a);
                    }
                    Some(o)
                }
            };
            one(DType::I64, s)
        }
        Op::Reduce { axes, keepdims, .. } => {
            // Axes given as an input: known when that input is a constant by now.
            let axes = match ins.get(1) {
                None => Some(axes.clone()),
                Some(_) => vals[1].and_then(|v| v.as_ints()),
            };
            let s = match (&ins[0].shape, axes) {
                (None, _) => None,
                // Unknown axes: the rank stays with keepdims, each dim may become 1.
                (Some(s), None) if *keepdims => Some(s.iter().map(|_| ctx.fresh()).collect()),
                (Some(_), None) => None,
                (Some(s), Some(axes)) => {
                    let ax: Vec<usize> = if axes.is_empty() {
                        (0..s.len()).collect()
                    } else {
                        axes.iter()
                            .map(|&a| norm_axis(a, s.len()))
                            .collect::<Result<_, _>>()?
                    };
                    Some(
                        s.iter()
                            .enumerate()
                            .filter_map(|(i, d)| {
                                if !ax.contains(&i) {
                                    Some(d.clone())
                                } else if *keepdims {
                                    Some(Dim::fixed(1))
                                } else {
                                    None
                                }
                            })
                            .collect(),
                    )
                }
            };
            one(dtype(0), s)
        }
        Op::MatMul => one(
            dtype(0),
            shapes.map(|s| matmul_shape(ctx, s[0], s[1])).transpose()?,
        ),
        Op::QMatMul => one(
            DType::F32,
            shapes.map(|s| matmul_shape(ctx, s[0], s[3])).transpose()?,
        ),
        Op::FusedLinear { .. } | Op::QLinear { .. } => {
            let s = match shapes {
                None => None,
                Some(ss) => {
                    if ss[1].len() != 2 || ss[0].is_empty() {
                        return Err(format!(
                            "{}: weight must be 2-D and x at least 1-D",
                            op.name()
                        ));
                    }
                    check_inner(&ss[0][ss[0].len() - 1], &ss[1][0], op.name())?;
                    let mut out = ss[0].clone();
                    *out.last_mut().expect("rank >= 1") = ss[1][1].clone();
                    Some(out)
                }
            };
            let epilogue: &[EpilogueStep] = match op {
                Op::FusedLinear { epilogue } | Op::QLinear { epilogue, .. } => epilogue,
                _ => &[],
            };
            let dtypes = EpilogueStep::output_dtypes(epilogue);
            // The last axis of each output, when the epilogue gives them other widths than n.
            let widths = match s.as_ref().and_then(|s| s.last()?.as_fixed()) {
                Some(n) => Some(EpilogueStep::output_widths(epilogue, n).ok_or_else(|| {
                    format!("{}: {n} columns do not suit its epilogue", op.name())
                })?),
                None => None,
            };
            let mut outs = Vec::new();
            for (i, d) in dtypes.into_iter().enumerate() {
                let mut shape = s.clone();
                if let (Some(sh), Some(w)) = (shape.as_mut(), widths.as_ref()) {
                    *sh.last_mut().expect("rank >= 1") = Dim::fixed(w[i]);
                } else if let (Some(sh), Some(EpilogueStep::ForkU8Rows { .. }), 2..) =
                    (shape.as_mut(), epilogue.last(), i)
                {
                    // Each row's scale and zero point, whatever n is.
                    *sh.last_mut().expect("rank >= 1") = Dim::fixed(1);
                }
                outs.extend(one(d, shape));
            }
            outs
        }
        Op::MatMulInteger => one(
            DType::I32,
            shapes.map(|s| matmul_shape(ctx, s[0], s[1])).transpose()?,
        ),
        Op::Gemm {
            trans_a, trans_b, ..
        } => {
            let s = match shapes {
                None => None,
                Some(ss) => {
                    if ss[0].len() != 2 || ss[1].len() != 2 {
                        return Err("gemm operands must be 2-D".into());
                    }
                    let (m, k1) = if *trans_a {
                        (&ss[0][1], &ss[0][0])
                    } else {
                        (&ss[0][0], &ss[0][1])
                    };
                    let (k2, n) = if *trans_b {
                        (&ss[1][1], &ss[1][0])
                    } else {
                        (&ss[1][0], &ss[1][1])
                    };
                    check_inner(k1, k2, "gemm")?;
                    Some(vec![m.clone(), n.clone()])
                }
            };
            one(dtype(0), s)
        }
        Op::Linear => {
            let s = match shapes {
                None => None,
                Some(ss) => {
                    if ss[1].len() != 2 || ss[0].is_empty() {
                        return Err("linear: weight must be 2-D and x at least 1-D".into());
                    }
                    check_inner(&ss[0][ss[0].len() - 1], &ss[1][0], "linear")?;
                    if let Some(b) = ss.get(2) {
                        if b.len() != 1 {
                            return Err("linear: bias must be 1-D".into());
                        }
                        check_inner(&b[0], &ss[1][1], "linear bias")?;
                    }
                    let mut out = ss[0].clone();
                    *out.last_mut().expect("rank >= 1") = ss[1][1].clone();
                    Some(out)
                }
            };
            one(dtype(0), s)
        }
        Op::Softmax { .. } | Op::LayerNorm { .. } | Op::Gelu { .. } => {
            one(dtype(0), ins[0].shape.clone())
        }
        Op::QuantizeLinear { to, .. } => one(*to, ins[0].shape.clone()),
        Op::DequantizeLinear { .. } => one(DType::F32, ins[0].shape.clone()),
        Op::DynamicQuantizeLinear => vec![
            TensorType {
                dtype: DType::U8,
                shape: ins[0].shape.clone(),
            },
            TensorType::new(DType::F32, vec![]),
            TensorType::new(DType::U8, vec![]),
        ],
        Op::PackRows | Op::UnpackRows => {
            let s = match &shapes {
                None => None,
                Some(ss) => {
                    let name = op.name();
                    if ss[0].len() < 2 || ss[1].len() != 2 {
                        return Err(format!(
                            "{name}: x must have rank 2 or more and the mask rank 2"
                        ));
                    }
                    let lead = if *op == Op::PackRows {
                        vec![Dim::fixed(1), Dim::sym(ir::PACKED_TOKENS)]
                    } else {
                        ss[1].to_vec()
                    };
                    Some(lead.into_iter().chain(ss[0][2..].iter().cloned()).collect())
                }
            };
            one(dtype(0), s)
        }
        Op::AttentionQkv { num_heads, .. } | Op::AttentionPacked { num_heads, .. }
            if dtype(0) == DType::U8 =>
        {
            let out = if attention_out_u8(op) {
                DType::U8
            } else {
                dtype(2)
            };
            // q and k quantized by a `quant_heads` epilogue: the output is v's type.
            if ins.len() < 3 {
                return Err(format!(
                    "{}: u8 q and k need their scales and v beside them",
                    op.name()
                ));
            }
            let s = shapes.map(|ss| ss[2].to_vec());
            if let Some(s) = &s {
                let h = s.last().and_then(|d| d.as_fixed());
                if s.len() != 3 || *num_heads == 0 || h.is_some_and(|h| h % num_heads != 0) {
                    return Err(format!(
                        "{}: v must be [B, S, H] in whole heads of {num_heads}",
                        op.name()
                    ));
                }
            }
            one(out, s)
        }
        Op::AttentionQkv { num_heads, .. } | Op::AttentionPacked { num_heads, .. } => {
            let out = if attention_out_u8(op) {
                DType::U8
            } else {
                dtype(0)
            };
            let s = match &shapes {
                None => None,
                Some(ss) => {
                    if ss[0].len() != 3 {
                        return Err(format!("{}: qkv must be [B, S, 3H]", op.name()));
                    }
                    let w = ss[0][2]
                        .as_fixed()
                        .ok_or("attention_qkv: qkv width must be known")?;
                    let h = w / 3;
                    if w % 3 != 0 || *num_heads == 0 || h % num_heads != 0 {
                        return Err(format!(
                            "attention_qkv: width {w} is not 3 × a multiple of {num_heads} heads"
                        ));
                    }
                    Some(vec![ss[0][0].clone(), ss[0][1].clone(), Dim::fixed(h)])
                }
            };
            one(out, s)
        }
        Op::Attention { num_heads, .. } => {
            if let Some(ss) = &shapes {
                for s in ss.iter().take(3) {
                    if s.len() != 3 {
                        return Err("attention: q, k, v must be [B, S, H]".into());
                    }
                }
                if let Some(h) = ss[0][2].as_fixed() {
                    if *num_heads == 0 || h % num_heads != 0 {
                        return Err(format!(
                            "attention: hidden {h} is not a multiple of {num_heads} heads"
                        ));
                    }
                }
                check_inner(&ss[0][2], &ss[1][2], "attention q/k")?;
            }
            one(dtype(0), ins[0].shape.clone())
        }
    };
    // Only the types of shape arithmetic carry symbolic values (see `sym::tracked`).
    let value = value.filter(|_| types.first().is_some_and(|t| crate::sym::tracked(t.dtype)));
    Ok((types, value))
}

/// `[start, end)` of `Shape`, clamped as ONNX does.
fn shape_range(start: i64, end: Option<i64>, rank: usize) -> (usize, usize) {
    let r = rank as i64;
    let fix = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    let a = fix(start);
    let b = fix(end.unwrap_or(r));
    (a, b.max(a))
}

/// The dims a 1-D shape operand stands for: `None` elements are unknown; the whole is `None`
/// when not even the length is known.
fn shape_operand(
    ty: &TensorType,
    val: Option<&SymTensor>,
) -> Result<Option<Vec<Option<Dim>>>, String> {
    if let Some(v) = val {
        if v.shape.len() != 1 {
            return Err(format!("shape operand must be 1-D, got {:?}", v.shape));
        }
        return Ok(Some(v.data.iter().map(|x| x.as_dim()).collect()));
    }
    match ty.shape.as_deref() {
        Some([n]) => Ok(n.as_fixed().map(|n| vec![None; n])),
        Some(s) => Err(format!("shape operand must be 1-D, got rank {}", s.len())),
        None => Ok(None),
    }
}

fn reshape_shape(
    ctx: &mut Ctx,
    x: &TensorType,
    target_ty: &TensorType,
    target: Option<&SymTensor>,
    allowzero: bool,
) -> Result<Option<Shape>, String> {
    let Some(t) = target else {
        return Ok(match target_ty.shape.as_deref() {
            Some([n]) => n.as_fixed().map(|n| (0..n).map(|_| ctx.fresh()).collect()),
            _ => None,
        });
    };
    if t.shape.len() != 1 {
        return Err(format!(
            "reshape target must be 1-D, got shape {:?}",
            t.shape
        ));
    }
    let mut out: Vec<Option<Dim>> = Vec::with_capacity(t.data.len());
    let mut infer_at = None;
    for (i, e) in t.data.iter().enumerate() {
        match e {
            SymInt::Int(-1) => {
                if infer_at.replace(i).is_some() {
                    return Err("reshape target has two -1".into());
                }
                out.push(None);
            }
            SymInt::Int(0) if !allowzero => match &x.shape {
                Some(s) if i < s.len() => out.push(Some(s[i].clone())),
                Some(s) => {
                    return Err(format!(
                        "reshape target copies dim {i} of a rank-{} input",
                        s.len()
                    ))
                }
                None => out.push(None),
            },
            SymInt::Int(n) if *n < -1 => return Err(format!("reshape target has {n}")),
            other => out.push(other.as_dim()),
        }
    }
    if let (Some(i), Some(s)) = (infer_at, &x.shape) {
        let known: Option<Vec<Dim>> = out
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, d)| d.clone())
            .collect();
        if let Some(known) = known {
            let total = product(s)?;
            let rest = product(&known)?;
            match total.div(&rest) {
                Some(d) => out[i] = Some(d),
                None => {
                    if let (Some(a), Some(b)) = (total.as_fixed(), rest.as_fixed()) {
                        return Err(format!(
                            "cannot reshape {a} elements into a multiple of {b}"
                        ));
                    }
                }
            }
        }
    }
    if let (Some(s), true) = (&x.shape, infer_at.is_none()) {
        let all: Option<Vec<Dim>> = out.iter().cloned().collect();
        if let (Some(all), Some(a)) = (all, product(s)?.as_fixed()) {
            if let Some(b) = product(&all)?.as_fixed() {
                if a != b {
                    return Err(format!("cannot reshape {a} elements into {b}"));
                }
            }
        }
    }
    Ok(Some(
        out.into_iter()
            .map(|d| d.unwrap_or_else(|| ctx.fresh()))
            .collect(),
    ))
}

/// A huge slice end: "to the end of the axis".
const TO_END: i64 = i64::MAX / 4;

fn slice_shape(
    ctx: &mut Ctx,
    ins: &[TensorType],
    vals: &[Option<&SymTensor>],
) -> Result<Option<Shape>, String> {
    let Some(data) = &ins[0].shape else {
        return Ok(None);
    };
    let r = data.len();
    let k = match ins[1].shape.as_deref() {
        Some([n]) => match n.as_fixed() {
            Some(k) => k,
            None => return Ok(Some((0..r).map(|_| ctx.fresh()).collect())),
        },
        _ => return Err("slice starts must be 1-D".into()),
    };
    let axes: Vec<Option<usize>> = match vals.get(3) {
        Some(Some(v)) => v
            .data
            .iter()
            .map(|a| a.as_int().map(|a| norm_axis(a, r)).transpose())
            .collect::<Result<_, _>>()?,
        Some(None) => vec![None; k],
        // Without axes, start j is on axis j: more starts than axes is malformed.
        None if k > r => {
            return Err(format!(
                "{k} slice starts without axes for an input of rank {r}"
            ))
        }
        None => (0..k).map(Some).collect(),
    };
    let get = |i: usize, j: usize| -> Option<SymInt> {
        vals.get(i)
            .and_then(|v| *v)
            .and_then(|v| v.data.get(j).cloned())
    };
    let mut out = data.clone();
    for (j, axis) in axes.iter().enumerate() {
        let Some(a) = *axis else {
            return Ok(Some((0..r).map(|_| ctx.fresh()).collect()));
        };
        let step = if ins.len() > 4 {
            get(4, j)
        } else {
            Some(SymInt::Int(1))
        };
        out[a] = match (data[a].as_fixed(), get(1, j), get(2, j), step) {
            (Some(n), Some(SymInt::Int(s)), Some(SymInt::Int(e)), Some(SymInt::Int(st))) => {
                Dim::fixed(slice_len(n as i64, s, e, st)?)
            }
            // Assumed within the axis: see the module documentation.
            (Some(_), Some(SymInt::Int(0)), Some(SymInt::Dim(e)), Some(SymInt::Int(1))) => e,
            (None, Some(SymInt::Int(0)), Some(SymInt::Int(e)), Some(SymInt::Int(1)))
                if e >= TO_END =>
            {
                data[a].clone()
            }
            (None, Some(SymInt::Int(0)), Some(SymInt::Dim(e)), Some(SymInt::Int(1)))
                if e == data[a] =>
            {
                data[a].clone()
            }
            _ => ctx.fresh(),
        };
    }
    Ok(Some(out))
}

/// The ONNX slice length on an axis of size `n`.
pub(crate) fn slice_len(n: i64, start: i64, end: i64, step: i64) -> Result<usize, String> {
    if step == 0 {
        return Err("slice step 0".into());
    }
    // In i128 so that extreme starts, ends and steps cannot overflow; `min`/`max` rather than
    // `clamp`, which panics on an empty axis.
    let (n, start, end, step) = (n as i128, start as i128, end as i128, step as i128);
    let fix = |v: i128| if v < 0 { v + n } else { v };
    let len = if step > 0 {
        let (s, e) = (fix(start).max(0).min(n), fix(end).max(0).min(n));
        (e - s + step - 1).div_euclid(step)
    } else {
        let (s, e) = (fix(start).max(0).min(n - 1), fix(end).max(-1).min(n - 1));
        (s - e - step - 1).div_euclid(-step)
    };
    usize::try_from(len.max(0)).map_err(|_| "slice length overflows".to_string())
}

/// Symbolic values: what shape arithmetic computes, element by element.
/// The output types of a loop. The body is analysed on a copy whose inputs have the loop's input
/// types (the body itself is left as it is: passes do not look into a loop). A carried value
/// that the body gives back with the type it took keeps that type through every iteration, so
/// the final value has it; any other carried value has an unknown shape (it may change from one
/// iteration to the next). A scan output has the body's type of it with a new leading dim, a
/// fresh symbol: the number of iterations is known only at run time.
fn loop_types(
    ctx: &mut Ctx,
    carried: usize,
    body: &Graph,
    ins: &[TensorType],
) -> Result<Vec<TensorType>, String> {
    let parts = ir::LoopParts::of(carried, body)
        .ok_or_else(|| format!("loop: the body cannot carry {carried} values"))?;
    let mut b = body.clone();
    for (i, &id) in body.inputs().iter().enumerate().skip(2) {
        if ins.get(i).is_some_and(|t| t.shape.is_some()) {
            b.node_mut(id).outputs[0] = ins[i].clone();
        }
    }
    ctx.next = ctx.next.max(Ctx::new(&b).next);
    // A body that cannot be analysed with these types leaves the shapes unknown: the run checks
    // them, iteration by iteration.
    let analysed = analyse_in(&mut b, ctx).is_ok();
    let out = |i: usize| b.outlet_type(b.outputs()[i].1).clone();
    let mut types = Vec::with_capacity(parts.carried + parts.scans);
    for j in 0..parts.carried {
        let given = &b.node(b.inputs()[2 + j]).outputs[0];
        let kept = analysed && given.shape.is_some() && out(1 + j).shape == given.shape;
        types.push(TensorType {
            dtype: ins[2 + j].dtype,
            shape: if kept { given.shape.clone() } else { None },
        });
    }
    for k in 0..parts.scans {
        let each = out(1 + parts.carried + k);
        let shape = each
            .shape
            .filter(|_| analysed)
            .map(|s| std::iter::once(ctx.fresh()).chain(s).collect());
        types.push(TensorType {
            dtype: each.dtype,
            shape,
        });
    }
    Ok(types)
}

fn infer_value(op: &Op, ins: &[TensorType], vals: &[Option<&SymTensor>]) -> Option<SymTensor> {
    let small_int = |t: &TensorType| crate::sym::tracked(t.dtype);
    match op {
        Op::Shape { start, end } => {
            let s = ins[0].shape.as_ref()?;
            let (a, b) = shape_range(*start, *end, s.len());
            Some(SymTensor::new(
                vec![b - a],
                s[a..b].iter().map(SymInt::from_dim).collect(),
            ))
        }
        Op::Gather { axis } => {
            let d = vals[0]?;
            let idx = vals[1]?.as_ints()?;
            if d.shape.len() != 1 || norm_axis(*axis, 1).ok()? != 0 {
                return None;
            }
            let n = d.data.len() as i64;
            let data = idx
                .iter()
                .map(|&i| {
                    let i = if i < 0 { i + n } else { i };
                    (0..n).contains(&i).then(|| d.data[i as usize].clone())
                })
                .collect::<Option<Vec<_>>>()?;
            Some(SymTensor::new(vals[1]?.shape.clone(), data))
        }
        Op::Unsqueeze { .. } | Op::Squeeze { .. } | Op::Reshape { .. } | Op::Flatten { .. } => {
            // The caller gives the value the output type's shape.
            vals[0].cloned()
        }
        Op::Concat { .. } => {
            let mut data = Vec::new();
            for v in vals {
                let v = (*v)?;
                if v.shape.len() != 1 {
                    return None;
                }
                data.extend(v.data.iter().cloned());
            }
            Some(SymTensor::new(vec![data.len()], data))
        }
        Op::Cast { to } => {
            let v = vals[0]?;
            if !small_int(&ins[0]) {
                return None;
            }
            if *to == DType::Bool {
                let data = v
                    .data
                    .iter()
                    .map(|x| {
                        x.equals(&SymInt::Int(0))
                            .map(|z| SymInt::Int(i64::from(!z)))
                            .unwrap_or(SymInt::Unknown)
                    })
                    .collect();
                Some(SymTensor::new(v.shape.clone(), data))
            } else if to.is_integer() {
                Some(v.clone())
            } else {
                None
            }
        }
        Op::Binary(b) => {
            let (x, y) = (vals[0]?, vals[1]?);
            let n = x.data.len().max(y.data.len());
            if !(x.data.len() == n || x.data.len() == 1)
                || !(y.data.len() == n || y.data.len() == 1)
            {
                return None;
            }
            if x.shape.len().max(y.shape.len()) > 1 {
                return None;
            }
            let shape = if x.data.len() == n && x.shape.len() >= y.shape.len() {
                x.shape.clone()
            } else {
                y.shape.clone()
            };
            let at =
                |v: &SymTensor, i: usize| v.data[if v.data.len() == 1 { 0 } else { i }].clone();
            let bool_of =
                |r: Option<bool>| r.map_or(SymInt::Unknown, |b| SymInt::Int(i64::from(b)));
            let data = (0..n)
                .map(|i| {
                    let (p, q) = (at(x, i), at(y, i));
                    match b {
                        BinaryOp::Add => p.add(&q),
                        BinaryOp::Sub => p.sub(&q),
                        BinaryOp::Mul => p.mul(&q),
                        BinaryOp::Div => p.div(&q),
                        BinaryOp::Equal => bool_of(p.equals(&q)),
                        BinaryOp::Max
                        | BinaryOp::Min
                        | BinaryOp::Less
                        | BinaryOp::Greater
                        | BinaryOp::LessOrEqual
                        | BinaryOp::GreaterOrEqual
                        | BinaryOp::And
                        | BinaryOp::Or
                        | BinaryOp::Xor => match (p.as_int(), q.as_int()) {
                            (Some(p), Some(q)) => SymInt::Int(match b {
                                BinaryOp::Max => p.max(q),
                                BinaryOp::Min => p.min(q),
                                BinaryOp::Less => i64::from(p < q),
                                BinaryOp::Greater => i64::from(p > q),
                                BinaryOp::LessOrEqual => i64::from(p <= q),
                                BinaryOp::GreaterOrEqual => i64::from(p >= q),
                                BinaryOp::And => i64::from(p != 0 && q != 0),
                                BinaryOp::Xor => i64::from((p != 0) != (q != 0)),
                                _ => i64::from(p != 0 || q != 0),
                            }),
                            _ => SymInt::Unknown,
                        },
                        BinaryOp::Pow | BinaryOp::Mod | BinaryOp::Fmod => SymInt::Unknown,
                    }
                })
                .collect();
            Some(SymTensor::new(shape, data))
        }
        Op::Unary(UnaryOp::Neg) => {
            let v = vals[0]?;
            Some(SymTensor::new(
                v.shape.clone(),
                v.data.iter().map(|x| SymInt::Int(0).sub(x)).collect(),
            ))
        }
        Op::Unary(UnaryOp::Not) => {
            let v = vals[0]?;
            Some(SymTensor::new(
                v.shape.clone(),
                v.data
                    .iter()
                    .map(|x| {
                        x.as_int()
                            .map_or(SymInt::Unknown, |b| SymInt::Int(i64::from(b == 0)))
                    })
                    .collect(),
            ))
        }
        Op::Where => {
            let (c, a, b) = (vals[0]?, vals[1]?, vals[2]?);
            let n = c.data.len().max(a.data.len()).max(b.data.len());
            let ok = |v: &SymTensor| v.data.len() == n || v.data.len() == 1;
            if !(ok(c) && ok(a) && ok(b)) || c.shape.len().max(a.shape.len()).max(b.shape.len()) > 1
            {
                return None;
            }
            let at =
                |v: &SymTensor, i: usize| v.data[if v.data.len() == 1 { 0 } else { i }].clone();
            let data = (0..n)
                .map(|i| match at(c, i).as_int() {
                    Some(0) => at(b, i),
                    Some(_) => at(a, i),
                    None => SymInt::Unknown,
                })
                .collect();
            Some(SymTensor::new(vec![n], data))
        }
        Op::Select => match vals[0]?.data.as_slice() {
            [c] => match c.as_int()? {
                0 => vals[2].cloned(),
                _ => vals[1].cloned(),
            },
            _ => None,
        },
        Op::Slice => {
            let v = vals[0]?;
            if v.shape.len() != 1 {
                return None;
            }
            let s = vals[1]?.as_ints()?;
            let e = vals[2]?.as_ints()?;
            let step = match vals.get(4) {
                Some(v) => (*v)?.as_ints()?,
                None => vec![1],
            };
            if s.len() != 1 || e.len() != 1 || step.len() != 1 || step[0] <= 0 {
                return None;
            }
            let n = v.data.len() as i64;
            let fix = |x: i64| (if x < 0 { x + n } else { x }).clamp(0, n);
            let (a, b) = (fix(s[0]), fix(e[0]));
            let data: Vec<SymInt> = (a..b.max(a))
                .step_by(step[0] as usize)
                .map(|i| v.data[i as usize].clone())
                .collect();
            Some(SymTensor::new(vec![data.len()], data))
        }
        Op::ConstantOfShape { value } => {
            let dims = vals[0]?.as_ints()?;
            let n = dims.iter().try_fold(1i64, |a, &d| a.checked_mul(d))?;
            if dims.iter().any(|&d| d < 0)
                || n as usize > SMALL
                || !(value.dtype().is_integer() || value.dtype() == DType::Bool)
            {
                return None;
            }
            let fill = *value.to_i64_vec().ok()?.first()?;
            Some(SymTensor::new(
                dims.iter().map(|&d| d as usize).collect(),
                vec![SymInt::Int(fill); n as usize],
            ))
        }
        _ => None,
    }
}

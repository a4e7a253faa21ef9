//! The eager multi-head attention block → `Attention`.

use std::collections::BTreeSet;

use ir::{BinaryOp, DType, Dim, Graph, NodeId, Op, Outlet, Tensor, TensorType};

use crate::rewrite::{
    apply_rules, binary_inputs, derived_name, op_of, replace_with, rule_if, rule_if_some,
    scalar_const, sole_consumer,
};
use crate::{Pass, PassError};

/// Rewrites the attention block of eager exports,
///
/// ```text
/// qh = Transpose[0,2,1,3](Reshape(q, [B,S,h,dh]))          (same for v)
/// kt = Transpose[0,2,3,1](Reshape(k, [B,S,h,dh]))          (or Transpose[0,1,3,2] of kh, or
///                                                           the dynamo SDPA form of it)
/// p  = Softmax[-1](MatMul(qh, kt) / √dh + mask)
/// y  = Reshape(Transpose[0,2,1,3](MatMul(p, vh)), [B,S,H])
/// ```
///
/// to `Attention[num_heads=h, scale](q, k, v, mask)`. The scale may be a `Div` or `Mul` of the
/// scores, of `qh`, of `kt`, or split over `qh` and `kt` (SDPA exports); the scales found are
/// multiplied. The mask may be absent, additive (BERT: `(1 - mask)·-3.4e38`, passed through
/// as is; a second added bias, MPNet's relative positions, is summed with it), or a `Where(cond, fill, scores)` with `fill ≤ -1e30` (DistilBERT's `masked_fill`),
/// which becomes the additive bias `Where(cond, fill, 0)`: adding such a fill to a finite score
/// gives the fill again, so the softmax inputs are the same. A broadcasting `Expand` of `cond` to
/// the scores' shape is dropped, since `Where` broadcasts anyway.
///
/// ```
/// use passes::{Pass, RecognizeAttention, ShapeInference};
/// let mut g = ir::text::parse(
///     "%0 = input[name=\"q\"] : f32[B,S,8]\n\
///      %1 = input[name=\"k\"] : f32[B,S,8]\n\
///      %2 = input[name=\"v\"] : f32[B,S,8]\n\
///      %3 = const[value=i64[4]{0, 0, 2, 4}] : i64[4]\n\
///      %4 = reshape[allowzero=false](%0, %3) : f32[*]\n\
///      %5 = transpose[perm=[0, 2, 1, 3]](%4) : f32[*]\n\
///      %6 = reshape[allowzero=false](%1, %3) : f32[*]\n\
///      %7 = transpose[perm=[0, 2, 3, 1]](%6) : f32[*]\n\
///      %8 = reshape[allowzero=false](%2, %3) : f32[*]\n\
///      %9 = transpose[perm=[0, 2, 1, 3]](%8) : f32[*]\n\
///      %10 = matmul(%5, %7) : f32[*]\n\
///      %11 = const[value=f32[]{0.5}] : f32[]\n\
///      %12 = mul(%10, %11) : f32[*]\n\
///      %13 = softmax[axis=-1](%12) : f32[*]\n\
///      %14 = matmul(%13, %9) : f32[*]\n\
///      %15 = transpose[perm=[0, 2, 1, 3]](%14) : f32[*]\n\
///      %16 = const[value=i64[3]{0, 0, 8}] : i64[3]\n\
///      %17 = reshape[allowzero=false](%15, %16) : f32[*]\n\
///      output \"y\" = %17\n",
///     None,
/// ).unwrap();
/// ShapeInference.run(&mut g, &mut passes::PassContext::default()).unwrap();
/// assert!(RecognizeAttention.run(&mut g, &mut passes::PassContext::default()).unwrap());
/// let text = ir::text::print(&g).unwrap();
/// assert!(text.contains("attention[num_heads=2, scale=0.5](%0, %1, %2) : f32[B,S,8]"), "{text}");
/// ```
pub struct RecognizeAttention;

const PASS: &str = "RecognizeAttention";

impl Pass for RecognizeAttention {
    fn name(&self) -> &'static str {
        PASS
    }

    fn run(&self, graph: &mut Graph, _ctx: &mut crate::PassContext<'_>) -> Result<bool, PassError> {
        apply_rules(graph, PASS, &[eager_attention, mask_broadcast])
    }
}

/// Strips a scalar `Mul`/`Div` from `o`: `(input, factor)`; the factor is 1 when there is none.
fn strip_scale(g: &Graph, o: Outlet) -> (Outlet, f32) {
    if let Some((x, c)) = binary_inputs(g, o.node, BinaryOp::Div) {
        if let Some(c) = scalar_const(g, c).filter(|c| *c != 0.0) {
            return (x, 1.0 / c);
        }
    }
    if let Some((a, b)) = binary_inputs(g, o.node, BinaryOp::Mul) {
        if let Some(c) = scalar_const(g, b) {
            return (a, c);
        }
        if let Some(c) = scalar_const(g, a) {
            return (b, c);
        }
    }
    (o, 1.0)
}

fn transpose_of(g: &Graph, o: Outlet, perm: &[i64]) -> Option<Outlet> {
    match op_of(g, o) {
        Op::Transpose { perm: p } if p == perm => Some(g.node_inputs(o.node)[0]),
        _ => None,
    }
}

/// `(x, heads, head_dim)` when `o` is `Reshape(x [B,S,H]) : [B,S,h,dh]` with `h·dh = H`.
fn head_split(g: &Graph, o: Outlet) -> Option<(Outlet, usize, usize)> {
    if !matches!(op_of(g, o), Op::Reshape { .. }) {
        return None;
    }
    let x = g.node_inputs(o.node)[0];
    let (xs, os) = (
        g.outlet_type(x).shape.as_ref()?,
        g.outlet_type(o).shape.as_ref()?,
    );
    let (h, dh, hidden) = (
        os.get(2)?.as_fixed()?,
        os.get(3)?.as_fixed()?,
        xs.get(2)?.as_fixed()?,
    );
    (xs.len() == 3 && os.len() == 4 && xs[..2] == os[..2] && h * dh == hidden).then_some((x, h, dh))
}

/// The key side: `kt` as `[B,h,dh,S]`, and the scale found on the way.
fn key_side(g: &Graph, kt: Outlet) -> Option<(Outlet, usize, usize, f32)> {
    let (t, f1) = strip_scale(g, kt);
    if let Some(r) = transpose_of(g, t, &[0, 2, 3, 1]) {
        let (k, h, dh) = head_split(g, r)?;
        return Some((k, h, dh, f1));
    }
    let kh = transpose_of(g, t, &[0, 1, 3, 2]).or_else(|| folded_key_transpose(g, t))?;
    let (t2, f2) = strip_scale(g, kh);
    let (k, h, dh) = head_split(g, transpose_of(g, t2, &[0, 2, 1, 3])?)?;
    Some((k, h, dh, f1 * f2))
}

/// `kh` `[B,h,S,dh]` when `o` is `Reshape(Transpose[0,2,1](Reshape(kh, [B·h,S,dh])), [B,h,dh,S])`:
/// the dynamo exporter's SDPA spelling of `Transpose[0,1,3,2](kh)`. Each reshape keeps the two
/// trailing dims (so it only merges or splits the leading ones, in row-major order), which the
/// shapes prove.
fn folded_key_transpose(g: &Graph, o: Outlet) -> Option<Outlet> {
    if !matches!(op_of(g, o), Op::Reshape { .. }) {
        return None;
    }
    let t = g.node_inputs(o.node)[0];
    let merged = transpose_of(g, t, &[0, 2, 1])?;
    if !matches!(op_of(g, merged), Op::Reshape { .. }) {
        return None;
    }
    let kh = g.node_inputs(merged.node)[0];
    let (khs, ms, os) = (
        g.outlet_type(kh).shape.as_ref()?,
        g.outlet_type(merged).shape.as_ref()?,
        g.outlet_type(o).shape.as_ref()?,
    );
    let fits = khs.len() == 4
        && ms.len() == 3
        && os.len() == 4
        && ms[1..] == khs[2..]
        && os[..2] == khs[..2]
        && os[2] == khs[3]
        && os[3] == khs[2];
    fits.then_some(kh)
}

/// The query or value side: `Transpose[0,2,1,3](Reshape(x))`, with an optional scale.
fn head_side(g: &Graph, o: Outlet) -> Option<(Outlet, usize, usize, f32)> {
    let (t, f) = strip_scale(g, o);
    let (x, h, dh) = head_split(g, transpose_of(g, t, &[0, 2, 1, 3])?)?;
    Some((x, h, dh, f))
}

enum Mask {
    None,
    /// Biases added to the scores, first added first.
    Additive(Vec<Outlet>),
    /// `Where(cond, fill, ·)`: the condition and the fill constant.
    Fill(Outlet, Outlet),
}

/// Splits the softmax input into `(q·kᵀ product, mask, scale)`.
fn scores(g: &Graph, s: Outlet) -> Option<(Outlet, Mask, f32)> {
    let is_product = |o: Outlet| matches!(op_of(g, strip_scale(g, o).0), Op::MatMul);
    let (rest, mask) = if matches!(op_of(g, s), Op::Where) {
        let ins = g.node_inputs(s.node);
        let fill = scalar_const(g, ins[1])?;
        if fill > -1e30 {
            return None;
        }
        (ins[2], Mask::Fill(ins[0], ins[1]))
    } else if matches!(op_of(g, s), Op::Binary(BinaryOp::Add)) {
        // A chain of additions onto the product: the mask, and at most one more bias (MPNet's
        // relative positions), in the order the scores receive them.
        let mut terms = Vec::new();
        let mut cur = s;
        while !is_product(cur) {
            let (a, b) = binary_inputs(g, cur.node, BinaryOp::Add)?;
            let towards =
                |o: Outlet| is_product(o) || matches!(op_of(g, o), Op::Binary(BinaryOp::Add));
            let (next, term) = if towards(a) {
                (a, b)
            } else if towards(b) {
                (b, a)
            } else {
                return None;
            };
            terms.push(term);
            cur = next;
            if terms.len() > 2 {
                return None;
            }
        }
        terms.reverse();
        (cur, Mask::Additive(terms))
    } else {
        (s, Mask::None)
    };
    let (qk, f) = strip_scale(g, rest);
    matches!(op_of(g, qk), Op::MatMul).then_some((qk, mask, f))
}

/// Anchored on the `Softmax`.
fn eager_attention(g: &mut Graph, id: NodeId) -> Result<bool, String> {
    rule_if_some!(Op::Softmax { axis } = g.node(id).op.clone());
    let s = g.node_inputs(id)[0];
    rule_if!(g.outlet_type(s).dtype == DType::F32);
    rule_if!(axis == -1 || (axis == 3 && g.outlet_type(s).rank() == Some(4)));
    rule_if_some!(Some((qk, mask, f_scores)) = scores(g, s));
    let qk_ins = g.node_inputs(qk.node);
    rule_if_some!(Some((q, h, dh, f_q)) = head_side(g, qk_ins[0]));
    rule_if_some!(Some((k, hk, dhk, f_k)) = key_side(g, qk_ins[1]));
    rule_if_some!(Some(pv) = sole_consumer(g, id.into()));
    rule_if!(g.node(pv).op == Op::MatMul);
    let pv_ins = g.node_inputs(pv);
    rule_if!(pv_ins[0] == Outlet::from(id));
    rule_if_some!(Some((v, hv, dhv, f_v)) = head_side(g, pv_ins[1]));
    rule_if!(f_v == 1.0 && (h, dh) == (hk, dhk) && (h, dh) == (hv, dhv));
    rule_if_some!(Some(merge_t) = sole_consumer(g, pv.into()));
    rule_if!(transpose_of(g, merge_t.into(), &[0, 2, 1, 3]) == Some(pv.into()));
    rule_if_some!(Some(merge_r) = sole_consumer(g, merge_t.into()));
    rule_if!(matches!(g.node(merge_r).op, Op::Reshape { .. }));
    let ty = g.node(merge_r).outputs[0].clone();
    rule_if!(ty.shape.is_some() && ty.shape == g.outlet_type(q).shape);
    let mask = match mask {
        Mask::None => None,
        Mask::Additive(terms) => {
            for &m in &terms {
                let mt = g.outlet_type(m);
                rule_if!(mt.dtype == DType::F32 && mt.rank().is_some_and(|r| r <= 4));
            }
            let mut bias = terms[0];
            for (i, &term) in terms.iter().enumerate().skip(1) {
                // (scores + b0) + b1 becomes scores + (b0 + b1): equal up to one rounding of
                // the biases' sum, and exactly for a 0 / -big padding mask.
                let name = derived_name(&g.node(merge_r).name, &format!("AttentionBias{i}"));
                let ty = broadcast_type(g, bias, term);
                rule_if!(ty.is_some());
                bias = g
                    .add_node(
                        Op::Binary(BinaryOp::Add),
                        &name,
                        &[bias, term],
                        vec![ty.unwrap()],
                    )
                    .map_err(|e| e.to_string())?
                    .into();
            }
            Some(bias)
        }
        Mask::Fill(cond, fill) => {
            let cond = strip_broadcast(g, cond, g.outlet_type(s).clone());
            let ct = g.outlet_type(cond).clone();
            rule_if!(ct.dtype == DType::Bool && ct.rank().is_some_and(|r| r <= 4));
            let name = derived_name(&g.node(merge_r).name, "AttentionMaskBias");
            let zero = g.add_const(&format!("{name}/zero"), Tensor::scalar(0.0f32));
            let bias_ty = TensorType {
                dtype: DType::F32,
                shape: ct.shape,
            };
            let bias = g
                .add_node(Op::Where, &name, &[cond, fill, zero], vec![bias_ty])
                .map_err(|e| e.to_string())?;
            Some(bias.into())
        }
    };
    let scale = f_scores * f_q * f_k;
    let mut inputs = vec![q, k, v];
    inputs.extend(mask);
    let name = derived_name(&g.node(merge_r).name, "Attention");
    replace_with(
        g,
        merge_r.into(),
        Op::Attention {
            num_heads: h,
            scale,
            products: ir::AttnProducts::F32,
        },
        &name,
        &inputs,
        ty,
    )?;
    Ok(true)
}

/// Anchored on an `Attention` with a mask: drops every `Expand` that feeds the mask's
/// elementwise expression (`Where`, `Cast`, unary and binary ops) when the expansion only
/// broadcasts to a shape the scores `[B, h, S, S]` broadcast over, and the expression feeds
/// nothing but attention masks. Elementwise ops commute with broadcasting and the attention
/// broadcasts its mask itself, so the scores are unchanged. The dynamo exporter expands the
/// `[B, 1, 1, S]` mask to `[B, 1, S, S]` with a shape read from `input_ids`; without the
/// expansion the bias is one value per key, computed from the mask alone, which padding-free
/// attention needs.
fn mask_broadcast(g: &mut Graph, id: NodeId) -> Result<bool, String> {
    rule_if_some!(Op::Attention { num_heads, .. } = g.node(id).op.clone());
    let ins = g.node_inputs(id);
    rule_if_some!(Some(&mask) = ins.get(3));
    rule_if_some!(Some(q) = g.outlet_type(ins[0]).shape.clone());
    rule_if_some!(Some(k) = g.outlet_type(ins[1]).shape.clone());
    rule_if!(q.len() == 3 && k.len() == 3);
    let scores = [
        q[0].clone(),
        Dim::fixed(num_heads),
        q[1].clone(),
        k[1].clone(),
    ];
    let elementwise = |op: &Op| {
        matches!(
            op,
            Op::Where | Op::Cast { .. } | Op::Unary(_) | Op::Binary(_)
        )
    };
    // The expression: elementwise nodes reached upwards from the mask.
    let mut tree = BTreeSet::new();
    let mut expands = BTreeSet::new();
    let mut stack = vec![mask.node];
    while let Some(n) = stack.pop() {
        let op = &g.node(n).op;
        if matches!(op, Op::Expand) {
            expands.insert(n);
        } else if elementwise(op) && tree.insert(n) {
            stack.extend(g.node_inputs(n).iter().map(|o| o.node));
        }
    }
    rule_if!(!expands.is_empty());
    // Every value of the expression (and every expansion) is read only inside it or as an
    // attention's mask, never as a graph output: changing its shape changes nothing else.
    let private = tree.iter().chain(&expands).all(|&n| {
        let out = Outlet::from(n);
        !g.is_graph_output(out)
            && g.consumers(out).iter().all(|&(c, slot)| {
                tree.contains(&c) || (slot == 3 && matches!(g.node(c).op, Op::Attention { .. }))
            })
    });
    rule_if!(private);
    let broadcasts_into_scores = |e: NodeId| {
        g.node(e).outputs[0].shape.as_ref().is_some_and(|s| {
            s.len() <= 4
                && s.iter()
                    .rev()
                    .zip(scores.iter().rev())
                    .all(|(d, t)| d.as_fixed() == Some(1) || d == t)
        })
    };
    let dropped: Vec<NodeId> = expands
        .into_iter()
        .filter(|&e| broadcasts_into_scores(e))
        .collect();
    rule_if!(!dropped.is_empty());
    for e in dropped {
        let x = g.node_inputs(e)[0];
        g.replace_uses(e.into(), x).map_err(|e| e.to_string())?;
    }
    // The expression's values are narrower now: retype them before any other rule looks.
    crate::shape_infer::analyse(g).map_err(|e| e.to_string())?;
    Ok(true)
}

/// The f32 type of `a + b` when both shapes are known and broadcast dim by dim.
fn broadcast_type(g: &Graph, a: Outlet, b: Outlet) -> Option<TensorType> {
    let (sa, sb) = (
        g.outlet_type(a).shape.as_ref()?,
        g.outlet_type(b).shape.as_ref()?,
    );
    let rank = sa.len().max(sb.len());
    let one = Dim::fixed(1);
    let dim = |s: &[Dim], i: usize| {
        if i + s.len() >= rank {
            s[i + s.len() - rank].clone()
        } else {
            one.clone()
        }
    };
    let shape = (0..rank)
        .map(|i| {
            let (x, y) = (dim(sa, i), dim(sb, i));
            if x == y || y == one {
                Some(x)
            } else if x == one {
                Some(y)
            } else {
                None
            }
        })
        .collect::<Option<Vec<Dim>>>()?;
    Some(TensorType {
        dtype: DType::F32,
        shape: Some(shape),
    })
}

/// Drops a `Cast` to bool of a bool and an `Expand` to exactly the scores' type from a mask
/// condition: `Where` broadcasts it the same way.
fn strip_broadcast(g: &Graph, mut cond: Outlet, scores: TensorType) -> Outlet {
    if let Op::Cast { to: DType::Bool } = op_of(g, cond) {
        let x = g.node_inputs(cond.node)[0];
        if g.outlet_type(x).dtype == DType::Bool {
            cond = x;
        }
    }
    if matches!(op_of(g, cond), Op::Expand)
        && g.outlet_type(cond).shape == scores.shape
        && scores.shape.is_some()
    {
        cond = g.node_inputs(cond.node)[0];
    }
    cond
}

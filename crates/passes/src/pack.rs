//! The `pack` pipeline: padding-free execution decided on the graph.
//!
//! [`PackTokens`] finds the token-wise part of an encoder (every op that computes each token's
//! row from that row alone: embedding lookups by the token's id, linears and their epilogues,
//! LayerNorm, elementwise ops with per-feature or per-position operands, per-token activation
//! quantization) around its attention ops, and runs it on the real tokens only: `pack_rows(x,
//! mask)` turns a `[B, S, …]` value entering the region (token ids included) into `[1, T, …]`
//! (`T` = [`ir::PACKED_TOKENS`], the real tokens of the batch), and a `[1, S, …]` one (position
//! embeddings) into the rows of the tokens' positions,
//! `attention_qkv` becomes `attention_packed`, which attends within each sequence's rows, and
//! `unpack_rows` lays every value leaving the region back into `[B, S, …]` with zeros at the
//! padding. Each real token's result is the padded program's: a row never depends on the
//! other rows (per-token quantization, row-wise epilogues), and the padded keys that packed
//! attention leaves out are those the mask bias hides.

use std::collections::{BTreeSet, HashMap};

use ir::{ActQuant, Dim, Graph, NodeId, Op, Outlet, TensorType};

use crate::{Pass, PassContext, PassError};

const PACK: &str = "PackTokens";

/// Runs the token-wise region of an encoder on the real tokens only (see the module docs).
/// Declines, saying why in the report, when the attention mask is not one `[B, S]` graph input
/// or when the attention ops disagree on it.
pub struct PackTokens;

impl Pass for PackTokens {
    fn name(&self) -> &'static str {
        PACK
    }

    fn run(&self, graph: &mut Graph, ctx: &mut PassContext<'_>) -> Result<bool, PassError> {
        let err = |message: String| PassError::Node {
            pass: PACK,
            node: "(graph)".into(),
            message,
        };
        let order = graph.topo_order().map_err(|e| err(e.to_string()))?;
        if order
            .iter()
            .any(|&id| matches!(graph.node(id).op, Op::PackRows | Op::AttentionPacked { .. }))
        {
            return Ok(false);
        }
        let attentions: Vec<NodeId> = order
            .iter()
            .copied()
            .filter(|&id| matches!(graph.node(id).op, Op::AttentionQkv { .. }))
            .collect();
        if attentions.is_empty() {
            return Ok(false);
        }
        let mut mask: Option<Outlet> = None;
        for &a in &attentions {
            let name = graph.node(a).name.clone();
            match mask_input(graph, a) {
                Ok(m) if mask.is_none_or(|x| x == m) => mask = Some(m),
                Ok(_) => {
                    ctx.report.declined(
                        PACK,
                        &name,
                        "the attention ops read different masks: the batch stays padded",
                    );
                    return Ok(false);
                }
                Err(why) => {
                    ctx.report
                        .declined(PACK, &name, format!("{why}: the batch stays padded"));
                    return Ok(false);
                }
            }
        }
        let mask = mask.expect("at least one attention");
        let lead = graph
            .outlet_type(mask)
            .shape
            .clone()
            .expect("checked by mask_input");
        let region = token_wise_region(graph, &order, &attentions, &lead);
        if let Some((node, op)) = rows_mixed_downstream(graph, &region) {
            ctx.report.declined(
                PACK,
                &node,
                format!(
                    "`{op}` after the token-wise layers may combine tokens, so the padded rows \
                     (zeros once packed) would change its result: the batch stays padded"
                ),
            );
            return Ok(false);
        }
        let first = graph.node(attentions[0]).name.clone();
        rewrite(graph, &region, mask, &lead).map_err(err)?;
        let n = region.len();
        ctx.report.fired(
            PACK,
            &first,
            format!(
                "{n} ops run on the real tokens only ({} attention)",
                attentions.len()
            ),
        );
        Ok(true)
    }
}

/// The graph input that attention `a`'s mask bias is computed from: it must be its only
/// non-constant source (the dims read by `Shape` do not count) and have the shape `[B, S]` of
/// the attention's rows.
fn mask_input(g: &Graph, a: NodeId) -> Result<Outlet, String> {
    let ins = g.node_inputs(a);
    let Some(&bias) = ins.get(ir::qkv_pieces(g.outlet_type(ins[0]).dtype)) else {
        return Err("no attention mask (every token is real)".into());
    };
    let mut sources = BTreeSet::new();
    let mut stack = vec![bias.node];
    let mut seen = BTreeSet::new();
    while let Some(id) = stack.pop() {
        if !seen.insert(id) {
            continue;
        }
        match g.node(id).op {
            Op::Input { .. } => {
                sources.insert(id);
            }
            // Reads only dims (the exporters' `[B, 1, 1, S]` reshape targets from `input_ids`),
            // and the graph inputs keep their padded shape.
            Op::Const { .. } | Op::Shape { .. } => {}
            _ => stack.extend(g.node_inputs(id).iter().map(|o| o.node)),
        }
    }
    let [input] = sources.into_iter().collect::<Vec<_>>()[..] else {
        return Err("the mask bias is not computed from exactly one graph input".into());
    };
    // Packed attention reads the bias per key: [B, 1, 1, S] (or fewer leading dims).
    let per_key = g.outlet_type(bias).shape.as_ref().is_some_and(|s| {
        s.len() <= 4
            && !s.is_empty()
            && s[..s.len() - 1]
                .iter()
                .rev()
                .take(2)
                .all(|d| d.as_fixed() == Some(1))
    });
    if !per_key {
        return Err(format!(
            "the mask bias {} is not one value per key ([B, 1, 1, S])",
            g.outlet_type(bias)
        ));
    }
    let mask = Outlet::new(input, 0);
    let rows = g.outlet_type(ins[0]).shape.as_ref();
    match (g.outlet_type(mask).shape.as_ref(), rows) {
        (Some(m), Some(r)) if m.len() == 2 && r.len() >= 2 && m[..] == r[..2] => Ok(mask),
        _ => Err(format!(
            "the mask bias comes from `{}`, which is not [B, S] like the attention's rows {}",
            g.node(input).name,
            g.outlet_type(ins[0])
        )),
    }
}

/// Whether `t` is a per-token value: `[B, S, …]` with the mask's `B` and `S`.
fn per_token(t: &TensorType, lead: &[Dim]) -> bool {
    t.shape
        .as_ref()
        .is_some_and(|s| s.len() >= 2 && s[..2] == lead[..])
}

/// Whether `t` is the same for every sequence of the batch, one row per position: `[1, S, …]`
/// with the mask's `S` (BERT's position embeddings, `position_ids[:, :S]` looked up), a
/// batch of one excepted (there it is per token). Packed, token `t` of sequence `b` at position
/// `s` reads row `s`.
fn per_position(t: &TensorType, lead: &[Dim]) -> bool {
    lead[0].as_fixed() != Some(1)
        && t.shape
            .as_ref()
            .is_some_and(|s| s.len() >= 2 && s[0].as_fixed() == Some(1) && s[1] == lead[1])
}

/// Whether `t` is the same for every token: no dim in the two leading positions of a rank-`r`
/// result once aligned to the right (a per-feature vector, a scalar, `[1, 1, H]`).
fn per_feature(t: &TensorType, rank: usize) -> bool {
    let Some(s) = t.shape.as_ref() else {
        return false;
    };
    s.len() <= rank
        && s.iter()
            .enumerate()
            .all(|(i, d)| i + rank - s.len() >= 2 || d.as_fixed() == Some(1))
}

/// Whether node `id` computes each token's row from that row alone (and per-feature
/// operands), so that it may run on packed rows.
fn is_token_wise(g: &Graph, id: NodeId, lead: &[Dim]) -> bool {
    let node = g.node(id);
    if node.outputs.is_empty() || !node.outputs.iter().all(|t| per_token(t, lead)) {
        return false;
    }
    let rank = node.outputs[0].rank().unwrap_or(0);
    let ins = g.node_inputs(id);
    let ty = |i: usize| g.outlet_type(ins[i]);
    // The last axis (or a trailing axis) only: not the token axes.
    let trailing = |axis: i64| {
        let a = if axis < 0 { axis + rank as i64 } else { axis };
        a >= 2
    };
    // Operands from `from` on are per token or per feature; with `by_position`, also a row per
    // position (packed to each token's), which only broadcasting elementwise ops take.
    let operands_ok = |from: usize, by_position: bool| {
        (from..ins.len()).all(|i| {
            per_token(ty(i), lead)
                || (by_position && per_position(ty(i), lead))
                || per_feature(ty(i), rank)
        })
    };
    // A linear's weights and per-column vectors, or a residual of its output's per-token shape.
    let param_ok = |i: usize| !per_token(ty(i), lead) || ty(i) == &node.outputs[0];
    let params_ok = |from: usize| (from..ins.len()).all(param_ok);
    match &node.op {
        Op::Linear | Op::FusedLinear { .. } => per_token(ty(0), lead) && params_ok(2),
        Op::QLinear { act, .. } => {
            // A whole-tensor dynamic range would change with the padding left out. The rows'
            // own quantization parameters (`token_u8`) are per token, one value a row.
            let row_params = 3..3 + act.row_param_inputs();
            !matches!(act, ActQuant::DynamicTensor)
                && per_token(ty(0), lead)
                && (1..ins.len()).all(|i| {
                    if row_params.contains(&i) {
                        per_token(ty(i), lead)
                    } else {
                        param_ok(i)
                    }
                })
        }
        Op::AttentionQkv { .. } => per_token(ty(0), lead),
        // An embedding lookup: rows of a table that is the same for every token, picked by
        // each token's own id (`[B, S]`).
        Op::Gather { axis: 0 | -2 } => {
            ty(0).rank() == Some(2)
                && !per_token(ty(0), lead)
                && ty(1).shape.as_ref().is_some_and(|s| s.len() == 2)
                && per_token(ty(1), lead)
        }
        Op::LayerNorm { axis, .. } => {
            per_token(ty(0), lead) && trailing(*axis) && operands_ok(1, false)
        }
        Op::Softmax { axis } => per_token(ty(0), lead) && trailing(*axis),
        Op::QuantizeLinear { .. } | Op::DequantizeLinear { .. } => {
            per_token(ty(0), lead)
                && (1..ins.len()).all(|i| {
                    ty(i).rank() == Some(0)
                        || ty(i)
                            .shape
                            .as_ref()
                            .is_some_and(|s| s.len() == 1 && s[0].as_fixed() == Some(1))
                })
        }
        Op::Unary(_) | Op::Binary(_) | Op::Cast { .. } | Op::Clip | Op::Where | Op::Gelu { .. } => {
            (0..ins.len()).any(|i| per_token(ty(i), lead)) && operands_ok(0, true)
        }
        _ => false,
    }
}

/// The token-wise nodes connected (through token-wise nodes) to the attention ops.
fn token_wise_region(
    g: &Graph,
    order: &[NodeId],
    attentions: &[NodeId],
    lead: &[Dim],
) -> BTreeSet<NodeId> {
    let eligible: BTreeSet<NodeId> = order
        .iter()
        .copied()
        .filter(|&id| is_token_wise(g, id, lead))
        .collect();
    let mut region = BTreeSet::new();
    let mut stack: Vec<NodeId> = attentions.to_vec();
    while let Some(id) = stack.pop() {
        if !region.insert(id) {
            continue;
        }
        let node = g.node(id);
        // A lookup's ids are packed where they enter, not computed packed: their producers
        // (XLM-R's positions come from a cumulative sum over the padded row) stay outside.
        let producers = g
            .node_inputs(id)
            .into_iter()
            .map(|o| o.node)
            .filter(|_| !matches!(node.op, Op::Gather { .. }));
        let consumers = (0..node.outputs.len())
            .flat_map(|s| g.consumers(Outlet::new(id, s)))
            .map(|(c, _)| c);
        stack.extend(
            producers
                .chain(consumers)
                .filter(|n| eligible.contains(n) && !region.contains(n)),
        );
    }
    region
}

/// A node reading (directly or not) what leaves the region whose result for one row may depend
/// on other rows, by name and op: there, the zeros that `unpack_rows` leaves at the padding
/// would differ from the padded program's values.
fn rows_mixed_downstream(g: &Graph, region: &BTreeSet<NodeId>) -> Option<(String, &'static str)> {
    let row_local = |id: NodeId| {
        let node = g.node(id);
        let last_axis = |axis: i64| {
            let rank = g
                .node_inputs(id)
                .first()
                .and_then(|&o| g.outlet_type(o).rank());
            axis == -1 || rank.is_some_and(|r| axis == r as i64 - 1)
        };
        match &node.op {
            Op::QLinear { act, .. } => !matches!(act, ActQuant::DynamicTensor),
            Op::LayerNorm { axis, .. } | Op::Softmax { axis } => last_axis(*axis),
            Op::Linear
            | Op::FusedLinear { .. }
            | Op::Unary(_)
            | Op::Binary(_)
            | Op::Cast { .. }
            | Op::Clip
            | Op::Where
            | Op::Gelu { .. }
            | Op::QuantizeLinear { .. }
            | Op::DequantizeLinear { .. }
            | Op::Shape { .. }
            | Op::Gather { .. }
            | Op::Slice
            | Op::Reshape { .. }
            | Op::Squeeze { .. }
            | Op::Unsqueeze { .. }
            | Op::Transpose { .. }
            | Op::Flatten { .. }
            | Op::Concat { .. }
            | Op::Split { .. }
            | Op::Expand => true,
            _ => false,
        }
    };
    let mut stack: Vec<NodeId> = region
        .iter()
        .flat_map(|&id| {
            (0..g.node(id).outputs.len()).flat_map(move |s| g.consumers(Outlet::new(id, s)))
        })
        .map(|(c, _)| c)
        .filter(|c| !region.contains(c))
        .collect();
    let mut seen = BTreeSet::new();
    while let Some(id) = stack.pop() {
        if !seen.insert(id) {
            continue;
        }
        if !row_local(id) {
            let node = g.node(id);
            return Some((node.name.clone(), node.op.name()));
        }
        for s in 0..g.node(id).outputs.len() {
            stack.extend(g.consumers(Outlet::new(id, s)).into_iter().map(|(c, _)| c));
        }
    }
    None
}

/// `[B, S, rest…]` → `[1, T, rest…]`.
fn packed_type(t: &TensorType) -> TensorType {
    let mut t = t.clone();
    if let Some(s) = t.shape.as_mut() {
        s[0] = Dim::fixed(1);
        s[1] = Dim::sym(ir::PACKED_TOKENS);
    }
    t
}

fn rewrite(
    g: &mut Graph,
    region: &BTreeSet<NodeId>,
    mask: Outlet,
    lead: &[Dim],
) -> Result<(), String> {
    let e = |e: ir::IrError| e.to_string();
    // Values entering the region: packed once each.
    let mut packed: HashMap<Outlet, Outlet> = HashMap::new();
    for &id in region {
        // The mask bias of an attention (after its q, k, v inputs) is read per key, not packed.
        let bias_slot = matches!(g.node(id).op, Op::AttentionQkv { .. })
            .then(|| ir::qkv_pieces(g.outlet_type(g.node_inputs(id)[0]).dtype));
        for (slot, o) in g.node_inputs(id).into_iter().enumerate() {
            let t = g.outlet_type(o);
            if region.contains(&o.node)
                || !(per_token(t, lead) || per_position(t, lead))
                || bias_slot == Some(slot)
            {
                continue;
            }
            let p = match packed.get(&o) {
                Some(&p) => p,
                None => {
                    let ty = packed_type(t);
                    // (a graph input's node is unnamed: its input name says what is packed)
                    let from = match &g.node(o.node).op {
                        Op::Input { name } if g.node(o.node).name.is_empty() => name,
                        _ => &g.node(o.node).name,
                    };
                    let name = format!("{from}/pack_rows");
                    let p: Outlet = g
                        .add_node(Op::PackRows, &name, &[o, mask], vec![ty])
                        .map_err(e)?
                        .into();
                    packed.insert(o, p);
                    p
                }
            };
            g.set_node_input(id, slot, p).map_err(e)?;
        }
    }
    // Values leaving the region (read outside it, or graph outputs): unpacked once each.
    for &id in region {
        for slot in 0..g.node(id).outputs.len() {
            let o = Outlet::new(id, slot);
            let outside: Vec<(NodeId, usize)> = g
                .consumers(o)
                .into_iter()
                .filter(|(c, _)| !region.contains(c))
                .collect();
            let outputs: Vec<String> = g
                .outputs()
                .iter()
                .filter(|(_, x)| *x == o)
                .map(|(n, _)| n.clone())
                .collect();
            if outside.is_empty() && outputs.is_empty() {
                continue;
            }
            let ty = g.node(id).outputs[slot].clone();
            let name = format!("{}/unpack_rows", g.node(id).name);
            let u: Outlet = g
                .add_node(Op::UnpackRows, &name, &[o, mask], vec![ty])
                .map_err(e)?
                .into();
            for (c, s) in outside {
                g.set_node_input(c, s, u).map_err(e)?;
            }
            for n in outputs {
                g.set_output(&n, u);
            }
        }
    }
    for &id in region {
        for t in g.node_mut(id).outputs.iter_mut() {
            *t = packed_type(t);
        }
    }
    for &id in region {
        let Op::AttentionQkv {
            num_heads,
            scale,
            products,
            out_u8,
        } = g.node(id).op
        else {
            continue;
        };
        let ins = g.node_inputs(id);
        let pieces = ir::qkv_pieces(g.outlet_type(ins[0]).dtype);
        let mut inputs = ins[..pieces].to_vec();
        inputs.push(mask);
        inputs.extend(&ins[pieces..]);
        let node = g.node(id);
        let (name, ty) = (node.name.clone(), node.outputs[0].clone());
        crate::rewrite::replace_with(
            g,
            id.into(),
            Op::AttentionPacked {
                num_heads,
                scale,
                products,
                out_u8,
            },
            &name,
            &inputs,
            ty,
        )?;
        g.remove_node(id);
    }
    Ok(())
}

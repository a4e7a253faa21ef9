//! The `quantize` pipeline: SmoothQuant, then FP32 linears to integer ones.
//!
//! Both passes read the calibration statistics and the options from the [`PassContext`]; they
//! never run the graph.

use ir::{ActQuant, DType, EpilogueStep, Graph, NodeId, Op, Outlet, Tensor};

use crate::context::{ActivationMode, ChannelStats};
use crate::{Pass, PassContext, PassError, Report};

/// Smoothing factors are kept within `[1/S_LIMIT, S_LIMIT]`, and a channel whose activation or
/// weight row is (nearly) zero gets 1: a channel that is always zero in calibration must not
/// crush the others (TorchAO's SmoothQuant turns a DistilBERT with a ReLU head into all-zero
/// logits that way).
const S_LIMIT: f32 = 1e3;
const TINY: f32 = 1e-5;

/// SmoothQuant factors `s_j = max|x_j|^α / max|W_j|^(1−α)` for one layer.
///
/// ```
/// let s = passes::smoothing_factors(&[4.0, 0.0, 1.0], &[1.0, 2.0, 0.0], 0.5);
/// assert_eq!(s, vec![2.0, 1.0, 1.0]);
/// ```
pub fn smoothing_factors(act_absmax: &[f32], w_absmax: &[f32], alpha: f32) -> Vec<f32> {
    act_absmax
        .iter()
        .zip(w_absmax)
        .map(|(&a, &w)| {
            if a < TINY || w < TINY || !a.is_finite() || !w.is_finite() {
                return 1.0;
            }
            let s = a.powf(alpha) / w.powf(1.0 - alpha);
            if s.is_finite() {
                s.clamp(1.0 / S_LIMIT, S_LIMIT)
            } else {
                1.0
            }
        })
        .collect()
}

/// Migrates activation outliers into the weights: `Linear(x, W, b)` becomes
/// `Linear(Mul(x, 1/s), diag(s)·W, b)`, which computes the same function. The `Mul` (named
/// `<linear>/smooth`) is folded into the activation quantization by [`QuantizeLinears`]. Fires on
/// layers with calibration statistics that are not kept in FP32.
///
/// ```
/// use passes::{CalibrationStats, ChannelStats, Pass, PassContext, SmoothQuant};
/// let mut g = ir::text::parse(
///     "%0 = input[name=\"x\"] : f32[B,2]\n\
///      %1 = const[value=f32[2,1]{1.0, 1.0}] : f32[2,1]\n\
///      %2 = linear(%0, %1) : f32[B,1]  # fc\n\
///      output \"y\" = %2\n",
///     None,
/// ).unwrap();
/// let mut stats = CalibrationStats::default();
/// stats.layers.insert("fc".into(), ChannelStats { min: vec![-16.0, 0.0], max: vec![4.0, 1.0], rows: 8 });
/// let mut ctx = PassContext { stats: Some(&stats), ..PassContext::default() };
/// assert!(SmoothQuant.run(&mut g, &mut ctx).unwrap());
/// let text = ir::text::print(&g).unwrap();
/// assert!(text.contains("f32[2]{0.25, 1.0}"), "{text}"); // 1/s = 1/sqrt(16), 1/sqrt(1)
/// ```
pub struct SmoothQuant;

const SMOOTH: &str = "SmoothQuant";

impl Pass for SmoothQuant {
    fn name(&self) -> &'static str {
        SMOOTH
    }

    fn run(&self, graph: &mut Graph, ctx: &mut PassContext<'_>) -> Result<bool, PassError> {
        if !ctx.quant.smooth {
            return Ok(false);
        }
        let Some(stats) = ctx.stats else {
            return Ok(false);
        };
        let order = graph.topo_order().map_err(|source| PassError::Graph {
            pass: SMOOTH,
            source,
        })?;
        // The linears that read each activation, in order: Q, K and V read the same one and get
        // one shared factor (one smoothed activation, quantized once).
        let eligible = order.iter().copied().filter(|&id| {
            let name = &graph.node(id).name;
            graph.node(id).op == Op::Linear
                && !ctx.quant.keeps_fp32(name)
                && stats.layers.contains_key(name)
                && !is_smoothing(graph, graph.node_inputs(id)[0]) // already smoothed
        });
        let readers = group_by_input(graph, eligible);
        let mut changed = false;
        for group in readers {
            let names: Vec<String> = group
                .iter()
                .map(|&id| graph.node(id).name.clone())
                .collect();
            let st = &stats.layers[&names[0]];
            // One factor per activation needs one alpha: the first reader's (`--alpha auto`
            // chooses one per group).
            let alpha = ctx.quant.alpha_of(&names[0]);
            if alpha <= 0.0 {
                continue; // alpha 0: this layer is not smoothed
            }
            let fired = smooth_group(graph, &group, st, alpha)
                .map_err(|m| PassError::node(SMOOTH, &names[0], m))?;
            let shared = if names.len() > 1 {
                format!(", one factor shared by {}", names.join(", "))
            } else {
                String::new()
            };
            for name in &names {
                match &fired {
                    Ok((lo, hi)) => ctx.report.fired(
                        SMOOTH,
                        name,
                        format!("alpha {alpha}: factors in [{lo:.3}, {hi:.3}]{shared}"),
                    ),
                    Err(why) => ctx.report.declined(SMOOTH, name, why.clone()),
                }
            }
            changed |= fired.is_ok();
        }
        Ok(changed)
    }
}

/// The nodes `ids` grouped by the outlet of their first input, groups and members in the order
/// given: the linears that read one activation (Q, K and V of an attention block) share a group.
///
/// ```
/// let g = ir::text::parse(
///     "%0 = input[name=\"x\"] : f32[B,2]\n\
///      %1 = const[value=f32[2,1]{1.0, 1.0}] : f32[2,1]\n\
///      %2 = linear(%0, %1) : f32[B,1]  # q\n\
///      %3 = linear(%0, %1) : f32[B,1]  # k\n\
///      %4 = linear(%2, %1) : f32[B,1]  # next\n\
///      output \"y\" = %4\n\
///      output \"z\" = %3\n",
///     None,
/// ).unwrap();
/// let ids: Vec<_> = g.topo_order().unwrap().into_iter().filter(|&i| g.node(i).op == ir::Op::Linear).collect();
/// let groups = passes::group_by_input(&g, ids);
/// let names: Vec<Vec<&str>> = groups.iter().map(|v| v.iter().map(|&i| g.node(i).name.as_str()).collect()).collect();
/// assert_eq!(names, vec![vec!["q", "k"], vec!["next"]]);
/// ```
pub fn group_by_input(g: &Graph, ids: impl IntoIterator<Item = NodeId>) -> Vec<Vec<NodeId>> {
    let mut groups: Vec<(Outlet, Vec<NodeId>)> = Vec::new();
    for id in ids {
        let x = g.node_inputs(id)[0];
        match groups.iter_mut().find(|(o, _)| *o == x) {
            Some((_, v)) => v.push(id),
            None => groups.push((x, vec![id])),
        }
    }
    groups.into_iter().map(|(_, v)| v).collect()
}

/// Whether `x` is a SmoothQuant `Mul` (named `<linear>/smooth`).
fn is_smoothing(g: &Graph, x: Outlet) -> bool {
    let node = g.node(x.node);
    node.name.ends_with("/smooth") && node.op == Op::Binary(ir::BinaryOp::Mul)
}

/// Smooths the linears `ids`, which read the same activation, with one factor per input
/// channel from the activation's range and the largest weight row among them: one `Mul` (named
/// after the first) feeds them all. `Ok(Err(why))` when it declines; `Ok(Ok((min s, max s)))`
/// when it fired.
#[allow(clippy::type_complexity)]
fn smooth_group(
    g: &mut Graph,
    ids: &[NodeId],
    st: &ChannelStats,
    alpha: f32,
) -> Result<Result<(f32, f32), String>, String> {
    let mut weights = Vec::with_capacity(ids.len());
    for &id in ids {
        let ins = g.node_inputs(id);
        let Some(w) = g.const_value(ins[1]).cloned() else {
            return Ok(Err("the weight is not a constant".into()));
        };
        if w.dtype() != DType::F32 || w.shape().len() != 2 || !w.has_data() {
            return Ok(Err("the weight is not f32[k, n] with data".into()));
        }
        weights.push(w);
    }
    let k = weights[0].shape()[0];
    if weights.iter().any(|w| w.shape()[0] != k) {
        return Ok(Err(
            "the readers of one activation differ in input width".into()
        ));
    }
    if st.min.len() != k || st.max.len() != k {
        return Ok(Err(format!(
            "statistics have {} channels, the layer has {k} inputs",
            st.min.len()
        )));
    }
    let mut w_absmax = vec![0f32; k];
    let mut values = Vec::with_capacity(weights.len());
    for w in &weights {
        let n = w.shape()[1];
        let wv = w.to_f32_vec().map_err(|e| e.to_string())?;
        for (j, m) in w_absmax.iter_mut().enumerate() {
            *m = wv[j * n..(j + 1) * n]
                .iter()
                .fold(*m, |m, v| m.max(v.abs()));
        }
        values.push(wv);
    }
    let s = smoothing_factors(&st.absmax(), &w_absmax, alpha);
    let inv: Vec<f32> = s.iter().map(|v| 1.0 / v).collect();
    let first = g.node(ids[0]).name.clone();
    let inv_c = g.add_const(
        &format!("{first}/inv_smooth"),
        Tensor::from_vec(vec![k], inv),
    );
    let x = g.node_inputs(ids[0])[0];
    let x_ty = g.outlet_type(x).clone();
    let mul = g
        .add_node(
            Op::Binary(ir::BinaryOp::Mul),
            &format!("{first}/smooth"),
            &[x, inv_c],
            vec![x_ty],
        )
        .map_err(|e| e.to_string())?;
    for ((&id, w), wv) in ids.iter().zip(&weights).zip(&values) {
        let n = w.shape()[1];
        let scaled: Vec<f32> = wv.iter().enumerate().map(|(i, &v)| v * s[i / n]).collect();
        let name = g.node(id).name.clone();
        let w_new = g.add_const(
            &format!("{name}/weight_smoothed"),
            Tensor::from_vec(vec![k, n], scaled),
        );
        g.set_node_input(id, 0, mul.into())
            .map_err(|e| e.to_string())?;
        g.set_node_input(id, 1, w_new).map_err(|e| e.to_string())?;
    }
    crate::dce::remove_dead(g);
    let lo = s.iter().copied().fold(f32::INFINITY, f32::min);
    let hi = s.iter().copied().fold(0f32, f32::max);
    Ok(Ok((lo, hi)))
}

/// Quantizes a weight `[k, n]` symmetrically per output column: `(q, scale[n])`, with
/// `q = round_half_even(w / scale)` in `[-127, 127]` and `scale = max|w[:, c]| / 127` (1 for an
/// all-zero column).
///
/// ```
/// let (q, s) = passes::quantize_weight(&[1.0, -0.5, 0.5, 0.25], 2, 2);
/// assert_eq!(s, vec![1.0 / 127.0, 0.5 / 127.0]);
/// assert_eq!(q, vec![127, -127, 64, 64]);
/// ```
pub fn quantize_weight(w: &[f32], k: usize, n: usize) -> (Vec<i8>, Vec<f32>) {
    let mut scale = vec![0f32; n];
    for j in 0..k {
        for c in 0..n {
            scale[c] = scale[c].max(w[j * n + c].abs());
        }
    }
    for s in &mut scale {
        *s = if *s > 0.0 && s.is_finite() {
            *s / 127.0
        } else {
            1.0
        };
    }
    let q = w
        .iter()
        .enumerate()
        .map(|(i, &v)| (v / scale[i % n]).round_ties_even().clamp(-127.0, 127.0) as i8)
        .collect();
    (q, scale)
}

/// `Linear` → `QLinear`: weights s8 per output channel; activations per token at run time
/// (dynamic) or with the calibrated per-tensor range (static); a preceding SmoothQuant `Mul` is
/// folded into the activation quantization (`smooth=true`). Layers kept in FP32 by name, and
/// layers without statistics in static mode, are left and reported.
///
/// ```
/// use passes::{Pass, PassContext, QuantizeLinears};
/// let mut g = ir::text::parse(
///     "%0 = input[name=\"x\"] : f32[B,2]\n\
///      %1 = const[value=f32[2,1]{1.0, -0.5}] : f32[2,1]\n\
///      %2 = linear(%0, %1) : f32[B,1]  # fc\n\
///      output \"y\" = %2\n",
///     None,
/// ).unwrap();
/// assert!(QuantizeLinears.run(&mut g, &mut PassContext::default()).unwrap());
/// let text = ir::text::print(&g).unwrap();
/// assert!(text.contains("qlinear[act=\"token\", smooth=false, epilogue=()]"), "{text}");
/// assert!(text.contains("i8[2,1]{127, -64}"), "{text}");
/// ```
pub struct QuantizeLinears;

const QUANT: &str = "QuantizeLinears";

impl Pass for QuantizeLinears {
    fn name(&self) -> &'static str {
        QUANT
    }

    fn run(&self, graph: &mut Graph, ctx: &mut PassContext<'_>) -> Result<bool, PassError> {
        let order = graph.topo_order().map_err(|source| PassError::Graph {
            pass: QUANT,
            source,
        })?;
        let mut changed = false;
        for id in order {
            if !graph.contains(id) || graph.node(id).op != Op::Linear {
                continue;
            }
            let name = graph.node(id).name.clone();
            let r = quantize_one(graph, id, ctx).map_err(|m| PassError::node(QUANT, &name, m))?;
            changed |= r;
        }
        if changed {
            crate::dce::remove_dead(graph);
        }
        Ok(changed)
    }
}

fn quantize_one(g: &mut Graph, id: NodeId, ctx: &mut PassContext<'_>) -> Result<bool, String> {
    let name = g.node(id).name.clone();
    let report: &mut Report = &mut ctx.report;
    if ctx.quant.keeps_fp32(&name) {
        report.declined(QUANT, &name, "kept in FP32 (keep-fp32)");
        return Ok(false);
    }
    let ins = g.node_inputs(id);
    let Some(w) = g.const_value(ins[1]).cloned() else {
        report.declined(QUANT, &name, "the weight is not a constant");
        return Ok(false);
    };
    if w.dtype() != DType::F32 || w.shape().len() != 2 || !w.has_data() {
        report.declined(QUANT, &name, "the weight is not f32[k, n] with data");
        return Ok(false);
    }
    let (k, n) = (w.shape()[0], w.shape()[1]);
    // The SmoothQuant Mul in front, when there is one and only linears read it (Q, K and V
    // share one).
    let smooth: Option<(Outlet, Outlet)> = {
        let m = ins[0];
        if is_smoothing(g, m) {
            let mi = g.node_inputs(m.node);
            let only_reader = !g.is_graph_output(m)
                && g.consumers(m)
                    .iter()
                    .all(|(c, _)| matches!(g.node(*c).op, Op::Linear | Op::QLinear { .. }));
            let inv_ok = g
                .const_value(mi[1])
                .is_some_and(|t| t.dtype() == DType::F32 && t.shape() == [k]);
            (only_reader && inv_ok).then_some((mi[0], mi[1]))
        } else {
            None
        }
    };
    let (x, inv_smooth) = match smooth {
        Some((x, inv)) => (x, Some(inv)),
        None => (ins[0], None),
    };
    let act = match ctx.quant.activations {
        ActivationMode::Dynamic => ActQuant::DynamicToken,
        ActivationMode::Static => {
            let Some(st) = ctx.stats.and_then(|s| s.layers.get(&name)) else {
                report.declined(
                    QUANT,
                    &name,
                    "kept in FP32: no calibration statistics for static quantization",
                );
                return Ok(false);
            };
            if st.min.len() != k {
                report.declined(
                    QUANT,
                    &name,
                    "kept in FP32: statistics do not match the layer's inputs",
                );
                return Ok(false);
            }
            let inv = match inv_smooth {
                Some(o) => g
                    .const_value(o)
                    .ok_or("inv_smooth")?
                    .to_f32_vec()
                    .map_err(|e| e.to_string())?,
                None => vec![1.0; k],
            };
            let lo = st
                .min
                .iter()
                .zip(&inv)
                .map(|(v, s)| v * s)
                .fold(0f32, f32::min);
            let hi = st
                .max
                .iter()
                .zip(&inv)
                .map(|(v, s)| v * s)
                .fold(0f32, f32::max);
            let (scale, zero_point) = ir::u8_qparams(lo, hi);
            ActQuant::Static { scale, zero_point }
        }
    };
    let wv = w.to_f32_vec().map_err(|e| e.to_string())?;
    let (q, scale) = quantize_weight(&wv, k, n);
    let wq = g.add_const(
        &format!("{name}/weight_s8"),
        Tensor::from_vec(vec![k, n], q),
    );
    let ws = g.add_const(
        &format!("{name}/weight_scale"),
        Tensor::from_vec(vec![n], scale),
    );
    let mut inputs = vec![x, wq, ws];
    inputs.extend(inv_smooth);
    let mut epilogue = vec![];
    if let Some(&b) = ins.get(2) {
        inputs.push(b);
        epilogue.push(EpilogueStep::Bias);
    }
    let ty = g.node(id).outputs[0].clone();
    let op = Op::QLinear {
        act,
        smooth: inv_smooth.is_some(),
        epilogue,
    };
    let what = match act {
        ActQuant::Static { scale, zero_point } => {
            format!("s8 per channel, u8 static (scale {scale:.4e}, zero {zero_point})")
        }
        _ => "s8 per channel, u8 per token".to_string(),
    };
    let new = g
        .add_node(op, &name, &inputs, vec![ty])
        .map_err(|e| e.to_string())?;
    g.replace_uses(id.into(), new.into())
        .map_err(|e| e.to_string())?;
    report.fired(
        QUANT,
        &name,
        format!(
            "{what}{}",
            if inv_smooth.is_some() {
                ", smoothed"
            } else {
                ""
            }
        ),
    );
    Ok(true)
}

/// Sets the arithmetic of every attention op to the context's `attention` option (8-bit
/// products on request; see [`ir::AttnProducts`]), except attention nodes named in
/// `keep_fp32`. Runs in the `quantize` pipeline, after the linears.
///
/// ```
/// use passes::{Pass, PassContext, QuantizeAttention};
/// let mut g = ir::text::parse(
///     "%0 = input[name=\"q\"] : f32[1,4,8]\n\
///      %1 = input[name=\"k\"] : f32[1,4,8]\n\
///      %2 = input[name=\"v\"] : f32[1,4,8]\n\
///      %3 = attention[num_heads=2, scale=0.5](%0, %1, %2) : f32[1,4,8]  # attn\n\
///      output \"y\" = %3\n",
///     None,
/// )
/// .unwrap();
/// let mut ctx = PassContext::default();
/// assert!(!QuantizeAttention.run(&mut g, &mut ctx).unwrap()); // f32 unless asked
/// ctx.quant.attention = ir::AttnProducts::Int8;
/// assert!(QuantizeAttention.run(&mut g, &mut ctx).unwrap());
/// assert!(ir::text::print(&g).unwrap().contains("products=\"int8\""));
/// ```
pub struct QuantizeAttention;

const QUANT_ATTN: &str = "QuantizeAttention";

impl Pass for QuantizeAttention {
    fn name(&self) -> &'static str {
        QUANT_ATTN
    }

    fn run(&self, graph: &mut Graph, ctx: &mut PassContext<'_>) -> Result<bool, PassError> {
        let want = ctx.quant.attention;
        let mut changed = false;
        let ids: Vec<NodeId> = graph.node_ids().collect();
        for id in ids {
            let name = graph.node(id).name.clone();
            let keep = ctx.quant.keeps_fp32(&name);
            let (Op::Attention { products, .. }
            | Op::AttentionQkv { products, .. }
            | Op::AttentionPacked { products, .. }) = &mut graph.node_mut(id).op
            else {
                continue;
            };
            if *products == want || want == ir::AttnProducts::F32 {
                continue;
            }
            if keep {
                ctx.report
                    .declined(QUANT_ATTN, &name, "kept in FP32 (keep-fp32)");
                continue;
            }
            *products = want;
            changed = true;
            ctx.report.fired(
                QUANT_ATTN,
                &name,
                format!("q·kᵀ and p·v in {}", want.name()),
            );
        }
        Ok(changed)
    }
}

//! The `quantize` pipeline (SmoothQuant, QuantizeLinears) and the `fuse` pipeline (FoldQdq,
//! FuseEpilogue) on small graphs written in the IR text form: snapshots of the dump before and
//! after each pass with the report's notes, plus a numeric check through the test interpreter
//! (`common::interp`) where the pass claims to keep (or approximate) the function.

mod common;

use std::collections::HashMap;

use ir::{AttnProducts, Graph, Op, Outlet, Tensor};
use passes::{
    smoothing_factors, ActivationMode, CalibrationStats, ChannelStats, DeadCodeElimination,
    FoldQdq, FuseEpilogue, NoteKind, PackTokens, Pass, PassContext, Pipeline, QuantizeAttention,
    QuantizeLinears, QuantizeOptions, Report, RunOptions, ShapeInference, SmoothQuant,
};

fn parse(text: &str) -> Graph {
    ir::text::parse(text, None).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn print(g: &Graph) -> String {
    ir::text::print(g).unwrap()
}

/// Parses `text` and types it with shape inference.
fn typed(text: &str) -> Graph {
    let mut g = parse(text);
    ShapeInference
        .run(&mut g, &mut PassContext::default())
        .unwrap_or_else(|e| panic!("{e}"));
    g
}

/// Runs `pass` on `g` with `ctx`, verifies the graph, removes dead nodes; returns whether the
/// pass changed the graph.
fn step(pass: &dyn Pass, g: &mut Graph, ctx: &mut PassContext<'_>) -> bool {
    let changed = pass.run(g, ctx).unwrap_or_else(|e| panic!("{e}"));
    g.verify().unwrap_or_else(|e| panic!("{e}\n{}", print(g)));
    DeadCodeElimination
        .run(g, &mut PassContext::default())
        .unwrap();
    changed
}

fn notes(r: &Report) -> String {
    if r.notes.is_empty() {
        return "(no notes)\n".into();
    }
    r.notes
        .iter()
        .map(|n| format!("{:?} {} `{}`: {}\n", n.kind, n.pass, n.node, n.message))
        .collect()
}

/// `--- before`, one `--- after <pass>` per stage, then `--- report`.
fn snapshot(before: &str, stages: &[(&str, String)], report: &Report) -> String {
    let mut s = format!("--- before\n{before}");
    for (name, text) in stages {
        s += &format!("--- after {name}\n{text}");
    }
    s + "--- report\n" + &notes(report)
}

/// One pass with a default context: (snapshot, changed, graph before, graph after, report).
fn one_pass(pass: &dyn Pass, text: &str) -> (String, bool, Graph, Graph, Report) {
    let mut g = typed(text);
    let before = g.clone();
    let mut ctx = PassContext::default();
    let changed = step(pass, &mut g, &mut ctx);
    let snap = snapshot(&print(&before), &[(pass.name(), print(&g))], &ctx.report);
    (snap, changed, before, g, ctx.report)
}

fn has_note(r: &Report, kind: NoteKind, node: &str, contains: &str) -> bool {
    r.notes
        .iter()
        .any(|n| n.kind == kind && n.node == node && n.message.contains(contains))
}

fn count(g: &Graph, op: &str) -> usize {
    g.node_ids()
        .filter(|&id| g.node(id).op.name() == op)
        .count()
}

struct Lcg(u64);

impl Lcg {
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// Random f32 feeds for every input of `g` (symbols: B = 2, S = 3): uniform in [-2, 2], or,
/// when `ranges` is given, channel `j` of the last axis uniform in `[min[j], max[j]]` (inputs
/// inside the calibrated range).
fn feeds(g: &Graph, seed: u64, ranges: Option<&ChannelStats>) -> HashMap<String, Tensor> {
    let mut rng = Lcg(seed);
    let sizes = HashMap::from([("B", 2usize), ("S", 3usize)]);
    let mut out = HashMap::new();
    for &id in g.inputs() {
        let Op::Input { name } = &g.node(id).op else {
            unreachable!()
        };
        let ty = &g.node(id).outputs[0];
        let shape: Vec<usize> = ty
            .shape
            .as_ref()
            .unwrap()
            .iter()
            .map(|d| {
                let syms: usize = d.symbols().iter().map(|s| sizes[s.as_str()]).product();
                syms * d.coeff() as usize
            })
            .collect();
        let n: usize = shape.iter().product();
        let last = *shape.last().unwrap();
        let v = (0..n)
            .map(|i| {
                let u = rng.unit();
                match ranges {
                    None => 2.0 * u,
                    Some(st) => {
                        let (lo, hi) = (st.min[i % last], st.max[i % last]);
                        lo + (u + 1.0) / 2.0 * (hi - lo)
                    }
                }
            })
            .collect();
        out.insert(name.clone(), Tensor::from_vec(shape, v));
    }
    out
}

fn run(g: &Graph, feeds: &HashMap<String, Tensor>) -> HashMap<String, Vec<f32>> {
    common::interp::run(g, feeds)
        .unwrap_or_else(|e| panic!("{e}\n{}", print(g)))
        .into_iter()
        .map(|(k, v)| (k, v.to_f32_vec().unwrap()))
        .collect()
}

/// Max abs difference of the outputs of `a` and `b` on `feeds`, and the max abs output of `a`.
fn max_diff(a: &Graph, b: &Graph, feeds: &HashMap<String, Tensor>) -> (f32, f32) {
    let (x, y) = (run(a, feeds), run(b, feeds));
    assert!(!x.is_empty());
    let mut err = 0f32;
    let mut mag = 0f32;
    for (name, xv) in &x {
        let yv = &y[name];
        assert_eq!(xv.len(), yv.len(), "{name}");
        for (p, q) in xv.iter().zip(yv) {
            assert!(p.is_finite() && q.is_finite(), "{name}: {p} vs {q}");
            err = err.max((p - q).abs());
            mag = mag.max(p.abs());
        }
    }
    (err, mag)
}

/// The graph computes the same function before and after a pass that only moves f32 work
/// around: `max |before − after| ≤ 1e-5 · (1 + max |before|)`. The fused and unfused forms do
/// the same f32 operations (the interpreter's epilogue uses the same formulas as its separate
/// ops), so the only difference allowed is a few ulps of reassociation (e.g. SmoothQuant's
/// `(x·s⁻¹)·(s·W)` against `x·W`: each term is off by ≤ 3 roundings of 2⁻²⁴ relative, summed over
/// k = 4 terms, far under 1e-5 relative) — while a wrong step order, a lost bias or a wrong
/// factor moves outputs by ≥ 1e-2.
fn assert_same_function(before: &Graph, after: &Graph, seed: u64, ranges: Option<&ChannelStats>) {
    for s in [seed, seed + 1] {
        let f = feeds(before, s, ranges);
        let (err, mag) = max_diff(before, after, &f);
        assert!(
            err <= 1e-5 * (1.0 + mag),
            "outputs differ by {err} (max |y| {mag})\n--- before\n{}--- after\n{}",
            print(before),
            print(after)
        );
    }
}

/// `k × n` weight values in multiples of 1/8 in [-1, 1], varied by `seed`, as text.
fn weights(k: usize, n: usize, seed: usize) -> Vec<f32> {
    (0..k * n)
        .map(|i| ((i * 7 + seed * 3) % 17) as f32 / 8.0 - 1.0)
        .collect()
}

fn values(v: &[f32]) -> String {
    v.iter()
        .map(|x| format!("{x:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn f32_const(shape: &[usize], v: &[f32]) -> String {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let d = dims.join(",");
    format!("const[value=f32[{d}]{{{}}}] : f32[{d}]", values(v))
}

fn const_of(g: &Graph, name: &str) -> Vec<f32> {
    let id = g
        .node_ids()
        .find(|&id| g.node(id).name == name)
        .unwrap_or_else(|| panic!("no node {name}\n{}", print(g)));
    g.const_value(Outlet::from(id))
        .unwrap_or_else(|| panic!("{name} is not a constant"))
        .to_f32_vec()
        .unwrap()
}

// ---------------------------------------------------------------------------------------------
// FuseEpilogue

fn linear_bias(k: usize, n: usize) -> String {
    format!(
        "%0 = input[name=\"x\"] : f32[B,S,{k}]\n\
         %1 = {}  # fc/weight\n\
         %2 = {}  # fc/bias\n\
         %3 = linear(%0, %1, %2) : f32[*]  # fc\n",
        f32_const(&[k, n], &weights(k, n, 1)),
        f32_const(&[n], &[0.5, -0.25, 1.0][..n]),
    )
}

#[test]
fn fuse_epilogue_linear_bias() {
    let text = linear_bias(4, 3) + "output \"y\" = %3\n";
    let (snap, changed, before, after, _) = one_pass(&FuseEpilogue, &text);
    assert!(changed);
    let t = print(&after);
    assert!(
        t.contains("fused_linear[epilogue=(bias)](%0, %1, %2) : f32[B,S,3]  # fc"),
        "{t}"
    );
    assert_eq!(count(&after, "linear"), 0, "{t}");
    assert_same_function(&before, &after, 11, None);
    insta::assert_snapshot!(snap);
}

#[test]
fn fuse_epilogue_linear_bias_gelu() {
    let text = linear_bias(4, 3)
        + "%4 = gelu[approx=\"erf\"](%3) : f32[*]  # act\n\
           output \"y\" = %4\n";
    let (snap, changed, before, after, report) = one_pass(&FuseEpilogue, &text);
    assert!(changed);
    let t = print(&after);
    assert!(
        t.contains("fused_linear[epilogue=(bias, gelu_erf)](%0, %1, %2) : f32[B,S,3]  # fc"),
        "{t}"
    );
    assert_eq!(count(&after, "gelu"), 0, "{t}");
    assert!(has_note(
        &report,
        NoteKind::Fired,
        "fc",
        "`act` → epilogue `gelu_erf`"
    ));
    assert_same_function(&before, &after, 12, None);
    insta::assert_snapshot!(snap);
}

/// The BERT attention-output block: dense + bias, residual add, LayerNorm.
#[test]
fn fuse_epilogue_attention_output_block() {
    let text = format!(
        "%0 = input[name=\"x\"] : f32[B,S,4]\n\
         %1 = input[name=\"residual\"] : f32[B,S,4]\n\
         %2 = {}  # attention/output/dense/weight\n\
         %3 = {}  # attention/output/dense/bias\n\
         %4 = linear(%0, %2, %3) : f32[*]  # attention/output/dense\n\
         %5 = add(%4, %1) : f32[*]  # attention/output/add\n\
         %6 = {}  # attention/output/LayerNorm/gamma\n\
         %7 = {}  # attention/output/LayerNorm/beta\n\
         %8 = layer_norm[axis=-1, epsilon=1e-12](%5, %6, %7) : f32[*]  # attention/output/LayerNorm\n\
         output \"y\" = %8\n",
        f32_const(&[4, 4], &weights(4, 4, 2)),
        f32_const(&[4], &[0.5, -0.25, 1.0, 0.0]),
        f32_const(&[4], &[1.0, 0.5, 2.0, -1.0]),
        f32_const(&[4], &[0.0, 0.25, -0.5, 1.0]),
    );
    let (snap, changed, before, after, report) = one_pass(&FuseEpilogue, &text);
    assert!(changed);
    let t = print(&after);
    assert!(
        t.contains(
            "fused_linear[epilogue=(bias, residual, layer_norm 1e-12)](%0, %2, %3, %1, %4, %5) : f32[B,S,4]  # attention/output/dense"
        ),
        "{t}"
    );
    assert_eq!(count(&after, "add") + count(&after, "layer_norm"), 0, "{t}");
    for reader in ["attention/output/add", "attention/output/LayerNorm"] {
        assert!(
            has_note(&report, NoteKind::Fired, "attention/output/dense", reader),
            "{}",
            notes(&report)
        );
    }
    assert_same_function(&before, &after, 13, None);
    insta::assert_snapshot!(snap);
}

/// `y + gelu(y)`: the residual operand is computed from the linear's own output, which cannot be
/// an epilogue operand (the GEMM would need its result before producing it). The rule declines.
#[test]
fn fuse_epilogue_residual_from_own_output_declines() {
    let text = linear_bias(4, 3)
        + "%4 = gelu[approx=\"erf\"](%3) : f32[*]  # act\n\
           %5 = add(%3, %4) : f32[*]  # add\n\
           output \"y\" = %5\n";
    let (snap, _, before, after, report) = one_pass(&FuseEpilogue, &text);
    let t = print(&after);
    assert!(
        t.contains("fused_linear[epilogue=(bias)](%0, %1, %2)"),
        "only the bias is fused: {t}"
    );
    assert!(!t.contains("residual"), "{t}");
    assert_eq!(count(&after, "add"), 1, "{t}");
    assert_eq!(count(&after, "gelu"), 1, "{t}");
    assert!(
        report
            .of_kind(NoteKind::Declined)
            .any(|n| n.pass == "FuseEpilogue"),
        "the decline is reported: {}",
        notes(&report)
    );
    assert_eq!(
        report.of_kind(NoteKind::Fired).count(),
        0,
        "{}",
        notes(&report)
    );
    assert_same_function(&before, &after, 14, None);
    insta::assert_snapshot!(snap);
}

#[test]
fn fuse_epilogue_two_readers_declines() {
    let text = linear_bias(4, 3)
        + "%4 = gelu[approx=\"erf\"](%3) : f32[*]  # act\n\
           %5 = const[value=f32[3]{1.0, 1.0, 1.0}] : f32[3]  # ln/gamma\n\
           %6 = layer_norm[axis=-1, epsilon=1e-12](%3, %5) : f32[*]  # ln\n\
           output \"a\" = %4\n\
           output \"b\" = %6\n";
    let (snap, _, before, after, report) = one_pass(&FuseEpilogue, &text);
    let t = print(&after);
    assert!(
        t.contains("fused_linear[epilogue=(bias)](%0, %1, %2)"),
        "{t}"
    );
    assert_eq!(count(&after, "gelu"), 1, "{t}");
    assert_eq!(count(&after, "layer_norm"), 1, "{t}");
    assert!(
        has_note(
            &report,
            NoteKind::Declined,
            "fc",
            "output has 2 readers; an epilogue needs exactly one"
        ),
        "{}",
        notes(&report)
    );
    assert_same_function(&before, &after, 15, None);
    insta::assert_snapshot!(snap);
}

/// A quantized linear takes a separate bias `Add` (constant on the left) and a GELU.
#[test]
fn fuse_epilogue_qlinear_bias_and_gelu() {
    let text = "\
%0 = input[name=\"x\"] : f32[B,S,4]
%1 = const[value=i8[4,3]{127, -64, 3, -127, 20, 90, 45, -100, -7, 0, 127, 60}] : i8[4,3]  # fc/weight_s8
%2 = const[value=f32[3]{0.01, 0.02, 0.015}] : f32[3]  # fc/weight_scale
%3 = qlinear[act=\"token\", smooth=false, epilogue=()](%0, %1, %2) : f32[B,S,3]  # fc
%4 = const[value=f32[3]{0.5, -0.25, 1.0}] : f32[3]  # fc/bias
%5 = add(%4, %3) : f32[*]  # fc/bias_add
%6 = gelu[approx=\"tanh\"](%5) : f32[*]  # act
output \"y\" = %6
";
    let (snap, changed, before, after, report) = one_pass(&FuseEpilogue, text);
    assert!(changed);
    let t = print(&after);
    assert!(
        t.contains(
            "qlinear[act=\"token\", smooth=false, epilogue=(bias, gelu_tanh)](%0, %1, %2, %3) : f32[B,S,3]  # fc"
        ),
        "{t}"
    );
    assert_eq!(count(&after, "add") + count(&after, "gelu"), 0, "{t}");
    assert!(has_note(&report, NoteKind::Fired, "fc", "epilogue `bias`"));
    assert!(has_note(
        &report,
        NoteKind::Fired,
        "fc",
        "epilogue `gelu_tanh`"
    ));
    assert_same_function(&before, &after, 16, None);
    insta::assert_snapshot!(snap);
}

// ---------------------------------------------------------------------------------------------
// FoldQdq

const W_S8: &str =
    "const[value=i8[4,3]{127, -64, 3, -127, 20, 90, 45, -100, -7, 0, 127, 60}] : i8[4,3]";

/// `MatMul(DQ(Q(x)), DQ(W))` with activation type `act` and zero point `zero`; the weight's
/// DequantizeLinear gets `w_zero` (a constant line) when given.
fn qdq_matmul(act: &str, zero: i32, w_zero: Option<&str>) -> String {
    let (wz, wz_in) = match w_zero {
        Some(z) => (format!("%9 = {z}  # fc/weight_zero\n"), ", %9"),
        None => (String::new(), ""),
    };
    format!(
        "%0 = input[name=\"x\"] : f32[B,S,4]\n\
         %1 = const[value=f32[]{{0.05}}] : f32[]  # x/scale\n\
         %2 = const[value={act}[]{{{zero}}}] : {act}[]  # x/zero\n\
         %3 = quantize_linear[axis=1, to={act}](%0, %1, %2) : {act}[*]  # x/Q\n\
         %4 = dequantize_linear[axis=1](%3, %1, %2) : f32[*]  # x/DQ\n\
         %5 = {W_S8}  # fc/weight_s8\n\
         %6 = const[value=f32[3]{{0.02, 0.01, 0.03}}] : f32[3]  # fc/weight_scale\n\
         {wz}\
         %7 = dequantize_linear[axis=1](%5, %6{wz_in}) : f32[*]  # fc/weight_DQ\n\
         %8 = matmul(%4, %7) : f32[*]  # fc\n\
         output \"y\" = %8\n"
    )
}

#[test]
fn fold_qdq_s8_activations_per_channel_weights() {
    let (snap, changed, before, after, report) = one_pass(&FoldQdq, &qdq_matmul("i8", -5, None));
    assert!(changed);
    let t = print(&after);
    // s8 zero point -5 is the u8 grid's 123.
    assert!(
        t.contains(
            "qlinear[act=\"static\", a_scale=0.05, a_zero=123, smooth=false, epilogue=()](%0, %1, %2) : f32[B,S,3]  # fc"
        ),
        "{t}"
    );
    assert_eq!(
        count(&after, "quantize_linear") + count(&after, "dequantize_linear"),
        0
    );
    assert!(has_note(
        &report,
        NoteKind::Fired,
        "fc",
        "QDQ MatMul → qlinear (static)"
    ));
    // Same grid, same integers: the QDQ graph and the qlinear agree up to f32 rounding.
    assert_same_function(&before, &after, 21, None);
    insta::assert_snapshot!(snap);
}

#[test]
fn fold_qdq_u8_activations() {
    let (snap, changed, before, after, _) = one_pass(&FoldQdq, &qdq_matmul("u8", 100, None));
    assert!(changed);
    let t = print(&after);
    assert!(
        t.contains(
            "qlinear[act=\"static\", a_scale=0.05, a_zero=100, smooth=false, epilogue=()](%0, %1, %2) : f32[B,S,3]  # fc"
        ),
        "{t}"
    );
    assert_same_function(&before, &after, 22, None);
    insta::assert_snapshot!(snap);
}

#[test]
fn fold_qdq_dynamic_matmul_integer() {
    let text = format!(
        "%0 = input[name=\"x\"] : f32[B,S,4]\n\
         %1 = dynamic_quantize_linear(%0) : (u8[*], f32[*], u8[*])  # x/DQL\n\
         %2 = {W_S8}  # fc/weight_s8\n\
         %3 = const[value=i8[]{{0}}] : i8[]  # fc/weight_zero\n\
         %4 = matmul_integer(%1, %2, %1.2, %3) : i32[*]  # fc/MatMulInteger\n\
         %5 = cast[to=f32](%4) : f32[*]  # fc/Cast\n\
         %6 = const[value=f32[3]{{0.02, 0.01, 0.03}}] : f32[3]  # fc/weight_scale\n\
         %7 = mul(%1.1, %6) : f32[*]  # fc/scale\n\
         %8 = mul(%5, %7) : f32[*]  # fc/rescale\n\
         output \"y\" = %8\n"
    );
    let (snap, changed, before, after, report) = one_pass(&FoldQdq, &text);
    assert!(changed);
    let t = print(&after);
    assert!(
        t.contains(
            "qlinear[act=\"tensor\", smooth=false, epilogue=()](%0, %1, %2) : f32[B,S,3]  # fc/MatMulInteger"
        ),
        "{t}"
    );
    for op in ["dynamic_quantize_linear", "matmul_integer", "cast", "mul"] {
        assert_eq!(count(&after, op), 0, "{op} left: {t}");
    }
    assert!(has_note(
        &report,
        NoteKind::Fired,
        "fc/MatMulInteger",
        "DynamicQuantizeLinear + MatMulInteger → qlinear (per tensor)"
    ));
    assert_same_function(&before, &after, 23, None);
    insta::assert_snapshot!(snap);
}

/// Activation × activation (as in QDQ attention): both operands quantized at run time.
#[test]
fn fold_qdq_activation_times_activation() {
    let text = "\
%0 = input[name=\"a\"] : f32[B,3,4]
%1 = input[name=\"b\"] : f32[B,4,2]
%2 = const[value=f32[]{0.02}] : f32[]  # a/scale
%3 = const[value=u8[]{128}] : u8[]  # a/zero
%4 = quantize_linear[axis=1, to=u8](%0, %2, %3) : u8[*]  # a/Q
%5 = dequantize_linear[axis=1](%4, %2, %3) : f32[*]  # a/DQ
%6 = const[value=f32[]{0.03}] : f32[]  # b/scale
%7 = const[value=i8[]{0}] : i8[]  # b/zero
%8 = quantize_linear[axis=1, to=i8](%1, %6, %7) : i8[*]  # b/Q
%9 = dequantize_linear[axis=1](%8, %6, %7) : f32[*]  # b/DQ
%10 = matmul(%5, %9) : f32[*]  # scores
output \"y\" = %10
";
    let (snap, changed, before, after, report) = one_pass(&FoldQdq, text);
    assert!(changed);
    let t = print(&after);
    assert!(
        t.contains("qmatmul(%4, %2, %3, %7, %5, %6) : f32[B,3,2]  # scores"),
        "{t}"
    );
    assert_eq!(
        count(&after, "dequantize_linear") + count(&after, "matmul"),
        0,
        "{t}"
    );
    assert_eq!(
        count(&after, "quantize_linear"),
        2,
        "the run-time Q stays: {t}"
    );
    assert!(has_note(&report, NoteKind::Fired, "scores", "qmatmul"));
    assert_same_function(&before, &after, 24, None);
    insta::assert_snapshot!(snap);
}

/// A weight zero point that is not 0: no `qlinear` (it has no weight zero point); the
/// declined note says why. The general `qmatmul` rule may still take the product, which keeps
/// the zero points and so the function.
#[test]
fn fold_qdq_asymmetric_weight_declines_qlinear() {
    let text = qdq_matmul("i8", -5, Some("const[value=i8[3]{0, 3, 0}] : i8[3]"));
    let (snap, _, before, after, report) = one_pass(&FoldQdq, &text);
    let t = print(&after);
    assert_eq!(count(&after, "qlinear"), 0, "{t}");
    assert!(
        has_note(
            &report,
            NoteKind::Declined,
            "fc",
            "not an integer linear: the weight zero point is not 0 (asymmetric weights)"
        ),
        "{}",
        notes(&report)
    );
    assert_same_function(&before, &after, 25, None);
    insta::assert_snapshot!(snap);
}

// ---------------------------------------------------------------------------------------------
// SmoothQuant + QuantizeLinears

const K: usize = 4;
const N: usize = 3;

fn fc_weights() -> Vec<f32> {
    weights(K, N, 5)
}

fn single_linear() -> String {
    linear_bias_named("fc", &fc_weights()) + "output \"y\" = %3\n"
}

fn linear_bias_named(name: &str, w: &[f32]) -> String {
    format!(
        "%0 = input[name=\"x\"] : f32[B,S,{K}]\n\
         %1 = {}  # {name}/weight\n\
         %2 = {}  # {name}/bias\n\
         %3 = linear(%0, %1, %2) : f32[*]  # {name}\n",
        f32_const(&[K, N], w),
        f32_const(&[N], &[0.5, -0.25, 1.0]),
    )
}

/// Channel 0 has an outlier range, channel 2 is mild, channels 1 and 3 are small.
fn fc_stats() -> ChannelStats {
    ChannelStats {
        min: vec![-8.0, -0.5, -1.0, -0.25],
        max: vec![6.0, 0.5, 2.0, 0.25],
        rows: 64,
    }
}

/// A context for static activations with `stats`.
fn static_context(stats: &CalibrationStats) -> PassContext<'_> {
    PassContext {
        stats: Some(stats),
        quant: QuantizeOptions {
            activations: ActivationMode::Static,
            ..QuantizeOptions::default()
        },
        ..PassContext::default()
    }
}

fn stats_of(layers: &[(&str, ChannelStats)]) -> CalibrationStats {
    let mut s = CalibrationStats::default();
    for (name, st) in layers {
        s.layers.insert(name.to_string(), st.clone());
    }
    s
}

/// An upper bound of `|qlinear − linear|` for the single-layer graph `after` (one `qlinear`
/// named `fc`, input `x`) on `feeds`, from one quantization step per operand: with
/// `x' = x·inv_smooth`, `W'` the smoothed weight, `ŵ = q·w_scale` and `x̂` the dequantized
/// activation, `|x'·W' − x̂·ŵ| ≤ Σ_p |x'_p|·|W'−ŵ| + |ŵ_p|·|x'−x̂| ≤ Σ_p |x'_p|·w_scale[c] +
/// |ŵ_pc|·a_scale(row)`. Rounding makes each of these errors at most half a step; a whole step
/// leaves room for the zero point's own rounding at the range's edges. Inputs must lie in the
/// quantization range (always so per token; inside the calibrated range for static).
fn quant_bound(after: &Graph, feeds: &HashMap<String, Tensor>) -> f32 {
    let id = after
        .node_ids()
        .find(|&id| matches!(after.node(id).op, Op::QLinear { .. }))
        .expect("a qlinear");
    let Op::QLinear { act, smooth, .. } = after.node(id).op.clone() else {
        unreachable!()
    };
    let ins = after.node_inputs(id);
    let val = |o: Outlet| after.const_value(o).unwrap().to_f32_vec().unwrap();
    let (wq, ws) = (val(ins[1]), val(ins[2]));
    let inv = if smooth { val(ins[3]) } else { vec![1.0; K] };
    let x: Vec<f32> = feeds["x"]
        .to_f32_vec()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, v)| v * inv[i % K])
        .collect();
    let mut bound = 0f32;
    for row in x.chunks(K) {
        let a_scale = match act {
            ir::ActQuant::Static { scale, .. } => scale,
            _ => {
                let (lo, hi) = row
                    .iter()
                    .fold((0f32, 0f32), |(a, b), &v| (a.min(v), b.max(v)));
                (hi - lo) / 255.0
            }
        };
        for c in 0..N {
            let wsc = ws[if ws.len() == 1 { 0 } else { c }];
            let b: f32 = (0..K)
                .map(|p| row[p].abs() * wsc + (wq[p * N + c] * wsc).abs() * a_scale)
                .sum();
            bound = bound.max(b);
        }
    }
    bound
}

/// The quantized graph stays within [`quant_bound`] of the FP32 one, and the bound is small
/// against the outputs (so the check says something).
fn assert_quantized_close(fp32: &Graph, quant: &Graph, seed: u64, ranges: Option<&ChannelStats>) {
    for s in [seed, seed + 1, seed + 2] {
        let f = feeds(fp32, s, ranges);
        let bound = quant_bound(quant, &f);
        let (err, mag) = max_diff(fp32, quant, &f);
        assert!(
            bound < 0.1 * mag,
            "vacuous bound {bound} for outputs up to {mag}"
        );
        assert!(
            err <= bound,
            "quantized output off by {err} > one step's bound {bound}\n--- fp32\n{}--- quantized\n{}",
            print(fp32),
            print(quant)
        );
    }
}

/// SmoothQuant then QuantizeLinears with `ctx`: (snapshot, fp32, smoothed, quantized, report).
fn quantize_steps(text: &str, ctx: &mut PassContext<'_>) -> (String, Graph, Graph, Graph) {
    let mut g = typed(text);
    let fp32 = g.clone();
    step(&SmoothQuant, &mut g, ctx);
    let smoothed = g.clone();
    step(&QuantizeLinears, &mut g, ctx);
    let snap = snapshot(
        &print(&fp32),
        &[
            ("SmoothQuant", print(&smoothed)),
            ("QuantizeLinears", print(&g)),
        ],
        &ctx.report,
    );
    (snap, fp32, smoothed, g)
}

#[test]
fn quantize_dynamic_per_token() {
    let stats = stats_of(&[("fc", fc_stats())]);
    let mut ctx = PassContext {
        stats: Some(&stats),
        ..PassContext::default()
    };
    let (snap, fp32, smoothed, quant) = quantize_steps(&single_linear(), &mut ctx);
    let t = print(&quant);
    assert!(
        t.contains("qlinear[act=\"token\", smooth=true, epilogue=(bias)](%0, "),
        "{t}"
    );
    assert_eq!(count(&quant, "linear") + count(&quant, "mul"), 0, "{t}");
    // The factors, from the statistics and the weight rows.
    let w = fc_weights();
    let w_absmax: Vec<f32> = w
        .chunks(N)
        .map(|r| r.iter().fold(0f32, |m, v| m.max(v.abs())))
        .collect();
    let s = smoothing_factors(&fc_stats().absmax(), &w_absmax, 0.5);
    let inv: Vec<f32> = s.iter().map(|v| 1.0 / v).collect();
    assert_eq!(const_of(&smoothed, "fc/inv_smooth"), inv);
    assert!(s[0] > 1.0, "the outlier channel is scaled down: {s:?}");
    assert!(has_note(&ctx.report, NoteKind::Fired, "fc", "alpha 0.5"));
    assert!(ctx.report.notes.iter().any(|n| n.pass == "QuantizeLinears"
        && n.kind == NoteKind::Fired
        && n.node == "fc"
        && n.message == "s8 per channel, u8 per token, smoothed"));
    assert_same_function(&fp32, &smoothed, 31, None);
    assert_quantized_close(&fp32, &quant, 32, None);
    insta::assert_snapshot!(snap);
}

#[test]
fn quantize_static_activations() {
    let stats = stats_of(&[("fc", fc_stats())]);
    let mut ctx = static_context(&stats);
    let (snap, fp32, smoothed, quant) = quantize_steps(&single_linear(), &mut ctx);
    // The expected range: the calibrated one, divided by the smoothing factors, widened to 0.
    let inv = const_of(&smoothed, "fc/inv_smooth");
    let st = fc_stats();
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
    let (scale, zero) = ir::u8_qparams(lo, hi);
    assert!(zero > 0 && zero < 255, "{zero}");
    let t = print(&quant);
    let attrs = format!(
        "qlinear[act=\"static\", a_scale={scale:?}, a_zero={zero}, smooth=true, epilogue=(bias)]"
    );
    assert!(t.contains(&attrs), "expected {attrs} in\n{t}");
    assert!(has_note(
        &ctx.report,
        NoteKind::Fired,
        "fc",
        &format!("u8 static (scale {scale:.4e}, zero {zero}), smoothed")
    ));
    assert_same_function(&fp32, &smoothed, 33, Some(&st));
    assert_quantized_close(&fp32, &quant, 34, Some(&st));
    insta::assert_snapshot!(snap);
}

#[test]
fn quantize_keep_fp32_by_name() {
    let w2 = weights(N, N, 9);
    let text = linear_bias_named("encoder/fc", &fc_weights())
        + &format!(
            "%4 = {}  # head/fc/weight\n\
             %5 = linear(%3, %4) : f32[*]  # head/fc\n\
             output \"y\" = %5\n",
            f32_const(&[N, N], &w2)
        );
    let head_stats = ChannelStats {
        min: vec![-3.0, -1.0, -2.0],
        max: vec![3.0, 1.0, 0.5],
        rows: 64,
    };
    let stats = stats_of(&[("encoder/fc", fc_stats()), ("head/fc", head_stats)]);
    let mut ctx = PassContext {
        stats: Some(&stats),
        quant: QuantizeOptions {
            keep_fp32: vec!["head".into()],
            ..QuantizeOptions::default()
        },
        ..PassContext::default()
    };
    let (snap, fp32, smoothed, quant) = quantize_steps(&text, &mut ctx);
    let t = print(&quant);
    assert_eq!(count(&quant, "qlinear"), 1, "{t}");
    assert!(t.contains("linear(%"), "head/fc stays an FP32 linear: {t}");
    assert!(t.contains("# head/fc\n"), "{t}");
    assert!(
        !t.contains("head/fc/smooth"),
        "a kept layer is not smoothed: {t}"
    );
    assert!(has_note(
        &ctx.report,
        NoteKind::Declined,
        "head/fc",
        "kept in FP32 (keep-fp32)"
    ));
    assert!(!ctx
        .report
        .notes
        .iter()
        .any(|n| n.node == "head/fc" && n.kind == NoteKind::Fired));
    assert_same_function(&fp32, &smoothed, 35, None);
    insta::assert_snapshot!(snap);
}

/// A channel that is always 0 in calibration gets the factor 1 exactly (the clamp), so it
/// neither crushes nor blows up the other channels.
#[test]
fn quantize_zero_channel_gets_factor_one() {
    let mut st = fc_stats();
    st.min[2] = 0.0;
    st.max[2] = 0.0;
    let stats = stats_of(&[("fc", st.clone())]);
    let mut ctx = PassContext {
        stats: Some(&stats),
        ..PassContext::default()
    };
    let (snap, fp32, smoothed, quant) = quantize_steps(&single_linear(), &mut ctx);
    let inv = const_of(&smoothed, "fc/inv_smooth");
    assert_eq!(inv[2].to_bits(), 1.0f32.to_bits(), "{inv:?}");
    assert!(
        inv.iter().enumerate().any(|(j, v)| j != 2 && *v != 1.0),
        "{inv:?}"
    );
    let (w, ws) = (fc_weights(), const_of(&smoothed, "fc/weight_smoothed"));
    assert_eq!(
        &ws[2 * N..3 * N],
        &w[2 * N..3 * N],
        "row 2 is left as it was"
    );
    assert_same_function(&fp32, &smoothed, 36, None);
    assert_quantized_close(&fp32, &quant, 37, None);
    insta::assert_snapshot!(snap);
}

/// The `quantize` pipeline reaches its fixpoint: a second run changes nothing (no pass reports
/// a change, the dump is the same), on a graph with a smoothed static layer, a layer without
/// statistics (left in FP32 in static mode) and a layer kept by name.
#[test]
fn quantize_pipeline_twice_is_a_no_op() {
    let text = linear_bias_named("encoder/fc", &fc_weights())
        + &format!(
            "%4 = {}  # encoder/out/weight\n\
             %5 = linear(%3, %4) : f32[*]  # encoder/out\n\
             %6 = {}  # head/fc/weight\n\
             %7 = linear(%5, %6) : f32[*]  # head/fc\n\
             output \"y\" = %7\n",
            f32_const(&[N, N], &weights(N, N, 9)),
            f32_const(&[N, N], &weights(N, N, 4)),
        );
    let stats = stats_of(&[("encoder/fc", fc_stats())]);
    let options = QuantizeOptions {
        activations: ActivationMode::Static,
        keep_fp32: vec!["head".into()],
        ..QuantizeOptions::default()
    };
    let mut g = typed(&text);
    let before = print(&g);
    let pipeline = Pipeline::quantize();
    let mut first = RunOptions {
        context: PassContext {
            stats: Some(&stats),
            quant: options.clone(),
            ..PassContext::default()
        },
        ..RunOptions::default()
    };
    let r1 = pipeline.run(&mut g, &mut first).unwrap();
    assert!(r1.runs.iter().any(|r| r.changed));
    let once = print(&g);
    let mut second = RunOptions {
        context: PassContext {
            stats: Some(&stats),
            quant: options,
            ..PassContext::default()
        },
        ..RunOptions::default()
    };
    let r2 = pipeline.run(&mut g, &mut second).unwrap();
    let twice = print(&g);
    assert!(
        r2.runs.iter().all(|r| !r.changed),
        "second run changed something: {:?}",
        r2.runs
    );
    assert_eq!(r2.runs.len(), 4, "one round: {:?}", r2.runs);
    assert_eq!(once, twice);
    assert_eq!(count(&g, "qlinear"), 1, "{twice}");
    assert_eq!(count(&g, "linear"), 2, "{twice}");
    assert!(
        has_note(
            &second.context.report,
            NoteKind::Declined,
            "encoder/out",
            "no calibration statistics"
        ),
        "{}",
        notes(&second.context.report)
    );
    let runs = |r: &passes::RunReport| -> String {
        r.runs
            .iter()
            .map(|p| format!("{} #{}: changed={}\n", p.pass, p.iteration, p.changed))
            .collect()
    };
    let snap = format!(
        "--- before\n{before}--- after quantize\n{once}--- first run\n{}{}--- second run\n{}{}",
        runs(&r1),
        notes(&first.context.report),
        runs(&r2),
        notes(&second.context.report)
    );
    insta::assert_snapshot!(snap);
}

/// Two chained static quantized linears (FFN1 → FFN2): FFN2's activation quantization (its
/// SmoothQuant factor, scale and zero point) moves into FFN1's epilogue, FFN1 writes u8 and
/// FFN2 reads it as is. The bytes are the ones FFN2 made itself, so the outputs are equal bit
/// for bit.
#[test]
fn fuse_epilogue_requant_into_producer() {
    let text = "\
%0 = input[name=\"x\"] : f32[B,4]
%1 = const[value=i8[4,3]{127, -64, 3, -127, 20, 90, 45, -100, -7, 0, 127, 60}] : i8[4,3]  # ffn1/weight_s8
%2 = const[value=f32[3]{0.01, 0.02, 0.015}] : f32[3]  # ffn1/weight_scale
%3 = const[value=f32[3]{0.5, -0.25, 1.0}] : f32[3]  # ffn1/bias
%4 = qlinear[act=\"static\", a_scale=0.02, a_zero=120, smooth=false, epilogue=(bias, gelu_erf)](%0, %1, %2, %3) : f32[B,3]  # ffn1
%5 = const[value=i8[3,2]{100, -3, 7, -127, 64, 9}] : i8[3,2]  # ffn2/weight_s8
%6 = const[value=f32[2]{0.03, 0.01}] : f32[2]  # ffn2/weight_scale
%7 = const[value=f32[3]{2.0, 0.5, 1.25}] : f32[3]  # ffn2/inv_smooth
%8 = const[value=f32[2]{0.1, 0.2}] : f32[2]  # ffn2/bias
%9 = qlinear[act=\"static\", a_scale=0.01, a_zero=7, smooth=true, epilogue=(bias)](%4, %5, %6, %7, %8) : f32[B,2]  # ffn2
output \"y\" = %9
";
    let (snap, changed, before, after, report) = one_pass(&FuseEpilogue, text);
    assert!(changed);
    let t = print(&after);
    assert!(
        t.contains("epilogue=(bias, gelu_erf, mul_col, requant_u8 0.01 7)](%0, %1, %2, %3, %6) : u8[B,3]  # ffn1"),
        "{t}"
    );
    assert!(
        t.contains("a_scale=0.01, a_zero=7, smooth=false, epilogue=(bias)]"),
        "{t}"
    );
    assert!(has_note(&report, NoteKind::Fired, "ffn1", "requant_u8"));
    for seed in [21, 22, 23] {
        let f = feeds(&before, seed, None);
        assert_eq!(run(&before, &f), run(&after, &f), "seed {seed}\n{t}");
    }
    insta::assert_snapshot!(snap);
}

/// A static quantized linear whose f32 input has other readers too (an attention output
/// LayerNorm feeding FFN1 and the residual; here a graph output): its quantization (SmoothQuant
/// factor, scale, zero point) moves into the producer as `fork_u8`, which writes the f32 value
/// for the other readers and the bytes for this one. The bytes are the ones the reader made
/// itself, so every output is equal bit for bit.
#[test]
fn fuse_epilogue_fork_into_producer() {
    let text = "\
%0 = input[name=\"x\"] : f32[B,4]
%1 = const[value=i8[4,3]{127, -64, 3, -127, 20, 90, 45, -100, -7, 0, 127, 60}] : i8[4,3]  # attn_out/weight_s8
%2 = const[value=f32[3]{0.01, 0.02, 0.015}] : f32[3]  # attn_out/weight_scale
%3 = const[value=f32[3]{0.5, -0.25, 1.0}] : f32[3]  # attn_out/bias
%4 = const[value=f32[3]{1.5, 0.75, 1.0}] : f32[3]  # attn_out/gamma
%5 = const[value=f32[3]{0.1, 0.0, -0.2}] : f32[3]  # attn_out/beta
%6 = qlinear[act=\"static\", a_scale=0.02, a_zero=120, smooth=false, epilogue=(bias, layer_norm 1e-5)](%0, %1, %2, %3, %4, %5) : f32[B,3]  # attn_out
%7 = const[value=i8[3,2]{100, -3, 7, -127, 64, 9}] : i8[3,2]  # ffn1/weight_s8
%8 = const[value=f32[2]{0.03, 0.01}] : f32[2]  # ffn1/weight_scale
%9 = const[value=f32[3]{2.0, 0.5, 1.25}] : f32[3]  # ffn1/inv_smooth
%10 = const[value=f32[2]{0.1, 0.2}] : f32[2]  # ffn1/bias
%11 = qlinear[act=\"static\", a_scale=0.01, a_zero=7, smooth=true, epilogue=(bias)](%6, %7, %8, %9, %10) : f32[B,2]  # ffn1
output \"ln\" = %6
output \"y\" = %11
";
    let (snap, changed, before, after, report) = one_pass(&FuseEpilogue, text);
    assert!(changed);
    let t = print(&after);
    assert!(
        t.contains("epilogue=(bias, layer_norm 1e-5, fork_u8 0.01 7 smooth)]")
            && t.contains(" : (f32[B,3], u8[B,3])  # attn_out"),
        "{t}"
    );
    let ffn1 = t.lines().find(|l| l.ends_with("# ffn1")).expect("ffn1");
    assert!(
        ffn1.contains("a_scale=0.01, a_zero=7, smooth=false, epilogue=(bias)]")
            && ffn1.contains(".1, "),
        "{t}"
    );
    assert!(has_note(&report, NoteKind::Fired, "attn_out", "fork_u8"));
    for seed in [31, 32, 33] {
        let f = feeds(&before, seed, None);
        assert_eq!(run(&before, &f), run(&after, &f), "seed {seed}\n{t}");
    }
    insta::assert_snapshot!(snap);
}

/// A per-token dynamic quantized linear reading a LayerNorm epilogue's output that the residual
/// reads too (an attention output block feeding FFN1): its quantization (SmoothQuant factor,
/// each row's range) moves into the producer as `fork_u8_rows`, which writes the f32 value, the
/// bytes and each row's scale and zero point; the reader (`act="token_u8"`) takes them as they
/// are. FFN1's own reader (FFN2, after a GELU) keeps its quantization, and the report says why.
/// Every output is equal bit for bit.
#[test]
fn fuse_epilogue_token_quantization_into_layer_norm() {
    let text = "\
%0 = input[name=\"x\"] : f32[B,4]
%1 = const[value=i8[4,3]{127, -64, 3, -127, 20, 90, 45, -100, -7, 0, 127, 60}] : i8[4,3]  # attn_out/weight_s8
%2 = const[value=f32[3]{0.01, 0.02, 0.015}] : f32[3]  # attn_out/weight_scale
%3 = const[value=f32[3]{0.5, -0.25, 1.0}] : f32[3]  # attn_out/bias
%4 = const[value=f32[3]{1.5, 0.75, 1.0}] : f32[3]  # attn_out/gamma
%5 = const[value=f32[3]{0.1, 0.0, -0.2}] : f32[3]  # attn_out/beta
%6 = qlinear[act=\"token\", smooth=false, epilogue=(bias, layer_norm 1e-5)](%0, %1, %2, %3, %4, %5) : f32[B,3]  # attn_out
%7 = const[value=i8[3,2]{100, -3, 7, -127, 64, 9}] : i8[3,2]  # ffn1/weight_s8
%8 = const[value=f32[2]{0.03, 0.01}] : f32[2]  # ffn1/weight_scale
%9 = const[value=f32[3]{2.0, 0.5, 1.25}] : f32[3]  # ffn1/inv_smooth
%10 = const[value=f32[2]{0.1, 0.2}] : f32[2]  # ffn1/bias
%11 = qlinear[act=\"token\", smooth=true, epilogue=(bias, gelu_erf)](%6, %7, %8, %9, %10) : f32[B,2]  # ffn1
%12 = const[value=i8[2,3]{90, -40, 12, -127, 33, 101}] : i8[2,3]  # ffn2/weight_s8
%13 = const[value=f32[3]{0.02, 0.01, 0.03}] : f32[3]  # ffn2/weight_scale
%14 = qlinear[act=\"token\", smooth=false, epilogue=(residual)](%11, %12, %13, %6) : f32[B,3]  # ffn2
output \"ln\" = %6
output \"y\" = %14
";
    let (snap, changed, before, after, report) = one_pass(&FuseEpilogue, text);
    assert!(changed);
    let t = print(&after);
    assert!(
        t.contains("epilogue=(bias, layer_norm 1e-5, fork_u8_rows smooth)]")
            && t.contains(" : (f32[B,3], u8[B,3], f32[B,1], i32[B,1])  # attn_out"),
        "{t}"
    );
    let ffn1 = t.lines().find(|l| l.ends_with("# ffn1")).expect("ffn1");
    assert!(
        ffn1.contains("qlinear[act=\"token_u8\", smooth=false, epilogue=(bias, gelu_erf)]")
            && ffn1.contains(".1, ")
            && ffn1.contains(".2, ")
            && ffn1.contains(".3, "),
        "{t}"
    );
    let ffn2 = t.lines().find(|l| l.ends_with("# ffn2")).expect("ffn2");
    assert!(ffn2.contains("act=\"token\""), "{t}");
    assert!(has_note(
        &report,
        NoteKind::Fired,
        "attn_out",
        "fork_u8_rows"
    ));
    assert!(has_note(
        &report,
        NoteKind::Declined,
        "ffn2",
        "does not end in `layer_norm`"
    ));
    for seed in [41, 42, 43] {
        let f = feeds(&before, seed, None);
        assert_eq!(run(&before, &f), run(&after, &f), "seed {seed}\n{t}");
    }
    insta::assert_snapshot!(snap);
}

/// The quantization stays in the reader when the producer already writes bytes for another
/// reader (one fork per producer), or when the producer is an f32 GEMM; the report says why.
#[test]
fn fuse_epilogue_requant_declines() {
    let text = "\
%0 = input[name=\"x\"] : f32[B,4]
%1 = const[value=i8[4,3]{127, -64, 3, -127, 20, 90, 45, -100, -7, 0, 127, 60}] : i8[4,3]  # a/weight_s8
%2 = const[value=f32[3]{0.01, 0.02, 0.015}] : f32[3]  # a/weight_scale
%3 = qlinear[act=\"static\", a_scale=0.02, a_zero=120, smooth=false, epilogue=()](%0, %1, %2) : f32[B,3]  # a
%4 = const[value=i8[3,2]{100, -3, 7, -127, 64, 9}] : i8[3,2]  # b/weight_s8
%5 = const[value=f32[2]{0.03, 0.01}] : f32[2]  # b/weight_scale
%6 = qlinear[act=\"static\", a_scale=0.01, a_zero=7, smooth=false, epilogue=()](%3, %4, %5) : f32[B,2]  # b
%7 = const[value=f32[4,3]{1, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1}] : f32[4,3]  # c/weight
%8 = fused_linear[epilogue=()](%0, %7) : f32[B,3]  # c
%9 = qlinear[act=\"static\", a_scale=0.01, a_zero=7, smooth=false, epilogue=()](%8, %4, %5) : f32[B,2]  # d
%10 = qlinear[act=\"static\", a_scale=0.03, a_zero=9, smooth=false, epilogue=()](%3, %4, %5) : f32[B,2]  # e
output \"a\" = %3
output \"b\" = %6
output \"d\" = %9
output \"e\" = %10
";
    let (snap, changed, before, after, report) = one_pass(&FuseEpilogue, text);
    assert!(changed, "one of b and e takes the fork");
    let forked = ["b", "e"]
        .iter()
        .filter(|r| has_note(&report, NoteKind::Declined, r, "already writes bytes"))
        .count();
    assert_eq!(forked, 1, "{}", notes(&report));
    assert!(
        has_note(
            &report,
            NoteKind::Declined,
            "d",
            "the f32 GEMM writes f32 only"
        ),
        "{}",
        notes(&report)
    );
    for seed in [41, 42] {
        let f = feeds(&before, seed, None);
        assert_eq!(run(&before, &f), run(&after, &f), "seed {seed}");
    }
    insta::assert_snapshot!(snap);
}

/// Q, K and V read one activation: SmoothQuant gives them one factor per channel (from the
/// activation's range and the largest weight row among the three), one `Mul` feeds all three,
/// and with static activations the three quantized linears get the same scale and zero point,
/// so the activation is quantized the same way for each. The function is kept.
#[test]
fn smooth_quant_shares_one_factor_among_readers_of_one_activation() {
    let (wq, wk, wv) = (weights(K, N, 5), weights(K, N, 6), weights(K, N, 7));
    let text = format!(
        "%0 = input[name=\"x\"] : f32[B,S,{K}]\n\
         %1 = {}  # q/weight\n\
         %2 = {}  # k/weight\n\
         %3 = {}  # v/weight\n\
         %4 = linear(%0, %1) : f32[*]  # q\n\
         %5 = linear(%0, %2) : f32[*]  # k\n\
         %6 = linear(%0, %3) : f32[*]  # v\n\
         output \"q\" = %4\n\
         output \"k\" = %5\n\
         output \"v\" = %6\n",
        f32_const(&[K, N], &wq),
        f32_const(&[K, N], &wk),
        f32_const(&[K, N], &wv),
    );
    let stats = stats_of(&[("q", fc_stats()), ("k", fc_stats()), ("v", fc_stats())]);
    let mut ctx = static_context(&stats);
    let (snap, fp32, smoothed, quant) = quantize_steps(&text, &mut ctx);
    assert_eq!(count(&smoothed, "mul"), 1, "{}", print(&smoothed));
    let w_absmax: Vec<f32> = (0..K)
        .map(|j| {
            [&wq, &wk, &wv]
                .iter()
                .flat_map(|w| &w[j * N..(j + 1) * N])
                .fold(0f32, |m, v| m.max(v.abs()))
        })
        .collect();
    let s = smoothing_factors(&fc_stats().absmax(), &w_absmax, 0.5);
    let inv: Vec<f32> = s.iter().map(|v| 1.0 / v).collect();
    assert_eq!(const_of(&smoothed, "q/inv_smooth"), inv);
    for name in ["q", "k", "v"] {
        assert!(
            has_note(
                &ctx.report,
                NoteKind::Fired,
                name,
                "one factor shared by q, k, v"
            ),
            "{}",
            notes(&ctx.report)
        );
    }
    let acts: Vec<String> = quant
        .node_ids()
        .filter_map(|id| match &quant.node(id).op {
            Op::QLinear { act, smooth, .. } => {
                assert!(*smooth);
                Some(format!("{act:?}"))
            }
            _ => None,
        })
        .collect();
    assert_eq!(acts.len(), 3);
    assert!(acts.iter().all(|a| *a == acts[0]), "{acts:?}");
    assert_eq!(count(&quant, "mul"), 0, "{}", print(&quant));
    assert_same_function(&fp32, &smoothed, 41, None);
    insta::assert_snapshot!(snap);
}

/// Q, K and V projections of one activation become one GEMM (weights and biases side by side)
/// feeding `attention_qkv`; a projection that reads another activation keeps them apart, and
/// the report says why.
#[test]
fn fuse_epilogue_merges_qkv() {
    let proj = |id: usize, x: &str, seed: usize| {
        format!(
            "%{id} = {}  # p{id}/weight\n\
             %{} = const[value=f32[4]{{0.5, -0.25, 1.0, 0.125}}] : f32[4]  # p{id}/bias\n\
             %{} = fused_linear[epilogue=(bias)]({x}, %{id}, %{}) : f32[B,S,4]  # p{id}\n",
            f32_const(&[4, 4], &weights(4, 4, seed)),
            id + 1,
            id + 2,
            id + 1,
        )
    };
    let text = |v_input: &str| {
        format!(
            "%0 = input[name=\"x\"] : f32[B,S,4]\n%1 = input[name=\"m\"] : f32[B,1,1,S]\n{}{}{}\
             %11 = attention[num_heads=2, scale=0.5](%4, %7, %10, %1) : f32[B,S,4]  # layer/Attention\n\
             output \"y\" = %11\n",
            proj(2, "%0", 1),
            proj(5, "%0", 2),
            proj(8, v_input, 3)
        )
    };
    let (snap, changed, _, after, report) = one_pass(&FuseEpilogue, &text("%0"));
    assert!(changed);
    let t = print(&after);
    assert!(
        t.contains("fused_linear[epilogue=(bias)](%0, ")
            && t.contains(": f32[B,S,12]  # layer/QKV"),
        "{t}"
    );
    assert!(t.contains("attention_qkv[num_heads=2, scale=0.5]("), "{t}");
    assert_eq!(count(&after, "fused_linear"), 1, "{t}");
    assert!(has_note(
        &report,
        NoteKind::Fired,
        "layer/Attention",
        "one GEMM `layer/QKV`"
    ));
    insta::assert_snapshot!(snap);

    let (_, _, _, after, report) = one_pass(&FuseEpilogue, &text("%4"));
    assert_eq!(count(&after, "attention_qkv"), 0, "{}", print(&after));
    assert!(
        has_note(
            &report,
            NoteKind::Declined,
            "layer/Attention",
            "read different activations"
        ),
        "{}",
        notes(&report)
    );
}

/// One encoder layer after `fuse`: the embedding sum (a per-token and a per-position term), its
/// LayerNorm, the merged QKV GEMM, attention with the usual mask bias, the output projection
/// with residual and LayerNorm; `tail` is appended (it may read `%13`).
fn encoder_layer(tail: &str) -> String {
    format!(
        "%0 = input[name=\"x\"] : f32[B,S,4]\n\
         %1 = input[name=\"mask\"] : i64[B,S]\n\
         %2 = input[name=\"pos\"] : f32[1,S,4]\n\
         %3 = add(%0, %2) : f32[B,S,4]  # embed\n\
         %4 = const[value=f32[4]{{1.0, 1.0, 1.0, 1.0}}] : f32[4]  # gamma\n\
         %5 = const[value=f32[4]{{0.0, 0.0, 0.0, 0.0}}] : f32[4]  # beta\n\
         %6 = layer_norm[axis=-1, epsilon=1e-12](%3, %4, %5) : f32[B,S,4]  # embed/ln\n\
         %7 = {}  # qkv/weight\n\
         %8 = fused_linear[epilogue=()](%6, %7) : f32[B,S,12]  # qkv\n\
         %9 = unsqueeze[axes=[1, 2]](%1) : i64[B,1,1,S]  # mask/unsqueeze\n\
         %10 = cast[to=f32](%9) : f32[B,1,1,S]  # mask/cast\n\
         %11 = const[value=f32[]{{-10000.0}}] : f32[]  # mask/big\n\
         %12 = mul(%10, %11) : f32[B,1,1,S]  # mask/bias\n\
         %13 = attention_qkv[num_heads=2, scale=0.5](%8, %12) : f32[B,S,4]  # attn\n\
         %14 = {}  # out/weight\n\
         %15 = fused_linear[epilogue=(residual, layer_norm 1e-12)](%13, %14, %6, %4, %5) : f32[B,S,4]  # out\n\
         {tail}",
        f32_const(&[4, 12], &weights(4, 12, 1)),
        f32_const(&[4, 4], &weights(4, 4, 2)),
    )
}

/// The token-wise layers run on packed rows: a `pack_rows` for each term of the embedding sum
/// (the per-position one gives each token its position's row), `attention_packed` reading the
/// raw mask, one `unpack_rows` for the output.
#[test]
fn pack_tokens_packs_the_encoder_layers() {
    let (snap, changed, _, after, report) =
        one_pass(&PackTokens, &encoder_layer("output \"y\" = %15\n"));
    assert!(changed);
    let t = print(&after);
    assert_eq!(count(&after, "pack_rows"), 2, "{t}");
    assert_eq!(count(&after, "unpack_rows"), 1, "{t}");
    assert_eq!(count(&after, "attention_packed"), 1, "{t}");
    assert!(t.contains(": f32[1,packed_tokens,4]  # embed\n"), "{t}");
    assert!(t.contains(": f32[1,packed_tokens,12]  # qkv"), "{t}");
    assert!(t.contains("unpack_rows(%"), "{t}");
    assert!(has_note(
        &report,
        NoteKind::Fired,
        "attn",
        "5 ops run on the real tokens"
    ));
    insta::assert_snapshot!(snap);
    // Once packed, the pass has nothing left to do.
    let mut again = after.clone();
    assert!(!step(&PackTokens, &mut again, &mut PassContext::default()));

    // A row per position is taken by broadcasting elementwise ops only: a LayerNorm whose
    // scale varies by position stays padded (the packing starts after it).
    let position_gamma = encoder_layer("output \"y\" = %15\n").replace(
        "layer_norm[axis=-1, epsilon=1e-12](%3, %4, %5)",
        "layer_norm[axis=-1, epsilon=1e-12](%3, %2, %5)",
    );
    let (_, changed, _, after, _) = one_pass(&PackTokens, &position_gamma);
    assert!(changed);
    let t = print(&after);
    assert!(t.contains(": f32[B,S,4]  # embed/ln\n"), "{t}");
    assert!(t.contains(": f32[1,packed_tokens,12]  # qkv"), "{t}");

    // A mask reshaped to [B, 1, 1, S] with dims read from another input (dynamo exports read
    // them from `input_ids`) is still computed from the mask alone: `Shape` reads no data.
    let dims_from_x = encoder_layer("output \"y\" = %15\n").replace(
        "%9 = unsqueeze[axes=[1, 2]](%1) : i64[B,1,1,S]",
        "%30 = shape[start=0, end=1](%0) : i64[1]\n\
         %31 = const[value=i64[2]{1, 1}] : i64[2]\n\
         %32 = shape[start=1, end=2](%0) : i64[1]\n\
         %33 = concat[axis=0](%30, %31, %32) : i64[4]\n\
         %9 = reshape[allowzero=false](%1, %33) : i64[B,1,1,S]",
    );
    let (_, changed, _, after, _) = one_pass(&PackTokens, &dims_from_x);
    assert!(changed);
    assert_eq!(count(&after, "attention_packed"), 1, "{}", print(&after));
}

/// Embedding lookups by the tokens' ids run on the real tokens: the ids are packed (`i64[1,
/// packed_tokens]`) and the lookup makes packed rows, while what computes the ids (XLM-R's
/// positions: a cumulative sum over the padded row) stays padded; the same for a lookup whose
/// ids are one row per position, broadcast over the batch.
#[test]
fn pack_tokens_packs_embedding_lookups() {
    let lookups = encoder_layer("output \"y\" = %15\n").replace(
        "%0 = input[name=\"x\"] : f32[B,S,4]\n",
        &format!(
            "%40 = input[name=\"ids\"] : i64[B,S]\n\
             %41 = const[value=i64[]{{1}}] : i64[]\n\
             %42 = add(%40, %41) : i64[B,S]  # ids/shift\n\
             %43 = {}  # word/table\n\
             %0 = gather[axis=0](%43, %42) : f32[B,S,4]  # word\n",
            f32_const(&[6, 4], &weights(6, 4, 4))
        ),
    );
    let (snap, changed, _, after, _) = one_pass(&PackTokens, &lookups);
    assert!(changed);
    let t = print(&after);
    assert!(t.contains(": f32[1,packed_tokens,4]  # word\n"), "{t}");
    assert!(
        t.contains(": i64[1,packed_tokens]  # ids/shift/pack_rows"),
        "{t}"
    );
    assert!(t.contains(": i64[B,S]  # ids/shift\n"), "{t}");
    assert!(
        t.contains(": f32[1,packed_tokens,4]  # pos/pack_rows"),
        "{t}"
    );
    assert_eq!(count(&after, "pack_rows"), 2, "{t}");
    insta::assert_snapshot!(snap);
}

/// The batch stays padded, and the report says why, when a later op may combine tokens (a
/// mean over the sequence: the zeros left at the padding would change it) or when the mask
/// bias is not computed from one `[B, S]` input.
#[test]
fn pack_tokens_declines() {
    let mean = "%16 = reduce_mean[axes=[1], keepdims=false](%15) : f32[B,4]  # pool\n\
                output \"y\" = %16\n";
    let (snap, changed, _, _, report) = one_pass(&PackTokens, &encoder_layer(mean));
    assert!(!changed);
    assert!(has_note(
        &report,
        NoteKind::Declined,
        "pool",
        "`reduce_mean` after the token-wise layers"
    ));
    insta::assert_snapshot!("pack_tokens_declines_mixing_reader", snap);

    let two_masks =
        encoder_layer("output \"y\" = %15\n").replace("%12 = mul(%10, %11)", "%12 = mul(%10, %2)");
    let (_, changed, _, _, report) = one_pass(&PackTokens, &two_masks);
    assert!(!changed);
    let not_per_key = encoder_layer("output \"y\" = %15\n")
        .replace(
            "unsqueeze[axes=[1, 2]](%1) : i64[B,1,1,S]",
            "unsqueeze[axes=[1]](%1) : i64[B,1,S]",
        )
        .replace("f32[B,1,1,S]", "f32[B,1,S]");
    let (_, changed, _, _, r2) = one_pass(&PackTokens, &not_per_key);
    assert!(!changed);
    assert!(
        has_note(&r2, NoteKind::Declined, "attn", "not one value per key"),
        "{}",
        notes(&r2)
    );
    assert!(has_note(
        &report,
        NoteKind::Declined,
        "attn",
        "not computed from exactly one graph input"
    ));
}

/// `QuantizeAttention` gives an attention int8 products when asked (and only then), leaves one
/// named in keep-fp32 and says so, and the mark survives packing into `attention_packed` and
/// the text form.
#[test]
fn quantize_attention_marks_attention_ops() {
    let text = encoder_layer("output \"y\" = %15\n");
    let (_, changed, _, _, _) = one_pass(&QuantizeAttention, &text);
    assert!(!changed, "f32 unless the options ask for int8");

    let mut g = typed(&text);
    let before = print(&g);
    let mut ctx = PassContext::default();
    ctx.quant.attention = AttnProducts::Int8;
    assert!(step(&QuantizeAttention, &mut g, &mut ctx));
    let marked = print(&g);
    assert!(
        marked.contains("attention_qkv[num_heads=2, scale=0.5, products=\"int8\"](%"),
        "{marked}"
    );
    assert!(has_note(&ctx.report, NoteKind::Fired, "attn", "in int8"));
    assert!(!step(&QuantizeAttention, &mut g, &mut ctx), "a fixpoint");
    assert!(step(&PackTokens, &mut g, &mut PassContext::default()));
    let packed = print(&g);
    assert!(
        packed.contains("attention_packed[num_heads=2, scale=0.5, products=\"int8\"](%"),
        "{packed}"
    );
    assert_eq!(
        print(&parse(&packed)),
        packed,
        "the text form keeps the mark"
    );
    let snap = snapshot(
        &before,
        &[("QuantizeAttention", marked), ("PackTokens", packed)],
        &ctx.report,
    );
    insta::assert_snapshot!(snap);

    let mut kept = typed(&text);
    let mut ctx = PassContext::default();
    ctx.quant.attention = AttnProducts::Int8;
    ctx.quant.keep_fp32 = vec!["attn".into()];
    assert!(!step(&QuantizeAttention, &mut kept, &mut ctx));
    assert!(has_note(
        &ctx.report,
        NoteKind::Declined,
        "attn",
        "keep-fp32"
    ));
}

/// An int8-products attention reading a QKV `qlinear` alone takes q and k quantized per head
/// from its epilogue (`quant_heads`, three outputs), and packing keeps the split form, with the
/// mask bias after the three. An f32 QKV GEMM, or a QKV output with another reader, keeps the
/// quantization in attention, and the report says why. (The numeric check, bit-equal results
/// on the real kernels, is `runtime/tests/qkv_merge.rs` and `padding_free.rs`: this crate's
/// interpreter has no attention_qkv.)
#[test]
fn fuse_epilogue_quantizes_heads_for_int8_attention() {
    let layer = |qkv: &str, extra_output: &str| {
        format!(
            "%0 = input[name=\"x\"] : f32[B,S,4]\n\
             %1 = input[name=\"mask\"] : i64[B,S]\n\
             %2 = const[value=i8[4,12]{{{}}}] : i8[4,12]  # qkv/weight_s8\n\
             %3 = {}  # qkv/weight_scale\n\
             %4 = {}  # qkv/bias\n\
             %5 = {qkv} : f32[B,S,12]  # qkv\n\
             %9 = unsqueeze[axes=[1, 2]](%1) : i64[B,1,1,S]  # mask/unsqueeze\n\
             %10 = cast[to=f32](%9) : f32[B,1,1,S]  # mask/cast\n\
             %11 = const[value=f32[]{{-10000.0}}] : f32[]  # mask/big\n\
             %12 = mul(%10, %11) : f32[B,1,1,S]  # mask/bias\n\
             %13 = attention_qkv[num_heads=2, scale=0.5, products=\"int8\"](%5, %12) : f32[B,S,4]  # attn\n\
             output \"y\" = %13\n{extra_output}",
            (0..48)
                .map(|i: i32| (i * 37 % 255 - 127).to_string())
                .collect::<Vec<_>>()
                .join(", "),
            f32_const(&[12], &weights(1, 12, 3).iter().map(|w| w.abs() * 0.01 + 0.001).collect::<Vec<_>>()),
            f32_const(&[12], &weights(1, 12, 4)),
        )
    };
    let qlinear = "qlinear[act=\"token\", smooth=false, epilogue=(bias)](%0, %2, %3, %4)";
    let mut g = typed(&layer(qlinear, ""));
    let before = print(&g);
    let mut ctx = PassContext::default();
    assert!(step(&FuseEpilogue, &mut g, &mut ctx));
    let fused = print(&g);
    let qkv_line = fused.lines().find(|l| l.ends_with("# qkv")).expect("qkv");
    assert!(
        qkv_line.contains("epilogue=(bias, quant_heads 2)](%0, %")
            && qkv_line.ends_with(" : (u8[B,S,8], f32[B,S,4], f32[B,S,4])  # qkv"),
        "{fused}"
    );
    // The weight, its scales and the bias with their columns head by head: q, k, v of head 0
    // (columns 0-1, 4-5, 8-9 of q | k | v), then of head 1 (2-3, 6-7, 10-11).
    let order = [0usize, 1, 4, 5, 8, 9, 2, 3, 6, 7, 10, 11];
    let bias = weights(1, 12, 4);
    let by_head: Vec<f32> = order.iter().map(|&c| bias[c]).collect();
    let bias_line = fused
        .lines()
        .find(|l| l.ends_with("# qkv/bias_by_head"))
        .expect("the reordered bias");
    assert!(
        bias_line.ends_with(&format!(
            " = {}  # qkv/bias_by_head",
            f32_const(&[12], &by_head)
        )),
        "{bias_line}"
    );
    let w: Vec<i32> = (0..48).map(|i: i32| i * 37 % 255 - 127).collect();
    let w_by_head: Vec<String> = (0..48)
        .map(|i| w[i / 12 * 12 + order[i % 12]].to_string())
        .collect();
    assert!(
        fused.contains(&format!(
            "const[value=i8[4,12]{{{}}}] : i8[4,12]  # qkv/weight_by_head",
            w_by_head.join(", ")
        )),
        "{fused}"
    );
    assert!(fused.contains("# qkv/weight_scale_by_head"), "{fused}");
    let attn = fused.lines().find(|l| l.ends_with("# attn")).expect("attn");
    assert!(attn.contains(".1, %") && attn.contains(".2, %"), "{fused}");
    assert!(has_note(
        &ctx.report,
        NoteKind::Fired,
        "qkv",
        "quant_heads 2"
    ));
    assert!(!step(&FuseEpilogue, &mut g, &mut ctx), "a fixpoint");
    assert!(step(&PackTokens, &mut g, &mut ctx));
    let packed = print(&g);
    let attn = packed
        .lines()
        .find(|l| l.ends_with("# attn"))
        .expect("attn");
    assert!(
        attn.contains("attention_packed[num_heads=2, scale=0.5, products=\"int8\"](%")
            && attn.contains(".2, %1, %"),
        "{packed}"
    );
    assert!(
        packed.contains(
            ": (u8[1,packed_tokens,8], f32[1,packed_tokens,4], f32[1,packed_tokens,4])  # qkv"
        ),
        "{packed}"
    );
    assert_eq!(print(&parse(&packed)), packed, "the text form round-trips");
    insta::assert_snapshot!(snapshot(
        &before,
        &[("FuseEpilogue", fused), ("PackTokens", packed)],
        &ctx.report
    ));

    // Each of these keeps the quantization in attention, and the report says why.
    let declines = |text: &str, why: &str| {
        let (_, _, _, after, report) = one_pass(&FuseEpilogue, text);
        assert!(!print(&after).contains("quant_heads"), "{why}");
        assert!(
            has_note(&report, NoteKind::Declined, "attn", why),
            "{}",
            notes(&report)
        );
    };
    let f32_qkv = "fused_linear[epilogue=(bias)](%0, %6, %4)";
    let text = layer(f32_qkv, "").replace(
        "%5 = fused",
        &format!(
            "%6 = {}  # qkv/weight\n%5 = fused",
            f32_const(&[4, 12], &weights(4, 12, 5))
        ),
    );
    declines(&text, "the f32 GEMM writes f32 only");

    // A bias the pass cannot reorder head by head (a graph input).
    let text = layer(qlinear, "").replace(
        &format!("%4 = {}  # qkv/bias", f32_const(&[12], &weights(1, 12, 4))),
        "%4 = input[name=\"b\"] : f32[12]  # qkv/bias",
    );
    assert!(text.contains("input[name=\"b\"]"), "{text}");
    declines(
        &text,
        "cannot go head by head: its bias is not a constant f32 vector of 12",
    );

    // An epilogue step whose operand is not per column (a residual).
    let with_residual =
        "qlinear[act=\"token\", smooth=false, epilogue=(bias, residual)](%0, %2, %3, %4, %6)";
    let text = layer(with_residual, "").replace(
        "%5 = qlinear",
        "%6 = input[name=\"r\"] : f32[B,S,12]\n%5 = qlinear",
    );
    declines(&text, "its epilogue step `residual` is not reordered");

    declines(&layer(qlinear, "output \"qkv\" = %5\n"), "other readers");
}

/// A static output projection reading attention alone moves its quantization into the
/// attention (`out_u8`, its SmoothQuant factors the attention's last input), as
/// `requant_into_producer` moves one into a GEMM; packing keeps the attributes and the factors
/// after the mask and its bias. An attention output read elsewhere too keeps its f32 output,
/// and the report says why; a dynamic projection is no candidate. (The numeric check, bit-equal
/// results on the real kernels, is `runtime/tests/qkv_merge.rs`.)
#[test]
fn fuse_epilogue_moves_output_quantization_into_attention() {
    let layer = |projection: &str, extra_output: &str| {
        format!(
            "%0 = input[name=\"qkv\"] : f32[B,S,12]\n\
             %1 = input[name=\"mask\"] : i64[B,S]\n\
             %2 = unsqueeze[axes=[1, 2]](%1) : i64[B,1,1,S]  # mask/unsqueeze\n\
             %3 = cast[to=f32](%2) : f32[B,1,1,S]  # mask/cast\n\
             %4 = const[value=f32[]{{-10000.0}}] : f32[]  # mask/big\n\
             %5 = mul(%3, %4) : f32[B,1,1,S]  # mask/bias\n\
             %6 = attention_qkv[num_heads=2, scale=0.5, products=\"int8\"](%0, %5) : f32[B,S,4]  # attn\n\
             %7 = const[value=i8[4,4]{{{}}}] : i8[4,4]  # out/weight_s8\n\
             %8 = {}  # out/weight_scale\n\
             %9 = {}  # out/smooth\n\
             %10 = {}  # out/bias\n\
             %11 = {projection} : f32[B,S,4]  # out\n\
             output \"y\" = %11\n{extra_output}",
            (0..16)
                .map(|i: i32| (i * 37 % 255 - 127).to_string())
                .collect::<Vec<_>>()
                .join(", "),
            f32_const(&[4], &[0.002, 0.004, 0.003, 0.001]),
            f32_const(&[4], &[0.5, 2.0, 1.25, 0.75]),
            f32_const(&[4], &[0.5, -0.75, 0.125, 1.0]),
        )
    };
    let projection = "qlinear[act=\"static\", a_scale=0.02, a_zero=131, smooth=true, epilogue=(bias)](%6, %7, %8, %9, %10)";
    let mut g = typed(&layer(projection, ""));
    let before = print(&g);
    let mut ctx = PassContext::default();
    assert!(step(&FuseEpilogue, &mut g, &mut ctx));
    let fused = print(&g);
    let line = |text: &str, name: &str| -> String {
        text.lines()
            .find(|l| l.ends_with(&format!("# {name}")))
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
            .to_string()
    };
    let attn = line(&fused, "attn");
    assert!(
        attn.contains("out_scale=0.02, out_zero=131, out_smooth=true](%0, %")
            && attn.ends_with(") : u8[B,S,4]  # attn"),
        "{fused}"
    );
    assert!(
        line(&fused, "out").contains("smooth=false, epilogue=(bias)]("),
        "{fused}"
    );
    assert!(has_note(
        &ctx.report,
        NoteKind::Fired,
        "attn",
        "quantization of `out` → u8 output"
    ));
    assert!(!step(&FuseEpilogue, &mut g, &mut ctx), "a fixpoint");
    assert!(step(&PackTokens, &mut g, &mut ctx));
    let packed = print(&g);
    let attn = line(&packed, "attn");
    assert!(
        attn.contains("attention_packed[num_heads=2, scale=0.5, products=\"int8\", out_scale=0.02, out_zero=131, out_smooth=true](%")
            && attn.contains(", %1, %")
            && attn.ends_with(") : u8[1,packed_tokens,4]  # attn"),
        "{packed}"
    );
    assert_eq!(print(&parse(&packed)), packed, "the text form round-trips");
    insta::assert_snapshot!(snapshot(
        &before,
        &[("FuseEpilogue", fused), ("PackTokens", packed)],
        &ctx.report
    ));

    // Without SmoothQuant factors: no factors input.
    let unsmoothed = "qlinear[act=\"static\", a_scale=0.02, a_zero=131, smooth=false, epilogue=(bias)](%6, %7, %8, %10)";
    let (_, changed, _, after, _) = one_pass(&FuseEpilogue, &layer(unsmoothed, ""));
    assert!(changed);
    let attn = line(&print(&after), "attn");
    assert!(
        attn.contains("out_smooth=false](%0, %") && attn.ends_with(") : u8[B,S,4]  # attn"),
        "{attn}"
    );

    let (_, _, _, after, report) =
        one_pass(&FuseEpilogue, &layer(projection, "output \"attn\" = %6\n"));
    assert!(!print(&after).contains("out_scale"));
    assert!(
        has_note(
            &report,
            NoteKind::Declined,
            "out",
            "its output has other readers"
        ),
        "{}",
        notes(&report)
    );

    let dynamic = "qlinear[act=\"token\", smooth=true, epilogue=(bias)](%6, %7, %8, %9, %10)";
    let (_, _, _, after, _) = one_pass(&FuseEpilogue, &layer(dynamic, ""));
    assert!(!print(&after).contains("out_scale"));
}

//! Each pass on small graphs written in the IR text form: snapshots of the dump before and
//! after, plus the property each test is about.

mod common;

use std::collections::HashMap;

use ir::{DType, Op, Tensor};
use passes::{
    ConstantFolding, DeadCodeElimination, Pass, RecognizeAttention, RecognizeGelu,
    RecognizeLayerNorm, RecognizeLinear, ShapeInference,
};

fn parse(text: &str) -> ir::Graph {
    ir::text::parse(text, None).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn print(g: &ir::Graph) -> String {
    ir::text::print(g).unwrap()
}

/// Runs `pass` (after shape inference, which every recognizer needs) and returns the dump
/// before and after, and whether the pass changed the graph. When it did, also checks that
/// the graph computes the same before and after (see [`same_numbers`]).
fn before_after(pass: &dyn Pass, text: &str) -> (String, bool, ir::Graph) {
    let mut g = parse(text);
    ShapeInference
        .run(&mut g, &mut passes::PassContext::default())
        .unwrap();
    let before = print(&g);
    let changed = pass
        .run(&mut g, &mut passes::PassContext::default())
        .unwrap_or_else(|e| panic!("{e}"));
    g.verify().unwrap();
    DeadCodeElimination
        .run(&mut g, &mut passes::PassContext::default())
        .unwrap();
    let after = print(&g);
    if changed {
        same_numbers(pass, text);
    }
    (
        format!("--- before\n{before}--- after {}\n{after}", pass.name()),
        changed,
        g,
    )
}

struct Lcg(u64);

impl Lcg {
    fn unit(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// Gives every constant without data (`{extern}`) random data, runs `pass`, and compares
/// the test interpreter's outputs before and after on random inputs (symbols bound to small
/// sizes): max abs difference ≤ 1e-4.
fn same_numbers(pass: &dyn Pass, text: &str) {
    let mut rng = Lcg(7);
    let mut g = parse(text);
    let ids: Vec<_> = g.node_ids().collect();
    for id in ids {
        if let Op::Const { value } = &g.node(id).op {
            if !value.has_data() {
                let shape = value.shape().to_vec();
                let t = match value.dtype() {
                    DType::F32 => {
                        Tensor::from_vec(shape, (0..value.len()).map(|_| rng.unit()).collect())
                    }
                    DType::I64 => Tensor::from_vec(
                        shape,
                        (0..value.len())
                            .map(|_| (rng.unit() * 8.0 + 8.0) as i64)
                            .collect::<Vec<i64>>(),
                    ),
                    d => panic!("no random data for {d}"),
                };
                g.node_mut(id).op = Op::Const { value: t };
            }
        }
    }
    ShapeInference
        .run(&mut g, &mut passes::PassContext::default())
        .unwrap();
    let before = g.clone();
    pass.run(&mut g, &mut passes::PassContext::default())
        .unwrap();
    let sizes = HashMap::from([("B", 2), ("batch", 2), ("S", 5), ("sequence", 5)]);
    let mut feeds = HashMap::new();
    for &id in before.inputs() {
        let Op::Input { name } = &before.node(id).op else {
            unreachable!()
        };
        let ty = &before.node(id).outputs[0];
        let shape: Vec<usize> = ty
            .shape
            .as_ref()
            .unwrap()
            .iter()
            .map(|d| {
                let syms: usize = d
                    .symbols()
                    .iter()
                    .map(|s| sizes.get(s.as_str()).copied().unwrap_or(3))
                    .product();
                syms * d.coeff() as usize
            })
            .collect();
        let n = shape.iter().product::<usize>();
        let t = match ty.dtype {
            DType::F32 => Tensor::from_vec(shape, (0..n).map(|_| 2.0 * rng.unit()).collect()),
            DType::I64 => Tensor::from_vec(
                shape,
                (0..n)
                    .map(|_| i64::from(rng.unit() > -0.5))
                    .collect::<Vec<i64>>(),
            ),
            DType::Bool => Tensor::from_vec(shape, (0..n).map(|_| rng.unit() > 0.0).collect()),
            d => panic!("input dtype {d}"),
        };
        feeds.insert(name.clone(), t);
    }
    let run = |g: &ir::Graph| {
        common::interp::run(g, &feeds).unwrap_or_else(|e| panic!("{e}\n{}", print(g)))
    };
    let (a, b) = (run(&before), run(&g));
    assert!(!a.is_empty());
    for (name, x) in &a {
        let (x, y) = (x.to_f32_vec().unwrap(), b[name].to_f32_vec().unwrap());
        assert_eq!(x.len(), y.len(), "{name}");
        let err = x
            .iter()
            .zip(&y)
            .map(|(p, q)| (p - q).abs())
            .fold(0.0f32, f32::max);
        assert!(
            err <= 1e-4,
            "{}: output {name} differs by {err} after the pass",
            pass.name()
        );
    }
}

fn count(g: &ir::Graph, op: &str) -> usize {
    g.node_ids()
        .filter(|&id| g.node(id).op.name() == op)
        .count()
}

const RESHAPE_CHAIN: &str = "\
%0 = input[name=\"x\"] : f32[batch,sequence,128]
%1 = shape[start=0](%0) : i64[*]
%2 = const[value=i64[]{0}] : i64[]
%3 = gather[axis=0](%1, %2) : i64[*]
%4 = shape[start=0](%0) : i64[*]
%5 = const[value=i64[]{1}] : i64[]
%6 = gather[axis=0](%4, %5) : i64[*]
%7 = unsqueeze[axes=[0]](%3) : i64[*]
%8 = unsqueeze[axes=[0]](%6) : i64[*]
%9 = const[value=i64[1]{4}] : i64[1]
%10 = const[value=i64[1]{32}] : i64[1]
%11 = concat[axis=0](%7, %8, %9, %10) : i64[*]
%12 = reshape[allowzero=false](%0, %11) : f32[*]
%13 = transpose[perm=[0, 2, 1, 3]](%12) : f32[*]
%14 = mul(%7, %8) : i64[*]
%15 = const[value=i64[1]{-1}] : i64[1]
%16 = concat[axis=0](%14, %15) : i64[*]
%17 = reshape[allowzero=false](%0, %16) : f32[*]
output \"heads\" = %13
output \"flat\" = %17
";

#[test]
fn shape_inference_reshape_target_from_shape_arithmetic() {
    let (snap, changed, g) = before_after(&ShapeInference, RESHAPE_CHAIN);
    assert!(
        !changed,
        "the setup already ran it: a second run must be a no-op"
    );
    let text = print(&g);
    assert!(text.contains(": f32[batch,sequence,4,32]"), "{text}");
    assert!(text.contains(": f32[batch,4,sequence,32]"), "{text}");
    assert!(text.contains(": f32[batch*sequence,128]"), "{text}");
    insta::assert_snapshot!(snap);
}

#[test]
fn shape_inference_ops() {
    let text = "\
%0 = input[name=\"a\"] : f32[B,1,S]
%1 = input[name=\"b\"] : f32[4,1]
%2 = add(%0, %1) : f32[*]
%3 = input[name=\"w\"] : f32[S,8]
%4 = matmul(%0, %3) : f32[*]
%5 = const[value=i64[1]{1}] : i64[1]
%6 = const[value=i64[1]{1000}] : i64[1]
%7 = const[value=i64[1]{2}] : i64[1]
%8 = slice(%4, %5, %6, %7) : f32[*]
%9 = reduce_mean[axes=[-1], keepdims=true](%4) : f32[*]
%10 = concat[axis=2](%4, %4) : f32[*]
%11 = flatten[axis=1](%4) : f32[*]
%12 = const[value=i64[2]{0, 2}] : i64[2]
%13 = gather[axis=2](%4, %12) : f32[*]
%14 = equal(%0, %0) : bool[*]
%15 = where(%14, %0, %1) : f32[*]
%16 = dynamic_quantize_linear(%4) : (u8[*], f32[*], u8[*])
%17 = const[value=f32[8,3]{extern}] : f32[8,3]
%18 = linear(%4, %17) : f32[*]
%19 = input[name=\"c\"] : f32[P,Q]
%20 = add(%0, %19) : f32[*]
output \"o2\" = %2
output \"o8\" = %8
output \"o9\" = %9
output \"o10\" = %10
output \"o11\" = %11
output \"o13\" = %13
output \"o15\" = %15
output \"o16\" = %16
output \"o16b\" = %16.1
output \"o18\" = %18
output \"o20\" = %20
";
    let (snap, _, g) = before_after(&ShapeInference, text);
    let text = print(&g);
    assert!(text.contains("add(%0, %1) : f32[B,4,S]"), "{text}");
    // Two different symbols broadcast to a fresh one, never to either guess.
    assert!(text.contains("add(%0, %19) : f32[B,P,unk0]"), "{text}");
    insta::assert_snapshot!(snap);
}

/// `arange(S)` of a dim read from a shape has `S` elements (MPNet's relative positions);
/// another start or step gives a fresh symbol, never a guess.
#[test]
fn shape_inference_range_of_a_dim() {
    let mut g = parse(
        "%0 = input[name=\"x\"] : f32[B,S,4]\n\
         %1 = shape[start=1, end=2](%0) : i64[1]\n\
         %2 = const[value=i64[1]{0}] : i64[1]\n\
         %3 = squeeze[axes=[0]](%1) : i64[]\n\
         %4 = const[value=i64[]{0}] : i64[]\n\
         %5 = const[value=i64[]{1}] : i64[]\n\
         %6 = range(%4, %3, %5) : i64[*]\n\
         %7 = const[value=i64[]{2}] : i64[]\n\
         %8 = range(%4, %3, %7) : i64[*]\n\
         output \"r\" = %6\n\
         output \"r2\" = %8\n",
    );
    ShapeInference
        .run(&mut g, &mut passes::PassContext::default())
        .unwrap();
    let text = print(&g);
    assert!(text.contains("range(%4, %3, %5) : i64[S]"), "{text}");
    assert!(text.contains("range(%4, %3, %7) : i64[unk"), "{text}");
}

#[test]
fn shape_inference_rejects_inconsistent_matmul() {
    let mut g = parse(
        "%0 = input[name=\"x\"] : f32[B,128]\n\
         %1 = const[value=f32[64,8]{extern}] : f32[64,8]\n\
         %2 = matmul(%0, %1) : f32[*]  # /layer/MatMul\n\
         output \"y\" = %2\n",
    );
    let err = ShapeInference
        .run(&mut g, &mut passes::PassContext::default())
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "ShapeInference on node /layer/MatMul: matmul: inner dims 128 and 64 differ"
    );
}

#[test]
fn shape_inference_rejects_bad_reshape() {
    let mut g = parse(
        "%0 = input[name=\"x\"] : f32[2,6]\n\
         %1 = const[value=i64[2]{5, -1}] : i64[2]\n\
         %2 = reshape[allowzero=false](%0, %1) : f32[*]  # /x/Reshape\n\
         output \"y\" = %2\n",
    );
    let err = ShapeInference
        .run(&mut g, &mut passes::PassContext::default())
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "ShapeInference on node /x/Reshape: cannot reshape 12 elements into a multiple of 5"
    );
}

#[test]
fn constant_folding_reshape_targets() {
    let (snap, changed, g) = before_after(&ConstantFolding, RESHAPE_CHAIN);
    assert!(changed);
    let text = print(&g);
    assert!(text.contains("i64[4]{0, 0, 4, 32}"), "{text}");
    assert!(text.contains("i64[2]{-1, 128}"), "{text}");
    assert_eq!(count(&g, "shape"), 0, "{text}");
    insta::assert_snapshot!(snap);
}

#[test]
fn constant_folding_arithmetic_and_fixed_shapes() {
    let text = "\
%0 = input[name=\"x\"] : f32[2,3]
%1 = shape[start=0](%0) : i64[*]
%2 = const[value=i64[]{2}] : i64[]
%3 = mul(%1, %2) : i64[*]
%4 = constant_of_shape[value=f32[1]{0.5}](%3) : f32[*]
%5 = const[value=f32[2]{1.0, 4.0}] : f32[2]
%6 = sqrt(%5) : f32[*]
%7 = const[value=bool[]{false}] : bool[]
%8 = where(%7, %5, %6) : f32[*]
%9 = const[value=f32[3,2]{1.0, 2.0, 3.0, 4.0, 5.0, 6.0}] : f32[3,2]
%10 = transpose[perm=[1, 0]](%9) : f32[*]
%11 = add(%0, %10) : f32[*]
output \"a\" = %4
output \"b\" = %8
output \"c\" = %11
";
    let (snap, _, g) = before_after(&ConstantFolding, text);
    let text = print(&g);
    assert!(
        text.contains("const[value=f32[4,6]{0.5, 0.5,"),
        "constant_of_shape folded: {text}"
    );
    assert!(
        text.contains("const[value=f32[2]{1.0, 2.0}]"),
        "sqrt folded, where picked it: {text}"
    );
    assert!(
        text.contains("f32[2,3]{1.0, 3.0, 5.0, 2.0, 4.0, 6.0}"),
        "transpose folded: {text}"
    );
    insta::assert_snapshot!(snap);
}

#[test]
fn constant_folding_leaves_big_computations() {
    let mut g = parse(
        "%0 = const[value=f32[100,100]{extern}] : f32[100,100]\n\
         %1 = neg(%0) : f32[*]\n\
         output \"y\" = %1\n",
    );
    ShapeInference
        .run(&mut g, &mut passes::PassContext::default())
        .unwrap();
    assert!(!ConstantFolding
        .run(&mut g, &mut passes::PassContext::default())
        .unwrap());
    assert_eq!(count(&g, "neg"), 1);
}

#[test]
fn constant_folding_shape_runs_of_inputs_and_expand() {
    let text = "\
%0 = input[name=\"ids\"] : i64[batch,sequence]
%1 = shape[start=0](%0) : i64[*]
%2 = const[value=i64[]{1}] : i64[]
%3 = gather[axis=0](%1, %2) : i64[*]
%4 = unsqueeze[axes=[0]](%3) : i64[*]
%5 = const[value=i64[1,128]{extern}] : i64[1,128]
%6 = const[value=i64[1]{0}] : i64[1]
%7 = const[value=i64[1]{1}] : i64[1]
%8 = slice(%5, %6, %4, %7, %7) : i64[*]
%9 = input[name=\"m\"] : f32[batch,1,1,sequence]
%10 = const[value=i64[]{0}] : i64[]
%11 = gather[axis=0](%1, %10) : i64[*]
%12 = unsqueeze[axes=[0]](%11) : i64[*]
%13 = const[value=i64[2]{1, 1}] : i64[2]
%14 = concat[axis=0](%12, %13, %4) : i64[*]
%15 = expand(%9, %14) : f32[*]
output \"positions\" = %8
output \"mask\" = %15
";
    let (snap, _, g) = before_after(&ConstantFolding, text);
    let text = print(&g);
    assert!(
        text.contains("shape[start=1, end=2](%0) : i64[1]"),
        "{text}"
    );
    assert_eq!(count(&g, "expand"), 0, "a no-op expand goes: {text}");
    insta::assert_snapshot!(snap);
}

#[test]
fn dead_code_elimination() {
    let text = "\
%0 = input[name=\"x\"] : f32[4]
%1 = input[name=\"unused\"] : f32[4]
%2 = neg(%0) : f32[4]
%3 = exp(%2) : f32[4]
%4 = relu(%0) : f32[4]
output \"y\" = %4
";
    let (snap, changed, g) = before_after(&DeadCodeElimination, text);
    assert!(changed);
    assert_eq!(g.node_count(), 3, "both inputs stay, neg and exp go");
    insta::assert_snapshot!(snap);
}

#[test]
fn linear_matmul_add_both_orders_and_no_bias() {
    let text = "\
%0 = input[name=\"x\"] : f32[B,S,4]
%1 = const[value=f32[4,3]{extern}] : f32[4,3]
%2 = const[value=f32[3]{0.1, 0.2, 0.3}] : f32[3]
%3 = matmul(%0, %1) : f32[*]
%4 = add(%2, %3) : f32[*]
%11 = const[value=f32[3,3]{extern}] : f32[3,3]
%5 = matmul(%4, %11) : f32[*]
%6 = add(%5, %2) : f32[*]
%7 = const[value=f32[3,2]{extern}] : f32[3,2]
%8 = matmul(%6, %7) : f32[*]
%9 = input[name=\"w\"] : f32[3,2]
%10 = matmul(%6, %9) : f32[*]
output \"y\" = %8
output \"z\" = %10
";
    let (snap, _, g) = before_after(&RecognizeLinear, text);
    assert_eq!(count(&g, "linear"), 3);
    assert_eq!(
        count(&g, "matmul"),
        1,
        "a non-constant weight stays a matmul"
    );
    assert_eq!(count(&g, "add"), 0);
    insta::assert_snapshot!(snap);
}

#[test]
fn linear_from_gemm_trans_b() {
    let text = "\
%0 = input[name=\"x\"] : f32[B,3]
%1 = const[value=f32[2,3]{1.0, 2.0, 3.0, 4.0, 5.0, 6.0}] : f32[2,3]
%2 = const[value=f32[2]{0.5, -0.5}] : f32[2]
%3 = gemm[alpha=1.0, beta=1.0, trans_a=false, trans_b=true](%0, %1, %2) : f32[*]
output \"y\" = %3
";
    let (snap, _, g) = before_after(&RecognizeLinear, text);
    let t = print(&g);
    assert!(
        t.contains("const[value=f32[3,2]{1.0, 4.0, 2.0, 5.0, 3.0, 6.0}]"),
        "{t}"
    );
    assert_eq!(count(&g, "gemm"), 0);
    insta::assert_snapshot!(snap);
}

const LAYER_NORM_POW: &str = "\
%0 = input[name=\"x\"] : f32[B,S,4]
%1 = reduce_mean[axes=[-1], keepdims=true](%0) : f32[*]
%2 = sub(%0, %1) : f32[*]
%3 = const[value=f32[]{2.0}] : f32[]
%4 = pow(%2, %3) : f32[*]
%5 = reduce_mean[axes=[-1], keepdims=true](%4) : f32[*]
%6 = const[value=f32[]{1e-12}] : f32[]
%7 = add(%5, %6) : f32[*]
%8 = sqrt(%7) : f32[*]
%9 = div(%2, %8) : f32[*]
%10 = const[value=f32[4]{1.0, 2.0, 3.0, 4.0}] : f32[4]
%11 = mul(%9, %10) : f32[*]
%12 = const[value=f32[4]{0.1, 0.2, 0.3, 0.4}] : f32[4]
%13 = add(%11, %12) : f32[*]
output \"y\" = %13
";

#[test]
fn layer_norm_decomposed_with_pow() {
    let (snap, _, g) = before_after(&RecognizeLayerNorm, LAYER_NORM_POW);
    assert_eq!(g.node_count(), 4, "{}", print(&g));
    assert!(print(&g).contains("layer_norm[axis=-1, epsilon=1e-12](%0, %1, %2) : f32[B,S,4]"));
    insta::assert_snapshot!(snap);
}

#[test]
fn layer_norm_decomposed_with_mul_and_two_subs() {
    let text = "\
%0 = input[name=\"x\"] : f32[B,4]
%1 = reduce_mean[axes=[1], keepdims=true](%0) : f32[*]
%2 = sub(%0, %1) : f32[*]
%3 = mul(%2, %2) : f32[*]
%4 = reduce_mean[axes=[-1], keepdims=true](%3) : f32[*]
%5 = const[value=f32[]{1e-5}] : f32[]
%6 = add(%5, %4) : f32[*]
%7 = sqrt(%6) : f32[*]
%8 = sub(%0, %1) : f32[*]
%9 = div(%8, %7) : f32[*]
output \"y\" = %9
";
    let (snap, _, g) = before_after(&RecognizeLayerNorm, text);
    assert_eq!(count(&g, "layer_norm"), 1);
    assert_eq!(count(&g, "sqrt"), 0);
    insta::assert_snapshot!(snap);
}

#[test]
fn layer_norm_with_reciprocal() {
    let text = LAYER_NORM_POW.replace(
        "%9 = div(%2, %8) : f32[*]",
        "%20 = reciprocal(%8) : f32[*]\n%9 = mul(%20, %2) : f32[*]",
    );
    let (_, changed, g) = before_after(&RecognizeLayerNorm, &text);
    assert!(changed && count(&g, "layer_norm") == 1, "{}", print(&g));
}

#[test]
fn layer_norm_not_over_another_axis() {
    let text = LAYER_NORM_POW.replace("%5 = reduce_mean[axes=[-1]", "%5 = reduce_mean[axes=[1]");
    let (_, changed, _) = before_after(&RecognizeLayerNorm, &text);
    assert!(!changed);
}

const GELU_ERF: &str = "\
%0 = input[name=\"x\"] : f32[B,8]
%1 = const[value=f32[]{1.4142135}] : f32[]
%2 = div(%0, %1) : f32[*]
%3 = erf(%2) : f32[*]
%4 = const[value=f32[]{1.0}] : f32[]
%5 = add(%3, %4) : f32[*]
%6 = mul(%0, %5) : f32[*]
%7 = const[value=f32[]{0.5}] : f32[]
%8 = mul(%6, %7) : f32[*]
output \"y\" = %8
";

#[test]
fn gelu_erf_as_exported() {
    let (snap, _, g) = before_after(&RecognizeGelu, GELU_ERF);
    assert_eq!(g.node_count(), 2);
    insta::assert_snapshot!(snap);
}

#[test]
fn gelu_erf_grouped_the_other_ways() {
    let a = "\
%0 = input[name=\"x\"] : f32[B,8]
%1 = const[value=f32[]{0.70710677}] : f32[]
%2 = mul(%1, %0) : f32[*]
%3 = erf(%2) : f32[*]
%4 = const[value=f32[]{1.0}] : f32[]
%5 = add(%4, %3) : f32[*]
%6 = const[value=f32[]{0.5}] : f32[]
%7 = mul(%5, %6) : f32[*]
%8 = mul(%0, %7) : f32[*]
output \"y\" = %8
";
    let (_, changed, g) = before_after(&RecognizeGelu, a);
    assert!(changed && count(&g, "gelu") == 1, "{}", print(&g));
}

#[test]
fn gelu_wrong_constant_is_left_alone() {
    let text = GELU_ERF.replace("{1.4142135}", "{1.5}");
    let (_, changed, _) = before_after(&RecognizeGelu, &text);
    assert!(!changed);
    let text = GELU_ERF.replace("f32[]{0.5}", "f32[]{0.6}");
    let (_, changed, _) = before_after(&RecognizeGelu, &text);
    assert!(!changed);
}

#[test]
fn gelu_tanh_with_pow_and_with_products() {
    let pow = "\
%0 = input[name=\"x\"] : f32[B,8]
%1 = const[value=f32[]{0.5}] : f32[]
%2 = mul(%0, %1) : f32[*]
%3 = const[value=f32[]{3.0}] : f32[]
%4 = pow(%0, %3) : f32[*]
%5 = const[value=f32[]{0.044715}] : f32[]
%6 = mul(%4, %5) : f32[*]
%7 = add(%0, %6) : f32[*]
%8 = const[value=f32[]{0.7978846}] : f32[]
%9 = mul(%7, %8) : f32[*]
%10 = tanh(%9) : f32[*]
%11 = const[value=f32[]{1.0}] : f32[]
%12 = add(%10, %11) : f32[*]
%13 = mul(%2, %12) : f32[*]
output \"y\" = %13
";
    let (snap, _, g) = before_after(&RecognizeGelu, pow);
    assert!(print(&g).contains("gelu[approx=\"tanh\"](%0)"));
    insta::assert_snapshot!(snap);
    let products = pow.replace(
        "%4 = pow(%0, %3) : f32[*]",
        "%20 = mul(%0, %0) : f32[*]\n%4 = mul(%20, %0) : f32[*]",
    );
    let (_, changed, g) = before_after(&RecognizeGelu, &products);
    assert!(changed && count(&g, "gelu") == 1, "{}", print(&g));
}

/// The BERT eager block: q, k, v projections of hidden 8 into 2 heads of 4.
const BERT_ATTENTION: &str = "\
%0 = input[name=\"h\"] : f32[B,S,8]
%1 = input[name=\"mask\"] : f32[B,1,1,S]
%2 = const[value=f32[8,8]{extern}] : f32[8,8]  # wq
%3 = const[value=f32[8,8]{extern}] : f32[8,8]  # wk
%4 = const[value=f32[8,8]{extern}] : f32[8,8]  # wv
%5 = linear(%0, %2) : f32[*]  # q
%6 = linear(%0, %3) : f32[*]  # k
%7 = linear(%0, %4) : f32[*]  # v
%8 = const[value=i64[4]{0, 0, 2, 4}] : i64[4]
%9 = reshape[allowzero=false](%5, %8) : f32[*]
%10 = reshape[allowzero=false](%6, %8) : f32[*]
%11 = reshape[allowzero=false](%7, %8) : f32[*]
%12 = transpose[perm=[0, 2, 1, 3]](%9) : f32[*]
%13 = transpose[perm=[0, 2, 3, 1]](%10) : f32[*]
%14 = transpose[perm=[0, 2, 1, 3]](%11) : f32[*]
%15 = matmul(%12, %13) : f32[*]
%16 = const[value=f32[]{2.0}] : f32[]
%17 = div(%15, %16) : f32[*]
%18 = add(%17, %1) : f32[*]
%19 = softmax[axis=-1](%18) : f32[*]
%20 = matmul(%19, %14) : f32[*]
%21 = transpose[perm=[0, 2, 1, 3]](%20) : f32[*]
%22 = const[value=i64[3]{0, 0, 8}] : i64[3]
%23 = reshape[allowzero=false](%21, %22) : f32[*]  # /layer/self/Reshape_3
output \"y\" = %23
";

#[test]
fn attention_bert_form() {
    let (snap, _, g) = before_after(&RecognizeAttention, BERT_ATTENTION);
    let t = print(&g);
    assert!(t.contains("attention[num_heads=2, scale=0.5](%5, %6, %7, %1) : f32[B,S,8]  # /layer/self/Attention"), "{t}");
    assert_eq!(
        count(&g, "softmax") + count(&g, "transpose") + count(&g, "matmul"),
        0
    );
    insta::assert_snapshot!(snap);
}

#[test]
fn attention_distilbert_form() {
    let text = "\
%0 = input[name=\"h\"] : f32[B,S,8]
%1 = input[name=\"attention_mask\"] : i64[B,S]
%2 = const[value=f32[8,8]{extern}] : f32[8,8]
%3 = linear(%0, %2) : f32[*]  # q
%4 = linear(%0, %2) : f32[*]  # k
%5 = linear(%0, %2) : f32[*]  # v
%6 = const[value=i64[4]{0, -1, 2, 4}] : i64[4]
%7 = reshape[allowzero=false](%3, %6) : f32[*]
%8 = transpose[perm=[0, 2, 1, 3]](%7) : f32[*]
%9 = reshape[allowzero=false](%4, %6) : f32[*]
%10 = reshape[allowzero=false](%5, %6) : f32[*]
%11 = transpose[perm=[0, 2, 1, 3]](%10) : f32[*]
%12 = const[value=f32[]{2.0}] : f32[]
%13 = div(%8, %12) : f32[*]
%14 = transpose[perm=[0, 2, 3, 1]](%9) : f32[*]
%15 = matmul(%13, %14) : f32[*]
%16 = const[value=i64[]{0}] : i64[]
%17 = equal(%1, %16) : bool[*]
%18 = const[value=i64[4]{0, 1, 1, -1}] : i64[4]
%19 = reshape[allowzero=false](%17, %18) : bool[*]
%20 = shape[start=0](%15) : i64[*]
%21 = expand(%19, %20) : bool[*]
%22 = cast[to=bool](%21) : bool[*]
%23 = const[value=f32[]{-3.4028235e38}] : f32[]
%24 = where(%22, %23, %15) : f32[*]
%25 = softmax[axis=-1](%24) : f32[*]
%26 = matmul(%25, %11) : f32[*]
%27 = transpose[perm=[0, 2, 1, 3]](%26) : f32[*]
%28 = const[value=i64[3]{0, -1, 8}] : i64[3]
%29 = reshape[allowzero=false](%27, %28) : f32[*]  # /layer/attention/Reshape_4
output \"y\" = %29
";
    let (snap, _, g) = before_after(&RecognizeAttention, text);
    let t = print(&g);
    assert!(t.contains("where(%"), "{t}");
    assert!(
        t.contains(": f32[B,1,1,S]  # /layer/attention/AttentionMaskBias"),
        "{t}"
    );
    assert_eq!(
        count(&g, "expand") + count(&g, "shape") + count(&g, "softmax"),
        0,
        "{t}"
    );
    insta::assert_snapshot!(snap);
}

#[test]
fn attention_sdpa_form_with_split_scale() {
    let text = "\
%0 = input[name=\"q\"] : f32[B,S,8]
%1 = input[name=\"k\"] : f32[B,S,8]
%2 = input[name=\"v\"] : f32[B,S,8]
%3 = const[value=i64[4]{0, 0, 2, 4}] : i64[4]
%4 = reshape[allowzero=false](%0, %3) : f32[*]
%5 = transpose[perm=[0, 2, 1, 3]](%4) : f32[*]
%6 = reshape[allowzero=false](%1, %3) : f32[*]
%7 = transpose[perm=[0, 2, 1, 3]](%6) : f32[*]
%8 = reshape[allowzero=false](%2, %3) : f32[*]
%9 = transpose[perm=[0, 2, 1, 3]](%8) : f32[*]
%10 = const[value=f32[]{0.70710677}] : f32[]
%11 = mul(%5, %10) : f32[*]
%12 = transpose[perm=[0, 1, 3, 2]](%7) : f32[*]
%13 = mul(%12, %10) : f32[*]
%14 = matmul(%11, %13) : f32[*]
%15 = softmax[axis=-1](%14) : f32[*]
%16 = matmul(%15, %9) : f32[*]
%17 = transpose[perm=[0, 2, 1, 3]](%16) : f32[*]
%18 = const[value=i64[3]{0, 0, 8}] : i64[3]
%19 = reshape[allowzero=false](%17, %18) : f32[*]  # /sdpa/Reshape
output \"y\" = %19
";
    let (snap, _, g) = before_after(&RecognizeAttention, text);
    let t = print(&g);
    assert!(
        t.contains("attention[num_heads=2, scale=0.49999997](%0, %1, %2) : f32[B,S,8]"),
        "{t}"
    );
    insta::assert_snapshot!(snap);
}

/// The dynamo exporter's SDPA block: the scale split as `√scale` on Q and on Kᵀ, Kᵀ spelled
/// `Reshape(Transpose[0,2,1](Reshape(kh, [B·h,S,dh])), [B,h,dh,S])`, and the mask
/// `[B,1,1,S]` expanded to `[B,1,S,S]` with dims read from the ids before it becomes the bias.
/// The expansion is dropped (the attention broadcasts its mask): the bias is one value per key.
const DYNAMO_SDPA_ATTENTION: &str = "\
%0 = input[name=\"q\"] : f32[B,S,8]
%1 = input[name=\"k\"] : f32[B,S,8]
%2 = input[name=\"v\"] : f32[B,S,8]
%3 = input[name=\"attention_mask\"] : i64[B,S]
%4 = input[name=\"input_ids\"] : i64[B,S]
%5 = const[value=i64[4]{0, 0, 2, 4}] : i64[4]
%6 = reshape[allowzero=false](%0, %5) : f32[*]
%7 = transpose[perm=[0, 2, 1, 3]](%6) : f32[*]
%8 = reshape[allowzero=false](%1, %5) : f32[*]
%9 = transpose[perm=[0, 2, 1, 3]](%8) : f32[*]
%10 = reshape[allowzero=false](%2, %5) : f32[*]
%11 = transpose[perm=[0, 2, 1, 3]](%10) : f32[*]
%12 = const[value=f32[]{0.8408964}] : f32[]
%13 = mul(%7, %12) : f32[*]
%21 = shape[start=1, end=2](%4) : i64[1]
%22 = const[value=i64[1]{4}] : i64[1]
%44 = const[value=i64[1]{-1}] : i64[1]
%14 = concat[axis=0](%44, %21, %22) : i64[*]
%15 = reshape[allowzero=false](%9, %14) : f32[*]
%16 = transpose[perm=[0, 2, 1]](%15) : f32[*]
%17 = shape[start=0](%9) : i64[4]
%18 = const[value=i64[1]{0}] : i64[1]
%19 = const[value=i64[1]{2}] : i64[1]
%20 = slice(%17, %18, %19) : i64[*]
%23 = concat[axis=0](%20, %22, %21) : i64[*]
%24 = reshape[allowzero=false](%16, %23) : f32[*]
%25 = mul(%24, %12) : f32[*]
%26 = matmul(%13, %25) : f32[*]
%27 = unsqueeze[axes=[1, 2]](%3) : i64[*]
%28 = shape[start=0, end=1](%4) : i64[1]
%29 = const[value=i64[1]{1}] : i64[1]
%30 = concat[axis=0](%28, %29, %21, %21) : i64[*]
%31 = expand(%27, %30) : i64[*]
%32 = cast[to=f32](%31) : f32[*]
%33 = const[value=f32[]{1.0}] : f32[]
%34 = sub(%33, %32) : f32[*]
%35 = cast[to=bool](%34) : bool[*]
%36 = const[value=f32[]{-3.4028235e38}] : f32[]
%37 = where(%35, %36, %34) : f32[*]
%38 = add(%26, %37) : f32[*]
%39 = softmax[axis=-1](%38) : f32[*]
%40 = matmul(%39, %11) : f32[*]
%41 = transpose[perm=[0, 2, 1, 3]](%40) : f32[*]
%42 = const[value=i64[3]{0, 0, 8}] : i64[3]
%43 = reshape[allowzero=false](%41, %42) : f32[*]  # /sdpa/Reshape
output \"y\" = %43
";

#[test]
fn attention_dynamo_sdpa_form() {
    let (snap, _, g) = before_after(&RecognizeAttention, DYNAMO_SDPA_ATTENTION);
    let t = print(&g);
    assert!(
        t.contains("attention[num_heads=2, scale=0.7071068](%0, %1, %2, %"),
        "{t}"
    );
    assert!(t.contains("where(%") && t.contains(": f32[B,1,1,S]"), "{t}");
    assert_eq!(
        count(&g, "expand") + count(&g, "softmax") + count(&g, "matmul"),
        0,
        "{t}"
    );
    insta::assert_snapshot!(snap);
}

/// MPNet: a relative-position bias `[1, h, S, S]` is added to the scaled scores before the
/// mask; both become one bias, `pos + mask`, of the attention.
#[test]
fn attention_with_a_position_bias_and_a_mask() {
    let text = BERT_ATTENTION
        .replace(
            "%2 = const[value=f32[8,8]{extern}] : f32[8,8]  # wq",
            "%30 = input[name=\"pos\"] : f32[1,2,S,S]\n%2 = const[value=f32[8,8]{extern}] : f32[8,8]  # wq",
        )
        .replace(
            "%18 = add(%17, %1) : f32[*]",
            "%31 = add(%17, %30) : f32[*]\n%18 = add(%31, %1) : f32[*]",
        );
    let (snap, _, g) = before_after(&RecognizeAttention, &text);
    let t = print(&g);
    assert!(
        t.contains("add(%1, %2) : f32[B,2,S,S]  # /layer/self/AttentionBias1")
            || t.contains("add(%2, %1) : f32[B,2,S,S]  # /layer/self/AttentionBias1"),
        "{t}"
    );
    assert_eq!(count(&g, "attention"), 1, "{t}");
    assert_eq!(count(&g, "softmax") + count(&g, "matmul"), 0, "{t}");
    insta::assert_snapshot!(snap);
}

/// An expansion whose result another op reads too, or one to a shape the scores do not
/// broadcast over, is kept.
#[test]
fn attention_mask_expansion_kept_when_read_elsewhere() {
    let shared = DYNAMO_SDPA_ATTENTION.replace(
        "output \"y\" = %43\n",
        "output \"y\" = %43\noutput \"m\" = %31\n",
    );
    let (_, changed, g) = before_after(&RecognizeAttention, &shared);
    assert!(changed);
    assert_eq!(count(&g, "attention"), 1);
    assert_eq!(count(&g, "expand"), 1, "{}", print(&g));
}

#[test]
fn attention_wrong_permutation_is_left_alone() {
    let text = BERT_ATTENTION.replace(
        "%21 = transpose[perm=[0, 2, 1, 3]]",
        "%21 = transpose[perm=[0, 1, 2, 3]]",
    );
    let (_, changed, g) = before_after(&RecognizeAttention, &text);
    assert!(!changed);
    assert_eq!(count(&g, "attention"), 0);
    let text = BERT_ATTENTION.replace("%19 = softmax[axis=-1]", "%19 = softmax[axis=2]");
    let (_, changed, _) = before_after(&RecognizeAttention, &text);
    assert!(!changed);
}

#[test]
fn constant_folding_error_names_the_node() {
    let mut g = parse(
        "%0 = const[value=f32[3]{1.0, 2.0, 3.0}] : f32[3]\n\
         %1 = const[value=i64[1]{5}] : i64[1]\n\
         %2 = gather[axis=0](%0, %1) : f32[*]  # /emb/Gather\n\
         output \"y\" = %2\n",
    );
    ShapeInference
        .run(&mut g, &mut passes::PassContext::default())
        .unwrap();
    let err = ConstantFolding
        .run(&mut g, &mut passes::PassContext::default())
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "ConstantFolding on node /emb/Gather: gather index 5 out of range for axis of size 3"
    );
}

/// Layout ops evaluated on constants agree with their definitions.
#[test]
fn constant_folding_layout_ops() {
    let text = "\
%0 = const[value=i64[2,3]{0, 1, 2, 3, 4, 5}] : i64[2,3]
%1 = const[value=i64[1]{-1}] : i64[1]
%2 = const[value=i64[1]{-100}] : i64[1]
%3 = const[value=i64[1]{1}] : i64[1]
%4 = const[value=i64[1]{-2}] : i64[1]
%5 = slice(%0, %1, %2, %3, %4) : i64[*]
%6 = const[value=i64[2]{2, 0}] : i64[2]
%7 = gather[axis=1](%0, %6) : i64[*]
%8 = concat[axis=1](%0, %7) : i64[*]
%9 = const[value=i64[3]{2, 2, 3}] : i64[3]
%10 = expand(%0, %9) : i64[*]
%11 = transpose[perm=[1, 0]](%0) : i64[*]
%12 = unsqueeze[axes=[0, 3]](%0) : i64[*]
%13 = const[value=f32[2]{-1.7, 2.5}] : f32[2]
%14 = cast[to=i32](%13) : i32[*]
output \"slice\" = %5
output \"gather\" = %7
output \"concat\" = %8
output \"expand\" = %10
output \"transpose\" = %11
output \"unsqueeze\" = %12
output \"cast\" = %14
";
    let (snap, _, g) = before_after(&ConstantFolding, text);
    let t = print(&g);
    for want in [
        "i64[2,2]{2, 0, 5, 3}",
        "i64[2,5]{0, 1, 2, 2, 0, 3, 4, 5, 5, 3}",
        "i64[2,2,3]{0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5}",
        "i64[3,2]{0, 3, 1, 4, 2, 5}",
        "i64[1,2,3,1]{0, 1, 2, 3, 4, 5}",
        "i32[2]{-1, 2}",
    ] {
        assert!(t.contains(want), "{want} missing in\n{t}");
    }
    // slice(starts=-1, ends=-100, axes=1, steps=-2) of each row [a, b, c] is [c, a].
    assert!(
        t.starts_with("%0 = const[value=i64[2,2]{2, 0, 5, 3}] : i64[2,2]\n"),
        "{t}"
    );
    insta::assert_snapshot!(snap);
}

/// `less_or_equal` / `greater_or_equal`: bool results broadcast like the other comparisons,
/// and folded on constants (equal elements included, for floats and integers).
#[test]
fn comparisons_with_equality_infer_and_fold() {
    let mut g = parse(
        "%0 = input[name=\"x\"] : f32[B,3]\n\
         %1 = const[value=f32[3]{1.0, 2.0, 3.0}] : f32[3]\n\
         %2 = less_or_equal(%0, %1) : bool[*]\n\
         %3 = const[value=f32[]{2.0}] : f32[]\n\
         %4 = greater_or_equal(%1, %3) : bool[*]\n\
         %5 = less_or_equal(%1, %3) : bool[*]\n\
         %6 = const[value=i64[2]{1, 5}] : i64[2]\n\
         %7 = const[value=i64[]{5}] : i64[]\n\
         %8 = greater_or_equal(%6, %7) : bool[*]\n\
         output \"a\" = %2\n\
         output \"b\" = %4\n\
         output \"c\" = %5\n\
         output \"d\" = %8\n",
    );
    ShapeInference
        .run(&mut g, &mut passes::PassContext::default())
        .unwrap();
    let t = print(&g);
    assert!(t.contains("less_or_equal(%0, %1) : bool[B,3]"), "{t}");
    assert!(t.contains("greater_or_equal(%1, %3) : bool[3]"), "{t}");
    assert!(ConstantFolding
        .run(&mut g, &mut passes::PassContext::default())
        .unwrap());
    DeadCodeElimination
        .run(&mut g, &mut passes::PassContext::default())
        .unwrap();
    let t = print(&g);
    for want in [
        "bool[3]{false, true, true}",
        "bool[3]{true, true, false}",
        "bool[2]{false, true}",
    ] {
        assert!(t.contains(want), "{want} missing in\n{t}");
    }
    assert_eq!(count(&g, "less_or_equal"), 1, "{t}");
    assert_eq!(count(&g, "greater_or_equal"), 0, "{t}");
}

/// `clip` keeps its input's type, rejects a bound with more than one element, and folds on
/// constants (NaN stays NaN, an integer input clamps too).
#[test]
fn clip_infers_and_folds() {
    let mut g = parse(
        "%0 = input[name=\"x\"] : f32[B,3]\n\
         %1 = const[value=f32[]{-1.0}] : f32[]\n\
         %2 = const[value=f32[]{2.0}] : f32[]\n\
         %3 = clip(%0, %1, %2) : f32[*]\n\
         %4 = const[value=f32[4]{-3.0, 0.5, 7.0, NaN}] : f32[4]\n\
         %5 = clip(%4, %1, %2) : f32[*]\n\
         %6 = const[value=i64[3]{-5, 1, 9}] : i64[3]\n\
         %7 = const[value=i64[]{0}] : i64[]\n\
         %8 = clip(%6, %7) : i64[*]\n\
         output \"a\" = %3\n\
         output \"b\" = %5\n\
         output \"c\" = %8\n",
    );
    ShapeInference
        .run(&mut g, &mut passes::PassContext::default())
        .unwrap();
    let t = print(&g);
    assert!(t.contains("clip(%0, %1, %2) : f32[B,3]"), "{t}");
    assert!(ConstantFolding
        .run(&mut g, &mut passes::PassContext::default())
        .unwrap());
    DeadCodeElimination
        .run(&mut g, &mut passes::PassContext::default())
        .unwrap();
    let t = print(&g);
    for want in ["f32[4]{-1.0, 0.5, 2.0, NaN}", "i64[3]{0, 1, 9}"] {
        assert!(t.contains(want), "{want} missing in\n{t}");
    }
    assert_eq!(count(&g, "clip"), 1, "{t}");

    let mut g = parse(
        "%0 = input[name=\"x\"] : f32[B,3]\n\
         %1 = const[value=f32[2]{-1.0, 0.0}] : f32[2]\n\
         %2 = clip(%0, %1) : f32[*]  # /act/Clip\n\
         output \"y\" = %2\n",
    );
    let err = ShapeInference
        .run(&mut g, &mut passes::PassContext::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("/act/Clip") && err.contains("one element"),
        "{err}"
    );
}

/// `split` types each output: from constant sizes, from the even rule (the last piece what
/// remains), fresh symbols when the axis is symbolic; sizes not summing to the axis are an
/// error naming the node.
#[test]
fn split_shapes() {
    let mut g = parse(
        "%0 = input[name=\"x\"] : f32[B,7]\n\
         %1 = const[value=i64[2]{2, 5}] : i64[2]\n\
         %2 = split[axis=1, num_outputs=2](%0, %1) : (f32[*], f32[*])\n\
         %3 = split[axis=-1, num_outputs=3](%0) : (f32[*], f32[*], f32[*])\n\
         %4 = split[axis=0, num_outputs=2](%0) : (f32[*], f32[*])\n\
         output \"a\" = %2.1\n\
         output \"b\" = %3.2\n\
         output \"c\" = %4\n",
    );
    ShapeInference
        .run(&mut g, &mut passes::PassContext::default())
        .unwrap();
    let t = print(&g);
    assert!(t.contains("(%0, %1) : (f32[B,2], f32[B,5])"), "{t}");
    assert!(t.contains("(%0) : (f32[B,3], f32[B,3], f32[B,1])"), "{t}");
    assert!(
        !t.contains("split[axis=0, num_outputs=2](%0) : (f32[B,7]"),
        "{t}"
    );
    let mut g = parse(
        "%0 = input[name=\"x\"] : f32[B,7]\n\
         %1 = const[value=i64[2]{2, 4}] : i64[2]\n\
         %2 = split[axis=1, num_outputs=2](%0, %1) : (f32[*], f32[*])  # /qkv/Split\n\
         output \"a\" = %2.1\n",
    );
    let err = ShapeInference
        .run(&mut g, &mut passes::PassContext::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("/qkv/Split") && err.contains("sum to 6, the axis is 7"),
        "{err}"
    );
}

/// `tile` multiplies each dim by its count (symbolic dims too), folds on constants, and
/// rejects repeats of the wrong length, naming the node.
#[test]
fn tile_infers_and_folds() {
    let mut g = parse(
        "%0 = input[name=\"x\"] : f32[B,3]\n\
         %1 = const[value=i64[2]{2, 1}] : i64[2]\n\
         %2 = tile(%0, %1) : f32[*]\n\
         %3 = const[value=i64[2,2]{1, 2, 3, 4}] : i64[2,2]\n\
         %4 = const[value=i64[2]{1, 2}] : i64[2]\n\
         %5 = tile(%3, %4) : i64[*]\n\
         output \"a\" = %2\n\
         output \"b\" = %5\n",
    );
    ShapeInference
        .run(&mut g, &mut passes::PassContext::default())
        .unwrap();
    let t = print(&g);
    assert!(t.contains("tile(%0, %1) : f32[2*B,3]"), "{t}");
    assert!(ConstantFolding
        .run(&mut g, &mut passes::PassContext::default())
        .unwrap());
    DeadCodeElimination
        .run(&mut g, &mut passes::PassContext::default())
        .unwrap();
    let t = print(&g);
    assert!(t.contains("i64[2,4]{1, 2, 1, 2, 3, 4, 3, 4}"), "{t}");
    assert_eq!(count(&g, "tile"), 1, "{t}");

    let mut g = parse(
        "%0 = input[name=\"x\"] : f32[B,3]\n\
         %1 = const[value=i64[1]{2}] : i64[1]\n\
         %2 = tile(%0, %1) : f32[*]  # /pos/Tile\n\
         output \"y\" = %2\n",
    );
    let err = ShapeInference
        .run(&mut g, &mut passes::PassContext::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("/pos/Tile") && err.contains("repeats"),
        "{err}"
    );
}

/// Passes do not look into a loop: declutter leaves a body as it is (a session optimizes it on
/// its own when it compiles the loop), does not evaluate a loop whose inputs are all constants
/// (it runs at run time; the second loop, one output), and types the loop's outputs from an
/// analysed copy of the body: a carried value the body gives back with the type it took keeps
/// it, a scan gets a new leading dim.
#[test]
fn loop_is_opaque_to_declutter() {
    let body = "\
  body {
    %0 = input[name=\"i\"] : i64[]
    %1 = input[name=\"c\"] : bool[]
    %2 = input[name=\"x_in\"] : f32[*]
    %3 = input[name=\"k\"] : f32[*]
    %4 = const[value=f32[]{1.0}] : f32[]
    %5 = const[value=f32[]{1.0}] : f32[]
    %6 = add(%4, %5) : f32[*]
    %7 = mul(%2, %3) : f32[*]
    %8 = add(%7, %6) : f32[*]
    output \"c_out\" = %1
    output \"x_out\" = %8
    output \"scan\" = %7
  }
";
    let unscanned = body.replace("    output \"scan\" = %7\n", "");
    let text = format!(
        "\
%0 = const[value=i64[]{{3}}] : i64[]
%1 = const[value=bool[]{{true}}] : bool[]
%2 = input[name=\"x\"] : f32[B,4]
%3 = const[value=f32[]{{2.0}}] : f32[]
%4 = loop[carried=1](%0, %1, %2, %3) : (f32[*], f32[*])
{body}%5 = const[value=f32[4]{{1.0, 2.0, 3.0, 4.0}}] : f32[4]
%6 = loop[carried=1](%0, %1, %5, %3) : f32[*]
{unscanned}%7 = shape[start=0](%4.1) : i64[*]
output \"y\" = %4
output \"scans\" = %4.1
output \"n\" = %7
output \"constant\" = %6
"
    );
    let mut g = parse(&text);
    let before = print(&g);
    passes::Pipeline::declutter()
        .run(&mut g, &mut passes::RunOptions::default())
        .unwrap();
    g.verify().unwrap();
    let after = print(&g);
    assert_eq!(count(&g, "loop"), 2, "{after}");
    assert!(
        after.contains(body) && after.contains(&unscanned),
        "bodies changed:\n{after}"
    );
    assert!(after.contains(": (f32[B,4], f32[unk0,B,4])"), "{after}");
    assert!(
        after.contains("%6 = loop[carried=1](%0, %1, %5, %3) : f32[4]\n"),
        "{after}"
    );
    insta::assert_snapshot!(format!("--- before\n{before}--- after declutter\n{after}"));
}

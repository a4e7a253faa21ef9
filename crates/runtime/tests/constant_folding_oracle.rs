//! ConstantFolding against an evaluator that is not its own. The pass evaluates the ops it
//! folds with `passes::eval_node`, and the passes tests' interpreter runs those same ops with
//! that same function, so a wrong fold there compares equal to itself. Here the graph before
//! folding runs in a `Session` without the optimizing pipelines, whose kernels (the runtime's
//! own shape, gather, slice, concat, cast, arithmetic ops) compute what the folded constants
//! replace; the graph after ConstantFolding and DCE runs in the same way, and every output must
//! agree bit for bit (folding moves computations into constants, it does not change them).

mod common;

use common::*;
use passes::{ConstantFolding, DeadCodeElimination, Pass, PassContext, ShapeInference};
use runtime::{CompileOptions, Model, Session, TensorValue};

fn unoptimized(g: ir::Graph) -> Session {
    let opts = CompileOptions {
        optimize: false,
        ..CompileOptions::default()
    };
    Session::new(&Model::from_graph(g).unwrap(), opts).unwrap()
}

/// Runs `g` before and after folding on `feeds`; returns how many nodes folding removed.
fn check(what: &str, g: ir::Graph, feeds: &[(&str, TensorValue)]) -> usize {
    let mut typed = g;
    ShapeInference
        .run(&mut typed, &mut PassContext::default())
        .unwrap();
    let mut folded = typed.clone();
    ConstantFolding
        .run(&mut folded, &mut PassContext::default())
        .unwrap();
    DeadCodeElimination
        .run(&mut folded, &mut PassContext::default())
        .unwrap();
    let removed = typed.node_count() - folded.node_count();
    let before = unoptimized(typed).run(feeds).unwrap();
    let after = unoptimized(folded).run(feeds).unwrap();
    assert_eq!(before.len(), after.len(), "{what}");
    for ((n0, t0), (n1, t1)) in before.iter().zip(&after) {
        assert_eq!(n0, n1, "{what}");
        assert_eq!(t0, t1, "{what}: output {n0} changed by folding");
    }
    removed
}

/// Every FP32 shared model: their shape subgraphs (Shape, Gather, Unsqueeze, Concat, Slice,
/// Cast, Equal, Where, Expand, ConstantOfShape...) are what ConstantFolding folds.
#[test]
fn shared_models_fold_to_the_same_outputs() {
    let Some(dir) = models_dir("constant folding oracle") else {
        return;
    };
    let man = manifest(&dir);
    for id in [
        "tiny-bert",
        "tiny-distilbert",
        "tiny-xlm-roberta",
        "tiny-bert-cls",
    ] {
        let entry = model_entry(&man, id);
        let g = Model::load(dir.join(entry["file"].as_str().unwrap()))
            .unwrap()
            .into_graph();
        for b in ref_batches(&dir, entry) {
            let removed = check(&format!("{id} {}", b.name), g.clone(), &b.feeds());
            println!("{id} {}: folding removed {removed} nodes", b.name);
            assert!(removed > 10, "{id}: folding found nothing to fold");
        }
    }
}

/// DeBERTa-v2's relative-position buckets on constant positions (sign and abs of i64 offsets,
/// ceil of a scaled logarithm, floor): folded, they equal what the kernels compute.
#[test]
fn relative_position_buckets_fold_to_the_same_outputs() {
    let text = "\
%0 = input[name=\"x\"] : f32[5]
%1 = const[value=i64[5]{-9, -1, 1, 2, 40}] : i64[5]
%2 = sign(%1) : i64[*]
%3 = abs(%1) : i64[*]
%4 = cast[to=f32](%3) : f32[*]
%5 = log(%4) : f32[*]
%6 = const[value=f32[]{1.7}] : f32[]
%7 = mul(%5, %6) : f32[*]
%8 = ceil(%7) : f32[*]
%9 = floor(%7) : f32[*]
%10 = cast[to=f32](%2) : f32[*]
%11 = mul(%8, %10) : f32[*]
%12 = add(%11, %0) : f32[*]
%13 = add(%9, %0) : f32[*]
%14 = sign(%7) : f32[*]
%15 = add(%14, %0) : f32[*]
output \"a\" = %2
output \"b\" = %12
output \"c\" = %13
output \"d\" = %15
";
    let g = ir::text::parse(text, None).unwrap();
    let x = TensorValue::from_f32(vec![5], vec![0.5, -1.0, 2.0, 3.5, 0.0]).unwrap();
    let removed = check("relative position buckets", g, &[("x", x)]);
    // The 12 nodes before the adds fold into the 4 constants the adds and output `a` read.
    assert_eq!(
        removed, 8,
        "folding left some of sign, abs, log, ceil, floor unfolded"
    );
}

/// A chain of `select`s (ONNX `If`s) each testing a shape that comes through the one before,
/// as DeBERTa's layers do (`if query.size(-2) != key.size(-2)`): one shape inference types
/// the whole chain (a known condition gives the chosen value's shape), so the selects fold at
/// once, and a session compiles 12 of them where a select per pipeline iteration would stop at
/// the 8-iteration limit.
#[test]
fn chained_selects_fold_in_one_sweep() {
    let mut text = String::from(
        "%0 = input[name=\"x\"] : f32[B,S]\n%1 = shape[start=1, end=2](%0) : i64[1]\n",
    );
    let mut prev = 0;
    for i in 0..12 {
        let n = 2 + 4 * i;
        // Unchanged (then) or doubled along the sequence (else), by whether the value so far
        // still has the input's length.
        text += &format!(
            "%{a} = shape[start=1, end=2](%{prev}) : i64[*]\n\
             %{c} = equal(%{a}, %1) : bool[*]\n\
             %{d} = concat[axis=1](%{prev}, %{prev}) : f32[*]\n\
             %{s} = select(%{c}, %{prev}, %{d}) : f32[*]\n",
            a = n,
            c = n + 1,
            d = n + 2,
            s = n + 3
        );
        prev = n + 3;
    }
    text += &format!("output \"y\" = %{prev}\n");
    let g = ir::text::parse(&text, None).unwrap();
    let x = TensorValue::from_f32(vec![2, 3], vec![0.5, -1.0, 2.0, 3.5, 0.0, -2.5]).unwrap();
    let removed = check("chained selects", g.clone(), &[("x", x.clone())]);
    // Everything but the input: the length %1 and the 12 × 4 nodes of the chain.
    assert_eq!(removed, 1 + 12 * 4, "not every select folded in one sweep");
    let s = Session::new(&Model::from_graph(g).unwrap(), CompileOptions::default()).unwrap();
    let left = s
        .graph()
        .node_ids()
        .filter(|&n| s.graph().node(n).op.name() == "select")
        .count();
    assert_eq!(left, 0);
    assert_eq!(s.run(&[("x", x.clone())]).unwrap()[0].1, x);
}

/// Folds of each kind on a small graph: arithmetic on shapes, constant_of_shape, sqrt, where,
/// transpose, gather/slice/concat of constants, cast with truncation.
#[test]
fn small_graph_folds_to_the_same_outputs() {
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
%12 = const[value=i64[2,3]{0, 1, 2, 3, 4, 5}] : i64[2,3]
%13 = const[value=i64[2]{2, 0}] : i64[2]
%14 = gather[axis=1](%12, %13) : i64[*]
%15 = const[value=i64[1]{-1}] : i64[1]
%16 = const[value=i64[1]{-100}] : i64[1]
%17 = const[value=i64[1]{1}] : i64[1]
%18 = const[value=i64[1]{-2}] : i64[1]
%19 = slice(%12, %15, %16, %17, %18) : i64[*]
%20 = concat[axis=0](%14, %19) : i64[*]
%21 = const[value=f32[2]{-1.7, 2.5}] : f32[2]
%22 = cast[to=i64](%21) : i64[*]
output \"a\" = %4
output \"b\" = %8
output \"c\" = %11
output \"d\" = %20
output \"e\" = %22
";
    let g = ir::text::parse(text, None).unwrap();
    let x = TensorValue::from_f32(vec![2, 3], vec![0.5, -1.0, 2.0, 3.5, 0.0, -2.5]).unwrap();
    let removed = check("small graph", g, &[("x", x)]);
    assert!(removed >= 10, "folding removed only {removed} nodes");
}

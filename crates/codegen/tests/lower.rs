//! Lowering: the program a graph becomes (snapshots of its text form) and the invariants of the
//! buffer plan.

use codegen::kernels::{GemmSplit, Int8Kernel};
use codegen::lower::{lower, Home, LowerOptions, Program};

/// A packed encoder layer after the fuse and pack pipelines: LayerNorm, an f32 QKV product,
/// packed attention, a residual add, an int8 up-projection with bias and GELU in its epilogue.
const LAYER: &str = r#"%0 = input[name="x"] : f32[B,S,4]
%1 = input[name="mask"] : i64[B,S]
%2 = input[name="pos"] : f32[1,S,4]
%3 = add(%0, %2) : f32[B,S,4]  # embed
%4 = const[value=f32[4]{1.0, 1.0, 1.0, 1.0}] : f32[4]  # gamma
%5 = const[value=f32[4]{0.0, 0.0, 0.0, 0.0}] : f32[4]  # beta
%6 = const[value=f32[4,12]{0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25}] : f32[4,12]  # qkv/weight
%7 = unsqueeze[axes=[1, 2]](%1) : i64[B,1,1,S]  # mask/unsqueeze
%8 = cast[to=f32](%7) : f32[B,1,1,S]  # mask/cast
%9 = const[value=f32[]{-10000.0}] : f32[]  # mask/big
%10 = mul(%8, %9) : f32[B,1,1,S]  # mask/bias
%11 = const[value=i8[4,40]{-5, 2, -2, 5, 1, -3, 4, 0, -4, 3, -1, -5, 2, -2, 5, 1, -3, 4, 0, -4, 3, -1, -5, 2, -2, 5, 1, -3, 4, 0, -4, 3, -1, -5, 2, -2, 5, 1, -3, 4, 0, -4, 3, -1, -5, 2, -2, 5, 1, -3, 4, 0, -4, 3, -1, -5, 2, -2, 5, 1, -3, 4, 0, -4, 3, -1, -5, 2, -2, 5, 1, -3, 4, 0, -4, 3, -1, -5, 2, -2, 5, 1, -3, 4, 0, -4, 3, -1, -5, 2, -2, 5, 1, -3, 4, 0, -4, 3, -1, -5, 2, -2, 5, 1, -3, 4, 0, -4, 3, -1, -5, 2, -2, 5, 1, -3, 4, 0, -4, 3, -1, -5, 2, -2, 5, 1, -3, 4, 0, -4, 3, -1, -5, 2, -2, 5, 1, -3, 4, 0, -4, 3, -1, -5, 2, -2, 5, 1, -3, 4, 0, -4, 3, -1, -5, 2, -2, 5, 1, -3}] : i8[4,40]  # up/weight
%12 = const[value=f32[40]{0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01}] : f32[40]  # up/w_scale
%13 = const[value=f32[40]{0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5}] : f32[40]  # up/bias
%14 = pack_rows(%3, %1) : f32[1,packed_tokens,4]  # embed/pack_rows
%15 = layer_norm[axis=-1, epsilon=1e-12](%14, %4, %5) : f32[1,packed_tokens,4]  # embed/ln
%16 = fused_linear[epilogue=()](%15, %6) : f32[1,packed_tokens,12]  # qkv
%17 = attention_packed[num_heads=2, scale=0.5](%16, %1, %10) : f32[1,packed_tokens,4]  # attn
%18 = add(%17, %15) : f32[1,packed_tokens,4]  # residual
%19 = qlinear[act="static", a_scale=0.05, a_zero=3, smooth=false, epilogue=(bias, gelu_erf)](%18, %11, %12, %13) : f32[1,packed_tokens,40]  # up
%20 = unpack_rows(%19, %1) : f32[B,S,40]  # out/unpack_rows
output "y" = %20
"#;

/// The scalar kernels make the program the same on every CPU.
fn lowered(threads: usize) -> Program {
    let g = ir::text::parse(LAYER, None).unwrap();
    lower(
        &g,
        LowerOptions {
            threads,
            kernel: Some(Int8Kernel::Scalar),
            jit: false,
        },
    )
    .unwrap()
}

#[test]
fn lowered_layer_two_threads() {
    let p = lowered(2);
    p.verify().unwrap();
    insta::assert_snapshot!(p.to_text());
}

#[test]
fn lowered_layer_one_thread_splits_nothing() {
    let p = lowered(1);
    p.verify().unwrap();
    for st in &p.steps {
        if let Some(s) = &st.split {
            assert!(
                matches!(s, GemmSplit::Columns(c) if c.len() == 1)
                    || matches!(s, GemmSplit::Rows { threads: 1 }),
                "{}: {s}",
                st.node
            );
        }
    }
}

#[test]
fn weights_are_packed_and_not_kept_plain() {
    let p = lowered(2);
    // The two products' weights are packed; the rest of the constants are plain values.
    assert_eq!(p.weights.len(), 2);
    for w in &p.weights {
        assert_eq!(p.values[w.source].home, Home::WeightOnly);
    }
    let up = p.steps.iter().find(|s| s.node == "up").unwrap();
    // 40 columns in panels of 16 (scalar): three panels, two to the first thread.
    assert_eq!(up.split, Some(GemmSplit::Columns(vec![0..32, 32..40])));
    let qkv = p.steps.iter().find(|s| s.node == "qkv").unwrap();
    // One panel of 12 columns cannot be shared by two threads: they share the rows.
    assert_eq!(qkv.split, Some(GemmSplit::Rows { threads: 2 }));
}

#[test]
fn a_weight_that_is_not_constant_is_refused_by_name() {
    let g = ir::text::parse(
        "%0 = input[name=\"x\"] : f32[B,4]\n\
         %1 = input[name=\"w\"] : f32[4,4]\n\
         %2 = fused_linear[epilogue=()](%0, %1) : f32[B,4]  # proj\n\
         output \"y\" = %2\n",
        None,
    )
    .unwrap();
    let e = lower(
        &g,
        LowerOptions {
            threads: 1,
            kernel: None,
            jit: false,
        },
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "node `proj` (fused_linear): the weight must be a constant"
    );
}

/// Three int8 GEMMs with an f32 op between the first two: each int8 weight GEMM names the next
/// one in program order (whatever runs between), with what its thread plan depends on (the
/// second ends in a LayerNorm: row-wide), and the last names none.
#[test]
fn each_int8_gemm_names_the_next_one() {
    let text = "\
%0 = input[name=\"x\"] : f32[B,4]
%1 = const[value=i8[4,4]{1, -2, 3, -4, 5, -6, 7, -8, 9, -10, 11, -12, 13, -14, 15, -16}] : i8[4,4]  # a/weight
%2 = const[value=f32[4]{0.01, 0.02, 0.03, 0.04}] : f32[4]  # a/w_scale
%3 = const[value=f32[4]{0.5, -0.25, 1.0, 0.0}] : f32[4]  # a/bias
%4 = const[value=f32[4]{1.5, 0.75, 1.0, 1.0}] : f32[4]  # gamma
%5 = const[value=f32[4]{0.1, 0.0, -0.2, 0.0}] : f32[4]  # beta
%6 = qlinear[act=\"static\", a_scale=0.02, a_zero=120, smooth=false, epilogue=(bias)](%0, %1, %2, %3) : f32[B,4]  # a
%7 = erf(%6) : f32[B,4]  # between
%8 = qlinear[act=\"static\", a_scale=0.02, a_zero=120, smooth=false, epilogue=(bias, layer_norm 1e-5)](%7, %1, %2, %3, %4, %5) : f32[B,4]  # b
%9 = qlinear[act=\"static\", a_scale=0.02, a_zero=120, smooth=false, epilogue=(bias)](%8, %1, %2, %3) : f32[B,4]  # c
output \"y\" = %9
";
    let g = ir::text::parse(text, None).unwrap();
    let p = lower(
        &g,
        LowerOptions {
            threads: 2,
            kernel: Some(Int8Kernel::Scalar),
            jit: false,
        },
    )
    .unwrap();
    p.verify().unwrap();
    let step = |node: &str| p.steps.iter().position(|s| s.node == node).unwrap();
    let weight = |node: &str| p.steps[step(node)].weight.unwrap().1;
    let a = p.steps[step("a")].then.expect("a names b");
    assert_eq!((a.step, a.weight), (step("b"), weight("b")));
    assert!(a.row_step, "b's epilogue has a LayerNorm");
    assert_eq!(a.head_columns, 1);
    let b = p.steps[step("b")].then.expect("b names c");
    assert_eq!(
        (b.step, b.weight, b.row_step),
        (step("c"), weight("c"), false)
    );
    assert_eq!(p.steps[step("c")].then, None);
    assert_eq!(p.steps[step("between")].then, None);
    let text = p.to_text();
    let line = |node: &str| {
        text.lines()
            .find(|l| l.ends_with(&format!("# {node}")))
            .unwrap()
            .to_string()
    };
    assert!(
        line("a").contains(&format!(" then=w{}", weight("b"))),
        "{}",
        line("a")
    );
    assert!(!line("c").contains("then="), "{}", line("c"));
    // The verifier refuses a hint that names an earlier step, or a weight its step does not read.
    let mut backwards = p.clone();
    backwards.steps[step("c")].then = Some(codegen::lower::ThenGemm {
        step: step("a"),
        ..a
    });
    assert!(backwards.verify().is_err());
    let mut wrong = p.clone();
    wrong.steps[step("a")].then = Some(codegen::lower::ThenGemm {
        weight: weight("c"),
        ..a
    });
    assert!(wrong.verify().is_err());
}

/// The line of the dump that says whether the batch may run in parts (see
/// `codegen::lower::BatchSplit`), for a program whose body is `body` after an input `x`.
fn batch_line(x: &str, body: &str) -> String {
    let g = ir::text::parse(&format!("%0 = input[name=\"x\"] : {x}\n{body}"), None).unwrap();
    let p = lower(
        &g,
        LowerOptions {
            threads: 1,
            kernel: None,
            jit: false,
        },
    )
    .unwrap();
    p.to_text().lines().nth(1).unwrap().to_string()
}

/// Row-local programs split (elementwise, a row-wise product, LayerNorm and softmax away from
/// the batch, a gather of batched ids, the sequence length read as data); one op that would
/// mix rows keeps the batch whole and the dump names it.
#[test]
fn the_batch_splits_only_where_rows_stay_apart() {
    let w = "%1 = const[value=f32[2,3]{1.0, 2.0, 3.0, 4.0, 5.0, 6.0}] : f32[2,3]\n";
    let split = [
        ("f32[B,S,2]", format!("{w}%2 = fused_linear[epilogue=()](%0, %1) : f32[B,S,3]\n%3 = softmax[axis=-1](%2) : f32[B,S,3]\noutput \"y\" = %3\n")),
        ("f32[B,S,2]", "%1 = const[value=f32[2]{1.0, 1.0}] : f32[2]\n%2 = layer_norm[axis=-1, epsilon=1e-5](%0, %1) : f32[B,S,2]\noutput \"y\" = %2\n".to_string()),
        ("i64[B,S]", format!("{w}%2 = gather[axis=0](%1, %0) : f32[B,S,3]\noutput \"y\" = %2\n")),
        ("f32[B,S]", "%1 = shape[start=1, end=2](%0) : i64[1]\n%2 = cast[to=f32](%1) : f32[1]\n%3 = mul(%0, %2) : f32[B,S]\noutput \"y\" = %3\n".to_string()),
    ];
    for (x, body) in &split {
        assert_eq!(batch_line(x, body), "split batch=B", "{body}");
    }
    let whole = [
        ("f32[B,4]", "%1 = reduce_mean[axes=[0], keepdims=true](%0) : f32[1,4]\n%2 = sub(%0, %1) : f32[B,4]\noutput \"y\" = %2\n", "%1 (reduce_mean): an op that is not known to keep batch rows apart"),
        ("f32[B,4]", "%1 = softmax[axis=0](%0) : f32[B,4]\noutput \"y\" = %1\n", "normalises across the batch"),
        ("f32[B,4]", "%1 = shape[start=0, end=1](%0) : i64[1]\n%2 = cast[to=f32](%1) : f32[1]\n%3 = mul(%0, %2) : f32[B,4]\noutput \"y\" = %3\n", "uses the batch size as data"),
        ("f32[B,4]", "%1 = const[value=i64[2]{4, -1}] : i64[2]\n%2 = reshape[allowzero=false](%0, %1) : f32[4,B]\noutput \"y\" = %2\n", "a reshape that may move the batch"),
        ("f32[B,4]", "%1 = transpose[perm=[1, 0]](%0) : f32[4,B]\noutput \"y\" = %1\n", "output \"y\" does not have the batch as dim 0"),
    ];
    for (x, body, why) in whole {
        let line = batch_line(x, body);
        assert!(
            line.starts_with("// batch not split: ") && line.contains(why),
            "{body}\n{line}"
        );
    }
}

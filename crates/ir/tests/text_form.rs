//! The text form: round trips and parse errors.

use ir::{text, DType, Dim, Graph, IrError, Op, Tensor, TensorType};

const SAMPLE: &str = r#"%0 = input[name="input_ids"] : i64[batch,sequence]  # input_ids
%1 = const[value=f32[4,3]{extern}] : f32[4,3]  # emb.weight
%2 = gather[axis=0](%1, %0) : f32[batch,sequence,3]  # /emb/Gather
%3 = const[value=i64[3]{0, 0, 3}] : i64[3]  # shape
%4 = reshape[allowzero=false](%2, %3) : f32[batch,sequence,3]  # /Reshape
%5 = dynamic_quantize_linear(%4) : (u8[batch,sequence,3], f32[], u8[])  # /dq
%6 = dequantize_linear[axis=1](%5, %5.1, %5.2) : f32[batch,sequence,3]  # /deq
%7 = gemm[alpha=1.0, beta=0.5, trans_a=false, trans_b=true](%6, %1) : f32[*]  # /Gemm
%8 = const[value=f32[]{-3.4028235e38}] : f32[]  # big
%9 = mul(%6, %8) : f32[batch,sequence,3]  # /mul
%10 = constant_of_shape[value=f32[1]{0.0}](%3) : f32[0,0,3]  # /cos
%11 = attention[num_heads=3, scale=0.125](%6, %6, %6) : f32[batch,sequence,3]  # /attn
%12 = reduce_mean[axes=[-1], keepdims=true](%11) : f32[batch,sequence,1]  # /rm
%13 = gelu[approx="tanh"](%12) : f32[batch,sequence,1]  # /gelu
output "hidden" = %9
output "other \"quoted\"" = %13
"#;

#[test]
fn print_parse_print_is_identity() {
    let g = text::parse(SAMPLE, None).unwrap();
    g.verify().unwrap();
    let printed = text::print(&g).unwrap();
    assert_eq!(printed, SAMPLE);
    let again = text::print(&text::parse(&printed, None).unwrap()).unwrap();
    assert_eq!(again, printed);
}

/// The verifier checks types, not only structure: each of these changes to the sample parses
/// (the text form carries any declared type) and is refused with the reason.
#[test]
fn verifier_refuses_ill_typed_graphs() {
    for (from, to, reason) in [
        (
            "gelu[approx=\"tanh\"](%12) : f32[batch,sequence,1]",
            "gelu[approx=\"tanh\"](%12) : f32[12*batch*sequence]",
            "gelu keeps its input's type",
        ),
        (
            "attention[num_heads=3,",
            "attention[num_heads=12,",
            "12 heads do not divide the hidden size",
        ),
        (
            "attention[num_heads=3, scale=0.125](%6, %6, %6) : f32[batch,sequence,3]",
            "attention[num_heads=3, scale=0.125](%6, %6, %6) : f32[batch,sequence,6]",
            "attention keeps the query's type",
        ),
        (
            "reduce_mean[axes=[-1], keepdims=true](%11) : f32[batch,sequence,1]  # /rm\n%13 = gelu[approx=\"tanh\"](%12) : f32[batch,sequence,1]",
            "reduce_mean[axes=[-1], keepdims=true](%11) : f32[batch,sequence,1]  # /rm\n%13 = gelu[approx=\"tanh\"](%12) : i64[batch,sequence,1]",
            "gelu keeps its input's type",
        ),
    ] {
        assert!(SAMPLE.contains(from), "{from}");
        let text = SAMPLE.replacen(from, to, 1);
        let g = text::parse(&text, None).unwrap();
        let e = g.verify().expect_err(to).to_string();
        assert!(e.contains(reason), "{to}: {e}");
    }
    let cast =
        "%0 = input[name=\"x\"] : f32[2]\n%1 = cast[to=i64](%0) : f32[2]\noutput \"y\" = %1\n";
    let e = text::parse(cast, None)
        .unwrap()
        .verify()
        .unwrap_err()
        .to_string();
    assert!(e.contains("cast to i64 declared as f32[2]"), "{e}");
}

#[test]
fn extern_constants_bind_from_a_source() {
    let mut src = std::collections::HashMap::new();
    src.insert(
        "emb.weight".to_string(),
        Tensor::from_vec(vec![4, 3], (0..12).map(|v| v as f32).collect()),
    );
    let g = text::parse(SAMPLE, Some(&src)).unwrap();
    let id = g
        .node_ids()
        .find(|&n| g.node(n).name == "emb.weight")
        .unwrap();
    assert_eq!(
        g.const_value(id.into()).unwrap().to_vec::<f32>().unwrap()[11],
        11.0
    );

    src.insert(
        "emb.weight".to_string(),
        Tensor::from_vec(vec![3, 4], vec![0f32; 12]),
    );
    let err = text::parse(SAMPLE, Some(&src)).unwrap_err();
    assert!(err.to_string().contains("emb.weight"), "{err}");
}

#[test]
fn parse_errors_name_the_line() {
    let cases = [
        ("%0 = frobnicate : f32[1]", "unknown op"),
        ("%0 = erf(%3) : f32[1]", "used before it is defined"),
        ("%0 = input[name=\"x\"] : f33[1]", "dtype"),
        (
            "%0 = input[name=\"x\"] : f32[1]\n%0 = erf(%0) : f32[1]",
            "defined twice",
        ),
        (
            "%0 = input[name=\"x\"] : f32[1]\n%1 = add(%0) : f32[1]",
            "takes 2 inputs",
        ),
        (
            "%0 = input[name=\"x\"] : f32[1]\n%1 = softmax[axis=1, bogus=2](%0) : f32[1]",
            "unknown attribute",
        ),
        ("%0 = const[value=i64[2]{1}] : i64[2]", "element count"),
        (
            "%0 = input[name=\"x\"] : f32[1]\n%1 = erf(%0.1) : f32[1]",
            "no output 1",
        ),
    ];
    for (src, want) in cases {
        let err = text::parse(src, None).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, IrError::Parse { .. }), "{src}: {msg}");
        assert!(msg.contains(want), "{src}: `{msg}` lacks `{want}`");
    }
}

#[test]
fn verifier_rejects_a_constant_whose_type_disagrees() {
    let mut g = Graph::new();
    let c = g.add_const("c", Tensor::from_vec(vec![2], vec![1i64, 2]));
    g.node_mut(c.node).outputs[0] = TensorType::new(DType::I64, vec![Dim::fixed(3)]);
    g.set_output("c", c);
    let err = g.verify().unwrap_err();
    assert!(err.to_string().contains("declared as"), "{err}");
}

#[test]
fn replace_uses_moves_readers_and_outputs() {
    let mut g = Graph::new();
    let t = TensorType::new(DType::F32, vec![Dim::sym("B")]);
    let x = g.add_input("x", t.clone());
    let a = g
        .add_node(Op::Unary(ir::UnaryOp::Exp), "a", &[x], vec![t.clone()])
        .unwrap();
    let b = g
        .add_node(
            Op::Unary(ir::UnaryOp::Neg),
            "b",
            &[a.into()],
            vec![t.clone()],
        )
        .unwrap();
    g.set_output("y", a.into());
    g.replace_uses(a.into(), x).unwrap();
    assert_eq!(g.node_inputs(b), vec![x]);
    assert_eq!(g.outputs()[0].1, x);
    assert!(g.consumers(a.into()).is_empty());
    g.verify().unwrap();
}

#[test]
fn dims_multiply_and_divide_symbolically() {
    let b = Dim::sym("batch");
    let s = Dim::sym("sequence");
    let bs = b.mul(&s).mul(&Dim::fixed(12));
    assert_eq!(bs.to_string(), "12*batch*sequence");
    assert_eq!(Dim::parse("12*batch*sequence").unwrap(), bs);
    assert_eq!(
        bs.div(&Dim::fixed(4)).unwrap().to_string(),
        "3*batch*sequence"
    );
    assert_eq!(bs.div(&s).unwrap(), b.mul(&Dim::fixed(12)));
    assert!(bs.div(&Dim::sym("other")).is_none());
    assert!(bs.div(&Dim::fixed(5)).is_none());
    let mut env = std::collections::HashMap::new();
    env.insert("batch".to_string(), 2);
    env.insert("sequence".to_string(), 7);
    assert_eq!(bs.eval(&env).unwrap(), 168);
    env.remove("sequence");
    assert!(matches!(bs.eval(&env), Err(IrError::UnboundSymbol(s)) if s == "sequence"));
}

#[test]
fn tensor_literals_round_trip_every_dtype() {
    for lit in [
        "f32[2]{1.5, -inf}",
        "bf16[1]{0.5}",
        "i8[2]{-128, 127}",
        "u8[1]{255}",
        "i32[0]{}",
        "i64[2,1]{-9223372036854775808, 9223372036854775807}",
        "bool[2]{true, false}",
    ] {
        let t = Tensor::from_text(lit).unwrap();
        assert_eq!(t.to_text(64), lit);
    }
}

/// The ops added for BERT-family exports (comparisons with equality, clip, split, tile) print
/// and parse back unchanged.
#[test]
fn export_ops_round_trip() {
    let sample = r#"%0 = input[name="a"] : f32[2,3]
%1 = input[name="b"] : f32[3]
%2 = less_or_equal(%0, %1) : bool[2,3]  # /le
%3 = greater_or_equal(%0, %1) : bool[2,3]  # /ge
%4 = const[value=f32[]{-inf}] : f32[]  # lo
%5 = const[value=f32[]{6.0}] : f32[]  # hi
%6 = clip(%0) : f32[2,3]  # /clip_none
%7 = clip(%0, %4) : f32[2,3]  # /clip_min
%8 = clip(%6, %4, %5) : f32[2,3]  # /clip_both
%9 = split[axis=-1, num_outputs=2](%8) : (f32[2,2], f32[2,1])  # /split
%10 = const[value=i64[3]{1, 0, 2}] : i64[3]  # sizes
%11 = split[axis=1, num_outputs=3](%0, %10) : (f32[2,1], f32[2,0], f32[2,2])  # /split_sizes
%12 = const[value=i64[2]{2, 1}] : i64[2]  # reps
%13 = tile(%0, %12) : f32[4,3]  # /tile
output "le" = %2
output "ge" = %3
output "t" = %13
output "c1" = %7
output "c2" = %8
output "s1" = %9.1
output "s2" = %11.2
"#;
    let g = text::parse(sample, None).unwrap();
    g.verify().unwrap();
    assert_eq!(text::print(&g).unwrap(), sample);
    let split = g
        .node_ids()
        .find(|&n| g.node(n).name == "/split_sizes")
        .unwrap();
    assert_eq!(g.node(split).op.num_outputs(), 3);
    assert!(
        text::parse(&sample.replace("num_outputs=3", "num_outputs=0"), None).is_err(),
        "zero outputs must not parse"
    );
}

/// The ops added for issue 8 (sin, cos, round, reduce_prod, gather_nd, pad, round_to_f16,
/// round_to_bf16, trilu, arg_max, arg_min, scatter_nd, scatter_elements, einsum) print and
/// parse back
/// unchanged, attributes included.
#[test]
fn issue8_ops_round_trip() {
    let sample = r#"%0 = input[name="a"] : f32[2,3,4]
%1 = input[name="i"] : i64[2,1]
%2 = sin(%0) : f32[2,3,4]  # /sin
%3 = cos(%2) : f32[2,3,4]  # /cos
%4 = round(%3) : f32[2,3,4]  # /round
%5 = reduce_prod[axes=[-1], keepdims=false](%4) : f32[2,3]  # /prod
%6 = gather_nd[batch_dims=1](%0, %1) : f32[2,4]  # /gnd
%7 = const[value=i64[6]{0, 0, 1, 0, 0, 1}] : i64[6]  # pads
%8 = pad[mode="reflect"](%0, %7) : f32[2,3,6]  # /pad
%9 = round_to_f16(%8) : f32[2,3,6]  # /to_f16
%10 = round_to_bf16(%9) : f32[2,3,6]  # /to_bf16
%11 = trilu[upper=false](%10) : f32[2,3,6]  # /tril
%12 = arg_max[axis=-1, keepdims=false, last=false](%11) : i64[2,3]  # /argmax
%13 = arg_min[axis=0, keepdims=true, last=true](%11) : i64[1,3,6]  # /argmin
%14 = scatter_nd[reduction="add"](%0, %1, %6) : f32[2,3,4]  # /snd
%15 = scatter_elements[axis=-1, reduction="none"](%11, %13, %11) : f32[2,3,6]  # /se
%16 = einsum[equation="ij->ji"](%1) : i64[1,2]  # /einsum
output "p" = %5
output "g" = %6
output "pd" = %11
output "am" = %12
output "an" = %13
output "snd" = %14
output "se" = %15
output "es" = %16
"#;
    let g = text::parse(sample, None).unwrap();
    g.verify().unwrap();
    assert_eq!(text::print(&g).unwrap(), sample);
    assert!(
        text::parse(&sample.replace("batch_dims=1", "batch=1"), None).is_err(),
        "an unknown attribute must not parse"
    );
    assert!(
        text::parse(&sample.replace("reflect", "mirror"), None).is_err(),
        "an unknown pad mode must not parse"
    );
    assert!(
        text::parse(&sample.replace("\"add\"", "\"sub\""), None).is_err(),
        "an unknown scatter reduction must not parse"
    );
}

/// A shape whose element count overflows (found by the `ir_text` fuzzer, where it panicked on
/// the overflowing product) is a parse error, as is a tensor of such a shape made from bytes.
#[test]
fn overflowing_shapes_are_errors() {
    let text = "%0 = input[bam=i32[111,111111111111111,111111111]{1}] : f32[1]\n";
    assert!(ir::text::parse(text, None).is_err());
    let huge = vec![1usize << 40, 1 << 40];
    let err = ir::Tensor::from_bytes(ir::DType::F32, huge, bytes::Bytes::new()).unwrap_err();
    assert!(matches!(err, ir::IrError::TensorTooLarge { .. }), "{err}");
}

/// Found by fuzzing `ir_text`: a dim product beyond u64 (`333333333*3333333333333333333`) is a
/// parse error, not an overflow; a product of dims that saturates fails when evaluated.
#[test]
fn overflowing_dims_are_errors() {
    let e = ir::text::parse(
        "%0 = input[name=\"x\"] : f32[333333333*3333333333333333333,3]\noutput \"y\" = %0\n",
        None,
    )
    .unwrap_err();
    assert!(e.to_string().contains("overflows"), "{e}");
    let big = ir::Dim::fixed(1 << 40).mul(&ir::Dim::sym("batch"));
    let bindings = std::collections::HashMap::from([("batch".to_string(), 1usize << 40)]);
    assert!(matches!(
        big.eval(&bindings),
        Err(ir::IrError::DimOverflow(_))
    ));
    let saturated = ir::Dim::fixed(1 << 40).mul(&ir::Dim::fixed(1 << 40));
    assert!(saturated.eval(&bindings).is_err());
    assert_eq!(
        ir::Dim::fixed(6)
            .mul(&ir::Dim::sym("s"))
            .eval(&std::collections::HashMap::from([("s".to_string(), 7)]))
            .unwrap(),
        42
    );
}

/// A loop whose body holds a loop: each body is a block after its node, numbering its own
/// values from `%0`, reading nothing of the graph around it but its inputs.
const LOOPS: &str = r#"%0 = input[name="n"] : i64[]  # n
%1 = const[value=bool[]{true}] : bool[]  # cond
%2 = input[name="x"] : f32[2]  # x
%3 = const[value=f32[]{0.5}] : f32[]  # step
%4 = loop[carried=1](%0, %1, %2, %3) : (f32[2], f32[unk0,2])  # outer
  body {
    %0 = input[name="i"] : i64[]  # i
    %1 = input[name="c"] : bool[]  # c
    %2 = input[name="acc"] : f32[2]  # acc
    %3 = input[name="step"] : f32[]  # step~1
    %4 = const[value=i64[]{2}] : i64[]  # two
    %5 = loop[carried=1](%4, %1, %2, %3) : f32[2]  # inner
      body {
        %0 = input[name="j"] : i64[]  # j
        %1 = input[name="d"] : bool[]  # d
        %2 = input[name="y"] : f32[2]  # y
        %3 = input[name="s"] : f32[]  # s
        %4 = add(%2, %3) : f32[2]  # y2
        output "d_out" = %1
        output "y2" = %4
      }
    output "c_out" = %1
    output "acc_out" = %5
    output "scan" = %2
  }
%5 = relu(%4.1) : f32[unk0,2]  # relu
output "final" = %4
output "scans" = %5
"#;

#[test]
fn loops_round_trip_with_their_bodies() {
    let g = text::parse(LOOPS, None).unwrap();
    g.verify().unwrap();
    assert_eq!(text::print(&g).unwrap(), LOOPS);
    let loop_id = g.node_ids().find(|&id| g.node(id).name == "outer").unwrap();
    let Op::Loop { carried, body } = &g.node(loop_id).op else {
        panic!("not a loop")
    };
    assert_eq!(*carried, 1);
    let parts = ir::LoopParts::of(*carried, body).unwrap();
    assert_eq!((parts.captured, parts.scans), (1, 1));
    assert_eq!(g.node(loop_id).outputs.len(), 2);
    // Graphs compare by structure, so ops holding them do too.
    assert!(text::parse(LOOPS, None).unwrap() == g);
    let other = text::parse(&LOOPS.replace("i64[]{2}", "i64[]{3}"), None).unwrap();
    assert!(other != g);
}

#[test]
fn loop_text_errors_name_the_line() {
    for (text, line, reason) in [
        (
            format!(
                "{}      body {{\n",
                &LOOPS[..LOOPS.find("      body {").unwrap()]
            ),
            13,
            "not closed",
        ),
        (format!("{LOOPS}}}\n"), 29, "closes no block"),
        ("body {\n}\n".to_string(), 1, "follows no node"),
        (
            // A body sees only its inputs: `%5` of the enclosing graph is not in scope.
            LOOPS.replace("%4 = add(%2, %3) : f32[2]", "%4 = add(%2, %5) : f32[2]"),
            18,
            "used before it is defined",
        ),
        (
            LOOPS.replace(
                "  body {\n    %0 = input[name=\"i\"]",
                "  inner {\n    %0 = input[name=\"i\"]",
            ),
            5,
            "`body`: missing",
        ),
    ] {
        let e = text::parse(&text, None).unwrap_err();
        let IrError::Parse { line: at, message } = &e else {
            panic!("{e}")
        };
        assert!(*at == line && message.contains(reason), "{e}\n{text}");
    }
}

#[test]
fn verifier_checks_loops_and_their_bodies() {
    for (from, to, reason) in [
        (
            "%2 = input[name=\"y\"] : f32[2]",
            "%2 = input[name=\"y\"] : i64[2]",
            "carried value 0 changes dtype",
        ),
        (
            ": (f32[2], f32[unk0,2])  # outer",
            ": (f32[2], f32[2])  # outer",
            "scan output 0",
        ),
        (
            "%1 = const[value=bool[]{true}] : bool[]",
            "%1 = const[value=i64[]{1}] : i64[]",
            "the condition one bool",
        ),
        (
            "%4 = add(%2, %3) : f32[2]",
            "%4 = relu(%2) : f32[3]",
            "node `outer`: loop body: verifier: node `inner`: loop body: verifier: node `y2`: relu keeps",
        ),
    ] {
        assert!(LOOPS.contains(from), "{from}");
        let text = LOOPS.replacen(from, to, 1);
        let g = text::parse(&text, None).unwrap();
        let e = g.verify().expect_err(to).to_string();
        assert!(e.contains(reason), "{to}: {e}");
    }
}

#[test]
fn deeply_nested_blocks_are_an_error_not_a_stack_overflow() {
    let line = "%0 = input[name=\"n\"] : i64[]\n%1 = input[name=\"c\"] : bool[]\n\
                %2 = loop[carried=0](%0, %1) : ()\n  body {\n";
    let text = line.repeat(100_000);
    let e = text::parse(&text, None).unwrap_err().to_string();
    assert!(e.contains("nest more than"), "{e}");
}

/// `good` with `from` replaced by `to` fails to parse or to verify, with an error containing
/// `reason`.
fn assert_refused(good: &str, from: &str, to: &str, reason: &str) {
    assert!(good.contains(from), "{from}");
    let text = good.replacen(from, to, 1);
    let e = match text::parse(&text, None) {
        Ok(g) => g.verify().expect_err(to).to_string(),
        Err(e) => e.to_string(),
    };
    assert!(e.contains(reason), "{to}: {e}");
}

/// `fork_u8_rows` and its reader `act="token_u8"`: a graph that uses them right verifies and
/// round-trips; each misuse is refused, naming what is wrong.
#[test]
fn verifier_checks_rows_quantized_by_their_producer() {
    let good = "\
%0 = input[name=\"x\"] : f32[B,S,4]
%1 = const[value=i8[4,4]{}] : i8[4,4]
%2 = const[value=f32[4]{}] : f32[4]
%3 = qlinear[act=\"token\", smooth=false, epilogue=(layer_norm 1e-5, fork_u8_rows smooth)](%0, %1, %2, %2, %2, %2) : (f32[B,S,4], u8[B,S,4], f32[B,S,1], i32[B,S,1])
%4 = qlinear[act=\"token_u8\", smooth=false, epilogue=(bias)](%3.1, %1, %2, %3.2, %3.3, %2) : f32[B,S,4]
output \"y\" = %4
output \"ln\" = %3
";
    let good = good
        .replacen(
            "i8[4,4]{}",
            &format!("i8[4,4]{{{}}}", vec!["0"; 16].join(", ")),
            1,
        )
        .replacen("f32[4]{}", "f32[4]{1.0, 1.0, 1.0, 1.0}", 1);
    let g = text::parse(&good, None).unwrap();
    g.verify().unwrap();
    assert_eq!(text::print(&g).unwrap(), good);
    for (from, to, reason) in [
        (
            "fork_u8_rows smooth)](%0, %1, %2, %2, %2, %2)",
            "fork_u8_rows smooth, bias)](%0, %1, %2, %2, %2, %2, %2)",
            "4 output types given, the op has 1",
        ),
        (
            "(f32[B,S,4], u8[B,S,4], f32[B,S,1], i32[B,S,1])",
            "(f32[B,S,4], u8[B,S,4], f32[B,S,1], f32[B,S,1])",
            "the outputs are f32, u8, f32, i32",
        ),
        (
            "(f32[B,S,4], u8[B,S,4], f32[B,S,1], i32[B,S,1])",
            "(f32[B,S,4], u8[B,S,4], f32[B,S,4], i32[B,S,1])",
            "the outputs are f32, u8, f32, i32",
        ),
        (
            "(%3.1, %1, %2, %3.2, %3.3, %2)",
            "(%3, %1, %2, %3.2, %3.3, %2)",
            "act `token_u8` reads u8 rows",
        ),
        (
            "(%3.1, %1, %2, %3.2, %3.3, %2)",
            "(%3.1, %1, %2, %3.3, %3.2, %2)",
            "needs each row's scale (f32[…, 1]) and zero point (i32[…, 1])",
        ),
        (
            "(%3.1, %1, %2, %3.2, %3.3, %2)",
            "(%3.1, %1, %2, %2)",
            "input",
        ),
        (
            "act=\"token_u8\"",
            "act=\"token_8\"",
            "token, token_u8, tensor or static",
        ),
    ] {
        assert_refused(&good, from, to, reason);
    }
}

/// `quant_heads` and the split q, k, v of attention: a graph that uses them right verifies and
/// round-trips; each misuse is refused, naming what is wrong.
#[test]
fn verifier_checks_quantized_heads() {
    let good = "\
%0 = input[name=\"x\"] : f32[B,S,4]
%1 = input[name=\"m\"] : f32[B,1,1,S]
%2 = const[value=i8[4,12]{}] : i8[4,12]
%3 = const[value=f32[12]{}] : f32[12]
%4 = qlinear[act=\"token\", smooth=false, epilogue=(quant_heads 2)](%0, %2, %3) : (u8[B,S,8], f32[B,S,4], f32[B,S,4])
%5 = attention_qkv[num_heads=2, scale=0.5, products=\"int8\"](%4, %4.1, %4.2, %1) : f32[B,S,4]
output \"y\" = %5
";
    let zeros = |n: usize, z: &str| vec![z; n].join(", ");
    let good = good
        .replacen("i8[4,12]{}", &format!("i8[4,12]{{{}}}", zeros(48, "0")), 1)
        .replacen("f32[12]{}", &format!("f32[12]{{{}}}", zeros(12, "0.0")), 1);
    let g = text::parse(&good, None).unwrap();
    g.verify().unwrap();
    assert_eq!(text::print(&g).unwrap(), good);
    for (from, to, reason) in [
        (
            "epilogue=(quant_heads 2)](%0, %2, %3) : (u8[B,S,8], f32[B,S,4], f32[B,S,4])\n%5 = attention_qkv[num_heads=2, scale=0.5, products=\"int8\"](%4, %4.1, %4.2, %1)",
            "epilogue=(quant_heads 2, gelu_erf)](%0, %2, %3) : f32[B,S,12]\n%5 = attention_qkv[num_heads=2, scale=0.5, products=\"int8\"](%4, %1)",
            "must be the last epilogue step",
        ),
        (
            "(u8[B,S,8], f32[B,S,4], f32[B,S,4])",
            "(u8[B,S,12], f32[B,S,4], f32[B,S,4])",
            "the outputs are u8, f32, f32",
        ),
        (
            "epilogue=(quant_heads 2)",
            "epilogue=(quant_heads 5)",
            "the outputs are u8, f32, f32",
        ),
        (
            "products=\"int8\"](%4",
            "products=\"f32\"](%4",
            "read by 8-bit products only",
        ),
        (
            "(%4, %4.1, %4.2, %1)",
            "(%4, %4.1, %4.2, %1, %1)",
            "5 inputs, expected q, k and v (3), a mask bias at most",
        ),
        (
            "(%4, %4.1, %4.2, %1)",
            "(%4, %4.1)",
            "2 inputs, expected q, k and v (3)",
        ),
        (
            "(%4, %4.1, %4.2, %1) : f32[B,S,4]",
            "(%4, %4.1, %4.2, %1) : u8[B,S,4]",
            "the output is f32 (v's type), declared u8[B,S,4]",
        ),
        (
            "num_heads=2, scale",
            "num_heads=4, scale",
            "are not the quantized q and k and the v of 4 heads",
        ),
    ] {
        assert_refused(&good, from, to, reason);
    }
}

/// An attention op that quantizes its output (`out_u8`, moved there from the output
/// projection): the attributes round-trip, the output is u8 and the smoothing factors come
/// last, after the optional mask bias; each misuse is refused, naming what is wrong.
#[test]
fn verifier_checks_attention_output_quantization() {
    let good = "\
%0 = input[name=\"qkv\"] : f32[B,S,12]
%1 = input[name=\"m\"] : f32[B,1,1,S]
%2 = input[name=\"smooth\"] : f32[4]
%3 = attention_qkv[num_heads=2, scale=0.5, out_scale=0.02, out_zero=131, out_smooth=true](%0, %1, %2) : u8[B,S,4]
output \"y\" = %3
";
    let g = text::parse(good, None).unwrap();
    g.verify().unwrap();
    assert_eq!(text::print(&g).unwrap(), good);
    // Without smoothing factors, and without a mask bias.
    let plain = good.replace("out_smooth=true](%0, %1, %2)", "out_smooth=false](%0)");
    text::parse(&plain, None).unwrap().verify().unwrap();
    let no_bias = good.replace("(%0, %1, %2)", "(%0, %2)");
    text::parse(&no_bias, None).unwrap().verify().unwrap();
    for (from, to, reason) in [
        (": u8[B,S,4]", ": f32[B,S,4]", "the output is u8 (quantized), declared f32"),
        (
            "%2 = input[name=\"smooth\"] : f32[4]",
            "%2 = input[name=\"smooth\"] : f32[5]",
            "smoothing factors f32[5] must be f32, one per output column",
        ),
        (
            "(%0, %1, %2)",
            "(%0, %1, %2, %2)",
            "4 inputs, expected q, k and v (1), a mask bias at most and the output's smoothing factors",
        ),
        ("(%0, %1, %2)", "(%0)", "expected q, k and v (1), a mask bias at most and the output's smoothing factors"),
        ("out_zero=131, ", "", "out_zero"),
        ("out_scale=0.02", "out_scale=\"x\"", "out_scale"),
    ] {
        assert_refused(good, from, to, reason);
    }
    let unmerged = "%0 = input[name=\"q\"] : f32[B,S,4]\n\
                    %1 = attention[num_heads=2, scale=0.5, out_scale=0.02, out_zero=1, out_smooth=false](%0, %0, %0) : u8[B,S,4]\n";
    let e = text::parse(unmerged, None).unwrap_err().to_string();
    assert!(e.contains("no output quantization on `attention`"), "{e}");
}

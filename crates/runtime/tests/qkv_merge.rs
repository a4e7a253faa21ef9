//! Q, K and V projections that read one activation the same way are merged by the `fuse`
//! pipeline into one GEMM feeding `attention_qkv`. The merged GEMM computes each column as the
//! separate one did (the same quantized bytes and exact i32 sums, or the same f32 FMA chain over
//! k), and attention reads the same values at other strides, so a model runs bit for bit the
//! same with and without the merge: quantized per token, quantized static, and f32. With 8-bit
//! attention products the merged GEMM also quantizes q and k per head in its epilogue
//! (`quant_heads`), with the function attention used on the same values: still the same bits.
//! An output projection quantized statically moves its quantization into attention (`out_u8`:
//! attention writes the bytes the projection would have made of its f32 output, with the
//! projection's SmoothQuant factors or without): the same bits again.

mod common;

use common::{i8_matrix, list, run_fused_or_not, uniform, vector};
use runtime::{Model, TensorValue};

const HEADS: usize = 2;

/// How the attention output is read.
#[derive(Clone, Copy, PartialEq)]
enum Output {
    /// It is `y`.
    Plain,
    /// A static `qlinear` output projection reads it, with SmoothQuant factors or without.
    StaticProjection { smooth: bool },
}

/// `x → (q, k, v projections) → attention(mask) → [output projection] → y`, projections of
/// kind `kind`.
fn graph(kind: &str, k: usize, h: usize, int8_attention: bool, output: Output) -> String {
    let mut text = format!(
        "%0 = input[name=\"x\"] : f32[B,S,{k}]\n%1 = input[name=\"m\"] : f32[B,1,1,S]\n\
         %2 = {}  # smooth\n",
        vector(k, 2, 0.5, 2.0)
    );
    let mut id = 3;
    let mut outs = Vec::new();
    for (p, seed) in [("q", 10), ("k", 20), ("v", 30)] {
        let (w, proj) = match kind {
            "f32" => {
                let w = uniform(k * h, seed, -0.5, 0.5);
                (
                    format!("const[value=f32[{k},{h}]{{{}}}] : f32[{k},{h}]", list(&w)),
                    "fused_linear[epilogue=(bias)](%0, %W, %B)".to_string(),
                )
            }
            act => {
                let attrs = if act == "static" {
                    "act=\"static\", a_scale=0.013, a_zero=121"
                } else {
                    "act=\"token\""
                };
                (
                    i8_matrix(k, h, seed),
                    format!("qlinear[{attrs}, smooth=true, epilogue=(bias)](%0, %W, %S, %2, %B)"),
                )
            }
        };
        text += &format!("%{id} = {w}  # {p}/weight\n");
        text += &format!(
            "%{} = {}  # {p}/scale\n",
            id + 1,
            vector(h, seed + 1, 0.001, 0.01)
        );
        text += &format!(
            "%{} = {}  # {p}/bias\n",
            id + 2,
            vector(h, seed + 2, -1.0, 1.0)
        );
        let proj = proj
            .replace("%W", &format!("%{id}"))
            .replace("%S", &format!("%{}", id + 1))
            .replace("%B", &format!("%{}", id + 2));
        text += &format!("%{} = {proj} : f32[B,S,{h}]  # {p}\n", id + 3);
        outs.push(id + 3);
        id += 4;
    }
    text += &format!(
        "%{id} = attention[num_heads={HEADS}, scale=0.125{}](%{}, %{}, %{}, %1) : f32[B,S,{h}]  # att\n",
        if int8_attention {
            ", products=\"int8\""
        } else {
            ""
        },
        outs[0],
        outs[1],
        outs[2]
    );
    let y = match output {
        Output::Plain => id,
        Output::StaticProjection { smooth } => {
            text += &format!("%{} = {}  # out/weight\n", id + 1, i8_matrix(h, h, 40));
            text += &format!(
                "%{} = {}  # out/scale\n",
                id + 2,
                vector(h, 41, 0.001, 0.01)
            );
            text += &format!("%{} = {}  # out/smooth\n", id + 3, vector(h, 42, 0.5, 2.0));
            text += &format!("%{} = {}  # out/bias\n", id + 4, vector(h, 43, -1.0, 1.0));
            let smoothing = if smooth {
                format!(
                    "smooth=true, epilogue=(bias)](%{id}, %{}, %{}, %{}, %{})",
                    id + 1,
                    id + 2,
                    id + 3,
                    id + 4
                )
            } else {
                format!(
                    "smooth=false, epilogue=(bias)](%{id}, %{}, %{}, %{})",
                    id + 1,
                    id + 2,
                    id + 4
                )
            };
            // A scale that clips the largest outputs: saturation is part of what must agree.
            text += &format!(
                "%{} = qlinear[act=\"static\", a_scale=0.011, a_zero=131, {smoothing} : f32[B,S,{h}]  # out\n",
                id + 5
            );
            id + 5
        }
    };
    text += &format!("output \"y\" = %{y}\n");
    text
}

fn check(kind: &str) {
    check_with(kind, false, Output::Plain);
}

fn check_with(kind: &str, int8_attention: bool, output: Output) {
    for (k, h, b, seq) in [(48, 64, 3, 21), (40, 96, 2, 8)] {
        let g = ir::text::parse(&graph(kind, k, h, int8_attention, output), None).unwrap();
        let model = Model::from_graph(g).unwrap();
        let lens = [seq, seq / 2, 1];
        let mask: Vec<f32> = (0..b * seq)
            .map(|i| {
                if i % seq < lens[i / seq] {
                    0.0
                } else {
                    -3.4e38
                }
            })
            .collect();
        let feeds = [
            (
                "x",
                TensorValue::from_f32(vec![b, seq, k], uniform(b * seq * k, 5, -2.0, 2.0)).unwrap(),
            ),
            (
                "m",
                TensorValue::from_f32(vec![b, 1, 1, seq], mask).unwrap(),
            ),
        ];
        for threads in [1, 2] {
            let (plain, plain_text) = run_fused_or_not(&model, false, threads, &feeds);
            let (merged, merged_text) = run_fused_or_not(&model, true, threads, &feeds);
            assert!(!plain_text.contains("attention_qkv"), "{plain_text}");
            let qkv_out = if int8_attention && kind != "f32" {
                format!(
                    "quant_heads {HEADS})](%) : (u8[B,S,{}], f32[B,S,{}], f32[B,S,{h}])  # att_QKV",
                    2 * h,
                    2 * HEADS
                )
            } else {
                format!(": f32[B,S,{}]  # att_QKV", 3 * h)
            };
            // The QKV line, its operands (numbered by the printer) left out.
            let qkv_line = merged_text
                .lines()
                .find(|l| l.ends_with("# att_QKV"))
                .map(|l| match (l.find("](%"), l.rfind(") : ")) {
                    (Some(a), Some(b)) => format!("{}](%{}", &l[..a], &l[b..]),
                    _ => l.to_string(),
                })
                .unwrap_or_default();
            assert!(
                merged_text.contains("attention_qkv[") && qkv_line.ends_with(&qkv_out),
                "q, k, v were not merged into `{qkv_out}`:\n{merged_text}"
            );
            if let Output::StaticProjection { smooth } = output {
                let attention = format!("out_scale=0.011, out_zero=131, out_smooth={smooth}](%");
                assert!(
                    merged_text.contains(&attention)
                        && merged_text.contains(&format!(": u8[B,S,{h}]  # att\n"))
                        && merged_text.contains("smooth=false, epilogue=(bias)]("),
                    "the projection's quantization was not moved into attention:\n{merged_text}"
                );
            }
            compare(&plain, &merged, kind, k, h);
        }
    }
}

fn compare(plain: &[f32], merged: &[f32], kind: &str, k: usize, h: usize) {
    let differ = plain
        .iter()
        .zip(merged)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    assert_eq!(
        differ,
        0,
        "{kind}, k {k}, h {h}: {differ} of {} differ",
        plain.len()
    );
}

#[test]
fn merged_qkv_is_bit_exact_per_token() {
    check("token");
}

#[test]
fn merged_qkv_is_bit_exact_static() {
    check("static");
}

#[test]
fn merged_qkv_is_bit_exact_f32() {
    check("f32");
}

#[test]
fn merged_qkv_with_quantized_heads_is_bit_exact() {
    check_with("token", true, Output::Plain);
    check_with("static", true, Output::Plain);
    // An f32 QKV GEMM writes f32 only: int8 attention quantizes q and k itself.
    check_with("f32", true, Output::Plain);
}

#[test]
fn attention_quantizing_its_output_is_bit_exact() {
    for smooth in [true, false] {
        let output = Output::StaticProjection { smooth };
        // 8-bit products on quantized heads, on heads quantized by attention, and f32 products
        // (odd head widths go through the scratch path of the f32 kernel).
        check_with("static", true, output);
        check_with("f32", true, output);
        check_with("token", false, output);
    }
}

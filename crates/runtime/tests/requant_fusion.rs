//! A static activation quantization moved into the producing GEMM's epilogue (`requant_u8`,
//! made by the `fuse` pipeline) gives the bytes the reading GEMM made itself, so a model runs
//! bit for bit the same with and without the fusion, on the real kernels: after a GELU
//! epilogue (the FFN1 → FFN2 case) and after a LayerNorm epilogue (a row-wide step),
//! with awkward sizes that leave partial register blocks. A dynamic per-token quantization moved
//! into a LayerNorm epilogue (`fork_u8_rows`) likewise gives the bytes and row parameters the
//! reader made itself.

mod common;

use common::{i8_matrix, run_fused_or_not, uniform as values, vector};
use runtime::{Model, TensorValue};

/// `x → qlinear(producer epilogue) → qlinear(static, smoothed)`; the producer's epilogue is
/// `(bias, gelu_erf)` or `(bias, residual, layer_norm)`.
fn graph(k: usize, n1: usize, n2: usize, layer_norm: bool) -> String {
    let producer = if layer_norm {
        format!(
            "%4 = input[name=\"r\"] : f32[B,S,{n1}]\n%5 = {}  # ln/gamma\n%12 = {}  # ln/beta\n\
             %6 = qlinear[act=\"token\", smooth=false, epilogue=(bias, residual, layer_norm 1e-12)](%0, %1, %2, %3, %4, %5, %12) : f32[B,S,{n1}]  # p\n",
            vector(n1, 4, 0.5, 1.5),
            vector(n1, 5, -0.2, 0.2)
        )
    } else {
        "%4 = const[value=f32[1]{0.0}] : f32[1]  # unused\n%5 = const[value=f32[1]{0.0}] : f32[1]  # unused\n%6 = qlinear[act=\"token\", smooth=false, epilogue=(bias, gelu_erf)](%0, %1, %2, %3) : f32[B,S,N1]  # p\n".replace("N1", &n1.to_string())
    };
    format!(
        "%0 = input[name=\"x\"] : f32[B,S,{k}]\n\
         %1 = {}  # p/weight_s8\n\
         %2 = {}  # p/weight_scale\n\
         %3 = {}  # p/bias\n\
         {producer}\
         %7 = {}  # c/weight_s8\n\
         %8 = {}  # c/weight_scale\n\
         %9 = {}  # c/inv_smooth\n\
         %10 = {}  # c/bias\n\
         %11 = qlinear[act=\"static\", a_scale=0.011, a_zero=37, smooth=true, epilogue=(bias)](%6, %7, %8, %9, %10) : f32[B,S,{n2}]  # c\n\
         output \"y\" = %11\n",
        i8_matrix(k, n1, 1),
        vector(n1, 2, 0.001, 0.01),
        vector(n1, 3, -1.0, 1.0),
        i8_matrix(n1, n2, 7),
        vector(n2, 8, 0.001, 0.01),
        vector(n1, 9, 0.5, 2.0),
        vector(n2, 10, -1.0, 1.0),
    )
}

/// Runs `model` on `feeds` with and without the `fuse` pipeline, on one and two threads: the
/// fused graph's text must contain each of `fired` and the plain one `absent`, and the first
/// outputs must be equal bit for bit. `what` names the case in failures.
fn assert_fusion_is_bit_exact(
    model: &Model,
    feeds: &[(&str, TensorValue)],
    fired: &[&str],
    absent: &str,
    what: &str,
) {
    for threads in [1, 2] {
        let (plain, plain_text) = run_fused_or_not(model, false, threads, feeds);
        let (fused, fused_text) = run_fused_or_not(model, true, threads, feeds);
        assert!(!plain_text.contains(absent), "{plain_text}");
        assert!(
            fired.iter().all(|f| fused_text.contains(f)),
            "the fusion did not fire ({what}):\n{fused_text}"
        );
        assert!(!plain.is_empty() && plain.len() == fused.len(), "{what}");
        let differ = plain
            .iter()
            .zip(&fused)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(
            differ,
            0,
            "{differ} of {} outputs differ ({what}, threads {threads})",
            plain.len()
        );
    }
}

fn check(layer_norm: bool) {
    for (k, n1, n2, b, seq) in [(40, 72, 24, 3, 37), (64, 200, 50, 2, 65)] {
        let text = graph(k, n1, n2, layer_norm);
        let g = ir::text::parse(&text, None).unwrap();
        let model = Model::from_graph(g).unwrap();
        let x = TensorValue::from_f32(vec![b, seq, k], values(b * seq * k, 11, -2.0, 2.0)).unwrap();
        let mut feeds = vec![("x", x)];
        if layer_norm {
            let r = values(b * seq * n1, 12, -1.0, 1.0);
            feeds.push(("r", TensorValue::from_f32(vec![b, seq, n1], r).unwrap()));
        }
        let bytes = format!(": u8[B,S,{n1}]");
        assert_fusion_is_bit_exact(
            &model,
            &feeds,
            &["mul_col, requant_u8 0.011 37)", &bytes],
            "requant_u8",
            &format!("k {k}, n1 {n1}, layer norm {layer_norm}"),
        );
    }
}

#[test]
fn requant_after_gelu_is_bit_exact() {
    check(false);
}

#[test]
fn requant_after_layer_norm_is_bit_exact() {
    check(true);
}

/// `x → qlinear(bias, residual, layer_norm) → qlinear(token, smoothed)`, with the LayerNorm
/// value a graph output too (the residual reader of an encoder).
fn token_graph(k: usize, n1: usize, n2: usize) -> String {
    format!(
        "%0 = input[name=\"x\"] : f32[B,S,{k}]\n\
         %1 = {}  # p/weight_s8\n\
         %2 = {}  # p/weight_scale\n\
         %3 = {}  # p/bias\n\
         %4 = input[name=\"r\"] : f32[B,S,{n1}]\n\
         %5 = {}  # ln/gamma\n\
         %12 = {}  # ln/beta\n\
         %6 = qlinear[act=\"token\", smooth=false, epilogue=(bias, residual, layer_norm 1e-12)](%0, %1, %2, %3, %4, %5, %12) : f32[B,S,{n1}]  # p\n\
         %7 = {}  # c/weight_s8\n\
         %8 = {}  # c/weight_scale\n\
         %9 = {}  # c/inv_smooth\n\
         %10 = {}  # c/bias\n\
         %11 = qlinear[act=\"token\", smooth=true, epilogue=(bias)](%6, %7, %8, %9, %10) : f32[B,S,{n2}]  # c\n\
         output \"y\" = %11\n\
         output \"ln\" = %6\n",
        i8_matrix(k, n1, 1),
        vector(n1, 2, 0.001, 0.01),
        vector(n1, 3, -1.0, 1.0),
        vector(n1, 4, 0.5, 1.5),
        vector(n1, 5, -0.2, 0.2),
        i8_matrix(n1, n2, 7),
        vector(n2, 8, 0.001, 0.01),
        vector(n1, 9, 0.5, 2.0),
        vector(n2, 10, -1.0, 1.0),
    )
}

/// The per-token quantization of the reader, moved into the LayerNorm epilogue as
/// `fork_u8_rows`: the same bits as the reader quantizing the f32 rows itself, with rows of
/// awkward widths, rows that one block holds and rows that take a strip, one and two threads.
#[test]
fn token_quantization_in_layer_norm_is_bit_exact() {
    for (k, n1, n2, b, seq) in [
        (40, 72, 24, 3, 37),
        (64, 200, 50, 2, 65),
        (2100, 1200, 40, 1, 9),
    ] {
        let g = ir::text::parse(&token_graph(k, n1, n2), None).unwrap();
        let model = Model::from_graph(g).unwrap();
        let x = TensorValue::from_f32(vec![b, seq, k], values(b * seq * k, 11, -2.0, 2.0)).unwrap();
        let r = values(b * seq * n1, 12, -1.0, 1.0);
        let feeds = vec![
            ("x", x),
            ("r", TensorValue::from_f32(vec![b, seq, n1], r).unwrap()),
        ];
        assert_fusion_is_bit_exact(
            &model,
            &feeds,
            &["layer_norm 1e-12, fork_u8_rows smooth)", "act=\"token_u8\""],
            "fork_u8_rows",
            &format!("k {k}, n1 {n1}"),
        );
    }
}

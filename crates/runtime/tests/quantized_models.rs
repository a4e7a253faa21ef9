//! The int8 models (static QDQ S8S8 and U8S8, dynamic) run with the ONNX reference arithmetic
//! (dequantize, f32 op, quantize with round-half-to-even and saturation; a MatMul of two
//! dequantized tensors is accumulated exactly in i32) and are compared with onnxruntime, which
//! runs them through its own fused int8 kernels.
//!
//! Why these bounds. The dynamic model's ops (DynamicQuantizeLinear, MatMulInteger, Cast, Mul)
//! are exact or single-rounding, so ORT and the spec agree to float rounding: asserted at 1e-4.
//! In the static QDQ models ORT requantizes with its own float formula (`acc·(sa·sb/sy)`, MLAS
//! exp/LayerNorm), the spec path with another (`(acc·sa·sb)/sy`, libm): the two differ by ~1e-7
//! relative before rounding, so a value within that distance of a .5 boundary lands on the
//! neighbouring quantum. With millions of requantized values per batch a few such flips are
//! certain, and each one (0.01–0.05 here) reaches every later layer of its sequence through
//! attention. Element-wise agreement is therefore no criterion; what must agree is the
//! accuracy of the int8 execution. Per batch and output we assert:
//! - against ORT int8: error within the int8-vs-FP32 error the manifest records (max, mean);
//! - against the FP32 reference: our mean error within ±25 % of ORT's int8-vs-FP32 mean error
//!   (the same quantization noise), and our max error at most 1.5× ORT's.

mod common;

use common::*;
use runtime::{CompileOptions, Model, Session};
use serde_json::Value;

struct Outcome {
    batch: String,
    output: String,
    stats: ErrStats,
    /// Against the FP32 model's reference output.
    vs_fp32: Option<ErrStats>,
}

/// Per batch: sentence-embedding cosines (one per row) to onnxruntime's int8 embeddings and
/// to the FP32 model's reference embeddings.
struct EmbeddingCosines {
    batch: String,
    vs_ort_int8: Vec<f32>,
    vs_fp32: Vec<f32>,
}

fn run_model(id: &str, optimize: bool) -> Option<(Value, Vec<Outcome>, Vec<EmbeddingCosines>)> {
    let dir = models_dir(&format!("{id} optimize={optimize}"))?;
    let man = manifest(&dir);
    let entry = model_entry(&man, id).clone();
    let model = Model::load(dir.join(entry["file"].as_str().unwrap())).unwrap();
    let session = Session::new(
        &model,
        CompileOptions {
            optimize,
            ..Default::default()
        },
    )
    .unwrap();
    let mut res = vec![];
    let mut embeddings = vec![];
    for b in ref_batches(&dir, &entry) {
        let out = session.run(&b.feeds()).unwrap();
        let mask = b
            .inputs
            .iter()
            .find(|(n, _)| n == "attention_mask")
            .map(|(_, t)| t);
        for (name, want) in &b.outputs {
            let got = &out.iter().find(|(n, _)| n == name).unwrap().1;
            let s = compare(got, want, mask);
            println!(
                "{id} optimize={optimize} {} {name}: valid max {:.3e} mean {:.3e} ({} of {} off by > 1e-4), per row max {:?}; padded ({}) max {:.3e}",
                b.name, s.valid_max, s.valid_mean, s.valid_off, s.valid_count, s.row_max, s.pad_count, s.pad_max
            );
            let vs_fp32 = entry["quantized_from"].as_str().map(|fp| {
                let f = dir.join(format!("reference/{fp}/{}.{name}.npy", b.name));
                let want = runtime::TensorValue::read_npy(f).unwrap();
                compare(got, &want, mask)
            });
            if let Some(v) = &vs_fp32 {
                println!(
                    "    vs FP32 reference: valid max {:.3e} mean {:.3e}",
                    v.valid_max, v.valid_mean
                );
            }
            res.push(Outcome {
                batch: b.name.clone(),
                output: name.clone(),
                stats: s,
                vs_fp32,
            });
        }
        if let (Some((_, want)), Some(mask)) = (
            b.derived.iter().find(|(n, _)| n == "sentence_embedding"),
            mask,
        ) {
            let hidden = &out
                .iter()
                .find(|(n, _)| n == "last_hidden_state")
                .unwrap()
                .1;
            let emb = runtime::text::sentence_embeddings(hidden, mask).unwrap();
            let cos = cosines(&emb, want);
            let fp32 = entry["quantized_from"].as_str().expect("quantized_from");
            let fp32_emb = runtime::TensorValue::read_npy(dir.join(format!(
                "reference/{fp32}/{}.sentence_embedding.npy",
                b.name
            )))
            .unwrap();
            let cos_fp32 = cosines(&emb, &fp32_emb);
            println!(
                "{id} optimize={optimize} {} sentence embedding cosine vs onnxruntime int8: {cos:?}, vs FP32: {cos_fp32:?}",
                b.name
            );
            embeddings.push(EmbeddingCosines {
                batch: b.name.clone(),
                vs_ort_int8: cos,
                vs_fp32: cos_fp32,
            });
        }
    }
    Some((entry, res, embeddings))
}

fn cosines(a: &runtime::TensorValue, b: &runtime::TensorValue) -> Vec<f32> {
    let h = a.shape()[1];
    a.as_f32()
        .unwrap()
        .chunks(h)
        .zip(b.as_f32().unwrap().chunks(h))
        .map(|(x, y)| {
            let dot: f32 = x.iter().zip(y).map(|(p, q)| p * q).sum();
            let nx: f32 = x.iter().map(|p| p * p).sum::<f32>().sqrt();
            let ny: f32 = y.iter().map(|p| p * p).sum::<f32>().sqrt();
            dot / (nx * ny)
        })
        .collect()
}

/// The manifest's int8-vs-FP32 error (valid positions) for a batch and output.
fn int8_noise(entry: &Value, batch: &str, output: &str) -> (f64, f64) {
    let b = &entry["ort_vs_fp32_model"][batch];
    let v = if b[output].is_object() {
        let o = &b[output];
        if o["valid_positions"].is_object() {
            &o["valid_positions"]
        } else {
            o
        }
    } else {
        &b["valid_positions"]
    };
    (
        v["max_abs"].as_f64().unwrap(),
        v["mean_abs"].as_f64().unwrap(),
    )
}

/// `min_exact_rows`: how many batch rows (over all batches, `last_hidden_state`) must agree with
/// onnxruntime to 1e-4 on their valid positions. A row either agrees to float rounding or holds
/// a flipped quantum (see the module doc); an int8 path that is not the model's (Q/DQ dropped,
/// a wrong scale or zero point) agrees on none.
fn check_static(id: &str, optimize: bool, min_exact_rows: usize) {
    let Some((entry, res, embeddings)) = run_model(id, optimize) else {
        return;
    };
    let mut exact_rows = 0;
    for o in &res {
        let (max, mean) = int8_noise(&entry, &o.batch, &o.output);
        let what = format!("{id} optimize={optimize} {} {}", o.batch, o.output);
        assert!(
            (o.stats.valid_max as f64) <= max,
            "{what}: max err vs ORT {} exceeds the int8 noise {max}",
            o.stats.valid_max
        );
        assert!(
            o.stats.valid_mean <= mean,
            "{what}: mean err vs ORT {} exceeds the int8 noise {mean}",
            o.stats.valid_mean
        );
        let f = o.vs_fp32.as_ref().expect("FP32 reference");
        assert!(
            (0.75 * mean..=1.25 * mean).contains(&f.valid_mean),
            "{what}: mean err vs FP32 {} is not ORT's int8 noise {mean} ± 25 %",
            f.valid_mean
        );
        assert!(
            (f.valid_max as f64) <= 1.5 * max,
            "{what}: max err vs FP32 {} exceeds 1.5 × ORT's {max}",
            f.valid_max
        );
        if o.output == "last_hidden_state" {
            // Padded rows are well defined for the graph, but each of their values goes
            // through the same requantizations as a real token's, so one may flip a quantum
            // on its own (measured: up to 3.0 on MiniLM, 6.3e-2 on tiny BERT, while most
            // padded rows agree to 1e-6). Bound: the manifest's int8-vs-FP32 error over all
            // positions of the batch (MiniLM 1.7–5.4, tiny 0.09–0.21).
            let all_max = entry["ort_vs_fp32_model"][&o.batch][&o.output]["all_positions"]
                .get("max_abs")
                .or_else(|| entry["ort_vs_fp32_model"][&o.batch]["all_positions"].get("max_abs"))
                .and_then(Value::as_f64)
                .expect("all_positions max_abs");
            for (r, (&v, &p)) in o.stats.row_max.iter().zip(&o.stats.pad_row_max).enumerate() {
                exact_rows += usize::from(v <= 1e-4);
                assert!(
                    (p as f64) <= all_max,
                    "{what} row {r}: padded positions off by {p}, int8 noise {all_max}"
                );
            }
        }
    }
    println!("{id} optimize={optimize}: {exact_rows} rows agree with onnxruntime to 1e-4");
    assert!(
        exact_rows >= min_exact_rows,
        "{id} optimize={optimize}: {exact_rows} rows agree with onnxruntime, want ≥ {min_exact_rows}"
    );
    check_embeddings(id, optimize, &entry, &embeddings);
}

/// Sentence embeddings (mean pooled, normalised) of an int8 model, measured on MiniLM QDQ: mean
/// cosine to onnxruntime's int8 embeddings 0.977 (optimize=false) and 0.983 (true) over the 9
/// rows, rows 0.936–1; to the FP32 embeddings 0.90–0.94, as onnxruntime's own int8 (the
/// manifest's `sentence_embedding_cosine`, mean 0.914–0.923). Asserted:
/// - to onnxruntime int8, mean over all rows ≥ halfway between 1 and the FP32 function's
///   cosine to it (the manifest's mean): an int8 path that computes the FP32 function, or
///   another quantization, lands at or below the manifest's figure;
/// - to FP32, per batch, the mean within 0.03 of onnxruntime int8's: the same quantization
///   noise, neither more nor less (measured within 0.015).
fn check_embeddings(id: &str, optimize: bool, entry: &Value, embeddings: &[EmbeddingCosines]) {
    if embeddings.is_empty() {
        return;
    }
    let mean = |v: &[f32]| v.iter().map(|&c| c as f64).sum::<f64>() / v.len() as f64;
    let (mut all, mut ort_fp32) = (vec![], vec![]);
    for e in embeddings {
        let m = &entry["ort_vs_fp32_model"][&e.batch]["sentence_embedding_cosine"]["mean"];
        let ort_to_fp32 = m.as_f64().expect("sentence_embedding_cosine.mean");
        ort_fp32.push(ort_to_fp32);
        all.extend_from_slice(&e.vs_ort_int8);
        let ours = mean(&e.vs_fp32);
        assert!(
            (ours - ort_to_fp32).abs() <= 0.03,
            "{id} optimize={optimize} {}: mean cosine to FP32 {ours}, onnxruntime int8's {ort_to_fp32}",
            e.batch
        );
    }
    let bound = 0.5 * (1.0 + ort_fp32.iter().sum::<f64>() / ort_fp32.len() as f64);
    let got = mean(&all);
    println!(
        "{id} optimize={optimize}: mean cosine to onnxruntime int8 {got:.4} (bound {bound:.4})"
    );
    assert!(
        got >= bound,
        "{id} optimize={optimize}: mean sentence-embedding cosine to onnxruntime int8 {got} < {bound}"
    );
}

#[test]
fn tiny_bert_qdq_s8s8() {
    // Measured: 8 and 10 of the 10 rows of b0–b3 agree.
    check_static("tiny-bert-qdq", false, 7);
    check_static("tiny-bert-qdq", true, 7);
}

#[test]
fn tiny_bert_qdq_u8s8() {
    check_static("tiny-bert-qdq-u8s8", false, 7);
    check_static("tiny-bert-qdq-u8s8", true, 7);
}

#[test]
fn minilm_qdq() {
    // Measured: 2 (optimize=false) and 5 of the 9 rows agree; one flip reaches a whole sequence.
    check_static("minilm-l6-qdq", false, 1);
    check_static("minilm-l6-qdq", true, 1);
}

/// The dynamic model's integer products are exact on both sides; what differs is the f32
/// arithmetic around them (the fused LayerNorm and GELU epilogues sum in another order than
/// onnxruntime's standalone kernels, a few ulp). Where such a difference moves a value across a
/// rounding boundary of the next `DynamicQuantizeLinear`, one u8 step (range/255) flips and
/// spreads through the rest of the sequence (a per-row quantization after `optimize`): a flip
/// takes a whole sequence with it, and whether one happens depends on the summation order alone.
/// Asserted: at least 8 of the 10 sequences of `last_hidden_state` within 1e-4 of onnxruntime
/// everywhere (measured: 10 without `optimize`; 10 with it when the LayerNorm summed in 16
/// lanes, 9 in its 64 lanes, where sequence 0 of b1 flips, off by 3.1e-2), every value within the
/// manifest's int8-vs-FP32 noise, padded rows within 1e-4 (measured 1.4e-6).
#[test]
fn tiny_bert_dynamic_matches_ort() {
    for optimize in [false, true] {
        let Some((entry, res, _)) = run_model("tiny-bert-dynamic", optimize) else {
            return;
        };
        let mut exact_rows = 0;
        for o in res {
            let (noise_max, _) = int8_noise(&entry, &o.batch, &o.output);
            let what = format!("optimize={optimize} {} {}", o.batch, o.output);
            // The pooler's input is quantized per tensor over the whole batch: one flipped row
            // moves every row's scale, so only the noise bound applies to it.
            if o.output == "last_hidden_state" {
                exact_rows += o.stats.row_max.iter().filter(|&&v| v <= 1e-4).count();
            }
            assert!(
                (o.stats.valid_max as f64) <= noise_max,
                "{what}: {} exceeds the int8 noise {noise_max}",
                o.stats.valid_max
            );
            assert!(
                o.stats.pad_max <= 1e-4,
                "{what} padded: {}",
                o.stats.pad_max
            );
        }
        println!("tiny-bert-dynamic optimize={optimize}: {exact_rows} sequences agree to 1e-4");
        assert!(
            exact_rows >= 8,
            "optimize={optimize}: {exact_rows} sequences agree with onnxruntime to 1e-4, want ≥ 8"
        );
    }
}

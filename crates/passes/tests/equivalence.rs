//! Declutter preserves semantics: the shared models, run by the test interpreter on their
//! reference inputs before and after the pipeline, give the reference outputs (onnxruntime)
//! within 1e-4.

mod common;

use std::collections::HashMap;

use common::interp::{read_npy, run};
use passes::{Pass, Pipeline, RunOptions, ShapeInference};

fn max_abs_diff(a: &ir::Tensor, b: &ir::Tensor) -> f32 {
    assert_eq!(a.shape(), b.shape());
    let (a, b) = (a.to_f32_vec().unwrap(), b.to_f32_vec().unwrap());
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn check(id: &str, rel: &str, batches: &[&str], inputs: &[&str], outputs: &[&str]) {
    check_with(id, rel, batches, inputs, outputs, 1e-4)
}

/// Runs `rel` before and after declutter on the reference batches: both within `ref_tol` of
/// onnxruntime's outputs, and of each other. `ref_tol` is 1e-4 for float models; quantized
/// models need more, because a last-bit float difference before a (dynamic) quantization can
/// move a value by one quantization step.
fn check_with(
    id: &str,
    rel: &str,
    batches: &[&str],
    inputs: &[&str],
    outputs: &[&str],
    ref_tol: f32,
) {
    let Some(dir) = common::models_dir(id) else {
        return;
    };
    let mut typed = frontend_onnx::import_path(dir.join(rel)).unwrap();
    ShapeInference
        .run(&mut typed, &mut passes::PassContext::default())
        .unwrap();
    let mut decluttered = typed.clone();
    Pipeline::declutter()
        .run(&mut decluttered, &mut RunOptions::default())
        .unwrap();
    for b in batches {
        let file = |t: &str| dir.join(format!("reference/{id}/{b}.{t}.npy"));
        // Quantized variants reuse their float model's inputs (`tiny-bert-qdq` → `tiny-bert`).
        let input_id = ["-qdq", "-dynamic"]
            .iter()
            .fold(id, |id, v| id.split(v).next().unwrap_or(id));
        let input = |t: &str| dir.join(format!("reference/{input_id}/{b}.{t}.npy"));
        let feeds: HashMap<String, ir::Tensor> = inputs
            .iter()
            .map(|&t| (t.to_string(), read_npy(&input(t))))
            .collect();
        let before = run(&typed, &feeds).unwrap_or_else(|e| panic!("{id} {b} imported: {e}"));
        let after =
            run(&decluttered, &feeds).unwrap_or_else(|e| panic!("{id} {b} decluttered: {e}"));
        for &o in outputs {
            let want = read_npy(&file(o));
            let (e0, e1) = (
                max_abs_diff(&before[o], &want),
                max_abs_diff(&after[o], &want),
            );
            let e01 = max_abs_diff(&before[o], &after[o]);
            eprintln!("{id} {b} {o}: imported {e0:.1e}, decluttered {e1:.1e}, between {e01:.1e}");
            assert!(
                e0 <= ref_tol,
                "{id} {b} {o}: the interpreter is off the reference by {e0}"
            );
            assert!(
                e1 <= ref_tol,
                "{id} {b} {o}: the decluttered graph is off the reference by {e1}"
            );
            assert!(
                e01 <= ref_tol.max(1e-4),
                "{id} {b} {o}: declutter changed the result by {e01}"
            );
        }
    }
}

const BERT_INPUTS: &[&str] = &["input_ids", "attention_mask", "token_type_ids"];

#[test]
fn tiny_bert() {
    check(
        "tiny-bert",
        "tiny/bert/model.onnx",
        &["b0", "b1", "b2", "b3"],
        BERT_INPUTS,
        &["last_hidden_state", "pooler_output"],
    );
}

#[test]
fn tiny_bert_cls() {
    check(
        "tiny-bert-cls",
        "tiny/bert-cls/model.onnx",
        &["b0", "b1"],
        BERT_INPUTS,
        &["logits"],
    );
}

#[test]
fn tiny_distilbert() {
    check(
        "tiny-distilbert",
        "tiny/distilbert/model.onnx",
        &["b0", "b1", "b2", "b3"],
        &["input_ids", "attention_mask"],
        &["last_hidden_state"],
    );
}

#[test]
fn tiny_xlm_roberta() {
    check(
        "tiny-xlm-roberta",
        "tiny/xlm-roberta/model.onnx",
        &["b0", "b1", "b2", "b3"],
        &["input_ids", "attention_mask"],
        &["last_hidden_state"],
    );
}

/// About 80 s in a debug build, 10 s in release: it runs in release builds (the README's test
/// command and CI) and skips loudly in debug ones.
#[test]
fn minilm_l6() {
    if cfg!(debug_assertions) {
        eprintln!("SKIP minilm_l6 equivalence: 80 s in a debug build; run with --release");
        return;
    }
    check(
        "minilm-l6",
        "minilm-l6/model.onnx",
        &["b1"],
        BERT_INPUTS,
        &["last_hidden_state"],
    );
}

/// The QDQ and dynamic models: see [`check_with`] for why the bound is loose. Measured: at most
/// 3.1e-2 (one quantization step) on these batches.
#[test]
fn tiny_bert_quantized() {
    for (id, rel) in [
        ("tiny-bert-qdq", "tiny/bert/model.qdq.onnx"),
        ("tiny-bert-qdq-u8s8", "tiny/bert/model.qdq-u8s8.onnx"),
        ("tiny-bert-dynamic", "tiny/bert/model.dynamic.onnx"),
    ] {
        check_with(
            id,
            rel,
            &["b0", "b1"],
            BERT_INPUTS,
            &["last_hidden_state", "pooler_output"],
            0.5,
        );
    }
}

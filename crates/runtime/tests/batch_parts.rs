//! Batches run in parts (`CompileOptions::batch_tokens`) against the same batches run whole:
//! every output bit for bit, on batches whose sequences have very different lengths (one of
//! them all padding), FP32, INT8 (dynamic per-token and static activations, int8 attention)
//! and an ONNX QDQ model, 1 and 2 threads; a program whose batch may not be split (dynamic
//! per-tensor quantization: one scale for the whole batch) runs whole and says why.

mod common;

use common::*;
use runtime::quantize::{quantize, QuantizeOptions};
use runtime::{Model, Session};

/// Parts of about `tokens` tokens and the whole batch give the same outputs, and the batch was
/// cut into more than one part.
fn check(what: &str, model: &Model, tokens: usize) {
    for threads in [1, 2] {
        let parts = Session::builder(model)
            .threads(threads)
            .batch_tokens(Some(tokens))
            .build()
            .unwrap();
        let whole = Session::builder(model)
            .threads(threads)
            .batch_tokens(None)
            .build()
            .unwrap();
        let dump = parts.program().to_text();
        assert!(
            dump.lines()
                .nth(1)
                .is_some_and(|l| l.starts_with("split batch=")),
            "{what}: the program is not split:\n{}",
            dump.lines().take(3).collect::<Vec<_>>().join("\n")
        );
        for lengths in [&[19usize, 3, 0, 11, 1, 19, 7][..], &[2, 30, 30, 1]] {
            let f = length_feeds(&parts, lengths);
            let cut = parts.batch_parts(&as_refs(&f));
            assert!(
                cut.as_ref().is_some_and(|c| c.len() > 1),
                "{what} lengths={lengths:?}: not cut ({cut:?})"
            );
            assert_eq!(whole.batch_parts(&as_refs(&f)), None);
            let a = parts.run(&as_refs(&f)).unwrap();
            let b = whole.run(&as_refs(&f)).unwrap();
            for ((name, x), (_, y)) in a.iter().zip(&b) {
                let ctx =
                    format!("{what} threads={threads} lengths={lengths:?} parts={cut:?} {name}");
                assert_eq!(x.shape(), y.shape(), "{ctx}");
                let (x, y) = (x.as_f32().unwrap(), y.as_f32().unwrap());
                assert!(
                    x.iter().zip(y).all(|(u, v)| u.to_bits() == v.to_bits()),
                    "{ctx}: differs"
                );
            }
        }
    }
}

#[test]
fn fp32_models_in_parts_equal_whole_batches() {
    for id in FP32_ENCODERS {
        if let Some(m) = load_model("batch_parts", id) {
            check(id, &m, 24);
        }
    }
}

#[test]
fn int8_minilm_in_parts_equals_whole_batches() {
    let Some(fp32) = load_model("batch_parts", "minilm-l6") else {
        return;
    };
    let (dynamic, _) = quantize(&fp32, None, &QuantizeOptions::default()).unwrap();
    check("minilm-l6 int8 dynamic", &dynamic, 24);
    let int8_attention = QuantizeOptions {
        attention: ir::AttnProducts::Int8,
        ..QuantizeOptions::default()
    };
    let (heads, _) = quantize(&fp32, None, &int8_attention).unwrap();
    check("minilm-l6 int8 dynamic, int8 attention", &heads, 24);
    let probe = Session::builder(&fp32).build().unwrap();
    let batches: Vec<runtime::quantize::CalibrationBatch> = [&[12usize, 5, 9][..], &[7, 16]]
        .iter()
        .map(|l| runtime::quantize::CalibrationBatch::from_feeds(length_feeds(&probe, l)))
        .collect();
    check(
        "minilm-l6 int8 static",
        &quantize_static(&fp32, &batches),
        24,
    );
}

/// The ONNX QDQ export (quantized attention products as batched integer matmuls) splits; the
/// dynamic export quantizes each activation with one scale over the whole batch, which parts
/// would change, so it runs whole and the dump names the step.
#[test]
fn onnx_quantized_models_split_only_when_exact() {
    let Some(dir) = models_dir("batch_parts onnx quantized") else {
        return;
    };
    let man = manifest(&dir);
    let path = |id: &str| dir.join(model_entry(&man, id)["file"].as_str().unwrap());
    for id in ["tiny-bert-qdq", "tiny-bert-qdq-u8s8", "minilm-l6-qdq"] {
        check(id, &Model::load(path(id)).unwrap(), 24);
    }
    let dynamic = Model::load(path("tiny-bert-dynamic")).unwrap();
    let session = Session::builder(&dynamic)
        .batch_tokens(Some(24))
        .build()
        .unwrap();
    let dump = session.program().to_text();
    assert!(
        dump.contains("// batch not split: ")
            && dump.contains("quantizes its input with one scale for the whole batch"),
        "{}",
        dump.lines().take(3).collect::<Vec<_>>().join("\n")
    );
    let f = length_feeds(&session, &[19, 3, 0, 11, 1, 19, 7]);
    assert_eq!(session.batch_parts(&as_refs(&f)), None);
}

/// Calibration matches each observed activation's rows to the batch's real tokens, so an
/// observed run sees the whole batch even when it would run in parts: every linear layer's input
/// has the batch's rows.
#[test]
fn observed_runs_see_the_whole_batch() {
    let Some(m) = load_model("batch_parts", "tiny-bert") else {
        return;
    };
    let session = Session::builder(&m).batch_tokens(Some(8)).build().unwrap();
    let lengths = [19usize, 3, 0, 11, 1, 19, 7];
    let f = length_feeds(&session, &lengths);
    assert!(session
        .batch_parts(&as_refs(&f))
        .is_some_and(|p| p.len() > 1));
    let tokens = lengths.len() * padded_len(&lengths);
    let mut seen = 0;
    let mut observe = |name: &str, x: &runtime::TensorValue| {
        let k = *x.shape().last().unwrap();
        let rows = x.len() / k;
        // The batch's padded tokens, its real tokens (packed) or its sequences (the pooler);
        // never a part's.
        let real: usize = lengths.iter().sum();
        assert!(
            rows == tokens || rows == real || rows == lengths.len(),
            "{name}: {rows} rows of {:?}",
            x.shape()
        );
        seen += 1;
    };
    session.run_observed(&as_refs(&f), &mut observe).unwrap();
    assert!(seen > 0, "no linear layer observed");
}

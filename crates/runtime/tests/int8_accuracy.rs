//! INT8 accuracy on real data (MiniLM; the metrics of ../shared/models/README.md), calibrated on
//! `data/calibration` only, against our FP32; batch invariance of INT8 embeddings; the compiled
//! file round trip; and the held-back cosine on every tiny model.

mod common;

use std::path::Path;

use common::{manifest, model_entry, models_dir, ref_batches, RefBatch};
use ir::AttnProducts;
use runtime::eval::{encoder_fn, EvalData, TOKENIZER_OPTIONS};
use runtime::quantize::{
    calibrate, choose_alpha, mean_cosine, quantize, ActivationMode, CalibrationBatch,
    QuantizeOptions,
};
use runtime::text::{SentenceEncoder, Tokenizer};
use runtime::{CompileOptions, Model, Session};

/// Calibration texts `from..to` of the file, in batches of 16 sorted by length.
fn calibration_batches(
    dir: &Path,
    session: &Session,
    from: usize,
    to: usize,
) -> Vec<CalibrationBatch> {
    let tok =
        Tokenizer::from_file(dir.join("minilm-l6/tokenizer.json"), TOKENIZER_OPTIONS).unwrap();
    let body = std::fs::read_to_string(dir.join("data/calibration/sentiment_train.jsonl")).unwrap();
    let mut texts: Vec<String> = body
        .lines()
        .skip(from)
        .take(to - from)
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    texts.sort_by_key(|t| t.len());
    texts
        .chunks(16)
        .map(|c| {
            let refs: Vec<&str> = c.iter().map(|s| s.as_str()).collect();
            let feeds = tok
                .encode(&refs)
                .unwrap()
                .feeds(session)
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect();
            CalibrationBatch::from_feeds(feeds)
        })
        .collect()
}

fn encoder(dir: &Path, model: &Model) -> SentenceEncoder {
    let s = Session::new(model, CompileOptions::default()).unwrap();
    let tok =
        Tokenizer::from_file(dir.join("minilm-l6/tokenizer.json"), TOKENIZER_OPTIONS).unwrap();
    SentenceEncoder::new(s, tok)
}

/// The accuracy table of the issue, asserted: FP32 against INT8 dynamic (per token) and static
/// (per tensor), SmoothQuant alpha chosen per layer on held-back calibration text, 448
/// calibration snippets. The figures are printed.
#[test]
fn minilm_int8_accuracy_against_fp32() {
    let Some(dir) = models_dir("minilm_int8_accuracy_against_fp32") else {
        return;
    };
    let fp32 = Model::load(dir.join("minilm-l6/model.onnx")).unwrap();
    let probe_session = Session::new(&fp32, CompileOptions::default()).unwrap();
    // As `encore quantize --samples 512` does: 448 texts calibrate, the last 64 are held back
    // (for alpha auto). All from data/calibration, never from the evaluation sets.
    let batches = calibration_batches(&dir, &probe_session, 0, 448);
    let held_back = calibration_batches(&dir, &probe_session, 448, 512);
    let stats = calibrate(&fp32, &batches, 2, &mut |_, _| {}).unwrap();
    assert_eq!(
        stats.layers.len(),
        36,
        "every linear layer of MiniLM is calibrated"
    );
    let data = EvalData::load(&dir).unwrap();
    let base_enc = encoder(&dir, &fp32);
    let base = data.evaluate(&encoder_fn(&base_enc)).unwrap();
    let auto = choose_alpha(
        &fp32,
        &stats,
        &QuantizeOptions::default(),
        &held_back,
        &[0.0, 0.25, 0.5, 0.75, 0.85],
        2,
    )
    .unwrap();
    // The goals of the issue: Lee within 0.003, sentiment within 0.3 points, cosine >= 0.99.
    // Measured with alpha auto: Lee 0.6592 (+0.0028), sentiment 0.7945 (+0.4 points), cosine
    // 0.9993 (with the exp-free GELU of 2026-12-02; before it 0.6587, 0.7910, 0.9993). (A global alpha 0.5 gives 0.7870, -0.35 points: auto is the default this test
    // holds to the goals.)
    let dynamic = (0.003, 0.003, 0.99);
    // Static per-tensor activations lose more (onnxruntime's static QDQ: -1.7 points, cosine
    // 0.90-0.93); asserted at what was measured with a margin (see the output).
    let stat = (0.01, 0.02, 0.97);
    // The int8 attention products (an option) add a little error of their own: 1 − cosine
    // 0.00068 → 0.00075 (dynamic), 0.00413 → 0.00421 (static), sentiment within 0.15 points of
    // FP32 either way, and Lee Pearson +0.0043 dynamic (f32 attention: +0.0019) and −0.0002
    // static: the Pearson of 1,225 pairs moves by a few thousandths with any small change, here
    // upwards, so the dynamic bound on it is 0.005 for this option.
    let dynamic_int8_attention = (0.005, 0.003, 0.99);
    for (mode, attention, (lee_tol, acc_tol, min_cos)) in [
        (ActivationMode::Dynamic, AttnProducts::F32, dynamic),
        (ActivationMode::Static, AttnProducts::F32, stat),
        (
            ActivationMode::Dynamic,
            AttnProducts::Int8,
            dynamic_int8_attention,
        ),
        (ActivationMode::Static, AttnProducts::Int8, stat),
    ] {
        let opts = QuantizeOptions {
            activations: mode,
            alpha_per_layer: auto.clone(),
            attention,
            ..QuantizeOptions::default()
        };
        let (q, report) = quantize(&fp32, Some(&stats), &opts).unwrap();
        let mode = format!("{mode:?}, {} attention", attention.name());
        assert_eq!(report.quantized_layers().len(), 36, "{mode}");
        let int8_attention = if attention == AttnProducts::Int8 {
            6
        } else {
            0
        };
        assert_eq!(report.attention_int8().len(), int8_attention, "{mode}");
        let enc = encoder(&dir, &q);
        let int8 = data.evaluate(&encoder_fn(&enc)).unwrap();
        let cos: Vec<f64> = int8
            .sentiment_embeddings
            .iter()
            .zip(&base.sentiment_embeddings)
            .map(|(a, b)| {
                a.iter()
                    .zip(b)
                    .map(|(x, y)| (*x as f64) * (*y as f64))
                    .sum()
            })
            .collect();
        let mean_cos = cos.iter().sum::<f64>() / cos.len() as f64;
        println!(
            "{mode}: Lee Pearson {:.4} (FP32 {:.4}), sentiment {:.4} (FP32 {:.4}), mean cosine {mean_cos:.5}, min {:.5}",
            int8.lee.pearson,
            base.lee.pearson,
            int8.sentiment.accuracy,
            base.sentiment.accuracy,
            cos.iter().copied().fold(1.0, f64::min)
        );
        // The goals bound the loss: a metric above FP32's (the alpha search on held-back text
        // moves with any small change, and 0.4 points is 8 of 2,000 snippets) is no failure.
        assert!(
            base.lee.pearson - int8.lee.pearson <= lee_tol,
            "{mode}: Lee Pearson {} vs FP32 {}",
            int8.lee.pearson,
            base.lee.pearson
        );
        assert!(
            base.sentiment.accuracy - int8.sentiment.accuracy <= acc_tol,
            "{mode}: sentiment {} vs FP32 {}",
            int8.sentiment.accuracy,
            base.sentiment.accuracy
        );
        assert!(mean_cos >= min_cos, "{mode}: mean cosine {mean_cos}");
    }
}

/// A text's INT8 embedding is bit-identical whatever else is in its batch and however much
/// padding there is (dynamic activations are quantized per token; integer accumulation is exact),
/// with the attention products in f32 or in int8 (quantized per token and per sequence).
#[test]
fn int8_embeddings_do_not_depend_on_the_batch() {
    let Some(dir) = models_dir("int8_embeddings_do_not_depend_on_the_batch") else {
        return;
    };
    let fp32 = Model::load(dir.join("minilm-l6/model.onnx")).unwrap();
    for attention in [AttnProducts::F32, AttnProducts::Int8] {
        let opts = QuantizeOptions {
            attention,
            ..QuantizeOptions::default()
        };
        let (q, _) = quantize(&fp32, None, &opts).unwrap();
        embeddings_do_not_depend_on_the_batch(&encoder(&dir, &q), attention);
    }
}

fn embeddings_do_not_depend_on_the_batch(enc: &SentenceEncoder, attention: AttnProducts) {
    let text = "a quiet, moving film about memory and loss";
    let alone = enc.embed(&[text]).unwrap();
    let long = "an overlong, shapeless and ultimately tiresome piece of work whose actors seem \
                to have wandered in from three different movies and never found their way out";
    let with_others = enc
        .embed(&[
            long,
            text,
            "fine",
            long,
            "not bad at all, in fact rather good",
        ])
        .unwrap();
    let h = alone.shape()[1];
    let a = alone.as_f32().unwrap();
    let b = &with_others.as_f32().unwrap()[h..2 * h];
    let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
    assert!(
        same,
        "{} attention: embedding changed with the batch: {:?} vs {:?}",
        attention.name(),
        &a[..4],
        &b[..4]
    );
}

/// Quantized (with int8 attention products), saved as one `.encore` file, loaded with no ONNX
/// beside it: the same graph and the same outputs.
#[test]
fn compiled_file_round_trip() {
    let Some(dir) = models_dir("compiled_file_round_trip") else {
        return;
    };
    let man = manifest(&dir);
    let entry = model_entry(&man, "tiny-bert");
    let fp32 = Model::load(dir.join(entry["file"].as_str().unwrap())).unwrap();
    let opts = QuantizeOptions {
        attention: AttnProducts::Int8,
        ..QuantizeOptions::default()
    };
    let (q, _) = quantize(&fp32, None, &opts).unwrap();
    let path = std::env::temp_dir().join(format!("encore-rt-{}.encore", std::process::id()));
    q.save(&path).unwrap();
    let back = Model::load(&path).unwrap();
    assert!(back.is_quantized());
    let text = ir::text::print(back.graph()).unwrap();
    assert!(text.contains("products=\"int8\""), "{text}");
    let (s1, s2) = (
        Session::new(&q, CompileOptions::default()).unwrap(),
        Session::new(&back, CompileOptions::default()).unwrap(),
    );
    for b in ref_batches(&dir, entry) {
        let (o1, o2) = (s1.run(&b.feeds()).unwrap(), s2.run(&b.feeds()).unwrap());
        for ((n1, t1), (_, t2)) in o1.iter().zip(&o2) {
            assert_eq!(t1.as_f32().unwrap(), t2.as_f32().unwrap(), "{n1}");
        }
    }
    // A truncated file is a clear error, not a panic.
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let err = Model::load(&path).unwrap_err().to_string();
    assert!(err.contains("compiled model"), "{err}");
    std::fs::remove_file(&path).ok();
}

/// The cosine goal on every tiny model: calibrated on its reference batches, INT8 (dynamic) vs
/// FP32 outputs on the same batches, mean cosine per sample >= 0.99.
#[test]
fn tiny_models_int8_cosine() {
    let Some(dir) = models_dir("tiny_models_int8_cosine") else {
        return;
    };
    let man = manifest(&dir);
    for id in [
        "tiny-bert",
        "tiny-bert-cls",
        "tiny-distilbert",
        "tiny-xlm-roberta",
    ] {
        let entry = model_entry(&man, id);
        let fp32 = Model::load(dir.join(entry["file"].as_str().unwrap())).unwrap();
        let batches: Vec<CalibrationBatch> = ref_batches(&dir, entry)
            .iter()
            .map(RefBatch::calibration)
            .collect();
        let stats = calibrate(&fp32, &batches, 2, &mut |_, _| {}).unwrap();
        for (mode, attention) in [
            (ActivationMode::Dynamic, AttnProducts::F32),
            (ActivationMode::Static, AttnProducts::F32),
            (ActivationMode::Dynamic, AttnProducts::Int8),
            (ActivationMode::Static, AttnProducts::Int8),
        ] {
            let opts = QuantizeOptions {
                activations: mode,
                attention,
                ..QuantizeOptions::default()
            };
            let (q, _) = quantize(&fp32, Some(&stats), &opts).unwrap();
            let (r, c) = (
                Session::new(&fp32, CompileOptions::default()).unwrap(),
                Session::new(&q, CompileOptions::default()).unwrap(),
            );
            let cos = mean_cosine(&r, &c, &batches).unwrap();
            let mode = format!("{mode:?}, {} attention", attention.name());
            println!("{id} {mode}: mean cosine INT8 vs FP32 {cos:.5}");
            let floor = if opts.activations == ActivationMode::Dynamic {
                0.99
            } else {
                0.98
            };
            assert!(cos >= floor, "{id} {mode}: mean cosine {cos}");
        }
    }
}

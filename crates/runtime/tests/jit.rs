//! JIT-compiled and interpreted loop nests give bit-identical results on every model in
//! `../shared/models` and `tests/models/family` (and on MiniLM quantized by encore, dynamic and
//! static), on 1 and 2 threads; every weight product (int8 and f32) of the JIT session has a
//! compiled unit.

mod common;

use common::*;
use runtime::quantize::{quantize, CalibrationBatch, QuantizeOptions};
use runtime::{Model, Session, TensorValue};

fn int8_products(session: &Session) -> usize {
    let p = session.program();
    p.steps.iter().filter(|s| s.op.name() == "qlinear").count()
}

/// Runs `feeds` on JIT and interpreted sessions of `model` and compares every output bit.
fn check(what: &str, model: &Model, batches: &[Vec<(String, TensorValue)>]) {
    for threads in [1, 2] {
        let jit = Session::builder(model)
            .threads(threads)
            .jit(true)
            .build()
            .unwrap();
        let plain = Session::builder(model)
            .threads(threads)
            .jit(false)
            .build()
            .unwrap();
        // Products with a packed weight carry a thread split.
        let products = jit
            .program()
            .steps
            .iter()
            .filter(|s| s.split.is_some())
            .count();
        let compiled = jit
            .program()
            .steps
            .iter()
            .filter(|s| s.jit.is_some())
            .count();
        if let Some(why) = &jit.program().jit_unavailable {
            // Loud: the comparison below then checks the fallback only.
            eprintln!("JIT SKIPPED {what}: {why}");
            assert!(
                std::env::var("CI").is_err(),
                "{what}: JIT unavailable in CI: {why}"
            );
        } else {
            assert_eq!(
                compiled, products,
                "{what}: int8 products without a compiled unit"
            );
        }
        assert!(plain.program().steps.iter().all(|s| s.jit.is_none()));
        for (i, feeds) in batches.iter().enumerate() {
            let a = jit.run(&as_refs(feeds)).unwrap();
            let b = plain.run(&as_refs(feeds)).unwrap();
            for ((name, x), (_, y)) in a.iter().zip(&b) {
                assert_eq!(x.shape(), y.shape());
                let same = match (x.as_f32(), y.as_f32()) {
                    (Some(x), Some(y)) => x.iter().zip(y).all(|(u, v)| u.to_bits() == v.to_bits()),
                    _ => x == y,
                };
                assert!(
                    same,
                    "{what} threads={threads} batch {i} `{name}`: JIT differs"
                );
            }
        }
    }
}

fn reference_feeds(
    dir: &std::path::Path,
    entry: &serde_json::Value,
) -> Vec<Vec<(String, TensorValue)>> {
    ref_batches(dir, entry)
        .into_iter()
        .map(|b| b.inputs)
        .collect()
}

#[test]
fn every_shared_model_runs_the_same_with_and_without_jit() {
    let Some(dir) = models_dir("jit every_shared_model") else {
        return;
    };
    let man = manifest(&dir);
    let mut int8_seen = 0;
    for entry in man["models"].as_array().unwrap() {
        let id = entry["id"].as_str().unwrap();
        let model = Model::load(dir.join(entry["file"].as_str().unwrap())).unwrap();
        let feeds = reference_feeds(&dir, entry);
        if Session::builder(&model)
            .build()
            .is_ok_and(|s| int8_products(&s) > 0)
        {
            int8_seen += 1;
        }
        check(id, &model, &feeds);
    }
    // The QDQ and dynamic exports (tiny BERT three ways, MiniLM QDQ) exercise the JIT.
    assert!(int8_seen >= 4, "only {int8_seen} int8 models");
}

#[test]
fn every_family_export_runs_the_same_with_and_without_jit() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/models/family");
    let man: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap();
    let models = man["models"].as_array().unwrap();
    assert!(models.len() >= 30, "{} family exports", models.len());
    for entry in models {
        let id = entry["id"].as_str().unwrap();
        let model = Model::load(dir.join(entry["file"].as_str().unwrap())).unwrap();
        check(id, &model, &reference_feeds(&dir, entry));
    }
}

#[test]
fn encore_quantized_minilm_runs_the_same_with_and_without_jit() {
    let Some(dir) = models_dir("jit encore_quantized_minilm") else {
        return;
    };
    let man = manifest(&dir);
    let entry = model_entry(&man, "minilm-l6");
    let fp32 = Model::load(dir.join(entry["file"].as_str().unwrap())).unwrap();
    let feeds = reference_feeds(&dir, entry);
    let (dynamic, _) = quantize(&fp32, None, &QuantizeOptions::default()).unwrap();
    check("minilm-l6 int8 dynamic", &dynamic, &feeds);
    let batches: Vec<CalibrationBatch> = feeds
        .iter()
        .map(|f| CalibrationBatch::from_feeds(f.clone()))
        .collect();
    let fixed = quantize_static(&fp32, &batches);
    check("minilm-l6 int8 static", &fixed, &feeds);
}

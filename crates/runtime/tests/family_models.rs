//! The BERT family as users export it: every model of `tests/models/family` (built by
//! `scripts/make_family.py` from PyPI `transformers` with random weights: BERT, RoBERTa,
//! XLM-RoBERTa, DistilBERT, ELECTRA, ALBERT, MPNet, DeBERTa-v2 and ModernBERT, each through the
//! TorchScript and the dynamo exporters, with eager and, where the class has it, SDPA attention)
//! imports, matches onnxruntime within 1e-4 at real positions as imported, decluttered and
//! padding-free, and quantizes (INT8, every linear layer, dynamic and static activations) with a
//! mean cosine of its sentence embeddings to FP32 of at least 0.99.
//!
//! `cargo test --release -p runtime --test family_models -- --nocapture` prints one `FAMILY`
//! line per model, a row of the table in `docs/family.md`: architecture, exporter, attention,
//! imports, FP32 max abs error against onnxruntime at real positions (imported, decluttered,
//! padding-free), the recognised ops the default session runs, and the INT8 mean cosines
//! (dynamic, static).

mod common;

use std::path::{Path, PathBuf};

use common::{compare, model_entry, ref_batches, RefBatch};
use runtime::quantize::{
    calibrate, mean_cosine, quantize, ActivationMode, CalibrationBatch, QuantizeOptions,
};
use runtime::{CompileOptions, Model, Session};
use serde_json::Value;

/// An FP32 implementation summing in another order than onnxruntime stays well within this
/// (onnxruntime differs from PyTorch by ≤ 1.9e-6 on these exports: the manifest's
/// `ort_vs_torch_max_abs`).
const FP32_TOL: f32 = 1e-4;
/// The goal of the issue, for per-token (dynamic) and per-tensor (static) activations alike:
/// static loses more on real text (MiniLM: 0.9959 against 0.9994), but these random encoders
/// measured >= 0.9999 both ways.
const MIN_COSINE: f64 = 0.99;

fn family_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/models/family")
}

fn manifest() -> Value {
    let s = std::fs::read_to_string(family_dir().join("manifest.json"))
        .expect("tests/models/family/manifest.json (scripts/make_family.py writes it)");
    serde_json::from_str(&s).expect("parse manifest.json")
}

/// The largest error at real positions of any output of any reference batch.
fn fp32_error(session: &Session, batches: &[RefBatch], id: &str, what: &str) -> f32 {
    let mut worst = 0f32;
    for b in batches {
        let out = session
            .run(&b.feeds())
            .unwrap_or_else(|e| panic!("{id} {what} {}: {e}", b.name));
        let mask = b.input("attention_mask");
        for (name, want) in &b.outputs {
            let got = &out
                .iter()
                .find(|(n, _)| n == name)
                .unwrap_or_else(|| panic!("{id}: no output {name}"))
                .1;
            let s = compare(got, want, Some(mask));
            assert!(
                s.valid_count > 0,
                "{id} {}: no real position compared",
                b.name
            );
            worst = worst.max(s.valid_max);
        }
    }
    worst
}

fn calibration_batches(batches: &[RefBatch]) -> Vec<CalibrationBatch> {
    batches.iter().map(RefBatch::calibration).collect()
}

/// Linear layers per encoder layer and outside the layers, by architecture: what quantize must
/// make integer (so that a cosine of 1 cannot come from a model left in FP32).
fn expected_linears(arch: &str) -> usize {
    let layers = 2;
    match arch {
        // Q, K, V, attention output, FFN in and out.
        "BertModel" | "RobertaModel" | "XLMRobertaModel" | "DistilBertModel" | "MPNetModel" => {
            6 * layers
        }
        // DeBERTa's layers also project the (normalised) relative position embeddings through
        // their K and Q weights (`share_att_key`) for the c2p and p2c scores.
        "DebertaV2Model" => 8 * layers,
        // ELECTRA and ALBERT add the projection of their narrower embeddings to the layers'
        // width (ALBERT's layers share one set of weights, but each layer is its own linear).
        "ElectraModel" | "AlbertModel" => 6 * layers + 1,
        // Q, K and V as one (Wqkv), attention output, GeGLU in (both halves as one), out.
        "ModernBertModel" => 4 * layers,
        other => panic!("no linear count for {other}"),
    }
}

fn check(id: &str) {
    let dir = family_dir();
    let man = manifest();
    let entry = model_entry(&man, id);
    let path = dir.join(entry["file"].as_str().unwrap());
    let row = format!(
        "FAMILY | {} | {} | {} |",
        entry["architecture"].as_str().unwrap(),
        entry["exporter"].as_str().unwrap(),
        entry["attention"].as_str().unwrap()
    );
    let fp32 = Model::load(&path).unwrap_or_else(|e| panic!("{id}: {e}"));
    let batches = ref_batches(&dir, entry);
    assert!(!batches.is_empty(), "{id}: no reference batches");
    let session = |optimize, padding_free| {
        let opts = CompileOptions {
            optimize,
            padding_free,
            ..CompileOptions::default()
        };
        Session::new(&fp32, opts).unwrap_or_else(|e| panic!("{id}: {e}"))
    };
    let imported = fp32_error(&session(false, false), &batches, id, "imported");
    let padded = fp32_error(&session(true, false), &batches, id, "decluttered");
    let default = session(true, true);
    let packed = fp32_error(&default, &batches, id, "padding-free");
    let mut hist = std::collections::BTreeSet::new();
    for n in default.graph().node_ids() {
        hist.insert(default.graph().node(n).op.name());
    }
    let recognised: Vec<&str> = ["fused_linear", "attention_qkv", "attention_packed"]
        .into_iter()
        .filter(|op| hist.contains(op))
        .collect();
    for (what, err) in [
        ("imported", imported),
        ("decluttered", padded),
        ("padding-free", packed),
    ] {
        assert!(
            err <= FP32_TOL,
            "{id} {what}: max abs error {err} at real positions"
        );
    }
    assert!(
        hist.contains("fused_linear"),
        "{id}: no fused linear in the optimized graph: {hist:?}"
    );
    let arch = entry["architecture"].as_str().unwrap();
    if let Some(op) = expected_attention(arch) {
        assert!(
            hist.contains(op),
            "{id}: attention does not run as `{op}`: {hist:?}"
        );
    }

    let calib = calibration_batches(&batches);
    let stats = calibrate(&fp32, &calib, 2, &mut |_, _| {}).unwrap_or_else(|e| panic!("{id}: {e}"));
    let mut cosines = vec![];
    for mode in [ActivationMode::Dynamic, ActivationMode::Static] {
        let opts = QuantizeOptions {
            activations: mode,
            ..QuantizeOptions::default()
        };
        let (q, report) =
            quantize(&fp32, Some(&stats), &opts).unwrap_or_else(|e| panic!("{id} {mode:?}: {e}"));
        assert_eq!(
            report.quantized_layers().len(),
            expected_linears(arch),
            "{id} {mode:?}: quantized {:?}, kept FP32 {:?}",
            report.quantized_layers(),
            report.kept_fp32()
        );
        let int8 = Session::new(&q, CompileOptions::default()).unwrap();
        let cos = mean_cosine(&default, &int8, &calib).unwrap();
        assert!(
            cos >= MIN_COSINE,
            "{id} {mode:?}: mean cosine {cos} < {MIN_COSINE}"
        );
        cosines.push(cos);
    }
    println!(
        "{row} yes | {imported:.1e} | {padded:.1e} | {packed:.1e} | {} | {:.5} | {:.5} |",
        recognised.join(", "),
        cosines[0],
        cosines[1]
    );
}

/// The fused attention op every export of `arch` (eager or SDPA, TorchScript or dynamo) runs:
/// the padding-free `attention_packed`; for MPNet, whose scores also get a relative-position
/// bias `[1, h, S, S]`, the padded `attention_qkv`. DeBERTa-v2 (disentangled position scores)
/// and ModernBERT (rotary positions between the projections and the product) run the exported
/// ops instead (docs/family.md).
fn expected_attention(arch: &str) -> Option<&'static str> {
    match arch {
        "DebertaV2Model" | "ModernBertModel" => None,
        "MPNetModel" => Some("attention_qkv"),
        _ => Some("attention_packed"),
    }
}

macro_rules! family {
    ($($name:ident: $id:literal,)*) => {
        $(#[test] fn $name() { check($id) })*

        /// Every model of the manifest has its test above, and no test names a model the
        /// manifest lacks.
        #[test]
        fn every_manifest_model_is_tested() {
            let man = manifest();
            let mut listed: Vec<&str> = man["models"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["id"].as_str().unwrap())
                .collect();
            let mut tested = vec![$($id),*];
            listed.sort();
            tested.sort();
            assert_eq!(listed, tested);
        }
    };
}

family! {
    bert_torchscript_eager: "bert-torchscript-eager",
    bert_torchscript_sdpa: "bert-torchscript-sdpa",
    bert_dynamo_eager: "bert-dynamo-eager",
    bert_dynamo_sdpa: "bert-dynamo-sdpa",
    roberta_torchscript_eager: "roberta-torchscript-eager",
    roberta_torchscript_sdpa: "roberta-torchscript-sdpa",
    roberta_dynamo_eager: "roberta-dynamo-eager",
    roberta_dynamo_sdpa: "roberta-dynamo-sdpa",
    xlm_roberta_torchscript_eager: "xlm-roberta-torchscript-eager",
    xlm_roberta_torchscript_sdpa: "xlm-roberta-torchscript-sdpa",
    xlm_roberta_dynamo_eager: "xlm-roberta-dynamo-eager",
    xlm_roberta_dynamo_sdpa: "xlm-roberta-dynamo-sdpa",
    distilbert_torchscript_eager: "distilbert-torchscript-eager",
    distilbert_torchscript_sdpa: "distilbert-torchscript-sdpa",
    distilbert_dynamo_eager: "distilbert-dynamo-eager",
    distilbert_dynamo_sdpa: "distilbert-dynamo-sdpa",
    electra_torchscript_eager: "electra-torchscript-eager",
    electra_dynamo_eager: "electra-dynamo-eager",
    albert_torchscript_eager: "albert-torchscript-eager",
    albert_torchscript_sdpa: "albert-torchscript-sdpa",
    albert_dynamo_eager: "albert-dynamo-eager",
    albert_dynamo_sdpa: "albert-dynamo-sdpa",
    mpnet_torchscript_eager: "mpnet-torchscript-eager",
    mpnet_dynamo_eager: "mpnet-dynamo-eager",
    deberta_v2_torchscript_eager: "deberta-v2-torchscript-eager",
    deberta_v2_dynamo_eager: "deberta-v2-dynamo-eager",
    modernbert_torchscript_eager: "modernbert-torchscript-eager",
    modernbert_torchscript_sdpa: "modernbert-torchscript-sdpa",
    modernbert_dynamo_eager: "modernbert-dynamo-eager",
    modernbert_dynamo_sdpa: "modernbert-dynamo-sdpa",
}

/// DeBERTa-v2's TorchScript export keeps `if query_layer.size(-2) != key_layer.size(-2)` (then
/// recompute the relative positions) as an ONNX `If` per layer. Imported, each is a `select`
/// between its inlined branches; the condition compares two symbolic lengths that are both the
/// sequence, so it folds and the optimized graph computes neither the test nor the dead branch.
#[test]
fn deberta_torchscript_if_folds_away() {
    let man = manifest();
    let entry = model_entry(&man, "deberta-v2-torchscript-eager");
    let model = Model::load(family_dir().join(entry["file"].as_str().unwrap())).unwrap();
    let selects = |g: &ir::Graph| {
        g.node_ids()
            .filter(|&n| g.node(n).op.name() == "select")
            .count()
    };
    assert_eq!(entry["ops"]["If"], 2, "the export has one If per layer");
    assert_eq!(selects(model.graph()), 2, "imported: one select per If");
    let session = Session::new(&model, CompileOptions::default()).unwrap();
    assert_eq!(
        selects(session.graph()),
        0,
        "the If conditions did not fold"
    );
}

/// The variants the script could not make are the attention implementations the classes lack
/// (transformers 4.57: ELECTRA, MPNet and DeBERTa-v2 have eager attention only), each listed
/// with that reason, and nothing else.
#[test]
fn only_missing_attention_is_not_exported() {
    let man = manifest();
    let mut missing: Vec<String> = man["not_exported"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let reason = m["reason"].as_str().unwrap();
            assert!(
                reason.contains("has no sdpa attention"),
                "{}: {reason}",
                m["id"]
            );
            m["id"].as_str().unwrap().to_string()
        })
        .collect();
    missing.sort();
    let mut want: Vec<String> = ["electra", "mpnet", "deberta-v2"]
        .iter()
        .flat_map(|a| ["torchscript", "dynamo"].map(|e| format!("{a}-{e}-sdpa")))
        .collect();
    want.sort();
    assert_eq!(missing, want);
}

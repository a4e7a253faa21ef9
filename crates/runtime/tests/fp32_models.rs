//! Every FP32 model of the shared set reproduces its onnxruntime reference outputs on every
//! reference batch, with and without the declutter pipeline.

mod common;

use common::*;
use runtime::{CompileOptions, Model, Session};

/// onnxruntime vs PyTorch differ by ≤ 8.2e-6 on these models; an FP32 implementation summing in
/// another order should stay within 1e-4 (README).
const VALID_TOL: f32 = 1e-4;
/// Padded rows are well defined for a given graph (a softmax over -3.4e38 biases gives every
/// real key the same weights as onnxruntime's): the same bound as real rows holds.
const PAD_TOL: f32 = 1e-4;

fn check_model(id: &str, optimize: bool) {
    let Some(dir) = models_dir(&format!("{id} optimize={optimize}")) else {
        return;
    };
    let man = manifest(&dir);
    let entry = model_entry(&man, id);
    let model = Model::load(dir.join(entry["file"].as_str().unwrap())).unwrap();
    let opts = CompileOptions {
        optimize,
        ..Default::default()
    };
    let session = Session::new(&model, opts).unwrap();
    let mut hist = std::collections::BTreeMap::new();
    for id in session.graph().node_ids() {
        *hist.entry(session.graph().node(id).op.name()).or_insert(0) += 1;
    }
    println!("{id} optimize={optimize}: {hist:?}");
    if optimize {
        // The recognised and fused ops must be what runs, so their kernels are what this test
        // checks: every linear is a fused GEMM (Q, K and V as one, feeding `attention_qkv`),
        // and GELU only exists in its epilogue.
        for op in ["fused_linear", "attention_qkv"] {
            assert!(
                hist.contains_key(op),
                "{id}: no `{op}` after declutter and fuse: {hist:?}"
            );
        }
        for op in ["linear", "gelu"] {
            assert!(
                !hist.contains_key(op),
                "{id}: a standalone `{op}` is left after fuse: {hist:?}"
            );
        }
    }
    for b in ref_batches(&dir, entry) {
        let out = session.run(&b.feeds()).unwrap();
        let mask = b
            .inputs
            .iter()
            .find(|(n, _)| n == "attention_mask")
            .map(|(_, t)| t);
        for (name, want) in &b.outputs {
            let got = &out
                .iter()
                .find(|(n, _)| n == name)
                .unwrap_or_else(|| panic!("no output {name}"))
                .1;
            let s = compare(got, want, mask);
            println!(
                "{id} optimize={optimize} {} {name}: valid max {:.3e} mean {:.3e}; padded ({} values) max {:.3e}",
                b.name, s.valid_max, s.valid_mean, s.pad_count, s.pad_max
            );
            assert!(
                s.valid_max <= VALID_TOL,
                "{id} {} {name}: max abs err {} at valid positions",
                b.name,
                s.valid_max
            );
            assert!(
                s.pad_max <= PAD_TOL,
                "{id} {} {name}: max abs err {} at padded positions",
                b.name,
                s.pad_max
            );
        }
    }
}

macro_rules! model_tests {
    ($($name:ident: $id:literal,)*) => {$(
        mod $name {
            #[test]
            fn imported() { super::check_model($id, false) }
            #[test]
            fn decluttered() { super::check_model($id, true) }
        }
    )*};
}

model_tests! {
    tiny_bert: "tiny-bert",
    tiny_bert_cls: "tiny-bert-cls",
    tiny_distilbert: "tiny-distilbert",
    tiny_xlm_roberta: "tiny-xlm-roberta",
    minilm_l6: "minilm-l6",
}

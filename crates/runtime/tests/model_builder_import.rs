//! Built models through the ONNX frontend and the `declutter` pipeline: they import, verify, and
//! every layer's Linear, LayerNorm (op or opset-14 decomposition), GELU and attention is
//! recognised, as in a real export.

use std::collections::BTreeMap;

use passes::{Pipeline, RunOptions};
use runtime::model_builder::{write_model, Architecture, LayerNormForm, ModelSpec};

fn op_counts(g: &ir::Graph) -> BTreeMap<String, usize> {
    let text = ir::text::print(g).expect("graph prints");
    let mut counts = BTreeMap::new();
    for line in text.lines() {
        // `%12 = op[attrs](inputs) : type`
        if let Some((_, rhs)) = line.split_once(" = ") {
            let op: String = rhs
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            *counts.entry(op).or_insert(0) += 1;
        }
    }
    counts
}

#[test]
fn built_models_import_verify_and_declutter() {
    let dir = std::env::temp_dir().join(format!("encore-mb-import-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for arch in [
        Architecture::Bert,
        Architecture::DistilBert,
        Architecture::XlmRoberta,
    ] {
        for form in [LayerNormForm::Op17, LayerNormForm::Decomposed14] {
            let spec = ModelSpec {
                layer_norm: form,
                layers: 3,
                ..ModelSpec::tiny(arch)
            };
            let path = dir.join(format!("{arch}-{}.onnx", form.opset()));
            write_model(&spec, &path).unwrap();
            let mut g = frontend_onnx::import_path(&path)
                .unwrap_or_else(|e| panic!("{arch} {form:?}: import: {e}"));
            g.verify()
                .unwrap_or_else(|e| panic!("{arch} {form:?}: verify after import: {e}"));
            Pipeline::declutter()
                .run(&mut g, &mut RunOptions::default())
                .unwrap_or_else(|e| panic!("{arch} {form:?}: declutter: {e}"));
            let ops = op_counts(&g);
            let n = spec.layers;
            let want = [
                ("linear", 6 * n + usize::from(spec.with_pooler)),
                ("layer_norm", 2 * n + 1),
                ("gelu", n),
                ("attention", n),
            ];
            for (op, count) in want {
                assert_eq!(
                    ops.get(op).copied().unwrap_or(0),
                    count,
                    "{arch} {form:?}: {op} after declutter; ops: {ops:?}"
                );
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

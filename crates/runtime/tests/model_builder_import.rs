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

/// Runs `path` in an FP32 session (with or without the optimizing pipelines) on a right-padded
/// batch and returns every output as f32.
fn run_fp32(
    path: &std::path::Path,
    arch: Architecture,
    optimize: bool,
) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    use runtime::{CompileOptions, Model, Session, TensorValue};
    let model = Model::load(path).unwrap_or_else(|e| panic!("{}: load: {e}", path.display()));
    // Every padded token computed, so that the two forms can be compared everywhere.
    let opts = CompileOptions {
        optimize,
        padding_free: false,
        ..CompileOptions::default()
    };
    let session =
        Session::new(&model, opts).unwrap_or_else(|e| panic!("{}: compile: {e}", path.display()));
    let (batch, seq, lengths) = (3usize, 11usize, [11usize, 6, 1]);
    let pad = if arch == Architecture::XlmRoberta {
        1
    } else {
        0
    };
    let mut ids = Vec::new();
    let mut mask = Vec::new();
    let mut types = Vec::new();
    for (b, &len) in lengths.iter().enumerate() {
        for s in 0..seq {
            ids.push(if s < len {
                5 + ((b * 31 + s * 17) % 900) as i64
            } else {
                pad
            });
            mask.push(i64::from(s < len));
            types.push(i64::from(s >= 5));
        }
    }
    let shape = vec![batch, seq];
    let mut feeds = vec![
        (
            "input_ids",
            TensorValue::from_i64(shape.clone(), ids).unwrap(),
        ),
        (
            "attention_mask",
            TensorValue::from_i64(shape.clone(), mask).unwrap(),
        ),
    ];
    if arch == Architecture::Bert {
        feeds.push((
            "token_type_ids",
            TensorValue::from_i64(shape, types).unwrap(),
        ));
    }
    let outs = session
        .run(&feeds)
        .unwrap_or_else(|e| panic!("{}: run: {e}", path.display()));
    outs.into_iter()
        .map(|(name, v)| {
            let shape = v.shape().to_vec();
            let data = v
                .as_f32()
                .unwrap_or_else(|| panic!("{name} is not f32"))
                .to_vec();
            (name, shape, data)
        })
        .collect()
}

#[test]
fn both_layer_norm_forms_compute_the_same_function_in_encore() {
    // Same seed, so the same weights: the opset-14 decomposition and the LayerNormalization op
    // must agree. weight_std 0.1 keeps attention far from uniform, so a wrong mask or position
    // id would change the output. After declutter both forms are the same `layer_norm`, so
    // comparing two optimized sessions would compare the code with itself: the opset-14 model
    // runs as imported (its ReduceMean/Sub/Pow/Sqrt/Div ops executed one by one), the opset-17
    // one through the full pipeline.
    let dir = std::env::temp_dir().join(format!("encore-mb-session-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for arch in [
        Architecture::Bert,
        Architecture::DistilBert,
        Architecture::XlmRoberta,
    ] {
        let mut outputs = Vec::new();
        for form in [LayerNormForm::Op17, LayerNormForm::Decomposed14] {
            let spec = ModelSpec {
                layer_norm: form,
                weight_std: 0.1,
                ..ModelSpec::tiny(arch)
            };
            let path = dir.join(format!("{arch}-{}.onnx", form.opset()));
            write_model(&spec, &path).unwrap();
            outputs.push(run_fp32(&path, arch, form == LayerNormForm::Op17));
        }
        let (a, b) = (&outputs[0], &outputs[1]);
        assert_eq!(a.len(), b.len(), "{arch}: output count");
        for ((na, sa, va), (nb, sb, vb)) in a.iter().zip(b) {
            assert_eq!((na, sa), (nb, sb), "{arch}");
            assert!(
                va.iter().all(|x| x.is_finite()),
                "{arch}: {na} has non-finite values"
            );
            let spread = va.iter().fold(0f32, |m, x| m.max(x.abs()));
            assert!(spread > 0.1, "{arch}: {na} is all near zero");
            let err = va
                .iter()
                .zip(vb)
                .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            assert!(err < 1e-4, "{arch}: {na}: opset 17 and 14 differ by {err}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

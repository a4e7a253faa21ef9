//! FLOAT16, BFLOAT16 and DOUBLE models: the importer widens them to f32, so a model exported
//! with half-precision (or double) weights, values and outputs must compute exactly what the
//! FP32 model computes on the same weights rounded to that type. That is checked bit for bit
//! here on a built tiny BERT, DistilBERT and XLM-R, and on a small graph with a float16 graph
//! input and output (exact hand-computed values). Against onnxruntime (which computes float16
//! in float16): a built tiny BERT when `ENCORE_ORT_PYTHON` is set, and always the float16
//! twins of four real exports in `tests/models/half` with onnxruntime's committed answers.

mod common;

use bytes::Bytes;
use frontend_onnx::proto::{
    type_proto, AttributeProto, DataType, GraphProto, ModelProto, NodeProto, TensorProto,
};
use prost::Message;
use runtime::model_builder::{build_model, Architecture, ModelSpec};
use runtime::{CompileOptions, Model, Session, TensorValue};

/// A float type the importer widens, with the conversion an exporter does: round to nearest,
/// values beyond the type's range clamped to its largest finite value (as Hugging Face uses
/// `finfo(dtype).min` for its masks, never `-inf`).
#[derive(Clone, Copy, Debug)]
enum Narrow {
    F16,
    BF16,
    F64,
}

impl Narrow {
    fn data_type(self) -> DataType {
        match self {
            Narrow::F16 => DataType::Float16,
            Narrow::BF16 => DataType::Bfloat16,
            Narrow::F64 => DataType::Double,
        }
    }

    /// `v` as stored in this type (little-endian bytes) and its exact value back in f32.
    fn convert(self, v: f32) -> (Vec<u8>, f32) {
        match self {
            Narrow::F16 => {
                let h = half::f16::from_f32(v.clamp(-65504.0, 65504.0));
                (h.to_le_bytes().to_vec(), h.to_f32())
            }
            Narrow::BF16 => {
                let m = half::bf16::MAX.to_f32();
                let h = half::bf16::from_f32(v.clamp(-m, m));
                (h.to_le_bytes().to_vec(), h.to_f32())
            }
            Narrow::F64 => ((v as f64).to_le_bytes().to_vec(), v),
        }
    }
}

/// Rewrites one FLOAT tensor: into `narrow` as `t`, and in place of `reference` as the f32
/// tensor holding exactly the narrowed values.
fn convert_tensor(to: Narrow, t: &mut TensorProto, reference: &mut TensorProto) {
    if t.data_type != DataType::Float as i32 {
        return;
    }
    let values: Vec<f32> = if !t.raw_data.is_empty() {
        t.raw_data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    } else {
        t.float_data.clone()
    };
    let mut raw = Vec::new();
    let mut exact = Vec::new();
    for v in values {
        let (b, e) = to.convert(v);
        raw.extend(b);
        exact.extend(e.to_le_bytes());
    }
    t.data_type = to.data_type() as i32;
    t.float_data.clear();
    t.raw_data = Bytes::from(raw);
    reference.float_data.clear();
    reference.raw_data = Bytes::from(exact);
}

fn convert_attrs(to: Narrow, n: &mut NodeProto, reference: &mut NodeProto) {
    for (a, r) in n.attribute.iter_mut().zip(reference.attribute.iter_mut()) {
        if let (Some(t), Some(rt)) = (a.t.as_mut(), r.t.as_mut()) {
            convert_tensor(to, t, rt);
        }
        if n.op_type == "Cast" && a.name == "to" && a.i == DataType::Float as i64 {
            a.i = to.data_type() as i64;
        }
    }
}

fn convert_types(to: Narrow, g: &mut GraphProto) {
    for vi in g
        .input
        .iter_mut()
        .chain(&mut g.output)
        .chain(&mut g.value_info)
    {
        if let Some(type_proto::Value::TensorType(t)) =
            vi.r#type.as_mut().and_then(|t| t.value.as_mut())
        {
            if t.elem_type == DataType::Float as i32 {
                t.elem_type = to.data_type() as i32;
            }
        }
    }
}

/// The model with every float tensor, value type and `Cast` to float in type `to`, and the FP32
/// model with the same (narrowed) weights.
fn narrow_model(m: &ModelProto, to: Narrow) -> (ModelProto, ModelProto) {
    let mut narrow = m.clone();
    let mut reference = m.clone();
    let (g, rg) = (
        narrow.graph.as_mut().unwrap(),
        reference.graph.as_mut().unwrap(),
    );
    for (t, rt) in g.initializer.iter_mut().zip(rg.initializer.iter_mut()) {
        convert_tensor(to, t, rt);
    }
    for (n, rn) in g.node.iter_mut().zip(rg.node.iter_mut()) {
        convert_attrs(to, n, rn);
    }
    convert_types(to, g);
    (narrow, reference)
}

fn session(m: &ModelProto) -> Session {
    let g = frontend_onnx::import_bytes(Bytes::from(m.encode_to_vec()), None)
        .unwrap_or_else(|e| panic!("import: {e}"));
    Session::new(&Model::from_graph(g).unwrap(), CompileOptions::default()).unwrap()
}

fn feeds(arch: Architecture) -> Vec<(&'static str, TensorValue)> {
    let (batch, seq, lengths) = (2usize, 7usize, [7usize, 3]);
    let pad = if arch == Architecture::XlmRoberta {
        1
    } else {
        0
    };
    let (mut ids, mut mask, mut types) = (Vec::new(), Vec::new(), Vec::new());
    for (b, &len) in lengths.iter().enumerate() {
        for s in 0..seq {
            ids.push(if s < len {
                5 + ((b * 31 + s * 17) % 90) as i64
            } else {
                pad
            });
            mask.push(i64::from(s < len));
            types.push(i64::from(s >= 4));
        }
    }
    let shape = vec![batch, seq];
    let mut f = vec![
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
        f.push((
            "token_type_ids",
            TensorValue::from_i64(shape, types).unwrap(),
        ));
    }
    f
}

#[test]
fn half_bf16_and_double_models_compute_the_fp32_model_on_the_rounded_weights() {
    for arch in [
        Architecture::Bert,
        Architecture::DistilBert,
        Architecture::XlmRoberta,
    ] {
        let spec = ModelSpec {
            layers: 2,
            ..ModelSpec::tiny(arch)
        };
        let m = build_model(&spec).unwrap();
        for to in [Narrow::F16, Narrow::BF16, Narrow::F64] {
            let (narrow, reference) = narrow_model(&m, to);
            let got = session(&narrow).run(&feeds(arch)).unwrap();
            let want = session(&reference).run(&feeds(arch)).unwrap();
            assert_eq!(got.len(), want.len());
            for ((gn, g), (wn, w)) in got.iter().zip(&want) {
                assert_eq!(gn, wn);
                assert_eq!(g.shape(), w.shape(), "{arch} {to:?} {gn}");
                let (g, w) = (g.as_f32().unwrap(), w.as_f32().unwrap());
                assert!(g.iter().all(|v| v.is_finite()), "{arch} {to:?} {gn}");
                // The same f32 computation on the same values: bit for bit.
                assert!(
                    g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{arch} {to:?} {gn}: differs from the FP32 model on rounded weights"
                );
            }
            // The narrowing is real: the rounded weights differ from the originals, so the
            // outputs differ from the unrounded FP32 model (F64 is exact and equal).
            let orig = session(&m).run(&feeds(arch)).unwrap();
            let same = orig[0]
                .1
                .as_f32()
                .unwrap()
                .iter()
                .zip(got[0].1.as_f32().unwrap())
                .all(|(a, b)| a == b);
            assert_eq!(same, matches!(to, Narrow::F64), "{arch} {to:?}");
        }
    }
}

fn value_info(name: &str, dt: DataType, dims: &[i64]) -> frontend_onnx::proto::ValueInfoProto {
    use frontend_onnx::proto::{tensor_shape_proto, TensorShapeProto, TypeProto, ValueInfoProto};
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: dt as i32,
                shape: Some(TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|&d| tensor_shape_proto::Dimension {
                            value: Some(tensor_shape_proto::dimension::Value::DimValue(d)),
                            ..Default::default()
                        })
                        .collect(),
                }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// `y = Cast<to FLOAT16>(x + w) * 2` with `x`, `w` and `y` of type `dt`: the graph input and
/// output become f32, the values are computed exactly.
#[test]
fn narrow_graph_inputs_and_outputs_become_f32() {
    for to in [Narrow::F16, Narrow::BF16, Narrow::F64] {
        let dt = to.data_type();
        let w: Vec<u8> = [0.5f32, -1.25, 3.0]
            .iter()
            .flat_map(|&v| to.convert(v).0)
            .collect();
        let two: Vec<u8> = to.convert(2.0).0;
        let model = ModelProto {
            ir_version: 9,
            opset_import: vec![frontend_onnx::proto::OperatorSetIdProto {
                domain: String::new(),
                version: 17,
            }],
            graph: Some(GraphProto {
                name: "g".into(),
                node: vec![
                    NodeProto {
                        op_type: "Add".into(),
                        input: vec!["x".into(), "w".into()],
                        output: vec!["s".into()],
                        ..Default::default()
                    },
                    NodeProto {
                        op_type: "Cast".into(),
                        input: vec!["s".into()],
                        output: vec!["c".into()],
                        attribute: vec![AttributeProto {
                            name: "to".into(),
                            r#type: frontend_onnx::proto::AttributeType::Int as i32,
                            i: dt as i64,
                            ..Default::default()
                        }],
                        ..Default::default()
                    },
                    NodeProto {
                        op_type: "Mul".into(),
                        input: vec!["c".into(), "two".into()],
                        output: vec!["y".into()],
                        ..Default::default()
                    },
                ],
                initializer: vec![
                    TensorProto {
                        name: "w".into(),
                        dims: vec![3],
                        data_type: dt as i32,
                        raw_data: Bytes::from(w),
                        ..Default::default()
                    },
                    TensorProto {
                        name: "two".into(),
                        data_type: dt as i32,
                        raw_data: Bytes::from(two),
                        ..Default::default()
                    },
                ],
                input: vec![value_info("x", dt, &[2, 3])],
                output: vec![value_info("y", dt, &[2, 3])],
                ..Default::default()
            }),
            ..Default::default()
        };
        let g = frontend_onnx::import_bytes(Bytes::from(model.encode_to_vec()), None)
            .unwrap_or_else(|e| panic!("{to:?}: {e}"));
        let model = Model::from_graph(g).unwrap();
        assert_eq!(model.inputs()[0].ty.dtype, ir::DType::F32, "{to:?}");
        assert_eq!(model.outputs()[0].ty.dtype, ir::DType::F32, "{to:?}");
        let s = Session::new(&model, CompileOptions::default()).unwrap();
        let x = TensorValue::from_f32(vec![2, 3], vec![1.0, 2.0, 3.0, -1.0, 0.25, 8.0]).unwrap();
        let y = s.run(&[("x", x)]).unwrap().remove(0).1;
        assert_eq!(y.shape(), [2, 3]);
        assert_eq!(
            y.as_f32().unwrap(),
            [3.0, 1.5, 12.0, -1.0, -2.0, 22.0],
            "{to:?}"
        );
    }
}

/// Runs `<dir>/model.onnx` in onnxruntime on the batch of [`feeds`] (the same formula) and
/// writes each output as raw little-endian f32 to `<dir>/<name>.f32`, its shape on stdout.
const ORT_SCRIPT: &str = r#"
import sys, numpy as np, onnxruntime as ort
d = sys.argv[1]
s = ort.InferenceSession(d + "/model.onnx", providers=["CPUExecutionProvider"])
B, S, lens = 2, 7, [7, 3]
ids = np.array([[5 + (b * 31 + i * 17) % 90 if i < lens[b] else 0 for i in range(S)] for b in range(B)], np.int64)
mask = np.array([[int(i < lens[b]) for i in range(S)] for b in range(B)], np.int64)
tt = np.array([[int(i >= 4) for i in range(S)] for b in range(B)], np.int64)
feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": tt}
names = [i.name for i in s.get_inputs()]
outs = s.run(None, {k: v for k, v in feeds.items() if k in names})
for o, v in zip(s.get_outputs(), outs):
    print(o.name, v.dtype, list(v.shape))
    v.astype(np.float32).tofile(d + "/" + o.name + ".f32")
"#;

/// A float16 tiny BERT in onnxruntime (which computes in float16) and in encore (which widens
/// to f32): the same file gives the same outputs within float16's precision. onnxruntime rounds
/// every intermediate to 11 significant bits, so each output carries a relative error of a few
/// units of 2^-11 plus an absolute one from the cancellations in LayerNorm; the bound below is
/// |encore - ort| <= 4e-3 + 2^-8·|ort| per element and a mean under 1e-3, at real positions.
/// Runs only when `ENCORE_ORT_PYTHON` names a Python with numpy and onnxruntime.
#[test]
fn float16_model_matches_onnxruntime() {
    let Some(python) = std::env::var_os("ENCORE_ORT_PYTHON") else {
        eprintln!("SKIP: set ENCORE_ORT_PYTHON to a python with numpy and onnxruntime");
        return;
    };
    let dir = std::env::temp_dir().join(format!("encore-fp16-ort-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let arch = Architecture::Bert;
    let spec = ModelSpec {
        layers: 2,
        weight_std: 0.1,
        ..ModelSpec::tiny(arch)
    };
    let (narrow, _) = narrow_model(&build_model(&spec).unwrap(), Narrow::F16);
    std::fs::write(dir.join("model.onnx"), narrow.encode_to_vec()).unwrap();
    let out = std::process::Command::new(&python)
        .arg("-c")
        .arg(ORT_SCRIPT)
        .arg(&dir)
        .output()
        .unwrap_or_else(|e| panic!("running {python:?}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "onnxruntime failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = session(&narrow).run(&feeds(arch)).unwrap();
    let mask: Vec<bool> = (0..2)
        .flat_map(|b| (0..7).map(move |s| s < [7, 3][b]))
        .collect();
    let mut checked = 0;
    for (name, v) in &got {
        let line = stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name.as_str()))
            .unwrap_or_else(|| panic!("onnxruntime gave no {name}: {stdout}"));
        assert!(
            line.contains("float16"),
            "onnxruntime's {name} is not float16: {line}"
        );
        let raw = std::fs::read(dir.join(format!("{name}.f32"))).unwrap();
        let want: Vec<f32> = raw
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let g = v.as_f32().unwrap();
        assert_eq!(g.len(), want.len(), "{name}");
        // Per-token outputs are compared at real tokens only; per-sequence ones everywhere.
        let row = g.len() / if v.rank() == 3 { mask.len() } else { 2 };
        let (mut sum, mut n, mut max) = (0f64, 0usize, 0f32);
        for (i, (&a, &b)) in g.iter().zip(&want).enumerate() {
            if v.rank() == 3 && !mask[i / row] {
                continue;
            }
            let d = (a - b).abs();
            assert!(
                d <= 4e-3 + b.abs() / 256.0,
                "{name}[{i}]: encore {a}, onnxruntime {b}"
            );
            sum += d as f64;
            n += 1;
            max = max.max(d);
        }
        eprintln!(
            "{name}: {n} values, max |encore - ort| {max:e}, mean {:e}",
            sum / n as f64
        );
        assert!(
            sum / (n as f64) < 1e-3,
            "{name}: mean |diff| {}",
            sum / n as f64
        );
        checked += n;
    }
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(checked > 0);
}

/// Float16 twins of real exports (`tests/models/half`, written by `scripts/make_half.py` from
/// `tests/models/family`: FLOAT16 weights, constants, casts and outputs, as a `model.half()`
/// export holds them) against what onnxruntime answered on the same files, committed beside
/// them, on the family's three reference batches. onnxruntime computes in float16, encore widens
/// to f32, so the bound is float16's: per element |encore - ort| <= 4e-3 + |ort|/256 (as
/// `float16_model_matches_onnxruntime`), mean under 1e-3, at real positions. Also printed: each
/// engine's distance to the FP32 export's reference, where encore, computing in f32 on the
/// rounded weights, is the closer.
#[test]
fn float16_exports_match_onnxruntime_on_the_same_files() {
    let half = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/models/half");
    let family = half.join("../family");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(half.join("manifest.json")).unwrap())
            .unwrap();
    let fam = common::manifest(&family);
    let models = manifest["models"].as_array().unwrap();
    assert!(
        models.len() >= 4,
        "tests/models/half holds {} models",
        models.len()
    );
    for m in models {
        let id = m["id"].as_str().unwrap();
        let model = Model::load(half.join(m["f16"].as_str().unwrap()))
            .unwrap_or_else(|e| panic!("{id}: {e}"));
        let session = Session::new(&model, CompileOptions::default()).unwrap();
        let entry = common::model_entry(&fam, id);
        let (mut sum, mut n, mut max, mut ours_vs_fp32) = (0f64, 0usize, 0f32, 0f32);
        for batch in common::ref_batches(&family, entry) {
            let got = session.run(&batch.feeds()).unwrap();
            let got = got[0].1.as_f32().unwrap();
            let ort = TensorValue::read_npy(half.join(format!("{id}.{}.ort_f16.npy", batch.name)))
                .unwrap();
            let ort = ort.as_f32().unwrap();
            let fp32 = batch.outputs[0].1.as_f32().unwrap();
            assert_eq!(got.len(), ort.len(), "{id} {}", batch.name);
            let mask = batch.input("attention_mask").to_i64_vec().unwrap();
            let row = got.len() / mask.len();
            for (i, ((&a, &b), &r)) in got.iter().zip(ort).zip(fp32).enumerate() {
                if mask[i / row] == 0 {
                    continue;
                }
                let d = (a - b).abs();
                assert!(
                    d <= 4e-3 + b.abs() / 256.0,
                    "{id} {}[{i}]: encore {a}, onnxruntime {b}",
                    batch.name
                );
                sum += d as f64;
                n += 1;
                max = max.max(d);
                ours_vs_fp32 = ours_vs_fp32.max((a - r).abs());
            }
        }
        let mean = sum / n as f64;
        let ort_vs_fp32 = m["ort_f16_vs_fp32_max_abs"].as_f64().unwrap();
        eprintln!(
            "HALF {id}: {n} values, |encore - ort| max {max:.2e} mean {mean:.2e}; vs the FP32 \
             export: onnxruntime f16 {ort_vs_fp32:.2e}, encore {ours_vs_fp32:.2e}"
        );
        assert!(mean < 1e-3, "{id}: mean |encore - ort| {mean}");
    }
}

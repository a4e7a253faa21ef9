//! Imports every model in the shared models folder and checks it against `manifest.json`: names,
//! dtypes and declared shapes of inputs and outputs, op counts, the verifier, the text form's
//! print-parse-print identity, zero-copy weights, and errors (not panics) on truncated files.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use frontend_onnx::{import_bytes, import_path, ImportError};
use ir::{text, DType, Dim, Graph, Tensor};

fn models() -> Option<(PathBuf, Vec<serde_json::Value>)> {
    let dir = common::models_dir()?;
    let m = common::manifest(&dir);
    let models = m["models"].as_array().expect("models").clone();
    // Every .onnx file in the folder is in the manifest, so none goes untested.
    let mut files: Vec<String> = Vec::new();
    let mut stack = vec![dir.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read models dir") {
            let p = e.expect("dir entry").path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "onnx") {
                files.push(p.strip_prefix(&dir).unwrap().to_string_lossy().into_owned());
            }
        }
    }
    let mut listed: Vec<String> = models
        .iter()
        .map(|m| m["file"].as_str().unwrap().to_string())
        .collect();
    files.sort();
    listed.sort();
    assert_eq!(files, listed, "the .onnx files and the manifest's models");
    Some((dir, models))
}

fn dtype_of(manifest_dtype: &str) -> DType {
    match manifest_dtype {
        "int64" => DType::I64,
        "float32" => DType::F32,
        other => panic!("unexpected manifest dtype {other}"),
    }
}

fn dims_of(shape: &serde_json::Value) -> Vec<Dim> {
    shape
        .as_array()
        .expect("shape")
        .iter()
        .map(|d| match d {
            serde_json::Value::String(s) => Dim::sym(s),
            n => Dim::fixed(n.as_u64().expect("dim") as usize),
        })
        .collect()
}

/// The IR op an ONNX op of the manifest's histogram imports as, one node per node.
fn ir_name(onnx_op: &str) -> &'static str {
    match onnx_op {
        "Add" => "add",
        "Cast" => "cast",
        "Concat" => "concat",
        "ConstantOfShape" => "constant_of_shape",
        "CumSum" => "cumsum",
        "DequantizeLinear" => "dequantize_linear",
        "Div" => "div",
        "DynamicQuantizeLinear" => "dynamic_quantize_linear",
        "Equal" => "equal",
        "Erf" => "erf",
        "Expand" => "expand",
        "Gather" => "gather",
        "Gemm" => "gemm",
        "LayerNormalization" => "layer_norm",
        "MatMul" => "matmul",
        "MatMulInteger" => "matmul_integer",
        "Mul" => "mul",
        "Not" => "not",
        "QuantizeLinear" => "quantize_linear",
        "Reshape" => "reshape",
        "Shape" => "shape",
        "Slice" => "slice",
        "Softmax" => "softmax",
        "Sub" => "sub",
        "Tanh" => "tanh",
        "Transpose" => "transpose",
        "Unsqueeze" => "unsqueeze",
        "Where" => "where",
        other => panic!("the manifest has op {other}, which this test does not map"),
    }
}

fn check_against_manifest(g: &Graph, m: &serde_json::Value) {
    let id = m["id"].as_str().unwrap();
    g.verify().unwrap_or_else(|e| panic!("{id}: verify: {e}"));
    let inputs: Vec<(String, ir::TensorType)> = g
        .inputs()
        .iter()
        .map(|&i| match &g.node(i).op {
            ir::Op::Input { name } => (name.clone(), g.node(i).outputs[0].clone()),
            op => panic!("{id}: graph input is {op:?}"),
        })
        .collect();
    let want_inputs = m["inputs"].as_array().unwrap();
    assert_eq!(inputs.len(), want_inputs.len(), "{id}: number of inputs");
    for ((name, ty), w) in inputs.iter().zip(want_inputs) {
        assert_eq!(name, w["name"].as_str().unwrap(), "{id}: input name");
        assert_eq!(
            ty.dtype,
            dtype_of(w["dtype"].as_str().unwrap()),
            "{id}: {name}"
        );
        assert_eq!(
            ty.shape.as_ref(),
            Some(&dims_of(&w["shape"])),
            "{id}: {name}"
        );
    }
    let want_outputs = m["outputs"].as_array().unwrap();
    assert_eq!(
        g.outputs().len(),
        want_outputs.len(),
        "{id}: number of outputs"
    );
    for ((name, o), w) in g.outputs().iter().zip(want_outputs) {
        assert_eq!(name, w["name"].as_str().unwrap(), "{id}: output name");
        let ty = g.outlet_type(*o);
        assert_eq!(
            ty.dtype,
            dtype_of(w["dtype"].as_str().unwrap()),
            "{id}: {name}"
        );
        assert_eq!(
            ty.shape.as_ref(),
            Some(&dims_of(&w["shape"])),
            "{id}: {name}"
        );
    }
    // Every op but Constant maps one ONNX node to one IR node in these models.
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for name in common::op_names(g) {
        *counts.entry(name).or_default() += 1;
    }
    let ops = m["ops"].as_object().unwrap();
    let mut expected_nodes = 0;
    for (op, n) in ops {
        let n = n.as_u64().unwrap() as usize;
        if op == "Constant" {
            continue;
        }
        expected_nodes += n;
        assert_eq!(
            counts.get(ir_name(op)).copied().unwrap_or(0),
            n,
            "{id}: number of {op} nodes"
        );
    }
    let non_const = g.node_count()
        - counts.get("const").copied().unwrap_or(0)
        - counts.get("input").copied().unwrap_or(0);
    assert_eq!(non_const, expected_nodes, "{id}: no op lost or invented");
    assert_eq!(counts.get("input").copied().unwrap_or(0), want_inputs.len());
}

#[test]
fn every_shared_model_imports_and_matches_the_manifest() {
    let Some((dir, models)) = models() else {
        return;
    };
    for m in &models {
        let path = dir.join(m["file"].as_str().unwrap());
        let g = import_path(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        check_against_manifest(&g, m);
    }
}

fn constants(g: &Graph) -> HashMap<String, Tensor> {
    let mut map = HashMap::new();
    for id in g.node_ids() {
        if let ir::Op::Const { value } = &g.node(id).op {
            let old = map.insert(g.node(id).name.clone(), value.clone());
            assert!(
                old.is_none(),
                "constant name {} is not unique",
                g.node(id).name
            );
        }
    }
    map
}

#[test]
fn text_form_round_trips_on_every_model() {
    let Some((dir, models)) = models() else {
        return;
    };
    for m in &models {
        let path = dir.join(m["file"].as_str().unwrap());
        let g = import_path(&path).unwrap();
        let printed = text::print(&g).unwrap();
        let consts = constants(&g);
        let with_data = text::parse(&printed, Some(&consts)).unwrap();
        assert_eq!(
            text::print(&with_data).unwrap(),
            printed,
            "{}",
            path.display()
        );
        with_data.verify().unwrap();
        // The constants came back with their data, equal to the imported ones.
        let back = constants(&with_data);
        assert_eq!(back.len(), consts.len());
        for (name, t) in &consts {
            assert_eq!(&back[name], t, "{}: constant {name}", path.display());
        }
        let without = text::parse(&printed, None).unwrap();
        assert_eq!(
            text::print(&without).unwrap(),
            printed,
            "{}",
            path.display()
        );
    }
}

fn largest_constant(g: &Graph) -> Tensor {
    g.node_ids()
        .filter_map(|id| match &g.node(id).op {
            ir::Op::Const { value } => Some(value.clone()),
            _ => None,
        })
        .max_by_key(|t| t.bytes().map_or(0, |b| b.len()))
        .expect("a constant")
}

#[test]
fn weights_point_into_the_memory_map() {
    let Some(dir) = common::models_dir() else {
        return;
    };
    let path = dir.join("minilm-l6/model.onnx");
    let g = import_path(&path).unwrap();
    let w = largest_constant(&g);
    assert_eq!(w.shape(), &[30522, 384], "the word embeddings");
    let ptr = w.bytes().unwrap().as_ptr() as usize;
    let canonical = std::fs::canonicalize(&path).unwrap();
    assert_eq!(
        common::mapping_containing(ptr).as_deref(),
        Some(canonical.to_str().unwrap()),
        "the word embeddings must lie in the mapping of the model file"
    );

    // The same through import_bytes: the data is a slice of the given buffer.
    let bytes = Bytes::from(std::fs::read(&path).unwrap());
    let range = bytes.as_ptr() as usize..bytes.as_ptr() as usize + bytes.len();
    let g2 = import_bytes(bytes.clone(), None).unwrap();
    let w2 = largest_constant(&g2);
    assert!(range.contains(&(w2.bytes().unwrap().as_ptr() as usize)));
    assert_eq!(w2, w);
}

/// Truncated files give an error, never a panic. A cut inside the graph field is a decode
/// error; a cut that happens to fall between top-level fields still decodes, and then lacks the
/// graph or the opset (which follow in field order), so import fails on that instead.
#[test]
fn truncated_models_are_errors() {
    let Some((dir, models)) = models() else {
        return;
    };
    for m in &models {
        let path = dir.join(m["file"].as_str().unwrap());
        let bytes = Bytes::from(std::fs::read(&path).unwrap());
        let n = bytes.len();
        for cut in [0, 1, 10, 100, 1000, n / 2, n - 1] {
            if cut >= n {
                continue;
            }
            let r = import_bytes(bytes.slice(..cut), None);
            match r {
                Ok(_) => panic!("{}: cut at {cut} of {n} imported", path.display()),
                Err(e) if cut == n / 2 => assert!(
                    matches!(e, ImportError::Decode { .. }),
                    "{}: cut at {cut}: {e}",
                    path.display()
                ),
                Err(_) => {}
            }
        }
    }
}

#[test]
fn garbage_is_a_decode_error() {
    // Field 1 (ir_version, a varint) written as length-delimited: a wire type error.
    let e = import_bytes(Bytes::from_static(&[0x0a, 0x02, 0x01, 0x02]), None).unwrap_err();
    assert!(matches!(e, ImportError::Decode { .. }), "{e}");
    assert!(
        e.to_string().starts_with("not a valid ONNX protobuf"),
        "{e}"
    );
    // A length running past the end.
    let e = import_bytes(Bytes::from_static(&[0x3a, 0xff, 0x01, 0x00]), None).unwrap_err();
    assert!(matches!(e, ImportError::Decode { .. }), "{e}");
    // Pseudo-random bytes: some error, no panic.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for len in [3usize, 17, 256, 4096] {
        let data: Vec<u8> = (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 24) as u8
            })
            .collect();
        assert!(import_bytes(Bytes::from(data), None).is_err());
    }
}

#[test]
fn a_missing_file_is_an_io_error_naming_it() {
    let e = import_path(Path::new("/nonexistent/model.onnx")).unwrap_err();
    assert!(matches!(e, ImportError::Io { .. }), "{e}");
    assert!(e.to_string().contains("/nonexistent/model.onnx"), "{e}");
}

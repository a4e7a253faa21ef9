//! Models that decode but are inconsistent or unsupported give the specific typed error, and its
//! message names the node, op, domain or opset.

mod common;

use common::*;
use frontend_onnx::proto::{DataType, ModelProto, StringStringEntryProto, TensorProto};
use frontend_onnx::ImportError;

fn relu_model(opset: i64) -> Model {
    xy(opset).node(node("Relu", "relu0", &["x"], &["y"]))
}

#[test]
fn the_helper_builds_a_valid_model() {
    let g = relu_model(17).import().unwrap();
    assert_eq!(op_names(&g), ["input", "relu"]);
}

#[test]
fn dangling_input() {
    let e = xy(17)
        .node(node("Add", "add0", &["x", "nope"], &["y"]))
        .import()
        .unwrap_err();
    match &e {
        ImportError::DanglingInput { node, input } => {
            assert_eq!((node.as_str(), input.as_str()), ("add0", "nope"))
        }
        _ => panic!("{e:?}"),
    }
    let msg = e.to_string();
    assert!(msg.contains("add0") && msg.contains("nope"), "{msg}");
}

#[test]
fn wrong_initializer_size() {
    let mut w = f32_tensor("w", &[2, 3], &[1.0; 6]);
    w.raw_data = w.raw_data.slice(..20);
    let e = xy(17)
        .init(w)
        .node(node("MatMul", "mm", &["x", "w"], &["y"]))
        .import()
        .unwrap_err();
    match &e {
        ImportError::InitializerSize {
            name,
            expected,
            actual,
        } => assert_eq!((name.as_str(), *expected, *actual), ("w", 24, 20)),
        _ => panic!("{e:?}"),
    }
    assert!(e.to_string().contains("`w`"), "{e}");
}

#[test]
fn wrong_typed_data_count() {
    let w = TensorProto {
        name: "w".into(),
        data_type: DataType::Float as i32,
        dims: vec![4],
        float_data: vec![1.0, 2.0, 3.0],
        ..Default::default()
    };
    let e = xy(17)
        .init(w)
        .node(node("Add", "a", &["x", "w"], &["y"]))
        .import()
        .unwrap_err();
    assert!(
        matches!(
            e,
            ImportError::InitializerSize {
                expected: 16,
                actual: 12,
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn unsupported_op() {
    let e = xy(17)
        .node(node("FooBar", "foo0", &["x"], &["y"]))
        .import()
        .unwrap_err();
    match &e {
        ImportError::UnsupportedOp {
            node,
            op_type,
            domain,
            opset,
        } => assert_eq!(
            (node.as_str(), op_type.as_str(), domain.as_str(), *opset),
            ("foo0", "FooBar", "", 17)
        ),
        _ => panic!("{e:?}"),
    }
    let msg = e.to_string();
    for part in ["foo0", "FooBar", "opset 17"] {
        assert!(msg.contains(part), "{msg}");
    }
}

#[test]
fn node_in_another_domain() {
    let mut n = node("Attention", "attn0", &["x"], &["y"]);
    n.domain = "com.microsoft".into();
    let e = xy(17)
        .domain("com.microsoft", 1)
        .node(n)
        .import()
        .unwrap_err();
    match &e {
        ImportError::UnsupportedOp { domain, opset, .. } => {
            assert_eq!((domain.as_str(), *opset), ("com.microsoft", 1))
        }
        _ => panic!("{e:?}"),
    }
    let msg = e.to_string();
    for part in ["attn0", "Attention", "com.microsoft", "opset 1"] {
        assert!(msg.contains(part), "{msg}");
    }
}

#[test]
fn unused_domains_are_ignored() {
    let g = relu_model(17)
        .domain("com.microsoft", 1)
        .domain("ai.onnx.ml", 3)
        .domain("org.pytorch.aten", 1)
        .import()
        .unwrap();
    assert_eq!(op_names(&g), ["input", "relu"]);
}

#[test]
fn ai_onnx_is_the_default_domain() {
    let mut m = relu_model(17);
    m.m.opset_import[0].domain = "ai.onnx".into();
    if let Some(g) = m.m.graph.as_mut() {
        g.node[0].domain = "ai.onnx".into();
    }
    m.import().unwrap();
}

#[test]
fn unsupported_opsets() {
    for v in [1, 6, 28] {
        let e = relu_model(v).import().unwrap_err();
        assert!(
            matches!(&e, ImportError::UnsupportedOpset { domain, version } if domain.is_empty() && *version == v),
            "{e:?}"
        );
        assert!(e.to_string().contains(&format!("opset {v}")), "{e}");
        assert!(e.to_string().contains("7 to 27"), "{e}");
    }
    for v in [7, 9, 10, 11, 21, 22, 23, 24, 25, 26, 27] {
        relu_model(v).import().unwrap();
    }
    // Below 7, only a graph of ops unchanged since opset 1 (Not, Identity, Shape, Size).
    let identity = |v| xy(v).node(node("Identity", "id0", &["x"], &["y"]));
    identity(1).import().unwrap();
    let mixed = identity(1).node(node("Relu", "relu0", &["y"], &["z"]));
    assert!(matches!(
        mixed.import().unwrap_err(),
        ImportError::UnsupportedOpset { version: 1, .. }
    ));
}

#[test]
fn conflicting_opsets() {
    let e = relu_model(17).domain("ai.onnx", 13).import().unwrap_err();
    assert!(
        matches!(
            &e,
            ImportError::ConflictingOpsets {
                first: 17,
                second: 13,
                ..
            }
        ),
        "{e:?}"
    );
    // The same version listed under both spellings is fine.
    relu_model(17).domain("ai.onnx", 17).import().unwrap();
}

#[test]
fn missing_graph() {
    let m = Model {
        m: ModelProto::default(),
    };
    assert!(matches!(m.import(), Err(ImportError::MissingGraph)));
}

#[test]
fn duplicate_producer() {
    let e = xy(17)
        .node(node("Relu", "r1", &["x"], &["y"]))
        .node(node("Neg", "r2", &["x"], &["y"]))
        .import()
        .unwrap_err();
    assert!(
        matches!(&e, ImportError::DuplicateProducer { name, .. } if name == "y"),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(msg.contains("r1") && msg.contains("r2"), "{msg}");
}

#[test]
fn output_that_nothing_produces() {
    let e = relu_model(17)
        .output(value_info("z", DataType::Float, None))
        .import()
        .unwrap_err();
    assert!(
        matches!(&e, ImportError::MissingOutput { name } if name == "z"),
        "{e:?}"
    );
}

#[test]
fn cycle() {
    let e = xy(17)
        .node(node("Add", "a", &["x", "b_out"], &["a_out"]))
        .node(node("Relu", "b", &["a_out"], &["b_out"]))
        .node(node("Relu", "c", &["a_out"], &["y"]))
        .import()
        .unwrap_err();
    assert!(matches!(e, ImportError::Cycle { .. }), "{e:?}");
}

#[test]
fn attribute_of_the_wrong_type() {
    let n = with_attr(
        node("Concat", "cat", &["x", "x"], &["y"]),
        attr_float("axis", 1.0),
    );
    let e = xy(17).node(n).import().unwrap_err();
    match &e {
        ImportError::BadAttribute {
            node,
            op_type,
            attr,
            message,
        } => {
            assert_eq!(
                (node.as_str(), op_type.as_str(), attr.as_str()),
                ("cat", "Concat", "axis")
            );
            assert!(
                message.contains("INT") && message.contains("FLOAT"),
                "{message}"
            );
        }
        _ => panic!("{e:?}"),
    }
}

#[test]
fn attribute_without_a_type() {
    let mut a = attr_int("axis", 1);
    a.r#type = 0;
    let e = xy(17)
        .node(with_attr(node("Concat", "cat", &["x", "x"], &["y"]), a))
        .import()
        .unwrap_err();
    assert!(
        matches!(&e, ImportError::BadAttribute { attr, .. } if attr == "axis"),
        "{e:?}"
    );
}

#[test]
fn missing_required_attribute() {
    let e = xy(17)
        .node(node("Concat", "cat", &["x", "x"], &["y"]))
        .import()
        .unwrap_err();
    assert!(
        matches!(&e, ImportError::BadAttribute { attr, .. } if attr == "axis"),
        "{e:?}"
    );
}

/// Unsqueeze axes that are not constants become a second input of the IR op (read at run time);
/// axes of another dtype than int64 are an error naming the node.
#[test]
fn unsqueeze_axes_from_a_graph_input() {
    let g = xy(13)
        .input(value_info("axes", DataType::Int64, Some(vec![D::N(1)])))
        .node(node("Unsqueeze", "unsq", &["x", "axes"], &["y"]))
        .import()
        .unwrap();
    let y = g.outputs()[0].1;
    assert_eq!(g.node(y.node).op, ir::Op::Unsqueeze { axes: vec![] });
    assert_eq!(g.node_inputs(y.node).len(), 2);
    let e = xy(13)
        .input(value_info("axes", DataType::Float, Some(vec![D::N(1)])))
        .node(node("Unsqueeze", "unsq", &["x", "axes"], &["y"]))
        .import()
        .unwrap_err();
    assert!(
        matches!(&e, ImportError::BadNode { node, .. } if node == "unsq"),
        "{e:?}"
    );
}

/// Used Mean / InvStdDev outputs are computed by reductions beside the op; unused ones add
/// nothing; what cannot be computed exactly is a typed error naming the node.
#[test]
fn layer_norm_statistics_outputs() {
    let ln = |outs: &[&str], axis: i64| {
        with_attr(
            node("LayerNormalization", "ln", &["x", "g"], outs),
            attr_int("axis", axis),
        )
    };
    let g = xy(17)
        .init(f32_tensor("g", &[4], &[1.0; 4]))
        .node(ln(&["y", "mean"], 1))
        .output(value_info("mean", DataType::Float, None))
        .import()
        .unwrap();
    assert_eq!(count(&g, "layer_norm"), 1);
    assert_eq!(count(&g, "reduce_mean"), 2);
    // Named but unused: nothing beside the op.
    let g = xy(17)
        .init(f32_tensor("g", &[4], &[1.0; 4]))
        .node(ln(&["y", "mean", "inv"], -1))
        .import()
        .unwrap();
    assert_eq!(count(&g, "reduce_mean"), 0);
    // A positive axis needs the rank, which this input does not declare.
    let e = Model::new(17)
        .input(value_info("x", DataType::Float, None))
        .output(value_info("inv", DataType::Float, None))
        .init(f32_tensor("g", &[4], &[1.0; 4]))
        .node(ln(&["y", "", "inv"], 1))
        .import()
        .unwrap_err();
    assert!(
        matches!(&e, ImportError::BadNode { node, .. } if node == "ln"),
        "{e:?}"
    );
    // Statistics in another precision than f32 are not what encore computes.
    let e = xy(17)
        .init(f32_tensor("g", &[4], &[1.0; 4]))
        .node(with_attr(ln(&["y"], -1), attr_int("stash_type", 10)))
        .import()
        .unwrap_err();
    assert!(
        matches!(&e, ImportError::BadAttribute { node, attr, .. } if node == "ln" && attr == "stash_type"),
        "{e:?}"
    );
}

#[test]
fn layer_norm_needs_opset_17() {
    let e = xy(16)
        .init(f32_tensor("g", &[4], &[1.0; 4]))
        .node(node("LayerNormalization", "ln", &["x", "g"], &["y"]))
        .import()
        .unwrap_err();
    assert!(
        matches!(&e, ImportError::UnsupportedOp { opset: 16, .. }),
        "{e:?}"
    );
}

#[test]
fn dropout_mask_must_be_unused() {
    let e = xy(17)
        .node(node("Dropout", "drop", &["x"], &["y", "mask"]))
        .output(value_info("mask", DataType::Bool, None))
        .import()
        .unwrap_err();
    assert!(
        matches!(&e, ImportError::BadNode { node, .. } if node == "drop"),
        "{e:?}"
    );
}

/// Float16, bfloat16 and double are widened to f32: a Cast to the first two rounds to their
/// precision in f32, a Cast to double is a Cast to f32; types with no f32 meaning are refused
/// naming the node and type.
#[test]
fn cast_to_narrow_floats_is_to_f32_and_other_types_are_unsupported() {
    for (dt, want) in [
        (DataType::Float16, ir::Op::Unary(ir::UnaryOp::RoundToF16)),
        (DataType::Bfloat16, ir::Op::Unary(ir::UnaryOp::RoundToBf16)),
        (DataType::Double, ir::Op::Cast { to: ir::DType::F32 }),
    ] {
        let n = with_attr(node("Cast", "c", &["x"], &["y"]), attr_int("to", dt as i64));
        let mut m = xy(17).node(n);
        m.g().output[0] = value_info("y", dt, None);
        let g = m.import().unwrap_or_else(|e| panic!("{dt:?}: {e}"));
        let y = g.outputs()[0].1;
        assert_eq!(g.node(y.node).op, want);
    }
    for (dt, name) in [
        (DataType::String, "STRING"),
        (DataType::Complex64, "COMPLEX64"),
    ] {
        let n = with_attr(node("Cast", "c", &["x"], &["y"]), attr_int("to", dt as i64));
        let e = xy(17).node(n).import().unwrap_err();
        assert!(
            matches!(&e, ImportError::UnsupportedDType { data_type, .. } if *data_type == dt as i32),
            "{e:?}"
        );
        let msg = e.to_string();
        assert!(msg.contains(name) && msg.contains("`c`"), "{msg}");
    }
}

#[test]
fn narrow_float_graph_inputs_are_f32_and_others_unsupported() {
    for dt in [DataType::Float16, DataType::Bfloat16, DataType::Double] {
        let g = Model::new(17)
            .input(value_info("x", dt, None))
            .output(value_info("x", dt, None))
            .import()
            .unwrap();
        assert_eq!(g.outlet_type(g.inputs()[0].into()).dtype, ir::DType::F32);
    }
    let e = Model::new(17)
        .input(value_info("x", DataType::Complex64, None))
        .output(value_info("x", DataType::Complex64, None))
        .import()
        .unwrap_err();
    assert!(
        matches!(&e, ImportError::UnsupportedDType { what, .. } if what.contains("`x`")),
        "{e:?}"
    );
}

#[test]
fn declared_type_must_match_the_computed_one() {
    let e = xy(17)
        .node(node("Shape", "shape", &["x"], &["s"]))
        .node(node("Relu", "r", &["x"], &["y"]))
        .value_info(value_info("s", DataType::Float, None))
        .import()
        .unwrap_err();
    assert!(
        matches!(&e, ImportError::TypeMismatch { name, .. } if name == "s"),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(msg.contains("f32") && msg.contains("i64"), "{msg}");
}

#[test]
fn mixed_dtypes_in_a_binary_op() {
    let e = xy(17)
        .init(i64_tensor("k", &[], &[1]))
        .node(node("Add", "add", &["x", "k"], &["y"]))
        .import()
        .unwrap_err();
    assert!(
        matches!(&e, ImportError::BadNode { node, .. } if node == "add"),
        "{e:?}"
    );
}

#[test]
fn negative_dims_in_a_tensor() {
    let e = xy(17)
        .init(f32_tensor("w", &[-1], &[]))
        .node(node("Add", "a", &["x", "w"], &["y"]))
        .import()
        .unwrap_err();
    assert!(
        matches!(&e, ImportError::BadTensor { name, .. } if name == "w"),
        "{e:?}"
    );
}

#[test]
fn string_tensors_are_unsupported() {
    let t = TensorProto {
        name: "s".into(),
        data_type: DataType::String as i32,
        dims: vec![1],
        ..Default::default()
    };
    let e = relu_model(17).init(t).import().unwrap_err();
    assert!(
        matches!(&e, ImportError::UnsupportedDType { data_type: 8, .. }),
        "{e:?}"
    );
}

fn external(name: &str, location: &str, offset: Option<&str>, length: Option<&str>) -> TensorProto {
    let mut kv = vec![StringStringEntryProto {
        key: "location".into(),
        value: location.into(),
    }];
    if let Some(o) = offset {
        kv.push(StringStringEntryProto {
            key: "offset".into(),
            value: o.into(),
        });
    }
    if let Some(l) = length {
        kv.push(StringStringEntryProto {
            key: "length".into(),
            value: l.into(),
        });
    }
    TensorProto {
        name: name.into(),
        data_type: DataType::Float as i32,
        dims: vec![4],
        external_data: kv,
        data_location: 1,
        ..Default::default()
    }
}

fn ext_model(t: TensorProto) -> Model {
    xy(17).init(t).node(node("Add", "a", &["x", "w"], &["y"]))
}

#[test]
fn external_data() {
    let dir = std::env::temp_dir().join(format!("encore-frontend-ext-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let values = [1.5f32, -2.0, 3.25, 4.0];
    let mut data = vec![0xAAu8; 8];
    data.extend(values.iter().flat_map(|v| v.to_le_bytes()));
    std::fs::write(dir.join("weights.bin"), &data).unwrap();

    let m = ext_model(external("w", "weights.bin", Some("8"), Some("16")));
    std::fs::write(dir.join("model.onnx"), m.bytes()).unwrap();
    let g = frontend_onnx::import_path(dir.join("model.onnx")).unwrap();
    let w = g
        .node_ids()
        .find_map(|id| match &g.node(id).op {
            ir::Op::Const { value } => Some(value.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(w.to_vec::<f32>().unwrap(), values);
    // Not copied: the bytes lie in the mapping of the data file.
    let weights = std::fs::canonicalize(dir.join("weights.bin")).unwrap();
    assert_eq!(
        mapping_containing(w.bytes().unwrap().as_ptr() as usize).as_deref(),
        Some(weights.to_str().unwrap())
    );

    // Without a folder there is nowhere to look.
    let e = m.import().unwrap_err();
    assert!(
        matches!(&e, ImportError::ExternalData { tensor, .. } if tensor == "w"),
        "{e:?}"
    );
    // Out of range, escaping the folder, a missing file, a bad number.
    for t in [
        external("w", "weights.bin", Some("16"), Some("16")),
        external("w", "../weights.bin", None, None),
        external("w", "/etc/passwd", None, None),
        external("w", "weights.bin", Some("x"), None),
        external("w", "weights.bin", Some("8"), Some("18446744073709551615")),
    ] {
        let e = frontend_onnx::import_bytes(ext_model(t).bytes(), Some(&dir)).unwrap_err();
        assert!(matches!(&e, ImportError::ExternalData { .. }), "{e:?}");
    }
    let e = frontend_onnx::import_bytes(
        ext_model(external("w", "absent.bin", None, None)).bytes(),
        Some(&dir),
    )
    .unwrap_err();
    assert!(matches!(&e, ImportError::Io { .. }), "{e:?}");
    // Whole file from offset 8 when no length is given: 16 bytes, the right size.
    frontend_onnx::import_bytes(
        ext_model(external("w", "weights.bin", Some("8"), None)).bytes(),
        Some(&dir),
    )
    .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Dropout in training mode drops at random: refused, never run as an identity.
#[test]
fn dropout_in_training_mode_is_refused() {
    let bool_tensor = |name: &str, v: u8| raw_tensor(name, DataType::Bool, &[], vec![v]);
    let dropout = || node("Dropout", "drop", &["x", "", "t"], &["y"]);
    let e = xy(13)
        .init(bool_tensor("t", 1))
        .node(dropout())
        .import()
        .unwrap_err();
    assert!(
        matches!(&e, ImportError::BadNode { node, message, .. } if node == "drop" && message.contains("training_mode")),
        "{e:?}"
    );
    let e = xy(13)
        .input(value_info("t", DataType::Bool, None))
        .node(dropout())
        .import()
        .unwrap_err();
    assert!(
        matches!(&e, ImportError::NonConstantInput { node, input, .. } if node == "drop" && input == "t"),
        "{e:?}"
    );
    let g = xy(13)
        .init(bool_tensor("t", 0))
        .node(dropout())
        .import()
        .unwrap();
    assert_eq!(op_names(&g), ["input"]);
}

//! The import of individual ops, attributes and constants, across opsets.

mod common;

use common::*;
use frontend_onnx::proto::{AttributeProto, DataType, TensorProto};
use ir::{text, BinaryOp, DType, Dim, Op, ReduceOp, Tensor};

fn first_op<'g>(g: &'g ir::Graph, name: &str) -> &'g Op {
    g.node_ids()
        .map(|id| &g.node(id).op)
        .find(|op| op.name() == name)
        .unwrap_or_else(|| panic!("no {name} node in\n{}", text::print(g).unwrap()))
}

fn const_of(g: &ir::Graph, node_name: &str) -> Tensor {
    g.node_ids()
        .find_map(|id| match &g.node(id).op {
            Op::Const { value } if g.node(id).name == node_name => Some(value.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no constant {node_name}"))
}

#[test]
fn unsqueeze_axes_from_attribute_before_13_and_input_after() {
    let old = xy(11)
        .node(with_attr(
            node("Unsqueeze", "u", &["x"], &["y"]),
            attr_ints("axes", &[0, 3]),
        ))
        .import()
        .unwrap();
    let new = xy(13)
        .init(i64_tensor("axes", &[2], &[0, 3]))
        .node(node("Unsqueeze", "u", &["x", "axes"], &["y"]))
        .import()
        .unwrap();
    let e = xy(13)
        .node(with_attr(
            node("Unsqueeze", "u", &["x"], &["y"]),
            attr_ints("axes", &[0]),
        ))
        .import()
        .unwrap_err();
    assert!(
        matches!(e, frontend_onnx::ImportError::BadAttribute { .. }),
        "{e:?}"
    );
    for g in [&old, &new] {
        assert_eq!(
            first_op(g, "unsqueeze"),
            &Op::Unsqueeze { axes: vec![0, 3] }
        );
        // The axes constant was consumed into the attribute and is gone.
        assert_eq!(op_names(g), ["input", "unsqueeze"]);
    }
    // Constant nodes work as well as initializers.
    let g = xy(17)
        .node(with_attr(
            node("Constant", "c", &[], &["axes"]),
            attr_tensor("value", i64_tensor("", &[1], &[1])),
        ))
        .node(node("Squeeze", "s", &["x", "axes"], &["y"]))
        .import()
        .unwrap();
    assert_eq!(first_op(&g, "squeeze"), &Op::Squeeze { axes: vec![1] });
}

#[test]
fn reduce_axes_by_opset() {
    let attr_form = |op: &str, opset| {
        xy(opset)
            .node(with_attr(
                with_attr(node(op, "r", &["x"], &["y"]), attr_ints("axes", &[-1])),
                attr_int("keepdims", 0),
            ))
            .import()
    };
    let input_form = |op: &str, opset| {
        xy(opset)
            .init(i64_tensor("axes", &[1], &[-1]))
            .node(with_attr(
                node(op, "r", &["x", "axes"], &["y"]),
                attr_int("keepdims", 0),
            ))
            .import()
    };
    let want = |op| Op::Reduce {
        op,
        axes: vec![-1],
        keepdims: false,
    };
    let g = attr_form("ReduceMean", 17).unwrap();
    assert_eq!(first_op(&g, "reduce_mean"), &want(ReduceOp::Mean));
    let g = input_form("ReduceMean", 18).unwrap();
    assert_eq!(first_op(&g, "reduce_mean"), &want(ReduceOp::Mean));
    let g = attr_form("ReduceSum", 12).unwrap();
    assert_eq!(first_op(&g, "reduce_sum"), &want(ReduceOp::Sum));
    let g = input_form("ReduceSum", 13).unwrap();
    assert_eq!(first_op(&g, "reduce_sum"), &want(ReduceOp::Sum));
    let g = input_form("ReduceMax", 18).unwrap();
    assert_eq!(first_op(&g, "reduce_max"), &want(ReduceOp::Max));
    // An axes attribute where the opset takes an input is an error, not ignored.
    let e = attr_form("ReduceSum", 13).unwrap_err();
    assert!(
        matches!(&e, frontend_onnx::ImportError::BadAttribute { attr, .. } if attr == "axes"),
        "{e:?}"
    );
    assert!(attr_form("ReduceMean", 18).is_err());
    // No axes: all are reduced.
    let g = xy(18)
        .node(node("ReduceMax", "r", &["x"], &["y"]))
        .import()
        .unwrap();
    assert_eq!(
        first_op(&g, "reduce_max"),
        &Op::Reduce {
            op: ReduceOp::Max,
            axes: vec![],
            keepdims: true
        }
    );
    // noop_with_empty_axes and no axes: the identity.
    let g = xy(18)
        .node(with_attr(
            node("ReduceMean", "r", &["x"], &["y"]),
            attr_int("noop_with_empty_axes", 1),
        ))
        .import()
        .unwrap();
    assert_eq!(op_names(&g), ["input"]);
}

#[test]
fn softmax_before_13_on_the_last_axis_is_one_op() {
    for (opset, axis) in [(11, Some(-1)), (11, Some(1)), (13, None), (17, Some(-1))] {
        let mut n = node("Softmax", "sm", &["x"], &["y"]);
        if let Some(a) = axis {
            n = with_attr(n, attr_int("axis", a));
        }
        let g = xy(opset).node(n).import().unwrap();
        assert_eq!(
            op_names(&g),
            ["input", "softmax"],
            "opset {opset} axis {axis:?}"
        );
    }
}

#[test]
fn softmax_before_13_on_an_inner_axis_is_flattened() {
    let g = Model::new(11)
        .input(value_info(
            "x",
            DataType::Float,
            Some(vec![D::P("b"), D::N(3), D::N(4)]),
        ))
        .output(value_info("y", DataType::Float, None))
        .node(with_attr(
            node("Softmax", "sm", &["x"], &["y"]),
            attr_int("axis", 1),
        ))
        .import()
        .unwrap();
    assert_eq!(
        op_names(&g),
        ["input", "shape", "flatten", "softmax", "reshape"]
    );
    assert_eq!(first_op(&g, "flatten"), &Op::Flatten { axis: 1 });
    assert_eq!(first_op(&g, "softmax"), &Op::Softmax { axis: 1 });
    assert_eq!(output_node(&g, "y").op.name(), "reshape");
}

#[test]
fn identity_and_dropout_add_no_node() {
    let g = xy(17)
        .node(node("Identity", "id", &["x"], &["t"]))
        .node(node("Dropout", "drop", &["t"], &["u", "mask"]))
        .node(node("Relu", "r", &["u"], &["y"]))
        .import()
        .unwrap();
    assert_eq!(op_names(&g), ["input", "relu"]);
    let g = xy(17)
        .node(node("Identity", "id", &["x"], &["y"]))
        .import()
        .unwrap();
    assert_eq!(output_node(&g, "y").op.name(), "input");
    // A shape declared for the alias is the shape of the aliased value.
    let mut m =
        xy(17)
            .node(node("Relu", "r", &["x"], &["t"]))
            .node(node("Identity", "id", &["t"], &["y"]));
    m.g().output[0] = value_info("y", DataType::Float, Some(vec![D::P("batch"), D::N(4)]));
    let s = text::print(&m.import().unwrap()).unwrap();
    assert!(s.contains("relu(%0) : f32[batch,4]"), "{s}");
    // ... and its dtype is checked.
    let mut m = xy(17).node(node("Identity", "id", &["x"], &["y"]));
    m.g().output[0] = value_info("y", DataType::Int64, None);
    let e = m.import().unwrap_err();
    assert!(
        matches!(e, frontend_onnx::ImportError::TypeMismatch { .. }),
        "{e:?}"
    );
}

#[test]
fn variadic_max_becomes_a_chain() {
    let g = xy(17)
        .node(node("Max", "m", &["x", "x", "x"], &["y"]))
        .import()
        .unwrap();
    assert_eq!(op_names(&g), ["input", "max", "max"]);
    assert_eq!(output_node(&g, "y").name, "m");
}

#[test]
fn output_dtypes_follow_onnx() {
    let g = xy(17)
        .init(f32_tensor("zero", &[], &[0.0]))
        .node(node("Greater", "gt", &["x", "zero"], &["mask"]))
        .node(node("Not", "not", &["mask"], &["nmask"]))
        .node(node("Shape", "shape", &["x"], &["s"]))
        .node(with_attr(
            node("Cast", "cast", &["nmask"], &["ci"]),
            attr_int("to", 6),
        ))
        .node(node("Where", "w", &["mask", "x", "zero"], &["y"]))
        .output(value_info("s", DataType::Int64, None))
        .output(value_info("ci", DataType::Int32, None))
        .output(value_info("nmask", DataType::Bool, None))
        .import()
        .unwrap();
    let dt = |name| g.outlet_type(output_node_outlet(&g, name)).dtype;
    assert_eq!(dt("y"), DType::F32);
    assert_eq!(dt("s"), DType::I64);
    assert_eq!(dt("ci"), DType::I32);
    assert_eq!(dt("nmask"), DType::Bool);
}

#[test]
fn less_or_equal_and_greater_or_equal_give_bool() {
    let g = xy(17)
        .init(f32_tensor("zero", &[], &[0.0]))
        .node(node("LessOrEqual", "le", &["x", "zero"], &["le"]))
        .node(node("GreaterOrEqual", "ge", &["x", "zero"], &["ge"]))
        .node(node("And", "and", &["le", "ge"], &["both"]))
        .node(node("Where", "w", &["both", "x", "zero"], &["y"]))
        .output(value_info("le", DataType::Bool, None))
        .output(value_info("ge", DataType::Bool, None))
        .import()
        .unwrap();
    assert_eq!(output_node(&g, "le").op, Op::Binary(BinaryOp::LessOrEqual));
    assert_eq!(
        output_node(&g, "ge").op,
        Op::Binary(BinaryOp::GreaterOrEqual)
    );
    let dt = |name| g.outlet_type(output_node_outlet(&g, name)).dtype;
    assert_eq!(dt("le"), DType::Bool);
    assert_eq!(dt("ge"), DType::Bool);

    // Operands of different dtypes are rejected, naming the node.
    let e = xy(17)
        .init(i64_tensor("zero", &[], &[0]))
        .node(node("LessOrEqual", "le", &["x", "zero"], &["y"]))
        .import()
        .unwrap_err();
    match e {
        frontend_onnx::ImportError::BadNode { node, op_type, .. } => {
            assert_eq!((node.as_str(), op_type.as_str()), ("le", "LessOrEqual"))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn clip_bounds_are_optional_inputs() {
    let both = xy(13)
        .init(f32_tensor("lo", &[], &[-1.0]))
        .init(f32_tensor("hi", &[], &[6.0]))
        .node(node("Clip", "c", &["x", "lo", "hi"], &["y"]))
        .import()
        .unwrap();
    assert_eq!(output_node(&both, "y").op, Op::Clip);
    assert_eq!(
        both.node_inputs(output_node_outlet(&both, "y").node).len(),
        3
    );

    let min_only = xy(11)
        .init(f32_tensor("lo", &[], &[0.0]))
        .node(node("Clip", "c", &["x", "lo"], &["y"]))
        .import()
        .unwrap();
    assert_eq!(
        min_only
            .node_inputs(output_node_outlet(&min_only, "y").node)
            .len(),
        2
    );

    // Max without min: the IR has no gaps, so min becomes the lowest f32.
    let max_only = xy(13)
        .init(f32_tensor("hi", &[], &[6.0]))
        .node(node("Clip", "c", &["x", "", "hi"], &["y"]))
        .import()
        .unwrap();
    let ins = max_only.node_inputs(output_node_outlet(&max_only, "y").node);
    assert_eq!(ins.len(), 3);
    let lo = max_only.const_value(ins[1]).unwrap().to_f32_vec().unwrap();
    assert_eq!(lo, vec![f32::NEG_INFINITY]);
    assert_eq!(
        max_only.const_value(ins[2]).unwrap().to_f32_vec().unwrap(),
        vec![6.0]
    );

    // The pre-11 attribute form and mismatched bound dtypes are rejected.
    let e = xy(13)
        .node(with_attr(
            node("Clip", "c", &["x"], &["y"]),
            attr_float("max", 6.0),
        ))
        .import()
        .unwrap_err();
    assert!(
        matches!(e, frontend_onnx::ImportError::BadAttribute { .. }),
        "{e:?}"
    );
    let e = xy(13)
        .init(i64_tensor("hi", &[], &[6]))
        .node(node("Clip", "c", &["x", "", "hi"], &["y"]))
        .import()
        .unwrap_err();
    assert!(
        matches!(e, frontend_onnx::ImportError::BadNode { ref node, .. } if node == "c"),
        "{e:?}"
    );
}

#[test]
fn split_sizes_by_opset() {
    let with_outputs = |m: Model| {
        m.output(value_info("a", DataType::Float, None))
            .output(value_info("b", DataType::Float, None))
    };
    // Opset 11: sizes as an attribute, turned into a constant input.
    let g = with_outputs(xy(11))
        .node(with_attr(
            with_attr(node("Split", "s", &["x"], &["a", "b"]), attr_int("axis", 1)),
            attr_ints("split", &[1, 3]),
        ))
        .node(node("Add", "add", &["a", "a"], &["y"]))
        .import()
        .unwrap();
    let s = output_node_outlet(&g, "b");
    assert_eq!(s.slot, 1);
    assert_eq!(
        g.node(s.node).op,
        Op::Split {
            axis: 1,
            num_outputs: 2
        }
    );
    let ins = g.node_inputs(s.node);
    assert_eq!(
        g.const_value(ins[1]).unwrap().to_i64_vec().unwrap(),
        vec![1, 3]
    );
    assert_eq!(g.outlet_type(s).dtype, DType::F32);

    // Opset 13: an input; 18: num_outputs instead, which must match the outputs.
    let g = with_outputs(xy(13))
        .init(i64_tensor("sizes", &[2], &[2, 2]))
        .node(node("Split", "s", &["x", "sizes"], &["a", "b"]))
        .node(node("Add", "add", &["a", "b"], &["y"]))
        .import()
        .unwrap();
    assert_eq!(g.node_inputs(output_node_outlet(&g, "a").node).len(), 2);
    let g = with_outputs(xy(18))
        .node(with_attr(
            node("Split", "s", &["x"], &["a", "b"]),
            attr_int("num_outputs", 2),
        ))
        .node(node("Add", "add", &["a", "b"], &["y"]))
        .import()
        .unwrap();
    assert_eq!(g.node_inputs(output_node_outlet(&g, "a").node).len(), 1);

    let bad_attr = |m: Model| match m.import().unwrap_err() {
        frontend_onnx::ImportError::BadAttribute { node, attr, .. } => (node, attr),
        other => panic!("{other:?}"),
    };
    let add = node("Add", "add", &["a", "b"], &["y"]);
    let three = with_attr(
        node("Split", "s", &["x"], &["a", "b"]),
        attr_int("num_outputs", 3),
    );
    assert_eq!(
        bad_attr(with_outputs(xy(18)).node(three.clone()).node(add.clone())),
        ("s".to_string(), "num_outputs".to_string())
    );
    assert_eq!(
        bad_attr(with_outputs(xy(13)).node(three).node(add.clone())),
        ("s".to_string(), "num_outputs".to_string())
    );
    let e = with_outputs(xy(13))
        .init(i64_tensor("sizes", &[3], &[1, 1, 2]))
        .node(node("Split", "s", &["x", "sizes"], &["a", "b"]))
        .node(add)
        .import()
        .unwrap_err();
    assert!(
        matches!(e, frontend_onnx::ImportError::BadNode { ref node, .. } if node == "s"),
        "{e:?}"
    );
}

#[test]
fn tile_takes_i64_repeats() {
    let g = xy(13)
        .init(i64_tensor("reps", &[2], &[1, 2]))
        .node(node("Tile", "t", &["x", "reps"], &["y"]))
        .import()
        .unwrap();
    assert_eq!(output_node(&g, "y").op, Op::Tile);
    assert_eq!(g.outlet_type(output_node_outlet(&g, "y")).dtype, DType::F32);
    let e = xy(13)
        .init(f32_tensor("reps", &[2], &[1.0, 2.0]))
        .node(node("Tile", "t", &["x", "reps"], &["y"]))
        .import()
        .unwrap_err();
    assert!(
        matches!(e, frontend_onnx::ImportError::BadNode { ref node, .. } if node == "t"),
        "{e:?}"
    );
}

fn output_node_outlet(g: &ir::Graph, name: &str) -> ir::Outlet {
    g.outputs().iter().find(|(n, _)| n == name).unwrap().1
}

#[test]
fn quantize_linear_output_type_comes_from_the_zero_point() {
    let build = |zp: Option<TensorProto>| {
        let mut m = xy(17)
            .init(f32_tensor("scale", &[], &[0.1]))
            .output(value_info("q", DataType::Uint8, None));
        let mut ins = vec!["x", "scale"];
        if let Some(zp) = zp {
            m = m.init(zp);
            ins.push("zp");
        }
        m.node(node("QuantizeLinear", "q", &ins, &["q"])).node(node(
            "DequantizeLinear",
            "dq",
            &["q", "scale"],
            &["y"],
        ))
    };
    let mut m = build(Some(raw_tensor("zp", DataType::Int8, &[], vec![0])));
    m.g().output[1] = value_info("q", DataType::Int8, None);
    let g = m.import().unwrap();
    assert_eq!(
        first_op(&g, "quantize_linear"),
        &Op::QuantizeLinear {
            axis: 1,
            to: DType::I8
        }
    );
    assert_eq!(g.outlet_type(output_node_outlet(&g, "q")).dtype, DType::I8);
    assert_eq!(g.outlet_type(output_node_outlet(&g, "y")).dtype, DType::F32);
    let g = build(None).import().unwrap();
    assert_eq!(
        first_op(&g, "quantize_linear"),
        &Op::QuantizeLinear {
            axis: 1,
            to: DType::U8
        }
    );
}

/// Opset 23's two new quantization attributes: accepted where they mean what encore computes,
/// refused with the attribute and opset named otherwise.
#[test]
fn quantize_precision_and_dequantize_output_dtype_at_opset_23() {
    let build = |q_attr: Option<AttributeProto>, dq_attr: Option<AttributeProto>| {
        let mut q = node("QuantizeLinear", "q", &["x", "scale"], &["q"]);
        if let Some(a) = q_attr {
            q = with_attr(q, a);
        }
        let mut dq = node("DequantizeLinear", "dq", &["q", "scale"], &["y"]);
        if let Some(a) = dq_attr {
            dq = with_attr(dq, a);
        }
        xy(23)
            .init(f32_tensor("scale", &[], &[0.1]))
            .node(q)
            .node(dq)
            .import()
    };
    build(None, None).unwrap();
    build(
        Some(attr_int("precision", 0)),
        Some(attr_int("output_dtype", 0)),
    )
    .unwrap();
    build(
        Some(attr_int("precision", DataType::Float as i64)),
        Some(attr_int("output_dtype", DataType::Float as i64)),
    )
    .unwrap();
    let e = build(Some(attr_int("precision", DataType::Float16 as i64)), None).unwrap_err();
    assert!(
        matches!(&e, frontend_onnx::ImportError::BadAttribute { attr, node, .. } if attr == "precision" && node == "q"),
        "{e:?}"
    );
    assert!(e.to_string().contains("opset 23"), "{e}");
    let e = build(None, Some(attr_int("output_dtype", DataType::Int64 as i64))).unwrap_err();
    assert!(
        matches!(&e, frontend_onnx::ImportError::BadAttribute { attr, node, .. } if attr == "output_dtype" && node == "dq"),
        "{e:?}"
    );
}

/// An op that encore does not import is refused by name, with the opset, at opset 23 as at
/// the others (RMSNormalization, Attention and RotaryEmbedding, new in 23, are imported).
#[test]
fn opset_23_unknown_ops_are_refused_by_name() {
    let e = xy(23)
        .node(node("TensorScatter", "n", &["x", "x", "x"], &["y"]))
        .import()
        .unwrap_err();
    assert!(
        matches!(&e, frontend_onnx::ImportError::UnsupportedOp { op_type, opset: 23, .. } if op_type == "TensorScatter"),
        "{e:?}"
    );
}

#[test]
fn constant_attribute_forms() {
    let g = Model::new(17)
        .node(with_attr(
            node("Constant", "f", &[], &["f"]),
            attr_float("value_float", 2.5),
        ))
        .node(with_attr(
            node("Constant", "is", &[], &["is"]),
            attr_ints("value_ints", &[1, -2]),
        ))
        .node(with_attr(
            node("Constant", "i", &[], &["i"]),
            attr_int("value_int", 7),
        ))
        .output(value_info("f", DataType::Float, None))
        .output(value_info("is", DataType::Int64, None))
        .output(value_info("i", DataType::Int64, None))
        .import()
        .unwrap();
    assert_eq!(const_of(&g, "f"), Tensor::scalar(2.5f32));
    assert_eq!(
        const_of(&g, "is"),
        Tensor::from_vec(vec![2], vec![1i64, -2])
    );
    assert_eq!(const_of(&g, "i"), Tensor::scalar(7i64));
}

fn init_model(t: TensorProto) -> ir::Graph {
    let name = t.name.clone();
    Model::new(17)
        .init(t)
        .node(node("Identity", "id", &[&name], &["out"]))
        .output(value_info("out", DataType::Undefined, None))
        .import()
        .unwrap()
}

#[test]
fn initializer_data_types_and_encodings() {
    let f16: Vec<u8> = [1.5f32, -0.25]
        .iter()
        .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
        .collect();
    let g = init_model(raw_tensor("h", DataType::Float16, &[2], f16));
    assert_eq!(const_of(&g, "h").to_vec::<f32>().unwrap(), [1.5, -0.25]);
    let f64s: Vec<u8> = [1.5f64, 1e300]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let g = init_model(raw_tensor("d", DataType::Double, &[2], f64s));
    assert_eq!(
        const_of(&g, "d").to_vec::<f32>().unwrap(),
        [1.5, f32::INFINITY]
    );
    let bf: Vec<u8> = half::bf16::from_f32(3.0).to_le_bytes().to_vec();
    let g = init_model(raw_tensor("b", DataType::Bfloat16, &[1], bf));
    // BFLOAT16 is widened to f32 like FLOAT16 (encore computes floats in f32).
    assert_eq!(const_of(&g, "b").dtype(), DType::F32);
    assert_eq!(const_of(&g, "b").to_f32_vec().unwrap(), [3.0]);

    // Typed fields.
    let typed = |dt: DataType, f: &dyn Fn(&mut TensorProto)| {
        let mut t = TensorProto {
            name: "t".into(),
            data_type: dt as i32,
            dims: vec![2],
            ..Default::default()
        };
        f(&mut t);
        const_of(&init_model(t), "t")
    };
    let t = typed(DataType::Int8, &|t| t.int32_data = vec![-3, 127]);
    assert_eq!(t.to_vec::<i8>().unwrap(), [-3, 127]);
    let t = typed(DataType::Uint8, &|t| t.int32_data = vec![0, 255]);
    assert_eq!(t.to_vec::<u8>().unwrap(), [0, 255]);
    let t = typed(DataType::Bool, &|t| t.int32_data = vec![1, 0]);
    assert_eq!(t.to_vec::<bool>().unwrap(), [true, false]);
    let t = typed(DataType::Int32, &|t| t.int32_data = vec![-5, 6]);
    assert_eq!(t.to_vec::<i32>().unwrap(), [-5, 6]);
    let t = typed(DataType::Int16, &|t| t.int32_data = vec![-32768, 300]);
    assert_eq!(t.to_vec::<i16>().unwrap(), [-32768, 300]);
    let t = typed(DataType::Uint16, &|t| t.int32_data = vec![65535, 7]);
    assert_eq!(t.to_vec::<u16>().unwrap(), [65535, 7]);
    let t = typed(DataType::Uint32, &|t| {
        t.uint64_data = vec![u32::MAX as u64, 1]
    });
    assert_eq!(t.to_vec::<u32>().unwrap(), [u32::MAX, 1]);
    let t = typed(DataType::Uint64, &|t| t.uint64_data = vec![u64::MAX, 2]);
    assert_eq!(t.to_vec::<u64>().unwrap(), [u64::MAX, 2]);
    let t = typed(DataType::Int64, &|t| t.int64_data = vec![i64::MIN, 9]);
    assert_eq!(t.to_vec::<i64>().unwrap(), [i64::MIN, 9]);
    let t = typed(DataType::Float, &|t| t.float_data = vec![0.5, -1.0]);
    assert_eq!(t.to_vec::<f32>().unwrap(), [0.5, -1.0]);
    let t = typed(DataType::Double, &|t| t.double_data = vec![0.5, -1.0]);
    assert_eq!(t.to_vec::<f32>().unwrap(), [0.5, -1.0]);
    let bits = half::f16::from_f32(-2.0).to_bits() as i32;
    let t = typed(DataType::Float16, &|t| t.int32_data = vec![bits, 0]);
    assert_eq!(t.to_vec::<f32>().unwrap(), [-2.0, 0.0]);
    let bits = half::bf16::from_f32(0.5).to_bits() as i32;
    let t = typed(DataType::Bfloat16, &|t| t.int32_data = vec![bits, bits]);
    assert_eq!(t.to_f32_vec().unwrap(), [0.5, 0.5]);
}

#[test]
fn dims_become_symbols() {
    let g = Model::new(17)
        .input(value_info(
            "x",
            DataType::Float,
            Some(vec![
                D::P("batch size"),
                D::P("2d"),
                D::Unknown,
                D::P("unk0"),
                D::N(7),
            ]),
        ))
        .output(value_info("x", DataType::Float, None))
        .import()
        .unwrap();
    let ty = &g.node(g.inputs()[0]).outputs[0];
    assert_eq!(
        ty.shape.as_ref().unwrap(),
        &vec![
            Dim::sym("batch_size"),
            Dim::sym("_2d"),
            Dim::sym("unk1"),
            Dim::sym("unk0"),
            Dim::fixed(7)
        ]
    );
    // No shape at all is an unknown rank.
    let g = Model::new(17)
        .input(value_info("x", DataType::Float, None))
        .output(value_info("x", DataType::Float, None))
        .import()
        .unwrap();
    assert_eq!(g.node(g.inputs()[0]).outputs[0].shape, None);
}

#[test]
fn declared_shapes_are_used_for_outputs() {
    let g = xy(17)
        .node(node("Relu", "r", &["x"], &["t"]))
        .node(node("Neg", "n", &["t"], &["y"]))
        .value_info(value_info(
            "t",
            DataType::Float,
            Some(vec![D::P("batch"), D::N(4)]),
        ))
        .import()
        .unwrap();
    let s = text::print(&g).unwrap();
    assert!(s.contains("relu(%0) : f32[batch,4]"), "{s}");
    assert!(s.contains("neg(%1) : f32[*]"), "{s}");
}

#[test]
fn initializers_listed_as_inputs_are_constants() {
    let g = xy(11)
        .input(value_info("w", DataType::Float, Some(vec![D::N(4)])))
        .init(f32_tensor("w", &[4], &[1.0, 2.0, 3.0, 4.0]))
        .node(node("Add", "a", &["x", "w"], &["y"]))
        .import()
        .unwrap();
    assert_eq!(g.inputs().len(), 1);
    assert_eq!(op_names(&g), ["input", "const", "add"]);
}

#[test]
fn nodes_out_of_order_are_sorted() {
    let g = xy(17)
        .node(node("Neg", "second", &["t"], &["y"]))
        .node(node("Relu", "first", &["x"], &["t"]))
        .import()
        .unwrap();
    assert_eq!(op_names(&g), ["input", "relu", "neg"]);
}

#[test]
fn gelu_at_opset_20() {
    let g = xy(20)
        .node(with_attr(
            node("Gelu", "g", &["x"], &["y"]),
            attr_str("approximate", "tanh"),
        ))
        .import()
        .unwrap();
    assert_eq!(
        first_op(&g, "gelu"),
        &Op::Gelu {
            approx: ir::GeluApprox::Tanh
        }
    );
    assert!(matches!(
        xy(17).node(node("Gelu", "g", &["x"], &["y"])).import(),
        Err(frontend_onnx::ImportError::UnsupportedOp { .. })
    ));
}

#[test]
fn gemm_and_transpose_attributes() {
    let g = xy(17)
        .init(f32_tensor("w", &[2, 4], &[0.0; 8]))
        .node(with_attr(
            with_attr(
                node("Gemm", "gemm", &["x", "w"], &["t"]),
                attr_int("transB", 1),
            ),
            attr_float("alpha", 0.5),
        ))
        .node(node("Transpose", "tr", &["t"], &["y"]))
        .value_info(value_info(
            "t",
            DataType::Float,
            Some(vec![D::P("batch"), D::N(2)]),
        ))
        .import()
        .unwrap();
    assert_eq!(
        first_op(&g, "gemm"),
        &Op::Gemm {
            alpha: 0.5,
            beta: 1.0,
            trans_a: false,
            trans_b: true
        }
    );
    // No perm: reverse the axes of the (declared) rank-2 input.
    assert_eq!(
        first_op(&g, "transpose"),
        &Op::Transpose { perm: vec![1, 0] }
    );
}

#[test]
fn slice_with_steps_but_no_axes_gets_default_axes() {
    let g = xy(17)
        .init(i64_tensor("starts", &[2], &[0, 0]))
        .init(i64_tensor("ends", &[2], &[1, 2]))
        .init(i64_tensor("steps", &[2], &[1, 1]))
        .node(node(
            "Slice",
            "sl",
            &["x", "starts", "ends", "", "steps"],
            &["y"],
        ))
        .import()
        .unwrap();
    assert_eq!(const_of(&g, "sl/axes").to_vec::<i64>().unwrap(), [0, 1]);
    assert_eq!(count(&g, "slice"), 1);
}

#[test]
fn unique_constant_names() {
    // Two unnamed Constant nodes and an initializer would share names without renaming.
    let c = |out: &str, v: f32| {
        let mut n = with_attr(
            node("Constant", "", &[], &[out]),
            attr_float("value_float", v),
        );
        n.name = "k".into();
        n
    };
    let g = xy(17)
        .init(f32_tensor("k", &[], &[1.0]))
        .node(c("a", 2.0))
        .node(c("b", 3.0))
        .node(node("Sum", "s", &["x", "k", "a", "b"], &["y"]))
        .import()
        .unwrap();
    let mut names: Vec<String> = g
        .node_ids()
        .filter(|&id| g.node(id).op.name() == "const")
        .map(|id| g.node(id).name.clone())
        .collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 3);
}

#[test]
fn awkward_names_survive_the_text_form() {
    let c = |name: &str, out: &str, v: f32| {
        with_attr(
            node("Constant", name, &[], &[out]),
            attr_float("value_float", v),
        )
    };
    let g = Model::new(17)
        .input(value_info(
            "x \"quoted\"\n",
            DataType::Float,
            Some(vec![D::N(1)]),
        ))
        .node(c(" k ", "a", 1.0))
        .node(c("k\nline", "b", 2.0))
        .node(c("  ", "c", 3.0))
        .node(c("", "", 4.0))
        .node(node(
            "Sum",
            "s\r",
            &["x \"quoted\"\n", "a", "b", "c"],
            &["out put"],
        ))
        .output(value_info("out put", DataType::Float, None))
        .import()
        .unwrap();
    let printed = text::print(&g).unwrap();
    let mut consts = std::collections::HashMap::new();
    for id in g.node_ids() {
        if let Op::Const { value } = &g.node(id).op {
            assert!(consts
                .insert(g.node(id).name.clone(), value.clone())
                .is_none());
        }
    }
    let back = text::parse(&printed, Some(&consts)).unwrap();
    assert_eq!(text::print(&back).unwrap(), printed);
}

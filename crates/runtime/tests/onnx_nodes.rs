//! Single ONNX nodes imported and run, against exact (hand-computed) values: the ops of real
//! transformer exports that issue 8 lists. Each case runs twice: with its inputs as graph inputs
//! (the runtime kernels) and as initializers (what constant folding makes of them).

use bytes::Bytes;
use frontend_onnx::proto::{
    type_proto, AttributeProto, AttributeType, DataType, GraphProto, ModelProto, NodeProto,
    OperatorSetIdProto, TensorProto, TypeProto, ValueInfoProto,
};
use ir::DType;
use prost::Message;
use runtime::{CompileOptions, Model, Session, TensorValue};

fn onnx_type(d: DType) -> DataType {
    match d {
        DType::F32 => DataType::Float,
        DType::I64 => DataType::Int64,
        DType::I32 => DataType::Int32,
        DType::I8 => DataType::Int8,
        DType::U8 => DataType::Uint8,
        DType::I16 => DataType::Int16,
        DType::U16 => DataType::Uint16,
        DType::U32 => DataType::Uint32,
        DType::U64 => DataType::Uint64,
        DType::Bool => DataType::Bool,
        DType::BF16 => DataType::Bfloat16,
    }
}

fn tensor_proto(name: &str, v: &TensorValue) -> TensorProto {
    let t = v.to_ir();
    TensorProto {
        name: name.into(),
        dims: v.shape().iter().map(|&d| d as i64).collect(),
        data_type: onnx_type(v.dtype()) as i32,
        raw_data: t.bytes().cloned().unwrap_or_default(),
        ..Default::default()
    }
}

fn typed_input(name: &str, v: &TensorValue) -> ValueInfoProto {
    use frontend_onnx::proto::{tensor_shape_proto, TensorShapeProto};
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: onnx_type(v.dtype()) as i32,
                shape: Some(TensorShapeProto {
                    dim: v
                        .shape()
                        .iter()
                        .map(|&d| tensor_shape_proto::Dimension {
                            value: Some(tensor_shape_proto::dimension::Value::DimValue(d as i64)),
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

fn int_attr(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: AttributeType::Int as i32,
        i: v,
        ..Default::default()
    }
}

fn float_attr(name: &str, v: f32) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: AttributeType::Float as i32,
        f: v,
        ..Default::default()
    }
}

/// One node `op` at `opset` reading `inputs` (named `in0`, `in1`, …; an empty name is an absent
/// input) and producing `outputs`.
struct Case {
    op: &'static str,
    opset: i64,
    attrs: Vec<AttributeProto>,
    inputs: Vec<Option<TensorValue>>,
    /// Inputs that are initializers in both runs (ones encore needs when importing).
    constant: Vec<usize>,
    outputs: Vec<&'static str>,
    /// A change to the built model (e.g. a declared type the values cannot carry).
    patch: Option<fn(&mut ModelProto)>,
}

impl Case {
    fn new(op: &'static str, opset: i64, inputs: Vec<TensorValue>) -> Case {
        Case {
            op,
            opset,
            attrs: vec![],
            inputs: inputs.into_iter().map(Some).collect(),
            constant: vec![],
            outputs: vec!["y"],
            patch: None,
        }
    }

    fn constant(mut self, i: usize) -> Case {
        self.constant.push(i);
        self
    }

    fn attr(mut self, a: AttributeProto) -> Case {
        self.attrs.push(a);
        self
    }

    fn model(&self, as_initializers: bool) -> ModelProto {
        let mut g = GraphProto {
            name: "node".into(),
            ..Default::default()
        };
        let mut names = Vec::new();
        for (i, v) in self.inputs.iter().enumerate() {
            let Some(v) = v else {
                names.push(String::new());
                continue;
            };
            let name = format!("in{i}");
            if as_initializers || self.constant.contains(&i) {
                g.initializer.push(tensor_proto(&name, v));
            } else {
                g.input.push(typed_input(&name, v));
            }
            names.push(name);
        }
        g.node.push(NodeProto {
            op_type: self.op.into(),
            name: "n".into(),
            input: names,
            output: self.outputs.iter().map(|s| s.to_string()).collect(),
            attribute: self.attrs.clone(),
            ..Default::default()
        });
        for o in &self.outputs {
            g.output.push(ValueInfoProto {
                name: o.to_string(),
                ..Default::default()
            });
        }
        let mut m = ModelProto {
            ir_version: 9,
            opset_import: vec![OperatorSetIdProto {
                domain: String::new(),
                version: self.opset,
            }],
            graph: Some(g),
            ..Default::default()
        };
        if let Some(p) = self.patch {
            p(&mut m);
        }
        m
    }

    /// Imports and runs the node both ways; the two runs must agree exactly.
    fn run(&self) -> Result<Vec<TensorValue>, String> {
        let mut results = Vec::new();
        for as_init in [false, true] {
            let bytes = Bytes::from(self.model(as_init).encode_to_vec());
            let g = frontend_onnx::import_bytes(bytes, None).map_err(|e| e.to_string())?;
            let m = Model::from_graph(g).map_err(|e| e.to_string())?;
            let s = Session::new(&m, CompileOptions::default()).map_err(|e| e.to_string())?;
            let feeds: Vec<(String, TensorValue)> = if as_init {
                vec![]
            } else {
                self.inputs
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| !self.constant.contains(i))
                    .filter_map(|(i, v)| v.clone().map(|v| (format!("in{i}"), v)))
                    .collect()
            };
            let feeds: Vec<(&str, TensorValue)> =
                feeds.iter().map(|(n, v)| (n.as_str(), v.clone())).collect();
            let out = s.run(&feeds).map_err(|e| e.to_string())?;
            results.push(out.into_iter().map(|(_, v)| v).collect::<Vec<_>>());
        }
        let init = results.pop().unwrap();
        let fed = results.pop().unwrap();
        for (a, b) in fed.iter().zip(&init) {
            assert_eq!(a.shape(), b.shape(), "{}: fed and folded shapes", self.op);
            assert_eq!(a.dtype(), b.dtype(), "{}: fed and folded dtypes", self.op);
            let same = match (a.as_f32(), b.as_f32()) {
                (Some(x), Some(y)) => x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits()),
                _ => a.data() == b.data(),
            };
            assert!(same, "{}: fed {:?} but folded {:?}", self.op, a, b);
        }
        Ok(fed)
    }

    fn run1(&self) -> TensorValue {
        self.run()
            .unwrap_or_else(|e| panic!("{}: {e}", self.op))
            .remove(0)
    }
}

fn f32s(shape: &[usize], v: &[f32]) -> TensorValue {
    TensorValue::from_f32(shape.to_vec(), v.to_vec()).unwrap()
}

fn i64s(shape: &[usize], v: &[i64]) -> TensorValue {
    TensorValue::from_i64(shape.to_vec(), v.to_vec()).unwrap()
}

#[test]
fn round_is_half_to_even() {
    let x = f32s(&[8], &[0.5, 1.5, 2.5, -0.5, -1.5, 2.4, 2.6, -2.6]);
    for opset in [11, 22] {
        let y = Case::new("Round", opset, vec![x.clone()]).run1();
        assert_eq!(
            y.as_f32().unwrap(),
            [0.0, 2.0, 2.0, -0.0, -2.0, 2.0, 3.0, -3.0]
        );
        // -0.5 rounds to -0: the sign is kept, as in numpy.
        assert!(y.as_f32().unwrap()[3].is_sign_negative());
    }
}

#[test]
fn sin_and_cos_match_f64_within_an_ulp() {
    let xs = [0.0f32, 0.5, -1.0, std::f32::consts::FRAC_PI_2, 3.0, 100.0];
    let x = f32s(&[2, 3], &xs);
    for (op, f) in [("Sin", f64::sin as fn(f64) -> f64), ("Cos", f64::cos)] {
        for opset in [7, 22] {
            let opset = opset.max(11);
            let y = Case::new(op, opset, vec![x.clone()]).run1();
            assert_eq!(y.shape(), [2, 3]);
            for (&got, &xi) in y.as_f32().unwrap().iter().zip(&xs) {
                let want = f(xi as f64) as f32;
                let ulp = (want.abs() * f32::EPSILON).max(f32::MIN_POSITIVE);
                assert!((got - want).abs() <= ulp, "{op}({xi}) = {got}, want {want}");
            }
        }
    }
    assert_eq!(
        Case::new("Sin", 17, vec![f32s(&[1], &[0.0])])
            .run1()
            .as_f32()
            .unwrap(),
        [0.0]
    );
    // Integers are not a type of Sin: a typed error naming the node, not a panic.
    let e = Case::new("Cos", 17, vec![i64s(&[1], &[1])])
        .run()
        .unwrap_err();
    assert!(e.contains("`n`") && e.contains("i64"), "{e}");
}

/// DeBERTa-v2's log-bucketed relative positions take `Sign` of int64 offsets and `Ceil` of
/// their logarithm.
#[test]
fn sign_ceil_and_floor() {
    let x = f32s(
        &[7],
        &[-2.5, -0.0, 0.0, 3.0, f32::NAN, f32::NEG_INFINITY, 1e-30],
    );
    let y = Case::new("Sign", 13, vec![x]).run1();
    let y = y.as_f32().unwrap();
    assert_eq!(y[..4], [-1.0, 0.0, 0.0, 1.0]);
    // Both zeros give +0 (f32::signum would give 1 and -1), NaN stays NaN, as in numpy.
    assert!(y[1].is_sign_positive() && y[4].is_nan());
    assert_eq!(y[5..], [-1.0, 1.0]);
    let y = Case::new("Sign", 11, vec![i64s(&[4], &[-7, 0, 5, i64::MIN])]).run1();
    assert_eq!(y.to_i64_vec().unwrap(), [-1, 0, 1, -1]);

    let x = f32s(&[6], &[-1.5, -0.5, 0.5, 1.0, 2.7, -0.0]);
    let c = Case::new("Ceil", 13, vec![x.clone()]).run1();
    assert_eq!(c.as_f32().unwrap(), [-1.0, -0.0, 1.0, 1.0, 3.0, -0.0]);
    let f = Case::new("Floor", 13, vec![x]).run1();
    assert_eq!(f.as_f32().unwrap(), [-2.0, -1.0, 0.0, 1.0, 2.0, -0.0]);
    // Integers are not a type of Ceil: a typed error naming the node.
    let e = Case::new("Ceil", 13, vec![i64s(&[1], &[1])])
        .run()
        .unwrap_err();
    assert!(e.contains("`n`") && e.contains("i64"), "{e}");
}

/// An `If` branch: `nodes` computing `output`, reading values of the enclosing graph by name.
fn branch(name: &str, nodes: Vec<NodeProto>, output: &str) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: AttributeType::Graph as i32,
        g: Some(GraphProto {
            name: name.into(),
            node: nodes,
            output: vec![ValueInfoProto {
                name: output.into(),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// `If(cond)` with `x` as `in1`, a value of the graph that only the branches read.
fn if_case(cond: TensorValue, x: TensorValue, branches: &[&AttributeProto]) -> Case {
    fn cond_only(m: &mut ModelProto) {
        m.graph.as_mut().unwrap().node[0].input.truncate(1);
    }
    let mut c = Case::new("If", 17, vec![cond, x]);
    c.patch = Some(cond_only);
    branches.iter().fold(c, |c, &b| c.attr(b.clone()))
}

fn node(op: &str, inputs: &[&str], output: &str, attrs: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        op_type: op.into(),
        name: format!("{op}_{output}"),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        attribute: attrs,
        ..Default::default()
    }
}

/// `If` (DeBERTa-v2's TorchScript export has one per layer): the chosen branch's value, whole,
/// when the branches differ in shape too; fed (both branches run, the output selected) and as
/// initializers (the condition folds and the other branch is dropped) alike.
#[test]
fn if_gives_the_chosen_branch() {
    let then_b = branch(
        "then_branch",
        vec![node("Add", &["in1", "in1"], "t", vec![])],
        "t",
    );
    let else_b = branch(
        "else_branch",
        vec![node(
            "Concat",
            &["in1", "in1"],
            "e",
            vec![int_attr("axis", 0)],
        )],
        "e",
    );
    let x = f32s(&[2], &[1.0, -2.0]);
    for (c, want) in [(true, vec![2.0, -4.0]), (false, vec![1.0, -2.0, 1.0, -2.0])] {
        let cond = TensorValue::from_bool(vec![1], vec![c]).unwrap();
        let y = if_case(cond, x.clone(), &[&then_b, &else_b]).run1();
        assert_eq!(y.shape(), [want.len()], "cond {c}");
        assert_eq!(y.as_f32().unwrap(), want, "cond {c}");
    }
    let cond = TensorValue::from_bool(vec![], vec![true]).unwrap();
    // A branch's unsupported op is refused by its own name; a condition that is not bool, or
    // that holds more than one element, is a typed error.
    let bad_then = branch(
        "then_branch",
        vec![node("Hardmax", &["in1"], "t", vec![])],
        "t",
    );
    let e = if_case(cond.clone(), x.clone(), &[&bad_then, &else_b])
        .run()
        .unwrap_err();
    assert!(e.contains("`Hardmax_t`") && e.contains("`Hardmax`"), "{e}");
    let e = if_case(f32s(&[1], &[1.0]), x.clone(), &[&then_b, &else_b])
        .run()
        .unwrap_err();
    assert!(e.contains("`n`") && e.contains("f32"), "{e}");
    let two = TensorValue::from_bool(vec![2], vec![true, false]).unwrap();
    let e = if_case(two, x.clone(), &[&then_b, &else_b])
        .run()
        .unwrap_err();
    assert!(e.contains("one element"), "{e}");
    // A missing branch is a typed error naming the attribute.
    let e = if_case(cond, x, &[&else_b]).run().unwrap_err();
    assert!(e.contains("then_branch"), "{e}");
}

#[test]
fn size_is_the_element_count() {
    let y = Case::new("Size", 13, vec![f32s(&[2, 3, 4], &[0.0; 24])]).run1();
    assert_eq!(y.shape(), [] as [usize; 0]);
    assert_eq!(y.as_i64().unwrap(), [24]);
    let y = Case::new("Size", 23, vec![i64s(&[0, 5], &[])]).run1();
    assert_eq!(y.as_i64().unwrap(), [0]);
    let y = Case::new("Size", 19, vec![f32s(&[], &[7.0])]).run1();
    assert_eq!(y.as_i64().unwrap(), [1]);
}

#[test]
fn reduce_prod() {
    let x = f32s(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let axes = i64s(&[1], &[1]);
    let y = Case::new("ReduceProd", 18, vec![x.clone(), axes.clone()])
        .attr(int_attr("keepdims", 0))
        .run1();
    assert_eq!(y.shape(), [2]);
    assert_eq!(y.as_f32().unwrap(), [6.0, 120.0]);
    let y = Case::new("ReduceProd", 13, vec![x])
        .attr(AttributeProto {
            name: "axes".into(),
            r#type: AttributeType::Ints as i32,
            ints: vec![0],
            ..Default::default()
        })
        .run1();
    assert_eq!(y.shape(), [1, 3]);
    assert_eq!(y.as_f32().unwrap(), [4.0, 10.0, 18.0]);
    let y = Case::new("ReduceProd", 18, vec![i64s(&[3], &[2, -3, 7])]).run1();
    assert_eq!(y.as_i64().unwrap(), [-42]);
}

#[test]
fn pow_with_mixed_dtypes() {
    let base = f32s(&[3], &[2.0, -3.0, 0.5]);
    // Float base, integer exponent: the exponent is cast to f32.
    for e in [
        i64s(&[3], &[3, 2, -1]),
        TensorValue::from_i32(vec![3], vec![3, 2, -1]).unwrap(),
    ] {
        let y = Case::new("Pow", 15, vec![base.clone(), e]).run1();
        assert_eq!(y.dtype(), DType::F32);
        assert_eq!(y.as_f32().unwrap(), [8.0, 9.0, 2.0]);
    }
    // Integer base, float exponent: computed in float, truncated to the base's type.
    let y = Case::new(
        "Pow",
        15,
        vec![i64s(&[3], &[3, 4, 2]), f32s(&[3], &[1.5, 0.5, 3.0])],
    )
    .run1();
    assert_eq!(y.dtype(), DType::I64);
    assert_eq!(y.as_i64().unwrap(), [5, 2, 8]);
    // Two integer types: the exponent takes the base's.
    let y = Case::new(
        "Pow",
        15,
        vec![
            TensorValue::from_i32(vec![2], vec![3, -2]).unwrap(),
            i64s(&[1], &[3]),
        ],
    )
    .run1();
    assert_eq!(y.dtype(), DType::I32);
    assert_eq!(y.as_i32().unwrap(), [27, -8]);
    // Bool is not a numeric type.
    let e = Case::new(
        "Pow",
        15,
        vec![base, TensorValue::from_bool(vec![1], vec![true]).unwrap()],
    )
    .run()
    .unwrap_err();
    assert!(e.contains("`n`") && e.contains("bool"), "{e}");
}

#[test]
fn gather_nd_examples_of_the_onnx_spec() {
    // Whole elements.
    let data = TensorValue::from_i32(vec![2, 2], vec![0, 1, 2, 3]).unwrap();
    let y = Case::new("GatherND", 12, vec![data, i64s(&[2, 2], &[0, 0, 1, 1])]).run1();
    assert_eq!(y.shape(), [2]);
    assert_eq!(y.as_i32().unwrap(), [0, 3]);
    // Rows, from a rank-3 index.
    let data = f32s(&[2, 2, 2], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
    let y = Case::new(
        "GatherND",
        13,
        vec![data.clone(), i64s(&[2, 1, 2], &[0, 1, 1, 0])],
    )
    .run1();
    assert_eq!(y.shape(), [2, 1, 2]);
    assert_eq!(y.as_f32().unwrap(), [2.0, 3.0, 4.0, 5.0]);
    // One batch dim: each batch picks its own row; a negative index counts from the end.
    let y = Case::new("GatherND", 13, vec![data.clone(), i64s(&[2, 1], &[-1, 0])])
        .attr(int_attr("batch_dims", 1))
        .run1();
    assert_eq!(y.shape(), [2, 2]);
    assert_eq!(y.as_f32().unwrap(), [2.0, 3.0, 4.0, 5.0]);
    // An empty index row picks the whole slice.
    let y = Case::new("GatherND", 13, vec![data, i64s(&[2, 0], &[])])
        .attr(int_attr("batch_dims", 1))
        .run1();
    assert_eq!(y.shape(), [2, 2, 2]);
    assert_eq!(
        y.as_f32().unwrap(),
        [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    );
}

/// The pooling a sentence-embedding export does with GatherND: one token's hidden state per
/// sequence, `hidden[b, pos[b]]`.
#[test]
fn gather_nd_picks_one_token_per_sequence() {
    let (b, s, h) = (3usize, 4usize, 5usize);
    let hidden: Vec<f32> = (0..b * s * h).map(|i| i as f32 * 0.5).collect();
    let pos = [3i64, 0, 2];
    let idx: Vec<i64> = pos
        .iter()
        .enumerate()
        .flat_map(|(i, &p)| [i as i64, p])
        .collect();
    let y = Case::new(
        "GatherND",
        17,
        vec![f32s(&[b, s, h], &hidden), i64s(&[b, 2], &idx)],
    )
    .run1();
    assert_eq!(y.shape(), [b, h]);
    let want: Vec<f32> = (0..b)
        .flat_map(|i| {
            let p = pos[i] as usize;
            hidden[(i * s + p) * h..(i * s + p + 1) * h].to_vec()
        })
        .collect();
    assert_eq!(y.as_f32().unwrap(), want);
}

#[test]
fn gather_nd_bad_input_is_a_typed_error() {
    let data = f32s(&[2, 2], &[0.0, 1.0, 2.0, 3.0]);
    // An index out of range, at run time: the node and the index are named.
    let e = Case::new("GatherND", 13, vec![data.clone(), i64s(&[1, 2], &[0, 2])])
        .run()
        .unwrap_err();
    assert!(e.contains("`n`") && e.contains("index 2"), "{e}");
    // Rows longer than the data's rank.
    let e = Case::new(
        "GatherND",
        13,
        vec![data.clone(), i64s(&[1, 3], &[0, 0, 0])],
    )
    .run()
    .unwrap_err();
    assert!(e.contains("gather_nd"), "{e}");
    // Batch dims the indices do not share.
    let e = Case::new(
        "GatherND",
        13,
        vec![data.clone(), i64s(&[3, 1], &[0, 0, 0])],
    )
    .attr(int_attr("batch_dims", 1))
    .run()
    .unwrap_err();
    assert!(e.contains("gather_nd"), "{e}");
    let e = Case::new("GatherND", 13, vec![data.clone(), i64s(&[1, 1], &[0])])
        .attr(int_attr("batch_dims", -1))
        .run()
        .unwrap_err();
    assert!(e.contains("batch_dims") && e.contains("`n`"), "{e}");
    // Indices must be int64 in ONNX.
    let e = Case::new(
        "GatherND",
        13,
        vec![data, TensorValue::from_i32(vec![1, 2], vec![0, 0]).unwrap()],
    )
    .run()
    .unwrap_err();
    assert!(e.contains("i32") && e.contains("`n`"), "{e}");
}

/// LayerNormalization's three outputs, against values computed in f64 by hand's formula:
/// `mean`, `inv_std = 1/sqrt(mean((x-mean)²) + eps)`, `y = (x-mean)·inv_std·gamma + beta`.
#[test]
fn layer_norm_with_mean_and_inv_std_dev() {
    let xs = [
        1.0f32, 2.0, 3.0, 2.0, 4.0, 9.0, -1.0, 0.5, 0.25, 7.0, -3.0, 2.0,
    ];
    let x = f32s(&[2, 2, 3], &xs);
    let eps = 1e-5f32;
    for (axis, group) in [(-1i64, 3usize), (2, 3), (1, 6), (-2, 6)] {
        let (gamma, beta): (Vec<f32>, Vec<f32>) = (
            (0..group).map(|i| 0.5 + i as f32).collect(),
            (0..group).map(|i| i as f32 * -0.25).collect(),
        );
        let gshape = if group == 3 { vec![3] } else { vec![2, 3] };
        let mut case = Case::new(
            "LayerNormalization",
            17,
            vec![x.clone(), f32s(&gshape, &gamma), f32s(&gshape, &beta)],
        )
        .attr(int_attr("axis", axis))
        .attr(AttributeProto {
            name: "epsilon".into(),
            r#type: AttributeType::Float as i32,
            f: eps,
            ..Default::default()
        });
        case.outputs = vec!["y", "mean", "inv_std"];
        let out = case.run().unwrap_or_else(|e| panic!("axis {axis}: {e}"));
        let stat_shape = if group == 3 {
            vec![2, 2, 1]
        } else {
            vec![2, 1, 1]
        };
        assert_eq!(out[1].shape(), stat_shape, "axis {axis}");
        assert_eq!(out[2].shape(), stat_shape, "axis {axis}");
        assert_eq!(out[0].shape(), [2, 2, 3], "axis {axis}");
        let (y, mean, inv) = (
            out[0].as_f32().unwrap(),
            out[1].as_f32().unwrap(),
            out[2].as_f32().unwrap(),
        );
        for (gi, chunk) in xs.chunks(group).enumerate() {
            let m = chunk.iter().map(|&v| v as f64).sum::<f64>() / group as f64;
            let var = chunk.iter().map(|&v| (v as f64 - m).powi(2)).sum::<f64>() / group as f64;
            let is = 1.0 / (var + eps as f64).sqrt();
            let close =
                |got: f32, want: f64| (got as f64 - want).abs() <= 2e-6 * want.abs().max(1.0);
            assert!(close(mean[gi], m), "axis {axis}: mean {} vs {m}", mean[gi]);
            assert!(
                close(inv[gi], is),
                "axis {axis}: inv_std {} vs {is}",
                inv[gi]
            );
            for (j, &v) in chunk.iter().enumerate() {
                let want = (v as f64 - m) * is * gamma[j] as f64 + beta[j] as f64;
                let got = y[gi * group + j];
                assert!(close(got, want), "axis {axis}: y {got} vs {want}");
            }
        }
    }
}

fn mode(m: &str) -> AttributeProto {
    AttributeProto {
        name: "mode".into(),
        r#type: AttributeType::String as i32,
        s: Bytes::from(m.to_string()),
        ..Default::default()
    }
}

/// The modes on the ONNX spec's 3×2 example (expected values from `numpy.pad`).
#[test]
fn pad_modes() {
    let x = f32s(&[3, 2], &[1.0, 1.2, 2.3, 3.4, 4.5, 5.7]);
    let left2 = i64s(&[4], &[0, 2, 0, 0]);
    let y = Case::new(
        "Pad",
        11,
        vec![x.clone(), left2.clone(), TensorValue::scalar(0.5f32)],
    )
    .run1();
    assert_eq!(y.shape(), [3, 4]);
    assert_eq!(
        y.as_f32().unwrap(),
        [0.5, 0.5, 1.0, 1.2, 0.5, 0.5, 2.3, 3.4, 0.5, 0.5, 4.5, 5.7]
    );
    // No value: zeros.
    let y = Case::new("Pad", 13, vec![x.clone(), left2.clone()]).run1();
    assert_eq!(&y.as_f32().unwrap()[..4], [0.0, 0.0, 1.0, 1.2]);
    let y = Case::new("Pad", 13, vec![x.clone(), left2.clone()])
        .attr(mode("reflect"))
        .run1();
    assert_eq!(
        y.as_f32().unwrap(),
        [1.0, 1.2, 1.0, 1.2, 2.3, 3.4, 2.3, 3.4, 4.5, 5.7, 4.5, 5.7]
    );
    let y = Case::new("Pad", 13, vec![x.clone(), left2])
        .attr(mode("edge"))
        .run1();
    assert_eq!(
        y.as_f32().unwrap(),
        [1.0, 1.0, 1.0, 1.2, 2.3, 2.3, 2.3, 3.4, 4.5, 4.5, 4.5, 5.7]
    );
    let y = Case::new("Pad", 19, vec![x.clone(), i64s(&[4], &[2, 1, 1, 1])])
        .attr(mode("wrap"))
        .run1();
    assert_eq!(y.shape(), [6, 4]);
    assert_eq!(
        y.as_f32().unwrap(),
        [
            3.4, 2.3, 3.4, 2.3, 5.7, 4.5, 5.7, 4.5, 1.2, 1.0, 1.2, 1.0, 3.4, 2.3, 3.4, 2.3, 5.7,
            4.5, 5.7, 4.5, 1.2, 1.0, 1.2, 1.0
        ]
    );
    // Reflection further than the axis is long keeps mirroring, as numpy does.
    let y = Case::new("Pad", 13, vec![i64s(&[3], &[1, 2, 3]), i64s(&[2], &[4, 3])])
        .attr(mode("reflect"))
        .run1();
    assert_eq!(y.as_i64().unwrap(), [1, 2, 3, 2, 1, 2, 3, 2, 1, 2]);
}

/// Opset 18's axes input (negative axes too), negative pads that crop, integer data.
#[test]
fn pad_axes_and_cropping() {
    let x = i64s(&[3, 4], &(0..12).collect::<Vec<_>>());
    // Crop one row at the top and a column at the right, add a row of -7 at the bottom.
    let y = Case::new(
        "Pad",
        18,
        vec![
            x.clone(),
            i64s(&[4], &[-1, 0, 1, -1]),
            TensorValue::scalar(-7i64),
        ],
    )
    .run1();
    assert_eq!(y.shape(), [3, 3]);
    assert_eq!(y.as_i64().unwrap(), [4, 5, 6, 8, 9, 10, -7, -7, -7]);
    // Only the last axis, named -1; the absent value is 0.
    let mut case = Case::new("Pad", 18, vec![x.clone(), i64s(&[2], &[1, 0])]);
    case.inputs.push(None);
    case.inputs.push(Some(i64s(&[1], &[-1])));
    let y = case.run1();
    assert_eq!(y.shape(), [3, 5]);
    assert_eq!(
        y.as_i64().unwrap(),
        [0, 0, 1, 2, 3, 0, 4, 5, 6, 7, 0, 8, 9, 10, 11]
    );
}

#[test]
fn pad_bad_input_is_a_typed_error() {
    let x = f32s(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    // Wrap came at opset 19.
    let e = Case::new("Pad", 18, vec![x.clone(), i64s(&[4], &[0, 1, 0, 1])])
        .attr(mode("wrap"))
        .run()
        .unwrap_err();
    assert!(e.contains("mode") && e.contains("opset 18"), "{e}");
    // Three pads for two axes.
    let e = Case::new("Pad", 13, vec![x.clone(), i64s(&[3], &[0, 1, 0])])
        .run()
        .unwrap_err();
    assert!(e.contains("pad"), "{e}");
    // Cropping below nothing.
    let e = Case::new("Pad", 13, vec![x.clone(), i64s(&[4], &[0, -2, 0, -1])])
        .run()
        .unwrap_err();
    assert!(e.contains("pad"), "{e}");
    // A value of another dtype.
    let e = Case::new(
        "Pad",
        13,
        vec![x, i64s(&[4], &[0; 4]), TensorValue::scalar(1i64)],
    )
    .run()
    .unwrap_err();
    assert!(e.contains("`n`") && e.contains("i64"), "{e}");
}

/// Arithmetic on 8-bit integers wraps, as onnxruntime's; Div truncates; Max and Min compare.
#[test]
fn eight_bit_integer_arithmetic() {
    let a = TensorValue::from_i8(vec![4], vec![100, -128, 7, -7]).unwrap();
    let b = TensorValue::from_i8(vec![4], vec![100, 1, 2, 2]).unwrap();
    for (op, want) in [
        ("Add", [-56i8, -127, 9, -5]),
        ("Sub", [0, 127, 5, -9]),
        ("Mul", [16, -128, 14, -14]),
        ("Div", [1, -128, 3, -3]),
        ("Max", [100, 1, 7, 2]),
        ("Min", [100, -128, 2, -7]),
    ] {
        let y = Case::new(op, 14, vec![a.clone(), b.clone()]).run1();
        assert_eq!(y.as_i8().unwrap(), want, "{op} i8");
    }
    let a = TensorValue::from_u8(vec![3], vec![200, 3, 255]).unwrap();
    let b = TensorValue::from_u8(vec![3], vec![100, 2, 1]).unwrap();
    for (op, want) in [
        ("Add", [44u8, 5, 0]),
        ("Sub", [100, 1, 254]),
        ("Mul", [32, 6, 255]),
        ("Div", [2, 1, 255]),
        ("Max", [200, 3, 255]),
        ("Min", [100, 2, 1]),
    ] {
        let y = Case::new(op, 14, vec![a.clone(), b.clone()]).run1();
        assert_eq!(y.as_u8().unwrap(), want, "{op} u8");
    }
    // Division by zero is an error naming the node, not a panic.
    let zero = TensorValue::from_u8(vec![1], vec![0]).unwrap();
    let e = Case::new("Div", 14, vec![a, zero]).run().unwrap_err();
    assert!(e.contains("`n`") && e.contains("zero"), "{e}");
    // And/Or are not defined on integers.
    let e = Case::new("And", 14, vec![b.clone(), b]).run().unwrap_err();
    assert!(e.contains("`n`"), "{e}");
}

/// Opset 18's axes input when it is a graph input (read at run time) and when it is an
/// initializer (an attribute at import): the same values.
#[test]
fn reduce_axes_as_a_runtime_input() {
    let x = f32s(&[2, 3, 2], &(0..12).map(|v| v as f32).collect::<Vec<_>>());
    /// Op, axes, keepdims, output shape, output values.
    type ReduceCase = (
        &'static str,
        &'static [i64],
        i64,
        &'static [usize],
        &'static [f32],
    );
    let cases: [ReduceCase; 6] = [
        ("ReduceMean", &[1], 1, &[2, 1, 2], &[2.0, 3.0, 8.0, 9.0]),
        ("ReduceMean", &[-1, 0], 0, &[3], &[3.5, 5.5, 7.5]),
        ("ReduceSum", &[], 0, &[], &[66.0]),
        (
            "ReduceMax",
            &[2],
            0,
            &[2, 3],
            &[1.0, 3.0, 5.0, 7.0, 9.0, 11.0],
        ),
        ("ReduceMin", &[0, 2], 1, &[1, 3, 1], &[0.0, 2.0, 4.0]),
        (
            "ReduceProd",
            &[0],
            0,
            &[3, 2],
            &[0.0, 7.0, 16.0, 27.0, 40.0, 55.0],
        ),
    ];
    for (op, axes, keep, shape, want) in cases {
        let y = Case::new(op, 18, vec![x.clone(), i64s(&[axes.len()], axes)])
            .attr(int_attr("keepdims", keep))
            .run1();
        assert_eq!(y.shape(), shape, "{op} {axes:?}");
        assert_eq!(y.as_f32().unwrap(), want, "{op} {axes:?}");
    }
    // noop_with_empty_axes needs the axes at import: a graph input of unknown length is
    // refused by name...
    let noop = || {
        Case::new("ReduceSum", 18, vec![x.clone(), i64s(&[0], &[])])
            .attr(int_attr("noop_with_empty_axes", 1))
    };
    let mut unknown_length = noop();
    unknown_length.patch = Some(|m| {
        use frontend_onnx::proto::tensor_shape_proto::dimension::Value;
        let g = m.graph.as_mut().unwrap();
        for vi in g.input.iter_mut().filter(|vi| vi.name == "in1") {
            if let Some(type_proto::Value::TensorType(t)) =
                vi.r#type.as_mut().and_then(|t| t.value.as_mut())
            {
                t.shape.as_mut().unwrap().dim[0].value = Some(Value::DimParam("k".into()));
            }
        }
    });
    let e = unknown_length.run().unwrap_err();
    assert!(e.contains("`n`") && e.contains("in1"), "{e}");
    // ...while a constant empty list, or an input declared with length 0 (it can hold nothing
    // else), passes the input through.
    let y = noop().constant(1).run1();
    assert_eq!(y.shape(), [2, 3, 2]);
    assert_eq!(y, x);
    let y = noop().run1();
    assert_eq!(y, x);
    // Without the flag, a declared-empty axes input reduces every axis.
    let y = Case::new("ReduceSum", 18, vec![x.clone(), i64s(&[0], &[])])
        .attr(int_attr("keepdims", 0))
        .run1();
    assert_eq!(y.shape(), [] as [usize; 0]);
    // Axes out of range at run time: a typed error.
    let e = Case::new("ReduceSum", 18, vec![x, i64s(&[1], &[3])])
        .run()
        .unwrap_err();
    assert!(e.contains("`n`") && e.contains("3"), "{e}");
}

/// A Cast to FLOAT16 or BFLOAT16 rounds to that type's precision (and float16's range) in f32,
/// as the narrow values would be; from integers too.
#[test]
fn cast_to_half_precision_rounds() {
    let xs = [0.1f32, 1.000_732_4, 70000.0, -3.0e-8, 2049.0, 1.0e30];
    let x = f32s(&[6], &xs);
    for (to, f) in [
        (
            DataType::Float16,
            (|v| half::f16::from_f32(v).to_f32()) as fn(f32) -> f32,
        ),
        (DataType::Bfloat16, |v| half::bf16::from_f32(v).to_f32()),
    ] {
        let y = Case::new("Cast", 19, vec![x.clone()])
            .attr(int_attr("to", to as i64))
            .run1();
        assert_eq!(y.dtype(), DType::F32);
        let want: Vec<f32> = xs.iter().map(|&v| f(v)).collect();
        assert_eq!(y.as_f32().unwrap(), want, "{to:?}");
    }
    // Hand-checked float16 values: 0.1 is 0.0999755859375, 70000 overflows, 2049 is even-rounded.
    let y = Case::new("Cast", 13, vec![x])
        .attr(int_attr("to", DataType::Float16 as i64))
        .run1();
    let y = y.as_f32().unwrap();
    assert_eq!(y[0], 0.099_975_586);
    assert_eq!(y[2], f32::INFINITY);
    assert_eq!(y[4], 2048.0);
    let y = Case::new("Cast", 13, vec![i64s(&[2], &[2049, -3])])
        .attr(int_attr("to", DataType::Float16 as i64))
        .run1();
    assert_eq!(y.as_f32().unwrap(), [2048.0, -3.0]);
    // To DOUBLE: f32, unrounded.
    let y = Case::new("Cast", 13, vec![f32s(&[1], &[0.1])])
        .attr(int_attr("to", DataType::Double as i64))
        .run1();
    assert_eq!(y.as_f32().unwrap(), [0.1]);
}

/// LogSoftmax against f64, on one axis (opset 13) and on opset 11's 2-D coercion (axis 0 of a
/// 2-D input: all elements together); large logits stay finite.
#[test]
fn log_softmax() {
    let xs = [1.0f32, 2.0, 3.0, -1.0, 0.0, 1000.0];
    let x = f32s(&[2, 3], &xs);
    let lse = |v: &[f32]| {
        let m = v.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
        m + v.iter().map(|&b| (b as f64 - m).exp()).sum::<f64>().ln()
    };
    let close = |got: &[f32], want: &[f64]| {
        got.len() == want.len()
            && got
                .iter()
                .zip(want)
                .all(|(&g, &w)| (g as f64 - w).abs() <= 1e-5 * w.abs().max(1.0))
    };
    for (opset, axis) in [(13, -1), (13, 1), (11, 1), (11, -1)] {
        let y = Case::new("LogSoftmax", opset, vec![x.clone()])
            .attr(int_attr("axis", axis))
            .run1();
        let want: Vec<f64> = xs
            .chunks(3)
            .flat_map(|r| {
                let l = lse(r);
                r.iter().map(move |&v| v as f64 - l)
            })
            .collect();
        assert_eq!(y.shape(), [2, 3]);
        assert!(
            close(y.as_f32().unwrap(), &want),
            "opset {opset} axis {axis}: {y:?}"
        );
    }
    // Opset 13, axis 0: down the columns.
    let y = Case::new("LogSoftmax", 13, vec![x.clone()])
        .attr(int_attr("axis", 0))
        .run1();
    let want: Vec<f64> = (0..6)
        .map(|i| xs[i] as f64 - lse(&[xs[i % 3], xs[i % 3 + 3]]))
        .collect();
    assert!(close(y.as_f32().unwrap(), &want), "{y:?}");
    // Opset 11, axis 0: the whole input is one row.
    let y = Case::new("LogSoftmax", 11, vec![x])
        .attr(int_attr("axis", 0))
        .run1();
    let l = lse(&xs);
    let want: Vec<f64> = xs.iter().map(|&v| v as f64 - l).collect();
    assert!(close(y.as_f32().unwrap(), &want), "{y:?}");
    // Integers are not a type of LogSoftmax.
    let e = Case::new("LogSoftmax", 13, vec![i64s(&[2], &[1, 2])])
        .run()
        .unwrap_err();
    assert!(e.contains("`n`"), "{e}");
}

/// Mod on the ONNX spec's mixed-sign example: `fmod=0` takes the divisor's sign (Python's `%`),
/// `fmod=1` the dividend's (C's fmod); floats need `fmod=1`.
#[test]
fn mod_both_forms() {
    let (a, b) = ([-4i64, 7, 5, 4, -7, 8], [2i64, -3, 8, -2, 3, 5]);
    let y = Case::new("Mod", 13, vec![i64s(&[6], &a), i64s(&[6], &b)]).run1();
    assert_eq!(y.as_i64().unwrap(), [0, -2, 5, 0, 2, 3]);
    let y = Case::new("Mod", 13, vec![i64s(&[6], &a), i64s(&[6], &b)])
        .attr(int_attr("fmod", 1))
        .run1();
    assert_eq!(y.as_i64().unwrap(), [0, 1, 5, 0, -1, 3]);
    let a8: Vec<i8> = a.iter().map(|&v| v as i8).collect();
    let b8: Vec<i8> = b.iter().map(|&v| v as i8).collect();
    let y = Case::new(
        "Mod",
        13,
        vec![
            TensorValue::from_i8(vec![6], a8).unwrap(),
            TensorValue::from_i8(vec![6], b8).unwrap(),
        ],
    )
    .run1();
    assert_eq!(y.as_i8().unwrap(), [0, -2, 5, 0, 2, 3]);
    let y = Case::new(
        "Mod",
        13,
        vec![
            TensorValue::from_u8(vec![3], vec![4, 7, 5]).unwrap(),
            TensorValue::from_u8(vec![1], vec![3]).unwrap(),
        ],
    )
    .run1();
    assert_eq!(y.as_u8().unwrap(), [1, 1, 2]);
    let (fa, fb) = (
        [-4.3f32, 7.2, 5.0, 4.3, -7.2, 8.0],
        [2.1f32, -3.4, 8.0, -2.1, 3.4, 5.0],
    );
    let y = Case::new("Mod", 13, vec![f32s(&[6], &fa), f32s(&[6], &fb)])
        .attr(int_attr("fmod", 1))
        .run1();
    for ((&g, &x), &d) in y.as_f32().unwrap().iter().zip(&fa).zip(&fb) {
        // f64 fmod of the same f32 values is exact, so f32's must equal it rounded.
        assert_eq!(g, ((x as f64) % (d as f64)) as f32, "fmod({x}, {d})");
    }
    assert_eq!(&y.as_f32().unwrap()[2..4], [5.0, 0.100_000_38]);
    // Floats without fmod, and a zero divisor: typed errors naming the node.
    let e = Case::new("Mod", 13, vec![f32s(&[1], &[1.0]), f32s(&[1], &[2.0])])
        .run()
        .unwrap_err();
    assert!(e.contains("`n`") && e.contains("fmod"), "{e}");
    let e = Case::new("Mod", 13, vec![i64s(&[1], &[1]), i64s(&[1], &[0])])
        .run()
        .unwrap_err();
    assert!(e.contains("`n`") && e.contains("zero"), "{e}");
}

/// CastLike casts to its second input's type; a `like` that the model declares FLOAT16 (or an
/// initializer of that type) makes it round to float16, though encore holds it as f32.
#[test]
fn cast_like() {
    let x = f32s(&[3], &[0.1, -2.7, 70000.0]);
    let y = Case::new("CastLike", 15, vec![x.clone(), i64s(&[1], &[0])]).run1();
    assert_eq!(y.as_i64().unwrap(), [0, -2, 70000]);
    let y = Case::new("CastLike", 15, vec![i64s(&[2], &[3, -4]), f32s(&[0], &[])]).run1();
    assert_eq!(y.as_f32().unwrap(), [3.0, -4.0]);
    // `like` declared FLOAT16 (a graph input; fed as f32), and a FLOAT16 initializer.
    let mut case = Case::new("CastLike", 19, vec![x.clone(), f32s(&[1], &[0.0])]);
    case.patch = Some(|m| {
        let g = m.graph.as_mut().unwrap();
        for vi in g.input.iter_mut().filter(|vi| vi.name == "in1") {
            if let Some(type_proto::Value::TensorType(t)) =
                vi.r#type.as_mut().and_then(|t| t.value.as_mut())
            {
                t.elem_type = DataType::Float16 as i32;
            }
        }
        for t in g.initializer.iter_mut().filter(|t| t.name == "in1") {
            t.data_type = DataType::Float16 as i32;
            t.raw_data = Bytes::from(half::f16::from_f32(0.0).to_le_bytes().to_vec());
        }
    });
    let y = case.run1();
    assert_eq!(y.dtype(), DType::F32);
    assert_eq!(
        y.as_f32().unwrap(),
        [0.099_975_586, -2.699_218_8, f32::INFINITY]
    );
}

/// Unsqueeze and Squeeze with axes fed at run time (and as initializers: the attribute form).
#[test]
fn squeeze_and_unsqueeze_axes_as_a_runtime_input() {
    let x = f32s(&[3, 1, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let y = Case::new("Unsqueeze", 13, vec![x.clone(), i64s(&[2], &[0, -1])]).run1();
    assert_eq!(y.shape(), [1, 3, 1, 2, 1]);
    assert_eq!(y.as_f32().unwrap(), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let y = Case::new("Squeeze", 13, vec![x.clone(), i64s(&[1], &[-2])]).run1();
    assert_eq!(y.shape(), [3, 2]);
    let y = Case::new(
        "Squeeze",
        21,
        vec![f32s(&[1, 2, 1], &[7.0, 8.0]), i64s(&[2], &[0, 2])],
    )
    .run1();
    assert_eq!(y.shape(), [2]);
    // Squeezing an axis that is not 1: a typed error naming the node.
    let e = Case::new("Squeeze", 13, vec![x.clone(), i64s(&[1], &[0])])
        .run()
        .unwrap_err();
    assert!(e.contains("`n`"), "{e}");
    let e = Case::new("Unsqueeze", 13, vec![x, i64s(&[1], &[9])])
        .run()
        .unwrap_err();
    assert!(e.contains("`n`"), "{e}");
}

/// Trilu on a 3×4 matrix for both triangles and several diagonals, batched, and bad inputs.
#[test]
fn trilu() {
    let x = i64s(&[3, 4], &(1..=12).collect::<Vec<_>>());
    let run = |upper: i64, k: Option<i64>| {
        let mut ins = vec![x.clone()];
        ins.extend(k.map(|k| i64s(&[], &[k])));
        Case::new("Trilu", 14, ins)
            .attr(int_attr("upper", upper))
            .run1()
            .as_i64()
            .unwrap()
            .to_vec()
    };
    assert_eq!(run(1, None), [1, 2, 3, 4, 0, 6, 7, 8, 0, 0, 11, 12]);
    assert_eq!(run(0, None), [1, 0, 0, 0, 5, 6, 0, 0, 9, 10, 11, 0]);
    assert_eq!(run(1, Some(1)), [0, 2, 3, 4, 0, 0, 7, 8, 0, 0, 0, 12]);
    assert_eq!(run(0, Some(-1)), [0, 0, 0, 0, 5, 0, 0, 0, 9, 10, 0, 0]);
    assert_eq!(run(1, Some(-5)), (1..=12).collect::<Vec<_>>());
    let y = Case::new(
        "Trilu",
        14,
        vec![f32s(&[2, 2, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])],
    )
    .attr(int_attr("upper", 0))
    .run1();
    assert_eq!(
        y.as_f32().unwrap(),
        [1.0, 0.0, 3.0, 4.0, 5.0, 0.0, 7.0, 8.0]
    );
    let e = Case::new("Trilu", 14, vec![x.clone(), i64s(&[2], &[0, 1])])
        .run()
        .unwrap_err();
    assert!(e.contains("`n`") && e.contains("k"), "{e}");
    let e = Case::new("Trilu", 14, vec![i64s(&[3], &[1, 2, 3])])
        .run()
        .unwrap_err();
    assert!(e.contains("trilu"), "{e}");
}

/// IsNaN and the three forms of IsInf, to bool.
#[test]
fn is_nan_and_is_inf() {
    let x = f32s(
        &[5],
        &[1.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0],
    );
    let flags = |op: &'static str, attrs: &[(&str, i64)]| {
        let mut c = Case::new(op, 20, vec![x.clone()]);
        for &(a, v) in attrs {
            c = c.attr(int_attr(a, v));
        }
        let y = c.run1();
        assert_eq!(y.dtype(), DType::Bool);
        y.as_bool().unwrap().to_vec()
    };
    assert_eq!(flags("IsNaN", &[]), [false, true, false, false, false]);
    assert_eq!(flags("IsInf", &[]), [false, false, true, true, false]);
    assert_eq!(
        flags("IsInf", &[("detect_negative", 0)]),
        [false, false, true, false, false]
    );
    assert_eq!(
        flags("IsInf", &[("detect_positive", 0)]),
        [false, false, false, true, false]
    );
    let e = Case::new("IsInf", 20, vec![x])
        .attr(int_attr("detect_positive", 0))
        .attr(int_attr("detect_negative", 0))
        .run()
        .unwrap_err();
    assert!(e.contains("`n`"), "{e}");
    let e = Case::new("IsNaN", 20, vec![i64s(&[1], &[1])])
        .run()
        .unwrap_err();
    assert!(e.contains("`n`") && e.contains("i64"), "{e}");
}

/// Xor of bools, with broadcasting; integers are refused by name.
#[test]
fn xor() {
    let a = TensorValue::from_bool(vec![2, 2], vec![true, true, false, false]).unwrap();
    let b = TensorValue::from_bool(vec![2], vec![true, false]).unwrap();
    let y = Case::new("Xor", 11, vec![a, b]).run1();
    assert_eq!(y.as_bool().unwrap(), [false, true, true, false]);
    let e = Case::new("Xor", 11, vec![i64s(&[1], &[1]), i64s(&[1], &[0])])
        .run()
        .unwrap_err();
    assert!(e.contains("`n`") && e.contains("i64"), "{e}");
}

/// ReduceL1, ReduceL2, ReduceSumSquare, ReduceLogSum and ReduceLogSumExp (imported as their
/// definitions over reduce_sum) against f64, both axes forms and keepdims; LogSumExp stays
/// finite for large values and gives ±inf where the answer is infinite.
#[test]
fn reduce_l1_l2_sum_square_log_sum_log_sum_exp() {
    let xs: Vec<f32> = vec![1.0, -2.0, 3.0, 0.5, -4.0, 2.5];
    let x = f32s(&[2, 3], &xs);
    type F = fn(&[f64]) -> f64;
    let defs: [(&str, F); 5] = [
        ("ReduceL1", |r| r.iter().map(|v| v.abs()).sum()),
        ("ReduceL2", |r| r.iter().map(|v| v * v).sum::<f64>().sqrt()),
        ("ReduceSumSquare", |r| r.iter().map(|v| v * v).sum()),
        ("ReduceLogSum", |r| r.iter().sum::<f64>().ln()),
        ("ReduceLogSumExp", |r| {
            r.iter().map(|v| v.exp()).sum::<f64>().ln()
        }),
    ];
    for (op, f) in defs {
        let rows: Vec<Vec<f64>> = xs
            .chunks(3)
            .map(|c| c.iter().map(|&v| v as f64).collect())
            .collect();
        for (opset, keep) in [(13, 1), (18, 0)] {
            let mut c = Case::new(op, opset, vec![x.clone()]).attr(int_attr("keepdims", keep));
            if opset >= 18 {
                c.inputs.push(Some(i64s(&[1], &[-1])));
            } else {
                c = c.attr(AttributeProto {
                    name: "axes".into(),
                    r#type: AttributeType::Ints as i32,
                    ints: vec![1],
                    ..Default::default()
                });
            }
            let y = c.run1();
            assert_eq!(
                y.shape(),
                if keep == 1 { &[2, 1][..] } else { &[2][..] },
                "{op}"
            );
            for (got, row) in y.as_f32().unwrap().iter().zip(&rows) {
                let want = f(row);
                if want.is_nan() {
                    assert!(got.is_nan(), "{op} {row:?}: {got}, want NaN");
                } else {
                    let tol = 1e-6 * want.abs().max(1.0);
                    assert!(
                        (*got as f64 - want).abs() <= tol,
                        "{op} {row:?}: {got}, want {want}"
                    );
                }
            }
        }
    }
    let lse = |v: &[f32]| Case::new("ReduceLogSumExp", 18, vec![f32s(&[v.len()], v)]).run1();
    let y = lse(&[1000.0, 1000.0]);
    assert!(
        (y.as_f32().unwrap()[0] - (1000.0 + 2f32.ln())).abs() < 1e-3,
        "{y:?}"
    );
    assert_eq!(
        lse(&[f32::NEG_INFINITY; 2]).as_f32().unwrap(),
        [f32::NEG_INFINITY]
    );
    assert_eq!(
        lse(&[f32::INFINITY, 1.0]).as_f32().unwrap(),
        [f32::INFINITY]
    );
    // Integers have no logarithm here: a typed error naming the node.
    let e = Case::new("ReduceL2", 18, vec![i64s(&[2], &[3, 4])])
        .run()
        .unwrap_err();
    assert!(e.contains("`n`") && e.contains("i64"), "{e}");
    let y = Case::new("ReduceSumSquare", 18, vec![i64s(&[2], &[3, -4])]).run1();
    assert_eq!(y.as_i64().unwrap(), [25]);
}

/// ReduceMax and ReduceMin of bools: any and all.
#[test]
fn reduce_max_min_of_bools() {
    let b = TensorValue::from_bool(vec![2, 2], vec![true, false, false, false]).unwrap();
    for (op, want) in [("ReduceMax", [true, false]), ("ReduceMin", [false, false])] {
        let y = Case::new(op, 20, vec![b.clone(), i64s(&[1], &[1])])
            .attr(int_attr("keepdims", 0))
            .run1();
        assert_eq!(y.as_bool().unwrap(), want, "{op}");
    }
    let e = Case::new("ReduceSum", 18, vec![b]).run().unwrap_err();
    assert!(e.contains("bool"), "{e}");
}

/// RMSNormalization (opset 23) against f64 over the last axis and over the last two (axis 1 of
/// a rank-3 input), with a scale; stash_type other than FLOAT is a typed error.
#[test]
fn rms_normalization() {
    let xs: Vec<f32> = (0..12).map(|v| v as f32 * 0.7 - 3.0).collect();
    let x = f32s(&[2, 2, 3], &xs);
    for (axis, group, scale) in [(-1i64, 3usize, vec![3usize]), (1, 6, vec![2, 3])] {
        let sv: Vec<f32> = (0..group).map(|i| 0.5 + i as f32 * 0.25).collect();
        let y = Case::new("RMSNormalization", 23, vec![x.clone(), f32s(&scale, &sv)])
            .attr(int_attr("axis", axis))
            .run1();
        assert_eq!(y.shape(), [2, 2, 3]);
        for (g, (got, xin)) in y
            .as_f32()
            .unwrap()
            .chunks(group)
            .zip(xs.chunks(group))
            .enumerate()
        {
            let ms = xin.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / group as f64;
            let rms = (ms + 1e-5).sqrt();
            for (i, (&o, &v)) in got.iter().zip(xin).enumerate() {
                let want = v as f64 / rms * sv[i] as f64;
                assert!(
                    (o as f64 - want).abs() < 1e-5,
                    "axis {axis} group {g}: {o} vs {want}"
                );
            }
        }
    }
    let e = Case::new("RMSNormalization", 23, vec![x, f32s(&[3], &[1.0; 3])])
        .attr(int_attr("stash_type", 10))
        .run()
        .unwrap_err();
    assert!(e.contains("`n`") && e.contains("stash_type"), "{e}");
}

/// ArgMax and ArgMin: first or last of ties, each axis, keepdims, NaN as the extreme (numpy),
/// integer inputs; an empty axis is a typed error.
#[test]
fn arg_max_and_arg_min() {
    let x = f32s(&[2, 3], &[1.0, 5.0, 5.0, -2.0, -2.0, 0.0]);
    let arg = |op: &'static str, x: &TensorValue, axis: i64, keep: i64, last: i64| {
        Case::new(op, 13, vec![x.clone()])
            .attr(int_attr("axis", axis))
            .attr(int_attr("keepdims", keep))
            .attr(int_attr("select_last_index", last))
            .run1()
    };
    let y = arg("ArgMax", &x, 1, 0, 0);
    assert_eq!((y.shape(), y.as_i64().unwrap()), (&[2][..], &[1, 2][..]));
    let y = arg("ArgMax", &x, -1, 1, 1);
    assert_eq!((y.shape(), y.as_i64().unwrap()), (&[2, 1][..], &[2, 2][..]));
    let y = arg("ArgMin", &x, 1, 0, 0);
    assert_eq!(y.as_i64().unwrap(), [0, 0]);
    let y = arg("ArgMin", &x, 1, 0, 1);
    assert_eq!(y.as_i64().unwrap(), [0, 1]);
    let y = arg("ArgMin", &x, 0, 1, 0);
    assert_eq!(
        (y.shape(), y.as_i64().unwrap()),
        (&[1, 3][..], &[1, 1, 1][..])
    );
    let nan = f32s(&[4], &[1.0, f32::NAN, 7.0, f32::NAN]);
    assert_eq!(arg("ArgMax", &nan, 0, 0, 0).as_i64().unwrap(), [1]);
    assert_eq!(arg("ArgMin", &nan, 0, 0, 1).as_i64().unwrap(), [3]);
    let ints = i64s(&[3], &[i64::MIN, i64::MAX, i64::MAX - 1]);
    assert_eq!(arg("ArgMax", &ints, 0, 0, 0).as_i64().unwrap(), [1]);
    assert_eq!(arg("ArgMin", &ints, 0, 0, 0).as_i64().unwrap(), [0]);
    let e = Case::new("ArgMax", 13, vec![f32s(&[2, 0], &[])])
        .attr(int_attr("axis", 1))
        .run()
        .unwrap_err();
    assert!(e.contains("`n`") && e.contains("empty"), "{e}");
}

/// softmax(q·kᵀ·scale + bias)·v in f64 for one batch of 4-D attention (`[heads, S, D]`), the
/// key/value heads shared by `qh / kvh` query heads in a row; `allowed(i, j)` masks keys, and a
/// row with no allowed key gives zeros.
#[allow(clippy::too_many_arguments)]
fn attention_reference(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    (qh, kvh, s, l, dh): (usize, usize, usize, usize, usize),
    scale: f64,
    softcap: f64,
    allowed: impl Fn(usize, usize) -> bool,
) -> Vec<f64> {
    let mut out = vec![0.0; qh * s * dh];
    for h in 0..qh {
        let kh = h / (qh / kvh);
        for i in 0..s {
            let mut w: Vec<f64> = (0..l)
                .map(|j| {
                    let dot: f64 = (0..dh)
                        .map(|c| q[(h * s + i) * dh + c] as f64 * k[(kh * l + j) * dh + c] as f64)
                        .sum();
                    let x = dot * scale;
                    let x = if softcap > 0.0 {
                        softcap * (x / softcap).tanh()
                    } else {
                        x
                    };
                    if allowed(i, j) {
                        x
                    } else {
                        f64::NEG_INFINITY
                    }
                })
                .collect();
            let m = w.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            if m == f64::NEG_INFINITY {
                continue;
            }
            w.iter_mut().for_each(|x| *x = (*x - m).exp());
            let sum: f64 = w.iter().sum();
            for c in 0..dh {
                out[(h * s + i) * dh + c] = (0..l)
                    .map(|j| w[j] / sum * v[(kh * l + j) * dh + c] as f64)
                    .sum();
            }
        }
    }
    out
}

/// Attention (opset 23) against f64: 4-D MHA with a bool mask (one row fully masked: zeros),
/// grouped-query causal with a softcap, 3-D inputs split into heads with a past cache and the
/// present outputs; unsupported forms are typed errors.
#[test]
fn attention_opset_23() {
    let vals = |n: usize, seed: f32| -> Vec<f32> {
        (0..n)
            .map(|i| (i as f32 * 0.37 + seed).sin() * 1.5)
            .collect()
    };
    let check = |got: &TensorValue, want: &[f64], what: &str| {
        for (g, w) in got.as_f32().unwrap().iter().zip(want) {
            assert!((*g as f64 - w).abs() < 1e-5, "{what}: {g} vs {w}");
        }
    };
    // MHA, 2 heads, 3 queries, 4 keys, head size 2; query row 1 may attend to no key.
    let (qh, s, l, dh) = (2, 3, 4, 2);
    let (q, k, v) = (
        vals(qh * s * dh, 0.1),
        vals(qh * l * dh, 0.7),
        vals(qh * l * dh, 1.3),
    );
    let allowed = |i: usize, j: usize| i != 1 && !(i + j).is_multiple_of(3);
    let mask: Vec<bool> = (0..s * l).map(|p| allowed(p / l, p % l)).collect();
    let y = Case::new(
        "Attention",
        23,
        vec![
            f32s(&[1, qh, s, dh], &q),
            f32s(&[1, qh, l, dh], &k),
            f32s(&[1, qh, l, dh], &v),
            TensorValue::from_bool(vec![s, l], mask).unwrap(),
        ],
    )
    .run1();
    let want = attention_reference(
        &q,
        &k,
        &v,
        (qh, qh, s, l, dh),
        1.0 / 2f64.sqrt(),
        0.0,
        allowed,
    );
    assert_eq!(y.shape(), [1, qh, s, dh]);
    check(&y, &want, "mha bool mask");
    assert!(y.as_f32().unwrap()[dh..2 * dh].iter().all(|&v| v == 0.0));
    // GQA: 4 query heads over 2 key/value heads, causal, softcap 2, scale 0.3.
    let (qh, kvh, s) = (4, 2, 4);
    let (q, k, v) = (
        vals(qh * s * dh, 0.2),
        vals(kvh * s * dh, 0.5),
        vals(kvh * s * dh, 0.9),
    );
    let y = Case::new(
        "Attention",
        23,
        vec![
            f32s(&[1, qh, s, dh], &q),
            f32s(&[1, kvh, s, dh], &k),
            f32s(&[1, kvh, s, dh], &v),
        ],
    )
    .attr(int_attr("is_causal", 1))
    .attr(float_attr("softcap", 2.0))
    .attr(float_attr("scale", 0.3))
    .run1();
    let want = attention_reference(&q, &k, &v, (qh, kvh, s, s, dh), 0.3, 2.0, |i, j| j <= i);
    check(&y, &want, "gqa causal softcap");
    // 3-D: [1, 2, 2 heads · 2] with a past of 2 keys (causal: query i sees keys ≤ i + 2).
    let (h, s, p) = (2, 2, 2);
    let (q3, k3, v3) = (
        vals(s * h * dh, 0.3),
        vals(s * h * dh, 0.4),
        vals(s * h * dh, 0.6),
    );
    let (pk, pv) = (vals(h * p * dh, 1.1), vals(h * p * dh, 1.7));
    let mut c = Case::new(
        "Attention",
        23,
        vec![
            f32s(&[1, s, h * dh], &q3),
            f32s(&[1, s, h * dh], &k3),
            f32s(&[1, s, h * dh], &v3),
        ],
    )
    .attr(int_attr("q_num_heads", h as i64))
    .attr(int_attr("kv_num_heads", h as i64))
    .attr(int_attr("is_causal", 1));
    c.inputs.push(None);
    c.inputs.push(Some(f32s(&[1, h, p, dh], &pk)));
    c.inputs.push(Some(f32s(&[1, h, p, dh], &pv)));
    c.outputs = vec!["y", "present_key", "present_value"];
    let outs = c.run().unwrap();
    // Heads first ([h, S, D]), the past before the new keys.
    let heads = |t: &[f32]| -> Vec<f32> {
        (0..h)
            .flat_map(|hh| (0..s).flat_map(move |i| (0..dh).map(move |c| (hh, i, c))))
            .map(|(hh, i, c)| t[(i * h + hh) * dh + c])
            .collect()
    };
    let cat = |past: &[f32], new: &[f32]| -> Vec<f32> {
        (0..h)
            .flat_map(|hh| {
                let mut r = past[hh * p * dh..(hh + 1) * p * dh].to_vec();
                r.extend_from_slice(&new[hh * s * dh..(hh + 1) * s * dh]);
                r
            })
            .collect()
    };
    let (kk, vv) = (cat(&pk, &heads(&k3)), cat(&pv, &heads(&v3)));
    assert_eq!(outs[1].shape(), [1, h, p + s, dh]);
    assert_eq!(outs[1].as_f32().unwrap(), kk);
    assert_eq!(outs[2].as_f32().unwrap(), vv);
    let want = attention_reference(
        &heads(&q3),
        &kk,
        &vv,
        (h, h, s, p + s, dh),
        0.5f64.sqrt(),
        0.0,
        |i, j| j <= i + p,
    );
    // Back to [1, S, heads · D].
    let want: Vec<f64> = (0..s)
        .flat_map(|i| (0..h).flat_map(move |hh| (0..dh).map(move |c| (hh, i, c))))
        .map(|(hh, i, c)| want[(hh * s + i) * dh + c])
        .collect();
    assert_eq!(outs[0].shape(), [1, s, h * dh]);
    check(&outs[0], &want, "3-D with past");
    // 3-D without head counts, and a sliding window: typed errors naming the node.
    let e = Case::new("Attention", 23, vec![f32s(&[1, 2, 4], &[0.0; 8]); 3])
        .run()
        .unwrap_err();
    assert!(e.contains("`n`") && e.contains("q_num_heads"), "{e}");
    let e = Case::new("Attention", 25, vec![f32s(&[1, 1, 2, 2], &[0.0; 4]); 3])
        .attr(int_attr("left_window_size", 2))
        .run()
        .unwrap_err();
    assert!(e.contains("left_window_size"), "{e}");
}

/// RotaryEmbedding (opset 23): 4-D with position ids, both pairings (halves and interleaved),
/// a partial rotary dim, and 3-D input with num_heads, against a direct computation.
#[test]
fn rotary_embedding() {
    let (h, s, dh) = (2usize, 2usize, 4usize);
    let xs: Vec<f32> = (0..h * s * dh).map(|i| i as f32 * 0.5 - 3.0).collect();
    let angles: Vec<f32> = (0..3 * 2).map(|i| i as f32 * 0.3).collect();
    let cos: Vec<f32> = angles.iter().map(|a| a.cos()).collect();
    let sin: Vec<f32> = angles.iter().map(|a| a.sin()).collect();
    let pos = [2usize, 0];
    // One head row `x` (rotary dim `r`) at position `p` (two angles a position in the table).
    let rotate = |x: &[f32], p: usize, r: usize, interleaved: bool| -> Vec<f32> {
        let mut y = x.to_vec();
        for i in 0..r / 2 {
            let (a, b) = if interleaved {
                (2 * i, 2 * i + 1)
            } else {
                (i, i + r / 2)
            };
            let (c, sn) = (cos[p * 2 + i], sin[p * 2 + i]);
            y[a] = x[a] * c - x[b] * sn;
            y[b] = x[a] * sn + x[b] * c;
        }
        y
    };
    for (interleaved, r) in [(0, 4), (1, 4), (0, 2), (1, 2)] {
        let caches = |v: &[f32]| -> Vec<f32> {
            (0..3)
                .flat_map(|p| v[p * 2..p * 2 + r / 2].to_vec())
                .collect()
        };
        let y = Case::new(
            "RotaryEmbedding",
            23,
            vec![
                f32s(&[1, h, s, dh], &xs),
                f32s(&[3, r / 2], &caches(&cos)),
                f32s(&[3, r / 2], &caches(&sin)),
                i64s(&[1, s], &pos.map(|p| p as i64)),
            ],
        )
        .attr(int_attr("interleaved", interleaved))
        .attr(int_attr(
            "rotary_embedding_dim",
            if r == dh { 0 } else { r as i64 },
        ))
        .run1();
        let want: Vec<f32> = (0..h)
            .flat_map(|hh| (0..s).map(move |i| (hh, i)))
            .flat_map(|(hh, i)| {
                let row = &xs[(hh * s + i) * dh..(hh * s + i + 1) * dh];
                rotate(row, pos[i], r, interleaved == 1)
            })
            .collect();
        assert_eq!(y.shape(), [1, h, s, dh]);
        for (g, w) in y.as_f32().unwrap().iter().zip(&want) {
            assert!(
                (g - w).abs() < 1e-6,
                "interleaved {interleaved} dim {r}: {g} vs {w}"
            );
        }
    }
    // 3-D [1, S, heads·D] with the caches per token (no position ids).
    let x3: Vec<f32> = (0..s * h * dh).map(|i| (i as f32 * 0.7).sin()).collect();
    let c3: Vec<f32> = pos
        .iter()
        .flat_map(|&p| cos[p * 2..p * 2 + 2].to_vec())
        .collect();
    let s3: Vec<f32> = pos
        .iter()
        .flat_map(|&p| sin[p * 2..p * 2 + 2].to_vec())
        .collect();
    let y = Case::new(
        "RotaryEmbedding",
        23,
        vec![
            f32s(&[1, s, h * dh], &x3),
            f32s(&[1, s, 2], &c3),
            f32s(&[1, s, 2], &s3),
        ],
    )
    .attr(int_attr("num_heads", h as i64))
    .run1();
    let want: Vec<f32> = (0..s * h)
        .flat_map(|t| rotate(&x3[t * dh..(t + 1) * dh], pos[t / h], dh, false))
        .collect();
    assert_eq!(y.shape(), [1, s, h * dh]);
    for (g, w) in y.as_f32().unwrap().iter().zip(&want) {
        assert!((g - w).abs() < 1e-6, "3-D: {g} vs {w}");
    }
    let e = Case::new("RotaryEmbedding", 23, vec![f32s(&[1, 2, 8], &[0.0; 16]); 3])
        .run()
        .unwrap_err();
    assert!(e.contains("num_heads"), "{e}");
}

/// ScatterND and ScatterElements: the examples of the ONNX spec, every reduction, negative
/// indices; indices out of range and mismatched updates are typed errors.
#[test]
fn scatter_nd_and_scatter_elements() {
    let s = |op: &'static str, opset: i64, ins: Vec<TensorValue>, red: Option<&str>| {
        let mut c = Case::new(op, opset, ins);
        if let Some(r) = red {
            c = c.attr(AttributeProto {
                name: "reduction".into(),
                r#type: AttributeType::String as i32,
                s: r.as_bytes().to_vec().into(),
                ..Default::default()
            });
        }
        c
    };
    // ScatterND, spec example 1: data [1..8], indices [[4],[3],[1],[7]].
    let data = f32s(&[8], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
    let idx = i64s(&[4, 1], &[4, 3, 1, -1]);
    let upd = f32s(&[4], &[9.0, 10.0, 11.0, 12.0]);
    let y = s(
        "ScatterND",
        11,
        vec![data.clone(), idx.clone(), upd.clone()],
        None,
    )
    .run1();
    assert_eq!(
        y.as_f32().unwrap(),
        [1.0, 11.0, 3.0, 10.0, 9.0, 6.0, 7.0, 12.0]
    );
    for (red, want) in [
        ("add", [1.0, 13.0, 3.0, 14.0, 14.0, 6.0, 7.0, 20.0]),
        ("mul", [1.0, 22.0, 3.0, 40.0, 45.0, 6.0, 7.0, 96.0]),
        ("max", [1.0, 11.0, 3.0, 10.0, 9.0, 6.0, 7.0, 12.0]),
        ("min", [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]),
    ] {
        let ins = vec![data.clone(), idx.clone(), upd.clone()];
        let y = s("ScatterND", 18, ins, Some(red)).run1();
        assert_eq!(y.as_f32().unwrap(), want, "{red}");
    }
    // Slices: rows 0 and 2 of a [3, 2] replaced.
    let y = s(
        "ScatterND",
        16,
        vec![
            i64s(&[3, 2], &[0; 6]),
            i64s(&[2, 1], &[0, 2]),
            i64s(&[2, 2], &[1, 2, 3, 4]),
        ],
        None,
    )
    .run1();
    assert_eq!(y.as_i64().unwrap(), [1, 2, 0, 0, 3, 4]);
    // ScatterElements, spec example: axis 1, data [[1,2,3,4,5]], indices [[1,3]].
    let data = f32s(&[1, 5], &[1.0, 2.0, 3.0, 4.0, 5.0]);
    let ins = vec![data, i64s(&[1, 2], &[1, -2]), f32s(&[1, 2], &[1.1, 2.1])];
    let y = s("ScatterElements", 13, ins.clone(), None)
        .attr(int_attr("axis", 1))
        .run1();
    assert_eq!(y.as_f32().unwrap(), [1.0, 1.1, 3.0, 2.1, 5.0]);
    let y = s("ScatterElements", 18, ins, Some("add"))
        .attr(int_attr("axis", 1))
        .run1();
    assert_eq!(y.as_f32().unwrap(), [1.0, 3.1, 3.0, 6.1, 5.0]);
    // Out of range, and max before opset 18: typed errors naming the node.
    let e = s(
        "ScatterND",
        11,
        vec![
            f32s(&[2], &[0.0; 2]),
            i64s(&[1, 1], &[2]),
            f32s(&[1], &[1.0]),
        ],
        None,
    )
    .run()
    .unwrap_err();
    assert!(e.contains("`n`") && e.contains("out of range"), "{e}");
    let e = s(
        "ScatterND",
        16,
        vec![
            f32s(&[2], &[0.0; 2]),
            i64s(&[1, 1], &[0]),
            f32s(&[1], &[1.0]),
        ],
        Some("max"),
    )
    .run()
    .unwrap_err();
    assert!(e.contains("reduction"), "{e}");
}

/// Einsum: the attention forms of transformer exports against MatMul-by-hand, a diagonal with
/// an ellipsis, an implicit output, a full contraction, and bad equations as typed errors.
#[test]
fn einsum() {
    let e = |eq: &str, ins: Vec<TensorValue>| {
        Case::new("Einsum", 12, ins).attr(AttributeProto {
            name: "equation".into(),
            r#type: AttributeType::String as i32,
            s: eq.as_bytes().to_vec().into(),
            ..Default::default()
        })
    };
    let (b, h, q, k, d) = (1, 2, 3, 4, 2);
    let qs: Vec<f32> = (0..b * h * q * d).map(|i| i as f32 * 0.5 - 2.0).collect();
    let ks: Vec<f32> = (0..b * h * k * d).map(|i| (i as f32 * 0.3).cos()).collect();
    let y = e(
        "bhqd,bhkd->bhqk",
        vec![f32s(&[b, h, q, d], &qs), f32s(&[b, h, k, d], &ks)],
    )
    .run1();
    assert_eq!(y.shape(), [b, h, q, k]);
    let want: Vec<f32> = (0..h)
        .flat_map(|hh| (0..q).flat_map(move |i| (0..k).map(move |j| (hh, i, j))))
        .map(|(hh, i, j)| {
            (0..d)
                .map(|c| qs[(hh * q + i) * d + c] * ks[(hh * k + j) * d + c])
                .sum()
        })
        .collect();
    for (g, w) in y.as_f32().unwrap().iter().zip(&want) {
        assert!((g - w).abs() < 1e-5, "{g} vs {w}");
    }
    // Diagonal of each matrix in a batch, and an implicit output (ij,jk -> ik).
    let m = i64s(&[2, 2, 2], &[1, 2, 3, 4, 5, 6, 7, 8]);
    let y = e("...ii->...i", vec![m.clone()]).run1();
    assert_eq!(
        (y.shape(), y.as_i64().unwrap()),
        (&[2, 2][..], &[1, 4, 5, 8][..])
    );
    let a = i64s(&[2, 2], &[1, 2, 3, 4]);
    let y = e("ij,jk", vec![a.clone(), a.clone()]).run1();
    assert_eq!(y.as_i64().unwrap(), [7, 10, 15, 22]);
    let y = e("ij,ij->", vec![a.clone(), a.clone()]).run1();
    assert_eq!((y.shape(), y.as_i64().unwrap()), (&[][..], &[30][..]));
    let y = e("ij->ji", vec![a.clone()]).run1();
    assert_eq!(y.as_i64().unwrap(), [1, 3, 2, 4]);
    // Bad equations: typed errors naming the node and the attribute.
    for eq in ["ij,jk->ik", "ijk->i", "ij->iz", "i1->i"] {
        let err = e(eq, vec![a.clone()]).run().unwrap_err();
        assert!(
            err.contains("`n`") && err.contains("equation"),
            "{eq}: {err}"
        );
    }
}

fn ints_attr(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: AttributeType::Ints as i32,
        ints: v.to_vec(),
        ..Default::default()
    }
}

/// Opsets 7 to 10: Slice (before 10), Pad and Clip (before 11) take as attributes what later
/// opsets take as inputs; each form computes what its input form computes, and the attribute
/// form at a later opset (or the input form at an earlier one) is a typed refusal.
#[test]
fn attribute_forms_of_opsets_before_11() {
    let x = f32s(&[3, 4], &(0..12).map(|v| v as f32).collect::<Vec<_>>());
    let sliced = Case::new("Slice", 9, vec![x.clone()])
        .attr(ints_attr("starts", &[1, -3]))
        .attr(ints_attr("ends", &[3, 100]))
        .attr(ints_attr("axes", &[0, 1]))
        .run1();
    let by_inputs = Case::new(
        "Slice",
        13,
        vec![
            x.clone(),
            i64s(&[2], &[1, -3]),
            i64s(&[2], &[3, 100]),
            i64s(&[2], &[0, 1]),
        ],
    )
    .run1();
    assert_eq!(sliced.shape(), [2, 3]);
    assert_eq!(sliced.as_f32().unwrap(), [5., 6., 7., 9., 10., 11.]);
    assert_eq!(sliced.as_f32(), by_inputs.as_f32());
    // No axes: the first len(starts) axes.
    let y = Case::new("Slice", 7, vec![x.clone()])
        .attr(ints_attr("starts", &[2]))
        .attr(ints_attr("ends", &[3]))
        .run1();
    assert_eq!(y.as_f32().unwrap(), [8., 9., 10., 11.]);

    let padded = Case::new("Pad", 10, vec![f32s(&[2], &[1.0, 2.0])])
        .attr(ints_attr("pads", &[1, 2]))
        .attr(float_attr("value", 0.5))
        .run1();
    assert_eq!(padded.as_f32().unwrap(), [0.5, 1.0, 2.0, 0.5, 0.5]);
    let edge = Case::new("Pad", 7, vec![f32s(&[2], &[1.0, 2.0])])
        .attr(ints_attr("pads", &[2, 0]))
        .attr(mode("edge"))
        .run1();
    assert_eq!(edge.as_f32().unwrap(), [1.0, 1.0, 1.0, 2.0]);

    let v = f32s(&[4], &[-3.0, -0.5, 0.5, f32::INFINITY]);
    let clipped = Case::new("Clip", 9, vec![v.clone()])
        .attr(float_attr("min", -1.0))
        .attr(float_attr("max", 1.0))
        .run1();
    assert_eq!(clipped.as_f32().unwrap(), [-1.0, -0.5, 0.5, 1.0]);
    // Clip-6's default bounds are the type's lowest and highest finite values.
    let open = Case::new("Clip", 8, vec![v]).run1();
    assert_eq!(open.as_f32().unwrap(), [-3.0, -0.5, 0.5, f32::MAX]);

    // The forms of other opsets are refused, naming the node and the attribute or arity.
    let e = Case::new("Slice", 13, vec![x.clone()])
        .attr(ints_attr("starts", &[0]))
        .attr(ints_attr("ends", &[1]))
        .run()
        .unwrap_err();
    assert!(e.contains("starts") && e.contains("opset 13"), "{e}");
    let e = Case::new(
        "Slice",
        9,
        vec![x.clone(), i64s(&[1], &[0]), i64s(&[1], &[1])],
    )
    .run()
    .unwrap_err();
    assert!(e.contains("`n`"), "{e}");
    let e = Case::new("Pad", 10, vec![x]).run().unwrap_err();
    assert!(e.contains("pads") && e.contains("missing"), "{e}");
}

/// Scatter (opsets 9 and 10, deprecated at 11) is ScatterElements.
#[test]
fn scatter_is_scatter_elements() {
    let data = f32s(&[2, 3], &[0.0; 6]);
    let idx = i64s(&[1, 2], &[2, 0]);
    let upd = f32s(&[1, 2], &[7.0, 8.0]);
    let y = Case::new("Scatter", 10, vec![data, idx, upd])
        .attr(int_attr("axis", 1))
        .run1();
    assert_eq!(y.as_f32().unwrap(), [8.0, 0.0, 7.0, 0.0, 0.0, 0.0]);
}

/// INT16, UINT16, UINT32 and UINT64 tensors: arithmetic wraps in the type itself, comparisons
/// and casts see the full unsigned range (a u64 beyond i64's range too, which constant folding
/// leaves to the runtime), and `.npy` files of them round-trip.
#[test]
fn sixteen_bit_and_unsigned_integers() {
    let v = |shape: &[usize], d: Vec<u16>| TensorValue::from_vec(shape.to_vec(), d).unwrap();
    let y = Case::new(
        "Add",
        14,
        vec![v(&[2], vec![65535, 1]), v(&[2], vec![1, 2])],
    )
    .run1();
    assert_eq!(y.as_slice::<u16>().unwrap(), [0, 3]);
    let i16s = |d: Vec<i16>| TensorValue::from_vec(vec![d.len()], d).unwrap();
    let y = Case::new("Sub", 14, vec![i16s(vec![-32768, 5]), i16s(vec![1, 7])]).run1();
    assert_eq!(y.as_slice::<i16>().unwrap(), [32767, -2]);
    let y = Case::new("Mod", 13, vec![i16s(vec![-7, 7]), i16s(vec![3, -3])]).run1();
    assert_eq!(y.as_slice::<i16>().unwrap(), [2, -2]);
    let u32s = |d: Vec<u32>| TensorValue::from_vec(vec![d.len()], d).unwrap();
    let y = Case::new(
        "Div",
        14,
        vec![u32s(vec![4_000_000_000, 9]), u32s(vec![3, 2])],
    )
    .run1();
    assert_eq!(y.as_slice::<u32>().unwrap(), [1_333_333_333, 4]);
    let big = u64::MAX - 1;
    let u64s = |d: Vec<u64>| TensorValue::from_vec(vec![d.len()], d).unwrap();
    let y = Case::new("Max", 13, vec![u64s(vec![big, 5]), u64s(vec![1, 7])]).run1();
    assert_eq!(y.as_slice::<u64>().unwrap(), [big, 7]);
    let y = Case::new("Greater", 13, vec![u64s(vec![big, 5]), u64s(vec![1, 7])]).run1();
    assert_eq!(y.as_bool().unwrap(), [true, false]);
    let y = Case::new("Cast", 21, vec![u64s(vec![big, 3])])
        .attr(int_attr("to", DataType::Float as i64))
        .run1();
    assert_eq!(y.as_f32().unwrap(), [big as f32, 3.0]);
    // A u64 index beyond i64 is an error, not a wrapped index.
    let e = Case::new("Gather", 13, vec![f32s(&[2], &[1.0, 2.0]), u64s(vec![big])])
        .run()
        .unwrap_err();
    assert!(e.contains("u64"), "{e}");

    let dir = std::env::temp_dir().join(format!("encore-npy-ints-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for t in [
        i16s(vec![-3, 300]),
        v(&[2], vec![65535, 0]),
        u32s(vec![u32::MAX, 1]),
        u64s(vec![u64::MAX, 2]),
    ] {
        let path = dir.join(format!("{}.npy", t.dtype()));
        t.write_npy(&path).unwrap();
        assert_eq!(TensorValue::read_npy(&path).unwrap(), t);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Range of opset 27: `stash_type` float (the default, what encore computes in) is accepted,
/// another is a typed refusal; int16 ranges stay int16; types Range does not define are refused.
#[test]
fn range_at_opset_27_and_on_int16() {
    let s = |v: f32| TensorValue::scalar(v);
    let y = Case::new("Range", 27, vec![s(1.0), s(2.0), s(0.25)])
        .attr(int_attr("stash_type", 1))
        .run1();
    assert_eq!(y.as_f32().unwrap(), [1.0, 1.25, 1.5, 1.75]);
    let e = Case::new("Range", 27, vec![s(1.0), s(2.0), s(0.25)])
        .attr(int_attr("stash_type", DataType::Float16 as i64))
        .run()
        .unwrap_err();
    assert!(e.contains("stash_type"), "{e}");
    let i = |v: i16| TensorValue::scalar(v);
    let y = Case::new("Range", 11, vec![i(10), i(4), i(-3)]).run1();
    assert_eq!(y.as_slice::<i16>().unwrap(), [10, 7]);
    let u = |v: u8| TensorValue::scalar(v);
    let e = Case::new("Range", 11, vec![u(1), u(4), u(1)])
        .run()
        .unwrap_err();
    assert!(e.contains("u8"), "{e}");
}

fn value_info(name: &str, dtype: Option<DataType>) -> ValueInfoProto {
    ValueInfoProto {
        name: name.into(),
        r#type: dtype.map(|d| TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: d as i32,
                shape: None,
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A `Loop` body: its inputs (untyped where the dtype is `None`, as ONNX allows), nodes and
/// outputs.
fn loop_body(
    inputs: &[(&str, Option<DataType>)],
    nodes: Vec<NodeProto>,
    outputs: &[&str],
) -> AttributeProto {
    AttributeProto {
        name: "body".into(),
        r#type: AttributeType::Graph as i32,
        g: Some(GraphProto {
            name: "body".into(),
            input: inputs.iter().map(|&(n, d)| value_info(n, d)).collect(),
            node: nodes,
            output: outputs.iter().map(|&o| value_info(o, None)).collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn constant(output: &str, v: &TensorValue) -> NodeProto {
    let mut n = node("Constant", &[], output, vec![]);
    n.attribute.push(AttributeProto {
        name: "value".into(),
        r#type: AttributeType::Tensor as i32,
        t: Some(tensor_proto(output, v)),
        ..Default::default()
    });
    n
}

/// A `Loop` case over `inputs` (trip count, condition, initial values; absent where `None`);
/// `in{reads_from}` and later are values of the graph that only the body reads.
fn loop_case(
    inputs: Vec<Option<TensorValue>>,
    reads_from: usize,
    body: &AttributeProto,
    outputs: Vec<&'static str>,
) -> Case {
    fn node_reads_3(m: &mut ModelProto) {
        m.graph.as_mut().unwrap().node[0].input.truncate(3);
    }
    let mut c = Case::new("Loop", 11, vec![]).attr(body.clone());
    c.inputs = inputs;
    c.outputs = outputs;
    match reads_from {
        3 => c.patch = Some(node_reads_3),
        r => assert_eq!(r, c.inputs.len(), "no value read by the body alone"),
    }
    c
}

/// ONNX's `loop11` with the sliced tensor a value of the enclosing graph: the carried sum, its
/// scan over the iterations, and no iteration at all when the trip count is 0 or the condition
/// false (the initial value, and an empty scan).
#[test]
fn loop_carries_scans_and_reads_enclosing_values() {
    use DataType::{Bool, Float, Int64};
    let body = loop_body(
        &[("i", Some(Int64)), ("c", Some(Bool)), ("y_in", Some(Float))],
        vec![
            node("Identity", &["c"], "c_out", vec![]),
            constant("one", &TensorValue::scalar(1i64)),
            node("Add", &["i", "one"], "end", vec![]),
            node("Unsqueeze", &["i"], "start", vec![ints_attr("axes", &[0])]),
            node("Unsqueeze", &["end"], "stop", vec![ints_attr("axes", &[0])]),
            node("Slice", &["in3", "start", "stop"], "s", vec![]),
            node("Add", &["y_in", "s"], "y_out", vec![]),
            node("Identity", &["y_out"], "scan", vec![]),
        ],
        &["c_out", "y_out", "scan"],
    );
    let x = f32s(&[5], &[1.0, 2.0, 3.0, 4.0, 5.0]);
    let run = |m: i64, cond: bool| {
        let ins = vec![
            Some(TensorValue::scalar(m)),
            Some(TensorValue::scalar(cond)),
            Some(f32s(&[1], &[0.0])),
            Some(x.clone()),
        ];
        loop_case(ins, 3, &body, vec!["y", "scan"])
            .run()
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let out = run(5, true);
    assert_eq!(
        (out[0].shape(), out[0].as_f32().unwrap()),
        (&[1][..], &[15.0][..])
    );
    assert_eq!(out[1].shape(), [5, 1]);
    assert_eq!(out[1].as_f32().unwrap(), [1.0, 3.0, 6.0, 10.0, 15.0]);
    let out = run(2, true);
    assert_eq!(out[0].as_f32().unwrap(), [3.0]);
    assert_eq!(out[1].as_f32().unwrap(), [1.0, 3.0]);
    for (m, cond) in [(0, true), (5, false)] {
        let out = run(m, cond);
        assert_eq!(out[0].as_f32().unwrap(), [0.0], "{m} {cond}");
        // No iteration says what a scanned value looks like: the scan is empty, rank 1 here
        // (the body's sum has no declared shape).
        assert_eq!(out[1].shape(), [0], "{m} {cond}");
    }
}

/// The body's condition ends the loop (it runs while `i < trip_count` and the condition it gave
/// last holds); without a trip count only the condition does, and without a condition input the
/// body's still does (as onnxruntime runs it).
#[test]
fn loop_stops_on_the_trip_count_or_the_condition() {
    use DataType::{Bool, Int64};
    let body = loop_body(
        &[("i", Some(Int64)), ("c", Some(Bool)), ("n_in", None)],
        vec![
            constant("two", &TensorValue::scalar(2i64)),
            node("Less", &["i", "two"], "c_out", vec![]),
            constant("one", &TensorValue::scalar(1.0f32)),
            node("Add", &["n_in", "one"], "n_out", vec![]),
            node("Identity", &["i"], "scan", vec![]),
        ],
        &["c_out", "n_out", "scan"],
    );
    let m = |v: i64| Some(TensorValue::scalar(v));
    let c = |v: bool| Some(TensorValue::scalar(v));
    for (trip, cond, iterations) in [
        (m(10), c(true), 3),
        (m(2), c(true), 2),
        (None, c(true), 3),
        (m(10), None, 3),
        (None, None, 3),
        (m(10), c(false), 0),
    ] {
        let what = format!("{trip:?} {cond:?}");
        let ins = vec![trip, cond, Some(TensorValue::scalar(0.0f32))];
        let out = loop_case(ins, 3, &body, vec!["n", "scan"])
            .run()
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(out[0].as_f32().unwrap(), [iterations as f32], "{what}");
        assert_eq!(out[1].shape(), [iterations], "{what}");
        let want: Vec<i64> = (0..iterations as i64).collect();
        assert_eq!(out[1].to_i64_vec().unwrap(), want, "{what}");
    }
}

/// A carried value may change shape from one iteration to the next (here it grows by one
/// element each time); a scanned one may not: a typed error naming the node and iteration.
#[test]
fn loop_carried_values_may_change_shape_scans_may_not() {
    use DataType::{Bool, Int64};
    let growing = |scanned: bool| {
        let mut outputs = vec!["c_out", "v_out"];
        if scanned {
            outputs.push("v_out");
        }
        loop_body(
            &[("i", Some(Int64)), ("c", Some(Bool)), ("v_in", Some(Int64))],
            vec![
                node("Identity", &["c"], "c_out", vec![]),
                node("Unsqueeze", &["i"], "iu", vec![ints_attr("axes", &[0])]),
                node(
                    "Concat",
                    &["v_in", "iu"],
                    "v_out",
                    vec![int_attr("axis", 0)],
                ),
            ],
            &outputs,
        )
    };
    let ins = || {
        vec![
            Some(TensorValue::scalar(3i64)),
            Some(TensorValue::scalar(true)),
            Some(i64s(&[1], &[7])),
        ]
    };
    let v = loop_case(ins(), 3, &growing(false), vec!["v"]).run1();
    assert_eq!(v.shape(), [4]);
    assert_eq!(v.to_i64_vec().unwrap(), [7, 0, 1, 2]);
    let e = loop_case(ins(), 3, &growing(true), vec!["v", "scan"])
        .run()
        .unwrap_err();
    assert!(
        e.contains("`n`") && e.contains("iteration 1") && e.contains("scan output 0"),
        "{e}"
    );
}

/// Bad loops and bad values are typed errors, never panics: at import (a trip count that is
/// not int64, a body with the wrong inputs, a carried value whose dtype the body changes) and
/// at run time (a negative trip count, a condition of two elements, from the node or from the
/// body).
#[test]
fn loop_bad_input_is_a_typed_error() {
    use DataType::{Bool, Int64};
    let counting = loop_body(
        &[("i", Some(Int64)), ("c", Some(Bool)), ("v_in", None)],
        vec![
            node("Identity", &["c"], "c_out", vec![]),
            node("Identity", &["v_in"], "v_out", vec![]),
        ],
        &["c_out", "v_out"],
    );
    let run = |trip: TensorValue, cond: TensorValue, body: &AttributeProto| {
        let ins = vec![Some(trip), Some(cond), Some(f32s(&[1], &[1.0]))];
        loop_case(ins, 3, body, vec!["v"]).run()
    };
    let (m, yes) = (TensorValue::scalar(2i64), TensorValue::scalar(true));
    let e = run(TensorValue::scalar(-1i64), yes.clone(), &counting).unwrap_err();
    assert!(e.contains("`n`") && e.contains("negative"), "{e}");
    let two = TensorValue::from_bool(vec![2], vec![true, true]).unwrap();
    let e = run(m.clone(), two, &counting).unwrap_err();
    assert!(e.contains("condition") && e.contains("bool"), "{e}");
    let e = run(TensorValue::scalar(2i32), yes.clone(), &counting).unwrap_err();
    assert!(e.contains("`n`") && e.contains("i32"), "{e}");
    let pair = loop_body(
        &[("i", Some(Int64)), ("c", Some(Bool)), ("v_in", None)],
        vec![
            node("Unsqueeze", &["c"], "c1", vec![ints_attr("axes", &[0])]),
            node("Concat", &["c1", "c1"], "c_out", vec![int_attr("axis", 0)]),
            node("Identity", &["v_in"], "v_out", vec![]),
        ],
        &["c_out", "v_out"],
    );
    let e = run(m.clone(), yes.clone(), &pair).unwrap_err();
    assert!(
        e.contains("iteration 0") && e.contains("body's condition"),
        "{e}"
    );
    let short = loop_body(
        &[("i", Some(Int64)), ("c", Some(Bool))],
        vec![node("Identity", &["c"], "c_out", vec![])],
        &["c_out"],
    );
    let e = run(m.clone(), yes.clone(), &short).unwrap_err();
    assert!(e.contains("the body takes 2 inputs"), "{e}");
    let casting = loop_body(
        &[("i", Some(Int64)), ("c", Some(Bool)), ("v_in", None)],
        vec![
            node("Identity", &["c"], "c_out", vec![]),
            node(
                "Cast",
                &["v_in"],
                "v_out",
                vec![int_attr("to", DataType::Int64 as i64)],
            ),
        ],
        &["c_out", "v_out"],
    );
    let e = run(m, yes, &casting).unwrap_err();
    assert!(e.contains("carried value 0 changes dtype"), "{e}");
}

/// A loop in a loop body reads a value of the top graph, two scopes up, and a body holds a
/// constant too large to print inline: the model runs the same after a round trip through a
/// compiled `.encore` file, which keeps the body's constant.
#[test]
fn nested_loops_survive_a_compiled_file() {
    use DataType::{Bool, Int64};
    let inner = loop_body(
        &[("j", Some(Int64)), ("d", Some(Bool)), ("a_in", None)],
        vec![
            node("Identity", &["d"], "d_out", vec![]),
            node("Add", &["a_in", "in3"], "a_out", vec![]),
        ],
        &["d_out", "a_out"],
    );
    let big = f32s(&[100], &[0.5; 100]);
    let mut inner_loop = node("Loop", &["three", "c", "acc_in"], "inner_out", vec![]);
    inner_loop.attribute.push(inner);
    let outer = loop_body(
        &[("i", Some(Int64)), ("c", Some(Bool)), ("acc_in", None)],
        vec![
            node("Identity", &["c"], "c_out", vec![]),
            constant("three", &TensorValue::scalar(3i64)),
            inner_loop,
            constant("big", &big),
            node("Add", &["inner_out", "big"], "acc_out", vec![]),
        ],
        &["c_out", "acc_out"],
    );
    let w: Vec<f32> = (0..100).map(|k| k as f32).collect();
    let ins = vec![
        Some(TensorValue::scalar(2i64)),
        Some(TensorValue::scalar(true)),
        Some(f32s(&[100], &[1.0; 100])),
        Some(f32s(&[100], &w)),
    ];
    let case = loop_case(ins, 3, &outer, vec!["acc"]);
    let acc = case.run1();
    let want: Vec<f32> = w.iter().map(|&x| 1.0 + 2.0 * (3.0 * x + 0.5)).collect();
    assert_eq!(acc.as_f32().unwrap(), want);

    let bytes = Bytes::from(case.model(true).encode_to_vec());
    let model = Model::from_graph(frontend_onnx::import_bytes(bytes, None).unwrap()).unwrap();
    let text = ir::text::print(model.graph()).unwrap();
    assert!(
        text.contains("    %6 = const[value=f32[100]{extern}] : f32[100]  # Constant_big\n"),
        "the body's constant is saved by reference:\n{text}"
    );
    let path = std::env::temp_dir().join(format!("loop-{}.encore", std::process::id()));
    model.save(&path).unwrap();
    let back = Model::load(&path).unwrap();
    std::fs::remove_file(&path).ok();
    let s = Session::new(&back, CompileOptions::default()).unwrap();
    let out = s.run(&[]).unwrap();
    assert_eq!(out[0].1.as_f32().unwrap(), want);
}

/// Mean of one, two and three inputs (broadcasting), summed left to right and divided once;
/// integers are refused by dtype.
#[test]
fn mean_of_several_inputs() {
    let a = f32s(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let b = f32s(&[2], &[0.5, -1.0]);
    let c = f32s(&[2, 2], &[0.25, 0.0, 1.0, 1.0e-8]);
    assert_eq!(Case::new("Mean", 13, vec![a.clone()]).run1(), a);
    let y = Case::new("Mean", 13, vec![a.clone(), b.clone()]).run1();
    assert_eq!(y.as_f32().unwrap(), [0.75, 0.5, 1.75, 1.5]);
    let y = Case::new("Mean", 8, vec![a, b, c]).run1();
    let want: Vec<f32> = [
        (1.0f32, 0.5f32, 0.25f32),
        (2.0, -1.0, 0.0),
        (3.0, 0.5, 1.0),
        (4.0, -1.0, 1.0e-8),
    ]
    .iter()
    .map(|&(x, y, z)| (x + y + z) / 3.0)
    .collect();
    assert_eq!(y.as_f32().unwrap(), want);
    let e = Case::new("Mean", 13, vec![i64s(&[1], &[3]), i64s(&[1], &[4])])
        .run()
        .unwrap_err();
    assert!(e.contains("`n`") && e.contains("i64"), "{e}");
}

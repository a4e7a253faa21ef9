//! The importer decodes ONNX with its own prost messages (zero-copy `Bytes` for the weights);
//! `onnx-protobuf` (rust-protobuf generated code from the official onnx.proto) decodes the same
//! bytes independently. Every field the importer reads (opsets, graph inputs and outputs with
//! their types, nodes with their attributes, initializers with their data and external-data
//! entries) must come out equal, on every shared model and on built models with external data
//! and every attribute kind.

mod common;

use bytes::Bytes;
use common::*;
use frontend_onnx::proto as p;
use onnx_protobuf as o;
use onnx_protobuf::Message as _;
use serde_json::{json, Value};

fn f32_bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn hex(b: &[u8]) -> String {
    // Long weights are compared through a digest-like summary plus their length: a length and a
    // position-weighted sum catch a dropped, shifted or changed byte.
    let sum = b.iter().enumerate().fold(0u64, |s, (i, &x)| {
        s.wrapping_mul(1_000_003)
            .wrapping_add((i as u64 + 1) * x as u64)
    });
    format!("{}:{sum:x}", b.len())
}

// ---- the prost side --------------------------------------------------------------------

fn p_entries(e: &[p::StringStringEntryProto]) -> Value {
    json!(e.iter().map(|kv| [&kv.key, &kv.value]).collect::<Vec<_>>())
}

fn p_tensor(t: &p::TensorProto) -> Value {
    json!({
        "name": t.name, "dims": t.dims, "data_type": t.data_type,
        "raw": hex(&t.raw_data), "float": f32_bits(&t.float_data), "int32": t.int32_data,
        "int64": t.int64_data, "double": t.double_data.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        "uint64": t.uint64_data, "string": t.string_data.iter().map(|s| hex(s)).collect::<Vec<_>>(),
        "external": p_entries(&t.external_data), "location": t.data_location,
    })
}

fn p_type(t: &Option<p::TypeProto>) -> Value {
    let Some(p::type_proto::Value::TensorType(tt)) = t.as_ref().and_then(|t| t.value.as_ref())
    else {
        return Value::Null;
    };
    let dims: Option<Vec<Value>> = tt.shape.as_ref().map(|s| {
        s.dim
            .iter()
            .map(|d| match &d.value {
                Some(p::tensor_shape_proto::dimension::Value::DimValue(n)) => json!(n),
                Some(p::tensor_shape_proto::dimension::Value::DimParam(s)) => json!(s),
                None => Value::Null,
            })
            .collect()
    });
    json!({"elem": tt.elem_type, "dims": dims})
}

fn p_attr(a: &p::AttributeProto) -> Value {
    json!({
        "name": a.name, "type": a.r#type, "f": a.f.to_bits(), "i": a.i, "s": hex(&a.s),
        "t": a.t.as_ref().map(p_tensor), "g": a.g.as_ref().map(p_graph),
        "floats": f32_bits(&a.floats), "ints": a.ints,
        "strings": a.strings.iter().map(|s| hex(s)).collect::<Vec<_>>(),
        "tensors": a.tensors.iter().map(p_tensor).collect::<Vec<_>>(),
        "graphs": a.graphs.iter().map(p_graph).collect::<Vec<_>>(),
    })
}

fn p_graph(g: &p::GraphProto) -> Value {
    json!({
        "name": g.name,
        "inputs": g.input.iter().map(|v| json!([v.name, p_type(&v.r#type)])).collect::<Vec<_>>(),
        "outputs": g.output.iter().map(|v| json!([v.name, p_type(&v.r#type)])).collect::<Vec<_>>(),
        "value_info": g.value_info.iter().map(|v| json!([v.name, p_type(&v.r#type)])).collect::<Vec<_>>(),
        "nodes": g.node.iter().map(|n| json!({
            "name": n.name, "op": n.op_type, "domain": n.domain, "in": n.input, "out": n.output,
            "attrs": n.attribute.iter().map(p_attr).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "init": g.initializer.iter().map(p_tensor).collect::<Vec<_>>(),
    })
}

fn p_model(bytes: Bytes) -> Value {
    let m = frontend_onnx::decode_model(bytes).unwrap();
    json!({
        "ir_version": m.ir_version,
        "opsets": m.opset_import.iter().map(|o| json!([o.domain, o.version])).collect::<Vec<_>>(),
        "graph": m.graph.as_ref().map(p_graph),
    })
}

// ---- the rust-protobuf side -----------------------------------------------------------

fn o_entries(e: &[o::StringStringEntryProto]) -> Value {
    json!(e.iter().map(|kv| [&kv.key, &kv.value]).collect::<Vec<_>>())
}

fn o_tensor(t: &o::TensorProto) -> Value {
    json!({
        "name": t.name, "dims": t.dims, "data_type": t.data_type,
        "raw": hex(&t.raw_data), "float": f32_bits(&t.float_data), "int32": t.int32_data,
        "int64": t.int64_data, "double": t.double_data.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        "uint64": t.uint64_data, "string": t.string_data.iter().map(|s| hex(s)).collect::<Vec<_>>(),
        "external": o_entries(&t.external_data), "location": t.data_location.value(),
    })
}

fn o_type(t: &protobuf::MessageField<o::TypeProto>) -> Value {
    let Some(t) = t.as_ref().filter(|t| t.has_tensor_type()) else {
        return Value::Null;
    };
    let tt = t.tensor_type();
    let dims: Option<Vec<Value>> = tt.shape.as_ref().map(|s| {
        s.dim
            .iter()
            .map(|d| {
                if d.has_dim_value() {
                    json!(d.dim_value())
                } else if d.has_dim_param() {
                    json!(d.dim_param())
                } else {
                    Value::Null
                }
            })
            .collect()
    });
    json!({"elem": tt.elem_type, "dims": dims})
}

fn o_attr(a: &o::AttributeProto) -> Value {
    json!({
        "name": a.name, "type": a.type_.value(), "f": a.f.to_bits(), "i": a.i, "s": hex(&a.s),
        "t": a.t.as_ref().map(o_tensor), "g": a.g.as_ref().map(o_graph),
        "floats": f32_bits(&a.floats), "ints": a.ints,
        "strings": a.strings.iter().map(|s| hex(s)).collect::<Vec<_>>(),
        "tensors": a.tensors.iter().map(o_tensor).collect::<Vec<_>>(),
        "graphs": a.graphs.iter().map(o_graph).collect::<Vec<_>>(),
    })
}

fn o_graph(g: &o::GraphProto) -> Value {
    json!({
        "name": g.name,
        "inputs": g.input.iter().map(|v| json!([v.name, o_type(&v.type_)])).collect::<Vec<_>>(),
        "outputs": g.output.iter().map(|v| json!([v.name, o_type(&v.type_)])).collect::<Vec<_>>(),
        "value_info": g.value_info.iter().map(|v| json!([v.name, o_type(&v.type_)])).collect::<Vec<_>>(),
        "nodes": g.node.iter().map(|n| json!({
            "name": n.name, "op": n.op_type, "domain": n.domain, "in": n.input, "out": n.output,
            "attrs": n.attribute.iter().map(o_attr).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "init": g.initializer.iter().map(o_tensor).collect::<Vec<_>>(),
    })
}

fn o_model(bytes: &[u8]) -> Value {
    let m = o::ModelProto::parse_from_bytes(bytes).unwrap();
    json!({
        "ir_version": m.ir_version,
        "opsets": m.opset_import.iter().map(|o| json!([o.domain, o.version])).collect::<Vec<_>>(),
        "graph": m.graph.as_ref().map(o_graph),
    })
}

/// Compares the two decodings, naming the first field that differs.
fn same(what: &str, bytes: Bytes) {
    let (a, b) = (p_model(bytes.clone()), o_model(&bytes));
    if a != b {
        let (sa, sb) = (
            serde_json::to_string(&a).unwrap(),
            serde_json::to_string(&b).unwrap(),
        );
        let at = sa
            .bytes()
            .zip(sb.bytes())
            .position(|(x, y)| x != y)
            .unwrap_or(0);
        let from = at.saturating_sub(200);
        panic!(
            "{what}: the decoders differ at byte {at}:\nprost:        …{}\nonnx-protobuf: …{}",
            &sa[from..(at + 200).min(sa.len())],
            &sb[from..(at + 200).min(sb.len())]
        );
    }
    let nodes = a["graph"]["nodes"].as_array().map_or(0, |n| n.len());
    println!("{what}: {nodes} nodes decode the same");
}

#[test]
fn shared_models_decode_the_same() {
    let Some(dir) = models_dir() else {
        return;
    };
    let man = manifest(&dir);
    let models = man["models"].as_array().unwrap();
    assert!(models.len() >= 10);
    for m in models {
        let file = m["file"].as_str().unwrap();
        same(file, Bytes::from(std::fs::read(dir.join(file)).unwrap()));
    }
}

/// Built models: external data entries, every attribute kind, symbolic and unknown dims.
#[test]
fn built_models_decode_the_same() {
    let ext = p::TensorProto {
        name: "w".into(),
        dims: vec![2, 2],
        data_type: p::DataType::Float as i32,
        external_data: vec![
            p::StringStringEntryProto {
                key: "location".into(),
                value: "weights.bin".into(),
            },
            p::StringStringEntryProto {
                key: "offset".into(),
                value: "16".into(),
            },
        ],
        data_location: 1,
        ..Default::default()
    };
    let attrs = vec![
        attr_int("axis", -1),
        attr_ints("perm", &[0, 2, 1, 3]),
        attr_float("epsilon", 1e-12),
        attr_str("mode", "constant"),
        attr_tensor("value", i64_tensor("", &[3], &[1, -2, 3])),
        p::AttributeProto {
            name: "floats".into(),
            r#type: p::AttributeType::Floats as i32,
            floats: vec![0.5, f32::NAN, -0.0],
            ..Default::default()
        },
    ];
    let mut n = node("Custom", "/n", &["x", "w"], &["y"]);
    n.attribute = attrs;
    n.domain = "com.microsoft".into();
    n.doc_string = "not read by the importer".into();
    let m = xy(17)
        .domain("com.microsoft", 1)
        .init(ext)
        .init(f32_tensor("b", &[4], &[1.0, -2.5, 0.0, 3.0]))
        .init(i64_tensor("shape", &[2], &[0, -1]))
        .node(n);
    same("built", m.bytes());
}

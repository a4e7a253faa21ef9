//! A small emitter of ONNX nodes that names things the way `torch.onnx.export` does.
//!
//! Node names are `<scope>/<Op>`, `<scope>/<Op>_1`, … counted per scope and op type, and a node's
//! output is `<node name>_output_0`. Constants are `Constant` nodes with a `value` tensor
//! attribute, as the TorchScript exporter writes them, and weights are initializers with
//! `raw_data`. Reproducing the naming keeps models built here looking like real exports to the
//! importer and to anyone reading a dump.

use std::collections::HashMap;

use bytes::Bytes;
use frontend_onnx::proto::{AttributeProto, AttributeType, DataType, NodeProto, TensorProto};

/// Collects the nodes and initializers of one graph.
#[derive(Default)]
pub(crate) struct Emitter {
    pub(crate) nodes: Vec<NodeProto>,
    pub(crate) initializers: Vec<TensorProto>,
    per_scope: HashMap<(String, String), usize>,
    /// Counters for the exporter's unscoped names (`Constant_12` → `onnx::Unsqueeze_34`).
    anon_node: usize,
    anon_value: usize,
}

/// An attribute, built with the helpers below.
pub(crate) type Attr = AttributeProto;

pub(crate) fn attr_int(name: &str, v: i64) -> Attr {
    AttributeProto {
        name: name.into(),
        r#type: AttributeType::Int as i32,
        i: v,
        ..Default::default()
    }
}

pub(crate) fn attr_float(name: &str, v: f32) -> Attr {
    AttributeProto {
        name: name.into(),
        r#type: AttributeType::Float as i32,
        f: v,
        ..Default::default()
    }
}

pub(crate) fn attr_ints(name: &str, v: &[i64]) -> Attr {
    AttributeProto {
        name: name.into(),
        r#type: AttributeType::Ints as i32,
        ints: v.to_vec(),
        ..Default::default()
    }
}

pub(crate) fn attr_tensor(name: &str, t: TensorProto) -> Attr {
    AttributeProto {
        name: name.into(),
        r#type: AttributeType::Tensor as i32,
        t: Some(t),
        ..Default::default()
    }
}

/// A tensor literal with its data in `raw_data` (little-endian, as ONNX requires).
pub(crate) fn raw_tensor(name: &str, dtype: DataType, dims: &[i64], raw: Bytes) -> TensorProto {
    TensorProto {
        dims: dims.to_vec(),
        data_type: dtype as i32,
        name: name.into(),
        raw_data: raw,
        ..Default::default()
    }
}

pub(crate) fn i64_tensor(dims: &[i64], values: &[i64]) -> TensorProto {
    let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    raw_tensor("", DataType::Int64, dims, Bytes::from(raw))
}

pub(crate) fn i32_tensor(dims: &[i64], values: &[i32]) -> TensorProto {
    let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    raw_tensor("", DataType::Int32, dims, Bytes::from(raw))
}

pub(crate) fn f32_tensor(dims: &[i64], values: &[f32]) -> TensorProto {
    let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    raw_tensor("", DataType::Float, dims, Bytes::from(raw))
}

impl Emitter {
    fn next_name(&mut self, scope: &str, op: &str) -> String {
        let k = self
            .per_scope
            .entry((scope.to_string(), op.to_string()))
            .or_insert(0);
        let name = if *k == 0 {
            format!("{scope}/{op}")
        } else {
            format!("{scope}/{op}_{k}")
        };
        *k += 1;
        name
    }

    /// Emits `op` in `scope` and returns the name of its (single) output.
    pub(crate) fn op(
        &mut self,
        scope: &str,
        op: &str,
        inputs: &[&str],
        attrs: Vec<Attr>,
    ) -> String {
        let name = self.next_name(scope, op);
        let out = format!("{name}_output_0");
        self.push(name, op, inputs, &out, attrs);
        out
    }

    /// Emits `op` writing to a given output name (graph outputs such as `last_hidden_state`).
    pub(crate) fn op_to(
        &mut self,
        scope: &str,
        op: &str,
        inputs: &[&str],
        out: &str,
        attrs: Vec<Attr>,
    ) -> String {
        let name = self.next_name(scope, op);
        self.push(name, op, inputs, out, attrs);
        out.to_string()
    }

    fn push(&mut self, name: String, op: &str, inputs: &[&str], out: &str, attrs: Vec<Attr>) {
        self.nodes.push(NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: vec![out.to_string()],
            name,
            op_type: op.into(),
            attribute: attrs,
            ..Default::default()
        });
    }

    /// A scoped `Constant` node, as the exporter writes for literals in module code.
    pub(crate) fn constant(&mut self, scope: &str, value: TensorProto) -> String {
        self.op(scope, "Constant", &[], vec![attr_tensor("value", value)])
    }

    /// An unscoped `Constant` node (`Constant_N` → `onnx::<Consumer>_M`), as the exporter writes
    /// for constants it created itself, e.g. Unsqueeze axes and buffers such as `position_ids`.
    pub(crate) fn anon_constant(&mut self, consumer: &str, value: TensorProto) -> String {
        let name = format!("Constant_{}", self.anon_node);
        let out = format!("onnx::{consumer}_{}", self.anon_value);
        self.anon_node += 1;
        self.anon_value += 1;
        self.push(
            name,
            "Constant",
            &[],
            &out,
            vec![attr_tensor("value", value)],
        );
        out
    }

    pub(crate) fn scalar_i64(&mut self, scope: &str, v: i64) -> String {
        self.constant(scope, i64_tensor(&[], &[v]))
    }

    pub(crate) fn vec_i64(&mut self, scope: &str, v: &[i64]) -> String {
        self.constant(scope, i64_tensor(&[v.len() as i64], v))
    }

    pub(crate) fn scalar_f32(&mut self, scope: &str, v: f32) -> String {
        self.constant(scope, f32_tensor(&[], &[v]))
    }

    /// `Unsqueeze(x, axes=[0])` with the axes as an exporter-made constant.
    pub(crate) fn unsqueeze0(&mut self, scope: &str, x: &str) -> String {
        let axes = self.anon_constant("Unsqueeze", i64_tensor(&[1], &[0]));
        self.op(scope, "Unsqueeze", &[x, &axes], vec![])
    }

    /// `Gather(Shape(x), axis_index)`: one dimension of `x` as an int64 scalar.
    pub(crate) fn dim_of(&mut self, scope: &str, x: &str, index: i64) -> String {
        let shape = self.op(scope, "Shape", &[x], vec![]);
        let idx = self.scalar_i64(scope, index);
        self.op(scope, "Gather", &[&shape, &idx], vec![attr_int("axis", 0)])
    }

    pub(crate) fn initializer(&mut self, t: TensorProto) -> String {
        let name = t.name.clone();
        self.initializers.push(t);
        name
    }

    /// A fresh exporter-style initializer name, `onnx::MatMul_N`, for a transposed Linear weight.
    pub(crate) fn anon_value_name(&mut self, consumer: &str) -> String {
        let out = format!("onnx::{consumer}_{}", self.anon_value);
        self.anon_value += 1;
        out
    }
}

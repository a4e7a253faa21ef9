//! Shared test helpers: finding the shared models, and building small ONNX models in code.
#![allow(dead_code)]

use std::path::PathBuf;

use bytes::Bytes;
use frontend_onnx::proto::{
    tensor_shape_proto::{dimension, Dimension},
    type_proto, AttributeProto, AttributeType, DataType, GraphProto, ModelProto, NodeProto,
    OperatorSetIdProto, TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
};
use frontend_onnx::ImportError;
use prost::Message;

/// The shared models folder: `$ENCORE_MODELS`, else `../shared/models` beside the workspace.
/// `None` (after a loud message) when it is absent outside CI; a panic when absent on CI.
pub fn models_dir() -> Option<PathBuf> {
    let dir = match std::env::var_os("ENCORE_MODELS") {
        Some(d) => PathBuf::from(d),
        None => {
            let manifest = std::fs::canonicalize(env!("CARGO_MANIFEST_DIR")).expect("crate dir");
            manifest.join("../../../shared/models")
        }
    };
    if dir.join("manifest.json").is_file() {
        return Some(dir);
    }
    if std::env::var_os("CI").is_some() {
        panic!(
            "shared models not found at {} (set ENCORE_MODELS)",
            dir.display()
        );
    }
    {
        // Straight to stderr: the harness hides eprintln! of passing tests.
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "SKIP: shared models not found at {} (set ENCORE_MODELS); model tests did not run",
            dir.display()
        );
    }
    None
}

pub fn manifest(dir: &std::path::Path) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join("manifest.json")).expect("read manifest.json");
    serde_json::from_str(&text).expect("parse manifest.json")
}

/// A dimension of a value info: a size or a symbol, or unknown.
pub enum D {
    N(i64),
    P(&'static str),
    Unknown,
}

pub fn value_info(name: &str, elem: DataType, dims: Option<Vec<D>>) -> ValueInfoProto {
    let shape = dims.map(|dims| TensorShapeProto {
        dim: dims
            .into_iter()
            .map(|d| Dimension {
                value: match d {
                    D::N(n) => Some(dimension::Value::DimValue(n)),
                    D::P(p) => Some(dimension::Value::DimParam(p.to_string())),
                    D::Unknown => None,
                },
                denotation: String::new(),
            })
            .collect(),
    });
    ValueInfoProto {
        name: name.to_string(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: elem as i32,
                shape,
            })),
            denotation: String::new(),
        }),
        doc_string: String::new(),
    }
}

pub fn node(op: &str, name: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
    NodeProto {
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        name: name.to_string(),
        op_type: op.to_string(),
        ..Default::default()
    }
}

pub fn with_attr(mut n: NodeProto, a: AttributeProto) -> NodeProto {
    n.attribute.push(a);
    n
}

pub fn attr_int(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: AttributeType::Int as i32,
        i: v,
        ..Default::default()
    }
}

pub fn attr_ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: AttributeType::Ints as i32,
        ints: v.to_vec(),
        ..Default::default()
    }
}

pub fn attr_float(name: &str, v: f32) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: AttributeType::Float as i32,
        f: v,
        ..Default::default()
    }
}

pub fn attr_str(name: &str, v: &str) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: AttributeType::String as i32,
        s: Bytes::copy_from_slice(v.as_bytes()),
        ..Default::default()
    }
}

pub fn attr_tensor(name: &str, t: TensorProto) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: AttributeType::Tensor as i32,
        t: Some(t),
        ..Default::default()
    }
}

/// A tensor with its data in `raw_data`.
pub fn raw_tensor(name: &str, dt: DataType, dims: &[i64], raw: Vec<u8>) -> TensorProto {
    TensorProto {
        name: name.into(),
        data_type: dt as i32,
        dims: dims.to_vec(),
        raw_data: Bytes::from(raw),
        ..Default::default()
    }
}

pub fn f32_tensor(name: &str, dims: &[i64], v: &[f32]) -> TensorProto {
    raw_tensor(
        name,
        DataType::Float,
        dims,
        v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    )
}

pub fn i64_tensor(name: &str, dims: &[i64], v: &[i64]) -> TensorProto {
    raw_tensor(
        name,
        DataType::Int64,
        dims,
        v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    )
}

/// A model under construction: default domain at `opset`, plus whatever the test adds.
pub struct Model {
    pub m: ModelProto,
}

impl Model {
    pub fn new(opset: i64) -> Model {
        Model {
            m: ModelProto {
                ir_version: 8,
                opset_import: vec![OperatorSetIdProto {
                    domain: String::new(),
                    version: opset,
                }],
                graph: Some(GraphProto {
                    name: "test".into(),
                    ..Default::default()
                }),
                ..Default::default()
            },
        }
    }

    pub fn g(&mut self) -> &mut GraphProto {
        self.m.graph.as_mut().expect("graph")
    }

    pub fn domain(mut self, domain: &str, version: i64) -> Model {
        self.m.opset_import.push(OperatorSetIdProto {
            domain: domain.into(),
            version,
        });
        self
    }

    pub fn input(mut self, vi: ValueInfoProto) -> Model {
        self.g().input.push(vi);
        self
    }

    pub fn output(mut self, vi: ValueInfoProto) -> Model {
        self.g().output.push(vi);
        self
    }

    pub fn value_info(mut self, vi: ValueInfoProto) -> Model {
        self.g().value_info.push(vi);
        self
    }

    pub fn init(mut self, t: TensorProto) -> Model {
        self.g().initializer.push(t);
        self
    }

    pub fn node(mut self, n: NodeProto) -> Model {
        self.g().node.push(n);
        self
    }

    pub fn bytes(&self) -> Bytes {
        Bytes::from(self.m.encode_to_vec())
    }

    pub fn import(&self) -> Result<ir::Graph, ImportError> {
        frontend_onnx::import_bytes(self.bytes(), None)
    }
}

/// An f32 input `x` of shape [batch, 4] and the output `y` with unknown shape.
pub fn xy(opset: i64) -> Model {
    Model::new(opset)
        .input(value_info(
            "x",
            DataType::Float,
            Some(vec![D::P("batch"), D::N(4)]),
        ))
        .output(value_info("y", DataType::Float, None))
}

/// The ops of a graph by text-form name, in print order.
pub fn op_names(g: &ir::Graph) -> Vec<&'static str> {
    g.topo_order()
        .expect("acyclic")
        .into_iter()
        .map(|id| g.node(id).op.name())
        .collect()
}

pub fn count(g: &ir::Graph, op: &str) -> usize {
    op_names(g).into_iter().filter(|n| *n == op).count()
}

/// The node that produces graph output `name`.
pub fn output_node<'g>(g: &'g ir::Graph, name: &str) -> &'g ir::Node {
    let o = g
        .outputs()
        .iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no graph output {name}"))
        .1;
    g.node(o.node)
}

/// The path of this process's mapping that contains `addr` (empty for anonymous memory), from
/// /proc/self/maps; `None` when no mapping contains it or the file is unreadable.
pub fn mapping_containing(addr: usize) -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    for line in maps.lines() {
        let mut parts = line.split_whitespace();
        let range = parts.next()?;
        let (lo, hi) = range.split_once('-')?;
        let lo = usize::from_str_radix(lo, 16).ok()?;
        let hi = usize::from_str_radix(hi, 16).ok()?;
        if (lo..hi).contains(&addr) {
            return Some(parts.nth(4).unwrap_or("").to_string());
        }
    }
    None
}

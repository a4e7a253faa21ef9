//! Structural mutations of an ONNX model, shared by the importer's robustness test and the
//! runtime's (which compiles and runs the mutants): rewired inputs, deleted nodes, swapped op
//! types, dropped or retyped attributes, wrong initializer dims, appended inputs.
#![allow(dead_code)]

use frontend_onnx::proto::{AttributeType, ModelProto};

pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const OPS: &[&str] = &[
    "Add",
    "Softmax",
    "Unsqueeze",
    "Reshape",
    "LayerNormalization",
    "Gather",
    "Concat",
    "Slice",
    "Constant",
    "Where",
    "Cast",
    "Transpose",
    "MatMul",
    "Gemm",
    "Dropout",
    "Identity",
    "Max",
    "ReduceMean",
    "QuantizeLinear",
    "MatMulInteger",
    "Squeeze",
    "Expand",
    "CumSum",
];

pub fn mutate(m: &mut ModelProto, rng: &mut Rng) -> String {
    let g = m.graph.as_mut().unwrap();
    let names: Vec<String> = g
        .node
        .iter()
        .flat_map(|n| n.output.clone())
        .chain(g.initializer.iter().map(|t| t.name.clone()))
        .collect();
    let k = rng.below(g.node.len());
    match rng.below(7) {
        0 => {
            let n = &mut g.node[k];
            if !n.input.is_empty() {
                let i = rng.below(n.input.len());
                n.input[i] = names[rng.below(names.len())].clone();
            }
            format!("rewire an input of node {k}")
        }
        1 => {
            g.node.remove(k);
            format!("delete node {k}")
        }
        2 => {
            let op = OPS[rng.below(OPS.len())];
            g.node[k].op_type = op.into();
            format!("make node {k} a {op}")
        }
        3 => {
            g.node[k].attribute.clear();
            format!("drop the attributes of node {k}")
        }
        4 => {
            for a in &mut g.node[k].attribute {
                a.r#type = AttributeType::Ints as i32;
                a.ints = vec![rng.below(5) as i64 - 2];
            }
            format!("retype the attributes of node {k}")
        }
        5 => {
            let i = rng.below(g.initializer.len());
            let t = &mut g.initializer[i];
            t.dims.push(rng.below(3) as i64);
            format!("add a dim to initializer {i}")
        }
        _ => {
            let n = &mut g.node[k];
            n.input.push(String::new());
            n.input.push(names[rng.below(names.len())].clone());
            format!("append inputs to node {k}")
        }
    }
}

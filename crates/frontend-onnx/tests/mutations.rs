//! Structural mutations of a real model (rewired inputs, deleted nodes, swapped op types,
//! dropped or retyped attributes, wrong initializer dims, flipped bytes) give `Ok` or a typed
//! error, never a panic.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};

use frontend_onnx::proto::{AttributeType, ModelProto};
use prost::Message;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
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

fn mutate(m: &mut ModelProto, rng: &mut Rng) -> String {
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

#[test]
fn mutated_models_never_panic() {
    let Some(dir) = common::models_dir() else {
        return;
    };
    // More rounds for a longer local run: MUTATION_ROUNDS=5000.
    let rounds: usize = std::env::var("MUTATION_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(150);
    for file in [
        "tiny/distilbert/model.onnx",
        "tiny/bert/model.dynamic.onnx",
        "tiny/xlm-roberta/model.onnx",
    ] {
        let bytes = std::fs::read(dir.join(file)).unwrap();
        let base = frontend_onnx::decode_model(bytes.clone().into()).unwrap();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let (mut ok, mut err) = (0, 0);
        for round in 0..rounds {
            let mut m = base.clone();
            let what: Vec<String> = (0..1 + rng.below(3))
                .map(|_| mutate(&mut m, &mut rng))
                .collect();
            let encoded = m.encode_to_vec();
            let r = catch_unwind(AssertUnwindSafe(|| {
                frontend_onnx::import_bytes(encoded.into(), None)
            }));
            match r {
                Ok(Ok(_)) => ok += 1,
                Ok(Err(_)) => err += 1,
                Err(_) => panic!("{file}, round {round}: import panicked after {what:?}"),
            }
        }
        // Flipped bytes in the encoded file.
        for round in 0..rounds {
            let mut b = bytes.clone();
            for _ in 0..1 + rng.below(4) {
                let i = rng.below(b.len());
                b[i] ^= 1 << rng.below(8);
            }
            let r = catch_unwind(AssertUnwindSafe(|| {
                frontend_onnx::import_bytes(b.into(), None)
            }));
            assert!(r.is_ok(), "{file}, byte round {round}: import panicked");
        }
        eprintln!("{file}: {ok} mutants imported, {err} rejected");
        assert!(
            err > 0,
            "{file}: no mutation was caught, the mutations do nothing"
        );
    }
}

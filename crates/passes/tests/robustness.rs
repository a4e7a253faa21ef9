//! Declutter on corrupted graphs: errors are fine, panics are not. The graphs are the tiny
//! BERT and DistilBERT models with one deterministic random mutation each: an integer constant
//! (reshape target, axis, index) replaced, a permutation scrambled, or an input rewired to an
//! earlier value.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};

use ir::{fixed_shape, DType, Graph, NodeId, Op, Tensor, TensorType};
use passes::{Pipeline, RunOptions};

struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn int(&mut self) -> i64 {
        const SPECIAL: [i64; 8] = [i64::MIN, i64::MAX, -1, 0, 1, 2, 1 << 40, -(1 << 40)];
        if self.below(3) == 0 {
            SPECIAL[self.below(SPECIAL.len())]
        } else {
            self.below(300) as i64 - 100
        }
    }
}

fn mutate(g: &mut Graph, rng: &mut Lcg) -> String {
    let order = g.topo_order().unwrap();
    let small_ints: Vec<NodeId> = order
        .iter()
        .copied()
        .filter(|&id| matches!(&g.node(id).op, Op::Const { value } if value.dtype() == DType::I64 && value.len() <= 16 && value.has_data()))
        .collect();
    let transposes: Vec<NodeId> = order
        .iter()
        .copied()
        .filter(|&id| matches!(g.node(id).op, Op::Transpose { .. }))
        .collect();
    match rng.below(3) {
        0 if !small_ints.is_empty() => {
            let id = small_ints[rng.below(small_ints.len())];
            let len = if rng.below(4) == 0 {
                rng.below(5)
            } else {
                g.const_value(id.into()).unwrap().len()
            };
            let shape = if len == 1 && rng.below(2) == 0 {
                vec![]
            } else {
                vec![len]
            };
            let t = Tensor::from_vec(
                shape.clone(),
                (0..len).map(|_| rng.int()).collect::<Vec<i64>>(),
            );
            let node = g.node_mut(id);
            let what = format!("const {} := {:?}", node.name, t);
            node.op = Op::Const { value: t };
            node.outputs = vec![TensorType::new(DType::I64, fixed_shape(&shape))];
            what
        }
        1 if !transposes.is_empty() => {
            let id = transposes[rng.below(transposes.len())];
            let perm: Vec<i64> = (0..rng.below(6)).map(|_| rng.below(7) as i64 - 2).collect();
            let node = g.node_mut(id);
            node.op = Op::Transpose { perm: perm.clone() };
            format!("transpose {} := {perm:?}", node.name)
        }
        _ => {
            let i = 1 + rng.below(order.len() - 1);
            let id = order[i];
            let ins = g.node_inputs(id);
            if ins.is_empty() {
                return "nothing".into();
            }
            let slot = rng.below(ins.len());
            let from = order[rng.below(i)];
            g.set_node_input(id, slot, from.into()).unwrap();
            format!("{}.input[{slot}] := {}", g.node(id).name, g.node(from).name)
        }
    }
}

#[test]
fn declutter_never_panics_on_corrupted_models() {
    let Some(dir) = common::models_dir("declutter_never_panics_on_corrupted_models") else {
        return;
    };
    let mut rng = Lcg(20261130);
    let (mut ok, mut err) = (0, 0);
    for rel in [
        "tiny/bert/model.onnx",
        "tiny/distilbert/model.onnx",
        "tiny/xlm-roberta/model.onnx",
    ] {
        let g0 = frontend_onnx::import_path(dir.join(rel)).unwrap();
        for case in 0..150 {
            let mut g = g0.clone();
            let what = mutate(&mut g, &mut rng);
            let r = catch_unwind(AssertUnwindSafe(|| {
                Pipeline::declutter()
                    .run(&mut g, &mut RunOptions::default())
                    .map(|_| ())
            }));
            match r {
                Ok(Ok(())) => ok += 1,
                Ok(Err(_)) => err += 1,
                Err(_) => panic!("{rel} case {case}: declutter panicked after {what}"),
            }
        }
    }
    eprintln!("corrupted models: {ok} decluttered, {err} rejected with an error");
    assert!(
        err > 0,
        "no mutation was caught: the test is not exercising anything"
    );
}

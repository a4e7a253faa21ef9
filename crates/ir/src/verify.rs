//! The verifier: structural checks that every pass must preserve.

use std::collections::HashSet;

use crate::{Graph, IrError, Op};

impl Graph {
    /// Checks that the graph is well formed: acyclic; every node's inputs are contiguous, in
    /// range and within the op's arity; every node has as many output types as its op has
    /// outputs; constants agree with their declared type; graph inputs are input nodes; output
    /// names are unique.
    pub fn verify(&self) -> Result<(), IrError> {
        let order = self.topo_order()?;
        let invalid = |node: &str, msg: String| IrError::Verify {
            node: node.to_string(),
            message: msg,
        };
        for id in order {
            let node = self.node(id);
            let inputs = self.node_inputs(id);
            let (lo, hi) = node.op.arity();
            if inputs.len() < lo || inputs.len() > hi {
                return Err(invalid(
                    &node.name,
                    format!("{} has {} inputs", node.op.name(), inputs.len()),
                ));
            }
            let mut slots: Vec<usize> = self
                .petgraph()
                .edges_directed(id, petgraph::Direction::Incoming)
                .map(|e| e.weight().dst_slot)
                .collect();
            slots.sort();
            if slots.iter().enumerate().any(|(i, &s)| i != s) {
                return Err(invalid(
                    &node.name,
                    format!("input slots {slots:?} are not 0..n"),
                ));
            }
            for o in &inputs {
                if o.slot >= self.node(o.node).outputs.len() {
                    return Err(invalid(
                        &node.name,
                        format!(
                            "reads output {} of `{}`, which has fewer",
                            o.slot,
                            self.node(o.node).name
                        ),
                    ));
                }
            }
            if node.outputs.len() != node.op.num_outputs() {
                return Err(invalid(&node.name, "wrong number of output types".into()));
            }
            if let Op::Const { value } = &node.op {
                let ty = &node.outputs[0];
                let shape_ok = ty.shape.as_ref().is_some_and(|s| {
                    s.len() == value.shape().len()
                        && s.iter()
                            .zip(value.shape())
                            .all(|(d, &n)| d.as_fixed() == Some(n))
                });
                if ty.dtype != value.dtype() || !shape_ok {
                    return Err(invalid(
                        &node.name,
                        format!("constant {:?} declared as {ty}", value),
                    ));
                }
            }
        }
        for &i in self.inputs() {
            if !matches!(self.node(i).op, Op::Input { .. }) {
                return Err(invalid(
                    &self.node(i).name,
                    "graph input is not an input node".into(),
                ));
            }
        }
        let mut seen = HashSet::new();
        for (name, o) in self.outputs() {
            if !seen.insert(name) {
                return Err(IrError::Verify {
                    node: name.clone(),
                    message: "duplicate graph output name".into(),
                });
            }
            if !self.contains(o.node) || o.slot >= self.node(o.node).outputs.len() {
                return Err(IrError::Verify {
                    node: name.clone(),
                    message: "graph output reads a missing value".into(),
                });
            }
        }
        Ok(())
    }
}

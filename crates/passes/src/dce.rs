//! Dead code elimination.

use std::collections::HashSet;

use ir::{Graph, NodeId};

use crate::{Pass, PassError};

/// Removes every node that no graph output depends on. Graph inputs stay, used or not: they are
/// the model's signature.
pub struct DeadCodeElimination;

impl Pass for DeadCodeElimination {
    fn name(&self) -> &'static str {
        "DeadCodeElimination"
    }

    fn run(&self, graph: &mut Graph, _ctx: &mut crate::PassContext<'_>) -> Result<bool, PassError> {
        Ok(remove_dead(graph) > 0)
    }
}

/// Removes the nodes not reachable backwards from the outputs; returns how many.
pub(crate) fn remove_dead(graph: &mut Graph) -> usize {
    let mut live: HashSet<NodeId> = HashSet::new();
    let mut stack: Vec<NodeId> = graph.outputs().iter().map(|(_, o)| o.node).collect();
    stack.extend(graph.inputs().iter().copied());
    while let Some(id) = stack.pop() {
        if live.insert(id) {
            for o in graph.node_inputs(id) {
                if !live.contains(&o.node) {
                    stack.push(o.node);
                }
            }
        }
    }
    let dead: Vec<NodeId> = graph.node_ids().filter(|id| !live.contains(id)).collect();
    for &id in &dead {
        graph.remove_node(id);
    }
    dead.len()
}

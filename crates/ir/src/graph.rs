//! The graph: nodes (an op, a name, output types) connected by wires, stored in a petgraph
//! `StableDiGraph` so that node ids survive removals during rewriting.

use std::collections::{BTreeSet, HashMap};

use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use petgraph::visit::EdgeRef;
use petgraph::Direction;

use crate::{IrError, Op, Tensor, TensorType};

/// A node id. Stable across removals of other nodes.
pub type NodeId = NodeIndex<u32>;

/// One output of one node: the unit of data flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Outlet {
    pub node: NodeId,
    pub slot: usize,
}

impl Outlet {
    pub fn new(node: NodeId, slot: usize) -> Outlet {
        Outlet { node, slot }
    }
}

impl From<NodeId> for Outlet {
    fn from(node: NodeId) -> Outlet {
        Outlet { node, slot: 0 }
    }
}

/// A node: its op, the name it had in the source model (for error messages and dumps), and the
/// type of each output.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub op: Op,
    pub name: String,
    pub outputs: Vec<TensorType>,
}

/// An edge from output `src_slot` of its source to input `dst_slot` of its target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wire {
    pub src_slot: usize,
    pub dst_slot: usize,
}

/// A dataflow graph of ops.
///
/// ```
/// use ir::{BinaryOp, DType, Dim, Graph, Op, TensorType};
/// let mut g = Graph::new();
/// let t = TensorType::new(DType::F32, vec![Dim::sym("B"), Dim::fixed(4)]);
/// let x = g.add_input("x", t.clone());
/// let y = g.add_node(Op::Binary(BinaryOp::Add), "add", &[x, x], vec![t]).unwrap();
/// g.set_output("y", y.into());
/// g.verify().unwrap();
/// assert_eq!(g.consumers(x).len(), 2);
/// ```
#[derive(Clone, Debug, Default)]
pub struct Graph {
    graph: StableDiGraph<Node, Wire>,
    /// Graph inputs (nodes holding [`Op::Input`]) in declaration order.
    inputs: Vec<NodeId>,
    /// Named graph outputs in declaration order.
    outputs: Vec<(String, Outlet)>,
}

/// Structural equality: the same nodes (op, name, output types) in the same order of
/// [`Graph::topo_order`] (the order the text form prints), wired the same way, with the same
/// inputs and named outputs, whatever the node ids (ids depend on the history of rewrites, not
/// on what the graph computes). Graphs with a cycle are equal to nothing. This is what lets an
/// op that holds a graph (the body of [`Op::Loop`]) compare as ops do.
impl PartialEq for Graph {
    fn eq(&self, other: &Graph) -> bool {
        let (Ok(a), Ok(b)) = (self.topo_order(), other.topo_order()) else {
            return false;
        };
        if a.len() != b.len()
            || self.inputs.len() != other.inputs.len()
            || self.outputs.len() != other.outputs.len()
        {
            return false;
        }
        let number = |order: &[NodeId]| -> HashMap<NodeId, usize> {
            order.iter().enumerate().map(|(i, &n)| (n, i)).collect()
        };
        let (na, nb) = (number(&a), number(&b));
        let renumber = |num: &HashMap<NodeId, usize>, o: Outlet| (num[&o.node], o.slot);
        let same_nodes = a.iter().zip(&b).all(|(&x, &y)| {
            self.graph[x] == other.graph[y] && {
                let ix = self.node_inputs(x);
                let iy = other.node_inputs(y);
                ix.len() == iy.len()
                    && ix
                        .iter()
                        .zip(&iy)
                        .all(|(&p, &q)| renumber(&na, p) == renumber(&nb, q))
            }
        });
        same_nodes
            && self
                .inputs
                .iter()
                .zip(&other.inputs)
                .all(|(x, y)| na[x] == nb[y])
            && self
                .outputs
                .iter()
                .zip(&other.outputs)
                .all(|((n1, o1), (n2, o2))| n1 == n2 && renumber(&na, *o1) == renumber(&nb, *o2))
    }
}

impl Graph {
    pub fn new() -> Graph {
        Graph::default()
    }

    /// Adds a graph input named `name`.
    pub fn add_input(&mut self, name: &str, ty: TensorType) -> Outlet {
        let id = self.graph.add_node(Node {
            op: Op::Input {
                name: name.to_string(),
            },
            name: name.to_string(),
            outputs: vec![ty],
        });
        self.inputs.push(id);
        id.into()
    }

    /// Adds a constant node.
    pub fn add_const(&mut self, name: &str, value: Tensor) -> Outlet {
        let ty = TensorType::new(
            value.dtype(),
            value
                .shape()
                .iter()
                .map(|&d| crate::Dim::fixed(d))
                .collect(),
        );
        let id = self.graph.add_node(Node {
            op: Op::Const { value },
            name: name.to_string(),
            outputs: vec![ty],
        });
        id.into()
    }

    /// Adds a node fed by `inputs`. Checks the op's arity, the input outlets and the number of
    /// output types.
    pub fn add_node(
        &mut self,
        op: Op,
        name: &str,
        inputs: &[Outlet],
        outputs: Vec<TensorType>,
    ) -> Result<NodeId, IrError> {
        let (lo, hi) = op.arity();
        if inputs.len() < lo || inputs.len() > hi {
            return Err(IrError::Arity {
                node: name.to_string(),
                op: op.name(),
                expected: if lo == hi {
                    lo.to_string()
                } else if hi == usize::MAX {
                    format!("at least {lo}")
                } else {
                    format!("{lo} to {hi}")
                },
                actual: inputs.len(),
            });
        }
        if outputs.len() != op.num_outputs() {
            return Err(IrError::Invalid(format!(
                "node `{name}` ({}): {} output types given, the op has {}",
                op.name(),
                outputs.len(),
                op.num_outputs()
            )));
        }
        for i in inputs {
            self.check_outlet(*i)?;
        }
        let id = self.graph.add_node(Node {
            op,
            name: name.to_string(),
            outputs,
        });
        for (dst_slot, i) in inputs.iter().enumerate() {
            self.graph.add_edge(
                i.node,
                id,
                Wire {
                    src_slot: i.slot,
                    dst_slot,
                },
            );
        }
        Ok(id)
    }

    fn check_outlet(&self, o: Outlet) -> Result<(), IrError> {
        let node = self
            .graph
            .node_weight(o.node)
            .ok_or_else(|| IrError::Invalid(format!("node {} does not exist", o.node.index())))?;
        if o.slot >= node.outputs.len() {
            return Err(IrError::Invalid(format!(
                "node `{}` has no output {}",
                node.name, o.slot
            )));
        }
        Ok(())
    }

    /// Declares (or replaces) the graph output `name`.
    pub fn set_output(&mut self, name: &str, outlet: Outlet) {
        if let Some(o) = self.outputs.iter_mut().find(|(n, _)| n == name) {
            o.1 = outlet;
        } else {
            self.outputs.push((name.to_string(), outlet));
        }
    }

    pub fn inputs(&self) -> &[NodeId] {
        &self.inputs
    }

    pub fn outputs(&self) -> &[(String, Outlet)] {
        &self.outputs
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.graph[id]
    }

    pub fn node_mut(&mut self, id: NodeId) -> &mut Node {
        &mut self.graph[id]
    }

    pub fn contains(&self, id: NodeId) -> bool {
        self.graph.contains_node(id)
    }

    pub fn node_count(&self) -> usize {
        self.graph.node_count()
    }

    /// All node ids in insertion order.
    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.graph.node_indices()
    }

    /// The type of an outlet.
    pub fn outlet_type(&self, o: Outlet) -> &TensorType {
        &self.graph[o.node].outputs[o.slot]
    }

    /// The outlets feeding node `id`, in input order.
    pub fn node_inputs(&self, id: NodeId) -> Vec<Outlet> {
        let mut ins: Vec<(usize, Outlet)> = self
            .graph
            .edges_directed(id, Direction::Incoming)
            .map(|e| {
                (
                    e.weight().dst_slot,
                    Outlet::new(e.source(), e.weight().src_slot),
                )
            })
            .collect();
        ins.sort_by_key(|(slot, _)| *slot);
        ins.into_iter().map(|(_, o)| o).collect()
    }

    /// The `(node, input slot)` pairs reading `outlet`, in a deterministic order.
    pub fn consumers(&self, outlet: Outlet) -> Vec<(NodeId, usize)> {
        let mut v: Vec<(NodeId, usize)> = self
            .graph
            .edges_directed(outlet.node, Direction::Outgoing)
            .filter(|e| e.weight().src_slot == outlet.slot)
            .map(|e| (e.target(), e.weight().dst_slot))
            .collect();
        v.sort();
        v
    }

    /// Whether `outlet` is a graph output.
    pub fn is_graph_output(&self, outlet: Outlet) -> bool {
        self.outputs.iter().any(|(_, o)| *o == outlet)
    }

    /// The constant value of an outlet, when it is produced by an [`Op::Const`] node.
    pub fn const_value(&self, outlet: Outlet) -> Option<&Tensor> {
        match &self.graph[outlet.node].op {
            Op::Const { value } if outlet.slot == 0 => Some(value),
            _ => None,
        }
    }

    /// Makes every reader of `old` (nodes and graph outputs) read `new` instead.
    pub fn replace_uses(&mut self, old: Outlet, new: Outlet) -> Result<(), IrError> {
        self.check_outlet(new)?;
        let edges: Vec<_> = self
            .graph
            .edges_directed(old.node, Direction::Outgoing)
            .filter(|e| e.weight().src_slot == old.slot)
            .map(|e| (e.id(), e.target(), *e.weight()))
            .collect();
        for (eid, target, w) in edges {
            self.graph.remove_edge(eid);
            self.graph.add_edge(
                new.node,
                target,
                Wire {
                    src_slot: new.slot,
                    dst_slot: w.dst_slot,
                },
            );
        }
        for o in self.outputs.iter_mut() {
            if o.1 == old {
                o.1 = new;
            }
        }
        Ok(())
    }

    /// Rewires input `slot` of node `id` to read `from`.
    pub fn set_node_input(&mut self, id: NodeId, slot: usize, from: Outlet) -> Result<(), IrError> {
        self.check_outlet(from)?;
        let old: Vec<_> = self
            .graph
            .edges_directed(id, Direction::Incoming)
            .filter(|e| e.weight().dst_slot == slot)
            .map(|e| e.id())
            .collect();
        if old.is_empty() {
            return Err(IrError::Invalid(format!(
                "node `{}` has no input {slot}",
                self.graph[id].name
            )));
        }
        for e in old {
            self.graph.remove_edge(e);
        }
        self.graph.add_edge(
            from.node,
            id,
            Wire {
                src_slot: from.slot,
                dst_slot: slot,
            },
        );
        Ok(())
    }

    /// Removes a node and its wires. Graph inputs cannot be removed this way.
    pub fn remove_node(&mut self, id: NodeId) -> Option<Node> {
        if self.inputs.contains(&id) {
            return None;
        }
        self.graph.remove_node(id)
    }

    /// A topological order, deterministic and stable: among ready nodes the one inserted first
    /// comes first. A graph built in an order that is already topological (as the text parser
    /// does) gets that order back, which makes print∘parse∘print the identity.
    pub fn topo_order(&self) -> Result<Vec<NodeId>, IrError> {
        let mut indegree: HashMap<NodeId, usize> = HashMap::new();
        let mut ready = BTreeSet::new();
        for id in self.graph.node_indices() {
            let d = self.graph.edges_directed(id, Direction::Incoming).count();
            indegree.insert(id, d);
            if d == 0 {
                ready.insert(id);
            }
        }
        let mut order = Vec::with_capacity(self.graph.node_count());
        while let Some(id) = ready.pop_first() {
            order.push(id);
            for e in self.graph.edges_directed(id, Direction::Outgoing) {
                let d = indegree.get_mut(&e.target()).expect("node in map");
                *d -= 1;
                if *d == 0 {
                    ready.insert(e.target());
                }
            }
        }
        if order.len() != self.graph.node_count() {
            return Err(IrError::Cycle);
        }
        Ok(order)
    }

    /// The underlying petgraph, for algorithms that want it.
    pub fn petgraph(&self) -> &StableDiGraph<Node, Wire> {
        &self.graph
    }
}

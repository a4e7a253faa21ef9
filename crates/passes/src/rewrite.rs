//! The rule driver and the small matching helpers rules are written with.
//!
//! A rule looks at one anchor node. Its body is a list of guards (`rule_if!`, `rule_if_some!`)
//! that return `Ok(false)` as soon as the pattern does not match, followed by one rewrite that
//! adds the new nodes and redirects the uses of the matched output. Nothing is mutated before
//! the last guard. The driver removes what became dead and adds the pass and node names to
//! errors.

use ir::{BinaryOp, Graph, NodeId, Op, Outlet, TensorType};

use crate::PassError;

/// Returns `Ok(false)` from the rule unless the condition holds.
macro_rules! rule_if {
    ($cond:expr) => {
        if !$cond {
            return Ok(false);
        }
    };
}

/// Binds a pattern or returns `Ok(false)` from the rule.
macro_rules! rule_if_some {
    ($pat:pat = $e:expr) => {
        let $pat = $e else {
            return Ok(false);
        };
    };
}

pub(crate) use {rule_if, rule_if_some};

/// A rule: inspects the anchor node and rewrites the graph when it matches.
pub(crate) type Rule = fn(&mut Graph, NodeId) -> Result<bool, String>;

/// Applies `rules` to every live node, in topological order, until none fires. Dead nodes are
/// removed after each rewrite so that a matched pattern cannot match again.
pub(crate) fn apply_rules(
    graph: &mut Graph,
    pass: &'static str,
    rules: &[Rule],
) -> Result<bool, PassError> {
    visit_to_fixpoint(graph, pass, |g, id| {
        let mut fired = false;
        for rule in rules {
            if !g.contains(id) {
                break;
            }
            if rule(g, id)? {
                fired = true;
                crate::dce::remove_dead(g);
            }
        }
        Ok(fired)
    })
}

/// Calls `visit` on every live node, in topological order, until it changes nothing in a whole
/// round. `visit` returns whether it rewrote the graph, and removes what its rewrite left dead.
/// Errors get the pass and node names.
pub(crate) fn visit_to_fixpoint(
    graph: &mut Graph,
    pass: &'static str,
    mut visit: impl FnMut(&mut Graph, NodeId) -> Result<bool, String>,
) -> Result<bool, PassError> {
    let mut changed = false;
    loop {
        let mut fired = false;
        let order = graph
            .topo_order()
            .map_err(|source| PassError::Graph { pass, source })?;
        for id in order {
            if !graph.contains(id) {
                continue;
            }
            let name = graph.node(id).name.clone();
            fired |= visit(graph, id).map_err(|m| PassError::node(pass, &name, m))?;
        }
        if !fired {
            return Ok(changed);
        }
        changed = true;
    }
}

/// The single node reading `outlet`, when there is exactly one reader (once) and the outlet is
/// not a graph output.
pub(crate) fn sole_consumer(g: &Graph, outlet: Outlet) -> Option<NodeId> {
    match g.consumers(outlet).as_slice() {
        [(n, _)] if !g.is_graph_output(outlet) => Some(*n),
        _ => None,
    }
}

/// The op producing `outlet`.
pub(crate) fn op_of(g: &Graph, outlet: Outlet) -> &Op {
    &g.node(outlet.node).op
}

/// The inputs of a binary node with op `b`, or `None`.
pub(crate) fn binary_inputs(g: &Graph, id: NodeId, b: BinaryOp) -> Option<(Outlet, Outlet)> {
    match &g.node(id).op {
        Op::Binary(x) if *x == b => {
            let ins = g.node_inputs(id);
            Some((ins[0], ins[1]))
        }
        _ => None,
    }
}

/// The value of a one-element float-or-int constant.
pub(crate) fn scalar_const(g: &Graph, outlet: Outlet) -> Option<f32> {
    let t = g.const_value(outlet)?;
    if t.len() != 1 {
        return None;
    }
    t.to_f32_vec().ok()?.first().copied()
}

/// Whether `outlet` is a one-element constant within 1e-4 (relative) of `want`.
pub(crate) fn is_scalar(g: &Graph, outlet: Outlet, want: f32) -> bool {
    scalar_const(g, outlet).is_some_and(|v| approx(v, want))
}

pub(crate) fn approx(v: f32, want: f32) -> bool {
    (v - want).abs() <= 1e-4 * want.abs().max(f32::MIN_POSITIVE)
}

/// For a commutative binary node `id` with op `b`, the operand that is not `this`.
pub(crate) fn other_operand(g: &Graph, id: NodeId, b: BinaryOp, this: Outlet) -> Option<Outlet> {
    let (x, y) = binary_inputs(g, id, b)?;
    if x == this {
        Some(y)
    } else if y == this {
        Some(x)
    } else {
        None
    }
}

/// For a commutative binary node, `(operand, scalar)` when one side is a one-element constant.
pub(crate) fn with_scalar(g: &Graph, id: NodeId, b: BinaryOp) -> Option<(Outlet, f32)> {
    let (x, y) = binary_inputs(g, id, b)?;
    if let Some(v) = scalar_const(g, y) {
        return Some((x, v));
    }
    if matches!(b, BinaryOp::Add | BinaryOp::Mul) {
        if let Some(v) = scalar_const(g, x) {
            return Some((y, v));
        }
    }
    None
}

/// A name for a node that replaces `replaced`: its scope plus the new op, e.g.
/// `/encoder/layer.0/attention/self/Reshape_3` → `/encoder/layer.0/attention/self/Attention`.
pub(crate) fn derived_name(replaced: &str, op: &str) -> String {
    match replaced.rfind('/') {
        Some(i) => format!("{}/{op}", &replaced[..i]),
        None if replaced.is_empty() => op.to_string(),
        None => format!("{replaced}_{op}"),
    }
}

/// Adds a node whose output replaces every use of `old`.
pub(crate) fn replace_with(
    g: &mut Graph,
    old: Outlet,
    op: Op,
    name: &str,
    inputs: &[Outlet],
    ty: TensorType,
) -> Result<NodeId, String> {
    let id = g
        .add_node(op, name, inputs, vec![ty])
        .map_err(|e| e.to_string())?;
    g.replace_uses(old, id.into()).map_err(|e| e.to_string())?;
    Ok(id)
}

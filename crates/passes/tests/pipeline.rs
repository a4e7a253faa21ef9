//! The pass manager on its own: verification after each pass, fixpoint, errors.

use ir::{Graph, Op};
use passes::{Pass, PassError, Pipeline, RunOptions};

fn graph() -> Graph {
    ir::text::parse(
        "%0 = input[name=\"x\"] : f32[4]\n\
         %1 = neg(%0) : f32[4]  # a\n\
         %2 = exp(%1) : f32[4]  # b\n\
         output \"y\" = %2\n",
        None,
    )
    .unwrap()
}

/// Makes `a` read `b`, which reads `a`: a cycle.
struct Breaker;

impl Pass for Breaker {
    fn name(&self) -> &'static str {
        "Breaker"
    }
    fn run(&self, g: &mut Graph, _ctx: &mut passes::PassContext<'_>) -> Result<bool, PassError> {
        let find = |g: &Graph, n: &str| g.node_ids().find(|&id| g.node(id).name == n).unwrap();
        let (a, b) = (find(g, "a"), find(g, "b"));
        g.set_node_input(a, 0, b.into()).unwrap();
        Ok(true)
    }
}

/// Changes something on every run: never reaches a fixpoint.
struct Flipper;

impl Pass for Flipper {
    fn name(&self) -> &'static str {
        "Flipper"
    }
    fn run(&self, g: &mut Graph, _ctx: &mut passes::PassContext<'_>) -> Result<bool, PassError> {
        let id = g.node_ids().find(|&id| g.node(id).name == "a").unwrap();
        let node = g.node_mut(id);
        node.op = match node.op {
            Op::Unary(ir::UnaryOp::Neg) => Op::Unary(ir::UnaryOp::Abs),
            _ => Op::Unary(ir::UnaryOp::Neg),
        };
        Ok(true)
    }
}

#[test]
fn verification_failure_names_the_pass() {
    let p = Pipeline::new("test", vec![Box::new(Breaker)]);
    let err = p.run(&mut graph(), &mut RunOptions::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the graph fails verification after Breaker: the graph has a cycle"
    );
}

#[test]
fn no_fixpoint_is_an_error() {
    let p = Pipeline::new("test", vec![Box::new(Flipper)]);
    let err = p.run(&mut graph(), &mut RunOptions::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "pipeline `test` did not reach a fixpoint in 8 iterations"
    );
}

#[test]
fn declutter_reaches_a_fixpoint_on_a_graph_with_nothing_to_do() {
    let mut g = graph();
    let report = Pipeline::declutter()
        .run(&mut g, &mut RunOptions::default())
        .unwrap();
    assert_eq!(report.runs.len(), 7, "one round: {:?}", report.runs);
    assert!(report.runs.iter().all(|r| !r.changed));
    assert!(!report.stopped);
    assert_eq!(
        Pipeline::by_name("declutter").unwrap().pass_names(),
        Pipeline::declutter().pass_names()
    );
    for name in ["quantize", "fuse"] {
        assert_eq!(Pipeline::by_name(name).unwrap().name(), name);
    }
    assert!(Pipeline::by_name("lower").is_none());
}

//! [`Session`]: a compiled execution plan for a [`Model`], and its interpreter.
//!
//! What is planned ahead, at [`Session::new`]:
//! - the graph (decluttered when [`CompileOptions::optimize`]) is put in topological order and
//!   every value gets a slot number;
//! - every constant weight of a Linear, MatMul or Gemm is packed once for the GEMM kernel, and
//!   constants used only that way are not kept unpacked;
//! - the liveness of every value: the step after which its buffer is released (f32 buffers go
//!   back to a per-session arena and are reused by later steps and later runs);
//! - which ops may work in place (elementwise ops, softmax, GELU, reshapes on their input's
//!   last use);
//! - the embedding lookups: which Gather reads token ids straight from a model input (for the
//!   [`Error::TokenOutOfVocab`] check) and which reads positions (for
//!   [`Error::SequenceTooLong`]).
//!
//! What is decided per run: symbol values (batch, sequence) are bound from the input shapes,
//! and buffer sizes follow from them.

use std::collections::HashMap;
use std::sync::Mutex;

use ir::{Graph, NodeId, Op, Outlet};

use crate::exec::{self, Arena, Ctx, Input};
use crate::gemm::{PackedWeight, PackedWeightI8};
use crate::model::{IoSpec, Model};
use crate::value::TensorValue;
use crate::Error;

/// How to compile a model.
///
/// ```
/// let o = runtime::CompileOptions::default();
/// assert!(o.threads >= 1 && o.optimize && o.max_batch.is_none());
/// ```
#[derive(Clone, Debug)]
pub struct CompileOptions {
    /// Worker threads for GEMM, attention and row-parallel ops. Default: the available cores.
    pub threads: usize,
    /// Refuse batches larger than this ([`Error::BatchTooLarge`]).
    pub max_batch: Option<usize>,
    /// Run the declutter pipeline (shape folding, recognition of Linear, LayerNorm, GELU and
    /// Attention) before compiling.
    pub optimize: bool,
    /// After declutter, run the `fuse` pipeline (quantized dialects onto the integer GEMMs,
    /// epilogue fusion). Off only to observe unfused layers (calibration) or to debug.
    pub fuse: bool,
    /// After fuse, run the `pack` pipeline: the token-wise part of an encoder computes only
    /// the real tokens of a batch (the `attention_mask`), attention runs per sequence on its
    /// real length, and outputs are laid back into the padded shape with zeros at the padding.
    /// Each real token's values are the padded program's. Off: every padded token is computed.
    pub padding_free: bool,
    /// Forces the microkernel family of the weight GEMMs: int8 layers run this kernel, f32
    /// layers the f32 kernel of the same ISA level ([`crate::Kernel::f32_counterpart`]).
    /// `None`: the picker's choice for this CPU (which honours `ENCORE_KERNEL`). Products of two
    /// activations (attention) always follow the picker. A kernel this CPU lacks is an error at
    /// [`Session::new`].
    pub kernel: Option<crate::Kernel>,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            threads: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2),
            max_batch: None,
            optimize: true,
            fuse: true,
            padding_free: true,
            kernel: None,
        }
    }
}

/// Sees `(node name, input activation)` of each linear layer during [`Session::run_observed`].
pub type LinearObserver<'a> = &'a mut dyn FnMut(&str, &TensorValue);

/// The named outputs of a run, in the model's order.
pub type Outputs = Vec<(String, TensorValue)>;

/// The time one node took in [`Session::run_profiled`].
#[derive(Clone, Debug)]
pub struct NodeTime {
    pub node: String,
    pub op: &'static str,
    /// What kind of work the op does.
    pub kind: ir::OpKind,
    pub time: std::time::Duration,
}

/// What an embedding-like Gather reads, for input validation.
#[derive(Clone, Debug)]
enum Lookup {
    /// An ordinary gather.
    Plain,
    /// Token ids (or token types) straight from a model input: ids outside `[0, rows)` are bad
    /// input, negative ones included.
    Token { input: String },
    /// Positions derived from the sequence length; `limit` is the length of the constant
    /// position-id buffer they are sliced from, when the graph shows one.
    Position { limit: Option<usize> },
}

/// How a step finds its weight.
enum Weight {
    None,
    /// Index into `Session::packed`.
    Packed(usize),
    /// Index into `Session::packed_i8`.
    PackedI8(usize),
    /// Index into `Session::tables`: input 0 of a gather, read in place from the model.
    Table(usize),
}

struct Step {
    op: Op,
    name: String,
    inputs: Vec<usize>,
    outputs: Vec<usize>,
    /// Slots that die after this step (their last reader ran).
    frees: Vec<usize>,
    weight: Weight,
    lookup: Lookup,
}

struct InputSlot {
    spec: IoSpec,
    slot: usize,
}

/// A compiled model: weights packed, ops ordered, buffers planned. `Session` is `Send + Sync`;
/// concurrent [`Session::run`] calls are allowed (each takes its own buffer arena).
///
/// ```
/// use runtime::{CompileOptions, Model, Session, TensorValue};
/// let g = ir::text::parse(
///     "%0 = input[name=\"x\"] : f32[B,2]\n\
///      %1 = const[value=f32[2]{1.0, -1.0}] : f32[2]\n\
///      %2 = mul(%0, %1) : f32[B,2]\n\
///      output \"y\" = %2\n",
///     None,
/// ).unwrap();
/// let s = Session::new(&Model::from_graph(g).unwrap(), CompileOptions::default()).unwrap();
/// let x = TensorValue::from_f32(vec![1, 2], vec![3.0, 4.0]).unwrap();
/// let out = s.run(&[("x", x)]).unwrap();
/// assert_eq!(out[0].0, "y");
/// assert_eq!(out[0].1.as_f32().unwrap(), &[3.0, -4.0]);
/// ```
pub struct Session {
    graph: Graph,
    steps: Vec<Step>,
    n_slots: usize,
    inputs: Vec<InputSlot>,
    /// Constant values by slot (None for constants only used as packed weights).
    consts: Vec<(usize, TensorValue)>,
    packed: Vec<PackedWeight>,
    packed_i8: Vec<PackedWeightI8>,
    /// Constant tables that gathers read in place (see [`Weight::Table`]).
    tables: Vec<exec::shape_ops::ConstTable>,
    outputs: Vec<(String, usize)>,
    /// Position-lookup limits checked before running: (node, limit).
    position_limits: Vec<(String, usize)>,
    /// Inputs that feed token lookups (their last dim is the sequence length).
    token_inputs: Vec<String>,
    opts: CompileOptions,
    arenas: Mutex<Vec<Arena>>,
}

/// Follows `o` back through ops that do not change values (casts, reshapes) to a graph input.
fn trace_to_input(g: &Graph, mut o: Outlet) -> Option<String> {
    for _ in 0..16 {
        let n = g.node(o.node);
        match &n.op {
            Op::Input { name } => return Some(name.clone()),
            Op::Cast { .. }
            | Op::Reshape { .. }
            | Op::Unsqueeze { .. }
            | Op::Squeeze { .. }
            | Op::Flatten { .. } => o = *g.node_inputs(o.node).first()?,
            _ => return None,
        }
    }
    None
}

/// The length of a constant buffer that `o` is sliced from (BERT's `position_ids[:, :seq]`).
fn trace_to_sliced_const(g: &Graph, mut o: Outlet) -> Option<usize> {
    for _ in 0..16 {
        let n = g.node(o.node);
        let ins = g.node_inputs(o.node);
        match &n.op {
            Op::Slice => {
                let data = *ins.first()?;
                return g.const_value(data).and_then(|t| t.shape().last().copied());
            }
            Op::Cast { .. }
            | Op::Reshape { .. }
            | Op::Unsqueeze { .. }
            | Op::Squeeze { .. }
            | Op::Expand => o = *ins.first()?,
            _ => return None,
        }
    }
    None
}

impl Session {
    /// Compiles `model`: optional declutter, topological order, weight packing, liveness.
    pub fn new(model: &Model, opts: CompileOptions) -> Result<Session, Error> {
        if let Some(k) = opts.kernel.filter(|k| !k.is_supported()) {
            return Err(Error::Invalid(format!(
                "kernel `{}` is not supported on this CPU",
                k.name()
            )));
        }
        let graph = if opts.optimize {
            optimize(model.graph().clone(), opts.fuse, opts.padding_free)?
        } else {
            model.graph().clone()
        };
        graph.verify()?;
        let order = graph.topo_order()?;
        let threads = opts.threads.max(1);

        // Slot numbers for every outlet.
        let mut slot_of: HashMap<Outlet, usize> = HashMap::new();
        let mut n_slots = 0;
        for &id in &order {
            for s in 0..graph.node(id).outputs.len() {
                slot_of.insert(Outlet::new(id, s), n_slots);
                n_slots += 1;
            }
        }

        // Which constants are needed as plain values, and which weights get packed.
        let mut packed_of: HashMap<NodeId, Outlet> = HashMap::new();
        for &id in &order {
            let n = graph.node(id);
            let ins = graph.node_inputs(id);
            let packable = match &n.op {
                Op::Linear | Op::FusedLinear { .. } | Op::QLinear { .. } => true,
                Op::MatMul => graph
                    .const_value(ins[1])
                    .is_some_and(|t| t.shape().len() == 2),
                Op::Gemm { .. } => graph.const_value(ins[1]).is_some(),
                _ => false,
            };
            if packable {
                if graph.const_value(ins[1]).is_none() {
                    return Err(Error::op(
                        &n.name,
                        n.op.name(),
                        "the weight must be a constant",
                    ));
                }
                packed_of.insert(id, ins[1]);
            }
        }
        // Large embedding tables stay in the model's (memory-mapped) bytes: a gather on axis 0
        // reads its rows there instead of from a copy in the session.
        let mut table_of: HashMap<NodeId, Outlet> = HashMap::new();
        for &id in &order {
            let n = graph.node(id);
            if let Op::Gather { axis: 0 } = n.op {
                let data = graph.node_inputs(id)[0];
                let big = graph
                    .const_value(data)
                    .and_then(exec::shape_ops::ConstTable::new)
                    .is_some_and(|t| t.byte_len() >= 1 << 20);
                if big {
                    table_of.insert(id, data);
                }
            }
        }
        let mut const_needed: HashMap<Outlet, bool> = HashMap::new();
        for &id in &order {
            for (slot, o) in graph.node_inputs(id).into_iter().enumerate() {
                if graph.const_value(o).is_some() {
                    let as_weight = (slot == 1 && packed_of.contains_key(&id))
                        || (slot == 0 && table_of.contains_key(&id));
                    *const_needed.entry(o).or_insert(false) |= !as_weight;
                }
            }
        }
        for (_, o) in graph.outputs() {
            if graph.const_value(*o).is_some() {
                const_needed.insert(*o, true);
            }
        }

        let mut consts = Vec::new();
        for (&o, &needed) in &const_needed {
            if needed {
                let t = graph.const_value(o).expect("const outlet");
                consts.push((slot_of[&o], TensorValue::from_ir(t)?));
            }
        }
        consts.sort_by_key(|(s, _)| *s);

        let mut packed = Vec::new();
        let mut packed_i8 = Vec::new();
        let mut tables = Vec::new();
        let mut steps = Vec::new();
        let mut inputs = Vec::new();
        let mut position_limits = Vec::new();
        let mut token_inputs: Vec<String> = Vec::new();
        for &id in &order {
            let n = graph.node(id);
            let outs: Vec<usize> = (0..n.outputs.len())
                .map(|s| slot_of[&Outlet::new(id, s)])
                .collect();
            match &n.op {
                Op::Input { name } => {
                    inputs.push(InputSlot {
                        spec: IoSpec {
                            name: name.clone(),
                            ty: n.outputs[0].clone(),
                        },
                        slot: outs[0],
                    });
                    continue;
                }
                Op::Const { .. } => continue,
                _ => {}
            }
            let ins = graph.node_inputs(id);
            let weight = match packed_of.get(&id) {
                None if table_of.contains_key(&id) => {
                    let t = graph.const_value(table_of[&id]).expect("table is const");
                    tables.push(exec::shape_ops::ConstTable::new(t).expect("checked above"));
                    Weight::Table(tables.len() - 1)
                }
                Some(&w) if matches!(n.op, Op::QLinear { .. }) => {
                    let t = graph.const_value(w).expect("packed weight is const");
                    let sh = t.shape();
                    let v = t
                        .to_vec::<i8>()
                        .ok()
                        .filter(|_| sh.len() == 2)
                        .ok_or_else(|| {
                            Error::op(
                                &n.name,
                                n.op.name(),
                                format!("weight must be i8[k, n], got {}{sh:?}", t.dtype()),
                            )
                        })?;
                    let p = PackedWeightI8::pack(&v, sh[0], sh[1], opts.kernel)
                        .map_err(|e| Error::op(&n.name, n.op.name(), e.to_string()))?;
                    packed_i8.push(p);
                    Weight::PackedI8(packed_i8.len() - 1)
                }
                Some(&w) => {
                    let t = graph.const_value(w).expect("packed weight is const");
                    let v = t.to_f32_vec().map_err(|_| {
                        Error::op(
                            &n.name,
                            n.op.name(),
                            format!("weight must be f32, got {}", t.dtype()),
                        )
                    })?;
                    let sh = t.shape();
                    if sh.len() != 2 {
                        return Err(Error::op(
                            &n.name,
                            n.op.name(),
                            format!("weight must be 2-D, got {sh:?}"),
                        ));
                    }
                    let trans = matches!(n.op, Op::Gemm { trans_b: true, .. });
                    let (k, nn) = if trans {
                        (sh[1], sh[0])
                    } else {
                        (sh[0], sh[1])
                    };
                    packed.push(PackedWeight::pack(&v, k, nn, trans, opts.kernel));
                    Weight::Packed(packed.len() - 1)
                }
                None => Weight::None,
            };
            let lookup = match &n.op {
                Op::Gather { axis } if *axis == 0 || *axis == -2 => {
                    let table_rank = graph.outlet_type(ins[0]).rank();
                    if table_rank.is_some_and(|r| r != 2) {
                        Lookup::Plain
                    } else if let Some(input) = trace_to_input(&graph, ins[1]) {
                        if !token_inputs.contains(&input) {
                            token_inputs.push(input.clone());
                        }
                        Lookup::Token { input }
                    } else if graph.const_value(ins[1]).is_some() {
                        Lookup::Plain
                    } else {
                        let limit = trace_to_sliced_const(&graph, ins[1]);
                        if let Some(l) = limit {
                            position_limits.push((n.name.clone(), l));
                        }
                        Lookup::Position { limit }
                    }
                }
                _ => Lookup::Plain,
            };
            steps.push(Step {
                op: n.op.clone(),
                name: n.name.clone(),
                inputs: ins.iter().map(|o| slot_of[o]).collect(),
                outputs: outs,
                frees: Vec::new(),
                weight,
                lookup,
            });
        }
        let outputs: Vec<(String, usize)> = graph
            .outputs()
            .iter()
            .map(|(name, o)| (name.clone(), slot_of[o]))
            .collect();

        // Liveness: the last step reading each slot. Graph outputs live to the end.
        let mut last_use: Vec<Option<usize>> = vec![None; n_slots];
        for (i, st) in steps.iter().enumerate() {
            for &s in &st.inputs {
                last_use[s] = Some(i);
            }
        }
        let pinned: Vec<bool> = {
            let mut p = vec![false; n_slots];
            outputs.iter().for_each(|(_, s)| p[*s] = true);
            consts.iter().for_each(|(s, _)| p[*s] = true);
            inputs.iter().for_each(|i| p[i.slot] = true);
            p
        };
        for (i, st) in steps.iter_mut().enumerate() {
            let mut frees: Vec<usize> = st
                .inputs
                .iter()
                .copied()
                .filter(|&s| last_use[s] == Some(i) && !pinned[s])
                .collect();
            // Values nobody reads (e.g. unused outputs of a multi-output op) die at once.
            frees.extend(
                st.outputs
                    .iter()
                    .copied()
                    .filter(|&s| last_use[s].is_none() && !pinned[s]),
            );
            frees.sort_unstable();
            frees.dedup();
            st.frees = frees;
        }

        Ok(Session {
            graph,
            steps,
            n_slots,
            inputs,
            consts,
            packed,
            packed_i8,
            tables,
            outputs,
            position_limits,
            token_inputs,
            opts: CompileOptions { threads, ..opts },
            arenas: Mutex::new(Vec::new()),
        })
    }

    /// The graph this session executes (after optimisation, when enabled).
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The options the session was compiled with.
    pub fn options(&self) -> &CompileOptions {
        &self.opts
    }

    /// The inputs the session expects.
    pub fn inputs(&self) -> Vec<IoSpec> {
        self.inputs.iter().map(|i| i.spec.clone()).collect()
    }

    /// Rows of the constant table that graph input `input` is looked up in, found the way
    /// input validation finds token lookups: the vocabulary size for `input_ids`. `None` when the
    /// input feeds no such lookup.
    ///
    /// ```
    /// use runtime::{CompileOptions, Model, Session};
    /// let g = ir::text::parse(
    ///     "%0 = input[name=\"input_ids\"] : i64[B,S]\n\
    ///      %1 = const[value=f32[3,2]{1.0, 2.0, 3.0, 4.0, 5.0, 6.0}] : f32[3,2]\n\
    ///      %2 = gather[axis=0](%1, %0) : f32[B,S,2]\n\
    ///      output \"y\" = %2\n",
    ///     None,
    /// ).unwrap();
    /// let s = Session::new(&Model::from_graph(g).unwrap(), CompileOptions::default()).unwrap();
    /// assert_eq!(s.lookup_rows("input_ids"), Some(3));
    /// assert_eq!(s.lookup_rows("attention_mask"), None);
    /// ```
    pub fn lookup_rows(&self, input: &str) -> Option<usize> {
        let g = &self.graph;
        g.node_ids().find_map(|id| {
            let Op::Gather { axis: 0 | -2 } = g.node(id).op else {
                return None;
            };
            let ins = g.node_inputs(id);
            if trace_to_input(g, ins[1]).as_deref() != Some(input) {
                return None;
            }
            // The table is a constant, or a quantized constant behind its DequantizeLinear
            // (QDQ models).
            let table = g.const_value(ins[0]).or_else(|| {
                let dq = ins[0].node;
                matches!(g.node(dq).op, Op::DequantizeLinear { .. })
                    .then(|| g.const_value(g.node_inputs(dq)[0]))
                    .flatten()
            });
            table.and_then(|t| t.shape().first().copied())
        })
    }

    /// The names of the outputs [`Session::run`] returns, in order.
    pub fn output_names(&self) -> Vec<String> {
        self.outputs.iter().map(|(n, _)| n.clone()).collect()
    }

    /// Checks the inputs against the model: names, dtypes, ranks, fixed dims and consistent
    /// symbols (e.g. the same batch and sequence for every input), batch and sequence limits.
    /// Returns the symbol bindings.
    fn validate(&self, given: &[(&str, TensorValue)]) -> Result<HashMap<String, usize>, Error> {
        for (i, (name, _)) in given.iter().enumerate() {
            if !self.inputs.iter().any(|s| s.spec.name == *name) {
                return Err(Error::UnknownInput {
                    name: name.to_string(),
                    known: self.inputs.iter().map(|s| s.spec.name.clone()).collect(),
                });
            }
            if given[..i].iter().any(|(n, _)| n == name) {
                return Err(Error::DuplicateInput {
                    name: name.to_string(),
                });
            }
        }
        let mut bound: HashMap<String, (usize, String)> = HashMap::new();
        let mut composite = Vec::new();
        for s in &self.inputs {
            let name = &s.spec.name;
            let t = &given
                .iter()
                .find(|(n, _)| n == name)
                .ok_or_else(|| Error::MissingInput { name: name.clone() })?
                .1;
            if t.dtype() != s.spec.ty.dtype {
                return Err(Error::InputDType {
                    name: name.clone(),
                    expected: s.spec.ty.dtype,
                    actual: t.dtype(),
                });
            }
            let Some(shape) = &s.spec.ty.shape else {
                continue;
            };
            if shape.len() != t.rank() {
                return Err(Error::InputRank {
                    name: name.clone(),
                    expected: shape.len(),
                    actual: t.shape().to_vec(),
                });
            }
            for (d, (dim, &actual)) in shape.iter().zip(t.shape()).enumerate() {
                if let Some(f) = dim.as_fixed() {
                    if f != actual {
                        return Err(Error::InputShape {
                            name: name.clone(),
                            dim: d,
                            expected: f.to_string(),
                            actual,
                        });
                    }
                } else if dim.coeff() == 1 && dim.symbols().len() == 1 {
                    let sym = &dim.symbols()[0];
                    match bound.get(sym) {
                        Some((v, by)) if *v != actual => {
                            return Err(Error::InputShape {
                                name: name.clone(),
                                dim: d,
                                expected: format!("{sym} = {v} (as in input `{by}`)"),
                                actual,
                            })
                        }
                        Some(_) => {}
                        None => {
                            bound.insert(sym.clone(), (actual, name.clone()));
                        }
                    }
                } else {
                    composite.push((name.clone(), d, dim.clone(), actual));
                }
            }
        }
        let bindings: HashMap<String, usize> =
            bound.into_iter().map(|(k, (v, _))| (k, v)).collect();
        for (name, d, dim, actual) in composite {
            if let Ok(v) = dim.eval(&bindings) {
                if v != actual {
                    return Err(Error::InputShape {
                        name,
                        dim: d,
                        expected: format!("{dim} = {v}"),
                        actual,
                    });
                }
            }
        }
        if let Some(max) = self.opts.max_batch {
            for (_, t) in given {
                if let Some(&b) = t.shape().first() {
                    if b > max {
                        return Err(Error::BatchTooLarge {
                            batch: b,
                            max_batch: max,
                        });
                    }
                }
            }
        }
        for (node, limit) in &self.position_limits {
            for inp in &self.token_inputs {
                if let Some((_, t)) = given.iter().find(|(n, _)| n == inp) {
                    if t.rank() >= 2 {
                        let len = *t.shape().last().unwrap();
                        if len > *limit {
                            return Err(Error::SequenceTooLong {
                                len,
                                max_positions: *limit,
                                node: node.clone(),
                            });
                        }
                    }
                }
            }
        }
        Ok(bindings)
    }

    /// The sequence length of this run, if the model has token inputs.
    fn seq_len(&self, given: &[(&str, TensorValue)]) -> Option<usize> {
        self.token_inputs.iter().find_map(|inp| {
            given
                .iter()
                .find(|(n, _)| n == inp)
                .and_then(|(_, t)| (t.rank() >= 2).then(|| *t.shape().last().unwrap()))
        })
    }

    /// Runs the model. `inputs` are `(name, tensor)` pairs, one per model input in any order.
    /// Returns the outputs in the model's order. Takes `&self`: threads may share one session
    /// (each run takes its own buffers) and get the results they would get alone.
    ///
    /// ```
    /// use runtime::{Model, Session, TensorValue};
    /// let g = ir::text::parse(
    ///     "%0 = input[name=\"x\"] : f32[B,2]\n%1 = relu(%0) : f32[B,2]\noutput \"y\" = %1\n",
    ///     None,
    /// ).unwrap();
    /// let session = Session::builder(&Model::from_graph(g)?).threads(1).build()?;
    /// std::thread::scope(|s| {
    ///     for t in 0..4 {
    ///         let session = &session;
    ///         s.spawn(move || {
    ///             let x = TensorValue::from_f32(vec![1, 2], vec![t as f32, -1.0]).unwrap();
    ///             let out = session.run(&[("x", x)]).unwrap();
    ///             assert_eq!(out[0].1.as_f32().unwrap(), &[t as f32, 0.0]);
    ///         });
    ///     }
    /// });
    /// // Bad inputs are typed errors, not panics.
    /// let wrong = TensorValue::from_i64(vec![1, 2], vec![1, 2])?;
    /// assert!(matches!(session.run(&[("x", wrong)]), Err(runtime::Error::InputDType { .. })));
    /// # Ok::<(), runtime::Error>(())
    /// ```
    pub fn run(&self, inputs: &[(&str, TensorValue)]) -> Result<Vec<(String, TensorValue)>, Error> {
        self.run_inner(inputs, None, None)
    }

    /// [`Session::run`], showing `observe` the input of every linear layer (`Linear`,
    /// `FusedLinear`, `QLinear`) by node name just before the layer runs: what calibration
    /// records.
    pub fn run_observed(
        &self,
        inputs: &[(&str, TensorValue)],
        observe: LinearObserver<'_>,
    ) -> Result<Outputs, Error> {
        self.run_inner(inputs, None, Some(observe))
    }

    /// [`Session::run`], also returning the time of every executed node, in execution order.
    pub fn run_profiled(
        &self,
        inputs: &[(&str, TensorValue)],
    ) -> Result<(Outputs, Vec<NodeTime>), Error> {
        let mut times = Vec::with_capacity(self.steps.len());
        let out = self.run_inner(inputs, Some(&mut times), None)?;
        Ok((out, times))
    }

    fn run_inner(
        &self,
        inputs: &[(&str, TensorValue)],
        times: Option<&mut Vec<NodeTime>>,
        observe: Option<LinearObserver<'_>>,
    ) -> Result<Vec<(String, TensorValue)>, Error> {
        self.validate(inputs)?;
        let mut arena = self
            .arenas
            .lock()
            .map(|mut a| a.pop())
            .unwrap_or(None)
            .unwrap_or_default();
        let result = self.execute(inputs, &mut arena, times, observe);
        if let Ok(mut a) = self.arenas.lock() {
            a.push(arena);
        }
        result
    }

    fn execute(
        &self,
        inputs: &[(&str, TensorValue)],
        arena: &mut Arena,
        mut times: Option<&mut Vec<NodeTime>>,
        mut observe: Option<LinearObserver<'_>>,
    ) -> Result<Vec<(String, TensorValue)>, Error> {
        let mut slots: Vec<Slot<'_>> = (0..self.n_slots).map(|_| Slot::Empty).collect();
        for (s, t) in &self.consts {
            slots[*s] = Slot::Ref(t);
        }
        for i in &self.inputs {
            let t = &inputs
                .iter()
                .find(|(n, _)| *n == i.spec.name)
                .expect("validated")
                .1;
            slots[i.slot] = Slot::Ref(t);
        }
        let mut ctx = Ctx {
            threads: self.opts.threads,
            arena,
        };
        for st in &self.steps {
            // Inputs read for the last time, once, are handed over owned.
            let mut owned: Vec<Option<TensorValue>> = Vec::with_capacity(st.inputs.len());
            for &s in &st.inputs {
                let once = st.inputs.iter().filter(|&&x| x == s).count() == 1;
                let dying = once && st.frees.binary_search(&s).is_ok();
                owned.push(if dying {
                    match std::mem::replace(&mut slots[s], Slot::Empty) {
                        Slot::Own(t) => Some(t),
                        other => {
                            slots[s] = other;
                            None
                        }
                    }
                } else {
                    None
                });
            }
            let packed_slot = match st.weight {
                Weight::Packed(_) | Weight::PackedI8(_) => Some(1),
                Weight::Table(_) => Some(0),
                Weight::None => None,
            };
            let mut ins: Vec<Input<'_>> = st
                .inputs
                .iter()
                .zip(owned)
                .enumerate()
                .map(|(k, (&s, o))| match o {
                    Some(t) => Ok(Input::Own(t)),
                    // A packed weight is not kept unpacked: the kernel reads the packed form.
                    None if packed_slot == Some(k) && slots[s].get().is_none() => {
                        Ok(Input::Own(TensorValue::scalar(0u8)))
                    }
                    None => slots[s].get().map(Input::Ref).ok_or_else(|| {
                        Error::Invalid(format!(
                            "internal: value read by `{}` is not available",
                            st.name
                        ))
                    }),
                })
                .collect::<Result<_, _>>()?;
            let t0 = times.is_some().then(std::time::Instant::now);
            if let Some(obs) = observe.as_deref_mut() {
                if matches!(
                    st.op,
                    Op::Linear | Op::FusedLinear { .. } | Op::QLinear { .. }
                ) {
                    obs(&st.name, ins[0].get());
                }
            }
            let outs = self.exec_step(st, &mut ins, &mut ctx, inputs);
            if let (Some(t), Some(t0)) = (times.as_deref_mut(), t0) {
                t.push(NodeTime {
                    node: st.name.clone(),
                    op: st.op.name(),
                    kind: st.op.kind(),
                    time: t0.elapsed(),
                });
            }
            for i in ins.drain(..) {
                if let Input::Own(t) = i {
                    ctx.arena.recycle(t);
                }
            }
            let outs = outs?;
            for &s in &st.frees {
                if let Slot::Own(t) = std::mem::replace(&mut slots[s], Slot::Empty) {
                    ctx.arena.recycle(t);
                }
            }
            for (&s, t) in st.outputs.iter().zip(outs) {
                if st.frees.binary_search(&s).is_ok() {
                    ctx.arena.recycle(t);
                } else {
                    slots[s] = Slot::Own(t);
                }
            }
        }
        let mut result = Vec::with_capacity(self.outputs.len());
        for (i, (name, s)) in self.outputs.iter().enumerate() {
            let used_later = self.outputs[i + 1..].iter().any(|(_, x)| x == s);
            let t = match std::mem::replace(&mut slots[*s], Slot::Empty) {
                Slot::Own(t) if used_later => {
                    slots[*s] = Slot::Own(t.clone());
                    t
                }
                Slot::Own(t) => t,
                Slot::Ref(t) => {
                    slots[*s] = Slot::Ref(t);
                    t.clone()
                }
                Slot::Empty => {
                    return Err(Error::Invalid(format!(
                        "internal: output `{name}` was not computed"
                    )))
                }
            };
            result.push((name.clone(), t));
        }
        Ok(result)
    }

    fn exec_step(
        &self,
        st: &Step,
        ins: &mut [Input<'_>],
        ctx: &mut Ctx<'_>,
        given: &[(&str, TensorValue)],
    ) -> Result<Vec<TensorValue>, Error> {
        use exec::{attention, elementwise as ew, fused, nn, packing, quant, shape_ops as so};
        let node = st.name.as_str();
        let packed = match st.weight {
            Weight::Packed(i) => Some(&self.packed[i]),
            Weight::None | Weight::PackedI8(_) | Weight::Table(_) => None,
        };
        let one = |t: TensorValue| Ok(vec![t]);
        // Takes input `i` out of the list (so it can be moved into the kernel).
        fn take<'a>(ins: &mut [Input<'a>], i: usize) -> Input<'a> {
            std::mem::replace(&mut ins[i], Input::Own(TensorValue::scalar(0u8)))
        }
        let r = |i: usize| -> &TensorValue { ins[i].get() };
        match &st.op {
            Op::Input { .. } | Op::Const { .. } => unreachable!("not steps"),
            Op::Binary(b) => {
                // Operands not reused in place stay in `ins`, which the caller recycles.
                let (x, y) = ins.split_at_mut(1);
                one(ew::binary(*b, &mut x[0], &mut y[0], node)?)
            }
            Op::Unary(u) => one(ew::unary(*u, take(ins, 0), ctx, node)?),
            Op::Where => one(ew::where_op(r(0), r(1), r(2), node)?),
            Op::Select => {
                let chosen = if ew::select_condition(r(0), node)? {
                    1
                } else {
                    2
                };
                one(take(ins, chosen).into_owned())
            }
            Op::Clip => {
                let bound = |i: usize| ins.get(i).map(|t| t.get());
                one(ew::clip(r(0), bound(1), bound(2), node)?)
            }
            Op::Cast { to } => one(ew::cast(take(ins, 0), *to, node)?),
            Op::Shape { start, end } => one(so::shape(r(0), *start, *end)),
            Op::Reshape { allowzero } => {
                let spec = r(1).clone();
                one(so::reshape(take(ins, 0), &spec, *allowzero, node)?)
            }
            Op::Transpose { perm } => one(so::transpose(r(0), perm, node)?),
            Op::Unsqueeze { axes } | Op::Squeeze { axes } => {
                // Axes given as an input (known only at run time) replace the attribute.
                let axes = match ins.get(1) {
                    None => axes.clone(),
                    Some(a) => a.get().to_i64_vec().map_err(|_| {
                        Error::op(
                            node,
                            st.op.name(),
                            format!("axes must be integer, got {}", a.get().dtype()),
                        )
                    })?,
                };
                let x = take(ins, 0);
                one(if matches!(st.op, Op::Unsqueeze { .. }) {
                    so::unsqueeze(x, &axes, node)?
                } else {
                    so::squeeze(x, &axes, node)?
                })
            }
            Op::Flatten { axis } => one(so::flatten(take(ins, 0), *axis, node)?),
            Op::Concat { axis } => {
                let xs: Vec<&TensorValue> = ins.iter().map(|i| i.get()).collect();
                one(so::concat(&xs, *axis, node)?)
            }
            Op::Split { axis, num_outputs } => {
                so::split(r(0), ins.get(1).map(|i| i.get()), *axis, *num_outputs, node)
            }
            Op::Gather { axis } => {
                let allow_negative = !matches!(st.lookup, Lookup::Token { .. });
                let gathered = match st.weight {
                    Weight::Table(i) => {
                        self.tables[i].gather(r(1), allow_negative, ctx.arena, node)?
                    }
                    _ => {
                        let arena = Some(&mut *ctx.arena);
                        so::gather(r(0), r(1), *axis, allow_negative, arena, node)?
                    }
                };
                match gathered {
                    Ok(t) => one(t),
                    Err(oor) => Err(self.lookup_error(st, oor, given)),
                }
            }
            Op::GatherElements { axis } => one(so::gather_elements(r(0), r(1), *axis, node)?),
            Op::Pad { mode } => {
                let opt = |i: usize| ins.get(i).map(|t| t.get());
                one(so::pad(r(0), r(1), opt(2), opt(3), *mode, node)?)
            }
            Op::Trilu { upper } => {
                let k = ins.get(1).map(|i| i.get());
                one(so::trilu(r(0), k, *upper, node)?)
            }
            Op::GatherNd { batch_dims } => one(so::gather_nd(r(0), r(1), *batch_dims, node)?),
            Op::ScatterNd { .. } | Op::ScatterElements { .. } => {
                let (axis, reduction) = match st.op {
                    Op::ScatterElements { axis, reduction } => (Some(axis), reduction),
                    Op::ScatterNd { reduction } => (None, reduction),
                    _ => unreachable!("matched above"),
                };
                let (idx, upd) = (r(1).clone(), r(2).clone());
                let data = take(ins, 0).into_owned();
                one(so::scatter(data, &idx, &upd, axis, reduction, node)?)
            }
            Op::Slice => {
                let args: Vec<&TensorValue> = ins[1..].iter().map(|i| i.get()).collect();
                one(so::slice(r(0), &args, node)?)
            }
            Op::Expand => one(so::expand(r(0), r(1), node)?),
            Op::Tile => one(so::tile(r(0), r(1), node)?),
            Op::ConstantOfShape { value } => one(so::constant_of_shape(
                r(0),
                &TensorValue::from_ir(value)?,
                node,
            )?),
            Op::Range => one(so::range(r(0), r(1), r(2), node)?),
            Op::CumSum { exclusive, reverse } => {
                one(so::cumsum(r(0), r(1), *exclusive, *reverse, node)?)
            }
            Op::ArgReduce {
                min,
                axis,
                keepdims,
                last,
            } => one(so::arg_reduce(r(0), *min, *axis, *keepdims, *last, node)?),
            Op::Reduce { op, axes, keepdims } => match ins.get(1) {
                None => one(so::reduce(r(0), *op, axes, *keepdims, node)?),
                Some(a) => {
                    let axes = a.get().to_i64_vec().map_err(|_| {
                        Error::op(
                            node,
                            op.name(),
                            format!("axes must be integer, got {}", a.get().dtype()),
                        )
                    })?;
                    one(so::reduce(r(0), *op, &axes, *keepdims, node)?)
                }
            },
            Op::QMatMul => one(quant::qdq_matmul(
                r(0),
                r(1),
                Some(r(2)),
                r(3),
                r(4),
                Some(r(5)),
                node,
            )?),
            Op::Einsum { equation } => {
                let xs: Vec<&TensorValue> = ins.iter().map(|i| i.get()).collect();
                one(nn::einsum(equation, &xs, node)?)
            }
            Op::MatMul => match packed {
                Some(w) => one(nn::linear(r(0), w, None, ctx, node, "matmul")?),
                None => one(nn::matmul(r(0), r(1), ctx, node)?),
            },
            Op::Gemm {
                alpha,
                beta,
                trans_a,
                trans_b,
            } => {
                let c = ins.get(2).map(|i| i.get());
                let b = if packed.is_some() { None } else { Some(r(1)) };
                one(nn::gemm(
                    r(0),
                    b,
                    c,
                    packed,
                    (*alpha, *beta, *trans_a, *trans_b),
                    ctx,
                    node,
                )?)
            }
            Op::Linear => {
                let w = packed.expect("linear weights are packed at compile time");
                let bias = ins.get(2).map(|i| i.get());
                one(nn::linear(r(0), w, bias, ctx, node, "linear")?)
            }
            Op::FusedLinear { epilogue } => {
                let w = packed.expect("fused linear weights are packed at compile time");
                one(fused::fused_linear(
                    r(0),
                    w,
                    epilogue,
                    &ins[2..],
                    ctx,
                    node,
                )?)
            }
            Op::QLinear {
                act,
                smooth,
                epilogue,
            } => {
                let Weight::PackedI8(wi) = st.weight else {
                    unreachable!("qlinear weights are packed at compile time")
                };
                let first = 3 + usize::from(*smooth);
                one(fused::qlinear(
                    r(0),
                    &self.packed_i8[wi],
                    r(2),
                    smooth.then(|| r(3)),
                    *act,
                    epilogue,
                    &ins[first..],
                    ctx,
                    node,
                )?)
            }
            Op::Softmax { axis } => one(nn::softmax(take(ins, 0), *axis, ctx, node)?),
            Op::LayerNorm { axis, epsilon } => {
                let beta = ins.get(2).map(|i| i.get());
                one(nn::layer_norm(
                    r(0),
                    r(1),
                    beta,
                    *axis,
                    *epsilon,
                    ctx,
                    node,
                )?)
            }
            Op::Gelu { approx } => one(ew::gelu(*approx, take(ins, 0), ctx, node)?),
            Op::Attention { num_heads, scale } => {
                let mask = ins.get(3).map(|i| i.get());
                one(attention::attention(
                    r(0),
                    r(1),
                    r(2),
                    mask,
                    *num_heads,
                    *scale,
                    ctx,
                    node,
                )?)
            }
            Op::AttentionQkv { num_heads, scale } => {
                let mask = ins.get(1).map(|i| i.get());
                one(attention::attention_qkv(
                    r(0),
                    mask,
                    *num_heads,
                    *scale,
                    ctx,
                    node,
                )?)
            }
            Op::AttentionPacked { num_heads, scale } => {
                let bias = ins.get(2).map(|i| i.get());
                one(attention::attention_packed(
                    r(0),
                    r(1),
                    bias,
                    *num_heads,
                    *scale,
                    ctx,
                    node,
                )?)
            }
            Op::PackRows => one(packing::pack_rows(r(0), r(1), ctx, node)?),
            Op::UnpackRows => one(packing::unpack_rows(r(0), r(1), ctx, node)?),
            Op::QuantizeLinear { axis, to } => {
                let zp = ins.get(2).map(|i| i.get());
                one(quant::quantize_linear(r(0), r(1), zp, *axis, *to, node)?)
            }
            Op::DequantizeLinear { axis } => {
                let zp = ins.get(2).map(|i| i.get());
                one(quant::dequantize_linear(r(0), r(1), zp, *axis, node)?)
            }
            Op::DynamicQuantizeLinear => quant::dynamic_quantize_linear(r(0), node),
            Op::MatMulInteger => {
                let azp = ins.get(2).map(|i| i.get());
                let bzp = ins.get(3).map(|i| i.get());
                one(quant::matmul_integer(r(0), r(1), azp, bzp, node)?)
            }
        }
    }

    fn lookup_error(
        &self,
        st: &Step,
        oor: exec::shape_ops::OutOfRange,
        given: &[(&str, TensorValue)],
    ) -> Error {
        match &st.lookup {
            Lookup::Token { input } => Error::TokenOutOfVocab {
                input: input.clone(),
                token_id: oor.index,
                vocab_size: oor.dim,
                node: st.name.clone(),
            },
            Lookup::Position { limit } => match self.seq_len(given) {
                // Positions grow by one per token: the longest sequence that fits is shorter
                // than this one by how far the largest position overshoots the table.
                Some(len) if oor.index >= oor.dim as i64 => Error::SequenceTooLong {
                    len,
                    max_positions: limit.unwrap_or_else(|| {
                        len.saturating_sub((oor.index as usize + 1).saturating_sub(oor.dim))
                    }),
                    node: st.name.clone(),
                },
                _ => Error::op(
                    &st.name,
                    "gather",
                    format!(
                        "position index {} is outside the table of {} rows",
                        oor.index, oor.dim
                    ),
                ),
            },
            Lookup::Plain => Error::op(
                &st.name,
                "gather",
                format!(
                    "index {} is out of range for an axis of {}",
                    oor.index, oor.dim
                ),
            ),
        }
    }
}

/// A value slot of a run: borrowed (constants, user inputs) or owned (intermediates).
enum Slot<'a> {
    Empty,
    Ref(&'a TensorValue),
    Own(TensorValue),
}

impl Slot<'_> {
    fn get(&self) -> Option<&TensorValue> {
        match self {
            Slot::Empty => None,
            Slot::Ref(t) => Some(t),
            Slot::Own(t) => Some(t),
        }
    }
}

/// The `declutter` pipeline of `passes` (shape inference, constant folding, DCE, recognition of
/// Linear, LayerNorm, GELU and Attention), then `fuse` (quantized dialects onto integer GEMMs,
/// epilogues grown) and `pack` (padding-free token-wise region): the session executes what the
/// graph says after these.
pub(crate) fn optimize(mut graph: Graph, fuse: bool, padding_free: bool) -> Result<Graph, Error> {
    passes::Pipeline::declutter().run(&mut graph, &mut passes::RunOptions::default())?;
    if fuse {
        passes::Pipeline::fuse().run(&mut graph, &mut passes::RunOptions::default())?;
        if padding_free {
            passes::Pipeline::pack().run(&mut graph, &mut passes::RunOptions::default())?;
        }
    }
    Ok(graph)
}

#[allow(dead_code)]
fn assert_send_sync() {
    fn is<T: Send + Sync>() {}
    is::<Session>();
}

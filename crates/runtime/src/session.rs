//! [`Session`]: a compiled model, and the interpreter of its lowered program.
//!
//! [`Session::new`] optimizes the graph (the `declutter`, `fuse` and `pack` pipelines, as
//! [`CompileOptions`] say), lowers it with [`codegen::lower::lower`] to a [`Program`] (steps in
//! order with their kernels and thread splits, packed-weight layouts, liveness, the buffer plan,
//! the token and position lookups to check) and makes what the program names: the packed
//! weights, the in-place embedding tables, the constants kept as plain values. `Session`
//! decides nothing itself: `encore dump --after lower` prints what it will do.
//!
//! Per run: symbol values (batch, sequence) are bound from the input shapes, and the
//! interpreter walks the steps, each value in its planned buffer's slot; memory comes from a
//! per-session arena that recycles the buffers of dead values within and across runs (dying
//! inputs of elementwise ops, softmax, GELU and reshapes are reused in place).
//!
//! A loop step runs its body once per iteration: the body is compiled with the session, as a
//! session of its own (optimized and lowered on its own), and each iteration is a run of it.

use std::collections::HashMap;
use std::sync::Mutex;

use codegen::lower::{self, BatchSplit, Lookup, Program};
use ir::{Graph, Op};
use smallvec::SmallVec;

use crate::exec::{self, Arena, Ctx, Input};
use crate::gemm::{PackedWeight, PackedWeightI8};
use crate::model::{IoSpec, Model};
use crate::value::{SmallInts, TensorValue};
use crate::Error;

/// Tokens per part of a split batch by default ([`CompileOptions::batch_tokens`]).
pub const DEFAULT_BATCH_TOKENS: usize = 1024;

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
    /// Run the loop nest of each int8 GEMM as Cranelift-compiled code specialised to its shape
    /// (`codegen::jit`); off, or where the platform refuses executable memory, the same nest runs
    /// interpreted, with bit-identical results. Default: on unless `ENCORE_JIT=0`.
    pub jit: bool,
    /// Forces the microkernel family of the weight GEMMs: int8 layers run this kernel, f32
    /// layers the f32 kernel of the same ISA level ([`crate::Kernel::f32_counterpart`]).
    /// `None`: the picker's choice for this CPU (which honours `ENCORE_KERNEL`). Products of two
    /// activations (attention) always follow the picker. A kernel this CPU lacks is an error at
    /// [`Session::new`].
    pub kernel: Option<crate::Kernel>,
    /// Run a batch of more (real) tokens than about 1.5 times this as consecutive parts of about
    /// this many tokens, whole sequences each, when the program allows it: every output row
    /// made from its own input row (`codegen::lower::BatchSplit`, printed `split batch=…` by
    /// `encore dump --after lower`; a dynamic per-tensor quantization, for one, forbids it).
    /// The results are the same bit for bit; the activations of a part stay in the last-level
    /// cache from one layer to the next. `None`: a batch runs whole. Default: 1024 tokens
    /// (BERT-base INT8 on two Zen 5 cores, batch 32 × 128: see README).
    pub batch_tokens: Option<usize>,
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
            jit: !codegen::jit::disabled_by_env(),
            kernel: None,
            batch_tokens: Some(DEFAULT_BATCH_TOKENS),
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
    /// Of `time`, what the calling thread worked alone: the node's time less the time inside
    /// the parallel regions it dispatched (its set-up, a single-threaded op), while the others
    /// idled. `None` unless the run is recorded by `codegen::kernels::pool::record_regions`.
    pub alone: Option<std::time::Duration>,
    /// Multiply-accumulates of the node's weight GEMM (`linear`, `fused_linear`, `qlinear`:
    /// tokens × K × N, the tokens this run computed); 0 for other ops.
    pub macs: u64,
    /// The int8 GEMM units' clock ticks inside the node, split into microkernel calls and
    /// epilogues, where the run is recorded by `codegen::kernels::int8::record_unit_cycles`
    /// (`None` otherwise; zero ticks for a node without int8 GEMM units).
    pub gemm_cycles: Option<codegen::kernels::int8::UnitCycles>,
}

/// A weight in the form its kernel reads, made once per session ([`lower::WeightLayout`]).
enum Packed {
    F32(PackedWeight),
    I8(PackedWeightI8),
    Table(exec::shape_ops::ConstTable),
}

struct InputSlot {
    spec: IoSpec,
    slot: usize,
}

/// A named input of a run: owned by the caller ([`Session::run`]) or borrowed (the inputs of a
/// loop body, which live in the enclosing run and are the same in every iteration).
trait Feed {
    fn name(&self) -> &str;
    fn value(&self) -> &TensorValue;
}

impl Feed for (&str, TensorValue) {
    fn name(&self) -> &str {
        self.0
    }
    fn value(&self) -> &TensorValue {
        &self.1
    }
}

impl Feed for (&str, &TensorValue) {
    fn name(&self) -> &str {
        self.0
    }
    fn value(&self) -> &TensorValue {
        self.1
    }
}

/// The body of a loop step, compiled as a session of its own (optimized and lowered on its
/// own: passes do not look into a loop) and run once per iteration.
struct CompiledBody {
    session: Session,
    parts: ir::LoopParts,
    input_names: Vec<String>,
    /// The type of one iteration's value of each scan output, the best known: what an empty
    /// stack (no iteration ran) takes its dtype and shape from.
    scan_types: Vec<ir::TensorType>,
}

impl CompiledBody {
    /// Compiles the body of loop `node`, whose outputs have the types `outputs`.
    fn compile(
        node: &str,
        carried: usize,
        body: &Graph,
        outputs: &[&ir::TensorType],
        opts: &CompileOptions,
    ) -> Result<CompiledBody, Error> {
        let bad = |message: String| Error::op(node, "loop", message);
        let parts = ir::LoopParts::of(carried, body)
            .ok_or_else(|| bad(format!("the body cannot carry {carried} values")))?;
        // The body's inputs are no batch of token sequences: padding-free packing and a batch
        // limit do not apply to them.
        let opts = CompileOptions {
            max_batch: None,
            padding_free: false,
            batch_tokens: None,
            ..opts.clone()
        };
        let session = Session::new(&Model::from_graph(body.clone())?, opts)
            .map_err(|e| bad(format!("body: {e}")))?;
        let input_names = body
            .inputs()
            .iter()
            .map(|&id| match &body.node(id).op {
                Op::Input { name } => name.clone(),
                _ => body.node(id).name.clone(),
            })
            .collect();
        let g = session.graph();
        let fixed = |t: &ir::TensorType| {
            t.shape
                .as_ref()
                .is_some_and(|s| s.iter().all(|d| d.as_fixed().is_some()))
        };
        // The body's own type of a scanned value, or the loop's type of the stack without its
        // first axis (the model may declare it), whichever has fixed dims.
        let scan_types = g.outputs()[1 + parts.carried..]
            .iter()
            .zip(&outputs[parts.carried..])
            .map(|((_, o), stacked)| {
                let each = g.outlet_type(*o);
                let from_stack = ir::TensorType {
                    dtype: each.dtype,
                    shape: stacked
                        .shape
                        .as_ref()
                        .and_then(|s| s.get(1..))
                        .map(<[_]>::to_vec),
                };
                if !fixed(each) && fixed(&from_stack) {
                    from_stack
                } else {
                    each.clone()
                }
            })
            .collect();
        Ok(CompiledBody {
            session,
            parts,
            input_names,
            scan_types,
        })
    }
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
    /// What runs: steps, buffers, weights, splits, as lowering planned them.
    program: Program,
    inputs: Vec<InputSlot>,
    /// Constant values kept unpacked, by slot.
    consts: Vec<(usize, TensorValue)>,
    /// By [`lower::WeightId`].
    weights: Vec<Packed>,
    /// The bodies of the loop steps, by step index.
    bodies: HashMap<usize, CompiledBody>,
    opts: CompileOptions,
    arenas: Mutex<Vec<Scratch>>,
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
        let threads = opts.threads.max(1);
        let program = lower::lower(
            &graph,
            lower::LowerOptions {
                threads,
                kernel: opts.kernel,
                jit: opts.jit,
            },
        )?;
        let const_of = |v: lower::ValueId| {
            graph
                .const_value(program.values[v].outlet)
                .expect("lowering names only constants as weights and constants")
        };
        let mut weights = Vec::with_capacity(program.weights.len());
        // A packed weight's source pages in a memory-mapped model file are given back once it
        // is packed, so that the weights are not resident twice (see `pages`).
        let mappings = crate::pages::FileMappings::read();
        for (w, plan) in program.weights.iter().enumerate() {
            let t = const_of(plan.source);
            let st = program
                .steps
                .iter()
                .find(|st| st.weight.is_some_and(|(_, x)| x == w))
                .expect("every weight has its step");
            let op_err = |message: String| Error::op(&st.node, st.op.name(), message);
            weights.push(match plan.layout {
                lower::WeightLayout::I8 { kernel, k, n } => {
                    let v = t.to_vec::<i8>().map_err(|e| op_err(e.to_string()))?;
                    let unit = match st.jit {
                        Some(lower::StepJit::Int8(u)) => Some(u),
                        _ => None,
                    };
                    let p = PackedWeightI8::pack(&v, k, n, Some(kernel), unit)
                        .map_err(|e| op_err(e.to_string()))?;
                    if let Some(b) = t.bytes() {
                        mappings.release(b);
                    }
                    Packed::I8(p)
                }
                lower::WeightLayout::F32 {
                    kernel,
                    k,
                    n,
                    transposed,
                } => {
                    let v = t.to_f32_vec().map_err(|e| op_err(e.to_string()))?;
                    let unit = match st.jit {
                        Some(lower::StepJit::F32(u)) => Some(u),
                        _ => None,
                    };
                    let p = PackedWeight::pack(&v, k, n, transposed, kernel, unit);
                    if let Some(b) = t.bytes() {
                        mappings.release(b);
                    }
                    Packed::F32(p)
                }
                lower::WeightLayout::Table { .. } => Packed::Table(
                    exec::shape_ops::ConstTable::new(t)
                        .ok_or_else(|| op_err("the embedding table has no bytes".into()))?,
                ),
            });
        }
        let mut consts = Vec::new();
        for v in &program.values {
            if v.home == lower::Home::Const {
                let t = graph.const_value(v.outlet).expect("a constant");
                consts.push((v.slot, TensorValue::from_ir(t)?));
            }
        }
        let mut bodies = HashMap::new();
        for (k, st) in program.steps.iter().enumerate() {
            if let Op::Loop { carried, body } = &st.op {
                let outputs: Vec<&ir::TensorType> =
                    st.outputs.iter().map(|&v| &program.values[v].ty).collect();
                let compiled = CompiledBody::compile(&st.node, *carried, body, &outputs, &opts)?;
                bodies.insert(k, compiled);
            }
        }
        // What the program copied from the model file (small constants) or left unread (the
        // separate Q, K and V weights whose merge was packed) gives its pages back too; only the
        // tables read in place at run time keep theirs.
        let in_place: Vec<*const u8> = weights
            .iter()
            .filter_map(|w| match w {
                Packed::Table(t) => Some(t.bytes_ptr()),
                _ => None,
            })
            .collect();
        for g in [model.graph(), &graph] {
            for id in g.node_ids() {
                if let Op::Const { value } = &g.node(id).op {
                    if let Some(b) = value.bytes().filter(|b| !in_place.contains(&b.as_ptr())) {
                        mappings.release(b);
                    }
                }
            }
        }
        let inputs = program
            .inputs
            .iter()
            .map(|(name, v)| InputSlot {
                spec: IoSpec {
                    name: name.clone(),
                    ty: program.values[*v].ty.clone(),
                },
                slot: program.values[*v].slot,
            })
            .collect();
        Ok(Session {
            graph,
            program,
            inputs,
            consts,
            weights,
            bodies,
            opts: CompileOptions { threads, ..opts },
            arenas: Mutex::new(Vec::new()),
        })
    }

    /// The lowered program this session executes (`encore dump --after lower` prints it).
    pub fn program(&self) -> &Program {
        &self.program
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
            if lower::trace_to_input(g, ins[1]).as_deref() != Some(input) {
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

    /// The longest sequence the model's position embeddings allow (the smallest such limit when
    /// there are several); `None` when no position lookup was found. A longer batch fails in
    /// [`Session::run`] with [`Error::SequenceTooLong`].
    ///
    /// ```
    /// use runtime::{CompileOptions, Model, Session};
    /// let g = ir::text::parse(
    ///     "%0 = input[name=\"x\"] : f32[B,S,2]\n%1 = relu(%0) : f32[B,S,2]\noutput \"h\" = %1\n",
    ///     None,
    /// ).unwrap();
    /// let s = Session::new(&Model::from_graph(g).unwrap(), CompileOptions::default()).unwrap();
    /// assert_eq!(s.max_sequence_length(), None);
    /// ```
    pub fn max_sequence_length(&self) -> Option<usize> {
        self.program.position_limits.iter().map(|(_, l)| *l).min()
    }

    /// The names of the outputs [`Session::run`] returns, in order.
    pub fn output_names(&self) -> Vec<String> {
        self.program
            .outputs
            .iter()
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Checks the inputs against the model: names, dtypes, ranks, fixed dims and consistent
    /// symbols (e.g. the same batch and sequence for every input), batch and sequence limits.
    fn validate<F: Feed>(&self, given: &[F]) -> Result<(), Error> {
        for (i, name) in given.iter().map(Feed::name).enumerate() {
            if !self.inputs.iter().any(|s| s.spec.name == *name) {
                return Err(Error::UnknownInput {
                    name: name.to_string(),
                    known: self.inputs.iter().map(|s| s.spec.name.clone()).collect(),
                });
            }
            if given[..i].iter().any(|f| f.name() == name) {
                return Err(Error::DuplicateInput {
                    name: name.to_string(),
                });
            }
        }
        // Symbol → (value, the input that bound it). Inline: a run allocates nothing here.
        let mut bound: SmallVec<[(&str, usize, &str); 4]> = SmallVec::new();
        let mut composite: SmallVec<[(&str, usize, &ir::Dim, usize); 2]> = SmallVec::new();
        for s in &self.inputs {
            let name = &s.spec.name;
            let t = given
                .iter()
                .find(|f| f.name() == name)
                .ok_or_else(|| Error::MissingInput { name: name.clone() })?
                .value();
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
                } else if let Some(sym) = dim.as_symbol() {
                    match bound.iter().find(|(s, _, _)| *s == sym) {
                        Some(&(_, v, by)) if v != actual => {
                            return Err(Error::InputShape {
                                name: name.clone(),
                                dim: d,
                                expected: format!("{sym} = {v} (as in input `{by}`)"),
                                actual,
                            })
                        }
                        Some(_) => {}
                        None => bound.push((sym, actual, name)),
                    }
                } else {
                    composite.push((name, d, dim, actual));
                }
            }
        }
        let lookup = |sym: &str| bound.iter().find(|(s, _, _)| *s == sym).map(|b| b.1);
        for (name, d, dim, actual) in composite {
            if let Ok(v) = dim.eval_by(lookup) {
                if v != actual {
                    return Err(Error::InputShape {
                        name: name.to_string(),
                        dim: d,
                        expected: format!("{dim} = {v}"),
                        actual,
                    });
                }
            }
        }
        if let Some(max) = self.opts.max_batch {
            for t in given.iter().map(Feed::value) {
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
        for (node, limit) in &self.program.position_limits {
            for inp in &self.program.token_inputs {
                if let Some(t) = given.iter().find(|f| f.name() == inp).map(Feed::value) {
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
        Ok(())
    }

    /// The sequence length of this run, if the model has token inputs.
    fn seq_len<F: Feed>(&self, given: &[F]) -> Option<usize> {
        self.program.token_inputs.iter().find_map(|inp| {
            given
                .iter()
                .find(|f| f.name() == inp)
                .map(Feed::value)
                .and_then(|t| (t.rank() >= 2).then(|| *t.shape().last().unwrap()))
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
        let mut out = Vec::new();
        self.run_inner(inputs, &mut out, None, None)?;
        Ok(out)
    }

    /// [`Session::run`] into `outputs`: what `outputs` holds on entry (the outputs of an earlier
    /// run, or nothing) gives its buffers back to the session first, and on success it holds
    /// this run's outputs, in the model's order, in place of the old ones (their names kept). A
    /// loop that keeps one `outputs` allocates nothing per run once warm, not even the outputs
    /// (`tests/steady_state_alloc.rs`), and writes them into pages it touched before: a server
    /// or a benchmark loop spends no time in the page faults of fresh output buffers (3.7 ms
    /// of a DistilBERT INT8 batch of 32 × 128 on Zen 4). On error `outputs` is left empty.
    ///
    /// ```
    /// use runtime::{Model, Session, TensorValue};
    /// let g = ir::text::parse(
    ///     "%0 = input[name=\"x\"] : f32[B,2]\n%1 = relu(%0) : f32[B,2]\noutput \"y\" = %1\n",
    ///     None,
    /// ).unwrap();
    /// let session = Session::builder(&Model::from_graph(g)?).threads(1).build()?;
    /// let mut out = Vec::new();
    /// for t in 0..3 {
    ///     let x = TensorValue::from_f32(vec![1, 2], vec![t as f32, -1.0])?;
    ///     session.run_into(&[("x", x)], &mut out)?;
    ///     assert_eq!(out[0].0, "y");
    ///     assert_eq!(out[0].1.as_f32().unwrap(), &[t as f32, 0.0]);
    /// }
    /// let wrong = TensorValue::from_i64(vec![1, 2], vec![1, 2])?;
    /// assert!(session.run_into(&[("x", wrong)], &mut out).is_err());
    /// assert!(out.is_empty());
    /// # Ok::<(), runtime::Error>(())
    /// ```
    pub fn run_into(
        &self,
        inputs: &[(&str, TensorValue)],
        outputs: &mut Outputs,
    ) -> Result<(), Error> {
        self.run_inner(inputs, outputs, None, None)
    }

    /// [`Session::run`], keeping only the output called `name`.
    ///
    /// ```
    /// use runtime::{Model, Session, TensorValue};
    /// let g = ir::text::parse(
    ///     "%0 = input[name=\"x\"] : f32[B,2]\n%1 = relu(%0) : f32[B,2]\noutput \"y\" = %1\n",
    ///     None,
    /// ).unwrap();
    /// let session = Session::builder(&Model::from_graph(g)?).threads(1).build()?;
    /// let x = TensorValue::from_f32(vec![1, 2], vec![2.0, -1.0])?;
    /// assert_eq!(session.run_output(&[("x", x.clone())], "y")?.as_f32().unwrap(), &[2.0, 0.0]);
    /// assert!(matches!(session.run_output(&[("x", x)], "z"), Err(runtime::Error::UnknownOutput { .. })));
    /// # Ok::<(), runtime::Error>(())
    /// ```
    pub fn run_output(
        &self,
        inputs: &[(&str, TensorValue)],
        name: &str,
    ) -> Result<TensorValue, Error> {
        if !self.program.outputs.iter().any(|(n, _)| n == name) {
            return Err(Error::UnknownOutput {
                name: name.to_string(),
                known: self.output_names(),
            });
        }
        let mut kept = None;
        for (n, t) in self.run(inputs)? {
            if kept.is_none() && n == name {
                kept = Some(t);
            } else {
                self.recycle(t);
            }
        }
        kept.ok_or_else(|| Error::UnknownOutput {
            name: name.to_string(),
            known: self.output_names(),
        })
    }

    /// Gives the buffer of `t`, an output the caller is done with, to the session, whose next
    /// runs may reuse it instead of allocating (as [`Session::run_into`] does with the outputs
    /// it replaces): no page faults for fresh activation buffers in a loop that pools a hidden
    /// state and drops it, as [`crate::text::SentenceEncoder`] does. Dropped instead when every
    /// pool of buffers is in use by a run.
    ///
    /// ```
    /// use runtime::{Model, Session, TensorValue};
    /// let g = ir::text::parse(
    ///     "%0 = input[name=\"x\"] : f32[B,2]\n%1 = relu(%0) : f32[B,2]\noutput \"y\" = %1\n",
    ///     None,
    /// ).unwrap();
    /// let session = Session::builder(&Model::from_graph(g)?).threads(1).build()?;
    /// let x = TensorValue::from_f32(vec![1, 2], vec![3.0, -1.0])?;
    /// let y = session.run_output(&[("x", x.clone())], "y")?;
    /// assert_eq!(y.as_f32().unwrap(), &[3.0, 0.0]);
    /// session.recycle(y);
    /// assert_eq!(session.run_output(&[("x", x)], "y")?.as_f32().unwrap(), &[3.0, 0.0]);
    /// # Ok::<(), runtime::Error>(())
    /// ```
    pub fn recycle(&self, t: TensorValue) {
        if let Ok(mut pools) = self.arenas.lock() {
            if let Some(scratch) = pools.last_mut() {
                scratch.arena.recycle(t);
            }
        }
    }

    /// [`Session::run`], showing `observe` the input of every linear layer (`Linear`,
    /// `FusedLinear`, `QLinear`) by node name just before the layer runs: what calibration
    /// records. The batch always runs whole here (never in parts, see
    /// [`CompileOptions::batch_tokens`]), so the observer sees every row of the batch in one
    /// tensor, in the order of the inputs (calibration matches them to the batch's real tokens).
    pub fn run_observed(
        &self,
        inputs: &[(&str, TensorValue)],
        observe: LinearObserver<'_>,
    ) -> Result<Outputs, Error> {
        let mut out = Vec::new();
        self.run_inner(inputs, &mut out, None, Some(observe))?;
        Ok(out)
    }

    /// [`Session::run`], also returning the time of every executed node, in execution order.
    pub fn run_profiled(
        &self,
        inputs: &[(&str, TensorValue)],
    ) -> Result<(Outputs, Vec<NodeTime>), Error> {
        let mut out = Vec::new();
        let times = self.run_profiled_into(inputs, &mut out)?;
        Ok((out, times))
    }

    /// [`Session::run_profiled`] into `outputs`, as [`Session::run_into`] runs: what `encore
    /// bench --profile` times, so that its figures are those of the runs it timed before.
    ///
    /// ```
    /// use runtime::{Model, Session, TensorValue};
    /// let g = ir::text::parse(
    ///     "%0 = input[name=\"x\"] : f32[B,2]\n%1 = relu(%0) : f32[B,2]\noutput \"y\" = %1\n",
    ///     None,
    /// ).unwrap();
    /// let session = Session::builder(&Model::from_graph(g)?).threads(1).build()?;
    /// let x = TensorValue::from_f32(vec![1, 2], vec![3.0, -1.0])?;
    /// let mut out = Vec::new();
    /// let times = session.run_profiled_into(&[("x", x)], &mut out)?;
    /// assert_eq!(times.len(), 1);
    /// assert_eq!(times[0].op, "relu");
    /// assert_eq!(out[0].1.as_f32().unwrap(), &[3.0, 0.0]);
    /// # Ok::<(), runtime::Error>(())
    /// ```
    pub fn run_profiled_into(
        &self,
        inputs: &[(&str, TensorValue)],
        outputs: &mut Outputs,
    ) -> Result<Vec<NodeTime>, Error> {
        let mut times = Vec::with_capacity(self.program.steps.len());
        self.run_inner(inputs, outputs, Some(&mut times), None)?;
        Ok(times)
    }

    /// Runs the model into `out` (see [`Session::run_into`]).
    fn run_inner<F: Feed>(
        &self,
        inputs: &[F],
        out: &mut Outputs,
        times: Option<&mut Vec<NodeTime>>,
        observe: Option<LinearObserver<'_>>,
    ) -> Result<(), Error> {
        let mut scratch = self
            .arenas
            .lock()
            .map(|mut a| a.pop())
            .unwrap_or(None)
            .unwrap_or_default();
        // The caller's old outputs go back to the arena, where this run finds them.
        for (_, t) in out.iter_mut() {
            scratch
                .arena
                .recycle(std::mem::replace(t, TensorValue::placeholder()));
        }
        let result = self
            .validate(inputs)
            .and_then(|()| self.execute_whole_or_parts(inputs, &mut scratch, out, times, observe));
        if result.is_err() {
            for (_, t) in out.drain(..) {
                scratch.arena.recycle(t);
            }
        }
        if let Ok(mut a) = self.arenas.lock() {
            a.push(scratch);
        }
        result
    }

    /// [`Session::execute`], or [`Session::execute_parts`] when the batch runs in parts.
    fn execute_whole_or_parts<F: Feed>(
        &self,
        inputs: &[F],
        scratch: &mut Scratch,
        out: &mut Outputs,
        times: Option<&mut Vec<NodeTime>>,
        observe: Option<LinearObserver<'_>>,
    ) -> Result<(), Error> {
        // An observer sees whole-batch activations (calibration indexes their rows by the
        // batch's mask), so observed runs are never split.
        let mut parts = std::mem::take(&mut scratch.parts);
        let split = if observe.is_some() {
            None
        } else {
            self.parts_of(inputs, &mut parts)
        };
        let result = match split {
            None => self.execute(inputs, scratch, out, times, observe),
            Some(split) => {
                self.execute_parts(inputs, split, &parts.ranges, scratch, out, times, observe)
            }
        };
        scratch.parts = parts;
        result
    }

    /// The sequences of each part `inputs` would run as ([`CompileOptions::batch_tokens`]):
    /// `None` when the batch runs whole (small enough, or a program whose batch may not be
    /// split: [`Session::program`]'s `batch` says why).
    ///
    /// ```
    /// use runtime::{Model, Session, TensorValue};
    /// let g = ir::text::parse(
    ///     "%0 = input[name=\"x\"] : f32[B,2]\n%1 = relu(%0) : f32[B,2]\noutput \"y\" = %1\n",
    ///     None,
    /// ).unwrap();
    /// let model = Model::from_graph(g)?;
    /// let session = Session::builder(&model).batch_tokens(Some(2)).build()?;
    /// let x = TensorValue::from_f32(vec![4, 2], vec![1.0, -1.0, 2.0, -2.0, 3.0, -3.0, 4.0, -4.0])?;
    /// // Eight positions in parts of about two tokens: four parts of one row each.
    /// assert_eq!(session.batch_parts(&[("x", x.clone())]), Some(vec![0..1, 1..2, 2..3, 3..4]));
    /// let whole = Session::builder(&model).batch_tokens(None).build()?;
    /// assert_eq!(whole.batch_parts(&[("x", x.clone())]), None);
    /// assert_eq!(session.run(&[("x", x.clone())])?, whole.run(&[("x", x)])?);
    /// # Ok::<(), runtime::Error>(())
    /// ```
    pub fn batch_parts(
        &self,
        inputs: &[(&str, TensorValue)],
    ) -> Option<Vec<std::ops::Range<usize>>> {
        let mut parts = BatchParts::default();
        self.parts_of(inputs, &mut parts).map(|_| parts.ranges)
    }

    /// The sequences of each part when this batch runs in parts
    /// ([`CompileOptions::batch_tokens`]), else `None`. Parts hold whole sequences and about the
    /// same number of real tokens (the token mask's non-zeros when the program packs tokens,
    /// else every position); with the program's split that allows them.
    /// The ranges go to `parts.ranges`, valid when the split is returned.
    fn parts_of<F: Feed>(&self, inputs: &[F], parts: &mut BatchParts) -> Option<&BatchSplit> {
        let split = self.program.batch.as_ref().ok()?;
        let budget = self.opts.batch_tokens?.max(1);
        let first = inputs
            .iter()
            .find(|f| split.inputs.iter().any(|n| n == f.name()))?
            .value();
        let batch = *first.shape().first()?;
        let threshold = budget + budget / 2;
        // Real tokens are at most the positions: a small batch is decided without reading its
        // mask (and without allocating).
        if batch < 2 || first.len() <= threshold {
            return None;
        }
        let BatchParts { per_seq, ranges } = parts;
        match &split.tokens {
            Some(mask) => inputs
                .iter()
                .find(|f| f.name() == mask)?
                .value()
                .nonzero_per_row_into(per_seq),
            None => {
                per_seq.clear();
                per_seq.resize(batch, first.shape()[1..].iter().product::<usize>());
            }
        };
        let total: usize = per_seq.iter().sum();
        if total <= threshold {
            return None;
        }
        let n = total.div_ceil(budget).min(batch);
        let target = total.div_ceil(n);
        ranges.clear();
        let (mut start, mut acc) = (0, 0);
        for (i, t) in per_seq.iter().enumerate() {
            acc += t;
            if acc >= target * (ranges.len() + 1) && i + 1 < batch {
                ranges.push(start..i + 1);
                start = i + 1;
            }
        }
        ranges.push(start..batch);
        (ranges.len() > 1).then_some(split)
    }

    /// [`Session::execute`] on each part of the batch in turn (the batched inputs' rows of the
    /// part, the others whole), the outputs laid one after another along dim 0.
    #[allow(clippy::too_many_arguments)]
    fn execute_parts<F: Feed>(
        &self,
        inputs: &[F],
        split: &BatchSplit,
        parts: &[std::ops::Range<usize>],
        scratch: &mut Scratch,
        out: &mut Outputs,
        mut times: Option<&mut Vec<NodeTime>>,
        mut observe: Option<LinearObserver<'_>>,
    ) -> Result<(), Error> {
        let batched: SmallVec<[bool; 4]> = inputs
            .iter()
            .map(|f| split.inputs.iter().any(|n| n == f.name()))
            .collect();
        // The whole outputs, made at the first part with room for every row (in buffers of the
        // arena, where `run_into` put the caller's old outputs); each part's outputs are
        // appended (the parts are consecutive rows from the first) and go back to the arena,
        // which the next part reuses (a part's outputs leaving the session would make the
        // arena allocate activation buffers again for every part).
        let batch = parts.last().map_or(0, |r| r.end);
        let mut part = std::mem::take(&mut scratch.part_outputs);
        for (p, rows) in parts.iter().enumerate() {
            let sliced: SmallVec<[Option<TensorValue>; 4]> = inputs
                .iter()
                .zip(&batched)
                .map(|(f, &b)| b.then(|| f.value().rows_in(rows.clone(), &mut scratch.arena)))
                .collect();
            let feeds: SmallVec<[(&str, &TensorValue); 4]> = inputs
                .iter()
                .zip(&sliced)
                .map(|(f, s)| (f.name(), s.as_ref().unwrap_or(f.value())))
                .collect();
            let ran = self.execute(
                &feeds,
                scratch,
                &mut part,
                times.as_deref_mut(),
                observe.as_mut().map(|o| &mut **o as LinearObserver<'_>),
            );
            drop(feeds);
            for t in sliced.into_iter().flatten() {
                scratch.arena.recycle(t);
            }
            if let Err(e) = ran {
                scratch.part_outputs = part;
                return Err(e);
            }
            let ctx = Ctx {
                threads: self.opts.threads,
                arena: &mut scratch.arena,
            };
            for (i, (name, t)) in part.iter_mut().enumerate() {
                let t = std::mem::replace(t, TensorValue::placeholder());
                if p == 0 {
                    let whole = TensorValue::with_row_capacity(&t, batch, ctx.arena);
                    put_output(out, i, name, whole);
                }
                let appended = out[i].1.append_rows(&t, &ctx);
                ctx.arena.recycle(t);
                appended?;
            }
        }
        scratch.part_outputs = part;
        if let Some((name, t)) = out.iter().find(|(_, t)| t.shape().first() != Some(&batch)) {
            return Err(Error::Invalid(format!(
                "internal: the parts gave output `{name}` {:?}, not {batch} rows",
                t.shape()
            )));
        }
        Ok(())
    }

    fn execute<F: Feed>(
        &self,
        inputs: &[F],
        scratch: &mut Scratch,
        out: &mut Outputs,
        times: Option<&mut Vec<NodeTime>>,
        observe: Option<LinearObserver<'_>>,
    ) -> Result<(), Error> {
        let mut slots: Vec<Slot<'_>> = relabel_empty(std::mem::take(&mut scratch.slots));
        slots.resize_with(self.program.slots, || Slot::Empty);
        let result = self.execute_in(inputs, &mut slots, &mut scratch.arena, out, times, observe);
        for s in slots.drain(..) {
            if let Slot::Own(t) = s {
                scratch.arena.recycle(t);
            }
        }
        scratch.slots = relabel_empty(slots);
        result
    }

    /// Runs the steps, the outputs into `out` (see [`put_output`]).
    fn execute_in<'s, F: Feed>(
        &'s self,
        inputs: &'s [F],
        slots: &mut [Slot<'s>],
        arena: &mut Arena,
        out: &mut Outputs,
        mut times: Option<&mut Vec<NodeTime>>,
        mut observe: Option<LinearObserver<'_>>,
    ) -> Result<(), Error> {
        let program = &self.program;
        let slot = |v: lower::ValueId| program.values[v].slot;
        for (s, t) in &self.consts {
            slots[*s] = Slot::Ref(t);
        }
        for i in &self.inputs {
            let t = inputs
                .iter()
                .find(|f| f.name() == i.spec.name)
                .expect("validated")
                .value();
            slots[i.slot] = Slot::Ref(t);
        }
        // Only an error message needs it, but `inputs` is generic and the steps are not.
        let seq = self.seq_len(inputs);
        let mut ctx = Ctx {
            threads: self.opts.threads,
            arena,
        };
        for (k, st) in program.steps.iter().enumerate() {
            // Inputs read for the last time, once, are handed over owned.
            // Inline storage: no heap allocation per step for the usual handful of inputs.
            let mut owned: SmallVec<[Option<TensorValue>; 8]> = SmallVec::new();
            for &v in &st.inputs {
                let once = st.inputs.iter().filter(|&&x| x == v).count() == 1;
                let dying = once && st.frees.binary_search(&v).is_ok();
                owned.push(if dying {
                    match std::mem::replace(&mut slots[slot(v)], Slot::Empty) {
                        Slot::Own(t) => Some(t),
                        other => {
                            slots[slot(v)] = other;
                            None
                        }
                    }
                } else {
                    None
                });
            }
            let packed_slot = st.weight.map(|(i, _)| i);
            let mut ins: SmallVec<[Input<'_>; 8]> = st
                .inputs
                .iter()
                .zip(owned)
                .enumerate()
                .map(|(k, (&v, o))| match o {
                    Some(t) => Ok(Input::Own(t)),
                    // A packed weight is not kept unpacked: the kernel reads the packed form.
                    None if packed_slot == Some(k) && slots[slot(v)].get().is_none() => {
                        Ok(Input::Own(TensorValue::placeholder()))
                    }
                    None => slots[slot(v)].get().map(Input::Ref).ok_or_else(|| {
                        Error::Invalid(format!(
                            "internal: value read by `{}` is not available",
                            st.node
                        ))
                    }),
                })
                .collect::<Result<_, _>>()?;
            let t0 = times.is_some().then(std::time::Instant::now);
            let regions0 = times
                .is_some()
                .then(codegen::kernels::pool::recorded_so_far)
                .flatten();
            let cycles0 = times
                .is_some()
                .then(codegen::kernels::int8::unit_cycles_so_far)
                .flatten();
            if let Some(obs) = observe.as_deref_mut() {
                if matches!(
                    st.op,
                    Op::Linear | Op::FusedLinear { .. } | Op::QLinear { .. }
                ) {
                    obs(&st.node, ins[0].get());
                }
            }
            // m·k of a weight GEMM's activation, before the step may take its input.
            let gemm_mk = (times.is_some()
                && matches!(
                    st.op,
                    Op::Linear | Op::FusedLinear { .. } | Op::QLinear { .. }
                ))
            .then(|| ins.first().map_or(0, |a| a.get().len() as u64));
            let outs = self.exec_step(k, st, &mut ins, &mut ctx, seq);
            if let (Some(t), Some(t0)) = (times.as_deref_mut(), t0) {
                let time = t0.elapsed();
                let alone = regions0
                    .zip(codegen::kernels::pool::recorded_so_far())
                    .map(|(a, b)| time.saturating_sub(b.inside.saturating_sub(a.inside)));
                let gemm_cycles = cycles0
                    .zip(codegen::kernels::int8::unit_cycles_so_far())
                    .map(|(a, b)| b - a);
                // N of the packed weight: the outputs' widths do not say it (quantized heads
                // write 2H bytes, scales and H floats; a u8 fork doubles the output).
                let n = match st.weight.map(|(_, w)| &self.weights[w]) {
                    Some(Packed::F32(p)) => p.n(),
                    Some(Packed::I8(p)) => p.n(),
                    _ => outs
                        .as_ref()
                        .ok()
                        .and_then(|o| o.first())
                        .and_then(|o| o.shape().last().copied())
                        .unwrap_or(0),
                } as u64;
                t.push(NodeTime {
                    node: st.node.clone(),
                    op: st.op.name(),
                    kind: st.op.kind(),
                    time,
                    alone,
                    macs: gemm_mk.unwrap_or(0) * n,
                    gemm_cycles,
                });
            }
            for i in ins.drain(..) {
                if let Input::Own(t) = i {
                    ctx.arena.recycle(t);
                }
            }
            // Ends the borrows of `slots` before they are written below.
            drop(ins);
            let outs = outs?;
            for &v in &st.frees {
                if let Slot::Own(t) = std::mem::replace(&mut slots[slot(v)], Slot::Empty) {
                    ctx.arena.recycle(t);
                }
            }
            for (&v, t) in st.outputs.iter().zip(outs) {
                if st.frees.binary_search(&v).is_ok() {
                    ctx.arena.recycle(t);
                } else {
                    slots[slot(v)] = Slot::Own(t);
                }
            }
        }
        for (i, (name, v)) in program.outputs.iter().enumerate() {
            let used_later = program.outputs[i + 1..].iter().any(|(_, x)| x == v);
            let s = slot(*v);
            let t = match std::mem::replace(&mut slots[s], Slot::Empty) {
                Slot::Own(t) if used_later => {
                    slots[s] = Slot::Own(t.clone());
                    t
                }
                Slot::Own(t) => t,
                Slot::Ref(t) => {
                    slots[s] = Slot::Ref(t);
                    t.clone()
                }
                Slot::Empty => {
                    return Err(Error::Invalid(format!(
                        "internal: output `{name}` was not computed"
                    )))
                }
            };
            put_output(out, i, name, t);
        }
        out.truncate(program.outputs.len());
        Ok(())
    }

    /// Runs step `k` (`st`); `seq` is the run's sequence length, for error messages.
    fn exec_step(
        &self,
        k: usize,
        st: &lower::Step,
        ins: &mut [Input<'_>],
        ctx: &mut Ctx<'_>,
        seq: Option<usize>,
    ) -> Result<exec::Outs, Error> {
        use exec::{
            attention, control, elementwise as ew, fused, nn, packing, quant, shape_ops as so,
        };
        let node = st.node.as_str();
        let weight = st.weight.map(|(_, w)| &self.weights[w]);
        let packed = match weight {
            Some(Packed::F32(p)) => Some(p),
            _ => None,
        };
        let one = |t: TensorValue| Ok(smallvec::smallvec![t]);
        // Takes input `i` out of the list (so it can be moved into the kernel).
        fn take<'a>(ins: &mut [Input<'a>], i: usize) -> Input<'a> {
            std::mem::replace(&mut ins[i], Input::Own(TensorValue::placeholder()))
        }
        let r = |i: usize| -> &TensorValue { ins[i].get() };
        match &st.op {
            Op::Input { .. } | Op::Const { .. } => unreachable!("not steps"),
            Op::Binary(b) => {
                // Operands not reused in place stay in `ins`, which the caller recycles.
                let (x, y) = ins.split_at_mut(1);
                one(ew::binary(*b, &mut x[0], &mut y[0], ctx, node)?)
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
            Op::Cast { to } => one(ew::cast(take(ins, 0), *to, ctx.arena, node)?),
            Op::Shape { start, end } => one(so::shape(r(0), *start, *end, ctx.arena)),
            Op::Reshape { allowzero } => {
                let (x, spec) = ins.split_at_mut(1);
                let spec = spec[0].get();
                one(so::reshape(take(x, 0), spec, *allowzero, ctx.arena, node)?)
            }
            Op::Transpose { perm } => one(so::transpose(r(0), perm, Some(ctx.arena), node)?),
            Op::Unsqueeze { axes } | Op::Squeeze { axes } => {
                // Axes given as an input (known only at run time) replace the attribute.
                let axes: SmallInts = match ins.get(1) {
                    None => axes.iter().copied().collect(),
                    Some(a) => a.get().to_small_ints().map_err(|_| {
                        Error::op(
                            node,
                            st.op.name(),
                            format!("axes must be integer, got {}", a.get().dtype()),
                        )
                    })?,
                };
                let x = take(ins, 0);
                one(if matches!(st.op, Op::Unsqueeze { .. }) {
                    so::unsqueeze(x, &axes, ctx.arena, node)?
                } else {
                    so::squeeze(x, &axes, ctx.arena, node)?
                })
            }
            Op::Flatten { axis } => one(so::flatten(take(ins, 0), *axis, ctx.arena, node)?),
            Op::Concat { axis } => {
                let xs: Vec<&TensorValue> = ins.iter().map(|i| i.get()).collect();
                one(so::concat(&xs, *axis, node)?)
            }
            Op::Split { axis, num_outputs } => {
                so::split(r(0), ins.get(1).map(|i| i.get()), *axis, *num_outputs, node)
                    .map(Into::into)
            }
            Op::Gather { axis } => {
                let allow_negative = !matches!(st.lookup, Lookup::Token { .. });
                let gathered = match weight {
                    Some(Packed::Table(table)) => table.gather(r(1), allow_negative, ctx, node)?,
                    _ => so::gather(r(0), r(1), *axis, allow_negative, Some(ctx), node)?,
                };
                match gathered {
                    Ok(t) => one(t),
                    Err(oor) => Err(self.lookup_error(st, oor, seq)),
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
                let args: SmallVec<[&TensorValue; 4]> = ins[1..].iter().map(|i| i.get()).collect();
                one(so::slice(r(0), &args, ctx.arena, node)?)
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
                ctx.arena,
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
                let Some(Packed::I8(w)) = weight else {
                    unreachable!("qlinear weights are packed at compile time")
                };
                let params = act.row_param_inputs();
                let first = 3 + params + usize::from(*smooth);
                let then = st.then.and_then(|t| match &self.weights[t.weight] {
                    Packed::I8(p) => Some((p, t)),
                    _ => None,
                });
                Ok(fused::qlinear(
                    r(0),
                    w,
                    then,
                    r(2),
                    smooth.then(|| r(3 + params)),
                    matches!(act, ir::ActQuant::TokenU8).then(|| (r(3), r(4))),
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
            Op::Attention {
                num_heads,
                scale,
                products,
            } => {
                let mask = ins.get(3).map(|i| i.get());
                one(attention::attention(
                    r(0),
                    r(1),
                    r(2),
                    mask,
                    attention::Heads {
                        num_heads: *num_heads,
                        scale: *scale,
                        products: *products,
                    },
                    ctx,
                    node,
                )?)
            }
            Op::AttentionQkv {
                num_heads,
                scale,
                products,
                out_u8,
            } => {
                let (qkv, at) = attention::QkvInput::of(ins, node)?;
                let (quant, rest) = attention_out(ins, *out_u8, node)?;
                let mask = rest.get(at).map(|i| i.get());
                one(attention::attention_qkv(
                    qkv,
                    mask,
                    attention::Heads {
                        num_heads: *num_heads,
                        scale: *scale,
                        products: *products,
                    },
                    quant,
                    ctx,
                    node,
                )?)
            }
            Op::AttentionPacked {
                num_heads,
                scale,
                products,
                out_u8,
            } => {
                let (qkv, at) = attention::QkvInput::of(ins, node)?;
                let (quant, rest) = attention_out(ins, *out_u8, node)?;
                let mask = rest
                    .get(at)
                    .ok_or_else(|| Error::op(node, "attention_packed", "no mask input"))?;
                let bias = rest.get(at + 1).map(|i| i.get());
                one(attention::attention_packed(
                    qkv,
                    mask.get(),
                    bias,
                    attention::Heads {
                        num_heads: *num_heads,
                        scale: *scale,
                        products: *products,
                    },
                    quant,
                    ctx,
                    node,
                )?)
            }
            Op::PackRows => one(packing::pack_rows(r(0), r(1), ctx, node)?),
            Op::UnpackRows => one(packing::unpack_rows(r(0), r(1), ctx, node)?),
            Op::QuantizeLinear { axis, to } => {
                let zp = ins.get(2).map(|i| i.get());
                one(quant::quantize_linear(
                    r(0),
                    r(1),
                    zp,
                    *axis,
                    *to,
                    ctx.arena,
                    node,
                )?)
            }
            Op::DequantizeLinear { axis } => {
                let zp = ins.get(2).map(|i| i.get());
                one(quant::dequantize_linear(
                    r(0),
                    r(1),
                    zp,
                    *axis,
                    ctx.arena,
                    node,
                )?)
            }
            Op::DynamicQuantizeLinear => quant::dynamic_quantize_linear(r(0), node).map(Into::into),
            Op::MatMulInteger => {
                let azp = ins.get(2).map(|i| i.get());
                let bzp = ins.get(3).map(|i| i.get());
                one(quant::matmul_integer(r(0), r(1), azp, bzp, node)?)
            }
            Op::Loop { .. } => {
                let body = self.bodies.get(&k).ok_or_else(|| {
                    Error::Invalid(format!("internal: loop `{node}` has no compiled body"))
                })?;
                let xs: Vec<&TensorValue> = ins.iter().map(|i| i.get()).collect();
                let plan = control::LoopBody {
                    parts: body.parts,
                    input_names: &body.input_names,
                    scan_types: &body.scan_types,
                };
                control::run_loop(
                    &plan,
                    &xs,
                    &mut |feeds| {
                        let mut outs = Vec::new();
                        body.session.run_inner(feeds, &mut outs, None, None)?;
                        Ok(outs.into_iter().map(|(_, t)| t).collect())
                    },
                    node,
                )
                .map(Into::into)
            }
        }
    }

    fn lookup_error(
        &self,
        st: &lower::Step,
        oor: exec::shape_ops::OutOfRange,
        seq: Option<usize>,
    ) -> Error {
        match &st.lookup {
            Lookup::Token { input } => Error::TokenOutOfVocab {
                input: input.clone(),
                token_id: oor.index,
                vocab_size: oor.dim,
                node: st.node.clone(),
            },
            Lookup::Position { limit } => match seq {
                // Positions grow by one per token: the longest sequence that fits is shorter
                // than this one by how far the largest position overshoots the table.
                Some(len) if oor.index >= oor.dim as i64 => Error::SequenceTooLong {
                    len,
                    max_positions: limit.unwrap_or_else(|| {
                        len.saturating_sub((oor.index as usize + 1).saturating_sub(oor.dim))
                    }),
                    node: st.node.clone(),
                },
                _ => Error::op(
                    &st.node,
                    "gather",
                    format!(
                        "position index {} is outside the table of {} rows",
                        oor.index, oor.dim
                    ),
                ),
            },
            Lookup::Plain => Error::op(
                &st.node,
                "gather",
                format!(
                    "index {} is out of range for an axis of {}",
                    oor.index, oor.dim
                ),
            ),
        }
    }
}

/// The output quantization of an attention op (its `out_u8`) with its smoothing factors (the
/// last input when it has them), and the inputs before them.
fn attention_out<'i, 'v>(
    ins: &'i [Input<'v>],
    out_u8: Option<ir::OutU8>,
    node: &str,
) -> Result<
    (
        Option<crate::exec::attention::OutQuant<'i>>,
        &'i [Input<'v>],
    ),
    Error,
> {
    let Some(q) = out_u8 else {
        return Ok((None, ins));
    };
    let (inv_smooth, rest) = match (q.smooth, ins.split_last()) {
        (true, Some((factors, rest))) => {
            let f = factors.get().as_f32().ok_or_else(|| {
                Error::op(
                    node,
                    "attention",
                    "the output's smoothing factors must be f32",
                )
            })?;
            (Some(f), rest)
        }
        (true, None) => {
            return Err(Error::op(node, "attention", "no smoothing factors input"));
        }
        (false, _) => (None, ins),
    };
    let quant = crate::exec::attention::OutQuant {
        inv_smooth,
        scale: q.scale,
        zero_point: q.zero_point as f32,
    };
    Ok((Some(quant), rest))
}

/// What a run keeps for the next one: the buffers of its values and its (empty) slot list.
#[derive(Default)]
struct Scratch {
    arena: Arena,
    /// Always empty between runs; kept for its capacity.
    slots: Vec<Slot<'static>>,
    /// The outputs of one part of a batch run in parts, before they are appended to the whole
    /// (placeholders between parts); kept for its capacity and names.
    part_outputs: Outputs,
    /// How the last batch was cut into parts; kept for its capacity.
    parts: BatchParts,
}

/// The real tokens of each sequence of a batch and the parts it runs in (see
/// [`Session::batch_parts`]).
#[derive(Default)]
struct BatchParts {
    per_seq: Vec<usize>,
    ranges: Vec<std::ops::Range<usize>>,
}

/// Puts output `i` of a run, called `name`, into `out`: in place when `out` holds an output of
/// that name there (an earlier run's, whose buffer went back to the arena), so that a caller
/// who keeps `out` allocates no names; else `out` is cut to its first `i` entries and it is
/// pushed.
fn put_output(out: &mut Outputs, i: usize, name: &str, t: TensorValue) {
    match out.get_mut(i) {
        Some((n, slot)) if n == name => *slot = t,
        _ => {
            out.truncate(i);
            out.push((name.to_string(), t));
        }
    }
}

/// `v`, which is empty, as a vector of another element type of the same layout, reusing its
/// allocation (the standard library collects a mapped `IntoIter` in place when the layouts
/// match; the steady-state allocation test checks that no allocation comes of it).
fn relabel_empty<'a, 'b>(v: Vec<Slot<'a>>) -> Vec<Slot<'b>> {
    debug_assert!(v.is_empty());
    v.into_iter()
        .map(|_| unreachable!("the vector is empty"))
        .collect()
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

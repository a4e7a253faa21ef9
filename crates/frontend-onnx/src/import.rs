//! The model-level part of import: opsets, consistency checks, node order, graph inputs,
//! initializers, declared types and graph outputs. Individual ops are in `ops.rs`.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::Path;

use ir::{DType, Dim, Graph, NodeId, Op, Outlet, Shape, TensorType};

use crate::proto::{
    tensor_shape_proto::dimension, type_proto, GraphProto, ModelProto, NodeProto, TensorProto,
    ValueInfoProto,
};
use crate::tensor::{self, ExternalData};
use crate::ImportError;

/// The opsets of the default domain that the importer understands. Opsets 7 to 10 differ from
/// 11 for the imported ops only where an attribute became an input (Slice before 10, Pad and
/// Clip before 11: `ops.rs` reads both forms) or where 11 admits more (negative axes and
/// indices, more types); Scatter (9, 10) is ScatterElements. Before 7, broadcasting was an
/// attribute (`broadcast`, `axis`) of the arithmetic ops: refused. Opsets 22 to 26 changed the
/// ops imported here only by admitting more types (22: bfloat16 for Round, Sin, Cos, Dropout;
/// 23: 4-bit floats, 24: float8e8m0, 25: 2-bit integers for Cast, Reshape, Shape, Pad and the
/// other layout ops; 26: none of them), by Cast's `round_mode` (24), which applies only to
/// float8e8m0, a type encore refuses, and by two attributes of 23, `QuantizeLinear.precision` and
/// `DequantizeLinear.output_dtype`, which `ops.rs` checks. The ops that opset 23 adds (Attention,
/// RMSNormalization, RotaryEmbedding) are refused by name. Opset 27 changes only Range (a
/// `stash_type`, the precision of float16 and bfloat16 ranges: float by default, what encore
/// computes) and adds CausalConvWithState and LinearAttention, refused by name. `Loop` is imported
/// from opset 11, whose definition sets out the semantics encore implements (loop-carried values
/// as pairs of body input and output, scan outputs concatenated over the iterations); its later
/// versions (13, 16, 19, 21, 23, 24) only admit sequences, optionals and more element types,
/// none of which changes a loop over the tensors encore holds. Opset 28 changes
/// Cast, Mod, Einsum, QuantizeLinear, DequantizeLinear and more: not imported. (Checked against
/// the schemas of onnx 1.23.2: `onnx.defs.get_schema(op, v).since_version` for every imported op.)
pub(crate) const OPSETS: std::ops::RangeInclusive<i64> = 7..=27;

/// Ops whose definition has not changed since opset 1 (only types were added), so a graph of
/// only these imports at any opset below [`OPSETS`] too (the ONNX `Not` node tests are opset 1).
/// The other ops of opsets 1 to 6 differ (broadcasting as attributes, `consumed_inputs`).
const UNCHANGED_SINCE_1: [&str; 4] = ["Not", "Identity", "Shape", "Size"];

/// The name a node goes by in messages: its own name, else its first output's.
pub(crate) fn node_label(n: &NodeProto) -> String {
    if !n.name.is_empty() {
        n.name.clone()
    } else if let Some(o) = n.output.iter().find(|o| !o.is_empty()) {
        o.clone()
    } else {
        format!("<unnamed {}>", n.op_type)
    }
}

fn is_default_domain(d: &str) -> bool {
    d.is_empty() || d == "ai.onnx"
}

/// Gives each dimension a symbol: `dim_param`s sanitized into identifiers, missing dims fresh
/// `unk<N>` symbols that collide with no `dim_param` of the model.
#[derive(Default)]
struct DimNamer {
    taken: HashSet<String>,
    next: usize,
}

impl DimNamer {
    fn new(g: &GraphProto) -> DimNamer {
        let mut namer = DimNamer::default();
        namer.take_params_of(g);
        namer
    }

    /// Reserves the `dim_param`s of `g` and of its subgraphs (loop bodies declare types too).
    fn take_params_of(&mut self, g: &GraphProto) {
        for vi in g.input.iter().chain(&g.output).chain(&g.value_info) {
            if let Some(shape) = tensor_type_of(vi).and_then(|t| t.shape.as_ref()) {
                for d in &shape.dim {
                    if let Some(dimension::Value::DimParam(p)) = &d.value {
                        self.taken.insert(sanitize(p));
                    }
                }
            }
        }
        for sub in g.node.iter().flat_map(subgraphs) {
            self.take_params_of(sub);
        }
    }

    fn fresh(&mut self) -> Dim {
        loop {
            let name = format!("unk{}", self.next);
            self.next += 1;
            if !self.taken.contains(&name) {
                return Dim::sym(&name);
            }
        }
    }
}

/// Makes a `dim_param` an identifier of the text form: other characters become `_`, and a
/// leading digit gets a `_` in front.
fn sanitize(p: &str) -> String {
    let mut s: String = p
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert(0, '_');
    }
    s
}

fn tensor_type_of(vi: &ValueInfoProto) -> Option<&type_proto::Tensor> {
    match vi.r#type.as_ref()?.value.as_ref()? {
        type_proto::Value::TensorType(t) => Some(t),
    }
}

/// Import state shared by the op mappings.
pub(crate) struct Importer<'m> {
    pub(crate) graph: Graph,
    /// The default domain's opset version.
    pub(crate) opset: i64,
    /// Every imported domain's version, with `ai.onnx` spelled `""`.
    pub(crate) domains: HashMap<String, i64>,
    /// ONNX value name to the outlet carrying it.
    pub(crate) values: HashMap<&'m str, Outlet>,
    /// How often each value is read by nodes and graph outputs.
    pub(crate) uses: HashMap<&'m str, usize>,
    /// Types the model declares (`value_info`, graph outputs).
    declared: HashMap<&'m str, &'m ValueInfoProto>,
    /// The ONNX element type of values whose type the IR does not keep (FLOAT16 and BFLOAT16,
    /// widened to f32): graph inputs, initializers and `Cast` outputs; with `declared`, what
    /// `CastLike` needs to round as its target would.
    pub(crate) onnx_types: HashMap<&'m str, i32>,
    names: HashSet<String>,
    dims: DimNamer,
    pub(crate) ext: ExternalData,
}

impl<'m> Importer<'m> {
    /// A node name not used yet, `base` when possible. Unique names let
    /// [`ir::text::ConstantSource`] find constants by name. Line breaks and surrounding blanks
    /// are dropped, as the text form (one node per line, name at the end) cannot keep them.
    pub(crate) fn unique_name(&mut self, base: &str) -> String {
        let clean = base.replace(['\n', '\r'], " ");
        let base = match clean.trim() {
            "" => "unnamed",
            t => t,
        };
        let mut name = base.to_string();
        let mut k = 1;
        while self.names.contains(&name) {
            name = format!("{base}~{k}");
            k += 1;
        }
        self.names.insert(name.clone());
        name
    }

    fn convert_shape(&mut self, t: &type_proto::Tensor) -> Result<Option<Shape>, ImportError> {
        let Some(shape) = &t.shape else {
            return Ok(None);
        };
        let mut dims = Vec::with_capacity(shape.dim.len());
        for d in &shape.dim {
            dims.push(match &d.value {
                Some(dimension::Value::DimValue(v)) if *v >= 0 => Dim::fixed(*v as usize),
                Some(dimension::Value::DimParam(p)) if !p.is_empty() => Dim::sym(&sanitize(p)),
                _ => self.dims.fresh(),
            });
        }
        Ok(Some(dims))
    }

    /// The type of value `name` as produced by an op computing `dtype`: the declared shape when
    /// the model has one, checked against the declared element type.
    pub(crate) fn output_type(
        &mut self,
        name: &str,
        dtype: DType,
    ) -> Result<TensorType, ImportError> {
        let Some(vi) = self.declared.get(name).copied() else {
            return Ok(TensorType::unknown_shape(dtype));
        };
        let Some(t) = tensor_type_of(vi) else {
            return Ok(TensorType::unknown_shape(dtype));
        };
        if t.elem_type != 0 {
            let declared = tensor::value_dtype(t.elem_type, String::new)
                .map(|d| d.to_string())
                .unwrap_or_else(|_| tensor::onnx_dtype_name(t.elem_type).to_string());
            if declared != dtype.name() {
                return Err(ImportError::TypeMismatch {
                    name: name.to_string(),
                    declared,
                    computed: dtype.to_string(),
                });
            }
        }
        Ok(TensorType {
            dtype,
            shape: self.convert_shape(t)?,
        })
    }

    /// The ONNX element type of value `name` when the model says it (graph input, initializer,
    /// `Cast` output, declared type), else None.
    pub(crate) fn onnx_type(&self, name: &str) -> Option<i32> {
        self.onnx_types.get(name).copied().or_else(|| {
            let t = tensor_type_of(self.declared.get(name)?)?;
            (t.elem_type != 0).then_some(t.elem_type)
        })
    }

    /// Whether ONNX value `name` is read by anything (an empty name is an absent output).
    pub(crate) fn is_used(&self, name: &str) -> bool {
        !name.is_empty() && self.uses.get(name).copied().unwrap_or(0) > 0
    }

    /// Adds `op` as the node for ONNX node `n` and binds its outputs to `n`'s output names.
    pub(crate) fn emit(
        &mut self,
        n: &'m NodeProto,
        op: Op,
        inputs: &[Outlet],
        dtypes: &[DType],
    ) -> Result<NodeId, ImportError> {
        for (i, out) in n.output.iter().enumerate().skip(dtypes.len()) {
            // An extra output that the import already computed by other nodes is bound.
            if self.is_used(out) && !self.values.contains_key(out.as_str()) {
                return Err(ImportError::BadNode {
                    node: node_label(n),
                    op_type: n.op_type.clone(),
                    message: format!(
                        "output {i} (`{out}`) is used; encore supports only the first {}",
                        dtypes.len()
                    ),
                });
            }
        }
        let mut types = Vec::with_capacity(dtypes.len());
        for (i, &d) in dtypes.iter().enumerate() {
            types.push(match n.output.get(i) {
                Some(o) if !o.is_empty() => self.output_type(o, d)?,
                _ => TensorType::unknown_shape(d),
            });
        }
        let name = self.unique_name(&node_label(n));
        let id = self.graph.add_node(op, &name, inputs, types)?;
        for (slot, o) in n.output.iter().enumerate().take(dtypes.len()) {
            if !o.is_empty() {
                self.values.insert(o.as_str(), Outlet::new(id, slot));
            }
        }
        Ok(id)
    }

    /// Adds a helper node that an ONNX node expands into, named after it.
    pub(crate) fn emit_aux(
        &mut self,
        n: &NodeProto,
        suffix: &str,
        op: Op,
        inputs: &[Outlet],
        dtype: DType,
    ) -> Result<Outlet, ImportError> {
        let name = self.unique_name(&format!("{}/{suffix}", node_label(n)));
        let id = self
            .graph
            .add_node(op, &name, inputs, vec![TensorType::unknown_shape(dtype)])?;
        Ok(id.into())
    }
}

impl<'m> Importer<'m> {
    fn add_initializer(&mut self, t: &'m TensorProto) -> Result<(), ImportError> {
        self.onnx_types.insert(t.name.as_str(), t.data_type);
        let value = tensor::tensor_from_proto(t, &mut self.ext)?;
        let name = self.unique_name(&t.name);
        let o = self.graph.add_const(&name, value);
        self.values.insert(t.name.as_str(), o);
        Ok(())
    }

    /// Imports the nodes of a subgraph without inputs (an `If` branch) into the graph, reading
    /// values of the enclosing scopes by name, and returns the outlets of its outputs.
    pub(crate) fn import_branch(
        &mut self,
        g: &'m GraphProto,
        owner: &str,
    ) -> Result<Vec<Outlet>, ImportError> {
        if let Some(i) = g.input.first() {
            return Err(ImportError::BadNode {
                node: owner.to_string(),
                op_type: "If".into(),
                message: format!("a branch takes no inputs, this one takes `{}`", i.name),
            });
        }
        // ONNX names are unique across a graph and its subgraphs; a branch that rebinds a name of
        // an enclosing scope would make reads of it ambiguous.
        let produced = g
            .initializer
            .iter()
            .map(|t| t.name.as_str())
            .chain(g.node.iter().flat_map(|n| {
                n.output
                    .iter()
                    .filter(|o| !o.is_empty())
                    .map(String::as_str)
            }));
        for name in produced {
            if self.values.contains_key(name) {
                return Err(ImportError::DuplicateProducer {
                    name: name.to_string(),
                    first: "an enclosing graph".into(),
                    second: format!("a branch of `{owner}`"),
                });
            }
        }
        let initializers: HashSet<&str> = g.initializer.iter().map(|t| t.name.as_str()).collect();
        let outer: HashSet<&str> = self.values.keys().copied().collect();
        let order = check_and_order(g, &initializers, &outer)?;
        for t in &g.initializer {
            self.add_initializer(t)?;
        }
        for i in order {
            self.import_node(&g.node[i])?;
        }
        g.output
            .iter()
            .map(|o| {
                self.values.get(o.name.as_str()).copied().ok_or_else(|| {
                    ImportError::MissingOutput {
                        name: o.name.clone(),
                    }
                })
            })
            .collect()
    }
}

impl<'m> Importer<'m> {
    /// Imports the body of a `Loop` as a graph of its own, whose inputs are the iteration
    /// number, the condition, the carried values (`initial`: their ONNX names and outlets
    /// outside) and then every value of the enclosing scopes the body reads (ONNX bodies read
    /// them by name; the IR passes them in). Returns the body and the outlets of those captured
    /// values, the loop's last inputs. Names stay unique across the whole model.
    pub(crate) fn import_loop_body(
        &mut self,
        g: &'m GraphProto,
        owner: &str,
        initial: &[(&'m str, Outlet)],
    ) -> Result<(Graph, Vec<Outlet>), ImportError> {
        let bad = |message: String| ImportError::BadNode {
            node: owner.to_string(),
            op_type: "Loop".into(),
            message,
        };
        let carried = initial.len();
        if g.input.len() != 2 + carried || g.output.len() < 1 + carried {
            return Err(bad(format!(
                "the body takes {} inputs and gives {} outputs; carrying {carried} values it must \
                 take {} and give at least {}",
                g.input.len(),
                g.output.len(),
                2 + carried,
                1 + carried
            )));
        }
        let mut captured = Vec::new();
        for name in free_reads(g) {
            let o = *self
                .values
                .get(name)
                .ok_or_else(|| ImportError::DanglingInput {
                    node: owner.to_string(),
                    input: name.to_string(),
                })?;
            captured.push((name, o));
        }
        let mut uses = HashMap::new();
        count_uses(g, &mut uses);
        let mut declared = HashMap::new();
        for vi in g.value_info.iter().chain(&g.output) {
            declared.insert(vi.name.as_str(), vi);
        }
        // The body is imported by an importer of its own (its own scope of names), which
        // borrows the model-wide state: node names, dim symbols, external data files.
        let mut sub = Importer {
            graph: Graph::new(),
            opset: self.opset,
            domains: self.domains.clone(),
            values: HashMap::new(),
            uses,
            declared,
            onnx_types: HashMap::new(),
            names: std::mem::take(&mut self.names),
            dims: std::mem::take(&mut self.dims),
            ext: std::mem::replace(&mut self.ext, ExternalData::new(None)),
        };
        let outer_types: Vec<(TensorType, Option<i32>)> = initial
            .iter()
            .chain(&captured)
            .map(|(name, o)| (self.graph.outlet_type(*o).clone(), self.onnx_type(name)))
            .collect();
        let filled = sub.fill_loop_body(g, owner, carried, &captured, &outer_types);
        self.names = sub.names;
        self.dims = sub.dims;
        self.ext = sub.ext;
        filled?;
        let mut body = sub.graph;
        remove_dead_constants(&mut body);
        Ok((body, captured.into_iter().map(|(_, o)| o).collect()))
    }

    /// The body of [`Importer::import_loop_body`], in the body's own importer. `outer` holds the
    /// types (and ONNX element types) of the carried values, then of the captured ones.
    fn fill_loop_body(
        &mut self,
        g: &'m GraphProto,
        owner: &str,
        carried: usize,
        captured: &[(&'m str, Outlet)],
        outer: &[(TensorType, Option<i32>)],
    ) -> Result<(), ImportError> {
        let initializers: HashSet<&str> = g.initializer.iter().map(|t| t.name.as_str()).collect();
        let outer_names: HashSet<&str> = captured.iter().map(|(n, _)| *n).collect();
        let order = check_and_order(g, &initializers, &outer_names)?;
        for (i, vi) in g.input.iter().enumerate() {
            let declared = tensor_type_of(vi).filter(|t| t.elem_type != 0);
            let ty = match i {
                0 | 1 => {
                    let want = if i == 0 { DType::I64 } else { DType::Bool };
                    if let Some(t) = declared {
                        let d = tensor::value_dtype(t.elem_type, || {
                            format!("body input `{}`", vi.name)
                        })?;
                        if d != want {
                            return Err(ImportError::BadNode {
                                node: owner.to_string(),
                                op_type: "Loop".into(),
                                message: format!(
                                    "body input {i} (`{}`) is {d}, the loop gives it {want}",
                                    vi.name
                                ),
                            });
                        }
                    }
                    TensorType::new(want, vec![])
                }
                _ => {
                    let (outer_ty, outer_onnx) = &outer[i - 2];
                    // The body's declared type of a carried value, else its dtype outside: its
                    // shape may change from one iteration to the next.
                    let ty = match declared {
                        None => TensorType::unknown_shape(outer_ty.dtype),
                        Some(t) => {
                            let d = tensor::value_dtype(t.elem_type, || {
                                format!("body input `{}`", vi.name)
                            })?;
                            if d != outer_ty.dtype {
                                return Err(ImportError::TypeMismatch {
                                    name: vi.name.clone(),
                                    declared: d.to_string(),
                                    computed: outer_ty.dtype.to_string(),
                                });
                            }
                            TensorType {
                                dtype: d,
                                shape: self.convert_shape(t)?,
                            }
                        }
                    };
                    if let Some(e) = declared.map(|t| t.elem_type).or(*outer_onnx) {
                        self.onnx_types.insert(vi.name.as_str(), e);
                    }
                    ty
                }
            };
            self.add_body_input(&vi.name, ty);
        }
        for (k, (name, _)) in captured.iter().enumerate() {
            let (ty, onnx) = &outer[carried + k];
            if let Some(e) = onnx {
                self.onnx_types.insert(name, *e);
            }
            self.add_body_input(name, ty.clone());
        }
        for t in &g.initializer {
            self.add_initializer(t)?;
        }
        for i in order {
            self.import_node(&g.node[i])?;
        }
        let mut names: HashSet<String> = HashSet::new();
        for o in &g.output {
            let outlet =
                *self
                    .values
                    .get(o.name.as_str())
                    .ok_or_else(|| ImportError::MissingOutput {
                        name: o.name.clone(),
                    })?;
            // One ONNX value may be two outputs (a carried value also scanned); IR outputs are
            // told apart by name.
            let mut name = o.name.clone();
            let mut k = 1;
            while !names.insert(name.clone()) {
                name = format!("{}~{k}", o.name);
                k += 1;
            }
            self.graph.set_output(&name, outlet);
        }
        Ok(())
    }

    fn add_body_input(&mut self, name: &'m str, ty: TensorType) {
        let node_name = self.unique_name(name);
        let o = self.graph.add_input(name, ty);
        self.graph.node_mut(o.node).name = node_name;
        self.values.insert(name, o);
    }
}

/// Imports a decoded model.
pub(crate) fn import_model(model: &ModelProto, base: Option<&Path>) -> Result<Graph, ImportError> {
    let g = model.graph.as_ref().ok_or(ImportError::MissingGraph)?;

    let mut domains: HashMap<String, i64> = HashMap::new();
    for o in &model.opset_import {
        let d = if is_default_domain(&o.domain) {
            String::new()
        } else {
            o.domain.clone()
        };
        if let Some(&v) = domains.get(&d) {
            if v != o.version {
                return Err(ImportError::ConflictingOpsets {
                    domain: o.domain.clone(),
                    first: v,
                    second: o.version,
                });
            }
        }
        domains.insert(d, o.version);
    }
    // Only the default domain is imported; other domains matter only if a node uses one, and then
    // that node is reported as unsupported.
    let opset = domains.get("").copied().unwrap_or(0);
    let old_but_unchanged = (1..*OPSETS.start()).contains(&opset)
        && g.node.iter().all(|n| {
            !is_default_domain(&n.domain) || UNCHANGED_SINCE_1.contains(&n.op_type.as_str())
        });
    if g.node.iter().any(|n| is_default_domain(&n.domain))
        && !OPSETS.contains(&opset)
        && !old_but_unchanged
    {
        return Err(ImportError::UnsupportedOpset {
            domain: String::new(),
            version: opset,
        });
    }

    let initializers: HashSet<&str> = g.initializer.iter().map(|t| t.name.as_str()).collect();
    let order = check_and_order(g, &initializers, &HashSet::new())?;

    let mut uses: HashMap<&str, usize> = HashMap::new();
    count_uses(g, &mut uses);
    let mut declared = HashMap::new();
    for vi in g.value_info.iter().chain(&g.output) {
        declared.insert(vi.name.as_str(), vi);
    }

    let mut imp = Importer {
        graph: Graph::new(),
        opset,
        domains,
        values: HashMap::new(),
        uses,
        declared,
        onnx_types: HashMap::new(),
        names: HashSet::new(),
        dims: DimNamer::new(g),
        ext: ExternalData::new(base),
    };

    // Old exporters list initializers among the graph inputs too; those are constants.
    for vi in g
        .input
        .iter()
        .filter(|vi| !initializers.contains(vi.name.as_str()))
    {
        let what = || format!("graph input `{}`", vi.name);
        let t = tensor_type_of(vi).ok_or_else(|| ImportError::UnsupportedDType {
            what: format!("{} (not a tensor)", what()),
            data_type: 0,
        })?;
        let ty = TensorType {
            dtype: tensor::value_dtype(t.elem_type, what)?,
            shape: imp.convert_shape(t)?,
        };
        imp.onnx_types.insert(vi.name.as_str(), t.elem_type);
        let name = imp.unique_name(&vi.name);
        let o = imp.graph.add_input(&vi.name, ty);
        imp.graph.node_mut(o.node).name = name;
        imp.values.insert(vi.name.as_str(), o);
    }
    for t in &g.initializer {
        imp.add_initializer(t)?;
    }
    for i in order {
        imp.import_node(&g.node[i])?;
    }
    for o in &g.output {
        let outlet =
            *imp.values
                .get(o.name.as_str())
                .ok_or_else(|| ImportError::MissingOutput {
                    name: o.name.clone(),
                })?;
        imp.graph.set_output(&o.name, outlet);
    }

    let mut graph = imp.graph;
    remove_dead_constants(&mut graph);
    graph.verify()?;
    Ok(graph)
}

/// Counts the reads of every value by `g`'s nodes, its outputs and its subgraphs.
fn count_uses<'m>(g: &'m GraphProto, uses: &mut HashMap<&'m str, usize>) {
    for n in &g.node {
        for i in n.input.iter().filter(|i| !i.is_empty()) {
            *uses.entry(i.as_str()).or_default() += 1;
        }
        for sub in subgraphs(n) {
            count_uses(sub, uses);
        }
    }
    for o in &g.output {
        *uses.entry(o.name.as_str()).or_default() += 1;
    }
}

/// The graphs held by a node's attributes (the branches of an `If`).
pub(crate) fn subgraphs(n: &NodeProto) -> impl Iterator<Item = &GraphProto> {
    n.attribute.iter().flat_map(|a| a.g.iter().chain(&a.graphs))
}

/// What a node reads: its inputs, and the values of enclosing scopes that the nodes and outputs
/// of its subgraphs read (an `If` branch or a `Loop` body may use any value computed before
/// the node).
fn node_reads(n: &NodeProto) -> Vec<&str> {
    let mut reads: Vec<&str> = n
        .input
        .iter()
        .filter(|i| !i.is_empty())
        .map(String::as_str)
        .collect();
    for g in subgraphs(n) {
        reads.extend(free_reads(g));
    }
    reads
}

/// The values of enclosing scopes that `g` reads: what its nodes (their subgraphs included) and
/// outputs read and it does not define itself, each once, in the order of the first read.
fn free_reads(g: &GraphProto) -> Vec<&str> {
    let mut defined: HashSet<&str> = g
        .initializer
        .iter()
        .map(|t| t.name.as_str())
        .chain(g.input.iter().map(|v| v.name.as_str()))
        .collect();
    for m in &g.node {
        defined.extend(
            m.output
                .iter()
                .filter(|o| !o.is_empty())
                .map(String::as_str),
        );
    }
    let inner = g.node.iter().flat_map(node_reads);
    let outputs = g.output.iter().map(|o| o.name.as_str());
    let mut seen = HashSet::new();
    inner
        .chain(outputs)
        .filter(|r| !defined.contains(r) && seen.insert(*r))
        .collect()
}

/// Checks names (every input produced, nothing produced twice, every graph output produced) and
/// returns the node indices in a topological order: the file's order when it already is one.
/// `outer` are the values of enclosing scopes that a subgraph may read.
fn check_and_order(
    g: &GraphProto,
    initializers: &HashSet<&str>,
    outer: &HashSet<&str>,
) -> Result<Vec<usize>, ImportError> {
    // Value name to its producer: None for graph inputs and initializers, Some(i) for node i.
    let mut producer: HashMap<&str, Option<usize>> = HashMap::new();
    let mut what: HashMap<&str, String> = HashMap::new();
    for t in &g.initializer {
        if let Some(first) = what.get(t.name.as_str()) {
            return Err(ImportError::DuplicateProducer {
                name: t.name.clone(),
                first: first.clone(),
                second: format!("initializer `{}`", t.name),
            });
        }
        producer.insert(&t.name, None);
        what.insert(&t.name, format!("initializer `{}`", t.name));
    }
    for vi in &g.input {
        if initializers.contains(vi.name.as_str()) {
            continue;
        }
        if let Some(first) = what.get(vi.name.as_str()) {
            return Err(ImportError::DuplicateProducer {
                name: vi.name.clone(),
                first: first.clone(),
                second: format!("graph input `{}`", vi.name),
            });
        }
        producer.insert(&vi.name, None);
        what.insert(&vi.name, format!("graph input `{}`", vi.name));
    }
    for (i, n) in g.node.iter().enumerate() {
        for o in n.output.iter().filter(|o| !o.is_empty()) {
            let desc = format!("node `{}`", node_label(n));
            if let Some(first) = what.get(o.as_str()) {
                return Err(ImportError::DuplicateProducer {
                    name: o.clone(),
                    first: first.clone(),
                    second: desc,
                });
            }
            producer.insert(o, Some(i));
            what.insert(o, desc);
        }
    }
    let mut pending = vec![0usize; g.node.len()];
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); g.node.len()];
    for (i, n) in g.node.iter().enumerate() {
        for input in node_reads(n) {
            match producer.get(input) {
                None if outer.contains(input) => {}
                None => {
                    return Err(ImportError::DanglingInput {
                        node: node_label(n),
                        input: input.to_string(),
                    })
                }
                Some(Some(p)) => {
                    pending[i] += 1;
                    readers[*p].push(i);
                }
                Some(None) => {}
            }
        }
    }
    for o in &g.output {
        if !producer.contains_key(o.name.as_str()) && !outer.contains(o.name.as_str()) {
            return Err(ImportError::MissingOutput {
                name: o.name.clone(),
            });
        }
    }
    let mut ready: BTreeSet<usize> = (0..g.node.len()).filter(|&i| pending[i] == 0).collect();
    let mut order = Vec::with_capacity(g.node.len());
    while let Some(i) = ready.pop_first() {
        order.push(i);
        for &r in &readers[i] {
            pending[r] -= 1;
            if pending[r] == 0 {
                ready.insert(r);
            }
        }
    }
    if order.len() != g.node.len() {
        let stuck = (0..g.node.len())
            .find(|&i| pending[i] > 0)
            .expect("a node is left when the order is short");
        return Err(ImportError::Cycle {
            node: node_label(&g.node[stuck]),
        });
    }
    Ok(order)
}

/// Removes constants nothing reads, such as the axes of an `Unsqueeze` that became an attribute.
fn remove_dead_constants(g: &mut Graph) {
    let dead: Vec<NodeId> = g
        .node_ids()
        .filter(|&id| {
            matches!(g.node(id).op, Op::Const { .. })
                && g.consumers(id.into()).is_empty()
                && !g.is_graph_output(id.into())
        })
        .collect();
    for id in dead {
        g.remove_node(id);
    }
}

//! The mapping of each ONNX op (default domain, opsets 7 to 27) onto IR ops, with the ONNX rule
//! for each output dtype.

use ir::{
    BinaryOp, DType, GeluApprox, Op, Outlet, PadMode, ReduceOp, ScatterReduction, Tensor, UnaryOp,
};

use crate::import::{node_label, Importer};
use crate::proto::{AttributeProto, AttributeType, NodeProto, TensorProto};
use crate::tensor;
use crate::ImportError;

/// The highest rank an axis may assume when the input's rank is not declared (ONNX has no
/// limit; no real model comes near it).
const MAX_UNDECLARED_RANK: usize = 64;

/// One ONNX node being imported: its inputs resolved to outlets (absent ones `None`, trailing
/// absent ones dropped) and typed access to its attributes.
struct NodeCtx<'m> {
    n: &'m NodeProto,
    opset: i64,
    label: String,
    ins: Vec<Option<Outlet>>,
}

fn type_name(t: i32) -> String {
    match AttributeType::try_from(t) {
        Ok(t) => format!("{t:?}").to_uppercase(),
        Err(_) => format!("type {t}"),
    }
}

impl<'m> NodeCtx<'m> {
    fn op_type(&self) -> &'m str {
        &self.n.op_type
    }

    fn bad(&self, message: impl Into<String>) -> ImportError {
        ImportError::BadNode {
            node: self.label.clone(),
            op_type: self.n.op_type.clone(),
            message: message.into(),
        }
    }

    fn bad_attr(&self, attr: &str, message: impl Into<String>) -> ImportError {
        ImportError::BadAttribute {
            node: self.label.clone(),
            op_type: self.n.op_type.clone(),
            attr: attr.to_string(),
            message: message.into(),
        }
    }

    /// The attribute `name` when present, checked to be of type `ty`. An attribute without a type
    /// is an error too: which field holds its value would be a guess.
    fn attr(
        &self,
        name: &str,
        ty: AttributeType,
    ) -> Result<Option<&'m AttributeProto>, ImportError> {
        let Some(a) = self.n.attribute.iter().find(|a| a.name == name) else {
            return Ok(None);
        };
        if !a.ref_attr_name.is_empty() {
            return Err(self.bad_attr(
                name,
                "refers to a function attribute, which only functions have",
            ));
        }
        if a.r#type != ty as i32 {
            return Err(self.bad_attr(
                name,
                format!(
                    "expected {}, got {}",
                    type_name(ty as i32),
                    type_name(a.r#type)
                ),
            ));
        }
        Ok(Some(a))
    }

    fn int(&self, name: &str, default: i64) -> Result<i64, ImportError> {
        Ok(self.opt_int(name)?.unwrap_or(default))
    }

    fn opt_int(&self, name: &str) -> Result<Option<i64>, ImportError> {
        Ok(self.attr(name, AttributeType::Int)?.map(|a| a.i))
    }

    fn opt_float(&self, name: &str) -> Result<Option<f32>, ImportError> {
        Ok(self.attr(name, AttributeType::Float)?.map(|a| a.f))
    }

    fn flag(&self, name: &str) -> Result<bool, ImportError> {
        match self.int(name, 0)? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(self.bad_attr(name, format!("expected 0 or 1, got {v}"))),
        }
    }

    fn float(&self, name: &str, default: f32) -> Result<f32, ImportError> {
        Ok(self
            .attr(name, AttributeType::Float)?
            .map_or(default, |a| a.f))
    }

    fn ints(&self, name: &str) -> Result<Option<Vec<i64>>, ImportError> {
        Ok(self
            .attr(name, AttributeType::Ints)?
            .map(|a| a.ints.clone()))
    }

    fn string(&self, name: &str) -> Result<Option<String>, ImportError> {
        match self.attr(name, AttributeType::String)? {
            None => Ok(None),
            Some(a) => String::from_utf8(a.s.to_vec())
                .map(Some)
                .map_err(|_| self.bad_attr(name, "not UTF-8")),
        }
    }

    fn tensor(&self, name: &str) -> Result<Option<&'m TensorProto>, ImportError> {
        match self.attr(name, AttributeType::Tensor)? {
            None => Ok(None),
            Some(a) => {
                a.t.as_ref()
                    .map(Some)
                    .ok_or_else(|| self.bad_attr(name, "the tensor is missing"))
            }
        }
    }

    /// Rejects an attribute that an older opset of the op had: reading it silently would
    /// compute something else.
    fn no_attr(&self, name: &str, now: &str) -> Result<(), ImportError> {
        if self.n.attribute.iter().any(|a| a.name == name) {
            return Err(self.bad_attr(
                name,
                format!(
                    "not an attribute at opset {}; it is {now} there",
                    self.opset
                ),
            ));
        }
        Ok(())
    }

    /// Checks the number of inputs (absent trailing ones not counted).
    fn arity(&self, lo: usize, hi: usize) -> Result<(), ImportError> {
        let n = self.ins.len();
        if n < lo || n > hi {
            let want = if lo == hi {
                lo.to_string()
            } else if hi == usize::MAX {
                format!("at least {lo}")
            } else {
                format!("{lo} to {hi}")
            };
            return Err(self.bad(format!("takes {want} inputs, has {n}")));
        }
        Ok(())
    }

    fn input(&self, i: usize) -> Result<Outlet, ImportError> {
        self.opt(i)
            .ok_or_else(|| self.bad(format!("input {i} is required")))
    }

    fn opt(&self, i: usize) -> Option<Outlet> {
        self.ins.get(i).copied().flatten()
    }

    fn input_name(&self, i: usize) -> String {
        self.n.input.get(i).cloned().unwrap_or_default()
    }
}

impl<'m> Importer<'m> {
    fn dtype(&self, o: Outlet) -> DType {
        self.graph.outlet_type(o).dtype
    }

    /// Whether `o`'s declared shape has a dimension of size 0: then it has exactly one value,
    /// the empty tensor, whatever the caller passes.
    fn statically_empty(&self, o: Outlet) -> bool {
        self.graph
            .outlet_type(o)
            .shape
            .as_ref()
            .is_some_and(|s| s.iter().any(|d| d.as_fixed() == Some(0)))
    }

    /// The integer values of constant input `i` (an initializer or a `Constant`).
    fn const_ints(&self, x: &NodeCtx, i: usize, why: &str) -> Result<Vec<i64>, ImportError> {
        let o = x.input(i)?;
        let t = self
            .graph
            .const_value(o)
            .ok_or_else(|| ImportError::NonConstantInput {
                node: x.label.clone(),
                input: x.input_name(i),
                why: why.to_string(),
            })?;
        t.to_i64_vec()
            .map_err(|e| x.bad(format!("input `{}`: {e}", x.input_name(i))))
    }

    fn aux_const(&mut self, x: &NodeCtx, suffix: &str, t: Tensor) -> Outlet {
        let name = self.unique_name(&format!("{}/{suffix}", x.label));
        self.graph.add_const(&name, t)
    }

    fn same_dtypes(&self, x: &NodeCtx, ins: &[Outlet]) -> Result<DType, ImportError> {
        let d = self.dtype(ins[0]);
        for &o in &ins[1..] {
            if self.dtype(o) != d {
                let all: Vec<String> = ins.iter().map(|&o| self.dtype(o).to_string()).collect();
                return Err(x.bad(format!(
                    "inputs must share one dtype, they are {}",
                    all.join(", ")
                )));
            }
        }
        Ok(d)
    }

    fn require_dtype(
        &self,
        x: &NodeCtx,
        i: usize,
        allowed: &[DType],
    ) -> Result<DType, ImportError> {
        let d = self.dtype(x.input(i)?);
        if !allowed.contains(&d) {
            let names: Vec<&str> = allowed.iter().map(|d| d.name()).collect();
            return Err(x.bad(format!(
                "input {i} (`{}`) is {d}, expected one of {}",
                x.input_name(i),
                names.join(", ")
            )));
        }
        Ok(d)
    }

    /// Binds the node's output 0 to `o` without a node (Identity, inference-time Dropout).
    fn alias(&mut self, x: &NodeCtx<'m>, o: Outlet) -> Result<(), ImportError> {
        for (i, out) in x.n.output.iter().enumerate().skip(1) {
            if self.is_used(out) {
                return Err(x.bad(format!(
                    "output {i} (`{out}`) is used; only output 0 is supported at inference"
                )));
            }
        }
        if let Some(out) = x.n.output.first().filter(|o| !o.is_empty()) {
            // The alias is the same value, so a shape declared for it is the producer's shape.
            let declared = self.output_type(out, self.dtype(o))?;
            if self.graph.outlet_type(o).shape.is_none() {
                self.graph.node_mut(o.node).outputs[o.slot] = declared;
            }
            self.values.insert(out.as_str(), o);
        }
        Ok(())
    }

    /// Imports one node of the default domain (others are unsupported).
    pub(crate) fn import_node(&mut self, n: &'m NodeProto) -> Result<(), ImportError> {
        let label = node_label(n);
        let unsupported = |imp: &Importer| ImportError::UnsupportedOp {
            node: label.clone(),
            op_type: n.op_type.clone(),
            domain: n.domain.clone(),
            opset: if n.domain.is_empty() || n.domain == "ai.onnx" {
                imp.opset
            } else {
                imp.domains.get(&n.domain).copied().unwrap_or(0)
            },
        };
        if !(n.domain.is_empty() || n.domain == "ai.onnx") {
            return Err(unsupported(self));
        }
        let mut ins = Vec::with_capacity(n.input.len());
        for i in &n.input {
            ins.push(if i.is_empty() {
                None
            } else {
                Some(
                    *self
                        .values
                        .get(i.as_str())
                        .ok_or_else(|| ImportError::DanglingInput {
                            node: label.clone(),
                            input: i.clone(),
                        })?,
                )
            });
        }
        while ins.last() == Some(&None) {
            ins.pop();
        }
        let x = NodeCtx {
            n,
            opset: self.opset,
            label: label.clone(),
            ins,
        };
        let opset = self.opset;
        match x.op_type() {
            "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Equal" | "Less" | "Greater" | "And" | "Or"
            | "Xor" | "LessOrEqual" | "GreaterOrEqual" => {
                x.arity(2, 2)?;
                let (a, b) = (x.input(0)?, x.input(1)?);
                let op = match x.op_type() {
                    "LessOrEqual" => BinaryOp::LessOrEqual,
                    "GreaterOrEqual" => BinaryOp::GreaterOrEqual,
                    t => BinaryOp::from_name(&t.to_lowercase()).expect("listed above"),
                };
                let out = match op {
                    BinaryOp::Pow => return self.import_pow(&x, a, b),
                    BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => {
                        self.require_dtype(&x, 0, &[DType::Bool])?;
                        self.require_dtype(&x, 1, &[DType::Bool])?;
                        DType::Bool
                    }
                    BinaryOp::Equal
                    | BinaryOp::Less
                    | BinaryOp::Greater
                    | BinaryOp::LessOrEqual
                    | BinaryOp::GreaterOrEqual => {
                        self.same_dtypes(&x, &[a, b])?;
                        DType::Bool
                    }
                    _ => self.same_dtypes(&x, &[a, b])?,
                };
                self.emit(n, Op::Binary(op), &[a, b], &[out])?;
            }
            "Mod" => {
                x.arity(2, 2)?;
                let (a, b) = (x.input(0)?, x.input(1)?);
                let d = self.same_dtypes(&x, &[a, b])?;
                let op = if x.flag("fmod")? {
                    BinaryOp::Fmod
                } else if d.is_float() {
                    return Err(x.bad_attr("fmod", "must be 1 for floating-point inputs"));
                } else {
                    BinaryOp::Mod
                };
                self.require_dtype(&x, 0, &NUMERIC)?;
                self.emit(n, Op::Binary(op), &[a, b], &[d])?;
            }
            "Max" | "Min" | "Sum" | "Mean" => {
                // Variadic ops become chains, left to right; Mean(x₀, …, xₙ₋₁) is the Sum chain
                // divided once by n, as the ONNX reference computes it.
                x.arity(1, usize::MAX)?;
                let ins: Vec<Outlet> = (0..x.ins.len())
                    .map(|i| x.input(i))
                    .collect::<Result<_, _>>()?;
                let d = self.same_dtypes(&x, &ins)?;
                let mean = x.op_type() == "Mean";
                if mean {
                    self.require_dtype(&x, 0, &[DType::F32])?;
                }
                let op = match x.op_type() {
                    "Max" => BinaryOp::Max,
                    "Min" => BinaryOp::Min,
                    _ => BinaryOp::Add,
                };
                if ins.len() == 1 {
                    self.alias(&x, ins[0])?;
                } else {
                    // The last link is the node's own output, unless a division follows it.
                    let chained = if mean { ins.len() } else { ins.len() - 1 };
                    let mut acc = ins[0];
                    for (k, &o) in ins[1..chained].iter().enumerate() {
                        acc = self.emit_aux(
                            n,
                            &format!("{}{k}", op.name()),
                            Op::Binary(op),
                            &[acc, o],
                            d,
                        )?;
                    }
                    if mean {
                        let count = self.aux_const(
                            &x,
                            "count",
                            Tensor::from_vec(vec![], vec![ins.len() as f32]),
                        );
                        self.emit(n, Op::Binary(BinaryOp::Div), &[acc, count], &[d])?;
                    } else {
                        self.emit(n, Op::Binary(op), &[acc, ins[ins.len() - 1]], &[d])?;
                    }
                }
            }
            "Neg" | "Abs" | "Sqrt" | "Reciprocal" | "Exp" | "Log" | "Erf" | "Tanh" | "Sigmoid"
            | "Relu" | "Not" | "Sin" | "Cos" | "Round" | "Ceil" | "Floor" | "Sign" => {
                x.arity(1, 1)?;
                let a = x.input(0)?;
                let op = UnaryOp::from_name(&x.op_type().to_lowercase()).expect("listed above");
                let d = match op {
                    UnaryOp::Not => self.require_dtype(&x, 0, &[DType::Bool])?,
                    UnaryOp::Sin
                    | UnaryOp::Cos
                    | UnaryOp::Round
                    | UnaryOp::Ceil
                    | UnaryOp::Floor => self.require_dtype(&x, 0, &[DType::F32])?,
                    _ => self.dtype(a),
                };
                self.emit(n, Op::Unary(op), &[a], &[d])?;
            }
            "IsNaN" | "IsInf" => {
                x.arity(1, 1)?;
                let a = x.input(0)?;
                self.require_dtype(&x, 0, &[DType::F32])?;
                let op = if x.op_type() == "IsNaN" {
                    UnaryOp::IsNan
                } else {
                    let neg = x.int("detect_negative", 1)? != 0;
                    let pos = x.int("detect_positive", 1)? != 0;
                    match (neg, pos) {
                        (true, true) => UnaryOp::IsInf,
                        (false, true) => UnaryOp::IsPosInf,
                        (true, false) => UnaryOp::IsNegInf,
                        (false, false) => {
                            return Err(x.bad("detects neither infinity (both detect_* are 0)"))
                        }
                    }
                };
                self.emit(n, Op::Unary(op), &[a], &[DType::Bool])?;
            }
            "Gelu" if opset >= 20 => {
                x.arity(1, 1)?;
                let approx = match x.string("approximate")?.as_deref() {
                    None | Some("none") => GeluApprox::Erf,
                    Some("tanh") => GeluApprox::Tanh,
                    Some(other) => {
                        return Err(x.bad_attr(
                            "approximate",
                            format!("expected none or tanh, got `{other}`"),
                        ))
                    }
                };
                let a = x.input(0)?;
                let d = self.dtype(a);
                self.emit(n, Op::Gelu { approx }, &[a], &[d])?;
            }
            "If" => {
                // Both branches are imported inline and each output selects its value: a branch
                // costs nothing once the condition folds (a comparison of shapes, as in
                // DeBERTa's TorchScript export), and is computed, unused, when it does not.
                x.arity(1, 1)?;
                self.require_dtype(&x, 0, &[DType::Bool])?;
                let cond = x.input(0)?;
                let mut branches = Vec::with_capacity(2);
                for name in ["then_branch", "else_branch"] {
                    let g = x
                        .attr(name, AttributeType::Graph)?
                        .and_then(|a| a.g.as_ref())
                        .ok_or_else(|| x.bad_attr(name, "the branch graph is missing"))?;
                    branches.push(self.import_branch(g, &x.label)?);
                }
                let (then_outs, else_outs) = (&branches[0], &branches[1]);
                if then_outs.len() != n.output.len() || else_outs.len() != n.output.len() {
                    return Err(x.bad(format!(
                        "the branches have {} and {} outputs, the node {}",
                        then_outs.len(),
                        else_outs.len(),
                        n.output.len()
                    )));
                }
                for (i, out) in n.output.iter().enumerate() {
                    let (a, b) = (then_outs[i], else_outs[i]);
                    let d = self.dtype(a);
                    if self.dtype(b) != d {
                        return Err(x.bad(format!(
                            "output {i}: the branches give {d} and {}",
                            self.dtype(b)
                        )));
                    }
                    if out.is_empty() {
                        continue;
                    }
                    let ty = self.output_type(out, d)?;
                    let name = self.unique_name(&format!("{}/select{i}", x.label));
                    let id = self
                        .graph
                        .add_node(Op::Select, &name, &[cond, a, b], vec![ty])?;
                    self.values.insert(out.as_str(), Outlet::new(id, 0));
                }
            }
            "Loop" if opset >= 11 => {
                // (M?, cond?, v_initial…): the body runs at run time, as often as the values
                // say; its reads of enclosing values become inputs of the node.
                let carried = n.input.len().checked_sub(2).ok_or_else(|| {
                    x.bad("takes a trip count and a condition (either may be empty), then the initial values")
                })?;
                let body = x
                    .attr("body", AttributeType::Graph)?
                    .and_then(|a| a.g.as_ref())
                    .ok_or_else(|| x.bad_attr("body", "the body graph is missing"))?;
                let trip = match x.opt(0) {
                    Some(o) => {
                        self.require_dtype(&x, 0, &[DType::I64])?;
                        o
                    }
                    // No trip count: only the condition ends the loop.
                    None => self.aux_const(&x, "trip_count", Tensor::scalar(i64::MAX)),
                };
                let cond = match x.opt(1) {
                    Some(o) => {
                        self.require_dtype(&x, 1, &[DType::Bool])?;
                        o
                    }
                    None => self.aux_const(&x, "cond", Tensor::scalar(true)),
                };
                let mut initial = Vec::with_capacity(carried);
                for j in 0..carried {
                    initial.push((n.input[2 + j].as_str(), x.input(2 + j)?));
                }
                let (body, captured) = self.import_loop_body(body, &x.label, &initial)?;
                let scans = body.outputs().len() - 1 - carried;
                if n.output.len() != carried + scans {
                    return Err(x.bad(format!(
                        "has {} outputs; a body carrying {carried} values with {scans} scan outputs gives {}",
                        n.output.len(),
                        carried + scans
                    )));
                }
                let mut dtypes: Vec<DType> = initial.iter().map(|&(_, o)| self.dtype(o)).collect();
                dtypes.extend(
                    body.outputs()[1 + carried..]
                        .iter()
                        .map(|(_, o)| body.outlet_type(*o).dtype),
                );
                let mut inputs = vec![trip, cond];
                inputs.extend(initial.iter().map(|&(_, o)| o));
                inputs.extend(captured);
                let op = Op::Loop {
                    carried,
                    body: std::sync::Arc::new(body),
                };
                self.emit(n, op, &inputs, &dtypes)?;
            }
            "Where" => {
                x.arity(3, 3)?;
                self.require_dtype(&x, 0, &[DType::Bool])?;
                let ins = [x.input(0)?, x.input(1)?, x.input(2)?];
                let d = self.same_dtypes(&x, &ins[1..])?;
                self.emit(n, Op::Where, &ins, &[d])?;
            }
            "Clip" if opset < 11 => {
                // Clip-6: the bounds are attributes, by default the type's lowest and highest.
                x.arity(1, 1)?;
                let a = x.input(0)?;
                self.require_dtype(&x, 0, &[DType::F32])?;
                let lo = Tensor::scalar(x.float("min", f32::MIN)?);
                let hi = Tensor::scalar(x.float("max", f32::MAX)?);
                let ins = [
                    a,
                    self.aux_const(&x, "min", lo),
                    self.aux_const(&x, "max", hi),
                ];
                self.emit(n, Op::Clip, &ins, &[DType::F32])?;
            }
            "Clip" => {
                // From opset 11 the bounds are optional inputs; before, they were attributes.
                x.no_attr("min", "an input")?;
                x.no_attr("max", "an input")?;
                x.arity(1, 3)?;
                let a = x.input(0)?;
                let d = self.require_dtype(&x, 0, &NUMERIC)?;
                let mut ins = vec![a];
                for i in 1..x.ins.len() {
                    if x.opt(i).is_some() {
                        self.require_dtype(&x, i, &[d])?;
                    }
                }
                match (x.opt(1), x.opt(2)) {
                    (Some(lo), hi) => {
                        ins.push(lo);
                        ins.extend(hi);
                    }
                    // The IR has no gaps in its inputs: an absent min is the lowest value.
                    (None, Some(hi)) => {
                        let lowest = match d {
                            DType::F32 => Tensor::scalar(f32::NEG_INFINITY),
                            DType::I64 => Tensor::scalar(i64::MIN),
                            DType::I32 => Tensor::scalar(i32::MIN),
                            DType::I8 => Tensor::scalar(i8::MIN),
                            DType::I16 => Tensor::scalar(i16::MIN),
                            // The unsigned types' lowest is 0: all-zero bits.
                            d => Tensor::from_bytes(
                                d,
                                vec![],
                                bytes::Bytes::from(vec![0u8; d.size_of()]),
                            )?,
                        };
                        ins.push(self.aux_const(&x, "min", lowest));
                        ins.push(hi);
                    }
                    (None, None) => {}
                }
                self.emit(n, Op::Clip, &ins, &[d])?;
            }
            "Cast" | "CastLike" => {
                let code = if x.op_type() == "Cast" {
                    x.arity(1, 1)?;
                    let to = x
                        .opt_int("to")?
                        .ok_or_else(|| x.bad_attr("to", "missing"))?;
                    i32::try_from(to).unwrap_or(-1)
                } else {
                    // The target is the second input's type: its ONNX type where the model
                    // states it (a narrow float the IR holds as f32), else the IR's.
                    x.arity(2, 2)?;
                    let like = x.input(1)?;
                    let name = x.input_name(1);
                    self.onnx_type(&name)
                        .unwrap_or_else(|| tensor::onnx_code(self.dtype(like)))
                };
                if let Some(out) = n.output.first() {
                    self.onnx_types.insert(out.as_str(), code);
                }
                let to = tensor::value_dtype(code, || {
                    format!("node `{}` (Cast), target type", x.label)
                })?;
                // The narrow floats are f32 here; a cast to one rounds to its precision.
                let round = match crate::proto::DataType::try_from(code) {
                    Ok(crate::proto::DataType::Float16) => Some(UnaryOp::RoundToF16),
                    Ok(crate::proto::DataType::Bfloat16) => Some(UnaryOp::RoundToBf16),
                    _ => None,
                };
                match round {
                    None => {
                        self.emit(n, Op::Cast { to }, &[x.input(0)?], &[to])?;
                    }
                    Some(r) => {
                        let a = x.input(0)?;
                        let f = match self.dtype(a) {
                            DType::F32 => a,
                            _ => self.emit_aux(n, "to_f32", Op::Cast { to }, &[a], to)?,
                        };
                        self.emit(n, Op::Unary(r), &[f], &[to])?;
                    }
                }
            }
            "Size" => {
                // The product of the dims: Shape, then a product over its one axis.
                x.arity(1, 1)?;
                let shape = self.emit_aux(
                    n,
                    "shape",
                    Op::Shape {
                        start: 0,
                        end: None,
                    },
                    &[x.input(0)?],
                    DType::I64,
                )?;
                let op = Op::Reduce {
                    op: ReduceOp::Prod,
                    axes: vec![0],
                    keepdims: false,
                };
                self.emit(n, op, &[shape], &[DType::I64])?;
            }
            "Shape" => {
                x.arity(1, 1)?;
                let op = Op::Shape {
                    start: x.int("start", 0)?,
                    end: x.opt_int("end")?,
                };
                self.emit(n, op, &[x.input(0)?], &[DType::I64])?;
            }
            "Reshape" => {
                x.arity(2, 2)?;
                let a = x.input(0)?;
                self.require_dtype(&x, 1, &[DType::I64])?;
                let op = Op::Reshape {
                    allowzero: x.flag("allowzero")?,
                };
                let d = self.dtype(a);
                self.emit(n, op, &[a, x.input(1)?], &[d])?;
            }
            "Transpose" => {
                x.arity(1, 1)?;
                let a = x.input(0)?;
                let perm = match x.ints("perm")? {
                    Some(p) => p,
                    None => {
                        let rank = self.graph.outlet_type(a).rank().ok_or_else(|| {
                            x.bad_attr("perm", "absent, and the input's rank is not declared")
                        })?;
                        (0..rank as i64).rev().collect()
                    }
                };
                let d = self.dtype(a);
                self.emit(n, Op::Transpose { perm }, &[a], &[d])?;
            }
            "Unsqueeze" | "Squeeze" => {
                let a;
                let mut dynamic_axes = None;
                let axes = if opset < 13 {
                    x.arity(1, 1)?;
                    a = x.input(0)?;
                    x.ints("axes")?
                } else {
                    x.no_attr("axes", "an input")?;
                    x.arity(1, 2)?;
                    a = x.input(0)?;
                    match x.opt(1) {
                        None => None,
                        Some(o) if self.graph.const_value(o).is_none() => {
                            // Known only at run time: a second input of the IR op.
                            self.require_dtype(&x, 1, &[DType::I64])?;
                            dynamic_axes = Some(o);
                            Some(vec![])
                        }
                        Some(_) => Some(self.const_ints(&x, 1, "the axes must be constant")?),
                    }
                };
                let d = self.dtype(a);
                let op = if x.op_type() == "Unsqueeze" {
                    Op::Unsqueeze {
                        axes: axes.ok_or_else(|| x.bad("the axes are required"))?,
                    }
                } else {
                    Op::Squeeze {
                        axes: axes.unwrap_or_default(),
                    }
                };
                let ins: Vec<Outlet> = std::iter::once(a).chain(dynamic_axes).collect();
                self.emit(n, op, &ins, &[d])?;
            }
            "Concat" => {
                x.arity(1, usize::MAX)?;
                let axis = x
                    .opt_int("axis")?
                    .ok_or_else(|| x.bad_attr("axis", "missing"))?;
                let ins: Vec<Outlet> = (0..x.ins.len())
                    .map(|i| x.input(i))
                    .collect::<Result<_, _>>()?;
                let d = self.same_dtypes(&x, &ins)?;
                self.emit(n, Op::Concat { axis }, &ins, &[d])?;
            }
            "Split" => {
                let outs = n.output.len();
                if outs == 0 {
                    return Err(x.bad("has no outputs"));
                }
                let a;
                // The sizes: an attribute before opset 13, an optional input from 13.
                let split = if opset < 13 {
                    x.arity(1, 1)?;
                    a = x.input(0)?;
                    x.ints("split")?
                        .map(|s| self.aux_const(&x, "split", Tensor::from_vec(vec![s.len()], s)))
                } else {
                    x.no_attr("split", "an input")?;
                    x.arity(1, 2)?;
                    a = x.input(0)?;
                    if x.opt(1).is_some() {
                        self.require_dtype(&x, 1, &[DType::I64])?;
                    }
                    x.opt(1)
                };
                if let Some(s) = split {
                    if let Some(t) = self.graph.const_value(s) {
                        if t.len() != outs {
                            return Err(
                                x.bad(format!("split has {} sizes for {outs} outputs", t.len()))
                            );
                        }
                    }
                }
                match x.opt_int("num_outputs")? {
                    Some(_) if opset < 18 => {
                        return Err(x.bad_attr("num_outputs", "is an attribute from opset 18 only"))
                    }
                    Some(_) if split.is_some() => {
                        return Err(x.bad_attr("num_outputs", "given together with split"))
                    }
                    Some(k) if k != outs as i64 => {
                        return Err(x.bad_attr(
                            "num_outputs",
                            format!("is {k}, the node has {outs} outputs"),
                        ))
                    }
                    _ => {}
                }
                let op = Op::Split {
                    axis: x.int("axis", 0)?,
                    num_outputs: outs,
                };
                let d = self.dtype(a);
                let ins: Vec<Outlet> = std::iter::once(a).chain(split).collect();
                self.emit(n, op, &ins, &vec![d; outs])?;
            }
            "Gather" | "GatherElements" => {
                x.arity(2, 2)?;
                let (a, idx) = (x.input(0)?, x.input(1)?);
                self.require_dtype(&x, 1, &[DType::I32, DType::I64])?;
                let axis = x.int("axis", 0)?;
                let op = if x.op_type() == "Gather" {
                    Op::Gather { axis }
                } else {
                    Op::GatherElements { axis }
                };
                let d = self.dtype(a);
                self.emit(n, op, &[a, idx], &[d])?;
            }
            "Trilu" => {
                x.arity(1, 2)?;
                let a = x.input(0)?;
                let mut ins = vec![a];
                if let Some(k) = x.opt(1) {
                    self.require_dtype(&x, 1, &[DType::I64])?;
                    ins.push(k);
                }
                let d = self.dtype(a);
                self.emit(
                    n,
                    Op::Trilu {
                        upper: x.int("upper", 1)? != 0,
                    },
                    &ins,
                    &[d],
                )?;
            }
            // Scatter (opsets 9 to 10, deprecated at 11) is ScatterElements without reduction.
            "ScatterND" | "ScatterElements" | "Scatter" => {
                x.arity(3, 3)?;
                let ins = [x.input(0)?, x.input(1)?, x.input(2)?];
                self.require_dtype(&x, 1, &[DType::I64, DType::I32])?;
                let d = self.same_dtypes(&x, &[ins[0], ins[2]])?;
                let reduction = match x.string("reduction")?.as_deref() {
                    None => ScatterReduction::None,
                    Some(r) => ScatterReduction::from_name(r)
                        .filter(|_| opset >= 16)
                        .filter(|r| {
                            opset >= 18
                                || !matches!(r, ScatterReduction::Max | ScatterReduction::Min)
                        })
                        .ok_or_else(|| {
                            x.bad_attr("reduction", format!("`{r}` is not one of opset {opset}'s"))
                        })?,
                };
                let op = if x.op_type() == "ScatterND" {
                    Op::ScatterNd { reduction }
                } else {
                    Op::ScatterElements {
                        axis: x.int("axis", 0)?,
                        reduction,
                    }
                };
                self.emit(n, op, &ins, &[d])?;
            }
            "GatherND" => {
                x.arity(2, 2)?;
                let (a, idx) = (x.input(0)?, x.input(1)?);
                self.require_dtype(&x, 1, &[DType::I64])?;
                // batch_dims came at opset 12; at 11 there is none.
                let batch_dims = if opset >= 12 {
                    x.int("batch_dims", 0)?
                } else {
                    x.no_attr("batch_dims", "not defined")?;
                    0
                };
                if batch_dims < 0 {
                    return Err(x.bad_attr("batch_dims", format!("is {batch_dims}, must be >= 0")));
                }
                let d = self.dtype(a);
                self.emit(n, Op::GatherNd { batch_dims }, &[a, idx], &[d])?;
            }
            "Pad" if opset < 11 => {
                // Pad-2: the pads and the constant value are attributes.
                x.arity(1, 1)?;
                let a = x.input(0)?;
                self.require_dtype(&x, 0, &[DType::F32])?;
                let mode = pad_mode(&x, opset)?;
                let pads = x
                    .ints("pads")?
                    .ok_or_else(|| x.bad_attr("pads", "missing"))?;
                let pads = Tensor::from_vec(vec![pads.len()], pads);
                let value = Tensor::scalar(x.float("value", 0.0)?);
                let ins = [
                    a,
                    self.aux_const(&x, "pads", pads),
                    self.aux_const(&x, "value", value),
                ];
                self.emit(n, Op::Pad { mode }, &ins, &[DType::F32])?;
            }
            "Pad" => {
                x.no_attr("pads", "an input")?;
                x.no_attr("value", "an input")?;
                x.arity(2, if opset >= 18 { 4 } else { 3 })?;
                let a = x.input(0)?;
                let d = self.dtype(a);
                self.require_dtype(&x, 1, &[DType::I64])?;
                let mode = pad_mode(&x, opset)?;
                let mut ins = vec![a, x.input(1)?];
                if x.opt(2).is_some() {
                    self.require_dtype(&x, 2, &[d])?;
                }
                match (x.opt(2), x.opt(3)) {
                    (Some(v), axes) => {
                        ins.push(v);
                        ins.extend(axes);
                    }
                    (None, Some(axes)) => {
                        self.require_dtype(&x, 3, &[DType::I32, DType::I64])?;
                        // The IR has no gaps in its inputs: an absent value is 0.
                        let zero = match d {
                            DType::F32 | DType::BF16 => Tensor::scalar(0f32),
                            // All-zero bits are 0 (or false) in every integer type.
                            d => Tensor::from_bytes(
                                d,
                                vec![],
                                bytes::Bytes::from(vec![0u8; d.size_of()]),
                            )?,
                        };
                        ins.push(self.aux_const(&x, "value", zero));
                        ins.push(axes);
                    }
                    (None, None) => {}
                }
                self.emit(n, Op::Pad { mode }, &ins, &[d])?;
            }
            "Slice" if opset < 10 => {
                // Slice-1: starts, ends and axes are attributes, and there are no steps.
                x.arity(1, 1)?;
                let mut ins = vec![x.input(0)?];
                for (name, required) in [("starts", true), ("ends", true), ("axes", false)] {
                    match x.ints(name)? {
                        Some(v) => {
                            let t = Tensor::from_vec(vec![v.len()], v);
                            ins.push(self.aux_const(&x, name, t));
                        }
                        None if required => return Err(x.bad_attr(name, "missing")),
                        None => {}
                    }
                }
                let d = self.dtype(ins[0]);
                self.emit(n, Op::Slice, &ins, &[d])?;
            }
            "Slice" => {
                x.no_attr("starts", "an input")?;
                x.no_attr("ends", "an input")?;
                x.arity(3, 5)?;
                let mut ins = vec![x.input(0)?, x.input(1)?, x.input(2)?];
                for i in 1..x.ins.len() {
                    if x.opt(i).is_some() {
                        self.require_dtype(&x, i, &[DType::I32, DType::I64])?;
                    }
                }
                if x.ins.len() == 5 {
                    let axes = match x.opt(3) {
                        Some(o) => o,
                        // Steps without axes: the default axes are 0..len(starts).
                        None => {
                            let k = self
                                .const_ints(&x, 1, "steps are given without axes, which then depend on the length of starts")?
                                .len();
                            self.aux_const(
                                &x,
                                "axes",
                                Tensor::from_vec(vec![k], (0..k as i64).collect()),
                            )
                        }
                    };
                    ins.push(axes);
                    ins.push(x.input(4)?);
                } else if x.ins.len() == 4 {
                    ins.push(x.input(3)?);
                }
                let d = self.dtype(ins[0]);
                self.emit(n, Op::Slice, &ins, &[d])?;
            }
            "Expand" => {
                x.arity(2, 2)?;
                let a = x.input(0)?;
                self.require_dtype(&x, 1, &[DType::I64])?;
                let d = self.dtype(a);
                self.emit(n, Op::Expand, &[a, x.input(1)?], &[d])?;
            }
            "Tile" => {
                x.arity(2, 2)?;
                let a = x.input(0)?;
                self.require_dtype(&x, 1, &[DType::I64])?;
                let d = self.dtype(a);
                self.emit(n, Op::Tile, &[a, x.input(1)?], &[d])?;
            }
            "ConstantOfShape" => {
                x.arity(1, 1)?;
                self.require_dtype(&x, 0, &[DType::I64])?;
                let value = match x.tensor("value")? {
                    Some(t) => {
                        let v = tensor::tensor_from_proto(t, &mut self.ext)?;
                        if v.len() != 1 {
                            return Err(x.bad_attr(
                                "value",
                                format!("must hold one element, holds {}", v.len()),
                            ));
                        }
                        v
                    }
                    None => Tensor::from_vec(vec![1], vec![0.0f32]),
                };
                let d = value.dtype();
                self.emit(n, Op::ConstantOfShape { value }, &[x.input(0)?], &[d])?;
            }
            "Range" => {
                x.arity(3, 3)?;
                // Opset 27's stash_type: the precision of float16/bfloat16 ranges, float by
                // default, which is what encore computes them in (it widens them to f32).
                if let Some(t) = x.opt_int("stash_type")?.filter(|&t| t != 1) {
                    return Err(x.bad_attr(
                        "stash_type",
                        format!("{t}: encore computes ranges in FLOAT (1) only"),
                    ));
                }
                let ins = [x.input(0)?, x.input(1)?, x.input(2)?];
                self.require_dtype(&x, 0, &[DType::F32, DType::I16, DType::I32, DType::I64])?;
                let d = self.same_dtypes(&x, &ins)?;
                self.emit(n, Op::Range, &ins, &[d])?;
            }
            "CumSum" => {
                x.arity(2, 2)?;
                let a = x.input(0)?;
                self.require_dtype(&x, 1, &[DType::I32, DType::I64])?;
                let op = Op::CumSum {
                    exclusive: x.flag("exclusive")?,
                    reverse: x.flag("reverse")?,
                };
                let d = self.dtype(a);
                self.emit(n, op, &[a, x.input(1)?], &[d])?;
            }
            "Flatten" => {
                x.arity(1, 1)?;
                let a = x.input(0)?;
                let d = self.dtype(a);
                self.emit(
                    n,
                    Op::Flatten {
                        axis: x.int("axis", 1)?,
                    },
                    &[a],
                    &[d],
                )?;
            }
            "ReduceMean" | "ReduceSum" | "ReduceMax" | "ReduceMin" | "ReduceProd" | "ReduceL1"
            | "ReduceL2" | "ReduceSumSquare" | "ReduceLogSum" | "ReduceLogSumExp" => {
                self.import_reduce(&x, opset)?;
            }
            "ArgMax" | "ArgMin" => {
                x.arity(1, 1)?;
                let op = Op::ArgReduce {
                    min: x.op_type() == "ArgMin",
                    axis: x.int("axis", 0)?,
                    keepdims: x.int("keepdims", 1)? != 0,
                    last: x.flag("select_last_index")?,
                };
                self.emit(n, op, &[x.input(0)?], &[DType::I64])?;
            }
            "Einsum" => {
                let ins: Vec<Outlet> = (0..x.ins.len())
                    .map(|i| x.input(i))
                    .collect::<Result<_, _>>()?;
                if ins.is_empty() {
                    return Err(x.bad("has no operands"));
                }
                let d = self.same_dtypes(&x, &ins)?;
                let equation = x
                    .string("equation")?
                    .ok_or_else(|| x.bad_attr("equation", "is missing"))?;
                // The equation must fit the operands' ranks where they are declared.
                let ranks: Option<Vec<usize>> = ins
                    .iter()
                    .map(|&o| self.graph.outlet_type(o).rank())
                    .collect();
                if let Some(r) = ranks {
                    ir::einsum_plan(&equation, &r).map_err(|m| x.bad_attr("equation", m))?;
                }
                self.emit(n, Op::Einsum { equation }, &ins, &[d])?;
            }
            "MatMul" => {
                x.arity(2, 2)?;
                let ins = [x.input(0)?, x.input(1)?];
                let d = self.same_dtypes(&x, &ins)?;
                self.emit(n, Op::MatMul, &ins, &[d])?;
            }
            "Gemm" => {
                x.arity(2, 3)?;
                let ins: Vec<Outlet> = (0..x.ins.len())
                    .map(|i| x.input(i))
                    .collect::<Result<_, _>>()?;
                let d = self.same_dtypes(&x, &ins)?;
                let op = Op::Gemm {
                    alpha: x.float("alpha", 1.0)?,
                    beta: x.float("beta", 1.0)?,
                    trans_a: x.flag("transA")?,
                    trans_b: x.flag("transB")?,
                };
                self.emit(n, op, &ins, &[d])?;
            }
            "Softmax" | "LogSoftmax" => {
                x.arity(1, 1)?;
                let a = x.input(0)?;
                let d = self.dtype(a);
                let log = x.op_type() == "LogSoftmax";
                if log {
                    self.require_dtype(&x, 0, &[DType::F32])?;
                }
                if opset >= 13 {
                    self.softmax(&x, log, a, x.int("axis", -1)?, true)?;
                } else {
                    // Before opset 13 Softmax flattens the input to 2-D at `axis` and normalises
                    // each row, which equals a softmax over one axis only when `axis` is the last.
                    let axis = x.int("axis", 1)?;
                    let rank = self.graph.outlet_type(a).rank();
                    let last = axis == -1 || rank.is_some_and(|r| r > 0 && axis == r as i64 - 1);
                    if last {
                        self.softmax(&x, log, a, -1, true)?;
                    } else {
                        let shape = self.emit_aux(
                            n,
                            "shape",
                            Op::Shape {
                                start: 0,
                                end: None,
                            },
                            &[a],
                            DType::I64,
                        )?;
                        let flat = self.emit_aux(n, "flatten", Op::Flatten { axis }, &[a], d)?;
                        let sm = self.softmax(&x, log, flat, 1, false)?;
                        self.emit(n, Op::Reshape { allowzero: true }, &[sm, shape], &[d])?;
                    }
                }
            }
            "LayerNormalization" if opset >= 17 => {
                x.arity(2, 3)?;
                let ins: Vec<Outlet> = (0..x.ins.len())
                    .map(|i| x.input(i))
                    .collect::<Result<_, _>>()?;
                let d = self.dtype(ins[0]);
                let (axis, epsilon) = (x.int("axis", -1)?, x.float("epsilon", 1e-5)?);
                // stash_type is the precision of the statistics: f32 (1) is what encore computes.
                if let Some(t) = x.opt_int("stash_type")? {
                    if t != crate::proto::DataType::Float as i64 {
                        return Err(x.bad_attr(
                            "stash_type",
                            format!("is {t}; encore computes the statistics in FLOAT (1)"),
                        ));
                    }
                }
                if n.output.iter().skip(1).any(|o| self.is_used(o)) {
                    self.layer_norm_stats(&x, ins[0], axis, epsilon)?;
                }
                self.emit(n, Op::LayerNorm { axis, epsilon }, &ins, &[d])?;
            }
            "RMSNormalization" if opset >= 23 => self.rms_norm(&x)?,
            "Attention" if opset >= 23 => self.attention(&x, opset)?,
            "RotaryEmbedding" if opset >= 23 => self.rotary_embedding(&x)?,
            "QuantizeLinear" => {
                x.arity(2, 3)?;
                if x.int("block_size", 0)? != 0 {
                    return Err(x.bad_attr("block_size", "blocked quantization is not supported"));
                }
                let mut to = x.opt(2).map(|zp| self.dtype(zp));
                self.require_dtype(&x, 0, &[DType::F32, DType::BF16, DType::I32])?;
                self.require_dtype(&x, 1, &[DType::F32, DType::BF16])?;
                let declared = x.int("output_dtype", 0)?;
                if declared != 0 {
                    let d = tensor::value_dtype(i32::try_from(declared).unwrap_or(-1), || {
                        format!("node `{}` (QuantizeLinear), output_dtype", x.label)
                    })?;
                    if to.is_some_and(|z| z != d) {
                        return Err(x.bad_attr(
                            "output_dtype",
                            format!("is {d}, the zero point is {}", to.expect("checked")),
                        ));
                    }
                    to = Some(d);
                }
                let to = to.unwrap_or(DType::U8);
                // Opset 23: the precision of the division (0: that of the scale). encore divides
                // in f32; a narrower precision would round differently.
                if let Some(p) = x.opt_int("precision")? {
                    if p != 0 && p != crate::proto::DataType::Float as i64 {
                        return Err(x.bad_attr(
                            "precision",
                            format!(
                                "{} (opset {opset}): encore quantizes in FLOAT precision only",
                                tensor::onnx_dtype_name(i32::try_from(p).unwrap_or(-1))
                            ),
                        ));
                    }
                }
                if !matches!(to, DType::U8 | DType::I8) {
                    return Err(x.bad(format!(
                        "quantizing to {to} is not supported, only to u8 and i8"
                    )));
                }
                let ins: Vec<Outlet> = (0..x.ins.len())
                    .map(|i| x.input(i))
                    .collect::<Result<_, _>>()?;
                let op = Op::QuantizeLinear {
                    axis: x.int("axis", 1)?,
                    to,
                };
                self.emit(n, op, &ins, &[to])?;
            }
            "DequantizeLinear" => {
                x.arity(2, 3)?;
                if x.int("block_size", 0)? != 0 {
                    return Err(x.bad_attr("block_size", "blocked quantization is not supported"));
                }
                self.require_dtype(&x, 0, &[DType::U8, DType::I8, DType::I32])?;
                self.require_dtype(&x, 1, &[DType::F32, DType::BF16])?;
                let ins: Vec<Outlet> = (0..x.ins.len())
                    .map(|i| x.input(i))
                    .collect::<Result<_, _>>()?;
                let d = self.dtype(ins[1]);
                // Opset 23: the output type, which must be the scale's (floats are all f32 here).
                if let Some(o) = x.opt_int("output_dtype").map(|o| o.filter(|&o| o != 0))? {
                    let od = tensor::value_dtype(i32::try_from(o).unwrap_or(-1), || {
                        format!("node `{}` (DequantizeLinear), output_dtype", x.label)
                    })?;
                    if od != d {
                        return Err(x.bad_attr(
                            "output_dtype",
                            format!("is {od}, the scale is {d} (opset {opset})"),
                        ));
                    }
                }
                self.emit(
                    n,
                    Op::DequantizeLinear {
                        axis: x.int("axis", 1)?,
                    },
                    &ins,
                    &[d],
                )?;
            }
            "DynamicQuantizeLinear" => {
                x.arity(1, 1)?;
                self.require_dtype(&x, 0, &[DType::F32])?;
                self.emit(
                    n,
                    Op::DynamicQuantizeLinear,
                    &[x.input(0)?],
                    &[DType::U8, DType::F32, DType::U8],
                )?;
            }
            "MatMulInteger" => {
                x.arity(2, 4)?;
                let mut ins = vec![x.input(0)?, x.input(1)?];
                for i in 0..2 {
                    self.require_dtype(&x, i, &[DType::U8, DType::I8])?;
                }
                if x.ins.len() == 4 {
                    // b's zero point without a's: a's defaults to 0.
                    let azp = match x.opt(2) {
                        Some(o) => o,
                        None => {
                            let t = match self.dtype(ins[0]) {
                                DType::I8 => Tensor::scalar(0i8),
                                _ => Tensor::scalar(0u8),
                            };
                            self.aux_const(&x, "a_zero_point", t)
                        }
                    };
                    ins.push(azp);
                    ins.push(x.input(3)?);
                } else if x.ins.len() == 3 {
                    ins.push(x.input(2)?);
                }
                self.emit(n, Op::MatMulInteger, &ins, &[DType::I32])?;
            }
            "Identity" => {
                x.arity(1, 1)?;
                self.alias(&x, x.input(0)?)?;
            }
            "Dropout" => {
                // At inference Dropout passes its input through, whatever the ratio. In training
                // mode (opset 12's third input, true) it drops at random, which encore does not.
                x.arity(1, 3)?;
                if x.opt(2).is_some() {
                    let training = self.const_ints(
                        &x,
                        2,
                        "encore runs Dropout at inference only, so training_mode must be a known false",
                    )?;
                    if training.iter().any(|&t| t != 0) {
                        return Err(x.bad(
                            "training_mode is true: random dropout is not supported (inference only)",
                        ));
                    }
                }
                self.alias(&x, x.input(0)?)?;
            }
            "Constant" => {
                x.arity(0, 0)?;
                let value = self.constant_value(&x)?;
                let name = self.unique_name(&x.label);
                let o = self.graph.add_const(&name, value);
                if let Some(out) = n.output.first().filter(|o| !o.is_empty()) {
                    self.values.insert(out.as_str(), o);
                }
            }
            _ => return Err(unsupported(self)),
        }
        Ok(())
    }

    /// The Reduce* family. The five base reductions are IR ops; the others are imported as
    /// their definitions over `reduce_sum` on the same axes: `ReduceL1 = sum |x|`, `ReduceL2 =
    /// sqrt(sum x²)`, `ReduceSumSquare = sum x²`, `ReduceLogSum = log(sum x)` and
    /// `ReduceLogSumExp = log(sum exp(x - m)) + m`, with `m` the maximum over the axes (taken as
    /// 0 where it is ±inf, so that all -inf gives -inf and a +inf gives +inf), computed with
    /// kept dims and then, when `keepdims` is 0, reduced by a `reduce_max` of the size-1 axes.
    /// With `noop_with_empty_axes` and no axes the reduction is the identity (the rest stays).
    fn import_reduce(&mut self, x: &NodeCtx<'m>, opset: i64) -> Result<(), ImportError> {
        #[derive(PartialEq)]
        enum Pre {
            None,
            Abs,
            Square,
            LogSumExp,
        }
        let op_type = x.op_type();
        let (op, pre, post) = match op_type {
            "ReduceMean" => (ReduceOp::Mean, Pre::None, None),
            "ReduceSum" => (ReduceOp::Sum, Pre::None, None),
            "ReduceMax" => (ReduceOp::Max, Pre::None, None),
            "ReduceProd" => (ReduceOp::Prod, Pre::None, None),
            "ReduceMin" => (ReduceOp::Min, Pre::None, None),
            "ReduceL1" => (ReduceOp::Sum, Pre::Abs, None),
            "ReduceL2" => (ReduceOp::Sum, Pre::Square, Some(UnaryOp::Sqrt)),
            "ReduceSumSquare" => (ReduceOp::Sum, Pre::Square, None),
            "ReduceLogSum" => (ReduceOp::Sum, Pre::None, Some(UnaryOp::Log)),
            _ => (ReduceOp::Sum, Pre::LogSumExp, Some(UnaryOp::Log)),
        };
        if matches!(op_type, "ReduceL2" | "ReduceLogSum" | "ReduceLogSumExp") {
            self.require_dtype(x, 0, &[DType::F32])?;
        }
        // ReduceSum took its axes as an input from opset 13, the others from opset 18.
        let axes_as_input = opset >= if op_type == "ReduceSum" { 13 } else { 18 };
        let a = x.input(0)?;
        // Axes only known at run time: a second input of the IR op.
        let mut dynamic_axes = None;
        let axes = if axes_as_input {
            x.no_attr("axes", "an input")?;
            x.arity(1, 2)?;
            match x.opt(1) {
                None => vec![],
                Some(o) if self.graph.const_value(o).is_some() => {
                    self.const_ints(x, 1, "the axes must be constant")?
                }
                // An axes input declared with a zero-length dimension can only ever hold the
                // empty list: it is known when importing, like a constant.
                Some(o) if self.statically_empty(o) => {
                    self.require_dtype(x, 1, &[DType::I64])?;
                    vec![]
                }
                Some(o) => {
                    self.require_dtype(x, 1, &[DType::I64])?;
                    if x.flag("noop_with_empty_axes")? {
                        return Err(ImportError::NonConstantInput {
                            node: x.label.clone(),
                            input: x.input_name(1),
                            why: "with noop_with_empty_axes=1 encore needs the axes \
                                  when importing"
                                .into(),
                        });
                    }
                    dynamic_axes = Some(o);
                    vec![]
                }
            }
        } else {
            x.arity(1, 1)?;
            x.ints("axes")?.unwrap_or_default()
        };
        let d = self.dtype(a);
        let noop = axes.is_empty()
            && dynamic_axes.is_none()
            && axes_as_input
            && x.flag("noop_with_empty_axes")?;
        let keepdims = x.int("keepdims", 1)? != 0;
        let n = x.n;
        let reduce = |this: &mut Self, name: &str, op, keepdims, v: Outlet| {
            if noop {
                return Ok(v);
            }
            let ins: Vec<Outlet> = std::iter::once(v).chain(dynamic_axes).collect();
            let r = Op::Reduce {
                op,
                axes: axes.clone(),
                keepdims,
            };
            this.emit_aux(n, name, r, &ins, d)
        };
        let unary =
            |this: &mut Self, name: &str, u, v| this.emit_aux(n, name, Op::Unary(u), &[v], d);
        let binary = |this: &mut Self, name: &str, b, v, w| {
            this.emit_aux(n, name, Op::Binary(b), &[v, w], d)
        };
        if pre == Pre::None && post.is_none() {
            // A base reduction: the node's own output.
            if noop {
                return self.alias(x, a);
            }
            let ins: Vec<Outlet> = std::iter::once(a).chain(dynamic_axes).collect();
            self.emit(n, Op::Reduce { op, axes, keepdims }, &ins, &[d])?;
            return Ok(());
        }
        let mut max = None;
        let v = match pre {
            Pre::None => a,
            Pre::Abs => unary(self, "abs", UnaryOp::Abs, a)?,
            Pre::Square => binary(self, "square", BinaryOp::Mul, a, a)?,
            Pre::LogSumExp => {
                let m = reduce(self, "max", ReduceOp::Max, true, a)?;
                let is_inf = Op::Unary(UnaryOp::IsInf);
                let inf = self.emit_aux(n, "max_is_inf", is_inf, &[m], DType::Bool)?;
                let zero = self.aux_const(x, "zero", Tensor::scalar(0f32));
                let m = self.emit_aux(n, "shift", Op::Where, &[inf, zero, m], d)?;
                max = Some(m);
                let shifted = binary(self, "shifted", BinaryOp::Sub, a, m)?;
                unary(self, "exp", UnaryOp::Exp, shifted)?
            }
        };
        let mut r = reduce(self, "sum", op, keepdims || max.is_some(), v)?;
        if let Some(u) = post {
            r = unary(self, "post", u, r)?;
        }
        if let Some(m) = max {
            r = binary(self, "add_max", BinaryOp::Add, r, m)?;
            if !keepdims {
                r = reduce(self, "drop_axes", ReduceOp::Max, false, r)?;
            }
        }
        self.alias(x, r)
    }

    /// Softmax over `axis`, or with `log` LogSoftmax as `(x - max) - log(sum(exp(x - max)))`
    /// over that axis. With `last` it is the node's own output, else a helper whose outlet is
    /// returned.
    fn softmax(
        &mut self,
        x: &NodeCtx<'m>,
        log: bool,
        a: Outlet,
        axis: i64,
        last: bool,
    ) -> Result<Outlet, ImportError> {
        let n = x.n;
        let d = self.dtype(a);
        let (op, ins) = if log {
            let reduce = |op| Op::Reduce {
                op,
                axes: vec![axis],
                keepdims: true,
            };
            let m = self.emit_aux(n, "max", reduce(ReduceOp::Max), &[a], d)?;
            let shifted = self.emit_aux(n, "shifted", Op::Binary(BinaryOp::Sub), &[a, m], d)?;
            let e = self.emit_aux(n, "exp", Op::Unary(UnaryOp::Exp), &[shifted], d)?;
            let s = self.emit_aux(n, "sum", reduce(ReduceOp::Sum), &[e], d)?;
            let l = self.emit_aux(n, "log_sum", Op::Unary(UnaryOp::Log), &[s], d)?;
            (Op::Binary(BinaryOp::Sub), vec![shifted, l])
        } else {
            (Op::Softmax { axis }, vec![a])
        };
        if last {
            Ok(self.emit(n, op, &ins, &[d])?.into())
        } else {
            self.emit_aux(n, if log { "log_softmax" } else { "softmax" }, op, &ins, d)
        }
    }

    /// The axes from `axis` to the last of `a`: negative ones when `axis` is (which needs no
    /// rank), else from the declared rank (`why` says what needs them when it is unknown).
    fn axes_from(
        &self,
        x: &NodeCtx<'m>,
        a: Outlet,
        axis: i64,
        why: &str,
    ) -> Result<Vec<i64>, ImportError> {
        let rank = self.graph.outlet_type(a).rank();
        if axis < 0 {
            // An axis below −rank (or below any real rank when it is not declared) would name
            // axes that do not exist, and a huge one would make a huge list.
            let lowest = -(rank.unwrap_or(MAX_UNDECLARED_RANK) as i64);
            if axis < lowest {
                return Err(x.bad_attr("axis", format!("is {axis}, below -rank ({lowest})")));
            }
            return Ok((axis..0).collect());
        }
        let rank = rank.ok_or_else(|| {
            x.bad(format!(
                "{why} with axis {axis}, and the rank of the input is not declared"
            ))
        })?;
        Ok((axis..rank as i64).collect())
    }

    /// RMSNormalization (opset 23) as its definition: `x / sqrt(mean(x²) + epsilon) · scale`,
    /// the mean over the axes from `axis` on, in f32 (`stash_type` 1, the only one taken).
    fn rms_norm(&mut self, x: &NodeCtx<'m>) -> Result<(), ImportError> {
        x.arity(2, 2)?;
        let (a, scale) = (x.input(0)?, x.input(1)?);
        let d = self.require_dtype(x, 0, &[DType::F32])?;
        self.require_dtype(x, 1, &[DType::F32])?;
        let stash = x.int("stash_type", 1)?;
        if stash != crate::proto::DataType::Float as i64 {
            return Err(x.bad_attr(
                "stash_type",
                format!("is {stash}; encore computes the statistics in FLOAT (1)"),
            ));
        }
        let axes = self.axes_from(x, a, x.int("axis", -1)?, "RMSNormalization")?;
        let n = x.n;
        let sq = self.emit_aux(n, "sq", Op::Binary(BinaryOp::Mul), &[a, a], d)?;
        let mean = Op::Reduce {
            op: ReduceOp::Mean,
            axes,
            keepdims: true,
        };
        let ms = self.emit_aux(n, "mean_sq", mean, &[sq], d)?;
        let eps = self.aux_const(x, "epsilon", Tensor::scalar(x.float("epsilon", 1e-5)?));
        let me = self.emit_aux(n, "mean_sq_eps", Op::Binary(BinaryOp::Add), &[ms, eps], d)?;
        let rms = self.emit_aux(n, "rms", Op::Unary(UnaryOp::Sqrt), &[me], d)?;
        let normed = self.emit_aux(n, "normalized", Op::Binary(BinaryOp::Div), &[a, rms], d)?;
        self.emit(n, Op::Binary(BinaryOp::Mul), &[normed, scale], &[d])?;
        Ok(())
    }

    /// LayerNormalization's outputs 1 and 2 when used: `Mean` and `InvStdDev` (`1 / sqrt(var +
    /// epsilon)`, the population variance) over the axes from `axis` on, kept as size-1 dims,
    /// computed by reductions beside the fused LayerNorm op, which yields output 0.
    fn layer_norm_stats(
        &mut self,
        x: &NodeCtx<'m>,
        a: Outlet,
        axis: i64,
        epsilon: f32,
    ) -> Result<(), ImportError> {
        let axes = self.axes_from(x, a, axis, "its Mean or InvStdDev output is used")?;
        let d = self.require_dtype(x, 0, &[DType::F32])?;
        let n = x.n;
        let mean_op = |axes: &[i64]| Op::Reduce {
            op: ReduceOp::Mean,
            axes: axes.to_vec(),
            keepdims: true,
        };
        let mean = self.emit_aux(n, "mean", mean_op(&axes), &[a], d)?;
        let diff = self.emit_aux(n, "diff", Op::Binary(BinaryOp::Sub), &[a, mean], d)?;
        let sq = self.emit_aux(n, "sq", Op::Binary(BinaryOp::Mul), &[diff, diff], d)?;
        let var = self.emit_aux(n, "var", mean_op(&axes), &[sq], d)?;
        let eps = self.aux_const(x, "epsilon", Tensor::scalar(epsilon));
        let ve = self.emit_aux(n, "var_eps", Op::Binary(BinaryOp::Add), &[var, eps], d)?;
        let sd = self.emit_aux(n, "std", Op::Unary(UnaryOp::Sqrt), &[ve], d)?;
        let inv = self.emit_aux(n, "inv_std", Op::Unary(UnaryOp::Reciprocal), &[sd], d)?;
        for (slot, o) in [(1, mean), (2, inv)] {
            self.bind_output(x, slot, o, d)?;
        }
        Ok(())
    }

    /// Binds output `slot` of the node, when it is used, to `o` (computed by helper nodes),
    /// with the type the model declares for it where it declares a shape.
    fn bind_output(
        &mut self,
        x: &NodeCtx<'m>,
        slot: usize,
        o: Outlet,
        d: DType,
    ) -> Result<(), ImportError> {
        if let Some(name) = x.n.output.get(slot).filter(|s| self.is_used(s)) {
            let declared = self.output_type(name, d)?;
            if declared.shape.is_some() {
                self.graph.node_mut(o.node).outputs[o.slot] = declared;
            }
            self.values.insert(name.as_str(), o);
        }
        Ok(())
    }

    /// A fixed dim of `o`'s declared shape.
    fn fixed_dim(&self, o: Outlet, axis: usize) -> Option<usize> {
        let t = self.graph.outlet_type(o);
        t.shape.as_ref()?.get(axis)?.as_fixed()
    }

    /// Attention (opset 23; 24 and 25 without `nonpad_kv_seqlen` and sliding windows) as its
    /// definition: 3-D inputs split into heads (`[B, S, heads·D]` → `[B, heads, S, D]`),
    /// `past_key`/`past_value` concatenated before the new keys and values (the `present`
    /// outputs), the key and value heads repeated for grouped-query attention (`h0, h0, h1, h1,
    /// …`), `(Q·√scale)(K·√scale)ᵀ` (scale `1/√D` by default), `softcap·tanh(s/softcap)` when
    /// `softcap > 0`, plus the bias (a float mask added, a bool mask's false as -inf, and with
    /// `is_causal` -inf where key `j > i + past length`), softmax over the keys (a row whose bias
    /// is all -inf gives zeros), times V, heads merged back for 3-D inputs.
    /// `qk_matmul_output` is the scores after softcap (modes 0 and 1), with the bias (2), or
    /// after softmax (3). Needs the head counts and, without `scale`, the head size declared.
    fn attention(&mut self, x: &NodeCtx<'m>, opset: i64) -> Result<(), ImportError> {
        x.arity(3, 7)?;
        if x.opt(6).is_some() && (opset < 24 || x.opt(4).is_some()) {
            return Err(x.bad(format!(
                "input nonpad_kv_seqlen (opset {opset}) needs opset 24 and no past_key"
            )));
        }
        for w in ["left_window_size", "right_window_size"] {
            if x.int(w, -1)? != -1 {
                return Err(x.bad_attr(w, "sliding-window attention is not supported"));
            }
        }
        let (q, k, v) = (x.input(0)?, x.input(1)?, x.input(2)?);
        let d = self.require_dtype(x, 0, &[DType::F32])?;
        self.require_dtype(x, 1, &[DType::F32])?;
        self.require_dtype(x, 2, &[DType::F32])?;
        let (past_k, past_v) = (x.opt(4), x.opt(5));
        if past_k.is_some() != past_v.is_some() {
            return Err(x.bad("past_key and past_value must be given together"));
        }
        let mode = x.int("qk_matmul_output_mode", 0)?;
        if !(0..=3).contains(&mode) {
            return Err(x.bad_attr("qk_matmul_output_mode", format!("is {mode}, not 0 to 3")));
        }
        let rank = self.graph.outlet_type(q).rank();
        let n = x.n;
        let heads_attr = |name: &str| -> Result<Option<usize>, ImportError> {
            match x.opt_int(name)? {
                None => Ok(None),
                Some(h) if h > 0 => Ok(Some(h as usize)),
                Some(h) => Err(x.bad_attr(name, format!("is {h}, must be positive"))),
            }
        };
        let (qh, kvh) = (heads_attr("q_num_heads")?, heads_attr("kv_num_heads")?);
        let three_d = match rank {
            Some(3) => true,
            Some(4) => false,
            r => {
                return Err(x.bad(format!(
                    "Q must be declared 3-D or 4-D, is {}",
                    r.map_or("of unknown rank".into(), |r| format!("{r}-D"))
                )))
            }
        };
        let perm = Op::Transpose {
            perm: vec![0, 2, 1, 3],
        };
        let (q, k, v, qh, kvh) = if three_d {
            let (Some(qh), Some(kvh)) = (qh, kvh) else {
                return Err(x.bad("3-D inputs need q_num_heads and kv_num_heads"));
            };
            let split = |this: &mut Self, name: &str, t: Outlet, h: usize| {
                let shape = Tensor::from_vec(vec![4], vec![0i64, 0, h as i64, -1]);
                let shape = this.aux_const(x, &format!("{name}_heads_shape"), shape);
                let r = Op::Reshape { allowzero: false };
                let t = this.emit_aux(n, &format!("{name}_heads"), r, &[t, shape], d)?;
                this.emit_aux(n, &format!("{name}_bhsd"), perm.clone(), &[t], d)
            };
            let q = split(self, "q", q, qh)?;
            let k = split(self, "k", k, kvh)?;
            let v = split(self, "v", v, kvh)?;
            (q, k, v, qh, kvh)
        } else {
            match (self.fixed_dim(q, 1), self.fixed_dim(k, 1)) {
                (Some(a), Some(b)) => (q, k, v, a, b),
                _ => return Err(x.bad("the head counts (dim 1 of Q and K) must be declared")),
            }
        };
        if kvh == 0 || !qh.is_multiple_of(kvh) {
            return Err(x.bad(format!(
                "{qh} query heads are not a multiple of {kvh} key/value heads"
            )));
        }
        let scale = match x.opt_float("scale")? {
            Some(s) => s,
            None => {
                let head = if three_d {
                    self.fixed_dim(x.input(0)?, 2).map(|h| h / qh)
                } else {
                    self.fixed_dim(q, 3)
                };
                let head = head.filter(|&h| h > 0).ok_or_else(|| {
                    x.bad("without a scale attribute the head size of Q must be declared")
                })?;
                1.0 / (head as f32).sqrt()
            }
        };
        let bin = |this: &mut Self, name: &str, b, l, r| {
            this.emit_aux(n, name, Op::Binary(b), &[l, r], d)
        };
        // The caches: present = concat(past, new) on the sequence axis.
        let (k, v) = match (past_k, past_v) {
            (Some(pk), Some(pv)) => {
                let cat = Op::Concat { axis: 2 };
                let k = self.emit_aux(n, "present_key", cat.clone(), &[pk, k], d)?;
                let v = self.emit_aux(n, "present_value", cat, &[pv, v], d)?;
                (k, v)
            }
            _ => (k, v),
        };
        self.bind_output(x, 1, k, d)?;
        self.bind_output(x, 2, v, d)?;
        // Grouped-query attention: each key/value head serves qh / kvh query heads in a row.
        let (k, v) = if qh != kvh {
            let g = qh / kvh;
            let idx: Vec<i64> = (0..qh as i64).map(|h| h / g as i64).collect();
            let idx = self.aux_const(x, "gqa_heads", Tensor::from_vec(vec![qh], idx));
            let gather = Op::Gather { axis: 1 };
            let k = self.emit_aux(n, "k_gqa", gather.clone(), &[k, idx], d)?;
            let v = self.emit_aux(n, "v_gqa", gather, &[v, idx], d)?;
            (k, v)
        } else {
            (k, v)
        };
        let root = self.aux_const(x, "sqrt_scale", Tensor::scalar(scale.sqrt()));
        let qs = bin(self, "q_scaled", BinaryOp::Mul, q, root)?;
        let ks = bin(self, "k_scaled", BinaryOp::Mul, k, root)?;
        let kt = Op::Transpose {
            perm: vec![0, 1, 3, 2],
        };
        let kt = self.emit_aux(n, "k_t", kt, &[ks], d)?;
        let mut scores = self.emit_aux(n, "qk", Op::MatMul, &[qs, kt], d)?;
        let softcap = x.float("softcap", 0.0)?;
        if softcap > 0.0 {
            let c = self.aux_const(x, "softcap", Tensor::scalar(softcap));
            let s = bin(self, "qk_div_cap", BinaryOp::Div, scores, c)?;
            let t = self.emit_aux(n, "qk_tanh", Op::Unary(UnaryOp::Tanh), &[s], d)?;
            scores = bin(self, "qk_capped", BinaryOp::Mul, t, c)?;
        }
        let mut bias = self.attention_bias(x, scores, k, past_k)?;
        if let Some(lens) = x.opt(6) {
            // nonpad_kv_seqlen [B]: key j of sample b is real when j < lens[b]; the others get
            // -inf, added to any other bias.
            self.require_dtype(x, 6, &[DType::I64])?;
            let i64s = |this: &mut Self, name: &str, v: Vec<i64>| {
                this.aux_const(x, name, Tensor::from_vec(vec![v.len()], v))
            };
            let shape = Op::Shape {
                start: 2,
                end: Some(3),
            };
            let kv_len = self.emit_aux(n, "kv_len", shape, &[k], DType::I64)?;
            let squeeze = Op::Squeeze { axes: vec![0] };
            let kv_len = self.emit_aux(n, "kv_len_scalar", squeeze, &[kv_len], DType::I64)?;
            let zero = self.aux_const(x, "kv_first", Tensor::scalar(0i64));
            let one = self.aux_const(x, "kv_step", Tensor::scalar(1i64));
            let keys = self.emit_aux(
                n,
                "kv_positions",
                Op::Range,
                &[zero, kv_len, one],
                DType::I64,
            )?;
            let per_sample = i64s(self, "nonpad_shape", vec![-1, 1, 1, 1]);
            let reshape = Op::Reshape { allowzero: false };
            let lens = self.emit_aux(n, "nonpad_b111", reshape, &[lens, per_sample], DType::I64)?;
            let less = Op::Binary(BinaryOp::Less);
            let real = self.emit_aux(n, "nonpad_keys", less, &[keys, lens], DType::Bool)?;
            let open = self.aux_const(x, "nonpad_open", Tensor::scalar(0f32));
            let shut = self.aux_const(x, "nonpad_shut", Tensor::scalar(f32::NEG_INFINITY));
            let pad = self.emit_aux(n, "nonpad_bias", Op::Where, &[real, open, shut], d)?;
            bias = Some(match bias {
                Some(b) => bin(self, "bias_and_nonpad", BinaryOp::Add, b, pad)?,
                None => pad,
            });
        }
        let biased = match bias {
            Some(b) => bin(self, "qk_biased", BinaryOp::Add, scores, b)?,
            None => scores,
        };
        let mut probs = self.emit_aux(n, "probs", Op::Softmax { axis: -1 }, &[biased], d)?;
        if let Some(b) = bias {
            // A row that may attend to no key: zeros, not the NaN of a softmax of -inf.
            let row_max = Op::Reduce {
                op: ReduceOp::Max,
                axes: vec![-1],
                keepdims: true,
            };
            let m = self.emit_aux(n, "bias_row_max", row_max, &[b], d)?;
            let neg_inf = Op::Unary(UnaryOp::IsNegInf);
            let masked = self.emit_aux(n, "row_masked", neg_inf, &[m], DType::Bool)?;
            let zero = self.aux_const(x, "zero", Tensor::scalar(0f32));
            probs = self.emit_aux(n, "probs_guarded", Op::Where, &[masked, zero, probs], d)?;
        }
        let qk_out = match mode {
            0 | 1 => scores,
            2 => biased,
            _ => probs,
        };
        self.bind_output(x, 3, qk_out, d)?;
        if three_d {
            let y = self.emit_aux(n, "y_bhsd", Op::MatMul, &[probs, v], d)?;
            let y = self.emit_aux(n, "y_bshd", perm, &[y], d)?;
            let shape = Tensor::from_vec(vec![3], vec![0i64, 0, -1]);
            let shape = self.aux_const(x, "y_shape", shape);
            self.emit(n, Op::Reshape { allowzero: false }, &[y, shape], &[d])?;
        } else {
            self.emit(n, Op::MatMul, &[probs, v], &[d])?;
        }
        Ok(())
    }

    /// RotaryEmbedding (opset 23) as its definition: the input as `[B, S, heads, D]` (4-D
    /// `[B, heads, S, D]` transposed, 3-D `[B, S, heads·D]` split by `num_heads`), the first
    /// `rotary_embedding_dim` (default D) channels rotated in pairs, the halves (`x1 = x[..r/2]`,
    /// `x2 = x[r/2..r]`) or with `interleaved` the even and odd channels: `x1·cos - x2·sin` and
    /// `x1·sin + x2·cos`, with the caches `[B, S, r/2]` or, given `position_ids`, gathered
    /// from `[max_positions, r/2]`; the rest passed through, then back to the input's layout.
    /// The rotary dim must be known at import (the attribute or a declared head size).
    fn rotary_embedding(&mut self, x: &NodeCtx<'m>) -> Result<(), ImportError> {
        x.arity(3, 4)?;
        let (input, cos, sin) = (x.input(0)?, x.input(1)?, x.input(2)?);
        let d = self.require_dtype(x, 0, &[DType::F32])?;
        self.require_dtype(x, 1, &[DType::F32])?;
        self.require_dtype(x, 2, &[DType::F32])?;
        let n = x.n;
        let interleaved = x.flag("interleaved")?;
        let heads = x.int("num_heads", 0)?;
        let perm = Op::Transpose {
            perm: vec![0, 2, 1, 3],
        };
        let ints = |this: &mut Self, name: &str, v: Vec<i64>| {
            this.aux_const(x, name, Tensor::from_vec(vec![v.len()], v))
        };
        let (xs, head) = match self.graph.outlet_type(input).rank() {
            Some(4) => {
                let t = self.emit_aux(n, "bshd", perm.clone(), &[input], d)?;
                (t, self.fixed_dim(input, 3))
            }
            Some(3) if heads > 0 => {
                let shape = ints(self, "heads_shape", vec![0, 0, heads, -1]);
                let r = Op::Reshape { allowzero: false };
                let t = self.emit_aux(n, "bshd", r, &[input, shape], d)?;
                (t, self.fixed_dim(input, 2).map(|h| h / heads as usize))
            }
            Some(3) => return Err(x.bad_attr("num_heads", "3-D input needs num_heads > 0")),
            _ => return Err(x.bad("the input must be declared 3-D or 4-D")),
        };
        let rdim = match x.int("rotary_embedding_dim", 0)? {
            0 => head.map(|h| h as i64).ok_or_else(|| {
                x.bad("without rotary_embedding_dim the head size must be declared")
            })?,
            r => r,
        };
        if rdim <= 0 || rdim % 2 != 0 || head.is_some_and(|h| rdim > h as i64) {
            return Err(x.bad_attr(
                "rotary_embedding_dim",
                format!("is {rdim}: must be even, positive and at most the head size"),
            ));
        }
        let (cos, sin) = match x.opt(3) {
            Some(pos) => {
                self.require_dtype(x, 3, &[DType::I64])?;
                let g = Op::Gather { axis: 0 };
                let c = self.emit_aux(n, "cos", g.clone(), &[cos, pos], d)?;
                (c, self.emit_aux(n, "sin", g, &[sin, pos], d)?)
            }
            None => (cos, sin),
        };
        let axis2 = ints(self, "heads_axis", vec![2]);
        let unsq = Op::Unsqueeze { axes: vec![] };
        let cos = self.emit_aux(n, "cos_heads", unsq.clone(), &[cos, axis2], d)?;
        let sin = self.emit_aux(n, "sin_heads", unsq, &[sin, axis2], d)?;
        let last = ints(self, "last_axis", vec![-1]);
        let slice = |this: &mut Self, name: &str, from: i64, to: i64, step: i64| {
            let (a, b) = (ints(this, name, vec![from]), ints(this, name, vec![to]));
            let st = ints(this, name, vec![step]);
            this.emit_aux(n, name, Op::Slice, &[xs, a, b, last, st], d)
        };
        let (x1, x2) = if interleaved {
            (
                slice(self, "x1", 0, rdim, 2)?,
                slice(self, "x2", 1, rdim, 2)?,
            )
        } else {
            let h = rdim / 2;
            (slice(self, "x1", 0, h, 1)?, slice(self, "x2", h, rdim, 1)?)
        };
        let bin = |this: &mut Self, name: &str, b, l, r| {
            this.emit_aux(n, name, Op::Binary(b), &[l, r], d)
        };
        let (c1, s2) = (
            bin(self, "c1", BinaryOp::Mul, cos, x1)?,
            bin(self, "s2", BinaryOp::Mul, sin, x2)?,
        );
        let (s1, c2) = (
            bin(self, "s1", BinaryOp::Mul, sin, x1)?,
            bin(self, "c2", BinaryOp::Mul, cos, x2)?,
        );
        let real = bin(self, "real", BinaryOp::Sub, c1, s2)?;
        let imag = bin(self, "imag", BinaryOp::Add, s1, c2)?;
        let cat = Op::Concat { axis: -1 };
        let rotated = if interleaved {
            let end = ints(self, "pair_axis", vec![-1]);
            let unsq = Op::Unsqueeze { axes: vec![] };
            let re = self.emit_aux(n, "real_pair", unsq.clone(), &[real, end], d)?;
            let im = self.emit_aux(n, "imag_pair", unsq, &[imag, end], d)?;
            let pairs = self.emit_aux(n, "pairs", cat.clone(), &[re, im], d)?;
            let shape = ints(self, "rotated_shape", vec![0, 0, 0, -1]);
            let r = Op::Reshape { allowzero: false };
            self.emit_aux(n, "rotated", r, &[pairs, shape], d)?
        } else {
            self.emit_aux(n, "rotated", cat.clone(), &[real, imag], d)?
        };
        let out = if head.is_some_and(|h| rdim == h as i64) {
            rotated
        } else {
            let rest = slice(self, "pass", rdim, i64::MAX, 1)?;
            self.emit_aux(n, "with_rest", cat, &[rotated, rest], d)?
        };
        if self.graph.outlet_type(input).rank() == Some(4) {
            self.emit(n, perm, &[out], &[d])?;
        } else {
            let shape = ints(self, "out_shape", vec![0, 0, -1]);
            self.emit(n, Op::Reshape { allowzero: false }, &[out, shape], &[d])?;
        }
        Ok(())
    }

    /// The additive bias of [`Self::attention`]: the mask (bool: 0 where true, -inf where false)
    /// plus, with `is_causal`, -inf above the diagonal offset by the past length; `None` when
    /// there is neither.
    fn attention_bias(
        &mut self,
        x: &NodeCtx<'m>,
        scores: Outlet,
        keys: Outlet,
        past_k: Option<Outlet>,
    ) -> Result<Option<Outlet>, ImportError> {
        let n = x.n;
        let d = DType::F32;
        let zero = self.aux_const(x, "bias_zero", Tensor::scalar(0f32));
        let neg_inf = self.aux_const(x, "bias_neg_inf", Tensor::scalar(f32::NEG_INFINITY));
        let mask = match x.opt(3) {
            None => None,
            Some(m) => {
                // ONNX pads a mask shorter than the keys with -inf (both lengths must be known).
                let rank = self.graph.outlet_type(m).rank().unwrap_or(0);
                let (ml, kl) = (
                    rank.checked_sub(1).and_then(|a| self.fixed_dim(m, a)),
                    self.fixed_dim(keys, 2),
                );
                let short_by = match (ml, kl) {
                    (Some(a), Some(b)) if a <= b => b - a,
                    // Keys of unknown count: the mask must then cover them all, which the
                    // score's broadcasting checks when the model runs.
                    (Some(_), None) => 0,
                    _ => {
                        return Err(x.bad(format!(
                            "attn_mask must cover at most every key and declare its length: \
                             its last dim is {}, there are {} keys",
                            ml.map_or("not declared".into(), |v| v.to_string()),
                            kl.map_or("an unknown number of".into(), |v| v.to_string())
                        )))
                    }
                };
                let bias = match self.require_dtype(x, 3, &[DType::F32, DType::Bool])? {
                    DType::Bool => {
                        self.emit_aux(n, "mask_bias", Op::Where, &[m, zero, neg_inf], d)?
                    }
                    _ => m,
                };
                Some(if short_by > 0 {
                    let mut pads = vec![0i64; 2 * rank];
                    pads[2 * rank - 1] = short_by as i64;
                    let pads =
                        self.aux_const(x, "mask_pads", Tensor::from_vec(vec![2 * rank], pads));
                    let pad = Op::Pad {
                        mode: PadMode::Constant,
                    };
                    self.emit_aux(n, "mask_padded", pad, &[bias, pads, neg_inf], d)?
                } else {
                    bias
                })
            }
        };
        if !x.flag("is_causal")? {
            return Ok(mask);
        }
        // Ones of the scores' [q, kv] shape, lower triangle from diagonal `past length`.
        let dims = Op::Shape {
            start: -2,
            end: None,
        };
        let qkv = self.emit_aux(n, "causal_shape", dims, &[scores], DType::I64)?;
        let fill = Op::ConstantOfShape {
            value: Tensor::from_vec(vec![1], vec![true]),
        };
        let ones = self.emit_aux(n, "causal_ones", fill, &[qkv], DType::Bool)?;
        let mut ins = vec![ones];
        if let Some(pk) = past_k {
            let len = Op::Shape {
                start: 2,
                end: Some(3),
            };
            ins.push(self.emit_aux(n, "past_len", len, &[pk], DType::I64)?);
        }
        let tril = Op::Trilu { upper: false };
        let allowed = self.emit_aux(n, "causal_allowed", tril, &ins, DType::Bool)?;
        let causal = self.emit_aux(n, "causal_bias", Op::Where, &[allowed, zero, neg_inf], d)?;
        Ok(Some(match mask {
            Some(m) => self.emit_aux(n, "bias", Op::Binary(BinaryOp::Add), &[m, causal], d)?,
            None => causal,
        }))
    }

    /// `Pow(a, b)`: the result has `a`'s dtype, and ONNX (from opset 12) lets `b` be of another
    /// numeric dtype. A float base takes `b` cast to it; an integer base with a float exponent is
    /// computed in f32 and truncated back (as onnxruntime computes `pow` in double and casts);
    /// two integer dtypes meet in the base's.
    fn import_pow(&mut self, x: &NodeCtx<'m>, a: Outlet, b: Outlet) -> Result<(), ImportError> {
        let da = self.require_dtype(x, 0, &NUMERIC)?;
        let db = self.require_dtype(x, 1, &NUMERIC)?;
        let pow = Op::Binary(BinaryOp::Pow);
        if da == db {
            self.emit(x.n, pow, &[a, b], &[da])?;
        } else if da.is_float() || db.is_integer() {
            let b = self.emit_aux(x.n, "exponent", Op::Cast { to: da }, &[b], da)?;
            self.emit(x.n, pow, &[a, b], &[da])?;
        } else {
            let af = self.emit_aux(x.n, "base", Op::Cast { to: db }, &[a], db)?;
            let p = self.emit_aux(x.n, "pow", pow, &[af, b], db)?;
            self.emit(x.n, Op::Cast { to: da }, &[p], &[da])?;
        }
        Ok(())
    }

    /// The value of a `Constant` node, from whichever of its attributes is set.
    fn constant_value(&mut self, x: &NodeCtx) -> Result<Tensor, ImportError> {
        let Some(a) = x.n.attribute.first() else {
            return Err(x.bad("has no value attribute"));
        };
        if x.n.attribute.len() > 1 {
            return Err(x.bad("has more than one value attribute"));
        }
        Ok(match a.name.as_str() {
            "value" => {
                let t = x.tensor("value")?.expect("the attribute exists");
                tensor::tensor_from_proto(t, &mut self.ext)?
            }
            "value_float" => Tensor::scalar(x.float("value_float", 0.0)?),
            "value_int" => Tensor::scalar(x.int("value_int", 0)?),
            "value_floats" => {
                let v = x
                    .attr("value_floats", AttributeType::Floats)?
                    .expect("exists")
                    .floats
                    .clone();
                Tensor::from_vec(vec![v.len()], v)
            }
            "value_ints" => {
                let v = x.ints("value_ints")?.expect("exists");
                Tensor::from_vec(vec![v.len()], v)
            }
            other => return Err(x.bad_attr(other, "this kind of Constant value is not supported")),
        })
    }
}

/// Pad's `mode` attribute (`wrap` from opset 19).
fn pad_mode(x: &NodeCtx<'_>, opset: i64) -> Result<PadMode, ImportError> {
    match x.string("mode")?.as_deref() {
        None | Some("constant") => Ok(PadMode::Constant),
        Some("reflect") => Ok(PadMode::Reflect),
        Some("edge") => Ok(PadMode::Edge),
        Some("wrap") if opset >= 19 => Ok(PadMode::Wrap),
        Some(other) => Err(x.bad_attr(
            "mode",
            format!("`{other}` is not a mode of Pad at opset {opset}"),
        )),
    }
}

/// The dtypes with arithmetic (every numeric one the IR has; bf16 only holds weights).
const NUMERIC: [DType; 9] = [
    DType::F32,
    DType::I64,
    DType::I32,
    DType::I8,
    DType::U8,
    DType::I16,
    DType::U16,
    DType::U32,
    DType::U64,
];

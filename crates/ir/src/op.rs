//! The operations of the IR.
//!
//! Every op has a snake_case name and a list of named attributes; the text form prints
//! `name[attr=value, …](inputs)`, and [`Op::from_parts`] rebuilds the op from the same pieces, so
//! printer and parser share one description of each op.

use std::fmt;
use std::sync::Arc;

use crate::{DType, Graph, IrError, Tensor};

/// Elementwise binary operations, with ONNX (numpy) broadcasting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Max,
    Min,
    Equal,
    Less,
    Greater,
    /// `a <= b` → bool (ONNX `LessOrEqual`, opset 12+).
    LessOrEqual,
    /// `a >= b` → bool (ONNX `GreaterOrEqual`, opset 12+).
    GreaterOrEqual,
    And,
    Or,
    /// Exclusive or of bools (ONNX `Xor`).
    Xor,
    /// Integer remainder with the divisor's sign, as Python's `%` (ONNX `Mod`, `fmod=0`).
    Mod,
    /// Remainder with the dividend's sign, as C's `fmod` (ONNX `Mod`, `fmod=1`; floats need it).
    Fmod,
}

/// Elementwise unary operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    Neg,
    Abs,
    Sqrt,
    Reciprocal,
    Exp,
    Log,
    Erf,
    Tanh,
    Sigmoid,
    Relu,
    Not,
    /// Sine (ONNX `Sin`), floats only.
    Sin,
    /// Cosine (ONNX `Cos`), floats only.
    Cos,
    /// Round half to even (ONNX `Round`), floats only.
    Round,
    /// Round towards +inf (ONNX `Ceil`), floats only.
    Ceil,
    /// Round towards -inf (ONNX `Floor`), floats only.
    Floor,
    /// -1, 0 or 1 by the sign of `x` (ONNX `Sign`; 0 for both zeros, NaN stays NaN), floats and
    /// integers.
    Sign,
    /// Each f32 rounded to the nearest float16 value (±inf beyond its range), kept as f32: what a
    /// `Cast` to FLOAT16 computes in a model encore widens to f32.
    RoundToF16,
    /// Each f32 rounded to the nearest bfloat16 value, kept as f32 (a `Cast` to BFLOAT16).
    RoundToBf16,
    /// `x` is NaN → bool (ONNX `IsNaN`).
    IsNan,
    /// `x` is ±inf → bool (ONNX `IsInf`).
    IsInf,
    /// `x` is +inf → bool (`IsInf` with `detect_negative=0`).
    IsPosInf,
    /// `x` is -inf → bool (`IsInf` with `detect_positive=0`).
    IsNegInf,
}

impl UnaryOp {
    /// ONNX `Sign` of a float: `f32::signum` gives 1 for +0 and -1 for -0, ONNX (and numpy) 0.
    pub fn sign_f32(x: f32) -> f32 {
        if x > 0.0 {
            1.0
        } else if x < 0.0 {
            -1.0
        } else if x.is_nan() {
            x
        } else {
            0.0
        }
    }

    /// Whether the op maps each element to a bool.
    pub fn is_predicate(self) -> bool {
        matches!(
            self,
            UnaryOp::Not | UnaryOp::IsNan | UnaryOp::IsInf | UnaryOp::IsPosInf | UnaryOp::IsNegInf
        )
    }

    /// The output dtype for an input of dtype `input`.
    ///
    /// ```
    /// use ir::{DType, UnaryOp};
    /// assert_eq!(UnaryOp::IsNan.output_dtype(DType::F32), DType::Bool);
    /// assert_eq!(UnaryOp::Exp.output_dtype(DType::F32), DType::F32);
    /// ```
    pub fn output_dtype(self, input: DType) -> DType {
        if self.is_predicate() {
            DType::Bool
        } else {
            input
        }
    }
}

/// Reductions over a set of axes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Mean,
    Sum,
    Max,
    Min,
    /// Product (ONNX `ReduceProd`; the empty product is 1).
    Prod,
}

/// The two GELU forms found in exports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GeluApprox {
    /// `0.5·x·(1 + erf(x/√2))`
    Erf,
    /// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`
    Tanh,
}

/// The arithmetic of attention's two products, `q·kᵀ` and `p·v`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AttnProducts {
    /// f32 FMAs (what every importer makes, and the default).
    #[default]
    F32,
    /// 8-bit integers: q quantized per query row and k per key row (symmetric), the softmax
    /// numerators as u8 (`round(255·exp(s − max))`), v per head column; exact i32 sums scaled
    /// in f32. Chosen by the quantize pipeline on request (`encore quantize --attention int8`).
    Int8,
}

impl AttnProducts {
    /// The name in the text form (`products="int8"`; f32 is not printed).
    pub fn name(self) -> &'static str {
        match self {
            AttnProducts::F32 => "f32",
            AttnProducts::Int8 => "int8",
        }
    }

    fn from_name(s: &str) -> Option<AttnProducts> {
        match s {
            "f32" => Some(AttnProducts::F32),
            "int8" => Some(AttnProducts::Int8),
            _ => None,
        }
    }
}

/// A static u8 quantization an attention op applies to its output, moved there from the
/// `qlinear` that reads it (the output projection): `quantize_u8(y·inv_smooth, scale,
/// zero_point)` per element, the bytes that `qlinear` would have made of the f32 output, with
/// `inv_smooth` (the reader's SmoothQuant factors, one per column) as the op's last input when
/// `smooth`.
///
/// ```text
/// %9 = attention_qkv[num_heads=12, scale=0.125, out_scale=0.002, out_zero=127, out_smooth=true](%8, %3, %5) : u8[B,S,768]
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OutU8 {
    pub scale: f32,
    pub zero_point: i32,
    pub smooth: bool,
}

/// How `Pad` fills the border (ONNX `Pad`'s `mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PadMode {
    /// A constant value.
    Constant,
    /// Mirrored without repeating the edge (`[1,2,3]` padded by 2 on the left: `3,2,1,2,3`).
    Reflect,
    /// The edge value repeated.
    Edge,
    /// Wrapped around (`[1,2,3]` padded by 2 on the left: `2,3,1,2,3`).
    Wrap,
}

/// How a scatter combines an update with the element it lands on (ONNX `reduction`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScatterReduction {
    /// The update replaces the element.
    None,
    Add,
    Mul,
    Max,
    Min,
}

macro_rules! name_table {
    ($ty:ident { $($v:ident => $s:literal),* $(,)? }) => {
        impl $ty {
            pub const ALL: &'static [$ty] = &[$($ty::$v),*];
            pub fn name(self) -> &'static str {
                match self { $($ty::$v => $s),* }
            }
            pub fn from_name(s: &str) -> Option<$ty> {
                match s { $($s => Some($ty::$v),)* _ => None }
            }
        }
    };
}
name_table!(BinaryOp { Add => "add", Sub => "sub", Mul => "mul", Div => "div", Pow => "pow",
    Max => "max", Min => "min", Equal => "equal", Less => "less", Greater => "greater",
    LessOrEqual => "less_or_equal", GreaterOrEqual => "greater_or_equal",
    And => "and", Or => "or", Xor => "xor", Mod => "mod", Fmod => "fmod" });
name_table!(UnaryOp { Neg => "neg", Abs => "abs", Sqrt => "sqrt", Reciprocal => "reciprocal",
    Exp => "exp", Log => "log", Erf => "erf", Tanh => "tanh", Sigmoid => "sigmoid",
    Relu => "relu", Not => "not", Sin => "sin", Cos => "cos", Round => "round",
    Ceil => "ceil", Floor => "floor", Sign => "sign",
    RoundToF16 => "round_to_f16", RoundToBf16 => "round_to_bf16", IsNan => "is_nan",
    IsInf => "is_inf", IsPosInf => "is_pos_inf", IsNegInf => "is_neg_inf" });
name_table!(ReduceOp { Mean => "reduce_mean", Sum => "reduce_sum", Max => "reduce_max",
    Min => "reduce_min", Prod => "reduce_prod" });
name_table!(ScatterReduction { None => "none", Add => "add", Mul => "mul", Max => "max",
    Min => "min" });
name_table!(GeluApprox { Erf => "erf", Tanh => "tanh" });
name_table!(PadMode { Constant => "constant", Reflect => "reflect", Edge => "edge",
    Wrap => "wrap" });

/// One step of a fused linear's epilogue. The steps run in order on each output element (a whole
/// row for `LayerNorm`) while the GEMM's output tile is still in registers or cache. A step with
/// operands takes the next inputs of its node, in order.
///
/// Text form: `bias`, `mul_col`, `gelu_erf`, `gelu_tanh`, `residual`, `layer_norm 1e-12`,
/// `requant_u8 0.05 128`, `fork_u8 0.05 128`, `fork_u8 0.05 128 smooth`, `fork_u8_rows`,
/// `fork_u8_rows smooth`, `quant_heads 12`.
///
/// ```
/// use ir::EpilogueStep;
/// let s: EpilogueStep = "layer_norm 1e-12".parse().unwrap();
/// assert_eq!(s, EpilogueStep::LayerNorm { epsilon: 1e-12 });
/// assert_eq!(s.to_string(), "layer_norm 1e-12");
/// assert_eq!(s.operands(), 2);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum EpilogueStep {
    /// `y += bias[n]` (operand: f32 `[n]`).
    Bias,
    /// `y *= s[n]` (operand: f32 `[n]`): a SmoothQuant factor of the next linear, folded here.
    MulCol,
    /// `y = gelu(y)`.
    Gelu(GeluApprox),
    /// `y += r` (operand: f32 of the output's shape).
    Residual,
    /// LayerNorm of each row over the last axis (operands: gamma `[n]`, beta `[n]`).
    LayerNorm { epsilon: f32 },
    /// Last step only: `y = clamp(round_half_even(y / scale) + zero_point, 0, 255)` (NaN as 0),
    /// stored as u8. The static activation quantization of the one linear that reads this
    /// output, moved into its producer so that the f32 value is never written; the op's output
    /// is then `u8` and the reader takes it as already quantized.
    RequantU8 { scale: f32, zero_point: i32 },
    /// Last step only: the value so far is output 0 (f32) as without the step, and output 1
    /// (u8) is `clamp(round_half_even(y·s[n] / scale) + zero_point, 0, 255)` (NaN as 0), with
    /// `s` the operand when `smooth` (f32 `[n]`) and 1 otherwise. The static activation
    /// quantization (times the SmoothQuant factor) of one linear that reads this output while
    /// others read the f32 value (a LayerNorm output feeding the next GEMM and a residual),
    /// moved into the producer: the reader takes output 1 as already quantized and the f32 value
    /// is not read a second time to quantize it.
    ForkU8 {
        scale: f32,
        zero_point: i32,
        smooth: bool,
    },
    /// Last step only, after a `layer_norm` (it needs the whole row): [`EpilogueStep::ForkU8`]
    /// with each row's own scale and zero point, the dynamic per-token quantization
    /// ([`ActQuant::DynamicToken`]) of one linear that reads this output while others read the
    /// f32 value, moved into the producer. Four outputs: the f32 value (`[…, n]`), the u8 copy
    /// (`[…, n]`) and each row's scale (f32 `[…, 1]`) and zero point (i32 `[…, 1]`), those of
    /// [`u8_qparams`] on the row's range, times `s[n]` (the operand) when `smooth`. The reader
    /// ([`ActQuant::TokenU8`]) takes the three as already quantized: the row is not read back
    /// from memory twice (its range, then its bytes) by a pass of its own.
    ForkU8Rows { smooth: bool },
    /// Last step only, on a `3h`-wide output whose columns are the q, k and v of `heads`-head
    /// attention with 8-bit products (the merged QKV projection feeding it), head by head: q,
    /// k and v of head 0, then those of head 1, and so on (the `fuse` pipeline reorders the
    /// weight's columns so when it adds the step: each thread of the GEMM then makes whole
    /// heads, the ones its attention tasks read). Each head of q and of k is quantized as that
    /// attention multiplies it (symmetric, ±127, one scale per token and head:
    /// `codegen::kernels::math::quantize_sym`), v stays f32. Three outputs: the bytes
    /// (`u8[…, 2h]`: q's heads shifted by 128, then k's as s8 bits), the scales (`f32[…,
    /// 2·heads]`: q's, then k's) and v (`f32[…, h]`). Attention then reads 4.7 KB per BERT-base
    /// token instead of 9.2 and quantizes nothing of q and k itself; its results are the same
    /// bits.
    QuantHeads { heads: usize },
}

impl EpilogueStep {
    /// How many node inputs the step reads.
    pub fn operands(&self) -> usize {
        match self {
            EpilogueStep::Bias | EpilogueStep::MulCol | EpilogueStep::Residual => 1,
            EpilogueStep::Gelu(_) | EpilogueStep::RequantU8 { .. } => 0,
            EpilogueStep::LayerNorm { .. } => 2,
            EpilogueStep::ForkU8 { smooth, .. } | EpilogueStep::ForkU8Rows { smooth } => {
                usize::from(*smooth)
            }
            EpilogueStep::QuantHeads { .. } => 0,
        }
    }

    /// The last-axis widths of the outputs of a linear with `n` output columns and this
    /// epilogue: `[2n/3, 2·heads, n/3]` after a final `quant_heads`, `[n, n, 1, 1]` after a final
    /// `fork_u8_rows`, else `n` for each output.
    /// `None` when `n` is not three widths of whole heads.
    ///
    /// ```
    /// use ir::EpilogueStep;
    /// let q = EpilogueStep::QuantHeads { heads: 12 };
    /// assert_eq!(EpilogueStep::output_widths(&[EpilogueStep::Bias, q], 2304), Some(vec![1536, 24, 768]));
    /// assert_eq!(EpilogueStep::output_widths(&[EpilogueStep::Bias], 768), Some(vec![768]));
    /// assert_eq!(EpilogueStep::output_widths(&[q], 2300), None);
    /// ```
    pub fn output_widths(steps: &[EpilogueStep], n: usize) -> Option<Vec<usize>> {
        match steps.last() {
            Some(EpilogueStep::QuantHeads { heads }) => {
                let h = n / 3;
                (n.is_multiple_of(3) && *heads > 0 && h.is_multiple_of(*heads))
                    .then(|| vec![2 * h, 2 * heads, h])
            }
            Some(EpilogueStep::ForkU8Rows { .. }) => Some(vec![n, n, 1, 1]),
            _ => Some(vec![n; Self::output_dtypes(steps).len()]),
        }
    }

    /// The element types of the outputs of a linear with this epilogue: u8 after a final
    /// `requant_u8`, f32 and u8 after a final `fork_u8`, else f32.
    ///
    /// ```
    /// use ir::{DType, EpilogueStep};
    /// let f = EpilogueStep::ForkU8 { scale: 0.5, zero_point: 3, smooth: false };
    /// assert_eq!(EpilogueStep::output_dtypes(&[EpilogueStep::Bias, f]), vec![DType::F32, DType::U8]);
    /// assert_eq!(EpilogueStep::output_dtypes(&[EpilogueStep::Bias]), vec![DType::F32]);
    /// ```
    pub fn output_dtypes(steps: &[EpilogueStep]) -> Vec<DType> {
        match steps.last() {
            Some(EpilogueStep::ForkU8 { .. }) => vec![DType::F32, DType::U8],
            Some(EpilogueStep::ForkU8Rows { .. }) => {
                vec![DType::F32, DType::U8, DType::F32, DType::I32]
            }
            Some(EpilogueStep::QuantHeads { .. }) => vec![DType::U8, DType::F32, DType::F32],
            _ => vec![Self::output_dtype(steps)],
        }
    }

    /// Whether the step needs whole rows (`layer_norm`, `fork_u8_rows`): a GEMM with it shares
    /// rows, not columns, among its threads.
    pub fn needs_whole_row(&self) -> bool {
        matches!(
            self,
            EpilogueStep::LayerNorm { .. } | EpilogueStep::ForkU8Rows { .. }
        )
    }

    /// Total operands of a step list.
    pub fn count_operands(steps: &[EpilogueStep]) -> usize {
        steps.iter().map(|s| s.operands()).sum()
    }

    /// The element type of a linear's first output with this epilogue: u8 after a final
    /// `requant_u8`, else f32.
    ///
    /// ```
    /// use ir::{DType, EpilogueStep};
    /// let q = EpilogueStep::RequantU8 { scale: 0.5, zero_point: 3 };
    /// assert_eq!(EpilogueStep::output_dtype(&[EpilogueStep::Bias, q]), DType::U8);
    /// assert_eq!(EpilogueStep::output_dtype(&[EpilogueStep::Bias]), DType::F32);
    /// ```
    pub fn output_dtype(steps: &[EpilogueStep]) -> DType {
        match steps.last() {
            Some(EpilogueStep::RequantU8 { .. }) => DType::U8,
            _ => DType::F32,
        }
    }
}

impl fmt::Display for EpilogueStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EpilogueStep::Bias => f.write_str("bias"),
            EpilogueStep::MulCol => f.write_str("mul_col"),
            EpilogueStep::Gelu(a) => write!(f, "gelu_{}", a.name()),
            EpilogueStep::Residual => f.write_str("residual"),
            EpilogueStep::LayerNorm { epsilon } => write!(f, "layer_norm {epsilon:e}"),
            EpilogueStep::RequantU8 { scale, zero_point } => {
                write!(f, "requant_u8 {scale:?} {zero_point}")
            }
            EpilogueStep::ForkU8 {
                scale,
                zero_point,
                smooth,
            } => {
                write!(f, "fork_u8 {scale:?} {zero_point}")?;
                if *smooth {
                    f.write_str(" smooth")?;
                }
                Ok(())
            }
            EpilogueStep::ForkU8Rows { smooth } => {
                f.write_str("fork_u8_rows")?;
                if *smooth {
                    f.write_str(" smooth")?;
                }
                Ok(())
            }
            EpilogueStep::QuantHeads { heads } => write!(f, "quant_heads {heads}"),
        }
    }
}

impl std::str::FromStr for EpilogueStep {
    type Err = IrError;
    fn from_str(s: &str) -> Result<Self, IrError> {
        let bad = || IrError::BadAttr {
            op: "epilogue".into(),
            attr: "epilogue".into(),
            message: format!("unknown epilogue step `{s}`"),
        };
        let mut words = s.split_whitespace();
        let head = words.next().ok_or_else(bad)?;
        let step = match head {
            "bias" => EpilogueStep::Bias,
            "mul_col" => EpilogueStep::MulCol,
            "residual" => EpilogueStep::Residual,
            "gelu_erf" => EpilogueStep::Gelu(GeluApprox::Erf),
            "gelu_tanh" => EpilogueStep::Gelu(GeluApprox::Tanh),
            "layer_norm" => EpilogueStep::LayerNorm {
                epsilon: words.next().and_then(|w| w.parse().ok()).ok_or_else(bad)?,
            },
            "requant_u8" => EpilogueStep::RequantU8 {
                scale: words.next().and_then(|w| w.parse().ok()).ok_or_else(bad)?,
                zero_point: words.next().and_then(|w| w.parse().ok()).ok_or_else(bad)?,
            },
            "fork_u8" => EpilogueStep::ForkU8 {
                scale: words.next().and_then(|w| w.parse().ok()).ok_or_else(bad)?,
                zero_point: words.next().and_then(|w| w.parse().ok()).ok_or_else(bad)?,
                smooth: match words.next() {
                    None => false,
                    Some("smooth") => true,
                    Some(_) => return Err(bad()),
                },
            },
            "fork_u8_rows" => EpilogueStep::ForkU8Rows {
                smooth: match words.next() {
                    None => false,
                    Some("smooth") => true,
                    Some(_) => return Err(bad()),
                },
            },
            "quant_heads" => EpilogueStep::QuantHeads {
                heads: words
                    .next()
                    .and_then(|w| w.parse().ok())
                    .filter(|&h| h > 0)
                    .ok_or_else(bad)?,
            },
            _ => return Err(bad()),
        };
        if words.next().is_some() {
            return Err(bad());
        }
        Ok(step)
    }
}

/// How many of the first inputs of an `attention_qkv` or `attention_packed` carry q, k and v,
/// given the element type of the first: 1 (an f32 `[…, 3H]`), or 3 when it is u8 (the bytes,
/// scales and v of a [`EpilogueStep::QuantHeads`] epilogue). The mask inputs follow them.
///
/// ```
/// assert_eq!(ir::qkv_pieces(ir::DType::F32), 1);
/// assert_eq!(ir::qkv_pieces(ir::DType::U8), 3);
/// ```
pub fn qkv_pieces(first: DType) -> usize {
    if first == DType::U8 {
        3
    } else {
        1
    }
}

/// The u8 scale and zero point of the range `[lo, hi]` widened to hold 0: onnxruntime's
/// `DynamicQuantizeLinear` arithmetic, used for static (calibrated) and dynamic (run-time)
/// activation ranges alike. `scale = (hi − lo)/255`, or 1 when the range is empty or not finite;
/// `zero_point = round_half_even(−lo/scale)` clamped to `[0, 255]`.
///
/// ```
/// assert_eq!(ir::u8_qparams(-1.0, 3.0), (4.0 / 255.0, 64));
/// assert_eq!(ir::u8_qparams(0.0, 0.0), (1.0, 0));
/// assert_eq!(ir::u8_qparams(2.0, 5.0), (5.0 / 255.0, 0));
/// ```
#[inline]
pub fn u8_qparams(lo: f32, hi: f32) -> (f32, i32) {
    let (lo, hi) = (lo.min(0.0), hi.max(0.0));
    let scale = if hi == lo || !(hi - lo).is_finite() {
        1.0
    } else {
        (hi - lo) / 255.0
    };
    let zp = (0.0 - lo / scale).clamp(0.0, 255.0).round_ties_even() as i32;
    (scale, zp)
}

/// How a quantized linear turns its f32 input into u8 for the integer GEMM (always asymmetric
/// u8: `q = clamp(round_half_even(x / scale) + zero_point, 0, 255)`; s8 data with zero point `z`
/// is the same grid as u8 with `z + 128`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ActQuant {
    /// Scale and zero point from each row's own range (per token): a row's result never depends
    /// on the other rows of the batch.
    DynamicToken,
    /// Scale and zero point from the whole input's range, with onnxruntime's
    /// `DynamicQuantizeLinear` formula.
    DynamicTensor,
    /// Fixed scale and zero point, from calibration or from a QDQ model.
    Static { scale: f32, zero_point: i32 },
    /// [`ActQuant::DynamicToken`] done by the input's producer (a `fork_u8_rows` epilogue): the
    /// input is the u8 rows, and the two inputs after the weight scale are each row's scale
    /// (f32 `[…, 1]`) and zero point (i32 `[…, 1]`).
    TokenU8,
}

impl ActQuant {
    /// The name in the `act` attribute.
    pub fn name(&self) -> &'static str {
        match self {
            ActQuant::DynamicToken => "token",
            ActQuant::DynamicTensor => "tensor",
            ActQuant::Static { .. } => "static",
            ActQuant::TokenU8 => "token_u8",
        }
    }

    /// How many inputs after the weight scale carry the rows' own quantization parameters:
    /// two for [`ActQuant::TokenU8`], else none.
    pub fn row_param_inputs(&self) -> usize {
        match self {
            ActQuant::TokenU8 => 2,
            _ => 0,
        }
    }
}

/// An attribute value in the text form.
#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    Int(i64),
    Float(f32),
    Bool(bool),
    Ints(Vec<i64>),
    DType(DType),
    Str(String),
    Tensor(Tensor),
    /// A parenthesised list of words, e.g. an epilogue `(bias, gelu_erf, layer_norm 1e-12)`.
    List(Vec<String>),
    /// A graph (the body of a [`Op::Loop`]). The text form prints it as an indented block
    /// `name { … }` on the lines after its node, not inside the brackets (see [`crate::text`]).
    Graph(Arc<Graph>),
}

fn epilogue_attr(steps: &[EpilogueStep]) -> Attr {
    Attr::List(steps.iter().map(|s| s.to_string()).collect())
}

impl fmt::Display for Attr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Attr::Int(v) => write!(f, "{v}"),
            Attr::Float(v) => write!(f, "{v:?}"),
            Attr::Bool(v) => write!(f, "{v}"),
            Attr::Ints(v) => {
                let items: Vec<String> = v.iter().map(|x| x.to_string()).collect();
                write!(f, "[{}]", items.join(", "))
            }
            Attr::DType(d) => write!(f, "{d}"),
            Attr::Str(s) => write!(f, "{}", crate::text::quote(s)),
            Attr::Tensor(t) => f.write_str(&t.to_text(INLINE_LIMIT)),
            Attr::List(v) => write!(f, "({})", v.join(", ")),
            // One line for dumps that list attributes inline (the lowered program); the IR text
            // form prints the whole graph as a block instead.
            Attr::Graph(g) => write!(
                f,
                "graph({} nodes, {} inputs, {} outputs)",
                g.node_count(),
                g.inputs().len(),
                g.outputs().len()
            ),
        }
    }
}

/// Constants with at most this many elements are printed inline in the text form.
pub const INLINE_LIMIT: usize = 64;

/// An operation. Inputs are positional and listed with each op; optional trailing inputs may be
/// absent.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// A graph input, with its public name.
    Input { name: String },
    /// A constant tensor (an ONNX initializer or `Constant`).
    Const { value: Tensor },
    /// `(a, b)` elementwise with broadcasting.
    Binary(BinaryOp),
    /// `(x)` elementwise.
    Unary(UnaryOp),
    /// `(cond, a, b)` elementwise with broadcasting.
    Where,
    /// `(cond, a, b)`: all of `a` when the one element of `cond` (bool) is true, else all of `b`.
    /// Nothing is broadcast: `a` and `b` may differ in shape, and the result has the shape of
    /// the one chosen. The outputs of an ONNX `If`, whose two branches are imported inline (both
    /// run unless `cond` folds to a constant, when the other branch is dead code).
    ///
    /// ```text
    /// %9 = select(%2, %5, %8) : i64[1,S,S]
    /// ```
    Select,
    /// `(x)` converted to `to`.
    Cast { to: DType },
    /// `(x, min?, max?)` elementwise clamp to `[min, max]` (one-element tensors of x's dtype;
    /// absent bounds do not clamp). NaN stays NaN; `min > max` gives `max`, as numpy's `clip`.
    ///
    /// ```text
    /// %2 = clip(%0, %1) : f32[B,S]        # max(x, %1)
    /// %4 = clip(%0, %1, %3) : f32[B,S]    # min(max(x, %1), %3)
    /// ```
    Clip,
    /// `(x)` → i64 1-D: the dims of `x` from `start` to `end` (exclusive, `None` = rank).
    Shape { start: i64, end: Option<i64> },
    /// `(x, shape)` with ONNX semantics: 0 copies the input dim (unless `allowzero`), -1 infers.
    Reshape { allowzero: bool },
    /// `(x)` with the axes permuted.
    Transpose { perm: Vec<i64> },
    /// `(x, axes?)` with size-1 axes inserted at `axes` (of the output). The optional input is
    /// a 1-D integer tensor of axes known only at run time, used instead of the (then empty)
    /// attribute.
    Unsqueeze { axes: Vec<i64> },
    /// `(x, axes?)` with the size-1 `axes` removed (all size-1 axes when empty); the optional
    /// input as for `Unsqueeze`.
    Squeeze { axes: Vec<i64> },
    /// `(x…)` concatenated on `axis`.
    Concat { axis: i64 },
    /// `(x, split?)` → `num_outputs` pieces of `x` along `axis`. `split` is 1-D integer, one
    /// non-negative size per output, summing to the axis' size. Without it the pieces have size
    /// `ceil(dim / num_outputs)`, the last one what remains (the ONNX 18 rule, which is the even
    /// split of earlier opsets whenever the axis divides evenly).
    ///
    /// ```text
    /// %2 = split[axis=-1, num_outputs=3](%0) : (f32[B,S,4], f32[B,S,4], f32[B,S,4])
    /// %3 = add(%2.1, %2.2) : f32[B,S,4]
    /// ```
    Split { axis: i64, num_outputs: usize },
    /// `(data, indices)` gathered along `axis`.
    Gather { axis: i64 },
    /// `(data, indices)`, same-rank indices, along `axis`.
    GatherElements { axis: i64 },
    /// `(data, indices)` → `indices.shape[..-1] ++ data.shape[batch_dims + k..]`, where
    /// `k = indices.shape[-1]`: each innermost row of `indices` picks one slice of `data` by its
    /// first `k` coordinates after the `batch_dims` leading ones, which `data` and `indices`
    /// share (ONNX `GatherND`; negative indices count from the end).
    ///
    /// ```text
    /// %2 = gather_nd[batch_dims=0](%0, %1) : f32[B,384]    # %0 : f32[B,S,384], %1 : i64[B,2]
    /// ```
    GatherNd { batch_dims: i64 },
    /// `(data, indices, updates)` → `data` with, for each innermost row of `indices` (length
    /// `k`), the slice of `data` it addresses by its first `k` coordinates combined with the
    /// matching slice of `updates` (`indices.shape[..-1] ++ data.shape[k..]`) as `reduction`
    /// says, in the order of the rows (ONNX `ScatterND`; negative indices count from the end).
    ///
    /// ```text
    /// %3 = scatter_nd[reduction="add"](%0, %1, %2) : f32[4,8]    # %1 : i64[2,1], %2 : f32[2,8]
    /// ```
    ScatterNd { reduction: ScatterReduction },
    /// `(data, indices, updates)` → `data` with each element of `updates` combined into the
    /// element whose coordinates are its own with the one on `axis` replaced by the matching
    /// element of `indices` (same shape as `updates`) (ONNX `ScatterElements`).
    ///
    /// ```text
    /// %3 = scatter_elements[axis=1, reduction="none"](%0, %1, %2) : f32[2,5]
    /// ```
    ScatterElements {
        axis: i64,
        reduction: ScatterReduction,
    },
    /// `(data, starts, ends, axes?, steps?)`.
    Slice,
    /// `(x, shape)` broadcast to `shape`.
    Expand,
    /// `(x, pads, value?, axes?)`: `x` padded by `pads` (1-D integer `[begin…, end…]`, one pair
    /// per padded axis; negative pads crop) on `axes` (all when absent), filled as `mode` says;
    /// `value` (a one-element tensor of x's dtype, 0 when absent) is the constant mode's fill.
    ///
    /// ```text
    /// %3 = pad[mode="constant"](%0, %1, %2) : f32[B,S+2]    # %1 = i64[4]{0, 1, 0, 1}
    /// ```
    Pad { mode: PadMode },
    /// `(x, k?)`: the upper (`upper`) or lower triangle of each matrix in the last two axes of
    /// `x`, the rest zero: element `(i, j)` is kept when `j - i >= k` (upper) or `j - i <= k`
    /// (lower); `k` is a one-element integer tensor, 0 when absent (ONNX `Trilu`).
    ///
    /// ```text
    /// %2 = trilu[upper=false](%0, %1) : f32[B,S,S]
    /// ```
    Trilu { upper: bool },
    /// `(x, repeats)`: `x` repeated `repeats[i]` times along each axis `i`; `repeats` is 1-D
    /// integer with one non-negative count per axis of `x`.
    ///
    /// ```text
    /// %2 = tile(%0, %1) : f32[2*B,3]    # %1 = i64[2]{2, 1}, %0 : f32[B,3]
    /// ```
    Tile,
    /// `(shape)` → tensor of that shape filled with `value` (a one-element tensor).
    ConstantOfShape { value: Tensor },
    /// `(start, limit, delta)` scalars → 1-D.
    Range,
    /// `(x, axis)` cumulative sum.
    CumSum { exclusive: bool, reverse: bool },
    /// `(x)` → 2-D `[prod(dims[..axis]), prod(dims[axis..])]`.
    Flatten { axis: i64 },
    /// `(x, axes?)` reduced over `axes` (all when empty). The optional input is a 1-D integer
    /// tensor of axes known only at run time (ONNX opset 18's `axes` input when it is not a
    /// constant); then the attribute is empty, and an empty tensor reduces all axes.
    ///
    /// ```text
    /// %2 = reduce_mean[axes=[-1], keepdims=true](%0) : f32[B,S,1]
    /// %3 = reduce_sum[axes=[], keepdims=false](%0, %1) : f32[*]    # %1 : i64[K], a graph input
    /// ```
    Reduce {
        op: ReduceOp,
        axes: Vec<i64>,
        keepdims: bool,
    },
    /// `(x)` → i64: the index of the largest (`min`: smallest) element along `axis`, the first
    /// one of equal values or with `last` the last one; NaN counts as the extreme, as in numpy
    /// (ONNX `ArgMax` / `ArgMin`).
    ///
    /// ```text
    /// %1 = arg_max[axis=-1, keepdims=false, last=false](%0) : i64[B,S]    # %0 : f32[B,S,V]
    /// ```
    ArgReduce {
        min: bool,
        axis: i64,
        keepdims: bool,
        last: bool,
    },
    /// `(x…)` → the products of the operands' elements summed as `equation` says (ONNX `Einsum`,
    /// numpy's notation; see [`crate::einsum_plan`]).
    ///
    /// ```text
    /// %2 = einsum[equation="bhqd,bhkd->bhqk"](%0, %1) : f32[B,12,S,S]
    /// ```
    Einsum { equation: String },
    /// `(a, b)` numpy matmul.
    MatMul,
    /// `(a, b, c?)`: `alpha·op(a)·op(b) + beta·c`.
    Gemm {
        alpha: f32,
        beta: f32,
        trans_a: bool,
        trans_b: bool,
    },
    /// `(x)` softmax over `axis`.
    Softmax { axis: i64 },
    /// `(x, gamma, beta?)` normalised over the axes from `axis` to the end.
    LayerNorm { axis: i64, epsilon: f32 },
    /// `(x, scale, zero_point?)` → u8/i8 (`to`); per-tensor or per-`axis`.
    QuantizeLinear { axis: i64, to: DType },
    /// `(x, scale, zero_point?)` → f32; per-tensor or per-`axis`.
    DequantizeLinear { axis: i64 },
    /// `(x)` → `(y: u8, scale: f32 scalar, zero_point: u8 scalar)`.
    DynamicQuantizeLinear,
    /// `(a, b, a_zero_point?, b_zero_point?)` → i32.
    MatMulInteger,
    /// `(x, weight[k, n], bias[n]?)`: `x·weight + bias` with a constant weight (recognised).
    Linear,
    /// `(x)` GELU (recognised from its decomposition).
    Gelu { approx: GeluApprox },
    /// `(q, k, v, mask_bias?)` multi-head attention (recognised): q, k, v are `[B, S, H]`, split
    /// into `num_heads` heads; `softmax(q·kᵀ·scale + mask_bias)·v`, heads merged back to `[B, S, H]`.
    /// `mask_bias` is an additive f32 bias broadcastable to `[B, heads, S, S]`.
    Attention {
        num_heads: usize,
        scale: f32,
        products: AttnProducts,
    },
    /// `(qkv, mask_bias?)`: [`Op::Attention`] on one `[B, S, 3H]` tensor whose columns are q,
    /// then k, then v (what one GEMM makes of the three projections of a token); `[B, S, H]` out.
    /// With 8-bit products, `qkv` may instead be the three outputs of a QKV linear whose
    /// epilogue ends in [`EpilogueStep::QuantHeads`] (`u8[B, S, 2H]`, `f32[B, S, 2·heads]`,
    /// `f32[B, S, H]`): q and k come quantized (see [`qkv_pieces`]).
    ///
    /// ```text
    /// %9 = attention_qkv[num_heads=12, scale=0.125](%8, %3) : f32[B,S,768]
    /// %9 = attention_qkv[num_heads=12, scale=0.125, products="int8"](%8.0, %8.1, %8.2, %3) : f32[B,S,768]
    /// ```
    ///
    /// With `out_u8`, the output is u8 (see [`OutU8`]), its smoothing factors the last input.
    AttentionQkv {
        num_heads: usize,
        scale: f32,
        products: AttnProducts,
        out_u8: Option<OutU8>,
    },
    /// `(qkv, mask, mask_bias?)`: [`Op::AttentionQkv`] on the packed real tokens of a batch
    /// (`qkv` is `[1, T, 3H]`, the rows that [`Op::PackRows`] keeps): each sequence attends over
    /// its own rows only, found from `mask` (`[B, S]`, non-zero = real token); `mask_bias`
    /// (broadcastable to `[B, heads, S, S]`) is read at the real positions and must hide the
    /// padded keys (at most −10⁴ there), so that the result equals the padded op's at every
    /// real token. `[1, T, H]` out.
    ///
    /// `qkv` may be the three outputs of a `quant_heads` epilogue, as for [`Op::AttentionQkv`].
    ///
    /// ```text
    /// %9 = attention_packed[num_heads=12, scale=0.125](%8, %1, %3) : f32[1,packed_tokens,768]
    /// %9 = attention_packed[num_heads=12, scale=0.125, products="int8"](%8, %1, %3) : f32[1,packed_tokens,768]
    /// %9 = attention_packed[num_heads=12, scale=0.125, products="int8"](%8.0, %8.1, %8.2, %1, %3) : f32[1,packed_tokens,768]
    /// ```
    AttentionPacked {
        num_heads: usize,
        scale: f32,
        products: AttnProducts,
        out_u8: Option<OutU8>,
    },
    /// `(x, mask)`: the rows of `x` (`[B, S, …]`) at the real tokens of `mask` (`[B, S]`,
    /// non-zero = real), in order, as `[1, T, …]` with `T` the number of real tokens: token-wise
    /// ops after it compute no padding. An `x` of `[1, S, …]` (a row per position, the same for
    /// every sequence) gives each real token the row of its position.
    ///
    /// ```text
    /// %5 = pack_rows(%4, %1) : f32[1,packed_tokens,768]    # %4 : f32[B,S,768], %1 : i64[B,S]
    /// ```
    PackRows,
    /// `(x, mask)`: the inverse of [`Op::PackRows`]: `[1, T, …]` rows laid back at the real
    /// tokens of `mask` in `[B, S, …]`, zeros at the padding.
    ///
    /// ```text
    /// %9 = unpack_rows(%8, %1) : f32[B,S,768]
    /// ```
    UnpackRows,
    /// `(x, w[k, n], operands…)`: an f32 `x·w` followed by the `epilogue` steps, one GEMM with the
    /// epilogue applied to each output tile (made by the `fuse` pipeline from `Linear` and the
    /// ops after it).
    ///
    /// ```text
    /// %5 = fused_linear[epilogue=(bias, gelu_erf)](%0, %1, %2) : f32[B,S,1536]
    /// ```
    FusedLinear { epilogue: Vec<EpilogueStep> },
    /// `(x: f32, w: i8[k, n], w_scale: f32[n] or [1], inv_smooth: f32[k] when smooth, operands…)`:
    /// `x` (times `inv_smooth`, the SmoothQuant factor) quantized to u8 as `act` says, an exact
    /// u8×s8→i32 GEMM, dequantized (`acc · a_scale · w_scale[n]`, zero point compensated), then
    /// the `epilogue` steps; f32 out, or u8 after a final `requant_u8`. With `act` static, `x`
    /// may instead be u8 already quantized with `a_scale` and `a_zero` (its producer ended in
    /// `requant_u8`); then `smooth` is false. With `act` `token_u8`, `x` is u8 quantized per row
    /// by its producer (`fork_u8_rows`), whose row scales and zero points are the two inputs
    /// after `w_scale`: `(x: u8, w, w_scale, a_scale: f32[…, 1], a_zero: i32[…, 1],
    /// operands…)`, and `smooth` is false.
    ///
    /// ```text
    /// %7 = qlinear[act="token", smooth=true, epilogue=(bias, gelu_erf)](%0, %1, %2, %3, %4) : f32[B,S,1536]
    /// ```
    QLinear {
        act: ActQuant,
        smooth: bool,
        epilogue: Vec<EpilogueStep>,
    },
    /// `(qa, a_scale, a_zero, qb, b_scale, b_zero)` → f32: the numpy matmul of two quantized
    /// tensors (u8 or i8), `Σ (qa − a_zero)(qb − b_zero) · a_scale · b_scale`, summed exactly in
    /// i32. `a`'s scale and zero point are per tensor; `b`'s per tensor or per column (its last
    /// axis). A `MatMul` of two `DequantizeLinear` outputs, folded.
    QMatMul,
    /// `(trip_count, cond, initial…, captured…)` → `(final…, scan…)`: ONNX `Loop`, with a
    /// sub-graph run once per iteration, as long as `i < trip_count` and `cond` (`i` counts
    /// from 0; `trip_count` is i64 and `cond` bool, one element each; a model that leaves either
    /// out gets `i64::MAX` or `true` at import).
    ///
    /// The `body` takes `(i: i64[], cond: bool[], carried…, captured…)` and gives
    /// `(cond', carried'…, scan…)`. The first `carried` values are fed back: an iteration reads
    /// what the one before it gave (the `initial` inputs of the node before the first). The
    /// captured values are the same in every iteration: they are the values of the enclosing
    /// graph that the body reads, made inputs so that a body sees nothing but its inputs (ONNX
    /// bodies read enclosing values by name). `cond'` decides whether another iteration runs.
    ///
    /// The node gives the carried values after the last iteration (the initial ones when none
    /// ran), then each scan output stacked over the iterations along a new axis 0. A carried
    /// value may change shape from one iteration to the next; a scan output may not.
    ///
    /// ```text
    /// %6 = loop[carried=1](%4, %5, %0, %2) : (f32[], f32[*])  # Loop
    ///   body {
    ///     %0 = input[name="i"] : i64[]  # i
    ///     %1 = input[name="cond"] : bool[]  # cond
    ///     %2 = input[name="prev"] : f32[]  # prev
    ///     %3 = input[name="delta"] : f32[]  # delta
    ///     %4 = add(%2, %3) : f32[]  # next
    ///     output "cond_out" = %1
    ///     output "next" = %4
    ///     output "range" = %2
    ///   }
    /// ```
    Loop { carried: usize, body: Arc<Graph> },
}

/// How the inputs and outputs of an [`Op::Loop`] divide, from its `carried` count and its
/// body's inputs and outputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoopParts {
    /// Values fed back from one iteration to the next.
    pub carried: usize,
    /// Values of the enclosing graph the body reads, the same in every iteration.
    pub captured: usize,
    /// Body outputs stacked over the iterations.
    pub scans: usize,
}

impl LoopParts {
    /// The parts of a loop with `carried` carried values and `body`; `None` when the body has
    /// too few inputs (the iteration number, the condition and the carried values) or outputs
    /// (the condition and the carried values).
    ///
    /// ```
    /// use ir::{DType, Graph, LoopParts, TensorType};
    /// let mut body = Graph::new();
    /// body.add_input("i", TensorType::new(DType::I64, vec![]));
    /// let c = body.add_input("cond", TensorType::new(DType::Bool, vec![]));
    /// let x = body.add_input("x", TensorType::unknown_shape(DType::F32));
    /// body.set_output("cond_out", c);
    /// body.set_output("x_out", x);
    /// body.set_output("scan", x);
    /// let p = LoopParts::of(1, &body).unwrap();
    /// assert_eq!((p.carried, p.captured, p.scans), (1, 0, 1));
    /// assert!(LoopParts::of(2, &body).is_none());
    /// ```
    pub fn of(carried: usize, body: &Graph) -> Option<LoopParts> {
        let captured = body.inputs().len().checked_sub(2 + carried)?;
        let scans = body.outputs().len().checked_sub(1 + carried)?;
        Some(LoopParts {
            carried,
            captured,
            scans,
        })
    }
}

/// The symbol of the number of real tokens in a batch: the row count of [`Op::PackRows`]'s
/// output, bound afresh by every run.
pub const PACKED_TOKENS: &str = "packed_tokens";

/// What kind of work an op does, for profiles and for counting what fusion left standalone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpKind {
    /// Graph inputs and constants: no work.
    Source,
    /// A matrix product, with whatever epilogue was fused into it.
    Gemm,
    /// Multi-head attention as one op.
    Attention,
    /// A standalone per-element or per-row computation (arithmetic, activations, casts,
    /// normalisation, softmax, quantization): what epilogue fusion aims to remove.
    Elementwise,
    /// Data movement and shape arithmetic (reshape, gather, slice, concat, …).
    Data,
    /// Reductions over axes.
    Reduce,
    /// Control flow: a sub-graph run as the data says (a loop).
    Control,
}

impl OpKind {
    /// The kind's name in profiles.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Source => "source",
            OpKind::Gemm => "gemm",
            OpKind::Attention => "attention",
            OpKind::Elementwise => "elementwise",
            OpKind::Data => "data",
            OpKind::Reduce => "reduce",
            OpKind::Control => "control",
        }
    }
}

impl Op {
    /// What kind of work the op does.
    ///
    /// ```
    /// use ir::{Op, OpKind};
    /// assert_eq!(Op::QMatMul.kind(), OpKind::Gemm);
    /// assert_eq!(Op::Where.kind(), OpKind::Elementwise);
    /// ```
    pub fn kind(&self) -> OpKind {
        match self {
            Op::Input { .. } | Op::Const { .. } => OpKind::Source,
            Op::MatMul
            | Op::Gemm { .. }
            | Op::MatMulInteger
            | Op::Linear
            | Op::FusedLinear { .. }
            | Op::QLinear { .. }
            | Op::QMatMul
            | Op::Einsum { .. } => OpKind::Gemm,
            Op::Attention { .. } | Op::AttentionQkv { .. } | Op::AttentionPacked { .. } => {
                OpKind::Attention
            }
            Op::Binary(_)
            | Op::Unary(_)
            | Op::Where
            | Op::Cast { .. }
            | Op::Clip
            | Op::Softmax { .. }
            | Op::LayerNorm { .. }
            | Op::Gelu { .. }
            | Op::QuantizeLinear { .. }
            | Op::DequantizeLinear { .. }
            | Op::DynamicQuantizeLinear => OpKind::Elementwise,
            Op::Reduce { .. } | Op::CumSum { .. } | Op::ArgReduce { .. } => OpKind::Reduce,
            Op::Shape { .. }
            | Op::Reshape { .. }
            | Op::Transpose { .. }
            | Op::Unsqueeze { .. }
            | Op::Squeeze { .. }
            | Op::Concat { .. }
            | Op::Split { .. }
            | Op::Gather { .. }
            | Op::GatherElements { .. }
            | Op::GatherNd { .. }
            | Op::ScatterNd { .. }
            | Op::ScatterElements { .. }
            | Op::Pad { .. }
            | Op::Trilu { .. }
            | Op::Slice
            | Op::Expand
            | Op::Tile
            | Op::ConstantOfShape { .. }
            | Op::Range
            | Op::Flatten { .. }
            | Op::PackRows
            | Op::UnpackRows
            | Op::Select => OpKind::Data,
            Op::Loop { .. } => OpKind::Control,
        }
    }

    /// The op's name in the text form.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Input { .. } => "input",
            Op::Const { .. } => "const",
            Op::Binary(b) => b.name(),
            Op::Unary(u) => u.name(),
            Op::Where => "where",
            Op::Select => "select",
            Op::Cast { .. } => "cast",
            Op::Clip => "clip",
            Op::Shape { .. } => "shape",
            Op::Reshape { .. } => "reshape",
            Op::Transpose { .. } => "transpose",
            Op::Unsqueeze { .. } => "unsqueeze",
            Op::Squeeze { .. } => "squeeze",
            Op::Concat { .. } => "concat",
            Op::Split { .. } => "split",
            Op::Gather { .. } => "gather",
            Op::GatherElements { .. } => "gather_elements",
            Op::GatherNd { .. } => "gather_nd",
            Op::ScatterNd { .. } => "scatter_nd",
            Op::ScatterElements { .. } => "scatter_elements",
            Op::Pad { .. } => "pad",
            Op::Trilu { .. } => "trilu",
            Op::Slice => "slice",
            Op::Expand => "expand",
            Op::Tile => "tile",
            Op::ConstantOfShape { .. } => "constant_of_shape",
            Op::Range => "range",
            Op::CumSum { .. } => "cumsum",
            Op::Flatten { .. } => "flatten",
            Op::Reduce { op, .. } => op.name(),
            Op::ArgReduce { min: false, .. } => "arg_max",
            Op::ArgReduce { min: true, .. } => "arg_min",
            Op::MatMul => "matmul",
            Op::Einsum { .. } => "einsum",
            Op::Gemm { .. } => "gemm",
            Op::Softmax { .. } => "softmax",
            Op::LayerNorm { .. } => "layer_norm",
            Op::QuantizeLinear { .. } => "quantize_linear",
            Op::DequantizeLinear { .. } => "dequantize_linear",
            Op::DynamicQuantizeLinear => "dynamic_quantize_linear",
            Op::MatMulInteger => "matmul_integer",
            Op::Linear => "linear",
            Op::Gelu { .. } => "gelu",
            Op::Attention { .. } => "attention",
            Op::AttentionQkv { .. } => "attention_qkv",
            Op::AttentionPacked { .. } => "attention_packed",
            Op::PackRows => "pack_rows",
            Op::UnpackRows => "unpack_rows",
            Op::FusedLinear { .. } => "fused_linear",
            Op::QLinear { .. } => "qlinear",
            Op::QMatMul => "qmatmul",
            Op::Loop { .. } => "loop",
        }
    }

    /// The allowed number of inputs, as an inclusive range (`usize::MAX` = variadic).
    pub fn arity(&self) -> (usize, usize) {
        match self {
            Op::Input { .. } | Op::Const { .. } => (0, 0),
            Op::Binary(_) => (2, 2),
            Op::Where
            | Op::Select
            | Op::Range
            | Op::ScatterNd { .. }
            | Op::ScatterElements { .. } => (3, 3),
            Op::Clip => (1, 3),
            Op::Unary(_)
            | Op::Cast { .. }
            | Op::Shape { .. }
            | Op::Transpose { .. }
            | Op::ConstantOfShape { .. }
            | Op::Flatten { .. }
            | Op::Softmax { .. }
            | Op::DynamicQuantizeLinear
            | Op::ArgReduce { .. }
            | Op::Gelu { .. } => (1, 1),
            Op::Reshape { .. }
            | Op::Gather { .. }
            | Op::GatherElements { .. }
            | Op::GatherNd { .. }
            | Op::Expand
            | Op::Tile
            | Op::CumSum { .. }
            | Op::MatMul => (2, 2),
            Op::Concat { .. } | Op::Einsum { .. } => (1, usize::MAX),
            Op::Split { .. }
            | Op::Reduce { .. }
            | Op::Unsqueeze { .. }
            | Op::Squeeze { .. }
            | Op::Trilu { .. } => (1, 2),
            Op::Pad { .. } => (2, 4),
            Op::Slice => (3, 5),
            Op::Gemm { .. } | Op::LayerNorm { .. } | Op::Linear => (2, 3),
            Op::QuantizeLinear { .. } | Op::DequantizeLinear { .. } => (2, 3),
            Op::MatMulInteger => (2, 4),
            Op::Attention { .. } => (3, 4),
            // One qkv input, or the three of a `quant_heads` epilogue (see `qkv_pieces`).
            // Then the mask (packed), its bias, and the smoothing factors of `out_u8`.
            Op::AttentionQkv { .. } => (1, 5),
            Op::AttentionPacked { .. } => (2, 6),
            Op::PackRows | Op::UnpackRows => (2, 2),
            Op::FusedLinear { epilogue } => {
                let n = 2 + EpilogueStep::count_operands(epilogue);
                (n, n)
            }
            Op::QLinear {
                act,
                smooth,
                epilogue,
            } => {
                let n = 3
                    + act.row_param_inputs()
                    + usize::from(*smooth)
                    + EpilogueStep::count_operands(epilogue);
                (n, n)
            }
            Op::QMatMul => (6, 6),
            // One input per body input: the iteration number and condition of the body are the
            // trip count and initial condition of the node, the rest correspond one to one.
            Op::Loop { body, .. } => (body.inputs().len(), body.inputs().len()),
        }
    }

    /// How many values the op produces.
    pub fn num_outputs(&self) -> usize {
        match self {
            Op::DynamicQuantizeLinear => 3,
            Op::Split { num_outputs, .. } => *num_outputs,
            // Every body output but the condition.
            Op::Loop { body, .. } => body.outputs().len().saturating_sub(1),
            Op::FusedLinear { epilogue } | Op::QLinear { epilogue, .. } => {
                EpilogueStep::output_dtypes(epilogue).len()
            }
            _ => 1,
        }
    }

    /// The attributes, in text-form order.
    pub fn attrs(&self) -> Vec<(&'static str, Attr)> {
        use Attr::*;
        match self {
            Op::Input { name } => vec![("name", Str(name.clone()))],
            Op::Einsum { equation } => vec![("equation", Str(equation.clone()))],
            Op::Const { value } => vec![("value", Tensor(value.clone()))],
            Op::Cast { to } => vec![("to", DType(*to))],
            Op::Shape { start, end } => {
                let mut v = vec![("start", Int(*start))];
                if let Some(e) = end {
                    v.push(("end", Int(*e)));
                }
                v
            }
            Op::Reshape { allowzero } => vec![("allowzero", Bool(*allowzero))],
            Op::Transpose { perm } => vec![("perm", Ints(perm.clone()))],
            Op::Unsqueeze { axes } | Op::Squeeze { axes } => vec![("axes", Ints(axes.clone()))],
            Op::Concat { axis }
            | Op::Gather { axis }
            | Op::GatherElements { axis }
            | Op::Flatten { axis }
            | Op::Softmax { axis }
            | Op::DequantizeLinear { axis } => vec![("axis", Int(*axis))],
            Op::ConstantOfShape { value } => vec![("value", Tensor(value.clone()))],
            Op::GatherNd { batch_dims } => vec![("batch_dims", Int(*batch_dims))],
            Op::ScatterNd { reduction } => vec![("reduction", Str(reduction.name().to_string()))],
            Op::ScatterElements { axis, reduction } => vec![
                ("axis", Int(*axis)),
                ("reduction", Str(reduction.name().to_string())),
            ],
            Op::Pad { mode } => vec![("mode", Str(mode.name().to_string()))],
            Op::Trilu { upper } => vec![("upper", Bool(*upper))],
            Op::Split { axis, num_outputs } => vec![
                ("axis", Int(*axis)),
                ("num_outputs", Int(*num_outputs as i64)),
            ],
            Op::CumSum { exclusive, reverse } => {
                vec![("exclusive", Bool(*exclusive)), ("reverse", Bool(*reverse))]
            }
            Op::Reduce { axes, keepdims, .. } => {
                vec![("axes", Ints(axes.clone())), ("keepdims", Bool(*keepdims))]
            }
            Op::ArgReduce {
                axis,
                keepdims,
                last,
                ..
            } => vec![
                ("axis", Int(*axis)),
                ("keepdims", Bool(*keepdims)),
                ("last", Bool(*last)),
            ],
            Op::Gemm {
                alpha,
                beta,
                trans_a,
                trans_b,
            } => vec![
                ("alpha", Float(*alpha)),
                ("beta", Float(*beta)),
                ("trans_a", Bool(*trans_a)),
                ("trans_b", Bool(*trans_b)),
            ],
            Op::LayerNorm { axis, epsilon } => {
                vec![("axis", Int(*axis)), ("epsilon", Float(*epsilon))]
            }
            Op::QuantizeLinear { axis, to } => vec![("axis", Int(*axis)), ("to", DType(*to))],
            Op::Gelu { approx } => vec![("approx", Str(approx.name().to_string()))],
            Op::Attention {
                num_heads,
                scale,
                products,
            } => attention_attrs(*num_heads, *scale, *products, None),
            Op::AttentionQkv {
                num_heads,
                scale,
                products,
                out_u8,
            }
            | Op::AttentionPacked {
                num_heads,
                scale,
                products,
                out_u8,
            } => attention_attrs(*num_heads, *scale, *products, *out_u8),
            Op::FusedLinear { epilogue } => vec![("epilogue", epilogue_attr(epilogue))],
            Op::QLinear {
                act,
                smooth,
                epilogue,
            } => {
                let mut v = vec![("act", Str(act.name().to_string()))];
                if let ActQuant::Static { scale, zero_point } = act {
                    v.push(("a_scale", Float(*scale)));
                    v.push(("a_zero", Int(i64::from(*zero_point))));
                }
                v.push(("smooth", Bool(*smooth)));
                v.push(("epilogue", epilogue_attr(epilogue)));
                v
            }
            Op::Loop { carried, body } => vec![
                ("carried", Int(*carried as i64)),
                ("body", Graph(body.clone())),
            ],
            Op::Binary(_)
            | Op::Unary(_)
            | Op::Where
            | Op::Select
            | Op::Clip
            | Op::Slice
            | Op::Expand
            | Op::Tile
            | Op::Range
            | Op::MatMul
            | Op::DynamicQuantizeLinear
            | Op::MatMulInteger
            | Op::Linear
            | Op::QMatMul
            | Op::PackRows
            | Op::UnpackRows => vec![],
        }
    }

    /// Rebuilds an op from its name and attributes (the inverse of [`Op::name`] + [`Op::attrs`]).
    pub fn from_parts(name: &str, attrs: Vec<(String, Attr)>) -> Result<Op, IrError> {
        let mut a = AttrReader { op: name, attrs };
        let op = match name {
            "input" => Op::Input {
                name: a.str("name")?,
            },
            "const" => Op::Const {
                value: a.tensor("value")?,
            },
            "where" => Op::Where,
            "select" => Op::Select,
            "clip" => Op::Clip,
            "cast" => Op::Cast { to: a.dtype("to")? },
            "shape" => Op::Shape {
                start: a.int("start")?,
                end: a.opt_int("end")?,
            },
            "reshape" => Op::Reshape {
                allowzero: a.bool("allowzero")?,
            },
            "transpose" => Op::Transpose {
                perm: a.ints("perm")?,
            },
            "unsqueeze" => Op::Unsqueeze {
                axes: a.ints("axes")?,
            },
            "squeeze" => Op::Squeeze {
                axes: a.ints("axes")?,
            },
            "concat" => Op::Concat {
                axis: a.int("axis")?,
            },
            "split" => Op::Split {
                axis: a.int("axis")?,
                num_outputs: usize::try_from(a.int("num_outputs")?)
                    .ok()
                    .filter(|&k| k > 0)
                    .ok_or_else(|| a.bad("num_outputs", "a positive integer"))?,
            },
            "gather" => Op::Gather {
                axis: a.int("axis")?,
            },
            "gather_elements" => Op::GatherElements {
                axis: a.int("axis")?,
            },
            "pad" => {
                let s = a.str("mode")?;
                Op::Pad {
                    mode: PadMode::from_name(&s)
                        .ok_or_else(|| a.bad("mode", "constant, reflect, edge or wrap"))?,
                }
            }
            "trilu" => Op::Trilu {
                upper: a.bool("upper")?,
            },
            "gather_nd" => Op::GatherNd {
                batch_dims: a.int("batch_dims")?,
            },
            "scatter_nd" => Op::ScatterNd {
                reduction: a.scatter_reduction()?,
            },
            "scatter_elements" => Op::ScatterElements {
                axis: a.int("axis")?,
                reduction: a.scatter_reduction()?,
            },
            "slice" => Op::Slice,
            "expand" => Op::Expand,
            "tile" => Op::Tile,
            "constant_of_shape" => Op::ConstantOfShape {
                value: a.tensor("value")?,
            },
            "range" => Op::Range,
            "cumsum" => Op::CumSum {
                exclusive: a.bool("exclusive")?,
                reverse: a.bool("reverse")?,
            },
            "flatten" => Op::Flatten {
                axis: a.int("axis")?,
            },
            "arg_max" | "arg_min" => Op::ArgReduce {
                min: name == "arg_min",
                axis: a.int("axis")?,
                keepdims: a.bool("keepdims")?,
                last: a.bool("last")?,
            },
            "matmul" => Op::MatMul,
            "einsum" => Op::Einsum {
                equation: a.str("equation")?,
            },
            "gemm" => Op::Gemm {
                alpha: a.float("alpha")?,
                beta: a.float("beta")?,
                trans_a: a.bool("trans_a")?,
                trans_b: a.bool("trans_b")?,
            },
            "softmax" => Op::Softmax {
                axis: a.int("axis")?,
            },
            "layer_norm" => Op::LayerNorm {
                axis: a.int("axis")?,
                epsilon: a.float("epsilon")?,
            },
            "quantize_linear" => Op::QuantizeLinear {
                axis: a.int("axis")?,
                to: a.dtype("to")?,
            },
            "dequantize_linear" => Op::DequantizeLinear {
                axis: a.int("axis")?,
            },
            "dynamic_quantize_linear" => Op::DynamicQuantizeLinear,
            "matmul_integer" => Op::MatMulInteger,
            "linear" => Op::Linear,
            "gelu" => {
                let s = a.str("approx")?;
                Op::Gelu {
                    approx: GeluApprox::from_name(&s)
                        .ok_or_else(|| a.bad("approx", "erf or tanh"))?,
                }
            }
            "fused_linear" => Op::FusedLinear {
                epilogue: a.epilogue()?,
            },
            "qlinear" => {
                let act = match a.str("act")?.as_str() {
                    "token" => ActQuant::DynamicToken,
                    "tensor" => ActQuant::DynamicTensor,
                    "token_u8" => ActQuant::TokenU8,
                    "static" => ActQuant::Static {
                        scale: a.float("a_scale")?,
                        zero_point: i32::try_from(a.int("a_zero")?)
                            .map_err(|_| a.bad("a_zero", "a 32-bit integer"))?,
                    },
                    _ => return Err(a.bad("act", "token, token_u8, tensor or static")),
                };
                Op::QLinear {
                    act,
                    smooth: a.bool("smooth")?,
                    epilogue: a.epilogue()?,
                }
            }
            "qmatmul" => Op::QMatMul,
            "loop" => Op::Loop {
                carried: usize::try_from(a.int("carried")?)
                    .map_err(|_| a.bad("carried", "a non-negative integer"))?,
                body: a.graph("body")?,
            },
            "pack_rows" => Op::PackRows,
            "unpack_rows" => Op::UnpackRows,
            "attention" | "attention_qkv" | "attention_packed" => {
                let num_heads = usize::try_from(a.int("num_heads")?)
                    .map_err(|_| a.bad("num_heads", "a non-negative integer"))?;
                let scale = a.float("scale")?;
                let products = match a.opt_str("products")? {
                    None => AttnProducts::F32,
                    Some(p) => AttnProducts::from_name(&p)
                        .ok_or_else(|| a.bad("products", "\"f32\" or \"int8\""))?,
                };
                let out_u8 = match a.opt_float("out_scale")? {
                    None => None,
                    Some(scale) => Some(OutU8 {
                        scale,
                        zero_point: i32::try_from(a.int("out_zero")?)
                            .map_err(|_| a.bad("out_zero", "a 32-bit integer"))?,
                        smooth: a.bool("out_smooth")?,
                    }),
                };
                match name {
                    "attention" if out_u8.is_some() => {
                        return Err(a.bad("out_scale", "no output quantization on `attention`"))
                    }
                    "attention" => Op::Attention {
                        num_heads,
                        scale,
                        products,
                    },
                    "attention_qkv" => Op::AttentionQkv {
                        num_heads,
                        scale,
                        products,
                        out_u8,
                    },
                    _ => Op::AttentionPacked {
                        num_heads,
                        scale,
                        products,
                        out_u8,
                    },
                }
            }
            other => {
                if let Some(b) = BinaryOp::from_name(other) {
                    Op::Binary(b)
                } else if let Some(u) = UnaryOp::from_name(other) {
                    Op::Unary(u)
                } else if let Some(r) = ReduceOp::from_name(other) {
                    Op::Reduce {
                        op: r,
                        axes: a.ints("axes")?,
                        keepdims: a.bool("keepdims")?,
                    }
                } else {
                    return Err(IrError::UnknownOp(other.to_string()));
                }
            }
        };
        a.finish()?;
        Ok(op)
    }
}

/// The attributes of the attention ops, `out_u8`'s only when it is set.
fn attention_attrs(
    num_heads: usize,
    scale: f32,
    products: AttnProducts,
    out_u8: Option<OutU8>,
) -> Vec<(&'static str, Attr)> {
    let mut attrs = vec![
        ("num_heads", Attr::Int(num_heads as i64)),
        ("scale", Attr::Float(scale)),
    ];
    if products != AttnProducts::F32 {
        attrs.push(("products", Attr::Str(products.name().to_string())));
    }
    if let Some(q) = out_u8 {
        attrs.push(("out_scale", Attr::Float(q.scale)));
        attrs.push(("out_zero", Attr::Int(i64::from(q.zero_point))));
        attrs.push(("out_smooth", Attr::Bool(q.smooth)));
    }
    attrs
}

/// Takes attributes out of a parsed list by name, with errors that name the op and attribute.
struct AttrReader<'a> {
    op: &'a str,
    attrs: Vec<(String, Attr)>,
}

impl AttrReader<'_> {
    fn bad(&self, attr: &str, expected: &str) -> IrError {
        IrError::BadAttr {
            op: self.op.to_string(),
            attr: attr.to_string(),
            message: format!("expected {expected}"),
        }
    }
    fn take(&mut self, key: &str) -> Option<Attr> {
        let pos = self.attrs.iter().position(|(k, _)| k == key)?;
        Some(self.attrs.remove(pos).1)
    }
    fn need(&mut self, key: &str) -> Result<Attr, IrError> {
        self.take(key).ok_or_else(|| IrError::BadAttr {
            op: self.op.to_string(),
            attr: key.to_string(),
            message: "missing".to_string(),
        })
    }
    fn int(&mut self, key: &str) -> Result<i64, IrError> {
        match self.need(key)? {
            Attr::Int(v) => Ok(v),
            _ => Err(self.bad(key, "an integer")),
        }
    }
    fn opt_int(&mut self, key: &str) -> Result<Option<i64>, IrError> {
        match self.take(key) {
            None => Ok(None),
            Some(Attr::Int(v)) => Ok(Some(v)),
            Some(_) => Err(self.bad(key, "an integer")),
        }
    }
    fn float(&mut self, key: &str) -> Result<f32, IrError> {
        match self.need(key)? {
            Attr::Float(v) => Ok(v),
            Attr::Int(v) => Ok(v as f32),
            _ => Err(self.bad(key, "a float")),
        }
    }
    fn opt_float(&mut self, key: &str) -> Result<Option<f32>, IrError> {
        if self.attrs.iter().any(|(k, _)| k == key) {
            self.float(key).map(Some)
        } else {
            Ok(None)
        }
    }
    fn bool(&mut self, key: &str) -> Result<bool, IrError> {
        match self.need(key)? {
            Attr::Bool(v) => Ok(v),
            _ => Err(self.bad(key, "true or false")),
        }
    }
    fn ints(&mut self, key: &str) -> Result<Vec<i64>, IrError> {
        match self.need(key)? {
            Attr::Ints(v) => Ok(v),
            _ => Err(self.bad(key, "a list of integers")),
        }
    }
    fn dtype(&mut self, key: &str) -> Result<DType, IrError> {
        match self.need(key)? {
            Attr::DType(v) => Ok(v),
            _ => Err(self.bad(key, "a dtype")),
        }
    }
    fn opt_str(&mut self, key: &str) -> Result<Option<String>, IrError> {
        match self.take(key) {
            None => Ok(None),
            Some(Attr::Str(v)) => Ok(Some(v)),
            Some(_) => Err(self.bad(key, "a string")),
        }
    }
    fn str(&mut self, key: &str) -> Result<String, IrError> {
        match self.need(key)? {
            Attr::Str(v) => Ok(v),
            _ => Err(self.bad(key, "a string")),
        }
    }
    fn tensor(&mut self, key: &str) -> Result<Tensor, IrError> {
        match self.need(key)? {
            Attr::Tensor(v) => Ok(v),
            _ => Err(self.bad(key, "a tensor literal")),
        }
    }
    fn graph(&mut self, key: &str) -> Result<Arc<Graph>, IrError> {
        match self.need(key)? {
            Attr::Graph(g) => Ok(g),
            _ => Err(self.bad(key, "a graph block")),
        }
    }
    fn scatter_reduction(&mut self) -> Result<ScatterReduction, IrError> {
        let s = self.str("reduction")?;
        ScatterReduction::from_name(&s)
            .ok_or_else(|| self.bad("reduction", "none, add, mul, max or min"))
    }
    fn epilogue(&mut self) -> Result<Vec<EpilogueStep>, IrError> {
        match self.need("epilogue")? {
            Attr::List(items) => items.iter().map(|s| s.parse()).collect(),
            _ => Err(self.bad("epilogue", "a list of steps in parentheses")),
        }
    }
    fn finish(self) -> Result<(), IrError> {
        match self.attrs.first() {
            None => Ok(()),
            Some((k, _)) => Err(IrError::BadAttr {
                op: self.op.to_string(),
                attr: k.clone(),
                message: "unknown attribute".to_string(),
            }),
        }
    }
}

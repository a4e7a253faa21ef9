//! The fused epilogue program, shared by every GEMM kernel (f32 and int8).
//!
//! A program is a list of [`EpilogueOp`] micro-ops run in order on each output row segment, in
//! f32, after the K loop of a cache block finished (the block is still in L1/L2). The int8 path
//! starts from the i32 accumulator: `Dequant` converts it (with the column-sum compensation of the
//! activation zero point and of the internal +128 shift for s8 activations); without a `Dequant`
//! the exact product `Σ a·b` is converted to f32. The last step stores to the [`Output`] type;
//! `Requant` must be the last op and needs a u8/s8 output.
//!
//! `LayerNorm` needs a whole row. When a tile does not span the row (N split across threads or
//! cache blocks) the drivers run the ops before the first `LayerNorm` per tile into an f32
//! intermediate and the rest in a second, row-parallel pass; the result is the same.
//!
//! The row loop is compiled three times (plain, AVX2+FMA, AVX-512) from one generic body so the
//! same IEEE operation sequence runs everywhere.

use super::error::KernelError;
use super::math::{self, int_byte};

/// A per-tensor value or one value per output row (activation scale / zero point).
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C, u32)]
pub enum RowParam<'a, T> {
    /// One value for all rows.
    PerTensor(T),
    /// `values[row]`, at least `m` entries.
    PerRow(&'a [T]),
}

impl<T: Copy> RowParam<'_, T> {
    #[inline(always)]
    pub(crate) fn at(&self, row: usize) -> T {
        match self {
            Self::PerTensor(v) => *v,
            Self::PerRow(v) => v[row],
        }
    }
    fn len_ok(&self, m: usize) -> bool {
        match self {
            Self::PerTensor(_) => true,
            Self::PerRow(v) => v.len() >= m,
        }
    }
}

/// Quantized output element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum QType {
    /// u8, range [0, 255].
    U8,
    /// s8, range [-128, 127].
    S8,
}

impl QType {
    pub(crate) fn range(self) -> (f32, f32) {
        match self {
            Self::U8 => (0.0, 255.0),
            Self::S8 => (-128.0, 127.0),
        }
    }
}

/// One epilogue micro-op. `#[repr(C, u32)]` so a program can be built by generated code.
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C, u32)]
pub enum EpilogueOp<'a> {
    /// int8 only, first op: `y = (acc − zp[row]·colsum[n]) · a_scale[row] · w_scale[n]`, where
    /// `acc` is the exact `Σ a·b` in the caller's activation type and `colsum` the weight column
    /// sums stored with the packed weight. `w_scale` has 1 (per tensor) or `n` entries.
    Dequant {
        /// Activation scale, per tensor or per row.
        a_scale: RowParam<'a, f32>,
        /// Activation zero point (in the activation's own type), per tensor or per row.
        a_zero: RowParam<'a, i32>,
        /// Weight scale, 1 or `n` values.
        w_scale: &'a [f32],
    },
    /// `y *= s`.
    Scale(f32),
    /// `y += bias[n]`.
    Bias(&'a [f32]),
    /// `y *= s[n]`.
    MulCol(&'a [f32]),
    /// `y = max(y, 0)`.
    Relu,
    /// `y = gelu(y)`, erf form (see [`math::gelu_erf`]).
    GeluErf,
    /// `y = gelu(y)`, tanh form (see [`math::gelu_tanh`]).
    GeluTanh,
    /// `y += data[row·ld + n]`.
    AddResidual {
        /// Residual matrix, f32.
        data: &'a [f32],
        /// Its row stride.
        ld: usize,
    },
    /// Row-wise LayerNorm over all `n` columns: `(y − mean)/sqrt(var + eps)·gamma[n] + beta[n]`.
    LayerNorm {
        /// Scale, `n` values.
        gamma: &'a [f32],
        /// Shift, `n` values.
        beta: &'a [f32],
        /// Variance epsilon.
        eps: f32,
    },
    /// Last op, f32 output: `y` is stored as it is, and `clamp(round_half_even(y·s[n] / scale) +
    /// zero_point, 0, 255)` (NaN as 0, `s` = 1 without `smooth`) is stored as u8 to `out` as
    /// well: the quantized copy the next GEMM reads (see [`EpilogueOp::Requant`] for the formula).
    ForkU8 {
        /// Per-column factor applied to the copy only (a SmoothQuant factor), `n` values.
        smooth: Option<&'a [f32]>,
        /// Scale of the copy.
        scale: f32,
        /// Zero point of the copy, in [0, 255] (`validate` refuses others).
        zero_point: i32,
        /// Where the copy goes.
        out: ForkOut,
    },
    /// Last op, f32 output, needs whole rows (after a `LayerNorm`, or alone): `y` is stored as it
    /// is, and each row (times `s[n]`, `s` = 1 without `smooth`) is quantized to u8 by its own
    /// range into `out`, its scale and zero point into `params`: the dynamic per-token
    /// quantization of the next GEMM's input ([`super::rowquant::quantize_row`], the bytes the
    /// standalone quantizer makes).
    ForkU8Rows {
        /// Per-column factor applied to the copy only (a SmoothQuant factor), `n` values.
        smooth: Option<&'a [f32]>,
        /// Where the copy goes.
        out: ForkOut,
        /// Where each row's scale and zero point go.
        params: RowParamsOut,
    },
    /// Last op: `y = clamp(round_half_even(y / scale) + zero_point, qmin, qmax)`, NaN as 0 (ONNX
    /// `QuantizeLinear`'s formula, with its IEEE division, so that a quantization moved into a
    /// producer's epilogue gives the bytes the standalone one gave); the output must be of type
    /// `ty`.
    Requant {
        /// Output scale.
        scale: f32,
        /// Output zero point, in the range of `ty` (`validate` refuses others).
        zero_point: i32,
        /// Output type.
        ty: QType,
    },
}

/// The u8 buffer of [`EpilogueOp::ForkU8`]: `rows` rows of at least `n` bytes at stride `ld`,
/// written by the GEMM (each thread its own elements).
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C)]
pub struct ForkOut {
    pub(crate) ptr: *mut u8,
    len: usize,
    pub(crate) ld: usize,
}

// SAFETY: the GEMM drivers write disjoint elements from each thread, as for the main output.
unsafe impl Send for ForkOut {}
// SAFETY: as above.
unsafe impl Sync for ForkOut {}

impl ForkOut {
    /// The copy goes to `buf`, rows at stride `ld`; `buf` must stay untouched until the GEMM
    /// returns (the borrow ends here, the GEMM writes through the pointer).
    ///
    /// ```
    /// let mut bytes = vec![0u8; 6];
    /// let out = codegen::kernels::ForkOut::new(&mut bytes, 3);
    /// ```
    pub fn new(buf: &mut [u8], ld: usize) -> Self {
        Self {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
            ld,
        }
    }

    /// Whether the buffer holds `m` rows of `n` bytes at its stride.
    fn holds(&self, m: usize, n: usize) -> bool {
        m == 0 || n == 0 || (self.ld >= n && self.len >= (m - 1) * self.ld + n)
    }
}

/// The per-row scales and zero points of [`EpilogueOp::ForkU8Rows`]: `len` of each, row `r` at
/// index `r`, written by the GEMM (each thread its own rows).
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C)]
pub struct RowParamsOut {
    pub(crate) scales: *mut f32,
    pub(crate) zeros: *mut i32,
    len: usize,
}

// SAFETY: the GEMM drivers write disjoint rows from each thread, as for the main output.
unsafe impl Send for RowParamsOut {}
// SAFETY: as above.
unsafe impl Sync for RowParamsOut {}

impl RowParamsOut {
    /// The rows' parameters go to `scales` and `zeros` (row `r` at index `r`; the shorter
    /// length counts); both must stay untouched until the GEMM returns.
    ///
    /// ```
    /// let (mut scales, mut zeros) = (vec![0f32; 4], vec![0i32; 4]);
    /// let params = codegen::kernels::RowParamsOut::new(&mut scales, &mut zeros);
    /// ```
    pub fn new(scales: &mut [f32], zeros: &mut [i32]) -> Self {
        Self {
            scales: scales.as_mut_ptr(),
            zeros: zeros.as_mut_ptr(),
            len: scales.len().min(zeros.len()),
        }
    }
}

impl EpilogueOp<'_> {
    /// Whether the op needs whole rows (`LayerNorm`, `ForkU8Rows`): the drivers run it, and
    /// the ops after it, on rows whose every column is done.
    pub fn needs_whole_row(&self) -> bool {
        matches!(
            self,
            EpilogueOp::LayerNorm { .. } | EpilogueOp::ForkU8Rows { .. }
        )
    }
}

/// An epilogue program. `Epilogue::none()` just stores.
///
/// ```
/// use codegen::kernels::{Epilogue, EpilogueOp};
/// let bias = vec![0.5f32; 8];
/// let ep = Epilogue::bias_gelu(&bias);
/// assert_eq!(ep.ops(), &[EpilogueOp::Bias(&bias), EpilogueOp::GeluErf]);
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Epilogue<'a> {
    ops: EpilogueOps<'a>,
}

/// The ops of an [`Epilogue`], inline up to six (every fused GEMM of an encoder): building one
/// per GEMM call allocates nothing.
pub type EpilogueOps<'a> = smallvec::SmallVec<[EpilogueOp<'a>; 6]>;

/// The f32 GEMM epilogue is the same program type.
pub type EpilogueF32<'a> = Epilogue<'a>;

/// Where a GEMM result goes: element type, buffer and row stride.
#[derive(Debug)]
pub enum Output<'a> {
    /// f32.
    F32 {
        /// Buffer, at least `(m−1)·ldc + n` elements.
        c: &'a mut [f32],
        /// Row stride.
        ldc: usize,
    },
    /// bf16 bits (round to nearest even).
    Bf16 {
        /// Buffer.
        c: &'a mut [u16],
        /// Row stride.
        ldc: usize,
    },
    /// u8 (needs a final `Requant { ty: U8 }`).
    U8 {
        /// Buffer.
        c: &'a mut [u8],
        /// Row stride.
        ldc: usize,
    },
    /// s8 (needs a final `Requant { ty: S8 }`).
    S8 {
        /// Buffer.
        c: &'a mut [i8],
        /// Row stride.
        ldc: usize,
    },
    /// The exact i32 product `Σ a·b` (int8 GEMM only, empty program only).
    I32 {
        /// Buffer.
        c: &'a mut [i32],
        /// Row stride.
        ldc: usize,
    },
    /// The QKV projection of 8-bit attention (int8 GEMM only, `n = 3h`, `h` in heads of
    /// `head_dim`), its columns head by head: q, k and v of head 0, then of head 1, ... (so that
    /// the thread computing a head's columns is the one whose attention task reads them). Each
    /// head of q and of k is quantized as attention multiplies it ([`math::quantize_sym`], q as
    /// u8 shifted by 128, k as s8 bits) and v is stored as f32, each into the usual `[q | k]`,
    /// `[v]` layout of its destination. Half the bytes of an f32 output, and attention reads q
    /// and k ready.
    Heads(HeadsOut<'a>),
}

/// The three destinations of [`Output::Heads`], for an `m × 3h` GEMM whose columns are the q,
/// k and v of head 0, then those of head 1, and so on ([`head_slot`] says where each goes).
#[derive(Debug)]
pub struct HeadsOut<'a> {
    /// `m` rows of `2h` bytes at stride `ld_bytes`: q's heads (u8, +128), then k's (s8 bits).
    pub bytes: &'a mut [u8],
    pub ld_bytes: usize,
    /// `m` rows of `2h / head_dim` scales at stride `ld_scales`: q's heads, then k's.
    pub scales: &'a mut [f32],
    pub ld_scales: usize,
    /// `m` rows of v (`h` f32) at stride `ld_v`.
    pub v: &'a mut [f32],
    pub ld_v: usize,
    /// `h`: the width of each of q, k and v (the GEMM has `3h` columns).
    pub hidden: usize,
    /// Columns per head; divides `h`.
    pub head_dim: usize,
}

impl Output<'_> {
    /// Length and row stride of a one-buffer output; `None` for [`Output::Heads`], whose three
    /// buffers `validate_heads` checks.
    fn len_ld(&self) -> Option<(usize, usize)> {
        match self {
            Output::F32 { c, ldc } => Some((c.len(), *ldc)),
            Output::Bf16 { c, ldc } => Some((c.len(), *ldc)),
            Output::U8 { c, ldc } => Some((c.len(), *ldc)),
            Output::S8 { c, ldc } => Some((c.len(), *ldc)),
            Output::I32 { c, ldc } => Some((c.len(), *ldc)),
            Output::Heads(_) => None,
        }
    }

    /// The column granularity the drivers must keep: the q, k and v of whole heads of an
    /// [`Output::Heads`] (quantizing a head needs its maximum, and a thread that computes all
    /// three of a head is the one whose attention task reads them); 1 otherwise.
    pub(crate) fn col_granularity(&self) -> usize {
        match self {
            Output::Heads(h) => 3 * h.head_dim,
            _ => 1,
        }
    }

    pub(crate) fn ptr(&mut self) -> OutPtr {
        match self {
            Output::F32 { c, ldc } => OutPtr::F32(c.as_mut_ptr(), *ldc),
            Output::Bf16 { c, ldc } => OutPtr::Bf16(c.as_mut_ptr(), *ldc),
            Output::U8 { c, ldc } => OutPtr::U8(c.as_mut_ptr(), *ldc),
            Output::S8 { c, ldc } => OutPtr::S8(c.as_mut_ptr(), *ldc),
            Output::I32 { c, ldc } => OutPtr::I32(c.as_mut_ptr(), *ldc),
            Output::Heads(h) => OutPtr::Heads(HeadsPtr {
                bytes: h.bytes.as_mut_ptr(),
                ld_bytes: h.ld_bytes,
                scales: h.scales.as_mut_ptr(),
                ld_scales: h.ld_scales,
                v: h.v.as_mut_ptr(),
                ld_v: h.ld_v,
                hidden: h.hidden,
                head_dim: h.head_dim,
            }),
        }
    }
}

/// [`HeadsOut`] as raw pointers (absolute row addressing).
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeadsPtr {
    pub(super) bytes: *mut u8,
    pub(super) ld_bytes: usize,
    pub(super) scales: *mut f32,
    pub(super) ld_scales: usize,
    pub(super) v: *mut f32,
    pub(super) ld_v: usize,
    pub(super) hidden: usize,
    pub(super) head_dim: usize,
}

/// Where the `head_dim` columns of an [`Output::Heads`] GEMM from column `c` (a multiple of
/// `head_dim`) go: columns `3·dh·i .. 3·dh·(i + 1)` are the q, k and v of head `i`.
///
/// ```
/// use codegen::kernels::{head_slot, HeadSlot};
/// // 4 heads of 8 (h = 32): columns 24.., 32.. and 40.. are the q, k and v of head 1.
/// assert_eq!(head_slot(24, 32, 8), HeadSlot::Quantized { byte_col: 8, scale: 1, offset: 128 });
/// assert_eq!(head_slot(32, 32, 8), HeadSlot::Quantized { byte_col: 40, scale: 5, offset: 0 });
/// assert_eq!(head_slot(40, 32, 8), HeadSlot::Values { col: 8 });
/// ```
#[inline(always)]
pub fn head_slot(c: usize, hidden: usize, head_dim: usize) -> HeadSlot {
    let (head, part) = (c / (3 * head_dim), c / head_dim % 3);
    match part {
        0 => HeadSlot::Quantized {
            byte_col: head * head_dim,
            scale: head,
            offset: 128,
        },
        1 => HeadSlot::Quantized {
            byte_col: hidden + head * head_dim,
            scale: hidden / head_dim + head,
            offset: 0,
        },
        _ => HeadSlot::Values {
            col: head * head_dim,
        },
    }
}

/// The destination of one head's columns of an [`Output::Heads`] GEMM (see [`head_slot`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadSlot {
    /// A head of q (`offset` 128: u8) or of k (`offset` 0: s8 bits): its bytes from column
    /// `byte_col` of a row of `bytes`, its scale at column `scale` of a row of `scales`.
    Quantized {
        byte_col: usize,
        scale: usize,
        offset: u8,
    },
    /// A head of v: its f32 values from column `col` of a row of `v`.
    Values { col: usize },
}

/// Raw output pointer (absolute row/column addressing) shared by the worker threads, which
/// write disjoint tiles.
#[derive(Debug, Clone, Copy)]
pub(crate) enum OutPtr {
    F32(*mut f32, usize),
    Bf16(*mut u16, usize),
    U8(*mut u8, usize),
    S8(*mut i8, usize),
    I32(*mut i32, usize),
    Heads(HeadsPtr),
}
// SAFETY: the drivers hand each thread a disjoint set of output elements.
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

/// Source of a block: the i32 accumulator scratch or an f32 matrix (relative addressing: `ptr`
/// is element (row0, col0) of the block).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Src {
    I32(*const i32, usize),
    /// f32 rows the program runs on in place (scratch, or the output itself): no copy in, and
    /// none out when they are the output.
    F32(*mut f32, usize),
}

/// Per-block context for int8 sources.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Int8Ctx<'c> {
    /// Column sums of the weight, indexed by absolute column.
    pub colsum: &'c [i32],
    /// 128 when the activations were s8 (shifted to u8 inside the kernel), else 0.
    pub shift: i32,
    /// The per-column constants of a `Dequant` with per-tensor activation parameters, made
    /// once per GEMM call (see [`FoldedDequant::fold`]).
    pub folded: Option<FoldedDequant<'c>>,
}

/// A `Dequant` whose activation scale and zero point are per tensor (static quantization),
/// folded into two per-column vectors: `comp[n] = (shift + a_zero)·colsum[n]` and `scale[n] =
/// a_scale·w_scale[n]`, so that a value is `(acc − comp[n]) as f32 · scale[n]`: the same
/// integers and the same f32 products as the general form, without its per-element integer
/// multiply and scale product.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FoldedDequant<'c> {
    pub comp: &'c [i32],
    pub scale: &'c [f32],
}

impl<'c> FoldedDequant<'c> {
    /// Folds the first op of `ops` into `comp` and `scale` (cleared and refilled, `n` columns)
    /// when it is a per-tensor `Dequant`; `None` otherwise.
    pub(crate) fn fold(
        ops: &[EpilogueOp<'_>],
        colsum: &[i32],
        shift: i32,
        n: usize,
        (comp, scale): (&'c mut Vec<i32>, &'c mut Vec<f32>),
    ) -> Option<Self> {
        let Some(EpilogueOp::Dequant {
            a_scale: RowParam::PerTensor(s),
            a_zero: RowParam::PerTensor(z),
            w_scale,
        }) = ops.first()
        else {
            return None;
        };
        let zp = shift + z;
        comp.clear();
        comp.extend(colsum[..n].iter().map(|&c| zp.wrapping_mul(c)));
        scale.clear();
        if w_scale.len() == 1 {
            scale.resize(n, s * w_scale[0]);
        } else {
            scale.extend(w_scale[..n].iter().map(|&w| s * w));
        }
        Some(Self { comp, scale })
    }
}

impl<'a> Epilogue<'a> {
    /// Just store the result.
    pub fn none() -> Self {
        Self {
            ops: EpilogueOps::new(),
        }
    }

    /// A program from micro-ops.
    pub fn new(ops: impl Into<EpilogueOps<'a>>) -> Self {
        Self { ops: ops.into() }
    }

    /// `y + bias[n]`.
    pub fn bias(bias: &'a [f32]) -> Self {
        Self::new(vec![EpilogueOp::Bias(bias)])
    }

    /// `gelu_erf(y + bias[n])`.
    pub fn bias_gelu(bias: &'a [f32]) -> Self {
        Self::new(vec![EpilogueOp::Bias(bias), EpilogueOp::GeluErf])
    }

    /// `y + bias[n] + residual[row·ld + n]`.
    pub fn bias_residual(bias: &'a [f32], residual: &'a [f32], ld: usize) -> Self {
        Self::new(vec![
            EpilogueOp::Bias(bias),
            EpilogueOp::AddResidual { data: residual, ld },
        ])
    }

    /// Appends one op.
    pub fn then(mut self, op: EpilogueOp<'a>) -> Self {
        self.ops.push(op);
        self
    }

    /// The micro-ops.
    pub fn ops(&self) -> &[EpilogueOp<'a>] {
        &self.ops
    }

    /// Index of the first op that needs whole rows (`LayerNorm`, `ForkU8Rows`): ops before it
    /// can run per tile, the rest need whole rows.
    pub(crate) fn row_split(&self) -> usize {
        self.ops
            .iter()
            .position(EpilogueOp::needs_whole_row)
            .unwrap_or(self.ops.len())
    }

    /// Checks the program against an `m × n` problem, the output and the GEMM kind.
    pub fn validate(
        &self,
        m: usize,
        n: usize,
        out: &Output<'_>,
        int8: bool,
    ) -> Result<(), KernelError> {
        let bad = |s: String| Err(KernelError::BadEpilogue(s));
        match (out, out.len_ld()) {
            (Output::Heads(h), _) => validate_heads(h, m, n, int8)?,
            (_, Some((len, ldc))) if m > 0 && n > 0 && (ldc < n || len < (m - 1) * ldc + n) => {
                return Err(KernelError::BadArgs(format!(
                    "output buffer {len} too small for {m}x{n} with ldc {ldc}"
                )));
            }
            _ => {}
        }
        if matches!(out, Output::I32 { .. }) && (!int8 || !self.ops.is_empty()) {
            return bad("i32 output is only for int8 GEMM with an empty program".into());
        }
        for (i, op) in self.ops.iter().enumerate() {
            let last = i + 1 == self.ops.len();
            match op {
                EpilogueOp::Dequant {
                    a_scale,
                    a_zero,
                    w_scale,
                } => {
                    if !int8 || i != 0 {
                        return bad("Dequant must be the first op of an int8 program".into());
                    }
                    if !a_scale.len_ok(m) || !a_zero.len_ok(m) {
                        return bad("per-row activation parameters shorter than m".into());
                    }
                    if w_scale.len() != 1 && w_scale.len() < n {
                        return bad(format!(
                            "w_scale has {} values, need 1 or {n}",
                            w_scale.len()
                        ));
                    }
                }
                EpilogueOp::Bias(v) | EpilogueOp::MulCol(v) if v.len() < n => {
                    return bad(format!(
                        "per-column vector has {} values, need {n}",
                        v.len()
                    ));
                }
                EpilogueOp::AddResidual { data, ld }
                    if m > 0 && n > 0 && (*ld < n || data.len() < (m - 1) * ld + n) =>
                {
                    return bad("residual too small".into());
                }
                EpilogueOp::LayerNorm { gamma, beta, .. } if gamma.len() < n || beta.len() < n => {
                    return bad("LayerNorm gamma/beta shorter than n".into());
                }
                EpilogueOp::ForkU8 {
                    smooth,
                    zero_point,
                    out: f,
                    ..
                } => {
                    if !last || !matches!(out, Output::F32 { .. }) {
                        return bad("ForkU8 must be last and needs an f32 output".into());
                    }
                    if !(0..=255).contains(zero_point) {
                        return bad(format!(
                            "ForkU8 zero point {zero_point} outside the u8 range"
                        ));
                    }
                    if smooth.is_some_and(|s| s.len() < n) {
                        return bad("ForkU8 factors shorter than n".into());
                    }
                    if !f.holds(m, n) {
                        return bad(format!(
                            "ForkU8 buffer {} too small for {m}x{n} with ld {}",
                            f.len, f.ld
                        ));
                    }
                }
                EpilogueOp::ForkU8Rows {
                    smooth,
                    out: f,
                    params,
                } => {
                    if !last || !matches!(out, Output::F32 { .. }) {
                        return bad("ForkU8Rows must be last and needs an f32 output".into());
                    }
                    if smooth.is_some_and(|s| s.len() < n) {
                        return bad("ForkU8Rows factors shorter than n".into());
                    }
                    if !f.holds(m, n) {
                        return bad(format!(
                            "ForkU8Rows buffer {} too small for {m}x{n} with ld {}",
                            f.len, f.ld
                        ));
                    }
                    if params.len < m {
                        return bad(format!(
                            "ForkU8Rows has {} row parameters for {m} rows",
                            params.len
                        ));
                    }
                }
                EpilogueOp::Requant { ty, zero_point, .. } => {
                    let ok = matches!(
                        (ty, out),
                        (QType::U8, Output::U8 { .. }) | (QType::S8, Output::S8 { .. })
                    );
                    if !last || !ok {
                        return bad("Requant must be last and match a u8/s8 output".into());
                    }
                    // A zero point is a value of its type (ONNX types it so); the kernels rely
                    // on it (the vector requantization clamps before it adds the zero point).
                    let (lo, hi) = ty.range();
                    if !(lo..=hi).contains(&(*zero_point as f32)) {
                        return bad(format!(
                            "Requant zero point {zero_point} outside the {ty:?} range"
                        ));
                    }
                }
                _ => {}
            }
        }
        let ends_requant = matches!(self.ops.last(), Some(EpilogueOp::Requant { .. }));
        if matches!(out, Output::U8 { .. } | Output::S8 { .. }) && !ends_requant {
            return bad("u8/s8 output needs a final Requant".into());
        }
        Ok(())
    }
}

/// Checks an [`Output::Heads`] against an `m × n` GEMM.
fn validate_heads(h: &HeadsOut<'_>, m: usize, n: usize, int8: bool) -> Result<(), KernelError> {
    let bad = |s: String| Err(KernelError::BadArgs(format!("heads output: {s}")));
    if !int8 {
        return bad("only the int8 GEMM quantizes heads".into());
    }
    let hidden = h.hidden;
    if n != 3 * hidden || h.head_dim == 0 || !hidden.is_multiple_of(h.head_dim) {
        return bad(format!(
            "{n} columns are not q, k and v of whole heads of {}",
            h.head_dim
        ));
    }
    let heads2 = 2 * hidden / h.head_dim;
    let fits = |len: usize, ld: usize, w: usize| m == 0 || (ld >= w && len >= (m - 1) * ld + w);
    if !fits(h.bytes.len(), h.ld_bytes, 2 * hidden) {
        return bad(format!(
            "{} bytes at stride {} do not hold {m} rows of {}",
            h.bytes.len(),
            h.ld_bytes,
            2 * hidden
        ));
    }
    if !fits(h.scales.len(), h.ld_scales, heads2) {
        return bad(format!(
            "{} scales at stride {} do not hold {m} rows of {heads2}",
            h.scales.len(),
            h.ld_scales
        ));
    }
    if !fits(h.v.len(), h.ld_v, hidden) {
        return bad(format!(
            "{} values of v at stride {} do not hold {m} rows of {hidden}",
            h.v.len(),
            h.ld_v
        ));
    }
    Ok(())
}

/// Runs `ops` on the block `rows × cols` from `src` to `out`. `tmp` is scratch (grown as needed).
///
/// # Safety
/// `src` must address `rows.len()` rows of `cols.len()` readable elements (f32 ones writable
/// too, and touched by no one else during the call); `out` must address
/// the absolute elements `rows × cols` writable and not concurrently accessed elsewhere; the
/// program must have been validated for a problem that contains this block; `LayerNorm` ops
/// require `cols` to be the full row.
pub(crate) unsafe fn run_block(
    ops: &[EpilogueOp<'_>],
    int8: Option<Int8Ctx<'_>>,
    src: Src,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    out: OutPtr,
    tmp: &mut Vec<f32>,
) {
    if tmp.len() < cols.len() {
        tmp.resize(cols.len(), 0.0);
    }
    let f = super::select::cpu_features();
    #[cfg(target_arch = "x86_64")]
    {
        if f.avx512 {
            // SAFETY: the CPU supports AVX-512F/BW/VL and FMA (checked); caller upholds the rest.
            return unsafe { run_block_avx512(ops, int8, src, rows, cols, out, tmp) };
        }
        if f.avx2_fma {
            // SAFETY: the CPU supports AVX2 and FMA (checked); caller upholds the rest.
            return unsafe { run_block_avx2(ops, int8, src, rows, cols, out, tmp) };
        }
    }
    let _ = f;
    // SAFETY: forwarded caller contract.
    unsafe { run_block_generic(ops, int8, src, rows, cols, out, tmp) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn run_block_avx512(
    ops: &[EpilogueOp<'_>],
    int8: Option<Int8Ctx<'_>>,
    src: Src,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    out: OutPtr,
    tmp: &mut [f32],
) {
    match (src, int8) {
        (Src::I32(acc, ld), Some(ctx)) if super::epilogue_chain::eligible(ops, &out) => {
            // SAFETY: forwarded caller contract; the chain is eligible and the CPU has
            // AVX-512F/BW/VL (this function's features); `tmp` holds `cols.len()` values.
            return unsafe {
                super::epilogue_chain::run(ops, ctx, acc, ld, rows, cols, out, tmp.as_mut_ptr())
            };
        }
        (Src::F32(y, ld), _) if super::epilogue_chain::norm_eligible(ops, &out) => {
            // SAFETY: as above; `LayerNorm` blocks span whole rows (caller contract).
            return unsafe {
                super::epilogue_chain::run_norm_f32(ops, y, ld, rows, cols, out, tmp.as_mut_ptr())
            };
        }
        _ => {}
    }
    // SAFETY: forwarded caller contract.
    unsafe { run_block_generic(ops, int8, src, rows, cols, out, tmp) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn run_block_avx2(
    ops: &[EpilogueOp<'_>],
    int8: Option<Int8Ctx<'_>>,
    src: Src,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    out: OutPtr,
    tmp: &mut [f32],
) {
    // SAFETY: forwarded caller contract.
    unsafe { run_block_generic(ops, int8, src, rows, cols, out, tmp) }
}

#[inline(always)]
unsafe fn run_block_generic(
    ops: &[EpilogueOp<'_>],
    int8: Option<Int8Ctx<'_>>,
    src: Src,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    out: OutPtr,
    tmp: &mut [f32],
) {
    let w = cols.len();
    let c0 = cols.start;
    for (i, r) in rows.enumerate() {
        let mut ops = ops;
        let y: &mut [f32] = match src {
            // SAFETY: the caller guarantees `w` f32 at row i of the block, ours to modify.
            Src::F32(p, ld) => unsafe { std::slice::from_raw_parts_mut(p.add(i * ld), w) },
            Src::I32(..) => &mut tmp[..w],
        };
        match src {
            Src::I32(p, ld) => {
                // SAFETY: caller guarantees `w` readable i32 at row i of the block.
                let acc = unsafe { std::slice::from_raw_parts(p.add(i * ld), w) };
                let ctx = int8.expect("int8 source needs an Int8Ctx");
                let cs = &ctx.colsum[c0..c0 + w];
                if let OutPtr::I32(o, ldc) = out {
                    // SAFETY: caller guarantees the output block is writable.
                    let o = unsafe { std::slice::from_raw_parts_mut(o.add(r * ldc + c0), w) };
                    for ((o, &a), &s) in o.iter_mut().zip(acc).zip(cs) {
                        *o = a.wrapping_sub(ctx.shift.wrapping_mul(s));
                    }
                    continue;
                }
                if let Some(EpilogueOp::Dequant {
                    a_scale,
                    a_zero,
                    w_scale,
                }) = ops.first()
                {
                    let zp = ctx.shift + a_zero.at(r);
                    let s = a_scale.at(r);
                    // A bias right after the dequantization is added in the same pass, and when
                    // nothing follows, an f32 row is written straight to the output: the same
                    // two roundings per value, one pass over the row instead of three.
                    let (bias, rest) = match ops.get(1) {
                        Some(EpilogueOp::Bias(b)) => (Some(&b[c0..c0 + w]), &ops[2..]),
                        _ => (None, &ops[1..]),
                    };
                    let direct = match out {
                        OutPtr::F32(o, ldc) if rest.is_empty() => {
                            // SAFETY: the caller guarantees the output block is writable and
                            // exclusive to us.
                            Some(unsafe { std::slice::from_raw_parts_mut(o.add(r * ldc + c0), w) })
                        }
                        _ => None,
                    };
                    let stored = direct.is_some();
                    let dst: &mut [f32] = match direct {
                        Some(d) => d,
                        None => &mut *y,
                    };
                    let deq =
                        |a: i32, c: i32, s: f32| (a.wrapping_sub(zp.wrapping_mul(c))) as f32 * s;
                    if let Some(f) = ctx.folded {
                        let (comp, scale) = (&f.comp[c0..c0 + w], &f.scale[c0..c0 + w]);
                        let deq = |a: i32, c: i32, s: f32| a.wrapping_sub(c) as f32 * s;
                        match bias {
                            Some(b) => {
                                for ((((y, &a), &c), &s), &b) in
                                    dst.iter_mut().zip(acc).zip(comp).zip(scale).zip(b)
                                {
                                    *y = deq(a, c, s) + b;
                                }
                            }
                            None => {
                                for (((y, &a), &c), &s) in
                                    dst.iter_mut().zip(acc).zip(comp).zip(scale)
                                {
                                    *y = deq(a, c, s);
                                }
                            }
                        }
                    } else {
                        match (w_scale.len() == 1, bias) {
                            (true, None) => {
                                let s = s * w_scale[0];
                                for ((y, &a), &c) in dst.iter_mut().zip(acc).zip(cs) {
                                    *y = deq(a, c, s);
                                }
                            }
                            (true, Some(b)) => {
                                let s = s * w_scale[0];
                                for (((y, &a), &c), &b) in dst.iter_mut().zip(acc).zip(cs).zip(b) {
                                    *y = deq(a, c, s) + b;
                                }
                            }
                            (false, None) => {
                                let ws = &w_scale[c0..c0 + w];
                                for (((y, &a), &c), &ws) in dst.iter_mut().zip(acc).zip(cs).zip(ws)
                                {
                                    *y = deq(a, c, s * ws);
                                }
                            }
                            (false, Some(b)) => {
                                let ws = &w_scale[c0..c0 + w];
                                for ((((y, &a), &c), &ws), &b) in
                                    dst.iter_mut().zip(acc).zip(cs).zip(ws).zip(b)
                                {
                                    *y = deq(a, c, s * ws) + b;
                                }
                            }
                        }
                    }
                    if stored {
                        continue;
                    }
                    ops = rest;
                } else {
                    for ((y, &a), &c) in y.iter_mut().zip(acc).zip(cs) {
                        *y = a.wrapping_sub(ctx.shift.wrapping_mul(c)) as f32;
                    }
                }
            }
            Src::F32(..) => {}
        }
        for op in ops {
            apply_op(op, r, c0, y);
        }
        if let OutPtr::F32(o, ld) = out {
            if o.wrapping_add(r * ld + c0) == y.as_mut_ptr() {
                continue;
            }
        }
        // SAFETY: caller guarantees the output block is writable and exclusive to us, and it
        // is not the row `y` (checked just above for the in-place case).
        unsafe { store_row(out, r, c0, y) };
    }
}

#[inline(always)]
fn apply_op(op: &EpilogueOp<'_>, r: usize, c0: usize, y: &mut [f32]) {
    let w = y.len();
    match *op {
        EpilogueOp::Dequant { .. } => unreachable!("validated: Dequant only first on int8"),
        EpilogueOp::Scale(s) => y.iter_mut().for_each(|v| *v *= s),
        EpilogueOp::Bias(b) => y.iter_mut().zip(&b[c0..c0 + w]).for_each(|(v, b)| *v += b),
        EpilogueOp::MulCol(s) => y.iter_mut().zip(&s[c0..c0 + w]).for_each(|(v, s)| *v *= s),
        EpilogueOp::Relu => y.iter_mut().for_each(|v| *v = v.max(0.0)),
        EpilogueOp::GeluErf => math::gelu_erf_slice(y),
        EpilogueOp::GeluTanh => y.iter_mut().for_each(|v| *v = math::gelu_tanh(*v)),
        EpilogueOp::AddResidual { data, ld } => {
            let row = &data[r * ld + c0..r * ld + c0 + w];
            y.iter_mut().zip(row).for_each(|(v, x)| *v += x);
        }
        EpilogueOp::LayerNorm { gamma, beta, eps } => {
            debug_assert_eq!(c0, 0);
            let mean = math::wide_sum(y) / w as f32;
            y.iter_mut().for_each(|v| *v -= mean);
            let var = math::wide_sum_sq(y) / w as f32;
            let inv = 1.0 / (var + eps).sqrt();
            for ((v, g), b) in y.iter_mut().zip(&gamma[..w]).zip(&beta[..w]) {
                *v = (*v * inv).mul_add(*g, *b);
            }
        }
        EpilogueOp::ForkU8 {
            smooth,
            scale,
            zero_point,
            out,
        } => {
            let zp = zero_point as f32;
            // SAFETY: validated to hold the problem's rows at stride `out.ld`; the caller owns
            // elements (r, c0..c0 + w) of the output, and so of its copy.
            let o = unsafe { std::slice::from_raw_parts_mut(out.ptr.add(r * out.ld + c0), w) };
            let q = |v: f32| int_byte(math::quantize_div(v, scale, zp, 0.0, 255.0));
            match smooth {
                Some(s) => o
                    .iter_mut()
                    .zip(y.iter())
                    .zip(&s[c0..c0 + w])
                    .for_each(|((o, v), s)| *o = q(v * s)),
                None => o.iter_mut().zip(y.iter()).for_each(|(o, v)| *o = q(*v)),
            }
        }
        EpilogueOp::ForkU8Rows {
            smooth,
            out,
            params,
        } => {
            debug_assert_eq!(c0, 0, "ForkU8Rows runs on whole rows");
            // SAFETY: validated to hold the problem's rows at stride `out.ld` and `m` row
            // parameters; the caller owns row r of the output, so of its copy and parameters.
            unsafe {
                let o = std::slice::from_raw_parts_mut(out.ptr.add(r * out.ld), w);
                let (scale, zero) = super::rowquant::quantize_row(y, smooth.map(|s| &s[..w]), o);
                *params.scales.add(r) = scale;
                *params.zeros.add(r) = zero;
            }
        }
        EpilogueOp::Requant {
            scale,
            zero_point,
            ty,
        } => {
            let (lo, hi) = ty.range();
            let zp = zero_point as f32;
            y.iter_mut()
                .for_each(|v| *v = math::quantize_div(*v, scale, zp, lo, hi));
        }
    }
}

#[inline(always)]
unsafe fn store_row(out: OutPtr, r: usize, c0: usize, y: &[f32]) {
    let w = y.len();
    match out {
        OutPtr::F32(p, ld) => {
            // SAFETY: the caller guarantees the w elements at (r, c0) are writable and ours.
            unsafe { std::slice::from_raw_parts_mut(p.add(r * ld + c0), w) }.copy_from_slice(y)
        }
        OutPtr::Bf16(p, ld) => {
            // SAFETY: the caller guarantees the w elements at (r, c0) are writable and ours.
            let o = unsafe { std::slice::from_raw_parts_mut(p.add(r * ld + c0), w) };
            o.iter_mut()
                .zip(y)
                .for_each(|(o, v)| *o = math::f32_to_bf16(*v));
        }
        // Bytes are only stored after `Requant`, which leaves integral values in [-128, 255].
        OutPtr::U8(p, ld) => {
            // SAFETY: the caller guarantees the w elements at (r, c0) are writable and ours.
            let o = unsafe { std::slice::from_raw_parts_mut(p.add(r * ld + c0), w) };
            o.iter_mut().zip(y).for_each(|(o, v)| *o = int_byte(*v));
        }
        OutPtr::S8(p, ld) => {
            // SAFETY: the caller guarantees the w elements at (r, c0) are writable and ours.
            let o = unsafe { std::slice::from_raw_parts_mut(p.add(r * ld + c0), w) };
            o.iter_mut()
                .zip(y)
                .for_each(|(o, v)| *o = int_byte(*v) as i8);
        }
        OutPtr::I32(p, ld) => {
            // SAFETY: the caller guarantees the w elements at (r, c0) are writable and ours.
            let o = unsafe { std::slice::from_raw_parts_mut(p.add(r * ld + c0), w) };
            o.iter_mut().zip(y).for_each(|(o, v)| *o = *v as i32);
        }
        // SAFETY: forwarded caller contract.
        OutPtr::Heads(h) => unsafe { store_heads(h, r, c0, y) },
    }
}

/// Row `r`, columns `c0..c0 + y.len()` (whole heads: the drivers keep the granularity of
/// [`Output::col_granularity`]) of an [`Output::Heads`]: heads of q and k quantized, v copied,
/// each where [`head_slot`] says.
///
/// # Safety
/// As [`store_row`]: the heads of these columns in row `r` of the three destinations (which
/// `validate_heads` checked hold the problem) are the caller's.
#[inline(always)]
unsafe fn store_heads(h: HeadsPtr, r: usize, c0: usize, y: &[f32]) {
    let dh = h.head_dim;
    debug_assert!(c0.is_multiple_of(dh) && y.len().is_multiple_of(dh));
    for (i, head) in y.chunks_exact(dh).enumerate() {
        match head_slot(c0 + i * dh, h.hidden, dh) {
            HeadSlot::Quantized {
                byte_col,
                scale,
                offset,
            } => {
                // SAFETY: one head of row r: inside the checked destinations, the caller's.
                unsafe {
                    let bytes =
                        std::slice::from_raw_parts_mut(h.bytes.add(r * h.ld_bytes + byte_col), dh);
                    *h.scales.add(r * h.ld_scales + scale) =
                        math::quantize_sym(head, bytes, offset);
                }
            }
            HeadSlot::Values { col } => {
                // SAFETY: as above, in v.
                let v = unsafe { std::slice::from_raw_parts_mut(h.v.add(r * h.ld_v + col), dh) };
                // Element by element: a `memmove` call per head cost more than the copy.
                v.iter_mut().zip(head).for_each(|(v, x)| *v = *x);
            }
        }
    }
}

/// Reference evaluation of a program on one value (f64 where it matters), for tests: `acc` is
/// the exact integer product for int8 (with `colsum` of the column) or the f32 GEMM value.
pub fn reference_eval(
    ops: &[EpilogueOp<'_>],
    row: usize,
    col: usize,
    acc: f64,
    colsum: i32,
    row_vals: Option<&[f64]>,
) -> f64 {
    let mut y = acc;
    for op in ops {
        y = match *op {
            EpilogueOp::Dequant {
                a_scale,
                a_zero,
                w_scale,
            } => {
                let ws = if w_scale.len() == 1 {
                    w_scale[0]
                } else {
                    w_scale[col]
                };
                (acc - a_zero.at(row) as f64 * colsum as f64) * (a_scale.at(row) as f64 * ws as f64)
            }
            EpilogueOp::Scale(s) => y * s as f64,
            EpilogueOp::Bias(b) => y + b[col] as f64,
            EpilogueOp::MulCol(s) => y * s[col] as f64,
            EpilogueOp::Relu => y.max(0.0),
            EpilogueOp::GeluErf => 0.5 * y * erfc_f64(-y / std::f64::consts::SQRT_2),
            EpilogueOp::GeluTanh => {
                let u = (2.0 / std::f64::consts::PI).sqrt() * (y + 0.044715 * y * y * y);
                0.5 * y * (1.0 + u.tanh())
            }
            EpilogueOp::AddResidual { data, ld } => y + data[row * ld + col] as f64,
            EpilogueOp::LayerNorm { gamma, beta, eps } => {
                let v = row_vals.expect("LayerNorm reference needs the whole row");
                let n = v.len() as f64;
                let mean = v.iter().sum::<f64>() / n;
                let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
                (y - mean) / (var + eps as f64).sqrt() * gamma[col] as f64 + beta[col] as f64
            }
            // The f32 value is the output; the u8 copy is checked against `quantize_div`.
            EpilogueOp::ForkU8 { .. } | EpilogueOp::ForkU8Rows { .. } => y,
            EpilogueOp::Requant {
                scale,
                zero_point,
                ty,
            } => {
                let (lo, hi) = ty.range();
                let q = (y as f32 / scale).round_ties_even();
                let q = if q.is_nan() { 0.0 } else { q };
                (q as f64 + zero_point as f64).clamp(lo as f64, hi as f64)
            }
        };
    }
    y
}

/// erfc in f64 (W. J. Cody's rational approximations via the continued fraction is overkill here;
/// this uses erfc = 1 − erf for small |x| and a Lentz continued fraction for large |x|), accurate
/// to ~1e-15 relative; used only as the test oracle.
pub fn erfc_f64(x: f64) -> f64 {
    if x < 0.0 {
        return 2.0 - erfc_f64(-x);
    }
    if x < 2.0 {
        // Maclaurin series of erf.
        let mut sum = x;
        let mut term = x;
        let x2 = x * x;
        let mut n = 0.0;
        loop {
            n += 1.0;
            term *= -x2 / n;
            let t = term / (2.0 * n + 1.0);
            sum += t;
            if t.abs() <= 1e-17 * sum.abs() {
                break;
            }
        }
        1.0 - sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        // Continued fraction: erfc(x) = exp(-x²)/√π · 1/(x + 1/2/(x + 1/(x + 3/2/(x + ...)))).
        let mut f = x;
        for k in (1..200).rev() {
            f = x + (k as f64 / 2.0) / f;
        }
        (-x * x).exp() / std::f64::consts::PI.sqrt() / f
    }
}

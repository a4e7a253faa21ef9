//! Elementwise int8 epilogues in registers (AVX-512): a `Dequant` followed only by column-wise
//! and element-wise ops (bias, scale, per-column factors, erf GELU, residual add, requantize)
//! runs as one pass per 16 columns, from the i32 accumulators straight to the output, instead of
//! one pass over a scratch row per op. The same operations in the same order as the multi-pass
//! path (separate multiplies and adds, IEEE division, the same GELU pieces), so the same bits;
//! `set_register_chains(false)` turns it off so tests can compare the two.
//!
//! On BERT-base the chains are the FFN up-projection (`bias, gelu_erf, mul_col, requant_u8`,
//! the widest GEMM), the QKV projection feeding int8 attention (`bias, quant_heads`: each head
//! of q and k quantized from the registers that hold it, v stored as f32) and the
//! dynamic-activation paths. A chain with a `LayerNorm` (the attention output projection and
//! FFN down-projection: `bias, residual, layer_norm, fork_u8`) runs its ops up to the LayerNorm
//! the same way into one scratch row, then three passes over that row in L1 (the mean, the
//! variance, then the normalisation with everything after it, the u8 copy included) instead of
//! eight; [`run_norm_f32`] runs that row step on f32 rows, for the GEMMs whose rows do not fit
//! one block and for the f32 GEMMs.

use std::arch::x86_64::*;
use std::sync::atomic::{AtomicBool, Ordering};

use super::epilogue::{EpilogueOp, HeadSlot, Int8Ctx, OutPtr, RowParamsOut};
use super::math::GeluErf512;

/// The widest head [`OutPtr::Heads`] takes in registers (16 vectors).
const MAX_HEAD: usize = 256;

static REGISTER_CHAINS: AtomicBool = AtomicBool::new(true);

/// Turns the register path on or off (on by default): a switch for tests and measurements,
/// which compare it with the multi-pass path it replaces.
///
/// ```
/// codegen::kernels::epilogue_chain::set_register_chains(true);
/// ```
pub fn set_register_chains(on: bool) {
    REGISTER_CHAINS.store(on, Ordering::Relaxed);
}

/// Whether `op` is one of the element- or column-wise ops a chain applies vector by vector:
/// one [`Fixed::set`] takes.
fn elementwise(op: &EpilogueOp<'_>) -> bool {
    let mut scratch = Fixed::NONE;
    scratch.set(op).is_some()
}

/// Whether the output `out` can take what a chain ending in `last` leaves.
fn output_fits(last: Option<&EpilogueOp<'_>>, out: &OutPtr) -> bool {
    let ends_requant = matches!(last, Some(EpilogueOp::Requant { .. }));
    match out {
        OutPtr::F32(..) => !ends_requant,
        // Bytes hold integral values only, which a final requantization leaves.
        OutPtr::U8(..) | OutPtr::S8(..) => ends_requant,
        _ => false,
    }
}

/// Whether `ops` on an i32 source into `out` is a chain this path runs: a `Dequant`, then
/// elementwise ops, optionally a `LayerNorm` and the ops [`NormTail`] takes after it.
pub(crate) fn eligible(ops: &[EpilogueOp<'_>], out: &OutPtr) -> bool {
    if !REGISTER_CHAINS.load(Ordering::Relaxed) {
        return false;
    }
    let Some((EpilogueOp::Dequant { .. }, rest)) = ops.split_first() else {
        return false;
    };
    if let Some(p) = rest.iter().position(is_norm) {
        return rest[..p].iter().all(elementwise)
            && NormTail::decode(&rest[p..]).is_some()
            && output_fits(rest.last(), out);
    }
    if !rest.iter().all(elementwise) {
        return false;
    }
    match out {
        // Whole heads in whole vectors (the drivers keep every block on whole heads).
        OutPtr::Heads(h) => {
            !matches!(rest.last(), Some(EpilogueOp::Requant { .. }))
                && h.head_dim.is_multiple_of(16)
                && h.head_dim <= MAX_HEAD
        }
        _ => output_fits(rest.last(), out),
    }
}

fn is_norm(op: &EpilogueOp<'_>) -> bool {
    matches!(op, EpilogueOp::LayerNorm { .. })
}

/// Whether `ops` on f32 rows into `out` is a row step this path runs: at most [`MAX_OPS`]
/// elementwise ops, a `LayerNorm`, and the ops [`NormTail`] takes after it (the second pass of
/// an int8 GEMM whose row does not fit one block, and the LayerNorm epilogues of f32 GEMMs).
pub(crate) fn norm_eligible(ops: &[EpilogueOp<'_>], out: &OutPtr) -> bool {
    if !REGISTER_CHAINS.load(Ordering::Relaxed) {
        return false;
    }
    let Some(p) = ops.iter().position(is_norm) else {
        return false;
    };
    p <= MAX_OPS
        && ops[..p].iter().all(elementwise)
        && NormTail::decode(&ops[p..]).is_some()
        && output_fits(ops.last(), out)
}

/// The most elementwise ops [`norm_eligible`] takes before, and [`NormTail`] after, a
/// `LayerNorm` (an encoder has two before it and none or a `ForkU8` after).
const MAX_OPS: usize = 4;

/// A `LayerNorm` and the ops after it (elementwise ones, then at most a `ForkU8`), decoded once
/// per block: the row step of a chain.
struct NormTail {
    gamma: *const f32,
    beta: *const f32,
    eps: f32,
    /// The elementwise ops after the `LayerNorm`, kind and parameters, in order.
    post: [(u32, Fixed); MAX_OPS],
    posts: usize,
    /// `ForkU8`: the factors (null for none), the requantization and the buffer with its stride.
    fork: Option<Fork>,
    /// `ForkU8Rows`: the factors, the bytes' buffer and the rows' parameters.
    rows: Option<RowsFork>,
}

#[derive(Clone, Copy)]
struct RowsFork {
    smooth: Option<*const f32>,
    out: *mut u8,
    ld: usize,
    params: RowParamsOut,
}

#[derive(Clone, Copy)]
struct Fork {
    smooth: *const f32,
    requant: (f32, f32, f32, f32),
    /// [`requant_reciprocal`] of `requant`.
    recip: f32,
    out: *mut u8,
    ld: usize,
}

impl NormTail {
    /// `ops[0]` must be the `LayerNorm`; None when the ops after it are not ones this path runs.
    fn decode(ops: &[EpilogueOp<'_>]) -> Option<NormTail> {
        let Some((&EpilogueOp::LayerNorm { gamma, beta, eps }, rest)) = ops.split_first() else {
            return None;
        };
        let mut tail = NormTail {
            gamma: gamma.as_ptr(),
            beta: beta.as_ptr(),
            eps,
            post: [(0, Fixed::NONE); MAX_OPS],
            posts: 0,
            fork: None,
            rows: None,
        };
        for (i, op) in rest.iter().enumerate() {
            if let EpilogueOp::ForkU8Rows {
                smooth,
                out,
                params,
            } = *op
            {
                if i + 1 != rest.len() {
                    return None;
                }
                tail.rows = Some(RowsFork {
                    smooth: smooth.map(|s| s.as_ptr()),
                    out: out.ptr,
                    ld: out.ld,
                    params,
                });
                continue;
            }
            if let EpilogueOp::ForkU8 {
                smooth,
                scale,
                zero_point,
                out,
            } = *op
            {
                if i + 1 != rest.len() {
                    return None;
                }
                let requant = (scale, zero_point as f32, 0.0, 255.0);
                tail.fork = Some(Fork {
                    smooth: smooth.map_or(std::ptr::null(), |s| s.as_ptr()),
                    requant,
                    recip: requant_reciprocal(requant),
                    out: out.ptr,
                    ld: out.ld,
                });
                continue;
            }
            if tail.posts == MAX_OPS {
                return None;
            }
            let mut p = Fixed::NONE;
            let kind = p.set(op)?;
            tail.post[tail.posts] = (kind, p);
            tail.posts += 1;
        }
        Some(tail)
    }
}

/// Runs the chain `ops` (see [`eligible`]) on the block `rows × cols` of accumulators at `acc`
/// (row stride `ld`, element (0, 0) of the block) into `out`; `tmp` is scratch for a row of a
/// chain with a `LayerNorm`.
///
/// # Safety
/// As [`super::epilogue::run_block`] for an i32 source: `acc` addresses `rows.len()` rows of
/// `cols.len()` readable i32; `out` the absolute elements `rows × cols`, writable and ours; the
/// program was validated for a problem containing the block (and `cols` is the whole row when
/// it has a `LayerNorm`); `eligible(ops, &out)` holds; `tmp` addresses `cols.len()` writable
/// f32 no one else touches; the CPU has AVX-512F/BW/VL.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn run(
    ops: &[EpilogueOp<'_>],
    ctx: Int8Ctx<'_>,
    acc: *const i32,
    ld: usize,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    out: OutPtr,
    tmp: *mut f32,
) {
    let (dequant, rest) = ops.split_first().expect("eligible: a Dequant first");
    let (pre, norm) = match rest.iter().position(is_norm) {
        Some(p) => (&rest[..p], NormTail::decode(&rest[p..])),
        None => (rest, None),
    };
    let (flags, fixed) = Fixed::decode(pre);
    let chain = Chain {
        dequant,
        pre,
        fixed,
        norm: norm.as_ref(),
        tmp,
    };
    macro_rules! specialised {
        ($($f:literal)*) => {
            match flags {
                // SAFETY: the caller's contract, passed on; `fixed` was decoded from `pre`.
                $($f => unsafe { run_with::<$f>(&chain, ctx, acc, ld, rows, cols, out) },)*
                // SAFETY: as above.
                _ => unsafe { run_with::<INTERPRETED>(&chain, ctx, acc, ld, rows, cols, out) },
            }
        };
    }
    specialised!(
        0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31
        32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61
        62 63
    )
}

/// A chain decoded for [`run_with`]: the `Dequant`, the elementwise ops after it (`pre`, with
/// their parameters in `fixed` when they are in canonical order), and the `LayerNorm` step
/// with its scratch row, if any.
struct Chain<'o, 'a> {
    dequant: &'o EpilogueOp<'a>,
    pre: &'o [EpilogueOp<'a>],
    fixed: Fixed,
    norm: Option<&'o NormTail>,
    tmp: *mut f32,
}

/// Op kinds of a chain in the order a specialised chain runs them (each a bit of its `F`): a
/// chain whose ops after the `Dequant` come in this order, each at most once (every chain the
/// `fuse` pipeline makes), is compiled for exactly those ops, with their parameters in
/// registers, instead of dispatching on each op for every 16 values.
const BIAS: u32 = 1;
const SCALE: u32 = 1 << 1;
const GELU: u32 = 1 << 2;
const MUL_COL: u32 = 1 << 3;
const RESIDUAL: u32 = 1 << 4;
const REQUANT: u32 = 1 << 5;
/// Any other chain: the ops are dispatched per vector, in their own order.
const INTERPRETED: u32 = 1 << 6;

/// The parameters of a chain's ops (see [`BIAS`]), as raw pointers into the op list's slices
/// (which outlive the call) and scalars.
#[derive(Clone, Copy)]
struct Fixed {
    bias: *const f32,
    scale: f32,
    mul_col: *const f32,
    /// `AddResidual`: the residual and its row stride.
    residual: (*const f32, usize),
    /// `Requant`: scale, zero point, lowest and highest value.
    requant: (f32, f32, f32, f32),
}

impl Fixed {
    const NONE: Fixed = Fixed {
        bias: std::ptr::null(),
        scale: 1.0,
        mul_col: std::ptr::null(),
        residual: (std::ptr::null(), 0),
        requant: (1.0, 0.0, 0.0, 0.0),
    };

    /// Takes `op`'s parameters and returns its kind, or None for an op that is not elementwise.
    fn set(&mut self, op: &EpilogueOp<'_>) -> Option<u32> {
        Some(match *op {
            EpilogueOp::Bias(b) => {
                self.bias = b.as_ptr();
                BIAS
            }
            EpilogueOp::Scale(s) => {
                self.scale = s;
                SCALE
            }
            EpilogueOp::GeluErf => GELU,
            EpilogueOp::MulCol(f) => {
                self.mul_col = f.as_ptr();
                MUL_COL
            }
            EpilogueOp::AddResidual { data, ld } => {
                self.residual = (data.as_ptr(), ld);
                RESIDUAL
            }
            EpilogueOp::Requant {
                scale,
                zero_point,
                ty,
            } => {
                let (lo, hi) = ty.range();
                self.requant = (scale, zero_point as f32, lo, hi);
                REQUANT
            }
            _ => return None,
        })
    }

    /// The flags of `rest` (the ops after the `Dequant`) and their parameters, or
    /// [`INTERPRETED`] when they are not in the canonical order or repeat one.
    fn decode(rest: &[EpilogueOp<'_>]) -> (u32, Fixed) {
        let mut fixed = Fixed::NONE;
        let mut flags = 0u32;
        for op in rest {
            // Canonical order: every op after the ones before it.
            match fixed.set(op) {
                Some(bit) if flags < bit => flags |= bit,
                _ => return (INTERPRETED, fixed),
            }
        }
        (flags, fixed)
    }
}

/// The op of kind `kind` with parameters `p` on the 16 values `v` at columns `c..c + 16`
/// (absolute) of row `r`, lanes outside `m` not loaded: the one definition of each op's vector
/// form, which the specialised chains inline with `kind` a constant.
///
/// # Safety
/// `p` holds the parameters of a `kind` op of a validated program whose problem contains row `r`
/// and the lanes of `m` at column `c`.
#[target_feature(enable = "avx512f")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn step(
    kind: u32,
    p: &Fixed,
    gelu: &GeluErf512,
    v: __m512,
    m: __mmask16,
    r: usize,
    c: usize,
) -> __m512 {
    // SAFETY (the loads): masked to the lanes of `m`, inside the vectors and the residual rows
    // the validated program holds (caller contract).
    unsafe {
        match kind {
            BIAS => _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, p.bias.add(c))),
            SCALE => _mm512_mul_ps(v, _mm512_set1_ps(p.scale)),
            GELU => gelu.apply(v),
            MUL_COL => _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, p.mul_col.add(c))),
            RESIDUAL => {
                let (data, ld) = p.residual;
                _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, data.add(r * ld + c)))
            }
            REQUANT => requantize(v, p.requant),
            _ => unreachable!("a chain op kind"),
        }
    }
}

/// `math::lanes16::quantize_div` with the parameters of a `Requant` or `ForkU8` (scale, zero
/// point, lowest and highest value).
#[target_feature(enable = "avx512f")]
#[inline]
fn requantize(v: __m512, (scale, zero_point, lo, hi): (f32, f32, f32, f32)) -> __m512 {
    super::math::lanes16::quantize_div(v, scale, zero_point, lo, hi)
}

/// The factor [`requantize_by_product`] takes for these parameters
/// (`math::lanes16::requant_reciprocal`).
fn requant_reciprocal((scale, zero_point, lo, hi): (f32, f32, f32, f32)) -> f32 {
    super::math::lanes16::requant_reciprocal(scale, zero_point, lo, hi)
}

/// `math::lanes16::quantize_group_i32` with the parameters of a `Requant` or `ForkU8` (scale,
/// zero point and output bounds) and their reciprocal ([`requant_reciprocal`]).
#[target_feature(enable = "avx512f")]
#[inline]
fn requantize_group<const N: usize>(
    x: [__m512; N],
    masks: [__mmask16; N],
    (scale, zero_point, lo, hi): (f32, f32, f32, f32),
    recip: f32,
    put: impl FnMut(usize, __m512i),
) {
    super::math::lanes16::quantize_group_i32(x, masks, (scale, recip), zero_point, lo, hi, put)
}

/// [`run`] for the chain kinds `F` (bits of the canonical order, or [`INTERPRETED`]).
///
/// # Safety
/// As [`run`], with `chain` decoded from its ops and `F` the kinds of `chain.pre`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
unsafe fn run_with<const F: u32>(
    chain: &Chain<'_, '_>,
    ctx: Int8Ctx<'_>,
    acc: *const i32,
    ld: usize,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    out: OutPtr,
) {
    let EpilogueOp::Dequant {
        a_scale,
        a_zero,
        w_scale,
    } = chain.dequant
    else {
        unreachable!("eligible: the chain starts with Dequant")
    };
    let (rest, fixed) = (chain.pre, chain.fixed);
    let recip = requant_reciprocal(fixed.requant);
    let gelu = GeluErf512::new();
    let (c0, w) = (cols.start, cols.len());
    // The residual comes from far (a tensor written a layer ago), the rest from the tile just
    // computed and vectors of a few KB: its rows are fetched `AHEAD` rows early, the block's
    // first ones before the first row.
    const AHEAD: usize = 4;
    let residual = rest.iter().find_map(|op| match *op {
        EpilogueOp::AddResidual { data, ld } => Some((data, ld)),
        _ => None,
    });
    let fetch = |r: usize| {
        if let Some((data, ld)) = residual {
            // One hint per 64-byte line of the row's block columns, as a plain address loop:
            // iterating the row's slice in chunks made the LayerNorm chain ~10 % slower (an
            // attention-output block of 8 rows timed alone on Zen 4: 7.9-8.0 against 7.2-7.3 ns
            // per 16 values).
            let start = (r * ld + c0).min(data.len());
            let bytes = 4 * w.min(data.len() - start);
            let first = data.as_ptr().wrapping_add(start) as *const i8;
            let mut offset = 0;
            while offset < bytes {
                // A hint (safe under this function's target features): reads nothing, and
                // never faults even where the address were outside the residual.
                _mm_prefetch::<_MM_HINT_T0>(first.wrapping_add(offset));
                offset += 64;
            }
        }
    };
    rows.clone().take(AHEAD).for_each(fetch);
    // A head's values between its absolute maximum and its quantization (`OutPtr::Heads`):
    // made once, not zeroed again for every row.
    let mut head = [_mm512_setzero_ps(); MAX_HEAD / 16];
    let first_slots = match out {
        OutPtr::Heads(h) => Some(HeadSlots::new(c0, h.hidden, h.head_dim)),
        _ => None,
    };
    for (i, r) in rows.clone().enumerate() {
        // Row `r + AHEAD`'s residual, asked for a line per vector as row `r`'s values are made
        // (`values!`) rather than all at once here: a row's burst of hints (48 lines for
        // BERT-base) filled the line-fill buffers and stalled the chain on the hints themselves.
        let ahead = residual
            .filter(|_| r + AHEAD < rows.end)
            .map(|(data, ld)| data.as_ptr().wrapping_add((r + AHEAD) * ld + c0) as *const i8);
        let zp = ctx.shift + a_zero.at(r);
        let s = a_scale.at(r);
        // The chain's values at the `N` vectors of columns `j + 16·u` (relative to the block)
        // of row `r`, lanes outside `m` 0: each op applied to all `N` before the next op, so
        // that the `N` independent dependency chains (GELU's is long) sit side by side in the
        // instruction stream and overlap; one at a time, the erf GELU chain ran at the latency
        // of its FMAs (a standalone FFN1 chain 7.1 -> 5.7 ns per vector with 4 at a time).
        //
        // SAFETY (all loads in it): masked to the block's columns below `c0 + w`; the vectors
        // indexed by absolute column hold the problem's columns and the residual its rows at
        // stride `ld` (validated); row `i` of `acc` is in the block.
        macro_rules! values {
            ($n:expr, $j:expr, $m:expr) => {{
                let (j, m): (usize, __mmask16) = ($j, $m);
                if let Some(ahead) = ahead {
                    for u in 0..$n {
                        // A hint: reads nothing, never faults.
                        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(4 * (j + 16 * u)));
                    }
                }
                let mut v = [_mm512_setzero_ps(); $n];
                for (u, v) in v.iter_mut().enumerate() {
                    let (j, c) = (j + 16 * u, c0 + j + 16 * u);
                    let a = _mm512_maskz_loadu_epi32(m, acc.add(i * ld + j));
                    *v = match ctx.folded {
                        Some(f) => {
                            let comp = _mm512_maskz_loadu_epi32(m, f.comp.as_ptr().add(c));
                            let sc = _mm512_maskz_loadu_ps(m, f.scale.as_ptr().add(c));
                            _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(a, comp)), sc)
                        }
                        None => {
                            let cs = _mm512_maskz_loadu_epi32(m, ctx.colsum.as_ptr().add(c));
                            let q =
                                _mm512_sub_epi32(a, _mm512_mullo_epi32(_mm512_set1_epi32(zp), cs));
                            let scale = if w_scale.len() == 1 {
                                _mm512_set1_ps(s * w_scale[0])
                            } else {
                                let ws = _mm512_maskz_loadu_ps(m, w_scale.as_ptr().add(c));
                                _mm512_mul_ps(_mm512_set1_ps(s), ws)
                            };
                            _mm512_mul_ps(_mm512_cvtepi32_ps(q), scale)
                        }
                    };
                }
                // A macro, not a closure: a closure holding `v` kept it on the stack.
                macro_rules! each {
                    ($kind:expr, $p:expr) => {
                        for (u, v) in v.iter_mut().enumerate() {
                            *v = step($kind, $p, &gelu, *v, m, r, c0 + j + 16 * u);
                        }
                    };
                }
                if F == INTERPRETED {
                    for op in rest {
                        let mut p = Fixed::NONE;
                        let kind = p.set(op).expect("eligible: elementwise ops only");
                        each!(kind, &p);
                    }
                } else {
                    // One `if` per kind rather than a loop over the kinds: the loop was not
                    // unrolled into constants (the FFN1 chain's share 7.9 -> 9.5 % of a run).
                    if F & BIAS != 0 {
                        each!(BIAS, &fixed);
                    }
                    if F & SCALE != 0 {
                        each!(SCALE, &fixed);
                    }
                    if F & GELU != 0 {
                        each!(GELU, &fixed);
                    }
                    if F & MUL_COL != 0 {
                        each!(MUL_COL, &fixed);
                    }
                    if F & RESIDUAL != 0 {
                        each!(RESIDUAL, &fixed);
                    }
                    // `REQUANT` is applied by `put!` as the bytes are stored.
                }
                v
            }};
        }
        if let Some(norm) = chain.norm {
            // The row (whole: a `LayerNorm` block spans it) up to the `LayerNorm` into the
            // scratch row, summed on the way in the lanes of `math::wide_sum` (the four
            // vectors made at once are its four accumulators), then the row step from there.
            //
            // SAFETY: `tmp` holds `w` values (caller contract); row `r` of `out` is ours.
            unsafe {
                let mut sum = [_mm512_setzero_ps(); AT_ONCE];
                let mut j = 0;
                while w - j >= 16 * AT_ONCE {
                    let v = values!(AT_ONCE, j, 0xffff);
                    for (u, v) in v.into_iter().enumerate() {
                        _mm512_storeu_ps(chain.tmp.add(j + 16 * u), v);
                        sum[u] = _mm512_add_ps(sum[u], v);
                    }
                    j += 16 * AT_ONCE;
                }
                for sum in sum.iter_mut() {
                    if j < w {
                        let m = lanes_below(w - j);
                        let v = values!(1, j, m)[0];
                        _mm512_mask_storeu_ps(chain.tmp.add(j), m, v);
                        *sum = _mm512_mask_add_ps(*sum, m, *sum, v);
                        j += 16;
                    }
                }
                norm_row(norm, &gelu, chain.tmp, w, Some(fold_wide(sum)), r, c0, out);
            }
            continue;
        }
        if let OutPtr::Heads(h) = out {
            // Row `r`, whole heads (`eligible` and the drivers) of a QKV product, each where
            // `head_slot` says: each head of q and k as `math::quantize_sym` makes it (the same
            // lanes for the absolute maximum, the same fold, product, rounding and clamp; q
            // shifted by 128) with its scale, v as f32. Written out here rather than in a
            // function taking `values!` as a closure: a closure capturing the row's state by
            // reference kept it on the stack for the other outputs' loop too (the FFN1 chain
            // ran 2x slower).
            let dh = h.head_dim;
            // The head's vectors, a constant for the usual widths so that they stay in
            // registers (a runtime count kept them on the stack).
            macro_rules! head_row {
                ($vectors:expr, $hc:expr, $slot:expr) => {{
                    let (vectors, hc): (usize, usize) = ($vectors, $hc);
                    let (byte_col, scale, offset) = match $slot {
                        HeadSlot::Values { col } => {
                            for t in 0..vectors {
                                // SAFETY: row r of v, this head's columns (caller contract).
                                unsafe {
                                    _mm512_storeu_ps(
                                        h.v.add(r * h.ld_v + col + 16 * t),
                                        values!(1, hc + 16 * t, 0xffff)[0],
                                    )
                                };
                            }
                            continue;
                        }
                        HeadSlot::Quantized {
                            byte_col,
                            scale,
                            offset,
                        } => (byte_col, scale, offset),
                    };
                    // `math::abs_max`: lane l keeps the largest |x| of the elements l mod 16, a
                    // NaN never replacing what it holds (`if b > a { b } else { a }` is
                    // `vmaxps b, a`).
                    let mut amax = _mm512_setzero_ps();
                    for (t, v) in head.iter_mut().enumerate().take(vectors) {
                        *v = values!(1, hc + 16 * t, 0xffff)[0];
                        amax = _mm512_max_ps(_mm512_abs_ps(*v), amax);
                    }
                    let amax = super::math::lanes16::fold_max(amax);
                    let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
                    // SAFETY: row r of the bytes, this head's `16 · vectors` columns from
                    // `byte_col` (caller contract).
                    unsafe {
                        quantize_head(
                            &head[..vectors],
                            inv,
                            offset,
                            h.bytes.add(r * h.ld_bytes + byte_col),
                        )
                    };
                    // SAFETY: row r's scale of this head (caller contract).
                    unsafe { *h.scales.add(r * h.ld_scales + scale) = amax / 127.0 };
                }};
            }
            // The heads of the block in order, from the slot of its first head: no division
            // per head (three integer divisions a head were a visible share of the chain), nor
            // per row (the block's first slot is made once).
            let mut slots = first_slots.expect("made for a heads output");
            // A `while` rather than `step_by`, whose trip count cost an integer division per
            // row.
            let mut hc = 0;
            while hc < w {
                let slot = slots.next_slot();
                hc += dh;
                let hc = hc - dh;
                match dh / 16 {
                    2 => head_row!(2, hc, slot),
                    4 => head_row!(4, hc, slot),
                    8 => head_row!(8, hc, slot),
                    vectors => head_row!(vectors, hc, slot),
                }
            }
            continue;
        }
        let mut j = 0;
        // The lanes `m` of `v` into row `r` at column `c`: a specialised chain ending in
        // `Requant` requantizes them here, straight to integers.
        //
        // SAFETY (its callers): masked to the block's columns of row `r` of `out`, ours.
        macro_rules! put {
            ($c:expr, $m:expr, $v:expr) => {
                if F != INTERPRETED && F & REQUANT != 0 {
                    let (scale, zero_point, lo, hi) = fixed.requant;
                    let q = super::math::lanes16::quantize_mul_or_div_i32(
                        $v,
                        (scale, recip),
                        zero_point,
                        lo,
                        hi,
                    );
                    unsafe { store_bytes(out, r, $c, $m, q) }
                } else {
                    unsafe { store(out, r, $c, $m, $v) }
                }
            };
        }
        // Whole runs of `$n` vectors from column `j` on, while the block has them; requantized
        // as a group (`requantize_group`).
        macro_rules! store_runs {
            ($n:expr) => {
                while w - j >= 16 * $n {
                    let v = values!($n, j, 0xffff);
                    if F != INTERPRETED && F & REQUANT != 0 {
                        // SAFETY: as `put!`'s stores, vector `u` of the run in row `r`.
                        requantize_group(v, [0xffff; $n], fixed.requant, recip, |u, q| unsafe {
                            store_bytes(out, r, c0 + j + 16 * u, 0xffff, q)
                        });
                    } else {
                        for (u, v) in v.into_iter().enumerate() {
                            put!(c0 + j + 16 * u, 0xffff, v);
                        }
                    }
                    j += 16 * $n;
                }
            };
        }
        store_runs!(OUT_AT_ONCE);
        store_runs!(AT_ONCE);
        while j < w {
            let m = lanes_below(w - j);
            put!(c0 + j, m, values!(1, j, m)[0]);
            j += 16;
        }
    }
}

/// The slots of consecutive heads from column `c0` (see [`super::epilogue::head_slot`]): the first one's by
/// division, each next one by counting (three integer divisions a head were a visible share of
/// the QKV chain).
#[derive(Clone, Copy)]
struct HeadSlots {
    head: usize,
    part: usize,
    hidden: usize,
    head_dim: usize,
    /// Heads per projection: the scale column of k's head 0.
    heads: usize,
}

impl HeadSlots {
    fn new(c0: usize, hidden: usize, head_dim: usize) -> Self {
        Self {
            head: c0 / (3 * head_dim),
            part: c0 / head_dim % 3,
            hidden,
            head_dim,
            heads: hidden / head_dim,
        }
    }

    /// The slot of the next head: `head_slot` of its first column.
    fn next_slot(&mut self) -> HeadSlot {
        let (head, part) = (self.head, self.part);
        self.part += 1;
        if self.part == 3 {
            self.part = 0;
            self.head += 1;
        }
        let col = head * self.head_dim;
        match part {
            0 => HeadSlot::Quantized {
                byte_col: col,
                scale: head,
                offset: 128,
            },
            1 => HeadSlot::Quantized {
                byte_col: self.hidden + col,
                scale: self.heads + head,
                offset: 0,
            },
            _ => HeadSlot::Values { col },
        }
    }
}

/// The bytes of one head of q or k (`offset` 128 or 0) from its values `head` and `inv`
/// (`127 / amax`, or 0 for an all-zero head), as `math::quantize_sym` makes them: the product
/// rounded to the nearest integer, ties to even, NaN as 0, clamped to ±127, plus `offset`.
///
/// When `inv` is finite the clamp is a no-op: every |x| ≤ amax, so |x · inv| ≤ 127·(1 + 2⁻²⁴)²
/// before rounding, which rounds to 127 at most; the product goes straight to a rounding
/// conversion (with NaN lanes zeroed). A subnormal `amax` makes `inv` infinite and takes the
/// clamped path.
///
/// # Safety
/// `bytes` addresses `16 · head.len()` writable bytes.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn quantize_head(head: &[__m512], inv: f32, offset: u8, bytes: *mut u8) {
    let (inv_v, offset) = (_mm512_set1_ps(inv), _mm512_set1_epi32(i32::from(offset)));
    for (t, v) in head.iter().enumerate() {
        let x = _mm512_mul_ps(*v, inv_v);
        let q = if inv.is_finite() {
            _mm512_maskz_cvt_roundps_epi32::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm512_cmp_ps_mask::<_CMP_ORD_Q>(x, x),
                x,
            )
        } else {
            let q = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
            let q = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask::<_CMP_ORD_Q>(q, q), q);
            let q = _mm512_min_ps(
                _mm512_set1_ps(127.0),
                _mm512_max_ps(_mm512_set1_ps(-127.0), q),
            );
            _mm512_cvtps_epi32(q)
        };
        // SAFETY: 16 of the head's bytes (caller contract).
        unsafe {
            _mm_storeu_si128(
                bytes.add(16 * t) as *mut __m128i,
                _mm512_cvtepi32_epi8(_mm512_add_epi32(q, offset)),
            )
        };
    }
}

/// How many vectors a chain carries at once: each op applied to all of them before the next,
/// so that their independent dependency chains (GELU's is long) overlap.
const AT_ONCE: usize = 4;
/// How many vectors a chain with no row-wide step (nor heads) carries at once where the columns
/// allow: with four, the FFN1 chain (GELU) still waited on its dependency chains. Zen 5,
/// `--epilogues` FFN1 with its epilogue, 1 thread, four alternating pairs: 6.54 → 6.29 ms (mean);
/// a batch-8 BERT-base INT8 run 0.8-1.1 % faster (p50, alternating runs in one process). The
/// LayerNorm chains keep four: their sums' lanes are [`AT_ONCE`] vectors.
const OUT_AT_ONCE: usize = 8;
// The LayerNorm chains sum the row in the vectors they make at once: `math::wide_sum`'s lanes.
const _: () = assert!(16 * AT_ONCE == super::math::WIDE_LANES);

/// The mask of the lanes below `n` (all 16 from 16 on).
#[inline]
fn lanes_below(n: usize) -> __mmask16 {
    if n >= 16 {
        0xffff
    } else {
        (1u16 << n) - 1
    }
}

/// The lanes `m` of `v` into row `r`, columns `c..c + 16` (absolute) of `out`: f32 as they
/// are; for byte outputs, the integral values a final `Requant` leaves, as their low byte
/// (`int_byte`).
///
/// # Safety
/// The masked elements of row `r` of `out` are writable and ours.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
unsafe fn store(out: OutPtr, r: usize, c: usize, m: __mmask16, v: __m512) {
    // SAFETY: the caller's contract.
    unsafe {
        match out {
            OutPtr::F32(p, ldc) => _mm512_mask_storeu_ps(p.add(r * ldc + c), m, v),
            OutPtr::U8(..) | OutPtr::S8(..) => store_bytes(out, r, c, m, _mm512_cvtps_epi32(v)),
            _ => unreachable!("eligible: f32, byte or heads outputs only"),
        }
    }
}

/// The lanes `m` of the integers `q` into row `r`, columns `c..c + 16` (absolute) of a byte
/// output, as their low bytes.
///
/// # Safety
/// The masked elements of row `r` of `out` are writable and ours; `out` is a byte output.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
unsafe fn store_bytes(out: OutPtr, r: usize, c: usize, m: __mmask16, q: __m512i) {
    // SAFETY: the caller's contract.
    unsafe {
        match out {
            OutPtr::U8(p, ldc) => {
                _mm512_mask_cvtepi32_storeu_epi8(p.add(r * ldc + c) as *mut i8, m, q)
            }
            OutPtr::S8(p, ldc) => _mm512_mask_cvtepi32_storeu_epi8(p.add(r * ldc + c), m, q),
            _ => unreachable!("eligible: a chain ending in Requant has a byte output"),
        }
    }
}

/// The row step: `LayerNorm` of the `w` values at `y` (row `r`, columns `c0..c0 + w` absolute,
/// `c0` = 0: the whole row), the ops after it, the `ForkU8` copy, into `out`. The multi-pass
/// path's bits: the mean and the variance summed as `math::wide_sum` and `math::wide_sum_sq`
/// do (element `i` into lane `i mod 64`, four vectors of 16 added pairwise, the lanes folded by
/// `fold_lanes`), the same divisions, the same `(d · inv) · gamma + beta` with one rounding
/// in the fused multiply-add. `sum`, when the caller took it on the way, is the row's sum in
/// that order (else it is summed here).
///
/// # Safety
/// `y` addresses `w` readable f32 (they may be the output row itself: each vector is read
/// before it is written); the tail was decoded from a validated program for a problem holding
/// row `r`, whose elements of `out` and of the fork buffer are ours.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn norm_row(
    t: &NormTail,
    gelu: &GeluErf512,
    y: *const f32,
    w: usize,
    sum: Option<f32>,
    r: usize,
    c0: usize,
    out: OutPtr,
) {
    debug_assert_eq!(c0, 0, "a LayerNorm block spans the row");
    // SAFETY (every load and store): inside the `w` values at `y`, the problem's `w` columns of
    // gamma, beta and the ops' vectors, and row `r` of the outputs (caller contract), the
    // last vector masked to the lanes below `w`.
    unsafe {
        let sum = sum.unwrap_or_else(|| {
            wide_pass(w, |j, m, acc| {
                _mm512_mask_add_ps(acc, m, acc, _mm512_maskz_loadu_ps(m, y.add(j)))
            })
        });
        let mean = _mm512_set1_ps(sum / w as f32);
        let sq = wide_pass(w, |j, m, acc| {
            let d = _mm512_sub_ps(_mm512_maskz_loadu_ps(m, y.add(j)), mean);
            _mm512_mask3_fmadd_ps(d, d, acc, m)
        });
        let var = sq / w as f32;
        let inv = _mm512_set1_ps(1.0 / (var + t.eps).sqrt());
        let mut j = 0;
        while w - j >= 16 * AT_ONCE {
            norm_out::<AT_ONCE>(t, gelu, y, j, [0xffff; AT_ONCE], (mean, inv), r, c0, out);
            j += 16 * AT_ONCE;
        }
        while j < w {
            norm_out::<1>(t, gelu, y, j, [lanes_below(w - j)], (mean, inv), r, c0, out);
            j += 16;
        }
        if let (Some(f), OutPtr::F32(o, ldc)) = (t.rows, out) {
            // The row just stored (in L1), quantized by its own range as the standalone
            // quantizer would have read it back from memory. Row r's `w` values of the f32
            // output, of the copy and its parameters are ours (caller contract; the program was
            // validated with `m` parameters and a copy of the output's shape).
            let row = std::slice::from_raw_parts(o.add(r * ldc), w);
            let smooth = f.smooth.map(|s| std::slice::from_raw_parts(s, w));
            let bytes = std::slice::from_raw_parts_mut(f.out.add(r * f.ld), w);
            let (scale, zero) = super::rowquant::quantize_row(row, smooth, bytes);
            *f.params.scales.add(r) = scale;
            *f.params.zeros.add(r) = zero;
        }
    }
}

/// The last pass of [`norm_row`] over the `N` vectors at columns `j..j + 16·N` (relative) with
/// lanes `masks`: `(y − mean) · inv · gamma + beta`, the ops after the LayerNorm, the fork's
/// copy, the store; `N` a constant so that the vectors stay in registers.
///
/// # Safety
/// As [`norm_row`], for these columns.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn norm_out<const N: usize>(
    t: &NormTail,
    gelu: &GeluErf512,
    y: *const f32,
    j: usize,
    masks: [__mmask16; N],
    (mean, inv): (__m512, __m512),
    r: usize,
    c0: usize,
    out: OutPtr,
) {
    // SAFETY (every load and store): masked to the lanes of `masks` inside the row (caller
    // contract).
    unsafe {
        let mut v = [_mm512_setzero_ps(); N];
        for (u, v) in v.iter_mut().enumerate() {
            let (c, m) = (c0 + j + 16 * u, masks[u]);
            let d = _mm512_sub_ps(_mm512_maskz_loadu_ps(m, y.add(j + 16 * u)), mean);
            *v = _mm512_fmadd_ps(
                _mm512_mul_ps(d, inv),
                _mm512_maskz_loadu_ps(m, t.gamma.add(c)),
                _mm512_maskz_loadu_ps(m, t.beta.add(c)),
            );
        }
        for (kind, p) in &t.post[..t.posts] {
            for (u, v) in v.iter_mut().enumerate() {
                *v = step(*kind, p, gelu, *v, masks[u], r, c0 + j + 16 * u);
            }
        }
        if let Some(f) = t.fork {
            let mut x = v;
            if !f.smooth.is_null() {
                for (u, x) in x.iter_mut().enumerate() {
                    let (c, m) = (c0 + j + 16 * u, masks[u]);
                    *x = _mm512_mul_ps(*x, _mm512_maskz_loadu_ps(m, f.smooth.add(c)));
                }
            }
            requantize_group(x, masks, f.requant, f.recip, |u, q| {
                let c = c0 + j + 16 * u;
                _mm512_mask_cvtepi32_storeu_epi8(f.out.add(r * f.ld + c) as *mut i8, masks[u], q)
            });
        }
        for (u, v) in v.into_iter().enumerate() {
            store(out, r, c0 + j + 16 * u, masks[u], v);
        }
    }
}

/// The reduction of a row of `w` values in the lanes and order of `math::wide_sum`: `add(j,
/// m, acc)` adds the values at columns `j..j + 16` (lanes of `m`) into the accumulator of
/// their lanes mod 64, four accumulators so that four additions are in flight.
#[target_feature(enable = "avx512f")]
#[inline]
fn wide_pass(w: usize, mut add: impl FnMut(usize, __mmask16, __m512) -> __m512) -> f32 {
    let mut acc = [_mm512_setzero_ps(); 4];
    let mut j = 0;
    while w - j >= 64 {
        for (u, a) in acc.iter_mut().enumerate() {
            *a = add(j + 16 * u, 0xffff, *a);
        }
        j += 64;
    }
    for a in acc.iter_mut() {
        if j < w {
            *a = add(j, lanes_below(w - j), *a);
            j += 16;
        }
    }
    fold_wide(acc)
}

/// `math::wide_sum`'s fold of its four accumulators: `(a0 + a1) + (a2 + a3)` lane by lane, then
/// the lanes by [`super::math::lanes16::fold_sum`].
#[target_feature(enable = "avx512f")]
#[inline]
fn fold_wide([a0, a1, a2, a3]: [__m512; 4]) -> f32 {
    super::math::lanes16::fold_sum(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)))
}

/// The row step of a program on f32 rows (see [`norm_eligible`]): its elementwise ops before the
/// `LayerNorm` into the scratch row `tmp` (or none), then [`norm_row`].
///
/// # Safety
/// As [`super::epilogue::run_block`] for an f32 source: `y` addresses `rows.len()` rows of
/// `cols.len()` readable f32 at stride `ld` (possibly the output rows themselves); `cols` is the
/// whole row; `out` the absolute elements `rows × cols`, writable and ours; the program was
/// validated for a problem containing the block; `norm_eligible(ops, &out)` holds; `tmp`
/// addresses `cols.len()` writable f32 no one else touches; the CPU has AVX-512F/BW/VL.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
pub(crate) unsafe fn run_norm_f32(
    ops: &[EpilogueOp<'_>],
    y: *mut f32,
    ld: usize,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    out: OutPtr,
    tmp: *mut f32,
) {
    let p = ops.iter().position(is_norm).expect("norm_eligible");
    let norm = NormTail::decode(&ops[p..]).expect("norm_eligible");
    let mut pre = [(0, Fixed::NONE); MAX_OPS];
    for (slot, op) in pre.iter_mut().zip(&ops[..p]) {
        slot.0 = slot
            .1
            .set(op)
            .expect("norm_eligible: elementwise ops first");
    }
    let pre = &pre[..p];
    let gelu = GeluErf512::new();
    let (c0, w) = (cols.start, cols.len());
    for (i, r) in rows.enumerate() {
        // SAFETY: row `i` of the source holds `w` values, `tmp` `w` more (caller contract);
        // the loads of the last vector are masked to the lanes below `w`.
        unsafe {
            let row = y.add(i * ld);
            let src = if pre.is_empty() {
                row
            } else {
                let mut j = 0;
                while j < w {
                    let m = lanes_below(w - j);
                    let mut v = _mm512_maskz_loadu_ps(m, row.add(j));
                    for (kind, p) in pre {
                        v = step(*kind, p, &gelu, v, m, r, c0 + j);
                    }
                    _mm512_mask_storeu_ps(tmp.add(j), m, v);
                    j += 16;
                }
                tmp
            };
            norm_row(&norm, &gelu, src, w, None, r, c0, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{__m512, _mm512_loadu_ps, quantize_head, HeadSlots};
    use crate::kernels::epilogue::head_slot;
    use crate::kernels::math::{abs_max, quantize_sym};

    /// The vector requantizations (clamped before they round; as floats and as integers) give
    /// `math::quantize_div`'s values: ties, the clamp bounds and just past them, NaN, infinities, signed zeros, huge
    /// values, for u8 and s8 ranges and zero points at and between their ends.
    #[test]
    fn requantize_equals_quantize_div() {
        if !crate::kernels::cpu_features().avx512 {
            eprintln!("SKIP requantize_equals_quantize_div: no AVX-512 on this CPU");
            return;
        }
        let mut xs = vec![
            f32::NAN,
            -f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            1e30,
            -1e30,
            f32::MAX,
            f32::MIN_POSITIVE,
        ];
        for k in -300..=300 {
            let k = k as f32;
            xs.extend([k, k + 0.5, k - 0.5, k + 0.499_999_97, k + 0.500_000_1]);
        }
        for (lo, hi, zps) in [
            (0.0f32, 255.0f32, [0.0, 3.0, 128.0, 255.0]),
            (-128.0, 127.0, [-128.0, -5.0, 0.0, 127.0]),
        ] {
            for zp in zps {
                for scale in [1.0f32, 0.37, 2.5e-3] {
                    let want: Vec<f32> = xs
                        .iter()
                        .map(|&x| crate::kernels::math::quantize_div(x * scale, scale, zp, lo, hi))
                        .collect();
                    for (chunk, want) in xs.chunks(16).zip(want.chunks(16)) {
                        let mut lanes = [0f32; 16];
                        lanes[..chunk.len()].copy_from_slice(chunk);
                        let lanes = lanes.map(|x| x * scale);
                        let mut got = [0f32; 16];
                        let mut got_int = [0i32; 16];
                        // SAFETY: the CPU has AVX-512F (checked); 16-lane arrays.
                        unsafe {
                            let x = _mm512_loadu_ps(lanes.as_ptr());
                            let v = super::requantize(x, (scale, zp, lo, hi));
                            super::_mm512_storeu_ps(got.as_mut_ptr(), v);
                            let q = crate::kernels::math::lanes16::quantize_div_i32(
                                x, scale, zp, lo, hi,
                            );
                            super::_mm512_storeu_si512(got_int.as_mut_ptr().cast(), q);
                        }
                        for (i, w) in want.iter().enumerate() {
                            let what = format!(
                                "{} / {scale} with zero point {zp} in [{lo}, {hi}]",
                                lanes[i]
                            );
                            assert_eq!(got[i].to_bits(), w.to_bits(), "{what}");
                            assert_eq!(got_int[i], *w as i32, "{what}, as an integer");
                        }
                    }
                }
            }
        }
    }

    /// Counting gives the slot `head_slot` divides out, for every head of several layouts,
    /// from any head a block may start at.
    #[test]
    fn head_slots_count_as_head_slot_divides() {
        for (hidden, dh) in [(32, 8), (384, 32), (768, 64), (1024, 128), (96, 48)] {
            let n = 3 * hidden;
            for first in (0..n).step_by(dh) {
                let mut slots = HeadSlots::new(first, hidden, dh);
                for c in (first..n).step_by(dh) {
                    assert_eq!(
                        slots.next_slot(),
                        head_slot(c, hidden, dh),
                        "h={hidden} dh={dh} from {first}, column {c}"
                    );
                }
            }
        }
    }

    /// The unclamped conversion gives `quantize_sym`'s bytes wherever it is taken, and the
    /// clamped one where it is not: heads at the extremes of f32 (a subnormal maximum, whose
    /// `127 / amax` is infinite), with NaN and infinities, all zero, negative zero, ties.
    #[test]
    fn quantize_head_equals_quantize_sym() {
        if !crate::kernels::cpu_features().avx512 {
            eprintln!("SKIP quantize_head_equals_quantize_sym: no AVX-512 on this CPU");
            return;
        }
        let mut next = crate::kernels::math::lanes16::tests::xorshift(0x9e37_79b9_7f4a_7c15u64);
        let mut heads: Vec<Vec<f32>> = Vec::new();
        for scale in [1.0f32, 1e-3, 3e38, 1e-38, 1e-44, 0.0] {
            for _ in 0..20 {
                heads.push(
                    (0..64)
                        .map(|_| ((next() % 2001) as f32 - 1000.0) / 1000.0 * scale)
                        .collect(),
                );
            }
        }
        // Ties after the product: 127 / 127 = 1, so x·inv = x, halves included.
        heads.push((0..64).map(|i| i as f32 / 2.0 - 16.0 + 0.5).collect());
        let mut special = heads[0].clone();
        special[3] = f32::NAN;
        special[17] = f32::INFINITY;
        special[40] = -0.0;
        heads.push(special);
        let mut only_nan = vec![0.0f32; 64];
        only_nan[5] = f32::NAN;
        heads.push(only_nan);
        heads.push(vec![-0.0; 64]);
        for (index, head) in heads.iter().enumerate() {
            for offset in [0u8, 128] {
                let mut want = vec![0u8; 64];
                quantize_sym(head, &mut want, offset);
                let amax = abs_max(head);
                let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
                // SAFETY: AVX-512F was checked; 64 floats make four vectors.
                let vectors: Vec<__m512> = head
                    .chunks_exact(16)
                    .map(|c| unsafe { _mm512_loadu_ps(c.as_ptr()) })
                    .collect();
                let mut got = vec![0u8; 64];
                // SAFETY: AVX-512F; `got` holds the 64 bytes of four vectors.
                unsafe { quantize_head(&vectors, inv, offset, got.as_mut_ptr()) };
                assert_eq!(
                    got, want,
                    "head {index} (amax {amax:e}, inv {inv:e}) offset {offset}"
                );
            }
        }
    }
}

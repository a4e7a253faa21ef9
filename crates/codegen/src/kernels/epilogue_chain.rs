//! Elementwise int8 epilogues in registers (AVX-512): a `Dequant` followed only by column-wise
//! and element-wise ops (bias, scale, per-column factors, erf GELU, residual add, requantize)
//! runs as one pass per 16 columns, from the i32 accumulators straight to the output, instead of
//! one pass over a scratch row per op. The same operations in the same order as the multi-pass
//! path (separate multiplies and adds, IEEE division, the same GELU pieces), so the same bits;
//! `set_register_chains(false)` turns it off so tests can compare the two.
//!
//! On BERT-base the chains are the FFN up-projection (`bias, gelu_erf, mul_col, requant_u8`,
//! the widest GEMM) and the dynamic-activation paths; the ones ending in LayerNorm, a u8 fork or
//! quantized heads still take the multi-pass path.

use std::arch::x86_64::*;
use std::sync::atomic::{AtomicBool, Ordering};

use super::epilogue::{EpilogueOp, Int8Ctx, OutPtr};
use super::math::GeluErf512;

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

/// Whether `ops` on an i32 source into `out` is a chain this path runs.
pub(crate) fn eligible(ops: &[EpilogueOp<'_>], out: &OutPtr) -> bool {
    if !REGISTER_CHAINS.load(Ordering::Relaxed) {
        return false;
    }
    let Some((EpilogueOp::Dequant { .. }, rest)) = ops.split_first() else {
        return false;
    };
    let elementwise = rest.iter().all(|op| {
        matches!(
            op,
            EpilogueOp::Bias(_)
                | EpilogueOp::Scale(_)
                | EpilogueOp::MulCol(_)
                | EpilogueOp::GeluErf
                | EpilogueOp::AddResidual { .. }
                | EpilogueOp::Requant { .. }
        )
    });
    let ends_requant = matches!(rest.last(), Some(EpilogueOp::Requant { .. }));
    elementwise
        && match out {
            OutPtr::F32(..) => true,
            // Bytes hold integral values only, which a final requantization leaves.
            OutPtr::U8(..) | OutPtr::S8(..) => ends_requant,
            _ => false,
        }
}

/// Runs the chain `ops` (see [`eligible`]) on the block `rows × cols` of accumulators at `acc`
/// (row stride `ld`, element (0, 0) of the block) into `out`.
///
/// # Safety
/// As [`super::epilogue::run_block`] for an i32 source: `acc` addresses `rows.len()` rows of
/// `cols.len()` readable i32; `out` the absolute elements `rows × cols`, writable and ours; the
/// program was validated for a problem containing the block; `eligible(ops, &out)` holds; the
/// CPU has AVX-512F/BW/VL.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
pub(crate) unsafe fn run(
    ops: &[EpilogueOp<'_>],
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
    } = &ops[0]
    else {
        unreachable!("eligible: the chain starts with Dequant")
    };
    let rest = &ops[1..];
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
            let row = &data[(r * ld + c0).min(data.len())..];
            for line in row[..w.min(row.len())].chunks(16) {
                // A hint (safe under this function's target features): reads nothing.
                _mm_prefetch::<_MM_HINT_T0>(line.as_ptr() as *const i8);
            }
        }
    };
    rows.clone().take(AHEAD).for_each(fetch);
    for (i, r) in rows.clone().enumerate() {
        if r + AHEAD < rows.end {
            fetch(r + AHEAD);
        }
        let zp = ctx.shift + a_zero.at(r);
        let s = a_scale.at(r);
        let mut j = 0;
        while j < w {
            let m: __mmask16 = if w - j >= 16 {
                0xffff
            } else {
                (1u16 << (w - j)) - 1
            };
            let c = c0 + j;
            // SAFETY (all loads and stores below): masked to the block's columns `c..c + 16`
            // that lie below `c0 + w`; the vectors indexed by absolute column hold the problem's
            // columns and the residual its rows at stride `ld` (validated); row `i` of `acc`
            // and row `r` of `out` are in the block, which is ours.
            unsafe {
                let a = _mm512_maskz_loadu_epi32(m, acc.add(i * ld + j));
                let mut v = match ctx.folded {
                    Some(f) => {
                        let comp = _mm512_maskz_loadu_epi32(m, f.comp.as_ptr().add(c));
                        let sc = _mm512_maskz_loadu_ps(m, f.scale.as_ptr().add(c));
                        _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(a, comp)), sc)
                    }
                    None => {
                        let cs = _mm512_maskz_loadu_epi32(m, ctx.colsum.as_ptr().add(c));
                        let q = _mm512_sub_epi32(a, _mm512_mullo_epi32(_mm512_set1_epi32(zp), cs));
                        let scale = if w_scale.len() == 1 {
                            _mm512_set1_ps(s * w_scale[0])
                        } else {
                            let ws = _mm512_maskz_loadu_ps(m, w_scale.as_ptr().add(c));
                            _mm512_mul_ps(_mm512_set1_ps(s), ws)
                        };
                        _mm512_mul_ps(_mm512_cvtepi32_ps(q), scale)
                    }
                };
                for op in rest {
                    v = match *op {
                        EpilogueOp::Bias(b) | EpilogueOp::MulCol(b) => {
                            let x = _mm512_maskz_loadu_ps(m, b.as_ptr().add(c));
                            if matches!(op, EpilogueOp::Bias(_)) {
                                _mm512_add_ps(v, x)
                            } else {
                                _mm512_mul_ps(v, x)
                            }
                        }
                        EpilogueOp::Scale(f) => _mm512_mul_ps(v, _mm512_set1_ps(f)),
                        EpilogueOp::GeluErf => gelu.apply(v),
                        EpilogueOp::AddResidual { data, ld } => {
                            let x = _mm512_maskz_loadu_ps(m, data.as_ptr().add(r * ld + c));
                            _mm512_add_ps(v, x)
                        }
                        EpilogueOp::Requant {
                            scale,
                            zero_point,
                            ty,
                        } => {
                            // `math::quantize_div`: IEEE division, ties to even, NaN as 0,
                            // then `clamp` (which keeps the value itself at equality).
                            let (lo, hi) = ty.range();
                            let q = _mm512_roundscale_ps::<
                                { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
                            >(_mm512_div_ps(
                                v,
                                _mm512_set1_ps(scale),
                            ));
                            let q = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask::<_CMP_ORD_Q>(q, q), q);
                            let q = _mm512_add_ps(q, _mm512_set1_ps(zero_point as f32));
                            _mm512_min_ps(_mm512_set1_ps(hi), _mm512_max_ps(_mm512_set1_ps(lo), q))
                        }
                        _ => unreachable!("eligible: elementwise ops only"),
                    };
                }
                match out {
                    OutPtr::F32(p, ldc) => _mm512_mask_storeu_ps(p.add(r * ldc + c), m, v),
                    // Integral values (the chain ends in Requant): their low byte, as `int_byte`.
                    OutPtr::U8(p, ldc) => {
                        _mm512_mask_cvtepi32_storeu_epi8(
                            p.add(r * ldc + c) as *mut i8,
                            m,
                            _mm512_cvtps_epi32(v),
                        );
                    }
                    OutPtr::S8(p, ldc) => _mm512_mask_cvtepi32_storeu_epi8(
                        p.add(r * ldc + c),
                        m,
                        _mm512_cvtps_epi32(v),
                    ),
                    _ => unreachable!("eligible: f32 or byte outputs only"),
                }
            }
            j += 16;
        }
    }
}

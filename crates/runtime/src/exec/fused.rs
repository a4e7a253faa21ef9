//! The fused linears the `fuse` pipeline makes: `fused_linear` (f32 GEMM) and `qlinear` (u8×s8
//! GEMM), each with its epilogue program run by the kernel on every output tile, and `qmatmul`.

use codegen::kernels::{
    Activations, Epilogue, EpilogueOp, EpilogueOps, ForkOut, HeadsOut, Output, QType, RowParam,
};
use ir::{ActQuant, EpilogueStep, GeluApprox};

use super::nn::{f32_of, linear_rows};
use super::{Arena, Ctx, Input, Outs, SharedPtr};
use crate::gemm::{gemm_packed_program, PackedWeight, PackedWeightI8};
use crate::value::TensorValue;
use crate::Error;

/// The kernel epilogue program of `steps`, reading their operands from `operands` in order;
/// a final `fork_u8` writes its copy to `fork`.
#[allow(clippy::too_many_arguments)]
fn program<'a>(
    steps: &[EpilogueStep],
    operands: &'a [Input<'_>],
    n: usize,
    out_shape: &[usize],
    node: &str,
    op: &'static str,
    ops: &mut EpilogueOps<'a>,
    fork: Option<ForkOut>,
) -> Result<(), Error> {
    let mut at = 0;
    let vector = |i: usize, what: &str| -> Result<&'a [f32], Error> {
        let v = f32_of(operands[i].get(), node, op)?;
        if v.len() != n {
            return Err(Error::op(
                node,
                op,
                format!("epilogue {what} has {} values, expected {n}", v.len()),
            ));
        }
        Ok(v)
    };
    for step in steps {
        match step {
            EpilogueStep::Bias => ops.push(EpilogueOp::Bias(vector(at, "bias")?)),
            EpilogueStep::MulCol => ops.push(EpilogueOp::MulCol(vector(at, "mul_col")?)),
            EpilogueStep::Gelu(GeluApprox::Erf) => ops.push(EpilogueOp::GeluErf),
            EpilogueStep::Gelu(GeluApprox::Tanh) => ops.push(EpilogueOp::GeluTanh),
            EpilogueStep::Residual => {
                let r = operands[at].get();
                if r.shape() != out_shape {
                    return Err(Error::op(
                        node,
                        op,
                        format!(
                            "residual {:?} does not have the output's shape {out_shape:?}",
                            r.shape()
                        ),
                    ));
                }
                ops.push(EpilogueOp::AddResidual {
                    data: f32_of(r, node, op)?,
                    ld: n,
                });
            }
            EpilogueStep::LayerNorm { epsilon } => ops.push(EpilogueOp::LayerNorm {
                gamma: vector(at, "layer-norm gamma")?,
                beta: vector(at + 1, "layer-norm beta")?,
                eps: *epsilon,
            }),
            EpilogueStep::RequantU8 { scale, zero_point } => ops.push(EpilogueOp::Requant {
                scale: *scale,
                zero_point: *zero_point,
                ty: QType::U8,
            }),
            EpilogueStep::ForkU8 {
                scale,
                zero_point,
                smooth,
            } => ops.push(EpilogueOp::ForkU8 {
                smooth: if *smooth {
                    Some(vector(at, "fork_u8 factors")?)
                } else {
                    None
                },
                scale: *scale,
                zero_point: *zero_point,
                out: fork
                    .ok_or_else(|| Error::op(node, op, "`fork_u8` needs a second (u8) output"))?,
            }),
            // Not an op of the program: the GEMM's output kind (`Output::Heads`, see `qlinear`).
            EpilogueStep::QuantHeads { .. } => {}
        }
        at += step.operands();
    }
    Ok(())
}

/// `fused_linear(x, w, operands…)`: one f32 GEMM with the epilogue in the kernel.
pub(crate) fn fused_linear(
    x: &TensorValue,
    w: &PackedWeight,
    steps: &[EpilogueStep],
    operands: &[Input<'_>],
    ctx: &mut Ctx<'_>,
    node: &str,
) -> Result<TensorValue, Error> {
    let op = "fused_linear";
    let xv = f32_of(x, node, op)?;
    let (m, shape) = linear_rows(x, w.k(), w.n(), node, op)?;
    let mut ops = EpilogueOps::new();
    program(steps, operands, w.n(), &shape, node, op, &mut ops, None)?;
    let mut out = ctx.arena.f32_for_overwrite(m * w.n());
    gemm_packed_program(ctx, m, xv, w.k(), w, &mut out, &Epilogue::new(ops));
    Ok(TensorValue::raw(shape, out))
}

/// `round_half_even(x / scale) + zero_point`, saturated to u8 (NaN counts as 0: → zero point):
/// the kernels' [`codegen::kernels::math::quantize_div`], so that a quantization moved into a
/// producer's epilogue (`requant_u8`, `fork_u8`) gives these bytes.
#[inline]
pub(crate) fn quantize_u8(x: f32, scale: f32, zp: f32) -> u8 {
    codegen::kernels::math::quantize_div(x, scale, zp, 0.0, 255.0) as u8
}

/// The activations of a `qlinear`, quantized: u8 data with per-row or per-tensor parameters.
#[derive(Default)]
pub(crate) struct QuantizedRows {
    pub data: Vec<u8>,
    pub scales: Vec<f32>,
    pub zeros: Vec<i32>,
}

impl QuantizedRows {
    /// Buffers for `m` rows of `k` from the arena, to quantize into.
    pub fn buffers(arena: &mut Arena, m: usize, k: usize) -> QuantizedRows {
        QuantizedRows {
            data: arena.bytes_for_overwrite(m * k),
            scales: arena.vec_with_capacity(m),
            zeros: arena.vec_with_capacity(m),
        }
    }

    /// Gives the buffers back to the arena.
    pub fn recycle(self, arena: &mut Arena) {
        arena.recycle_bytes(self.data);
        arena.recycle_data(crate::TensorData::F32(self.scales));
        arena.recycle_data(crate::TensorData::I32(self.zeros));
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use row::avx512::quantize16 as quantize_u8_16;
pub(crate) use row::quantize as quantize_row_u8;

/// Row quantizers: the range of a row (times the smoothing factors) and its quantization. The
/// AVX-512 versions compute exactly what the scalar ones do (the bytes of the IEEE division,
/// round half to even, NaN as 0), so results never depend on the CPU.
mod row {
    /// `(min(0, min x·s), max(0, max x·s))`, NaN ignored.
    pub fn range(x: &[f32], inv: Option<&[f32]>) -> (f32, f32) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F; the function reads only within the slices.
            return unsafe { avx512::range(x, inv) };
        }
        let mut lo = 0f32;
        let mut hi = 0f32;
        match inv {
            Some(s) => x.iter().zip(s).for_each(|(v, s)| {
                lo = lo.min(v * s);
                hi = hi.max(v * s);
            }),
            None => x.iter().for_each(|&v| {
                lo = lo.min(v);
                hi = hi.max(v);
            }),
        }
        (lo, hi)
    }

    /// `out[i] = quantize_u8(x[i]·s[i], scale, zp)`.
    pub fn quantize(x: &[f32], inv: Option<&[f32]>, scale: f32, zp: f32, out: &mut [u8]) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F; reads and writes stay within the slices.
            return unsafe { avx512::quantize(x, inv, scale, zp, out) };
        }
        match inv {
            Some(s) => x
                .iter()
                .zip(s)
                .zip(out.iter_mut())
                .for_each(|((v, s), o)| *o = super::quantize_u8(v * s, scale, zp)),
            None => x
                .iter()
                .zip(out.iter_mut())
                .for_each(|(v, o)| *o = super::quantize_u8(*v, scale, zp)),
        }
    }

    #[cfg(target_arch = "x86_64")]
    pub(super) mod avx512 {
        use codegen::kernels::math::lanes16;
        use std::arch::x86_64::*;

        /// Vectors per step of the loops over whole vectors: four independent min/max chains
        /// (one pair bounds the range loop by its latency, about four cycles a vector), four
        /// quotients checked as one group.
        const UNROLL: usize = 4;
        const STEP: usize = 16 * UNROLL;
        /// How far ahead of its loads the range pass asks for the row, in floats (2 KB). The
        /// range pass is the first to read a row since its producer wrote it, usually from
        /// memory or another core's cache (a GEMM's f32 output of 3 to 12 MB at batch 8); the
        /// hardware's prefetch alone left it waiting on every line: BERT-base INT8 dynamic,
        /// batch 8, AMX guest, 89.6 → 95-100 sequences/s with 1 to 4 KB ahead, FFN2's node 27.4 →
        /// 24.9 ms a run.
        const PREFETCH_AHEAD: usize = 512;

        /// Lanes `i..i+16` of `x` (times `inv`), masked to the slice; masked-off lanes are 0.
        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn load(x: &[f32], inv: Option<&[f32]>, i: usize, m: __mmask16) -> __m512 {
            // SAFETY: `m` enables only lanes below `x.len() - i` (and `inv` is as long as `x`).
            unsafe {
                let v = _mm512_maskz_loadu_ps(m, x.as_ptr().add(i));
                match inv {
                    Some(s) => _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, s.as_ptr().add(i))),
                    None => v,
                }
            }
        }

        #[target_feature(enable = "avx512f")]
        pub unsafe fn range(x: &[f32], inv: Option<&[f32]>) -> (f32, f32) {
            let n = x.len();
            if let Some(s) = inv {
                assert!(s.len() >= n, "smoothing factors shorter than the row");
            }
            let mut lo = [_mm512_setzero_ps(); UNROLL];
            let mut hi = [_mm512_setzero_ps(); UNROLL];
            let mut i = 0;
            // min/max return the second operand when one is NaN: NaN lanes keep the bound.
            while i + STEP <= n {
                for u in 0..UNROLL {
                    // A hint only: it may point past the row (never faults).
                    _mm_prefetch::<_MM_HINT_T0>(
                        x.as_ptr().wrapping_add(i + PREFETCH_AHEAD + 16 * u) as *const i8,
                    );
                }
                for (u, (lo, hi)) in lo.iter_mut().zip(hi.iter_mut()).enumerate() {
                    // SAFETY: i + STEP <= n: all 16 lanes lie within the slices (LLVM emits
                    // plain loads for the constant mask).
                    let v = unsafe { load(x, inv, i + 16 * u, !0) };
                    *lo = _mm512_min_ps(v, *lo);
                    *hi = _mm512_max_ps(v, *hi);
                }
                i += STEP;
            }
            while i < n {
                // SAFETY: masked to the slice.
                let v = unsafe { load(x, inv, i, crate::exec::simd::lanes_below(n - i)) };
                lo[0] = _mm512_min_ps(v, lo[0]);
                hi[0] = _mm512_max_ps(v, hi[0]);
                i += 16;
            }
            // The accumulators hold no NaN: their order does not matter.
            let fold = |v: [__m512; UNROLL], f: fn(__m512, __m512) -> __m512| {
                v.into_iter().reduce(f).expect("UNROLL > 0")
            };
            let (lo, hi) = (fold(lo, _mm512_min_ps), fold(hi, _mm512_max_ps));
            (_mm512_reduce_min_ps(lo), _mm512_reduce_max_ps(hi))
        }

        /// The whole vectors four at a time by the product with the reciprocal, a group redone
        /// by the division when any of its lanes is unsure (`lanes16::quantize_group_i32`: the
        /// division's bytes; the divider, ~10 cycles a quotient, bounded the loop), stored as
        /// 16-byte vectors; the tail by the division, masked.
        #[target_feature(enable = "avx512f")]
        pub unsafe fn quantize(
            x: &[f32],
            inv: Option<&[f32]>,
            scale: f32,
            zp: f32,
            out: &mut [u8],
        ) {
            let n = x.len();
            assert!(out.len() >= n, "output shorter than the row");
            if let Some(s) = inv {
                assert!(s.len() >= n, "smoothing factors shorter than the row");
            }
            let recip = lanes16::requant_reciprocal(scale, zp, 0.0, 255.0);
            let mut i = 0;
            while i + STEP <= n {
                // SAFETY: i + STEP <= n: all 16 lanes of each lie within the slices.
                let v: [__m512; UNROLL] =
                    std::array::from_fn(|u| unsafe { load(x, inv, i + 16 * u, !0) });
                let put = |u: usize, q: __m512i| {
                    // SAFETY: bytes i + 16u .. i + 16u + 16 lie within `out` (i + STEP <= n).
                    unsafe {
                        _mm_storeu_si128(
                            out.as_mut_ptr().add(i + 16 * u) as *mut __m128i,
                            _mm512_cvtepi32_epi8(q),
                        )
                    }
                };
                lanes16::quantize_group_i32(v, [!0; UNROLL], (scale, recip), zp, 0.0, 255.0, put);
                i += STEP;
            }
            while i < n {
                let m = crate::exec::simd::lanes_below(n - i);
                // SAFETY: masked to the slice.
                let v = unsafe { load(x, inv, i, m) };
                // SAFETY: the store is masked to the lanes that lie within `out`.
                unsafe {
                    _mm512_mask_cvtepi32_storeu_epi8(
                        out.as_mut_ptr().add(i) as *mut i8,
                        m,
                        quantize16(v, scale, zp),
                    )
                };
                i += 16;
            }
        }

        /// `quantize_u8` of 16 lanes (`zp` an integer of [0, 255]), the bytes as the low byte of
        /// each i32 lane: `math::lanes16::quantize_div_i32`, the vector form the GEMM epilogues
        /// requantize with. The row quantizer and int8 attention's u8 output both make their
        /// bytes here.
        #[inline]
        #[target_feature(enable = "avx512f")]
        pub(crate) fn quantize16(v: __m512, scale: f32, zp: f32) -> __m512i {
            lanes16::quantize_div_i32(v, scale, zp, 0.0, 255.0)
        }
    }
}

/// Quantizes `x` (`m` rows of `k`, times `inv_smooth[k]` when given) as `act` says, into
/// `data` (`m·k` bytes, overwritten), rows shared among the session's threads.
pub(crate) fn quantize_rows(
    x: &[f32],
    m: usize,
    k: usize,
    inv_smooth: Option<&[f32]>,
    act: ActQuant,
    buffers: QuantizedRows,
    ctx: &Ctx<'_>,
) -> QuantizedRows {
    let QuantizedRows {
        mut data,
        mut scales,
        mut zeros,
    } = buffers;
    let x = &x[..m * k];
    data.truncate(m * k);
    data.resize(m * k, 0);
    scales.clear();
    zeros.clear();
    if k == 0 {
        scales.resize(m.max(1), 1.0);
        zeros.resize(m.max(1), 0);
        return QuantizedRows {
            data,
            scales,
            zeros,
        };
    }
    // A few element operations per value: worth a second thread from ~64k values.
    let work = m * k * 4;
    match act {
        ActQuant::DynamicToken => {
            scales.resize(m, 0.0);
            zeros.resize(m, 0);
            let (sp, zp) = (
                SharedPtr(scales.as_mut_ptr()),
                SharedPtr(zeros.as_mut_ptr()),
            );
            ctx.par_rows_mut_work(&mut data, k, work, |r0, block| {
                for (i, q) in block.chunks_exact_mut(k).enumerate() {
                    let r = r0 + i;
                    let row = &x[r * k..(r + 1) * k];
                    let (lo, hi) = row::range(row, inv_smooth);
                    let (s, z) = ir::u8_qparams(lo, hi);
                    row::quantize(row, inv_smooth, s, z as f32, q);
                    // SAFETY: row r belongs to this block only; both vectors have m entries
                    // and outlive the parallel call.
                    unsafe {
                        *sp.get().add(r) = s;
                        *zp.get().add(r) = z;
                    }
                }
            });
            QuantizedRows {
                data,
                scales,
                zeros,
            }
        }
        ActQuant::DynamicTensor | ActQuant::Static { .. } => {
            let (s, z) = match act {
                ActQuant::Static { scale, zero_point } => (scale, zero_point),
                _ => {
                    let (lo, hi) = x
                        .chunks_exact(k)
                        .map(|r| row::range(r, inv_smooth))
                        .fold((0f32, 0f32), |(a, b), (c, d)| (a.min(c), b.max(d)));
                    ir::u8_qparams(lo, hi)
                }
            };
            ctx.par_rows_mut_work(&mut data, k, work, |r0, block| {
                let rows = &x[r0 * k..r0 * k + block.len()];
                for (r, q) in rows.chunks_exact(k).zip(block.chunks_exact_mut(k)) {
                    row::quantize(r, inv_smooth, s, z as f32, q);
                }
            });
            scales.push(s);
            zeros.push(z);
            QuantizedRows {
                data,
                scales,
                zeros,
            }
        }
    }
}

/// [`quantize_rows`] on the calling thread alone, into a new buffer.
pub(crate) fn quantize_rows_here(
    x: &[f32],
    m: usize,
    k: usize,
    inv_smooth: Option<&[f32]>,
    act: ActQuant,
) -> QuantizedRows {
    let mut arena = super::Arena::default();
    let ctx = Ctx {
        threads: 1,
        arena: &mut arena,
    };
    quantize_rows(x, m, k, inv_smooth, act, QuantizedRows::default(), &ctx)
}

/// `qlinear(x, w, w_scale, inv_smooth?, operands…)`: activation quantization, one u8×s8 GEMM,
/// dequantization and the epilogue in the kernel. `x` is f32, or u8 already quantized with the
/// static parameters of `act` (its producer's epilogue ended in `requant_u8` or `fork_u8`); the
/// output is u8 when this epilogue ends in `requant_u8`, f32 and its u8 copy after `fork_u8`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn qlinear(
    x: &TensorValue,
    w: &PackedWeightI8,
    then: Option<(&PackedWeightI8, codegen::lower::ThenGemm)>,
    w_scale: &TensorValue,
    inv_smooth: Option<&TensorValue>,
    act: ActQuant,
    steps: &[EpilogueStep],
    operands: &[Input<'_>],
    ctx: &mut Ctx<'_>,
    node: &str,
) -> Result<Outs, Error> {
    let op = "qlinear";
    let (k, n) = (w.k(), w.n());
    let (m, shape) = linear_rows(x, k, n, node, op)?;
    let ws = f32_of(w_scale, node, op)?;
    if ws.len() != n && ws.len() != 1 {
        return Err(Error::op(
            node,
            op,
            format!("weight scale has {} values, expected 1 or {n}", ws.len()),
        ));
    }
    let inv = match inv_smooth {
        Some(t) => {
            let v = f32_of(t, node, op)?;
            if v.len() != k {
                return Err(Error::op(
                    node,
                    op,
                    format!("smoothing factors have {} values, expected {k}", v.len()),
                ));
            }
            Some(v)
        }
        None => None,
    };
    let mut quantized = None;
    let (acts, a_scale, a_zero) = match (x.as_u8(), act) {
        (Some(bytes), ActQuant::Static { scale, zero_point }) if inv.is_none() => (
            bytes,
            RowParam::PerTensor(scale),
            RowParam::PerTensor(zero_point),
        ),
        (Some(_), _) => {
            return Err(Error::op(
                node,
                op,
                "a u8 input needs static activation parameters and no smoothing factors",
            ))
        }
        (None, _) => {
            let xv = f32_of(x, node, op)?;
            let buf = QuantizedRows::buffers(ctx.arena, m, k);
            let q: &QuantizedRows = quantized.insert(quantize_rows(xv, m, k, inv, act, buf, ctx));
            let params = if q.scales.len() == 1 {
                (
                    RowParam::PerTensor(q.scales[0]),
                    RowParam::PerTensor(q.zeros[0]),
                )
            } else {
                (
                    RowParam::PerRow(&q.scales[..]),
                    RowParam::PerRow(&q.zeros[..]),
                )
            };
            (&q.data[..], params.0, params.1)
        }
    };
    let mut ops = EpilogueOps::new();
    ops.push(EpilogueOp::Dequant {
        a_scale,
        a_zero,
        w_scale: ws,
    });
    let mut fork_bytes = matches!(steps.last(), Some(EpilogueStep::ForkU8 { .. }))
        .then(|| ctx.arena.bytes_for_overwrite(m * n));
    let fork = fork_bytes.as_mut().map(|b| ForkOut::new(b, n));
    let fork_shape = fork.map(|_| shape.clone());
    program(steps, operands, n, &shape, node, op, &mut ops, fork)?;
    let threads = ctx.gemm_threads(m * n * k);
    let epilogue = Epilogue::new(ops);
    let next = then.map(|(p, t)| codegen::kernels::int8::NextGemm {
        weights: p.inner(),
        row_epilogue: t.row_step,
        col_granularity: t.head_columns,
        threads: ctx.gemm_threads(m * p.n() * p.k()),
    });
    let run = |out: Output<'_>| {
        let (a, b) = (Activations::U8(acts), w.inner());
        codegen::kernels::int8::gemm_i8_step(m, a, k, b, out, &epilogue, threads, w.unit(), next)
            .map(|_| ())
            .map_err(|e| Error::op(node, op, e.to_string()))
    };
    if let Some(&EpilogueStep::QuantHeads { heads }) = steps.last() {
        // The widths the IR gives the three outputs (bytes, scales, v), or why not.
        let Some(&[ld_bytes, ld_scales, hidden]) = EpilogueStep::output_widths(steps, n).as_deref()
        else {
            return Err(Error::op(
                node,
                op,
                format!("`quant_heads {heads}` needs q, k and v of whole heads, not {n} columns"),
            ));
        };
        let mut bytes = ctx.arena.bytes_for_overwrite(m * ld_bytes);
        let mut scales = ctx.arena.f32_for_overwrite(m * ld_scales);
        let mut v = ctx.arena.f32_for_overwrite(m * hidden);
        run(Output::Heads(HeadsOut {
            bytes: &mut bytes,
            ld_bytes,
            scales: &mut scales,
            ld_scales,
            v: &mut v,
            ld_v: hidden,
            hidden,
            head_dim: hidden / heads,
        }))?;
        drop(epilogue);
        if let Some(q) = quantized {
            q.recycle(ctx.arena);
        }
        let with_width = |w: usize| {
            let mut s = shape.clone();
            *s.last_mut().expect("linear output has rank >= 1") = w;
            s
        };
        return Ok(smallvec::smallvec![
            TensorValue::raw(with_width(ld_bytes), bytes),
            TensorValue::raw(with_width(ld_scales), scales),
            TensorValue::raw(with_width(hidden), v),
        ]);
    }
    let result = if EpilogueStep::output_dtype(steps) == ir::DType::U8 {
        let mut out = ctx.arena.bytes_for_overwrite(m * n);
        run(Output::U8 {
            c: &mut out,
            ldc: n,
        })?;
        TensorValue::raw(shape, out)
    } else {
        let mut out = ctx.arena.f32_for_overwrite(m * n);
        run(Output::F32 {
            c: &mut out,
            ldc: n,
        })?;
        TensorValue::raw(shape, out)
    };
    drop(epilogue);
    if let Some(q) = quantized {
        q.recycle(ctx.arena);
    }
    let mut results: Outs = smallvec::smallvec![result];
    if let (Some(bytes), Some(shape)) = (fork_bytes, fork_shape) {
        results.push(TensorValue::raw(shape, bytes));
    }
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_quantization_is_per_row_and_exact_on_the_grid() {
        // Row 0 spans [-1, 3] (scale 4/255, zero 64); row 1 is all zero (scale 1, zero 0).
        let x = [-1.0, 0.0, 3.0, 0.0, 0.0, 0.0];
        let q = quantize_rows_here(&x, 2, 3, None, ActQuant::DynamicToken);
        assert_eq!(q.scales, vec![4.0 / 255.0, 1.0]);
        assert_eq!(q.zeros, vec![64, 0]);
        assert_eq!(q.data, vec![0, 64, 255, 0, 0, 0]);
    }

    #[test]
    fn smoothing_divides_before_quantizing() {
        let x = [2.0, 4.0];
        let q = quantize_rows_here(&x, 1, 2, Some(&[0.5, 0.25]), ActQuant::DynamicToken);
        // 1.0 and 1.0: both at the top of the range [0, 1].
        assert_eq!(q.data, vec![255, 255]);
    }

    #[test]
    fn static_quantization_rounds_half_to_even_and_saturates() {
        let q = quantize_rows_here(
            &[0.5, 1.5, 2.5, 1000.0, -1000.0, f32::NAN],
            1,
            6,
            None,
            ActQuant::Static {
                scale: 1.0,
                zero_point: 10,
            },
        );
        assert_eq!(q.data, vec![10, 12, 12, 255, 0, 10]);
    }

    /// Rows shared among threads give what one thread gives, for every scheme.
    #[test]
    fn threaded_quantization_equals_one_thread() {
        let (m, k) = (301, 257);
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 7919) % 1000) as f32 / 100.0 - 4.0 + (i / k) as f32 * 0.01)
            .collect();
        let inv: Vec<f32> = (0..k).map(|j| 0.5 + (j % 5) as f32 * 0.2).collect();
        for act in [
            ActQuant::DynamicToken,
            ActQuant::DynamicTensor,
            ActQuant::Static {
                scale: 0.05,
                zero_point: 100,
            },
        ] {
            let one = quantize_rows_here(&x, m, k, Some(&inv), act);
            let mut arena = super::super::Arena::default();
            let ctx = Ctx {
                threads: 2,
                arena: &mut arena,
            };
            // A stale buffer: every byte must be overwritten.
            let stale = QuantizedRows {
                data: vec![0xAB; m * k + 3],
                scales: vec![7.0; 3],
                zeros: vec![9; 5],
            };
            let two = quantize_rows(&x, m, k, Some(&inv), act, stale, &ctx);
            assert_eq!(one.data, two.data, "{act:?}");
            assert_eq!(one.scales, two.scales, "{act:?}");
            assert_eq!(one.zeros, two.zeros, "{act:?}");
        }
    }

    /// The vector row quantizer against the scalar formula, bit for bit: values at random across
    /// the exponents that reach the rounding (quotients up to ±2^12) and beyond, exact halves of
    /// the scale (ties), the special values, on scales from 2^-60 to 2^60 and the subnormal, zero
    /// and infinite ones (whose 0/0 and ∞/∞ are NaN quotients, 0 before the zero point as in the
    /// scalar formula: the vector one used to clamp them to 0 after it).
    #[test]
    fn vector_quantize_matches_the_scalar_formula_on_any_scale() {
        let mut draw = super::super::lcg24(777);
        let mut bits = || draw() ^ (draw() << 8);
        let mut scales: Vec<f32> = (0..300)
            .map(|_| f32::from_bits((bits() & 0x007f_ffff) | ((bits() % 120 + 67) << 23)))
            .collect();
        scales.extend([
            1.0,
            0.5,
            3.0,
            1e-40,
            f32::MIN_POSITIVE,
            0.0,
            f32::INFINITY,
            f32::MAX,
        ]);
        for &scale in &scales {
            let mut x: Vec<f32> = (0..1000)
                .map(|_| {
                    let q = f32::from_bits((bits() & 0x807f_ffff) | ((bits() % 45 + 100) << 23));
                    q * scale
                })
                .collect();
            x.extend((-600..600).map(|k| (k as f32 + 0.5) * scale));
            x.extend([
                0.0,
                -0.0,
                f32::NAN,
                f32::INFINITY,
                f32::NEG_INFINITY,
                f32::MAX,
                f32::MIN,
                1e-45,
                -1e-45,
            ]);
            for zp in [0.0, 128.0] {
                let mut out = vec![0u8; x.len()];
                row::quantize(&x, None, scale, zp, &mut out);
                for (&v, &o) in x.iter().zip(&out) {
                    assert_eq!(o, quantize_u8(v, scale, zp), "{v:e} / {scale:e} + {zp}");
                }
            }
        }
    }

    /// The vector row quantizer against the scalar formula, on awkward lengths, with and
    /// without smoothing, including NaN, infinities and exact .5 ties.
    #[test]
    fn vector_rows_equal_the_scalar_formula() {
        let mut draw = super::super::lcg24(12345);
        let mut rnd = || draw() as f32 / (1u32 << 24) as f32 * 8.0 - 4.0;
        // Lengths on both sides of the whole-vector loops' step (64) and of their tails.
        for len in [
            0usize, 1, 15, 16, 17, 33, 63, 64, 65, 100, 128, 143, 200, 257, 768,
        ] {
            let mut x: Vec<f32> = (0..len).map(|_| rnd()).collect();
            if len > 3 {
                x[0] = f32::NAN;
                x[1] = 0.5;
                x[2] = 2.5;
            }
            let inv: Vec<f32> = (0..len).map(|i| 0.5 + (i % 3) as f32 * 0.25).collect();
            for s in [None, Some(&inv[..])] {
                let (lo, hi) = row::range(&x, s);
                let xs: Vec<f32> = match s {
                    Some(s) => x.iter().zip(s).map(|(a, b)| a * b).collect(),
                    None => x.clone(),
                };
                let lo_ref = xs.iter().fold(0f32, |a, &b| a.min(b));
                let hi_ref = xs.iter().fold(0f32, |a, &b| a.max(b));
                assert_eq!((lo, hi), (lo_ref, hi_ref), "len {len}");
                let mut out = vec![0u8; len];
                row::quantize(&x, s, 1.0, 7.0, &mut out);
                let want: Vec<u8> = xs.iter().map(|&v| quantize_u8(v, 1.0, 7.0)).collect();
                assert_eq!(out, want, "len {len}");
            }
        }
    }
}

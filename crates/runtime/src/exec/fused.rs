//! The fused linears the `fuse` pipeline makes: `fused_linear` (f32 GEMM) and `qlinear` (u8×s8
//! GEMM), each with its epilogue program run by the kernel on every output tile, and `qmatmul`.

use codegen::kernels::rowquant as row;
use codegen::kernels::{
    Activations, Epilogue, EpilogueOp, EpilogueOps, ForkOut, HeadsOut, Output, QType, RowParam,
    RowParamsOut,
};
use ir::{ActQuant, EpilogueStep, GeluApprox};

use super::nn::{f32_of, linear_rows};
use super::{Arena, Ctx, Input, Outs, SharedPtr};
use crate::gemm::{gemm_packed_program, PackedWeight, PackedWeightI8};
use crate::value::TensorValue;
use crate::Error;

/// The kernel epilogue program of `steps`, reading their operands from `operands` in order;
/// a final `fork_u8` writes its copy to `fork`, a final `fork_u8_rows` to `fork` and its rows'
/// parameters to `params`.
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
    params: Option<RowParamsOut>,
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
            EpilogueStep::ForkU8Rows { smooth } => ops.push(EpilogueOp::ForkU8Rows {
                smooth: if *smooth {
                    Some(vector(at, "fork_u8_rows factors")?)
                } else {
                    None
                },
                out: fork.ok_or_else(|| {
                    Error::op(node, op, "`fork_u8_rows` needs a second (u8) output")
                })?,
                params: params.ok_or_else(|| {
                    Error::op(
                        node,
                        op,
                        "`fork_u8_rows` needs outputs for the rows' parameters",
                    )
                })?,
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
    program(
        steps,
        operands,
        w.n(),
        &shape,
        node,
        op,
        &mut ops,
        None,
        None,
    )?;
    let mut out = ctx.arena.f32_for_overwrite(m * w.n());
    gemm_packed_program(ctx, m, xv, w.k(), w, &mut out, &Epilogue::new(ops));
    Ok(TensorValue::raw(shape, out))
}

/// `round_half_even(x / scale) + zero_point`, saturated to u8 (NaN counts as 0: → zero point):
/// the kernels' [`codegen::kernels::math::quantize_div`], so that a quantization moved into a
/// producer's epilogue (`requant_u8`, `fork_u8`) gives these bytes.
#[cfg(test)]
pub(crate) use codegen::kernels::rowquant::quantize_u8;

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
pub(crate) use codegen::kernels::rowquant::avx512::quantize16 as quantize_u8_16;
pub(crate) use codegen::kernels::rowquant::quantize as quantize_row_u8;

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
        // The same quantization, here rather than in the producer.
        ActQuant::DynamicToken | ActQuant::TokenU8 => {
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
                    let (s, z) = row::quantize_row(row, inv_smooth, q);
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
/// static parameters of `act` (its producer's epilogue ended in `requant_u8` or `fork_u8`), or
/// u8 quantized per row with the scales and zero points of `row_params` (`act` `token_u8`, its
/// producer's epilogue ended in `fork_u8_rows`); the output is u8 when this epilogue ends in
/// `requant_u8`, f32 and its u8 copy after `fork_u8`, and the rows' parameters beside them after
/// `fork_u8_rows`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn qlinear(
    x: &TensorValue,
    w: &PackedWeightI8,
    then: Option<(&PackedWeightI8, codegen::lower::ThenGemm)>,
    w_scale: &TensorValue,
    inv_smooth: Option<&TensorValue>,
    row_params: Option<(&TensorValue, &TensorValue)>,
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
    let (acts, a_scale, a_zero) = match (x.as_u8(), act, row_params) {
        (Some(bytes), ActQuant::Static { scale, zero_point }, None) if inv.is_none() => (
            bytes,
            RowParam::PerTensor(scale),
            RowParam::PerTensor(zero_point),
        ),
        (Some(bytes), ActQuant::TokenU8, Some((scales, zeros))) if inv.is_none() => {
            let scales = f32_of(scales, node, op)?;
            let zeros = zeros.as_i32().ok_or_else(|| {
                Error::op(node, op, "the rows' zero points must be i32")
            })?;
            if scales.len() != m || zeros.len() != m {
                return Err(Error::op(
                    node,
                    op,
                    format!(
                        "{} row scales and {} zero points for {m} rows",
                        scales.len(),
                        zeros.len()
                    ),
                ));
            }
            (bytes, RowParam::PerRow(scales), RowParam::PerRow(zeros))
        }
        (Some(_), ActQuant::TokenU8, _) => {
            return Err(Error::op(
                node,
                op,
                "a u8 input quantized per row needs its rows' scales and zero points and no smoothing factors",
            ))
        }
        (Some(_), _, _) => {
            return Err(Error::op(
                node,
                op,
                "a u8 input needs static activation parameters and no smoothing factors",
            ))
        }
        (None, ActQuant::TokenU8, _) => {
            return Err(Error::op(
                node,
                op,
                "act `token_u8` reads u8 rows its producer quantized, not f32",
            ))
        }
        (None, _, _) => {
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
    let rows_fork = matches!(steps.last(), Some(EpilogueStep::ForkU8Rows { .. }));
    let mut fork_bytes = (rows_fork || matches!(steps.last(), Some(EpilogueStep::ForkU8 { .. })))
        .then(|| ctx.arena.bytes_for_overwrite(m * n));
    let fork = fork_bytes.as_mut().map(|b| ForkOut::new(b, n));
    let fork_shape = fork.map(|_| shape.clone());
    let row_shape = rows_fork.then(|| {
        let mut one_per_row = shape.clone();
        *one_per_row.last_mut().expect("linear output has rank >= 1") = 1;
        one_per_row
    });
    let mut row_outs = rows_fork.then(|| {
        let mut scales: Vec<f32> = ctx.arena.vec_with_capacity(m);
        let mut zeros: Vec<i32> = ctx.arena.vec_with_capacity(m);
        scales.resize(m, 0.0);
        zeros.resize(m, 0);
        (scales, zeros)
    });
    let params = row_outs.as_mut().map(|(s, z)| RowParamsOut::new(s, z));
    program(steps, operands, n, &shape, node, op, &mut ops, fork, params)?;
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
    if let (Some((scales, zeros)), Some(shape)) = (row_outs, row_shape) {
        results.push(TensorValue::raw(shape.clone(), scales));
        results.push(TensorValue::raw(shape, zeros));
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
}

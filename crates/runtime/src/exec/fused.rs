//! The fused linears the `fuse` pipeline makes: `fused_linear` (f32 GEMM) and `qlinear` (u8×s8
//! GEMM), each with its epilogue program run by the kernel on every output tile, and `qmatmul`.

use codegen::kernels::{Activations, Epilogue, EpilogueOp, Output, RowParam};
use ir::{ActQuant, EpilogueStep, GeluApprox};

use super::{Ctx, Input};
use crate::gemm::{gemm_packed_program, PackedWeight, PackedWeightI8};
use crate::value::TensorValue;
use crate::Error;

fn f32_of<'a>(t: &'a TensorValue, node: &str, op: &'static str) -> Result<&'a [f32], Error> {
    t.as_f32()
        .ok_or_else(|| Error::op(node, op, format!("expects f32, got {}", t.dtype())))
}

/// Checks `x` against the weight's `k` and returns `(m, output shape)`.
fn rows_of(
    x: &TensorValue,
    k: usize,
    n: usize,
    node: &str,
    op: &'static str,
) -> Result<(usize, Vec<usize>), Error> {
    let kx = *x
        .shape()
        .last()
        .ok_or_else(|| Error::op(node, op, "input is a scalar"))?;
    if kx != k {
        return Err(Error::op(
            node,
            op,
            format!(
                "input {:?} has {kx} features, the weight expects {k}",
                x.shape()
            ),
        ));
    }
    let m = x.shape()[..x.rank() - 1].iter().product();
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("rank >= 1") = n;
    Ok((m, shape))
}

/// The kernel epilogue program of `steps`, reading their operands from `operands` in order.
fn program<'a>(
    steps: &[EpilogueStep],
    operands: &'a [Input<'_>],
    n: usize,
    out_shape: &[usize],
    node: &str,
    op: &'static str,
    ops: &mut Vec<EpilogueOp<'a>>,
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
    let (m, shape) = rows_of(x, w.k(), w.n(), node, op)?;
    let mut ops = Vec::with_capacity(steps.len());
    program(steps, operands, w.n(), &shape, node, op, &mut ops)?;
    let mut out = ctx.arena.f32_zeroed(m * w.n());
    gemm_packed_program(ctx, m, xv, w.k(), w, &mut out, &Epilogue::new(ops));
    Ok(TensorValue::raw(shape, out))
}

/// `round_half_even(x / scale) + zero_point`, saturated to u8 (NaN → zero point).
#[inline]
fn quantize_u8(x: f32, scale: f32, zp: f32) -> u8 {
    let q = (x / scale).round_ties_even() + zp;
    if q.is_nan() {
        return zp as u8;
    }
    q.clamp(0.0, 255.0) as u8
}

/// The u8 scale and zero point of a range widened to include 0 (onnxruntime's
/// `DynamicQuantizeLinear` arithmetic; an all-zero range gets scale 1).
#[inline]
fn range_qparams(lo: f32, hi: f32) -> (f32, i32) {
    let (lo, hi) = (lo.min(0.0), hi.max(0.0));
    let scale = if hi == lo || !(hi - lo).is_finite() {
        1.0
    } else {
        (hi - lo) / 255.0
    };
    let zp = (0.0 - lo / scale).clamp(0.0, 255.0).round_ties_even() as i32;
    (scale, zp)
}

/// The activations of a `qlinear`, quantized: u8 data with per-row or per-tensor parameters.
pub(crate) struct QuantizedRows {
    pub data: Vec<u8>,
    pub scales: Vec<f32>,
    pub zeros: Vec<i32>,
}

/// Quantizes `x` (`m` rows of `k`, times `inv_smooth[k]` when given) as `act` says.
pub(crate) fn quantize_rows(
    x: &[f32],
    m: usize,
    k: usize,
    inv_smooth: Option<&[f32]>,
    act: ActQuant,
) -> QuantizedRows {
    let smoothed: std::borrow::Cow<'_, [f32]> = match inv_smooth {
        None => std::borrow::Cow::Borrowed(x),
        Some(s) => std::borrow::Cow::Owned(
            x.chunks_exact(k)
                .flat_map(|row| row.iter().zip(s).map(|(v, s)| v * s))
                .collect(),
        ),
    };
    let x = &smoothed[..m * k];
    let mut data = vec![0u8; m * k];
    let range = |v: &[f32]| {
        v.iter()
            .fold((0f32, 0f32), |(lo, hi), &x| (lo.min(x), hi.max(x)))
    };
    match act {
        ActQuant::DynamicToken => {
            let mut scales = Vec::with_capacity(m);
            let mut zeros = Vec::with_capacity(m);
            for (row, q) in x.chunks_exact(k).zip(data.chunks_exact_mut(k)) {
                let (lo, hi) = range(row);
                let (s, z) = range_qparams(lo, hi);
                for (d, &v) in q.iter_mut().zip(row) {
                    *d = quantize_u8(v, s, z as f32);
                }
                scales.push(s);
                zeros.push(z);
            }
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
                    let (lo, hi) = range(x);
                    range_qparams(lo, hi)
                }
            };
            for (d, &v) in data.iter_mut().zip(x) {
                *d = quantize_u8(v, s, z as f32);
            }
            QuantizedRows {
                data,
                scales: vec![s],
                zeros: vec![z],
            }
        }
    }
}

/// `qlinear(x, w, w_scale, inv_smooth?, operands…)`: activation quantization, one u8×s8 GEMM,
/// dequantization and the epilogue in the kernel.
#[allow(clippy::too_many_arguments)]
pub(crate) fn qlinear(
    x: &TensorValue,
    w: &PackedWeightI8,
    w_scale: &TensorValue,
    inv_smooth: Option<&TensorValue>,
    act: ActQuant,
    steps: &[EpilogueStep],
    operands: &[Input<'_>],
    ctx: &mut Ctx<'_>,
    node: &str,
) -> Result<TensorValue, Error> {
    let op = "qlinear";
    let xv = f32_of(x, node, op)?;
    let (k, n) = (w.k(), w.n());
    let (m, shape) = rows_of(x, k, n, node, op)?;
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
    let q = quantize_rows(xv, m, k, inv, act);
    let (a_scale, a_zero) = if q.scales.len() == 1 {
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
    let mut ops = Vec::with_capacity(steps.len() + 1);
    ops.push(EpilogueOp::Dequant {
        a_scale,
        a_zero,
        w_scale: ws,
    });
    program(steps, operands, n, &shape, node, op, &mut ops)?;
    let mut out = ctx.arena.f32_zeroed(m * n);
    let threads = ctx.gemm_threads(m * n * k);
    codegen::kernels::gemm_i8(
        m,
        Activations::U8(&q.data),
        k,
        w.inner(),
        Output::F32 {
            c: &mut out,
            ldc: n,
        },
        &Epilogue::new(ops),
        threads,
    )
    .map_err(|e| Error::op(node, op, e.to_string()))?;
    Ok(TensorValue::raw(shape, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_quantization_is_per_row_and_exact_on_the_grid() {
        // Row 0 spans [-1, 3] (scale 4/255, zero 64); row 1 is all zero (scale 1, zero 0).
        let x = [-1.0, 0.0, 3.0, 0.0, 0.0, 0.0];
        let q = quantize_rows(&x, 2, 3, None, ActQuant::DynamicToken);
        assert_eq!(q.scales, vec![4.0 / 255.0, 1.0]);
        assert_eq!(q.zeros, vec![64, 0]);
        assert_eq!(q.data, vec![0, 64, 255, 0, 0, 0]);
    }

    #[test]
    fn smoothing_divides_before_quantizing() {
        let x = [2.0, 4.0];
        let q = quantize_rows(&x, 1, 2, Some(&[0.5, 0.25]), ActQuant::DynamicToken);
        // 1.0 and 1.0: both at the top of the range [0, 1].
        assert_eq!(q.data, vec![255, 255]);
    }

    #[test]
    fn static_quantization_rounds_half_to_even_and_saturates() {
        let q = quantize_rows(
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
}

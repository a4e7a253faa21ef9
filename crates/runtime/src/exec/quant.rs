//! Quantization ops with the ONNX reference arithmetic: round half to even, saturate.

use ir::DType;

use super::nn::plan_matmul;
use super::{norm_axis, Arena};
use crate::value::{Dims, TensorData, TensorValue};
use crate::Error;

/// Per-element (scale, zero point) lookup: per tensor or per `axis`, read in place from the
/// parameter tensors.
struct QParams<'a> {
    scales: &'a [f32],
    zps: ZeroPoints<'a>,
    /// Elements between consecutive channels, and number of channels (1 = per tensor).
    inner: usize,
    channels: usize,
}

/// The zero points of a [`QParams`], in the dtype they came in (none: all 0).
enum ZeroPoints<'a> {
    Zero,
    U8(&'a [u8]),
    I8(&'a [i8]),
    I32(&'a [i32]),
}

impl ZeroPoints<'_> {
    fn len(&self) -> Option<usize> {
        match self {
            ZeroPoints::Zero => None,
            ZeroPoints::U8(v) => Some(v.len()),
            ZeroPoints::I8(v) => Some(v.len()),
            ZeroPoints::I32(v) => Some(v.len()),
        }
    }

    #[inline]
    fn get(&self, c: usize) -> i32 {
        match self {
            ZeroPoints::Zero => 0,
            ZeroPoints::U8(v) => v[c] as i32,
            ZeroPoints::I8(v) => v[c] as i32,
            ZeroPoints::I32(v) => v[c],
        }
    }
}

impl<'a> QParams<'a> {
    fn new(
        x_shape: &[usize],
        scale: &'a TensorValue,
        zp: Option<&'a TensorValue>,
        axis: i64,
        node: &str,
        op: &'static str,
    ) -> Result<QParams<'a>, Error> {
        let scales = scale.as_f32().ok_or_else(|| {
            Error::op(
                node,
                op,
                format!("scale must be f32, got {}", scale.dtype()),
            )
        })?;
        let zps = match zp {
            Some(z) => match z.data() {
                TensorData::U8(v) => ZeroPoints::U8(v),
                TensorData::I8(v) => ZeroPoints::I8(v),
                TensorData::I32(v) => ZeroPoints::I32(v),
                d => {
                    return Err(Error::op(
                        node,
                        op,
                        format!("zero point must be u8, i8 or i32, got {}", d.dtype()),
                    ))
                }
            },
            None => ZeroPoints::Zero,
        };
        if zps.len().is_some_and(|n| n != scales.len()) {
            return Err(Error::op(node, op, "scale and zero point differ in size"));
        }
        if scales.len() == 1 {
            return Ok(QParams {
                scales,
                zps,
                inner: 1,
                channels: 1,
            });
        }
        let a = norm_axis(axis, x_shape.len(), node, op)?;
        if scale.rank() != 1 || x_shape[a] != scales.len() {
            return Err(Error::op(
                node,
                op,
                format!(
                    "per-axis scale of {} elements does not match axis {a} of {x_shape:?}",
                    scales.len()
                ),
            ));
        }
        Ok(QParams {
            scales,
            zps,
            inner: x_shape[a + 1..].iter().product(),
            channels: x_shape[a],
        })
    }

    #[inline]
    fn at(&self, i: usize) -> (f32, i32) {
        let c = if self.channels == 1 {
            0
        } else {
            (i / self.inner) % self.channels
        };
        (self.scales[c], self.zps.get(c))
    }
}

#[inline]
fn quantize_one(x: f32, scale: f32, zp: i32, lo: i32, hi: i32) -> i32 {
    let q = (x / scale).round_ties_even();
    // Saturate in float first: NaN and huge values must not wrap.
    let q = if q.is_nan() {
        0.0
    } else {
        q.clamp(-2.0e9, 2.0e9)
    };
    (q as i32).saturating_add(zp).clamp(lo, hi)
}

/// `quantize_linear(x, scale, zero_point?)`: the zero point's dtype (else `to`) is the output's.
pub(crate) fn quantize_linear(
    x: &TensorValue,
    scale: &TensorValue,
    zp: Option<&TensorValue>,
    axis: i64,
    to: DType,
    arena: &mut Arena,
    node: &str,
) -> Result<TensorValue, Error> {
    let op = "quantize_linear";
    let xv = x
        .as_f32()
        .ok_or_else(|| Error::op(node, op, format!("input must be f32, got {}", x.dtype())))?;
    let p = QParams::new(x.shape(), scale, zp, axis, node, op)?;
    let out_dt = zp.map(|z| z.dtype()).unwrap_or(to);
    let data = match out_dt {
        DType::U8 => {
            let mut out = arena.bytes_for_overwrite(xv.len());
            for (i, (o, &v)) in out.iter_mut().zip(xv).enumerate() {
                let (s, z) = p.at(i);
                *o = quantize_one(v, s, z, 0, 255) as u8;
            }
            TensorData::U8(out)
        }
        DType::I8 => {
            let mut out = arena.i8_for_overwrite(xv.len());
            for (i, (o, &v)) in out.iter_mut().zip(xv).enumerate() {
                let (s, z) = p.at(i);
                *o = quantize_one(v, s, z, -128, 127) as i8;
            }
            TensorData::I8(out)
        }
        d => return Err(Error::op(node, op, format!("cannot quantize to {d}"))),
    };
    Ok(TensorValue::raw_data(Dims::from_slice(x.shape()), data))
}

/// `dequantize_linear(x, scale, zero_point?)`: `(x − zp)·scale` in f32.
pub(crate) fn dequantize_linear(
    x: &TensorValue,
    scale: &TensorValue,
    zp: Option<&TensorValue>,
    axis: i64,
    arena: &mut Arena,
    node: &str,
) -> Result<TensorValue, Error> {
    let op = "dequantize_linear";
    let p = QParams::new(x.shape(), scale, zp, axis, node, op)?;
    let deq = |i: usize, q: i32| {
        let (s, z) = p.at(i);
        (q - z) as f32 * s
    };
    let fill = |out: &mut [f32], q: &dyn Fn(usize) -> i32| {
        for (i, o) in out.iter_mut().enumerate() {
            *o = deq(i, q(i));
        }
    };
    let mut out = arena.f32_for_overwrite(x.len());
    match x.data() {
        TensorData::U8(v) => fill(&mut out, &|i| v[i] as i32),
        TensorData::I8(v) => fill(&mut out, &|i| v[i] as i32),
        TensorData::I32(v) => fill(&mut out, &|i| v[i]),
        d => {
            return Err(Error::op(
                node,
                op,
                format!("input must be u8, i8 or i32, got {}", d.dtype()),
            ))
        }
    }
    Ok(TensorValue::raw(Dims::from_slice(x.shape()), out))
}

/// `dynamic_quantize_linear(x)` → `(y: u8, scale, zero_point)` exactly as the ONNX spec:
/// the range is widened to include 0, `scale = (max − min)/255`, `zp = round(sat(0 − min/scale))`.
pub(crate) fn dynamic_quantize_linear(
    x: &TensorValue,
    node: &str,
) -> Result<Vec<TensorValue>, Error> {
    let xv = x.as_f32().ok_or_else(|| {
        Error::op(
            node,
            "dynamic_quantize_linear",
            format!("input must be f32, got {}", x.dtype()),
        )
    })?;
    let (mut min, mut max) = (0.0f32, 0.0f32);
    for &v in xv {
        min = min.min(v);
        max = max.max(v);
    }
    // onnxruntime's arithmetic, with its guard for an all-zero input (where the spec would
    // divide by zero).
    let (scale, zp) = ir::u8_qparams(min, max);
    let y: Vec<u8> = xv
        .iter()
        .map(|&v| quantize_one(v, scale, zp, 0, 255) as u8)
        .collect();
    Ok(vec![
        TensorValue::raw(Dims::from_slice(x.shape()), y),
        TensorValue::scalar(scale),
        TensorValue::scalar(zp as u8),
    ])
}

/// The elements of a u8 or i8 tensor, widened to i32 on reading.
#[derive(Clone, Copy)]
enum Ints<'a> {
    U8(&'a [u8]),
    I8(&'a [i8]),
}

impl<'a> Ints<'a> {
    fn of(t: &'a TensorValue, node: &str, what: &str) -> Result<Ints<'a>, Error> {
        match t.data() {
            TensorData::U8(v) => Ok(Ints::U8(v)),
            TensorData::I8(v) => Ok(Ints::I8(v)),
            d => Err(Error::op(
                node,
                "matmul_integer",
                format!("{what} must be u8 or i8, got {}", d.dtype()),
            )),
        }
    }

    fn len(self) -> usize {
        match self {
            Ints::U8(v) => v.len(),
            Ints::I8(v) => v.len(),
        }
    }

    fn at(self, i: usize) -> i32 {
        match self {
            Ints::U8(v) => v[i] as i32,
            Ints::I8(v) => v[i] as i32,
        }
    }
}

thread_local! {
    /// Row and panel scratch of [`integer_rows`] (kept between runs, so a steady run allocates
    /// none).
    static SCRATCH: std::cell::RefCell<(Vec<i32>, Vec<i32>, Vec<i32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
}

/// The exact i32 product of `a` and `b` (numpy matmul broadcasting, zero points per tensor, per
/// row of `a` or per column of `b`), handed to `emit(output row index, row)` one output row at
/// a time. Returns the output shape.
fn integer_rows(
    a: &TensorValue,
    b: &TensorValue,
    azp: Option<&TensorValue>,
    bzp: Option<&TensorValue>,
    node: &str,
    mut emit: impl FnMut(usize, &[i32]),
) -> Result<Dims, Error> {
    let p = plan_matmul(a.shape(), b.shape(), node, "matmul_integer")?;
    let (m, k, n) = (p.m, p.k, p.n);
    let (av, bv) = (Ints::of(a, node, "a")?, Ints::of(b, node, "b")?);
    let azp = azp.map(|z| Ints::of(z, node, "a_zero_point")).transpose()?;
    let bzp = bzp.map(|z| Ints::of(z, node, "b_zero_point")).transpose()?;
    let (az_len, bz_len) = (azp.map_or(1, Ints::len), bzp.map_or(1, Ints::len));
    if !(az_len == 1 || az_len == m) || !(bz_len == 1 || bz_len == n) {
        return Err(Error::op(
            node,
            "matmul_integer",
            format!(
                "zero points of {az_len} and {bz_len} elements do not fit [{m}, {k}] × [{k}, {n}]"
            ),
        ));
    }
    let zero_of = |z: Option<Ints<'_>>, len: usize, i: usize| {
        z.map_or(0, |z| z.at(if len == 1 { 0 } else { i }))
    };
    SCRATCH.with_borrow_mut(|(b_centered, a_row, c_row)| {
        b_centered.clear();
        // B minus its zero points, once per distinct B matrix (a constant weight is shared by
        // all).
        let mut b_at = usize::MAX;
        for (bi, (oa, ob)) in p.pairs.iter().enumerate() {
            if ob != b_at {
                b_centered.clear();
                b_centered.extend((0..k * n).map(|e| bv.at(ob + e) - zero_of(bzp, bz_len, e % n)));
                b_at = ob;
            }
            for i in 0..m {
                let za = zero_of(azp, az_len, i);
                a_row.clear();
                a_row.extend((0..k).map(|e| av.at(oa + i * k + e) - za));
                c_row.clear();
                c_row.resize(n, 0);
                super::simd::i32_row_times_panel(a_row, b_centered, n, c_row);
                emit(bi * m + i, c_row);
            }
        }
    });
    Ok(p.out_shape)
}

/// `matmul_integer(a, b, a_zero_point?, b_zero_point?)` → i32, exact. Zero points are scalars,
/// or per row of `a` / per column of `b`.
pub(crate) fn matmul_integer(
    a: &TensorValue,
    b: &TensorValue,
    azp: Option<&TensorValue>,
    bzp: Option<&TensorValue>,
    node: &str,
) -> Result<TensorValue, Error> {
    let mut out: Vec<i32> = Vec::new();
    let shape = integer_rows(a, b, azp, bzp, node, |_, row| out.extend_from_slice(row))?;
    Ok(TensorValue::raw(shape, out))
}

/// `MatMul(DequantizeLinear(qa, sa, za), DequantizeLinear(qb, sb, zb))` computed as
/// `Σ(qa−za)(qb−zb)` in i32 (exact), times `sa·sb[n]` in f32. `sa` is per tensor, `sb` per
/// tensor or per output column.
#[allow(clippy::too_many_arguments)]
pub(crate) fn qdq_matmul(
    qa: &TensorValue,
    sa: &TensorValue,
    za: Option<&TensorValue>,
    qb: &TensorValue,
    sb: &TensorValue,
    zb: Option<&TensorValue>,
    arena: &mut Arena,
    node: &str,
) -> Result<TensorValue, Error> {
    let plan = plan_matmul(qa.shape(), qb.shape(), node, "matmul")?;
    let n = plan.n;
    let sa = sa
        .as_f32()
        .filter(|v| v.len() == 1)
        .ok_or_else(|| Error::op(node, "matmul", "quantized A must have one f32 scale"))?[0];
    let sb = sb
        .as_f32()
        .filter(|v| v.len() == 1 || v.len() == n)
        .ok_or_else(|| {
            Error::op(
                node,
                "matmul",
                format!("quantized B needs 1 or {n} f32 scales"),
            )
        })?;
    let scale = |j: usize| sa * sb[if sb.len() == 1 { 0 } else { j }];
    let mut out = arena.f32_for_overwrite(plan.pairs.len() * plan.m * n);
    let shape = integer_rows(qa, qb, za, zb, node, |r, row| {
        for (j, (o, &v)) in out[r * n..(r + 1) * n].iter_mut().zip(row).enumerate() {
            *o = v as f32 * scale(j);
        }
    })?;
    Ok(TensorValue::raw(shape, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantize_rounds_half_to_even_and_saturates() {
        let x = TensorValue::from_f32(vec![6], vec![0.5, 1.5, 2.5, -0.5, 1000.0, -1000.0]).unwrap();
        let q = quantize_linear(
            &x,
            &TensorValue::scalar(1.0f32),
            Some(&TensorValue::scalar(0i8)),
            1,
            DType::I8,
            &mut Arena::default(),
            "q",
        )
        .unwrap();
        assert_eq!(q.as_i8().unwrap(), &[0, 2, 2, 0, 127, -128]);
        let q = quantize_linear(
            &x,
            &TensorValue::scalar(1.0f32),
            Some(&TensorValue::scalar(10u8)),
            1,
            DType::U8,
            &mut Arena::default(),
            "q",
        )
        .unwrap();
        assert_eq!(q.as_u8().unwrap(), &[10, 12, 12, 10, 255, 0]);
        let d = dequantize_linear(
            &q,
            &TensorValue::scalar(0.5f32),
            Some(&TensorValue::scalar(10u8)),
            1,
            &mut Arena::default(),
            "d",
        )
        .unwrap();
        assert_eq!(d.as_f32().unwrap(), &[0.0, 1.0, 1.0, 0.0, 122.5, -5.0]);
    }

    #[test]
    fn per_axis() {
        let x = TensorValue::from_i8(vec![2, 2], vec![1, 2, 3, 4]).unwrap();
        let s = TensorValue::from_f32(vec![2], vec![1.0, 10.0]).unwrap();
        let d = dequantize_linear(&x, &s, None, 1, &mut Arena::default(), "d").unwrap();
        assert_eq!(d.as_f32().unwrap(), &[1.0, 20.0, 3.0, 40.0]);
        let d = dequantize_linear(&x, &s, None, 0, &mut Arena::default(), "d").unwrap();
        assert_eq!(d.as_f32().unwrap(), &[1.0, 2.0, 30.0, 40.0]);
    }

    #[test]
    fn dynamic_quantize_matches_spec_example() {
        // The example of the ONNX operator documentation.
        let x = TensorValue::from_f32(vec![6], vec![0.0, 2.0, -3.0, -2.5, 1.34, 0.5]).unwrap();
        let r = dynamic_quantize_linear(&x, "d").unwrap();
        assert_eq!(r[0].as_u8().unwrap(), &[153, 255, 0, 26, 221, 179]);
        assert!((r[1].as_f32().unwrap()[0] - 0.019_607_844).abs() < 1e-9);
        assert_eq!(r[2].as_u8().unwrap(), &[153]);
    }

    #[test]
    fn matmul_integer_with_zero_points() {
        let a = TensorValue::from_u8(vec![2, 2], vec![11, 12, 13, 14]).unwrap();
        let b = TensorValue::from_i8(vec![2, 2], vec![1, -1, 2, 3]).unwrap();
        let r = matmul_integer(&a, &b, Some(&TensorValue::scalar(10u8)), None, "m").unwrap();
        // [[1,2],[3,4]]·[[1,-1],[2,3]]
        assert_eq!(r.as_i32().unwrap(), &[5, 5, 11, 9]);
    }
}

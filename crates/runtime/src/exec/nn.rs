//! Matrix products, softmax and layer normalisation.

use super::simd::{layer_norm_rows, softmax_row_exact};
use super::{broadcast_shape, broadcast_strides, norm_axis, strides_of, Ctx, Input};
use crate::gemm::{gemm_packed, gemm_unpacked, PackedWeight};
use crate::value::{Dims, TensorValue};
use crate::Error;
use ir::DType;

/// How a numpy matmul of two shapes splits into 2-D products.
pub(crate) struct MatMulPlan {
    pub out_shape: Dims,
    pub m: usize,
    pub k: usize,
    pub n: usize,
    /// Element offsets of the `a` and `b` matrices for each output matrix, in order.
    pub pairs: MatrixPairs,
}

/// The offsets of the `a` and `b` matrices of each output matrix of a batched product, computed
/// on demand from the broadcast strides (no list is built per call).
pub(crate) struct MatrixPairs {
    count: usize,
    batch: Dims,
    batch_strides: Dims,
    a_strides: Dims,
    b_strides: Dims,
    a_matrix: usize,
    b_matrix: usize,
}

impl MatrixPairs {
    pub fn len(&self) -> usize {
        self.count
    }

    /// `(a offset, b offset)` of output matrix `i`.
    pub fn get(&self, i: usize) -> (usize, usize) {
        let (mut oa, mut ob) = (0, 0);
        for d in 0..self.batch.len() {
            let c = (i / self.batch_strides[d]) % self.batch[d];
            oa += c * self.a_strides[d];
            ob += c * self.b_strides[d];
        }
        (oa * self.a_matrix, ob * self.b_matrix)
    }

    pub fn iter(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        (0..self.count).map(|i| self.get(i))
    }
}

pub(crate) fn plan_matmul(
    ash: &[usize],
    bsh: &[usize],
    node: &str,
    op: &'static str,
) -> Result<MatMulPlan, Error> {
    if ash.is_empty() || bsh.is_empty() {
        return Err(Error::op(node, op, "operands must have rank ≥ 1"));
    }
    let a2: Dims = if ash.len() == 1 {
        smallvec::smallvec![1, ash[0]]
    } else {
        Dims::from_slice(ash)
    };
    let b2: Dims = if bsh.len() == 1 {
        smallvec::smallvec![bsh[0], 1]
    } else {
        Dims::from_slice(bsh)
    };
    let (m, k) = (a2[a2.len() - 2], a2[a2.len() - 1]);
    let (kb, n) = (b2[b2.len() - 2], b2[b2.len() - 1]);
    if k != kb {
        return Err(Error::op(
            node,
            op,
            format!("inner dimensions differ: {ash:?} × {bsh:?}"),
        ));
    }
    let (ab, bb) = (&a2[..a2.len() - 2], &b2[..b2.len() - 2]);
    let batch = broadcast_shape(ab, bb).ok_or_else(|| {
        Error::op(
            node,
            op,
            format!("batch dimensions do not broadcast: {ash:?} × {bsh:?}"),
        )
    })?;
    let (sa, sb) = (broadcast_strides(ab, &batch), broadcast_strides(bb, &batch));
    let count: usize = batch.iter().product();
    let bst = strides_of(&batch);
    let pairs = MatrixPairs {
        count,
        batch: batch.clone(),
        batch_strides: bst,
        a_strides: sa,
        b_strides: sb,
        a_matrix: m * k,
        b_matrix: k * n,
    };
    let mut out_shape = batch;
    if ash.len() > 1 {
        out_shape.push(m);
    }
    if bsh.len() > 1 {
        out_shape.push(n);
    }
    Ok(MatMulPlan {
        out_shape,
        m,
        k,
        n,
        pairs,
    })
}

pub(crate) fn f32_of<'a>(
    t: &'a TensorValue,
    node: &str,
    op: &'static str,
) -> Result<&'a [f32], Error> {
    t.as_f32()
        .ok_or_else(|| Error::op(node, op, format!("expects f32, got {}", t.dtype())))
}

/// Checks `x` (`[..., k]`) against a weight of `k` inputs and `n` outputs: returns the rows `m`
/// and the output shape `[..., n]`.
pub(crate) fn linear_rows(
    x: &TensorValue,
    k: usize,
    n: usize,
    node: &str,
    op: &'static str,
) -> Result<(usize, Dims), Error> {
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
    let mut shape = Dims::from_slice(x.shape());
    *shape.last_mut().expect("rank >= 1") = n;
    Ok((m, shape))
}

/// `x[..., k] · w[k, n] (+ bias)` with a prepacked weight: Linear (in unfused graphs, as
/// calibration runs them), and MatMul/Gemm whose right operand is a constant.
pub(crate) fn linear(
    x: &TensorValue,
    w: &PackedWeight,
    bias: Option<&TensorValue>,
    ctx: &mut Ctx<'_>,
    node: &str,
    op: &'static str,
) -> Result<TensorValue, Error> {
    let xv = f32_of(x, node, op)?;
    let (m, shape) = linear_rows(x, w.k(), w.n(), node, op)?;
    let bias = match bias {
        Some(b) => {
            let bv = f32_of(b, node, op)?;
            if bv.len() != w.n() {
                return Err(Error::op(
                    node,
                    op,
                    format!("bias has {} elements, expected {}", bv.len(), w.n()),
                ));
            }
            Some(bv)
        }
        None => None,
    };
    let mut out = ctx.arena.f32_zeroed(m * w.n());
    gemm_packed(ctx, m, xv, w.k(), w, &mut out, bias);
    Ok(TensorValue::raw(shape, out))
}

/// Numpy matmul of two f32 activations.
pub(crate) fn matmul(
    a: &TensorValue,
    b: &TensorValue,
    ctx: &mut Ctx<'_>,
    node: &str,
) -> Result<TensorValue, Error> {
    let (av, bv) = (f32_of(a, node, "matmul")?, f32_of(b, node, "matmul")?);
    let p = plan_matmul(a.shape(), b.shape(), node, "matmul")?;
    let mut out = ctx.arena.f32_zeroed(p.pairs.len() * p.m * p.n);
    for (i, (oa, ob)) in p.pairs.iter().enumerate() {
        let c = &mut out[i * p.m * p.n..(i + 1) * p.m * p.n];
        gemm_unpacked(
            ctx,
            p.m,
            p.n,
            p.k,
            &av[oa..],
            p.k,
            &bv[ob..],
            p.n,
            false,
            c,
            1.0,
        );
    }
    Ok(TensorValue::raw(p.out_shape, out))
}

/// ONNX Gemm: `alpha·op(a)·op(b) + beta·c`, `c` broadcast to `[m, n]`. `packed` is `op(b)`
/// packed at compile time when `b` is a constant.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm(
    a: &TensorValue,
    b: Option<&TensorValue>,
    c: Option<&TensorValue>,
    packed: Option<&PackedWeight>,
    (alpha, beta, trans_a, trans_b): (f32, f32, bool, bool),
    ctx: &mut Ctx<'_>,
    node: &str,
) -> Result<TensorValue, Error> {
    if a.rank() != 2 || b.is_some_and(|b| b.rank() != 2) {
        return Err(Error::op(node, "gemm", "operands must be 2-D"));
    }
    let a_t;
    let a = if trans_a {
        a_t = super::shape_ops::transpose(a, &[1, 0], None, node)?;
        &a_t
    } else {
        a
    };
    let (m, k) = (a.shape()[0], a.shape()[1]);
    let (kb, n) = match (packed, b) {
        (Some(w), _) => (w.k(), w.n()),
        (None, Some(b)) if trans_b => (b.shape()[1], b.shape()[0]),
        (None, Some(b)) => (b.shape()[0], b.shape()[1]),
        (None, None) => return Err(Error::op(node, "gemm", "no weight")),
    };
    if k != kb {
        return Err(Error::op(
            node,
            "gemm",
            format!("inner dimensions differ: {k} and {kb}"),
        ));
    }
    let av = f32_of(a, node, "gemm")?;
    let mut out = ctx.arena.f32_zeroed(m * n);
    match packed {
        Some(w) => {
            gemm_packed(ctx, m, av, k, w, &mut out, None);
            if alpha != 1.0 {
                out.iter_mut().for_each(|v| *v *= alpha);
            }
        }
        None => {
            let b = b.expect("checked above");
            let bv = f32_of(b, node, "gemm")?;
            let ldb = b.shape()[1];
            gemm_unpacked(ctx, m, n, k, av, k, bv, ldb, trans_b, &mut out, alpha);
        }
    }
    if let Some(c) = c {
        if beta != 0.0 {
            let cv = f32_of(c, node, "gemm")?;
            let target = [m, n];
            if broadcast_shape(c.shape(), &target).as_deref() != Some(&target[..]) {
                return Err(Error::op(
                    node,
                    "gemm",
                    format!("C {:?} does not broadcast to [{m}, {n}]", c.shape()),
                ));
            }
            let s = broadcast_strides(c.shape(), &target);
            for i in 0..m {
                for j in 0..n {
                    out[i * n + j] += beta * cv[i * s[0] + j * s[1]];
                }
            }
        }
    }
    Ok(TensorValue::raw(vec![m, n], out))
}

/// Softmax over `axis`, in place when the input is owned.
pub(crate) fn softmax(
    x: Input<'_>,
    axis: i64,
    ctx: &Ctx<'_>,
    node: &str,
) -> Result<TensorValue, Error> {
    let shape = Dims::from_slice(x.get().shape());
    let a = norm_axis(axis, shape.len(), node, "softmax")?;
    f32_of(x.get(), node, "softmax")?;
    let mut out = x.into_owned();
    let buf = out.typed_mut::<f32>().expect("checked f32");
    let dim = shape[a];
    let inner: usize = shape[a + 1..].iter().product();
    if dim == 0 || buf.is_empty() {
        return Ok(out);
    }
    if inner == 1 {
        ctx.par_rows_mut(buf, dim, |_, block| {
            block.chunks_exact_mut(dim).for_each(softmax_row_exact)
        });
    } else {
        let mut tmp = vec![0.0; dim];
        for chunk in buf.chunks_exact_mut(dim * inner) {
            for i in 0..inner {
                for d in 0..dim {
                    tmp[d] = chunk[d * inner + i];
                }
                softmax_row_exact(&mut tmp);
                for d in 0..dim {
                    chunk[d * inner + i] = tmp[d];
                }
            }
        }
    }
    Ok(out)
}

/// LayerNormalization over the axes from `axis` to the end.
pub(crate) fn layer_norm(
    x: &TensorValue,
    gamma: &TensorValue,
    beta: Option<&TensorValue>,
    axis: i64,
    eps: f32,
    ctx: &mut Ctx<'_>,
    node: &str,
) -> Result<TensorValue, Error> {
    let xv = f32_of(x, node, "layer_norm")?;
    let a = norm_axis(axis, x.rank(), node, "layer_norm")?;
    let n: usize = x.shape()[a..].iter().product();
    let g = f32_of(gamma, node, "layer_norm")?;
    let b = beta.map(|b| f32_of(b, node, "layer_norm")).transpose()?;
    if g.len() != n || b.is_some_and(|b| b.len() != n) {
        return Err(Error::op(
            node,
            "layer_norm",
            format!(
                "gamma/beta must have {n} elements (normalised shape {:?})",
                &x.shape()[a..]
            ),
        ));
    }
    // Every row is written whole below: no zero fill (3 MB at a batch of 8 × 128, on one
    // thread while the other waited).
    let mut out = ctx.arena.f32_for_overwrite(xv.len());
    if n > 0 {
        ctx.par_rows_mut(&mut out, n, |row0, block| {
            let xr = &xv[row0 * n..row0 * n + block.len()];
            layer_norm_rows(xr, block, n, g, b, eps);
        });
    }
    Ok(TensorValue::raw(Dims::from_slice(x.shape()), out))
}

/// ONNX `Einsum` (see [`ir::Op::Einsum`]) by direct summation over every label: a reference
/// loop, not a GEMM, so it is meant for small operands (f32, i64, i32).
pub(crate) fn einsum(
    equation: &str,
    xs: &[&TensorValue],
    node: &str,
) -> Result<TensorValue, Error> {
    let bad = |m: String| Error::op(node, "einsum", m);
    let ranks: Vec<usize> = xs.iter().map(|x| x.rank()).collect();
    let plan = ir::einsum_plan(equation, &ranks).map_err(bad)?;
    // Each label's size (operands agree, or are 1 and broadcast), and each operand's stride
    // per label (summed where a label repeats: the diagonal; 0 where broadcast).
    let mut size = vec![1usize; plan.labels];
    for (ax, x) in plan.operands.iter().zip(xs) {
        for (&l, &d) in ax.iter().zip(x.shape()) {
            if d != 1 && size[l] != 1 && size[l] != d {
                return Err(bad(format!(
                    "label sizes {} and {d} differ ({equation})",
                    size[l]
                )));
            }
            if d != 1 {
                size[l] = d;
            }
        }
    }
    let strides: Vec<Vec<usize>> = plan
        .operands
        .iter()
        .zip(xs)
        .map(|(ax, x)| {
            let st = strides_of(x.shape());
            let mut s = vec![0usize; plan.labels];
            for ((&l, &d), &k) in ax.iter().zip(x.shape()).zip(&st) {
                if d != 1 {
                    s[l] += k;
                }
            }
            s
        })
        .collect();
    let summed: Vec<usize> = (0..plan.labels)
        .filter(|l| !plan.output.contains(l))
        .collect();
    let out_shape: Vec<usize> = plan.output.iter().map(|&l| size[l]).collect();
    let n_out: usize = out_shape.iter().product();
    let n_sum: usize = summed.iter().map(|&l| size[l]).product();
    // The offsets of every operand at output position `o` and summed position `s`.
    let offsets = |o: usize, s: usize| -> Vec<usize> {
        let mut idx = vec![0usize; plan.labels];
        let mut r = o;
        for &l in plan.output.iter().rev() {
            idx[l] = r % size[l];
            r /= size[l];
        }
        let mut r = s;
        for &l in summed.iter().rev() {
            idx[l] = r % size[l];
            r /= size[l];
        }
        strides
            .iter()
            .map(|st| idx.iter().zip(st).map(|(i, s)| i * s).sum())
            .collect()
    };
    macro_rules! go {
        ($get:ident, $t:ty, $zero:expr, $one:expr) => {{
            let vs: Vec<&[$t]> = xs
                .iter()
                .map(|x| {
                    x.$get()
                        .ok_or_else(|| bad(format!("operands differ in dtype ({})", x.dtype())))
                })
                .collect::<Result<_, _>>()?;
            let mut out = vec![$zero; n_out];
            for (o, y) in out.iter_mut().enumerate() {
                for s in 0..n_sum {
                    let p = offsets(o, s)
                        .iter()
                        .zip(&vs)
                        .fold($one, |acc, (&off, v)| acc * v[off]);
                    *y += p;
                }
            }
            TensorValue::raw(out_shape, out)
        }};
    }
    Ok(match xs[0].dtype() {
        DType::F32 => go!(as_f32, f32, 0.0f32, 1.0f32),
        DType::I64 => go!(as_i64, i64, 0i64, 1i64),
        DType::I32 => go!(as_i32, i32, 0i32, 1i32),
        d => return Err(bad(format!("not defined on {d}"))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::Arena;

    /// LayerNorm on two threads writes every row of a recycled buffer of garbage, as on one
    /// thread with fresh buffers (and with and without beta).
    #[test]
    fn layer_norm_on_threads_writes_every_row() {
        let (rows, n) = (301usize, 96usize);
        let x: Vec<f32> = (0..rows * n)
            .map(|v| ((v * 37 % 101) as f32 - 50.0) * 0.1)
            .collect();
        let g: Vec<f32> = (0..n).map(|v| 1.0 + v as f32 * 0.01).collect();
        let b: Vec<f32> = (0..n).map(|v| v as f32 * -0.02).collect();
        let xt = TensorValue::from_f32(vec![1, rows, n], x).unwrap();
        let (gt, bt) = (
            TensorValue::from_f32(vec![n], g).unwrap(),
            TensorValue::from_f32(vec![n], b).unwrap(),
        );
        for beta in [Some(&bt), None] {
            let mut fresh = Arena::default();
            let mut one = Ctx {
                threads: 1,
                arena: &mut fresh,
            };
            let want = layer_norm(&xt, &gt, beta, -1, 1e-5, &mut one, "ln").unwrap();
            let mut used = Arena::default();
            used.recycle_data(crate::TensorData::F32(vec![f32::NAN; rows * n]));
            let mut two = Ctx {
                threads: 2,
                arena: &mut used,
            };
            let got = layer_norm(&xt, &gt, beta, -1, 1e-5, &mut two, "ln").unwrap();
            assert_eq!(got, want);
            assert!(got.as_f32().unwrap().iter().all(|v| v.is_finite()));
        }
    }
}

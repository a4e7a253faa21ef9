//! A slow, plain reference interpreter for the tests: runs a typed graph on concrete inputs, so
//! that a graph before and after a pipeline can be compared numerically. Layout and
//! elementwise ops go through `passes::eval_node`; the network ops are written out here.

use std::collections::HashMap;
use std::path::Path;

use ir::{
    ActQuant, DType, Dim, EpilogueStep, GeluApprox, Graph, Op, Outlet, ReduceOp, Tensor,
    TensorType, UnaryOp,
};

/// Runs `g` (every output typed, e.g. after `ShapeInference`) on `inputs` by name.
pub fn run(g: &Graph, inputs: &HashMap<String, Tensor>) -> Result<HashMap<String, Tensor>, String> {
    let mut bind: HashMap<String, usize> = HashMap::new();
    let mut vals: HashMap<Outlet, Tensor> = HashMap::new();
    for &id in g.inputs() {
        let Op::Input { name } = &g.node(id).op else {
            unreachable!()
        };
        let t = inputs
            .get(name)
            .ok_or(format!("missing input {name}"))?
            .clone();
        let dims = g.node(id).outputs[0].shape.clone().ok_or("untyped input")?;
        for (d, &n) in dims.iter().zip(t.shape()) {
            if let [s] = d.symbols() {
                if d.coeff() == 1 {
                    bind.insert(s.clone(), n);
                }
            }
        }
        vals.insert(id.into(), t);
    }
    for id in g.topo_order().map_err(|e| e.to_string())? {
        let node = g.node(id);
        if matches!(node.op, Op::Input { .. }) {
            continue;
        }
        let ins: Vec<&Tensor> = g.node_inputs(id).iter().map(|o| &vals[o]).collect();
        let ty = concrete(&node.outputs[0], &bind).map_err(|e| format!("{}: {e}", node.name))?;
        let outs = eval(&node.op, &ins, &ty)
            .map_err(|e| format!("{} ({}): {e}", node.name, node.op.name()))?;
        for (slot, t) in outs.into_iter().enumerate() {
            vals.insert(Outlet::new(id, slot), t);
        }
    }
    Ok(g.outputs()
        .iter()
        .map(|(n, o)| (n.clone(), vals[o].clone()))
        .collect())
}

fn concrete(ty: &TensorType, bind: &HashMap<String, usize>) -> Result<TensorType, String> {
    let s = ty.shape.as_ref().ok_or("untyped value")?;
    let dims: Vec<Dim> = s
        .iter()
        .map(|d| d.eval(bind).map(Dim::fixed).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    Ok(TensorType::new(ty.dtype, dims))
}

fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_f32_vec().expect("float data")
}

fn dims(ty: &TensorType) -> Vec<usize> {
    ty.shape
        .as_ref()
        .unwrap()
        .iter()
        .map(|d| d.as_fixed().unwrap())
        .collect()
}

fn erf(x: f32) -> f32 {
    // Abramowitz & Stegun 7.1.26 in f64: |error| < 1.5e-7, far below the tests' 1e-4.
    let x = x as f64;
    let t = 1.0 / (1.0 + 0.3275911 * x.abs());
    let y = 1.0
        - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t
            + 0.254829592)
            * t
            * (-x * x).exp();
    (y.copysign(x)) as f32
}

fn gelu(x: f32, a: GeluApprox) -> f32 {
    match a {
        GeluApprox::Erf => 0.5 * x * (1.0 + erf(x / std::f32::consts::SQRT_2)),
        GeluApprox::Tanh => {
            0.5 * x
                * (1.0 + ((2.0 / std::f32::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
        }
    }
}

/// `c[m, n] = Σ a[m, k] b[k, n]` for one pair of row-major matrices.
fn mm(a: &[f32], b: &[f32], m: usize, k: usize, n: usize, c: &mut [f32]) {
    for i in 0..m {
        for j in 0..n {
            let mut s = 0.0f32;
            for p in 0..k {
                s += a[i * k + p] * b[p * n + j];
            }
            c[i * n + j] = s;
        }
    }
}

fn softmax_rows(x: &mut [f32], n: usize) {
    for row in x.chunks_mut(n) {
        let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut s = 0.0;
        for v in row.iter_mut() {
            *v = (*v - m).exp();
            s += *v;
        }
        for v in row.iter_mut() {
            *v /= s;
        }
    }
}

/// Flat offset of the batch element `bi` (of `out_batch`) in an operand with batch dims `b`.
fn batch_offset(bi: usize, out_batch: &[usize], b: &[usize], mat: usize) -> usize {
    let mut off = 0;
    let mut stride = mat;
    let mut rem = bi;
    for (i, &od) in out_batch.iter().enumerate().rev() {
        let coord = rem % od;
        rem /= od;
        let j = i as isize - (out_batch.len() - b.len()) as isize;
        if j >= 0 {
            let d = b[j as usize];
            if d != 1 {
                off += coord * stride;
            }
            stride *= d;
        }
    }
    off
}

fn eval(op: &Op, ins: &[&Tensor], ty: &TensorType) -> Result<Vec<Tensor>, String> {
    let out = dims(ty);
    let f = |v: Vec<f32>| Ok(vec![Tensor::from_vec(out.clone(), v)]);
    match op {
        Op::Const { value } => Ok(vec![value.clone()]),
        Op::Shape { start, end } => {
            let s = ins[0].shape();
            let r = s.len() as i64;
            let fix = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
            let (a, b) = (fix(*start), fix(end.unwrap_or(r)));
            Ok(vec![Tensor::from_vec(
                vec![b - a],
                s[a..b].iter().map(|&d| d as i64).collect(),
            )])
        }
        Op::Unary(UnaryOp::Erf) => f(f32s(ins[0]).into_iter().map(erf).collect()),
        Op::Gelu { approx } => f(f32s(ins[0]).into_iter().map(|x| gelu(x, *approx)).collect()),
        Op::Softmax { axis } => {
            let n = *out.last().unwrap();
            if !(*axis == -1 || *axis as usize == out.len() - 1) {
                return Err("softmax over a non-last axis".into());
            }
            let mut x = f32s(ins[0]);
            softmax_rows(&mut x, n);
            f(x)
        }
        Op::LayerNorm { axis, epsilon } => {
            if !(*axis == -1 || *axis as usize == out.len() - 1) {
                return Err("layer norm over more than the last axis".into());
            }
            let n = *out.last().unwrap();
            let (g, b) = (f32s(ins[1]), ins.get(2).map(|t| f32s(t)));
            let mut x = f32s(ins[0]);
            for row in x.chunks_mut(n) {
                let mean = row.iter().sum::<f32>() / n as f32;
                let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n as f32;
                let inv = 1.0 / (var + epsilon).sqrt();
                for (i, v) in row.iter_mut().enumerate() {
                    *v = (*v - mean) * inv * g[i] + b.as_ref().map_or(0.0, |b| b[i]);
                }
            }
            f(x)
        }
        Op::Reduce {
            op,
            axes,
            keepdims: _,
        } => {
            let s = ins[0].shape();
            let ax: Vec<usize> = if axes.is_empty() {
                (0..s.len()).collect()
            } else {
                axes.iter()
                    .map(|&a| {
                        if a < 0 {
                            (a + s.len() as i64) as usize
                        } else {
                            a as usize
                        }
                    })
                    .collect()
            };
            let x = f32s(ins[0]);
            let n_out: usize = out.iter().product();
            let mut acc = vec![
                match op {
                    ReduceOp::Max => f32::NEG_INFINITY,
                    ReduceOp::Min => f32::INFINITY,
                    ReduceOp::Prod => 1.0,
                    _ => 0.0,
                };
                n_out
            ];
            let kept: Vec<usize> = (0..s.len()).filter(|i| !ax.contains(i)).collect();
            let count: usize = ax.iter().map(|&a| s[a]).product();
            for (flat, v) in x.iter().enumerate() {
                let mut rem = flat;
                let mut coord = vec![0; s.len()];
                for i in (0..s.len()).rev() {
                    coord[i] = rem % s[i];
                    rem /= s[i];
                }
                let o = kept.iter().fold(0, |o, &i| o * s[i] + coord[i]);
                acc[o] = match op {
                    ReduceOp::Max => acc[o].max(*v),
                    ReduceOp::Min => acc[o].min(*v),
                    ReduceOp::Prod => acc[o] * v,
                    _ => acc[o] + v,
                };
            }
            if *op == ReduceOp::Mean {
                acc.iter_mut().for_each(|v| *v /= count as f32);
            }
            f(acc)
        }
        Op::MatMul => {
            let (a, b) = (ins[0].shape(), ins[1].shape());
            if a.len() < 2 || b.len() < 2 {
                return Err("1-D matmul".into());
            }
            let (m, k, n) = (a[a.len() - 2], a[a.len() - 1], b[b.len() - 1]);
            let ob = &out[..out.len() - 2];
            let nb: usize = ob.iter().product();
            let (x, w) = (f32s(ins[0]), f32s(ins[1]));
            let mut y = vec![0.0; nb * m * n];
            for bi in 0..nb {
                let oa = batch_offset(bi, ob, &a[..a.len() - 2], m * k);
                let ow = batch_offset(bi, ob, &b[..b.len() - 2], k * n);
                mm(
                    &x[oa..oa + m * k],
                    &w[ow..ow + k * n],
                    m,
                    k,
                    n,
                    &mut y[bi * m * n..(bi + 1) * m * n],
                );
            }
            f(y)
        }
        Op::Linear => {
            let w = ins[1].shape();
            let (k, n) = (w[0], w[1]);
            let x = f32s(ins[0]);
            let m = x.len() / k;
            let mut y = vec![0.0; m * n];
            mm(&x, &f32s(ins[1]), m, k, n, &mut y);
            if let Some(b) = ins.get(2) {
                let b = f32s(b);
                y.chunks_mut(n)
                    .for_each(|r| r.iter_mut().zip(&b).for_each(|(v, b)| *v += b));
            }
            f(y)
        }
        Op::Gemm {
            alpha,
            beta,
            trans_a,
            trans_b,
        } => {
            let t = |x: &Tensor, tr: bool| {
                let s = x.shape();
                let v = f32s(x);
                if !tr {
                    return (v, s[0], s[1]);
                }
                let mut o = vec![0.0; v.len()];
                for i in 0..s[0] {
                    for j in 0..s[1] {
                        o[j * s[0] + i] = v[i * s[1] + j];
                    }
                }
                (o, s[1], s[0])
            };
            let (a, m, k) = t(ins[0], *trans_a);
            let (b, _, n) = t(ins[1], *trans_b);
            let mut y = vec![0.0; m * n];
            mm(&a, &b, m, k, n, &mut y);
            let c = ins.get(2).map(|c| (f32s(c), c.len()));
            for (i, v) in y.iter_mut().enumerate() {
                *v *= alpha;
                if let Some((c, len)) = &c {
                    *v += beta
                        * if *len == 1 {
                            c[0]
                        } else if *len == n {
                            c[i % n]
                        } else {
                            c[i]
                        };
                }
            }
            f(y)
        }
        Op::Attention {
            num_heads, scale, ..
        } => {
            let s = ins[0].shape();
            let (b, sq, hid) = (s[0], s[1], s[2]);
            let sk = ins[1].shape()[1];
            let (h, dh) = (*num_heads, hid / num_heads);
            let (q, k, v) = (f32s(ins[0]), f32s(ins[1]), f32s(ins[2]));
            let bias = ins.get(3).map(|t| (f32s(t), t.shape().to_vec()));
            let mut y = vec![0.0; b * sq * hid];
            let mut p = vec![0.0; sk];
            for bi in 0..b {
                for hi in 0..h {
                    for i in 0..sq {
                        for (j, pj) in p.iter_mut().enumerate() {
                            let mut acc = 0.0;
                            for d in 0..dh {
                                acc += q[(bi * sq + i) * hid + hi * dh + d]
                                    * k[(bi * sk + j) * hid + hi * dh + d];
                            }
                            *pj = acc * scale;
                            if let Some((bv, bs)) = &bias {
                                let full = [b, h, sq, sk];
                                let off = full.len() - bs.len();
                                let coord = [bi, hi, i, j];
                                let idx = bs.iter().enumerate().fold(0, |a, (x, &d)| {
                                    a * d + if d == 1 { 0 } else { coord[off + x] }
                                });
                                *pj += bv[idx];
                            }
                        }
                        softmax_rows(&mut p, sk);
                        for d in 0..dh {
                            let mut acc = 0.0;
                            for (j, pj) in p.iter().enumerate() {
                                acc += pj * v[(bi * sk + j) * hid + hi * dh + d];
                            }
                            y[(bi * sq + i) * hid + hi * dh + d] = acc;
                        }
                    }
                }
            }
            f(y)
        }
        Op::CumSum { exclusive, reverse } => {
            let ax = ins[1].to_i64_vec().map_err(|e| e.to_string())?[0];
            let s = ins[0].shape();
            let a = if ax < 0 {
                (ax + s.len() as i64) as usize
            } else {
                ax as usize
            };
            let inner: usize = s[a + 1..].iter().product();
            let outer: usize = s[..a].iter().product();
            let x = ins[0].to_i64_vec().map_err(|e| e.to_string())?;
            let mut y = vec![0i64; x.len()];
            for o in 0..outer {
                for i in 0..inner {
                    let mut acc = 0;
                    let idx: Vec<usize> = (0..s[a]).collect();
                    let order: Vec<usize> = if *reverse {
                        idx.into_iter().rev().collect()
                    } else {
                        idx
                    };
                    for j in order {
                        let at = (o * s[a] + j) * inner + i;
                        if *exclusive {
                            y[at] = acc;
                            acc += x[at];
                        } else {
                            acc += x[at];
                            y[at] = acc;
                        }
                    }
                }
            }
            let t = Tensor::from_vec(out.clone(), y);
            Ok(vec![match ty.dtype {
                DType::I32 => Tensor::from_vec(
                    out.clone(),
                    t.to_i64_vec()
                        .unwrap()
                        .into_iter()
                        .map(|v| v as i32)
                        .collect(),
                ),
                _ => t,
            }])
        }
        Op::QuantizeLinear { axis, to } => {
            let x = f32s(ins[0]);
            let (scale, zp) = (f32s(ins[1]), ins.get(2).map(|t| t.to_i64_vec().unwrap()));
            let at = per_axis(&out, *axis);
            let (lo, hi) = if *to == DType::U8 {
                (0.0, 255.0)
            } else {
                (-128.0, 127.0)
            };
            let q: Vec<i64> = x
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    let c = at(i, scale.len());
                    let z = zp.as_ref().map_or(0, |z| z[at(i, z.len())]) as f32;
                    ((v / scale[c]).round_ties_even() + z).clamp(lo, hi) as i64
                })
                .collect();
            Ok(vec![int_tensor(*to, out.clone(), q)])
        }
        Op::DequantizeLinear { axis } => {
            let x = ins[0].to_i64_vec().map_err(|e| e.to_string())?;
            let (scale, zp) = (f32s(ins[1]), ins.get(2).map(|t| t.to_i64_vec().unwrap()));
            let at = per_axis(&out, *axis);
            f(x.iter()
                .enumerate()
                .map(|(i, &v)| {
                    let z = zp.as_ref().map_or(0, |z| z[at(i, z.len())]);
                    (v - z) as f32 * scale[at(i, scale.len())]
                })
                .collect())
        }
        Op::DynamicQuantizeLinear => {
            let x = f32s(ins[0]);
            let (mn, mx) = x
                .iter()
                .fold((0.0f32, 0.0f32), |(a, b), &v| (a.min(v), b.max(v)));
            let scale = (mx - mn) / 255.0;
            let zp = if scale == 0.0 {
                0.0
            } else {
                (-mn / scale).round_ties_even().clamp(0.0, 255.0)
            };
            let q: Vec<u8> = x
                .iter()
                .map(|v| if scale == 0.0 { zp } else { ((v / scale).round_ties_even() + zp).clamp(0.0, 255.0) } as u8)
                .collect();
            Ok(vec![
                Tensor::from_vec(out.clone(), q),
                Tensor::scalar(scale),
                Tensor::scalar(zp as u8),
            ])
        }
        Op::MatMulInteger => {
            let (a, b) = (ins[0].to_i64_vec().unwrap(), ins[1].to_i64_vec().unwrap());
            let (sa, sb) = (ins[0].shape(), ins[1].shape());
            if sb.len() != 2 {
                return Err("matmul_integer with a batched right operand".into());
            }
            let (k, n) = (sb[0], sb[1]);
            let m = a.len() / k;
            let az = ins.get(2).map_or(vec![0], |t| t.to_i64_vec().unwrap());
            let bz = ins.get(3).map_or(vec![0], |t| t.to_i64_vec().unwrap());
            if az.len() != 1 || (bz.len() != 1 && bz.len() != n) || sa[sa.len() - 1] != k {
                return Err("matmul_integer zero points or shapes not supported".into());
            }
            let mut y = vec![0i32; m * n];
            for i in 0..m {
                for j in 0..n {
                    let zb = bz[if bz.len() == 1 { 0 } else { j }];
                    y[i * n + j] = (0..k)
                        .map(|p| (a[i * k + p] - az[0]) * (b[p * n + j] - zb))
                        .sum::<i64>() as i32;
                }
            }
            Ok(vec![Tensor::from_vec(out.clone(), y)])
        }
        Op::FusedLinear { epilogue } => {
            let w = ins[1].shape();
            let (k, n) = (w[0], w[1]);
            let x = f32s(ins[0]);
            let m = x.len() / k;
            let mut y = vec![0.0; m * n];
            mm(&x, &f32s(ins[1]), m, k, n, &mut y);
            apply_epilogue(&mut y, n, epilogue, &ins[2..])?;
            f(y)
        }
        Op::QLinear {
            act,
            smooth,
            epilogue,
        } => {
            let w = ins[1].shape();
            let (k, n) = (w[0], w[1]);
            let wq = ins[1].to_i64_vec().map_err(|e| e.to_string())?;
            let ws = f32s(ins[2]);
            // Already quantized by its producer (`requant_u8`): the bytes are the q values.
            let prequantized = ins[0].dtype() == DType::U8;
            let mut x = f32s(ins[0]);
            if *smooth {
                let inv = f32s(ins[3]);
                x.iter_mut().enumerate().for_each(|(i, v)| *v *= inv[i % k]);
            }
            let m = x.len() / k;
            // One (scale, zero point) per row.
            let params: Vec<(f32, i64)> = match act {
                ActQuant::Static { scale, zero_point } => {
                    vec![(*scale, i64::from(*zero_point)); m]
                }
                ActQuant::DynamicTensor => vec![u8_range_qparams(&x); m],
                ActQuant::DynamicToken => x.chunks(k).map(u8_range_qparams).collect(),
                // Each row's parameters, as its producer quantized it.
                ActQuant::TokenU8 => f32s(ins[3])
                    .into_iter()
                    .zip(ins[4].to_i64_vec().map_err(|e| e.to_string())?)
                    .collect(),
            };
            if params.len() != m {
                return Err(format!("{} row parameters for {m} rows", params.len()));
            }
            let mut y = vec![0.0; m * n];
            for i in 0..m {
                let (s, z) = params[i];
                let q: Vec<i64> = x[i * k..(i + 1) * k]
                    .iter()
                    .map(|&v| {
                        if prequantized {
                            v as i64
                        } else {
                            ((v / s).round_ties_even() + z as f32).clamp(0.0, 255.0) as i64
                        }
                    })
                    .collect();
                for c in 0..n {
                    let acc: i64 = (0..k).map(|p| (q[p] - z) * wq[p * n + c]).sum();
                    let wsc = ws[if ws.len() == 1 { 0 } else { c }];
                    y[i * n + c] = acc as f32 * s * wsc;
                }
            }
            let first = 3 + act.row_param_inputs() + usize::from(*smooth);
            let fork = apply_epilogue(&mut y, n, epilogue, &ins[first..])?;
            if let Some(EpilogueStep::QuantHeads { heads }) = epilogue.last() {
                return Ok(quant_heads(&y, &out, n, *heads));
            }
            if EpilogueStep::output_dtype(epilogue) == DType::U8 {
                let bytes = y.iter().map(|&v| v as u8).collect();
                return Ok(vec![Tensor::from_vec(out.clone(), bytes)]);
            }
            let mut outs = f(y)?;
            if let Some((copy, rows)) = fork {
                let bytes = copy.iter().map(|&v| v as u8).collect();
                outs.push(Tensor::from_vec(out.clone(), bytes));
                if let Some((scales, zeros)) = rows {
                    let mut one = out.clone();
                    *one.last_mut().ok_or("rank-0 qlinear output")? = 1;
                    outs.push(Tensor::from_vec(one.clone(), scales));
                    outs.push(Tensor::from_vec(one, zeros));
                }
            }
            Ok(outs)
        }
        Op::QMatMul => {
            let (a, b) = (ins[0].shape(), ins[3].shape());
            if a.len() < 2 || b.len() < 2 {
                return Err("1-D qmatmul".into());
            }
            let (m, k, n) = (a[a.len() - 2], a[a.len() - 1], b[b.len() - 1]);
            let qa = ins[0].to_i64_vec().map_err(|e| e.to_string())?;
            let qb = ins[3].to_i64_vec().map_err(|e| e.to_string())?;
            let (sa, za) = (f32s(ins[1])[0], ins[2].to_i64_vec().unwrap()[0]);
            let (sb, zb) = (f32s(ins[4]), ins[5].to_i64_vec().unwrap());
            let col = |v: usize, j: usize| if v == 1 { 0 } else { j };
            let ob = &out[..out.len() - 2];
            let nb: usize = ob.iter().product();
            let mut y = vec![0.0; nb * m * n];
            for bi in 0..nb {
                let oa = batch_offset(bi, ob, &a[..a.len() - 2], m * k);
                let ow = batch_offset(bi, ob, &b[..b.len() - 2], k * n);
                for i in 0..m {
                    for j in 0..n {
                        let z = zb[col(zb.len(), j)];
                        let acc: i64 = (0..k)
                            .map(|p| (qa[oa + i * k + p] - za) * (qb[ow + p * n + j] - z))
                            .sum();
                        y[(bi * m + i) * n + j] = acc as f32 * sa * sb[col(sb.len(), j)];
                    }
                }
            }
            f(y)
        }
        _ => match passes::eval_node(op, ins, ty)? {
            Some(t) => Ok(vec![t]),
            None => Err("not supported by the test interpreter".into()),
        },
    }
}

/// The three outputs of a `quant_heads` epilogue on `y` (rows of `n = 3h`), written out here:
/// each head of q and k as `round_half_even(x·127/amax)` (+128 for q, s8 bits for k) with its
/// scale `amax/127`, then v.
fn quant_heads(y: &[f32], out: &[usize], n: usize, heads: usize) -> Vec<Tensor> {
    let (h, m) = (n / 3, y.len() / n);
    let dh = h / heads;
    let (mut bytes, mut scales, mut v) = (Vec::new(), Vec::new(), Vec::new());
    for row in y.chunks(n) {
        for (i, head) in row[..2 * h].chunks(dh).enumerate() {
            let amax = head.iter().fold(0.0f32, |a, x| a.max(x.abs()));
            let offset = if i < heads { 128 } else { 0 };
            bytes.extend(head.iter().map(|&x| {
                let q = if amax > 0.0 {
                    (x * (127.0 / amax)).round_ties_even()
                } else {
                    0.0
                };
                (q.clamp(-127.0, 127.0) as i32 + offset) as u8
            }));
            scales.push(amax / 127.0);
        }
        v.extend_from_slice(&row[2 * h..]);
    }
    let shape = |w: usize| {
        let mut s = out.to_vec();
        *s.last_mut().expect("rank >= 1") = w;
        debug_assert_eq!(s.iter().product::<usize>(), m * w);
        s
    };
    vec![
        Tensor::from_vec(shape(2 * h), bytes),
        Tensor::from_vec(shape(2 * heads), scales),
        Tensor::from_vec(shape(h), v),
    ]
}

/// The u8 quantization of a range, widened to hold 0: `scale = (hi − lo)/255`,
/// `zero = round_half_even(−lo/scale)` (scale 1, zero 0 for an all-zero range). Written out here,
/// independently of the passes' own helper.
fn u8_range_qparams(x: &[f32]) -> (f32, i64) {
    let (lo, hi) = x
        .iter()
        .fold((0.0f32, 0.0f32), |(a, b), &v| (a.min(v), b.max(v)));
    let scale = (hi - lo) / 255.0;
    if scale == 0.0 || !scale.is_finite() {
        return (1.0, 0);
    }
    (
        scale,
        (-lo / scale).round_ties_even().clamp(0.0, 255.0) as i64,
    )
}

/// The u8 values of a final `fork_u8` or `fork_u8_rows`, with each row's scale and zero point
/// for the latter.
type ForkCopy = (Vec<f32>, Option<(Vec<f32>, Vec<i32>)>);

/// Applies the epilogue `steps` to `y` (rows of `n`), reading each step's operands in order;
/// returns the copy of a final `fork_u8` or `fork_u8_rows`.
fn apply_epilogue(
    y: &mut [f32],
    n: usize,
    steps: &[EpilogueStep],
    operands: &[&Tensor],
) -> Result<Option<ForkCopy>, String> {
    let requant = |v: f32, scale: f32, zero_point: i32| {
        let q = (v / scale).round_ties_even();
        let q = if q.is_nan() { 0.0 } else { q };
        (q + zero_point as f32).clamp(0.0, 255.0)
    };
    let mut fork = None;
    let mut next = operands.iter();
    let mut take = || {
        next.next()
            .map(|t| f32s(t))
            .ok_or("missing epilogue operand")
    };
    for step in steps {
        match step {
            EpilogueStep::Bias => {
                let b = take()?;
                y.iter_mut().enumerate().for_each(|(i, v)| *v += b[i % n]);
            }
            EpilogueStep::MulCol => {
                let s = take()?;
                y.iter_mut().enumerate().for_each(|(i, v)| *v *= s[i % n]);
            }
            EpilogueStep::Gelu(a) => y.iter_mut().for_each(|v| *v = gelu(*v, *a)),
            EpilogueStep::Residual => {
                let r = take()?;
                if r.len() != y.len() {
                    return Err("residual of another size".into());
                }
                y.iter_mut().zip(&r).for_each(|(v, r)| *v += r);
            }
            EpilogueStep::LayerNorm { epsilon } => {
                let (g, b) = (take()?, take()?);
                for row in y.chunks_mut(n) {
                    let mean = row.iter().sum::<f32>() / n as f32;
                    let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n as f32;
                    let inv = 1.0 / (var + epsilon).sqrt();
                    for (i, v) in row.iter_mut().enumerate() {
                        *v = (*v - mean) * inv * g[i] + b[i];
                    }
                }
            }
            EpilogueStep::RequantU8 { scale, zero_point } => {
                y.iter_mut()
                    .for_each(|v| *v = requant(*v, *scale, *zero_point));
            }
            EpilogueStep::ForkU8 {
                scale,
                zero_point,
                smooth,
            } => {
                let s = if *smooth { Some(take()?) } else { None };
                let copy = y
                    .iter()
                    .enumerate()
                    .map(|(i, &v)| {
                        let v = s.as_ref().map_or(v, |s| v * s[i % n]);
                        requant(v, *scale, *zero_point)
                    })
                    .collect();
                fork = Some((copy, None));
            }
            EpilogueStep::ForkU8Rows { smooth } => {
                let s = if *smooth { Some(take()?) } else { None };
                let (mut copy, mut scales, mut zeros) = (Vec::new(), Vec::new(), Vec::new());
                for row in y.chunks(n) {
                    let x: Vec<f32> = row
                        .iter()
                        .enumerate()
                        .map(|(i, &v)| s.as_ref().map_or(v, |s| v * s[i]))
                        .collect();
                    let (scale, zero) = u8_range_qparams(&x);
                    copy.extend(x.iter().map(|&v| requant(v, scale, zero as i32)));
                    scales.push(scale);
                    zeros.push(zero as i32);
                }
                fork = Some((copy, Some((scales, zeros))));
            }
            // The outputs, made by `quant_heads` after the steps.
            EpilogueStep::QuantHeads { .. } => {}
        }
    }
    if next.next().is_some() {
        return Err("epilogue operands left over".into());
    }
    Ok(fork)
}

/// For a per-axis (or per-tensor, `len == 1`) parameter: the parameter index of flat element `i`.
fn per_axis(shape: &[usize], axis: i64) -> impl Fn(usize, usize) -> usize + '_ {
    let a = if axis < 0 {
        (axis + shape.len() as i64).max(0) as usize
    } else {
        axis as usize
    };
    let inner: usize = shape.iter().skip(a + 1).product();
    let dim = shape.get(a).copied().unwrap_or(1);
    move |i, len| if len == 1 { 0 } else { (i / inner) % dim }
}

fn int_tensor(dtype: DType, shape: Vec<usize>, v: Vec<i64>) -> Tensor {
    match dtype {
        DType::U8 => Tensor::from_vec(shape, v.into_iter().map(|x| x as u8).collect()),
        DType::I8 => Tensor::from_vec(shape, v.into_iter().map(|x| x as i8).collect()),
        _ => Tensor::from_vec(shape, v.into_iter().map(|x| x as i32).collect()),
    }
}

/// Reads a little-endian `.npy` of f32 or i64.
pub fn read_npy(path: &Path) -> Tensor {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let hlen = u16::from_le_bytes([b[8], b[9]]) as usize;
    let header = std::str::from_utf8(&b[10..10 + hlen]).unwrap();
    let shape_txt = &header[header.find("'shape': (").unwrap() + 10..];
    let shape: Vec<usize> = shape_txt[..shape_txt.find(')').unwrap()]
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let data = &b[10 + hlen..];
    if header.contains("'<f4'") {
        let v = data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        Tensor::from_vec(shape, v)
    } else if header.contains("'<i8'") {
        let v = data
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        Tensor::from_vec::<i64>(shape, v)
    } else {
        panic!("{}: unsupported {header}", path.display())
    }
}

//! Evaluation of single nodes on constant inputs, for constant folding. Float arithmetic is done
//! in `f32`, as the runtime does, so a folded value is the value the graph would compute.

use ir::{BinaryOp, DType, Op, Tensor, TensorType, UnaryOp};

/// Element data: floats as `f32`, integers and bools as `i64`.
#[derive(Clone, Debug)]
enum Data {
    F(Vec<f32>),
    I(Vec<i64>),
}

impl Data {
    fn len(&self) -> usize {
        match self {
            Data::F(v) => v.len(),
            Data::I(v) => v.len(),
        }
    }

    /// Picks elements by index (layout ops).
    fn pick(&self, idx: &[usize]) -> Data {
        match self {
            Data::F(v) => Data::F(idx.iter().map(|&i| v[i]).collect()),
            Data::I(v) => Data::I(idx.iter().map(|&i| v[i]).collect()),
        }
    }
}

fn load(t: &Tensor) -> Result<Data, String> {
    let r = if t.dtype().is_float() {
        t.to_f32_vec().map(Data::F)
    } else {
        t.to_i64_vec().map(Data::I)
    };
    r.map_err(|e| e.to_string())
}

fn store(dtype: DType, shape: Vec<usize>, d: Data) -> Tensor {
    let f = |d: Data| match d {
        Data::F(v) => v,
        Data::I(v) => v.into_iter().map(|x| x as f32).collect(),
    };
    let i = |d: Data| match d {
        Data::I(v) => v,
        // ONNX casts floats to integers by truncation toward zero.
        Data::F(v) => v.into_iter().map(|x| x as i64).collect(),
    };
    match dtype {
        DType::F32 => Tensor::from_vec(shape, f(d)),
        DType::BF16 => {
            Tensor::from_vec(shape, f(d).into_iter().map(half::bf16::from_f32).collect())
        }
        DType::I64 => Tensor::from_vec(shape, i(d)),
        DType::I32 => Tensor::from_vec(shape, i(d).into_iter().map(|x| x as i32).collect()),
        DType::I8 => Tensor::from_vec(shape, i(d).into_iter().map(|x| x as i8).collect()),
        DType::U8 => Tensor::from_vec(shape, i(d).into_iter().map(|x| x as u8).collect()),
        DType::I16 => Tensor::from_vec(shape, i(d).into_iter().map(|x| x as i16).collect()),
        DType::U16 => Tensor::from_vec(shape, i(d).into_iter().map(|x| x as u16).collect()),
        DType::U32 => Tensor::from_vec(shape, i(d).into_iter().map(|x| x as u32).collect()),
        // Not reached: `eval_node` leaves u64 to the runtime (i64 cannot hold it).
        DType::U64 => Tensor::from_vec(shape, i(d).into_iter().map(|x| x as u64).collect()),
        DType::Bool => {
            let v: Vec<bool> = match d {
                Data::F(v) => v.into_iter().map(|x| x != 0.0).collect(),
                Data::I(v) => v.into_iter().map(|x| x != 0).collect(),
            };
            Tensor::from_vec(shape, v)
        }
    }
}

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// For each element of `out` (row-major), the flat index into a tensor of `shape` broadcast to
/// `out` (numpy rules, aligned right).
fn broadcast_index(shape: &[usize], out: &[usize]) -> Vec<usize> {
    let n: usize = out.iter().product();
    let off = out.len() - shape.len();
    let st = strides(shape);
    let ost = strides(out);
    (0..n)
        .map(|flat| {
            let mut src = 0;
            for (k, (&d, &s)) in shape.iter().zip(&st).enumerate() {
                let coord = (flat / ost[off + k]) % out[off + k];
                if d != 1 {
                    src += coord * s;
                }
            }
            src
        })
        .collect()
}

fn axis(a: i64, rank: usize) -> Result<usize, String> {
    let r = rank as i64;
    let v = if a < 0 { a + r } else { a };
    if (0..r).contains(&v) {
        Ok(v as usize)
    } else {
        Err(format!("axis {a} is out of range for rank {rank}"))
    }
}

/// Checks that `shape` broadcasts to `out` (numpy rules), so indexing cannot go wrong.
fn check_broadcast(shape: &[usize], out: &[usize]) -> Result<(), String> {
    let ok = shape.len() <= out.len()
        && shape
            .iter()
            .zip(&out[out.len() - shape.len()..])
            .all(|(&d, &o)| d == o || d == 1);
    if ok {
        Ok(())
    } else {
        Err(format!("shape {shape:?} does not broadcast to {out:?}"))
    }
}

fn fixed_shape(ty: &TensorType) -> Result<Vec<usize>, String> {
    ty.shape
        .as_ref()
        .and_then(|s| s.iter().map(|d| d.as_fixed()).collect())
        .ok_or_else(|| format!("output type {ty} is not fixed"))
}

/// Evaluates `op` on constant `inputs`, producing a tensor of type `out`. `Ok(None)` when the op
/// is not one constant folding evaluates.
///
/// ```
/// use ir::{BinaryOp, DType, Op, Tensor, TensorType};
/// let a = Tensor::from_vec(vec![2], vec![1i64, 2]);
/// let b = Tensor::scalar(10i64);
/// let out = TensorType::new(DType::I64, ir::fixed_shape(&[2]));
/// let r = passes::eval_node(&Op::Binary(BinaryOp::Mul), &[&a, &b], &out).unwrap().unwrap();
/// assert_eq!(r.to_vec::<i64>().unwrap(), vec![10, 20]);
/// ```
pub fn eval_node(op: &Op, inputs: &[&Tensor], out: &TensorType) -> Result<Option<Tensor>, String> {
    // Integers are evaluated in i64 (then wrapped to their type, as the runtime's wrapping
    // arithmetic does), which cannot hold every u64: those values stay for the runtime.
    if out.dtype == DType::U64 || inputs.iter().any(|t| t.dtype() == DType::U64) {
        return Ok(None);
    }
    if matches!(op, Op::Select) {
        // The chosen value whole, whatever its shape: nothing to compute.
        return match inputs[0]
            .to_i64_vec()
            .map_err(|e| e.to_string())?
            .as_slice()
        {
            [0] => Ok(Some(inputs[2].clone())),
            [_] => Ok(Some(inputs[1].clone())),
            c => Err(format!(
                "select condition holds {} elements, not 1",
                c.len()
            )),
        };
    }
    let oshape = fixed_shape(out)?;
    let n = oshape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| format!("output {out} is too large"))?;
    if matches!(op, Op::Binary(_) | Op::Where | Op::Expand) {
        for t in inputs
            .iter()
            .take(if matches!(op, Op::Expand) { 1 } else { 3 })
        {
            check_broadcast(t.shape(), &oshape)?;
        }
    }
    let data = match op {
        Op::Binary(b) => {
            let (x, y) = (load(inputs[0])?, load(inputs[1])?);
            let ix = broadcast_index(inputs[0].shape(), &oshape);
            let iy = broadcast_index(inputs[1].shape(), &oshape);
            binary(*b, &x.pick(&ix), &y.pick(&iy))?
        }
        Op::Unary(u) => match unary(*u, load(inputs[0])?) {
            Some(d) => d,
            None => return Ok(None),
        },
        Op::Where => {
            let c = match load(inputs[0])? {
                Data::I(v) => v,
                Data::F(_) => return Err("where condition is not bool".into()),
            };
            let ic = broadcast_index(inputs[0].shape(), &oshape);
            let a = load(inputs[1])?.pick(&broadcast_index(inputs[1].shape(), &oshape));
            let b = load(inputs[2])?.pick(&broadcast_index(inputs[2].shape(), &oshape));
            match (a, b) {
                (Data::F(a), Data::F(b)) => Data::F(
                    (0..n)
                        .map(|i| if c[ic[i]] != 0 { a[i] } else { b[i] })
                        .collect(),
                ),
                (Data::I(a), Data::I(b)) => Data::I(
                    (0..n)
                        .map(|i| if c[ic[i]] != 0 { a[i] } else { b[i] })
                        .collect(),
                ),
                _ => return Err("where branches of different kinds".into()),
            }
        }
        Op::Clip => {
            let bound = |i: usize| -> Result<Option<Data>, String> {
                match inputs.get(i) {
                    None => Ok(None),
                    Some(t) if t.len() != 1 => Err(format!("clip bound {i} must hold one element")),
                    Some(t) => load(t).map(Some),
                }
            };
            // Comparisons, not f32::max/min, so NaN stays NaN and min > max gives max.
            fn clamp<T: Copy + PartialOrd>(v: Vec<T>, lo: Option<T>, hi: Option<T>) -> Vec<T> {
                v.into_iter()
                    .map(|x| {
                        let y = match lo {
                            Some(l) if x < l => l,
                            _ => x,
                        };
                        match hi {
                            Some(h) if y > h => h,
                            _ => y,
                        }
                    })
                    .collect()
            }
            let (lo, hi) = (bound(1)?, bound(2)?);
            match load(inputs[0])? {
                Data::F(v) => {
                    let f = |b: Option<Data>| match b {
                        Some(Data::F(w)) => Ok(Some(w[0])),
                        None => Ok(None),
                        Some(Data::I(_)) => Err("clip bounds of another dtype".to_string()),
                    };
                    Data::F(clamp(v, f(lo)?, f(hi)?))
                }
                Data::I(v) => {
                    let f = |b: Option<Data>| match b {
                        Some(Data::I(w)) => Ok(Some(w[0])),
                        None => Ok(None),
                        Some(Data::F(_)) => Err("clip bounds of another dtype".to_string()),
                    };
                    Data::I(clamp(v, f(lo)?, f(hi)?))
                }
            }
        }
        Op::Cast { to } => {
            let d = load(inputs[0])?;
            match (d, to.is_float()) {
                (Data::F(v), false) if *to == DType::Bool => {
                    Data::I(v.into_iter().map(|x| i64::from(x != 0.0)).collect())
                }
                (d, _) => d,
            }
        }
        Op::Reshape { .. } | Op::Unsqueeze { .. } | Op::Squeeze { .. } | Op::Flatten { .. } => {
            load(inputs[0])?
        }
        Op::Transpose { perm } => {
            let s = inputs[0].shape();
            let perm: Vec<usize> = if perm.is_empty() {
                (0..s.len()).rev().collect()
            } else {
                perm.iter()
                    .map(|&p| axis(p, s.len()))
                    .collect::<Result<_, _>>()?
            };
            let mut seen = vec![false; s.len()];
            for &p in &perm {
                seen[p] = true;
            }
            let permuted: Vec<usize> = perm.iter().map(|&p| s[p]).collect();
            if perm.len() != s.len() || seen.contains(&false) || permuted != oshape {
                return Err(format!("bad transpose {perm:?} of {s:?} into {oshape:?}"));
            }
            let st = strides(s);
            let ost = strides(&oshape);
            let idx: Vec<usize> = (0..n)
                .map(|flat| {
                    perm.iter()
                        .enumerate()
                        .map(|(k, &p)| ((flat / ost[k]) % oshape[k]) * st[p])
                        .sum()
                })
                .collect();
            load(inputs[0])?.pick(&idx)
        }
        Op::Concat { axis: ax } => {
            let a = axis(*ax, oshape.len())?;
            let mut total = 0;
            for t in inputs {
                let ts = t.shape();
                let same = ts.len() == oshape.len()
                    && ts
                        .iter()
                        .zip(&oshape)
                        .enumerate()
                        .all(|(i, (x, y))| i == a || x == y);
                if !same {
                    return Err(format!("concat of {ts:?} into {oshape:?}"));
                }
                total += ts[a];
            }
            if total != oshape[a] {
                return Err(format!("concat sizes add up to {total}, not {}", oshape[a]));
            }
            let outer: usize = oshape[..a].iter().product();
            let mut parts = Vec::new();
            for t in inputs {
                parts.push((load(t)?, t.shape()[a..].iter().product::<usize>()));
            }
            let mut f = Vec::new();
            let mut iv = Vec::new();
            for o in 0..outer {
                for (d, chunk) in &parts {
                    match d {
                        Data::F(v) => f.extend_from_slice(&v[o * chunk..(o + 1) * chunk]),
                        Data::I(v) => iv.extend_from_slice(&v[o * chunk..(o + 1) * chunk]),
                    }
                }
            }
            if f.is_empty() {
                Data::I(iv)
            } else {
                Data::F(f)
            }
        }
        Op::Gather { axis: ax } => {
            let s = inputs[0].shape();
            let a = axis(*ax, s.len())?;
            let idx = inputs[1].to_i64_vec().map_err(|e| e.to_string())?;
            let outer: usize = s[..a].iter().product();
            let inner: usize = s[a + 1..].iter().product();
            let mut pick = Vec::with_capacity(n);
            for o in 0..outer {
                for &i in &idx {
                    let i = if i < 0 { i + s[a] as i64 } else { i };
                    if i < 0 || i as usize >= s[a] {
                        return Err(format!(
                            "gather index {i} out of range for axis of size {}",
                            s[a]
                        ));
                    }
                    for k in 0..inner {
                        pick.push((o * s[a] + i as usize) * inner + k);
                    }
                }
            }
            load(inputs[0])?.pick(&pick)
        }
        Op::Slice => {
            let s = inputs[0].shape();
            let ints = |i: usize| -> Result<Option<Vec<i64>>, String> {
                inputs
                    .get(i)
                    .map(|t| t.to_i64_vec().map_err(|e| e.to_string()))
                    .transpose()
            };
            let starts = ints(1)?.unwrap_or_default();
            let ends = ints(2)?.unwrap_or_default();
            let axes: Vec<usize> = match ints(3)? {
                Some(v) => v
                    .into_iter()
                    .map(|a| axis(a, s.len()))
                    .collect::<Result<_, _>>()?,
                None => (0..starts.len()).collect(),
            };
            let steps = ints(4)?.unwrap_or_else(|| vec![1; starts.len()]);
            if ends.len() != starts.len()
                || axes.len() != starts.len()
                || steps.len() != starts.len()
            {
                return Err("slice starts, ends, axes and steps differ in length".into());
            }
            let mut first = vec![0i64; s.len()];
            let mut step = vec![1i64; s.len()];
            let mut len: Vec<usize> = s.to_vec();
            for (j, &a) in axes.iter().enumerate() {
                if steps[j] == 0 {
                    return Err("slice step 0".into());
                }
                let d = s[a] as i64;
                let st = if starts[j] < 0 {
                    starts[j].saturating_add(d)
                } else {
                    starts[j]
                };
                first[a] = if steps[j] > 0 {
                    st.clamp(0, d)
                } else {
                    st.max(0).min(d - 1)
                };
                step[a] = steps[j];
                len[a] = crate::shape_infer::slice_len(d, starts[j], ends[j], steps[j])?;
            }
            if len != oshape {
                return Err(format!("slice of {s:?} gives {len:?}, not {oshape:?}"));
            }
            let st = strides(s);
            let ost = strides(&oshape);
            let idx: Vec<usize> = (0..n)
                .map(|flat| {
                    (0..s.len())
                        .map(|k| {
                            ((first[k] + ((flat / ost[k]) % oshape[k]) as i64 * step[k]) as usize)
                                * st[k]
                        })
                        .sum()
                })
                .collect();
            load(inputs[0])?.pick(&idx)
        }
        Op::Tile => {
            let s = inputs[0].shape();
            let reps = load(inputs[1])?;
            let ok = match &reps {
                Data::I(r) => {
                    r.len() == s.len()
                        && s.iter().zip(r).zip(&oshape).all(|((&d, &k), &o)| {
                            usize::try_from(k).ok().and_then(|k| d.checked_mul(k)) == Some(o)
                        })
                }
                Data::F(_) => false,
            };
            if !ok {
                return Err(format!("tile of {s:?} by {reps:?} is not {oshape:?}"));
            }
            // Output coordinate c reads input coordinate c mod dim on every axis.
            let (st, ost) = (strides(s), strides(&oshape));
            let idx: Vec<usize> = (0..n)
                .map(|flat| {
                    (0..s.len())
                        .map(|k| (flat / ost[k]) % oshape[k] % s[k] * st[k])
                        .sum()
                })
                .collect();
            load(inputs[0])?.pick(&idx)
        }
        Op::Expand => load(inputs[0])?.pick(&broadcast_index(inputs[0].shape(), &oshape)),
        Op::ConstantOfShape { value } => match load(value)? {
            Data::F(v) => Data::F(vec![*v.first().ok_or("empty value")?; n]),
            Data::I(v) => Data::I(vec![*v.first().ok_or("empty value")?; n]),
        },
        Op::Range => match (load(inputs[0])?, load(inputs[2])?) {
            (Data::I(a), Data::I(d)) if !a.is_empty() && !d.is_empty() => Data::I(
                (0..n as i64)
                    .map(|i| a[0].wrapping_add(i.wrapping_mul(d[0])))
                    .collect(),
            ),
            (Data::F(a), Data::F(d)) if !a.is_empty() && !d.is_empty() => {
                Data::F((0..n).map(|i| a[0] + i as f32 * d[0]).collect())
            }
            _ => return Err("range operands are empty or of different kinds".into()),
        },
        _ => return Ok(None),
    };
    if data.len() != n {
        return Err(format!(
            "evaluated {} elements for output {out}",
            data.len()
        ));
    }
    Ok(Some(store(out.dtype, oshape, data)))
}

fn binary(b: BinaryOp, x: &Data, y: &Data) -> Result<Data, String> {
    use BinaryOp::*;
    let cmp = |r: Vec<bool>| Data::I(r.into_iter().map(i64::from).collect());
    Ok(match (x, y) {
        (Data::F(x), Data::F(y)) => {
            let z = x.iter().zip(y);
            match b {
                Add => Data::F(z.map(|(a, b)| a + b).collect()),
                Sub => Data::F(z.map(|(a, b)| a - b).collect()),
                Mul => Data::F(z.map(|(a, b)| a * b).collect()),
                Div => Data::F(z.map(|(a, b)| a / b).collect()),
                Pow => Data::F(z.map(|(a, b)| a.powf(*b)).collect()),
                Max => Data::F(z.map(|(a, b)| a.max(*b)).collect()),
                Min => Data::F(z.map(|(a, b)| a.min(*b)).collect()),
                Fmod => Data::F(z.map(|(a, b)| a % b).collect()),
                Mod => return Err("mod of floats needs fmod=1".into()),
                Equal => cmp(z.map(|(a, b)| a == b).collect()),
                Less => cmp(z.map(|(a, b)| a < b).collect()),
                Greater => cmp(z.map(|(a, b)| a > b).collect()),
                LessOrEqual => cmp(z.map(|(a, b)| a <= b).collect()),
                GreaterOrEqual => cmp(z.map(|(a, b)| a >= b).collect()),
                And | Or | Xor => return Err(format!("{} on floats", b.name())),
            }
        }
        (Data::I(x), Data::I(y)) => {
            let z = x.iter().zip(y);
            let checked = |r: Option<Vec<i64>>| {
                r.map(Data::I)
                    .ok_or_else(|| format!("integer {} overflows or divides by zero", b.name()))
            };
            match b {
                Add => checked(z.map(|(a, b)| a.checked_add(*b)).collect())?,
                Sub => checked(z.map(|(a, b)| a.checked_sub(*b)).collect())?,
                Mul => checked(z.map(|(a, b)| a.checked_mul(*b)).collect())?,
                Div => checked(z.map(|(a, b)| a.checked_div(*b)).collect())?,
                Pow => checked(
                    z.map(|(a, b)| u32::try_from(*b).ok().and_then(|e| a.checked_pow(e)))
                        .collect(),
                )?,
                Fmod => checked(z.map(|(a, b)| a.checked_rem(*b)).collect())?,
                Mod => checked(
                    z.map(|(a, b)| {
                        a.checked_rem(*b).map(|r| {
                            if r != 0 && (r < 0) != (*b < 0) {
                                r + b
                            } else {
                                r
                            }
                        })
                    })
                    .collect(),
                )?,
                Max => Data::I(z.map(|(a, b)| *a.max(b)).collect()),
                Min => Data::I(z.map(|(a, b)| *a.min(b)).collect()),
                Equal => cmp(z.map(|(a, b)| a == b).collect()),
                Less => cmp(z.map(|(a, b)| a < b).collect()),
                Greater => cmp(z.map(|(a, b)| a > b).collect()),
                LessOrEqual => cmp(z.map(|(a, b)| a <= b).collect()),
                GreaterOrEqual => cmp(z.map(|(a, b)| a >= b).collect()),
                And => cmp(z.map(|(a, b)| *a != 0 && *b != 0).collect()),
                Or => cmp(z.map(|(a, b)| *a != 0 || *b != 0).collect()),
                Xor => cmp(z.map(|(a, b)| (*a != 0) != (*b != 0)).collect()),
            }
        }
        _ => return Err(format!("{} of a float and an integer", b.name())),
    })
}

fn unary(u: UnaryOp, d: Data) -> Option<Data> {
    use UnaryOp::*;
    let flags =
        |v: Vec<f32>, f: fn(f32) -> bool| Data::I(v.into_iter().map(|x| i64::from(f(x))).collect());
    Some(match d {
        Data::F(v) if u.is_predicate() => match u {
            IsNan => flags(v, f32::is_nan),
            IsInf => flags(v, f32::is_infinite),
            IsPosInf => flags(v, |x| x == f32::INFINITY),
            IsNegInf => flags(v, |x| x == f32::NEG_INFINITY),
            _ => return None,
        },
        Data::F(v) => Data::F(match u {
            Neg => v.into_iter().map(|x| -x).collect(),
            Abs => v.into_iter().map(f32::abs).collect(),
            Sqrt => v.into_iter().map(f32::sqrt).collect(),
            Reciprocal => v.into_iter().map(|x| 1.0 / x).collect(),
            Exp => v.into_iter().map(f32::exp).collect(),
            Log => v.into_iter().map(f32::ln).collect(),
            Tanh => v.into_iter().map(f32::tanh).collect(),
            Sigmoid => v.into_iter().map(|x| 1.0 / (1.0 + (-x).exp())).collect(),
            Relu => v.into_iter().map(|x| x.max(0.0)).collect(),
            Sin => v.into_iter().map(f32::sin).collect(),
            Cos => v.into_iter().map(f32::cos).collect(),
            Round => v.into_iter().map(f32::round_ties_even).collect(),
            Ceil => v.into_iter().map(f32::ceil).collect(),
            Floor => v.into_iter().map(f32::floor).collect(),
            Sign => v.into_iter().map(UnaryOp::sign_f32).collect(),
            RoundToF16 => v
                .into_iter()
                .map(|x| half::f16::from_f32(x).to_f32())
                .collect(),
            RoundToBf16 => v
                .into_iter()
                .map(|x| half::bf16::from_f32(x).to_f32())
                .collect(),
            Erf | Not | IsNan | IsInf | IsPosInf | IsNegInf => return None,
        }),
        Data::I(v) => Data::I(match u {
            Neg => v.into_iter().map(|x| x.wrapping_neg()).collect(),
            Abs => v.into_iter().map(|x| x.wrapping_abs()).collect(),
            Relu => v.into_iter().map(|x| x.max(0)).collect(),
            Sign => v.into_iter().map(i64::signum).collect(),
            Not => v.into_iter().map(|x| i64::from(x == 0)).collect(),
            _ => return None,
        }),
    })
}

//! Elementwise ops with numpy broadcasting: binary, unary, where, cast, GELU.

use ir::{BinaryOp, DType, GeluApprox, UnaryOp};

use super::{broadcast_shape, broadcast_strides, for_each_row, Arena, Ctx, Input};
use crate::value::{Dims, TensorData, TensorValue, ValueElement};
use crate::Error;

/// `out[i] = f(a[..], b[..])` over the broadcast of the two shapes.
fn broadcast2<A: Copy, B: Copy, O: ValueElement>(
    a: &[A],
    ash: &[usize],
    b: &[B],
    bsh: &[usize],
    out_shape: &[usize],
    arena: &mut Arena,
    f: impl Fn(A, B) -> O,
) -> Vec<O> {
    let n: usize = out_shape.iter().product();
    let mut out = arena.vec_with_capacity(n);
    if ash == bsh {
        out.extend(a.iter().zip(b).map(|(&x, &y)| f(x, y)));
        return out;
    }
    if b.len() == 1 {
        let y = b[0];
        out.extend(a.iter().map(|&x| f(x, y)));
        return out;
    }
    if a.len() == 1 {
        let x = a[0];
        out.extend(b.iter().map(|&y| f(x, y)));
        return out;
    }
    let sa = broadcast_strides(ash, out_shape);
    let sb = broadcast_strides(bsh, out_shape);
    let inner = *out_shape.last().unwrap_or(&1);
    let (la, lb) = (*sa.last().unwrap_or(&0), *sb.last().unwrap_or(&0));
    for_each_row(out_shape, [&sa, &sb], |_, [oa, ob]| match (la, lb) {
        (1, 1) => out.extend(
            a[oa..oa + inner]
                .iter()
                .zip(&b[ob..ob + inner])
                .map(|(&x, &y)| f(x, y)),
        ),
        (1, 0) => {
            let y = b[ob];
            out.extend(a[oa..oa + inner].iter().map(|&x| f(x, y)))
        }
        (0, 1) => {
            let x = a[oa];
            out.extend(b[ob..ob + inner].iter().map(|&y| f(x, y)))
        }
        _ => out.extend((0..inner).map(|i| f(a[oa + i * la], b[ob + i * lb]))),
    });
    out
}

/// `acc[i] = f(acc[i], b[..])` where `acc` already has the output shape.
fn broadcast2_inplace_left(
    acc: &mut [f32],
    out_shape: &[usize],
    b: &[f32],
    bsh: &[usize],
    f: impl Fn(f32, f32) -> f32,
) {
    if bsh == out_shape {
        acc.iter_mut().zip(b).for_each(|(x, &y)| *x = f(*x, y));
        return;
    }
    if b.len() == 1 {
        let y = b[0];
        acc.iter_mut().for_each(|x| *x = f(*x, y));
        return;
    }
    let sb = broadcast_strides(bsh, out_shape);
    let sa = super::strides_of(out_shape);
    let inner = *out_shape.last().unwrap_or(&1);
    let lb = *sb.last().unwrap_or(&0);
    for_each_row(out_shape, [&sa, &sb], |o, [_, ob]| {
        let row = &mut acc[o..o + inner];
        if lb == 1 {
            row.iter_mut()
                .zip(&b[ob..ob + inner])
                .for_each(|(x, &y)| *x = f(*x, y));
        } else {
            let y = b[ob];
            row.iter_mut().for_each(|x| *x = f(*x, y));
        }
    });
}

fn pow_f32(x: f32, y: f32) -> f32 {
    // Exports write x² as Pow(x, 2): keep it exact and cheap.
    if y == 2.0 {
        x * x
    } else if y == 0.5 {
        x.sqrt()
    } else if y == 1.0 {
        x
    } else {
        x.powf(y)
    }
}

/// `$call` with `$f` bound to the f32 function of `op` (a closure of its own type, so that each
/// loop is compiled for its op and the function inlined: through a function pointer, an
/// embedding sum cost a call per element), or `$none` when `op` has no f32 function.
macro_rules! with_f32_fn {
    ($op:expr, |$f:ident| $call:expr, $none:expr) => {
        match $op {
            BinaryOp::Add => {
                let $f = |x: f32, y: f32| x + y;
                $call
            }
            BinaryOp::Sub => {
                let $f = |x: f32, y: f32| x - y;
                $call
            }
            BinaryOp::Mul => {
                let $f = |x: f32, y: f32| x * y;
                $call
            }
            BinaryOp::Div => {
                let $f = |x: f32, y: f32| x / y;
                $call
            }
            BinaryOp::Pow => {
                let $f = pow_f32;
                $call
            }
            // Rust's `%` on floats is C's fmod: the sign of the dividend.
            BinaryOp::Fmod => {
                let $f = |x: f32, y: f32| x % y;
                $call
            }
            BinaryOp::Max => {
                let $f = |x: f32, y: f32| if x.is_nan() || x >= y { x } else { y };
                $call
            }
            BinaryOp::Min => {
                let $f = |x: f32, y: f32| if x.is_nan() || x <= y { x } else { y };
                $call
            }
            _ => $none,
        }
    };
}

/// Whether `op` has an f32 function (see [`with_f32_fn`]).
fn has_f32_fn(op: BinaryOp) -> bool {
    with_f32_fn!(
        op,
        |f| {
            let _ = f;
            true
        },
        false
    )
}

macro_rules! int_arith {
    ($op:expr, $a:expr, $ash:expr, $b:expr, $bsh:expr, $out:expr, $arena:expr, $t:ty, $node:expr) => {{
        let (a, b): (&[$t], &[$t]) = ($a, $b);
        match $op {
            BinaryOp::Add => broadcast2(a, $ash, b, $bsh, $out, &mut *$arena, |x: $t, y: $t| {
                x.wrapping_add(y)
            }),
            BinaryOp::Sub => broadcast2(a, $ash, b, $bsh, $out, &mut *$arena, |x: $t, y: $t| {
                x.wrapping_sub(y)
            }),
            BinaryOp::Mul => broadcast2(a, $ash, b, $bsh, $out, &mut *$arena, |x: $t, y: $t| {
                x.wrapping_mul(y)
            }),
            BinaryOp::Max => broadcast2(a, $ash, b, $bsh, $out, &mut *$arena, |x: $t, y: $t| {
                x.max(y)
            }),
            BinaryOp::Min => broadcast2(a, $ash, b, $bsh, $out, &mut *$arena, |x: $t, y: $t| {
                x.min(y)
            }),
            BinaryOp::Div => {
                if b.contains(&0) {
                    return Err(Error::op($node, "div", "integer division by zero"));
                }
                // Truncating division, as onnxruntime's integer Div.
                broadcast2(a, $ash, b, $bsh, $out, &mut *$arena, |x: $t, y: $t| {
                    x.wrapping_div(y)
                })
            }
            BinaryOp::Mod | BinaryOp::Fmod => {
                if b.contains(&0) {
                    return Err(Error::op($node, $op.name(), "integer modulo by zero"));
                }
                if $op == BinaryOp::Fmod {
                    broadcast2(a, $ash, b, $bsh, $out, &mut *$arena, |x: $t, y: $t| {
                        x.wrapping_rem(y)
                    })
                } else {
                    // The remainder takes the divisor's sign, as Python's `%`.
                    broadcast2(a, $ash, b, $bsh, $out, &mut *$arena, |x: $t, y: $t| {
                        let r = x.wrapping_rem(y);
                        if r != 0 && ((r < 0 as $t) != (y < 0 as $t)) {
                            r.wrapping_add(y)
                        } else {
                            r
                        }
                    })
                }
            }
            BinaryOp::Pow => broadcast2(a, $ash, b, $bsh, $out, &mut *$arena, |x: $t, y: $t| {
                if y < 0 as $t {
                    0 as $t
                } else {
                    x.wrapping_pow(y as u32)
                }
            }),
            _ => unreachable!("arithmetic ops only"),
        }
    }};
}

macro_rules! compare {
    ($op:expr, $a:expr, $ash:expr, $b:expr, $bsh:expr, $out:expr, $arena:expr) => {{
        let (a, b) = ($a, $b);
        match $op {
            BinaryOp::Equal => broadcast2(a, $ash, b, $bsh, $out, &mut *$arena, |x, y| x == y),
            BinaryOp::Less => broadcast2(a, $ash, b, $bsh, $out, &mut *$arena, |x, y| x < y),
            BinaryOp::Greater => broadcast2(a, $ash, b, $bsh, $out, &mut *$arena, |x, y| x > y),
            BinaryOp::LessOrEqual => {
                broadcast2(a, $ash, b, $bsh, $out, &mut *$arena, |x, y| x <= y)
            }
            BinaryOp::GreaterOrEqual => {
                broadcast2(a, $ash, b, $bsh, $out, &mut *$arena, |x, y| x >= y)
            }
            _ => unreachable!("comparisons only"),
        }
    }};
}

/// A binary elementwise op. `a` or `b` may be handed over owned (last use), in which case an
/// f32 result is computed in its buffer.
///
/// An owned operand may become the result (in place); what is left in `a` and `b` afterwards
/// (an owned operand not reused) is the caller's to recycle.
pub(crate) fn binary(
    op: BinaryOp,
    a: &mut Input<'_>,
    b: &mut Input<'_>,
    ctx: &mut Ctx<'_>,
    node: &str,
) -> Result<TensorValue, Error> {
    /// Moves an owned operand out, leaving an empty placeholder.
    fn take_owned(i: &mut Input<'_>) -> TensorValue {
        std::mem::replace(i, Input::Own(TensorValue::placeholder())).into_owned()
    }
    let name = op.name();
    let (ash, bsh) = (
        Dims::from_slice(a.get().shape()),
        Dims::from_slice(b.get().shape()),
    );
    let out_shape = broadcast_shape(&ash, &bsh).ok_or_else(|| {
        Error::op(
            node,
            name,
            format!("shapes {ash:?} and {bsh:?} do not broadcast"),
        )
    })?;
    if a.get().dtype() != b.get().dtype() {
        return Err(Error::op(
            node,
            name,
            format!(
                "operands have different dtypes {} and {}",
                a.get().dtype(),
                b.get().dtype()
            ),
        ));
    }
    let is_cmp = matches!(
        op,
        BinaryOp::Equal
            | BinaryOp::Less
            | BinaryOp::Greater
            | BinaryOp::LessOrEqual
            | BinaryOp::GreaterOrEqual
    );
    let is_logic = matches!(op, BinaryOp::And | BinaryOp::Or | BinaryOp::Xor);
    // In place on an owned f32 operand that already has the output shape.
    if has_f32_fn(op) && a.get().dtype() == DType::F32 {
        let commutative = matches!(
            op,
            BinaryOp::Add | BinaryOp::Mul | BinaryOp::Max | BinaryOp::Min
        );
        // The accumulator and the other operand with its shape; a commutative op lets the
        // owned right operand take the accumulator role.
        let roles = if a.is_owned() && ash == out_shape {
            Some((take_owned(a), b.get(), &bsh))
        } else if commutative && b.is_owned() && bsh == out_shape {
            Some((take_owned(b), a.get(), &ash))
        } else {
            None
        };
        if let Some((mut acc, other, other_shape)) = roles {
            let ov = other.typed::<f32>()?;
            let buf = acc.typed_mut::<f32>().expect("checked f32");
            let inner = out_shape.last().copied().unwrap_or(1);
            if *other_shape == out_shape && inner > 0 {
                // Same shapes (an embedding sum, a residual): rows on the session's threads.
                with_f32_fn!(
                    op,
                    |f| ctx.par_rows_mut(buf, inner, |r0, block| {
                        let ys = &ov[r0 * inner..][..block.len()];
                        block.iter_mut().zip(ys).for_each(|(x, &y)| *x = f(*x, y));
                    }),
                    ()
                );
            } else {
                with_f32_fn!(
                    op,
                    |f| broadcast2_inplace_left(buf, &out_shape, ov, other_shape, f),
                    ()
                );
            }
            return Ok(acc);
        }
    }
    let arena = &mut *ctx.arena;
    let (ad, bd) = (a.get().data(), b.get().data());
    // Comparisons, or wrapping arithmetic at the type's own width; no logic ops on integers.
    macro_rules! int_binary {
        ($v:ident, $t:ty, $x:expr, $y:expr) => {{
            if is_cmp {
                TensorData::Bool(compare!(op, $x, &ash, $y, &bsh, &out_shape, arena))
            } else if is_logic {
                return Err(bad_dtype(op, DType::$v, node));
            } else {
                TensorData::$v(int_arith!(
                    op, $x, &ash, $y, &bsh, &out_shape, arena, $t, node
                ))
            }
        }};
    }
    let data = match (ad, bd) {
        (TensorData::F32(x), TensorData::F32(y)) => {
            if has_f32_fn(op) {
                with_f32_fn!(
                    op,
                    |f| TensorData::F32(broadcast2(x, &ash, y, &bsh, &out_shape, arena, f)),
                    unreachable!("has an f32 function")
                )
            } else if is_cmp {
                TensorData::Bool(compare!(op, x, &ash, y, &bsh, &out_shape, arena))
            } else {
                return Err(bad_dtype(op, DType::F32, node));
            }
        }
        (TensorData::Bool(x), TensorData::Bool(y)) => match op {
            BinaryOp::And => {
                TensorData::Bool(broadcast2(x, &ash, y, &bsh, &out_shape, arena, |p, q| {
                    p & q
                }))
            }
            BinaryOp::Or => {
                TensorData::Bool(broadcast2(x, &ash, y, &bsh, &out_shape, arena, |p, q| {
                    p | q
                }))
            }
            BinaryOp::Xor => {
                TensorData::Bool(broadcast2(x, &ash, y, &bsh, &out_shape, arena, |p, q| {
                    p ^ q
                }))
            }
            BinaryOp::Equal => {
                TensorData::Bool(broadcast2(x, &ash, y, &bsh, &out_shape, arena, |p, q| {
                    p == q
                }))
            }
            _ => return Err(bad_dtype(op, DType::Bool, node)),
        },
        (TensorData::I64(x), TensorData::I64(y)) => int_binary!(I64, i64, x, y),
        (TensorData::I32(x), TensorData::I32(y)) => int_binary!(I32, i32, x, y),
        (TensorData::I8(x), TensorData::I8(y)) => int_binary!(I8, i8, x, y),
        (TensorData::U8(x), TensorData::U8(y)) => int_binary!(U8, u8, x, y),
        (TensorData::I16(x), TensorData::I16(y)) => int_binary!(I16, i16, x, y),
        (TensorData::U16(x), TensorData::U16(y)) => int_binary!(U16, u16, x, y),
        (TensorData::U32(x), TensorData::U32(y)) => int_binary!(U32, u32, x, y),
        (TensorData::U64(x), TensorData::U64(y)) => int_binary!(U64, u64, x, y),
        (d, _) => return Err(bad_dtype(op, d.dtype(), node)),
    };
    Ok(TensorValue::raw_data(out_shape, data))
}

fn bad_dtype(op: BinaryOp, d: DType, node: &str) -> Error {
    Error::op(node, op.name(), format!("not defined on {d}"))
}

/// Accurate erf: musl's `erff` (error under 1 ulp), so GELU matches an f64 evaluation to ~1e-7.
#[inline]
pub(crate) fn erf(x: f32) -> f32 {
    libm::erff(x)
}

fn sigmoid(x: f32) -> f32 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// Applies an f32 function elementwise, in the input's buffer when it is owned, split across
/// threads for large tensors.
fn map_f32(
    x: Input<'_>,
    ctx: &Ctx<'_>,
    f: impl Fn(f32) -> f32 + Sync,
) -> Result<TensorValue, Error> {
    let shape = Dims::from_slice(x.get().shape());
    let mut out = if x.is_owned() {
        x.into_owned()
    } else {
        let src = x.get().typed::<f32>()?;
        TensorValue::raw(shape.clone(), src.to_vec())
    };
    let actual = out.dtype();
    let buf = out.typed_mut::<f32>().ok_or(Error::DType {
        expected: DType::F32,
        actual,
    })?;
    let row = (*shape.last().unwrap_or(&1)).max(1);
    ctx.par_rows_mut(buf, row, |_, block| {
        block.iter_mut().for_each(|v| *v = f(*v))
    });
    Ok(out)
}

/// GELU over an f32 tensor, in place when the input is owned.
pub(crate) fn gelu(
    approx: GeluApprox,
    x: Input<'_>,
    ctx: &Ctx<'_>,
    node: &str,
) -> Result<TensorValue, Error> {
    if x.get().dtype() != DType::F32 {
        return Err(Error::op(
            node,
            "gelu",
            format!("expects f32, got {}", x.get().dtype()),
        ));
    }
    let row = (*x.get().shape().last().unwrap_or(&1)).max(1);
    let mut out = x.into_owned();
    let buf = out.typed_mut::<f32>().expect("checked f32");
    match approx {
        GeluApprox::Erf => ctx.par_rows_mut(buf, row, |_, b| super::simd::gelu_erf_inplace(b)),
        GeluApprox::Tanh => ctx.par_rows_mut(buf, row, |_, b| super::simd::gelu_tanh_inplace(b)),
    }
    Ok(out)
}

/// A unary elementwise op.
pub(crate) fn unary(
    op: UnaryOp,
    x: Input<'_>,
    ctx: &Ctx<'_>,
    node: &str,
) -> Result<TensorValue, Error> {
    let dt = x.get().dtype();
    let bad = || Error::op(node, op.name(), format!("not defined on {dt}"));
    if dt == DType::F32 && op.is_predicate() && op != UnaryOp::Not {
        let test: fn(f32) -> bool = match op {
            UnaryOp::IsNan => f32::is_nan,
            UnaryOp::IsInf => f32::is_infinite,
            UnaryOp::IsPosInf => |v| v == f32::INFINITY,
            _ => |v| v == f32::NEG_INFINITY,
        };
        let v = x.get().typed::<f32>()?;
        return Ok(TensorValue::raw(
            Dims::from_slice(x.get().shape()),
            v.iter().map(|&e| test(e)).collect(),
        ));
    }
    match dt {
        DType::F32 => {
            let f: fn(f32) -> f32 = match op {
                UnaryOp::Neg => |v| -v,
                UnaryOp::Abs => f32::abs,
                UnaryOp::Sqrt => f32::sqrt,
                UnaryOp::Reciprocal => |v| 1.0 / v,
                UnaryOp::Exp => f32::exp,
                UnaryOp::Log => f32::ln,
                UnaryOp::Erf => erf,
                UnaryOp::Tanh => f32::tanh,
                UnaryOp::Sigmoid => sigmoid,
                UnaryOp::Relu => |v| v.max(0.0),
                UnaryOp::Sin => f32::sin,
                UnaryOp::Cos => f32::cos,
                UnaryOp::Round => f32::round_ties_even,
                UnaryOp::Ceil => f32::ceil,
                UnaryOp::Floor => f32::floor,
                UnaryOp::Sign => UnaryOp::sign_f32,
                UnaryOp::RoundToF16 => |v| half::f16::from_f32(v).to_f32(),
                UnaryOp::RoundToBf16 => |v| half::bf16::from_f32(v).to_f32(),
                UnaryOp::Not
                | UnaryOp::IsNan
                | UnaryOp::IsInf
                | UnaryOp::IsPosInf
                | UnaryOp::IsNegInf => return Err(bad()),
            };
            map_f32(x, ctx, f)
        }
        DType::Bool => match op {
            UnaryOp::Not => {
                let v = x.get().typed::<bool>()?;
                Ok(TensorValue::raw(
                    Dims::from_slice(x.get().shape()),
                    v.iter().map(|b| !b).collect(),
                ))
            }
            _ => Err(bad()),
        },
        DType::I64 | DType::I32 | DType::I8 | DType::I16 => {
            let t = x.get();
            let shape = Dims::from_slice(t.shape());
            let data = match (op, t.data()) {
                (UnaryOp::Neg, TensorData::I64(v)) => {
                    TensorData::I64(v.iter().map(|a| a.wrapping_neg()).collect())
                }
                (UnaryOp::Abs, TensorData::I64(v)) => {
                    TensorData::I64(v.iter().map(|a| a.wrapping_abs()).collect())
                }
                (UnaryOp::Relu, TensorData::I64(v)) => {
                    TensorData::I64(v.iter().map(|&a| a.max(0)).collect())
                }
                (UnaryOp::Sign, TensorData::I64(v)) => {
                    TensorData::I64(v.iter().map(|a| a.signum()).collect())
                }
                (UnaryOp::Neg, TensorData::I32(v)) => {
                    TensorData::I32(v.iter().map(|a| a.wrapping_neg()).collect())
                }
                (UnaryOp::Abs, TensorData::I32(v)) => {
                    TensorData::I32(v.iter().map(|a| a.wrapping_abs()).collect())
                }
                (UnaryOp::Relu, TensorData::I32(v)) => {
                    TensorData::I32(v.iter().map(|&a| a.max(0)).collect())
                }
                (UnaryOp::Sign, TensorData::I32(v)) => {
                    TensorData::I32(v.iter().map(|a| a.signum()).collect())
                }
                (UnaryOp::Neg, TensorData::I8(v)) => {
                    TensorData::I8(v.iter().map(|a| a.wrapping_neg()).collect())
                }
                (UnaryOp::Abs, TensorData::I8(v)) => {
                    TensorData::I8(v.iter().map(|a| a.wrapping_abs()).collect())
                }
                (UnaryOp::Sign, TensorData::I8(v)) => {
                    TensorData::I8(v.iter().map(|a| a.signum()).collect())
                }
                (UnaryOp::Neg, TensorData::I16(v)) => {
                    TensorData::I16(v.iter().map(|a| a.wrapping_neg()).collect())
                }
                (UnaryOp::Abs, TensorData::I16(v)) => {
                    TensorData::I16(v.iter().map(|a| a.wrapping_abs()).collect())
                }
                (UnaryOp::Sign, TensorData::I16(v)) => {
                    TensorData::I16(v.iter().map(|a| a.signum()).collect())
                }
                _ => return Err(bad()),
            };
            Ok(TensorValue::raw_data(shape, data))
        }
        _ => Err(bad()),
    }
}

fn where_typed<T: Copy>(
    c: &[bool],
    csh: &[usize],
    a: &[T],
    ash: &[usize],
    b: &[T],
    bsh: &[usize],
    out: &[usize],
) -> Vec<T> {
    let n: usize = out.iter().product();
    let mut res = Vec::with_capacity(n);
    let (sc, sa, sb) = (
        broadcast_strides(csh, out),
        broadcast_strides(ash, out),
        broadcast_strides(bsh, out),
    );
    let inner = *out.last().unwrap_or(&1);
    let (lc, la, lb) = (
        *sc.last().unwrap_or(&0),
        *sa.last().unwrap_or(&0),
        *sb.last().unwrap_or(&0),
    );
    for_each_row(out, [&sc, &sa, &sb], |_, [oc, oa, ob]| {
        res.extend((0..inner).map(|i| {
            if c[oc + i * lc] {
                a[oa + i * la]
            } else {
                b[ob + i * lb]
            }
        }))
    });
    res
}

/// `where(cond, a, b)` with three-way broadcasting.
/// The condition of a `Select` (an ONNX `If`): one bool.
pub(crate) fn select_condition(c: &TensorValue, node: &str) -> Result<bool, Error> {
    match c.as_bool() {
        Some([c]) => Ok(*c),
        Some(v) => Err(Error::op(
            node,
            "select",
            format!("the condition must hold one element, holds {}", v.len()),
        )),
        None => Err(Error::op(
            node,
            "select",
            format!("the condition must be bool, got {}", c.dtype()),
        )),
    }
}

pub(crate) fn where_op(
    c: &TensorValue,
    a: &TensorValue,
    b: &TensorValue,
    node: &str,
) -> Result<TensorValue, Error> {
    let cv = c.as_bool().ok_or_else(|| {
        Error::op(
            node,
            "where",
            format!("condition must be bool, got {}", c.dtype()),
        )
    })?;
    let out = broadcast_shape(c.shape(), a.shape())
        .and_then(|s| broadcast_shape(&s, b.shape()))
        .ok_or_else(|| {
            Error::op(
                node,
                "where",
                format!(
                    "shapes {:?}, {:?}, {:?} do not broadcast",
                    c.shape(),
                    a.shape(),
                    b.shape()
                ),
            )
        })?;
    let (cs, as_, bs) = (c.shape(), a.shape(), b.shape());
    if a.dtype() != b.dtype() {
        return Err(Error::op(
            node,
            "where",
            format!(
                "branches have different dtypes {} and {}",
                a.dtype(),
                b.dtype()
            ),
        ));
    }
    let data = crate::map_data!(a.data(), x => {
        let y = ValueElement::slice(b.data()).expect("checked: same dtype");
        where_typed(cv, cs, x, as_, y, bs, &out)
    });
    Ok(TensorValue::raw_data(out, data))
}

/// Conversion of one element type to another with `as` semantics: float to integer truncates
/// toward zero and saturates, anything to bool is `!= 0`.
trait CastTo<T> {
    fn cast(self) -> T;
}
macro_rules! cast_num {
    ($($from:ty),*) => {$(
        impl CastTo<f32> for $from { fn cast(self) -> f32 { self as f32 } }
        impl CastTo<i64> for $from { fn cast(self) -> i64 { self as i64 } }
        impl CastTo<i32> for $from { fn cast(self) -> i32 { self as i32 } }
        impl CastTo<i8> for $from { fn cast(self) -> i8 { self as i8 } }
        impl CastTo<u8> for $from { fn cast(self) -> u8 { self as u8 } }
        impl CastTo<i16> for $from { fn cast(self) -> i16 { self as i16 } }
        impl CastTo<u16> for $from { fn cast(self) -> u16 { self as u16 } }
        impl CastTo<u32> for $from { fn cast(self) -> u32 { self as u32 } }
        impl CastTo<u64> for $from { fn cast(self) -> u64 { self as u64 } }
        impl CastTo<bool> for $from { fn cast(self) -> bool { self != (0 as $from) } }
    )*};
}
cast_num!(f32, i64, i32, i8, u8, i16, u16, u32, u64);
impl<T> CastTo<T> for bool
where
    u8: CastTo<T>,
{
    fn cast(self) -> T {
        (self as u8).cast()
    }
}

fn cast_vec<S: Copy + CastTo<T>, T: ValueElement>(v: &[S], arena: &mut Arena) -> TensorData {
    let mut out = arena.vec_with_capacity(v.len());
    out.extend(v.iter().map(|&x| x.cast()));
    T::wrap(out)
}

fn cast_to<T: ValueElement>(d: &TensorData, arena: &mut Arena) -> TensorData
where
    f32: CastTo<T>,
    i64: CastTo<T>,
    i32: CastTo<T>,
    i8: CastTo<T>,
    u8: CastTo<T>,
    i16: CastTo<T>,
    u16: CastTo<T>,
    u32: CastTo<T>,
    u64: CastTo<T>,
    bool: CastTo<T>,
{
    crate::value::with_tensor_data!(d, v => cast_vec(v, arena))
}

/// `cast[to]`.
pub(crate) fn cast(
    x: Input<'_>,
    to: DType,
    arena: &mut Arena,
    node: &str,
) -> Result<TensorValue, Error> {
    if x.get().dtype() == to {
        return Ok(x.into_owned_in(arena));
    }
    let t = x.get();
    let data = match to {
        DType::F32 => cast_to::<f32>(t.data(), arena),
        DType::I64 => cast_to::<i64>(t.data(), arena),
        DType::I32 => cast_to::<i32>(t.data(), arena),
        DType::I8 => cast_to::<i8>(t.data(), arena),
        DType::U8 => cast_to::<u8>(t.data(), arena),
        DType::I16 => cast_to::<i16>(t.data(), arena),
        DType::U16 => cast_to::<u16>(t.data(), arena),
        DType::U32 => cast_to::<u32>(t.data(), arena),
        DType::U64 => cast_to::<u64>(t.data(), arena),
        DType::Bool => cast_to::<bool>(t.data(), arena),
        DType::BF16 => {
            return Err(Error::op(
                node,
                "cast",
                "bf16 is not supported by the interpreter",
            ))
        }
    };
    let out = TensorValue::raw_data(t.shape(), data);
    if let Input::Own(t) = x {
        arena.recycle(t);
    }
    Ok(out)
}

/// `max(x, lo)` then `min(·, hi)` by comparisons, so a NaN element stays NaN (`f32::max` would
/// replace it) and `lo > hi` gives `hi`, as numpy's `clip`.
fn clip_typed<T: Copy + PartialOrd>(v: &[T], lo: Option<T>, hi: Option<T>) -> Vec<T> {
    v.iter()
        .map(|&x| {
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

/// `clip(x, min?, max?)`: the bounds are one-element tensors of x's dtype.
pub(crate) fn clip(
    x: &TensorValue,
    lo: Option<&TensorValue>,
    hi: Option<&TensorValue>,
    node: &str,
) -> Result<TensorValue, Error> {
    for (what, b) in [("min", lo), ("max", hi)] {
        if let Some(b) = b {
            if b.len() != 1 {
                return Err(Error::op(
                    node,
                    "clip",
                    format!("{what} must hold one element, has shape {:?}", b.shape()),
                ));
            }
            if b.dtype() != x.dtype() {
                return Err(Error::op(
                    node,
                    "clip",
                    format!("{what} is {}, the input is {}", b.dtype(), x.dtype()),
                ));
            }
        }
    }
    macro_rules! go {
        ($v:expr, $variant:ident) => {{
            let first = |b: Option<&TensorValue>| match b.map(|b| b.data()) {
                Some(TensorData::$variant(w)) => Some(w[0]),
                _ => None,
            };
            TensorData::$variant(clip_typed($v, first(lo), first(hi)))
        }};
    }
    let data = match x.data() {
        TensorData::F32(v) => go!(v, F32),
        TensorData::I64(v) => go!(v, I64),
        TensorData::I32(v) => go!(v, I32),
        TensorData::I8(v) => go!(v, I8),
        TensorData::U8(v) => go!(v, U8),
        TensorData::I16(v) => go!(v, I16),
        TensorData::U16(v) => go!(v, U16),
        TensorData::U32(v) => go!(v, U32),
        TensorData::U64(v) => go!(v, U64),
        TensorData::Bool(_) => {
            return Err(Error::op(node, "clip", "not defined on bool"));
        }
    };
    Ok(TensorValue::raw_data(Dims::from_slice(x.shape()), data))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An in-place sum of same shapes on two threads (the embedding sum, rows split between
    /// them) equals the one-thread sum, and the one of borrowed operands; a broadcast one too.
    #[test]
    fn in_place_sums_on_threads_equal_one_thread() {
        let (rows, w) = (301usize, 768usize);
        let x: Vec<f32> = (0..rows * w)
            .map(|v| (v % 977) as f32 * 0.37 - 100.0)
            .collect();
        let y: Vec<f32> = (0..rows * w)
            .map(|v| (v % 613) as f32 * -0.11 + 7.0)
            .collect();
        let bias: Vec<f32> = (0..w).map(|v| v as f32 * 0.01).collect();
        let t = |v: &[f32], shape: Vec<usize>| TensorValue::from_f32(shape, v.to_vec()).unwrap();
        let mut sums = Vec::new();
        for (threads, owned) in [(1, true), (2, true), (2, false)] {
            let mut arena = Arena::default();
            let mut ctx = Ctx {
                threads,
                arena: &mut arena,
            };
            let (xt, yt) = (t(&x, vec![1, rows, w]), t(&y, vec![1, rows, w]));
            let mut a = if owned {
                Input::Own(xt.clone())
            } else {
                Input::Ref(&xt)
            };
            let mut b = Input::Ref(&yt);
            let s = binary(BinaryOp::Add, &mut a, &mut b, &mut ctx, "add").unwrap();
            let bt = t(&bias, vec![w]);
            let mut a = Input::Own(s.clone());
            let mut b = Input::Ref(&bt);
            let s2 = binary(BinaryOp::Sub, &mut a, &mut b, &mut ctx, "sub").unwrap();
            assert_eq!(s.shape(), &[1, rows, w]);
            sums.push((s.into_vec::<f32>().unwrap(), s2.into_vec::<f32>().unwrap()));
        }
        let want: Vec<f32> = x.iter().zip(&y).map(|(a, b)| a + b).collect();
        let want2: Vec<f32> = want
            .iter()
            .enumerate()
            .map(|(i, v)| v - bias[i % w])
            .collect();
        for (s, s2) in &sums {
            assert_eq!(s, &want);
            assert_eq!(s2, &want2);
        }
    }

    #[test]
    fn erf_is_accurate() {
        // Against an f64 reference series/continued fraction would be long; use known values.
        let cases = [
            (0.5f64, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (-1.5, -0.966_105_146_475_310_7),
            (2.5, 0.999_593_047_982_555),
            (0.01, 0.011_283_415_555_849_62),
        ];
        for (x, want) in cases {
            let got = erf(x as f32) as f64;
            assert!((got - want).abs() < 1e-7, "erf({x}) = {got}, want {want}");
        }
    }

    #[test]
    fn broadcast_kernel() {
        let a = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let b = [10.0f32, 20.0];
        let out = broadcast2(
            &a,
            &[3, 2],
            &b,
            &[2],
            &[3, 2],
            &mut Arena::default(),
            |x, y| x + y,
        );
        assert_eq!(out, vec![11.0, 22.0, 13.0, 24.0, 15.0, 26.0]);
        let c = [100.0f32, 200.0, 300.0];
        let out = broadcast2(
            &a,
            &[3, 2],
            &c,
            &[3, 1],
            &[3, 2],
            &mut Arena::default(),
            |x, y| x + y,
        );
        assert_eq!(out, vec![101.0, 102.0, 203.0, 204.0, 305.0, 306.0]);
        let mut acc = a;
        broadcast2_inplace_left(&mut acc, &[3, 2], &c, &[3, 1], |x, y| x - y);
        assert_eq!(acc, [-99.0, -98.0, -197.0, -196.0, -295.0, -294.0]);
    }
}

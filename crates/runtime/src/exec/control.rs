//! Control flow: [`ir::Op::Loop`], its iterations driven by the values of the run.

use ir::{DType, LoopParts, TensorType};

use crate::value::{with_tensor_data, TensorData, TensorValue, ValueElement};
use crate::Error;

/// What a loop needs to know of its body besides running it: how its inputs and outputs
/// divide, the names its inputs are fed by, and the types of its scan outputs (an empty stack,
/// when no iteration ran, takes its dtype and, where fixed, its shape from them).
pub(crate) struct LoopBody<'a> {
    pub parts: LoopParts,
    pub input_names: &'a [String],
    pub scan_types: &'a [TensorType],
}

/// Runs one iteration of a body: its named inputs in, its outputs in order out.
pub(crate) type RunBody<'a> =
    dyn FnMut(&[(&str, &TensorValue)]) -> Result<Vec<TensorValue>, Error> + 'a;

/// Runs a loop on the node's inputs `(trip_count, cond, initial…, captured…)`: `run_body`
/// takes the body's named inputs and returns its outputs in order. Returns the carried values
/// after the last iteration, then the stacked scan outputs.
///
/// The model decides how long it runs (the trip count and the body's condition, as ONNX
/// says); nothing else bounds it. A trip count or condition that is not one element, a negative
/// trip count, a body condition that is not one bool, a carried value that comes back with
/// another dtype, or a scan output that changes shape are errors naming the node.
pub(crate) fn run_loop(
    body: &LoopBody<'_>,
    ins: &[&TensorValue],
    run_body: &mut RunBody<'_>,
    node: &str,
) -> Result<Vec<TensorValue>, Error> {
    let err = |message: String| Error::op(node, "loop", message);
    let parts = body.parts;
    let trip_count = match ins[0].as_i64() {
        Some(&[m]) if m >= 0 => m,
        Some(&[m]) => return Err(err(format!("the trip count is {m}, negative"))),
        _ => {
            return Err(err(format!(
                "the trip count must be one i64, got {}{:?}",
                ins[0].dtype(),
                ins[0].shape()
            )))
        }
    };
    let mut cond = one_bool(ins[1]).ok_or_else(|| {
        err(format!(
            "the condition must be one bool, got {}{:?}",
            ins[1].dtype(),
            ins[1].shape()
        ))
    })?;
    let mut carried: Vec<TensorValue> = ins[2..2 + parts.carried]
        .iter()
        .map(|&t| t.clone())
        .collect();
    let captured = &ins[2 + parts.carried..];
    let mut scans: Vec<Vec<TensorValue>> = (0..parts.scans).map(|_| Vec::new()).collect();
    let mut i = 0i64;
    while i < trip_count && cond {
        let outs = {
            let (iter, c) = (TensorValue::scalar(i), TensorValue::scalar(cond));
            let values = [&iter, &c]
                .into_iter()
                .chain(carried.iter())
                .chain(captured.iter().copied());
            let feeds: Vec<(&str, &TensorValue)> = body
                .input_names
                .iter()
                .map(String::as_str)
                .zip(values)
                .collect();
            run_body(&feeds).map_err(|e| err(format!("iteration {i}: {e}")))?
        };
        if outs.len() != 1 + parts.carried + parts.scans {
            return Err(err(format!(
                "iteration {i}: the body gave {} values, the loop reads {}",
                outs.len(),
                1 + parts.carried + parts.scans
            )));
        }
        let mut outs = outs.into_iter();
        let c = outs.next().expect("counted above");
        cond = one_bool(&c).ok_or_else(|| {
            err(format!(
                "iteration {i}: the body's condition must be one bool, got {}{:?}",
                c.dtype(),
                c.shape()
            ))
        })?;
        for (j, v) in carried.iter_mut().enumerate() {
            let next = outs.next().expect("counted above");
            if next.dtype() != v.dtype() {
                return Err(err(format!(
                    "iteration {i}: carried value {j} went in as {} and came back as {}",
                    v.dtype(),
                    next.dtype()
                )));
            }
            *v = next;
        }
        for (k, stack) in scans.iter_mut().enumerate() {
            let next = outs.next().expect("counted above");
            if let Some(first) = stack.first() {
                if next.dtype() != first.dtype() || next.shape() != first.shape() {
                    return Err(err(format!(
                        "iteration {i}: scan output {k} is {}{:?}, the first iteration gave {}{:?}",
                        next.dtype(),
                        next.shape(),
                        first.dtype(),
                        first.shape()
                    )));
                }
            }
            stack.push(next);
        }
        i += 1;
    }
    let mut out = carried;
    for (stack, ty) in scans.into_iter().zip(body.scan_types) {
        out.push(stack_along_new_axis(stack, ty, node)?);
    }
    Ok(out)
}

fn one_bool(t: &TensorValue) -> Option<bool> {
    match t.as_bool()? {
        &[b] => Some(b),
        _ => None,
    }
}

/// The values (all of one dtype and shape) stacked along a new axis 0. With no values, an
/// empty tensor of the body's type for them: `[0, dims…]` when its dims are fixed, else `[0]`.
fn stack_along_new_axis(
    stack: Vec<TensorValue>,
    ty: &TensorType,
    node: &str,
) -> Result<TensorValue, Error> {
    let Some(first) = stack.first() else {
        let dims: Option<Vec<usize>> = ty
            .shape
            .as_ref()
            .and_then(|s| s.iter().map(|d| d.as_fixed()).collect());
        let shape: Vec<usize> = std::iter::once(0)
            .chain(dims.into_iter().flatten())
            .collect();
        return empty(ty.dtype, shape, node);
    };
    let shape: Vec<usize> = std::iter::once(stack.len())
        .chain(first.shape().iter().copied())
        .collect();
    let mut values = stack.into_iter();
    let mut data = values.next().expect("not empty").into_data();
    for v in values {
        with_tensor_data!(&mut data, acc => append(acc, v.into_data()))
            .map_err(|_| Error::op(node, "loop", "scan outputs differ in dtype"))?;
    }
    TensorValue::new(shape, data)
}

fn append<T: ValueElement>(acc: &mut Vec<T>, more: TensorData) -> Result<(), TensorData> {
    acc.extend(T::unwrap(more)?);
    Ok(())
}

fn empty(dtype: DType, shape: Vec<usize>, node: &str) -> Result<TensorValue, Error> {
    let t = ir::Tensor::from_bytes(dtype, shape, bytes::Bytes::new())
        .map_err(|e| Error::op(node, "loop", e.to_string()))?;
    TensorValue::from_ir(&t)
}

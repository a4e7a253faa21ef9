//! Multi-head attention (the recognised `attention` op).

use super::attn_kernels::{attn_scores, attn_values, IB, JB};
use super::simd::softmax_row;
use super::{broadcast_strides, Ctx, SyncPtr};
use crate::value::TensorValue;
use crate::Error;

/// Scores at or below this are padding: after the max-subtraction of softmax their exponential
/// is exactly 0 in f32, so leaving the key out gives bit-identical probabilities.
const MASKED: f32 = -1.0e30;

/// `softmax(q·kᵀ·scale + mask_bias)·v` per (batch, head), heads merged back into `[B, S, H]`.
///
/// When the mask is the same for every head and query (the usual `[B, 1, 1, S]` padding bias),
/// keys whose bias is a large negative number are skipped: padded keys cost nothing.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention(
    q: &TensorValue,
    k: &TensorValue,
    v: &TensorValue,
    mask: Option<&TensorValue>,
    num_heads: usize,
    scale: f32,
    ctx: &mut Ctx<'_>,
    node: &str,
) -> Result<TensorValue, Error> {
    let err = |m: String| Error::op(node, "attention", m);
    let (qv, kv, vv) = match (q.as_f32(), k.as_f32(), v.as_f32()) {
        (Some(a), Some(b), Some(c)) => (a, b, c),
        _ => return Err(err("q, k and v must be f32".into())),
    };
    if q.rank() != 3 || k.rank() != 3 || v.rank() != 3 {
        return Err(err(format!(
            "q, k, v must be [B, S, H], got {:?}, {:?}, {:?}",
            q.shape(),
            k.shape(),
            v.shape()
        )));
    }
    let (b, sq, h) = (q.shape()[0], q.shape()[1], q.shape()[2]);
    let sk = k.shape()[1];
    if k.shape() != [b, sk, h] || v.shape() != [b, sk, h] {
        return Err(err(format!(
            "k {:?} and v {:?} must be [{b}, S, {h}]",
            k.shape(),
            v.shape()
        )));
    }
    if num_heads == 0 || h % num_heads != 0 {
        return Err(err(format!(
            "hidden size {h} is not a multiple of {num_heads} heads"
        )));
    }
    let dh = h / num_heads;
    if b * sq * h == 0 {
        return Ok(TensorValue::raw(vec![b, sq, h], Vec::<f32>::new()));
    }
    if sk == 0 {
        return Err(err("softmax over zero keys".into()));
    }
    let full = [b, num_heads, sq, sk];
    let (mv, ms): (&[f32], [usize; 4]) = match mask {
        Some(m) => {
            let mv = m
                .as_f32()
                .ok_or_else(|| err(format!("mask bias must be f32, got {}", m.dtype())))?;
            if m.rank() > 4
                || super::broadcast_shape(m.shape(), &full).as_deref() != Some(&full[..])
            {
                return Err(err(format!(
                    "mask bias {:?} does not broadcast to {full:?}",
                    m.shape()
                )));
            }
            let s = broadcast_strides(m.shape(), &full);
            (mv, [s[0], s[1], s[2], s[3]])
        }
        None => (&[], [0; 4]),
    };
    let has_mask = mask.is_some();
    // Per batch: the keys to visit (all of them unless the mask is per key only).
    let per_key_only = has_mask && ms[1] == 0 && ms[2] == 0;
    let active: Vec<Vec<usize>> = (0..b)
        .map(|bi| {
            if !per_key_only {
                return (0..sk).collect();
            }
            let keys: Vec<usize> = (0..sk)
                .filter(|&j| mv[bi * ms[0] + j * ms[3]] > MASKED)
                .collect();
            // A fully masked row keeps every key: softmax over equal scores, as the graph gives.
            if keys.is_empty() {
                (0..sk).collect()
            } else {
                keys
            }
        })
        .collect();

    let mut out = ctx.arena.f32_for_overwrite(b * sq * h);
    let optr = SyncPtr(out.as_mut_ptr());
    let tasks = b * num_heads;
    let work = b * num_heads * sq * sk * dh * 2;
    // Padded sizes of the register-blocked kernels; the padding rows/columns are zeros.
    let m_pad = sq.div_ceil(IB) * IB;
    let dh_pad = dh.div_ceil(JB) * JB;
    let run = |range: std::ops::Range<usize>| {
        // Per-worker scratch, reused across its (batch, head) tasks.
        let mut qh = vec![0.0f32; m_pad * dh];
        let mut kt = vec![0.0f32; dh * sk.div_ceil(JB) * JB];
        let mut vh = vec![0.0f32; sk * dh_pad];
        let mut scores = vec![0.0f32; m_pad * sk.div_ceil(JB) * JB];
        let mut oh = vec![0.0f32; m_pad * dh_pad];
        for task in range {
            let (bi, hd) = (task / num_heads, task % num_heads);
            let keys = &active[bi];
            let n = keys.len();
            let n_pad = n.div_ceil(JB) * JB;
            for i in 0..sq {
                qh[i * dh..(i + 1) * dh].copy_from_slice(&qv[(bi * sq + i) * h + hd * dh..][..dh]);
            }
            let kt = &mut kt[..dh * n_pad];
            kt.fill(0.0);
            for (r, &j) in keys.iter().enumerate() {
                let src = (bi * sk + j) * h + hd * dh;
                for d in 0..dh {
                    kt[d * n_pad + r] = kv[src + d];
                }
                vh[r * dh_pad..r * dh_pad + dh].copy_from_slice(&vv[src..src + dh]);
            }
            let sc = &mut scores[..m_pad * n_pad];
            attn_scores(&qh, kt, sc, m_pad, n_pad, dh, scale);
            for (i, row) in sc.chunks_exact_mut(n_pad).take(sq).enumerate() {
                let row = &mut row[..n];
                if has_mask {
                    let mrow = bi * ms[0] + hd * ms[1] + i * ms[2];
                    for (s, &j) in row.iter_mut().zip(keys) {
                        *s += mv[mrow + j * ms[3]];
                    }
                }
                softmax_row(row);
            }
            attn_values(sc, n_pad, &vh, &mut oh, m_pad, n, dh_pad);
            for i in 0..sq {
                // SAFETY: task (bi, hd) alone writes columns hd·dh..(hd+1)·dh of rows of batch
                // bi, so writers never overlap, and `out` outlives the scope below.
                let dst = unsafe {
                    std::slice::from_raw_parts_mut(optr.ptr().add((bi * sq + i) * h + hd * dh), dh)
                };
                dst.copy_from_slice(&oh[i * dh_pad..i * dh_pad + dh]);
            }
        }
    };
    ctx.par_tasks(tasks, work, run);
    Ok(TensorValue::raw(vec![b, sq, h], out))
}

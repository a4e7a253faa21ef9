//! Multi-head attention (the recognised `attention` op).

use super::attn_kernels::{attn_scores, attn_values, IB, JB};
use super::simd::softmax_row;
use super::{broadcast_strides, Ctx, SyncPtr};
use crate::value::TensorValue;
use crate::Error;

/// Scores at or below this are padding: after the max-subtraction of softmax their exponential
/// is exactly 0 in f32, so leaving the key out gives bit-identical probabilities.
const MASKED: f32 = -1.0e30;

thread_local! {
    /// Attention scratch of this thread (one head's query tail, Kᵀ, V, scores and output),
    /// grown to the largest shape seen: a steady-state run allocates none.
    static SCRATCH: std::cell::Cell<[Vec<f32>; 5]> = std::cell::Cell::new(Default::default());
}

/// The first `len` elements of `v`, zeroed (grown when short), as a fresh buffer would be.
fn zeroed(v: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if v.len() < len {
        v.resize(len, 0.0);
    }
    let s = &mut v[..len];
    s.fill(0.0);
    s
}

/// Rows of q, k or v inside a tensor: element `(row, c)` is `data[row·ld + offset + c]`.
#[derive(Clone, Copy)]
struct Rows<'a> {
    data: &'a [f32],
    ld: usize,
    offset: usize,
}

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
    let rows = |data| Rows {
        data,
        ld: h,
        offset: 0,
    };
    attend(
        [rows(qv), rows(kv), rows(vv)],
        [b, sq, sk, h],
        mask,
        num_heads,
        scale,
        ctx,
        node,
    )
}

/// [`attention`] on one `[B, S, 3H]` tensor holding q, k and v side by side in each row.
pub(crate) fn attention_qkv(
    qkv: &TensorValue,
    mask: Option<&TensorValue>,
    num_heads: usize,
    scale: f32,
    ctx: &mut Ctx<'_>,
    node: &str,
) -> Result<TensorValue, Error> {
    let err = |m: String| Error::op(node, "attention_qkv", m);
    let data = qkv
        .as_f32()
        .ok_or_else(|| err(format!("qkv must be f32, got {}", qkv.dtype())))?;
    if qkv.rank() != 3 || !qkv.shape()[2].is_multiple_of(3) {
        return Err(err(format!(
            "qkv must be [B, S, 3H], got {:?}",
            qkv.shape()
        )));
    }
    let (b, s, h) = (qkv.shape()[0], qkv.shape()[1], qkv.shape()[2] / 3);
    let rows = |offset| Rows {
        data,
        ld: 3 * h,
        offset,
    };
    attend(
        [rows(0), rows(h), rows(2 * h)],
        [b, s, s, h],
        mask,
        num_heads,
        scale,
        ctx,
        node,
    )
}

/// The attention of q, k, v rows: `dims` = `[batch, queries, keys, hidden]`.
#[allow(clippy::too_many_arguments)]
fn attend(
    [q, k, v]: [Rows<'_>; 3],
    [b, sq, sk, h]: [usize; 4],
    mask: Option<&TensorValue>,
    num_heads: usize,
    scale: f32,
    ctx: &mut Ctx<'_>,
    node: &str,
) -> Result<TensorValue, Error> {
    let err = |m: String| Error::op(node, "attention", m);
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

    // Mask values added to the scores only where some visited key's bias is not 0: adding 0
    // changes no score (−0 becomes +0, which softmax treats alike).
    let mask_adds: Vec<bool> = (0..b)
        .map(|bi| {
            has_mask
                && (!per_key_only
                    || active[bi]
                        .iter()
                        .any(|&j| mv[bi * ms[0] + j * ms[3]] != 0.0))
        })
        .collect();

    let mut out = ctx.arena.f32_for_overwrite(b * sq * h);
    let optr = SyncPtr(out.as_mut_ptr());
    let tasks = b * num_heads;
    let work = b * num_heads * sq * sk * dh * 2;
    // Query rows in whole register blocks are read from q and written to the output in place
    // (when a head is a whole number of kernel columns); the last partial block goes through
    // zero-padded scratch.
    let m_full = sq / IB * IB;
    let dh_pad = dh.div_ceil(JB) * JB;
    let direct_heads = dh == dh_pad;
    let run = |range: std::ops::Range<usize>| {
        // Per-thread scratch, reused across its (batch, head) tasks and across calls (taken out
        // of the thread-local for the call, so a nested call would make its own); each buffer
        // starts as a fresh one would: zeros, or empty for those grown by `resize`.
        let mut scratch = SCRATCH.with(std::cell::Cell::take);
        let [qb, ktb, vh, sb, o_scratch] = &mut scratch;
        let q_tail = zeroed(qb, IB * dh);
        let kt = zeroed(ktb, dh * sk.div_ceil(JB) * JB);
        vh.clear();
        let scores = zeroed(sb, (m_full + IB) * sk.div_ceil(JB) * JB);
        o_scratch.clear();
        for task in range {
            let (bi, hd) = (task / num_heads, task % num_heads);
            let keys = &active[bi];
            let n = keys.len();
            let n_pad = n.div_ceil(JB) * JB;
            let q_at = (bi * sq) * q.ld + q.offset + hd * dh;
            let o_at = (bi * sq) * h + hd * dh;
            for i in m_full..sq {
                q_tail[(i - m_full) * dh..][..dh].copy_from_slice(&q.data[q_at + i * q.ld..][..dh]);
            }
            let kt = &mut kt[..dh * n_pad];
            kt.fill(0.0);
            for (r, &j) in keys.iter().enumerate() {
                let src = (bi * sk + j) * k.ld + k.offset + hd * dh;
                for d in 0..dh {
                    kt[d * n_pad + r] = k.data[src + d];
                }
            }
            // V is copied even when no key is skipped: read in place, its rows (a head's 64
            // floats every 3 KB in BERT-base) fall into a few L1 sets and evict each other.
            vh.resize(n * dh_pad, 0.0);
            for (r, &j) in keys.iter().enumerate() {
                let src = (bi * sk + j) * v.ld + v.offset + hd * dh;
                vh[r * dh_pad..r * dh_pad + dh].copy_from_slice(&v.data[src..src + dh]);
            }
            let (v_rows, ldv) = (&vh[..], dh_pad);
            let sc = &mut scores[..(m_full + IB) * n_pad];
            attn_scores(&q.data[q_at..], q.ld, kt, sc, m_full, n_pad, dh, scale);
            if sq > m_full {
                attn_scores(
                    q_tail,
                    dh,
                    kt,
                    &mut sc[m_full * n_pad..],
                    IB,
                    n_pad,
                    dh,
                    scale,
                );
            }
            for (i, row) in sc.chunks_exact_mut(n_pad).take(sq).enumerate() {
                let row = &mut row[..n];
                if mask_adds[bi] {
                    let mrow = bi * ms[0] + hd * ms[1] + i * ms[2];
                    for (s, &j) in row.iter_mut().zip(keys) {
                        *s += mv[mrow + j * ms[3]];
                    }
                }
                softmax_row(row);
            }
            // Output rows `rows` (padded to `m_pad`) from their probabilities `p`: in place when
            // the block is whole and a head is whole kernel columns, else through `o_scratch`.
            let mut put = |p: &[f32], rows: std::ops::Range<usize>, m_pad: usize| {
                if direct_heads && rows.len() == m_pad {
                    // SAFETY: task (bi, hd) alone writes columns hd·dh..(hd+1)·dh of the rows of
                    // batch bi (`rows` lie within its sq), so writers never overlap, and `out`
                    // outlives the parallel call.
                    unsafe {
                        let o = optr.ptr().add(o_at + rows.start * h);
                        attn_values(p, n_pad, v_rows, ldv, o, h, m_pad, n, dh);
                    }
                    return;
                }
                o_scratch.resize(m_pad * dh_pad, 0.0);
                // SAFETY: `o_scratch` holds m_pad rows of dh_pad.
                unsafe {
                    let o = o_scratch.as_mut_ptr();
                    attn_values(p, n_pad, v_rows, ldv, o, dh_pad, m_pad, n, dh_pad);
                }
                for (r, i) in rows.enumerate() {
                    // SAFETY: as above, this task's columns of row i of batch bi.
                    let dst =
                        unsafe { std::slice::from_raw_parts_mut(optr.ptr().add(o_at + i * h), dh) };
                    dst.copy_from_slice(&o_scratch[r * dh_pad..][..dh]);
                }
            };
            put(sc, 0..m_full, m_full);
            if sq > m_full {
                put(&sc[m_full * n_pad..], m_full..sq, IB);
            }
        }
        SCRATCH.with(|c| c.set(scratch));
    };
    ctx.par_tasks(tasks, work, run);
    Ok(TensorValue::raw(vec![b, sq, h], out))
}

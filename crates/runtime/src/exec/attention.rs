//! Multi-head attention (the recognised `attention` op).

use super::attn_int8::{scores_i8, values_i8, values_u8, ScoreOperands, U8Sink, ValueOperands};
use super::attn_kernels::{attn_scores, attn_values, IB, JB};
use super::packing::RowMap;
use super::simd::{
    abs_max_into, quantize_interleave4, quantize_sym_row, softmax_quant_row, softmax_rows,
};
use super::{broadcast_strides, prefetch, Arena, Ctx, SharedPtr};
use crate::value::TensorValue;
use crate::Error;
use crate::TensorData;
use ir::AttnProducts;
use std::f32::consts::LOG2_E;

/// The attributes of an attention op: heads, the scale of the scores, and the arithmetic of
/// the two products.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Heads {
    pub num_heads: usize,
    pub scale: f32,
    pub products: AttnProducts,
}

/// The static u8 quantization of an attention output (`out_u8`, moved there from the `qlinear`
/// that reads it): each element `quantize_u8(y·inv_smooth[c], scale, zero_point)`, the bytes
/// that `qlinear` makes of an f32 input.
#[derive(Clone, Copy)]
pub(crate) struct OutQuant<'a> {
    pub inv_smooth: Option<&'a [f32]>,
    pub scale: f32,
    pub zero_point: f32,
}

impl OutQuant<'_> {
    /// Checks that the smoothing factors, when given, are one per output column (`h`).
    fn check(&self, h: usize, err: &dyn Fn(String) -> Error) -> Result<(), Error> {
        match self.inv_smooth {
            Some(f) if f.len() != h => Err(err(format!(
                "the output's smoothing factors have {} values, expected {h}",
                f.len()
            ))),
            _ => Ok(()),
        }
    }
}

/// Scores at or below this are padding: after the max-subtraction of softmax their exponential
/// is exactly 0 in f32, so leaving the key out gives bit-identical probabilities.
const MASKED: f32 = -1.0e30;

/// Query rows per block of [`head_i8`]'s scores → softmax → values pass (a multiple of [`IB`]).
const ROW_BLOCK: usize = 16;

thread_local! {
    /// Attention scratch of this thread (one head's query tail, Kᵀ, V, scores and output),
    /// grown to the largest shape seen: a steady-state run allocates none.
    static SCRATCH: std::cell::Cell<[Vec<f32>; 5]> = std::cell::Cell::new(Default::default());
}

/// The first `len` elements of `v`, zeroed (grown when short), as a fresh buffer would be.
fn zeroed<T: Copy + Default>(v: &mut Vec<T>, len: usize) -> &mut [T] {
    if v.len() < len {
        v.resize(len, T::default());
    }
    let s = &mut v[..len];
    s.fill(T::default());
    s
}

/// The first `len` elements of `v` (grown when short), left as they were: for buffers the
/// caller overwrites wholly.
fn grown<T: Copy + Default>(v: &mut Vec<T>, len: usize) -> &mut [T] {
    if v.len() < len {
        v.resize(len, T::default());
    }
    &mut v[..len]
}

/// Rows of q, k or v inside a tensor: element `(row, c)` is `data[row·ld + offset + c]`.
#[derive(Clone, Copy)]
struct Rows<'a> {
    data: &'a [f32],
    ld: usize,
    offset: usize,
}

/// What an `attention_qkv` or `attention_packed` reads q, k and v from: one f32 tensor holding
/// the three side by side in each row, or the three outputs of a `quant_heads` epilogue.
#[derive(Clone, Copy)]
pub(crate) enum QkvInput<'a> {
    F32(&'a TensorValue),
    /// `bytes` (`[…, 2H]` u8: q's heads +128, then k's as s8), `scales` (`[…, 2·heads]`), `v`
    /// (`[…, H]` f32), row for row.
    HeadsI8 {
        bytes: &'a TensorValue,
        scales: &'a TensorValue,
        v: &'a TensorValue,
    },
}

impl<'a> QkvInput<'a> {
    /// The q, k, v inputs at the front of `ins` ([`ir::qkv_pieces`] of them) and the index of
    /// the first input after them.
    pub(crate) fn of(ins: &'a [super::Input<'_>], node: &str) -> Result<(Self, usize), Error> {
        let first = ins
            .first()
            .ok_or_else(|| Error::op(node, "attention", "no qkv input"))?
            .get();
        match ir::qkv_pieces(first.dtype()) {
            3 if ins.len() >= 3 => Ok((
                QkvInput::HeadsI8 {
                    bytes: first,
                    scales: ins[1].get(),
                    v: ins[2].get(),
                },
                3,
            )),
            3 => Err(Error::op(
                node,
                "attention",
                "u8 q and k need their scales and v beside them",
            )),
            _ => Ok((QkvInput::F32(first), 1)),
        }
    }

    /// The rows of q, k and v, checked to be `[lead…, ·]` of `rows` rows with the widths of
    /// `num_heads` heads, and the hidden size `H`; quantized heads only with 8-bit products.
    fn source(
        self,
        lead: &[usize],
        heads: Heads,
        err: &dyn Fn(String) -> Error,
    ) -> Result<(Source<'a>, usize), Error> {
        let shaped = |t: &TensorValue, what: &str| -> Result<usize, Error> {
            match t.shape().split_last() {
                Some((&w, l)) if l == lead => Ok(w),
                _ => Err(err(format!(
                    "{what} must be {lead:?} followed by one axis, got {:?}",
                    t.shape()
                ))),
            }
        };
        match self {
            QkvInput::F32(qkv) => {
                let data = qkv
                    .as_f32()
                    .ok_or_else(|| err(format!("qkv must be f32, got {}", qkv.dtype())))?;
                let w = shaped(qkv, "qkv")?;
                if !w.is_multiple_of(3) {
                    return Err(err(format!("qkv must be [.., 3H], got {:?}", qkv.shape())));
                }
                let h = w / 3;
                check_heads(h, heads.num_heads, err)?;
                Ok((Source::F32(split_qkv(data, h)), h))
            }
            QkvInput::HeadsI8 { bytes, scales, v } => {
                if heads.products != AttnProducts::Int8 {
                    return Err(err(
                        "quantized q and k are read by 8-bit products only".into()
                    ));
                }
                let (Some(b), Some(sc), Some(vd)) = (bytes.as_u8(), scales.as_f32(), v.as_f32())
                else {
                    return Err(err(format!(
                        "quantized heads must be u8 bytes, f32 scales and f32 v, got {}, {}, {}",
                        bytes.dtype(),
                        scales.dtype(),
                        v.dtype()
                    )));
                };
                let h = shaped(v, "v")?;
                check_heads(h, heads.num_heads, err)?;
                if shaped(bytes, "the bytes of q and k")? != 2 * h
                    || shaped(scales, "the scales of q and k")? != 2 * heads.num_heads
                {
                    return Err(err(format!(
                        "bytes {:?} and scales {:?} are not q and k of {} heads beside v {:?}",
                        bytes.shape(),
                        scales.shape(),
                        heads.num_heads,
                        v.shape()
                    )));
                }
                Ok((
                    Source::HeadsI8 {
                        bytes: b,
                        scales: sc,
                        v: Rows {
                            data: vd,
                            ld: h,
                            offset: 0,
                        },
                    },
                    h,
                ))
            }
        }
    }
}

/// Where [`attend`] reads q, k and v.
#[derive(Clone, Copy)]
enum Source<'a> {
    F32([Rows<'a>; 3]),
    /// q and k quantized per (row, head) by the QKV GEMM: row `r` of `bytes` holds q's heads then
    /// k's (`2H`), row `r` of `scales` their scales (`2·heads`).
    HeadsI8 {
        bytes: &'a [u8],
        scales: &'a [f32],
        v: Rows<'a>,
    },
}

/// One head of one row of q or k, as [`Source`] holds it.
enum HeadRow<'a> {
    F32(&'a [f32]),
    /// The producer's bytes and scale.
    Quantized(&'a [u8], f32),
}

impl HeadRow<'_> {
    fn prefetch(&self) {
        match self {
            HeadRow::F32(x) => prefetch(x),
            HeadRow::Quantized(b, _) => prefetch(b),
        }
    }
}

impl<'a> Source<'a> {
    /// Head `hd` (`dh` wide) of q (`which` 0) or k (1) at `row`.
    #[inline(always)]
    fn head(&self, which: usize, row: usize, hd: usize, dh: usize) -> HeadRow<'a> {
        let col = hd * dh;
        match *self {
            Source::F32(rows) => {
                let x = rows[which];
                let at = row * x.ld + x.offset + col;
                HeadRow::F32(&x.data[at..at + dh])
            }
            Source::HeadsI8 { bytes, scales, v } => {
                let (h, heads) = (v.ld, v.ld / dh);
                let at = row * 2 * h + which * h + col;
                let scale = scales[row * 2 * heads + which * heads + hd];
                HeadRow::Quantized(&bytes[at..at + dh], scale)
            }
        }
    }
}

/// `softmax(q·kᵀ·scale + mask_bias)·v` per (batch, head), heads merged back into `[B, S, H]`.
///
/// When the mask is the same for every head and query (the usual `[B, 1, 1, S]` padding bias),
/// keys whose bias is a large negative number are skipped: padded keys cost nothing.
pub(crate) fn attention(
    q: &TensorValue,
    k: &TensorValue,
    v: &TensorValue,
    mask: Option<&TensorValue>,
    heads: Heads,
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
    padded(
        Source::F32([rows(qv), rows(kv), rows(vv)]),
        [b, sq, sk, h],
        mask,
        heads,
        None,
        ctx,
        node,
    )
}

/// [`attention`] on one `[B, S, 3H]` tensor holding q, k and v side by side in each row (or
/// on the quantized heads of a `quant_heads` epilogue).
pub(crate) fn attention_qkv(
    qkv: QkvInput<'_>,
    mask: Option<&TensorValue>,
    heads: Heads,
    quant: Option<OutQuant<'_>>,
    ctx: &mut Ctx<'_>,
    node: &str,
) -> Result<TensorValue, Error> {
    let err = |m: String| Error::op(node, "attention_qkv", m);
    let first = match qkv {
        QkvInput::F32(t) => t,
        QkvInput::HeadsI8 { v, .. } => v,
    };
    if first.rank() != 3 {
        return Err(err(format!(
            "q, k and v must be [B, S, ·], got {:?}",
            first.shape()
        )));
    }
    let (b, s) = (first.shape()[0], first.shape()[1]);
    let (src, h) = qkv.source(&[b, s], heads, &err)?;
    if let Some(q) = quant {
        q.check(h, &err)?;
    }
    padded(src, [b, s, s, h], mask, heads, quant, ctx, node)
}

/// q, k and v of rows holding the three side by side, each `h` wide.
fn split_qkv(data: &[f32], h: usize) -> [Rows<'_>; 3] {
    [0, h, 2 * h].map(|offset| Rows {
        data,
        ld: 3 * h,
        offset,
    })
}

/// Checks that `num_heads` divide the hidden size `h`.
fn check_heads(h: usize, num_heads: usize, err: &dyn Fn(String) -> Error) -> Result<(), Error> {
    if num_heads == 0 || !h.is_multiple_of(num_heads) {
        return Err(err(format!(
            "hidden size {h} is not a multiple of {num_heads} heads"
        )));
    }
    Ok(())
}

/// [`attend`] on `[B, S, ·]` rows: `dims` = `[batch, queries, keys, hidden]`; `[B, S_q, H]` out.
fn padded(
    qkv: Source<'_>,
    [b, sq, sk, h]: [usize; 4],
    mask: Option<&TensorValue>,
    heads: Heads,
    quant: Option<OutQuant<'_>>,
    ctx: &mut Ctx<'_>,
    node: &str,
) -> Result<TensorValue, Error> {
    let num_heads = heads.num_heads;
    let err = |m: String| Error::op(node, "attention", m);
    check_heads(h, num_heads, &err)?;
    if sk == 0 && b * sq * h > 0 {
        return Err(err("softmax over zero keys".into()));
    }
    let view = MaskView::new(mask, [b, num_heads, sq, sk], &err)?;
    let plans = padded_plans(b, sq, sk, view, ctx.arena);
    let out = attend(qkv, [b * sq, h], &plans, view, heads, quant, ctx);
    plans.recycle(ctx.arena);
    Ok(TensorValue::raw_data([b, sq, h].as_slice(), out))
}

/// `kt[d, r] = k[k0 + keys[r], col + d]` for `d < dh`: one head's keys as columns, in 16×16
/// tiles so that each store fills a run of a row of `kt` rather than touching one element in
/// each of 16 rows (element-wise transposing cost more than either product at BERT-base sizes).
fn transpose_keys(
    k: Rows<'_>,
    k0: usize,
    col: usize,
    keys: &[usize],
    dh: usize,
    kt: &mut [f32],
    n_pad: usize,
) {
    const T: usize = 16;
    let mut tile = [[0.0f32; T]; T];
    for rb in (0..keys.len()).step_by(T) {
        let rn = (keys.len() - rb).min(T);
        // The next tile's rows, one per key 3H floats apart: too far apart for the hardware
        // prefetcher, which leaves every row a cache miss.
        for &j in keys.iter().skip(rb + T).take(T) {
            let at = (k0 + j) * k.ld + k.offset + col;
            prefetch(&k.data[at..(at + dh).min(k.data.len())]);
        }
        for db in (0..dh).step_by(T) {
            let dn = (dh - db).min(T);
            for (row, &j) in tile.iter_mut().zip(&keys[rb..rb + rn]) {
                let src = (k0 + j) * k.ld + k.offset + col + db;
                copy_row(&mut row[..dn], &k.data[src..src + dn]);
            }
            #[cfg(target_arch = "x86_64")]
            if rn == T && dn == T && std::arch::is_x86_feature_detected!("avx512f") {
                assert!((db + T - 1) * n_pad + rb + T <= kt.len());
                // SAFETY: the CPU has AVX-512F; rows db..db+16 of `kt` have room for columns
                // rb..rb+16 (asserted).
                unsafe { transpose16_avx512(&tile, kt.as_mut_ptr().add(db * n_pad + rb), n_pad) };
                continue;
            }
            for d in 0..dn {
                let dst = &mut kt[(db + d) * n_pad + rb..][..rn];
                for (x, row) in dst.iter_mut().zip(&tile) {
                    *x = row[d];
                }
            }
        }
    }
}

/// `out[c·ld + r] = tile[r][c]` for a whole 16×16 tile, in registers: 64 shuffles where the
/// element-wise loop makes 256 single-float moves.
///
/// # Safety
/// The CPU must have AVX-512F; `out` must be valid for writes of 16 rows of 16 floats at
/// stride `ld`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn transpose16_avx512(tile: &[[f32; 16]; 16], out: *mut f32, ld: usize) {
    use std::arch::x86_64::*;
    // Plain loops, not `array::from_fn` closures, so that every intrinsic is compiled with this
    // function's target features (inline).
    let mut r = [_mm512_setzero_ps(); 16];
    for (v, row) in r.iter_mut().zip(tile) {
        // SAFETY: each row of `tile` is 16 floats.
        *v = unsafe { _mm512_loadu_ps(row.as_ptr()) };
    }
    for (c, v) in transpose16_regs(r).into_iter().enumerate() {
        // SAFETY: row `c` < 16 of the caller's block.
        unsafe { _mm512_storeu_ps(out.add(c * ld), v) };
    }
}

/// The 16×16 transpose of sixteen rows of 32-bit lanes (floats or any 4 bytes: the shuffles
/// move bits): lane `r` of result `c` is lane `c` of row `r`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
fn transpose16_regs(r: [std::arch::x86_64::__m512; 16]) -> [std::arch::x86_64::__m512; 16] {
    use std::arch::x86_64::*;
    // 32-bit interleave of row pairs, then 64-bit interleave of pairs of pairs: lane L of
    // u[4j + c] holds rows 4j..4j+3 of column 4L + c.
    let mut t = [_mm512_setzero_ps(); 16];
    for i in (0..16).step_by(2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    let mut u = [_mm512_setzero_ps(); 16];
    for base in (0..16).step_by(4) {
        for half in 0..2 {
            let a = _mm512_castps_pd(t[base + half]);
            let b = _mm512_castps_pd(t[base + half + 2]);
            u[base + 2 * half] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
            u[base + 2 * half + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        }
    }
    // 128-bit lanes of rows 0-3 with rows 4-7 (and 8-11 with 12-15): w[c] holds columns c and
    // 8 + c, w[4 + c] columns 4 + c and 12 + c, of rows 0-7; w[8 + c], w[12 + c] of rows 8-15.
    let mut w = [_mm512_setzero_ps(); 16];
    for c in 0..4 {
        for rows in [0, 8] {
            w[rows + c] = _mm512_shuffle_f32x4::<0x88>(u[rows + c], u[rows + c + 4]);
            w[rows + 4 + c] = _mm512_shuffle_f32x4::<0xdd>(u[rows + c], u[rows + c + 4]);
        }
    }
    let mut cols = [_mm512_setzero_ps(); 16];
    for c in 0..4 {
        cols[c] = _mm512_shuffle_f32x4::<0x88>(w[c], w[8 + c]);
        cols[8 + c] = _mm512_shuffle_f32x4::<0xdd>(w[c], w[8 + c]);
        cols[4 + c] = _mm512_shuffle_f32x4::<0x88>(w[4 + c], w[12 + c]);
        cols[12 + c] = _mm512_shuffle_f32x4::<0xdd>(w[4 + c], w[12 + c]);
    }
    cols
}

/// `dst.copy_from_slice(src)` in 64-byte pieces the compiler copies inline (a head's 64 bytes
/// are one vector move; a `memmove` call per row cost more than the copy).
#[inline(always)]
fn copy_bytes(dst: &mut [u8], src: &[u8]) {
    let mut d = dst.chunks_exact_mut(64);
    let mut s = src.chunks_exact(64);
    for (d, s) in (&mut d).zip(&mut s) {
        d.copy_from_slice(s);
    }
    d.into_remainder().copy_from_slice(s.remainder());
}

/// `dst.copy_from_slice(src)` in 16-float pieces the compiler copies inline: a head's rows are
/// short (64 floats in BERT-base), and a `memmove` call per row cost more than the copy.
#[inline(always)]
fn copy_row(dst: &mut [f32], src: &[f32]) {
    let mut d = dst.chunks_exact_mut(16);
    let mut s = src.chunks_exact(16);
    for (d, s) in (&mut d).zip(&mut s) {
        let piece: &[f32; 16] = s.try_into().expect("chunks of 16");
        d.copy_from_slice(piece);
    }
    d.into_remainder().copy_from_slice(s.remainder());
}

/// The mask bias of an attention call, viewed as `[B, heads, S_q, S_k]` through broadcast
/// strides.
#[derive(Clone, Copy)]
struct MaskView<'a> {
    data: &'a [f32],
    strides: [usize; 4],
}

impl MaskView<'_> {
    /// Checks that `mask` is f32 and broadcasts to `full`.
    fn new<'a>(
        mask: Option<&'a TensorValue>,
        full: [usize; 4],
        err: &dyn Fn(String) -> Error,
    ) -> Result<Option<MaskView<'a>>, Error> {
        let Some(m) = mask else { return Ok(None) };
        let data = m
            .as_f32()
            .ok_or_else(|| err(format!("mask bias must be f32, got {}", m.dtype())))?;
        if m.rank() > 4 || super::broadcast_shape(m.shape(), &full).as_deref() != Some(&full[..]) {
            return Err(err(format!(
                "mask bias {:?} does not broadcast to {full:?}",
                m.shape()
            )));
        }
        let s = broadcast_strides(m.shape(), &full);
        Ok(Some(MaskView {
            data,
            strides: [s[0], s[1], s[2], s[3]],
        }))
    }

    /// Whether the bias depends on the key only (and the batch): the usual `[B, 1, 1, S]`.
    fn per_key_only(&self) -> bool {
        self.strides[1] == 0 && self.strides[2] == 0
    }

    fn at(&self, b: usize, head: usize, query: usize, key: usize) -> f32 {
        let s = self.strides;
        self.data[b * s[0] + head * s[1] + query * s[2] + key * s[3]]
    }
}

/// One sequence of an attention call: query rows `q0..q0 + nq` (of q and of the output), key
/// rows `k0 + keys[j]`, and where each of those rows sits in the mask bias.
#[derive(Clone, Copy)]
struct SeqPlan<'a> {
    /// The batch index in the mask bias.
    batch: usize,
    q0: usize,
    nq: usize,
    k0: usize,
    keys: &'a [usize],
    /// Mask position of row `r` (relative to `q0` or `k0`); `None`: `r` itself.
    positions: Option<&'a [usize]>,
    /// Whether the mask bias changes any visited score (adding 0 changes none: −0 becomes +0,
    /// which softmax treats alike).
    mask_adds: bool,
}

impl SeqPlan<'_> {
    fn position(&self, r: usize) -> usize {
        self.positions.map_or(r, |p| p[r])
    }

    /// Adds the mask bias of head `hd`, query `i` (relative to `q0`) times `units` (1, or
    /// `log2 e` for scores in log2 units) to that query's scores over the plan's keys, when it
    /// changes any.
    fn add_mask(
        &self,
        mask: Option<MaskView<'_>>,
        hd: usize,
        i: usize,
        units: f32,
        row: &mut [f32],
    ) {
        if let (true, Some(m)) = (self.mask_adds, mask) {
            let qi = self.position(i);
            for (s, &j) in row.iter_mut().zip(self.keys) {
                *s += m.at(self.batch, hd, qi, self.position(j)) * units;
            }
        }
    }
}

/// A [`SeqPlan`] with its keys and positions as ranges of [`Plans::ints`].
#[derive(Clone)]
pub(crate) struct SeqSpan {
    batch: usize,
    q0: usize,
    nq: usize,
    k0: usize,
    keys: std::ops::Range<usize>,
    positions: Option<std::ops::Range<usize>>,
    mask_adds: bool,
}

/// The sequences of one attention call, in two buffers that come from the arena and go back
/// to it: a run builds its plans without allocating.
struct Plans {
    spans: Vec<SeqSpan>,
    ints: Vec<usize>,
}

impl Plans {
    /// Empty plans with room for `ints` keys and positions in all.
    fn new(arena: &mut Arena, ints: usize) -> Plans {
        let (spans, ints) = arena.plan_buffers(ints);
        Plans { spans, ints }
    }

    fn recycle(self, arena: &mut Arena) {
        arena.recycle_plan_buffers(self.spans, self.ints);
    }

    fn len(&self) -> usize {
        self.spans.len()
    }

    fn get(&self, i: usize) -> SeqPlan<'_> {
        let s = &self.spans[i];
        SeqPlan {
            batch: s.batch,
            q0: s.q0,
            nq: s.nq,
            k0: s.k0,
            keys: &self.ints[s.keys.clone()],
            positions: s.positions.clone().map(|r| &self.ints[r]),
            mask_adds: s.mask_adds,
        }
    }

    fn iter(&self) -> impl Iterator<Item = SeqPlan<'_>> {
        (0..self.len()).map(|i| self.get(i))
    }

    /// Appends `values` to [`Plans::ints`]; returns their range there.
    fn put(&mut self, values: impl IntoIterator<Item = usize>) -> std::ops::Range<usize> {
        let start = self.ints.len();
        self.ints.extend(values);
        start..self.ints.len()
    }
}

/// The sequences of a padded `[B, S, ·]` call: every query row; the keys the mask does not
/// hide when it is per key only (a fully masked row keeps every key, as the graph gives).
fn padded_plans(
    b: usize,
    sq: usize,
    sk: usize,
    mask: Option<MaskView<'_>>,
    arena: &mut Arena,
) -> Plans {
    let mut plans = Plans::new(arena, b * sk);
    for bi in 0..b {
        let mut keys = match mask {
            Some(m) if m.per_key_only() => {
                plans.put((0..sk).filter(|&j| m.at(bi, 0, 0, j) > MASKED))
            }
            _ => plans.put(0..sk),
        };
        if keys.is_empty() {
            keys = plans.put(0..sk);
        }
        let mask_adds = mask.is_some_and(|m| {
            !m.per_key_only()
                || plans.ints[keys.clone()]
                    .iter()
                    .any(|&j| m.at(bi, 0, 0, j) != 0.0)
        });
        plans.spans.push(SeqSpan {
            batch: bi,
            q0: bi * sq,
            nq: sq,
            k0: bi * sk,
            keys,
            positions: None,
            mask_adds,
        });
    }
    plans
}

/// Bias at or below this hides a key for packed attention: scores are far smaller than 10⁴
/// in magnitude, so such a key's softmax weight is exactly 0 in the padded op as well.
const HIDDEN: f32 = -1.0e4;

/// [`attention_qkv`] on packed real tokens (`[1, T, 3H]`, see `pack_rows`): each sequence of
/// `mask` attends over its own rows.
pub(crate) fn attention_packed(
    qkv: QkvInput<'_>,
    mask: &TensorValue,
    bias: Option<&TensorValue>,
    heads: Heads,
    quant: Option<OutQuant<'_>>,
    ctx: &mut Ctx<'_>,
    node: &str,
) -> Result<TensorValue, Error> {
    let err = |m: String| Error::op(node, "attention_packed", m);
    RowMap::with(mask, ctx, node, "attention_packed", |map, ctx| {
        attend_packed(qkv, map, bias, heads, quant, ctx, &err)
    })
}

/// [`attention_packed`] once the rows of `mask` are mapped.
fn attend_packed(
    qkv: QkvInput<'_>,
    map: &RowMap,
    bias: Option<&TensorValue>,
    heads: Heads,
    quant: Option<OutQuant<'_>>,
    ctx: &mut Ctx<'_>,
    err: &dyn Fn(String) -> Error,
) -> Result<TensorValue, Error> {
    let num_heads = heads.num_heads;
    // One row per real token of the mask.
    let (src, h) = qkv.source(&[1, map.rows.len()], heads, err)?;
    if let Some(q) = quant {
        q.check(h, err)?;
    }
    let view = MaskView::new(bias, [map.batch, num_heads, map.seq, map.seq], err)?;
    let mut plans = Plans::new(ctx.arena, 2 * map.rows.len());
    let built = (|| {
        for bi in 0..map.batch {
            let (q0, n) = (map.starts[bi], map.starts[bi + 1] - map.starts[bi]);
            let positions = plans.put((0..n).map(|r| map.position(bi, r)));
            let mut mask_adds = false;
            if let Some(m) = view {
                if !m.per_key_only() {
                    return Err(err(
                        "padding-free attention needs a mask bias per key ([B, 1, 1, S]); compile without padding-free execution"
                            .into(),
                    ));
                }
                let mut real = plans.ints[positions.clone()].iter().peekable();
                for j in 0..map.seq {
                    let bias = m.at(bi, 0, 0, j);
                    if real.next_if(|&&p| p == j).is_some() {
                        mask_adds |= bias != 0.0;
                    } else if bias > HIDDEN && n > 0 {
                        return Err(err(format!(
                            "key {j} of sequence {bi} is padding but its mask bias {bias} does not hide it (it must be at most {HIDDEN}); compile without padding-free execution"
                        )));
                    }
                }
            }
            let keys = plans.put(0..n);
            plans.spans.push(SeqSpan {
                batch: bi,
                q0,
                nq: n,
                k0: q0,
                keys,
                positions: Some(positions),
                mask_adds,
            });
        }
        Ok(())
    })();
    let out = built.map(|()| attend(src, [map.rows.len(), h], &plans, view, heads, quant, ctx));
    plans.recycle(ctx.arena);
    Ok(TensorValue::raw_data(
        [1, map.rows.len(), h].as_slice(),
        out?,
    ))
}

/// The attention of q, k, v rows, sequence by sequence as `plans` say: `out_rows` rows of `h`
/// (`num_heads` divide `h`, and `quant`'s factors are `h`: checked by the callers), f32, or u8
/// quantized as `quant` says.
fn attend(
    src: Source<'_>,
    [out_rows, h]: [usize; 2],
    plans: &Plans,
    mask: Option<MaskView<'_>>,
    heads: Heads,
    quant: Option<OutQuant<'_>>,
    ctx: &mut Ctx<'_>,
) -> TensorData {
    let Heads {
        num_heads,
        scale,
        products,
    } = heads;
    let int8 = products == AttnProducts::Int8;
    let dh = h / num_heads;
    let (mut out_f32, mut out_u8) = (Vec::new(), Vec::new());
    if out_rows * h == 0 {
        return match quant {
            Some(_) => TensorData::U8(out_u8),
            None => TensorData::F32(out_f32),
        };
    }
    let dst = match quant {
        Some(q) => {
            out_u8 = ctx.arena.bytes_for_overwrite(out_rows * h);
            HeadDst::U8(SharedPtr(out_u8.as_mut_ptr()), q)
        }
        None => {
            out_f32 = ctx.arena.f32_for_overwrite(out_rows * h);
            HeadDst::F32(SharedPtr(out_f32.as_mut_ptr()))
        }
    };
    let tasks = plans.len() * num_heads;
    let work = plans
        .iter()
        .map(|p| num_heads * p.nq * p.keys.len() * dh * 2)
        .sum();
    let max_q = plans.iter().map(|p| p.nq).max().unwrap_or(0);
    let max_k = plans.iter().map(|p| p.keys.len()).max().unwrap_or(0);
    // Query rows in whole register blocks are read from q and written to the output in place
    // (when a head is a whole number of kernel columns, see `put_head_rows`); the last partial
    // block goes through zero-padded scratch.
    let dh_pad = dh.div_ceil(JB) * JB;
    let run = |range: std::ops::Range<usize>| {
        // Per-thread scratch, reused across its (sequence, head) tasks and across calls (taken
        // out of the thread-local for the call, so a nested call would make its own). The
        // 8-bit products keep their own (`I8Scratch`): the f32 buffers are neither taken
        // nor zeroed for them (at batch 1, sequence 128, zeroing the unused f32 scores and keys,
        // ~100 KB a thread a layer, was 0.8 % of a BERT-base run on Zen 4).
        let mut scratch: [Vec<f32>; 5] = if int8 {
            Default::default()
        } else {
            SCRATCH.with(std::cell::Cell::take)
        };
        let [qb, ktb, vh, sb, o_scratch] = &mut scratch;
        let (q_tail, kt, scores): (&mut [f32], &mut [f32], &mut [f32]) = if int8 {
            (&mut [], &mut [], &mut [])
        } else {
            // The keys and scores are written whole before they are read (the transpose
            // writes every real key's column and the task zeroes the padding ones, the scores
            // kernel every row and column the softmax and the values read), so only the query
            // tail starts as zeros: zeroing the ~100 KB of the other two took ~3 µs of a 47 µs
            // head at batch 1, where a part runs one or two heads.
            (
                zeroed(qb, IB * dh),
                grown(ktb, dh * max_k.div_ceil(JB) * JB),
                grown(sb, (max_q / IB * IB + IB) * max_k.div_ceil(JB) * JB),
            )
        };
        vh.clear();
        o_scratch.clear();
        let mut i8_scratch = if int8 {
            I8_SCRATCH.with(std::cell::Cell::take)
        } else {
            I8Scratch::default()
        };
        for task in range {
            // The 8-bit products go head-major, a contiguous range of tasks covering every
            // sequence for some heads: the QKV GEMM's part `t` quantized the `t`-th share of
            // the heads, which is in that core's cache (`par_owned_tasks` below). The f32
            // products go sequence-major, a sequence's heads one after another: its q, k and v
            // rows (a head's 256 bytes in each 9 KB row of BERT-base's QKV output) are then
            // read from memory once, the next heads' bytes arriving with the lines and pages
            // the first ones brought into L2, where head-major order read every head's bytes
            // of every row from memory (BERT-base INT8 dynamic, attention 28.5-29.2 → 25.2-26.1
            // ms a batch-8 run, 14.8-15.1 → 12.9-13.6 ms on batches of 32 real lengths).
            let (plan, hd) = if int8 {
                (plans.get(task % plans.len()), task / plans.len())
            } else {
                (plans.get(task / num_heads), task % num_heads)
            };
            let sq = plan.nq;
            if sq == 0 {
                continue;
            }
            if int8 {
                let out = HeadOut {
                    dst,
                    at: plan.q0 * h + hd * dh,
                    ld: h,
                    col: hd * dh,
                };
                // SAFETY: task (sequence, hd) alone writes columns hd·dh..(hd+1)·dh of its
                // sequence's rows, and `out` outlives the parallel call.
                unsafe { head_i8(src, &plan, hd, dh, mask, scale, out, &mut i8_scratch) };
                continue;
            }
            let Source::F32([q, k, v]) = src else {
                unreachable!("`QkvInput::source` gives quantized heads to 8-bit products only")
            };
            let m_full = sq / IB * IB;
            let keys = plan.keys;
            let n = keys.len();
            let n_pad = n.div_ceil(JB) * JB;
            let q_at = plan.q0 * q.ld + q.offset + hd * dh;
            let o_at = plan.q0 * h + hd * dh;
            for i in m_full..sq {
                q_tail[(i - m_full) * dh..][..dh].copy_from_slice(&q.data[q_at + i * q.ld..][..dh]);
            }
            let kt = &mut kt[..dh * n_pad];
            // Only the padding columns need zeros: the transpose writes the others.
            for row in kt.chunks_exact_mut(n_pad) {
                row[n..].fill(0.0);
            }
            transpose_keys(k, plan.k0, hd * dh, keys, dh, kt, n_pad);
            // V is copied even when no key is skipped: read in place, its rows (a head's 64
            // floats every 3 KB in BERT-base) fall into a few L1 sets and evict each other.
            vh.resize(n * dh_pad, 0.0);
            const AHEAD: usize = 8;
            for (r, &j) in keys.iter().enumerate() {
                if let Some(&next) = keys.get(r + AHEAD) {
                    let at = (plan.k0 + next) * v.ld + v.offset + hd * dh;
                    prefetch(&v.data[at..at + dh]);
                }
                let src = (plan.k0 + j) * v.ld + v.offset + hd * dh;
                copy_row(&mut vh[r * dh_pad..r * dh_pad + dh], &v.data[src..src + dh]);
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
                plan.add_mask(mask, hd, i, 1.0, &mut row[..n]);
            }
            softmax_rows(sc, n_pad, n, sq);
            let out = HeadOut {
                dst,
                at: o_at,
                ld: h,
                col: hd * dh,
            };
            let mut put = |p: &[f32], rows: std::ops::Range<usize>, m_block: usize| {
                // SAFETY: task (sequence, hd) alone writes columns hd·dh..(hd+1)·dh of its
                // sequence's rows (`rows` lie within its nq, and sequences own disjoint rows),
                // and `out` outlives the parallel call.
                unsafe {
                    put_head_rows(
                        out,
                        rows,
                        m_block,
                        dh,
                        o_scratch,
                        |o, ldo, m| attn_values(p, n_pad, v_rows, ldv, o, ldo, m, n, dh_pad),
                        |_| false,
                    )
                }
            };
            put(sc, 0..m_full, m_full);
            if sq > m_full {
                put(&sc[m_full * n_pad..], m_full..sq, IB);
            }
        }
        if int8 {
            I8_SCRATCH.with(|c| c.set(i8_scratch));
        } else {
            SCRATCH.with(|c| c.set(scratch));
        }
    };
    if matches!(src, Source::HeadsI8 { .. }) {
        // The QKV GEMM's thread `t` wrote the q, k and v of the `t`-th share of the heads (its
        // columns are whole heads, see `quant_heads`), and the tasks run head-major: starting
        // with the same share keeps them in that core's cache.
        ctx.par_owned_tasks(tasks, work, run);
    } else {
        ctx.par_tasks(tasks, work, run);
    }
    match quant {
        Some(_) => TensorData::U8(out_u8),
        None => TensorData::F32(out_f32),
    }
}

/// Scratch of the 8-bit attention of one head, per thread, grown to the largest shape seen.
#[derive(Default)]
struct I8Scratch {
    q8: Vec<u8>,
    qs: Vec<f32>,
    row8: Vec<u8>,
    kt: Vec<u32>,
    kcomp: Vec<i32>,
    ks: Vec<f32>,
    vt: Vec<u32>,
    vmax: Vec<f32>,
    vinv: Vec<f32>,
    vs: Vec<f32>,
    zeros: Vec<f32>,
    scores: Vec<f32>,
    p8: Vec<u8>,
    rs: Vec<f32>,
    out: Vec<f32>,
}

thread_local! {
    static I8_SCRATCH: std::cell::Cell<I8Scratch> = std::cell::Cell::new(I8Scratch::default());
}

/// The output of [`attend`]: f32, or u8 quantized as it is written.
#[derive(Clone, Copy)]
enum HeadDst<'a> {
    F32(SharedPtr<f32>),
    U8(SharedPtr<u8>, OutQuant<'a>),
}

/// Where a head's output rows go: element `(row, c)` at `at + row·ld + c` of `dst`, `c` being
/// column `col + c` of the output.
#[derive(Clone, Copy)]
struct HeadOut<'a> {
    dst: HeadDst<'a>,
    at: usize,
    ld: usize,
    col: usize,
}

/// One (sequence, head) of [`attend`] with 8-bit products (see `attn_int8`): q quantized per
/// query row, k per key row, v per head column, the softmax numerators as u8.
///
/// # Safety
/// `out` must address the `plan.nq` rows × `dh` columns of this head's output, writable and
/// touched by no other thread during the call.
#[allow(clippy::too_many_arguments)]
unsafe fn head_i8(
    src: Source<'_>,
    plan: &SeqPlan<'_>,
    hd: usize,
    dh: usize,
    mask: Option<MaskView<'_>>,
    scale: f32,
    out: HeadOut<'_>,
    s: &mut I8Scratch,
) {
    // Scores in log2 units: the softmax's numerators are then powers of two of the shifted
    // scores (`softmax_quant_row`), one multiplication fewer per score.
    let scale = scale * LOG2_E;
    let sq = plan.nq;
    let keys = plan.keys;
    let n = keys.len();
    let m_pad = sq.div_ceil(IB) * IB;
    let n_pad = n.div_ceil(JB) * JB;
    let (dh4, n4) = (dh.div_ceil(4), n.div_ceil(4));
    let dh_pad = dh.div_ceil(JB) * JB;
    let ldq = 4 * dh4;
    let col = hd * dh;

    // q: the producer's rows in whole register blocks are read where they are (row stride
    // 2H); the others (all of them when q is quantized here) go through `q8`, rows past the
    // real ones quantizing nothing (scale 0).
    let in_place = match src {
        Source::HeadsI8 { bytes, v, .. } if dh == ldq => Some((bytes, 2 * v.ld)),
        _ => None,
    };
    let first_copied = if in_place.is_some() { sq / IB * IB } else { 0 };
    let q8 = grown(&mut s.q8, (m_pad - first_copied) * ldq);
    q8.fill(128);
    let qs = zeroed(&mut s.qs, m_pad);
    // Rows of q, k and v are a head's few cache lines every 3H floats (or 2H bytes), just
    // written by the QKV GEMM and mostly out of L2: each is asked for before it is read (the
    // rows read in place all now, for the scores kernel after the keys), or every row would
    // wait on L3.
    const AHEAD: usize = 8;
    for i in 0..(first_copied + AHEAD).min(sq) {
        src.head(0, plan.q0 + i, hd, dh).prefetch();
    }
    for (i, qs) in qs.iter_mut().enumerate().take(sq) {
        let head = src.head(0, plan.q0 + i, hd, dh);
        if i < first_copied {
            if let HeadRow::Quantized(_, scale) = head {
                *qs = scale;
            }
            continue;
        }
        if i + AHEAD < sq {
            src.head(0, plan.q0 + i + AHEAD, hd, dh).prefetch();
        }
        let qr = &mut q8[(i - first_copied) * ldq..][..dh];
        *qs = match head {
            HeadRow::Quantized(bytes, scale) => {
                copy_bytes(qr, bytes);
                scale
            }
            HeadRow::F32(q) => quantize_sym_row(q, qr, 128),
        };
    }

    // kᵀ in 4-deep slices; keys past the real ones stay zero.
    let kt = grown(&mut s.kt, dh4 * n_pad);
    for slice in kt.chunks_exact_mut(n_pad) {
        slice[n..].fill(0);
    }
    let kcomp = zeroed(&mut s.kcomp, n_pad);
    let ks = zeroed(&mut s.ks, n_pad);
    #[cfg(target_arch = "x86_64")]
    let vector_keys = matches!(src, Source::HeadsI8 { .. })
        && dh == ldq
        && codegen::kernels::cpu_features().avx512vnni;
    #[cfg(not(target_arch = "x86_64"))]
    let vector_keys = false;
    if vector_keys {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU has AVX-512 F/BW and VNNI; the producer's key rows are whole words
        // (dh == ldq); kt, kcomp and ks were sized for n_pad keys of dh4 words above.
        unsafe {
            keys_vnni(&src, plan, [hd, dh], scale, (kt, kcomp, ks), n_pad)
        };
    } else {
        let row8 = zeroed(&mut s.row8, ldq);
        for &key in keys.iter().take(AHEAD) {
            src.head(1, plan.k0 + key, hd, dh).prefetch();
        }
        for r in 0..n {
            if r + AHEAD < n {
                src.head(1, plan.k0 + keys[r + AHEAD], hd, dh).prefetch();
            }
            // The key's bytes: the producer's when it quantized the heads, else made here (a
            // head whose width is not a multiple of 4 ends in zero bytes either way).
            let (k8, k_scale) = match src.head(1, plan.k0 + keys[r], hd, dh) {
                HeadRow::Quantized(bytes, k_scale) if dh == ldq => (bytes, k_scale),
                HeadRow::Quantized(bytes, k_scale) => {
                    row8[..dh].copy_from_slice(bytes);
                    (&row8[..], k_scale)
                }
                HeadRow::F32(k) => {
                    let k_scale = quantize_sym_row(k, &mut row8[..dh], 0);
                    (&row8[..], k_scale)
                }
            };
            ks[r] = k_scale * scale;
            kcomp[r] = 128 * k8.iter().map(|&b| i32::from(b as i8)).sum::<i32>();
            for (d4, w) in k8.chunks_exact(4).enumerate() {
                kt[d4 * n_pad + r] = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
            }
        }
    }
    let v = match src {
        Source::F32([_, _, v]) | Source::HeadsI8 { v, .. } => v,
    };

    // v: per-column scales over this sequence's keys, then 4 keys per word.
    let v_row = |r: usize| {
        let at = (plan.k0 + keys[r]) * v.ld + v.offset + col;
        &v.data[at..at + dh]
    };
    let vs = zeroed(&mut s.vs, dh_pad);
    let vt = grown(&mut s.vt, n4 * dh_pad);
    #[cfg(target_arch = "x86_64")]
    let vector_values = codegen::kernels::cpu_features().avx512;
    #[cfg(not(target_arch = "x86_64"))]
    let vector_values = false;
    if vector_values {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU has AVX-512F; `vs` holds dh_pad scales and `vt` n4 rows of dh_pad
        // words, dh_pad a multiple of 16 not below dh.
        unsafe {
            quantize_values_avx512(&v_row, n, dh, vs, vt)
        };
    } else {
        quantize_values(
            &v_row,
            n,
            dh,
            (vs, vt),
            (&mut s.vmax, &mut s.vinv, &mut s.zeros),
        );
    }

    // Query rows go through scores, softmax and values a block at a time, so the block's f32
    // scores and its probability bytes stay in L1 between the three (a whole head's scores are
    // 590 KB at sequence 384, more than half of L2, written once and read back). Blocks never
    // straddle the rows read in place and the copied ones.
    let ldp = 4 * n4;
    let scores = grown(&mut s.scores, ROW_BLOCK * n_pad);
    let p8 = grown(&mut s.p8, ROW_BLOCK * ldp);
    let rs = zeroed(&mut s.rs, ROW_BLOCK);
    let mut r0 = 0;
    while r0 < m_pad {
        let (r1, q_rows, ldq_blk) = match in_place {
            Some((bytes, ld)) if r0 < first_copied => (
                (r0 + ROW_BLOCK).min(first_copied),
                &bytes[(plan.q0 + r0) * ld + col..],
                ld,
            ),
            _ => (
                (r0 + ROW_BLOCK).min(m_pad),
                &q8[(r0 - first_copied) * ldq..],
                ldq,
            ),
        };
        let m_blk = r1 - r0;
        let real = r0..r1.min(sq);
        let operands = ScoreOperands {
            q8: q_rows,
            ldq: ldq_blk,
            qs: &qs[r0..],
            kt,
            kcomp,
            ks,
            dh4,
        };
        scores_i8(&operands, scores, m_blk, n_pad);
        for (b, (row, (p, r))) in scores
            .chunks_exact_mut(n_pad)
            .zip(p8.chunks_exact_mut(ldp).zip(rs.iter_mut()))
            .take(m_blk)
            .enumerate()
        {
            let i = r0 + b;
            if i >= sq {
                p.fill(0);
                *r = 0.0;
                continue;
            }
            let row = &mut row[..n];
            plan.add_mask(mask, hd, i, LOG2_E, row);
            let sum = softmax_quant_row(row, &mut p[..n]);
            p[n..].fill(0);
            *r = 1.0 / sum;
        }
        let ops = ValueOperands {
            p8,
            ldp,
            rs,
            v: vt,
            vs,
            n4,
        };
        // SAFETY: rows 0..sq of this head are the caller's (its contract); `real` is within.
        unsafe {
            put_head_rows(
                out,
                real,
                m_blk,
                dh,
                &mut s.out,
                |o, ldo, m| values_i8(&ops, o, ldo, m, dh_pad),
                |sink| values_u8(&ops, sink, m_blk, dh_pad),
            );
        }
        r0 = r1;
    }
}

/// The key side of [`head_i8`] from the producer's bytes, sixteen keys at a time: their rows
/// (a 4-byte word per 4 dimensions) transposed in registers into `kt` (word `d4·n_pad + r` holds
/// dimensions `4·d4..4·d4 + 4` of key `r`), `kcomp[r] = 128·Σ_d k8[r, d]` by `vpdpbusd` of the
/// transposed words with bytes of 128 (the same exact sum the scalar loop makes), and `ks[r]`
/// the key's scale times `scale`. Keys past the real ones are left as they are (zero).
///
/// # Safety
/// The CPU has AVX-512 F/BW and VNNI; `src` holds quantized heads whose width `dh` is a
/// multiple of 4; `kt` holds `dh/4` rows of `n_pad` words, `kcomp` and `ks` `n_pad` values, and
/// `n_pad` is a multiple of 16 not below the plan's key count.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn keys_vnni(
    src: &Source<'_>,
    plan: &SeqPlan<'_>,
    [hd, dh]: [usize; 2],
    scale: f32,
    (kt, kcomp, ks): (&mut [u32], &mut [i32], &mut [f32]),
    n_pad: usize,
) {
    use std::arch::x86_64::*;
    let (keys, dh4) = (plan.keys, dh / 4);
    let n = keys.len();
    assert!(n <= n_pad && n_pad.is_multiple_of(16) && dh.is_multiple_of(4));
    assert!(kt.len() >= dh4 * n_pad && kcomp.len() >= n_pad && ks.len() >= n_pad);
    let row = |r: usize| match src.head(1, plan.k0 + keys[r], hd, dh) {
        HeadRow::Quantized(bytes, k_scale) => (bytes, k_scale),
        HeadRow::F32(_) => unreachable!("the caller checked that the heads are quantized"),
    };
    let bytes_128 = _mm512_set1_epi32(0x8080_8080u32 as i32);
    for r in 0..16.min(n) {
        prefetch(row(r).0);
    }
    for r0 in (0..n).step_by(16) {
        let rn = (n - r0).min(16);
        for r in r0 + 16..(r0 + 32).min(n) {
            prefetch(row(r).0);
        }
        let mut at = [std::ptr::null::<u8>(); 16];
        for (i, at) in at.iter_mut().enumerate().take(rn) {
            let (bytes, k_scale) = row(r0 + i);
            *at = bytes.as_ptr();
            ks[r0 + i] = k_scale * scale;
        }
        let mut comp = _mm512_setzero_si512();
        for c0 in (0..dh4).step_by(16) {
            let cn = (dh4 - c0).min(16);
            let m: __mmask16 = if cn == 16 { !0 } else { (1 << cn) - 1 };
            let mut rows = [_mm512_setzero_ps(); 16];
            for (v, &p) in rows.iter_mut().zip(&at).take(rn) {
                // SAFETY: words c0..c0 + cn of a key row of dh4 words (masked).
                *v = unsafe { _mm512_maskz_loadu_ps(m, p.add(4 * c0) as *const f32) };
            }
            let cols = transpose16_regs(rows);
            for (d, &col) in cols.iter().enumerate().take(cn) {
                let words = _mm512_castps_si512(col);
                // SAFETY: row c0 + d < dh4 of kt, keys r0..r0 + 16 ≤ n_pad (asserted).
                unsafe {
                    _mm512_storeu_si512(kt.as_mut_ptr().add((c0 + d) * n_pad + r0) as *mut _, words)
                };
                comp = _mm512_dpbusd_epi32(comp, bytes_128, words);
            }
        }
        // SAFETY: keys r0..r0 + 16 ≤ n_pad (asserted).
        unsafe { _mm512_storeu_si512(kcomp.as_mut_ptr().add(r0) as *mut _, comp) };
    }
}

/// The v of one (sequence, head) as [`values_i8`] reads it, from its `n` rows `v_row(r)` of
/// `dh` floats: `vs[c]` the largest `|v[·, c]|` over 127 (0 past `dh`), and word
/// `j4·dh_pad + c` of `vt` the four s8 `v[4·j4 + t, c]·127/max_c` (rounded half to even, NaN as
/// 0, within ±127; rows past `n` as zeros; columns past `dh` zero words), row `4·j4` lowest.
fn quantize_values<'v>(
    v_row: &impl Fn(usize) -> &'v [f32],
    n: usize,
    dh: usize,
    (vs, vt): (&mut [f32], &mut [u32]),
    (vmax, vinv, zeros): (&mut Vec<f32>, &mut Vec<f32>, &mut Vec<f32>),
) {
    let dh_pad = vs.len();
    let vmax = zeroed(vmax, dh_pad);
    const AHEAD: usize = 8;
    for r in 0..AHEAD.min(n) {
        prefetch(v_row(r));
    }
    for r in 0..n {
        if r + AHEAD < n {
            prefetch(v_row(r + AHEAD));
        }
        abs_max_into(&mut vmax[..dh], v_row(r));
    }
    let vinv = zeroed(vinv, dh_pad);
    for ((m, sc), inv) in vmax.iter().zip(vs.iter_mut()).zip(vinv.iter_mut()) {
        *sc = *m / 127.0;
        *inv = if *m > 0.0 { 127.0 / *m } else { 0.0 };
    }
    let zeros = zeroed(zeros, dh);
    for (j4, words) in vt.chunks_exact_mut(dh_pad).enumerate() {
        words[dh..].fill(0);
        let row = |t: usize| {
            let r = 4 * j4 + t;
            if r < n {
                v_row(r)
            } else {
                &zeros[..]
            }
        };
        quantize_interleave4(
            [row(0), row(1), row(2), row(3)],
            &vinv[..dh],
            &mut words[..dh],
        );
    }
}

/// [`quantize_values`] with AVX-512, the column maxima and reciprocals in registers, 64
/// columns at a time: the same operations, so the same bits.
///
/// # Safety
/// The CPU has AVX-512F; `vs.len()` (`dh_pad`) is a multiple of 16 not below `dh`, `vt` holds
/// `n.div_ceil(4)` rows of `dh_pad` words, and every `v_row(r)` for `r < n` is `dh` floats.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn quantize_values_avx512<'v>(
    v_row: &impl Fn(usize) -> &'v [f32],
    n: usize,
    dh: usize,
    vs: &mut [f32],
    vt: &mut [u32],
) {
    use std::arch::x86_64::*;
    const AHEAD: usize = 8;
    // Columns per pass: four vectors of maxima and reciprocals held in registers.
    const SPAN: usize = 64;
    let dh_pad = vs.len();
    let n4 = n.div_ceil(4);
    assert!(dh_pad.is_multiple_of(16) && dh_pad >= dh && vt.len() >= n4 * dh_pad);
    let lanes = |c: usize| super::simd::lanes_below(dh.saturating_sub(c));
    for r in 0..AHEAD.min(n) {
        prefetch(v_row(r));
    }
    let magic = _mm512_set1_ps(12_582_912.0);
    let (lo, hi) = (_mm512_set1_ps(-127.0), _mm512_set1_ps(127.0));
    for c0 in (0..dh_pad).step_by(SPAN) {
        let vecs = ((dh_pad - c0) / 16).min(SPAN / 16);
        // `abs_max_into`'s `if x > a { x } else { a }` from 0 is `max_ps(x, a)`.
        let mut amax = [_mm512_setzero_ps(); SPAN / 16];
        for r in 0..n {
            if c0 == 0 && r + AHEAD < n {
                prefetch(v_row(r + AHEAD));
            }
            let row = v_row(r).as_ptr();
            for (u, a) in amax.iter_mut().enumerate().take(vecs) {
                let c = c0 + 16 * u;
                // SAFETY: the lanes of the row below dh.
                let x = unsafe { _mm512_maskz_loadu_ps(lanes(c), row.add(c.min(dh))) };
                *a = _mm512_max_ps(_mm512_abs_ps(x), *a);
            }
        }
        let mut inv = [_mm512_setzero_ps(); SPAN / 16];
        for (u, (a, inv)) in amax.iter().zip(inv.iter_mut()).enumerate().take(vecs) {
            let c = c0 + 16 * u;
            // SAFETY: columns c..c + 16 ≤ dh_pad of `vs`.
            unsafe { _mm512_storeu_ps(vs.as_mut_ptr().add(c), _mm512_div_ps(*a, hi)) };
            let positive = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(*a, _mm512_setzero_ps());
            *inv = _mm512_maskz_div_ps(positive, hi, *a);
        }
        // With every reciprocal finite the clamp cannot act: each |x| ≤ its column's maximum,
        // so |x · inv| ≤ 127·(1 + 2⁻²⁴)², which rounds to 127 at most, and a NaN product
        // converts to 0x8000_0000, whose low byte is 0: one rounding conversion gives the
        // byte. A subnormal maximum (an infinite reciprocal) takes the clamped form.
        let unclamped = inv
            .iter()
            .take(vecs)
            .all(|&i| _mm512_cmp_ps_mask::<_CMP_LT_OQ>(i, _mm512_set1_ps(f32::INFINITY)) == !0);
        for j4 in 0..n4 {
            let rows: [Option<*const f32>; 4] = std::array::from_fn(|t| {
                let r = 4 * j4 + t;
                (r < n).then(|| v_row(r).as_ptr())
            });
            for (u, &inv) in inv.iter().enumerate().take(vecs) {
                let c = c0 + 16 * u;
                let mut word = _mm512_setzero_si512();
                for (t, row) in rows.iter().enumerate() {
                    let x = match row {
                        // SAFETY: as above.
                        Some(p) => unsafe { _mm512_maskz_loadu_ps(lanes(c), p.add(c.min(dh))) },
                        None => _mm512_setzero_ps(),
                    };
                    let byte = if unclamped {
                        _mm512_and_si512(
                            _mm512_cvt_roundps_epi32::<
                                { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
                            >(_mm512_mul_ps(x, inv)),
                            _mm512_set1_epi32(0xff),
                        )
                    } else {
                        let q = _mm512_roundscale_ps::<
                            { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
                        >(_mm512_mul_ps(x, inv));
                        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(q, q);
                        let q = _mm512_mask_mov_ps(q, nan, _mm512_setzero_ps());
                        let q = _mm512_min_ps(_mm512_max_ps(q, lo), hi);
                        // `int_byte`: the low byte of the bits of q + 1.5·2^23.
                        _mm512_and_si512(
                            _mm512_castps_si512(_mm512_add_ps(q, magic)),
                            _mm512_set1_epi32(0xff),
                        )
                    };
                    word = _mm512_or_si512(
                        word,
                        _mm512_sllv_epi32(byte, _mm512_set1_epi32(8 * t as i32)),
                    );
                }
                // SAFETY: words c..c + 16 ≤ dh_pad of row j4 < n4.
                unsafe {
                    _mm512_storeu_si512(vt.as_mut_ptr().add(j4 * dh_pad + c) as *mut _, word)
                };
            }
        }
    }
}

/// Output rows `rows` of one head, a block of `m_block` rows of which `rows.len()` are real,
/// made by `values(dst, ld, m_block)`: straight into an f32 output when the block is whole and
/// a head is whole kernel columns, else into `scratch` (`m_block` rows of the head padded to
/// [`JB`]) and copied, or quantized into a u8 output while the rows are in L1. A u8 output of
/// a whole block of whole kernel columns is first offered to `values_u8`, which quantizes in
/// registers and returns true, or returns false (nothing written) to go through f32.
///
/// # Safety
/// `out` must address this head's rows `rows` (`dh` columns each), writable and touched by no
/// other thread during the call; `values` must write exactly `m_block` rows of the padded head
/// at the pointer and stride it is given, and `values_u8` exactly those rows of the sink or
/// nothing.
unsafe fn put_head_rows(
    out: HeadOut<'_>,
    rows: std::ops::Range<usize>,
    m_block: usize,
    dh: usize,
    scratch: &mut Vec<f32>,
    values: impl FnOnce(*mut f32, usize, usize),
    values_u8: impl FnOnce(&U8Sink) -> bool,
) {
    let dh_pad = dh.div_ceil(JB) * JB;
    if dh == dh_pad && rows.len() == m_block {
        match out.dst {
            HeadDst::F32(ptr) => {
                // SAFETY: the block is the caller's rows, whole.
                values(
                    unsafe { ptr.get().add(out.at + rows.start * out.ld) },
                    out.ld,
                    m_block,
                );
                return;
            }
            HeadDst::U8(ptr, q) => {
                let sink = U8Sink {
                    // SAFETY: the block is the caller's rows, whole.
                    out: unsafe { ptr.get().add(out.at + rows.start * out.ld) },
                    ldo: out.ld,
                    inv: q.inv_smooth.map(|f| f[out.col..out.col + dh].as_ptr()),
                    scale: q.scale,
                    zero_point: q.zero_point,
                };
                if values_u8(&sink) {
                    return;
                }
            }
        }
    }
    scratch.resize(m_block * dh_pad, 0.0);
    values(scratch.as_mut_ptr(), dh_pad, m_block);
    for (r, i) in rows.enumerate() {
        let y = &scratch[r * dh_pad..][..dh];
        // SAFETY (both arms): row i of this head, the caller's.
        match out.dst {
            HeadDst::F32(ptr) => {
                unsafe { std::slice::from_raw_parts_mut(ptr.get().add(out.at + i * out.ld), dh) }
                    .copy_from_slice(y)
            }
            HeadDst::U8(ptr, q) => {
                let dst = unsafe {
                    std::slice::from_raw_parts_mut(ptr.get().add(out.at + i * out.ld), dh)
                };
                let inv = q.inv_smooth.map(|f| &f[out.col..out.col + dh]);
                super::fused::quantize_row_u8(y, inv, q.scale, q.zero_point, dst);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    /// The vectorised key side against its definition (the scalar loop of `head_i8`): head
    /// widths below, at and above one 16-word chunk, a plan that skips keys and ends in a
    /// partial group of 16, bytes over the whole u8 range; the words, compensations and scales
    /// bit for bit, and nothing written for the keys past the plan's.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_keys_equal_their_definition() {
        if !codegen::kernels::cpu_features().avx512vnni {
            eprintln!("SKIP vector_keys_equal_their_definition: no AVX512-VNNI on this CPU");
            return;
        }
        let mut next = super::super::lcg24(5);
        let (heads, tokens, scale) = (2usize, 53usize, 0.125f32);
        for dh in [8usize, 24, 64, 80, 128] {
            let h = heads * dh;
            let bytes: Vec<u8> = (0..tokens * 2 * h).map(|_| next() as u8).collect();
            let scales: Vec<f32> = (0..tokens * 2 * heads)
                .map(|_| (next() % 1000) as f32 * 1e-3)
                .collect();
            let v = vec![0f32; tokens * h];
            let src = super::Source::HeadsI8 {
                bytes: &bytes,
                scales: &scales,
                v: super::Rows {
                    data: &v,
                    ld: h,
                    offset: 0,
                },
            };
            let keys: Vec<usize> = (0..50).filter(|k| k % 7 != 3).collect();
            let plan = super::SeqPlan {
                batch: 0,
                q0: 0,
                nq: 1,
                k0: 2,
                keys: &keys,
                positions: None,
                mask_adds: false,
            };
            let (n, n_pad, dh4) = (keys.len(), keys.len().div_ceil(32) * 32, dh / 4);
            for hd in 0..heads {
                let mut kt = vec![0u32; dh4 * n_pad];
                let (mut kcomp, mut ks) = (vec![0i32; n_pad], vec![0f32; n_pad]);
                // SAFETY: the CPU has AVX512-VNNI (checked); sizes as the function asks.
                unsafe {
                    super::keys_vnni(
                        &src,
                        &plan,
                        [hd, dh],
                        scale,
                        (&mut kt, &mut kcomp, &mut ks),
                        n_pad,
                    )
                };
                for (r, &key) in keys.iter().enumerate() {
                    let row = plan.k0 + key;
                    let at = row * 2 * h + h + hd * dh;
                    let k8 = &bytes[at..at + dh];
                    let want_scale = scales[row * 2 * heads + heads + hd] * scale;
                    assert_eq!(ks[r].to_bits(), want_scale.to_bits(), "dh {dh} key {r}");
                    let sum: i32 = k8.iter().map(|&b| i32::from(b as i8)).sum();
                    assert_eq!(kcomp[r], 128 * sum, "dh {dh} key {r}");
                    for (d4, w) in k8.chunks_exact(4).enumerate() {
                        let word = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
                        assert_eq!(kt[d4 * n_pad + r], word, "dh {dh} key {r} word {d4}");
                    }
                }
                for r in n..n_pad {
                    assert_eq!(
                        (kcomp[r], ks[r]),
                        (0, 0.0),
                        "dh {dh}: key {r} past the plan"
                    );
                    assert!(
                        (0..dh4).all(|d4| kt[d4 * n_pad + r] == 0),
                        "dh {dh} key {r}"
                    );
                }
            }
        }
    }

    /// The AVX-512 quantization of v against the plain one, bit for bit: head widths that are
    /// whole vectors, partial ones and wider than one pass, key counts that leave 0-3 rows of
    /// the last word empty, values from tiny to large with NaN, ±inf and an all-zero column.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn quantized_values_are_the_same_with_avx512() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            eprintln!("SKIP quantized_values_are_the_same_with_avx512: no AVX-512F on this CPU");
            return;
        }
        let mut draw = super::super::lcg24(3);
        let mut next = move || draw() as f32 / (1 << 24) as f32 - 0.5;
        for dh in [8usize, 16, 24, 64, 80, 128] {
            for n in [1usize, 2, 3, 5, 33, 128] {
                for special in [false, true] {
                    let ld = dh + 7;
                    let mut data: Vec<f32> = (0..n * ld).map(|_| next() * 10.0).collect();
                    for r in 0..n {
                        data[r * ld + dh / 2] = 0.0;
                    }
                    if special {
                        data[(n / 2) * ld + 1] = f32::NAN;
                        data[(n - 1) * ld] = f32::INFINITY;
                        data[3 % dh] = f32::NEG_INFINITY;
                        data[ld * (n / 3) + dh - 1] = 1e-30;
                        // A column of subnormals: its reciprocal 127 / amax is infinite.
                        for r in 0..n {
                            data[r * ld + dh / 3] = 1e-40 * (r % 3) as f32;
                        }
                    }
                    let v_row = |r: usize| &data[r * ld..r * ld + dh];
                    let dh_pad = dh.div_ceil(32) * 32;
                    let n4 = n.div_ceil(4);
                    let (mut vs_a, mut vt_a) = (vec![f32::NAN; dh_pad], vec![7u32; n4 * dh_pad]);
                    let (mut vs_b, mut vt_b) = (vec![f32::NAN; dh_pad], vec![9u32; n4 * dh_pad]);
                    // SAFETY: AVX-512F checked; the sizes are those the function asks for.
                    unsafe { super::quantize_values_avx512(&v_row, n, dh, &mut vs_a, &mut vt_a) };
                    let mut scratch = (Vec::new(), Vec::new(), Vec::new());
                    super::quantize_values(
                        &v_row,
                        n,
                        dh,
                        (&mut vs_b, &mut vt_b),
                        (&mut scratch.0, &mut scratch.1, &mut scratch.2),
                    );
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&vs_a), bits(&vs_b), "scales, dh {dh} n {n}");
                    assert_eq!(vt_a, vt_b, "words, dh {dh} n {n} special {special}");
                }
            }
        }
    }

    /// The in-register 16×16 transpose against its definition, into a wider destination.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn transpose16_matches_its_definition() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            eprintln!("SKIP transpose16_matches_its_definition: no AVX-512F on this CPU");
            return;
        }
        let tile: [[f32; 16]; 16] =
            std::array::from_fn(|r| std::array::from_fn(|c| (r * 16 + c) as f32));
        let ld = 21;
        let mut out = vec![f32::NAN; 16 * ld];
        // SAFETY: AVX-512F checked; `out` holds 16 rows of `ld` ≥ 16.
        unsafe { super::transpose16_avx512(&tile, out.as_mut_ptr(), ld) };
        for c in 0..16 {
            for r in 0..16 {
                assert_eq!(out[c * ld + r], tile[r][c], "column {c} row {r}");
            }
            let rest = &out[c * ld + 16..(c + 1) * ld];
            assert!(rest.iter().all(|v| v.is_nan()), "wrote past row {c}");
        }
    }
}

//! Ops that move data without arithmetic (shape, reshape, transpose, gather, slice, …) plus the
//! small integer ops of shape subgraphs (range, cumsum) and reductions.

use ir::{DType, PadMode, ReduceOp, ScatterReduction};

use super::Arena;
use super::{broadcast_shape, broadcast_strides, for_each_row, norm_axis, strides_of, Input};
use crate::map_data;
use crate::value::{Dims, SmallInts, TensorData, TensorValue};
use crate::Error;

/// The i64 values of an integer tensor (indices, shapes, axes).
fn ints(t: &TensorValue, node: &str, op: &'static str, what: &str) -> Result<SmallInts, Error> {
    t.to_small_ints().map_err(|_| {
        Error::op(
            node,
            op,
            format!("{what} must be integer, got {}", t.dtype()),
        )
    })
}

/// `shape[start, end]`.
pub(crate) fn shape(
    x: &TensorValue,
    start: i64,
    end: Option<i64>,
    arena: &mut Arena,
) -> TensorValue {
    let r = x.rank() as i64;
    let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    let s = clamp(start);
    let e = clamp(end.unwrap_or(r)).max(s);
    let mut dims: Vec<i64> = arena.vec_with_capacity(e - s);
    dims.extend(x.shape()[s..e].iter().map(|&d| d as i64));
    TensorValue::raw([dims.len()].as_slice(), dims)
}

/// `reshape` with ONNX semantics for 0 and -1.
pub(crate) fn reshape(
    x: Input<'_>,
    spec: &TensorValue,
    allowzero: bool,
    arena: &mut Arena,
    node: &str,
) -> Result<TensorValue, Error> {
    let spec = ints(spec, node, "reshape", "the shape")?;
    let in_shape = Dims::from_slice(x.get().shape());
    let total: usize = in_shape.iter().product();
    let mut out = Dims::new();
    let mut infer = None;
    for (i, &d) in spec.iter().enumerate() {
        match d {
            0 if !allowzero => out.push(*in_shape.get(i).ok_or_else(|| {
                Error::op(
                    node,
                    "reshape",
                    format!("0 at index {i} copies a dim the input {in_shape:?} lacks"),
                )
            })?),
            -1 => {
                if infer.replace(i).is_some() {
                    return Err(Error::op(
                        node,
                        "reshape",
                        format!("more than one -1 in {spec:?}"),
                    ));
                }
                out.push(1);
            }
            d if d >= 0 => out.push(d as usize),
            d => {
                return Err(Error::op(
                    node,
                    "reshape",
                    format!("bad dimension {d} in {spec:?}"),
                ))
            }
        }
    }
    if let Some(i) = infer {
        let known: usize = out.iter().product();
        if known == 0 || !total.is_multiple_of(known) {
            return Err(Error::op(
                node,
                "reshape",
                format!("cannot infer -1 reshaping {in_shape:?} to {spec:?}"),
            ));
        }
        out[i] = total / known;
    }
    if out.iter().product::<usize>() != total {
        return Err(Error::op(
            node,
            "reshape",
            format!("cannot reshape {in_shape:?} ({total} elements) to {spec:?}"),
        ));
    }
    relabel(x, out, arena)
}

/// A new shape for the same elements (reshape, squeeze, unsqueeze, flatten): moved when owned,
/// copied into an arena buffer when borrowed.
fn relabel(x: Input<'_>, shape: Dims, arena: &mut Arena) -> Result<TensorValue, Error> {
    x.into_owned_in(arena).reshaped_dims(shape)
}

pub(crate) fn unsqueeze(
    x: Input<'_>,
    axes: &[i64],
    arena: &mut Arena,
    node: &str,
) -> Result<TensorValue, Error> {
    let in_shape = Dims::from_slice(x.get().shape());
    let rank = in_shape.len() + axes.len();
    let mut ins = axes
        .iter()
        .map(|&a| norm_axis(a, rank, node, "unsqueeze"))
        .collect::<Result<Dims, _>>()?;
    ins.sort_unstable();
    if ins.windows(2).any(|w| w[0] == w[1]) {
        return Err(Error::op(
            node,
            "unsqueeze",
            format!("repeated axes {axes:?}"),
        ));
    }
    let mut out = Dims::new();
    let mut src = in_shape.iter();
    for i in 0..rank {
        if ins.binary_search(&i).is_ok() {
            out.push(1);
        } else {
            out.push(*src.next().expect("rank arithmetic"));
        }
    }
    relabel(x, out, arena)
}

pub(crate) fn squeeze(
    x: Input<'_>,
    axes: &[i64],
    arena: &mut Arena,
    node: &str,
) -> Result<TensorValue, Error> {
    let in_shape = Dims::from_slice(x.get().shape());
    let out: Dims = if axes.is_empty() {
        in_shape.iter().copied().filter(|&d| d != 1).collect()
    } else {
        let rm = axes
            .iter()
            .map(|&a| norm_axis(a, in_shape.len(), node, "squeeze"))
            .collect::<Result<Dims, _>>()?;
        for &a in &rm {
            if in_shape[a] != 1 {
                return Err(Error::op(
                    node,
                    "squeeze",
                    format!("axis {a} of {in_shape:?} is not 1"),
                ));
            }
        }
        in_shape
            .iter()
            .enumerate()
            .filter(|(i, _)| !rm.contains(i))
            .map(|(_, &d)| d)
            .collect()
    };
    relabel(x, out, arena)
}

pub(crate) fn flatten(
    x: Input<'_>,
    axis: i64,
    arena: &mut Arena,
    node: &str,
) -> Result<TensorValue, Error> {
    let s = Dims::from_slice(x.get().shape());
    let r = s.len() as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a > r {
        return Err(Error::op(
            node,
            "flatten",
            format!("axis {axis} out of range for rank {r}"),
        ));
    }
    let a = a as usize;
    let shape = [s[..a].iter().product(), s[a..].iter().product()];
    relabel(x, Dims::from_slice(&shape), arena)
}

/// `v` transposed, appended to `out` (empty; from the arena when the caller has one).
fn transpose_typed<T: Copy>(v: &[T], shape: &[usize], perm: &[usize], mut out: Vec<T>) -> Vec<T> {
    let rank = shape.len();
    let out_shape: Dims = perm.iter().map(|&p| shape[p]).collect();
    let in_strides = strides_of(shape);
    // Strides of the input seen in output order.
    let src: Dims = perm.iter().map(|&p| in_strides[p]).collect();
    out.clear();
    out.reserve(v.len());
    if v.is_empty() {
        return out;
    }
    let inner = out_shape[rank - 1];
    let ls = src[rank - 1];
    for_each_row(&out_shape, [&src], |_, [o]| {
        if ls == 1 {
            out.extend_from_slice(&v[o..o + inner]);
        } else {
            out.extend((0..inner).map(|i| v[o + i * ls]));
        }
    });
    out
}

/// `transpose[perm](x)`; an f32 result takes its buffer from `arena` when given.
pub(crate) fn transpose(
    x: &TensorValue,
    perm: &[i64],
    arena: Option<&mut super::Arena>,
    node: &str,
) -> Result<TensorValue, Error> {
    let rank = x.rank();
    let perm: Dims = if perm.is_empty() {
        (0..rank).rev().collect()
    } else {
        perm.iter()
            .map(|&p| norm_axis(p, rank, node, "transpose"))
            .collect::<Result<_, _>>()?
    };
    let mut seen: smallvec::SmallVec<[bool; 8]> = smallvec::smallvec![false; rank];
    if perm.len() != rank || perm.iter().any(|&p| std::mem::replace(&mut seen[p], true)) {
        return Err(Error::op(
            node,
            "transpose",
            format!("{perm:?} is not a permutation of rank {rank}"),
        ));
    }
    if rank == 0 {
        return Ok(x.clone());
    }
    let out_shape: Dims = perm.iter().map(|&p| x.shape()[p]).collect();
    let sh = x.shape();
    let data = match arena {
        Some(arena) => {
            map_data!(x.data(), v => transpose_typed(v, sh, &perm, arena.vec_with_capacity(v.len())))
        }
        None => map_data!(x.data(), v => transpose_typed(v, sh, &perm, Vec::new())),
    };
    Ok(TensorValue::raw_data(out_shape, data))
}

fn concat_typed<T: Copy>(parts: &[(&[T], usize)], outer: usize, total: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(total);
    for o in 0..outer {
        for (v, chunk) in parts {
            out.extend_from_slice(&v[o * chunk..(o + 1) * chunk]);
        }
    }
    out
}

pub(crate) fn concat(xs: &[&TensorValue], axis: i64, node: &str) -> Result<TensorValue, Error> {
    let first = xs[0];
    let rank = first.rank();
    let a = norm_axis(axis, rank, node, "concat")?;
    let mut out_shape = Dims::from_slice(first.shape());
    out_shape[a] = 0;
    for x in xs {
        if x.dtype() != first.dtype() || x.rank() != rank {
            return Err(Error::op(node, "concat", "inputs differ in dtype or rank"));
        }
        for d in 0..rank {
            if d != a && x.shape()[d] != first.shape()[d] {
                return Err(Error::op(
                    node,
                    "concat",
                    format!(
                        "shapes {:?} and {:?} differ off axis {a}",
                        first.shape(),
                        x.shape()
                    ),
                ));
            }
        }
        out_shape[a] += x.shape()[a];
    }
    let outer: usize = out_shape[..a].iter().product();
    let inner: usize = out_shape[a + 1..].iter().product();
    let total: usize = out_shape.iter().product();
    macro_rules! go {
        ($variant:ident) => {{
            let parts: Vec<(&[_], usize)> = xs
                .iter()
                .map(|x| match x.data() {
                    TensorData::$variant(v) => (&v[..], x.shape()[a] * inner),
                    _ => unreachable!("dtypes checked"),
                })
                .collect();
            TensorData::$variant(concat_typed(&parts, outer, total))
        }};
    }
    let data = match first.data() {
        TensorData::F32(_) => go!(F32),
        TensorData::I64(_) => go!(I64),
        TensorData::I32(_) => go!(I32),
        TensorData::I8(_) => go!(I8),
        TensorData::U8(_) => go!(U8),
        TensorData::I16(_) => go!(I16),
        TensorData::U16(_) => go!(U16),
        TensorData::U32(_) => go!(U32),
        TensorData::U64(_) => go!(U64),
        TensorData::Bool(_) => go!(Bool),
    };
    Ok(TensorValue::raw_data(out_shape, data))
}

/// An index outside `[-dim, dim)` (or a negative one where negatives are refused).
#[derive(Debug)]
pub(crate) struct OutOfRange {
    pub index: i64,
    pub dim: usize,
}

fn split_typed<T: Copy>(
    v: &[T],
    outer: usize,
    dim: usize,
    inner: usize,
    off: usize,
    len: usize,
) -> Vec<T> {
    let mut out = Vec::with_capacity(outer * len * inner);
    for o in 0..outer {
        let start = (o * dim + off) * inner;
        out.extend_from_slice(&v[start..start + len * inner]);
    }
    out
}

/// `split(x, sizes?)` into `k` pieces along `axis`: the given sizes, or chunks of
/// `ceil(dim / k)` with the last one what remains.
pub(crate) fn split(
    x: &TensorValue,
    sizes: Option<&TensorValue>,
    axis: i64,
    k: usize,
    node: &str,
) -> Result<Vec<TensorValue>, Error> {
    let a = norm_axis(axis, x.rank(), node, "split")?;
    let dim = x.shape()[a];
    let sizes: Vec<usize> = match sizes {
        Some(t) => {
            let v = ints(t, node, "split", "the split sizes")?;
            if v.len() != k || v.iter().any(|&s| s < 0) || v.iter().sum::<i64>() != dim as i64 {
                return Err(Error::op(
                    node,
                    "split",
                    format!(
                        "sizes {v:?} must be {k} non-negative numbers summing to the size {dim} of axis {a}"
                    ),
                ));
            }
            v.into_iter().map(|s| s as usize).collect()
        }
        None => {
            let chunk = dim.div_ceil(k);
            (0..k)
                .map(|i| dim.saturating_sub(i * chunk).min(chunk))
                .collect()
        }
    };
    let outer: usize = x.shape()[..a].iter().product();
    let inner: usize = x.shape()[a + 1..].iter().product();
    let mut off = 0;
    let mut outs = Vec::with_capacity(k);
    for len in sizes {
        let mut shape = Dims::from_slice(x.shape());
        shape[a] = len;
        let d = map_data!(x.data(), v => split_typed(v, outer, dim, inner, off, len));
        outs.push(TensorValue::raw_data(shape, d));
        off += len;
    }
    Ok(outs)
}

/// The gathered rows, appended to `out` (emptied first).
fn gather_typed<T: Copy>(
    v: &[T],
    outer: usize,
    dim: usize,
    inner: usize,
    idx: &[usize],
    mut out: Vec<T>,
) -> Vec<T> {
    out.clear();
    out.reserve(outer * idx.len() * inner);
    for o in 0..outer {
        let base = o * dim * inner;
        for &i in idx {
            out.extend_from_slice(&v[base + i * inner..base + (i + 1) * inner]);
        }
    }
    out
}

/// The indices of a gather into `dim` rows, checked and made non-negative.
fn gather_indices(
    indices: &TensorValue,
    dim: usize,
    allow_negative: bool,
    arena: &mut Arena,
    node: &str,
) -> Result<Result<Vec<usize>, OutOfRange>, Error> {
    let mut norm = arena.indices(indices.len());
    let mut oor = None;
    let mut push = |i: i64| {
        let j = if i < 0 && allow_negative {
            i + dim as i64
        } else {
            i
        };
        if j < 0 || j >= dim as i64 {
            oor.get_or_insert(OutOfRange { index: i, dim });
        } else {
            norm.push(j as usize);
        }
    };
    // Token ids come as i64 or i32: read in place, no list of them is made.
    match indices.data() {
        TensorData::I64(v) => v.iter().for_each(|&i| push(i)),
        TensorData::I32(v) => v.iter().for_each(|&i| push(i as i64)),
        _ => ints(indices, node, "gather", "indices")?
            .iter()
            .for_each(|&i| push(i)),
    }
    if let Some(oor) = oor {
        arena.recycle_indices(norm);
        return Ok(Err(oor));
    }
    Ok(Ok(norm))
}

/// A constant f32 `[rows, width]` table that a gather on axis 0 reads in place from the
/// model's (memory-mapped) bytes: an embedding table is not copied into the session.
pub(crate) struct ConstTable {
    bytes: bytes::Bytes,
    rows: usize,
    width: usize,
}

impl ConstTable {
    /// The table of `t` when it is f32 `[rows, width]` with its bytes present.
    pub(crate) fn new(t: &ir::Tensor) -> Option<ConstTable> {
        let (&[rows, width], ir::DType::F32) = (t.shape(), t.dtype()) else {
            return None;
        };
        let bytes = t.bytes()?.clone();
        (bytes.len() == rows * width * 4).then_some(ConstTable { bytes, rows, width })
    }

    /// Where the table's bytes start (they are read in place, from the model's memory).
    pub(crate) fn bytes_ptr(&self) -> *const u8 {
        self.bytes.as_ptr()
    }

    #[cfg(test)]
    pub(crate) fn byte_len(&self) -> usize {
        self.bytes.len()
    }

    /// `gather[axis=0](table, indices)`, as [`gather`] does, the rows shared among `ctx`'s
    /// threads.
    pub(crate) fn gather(
        &self,
        indices: &TensorValue,
        allow_negative: bool,
        ctx: &mut super::Ctx<'_>,
        node: &str,
    ) -> Result<Result<TensorValue, OutOfRange>, Error> {
        let norm = match gather_indices(indices, self.rows, allow_negative, ctx.arena, node)? {
            Ok(n) => n,
            Err(oor) => return Ok(Err(oor)),
        };
        let w = self.width;
        let mut out = ctx.arena.f32_for_overwrite(norm.len() * w);
        // Token ids pick rows all over a table of tens of MB, each a cache miss: the rows a few
        // ids ahead are asked for before they are copied, on both threads (a batch-1 BERT-base
        // run's lookups: 0.11-0.14 ms as a per-value loop on one thread, 0.07 as byte copies
        // with the prefetch, 0.05 shared between two threads).
        const AHEAD: usize = 4;
        let row_of = |i: usize| &self.bytes[i * w * 4..(i + 1) * w * 4];
        // A table of zero-width rows gathers nothing to copy.
        if w > 0 {
            ctx.par_rows_mut(&mut out, w, |first, rows| {
                let ids = &norm[first..first + rows.len() / w];
                for &i in ids.iter().take(AHEAD) {
                    super::prefetch(row_of(i));
                }
                for (r, (&i, dst)) in ids.iter().zip(rows.chunks_exact_mut(w)).enumerate() {
                    if let Some(&ahead) = ids.get(r + AHEAD) {
                        super::prefetch(row_of(ahead));
                    }
                    copy_le_f32(dst, row_of(i));
                }
            });
        }
        ctx.arena.recycle_indices(norm);
        let mut shape = Dims::from_slice(indices.shape());
        shape.push(w);
        Ok(Ok(TensorValue::raw(shape, out)))
    }
}

/// `dst[i]` = the little-endian f32 at `src[4·i..4·i + 4]` (`src` is `4·dst.len()` bytes).
fn copy_le_f32(dst: &mut [f32], src: &[u8]) {
    assert_eq!(src.len(), 4 * dst.len(), "copy_le_f32: mismatched lengths");
    #[cfg(target_endian = "little")]
    // SAFETY: both regions hold `4·dst.len()` bytes (asserted) and cannot overlap (`dst` is
    // exclusively borrowed); on a little-endian target the bytes are the values'
    // representations as they are, and every bit pattern is a valid f32.
    unsafe {
        std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_mut_ptr() as *mut u8, src.len())
    };
    #[cfg(not(target_endian = "little"))]
    for (d, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

/// `gather[axis]`. Negative indices count from the end (ONNX) unless `allow_negative` is false,
/// which the session sets for embedding lookups of token ids: there a negative id is bad input,
/// not "the last row". With a `ctx` the result is built in a buffer of its arena, and the rows
/// of an f32 lookup on axis 0 (a small embedding table, such as token types) are copied on its
/// threads.
pub(crate) fn gather(
    data: &TensorValue,
    indices: &TensorValue,
    axis: i64,
    allow_negative: bool,
    mut ctx: Option<&mut super::Ctx<'_>>,
    node: &str,
) -> Result<Result<TensorValue, OutOfRange>, Error> {
    let a = norm_axis(axis, data.rank(), node, "gather")?;
    // Without a session's arena, a throwaway one (empty pools: nothing allocated until used).
    let mut own_arena = Arena::default();
    let dim = data.shape()[a];
    let arena = match ctx.as_deref_mut() {
        Some(c) => &mut *c.arena,
        None => &mut own_arena,
    };
    let norm = match gather_indices(indices, dim, allow_negative, arena, node)? {
        Ok(n) => n,
        Err(oor) => return Ok(Err(oor)),
    };
    let outer: usize = data.shape()[..a].iter().product();
    let inner: usize = data.shape()[a + 1..].iter().product();
    let mut out_shape = Dims::from_slice(&data.shape()[..a]);
    out_shape.extend_from_slice(indices.shape());
    out_shape.extend_from_slice(&data.shape()[a + 1..]);
    let len = outer * norm.len() * inner;
    if let (0, Some(v), Some(ctx)) = (a, data.as_f32(), ctx.as_deref_mut()) {
        let mut out = ctx.arena.f32_for_overwrite(len);
        ctx.par_copy_rows(&mut out, v, inner, |k| norm[k]);
        ctx.arena.recycle_indices(norm);
        return Ok(Ok(TensorValue::raw(out_shape, out)));
    }
    let arena = match ctx {
        Some(c) => &mut *c.arena,
        None => &mut own_arena,
    };
    let d = map_data!(data.data(), v => {
        gather_typed(v, outer, dim, inner, &norm, arena.vec_with_capacity(len))
    });
    arena.recycle_indices(norm);
    Ok(Ok(TensorValue::raw_data(out_shape, d)))
}

fn gather_elements_typed<T: Copy>(
    v: &[T],
    dshape: &[usize],
    idx: &[usize],
    ishape: &[usize],
    a: usize,
) -> Vec<T> {
    let ds = strides_of(dshape);
    let is = strides_of(ishape);
    (0..idx.len())
        .map(|flat| {
            let mut off = 0;
            for d in 0..ishape.len() {
                let c = (flat / is[d]) % ishape[d];
                off += if d == a { idx[flat] } else { c } * ds[d];
            }
            v[off]
        })
        .collect()
}

pub(crate) fn gather_elements(
    data: &TensorValue,
    indices: &TensorValue,
    axis: i64,
    node: &str,
) -> Result<TensorValue, Error> {
    let a = norm_axis(axis, data.rank(), node, "gather_elements")?;
    if indices.rank() != data.rank()
        || indices
            .shape()
            .iter()
            .zip(data.shape())
            .enumerate()
            .any(|(d, (i, s))| d != a && i > s)
    {
        return Err(Error::op(
            node,
            "gather_elements",
            format!(
                "indices {:?} do not fit data {:?}",
                indices.shape(),
                data.shape()
            ),
        ));
    }
    let dim = data.shape()[a] as i64;
    let idx = ints(indices, node, "gather_elements", "indices")?
        .into_iter()
        .map(|i| {
            let j = if i < 0 { i + dim } else { i };
            if j < 0 || j >= dim {
                Err(Error::op(
                    node,
                    "gather_elements",
                    format!("index {i} out of range for axis of {dim}"),
                ))
            } else {
                Ok(j as usize)
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    let (ds, is) = (data.shape(), indices.shape());
    let d = map_data!(data.data(), v => gather_elements_typed(v, ds, &idx, is, a));
    Ok(TensorValue::raw_data(is.to_vec(), d))
}

/// ONNX `GatherND`: each innermost row of `indices` (length `k`) addresses a slice of `data`
/// after the `batch_dims` leading dims that both share; see [`ir::Op::GatherNd`].
pub(crate) fn gather_nd(
    data: &TensorValue,
    indices: &TensorValue,
    batch_dims: i64,
    node: &str,
) -> Result<TensorValue, Error> {
    let bad = |m: String| Error::op(node, "gather_nd", m);
    let (ds, is) = (data.shape(), indices.shape());
    let b = usize::try_from(batch_dims)
        .ok()
        .filter(|&b| b < ds.len().min(is.len()))
        .ok_or_else(|| {
            bad(format!(
                "batch_dims {batch_dims} for data {ds:?} and indices {is:?}"
            ))
        })?;
    let k = is[is.len() - 1];
    if b + k > ds.len() || ds[..b] != is[..b] {
        return Err(bad(format!(
            "indices {is:?} do not address data {ds:?} with {b} batch dims"
        )));
    }
    let idx = ints(indices, node, "gather_nd", "indices")?;
    // Elements per picked slice, slices per batch, and the strides of the addressed dims.
    let inner: usize = ds[b + k..].iter().product();
    let batch_size: usize = ds[b..].iter().product();
    let rows_per_batch: usize = is[b..is.len() - 1].iter().product();
    let st = strides_of(ds);
    let rows = idx.len() / k.max(1);
    let n_rows = if k == 0 {
        is[..is.len() - 1].iter().product()
    } else {
        rows
    };
    let mut starts = Vec::with_capacity(n_rows);
    for r in 0..n_rows {
        let batch = r / rows_per_batch.max(1);
        let mut off = batch * batch_size;
        for j in 0..k {
            let dim = ds[b + j] as i64;
            let i = idx[r * k + j];
            let i = if i < 0 { i + dim } else { i };
            if i < 0 || i >= dim {
                return Err(bad(format!(
                    "index {} out of range for axis {} of {ds:?}",
                    idx[r * k + j],
                    b + j
                )));
            }
            off += i as usize * st[b + j];
        }
        starts.push(off);
    }
    let mut out_shape = is[..is.len() - 1].to_vec();
    out_shape.extend_from_slice(&ds[b + k..]);
    let d = map_data!(data.data(), v => starts
        .iter()
        .flat_map(|&s| v[s..s + inner].iter().copied())
        .collect());
    Ok(TensorValue::raw_data(out_shape, d))
}

/// The (destination in `data`, source in `updates`) element pairs of a scatter, in update
/// order: ScatterND when `axis` is `None` (see [`ir::Op::ScatterNd`]), else ScatterElements
/// on `axis` (see [`ir::Op::ScatterElements`]). Indices out of range are errors.
fn scatter_pairs(
    ds: &[usize],
    indices: &TensorValue,
    us: &[usize],
    axis: Option<i64>,
    node: &str,
) -> Result<Vec<(usize, usize)>, Error> {
    let name = if axis.is_some() {
        "scatter_elements"
    } else {
        "scatter_nd"
    };
    let bad = |m: String| Error::op(node, name, m);
    let idx = ints(indices, node, name, "indices")?;
    let is = indices.shape();
    let wrap = |i: i64, dim: usize| -> Result<usize, Error> {
        let j = if i < 0 { i + dim as i64 } else { i };
        usize::try_from(j)
            .ok()
            .filter(|&j| j < dim)
            .ok_or_else(|| bad(format!("index {i} is out of range for a dim of {dim}")))
    };
    let dst = strides_of(ds);
    match axis {
        None => {
            let k = *is
                .last()
                .ok_or_else(|| bad("indices must have rank >= 1".into()))?;
            let want: Vec<usize> = is[..is.len() - 1]
                .iter()
                .chain(ds.get(k..).unwrap_or(&[]))
                .copied()
                .collect();
            if k == 0 || k > ds.len() || us != want.as_slice() {
                return Err(bad(format!(
                    "updates {us:?} do not match indices {is:?} into data {ds:?}"
                )));
            }
            let slice: usize = ds[k..].iter().product();
            let mut pairs = Vec::with_capacity(us.iter().product());
            for (row, coords) in idx.chunks(k).enumerate() {
                let mut base = 0;
                for (j, &c) in coords.iter().take(k).enumerate() {
                    base += wrap(c, ds[j])? * dst[j];
                }
                pairs.extend((0..slice).map(|e| (base + e, row * slice + e)));
            }
            Ok(pairs)
        }
        Some(axis) => {
            let a = norm_axis(axis, ds.len(), node, name)?;
            if is != us || is.len() != ds.len() {
                return Err(bad(format!(
                    "indices {is:?} and updates {us:?} must have one shape, of data {ds:?}'s rank"
                )));
            }
            let src = strides_of(is);
            let mut pairs = Vec::with_capacity(idx.len());
            for (p, &i) in idx.iter().enumerate() {
                let mut off = 0;
                for d in 0..is.len() {
                    let c = if d == a {
                        wrap(i, ds[d])?
                    } else {
                        p / src[d] % is[d]
                    };
                    if c >= ds[d] {
                        return Err(bad(format!("indices {is:?} exceed data {ds:?}")));
                    }
                    off += c * dst[d];
                }
                pairs.push((off, p));
            }
            Ok(pairs)
        }
    }
}

/// Applies the `pairs` of a scatter to `out`, combining as `f` says.
fn scatter_apply<T: Copy>(
    out: &mut [T],
    upd: &[T],
    pairs: &[(usize, usize)],
    f: impl Fn(T, T) -> T,
) {
    for &(d, s) in pairs {
        out[d] = f(out[d], upd[s]);
    }
}

/// ONNX `ScatterND` (`axis` None) and `ScatterElements`: `data` with `updates` combined in.
pub(crate) fn scatter(
    data: TensorValue,
    indices: &TensorValue,
    updates: &TensorValue,
    axis: Option<i64>,
    reduction: ScatterReduction,
    node: &str,
) -> Result<TensorValue, Error> {
    let name = if axis.is_some() {
        "scatter_elements"
    } else {
        "scatter_nd"
    };
    if updates.dtype() != data.dtype() {
        return Err(Error::op(
            node,
            name,
            format!("updates are {}, data {}", updates.dtype(), data.dtype()),
        ));
    }
    let pairs = scatter_pairs(data.shape(), indices, updates.shape(), axis, node)?;
    let (shape, mut d) = data.into_parts();
    macro_rules! go {
        ($out:expr, $upd:expr) => {{
            let upd = $upd.expect("same dtype");
            match reduction {
                ScatterReduction::None => scatter_apply($out, upd, &pairs, |_, u| u),
                ScatterReduction::Add => scatter_apply($out, upd, &pairs, |a, u| a + u),
                ScatterReduction::Mul => scatter_apply($out, upd, &pairs, |a, u| a * u),
                ScatterReduction::Max => {
                    scatter_apply($out, upd, &pairs, |a, u| if u > a { u } else { a })
                }
                ScatterReduction::Min => {
                    scatter_apply($out, upd, &pairs, |a, u| if u < a { u } else { a })
                }
            }
        }};
    }
    match &mut d {
        TensorData::F32(v) => go!(v, updates.as_f32()),
        TensorData::I64(v) => go!(v, updates.as_i64()),
        TensorData::I32(v) => go!(v, updates.as_i32()),
        TensorData::I8(v) => go!(v, updates.as_i8()),
        TensorData::U8(v) => go!(v, updates.as_u8()),
        TensorData::I16(v) => go!(v, updates.as_slice::<i16>()),
        TensorData::U16(v) => go!(v, updates.as_slice::<u16>()),
        TensorData::U32(v) => go!(v, updates.as_slice::<u32>()),
        TensorData::U64(v) => go!(v, updates.as_slice::<u64>()),
        TensorData::Bool(v) if reduction == ScatterReduction::None => {
            scatter_apply(v, updates.as_bool().expect("same dtype"), &pairs, |_, u| u)
        }
        TensorData::Bool(_) => {
            return Err(Error::op(
                node,
                name,
                format!("reduction {} is not defined on bool", reduction.name()),
            ))
        }
    }
    Ok(TensorValue::raw_data(shape, d))
}

/// ONNX `Trilu`: see [`ir::Op::Trilu`].
pub(crate) fn trilu(
    x: &TensorValue,
    k: Option<&TensorValue>,
    upper: bool,
    node: &str,
) -> Result<TensorValue, Error> {
    let bad = |m: String| Error::op(node, "trilu", m);
    let s = x.shape();
    if s.len() < 2 {
        return Err(bad(format!("the input {s:?} has fewer than 2 dims")));
    }
    let k = match k {
        None => 0,
        Some(t) => match ints(t, node, "trilu", "k")?.as_slice() {
            [k] => *k,
            v => return Err(bad(format!("k must hold one value, holds {}", v.len()))),
        },
    };
    let (rows, cols) = (s[s.len() - 2], s[s.len() - 1]);
    let keep = |flat: usize| {
        let (i, j) = ((flat / cols.max(1)) % rows.max(1), flat % cols.max(1));
        let d = j as i64 - i as i64;
        if upper {
            d >= k
        } else {
            d <= k
        }
    };
    fn masked<T: Copy + Default>(v: &[T], keep: impl Fn(usize) -> bool) -> Vec<T> {
        v.iter()
            .enumerate()
            .map(|(f, &e)| if keep(f) { e } else { T::default() })
            .collect()
    }
    let d = map_data!(x.data(), v => masked(v, keep));
    Ok(TensorValue::raw_data(s.to_vec(), d))
}

/// ONNX `Pad`: see [`ir::Op::Pad`]. Every output element reads the input element its
/// coordinates map to on each axis, or the fill value.
pub(crate) fn pad(
    x: &TensorValue,
    pads: &TensorValue,
    value: Option<&TensorValue>,
    axes: Option<&TensorValue>,
    mode: PadMode,
    node: &str,
) -> Result<TensorValue, Error> {
    let bad = |m: String| Error::op(node, "pad", m);
    let xs = x.shape();
    let r = xs.len();
    let p = ints(pads, node, "pad", "pads")?;
    let axes: Vec<usize> = match axes {
        None => (0..r).collect(),
        Some(a) => ints(a, node, "pad", "axes")?
            .into_iter()
            .map(|a| norm_axis(a, r, node, "pad"))
            .collect::<Result<_, _>>()?,
    };
    if p.len() != 2 * axes.len() {
        return Err(bad(format!(
            "{} pads for {} axes, expected two per axis",
            p.len(),
            axes.len()
        )));
    }
    let mut begin = vec![0i64; r];
    let mut out_shape = xs.to_vec();
    for (j, &a) in axes.iter().enumerate() {
        let (b, e) = (p[j], p[j + axes.len()]);
        let n = (xs[a] as i64).checked_add(b).and_then(|n| n.checked_add(e));
        match n {
            Some(n) if n >= 0 => out_shape[a] = n as usize,
            _ => {
                return Err(bad(format!(
                    "pads {b}, {e} of axis {a} leave no valid size for dim {}",
                    xs[a]
                )))
            }
        }
        if mode != PadMode::Constant && xs[a] == 0 && out_shape[a] > 0 {
            return Err(bad(format!(
                "{} padding of the empty axis {a}",
                mode.name()
            )));
        }
        begin[a] = b;
    }
    if let Some(v) = value {
        if v.dtype() != x.dtype() || v.len() != 1 {
            return Err(bad(format!(
                "the constant value is {}{:?}, expected one {} element",
                v.dtype(),
                v.shape(),
                x.dtype()
            )));
        }
    }
    // Per axis, the input coordinate of each output coordinate (None: the fill value).
    let maps: Vec<Vec<Option<usize>>> = (0..r)
        .map(|a| {
            let d = xs[a] as i64;
            (0..out_shape[a] as i64)
                .map(|o| {
                    let i = o - begin[a];
                    let j = if (0..d).contains(&i) {
                        i
                    } else {
                        match mode {
                            PadMode::Constant => return None,
                            PadMode::Edge => i.clamp(0, d - 1),
                            PadMode::Wrap => i.rem_euclid(d),
                            PadMode::Reflect if d == 1 => 0,
                            PadMode::Reflect => {
                                let period = 2 * (d - 1);
                                let m = i.rem_euclid(period);
                                if m >= d {
                                    period - m
                                } else {
                                    m
                                }
                            }
                        }
                    };
                    Some(j as usize)
                })
                .collect()
        })
        .collect();
    let in_strides = strides_of(xs);
    let n = out_shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| bad(format!("the padded shape {out_shape:?} is too large")))?;
    // Flat input index of each output element, or None for the fill.
    let mut src: Vec<Option<usize>> = Vec::with_capacity(n);
    let mut coord = vec![0usize; r];
    for _ in 0..n {
        let mut off = Some(0usize);
        for a in 0..r {
            off = match (off, maps[a][coord[a]]) {
                (Some(o), Some(i)) => Some(o + i * in_strides[a]),
                _ => None,
            };
        }
        src.push(off);
        for a in (0..r).rev() {
            coord[a] += 1;
            if coord[a] < out_shape[a] {
                break;
            }
            coord[a] = 0;
        }
    }
    fn fill<T: crate::value::ValueElement + Default>(
        v: &[T],
        src: &[Option<usize>],
        value: Option<&TensorValue>,
    ) -> Vec<T> {
        let c = value
            .and_then(|t| t.as_slice::<T>())
            .and_then(|s| s.first().copied())
            .unwrap_or_default();
        src.iter().map(|s| s.map_or(c, |i| v[i])).collect()
    }
    let d = map_data!(x.data(), v => fill(v, &src, value));
    Ok(TensorValue::raw_data(out_shape, d))
}

fn slice_typed<T: Copy>(
    v: &[T],
    shape: &[usize],
    starts: &[i64],
    steps: &[i64],
    out_shape: &[usize],
    mut out: Vec<T>,
) -> Vec<T> {
    let in_strides = strides_of(shape);
    let n: usize = out_shape.iter().product();
    out.clear();
    out.reserve(n);
    if n == 0 {
        return out;
    }
    // Per output dim: step in input elements (may be negative), and the start offset.
    let base: i64 = starts
        .iter()
        .zip(&in_strides)
        .map(|(&s, &st)| s * st as i64)
        .sum();
    let rank = shape.len();
    let st: SmallInts = (0..rank).map(|d| steps[d] * in_strides[d] as i64).collect();
    let mut idx: Dims = smallvec::smallvec![0usize; rank];
    let mut off = base;
    for _ in 0..n {
        out.push(v[off as usize]);
        let mut d = rank;
        while d > 0 {
            d -= 1;
            idx[d] += 1;
            off += st[d];
            if idx[d] < out_shape[d] {
                break;
            }
            off -= st[d] * idx[d] as i64;
            idx[d] = 0;
        }
    }
    out
}

/// `slice(data, starts, ends, axes?, steps?)` with ONNX clamping and negative steps.
pub(crate) fn slice(
    x: &TensorValue,
    args: &[&TensorValue],
    arena: &mut Arena,
    node: &str,
) -> Result<TensorValue, Error> {
    let rank = x.rank();
    let starts = ints(args[0], node, "slice", "starts")?;
    let ends = ints(args[1], node, "slice", "ends")?;
    let axes: Dims = match args.get(2) {
        Some(t) => ints(t, node, "slice", "axes")?
            .into_iter()
            .map(|a| norm_axis(a, rank, node, "slice"))
            .collect::<Result<_, _>>()?,
        None => (0..starts.len()).collect(),
    };
    let steps = match args.get(3) {
        Some(t) => ints(t, node, "slice", "steps")?,
        None => smallvec::smallvec![1; starts.len()],
    };
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err(Error::op(
            node,
            "slice",
            "starts, ends, axes and steps differ in length",
        ));
    }
    let mut st: SmallInts = smallvec::smallvec![0i64; rank];
    let mut sp: SmallInts = smallvec::smallvec![1i64; rank];
    let mut out_shape = Dims::from_slice(x.shape());
    for (k, &a) in axes.iter().enumerate() {
        let d = x.shape()[a] as i64;
        let step = steps[k];
        if step == 0 {
            return Err(Error::op(node, "slice", "step 0"));
        }
        let norm = |v: i64| if v < 0 { v.saturating_add(d) } else { v };
        if d == 0 {
            out_shape[a] = 0;
            continue;
        }
        let (s, e) = if step > 0 {
            (norm(starts[k]).clamp(0, d), norm(ends[k]).clamp(0, d))
        } else {
            (
                norm(starts[k]).clamp(0, d - 1),
                norm(ends[k]).clamp(-1, d - 1),
            )
        };
        let count = if step > 0 {
            if e > s {
                (e - s + step - 1) / step
            } else {
                0
            }
        } else if s > e {
            (s - e + (-step) - 1) / (-step)
        } else {
            0
        };
        st[a] = s.max(0);
        sp[a] = step;
        out_shape[a] = count as usize;
    }
    let sh = x.shape();
    let len = out_shape.iter().product();
    let d = map_data!(x.data(), v => {
        slice_typed(v, sh, &st, &sp, &out_shape, arena.vec_with_capacity(len))
    });
    Ok(TensorValue::raw_data(out_shape, d))
}

fn expand_typed<T: Copy>(v: &[T], shape: &[usize], out_shape: &[usize]) -> Vec<T> {
    let s = broadcast_strides(shape, out_shape);
    let n: usize = out_shape.iter().product();
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return out;
    }
    let inner = *out_shape.last().unwrap_or(&1);
    let l = *s.last().unwrap_or(&0);
    for_each_row(out_shape, [&s], |_, [o]| {
        if l == 1 {
            out.extend_from_slice(&v[o..o + inner])
        } else {
            out.extend((0..inner).map(|i| v[o + i * l]))
        }
    });
    out
}

/// `expand(x, shape)`: bidirectional broadcast of `x` to `shape`.
pub(crate) fn expand(
    x: &TensorValue,
    spec: &TensorValue,
    node: &str,
) -> Result<TensorValue, Error> {
    let target: Vec<usize> = ints(spec, node, "expand", "the shape")?
        .into_iter()
        .map(|d| {
            usize::try_from(d).map_err(|_| Error::op(node, "expand", format!("bad dimension {d}")))
        })
        .collect::<Result<_, _>>()?;
    let out = broadcast_shape(x.shape(), &target).ok_or_else(|| {
        Error::op(
            node,
            "expand",
            format!("{:?} does not broadcast to {target:?}", x.shape()),
        )
    })?;
    let sh = x.shape();
    let d = map_data!(x.data(), v => expand_typed(v, sh, &out));
    Ok(TensorValue::raw_data(out, d))
}

fn tile_typed<T: Copy>(v: &[T], shape: &[usize], reps: &[usize], out_shape: &[usize]) -> Vec<T> {
    let n: usize = out_shape.iter().product();
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return out;
    }
    let st = strides_of(shape);
    let inner = *shape.last().unwrap_or(&1);
    let last_reps = *reps.last().unwrap_or(&1);
    // One output row of the last axis is the input row repeated; walk the other axes with an
    // odometer over output coordinates, reading input coordinate `c mod dim`.
    let outer_axes = out_shape.len().saturating_sub(1);
    let mut coord = vec![0usize; outer_axes];
    loop {
        let src: usize = (0..outer_axes).map(|k| coord[k] % shape[k] * st[k]).sum();
        let row = &v[src..src + inner];
        for _ in 0..last_reps {
            out.extend_from_slice(row);
        }
        let mut k = outer_axes;
        loop {
            if k == 0 {
                return out;
            }
            k -= 1;
            coord[k] += 1;
            if coord[k] < out_shape[k] {
                break;
            }
            coord[k] = 0;
        }
    }
}

/// `tile(x, repeats)`: `x` repeated `repeats[i]` times along axis `i`.
pub(crate) fn tile(x: &TensorValue, reps: &TensorValue, node: &str) -> Result<TensorValue, Error> {
    let r = ints(reps, node, "tile", "the repeats")?;
    if r.len() != x.rank() || r.iter().any(|&k| k < 0) {
        return Err(Error::op(
            node,
            "tile",
            format!(
                "repeats {r:?} must be one count >= 0 for each of the {} axes of {:?}",
                x.rank(),
                x.shape()
            ),
        ));
    }
    let r: Vec<usize> = r.into_iter().map(|k| k as usize).collect();
    let out_shape = x
        .shape()
        .iter()
        .zip(&r)
        .map(|(&d, &k)| d.checked_mul(k))
        .collect::<Option<Vec<usize>>>()
        .filter(|s| {
            s.iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .is_some()
        })
        .ok_or_else(|| Error::op(node, "tile", "the output is too large"))?;
    if x.rank() == 0 {
        return Ok(x.clone());
    }
    let sh = x.shape();
    let d = map_data!(x.data(), v => tile_typed(v, sh, &r, &out_shape));
    Ok(TensorValue::raw_data(out_shape, d))
}

pub(crate) fn constant_of_shape(
    spec: &TensorValue,
    value: &TensorValue,
    node: &str,
) -> Result<TensorValue, Error> {
    let shape: Vec<usize> = ints(spec, node, "constant_of_shape", "the shape")?
        .into_iter()
        .map(|d| {
            usize::try_from(d)
                .map_err(|_| Error::op(node, "constant_of_shape", format!("bad dimension {d}")))
        })
        .collect::<Result<_, _>>()?;
    if value.len() != 1 {
        return Err(Error::op(
            node,
            "constant_of_shape",
            "value must have one element",
        ));
    }
    let n: usize = shape.iter().product();
    let d = map_data!(value.data(), v => vec![v[0]; n]);
    Ok(TensorValue::raw_data(shape, d))
}

pub(crate) fn range(
    start: &TensorValue,
    limit: &TensorValue,
    delta: &TensorValue,
    node: &str,
) -> Result<TensorValue, Error> {
    let one = |t: &TensorValue| {
        if t.len() == 1 {
            Ok(())
        } else {
            Err(Error::op(
                node,
                "range",
                "start, limit and delta must be scalars",
            ))
        }
    };
    one(start)?;
    one(limit)?;
    one(delta)?;
    match (start.data(), limit.data(), delta.data()) {
        (TensorData::F32(s), TensorData::F32(l), TensorData::F32(d)) => {
            let (s, l, d) = (s[0], l[0], d[0]);
            if d == 0.0 {
                return Err(Error::op(node, "range", "delta is 0"));
            }
            let n = (((l - s) / d).ceil()).max(0.0) as usize;
            Ok(TensorValue::raw(
                vec![n],
                (0..n).map(|i| s + i as f32 * d).collect(),
            ))
        }
        _ => {
            let (s, l, d) = (
                ints(start, node, "range", "start")?[0],
                ints(limit, node, "range", "limit")?[0],
                ints(delta, node, "range", "delta")?[0],
            );
            if d == 0 {
                return Err(Error::op(node, "range", "delta is 0"));
            }
            let n = if (d > 0 && l > s) || (d < 0 && l < s) {
                ((l - s).abs() + d.abs() - 1) / d.abs()
            } else {
                0
            } as usize;
            let v: Vec<i64> = (0..n as i64).map(|i| s + i * d).collect();
            Ok(match start.dtype() {
                DType::I32 => TensorValue::raw(
                    vec![n],
                    v.into_iter().map(|x| x as i32).collect::<Vec<i32>>(),
                ),
                DType::I16 => TensorValue::raw(
                    vec![n],
                    v.into_iter().map(|x| x as i16).collect::<Vec<i16>>(),
                ),
                DType::I64 => TensorValue::raw(vec![n], v),
                other => {
                    return Err(Error::op(
                        node,
                        "range",
                        format!("not defined on {other} (f32, i16, i32, i64)"),
                    ))
                }
            })
        }
    }
}

fn cumsum_typed<T: Copy + std::ops::Add<Output = T> + Default>(
    v: &[T],
    outer: usize,
    dim: usize,
    inner: usize,
    exclusive: bool,
    reverse: bool,
) -> Vec<T> {
    let mut out = vec![T::default(); v.len()];
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| o * dim * inner + k * inner + i;
            let mut acc = T::default();
            for step in 0..dim {
                let k = if reverse { dim - 1 - step } else { step };
                if exclusive {
                    out[at(k)] = acc;
                    acc = acc + v[at(k)];
                } else {
                    acc = acc + v[at(k)];
                    out[at(k)] = acc;
                }
            }
        }
    }
    out
}

pub(crate) fn cumsum(
    x: &TensorValue,
    axis: &TensorValue,
    exclusive: bool,
    reverse: bool,
    node: &str,
) -> Result<TensorValue, Error> {
    let ax = ints(axis, node, "cumsum", "axis")?;
    if ax.len() != 1 {
        return Err(Error::op(node, "cumsum", "axis must be a scalar"));
    }
    let a = norm_axis(ax[0], x.rank(), node, "cumsum")?;
    let outer: usize = x.shape()[..a].iter().product();
    let dim = x.shape()[a];
    let inner: usize = x.shape()[a + 1..].iter().product();
    let d = match x.data() {
        TensorData::F32(v) => {
            TensorData::F32(cumsum_typed(v, outer, dim, inner, exclusive, reverse))
        }
        TensorData::I64(v) => {
            TensorData::I64(cumsum_typed(v, outer, dim, inner, exclusive, reverse))
        }
        TensorData::I32(v) => {
            TensorData::I32(cumsum_typed(v, outer, dim, inner, exclusive, reverse))
        }
        d => {
            return Err(Error::op(
                node,
                "cumsum",
                format!("not defined on {}", d.dtype()),
            ))
        }
    };
    Ok(TensorValue::raw_data(Dims::from_slice(x.shape()), d))
}

/// `reduce_*[axes, keepdims]` over f32, i64 or i32.
/// The index of the extreme element of each lane of `v` (`outer × dim × inner`, the lane along
/// `dim`); `beats(v, best)` says whether `v` replaces the best so far (on ties with `last`).
fn arg_reduce_typed<T: Copy>(
    v: &[T],
    (outer, dim, inner): (usize, usize, usize),
    beats: impl Fn(T, T) -> bool,
    last: bool,
    tie: impl Fn(T, T) -> bool,
) -> Vec<i64> {
    let mut out = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| v[(o * dim + k) * inner + i];
            let mut best = 0;
            for k in 1..dim {
                if beats(at(k), at(best)) || (last && tie(at(k), at(best))) {
                    best = k;
                }
            }
            out.push(best as i64);
        }
    }
    out
}

/// ONNX `ArgMax` / `ArgMin`: see [`ir::Op::ArgReduce`].
pub(crate) fn arg_reduce(
    x: &TensorValue,
    min: bool,
    axis: i64,
    keepdims: bool,
    last: bool,
    node: &str,
) -> Result<TensorValue, Error> {
    let name = if min { "arg_min" } else { "arg_max" };
    let a = norm_axis(axis, x.rank(), node, name)?;
    let sh = x.shape();
    if sh[a] == 0 {
        return Err(Error::op(node, name, format!("axis {axis} is empty")));
    }
    let lanes = (
        sh[..a].iter().product(),
        sh[a],
        sh[a + 1..].iter().product(),
    );
    // `better(v, best)` for values with a total order; NaN beats any number (numpy's rule).
    fn ordered<T: PartialOrd>(min: bool) -> impl Fn(T, T) -> bool {
        move |v: T, best: T| if min { v < best } else { v > best }
    }
    let out = match x.data() {
        TensorData::F32(v) => {
            let better = ordered::<f32>(min);
            let beats = |v: f32, b: f32| (v.is_nan() && !b.is_nan()) || better(v, b);
            arg_reduce_typed(v, lanes, beats, last, |v, b| {
                v == b || v.is_nan() && b.is_nan()
            })
        }
        TensorData::I64(v) => arg_reduce_typed(v, lanes, ordered(min), last, |v, b| v == b),
        TensorData::I32(v) => arg_reduce_typed(v, lanes, ordered(min), last, |v, b| v == b),
        TensorData::I8(v) => arg_reduce_typed(v, lanes, ordered(min), last, |v, b| v == b),
        TensorData::U8(v) => arg_reduce_typed(v, lanes, ordered(min), last, |v, b| v == b),
        TensorData::I16(v) => arg_reduce_typed(v, lanes, ordered(min), last, |v, b| v == b),
        TensorData::U16(v) => arg_reduce_typed(v, lanes, ordered(min), last, |v, b| v == b),
        TensorData::U32(v) => arg_reduce_typed(v, lanes, ordered(min), last, |v, b| v == b),
        TensorData::U64(v) => arg_reduce_typed(v, lanes, ordered(min), last, |v, b| v == b),
        TensorData::Bool(v) => arg_reduce_typed(v, lanes, ordered(min), last, |v, b| v == b),
    };
    let mut shape = sh.to_vec();
    if keepdims {
        shape[a] = 1;
    } else {
        shape.remove(a);
    }
    Ok(TensorValue::raw_data(shape, TensorData::I64(out)))
}

pub(crate) fn reduce(
    x: &TensorValue,
    op: ReduceOp,
    axes: &[i64],
    keepdims: bool,
    node: &str,
) -> Result<TensorValue, Error> {
    let rank = x.rank();
    let mut red = vec![axes.is_empty(); rank];
    for &a in axes {
        red[norm_axis(a, rank, node, op.name())?] = true;
    }
    let kept: Vec<usize> = x
        .shape()
        .iter()
        .zip(&red)
        .map(|(&d, &r)| if r { 1 } else { d })
        .collect();
    let out_shape: Vec<usize> = if keepdims {
        kept.clone()
    } else {
        x.shape()
            .iter()
            .zip(&red)
            .filter(|(_, &r)| !r)
            .map(|(&d, _)| d)
            .collect()
    };
    let n_out: usize = kept.iter().product();
    let count: usize = x
        .shape()
        .iter()
        .zip(&red)
        .filter(|(_, &r)| r)
        .map(|(&d, _)| d)
        .product();
    // Output offset of each input element: strides of `kept` with 0 on reduced axes.
    let ks = strides_of(&kept);
    let os: Vec<usize> = ks
        .iter()
        .zip(&red)
        .map(|(&s, &r)| if r { 0 } else { s })
        .collect();
    macro_rules! go {
        ($v:expr, $t:ty, $zero:expr, $min:expr, $max:expr, $mean:expr) => {{
            let v: &[$t] = $v;
            let init = match op {
                ReduceOp::Sum | ReduceOp::Mean => $zero,
                ReduceOp::Prod => $zero + 1 as $t,
                ReduceOp::Max => $min,
                ReduceOp::Min => $max,
            };
            let mut out = vec![init; n_out];
            let sh = x.shape();
            if !v.is_empty() {
                let inner = *sh.last().unwrap();
                let lo = *os.last().unwrap();
                let in_strides = strides_of(sh);
                for_each_row(sh, [&os, &in_strides], |_, [o, i]| {
                    for k in 0..inner {
                        let (dst, s) = (&mut out[o + k * lo], v[i + k]);
                        *dst = match op {
                            ReduceOp::Sum | ReduceOp::Mean => *dst + s,
                            ReduceOp::Prod => *dst * s,
                            ReduceOp::Max => {
                                if s > *dst {
                                    s
                                } else {
                                    *dst
                                }
                            }
                            ReduceOp::Min => {
                                if s < *dst {
                                    s
                                } else {
                                    *dst
                                }
                            }
                        };
                    }
                });
            }
            if op == ReduceOp::Mean {
                out.iter_mut().for_each(|o| *o = $mean(*o, count));
            }
            out
        }};
    }
    let d = match x.data() {
        TensorData::F32(v) => TensorData::F32(go!(
            v,
            f32,
            0.0,
            f32::NEG_INFINITY,
            f32::INFINITY,
            |s: f32, c: usize| s / c as f32
        )),
        TensorData::I64(v) => {
            TensorData::I64(go!(v, i64, 0, i64::MIN, i64::MAX, |s: i64, c: usize| s
                / (c.max(1) as i64)))
        }
        TensorData::I32(v) => {
            TensorData::I32(go!(v, i32, 0, i32::MIN, i32::MAX, |s: i32, c: usize| s
                / (c.max(1) as i32)))
        }
        // Bools have an order (false < true): Max is any, Min is all (the empty set gives
        // false and true, the identities); the sums and products are not defined on them.
        TensorData::Bool(v) if matches!(op, ReduceOp::Max | ReduceOp::Min) => {
            let bytes: Vec<u8> = v.iter().map(|&b| u8::from(b)).collect();
            let r = go!(&bytes, u8, 0, 0, 1, |s: u8, _: usize| s);
            TensorData::Bool(r.into_iter().map(|b| b != 0).collect())
        }
        d => {
            return Err(Error::op(
                node,
                op.name(),
                format!("not defined on {}", d.dtype()),
            ))
        }
    };
    Ok(TensorValue::raw_data(out_shape, d))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn i64s(shape: Vec<usize>, v: Vec<i64>) -> TensorValue {
        TensorValue::from_i64(shape, v).unwrap()
    }

    /// A table read in place gathers what the copying gather does, and refuses the same ids.
    #[test]
    fn const_table_gathers_like_gather() {
        let values: Vec<f32> = (0..15).map(|v| v as f32 * 0.5 - 2.0).collect();
        let t = ir::Tensor::from_vec(vec![5, 3], values.clone());
        let table = ConstTable::new(&t).expect("f32 [5, 3]");
        assert_eq!(table.byte_len(), 60);
        let data = TensorValue::from_f32(vec![5, 3], values).unwrap();
        let mut arena = crate::exec::Arena::default();
        let mut ctx = crate::exec::Ctx {
            threads: 2,
            arena: &mut arena,
        };
        let idx = i64s(vec![2, 2], vec![4, 0, -1, 2]);
        let got = table.gather(&idx, true, &mut ctx, "g").unwrap().unwrap();
        let want = gather(&data, &idx, 0, true, None, "g").unwrap().unwrap();
        assert_eq!(got, want);
        assert_eq!(got.shape(), &[2, 2, 3]);
        let bad = i64s(vec![1], vec![-1]);
        let oor = table.gather(&bad, false, &mut ctx, "g").unwrap();
        assert!(matches!(oor, Err(OutOfRange { index: -1, dim: 5 })));
        let far = i64s(vec![1], vec![5]);
        assert!(table.gather(&far, true, &mut ctx, "g").unwrap().is_err());
        assert!(ConstTable::new(&ir::Tensor::from_vec(vec![4], vec![1i64; 4])).is_none());
        let empty = ConstTable::new(&ir::Tensor::from_vec(vec![5, 0], Vec::<f32>::new()))
            .expect("f32 [5, 0]");
        let got = empty.gather(&idx, true, &mut ctx, "g").unwrap().unwrap();
        assert_eq!(got.shape(), &[2, 2, 0]);
    }

    /// A lookup large enough to share its rows between two threads (and with ids repeated and
    /// out of order) gathers what the copying gather does, on one thread and on two.
    #[test]
    fn const_table_gathers_large_lookups_on_two_threads() {
        let (rows, width) = (300, 257);
        let values: Vec<f32> = (0..rows * width).map(|v| (v as f32).sin()).collect();
        let table = ConstTable::new(&ir::Tensor::from_vec(vec![rows, width], values.clone()))
            .expect("f32 table");
        let data = TensorValue::from_f32(vec![rows, width], values).unwrap();
        let ids: Vec<i64> = (0..517).map(|i| (i * 7919 % rows) as i64).collect();
        let idx = i64s(vec![11, 47], ids);
        let want = gather(&data, &idx, 0, true, None, "g").unwrap().unwrap();
        for threads in [1, 2] {
            let mut arena = crate::exec::Arena::default();
            let mut ctx = crate::exec::Ctx {
                threads,
                arena: &mut arena,
            };
            let got = table.gather(&idx, true, &mut ctx, "g").unwrap().unwrap();
            assert_eq!(got, want, "{threads} threads");
            assert_eq!(got.shape(), &[11, 47, width]);
            // The plain gather of a session (a table too small to read in place) copies its
            // rows on the threads too, into a recycled buffer of garbage.
            ctx.arena
                .recycle_data(crate::TensorData::F32(vec![f32::NAN; 517 * width]));
            let plain = gather(&data, &idx, 0, true, Some(&mut ctx), "g");
            assert_eq!(plain.unwrap().unwrap(), want, "{threads} threads, plain");
        }
    }

    #[test]
    fn slice_clamps_and_steps_backwards() {
        let x = i64s(vec![2, 5], (0..10).collect());
        let s = |st: i64, en: i64, step: i64| {
            slice(
                &x,
                &[
                    &i64s(vec![1], vec![st]),
                    &i64s(vec![1], vec![en]),
                    &i64s(vec![1], vec![1]),
                    &i64s(vec![1], vec![step]),
                ],
                &mut Arena::default(),
                "s",
            )
            .unwrap()
        };
        assert_eq!(
            s(1, i64::MAX, 1).as_i64().unwrap(),
            &[1, 2, 3, 4, 6, 7, 8, 9]
        );
        assert_eq!(
            s(-1, i64::MIN, -1).as_i64().unwrap(),
            &[4, 3, 2, 1, 0, 9, 8, 7, 6, 5]
        );
        assert_eq!(s(4, 0, -2).as_i64().unwrap(), &[4, 2, 9, 7]);
        assert_eq!(s(3, 1, 1).shape(), &[2, 0]);
    }

    #[test]
    fn gather_negative_and_out_of_range() {
        let table = TensorValue::from_f32(vec![3, 2], vec![0., 1., 2., 3., 4., 5.]).unwrap();
        let g = gather(&table, &i64s(vec![2], vec![-1, 0]), 0, true, None, "g")
            .unwrap()
            .ok()
            .unwrap();
        assert_eq!(g.as_f32().unwrap(), &[4., 5., 0., 1.]);
        assert!(
            gather(&table, &i64s(vec![1], vec![-1]), 0, false, None, "g")
                .unwrap()
                .is_err()
        );
        assert!(gather(&table, &i64s(vec![1], vec![3]), 0, true, None, "g")
            .unwrap()
            .is_err());
    }

    #[test]
    fn reshape_transpose_reduce() {
        let x = TensorValue::from_f32(vec![2, 3], vec![1., 2., 3., 4., 5., 6.]).unwrap();
        let r = reshape(
            Input::Ref(&x),
            &i64s(vec![2], vec![0, -1]),
            false,
            &mut Arena::default(),
            "r",
        )
        .unwrap();
        assert_eq!(r.shape(), &[2, 3]);
        assert!(reshape(
            Input::Ref(&x),
            &i64s(vec![1], vec![4]),
            false,
            &mut Arena::default(),
            "r"
        )
        .is_err());
        let t = transpose(&x, &[1, 0], None, "t").unwrap();
        assert_eq!(t.as_f32().unwrap(), &[1., 4., 2., 5., 3., 6.]);
        let m = reduce(&x, ReduceOp::Mean, &[-1], true, "m").unwrap();
        assert_eq!(
            (m.shape(), m.as_f32().unwrap()),
            (&[2usize, 1][..], &[2.0f32, 5.0][..])
        );
        let s = reduce(&x, ReduceOp::Max, &[0], false, "m").unwrap();
        assert_eq!(s.as_f32().unwrap(), &[4., 5., 6.]);
        let c = cumsum(&x, &TensorValue::scalar(1i64), true, true, "c").unwrap();
        assert_eq!(c.as_f32().unwrap(), &[5., 3., 0., 11., 6., 0.]);
        let e = expand(
            &TensorValue::from_f32(vec![3, 1], vec![1., 2., 3.]).unwrap(),
            &i64s(vec![2], vec![1, 2]),
            "e",
        )
        .unwrap();
        assert_eq!(e.as_f32().unwrap(), &[1., 1., 2., 2., 3., 3.]);
        let rg = range(
            &TensorValue::scalar(5i64),
            &TensorValue::scalar(0i64),
            &TensorValue::scalar(-2i64),
            "r",
        )
        .unwrap();
        assert_eq!(rg.as_i64().unwrap(), &[5, 3, 1]);
    }
}

//! Padding-free execution: the real tokens of a batch packed into one run of rows
//! (`pack_rows`), laid back into the padded shape (`unpack_rows`), and the map between the two
//! that packed attention uses to find each sequence's rows.

use super::{Arena, Ctx};
use crate::value::{Dims, TensorValue};
use crate::Error;

/// Where the real tokens of a `[B, S]` mask lie: the flat positions `b·S + s` of the non-zero
/// entries in order, and where each sequence's rows start in the packed run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RowMap {
    pub batch: usize,
    pub seq: usize,
    /// Flat padded position of each packed row.
    pub rows: Vec<usize>,
    /// `starts[b]..starts[b + 1]` are the packed rows of sequence `b`.
    pub starts: Vec<usize>,
}

impl RowMap {
    /// The map of a `[B, S]` mask of any numeric or boolean dtype (non-zero = real token).
    pub fn from_mask(
        mask: &TensorValue,
        arena: &mut Arena,
        node: &str,
        op: &'static str,
    ) -> Result<RowMap, Error> {
        if mask.rank() != 2 {
            return Err(Error::op(
                node,
                op,
                format!("the mask must be [B, S], got {:?}", mask.shape()),
            ));
        }
        let (batch, seq) = (mask.shape()[0], mask.shape()[1]);
        let mut rows = arena.indices(batch * seq);
        let mut starts = arena.indices(batch + 1);
        fn real<T: Default + PartialEq>(v: &[T], i: usize) -> bool {
            v[i] != T::default()
        }
        crate::value::with_tensor_data!(mask.data(), v => {
            for b in 0..batch {
                starts.push(rows.len());
                rows.extend((b * seq..(b + 1) * seq).filter(|&i| real(v, i)));
            }
        });
        starts.push(rows.len());
        Ok(RowMap {
            batch,
            seq,
            rows,
            starts,
        })
    }

    /// Gives the index lists back to the arena.
    pub fn recycle(self, arena: &mut Arena) {
        arena.recycle_indices(self.rows);
        arena.recycle_indices(self.starts);
    }

    /// `f` on the map of `mask`, whose index lists go back to the arena afterwards.
    pub fn with<R>(
        mask: &TensorValue,
        ctx: &mut Ctx<'_>,
        node: &str,
        op: &'static str,
        f: impl FnOnce(&RowMap, &mut Ctx<'_>) -> Result<R, Error>,
    ) -> Result<R, Error> {
        let map = RowMap::from_mask(mask, ctx.arena, node, op)?;
        let result = f(&map, ctx);
        map.recycle(ctx.arena);
        result
    }

    /// The position in its sequence of packed row `r` of sequence `b`.
    pub fn position(&self, b: usize, r: usize) -> usize {
        self.rows[self.starts[b] + r] - b * self.seq
    }
}

/// Elements per row of `x` (`[B, S, …]` or `[1, T, …]`): the product of the dims after the
/// first two.
fn row_width(x: &TensorValue) -> usize {
    x.shape()[2..].iter().product()
}

/// `x` `[B, S, …]` → `[1, T, …]`: the rows of the real tokens of `mask`, in order. A `[1, S, …]`
/// `x` (one row per position, the same for every sequence: position embeddings) gives each
/// real token the row of its position.
pub(crate) fn pack_rows(
    x: &TensorValue,
    mask: &TensorValue,
    ctx: &mut Ctx<'_>,
    node: &str,
) -> Result<TensorValue, Error> {
    RowMap::with(mask, ctx, node, "pack_rows", |map, ctx| {
        pack_mapped(x, map, ctx, node)
    })
}

fn pack_mapped(
    x: &TensorValue,
    map: &RowMap,
    ctx: &mut Ctx<'_>,
    node: &str,
) -> Result<TensorValue, Error> {
    let lead = |b: usize| x.rank() >= 2 && x.shape()[..2] == [b, map.seq];
    if !(lead(map.batch) || lead(1)) {
        return Err(Error::op(
            node,
            "pack_rows",
            format!(
                "x {:?} must start with the mask's [{}, {}] (or [1, {}]: a row per position)",
                x.shape(),
                map.batch,
                map.seq,
                map.seq
            ),
        ));
    }
    // Row `r` of the padded batch is position `r mod S` of its sequence.
    let per_position = x.shape()[0] != map.batch;
    let src_row = |r: usize| if per_position { r % map.seq } else { r };
    let w = row_width(x);
    let mut shape: Dims = smallvec::smallvec![1, map.rows.len()];
    shape.extend_from_slice(&x.shape()[2..]);
    if let Some(src) = x.as_f32() {
        // Blocks of rows on the session's threads: the position embeddings of a part of 1024
        // tokens are 3 MB, which one thread copied in ~0.2 ms while the other waited.
        let mut out = ctx.arena.f32_for_overwrite(map.rows.len() * w);
        ctx.par_copy_rows(&mut out, src, w, |k| src_row(map.rows[k]));
        return Ok(TensorValue::raw(shape, out));
    }
    // Token ids and other dtypes in recycled buffers too: a run allocates no activations.
    let data = crate::map_data!(x.data(), v => {
        let mut out = ctx.arena.vec_with_capacity(map.rows.len() * w);
        for &r in &map.rows {
            out.extend_from_slice(&v[src_row(r) * w..][..w]);
        }
        out
    });
    Ok(TensorValue::raw_data(shape, data))
}

/// `y` `[1, T, …]` → `[B, S, …]`: each packed row back at its real token of `mask`, zeros at
/// the padding.
pub(crate) fn unpack_rows(
    y: &TensorValue,
    mask: &TensorValue,
    ctx: &mut Ctx<'_>,
    node: &str,
) -> Result<TensorValue, Error> {
    RowMap::with(mask, ctx, node, "unpack_rows", |map, ctx| {
        unpack_mapped(y, map, ctx, node)
    })
}

fn unpack_mapped(
    y: &TensorValue,
    map: &RowMap,
    ctx: &mut Ctx<'_>,
    node: &str,
) -> Result<TensorValue, Error> {
    if y.rank() < 2 || y.shape()[..2] != [1, map.rows.len()] {
        return Err(Error::op(
            node,
            "unpack_rows",
            format!(
                "y {:?} must be [1, {}, …]: one row per real token of the mask",
                y.shape(),
                map.rows.len()
            ),
        ));
    }
    let w = row_width(y);
    let mut shape: Dims = smallvec::smallvec![map.batch, map.seq];
    shape.extend_from_slice(&y.shape()[2..]);
    let len = map.batch * map.seq * w;
    if let Some(src) = y.as_f32() {
        // Each padded row is its packed row or zeros, written once, blocks of rows on the
        // session's threads (the model's output: 3 MB at batch 8 × 128, which one thread
        // zeroed and then copied in 0.9 ms). The packed rows ascend with the padded ones, so a
        // block's first packed row is found by bisection and the rest follow in order.
        let mut out = ctx.arena.f32_for_overwrite(len);
        let rows = &map.rows;
        ctx.par_rows_mut(&mut out, w.max(1), |r0, block| {
            let mut k = rows.partition_point(|&r| r < r0);
            for (i, dst) in block.chunks_exact_mut(w.max(1)).enumerate() {
                if rows.get(k) == Some(&(r0 + i)) {
                    dst.copy_from_slice(&src[k * w..][..w]);
                    k += 1;
                } else {
                    dst.fill(0.0);
                }
            }
        });
        return Ok(TensorValue::raw(shape, out));
    }
    let data = crate::map_data!(y.data(), v => {
        let mut out = vec![Default::default(); len];
        for (i, &r) in map.rows.iter().enumerate() {
            out[r * w..][..w].copy_from_slice(&v[i * w..][..w]);
        }
        out
    });
    Ok(TensorValue::raw_data(shape, data))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::Arena;

    #[test]
    fn pack_then_unpack_restores_real_rows_and_zeros_padding() {
        let mut arena = Arena::default();
        let mut ctx = Ctx {
            threads: 1,
            arena: &mut arena,
        };
        let x = TensorValue::from_f32(vec![2, 3, 2], (0..12).map(|v| v as f32).collect()).unwrap();
        let mask = TensorValue::from_i64(vec![2, 3], vec![1, 1, 0, 0, 1, 1]).unwrap();
        let p = pack_rows(&x, &mask, &mut ctx, "p").unwrap();
        assert_eq!(p.shape(), &[1, 4, 2]);
        assert_eq!(p.as_f32().unwrap(), &[0., 1., 2., 3., 8., 9., 10., 11.]);
        let u = unpack_rows(&p, &mask, &mut ctx, "u").unwrap();
        assert_eq!(
            u.as_f32().unwrap(),
            &[0., 1., 2., 3., 0., 0., 0., 0., 8., 9., 10., 11.]
        );
        let xi = TensorValue::from_u8(vec![2, 3], vec![1, 2, 3, 4, 5, 6]).unwrap();
        let pi = pack_rows(&xi, &mask, &mut ctx, "p").unwrap();
        assert_eq!(pi.shape(), &[1, 4]);
        assert_eq!(pi.as_u8().unwrap(), &[1, 2, 5, 6]);
        let map = RowMap::from_mask(&mask, ctx.arena, "m", "pack_rows").unwrap();
        assert_eq!(map.starts, vec![0, 2, 4]);
        assert_eq!(map.position(1, 0), 1);
        let bad = TensorValue::from_i64(vec![2, 2], vec![1; 4]).unwrap();
        assert!(pack_rows(&x, &bad, &mut ctx, "p").is_err());
        assert!(unpack_rows(&x, &mask, &mut ctx, "u").is_err());
    }

    /// Unpacking on two threads (blocks of padded rows each finding their first packed row)
    /// gives what the definition does: each real row where the mask puts it, every padded row
    /// zero, whatever the arena's buffer held before; sequences with no real token, all real
    /// tokens, and padding at both ends of a block.
    #[test]
    fn unpacking_on_threads_puts_every_row_where_the_mask_says() {
        let mut arena = Arena::default();
        // A recycled buffer of garbage, so that a row left unwritten shows.
        arena.recycle_data(crate::TensorData::F32(vec![f32::NAN; 64 * 40 * 24]));
        let mut ctx = Ctx {
            threads: 2,
            arena: &mut arena,
        };
        let (batch, seq, w) = (64usize, 40usize, 24usize);
        let mask: Vec<i64> = (0..batch * seq)
            .map(|i| {
                let (b, s) = (i / seq, i % seq);
                match b % 4 {
                    0 => 1,
                    1 => 0,
                    _ => i64::from(s < (b * 7) % seq || s % 5 == 3),
                }
            })
            .collect();
        let real: Vec<usize> = (0..batch * seq).filter(|&i| mask[i] != 0).collect();
        let mask = TensorValue::from_i64(vec![batch, seq], mask).unwrap();
        let packed: Vec<f32> = (0..real.len() * w).map(|v| v as f32 + 0.5).collect();
        let y = TensorValue::from_f32(vec![1, real.len(), w], packed.clone()).unwrap();
        let u = unpack_rows(&y, &mask, &mut ctx, "u").unwrap();
        assert_eq!(u.shape(), &[batch, seq, w]);
        let mut want = vec![0f32; batch * seq * w];
        for (k, &r) in real.iter().enumerate() {
            want[r * w..][..w].copy_from_slice(&packed[k * w..][..w]);
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(u.as_f32().unwrap()), bits(&want));
    }

    /// Packing on two threads takes each real token's row, from a `[B, S, …]` value and from a
    /// `[1, S, …]` one (a row per position), into a recycled buffer of garbage (a row left
    /// unwritten shows).
    #[test]
    fn packing_on_threads_takes_every_real_row() {
        let mut arena = Arena::default();
        let (batch, seq, w) = (48usize, 40usize, 24usize);
        let mask: Vec<i64> = (0..batch * seq)
            .map(|i| {
                let (b, s) = (i / seq, i % seq);
                i64::from(b % 3 == 0 || s < (b * 7) % seq || s % 5 == 3)
            })
            .collect();
        let real: Vec<usize> = (0..batch * seq).filter(|&i| mask[i] != 0).collect();
        let mask = TensorValue::from_i64(vec![batch, seq], mask).unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for lead in [batch, 1] {
            arena.recycle_data(crate::TensorData::F32(vec![f32::NAN; real.len() * w]));
            let mut ctx = Ctx {
                threads: 2,
                arena: &mut arena,
            };
            let x: Vec<f32> = (0..lead * seq * w).map(|v| v as f32 + 0.25).collect();
            let xt = TensorValue::from_f32(vec![lead, seq, w], x.clone()).unwrap();
            let p = pack_rows(&xt, &mask, &mut ctx, "p").unwrap();
            assert_eq!(p.shape(), &[1, real.len(), w]);
            let want: Vec<f32> = real
                .iter()
                .flat_map(|&r| {
                    let src = if lead == 1 { r % seq } else { r };
                    x[src * w..][..w].iter().copied()
                })
                .collect();
            assert_eq!(bits(p.as_f32().unwrap()), bits(&want), "lead {lead}");
        }
    }

    /// A `[1, S, …]` value (position embeddings) packs to the row of each real token's
    /// position; f32 and other dtypes alike, and a wrong sequence length is an error naming
    /// the node.
    #[test]
    fn a_row_per_position_packs_to_each_tokens_position() {
        let mut arena = Arena::default();
        let mut ctx = Ctx {
            threads: 1,
            arena: &mut arena,
        };
        let mask = TensorValue::from_i64(vec![3, 3], vec![1, 1, 0, 0, 1, 1, 1, 0, 1]).unwrap();
        let pos = TensorValue::from_f32(vec![1, 3, 2], vec![0., 1., 10., 11., 20., 21.]).unwrap();
        let p = pack_rows(&pos, &mask, &mut ctx, "p").unwrap();
        assert_eq!(p.shape(), &[1, 6, 2]);
        assert_eq!(
            p.as_f32().unwrap(),
            &[0., 1., 10., 11., 10., 11., 20., 21., 0., 1., 20., 21.]
        );
        let ids = TensorValue::from_u8(vec![1, 3], vec![7, 8, 9]).unwrap();
        let pi = pack_rows(&ids, &mask, &mut ctx, "p").unwrap();
        assert_eq!(pi.as_u8().unwrap(), &[7, 8, 8, 9, 7, 9]);
        let short = TensorValue::from_f32(vec![1, 2, 2], vec![0.; 4]).unwrap();
        let err = pack_rows(&short, &mask, &mut ctx, "emb/pack").unwrap_err();
        assert!(err.to_string().contains("emb/pack"), "{err}");
    }
}

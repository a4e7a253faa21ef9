//! The kernels of the interpreter: one function per IR op, over [`TensorValue`]s.
//!
//! Every function takes the node's name for its errors and returns an [`Error::Op`] naming the
//! node and op on any shape or dtype it cannot handle; none panics on bad data.

pub(crate) mod attention;
pub(crate) mod attn_int8;
pub(crate) mod attn_kernels;
pub(crate) mod control;
pub(crate) mod elementwise;
pub(crate) mod fused;
pub(crate) mod nn;
pub(crate) mod packing;
pub(crate) mod quant;
pub(crate) mod shape_ops;
pub(crate) mod simd;

use std::ops::Range;

use codegen::kernels::pool::{parallel_chunks, parallel_owned_chunks};

use crate::value::{Dims, TensorValue};
use crate::Error;

/// The values a kernel returns: one, or a few (split, quantized heads, a LayerNorm's value with
/// its rows quantized and their parameters), inline.
pub(crate) type Outs = smallvec::SmallVec<[TensorValue; 4]>;

/// What a kernel may use besides its inputs: the thread count and a pool of recycled buffers.
///
/// Parallel parts run on codegen's persistent pool (the calling thread is part 0), the same
/// workers as the GEMMs: one set of threads for the whole run, still spinning from the previous
/// GEMM when a LayerNorm or an attention starts.
pub(crate) struct Ctx<'a> {
    pub threads: usize,
    pub arena: &'a mut Arena,
}

/// The smallest free buffer of `pool` with room for `len` elements and at most twice that (or
/// 1024): a small value (an output that leaves with its buffer) never takes a large one, whose
/// replacement would then differ from run to run, so the pool settles after one run.
fn take_fitting<T>(pool: &mut Vec<Vec<T>>, len: usize) -> Option<Vec<T>> {
    let most = len.saturating_mul(2).max(1024);
    let best = pool
        .iter()
        .enumerate()
        .filter(|(_, v)| v.capacity() >= len && v.capacity() <= most)
        .min_by_key(|(_, v)| v.capacity())
        .map(|(i, _)| i)?;
    Some(pool.swap_remove(best))
}

/// Slots of the f32 and byte pools: the search is linear, so they are bounded.
const F32_SLOTS: usize = 64;
const BYTE_SLOTS: usize = 32;

/// Puts `v` in `pool`; a full pool gives up its smallest buffer for a larger `v` (and keeps
/// itself otherwise). Buffers that come in without being taken back out (a kernel that
/// allocates its small output itself) would otherwise fill the slots over a few dozen runs,
/// after which every activation buffer was dropped on recycling and allocated again, in fresh
/// pages, on the next run: 57 MB of page faults per BERT-base batch of 8.
fn keep<T>(pool: &mut Vec<Vec<T>>, v: Vec<T>, slots: usize) {
    if pool.len() < slots {
        pool.push(v);
        return;
    }
    let smallest = pool
        .iter()
        .enumerate()
        .min_by_key(|(_, b)| b.capacity())
        .map(|(i, b)| (i, b.capacity()));
    if let Some((i, cap)) = smallest {
        if cap < v.capacity() {
            pool[i] = v;
        }
    }
}

/// Freed buffers kept for reuse (f32; bytes for u8 and i8 values; small buffers and the other
/// dtypes; index lists; attention plans): an intermediate dies after its last consumer ran and
/// its vector comes back here, so a steady-state run allocates nothing but what it hands to the
/// caller (`tests/steady_state_alloc.rs`).
#[derive(Default)]
pub(crate) struct Arena {
    free: Vec<Vec<f32>>,
    bytes: Vec<Vec<u8>>,
    /// Buffers of under [`TINY`] elements (masks, scales, shape vectors) and of the other
    /// dtypes (i64 shapes and positions, bools), kept whole and searched by dtype: without them
    /// every run allocates its small values afresh.
    small: Vec<crate::TensorData>,
    /// Index lists (packed rows, attention keys and positions).
    indices: Vec<Vec<usize>>,
    /// The sequence plans of an attention call, kept for their capacity (empty between calls).
    seq_spans: Vec<attention::SeqSpan>,
}

/// Buffers shorter than this go to [`Arena::small`], not to the f32 and byte pools.
const TINY: usize = 256;
const SMALL_SLOTS: usize = 48;
const INDEX_SLOTS: usize = 16;

impl Arena {
    /// A zero-filled vector of `len` elements, reusing the smallest free buffer that fits.
    pub fn f32_zeroed(&mut self, len: usize) -> Vec<f32> {
        match self.take_fitting(len) {
            Some(mut v) => {
                v.clear();
                v.resize(len, 0.0);
                v
            }
            None => vec![0.0; len],
        }
    }

    /// A vector of `len` elements whose contents are unspecified (stale values of a dead
    /// intermediate, or zeros): for outputs that the kernel overwrites entirely, so that no
    /// time goes into zero-filling them.
    pub fn f32_for_overwrite(&mut self, len: usize) -> Vec<f32> {
        match self.take_fitting(len) {
            Some(mut v) => {
                v.truncate(len);
                v.resize(len, 0.0);
                v
            }
            None => vec![0.0; len],
        }
    }

    fn take_fitting(&mut self, len: usize) -> Option<Vec<f32>> {
        if len < TINY {
            if let Some(v) = self.take_small(len) {
                return Some(v);
            }
        }
        take_fitting(&mut self.free, len)
    }

    /// An empty index list with room for `len` (recycled when one fits).
    pub fn indices(&mut self, len: usize) -> Vec<usize> {
        match take_fitting(&mut self.indices, len) {
            Some(mut v) => {
                v.clear();
                v
            }
            None => Vec::with_capacity(len),
        }
    }

    /// Takes back an index list from [`Arena::indices`].
    pub fn recycle_indices(&mut self, v: Vec<usize>) {
        if v.capacity() > 0 {
            keep(&mut self.indices, v, INDEX_SLOTS);
        }
    }

    /// The buffers of an attention call's plans: its span list and an index list with room
    /// for `ints`.
    pub(crate) fn plan_buffers(&mut self, ints: usize) -> (Vec<attention::SeqSpan>, Vec<usize>) {
        let mut spans = std::mem::take(&mut self.seq_spans);
        spans.clear();
        (spans, self.indices(ints))
    }

    /// Takes back the buffers of [`Arena::plan_buffers`].
    pub(crate) fn recycle_plan_buffers(
        &mut self,
        spans: Vec<attention::SeqSpan>,
        ints: Vec<usize>,
    ) {
        if spans.capacity() > self.seq_spans.capacity() {
            self.seq_spans = spans;
        }
        self.recycle_indices(ints);
    }

    /// A recycled vector of `T` with room for `len` (the smallest that fits, at most twice
    /// as large or 1024), empty.
    fn take_small<T: crate::value::ValueElement>(&mut self, len: usize) -> Option<Vec<T>> {
        let most = len.saturating_mul(2).max(1024);
        let cap = |d: &mut crate::TensorData| T::vec_mut(d).map(|v| v.capacity());
        let best = self
            .small
            .iter_mut()
            .enumerate()
            .filter_map(|(i, d)| cap(d).map(|c| (i, c)))
            .filter(|&(_, c)| c >= len && c <= most)
            .min_by_key(|&(_, c)| c)
            .map(|(i, _)| i)?;
        let mut v = T::unwrap(self.small.swap_remove(best)).ok()?;
        v.clear();
        Some(v)
    }

    /// An empty vector of `T` with room for `len` elements, recycled when one fits: for the
    /// small values of other dtypes (shape vectors, positions) that kernels fill by pushing.
    pub fn vec_with_capacity<T: crate::value::ValueElement>(&mut self, len: usize) -> Vec<T> {
        if T::DTYPE == ir::DType::F32 && len >= TINY {
            if let Some(mut v) = take_fitting(&mut self.free, len) {
                v.clear();
                // f32 is T here (checked by DTYPE): round trip through the wrapper.
                if let Ok(v) = T::unwrap(crate::TensorData::F32(v)) {
                    return v;
                }
            }
        }
        self.take_small(len)
            .unwrap_or_else(|| Vec::with_capacity(len))
    }

    /// A copy of `t` in recycled buffers.
    pub fn copy_of(&mut self, t: &TensorValue) -> TensorValue {
        let data = crate::map_data!(t.data(), v => {
            let mut out = self.vec_with_capacity(v.len());
            out.extend_from_slice(v);
            out
        });
        TensorValue::raw_data(t.shape(), data)
    }

    fn keep_small(&mut self, d: crate::TensorData) {
        let cap = crate::TensorData::byte_capacity;
        if self.small.len() < SMALL_SLOTS {
            self.small.push(d);
            return;
        }
        if let Some((i, c)) = self
            .small
            .iter()
            .enumerate()
            .map(|(i, b)| (i, cap(b)))
            .min_by_key(|&(_, c)| c)
        {
            if c < cap(&d) {
                self.small[i] = d;
            }
        }
    }

    /// A byte buffer of `len` with unspecified contents, for data a kernel overwrites; give it
    /// back with [`Arena::recycle_bytes`] (or [`Arena::recycle`] in a u8 or i8 tensor). The
    /// smallest free buffer that fits and is at most twice as large (as for f32).
    pub fn bytes_for_overwrite(&mut self, len: usize) -> Vec<u8> {
        let small = if len < TINY {
            self.take_small(len)
        } else {
            None
        };
        match small.or_else(|| take_fitting(&mut self.bytes, len)) {
            Some(mut v) => {
                v.truncate(len);
                v.resize(len, 0);
                v
            }
            None => vec![0; len],
        }
    }

    /// [`Arena::bytes_for_overwrite`] as i8.
    pub fn i8_for_overwrite(&mut self, len: usize) -> Vec<i8> {
        let mut v = std::mem::ManuallyDrop::new(self.bytes_for_overwrite(len));
        // SAFETY: u8 and i8 have the same size and alignment and every bit pattern is valid for
        // both, so the allocation (its layout included) is a valid Vec<i8> of the same length
        // and capacity; the ManuallyDrop keeps the Vec<u8> from freeing it.
        unsafe { Vec::from_raw_parts(v.as_mut_ptr() as *mut i8, v.len(), v.capacity()) }
    }

    /// Takes back a byte buffer from [`Arena::bytes_for_overwrite`].
    pub fn recycle_bytes(&mut self, v: Vec<u8>) {
        if v.capacity() >= TINY {
            keep(&mut self.bytes, v, BYTE_SLOTS);
        } else if v.capacity() > 0 {
            self.keep_small(crate::TensorData::U8(v));
        }
    }

    /// Takes back the buffer of a value that died.
    pub fn recycle(&mut self, t: TensorValue) {
        self.recycle_data(t.into_data())
    }

    /// Takes back a buffer that was not in a tensor (quantization parameters, positions).
    pub fn recycle_data(&mut self, d: crate::TensorData) {
        match d {
            crate::TensorData::F32(v) if v.capacity() >= TINY => keep(&mut self.free, v, F32_SLOTS),
            crate::TensorData::U8(v) => self.recycle_bytes(v),
            crate::TensorData::I8(v) => {
                let mut v = std::mem::ManuallyDrop::new(v);
                // SAFETY: as in `i8_for_overwrite`, the other way round.
                let bytes = unsafe {
                    Vec::from_raw_parts(v.as_mut_ptr() as *mut u8, v.len(), v.capacity())
                };
                self.recycle_bytes(bytes)
            }
            d if d.capacity() > 0 => self.keep_small(d),
            _ => {}
        }
    }
}

/// An input of a kernel: borrowed, or owned when this node is its last consumer (so the kernel
/// may reuse its buffer or move it, as reshapes do).
pub(crate) enum Input<'a> {
    Ref(&'a TensorValue),
    Own(TensorValue),
}

impl Input<'_> {
    pub fn get(&self) -> &TensorValue {
        match self {
            Input::Ref(t) => t,
            Input::Own(t) => t,
        }
    }

    pub fn is_owned(&self) -> bool {
        matches!(self, Input::Own(_))
    }

    /// The value, moved when owned and copied otherwise.
    pub fn into_owned(self) -> TensorValue {
        match self {
            Input::Ref(t) => t.clone(),
            Input::Own(t) => t,
        }
    }

    /// [`Input::into_owned`], copying into a buffer of `arena`.
    pub fn into_owned_in(self, arena: &mut Arena) -> TensorValue {
        match self {
            Input::Ref(t) => arena.copy_of(t),
            Input::Own(t) => t,
        }
    }
}

pub(crate) use codegen::kernels::SharedPtr;

impl Ctx<'_> {
    /// Splits `out` (made of rows of `row_len` elements) into one contiguous block of rows per
    /// thread and runs `f(first_row, block)` on each.
    pub fn par_rows_mut<T: Send>(
        &self,
        out: &mut [T],
        row_len: usize,
        f: impl Fn(usize, &mut [T]) + Sync,
    ) {
        let work = out.len();
        self.par_rows_mut_work(out, row_len, work, f)
    }

    /// Row `k` of `out` is row `index(k)` of `src` (rows of `width` f32), copied in blocks of
    /// rows on the threads: a lookup's or a packing's rows, which one thread copied while the
    /// others waited.
    pub fn par_copy_rows(
        &self,
        out: &mut [f32],
        src: &[f32],
        width: usize,
        index: impl Fn(usize) -> usize + Sync,
    ) {
        if width == 0 {
            return;
        }
        self.par_rows_mut(out, width, |first, rows| {
            for (k, dst) in rows.chunks_exact_mut(width).enumerate() {
                dst.copy_from_slice(&src[index(first + k) * width..][..width]);
            }
        });
    }

    /// [`Ctx::par_rows_mut`] with the amount of work given (e.g. m·n·k for a product).
    pub fn par_rows_mut_work<T: Send>(
        &self,
        out: &mut [T],
        row_len: usize,
        work: usize,
        f: impl Fn(usize, &mut [T]) + Sync,
    ) {
        let rows = out.len().checked_div(row_len).unwrap_or(0);
        let parts = self.parts(rows, work);
        if parts <= 1 {
            f(0, out);
            return;
        }
        let len = out.len();
        let ptr = SharedPtr(out.as_mut_ptr());
        parallel_chunks(rows, parts, |r| {
            let (start, end) = (r.start * row_len, (r.end * row_len).min(len));
            // SAFETY: each chunk of rows is claimed once, so the blocks are disjoint, inside
            // `out`, which outlives the call (parallel_for returns when every part is done).
            let block =
                unsafe { std::slice::from_raw_parts_mut(ptr.get().add(start), end - start) };
            f(r.start, block);
        });
    }

    /// Runs `f(range)` over `tasks` split into one contiguous range per thread when `work`
    /// (element-operations) is worth it.
    pub fn par_tasks(&self, tasks: usize, work: usize, f: impl Fn(Range<usize>) + Sync) {
        let parts = self.parts(tasks, work);
        if parts <= 1 {
            f(0..tasks);
            return;
        }
        parallel_chunks(tasks, parts, f);
    }

    /// [`Ctx::par_tasks`] where thread `t` starts with the `t`-th contiguous share of the tasks
    /// (then helps with the others' tails): for tasks whose inputs the step before left in that
    /// thread's cache (see `pool::parallel_owned_chunks`).
    pub fn par_owned_tasks(&self, tasks: usize, work: usize, f: impl Fn(Range<usize>) + Sync) {
        // One part runs the whole range on this thread, without the pool.
        parallel_owned_chunks(tasks, self.parts(tasks, work), f);
    }

    /// Threads for one GEMM of `work` multiply-adds: products under 4M MACs (~0.1 ms on one
    /// core) stay on one thread, since handing half to a second thread costs a wake-up that is
    /// comparable, and far more when the machine is busy (measured: MiniLM at 1×16 tokens took
    /// 38 ms with every GEMM split over 2 threads on a loaded 2-core machine, 7 ms on one).
    pub fn gemm_threads(&self, work: usize) -> usize {
        if work < 4 * 1024 * 1024 {
            1
        } else {
            self.threads
        }
    }

    fn parts(&self, rows: usize, work: usize) -> usize {
        // Below ~32k element-operations the wake-up of a pool thread costs more than it saves.
        if self.threads <= 1 || rows < 2 || work < 32 * 1024 {
            1
        } else {
            self.threads.min(rows)
        }
    }
}

/// Normalises a possibly negative axis against `rank` (ONNX convention).
pub(crate) fn norm_axis(
    axis: i64,
    rank: usize,
    node: &str,
    op: &'static str,
) -> Result<usize, Error> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a >= r {
        return Err(Error::op(
            node,
            op,
            format!("axis {axis} is out of range for rank {rank}"),
        ));
    }
    Ok(a as usize)
}

/// Numpy broadcasting of two shapes.
pub(crate) fn broadcast_shape(a: &[usize], b: &[usize]) -> Option<Dims> {
    let rank = a.len().max(b.len());
    let mut out: Dims = smallvec::smallvec![0; rank];
    for i in 0..rank {
        let da = if i + a.len() >= rank {
            a[i + a.len() - rank]
        } else {
            1
        };
        let db = if i + b.len() >= rank {
            b[i + b.len() - rank]
        } else {
            1
        };
        out[i] = if da == db {
            da
        } else if da == 1 {
            db
        } else if db == 1 {
            da
        } else {
            return None;
        };
    }
    Some(out)
}

/// Element strides of `shape` aligned to the right of `out` (rank ≥ shape's), with 0 on
/// broadcast dimensions.
pub(crate) fn broadcast_strides(shape: &[usize], out: &[usize]) -> Dims {
    let mut strides: Dims = smallvec::smallvec![0; out.len()];
    let off = out.len() - shape.len();
    let mut s = 1;
    for i in (0..shape.len()).rev() {
        strides[off + i] = if shape[i] == 1 { 0 } else { s };
        s *= shape[i];
    }
    strides
}

/// Contiguous row-major strides.
pub(crate) fn strides_of(shape: &[usize]) -> Dims {
    let mut s: Dims = smallvec::smallvec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Calls `f(out_offset_of_row, offsets)` for every row (all dims but the last) of `out_shape`,
/// where `offsets[j]` is the element offset of that row's start in operand `j` whose broadcast
/// strides are `strides[j]`. The caller loops over the last dimension itself with stride
/// `strides[j][last]`.
pub(crate) fn for_each_row<const N: usize>(
    out_shape: &[usize],
    strides: [&[usize]; N],
    mut f: impl FnMut(usize, [usize; N]),
) {
    let rank = out_shape.len();
    if rank == 0 {
        f(0, [0; N]);
        return;
    }
    if out_shape.contains(&0) {
        return;
    }
    let inner = out_shape[rank - 1];
    let outer_dims = &out_shape[..rank - 1];
    let rows: usize = outer_dims.iter().product();
    let mut idx: Dims = smallvec::smallvec![0usize; rank - 1];
    let mut offs = [0usize; N];
    for row in 0..rows {
        f(row * inner, offs);
        // Increment the multi-index and the operand offsets incrementally.
        let mut d = rank - 1;
        while d > 0 {
            d -= 1;
            idx[d] += 1;
            for j in 0..N {
                offs[j] += strides[j][d];
            }
            if idx[d] < outer_dims[d] {
                break;
            }
            for j in 0..N {
                offs[j] -= strides[j][d] * idx[d];
            }
            idx[d] = 0;
        }
    }
}

/// Applies `f` to every element of a numeric tensor whatever its dtype, keeping the dtype
/// (`$v` is bound to the typed vector, `$body` must produce a vector of the same type).
#[macro_export]
#[doc(hidden)]
macro_rules! map_data {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            $crate::TensorData::F32($v) => $crate::TensorData::F32($body),
            $crate::TensorData::I64($v) => $crate::TensorData::I64($body),
            $crate::TensorData::I32($v) => $crate::TensorData::I32($body),
            $crate::TensorData::I8($v) => $crate::TensorData::I8($body),
            $crate::TensorData::U8($v) => $crate::TensorData::U8($body),
            $crate::TensorData::I16($v) => $crate::TensorData::I16($body),
            $crate::TensorData::U16($v) => $crate::TensorData::U16($body),
            $crate::TensorData::U32($v) => $crate::TensorData::U32($body),
            $crate::TensorData::U64($v) => $crate::TensorData::U64($body),
            $crate::TensorData::Bool($v) => $crate::TensorData::Bool($body),
        }
    };
}

/// The unit tests' pseudo-random numbers: a linear congruential generator from `seed`, each
/// draw its state's top 24 bits (divide by 2^24 for [0, 1)).
#[cfg(test)]
pub(crate) fn lcg24(seed: u32) -> impl FnMut() -> u32 {
    let mut state = seed;
    move || {
        state = state.wrapping_mul(1664525).wrapping_add(1013904223);
        state >> 8
    }
}

/// Asks for every cache line of `row` to be brought to L1 (a hint: it reads nothing and never
/// faults).
#[inline(always)]
pub(crate) fn prefetch<T>(row: &[T]) {
    #[cfg(target_arch = "x86_64")]
    for offset in (0..std::mem::size_of_val(row)).step_by(64) {
        // SAFETY: a prefetch of an address inside a live slice; it reads nothing.
        unsafe {
            std::arch::x86_64::_mm_prefetch(
                (row.as_ptr() as *const i8).add(offset),
                std::arch::x86_64::_MM_HINT_T0,
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = row;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool filled with small buffers that nobody takes back still keeps the large ones, so a
    /// long-running session recycles its activations run after run.
    #[test]
    fn a_full_arena_keeps_large_buffers() {
        let mut arena = Arena::default();
        for _ in 0..2 * F32_SLOTS {
            arena.recycle(TensorValue::from_f32(vec![1024], vec![0.0; 1024]).unwrap());
        }
        let big = TensorValue::from_f32(vec![1 << 16], vec![0.0; 1 << 16]).unwrap();
        let ptr = big.as_f32().unwrap().as_ptr();
        arena.recycle(big);
        assert_eq!(arena.free.len(), F32_SLOTS);
        // A full pool does not swap a buffer for a smaller one.
        arena.recycle(TensorValue::from_f32(vec![300], vec![0.0; 300]).unwrap());
        assert!(arena.free.iter().all(|v| v.capacity() >= 1024));
        let taken = arena.f32_for_overwrite(1 << 16);
        assert_eq!(taken.as_ptr(), ptr);
        for _ in 0..2 * BYTE_SLOTS {
            arena.recycle_bytes(vec![0u8; 512]);
        }
        let bytes = vec![0u8; 1 << 20];
        let ptr = bytes.as_ptr();
        arena.recycle_bytes(bytes);
        let taken = arena.bytes_for_overwrite(1 << 20);
        assert_eq!(taken.as_ptr(), ptr);
    }

    #[test]
    fn broadcasting() {
        assert_eq!(
            broadcast_shape(&[2, 1, 4], &[3, 1]).as_deref(),
            Some(&[2, 3, 4][..])
        );
        assert_eq!(broadcast_shape(&[], &[3]).as_deref(), Some(&[3][..]));
        assert_eq!(broadcast_shape(&[2], &[3]), None);
        assert_eq!(
            broadcast_strides(&[3, 1], &[2, 3, 4]).as_slice(),
            &[0, 1, 0]
        );
        let mut rows = vec![];
        for_each_row(&[2, 3, 4], [&[0, 1, 0][..], &[12, 4, 1][..]], |o, offs| {
            rows.push((o, offs))
        });
        assert_eq!(rows.len(), 6);
        assert_eq!(rows[4], (16, [1, 16]));
    }
}

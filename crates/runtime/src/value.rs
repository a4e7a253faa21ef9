//! Owned, typed tensors: what goes into and comes out of a [`crate::Session`].

use ir::DType;

use crate::Error;

/// The elements of a [`TensorValue`], one vector per supported dtype. Non-exhaustive: more
/// dtypes may come.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum TensorData {
    F32(Vec<f32>),
    I64(Vec<i64>),
    I32(Vec<i32>),
    I8(Vec<i8>),
    U8(Vec<u8>),
    I16(Vec<i16>),
    U16(Vec<u16>),
    U32(Vec<u32>),
    U64(Vec<u64>),
    Bool(Vec<bool>),
}

/// `$body` with `$v` bound to the vector of whichever variant `$data` is (the body must
/// compile for every element type).
macro_rules! with_tensor_data {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            $crate::value::TensorData::F32($v) => $body,
            $crate::value::TensorData::I64($v) => $body,
            $crate::value::TensorData::I32($v) => $body,
            $crate::value::TensorData::I8($v) => $body,
            $crate::value::TensorData::U8($v) => $body,
            $crate::value::TensorData::I16($v) => $body,
            $crate::value::TensorData::U16($v) => $body,
            $crate::value::TensorData::U32($v) => $body,
            $crate::value::TensorData::U64($v) => $body,
            $crate::value::TensorData::Bool($v) => $body,
        }
    };
}
pub(crate) use with_tensor_data;

impl TensorData {
    pub fn dtype(&self) -> DType {
        match self {
            TensorData::F32(_) => DType::F32,
            TensorData::I64(_) => DType::I64,
            TensorData::I32(_) => DType::I32,
            TensorData::I8(_) => DType::I8,
            TensorData::U8(_) => DType::U8,
            TensorData::I16(_) => DType::I16,
            TensorData::U16(_) => DType::U16,
            TensorData::U32(_) => DType::U32,
            TensorData::U64(_) => DType::U64,
            TensorData::Bool(_) => DType::Bool,
        }
    }

    pub fn len(&self) -> usize {
        with_tensor_data!(self, v => v.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Elements the vector has room for.
    pub(crate) fn capacity(&self) -> usize {
        with_tensor_data!(self, v => v.capacity())
    }

    /// Bytes the vector has room for.
    pub(crate) fn byte_capacity(&self) -> usize {
        fn bytes<T>(v: &Vec<T>) -> usize {
            v.capacity() * std::mem::size_of::<T>()
        }
        with_tensor_data!(self, v => bytes(v))
    }
}

/// A Rust element type that a [`TensorValue`] can hold.
pub trait ValueElement: Copy + Send + Sync + 'static {
    const DTYPE: DType;
    fn wrap(v: Vec<Self>) -> TensorData;
    fn slice(d: &TensorData) -> Option<&[Self]>;
    fn vec_mut(d: &mut TensorData) -> Option<&mut Vec<Self>>;
    fn unwrap(d: TensorData) -> Result<Vec<Self>, TensorData>;
}

macro_rules! value_element {
    ($t:ty, $v:ident, $d:expr) => {
        impl ValueElement for $t {
            const DTYPE: DType = $d;
            fn wrap(v: Vec<Self>) -> TensorData {
                TensorData::$v(v)
            }
            fn slice(d: &TensorData) -> Option<&[Self]> {
                match d {
                    TensorData::$v(v) => Some(v),
                    _ => None,
                }
            }
            fn vec_mut(d: &mut TensorData) -> Option<&mut Vec<Self>> {
                match d {
                    TensorData::$v(v) => Some(v),
                    _ => None,
                }
            }
            fn unwrap(d: TensorData) -> Result<Vec<Self>, TensorData> {
                match d {
                    TensorData::$v(v) => Ok(v),
                    other => Err(other),
                }
            }
        }
    };
}
value_element!(f32, F32, DType::F32);
value_element!(i64, I64, DType::I64);
value_element!(i32, I32, DType::I32);
value_element!(i8, I8, DType::I8);
value_element!(u8, U8, DType::U8);
value_element!(i16, I16, DType::I16);
value_element!(u16, U16, DType::U16);
value_element!(u32, U32, DType::U32);
value_element!(u64, U64, DType::U64);
value_element!(bool, Bool, DType::Bool);

/// An owned tensor: a shape and typed, row-major elements.
///
/// ```
/// use runtime::{DType, TensorValue};
/// let ids = TensorValue::from_i64(vec![1, 3], vec![101, 7592, 102]).unwrap();
/// assert_eq!(ids.dtype(), DType::I64);
/// assert_eq!(ids.shape(), &[1, 3]);
/// assert_eq!(ids.as_i64().unwrap()[0], 101);
/// assert!(TensorValue::from_f32(vec![2, 2], vec![0.0; 3]).is_err());
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct TensorValue {
    shape: Dims,
    data: TensorData,
}

/// A shape held inline (no heap allocation up to rank 6): kernels make one for every value
/// they return, and a steady-state run allocates nothing.
pub type Dims = smallvec::SmallVec<[usize; 6]>;

/// Small integer lists read from tensors at run time (axes, shape specs, slice bounds), inline.
pub(crate) type SmallInts = smallvec::SmallVec<[i64; 8]>;

impl TensorValue {
    /// A tensor over `data`; the number of elements must match the shape.
    pub fn new(shape: Vec<usize>, data: TensorData) -> Result<TensorValue, Error> {
        TensorValue::with_dims(shape.as_slice(), data)
    }

    /// [`TensorValue::new`] for a shape given as anything that converts to [`Dims`] (a slice,
    /// a `Vec`, a [`Dims`]).
    pub fn with_dims(shape: impl Into<Dims>, data: TensorData) -> Result<TensorValue, Error> {
        let shape = shape.into();
        let expected: usize = shape.iter().product();
        if expected != data.len() {
            return Err(Error::TensorSize {
                shape: shape.to_vec(),
                expected,
                actual: data.len(),
            });
        }
        Ok(TensorValue { shape, data })
    }

    /// Like [`TensorValue::new`] for a typed vector.
    pub fn from_vec<T: ValueElement>(shape: Vec<usize>, v: Vec<T>) -> Result<TensorValue, Error> {
        TensorValue::new(shape, T::wrap(v))
    }

    pub fn from_f32(shape: Vec<usize>, v: Vec<f32>) -> Result<TensorValue, Error> {
        TensorValue::from_vec(shape, v)
    }
    pub fn from_i64(shape: Vec<usize>, v: Vec<i64>) -> Result<TensorValue, Error> {
        TensorValue::from_vec(shape, v)
    }
    pub fn from_i32(shape: Vec<usize>, v: Vec<i32>) -> Result<TensorValue, Error> {
        TensorValue::from_vec(shape, v)
    }
    pub fn from_u8(shape: Vec<usize>, v: Vec<u8>) -> Result<TensorValue, Error> {
        TensorValue::from_vec(shape, v)
    }
    pub fn from_i8(shape: Vec<usize>, v: Vec<i8>) -> Result<TensorValue, Error> {
        TensorValue::from_vec(shape, v)
    }
    pub fn from_bool(shape: Vec<usize>, v: Vec<bool>) -> Result<TensorValue, Error> {
        TensorValue::from_vec(shape, v)
    }

    /// A rank-0 tensor.
    pub fn scalar<T: ValueElement>(v: T) -> TensorValue {
        TensorValue {
            shape: Dims::new(),
            data: T::wrap(vec![v]),
        }
    }

    /// An empty u8 tensor of shape `[0]` that holds no allocation: a placeholder where a value
    /// was moved out.
    pub(crate) fn placeholder() -> TensorValue {
        TensorValue {
            shape: smallvec::smallvec![0],
            data: TensorData::U8(Vec::new()),
        }
    }

    /// Internal constructor for kernels that computed the length themselves.
    pub(crate) fn raw<T: ValueElement>(shape: impl Into<Dims>, v: Vec<T>) -> TensorValue {
        TensorValue::raw_data(shape, T::wrap(v))
    }

    pub(crate) fn raw_data(shape: impl Into<Dims>, data: TensorData) -> TensorValue {
        let shape = shape.into();
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        TensorValue { shape, data }
    }

    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub fn data(&self) -> &TensorData {
        &self.data
    }

    pub fn into_data(self) -> TensorData {
        self.data
    }

    pub fn into_parts(self) -> (Vec<usize>, TensorData) {
        (self.shape.to_vec(), self.data)
    }

    /// The elements as `T`, when `T` is the tensor's dtype.
    pub fn as_slice<T: ValueElement>(&self) -> Option<&[T]> {
        T::slice(&self.data)
    }

    pub fn as_f32(&self) -> Option<&[f32]> {
        self.as_slice()
    }
    pub fn as_i64(&self) -> Option<&[i64]> {
        self.as_slice()
    }
    pub fn as_i32(&self) -> Option<&[i32]> {
        self.as_slice()
    }
    pub fn as_u8(&self) -> Option<&[u8]> {
        self.as_slice()
    }
    pub fn as_i8(&self) -> Option<&[i8]> {
        self.as_slice()
    }
    pub fn as_bool(&self) -> Option<&[bool]> {
        self.as_slice()
    }

    /// The elements as `T`, or a [`Error::DType`] naming both dtypes.
    pub fn typed<T: ValueElement>(&self) -> Result<&[T], Error> {
        T::slice(&self.data).ok_or(Error::DType {
            expected: T::DTYPE,
            actual: self.dtype(),
        })
    }

    pub(crate) fn typed_mut<T: ValueElement>(&mut self) -> Option<&mut Vec<T>> {
        T::vec_mut(&mut self.data)
    }

    /// Moves the elements out as `Vec<T>`.
    pub fn into_vec<T: ValueElement>(self) -> Result<Vec<T>, Error> {
        let actual = self.dtype();
        T::unwrap(self.data).map_err(|_| Error::DType {
            expected: T::DTYPE,
            actual,
        })
    }

    /// The same elements under another shape with as many elements.
    pub fn reshaped(self, shape: Vec<usize>) -> Result<TensorValue, Error> {
        TensorValue::new(shape, self.data)
    }

    /// A copy of rows `rows` of dim 0 (rank ≥ 1, `rows` within dim 0), in a buffer of `arena`.
    pub(crate) fn rows_in(
        &self,
        rows: std::ops::Range<usize>,
        arena: &mut crate::exec::Arena,
    ) -> TensorValue {
        let row: usize = self.shape[1..].iter().product();
        let mut shape = self.shape.clone();
        shape[0] = rows.len();
        let at = rows.start * row..rows.end * row;
        fn cut<T: ValueElement>(
            v: &[T],
            at: std::ops::Range<usize>,
            arena: &mut crate::exec::Arena,
        ) -> TensorData {
            let mut out = arena.vec_with_capacity(at.len());
            out.extend_from_slice(&v[at]);
            T::wrap(out)
        }
        let data = with_tensor_data!(&self.data, v => cut(v, at, arena));
        TensorValue { shape, data }
    }

    /// The non-zero elements of each row of dim 0 (for a `[B, S]` mask: each sequence's
    /// tokens), into `counts` (cleared first: a caller's buffer, kept from run to run).
    pub(crate) fn nonzero_per_row_into(&self, counts: &mut Vec<usize>) {
        let (b, row) = match self.shape.first() {
            Some(&b) => (b, self.shape[1..].iter().product::<usize>()),
            None => (1, 1),
        };
        fn count<T: PartialEq + Default>(v: &[T], b: usize, row: usize, counts: &mut Vec<usize>) {
            counts.extend((0..b).map(|i| {
                v[i * row..(i + 1) * row]
                    .iter()
                    .filter(|x| **x != T::default())
                    .count()
            }))
        }
        counts.clear();
        with_tensor_data!(&self.data, v => count(v, b, row, counts))
    }

    /// A tensor of no rows with `like`'s dtype and trailing dims (rank ≥ 1) and room for `rows`
    /// rows along dim 0 (a buffer of `arena` when one fits), which [`TensorValue::append_rows`]
    /// fills.
    pub(crate) fn with_row_capacity(
        like: &TensorValue,
        rows: usize,
        arena: &mut crate::exec::Arena,
    ) -> TensorValue {
        let mut shape = like.shape.clone();
        shape[0] = 0;
        let row: usize = shape[1..].iter().product();
        fn empty<T: ValueElement>(_: &[T], n: usize, arena: &mut crate::exec::Arena) -> TensorData {
            T::wrap(arena.vec_with_capacity(n))
        }
        let data = with_tensor_data!(&like.data, v => empty(v, rows * row, arena));
        TensorValue { shape, data }
    }

    /// Appends the rows of `src` (same dtype and trailing dims) after this tensor's, copied in
    /// blocks of rows on `ctx`'s threads: no zero fill, no copy on one thread while the others
    /// wait (the rows of a batch run in parts, 12.6 MB of a DistilBERT batch of 32 × 128).
    pub(crate) fn append_rows(
        &mut self,
        src: &TensorValue,
        ctx: &crate::exec::Ctx<'_>,
    ) -> Result<(), Error> {
        let fits = self.rank() > 0
            && src.rank() == self.rank()
            && src.shape[1..] == self.shape[1..]
            && src.dtype() == self.dtype();
        if !fits {
            return Err(Error::Invalid(format!(
                "internal: rows of shape {:?} {} do not continue {:?} {}",
                src.shape(),
                src.dtype(),
                self.shape(),
                self.dtype()
            )));
        }
        let row: usize = self.shape[1..].iter().product();
        fn append<T: ValueElement>(
            dst: &mut TensorData,
            src: &[T],
            row: usize,
            ctx: &crate::exec::Ctx<'_>,
        ) {
            let Some(d) = T::vec_mut(dst) else {
                unreachable!("the dtypes were compared")
            };
            d.reserve(src.len());
            let old = d.len();
            let spare = &mut d.spare_capacity_mut()[..src.len()];
            ctx.par_rows_mut(spare, row.max(1), |r0, block| {
                for (to, &x) in block.iter_mut().zip(&src[r0 * row.max(1)..]) {
                    to.write(x);
                }
            });
            // SAFETY: `par_rows_mut` ran the closure on blocks of whole rows that tile `spare`
            // (`src.len()` elements, a whole number of rows), and it wrote every element of
            // each block: the `src.len()` elements past `old` are initialized, within the
            // capacity reserved above.
            unsafe { d.set_len(old + src.len()) };
        }
        with_tensor_data!(&src.data, v => append(&mut self.data, v, row, ctx));
        self.shape[0] += src.shape[0];
        Ok(())
    }

    /// [`TensorValue::reshaped`] to a shape given as a slice or [`Dims`] (no allocation).
    pub(crate) fn reshaped_dims(self, shape: impl Into<Dims>) -> Result<TensorValue, Error> {
        TensorValue::with_dims(shape, self.data)
    }

    /// [`TensorValue::to_i64_vec`] inline for the short lists of shape arithmetic.
    pub(crate) fn to_small_ints(&self) -> Result<SmallInts, Error> {
        self.collect_ints()
    }

    /// The elements converted to i64 (integers and bools); used for shape arithmetic.
    pub fn to_i64_vec(&self) -> Result<Vec<i64>, Error> {
        self.collect_ints()
    }

    fn collect_ints<C: FromIterator<i64>>(&self) -> Result<C, Error> {
        let not_i64 = |actual| Error::DType {
            expected: DType::I64,
            actual,
        };
        Ok(match &self.data {
            TensorData::I64(v) => v.iter().copied().collect(),
            TensorData::I32(v) => v.iter().map(|&x| x as i64).collect(),
            TensorData::I8(v) => v.iter().map(|&x| x as i64).collect(),
            TensorData::U8(v) => v.iter().map(|&x| x as i64).collect(),
            TensorData::I16(v) => v.iter().map(|&x| x as i64).collect(),
            TensorData::U16(v) => v.iter().map(|&x| x as i64).collect(),
            TensorData::U32(v) => v.iter().map(|&x| x as i64).collect(),
            // A u64 beyond i64's range is no index or dim.
            TensorData::U64(v) => v
                .iter()
                .map(|&x| i64::try_from(x).map_err(|_| not_i64(DType::U64)))
                .collect::<Result<_, _>>()?,
            TensorData::Bool(v) => v.iter().map(|&x| x as i64).collect(),
            TensorData::F32(_) => return Err(not_i64(DType::F32)),
        })
    }

    /// The elements converted to f32.
    pub fn to_f32_vec(&self) -> Vec<f32> {
        match &self.data {
            TensorData::Bool(v) => v.iter().map(|&x| x as u8 as f32).collect(),
            TensorData::F32(v) => v.clone(),
            TensorData::I64(v) => v.iter().map(|&x| x as f32).collect(),
            TensorData::I32(v) => v.iter().map(|&x| x as f32).collect(),
            TensorData::I8(v) => v.iter().map(|&x| x as f32).collect(),
            TensorData::U8(v) => v.iter().map(|&x| x as f32).collect(),
            TensorData::I16(v) => v.iter().map(|&x| x as f32).collect(),
            TensorData::U16(v) => v.iter().map(|&x| x as f32).collect(),
            TensorData::U32(v) => v.iter().map(|&x| x as f32).collect(),
            TensorData::U64(v) => v.iter().map(|&x| x as f32).collect(),
        }
    }

    /// Copies an IR constant into an owned tensor.
    pub fn from_ir(t: &ir::Tensor) -> Result<TensorValue, Error> {
        let shape = t.shape().to_vec();
        let data = match t.dtype() {
            DType::F32 | DType::BF16 => TensorData::F32(t.to_f32_vec()?),
            DType::I64 => TensorData::I64(t.to_vec()?),
            DType::I32 => TensorData::I32(t.to_vec()?),
            DType::I8 => TensorData::I8(t.to_vec()?),
            DType::U8 => TensorData::U8(t.to_vec()?),
            DType::I16 => TensorData::I16(t.to_vec()?),
            DType::U16 => TensorData::U16(t.to_vec()?),
            DType::U32 => TensorData::U32(t.to_vec()?),
            DType::U64 => TensorData::U64(t.to_vec()?),
            DType::Bool => TensorData::Bool(t.to_vec()?),
        };
        TensorValue::new(shape, data)
    }

    /// Copies into an IR constant (e.g. to feed values back into a graph).
    pub fn to_ir(&self) -> ir::Tensor {
        let shape = self.shape.to_vec();
        with_tensor_data!(&self.data, v => ir::Tensor::from_vec(shape, v.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::{Arena, Ctx};

    /// Rows appended part by part, on two threads and on one, give the concatenation of the
    /// parts, for f32 (copied in blocks on the threads) and i64 alike; a part of other trailing
    /// dims or dtype is refused.
    #[test]
    fn appended_rows_are_the_concatenation_of_the_parts() {
        let mut arena = Arena::default();
        for threads in [1, 2] {
            let ctx = Ctx {
                threads,
                arena: &mut arena,
            };
            let (w, parts) = (96usize, [7usize, 300, 1, 45]);
            let total: usize = parts.iter().sum();
            let all: Vec<f32> = (0..total * w).map(|v| v as f32 * 0.5 - 3.0).collect();
            let ids: Vec<i64> = (0..total as i64 * 2).map(|v| v * 7 - 11).collect();
            let like =
                TensorValue::from_f32(vec![parts[0], w], all[..parts[0] * w].to_vec()).unwrap();
            let mut whole = TensorValue::with_row_capacity(&like, total, ctx.arena);
            let like_ids = TensorValue::from_i64(vec![1, 2], vec![0, 0]).unwrap();
            let mut whole_ids = TensorValue::with_row_capacity(&like_ids, total, ctx.arena);
            assert_eq!(whole.shape(), &[0, w]);
            let mut at = 0;
            for &n in &parts {
                let part = TensorValue::from_f32(vec![n, w], all[at * w..(at + n) * w].to_vec());
                whole.append_rows(&part.unwrap(), &ctx).unwrap();
                let part_ids =
                    TensorValue::from_i64(vec![n, 2], ids[at * 2..(at + n) * 2].to_vec());
                whole_ids.append_rows(&part_ids.unwrap(), &ctx).unwrap();
                at += n;
            }
            assert_eq!(whole.shape(), &[total, w]);
            assert_eq!(whole.as_f32().unwrap(), &all[..], "{threads} threads");
            assert_eq!(whole_ids.to_i64_vec().unwrap(), ids, "{threads} threads");
            let narrow = TensorValue::from_f32(vec![1, w - 1], vec![0.0; w - 1]).unwrap();
            assert!(whole.append_rows(&narrow, &ctx).is_err());
            assert!(whole.append_rows(&like_ids, &ctx).is_err());
            assert_eq!(whole.shape(), &[total, w], "a refused part appends nothing");
        }
    }
}

//! Constant tensors. Their bytes are a [`bytes::Bytes`], so a constant imported from a
//! memory-mapped model file points into the mapping instead of copying the weights.

use std::fmt;

use bytes::Bytes;

use crate::{DType, IrError};

/// A Rust type that can be an element of a [`Tensor`].
pub trait Element: Copy + 'static {
    const DTYPE: DType;
    fn read_le(bytes: &[u8]) -> Self;
    fn write_le(self, out: &mut Vec<u8>);
}

macro_rules! element {
    ($t:ty, $d:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            #[inline]
            fn read_le(bytes: &[u8]) -> Self {
                <$t>::from_le_bytes(bytes.try_into().expect("element width"))
            }
            #[inline]
            fn write_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
        }
    };
}
element!(f32, DType::F32);
element!(i8, DType::I8);
element!(u8, DType::U8);
element!(i16, DType::I16);
element!(u16, DType::U16);
element!(i32, DType::I32);
element!(u32, DType::U32);
element!(i64, DType::I64);
element!(u64, DType::U64);

impl Element for half::bf16 {
    const DTYPE: DType = DType::BF16;
    #[inline]
    fn read_le(bytes: &[u8]) -> Self {
        half::bf16::from_bits(u16::from_le_bytes(bytes.try_into().expect("element width")))
    }
    fn write_le(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_bits().to_le_bytes());
    }
}

impl Element for bool {
    const DTYPE: DType = DType::Bool;
    #[inline]
    fn read_le(bytes: &[u8]) -> Self {
        bytes[0] != 0
    }
    fn write_le(self, out: &mut Vec<u8>) {
        out.push(self as u8);
    }
}

/// A constant tensor: dtype, fixed shape and little-endian bytes.
///
/// The bytes may be absent: a graph parsed from its text form without the model file knows each
/// large constant's type but not its data (see [`crate::text`]).
///
/// ```
/// use ir::Tensor;
/// let t = Tensor::from_vec(vec![2, 2], vec![1.0f32, 2.0, 3.0, 4.0]);
/// assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
/// assert_eq!(t.len(), 4);
/// ```
#[derive(Clone, PartialEq)]
pub struct Tensor {
    dtype: DType,
    shape: Vec<usize>,
    data: Option<Bytes>,
}

/// The bytes of a `dtype` tensor of `shape`, `None` when that overflows `usize` (a shape read
/// from a file may claim anything).
///
/// ```
/// use ir::{byte_size, DType};
/// assert_eq!(byte_size(DType::F32, &[2, 3]), Some(24));
/// assert_eq!(byte_size(DType::F32, &[1 << 40, 1 << 40]), None);
/// ```
pub fn byte_size(dtype: DType, shape: &[usize]) -> Option<usize> {
    element_count(shape)?.checked_mul(dtype.size_of())
}

/// The elements of `shape`, `None` when the product overflows `usize`.
fn element_count(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
}

impl Tensor {
    /// A tensor over existing bytes (possibly a slice of a memory map). Checks the length.
    pub fn from_bytes(dtype: DType, shape: Vec<usize>, data: Bytes) -> Result<Tensor, IrError> {
        let Some(expected) = byte_size(dtype, &shape) else {
            return Err(IrError::TensorTooLarge { dtype, shape });
        };
        if data.len() != expected {
            return Err(IrError::TensorSize {
                dtype,
                shape,
                expected,
                actual: data.len(),
            });
        }
        Ok(Tensor {
            dtype,
            shape,
            data: Some(data),
        })
    }

    /// A tensor whose data is not available (type only).
    pub fn absent(dtype: DType, shape: Vec<usize>) -> Tensor {
        Tensor {
            dtype,
            shape,
            data: None,
        }
    }

    pub fn from_vec<T: Element>(shape: Vec<usize>, values: Vec<T>) -> Tensor {
        assert_eq!(
            shape.iter().product::<usize>(),
            values.len(),
            "Tensor::from_vec: shape and length disagree"
        );
        let mut out = Vec::with_capacity(values.len() * T::DTYPE.size_of());
        for v in values {
            v.write_le(&mut out);
        }
        Tensor {
            dtype: T::DTYPE,
            shape,
            data: Some(Bytes::from(out)),
        }
    }

    pub fn scalar<T: Element>(v: T) -> Tensor {
        Tensor::from_vec(vec![], vec![v])
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn has_data(&self) -> bool {
        self.data.is_some()
    }

    /// The raw little-endian bytes, when present.
    pub fn bytes(&self) -> Option<&Bytes> {
        self.data.as_ref()
    }

    /// Copies the elements out as `T`, which must be the tensor's dtype.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>, IrError> {
        if T::DTYPE != self.dtype {
            return Err(IrError::DTypeMismatch {
                expected: T::DTYPE,
                actual: self.dtype,
            });
        }
        let data = self.data.as_ref().ok_or(IrError::MissingData)?;
        // A constant width (every Element is as wide as its dtype) lets the compiler turn this
        // into a plain copy: loading a model copies hundreds of megabytes through here.
        debug_assert_eq!(std::mem::size_of::<T>(), self.dtype.size_of());
        Ok(data
            .chunks_exact(std::mem::size_of::<T>())
            .map(T::read_le)
            .collect())
    }

    /// The elements as `i64`, converting from any integer or bool dtype (shape arithmetic).
    pub fn to_i64_vec(&self) -> Result<Vec<i64>, IrError> {
        Ok(match self.dtype {
            DType::I64 => self.to_vec::<i64>()?,
            DType::I32 => self.to_vec::<i32>()?.into_iter().map(i64::from).collect(),
            DType::I8 => self.to_vec::<i8>()?.into_iter().map(i64::from).collect(),
            DType::U8 => self.to_vec::<u8>()?.into_iter().map(i64::from).collect(),
            DType::I16 => self.to_vec::<i16>()?.into_iter().map(i64::from).collect(),
            DType::U16 => self.to_vec::<u16>()?.into_iter().map(i64::from).collect(),
            DType::U32 => self.to_vec::<u32>()?.into_iter().map(i64::from).collect(),
            // A u64 beyond i64's range is no index or dim.
            DType::U64 => self
                .to_vec::<u64>()?
                .into_iter()
                .map(|v| {
                    i64::try_from(v).map_err(|_| IrError::DTypeMismatch {
                        expected: DType::I64,
                        actual: DType::U64,
                    })
                })
                .collect::<Result<_, _>>()?,
            DType::Bool => self.to_vec::<bool>()?.into_iter().map(i64::from).collect(),
            d => {
                return Err(IrError::DTypeMismatch {
                    expected: DType::I64,
                    actual: d,
                })
            }
        })
    }

    /// The elements as `f32`, converting from any dtype.
    pub fn to_f32_vec(&self) -> Result<Vec<f32>, IrError> {
        Ok(match self.dtype {
            DType::F32 => self.to_vec::<f32>()?,
            DType::BF16 => self
                .to_vec::<half::bf16>()?
                .into_iter()
                .map(f32::from)
                .collect(),
            DType::U64 => self
                .to_vec::<u64>()?
                .into_iter()
                .map(|v| v as f32)
                .collect(),
            _ => self.to_i64_vec()?.into_iter().map(|v| v as f32).collect(),
        })
    }

    /// The element at flat index `i` rendered for the text form.
    fn fmt_element(&self, i: usize, out: &mut String) {
        use std::fmt::Write;
        let data = self.data.as_ref().expect("fmt_element on absent data");
        let w = self.dtype.size_of();
        let b = &data[i * w..(i + 1) * w];
        let _ = match self.dtype {
            DType::F32 => write!(out, "{:?}", f32::read_le(b)),
            DType::BF16 => write!(out, "{:?}", f32::from(half::bf16::read_le(b))),
            DType::I8 => write!(out, "{}", i8::read_le(b)),
            DType::U8 => write!(out, "{}", u8::read_le(b)),
            DType::I16 => write!(out, "{}", i16::read_le(b)),
            DType::U16 => write!(out, "{}", u16::read_le(b)),
            DType::I32 => write!(out, "{}", i32::read_le(b)),
            DType::U32 => write!(out, "{}", u32::read_le(b)),
            DType::I64 => write!(out, "{}", i64::read_le(b)),
            DType::U64 => write!(out, "{}", u64::read_le(b)),
            DType::Bool => write!(out, "{}", bool::read_le(b)),
        };
    }

    /// Text form: `i64[3]{0, 0, 12}` when the data is present and small, else
    /// `f32[1000,128]{extern}`.
    pub fn to_text(&self, inline_limit: usize) -> String {
        let mut s = format!("{}[", self.dtype);
        let dims: Vec<String> = self.shape.iter().map(|d| d.to_string()).collect();
        s.push_str(&dims.join(","));
        s.push_str("]{");
        if self.data.is_some() && self.len() <= inline_limit {
            for i in 0..self.len() {
                if i > 0 {
                    s.push_str(", ");
                }
                self.fmt_element(i, &mut s);
            }
        } else {
            s.push_str("extern");
        }
        s.push('}');
        s
    }

    /// Parses the text form written by [`Tensor::to_text`].
    pub fn from_text(s: &str) -> Result<Tensor, IrError> {
        let bad = |m: &str| IrError::Parse {
            line: 0,
            message: format!("bad tensor literal `{s}`: {m}"),
        };
        let brace = s.find('{').ok_or_else(|| bad("missing `{`"))?;
        if !s.ends_with('}') {
            return Err(bad("missing `}`"));
        }
        let ty: crate::TensorType = s[..brace].parse()?;
        let shape = ty
            .shape
            .ok_or_else(|| bad("constant shape must be known"))?
            .iter()
            .map(|d| {
                d.as_fixed()
                    .ok_or_else(|| bad("constant shape must be fixed"))
            })
            .collect::<Result<Vec<usize>, _>>()?;
        let body = s[brace + 1..s.len() - 1].trim();
        if body == "extern" {
            return Ok(Tensor::absent(ty.dtype, shape));
        }
        let items: Vec<&str> = if body.is_empty() {
            vec![]
        } else {
            body.split(',').map(str::trim).collect()
        };
        if element_count(&shape) != Some(items.len()) {
            return Err(bad("element count does not match the shape"));
        }
        let mut out = Vec::with_capacity(items.len() * ty.dtype.size_of());
        for it in items {
            let e = || bad(&format!("bad element `{it}`"));
            match ty.dtype {
                DType::F32 => it.parse::<f32>().map_err(|_| e())?.write_le(&mut out),
                DType::BF16 => {
                    half::bf16::from_f32(it.parse::<f32>().map_err(|_| e())?).write_le(&mut out)
                }
                DType::I8 => it.parse::<i8>().map_err(|_| e())?.write_le(&mut out),
                DType::U8 => it.parse::<u8>().map_err(|_| e())?.write_le(&mut out),
                DType::I16 => it.parse::<i16>().map_err(|_| e())?.write_le(&mut out),
                DType::U16 => it.parse::<u16>().map_err(|_| e())?.write_le(&mut out),
                DType::I32 => it.parse::<i32>().map_err(|_| e())?.write_le(&mut out),
                DType::U32 => it.parse::<u32>().map_err(|_| e())?.write_le(&mut out),
                DType::I64 => it.parse::<i64>().map_err(|_| e())?.write_le(&mut out),
                DType::U64 => it.parse::<u64>().map_err(|_| e())?.write_le(&mut out),
                DType::Bool => it.parse::<bool>().map_err(|_| e())?.write_le(&mut out),
            }
        }
        Tensor::from_bytes(ty.dtype, shape, Bytes::from(out))
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_text(16))
    }
}

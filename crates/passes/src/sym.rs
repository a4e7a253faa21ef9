//! Symbolic values of small integer tensors: what `Shape`, `Gather`, `Concat` and friends
//! compute on shapes, kept as dims (`batch`, `sequence`) where they are not known numbers.

use ir::{Dim, Tensor};

/// Tensors with more elements than this are not tracked symbolically nor folded (except the
/// layout ops that [`crate::ConstantFolding`] allows on weights).
pub const SMALL: usize = 4096;

/// One element of a symbolic integer tensor.
///
/// ```
/// use passes::SymInt;
/// use ir::Dim;
/// let b = SymInt::from_dim(&Dim::sym("batch"));
/// assert_eq!(b.mul(&SymInt::Int(4)).to_string(), "4*batch");
/// assert_eq!(SymInt::from_dim(&Dim::fixed(7)), SymInt::Int(7));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SymInt {
    /// A known number.
    Int(i64),
    /// A non-negative dim with at least one symbol.
    Dim(Dim),
    /// Not known: never to be taken for a dim.
    Unknown,
}

impl SymInt {
    pub fn from_dim(d: &Dim) -> SymInt {
        match d.as_fixed() {
            Some(n) => SymInt::Int(n as i64),
            None => SymInt::Dim(d.clone()),
        }
    }

    /// The value as a dim, when it is a non-negative number or a symbolic dim.
    pub fn as_dim(&self) -> Option<Dim> {
        match self {
            SymInt::Int(n) if *n >= 0 => Some(Dim::fixed(*n as usize)),
            SymInt::Dim(d) => Some(d.clone()),
            _ => None,
        }
    }

    pub fn as_int(&self) -> Option<i64> {
        match self {
            SymInt::Int(n) => Some(*n),
            _ => None,
        }
    }

    pub fn mul(&self, o: &SymInt) -> SymInt {
        match (self, o) {
            (SymInt::Int(a), SymInt::Int(b)) => {
                a.checked_mul(*b).map_or(SymInt::Unknown, SymInt::Int)
            }
            (SymInt::Int(0), SymInt::Dim(_)) | (SymInt::Dim(_), SymInt::Int(0)) => SymInt::Int(0),
            _ => match (self.as_dim(), o.as_dim()) {
                (Some(a), Some(b)) => {
                    dim_mul(&a, &b).map_or(SymInt::Unknown, |d| SymInt::from_dim(&d))
                }
                _ => SymInt::Unknown,
            },
        }
    }

    /// Integer division; exact on dims, truncating on non-negative numbers.
    pub fn div(&self, o: &SymInt) -> SymInt {
        match (self, o) {
            (SymInt::Int(a), SymInt::Int(b)) if *b != 0 && *a >= 0 && *b > 0 => SymInt::Int(a / b),
            _ => match (self.as_dim(), o.as_dim()) {
                (Some(a), Some(b)) => a.div(&b).map_or(SymInt::Unknown, |d| SymInt::from_dim(&d)),
                _ => SymInt::Unknown,
            },
        }
    }

    pub fn add(&self, o: &SymInt) -> SymInt {
        match (self, o) {
            (SymInt::Int(a), SymInt::Int(b)) => {
                a.checked_add(*b).map_or(SymInt::Unknown, SymInt::Int)
            }
            (SymInt::Int(0), x) | (x, SymInt::Int(0)) => x.clone(),
            (SymInt::Dim(a), SymInt::Dim(b)) => {
                dim_add(a, b).map_or(SymInt::Unknown, |d| SymInt::from_dim(&d))
            }
            _ => SymInt::Unknown,
        }
    }

    pub fn sub(&self, o: &SymInt) -> SymInt {
        match (self, o) {
            (SymInt::Int(a), SymInt::Int(b)) => {
                a.checked_sub(*b).map_or(SymInt::Unknown, SymInt::Int)
            }
            (x, SymInt::Int(0)) => x.clone(),
            (SymInt::Dim(a), SymInt::Dim(b)) if a == b => SymInt::Int(0),
            _ => SymInt::Unknown,
        }
    }

    /// `Some(true/false)` when equality is decidable. Dims are non-negative, so a dim never
    /// equals a negative number (the `-1` sentinel of reshape targets).
    pub fn equals(&self, o: &SymInt) -> Option<bool> {
        match (self, o) {
            (SymInt::Int(a), SymInt::Int(b)) => Some(a == b),
            (SymInt::Dim(a), SymInt::Dim(b)) if a == b => Some(true),
            (SymInt::Dim(_), SymInt::Int(n)) | (SymInt::Int(n), SymInt::Dim(_)) if *n < 0 => {
                Some(false)
            }
            _ => None,
        }
    }
}

impl std::fmt::Display for SymInt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SymInt::Int(n) => write!(f, "{n}"),
            SymInt::Dim(d) => write!(f, "{d}"),
            SymInt::Unknown => f.write_str("?"),
        }
    }
}

/// `a · b`, unless the coefficient overflows.
pub fn dim_mul(a: &Dim, b: &Dim) -> Option<Dim> {
    a.coeff().checked_mul(b.coeff())?;
    Some(a.mul(b))
}

/// `a + b` when both are multiples of the same symbols (`S + S = 2*S`).
pub fn dim_add(a: &Dim, b: &Dim) -> Option<Dim> {
    if let (Some(x), Some(y)) = (a.as_fixed(), b.as_fixed()) {
        return x.checked_add(y).map(Dim::fixed);
    }
    if a.symbols() != b.symbols() {
        return None;
    }
    let mut d = Dim::fixed(usize::try_from(a.coeff().checked_add(b.coeff())?).ok()?);
    for s in a.symbols() {
        d = d.mul(&Dim::sym(s));
    }
    Some(d)
}

/// A small integer (or bool) tensor whose elements may be symbolic. Bools are 0 and 1.
#[derive(Clone, Debug, PartialEq)]
pub struct SymTensor {
    pub shape: Vec<usize>,
    pub data: Vec<SymInt>,
}

impl SymTensor {
    pub fn new(shape: Vec<usize>, data: Vec<SymInt>) -> SymTensor {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        SymTensor { shape, data }
    }

    /// The value of an integer or bool constant, when it has data and is small.
    pub fn from_tensor(t: &Tensor) -> Option<SymTensor> {
        if t.len() > SMALL || !tracked(t.dtype()) {
            return None;
        }
        let v = t.to_i64_vec().ok()?;
        Some(SymTensor::new(
            t.shape().to_vec(),
            v.into_iter().map(SymInt::Int).collect(),
        ))
    }

    /// All elements as numbers, when none is symbolic or unknown.
    pub fn as_ints(&self) -> Option<Vec<i64>> {
        self.data.iter().map(SymInt::as_int).collect()
    }

    pub fn is_concrete(&self) -> bool {
        self.data.iter().all(|x| matches!(x, SymInt::Int(_)))
    }
}

impl std::fmt::Display for SymTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let items: Vec<String> = self.data.iter().map(|x| x.to_string()).collect();
        write!(f, "[{}]", items.join(", "))
    }
}

/// Whether values of dtype `d` are tracked symbolically: those of shape arithmetic (i64, i32)
/// and bool. Symbols compute in i64 without wrapping, which the narrow and unsigned integer
/// types (wrapping at their own width: 255u8 + 1 is 0) would not match through a chain of ops;
/// constants of those types are still folded, op by op, by `eval_node`.
pub(crate) fn tracked(d: ir::DType) -> bool {
    matches!(d, ir::DType::I64 | ir::DType::I32 | ir::DType::Bool)
}

//! Shapes whose dimensions may be symbolic (batch, sequence) and products of symbols.

use std::collections::HashMap;
use std::fmt;

use crate::{DType, IrError};

/// One dimension: `coeff × sym₁ × sym₂ × …`, with the symbols sorted. A fixed dimension has no
/// symbols. Products are exact, which is what reshapes of `[batch, seq, hidden]` into
/// `[batch·seq, hidden]` need.
///
/// ```
/// use ir::Dim;
/// let bs = Dim::sym("batch").mul(&Dim::sym("sequence"));
/// assert_eq!(bs.to_string(), "batch*sequence");
/// assert_eq!(Dim::fixed(12).mul(&Dim::sym("B")).to_string(), "12*B");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Dim {
    coeff: u64,
    syms: Vec<String>,
}

impl Dim {
    pub fn fixed(n: usize) -> Dim {
        Dim {
            coeff: n as u64,
            syms: Vec::new(),
        }
    }

    pub fn sym(name: &str) -> Dim {
        Dim {
            coeff: 1,
            syms: vec![name.to_string()],
        }
    }

    /// The value when the dimension has no symbols.
    pub fn as_fixed(&self) -> Option<usize> {
        (self.syms.is_empty() || self.coeff == 0).then_some(self.coeff as usize)
    }

    pub fn symbols(&self) -> &[String] {
        &self.syms
    }

    /// The symbol when the dimension is exactly one symbol (`B`, not `2*B` or `B*S`).
    ///
    /// ```
    /// use ir::Dim;
    /// assert_eq!(Dim::sym("B").as_symbol(), Some("B"));
    /// assert_eq!(Dim::fixed(2).mul(&Dim::sym("B")).as_symbol(), None);
    /// assert_eq!(Dim::sym("B").mul(&Dim::sym("S")).as_symbol(), None);
    /// ```
    pub fn as_symbol(&self) -> Option<&str> {
        match self.syms.as_slice() {
            [s] if self.coeff == 1 => Some(s),
            _ => None,
        }
    }

    pub fn coeff(&self) -> u64 {
        self.coeff
    }

    /// The product. A coefficient beyond `u64` saturates at `u64::MAX`, which no tensor can
    /// have: [`Dim::eval`] then fails with [`IrError::DimOverflow`], and the text form refuses
    /// such a product when it parses one.
    pub fn mul(&self, other: &Dim) -> Dim {
        let mut syms: Vec<String> = self.syms.iter().chain(&other.syms).cloned().collect();
        syms.sort();
        let coeff = self.coeff.saturating_mul(other.coeff);
        if coeff == 0 {
            return Dim::fixed(0);
        }
        Dim { coeff, syms }
    }

    /// Exact division, when `other` divides `self` as a monomial.
    pub fn div(&self, other: &Dim) -> Option<Dim> {
        if other.coeff == 0 || !self.coeff.is_multiple_of(other.coeff) {
            return None;
        }
        let mut syms = self.syms.clone();
        for s in &other.syms {
            let pos = syms.iter().position(|x| x == s)?;
            syms.remove(pos);
        }
        Some(Dim {
            coeff: self.coeff / other.coeff,
            syms,
        })
    }

    /// The value with every symbol bound, or an error naming the first unbound symbol.
    pub fn eval(&self, bindings: &HashMap<String, usize>) -> Result<usize, IrError> {
        self.eval_by(|s| bindings.get(s).copied())
    }

    /// [`Dim::eval`] with the symbols' values given by `lookup` (e.g. a short list, searched
    /// without building a map).
    pub fn eval_by(&self, lookup: impl Fn(&str) -> Option<usize>) -> Result<usize, IrError> {
        let overflow = || IrError::DimOverflow(self.to_string());
        let mut v = usize::try_from(self.coeff)
            .ok()
            .filter(|_| self.coeff != u64::MAX)
            .ok_or_else(overflow)?;
        for s in &self.syms {
            let b = lookup(s).ok_or_else(|| IrError::UnboundSymbol(s.clone()))?;
            v = v.checked_mul(b).ok_or_else(overflow)?;
        }
        Ok(v)
    }

    /// Parses `12`, `batch`, `12*batch*seq`.
    pub fn parse(s: &str) -> Result<Dim, IrError> {
        let mut d = Dim::fixed(1);
        for part in s.split('*') {
            let part = part.trim();
            if part.is_empty() {
                return Err(IrError::Parse {
                    line: 0,
                    message: format!("bad dimension `{s}`"),
                });
            }
            let f = match part.parse::<u64>() {
                Ok(n) if d.coeff.checked_mul(n).is_some_and(|c| c < u64::MAX) => {
                    Dim::fixed(n as usize)
                }
                Ok(_) => {
                    return Err(IrError::Parse {
                        line: 0,
                        message: format!("dimension `{s}` overflows"),
                    })
                }
                Err(_) if is_symbol(part) => Dim::sym(part),
                Err(_) => {
                    return Err(IrError::Parse {
                        line: 0,
                        message: format!("bad dimension `{s}`"),
                    })
                }
            };
            d = d.mul(&f);
        }
        Ok(d)
    }
}

/// Whether `s` may name a symbolic dimension in the text form.
pub fn is_symbol(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl From<usize> for Dim {
    fn from(n: usize) -> Dim {
        Dim::fixed(n)
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.syms.is_empty() || self.coeff == 0 {
            return write!(f, "{}", self.coeff);
        }
        if self.coeff != 1 {
            write!(f, "{}*", self.coeff)?;
        }
        write!(f, "{}", self.syms.join("*"))
    }
}

/// A shape: a list of dimensions.
pub type Shape = Vec<Dim>;

/// Builds a fixed shape from sizes.
pub fn fixed_shape(dims: &[usize]) -> Shape {
    dims.iter().map(|&d| Dim::fixed(d)).collect()
}

/// The type of a value in the graph: element type and, when known, shape. A shape of `None` means
/// the rank is not known yet (before shape inference).
///
/// ```
/// use ir::{Dim, DType, TensorType};
/// let t = TensorType::new(DType::F32, vec![Dim::sym("B"), Dim::fixed(768)]);
/// assert_eq!(t.to_string(), "f32[B,768]");
/// assert_eq!("f32[B,768]".parse::<TensorType>().unwrap(), t);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Option<Shape>,
}

impl TensorType {
    pub fn new(dtype: DType, shape: Shape) -> TensorType {
        TensorType {
            dtype,
            shape: Some(shape),
        }
    }

    pub fn unknown_shape(dtype: DType) -> TensorType {
        TensorType { dtype, shape: None }
    }

    pub fn rank(&self) -> Option<usize> {
        self.shape.as_ref().map(|s| s.len())
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.shape {
            None => write!(f, "{}[*]", self.dtype),
            Some(s) => {
                write!(f, "{}[", self.dtype)?;
                for (i, d) in s.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{d}")?;
                }
                f.write_str("]")
            }
        }
    }
}

impl std::str::FromStr for TensorType {
    type Err = IrError;
    fn from_str(s: &str) -> Result<TensorType, IrError> {
        let bad = || IrError::Parse {
            line: 0,
            message: format!("bad tensor type `{s}`"),
        };
        let open = s.find('[').ok_or_else(bad)?;
        if !s.ends_with(']') {
            return Err(bad());
        }
        let dtype: DType = s[..open].trim().parse()?;
        let inner = &s[open + 1..s.len() - 1];
        if inner.trim() == "*" {
            return Ok(TensorType::unknown_shape(dtype));
        }
        let shape = if inner.trim().is_empty() {
            Vec::new()
        } else {
            inner.split(',').map(Dim::parse).collect::<Result<_, _>>()?
        };
        Ok(TensorType::new(dtype, shape))
    }
}

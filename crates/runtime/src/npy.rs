//! NumPy `.npy` files (format versions 1.0 to 3.0), little-endian, C order.
//!
//! The format is a magic string, a version, a Python-dict header (`descr`, `fortran_order`,
//! `shape`) padded to 64 bytes, then the raw elements. Small enough that a hand-written reader
//! beats a dependency.

use std::path::Path;

use crate::value::{TensorData, TensorValue};
use crate::Error;

const MAGIC: &[u8] = b"\x93NUMPY";

fn npy_err(path: &Path, message: impl Into<String>) -> Error {
    Error::Npy {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// The value of `'key':` in the header dict, up to the next top-level comma or brace.
fn header_field<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let pat_sq = format!("'{key}'");
    let pat_dq = format!("\"{key}\"");
    let start = header
        .find(&pat_sq)
        .map(|i| i + pat_sq.len())
        .or_else(|| header.find(&pat_dq).map(|i| i + pat_dq.len()))?;
    let rest = header[start..].trim_start().strip_prefix(':')?.trim_start();
    if let Some(inner) = rest.strip_prefix('(') {
        let end = inner.find(')')?;
        return Some(&inner[..end]);
    }
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    Some(rest[..end].trim())
}

/// Parses `.npy` bytes; `path` is only used in error messages.
pub(crate) fn parse_npy(bytes: &[u8], path: &Path) -> Result<TensorValue, Error> {
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err(npy_err(path, "not a .npy file (bad magic)"));
    }
    let major = bytes[6];
    let (header_len, header_start) = match major {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 => {
            if bytes.len() < 12 {
                return Err(npy_err(path, "truncated header"));
            }
            (
                u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
                12,
            )
        }
        v => return Err(npy_err(path, format!("unsupported .npy version {v}"))),
    };
    let data_start = header_start + header_len;
    if bytes.len() < data_start {
        return Err(npy_err(path, "truncated header"));
    }
    let header = std::str::from_utf8(&bytes[header_start..data_start])
        .map_err(|_| npy_err(path, "header is not UTF-8"))?;
    let descr = header_field(header, "descr")
        .ok_or_else(|| npy_err(path, "header has no descr"))?
        .trim_matches(|c| c == '\'' || c == '"');
    let fortran = header_field(header, "fortran_order")
        .ok_or_else(|| npy_err(path, "header has no fortran_order"))?;
    if fortran != "False" {
        return Err(npy_err(path, "Fortran-order arrays are not supported"));
    }
    let shape_s =
        header_field(header, "shape").ok_or_else(|| npy_err(path, "header has no shape"))?;
    let shape = shape_s
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.trim_end_matches('L')
                .parse::<usize>()
                .map_err(|_| npy_err(path, format!("bad shape `({shape_s})`")))
        })
        .collect::<Result<Vec<usize>, _>>()?;
    let body = &bytes[data_start..];
    let width = match descr {
        "<f4" | "<i4" | "<u4" => 4,
        "<i8" | "<f8" | "<u8" => 8,
        "<f2" | "<i2" | "<u2" => 2,
        "|u1" | "|i1" | "|b1" | "<u1" | "<i1" => 1,
        other => {
            return Err(npy_err(
                path,
                format!(
                    "unsupported dtype `{other}` (supported: <f4 <f2 <f8 <i8 <u8 <i4 <u4 <i2 <u2 \
                     |u1 |i1 |b1; <f2 and <f8 are read as f32, as encore imports FLOAT16 and \
                     DOUBLE models)"
                ),
            ))
        }
    };
    let need = shape
        .iter()
        .try_fold(width, |a: usize, &d| a.checked_mul(d))
        .ok_or_else(|| npy_err(path, format!("shape {shape:?} is too large")))?;
    if body.len() != need {
        return Err(npy_err(
            path,
            format!(
                "shape {shape:?} of `{descr}` needs {need} data bytes, file has {}",
                body.len()
            ),
        ));
    }
    let data = match descr {
        "<f4" => TensorData::F32(le_vec(body)),
        "<f2" => TensorData::F32(
            le_vec::<u16>(body)
                .into_iter()
                .map(|b| half::f16::from_bits(b).to_f32())
                .collect(),
        ),
        "<f8" => TensorData::F32(
            body.chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap()) as f32)
                .collect(),
        ),
        "<i4" => TensorData::I32(le_vec(body)),
        "<i8" => TensorData::I64(le_vec(body)),
        "<u8" => TensorData::U64(le_vec(body)),
        "<u4" => TensorData::U32(le_vec(body)),
        "<i2" => TensorData::I16(le_vec(body)),
        "<u2" => TensorData::U16(le_vec(body)),
        "|u1" | "<u1" => TensorData::U8(body.to_vec()),
        "|i1" | "<i1" => TensorData::I8(body.iter().map(|&b| b as i8).collect()),
        "|b1" => TensorData::Bool(body.iter().map(|&b| b != 0).collect()),
        _ => unreachable!("descr checked above"),
    };
    TensorValue::new(shape, data)
}

/// Serialises a tensor as `.npy` version 1.0 bytes.
pub(crate) fn to_npy_bytes(t: &TensorValue) -> Vec<u8> {
    let descr = match t.data() {
        TensorData::F32(_) => "<f4",
        TensorData::I64(_) => "<i8",
        TensorData::I32(_) => "<i4",
        TensorData::U8(_) => "|u1",
        TensorData::I8(_) => "|i1",
        TensorData::I16(_) => "<i2",
        TensorData::U16(_) => "<u2",
        TensorData::U32(_) => "<u4",
        TensorData::U64(_) => "<u8",
        TensorData::Bool(_) => "|b1",
    };
    let shape = match t.shape() {
        [] => "()".to_string(),
        [d] => format!("({d},)"),
        dims => format!(
            "({})",
            dims.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    // Magic (6) + version (2) + length (2) + header + '\n' is padded to a multiple of 64.
    let total = 10 + header.len() + 1;
    header.push_str(&" ".repeat((64 - total % 64) % 64));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + t.len() * 8);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    crate::value::with_tensor_data!(t.data(), v => v.iter().for_each(|&x| ir::Element::write_le(x, &mut out)));
    out
}

impl TensorValue {
    /// Reads a NumPy `.npy` file (float32, float16 and float64 read as f32, int64, uint64, int32,
    /// uint32, int16, uint16, int8, uint8 or bool; C order).
    ///
    /// ```
    /// use runtime::TensorValue;
    /// let t = TensorValue::from_i64(vec![2, 2], vec![1, 2, 3, 4]).unwrap();
    /// let path = std::env::temp_dir().join("runtime_doc_npy.npy");
    /// t.write_npy(&path).unwrap();
    /// assert_eq!(TensorValue::read_npy(&path).unwrap(), t);
    /// ```
    pub fn read_npy(path: impl AsRef<Path>) -> Result<TensorValue, Error> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        parse_npy(&bytes, path)
    }

    /// Parses the bytes of a NumPy `.npy` file, as [`TensorValue::read_npy`] does after reading
    /// it: malformed input is an [`Error`], never a panic.
    ///
    /// ```
    /// use runtime::TensorValue;
    /// assert!(TensorValue::from_npy_bytes(b"\x93NUMPY\x01\x00").is_err());
    /// ```
    pub fn from_npy_bytes(bytes: &[u8]) -> Result<TensorValue, Error> {
        parse_npy(bytes, Path::new("<bytes>"))
    }

    /// The tensor as the bytes of a NumPy `.npy` file (version 1.0), what
    /// [`TensorValue::write_npy`] writes.
    ///
    /// ```
    /// use runtime::TensorValue;
    /// let t = TensorValue::from_f32(vec![2], vec![1.0, -2.5]).unwrap();
    /// assert_eq!(TensorValue::from_npy_bytes(&t.to_npy_bytes()).unwrap(), t);
    /// ```
    pub fn to_npy_bytes(&self) -> Vec<u8> {
        to_npy_bytes(self)
    }

    /// Writes the tensor as a NumPy `.npy` file (version 1.0).
    pub fn write_npy(&self, path: impl AsRef<Path>) -> Result<(), Error> {
        let path = path.as_ref();
        std::fs::write(path, to_npy_bytes(self)).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })
    }
}

/// Little-endian elements of type `T` (the length was checked against the shape).
fn le_vec<T: ir::Element>(body: &[u8]) -> Vec<T> {
    body.chunks_exact(std::mem::size_of::<T>())
        .map(T::read_le)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_every_dtype() {
        let p = Path::new("mem");
        let cases = vec![
            TensorValue::from_f32(vec![2, 3], vec![1.5, -2.0, 0.0, 3.25, 1e-8, -7.0]).unwrap(),
            TensorValue::from_i64(vec![3], vec![i64::MIN, 0, i64::MAX]).unwrap(),
            TensorValue::from_i32(vec![1, 1, 2], vec![-5, 6]).unwrap(),
            TensorValue::from_u8(vec![2], vec![0, 255]).unwrap(),
            TensorValue::from_i8(vec![2], vec![-128, 127]).unwrap(),
            TensorValue::from_bool(vec![2], vec![true, false]).unwrap(),
            TensorValue::scalar(4.0f32),
            TensorValue::from_f32(vec![0, 4], vec![]).unwrap(),
        ];
        for t in cases {
            let bytes = to_npy_bytes(&t);
            assert_eq!((bytes.len() - t.len() * t.dtype().size_of()) % 64, 0);
            assert_eq!(parse_npy(&bytes, p).unwrap(), t);
        }
    }

    #[test]
    fn rejects_bad_files() {
        let p = Path::new("bad.npy");
        assert!(matches!(parse_npy(b"hello", p), Err(Error::Npy { .. })));
        let mut b = to_npy_bytes(&TensorValue::from_i64(vec![2], vec![1, 2]).unwrap());
        b.pop();
        assert!(matches!(parse_npy(&b, p), Err(Error::Npy { .. })));
        let mut f = to_npy_bytes(&TensorValue::from_f32(vec![1], vec![1.0]).unwrap());
        let at = f.windows(3).position(|w| w == b"<f4").unwrap();
        f[at + 1] = b'c';
        assert!(matches!(parse_npy(&f, p), Err(Error::Npy { .. })));
        // A shape whose byte count overflows is an error, not a panic.
        let big = npy_with("<f4", &format!("({}, {})", usize::MAX / 2, 3), &[0; 4]);
        assert!(matches!(parse_npy(&big, p), Err(Error::Npy { .. })));
    }

    /// A version 1.0 `.npy` with `descr`, `shape` (the tuple's text) and raw `data`.
    fn npy_with(descr: &str, shape: &str, data: &[u8]) -> Vec<u8> {
        let mut header =
            format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
        while (10 + header.len() + 1) % 64 != 0 {
            header.push(' ');
        }
        header.push('\n');
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        b.extend((header.len() as u16).to_le_bytes());
        b.extend(header.as_bytes());
        b.extend(data);
        b
    }

    /// Float16 and float64 arrays (what numpy writes for a half-precision or double model's
    /// inputs) are read as f32, exactly for f16.
    #[test]
    fn half_and_double_are_read_as_f32() {
        let p = Path::new("h.npy");
        let h: Vec<u8> = [1.5f32, -0.000061035156, 65504.0]
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect();
        let t = parse_npy(&npy_with("<f2", "(3,)", &h), p).unwrap();
        assert_eq!(t.as_f32().unwrap(), [1.5, -0.000061035156, 65504.0]);
        let d: Vec<u8> = [0.1f64, -2.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let t = parse_npy(&npy_with("<f8", "(1, 2)", &d), p).unwrap();
        assert_eq!(t.shape(), [1, 2]);
        assert_eq!(t.as_f32().unwrap(), [0.1f32, -2.0]);
        // The byte count follows the stored width.
        assert!(parse_npy(&npy_with("<f2", "(3,)", &h[..4]), p).is_err());
    }
}

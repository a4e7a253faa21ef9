//! `TensorProto` to [`ir::Tensor`]: dtype mapping, raw and typed data, external data files.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Component, Path, PathBuf};

use bytes::Bytes;
use ir::{DType, Tensor};

use crate::proto::{DataLocation, DataType, TensorProto};
use crate::ImportError;

/// The ONNX name of a `TensorProto.DataType` code, for messages.
///
/// ```
/// assert_eq!(frontend_onnx::onnx_dtype_name(10), "FLOAT16");
/// assert_eq!(frontend_onnx::onnx_dtype_name(17), "FLOAT8E4M3FN");
/// assert_eq!(frontend_onnx::onnx_dtype_name(99), "UNKNOWN");
/// ```
pub fn onnx_dtype_name(data_type: i32) -> &'static str {
    match DataType::try_from(data_type) {
        Ok(DataType::Undefined) => "UNDEFINED",
        Ok(DataType::Float) => "FLOAT",
        Ok(DataType::Uint8) => "UINT8",
        Ok(DataType::Int8) => "INT8",
        Ok(DataType::Uint16) => "UINT16",
        Ok(DataType::Int16) => "INT16",
        Ok(DataType::Int32) => "INT32",
        Ok(DataType::Int64) => "INT64",
        Ok(DataType::String) => "STRING",
        Ok(DataType::Bool) => "BOOL",
        Ok(DataType::Float16) => "FLOAT16",
        Ok(DataType::Double) => "DOUBLE",
        Ok(DataType::Uint32) => "UINT32",
        Ok(DataType::Uint64) => "UINT64",
        Ok(DataType::Complex64) => "COMPLEX64",
        Ok(DataType::Complex128) => "COMPLEX128",
        Ok(DataType::Bfloat16) => "BFLOAT16",
        // Types of onnx.proto newer than the messages here (IR version 9 and later).
        Err(_) => match data_type {
            17 => "FLOAT8E4M3FN",
            18 => "FLOAT8E4M3FNUZ",
            19 => "FLOAT8E5M2",
            20 => "FLOAT8E5M2FNUZ",
            21 => "UINT4",
            22 => "INT4",
            23 => "FLOAT4E2M1",
            24 => "FLOAT8E8M0",
            25 => "UINT2",
            26 => "INT2",
            _ => "UNKNOWN",
        },
    }
}

/// The ONNX `TensorProto.DataType` code of an IR dtype.
pub(crate) fn onnx_code(d: DType) -> i32 {
    (match d {
        DType::F32 => DataType::Float,
        DType::BF16 => DataType::Bfloat16,
        DType::I8 => DataType::Int8,
        DType::U8 => DataType::Uint8,
        DType::I16 => DataType::Int16,
        DType::U16 => DataType::Uint16,
        DType::I32 => DataType::Int32,
        DType::U32 => DataType::Uint32,
        DType::I64 => DataType::Int64,
        DType::U64 => DataType::Uint64,
        DType::Bool => DataType::Bool,
    }) as i32
}

/// The IR dtype of a value (graph input, op output, `Cast` target) of ONNX type `data_type`.
///
/// FLOAT16, BFLOAT16 and DOUBLE are widened (or, for DOUBLE, narrowed) to f32: encore computes
/// every float in f32, so a half-precision model runs at f32 precision on its exactly widened
/// weights, its float16 graph inputs are fed as f32, and its outputs come out as f32 whatever
/// their declared type. A `Cast` to FLOAT16 or BFLOAT16 is imported as a rounding to that
/// precision in f32 (see `ops.rs`).
pub(crate) fn value_dtype(
    data_type: i32,
    what: impl FnOnce() -> String,
) -> Result<DType, ImportError> {
    Ok(match DataType::try_from(data_type) {
        Ok(DataType::Float) => DType::F32,
        Ok(DataType::Uint8) => DType::U8,
        Ok(DataType::Int8) => DType::I8,
        Ok(DataType::Int16) => DType::I16,
        Ok(DataType::Uint16) => DType::U16,
        Ok(DataType::Int32) => DType::I32,
        Ok(DataType::Uint32) => DType::U32,
        Ok(DataType::Int64) => DType::I64,
        Ok(DataType::Uint64) => DType::U64,
        Ok(DataType::Bool) => DType::Bool,
        Ok(DataType::Float16 | DataType::Bfloat16 | DataType::Double) => DType::F32,
        _ => {
            return Err(ImportError::UnsupportedDType {
                what: what(),
                data_type,
            })
        }
    })
}

/// Maps a whole file read-only and wraps it in `Bytes` without copying.
pub(crate) fn map_file(path: &Path) -> Result<Bytes, ImportError> {
    let io = |source| ImportError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    if len == 0 {
        // Mapping an empty file fails on some systems; an empty model is a decode question.
        return Ok(Bytes::new());
    }
    // SAFETY: the mapping is read-only. Its contents change only if another process writes the
    // file while it is mapped, which model files are not expected to undergo (the same contract as
    // every mmap-based weight loader); the documentation of `import_path` states it.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
    Ok(Bytes::from_owner(map))
}

/// Finds external data files relative to the model's folder, mapping each file once.
pub(crate) struct ExternalData {
    base: Option<PathBuf>,
    files: HashMap<PathBuf, Bytes>,
}

impl ExternalData {
    pub(crate) fn new(base: Option<&Path>) -> ExternalData {
        ExternalData {
            base: base.map(Path::to_path_buf),
            files: HashMap::new(),
        }
    }

    fn load(&mut self, t: &TensorProto) -> Result<Bytes, ImportError> {
        let err = |message: String| ImportError::ExternalData {
            tensor: t.name.clone(),
            message,
        };
        let mut location = None;
        let mut offset = 0u64;
        let mut length = None;
        for kv in &t.external_data {
            let num = |v: &str| {
                v.parse::<u64>()
                    .map_err(|_| err(format!("`{}` is `{v}`, not a byte count", kv.key)))
            };
            match kv.key.as_str() {
                "location" => location = Some(kv.value.as_str()),
                "offset" => offset = num(&kv.value)?,
                "length" => length = Some(num(&kv.value)?),
                _ => {}
            }
        }
        let location = location.ok_or_else(|| err("no `location` key".into()))?;
        let rel = Path::new(location);
        if rel.is_absolute()
            || rel
                .components()
                .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
        {
            return Err(err(format!(
                "location `{location}` must be a relative path inside the model's folder"
            )));
        }
        let base = self.base.as_ref().ok_or_else(|| {
            err(format!(
                "the data is in `{location}`, but the model was given as bytes without a folder"
            ))
        })?;
        let path = base.join(rel);
        let file = match self.files.get(&path) {
            Some(b) => b.clone(),
            None => {
                let b = map_file(&path)?;
                self.files.insert(path.clone(), b.clone());
                b
            }
        };
        let flen = file.len() as u64;
        let end = match length {
            Some(l) => offset.checked_add(l),
            None => Some(flen),
        };
        match end {
            Some(end) if offset <= end && end <= flen => {
                Ok(file.slice(offset as usize..end as usize))
            }
            _ => Err(err(format!(
                "offset {offset}, length {length:?} lie outside `{}` ({flen} bytes)",
                path.display()
            ))),
        }
    }
}

/// Converts a `TensorProto` (an initializer, or a `Constant`'s value) into a tensor. `raw_data`
/// and external data of a dtype the IR has are shared, not copied; FLOAT16, BFLOAT16 and DOUBLE
/// are converted to f32 (exactly, except DOUBLE values that f32 cannot hold, which round).
pub(crate) fn tensor_from_proto(
    t: &TensorProto,
    ext: &mut ExternalData,
) -> Result<Tensor, ImportError> {
    let name = || t.name.clone();
    let bad = |message: String| ImportError::BadTensor {
        name: name(),
        message,
    };
    let mut shape = Vec::with_capacity(t.dims.len());
    let mut numel: usize = 1;
    for &d in &t.dims {
        let d = usize::try_from(d).map_err(|_| bad(format!("negative dimension {d}")))?;
        numel = numel
            .checked_mul(d)
            .ok_or_else(|| bad(format!("dims {:?} overflow", t.dims)))?;
        shape.push(d);
    }
    let dt = DataType::try_from(t.data_type).ok();
    let (dtype, stored_width) = match dt {
        Some(DataType::Float16 | DataType::Bfloat16) => (DType::F32, 2),
        Some(DataType::Double) => (DType::F32, 8),
        _ => {
            let d = value_dtype(t.data_type, || format!("tensor `{}`", t.name))?;
            (d, d.size_of())
        }
    };
    let expected = numel
        .checked_mul(stored_width)
        .ok_or_else(|| bad(format!("dims {:?} overflow", t.dims)))?;
    let raw = if t.data_location == DataLocation::External as i32 {
        Some(ext.load(t)?)
    } else if !t.raw_data.is_empty() || numel == 0 {
        Some(t.raw_data.clone())
    } else {
        None
    };
    let size_err = |actual: usize| ImportError::InitializerSize {
        name: name(),
        expected,
        actual,
    };
    if let Some(raw) = raw {
        if raw.len() != expected {
            return Err(size_err(raw.len()));
        }
        let data = match dt {
            Some(DataType::Float16) => Bytes::from(f32_bytes(
                raw.chunks_exact(2)
                    .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()),
            )),
            Some(DataType::Bfloat16) => Bytes::from(f32_bytes(
                raw.chunks_exact(2)
                    .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()),
            )),
            Some(DataType::Double) => Bytes::from(f32_bytes(raw.chunks_exact(8).map(|c| {
                f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) as f32
            }))),
            _ => raw,
        };
        return Ok(Tensor::from_bytes(dtype, shape, data)?);
    }
    // Typed fields: the count must match the shape; sizes are reported in bytes of stored data.
    let check = |n: usize| {
        if n == numel {
            Ok(())
        } else {
            Err(size_err(n * stored_width))
        }
    };
    let data = match dt {
        Some(DataType::Float) => {
            check(t.float_data.len())?;
            f32_bytes(t.float_data.iter().copied())
        }
        Some(DataType::Double) => {
            check(t.double_data.len())?;
            f32_bytes(t.double_data.iter().map(|&v| v as f32))
        }
        Some(DataType::Int64) => {
            check(t.int64_data.len())?;
            t.int64_data.iter().flat_map(|v| v.to_le_bytes()).collect()
        }
        // The remaining types are stored one element per int32, in the low bits.
        Some(DataType::Int32) => {
            check(t.int32_data.len())?;
            t.int32_data.iter().flat_map(|v| v.to_le_bytes()).collect()
        }
        Some(DataType::Int8 | DataType::Uint8 | DataType::Bool) => {
            check(t.int32_data.len())?;
            t.int32_data.iter().map(|&v| v as u8).collect()
        }
        Some(DataType::Int16 | DataType::Uint16) => {
            check(t.int32_data.len())?;
            t.int32_data
                .iter()
                .flat_map(|&v| (v as u16).to_le_bytes())
                .collect()
        }
        // UINT32 and UINT64 are stored in uint64_data, in the low bits for UINT32.
        Some(DataType::Uint32 | DataType::Uint64) => {
            check(t.uint64_data.len())?;
            let width = stored_width;
            t.uint64_data
                .iter()
                .flat_map(|v| v.to_le_bytes().into_iter().take(width))
                .collect()
        }
        Some(DataType::Bfloat16) => {
            check(t.int32_data.len())?;
            f32_bytes(
                t.int32_data
                    .iter()
                    .map(|&v| half::bf16::from_bits(v as u16).to_f32()),
            )
        }
        Some(DataType::Float16) => {
            check(t.int32_data.len())?;
            f32_bytes(
                t.int32_data
                    .iter()
                    .map(|&v| half::f16::from_bits(v as u16).to_f32()),
            )
        }
        _ => {
            return Err(ImportError::UnsupportedDType {
                what: format!("tensor `{}`", t.name),
                data_type: t.data_type,
            })
        }
    };
    Ok(Tensor::from_bytes(dtype, shape, Bytes::from(data))?)
}

fn f32_bytes(values: impl Iterator<Item = f32>) -> Vec<u8> {
    values.flat_map(f32::to_le_bytes).collect()
}

//! The compiled model file (`.encore`): one safetensors file whose tensors are the graph's large
//! constants (named by their node) and whose metadata holds the graph in the IR text form
//! (`encore.graph`) and the format version (`encore.format`). It opens with no ONNX beside it, its
//! weights memory-mapped: a constant is a slice of the mapping.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use ir::{DType, Graph, Op, Tensor};
use safetensors::{Dtype, SafeTensors};

use crate::Error;

/// The format version written into the metadata.
pub const FORMAT_VERSION: &str = "1";

fn st_dtype(d: DType) -> Option<Dtype> {
    Some(match d {
        DType::F32 => Dtype::F32,
        DType::BF16 => Dtype::BF16,
        DType::I8 => Dtype::I8,
        DType::U8 => Dtype::U8,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
        DType::I16 => Dtype::I16,
        DType::U16 => Dtype::U16,
        DType::U32 => Dtype::U32,
        DType::U64 => Dtype::U64,
        DType::Bool => Dtype::BOOL,
        #[allow(unreachable_patterns)]
        _ => return None,
    })
}

fn ir_dtype(d: Dtype) -> Option<DType> {
    Some(match d {
        Dtype::F32 => DType::F32,
        Dtype::BF16 => DType::BF16,
        Dtype::I8 => DType::I8,
        Dtype::U8 => DType::U8,
        Dtype::I32 => DType::I32,
        Dtype::I64 => DType::I64,
        Dtype::I16 => DType::I16,
        Dtype::U16 => DType::U16,
        Dtype::U32 => DType::U32,
        Dtype::U64 => DType::U64,
        Dtype::BOOL => DType::Bool,
        _ => return None,
    })
}

/// Whether the file at `path` starts like a safetensors file (8-byte little-endian header length
/// that fits the file, then `{`). ONNX protobufs never do: their first byte is a field tag.
pub(crate) fn is_compiled(path: &Path) -> bool {
    use std::io::Read;
    let Ok(mut f) = std::fs::File::open(path) else {
        return false;
    };
    let size = f.metadata().map(|m| m.len()).unwrap_or(0);
    let mut head = [0u8; 9];
    if f.read_exact(&mut head).is_err() {
        return false;
    }
    let n = u64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
    head[8] == b'{' && n.saturating_add(8) <= size
}

/// Writes `graph` as a compiled model file.
pub fn save(graph: &Graph, path: &Path) -> Result<(), Error> {
    let mut g = graph.clone();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut tensors: Vec<(String, Tensor)> = Vec::new();
    collect_extern(&mut g, &mut seen, &mut tensors)?;
    let text = ir::text::print(&g)?;
    let mut views = Vec::with_capacity(tensors.len());
    for (name, t) in &tensors {
        let dtype = st_dtype(t.dtype()).ok_or_else(|| {
            Error::Invalid(format!("constant `{name}`: {} cannot be saved", t.dtype()))
        })?;
        let data = t.bytes().expect("checked has_data");
        let view = safetensors::tensor::TensorView::new(dtype, t.shape().to_vec(), data)
            .map_err(|e| Error::Invalid(format!("constant `{name}`: {e}")))?;
        views.push((name.clone(), view));
    }
    let meta = HashMap::from([
        ("encore.format".to_string(), FORMAT_VERSION.to_string()),
        ("encore.graph".to_string(), text),
    ]);
    safetensors::tensor::serialize_to_file(views, Some(meta), path)
        .map_err(|e| e.to_string())
        .and_then(|()| sort_metadata(path))
        .map_err(|message| Error::Compiled {
            path: path.display().to_string(),
            message,
        })
}

/// Rewrites the `__metadata__` object of the safetensors file at `path` with its keys in sorted
/// order, in place. `safetensors` writes the metadata from a `HashMap`, whose order changes from
/// map to map (its hasher's keys are random), so the same model saved twice gave files that
/// differed in the order of their two metadata keys: not reproducible, and no checksum could
/// say that two compiled models were the same. The object keeps its length (the same keys and
/// values, serialized alike), so the header is rewritten where it is; a header that does not
/// read back as the same JSON is left as written.
pub(crate) fn sort_metadata(path: &Path) -> Result<(), String> {
    use std::io::{Read, Seek, SeekFrom, Write};
    const PREFIX: &[u8] = b"{\"__metadata__\":";
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| format!("reopening to order the metadata: {e}"))?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len).map_err(|e| e.to_string())?;
    let n = usize::try_from(u64::from_le_bytes(len)).map_err(|e| e.to_string())?;
    let mut header = vec![0u8; n];
    f.read_exact(&mut header).map_err(|e| e.to_string())?;
    if !header.starts_with(PREFIX) {
        return Ok(());
    }
    let parsed: serde_json::Value = serde_json::from_slice(&header).map_err(|e| e.to_string())?;
    let Some(meta) = parsed.get("__metadata__") else {
        return Ok(());
    };
    let sorted: std::collections::BTreeMap<String, String> =
        serde_json::from_value(meta.clone()).map_err(|e| e.to_string())?;
    let object = serde_json::to_vec(&sorted).map_err(|e| e.to_string())?;
    let end = PREFIX.len() + object.len();
    if end > header.len() {
        return Ok(());
    }
    let mut rewritten = header.clone();
    rewritten[PREFIX.len()..end].copy_from_slice(&object);
    match serde_json::from_slice::<serde_json::Value>(&rewritten) {
        Ok(v) if v == parsed => {}
        _ => return Ok(()),
    }
    f.seek(SeekFrom::Start(8)).map_err(|e| e.to_string())?;
    f.write_all(&rewritten).map_err(|e| e.to_string())
}

/// Gives every constant printed by reference (in `g` and in its loop bodies, at any depth) a
/// name unique in the whole file, and collects it: the text form finds such constants by node
/// name, whichever graph they are in.
fn collect_extern(
    g: &mut Graph,
    seen: &mut HashMap<String, usize>,
    tensors: &mut Vec<(String, Tensor)>,
) -> Result<(), Error> {
    for id in g.topo_order()? {
        let value = match &g.node(id).op {
            Op::Const { value } => value,
            Op::Loop { carried, body } => {
                let (carried, mut body) = (*carried, (**body).clone());
                collect_extern(&mut body, seen, tensors)?;
                g.node_mut(id).op = Op::Loop {
                    carried,
                    body: Arc::new(body),
                };
                continue;
            }
            _ => continue,
        };
        if value.len() <= ir::INLINE_LIMIT || !value.has_data() {
            continue;
        }
        let value = value.clone();
        let base = g
            .node(id)
            .name
            .replace(['\n', '\r'], " ")
            .trim()
            .to_string();
        let base = if base.is_empty() {
            "const".to_string()
        } else {
            base
        };
        let count = seen.entry(base.clone()).or_insert(0);
        *count += 1;
        let name = if *count == 1 {
            base
        } else {
            format!("{base}#{count}")
        };
        g.node_mut(id).name = name.clone();
        tensors.push((name, value));
    }
    Ok(())
}

/// Reads a compiled model file: the graph from the metadata, the constants as slices of the
/// memory-mapped file.
pub fn load(path: &Path) -> Result<Graph, Error> {
    let file_err = |message: String| Error::Compiled {
        path: path.display().to_string(),
        message,
    };
    let file = std::fs::File::open(path).map_err(|e| file_err(e.to_string()))?;
    // SAFETY: the file is mapped read-only and must not be modified while the model lives, as
    // for every mmap-based weight loader (and the ONNX importer here).
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| file_err(e.to_string()))?;
    let bytes = Bytes::from_owner(map);
    let (header_len, meta) = SafeTensors::read_metadata(&bytes)
        .map_err(|e| file_err(format!("not a compiled model: {e}")))?;
    let info = meta.metadata().as_ref();
    let version = info.and_then(|m| m.get("encore.format"));
    if version.map(String::as_str) != Some(FORMAT_VERSION) {
        return Err(file_err(format!(
            "not an encore compiled model of format {FORMAT_VERSION} (encore.format = {version:?})"
        )));
    }
    let text = info
        .and_then(|m| m.get("encore.graph"))
        .ok_or_else(|| file_err("no `encore.graph` in the metadata".into()))?;
    let data_start = 8 + header_len;
    let mut consts: HashMap<String, Tensor> = HashMap::new();
    for (name, ti) in meta.tensors() {
        let dtype = ir_dtype(ti.dtype).ok_or_else(|| {
            file_err(format!(
                "tensor `{name}` has unsupported dtype {:?}",
                ti.dtype
            ))
        })?;
        let (a, b) = ti.data_offsets;
        if b < a || data_start + b > bytes.len() {
            return Err(file_err(format!(
                "tensor `{name}` lies outside the file (truncated?)"
            )));
        }
        let t = Tensor::from_bytes(
            dtype,
            ti.shape.clone(),
            bytes.slice(data_start + a..data_start + b),
        )
        .map_err(|e| file_err(format!("tensor `{name}`: {e}")))?;
        consts.insert(name, t);
    }
    let g = ir::text::parse(text, Some(&consts))?;
    if let Some(name) = constant_without_data(&g) {
        return Err(file_err(format!(
            "constant `{name}` has no data in the file"
        )));
    }
    Ok(g)
}

/// The name of a constant of `g` or of its loop bodies that has no data, if there is one.
fn constant_without_data(g: &Graph) -> Option<String> {
    g.node_ids().find_map(|id| match &g.node(id).op {
        Op::Const { value } if !value.has_data() => Some(g.node(id).name.clone()),
        Op::Loop { body, .. } => constant_without_data(body),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    /// The same graph saved eight times gives eight identical files, each loading back: the
    /// metadata's keys come out sorted whatever order the `HashMap` handed to safetensors had
    /// (each map's hasher has its own random keys, so unsorted the eight files differed in the
    /// order of `encore.format` and `encore.graph` with probability 1 − 2⁻⁷).
    #[test]
    fn saving_twice_gives_the_same_bytes() {
        let g = ir::text::parse(
            "%0 = input[name=\"x\"] : f32[B,2]\n%1 = relu(%0) : f32[B,2]\noutput \"y\" = %1\n",
            None,
        )
        .unwrap();
        let dir = std::env::temp_dir().join(format!("encore-save-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let files: Vec<Vec<u8>> = (0..8)
            .map(|i| {
                let path = dir.join(format!("m{i}.encore"));
                super::save(&g, &path).unwrap();
                assert!(crate::Model::load(&path).is_ok(), "file {i} loads");
                std::fs::read(&path).unwrap()
            })
            .collect();
        std::fs::remove_dir_all(&dir).unwrap();
        let meta_at = |f: &[u8], key: &str| {
            f.windows(key.len())
                .position(|w| w == key.as_bytes())
                .unwrap()
        };
        for (i, f) in files.iter().enumerate() {
            assert_eq!(f, &files[0], "file {i} differs from file 0");
        }
        assert!(meta_at(&files[0], "encore.format") < meta_at(&files[0], "encore.graph"));
    }
}

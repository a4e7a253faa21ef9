//! Shared helpers of the model tests: where the models are, the manifest, reference batches.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use runtime::TensorValue;
use serde_json::Value;

/// The shared models folder: `$ENCORE_MODELS`, else `../shared/models` beside the workspace.
/// `None` (after a loud SKIP line) when absent; a failure when `CI` is set.
pub fn models_dir(test: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("ENCORE_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/models"));
    if dir.join("manifest.json").exists() {
        return Some(dir);
    }
    if std::env::var_os("CI").is_some() {
        panic!(
            "{test}: shared models not found at {} (set ENCORE_MODELS)",
            dir.display()
        );
    }
    {
        // Straight to stderr: the harness hides eprintln! of passing tests.
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "SKIP {test}: shared models not found at {} (set ENCORE_MODELS)",
            dir.display()
        );
    }
    None
}

pub fn manifest(dir: &Path) -> Value {
    let s = std::fs::read_to_string(dir.join("manifest.json")).expect("read manifest.json");
    serde_json::from_str(&s).expect("parse manifest.json")
}

pub fn model_entry<'a>(manifest: &'a Value, id: &str) -> &'a Value {
    manifest["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == id)
        .unwrap_or_else(|| panic!("model {id} not in manifest"))
}

/// One reference batch: name, inputs and expected outputs, in manifest order.
pub struct RefBatch {
    pub name: String,
    pub inputs: Vec<(String, TensorValue)>,
    pub outputs: Vec<(String, TensorValue)>,
    pub derived: Vec<(String, TensorValue)>,
}

impl RefBatch {
    pub fn input(&self, name: &str) -> &TensorValue {
        &self.inputs.iter().find(|(n, _)| n == name).unwrap().1
    }
    pub fn feeds(&self) -> Vec<(&str, TensorValue)> {
        self.inputs
            .iter()
            .map(|(n, t)| (n.as_str(), t.clone()))
            .collect()
    }

    /// The batch's inputs as a calibration batch.
    pub fn calibration(&self) -> runtime::quantize::CalibrationBatch {
        runtime::quantize::CalibrationBatch::from_feeds(self.inputs.clone())
    }
}

/// `fp32` quantized with static (per-tensor) activations calibrated on `batches` (2 threads).
pub fn quantize_static(
    fp32: &runtime::Model,
    batches: &[runtime::quantize::CalibrationBatch],
) -> runtime::Model {
    use runtime::quantize::{calibrate, quantize, ActivationMode, QuantizeOptions};
    let stats = calibrate(fp32, batches, 2, &mut |_, _| {}).unwrap();
    let opts = QuantizeOptions {
        activations: ActivationMode::Static,
        ..QuantizeOptions::default()
    };
    quantize(fp32, Some(&stats), &opts).unwrap().0
}

fn read_group(dir: &Path, v: &Value) -> Vec<(String, TensorValue)> {
    let Some(obj) = v.as_object() else {
        return vec![];
    };
    obj.iter()
        .map(|(name, spec)| {
            let file = dir.join(spec["file"].as_str().unwrap());
            (name.clone(), TensorValue::read_npy(&file).unwrap())
        })
        .collect()
}

pub fn ref_batches(dir: &Path, entry: &Value) -> Vec<RefBatch> {
    entry["references"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| RefBatch {
            name: r["name"].as_str().unwrap().to_string(),
            inputs: read_group(dir, &r["inputs"]),
            outputs: read_group(dir, &r["outputs"]),
            derived: read_group(dir, &r["derived"]),
        })
        .collect()
}

/// Max and mean absolute error of `got` against `want`, split by whether the row (the leading
/// `[B, S]` position) is valid under `mask` (all rows valid when `mask` is None or the output is
/// not `[B, S, ...]`).
pub struct ErrStats {
    pub valid_max: f32,
    pub valid_mean: f64,
    pub pad_max: f32,
    pub pad_count: usize,
    /// Valid values whose error exceeds 1e-4.
    pub valid_off: usize,
    pub valid_count: usize,
    /// Max error per batch row (over valid positions).
    pub row_max: Vec<f32>,
    /// Max error per batch row over its padded positions.
    pub pad_row_max: Vec<f32>,
}

pub fn compare(got: &TensorValue, want: &TensorValue, mask: Option<&TensorValue>) -> ErrStats {
    assert_eq!(got.shape(), want.shape(), "shape");
    let (g, w) = (got.as_f32().unwrap(), want.as_f32().unwrap());
    let mask_v = mask
        .filter(|m| got.rank() >= 2 && m.shape() == &got.shape()[..2])
        .map(|m| m.to_i64_vec().unwrap());
    let row = if mask_v.is_some() {
        got.shape()[2..].iter().product::<usize>()
    } else {
        1
    };
    let per_batch: usize = got.shape()[1..].iter().product();
    let mut s = ErrStats {
        valid_max: 0.0,
        valid_mean: 0.0,
        pad_max: 0.0,
        pad_count: 0,
        valid_off: 0,
        valid_count: 0,
        row_max: vec![0.0; got.shape().first().copied().unwrap_or(1)],
        pad_row_max: vec![0.0; got.shape().first().copied().unwrap_or(1)],
    };
    let mut n_valid = 0usize;
    for (i, (&a, &b)) in g.iter().zip(w).enumerate() {
        let e = (a - b).abs();
        let e = if e.is_nan() { f32::INFINITY } else { e };
        let valid = mask_v.as_ref().is_none_or(|m| m[i / row] != 0);
        if valid {
            s.valid_max = s.valid_max.max(e);
            s.valid_mean += e as f64;
            n_valid += 1;
            if e > 1e-4 {
                s.valid_off += 1;
            }
            let r = if got.rank() == 0 {
                0
            } else {
                i / per_batch.max(1)
            };
            s.row_max[r] = s.row_max[r].max(e);
        } else {
            s.pad_max = s.pad_max.max(e);
            s.pad_count += 1;
            let r = i / per_batch.max(1);
            s.pad_row_max[r] = s.pad_row_max[r].max(e);
        }
    }
    s.valid_mean /= n_valid.max(1) as f64;
    s.valid_count = n_valid;
    s
}

/// Deterministic values in `[lo, hi)` (for graphs written in the IR text form).
pub fn uniform(n: usize, seed: u64, lo: f32, hi: f32) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            lo + (hi - lo) * ((s >> 40) as f32 / (1u64 << 24) as f32)
        })
        .collect()
}

pub fn list<T: std::fmt::Debug>(v: &[T]) -> String {
    v.iter()
        .map(|x| format!("{x:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// An `i8[k, n]` constant of values in [-127, 127], as IR text.
pub fn i8_matrix(k: usize, n: usize, seed: u64) -> String {
    let w: Vec<i8> = uniform(k * n, seed, -127.0, 128.0)
        .into_iter()
        .map(|v| v.floor() as i8)
        .collect();
    format!("const[value=i8[{k},{n}]{{{}}}] : i8[{k},{n}]", list(&w))
}

/// An `f32[n]` constant of values in `[lo, hi)`, as IR text.
pub fn vector(n: usize, seed: u64, lo: f32, hi: f32) -> String {
    format!(
        "const[value=f32[{n}]{{{}}}] : f32[{n}]",
        list(&uniform(n, seed, lo, hi))
    )
}

/// Runs `model` once on `feeds` in a session with the `fuse` pipeline on or off: the first
/// output's values and the compiled graph's text.
pub fn run_fused_or_not(
    model: &runtime::Model,
    fuse: bool,
    threads: usize,
    feeds: &[(&str, TensorValue)],
) -> (Vec<f32>, String) {
    let opts = runtime::CompileOptions {
        threads,
        fuse,
        ..runtime::CompileOptions::default()
    };
    let s = runtime::Session::new(model, opts).unwrap();
    let text = ir::text::print(s.graph()).unwrap();
    let out = s.run(feeds).unwrap();
    (out[0].1.as_f32().unwrap().to_vec(), text)
}

/// `input_ids`, `attention_mask` and `token_type_ids` as `[batch, seq]` i64 tensors, keeping
/// those that `session` takes.
pub fn token_feeds(
    session: &runtime::Session,
    [batch, seq]: [usize; 2],
    ids: Vec<i64>,
    mask: Vec<i64>,
    types: Vec<i64>,
) -> Vec<(String, TensorValue)> {
    let t = |v: Vec<i64>| TensorValue::from_i64(vec![batch, seq], v).unwrap();
    let all = [
        ("input_ids", t(ids)),
        ("attention_mask", t(mask)),
        ("token_type_ids", t(types)),
    ];
    let names: Vec<String> = session.inputs().into_iter().map(|s| s.name).collect();
    all.into_iter()
        .filter(|(n, _)| names.iter().any(|x| x == n))
        .map(|(n, t)| (n.to_string(), t))
        .collect()
}

/// Borrowed names, for [`runtime::Session::run`].
pub fn as_refs(s: &[(String, TensorValue)]) -> Vec<(&str, TensorValue)> {
    s.iter().map(|(n, t)| (n.as_str(), t.clone())).collect()
}

/// `lengths.len()` sequences right-padded to the longest (at least 4 tokens, so that a batch of
/// empty sequences is all padding); ids from a fixed formula, token types 1 in the second half
/// of every other sequence.
pub fn length_feeds(session: &runtime::Session, lengths: &[usize]) -> Vec<(String, TensorValue)> {
    let vocab = session.lookup_rows("input_ids").expect("a token lookup") as i64;
    let (batch, seq) = (lengths.len(), padded_len(lengths));
    let mut ids = vec![0i64; batch * seq];
    let mut mask = vec![0i64; batch * seq];
    let mut types = vec![0i64; batch * seq];
    for (b, &len) in lengths.iter().enumerate() {
        for s in 0..len {
            let i = b * seq + s;
            ids[i] = (3 + (b * 7919 + s * 104_729) as i64) % vocab;
            mask[i] = 1;
            types[i] = i64::from(s >= len / 2 && b % 2 == 1);
        }
    }
    token_feeds(session, [batch, seq], ids, mask, types)
}

/// The padded length of [`length_feeds`].
pub fn padded_len(lengths: &[usize]) -> usize {
    lengths.iter().copied().max().unwrap_or(0).max(4)
}

/// Model `id` of the manifest, `None` (after a SKIP line naming `test`) without the models.
pub fn load_model(test: &str, id: &str) -> Option<runtime::Model> {
    let dir = models_dir(&format!("{test} {id}"))?;
    let man = manifest(&dir);
    let entry = model_entry(&man, id);
    Some(runtime::Model::load(dir.join(entry["file"].as_str().unwrap())).unwrap())
}

/// The FP32 encoders of the manifest: BERT, DistilBERT and XLM-R (tiny) and MiniLM.
pub const FP32_ENCODERS: [&str; 4] = [
    "tiny-bert",
    "tiny-distilbert",
    "tiny-xlm-roberta",
    "minilm-l6",
];

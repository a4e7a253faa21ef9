//! The `.npy` reader and writer against NumPy itself, not against each other: NumPy writes a
//! file of every dtype the reader takes and we read it; we write every dtype and NumPy reads
//! it. The values are a formula both sides compute, so neither side's output is the other's
//! oracle. Needs `ENCORE_ORT_PYTHON` (a Python with NumPy; `.ci/run` makes one): skips loudly
//! without it, fails without it in CI.

use std::path::Path;
use std::process::Command;

use runtime::{DType, Error, TensorValue};

/// (NumPy dtype, our dtype, shape). Value i of a tensor is `f(i)` cast to the dtype (see
/// [`value`] and the script).
const CASES: &[(&str, DType, &[usize])] = &[
    ("float32", DType::F32, &[2, 3, 4]),
    ("float32", DType::F32, &[]),
    ("float32", DType::F32, &[0, 4]),
    ("int64", DType::I64, &[3, 5]),
    ("int32", DType::I32, &[7]),
    ("uint8", DType::U8, &[4, 4]),
    ("int8", DType::I8, &[300]),
    ("bool", DType::Bool, &[2, 5]),
];

/// Value i as f64: exact in every dtype after the script's cast (small integers, halves), with
/// negative values, large magnitudes for the 64-bit case, and wrap-around for the 8-bit ones.
fn value(i: usize) -> f64 {
    (i as f64 * 37.0) % 101.0 - 50.5
}

fn want(dtype: DType, shape: &[usize]) -> TensorValue {
    let n: usize = shape.iter().product();
    let v = (0..n).map(value);
    let shape = shape.to_vec();
    match dtype {
        DType::F32 => TensorValue::from_f32(shape, v.map(|x| x as f32).collect()),
        // NumPy casts float to int by truncation toward zero, then wraps (astype).
        DType::I64 => {
            TensorValue::from_i64(shape, v.map(|x| x.trunc() as i64 * 1_000_000_007).collect())
        }
        DType::I32 => TensorValue::from_i32(shape, v.map(|x| x.trunc() as i32).collect()),
        DType::U8 => TensorValue::from_u8(shape, v.map(|x| x.trunc() as i64 as u8).collect()),
        DType::I8 => TensorValue::from_i8(shape, v.map(|x| x.trunc() as i64 as i8).collect()),
        DType::Bool => TensorValue::from_bool(shape, v.map(|x| x > 0.0).collect()),
        d => panic!("no case for {d}"),
    }
    .unwrap()
}

const SCRIPT: &str = r#"
import sys, numpy as np
mode, d = sys.argv[1], sys.argv[2]
cases = [c.split(":") for c in sys.argv[3:]]
def want(dtype, shape):
    n = int(np.prod(shape)) if shape else 1
    x = (np.arange(n, dtype=np.float64) * 37.0) % 101.0 - 50.5
    if dtype == "bool":
        v = x > 0
    elif dtype == "int64":
        v = np.trunc(x).astype(np.int64) * 1000000007
    elif dtype == "float32":
        v = x.astype(np.float32)
    else:
        v = np.trunc(x).astype(np.int64).astype(dtype)
    return v.reshape(shape)
bad = 0
for k, (dtype, shape) in enumerate(cases):
    shape = tuple(int(s) for s in shape.split("x")) if shape else ()
    path = f"{d}/{k}.npy"
    if mode == "write":
        np.save(path, want(dtype, shape))
    else:
        got = np.load(path, allow_pickle=False)
        ok = got.dtype == np.dtype(dtype) and got.shape == shape and np.array_equal(got, want(dtype, shape))
        bad += not ok
        print(("ok  " if ok else "FAIL") + f" {path}: {got.dtype}{list(got.shape)}")
if mode == "write":
    # What the reader must refuse with a typed error: Fortran order and big-endian data.
    np.save(f"{d}/fortran.npy", np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3)))
    np.save(f"{d}/big_endian.npy", np.arange(3, dtype=">f4"))
    np.save(f"{d}/float64.npy", np.arange(3, dtype=np.float64))
print("numpy", np.__version__)
sys.exit(1 if bad else 0)
"#;

fn python() -> Option<std::ffi::OsString> {
    if let Some(p) = std::env::var_os("ENCORE_ORT_PYTHON") {
        return Some(p);
    }
    let why = "ENCORE_ORT_PYTHON is not set (a Python with NumPy; .ci/run builds one in .venv-ci)";
    if std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false" && v != "0") {
        panic!("CI: {why}");
    }
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "SKIP npy_numpy: {why}");
    None
}

fn run_script(python: &std::ffi::OsString, mode: &str, dir: &Path) -> String {
    let cases: Vec<String> = CASES
        .iter()
        .map(|(np, _, s)| {
            let dims: Vec<String> = s.iter().map(|d| d.to_string()).collect();
            format!("{np}:{}", dims.join("x"))
        })
        .collect();
    let out = Command::new(python)
        .arg("-c")
        .arg(SCRIPT)
        .arg(mode)
        .arg(dir)
        .args(&cases)
        .output()
        .unwrap_or_else(|e| panic!("running {python:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(out.status.success(), "numpy {mode} failed:\n{text}");
    text
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("encore-npy-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn we_read_what_numpy_writes() {
    let Some(py) = python() else { return };
    let dir = scratch("read");
    run_script(&py, "write", &dir);
    for (k, (np, dtype, shape)) in CASES.iter().enumerate() {
        let got = TensorValue::read_npy(dir.join(format!("{k}.npy")))
            .unwrap_or_else(|e| panic!("{np}{shape:?}: {e}"));
        assert_eq!(got, want(*dtype, shape), "{np}{shape:?}");
    }
    for refused in ["fortran", "big_endian"] {
        match TensorValue::read_npy(dir.join(format!("{refused}.npy"))) {
            Err(Error::Npy { .. }) => {}
            other => panic!("{refused}.npy: want Error::Npy, got {other:?}"),
        }
    }
    // float64 is read as f32, as double-precision models are (frontend-onnx's half precision
    // and double rule).
    let wide = TensorValue::read_npy(dir.join("float64.npy")).unwrap();
    assert_eq!(wide.shape(), [3]);
    assert_eq!(wide.as_f32(), Some(&[0.0f32, 1.0, 2.0][..]));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn numpy_reads_what_we_write() {
    let Some(py) = python() else { return };
    let dir = scratch("write");
    for (k, (_, dtype, shape)) in CASES.iter().enumerate() {
        want(*dtype, shape)
            .write_npy(dir.join(format!("{k}.npy")))
            .unwrap();
    }
    let text = run_script(&py, "read", &dir);
    assert_eq!(text.matches("ok  ").count(), CASES.len(), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

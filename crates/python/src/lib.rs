//! `encore._native`: the Rust half of the `encore` Python package. `python/encore/__init__.py`
//! wraps it with numpy: arrays cross the boundary as `.npy` bytes (every dtype the runtime
//! takes, no copy of a C-order array on the Python side beyond `np.save`).
//!
//! Every call that tokenizes, compiles or runs releases the GIL, so Python threads that share
//! one model run in parallel (the session is `Sync`). Every error is `encore.EncoreError` with
//! the runtime's message.

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use runtime::quantize::{calibrate, quantize_with_gate, text_batches, ActivationMode};
use runtime::text::{Padding, Pooling, SentenceEncoder, Tokenizer, TokenizerOptions};
use runtime::{CompileOptions, Model, Session, TensorValue};

/// Tensor rows on cache lines (see `runtime::CacheAligned`): the module's own Rust allocations.
#[global_allocator]
static ALLOC: runtime::CacheAligned = runtime::CacheAligned;

pyo3::create_exception!(
    encore,
    EncoreError,
    PyException,
    "An error of the encore runtime: a bad model, input, text or argument; the message says what and where."
);

fn py_err(e: impl std::fmt::Display) -> PyErr {
    EncoreError::new_err(e.to_string())
}

fn compile_options(threads: Option<usize>) -> CompileOptions {
    let default = CompileOptions::default();
    CompileOptions {
        threads: threads.unwrap_or(default.threads).max(1),
        ..default
    }
}

/// A compiled model and, when given, its tokenizer.
#[pyclass(frozen, module = "encore._native")]
struct NativeModel {
    session: Arc<Session>,
    model: Model,
    tokenizer: Option<Arc<Tokenizer>>,
    threads: Option<usize>,
}

impl NativeModel {
    fn tokenizer(&self) -> PyResult<&Arc<Tokenizer>> {
        self.tokenizer
            .as_ref()
            .ok_or_else(|| py_err("this model has no tokenizer: pass tokenizer=\"tokenizer.json\""))
    }
}

#[pymethods]
impl NativeModel {
    #[new]
    #[pyo3(signature = (path, tokenizer=None, threads=None, max_length=256))]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        tokenizer: Option<PathBuf>,
        threads: Option<usize>,
        max_length: usize,
    ) -> PyResult<Self> {
        py.detach(|| -> Result<NativeModel, runtime::Error> {
            let model = Model::load(&path)?;
            let session = Session::new(&model, compile_options(threads))?;
            let tok = tokenizer
                .as_ref()
                .map(|p| {
                    Tokenizer::from_file(
                        p,
                        TokenizerOptions {
                            max_length: Some(max_length),
                            padding: Padding::Longest,
                        },
                    )
                })
                .transpose()?;
            Ok(NativeModel {
                session: Arc::new(session),
                model,
                tokenizer: tok.map(Arc::new),
                threads,
            })
        })
        .map_err(py_err)
    }

    /// The names of the model's inputs, in order.
    #[getter]
    fn input_names(&self) -> Vec<String> {
        self.session.inputs().into_iter().map(|s| s.name).collect()
    }

    /// The names of the model's outputs, in order.
    #[getter]
    fn output_names(&self) -> Vec<String> {
        self.session.output_names()
    }

    /// `int8` for a quantized model, else `float32`.
    #[getter]
    fn precision(&self) -> &'static str {
        if self.model.is_quantized() {
            "int8"
        } else {
            "float32"
        }
    }

    /// `.npy` bytes of the `[len(texts), hidden]` f32 embeddings.
    #[pyo3(signature = (texts, batch_size=32, normalize=true, pooling="mean"))]
    fn encode<'py>(
        &self,
        py: Python<'py>,
        texts: Vec<String>,
        batch_size: usize,
        normalize: bool,
        pooling: &str,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let pooling = match pooling {
            "mean" => Pooling::Mean,
            "cls" => Pooling::Cls,
            other => return Err(py_err(format!("pooling `{other}`: expected mean or cls"))),
        };
        if batch_size == 0 {
            return Err(py_err("batch_size must be at least 1"));
        }
        let encoder = SentenceEncoder::new(self.session.clone(), self.tokenizer()?.clone())
            .with_pooling(pooling)
            .with_normalize(normalize);
        let t = py
            .detach(|| encoder.embed_all(&texts, batch_size, |_| {}))
            .map_err(py_err)?;
        Ok(PyBytes::new(py, &t.to_npy_bytes()))
    }

    /// Runs the model on `(name, .npy bytes)` inputs; `(name, .npy bytes)` outputs in order.
    fn run<'py>(
        &self,
        py: Python<'py>,
        inputs: Vec<(String, Bound<'py, PyBytes>)>,
    ) -> PyResult<Vec<(String, Bound<'py, PyBytes>)>> {
        let mut values = Vec::with_capacity(inputs.len());
        for (name, bytes) in &inputs {
            values.push(
                TensorValue::from_npy_bytes(bytes.as_bytes())
                    .map_err(|e| py_err(format!("input `{name}`: {e}")))?,
            );
        }
        let feeds: Vec<(&str, TensorValue)> =
            inputs.iter().map(|(n, _)| n.as_str()).zip(values).collect();
        let outputs = py
            .detach(|| -> Result<Vec<(String, Vec<u8>)>, runtime::Error> {
                let out = self.session.run(&feeds)?;
                Ok(out
                    .into_iter()
                    .map(|(n, t)| {
                        let bytes = t.to_npy_bytes();
                        // Copied out: its buffer serves the session's next run.
                        self.session.recycle(t);
                        (n, bytes)
                    })
                    .collect())
            })
            .map_err(py_err)?;
        Ok(outputs
            .into_iter()
            .map(|(n, b)| (n, PyBytes::new(py, &b)))
            .collect())
    }

    /// Calibrates on `texts` (the last `held_back` of them kept aside for the accuracy gate),
    /// SmoothQuants, quantizes, and writes one compiled `.encore` file to `out`; returns the
    /// report as a dict.
    #[pyo3(signature = (texts, out, alpha=0.5, activations="dynamic", keep_fp32=Vec::new(), min_cosine=None, held_back=64, batch_size=16))]
    #[allow(clippy::too_many_arguments)]
    fn quantize<'py>(
        &self,
        py: Python<'py>,
        texts: Vec<String>,
        out: PathBuf,
        alpha: f32,
        activations: &str,
        keep_fp32: Vec<String>,
        min_cosine: Option<f64>,
        held_back: usize,
        batch_size: usize,
    ) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let activations = match activations {
            "dynamic" => ActivationMode::Dynamic,
            "static" => ActivationMode::Static,
            other => {
                return Err(py_err(format!(
                    "activations `{other}`: expected static or dynamic"
                )))
            }
        };
        if !(0.0..=1.0).contains(&alpha) {
            return Err(py_err(format!(
                "alpha {alpha}: expected a number in [0, 1]"
            )));
        }
        if texts.len() < 2 {
            return Err(py_err("quantize needs at least two calibration texts"));
        }
        let tok = self.tokenizer()?;
        let threads = self.threads.unwrap_or(self.session.options().threads);
        let report = py
            .detach(|| -> Result<_, runtime::Error> {
                let mut texts = texts;
                let hold = held_back.min(texts.len() / 2);
                let held: Vec<String> = texts.split_off(texts.len() - hold);
                let batches = text_batches(tok, &self.session, &texts, batch_size)?;
                let held = text_batches(tok, &self.session, &held, batch_size)?;
                let stats = calibrate(&self.model, &batches, threads, &mut |_, _| {})?;
                let opts = runtime::quantize::QuantizeOptions {
                    alpha,
                    smooth: alpha > 0.0,
                    activations,
                    keep_fp32,
                    ..Default::default()
                };
                let (q, report, gate) = quantize_with_gate(
                    &self.model,
                    &self.session,
                    Some(&stats),
                    &opts,
                    &held,
                    min_cosine,
                )?;
                q.save(&out)?;
                Ok((report, gate))
            })
            .map_err(py_err)?;
        let (report, gate) = report;
        let d = pyo3::types::PyDict::new(py);
        d.set_item("quantized", report.quantized_layers())?;
        d.set_item("kept_fp32", report.kept_fp32())?;
        d.set_item("held_back_cosine", gate.cosine)?;
        d.set_item(
            "gate_kept",
            gate.kept.iter().map(|(l, _)| l.clone()).collect::<Vec<_>>(),
        )?;
        Ok(d)
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<NativeModel>()?;
    m.add("EncoreError", m.py().get_type::<EncoreError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

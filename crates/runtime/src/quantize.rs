//! INT8 from an FP32 model and calibration data: [`calibrate`] records what each linear layer
//! sees, [`quantize`] runs the `quantize` and `fuse` pipelines with those statistics, and
//! [`quantize_with_gate`] keeps the layers that hurt most in FP32 until the held-back cosine
//! reaches a floor.
//!
//! ```
//! use runtime::quantize::{calibrate, quantize, CalibrationBatch, QuantizeOptions};
//! use runtime::{Model, TensorValue};
//! let g = ir::text::parse(
//!     "%0 = input[name=\"x\"] : f32[B,2]\n\
//!      %1 = const[value=f32[2,2]{1.0, 0.5, -0.25, 2.0}] : f32[2,2]\n\
//!      %2 = matmul(%0, %1) : f32[B,2]  # fc\n\
//!      output \"y\" = %2\n",
//!     None,
//! ).unwrap();
//! let model = Model::from_graph(g).unwrap();
//! let x = TensorValue::from_f32(vec![2, 2], vec![1.0, -2.0, 0.5, 3.0]).unwrap();
//! let batch = CalibrationBatch { feeds: vec![("x".into(), x)], real_rows: None };
//! let stats = calibrate(&model, &[batch], 1, &mut |_, _| {}).unwrap();
//! let (layer, st) = stats.layers.iter().next().unwrap(); // the Linear recognised from `fc`
//! assert_eq!(st.max, vec![1.0, 3.0]);
//! let (q, report) = quantize(&model, Some(&stats), &QuantizeOptions::default()).unwrap();
//! assert!(q.is_quantized());
//! assert_eq!(report.quantized_layers(), vec![layer.clone()]);
//! ```

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use ir::{ActQuant, Graph, Op};
pub use passes::{ActivationMode, CalibrationStats, ChannelStats, Note, NoteKind, QuantizeOptions};

use crate::exec::fused::quantize_rows_here;
use crate::{CompileOptions, Error, Model, Session, TensorValue};

/// Calibration batches of `batch_size` texts tokenized by `tokenizer`, with the inputs `session`
/// takes; texts of similar length go together (less padding to compute; padding is never
/// counted in the statistics).
pub fn text_batches(
    tokenizer: &crate::text::Tokenizer,
    session: &Session,
    texts: &[String],
    batch_size: usize,
) -> Result<Vec<CalibrationBatch>, Error> {
    let mut order: Vec<usize> = (0..texts.len()).collect();
    order.sort_by_key(|&i| texts[i].len());
    let mut out = Vec::new();
    for chunk in order.chunks(batch_size.max(1)) {
        let t: Vec<&str> = chunk.iter().map(|&i| texts[i].as_str()).collect();
        let enc = tokenizer.encode(&t)?;
        let feeds = enc
            .feeds(session)
            .into_iter()
            .map(|(n, v)| (n.to_string(), v))
            .collect();
        out.push(CalibrationBatch::from_feeds(feeds));
    }
    Ok(out)
}

/// One batch of calibration inputs. `real_rows[b·S + s]` says whether token `s` of sequence `b`
/// is real (mask 1): padding never widens a range. `None`: every row counts.
#[derive(Clone, Debug)]
pub struct CalibrationBatch {
    pub feeds: Vec<(String, TensorValue)>,
    pub real_rows: Option<Vec<bool>>,
}

impl CalibrationBatch {
    /// A batch whose real rows are given by an `attention_mask` feed, when there is one.
    pub fn from_feeds(feeds: Vec<(String, TensorValue)>) -> CalibrationBatch {
        let mut b = CalibrationBatch {
            feeds,
            real_rows: None,
        };
        b.real_rows = b
            .attention_mask()
            .and_then(|m| m.as_i64().map(|v| v.iter().map(|&x| x != 0).collect()));
        b
    }

    fn attention_mask(&self) -> Option<&TensorValue> {
        self.feeds
            .iter()
            .find(|(n, _)| n == "attention_mask")
            .map(|(_, t)| t)
    }

    fn feed_refs(&self) -> Vec<(&str, TensorValue)> {
        self.feeds
            .iter()
            .map(|(n, t)| (n.as_str(), t.clone()))
            .collect()
    }
}

/// The rows of `x` (`[..., k]`) that count: all, or those `real` marks when it has one entry per
/// row.
fn counted_rows<'a>(
    x: &'a [f32],
    k: usize,
    real: Option<&'a [bool]>,
) -> impl Iterator<Item = &'a [f32]> + 'a {
    let rows = x.len().checked_div(k).unwrap_or(0);
    let mask = real.filter(|m| m.len() == rows);
    x.chunks_exact(k.max(1))
        .enumerate()
        .filter(move |(i, _)| mask.is_none_or(|m| m[*i]))
        .map(|(_, r)| r)
}

/// The model decluttered but not fused, so that every linear layer runs as itself and
/// [`Session::run_observed`] sees its input.
fn unfused_session(model: &Model, threads: usize) -> Result<Session, Error> {
    Session::new(
        model,
        CompileOptions {
            threads,
            fuse: false,
            ..CompileOptions::default()
        },
    )
}

/// Runs the FP32 model (decluttered, not fused, so every linear layer is visible) on `batches`
/// and records, for each linear layer's input, the per-channel minimum and maximum over the real
/// tokens. `progress(done, total)` is called after each batch.
///
/// ```no_run
/// use runtime::quantize::{calibrate, CalibrationBatch};
/// use runtime::text::{Tokenizer, TokenizerOptions};
/// let model = runtime::Model::load("../shared/models/minilm-l6/model.onnx")?;
/// let tok = Tokenizer::from_file("../shared/models/minilm-l6/tokenizer.json", TokenizerOptions::default())?;
/// let enc = tok.encode(&["some calibration text", "and more of it"])?;
/// let feeds = vec![
///     ("input_ids".to_string(), enc.input_ids.clone()),
///     ("attention_mask".to_string(), enc.attention_mask.clone()),
///     ("token_type_ids".to_string(), enc.token_type_ids.clone()),
/// ];
/// let stats = calibrate(&model, &[CalibrationBatch::from_feeds(feeds)], 2, &mut |_, _| {})?;
/// println!("{} layers observed", stats.layers.len());
/// # Ok::<(), runtime::Error>(())
/// ```
pub fn calibrate(
    model: &Model,
    batches: &[CalibrationBatch],
    threads: usize,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<CalibrationStats, Error> {
    let session = unfused_session(model, threads)?;
    let mut stats = CalibrationStats::default();
    let mut bad: Option<Error> = None;
    for (i, b) in batches.iter().enumerate() {
        let real = b.real_rows.as_deref();
        let mut observe = |name: &str, x: &TensorValue| {
            let Some(xv) = x.as_f32() else {
                return;
            };
            let k = x.shape().last().copied().unwrap_or(0);
            if k == 0 {
                return;
            }
            let st = stats
                .layers
                .entry(name.to_string())
                .or_insert_with(|| ChannelStats {
                    min: vec![f32::INFINITY; k],
                    max: vec![f32::NEG_INFINITY; k],
                    rows: 0,
                });
            if st.min.len() != k {
                bad.get_or_insert(Error::Invalid(format!(
                    "calibration: layer `{name}` saw {k} channels, earlier {}",
                    st.min.len()
                )));
                return;
            }
            for row in counted_rows(xv, k, real) {
                for ((lo, hi), &v) in st.min.iter_mut().zip(st.max.iter_mut()).zip(row) {
                    if v.is_finite() {
                        *lo = lo.min(v);
                        *hi = hi.max(v);
                    }
                }
                st.rows += 1;
            }
        };
        session.run_observed(&b.feed_refs(), &mut observe)?;
        if let Some(e) = bad.take() {
            return Err(e);
        }
        progress(i + 1, batches.len());
    }
    // A channel never seen finite (no real rows) has no range: make it 0.
    for st in stats.layers.values_mut() {
        for (lo, hi) in st.min.iter_mut().zip(st.max.iter_mut()) {
            if lo > hi {
                (*lo, *hi) = (0.0, 0.0);
            }
        }
    }
    Ok(stats)
}

/// Writes calibration statistics as safetensors: `<layer>.min` and `<layer>.max` (f32 `[k]`),
/// and the row counts in the metadata (`rows.<layer>`).
pub fn save_stats(stats: &CalibrationStats, path: &Path) -> Result<(), Error> {
    let mut bufs: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut meta = HashMap::new();
    for (name, st) in &stats.layers {
        for (suffix, v) in [("min", &st.min), ("max", &st.max)] {
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            bufs.push((format!("{name}.{suffix}"), vec![v.len()], bytes));
        }
        meta.insert(format!("rows.{name}"), st.rows.to_string());
    }
    meta.insert("encore.stats".to_string(), "1".to_string());
    let views = bufs
        .iter()
        .map(|(n, s, b)| {
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b)
                .map(|v| (n.clone(), v))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| stats_err(path, e))?;
    safetensors::tensor::serialize_to_file(views, Some(meta), path)
        .map_err(|e| stats_err(path, e))?;
    crate::compiled::sort_metadata(path).map_err(|e| stats_err(path, e))
}

fn stats_err(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Compiled {
        path: path.display().to_string(),
        message: format!("calibration statistics: {e}"),
    }
}

/// Reads statistics written by [`save_stats`].
pub fn load_stats(path: &Path) -> Result<CalibrationStats, Error> {
    let bytes = std::fs::read(path).map_err(|e| stats_err(path, e))?;
    let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| stats_err(path, e))?;
    let (_, meta) =
        safetensors::SafeTensors::read_metadata(&bytes).map_err(|e| stats_err(path, e))?;
    let info = meta.metadata().clone().unwrap_or_default();
    if info.get("encore.stats").map(String::as_str) != Some("1") {
        return Err(stats_err(path, "not an encore statistics file"));
    }
    let mut stats = CalibrationStats::default();
    let read = |name: &str| -> Result<Vec<f32>, Error> {
        let t = st.tensor(name).map_err(|e| stats_err(path, e))?;
        if t.dtype() != safetensors::Dtype::F32 {
            return Err(stats_err(path, format!("`{name}` is not f32")));
        }
        Ok(t.data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect())
    };
    for (key, rows) in &info {
        let Some(layer) = key.strip_prefix("rows.") else {
            continue;
        };
        let (min, max) = (
            read(&format!("{layer}.min"))?,
            read(&format!("{layer}.max"))?,
        );
        if min.len() != max.len() {
            return Err(stats_err(
                path,
                format!("`{layer}`: min and max differ in length"),
            ));
        }
        let rows = rows
            .parse()
            .map_err(|_| stats_err(path, format!("`{key}` is not a count")))?;
        stats
            .layers
            .insert(layer.to_string(), ChannelStats { min, max, rows });
    }
    Ok(stats)
}

/// What [`quantize`] decided, from the passes' notes.
#[derive(Clone, Debug, Default)]
pub struct QuantizeReport {
    pub notes: Vec<Note>,
}

impl QuantizeReport {
    /// The layers made integer, in graph order.
    pub fn quantized_layers(&self) -> Vec<String> {
        self.nodes("QuantizeLinears", NoteKind::Fired)
            .map(|(n, _)| n)
            .collect()
    }

    /// The layers left in FP32, with the reason.
    pub fn kept_fp32(&self) -> Vec<(String, String)> {
        self.nodes("QuantizeLinears", NoteKind::Declined).collect()
    }

    /// The attention ops whose products were made int8 (`attention: Int8`), in graph order.
    pub fn attention_int8(&self) -> Vec<String> {
        self.nodes("QuantizeAttention", NoteKind::Fired)
            .map(|(n, _)| n)
            .collect()
    }

    /// The attention ops left in f32 although int8 was asked for, with the reason.
    pub fn attention_kept_fp32(&self) -> Vec<(String, String)> {
        self.nodes("QuantizeAttention", NoteKind::Declined)
            .collect()
    }

    /// `(node, message)` of the notes `pass` made of `kind`, in order.
    fn nodes(
        &self,
        pass: &'static str,
        kind: NoteKind,
    ) -> impl Iterator<Item = (String, String)> + '_ {
        self.notes
            .iter()
            .filter(move |n| n.pass == pass && n.kind == kind)
            .map(|n| (n.node.clone(), n.message.clone()))
    }
}

fn run_quantize(
    model: &Model,
    stats: Option<&CalibrationStats>,
    opts: &QuantizeOptions,
) -> Result<(Graph, QuantizeReport), Error> {
    let mut g = model.graph().clone();
    passes::Pipeline::declutter().run(&mut g, &mut passes::RunOptions::default())?;
    let mut run = passes::RunOptions {
        context: passes::PassContext {
            quant: opts.clone(),
            stats,
            report: passes::Report::default(),
        },
        ..passes::RunOptions::default()
    };
    passes::Pipeline::quantize().run(&mut g, &mut run)?;
    let report = QuantizeReport {
        notes: run.context.report.notes,
    };
    Ok((g, report))
}

/// The INT8 model: declutter, then the `quantize` pipeline (SmoothQuant and s8 weights with the
/// statistics, activations as `opts` says). Static activations need statistics; dynamic ones
/// quantize every linear layer without them (and skip SmoothQuant). The `fuse` pipeline runs
/// when a session compiles the model, so the model (and its file) keeps every quantized layer
/// under its own name, as `eval --per-layer` and the accuracy gate need.
///
/// ```no_run
/// use runtime::quantize::{quantize, QuantizeOptions};
/// let fp32 = runtime::Model::load("../shared/models/minilm-l6/model.onnx")?;
/// // Dynamic (per-token) activations need no calibration statistics.
/// let (int8, report) = quantize(&fp32, None, &QuantizeOptions::default())?;
/// println!("{} layers in INT8", report.quantized_layers().len());
/// int8.save("minilm.int8.encore")?; // `Model::load` opens it again, memory-mapped
/// # Ok::<(), runtime::Error>(())
/// ```
pub fn quantize(
    model: &Model,
    stats: Option<&CalibrationStats>,
    opts: &QuantizeOptions,
) -> Result<(Model, QuantizeReport), Error> {
    let (g, report) = run_quantize(model, stats, opts)?;
    Ok((Model::from_graph(g)?, report))
}

/// One vector per sample of the model's first output: its mean over the real tokens
/// ([`crate::text::mean_pool`]) when it is `[batch, seq, hidden]` and the batch has an
/// `attention_mask` of `[batch, seq]`, else its rows.
fn sample_vectors(out: &TensorValue, mask: Option<&TensorValue>) -> Result<Vec<Vec<f32>>, Error> {
    if out.as_f32().is_none() {
        return Ok(Vec::new());
    }
    let sh = out.shape();
    match mask {
        Some(m) if sh.len() == 3 && m.shape() == &sh[..2] => {
            crate::eval::rows(&crate::text::mean_pool(out, m)?)
        }
        _ => {
            let last = sh.last().copied().unwrap_or(1).max(1);
            Ok(out
                .as_f32()
                .unwrap_or(&[])
                .chunks(last)
                .map(|c| c.to_vec())
                .collect())
        }
    }
}

/// Mean cosine between the two models' per-sample outputs (see [`sample_vectors`]) on `batches`.
pub fn mean_cosine(
    reference: &Session,
    candidate: &Session,
    batches: &[CalibrationBatch],
) -> Result<f64, Error> {
    let (mut sum, mut n) = (0.0, 0usize);
    for b in batches {
        let r = reference.run(&b.feed_refs())?;
        let c = candidate.run(&b.feed_refs())?;
        let rv = sample_vectors(&r[0].1, b.attention_mask())?;
        let cv = sample_vectors(&c[0].1, b.attention_mask())?;
        for (x, y) in rv.iter().zip(&cv) {
            sum += crate::eval::cosine(x, y)?;
            n += 1;
        }
    }
    Ok(if n == 0 { 1.0 } else { sum / n as f64 })
}

/// The error each quantized layer makes on its own: for every `QLinear` of `quantized` (not
/// fused), `‖x·W − dequant(quant(x)·W_q)‖ / ‖x·W‖` on the FP32 inputs `x` the layer sees in the
/// FP32 model (at most `max_rows` real rows per layer), largest first.
pub fn layer_errors(
    fp32: &Model,
    quantized_unfused: &Graph,
    batches: &[CalibrationBatch],
    threads: usize,
    max_rows: usize,
) -> Result<Vec<(String, f64)>, Error> {
    let session = unfused_session(fp32, threads)?;
    let g = quantized_unfused;
    // The quantized layers by name: (act, w_q, w_scale, inv_smooth).
    #[allow(clippy::type_complexity)]
    let mut layers: BTreeMap<String, (ActQuant, Vec<i8>, Vec<f32>, Option<Vec<f32>>, usize)> =
        BTreeMap::new();
    for id in g.node_ids() {
        let Op::QLinear { act, smooth, .. } = g.node(id).op else {
            continue;
        };
        let ins = g.node_inputs(id);
        let (Some(w), Some(ws)) = (g.const_value(ins[1]), g.const_value(ins[2])) else {
            continue;
        };
        let n = w.shape()[1];
        let inv = if smooth {
            g.const_value(ins[3]).and_then(|t| t.to_f32_vec().ok())
        } else {
            None
        };
        layers.insert(
            g.node(id).name.clone(),
            (act, w.to_vec::<i8>()?, ws.to_f32_vec()?, inv, n),
        );
    }
    let mut rows: HashMap<String, Vec<f32>> = HashMap::new();
    let mut k_of: HashMap<String, usize> = HashMap::new();
    for b in batches {
        let real = b.real_rows.as_deref();
        let mut observe = |name: &str, x: &TensorValue| {
            if !layers.contains_key(name) {
                return;
            }
            let (Some(xv), Some(&k)) = (x.as_f32(), x.shape().last()) else {
                return;
            };
            let buf = rows.entry(name.to_string()).or_default();
            k_of.insert(name.to_string(), k);
            for r in counted_rows(xv, k, real) {
                if buf.len() / k.max(1) < max_rows {
                    buf.extend_from_slice(r);
                }
            }
        };
        session.run_observed(&b.feed_refs(), &mut observe)?;
    }
    // The FP32 weights, by layer name, from the decluttered graph the session ran.
    let fp = session.graph();
    let mut out = Vec::new();
    for id in fp.node_ids() {
        if fp.node(id).op != Op::Linear {
            continue;
        }
        let name = &fp.node(id).name;
        let (Some((act, wq, ws, inv, n)), Some(x), Some(&k)) =
            (layers.get(name), rows.get(name), k_of.get(name))
        else {
            continue;
        };
        let Some(w) = fp
            .const_value(fp.node_inputs(id)[1])
            .and_then(|t| t.to_f32_vec().ok())
        else {
            continue;
        };
        let m = x.len() / k;
        let q = quantize_rows_here(x, m, k, inv.as_deref(), *act);
        let (mut err, mut norm) = (0f64, 0f64);
        for r in 0..m {
            let (s, z) = if q.scales.len() == 1 {
                (q.scales[0], q.zeros[0])
            } else {
                (q.scales[r], q.zeros[r])
            };
            for c in 0..*n {
                let (mut exact, mut acc) = (0f64, 0i64);
                for j in 0..k {
                    exact += x[r * k + j] as f64 * w[j * n + c] as f64;
                    acc += (q.data[r * k + j] as i64 - z as i64) * wq[j * n + c] as i64;
                }
                let wsc = if ws.len() == 1 { ws[0] } else { ws[c] };
                let approx = acc as f64 * s as f64 * wsc as f64;
                err += (approx - exact).powi(2);
                norm += exact.powi(2);
            }
        }
        out.push((name.clone(), (err / norm.max(f64::MIN_POSITIVE)).sqrt()));
    }
    out.sort_by(|a, b| b.1.total_cmp(&a.1));
    Ok(out)
}

/// What [`quantize_with_gate`] did.
#[derive(Clone, Debug)]
pub struct GateOutcome {
    /// Mean held-back cosine of the first INT8 model, before the gate kept anything.
    pub first_cosine: f64,
    /// Mean held-back cosine of the returned model.
    pub cosine: f64,
    /// Layers the gate kept in FP32, worst first, with their own error.
    pub kept: Vec<(String, f64)>,
}

/// [`quantize`], then, while the mean cosine of the INT8 to the FP32 outputs on `held_back` is
/// below `min_cosine`, keeps in FP32 the quantized layer with the largest own error
/// ([`layer_errors`]) and quantizes again. `reference` is `model` compiled (the FP32 side of the
/// comparison); the INT8 sessions get its options.
pub fn quantize_with_gate(
    model: &Model,
    reference: &Session,
    stats: Option<&CalibrationStats>,
    opts: &QuantizeOptions,
    held_back: &[CalibrationBatch],
    min_cosine: Option<f64>,
) -> Result<(Model, QuantizeReport, GateOutcome), Error> {
    let compile = reference.options().clone();
    let threads = compile.threads;
    let mut opts = opts.clone();
    let (mut q, mut report) = quantize(model, stats, &opts)?;
    let mut cos = mean_cosine(reference, &Session::new(&q, compile.clone())?, held_back)?;
    let first_cosine = cos;
    let mut kept = Vec::new();
    if let Some(floor) = min_cosine {
        if cos < floor {
            let (unfused, _) = run_quantize(model, stats, &opts)?;
            let ranked = layer_errors(model, &unfused, held_back, threads, 256)?;
            for (layer, err) in ranked {
                if cos >= floor {
                    break;
                }
                opts.keep_fp32.push(layer.clone());
                kept.push((layer, err));
                (q, report) = quantize(model, stats, &opts)?;
                cos = mean_cosine(reference, &Session::new(&q, compile.clone())?, held_back)?;
            }
        }
    }
    Ok((
        q,
        report,
        GateOutcome {
            first_cosine,
            cosine: cos,
            kept,
        },
    ))
}

/// SmoothQuant's alpha chosen per layer on calibration data (`--alpha auto`): for each candidate,
/// the layers are quantized and each one's own output error ([`layer_errors`]) is measured on
/// `batches`; each layer gets the candidate with the smallest error. Returns the per-layer map.
pub fn choose_alpha(
    model: &Model,
    stats: &CalibrationStats,
    opts: &QuantizeOptions,
    batches: &[CalibrationBatch],
    candidates: &[f32],
    threads: usize,
) -> Result<BTreeMap<String, f32>, Error> {
    // Per layer, its error under each candidate; layers that read one activation (Q, K, V)
    // share one smoothing factor, so they get the candidate with the smallest summed error.
    let mut errors: BTreeMap<String, Vec<(f32, f64)>> = BTreeMap::new();
    let mut groups: Vec<Vec<String>> = Vec::new();
    for &alpha in candidates {
        let o = QuantizeOptions {
            alpha,
            smooth: alpha > 0.0,
            alpha_per_layer: BTreeMap::new(),
            ..opts.clone()
        };
        let (unfused, _) = run_quantize(model, Some(stats), &o)?;
        if groups.is_empty() {
            groups = readers_of_one_activation(&unfused);
        }
        for (layer, err) in layer_errors(model, &unfused, batches, threads, 128)? {
            errors.entry(layer).or_default().push((alpha, err));
        }
    }
    let mut chosen = BTreeMap::new();
    let mut grouped = std::collections::BTreeSet::new();
    for group in &groups {
        let members: Vec<&Vec<(f32, f64)>> = group.iter().filter_map(|n| errors.get(n)).collect();
        let best = candidates
            .iter()
            .map(|&a| {
                let sum: f64 = members
                    .iter()
                    .filter_map(|e| e.iter().find(|(x, _)| *x == a).map(|(_, err)| err))
                    .sum();
                (a, sum)
            })
            .min_by(|x, y| x.1.total_cmp(&y.1));
        if let Some((a, _)) = best {
            for n in group.iter().filter(|n| errors.contains_key(*n)) {
                chosen.insert(n.clone(), a);
                grouped.insert(n.clone());
            }
        }
    }
    for (layer, errs) in &errors {
        if grouped.contains(layer) {
            continue;
        }
        if let Some(&(a, _)) = errs.iter().min_by(|x, y| x.1.total_cmp(&y.1)) {
            chosen.insert(layer.clone(), a);
        }
    }
    Ok(chosen)
}

/// The names of the quantized linears that read the same activation, for each activation read
/// by more than one (Q, K and V of an attention block).
fn readers_of_one_activation(g: &Graph) -> Vec<Vec<String>> {
    let qlinears = g
        .node_ids()
        .filter(|&id| matches!(g.node(id).op, Op::QLinear { .. }));
    passes::group_by_input(g, qlinears)
        .into_iter()
        .filter(|v| v.len() > 1)
        .map(|v| v.into_iter().map(|id| g.node(id).name.clone()).collect())
        .collect()
}

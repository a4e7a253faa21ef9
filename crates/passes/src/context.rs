//! What a pass receives besides the graph: options, calibration statistics as data, and a report
//! sink where passes say what they decided and why a rule declined to fire.

use std::collections::BTreeMap;

/// Per-input-channel statistics of the activations entering one linear layer, gathered by the
/// runtime over the real (unpadded) tokens of calibration text.
#[derive(Clone, Debug, PartialEq)]
pub struct ChannelStats {
    /// Smallest value seen in each channel.
    pub min: Vec<f32>,
    /// Largest value seen in each channel.
    pub max: Vec<f32>,
    /// Tokens (rows) counted.
    pub rows: u64,
}

impl ChannelStats {
    /// `max(|min|, |max|)` of each channel.
    pub fn absmax(&self) -> Vec<f32> {
        self.min
            .iter()
            .zip(&self.max)
            .map(|(a, b)| a.abs().max(b.abs()))
            .collect()
    }
}

/// Calibration statistics of a model: one [`ChannelStats`] per linear layer, keyed by the
/// layer's node name in the decluttered graph.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CalibrationStats {
    pub layers: BTreeMap<String, ChannelStats>,
}

/// How activations are quantized.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ActivationMode {
    /// Per token, from each row's own range at run time: batch-invariant.
    #[default]
    Dynamic,
    /// One scale and zero point per layer, from the calibration range.
    Static,
}

/// Options of the `quantize` pipeline.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantizeOptions {
    /// SmoothQuant migration strength in (0, 1] (1 = all into the weights); 0 leaves the layer
    /// unsmoothed.
    pub alpha: f32,
    /// Per-layer alpha overriding `alpha`, by node name.
    pub alpha_per_layer: BTreeMap<String, f32>,
    /// Whether to apply SmoothQuant at all.
    pub smooth: bool,
    /// Activation quantization.
    pub activations: ActivationMode,
    /// Linear layers left in FP32: a layer is kept when its node name contains one of these.
    pub keep_fp32: Vec<String>,
    /// The arithmetic of the attention products `q·kᵀ` and `p·v` (f32 unless asked for;
    /// [`QuantizeAttention`](crate::QuantizeAttention) applies it). `keep_fp32` names attention
    /// nodes too.
    pub attention: ir::AttnProducts,
}

impl Default for QuantizeOptions {
    fn default() -> Self {
        QuantizeOptions {
            alpha: 0.5,
            alpha_per_layer: BTreeMap::new(),
            smooth: true,
            activations: ActivationMode::Dynamic,
            keep_fp32: Vec::new(),
            attention: ir::AttnProducts::F32,
        }
    }
}

impl QuantizeOptions {
    /// The alpha of the layer called `name`.
    pub fn alpha_of(&self, name: &str) -> f32 {
        self.alpha_per_layer
            .get(name)
            .copied()
            .unwrap_or(self.alpha)
    }

    /// Whether the layer called `name` stays FP32.
    pub fn keeps_fp32(&self, name: &str) -> bool {
        self.keep_fp32
            .iter()
            .any(|k| !k.is_empty() && name.contains(k.as_str()))
    }
}

/// What a note records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoteKind {
    /// A rewrite that fired.
    Fired,
    /// A rule that matched its anchor but declined, with the reason.
    Declined,
}

/// One decision of a pass.
#[derive(Clone, Debug, PartialEq)]
pub struct Note {
    pub pass: &'static str,
    pub node: String,
    pub kind: NoteKind,
    pub message: String,
}

/// The decisions of a pipeline run, in order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    pub notes: Vec<Note>,
}

impl Report {
    pub fn fired(&mut self, pass: &'static str, node: &str, message: impl Into<String>) {
        self.push(pass, node, NoteKind::Fired, message.into());
    }

    pub fn declined(&mut self, pass: &'static str, node: &str, message: impl Into<String>) {
        self.push(pass, node, NoteKind::Declined, message.into());
    }

    fn push(&mut self, pass: &'static str, node: &str, kind: NoteKind, message: String) {
        let note = Note {
            pass,
            node: node.to_string(),
            kind,
            message,
        };
        // A rule re-examines the same anchor on every round of a fixpoint: say it once.
        if !self.notes.contains(&note) {
            self.notes.push(note);
        }
    }

    /// The notes of one kind.
    pub fn of_kind(&self, kind: NoteKind) -> impl Iterator<Item = &Note> {
        self.notes.iter().filter(move |n| n.kind == kind)
    }
}

/// Everything a pass may read or write besides the graph.
///
/// ```
/// let ctx = passes::PassContext::default();
/// assert!(ctx.stats.is_none() && ctx.report.notes.is_empty());
/// assert_eq!(ctx.quant.alpha, 0.5);
/// ```
#[derive(Clone, Debug, Default)]
pub struct PassContext<'a> {
    /// Options of the quantize pipeline.
    pub quant: QuantizeOptions,
    /// Calibration statistics, handed over as data by the runtime.
    pub stats: Option<&'a CalibrationStats>,
    /// Where passes record their decisions.
    pub report: Report,
}

//! `encore build-model`: BERT-family ONNX models with seeded random weights.

use std::path::PathBuf;

use clap::Args;
use runtime::model_builder::{write_model, LayerNormForm, ModelSpec, PRESETS};

use crate::error::CliError;

#[derive(Args, Clone)]
pub struct BuildModelArgs {
    /// The shape to start from: bert-base, distilbert-base, xlm-roberta-base, minilm-l6, … (see --help).
    #[arg(long, default_value = "bert-base")]
    pub preset: String,
    /// Where to write the model.
    #[arg(long)]
    pub out: PathBuf,
    /// 17: LayerNormalization op; 14: LayerNorm decomposed as torch exports it below opset 17.
    #[arg(long)]
    pub opset: Option<i64>,
    #[arg(long)]
    pub layers: Option<usize>,
    #[arg(long)]
    pub hidden: Option<usize>,
    #[arg(long)]
    pub heads: Option<usize>,
    #[arg(long)]
    pub ffn: Option<usize>,
    #[arg(long)]
    pub vocab: Option<usize>,
    #[arg(long)]
    pub max_positions: Option<usize>,
    /// Seed of the random weights.
    #[arg(long)]
    pub seed: Option<u64>,
}

impl BuildModelArgs {
    /// The preset with the overrides applied.
    pub fn spec(&self) -> Result<ModelSpec, CliError> {
        let mut spec = ModelSpec::preset(&self.preset).ok_or_else(|| {
            CliError::usage(
                "--preset",
                format!(
                    "unknown preset `{}`; known: {}",
                    self.preset,
                    PRESETS.join(", ")
                ),
            )
        })?;
        if let Some(o) = self.opset {
            spec.layer_norm = LayerNormForm::from_opset(o)
                .ok_or_else(|| CliError::usage("--opset", format!("{o} is not 14 or 17")))?;
        }
        let overrides = [
            (self.layers, &mut spec.layers),
            (self.hidden, &mut spec.hidden),
            (self.heads, &mut spec.heads),
            (self.ffn, &mut spec.ffn),
            (self.vocab, &mut spec.vocab),
            (self.max_positions, &mut spec.max_positions),
        ];
        for (value, field) in overrides {
            if let Some(v) = value {
                *field = v;
            }
        }
        if let Some(s) = self.seed {
            spec.seed = s;
        }
        spec.validate()?;
        Ok(spec)
    }
}

pub fn run(args: BuildModelArgs) -> Result<(), CliError> {
    let spec = args.spec()?;
    write_model(&spec, &args.out)?;
    println!(
        "wrote {} ({}, {} layers, hidden {}, {} heads, FFN {}, vocab {}, {} parameters, opset {})",
        args.out.display(),
        spec.arch.name(),
        spec.layers,
        spec.hidden,
        spec.heads,
        spec.ffn,
        spec.vocab,
        spec.param_count(),
        spec.layer_norm.opset()
    );
    Ok(())
}

//! The pass manager: named pipelines run to a fixpoint, with verification and dumps.

use ir::Graph;

use crate::{
    ConstantFolding, DeadCodeElimination, Pass, PassContext, PassError, RecognizeAttention,
    RecognizeGelu, RecognizeLayerNorm, RecognizeLinear, ShapeInference,
};

/// Which dumps to take: the name `import` stands for the graph before any pass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum DumpSpec {
    #[default]
    None,
    All,
    Named(Vec<String>),
}

impl DumpSpec {
    /// Parses the CLI form: `all`, `none`, or a comma-separated list of pass names.
    ///
    /// ```
    /// use passes::DumpSpec;
    /// assert_eq!(DumpSpec::parse("all"), DumpSpec::All);
    /// assert_eq!(DumpSpec::parse("import,RecognizeGelu"),
    ///            DumpSpec::Named(vec!["import".into(), "RecognizeGelu".into()]));
    /// ```
    pub fn parse(s: &str) -> DumpSpec {
        match s.trim() {
            "all" => DumpSpec::All,
            "" | "none" => DumpSpec::None,
            list => DumpSpec::Named(list.split(',').map(|x| x.trim().to_string()).collect()),
        }
    }

    pub fn wants(&self, name: &str) -> bool {
        match self {
            DumpSpec::None => false,
            DumpSpec::All => true,
            DumpSpec::Named(v) => v.iter().any(|n| n == name),
        }
    }
}

/// Receives `(pass name, graph text)` for each dump taken.
pub type DumpFn<'a> = &'a mut dyn FnMut(&str, &str);

/// How to run a pipeline: where to stop and what to dump.
#[derive(Default)]
pub struct RunOptions<'a> {
    /// Stop right after the first run of this pass (or after the import, for `import`).
    pub stop_after: Option<String>,
    /// The dumps to take.
    pub dump_after: DumpSpec,
    /// Receives `(pass name, graph text)` for each dump taken.
    pub dump: Option<DumpFn<'a>>,
    /// Options, calibration statistics and the report of decisions, shared by the passes.
    pub context: PassContext<'a>,
}

/// One run of one pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PassRun {
    pub pass: &'static str,
    pub iteration: usize,
    pub changed: bool,
}

/// What a pipeline run did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunReport {
    pub runs: Vec<PassRun>,
    /// Whether the run ended early because of `stop_after`.
    pub stopped: bool,
}

/// A named list of passes, run in order, repeatedly, until one whole round changes nothing.
///
/// ```
/// let p = passes::Pipeline::declutter();
/// assert_eq!(p.name(), "declutter");
/// assert_eq!(p.pass_names()[0], "ShapeInference");
/// ```
pub struct Pipeline {
    name: &'static str,
    passes: Vec<Box<dyn Pass>>,
    max_iterations: usize,
}

impl Pipeline {
    /// A pipeline over the given passes.
    pub fn new(name: &'static str, passes: Vec<Box<dyn Pass>>) -> Pipeline {
        Pipeline {
            name,
            passes,
            max_iterations: 8,
        }
    }

    /// Canonicalises an imported graph: types, folded shape arithmetic, no dead code, and the
    /// recognised ops `Linear`, `LayerNorm`, `Gelu`, `Attention`.
    pub fn declutter() -> Pipeline {
        Pipeline::new(
            "declutter",
            vec![
                Box::new(ShapeInference),
                Box::new(ConstantFolding),
                Box::new(DeadCodeElimination),
                Box::new(RecognizeLinear),
                Box::new(RecognizeLayerNorm),
                Box::new(RecognizeGelu),
                Box::new(RecognizeAttention),
            ],
        )
    }

    /// Turns FP32 linears into integer ones: [`SmoothQuant`](crate::SmoothQuant) with the
    /// calibration statistics of the context, then [`QuantizeLinears`](crate::QuantizeLinears).
    /// Runs on a decluttered graph.
    pub fn quantize() -> Pipeline {
        Pipeline::new(
            "quantize",
            vec![
                Box::new(crate::SmoothQuant),
                Box::new(crate::QuantizeLinears),
                Box::new(crate::QuantizeAttention),
                Box::new(DeadCodeElimination),
            ],
        )
    }

    /// Folds the quantized ONNX dialects onto integer GEMMs ([`FoldQdq`](crate::FoldQdq)) and
    /// grows GEMM epilogues ([`FuseEpilogue`](crate::FuseEpilogue)); what the runtime executes.
    pub fn fuse() -> Pipeline {
        Pipeline::new(
            "fuse",
            vec![
                Box::new(crate::FoldQdq),
                Box::new(crate::FuseEpilogue),
                Box::new(DeadCodeElimination),
            ],
        )
    }

    /// Runs the token-wise part of an encoder on the real tokens of the batch only
    /// ([`PackTokens`](crate::PackTokens)). Runs on a fused graph; what a session executes
    /// unless padding-free execution is turned off.
    pub fn pack() -> Pipeline {
        Pipeline::new(
            "pack",
            vec![Box::new(crate::PackTokens), Box::new(DeadCodeElimination)],
        )
    }

    /// The pipeline called `name`, if there is one: `declutter`, `quantize`, `fuse`, `pack`.
    pub fn by_name(name: &str) -> Option<Pipeline> {
        match name {
            "declutter" => Some(Pipeline::declutter()),
            "quantize" => Some(Pipeline::quantize()),
            "fuse" => Some(Pipeline::fuse()),
            "pack" => Some(Pipeline::pack()),
            _ => None,
        }
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn pass_names(&self) -> Vec<&'static str> {
        self.passes.iter().map(|p| p.name()).collect()
    }

    /// Runs the pipeline on `graph`: to a fixpoint, or until `opts.stop_after`. The graph is
    /// verified after every pass. Pass names in `stop_after` and `dump_after` must be `import`
    /// or passes of this pipeline. Dumps: `import` before the first pass; each pass after its
    /// runs of the first round, and after later runs that changed the graph.
    pub fn run(
        &self,
        graph: &mut Graph,
        opts: &mut RunOptions<'_>,
    ) -> Result<RunReport, PassError> {
        let mut named: Vec<&String> = opts.stop_after.iter().collect();
        if let DumpSpec::Named(v) = &opts.dump_after {
            named.extend(v);
        }
        for name in named {
            if name != "import" && !self.passes.iter().any(|p| p.name() == name) {
                return Err(PassError::UnknownPass {
                    pipeline: self.name,
                    name: name.clone(),
                    known: format!("import, {}", self.pass_names().join(", ")),
                });
            }
        }
        let mut report = RunReport::default();
        dump(graph, "import", opts)?;
        if opts.stop_after.as_deref() == Some("import") {
            report.stopped = true;
            return Ok(report);
        }
        for iteration in 0..self.max_iterations {
            let mut any = false;
            for pass in &self.passes {
                let name = pass.name();
                let changed = pass.run(graph, &mut opts.context)?;
                graph
                    .verify()
                    .map_err(|source| PassError::Verify { pass: name, source })?;
                report.runs.push(PassRun {
                    pass: name,
                    iteration,
                    changed,
                });
                any |= changed;
                if iteration == 0 || changed {
                    dump(graph, name, opts)?;
                }
                if iteration == 0 && opts.stop_after.as_deref() == Some(name) {
                    report.stopped = true;
                    return Ok(report);
                }
            }
            if !any {
                return Ok(report);
            }
        }
        Err(PassError::NoFixpoint {
            pipeline: self.name,
            iterations: self.max_iterations,
        })
    }
}

fn dump(graph: &Graph, pass: &'static str, opts: &mut RunOptions<'_>) -> Result<(), PassError> {
    if !opts.dump_after.wants(pass) {
        return Ok(());
    }
    if let Some(cb) = opts.dump.as_mut() {
        let text = ir::text::print(graph).map_err(|source| PassError::Graph { pass, source })?;
        cb(pass, &text);
    }
    Ok(())
}

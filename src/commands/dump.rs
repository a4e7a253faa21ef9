//! `encore dump`: the IR after import and after each pass.

use std::path::PathBuf;

use clap::Args;
use passes::{DumpSpec, Pipeline, RunOptions};

use crate::error::CliError;

#[derive(Args)]
pub struct DumpArgs {
    /// The ONNX model.
    #[arg(long)]
    model: PathBuf,
    /// Dump after these passes: `all`, `import`, `lower` (the lowered program a session
    /// executes: packed weights, planned buffers, steps with their kernels and thread splits), or
    /// a comma-separated list of pass names. Without it, only the final graph is printed.
    #[arg(long)]
    after: Option<String>,
    /// Stop after this pass (or `import`), printing the graph as it is then.
    #[arg(long)]
    stop_after: Option<String>,
    /// The pipelines to run, in order (comma-separated): `declutter`, `quantize`, `fuse`,
    /// `pack`. The default is what a session compiles.
    #[arg(long, default_value = "declutter,fuse,pack")]
    pipeline: String,
    /// Also print why fusion and quantization rules declined to fire, and what fired.
    #[arg(long)]
    explain: bool,
    /// Threads the lowered program is planned for (`--after lower`); default: the available
    /// cores, as a session.
    #[arg(long)]
    threads: Option<usize>,
    /// Lower without compiling the int8 loop nests (`--after lower`).
    #[arg(long)]
    no_jit: bool,
}

pub fn run(args: DumpArgs) -> Result<(), CliError> {
    let mut graph = runtime::Model::load(&args.model)?.into_graph();
    let mut pipelines = Vec::new();
    for name in args.pipeline.split(',').map(str::trim) {
        pipelines.push(Pipeline::by_name(name).ok_or_else(|| {
            CliError::usage(
                "--pipeline",
                format!("no pipeline named `{name}` (declutter, quantize, fuse, pack)"),
            )
        })?);
    }
    let dump_after = args.after.as_deref().map(DumpSpec::parse);
    let show_lowered = match &dump_after {
        Some(DumpSpec::All) => args.stop_after.is_none(),
        Some(DumpSpec::Named(v)) => v.iter().any(|n| n == "lower"),
        _ => false,
    };
    let mut print_dump = |pass: &str, text: &str| {
        println!("// after {pass}");
        print!("{text}");
    };
    let mut last = "import";
    let mut notes = Vec::new();
    for pipeline in &pipelines {
        // Pass names given to --after / --stop-after belong to one of the pipelines.
        let mine = |n: &String| n == "import" || pipeline.pass_names().contains(&n.as_str());
        let stop_after = args.stop_after.clone().filter(mine);
        let after = match &dump_after {
            Some(DumpSpec::Named(v)) => DumpSpec::Named(
                v.iter()
                    .filter(|n| mine(n) && (*n != "import" || last == "import"))
                    .cloned()
                    .collect(),
            ),
            Some(DumpSpec::All) if last != "import" => DumpSpec::Named(
                pipeline
                    .pass_names()
                    .iter()
                    .map(|s| s.to_string())
                    .collect(),
            ),
            Some(d) => d.clone(),
            None => DumpSpec::None,
        };
        let mut opts = RunOptions {
            stop_after,
            dump_after: after,
            dump: Some(&mut print_dump),
            context: Default::default(),
        };
        let report = pipeline.run(&mut graph, &mut opts)?;
        notes.extend(opts.context.report.notes);
        last = pipeline.name();
        if report.stopped {
            last = args.stop_after.as_deref().unwrap_or(last);
            break;
        }
    }
    if let Some(stop) = &args.stop_after {
        let known = stop == "import"
            || pipelines
                .iter()
                .any(|p| p.pass_names().contains(&stop.as_str()));
        if !known {
            return Err(CliError::usage(
                "--stop-after",
                format!("no pass named `{stop}` in {}", args.pipeline),
            ));
        }
    }
    if dump_after.is_none() {
        println!("// after {last}");
        print!("{}", ir::text::print(&graph)?);
    }
    if show_lowered {
        let options = super::compile_options(args.threads);
        let program = codegen::lower::lower(
            &graph,
            codegen::lower::LowerOptions {
                threads: options.threads,
                kernel: options.kernel,
                jit: options.jit && !args.no_jit,
            },
        )
        .map_err(runtime::Error::from)?;
        println!("// after lower");
        print!("{}", program.to_text());
    }
    if args.explain {
        for n in &notes {
            let kind = match n.kind {
                passes::NoteKind::Fired => "fired",
                passes::NoteKind::Declined => "declined",
            };
            println!("// {kind} {}: {}: {}", n.pass, n.node, n.message);
        }
    }
    Ok(())
}

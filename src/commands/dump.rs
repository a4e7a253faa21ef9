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
    /// Dump after these passes: `all`, `import`, or a comma-separated list of pass names.
    /// Without it, only the final graph is printed.
    #[arg(long)]
    after: Option<String>,
    /// Stop after this pass (or `import`), printing the graph as it is then.
    #[arg(long)]
    stop_after: Option<String>,
    /// The pipeline to run.
    #[arg(long, default_value = "declutter")]
    pipeline: String,
}

pub fn run(args: DumpArgs) -> Result<(), CliError> {
    let mut graph = frontend_onnx::import_path(&args.model)?;
    let pipeline = Pipeline::by_name(&args.pipeline).ok_or_else(|| {
        CliError::usage(
            "--pipeline",
            format!("no pipeline named `{}`", args.pipeline),
        )
    })?;
    let dump_after = args.after.as_deref().map(DumpSpec::parse);
    let mut print_dump = |pass: &str, text: &str| {
        println!("// after {pass}");
        print!("{text}");
    };
    let mut opts = RunOptions {
        stop_after: args.stop_after.clone(),
        dump_after: dump_after.clone().unwrap_or_default(),
        dump: Some(&mut print_dump),
    };
    pipeline.run(&mut graph, &mut opts)?;
    if dump_after.is_none() {
        println!(
            "// after {}",
            args.stop_after.as_deref().unwrap_or(pipeline.name())
        );
        print!("{}", ir::text::print(&graph)?);
    }
    Ok(())
}

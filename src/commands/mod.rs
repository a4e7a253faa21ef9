//! One module per subcommand.

pub mod bench;
pub mod build_model;
pub mod demo;
pub mod dump;
pub mod embed;
pub mod eval;
pub mod hwbench;
pub mod quantize;
pub mod run;
pub mod serve;
pub mod texts;

/// Compile options for `--threads N` (every core when absent; at least 1).
pub fn compile_options(threads: Option<usize>) -> runtime::CompileOptions {
    let default = runtime::CompileOptions::default();
    runtime::CompileOptions {
        threads: threads.unwrap_or(default.threads).max(1),
        ..default
    }
}

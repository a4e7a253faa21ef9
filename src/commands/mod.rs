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
pub mod texts;

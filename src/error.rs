//! Errors of the command line.

use std::path::PathBuf;

/// What a subcommand can fail with. Library errors keep their own types and messages.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Runtime(#[from] runtime::Error),
    #[error(transparent)]
    Import(#[from] frontend_onnx::ImportError),
    #[error(transparent)]
    Pass(#[from] passes::PassError),
    #[error(transparent)]
    Ir(#[from] ir::IrError),
    #[error(transparent)]
    Build(#[from] runtime::model_builder::BuildError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("bad argument {arg}: {message}")]
    Usage { arg: String, message: String },
}

impl CliError {
    pub fn usage(arg: &str, message: impl Into<String>) -> CliError {
        CliError::Usage {
            arg: arg.to_string(),
            message: message.into(),
        }
    }
}

//! encore's public API: import an ONNX model, compile it, run it.
//!
//! ```no_run
//! use runtime::{CompileOptions, Model, Session, TensorValue};
//! let model = Model::load("model.onnx")?;
//! let session = Session::new(&model, CompileOptions::default())?;
//! let ids = TensorValue::from_i64(vec![1, 3], vec![101, 7592, 102])?;
//! let mask = TensorValue::from_i64(vec![1, 3], vec![1, 1, 1])?;
//! let types = TensorValue::from_i64(vec![1, 3], vec![0, 0, 0])?;
//! let out = session.run(&[("input_ids", ids), ("attention_mask", mask), ("token_type_ids", types)])?;
//! println!("{}: {:?}", out[0].0, out[0].1.shape());
//! # Ok::<(), runtime::Error>(())
//! ```

mod compiled;
mod error;
pub mod eval;
mod exec;
mod gemm;
mod model;
pub mod model_builder;
mod npy;
pub mod quantize;
mod session;
pub mod text;
mod value;

pub use error::Error;
pub use ir::DType;
pub use model::{IoSpec, Model};
pub use session::{CompileOptions, LinearObserver, NodeTime, Outputs, Session};
pub use value::{TensorData, TensorValue, ValueElement};

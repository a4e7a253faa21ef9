//! encore's public API: import an ONNX model, compile it, run it.
//!
//! - [`Model::load`] opens an ONNX file or a compiled `.encore` file (weights memory-mapped);
//! - [`quantize::quantize`] (after [`quantize::calibrate`]) makes the INT8 model, and
//!   [`Model::save`] writes it as one `.encore` file;
//! - [`Session::builder`] (or [`Session::new`] with [`CompileOptions`]) compiles a model;
//! - [`Session::run`] takes `&self`: a `Session` is `Send + Sync`, and many threads may run one
//!   session at once, each getting what it would get alone, bit for bit;
//! - [`text`] tokenizes and pools sentence embeddings; `examples/semantic_search.rs` puts it all
//!   together.
//!
//! ```no_run
//! use runtime::{Model, Session, TensorValue};
//! let model = Model::load("model.onnx")?;
//! let session = Session::builder(&model).threads(2).build()?;
//! let ids = TensorValue::from_i64(vec![1, 3], vec![101, 7592, 102])?;
//! let mask = TensorValue::from_i64(vec![1, 3], vec![1, 1, 1])?;
//! let types = TensorValue::from_i64(vec![1, 3], vec![0, 0, 0])?;
//! let out = session.run(&[("input_ids", ids), ("attention_mask", mask), ("token_type_ids", types)])?;
//! println!("{}: {:?}", out[0].0, out[0].1.shape());
//! # Ok::<(), runtime::Error>(())
//! ```

mod alloc;
mod builder;
mod compiled;
mod error;
pub mod eval;
mod exec;
mod gemm;
mod model;
pub mod model_builder;
mod npy;
mod pages;
pub mod quantize;
mod session;
pub mod text;
mod value;

pub use alloc::CacheAligned;
pub use builder::SessionBuilder;
/// The int8 microkernel families (and, through [`Kernel::f32_counterpart`], the f32 ones), for
/// [`SessionBuilder::kernel`].
pub use codegen::kernels::Int8Kernel as Kernel;
pub use error::Error;
pub use ir::DType;
pub use model::{IoSpec, Model};
pub use session::{
    CompileOptions, LinearObserver, NodeTime, Outputs, Session, DEFAULT_BATCH_TOKENS,
};
pub use value::{TensorData, TensorValue, ValueElement};

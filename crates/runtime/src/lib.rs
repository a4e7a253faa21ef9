//! encore's public API: import an ONNX model, compile it, run it.

pub mod model_builder;

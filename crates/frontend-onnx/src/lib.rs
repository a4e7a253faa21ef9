//! ONNX import into the encore IR.

pub mod proto;

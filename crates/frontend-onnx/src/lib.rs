//! ONNX import.

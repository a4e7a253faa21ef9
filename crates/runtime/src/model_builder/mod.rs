//! Writes BERT-family ONNX models with seeded random weights.

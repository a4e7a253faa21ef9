//! Code generation: the hand-written microkernels (int8 and f32), weight packing, the epilogue
//! program, kernel selection, and lowering of an IR graph to an executable program.
//!
//! The `kernels` module depends on nothing else in the workspace, so it can be reused and tested on
//! its own. This crate is internal: its API is not stable; `runtime` is the public surface.

pub mod jit;
pub mod kernels;
pub mod lower;

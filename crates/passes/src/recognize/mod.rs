//! Recognition of the ops that exports decompose: `Linear`, `LayerNorm`, `Gelu`, `Attention`.
//! Each is its own pass, made of rules (see [`crate::rewrite`]).

mod attention;
mod gelu;
mod layer_norm;
mod linear;

pub use attention::RecognizeAttention;
pub use gelu::RecognizeGelu;
pub use layer_norm::RecognizeLayerNorm;
pub use linear::RecognizeLinear;

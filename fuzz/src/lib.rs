//! Fuzz targets of encore (AFL++ through afl.rs): see `fuzz/README.md`.

mod targets;
pub use targets::*;

//! The kernel layer: hand-written GEMM microkernels (f32 and int8), weight packing, the fused
//! epilogue program, the thread pool, kernel selection and the roofline tools.
//!
//! Module map (data path order):
//! * [`select`]: CPU features, cache sizes, `ENCORE_KERNEL` / `ENCORE_CACHE`, the pickers.
//! * [`f32`]: FP32 GEMM (AVX-512, AVX2, scalar) with [`PackedF32`] weights.
//! * [`epilogue`]: the micro-op program run on each finished output block; [`math`]: its GELU/exp.
//! * [`pool`]: persistent workers, weight-stationary partition.
//! * [`buf`]: aligned buffers.

pub mod buf;
pub mod epilogue;
pub mod error;
pub mod f32;
pub mod hwbench;
pub mod int8;
pub mod math;
pub mod peak;
pub mod pool;
pub mod select;

pub use buf::AlignedBuf;
pub use epilogue::{Epilogue, EpilogueF32, EpilogueOp, Output, QType, RowParam};
pub use error::KernelError;
pub use f32::{gemm_f32, gemm_f32_unpacked, PackedF32};
pub use hwbench::{hwbench, KernelBenchResult};
pub use peak::{measure_peak, Peak};
pub use select::{
    cache_sizes, cpu_features, parse_cache_override, pick_f32, pick_int8, CacheSizes, CpuFeatures,
    F32Kernel, Int8Kernel,
};

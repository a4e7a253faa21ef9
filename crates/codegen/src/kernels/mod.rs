//! The kernel layer: hand-written GEMM microkernels (f32 and int8), weight packing, the fused
//! epilogue program, the thread pool, kernel selection and the roofline tools.
//!
//! What the runtime calls:
//! * f32: [`PackedF32::pack`] once per weight, then [`gemm_f32`] with an [`EpilogueF32`]
//!   (`none`, `bias`, `bias_gelu`, `bias_residual`, or any [`EpilogueOp`] list); for
//!   activation × activation products (attention) [`gemm_f32_unpacked`].
//! * int8: [`int8::PackedI8::pack`] once per weight (s8, with column sums), then
//!   [`int8::gemm_i8`] with u8 or s8 [`int8::Activations`], an [`Output`] (f32, bf16, u8, s8,
//!   i32) and an [`Epilogue`] starting with [`EpilogueOp::Dequant`].
//! * tools: [`hwbench()`], [`measure_peak`], [`cpu_features`], [`cache_sizes`], [`pick_int8`].
//!
//! Module map (data path order):
//! * [`select`]: CPU features, cache sizes, `ENCORE_KERNEL` / `ENCORE_CACHE`, the pickers.
//! * [`f32`](mod@f32): FP32 GEMM (AVX-512 8×48, AVX2 6×16, scalar 4×16), B prepacked, A packed per block.
//! * [`int8`]: u8×s8→i32 GEMM: [`int8::pack`] (K-quad interleave + column sums),
//!   [`int8::scalar`], [`int8::avx2`], [`int8::avxvnni`], [`int8::avx512vnni`], [`int8::amx`]
//!   over [`int8::tile_model`].
//! * [`epilogue`]: the `#[repr(C)]` micro-op program run on each finished output block;
//!   [`math`]: its exp / GELU / bf16 conversions.
//! * [`pool`]: persistent workers, weight-stationary partition.
//! * [`peak`], [`hwbench`](mod@hwbench): measured roofline and per-kernel timing.
//! * [`buf`]: 64-byte aligned buffers, packed weights on [`hugepages`] (`ENCORE_HUGE_PAGES=0`
//!   turns them off); [`error`]: [`KernelError`].

pub mod buf;
pub mod epilogue;
#[cfg(target_arch = "x86_64")]
pub mod epilogue_chain;
pub mod error;
pub mod f32;
pub mod hugepages;
pub mod hwbench;
pub mod int8;
pub mod math;
pub mod peak;
pub mod pool;
pub mod rowquant;
pub mod select;

pub use buf::{AlignedBuf, SharedPtr};
pub use epilogue::{
    head_slot, Epilogue, EpilogueF32, EpilogueOp, EpilogueOps, ForkOut, HeadSlot, HeadsOut, Output,
    QType, RowParam, RowParamsOut,
};
pub use error::KernelError;
pub use f32::{gemm_f32, gemm_f32_unpacked, plan_split_f32, PackedF32};
pub use hwbench::{hwbench, KernelBenchResult};
pub use int8::{gemm_i8, plan_split_i8, Activations, PackedI8};
pub use peak::{measure_peak, Peak};
pub use pool::GemmSplit;
pub use select::{
    cache_sizes, cpu_features, parse_cache_override, pick_f32, pick_int8, with_cache_sizes,
    CacheSizes, CpuFeatures, F32Kernel, Int8Kernel,
};

//! Errors of the kernel layer.

/// Everything that can go wrong when choosing or calling a kernel.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum KernelError {
    /// `ENCORE_KERNEL` or a caller named a kernel that does not exist.
    #[error("unknown kernel `{0}` (expected scalar|avx2|avxvnni|avx512vnni|amx)")]
    UnknownKernel(String),
    /// The kernel needs instructions this CPU (or OS) does not provide.
    #[error("kernel `{0}` is not supported on this CPU")]
    Unsupported(&'static str),
    /// Linux refused the AMX tile-data permission request.
    #[error("arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) failed with errno {0}")]
    AmxPermission(i32),
    /// A slice is too short or a dimension does not match.
    #[error("bad GEMM arguments: {0}")]
    BadArgs(String),
    /// The epilogue program does not fit the output type or the problem.
    #[error("bad epilogue program: {0}")]
    BadEpilogue(String),
    /// `ENCORE_CACHE` could not be parsed.
    #[error(
        "cannot parse ENCORE_CACHE=`{0}` (expected \"L1,L2\" in bytes, K or M suffix allowed)"
    )]
    BadCacheOverride(String),
}

//! Runtime CPU feature detection, cache sizes and the kernel picker.
//!
//! * `ENCORE_KERNEL=scalar|avx2|avxvnni|avx512vnni|amx` forces the int8 kernel (and the f32 kernel
//!   of the same ISA level: `scalar`→scalar, `avx2`/`avxvnni`→AVX2, `avx512vnni`/`amx`→AVX-512).
//!   Forcing a kernel the CPU lacks is reported as [`KernelError::Unsupported`] by
//!   [`forced_int8_kernel`]; the pickers then fall back to automatic choice with a warning.
//! * `ENCORE_CACHE="L1,L2"` (bytes, `K`/`M` suffixes allowed) overrides the per-core data cache
//!   sizes read from sysfs (or CPUID leaf 0x8000_001D / 4 when sysfs is absent).

use super::error::KernelError;
use std::sync::OnceLock;

/// The instruction-set extensions the kernels care about, detected once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuFeatures {
    /// AVX2 and FMA3.
    pub avx2_fma: bool,
    /// AVX-512 F, BW, VL (what the f32 and int8 AVX-512 kernels need besides VNNI).
    pub avx512: bool,
    /// AVX512_VNNI (512-bit `vpdpbusd`).
    pub avx512vnni: bool,
    /// AVX-VNNI (VEX-encoded 256-bit `vpdpbusd`).
    pub avxvnni: bool,
    /// AMX-TILE and AMX-INT8 reported by CPUID (OS permission is requested separately).
    pub amx_int8: bool,
}

/// Detects the CPU's features (memoised).
///
/// ```
/// let f = codegen::kernels::cpu_features();
/// if f.avx512vnni { assert!(f.avx512); }
/// ```
pub fn cpu_features() -> CpuFeatures {
    static F: OnceLock<CpuFeatures> = OnceLock::new();
    *F.get_or_init(detect)
}

#[cfg(target_arch = "x86_64")]
fn detect() -> CpuFeatures {
    let avx2_fma = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
    let avx512 = is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl");
    CpuFeatures {
        avx2_fma,
        avx512: avx512 && avx2_fma,
        avx512vnni: avx512 && avx2_fma && is_x86_feature_detected!("avx512vnni"),
        avxvnni: avx2_fma && is_x86_feature_detected!("avxvnni"),
        amx_int8: super::int8::amx::cpuid_has_amx_int8(),
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> CpuFeatures {
    CpuFeatures::default()
}

/// The int8 (u8 × s8 → i32) microkernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Int8Kernel {
    /// Portable reference; the oracle of every test.
    Scalar,
    /// AVX2 `vpmaddwd` on operands widened to i16, exact (no `vpmaddubsw` saturation).
    Avx2,
    /// AVX-VNNI 256-bit `vpdpbusd`.
    AvxVnni,
    /// AVX512-VNNI 512-bit `vpdpbusd`.
    Avx512Vnni,
    /// AMX `tdpbusd` on 16×64-byte tiles.
    Amx,
}

impl Int8Kernel {
    /// Every int8 kernel, in increasing preference.
    pub const ALL: [Int8Kernel; 5] = [
        Self::Scalar,
        Self::Avx2,
        Self::AvxVnni,
        Self::Avx512Vnni,
        Self::Amx,
    ];

    /// The name used by `ENCORE_KERNEL` and `hwbench`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Scalar => "scalar",
            Self::Avx2 => "avx2",
            Self::AvxVnni => "avxvnni",
            Self::Avx512Vnni => "avx512vnni",
            Self::Amx => "amx",
        }
    }

    /// Parses a kernel name.
    ///
    /// ```
    /// use codegen::kernels::Int8Kernel;
    /// assert_eq!(Int8Kernel::parse("avx512vnni"), Ok(Int8Kernel::Avx512Vnni));
    /// assert!(Int8Kernel::parse("sse").is_err());
    /// ```
    pub fn parse(s: &str) -> Result<Self, KernelError> {
        Self::ALL
            .into_iter()
            .find(|k| k.name() == s.trim().to_ascii_lowercase())
            .ok_or_else(|| KernelError::UnknownKernel(s.to_string()))
    }

    /// Whether this CPU (and, for AMX, the OS) can run the kernel.
    pub fn is_supported(self) -> bool {
        let f = cpu_features();
        match self {
            Self::Scalar => true,
            Self::Avx2 => f.avx2_fma,
            Self::AvxVnni => f.avxvnni,
            Self::Avx512Vnni => f.avx512vnni,
            Self::Amx => f.amx_int8 && super::int8::amx::request_amx_permission().is_ok(),
        }
    }

    /// The f32 kernel of the same ISA level.
    pub fn f32_counterpart(self) -> F32Kernel {
        match self {
            Self::Scalar => F32Kernel::Scalar,
            Self::Avx2 | Self::AvxVnni => F32Kernel::Avx2,
            Self::Avx512Vnni | Self::Amx => F32Kernel::Avx512,
        }
    }
}

/// The f32 microkernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum F32Kernel {
    /// Portable reference.
    Scalar,
    /// AVX2 + FMA3, 6×16 register block.
    Avx2,
    /// AVX-512F, 8×48 register block.
    Avx512,
}

impl F32Kernel {
    /// Every f32 kernel.
    pub const ALL: [F32Kernel; 3] = [Self::Scalar, Self::Avx2, Self::Avx512];

    /// Short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Scalar => "f32-scalar",
            Self::Avx2 => "f32-avx2",
            Self::Avx512 => "f32-avx512",
        }
    }

    /// Whether this CPU can run the kernel.
    pub fn is_supported(self) -> bool {
        let f = cpu_features();
        match self {
            Self::Scalar => true,
            Self::Avx2 => f.avx2_fma,
            Self::Avx512 => f.avx512,
        }
    }
}

/// The kernel named by `ENCORE_KERNEL`, if set. Errors if the name is unknown or the CPU lacks it.
pub fn forced_int8_kernel() -> Option<Result<Int8Kernel, KernelError>> {
    let v = std::env::var("ENCORE_KERNEL").ok()?;
    Some(Int8Kernel::parse(&v).and_then(|k| {
        if k.is_supported() {
            Ok(k)
        } else {
            Err(KernelError::Unsupported(k.name()))
        }
    }))
}

fn forced_or_warn() -> Option<Int8Kernel> {
    match forced_int8_kernel()? {
        Ok(k) => Some(k),
        Err(e) => {
            static WARNED: OnceLock<()> = OnceLock::new();
            WARNED.get_or_init(|| eprintln!("encore: ignoring ENCORE_KERNEL: {e}"));
            None
        }
    }
}

/// Picks the int8 kernel for an `m × n × k` problem (`m` may be a typical value when dynamic).
///
/// Order: `ENCORE_KERNEL` if valid; AMX when `m ≥ 32` and `k ≥ 64` (its 32×32 tile block would
/// waste most of the work on smaller problems); then AVX512-VNNI, AVX-VNNI, AVX2, scalar.
///
/// ```
/// let k = codegen::kernels::pick_int8(1024, 768, 768);
/// assert!(k.is_supported());
/// ```
pub fn pick_int8(m: usize, _n: usize, k: usize) -> Int8Kernel {
    if let Some(k) = forced_or_warn() {
        return k;
    }
    let f = cpu_features();
    if f.amx_int8 && m >= 32 && k >= 64 && Int8Kernel::Amx.is_supported() {
        Int8Kernel::Amx
    } else if f.avx512vnni {
        Int8Kernel::Avx512Vnni
    } else if f.avxvnni {
        Int8Kernel::AvxVnni
    } else if f.avx2_fma {
        Int8Kernel::Avx2
    } else {
        Int8Kernel::Scalar
    }
}

/// Picks the f32 kernel (honours `ENCORE_KERNEL` through [`Int8Kernel::f32_counterpart`]).
pub fn pick_f32() -> F32Kernel {
    if let Some(k) = forced_or_warn() {
        return k.f32_counterpart();
    }
    let f = cpu_features();
    if f.avx512 {
        F32Kernel::Avx512
    } else if f.avx2_fma {
        F32Kernel::Avx2
    } else {
        F32Kernel::Scalar
    }
}

/// Per-core data cache sizes in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheSizes {
    /// L1 data cache.
    pub l1d: usize,
    /// L2 (unified, per core).
    pub l2: usize,
}

impl Default for CacheSizes {
    fn default() -> Self {
        Self {
            l1d: 32 << 10,
            l2: 1 << 20,
        }
    }
}

/// Parses a size like `32768`, `48K` or `2M`.
fn parse_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, mul) = match s.chars().last()? {
        'k' | 'K' => (&s[..s.len() - 1], 1 << 10),
        'm' | 'M' => (&s[..s.len() - 1], 1 << 20),
        _ => (s, 1),
    };
    num.trim()
        .parse::<usize>()
        .ok()
        .map(|v| v * mul)
        .filter(|&v| v > 0)
}

/// Parses an `ENCORE_CACHE` value `"L1,L2"`.
///
/// ```
/// use codegen::kernels::{parse_cache_override, CacheSizes};
/// assert_eq!(parse_cache_override("48K,1M"), Ok(CacheSizes { l1d: 48 << 10, l2: 1 << 20 }));
/// assert!(parse_cache_override("48K").is_err());
/// ```
pub fn parse_cache_override(s: &str) -> Result<CacheSizes, KernelError> {
    let bad = || KernelError::BadCacheOverride(s.to_string());
    let mut it = s.split(',');
    let l1d = parse_size(it.next().ok_or_else(bad)?).ok_or_else(bad)?;
    let l2 = parse_size(it.next().ok_or_else(bad)?).ok_or_else(bad)?;
    if it.next().is_some() {
        return Err(bad());
    }
    Ok(CacheSizes { l1d, l2 })
}

fn read_sysfs() -> Option<CacheSizes> {
    let mut l1d = None;
    let mut l2 = None;
    for i in 0..8 {
        let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{i}");
        let Ok(level) = std::fs::read_to_string(format!("{dir}/level")) else {
            break;
        };
        let ty = std::fs::read_to_string(format!("{dir}/type")).ok()?;
        let size = parse_size(&std::fs::read_to_string(format!("{dir}/size")).ok()?)?;
        match (level.trim(), ty.trim()) {
            ("1", "Data") => l1d = Some(size),
            ("2", _) => l2 = Some(size),
            _ => {}
        }
    }
    Some(CacheSizes { l1d: l1d?, l2: l2? })
}

#[cfg(target_arch = "x86_64")]
fn read_cpuid() -> Option<CacheSizes> {
    use std::arch::x86_64::__cpuid_count;
    // Leaf 4 (Intel) and 0x8000_001D (AMD) share the deterministic cache parameters format.
    let vendor_amd = {
        let r = __cpuid_count(0, 0);
        r.ebx == 0x6874_7541 // "Auth"
    };
    let leaf = if vendor_amd { 0x8000_001D } else { 4 };
    let mut out = CacheSizes { l1d: 0, l2: 0 };
    for sub in 0..8 {
        let r = __cpuid_count(leaf, sub);
        let ty = r.eax & 0x1f;
        if ty == 0 {
            break;
        }
        let level = (r.eax >> 5) & 7;
        let ways = ((r.ebx >> 22) & 0x3ff) as usize + 1;
        let parts = ((r.ebx >> 12) & 0x3ff) as usize + 1;
        let line = (r.ebx & 0xfff) as usize + 1;
        let sets = r.ecx as usize + 1;
        let size = ways * parts * line * sets;
        match (level, ty) {
            (1, 1) => out.l1d = size,
            (2, _) => out.l2 = size,
            _ => {}
        }
    }
    (out.l1d > 0 && out.l2 > 0).then_some(out)
}

#[cfg(not(target_arch = "x86_64"))]
fn read_cpuid() -> Option<CacheSizes> {
    None
}

thread_local! {
    /// What [`with_cache_sizes`] set on this thread, if anything.
    static PLAN_CACHES: std::cell::Cell<Option<CacheSizes>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with the GEMMs it starts on this thread planned for caches of `sizes` instead of
/// this machine's: for tests and blocking experiments, since results must not depend on the
/// blocking. A GEMM makes its whole plan (blocks, units, epilogue chunks) on the calling thread
/// before its workers start, so they follow it too. Nests, and restores the previous sizes when
/// `f` returns or panics.
///
/// ```
/// use codegen::kernels::{cache_sizes, with_cache_sizes, CacheSizes};
/// let small = CacheSizes { l1d: 16 << 10, l2: 64 << 10 };
/// assert_eq!(with_cache_sizes(small, cache_sizes), small);
/// ```
pub fn with_cache_sizes<R>(sizes: CacheSizes, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<CacheSizes>);
    impl Drop for Restore {
        fn drop(&mut self) {
            PLAN_CACHES.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(PLAN_CACHES.with(|c| c.replace(Some(sizes))));
    f()
}

/// Per-core cache sizes: those of [`with_cache_sizes`] on this thread, else `ENCORE_CACHE` if
/// set and valid, else sysfs, else CPUID, else 32K/1M. Memoised.
///
/// ```
/// let c = codegen::kernels::cache_sizes();
/// assert!(c.l1d >= 4096 && c.l2 >= c.l1d);
/// ```
pub fn cache_sizes() -> CacheSizes {
    if let Some(c) = PLAN_CACHES.with(|c| c.get()) {
        return c;
    }
    static C: OnceLock<CacheSizes> = OnceLock::new();
    *C.get_or_init(|| {
        if let Ok(v) = std::env::var("ENCORE_CACHE") {
            match parse_cache_override(&v) {
                Ok(c) => return c,
                Err(e) => eprintln!("encore: {e}; using detected sizes"),
            }
        }
        let c = read_sysfs().or_else(read_cpuid).unwrap_or_default();
        CacheSizes {
            l1d: c.l1d.max(4096),
            l2: c.l2.max(c.l1d).max(64 << 10),
        }
    })
}

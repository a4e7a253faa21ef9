//! INT8 GEMM: `u8 × s8 → i32`, then the fused [`Epilogue`].
//!
//! Data path: activations (u8, or s8 shifted by +128) → packed once per call for the kernel's A
//! layout (all rows, shared by the threads; AMX reads u8 rows on cache lines in place when K
//! needs no padding) → microkernel over all of K into an i32 block
//! (`mr × nc`, thread-local) →
//! epilogue (dequant with column-sum compensation, bias, GELU, residual, LayerNorm, requant,
//! store) while the block is in L2 → output.
//!
//! Kernels: [`scalar`] 4×16 (the oracle), [`avx2`] 6×16 (`vpmaddwd` on widened i16, exact),
//! [`avxvnni`] 6×16, [`avx512vnni`] 8×48, [`amx`] 32×32 (via [`tile_model::TileUnit`]).
//!
//! Threads: part `t` owns the same slice of N panels on every call (weight-stationary, as in the
//! f32 GEMM), cut into `mc × nc` units that it claims from the front; a thread that finishes its
//! own units steals from the back of the others', so one busy core does not stall the GEMM.

pub mod amx;
pub mod avx2;
pub mod avx512vnni;
pub mod avxvnni;
pub mod pack;
pub mod scalar;
pub mod tile_model;

pub use pack::PackedI8;

use super::buf::{AlignedBuf, SharedPtr};
use super::epilogue::{
    run_block, Epilogue, EpilogueOp, FoldedDequant, Int8Ctx, OutPtr, Output, Src,
};
use super::error::KernelError;
use super::pool::{
    effective_threads, panel_granularity, parallel_chunks, parallel_for, plan_split, split_panels,
    split_range, splits_columns, GemmSplit, PartWork, PartWorks,
};
use super::select::{cache_sizes, Int8Kernel};
use std::cell::RefCell;
use std::sync::Mutex;
use tile_model::{TileModel, TileUnit};

/// How a kernel wants its A micro-panels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ALayout {
    /// `[K/4][MR][4]`: a broadcastable i32 (4 K bytes) per row per K-quad.
    Quad,
    /// `[MR][Kp]`: plain rows (AMX A tiles).
    RowMajor,
    /// `[K/4][MR][4]` of u16: the `Quad` layout with each byte widened to 16 bits, so that a
    /// row's pair of K values is one broadcastable i32 of `vpmaddwd` operands (AVX2).
    QuadU16,
}

impl ALayout {
    /// Bytes of one K element of a packed row.
    pub fn elem_bytes(self) -> usize {
        match self {
            ALayout::Quad | ALayout::RowMajor => 1,
            ALayout::QuadU16 => 2,
        }
    }
}

/// How a kernel wants its weight panels laid out within each K-quad of `NR` columns (64 bytes
/// for `NR` = 16).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BLayout {
    /// `[NR][4]`: a column's four K bytes together (one `vpdpbusd` i32 lane per column; an AMX
    /// B tile row).
    Quad,
    /// `[NR/8][2][8][2]`: for each group of 8 columns, the first K pair of the 8 columns, then
    /// the second: 16 bytes that `vpmovsxbw` widens into the `vpmaddwd` operand whose i32 lane
    /// is one column (AVX2).
    Pairs,
}

impl BLayout {
    /// Offset within a K-quad of `nr` columns of column `j`'s K byte `t` (0..4).
    pub fn offset(self, nr: usize, j: usize, t: usize) -> usize {
        debug_assert!(j < nr && t < 4);
        match self {
            BLayout::Quad => j * 4 + t,
            BLayout::Pairs => (j / 8) * 32 + (t / 2) * 16 + (j % 8) * 2 + t % 2,
        }
    }
}

/// Static description of a kernel.
#[derive(Debug, Clone, Copy)]
pub struct KernelDesc {
    /// Rows per microkernel call.
    pub mr: usize,
    /// Columns per microkernel call = packed panel width.
    pub nr: usize,
    /// K padding of the packed weight.
    pub k_align: usize,
    /// A micro-panel layout.
    pub a_layout: ALayout,
    /// Weight panel layout.
    pub b_layout: BLayout,
    /// The share of L1 (numerator, denominator) a unit's epilogue chunk of i32 tiles may take:
    /// a third beside the A micro-panel for the vector kernels; four thirds for AMX, whose
    /// microkernel restarts slowly after each chunk's epilogue (its 32×32 calls on BERT-base's
    /// K = 768 took 1719 / 1632 / 1440 / 1410 TSC cycles in chunks of 2 / 4 / 8 / 16 panels on
    /// the AMX guest of 2026-12-05, the epilogue no slower reading a chunk from L2: batch-8
    /// GEMM nodes 55.7-57.3 → 52.4-53.1 ms a run with 16).
    pub acc_l1_share: (usize, usize),
}

/// The descriptor of `k`.
pub fn desc(k: Int8Kernel) -> KernelDesc {
    let (mr, nr, k_align, a_layout) = match k {
        Int8Kernel::Scalar => (scalar::MR, scalar::NR, 4, ALayout::Quad),
        Int8Kernel::Avx2 => (avx2::MR, avx2::NR, 4, ALayout::QuadU16),
        Int8Kernel::AvxVnni => (avxvnni::MR, avxvnni::NR, 4, ALayout::Quad),
        Int8Kernel::Avx512Vnni => (avx512vnni::MR, avx512vnni::NR, 4, ALayout::RowMajor),
        Int8Kernel::Amx => (amx::MR, amx::NR, amx::K_ALIGN, ALayout::RowMajor),
    };
    KernelDesc {
        mr,
        nr,
        k_align,
        a_layout,
        b_layout: if k == Int8Kernel::Avx2 {
            BLayout::Pairs
        } else {
            BLayout::Quad
        },
        acc_l1_share: if k == Int8Kernel::Amx { (4, 3) } else { (1, 3) },
    }
}

/// Activations of an int8 GEMM.
#[derive(Debug, Clone, Copy)]
pub enum Activations<'a> {
    /// u8 (used as is).
    U8(&'a [u8]),
    /// s8 (shifted by +128 into u8 while packing; compensated with the column sums).
    S8(&'a [i8]),
}

/// One microkernel: `C[MR×NR] = A_panel · B_panel` over `kc4` K-quads into i32 at stride `ldc`,
/// with `next` a prefetch hint (see [`UKernel`]).
pub(crate) trait MicroKernel: Sync {
    fn desc(&self) -> KernelDesc;
    /// Called by each thread before its first `run` of a GEMM (AMX: `ldtilecfg`).
    fn begin(&self) {}
    /// Called by each thread after its last `run` of a GEMM (AMX: `tilerelease`).
    fn end(&self) {}
    /// # Safety
    /// Panels and tile as documented on the kernel functions; between `begin` and `end`.
    unsafe fn run(
        &self,
        kc4: usize,
        a: *const u8,
        b: *const i8,
        c: *mut i32,
        ldc: usize,
        next: *const i8,
    );
    /// The plain function behind `run`, when there is one (what a JIT-compiled unit calls).
    fn ukernel(&self) -> Option<UKernel> {
        None
    }
}

/// A microkernel, with the C calling convention so that JIT-compiled loops can call it too:
/// `(kc4, a, b, c, ldc, next)`.
///
/// `next` is a hint that changes no result: null, or the first of `kc4` cache lines (64 bytes
/// apart) of weights the caller reads after this call, which the kernel asks into L2 as it goes
/// (one line per K-quad; AMX: sixteen per 64-byte K step), in place of prefetching its own panel
/// ahead (the caller passes it only when that panel is already in cache). Kernels without a
/// prefetch path (scalar) ignore it.
/// The lines may run past the weights: a prefetch never faults.
pub type UKernel = unsafe extern "C" fn(usize, *const u8, *const i8, *mut i32, usize, *const i8);

struct FnKernel {
    d: KernelDesc,
    f: UKernel,
}

impl MicroKernel for FnKernel {
    fn desc(&self) -> KernelDesc {
        self.d
    }
    unsafe fn run(
        &self,
        kc4: usize,
        a: *const u8,
        b: *const i8,
        c: *mut i32,
        ldc: usize,
        next: *const i8,
    ) {
        // SAFETY: forwarded contract; `f` was chosen only for a supported CPU.
        unsafe { (self.f)(kc4, a, b, c, ldc, next) }
    }
    fn ukernel(&self) -> Option<UKernel> {
        Some(self.f)
    }
}

/// The AMX kernel on the software tile model: one model per thread (tile state is per thread
/// on hardware too), each configured in `begin` and released in `end`, so the driver's
/// configure-once protocol is checked (a `run` outside it panics in the model).
struct ModelKernel(Mutex<Vec<(std::thread::ThreadId, TileModel)>>);

impl ModelKernel {
    fn with_model<R>(&self, f: impl FnOnce(&mut TileModel) -> R) -> R {
        let mut v = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let id = std::thread::current().id();
        let i = match v.iter().position(|(t, _)| *t == id) {
            Some(i) => i,
            None => {
                v.push((id, TileModel::default()));
                v.len() - 1
            }
        };
        f(&mut v[i].1)
    }
}

impl MicroKernel for ModelKernel {
    fn desc(&self) -> KernelDesc {
        desc(Int8Kernel::Amx)
    }
    fn begin(&self) {
        self.with_model(|t| t.configure(&amx::kernel_config()));
    }
    fn end(&self) {
        self.with_model(|t| t.release());
    }
    unsafe fn run(
        &self,
        kc4: usize,
        a: *const u8,
        b: *const i8,
        c: *mut i32,
        ldc: usize,
        next: *const i8,
    ) {
        // SAFETY: forwarded contract; `begin` configured this thread's model.
        self.with_model(|t| unsafe { amx::ukernel_body_hinted(t, kc4, a, b, c, ldc, next) })
    }
}

/// The AMX kernel on hardware: tiles configured once per thread per GEMM.
#[cfg(target_arch = "x86_64")]
struct AmxHwKernel;

#[cfg(target_arch = "x86_64")]
impl MicroKernel for AmxHwKernel {
    fn desc(&self) -> KernelDesc {
        desc(Int8Kernel::Amx)
    }
    fn begin(&self) {
        if let Ok(mut t) = amx::HwTiles::new() {
            t.configure(&amx::kernel_config());
        }
    }
    fn end(&self) {
        if let Ok(mut t) = amx::HwTiles::new() {
            t.release();
        }
    }
    unsafe fn run(
        &self,
        kc4: usize,
        a: *const u8,
        b: *const i8,
        c: *mut i32,
        ldc: usize,
        next: *const i8,
    ) {
        // SAFETY: forwarded contract; the kernel is built only where AMX is usable and `begin`
        // configured the tiles on this thread.
        unsafe { amx::ukernel_configured(kc4, a, b, c, ldc, next) }
    }
    fn ukernel(&self) -> Option<UKernel> {
        Some(amx::ukernel_configured)
    }
}

/// A hardware kernel, by value: choosing one for a GEMM call allocates nothing.
enum HwKernel {
    Fn(FnKernel),
    #[cfg(target_arch = "x86_64")]
    Amx(AmxHwKernel),
}

impl HwKernel {
    fn as_dyn(&self) -> &dyn MicroKernel {
        match self {
            HwKernel::Fn(k) => k,
            #[cfg(target_arch = "x86_64")]
            HwKernel::Amx(k) => k,
        }
    }
}

fn hw_kernel(k: Int8Kernel) -> Result<HwKernel, KernelError> {
    if !k.is_supported() {
        return Err(KernelError::Unsupported(k.name()));
    }
    let f: UKernel = match k {
        Int8Kernel::Scalar => scalar::ukernel,
        #[cfg(target_arch = "x86_64")]
        Int8Kernel::Avx2 => avx2::ukernel,
        #[cfg(target_arch = "x86_64")]
        Int8Kernel::AvxVnni => avxvnni::ukernel,
        #[cfg(target_arch = "x86_64")]
        Int8Kernel::Avx512Vnni => avx512vnni::ukernel,
        #[cfg(target_arch = "x86_64")]
        Int8Kernel::Amx => return Ok(HwKernel::Amx(AmxHwKernel)),
        #[allow(unreachable_patterns)]
        _ => return Err(KernelError::Unsupported(k.name())),
    };
    Ok(HwKernel::Fn(FnKernel { d: desc(k), f }))
}

/// `out = epilogue(A[m×k] · B)` with the kernel `b` was packed for. `threads` as in
/// [`super::gemm_f32`]. Errors if that kernel is not supported here.
///
/// The i32 product is exact (`k ≤ 65536`); see [`Epilogue`] for the conversion.
///
/// ```
/// use codegen::kernels::int8::{gemm_i8, Activations, PackedI8};
/// use codegen::kernels::{Epilogue, EpilogueOp, Output, QType, RowParam};
/// let (m, k, n) = (2, 8, 3);
/// let w: Vec<i8> = (0..n * k).map(|i| (i % 5) as i8 - 2).collect(); // [n, k]
/// let b = PackedI8::pack(&w, k, n, true).unwrap();
/// let a: Vec<i8> = (0..m * k).map(|i| (i % 7) as i8 - 3).collect();
/// let ws = [0.02f32; 3];
/// let ep = Epilogue::new(vec![
///     EpilogueOp::Dequant { a_scale: RowParam::PerTensor(0.1), a_zero: RowParam::PerTensor(0), w_scale: &ws },
///     EpilogueOp::Requant { scale: 0.01, zero_point: 0, ty: QType::S8 },
/// ]);
/// let mut y = [0i8; 6];
/// gemm_i8(m, Activations::S8(&a), k, &b, Output::S8 { c: &mut y, ldc: n }, &ep, 2).unwrap();
/// ```
#[allow(clippy::too_many_arguments)]
pub fn gemm_i8(
    m: usize,
    a: Activations<'_>,
    lda: usize,
    b: &PackedI8,
    out: Output<'_>,
    epilogue: &Epilogue<'_>,
    threads: usize,
) -> Result<(), KernelError> {
    gemm_i8_step(m, a, lda, b, out, epilogue, threads, None, None).map(|_| ())
}

/// The JIT-compiled unit loop nest for GEMMs with weight `b` (see [`crate::jit`]) whose epilogue
/// has a row-wide step (LayerNorm) or not, and whose output takes columns in groups of
/// `col_granularity` (a head's q, k and v for [`Output::Heads`], else 1): specialised to `b`'s
/// kernel, padded K and this CPU's cache blocking for that epilogue and output. Errors when the
/// kernel has no plain function to call (AMX) or the JIT is unavailable; [`gemm_i8`] then runs
/// the same nest interpreted.
pub fn jit_unit(
    b: &PackedI8,
    row_epilogue: bool,
    col_granularity: usize,
) -> Result<crate::jit::CompiledUnit, crate::jit::JitError> {
    jit_unit_for(b.kernel, b.k, b.n, row_epilogue, col_granularity)
}

/// [`jit_unit`] for `k × n` weights packed for `kernel` (what lowering asks for, before the
/// weights are packed).
pub fn jit_unit_for(
    kernel: Int8Kernel,
    k: usize,
    n: usize,
    row_epilogue: bool,
    col_granularity: usize,
) -> Result<crate::jit::CompiledUnit, crate::jit::JitError> {
    let kern = hw_kernel(kernel).map_err(|e| crate::jit::JitError::Unavailable(e.to_string()))?;
    let kern = kern.as_dyn();
    let f = kern.ukernel().ok_or_else(|| {
        crate::jit::JitError::Unavailable(format!("{} has no plain microkernel", kernel.name()))
    })?;
    let d = kern.desc();
    let k_pad = k.next_multiple_of(d.k_align).max(d.k_align);
    crate::jit::compile_unit(
        unit_shape(
            &d,
            &blocking(
                &d,
                k_pad,
                n,
                row_epilogue,
                panel_granularity(col_granularity, d.nr),
            ),
            k_pad,
        ),
        f,
        epilogue_chunk_c,
    )
}

/// [`gemm_i8`] with the unit loop nest `unit` compiled by [`jit_unit`] for `b`. Bit-identical
/// to [`gemm_i8`]. Returns whether the compiled nest ran: a unit made for another shape or
/// kernel is not used (the nest runs interpreted).
#[allow(clippy::too_many_arguments)]
pub fn gemm_i8_jit(
    m: usize,
    a: Activations<'_>,
    lda: usize,
    b: &PackedI8,
    out: Output<'_>,
    epilogue: &Epilogue<'_>,
    threads: usize,
    unit: &crate::jit::CompiledUnit,
) -> Result<bool, KernelError> {
    gemm_i8_step(m, a, lda, b, out, epilogue, threads, Some(unit), None)
}

/// A weight GEMM of a lowered program: [`gemm_i8`] through the compiled unit loop nest `unit`
/// when given (else interpreted), with `next` the weight GEMM the program runs after it, whose
/// first weights each thread asks into L2 during its last unit here (a hint: results do not
/// depend on it; planned with this GEMM's `m`, as an encoder's token-wise GEMMs share it).
/// Returns whether the compiled nest ran.
///
/// ```
/// use codegen::kernels::int8::{gemm_i8_step, Activations, NextGemm, PackedI8};
/// use codegen::kernels::{Epilogue, Output};
/// let (m, k, n) = (4, 8, 3);
/// let w1 = PackedI8::pack(&[1i8; 8 * 3], k, n, false).unwrap();
/// let w2 = PackedI8::pack(&[2i8; 3 * 5], n, 5, false).unwrap();
/// let a = [1u8; 4 * 8];
/// let mut c = [0i32; 4 * 3];
/// let then = NextGemm { weights: &w2, row_epilogue: false, col_granularity: 1, threads: 1 };
/// let out = Output::I32 { c: &mut c, ldc: n };
/// gemm_i8_step(m, Activations::U8(&a), k, &w1, out, &Epilogue::none(), 1, None, Some(then)).unwrap();
/// assert_eq!(c, [8; 12]);
/// ```
#[allow(clippy::too_many_arguments)]
pub fn gemm_i8_step(
    m: usize,
    a: Activations<'_>,
    lda: usize,
    b: &PackedI8,
    out: Output<'_>,
    epilogue: &Epilogue<'_>,
    threads: usize,
    unit: Option<&crate::jit::CompiledUnit>,
    next: Option<NextGemm<'_>>,
) -> Result<bool, KernelError> {
    let k = hw_kernel(b.kernel)?;
    drive(k.as_dyn(), m, a, lda, b, out, epilogue, threads, unit, next)
}

/// [`gemm_i8`] with an explicit kernel, which must be supported and compatible with the packing.
#[allow(clippy::too_many_arguments)]
pub fn gemm_i8_with(
    kernel: Int8Kernel,
    m: usize,
    a: Activations<'_>,
    lda: usize,
    b: &PackedI8,
    out: Output<'_>,
    epilogue: &Epilogue<'_>,
    threads: usize,
) -> Result<(), KernelError> {
    let k = hw_kernel(kernel)?;
    drive(k.as_dyn(), m, a, lda, b, out, epilogue, threads, None, None).map(|_| ())
}

/// [`gemm_i8`] running the AVX-VNNI kernel (its 6×16 register blocking, packing and driver)
/// through [`avxvnni::ukernel_evex_twin`], the EVEX encoding of the same `vpdpbusd ymm`. CPUs
/// with AVX512-VNNI but no AVX-VNNI (Cascade Lake, Ice Lake, this project's Zen guest) can so
/// test everything of the AVX-VNNI kernel except its instruction encoding, as the tile model does
/// for AMX. `b` must be packed for [`Int8Kernel::AvxVnni`].
#[allow(clippy::too_many_arguments)]
pub fn gemm_i8_avxvnni_evex_twin(
    m: usize,
    a: Activations<'_>,
    lda: usize,
    b: &PackedI8,
    out: Output<'_>,
    epilogue: &Epilogue<'_>,
    threads: usize,
) -> Result<(), KernelError> {
    if !super::cpu_features().avx512vnni {
        return Err(KernelError::Unsupported(
            "avxvnni (EVEX twin needs avx512vnni)",
        ));
    }
    #[cfg(target_arch = "x86_64")]
    {
        let k = FnKernel {
            d: desc(Int8Kernel::AvxVnni),
            f: avxvnni::ukernel_evex_twin,
        };
        drive(&k, m, a, lda, b, out, epilogue, threads, None, None).map(|_| ())
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (m, a, lda, b, out, epilogue, threads);
        Err(KernelError::Unsupported("avxvnni"))
    }
}

/// [`gemm_i8`] running the AMX kernel on the software [`TileModel`] (single model, any CPU);
/// `b` must be packed for [`Int8Kernel::Amx`]. Returns the number of tile dot products issued.
#[allow(clippy::too_many_arguments)]
pub fn gemm_i8_amx_model(
    m: usize,
    a: Activations<'_>,
    lda: usize,
    b: &PackedI8,
    out: Output<'_>,
    epilogue: &Epilogue<'_>,
    threads: usize,
) -> Result<usize, KernelError> {
    let k = ModelKernel(Mutex::new(Vec::new()));
    drive(&k, m, a, lda, b, out, epilogue, threads, None, None)?;
    Ok(k.0
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|(_, t)| t.dot_ops)
        .sum())
}

thread_local! {
    /// The caller's packed A (all rows of one call; kept between calls).
    static APACK: RefCell<Option<AlignedBuf<u8>>> = const { RefCell::new(None) };
    static ACC: RefCell<AlignedBuf<i32>> = RefCell::new(AlignedBuf::zeroed(0));
    static EPI_TMP: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// The f32 rows of a row block whose row-wide epilogue waits for all its panel blocks.
    static STRIP: RefCell<AlignedBuf<f32>> = RefCell::new(AlignedBuf::zeroed(0));
    /// The caller's folded `Dequant` vectors (kept between calls).
    static FOLDED: RefCell<(Vec<i32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

#[derive(Debug, Clone, Copy)]
struct Blocking {
    mc: usize,
    nc_panels: usize,
    /// Panels per epilogue chunk of a unit whose tile pass has no row-wide step: whole groups
    /// whose i32 tiles take the kernel's share of L1 (`KernelDesc::acc_l1_share`).
    epi_chunk: usize,
    /// The tile pass ends in a row-wide step (LayerNorm) over whole rows: a block spans them.
    whole_rows: bool,
}

impl Blocking {
    /// Width of each thread's i32 accumulator, in panels, which is also a unit's epilogue chunk
    /// (see [`compute_unit`]): the block when the tile pass ends in a row-wide step, else one
    /// epilogue chunk, which every chunk of every micro-panel row reuses.
    fn acc_panels(&self) -> usize {
        if self.whole_rows {
            self.nc_panels
        } else {
            self.epi_chunk.min(self.nc_panels)
        }
    }
}

/// `g`: panels per group (see [`Plan`]); the block takes whole groups, as the units do, so
/// that the accumulator sized for a block holds every unit's tiles.
fn blocking(d: &KernelDesc, k_pad: usize, n: usize, row_epilogue: bool, g: usize) -> Blocking {
    let c = cache_sizes();
    // The B block (nc panels of Kp × nr) takes half of L2 and is reused by every micro-panel
    // of A; the i32 accumulator holds only one micro-panel row (mr × nc·nr, in L1), whose
    // epilogue runs as soon as its panels are done, so the accumulator never makes a round trip
    // through L2. The A block is used once per unit (each micro-panel against every panel of
    // the block), so its size only sets the grain of the work units: at most 64 rows keep the
    // tail of a GEMM short when one thread waits for the other.
    let mc = ((c.l2 / 4) / k_pad).clamp(d.mr, 64) / d.mr * d.mr;
    let g = g.max(1);
    let panels = n.div_ceil(d.nr);
    // Never wider than the GEMM (in whole groups): each thread's accumulator is sized from the
    // block, and a large L2 (or `ENCORE_CACHE`) would otherwise make it hundreds of MB.
    let mut nc_panels = (((c.l2 / 2) / (k_pad * d.nr)) / g * g)
        .max(g)
        .min(panels.next_multiple_of(g));
    // A row-wide epilogue (LayerNorm) runs in the tile pass only when a block holds whole rows;
    // otherwise a unit walks its panel blocks into a strip of f32 rows and runs the row step
    // from there. When all the weights fit in three quarters of L2, beside the A micro-panels
    // and the accumulator row, the block takes whole rows: BERT-base's attention output
    // projection (590 KB) on a 1 MB L2 went from 35.6 to 30.7 ms per batch-8 run (against a
    // second pass over the whole output, before the strips).
    if row_epilogue && panels * k_pad * d.nr <= c.l2 * 3 / 4 {
        nc_panels = nc_panels.max(panels);
    }
    // Without a row-wide step (LayerNorm) in the tile pass the epilogue runs on column chunks
    // that fit in L1 beside the A micro-panel (the vector kernels; AMX takes more, see
    // `KernelDesc::acc_l1_share`): a whole block row of i32 (mr × nc·nr, 43 KB for BERT-base's
    // K = 768 on a 2 MB L2) would be read back from L2. The tile pass has that step
    // when the epilogue has one and a block spans the rows (else the units walk strips, whose
    // tile pass stops before it: see `Plan`).
    let (share, of) = d.acc_l1_share;
    let epi_chunk = (((c.l1d * share / of) / (d.mr * d.nr * 4)) / g * g).max(g);
    Blocking {
        mc,
        nc_panels,
        epi_chunk,
        whole_rows: row_epilogue && nc_panels >= panels,
    }
}

/// How [`gemm_i8`] shares an `n`-column GEMM with a weight packed for `kernel` among `threads`
/// workers, given whether its epilogue has a row-wide step (LayerNorm: the threads then share
/// rows) and the column granularity its output needs (a head's q, k and v for [`Output::Heads`],
/// else 1). Problems too small to be worth a second thread run on one, whatever the plan.
pub fn plan_split_i8(
    kernel: Int8Kernel,
    n: usize,
    row_epilogue: bool,
    col_granularity: usize,
    threads: usize,
) -> GemmSplit {
    let d = desc(kernel);
    plan_split(
        n,
        d.nr,
        threads,
        row_epilogue,
        panel_granularity(col_granularity, d.nr),
    )
}

/// The weight GEMM a program runs after the current one (see [`gemm_i8_step`]): its weights, and
/// what its plan depends on (whether its epilogue has a row-wide step, the column granularity
/// of its output, its thread count).
#[derive(Clone, Copy)]
pub struct NextGemm<'a> {
    pub weights: &'a PackedI8,
    pub row_epilogue: bool,
    pub col_granularity: usize,
    pub threads: usize,
}

/// How a GEMM of `m` rows is cut among its threads: parts, units, blocks. One definition for
/// the driver and for the first block each thread reads in the GEMM after (the prefetch hint of
/// [`NextGemm`]).
#[derive(Clone, Copy)]
struct Plan {
    /// Threads worth using (small problems run on fewer).
    threads: usize,
    parts: usize,
    blk: Blocking,
    /// Panels per group: every block boundary on a whole group when the output needs whole heads.
    g: usize,
    split_n: bool,
    /// Units walk all their panels block by block into a strip of f32 rows.
    strips: bool,
    /// Rows per unit.
    mc: usize,
    m: usize,
    mr: usize,
    panels: usize,
}

impl Plan {
    fn new(
        d: &KernelDesc,
        m: usize,
        b: &PackedI8,
        threads: usize,
        row_ops: bool,
        col_granularity: usize,
    ) -> Plan {
        let (k, n) = (b.k, b.n);
        let panels = n.div_ceil(d.nr);
        let threads = effective_threads(threads, m, n, k);
        let g = panel_granularity(col_granularity, d.nr);
        let blk = blocking(d, b.k_pad, n, row_ops, g);
        // Threads share N (each keeps its own weight panels) unless the epilogue needs whole
        // rows (LayerNorm): then they share M, and a unit is a block of whole rows. When its
        // weights fit one block the row epilogue runs in the same pass; otherwise the unit
        // computes its rows block of panels after block of panels into a strip of f32 rows (its
        // own, in L2) and runs the row epilogue from there, while the rows are still in cache.
        let split_n = splits_columns(panels, threads, row_ops);
        let parts = if split_n {
            threads
        } else {
            threads.min(m.div_ceil(d.mr))
        };
        let spans_row = (parts == 1 || !split_n) && blk.nc_panels >= panels;
        let strips = row_ops && !spans_row;
        // A strip unit streams all the weights past its rows (from L3 when they do not fit
        // L2), so it takes as many rows as a quarter of L2 holds as f32 rows, within [mc, 256]:
        // BERT-base's FFN2 (2.4 MB of weights) reads them once per 168 rows on a 2 MB L2.
        let mc = if strips {
            ((cache_sizes().l2 / 4) / (n * 4)).clamp(blk.mc, 256) / d.mr * d.mr
        } else {
            blk.mc
        };
        Plan {
            threads,
            parts,
            blk,
            g,
            split_n,
            strips,
            mc,
            m,
            mr: d.mr,
            panels,
        }
    }

    /// Part `t`'s rows and panels, cut into units.
    fn part(&self, t: usize) -> PartWork {
        let (rows, pans) = if self.split_n {
            (0..self.m, split_panels(self.panels, self.parts, t, self.g))
        } else {
            let r = split_range(self.m.div_ceil(self.mr), self.parts, t);
            (
                r.start * self.mr..(r.end * self.mr).min(self.m),
                0..self.panels,
            )
        };
        // A strip unit holds all the panels, walked block by block.
        let nc = if self.strips {
            self.panels
        } else {
            self.blk.nc_panels
        };
        PartWork::new(rows, pans, self.mr, self.mc, nc, self.g)
    }

    /// How many panels of a unit with panels `pans` are computed at a time: one block of a
    /// strip unit's walk, or all of them.
    fn step(&self, pans: &std::ops::Range<usize>) -> usize {
        if self.strips {
            (self.blk.nc_panels / self.g * self.g).max(self.g)
        } else {
            pans.len().max(1)
        }
    }

    /// The first block a unit with panels `pans` computes.
    fn first_block_of(&self, pans: std::ops::Range<usize>) -> std::ops::Range<usize> {
        pans.start..(pans.start + self.step(&pans)).min(pans.end)
    }

    /// The first block part `t`'s owner computes (empty when there is no such part).
    fn first_block(&self, t: usize) -> std::ops::Range<usize> {
        if t >= self.parts {
            return 0..0;
        }
        let w = self.part(t);
        if w.units() == 0 {
            return 0..0;
        }
        self.first_block_of(w.unit(0).1)
    }
}

#[allow(clippy::too_many_arguments)]
fn drive(
    kern: &dyn MicroKernel,
    m: usize,
    a: Activations<'_>,
    lda: usize,
    b: &PackedI8,
    mut out: Output<'_>,
    ep: &Epilogue<'_>,
    threads: usize,
    unit: Option<&crate::jit::CompiledUnit>,
    next: Option<NextGemm<'_>>,
) -> Result<bool, KernelError> {
    let d = kern.desc();
    if !b.compatible_with_desc(&d) {
        return Err(KernelError::BadArgs(format!(
            "weight packed for {} cannot run on this kernel",
            b.kernel.name()
        )));
    }
    let (k, n) = (b.k, b.n);
    ep.validate(m, n, &out, true)?;
    let (a_bytes, xor): (&[u8], u8) = match a {
        Activations::U8(s) => (s, 0),
        // SAFETY: i8 and u8 have the same size and alignment; every bit pattern is valid.
        Activations::S8(s) => (
            unsafe { std::slice::from_raw_parts(s.as_ptr() as *const u8, s.len()) },
            0x80,
        ),
    };
    if m == 0 || n == 0 {
        return Ok(false);
    }
    if lda < k || a_bytes.len() < (m - 1) * lda + k {
        return Err(KernelError::BadArgs(format!(
            "A slice of {} too short for {m}x{k} with lda {lda}",
            a_bytes.len()
        )));
    }
    let shift = if xor != 0 { 128 } else { 0 };
    let ops = ep.ops();
    let split = ep.row_split();
    let row_ops = split < ops.len();
    let plan = Plan::new(&d, m, b, threads, row_ops, out.col_granularity());
    let Plan {
        threads,
        parts,
        blk,
        strips,
        mc,
        ..
    } = plan;
    // The first weights each thread reads in the GEMM after this one, asked for during its
    // last unit here.
    let then = next.map(|nx| {
        let nd = desc(nx.weights.kernel);
        (
            nx.weights,
            Plan::new(
                &nd,
                m,
                nx.weights,
                nx.threads,
                nx.row_epilogue,
                nx.col_granularity,
            ),
        )
    });
    let final_out = out.ptr();
    let tile_ops = if strips { &ops[..split] } else { ops };
    // Taken out of the thread-local for this call (and put back after), so a nested GEMM on
    // this thread would find none and make its own rather than contend for the borrow.
    let (mut comp, mut scale) = FOLDED.take();
    let ctx = Int8Ctx {
        colsum: &b.colsum,
        shift,
        folded: FoldedDequant::fold(ops, &b.colsum, shift, n, (&mut comp, &mut scale)),
    };
    let works: PartWorks = (0..parts).map(|t| plan.part(t)).collect();
    // A is packed once, all rows, before the units run: a thread sweeps the rows of its
    // panel block while the block's weights stay in L2, so every unit reads A from the shared
    // packed copy instead of packing its rows again for each panel block. Taken out of the
    // thread-local for this call, as the folded vectors.
    //
    // u8 rows of a K that needs no padding, at stride K and on a cache line, are already the
    // row-major layout (AMX, AVX512-VNNI): units of whole micro-panels read them in place, and only the rows from
    // `tail_from` on (every unit that holds the last, partial micro-panel starts there or
    // later, a unit being at most `mc` rows) are copied, zero padded to whole micro-panels.
    // Rows off a cache line are copied too: split tile rows load at a fraction of the speed.
    let in_place = d.a_layout == ALayout::RowMajor
        && xor == 0
        && lda == b.k
        && b.k == b.k_pad
        && (a_bytes.as_ptr() as usize).is_multiple_of(64);
    let m_full = m / d.mr * d.mr;
    let tail_from = if in_place {
        m_full.saturating_sub(mc) / d.mr * d.mr
    } else {
        0
    };
    let packed_rows = if in_place && m_full == m {
        0
    } else {
        m - tail_from
    };
    let packed_panels = packed_rows.div_ceil(d.mr);
    let mut apack = APACK.take().unwrap_or_else(|| AlignedBuf::zeroed(0));
    // Bytes of a packed row (k_pad, twice that for u16 elements).
    let a_row = b.k_pad * d.a_layout.elem_bytes();
    apack.ensure(packed_panels * d.mr * a_row);
    {
        let dst = SharedPtr(apack.as_mut_ptr());
        parallel_chunks(packed_panels, threads.min(packed_panels), |pans| {
            let len = pans.len() * d.mr * a_row;
            // SAFETY: chunks of micro-panels are disjoint byte ranges of the buffer, which
            // holds packed_panels micro-panels of mr × a_row bytes.
            let dst = unsafe {
                std::slice::from_raw_parts_mut(dst.get().add(pans.start * d.mr * a_row), len)
            };
            let rows = tail_from + pans.start * d.mr..(tail_from + pans.end * d.mr).min(m);
            pack::pack_a(a_bytes, lda, b.k, b.k_pad, rows, d.mr, d.a_layout, xor, dst);
        });
    }
    let a_packed = SharedPtr(apack.as_mut_ptr());
    let a_direct = SharedPtr(a_bytes.as_ptr() as *mut u8);
    // Where the A micro-panels of a unit's rows start.
    let a_rows_of = |rows: &std::ops::Range<usize>| -> *const u8 {
        if in_place && rows.end <= m_full {
            // SAFETY: whole micro-panels of rows before m: inside the caller's slice, which
            // was checked to hold m rows at stride lda = k_pad.
            unsafe { a_direct.get().add(rows.start * lda) }
        } else {
            debug_assert!(rows.start >= tail_from);
            // SAFETY: the packed copy holds the micro-panels from tail_from on.
            unsafe { a_packed.get().add((rows.start - tail_from) * a_row) }
        }
    };
    let eager = super::pool::eager_steal();
    let shape = unit_shape(&d, &blk, b.k_pad);
    let unit = unit.filter(|u| {
        u.shape == shape
            && kern
                .ukernel()
                .is_some_and(|f| f as usize == u.ukernel as usize)
            && u.callback as usize == epilogue_chunk_c as *const () as usize
    });
    let body = |t: usize| {
        {
            ACC.with_borrow_mut(|acc| {
                EPI_TMP.with_borrow_mut(|tmp| {
                    STRIP.with_borrow_mut(|strip| {
                        acc.ensure(d.mr * blk.acc_panels() * d.nr);
                        if strips {
                            strip.ensure(mc * n);
                        }
                        let mut run = |w: &PartWork, u: usize| {
                            let (rows, pans) = w.unit(u);
                            // A strip unit walks its panel blocks into its strip, whose element
                            // (r, c) is at (r − rows.start)·n + c (at most `mc` rows; an address
                            // computed with wrapping arithmetic and only dereferenced for the
                            // unit's rows); any other unit is one block into the output.
                            let strip_ptr = strip.as_mut_ptr();
                            let step = plan.step(&pans);
                            let tile_out = if strips {
                                OutPtr::F32(strip_ptr.wrapping_sub(rows.start * n), n)
                            } else {
                                final_out
                            };
                            for p0 in pans.clone().step_by(step) {
                                let block = p0..(p0 + step).min(pans.end);
                                // The weights this thread reads after this block: the next
                                // block of a strip unit's walk, else the first block of the
                                // part's next unit (stolen or not: a hint), else its first
                                // block in the next GEMM. None when that is this block again
                                // (rows sweeping past it: still in L2).
                                let next = if block.end < pans.end {
                                    b.panels(plan.first_block_of(block.end..pans.end))
                                } else if u + 1 < w.units() {
                                    let after = plan.first_block_of(w.unit(u + 1).1);
                                    if after == block {
                                        &[][..]
                                    } else {
                                        b.panels(after)
                                    }
                                } else if let Some((nb, np)) = &then {
                                    nb.panels(np.first_block(t))
                                } else {
                                    &[][..]
                                };
                                // SAFETY: units are disjoint output blocks (rows of a strip of
                                // the running thread's own), each claimed exactly once; A and B
                                // sizes were checked; the kernel matches the packing; the
                                // buffers were sized for the largest block, the strip for `mc`
                                // rows of n.
                                unsafe {
                                    compute_unit(
                                        kern,
                                        unit,
                                        shape,
                                        a_rows_of(&rows),
                                        b,
                                        rows.clone(),
                                        block,
                                        tile_ops,
                                        ctx,
                                        tile_out,
                                        acc,
                                        tmp,
                                        next,
                                    )
                                };
                            }
                            if !strips {
                                return;
                            }
                            // SAFETY: the strip holds the unit's rows × all n columns of tile-step
                            // values; the unit's rows of the output are this unit's alone.
                            unsafe {
                                run_block(
                                    &ops[split..],
                                    None,
                                    Src::F32(strip_ptr, n),
                                    rows,
                                    0..n,
                                    final_out,
                                    tmp,
                                )
                            };
                        };
                        kern.begin();
                        if eager && parts > 1 {
                            let w = &works[(t + 1) % parts];
                            if let Some(u) = w.claim_back() {
                                run(w, u);
                            }
                        }
                        // Own units first (weight-stationary), then help whoever is behind.
                        while let Some(u) = works[t].claim_front() {
                            run(&works[t], u);
                        }
                        for i in 1..parts {
                            let w = &works[(t + i) % parts];
                            while let Some(u) = w.claim_back() {
                                run(w, u);
                            }
                        }
                        kern.end();
                    })
                })
            })
        }
    };
    parallel_for(parts, &body);
    APACK.set(Some(apack));
    FOLDED.set((comp, scale));
    Ok(unit.is_some())
}

impl PackedI8 {
    /// The packed bytes of panels `pans` (empty where they run past the weights).
    fn panels(&self, pans: std::ops::Range<usize>) -> &[i8] {
        let panel = self.k_pad * self.nr;
        let end = (pans.end * panel).min(self.data.len());
        &self.data[(pans.start * panel).min(end)..end]
    }

    fn compatible_with_desc(&self, d: &KernelDesc) -> bool {
        d.nr == self.nr
            && self.k_pad.is_multiple_of(d.k_align)
            && d.b_layout == desc(self.kernel).b_layout
    }
}

/// The shape a unit's loop nest is specialised on, for kernel `d` with cache blocking `blk`.
fn unit_shape(d: &KernelDesc, blk: &Blocking, k_pad: usize) -> crate::jit::UnitShape {
    crate::jit::UnitShape {
        mr: d.mr,
        nr: d.nr,
        k_pad,
        a_row_bytes: k_pad * d.a_layout.elem_bytes(),
        ldacc: blk.acc_panels() * d.nr,
    }
}

/// Clock ticks spent in int8 GEMM units (see [`record_unit_cycles`]), all threads together.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnitCycles {
    /// In the units: microkernel calls and epilogues.
    pub units: u64,
    /// Of `units`, in the epilogues (dequantization to the stored outputs).
    pub epilogue: u64,
}

impl UnitCycles {
    /// The epilogues' share of the units' time, in [0, 1]; `None` when nothing was counted.
    pub fn epilogue_share(&self) -> Option<f64> {
        (self.units > 0).then(|| self.epilogue as f64 / self.units as f64)
    }
}

impl std::ops::Sub for UnitCycles {
    type Output = UnitCycles;
    fn sub(self, o: UnitCycles) -> UnitCycles {
        UnitCycles {
            units: self.units.saturating_sub(o.units),
            epilogue: self.epilogue.saturating_sub(o.epilogue),
        }
    }
}

impl std::ops::AddAssign for UnitCycles {
    fn add_assign(&mut self, o: UnitCycles) {
        self.units += o.units;
        self.epilogue += o.epilogue;
    }
}

/// Recordings open ([`record_unit_cycles`]); the units time themselves only while one is.
static UNIT_RECORDINGS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static UNIT_TICKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static EPILOGUE_TICKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Runs `f` with the int8 GEMM units of every thread timing their microkernel calls and their
/// epilogues, which [`unit_cycles_so_far`] then reads: where a GEMM's time goes between the
/// two, what `encore bench --profile` prints per weight GEMM. The counts are process-wide (a
/// GEMM run by another thread meanwhile counts too) and cost two clock reads per epilogue
/// chunk while recording, none otherwise.
///
/// ```
/// use codegen::kernels::int8::{record_unit_cycles, unit_cycles_so_far};
/// assert!(unit_cycles_so_far().is_none());
/// record_unit_cycles(|| assert!(unit_cycles_so_far().is_some()));
/// ```
pub fn record_unit_cycles<R>(f: impl FnOnce() -> R) -> R {
    use std::sync::atomic::Ordering;
    struct Close;
    impl Drop for Close {
        fn drop(&mut self) {
            UNIT_RECORDINGS.fetch_sub(1, Ordering::Relaxed);
        }
    }
    UNIT_RECORDINGS.fetch_add(1, Ordering::Relaxed);
    let _close = Close;
    f()
}

/// The ticks counted so far (the difference of two readings is what ran between them), or
/// `None` outside [`record_unit_cycles`]. Ticks are the time-stamp counter's on x86-64
/// (nanoseconds elsewhere): compare them with each other, not with wall time.
pub fn unit_cycles_so_far() -> Option<UnitCycles> {
    use std::sync::atomic::Ordering;
    (UNIT_RECORDINGS.load(Ordering::Relaxed) > 0).then(|| UnitCycles {
        units: UNIT_TICKS.load(Ordering::Relaxed),
        epilogue: EPILOGUE_TICKS.load(Ordering::Relaxed),
    })
}

/// A cheap monotonic clock for [`record_unit_cycles`].
#[inline]
fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `rdtsc` exists on every x86-64 CPU and has no preconditions.
        unsafe { std::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        START
            .get_or_init(std::time::Instant::now)
            .elapsed()
            .as_nanos() as u64
    }
}

/// What the epilogue of one unit needs, behind the `env` pointer a JIT-compiled unit passes
/// back to [`epilogue_chunk_c`].
struct UnitEnv<'a, 'b> {
    ops: &'a [EpilogueOp<'b>],
    ctx: Int8Ctx<'a>,
    out: OutPtr,
    tmp: &'a mut Vec<f32>,
    acc: *const i32,
    ldacc: usize,
    rows: std::ops::Range<usize>,
    mr: usize,
    nr: usize,
    n: usize,
    /// Ticks of this unit's epilogues, while [`record_unit_cycles`] records (else `None`).
    epilogue_ticks: Option<u64>,
}

/// The epilogue of micro-panel row `ip` of a unit, over its panels `p0..p1`, whose i32 tiles
/// the microkernel has just finished in the accumulator.
///
/// # Safety
/// The accumulator holds the micro-panel's rows (at most `mr`) of these columns at stride
/// `ldacc` from its column 0; the output block belongs to this unit only.
unsafe fn epilogue_chunk(env: &mut UnitEnv<'_, '_>, ip: usize, p0: usize, p1: usize) {
    let r0 = env.rows.start + ip * env.mr;
    let (c0, c1) = (p0 * env.nr, (p1 * env.nr).min(env.n));
    let t0 = env.epilogue_ticks.map(|_| ticks());
    // SAFETY: as the caller guarantees.
    unsafe {
        run_block(
            env.ops,
            Some(env.ctx),
            Src::I32(env.acc, env.ldacc),
            r0..(r0 + env.mr).min(env.rows.end),
            c0..c1,
            env.out,
            env.tmp,
        )
    };
    if let (Some(t0), Some(sum)) = (t0, env.epilogue_ticks.as_mut()) {
        *sum += ticks().wrapping_sub(t0);
    }
}

/// [`epilogue_chunk`] for JIT-compiled units.
///
/// # Safety
/// `env` points to the live [`UnitEnv`] of the unit being computed; as [`epilogue_chunk`].
unsafe extern "C" fn epilogue_chunk_c(env: *mut std::ffi::c_void, ip: usize, p0: usize, p1: usize) {
    // SAFETY: `compute_unit` passes a pointer to its own `UnitEnv`, alive for the call.
    unsafe { epilogue_chunk(&mut *(env as *mut UnitEnv<'_, '_>), ip, p0, p1) }
}

/// The weights a thread reads after a unit's block (`next`), handed to the microkernel calls of
/// the unit's passes after the first, `kc4` lines a call, until all were asked for: the first
/// pass streams the block itself from memory, the later ones find it in cache and leave the
/// memory bus idle, which these prefetches use. Batch-1 BERT-base INT8 on Zen 5 (the attention
/// output projection, whose weights are one block per thread, aside): QKV 75-77 → 79 %, FFN2
/// 79-80 → 87 % of the `vpdpbusd` peak (`bench --profile`, two alternating pairs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct NextLines {
    at: usize,
    end: usize,
}

impl NextLines {
    fn of(next: &[i8]) -> Self {
        let at = next.as_ptr() as usize;
        Self {
            at,
            end: at + next.len(),
        }
    }

    /// The `next` argument of a microkernel call of `kc4` K-quads in pass `ip` of the unit (see
    /// [`crate::jit::UnitFn`], whose compiled nests compute the same).
    fn take(&mut self, ip: usize, kc4: usize) -> *const i8 {
        if ip == 0 || self.at >= self.end {
            return std::ptr::null();
        }
        let p = self.at;
        self.at += 64 * kc4;
        p as *const i8
    }
}

/// Computes one unit: the microkernel over its panels for each micro-panel row of its rows (in
/// `a_rows`, the A micro-panels of its rows) into the i32 block, then the epilogue to `out`; through
/// the JIT-compiled nest `unit` when given (same calls, same order), else interpreted. `next`:
/// the weights the thread reads after this unit (see [`NextLines`]). The epilogue runs on chunks
/// as wide as the accumulator (`shape.ldacc`: the plan's choice, made on the caller's thread like
/// every choice that depends on the cache sizes).
#[allow(clippy::too_many_arguments)]
unsafe fn compute_unit(
    kern: &dyn MicroKernel,
    unit: Option<&crate::jit::CompiledUnit>,
    shape: crate::jit::UnitShape,
    a_rows: *const u8,
    b: &PackedI8,
    rows: std::ops::Range<usize>,
    pans: std::ops::Range<usize>,
    ops: &[EpilogueOp<'_>],
    ctx: Int8Ctx<'_>,
    out: OutPtr,
    acc: &mut AlignedBuf<i32>,
    tmp: &mut Vec<f32>,
    next: &[i8],
) {
    if rows.is_empty() || pans.is_empty() {
        return;
    }
    let (mr, nr, kp) = (shape.mr, shape.nr, shape.k_pad);
    debug_assert_eq!(rows.start % mr, 0, "units start on a micro-panel");
    // The A micro-panel (mr × Kp, a few KB) stays in L1 while the B panels of the block stream
    // from L2 in address order. Each chunk of a micro-panel row is computed into the start of
    // the accumulator, which is one chunk wide (whole panel groups; the block when the epilogue
    // needs whole rows), so the same few KB of L1 take every tile and are still there when its
    // epilogue reads them: the AMX kernel's 32×32 tiles would otherwise be written to lines of a
    // 100 KB row evicted since their last use, and read back from L2.
    let chunk = shape.ldacc / nr;
    // A row-wide step needs the unit's whole width in one chunk: the plan that sized the
    // accumulator and the one that left LayerNorm in the tile pass must agree (checked in
    // release builds too, once per unit: a partial row would be a silent wrong answer).
    let whole_rows = ops.iter().any(EpilogueOp::needs_whole_row);
    assert!(
        !whole_rows || pans.len() <= chunk,
        "a row-wide epilogue over {} panels with an accumulator of {chunk}",
        pans.len()
    );
    // One pointer for the microkernel's writes and the epilogue's reads.
    let acc = acc.as_mut_ptr();
    // Timed while a recording is open (`record_unit_cycles`).
    let recording = UNIT_RECORDINGS.load(std::sync::atomic::Ordering::Relaxed) > 0;
    let mut env = UnitEnv {
        ops,
        ctx,
        out,
        tmp,
        acc,
        ldacc: shape.ldacc,
        rows: rows.clone(),
        mr,
        nr,
        n: b.n,
        epilogue_ticks: recording.then_some(0),
    };
    let t0 = recording.then(ticks);
    if let Some(u) = unit {
        // SAFETY: the unit was compiled for this shape and microkernel (checked by the
        // driver); it makes exactly the calls of the loop below, with `env` alive throughout.
        unsafe {
            (u.f)(
                a_rows,
                b.data.as_ptr(),
                acc,
                &mut env as *mut UnitEnv<'_, '_> as *mut std::ffi::c_void,
                rows.len(),
                pans.start,
                pans.end,
                chunk,
                next.as_ptr(),
                next.len(),
            )
        };
    } else {
        let mut next = NextLines::of(next);
        let mpan = rows.len().div_ceil(mr);
        for ip in 0..mpan {
            let mut p0 = pans.start;
            while p0 < pans.end {
                let p1 = (p0 + chunk).min(pans.end);
                for p in p0..p1 {
                    // SAFETY: panel p has kp·nr bytes; A micro-panel ip has mr·a_row_bytes; the i32
                    // tile (mr × nr at column (p − p0)·nr) is inside the accumulator, which is a
                    // chunk wide.
                    unsafe {
                        kern.run(
                            kp / 4,
                            a_rows.add(ip * mr * shape.a_row_bytes),
                            b.data.as_ptr().add(p * kp * nr),
                            acc.add((p - p0) * nr),
                            shape.ldacc,
                            next.take(ip, kp / 4),
                        )
                    };
                }
                // SAFETY: the tiles of p0..p1 are finished; the output block is this unit's.
                unsafe { epilogue_chunk(&mut env, ip, p0, p1) };
                p0 = p1;
            }
        }
    }
    if let Some(t0) = t0 {
        let unit_ticks = ticks().wrapping_sub(t0);
        UNIT_TICKS.fetch_add(unit_ticks, std::sync::atomic::Ordering::Relaxed);
        EPILOGUE_TICKS.fetch_add(
            env.epilogue_ticks.unwrap_or(0),
            std::sync::atomic::Ordering::Relaxed,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::{blocking, desc, Int8Kernel, NextLines, PackedI8, Plan};
    use crate::kernels::{with_cache_sizes, CacheSizes};

    /// A block is never wider than its GEMM, in whole groups of panels, whatever the caches:
    /// each thread's accumulator is sized from the block (a 16 GB `ENCORE_CACHE` L2 once made a
    /// one-layer BERT run take 767 MB instead of 66).
    #[test]
    fn blocks_take_whole_groups_and_no_more_than_the_gemm() {
        for kernel in [Int8Kernel::Avx512Vnni, Int8Kernel::Amx, Int8Kernel::Scalar] {
            let d = desc(kernel);
            for l2 in [64 << 10, 2 << 20, 16 << 30] {
                let caches = CacheSizes { l1d: 48 << 10, l2 };
                for &(k, n, g, rows) in &[
                    (768, 1, 1, false),
                    (768, 100, 1, true),
                    (768, 2304, 4, false),
                    (3072, 768, 1, true),
                    (640, 96, 6, false),
                ] {
                    let b = with_cache_sizes(caches, || blocking(&d, k, n, rows, g));
                    let panels = n.div_ceil(d.nr);
                    let at = format!("{} l2={l2} k={k} n={n} g={g}", kernel.name());
                    assert!(b.nc_panels >= g.min(panels), "{at}: {b:?}");
                    assert!(b.nc_panels <= panels.next_multiple_of(g), "{at}: {b:?}");
                    if !rows {
                        assert_eq!(b.nc_panels % g, 0, "{at}: {b:?}");
                    }
                    // The accumulator takes the block when the tile pass ends in LayerNorm over
                    // whole rows, else one epilogue chunk (whole groups, at most the block).
                    assert!(b.epi_chunk >= g && b.epi_chunk % g == 0, "{at}: {b:?}");
                    if rows && b.nc_panels >= panels {
                        assert_eq!(b.acc_panels(), b.nc_panels, "{at}: {b:?}");
                    } else {
                        assert_eq!(b.acc_panels(), b.epi_chunk.min(b.nc_panels), "{at}: {b:?}");
                    }
                }
            }
        }
    }

    /// The first block a plan names for each thread (what the GEMM before prefetches) is the
    /// first its owner computes: inside that part's first unit, a strip unit's first block of
    /// panels, disjoint between threads that share columns; none for a thread with no part.
    #[test]
    fn first_blocks_are_what_each_part_computes_first() {
        let d = desc(Int8Kernel::Scalar);
        for &(m, k, n, row_ops, heads) in &[
            (128, 768, 2304, false, 64),
            (128, 768, 768, true, 1),
            (128, 3072, 768, true, 1),
            (1024, 768, 3072, false, 1),
            (8, 64, 48, false, 1),
            (3, 40, 20, true, 1),
        ] {
            let b =
                PackedI8::pack_for(Int8Kernel::Scalar, &vec![1i8; k * n], k, n, n, false).unwrap();
            let plan = Plan::new(&d, m, &b, 2, row_ops, heads);
            let case = format!("m={m} k={k} n={n} row_ops={row_ops}");
            let mut seen: Vec<std::ops::Range<usize>> = Vec::new();
            for t in 0..3 {
                let first = plan.first_block(t);
                if t >= plan.parts {
                    assert!(first.is_empty(), "{case} t={t}");
                    continue;
                }
                let unit0 = plan.part(t).unit(0).1;
                assert!(!first.is_empty(), "{case} t={t}");
                assert_eq!(first.start, unit0.start, "{case} t={t}");
                assert!(first.end <= unit0.end, "{case} t={t}");
                assert_eq!(
                    first.len(),
                    plan.step(&unit0).min(unit0.len()),
                    "{case} t={t}"
                );
                if plan.split_n {
                    assert!(
                        seen.iter()
                            .all(|s| s.end <= first.start || first.end <= s.start),
                        "{case} t={t}: {first:?} overlaps {seen:?}"
                    );
                }
                assert!(!b.panels(first.clone()).is_empty(), "{case} t={t}");
                seen.push(first);
            }
        }
    }

    /// The interpreted nest's hints follow `UnitFn`'s contract (the compiled nest's is checked
    /// in `tests/jit.rs`): none in row 0, then `kc4` lines a call until the range is used up.
    #[test]
    fn next_lines_skip_row_zero_and_stop_at_the_end() {
        let bytes = vec![0i8; 3 * 64 * 24 + 1];
        let base = bytes.as_ptr() as usize;
        let mut next = NextLines::of(&bytes);
        let hints: Vec<usize> = [0, 0, 1, 1, 2, 2, 2, 3]
            .iter()
            .map(|&ip| next.take(ip, 24) as usize)
            .collect();
        let at = |i: usize| base + i * 64 * 24;
        assert_eq!(hints, [0, 0, at(0), at(1), at(2), at(3), 0, 0]);
        let mut empty = NextLines::of(&[]);
        assert!(empty.take(1, 24).is_null());
    }
}

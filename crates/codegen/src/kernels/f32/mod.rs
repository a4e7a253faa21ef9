//! FP32 GEMM: `C = A·B` then an [`Epilogue`], with B prepacked once ([`PackedF32`]) and A packed
//! on the fly per cache block.
//!
//! Data path: `A[m×k]` → packed `MR`-row micro-panels (per `mc×kc` block, thread-local buffer) →
//! microkernel (`avx512` 8×48, `avx2` 6×16, `scalar` 4×16) with B micro-panels `kc×NR` →
//! `C` (accumulated across `kc` blocks) → epilogue on each `mc×nc` block while it is in cache.
//!
//! Threads: the packed panels of N are split into `threads` contiguous slices and part `t`
//! always computes slice `t` (weight-stationary), cut into `mc × nc` units; a thread that is done
//! steals units from the back of the other slices. When N has fewer panels than threads, M is
//! split instead.

pub mod avx2;
pub mod avx512;
pub mod scalar;

use super::buf::{AlignedBuf, SharedPtr};
use super::epilogue::{run_block, Epilogue, EpilogueOp, OutPtr, Output, Src};
use super::pool::{
    effective_threads, parallel_chunks, parallel_for, plan_split, split_range, splits_columns,
    GemmSplit, PartWork, PartWorks,
};
use super::select::{cache_sizes, pick_f32, F32Kernel};
use std::cell::RefCell;

/// An f32 microkernel `(kc, a, b, c, ldc, mr, nr, accumulate)`, with the C calling convention so
/// that JIT-compiled loops can call it too.
pub type UKernel =
    unsafe extern "C" fn(usize, *const f32, *const f32, *mut f32, usize, usize, usize, bool);

struct KernelInfo {
    mr: usize,
    nr: usize,
    run: UKernel,
}

fn info(k: F32Kernel) -> KernelInfo {
    match k {
        #[cfg(target_arch = "x86_64")]
        F32Kernel::Avx512 => KernelInfo {
            mr: avx512::MR,
            nr: avx512::NR,
            run: avx512::ukernel,
        },
        #[cfg(target_arch = "x86_64")]
        F32Kernel::Avx2 => KernelInfo {
            mr: avx2::MR,
            nr: avx2::NR,
            run: avx2::ukernel,
        },
        _ => KernelInfo {
            mr: scalar::MR,
            nr: scalar::NR,
            run: scalar::ukernel,
        },
    }
}

/// Weight `B` packed for one f32 kernel: panels of `NR` columns, each `k × NR` row-major
/// (k-major), zero-padded past `n`, 64-byte aligned.
///
/// ```
/// use codegen::kernels::{gemm_f32, EpilogueF32, PackedF32};
/// // A = [[1, 2]], B = [[1, 0, 2], [0, 1, 3]] (k = 2, n = 3)
/// let b = PackedF32::pack(&[1., 0., 2., 0., 1., 3.], 2, 3, false);
/// let mut c = [0f32; 3];
/// gemm_f32(1, &[1., 2.], 2, &b, &mut c, 3, &EpilogueF32::none(), 1);
/// assert_eq!(c, [1., 2., 8.]);
/// ```
#[derive(Debug, Clone)]
pub struct PackedF32 {
    k: usize,
    n: usize,
    kernel: F32Kernel,
    data: AlignedBuf<f32>,
}

impl PackedF32 {
    /// Packs B, which is `[k, n]` row-major (`b_is_transposed == false`) or `[n, k]` row-major
    /// (`true`, as in Gemm transB / nn.Linear weights), for the kernel [`pick_f32`] chooses.
    ///
    /// Panics if `b` is shorter than `k·n`.
    pub fn pack(b: &[f32], k: usize, n: usize, b_is_transposed: bool) -> PackedF32 {
        let ld = if b_is_transposed { k } else { n };
        Self::pack_strided(pick_f32(), b, k, n, ld, b_is_transposed)
    }

    /// Packs for an explicit kernel with an explicit row stride `ldb` of the source.
    ///
    /// Panics if `b` is too short for the shape and stride, or the CPU lacks the kernel.
    pub fn pack_strided(
        kernel: F32Kernel,
        b: &[f32],
        k: usize,
        n: usize,
        ldb: usize,
        b_is_transposed: bool,
    ) -> PackedF32 {
        assert!(
            kernel.is_supported(),
            "f32 kernel {} not supported on this CPU",
            kernel.name()
        );
        let (rows, cols) = if b_is_transposed { (n, k) } else { (k, n) };
        assert!(ldb >= cols, "ldb {ldb} < row length {cols}");
        if rows > 0 && cols > 0 {
            assert!(b.len() >= (rows - 1) * ldb + cols, "B slice too short");
        }
        let nr = info(kernel).nr;
        let panels = n.div_ceil(nr);
        let mut data = AlignedBuf::for_weights(panels * k * nr);
        for p in 0..panels {
            let dst = &mut data[p * k * nr..(p + 1) * k * nr];
            let jn = nr.min(n - p * nr);
            for kk in 0..k {
                let row = &mut dst[kk * nr..kk * nr + jn];
                for (j, d) in row.iter_mut().enumerate() {
                    let col = p * nr + j;
                    *d = if b_is_transposed {
                        b[col * ldb + kk]
                    } else {
                        b[kk * ldb + col]
                    };
                }
            }
        }
        PackedF32 { k, n, kernel, data }
    }

    /// Depth (rows of B).
    pub fn k(&self) -> usize {
        self.k
    }

    /// Output columns.
    pub fn n(&self) -> usize {
        self.n
    }

    /// The kernel this packing is for.
    pub fn kernel(&self) -> F32Kernel {
        self.kernel
    }
}

/// Cache blocking for one kernel.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Blocking {
    pub kc: usize,
    pub mc: usize,
    pub nc_panels: usize,
}

fn blocking(mr: usize, nr: usize, elem: usize) -> Blocking {
    let c = cache_sizes();
    // A micro-panel (MR×kc) in a quarter of L1, A block (mc×kc) in a quarter of L2, B block
    // (kc×nc) in half of L2; B micro-panels stream from L2.
    let kc = ((c.l1d / 4) / (mr * elem)).clamp(64, 1024) / 16 * 16;
    let mc = ((c.l2 / 4) / (kc * elem)).clamp(mr, 4096) / mr * mr;
    let nc_panels = ((c.l2 / 2) / (kc * nr * elem)).max(1);
    Blocking { kc, mc, nc_panels }
}

thread_local! {
    static APACK: RefCell<AlignedBuf<f32>> = RefCell::new(AlignedBuf::zeroed(0));
    static EPI_TMP: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// How [`gemm_f32`] shares an `n`-column GEMM with a weight packed for `kernel` among `threads`
/// workers (a LayerNorm step in the epilogue runs after the tiles, so it does not change it).
/// Problems too small to be worth a second thread run on one, whatever the plan.
pub fn plan_split_f32(kernel: F32Kernel, n: usize, threads: usize) -> GemmSplit {
    let ki = info(kernel);
    plan_split(n, ki.nr, threads, false, 1)
}

/// C[m×n] (row stride ldc) = A[m×k] (row stride lda) × B, then the epilogue (bias etc).
/// `threads` = how many threads may be used (1 or more; capped at the machine's parallelism).
///
/// Numerics: each C element is an FMA chain over k in blocks of `kc` (the block sums are added
/// in order), so results match a naive f32 dot product to about `k·2⁻²⁴·Σ|a·b|`.
///
/// Panics if a slice is too short, `lda < k`, `ldc < n`, or the epilogue is invalid for f32
/// (a `Dequant` or `Requant` op).
///
/// ```
/// use codegen::kernels::{gemm_f32, EpilogueF32, PackedF32};
/// let (m, k, n) = (3, 4, 5);
/// let a = vec![1.0f32; m * k];
/// let w = vec![0.5f32; n * k]; // [n, k], like nn.Linear
/// let b = PackedF32::pack(&w, k, n, true);
/// let bias = vec![1.0f32; n];
/// let mut c = vec![0f32; m * n];
/// gemm_f32(m, &a, k, &b, &mut c, n, &EpilogueF32::bias(&bias), 2);
/// assert!(c.iter().all(|&v| v == 3.0));
/// ```
#[allow(clippy::too_many_arguments)]
pub fn gemm_f32(
    m: usize,
    a: &[f32],
    lda: usize,
    b: &PackedF32,
    c: &mut [f32],
    ldc: usize,
    epilogue: &Epilogue<'_>,
    threads: usize,
) {
    drive(m, a, lda, b, c, ldc, epilogue, threads, None);
}

/// [`gemm_f32`] with the unit loop nest `unit` compiled by [`jit_unit`] for `b`. Bit-identical
/// to [`gemm_f32`]. Returns whether the compiled nest ran: a unit made for another shape or
/// kernel is not used (the nest runs interpreted).
#[allow(clippy::too_many_arguments)]
pub fn gemm_f32_jit(
    m: usize,
    a: &[f32],
    lda: usize,
    b: &PackedF32,
    c: &mut [f32],
    ldc: usize,
    epilogue: &Epilogue<'_>,
    threads: usize,
    unit: &crate::jit::CompiledF32Unit,
) -> bool {
    drive(m, a, lda, b, c, ldc, epilogue, threads, Some(unit))
}

#[allow(clippy::too_many_arguments)]
fn drive(
    m: usize,
    a: &[f32],
    lda: usize,
    b: &PackedF32,
    c: &mut [f32],
    ldc: usize,
    epilogue: &Epilogue<'_>,
    threads: usize,
    unit: Option<&crate::jit::CompiledF32Unit>,
) -> bool {
    let (k, n) = (b.k, b.n);
    if m == 0 || n == 0 {
        return false;
    }
    assert!(
        lda >= k && (k == 0 || a.len() >= (m - 1) * lda + k),
        "A too short for {m}x{k} (lda {lda})"
    );
    let out = Output::F32 { c, ldc };
    if let Err(e) = epilogue.validate(m, n, &out, false) {
        panic!("gemm_f32: {e}");
    }
    let Output::F32 { c, .. } = out else {
        unreachable!()
    };
    let ki = info(b.kernel);
    let (mr, nr) = (ki.mr, ki.nr);
    let panels = n.div_ceil(nr);
    let threads = effective_threads(threads, m, n, k);
    let blk = blocking(mr, nr, 4);
    let split_n = splits_columns(panels, threads, false);
    let parts = if split_n {
        threads
    } else {
        threads.min(m.div_ceil(mr))
    };
    let ops = epilogue.ops();
    let split = epilogue.row_split();
    let tile_spans_row = (parts == 1 || !split_n) && blk.nc_panels >= panels;
    let tile_ops: &[EpilogueOp<'_>] = if tile_spans_row { ops } else { &ops[..split] };
    let cp = SharedPtr(c.as_mut_ptr());
    let shape = unit_shape(&ki, &blk, k, n);
    let unit = unit.filter(|u| {
        u.shape == shape
            && u.ukernel as usize == ki.run as usize
            && u.callback as usize == unit_callback as *const () as usize
    });
    let works: PartWorks = (0..parts)
        .map(|t| {
            let (rows, pans) = if split_n {
                (0..m, split_range(panels, parts, t))
            } else {
                let r = split_range(m.div_ceil(mr), parts, t);
                (r.start * mr..(r.end * mr).min(m), 0..panels)
            };
            PartWork::new(rows, pans, mr, blk.mc, blk.nc_panels, 1)
        })
        .collect();
    let eager = super::pool::eager_steal();
    let body = |t: usize| {
        APACK.with_borrow_mut(|apack| {
            EPI_TMP.with_borrow_mut(|tmp| {
                let run =
                    |w: &PartWork, u: usize, apack: &mut AlignedBuf<f32>, tmp: &mut Vec<f32>| {
                        let (rows, pans) = w.unit(u);
                        // SAFETY: units are disjoint regions of C, each claimed once; A and B bounds
                        // were checked above; the kernel is supported (checked at pack time).
                        unsafe {
                            compute_unit(
                                &ki,
                                unit,
                                &blk,
                                k,
                                n,
                                a.as_ptr(),
                                lda,
                                b,
                                cp,
                                ldc,
                                rows,
                                pans,
                                tile_ops,
                                apack,
                                tmp,
                            )
                        }
                    };
                if eager && parts > 1 {
                    let w = &works[(t + 1) % parts];
                    if let Some(u) = w.claim_back() {
                        run(w, u, apack, tmp);
                    }
                }
                // Own units first (weight-stationary), then help whoever is behind.
                while let Some(u) = works[t].claim_front() {
                    run(&works[t], u, apack, tmp);
                }
                for i in 1..parts {
                    let w = &works[(t + i) % parts];
                    while let Some(u) = w.claim_back() {
                        run(w, u, apack, tmp);
                    }
                }
            })
        });
    };
    parallel_for(parts, &body);
    if !tile_spans_row && split < ops.len() {
        let row_ops = &ops[split..];
        let parts = threads.min(m);
        parallel_chunks(m, parts, |rows| {
            EPI_TMP.with_borrow_mut(|tmp| {
                // SAFETY: each part owns whole rows `rows` of C, which were fully computed.
                unsafe {
                    run_block(
                        row_ops,
                        None,
                        Src::F32(cp.get().add(rows.start * ldc), ldc),
                        rows,
                        0..n,
                        OutPtr::F32(cp.get(), ldc),
                        tmp,
                    )
                }
            });
        });
    }
    unit.is_some()
}

/// What one unit's packing and epilogue need, behind the `env` pointer a JIT-compiled unit
/// passes back to [`unit_callback`].
struct UnitEnv<'a, 'b> {
    a: *const f32,
    lda: usize,
    k: usize,
    kc_max: usize,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    mr: usize,
    apack: *mut f32,
    c: SharedPtr<f32>,
    ldc: usize,
    tile_ops: &'a [EpilogueOp<'b>],
    tmp: &'a mut Vec<f32>,
}

/// Packs A's rows of the unit, K block `kb`, into MR-row micro-panels (k-major, zero rows past
/// the end); returns the block's depth.
///
/// # Safety
/// `env.a` holds the unit's rows of A (row stride `lda`, `k` columns); `env.apack` holds
/// `ceil(rows / mr)·mr·kc_max` floats.
unsafe fn pack_block(env: &UnitEnv<'_, '_>, kb: usize) -> usize {
    let (mr, k) = (env.mr, env.k);
    let k0 = kb * env.kc_max;
    let kcl = env.kc_max.min(k - k0.min(k));
    let (m0, mcl) = (env.rows.start, env.rows.len());
    for ip in 0..mcl.div_ceil(mr) {
        // SAFETY: micro-panel ip of mr × kcl floats is inside the buffer (caller contract).
        let dst = unsafe { std::slice::from_raw_parts_mut(env.apack.add(ip * mr * kcl), mr * kcl) };
        let r0 = m0 + ip * mr;
        let valid = mr.min(m0 + mcl - r0);
        #[cfg(target_arch = "x86_64")]
        if (mr == 8 || mr == 6) && valid == mr && super::select::cpu_features().avx2_fma {
            // SAFETY: rows r0..r0 + mr of A hold columns k0..k0 + kcl (caller contract); `dst`
            // holds mr·kcl floats; the CPU has AVX.
            unsafe {
                if mr == 8 {
                    pack_panel::<8>(env.a.add(r0 * env.lda + k0), env.lda, kcl, dst)
                } else {
                    pack_panel::<6>(env.a.add(r0 * env.lda + k0), env.lda, kcl, dst)
                }
            };
            continue;
        }
        for (kk, d) in dst.chunks_exact_mut(mr).enumerate() {
            for (i, v) in d.iter_mut().enumerate() {
                // SAFETY: i < valid means row r0 + i < m, and k0 + kk < k: inside A.
                *v = if i < valid {
                    unsafe { *env.a.add((r0 + i) * env.lda + k0 + kk) }
                } else {
                    0.0
                };
            }
        }
    }
    kcl
}

/// One `MR`-row micro-panel of A (`MR` = 8 for the AVX-512 kernel, 6 for the AVX2 one; `kcl`
/// columns from `a`, rows at stride `lda`) into `dst`, k-major (`dst[kk·MR + i] = a[i·lda +
/// kk]`): eight columns at a time through an 8×8 transpose in registers (zero rows below
/// `MR`). Element by element, this packing took a quarter of an f32 BERT-base run on AVX-512 (a
/// gather across the rows for every value, against 336 multiply-adds per value in the unit)
/// and 12.5 % of one with the AVX2 kernel (Zen 3, 2026-12-06).
///
/// # Safety
/// `a` addresses `MR` rows of `kcl` readable floats at stride `lda`; `dst` holds `MR·kcl`
/// floats; the CPU has AVX; `MR` ≤ 8.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn pack_panel<const MR: usize>(a: *const f32, lda: usize, kcl: usize, dst: &mut [f32]) {
    use std::arch::x86_64::*;
    debug_assert!(MR <= 8 && dst.len() >= MR * kcl);
    let d = dst.as_mut_ptr();
    // The last column of a block stores only its MR values (the others may overlap the next
    // column, which is written after them).
    let last = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LT_OQ>(
        _mm256_setr_ps(0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0),
        _mm256_set1_ps(MR as f32),
    ));
    let mut kk = 0;
    // SAFETY (every load and store): columns kk..kk + 8 < kcl of the MR rows, and floats
    // MR·kk..MR·kk + 8·MR of `dst` (caller contract; the masked last store stays inside).
    unsafe {
        while kk + 8 <= kcl {
            let r: [__m256; 8] = std::array::from_fn(|i| {
                if i < MR {
                    _mm256_loadu_ps(a.add(i * lda + kk))
                } else {
                    _mm256_setzero_ps()
                }
            });
            let t0 = _mm256_unpacklo_ps(r[0], r[1]);
            let t1 = _mm256_unpackhi_ps(r[0], r[1]);
            let t2 = _mm256_unpacklo_ps(r[2], r[3]);
            let t3 = _mm256_unpackhi_ps(r[2], r[3]);
            let t4 = _mm256_unpacklo_ps(r[4], r[5]);
            let t5 = _mm256_unpackhi_ps(r[4], r[5]);
            let t6 = _mm256_unpacklo_ps(r[6], r[7]);
            let t7 = _mm256_unpackhi_ps(r[6], r[7]);
            let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
            let u1 = _mm256_shuffle_ps::<0xee>(t0, t2);
            let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
            let u3 = _mm256_shuffle_ps::<0xee>(t1, t3);
            let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
            let u5 = _mm256_shuffle_ps::<0xee>(t4, t6);
            let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
            let u7 = _mm256_shuffle_ps::<0xee>(t5, t7);
            let cols = [
                _mm256_permute2f128_ps::<0x20>(u0, u4),
                _mm256_permute2f128_ps::<0x20>(u1, u5),
                _mm256_permute2f128_ps::<0x20>(u2, u6),
                _mm256_permute2f128_ps::<0x20>(u3, u7),
                _mm256_permute2f128_ps::<0x31>(u0, u4),
                _mm256_permute2f128_ps::<0x31>(u1, u5),
                _mm256_permute2f128_ps::<0x31>(u2, u6),
                _mm256_permute2f128_ps::<0x31>(u3, u7),
            ];
            for (j, c) in cols.into_iter().enumerate() {
                if MR == 8 || j < 7 {
                    _mm256_storeu_ps(d.add((kk + j) * MR), c);
                } else {
                    _mm256_maskstore_ps(d.add((kk + j) * MR), last, c);
                }
            }
            kk += 8;
        }
        for kk in kk..kcl {
            for i in 0..MR {
                *d.add(kk * MR + i) = *a.add(i * lda + kk);
            }
        }
    }
}

/// The tile epilogue of a finished unit.
///
/// # Safety
/// The unit's block of C is finished and owned by this thread.
unsafe fn unit_epilogue(env: &mut UnitEnv<'_, '_>) {
    if env.tile_ops.is_empty() {
        return;
    }
    let c = env.c.get();
    // SAFETY: as the caller guarantees.
    unsafe {
        run_block(
            env.tile_ops,
            None,
            Src::F32(c.add(env.rows.start * env.ldc + env.cols.start), env.ldc),
            env.rows.clone(),
            env.cols.clone(),
            OutPtr::F32(c, env.ldc),
            env.tmp,
        )
    };
}

/// [`pack_block`] for K block `kb`, or [`unit_epilogue`] when `kb == usize::MAX`, for
/// JIT-compiled units.
///
/// # Safety
/// `env` points to the live [`UnitEnv`] of the unit being computed; as those functions.
unsafe extern "C" fn unit_callback(env: *mut std::ffi::c_void, kb: usize) -> usize {
    // SAFETY: `compute_unit` passes a pointer to its own `UnitEnv`, alive for the call.
    let env = unsafe { &mut *(env as *mut UnitEnv<'_, '_>) };
    if kb == usize::MAX {
        // SAFETY: the compiled nest calls this after the unit's last tile.
        unsafe { unit_epilogue(env) };
        0
    } else {
        // SAFETY: forwarded.
        unsafe { pack_block(env, kb) }
    }
}

/// The shape an f32 unit's loop nest is specialised on.
fn unit_shape(ki: &KernelInfo, blk: &Blocking, k: usize, n: usize) -> crate::jit::F32UnitShape {
    crate::jit::F32UnitShape {
        mr: ki.mr,
        nr: ki.nr,
        k,
        n,
        kc: blk.kc.min(k.max(1)),
    }
}

/// The JIT-compiled unit loop nest for GEMMs with weight `b` (see [`crate::jit`]).
pub fn jit_unit(b: &PackedF32) -> Result<crate::jit::CompiledF32Unit, crate::jit::JitError> {
    jit_unit_for(b.kernel, b.k, b.n)
}

/// [`jit_unit`] for a `k × n` weight packed for `kernel` (what lowering asks for, before the
/// weights are packed).
pub fn jit_unit_for(
    kernel: F32Kernel,
    k: usize,
    n: usize,
) -> Result<crate::jit::CompiledF32Unit, crate::jit::JitError> {
    if !kernel.is_supported() {
        return Err(crate::jit::JitError::Unavailable(format!(
            "{} is not supported here",
            kernel.name()
        )));
    }
    let ki = info(kernel);
    let shape = unit_shape(&ki, &blocking(ki.mr, ki.nr, 4), k, n);
    crate::jit::compile_f32_unit(shape, ki.run, unit_callback)
}

/// One unit of C (`rows × pans`): for each `kc` block, pack A and run the microkernel over
/// the unit's panels (accumulating into C after the first block), then the tile epilogue;
/// through the JIT-compiled nest `unit` when given (same calls, same order), else interpreted.
#[allow(clippy::too_many_arguments)]
unsafe fn compute_unit(
    ki: &KernelInfo,
    unit: Option<&crate::jit::CompiledF32Unit>,
    blk: &Blocking,
    k: usize,
    n: usize,
    a: *const f32,
    lda: usize,
    b: &PackedF32,
    c: SharedPtr<f32>,
    ldc: usize,
    rows: std::ops::Range<usize>,
    pans: std::ops::Range<usize>,
    tile_ops: &[EpilogueOp<'_>],
    apack: &mut AlignedBuf<f32>,
    tmp: &mut Vec<f32>,
) {
    let (mr, nr) = (ki.mr, ki.nr);
    if rows.is_empty() || pans.is_empty() {
        return;
    }
    let kc_max = blk.kc.min(k.max(1));
    let (m0, mcl) = (rows.start, rows.len());
    let mpan = mcl.div_ceil(mr);
    apack.ensure(mpan * mr * kc_max);
    let mut env = UnitEnv {
        a,
        lda,
        k,
        kc_max,
        rows: rows.clone(),
        cols: pans.start * nr..(pans.end * nr).min(n),
        mr,
        apack: apack.as_mut_ptr(),
        c,
        ldc,
        tile_ops,
        tmp,
    };
    if let Some(u) = unit {
        // SAFETY: the unit was compiled for this shape and microkernel (checked by the
        // driver); it makes exactly the calls of the loop below, with `env` alive throughout.
        unsafe {
            (u.f)(
                b.data.as_ptr(),
                c.get(),
                ldc,
                &mut env as *mut UnitEnv<'_, '_> as *mut std::ffi::c_void,
                m0,
                mcl,
                pans.start,
                pans.end,
                env.apack,
            )
        };
        return;
    }
    let k_blocks = k.div_ceil(kc_max).max(1);
    for kb in 0..k_blocks {
        let k0 = kb * kc_max;
        // SAFETY: A's rows of the unit are inside A (checked by the caller); apack was sized
        // for mpan micro-panels of kc_max.
        let kcl = unsafe { pack_block(&env, kb) };
        // The A micro-panel (mr × kc) stays in L1 while the B micro-panels of the unit stream
        // from L2 in address order.
        for ip in 0..mpan {
            let mv = mr.min(mcl - ip * mr);
            for p in pans.clone() {
                let nv = nr.min(n - p * nr);
                // SAFETY: the B panel holds k·nr floats and k0 + kcl ≤ k; the A micro-panel has
                // mr·kcl floats; the C tile (mv × nv at row m0 + ip·mr, column p·nr) is inside
                // this unit.
                unsafe {
                    (ki.run)(
                        kcl,
                        env.apack.add(ip * mr * kcl),
                        b.data.as_ptr().add(p * k * nr + k0 * nr),
                        c.get().add((m0 + ip * mr) * ldc + p * nr),
                        ldc,
                        mv,
                        nv,
                        kb > 0,
                    )
                };
            }
        }
    }
    // SAFETY: this unit of C is finished and owned by this thread.
    unsafe { unit_epilogue(&mut env) };
}

/// For B that is not a constant (e.g. attention Q·Kᵀ, P·V): strides given, packs internally.
/// `C = alpha · A·B`. B is `[k, n]` with row stride `ldb`, or `[n, k]` with row stride `ldb`
/// when `b_is_transposed`.
///
/// ```
/// use codegen::kernels::gemm_f32_unpacked;
/// // Q·Kᵀ with Q = [[1, 0]], K = [[1, 0], [0, 1], [2, 2]] → [[1, 0, 2]] · 0.5
/// let mut c = [0f32; 3];
/// gemm_f32_unpacked(1, 3, 2, &[1., 0.], 2, &[1., 0., 0., 1., 2., 2.], 2, true, &mut c, 3, 0.5, 1);
/// assert_eq!(c, [0.5, 0.0, 1.0]);
/// ```
#[allow(clippy::too_many_arguments)]
pub fn gemm_f32_unpacked(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    b_is_transposed: bool,
    c: &mut [f32],
    ldc: usize,
    alpha: f32,
    threads: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    let packed = PackedF32::pack_strided(pick_f32(), b, k, n, ldb, b_is_transposed);
    let ep = if alpha == 1.0 {
        Epilogue::none()
    } else {
        Epilogue::new(vec![EpilogueOp::Scale(alpha)])
    };
    gemm_f32(m, a, lda, &packed, c, ldc, &ep, threads);
}

//! AVX-512F f32 microkernel: 8 rows × 48 columns, 24 zmm accumulators, `vfmadd231ps` with a
//! broadcast A element and three B vectors per k step. 8×48 divides the BERT shapes (M a
//! multiple of 8, N ∈ {768, 2304, 3072}), so no lane is spent on padding.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Rows per register block.
pub const MR: usize = 8;
/// Columns per register block (= packed panel width).
pub const NR: usize = 48;
const NV: usize = NR / 16;
/// How far ahead of the B reads the kernel prefetches, in floats (4 KB, about 21 k steps): measured 10-30 % more BERT-base FP32 throughput.
const PREFETCH_AHEAD: usize = 1024;

/// `C[mr×nr] (+)= A_panel · B_panel` over `kc` steps.
///
/// # Safety
/// The CPU must support AVX-512F. `a` holds `kc·MR` floats, `b` holds `kc·NR` floats (64-byte
/// aligned), and `c` addresses `mr ≤ MR` rows (stride `ldc`) of `nr ≤ NR` writable floats.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn ukernel(
    kc: usize,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    mr: usize,
    nr: usize,
    accumulate: bool,
) {
    let mut acc = [[_mm512_setzero_ps(); NV]; MR];
    let (mut a, mut b) = (a, b);
    for _ in 0..kc {
        // SAFETY: each step reads NR floats of B and MR floats of A inside the panels; a
        // prefetch is only a hint and may point past the panel (it never faults).
        unsafe {
            for line in 0..NV {
                _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(PREFETCH_AHEAD + 16 * line) as *const i8);
            }
            let mut bv = [_mm512_setzero_ps(); NV];
            for (v, bv) in bv.iter_mut().enumerate() {
                *bv = _mm512_load_ps(b.add(16 * v));
            }
            for (i, row) in acc.iter_mut().enumerate() {
                let av = _mm512_set1_ps(*a.add(i));
                for (r, bv) in row.iter_mut().zip(bv) {
                    *r = _mm512_fmadd_ps(av, bv, *r);
                }
            }
            a = a.add(MR);
            b = b.add(NR);
        }
    }
    let mut masks = [0u16; NV];
    for (v, m) in masks.iter_mut().enumerate() {
        let valid = nr.saturating_sub(16 * v).min(16);
        *m = ((1u32 << valid) - 1) as u16;
    }
    for (i, row) in acc.iter().enumerate().take(mr.min(MR)) {
        for (v, r) in row.iter().enumerate() {
            // SAFETY: masked loads/stores touch only columns < nr of rows < mr (caller contract).
            unsafe {
                let p = c.add(i * ldc + 16 * v);
                let mut x = *r;
                if accumulate {
                    x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(masks[v], p));
                }
                _mm512_mask_storeu_ps(p, masks[v], x);
            }
        }
    }
}

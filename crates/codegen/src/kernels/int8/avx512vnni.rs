//! AVX512-VNNI u8×s8→i32 microkernel (8×48): 512-bit `vpdpbusd`, 24 zmm accumulators; per
//! K-quad one broadcast A quad per row and three B vectors (48 columns × 4 K bytes).
//!
//! 8×48 divides the BERT shapes (M a multiple of 8; N = 768, 2304, 3072 multiples of 48), so no
//! lane is wasted on padding, and it needs 11 loads per 24 `vpdpbusd` (12×32 needs 14).
//!
//! A is read as plain rows (`ALayout::RowMajor`, row i of the micro-panel at `i·Kp` bytes,
//! `Kp = 4·kc4`): u8 activations whose rows are already `Kp` apart are read where they are, with
//! no packing pass (one pass over A per GEMM, 3 MB for BERT-base's FFN2 at batch 8).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Rows per register block.
pub const MR: usize = 8;
/// Columns per packed panel.
pub const NR: usize = 48;
const NV: usize = NR / 16;
/// How far ahead of the B reads the kernel prefetches, in bytes (about 21 K-quads): the
/// hardware streamer alone leaves short-K panels (K = 384, 512: MiniLM-sized layers) at ~85 %
/// of the `vpdpbusd` rate, and the hint costs nothing on the others.
const PREFETCH_AHEAD: usize = 4096;

/// `C[MR×NR] = Σ_g A_panel[g] · B_panel[g]`.
///
/// Without `next` the kernel prefetches its own panel [`PREFETCH_AHEAD`] bytes ahead; with it,
/// `kc4` lines from `next` into L2 (see [`super::UKernel`]).
///
/// # Safety
/// CPU must support AVX512-F and AVX512-VNNI. `a` holds `MR` rows of `kc4·4` bytes at stride
/// `kc4·4`, `b` holds `kc4·NR·4` bytes (64-byte aligned), `c` addresses `MR` rows (stride `ldc`)
/// of `NR` i32; `next` is only prefetched (any value).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vnni")]
pub unsafe extern "C" fn ukernel(
    kc4: usize,
    a: *const u8,
    b: *const i8,
    c: *mut i32,
    ldc: usize,
    next: *const i8,
) {
    let mut acc = [[_mm512_setzero_si512(); NV]; MR];
    let (mut a, mut b, mut next) = (a, b, next);
    let lda = 4 * kc4;
    for _ in 0..kc4 {
        // SAFETY: each step reads 4 bytes of each of the MR rows of A and NR·4 of B inside the
        // panels; a prefetch is only a hint and may point past the panel (it never faults).
        unsafe {
            if next.is_null() {
                for line in 0..NV {
                    _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(PREFETCH_AHEAD + 64 * line));
                }
            } else {
                // The caller's next weights, into L2 only: this panel is already in cache.
                _mm_prefetch::<_MM_HINT_T1>(next);
                next = next.wrapping_add(64);
            }
            let mut bv = [_mm512_setzero_si512(); NV];
            for (v, bv) in bv.iter_mut().enumerate() {
                *bv = _mm512_load_si512(b.add(64 * v) as *const __m512i);
            }
            for (i, row) in acc.iter_mut().enumerate() {
                let av = _mm512_set1_epi32((a.add(i * lda) as *const i32).read_unaligned());
                for (r, bv) in row.iter_mut().zip(bv) {
                    *r = _mm512_dpbusd_epi32(*r, av, bv);
                }
            }
            a = a.add(4);
            b = b.add(NR * 4);
        }
    }
    for (i, row) in acc.iter().enumerate() {
        for (v, r) in row.iter().enumerate() {
            // SAFETY: the C tile is MR×NR writable (caller contract).
            unsafe { _mm512_storeu_si512(c.add(i * ldc + 16 * v) as *mut __m512i, *r) };
        }
    }
}

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
    // Two copies of the loop, so that the prefetch choice is not a branch per K step.
    // SAFETY: the caller's contract, passed on.
    let acc = unsafe {
        if next.is_null() {
            body::<true>(kc4, a, b, next)
        } else {
            body::<false>(kc4, a, b, next)
        }
    };
    for (i, row) in acc.iter().enumerate() {
        for (v, r) in row.iter().enumerate() {
            // SAFETY: the C tile is MR×NR writable (caller contract).
            unsafe { _mm512_storeu_si512(c.add(i * ldc + 16 * v) as *mut __m512i, *r) };
        }
    }
}

/// K steps per turn of the unrolled loop: the row offsets and the B step become constant
/// displacements, so that a turn of 4 × 24 `vpdpbusd` carries a few scalar updates instead of
/// ~9 a step, which on Intel cores compete with the `vpdpbusd` for ports 0 and 5.
const UNROLL: usize = 4;

/// The accumulators of [`ukernel`]; `SELF_PREFETCH`: prefetch B ahead (`next` is null) or walk
/// `next` into L2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vnni")]
#[inline]
unsafe fn body<const SELF_PREFETCH: bool>(
    kc4: usize,
    a: *const u8,
    b: *const i8,
    next: *const i8,
) -> [[__m512i; NV]; MR] {
    let mut acc = [[_mm512_setzero_si512(); NV]; MR];
    let lda = 4 * kc4;
    let (mut a_at, mut b, mut next) = (a, b, next);
    // One K step at `a_at + 4·u`, `b + NR·4·u`.
    macro_rules! step {
        ($u:expr) => {{
            // SAFETY: the step reads 4 bytes of each of the MR rows of A and NR·4 of B inside
            // the panels (the caller's contract); a prefetch is only a hint and may point past
            // the panel (it never faults).
            unsafe {
                if SELF_PREFETCH {
                    for line in 0..NV {
                        _mm_prefetch::<_MM_HINT_T0>(
                            b.wrapping_add(PREFETCH_AHEAD + NR * 4 * $u + 64 * line),
                        );
                    }
                } else {
                    // The caller's next weights, into L2 only: this panel is already in cache.
                    _mm_prefetch::<_MM_HINT_T1>(next.wrapping_add(64 * $u));
                }
                let bs = b.add(NR * 4 * $u);
                let bv: [__m512i; NV] =
                    std::array::from_fn(|v| _mm512_load_si512(bs.add(64 * v) as *const __m512i));
                for (i, row) in acc.iter_mut().enumerate() {
                    let av = _mm512_set1_epi32(
                        (a_at.add(i * lda + 4 * $u) as *const i32).read_unaligned(),
                    );
                    for (r, bv) in row.iter_mut().zip(bv) {
                        *r = _mm512_dpbusd_epi32(*r, av, bv);
                    }
                }
            }
        }};
    }
    for _ in 0..kc4 / UNROLL {
        step!(0);
        step!(1);
        step!(2);
        step!(3);
        // SAFETY: still inside (or one past) the panels.
        unsafe {
            a_at = a_at.add(4 * UNROLL);
            b = b.add(NR * 4 * UNROLL);
        }
        next = next.wrapping_add(64 * UNROLL);
    }
    for _ in 0..kc4 % UNROLL {
        step!(0);
        // SAFETY: as above.
        unsafe {
            a_at = a_at.add(4);
            b = b.add(NR * 4);
        }
        next = next.wrapping_add(64);
    }
    acc
}

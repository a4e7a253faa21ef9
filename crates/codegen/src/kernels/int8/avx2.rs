//! AVX2 u8×s8→i32 microkernel (6×16) on 16-bit products: `vpmovsxbw` + `vpmaddwd`.
//!
//! **Why not `vpmaddubsw`.** `vpmaddubsw` multiplies u8 by s8 and adds adjacent pairs into a
//! *saturating* i16: `255·(−128)·2 = −65280` does not fit, so a plain u8·s8 kernel silently
//! clips (ORT and oneDNN sidestep this by quantizing weights to 7 bits, "reduce_range", or by
//! NNCF's overflow fix on the first layers). Being exact with it costs two `vpmaddubsw` and two
//! `vpmaddwd` per 32 products (the activation split into its low 7 bits and its top bit, the
//! kernel of the sessions before 2026-12-06). Widening both operands to 16 bits instead and
//! multiplying with `vpmaddwd` (`a0·b0 + a1·b1` in i32, where `255·128·2` fits with room to
//! spare) is exact for every input at one multiply per 16 products: the multiplier work per
//! product of the *saturating* `vpmaddubsw` + `vpmaddwd` pair, half of the exact split's.
//! XNNPACK's exact AVX2 QS8 kernels take the same road.
//!
//! **Layouts.** The activations come widened by the packing ([`super::ALayout::QuadU16`]), so a
//! row's pair of K values is one i32 that `vpbroadcastd` reads from memory, with no shuffle; the
//! weights stay bytes ([`super::BLayout::Pairs`]): per K-quad, for each 8 columns, their first
//! K pair and then their second, 16 bytes each, which one `vpmovsxbw` turns into the `vpmaddwd`
//! operand whose i32 lane `c` is column `c`'s pair. Per K-quad: 4 widenings, 6 × 2 broadcasts,
//! 24 `vpmaddwd` and 24 `vpaddd` into 12 accumulators (6 rows × 16 columns); with the two weight
//! vectors and one broadcast, 15 of the 16 ymm registers. On Zen 3 (2026-12-06) this made 78 %
//! of the multiplier's two `vpmaddwd` a cycle on L2-resident panels, where widening the weights
//! inside a 3×16 kernel of the [`super::BLayout::Quad`] panels (two lanes per column, 4
//! accumulators a row) and spreading the activation bytes with `vpshufb` made 49 %: the vector
//! pipes' issue rate, not the multiplier, bounds these kernels (`crates/codegen/BENCH.md`).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Rows per register block.
pub const MR: usize = 6;
/// Columns per packed panel.
pub const NR: usize = 16;

/// `C[MR×NR] = Σ_g A_panel[g] · B_panel[g]`.
///
/// # Safety
/// CPU must support AVX2. `a` holds `kc4·MR·4` u16 (`kc4·MR·8` bytes, [`super::ALayout::QuadU16`]),
/// `b` holds `kc4·NR·4` bytes ([`super::BLayout::Pairs`], 16-byte aligned), `c` addresses `MR`
/// rows (stride `ldc`) of `NR` writable i32; `next` (a prefetch hint, see [`super::UKernel`]) is
/// only prefetched.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub unsafe extern "C" fn ukernel(
    kc4: usize,
    a: *const u8,
    b: *const i8,
    c: *mut i32,
    ldc: usize,
    next: *const i8,
) {
    let a = a as *const i32;
    let mut acc = [[_mm256_setzero_si256(); 2]; MR];
    for g in 0..kc4 {
        // SAFETY: g < kc4, reads inside the panels (caller contract); a prefetch is only a
        // hint (it never faults).
        unsafe {
            if !next.is_null() {
                // The caller's next weights, into L2 (see `UKernel`).
                _mm_prefetch::<_MM_HINT_T1>(next.wrapping_add(64 * g));
            }
            let bq = b.add(g * NR * 4);
            for pair in 0..2 {
                let w0 = _mm256_cvtepi8_epi16(_mm_load_si128(bq.add(16 * pair) as *const __m128i));
                let w1 =
                    _mm256_cvtepi8_epi16(_mm_load_si128(bq.add(32 + 16 * pair) as *const __m128i));
                for (i, acc) in acc.iter_mut().enumerate() {
                    // Row i's u16 pair (K 4g + 2·pair, + 1) as one i32: element 2·(g·MR + i) + pair.
                    let av = _mm256_set1_epi32(a.add(2 * (g * MR + i) + pair).read_unaligned());
                    acc[0] = _mm256_add_epi32(acc[0], _mm256_madd_epi16(av, w0));
                    acc[1] = _mm256_add_epi32(acc[1], _mm256_madd_epi16(av, w1));
                }
            }
        }
    }
    for (i, row) in acc.iter().enumerate() {
        // SAFETY: the C tile is MR×NR writable (caller contract).
        unsafe {
            _mm256_storeu_si256(c.add(i * ldc) as *mut __m256i, row[0]);
            _mm256_storeu_si256(c.add(i * ldc + 8) as *mut __m256i, row[1]);
        }
    }
}

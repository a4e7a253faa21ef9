//! AVX2 u8×s8→i32 microkernel (4×16) with `vpmaddubsw` + `vpmaddwd`.
//!
//! **The i16 saturation hazard.** `vpmaddubsw` multiplies u8 by s8 and adds adjacent pairs into
//! a *saturating* i16: `255·(−128)·2 = −65280` does not fit, so a plain u8·s8 kernel silently
//! clips (ORT and oneDNN sidestep this by quantizing weights to 7 bits, "reduce_range"). This
//! kernel is exact for every input instead: each activation byte is split into its low 7 bits
//! and its top bit, `a = (a & 0x7f) + (a & 0x80)`. For the low part the pair sum is at most
//! `127·128·2 = 32512` in magnitude; for the high part the values are 0 or 128 and the pair sum
//! lies in `128·[−256, 254] = [−32768, 32512]`; both fit in i16. Each half goes through
//! `vpmaddwd` with ones to i32 and the two are added, so the result is bit-exact at the price
//! of two multiplies per product pair.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Rows per register block.
pub const MR: usize = 4;
/// Columns per packed panel.
pub const NR: usize = 16;

/// `C[MR×NR] = Σ_g A_panel[g] · B_panel[g]`.
///
/// # Safety
/// CPU must support AVX2. `a` holds `kc4·MR·4` bytes, `b` holds `kc4·NR·4` bytes (32-byte
/// aligned), `c` addresses `MR` rows (stride `ldc`) of `NR` writable i32; `next` (a prefetch
/// hint, see [`super::UKernel`]) is only prefetched.
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
    let ones = _mm256_set1_epi16(1);
    let lo_mask = _mm256_set1_epi8(0x7f);
    let hi_mask = _mm256_set1_epi8(0x80u8 as i8);
    let mut acc = [[_mm256_setzero_si256(); 2]; MR];
    for g in 0..kc4 {
        // SAFETY: g < kc4, reads inside the panels (caller contract); a prefetch is only a
        // hint (it never faults).
        unsafe {
            if !next.is_null() {
                // The caller's next weights, into L2 (see `UKernel`).
                _mm_prefetch::<_MM_HINT_T1>(next.wrapping_add(64 * g));
            }
            let b0 = _mm256_load_si256(b.add(g * NR * 4) as *const __m256i);
            let b1 = _mm256_load_si256(b.add(g * NR * 4 + 32) as *const __m256i);
            for (i, acc) in acc.iter_mut().enumerate() {
                let av =
                    _mm256_set1_epi32((a.add((g * MR + i) * 4) as *const i32).read_unaligned());
                let lo = _mm256_and_si256(av, lo_mask);
                let hi = _mm256_and_si256(av, hi_mask);
                for (j, bv) in [b0, b1].into_iter().enumerate() {
                    let pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, bv), ones);
                    let ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, bv), ones);
                    acc[j] = _mm256_add_epi32(acc[j], _mm256_add_epi32(pl, ph));
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

//! AVX2 u8×s8→i32 microkernel (3×16) on sign-extended 16-bit products: `vpmovsxbw` + `vpmaddwd`.
//!
//! **Why not `vpmaddubsw`.** `vpmaddubsw` multiplies u8 by s8 and adds adjacent pairs into a
//! *saturating* i16: `255·(−128)·2 = −65280` does not fit, so a plain u8·s8 kernel silently
//! clips (ORT and oneDNN sidestep this by quantizing weights to 7 bits, "reduce_range", or by
//! NNCF's overflow fix on the first layers). Being exact with it costs two `vpmaddubsw` and two
//! `vpmaddwd` per 32 products (the activation split into its low 7 bits and its top bit, the
//! kernel of the sessions before 2026-12-06). Widening both operands to i16 instead and
//! multiplying with `vpmaddwd` (`a0·b0 + a1·b1` in i32, where `255·128·2` fits with room to
//! spare) is exact for every input at one multiply per 16 products: the same multiplier work
//! per product as the *saturating* `vpmaddubsw` + `vpmaddwd` pair, half of the exact split's.
//! XNNPACK's exact AVX2 QS8 kernels take the same road.
//!
//! **Layout.** The panels are the VNNI kernels' (`[K/4][MR][4]` activations, `[K/4][NR][4]`
//! weights), so nothing about packing changes: a K-quad of 4 columns is 16 weight bytes, which
//! `vpmovsxbw` widens into a ymm whose i32 lane `2c + h` holds column `c`'s products `2h, 2h + 1`
//! of the quad. A row's quad of activations is broadcast as the matching i16 pattern
//! `a0 a1 a2 a3 a0 a1 …` (`vpshufb` with zeroing), so `vpmaddwd` leaves two partial sums per
//! column; the two are added once per tile at the end (`vphaddd`, then a lane permute to put the
//! columns in order). Four accumulators per row cover the 16 columns: 3 rows × 4 = 12 of the 16
//! ymm registers, beside one weight vector and the three rows' activation patterns.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Rows per register block.
pub const MR: usize = 3;
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
    // Byte i of a row's broadcast quad → i16 lane: a0 a1 a2 a3 a0 a1 a2 a3 per 128-bit half
    // (-1 = 0x80 zeroes the high byte).
    let spread = _mm256_setr_epi8(
        0, -1, 1, -1, 2, -1, 3, -1, 0, -1, 1, -1, 2, -1, 3, -1, //
        0, -1, 1, -1, 2, -1, 3, -1, 0, -1, 1, -1, 2, -1, 3, -1,
    );
    let mut acc = [[_mm256_setzero_si256(); 4]; MR];
    for g in 0..kc4 {
        // SAFETY: g < kc4, reads inside the panels (caller contract); a prefetch is only a
        // hint (it never faults).
        unsafe {
            if !next.is_null() {
                // The caller's next weights, into L2 (see `UKernel`).
                _mm_prefetch::<_MM_HINT_T1>(next.wrapping_add(64 * g));
            }
            let mut av = [_mm256_setzero_si256(); MR];
            for (i, av) in av.iter_mut().enumerate() {
                let quad = (a.add((g * MR + i) * 4) as *const i32).read_unaligned();
                *av = _mm256_shuffle_epi8(_mm256_set1_epi32(quad), spread);
            }
            let bq = b.add(g * NR * 4);
            for q in 0..4 {
                let w = _mm256_cvtepi8_epi16(_mm_load_si128(bq.add(16 * q) as *const __m128i));
                for (acc, av) in acc.iter_mut().zip(&av) {
                    acc[q] = _mm256_add_epi32(acc[q], _mm256_madd_epi16(*av, w));
                }
            }
        }
    }
    for (i, row) in acc.iter().enumerate() {
        // hadd(columns 0-3, columns 4-7) = [0 1 4 5 | 2 3 6 7]; the permute orders them.
        let lo = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_hadd_epi32(row[0], row[1]));
        let hi = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_hadd_epi32(row[2], row[3]));
        // SAFETY: the C tile is MR×NR writable (caller contract).
        unsafe {
            _mm256_storeu_si256(c.add(i * ldc) as *mut __m256i, lo);
            _mm256_storeu_si256(c.add(i * ldc + 8) as *mut __m256i, hi);
        }
    }
}

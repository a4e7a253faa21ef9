//! AVX512-VNNI u8×s8→i32 microkernel (12×32): 512-bit `vpdpbusd`, 24 zmm accumulators, one
//! broadcast A quad per row and two B vectors (32 columns × 4 K bytes) per K-quad.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Rows per register block.
pub const MR: usize = 12;
/// Columns per packed panel.
pub const NR: usize = 32;

/// `C[MR×NR] = Σ_g A_panel[g] · B_panel[g]`.
///
/// # Safety
/// CPU must support AVX512-F and AVX512-VNNI. `a` holds `kc4·MR·4` bytes, `b` holds
/// `kc4·NR·4` bytes (64-byte aligned), `c` addresses `MR` rows (stride `ldc`) of `NR` i32.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vnni")]
pub unsafe fn ukernel(kc4: usize, a: *const u8, b: *const i8, c: *mut i32, ldc: usize) {
    let mut c0 = [_mm512_setzero_si512(); MR];
    let mut c1 = [_mm512_setzero_si512(); MR];
    let (mut a, mut b) = (a, b);
    for _ in 0..kc4 {
        // SAFETY: each step reads MR·4 bytes of A and NR·4 of B inside the panels.
        unsafe {
            let b0 = _mm512_load_si512(b as *const __m512i);
            let b1 = _mm512_load_si512(b.add(64) as *const __m512i);
            for i in 0..MR {
                let av = _mm512_set1_epi32((a.add(i * 4) as *const i32).read_unaligned());
                c0[i] = _mm512_dpbusd_epi32(c0[i], av, b0);
                c1[i] = _mm512_dpbusd_epi32(c1[i], av, b1);
            }
            a = a.add(MR * 4);
            b = b.add(NR * 4);
        }
    }
    for i in 0..MR {
        // SAFETY: the C tile is MR×NR writable (caller contract).
        unsafe {
            _mm512_storeu_si512(c.add(i * ldc) as *mut __m512i, c0[i]);
            _mm512_storeu_si512(c.add(i * ldc + 16) as *mut __m512i, c1[i]);
        }
    }
}

//! AVX-VNNI u8×s8→i32 microkernel (6×16): VEX-encoded 256-bit `vpdpbusd`, 12 ymm accumulators.
//! `vpdpbusd` sums the four u8·s8 products in i32 (no intermediate i16), so it is exact.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Rows per register block.
pub const MR: usize = 6;
/// Columns per packed panel.
pub const NR: usize = 16;

/// Defines a 6×16 `vpdpbusd ymm` microkernel `$name` for the target features `$features`, with
/// `$dpbusd` as the dot-product instruction. The VEX (AVX-VNNI) and EVEX (AVX512-VNNI + VL) forms
/// of `vpdpbusd ymm` compute the same thing, so one body serves both: the EVEX twin lets CPUs
/// without AVX-VNNI run this kernel's blocking, packing and driver in tests.
macro_rules! ymm_dpbusd_kernel {
    ($(#[$doc:meta])* $name:ident, $features:literal, $dpbusd:ident) => {
        $(#[$doc])*
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        pub unsafe extern "C" fn $name(
            kc4: usize,
            a: *const u8,
            b: *const i8,
            c: *mut i32,
            ldc: usize,
            next: *const i8,
        ) {
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
                        let av = _mm256_set1_epi32(
                            (a.add((g * MR + i) * 4) as *const i32).read_unaligned(),
                        );
                        acc[0] = $dpbusd(acc[0], av, b0);
                        acc[1] = $dpbusd(acc[1], av, b1);
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
    };
}

ymm_dpbusd_kernel!(
    /// `C[MR×NR] = Σ_g A_panel[g] · B_panel[g]` with VEX-encoded `vpdpbusd` (AVX-VNNI).
    ///
    /// # Safety
    /// CPU must support AVX-VNNI. `a` holds `kc4·MR·4` bytes, `b` holds `kc4·NR·4` bytes (32-byte
    /// aligned), `c` addresses `MR` rows (stride `ldc`) of `NR` writable i32; `next` (a prefetch
    /// hint, see `UKernel`) is only prefetched.
    ukernel,
    "avx2,avxvnni",
    _mm256_dpbusd_avx_epi32
);

ymm_dpbusd_kernel!(
    /// [`ukernel`] with the EVEX encoding of the same instruction (AVX512-VNNI + AVX512VL): the
    /// twin through which tests run the AVX-VNNI kernel on CPUs that lack AVX-VNNI.
    ///
    /// # Safety
    /// CPU must support AVX512-VNNI and AVX512VL; otherwise as [`ukernel`].
    ukernel_evex_twin,
    "avx2,avx512f,avx512vl,avx512vnni",
    _mm256_dpbusd_epi32
);

//! AVX2+FMA f32 microkernel: 6 rows × 16 columns, 12 ymm accumulators.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Rows per register block.
pub const MR: usize = 6;
/// Columns per register block (= packed panel width).
pub const NR: usize = 16;

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn lane_mask(valid: usize) -> __m256i {
    let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_cmpgt_epi32(_mm256_set1_epi32(valid.min(8) as i32), idx)
}

/// `C[mr×nr] (+)= A_panel · B_panel` over `kc` steps.
///
/// # Safety
/// The CPU must support AVX2 and FMA. `a` holds `kc·MR` floats, `b` holds `kc·NR` floats
/// (32-byte aligned), and `c` addresses `mr ≤ MR` rows (stride `ldc`) of `nr ≤ NR` floats.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
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
    let mut c0 = [_mm256_setzero_ps(); MR];
    let mut c1 = [_mm256_setzero_ps(); MR];
    let (mut a, mut b) = (a, b);
    for _ in 0..kc {
        // SAFETY: each step reads NR floats of B and MR floats of A inside the panels.
        unsafe {
            let b0 = _mm256_load_ps(b);
            let b1 = _mm256_load_ps(b.add(8));
            for i in 0..MR {
                let av = _mm256_broadcast_ss(&*a.add(i));
                c0[i] = _mm256_fmadd_ps(av, b0, c0[i]);
                c1[i] = _mm256_fmadd_ps(av, b1, c1[i]);
            }
            a = a.add(MR);
            b = b.add(NR);
        }
    }
    let k0 = lane_mask(nr);
    let k1 = lane_mask(nr.saturating_sub(8));
    for i in 0..mr.min(MR) {
        // SAFETY: masked loads/stores touch only columns < nr of rows < mr (caller contract).
        unsafe {
            let p = c.add(i * ldc);
            let (mut v0, mut v1) = (c0[i], c1[i]);
            if accumulate {
                v0 = _mm256_add_ps(v0, _mm256_maskload_ps(p, k0));
                v1 = _mm256_add_ps(v1, _mm256_maskload_ps(p.add(8), k1));
            }
            _mm256_maskstore_ps(p, k0, v0);
            _mm256_maskstore_ps(p.add(8), k1, v1);
        }
    }
}

//! AVX-512F f32 microkernel: 12 rows × 32 columns, 24 zmm accumulators, `vfmadd231ps` with a
//! broadcast A element and two B vectors per k step.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Rows per register block.
pub const MR: usize = 12;
/// Columns per register block (= packed panel width).
pub const NR: usize = 32;

/// `C[mr×nr] (+)= A_panel · B_panel` over `kc` steps.
///
/// # Safety
/// The CPU must support AVX-512F. `a` holds `kc·MR` floats, `b` holds `kc·NR` floats (64-byte
/// aligned), and `c` addresses `mr ≤ MR` rows (stride `ldc`) of `nr ≤ NR` writable floats.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn ukernel(
    kc: usize,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    mr: usize,
    nr: usize,
    accumulate: bool,
) {
    let mut c0 = [_mm512_setzero_ps(); MR];
    let mut c1 = [_mm512_setzero_ps(); MR];
    let (mut a, mut b) = (a, b);
    for _ in 0..kc {
        // SAFETY: each step reads NR floats of B and MR floats of A inside the panels.
        unsafe {
            let b0 = _mm512_load_ps(b);
            let b1 = _mm512_load_ps(b.add(16));
            for i in 0..MR {
                let av = _mm512_set1_ps(*a.add(i));
                c0[i] = _mm512_fmadd_ps(av, b0, c0[i]);
                c1[i] = _mm512_fmadd_ps(av, b1, c1[i]);
            }
            a = a.add(MR);
            b = b.add(NR);
        }
    }
    let m0: u16 = if nr >= 16 {
        0xffff
    } else {
        ((1u32 << nr) - 1) as u16
    };
    let m1: u16 = if nr >= 32 {
        0xffff
    } else if nr > 16 {
        ((1u32 << (nr - 16)) - 1) as u16
    } else {
        0
    };
    for i in 0..mr.min(MR) {
        // SAFETY: masked loads/stores touch only columns < nr of rows < mr (caller contract).
        unsafe {
            let p = c.add(i * ldc);
            let (mut v0, mut v1) = (c0[i], c1[i]);
            if accumulate {
                v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, p));
                v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, p.add(16)));
            }
            _mm512_mask_storeu_ps(p, m0, v0);
            _mm512_mask_storeu_ps(p.add(16), m1, v1);
        }
    }
}

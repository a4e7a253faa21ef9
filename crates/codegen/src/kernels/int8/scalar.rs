//! Portable u8×s8→i32 microkernel (4×16) on the K-quad interleaved layout; the oracle the SIMD
//! kernels are tested against (besides a naive triple loop on unpacked data).

/// Rows per register block.
pub const MR: usize = 4;
/// Columns per packed panel.
pub const NR: usize = 16;

/// `C[MR×NR] = Σ_g A_panel[g] · B_panel[g]` over `kc4` K-quads (wrapping i32 arithmetic, which
/// cannot wrap for k ≤ 65536).
///
/// # Safety
/// `a` holds `kc4·MR·4` bytes, `b` holds `kc4·NR·4` bytes, `c` addresses `MR` rows (stride
/// `ldc`) of `NR` writable i32. `next` (a prefetch hint, see [`super::UKernel`]) is ignored.
pub unsafe extern "C" fn ukernel(
    kc4: usize,
    a: *const u8,
    b: *const i8,
    c: *mut i32,
    ldc: usize,
    _next: *const i8,
) {
    let mut acc = [[0i32; NR]; MR];
    for g in 0..kc4 {
        // SAFETY: g < kc4: both reads are inside the panels.
        let (ar, br) = unsafe {
            (
                &*(a.add(g * MR * 4) as *const [u8; MR * 4]),
                &*(b.add(g * NR * 4) as *const [i8; NR * 4]),
            )
        };
        for i in 0..MR {
            for j in 0..NR {
                let mut s = 0i32;
                for t in 0..4 {
                    s += ar[i * 4 + t] as i32 * br[j * 4 + t] as i32;
                }
                acc[i][j] = acc[i][j].wrapping_add(s);
            }
        }
    }
    for (i, row) in acc.iter().enumerate() {
        // SAFETY: the C tile is MR×NR writable (caller contract).
        unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), c.add(i * ldc), NR) };
    }
}

//! Portable f32 microkernel (4×16), the reference for the SIMD kernels.

/// Rows per register block.
pub const MR: usize = 4;
/// Columns per register block (= packed panel width).
pub const NR: usize = 16;

/// `C[mr×nr] (+)= A_panel · B_panel` over `kc` steps.
///
/// # Safety
/// `a` holds `kc·MR` floats, `b` holds `kc·NR` floats, and `c` addresses `mr ≤ MR` rows (stride
/// `ldc`) of `nr ≤ NR` writable floats.
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
    let mut acc = [[0f32; NR]; MR];
    for p in 0..kc {
        // SAFETY: p < kc, so these reads are inside the panels (caller contract).
        let (ar, br) = unsafe {
            (
                &*(a.add(p * MR) as *const [f32; MR]),
                &*(b.add(p * NR) as *const [f32; NR]),
            )
        };
        for i in 0..MR {
            for j in 0..NR {
                acc[i][j] = ar[i].mul_add(br[j], acc[i][j]);
            }
        }
    }
    for (i, row) in acc.iter().enumerate().take(mr) {
        for (j, v) in row.iter().enumerate().take(nr) {
            // SAFETY: i < mr and j < nr: inside the caller's C tile.
            unsafe {
                let p = c.add(i * ldc + j);
                *p = if accumulate { *p + v } else { *v };
            }
        }
    }
}

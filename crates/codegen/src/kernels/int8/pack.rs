//! Weight prepacking into the K-quad interleaved layout, with column sums stored beside, and the
//! on-the-fly activation packing.
//!
//! Weight layout (`PackedI8`): N is cut into panels of `NR` columns (zero padded); K is padded to
//! a multiple of 4 (64 for AMX) with zeros. Panel `p` holds, for each K-quad `g`, `NR` columns ×
//! 4 consecutive K bytes: `data[p·Kp·NR + g·NR·4 + j·4 + t] = B[4g + t, p·NR + j]`. This is what
//! `vpdpbusd` (one i32 lane = one column) and an AMX B tile row (16 columns × 4 bytes) consume.
//! The AVX2 kernel's panels hold the same 64 bytes per K-quad in another order
//! ([`super::BLayout::Pairs`]: K pairs of 8 columns, what `vpmovsxbw` + `vpmaddwd` consume).
//!
//! Column sums `colsum[n] = Σ_k B[k, n]` (i32) pay for the activation zero point and for the
//! +128 shift that turns s8 activations into the u8 operand `vpdpbusd` needs:
//! `Σ (a+128)·b = Σ a·b + 128·colsum`.

use super::super::buf::AlignedBuf;
use super::super::error::KernelError;
use super::super::select::{pick_int8, Int8Kernel};
use super::{desc, ALayout};

/// Largest supported K: `255·128·K` must fit in i32.
pub const MAX_K: usize = 65536;

/// A weight `B[k×n]` (s8) packed for one int8 kernel family, plus its column sums.
///
/// ```
/// use codegen::kernels::int8::{gemm_i8, Activations, PackedI8};
/// use codegen::kernels::{Epilogue, Output};
/// // A = [[1, 2, 3]] (u8), B = [[1, -1], [2, 0], [3, 5]] as [k=3, n=2]
/// let b = PackedI8::pack(&[1, -1, 2, 0, 3, 5], 3, 2, false).unwrap();
/// assert_eq!(b.colsum(), &[6, 4]);
/// let mut c = [0i32; 2];
/// gemm_i8(1, Activations::U8(&[1, 2, 3]), 3, &b, Output::I32 { c: &mut c, ldc: 2 }, &Epilogue::none(), 1).unwrap();
/// assert_eq!(c, [14, 14]);
/// ```
#[derive(Debug, Clone)]
pub struct PackedI8 {
    pub(crate) k: usize,
    pub(crate) n: usize,
    pub(crate) k_pad: usize,
    pub(crate) nr: usize,
    pub(crate) kernel: Int8Kernel,
    pub(crate) data: AlignedBuf<i8>,
    pub(crate) colsum: Vec<i32>,
}

impl PackedI8 {
    /// Packs B, `[k, n]` row-major (`b_is_transposed == false`) or `[n, k]` row-major (`true`),
    /// for the kernel [`pick_int8`] chooses for a large M.
    pub fn pack(b: &[i8], k: usize, n: usize, b_is_transposed: bool) -> Result<Self, KernelError> {
        let ld = if b_is_transposed { k } else { n };
        Self::pack_for(pick_int8(usize::MAX, n, k), b, k, n, ld, b_is_transposed)
    }

    /// Packs for an explicit kernel (the CPU need not support it: packing is plain data, which
    /// is how the AMX path is tested on the tile model) with source row stride `ldb`.
    pub fn pack_for(
        kernel: Int8Kernel,
        b: &[i8],
        k: usize,
        n: usize,
        ldb: usize,
        b_is_transposed: bool,
    ) -> Result<Self, KernelError> {
        if k > MAX_K {
            return Err(KernelError::BadArgs(format!(
                "k = {k} > {MAX_K} may overflow i32"
            )));
        }
        let (rows, cols) = if b_is_transposed { (n, k) } else { (k, n) };
        if ldb < cols || (rows > 0 && cols > 0 && b.len() < (rows - 1) * ldb + cols) {
            return Err(KernelError::BadArgs(format!(
                "B slice of {} too short for {rows}x{cols} with ld {ldb}",
                b.len()
            )));
        }
        let d = desc(kernel);
        let (nr, lay) = (d.nr, d.b_layout);
        let k_pad = k.next_multiple_of(d.k_align).max(d.k_align);
        let panels = n.div_ceil(nr);
        let mut data = AlignedBuf::<i8>::for_weights(panels * k_pad * nr);
        let mut colsum = vec![0i32; n];
        let at = |kk: usize, j: usize| {
            if b_is_transposed {
                b[j * ldb + kk]
            } else {
                b[kk * ldb + j]
            }
        };
        for p in 0..panels {
            let base = p * k_pad * nr;
            let cols = p * nr..p * nr + nr.min(n - p * nr);
            if b_is_transposed {
                // A column of B is a row of the source: walk it along K.
                for (j, col) in cols.enumerate() {
                    let mut s = 0i32;
                    for kk in 0..k {
                        let v = at(kk, col);
                        s += v as i32;
                        data[base + (kk / 4) * nr * 4 + lay.offset(nr, j, kk % 4)] = v;
                    }
                    colsum[col] = s;
                }
            } else {
                // Rows of the source are contiguous: walk the panel's columns within each row
                // (column by column, every read would be a row apart; BERT-base took 0.2 s).
                for kk in 0..k {
                    let src = &b[kk * ldb + cols.start..kk * ldb + cols.end];
                    let dst = base + (kk / 4) * nr * 4;
                    for (j, &v) in src.iter().enumerate() {
                        data[dst + lay.offset(nr, j, kk % 4)] = v;
                        colsum[cols.start + j] += v as i32;
                    }
                }
            }
        }
        Ok(PackedI8 {
            k,
            n,
            k_pad,
            nr,
            kernel,
            data,
            colsum,
        })
    }

    /// Depth.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Output columns.
    pub fn n(&self) -> usize {
        self.n
    }

    /// The kernel this packing was made for.
    pub fn kernel(&self) -> Int8Kernel {
        self.kernel
    }

    /// `Σ_k B[k, n]` per column.
    pub fn colsum(&self) -> &[i32] {
        &self.colsum
    }

    /// Whether `kernel` can run on this packing (same panel width, K padding and panel layout).
    pub fn compatible_with(&self, kernel: Int8Kernel) -> bool {
        let d = desc(kernel);
        d.nr == self.nr
            && self.k_pad.is_multiple_of(d.k_align)
            && d.b_layout == desc(self.kernel).b_layout
    }
}

/// Packs activation rows `rows` (absolute), all of K, into `mpan` micro-panels of `mr` rows at
/// `dst` for the layout; `xor` is 0x80 for s8 input (shift to u8) and 0 for u8. Rows past the
/// end are zero.
#[allow(clippy::too_many_arguments)]
pub(crate) fn pack_a(
    a: &[u8],
    lda: usize,
    k: usize,
    k_pad: usize,
    rows: std::ops::Range<usize>,
    mr: usize,
    layout: ALayout,
    xor: u8,
    dst: &mut [u8],
) {
    let mpan = rows.len().div_ceil(mr);
    #[cfg(target_arch = "x86_64")]
    let fast = layout == ALayout::Quad && mr == 8 && super::super::select::cpu_features().avx512;
    #[cfg(target_arch = "x86_64")]
    let widen_fast = layout == ALayout::QuadU16 && super::super::select::cpu_features().avx2_fma;
    for ip in 0..mpan {
        let a_row = k_pad * layout.elem_bytes();
        let panel = &mut dst[ip * mr * a_row..(ip + 1) * mr * a_row];
        // Whole 8-row panels: 64 K bytes of each row at a time, transposed in registers.
        #[cfg(target_arch = "x86_64")]
        let done = if fast && rows.start + (ip + 1) * mr <= rows.end {
            let first = rows.start + ip * mr;
            assert!(a.len() >= (first + mr - 1) * lda + k && panel.len() >= mr * k_pad);
            // SAFETY: AVX-512F/BW checked; rows first..first + 8 have k readable bytes at
            // stride lda and the panel holds 8·k_pad bytes (asserted above).
            unsafe { quad8_avx512(a.as_ptr().add(first * lda), lda, k, xor, panel.as_mut_ptr()) }
        } else {
            0
        };
        #[cfg(not(target_arch = "x86_64"))]
        let done = 0;
        for i in 0..mr {
            let r = rows.start + ip * mr + i;
            let src: &[u8] = if r < rows.end {
                &a[r * lda..r * lda + k]
            } else {
                &[]
            };
            match layout {
                ALayout::RowMajor => {
                    let d = &mut panel[i * k_pad..(i + 1) * k_pad];
                    for (d, s) in d.iter_mut().zip(src) {
                        *d = s ^ xor;
                    }
                    d[src.len()..].fill(0);
                }
                ALayout::QuadU16 => {
                    #[cfg(target_arch = "x86_64")]
                    let done = if widen_fast {
                        // SAFETY: AVX2 checked; the panel holds mr·k_pad u16, and the function
                        // writes row i's quads below src.len() / 16 · 4 ≤ k_pad / 4.
                        unsafe { quads_u16_avx2(src, xor, panel, mr, i) }
                    } else {
                        0
                    };
                    #[cfg(not(target_arch = "x86_64"))]
                    let done = 0;
                    for g in done / 4..k_pad / 4 {
                        for t in 0..4 {
                            let v = src.get(4 * g + t).map_or(0, |v| v ^ xor) as u16;
                            let o = ((g * mr + i) * 4 + t) * 2;
                            panel[o..o + 2].copy_from_slice(&v.to_ne_bytes());
                        }
                    }
                }
                ALayout::Quad => {
                    let x32 = u32::from_ne_bytes([xor; 4]);
                    let src = &src[done.min(src.len())..];
                    let mut ch = src.chunks_exact(4);
                    let mut g = done / 4;
                    for q in &mut ch {
                        let v = u32::from_ne_bytes([q[0], q[1], q[2], q[3]]) ^ x32;
                        let o = (g * mr + i) * 4;
                        panel[o..o + 4].copy_from_slice(&v.to_ne_bytes());
                        g += 1;
                    }
                    let rem = ch.remainder();
                    if !rem.is_empty() {
                        let o = (g * mr + i) * 4;
                        for t in 0..4 {
                            panel[o + t] = rem.get(t).map_or(0, |v| v ^ xor);
                        }
                        g += 1;
                    }
                    while g < k_pad / 4 {
                        panel[(g * mr + i) * 4..(g * mr + i) * 4 + 4].fill(0);
                        g += 1;
                    }
                }
            }
        }
    }
}

/// Writes row `i` of a `QuadU16` micro-panel (`mr` rows) from the row's bytes `src`, 16 at a
/// time: one widening per four quads, each quad's 8 bytes stored at its place. Returns how many
/// K bytes it packed (a multiple of 16, at most `src.len()`).
///
/// # Safety
/// The CPU must have AVX2; `panel` must hold `mr · (src.len() / 16 · 4)` quads of 8 bytes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quads_u16_avx2(src: &[u8], xor: u8, panel: &mut [u8], mr: usize, i: usize) -> usize {
    use std::arch::x86_64::*;
    let blocks = src.len() / 16;
    assert!(blocks == 0 || panel.len() >= ((blocks * 4 - 1) * mr + i + 1) * 8);
    let flip = _mm_set1_epi8(xor as i8);
    let out = panel.as_mut_ptr();
    for blk in 0..blocks {
        // SAFETY: bytes 16·blk .. 16·blk + 16 of `src`; quads 4·blk .. 4·blk + 4 of row i lie
        // in the panel (asserted above).
        unsafe {
            let bytes = _mm_xor_si128(
                _mm_loadu_si128(src.as_ptr().add(16 * blk) as *const __m128i),
                flip,
            );
            let wide = _mm256_cvtepu8_epi16(bytes);
            let (lo, hi) = (
                _mm256_castsi256_si128(wide),
                _mm256_extracti128_si256::<1>(wide),
            );
            let at = |q: usize| out.add(((4 * blk + q) * mr + i) * 8) as *mut __m128i;
            _mm_storel_epi64(at(0), lo);
            _mm_storel_epi64(at(1), _mm_unpackhi_epi64(lo, lo));
            _mm_storel_epi64(at(2), hi);
            _mm_storel_epi64(at(3), _mm_unpackhi_epi64(hi, hi));
        }
    }
    blocks * 16
}

/// Packs the first whole 64-byte K blocks of 8 rows (`a`, stride `lda`) into the `Quad` layout
/// of `panel` (`[K/4][8][4]`): per block, 16 quads of each row become 16 groups of the 8 rows'
/// quads, an 8×16 transpose of 32-bit elements done with 24 shuffles where the scalar loop makes
/// 128 four-byte stores. Returns how many K bytes it packed (a multiple of 64, at most `k`).
///
/// # Safety
/// The CPU must have AVX-512F and AVX-512BW; `a` must address 8 rows of `k` readable bytes at
/// stride `lda`; `panel` must be writable for `8·k.next_multiple_of(4)` bytes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn quad8_avx512(a: *const u8, lda: usize, k: usize, xor: u8, panel: *mut u8) -> usize {
    use std::arch::x86_64::*;
    let flip = _mm512_set1_epi8(xor as i8);
    let blocks = k / 64;
    for blk in 0..blocks {
        // SAFETY: row r's bytes blk·64..blk·64 + 64 lie within its k bytes (caller contract).
        let r: [__m512i; 8] = std::array::from_fn(|i| unsafe {
            _mm512_xor_si512(
                _mm512_loadu_si512(a.add(i * lda + blk * 64) as *const __m512i),
                flip,
            )
        });
        // Lane L (128 bits) of t[2j] holds quads 4L, 4L+1 of rows 2j, 2j+1 interleaved; of
        // t[2j+1], quads 4L+2, 4L+3.
        let mut t = [_mm512_setzero_si512(); 8];
        for j in 0..4 {
            t[2 * j] = _mm512_unpacklo_epi32(r[2 * j], r[2 * j + 1]);
            t[2 * j + 1] = _mm512_unpackhi_epi32(r[2 * j], r[2 * j + 1]);
        }
        // Lane L of u[c] holds quad 4L + c of rows 0-3; of u[4 + c], of rows 4-7.
        let mut u = [_mm512_setzero_si512(); 8];
        for (half, base) in [(0, 0), (4, 4)] {
            u[half] = _mm512_unpacklo_epi64(t[base], t[base + 2]);
            u[half + 1] = _mm512_unpackhi_epi64(t[base], t[base + 2]);
            u[half + 2] = _mm512_unpacklo_epi64(t[base + 1], t[base + 3]);
            u[half + 3] = _mm512_unpackhi_epi64(t[base + 1], t[base + 3]);
        }
        // Group g = 4L + c (rows 0-7 of quad g, 32 bytes) is lane L of u[c] then of u[4 + c].
        let out = |g: usize| unsafe { panel.add((blk * 16 + g) * 32) as *mut __m128i };
        for c in 0..4 {
            macro_rules! put {
                ($lane:literal) => {
                    // SAFETY: group blk·16 + 4·lane + c < k/4 lies inside the panel.
                    unsafe {
                        _mm_storeu_si128(
                            out(4 * $lane + c),
                            _mm512_extracti32x4_epi32::<$lane>(u[c]),
                        );
                        _mm_storeu_si128(
                            out(4 * $lane + c).add(1),
                            _mm512_extracti32x4_epi32::<$lane>(u[4 + c]),
                        );
                    }
                };
            }
            put!(0);
            put!(1);
            put!(2);
            put!(3);
        }
    }
    blocks * 64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `Quad` and `QuadU16` packings of whole and partial micro-panels, u8 and s8, rows
    /// wider than K, against their definition.
    #[test]
    fn quad_packing_matches_its_definition() {
        for (mr, k, lda, m, xor) in [
            (8usize, 768usize, 768usize, 19usize, 0u8),
            (8, 200, 203, 26, 0x80),
            (8, 128, 128, 17, 0),
            (8, 64, 70, 9, 0x80),
            (8, 20, 23, 8, 0x80),
            (6, 12, 12, 13, 0),
            (6, 200, 203, 26, 0x80),
            (4, 8, 9, 5, 0x80),
            (5, 16, 16, 11, 0x80),
            (8, 10, 10, 9, 0),
        ] {
            for layout in [ALayout::Quad, ALayout::QuadU16] {
                let k_pad = k.next_multiple_of(4);
                let a: Vec<u8> = (0..m * lda).map(|i| (i * 37 % 251) as u8).collect();
                let rows = 1..m;
                let mpan = rows.len().div_ceil(mr);
                let e = layout.elem_bytes();
                let mut dst = vec![0xEEu8; mpan * mr * k_pad * e];
                pack_a(&a, lda, k, k_pad, rows.clone(), mr, layout, xor, &mut dst);
                for ip in 0..mpan {
                    for i in 0..mr {
                        for kk in 0..k_pad {
                            let r = rows.start + ip * mr + i;
                            let want = if r < rows.end && kk < k {
                                a[r * lda + kk] ^ xor
                            } else {
                                0
                            };
                            let at = (ip * mr * k_pad + ((kk / 4) * mr + i) * 4 + kk % 4) * e;
                            let got = match layout {
                                ALayout::QuadU16 => u16::from_ne_bytes([dst[at], dst[at + 1]]),
                                _ => dst[at] as u16,
                            };
                            assert_eq!(
                                got, want as u16,
                                "{layout:?} mr {mr} k {k} panel {ip} row {i} k {kk}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Each weight byte lands where the layout's `offset` says, for both layouts.
    #[test]
    fn weight_layouts_place_every_byte() {
        use super::super::BLayout;
        let (k, n) = (10usize, 21usize);
        let w: Vec<i8> = (0..k * n).map(|i| (i % 251) as i8).collect();
        for kernel in [Int8Kernel::AvxVnni, Int8Kernel::Avx2] {
            let lay = desc(kernel).b_layout;
            for transposed in [false, true] {
                let (src, ld) = if transposed {
                    let t: Vec<i8> = (0..n * k).map(|i| w[(i % k) * n + i / k]).collect();
                    (t, k)
                } else {
                    (w.clone(), n)
                };
                let p = PackedI8::pack_for(kernel, &src, k, n, ld, transposed).unwrap();
                for col in 0..n {
                    for kk in 0..p.k_pad {
                        let (pan, j) = (col / p.nr, col % p.nr);
                        let at = pan * p.k_pad * p.nr
                            + (kk / 4) * p.nr * 4
                            + lay.offset(p.nr, j, kk % 4);
                        let want = if kk < k { w[kk * n + col] } else { 0 };
                        assert_eq!(p.data[at], want, "{kernel:?} {lay:?} col {col} k {kk}");
                    }
                }
            }
        }
        assert_eq!(BLayout::Pairs.offset(16, 9, 3), 32 + 16 + 2 + 1);
    }
}

//! The dynamic per-row (per-token) u8 quantization of f32 rows: a row's range (times the
//! SmoothQuant factors) and its bytes. One definition for every place that quantizes a row by
//! its own range: the runtime's standalone quantizer of a `qlinear` input and the `ForkU8Rows`
//! epilogue, which quantizes a LayerNorm's output rows in the GEMM that makes them; both must
//! give the same bytes. The AVX-512 versions compute exactly what the scalar ones do (the bytes
//! of the IEEE division, round half to even, NaN as 0), so results never depend on the CPU.

/// `round_half_even(x / scale) + zp`, saturated to u8, NaN as 0 (→ `zp`):
/// [`super::math::quantize_div`], the formula of every requantizing epilogue.
#[inline]
pub fn quantize_u8(x: f32, scale: f32, zp: f32) -> u8 {
    super::math::quantize_div(x, scale, zp, 0.0, 255.0) as u8
}

/// The mask of the lanes below `n` (all 16 from 16 on).
#[cfg(target_arch = "x86_64")]
#[inline]
fn lanes_below(n: usize) -> std::arch::x86_64::__mmask16 {
    if n >= 16 {
        0xffff
    } else {
        (1u16 << n) - 1
    }
}

/// `(min(0, min x·s), max(0, max x·s))`, NaN ignored.
pub fn range(x: &[f32], inv: Option<&[f32]>) -> (f32, f32) {
    #[cfg(target_arch = "x86_64")]
    {
        let f = super::select::cpu_features();
        if f.avx512 {
            // SAFETY: the CPU has AVX-512F; the function reads only within the slices.
            return unsafe { avx512::range(x, inv) };
        }
        if f.avx2_fma {
            // SAFETY: the CPU has AVX2; the function reads only within the slices.
            return unsafe { avx2::range(x, inv) };
        }
    }
    scalar_range(x, inv)
}

/// [`range`] one value at a time: the definition, and the vector versions' tails.
fn scalar_range(x: &[f32], inv: Option<&[f32]>) -> (f32, f32) {
    let mut lo = 0f32;
    let mut hi = 0f32;
    match inv {
        Some(s) => x.iter().zip(s).for_each(|(v, s)| {
            lo = lo.min(v * s);
            hi = hi.max(v * s);
        }),
        None => x.iter().for_each(|&v| {
            lo = lo.min(v);
            hi = hi.max(v);
        }),
    }
    (lo, hi)
}

/// The row `x` (times `inv`) quantized by its own range into `out`: [`range`], the parameters
/// of [`ir::u8_qparams`], [`quantize`]. Returns the row's scale and zero point.
///
/// ```
/// let mut out = [0u8; 3];
/// let (scale, zero) = codegen::kernels::rowquant::quantize_row(&[-1.0, 0.0, 3.0], None, &mut out);
/// assert_eq!((scale, zero), (4.0 / 255.0, 64));
/// assert_eq!(out, [0, 64, 255]);
/// ```
pub fn quantize_row(x: &[f32], inv: Option<&[f32]>, out: &mut [u8]) -> (f32, i32) {
    let (lo, hi) = range(x, inv);
    let (scale, zero) = ir::u8_qparams(lo, hi);
    quantize(x, inv, scale, zero as f32, out);
    (scale, zero)
}

/// `out[i] = quantize_u8(x[i]·s[i], scale, zp)`.
pub fn quantize(x: &[f32], inv: Option<&[f32]>, scale: f32, zp: f32, out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        let f = super::select::cpu_features();
        if f.avx512 {
            // SAFETY: the CPU has AVX-512F; reads and writes stay within the slices.
            return unsafe { avx512::quantize(x, inv, scale, zp, out) };
        }
        if f.avx2_fma {
            // SAFETY: the CPU has AVX2; reads and writes stay within the slices.
            return unsafe { avx2::quantize(x, inv, scale, zp, out) };
        }
    }
    scalar_quantize(x, inv, scale, zp, out)
}

/// [`quantize`] one value at a time: the definition, and the vector versions' tails.
fn scalar_quantize(x: &[f32], inv: Option<&[f32]>, scale: f32, zp: f32, out: &mut [u8]) {
    match inv {
        Some(s) => x
            .iter()
            .zip(s)
            .zip(out.iter_mut())
            .for_each(|((v, s), o)| *o = quantize_u8(v * s, scale, zp)),
        None => x
            .iter()
            .zip(out.iter_mut())
            .for_each(|(v, o)| *o = quantize_u8(*v, scale, zp)),
    }
}

/// The AVX2 row quantizer (CPUs without AVX-512): eight values a vector, the division as the
/// scalar formula does it (no reciprocal shortcut: at ~5 cycles a vector it is not what a row
/// costs), the conversion rounding half to even as the default MXCSR mode does.
#[cfg(target_arch = "x86_64")]
pub mod avx2 {
    use std::arch::x86_64::*;

    /// Vectors of 8 per step of the whole-vector loops.
    const UNROLL: usize = 4;
    const STEP: usize = 8 * UNROLL;

    /// Eight values of `x` (times the factors) from `i`.
    ///
    /// # Safety
    /// `i + 8 <= x.len()`, and `inv`, when given, is as long as `x`.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load(x: &[f32], inv: Option<&[f32]>, i: usize) -> __m256 {
        // SAFETY: the caller's bounds.
        unsafe {
            let v = _mm256_loadu_ps(x.as_ptr().add(i));
            match inv {
                Some(s) => _mm256_mul_ps(v, _mm256_loadu_ps(s.as_ptr().add(i))),
                None => v,
            }
        }
    }

    /// [`super::range`] with AVX2.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub unsafe fn range(x: &[f32], inv: Option<&[f32]>) -> (f32, f32) {
        let n = x.len();
        if let Some(s) = inv {
            assert!(s.len() >= n, "smoothing factors shorter than the row");
        }
        let mut lo = [_mm256_setzero_ps(); UNROLL];
        let mut hi = [_mm256_setzero_ps(); UNROLL];
        let mut i = 0;
        // min/max return the second operand when one is NaN: NaN lanes keep the bound.
        while i + STEP <= n {
            for (u, (lo, hi)) in lo.iter_mut().zip(hi.iter_mut()).enumerate() {
                // SAFETY: i + STEP <= n.
                let v = unsafe { load(x, inv, i + 8 * u) };
                *lo = _mm256_min_ps(v, *lo);
                *hi = _mm256_max_ps(v, *hi);
            }
            i += STEP;
        }
        while i + 8 <= n {
            // SAFETY: i + 8 <= n.
            let v = unsafe { load(x, inv, i) };
            lo[0] = _mm256_min_ps(v, lo[0]);
            hi[0] = _mm256_max_ps(v, hi[0]);
            i += 8;
        }
        // The accumulators hold no NaN: their order does not matter.
        let fold = |v: [__m256; UNROLL], f: fn(__m256, __m256) -> __m256| {
            let mut lanes = [0f32; 8];
            // SAFETY: 8 floats into an 8-float array.
            unsafe {
                _mm256_storeu_ps(
                    lanes.as_mut_ptr(),
                    v.into_iter().reduce(f).expect("UNROLL > 0"),
                )
            };
            lanes
        };
        let (tail_lo, tail_hi) = super::scalar_range(&x[i..], inv.map(|s| &s[i..]));
        let lo = fold(lo, |a, b| _mm256_min_ps(a, b))
            .into_iter()
            .fold(tail_lo, f32::min);
        let hi = fold(hi, |a, b| _mm256_max_ps(a, b))
            .into_iter()
            .fold(tail_hi, f32::max);
        (lo, hi)
    }

    /// [`crate::kernels::math::quantize_div`]`(v, scale, zp, 0, 255)` of 8 lanes as integers.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn quantize8(v: __m256, scale: f32, zp: f32) -> __m256i {
        let q = _mm256_div_ps(v, _mm256_set1_ps(scale));
        // max/min return the second operand when one is NaN: a NaN quotient stays NaN.
        let q = _mm256_min_ps(
            _mm256_set1_ps(255.0 - zp),
            _mm256_max_ps(_mm256_set1_ps(-zp), q),
        );
        let ordered = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_ORD_Q>(q, q));
        // Rounds half to even (the MXCSR default Rust never changes); NaN lanes become 0. The
        // zero point is an integer in [0, 255]: exact as i32.
        let q = _mm256_and_si256(_mm256_cvtps_epi32(q), ordered);
        _mm256_add_epi32(q, _mm256_set1_epi32(zp as i32))
    }

    /// [`super::quantize`] with AVX2.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub unsafe fn quantize(x: &[f32], inv: Option<&[f32]>, scale: f32, zp: f32, out: &mut [u8]) {
        let n = x.len();
        assert!(out.len() >= n, "output shorter than the row");
        if let Some(s) = inv {
            assert!(s.len() >= n, "smoothing factors shorter than the row");
        }
        // Bytes of four vectors after the two packs sit as [v0 0-3, v1 0-3, v2 0-3, v3 0-3 |
        // v0 4-7, …]: this puts each vector's eight together.
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        let mut i = 0;
        while i + STEP <= n {
            // SAFETY: i + STEP <= n.
            let q: [__m256i; UNROLL] =
                std::array::from_fn(|u| quantize8(unsafe { load(x, inv, i + 8 * u) }, scale, zp));
            let bytes = _mm256_packus_epi16(
                _mm256_packs_epi32(q[0], q[1]),
                _mm256_packs_epi32(q[2], q[3]),
            );
            // SAFETY: bytes i .. i + 32 lie within `out` (i + STEP <= n).
            unsafe {
                _mm256_storeu_si256(
                    out.as_mut_ptr().add(i) as *mut __m256i,
                    _mm256_permutevar8x32_epi32(bytes, order),
                )
            };
            i += STEP;
        }
        super::scalar_quantize(&x[i..], inv.map(|s| &s[i..]), scale, zp, &mut out[i..]);
    }
}

#[cfg(target_arch = "x86_64")]
pub mod avx512 {
    use super::super::math::lanes16;
    use super::lanes_below;
    use std::arch::x86_64::*;

    /// Vectors per step of the loops over whole vectors: four independent min/max chains
    /// (one pair bounds the range loop by its latency, about four cycles a vector), four
    /// quotients checked as one group.
    const UNROLL: usize = 4;
    const STEP: usize = 16 * UNROLL;
    /// How far ahead of its loads the range pass asks for the row, in floats (2 KB). The
    /// range pass is the first to read a row since its producer wrote it, usually from
    /// memory or another core's cache (a GEMM's f32 output of 3 to 12 MB at batch 8); the
    /// hardware's prefetch alone left it waiting on every line: BERT-base INT8 dynamic,
    /// batch 8, AMX guest, 89.6 → 95-100 sequences/s with 1 to 4 KB ahead, FFN2's node 27.4 →
    /// 24.9 ms a run.
    const PREFETCH_AHEAD: usize = 512;

    /// Lanes `i..i+16` of `x` (times `inv`), masked to the slice; masked-off lanes are 0.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load(x: &[f32], inv: Option<&[f32]>, i: usize, m: __mmask16) -> __m512 {
        // SAFETY: `m` enables only lanes below `x.len() - i` (and `inv` is as long as `x`).
        unsafe {
            let v = _mm512_maskz_loadu_ps(m, x.as_ptr().add(i));
            match inv {
                Some(s) => _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, s.as_ptr().add(i))),
                None => v,
            }
        }
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn range(x: &[f32], inv: Option<&[f32]>) -> (f32, f32) {
        let n = x.len();
        if let Some(s) = inv {
            assert!(s.len() >= n, "smoothing factors shorter than the row");
        }
        let mut lo = [_mm512_setzero_ps(); UNROLL];
        let mut hi = [_mm512_setzero_ps(); UNROLL];
        let mut i = 0;
        // min/max return the second operand when one is NaN: NaN lanes keep the bound.
        while i + STEP <= n {
            for u in 0..UNROLL {
                // A hint only: it may point past the row (never faults).
                _mm_prefetch::<_MM_HINT_T0>(
                    x.as_ptr().wrapping_add(i + PREFETCH_AHEAD + 16 * u) as *const i8
                );
            }
            for (u, (lo, hi)) in lo.iter_mut().zip(hi.iter_mut()).enumerate() {
                // SAFETY: i + STEP <= n: all 16 lanes lie within the slices (LLVM emits
                // plain loads for the constant mask).
                let v = unsafe { load(x, inv, i + 16 * u, !0) };
                *lo = _mm512_min_ps(v, *lo);
                *hi = _mm512_max_ps(v, *hi);
            }
            i += STEP;
        }
        while i < n {
            // SAFETY: masked to the slice.
            let v = unsafe { load(x, inv, i, lanes_below(n - i)) };
            lo[0] = _mm512_min_ps(v, lo[0]);
            hi[0] = _mm512_max_ps(v, hi[0]);
            i += 16;
        }
        // The accumulators hold no NaN: their order does not matter.
        let fold = |v: [__m512; UNROLL], f: fn(__m512, __m512) -> __m512| {
            v.into_iter().reduce(f).expect("UNROLL > 0")
        };
        let (lo, hi) = (fold(lo, _mm512_min_ps), fold(hi, _mm512_max_ps));
        (_mm512_reduce_min_ps(lo), _mm512_reduce_max_ps(hi))
    }

    /// The whole vectors four at a time by the product with the reciprocal, a group redone
    /// by the division when any of its lanes is unsure (`lanes16::quantize_group_i32`: the
    /// division's bytes; the divider, ~10 cycles a quotient, bounded the loop), stored as
    /// 16-byte vectors; the tail by the division, masked.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn quantize(
        x: &[f32],
        inv: Option<&[f32]>,
        scale: f32,
        zp: f32,
        out: &mut [u8],
    ) {
        let n = x.len();
        assert!(out.len() >= n, "output shorter than the row");
        if let Some(s) = inv {
            assert!(s.len() >= n, "smoothing factors shorter than the row");
        }
        let recip = lanes16::requant_reciprocal(scale, zp, 0.0, 255.0);
        let mut i = 0;
        while i + STEP <= n {
            // SAFETY: i + STEP <= n: all 16 lanes of each lie within the slices.
            let v: [__m512; UNROLL] =
                std::array::from_fn(|u| unsafe { load(x, inv, i + 16 * u, !0) });
            let put = |u: usize, q: __m512i| {
                // SAFETY: bytes i + 16u .. i + 16u + 16 lie within `out` (i + STEP <= n).
                unsafe {
                    _mm_storeu_si128(
                        out.as_mut_ptr().add(i + 16 * u) as *mut __m128i,
                        _mm512_cvtepi32_epi8(q),
                    )
                }
            };
            lanes16::quantize_group_i32(v, [!0; UNROLL], (scale, recip), zp, 0.0, 255.0, put);
            i += STEP;
        }
        while i < n {
            let m = lanes_below(n - i);
            // SAFETY: masked to the slice.
            let v = unsafe { load(x, inv, i, m) };
            // SAFETY: the store is masked to the lanes that lie within `out`.
            unsafe {
                _mm512_mask_cvtepi32_storeu_epi8(
                    out.as_mut_ptr().add(i) as *mut i8,
                    m,
                    quantize16(v, scale, zp),
                )
            };
            i += 16;
        }
    }

    /// `quantize_u8` of 16 lanes (`zp` an integer of [0, 255]), the bytes as the low byte of
    /// each i32 lane: `math::lanes16::quantize_div_i32`, the vector form the GEMM epilogues
    /// requantize with. The row quantizer and int8 attention's u8 output both make their
    /// bytes here.
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub fn quantize16(v: __m512, scale: f32, zp: f32) -> __m512i {
        lanes16::quantize_div_i32(v, scale, zp, 0.0, 255.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg24(seed: u32) -> impl FnMut() -> u32 {
        let mut state = seed;
        move || {
            state = state.wrapping_mul(1664525).wrapping_add(1013904223);
            state >> 8
        }
    }

    /// The vector row quantizer against the scalar formula, bit for bit: values at random across
    /// the exponents that reach the rounding (quotients up to ±2^12) and beyond, exact halves of
    /// the scale (ties), the special values, on scales from 2^-60 to 2^60 and the subnormal, zero
    /// and infinite ones (whose 0/0 and ∞/∞ are NaN quotients, 0 before the zero point as in the
    /// scalar formula: the vector one used to clamp them to 0 after it).
    type Quantizer = fn(&[f32], Option<&[f32]>, f32, f32, &mut [u8]);

    /// The best quantizer the CPU runs, and the AVX2 one where the CPU has AVX2 (on AVX-512
    /// CPUs the dispatch never picks it).
    fn quantizers() -> Vec<(&'static str, Quantizer)> {
        let mut all: Vec<(&'static str, Quantizer)> = vec![("best", quantize)];
        #[cfg(target_arch = "x86_64")]
        if crate::kernels::cpu_features().avx2_fma {
            // SAFETY: the CPU has AVX2.
            all.push(("avx2", |x, inv, scale, zp, out| unsafe {
                avx2::quantize(x, inv, scale, zp, out)
            }));
        }
        all
    }

    #[test]
    fn vector_quantize_matches_the_scalar_formula_on_any_scale() {
        let mut draw = lcg24(777);
        let mut bits = || draw() ^ (draw() << 8);
        let mut scales: Vec<f32> = (0..300)
            .map(|_| f32::from_bits((bits() & 0x007f_ffff) | ((bits() % 120 + 67) << 23)))
            .collect();
        scales.extend([
            1.0,
            0.5,
            3.0,
            1e-40,
            f32::MIN_POSITIVE,
            0.0,
            f32::INFINITY,
            f32::MAX,
        ]);
        for &scale in &scales {
            let mut x: Vec<f32> = (0..1000)
                .map(|_| {
                    let q = f32::from_bits((bits() & 0x807f_ffff) | ((bits() % 45 + 100) << 23));
                    q * scale
                })
                .collect();
            x.extend((-600..600).map(|k| (k as f32 + 0.5) * scale));
            x.extend([
                0.0,
                -0.0,
                f32::NAN,
                f32::INFINITY,
                f32::NEG_INFINITY,
                f32::MAX,
                f32::MIN,
                1e-45,
                -1e-45,
            ]);
            for zp in [0.0, 128.0] {
                for (name, quantize) in quantizers() {
                    let mut out = vec![0u8; x.len()];
                    quantize(&x, None, scale, zp, &mut out);
                    for (&v, &o) in x.iter().zip(&out) {
                        assert_eq!(
                            o,
                            quantize_u8(v, scale, zp),
                            "{name} {v:e} / {scale:e} + {zp}"
                        );
                    }
                }
            }
        }
    }

    /// The vector row quantizer against the scalar formula, on awkward lengths, with and
    /// without smoothing, including NaN, infinities and exact .5 ties.
    #[test]
    fn vector_rows_equal_the_scalar_formula() {
        let mut draw = lcg24(12345);
        let mut rnd = || draw() as f32 / (1u32 << 24) as f32 * 8.0 - 4.0;
        // Lengths on both sides of the whole-vector loops' step (64) and of their tails.
        for len in [
            0usize, 1, 15, 16, 17, 33, 63, 64, 65, 100, 128, 143, 200, 257, 768,
        ] {
            let mut x: Vec<f32> = (0..len).map(|_| rnd()).collect();
            if len > 3 {
                x[0] = f32::NAN;
                x[1] = 0.5;
                x[2] = 2.5;
            }
            let inv: Vec<f32> = (0..len).map(|i| 0.5 + (i % 3) as f32 * 0.25).collect();
            for s in [None, Some(&inv[..])] {
                let (lo, hi) = range(&x, s);
                let xs: Vec<f32> = match s {
                    Some(s) => x.iter().zip(s).map(|(a, b)| a * b).collect(),
                    None => x.clone(),
                };
                let lo_ref = xs.iter().fold(0f32, |a, &b| a.min(b));
                let hi_ref = xs.iter().fold(0f32, |a, &b| a.max(b));
                assert_eq!((lo, hi), (lo_ref, hi_ref), "len {len}");
                #[cfg(target_arch = "x86_64")]
                if crate::kernels::cpu_features().avx2_fma {
                    // SAFETY: the CPU has AVX2.
                    let avx2 = unsafe { avx2::range(&x, s) };
                    assert_eq!(avx2, (lo_ref, hi_ref), "avx2, len {len}");
                }
                let want: Vec<u8> = xs.iter().map(|&v| quantize_u8(v, 1.0, 7.0)).collect();
                for (name, quantize) in quantizers() {
                    let mut out = vec![0u8; len];
                    quantize(&x, s, 1.0, 7.0, &mut out);
                    assert_eq!(out, want, "{name}, len {len}");
                }
            }
        }
    }
}

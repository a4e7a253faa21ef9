//! Branch-free f32 elementary functions for the epilogue.
//!
//! They are written as plain scalar code with `mul_add` and selects so that LLVM vectorises the
//! epilogue loops that call them (the loops are compiled once per ISA with `#[target_feature]`);
//! the scalar and vector results are therefore computed by the same sequence of IEEE operations.
//!
//! Accuracy (tested against f64 in `tests/epilogue.rs`):
//! * [`exp`]: ≤ 2 ulp on [-87, 88].
//! * [`gelu_erf`]: relative error ≤ 1e-6 for x ≥ -5.75 ([`GELU_ERF_FLUSH`]); -0 below, where
//!   |gelu(x)| < 2.6e-8; it computes `Φ(−|x|)` (at most ½) for both signs, so there is no
//!   cancellation in `1 + erf`. It looks coefficients up in a table, which vectorised loops
//!   would gather: slices go through [`gelu_erf_slice`], whose AVX-512 form permutes instead.
//! * [`gelu_tanh`]: relative error ≤ 4e-6 for x ≥ -5 and ≤ 2e-5 below (the f32 rounding of the
//!   cubic argument `u` is amplified by `exp(-2u)` for negative x), absolute error ≤ 1e-30.

const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split so that `n * LN2_HI` is exact for |n| < 2^15 (Cody–Waite).
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;

/// `2^n` for integral `n` in [-126, 127] given as f32. Adding 1.5·2^23 + 127 puts the biased
/// exponent `n + 127` in the low mantissa bits (shifting left by 23 drops the rest), which
/// vectorises; the saturating `n as i32` cast would be scalarised.
#[inline(always)]
fn pow2i(n: f32) -> f32 {
    f32::from_bits((n + (12_582_912.0 + 127.0)).to_bits() << 23)
}

/// The low byte (two's complement) of an integral f32 in [-2^22, 2^22]: adding 1.5·2^23 puts
/// the integer in the low mantissa bits. Vectorises, unlike the saturating `as u8` / `as i8`
/// casts; callers round and clamp first.
///
/// ```
/// assert_eq!(codegen::kernels::math::int_byte(-1.0), 0xff);
/// assert_eq!(codegen::kernels::math::int_byte(200.0), 200);
/// ```
#[inline(always)]
pub fn int_byte(v: f32) -> u8 {
    (v + 12_582_912.0).to_bits() as u8
}

/// `clamp(round_half_even(v / scale) + zero_point, lo, hi)`, NaN as 0: ONNX `QuantizeLinear`'s
/// formula with its IEEE division (so that a quantization moved into a GEMM epilogue gives the
/// bytes the standalone one gave).
///
/// ```
/// use codegen::kernels::math::quantize_div;
/// assert_eq!(quantize_div(2.5, 1.0, 10.0, 0.0, 255.0), 12.0);
/// assert_eq!(quantize_div(f32::NAN, 0.1, 3.0, 0.0, 255.0), 3.0);
/// assert_eq!(quantize_div(-1e9, 0.1, 3.0, 0.0, 255.0), 0.0);
/// ```
#[inline(always)]
pub fn quantize_div(v: f32, scale: f32, zero_point: f32, lo: f32, hi: f32) -> f32 {
    let q = (v / scale).round_ties_even();
    let q = if q.is_nan() { 0.0 } else { q };
    (q + zero_point).clamp(lo, hi)
}

/// `exp(a + b)` where `a` is exact and may be large and `b` is small (|b| ≲ 2); the reduction
/// subtracts `n·ln2` from `a` before adding `b`, so the rounding of `a + b` does not leak into
/// the result. Returns 0 below about -87.3 and +inf above 88.7.
#[inline(always)]
pub fn exp_sum(a: f32, b: f32) -> f32 {
    let x = a + b;
    let y = exp_sum_in_range(a, b);
    let y = if x < EXP_ZERO_BELOW { 0.0 } else { y };
    if x > EXP_INF_ABOVE {
        f32::INFINITY
    } else {
        y
    }
}

/// [`exp_sum`] for callers that know `a + b` lies in [-87.3, 88.7]: the same bits there,
/// without the two range selects.
#[inline(always)]
fn exp_sum_in_range(a: f32, b: f32) -> f32 {
    let x = a + b;
    let n = (x * LOG2E).round_ties_even().clamp(-126.0, 127.0);
    let r = ((a - n * LN2_HI) - n * LN2_LO) + b;
    let r2 = r * r;
    let mut p = EXP_POLY[0];
    for &c in &EXP_POLY[1..] {
        p = p.mul_add(r, c);
    }
    let e = p.mul_add(r2, r) + 1.0;
    e * pow2i(n)
}

/// `(exp(r) − 1 − r)/r²` on [-ln2/2, ln2/2] in Horner order, highest power first.
const EXP_POLY: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    5e-1,
];
/// [`exp_sum`] is 0 below this sum and +inf above [`EXP_INF_ABOVE`].
const EXP_ZERO_BELOW: f32 = -87.336_55;
const EXP_INF_ABOVE: f32 = 88.722_83;

/// `255·2^t`, the numerator of a softmax whose probabilities are quantized to bytes, for `t` the
/// score less the row's maximum in log2 units (`t ≤ 0`, or NaN): `2^n · p(f)` with `t = n + f`,
/// `|f| ≤ 1/2`, `p` a degree-4 polynomial fitted to `255·2^f` in relative error (its constant
/// exactly 255, so the maximum's numerator is exactly 255), `2^n` applied with one rounding as
/// AVX-512's `vscalefps` does, so [`lanes16::softmax_numerator`] gives the same bits. Relative
/// error below 3e-6 wherever the result is normal: a thousandth of the rounding step of the
/// byte it becomes, and nothing the row's sum feels. 0 below about -160 (and for -inf); NaN
/// stays NaN. The scale of the scores carries `log2 e` and the bytes' 255 is in the
/// coefficients: eight vector operations from the shifted score to the numerator.
///
/// ```
/// use codegen::kernels::math::softmax_numerator;
/// let e = softmax_numerator(-1.5);
/// assert!((e - 255.0 * (-1.5f32).exp2()).abs() < 3e-6 * e);
/// assert_eq!(softmax_numerator(0.0), 255.0);
/// assert_eq!(softmax_numerator(f32::NEG_INFINITY), 0.0);
/// ```
#[inline(always)]
pub fn softmax_numerator(t: f32) -> f32 {
    // Far enough below the smallest subnormal, and -inf kept out of `t - n`.
    let t = if SOFTMAX_EXP_FLOOR > t {
        SOFTMAX_EXP_FLOOR
    } else {
        t
    };
    let n = t.round_ties_even();
    let f = t - n;
    let mut p = SOFTMAX_NUMERATOR_POLY[0];
    for &c in &SOFTMAX_NUMERATOR_POLY[1..] {
        p = p.mul_add(f, c);
    }
    scale_by_pow2(p, n)
}

/// `t` below which [`softmax_numerator`] is 0: `361·2^-160` is below half the smallest
/// subnormal.
const SOFTMAX_EXP_FLOOR: f32 = -160.0;

/// `p(f) ≈ 255·2^f` on [-1/2, 1/2] in Horner order (highest power first), fitted in relative
/// error with the constant fixed at 255 (Lawson's reweighted least squares, rounded to f32;
/// `scripts/softmax_poly.py`): relative error 2.9e-6 evaluated in f32 with one rounding per step.
const SOFTMAX_NUMERATOR_POLY: [f32; 5] = [2.443_615_7, 14.256_139, 61.261_45, 176.746_67, 255.0];

/// The byte of a [`softmax_numerator`] (in [0, 255.001], or NaN): rounded half to even, NaN as
/// 0; what AVX-512's conversion to integers (NaN as `i32::MIN`) and truncation to bytes make.
///
/// ```
/// use codegen::kernels::math::numerator_byte;
/// assert_eq!((numerator_byte(254.5), numerator_byte(3.5), numerator_byte(f32::NAN)), (254, 4, 0));
/// ```
#[inline(always)]
pub fn numerator_byte(e: f32) -> u8 {
    e.round_ties_even() as i32 as u8
}

/// `p · 2^n` rounded once (as `vscalefps`) for `p` in [0.5, 512] and integral `n` in
/// [-160, 127] (or NaN): exact while the result is normal; below, the product by `2^(n+126)` is
/// exact and the one by `2^-126` rounds once into the subnormals.
#[inline(always)]
fn scale_by_pow2(p: f32, n: f32) -> f32 {
    let low = n < -126.0;
    let m = if low { n + 126.0 } else { n };
    let y = p * pow2i(m.max(-126.0));
    if low {
        y * f32::from_bits(0x0080_0000)
    } else {
        y
    }
}

/// `exp(x)`, ≤ 2 ulp on the normal range.
///
/// ```
/// let e = codegen::kernels::math::exp(1.0);
/// assert!((e - std::f32::consts::E).abs() < 1e-6);
/// ```
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    exp_sum(x, 0.0)
}

/// The largest `|x|` of `v` (NaN ignored; 0 for an empty slice), in 16 independent lanes
/// folded by [`fold_lanes`]: vectorisable, and the same result on every CPU.
///
/// ```
/// assert_eq!(codegen::kernels::math::abs_max(&[1.0, -3.5, 2.0]), 3.5);
/// ```
#[inline(always)]
pub fn abs_max(v: &[f32]) -> f32 {
    let max = |a: f32, b: f32| if b > a { b } else { a };
    let mut acc = [0.0f32; 16];
    let mut chunks = v.chunks_exact(16);
    for c in &mut chunks {
        for l in 0..16 {
            acc[l] = max(acc[l], c[l].abs());
        }
    }
    for (a, &x) in acc.iter_mut().zip(chunks.remainder()) {
        *a = max(*a, x.abs());
    }
    fold_lanes(acc, max)
}

/// Symmetric 8-bit quantization of one row: `dst[i] = clamp(round_half_even(src[i]·127/amax),
/// ±127) + offset` as a byte (s8 bits for offset 0, u8 shifted by 128 for offset 128), `amax`
/// the row's [`abs_max`]. Returns the scale `amax/127` (0 for a row of zeros, whose bytes are
/// then all `offset`). NaN quantizes to 0. What int8 attention makes of a head of a query or a
/// key, in the QKV GEMM's epilogue and in the attention op alike.
///
/// ```
/// let mut q = [0u8; 3];
/// let s = codegen::kernels::math::quantize_sym(&[1.0, -2.0, 0.5], &mut q, 0);
/// assert_eq!((s, q), (2.0 / 127.0, [64, (-127i8) as u8, 32]));
/// ```
#[inline(always)]
pub fn quantize_sym(src: &[f32], dst: &mut [u8], offset: u8) -> f32 {
    let amax = abs_max(src);
    let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
    for (d, &x) in dst.iter_mut().zip(src) {
        let q = (x * inv).round_ties_even();
        let q = if q.is_nan() {
            0.0
        } else {
            q.clamp(-127.0, 127.0)
        };
        *d = int_byte(q).wrapping_add(offset);
    }
    amax / 127.0
}

/// Below this, |gelu(x)| < 2.6e-8 and [`gelu_erf`] returns -0.
pub const GELU_ERF_FLUSH: f32 = -5.75;

/// Pieces of [`gelu_erf`]'s tail table over `|x| ∈ [0, 5.75]`.
const PHI_PIECES: usize = 32;
/// Degree of [`gelu_erf`]'s polynomial in each piece.
const PHI_DEGREE: usize = 5;
/// Piece positions per unit of `|x|`: `v = |x|·PHI_SCALE` runs over `[0, 31.25]`, so that
/// `round(v)`, the piece, is at most 31 (the last piece is a three-quarter one).
const PHI_SCALE: f32 = (PHI_PIECES as f32 - 0.75) / -GELU_ERF_FLUSH;
/// 1.5·2^23: `v + PHI_ROUND` rounded once to f32 is `PHI_ROUND + round(v)` (ties to even) for
/// `v ∈ [0, 2^22)`, the integer in its low mantissa bits, so the piece index needs no
/// conversion to an integer.
const PHI_ROUND: f32 = 12_582_912.0;

/// `Φ(−a)` on piece `k` of `a ∈ [0, 5.75]` (the `a` with `round(a·PHI_SCALE) = k`, ties to
/// even; `a = (k + t)/PHI_SCALE` with `t ∈ [−½, ½]`, and `PHI_SCALE` the f32 it is) is
/// `Σ_d PHI_TAIL[d][k]·tᵈ`: degree-5 fits in relative error, reweighted towards minimax
/// (Lawson), rounded to f32 (`scripts/gelu_table.py` makes the table; relative error 5.8e-7
/// with the f32 evaluation on a dense grid of t).
static PHI_TAIL: [[f32; PHI_PIECES]; PHI_DEGREE + 1] = [
    [
        0.5,
        0.42700672,
        0.3564366,
        0.29047418,
        0.23086534,
        0.17878638,
        0.13479656,
        0.098872975,
        0.07051043,
        0.048860908,
        0.032884117,
        0.021485073,
        0.013622135,
        0.00837842,
        0.0049975314,
        0.0028900676,
        0.0016199998,
        0.0008800007,
        0.00046315763,
        0.00023614429,
        0.000116616946,
        5.5772594e-05,
        2.5828565e-05,
        1.1581117e-05,
        5.027203e-06,
        2.112454e-06,
        8.5920317e-07,
        3.382347e-07,
        1.2886149e-07,
        4.750969e-08,
        1.6949981e-08,
        5.8514e-09,
    ],
    [
        -0.07340538,
        -0.07217323,
        -0.0685995,
        -0.06303217,
        -0.055988662,
        -0.048076678,
        -0.039908495,
        -0.032025266,
        -0.024843724,
        -0.018631043,
        -0.013506853,
        -0.009466026,
        -0.0064132437,
        -0.0042003384,
        -0.0026594228,
        -0.0016277474,
        -0.0009631261,
        -0.00055090385,
        -0.0003046246,
        -0.0001628361,
        -8.41459e-05,
        -4.2035063e-05,
        -2.0299576e-05,
        -9.476735e-06,
        -4.2768797e-06,
        -1.8659149e-06,
        -7.8696087e-07,
        -3.2085657e-07,
        -1.2646352e-07,
        -4.818547e-08,
        -1.774857e-08,
        -6.3198846e-09,
    ],
    [
        -3.4912923e-10,
        0.0012217466,
        0.0023225013,
        0.0032010216,
        0.0037911003,
        0.0040692072,
        0.004053424,
        0.0037948657,
        0.0033644375,
        0.0028384784,
        0.002286442,
        0.0017626516,
        0.0013027621,
        0.0009243443,
        0.0006302625,
        0.0004133178,
        0.0002608607,
        0.0001585367,
        9.282009e-05,
        5.2373067e-05,
        2.8488244e-05,
        1.4942819e-05,
        7.5597904e-06,
        3.6896486e-06,
        1.7375397e-06,
        7.896343e-07,
        3.4635227e-07,
        1.4664366e-07,
        5.9938856e-08,
        2.36535e-08,
        9.012841e-09,
        3.316486e-09,
    ],
    [
        0.00041420484,
        0.00039346074,
        0.00033466253,
        0.00024729446,
        0.0001447889,
        4.1668074e-05,
        -4.927546e-05,
        -0.00011907617,
        -0.00016356487,
        -0.00018316883,
        -0.00018181684,
        -0.00016539857,
        -0.00014023665,
        -0.00011190829,
        -8.457162e-05,
        -6.078158e-05,
        -4.166794e-05,
        -2.7307029e-05,
        -1.7136455e-05,
        -1.03113025e-05,
        -5.955368e-06,
        -3.304281e-06,
        -1.7624806e-06,
        -9.042864e-07,
        -4.4651665e-07,
        -2.1227717e-07,
        -9.7198885e-08,
        -4.287943e-08,
        -1.8229994e-08,
        -7.47101e-09,
        -2.9520297e-09,
        -1.1240402e-09,
    ],
    [
        -9.276183e-09,
        -1.02028425e-05,
        -1.8732495e-05,
        -2.4295708e-05,
        -2.6249329e-05,
        -2.4689449e-05,
        -2.034897e-05,
        -1.4352851e-05,
        -7.916917e-06,
        -2.079981e-06,
        2.4673411e-06,
        5.434057e-06,
        6.8771137e-06,
        7.0873584e-06,
        6.4595692e-06,
        5.3830604e-06,
        4.1719277e-06,
        3.0369706e-06,
        2.089802e-06,
        1.3652789e-06,
        8.4946964e-07,
        5.045431e-07,
        2.8658408e-07,
        1.5589202e-07,
        8.1303305e-08,
        4.0692075e-08,
        1.955983e-08,
        9.035594e-09,
        4.01352e-09,
        1.715054e-09,
        7.053306e-10,
        2.7643438e-10,
    ],
    [
        -2.0912487e-06,
        -1.9239758e-06,
        -1.440509e-06,
        -7.5742696e-07,
        -2.0627095e-08,
        6.262293e-07,
        1.0768825e-06,
        1.2830155e-06,
        1.256024e-06,
        1.0526824e-06,
        7.5193157e-07,
        4.3144385e-07,
        1.505872e-07,
        -5.72261e-08,
        -1.8348813e-07,
        -2.37893e-07,
        -2.3967726e-07,
        -2.099679e-07,
        -1.6671066e-07,
        -1.2241662e-07,
        -8.409941e-08,
        -5.4448048e-08,
        -3.3384875e-08,
        -1.9454715e-08,
        -1.0803014e-08,
        -5.727736e-09,
        -2.9042035e-09,
        -1.4100376e-09,
        -6.562177e-10,
        -2.9299166e-10,
        -1.255946e-10,
        -5.8192923e-11,
    ],
];

/// GELU with the exact (erf) formulation, `x · Φ(x)`.
///
/// `Φ(−|x|)` is a degree-5 polynomial in the position within one of 32 pieces of `[0, 5.75]`,
/// centred on the integers of `|x|·PHI_SCALE`, so that the piece is that product rounded,
/// read from the low bits of one fused multiply-add with 1.5·2^23 (three vector operations
/// where a floor, a conversion to integers and back and a clamp took five), its coefficients
/// looked up by piece ([`PHI_TAIL`]); `Φ(x) = 1 − Φ(−x)` for `x ≥ 0`, which loses nothing
/// since `Φ(−x) ≤ ½` there. Relative error ≤ 1e-6 for x ≥ -5.75
/// ([`GELU_ERF_FLUSH`]), where the result becomes -0 (absolute error < 2.6e-8, under an ulp of
/// any activation it is summed with). No `exp` and no division: 5 FMAs and 6 table lookups,
/// which AVX-512 makes register permutes ([`gelu_erf_slice`]); the former `exp(−z²)·R(z)` form
/// with a degree-15 `R` took 40 vector operations per 16 values and was the largest cost of
/// the FFN1 epilogue, and a degree-7 table (7 FMAs, 8 lookups) kept the FFN1 chain waiting on
/// its FMAs' latency. Every implementation (scalar, the AVX-512 one) runs this sequence of IEEE
/// operations, so results never depend on the CPU.
///
/// ```
/// let g = codegen::kernels::math::gelu_erf(1.0);
/// assert!((g - 0.841_344_7).abs() < 1e-6);
/// assert_eq!(codegen::kernels::math::gelu_erf(-6.0), 0.0);
/// ```
#[inline(always)]
pub fn gelu_erf(x: f32) -> f32 {
    // NaN: min keeps the number, x·phi brings the NaN back; ±inf lands on the ends.
    let ax = x.abs().min(-GELU_ERF_FLUSH);
    // The piece, `round(ax·PHI_SCALE)`, in the low bits of `rounded`, and the position in it
    // from one rounding of `ax·PHI_SCALE − piece` (rounding the product first would cost the
    // tail 4e-6 of relative accuracy: an ulp of 32 is 4e-6).
    let rounded = ax.mul_add(PHI_SCALE, PHI_ROUND);
    let piece = rounded - PHI_ROUND;
    let t = ax.mul_add(PHI_SCALE, -piece);
    let i = (rounded.to_bits() & (PHI_PIECES as u32 - 1)) as usize;
    let mut p = PHI_TAIL[PHI_DEGREE][i];
    for k in (0..PHI_DEGREE).rev() {
        p = p.mul_add(t, PHI_TAIL[k][i]);
    }
    let phi = if x < 0.0 { p } else { 1.0 - p };
    if x < GELU_ERF_FLUSH {
        -0.0
    } else {
        x * phi
    }
}

/// [`gelu_erf`] of every element of `v`, in place: with AVX-512 sixteen at a time, the table
/// lookups as two-register permutes (the same operations, so the same bits).
///
/// ```
/// let mut v = [1.0f32, -6.0, 0.25];
/// codegen::kernels::math::gelu_erf_slice(&mut v);
/// assert_eq!(v, [1.0f32, -6.0, 0.25].map(codegen::kernels::math::gelu_erf));
/// ```
#[inline]
pub fn gelu_erf_slice(v: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        let f = super::select::cpu_features();
        if f.avx512 {
            // SAFETY: the CPU has AVX-512F.
            return unsafe { gelu_erf_avx512(v) };
        }
        if f.avx2_fma {
            // SAFETY: the CPU has AVX2 and FMA.
            return unsafe { gelu_erf_avx2(v) };
        }
    }
    v.iter_mut().for_each(|x| *x = gelu_erf(*x));
}

/// [`gelu_erf_slice`] with AVX2 (CPUs without AVX-512), eight at a time: the 32-entry
/// coefficient lookups as four 8-entry permutes and three blends on the index's bits 3 and 4.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gelu_erf_avx2(v: &mut [f32]) {
    use std::arch::x86_64::*;
    let k = GeluErf256::new();
    let mut chunks = v.chunks_exact_mut(8);
    for x8 in &mut chunks {
        // SAFETY: 8 floats of the slice.
        unsafe { _mm256_storeu_ps(x8.as_mut_ptr(), k.apply(_mm256_loadu_ps(x8.as_ptr()))) };
    }
    for x in chunks.into_remainder() {
        *x = gelu_erf(*x);
    }
}

/// [`gelu_erf`] on 8 lanes (AVX2 + FMA), the piece table as four vectors per coefficient.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct GeluErf256 {
    c: [[std::arch::x86_64::__m256; 4]; PHI_DEGREE + 1],
}

#[cfg(target_arch = "x86_64")]
impl GeluErf256 {
    #[target_feature(enable = "avx2,fma")]
    fn new() -> GeluErf256 {
        use std::arch::x86_64::*;
        // SAFETY: each row of the table holds 32 floats: four 8-float loads.
        let table = |k: usize| {
            std::array::from_fn(|q| unsafe { _mm256_loadu_ps(PHI_TAIL[k].as_ptr().add(8 * q)) })
        };
        GeluErf256 {
            c: std::array::from_fn(table),
        }
    }

    /// `gelu_erf` of each lane, bit for bit.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn apply(&self, x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        let scale = _mm256_set1_ps(PHI_SCALE);
        // |x|, then min(|x|, 5.75) with the number kept over a NaN (as f32::min: `minps`
        // returns its second operand when one is NaN).
        let abs = _mm256_andnot_ps(_mm256_set1_ps(-0.0), x);
        let ax = _mm256_min_ps(abs, _mm256_set1_ps(-GELU_ERF_FLUSH));
        let rounded = _mm256_fmadd_ps(ax, scale, _mm256_set1_ps(PHI_ROUND));
        let piece = _mm256_sub_ps(rounded, _mm256_set1_ps(PHI_ROUND));
        let t = _mm256_fmsub_ps(ax, scale, piece);
        let i = _mm256_castps_si256(rounded);
        // Bits 3 and 4 of the piece moved to the sign bit, which `blendv` reads.
        let bit3 = _mm256_castsi256_ps(_mm256_slli_epi32::<28>(i));
        let bit4 = _mm256_castsi256_ps(_mm256_slli_epi32::<27>(i));
        let coef = |k: usize| {
            let [t0, t1, t2, t3] = self.c[k];
            let lo = _mm256_blendv_ps(
                _mm256_permutevar8x32_ps(t0, i),
                _mm256_permutevar8x32_ps(t1, i),
                bit3,
            );
            let hi = _mm256_blendv_ps(
                _mm256_permutevar8x32_ps(t2, i),
                _mm256_permutevar8x32_ps(t3, i),
                bit3,
            );
            _mm256_blendv_ps(lo, hi, bit4)
        };
        let mut p = coef(PHI_DEGREE);
        for k in (0..PHI_DEGREE).rev() {
            p = _mm256_fmadd_ps(p, t, coef(k));
        }
        // `if x < 0 { p } else { 1 − p }` and `if x < FLUSH { −0 } else { x·phi }`: not-less-
        // than is true for NaN, as the comparisons in `gelu_erf` are false.
        let not_negative = _mm256_cmp_ps::<_CMP_NLT_UQ>(x, _mm256_setzero_ps());
        let phi = _mm256_blendv_ps(p, _mm256_sub_ps(_mm256_set1_ps(1.0), p), not_negative);
        let kept = _mm256_cmp_ps::<_CMP_NLT_UQ>(x, _mm256_set1_ps(GELU_ERF_FLUSH));
        _mm256_blendv_ps(_mm256_set1_ps(-0.0), _mm256_mul_ps(x, phi), kept)
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn gelu_erf_avx512(v: &mut [f32]) {
    use std::arch::x86_64::*;
    let k = GeluErf512::new();
    let mut chunks = v.chunks_exact_mut(16);
    for x16 in &mut chunks {
        // SAFETY: 16 floats of the slice.
        unsafe { _mm512_storeu_ps(x16.as_mut_ptr(), k.apply(_mm512_loadu_ps(x16.as_ptr()))) };
    }
    for x in chunks.into_remainder() {
        *x = gelu_erf(*x);
    }
}

/// [`gelu_erf`] on 16 lanes: the piece table in registers, loaded once by [`GeluErf512::new`]
/// for a whole slice or epilogue block.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(crate) struct GeluErf512 {
    c: [(std::arch::x86_64::__m512, std::arch::x86_64::__m512); PHI_DEGREE + 1],
}

#[cfg(target_arch = "x86_64")]
impl GeluErf512 {
    #[target_feature(enable = "avx512f")]
    pub(crate) fn new() -> GeluErf512 {
        use std::arch::x86_64::*;
        let table = |k: usize| {
            // SAFETY: each row of the table holds 32 floats: two 16-float loads.
            unsafe {
                (
                    _mm512_loadu_ps(PHI_TAIL[k].as_ptr()),
                    _mm512_loadu_ps(PHI_TAIL[k].as_ptr().add(16)),
                )
            }
        };
        GeluErf512 {
            c: std::array::from_fn(table),
        }
    }

    /// `gelu_erf` of each lane, bit for bit.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(crate) fn apply(&self, x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        let scale = _mm512_set1_ps(PHI_SCALE);
        // |x|, then min(|x|, 5.75) with the number kept over a NaN (as f32::min).
        let ax = _mm512_min_ps(_mm512_abs_ps(x), _mm512_set1_ps(-GELU_ERF_FLUSH));
        // The piece in the low bits of `rounded` (the permutes read only those), no conversion.
        let rounded = _mm512_fmadd_ps(ax, scale, _mm512_set1_ps(PHI_ROUND));
        let piece = _mm512_sub_ps(rounded, _mm512_set1_ps(PHI_ROUND));
        let t = _mm512_fmsub_ps(ax, scale, piece);
        let i = _mm512_castps_si512(rounded);
        let coef = |k: usize| _mm512_permutex2var_ps(self.c[k].0, i, self.c[k].1);
        let mut p = coef(PHI_DEGREE);
        for k in (0..PHI_DEGREE).rev() {
            p = _mm512_fmadd_ps(p, t, coef(k));
        }
        // `if x < 0 { p } else { 1 − p }` and `if x < FLUSH { −0 } else { x·phi }` as masked
        // operations (a NaN x takes the else sides, as the comparisons in `gelu_erf` do).
        let not_negative = _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(x, _mm512_setzero_ps());
        let phi = _mm512_mask_sub_ps(p, not_negative, _mm512_set1_ps(1.0), p);
        let kept = _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(x, _mm512_set1_ps(GELU_ERF_FLUSH));
        _mm512_mask_mul_ps(_mm512_set1_ps(-0.0), kept, x, phi)
    }
}

/// GELU with the tanh approximation, `x/2 · (1 + tanh(√(2/π)(x + 0.044715x³)))`, computed as
/// `x / (1 + exp(-2u))` (no cancellation for negative x).
///
/// ```
/// let g = codegen::kernels::math::gelu_tanh(1.0);
/// assert!((g - 0.841_192).abs() < 1e-5);
/// ```
#[inline(always)]
pub fn gelu_tanh(x: f32) -> f32 {
    const C: f32 = 0.797_884_6; // sqrt(2/pi)
    let x2 = x * x;
    let u = C * x * (0.044_715f32).mul_add(x2, 1.0);
    let e = exp(-2.0 * u);
    let y = x / (1.0 + e);
    if e == f32::INFINITY {
        0.0 * x
    } else {
        y
    }
}

/// Folds 16 lanes pairwise with `f` (lanes `l` and `l + 8`, then `l + 4`, `l + 2`, `l + 1`): a
/// fixed order, the same on every CPU, that a vector unit runs as four shuffles where a
/// sequential fold is a 16-long dependency chain. Reductions over 16 independent lanes end here.
///
/// ```
/// let lanes: [f32; 16] = std::array::from_fn(|i| i as f32);
/// assert_eq!(codegen::kernels::math::fold_lanes(lanes, |a, b| a + b), 120.0);
/// assert_eq!(codegen::kernels::math::fold_lanes(lanes, f32::max), 15.0);
/// ```
#[inline(always)]
pub fn fold_lanes(mut lanes: [f32; 16], f: impl Fn(f32, f32) -> f32) -> f32 {
    let mut half = 8;
    while half > 0 {
        for l in 0..half {
            lanes[l] = f(lanes[l], lanes[l + half]);
        }
        half /= 2;
    }
    lanes[0]
}

/// Sum with 16 independent lanes (element `i` to lane `i mod 16`, vectorisable), folded by
/// [`fold_lanes`]: the same order on every CPU.
///
/// ```
/// let v: Vec<f32> = (1..=20).map(|i| i as f32).collect();
/// assert_eq!(codegen::kernels::math::lane_sum(&v), 210.0);
/// ```
#[inline(always)]
pub fn lane_sum(y: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let mut ch = y.chunks_exact(16);
    for c in &mut ch {
        for j in 0..16 {
            acc[j] += c[j];
        }
    }
    for (a, v) in acc.iter_mut().zip(ch.remainder()) {
        *a += v;
    }
    fold_lanes(acc, |a, b| a + b)
}

/// Lanes of [`wide_sum`] and [`wide_sum_sq`]: four vectors of 16.
pub const WIDE_LANES: usize = 64;

/// Sum with 64 independent lanes (element `i` to lane `i mod 64`), the four vectors of 16 lanes
/// added as `(a0 + a1) + (a2 + a3)` lane by lane, then folded by [`fold_lanes`]: the order of
/// the epilogue LayerNorm's mean. Four vector accumulators keep four additions in flight where
/// [`lane_sum`]'s one waits for each before the next (a 768-wide row: 12 dependent additions
/// instead of 48).
///
/// ```
/// let v: Vec<f32> = (1..=100).map(|i| i as f32).collect();
/// assert_eq!(codegen::kernels::math::wide_sum(&v), 5050.0);
/// ```
#[inline(always)]
pub fn wide_sum(y: &[f32]) -> f32 {
    wide_fold(y, |acc, x| acc + x)
}

/// Sum of squares in the lanes and order of [`wide_sum`], each square added with one rounding
/// (`x.mul_add(x, acc)`): the epilogue LayerNorm's variance of the centred values.
///
/// ```
/// assert_eq!(codegen::kernels::math::wide_sum_sq(&[1.0, 2.0, 3.0]), 14.0);
/// ```
#[inline(always)]
pub fn wide_sum_sq(y: &[f32]) -> f32 {
    wide_fold(y, |acc, x| x.mul_add(x, acc))
}

#[inline(always)]
fn wide_fold(y: &[f32], add: impl Fn(f32, f32) -> f32) -> f32 {
    let mut acc = [0f32; WIDE_LANES];
    let mut ch = y.chunks_exact(WIDE_LANES);
    for c in &mut ch {
        for j in 0..WIDE_LANES {
            acc[j] = add(acc[j], c[j]);
        }
    }
    for (a, &v) in acc.iter_mut().zip(ch.remainder()) {
        *a = add(*a, v);
    }
    let lanes = std::array::from_fn(|l| (acc[l] + acc[16 + l]) + (acc[32 + l] + acc[48 + l]));
    fold_lanes(lanes, |a, b| a + b)
}

/// f32 → bf16 bits, round to nearest even; NaN stays NaN.
///
/// ```
/// assert_eq!(codegen::kernels::math::f32_to_bf16(1.0), 0x3f80);
/// ```
#[inline(always)]
pub fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    let r = b.wrapping_add(0x7fff + ((b >> 16) & 1));
    if x.is_nan() {
        ((b >> 16) as u16) | 0x40
    } else {
        (r >> 16) as u16
    }
}

/// bf16 bits → f32 (exact).
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// Sixteen lanes at a time with AVX-512, the same arithmetic as the scalar functions above
/// (and so the same bits), for kernels written with intrinsics.
///
/// The examples of the functions here live in this documentation: rustdoc does not collect
/// doc examples on `#[target_feature]` functions.
///
/// An example of [`lanes16::softmax_numerator`]:
///
/// ```
/// # #[cfg(target_arch = "x86_64")] {
/// if std::arch::is_x86_feature_detected!("avx512f") {
///     use codegen::kernels::math::{lanes16, softmax_numerator};
///     use std::arch::x86_64::*;
///     let mut y = [0f32; 16];
///     // SAFETY: the CPU has AVX-512F (and FMA, which every AVX-512 CPU has).
///     unsafe {
///         let e = lanes16::softmax_numerator(_mm512_set1_ps(-2.5));
///         _mm512_storeu_ps(y.as_mut_ptr(), e);
///     }
///     assert_eq!(y[7], softmax_numerator(-2.5));
/// }
/// # }
/// ```
///
/// An example of [`lanes16::quantize_div`]:
///
/// ```
/// # #[cfg(target_arch = "x86_64")] {
/// if std::arch::is_x86_feature_detected!("avx512f") {
///     use codegen::kernels::math::{lanes16, quantize_div};
///     use std::arch::x86_64::*;
///     let x = [0.5f32, 1.5, 2.5, -7.25, 1e9, -1e9, f32::NAN, 0.0, 3.3, 250.0, -0.5, 4.5, 126.5, 127.5, -128.5, 9.0];
///     let (mut f, mut q) = ([0f32; 16], [0i32; 16]);
///     // SAFETY: the CPU has AVX-512F.
///     unsafe {
///         let v = _mm512_loadu_ps(x.as_ptr());
///         _mm512_storeu_ps(f.as_mut_ptr(), lanes16::quantize_div(v, 0.5, 128.0, 0.0, 255.0));
///         _mm512_storeu_si512(q.as_mut_ptr().cast(), lanes16::quantize_div_i32(v, 0.5, 128.0, 0.0, 255.0));
///     }
///     for i in 0..16 {
///         assert_eq!(f[i], quantize_div(x[i], 0.5, 128.0, 0.0, 255.0));
///         assert_eq!(q[i], f[i] as i32);
///     }
/// }
/// # }
/// ```
///
/// An example of [`lanes16::quantize_mul_i32`] (ties, NaN and an out-of-range value among the
/// lanes: the unsure ones are made by the division):
///
/// ```
/// # #[cfg(target_arch = "x86_64")] {
/// if std::arch::is_x86_feature_detected!("avx512f") {
///     use codegen::kernels::math::{lanes16, quantize_div};
///     use std::arch::x86_64::*;
///     let x = [0.25f32, 0.75, 1.3, -7.25, 1e9, -1e9, f32::NAN, 0.0, 3.3, 127.0, -0.5, 4.5, 63.25, 63.75, -64.25, 9.0];
///     let (scale, zp) = (0.5, 128.0);
///     let recip = lanes16::requant_reciprocal(scale, zp, 0.0, 255.0);
///     let mut q = [0i32; 16];
///     // SAFETY: the CPU has AVX-512F.
///     let unsure = unsafe {
///         let v = _mm512_loadu_ps(x.as_ptr());
///         let (by_product, unsure) = lanes16::quantize_mul_i32(v, recip, zp, 0.0, 255.0);
///         let exact = lanes16::quantize_div_i32(v, scale, zp, 0.0, 255.0);
///         _mm512_storeu_si512(q.as_mut_ptr().cast(), _mm512_mask_mov_epi32(by_product, unsure, exact));
///         unsure
///     };
///     assert_ne!(unsure & (1 << 6), 0, "the NaN lane is left to the division");
///     for i in 0..16 {
///         assert_eq!(q[i], quantize_div(x[i], scale, zp, 0.0, 255.0) as i32);
///     }
/// }
/// # }
/// ```
///
/// An example of [`lanes16::fold_max`]:
///
/// ```
/// # #[cfg(target_arch = "x86_64")] {
/// if std::arch::is_x86_feature_detected!("avx512f") {
///     use std::arch::x86_64::*;
///     let lanes: [f32; 16] = std::array::from_fn(|i| (i as f32 - 5.0).abs());
///     // SAFETY: the CPU has AVX-512F.
///     let m = unsafe { codegen::kernels::math::lanes16::fold_max(_mm512_loadu_ps(lanes.as_ptr())) };
///     assert_eq!(m, 10.0);
/// }
/// # }
/// ```
///
/// An example of [`lanes16::fold_sum`]:
///
/// ```
/// # #[cfg(target_arch = "x86_64")] {
/// if std::arch::is_x86_feature_detected!("avx512f") {
///     use std::arch::x86_64::*;
///     // SAFETY: the CPU has AVX-512F.
///     let s = unsafe { codegen::kernels::math::lanes16::fold_sum(_mm512_set1_ps(0.5)) };
///     assert_eq!(s, 8.0);
/// }
/// # }
/// ```
#[cfg(target_arch = "x86_64")]
pub mod lanes16 {
    use std::arch::x86_64::*;

    /// [`super::softmax_numerator`] of each lane.
    ///
    /// # Safety
    /// Callable only where the CPU has AVX-512F and FMA (a caller without those target
    /// features must check them first).
    #[target_feature(enable = "avx512f,fma")]
    #[inline]
    pub fn softmax_numerator(t: __m512) -> __m512 {
        // `if FLOOR > t { FLOOR } else { t }`: max with the bound first keeps a NaN.
        let t = _mm512_max_ps(_mm512_set1_ps(super::SOFTMAX_EXP_FLOOR), t);
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t);
        let f = _mm512_sub_ps(t, n);
        let mut p = _mm512_set1_ps(super::SOFTMAX_NUMERATOR_POLY[0]);
        for &c in &super::SOFTMAX_NUMERATOR_POLY[1..] {
            p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
        }
        _mm512_scalef_ps(p, n)
    }

    /// [`super::exp`] for lanes that are at most 0 or NaN (a softmax's shifted scores), bit
    /// for bit, in 17 vector operations where the general form takes 24: there `n ≤ 0`, so the
    /// upper clamp and the +inf select never act; the lower clamp acts only where the result
    /// is then selected to 0; the rounding of `x·log2 e` (within ±2^22 wherever it matters) is
    /// the addition and subtraction of 1.5·2^23, two single operations; and `e·2^n` is one
    /// `vscalefps`, exact as the product by the normal power of two is for `n ≥ −126`, rounded
    /// once as it is. Positive lanes give unspecified values.
    ///
    /// # Safety
    /// Callable only where the CPU has AVX-512F and FMA.
    #[target_feature(enable = "avx512f,fma")]
    #[inline]
    pub fn exp_nonpositive(x: __m512) -> __m512 {
        let shifter = _mm512_set1_ps(12_582_912.0);
        let t = _mm512_mul_ps(x, _mm512_set1_ps(super::LOG2E));
        let n = _mm512_sub_ps(_mm512_add_ps(t, shifter), shifter);
        let r = _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(super::LN2_HI)));
        let r = _mm512_sub_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(super::LN2_LO)));
        let r2 = _mm512_mul_ps(r, r);
        let mut p = _mm512_set1_ps(super::EXP_POLY[0]);
        for &c in &super::EXP_POLY[1..] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        let e = _mm512_add_ps(_mm512_fmadd_ps(p, r2, r), _mm512_set1_ps(1.0));
        let below = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(super::EXP_ZERO_BELOW));
        _mm512_maskz_scalef_ps(!below, e, n)
    }

    /// [`super::quantize_div`] of each lane (`zero_point` an integer within `[lo, hi]`), the
    /// one vector form of the requantization the epilogues, the activation quantizer and the
    /// int8 attention's byte output all use. Rounding is monotonic and keeps integers, so
    /// clamping the quotient to the integral bounds less the zero point before rounding gives
    /// the same values, a NaN kept through the clamp (`max_ps` and `min_ps` return their second
    /// operand when either is NaN) and zeroed by the rounding's mask: one vector operation fewer
    /// than rounding, zeroing, adding and clamping in that order.
    ///
    /// # Safety
    /// Callable only where the CPU has AVX-512F.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub fn quantize_div(v: __m512, scale: f32, zero_point: f32, lo: f32, hi: f32) -> __m512 {
        let (q, ordered) = clamped_quotient(v, scale, zero_point, lo, hi);
        let q = _mm512_maskz_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            ordered, q,
        );
        _mm512_add_ps(q, _mm512_set1_ps(zero_point))
    }

    /// [`quantize_div`] as the integers it leaves, for a byte output: the clamped quotient
    /// rounded by the conversion itself (NaN lanes masked to 0) and the zero point added as an
    /// integer, in place of a rounding, a float addition and a conversion (same integers).
    ///
    /// # Safety
    /// Callable only where the CPU has AVX-512F.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub fn quantize_div_i32(v: __m512, scale: f32, zero_point: f32, lo: f32, hi: f32) -> __m512i {
        let (q, ordered) = clamped_quotient(v, scale, zero_point, lo, hi);
        let q = _mm512_maskz_cvt_roundps_epi32::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            ordered, q,
        );
        // The zero point is an integer of the output's range (the caller's contract): exact as
        // i32.
        _mm512_add_epi32(q, _mm512_set1_epi32(zero_point as i32))
    }

    /// How close to a half-integer the product with the reciprocal may come before
    /// [`quantize_mul_i32`] leaves a lane to the division: more than the product's worst distance
    /// to the IEEE quotient (below).
    const NEAR_HALF: f32 = 0.5 - 1.0 / 16384.0;

    /// The factor [`quantize_mul_i32`] multiplies by for [`quantize_div_i32`]`(·, scale,
    /// zero_point, lo, hi)`: `1 / scale` where that is a normal float and both bounds less the
    /// zero point lie within ±256 (u8 and s8 outputs), else NaN, for which every lane is left
    /// to the division.
    pub fn requant_reciprocal(scale: f32, zero_point: f32, lo: f32, hi: f32) -> f32 {
        let recip = 1.0 / scale;
        let bounded = (lo - zero_point).abs() <= 256.0 && (hi - zero_point).abs() <= 256.0;
        if recip.is_normal() && bounded {
            recip
        } else {
            f32::NAN
        }
    }

    /// [`quantize_div_i32`]'s integers made with the product `v · recip` (`recip` from
    /// [`requant_reciprocal`]) instead of the division, and the mask of the lanes whose integer
    /// it cannot vouch for: the caller makes those with [`quantize_div_i32`]. Every other lane
    /// is exact.
    ///
    /// The division takes the divider, one 16-lane quotient every ~10 cycles on Intel cores,
    /// where a requantization only needs the integer the quotient rounds to. With `recip =
    /// RN(1/scale)` (relative error ≤ 2⁻²⁴) the product `q = RN(v·recip)` lies within
    /// `3·2⁻²⁴·|v / scale|` of the quotient `RN(v / scale)`, less than 2⁻¹⁴ wherever `|v / scale|
    /// ≤ 257`: where `q` is farther than that from every half-integer, both round to the same
    /// integer; beyond 257 both clamp to the same bound (within ±256). A lane near a
    /// half-integer (about one in 8192), NaN or infinite (whose distance reads as NaN) is left
    /// to the division, and so is every lane when `recip` is NaN.
    ///
    /// # Safety
    /// Callable only where the CPU has AVX-512F.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub fn quantize_mul_i32(
        v: __m512,
        recip: f32,
        zero_point: f32,
        lo: f32,
        hi: f32,
    ) -> (__m512i, __mmask16) {
        let q = _mm512_mul_ps(v, _mm512_set1_ps(recip));
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(q);
        let off = _mm512_abs_ps(_mm512_sub_ps(q, n));
        // Not-less-than, true when unordered: NaN distances (NaN or infinite lanes) are unsure.
        let unsure = _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(off, _mm512_set1_ps(NEAR_HALF));
        let n = _mm512_min_ps(
            _mm512_set1_ps(hi - zero_point),
            _mm512_max_ps(_mm512_set1_ps(lo - zero_point), n),
        );
        // Integral values: the conversion is exact (NaN lanes are unsure).
        let n = _mm512_cvt_roundps_epi32::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(n);
        (
            _mm512_add_epi32(n, _mm512_set1_epi32(zero_point as i32)),
            unsure,
        )
    }

    /// [`quantize_mul_i32`] with its unsure lanes made by [`quantize_div_i32`]: the division's
    /// integers, the divider used by about one vector in 500. For loops of single vectors; a
    /// chain holding several vectors checks the group once instead (see its callers).
    ///
    /// # Safety
    /// Callable only where the CPU has AVX-512F.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub fn quantize_mul_or_div_i32(
        v: __m512,
        (scale, recip): (f32, f32),
        zero_point: f32,
        lo: f32,
        hi: f32,
    ) -> __m512i {
        let (q, unsure) = quantize_mul_i32(v, recip, zero_point, lo, hi);
        if unsure == 0 {
            q
        } else {
            quantize_div_i32(v, scale, zero_point, lo, hi)
        }
    }

    /// [`quantize_div_i32`]'s integers of the `N` vectors `x` (the lanes `masks` matter), each
    /// handed to `put(u, q)`: by the product with `recip` ([`requant_reciprocal`],
    /// [`quantize_mul_i32`]), the whole group handed again through the division when any of its
    /// lanes is unsure, so that the divider runs for about one group in sixty instead of for
    /// every vector. The group is checked once: a branch per vector made LLVM reload the GELU
    /// tables around each in the epilogue chains.
    ///
    /// # Safety
    /// Callable only where the CPU has AVX-512F.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub fn quantize_group_i32<const N: usize>(
        x: [__m512; N],
        masks: [__mmask16; N],
        (scale, recip): (f32, f32),
        zero_point: f32,
        lo: f32,
        hi: f32,
        mut put: impl FnMut(usize, __m512i),
    ) {
        let mut unsure = 0;
        for (u, &x) in x.iter().enumerate() {
            let (q, lanes) = quantize_mul_i32(x, recip, zero_point, lo, hi);
            unsure |= lanes & masks[u];
            put(u, q);
        }
        if unsure != 0 {
            for (u, &x) in x.iter().enumerate() {
                put(u, quantize_div_i32(x, scale, zero_point, lo, hi));
            }
        }
    }

    /// `v / scale` clamped to `[lo − zero_point, hi − zero_point]` (NaN kept), and the mask of
    /// its lanes that are not NaN: the part [`quantize_div`] and [`quantize_div_i32`] share.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn clamped_quotient(
        v: __m512,
        scale: f32,
        zero_point: f32,
        lo: f32,
        hi: f32,
    ) -> (__m512, __mmask16) {
        let q = _mm512_div_ps(v, _mm512_set1_ps(scale));
        let q = _mm512_min_ps(
            _mm512_set1_ps(hi - zero_point),
            _mm512_max_ps(_mm512_set1_ps(lo - zero_point), q),
        );
        (q, _mm512_cmp_ps_mask::<_CMP_ORD_Q>(q, q))
    }

    /// [`super::numerator_byte`] of each lane, as the 16 bytes of the result.
    ///
    /// # Safety
    /// Callable only where the CPU has AVX-512F.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub fn numerator_bytes(e: __m512) -> __m128i {
        // Within [0, 255.001] each lane converts to its byte's integer; NaN to i32::MIN, whose
        // low byte is 0.
        _mm512_cvtepi32_epi8(_mm512_cvt_roundps_epi32::<
            { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
        >(e))
    }

    /// [`super::fold_lanes`] of the lanes of `v` with `f` as a vector op: the same pairs in the
    /// same order (lanes `l` and `l + 8`, then `l + 4`, `l + 2`, `l + 1`), as four shuffles in
    /// registers instead of a store and fifteen scalar ops reading it back.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn fold(v: __m512, f: impl Fn(__m512, __m512) -> __m512) -> f32 {
        // Lane l + 8 onto lane l: the upper 256 bits (128-bit lanes 2 and 3) onto the lower.
        let v = f(v, _mm512_shuffle_f32x4::<0b11_10_11_10>(v, v));
        // l + 4: 128-bit lane 1 onto lane 0.
        let v = f(v, _mm512_shuffle_f32x4::<0b01_01_01_01>(v, v));
        // l + 2, then l + 1: within each 128-bit lane.
        let v = f(v, _mm512_permute_ps::<0b11_10_11_10>(v));
        let v = f(v, _mm512_permute_ps::<0b01_01_01_01>(v));
        _mm512_cvtss_f32(v)
    }

    /// `fold_lanes(lanes of v, |a, b| if b > a { b } else { a })`, bit for bit (a NaN never
    /// replaces what a lane holds, as in `math::abs_max` and `lane_max`).
    ///
    /// # Safety
    /// Callable only where the CPU has AVX-512F.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub fn fold_max(v: __m512) -> f32 {
        // `max_ps(b, a)` is `if b > a { b } else { a }`: a NaN or a tie gives the second.
        fold(v, |a, b| _mm512_max_ps(b, a))
    }

    /// `fold_lanes(lanes of v, |a, b| a + b)`, bit for bit.
    ///
    /// # Safety
    /// Callable only where the CPU has AVX-512F.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub fn fold_sum(v: __m512) -> f32 {
        fold(v, |a, b| _mm512_add_ps(a, b))
    }

    #[cfg(test)]
    pub(crate) mod tests {
        use super::*;

        /// A xorshift64 generator from `state` (not 0): the tests' random lanes.
        pub(crate) fn xorshift(mut state: u64) -> impl FnMut() -> u64 {
            move || {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state
            }
        }

        /// Both folds against `fold_lanes` bit for bit: random lanes across exponents, with
        /// NaNs (of several payloads), infinities, signed zeros, ties and subnormals mixed in at
        /// every position, so that each pairing order and each NaN/tie rule shows.
        #[test]
        fn folds_equal_fold_lanes() {
            if !std::arch::is_x86_feature_detected!("avx512f") {
                eprintln!("SKIP folds_equal_fold_lanes: no AVX-512F on this CPU");
                return;
            }
            let specials = [
                f32::NAN,
                f32::from_bits(0x7fc0_1234),
                -f32::NAN,
                f32::INFINITY,
                f32::NEG_INFINITY,
                0.0,
                -0.0,
                1.0,
                -1.0,
                f32::from_bits(1),
                f32::MAX,
                f32::MIN,
            ];
            let mut next = xorshift(0x9e37_79b9_7f4a_7c15u64);
            for case in 0..200_000 {
                let lanes: [f32; 16] = std::array::from_fn(|_| {
                    let r = next();
                    if case % 2 == 1 && r.is_multiple_of(5) {
                        specials[(r >> 8) as usize % specials.len()]
                    } else {
                        let e = ((r >> 8) % 60) as i32 - 30;
                        let m = ((r >> 16) % 2000) as f32 / 1000.0 - 1.0;
                        m * 2f32.powi(e)
                    }
                });
                // SAFETY: AVX-512F checked above; 16 floats of a local array.
                let v = unsafe { _mm512_loadu_ps(lanes.as_ptr()) };
                // SAFETY: as above.
                let (max, sum) = unsafe { (fold_max(v), fold_sum(v)) };
                let want_max = super::super::fold_lanes(lanes, |a, b| if b > a { b } else { a });
                let want_sum = super::super::fold_lanes(lanes, |a, b| a + b);
                assert_eq!(max.to_bits(), want_max.to_bits(), "max of {lanes:?}");
                assert!(
                    sum.to_bits() == want_sum.to_bits() || (sum.is_nan() && want_sum.is_nan()),
                    "sum of {lanes:?}: {sum:e} against {want_sum:e}"
                );
            }
        }

        /// The product path is only offered where its error bound holds: a normal reciprocal and
        /// bounds within ±256 of the zero point; elsewhere the factor is NaN and every lane is
        /// left to the division (and still gets the division's integer).
        #[test]
        fn requantization_by_product_declines_outside_its_bound() {
            if !std::arch::is_x86_feature_detected!("avx512f") {
                eprintln!(
                    "SKIP requantization_by_product_declines_outside_its_bound: no AVX-512F on this CPU"
                );
                return;
            }
            assert_eq!(requant_reciprocal(0.5, 128.0, 0.0, 255.0), 2.0);
            assert_eq!(requant_reciprocal(0.25, 0.0, -128.0, 127.0), 4.0);
            for (scale, zp, lo, hi) in [
                (0.5f32, 0.0f32, -1000.0f32, 1000.0f32),
                (0.5, 300.0, 0.0, 255.0),
                (0.0, 0.0, 0.0, 255.0),
                (f32::MAX, 0.0, 0.0, 255.0),
                (f32::from_bits(1), 0.0, 0.0, 255.0),
                (f32::NAN, 0.0, 0.0, 255.0),
            ] {
                let recip = requant_reciprocal(scale, zp, lo, hi);
                assert!(recip.is_nan(), "{scale:e} in [{lo}, {hi}] - {zp}: {recip}");
                let x: [f32; 16] = std::array::from_fn(|i| i as f32 * 0.75 - 4.0);
                let mut q = [0i32; 16];
                // SAFETY: AVX-512F checked above; 16-lane local arrays.
                let unsure = unsafe {
                    let v = _mm512_loadu_ps(x.as_ptr());
                    _mm512_storeu_si512(
                        q.as_mut_ptr().cast(),
                        quantize_mul_or_div_i32(v, (scale, recip), zp, lo, hi),
                    );
                    quantize_mul_i32(v, recip, zp, lo, hi).1
                };
                assert_eq!(unsure, !0, "{scale:e}: every lane to the division");
                for (x, q) in x.iter().zip(q) {
                    let want = super::super::quantize_div(*x, scale, zp, lo, hi) as i32;
                    assert_eq!(q, want, "{x} / {scale:e}");
                }
            }
        }

        /// The requantization by product gives the scalar `quantize_div`'s integers (its IEEE
        /// division) on every lane it vouches for, and with the division on the others: for scales
        /// across forty binades (and a subnormal, a huge and a negative one), every float within
        /// 40 ulps of each `(k + ½)·scale` for `|k| ≤ 300`, and random values up to ±2000
        /// quotients with NaNs, infinities and signed zeros mixed in; u8 and s8 ranges with zero
        /// points at and between their ends. The sweep must leave most vectors to the product
        /// path, or the test would only check the division.
        /// The AVX2 GELU (which AVX-512 CPUs never pick) against the scalar function, bit for
        /// bit: every piece boundary and its neighbours, a dense sweep of [-7, 7], the ends and
        /// the special values.
        #[test]
        fn gelu_erf_avx2_equals_the_scalar_function() {
            if !crate::kernels::cpu_features().avx2_fma {
                eprintln!("SKIP gelu_erf_avx2_equals_the_scalar_function: no AVX2/FMA on this CPU");
                return;
            }
            let mut xs: Vec<f32> = (0..=32)
                .flat_map(|i| {
                    let a = (i as f32 + 0.5) * 5.75 / 31.25;
                    let up = f32::from_bits(a.to_bits() + 1);
                    let down = f32::from_bits(a.to_bits() - 1);
                    [a, -a, up, -up, down, -down]
                })
                .collect();
            xs.extend([
                0.0,
                -0.0,
                f32::NAN,
                f32::INFINITY,
                f32::NEG_INFINITY,
                -5.75,
                -5.750001,
                5.75,
                1e30,
                -1e30,
                1e-40,
            ]);
            xs.extend((-70_000..=70_000).map(|i| i as f32 * 1e-4));
            for cut in [0, 1, 5] {
                let xs = &xs[..xs.len() - cut];
                let mut v = xs.to_vec();
                // SAFETY: AVX2 and FMA checked above.
                unsafe { super::super::gelu_erf_avx2(&mut v) };
                for (x, y) in xs.iter().zip(&v) {
                    let want = super::super::gelu_erf(*x);
                    assert!(
                        y.to_bits() == want.to_bits() || (y.is_nan() && want.is_nan()),
                        "x={x}: avx2 {y} vs scalar {want}"
                    );
                }
            }
        }

        #[test]
        fn requantization_by_product_equals_the_ieee_division() {
            if !std::arch::is_x86_feature_detected!("avx512f") {
                eprintln!(
                    "SKIP requantization_by_product_equals_the_ieee_division: no AVX-512F on this CPU"
                );
                return;
            }
            let mut next = xorshift(0x2545_f491_4f6c_dd1du64);
            let mut scales = vec![f32::from_bits(3), 3.0e37, -0.37, 1.0, 0.5];
            for _ in 0..60 {
                let r = next();
                let e = (r % 40) as i32 - 30;
                scales.push((1.0 + (r >> 8) as f32 / (1u64 << 56) as f32) * 2f32.powi(e));
            }
            let ranges = [
                (0.0f32, 255.0f32, [0.0f32, 3.0, 128.0, 255.0]),
                (-128.0, 127.0, [-128.0, -5.0, 0.0, 127.0]),
            ];
            let (mut lanes_seen, mut lanes_unsure, mut vectors, mut vectors_sure) = (0, 0, 0, 0);
            for &scale in &scales {
                let mut xs = Vec::new();
                for k in -300..=300 {
                    let h = (k as f32 + 0.5) * scale;
                    for d in -40i32..=40 {
                        xs.push(f32::from_bits((h.to_bits() as i32 + d) as u32));
                    }
                }
                let random_from = xs.len();
                for i in 0..8000 {
                    let r = next();
                    let q = (r >> 11) as f32 / (1u64 << 53) as f32 * 4000.0 - 2000.0;
                    xs.push(match (i % 7, r % 23) {
                        (0, 0) => f32::NAN,
                        (0, 1) => f32::INFINITY,
                        (0, 2) => f32::NEG_INFINITY,
                        (0, 3) => -0.0,
                        _ => q * scale,
                    });
                }
                for (lo, hi, zps) in ranges {
                    for zp in zps {
                        let recip = requant_reciprocal(scale, zp, lo, hi);
                        for (at, chunk) in xs.chunks(16).enumerate() {
                            let mut lanes = [0f32; 16];
                            lanes[..chunk.len()].copy_from_slice(chunk);
                            let (mut by_product, mut either) = ([0i32; 16], [0i32; 16]);
                            // SAFETY: AVX-512F checked above; 16-lane local arrays.
                            let unsure = unsafe {
                                let v = _mm512_loadu_ps(lanes.as_ptr());
                                let (q, unsure) = quantize_mul_i32(v, recip, zp, lo, hi);
                                _mm512_storeu_si512(by_product.as_mut_ptr().cast(), q);
                                _mm512_storeu_si512(
                                    either.as_mut_ptr().cast(),
                                    quantize_mul_or_div_i32(v, (scale, recip), zp, lo, hi),
                                );
                                unsure
                            };
                            for (i, &x) in lanes.iter().enumerate() {
                                let want = super::super::quantize_div(x, scale, zp, lo, hi) as i32;
                                let what =
                                    format!("{x:e} / {scale:e}, zero point {zp} in [{lo}, {hi}]");
                                if unsure & (1 << i) == 0 {
                                    assert_eq!(by_product[i], want, "{what}, by product");
                                }
                                assert_eq!(either[i], want, "{what}");
                            }
                            if 16 * at >= random_from
                                && recip.is_finite()
                                && lanes.iter().all(|x| x.is_finite())
                            {
                                lanes_seen += 16;
                                lanes_unsure += unsure.count_ones();
                                vectors += 1;
                                vectors_sure += usize::from(unsure == 0);
                            }
                        }
                    }
                }
            }
            // Random finite values: about one lane in 8192 unsure, nearly every vector wholly by
            // product.
            assert!(
                lanes_unsure as f64 <= 1e-3 * lanes_seen as f64,
                "{lanes_unsure} of {lanes_seen} lanes unsure"
            );
            assert!(
                vectors_sure * 50 >= vectors * 49,
                "{vectors_sure} of {vectors} vectors by product"
            );
        }

        /// [`exp_nonpositive`] bit for bit the scalar [`super::super::exp`] wherever it is
        /// defined: a dense sweep of [-110, 0], every float around the cut-off, zero and the
        /// smallest magnitudes, the most negative floats, -inf and NaNs.
        #[test]
        fn exp_nonpositive_equals_the_scalar_function() {
            if !std::arch::is_x86_feature_detected!("avx512f") {
                eprintln!(
                    "SKIP exp_nonpositive_equals_the_scalar_function: no AVX-512F on this CPU"
                );
                return;
            }
            let mut xs: Vec<f32> = (-1_100_000..=0).map(|i| i as f32 * 1e-4).collect();
            for edge in [
                super::super::EXP_ZERO_BELOW,
                -1e-30,
                -126.0 / super::super::LOG2E,
            ] {
                for k in 0..3000 {
                    xs.push(f32::from_bits(edge.to_bits() + k));
                    xs.push(f32::from_bits(edge.to_bits() - k));
                }
            }
            for k in 0..3000u32 {
                xs.push(f32::from_bits(0x8000_0000 | k));
                xs.push(-(4_194_304.0 + k as f32 * 0.5));
            }
            xs.extend([
                -0.0,
                0.0,
                f32::NEG_INFINITY,
                f32::NAN,
                -f32::NAN,
                f32::MIN,
                -1e30,
            ]);
            xs.push(f32::from_bits(0xffc0_1234));
            for chunk in xs.chunks(16) {
                let mut a = [0f32; 16];
                a[..chunk.len()].copy_from_slice(chunk);
                let mut y = [0f32; 16];
                // SAFETY: AVX-512F checked above (every such CPU has FMA).
                unsafe {
                    _mm512_storeu_ps(y.as_mut_ptr(), exp_nonpositive(_mm512_loadu_ps(a.as_ptr())))
                };
                for (&x, &y) in a.iter().zip(&y) {
                    let want = super::super::exp(x);
                    assert!(
                        y.to_bits() == want.to_bits() || (y.is_nan() && want.is_nan()),
                        "exp_nonpositive({x:e}) = {y:e}, scalar {want:e}"
                    );
                }
            }
        }

        /// Bit for bit the scalar functions (numerator and byte) on a dense sweep of [-170,
        /// 0.5], every float near the subnormal boundary, the floor and the half-integers, and
        /// the special values; the numerator within 3e-6 of `255·2^t` (f64) wherever it is
        /// normal, the byte that value rounded half to even.
        #[test]
        fn softmax_numerator_equals_the_scalar_function_and_is_accurate() {
            if !std::arch::is_x86_feature_detected!("avx512f") {
                eprintln!(
                    "SKIP softmax_numerator_equals_the_scalar_function: no AVX-512F on this CPU"
                );
                return;
            }
            let mut ts: Vec<f32> = (-1_700_000..=5_000).map(|i| i as f32 * 1e-4).collect();
            for edge in [
                -0.5f32, -1.5, -125.5, -126.0, -134.0, -149.0, -157.0, -160.0, -160.5,
            ] {
                // Negative: bits up is away from zero, down towards it.
                for k in 0..1000 {
                    ts.push(f32::from_bits(edge.to_bits() + k));
                    ts.push(f32::from_bits(edge.to_bits() - k));
                }
            }
            ts.extend([-0.0, f32::NEG_INFINITY, f32::NAN, f32::MIN, -1e-30]);
            let mut worst = 0f64;
            for chunk in ts.chunks(16) {
                let mut a = [0f32; 16];
                a[..chunk.len()].copy_from_slice(chunk);
                let mut y = [0f32; 16];
                let mut bytes = [0u8; 16];
                // SAFETY: AVX-512F checked above (every such CPU has FMA).
                unsafe {
                    let e = softmax_numerator(_mm512_loadu_ps(a.as_ptr()));
                    _mm512_storeu_ps(y.as_mut_ptr(), e);
                    _mm_storeu_si128(bytes.as_mut_ptr() as *mut __m128i, numerator_bytes(e));
                };
                for ((&t, &y), &byte) in a.iter().zip(&y).zip(&bytes) {
                    let want = super::super::softmax_numerator(t);
                    assert!(
                        y.to_bits() == want.to_bits() || (y.is_nan() && want.is_nan()),
                        "softmax_numerator({t:e}) = {y:e}, scalar {want:e}"
                    );
                    assert_eq!(byte, super::super::numerator_byte(y), "byte of {y:e}");
                    let exact = 255.0 * (t as f64).exp2();
                    if exact >= f32::MIN_POSITIVE as f64 && t <= 0.0 {
                        let e = (y as f64 - exact).abs() / exact;
                        worst = worst.max(e);
                        // The byte of the exact value, but for a tie the error could tip.
                        if (exact - exact.floor() - 0.5).abs() > 1e-3 {
                            assert_eq!(byte as f64, exact.round(), "byte of 255·2^{t:e}");
                        }
                    }
                }
            }
            assert!(worst < 3e-6, "relative error {worst:e}");
            println!("softmax_numerator: worst relative error {worst:.2e} where normal");
        }

        /// The bytes of numerators, including ties, out-of-range values and NaN, against the
        /// scalar function.
        #[test]
        fn numerator_bytes_equal_the_scalar_function() {
            if !std::arch::is_x86_feature_detected!("avx512f") {
                eprintln!(
                    "SKIP numerator_bytes_equal_the_scalar_function: no AVX-512F on this CPU"
                );
                return;
            }
            let mut xs: Vec<f32> = (0..=2560).map(|i| i as f32 * 0.1).collect();
            xs.extend((0..=255).map(|i| i as f32 + 0.5));
            xs.extend([0.0, -0.0, f32::NAN, 1e-40, 255.001, 0.49999997, 0.50000006]);
            for chunk in xs.chunks(16) {
                let mut a = [0f32; 16];
                a[..chunk.len()].copy_from_slice(chunk);
                let mut bytes = [0u8; 16];
                // SAFETY: AVX-512F checked above.
                unsafe {
                    let b = numerator_bytes(_mm512_loadu_ps(a.as_ptr()));
                    _mm_storeu_si128(bytes.as_mut_ptr() as *mut __m128i, b);
                }
                for (&x, &b) in a.iter().zip(&bytes) {
                    assert_eq!(b, super::super::numerator_byte(x), "byte of {x:e}");
                }
            }
        }
    }
}

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
    let y = if x < -87.336_55 { 0.0 } else { y };
    if x > 88.722_83 {
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
    let mut p = 1.987_569_1e-4f32;
    p = p.mul_add(r, 1.398_199_9e-3);
    p = p.mul_add(r, 8.333_452e-3);
    p = p.mul_add(r, 4.166_579_6e-2);
    p = p.mul_add(r, 1.666_666_5e-1);
    p = p.mul_add(r, 5e-1);
    let e = p.mul_add(r2, r) + 1.0;
    e * pow2i(n)
}

/// `exp(x)` for the numerators of a softmax whose result is quantized to 8 bits (`x = s − max`,
/// so `x ≤ 0` or NaN): `2^n · p(f)` with `x·log2 e = n + f`, `|f| ≤ 1/2`, `p` the degree-6
/// Taylor polynomial of `2^f`, `2^n` applied with one rounding as AVX-512's `vscalefps` does,
/// so [`lanes16::softmax_exp`] gives the same bits. Relative error below 4e-6 on [-80, 0] (the
/// rounding of `x·log2 e` at large `|x|`; 7e-7 on [-10, 0]): a thousandth of the rounding step of
/// `255·e` and nothing a softmax's sum feels. 0 below about -110 (and for -inf); NaN stays NaN.
/// Ten vector operations where [`exp`] takes twenty-two.
///
/// ```
/// let e = codegen::kernels::math::softmax_exp(-1.0);
/// assert!((e - (-1.0f32).exp()).abs() < 4e-6 * e);
/// assert_eq!(codegen::kernels::math::softmax_exp(0.0), 1.0);
/// assert_eq!(codegen::kernels::math::softmax_exp(f32::NEG_INFINITY), 0.0);
/// ```
#[inline(always)]
pub fn softmax_exp(x: f32) -> f32 {
    let t = x * LOG2E;
    // Far enough below the smallest subnormal, and -inf kept out of `t - n`.
    let t = if SOFTMAX_EXP_FLOOR > t {
        SOFTMAX_EXP_FLOOR
    } else {
        t
    };
    let n = t.round_ties_even();
    let f = t - n;
    let mut p = SOFTMAX_EXP_POLY[0];
    for &c in &SOFTMAX_EXP_POLY[1..] {
        p = p.mul_add(f, c);
    }
    scale_by_pow2(p, n)
}

/// `t` below which [`softmax_exp`] is 0: `2^-160` is below half the smallest subnormal.
const SOFTMAX_EXP_FLOOR: f32 = -160.0;

/// `(ln 2)^k / k!` for k = 6 down to 0: the Taylor polynomial of `2^f` in Horner order.
const SOFTMAX_EXP_POLY: [f32; 7] = [
    1.540_353e-4,
    1.333_355_8e-3,
    9.618_129e-3,
    5.550_411e-2,
    2.402_265e-1,
    6.931_472e-1,
    1.0,
];

/// `p · 2^n` rounded once (as `vscalefps`) for `p` in [0.5, 2] and integral `n` in
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
/// Pieces per unit of `|x|`.
const PHI_SCALE: f32 = PHI_PIECES as f32 / -GELU_ERF_FLUSH;

/// `Φ(−a)` on piece `i` of `a ∈ [0, 5.75]` (`a = (i + t)/PHI_SCALE`, `t ∈ [0, 1]`, with
/// `PHI_SCALE` as the f32 it is) is
/// `Σ_k PHI_TAIL[k][i]·tᵏ`: degree-7 fits at Chebyshev nodes, reweighted towards minimax in
/// relative error (1.1e-7 before f32 evaluation).
static PHI_TAIL: [[f32; PHI_PIECES]; 8] = [
    [
        0.5,
        0.42869896,
        0.3596573,
        0.29492188,
        0.2361475,
        0.18447618,
        0.140489,
        0.10422979,
        0.07528799,
        0.05291891,
        0.036177736,
        0.024045555,
        0.015532076,
        0.009747251,
        0.0059410776,
        0.0035161327,
        0.0020201379,
        0.0011264759,
        0.0006095465,
        0.00032000954,
        0.00016297634,
        8.0506805e-05,
        3.8568567e-05,
        1.7917559e-05,
        8.070947e-06,
        3.5247672e-06,
        1.4923136e-06,
        6.124633e-07,
        2.4364624e-07,
        9.394442e-08,
        3.510655e-08,
        1.271415e-08,
    ],
    [
        -0.07168494,
        -0.07053696,
        -0.067202166,
        -0.06199083,
        -0.055366788,
        -0.047879416,
        -0.04008908,
        -0.03249982,
        -0.02551018,
        -0.019387588,
        -0.01426631,
        -0.010164295,
        -0.007011655,
        -0.0046831868,
        -0.0030285872,
        -0.0018963407,
        -0.0011496624,
        -0.0006748418,
        -0.00038354055,
        -0.00021105628,
        -0.0001124509,
        -5.8010322e-05,
        -2.8975122e-05,
        -1.4012737e-05,
        -6.5614277e-06,
        -2.9747562e-06,
        -1.3058162e-06,
        -5.549968e-07,
        -2.2838971e-07,
        -9.099976e-08,
        -3.5106027e-08,
        -1.31129605e-08,
    ],
    [
        8.246835e-12,
        0.0011387345,
        0.0021697965,
        0.0030023025,
        0.003575321,
        0.0038647784,
        0.00388314,
        0.0036726939,
        0.0032946495,
        0.0028169036,
        0.0023031244,
        0.0018049936,
        0.0013583369,
        0.0009828574,
        0.0006845006,
        0.00045921214,
        0.0002969587,
        0.00018520666,
        0.00011145242,
        6.4737746e-05,
        3.6307694e-05,
        1.9666644e-05,
        1.0290907e-05,
        5.203032e-06,
        2.5422323e-06,
        1.2005962e-06,
        5.481015e-07,
        2.4191328e-07,
        1.03238094e-07,
        4.2603332e-08,
        1.7002316e-08,
        6.562472e-09,
    ],
    [
        0.00038575567,
        0.00036732233,
        0.00031492749,
        0.00023665177,
        0.0001440252,
        4.967778e-05,
        -3.502451e-05,
        -0.00010180213,
        -0.00014639298,
        -0.00016852324,
        -0.00017110357,
        -0.00015899247,
        -0.00013769812,
        -0.00011231299,
        -8.6839835e-05,
        -6.3929605e-05,
        -4.4949837e-05,
        -3.02545e-05,
        -1.9527268e-05,
        -1.2102359e-05,
        -7.210128e-06,
        -4.1327503e-06,
        -2.2807105e-06,
        -1.2125396e-06,
        -6.213488e-07,
        -3.0702626e-07,
        -1.4634452e-07,
        -6.730967e-08,
        -2.9881317e-08,
        -1.28070745e-08,
        -5.3005653e-09,
        -2.1188498e-09,
    ],
    [
        2.313076e-10,
        -9.092129e-06,
        -1.675941e-05,
        -2.188589e-05,
        -2.388921e-05,
        -2.280197e-05,
        -1.9199928e-05,
        -1.401192e-05,
        -8.27655e-06,
        -2.9163311e-06,
        1.4171342e-06,
        4.4036497e-06,
        6.0281445e-06,
        6.4965434e-06,
        6.1301103e-06,
        5.269504e-06,
        4.207411e-06,
        3.1550485e-06,
        2.2375082e-06,
        1.5077512e-06,
        9.686142e-07,
        5.947039e-07,
        3.4962224e-07,
        1.9710062e-07,
        1.066798e-07,
        5.5488265e-08,
        2.7758254e-08,
        1.336431e-08,
        6.1959993e-09,
        2.7675686e-09,
        1.1914907e-09,
        4.945925e-10,
    ],
    [
        -1.868725e-06,
        -1.7217222e-06,
        -1.3108219e-06,
        -7.242358e-07,
        -8.211043e-08,
        4.9476046e-07,
        9.1351654e-07,
        1.1270954e-06,
        1.1376417e-06,
        9.86808e-07,
        7.381042e-07,
        4.578145e-07,
        2.0000165e-07,
        -1.4811341e-09,
        -1.3385238e-07,
        -2.0109842e-07,
        -2.1729184e-07,
        -2.0004018e-07,
        -1.656379e-07,
        -1.2644159e-07,
        -9.019291e-08,
        -6.061843e-08,
        -3.859889e-08,
        -2.3375542e-08,
        -1.350201e-08,
        -7.45457e-09,
        -3.940641e-09,
        -1.997179e-09,
        -9.715162e-10,
        -4.540053e-10,
        -2.0397696e-10,
        -8.816412e-11,
    ],
    [
        4.741191e-10,
        5.005178e-08,
        8.8614634e-08,
        1.08353014e-07,
        1.0654956e-07,
        8.589967e-08,
        5.322359e-08,
        1.7114765e-08,
        -1.4565406e-08,
        -3.6545657e-08,
        -4.690895e-08,
        -4.675733e-08,
        -3.9150315e-08,
        -2.7811387e-08,
        -1.6046474e-08,
        -6.1160454e-09,
        9.125169e-10,
        4.960099e-09,
        6.565375e-09,
        6.5124923e-09,
        5.556743e-09,
        4.277201e-09,
        3.0377691e-09,
        2.01602e-09,
        1.2601115e-09,
        7.457725e-10,
        4.194981e-10,
        2.2490511e-10,
        1.1517271e-10,
        5.6431016e-11,
        2.6490954e-11,
        1.1928216e-11,
    ],
    [
        6.9641146e-09,
        5.4368003e-09,
        2.8098863e-09,
        -2.0867143e-10,
        -2.8622422e-09,
        -4.56943e-09,
        -5.075462e-09,
        -4.4753117e-09,
        -3.126678e-09,
        -1.4976818e-09,
        -1.3338563e-11,
        1.0474924e-09,
        1.5867321e-09,
        1.6589735e-09,
        1.4088268e-09,
        1.0036142e-09,
        5.8330896e-10,
        2.3644148e-10,
        -8.4737995e-13,
        -1.314572e-10,
        -1.7960164e-10,
        -1.754589e-10,
        -1.4544264e-10,
        -1.08065695e-10,
        -7.3803734e-11,
        -4.697584e-11,
        -2.8105492e-11,
        -1.5896909e-11,
        -8.534902e-12,
        -4.36266e-12,
        -2.127985e-12,
        -9.922823e-13,
    ],
];

/// GELU with the exact (erf) formulation, `x · Φ(x)`.
///
/// `Φ(−|x|)` is a degree-7 polynomial in the position within one of 32 pieces of `[0, 5.75]`,
/// its coefficients looked up by piece ([`PHI_TAIL`]); `Φ(x) = 1 − Φ(−x)` for `x ≥ 0`, which
/// loses nothing since `Φ(−x) ≤ ½` there. Relative error ≤ 1e-6 for x ≥ -5.75
/// ([`GELU_ERF_FLUSH`]), where the result becomes -0 (absolute error < 2.6e-8, under an ulp of
/// any activation it is summed with). No `exp` and no division: 7 FMAs and 8 table lookups,
/// which AVX-512 makes register permutes ([`gelu_erf_slice`]); the former `exp(−z²)·R(z)` form
/// with a degree-15 `R` took 40 vector operations per 16 values and was the largest cost of
/// the FFN1 epilogue. Every implementation (scalar, the AVX-512 one) runs this sequence of IEEE
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
    let i = ((ax * PHI_SCALE) as i32).min(PHI_PIECES as i32 - 1);
    // One rounding from |x| to the position in the piece: `ax·PHI_SCALE` rounded first would
    // cost the tail 4e-6 of relative accuracy (an ulp of 32 is 4e-6).
    let t = ax.mul_add(PHI_SCALE, -(i as f32));
    let i = i as usize;
    let mut p = PHI_TAIL[7][i];
    for k in (0..7).rev() {
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
    if super::select::cpu_features().avx512 {
        // SAFETY: the CPU has AVX-512F.
        return unsafe { gelu_erf_avx512(v) };
    }
    v.iter_mut().for_each(|x| *x = gelu_erf(*x));
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
    c: [(std::arch::x86_64::__m512, std::arch::x86_64::__m512); 8],
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
        let last = _mm512_set1_epi32(PHI_PIECES as i32 - 1);
        let i = _mm512_min_epi32(_mm512_cvttps_epi32(_mm512_mul_ps(ax, scale)), last);
        let t = _mm512_fmsub_ps(ax, scale, _mm512_cvtepi32_ps(i));
        let coef = |k: usize| _mm512_permutex2var_ps(self.c[k].0, i, self.c[k].1);
        let mut p = coef(7);
        for k in (0..7).rev() {
            p = _mm512_fmadd_ps(p, t, coef(k));
        }
        let negative = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_setzero_ps());
        let phi = _mm512_mask_blend_ps(negative, _mm512_sub_ps(_mm512_set1_ps(1.0), p), p);
        let flushed = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(GELU_ERF_FLUSH));
        _mm512_mask_blend_ps(flushed, _mm512_mul_ps(x, phi), _mm512_set1_ps(-0.0))
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
#[cfg(target_arch = "x86_64")]
pub mod lanes16 {
    use std::arch::x86_64::*;

    /// [`super::softmax_exp`] of each lane.
    ///
    /// # Safety
    /// Callable only where the CPU has AVX-512F and FMA (a caller without those target
    /// features must check them first).
    ///
    /// ```
    /// # #[cfg(target_arch = "x86_64")] {
    /// if std::arch::is_x86_feature_detected!("avx512f") {
    ///     use std::arch::x86_64::*;
    ///     let mut y = [0f32; 16];
    ///     // SAFETY: the CPU has AVX-512F (and FMA, which every AVX-512 CPU has).
    ///     unsafe {
    ///         let e = codegen::kernels::math::lanes16::softmax_exp(_mm512_set1_ps(-2.5));
    ///         _mm512_storeu_ps(y.as_mut_ptr(), e);
    ///     }
    ///     assert_eq!(y[7], codegen::kernels::math::softmax_exp(-2.5));
    /// }
    /// # }
    /// ```
    #[target_feature(enable = "avx512f,fma")]
    #[inline]
    pub fn softmax_exp(x: __m512) -> __m512 {
        let t = _mm512_mul_ps(x, _mm512_set1_ps(super::LOG2E));
        // `if FLOOR > t { FLOOR } else { t }`: max with the bound first keeps a NaN.
        let t = _mm512_max_ps(_mm512_set1_ps(super::SOFTMAX_EXP_FLOOR), t);
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t);
        let f = _mm512_sub_ps(t, n);
        let mut p = _mm512_set1_ps(super::SOFTMAX_EXP_POLY[0]);
        for &c in &super::SOFTMAX_EXP_POLY[1..] {
            p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
        }
        _mm512_scalef_ps(p, n)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// Bit for bit the scalar function on a dense sweep of [-120, 0.5], every float near the
        /// subnormal boundary and the floor, and the special values; within 4e-6 of `exp` (f64)
        /// on [-80, 0].
        #[test]
        fn softmax_exp_equals_the_scalar_function_and_is_accurate() {
            if !std::arch::is_x86_feature_detected!("avx512f") {
                eprintln!("SKIP softmax_exp_equals_the_scalar_function: no AVX-512F on this CPU");
                return;
            }
            let mut xs: Vec<f32> = (-1_200_000..=5_000).map(|i| i as f32 * 1e-4).collect();
            for edge in [-87.0f32, -87.5, -88.0, -103.0, -104.0, -110.9, -111.0, 0.0] {
                let mut v = edge;
                for _ in 0..2000 {
                    xs.push(v);
                    v = f32::from_bits(v.to_bits() + 1);
                }
            }
            xs.extend([-0.0, f32::NEG_INFINITY, f32::NAN, f32::MIN, -1e-30]);
            let (mut worst, mut worst_near) = (0f64, 0f64);
            for chunk in xs.chunks(16) {
                let mut a = [0f32; 16];
                a[..chunk.len()].copy_from_slice(chunk);
                let mut y = [0f32; 16];
                // SAFETY: AVX-512F checked above (every such CPU has FMA).
                unsafe {
                    _mm512_storeu_ps(y.as_mut_ptr(), softmax_exp(_mm512_loadu_ps(a.as_ptr())))
                };
                for (&x, &y) in a.iter().zip(&y) {
                    let want = super::super::softmax_exp(x);
                    assert!(
                        y.to_bits() == want.to_bits() || (y.is_nan() && want.is_nan()),
                        "softmax_exp({x:e}) = {y:e}, scalar {want:e}"
                    );
                    if (-80.0..=0.0).contains(&x) {
                        let exact = (x as f64).exp();
                        let e = (y as f64 - exact).abs() / exact;
                        worst = worst.max(e);
                        if x >= -10.0 {
                            worst_near = worst_near.max(e);
                        }
                    }
                }
            }
            assert!(worst < 4e-6, "relative error {worst:e}");
            assert!(
                worst_near < 1e-6,
                "relative error {worst_near:e} on [-10, 0]"
            );
            println!("softmax_exp: worst relative error {worst:.2e} on [-80, 0], {worst_near:.2e} on [-10, 0]");
        }
    }
}

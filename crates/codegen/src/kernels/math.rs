//! Branch-free f32 elementary functions for the epilogue.
//!
//! They are written as plain scalar code with `mul_add` and selects so that LLVM vectorises the
//! epilogue loops that call them (the loops are compiled once per ISA with `#[target_feature]`);
//! the scalar and vector results are therefore computed by the same sequence of IEEE operations.
//!
//! Accuracy (tested against f64 in `tests/epilogue.rs`):
//! * [`exp`]: ≤ 2 ulp on [-87, 88].
//! * [`gelu_erf`]: relative error ≤ 1e-6 for x ≥ -5.75 ([`GELU_ERF_FLUSH`]); -0 below, where
//!   |gelu(x)| < 2.6e-8; it uses `erfc` for both signs so there is no cancellation in `1 + erf`.
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

/// GELU with the exact (erf) formulation, `x · Φ(x) = x/2 · erfc(-x/√2)`.
///
/// `erfc(z) = exp(-z²)·R(z)` with `R(z) = erfc(z)·e^(z²)` (smooth, 1 at 0, about 0.1 at 4) as a
/// degree-15 polynomial in `u = z/z_max·2 − 1` on `z ∈ [0, z_max]`, `z_max = 5.75/√2` (a
/// relative least-squares fit, Lawson-reweighted towards minimax: relative error 2.7e-8, 2.1e-7
/// after f32 Horner), and `z² = x²/2` split into an exact head and tail by an FMA so its
/// rounding does not reach `exp`. No division: the former `t = 1/(1 + z/2)` fit spent a `vdivps`
/// per vector, the largest cost of the FFN epilogue once AMX made the GEMM fast. Below
/// [`GELU_ERF_FLUSH`] the result is -0 (absolute error < 2.6e-8, under an ulp of any activation
/// it is summed with); `erfc` is used for both signs, so there is no cancellation in `1 + erf`.
///
/// ```
/// let g = codegen::kernels::math::gelu_erf(1.0);
/// assert!((g - 0.841_344_7).abs() < 1e-6);
/// assert_eq!(codegen::kernels::math::gelu_erf(-6.0), 0.0);
/// ```
#[inline(always)]
pub fn gelu_erf(x: f32) -> f32 {
    // NaN stays NaN (min keeps the number, x·phi brings the NaN back); ±inf lands on the ends.
    let ax = x.abs().min(-GELU_ERF_FLUSH);
    let u = ax.mul_add(2.0 / -GELU_ERF_FLUSH, -1.0);
    let mut p = -0.00053144986f32;
    p = p.mul_add(u, 0.001207971);
    p = p.mul_add(u, -0.00033446102);
    p = p.mul_add(u, 6.495_527e-5);
    p = p.mul_add(u, -0.0031230121);
    p = p.mul_add(u, 0.0063614403);
    p = p.mul_add(u, -0.0087466035);
    p = p.mul_add(u, 0.014289755);
    p = p.mul_add(u, -0.024476921);
    p = p.mul_add(u, 0.039087955);
    p = p.mul_add(u, -0.059688244);
    p = p.mul_add(u, 0.08791891);
    p = p.mul_add(u, -0.12403664);
    p = p.mul_add(u, 0.16659479);
    p = p.mul_add(u, -0.21161342);
    p = p.mul_add(u, 0.25192344);
    let hi = ax * ax;
    let lo = ax.mul_add(ax, -hi);
    // -z² ≥ -16.6: inside exp's normal range, so no over/underflow handling is needed.
    let erfc = p * exp_sum_in_range(-0.5 * hi, -0.5 * lo);
    let half = 0.5 * erfc;
    let phi = if x < 0.0 { half } else { 1.0 - half };
    if x < GELU_ERF_FLUSH {
        -0.0
    } else {
        x * phi
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

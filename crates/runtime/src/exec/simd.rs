//! Row kernels (GELU, softmax, LayerNorm) written as plain loops and compiled three times: for
//! AVX-512, for AVX2+FMA and for the baseline, picked at run time. The loops use the branch-free
//! functions of `codegen::kernels::math`, which LLVM vectorises; without this the baseline
//! target (SSE2, no FMA) would run them one element at a time.

use codegen::kernels::math::{self, int_byte};

/// Defines `pub(crate) fn $name(args)` that dispatches to the best compiled copy of `$body`.
macro_rules! multiversion {
    ($(#[$m:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        multiversion! { $(#[$m])* fn $name($($arg: $ty),*) -> () $body }
    };
    ($(#[$m:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty $body:block) => {
        $(#[$m])*
        pub(crate) fn $name($($arg: $ty),*) -> $ret {
            #[cfg(target_arch = "x86_64")]
            {
                if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("fma") {
                    #[target_feature(enable = "avx512f,avx2,fma")]
                    unsafe fn avx512($($arg: $ty),*) -> $ret $body
                    // SAFETY: the CPU has the features the copy was compiled for.
                    return unsafe { avx512($($arg),*) };
                }
                if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                    #[target_feature(enable = "avx2,fma")]
                    unsafe fn avx2($($arg: $ty),*) -> $ret $body
                    // SAFETY: as above.
                    return unsafe { avx2($($arg),*) };
                }
            }
            $body
        }
    };
}

/// GELU (erf form) in place: [`math::gelu_erf_slice`], the GEMM epilogue's function.
pub(crate) fn gelu_erf_inplace(v: &mut [f32]) {
    math::gelu_erf_slice(v)
}

multiversion! {
    /// GELU (tanh form) in place.
    fn gelu_tanh_inplace(v: &mut [f32]) {
        for x in v.iter_mut() {
            *x = math::gelu_tanh(*x);
        }
    }
}

/// Softmax of one row in place with the C library's `expf` (correctly rounded in practice):
/// the Softmax op uses it because quantized graphs requantize its output, and every ulp closer
/// to the exact value means fewer rounding flips against other runtimes.
pub(crate) fn softmax_row_exact(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for v in row.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    row.iter_mut().for_each(|v| *v *= inv);
}

#[inline(always)]
fn lane_max(v: &[f32]) -> f32 {
    let max = |a: f32, b: f32| if b > a { b } else { a };
    let mut acc = [f32::NEG_INFINITY; JB];
    let mut chunks = v.chunks_exact(JB);
    for c in &mut chunks {
        for l in 0..JB {
            acc[l] = max(acc[l], c[l]);
        }
    }
    for (a, &x) in acc.iter_mut().zip(chunks.remainder()) {
        *a = max(*a, x);
    }
    math::fold_lanes(acc, max)
}

/// `row[i] = exp(row[i] − max)` in place; returns their sum. The exponentials are summed as
/// they are made, in the lanes of `lane_sum`.
#[inline(always)]
fn exp_shifted(row: &mut [f32]) -> f32 {
    let max = lane_max(row);
    let mut acc = [0.0f32; JB];
    let mut chunks = row.chunks_exact_mut(JB);
    for c in &mut chunks {
        for l in 0..JB {
            let e = math::exp(c[l] - max);
            c[l] = e;
            acc[l] += e;
        }
    }
    for (a, v) in acc.iter_mut().zip(chunks.into_remainder()) {
        *v = math::exp(*v - max);
        *a += *v;
    }
    math::fold_lanes(acc, |a, b| a + b)
}

multiversion! {
    /// Softmax of one row in place: max-subtracted exponentials over their sum, with the
    /// vectorised `exp` of codegen (≤ 2 ulp). Used inside the fused attention.
    fn softmax_row(row: &mut [f32]) {
        let inv = 1.0 / exp_shifted(row);
        for v in row.iter_mut() {
            *v *= inv;
        }
    }
}

multiversion! {
    /// [`math::quantize_sym`] (symmetric 8-bit quantization of one row, returning its scale)
    /// compiled for this CPU: the same bytes as the QKV GEMM's `quant_heads` epilogue makes.
    fn quantize_sym_row(src: &[f32], dst: &mut [u8], offset: u8) -> f32 {
        math::quantize_sym(src, dst, offset)
    }
}

multiversion! {
    /// `amax[c] = max(amax[c], |row[c]|)`: one row's contribution to per-column maxima.
    fn abs_max_into(amax: &mut [f32], row: &[f32]) {
        for (a, &x) in amax.iter_mut().zip(row) {
            let x = x.abs();
            *a = if x > *a { x } else { *a };
        }
    }
}

multiversion! {
    /// Four rows quantized with per-column reciprocal scales `inv` (s8, ±127) and interleaved:
    /// `dst[c]` holds the bytes of `rows[0..4][c]`, lowest first (the layout `vpdpbusd` reads
    /// a 4-deep slice of the right operand in). Rows past the real ones are passed as zeros.
    fn quantize_interleave4(rows: [&[f32]; 4], inv: &[f32], dst: &mut [u32]) {
        let q = |x: f32, s: f32| {
            let q = (x * s).round_ties_even();
            let q = if q.is_nan() { 0.0 } else { q.clamp(-127.0, 127.0) };
            int_byte(q) as u32
        };
        for (c, d) in dst.iter_mut().enumerate() {
            let s = inv[c];
            *d = q(rows[0][c], s)
                | q(rows[1][c], s) << 8
                | q(rows[2][c], s) << 16
                | q(rows[3][c], s) << 24;
        }
    }
}

multiversion! {
    /// Softmax numerators of one row of scores quantized to u8: `e = exp(s − max)` (in (0, 1],
    /// 1 at the maximum) stored as `round(255·e)` in `p8`; returns `Σ e` in f32, so that the
    /// probabilities are `p8 / (255·Σ e)`. `row` is left holding the exponentials.
    fn softmax_quant_row(row: &mut [f32], p8: &mut [u8]) -> f32 {
        let sum = exp_shifted(row);
        for (d, &e) in p8.iter_mut().zip(row.iter()) {
            *d = int_byte((e * 255.0).round_ties_even());
        }
        sum
    }
}

multiversion! {
    /// LayerNorm of rows of `n` elements: `y = (x − mean)/√(var + eps)·g (+ b)`, two-pass
    /// mean and variance.
    fn layer_norm_rows(x: &[f32], y: &mut [f32], n: usize, g: &[f32], b: Option<&[f32]>, eps: f32) {
        for (xr, yr) in x.chunks_exact(n).zip(y.chunks_exact_mut(n)) {
            let mean = math::lane_sum(xr) / n as f32;
            let mut sq = [0.0f32; JB];
            let mut chunks = xr.chunks_exact(JB);
            for c in &mut chunks {
                for l in 0..JB {
                    let d = c[l] - mean;
                    sq[l] += d * d;
                }
            }
            for (a, &v) in sq.iter_mut().zip(chunks.remainder()) {
                *a += (v - mean) * (v - mean);
            }
            let var = math::fold_lanes(sq, |a, b| a + b);
            let inv = 1.0 / (var / n as f32 + eps).sqrt();
            match b {
                Some(b) => {
                    for i in 0..n {
                        yr[i] = (xr[i] - mean) * inv * g[i] + b[i];
                    }
                }
                None => {
                    for i in 0..n {
                        yr[i] = (xr[i] - mean) * inv * g[i];
                    }
                }
            }
        }
    }
}

/// Lanes of the reductions (one AVX-512 vector of f32).
const JB: usize = 16;

multiversion! {
    /// `c[j] += Σ_p a[p]·b[p, j]` in i32 (wrapping, as the hardware): one row of an exact
    /// integer product, `b` being `[a.len(), n]`.
    fn i32_row_times_panel(a: &[i32], b: &[i32], n: usize, c: &mut [i32]) {
        for (p, &x) in a.iter().enumerate() {
            if x == 0 {
                continue;
            }
            let br = &b[p * n..(p + 1) * n];
            for (acc, &w) in c.iter_mut().zip(br) {
                *acc = acc.wrapping_add(x.wrapping_mul(w));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gelu_f64(x: f64) -> f64 {
        0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
    }

    #[test]
    fn gelu_erf_is_accurate() {
        let xs: Vec<f32> = (-200_000..=200_000).map(|i| i as f32 * 5e-5).collect();
        let mut ys = xs.clone();
        gelu_erf_inplace(&mut ys);
        let mut worst = (0.0f64, 0.0f32);
        for (&x, &y) in xs.iter().zip(&ys) {
            let e = (y as f64 - gelu_f64(x as f64)).abs();
            if e > worst.0 {
                worst = (e, x);
            }
        }
        // Half an f32 ulp of the result is already ~6e-8 at |y| ≈ 1 and ~5e-7 at |y| ≈ 10.
        let ulp_bound = |x: f32| 2e-7f64.max(gelu_f64(x as f64).abs() * 1.2e-7);
        for (&x, &y) in xs.iter().zip(&ys) {
            let e = (y as f64 - gelu_f64(x as f64)).abs();
            assert!(e <= ulp_bound(x), "gelu({x}) = {y}, error {e}");
        }
        println!(
            "gelu_erf: worst abs error {:.2e} at x = {}",
            worst.0, worst.1
        );
    }

    #[test]
    fn softmax_and_layer_norm() {
        let mut r = [1.0f32, 2.0, 3.0, -1e30];
        softmax_row(&mut r);
        let e: Vec<f64> = [1.0f64, 2.0, 3.0]
            .iter()
            .map(|v| (v - 3.0f64).exp())
            .collect();
        let s: f64 = e.iter().sum();
        for i in 0..3 {
            assert!((r[i] as f64 - e[i] / s).abs() < 1e-7);
        }
        assert_eq!(r[3], 0.0);
        let x = [1.0f32, 2.0, 3.0, 4.0];
        let mut y = [0.0f32; 4];
        layer_norm_rows(&x, &mut y, 4, &[1.0; 4], Some(&[0.5; 4]), 0.0);
        let inv = 1.0 / 1.25f64.sqrt();
        for i in 0..4 {
            assert!((y[i] as f64 - ((x[i] as f64 - 2.5) * inv + 0.5)).abs() < 1e-6);
        }
    }
}

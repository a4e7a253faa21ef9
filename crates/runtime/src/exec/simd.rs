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

/// `row[i] = exp(row[i] − max)` in place with the exponential `exp`; returns their sum. The
/// exponentials are summed as they are made, in the lanes of `lane_sum`.
#[inline(always)]
fn exp_shifted(row: &mut [f32], exp: impl Fn(f32) -> f32) -> f32 {
    let max = lane_max(row);
    let mut acc = [0.0f32; JB];
    let mut chunks = row.chunks_exact_mut(JB);
    for c in &mut chunks {
        for l in 0..JB {
            let e = exp(c[l] - max);
            c[l] = e;
            acc[l] += e;
        }
    }
    for (a, v) in acc.iter_mut().zip(chunks.into_remainder()) {
        *v = exp(*v - max);
        *a += *v;
    }
    math::fold_lanes(acc, |a, b| a + b)
}

multiversion! {
    /// Softmax of one row in place: max-subtracted exponentials over their sum, with the
    /// vectorised `exp` of codegen (≤ 2 ulp). The definition of the fused attention's
    /// [`softmax_rows`], which runs it on CPUs without AVX-512.
    fn softmax_row(row: &mut [f32]) {
        let inv = 1.0 / exp_shifted(row, math::exp);
        for v in row.iter_mut() {
            *v *= inv;
        }
    }
}

/// [`softmax_row`] of each of the first `rows` rows of `block` (row `i` is
/// `block[i·ld..i·ld + n]`), the same bits row for row. With AVX-512 the rows go four at a time
/// in intrinsics: the row's maximum, its exponentials' sum and the normalisation are each one
/// dependency chain of vectors, which one row alone leaves waiting on latency (about 35 cycles
/// a vector for BERT-base's rows of 128), where four side by side fill the pipeline.
///
/// # Panics
/// If `n > ld` or `block` is shorter than `rows` rows.
pub(crate) fn softmax_rows(block: &mut [f32], ld: usize, n: usize, rows: usize) {
    assert!(n <= ld && (rows == 0 || block.len() >= (rows - 1) * ld + n));
    #[cfg(target_arch = "x86_64")]
    if codegen::kernels::cpu_features().avx512 {
        let base = block.as_mut_ptr();
        let mut r = 0;
        while r + 4 <= rows {
            // SAFETY: the CPU has AVX-512F (and FMA); rows r..r + 4 < rows lie inside `block`
            // (asserted) and are disjoint (n ≤ ld).
            unsafe { softmax_rows_avx512::<4>(std::array::from_fn(|i| base.add((r + i) * ld)), n) };
            r += 4;
        }
        for r in r..rows {
            // SAFETY: as above, one row.
            unsafe { softmax_rows_avx512::<1>([base.add(r * ld)], n) };
        }
        return;
    }
    for row in block.chunks_mut(ld).take(rows) {
        softmax_row(&mut row[..n]);
    }
}

/// [`softmax_rows`] of `R` rows of `n` floats in lockstep: `lane_max`, `exp_shifted` and the
/// normalisation of [`softmax_row`], the same results per row (lane `l`
/// takes elements `l`, `l + 16`, …, the tail masked; lanes folded by [`math::fold_lanes`]).
///
/// # Safety
/// AVX-512F and FMA; each pointer addresses `n` writable floats, the rows disjoint.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn softmax_rows_avx512<const R: usize>(rows: [*mut f32; R], n: usize) {
    use std::arch::x86_64::*;
    let whole = n / JB * JB;
    let tail = lanes_below(n - whole);
    // lane_max's `if b > a { b } else { a }` is `max_ps(x, acc)`: `x > acc ? x : acc`.
    let mut acc = [_mm512_set1_ps(f32::NEG_INFINITY); R];
    // SAFETY (the loads and stores below): offsets < whole ≤ n, the tail masked to n.
    for i in (0..whole).step_by(JB) {
        for (a, &row) in acc.iter_mut().zip(&rows) {
            *a = _mm512_max_ps(unsafe { _mm512_loadu_ps(row.add(i)) }, *a);
        }
    }
    let mut shift = [_mm512_setzero_ps(); R];
    for ((a, s), &row) in acc.iter_mut().zip(&mut shift).zip(&rows) {
        let x = unsafe { _mm512_maskz_loadu_ps(tail, row.add(whole)) };
        *a = _mm512_mask_max_ps(*a, tail, x, *a);
        *s = _mm512_set1_ps(math::lanes16::fold_max(*a));
    }
    let mut sum = [_mm512_setzero_ps(); R];
    for i in (0..whole).step_by(JB) {
        for ((a, s), &row) in sum.iter_mut().zip(&shift).zip(&rows) {
            let p = unsafe { row.add(i) };
            let e =
                math::lanes16::exp_nonpositive(_mm512_sub_ps(unsafe { _mm512_loadu_ps(p) }, *s));
            unsafe { _mm512_storeu_ps(p, e) };
            *a = _mm512_add_ps(*a, e);
        }
    }
    let mut inv = [_mm512_setzero_ps(); R];
    for (((a, s), v), &row) in sum.iter_mut().zip(&shift).zip(&mut inv).zip(&rows) {
        let p = unsafe { row.add(whole) };
        let e = math::lanes16::exp_nonpositive(_mm512_sub_ps(
            unsafe { _mm512_maskz_loadu_ps(tail, p) },
            *s,
        ));
        unsafe { _mm512_mask_storeu_ps(p, tail, e) };
        *a = _mm512_mask_add_ps(*a, tail, *a, e);
        *v = _mm512_set1_ps(1.0 / math::lanes16::fold_sum(*a));
    }
    for i in (0..whole).step_by(JB) {
        for (v, &row) in inv.iter().zip(&rows) {
            let p = unsafe { row.add(i) };
            unsafe { _mm512_storeu_ps(p, _mm512_mul_ps(_mm512_loadu_ps(p), *v)) };
        }
    }
    for (v, &row) in inv.iter().zip(&rows) {
        let p = unsafe { row.add(whole) };
        unsafe {
            _mm512_mask_storeu_ps(p, tail, _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, p), *v))
        };
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

/// Softmax numerators of one row of scores quantized to u8, the scores in log2 units (the
/// producer's scale carries `log2 e`): `e = 255·2^(s − max)` (in (0, 255], 255 at the
/// maximum, by [`math::softmax_numerator`]: the bytes need no more) stored as its byte
/// ([`math::numerator_byte`]) in `p8`; returns `Σ e` in f32, so that the probabilities are
/// `p8 / Σ e`. The numerators themselves are not kept: the bytes and their sum are all the
/// values product reads.
///
/// With AVX-512 in intrinsics (`vscalefps`, which LLVM does not make of the plain loops), the
/// same operations in the same order, so the same bits on every CPU.
pub(crate) fn softmax_quant_row(row: &[f32], p8: &mut [u8]) -> f32 {
    assert!(p8.len() >= row.len(), "one byte per score");
    #[cfg(target_arch = "x86_64")]
    if codegen::kernels::cpu_features().avx512 {
        // SAFETY: the CPU has AVX-512F/BW (and FMA); `p8` holds a byte per score (asserted).
        return unsafe { softmax_quant_row_avx512(row, p8) };
    }
    softmax_quant_row_lanes(row, p8)
}

/// Numerators [`softmax_quant_row_avx512`] makes at a time.
#[cfg(target_arch = "x86_64")]
const EXP_AT_ONCE: usize = 8;

/// [`softmax_quant_row`] with AVX-512: [`lane_max`], then [`exp_shifted`]'s numerators and
/// lane sums (added in the same order), each byte made as its numerator is.
///
/// # Safety
/// AVX-512F/BW and FMA; `p8.len() >= row.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
unsafe fn softmax_quant_row_avx512(row: &[f32], p8: &mut [u8]) -> f32 {
    use codegen::kernels::math::lanes16::{numerator_bytes, softmax_numerator};
    use std::arch::x86_64::*;
    let n = row.len();
    let (x, d) = (row.as_ptr(), p8.as_mut_ptr());
    // SAFETY (every load and store): elements j..j + 16 of `row` and `p8`, masked to the
    // lanes below `n`; `p8` is at least as long as `row` (caller contract).
    unsafe {
        // `lane_max`'s `if b > a { b } else { a }` is `max_ps(b, a)`. The maximum is exact in
        // any order: four accumulators break the dependency chain.
        let whole = n / JB * JB;
        let mut accs = [_mm512_set1_ps(f32::NEG_INFINITY); 4];
        let mut j = 0;
        while j + 4 * JB <= whole {
            for (u, acc) in accs.iter_mut().enumerate() {
                *acc = _mm512_max_ps(_mm512_loadu_ps(x.add(j + u * JB)), *acc);
            }
            j += 4 * JB;
        }
        let mut acc = _mm512_max_ps(
            _mm512_max_ps(accs[0], accs[1]),
            _mm512_max_ps(accs[2], accs[3]),
        );
        while j < n {
            let m = lanes_below(n - j);
            acc = _mm512_mask_max_ps(acc, m, _mm512_maskz_loadu_ps(m, x.add(j)), acc);
            j += JB;
        }
        let max = _mm512_set1_ps(math::lanes16::fold_max(acc));
        let mut sum = _mm512_setzero_ps();
        let mut j = 0;
        // EXP_AT_ONCE vectors at a time, whole: their numerators are independent (the latency
        // of one is ~35 cycles); the sum takes them in order.
        while j + EXP_AT_ONCE * JB <= whole {
            let e: [__m512; EXP_AT_ONCE] = std::array::from_fn(|u| {
                softmax_numerator(_mm512_sub_ps(_mm512_loadu_ps(x.add(j + u * JB)), max))
            });
            for (u, &e) in e.iter().enumerate() {
                sum = _mm512_add_ps(sum, e);
                _mm_storeu_si128(d.add(j + u * JB) as *mut __m128i, numerator_bytes(e));
            }
            j += EXP_AT_ONCE * JB;
        }
        while j < n {
            let m = lanes_below(n - j);
            let e = softmax_numerator(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x.add(j)), max));
            sum = _mm512_mask_add_ps(sum, m, sum, e);
            _mm_mask_storeu_epi8(d.add(j) as *mut i8, m, numerator_bytes(e));
            j += JB;
        }
        math::lanes16::fold_sum(sum)
    }
}

/// The lanes of the vector that starts `left` elements before the end of a row: all 16, or
/// the first `left` (none for 0).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn lanes_below(left: usize) -> std::arch::x86_64::__mmask16 {
    if left >= JB {
        !0
    } else {
        (1 << left) - 1
    }
}

multiversion! {
    /// [`softmax_quant_row`] as plain loops (compiled for AVX2 and the baseline).
    fn softmax_quant_row_lanes(row: &[f32], p8: &mut [u8]) -> f32 {
        // `exp_shifted`'s maximum, numerators and lane sums, the numerators not stored.
        let max = lane_max(row);
        let byte = math::numerator_byte;
        let mut acc = [0.0f32; JB];
        let p8 = &mut p8[..row.len()];
        let mut chunks = row.chunks_exact(JB);
        let mut bytes = p8.chunks_exact_mut(JB);
        for (c, d) in (&mut chunks).zip(&mut bytes) {
            for l in 0..JB {
                let e = math::softmax_numerator(c[l] - max);
                acc[l] += e;
                d[l] = byte(e);
            }
        }
        for ((a, &x), d) in acc.iter_mut().zip(chunks.remainder()).zip(bytes.into_remainder()) {
            let e = math::softmax_numerator(x - max);
            *a += e;
            *d = byte(e);
        }
        math::fold_lanes(acc, |a, b| a + b)
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

    /// The AVX-512 softmax numerators against the plain loops, bit for bit: rows of every
    /// length to 200 (whole vectors and tails), scores spread so that some exponentials
    /// underflow, with -inf, +inf and a NaN with a payload in some rows.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn softmax_quant_row_is_the_same_with_avx512() {
        if !codegen::kernels::cpu_features().avx512 {
            eprintln!("SKIP softmax_quant_row_is_the_same_with_avx512: no AVX-512 on this CPU");
            return;
        }
        let mut draw = super::super::lcg24(7);
        let mut next = move || draw() as f32 / (1 << 24) as f32;
        for n in 1..=200 {
            for case in 0..4 {
                let mut row: Vec<f32> = (0..n).map(|_| (next() - 0.5) * 240.0).collect();
                match case {
                    1 => row[n / 2] = f32::NEG_INFINITY,
                    2 => row[n - 1] = f32::INFINITY,
                    3 => row[n / 3] = f32::from_bits(0x7fc0_0013),
                    _ => {}
                }
                let (mut pa, mut pb) = (vec![7u8; n + 3], vec![7u8; n + 3]);
                // SAFETY: the features were checked; `pa` is longer than the row.
                let sa = unsafe { softmax_quant_row_avx512(&row, &mut pa) };
                let sb = softmax_quant_row_lanes(&row, &mut pb);
                assert_eq!(sa.to_bits(), sb.to_bits(), "sum, n {n} case {case}");
                assert_eq!(pa, pb, "bytes, n {n} case {case}");
                assert_eq!(pa[n..], [7; 3], "nothing past the row, n {n} case {case}");
                // The definition: exp_shifted's sum and the bytes of its numerators.
                let mut e = row.clone();
                let sum = exp_shifted(&mut e, math::softmax_numerator);
                assert_eq!(
                    sb.to_bits(),
                    sum.to_bits(),
                    "sum as exp_shifted, n {n} case {case}"
                );
                let want: Vec<u8> = e.iter().map(|&e| math::numerator_byte(e)).collect();
                assert_eq!(pb[..n], want[..], "bytes of exp_shifted, n {n} case {case}");
            }
        }
    }

    /// Rows side by side against [`softmax_row`] and its plain definition (`exp_shifted` with
    /// the scalar exponential, then the product by the reciprocal of the sum), bit for bit:
    /// 0 to 9 rows (groups of four and the rows after them), every length to 70 and two longer,
    /// scores spread so that some exponentials underflow, -inf, +inf and a NaN with a payload in
    /// some rows, nothing written between the rows.
    #[test]
    fn softmax_rows_equal_softmax_row() {
        let mut draw = super::super::lcg24(11);
        let mut next = move || draw() as f32 / (1 << 24) as f32;
        for n in (0..=70).chain([128, 200]) {
            for rows in 0..=9 {
                let ld = n + 3;
                let mut block: Vec<f32> = (0..rows * ld)
                    .map(|_| (next() - 0.5) * if n % 3 == 0 { 240.0 } else { 8.0 })
                    .collect();
                if n > 0 {
                    for (r, row) in block.chunks_mut(ld).enumerate() {
                        match r % 4 {
                            1 => row[n / 2] = f32::NEG_INFINITY,
                            2 if r > 4 => row[n - 1] = f32::INFINITY,
                            3 => row[n / 3] = f32::from_bits(0x7fc0_0013),
                            _ => {}
                        }
                    }
                }
                for row in block.chunks_mut(ld) {
                    row[n..].fill(-7.5);
                }
                let mut got = block.clone();
                softmax_rows(&mut got, ld, n, rows);
                for (r, (got, row)) in got.chunks(ld).zip(block.chunks(ld)).enumerate() {
                    let mut one = row[..n].to_vec();
                    softmax_row(&mut one);
                    let mut plain = row[..n].to_vec();
                    let inv = 1.0 / exp_shifted(&mut plain, math::exp);
                    plain.iter_mut().for_each(|v| *v *= inv);
                    for ((&g, &o), &p) in got.iter().zip(&one).zip(&plain) {
                        let same = |a: f32, b: f32| {
                            a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
                        };
                        assert!(
                            same(g, o) && same(o, p),
                            "n {n} rows {rows} row {r}: {g:e} {o:e} {p:e}"
                        );
                    }
                    assert_eq!(
                        got[n..],
                        [-7.5; 3],
                        "n {n} rows {rows} row {r}: past the row"
                    );
                }
            }
        }
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

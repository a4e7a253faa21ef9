//! Shared helpers for the kernel tests.
#![allow(dead_code)]

/// Deterministic xorshift generator (tests must be reproducible without extra deps).
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    /// Uniform in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    pub fn u8(&mut self) -> u8 {
        (self.next_u64() >> 56) as u8
    }
    pub fn i8(&mut self) -> i8 {
        (self.next_u64() >> 56) as u8 as i8
    }
    pub fn vec_f32(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }
}

/// f64 reference of A·B with B given as [k, n] (row stride ldb) or [n, k] when transposed.
/// Returns (value, Σ|a·b|) per element.
#[allow(clippy::too_many_arguments)]
pub fn ref_gemm_f32(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    bt: bool,
) -> Vec<(f64, f64)> {
    let mut out = vec![(0.0, 0.0); m * n];
    for i in 0..m {
        for j in 0..n {
            let (mut s, mut sa) = (0f64, 0f64);
            for kk in 0..k {
                let bv = if bt { b[j * ldb + kk] } else { b[kk * ldb + j] } as f64;
                let p = a[i * lda + kk] as f64 * bv;
                s += p;
                sa += p.abs();
            }
            out[i * n + j] = (s, sa);
        }
    }
    out
}

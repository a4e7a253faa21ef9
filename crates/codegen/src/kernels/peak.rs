//! Measured compute peaks: a `vpdpbusd zmm` loop (`vpdpbusd ymm` where AVX-VNNI is all the CPU
//! has, `vpmaddwd` on AVX2 without VNNI) and an FMA loop, with enough independent
//! accumulators each to cover latency × throughput on current cores, and where AMX runs a
//! `tdpbusd` loop on register tiles, run on 1..n threads of the pool. The roofline fractions in
//! `hwbench` and the benchmarks divide by these.

use super::pool::parallel_for;
use super::select::{cpu_features, Int8Kernel};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Measured peak throughput of `threads` threads together.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Peak {
    /// Threads used.
    pub threads: usize,
    /// int8 multiply-accumulates × 2 per second with 512-bit `vpdpbusd` (256-bit AVX-VNNI when
    /// that is all the CPU has, `vpmaddwd` on AVX2: 16 exact products per multiply; 0
    /// without any).
    pub vnni_ops_per_s: f64,
    /// f32 FLOP/s (FMA = 2) with 512-bit FMA (256-bit on AVX2-only CPUs, scalar otherwise).
    pub fma_flops_per_s: f64,
    /// int8 multiply-accumulates × 2 per second with AMX `tdpbusd` on register tiles (0 where
    /// AMX is absent or Linux refuses it).
    pub amx_ops_per_s: f64,
}

impl Peak {
    /// The peak of the unit `kernel` runs on, what the roofline of an int8 GEMM on it divides
    /// by: the AMX tiles for the AMX kernel, the `vpdpbusd` loop for every other.
    ///
    /// ```
    /// use codegen::kernels::{Int8Kernel, Peak};
    /// let p = Peak { threads: 1, vnni_ops_per_s: 1e12, fma_flops_per_s: 2e11, amx_ops_per_s: 8e12 };
    /// assert_eq!(p.int8_ops_per_s(Int8Kernel::Amx), 8e12);
    /// assert_eq!(p.int8_ops_per_s(Int8Kernel::AvxVnni), 1e12);
    /// ```
    pub fn int8_ops_per_s(&self, kernel: Int8Kernel) -> f64 {
        match kernel {
            Int8Kernel::Amx => self.amx_ops_per_s,
            _ => self.vnni_ops_per_s,
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod loops {
    use std::arch::x86_64::*;

    /// 24 independent `vpdpbusd zmm` chains; returns a value so the work is not removed.
    #[target_feature(enable = "avx512f,avx512vnni")]
    pub fn vnni512(iters: usize) -> i32 {
        let mut acc = [_mm512_set1_epi32(0); 24];
        let x = _mm512_set1_epi32(0x0101_0101);
        let y = _mm512_set1_epi32(0x0202_0202);
        for _ in 0..iters {
            for a in acc.iter_mut() {
                *a = _mm512_dpbusd_epi32(*a, x, y);
            }
        }
        _mm512_reduce_add_epi32(
            acc.iter()
                .fold(_mm512_setzero_si512(), |s, a| _mm512_add_epi32(s, *a)),
        )
    }

    /// 12 independent `vpdpbusd ymm` chains (AVX-VNNI).
    #[target_feature(enable = "avx2,avxvnni")]
    pub fn vnni256(iters: usize) -> i32 {
        let mut acc = [_mm256_set1_epi32(0); 12];
        let x = _mm256_set1_epi32(0x0101_0101);
        let y = _mm256_set1_epi32(0x0202_0202);
        for _ in 0..iters {
            for a in acc.iter_mut() {
                *a = _mm256_dpbusd_avx_epi32(*a, x, y);
            }
        }
        let s = acc
            .iter()
            .fold(_mm256_setzero_si256(), |s, a| _mm256_add_epi32(s, *a));
        _mm256_extract_epi32::<0>(s)
    }

    /// 12 independent `vpmaddwd ymm` chains: the multiplier peak of CPUs without VNNI (16
    /// exact products each, the AVX2 kernel's instruction; the saturating `vpmaddubsw` +
    /// `vpmaddwd` pair makes as many products per multiply). The kernel's accumulating `vpaddd`
    /// runs on the other vector pipes, so it is not in the loop: with it, each chain's latency
    /// (multiply, then add) held the loop to 1.0-1.6 multiplies a cycle on Zen 3, where the
    /// multiplier does 2 (measured 2026-12-06), and the AVX2 kernel outran its own "peak".
    #[target_feature(enable = "avx2")]
    pub fn madd256(iters: usize) -> i32 {
        let mut acc: [__m256i; 12] = std::array::from_fn(|i| _mm256_set1_epi32(i as i32 + 1));
        let y = _mm256_set1_epi16(3);
        for _ in 0..iters {
            for a in acc.iter_mut() {
                *a = _mm256_madd_epi16(*a, y);
            }
        }
        let s = acc
            .iter()
            .fold(_mm256_setzero_si256(), |s, a| _mm256_add_epi32(s, *a));
        _mm256_extract_epi32::<0>(s)
    }

    /// 24 independent `vfmadd231ps zmm` chains.
    #[target_feature(enable = "avx512f")]
    pub fn fma512(iters: usize) -> f32 {
        let mut acc = [_mm512_set1_ps(0.0); 24];
        let x = _mm512_set1_ps(0.999_999);
        let y = _mm512_set1_ps(1e-7);
        for _ in 0..iters {
            for a in acc.iter_mut() {
                *a = _mm512_fmadd_ps(*a, x, y);
            }
        }
        _mm512_reduce_add_ps(
            acc.iter()
                .fold(_mm512_setzero_ps(), |s, a| _mm512_add_ps(s, *a)),
        )
    }

    /// 12 independent `vfmadd231ps ymm` chains.
    #[target_feature(enable = "avx2,fma")]
    pub fn fma256(iters: usize) -> f32 {
        let mut acc = [_mm256_set1_ps(0.0); 12];
        let x = _mm256_set1_ps(0.999_999);
        let y = _mm256_set1_ps(1e-7);
        for _ in 0..iters {
            for a in acc.iter_mut() {
                *a = _mm256_fmadd_ps(*a, x, y);
            }
        }
        let s = acc
            .iter()
            .fold(_mm256_setzero_ps(), |s, a| _mm256_add_ps(s, *a));
        _mm256_cvtss_f32(s)
    }
}

/// Ops per iteration and the loop for the best int8 / f32 instruction the CPU has.
/// Ops per iteration and the loop, if the CPU has one.
type Loop = (f64, Option<fn(usize) -> f64>);

fn pick_loops() -> (Loop, Loop) {
    let f = cpu_features();
    #[cfg(target_arch = "x86_64")]
    {
        let vnni: Loop = if f.avx512vnni {
            // SAFETY: chosen only when the CPU has this loop's features.
            (24.0 * 128.0, Some(|n| unsafe { loops::vnni512(n) } as f64))
        } else if f.avxvnni {
            // SAFETY: chosen only when the CPU has this loop's features.
            (12.0 * 64.0, Some(|n| unsafe { loops::vnni256(n) } as f64))
        } else if f.avx2_fma {
            // SAFETY: chosen only when the CPU has this loop's features.
            (12.0 * 32.0, Some(|n| unsafe { loops::madd256(n) } as f64))
        } else {
            (0.0, None)
        };
        let fma: Loop = if f.avx512 {
            // SAFETY: chosen only when the CPU has this loop's features.
            (24.0 * 32.0, Some(|n| unsafe { loops::fma512(n) } as f64))
        } else if f.avx2_fma {
            // SAFETY: chosen only when the CPU has this loop's features.
            (12.0 * 16.0, Some(|n| unsafe { loops::fma256(n) } as f64))
        } else {
            (0.0, None)
        };
        (vnni, fma)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = f;
        ((0.0, None), (0.0, None))
    }
}

/// Four `tdpbusd` of 16×16×64 MACs, two ops each.
const AMX_OPS_PER_ITER: f64 = 4.0 * 16.0 * 16.0 * 64.0 * 2.0;

fn amx_loop() -> Option<fn(usize) -> f64> {
    #[cfg(target_arch = "x86_64")]
    {
        use super::int8::amx::{peak_loop, HwTiles};
        HwTiles::new().ok()?;
        Some(|n| {
            HwTiles::new()
                .map(|mut t| peak_loop(&mut t, n) as f64)
                .unwrap_or(0.0)
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

fn run_loop(threads: usize, ops_per_iter: f64, f: fn(usize) -> f64) -> f64 {
    // Calibrate so one run takes ~30 ms, then take the best of 3 (frequency ramp, noise).
    let mut iters = 1 << 16;
    loop {
        let t = Instant::now();
        std::hint::black_box(f(iters));
        if t.elapsed() > Duration::from_millis(10) || iters > 1 << 30 {
            let per = t.elapsed().as_secs_f64() / iters as f64;
            iters = ((0.03 / per) as usize).max(1);
            break;
        }
        iters *= 4;
    }
    let mut best = 0f64;
    let sink = Mutex::new(0f64);
    for _ in 0..3 {
        let t = Instant::now();
        parallel_for(threads, &|_| {
            let r = f(iters);
            *sink.lock().unwrap_or_else(|e| e.into_inner()) += r;
        });
        let s = t.elapsed().as_secs_f64();
        best = best.max(ops_per_iter * iters as f64 * threads as f64 / s);
    }
    std::hint::black_box(sink.into_inner().ok());
    best
}

/// Measures the VNNI, FMA and (where usable) AMX peaks of `threads` threads (about 0.3 s each).
///
/// ```no_run
/// let p = codegen::kernels::measure_peak(1);
/// println!("{:.0} GOPS int8, {:.0} GFLOP/s f32", p.vnni_ops_per_s / 1e9, p.fma_flops_per_s / 1e9);
/// ```
pub fn measure_peak(threads: usize) -> Peak {
    let threads = threads.max(1);
    let ((vo, vf), (fo, ff)) = pick_loops();
    Peak {
        threads,
        vnni_ops_per_s: vf.map_or(0.0, |f| run_loop(threads, vo, f)),
        fma_flops_per_s: ff.map_or(0.0, |f| run_loop(threads, fo, f)),
        amx_ops_per_s: amx_loop().map_or(0.0, |f| run_loop(threads, AMX_OPS_PER_ITER, f)),
    }
}

//! `hwbench`: times every kernel this CPU runs on one problem and marks the picker's choice.
//! The CLI `encore hwbench` calls [`hwbench`] and prints [`render_table`] or [`render_json`].

use super::epilogue::{Epilogue, Output};
use super::f32::{gemm_f32, PackedF32};
use super::int8::{gemm_i8_with, Activations, PackedI8};
use super::peak::{measure_peak, Peak};
use super::select::{pick_f32, pick_int8, F32Kernel, Int8Kernel};
use std::time::{Duration, Instant};

/// One kernel's measurement.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelBenchResult {
    /// Kernel name (`avx512vnni`, `f32-avx512`, …).
    pub kernel: String,
    /// `"int8"` or `"f32"`.
    pub dtype: &'static str,
    /// Problem size.
    pub m: usize,
    /// Problem size.
    pub n: usize,
    /// Problem size.
    pub k: usize,
    /// Threads used.
    pub threads: usize,
    /// Best time of one GEMM, seconds.
    pub seconds: f64,
    /// `2·m·n·k / seconds / 1e9`.
    pub gops: f64,
    /// `gops` over the measured peak of the same data type and thread count (0 if unknown).
    pub fraction_of_peak: f64,
    /// Whether the picker would choose this kernel for this problem.
    pub picked: bool,
}

/// Times `f` (after one warm-up call): best of at least 3 runs or `budget`, whichever is longer.
pub fn time_best(budget: Duration, mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    let mut best = f64::INFINITY;
    let mut runs = 0;
    while runs < 3 || start.elapsed() < budget {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
        runs += 1;
    }
    best
}

/// Problems above this many multiply-adds skip the scalar kernels in [`hwbench`].
pub const SCALAR_MAX_MACS: usize = 1 << 27;

/// Benchmarks every supported int8 kernel (i32 output, the raw kernel) and every supported f32
/// kernel on `m × n × k` with `threads` threads (the scalar ones only up to
/// [`SCALAR_MAX_MACS`]). Each takes about 0.2 s (at least 3 runs).
///
/// ```no_run
/// let rows = codegen::kernels::hwbench::hwbench(128, 768, 768, 1);
/// print!("{}", codegen::kernels::hwbench::render_table(&rows));
/// ```
pub fn hwbench(m: usize, n: usize, k: usize, threads: usize) -> Vec<KernelBenchResult> {
    // The scalar kernels run at a few GOPS: skip them where one call would take seconds.
    let small = m.saturating_mul(n).saturating_mul(k) <= SCALAR_MAX_MACS;
    let int8: Vec<Int8Kernel> = Int8Kernel::ALL
        .into_iter()
        .filter(|k| small || *k != Int8Kernel::Scalar)
        .collect();
    let f32k: Vec<F32Kernel> = F32Kernel::ALL
        .into_iter()
        .filter(|k| small || *k != F32Kernel::Scalar)
        .collect();
    hwbench_with(
        m,
        n,
        k,
        threads,
        &measure_peak(threads),
        &int8,
        &f32k,
        Duration::from_millis(200),
    )
}

/// [`hwbench`] with the peak, the kernel lists and the time budget per kernel given.
#[allow(clippy::too_many_arguments)]
pub fn hwbench_with(
    m: usize,
    n: usize,
    k: usize,
    threads: usize,
    peak: &Peak,
    int8: &[Int8Kernel],
    f32k: &[F32Kernel],
    budget: Duration,
) -> Vec<KernelBenchResult> {
    let ops = 2.0 * (m * n * k) as f64;
    let mut out = Vec::new();
    let a8: Vec<u8> = (0..m * k).map(|i| (i * 7 % 251) as u8).collect();
    let b8: Vec<i8> = (0..n * k).map(|i| (i * 13 % 255) as i8).collect();
    let picked8 = pick_int8(m, n, k);
    let mut c32 = vec![0i32; m * n];
    for &kern in int8 {
        if !kern.is_supported() {
            continue;
        }
        let Ok(p) = PackedI8::pack_for(kern, &b8, k, n, k, true) else {
            continue;
        };
        let s = time_best(budget, || {
            gemm_i8_with(
                kern,
                m,
                Activations::U8(&a8),
                k,
                &p,
                Output::I32 {
                    c: &mut c32,
                    ldc: n,
                },
                &Epilogue::none(),
                threads,
            )
            .expect("supported kernel");
        });
        let gops = ops / s / 1e9;
        let unit_peak = peak.int8_ops_per_s(kern);
        let frac = if unit_peak > 0.0 {
            gops * 1e9 / unit_peak
        } else {
            0.0
        };
        out.push(KernelBenchResult {
            kernel: kern.name().into(),
            dtype: "int8",
            m,
            n,
            k,
            threads,
            seconds: s,
            gops,
            fraction_of_peak: frac,
            picked: kern == picked8,
        });
    }
    let af: Vec<f32> = a8.iter().map(|&v| v as f32 / 255.0).collect();
    let bf: Vec<f32> = b8.iter().map(|&v| v as f32 / 127.0).collect();
    let mut cf = vec![0f32; m * n];
    let pickedf = pick_f32();
    for &kern in f32k {
        if !kern.is_supported() {
            continue;
        }
        let p = PackedF32::pack_strided(kern, &bf, k, n, k, true);
        let s = time_best(budget, || {
            gemm_f32(m, &af, k, &p, &mut cf, n, &Epilogue::none(), threads)
        });
        let gops = ops / s / 1e9;
        let frac = if peak.fma_flops_per_s > 0.0 {
            gops * 1e9 / peak.fma_flops_per_s
        } else {
            0.0
        };
        out.push(KernelBenchResult {
            kernel: kern.name().into(),
            dtype: "f32",
            m,
            n,
            k,
            threads,
            seconds: s,
            gops,
            fraction_of_peak: frac,
            picked: kern == pickedf,
        });
    }
    out
}

/// A plain-text table, the picker's choices marked `<--`.
///
/// ```
/// use codegen::kernels::hwbench::{render_table, KernelBenchResult};
/// let r = KernelBenchResult { kernel: "scalar".into(), dtype: "int8", m: 1, n: 1, k: 1, threads: 1,
///     seconds: 1e-6, gops: 0.002, fraction_of_peak: 0.0, picked: true };
/// assert!(render_table(&[r]).contains("<--"));
/// ```
pub fn render_table(rows: &[KernelBenchResult]) -> String {
    let mut s = format!(
        "{:<12} {:<5} {:>6} {:>6} {:>6} {:>3} {:>11} {:>9} {:>7}\n",
        "kernel", "dtype", "M", "N", "K", "thr", "time(us)", "GOPS", "%peak"
    );
    for r in rows {
        s += &format!(
            "{:<12} {:<5} {:>6} {:>6} {:>6} {:>3} {:>11.1} {:>9.1} {:>6.1}%{}\n",
            r.kernel,
            r.dtype,
            r.m,
            r.n,
            r.k,
            r.threads,
            r.seconds * 1e6,
            r.gops,
            r.fraction_of_peak * 100.0,
            if r.picked { "  <--" } else { "" }
        );
    }
    s
}

/// A JSON array of the rows (no serde dependency; names are plain ASCII).
///
/// ```
/// use codegen::kernels::hwbench::{render_json, KernelBenchResult};
/// let r = KernelBenchResult { kernel: "avx2".into(), dtype: "int8", m: 2, n: 3, k: 4, threads: 1,
///     seconds: 0.5, gops: 1.0, fraction_of_peak: 0.25, picked: false };
/// assert!(render_json(&[r]).starts_with("[{\"kernel\":\"avx2\""));
/// ```
pub fn render_json(rows: &[KernelBenchResult]) -> String {
    let items: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "{{\"kernel\":\"{}\",\"dtype\":\"{}\",\"m\":{},\"n\":{},\"k\":{},\"threads\":{},\"seconds\":{:e},\"gops\":{:.3},\"fraction_of_peak\":{:.4},\"picked\":{}}}",
                r.kernel, r.dtype, r.m, r.n, r.k, r.threads, r.seconds, r.gops, r.fraction_of_peak, r.picked
            )
        })
        .collect();
    format!("[{}]", items.join(","))
}

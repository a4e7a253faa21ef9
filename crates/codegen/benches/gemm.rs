//! Roofline benchmark of the GEMM kernels.
//!
//! `cargo bench -p codegen --bench gemm [-- [--json out.json] [--quick | --m M] [--int8-only]]`
//! (`--int8-only` skips the f32 and scalar kernels; the onnxruntime script uses it;
//! `--epilogues [--threads T] [--m M]` only times the fused epilogue programs of a BERT-base layer:
//! each GEMM with its epilogue, its share of the units' time and its thread-time per 16 outputs
//! from the units' cycle counters (`record_unit_cycles`), then the same GEMMs over twelve layers
//! of distinct weights).
//!
//! Prints the measured VNNI / FMA peaks for 1 and 2 threads, then GOPS and the fraction of the
//! matching peak for every supported kernel on M ∈ {128, 1024, 4096} × (N, K) ∈ {(768, 768),
//! (2304, 768), (3072, 768), (768, 3072)}, threads ∈ {1, 2}. The scalar kernels only run at
//! M = 128 (they would take minutes on the larger shapes).

use codegen::kernels::hwbench::time_best;
use codegen::kernels::hwbench::{hwbench_with, render_json, render_table, KernelBenchResult};
use codegen::kernels::int8::{gemm_i8, gemm_i8_step, Activations, NextGemm, PackedI8};
use codegen::kernels::{measure_peak, F32Kernel, Int8Kernel, Peak};
use codegen::kernels::{
    pick_int8, Epilogue, EpilogueOp, ForkOut, HeadsOut, Output, QType, RowParam,
};
use std::time::Duration;

/// The picked int8 kernel with the fused dequant → requant(u8) epilogue: the equivalent of ONNX
/// QLinearMatMul / a QDQ MatMul, for the onnxruntime comparison.
fn requant_row(m: usize, n: usize, k: usize, threads: usize, peak: &Peak) -> KernelBenchResult {
    let kern = pick_int8(m, n, k);
    let a: Vec<u8> = (0..m * k).map(|i| (i * 7 % 251) as u8).collect();
    let w: Vec<i8> = (0..n * k).map(|i| (i * 13 % 255) as i8).collect();
    let b = PackedI8::pack_for(kern, &w, k, n, k, true).expect("packing");
    let ws = vec![0.01f32; n];
    let ep = Epilogue::new(vec![
        EpilogueOp::Dequant {
            a_scale: RowParam::PerTensor(0.02),
            a_zero: RowParam::PerTensor(128),
            w_scale: &ws,
        },
        EpilogueOp::Requant {
            scale: 2.0,
            zero_point: 128,
            ty: QType::U8,
        },
    ]);
    let mut y = vec![0u8; m * n];
    let s = time_best(Duration::from_millis(150), || {
        gemm_i8(
            m,
            Activations::U8(&a),
            k,
            &b,
            Output::U8 { c: &mut y, ldc: n },
            &ep,
            threads,
        )
        .expect("int8 gemm");
    });
    let gops = 2.0 * (m * n * k) as f64 / s / 1e9;
    KernelBenchResult {
        kernel: format!("{}+rq", kern.name()),
        dtype: "int8",
        m,
        n,
        k,
        threads,
        seconds: s,
        gops,
        fraction_of_peak: gops * 1e9 / peak.int8_ops_per_s(kern),
        picked: false,
    }
}

/// The output of a layer's GEMM of `n` columns in [`epilogue_costs`]' twelve-layer runs: the
/// FFN up-projection's (3072) requantized bytes, the others' f32.
fn layer_output<'a>(m: usize, n: usize, yu: &'a mut [u8], yf: &'a mut [f32]) -> Output<'a> {
    if n == 3072 {
        Output::U8 {
            c: &mut yu[..m * n],
            ldc: n,
        }
    } else {
        Output::F32 {
            c: &mut yf[..m * n],
            ldc: n,
        }
    }
}

/// Time-stamp counter ticks per nanosecond (the rate of the units' cycle counters), measured
/// over 50 ms; 1 off x86-64, where the counters are nanoseconds.
fn tsc_per_ns() -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `rdtsc` exists on every x86-64 CPU and has no preconditions.
        let read = || unsafe { std::arch::x86_64::_rdtsc() };
        let (t0, c0) = (std::time::Instant::now(), read());
        std::thread::sleep(Duration::from_millis(50));
        (read() - c0) as f64 / t0.elapsed().as_nanos() as f64
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        1.0
    }
}

/// `--epilogues`: the cost of the fused epilogue programs of a BERT-base layer (static
/// activations, M = 1024 tokens = batch 8 × 128 unless `--m` says otherwise (128: batch 1),
/// picked int8 kernel): each GEMM with its encoder epilogue beside the same GEMM storing the
/// bare i32 product.
fn epilogue_costs(threads: usize, m: usize) {
    let kern = pick_int8(m, 3072, 768);
    let bias = vec![0.1f32; 3072];
    let gamma = vec![1.0f32; 3072];
    let beta = vec![0.0f32; 3072];
    let smooth = vec![0.9f32; 3072];
    let ws = vec![1e-4f32; 3072];
    let residual: Vec<f32> = (0..m * 768).map(|i| (i % 17) as f32 * 0.1).collect();
    let dq = EpilogueOp::Dequant {
        a_scale: RowParam::PerTensor(0.02),
        a_zero: RowParam::PerTensor(128),
        w_scale: &ws,
    };
    let rq = EpilogueOp::Requant {
        scale: 0.05,
        zero_point: 128,
        ty: QType::U8,
    };
    // The LayerNorm GEMMs also write the u8 copy (SmoothQuant factors applied) that the next
    // GEMM reads, as the fuse pipeline makes them (`fork_u8 … smooth`).
    let mut fork = vec![0u8; m * 768];
    let mut res_ln = |n: usize| {
        vec![
            dq,
            EpilogueOp::Bias(&bias),
            EpilogueOp::AddResidual {
                data: &residual,
                ld: n,
            },
            EpilogueOp::LayerNorm {
                gamma: &gamma,
                beta: &beta,
                eps: 1e-12,
            },
            EpilogueOp::ForkU8 {
                smooth: Some(&smooth[..n]),
                scale: 0.005,
                zero_point: 128,
                out: ForkOut::new(&mut fork, n),
            },
        ]
    };
    let gemms: Vec<(&str, usize, usize, Vec<EpilogueOp<'_>>)> = vec![
        (
            "qkv: dequant+bias -> quantized heads (int8 attention)",
            2304,
            768,
            vec![dq, EpilogueOp::Bias(&bias)],
        ),
        (
            "attn-out: dequant+bias+residual+layernorm -> f32 + u8 copy",
            768,
            768,
            res_ln(768),
        ),
        (
            "ffn1: dequant+bias+gelu(erf)+mulcol+requant -> u8",
            3072,
            768,
            vec![
                dq,
                EpilogueOp::Bias(&bias),
                EpilogueOp::GeluErf,
                EpilogueOp::MulCol(&smooth),
                rq,
            ],
        ),
        (
            "ffn2: dequant+bias+residual+layernorm -> f32 + u8 copy",
            768,
            3072,
            res_ln(768),
        ),
    ];
    let a: Vec<u8> = (0..m * 3072).map(|i| (i * 7 % 251) as u8).collect();
    let (mut total_ep, mut total_bare) = (0.0, 0.0);
    // Measured once: the counters' rate does not change between the GEMMs.
    let tsc_rate = tsc_per_ns();
    for (name, n, k, ops) in gemms {
        let w: Vec<i8> = (0..n * k).map(|i| (i * 13 % 255) as i8).collect();
        let b = PackedI8::pack_for(kern, &w, k, n, k, true).expect("packing");
        let quantized = matches!(ops.last(), Some(EpilogueOp::Requant { .. }));
        let ep = Epilogue::new(ops);
        let mut y32 = vec![0i32; m * n];
        let mut yf = vec![0f32; m * n];
        let mut yu = vec![0u8; m * n];
        let bare = time_best(Duration::from_millis(400), || {
            let out = Output::I32 {
                c: &mut y32,
                ldc: n,
            };
            gemm_i8(
                m,
                Activations::U8(&a),
                k,
                &b,
                out,
                &Epilogue::none(),
                threads,
            )
            .expect("gemm");
        });
        let calls = std::cell::Cell::new(0usize);
        let mut fused_with = |register_chains: bool| {
            #[cfg(target_arch = "x86_64")]
            codegen::kernels::epilogue_chain::set_register_chains(register_chains);
            let t = time_best(Duration::from_millis(400), || {
                calls.set(calls.get() + 1);
                let out = if quantized {
                    Output::U8 { c: &mut yu, ldc: n }
                } else if n == 2304 {
                    let bytes = &mut yu[..m * 1536];
                    let (scales, v) = yf.split_at_mut(m * 24);
                    Output::Heads(HeadsOut {
                        bytes,
                        ld_bytes: 1536,
                        scales: &mut scales[..],
                        ld_scales: 24,
                        v: &mut v[..m * 768],
                        ld_v: 768,
                        hidden: 768,
                        head_dim: 64,
                    })
                } else {
                    Output::F32 { c: &mut yf, ldc: n }
                };
                gemm_i8(m, Activations::U8(&a), k, &b, out, &ep, threads).expect("gemm");
            });
            #[cfg(target_arch = "x86_64")]
            codegen::kernels::epilogue_chain::set_register_chains(true);
            t
        };
        // The multi-pass epilogue (one pass over a scratch row per op) beside the default,
        // which runs elementwise chains in registers on AVX-512.
        let multi_pass = fused_with(false);
        let fused = fused_with(true);
        // The epilogues' share of the units' time, read from the time-stamp counters the units
        // keep while a recording is open: the bare product above stores i32 to memory, a
        // cost of its own, so its difference to the fused time says little.
        calls.set(0);
        // The counters are process-wide and only grow: this GEMM's are the difference.
        let recorded = codegen::kernels::int8::record_unit_cycles(|| {
            let before = codegen::kernels::int8::unit_cycles_so_far().unwrap_or_default();
            fused_with(true);
            codegen::kernels::int8::unit_cycles_so_far().unwrap_or_default() - before
        });
        let share = recorded.epilogue_share().unwrap_or(0.0);
        // The counters tick at the time-stamp counter's rate: thread-time in the epilogues per
        // 16 outputs (all threads' ticks over all the recorded calls).
        let per_vector =
            recorded.epilogue as f64 / tsc_rate / (calls.get() * m * n / 16).max(1) as f64;
        total_ep += fused;
        total_bare += bare;
        let per_output = |t: f64| (t - bare) * 1e9 / (m * n) as f64;
        println!(
            "{} {m}x{n}x{k} {threads} thread(s), {name}: {:.2} ms, bare i32 {:.2} ms (difference {:.1} ns per output, multi-pass {:.1}); epilogue {:.1} % of the units' time, {per_vector:.1} ns of a thread per 16 outputs",
            kern.name(),
            fused * 1e3,
            bare * 1e3,
            per_output(fused),
            per_output(multi_pass),
            100.0 * share
        );
    }
    println!(
        "one layer's four GEMMs: {:.2} ms with epilogues, {:.2} ms bare ({:.0} % epilogue)",
        total_ep * 1e3,
        total_bare * 1e3,
        100.0 * (total_ep - total_bare) / total_ep
    );
    // The same four GEMMs over twelve layers of distinct weights (85 MB of int8, more than the
    // last-level caches), in model order: what the weights streaming from memory cost beside
    // the one-layer figure above, whose weights stay cached between repetitions.
    let layers: Vec<Vec<(usize, usize, PackedI8, Epilogue<'_>)>> = (0..12)
        .map(|l| {
            [(2304usize, 768usize), (768, 768), (3072, 768), (768, 3072)]
                .iter()
                .map(|&(n, k)| {
                    let w: Vec<i8> = (0..n * k).map(|i| ((i + l) * 13 % 255) as i8).collect();
                    let b = PackedI8::pack_for(kern, &w, k, n, k, true).expect("packing");
                    let ep = if n == 3072 {
                        Epilogue::new(vec![
                            dq,
                            EpilogueOp::Bias(&bias),
                            EpilogueOp::GeluErf,
                            EpilogueOp::MulCol(&smooth),
                            rq,
                        ])
                    } else if n == 768 {
                        Epilogue::new(res_ln(768))
                    } else {
                        Epilogue::new(vec![dq, EpilogueOp::Bias(&bias)])
                    };
                    (n, k, b, ep)
                })
                .collect()
        })
        .collect();
    let mut yf = vec![0f32; m * 3072];
    let mut yu = vec![0u8; m * 3072];
    let streamed = time_best(Duration::from_millis(1500), || {
        for layer in &layers {
            for (n, k, b, ep) in layer {
                let out = layer_output(m, *n, &mut yu, &mut yf);
                gemm_i8(m, Activations::U8(&a), *k, b, out, ep, threads).expect("gemm");
            }
        }
    });
    println!(
        "twelve layers of distinct weights: {:.2} ms per layer ({:.0} % over the cached layer)",
        streamed * 1e3 / 12.0,
        100.0 * (streamed / 12.0 / total_ep - 1.0)
    );
    // As the runtime runs them: each GEMM hands the driver the weights of the one after it,
    // whose first blocks its threads prefetch into L2 once their own block is in cache.
    let order: Vec<&(usize, usize, PackedI8, Epilogue<'_>)> = layers.iter().flatten().collect();
    let prefetched = time_best(Duration::from_millis(1500), || {
        for (i, &&(n, k, ref b, ref ep)) in order.iter().enumerate() {
            let next = order.get(i + 1).map(|g| NextGemm {
                weights: &g.2,
                row_epilogue: g.0 == 768,
                col_granularity: 1,
                threads,
            });
            let out = layer_output(m, n, &mut yu, &mut yf);
            gemm_i8_step(m, Activations::U8(&a), k, b, out, ep, threads, None, next).expect("gemm");
        }
    });
    println!(
        "the same with the next GEMM's weights prefetched: {:.2} ms per layer ({:.0} % over the cached layer)",
        prefetched * 1e3 / 12.0,
        100.0 * (prefetched / 12.0 / total_ep - 1.0)
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--epilogues") {
        let threads = args
            .iter()
            .position(|a| a == "--threads")
            .and_then(|i| args.get(i + 1))
            .map_or(1, |t| t.parse().expect("--threads takes a count"));
        let m = args
            .iter()
            .position(|a| a == "--m")
            .and_then(|i| args.get(i + 1))
            .map_or(1024, |m| m.parse().expect("--m takes a row count"));
        epilogue_costs(threads, m);
        return;
    }
    let json_path = args
        .iter()
        .position(|a| a == "--json")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let quick = args.iter().any(|a| a == "--quick");
    let int8_only = args.iter().any(|a| a == "--int8-only");
    let only_m: Option<usize> = args
        .iter()
        .position(|a| a == "--m")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok());
    let ms: Vec<usize> = match only_m {
        Some(m) => vec![m],
        None if quick => vec![128, 1024],
        None => vec![128, 1024, 4096],
    };
    let nks: &[(usize, usize)] = &[(768, 768), (2304, 768), (3072, 768), (768, 3072)];
    let threads_list: Vec<usize> = vec![1, 2];
    let mut peaks = Vec::new();
    for &t in &threads_list {
        let p = measure_peak(t);
        println!(
            "peak {t} thread(s): int8 vpdpbusd {:.1} GOPS, AMX tdpbusd {:.1} GOPS, f32 FMA {:.1} GFLOP/s",
            p.vnni_ops_per_s / 1e9,
            p.amx_ops_per_s / 1e9,
            p.fma_flops_per_s / 1e9
        );
        peaks.push(p);
    }
    let mut all: Vec<KernelBenchResult> = Vec::new();
    for &m in &ms {
        for &(n, k) in nks {
            for (ti, &t) in threads_list.iter().enumerate() {
                let int8: Vec<Int8Kernel> = Int8Kernel::ALL
                    .into_iter()
                    .filter(|k| *k != Int8Kernel::Scalar || (m == 128 && !int8_only))
                    .collect();
                let f32k: Vec<F32Kernel> = F32Kernel::ALL
                    .into_iter()
                    .filter(|k| (*k != F32Kernel::Scalar || m == 128) && !int8_only)
                    .collect();
                // The machine may be shared: re-measure the peak next to each configuration and
                // keep the best seen, so a busy spell does not inflate the fractions.
                let fresh = measure_peak(t);
                let p = &mut peaks[ti];
                p.vnni_ops_per_s = p.vnni_ops_per_s.max(fresh.vnni_ops_per_s);
                p.fma_flops_per_s = p.fma_flops_per_s.max(fresh.fma_flops_per_s);
                p.amx_ops_per_s = p.amx_ops_per_s.max(fresh.amx_ops_per_s);
                let mut rows =
                    hwbench_with(m, n, k, t, p, &int8, &f32k, Duration::from_millis(150));
                rows.push(requant_row(m, n, k, t, p));
                eprint!("{}", render_table(&rows));
                all.extend(rows);
            }
        }
    }
    // Fractions against the best peak seen during the whole run.
    for r in &mut all {
        let p = peaks
            .iter()
            .find(|p| p.threads == r.threads)
            .expect("peak per thread count");
        // The int8 rows are named after their kernel (`amx`, `amx+rq`, ...).
        let int8_kernel = r.kernel.split('+').next().map(Int8Kernel::parse);
        let peak = if let (true, Some(Ok(k))) = (r.dtype == "int8", int8_kernel) {
            p.int8_ops_per_s(k)
        } else {
            p.fma_flops_per_s
        };
        r.fraction_of_peak = if peak > 0.0 { r.gops * 1e9 / peak } else { 0.0 };
    }
    println!("\nresults (fraction of the best peak seen):");
    print!("{}", render_table(&all));
    println!("\nsummary (mean fraction of measured peak, M >= 1024):");
    for kern in [
        "avx512vnni",
        "avxvnni",
        "avx2",
        "amx",
        "f32-avx512",
        "f32-avx2",
    ] {
        for &t in &threads_list {
            let v: Vec<f64> = all
                .iter()
                .filter(|r| r.kernel == kern && r.threads == t && r.m >= 1024)
                .map(|r| r.fraction_of_peak)
                .collect();
            if !v.is_empty() {
                println!(
                    "  {kern:<11} {t} thread(s): {:.1}% (min {:.1}%)",
                    100.0 * v.iter().sum::<f64>() / v.len() as f64,
                    100.0 * v.iter().cloned().fold(f64::INFINITY, f64::min)
                );
            }
        }
    }
    for p in &peaks {
        println!(
            "best peak seen, {} thread(s): int8 {:.1} GOPS, AMX {:.1} GOPS, f32 {:.1} GFLOP/s",
            p.threads,
            p.vnni_ops_per_s / 1e9,
            p.amx_ops_per_s / 1e9,
            p.fma_flops_per_s / 1e9
        );
    }
    if let Some(p) = json_path {
        let peaks_json: Vec<String> = peaks
            .iter()
            .map(|p| {
                format!(
                    "{{\"threads\":{},\"vnni_ops_per_s\":{:e},\"amx_ops_per_s\":{:e},\"fma_flops_per_s\":{:e}}}",
                    p.threads, p.vnni_ops_per_s, p.amx_ops_per_s, p.fma_flops_per_s
                )
            })
            .collect();
        let doc = format!(
            "{{\"peaks\":[{}],\"results\":{}}}\n",
            peaks_json.join(","),
            render_json(&all)
        );
        std::fs::write(&p, doc).expect("writing the JSON report");
        println!("wrote {p}");
    }
}

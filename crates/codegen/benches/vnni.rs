//! The AVX512-VNNI microkernel alone: where its time goes against the `vpdpbusd` peak.
//!
//! `cargo bench -p codegen --bench vnni` times one thread's 8×48 microkernel calls in the access
//! patterns a GEMM can give them (each a row): `l1` (one A micro-panel and one B panel of
//! K = 256, both in L1; `l1-k768` the same with K = 768, 42 KB); `-nx` rows hand the kernel the
//! caller's next weights to walk into L2 instead of prefetching its own B; `a-stat` (the driver's order: an A micro-panel against every B panel
//! of N = 768 or of a 1 MB block, K = 768, the panels streaming from L2); `b-stat` (one B panel
//! of K = 768 or 256 against the A micro-panels of 256 rows, rows at stride K).

use codegen::kernels::int8::avx512vnni::{ukernel, MR, NR};
use codegen::kernels::AlignedBuf;
use std::time::Instant;

struct Scenario {
    name: &'static str,
    kc: usize,
    a_panels: usize,
    b_panels: usize,
    a_outer: bool,
    /// Hand the kernel a `next` (the caller's next weights, into L2) instead of null.
    next: bool,
}

const SCENARIOS: [Scenario; 9] = [
    Scenario {
        name: "a-stat-1mb-nx",
        kc: 768,
        a_panels: 8,
        b_panels: 28,
        a_outer: true,
        next: true,
    },
    Scenario {
        name: "a-stat-k3072-nx",
        kc: 3072,
        a_panels: 8,
        b_panels: 7,
        a_outer: true,
        next: true,
    },
    // Both panels in L1 (6 + 36 KB): the instruction mix and the call alone.
    Scenario {
        name: "l1-k768",
        kc: 768,
        a_panels: 1,
        b_panels: 1,
        a_outer: true,
        next: false,
    },
    Scenario {
        name: "l1",
        kc: 256,
        a_panels: 1,
        b_panels: 1,
        a_outer: true,
        next: false,
    },
    Scenario {
        name: "a-stat-n768",
        kc: 768,
        a_panels: 8,
        b_panels: 16,
        a_outer: true,
        next: false,
    },
    Scenario {
        name: "a-stat-1mb",
        kc: 768,
        a_panels: 8,
        b_panels: 28,
        a_outer: true,
        next: false,
    },
    Scenario {
        name: "a-stat-k3072",
        kc: 3072,
        a_panels: 8,
        b_panels: 7,
        a_outer: true,
        next: false,
    },
    Scenario {
        name: "b-stat-k768",
        kc: 768,
        a_panels: 32,
        b_panels: 4,
        a_outer: false,
        next: false,
    },
    Scenario {
        name: "b-stat-k256",
        kc: 256,
        a_panels: 32,
        b_panels: 4,
        a_outer: false,
        next: false,
    },
];

fn time(s: &Scenario, secs: f64) -> f64 {
    let mut a = AlignedBuf::<u8>::zeroed(s.a_panels * MR * s.kc);
    a.fill(1);
    let mut b = AlignedBuf::<i8>::zeroed(s.b_panels * s.kc * NR);
    b.fill(2);
    let ldc = NR * s.b_panels;
    let mut c = AlignedBuf::<i32>::zeroed(MR * ldc);
    let (ap, bp, cp) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
    let hint = AlignedBuf::<i8>::zeroed(if s.next { 1 << 22 } else { 64 });
    let mut at = 0usize;
    let ops_per_sweep = (s.a_panels * s.b_panels * MR * NR * s.kc * 2) as f64;
    let mut sweep = || {
        let (no, ni) = if s.a_outer {
            (s.a_panels, s.b_panels)
        } else {
            (s.b_panels, s.a_panels)
        };
        for o in 0..no {
            for i in 0..ni {
                let (ia, ib) = if s.a_outer { (o, i) } else { (i, o) };
                // SAFETY: the panels and the tile lie inside the buffers sized above.
                let next = if s.next {
                    at = (at + 64 * s.kc / 4) % ((1 << 22) - 64 * s.kc);
                    hint.as_ptr().wrapping_add(at)
                } else {
                    std::ptr::null()
                };
                unsafe {
                    ukernel(
                        s.kc / 4,
                        ap.add(ia * MR * s.kc),
                        bp.add(ib * s.kc * NR),
                        cp.add(ib * NR),
                        ldc,
                        next,
                    )
                };
            }
        }
    };
    for _ in 0..3 {
        sweep();
    }
    let mut sweeps = 0usize;
    let t0 = Instant::now();
    while t0.elapsed().as_secs_f64() < secs {
        for _ in 0..8 {
            sweep();
        }
        sweeps += 8;
    }
    let dt = t0.elapsed().as_secs_f64();
    assert!(
        c.iter().all(|&v| v == 2 * s.kc as i32),
        "{}: wrong results",
        s.name
    );
    ops_per_sweep * sweeps as f64 / dt / 1e12
}

fn main() {
    if !(std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512vnni"))
    {
        println!("SKIP vnni bench: this CPU has no AVX512-VNNI; nothing to time");
        return;
    }
    let peak = codegen::kernels::measure_peak(1).vnni_ops_per_s / 1e12;
    println!("vpdpbusd peak, 1 thread: {peak:.2} TOPS");
    for s in &SCENARIOS {
        let t = time(s, 0.5);
        println!("{:<14}{:>8.3} TOPS {:>6.1}%", s.name, t, 100.0 * t / peak);
    }
}

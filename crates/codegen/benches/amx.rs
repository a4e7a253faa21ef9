//! The AMX microkernel on hardware, alone: where its time goes against the `tdpbusd` peak.
//!
//! `cargo bench -p codegen --bench amx` times one thread's 32×32 microkernel calls in the access
//! patterns a GEMM gives them, for the kernel the runtime runs and for other schedules (each a
//! column):
//! - `l1`: one A micro-panel and one B panel of K = 256, both in L1, called over and over;
//! - `a-stat`: one A micro-panel (K = 768) against the 24 B panels of N = 768 (576 KB, in L2),
//!   i32 results into a 32 × 768 accumulator: the driver's order today;
//! - `a-stat-c4k`: the same with every call's results into one 4 KB block;
//! - `b-stat`: one B panel (K = 768) against 32 A micro-panels (M = 1024, rows at stride K);
//! - `a-stat-k3072`: FFN2's shape, one A micro-panel of K = 3072 (96 KB) against 24 B panels.
//!
//! The columns: `product` (the kernel the runtime runs: A0, B0, B1, A1 per K step, asking for
//! the B lines two K steps ahead), `no-pf` (that order without prefetch), `pf-ab-1` (asking for the
//! next step's A rows and B lines), `b-first` (B0, B1, A0, A1) and `b-first-pf-b` (that with the
//! B lines two steps ahead). Each prints TOPS and the percentage of the `tdpbusd` peak measured
//! first (the best of six short loops; a busy sibling of the core halves it, so compare columns
//! within a run).
//!
//! On a CPU without AMX it says so and runs every schedule once on the software tile unit,
//! checking the results: nothing to time.

use codegen::kernels::int8::amx::{self, HwTiles, MR, NR};
use codegen::kernels::int8::tile_model::TileUnit;
use codegen::kernels::AlignedBuf;
use std::time::Instant;

/// A schedule of one 32×32 block over `kc4` K-quads, with [`amx::ukernel_body`]'s signature.
type Body<T> = unsafe fn(&mut T, usize, *const u8, *const i8, *mut i32, usize);

#[inline(always)]
fn prefetch(p: *const u8) {
    // SAFETY: a prefetch never faults, whatever the address.
    unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p as *const i8) }
}

/// One K step's tile loads and products in order `B_FIRST` (B0, B1, A0, then A1: each A tile
/// feeds its two products back to back) or not (A0, B0, B1, A1: the product kernel's order),
/// asking for the A rows (`PF_A`: one line per row, 32) and B lines (`PF_B`: 32) of the K step
/// `DIST` ahead into L1, half before the step's first products and half before its last.
#[inline(always)]
unsafe fn schedule<
    T: TileUnit,
    const B_FIRST: bool,
    const PF_A: bool,
    const PF_B: bool,
    const DIST: usize,
>(
    t: &mut T,
    kc4: usize,
    a: *const u8,
    b: *const i8,
    c: *mut i32,
    ldc: usize,
) {
    let kc = kc4 * 4;
    let ask = |pk: usize, rows: std::ops::Range<usize>| {
        if pk >= kc {
            return;
        }
        for i in rows {
            if PF_A {
                prefetch(a.wrapping_add(i * kc + pk));
            }
            if PF_B {
                prefetch((b as *const u8).wrapping_add(pk * NR + i * 64));
            }
        }
    };
    for tile in 0..4 {
        t.zero(tile);
    }
    let mut k0 = 0;
    while k0 < kc {
        let pk = k0 + 64 * DIST;
        ask(pk, 0..16);
        // SAFETY: as `amx::ukernel_body`; the prefetches may run past the panels (no fault).
        unsafe {
            let bq = b.add(k0 * NR) as *const u8;
            if B_FIRST {
                t.load(6, bq, NR * 4);
                t.load(7, bq.add(64), NR * 4);
                t.load(4, a.add(k0), kc);
                t.dpbusd(0, 4, 6);
                t.dpbusd(1, 4, 7);
            } else {
                t.load(4, a.add(k0), kc);
                t.load(6, bq, NR * 4);
                t.dpbusd(0, 4, 6);
                t.load(7, bq.add(64), NR * 4);
                t.dpbusd(1, 4, 7);
            }
            ask(pk, 16..32);
            t.load(5, a.add(16 * kc + k0), kc);
            t.dpbusd(2, 5, 6);
            t.dpbusd(3, 5, 7);
        }
        k0 += 64;
    }
    // SAFETY: the caller's 32×32 block.
    unsafe { amx::store_block(t, c, ldc) };
}

/// The schedules timed: the product kernel and others (all give the same results, checked).
fn bodies<T: TileUnit>() -> [(&'static str, Body<T>); 5] {
    [
        ("product", amx::ukernel_body::<T>),
        ("no-pf", schedule::<T, false, false, false, 2>),
        ("pf-ab-1", schedule::<T, false, true, true, 1>),
        ("b-first", schedule::<T, true, false, false, 2>),
        ("b-first-pf-b", schedule::<T, true, false, true, 2>),
    ]
}

struct Scenario {
    name: &'static str,
    kc: usize,
    a_panels: usize,
    b_panels: usize,
    /// Columns of the accumulator the results go to (32: one 4 KB block for every call).
    ldc_cols: usize,
    /// Whether the A micro-panel is the outer loop (its rows stay, the B panels stream).
    a_outer: bool,
}

const SCENARIOS: [Scenario; 5] = [
    Scenario {
        name: "l1",
        kc: 256,
        a_panels: 1,
        b_panels: 1,
        ldc_cols: 32,
        a_outer: true,
    },
    Scenario {
        name: "a-stat",
        kc: 768,
        a_panels: 1,
        b_panels: 24,
        ldc_cols: 768,
        a_outer: true,
    },
    Scenario {
        name: "a-stat-c4k",
        kc: 768,
        a_panels: 1,
        b_panels: 24,
        ldc_cols: 32,
        a_outer: true,
    },
    Scenario {
        name: "b-stat",
        kc: 768,
        a_panels: 32,
        b_panels: 1,
        ldc_cols: 32,
        a_outer: false,
    },
    Scenario {
        name: "a-stat-k3072",
        kc: 3072,
        a_panels: 1,
        b_panels: 24,
        ldc_cols: 768,
        a_outer: true,
    },
];

/// Tera-ops per second of `body` in scenario `s` over about `secs` seconds (A and B bytes of
/// 1 and 2, so every result is `2·kc`, checked).
fn time<T: TileUnit>(tiles: &mut T, body: Body<T>, s: &Scenario, secs: f64) -> f64 {
    // Every buffer on cache lines, as the driver's (`AlignedBuf`): split tile rows load and
    // store at a fraction of the speed.
    let mut a = AlignedBuf::<u8>::zeroed(s.a_panels * MR * s.kc);
    a.fill(1);
    let mut b = AlignedBuf::<i8>::zeroed(s.b_panels * s.kc * NR);
    b.fill(2);
    let mut c = AlignedBuf::<i32>::zeroed(MR * s.ldc_cols);
    let (ap, bp) = (a.as_ptr(), b.as_ptr());
    let calls_per_sweep = s.a_panels * s.b_panels;
    let ops_per_sweep = (calls_per_sweep * MR * NR * s.kc * 2) as f64;
    let sweep = |tiles: &mut T, c: &mut [i32]| {
        let cp = c.as_mut_ptr();
        for outer in 0..(if s.a_outer { s.a_panels } else { s.b_panels }) {
            for inner in 0..(if s.a_outer { s.b_panels } else { s.a_panels }) {
                let (ia, ib) = if s.a_outer {
                    (outer, inner)
                } else {
                    (inner, outer)
                };
                let col = if s.ldc_cols == 32 {
                    0
                } else {
                    ib * 32 % s.ldc_cols
                };
                // SAFETY: A panel ia and B panel ib lie inside the buffers (sized above);
                // the 32×32 block at column `col` lies inside C.
                unsafe {
                    body(
                        tiles,
                        s.kc / 4,
                        ap.add(ia * MR * s.kc),
                        bp.add(ib * s.kc * NR),
                        cp.add(col),
                        s.ldc_cols,
                    )
                };
            }
        }
    };
    tiles.configure(&amx::kernel_config());
    for _ in 0..3 {
        sweep(tiles, &mut c);
    }
    let mut sweeps = 0usize;
    let t0 = Instant::now();
    while t0.elapsed().as_secs_f64() < secs {
        for _ in 0..8 {
            sweep(tiles, &mut c);
        }
        sweeps += 8;
    }
    let dt = t0.elapsed().as_secs_f64();
    tiles.release();
    let want = 2 * s.kc as i32;
    let cols = s.ldc_cols.min(s.b_panels * 32);
    let wrong = (0..MR)
        .flat_map(|r| c[r * s.ldc_cols..r * s.ldc_cols + cols].iter())
        .filter(|&&v| v != want)
        .count();
    assert_eq!(wrong, 0, "{}: {wrong} results differ from {want}", s.name);
    ops_per_sweep * sweeps as f64 / dt / 1e12
}

fn main() {
    let mut tiles = match HwTiles::new() {
        Ok(t) => t,
        Err(e) => {
            // Still check every schedule's results, on the software tile unit.
            let mut model = codegen::kernels::int8::tile_model::TileModel::default();
            for s in SCENARIOS.iter().filter(|s| s.kc == 768) {
                for (_, body) in bodies() {
                    time(&mut model, body, s, 0.0);
                }
            }
            println!("SKIP amx bench: AMX is not usable on this CPU ({e}); nothing to time (the schedules' results were checked on the tile model)");
            return;
        }
    };
    // The best of several short loops: the first AMX use of a core runs slow for a while, and a
    // neighbour on the core's sibling slows it too.
    let iters = 400_000;
    let peak = (0..6)
        .map(|_| {
            let t0 = Instant::now();
            std::hint::black_box(amx::peak_loop(&mut tiles, iters));
            (iters * 4 * 16 * 16 * 64 * 2) as f64 / t0.elapsed().as_secs_f64() / 1e12
        })
        .fold(0.0, f64::max);
    println!("tdpbusd peak, 1 thread: {peak:.2} TOPS");
    print!("{:<14}", "scenario");
    for (name, _) in bodies::<HwTiles>() {
        print!("{name:>16}");
    }
    println!();
    for s in &SCENARIOS {
        print!("{:<14}", s.name);
        for (_, body) in bodies::<HwTiles>() {
            let tops = time(&mut tiles, body, s, 0.25);
            print!("{:>9.2} {:>5.1}%", tops, 100.0 * tops / peak);
        }
        println!();
    }
}

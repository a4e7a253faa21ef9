//! Can epilogue arithmetic hide under the microkernel's `vpdpbusd`?
//!
//! `cargo bench -p codegen --bench overlap` times a loop shaped like the AVX512-VNNI
//! microkernel's (a 4 × 48 tile: per K step three 64-byte B loads, four broadcasts of A and
//! 12 independent `vpdpbusd zmm`), alone and with `E` vectors of epilogue work put into every K
//! step, and the same epilogue work alone. The epilogue is a chain of the kinds of operations
//! the FFN1 chain runs per 16 outputs (absolute value, clamp, a piece index, five FMAs over six
//! two-table permutes, a select, a product, the requantization's division, rounding, the zero
//! point, the clamp to u8 and a store): if the CPU ran it on units the `vpdpbusd` leaves idle,
//! the interleaved loop would take the microkernel's time, and a fused kernel that applies the
//! previous tile's epilogue during the next tile's K loop would hide the epilogues (11-12 % of
//! a BERT-base INT8 run on Zen 4). Where it prints `added` close to `alone`, there is nothing to
//! win that way on this CPU.
//!
//! Prints, per `E`: ns per K step, the `vpdpbusd` rate, and the time each epilogue vector added
//! over the bare loop. SKIPs without AVX512-VNNI.
//!
//! Then the same for the tile unit, where the products do not run on the vector ports: a loop
//! shaped like the AMX microkernel's K step (two A and two B tiles loaded from L1, four
//! `tdpbusd` into a 32 × 32 block) with `E` epilogue vectors in each step. Where `added` stays
//! near 0, the chain runs while `tdpbusd` occupies the tile unit, and a kernel that ran the
//! previous block's epilogue inside its K loop would hide it. SKIPs (AMX) without AMX.

use std::hint::black_box;
use std::time::Instant;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Pieces the chain's table permutes index (two 16-lane tables a permute).
    pub const TABLE: usize = 64;
    /// Rows of the tile: the product's 8 would leave the epilogue 4 of the 32 vector registers
    /// and spill accumulators; 4 rows (12 accumulators) keep `vpdpbusd` at its peak alone and
    /// leave the chain room, so that what is measured is the units, not spills.
    pub const ROWS: usize = 4;

    /// One vector of the FFN1-like chain: `ep_out[16e..]` from `ep_in[16e..]`.
    ///
    /// # Safety
    /// The CPU has AVX-512F; vector `e` lies within both buffers.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub unsafe fn epilogue_vector(
        ep_in: &[f32],
        ep_out: &mut [f32],
        e: usize,
        table: &[f32; TABLE],
    ) {
        // SAFETY: vector e of both buffers; the table's four 16-float quarters.
        unsafe {
            let x = _mm512_loadu_ps(ep_in.as_ptr().add(16 * e));
            let t: [__m512; 4] =
                std::array::from_fn(|q| _mm512_loadu_ps(table.as_ptr().add(16 * q)));
            let ax = _mm512_min_ps(_mm512_abs_ps(x), _mm512_set1_ps(5.75));
            let idx = _mm512_cvttps_epi32(_mm512_mul_ps(ax, _mm512_set1_ps(4.0)));
            let f = _mm512_fmsub_ps(ax, _mm512_set1_ps(4.0), _mm512_cvtepi32_ps(idx));
            let mut p = _mm512_permutex2var_ps(t[0], idx, t[1]);
            for (lo, hi) in [(2, 3), (0, 3), (2, 1), (1, 3), (1, 2)] {
                p = _mm512_fmadd_ps(p, f, _mm512_permutex2var_ps(t[lo], idx, t[hi]));
            }
            let negative = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_setzero_ps());
            let phi = _mm512_mask_sub_ps(p, !negative, _mm512_set1_ps(1.0), p);
            let g = _mm512_mul_ps(x, phi);
            let q = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm512_div_ps(g, _mm512_set1_ps(0.02)),
            );
            let q = _mm512_add_ps(q, _mm512_set1_ps(46.0));
            let q = _mm512_min_ps(_mm512_set1_ps(255.0), _mm512_max_ps(_mm512_setzero_ps(), q));
            _mm512_storeu_ps(ep_out.as_mut_ptr().add(16 * e), q);
        }
    }

    /// `steps` K steps of a [`ROWS`] × 48 VNNI tile with `E` epilogue vectors in each (none of
    /// the products when `PRODUCTS` is false): returns values so that nothing is removed.
    ///
    /// # Safety
    /// The CPU has AVX512F, AVX512BW and AVX512-VNNI; `b` holds 256 steps of 192 bytes, `a`
    /// 2 KB, `table` [`TABLE`] floats, `ep_in` and `ep_out` the same whole number of vectors.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub unsafe fn run<const E: usize, const PRODUCTS: bool>(
        steps: usize,
        a: &[u8],
        b: &[i8],
        ep_in: &[f32],
        ep_out: &mut [f32],
        table: &[f32; TABLE],
    ) -> i32 {
        let mut acc = [[_mm512_setzero_si512(); 3]; ROWS];
        let vectors = ep_in.len() / 16;
        let mut e = 0;
        for s in 0..steps {
            if PRODUCTS {
                // SAFETY: step s % 256 of B (192 bytes) and 4 bytes of each of A's 8 rows of 256.
                let bp = unsafe { b.as_ptr().add((s % 256) * 192) };
                let bv: [__m512i; 3] = std::array::from_fn(|v| unsafe {
                    _mm512_loadu_si512(bp.add(64 * v) as *const __m512i)
                });
                for (i, row) in acc.iter_mut().enumerate() {
                    let at = unsafe { a.as_ptr().add(i * 256 + (s % 64) * 4) };
                    let av = _mm512_set1_epi32(unsafe { (at as *const i32).read_unaligned() });
                    for (r, bv) in row.iter_mut().zip(bv) {
                        *r = _mm512_dpbusd_epi32(*r, av, bv);
                    }
                }
            }
            for _ in 0..E {
                // SAFETY: vector e of both buffers.
                unsafe { epilogue_vector(ep_in, ep_out, e, table) };
                e = if e + 1 == vectors { 0 } else { e + 1 };
            }
        }
        let sum = acc
            .iter()
            .flatten()
            .fold(_mm512_setzero_si512(), |s, v| _mm512_add_epi32(s, *v));
        _mm512_reduce_add_epi32(sum)
    }
}

/// The same question for the tile unit: can the epilogue's vector work run while `tdpbusd`
/// occupies the AMX unit? A loop shaped like the AMX microkernel's K step (two A and two B tiles
/// loaded from L1, four `tdpbusd` into a 32 × 32 block) with `E` epilogue vectors in every step.
#[cfg(target_arch = "x86_64")]
mod tiles {
    use codegen::kernels::int8::amx::{kernel_config, HwTiles};
    use codegen::kernels::int8::tile_model::TileUnit;

    /// K steps whose tiles the loop cycles through (32 KB of A and B, in L1).
    pub const STEPS_IN_L1: usize = 8;

    /// `steps` K steps with `E` epilogue vectors each (no tile work when `PRODUCTS` is false).
    ///
    /// # Safety
    /// The CPU has AVX-512F; `t` holds the tile permission; `a` and `b` hold
    /// [`STEPS_IN_L1`] steps of two 1 KB tiles each; the epilogue buffers as in `x86::run`.
    pub unsafe fn run<const E: usize, const PRODUCTS: bool>(
        t: &mut HwTiles,
        steps: usize,
        a: &[u8],
        b: &[u8],
        ep_in: &[f32],
        ep_out: &mut [f32],
        table: &[f32; super::x86::TABLE],
    ) -> i32 {
        assert!(a.len() >= STEPS_IN_L1 * 2048 && b.len() >= STEPS_IN_L1 * 2048);
        t.configure(&kernel_config());
        for c in 0..4 {
            t.zero(c);
        }
        let vectors = ep_in.len() / 16;
        let mut e = 0;
        for s in 0..steps {
            if PRODUCTS {
                let at = (s % STEPS_IN_L1) * 2048;
                // SAFETY: two 16 × 64-byte tiles of A and of B at this step (asserted above).
                unsafe {
                    t.load(4, a.as_ptr().add(at), 64);
                    t.load(6, b.as_ptr().add(at), 64);
                    t.load(7, b.as_ptr().add(at + 1024), 64);
                    t.load(5, a.as_ptr().add(at + 1024), 64);
                }
                t.dpbusd(0, 4, 6);
                t.dpbusd(1, 4, 7);
                t.dpbusd(2, 5, 6);
                t.dpbusd(3, 5, 7);
            }
            for _ in 0..E {
                // SAFETY: the CPU has AVX-512F; vector e of both buffers.
                unsafe { super::x86::epilogue_vector(ep_in, ep_out, e, table) };
                e = if e + 1 == vectors { 0 } else { e + 1 };
            }
        }
        let mut out = [0i32; 256];
        // SAFETY: `out` holds 16 rows of 16 i32 at a 64-byte stride.
        unsafe { t.store(0, out.as_mut_ptr() as *mut u8, 64) };
        t.release();
        out[0]
    }
}

fn main() {
    #[cfg(target_arch = "x86_64")]
    {
        if !(std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vnni"))
        {
            println!("SKIP: this CPU has no AVX512-VNNI, which the loop measures");
            return;
        }
        let a: Vec<u8> = (0..2048).map(|i| (i % 251) as u8).collect();
        let b: Vec<i8> = (0..256 * 192).map(|i| (i % 127) as i8).collect();
        let (ep_in, mut ep_out, table) = epilogue_data();
        let steps = 10_000_000;
        let mut bare = f64::INFINITY;
        for round in 1..=3 {
            let mut time = |f: &dyn Fn(&mut [f32]) -> i32| {
                let t = Instant::now();
                black_box(f(&mut ep_out));
                t.elapsed().as_secs_f64() * 1e9 / steps as f64
            };
            // SAFETY (every call): the features were detected above; the buffers have the
            // sizes `run` asks for.
            let alone =
                time(&|o| unsafe { x86::run::<4, false>(steps, &a, &b, &ep_in, o, &table) }) / 4.0;
            let per_e: [(usize, f64); 4] = [
                (
                    0,
                    time(&|o| unsafe { x86::run::<0, true>(steps, &a, &b, &ep_in, o, &table) }),
                ),
                (
                    1,
                    time(&|o| unsafe { x86::run::<1, true>(steps, &a, &b, &ep_in, o, &table) }),
                ),
                (
                    2,
                    time(&|o| unsafe { x86::run::<2, true>(steps, &a, &b, &ep_in, o, &table) }),
                ),
                (
                    4,
                    time(&|o| unsafe { x86::run::<4, true>(steps, &a, &b, &ep_in, o, &table) }),
                ),
            ];
            bare = bare.min(per_e[0].1);
            println!("round {round}: the epilogue chain alone {alone:.2} ns per vector");
            for (e, ns) in per_e {
                println!(
                    "  E = {e}: {ns:.2} ns per K step, {:.2} G vpdpbusd/s{}",
                    (3 * x86::ROWS) as f64 / ns,
                    added_per_vector(e, ns, bare)
                );
            }
        }
    }
    #[cfg(target_arch = "x86_64")]
    amx_rounds();
    #[cfg(not(target_arch = "x86_64"))]
    println!("SKIP: not an x86-64 CPU");
}

/// The epilogue chain's input (64 vectors, cycled), its output buffer and its table.
#[cfg(target_arch = "x86_64")]
fn epilogue_data() -> (Vec<f32>, Vec<f32>, [f32; x86::TABLE]) {
    let ep_in: Vec<f32> = (0..16 * 64).map(|i| i as f32 * 0.013 - 3.0).collect();
    let ep_out = vec![0f32; ep_in.len()];
    (ep_in, ep_out, std::array::from_fn(|i| 0.01 * i as f32))
}

/// What each of `e` epilogue vectors a K step added to the bare loop's `bare` ns (nothing for
/// `e` = 0, the bare loop itself).
#[cfg(target_arch = "x86_64")]
fn added_per_vector(e: usize, ns: f64, bare: f64) -> String {
    if e == 0 {
        String::new()
    } else {
        format!(
            ", {:.2} ns added per epilogue vector",
            (ns - bare) / e as f64
        )
    }
}

/// The AMX loop with 0, 2, 4, 6, 8 and 16 epilogue vectors a K step, and the chain alone.
#[cfg(target_arch = "x86_64")]
fn amx_rounds() {
    use codegen::kernels::int8::amx::HwTiles;
    let mut t = match HwTiles::new() {
        Ok(t) if std::arch::is_x86_feature_detected!("avx512f") => t,
        Ok(_) => return println!("SKIP (AMX): no AVX-512F for the epilogue chain"),
        Err(e) => return println!("SKIP (AMX): {e}"),
    };
    let a: Vec<u8> = (0..tiles::STEPS_IN_L1 * 2048)
        .map(|i| (i % 251) as u8)
        .collect();
    let b: Vec<u8> = (0..tiles::STEPS_IN_L1 * 2048)
        .map(|i| (i % 127) as u8)
        .collect();
    let (ep_in, mut ep_out, table) = epilogue_data();
    let steps = 2_000_000;
    let mut bare = f64::INFINITY;
    for round in 1..=3 {
        let mut time = |f: &mut dyn FnMut(&mut HwTiles, &mut [f32]) -> i32| {
            let start = Instant::now();
            black_box(f(&mut t, &mut ep_out));
            start.elapsed().as_secs_f64() * 1e9 / steps as f64
        };
        // SAFETY (every call): AMX permission held by `t`, AVX-512F detected; buffers sized
        // as `tiles::run` asks.
        let alone = time(&mut |t, o| unsafe {
            tiles::run::<8, false>(t, steps, &a, &b, &ep_in, o, &table)
        }) / 8.0;
        let per_e: [(usize, f64); 6] = [
            (
                0,
                time(&mut |t, o| unsafe {
                    tiles::run::<0, true>(t, steps, &a, &b, &ep_in, o, &table)
                }),
            ),
            (
                2,
                time(&mut |t, o| unsafe {
                    tiles::run::<2, true>(t, steps, &a, &b, &ep_in, o, &table)
                }),
            ),
            (
                4,
                time(&mut |t, o| unsafe {
                    tiles::run::<4, true>(t, steps, &a, &b, &ep_in, o, &table)
                }),
            ),
            (
                6,
                time(&mut |t, o| unsafe {
                    tiles::run::<6, true>(t, steps, &a, &b, &ep_in, o, &table)
                }),
            ),
            (
                8,
                time(&mut |t, o| unsafe {
                    tiles::run::<8, true>(t, steps, &a, &b, &ep_in, o, &table)
                }),
            ),
            (
                16,
                time(&mut |t, o| unsafe {
                    tiles::run::<16, true>(t, steps, &a, &b, &ep_in, o, &table)
                }),
            ),
        ];
        bare = bare.min(per_e[0].1);
        println!("AMX round {round}: the epilogue chain alone {alone:.2} ns per vector");
        for (e, ns) in per_e {
            println!(
                "  E = {e}: {ns:.2} ns per K step (4 tdpbusd){}",
                added_per_vector(e, ns, bare)
            );
        }
    }
}

//! GEMMs planned for a small L2 (`ENCORE_CACHE`; its own test binary: the override must be set
//! before the first GEMM memoises the cache sizes, and this binary has a single test, so nothing
//! else reads the environment meanwhile).
//!
//! An `Output::Heads` GEMM's units take whole heads (a head's q, k and v: 4 panels of 48
//! columns for BERT's 64-wide heads). When the L2 gave a block fewer panels than that, the
//! accumulator and its row stride were sized for the block while the units wrote whole heads:
//! overlapping tiles and writes past the buffer (`malloc(): corrupted top size` in a BERT-base
//! run with int8 attention under `ENCORE_CACHE=48K,256K`).

mod common;
use codegen::kernels::int8::{gemm_i8, gemm_i8_jit, jit_unit, Activations, PackedI8};
use codegen::kernels::{cache_sizes, pick_int8, Epilogue, EpilogueOp, HeadsOut, Output, RowParam};
use common::Rng;

#[test]
fn heads_output_when_a_block_is_narrower_than_a_head() {
    std::env::set_var("ENCORE_CACHE", "32K,64K");
    assert_eq!(cache_sizes().l2, 64 << 10, "the override took");
    codegen::kernels::pool::set_min_parallel_macs(0);
    // 64 KB of L2 leaves a block one 48-wide panel of K = 768 (and at most 2 of 8-wide ones
    // for K = 2048): less than one head of q, k and v.
    for kern in common::coverage::int8("heads_output_when_a_block_is_narrower_than_a_head") {
        common::check_heads(Some(kern), 37, 384, 64, 768, false);
        common::check_heads(Some(kern), 20, 96, 32, 2048, true);
    }
    common::check_heads(None, 33, 192, 64, 768, false);

    // The compiled nest, made for the same granularity, runs and gives the interpreted bits.
    let (m, k, hidden, dh) = (29, 768, 384, 64);
    let n = 3 * hidden;
    let mut rng = Rng(0x5ca1e);
    let a: Vec<u8> = (0..m * k).map(|_| rng.u8()).collect();
    let w: Vec<i8> = (0..n * k).map(|_| rng.i8()).collect();
    let ws: Vec<f32> = (0..n).map(|_| (rng.f32().abs() + 0.1) * 1e-3).collect();
    let kernel = pick_int8(m, n, k);
    let b = PackedI8::pack_for(kernel, &w, k, n, k, true).unwrap();
    let ep = Epilogue::new(vec![EpilogueOp::Dequant {
        a_scale: RowParam::PerTensor(0.02),
        a_zero: RowParam::PerTensor(3),
        w_scale: &ws,
    }]);
    let run = |unit: Option<&codegen::jit::CompiledUnit>| {
        let heads = hidden / dh;
        let (mut bytes, mut scales, mut v) = (
            vec![0u8; m * 2 * hidden],
            vec![0f32; m * 2 * heads],
            vec![0f32; m * hidden],
        );
        let out = Output::Heads(HeadsOut {
            bytes: &mut bytes,
            ld_bytes: 2 * hidden,
            scales: &mut scales,
            ld_scales: 2 * heads,
            v: &mut v,
            ld_v: hidden,
            hidden,
            head_dim: dh,
        });
        let ran = match unit {
            Some(u) => gemm_i8_jit(m, Activations::U8(&a), k, &b, out, &ep, 2, u).unwrap(),
            None => {
                gemm_i8(m, Activations::U8(&a), k, &b, out, &ep, 2).unwrap();
                false
            }
        };
        let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        (ran, bytes, bits(&scales), bits(&v))
    };
    let interpreted = run(None);
    match jit_unit(&b, false, 3 * dh) {
        Ok(unit) => {
            let compiled = run(Some(&unit));
            assert!(
                compiled.0,
                "{}: the compiled nest was not used",
                kernel.name()
            );
            assert_eq!(compiled.1, interpreted.1, "{}: bytes", kernel.name());
            assert_eq!(compiled.2, interpreted.2, "{}: scales", kernel.name());
            assert_eq!(compiled.3, interpreted.3, "{}: v", kernel.name());
        }
        Err(e) => eprintln!(
            "SKIP the compiled half: no JIT unit for {}: {e}",
            kernel.name()
        ),
    }
}

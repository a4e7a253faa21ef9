//! FP32 GEMM against an f64 reference, every kernel this CPU runs, threads 1 and 2.
//!
//! Tolerance: |c − ref| ≤ 1e-5·Σ|a·b| + 1e-6 (f32 FMA chains over k ≤ 300 lose at most about
//! k·2⁻²⁴ relative to Σ|a·b|; a wrong index or a missed k step is off by O(|a·b|)).

mod common;
use codegen::kernels::{
    gemm_f32, gemm_f32_unpacked, with_cache_sizes, CacheSizes, Epilogue, EpilogueOp, F32Kernel,
    PackedF32,
};
use common::{ref_gemm_f32, Rng};
use proptest::prelude::*;

/// The f32 kernels this CPU runs, listed in the test output (see [`common::coverage`]).
fn kernels(test: &str) -> Vec<F32Kernel> {
    common::coverage::f32(test)
}

#[allow(clippy::too_many_arguments)]
fn check(
    kernel: F32Kernel,
    m: usize,
    n: usize,
    k: usize,
    bt: bool,
    threads: usize,
    seed: u64,
    pad: usize,
) {
    let mut rng = Rng(seed | 1);
    let lda = k + pad;
    let ldb = if bt { k } else { n } + pad;
    let ldc = n + pad;
    let a = rng.vec_f32(m * lda);
    let b = rng.vec_f32(if bt { n * ldb } else { k * ldb });
    let packed = PackedF32::pack_strided(kernel, &b, k, n, ldb, bt);
    let mut c = vec![f32::NAN; m * ldc];
    gemm_f32(m, &a, lda, &packed, &mut c, ldc, &Epilogue::none(), threads);
    let r = ref_gemm_f32(m, n, k, &a, lda, &b, ldb, bt);
    for i in 0..m {
        for j in 0..n {
            let (v, sa) = r[i * n + j];
            let got = c[i * ldc + j] as f64;
            assert!(
                (got - v).abs() <= 1e-5 * sa + 1e-6,
                "{} m={m} n={n} k={k} bt={bt} t={threads}: c[{i},{j}] = {got}, want {v}",
                kernel.name()
            );
        }
        for j in n..ldc {
            assert!(c[i * ldc + j].is_nan(), "wrote past n in row {i}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: common::proptest_cases(24), ..ProptestConfig::default() })]
    #[test]
    fn f32_matches_reference(m in 1usize..=300, n in 1usize..=300, k in 0usize..=300, bt: bool, threads in 1usize..=2, seed: u64, pad in 0usize..3) {
        codegen::kernels::pool::set_min_parallel_macs(0);
        for kern in kernels("f32_matches_reference") {
            check(kern, m, n, k, bt, threads, seed, pad);
        }
    }

    /// Planned for random caches (4 KB-1 MB of L1, 64 KB-8 MB of L2: K blocks of 64-1024,
    /// row and panel blocks of every size), the results stay within the same bound: every
    /// K block boundary and unit shape computes what it should.
    #[test]
    fn f32_matches_reference_planned_for_any_caches(m in 1usize..=160, n in 1usize..=200, k in 0usize..=700, bt: bool, threads in 1usize..=2, seed: u64, l1_log in 12u32..=20, l2_log in 16u32..=23) {
        codegen::kernels::pool::set_min_parallel_macs(0);
        let caches = CacheSizes { l1d: 1 << l1_log, l2: 1 << l2_log };
        for kern in kernels("f32_matches_reference_planned_for_any_caches") {
            with_cache_sizes(caches, || check(kern, m, n, k, bt, threads, seed, 0));
        }
    }
}

#[test]
fn f32_awkward_shapes() {
    codegen::kernels::pool::set_min_parallel_macs(0);
    for kern in kernels("f32_awkward_shapes") {
        for &(m, n, k) in &[
            (1, 1, 0),
            (5, 7, 0),
            (1, 1, 1),
            (13, 33, 17),
            (12, 32, 256),
            (25, 65, 513),
            (7, 1, 1000),
            (1, 100, 3),
            (129, 31, 64),
        ] {
            for threads in 1..=2 {
                check(kern, m, n, k, true, threads, 7, 1);
                check(kern, m, n, k, false, threads, 9, 0);
            }
        }
    }
}

#[test]
fn f32_long_k_crosses_cache_blocks() {
    codegen::kernels::pool::set_min_parallel_macs(0);
    for kern in kernels("f32_long_k_crosses_cache_blocks") {
        check(kern, 40, 70, 2500, true, 2, 3, 0);
    }
}

fn check_epilogue(kernel: F32Kernel, m: usize, n: usize, k: usize, threads: usize, which: usize) {
    let mut rng = Rng(11 + which as u64);
    let a = rng.vec_f32(m * k);
    let b = rng.vec_f32(n * k);
    let bias = rng.vec_f32(n);
    let res = rng.vec_f32(m * n);
    let gamma = rng.vec_f32(n);
    let beta = rng.vec_f32(n);
    let ops = match which {
        0 => vec![EpilogueOp::Bias(&bias)],
        1 => vec![EpilogueOp::Bias(&bias), EpilogueOp::GeluErf],
        2 => vec![
            EpilogueOp::Bias(&bias),
            EpilogueOp::AddResidual { data: &res, ld: n },
        ],
        3 => vec![
            EpilogueOp::Bias(&bias),
            EpilogueOp::AddResidual { data: &res, ld: n },
            EpilogueOp::LayerNorm {
                gamma: &gamma,
                beta: &beta,
                eps: 1e-5,
            },
        ],
        4 => vec![
            EpilogueOp::Scale(0.125),
            EpilogueOp::GeluTanh,
            EpilogueOp::MulCol(&gamma),
            EpilogueOp::Relu,
        ],
        _ => unreachable!(),
    };
    let ep = Epilogue::new(ops.clone());
    let packed = PackedF32::pack_strided(kernel, &b, k, n, k, true);
    let mut c = vec![0f32; m * n];
    codegen::kernels::gemm_f32(m, &a, k, &packed, &mut c, n, &ep, threads);
    let r = ref_gemm_f32(m, n, k, &a, k, &b, k, true);
    for i in 0..m {
        let pre: Vec<f64> = (0..n)
            .map(|j| {
                let split = ops
                    .iter()
                    .position(|o| matches!(o, EpilogueOp::LayerNorm { .. }))
                    .unwrap_or(ops.len());
                codegen::kernels::epilogue::reference_eval(
                    &ops[..split],
                    i,
                    j,
                    r[i * n + j].0,
                    0,
                    None,
                )
            })
            .collect();
        for j in 0..n {
            let want = codegen::kernels::epilogue::reference_eval(
                &ops,
                i,
                j,
                r[i * n + j].0,
                0,
                Some(&pre),
            );
            let got = c[i * n + j] as f64;
            let tol = 1e-4 * (1.0 + want.abs());
            assert!(
                (got - want).abs() <= tol,
                "{} op-set {which} m={m} n={n} k={k} t={threads}: [{i},{j}] got {got} want {want}",
                kernel.name()
            );
        }
    }
}

#[test]
fn f32_epilogues() {
    codegen::kernels::pool::set_min_parallel_macs(0);
    for kern in kernels("f32_epilogues") {
        for which in 0..5 {
            for &(m, n, k) in &[(5, 37, 19), (30, 300, 64), (3, 1500, 40)] {
                for threads in 1..=2 {
                    check_epilogue(kern, m, n, k, threads, which);
                }
            }
        }
    }
}

#[test]
fn f32_unpacked_alpha() {
    codegen::kernels::pool::set_min_parallel_macs(0);
    let mut rng = Rng(5);
    let (m, n, k) = (19, 23, 64);
    let a = rng.vec_f32(m * k);
    let b = rng.vec_f32(n * 70);
    let mut c = vec![0f32; m * n];
    gemm_f32_unpacked(m, n, k, &a, k, &b, 70, true, &mut c, n, 0.125, 2);
    let r = ref_gemm_f32(m, n, k, &a, k, &b, 70, true);
    for (got, (want, sa)) in c.iter().zip(r) {
        assert!((*got as f64 - 0.125 * want).abs() <= 1e-5 * sa + 1e-6);
    }
}

#[test]
#[should_panic(expected = "gemm_f32")]
fn f32_rejects_requant_epilogue() {
    codegen::kernels::pool::set_min_parallel_macs(0);
    let packed = PackedF32::pack(&[1.0; 4], 2, 2, false);
    let mut c = [0f32; 4];
    let ep = Epilogue::new(vec![EpilogueOp::Requant {
        scale: 1.0,
        zero_point: 0,
        ty: codegen::kernels::QType::U8,
    }]);
    gemm_f32(2, &[1.0; 4], 2, &packed, &mut c, 2, &ep, 1);
}

#[test]
fn f32_work_stealing_path() {
    codegen::kernels::pool::set_min_parallel_macs(0);
    let _steal = common::EagerSteal::on();
    assert!(codegen::kernels::pool::eager_steal());
    for kern in kernels("f32_work_stealing_path") {
        for &(m, n, k) in &[(700, 300, 300), (40, 500, 70), (600, 20, 33)] {
            check(kern, m, n, k, true, 2, 5, 1);
        }
    }
}

#[test]
fn kernel_list_is_complete() {
    let names: Vec<&str> = F32Kernel::ALL.iter().map(|k| k.name()).collect();
    assert_eq!(names, common::coverage::F32_NAMES);
    for n in names {
        assert!(common::coverage::cpu_can_run(n).is_some(), "{n}");
    }
}

/// NaN and infinities in the inputs reach the outputs as IEEE arithmetic says: a NaN or an
/// infinity of both signs in a row of A makes that row NaN; one infinity gives ±inf where its
/// products do not cancel; every other row stays finite and exact to the usual bound. A
/// kernel that skips zero blocks, clamps, or reads the packing's padding as data differs here.
#[test]
fn f32_nan_and_inf_propagate() {
    codegen::kernels::pool::set_min_parallel_macs(0);
    let (m, n, k) = (9, 37, 70);
    let mut rng = Rng(17);
    // B strictly positive, so A = +inf in one column gives +inf in every column of the row.
    let b: Vec<f32> = (0..k * n).map(|_| 0.5 + 0.5 * rng.f32().abs()).collect();
    let mut a = rng.vec_f32(m * k);
    a[k + 3] = f32::NAN; // row 1
    a[3 * k + 69] = f32::INFINITY; // row 3
    a[5 * k] = f32::NEG_INFINITY; // row 5
    a[7 * k + 10] = f32::INFINITY; // row 7: +inf and -inf
    a[7 * k + 11] = f32::NEG_INFINITY;
    for kern in kernels("f32_nan_and_inf_propagate") {
        for threads in 1..=2 {
            let packed = PackedF32::pack_strided(kern, &b, k, n, n, false);
            let mut c = vec![0f32; m * n];
            gemm_f32(m, &a, k, &packed, &mut c, n, &Epilogue::none(), threads);
            let r = ref_gemm_f32(m, n, k, &a, k, &b, n, false);
            for i in 0..m {
                for j in 0..n {
                    let got = c[i * n + j];
                    let what = format!("{} t={threads} c[{i},{j}] = {got}", kern.name());
                    match i {
                        1 | 7 => assert!(got.is_nan(), "{what}, want NaN"),
                        3 => assert_eq!(got, f32::INFINITY, "{what}"),
                        5 => assert_eq!(got, f32::NEG_INFINITY, "{what}"),
                        _ => {
                            let (v, sa) = r[i * n + j];
                            assert!(
                                (got as f64 - v).abs() <= 1e-5 * sa + 1e-6,
                                "{what}, want {v}"
                            );
                        }
                    }
                }
            }
        }
    }
}

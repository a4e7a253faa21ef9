//! The int8 GEMM's results do not depend on its blocking: planned for random cache sizes
//! ([`with_cache_sizes`]), every output form (requantized bytes, LayerNorm rows in one pass or
//! in strips, attention heads) gives the bits it gives planned for this machine's caches, on
//! every kernel this CPU runs, the AMX tile model and the JIT-compiled unit nest.
//!
//! The cache sizes set the rows and panels of a unit, the panels of a block and of an epilogue
//! chunk, and whether a LayerNorm GEMM runs in strips; a small L2 once gave a heads GEMM's
//! units more panels than its accumulator held (heap corruption).

mod common;
use codegen::jit::CompiledUnit;
use codegen::kernels::int8::{
    gemm_i8_amx_model, gemm_i8_jit, gemm_i8_with, jit_unit, Activations, PackedI8,
};
use codegen::kernels::{
    with_cache_sizes, CacheSizes, Epilogue, EpilogueOp, HeadsOut, Int8Kernel, Output, QType,
    RowParam,
};
use common::Rng;
use proptest::prelude::*;

/// What the GEMM writes.
#[derive(Debug, Clone, Copy)]
enum Form {
    /// Dequant, bias, GELU, requantized to u8 (FFN1's program).
    Bytes,
    /// Dequant, bias, residual, LayerNorm to f32 (the attention output's and FFN2's).
    Rows,
    /// Dequant and bias into heads of `dh` columns: q and k quantized, v f32 (int8 attention).
    Heads { dh: usize },
}

struct Problem {
    m: usize,
    k: usize,
    n: usize,
    a: Vec<u8>,
    w: Vec<i8>,
    ws: Vec<f32>,
    bias: Vec<f32>,
    residual: Vec<f32>,
    gamma: Vec<f32>,
    beta: Vec<f32>,
}

impl Problem {
    fn new(m: usize, k: usize, n: usize, seed: u64) -> Self {
        let mut rng = Rng(seed | 1);
        Problem {
            m,
            k,
            n,
            a: (0..m * k).map(|_| rng.u8()).collect(),
            w: (0..n * k).map(|_| rng.i8()).collect(),
            ws: (0..n).map(|_| (rng.f32().abs() + 0.1) * 1e-3).collect(),
            bias: rng.vec_f32(n),
            residual: rng.vec_f32(m * n),
            gamma: rng.vec_f32(n),
            beta: rng.vec_f32(n),
        }
    }

    fn epilogue(&self, form: Form) -> Epilogue<'_> {
        let mut ops = vec![
            EpilogueOp::Dequant {
                a_scale: RowParam::PerTensor(0.02),
                a_zero: RowParam::PerTensor(3),
                w_scale: &self.ws,
            },
            EpilogueOp::Bias(&self.bias),
        ];
        match form {
            Form::Bytes => ops.extend([
                EpilogueOp::GeluErf,
                EpilogueOp::Requant {
                    scale: 0.03,
                    zero_point: 7,
                    ty: QType::U8,
                },
            ]),
            Form::Rows => ops.extend([
                EpilogueOp::AddResidual {
                    data: &self.residual,
                    ld: self.n,
                },
                EpilogueOp::LayerNorm {
                    gamma: &self.gamma,
                    beta: &self.beta,
                    eps: 1e-12,
                },
            ]),
            Form::Heads { .. } => {}
        }
        Epilogue::new(ops)
    }

    /// Runs the GEMM on `kernel` (the AMX tile model when `None`), through `unit` when given,
    /// and returns every byte it wrote and whether the compiled nest ran.
    fn run(
        &self,
        kernel: Option<Int8Kernel>,
        b: &PackedI8,
        form: Form,
        threads: usize,
        unit: Option<&CompiledUnit>,
    ) -> (Vec<u32>, bool) {
        let (m, k, n) = (self.m, self.k, self.n);
        let ep = self.epilogue(form);
        let act = Activations::U8(&self.a);
        let gemm = |out: Output<'_>| match (kernel, unit) {
            (Some(_), Some(u)) => gemm_i8_jit(m, act, k, b, out, &ep, threads, u).unwrap(),
            (Some(kk), None) => {
                gemm_i8_with(kk, m, act, k, b, out, &ep, threads).unwrap();
                false
            }
            (None, _) => {
                gemm_i8_amx_model(m, act, k, b, out, &ep, threads).unwrap();
                false
            }
        };
        let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<u32>>();
        match form {
            Form::Bytes => {
                let mut c = vec![0u8; m * n];
                let ran = gemm(Output::U8 { c: &mut c, ldc: n });
                (c.into_iter().map(u32::from).collect(), ran)
            }
            Form::Rows => {
                let mut c = vec![0f32; m * n];
                let ran = gemm(Output::F32 { c: &mut c, ldc: n });
                (bits(&c), ran)
            }
            Form::Heads { dh } => {
                let hidden = n / 3;
                let heads = hidden / dh;
                let mut bytes = vec![0u8; m * 2 * hidden];
                let mut scales = vec![0f32; m * 2 * heads];
                let mut v = vec![0f32; m * hidden];
                let ran = gemm(Output::Heads(HeadsOut {
                    bytes: &mut bytes,
                    ld_bytes: 2 * hidden,
                    scales: &mut scales,
                    ld_scales: 2 * heads,
                    v: &mut v,
                    ld_v: hidden,
                    hidden,
                    head_dim: dh,
                }));
                let mut all: Vec<u32> = bytes.into_iter().map(u32::from).collect();
                all.extend(bits(&scales));
                all.extend(bits(&v));
                (all, ran)
            }
        }
    }
}

fn check(p: &Problem, form: Form, caches: CacheSizes, threads: usize) {
    let granularity = match form {
        Form::Heads { dh } => 3 * dh,
        _ => 1,
    };
    let row_epilogue = matches!(form, Form::Rows);
    let mut runs: Vec<Option<Int8Kernel>> =
        common::coverage::int8("int8_results_do_not_depend_on_the_blocking")
            .into_iter()
            .map(Some)
            .collect();
    runs.push(None);
    for kernel in runs {
        let packed_for = kernel.unwrap_or(Int8Kernel::Amx);
        let b = PackedI8::pack_for(packed_for, &p.w, p.k, p.n, p.k, true).unwrap();
        let name = kernel.map_or("amx(tile model)", |k| k.name());
        let at = format!(
            "{name} m={} k={} n={} {form:?} t={threads} {caches:?}",
            p.m, p.k, p.n
        );
        let (want, _) = p.run(kernel, &b, form, threads, None);
        let (got, _) = with_cache_sizes(caches, || p.run(kernel, &b, form, threads, None));
        assert!(got == want, "{at}: interpreted results differ");
        if kernel.is_none() {
            continue;
        }
        // A unit compiled under the same sizes matches the plan and runs.
        let compiled = with_cache_sizes(caches, || {
            jit_unit(&b, row_epilogue, granularity)
                .ok()
                .map(|u| p.run(kernel, &b, form, threads, Some(&u)))
        });
        if let Some((got, ran)) = compiled {
            assert!(ran, "{at}: the compiled nest was not used");
            assert!(got == want, "{at}: compiled results differ");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: common::proptest_cases(96), ..ProptestConfig::default() })]
    #[test]
    fn int8_results_do_not_depend_on_the_blocking(
        m in 1usize..=160,
        k in 1usize..=900,
        cols in 1usize..=200,
        form in 0usize..4,
        dh in prop::sample::select(vec![8usize, 16, 32, 64]),
        l1_log in 12u32..=20,
        l2_log in 16u32..=23,
        odd_kb in 0usize..64,
        threads in 1usize..=2,
        seed: u64,
    ) {
        codegen::kernels::pool::set_min_parallel_macs(0);
        let (form, n) = match form {
            0 => (Form::Bytes, cols),
            1 => (Form::Rows, cols),
            // Heads half the time: their whole-head blocks are the subtle case.
            _ => (Form::Heads { dh }, 3 * dh * cols.div_ceil(3 * dh).min(4)),
        };
        // Log-uniform sizes, 4 KB-1 MB and 64 KB-8 MB, some off a power of two.
        let caches = CacheSizes { l1d: (1 << l1_log) + (odd_kb << 10), l2: (1 << l2_log) + (odd_kb << 12) };
        check(&Problem::new(m, k, n, seed), form, caches, threads);
    }
}

/// The sizes that broke a heads GEMM (a block narrower than a head's q, k and v), BERT-base's
/// K, on a 64 KB L2.
#[test]
fn a_block_narrower_than_a_head() {
    codegen::kernels::pool::set_min_parallel_macs(0);
    let caches = CacheSizes {
        l1d: 32 << 10,
        l2: 64 << 10,
    };
    for threads in [1, 2] {
        check(
            &Problem::new(37, 768, 384, 11),
            Form::Heads { dh: 64 },
            caches,
            threads,
        );
    }
}

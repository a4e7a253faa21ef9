//! The epilogue program: accuracy of its math, the vectorised path against the scalar one, and
//! every micro-op through every int8 kernel this CPU runs (and AMX on the tile model).
//!
//! Tolerances (stated per output type):
//! * f32 outputs: |got − want| ≤ 2e-5·(1 + |want|) against an f64 evaluation from the exact i32
//!   product (f32 rounding of the dequantised value, bias and activation); with LayerNorm 2e-4.
//! * bf16 outputs: relative 2⁻⁸ (one bf16 ulp) + 1e-6.
//! * u8/s8 requantised outputs: |got − want| ≤ 1 everywhere (a value within f32 rounding of a
//!   .5 tie may round the other way) and ≥ 99 % exactly equal.

mod common;
use codegen::kernels::epilogue::reference_eval;
use codegen::kernels::int8::{gemm_i8_amx_model, gemm_i8_with, Activations, PackedI8};
use codegen::kernels::math::{bf16_to_f32, exp, gelu_erf, gelu_tanh, quantize_div, quantize_sym};
use codegen::kernels::{
    gemm_f32, Epilogue, EpilogueOp, ForkOut, HeadsOut, Int8Kernel, KernelError, Output, PackedF32,
    QType, RowParam, RowParamsOut,
};
use common::Rng;

fn gelu_ref(x: f64) -> f64 {
    0.5 * x * codegen::kernels::epilogue::erfc_f64(-x / std::f64::consts::SQRT_2)
}

fn grid() -> impl Iterator<Item = f32> {
    (0..=460_000).map(|i| -13.0 + i as f32 * 5e-5)
}

/// The slice form (AVX-512 permutes where the CPU has them) gives the scalar function's bits
/// everywhere: the grid, the piece boundaries, the ends, NaN, infinities and signed zeros, at
/// lengths that leave a remainder.
#[test]
fn gelu_erf_slice_equals_the_scalar_function() {
    // Pieces are centred on the integers of |x|·31.25/5.75: they meet at the half-integers.
    let pieces = (0..=32).flat_map(|i| {
        let a = (i as f32 + 0.5) * 5.75 / 31.25;
        [
            a,
            -a,
            f32::from_bits(a.to_bits() + 1),
            -f32::from_bits(a.to_bits() + 1),
        ]
    });
    // The special values first, where every length below has them in its vector part.
    let mut xs: Vec<f32> = pieces
        .chain([
            0.0,
            -0.0,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            -5.75,
            -5.750001,
            5.75,
            1e30,
        ])
        .chain(grid())
        .collect();
    xs.push(0.5);
    // Lengths with four different tails of single values after the 16-wide vector loop.
    for cut in [0, 1, 7, 15] {
        let xs = &xs[..xs.len() - cut];
        let mut v = xs.to_vec();
        codegen::kernels::math::gelu_erf_slice(&mut v);
        for (x, y) in xs.iter().zip(&v) {
            let want = gelu_erf(*x);
            assert!(
                y.to_bits() == want.to_bits() || (y.is_nan() && want.is_nan()),
                "x={x}: slice {y} vs scalar {want}"
            );
        }
    }
}

#[test]
fn gelu_erf_within_1e6_relative_above_the_flush() {
    codegen::kernels::pool::set_min_parallel_macs(0);
    let mut worst = (0f64, 0f32);
    for x in grid().chain([0.0, -0.0, 1e-30, -1e-30, 1e-8, 3.0e-3, 100.0, 1e4]) {
        let want = gelu_ref(x as f64);
        let got = gelu_erf(x) as f64;
        if x < codegen::kernels::math::GELU_ERF_FLUSH {
            // Flushed: -0, off by less than 2.6e-8.
            assert!(
                got == 0.0 && (got - want).abs() < 2.6e-8,
                "x={x}: {got} vs {want}"
            );
            continue;
        }
        let rel = ((got - want) / want).abs();
        if rel > worst.0 {
            worst = (rel, x);
        }
    }
    eprintln!(
        "gelu_erf worst relative error {:.3e} at x = {}",
        worst.0, worst.1
    );
    assert!(
        worst.0 <= 1e-6,
        "gelu_erf relative error {} at {}",
        worst.0,
        worst.1
    );
    assert_eq!(gelu_erf(-20.0), -0.0);
    assert_eq!(gelu_erf(f32::INFINITY), f32::INFINITY);
    assert_eq!(gelu_erf(f32::NEG_INFINITY), 0.0);
}

#[test]
fn gelu_tanh_tolerance() {
    codegen::kernels::pool::set_min_parallel_macs(0);
    let mut worst_hi = 0f64;
    let mut worst_lo = 0f64;
    for x in grid() {
        let xd = x as f64;
        let u = (2.0 / std::f64::consts::PI).sqrt() * (xd + 0.044715 * xd * xd * xd);
        // x/2·(1 + tanh u) = x / (1 + e^(−2u)), the form without cancellation for x ≪ 0.
        let want = xd / (1.0 + (-2.0 * u).exp());
        let got = gelu_tanh(x) as f64;
        if want.abs() < 1e-30 {
            assert!((got - want).abs() <= 1e-30);
            continue;
        }
        let rel = ((got - want) / want).abs();
        if x >= -5.0 {
            worst_hi = worst_hi.max(rel);
        } else {
            worst_lo = worst_lo.max(rel);
        }
    }
    eprintln!("gelu_tanh worst relative error {worst_hi:.3e} (x ≥ -5), {worst_lo:.3e} (x < -5)");
    assert!(worst_hi <= 4e-6 && worst_lo <= 2e-5);
}

#[test]
fn exp_within_2ulp() {
    codegen::kernels::pool::set_min_parallel_macs(0);
    for i in 0..=200_000 {
        let x = -87.0 + i as f32 * (175.0 / 200_000.0);
        let want = (x as f64).exp();
        let got = exp(x) as f64;
        let ulp = f32::EPSILON as f64 * want;
        assert!(
            (got - want).abs() <= 2.0 * ulp,
            "exp({x}) = {got}, want {want}"
        );
    }
}

/// The epilogue's row loop (vectorised with AVX-512 / AVX2 where present) must give bit-identical
/// results to the scalar functions: same IEEE operations in the same order.
#[test]
fn vector_epilogue_bit_identical_to_scalar() {
    codegen::kernels::pool::set_min_parallel_macs(0);
    let xs: Vec<f32> = grid().step_by(7).collect();
    let n = xs.len();
    let b = PackedF32::pack(&xs, 1, n, false);
    for (op, f) in [
        (EpilogueOp::GeluErf, gelu_erf as fn(f32) -> f32),
        (EpilogueOp::GeluTanh, gelu_tanh),
    ] {
        let mut c = vec![0f32; n];
        gemm_f32(1, &[1.0], 1, &b, &mut c, n, &Epilogue::new(vec![op]), 1);
        for (x, got) in xs.iter().zip(&c) {
            assert_eq!(got.to_bits(), f(*x).to_bits(), "{op:?} at x = {x}");
        }
    }
}

#[test]
fn validation_errors() {
    codegen::kernels::pool::set_min_parallel_macs(0);
    let p = PackedI8::pack_for(Int8Kernel::Scalar, &[1; 8], 4, 2, 2, false).unwrap();
    let a = [1u8; 4];
    let short = [1.0f32; 1];
    let mut c = [0f32; 2];
    let mut q = [0u8; 2];
    let run = |ep: &Epilogue<'_>, out: Output<'_>| {
        gemm_i8_with(
            Int8Kernel::Scalar,
            1,
            Activations::U8(&a),
            4,
            &p,
            out,
            ep,
            1,
        )
    };
    // Each refusal is the typed error for its cause, with a message that names it.
    let bad = |r: Result<(), KernelError>, needle: &str, what: &str| match r {
        Err(KernelError::BadEpilogue(m)) if m.contains(needle) => {}
        other => panic!("{what}: want BadEpilogue(\"…{needle}…\"), got {other:?}"),
    };
    bad(
        run(&Epilogue::bias(&short), Output::F32 { c: &mut c, ldc: 2 }),
        "per-column vector has 1 values, need 2",
        "bias shorter than n",
    );
    bad(
        run(&Epilogue::none(), Output::U8 { c: &mut q, ldc: 2 }),
        "u8/s8 output needs a final Requant",
        "u8 output without Requant",
    );
    let mut fork_bytes = [0u8; 2];
    let mut one_byte = [0u8; 1];
    let fork = |out: ForkOut| EpilogueOp::ForkU8 {
        smooth: None,
        scale: 1.0,
        zero_point: 0,
        out,
    };
    let to_two = fork(ForkOut::new(&mut fork_bytes, 2));
    bad(
        run(
            &Epilogue::new(vec![to_two, EpilogueOp::Relu]),
            Output::F32 { c: &mut c, ldc: 2 },
        ),
        "ForkU8 must be last",
        "ForkU8 before another op",
    );
    bad(
        run(
            &Epilogue::new(vec![to_two]),
            Output::U8 { c: &mut q, ldc: 2 },
        ),
        "ForkU8 must be last and needs an f32 output",
        "ForkU8 into a u8 output",
    );
    bad(
        run(
            &Epilogue::new(vec![fork(ForkOut::new(&mut one_byte, 2))]),
            Output::F32 { c: &mut c, ldc: 2 },
        ),
        "ForkU8 buffer 1 too small",
        "ForkU8 buffer shorter than the output",
    );
    let rq = EpilogueOp::Requant {
        scale: 1.0,
        zero_point: 0,
        ty: QType::S8,
    };
    bad(
        run(&Epilogue::new(vec![rq]), Output::U8 { c: &mut q, ldc: 2 }),
        "Requant must be last and match",
        "s8 requant into u8",
    );
    bad(
        run(
            &Epilogue::new(vec![rq, EpilogueOp::Relu]),
            Output::F32 { c: &mut c, ldc: 2 },
        ),
        "Requant must be last",
        "requant not last",
    );
    // A zero point outside its type's range is no quantization parameter.
    let rq_u8 = |zero_point| EpilogueOp::Requant {
        scale: 1.0,
        zero_point,
        ty: QType::U8,
    };
    bad(
        run(
            &Epilogue::new(vec![rq_u8(256)]),
            Output::U8 { c: &mut q, ldc: 2 },
        ),
        "Requant zero point 256 outside the U8 range",
        "u8 requant with zero point 256",
    );
    bad(
        run(
            &Epilogue::new(vec![rq_u8(-1)]),
            Output::U8 { c: &mut q, ldc: 2 },
        ),
        "Requant zero point -1 outside the U8 range",
        "u8 requant with zero point -1",
    );
    bad(
        run(
            &Epilogue::new(vec![EpilogueOp::ForkU8 {
                smooth: None,
                scale: 1.0,
                zero_point: 300,
                out: ForkOut::new(&mut fork_bytes, 2),
            }]),
            Output::F32 { c: &mut c, ldc: 2 },
        ),
        "ForkU8 zero point 300 outside the u8 range",
        "fork with zero point 300",
    );
    let dq = EpilogueOp::Dequant {
        a_scale: RowParam::PerTensor(1.0),
        a_zero: RowParam::PerTensor(0),
        w_scale: &[1.0],
    };
    bad(
        run(
            &Epilogue::new(vec![EpilogueOp::Relu, dq]),
            Output::F32 { c: &mut c, ldc: 2 },
        ),
        "Dequant must be the first op",
        "dequant not first",
    );
    match run(&Epilogue::new(vec![dq]), Output::F32 { c: &mut c, ldc: 1 }) {
        Err(KernelError::BadArgs(m)) if m.contains("too small for 1x2 with ldc 1") => {}
        other => panic!("ldc < n: want BadArgs, got {other:?}"),
    }
    // The same program on a good output runs.
    assert_eq!(
        run(&Epilogue::new(vec![dq]), Output::F32 { c: &mut c, ldc: 2 }),
        Ok(())
    );
    assert_eq!(c, [4.0, 4.0], "Σ 1·1 over k = 4, dequantised with scale 1");
}

struct Data {
    m: usize,
    n: usize,
    k: usize,
    a: Vec<u8>,
    b: Vec<i8>,
    acc: Vec<i64>,
    colsum: Vec<i32>,
    a_scale: Vec<f32>,
    a_zero: Vec<i32>,
    w_scale: Vec<f32>,
    bias: Vec<f32>,
    res: Vec<f32>,
    gamma: Vec<f32>,
    beta: Vec<f32>,
}

impl Data {
    fn new(m: usize, n: usize, k: usize, signed: bool, seed: u64) -> Self {
        let mut r = Rng(seed);
        let a: Vec<u8> = (0..m * k).map(|_| r.u8()).collect();
        let b: Vec<i8> = (0..n * k).map(|_| r.i8()).collect();
        let val = |v: u8| if signed { v as i8 as i64 } else { v as i64 };
        let mut acc = vec![0i64; m * n];
        let mut colsum = vec![0i32; n];
        for j in 0..n {
            colsum[j] = (0..k).map(|kk| b[j * k + kk] as i32).sum();
            for i in 0..m {
                acc[i * n + j] = (0..k)
                    .map(|kk| val(a[i * k + kk]) * b[j * k + kk] as i64)
                    .sum();
            }
        }
        let zp_range = if signed { (-5, 5) } else { (120, 136) };
        Data {
            m,
            n,
            k,
            a,
            b,
            acc,
            colsum,
            a_scale: (0..m).map(|_| 0.01 + 0.01 * r.f32().abs()).collect(),
            a_zero: (0..m)
                .map(|_| zp_range.0 + (r.u8() as i32 % (zp_range.1 - zp_range.0)))
                .collect(),
            w_scale: (0..n).map(|_| 0.001 + 0.002 * r.f32().abs()).collect(),
            bias: r.vec_f32(n),
            res: r.vec_f32(m * n),
            gamma: r.vec_f32(n),
            beta: r.vec_f32(n),
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum OutKind {
    F32,
    Bf16,
    U8,
    S8,
}

fn programs(d: &Data) -> Vec<(Vec<EpilogueOp<'_>>, OutKind, &'static str)> {
    let dq_t = EpilogueOp::Dequant {
        a_scale: RowParam::PerTensor(0.02),
        a_zero: RowParam::PerTensor(d.a_zero[0]),
        w_scale: &d.w_scale[..1],
    };
    let dq_r = EpilogueOp::Dequant {
        a_scale: RowParam::PerRow(&d.a_scale),
        a_zero: RowParam::PerRow(&d.a_zero),
        w_scale: &d.w_scale,
    };
    let ln = EpilogueOp::LayerNorm {
        gamma: &d.gamma,
        beta: &d.beta,
        eps: 1e-5,
    };
    let res = EpilogueOp::AddResidual {
        data: &d.res,
        ld: d.n,
    };
    vec![
        (vec![], OutKind::F32, "plain"),
        (vec![dq_t], OutKind::F32, "dequant per-tensor"),
        (
            vec![dq_t, EpilogueOp::Bias(&d.bias)],
            OutKind::F32,
            "dequant per-tensor + bias, stored directly",
        ),
        (
            vec![dq_r, EpilogueOp::Bias(&d.bias)],
            OutKind::F32,
            "dequant per-row + bias, stored directly",
        ),
        (
            vec![dq_r, EpilogueOp::Bias(&d.bias), EpilogueOp::Relu],
            OutKind::F32,
            "dequant + bias, then more ops",
        ),
        (
            vec![dq_r, EpilogueOp::Bias(&d.bias), EpilogueOp::GeluErf],
            OutKind::F32,
            "dequant per-row + bias + gelu",
        ),
        (
            vec![dq_r, EpilogueOp::Bias(&d.bias), EpilogueOp::GeluTanh],
            OutKind::Bf16,
            "gelu tanh -> bf16",
        ),
        (
            vec![dq_r, EpilogueOp::Bias(&d.bias), res, ln],
            OutKind::F32,
            "bias + residual + layernorm",
        ),
        (
            vec![
                dq_r,
                ln,
                EpilogueOp::Requant {
                    scale: 0.05,
                    zero_point: 3,
                    ty: QType::S8,
                },
            ],
            OutKind::S8,
            "layernorm -> requant s8",
        ),
        (
            vec![
                dq_t,
                EpilogueOp::MulCol(&d.gamma),
                EpilogueOp::Relu,
                EpilogueOp::Scale(3.0),
                EpilogueOp::Requant {
                    scale: 0.025,
                    zero_point: 7,
                    ty: QType::U8,
                },
            ],
            OutKind::U8,
            "mulcol + relu + scale -> requant u8",
        ),
        (
            vec![
                dq_r,
                EpilogueOp::Bias(&d.bias),
                EpilogueOp::Requant {
                    scale: 0.1,
                    zero_point: -2,
                    ty: QType::S8,
                },
            ],
            OutKind::S8,
            "bias -> requant s8",
        ),
    ]
}

fn run_program(
    kernel: Option<Int8Kernel>,
    d: &Data,
    signed: bool,
    ops: &[EpilogueOp<'_>],
    kind: OutKind,
    threads: usize,
) -> Vec<f64> {
    let pk = kernel.unwrap_or(Int8Kernel::Amx);
    let p = PackedI8::pack_for(pk, &d.b, d.k, d.n, d.k, true).unwrap();
    let a_s8: Vec<i8> = d.a.iter().map(|&v| v as i8).collect();
    let act = if signed {
        Activations::S8(&a_s8)
    } else {
        Activations::U8(&d.a)
    };
    let ep = Epilogue::new(ops.to_vec());
    let len = d.m * d.n;
    let go = |out: Output<'_>| match kernel {
        Some(k) => gemm_i8_with(k, d.m, act, d.k, &p, out, &ep, threads).unwrap(),
        None => {
            gemm_i8_amx_model(d.m, act, d.k, &p, out, &ep, threads).unwrap();
        }
    };
    match kind {
        OutKind::F32 => {
            let mut c = vec![0f32; len];
            go(Output::F32 {
                c: &mut c,
                ldc: d.n,
            });
            c.iter().map(|&v| v as f64).collect()
        }
        OutKind::Bf16 => {
            let mut c = vec![0u16; len];
            go(Output::Bf16 {
                c: &mut c,
                ldc: d.n,
            });
            c.iter().map(|&v| bf16_to_f32(v) as f64).collect()
        }
        OutKind::U8 => {
            let mut c = vec![0u8; len];
            go(Output::U8 {
                c: &mut c,
                ldc: d.n,
            });
            c.iter().map(|&v| v as f64).collect()
        }
        OutKind::S8 => {
            let mut c = vec![0i8; len];
            go(Output::S8 {
                c: &mut c,
                ldc: d.n,
            });
            c.iter().map(|&v| v as f64).collect()
        }
    }
}

fn reference(d: &Data, ops: &[EpilogueOp<'_>]) -> Vec<f64> {
    let split = ops
        .iter()
        .position(|o| matches!(o, EpilogueOp::LayerNorm { .. }))
        .unwrap_or(ops.len());
    let mut out = vec![0f64; d.m * d.n];
    for i in 0..d.m {
        let pre: Vec<f64> = (0..d.n)
            .map(|j| {
                reference_eval(
                    &ops[..split],
                    i,
                    j,
                    d.acc[i * d.n + j] as f64,
                    d.colsum[j],
                    None,
                )
            })
            .collect();
        for j in 0..d.n {
            out[i * d.n + j] = if split < ops.len() {
                reference_eval(&ops[split..], i, j, pre[j], d.colsum[j], Some(&pre))
            } else {
                pre[j]
            };
        }
    }
    out
}

fn check_all(kernel: Option<Int8Kernel>, m: usize, n: usize, k: usize, threads: usize) {
    let name = kernel.map_or("amx(tile model)", |k| k.name());
    for signed in [false, true] {
        let d = Data::new(m, n, k, signed, 17 + m as u64 * 31 + n as u64);
        for (ops, kind, label) in programs(&d) {
            let got = run_program(kernel, &d, signed, &ops, kind, threads);
            let want = reference(&d, &ops);
            let has_ln = ops
                .iter()
                .any(|o| matches!(o, EpilogueOp::LayerNorm { .. }));
            let mut inexact = 0;
            for (idx, (g, w)) in got.iter().zip(&want).enumerate() {
                let ok = match kind {
                    OutKind::F32 => {
                        (g - w).abs() <= if has_ln { 2e-4 } else { 2e-5 } * (1.0 + w.abs())
                    }
                    OutKind::Bf16 => (g - w).abs() <= w.abs() / 256.0 + 1e-6,
                    OutKind::U8 | OutKind::S8 => {
                        if g != w {
                            inexact += 1;
                        }
                        (g - w).abs() <= 1.0
                    }
                };
                assert!(ok, "{name} [{label}] m={m} n={n} k={k} s8={signed} t={threads}: [{},{}] got {g} want {w}", idx / n, idx % n);
            }
            assert!(
                inexact * 100 <= got.len(),
                "{name} [{label}]: {inexact} of {} requantised values off by one",
                got.len()
            );
        }
    }
}

/// Random operands of an `m × n × k` int8 GEMM with a LayerNorm epilogue: u8 activations, s8
/// weights with per-column scales, a bias, LayerNorm gamma and beta, positive per-column factors.
struct NormCase {
    a: Vec<u8>,
    w: Vec<i8>,
    ws: Vec<f32>,
    bias: Vec<f32>,
    gamma: Vec<f32>,
    beta: Vec<f32>,
    smooth: Vec<f32>,
}

impl NormCase {
    fn new(rng: &mut Rng, m: usize, n: usize, k: usize) -> Self {
        NormCase {
            a: (0..m * k).map(|_| rng.u8()).collect(),
            w: (0..n * k).map(|_| rng.i8()).collect(),
            ws: (0..n).map(|_| (rng.f32().abs() + 0.1) * 1e-3).collect(),
            bias: rng.vec_f32(n),
            gamma: (0..n).map(|_| rng.f32() + 1.5).collect(),
            beta: rng.vec_f32(n),
            smooth: (0..n).map(|_| rng.f32().abs() + 0.5).collect(),
        }
    }
}

/// `ForkU8` after a LayerNorm: the f32 output is bit for bit the one without the fork, and the
/// u8 copy is `quantize_div` of it times the factors, on every kernel (AMX on the tile model),
/// 1 and 2 threads, a row that one block holds and rows that take several blocks through a
/// strip (n = 1200 at k = 2100: 2.5 MB of weights, more than the three quarters of L2 a
/// whole-row block may take on the CPUs these machines have shown, 1-2 MB).
#[test]
fn fork_u8_copies_the_quantized_output() {
    codegen::kernels::pool::set_min_parallel_macs(0);
    let mut runs: Vec<(Option<Int8Kernel>, usize, usize, usize)> = Vec::new();
    for kern in common::coverage::int8("fork_u8_copies_the_quantized_output") {
        runs.extend([(Some(kern), 37, 70, 64), (Some(kern), 9, 1200, 2100)]);
    }
    runs.push((None, 37, 70, 100));
    for (kern, m, n, k) in runs {
        let mut rng = Rng(0xf0_0000 + (m * n + k) as u64);
        let NormCase {
            a,
            w,
            ws,
            bias,
            gamma,
            beta,
            smooth,
        } = NormCase::new(&mut rng, m, n, k);
        let pk = kern.unwrap_or(Int8Kernel::Amx);
        let b = PackedI8::pack_for(pk, &w, k, n, k, true).unwrap();
        let base = vec![
            EpilogueOp::Dequant {
                a_scale: RowParam::PerTensor(0.02),
                a_zero: RowParam::PerTensor(3),
                w_scale: &ws,
            },
            EpilogueOp::Bias(&bias),
            EpilogueOp::LayerNorm {
                gamma: &gamma,
                beta: &beta,
                eps: 1e-5,
            },
        ];
        let (scale, zero_point) = (0.015f32, 117);
        for threads in [1, 2] {
            let gemm = |ops: Vec<EpilogueOp<'_>>, c: &mut [f32]| {
                let (ep, out) = (Epilogue::new(ops), Output::F32 { c, ldc: n });
                match kern {
                    Some(kk) => {
                        gemm_i8_with(kk, m, Activations::U8(&a), k, &b, out, &ep, threads).unwrap()
                    }
                    None => gemm_i8_amx_model(m, Activations::U8(&a), k, &b, out, &ep, threads)
                        .map(|_| ())
                        .unwrap(),
                }
            };
            let mut plain = vec![0f32; m * n];
            gemm(base.clone(), &mut plain);
            for factors in [Some(&smooth[..]), None] {
                let mut copy = vec![0u8; m * n];
                let mut forked = vec![0f32; m * n];
                let mut ops = base.clone();
                ops.push(EpilogueOp::ForkU8 {
                    smooth: factors,
                    scale,
                    zero_point,
                    out: ForkOut::new(&mut copy, n),
                });
                gemm(ops, &mut forked);
                let name = kern.map_or("amx(tile model)", |k| k.name());
                for i in 0..m * n {
                    assert_eq!(forked[i].to_bits(), plain[i].to_bits(), "{name} f32 [{i}]");
                    let v = factors.map_or(plain[i], |s| plain[i] * s[i % n]);
                    let want = quantize_div(v, scale, zero_point as f32, 0.0, 255.0);
                    assert_eq!(copy[i] as f32, want, "{name} t={threads} copy [{i}]");
                }
            }
        }
    }
}

/// `ForkU8Rows` after a LayerNorm, and alone after the elementwise ops (a row-wide step of its
/// own): the f32 output is bit for bit the one without it, and each row's copy, scale and zero
/// point are `rowquant::quantize_row` of that f32 row (times the factors), the standalone
/// quantizer's bytes; on every kernel (AMX on the tile model), 1 and 2 threads, a row one block
/// holds and rows that take a strip (n = 1200 at k = 2100), through the register chains and the
/// multi-pass path.
#[test]
fn fork_u8_rows_quantizes_each_row_by_its_own_range() {
    use codegen::kernels::epilogue_chain::set_register_chains;
    use codegen::kernels::rowquant::quantize_row;
    codegen::kernels::pool::set_min_parallel_macs(0);
    let mut runs: Vec<(Option<Int8Kernel>, usize, usize, usize)> = Vec::new();
    for kern in common::coverage::int8("fork_u8_rows_quantizes_each_row_by_its_own_range") {
        runs.extend([(Some(kern), 37, 70, 64), (Some(kern), 9, 1200, 2100)]);
    }
    runs.push((None, 37, 70, 100));
    for (kern, m, n, k) in runs {
        let mut rng = Rng(0xf1_0000 + (m * n + k) as u64);
        let NormCase {
            a,
            w,
            ws,
            bias,
            gamma,
            beta,
            smooth,
        } = NormCase::new(&mut rng, m, n, k);
        let pk = kern.unwrap_or(Int8Kernel::Amx);
        let b = PackedI8::pack_for(pk, &w, k, n, k, true).unwrap();
        let dequant = EpilogueOp::Dequant {
            a_scale: RowParam::PerTensor(0.02),
            a_zero: RowParam::PerTensor(3),
            w_scale: &ws,
        };
        let norm = vec![
            dequant,
            EpilogueOp::Bias(&bias),
            EpilogueOp::LayerNorm {
                gamma: &gamma,
                beta: &beta,
                eps: 1e-5,
            },
        ];
        let plain_ops = vec![dequant, EpilogueOp::Bias(&bias), EpilogueOp::GeluErf];
        let name = kern.map_or("amx(tile model)", |k| k.name());
        for (base, label) in [(norm, "layer_norm"), (plain_ops, "gelu")] {
            for (threads, chains) in [(1, true), (2, true), (2, false)] {
                let gemm = |ops: Vec<EpilogueOp<'_>>, c: &mut [f32]| {
                    set_register_chains(chains);
                    let (ep, out) = (Epilogue::new(ops), Output::F32 { c, ldc: n });
                    let done = match kern {
                        Some(kk) => {
                            gemm_i8_with(kk, m, Activations::U8(&a), k, &b, out, &ep, threads)
                        }
                        None => gemm_i8_amx_model(m, Activations::U8(&a), k, &b, out, &ep, threads)
                            .map(|_| ()),
                    };
                    set_register_chains(true);
                    done.unwrap()
                };
                let mut plain = vec![0f32; m * n];
                gemm(base.clone(), &mut plain);
                for factors in [Some(&smooth[..]), None] {
                    let mut copy = vec![0u8; m * n];
                    let (mut scales, mut zeros) = (vec![f32::NAN; m], vec![-1i32; m]);
                    let mut forked = vec![0f32; m * n];
                    let mut ops = base.clone();
                    ops.push(EpilogueOp::ForkU8Rows {
                        smooth: factors,
                        out: ForkOut::new(&mut copy, n),
                        params: RowParamsOut::new(&mut scales, &mut zeros),
                    });
                    gemm(ops, &mut forked);
                    let at = format!("{name} [{label}] t={threads} chains={chains}");
                    for i in 0..m * n {
                        assert_eq!(forked[i].to_bits(), plain[i].to_bits(), "{at} f32 [{i}]");
                    }
                    for r in 0..m {
                        let mut want = vec![0u8; n];
                        let params = quantize_row(&plain[r * n..(r + 1) * n], factors, &mut want);
                        assert_eq!((scales[r], zeros[r]), params, "{at} row {r} parameters");
                        assert_eq!(&copy[r * n..(r + 1) * n], &want[..], "{at} row {r} bytes");
                    }
                }
            }
        }
    }
}

/// `ForkU8Rows` is refused unless it is last with an f32 output, and with fewer row parameters
/// than rows.
#[test]
fn fork_u8_rows_is_validated() {
    let (m, n) = (4, 3);
    let ws = [1.0f32];
    let (mut copy, mut scales, mut zeros) = (vec![0u8; m * n], vec![0f32; m - 1], vec![0i32; m]);
    let mut c = vec![0f32; m * n];
    let fork = EpilogueOp::ForkU8Rows {
        smooth: None,
        out: ForkOut::new(&mut copy, n),
        params: RowParamsOut::new(&mut scales, &mut zeros),
    };
    let dequant = EpilogueOp::Dequant {
        a_scale: RowParam::PerTensor(1.0),
        a_zero: RowParam::PerTensor(0),
        w_scale: &ws,
    };
    let out = Output::F32 { c: &mut c, ldc: n };
    let short = Epilogue::new(vec![dequant, fork]).validate(m, n, &out, true);
    assert!(
        matches!(&short, Err(KernelError::BadEpilogue(s)) if s.contains("3 row parameters for 4 rows")),
        "{short:?}"
    );
    let not_last = Epilogue::new(vec![dequant, fork, EpilogueOp::Relu]).validate(m, n, &out, true);
    assert!(
        matches!(&not_last, Err(KernelError::BadEpilogue(s)) if s.contains("must be last")),
        "{not_last:?}"
    );
}

/// `Output::Heads` against an f32 output of the same program: each head of q and k is exactly
/// `quantize_sym` of the f32 values (q shifted by 128), its scale beside it, and v is the f32
/// values; on every kernel and the tile model, one and two threads, with heads whose width is
/// not a multiple of the kernels' panel (8, 48: the drivers keep whole heads in every block) and
/// units stolen by the other thread.
#[test]
fn heads_output_quantizes_whole_heads() {
    codegen::kernels::pool::set_min_parallel_macs(0);
    let mut runs: Vec<(Option<Int8Kernel>, usize, usize, usize, usize)> = Vec::new();
    for kern in common::coverage::int8("heads_output_quantizes_whole_heads") {
        runs.extend([
            (Some(kern), 37, 24, 8, 64),
            (Some(kern), 9, 480, 48, 700),
            (Some(kern), 130, 768, 64, 96),
        ]);
    }
    runs.extend([(None, 37, 24, 8, 64), (None, 20, 480, 48, 100)]);
    for steal in [false, true] {
        let _steal = steal.then(common::EagerSteal::on);
        for &(kern, m, hidden, dh, k) in &runs {
            check_heads(kern, m, hidden, dh, k, steal);
        }
    }
}

fn check_heads(
    kern: Option<Int8Kernel>,
    m: usize,
    hidden: usize,
    dh: usize,
    k: usize,
    steal: bool,
) {
    let n = 3 * hidden;
    let heads = hidden / dh;
    let mut rng = Rng(0x4ead_0000 + (m * n + k) as u64);
    let a: Vec<u8> = (0..m * k).map(|_| rng.u8()).collect();
    let w: Vec<i8> = (0..n * k).map(|_| rng.i8()).collect();
    let ws: Vec<f32> = (0..n).map(|_| (rng.f32().abs() + 0.1) * 1e-3).collect();
    let bias = rng.vec_f32(n);
    let pk = kern.unwrap_or(Int8Kernel::Amx);
    let b = PackedI8::pack_for(pk, &w, k, n, k, true).unwrap();
    let ep = Epilogue::new(vec![
        EpilogueOp::Dequant {
            a_scale: RowParam::PerTensor(0.02),
            a_zero: RowParam::PerTensor(3),
            w_scale: &ws,
        },
        EpilogueOp::Bias(&bias),
    ]);
    let name = kern.map_or("amx(tile model)", |k| k.name());
    for threads in [1, 2] {
        let gemm = |out: Output<'_>| match kern {
            Some(kk) => gemm_i8_with(kk, m, Activations::U8(&a), k, &b, out, &ep, threads).unwrap(),
            None => gemm_i8_amx_model(m, Activations::U8(&a), k, &b, out, &ep, threads)
                .map(|_| ())
                .unwrap(),
        };
        let mut plain = vec![0f32; m * n];
        gemm(Output::F32 {
            c: &mut plain,
            ldc: n,
        });
        // Strides wider than the rows, so that a write past a row shows.
        let (ldb, lds, ldv) = (2 * hidden + 3, 2 * heads + 1, hidden + 5);
        let mut bytes = vec![0xa5u8; m * ldb];
        let mut scales = vec![f32::NAN; m * lds];
        let mut v = vec![f32::NAN; m * ldv];
        gemm(Output::Heads(HeadsOut {
            bytes: &mut bytes,
            ld_bytes: ldb,
            scales: &mut scales,
            ld_scales: lds,
            v: &mut v,
            ld_v: ldv,
            hidden,
            head_dim: dh,
        }));
        let at = format!("{name} m={m} h={hidden} dh={dh} t={threads} steal={steal}");
        for r in 0..m {
            // The GEMM's columns are q, k and v of head 0, then of head 1, ...; the
            // destinations hold q | k (bytes, scales) and v.
            let row = &plain[r * n..(r + 1) * n];
            for (i, triple) in row.chunks_exact(3 * dh).enumerate() {
                for (part, head) in triple.chunks_exact(dh).enumerate().take(2) {
                    let h = part * heads + i;
                    let mut want = vec![0u8; dh];
                    let scale = quantize_sym(head, &mut want, if part == 0 { 128 } else { 0 });
                    assert_eq!(
                        &bytes[r * ldb + h * dh..][..dh],
                        &want[..],
                        "{at}: bytes of head {h} row {r}"
                    );
                    assert_eq!(
                        scales[r * lds + h].to_bits(),
                        scale.to_bits(),
                        "{at}: scale {h} row {r}"
                    );
                }
                for d in 0..dh {
                    assert_eq!(
                        v[r * ldv + i * dh + d].to_bits(),
                        triple[2 * dh + d].to_bits(),
                        "{at}: v[{r}, {}]",
                        i * dh + d
                    );
                }
            }
            assert!(
                bytes[r * ldb + 2 * hidden..][..3]
                    .iter()
                    .all(|&x| x == 0xa5),
                "{at}: bytes past row {r}"
            );
            assert!(
                scales[r * lds + 2 * heads].is_nan(),
                "{at}: scales past row {r}"
            );
            assert!(
                v[r * ldv + hidden..][..5].iter().all(|x| x.is_nan()),
                "{at}: v past row {r}"
            );
        }
    }
}

#[test]
fn heads_output_rejects_what_it_cannot_hold() {
    let (m, k, hidden, dh) = (4, 16, 24, 8);
    let n = 3 * hidden;
    let w = vec![1i8; n * k];
    let b = PackedI8::pack(&w, k, n, true).unwrap();
    let a = vec![1u8; m * k];
    let ep = Epilogue::none();
    let run = |hidden: usize, dh: usize, bytes_len: usize| {
        let (mut bytes, mut scales, mut v) =
            (vec![0u8; bytes_len], vec![0f32; m * 6], vec![0f32; m * 24]);
        codegen::kernels::gemm_i8(
            m,
            Activations::U8(&a),
            k,
            &b,
            Output::Heads(HeadsOut {
                bytes: &mut bytes,
                ld_bytes: 48,
                scales: &mut scales,
                ld_scales: 6,
                v: &mut v,
                ld_v: 24,
                hidden,
                head_dim: dh,
            }),
            &ep,
            1,
        )
    };
    assert!(run(hidden, dh, m * 48).is_ok());
    for (hidden, dh, len, what) in [
        (20, 8, m * 48, "columns"),
        (hidden, 7, m * 48, "whole heads"),
        (hidden, dh, m * 48 - 1, "bytes"),
    ] {
        let e = run(hidden, dh, len).unwrap_err().to_string();
        assert!(e.contains("heads output"), "{what}: {e}");
    }
    let mut bytes = vec![0u8; m * 48];
    let (mut s, mut v) = (vec![0f32; m * 6], vec![0f32; m * 24]);
    let heads = Output::Heads(HeadsOut {
        bytes: &mut bytes,
        ld_bytes: 48,
        scales: &mut s,
        ld_scales: 6,
        v: &mut v,
        ld_v: 24,
        hidden,
        head_dim: dh,
    });
    let e = Epilogue::none().validate(m, n, &heads, false).unwrap_err();
    assert!(e.to_string().contains("only the int8 GEMM"), "{e}");
}

#[test]
fn every_epilogue_op_through_every_kernel() {
    codegen::kernels::pool::set_min_parallel_macs(0);
    for kern in common::coverage::int8("every_epilogue_op_through_every_kernel") {
        // The last: 2.5 MB of weights, more than a block of whole rows may take on the 1-2 MB
        // L2 of these machines, so the LayerNorm programs run through row strips.
        for &(m, n, k) in &[(7, 45, 33), (40, 300, 128), (3, 1200, 20), (9, 1200, 2100)] {
            for t in 1..=2 {
                check_all(Some(kern), m, n, k, t);
            }
        }
    }
    // The AMX kernel shares the epilogue: exercise it through the tile model too.
    check_all(None, 37, 70, 100, 1);
    // And once more with every part stealing work first (units end up on the other thread).
    let _steal = common::EagerSteal::on();
    for kern in common::coverage::int8("every_epilogue_op_through_every_kernel (stealing)") {
        check_all(Some(kern), 1100, 300, 40, 2);
    }
}

/// A per-tensor `Dequant` runs folded (per-column `zp·colsum` and `a_scale·w_scale` made once
/// per call): the same bits as the general per-row form with every row's parameters equal, on
/// every kernel and the tile model, u8 and s8 activations, per-column and per-tensor weight
/// scales, with and without a bias.
#[test]
fn per_tensor_dequant_folds_to_the_same_bits() {
    codegen::kernels::pool::set_min_parallel_macs(0);
    let mut kernels: Vec<Option<Int8Kernel>> =
        common::coverage::int8("per_tensor_dequant_folds_to_the_same_bits")
            .into_iter()
            .map(Some)
            .collect();
    kernels.push(None);
    let (m, n, k) = (29, 70, 52);
    let mut rng = Rng(0xf01d);
    let a: Vec<u8> = (0..m * k).map(|_| rng.u8()).collect();
    let a_s8: Vec<i8> = a.iter().map(|&x| x as i8).collect();
    let w: Vec<i8> = (0..n * k).map(|_| rng.i8()).collect();
    let ws: Vec<f32> = (0..n).map(|_| (rng.f32().abs() + 0.1) * 1e-3).collect();
    let bias = rng.vec_f32(n);
    for kern in kernels {
        let b = PackedI8::pack_for(kern.unwrap_or(Int8Kernel::Amx), &w, k, n, k, true).unwrap();
        for (signed, w_scale, with_bias) in [
            (false, &ws[..], true),
            (true, &ws[..], false),
            (false, &ws[..1], false),
            (true, &ws[..1], true),
        ] {
            let run = |a_scale: RowParam<'_, f32>, a_zero: RowParam<'_, i32>| {
                let mut ops = vec![EpilogueOp::Dequant {
                    a_scale,
                    a_zero,
                    w_scale,
                }];
                if with_bias {
                    ops.push(EpilogueOp::Bias(&bias));
                }
                let ep = Epilogue::new(ops);
                let mut c = vec![0f32; m * n];
                let acts = if signed {
                    Activations::S8(&a_s8)
                } else {
                    Activations::U8(&a)
                };
                let out = Output::F32 { c: &mut c, ldc: n };
                match kern {
                    Some(kk) => gemm_i8_with(kk, m, acts, k, &b, out, &ep, 2).unwrap(),
                    None => gemm_i8_amx_model(m, acts, k, &b, out, &ep, 2)
                        .map(|_| ())
                        .unwrap(),
                }
                c
            };
            let (scales, zeros) = (vec![0.013f32; m], vec![-9i32; m]);
            let folded = run(RowParam::PerTensor(0.013), RowParam::PerTensor(-9));
            let general = run(RowParam::PerRow(&scales), RowParam::PerRow(&zeros));
            let name = kern.map_or("amx(tile model)", |k| k.name());
            for (i, (x, y)) in folded.iter().zip(&general).enumerate() {
                assert_eq!(
                    x.to_bits(),
                    y.to_bits(),
                    "{name} signed={signed} w_scales={} bias={with_bias} [{i}]",
                    w_scale.len()
                );
            }
        }
    }
}

/// The register path of elementwise int8 epilogues (`epilogue_chain`) gives the multi-pass
/// path's bits: per-row and folded per-tensor dequantization, per-column and per-tensor weight
/// scales, GELU, per-column factors, residuals with NaN and infinities, requantization to u8 and
/// s8, widths that leave a partial vector (and chunks wide enough for eight vectors at a time),
/// through every int8 kernel this CPU runs.
#[cfg(target_arch = "x86_64")]
#[test]
fn register_chains_equal_the_multi_pass_epilogue() {
    use codegen::kernels::epilogue_chain::set_register_chains;
    codegen::kernels::pool::set_min_parallel_macs(0);
    let (m, n, k) = (29, 200, 52);
    let mut rng = Rng(0xc4a1);
    let a: Vec<u8> = (0..m * k).map(|_| rng.u8()).collect();
    let w: Vec<i8> = (0..n * k).map(|_| rng.i8()).collect();
    let ws: Vec<f32> = (0..n).map(|_| (rng.f32().abs() + 0.1) * 1e-3).collect();
    let bias = rng.vec_f32(n);
    let cols: Vec<f32> = (0..n).map(|_| rng.f32() * 3.0).collect();
    let mut residual: Vec<f32> = (0..m * n).map(|_| rng.f32() * 4.0).collect();
    residual[5] = f32::NAN;
    residual[n + 3] = f32::INFINITY;
    residual[2 * n + 69] = f32::NEG_INFINITY;
    let (row_scales, row_zeros): (Vec<f32>, Vec<i32>) = (0..m)
        .map(|i| (0.01 + i as f32 * 1e-3, i as i32 - 9))
        .unzip();
    let per_row = (
        RowParam::PerRow(&row_scales[..]),
        RowParam::PerRow(&row_zeros[..]),
    );
    let per_tensor = (RowParam::PerTensor(0.013), RowParam::PerTensor(-9));
    let requant = |ty| EpilogueOp::Requant {
        scale: 0.02,
        zero_point: if ty == QType::U8 { 100 } else { -3 },
        ty,
    };
    #[derive(Clone, Copy, PartialEq, Debug)]
    enum Out {
        F32,
        U8,
        S8,
    }
    for kern in common::coverage::int8("register_chains_equal_the_multi_pass_epilogue") {
        let b = PackedI8::pack_for(kern, &w, k, n, k, true).unwrap();
        for (params, w_scale) in [
            (per_row, &ws[..]),
            (per_tensor, &ws[..]),
            (per_row, &ws[..1]),
        ] {
            let dequant = EpilogueOp::Dequant {
                a_scale: params.0,
                a_zero: params.1,
                w_scale,
            };
            let programs: Vec<(Vec<EpilogueOp<'_>>, Out)> = vec![
                (vec![dequant], Out::F32),
                (vec![dequant, EpilogueOp::Bias(&bias)], Out::F32),
                (
                    vec![
                        dequant,
                        EpilogueOp::Bias(&bias),
                        EpilogueOp::GeluErf,
                        EpilogueOp::MulCol(&cols),
                        requant(QType::U8),
                    ],
                    Out::U8,
                ),
                (
                    vec![
                        dequant,
                        EpilogueOp::Bias(&bias),
                        EpilogueOp::AddResidual {
                            data: &residual,
                            ld: n,
                        },
                        EpilogueOp::Scale(0.7),
                    ],
                    Out::F32,
                ),
                (
                    vec![
                        dequant,
                        EpilogueOp::AddResidual {
                            data: &residual,
                            ld: n,
                        },
                        requant(QType::S8),
                    ],
                    Out::S8,
                ),
                (
                    vec![dequant, EpilogueOp::GeluErf, requant(QType::U8)],
                    Out::U8,
                ),
                // Every op kind once, in the order a specialised chain runs them.
                (
                    vec![
                        dequant,
                        EpilogueOp::Bias(&bias),
                        EpilogueOp::Scale(1.3),
                        EpilogueOp::GeluErf,
                        EpilogueOp::MulCol(&cols),
                        EpilogueOp::AddResidual {
                            data: &residual,
                            ld: n,
                        },
                        requant(QType::U8),
                    ],
                    Out::U8,
                ),
                // Out of that order (the column factors before the bias): dispatched per op.
                (
                    vec![
                        dequant,
                        EpilogueOp::MulCol(&cols),
                        EpilogueOp::Bias(&bias),
                        EpilogueOp::GeluErf,
                    ],
                    Out::F32,
                ),
            ];
            for (ops, out) in programs {
                let run = |chains: bool| {
                    set_register_chains(chains);
                    let ep = Epilogue::new(ops.clone());
                    let mut f = vec![0f32; m * n];
                    let mut bytes = vec![0u8; m * n];
                    let mut signed = vec![0i8; m * n];
                    let o = match out {
                        Out::F32 => Output::F32 { c: &mut f, ldc: n },
                        Out::U8 => Output::U8 {
                            c: &mut bytes,
                            ldc: n,
                        },
                        Out::S8 => Output::S8 {
                            c: &mut signed,
                            ldc: n,
                        },
                    };
                    gemm_i8_with(kern, m, Activations::U8(&a), k, &b, o, &ep, 2).unwrap();
                    set_register_chains(true);
                    let f: Vec<u32> = f.iter().map(|x| x.to_bits()).collect();
                    let s: Vec<u8> = signed.iter().map(|&x| x as u8).collect();
                    (f, bytes, s)
                };
                assert_eq!(
                    run(true),
                    run(false),
                    "{} {ops:?} into {out:?}",
                    kern.name()
                );
            }
        }
    }
    // Quantized heads (q and k per head from the registers, v as f32), with NaN and infinite
    // residuals inside some heads, per-row and folded dequantization.
    let (hidden, dh) = (32, 16);
    let n = 3 * hidden;
    let w: Vec<i8> = (0..n * k).map(|_| rng.i8()).collect();
    let ws: Vec<f32> = (0..n).map(|_| (rng.f32().abs() + 0.1) * 1e-3).collect();
    let bias = rng.vec_f32(n);
    let mut residual: Vec<f32> = (0..m * n).map(|_| rng.f32() * 4.0).collect();
    // A NaN in lane 0 of a head would survive the fold of the lanes' maxima, one in lane 3
    // would not: both must match the scalar lanes.
    residual[0] = f32::NAN;
    residual[3] = f32::NAN;
    residual[n + 17] = f32::INFINITY;
    residual[2 * n + 48] = f32::NAN;
    for kern in common::coverage::int8("register_chains_equal_the_multi_pass_epilogue") {
        let b = PackedI8::pack_for(kern, &w, k, n, k, true).unwrap();
        for params in [per_row, per_tensor] {
            let ep = Epilogue::new(vec![
                EpilogueOp::Dequant {
                    a_scale: params.0,
                    a_zero: params.1,
                    w_scale: &ws,
                },
                EpilogueOp::Bias(&bias),
                EpilogueOp::AddResidual {
                    data: &residual,
                    ld: n,
                },
            ]);
            let run = |chains: bool| {
                set_register_chains(chains);
                let mut bytes = vec![0u8; m * 2 * hidden];
                let mut scales = vec![0f32; m * 2 * hidden / dh];
                let mut v = vec![0f32; m * hidden];
                let out = Output::Heads(HeadsOut {
                    bytes: &mut bytes,
                    ld_bytes: 2 * hidden,
                    scales: &mut scales,
                    ld_scales: 2 * hidden / dh,
                    v: &mut v,
                    ld_v: hidden,
                    hidden,
                    head_dim: dh,
                });
                gemm_i8_with(kern, m, Activations::U8(&a), k, &b, out, &ep, 2).unwrap();
                set_register_chains(true);
                let bits = |x: &[f32]| x.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                (bytes, bits(&scales), bits(&v))
            };
            assert_eq!(run(true), run(false), "{} heads", kern.name());
        }
    }
}

/// The register path of LayerNorm epilogues (the ops before the LayerNorm into one scratch row,
/// then the mean, the variance and the normalisation with everything after it in three passes)
/// gives the multi-pass path's bits: with and without a `ForkU8` copy (with and without its
/// factors), ops after the LayerNorm ending in a u8 requantization, residuals with NaN and
/// infinities (a row of NaN), per-row and folded dequantization; on rows one block holds
/// (n = 70, the tile pass) and rows that go through a strip (n = 1200 at k = 2100: 2.5 MB of
/// weights, more than a whole-row block may take on these machines' L2), 1 and 2 threads,
/// through every int8 kernel this CPU runs; and on the f32 GEMM (bias, residual, LayerNorm).
#[cfg(target_arch = "x86_64")]
#[test]
fn register_layer_norm_equals_the_multi_pass_epilogue() {
    use codegen::kernels::epilogue_chain::set_register_chains;
    /// The `ForkU8` copy a program ends with: none, without factors, with them.
    #[derive(Clone, Copy, PartialEq, Debug)]
    enum Fork {
        No,
        Plain,
        Smoothed,
    }
    codegen::kernels::pool::set_min_parallel_macs(0);
    for (m, n, k) in [(29, 70, 52), (11, 100, 40), (9, 1200, 2100)] {
        let mut rng = Rng(0x1a7e + n as u64);
        let NormCase {
            a,
            w,
            ws,
            bias,
            gamma,
            beta,
            smooth,
        } = NormCase::new(&mut rng, m, n, k);
        let mut residual: Vec<f32> = (0..m * n).map(|_| rng.f32() * 4.0).collect();
        residual[n + 5] = f32::NAN;
        residual[2 * n + 3] = f32::INFINITY;
        residual[3 * n + n - 1] = f32::NEG_INFINITY;
        let (row_scales, row_zeros): (Vec<f32>, Vec<i32>) = (0..m)
            .map(|i| (0.01 + i as f32 * 1e-3, i as i32 - 5))
            .unzip();
        let ln = EpilogueOp::LayerNorm {
            gamma: &gamma,
            beta: &beta,
            eps: 1e-5,
        };
        let res = EpilogueOp::AddResidual {
            data: &residual,
            ld: n,
        };
        for kern in common::coverage::int8("register_layer_norm_equals_the_multi_pass_epilogue") {
            let b = PackedI8::pack_for(kern, &w, k, n, k, true).unwrap();
            for dequant in [
                EpilogueOp::Dequant {
                    a_scale: RowParam::PerRow(&row_scales),
                    a_zero: RowParam::PerRow(&row_zeros),
                    w_scale: &ws,
                },
                EpilogueOp::Dequant {
                    a_scale: RowParam::PerTensor(0.013),
                    a_zero: RowParam::PerTensor(7),
                    w_scale: &ws,
                },
            ] {
                // (ops, the `ForkU8` copy appended, output u8 instead of f32)
                let programs: Vec<(Vec<EpilogueOp<'_>>, Fork, bool)> = vec![
                    (
                        vec![dequant, EpilogueOp::Bias(&bias), res, ln],
                        Fork::No,
                        false,
                    ),
                    (
                        vec![dequant, EpilogueOp::Bias(&bias), res, ln],
                        Fork::Smoothed,
                        false,
                    ),
                    (vec![dequant, res, ln], Fork::Plain, false),
                    (vec![dequant, ln], Fork::No, false),
                    (
                        vec![
                            dequant,
                            EpilogueOp::Bias(&bias),
                            ln,
                            EpilogueOp::MulCol(&smooth),
                            EpilogueOp::Requant {
                                scale: 0.02,
                                zero_point: 100,
                                ty: QType::U8,
                            },
                        ],
                        Fork::No,
                        true,
                    ),
                ];
                for (index, (ops, fork, bytes_out)) in programs.iter().enumerate() {
                    for threads in [1, 2] {
                        let run = |chains: bool| {
                            set_register_chains(chains);
                            let mut f = vec![0f32; m * n];
                            let mut bytes = vec![0u8; m * n];
                            let mut copy = vec![0u8; m * n];
                            let mut ops = ops.clone();
                            if *fork != Fork::No {
                                ops.push(EpilogueOp::ForkU8 {
                                    smooth: (*fork == Fork::Smoothed).then_some(&smooth[..]),
                                    scale: 0.015,
                                    zero_point: 117,
                                    out: ForkOut::new(&mut copy, n),
                                });
                            }
                            let out = if *bytes_out {
                                Output::U8 {
                                    c: &mut bytes,
                                    ldc: n,
                                }
                            } else {
                                Output::F32 { c: &mut f, ldc: n }
                            };
                            let ep = Epilogue::new(ops);
                            gemm_i8_with(kern, m, Activations::U8(&a), k, &b, out, &ep, threads)
                                .unwrap();
                            set_register_chains(true);
                            let f: Vec<u32> = f.iter().map(|x| x.to_bits()).collect();
                            (f, bytes, copy)
                        };
                        let (fast, slow) = (run(true), run(false));
                        assert!(
                            fast.0.iter().any(|&x| x != 0) || fast.1.iter().any(|&x| x != 0),
                            "nothing written"
                        );
                        assert_eq!(
                            fast,
                            slow,
                            "{} m={m} n={n} t={threads} program {index} ({fork:?} copy)",
                            kern.name()
                        );
                    }
                }
            }
        }
        // The f32 GEMM's LayerNorm epilogue, the same comparison.
        let af: Vec<f32> = (0..m * k).map(|_| rng.f32()).collect();
        let wf: Vec<f32> = (0..n * k).map(|_| rng.f32() * 0.05).collect();
        let bf = PackedF32::pack(&wf, k, n, false);
        for threads in [1, 2] {
            let run = |chains: bool| {
                set_register_chains(chains);
                let mut c = vec![0f32; m * n];
                let ep = Epilogue::new(vec![EpilogueOp::Bias(&bias), res, ln]);
                gemm_f32(m, &af, k, &bf, &mut c, n, &ep, threads);
                set_register_chains(true);
                c.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            };
            assert_eq!(run(true), run(false), "f32 m={m} n={n} t={threads}");
        }
    }
}
